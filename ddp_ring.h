/* ddp_ring.h — libddp's ring algorithms and reduction kernels.
 *
 * Included by ddp.h (users need not include it themselves); built by DDP_IMPLEMENTATION in the
 * same file as ddp.h's implementation.
 *
 * ALGORITHMS (over the point-to-point transport interface of ddp.h)
 *   all-reduce      = reduce-scatter then all-gather around the ring: each rank sends
 *                     2(p-1)/p of the buffer, the bandwidth optimum (Patarasuk & Yuan, "Bandwidth
 *                     optimal all-reduce algorithms for clusters of workstations", JPDC 2009).
 *   reduce-scatter  the first half alone; rank r ends with chunk r (NCCL's layout).
 *   all-gather      the second half alone.
 *   broadcast       a pipelined chain root -> root+1 -> ... (every link carries the buffer once).
 * Chunks are cut into segments (DDP_SEGMENT_BYTES) and up to DDP_RING_WINDOW segments are in
 * flight per direction, so sending, receiving and reducing overlap; a step streams its chunk
 * while the previous step's data is still arriving. Scratch is the window, never the message.
 * Each chunk is reduced in one fixed order along the ring and then copied out, so every rank ends
 * with the same bits, run after run.
 *
 * KERNELS: ddp_reduce_local(dst, a, b, n, dtype, op) computes dst = a op b elementwise for every
 * dtype/op (dst may equal a or b). Integers wrap (computed unsigned); fp16/bf16 go through fp32
 * and round to nearest even. Loops work on fixed blocks so compilers vectorise them at -O2.
 */
#if !defined(DDP_H_INCLUDED)
#include "ddp.h" /* which includes this header back at the end of its declarations */
#elif !defined(DDP_RING_H_INCLUDED)
#define DDP_RING_H_INCLUDED

#ifdef __cplusplus
extern "C" {
#endif

#define DDP_RING_WINDOW 8   /* segments in flight per direction; also the scratch slots */

DDP_API void ddp_reduce_local(void *dst, const void *a, const void *b, size_t count,
                              ddp_dtype_t dtype, ddp_op_t op);
/* x[i] /= divisor (the AVG finish): truncating for integers, IEEE division (in fp32 for
 * fp16/bf16) for floating point. */
DDP_API void ddp_divide_local(void *x, size_t count, ddp_dtype_t dtype, int divisor);
DDP_API float ddp_half_to_float(uint16_t h);
DDP_API uint16_t ddp_float_to_half(float f);          /* round to nearest even */
DDP_API float ddp_bfloat16_to_float(uint16_t h);
DDP_API uint16_t ddp_float_to_bfloat16(float f);      /* round to nearest even */

/* The algorithms, called by ddp.h's collectives after argument checks. */
DDP_API ddp_result_t ddp_ring_all_reduce(ddp_comm_t *comm, const void *sendbuf, void *recvbuf,
                                         size_t count, ddp_dtype_t dtype, ddp_op_t op);
DDP_API ddp_result_t ddp_ring_reduce_scatter(ddp_comm_t *comm, const void *sendbuf,
                                             void *recvbuf, size_t recvcount, ddp_dtype_t dtype,
                                             ddp_op_t op);
DDP_API ddp_result_t ddp_ring_all_gather(ddp_comm_t *comm, const void *sendbuf, void *recvbuf,
                                         size_t sendcount, ddp_dtype_t dtype);
DDP_API ddp_result_t ddp_ring_broadcast(ddp_comm_t *comm, const void *sendbuf, void *recvbuf,
                                        size_t count, ddp_dtype_t dtype, int root);
/* Recursive doubling (log2 p hops of the whole buffer): for small all-reduces. The buffer must
 * fit the communicator's scratch (DDP_RING_WINDOW x DDP_SEGMENT_BYTES). */
DDP_API ddp_result_t ddp_rd_all_reduce(ddp_comm_t *comm, const void *sendbuf, void *recvbuf,
                                       size_t count, ddp_dtype_t dtype, ddp_op_t op);

#ifdef __cplusplus
}
#endif
#endif /* DDP_RING_H_INCLUDED */

/* The implementation needs ddp.h's communicator internals: it is built when ddp.h's
 * implementation includes this header a second time, at its end. */
#if defined(DDP_IMPLEMENTATION) && defined(DDP_IMPL_INCLUDED) && !defined(DDP_RING_IMPL_INCLUDED)
#define DDP_RING_IMPL_INCLUDED

/* x86: fp16 conversion uses the F16C instructions when the CPU has them (every x86-64 CPU since
 * 2012), chosen at run time, so a binary built without -march=native still gets them. */
#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define _DDP_F16C_DISPATCH 1
#endif

/* ---------------------------------------------------------------- half / bfloat16
 * IEEE 754 binary16 (1-5-10) and bfloat16 (the top half of binary32). */
static inline float _ddp_bits_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static inline uint32_t _ddp_f32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }

static inline float _ddp_h2f(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0x1f) return _ddp_bits_f32(sign | 0x7f800000u | (m << 13));
    if (e) return _ddp_bits_f32(sign | ((e + 112u) << 23) | (m << 13));
    /* zero or subnormal: m * 2^-24, exact in fp32 */
    return _ddp_bits_f32(sign | _ddp_f32_bits((float)m * 5.9604644775390625e-08f));
}

static inline uint16_t _ddp_f2h(float f) {
    uint32_t x = _ddp_f32_bits(f), sign = (x >> 16) & 0x8000u;
    x &= 0x7fffffffu;
    if (x >= 0x7f800000u) /* inf stays inf; NaN stays a quiet NaN */
        return (uint16_t)(sign | (x > 0x7f800000u ? 0x7e00u | ((x >> 13) & 0x3ffu) : 0x7c00u));
    if (x >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* >= 65520 rounds to inf */
    if (x < 0x38800000u) {
        /* Below 2^-14 the result is subnormal: adding 0.5 puts the quantum 2^-24 at fp32's
         * last mantissa bit, so the FPU does the round-to-nearest-even for us. */
        uint32_t y = _ddp_f32_bits(_ddp_bits_f32(x) + 0.5f);
        return (uint16_t)(sign | (y - 0x3f000000u));
    }
    /* Rebias the exponent (127 -> 15) and round half to even on the 13 dropped bits. */
    x += 0xc8000fffu + ((x >> 13) & 1u);
    return (uint16_t)(sign | (x >> 13));
}

static inline float _ddp_bf2f(uint16_t h) { return _ddp_bits_f32((uint32_t)h << 16); }
static inline uint16_t _ddp_f2bf(float f) {
    uint32_t x = _ddp_f32_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40u); /* quiet NaN */
    return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

DDP_API float ddp_half_to_float(uint16_t h) { return _ddp_h2f(h); }
DDP_API uint16_t ddp_float_to_half(float f) { return _ddp_f2h(f); }
DDP_API float ddp_bfloat16_to_float(uint16_t h) { return _ddp_bf2f(h); }
DDP_API uint16_t ddp_float_to_bfloat16(float f) { return _ddp_f2bf(f); }

/* ---------------------------------------------------------------- kernels
 * dst may be a, b, or neither (never a partial overlap). Each kernel comes in three versions
 * whose pointers cannot alias (restrict): dst = dst op b, dst = a op dst, dst = a op b; the
 * plain loops then vectorise at -O2 with no stack round trips. Operand order is kept, so max/min
 * of NaNs and signed zeros give the same bits whichever buffer is the destination. Blocks of a
 * constant 16 iterations are what GCC's -O2 ("very cheap") vectoriser accepts. */
#if defined(__cplusplus)
#define _DDP_RESTRICT __restrict
#else
#define _DDP_RESTRICT restrict
#endif
#define _DDP_NOATTR
#define _DDP_KB 16
#define _DDP_KERNEL_VARIANTS(name, attr, T, LOAD, STORE, expr)                                \
    attr static void name##_ab(T *_DDP_RESTRICT d, const T *_DDP_RESTRICT a,                       \
                          const T *_DDP_RESTRICT b, size_t n) {                               \
        size_t i = 0, j;                                                                      \
        for (; i + _DDP_KB <= n; i += _DDP_KB)                                                \
            for (j = 0; j < _DDP_KB; j++) {                                                   \
                size_t k = i + j;                                                             \
                LOAD(p, a[k]); LOAD(q, b[k]); d[k] = STORE(expr);                              \
            }                                                                                 \
        for (; i < n; i++) { size_t k = i; LOAD(p, a[k]); LOAD(q, b[k]); d[k] = STORE(expr); } \
    }                                                                                         \
    attr static void name##_da(T *_DDP_RESTRICT d, const T *_DDP_RESTRICT b, size_t n) {           \
        size_t i = 0, j;                                                                      \
        for (; i + _DDP_KB <= n; i += _DDP_KB)                                                \
            for (j = 0; j < _DDP_KB; j++) {                                                   \
                size_t k = i + j;                                                             \
                LOAD(p, d[k]); LOAD(q, b[k]); d[k] = STORE(expr);                              \
            }                                                                                 \
        for (; i < n; i++) { size_t k = i; LOAD(p, d[k]); LOAD(q, b[k]); d[k] = STORE(expr); } \
    }                                                                                         \
    attr static void name##_db(T *_DDP_RESTRICT d, const T *_DDP_RESTRICT a, size_t n) {           \
        size_t i = 0, j;                                                                      \
        for (; i + _DDP_KB <= n; i += _DDP_KB)                                                \
            for (j = 0; j < _DDP_KB; j++) {                                                   \
                size_t k = i + j;                                                             \
                LOAD(p, a[k]); LOAD(q, d[k]); d[k] = STORE(expr);                              \
            }                                                                                 \
        for (; i < n; i++) { size_t k = i; LOAD(p, a[k]); LOAD(q, d[k]); d[k] = STORE(expr); } \
    }                                                                                         \
    attr static void name(void *d, const void *a, const void *b, size_t n) {                 \
        if (a == b) { /* both inputs the same buffer: no restrict version fits */             \
            T *x = (T *)d;                                                                    \
            const T *y = (const T *)a;                                                        \
            size_t i;                                                                         \
            for (i = 0; i < n; i++) { LOAD(p, y[i]); LOAD(q, y[i]); x[i] = STORE(expr); }     \
        } else if (d == a) name##_da((T *)d, (const T *)b, n);                                \
        else if (d == b) name##_db((T *)d, (const T *)a, n);                                  \
        else name##_ab((T *)d, (const T *)a, (const T *)b, n);                                \
    }
#define _DDP_KERNEL(name, T, expr)                                                            \
    _DDP_KERNEL_VARIANTS(name, _DDP_NOATTR, T, _DDP_LD_##T, (T), expr)
#define _DDP_LD_uint8_t(v, x) uint8_t v = (x)
#define _DDP_LD_int8_t(v, x) int8_t v = (x)
#define _DDP_LD_uint32_t(v, x) uint32_t v = (x)
#define _DDP_LD_int32_t(v, x) int32_t v = (x)
#define _DDP_LD_uint64_t(v, x) uint64_t v = (x)
#define _DDP_LD_int64_t(v, x) int64_t v = (x)
#define _DDP_LD_float(v, x) float v = (x)
#define _DDP_LD_double(v, x) double v = (x)
#define _DDP_KERNELS(sfx, T, U)                                                               \
    _DDP_KERNEL(_ddp_sum_##sfx, U, p + q)                                                     \
    _DDP_KERNEL(_ddp_prod_##sfx, U, p * q)                                                    \
    _DDP_KERNEL(_ddp_max_##sfx, T, p > q ? p : q)                                             \
    _DDP_KERNEL(_ddp_min_##sfx, T, p < q ? p : q)
/* Sums and products of signed integers are done unsigned: the same bits, without C's
 * signed-overflow undefined behaviour. */
_DDP_KERNELS(i8, int8_t, uint8_t)
_DDP_KERNELS(u8, uint8_t, uint8_t)
_DDP_KERNELS(i32, int32_t, uint32_t)
_DDP_KERNELS(u32, uint32_t, uint32_t)
_DDP_KERNELS(i64, int64_t, uint64_t)
_DDP_KERNELS(u64, uint64_t, uint64_t)
_DDP_KERNELS(f32, float, float)
_DDP_KERNELS(f64, double, double)

/* bf16 <-> fp32 without branches (masks), so loops of them vectorise. */
static inline float _ddp_bf2f_v(uint16_t h) { return _ddp_bits_f32((uint32_t)h << 16); }
static inline uint16_t _ddp_f2bf_v(float f) {
    uint32_t v = _ddp_f32_bits(f), rounded = (v + 0x7fffu + ((v >> 16) & 1u)) >> 16;
    uint32_t nan = 0u - (uint32_t)((v & 0x7fffffffu) > 0x7f800000u);
    return (uint16_t)((rounded & ~nan) | (((v >> 16) | 0x40u) & nan));
}
#define _DDP_LD_BF16(v, x) float v = _ddp_bf2f_v(x)
#define _DDP_LD_F16(v, x) float v = _ddp_h2f(x)
#define _DDP_KERNELS_16(sfx, attr, LOAD, STORE)                                               \
    _DDP_KERNEL_VARIANTS(_ddp_sum_##sfx, attr, uint16_t, LOAD, STORE, p + q)                  \
    _DDP_KERNEL_VARIANTS(_ddp_prod_##sfx, attr, uint16_t, LOAD, STORE, p * q)                 \
    _DDP_KERNEL_VARIANTS(_ddp_max_##sfx, attr, uint16_t, LOAD, STORE, p > q ? p : q)          \
    _DDP_KERNEL_VARIANTS(_ddp_min_##sfx, attr, uint16_t, LOAD, STORE, p < q ? p : q)
_DDP_KERNELS_16(bf16, _DDP_NOATTR, _DDP_LD_BF16, _ddp_f2bf_v)
_DDP_KERNELS_16(f16, _DDP_NOATTR, _DDP_LD_F16, _ddp_f2h)

#ifdef _DDP_F16C_DISPATCH
#include <cpuid.h>
/* Bit 0: F16C usable (CPUID.1:ECX F16C 29, AVX 28, OSXSAVE 27, and the OS saves YMM state:
 * XCR0 bits 1-2); bit 1: AVX2 usable (CPUID.7.0:EBX bit 5, same OS condition). Asked once:
 * CPUID traps to the hypervisor in a VM. (Intel SDM vol. 2A, CPUID.) */
static int _ddp_cpu_features(void) {
    static int cached; /* 0 unknown, else features + 4 */
    int v = __atomic_load_n(&cached, __ATOMIC_RELAXED);
    if (!v) {
        unsigned a, b, c, d, lo = 0, hi = 0;
        v = 4;
        if (__get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 28)) && (c & (1u << 27))) {
            __asm__ __volatile__("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
            if ((lo & 6u) == 6u) {
                if (c & (1u << 29)) v |= 1;
                if (__get_cpuid_count(7, 0, &a, &b, &c, &d) && (b & (1u << 5))) v |= 2;
            }
        }
        (void)hi;
        __atomic_store_n(&cached, v, __ATOMIC_RELAXED);
    }
    return v & 3;
}
/* fp16 with F16C: 8 lanes widened to fp32, combined, rounded to nearest even. MAXPS(p, q) is
 * exactly p > q ? p : q and MINPS(p, q) is p < q ? p : q (Intel SDM, MAXPS/MINPS), so results
 * match the scalar path bit for bit. dst may equal a or b: each block is loaded before stored. */
#define _DDP_KERNEL_F16C(name, vexpr, expr)                                                   \
    __attribute__((target("avx,f16c"))) static void name(void *dst_, const void *a_,         \
                                                         const void *b_, size_t n) {         \
        uint16_t *d = (uint16_t *)dst_;                                                       \
        const uint16_t *a = (const uint16_t *)a_, *b = (const uint16_t *)b_;                  \
        size_t i = 0;                                                                         \
        for (; i + 8 <= n; i += 8) {                                                          \
            __m256 p = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(a + i))); \
            __m256 q = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(b + i))); \
            _mm_storeu_si128((__m128i *)(void *)(d + i),                                      \
                             _mm256_cvtps_ph(vexpr, _MM_FROUND_TO_NEAREST_INT));              \
        }                                                                                     \
        for (; i < n; i++) { float p = _ddp_h2f(a[i]), q = _ddp_h2f(b[i]); d[i] = _ddp_f2h(expr); } \
    }
_DDP_KERNEL_F16C(_ddp_sum_f16c, _mm256_add_ps(p, q), p + q)
_DDP_KERNEL_F16C(_ddp_prod_f16c, _mm256_mul_ps(p, q), p * q)
_DDP_KERNEL_F16C(_ddp_max_f16c, _mm256_max_ps(p, q), p > q ? p : q)
_DDP_KERNEL_F16C(_ddp_min_f16c, _mm256_min_ps(p, q), p < q ? p : q)
/* bf16 has no conversion instructions before AVX-512: the same C, vectorised 8 wide. */
_DDP_KERNELS_16(bf16_avx2, __attribute__((target("avx2"))), _DDP_LD_BF16, _ddp_f2bf_v)
#endif

typedef void (*_ddp_kernel_fn)(void *, const void *, const void *, size_t);

/* [dtype][op] in NCCL's enum order; AVG sums (the division happens once, at the end). */
static const _ddp_kernel_fn _ddp_kernels[DDP_NUM_DTYPES][4] = {
    {_ddp_sum_i8, _ddp_prod_i8, _ddp_max_i8, _ddp_min_i8},
    {_ddp_sum_u8, _ddp_prod_u8, _ddp_max_u8, _ddp_min_u8},
    {_ddp_sum_i32, _ddp_prod_i32, _ddp_max_i32, _ddp_min_i32},
    {_ddp_sum_u32, _ddp_prod_u32, _ddp_max_u32, _ddp_min_u32},
    {_ddp_sum_i64, _ddp_prod_i64, _ddp_max_i64, _ddp_min_i64},
    {_ddp_sum_u64, _ddp_prod_u64, _ddp_max_u64, _ddp_min_u64},
    {_ddp_sum_f16, _ddp_prod_f16, _ddp_max_f16, _ddp_min_f16},
    {_ddp_sum_f32, _ddp_prod_f32, _ddp_max_f32, _ddp_min_f32},
    {_ddp_sum_f64, _ddp_prod_f64, _ddp_max_f64, _ddp_min_f64},
    {_ddp_sum_bf16, _ddp_prod_bf16, _ddp_max_bf16, _ddp_min_bf16},
};

DDP_API void ddp_reduce_local(void *dst, const void *a, const void *b, size_t count,
                              ddp_dtype_t dtype, ddp_op_t op) {
    if ((unsigned)dtype >= DDP_NUM_DTYPES || (unsigned)op >= DDP_NUM_OPS || !count) return;
    if (op == DDP_AVG) op = DDP_SUM;
#ifdef _DDP_F16C_DISPATCH
    if (dtype == DDP_FLOAT16 && (_ddp_cpu_features() & 1)) {
        static const _ddp_kernel_fn f16c[4] = {_ddp_sum_f16c, _ddp_prod_f16c, _ddp_max_f16c, _ddp_min_f16c};
        f16c[op](dst, a, b, count);
        return;
    }
    if (dtype == DDP_BFLOAT16 && (_ddp_cpu_features() & 2)) {
        static const _ddp_kernel_fn avx2[4] = {_ddp_sum_bf16_avx2, _ddp_prod_bf16_avx2,
                                               _ddp_max_bf16_avx2, _ddp_min_bf16_avx2};
        avx2[op](dst, a, b, count);
        return;
    }
#endif
    _ddp_kernels[dtype][op](dst, a, b, count);
}

DDP_API void ddp_divide_local(void *x, size_t n, ddp_dtype_t dtype, int divisor) {
    size_t i;
    if (divisor == 1) return;
    switch (dtype) {
    case DDP_INT8: { int8_t *v = (int8_t *)x; for (i = 0; i < n; i++) v[i] = (int8_t)(v[i] / divisor); break; }
    case DDP_UINT8: { uint8_t *v = (uint8_t *)x; for (i = 0; i < n; i++) v[i] = (uint8_t)(v[i] / (unsigned)divisor); break; }
    case DDP_INT32: { int32_t *v = (int32_t *)x; for (i = 0; i < n; i++) v[i] = v[i] / divisor; break; }
    case DDP_UINT32: { uint32_t *v = (uint32_t *)x; for (i = 0; i < n; i++) v[i] = v[i] / (uint32_t)divisor; break; }
    case DDP_INT64: { int64_t *v = (int64_t *)x; for (i = 0; i < n; i++) v[i] = v[i] / divisor; break; }
    case DDP_UINT64: { uint64_t *v = (uint64_t *)x; for (i = 0; i < n; i++) v[i] = v[i] / (uint64_t)divisor; break; }
    case DDP_FLOAT32: { float *v = (float *)x; float d = (float)divisor; for (i = 0; i < n; i++) v[i] = v[i] / d; break; }
    case DDP_FLOAT64: { double *v = (double *)x; double d = (double)divisor; for (i = 0; i < n; i++) v[i] = v[i] / d; break; }
    case DDP_FLOAT16: { uint16_t *v = (uint16_t *)x; float d = (float)divisor; for (i = 0; i < n; i++) v[i] = _ddp_f2h(_ddp_h2f(v[i]) / d); break; }
    case DDP_BFLOAT16: { uint16_t *v = (uint16_t *)x; float d = (float)divisor; for (i = 0; i < n; i++) v[i] = _ddp_f2bf(_ddp_bf2f(v[i]) / d); break; }
    }
}

/* ---------------------------------------------------------------- the ring engine
 * Work items are (step t, segment k). Step t sends chunk (r - t + shift) mod p to the next rank
 * and receives chunk (r - t - 1 + shift) mod p from the previous one; the send of (t, k), t > 0,
 * forwards what the receive of (t - 1, k) produced, so it waits for it.
 * Items are posted in the order (group, t, k): a group of G segments goes through every step
 * before the next group starts. With G = all segments (all-reduce, all-gather, broadcast) each
 * step streams its whole chunk while the previous step's data is still arriving, so the pipe
 * stays full. Reduce-scatter parks each partial sum in scratch until it is forwarded, so it uses
 * groups of W/2 segments: the scratch needed is bounded by the window, not the message. */
enum { _DDP_RING_AR, _DDP_RING_RS, _DDP_RING_AG, _DDP_RING_BCAST };
static const char *const _ddp_ring_names[] = {"all_reduce", "reduce_scatter", "all_gather", "broadcast"};

typedef struct {
    ddp_comm_t *c;
    int kind, p, r, next, prev, shift, nsteps, root;
    const unsigned char *send;
    unsigned char *recv;
    size_t es, chunk_base, chunk_rem, seg_elems, nseg, group;
    ddp_dtype_t dtype;
    ddp_op_t op;
    uint64_t tag;
} _ddp_ring_t;

typedef struct {
    void *req;          /* NULL: nothing on the wire (empty segment), complete at once */
    size_t item;
    int slot;           /* scratch slot held by this item, or -1 */
} _ddp_ring_op_t;

static inline size_t _ddp_ring_mod(const _ddp_ring_t *g, long v) {
    long m = v % g->p;
    return (size_t)(m < 0 ? m + g->p : m);
}

/* Item number -> (step, segment); *gsize = segments in its group. */
static inline void _ddp_ring_item(const _ddp_ring_t *g, size_t i, int *t, size_t *k, size_t *gsize) {
    size_t per = g->group * (size_t)g->nsteps, b = i / per, rem = i % per;
    size_t gs = (b + 1) * g->group <= g->nseg ? g->group : g->nseg - b * g->group;
    *t = (int)(rem / gs);
    *k = b * g->group + rem % gs;
    *gsize = gs;
}

/* Elements [*off, *off + *len) of the whole buffer that segment k of chunk ch covers. */
static inline void _ddp_ring_seg(const _ddp_ring_t *g, size_t ch, size_t k, size_t *off, size_t *len) {
    size_t clen = g->chunk_base + (ch < g->chunk_rem ? 1 : 0);
    size_t coff = ch * g->chunk_base + (ch < g->chunk_rem ? ch : g->chunk_rem);
    size_t s = k * g->seg_elems;
    *off = coff + (s < clen ? s : clen);
    *len = s < clen ? (clen - s < g->seg_elems ? clen - s : g->seg_elems) : 0;
}

static inline int _ddp_ring_reduces(const _ddp_ring_t *g, int t) {
    return g->kind == _DDP_RING_RS || (g->kind == _DDP_RING_AR && t < g->p - 1);
}

static void _ddp_ring_where(const _ddp_ring_t *g, size_t item, char *out, size_t cap) {
    int t, step, steps;
    size_t k, gs;
    const char *phase;
    _ddp_ring_item(g, item, &t, &k, &gs);
    phase = g->kind == _DDP_RING_BCAST ? "chain" : _ddp_ring_reduces(g, t) ? "reduce-scatter" : "all-gather";
    step = (g->kind == _DDP_RING_AR && t >= g->p - 1) ? t - (g->p - 1) : t;
    steps = g->kind == _DDP_RING_BCAST ? 1 : g->p - 1;
    snprintf(out, cap, "%s #%u, phase %s step %d/%d, segment %zu/%zu", _ddp_ring_names[g->kind],
             (unsigned)(g->tag & 0xffffffffu), phase, step + 1, steps, k + 1, g->nseg);
}

/* Re-words the transport's error with where in the algorithm it happened. */
static ddp_result_t _ddp_ring_fail(const _ddp_ring_t *g, ddp_result_t r, size_t item) {
    char where[160], prev[1024];
    const char *msg = g->c->last_error;
    size_t skip = 0;
    _ddp_ring_where(g, item, where, sizeof where);
    if (!strncmp(msg, "rank ", 5)) { /* drop our own "rank N: " prefix; fail() adds it back */
        const char *colon = strstr(msg, ": ");
        if (colon) skip = (size_t)(colon + 2 - msg);
    }
    _ddp_strlcpy(prev, msg + skip, sizeof prev);
    {
        char *tail = strstr(prev, " [");
        if (tail) *tail = 0;
    }
    return ddp_comm_fail(g->c, r, "%s: %s", where, prev[0] ? prev : ddp_strerror(r));
}

static ddp_result_t _ddp_ring_run(_ddp_ring_t *g) {
    ddp_comm_t *c = g->c;
    const size_t total = g->nseg * (size_t)g->nsteps, W = DDP_RING_WINDOW;
    _ddp_ring_op_t sq[DDP_RING_WINDOW], rq[DDP_RING_WINDOW];
    int free_slots[DDP_RING_WINDOW], nfree = 0;
    /* Reduce-scatter: slots holding partial sums, in the order their forwarding sends come. */
    int parked[DDP_RING_WINDOW];
    size_t park_head = 0, park_tail = 0;
    size_t ns = 0, nr = 0, ds = 0, dr = 0;
    int64_t last = _ddp_now_us(), spin_until;
    int peers[2];
    const int bcast = g->kind == _DDP_RING_BCAST;
    const int pos = bcast ? (int)_ddp_ring_mod(g, g->r - g->root) : 0;
    const int sends = !bcast || pos != g->p - 1, recvs = !bcast || pos != 0;
    ddp_result_t r;
    int i;
    for (i = 0; i < DDP_RING_WINDOW; i++) free_slots[nfree++] = i;
    peers[0] = g->next;
    peers[1] = g->prev;
    if (!sends) ds = ns = total;
    if (!recvs) dr = nr = total;
    spin_until = last + c->spin_us;

    while (ds < total || dr < total) {
        int progressed = 0;
        /* Post receives while the window and the scratch allow. */
        while (nr < total && nr - dr < W) {
            int t;
            size_t k, gs, ch, off, len;
            _ddp_ring_op_t *o = &rq[nr % W];
            _ddp_ring_item(g, nr, &t, &k, &gs);
            ch = bcast ? 0 : _ddp_ring_mod(g, (long)g->r - t - 1 + g->shift);
            _ddp_ring_seg(g, ch, k, &off, &len);
            o->item = nr;
            o->req = NULL;
            o->slot = -1;
            if (len) {
                void *dst;
                if (_ddp_ring_reduces(g, t)) {
                    if (!nfree) break;
                    o->slot = free_slots[--nfree];
                    dst = c->scratch + (size_t)o->slot * c->segment_bytes;
                } else {
                    dst = g->recv + off * g->es;
                }
                r = _ddp_irecv(c, g->prev, dst, len * g->es, g->tag, &o->req);
                if (r != DDP_SUCCESS) return _ddp_ring_fail(g, r, nr);
            }
            nr++;
        }
        /* Post sends whose data is ready. */
        while (ns < total && ns - ds < W) {
            int t;
            size_t k, gs, ch, off, len;
            const unsigned char *src;
            _ddp_ring_op_t *o = &sq[ns % W];
            _ddp_ring_item(g, ns, &t, &k, &gs);
            if (bcast && pos != 0) { if (dr <= ns) break; }       /* forward what arrived */
            else if (t > 0 && dr <= ns - gs) break;               /* needs recv (t - 1, k) */
            ch = bcast ? 0 : _ddp_ring_mod(g, (long)g->r - t + g->shift);
            _ddp_ring_seg(g, ch, k, &off, &len);
            o->item = ns;
            o->req = NULL;
            o->slot = -1;
            if (g->kind == _DDP_RING_RS && t > 0) {
                if (len) {
                    o->slot = parked[park_head++ % W];            /* the partial sum */
                    src = c->scratch + (size_t)o->slot * c->segment_bytes;
                } else {
                    src = NULL;
                }
            } else if (t == 0 && !(bcast && pos != 0)) {
                src = g->kind == _DDP_RING_AG ? g->send + (off - (size_t)g->r * g->chunk_base) * g->es
                                              : g->send + off * g->es;
            } else {
                src = g->recv + off * g->es;
            }
            if (len) {
                r = _ddp_isend(c, g->next, src, len * g->es, g->tag, &o->req);
                if (r != DDP_SUCCESS) return _ddp_ring_fail(g, r, ns);
            }
            ns++;
        }
        /* Retire completed sends, in order. */
        while (ds < ns) {
            _ddp_ring_op_t *o = &sq[ds % W];
            int done = 1;
            if (o->req && (r = _ddp_test(c, g->next, o->req, &done)) != DDP_SUCCESS)
                return _ddp_ring_fail(g, r, o->item);
            if (!done) break;
            if (o->slot >= 0) free_slots[nfree++] = o->slot;
            ds++;
            progressed = 1;
        }
        /* Retire completed receives, in order, reducing as they land. */
        while (dr < nr) {
            _ddp_ring_op_t *o = &rq[dr % W];
            int done = 1;
            if (o->req && (r = _ddp_test(c, g->prev, o->req, &done)) != DDP_SUCCESS)
                return _ddp_ring_fail(g, r, o->item);
            if (!done) break;
            if (o->slot >= 0) {
                int t;
                size_t k, gs, off, len, ch;
                unsigned char *scr = c->scratch + (size_t)o->slot * c->segment_bytes;
                _ddp_ring_item(g, o->item, &t, &k, &gs);
                ch = _ddp_ring_mod(g, (long)g->r - t - 1 + g->shift);
                _ddp_ring_seg(g, ch, k, &off, &len);
                if (g->kind == _DDP_RING_AR || t == g->p - 2) {
                    /* All-reduce accumulates in recvbuf; reduce-scatter's last step is our chunk. */
                    unsigned char *dst = g->kind == _DDP_RING_AR ? g->recv + off * g->es
                                       : g->recv + (off - (size_t)g->r * g->chunk_base) * g->es;
                    ddp_reduce_local(dst, scr, g->send + off * g->es, len, g->dtype, g->op);
                    if (t == g->p - 2 && g->op == DDP_AVG) ddp_divide_local(dst, len, g->dtype, g->p);
                    free_slots[nfree++] = o->slot;
                } else {
                    ddp_reduce_local(scr, scr, g->send + off * g->es, len, g->dtype, g->op);
                    parked[park_tail++ % W] = o->slot;            /* freed once forwarded */
                }
            }
            dr++;
            progressed = 1;
        }
        if (progressed) {
            last = _ddp_now_us();
            spin_until = last + c->spin_us;
            continue;
        }
        {
            int64_t now = _ddp_now_us();
            if (c->timeout_ms >= 0 && now - last > (int64_t)c->timeout_ms * 1000) {
                char where[160];
                int waiting_recv = dr < total;
                _ddp_ring_where(g, waiting_recv ? dr : ds, where, sizeof where);
                return ddp_comm_fail(c, DDP_ERR_TIMEOUT, "%s: no progress for %d ms: %s rank %d "
                                     "(alive but stuck, or not calling the same collective?)",
                                     where, c->timeout_ms,
                                     waiting_recv ? "waiting for data from" : "waiting to send to",
                                     waiting_recv ? g->prev : g->next);
            }
            if (now < spin_until) {
                /* Give the CPU to a runnable peer, if any: costs ~1 us when there is none. */
                sched_yield();
            } else {
                int ms = 100;
                if (c->timeout_ms >= 0) {
                    int64_t left = (int64_t)c->timeout_ms * 1000 - (now - last);
                    if (left / 1000 + 1 < ms) ms = (int)(left / 1000) + 1;
                }
                r = _ddp_block(c, peers, g->next == g->prev ? 1 : 2, ms);
                if (r != DDP_SUCCESS) return _ddp_ring_fail(g, r, dr < total ? dr : ds);
            }
        }
    }
    return DDP_SUCCESS;
}

static void _ddp_ring_setup(_ddp_ring_t *g, ddp_comm_t *c, int kind, const void *send, void *recv,
                            ddp_dtype_t dtype, ddp_op_t op, size_t count, int root) {
    memset(g, 0, sizeof *g);
    g->c = c;
    g->kind = kind;
    g->p = c->nranks;
    g->r = c->rank;
    g->next = (c->rank + 1) % c->nranks;
    g->prev = (c->rank + c->nranks - 1) % c->nranks;
    g->send = (const unsigned char *)send;
    g->recv = (unsigned char *)recv;
    g->dtype = dtype;
    g->op = op;
    g->es = ddp_dtype_size(dtype);
    g->root = root;
    g->tag = _ddp_coll_tag(c, kind, dtype, op, count, root);
}

/* Chunk geometry and segment size. A chunk is cut into at least _DDP_RING_MIN_SEGS segments when
 * that keeps them >= 64 KiB, so that mid-size messages pipeline too (a chunk sent as one segment
 * cannot be forwarded before it has fully arrived); never above DDP_SEGMENT_BYTES, the scratch
 * slot size. Every rank derives the same numbers from (count, dtype, p, DDP_SEGMENT_BYTES). */
#define _DDP_RING_MIN_SEGS 4
#define _DDP_RING_MIN_SEG_BYTES (64u << 10)
static void _ddp_ring_plan(_ddp_ring_t *g, size_t chunk_base, size_t chunk_rem, size_t group) {
    size_t maxc = chunk_base + (chunk_rem ? 1 : 0), cap = g->c->segment_bytes;
    size_t want = (maxc * g->es / _DDP_RING_MIN_SEGS + 4095) & ~(size_t)4095;
    size_t lo = _DDP_RING_MIN_SEG_BYTES < cap ? _DDP_RING_MIN_SEG_BYTES : cap;
    size_t seg = want < lo ? lo : want > cap ? cap : want;
    g->chunk_base = chunk_base;
    g->chunk_rem = chunk_rem;
    g->seg_elems = seg / g->es;
    /* Number of segments of the largest chunk (empty segments of smaller chunks are skipped on
     * both sides, which compute the same geometry). */
    g->nseg = (maxc + g->seg_elems - 1) / g->seg_elems;
    g->group = group ? group : (g->nseg ? g->nseg : 1);
}

DDP_API ddp_result_t ddp_ring_all_reduce(ddp_comm_t *c, const void *sendbuf, void *recvbuf,
                                         size_t count, ddp_dtype_t dtype, ddp_op_t op) {
    _ddp_ring_t g;
    _ddp_ring_setup(&g, c, _DDP_RING_AR, sendbuf, recvbuf, dtype, op, count, 0);
    if (c->nranks == 1) {
        if (count && sendbuf != recvbuf) memcpy(recvbuf, sendbuf, count * g.es);
        return DDP_SUCCESS;
    }
    g.shift = -1;
    g.nsteps = 2 * (g.p - 1);
    _ddp_ring_plan(&g, count / (size_t)g.p, count % (size_t)g.p, 0);
    return _ddp_ring_run(&g);
}

DDP_API ddp_result_t ddp_ring_reduce_scatter(ddp_comm_t *c, const void *sendbuf, void *recvbuf,
                                             size_t recvcount, ddp_dtype_t dtype, ddp_op_t op) {
    _ddp_ring_t g;
    _ddp_ring_setup(&g, c, _DDP_RING_RS, sendbuf, recvbuf, dtype, op, recvcount, 0);
    if (c->nranks == 1) {
        if (recvcount && sendbuf != recvbuf) memmove(recvbuf, sendbuf, recvcount * g.es);
        return DDP_SUCCESS;
    }
    g.shift = -1;
    g.nsteps = g.p - 1;
    _ddp_ring_plan(&g, recvcount, 0, DDP_RING_WINDOW / 2);
    return _ddp_ring_run(&g);
}

DDP_API ddp_result_t ddp_ring_all_gather(ddp_comm_t *c, const void *sendbuf, void *recvbuf,
                                         size_t sendcount, ddp_dtype_t dtype) {
    _ddp_ring_t g;
    unsigned char *own;
    _ddp_ring_setup(&g, c, _DDP_RING_AG, sendbuf, recvbuf, dtype, DDP_SUM, sendcount, 0);
    own = g.recv + (size_t)c->rank * sendcount * g.es;
    if (sendcount && (const unsigned char *)sendbuf != own) memmove(own, sendbuf, sendcount * g.es);
    if (c->nranks == 1) return DDP_SUCCESS;
    g.shift = 0;
    g.nsteps = g.p - 1;
    _ddp_ring_plan(&g, sendcount, 0, 0);
    return _ddp_ring_run(&g);
}

DDP_API ddp_result_t ddp_ring_broadcast(ddp_comm_t *c, const void *sendbuf, void *recvbuf,
                                        size_t count, ddp_dtype_t dtype, int root) {
    _ddp_ring_t g;
    _ddp_ring_setup(&g, c, _DDP_RING_BCAST, sendbuf, recvbuf, dtype, DDP_SUM, count, root);
    if (c->rank == root && count && sendbuf != recvbuf) memmove(recvbuf, sendbuf, count * g.es);
    if (c->nranks == 1) return DDP_SUCCESS;
    g.nsteps = 1;
    _ddp_ring_plan(&g, count, 0, 0);   /* one chunk: the whole buffer */
    /* The chain forwards from recvbuf: the root's copy is already there. */
    g.send = g.recv;
    return _ddp_ring_run(&g);
}

/* ---------------------------------------------------------------- recursive doubling
 * Small all-reduces are latency-bound: the ring's 2(p-1) hops cost more than its bandwidth saves.
 * Recursive doubling takes log2(p) hops, each exchanging the whole buffer with rank r ^ 2^i
 * (Thakur, Rabenseifner & Gropp, "Optimization of collective communication operations in MPICH",
 * IJHPCA 2005). A non-power-of-two world first folds its extra ranks r >= 2^k into r - 2^k and
 * hands them the result at the end. Both partners of a pair combine (lower rank's data, higher
 * rank's data) in that order, so every rank ends with the same bits. The buffer must fit the
 * scratch (the caller checks). */
/* Where a recursive-doubling wait is, formatted only if it fails (no snprintf per step). */
typedef struct { unsigned seq; int step, steps, partner; const char *stage; } _ddp_rd_where_t;
static void _ddp_rd_where(const _ddp_rd_where_t *w, char *out, size_t cap) {
    if (w->steps)
        snprintf(out, cap, "all_reduce #%u, recursive doubling step %d/%d with rank %d", w->seq,
                 w->step, w->steps, w->partner);
    else
        snprintf(out, cap, "all_reduce #%u, recursive doubling %s rank %d", w->seq, w->stage, w->partner);
}

static ddp_result_t _ddp_p2p_wait(ddp_comm_t *c, const int *peers, void **reqs, int n,
                                  const _ddp_rd_where_t *where) {
    char what[160];
    int64_t last = _ddp_now_us();
    ddp_result_t r;
    for (;;) {
        int i, pending = 0, progressed = 0;
        for (i = 0; i < n; i++) {
            int done = 1;
            if (!reqs[i]) continue;
            if ((r = _ddp_test(c, peers[i], reqs[i], &done)) != DDP_SUCCESS) {
                /* Re-word the transport's message: "rank R: <what>: <transport detail>". */
                char prev[1024], *detail = prev, *tail;
                _ddp_strlcpy(prev, c->last_error, sizeof prev);
                if (!strncmp(prev, "rank ", 5) && strstr(prev, ": ")) detail = strstr(prev, ": ") + 2;
                if ((tail = strstr(detail, " [")) != NULL) *tail = 0;
                _ddp_rd_where(where, what, sizeof what);
                return ddp_comm_fail(c, r, "%s: %s", what, detail);
            }
            if (done) { reqs[i] = NULL; progressed = 1; } else pending++;
        }
        if (!pending) return DDP_SUCCESS;
        {
            int64_t now = _ddp_now_us();
            if (progressed) { last = now; continue; }
            if (c->timeout_ms >= 0 && now - last > (int64_t)c->timeout_ms * 1000) {
                _ddp_rd_where(where, what, sizeof what);
                return ddp_comm_fail(c, DDP_ERR_TIMEOUT, "%s: no progress for %d ms waiting for "
                                     "rank %d", what, c->timeout_ms, reqs[0] ? peers[0] : peers[n - 1]);
            }
            if (now - last < c->spin_us) sched_yield();
            else if ((r = _ddp_block(c, peers, n, 100)) != DDP_SUCCESS) return r;
        }
    }
}

static int _ddp_log2(int v) { int k = 0; while ((1 << k) < v) k++; return k; }

DDP_API ddp_result_t ddp_rd_all_reduce(ddp_comm_t *c, const void *sendbuf, void *recvbuf,
                                       size_t count, ddp_dtype_t dtype, ddp_op_t op) {
    const int p = c->nranks, r = c->rank;
    const size_t bytes = count * ddp_dtype_size(dtype);
    const uint64_t tag = _ddp_coll_tag(c, 10, dtype, op, count, 0);
    unsigned char *buf = (unsigned char *)recvbuf, *tmp = c->scratch;
    int p2 = 1, extra, mask, peers[2];
    void *reqs[2];
    _ddp_rd_where_t w;
    ddp_result_t e;
    if (count && sendbuf != recvbuf) memcpy(recvbuf, sendbuf, bytes);
    if (p == 1 || !count) return DDP_SUCCESS;
    while (p2 * 2 <= p) p2 *= 2;
    extra = p - p2;
    w.seq = (unsigned)(tag & 0xffffffffu);
    w.step = w.steps = 0;
    w.stage = r >= p2 ? "fold into" : "fold from";
    w.partner = r >= p2 ? r - p2 : r + p2;
    if (r >= p2) {          /* folded: give our data to r - p2, get the result back */
        peers[0] = peers[1] = r - p2;
        reqs[1] = NULL;
        if ((e = _ddp_isend(c, r - p2, buf, bytes, tag, &reqs[0])) != DDP_SUCCESS ||
            (e = _ddp_p2p_wait(c, peers, reqs, 1, &w)) != DDP_SUCCESS ||
            (e = _ddp_irecv(c, r - p2, buf, bytes, tag, &reqs[0])) != DDP_SUCCESS ||
            (e = _ddp_p2p_wait(c, peers, reqs, 1, &w)) != DDP_SUCCESS)
            return e;
        return DDP_SUCCESS;
    }
    if (r < extra) {
        peers[0] = r + p2;
        if ((e = _ddp_irecv(c, r + p2, tmp, bytes, tag, &reqs[0])) != DDP_SUCCESS ||
            (e = _ddp_p2p_wait(c, peers, reqs, 1, &w)) != DDP_SUCCESS)
            return e;
        ddp_reduce_local(buf, buf, tmp, count, dtype, op);
    }
    for (mask = 1; mask < p2; mask <<= 1) {
        int partner = r ^ mask, step = 0;
        while ((1 << step) < mask) step++;
        w.step = step + 1;
        w.steps = _ddp_log2(p2);
        w.partner = partner;
        peers[0] = peers[1] = partner;
        if ((e = _ddp_irecv(c, partner, tmp, bytes, tag, &reqs[1])) != DDP_SUCCESS ||
            (e = _ddp_isend(c, partner, buf, bytes, tag, &reqs[0])) != DDP_SUCCESS ||
            (e = _ddp_p2p_wait(c, peers, reqs, 2, &w)) != DDP_SUCCESS)
            return e;
        if (r < partner) ddp_reduce_local(buf, buf, tmp, count, dtype, op);
        else ddp_reduce_local(buf, tmp, buf, count, dtype, op);
    }
    if (op == DDP_AVG) ddp_divide_local(buf, count, dtype, p);
    w.steps = 0;
    w.stage = "result to";
    w.partner = r + p2;
    if (r < extra) {
        peers[0] = r + p2;
        if ((e = _ddp_isend(c, r + p2, buf, bytes, tag, &reqs[0])) != DDP_SUCCESS ||
            (e = _ddp_p2p_wait(c, peers, reqs, 1, &w)) != DDP_SUCCESS)
            return e;
    }
    return DDP_SUCCESS;
}

#endif /* DDP_RING implementation */
