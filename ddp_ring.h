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
 *   reduce          small: a binomial tree towards the root (log2 p hops; every rank adds its
 *                   children's partial results in rank order); large: a pipelined chain
 *                   root+p-1 -> ... -> root+1 -> root, each rank adding its own data to the
 *                   segment passing through (every link carries the buffer once).
 *   gather/scatter  small: a binomial tree (log2 p hops, subtrees staged in scratch); large:
 *                   linear, the root exchanging with every rank at once, buffer to buffer.
 *   all-to-all      pairwise exchange: step k sends block r+k to rank r+k and receives block
 *                   r-k from rank r-k, DDP_RING_WINDOW steps in flight, buffer to buffer.
 *   send/recv       direct; a group posts all of its sends and receives together (per peer
 *                   and direction DDP_RING_WINDOW in flight) and progresses them all.
 * Small means: reduce up to _DDP_TREE_MAX_BYTES (16 KiB) when (1 + log2 p) buffers fit the
 * scratch; gather/scatter up to 16 KiB for the whole p-block buffer, p > 2.
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
/* Rooted collectives and all-to-all (ddp.h's ddp_reduce, ddp_gather, ddp_scatter and
 * ddp_all_to_all choose among them). The tree versions stage data in the scratch: reduce needs
 * (1 + log2 p) buffers of count elements to fit, gather/scatter p blocks; else
 * DDP_ERR_INVALID_ARGUMENT. */
DDP_API ddp_result_t ddp_tree_reduce(ddp_comm_t *comm, const void *sendbuf, void *recvbuf,
                                     size_t count, ddp_dtype_t dtype, ddp_op_t op, int root);
DDP_API ddp_result_t ddp_chain_reduce(ddp_comm_t *comm, const void *sendbuf, void *recvbuf,
                                      size_t count, ddp_dtype_t dtype, ddp_op_t op, int root);
DDP_API ddp_result_t ddp_tree_gather(ddp_comm_t *comm, const void *sendbuf, void *recvbuf,
                                     size_t sendcount, ddp_dtype_t dtype, int root);
DDP_API ddp_result_t ddp_linear_gather(ddp_comm_t *comm, const void *sendbuf, void *recvbuf,
                                       size_t sendcount, ddp_dtype_t dtype, int root);
DDP_API ddp_result_t ddp_tree_scatter(ddp_comm_t *comm, const void *sendbuf, void *recvbuf,
                                      size_t recvcount, ddp_dtype_t dtype, int root);
DDP_API ddp_result_t ddp_linear_scatter(ddp_comm_t *comm, const void *sendbuf, void *recvbuf,
                                        size_t recvcount, ddp_dtype_t dtype, int root);
DDP_API ddp_result_t ddp_pairwise_all_to_all(ddp_comm_t *comm, const void *sendbuf, void *recvbuf,
                                             size_t count, ddp_dtype_t dtype);

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

/* ---------------------------------------------------------------- reduce, gather, scatter,
 * all-to-all, send/recv, groups
 * Every message of a collective carries its _ddp_coll_tag (a digest of kind, dtype, op, count,
 * root, and the collective's number), so ranks calling different things fail with
 * DDP_ERR_MISMATCH at the first message that reaches the wrong call. A send/recv carries a
 * digest of (dtype, count) and its number among the messages of that direction of that pair:
 * only the two ranks take part, so the collectives' sequence (c->seq) stays untouched. Peers
 * beyond the ring and recursive-doubling partners are connected on first use: both sides of a
 * pair ask for each other in the same call. */
/* Measured over TCP at p = 3 and 4 on the 2-core VM (each call followed by a barrier, slowest
 * rank, best of 3; tree forced with -D_DDP_TREE_MAX_BYTES=256M against chain/linear with 0):
 * up to 16 KiB the two are within the noise (0.85-1.2x either way); from 64 KiB the chain and
 * the linear forms win, 1.2-2.7x. -D overrides it for such a measurement. */
#ifndef _DDP_TREE_MAX_BYTES
#define _DDP_TREE_MAX_BYTES (16u << 10)
#endif
#define _DDP_LINEAR_FAN 32                /* requests a linear root keeps posted */

/* "rank R: <where>: <the transport's detail>" (the transport said "rank R: <detail> [...]"). */
static ddp_result_t _ddp_x_fail(ddp_comm_t *c, ddp_result_t r, const char *where) {
    char prev[1024], *tail;
    const char *msg = c->last_error, *colon;
    size_t skip = 0;
    if (!strncmp(msg, "rank ", 5) && (colon = strstr(msg, ": ")) != NULL) skip = (size_t)(colon + 2 - msg);
    _ddp_strlcpy(prev, msg + skip, sizeof prev);
    if ((tail = strstr(prev, " [")) != NULL) *tail = 0;
    return ddp_comm_fail(c, r, "%s: %s", where, prev[0] ? prev : ddp_strerror(r));
}

/* Nothing moved since `last`: yield while spinning, then sleep in the transport; a timeout
 * names the call and the peer it waits for. */
static ddp_result_t _ddp_x_idle(ddp_comm_t *c, int64_t last, const int *peers, int n,
                                const char *what, unsigned seq, const char *waiting, int peer) {
    int64_t now = _ddp_now_us();
    if (c->timeout_ms >= 0 && now - last > (int64_t)c->timeout_ms * 1000)
        return ddp_comm_fail(c, DDP_ERR_TIMEOUT, "%s #%u: no progress for %d ms %s rank %d (alive "
                             "but stuck, or not calling the same collective?)", what, seq,
                             c->timeout_ms, waiting, peer);
    if (now - last < c->spin_us) { sched_yield(); return DDP_SUCCESS; }
    {
        int ms = 100;
        if (c->timeout_ms >= 0) {
            int64_t left = (int64_t)c->timeout_ms * 1000 - (now - last);
            if (left / 1000 + 1 < ms) ms = (int)(left / 1000) + 1;
        }
        return _ddp_block(c, peers, n < 8 ? n : 8, ms);
    }
}

typedef struct { int peer, is_send; void *req; } _ddp_xop_t;
typedef struct { ddp_comm_t *c; const char *what, *algo; unsigned seq; } _ddp_x_t;

static void _ddp_x_setup(_ddp_x_t *x, ddp_comm_t *c, const char *what, const char *algo, uint64_t tag) {
    x->c = c; x->what = what; x->algo = algo; x->seq = (unsigned)(tag & 0xffffffffu);
}

static ddp_result_t _ddp_x_post(const _ddp_x_t *x, _ddp_xop_t *o, int peer, int is_send,
                                const void *buf, size_t len, uint64_t tag, const char *phase) {
    ddp_result_t r;
    o->peer = peer;
    o->is_send = is_send;
    o->req = NULL;
    r = is_send ? _ddp_isend(x->c, peer, buf, len, tag, &o->req)
                : _ddp_irecv(x->c, peer, (void *)(uintptr_t)buf, len, tag, &o->req);
    if (r != DDP_SUCCESS) {
        char where[200];
        snprintf(where, sizeof where, "%s #%u (%s), %s, %s rank %d", x->what, x->seq, x->algo, phase,
                 is_send ? "sending to" : "receiving from", peer);
        return _ddp_x_fail(x->c, r, where);
    }
    return DDP_SUCCESS;
}

/* Waits for every posted request of ops[0..n). */
static ddp_result_t _ddp_x_waitall(const _ddp_x_t *x, _ddp_xop_t *ops, int n, const char *phase) {
    ddp_comm_t *c = x->c;
    int64_t last = _ddp_now_us();
    ddp_result_t r;
    for (;;) {
        int i, pending = 0, progressed = 0, peers[8], first = -1;
        for (i = 0; i < n; i++) {
            int done = 1;
            if (!ops[i].req) continue;
            if ((r = _ddp_test(c, ops[i].peer, ops[i].req, &done)) != DDP_SUCCESS) {
                char where[200];
                snprintf(where, sizeof where, "%s #%u (%s), %s, %s rank %d", x->what, x->seq,
                         x->algo, phase, ops[i].is_send ? "sending to" : "receiving from", ops[i].peer);
                return _ddp_x_fail(c, r, where);
            }
            if (done) { ops[i].req = NULL; progressed = 1; continue; }
            if (pending < 8) peers[pending] = ops[i].peer;
            if (first < 0) first = i;
            pending++;
        }
        if (!pending) return DDP_SUCCESS;
        if (progressed) { last = _ddp_now_us(); continue; }
        {
            char what[96];
            snprintf(what, sizeof what, "%s (%s), %s", x->what, x->algo, phase);
            r = _ddp_x_idle(c, last, peers, pending, what, x->seq,
                            ops[first].is_send ? "waiting to send to" : "waiting for data from",
                            ops[first].peer);
            if (r != DDP_SUCCESS) return r;
        }
    }
}

static ddp_result_t _ddp_x_connect(const _ddp_x_t *x, const int *list, int n) {
    ddp_result_t r = _ddp_connect_peers(x->c, list, n);
    if (r != DDP_SUCCESS) {
        char where[160];
        snprintf(where, sizeof where, "%s #%u (%s), phase connect", x->what, x->seq, x->algo);
        return _ddp_x_fail(x->c, r, where);
    }
    return DDP_SUCCESS;
}

static int _ddp_pow2_ceil(int v) { int k = 1; while (k < v) k <<= 1; return k; }

/* Binomial tree over ranks relative to the root (v = rank - root mod p): v's children are
 * v + k for k = 1, 2, 4, ... below lowbit(v) (below p for the root), child v + k heads the
 * subtree [v + k, v + 2k); v's parent is v - lowbit(v). Returns the number of children; list
 * gets their ranks, then the parent's (if any). */
static int _ddp_tree(const ddp_comm_t *c, int root, int *list, int *nlist, int *span) {
    const int p = c->nranks, v = (c->rank - root + p) % p;
    int k, n = 0, nchild;
    *span = v ? (v & -v) : _ddp_pow2_ceil(p);
    for (k = 1; k < *span && v + k < p; k <<= 1) list[n++] = (v + k + root) % p;
    nchild = n;
    if (v) list[n++] = (v - *span + root) % p;
    *nlist = n;
    return nchild;
}

static size_t _ddp_tree_blocks(int p, int v, int k) {   /* blocks in the subtree of v + k */
    return (size_t)(p - v - k < k ? p - v - k : k);
}

DDP_API ddp_result_t ddp_tree_reduce(ddp_comm_t *c, const void *sendbuf, void *recvbuf,
                                     size_t count, ddp_dtype_t dtype, ddp_op_t op, int root) {
    const int p = c->nranks, v = (c->rank - root + p) % p;
    const size_t es = ddp_dtype_size(dtype), bytes = count * es;
    int list[34] = {0}, n, nchild, span, i;
    _ddp_xop_t ops[34];
    unsigned char *acc, *in;
    uint64_t tag;
    _ddp_x_t x;
    ddp_result_t r;
    if (bytes && bytes > c->scratch_bytes / (size_t)(1 + _ddp_log2(p)))
        return ddp_comm_fail(c, DDP_ERR_INVALID_ARGUMENT, "reduce: binomial tree: %d x %zu bytes "
                             "do not fit the %zu-byte scratch", 1 + _ddp_log2(p), bytes, c->scratch_bytes);
    tag = _ddp_coll_tag(c, _DDP_CALL_REDUCE, dtype, op, count, root);
    _ddp_x_setup(&x, c, "reduce", "binomial tree", tag);
    if (p == 1 || !count) {
        if (count && sendbuf != recvbuf) memcpy(recvbuf, sendbuf, bytes);
        return DDP_SUCCESS;
    }
    nchild = _ddp_tree(c, root, list, &n, &span);
    if ((r = _ddp_x_connect(&x, list, n)) != DDP_SUCCESS) return r;
    /* The root accumulates in recvbuf, the others in scratch; children's data lands after it. */
    acc = v == 0 ? (unsigned char *)recvbuf : c->scratch;
    in = v == 0 ? c->scratch : c->scratch + bytes;
    for (i = 0; i < nchild; i++)
        if ((r = _ddp_x_post(&x, &ops[i], list[i], 0, in + (size_t)i * bytes, bytes, tag,
                             "phase receive from children")) != DDP_SUCCESS) return r;
    if (acc != (const unsigned char *)sendbuf) memcpy(acc, sendbuf, bytes);
    if ((r = _ddp_x_waitall(&x, ops, nchild, "phase receive from children")) != DDP_SUCCESS) return r;
    /* Own data, then the subtrees v+1, v+2.., v+4.. : rank order, the same bits every run. */
    for (i = 0; i < nchild; i++) ddp_reduce_local(acc, acc, in + (size_t)i * bytes, count, dtype, op);
    if (v == 0) {
        if (op == DDP_AVG) ddp_divide_local(acc, count, dtype, p);
        return DDP_SUCCESS;
    }
    if ((r = _ddp_x_post(&x, &ops[0], list[nchild], 1, acc, bytes, tag, "phase send to parent")) != DDP_SUCCESS)
        return r;
    return _ddp_x_waitall(&x, ops, 1, "phase send to parent");
}

/* Segment size for streaming count elements: >= 4 segments of >= 64 KiB when the message allows
 * (so the chain pipelines), never above DDP_SEGMENT_BYTES (a scratch slot). */
static size_t _ddp_x_seg_elems(const ddp_comm_t *c, size_t count, size_t es) {
    size_t cap = c->segment_bytes, want = (count * es / 4 + 4095) & ~(size_t)4095;
    size_t lo = (size_t)(64u << 10) < cap ? (size_t)(64u << 10) : cap;
    size_t seg = want < lo ? lo : want > cap ? cap : want;
    return seg / es;
}

DDP_API ddp_result_t ddp_chain_reduce(ddp_comm_t *c, const void *sendbuf, void *recvbuf,
                                      size_t count, ddp_dtype_t dtype, ddp_op_t op, int root) {
    const int p = c->nranks, v = (c->rank - root + p) % p, W = DDP_RING_WINDOW;
    const int from = (c->rank + 1) % p, to = (c->rank + p - 1) % p;
    const int head = v == p - 1, is_root = v == 0;
    const size_t es = ddp_dtype_size(dtype);
    const unsigned char *send = (const unsigned char *)sendbuf;
    unsigned char *recv = (unsigned char *)recvbuf;
    size_t seg, nseg, ns = 0, ds = 0, nr = 0, dr = 0, nsend, nrecv;
    void *sreq[DDP_RING_WINDOW], *rreq[DDP_RING_WINDOW];
    int sslot[DDP_RING_WINDOW], rslot[DDP_RING_WINDOW], free_slots[DDP_RING_WINDOW], nfree = 0, i;
    int peers[2];
    int64_t last;
    uint64_t tag = _ddp_coll_tag(c, _DDP_CALL_REDUCE, dtype, op, count, root);
    char where[200];
    _ddp_x_t x;
    ddp_result_t r;
    _ddp_x_setup(&x, c, "reduce", "pipelined chain", tag);
    if (p == 1 || !count) {
        if (count && sendbuf != recvbuf) memcpy(recvbuf, sendbuf, count * es);
        return DDP_SUCCESS;
    }
    peers[0] = from; peers[1] = to;
    if ((r = _ddp_x_connect(&x, head ? &to : is_root ? &from : peers, head || is_root ? 1 : 2)) != DDP_SUCCESS)
        return r;
    seg = _ddp_x_seg_elems(c, count, es);
    nseg = (count + seg - 1) / seg;
    nsend = is_root ? 0 : nseg;
    nrecv = head ? 0 : nseg;
    for (i = 0; i < W; i++) free_slots[nfree++] = i;
    last = _ddp_now_us();
    while (ds < nsend || dr < nrecv) {
        int progressed = 0, done;
        /* The head of the chain streams its own data. */
        while (head && ns < nsend && ns - ds < (size_t)W) {
            size_t off = ns * seg, len = count - off < seg ? count - off : seg;
            sslot[ns % W] = -1;
            if ((r = _ddp_isend(c, to, send + off * es, len * es, tag, &sreq[ns % W])) != DDP_SUCCESS) goto fail_send;
            ns++;
        }
        while (nr < nrecv && nr - dr < (size_t)W && nfree) {
            size_t off = nr * seg, len = count - off < seg ? count - off : seg;
            int s = free_slots[--nfree];
            rslot[nr % W] = s;
            if ((r = _ddp_irecv(c, from, c->scratch + (size_t)s * c->segment_bytes, len * es, tag,
                                &rreq[nr % W])) != DDP_SUCCESS) goto fail_recv;
            nr++;
        }
        while (ds < ns) {
            if ((r = _ddp_test(c, to, sreq[ds % W], &done)) != DDP_SUCCESS) goto fail_send;
            if (!done) break;
            if (sslot[ds % W] >= 0) free_slots[nfree++] = sslot[ds % W];
            ds++;
            progressed = 1;
        }
        while (dr < nr) {
            size_t off = dr * seg, len = count - off < seg ? count - off : seg;
            int s = rslot[dr % W];
            unsigned char *scr = c->scratch + (size_t)s * c->segment_bytes;
            if ((r = _ddp_test(c, from, rreq[dr % W], &done)) != DDP_SUCCESS) goto fail_recv;
            if (!done) break;
            if (is_root) {
                ddp_reduce_local(recv + off * es, send + off * es, scr, len, dtype, op);
                if (op == DDP_AVG) ddp_divide_local(recv + off * es, len, dtype, p);
                free_slots[nfree++] = s;
            } else {
                /* Add our data and pass it on; the slot is free once the send is done (a send
                 * holds a slot that a receive had, so at most W sends are in flight). */
                ddp_reduce_local(scr, send + off * es, scr, len, dtype, op);
                sslot[ns % W] = s;
                if ((r = _ddp_isend(c, to, scr, len * es, tag, &sreq[ns % W])) != DDP_SUCCESS) goto fail_send;
                ns++;
            }
            dr++;
            progressed = 1;
        }
        if (progressed) { last = _ddp_now_us(); continue; }
        snprintf(where, sizeof where, "reduce (pipelined chain), segment %zu/%zu", (dr < nrecv ? dr : ds) + 1, nseg);
        r = _ddp_x_idle(c, last, head ? &to : is_root ? &from : peers, head || is_root ? 1 : 2, where,
                        x.seq, dr < nrecv ? "waiting for data from" : "waiting to send to",
                        dr < nrecv ? from : to);
        if (r != DDP_SUCCESS) return r;
    }
    return DDP_SUCCESS;
fail_send:
    snprintf(where, sizeof where, "reduce #%u (pipelined chain), segment %zu/%zu, sending to rank %d",
             x.seq, ds + 1, nseg, to);
    return _ddp_x_fail(c, r, where);
fail_recv:
    snprintf(where, sizeof where, "reduce #%u (pipelined chain), segment %zu/%zu, receiving from rank %d",
             x.seq, dr + 1, nseg, from);
    return _ddp_x_fail(c, r, where);
}

DDP_API ddp_result_t ddp_tree_gather(ddp_comm_t *c, const void *sendbuf, void *recvbuf,
                                     size_t sendcount, ddp_dtype_t dtype, int root) {
    const int p = c->nranks, v = (c->rank - root + p) % p;
    const size_t bytes = sendcount * ddp_dtype_size(dtype);
    int list[34] = {0}, n, nchild, span, i, j;
    _ddp_xop_t ops[34];
    size_t mine;
    uint64_t tag;
    _ddp_x_t x;
    ddp_result_t r;
    if (bytes > c->scratch_bytes / (size_t)p)
        return ddp_comm_fail(c, DDP_ERR_INVALID_ARGUMENT, "gather: binomial tree: %d x %zu bytes do "
                             "not fit the %zu-byte scratch", p, bytes, c->scratch_bytes);
    tag = _ddp_coll_tag(c, _DDP_CALL_GATHER, dtype, DDP_SUM, sendcount, root);
    _ddp_x_setup(&x, c, "gather", "binomial tree", tag);
    if (p == 1 || !sendcount) {
        unsigned char *own = (unsigned char *)recvbuf + (size_t)c->rank * bytes;
        if (sendcount && own != sendbuf) memmove(own, sendbuf, bytes);
        return DDP_SUCCESS;
    }
    nchild = _ddp_tree(c, root, list, &n, &span);
    if ((r = _ddp_x_connect(&x, list, n)) != DDP_SUCCESS) return r;
    /* Scratch holds our subtree's blocks in relative order: ours first. */
    for (i = 0, j = 1; i < nchild; i++, j <<= 1)
        if ((r = _ddp_x_post(&x, &ops[i], list[i], 0, c->scratch + (size_t)j * bytes,
                             _ddp_tree_blocks(p, v, j) * bytes, tag, "phase receive from children")) != DDP_SUCCESS)
            return r;
    memcpy(c->scratch, sendbuf, bytes);
    if ((r = _ddp_x_waitall(&x, ops, nchild, "phase receive from children")) != DDP_SUCCESS) return r;
    if (v) {
        mine = (size_t)(p - v < span ? p - v : span);
        if ((r = _ddp_x_post(&x, &ops[0], list[nchild], 1, c->scratch, mine * bytes, tag,
                             "phase send to parent")) != DDP_SUCCESS) return r;
        return _ddp_x_waitall(&x, ops, 1, "phase send to parent");
    }
    for (j = 0; j < p; j++)
        memcpy((unsigned char *)recvbuf + (size_t)((j + root) % p) * bytes, c->scratch + (size_t)j * bytes, bytes);
    return DDP_SUCCESS;
}

DDP_API ddp_result_t ddp_tree_scatter(ddp_comm_t *c, const void *sendbuf, void *recvbuf,
                                      size_t recvcount, ddp_dtype_t dtype, int root) {
    const int p = c->nranks, v = (c->rank - root + p) % p;
    const size_t bytes = recvcount * ddp_dtype_size(dtype);
    int list[34] = {0}, n, nchild, span, i, j;
    _ddp_xop_t ops[34];
    uint64_t tag;
    _ddp_x_t x;
    ddp_result_t r;
    if (bytes > c->scratch_bytes / (size_t)p)
        return ddp_comm_fail(c, DDP_ERR_INVALID_ARGUMENT, "scatter: binomial tree: %d x %zu bytes do "
                             "not fit the %zu-byte scratch", p, bytes, c->scratch_bytes);
    tag = _ddp_coll_tag(c, _DDP_CALL_SCATTER, dtype, DDP_SUM, recvcount, root);
    _ddp_x_setup(&x, c, "scatter", "binomial tree", tag);
    if (p == 1 || !recvcount) {
        const unsigned char *own = (const unsigned char *)sendbuf + (size_t)c->rank * bytes;
        if (recvcount && own != recvbuf) memmove(recvbuf, own, bytes);
        return DDP_SUCCESS;
    }
    nchild = _ddp_tree(c, root, list, &n, &span);
    if ((r = _ddp_x_connect(&x, list, n)) != DDP_SUCCESS) return r;
    if (v == 0) {
        for (j = 0; j < p; j++)
            memcpy(c->scratch + (size_t)j * bytes, (const unsigned char *)sendbuf + (size_t)((j + root) % p) * bytes, bytes);
    } else {
        size_t mine = (size_t)(p - v < span ? p - v : span);
        if ((r = _ddp_x_post(&x, &ops[0], list[nchild], 0, c->scratch, mine * bytes, tag,
                             "phase receive from parent")) != DDP_SUCCESS ||
            (r = _ddp_x_waitall(&x, ops, 1, "phase receive from parent")) != DDP_SUCCESS)
            return r;
    }
    for (i = 0, j = 1; i < nchild; i++, j <<= 1)
        if ((r = _ddp_x_post(&x, &ops[i], list[i], 1, c->scratch + (size_t)j * bytes,
                             _ddp_tree_blocks(p, v, j) * bytes, tag, "phase send to children")) != DDP_SUCCESS)
            return r;
    if (recvbuf != c->scratch) memcpy(recvbuf, c->scratch, bytes);
    return _ddp_x_waitall(&x, ops, nchild, "phase send to children");
}

/* The root exchanges with every other rank directly, _DDP_LINEAR_FAN requests at a time. */
static ddp_result_t _ddp_linear(ddp_comm_t *c, int is_gather, const void *sendbuf, void *recvbuf,
                                size_t count, ddp_dtype_t dtype, int root) {
    const int p = c->nranks;
    const size_t bytes = count * ddp_dtype_size(dtype);
    const char *phase = c->rank == root ? "phase root, every rank at once" : "phase to/from the root";
    _ddp_xop_t ops[_DDP_LINEAR_FAN];
    uint64_t tag = _ddp_coll_tag(c, is_gather ? _DDP_CALL_GATHER : _DDP_CALL_SCATTER, dtype, DDP_SUM, count, root);
    _ddp_x_t x;
    ddp_result_t r;
    int q, n;
    _ddp_x_setup(&x, c, is_gather ? "gather" : "scatter", "linear", tag);
    if (c->rank == root) {
        unsigned char *own = is_gather ? (unsigned char *)recvbuf + (size_t)root * bytes
                                       : (unsigned char *)(uintptr_t)sendbuf + (size_t)root * bytes;
        if (count && own != (is_gather ? sendbuf : recvbuf)) {
            if (is_gather) memmove(own, sendbuf, bytes); else memmove(recvbuf, own, bytes);
        }
        if (p == 1 || !count) return DDP_SUCCESS;
        if ((r = _ddp_x_connect(&x, NULL, p)) != DDP_SUCCESS) return r;
        for (q = 0, n = 0; q < p; q++) {
            if (q == root) continue;
            r = _ddp_x_post(&x, &ops[n++], q, !is_gather,
                            is_gather ? (const unsigned char *)recvbuf + (size_t)q * bytes
                                      : (const unsigned char *)sendbuf + (size_t)q * bytes, bytes, tag, phase);
            if (r == DDP_SUCCESS && n == _DDP_LINEAR_FAN) { r = _ddp_x_waitall(&x, ops, n, phase); n = 0; }
            if (r != DDP_SUCCESS) return r;
        }
        return _ddp_x_waitall(&x, ops, n, phase);
    }
    if (!count) return DDP_SUCCESS;
    if ((r = _ddp_x_connect(&x, &root, 1)) != DDP_SUCCESS ||
        (r = _ddp_x_post(&x, &ops[0], root, is_gather, is_gather ? sendbuf : recvbuf, bytes, tag, phase)) != DDP_SUCCESS)
        return r;
    return _ddp_x_waitall(&x, ops, 1, phase);
}

DDP_API ddp_result_t ddp_linear_gather(ddp_comm_t *c, const void *sendbuf, void *recvbuf,
                                       size_t sendcount, ddp_dtype_t dtype, int root) {
    return _ddp_linear(c, 1, sendbuf, recvbuf, sendcount, dtype, root);
}

DDP_API ddp_result_t ddp_linear_scatter(ddp_comm_t *c, const void *sendbuf, void *recvbuf,
                                        size_t recvcount, ddp_dtype_t dtype, int root) {
    return _ddp_linear(c, 0, sendbuf, recvbuf, recvcount, dtype, root);
}

DDP_API ddp_result_t ddp_pairwise_all_to_all(ddp_comm_t *c, const void *sendbuf, void *recvbuf,
                                             size_t count, ddp_dtype_t dtype) {
    const int p = c->nranks, me = c->rank, W = DDP_RING_WINDOW;
    const size_t bytes = count * ddp_dtype_size(dtype);
    const unsigned char *send = (const unsigned char *)sendbuf;
    unsigned char *recv = (unsigned char *)recvbuf;
    void *sreq[DDP_RING_WINDOW], *rreq[DDP_RING_WINDOW];
    uint64_t tag = _ddp_coll_tag(c, _DDP_CALL_ALL_TO_ALL, dtype, DDP_SUM, count, 0);
    int ns = 1, ds = 1, peers[2];
    int64_t last;
    char where[200];
    ddp_result_t r = DDP_SUCCESS;
    _ddp_x_t x;
    _ddp_x_setup(&x, c, "all_to_all", "pairwise exchange", tag);
    if (count) memcpy(recv + (size_t)me * bytes, send + (size_t)me * bytes, bytes);
    if (p == 1 || !count) return DDP_SUCCESS;
    if ((r = _ddp_x_connect(&x, NULL, p)) != DDP_SUCCESS) return r;
    last = _ddp_now_us();
    while (ds < p) {
        int progressed = 0, to, from;
        /* Step k: block me+k to rank me+k, block me-k from rank me-k. */
        while (ns < p && ns - ds < W) {
            to = (me + ns) % p;
            from = (me - ns + p) % p;
            if ((r = _ddp_irecv(c, from, recv + (size_t)from * bytes, bytes, tag, &rreq[ns % W])) != DDP_SUCCESS) {
                snprintf(where, sizeof where, "all_to_all #%u (pairwise exchange), step %d/%d, receiving from rank %d", x.seq, ns, p - 1, from);
                return _ddp_x_fail(c, r, where);
            }
            if ((r = _ddp_isend(c, to, send + (size_t)to * bytes, bytes, tag, &sreq[ns % W])) != DDP_SUCCESS) {
                snprintf(where, sizeof where, "all_to_all #%u (pairwise exchange), step %d/%d, sending to rank %d", x.seq, ns, p - 1, to);
                return _ddp_x_fail(c, r, where);
            }
            ns++;
        }
        while (ds < ns) {
            int done;
            to = (me + ds) % p;
            from = (me - ds + p) % p;
            if (rreq[ds % W]) {
                if ((r = _ddp_test(c, from, rreq[ds % W], &done)) != DDP_SUCCESS) {
                    snprintf(where, sizeof where, "all_to_all #%u (pairwise exchange), step %d/%d, receiving from rank %d", x.seq, ds, p - 1, from);
                    return _ddp_x_fail(c, r, where);
                }
                if (done) { rreq[ds % W] = NULL; progressed = 1; }
            }
            if (sreq[ds % W]) {
                if ((r = _ddp_test(c, to, sreq[ds % W], &done)) != DDP_SUCCESS) {
                    snprintf(where, sizeof where, "all_to_all #%u (pairwise exchange), step %d/%d, sending to rank %d", x.seq, ds, p - 1, to);
                    return _ddp_x_fail(c, r, where);
                }
                if (done) { sreq[ds % W] = NULL; progressed = 1; }
            }
            if (rreq[ds % W] || sreq[ds % W]) break;
            ds++;
        }
        if (progressed || ds == p) { last = _ddp_now_us(); continue; }
        peers[0] = (me - ds + p) % p;
        peers[1] = (me + ds) % p;
        snprintf(where, sizeof where, "all_to_all (pairwise exchange), step %d/%d", ds, p - 1);
        r = _ddp_x_idle(c, last, peers, 2, where, x.seq, rreq[ds % W] ? "waiting for data from" :
                        "waiting to send to", rreq[ds % W] ? peers[0] : peers[1]);
        if (r != DDP_SUCCESS) return r;
    }
    return DDP_SUCCESS;
}

/* ---------------------------------------------------------------- send/recv and groups */
static uint64_t _ddp_p2p_tag(ddp_dtype_t dtype, size_t count, uint32_t seq) {
    int64_t fields[5];
    fields[0] = _DDP_CALL_SEND; fields[1] = dtype; fields[2] = 0; fields[3] = (int64_t)count; fields[4] = -1;
    return (_ddp_fnv1a(fields, sizeof fields, _DDP_FNV_INIT) & 0xffffffff00000000ull) | seq;
}

static void _ddp_p2p_where(const ddp_comm_t *c, const _ddp_call_t *k, int n, char *out, size_t cap) {
    size_t bytes = k->count * ddp_dtype_size(k->dtype);
    snprintf(out, cap, "%s #%u %s rank %d (%zu bytes%s)", k->kind == _DDP_CALL_SEND ? "send" : "recv",
             (unsigned)(k->tag & 0xffffffffu), k->kind == _DDP_CALL_SEND ? "to" : "from", k->root,
             bytes, n > 1 ? ", in a group" : "");
    (void)c;
}

/* Runs the sends and receives of ops[0..n) together (other calls are skipped). Per peer and
 * direction, messages go in call order, DDP_RING_WINDOW in flight; c->p2p[4 peer + 2/3] count
 * them. A send to this rank is the next receive from this rank: a copy. */
static ddp_result_t _ddp_p2p_batch(ddp_comm_t *c, _ddp_call_t *ops, int n) {
    const uint32_t W = DDP_RING_WINDOW;
    int i, j, lo = 0, npeers = 0, *list = (int *)(void *)c->scratch;
    const int list_cap = (int)(c->scratch_bytes / sizeof(int));
    int64_t last;
    char where[200];
    ddp_result_t r = DDP_SUCCESS;
    for (i = 0; i < n; i++) {
        _ddp_call_t *k = &ops[i];
        int peer = k->root, is_send = k->kind == _DDP_CALL_SEND;
        if (k->kind != _DDP_CALL_SEND && k->kind != _DDP_CALL_RECV) { k->state = 2; continue; }
        k->state = 0;
        k->req = NULL;
        if (peer == c->rank) { k->tag = 0; continue; }
        k->tag = _ddp_p2p_tag(k->dtype, k->count, ++c->p2p[4 * peer + (is_send ? 0 : 1)]);
        if (c->log_level >= DDP_LOG_TRACE) {
            _ddp_p2p_where(c, k, n, where, sizeof where);
            _DDP_LOG(c, DDP_LOG_TRACE, "%s: %zu x %s, direct", where, k->count, ddp_dtype_name(k->dtype));
        }
        /* Peers to connect, each once (the in-flight counters are zero here: marks). */
        if (!c->p2p[4 * peer + 2]) {
            c->p2p[4 * peer + 2] = 1;
            if (npeers < list_cap) list[npeers] = peer;
            npeers++;
        }
    }
    for (i = 0; i < n; i++) if (ops[i].state == 0 && ops[i].root != c->rank) c->p2p[4 * ops[i].root + 2] = 0;
    /* Sends to self, matched in order with receives from self. */
    for (i = 0, j = 0; i < n; i++) {
        _ddp_call_t *k = &ops[i];
        size_t sb;
        if (k->state != 0 || k->root != c->rank || k->kind != _DDP_CALL_SEND) continue;
        while (j < n && !(ops[j].state == 0 && ops[j].root == c->rank && ops[j].kind == _DDP_CALL_RECV)) j++;
        if (j == n)
            return ddp_comm_fail(c, DDP_ERR_MISMATCH, "group: a send to this rank (itself, %zu x %s) "
                                 "has no matching recv from itself in the group", k->count, ddp_dtype_name(k->dtype));
        sb = k->count * ddp_dtype_size(k->dtype);
        if (ops[j].dtype != k->dtype || ops[j].count != k->count)
            return ddp_comm_fail(c, DDP_ERR_MISMATCH, "group: send to itself of %zu x %s, but its recv "
                                 "from itself expects %zu x %s", k->count, ddp_dtype_name(k->dtype),
                                 ops[j].count, ddp_dtype_name(ops[j].dtype));
        if (sb && ops[j].recv != k->send) memmove(ops[j].recv, k->send, sb);
        k->state = ops[j].state = 2;
    }
    for (i = 0; i < n; i++)
        if (ops[i].state == 0 && ops[i].root == c->rank)
            return ddp_comm_fail(c, DDP_ERR_MISMATCH, "group: a recv from this rank (itself, %zu x %s) "
                                 "has no matching send to itself in the group", ops[i].count,
                                 ddp_dtype_name(ops[i].dtype));
    if (npeers) {
        r = _ddp_connect_peers(c, npeers <= list_cap ? list : NULL, npeers <= list_cap ? npeers : c->nranks);
        if (r != DDP_SUCCESS) return _ddp_x_fail(c, r, n > 1 ? "group, phase connect" : "send/recv, phase connect");
    }
    last = _ddp_now_us();
    for (;;) {
        int progressed = 0, pending = 0, peers[8], first = -1;
        while (lo < n && ops[lo].state == 2) lo++;
        if (lo == n) break;
        for (i = lo; i < n; i++) {
            _ddp_call_t *k = &ops[i];
            int is_send = k->kind == _DDP_CALL_SEND, done = 0;
            uint32_t *inflight = &c->p2p[4 * k->root + (is_send ? 2 : 3)];
            size_t bytes;
            if (k->state == 2) continue;
            bytes = k->count * ddp_dtype_size(k->dtype);
            if (k->state == 0) {
                if (*inflight >= W) continue;
                r = is_send ? _ddp_isend(c, k->root, k->send, bytes, k->tag, &k->req)
                            : _ddp_irecv(c, k->root, k->recv, bytes, k->tag, &k->req);
                if (r != DDP_SUCCESS) goto fail;
                k->state = 1;
                (*inflight)++;
            }
            if ((r = _ddp_test(c, k->root, k->req, &done)) != DDP_SUCCESS) goto fail;
            if (done) {
                k->state = 2;
                k->req = NULL;
                (*inflight)--;
                progressed = 1;
                continue;
            }
            if (pending < 8) peers[pending] = k->root;
            if (first < 0) first = i;
            pending++;
        }
        if (progressed) { last = _ddp_now_us(); continue; }
        if (first < 0) continue;
        _ddp_p2p_where(c, &ops[first], n, where, sizeof where);
        r = _ddp_x_idle(c, last, peers, pending, ops[first].kind == _DDP_CALL_SEND ? "send" : "recv",
                        (unsigned)(ops[first].tag & 0xffffffffu),
                        ops[first].kind == _DDP_CALL_SEND ? "waiting to send to" : "waiting for data from",
                        ops[first].root);
        if (r != DDP_SUCCESS) { i = -1; goto fail; }
    }
    return DDP_SUCCESS;
fail:
    for (j = 0; j < n; j++) if (ops[j].root != c->rank) c->p2p[4 * ops[j].root + 2] = c->p2p[4 * ops[j].root + 3] = 0;
    if (i < 0) return r;
    _ddp_p2p_where(c, &ops[i], n, where, sizeof where);
    return _ddp_x_fail(c, r, where);
}

/* One call, now: the algorithm depends only on (bytes, world size, scratch), the same on every
 * rank. */
static ddp_result_t _ddp_call_run(ddp_comm_t *c, _ddp_call_t *k) {
    const int p = c->nranks;
    const size_t bytes = k->count * ddp_dtype_size(k->dtype);
    int tree;
    switch (k->kind) {
    case _DDP_CALL_REDUCE:
        tree = bytes <= _DDP_TREE_MAX_BYTES && bytes <= c->scratch_bytes / (size_t)(1 + _ddp_log2(p));
        _DDP_LOG(c, DDP_LOG_TRACE, "reduce #%u: %zu x %s %s to root %d, %s, %s", c->seq + 1, k->count,
                 ddp_dtype_name(k->dtype), ddp_op_name(k->op), k->root,
                 k->send == k->recv ? "in place" : "out of place", tree ? "binomial tree" : "pipelined chain");
        return tree ? ddp_tree_reduce(c, k->send, k->recv, k->count, k->dtype, k->op, k->root)
                    : ddp_chain_reduce(c, k->send, k->recv, k->count, k->dtype, k->op, k->root);
    case _DDP_CALL_GATHER: case _DDP_CALL_SCATTER: {
        int gather = k->kind == _DDP_CALL_GATHER;
        tree = p > 2 && bytes <= _DDP_TREE_MAX_BYTES / (size_t)p && bytes <= c->scratch_bytes / (size_t)p;
        _DDP_LOG(c, DDP_LOG_TRACE, "%s #%u: %zu x %s per rank, root %d, %s", gather ? "gather" : "scatter",
                 c->seq + 1, k->count, ddp_dtype_name(k->dtype), k->root, tree ? "binomial tree" : "linear");
        if (gather)
            return tree ? ddp_tree_gather(c, k->send, k->recv, k->count, k->dtype, k->root)
                        : ddp_linear_gather(c, k->send, k->recv, k->count, k->dtype, k->root);
        return tree ? ddp_tree_scatter(c, k->send, k->recv, k->count, k->dtype, k->root)
                    : ddp_linear_scatter(c, k->send, k->recv, k->count, k->dtype, k->root);
    }
    case _DDP_CALL_ALL_TO_ALL:
        _DDP_LOG(c, DDP_LOG_TRACE, "all_to_all #%u: %zu x %s per peer, pairwise exchange", c->seq + 1,
                 k->count, ddp_dtype_name(k->dtype));
        return ddp_pairwise_all_to_all(c, k->send, k->recv, k->count, k->dtype);
    default:
        if (k->kind > _DDP_CALL_OP) {       /* all_reduce ... barrier queued in a group */
            _ddp_op_t o = _ddp_op_make(k->kind - _DDP_CALL_OP, k->send, k->recv, k->count,
                                       k->dtype, k->op, k->root);
            return _ddp_run_op_raw(c, &o);
        }
        return _ddp_p2p_batch(c, k, 1);
    }
}

static ddp_result_t _ddp_group_queue(ddp_comm_t *c, const _ddp_call_t *k) {
    if (c->group_err != DDP_SUCCESS) return DDP_SUCCESS;   /* group_end reports the first */
    if (c->group_n == c->group_cap) {
        int cap = c->group_cap ? 2 * c->group_cap : 16;
        _ddp_call_t *ops = (_ddp_call_t *)ddp_comm_calloc(c, sizeof *ops * (size_t)cap);
        if (!ops) {
            c->group_err = ddp_comm_fail(c, DDP_ERR_OUT_OF_MEMORY, "group: queueing call %d", c->group_n + 1);
            return c->group_err;
        }
        if (c->group_n) memcpy(ops, c->group_ops, sizeof *ops * (size_t)c->group_n);
        ddp_comm_free(c, c->group_ops);
        c->group_ops = ops;
        c->group_cap = cap;
    }
    ((_ddp_call_t *)c->group_ops)[c->group_n++] = *k;
    return DDP_SUCCESS;
}

/* Tensor fusion (Horovod: Sergeev and Del Balso, "Horovod: fast and easy distributed deep
 * learning in TensorFlow", 2018, section "Tensor Fusion") for a group's small all-reduces: a run
 * of consecutive ones with the same dtype and op, at most _DDP_FUSE_BYTES together, is packed
 * into one buffer, reduced once and unpacked: one latency instead of one per call. A group holds
 * the same calls on every rank, so every rank packs the same way. A call whose buffers overlap
 * an earlier member's is not fused (in order, it would see that member's result). */
#define _DDP_FUSE_BYTES ((size_t)64 << 10)

/* How many calls from ops[i] on can run as one fused all-reduce (1: just ops[i]). */
static int _ddp_fuse_run_length(const _ddp_call_t *ops, int i, int n) {
    const _ddp_call_t *a = &ops[i];
    size_t es = ddp_dtype_size(a->dtype), total = a->count * es;
    int j, m;
    if (a->kind != _DDP_CALL_OP + _DDP_OP_ALL_REDUCE || total > _DDP_FUSE_BYTES) return 1;
    for (j = i + 1; j < n; j++) {
        const _ddp_call_t *b = &ops[j];
        size_t bytes = b->count * es;
        if (b->kind != a->kind || b->dtype != a->dtype || b->op != a->op ||
            total + bytes > _DDP_FUSE_BYTES)
            break;
        for (m = i; m < j; m++) {
            size_t mb = ops[m].count * es;
            if (_ddp_ranges_meet(b->recv, bytes, ops[m].send, mb) ||
                _ddp_ranges_meet(b->recv, bytes, ops[m].recv, mb) ||
                _ddp_ranges_meet(b->send, bytes, ops[m].recv, mb))
                break;
        }
        if (m < j) break;
        total += bytes;
    }
    return j - i;
}

static ddp_result_t _ddp_fused_all_reduce(ddp_comm_t *c, const _ddp_call_t *ops, int k) {
    size_t es = ddp_dtype_size(ops[0].dtype), off = 0;
    _ddp_op_t o;
    ddp_result_t r;
    int j;
    if (!c->fuse_buf && !(c->fuse_buf = (unsigned char *)ddp_comm_calloc(c, _DDP_FUSE_BYTES)))
        return ddp_comm_fail(c, DDP_ERR_OUT_OF_MEMORY, "group_end: the fusion buffer (%zu bytes)",
                             (size_t)_DDP_FUSE_BYTES);
    for (j = 0; j < k; j++) {
        if (ops[j].count) memcpy(c->fuse_buf + off, ops[j].send, ops[j].count * es);
        off += ops[j].count * es;
    }
    _DDP_LOG(c, DDP_LOG_TRACE, "group_end: %d all_reduces fused into one of %zu bytes", k, off);
    o = _ddp_op_make(_DDP_OP_ALL_REDUCE, c->fuse_buf, c->fuse_buf, off / es, ops[0].dtype, ops[0].op, 0);
    if ((r = _ddp_run_op_raw(c, &o)) != DDP_SUCCESS) return r;
    for (off = 0, j = 0; j < k; j++) {
        if (ops[j].count) memcpy(ops[j].recv, c->fuse_buf + off, ops[j].count * es);
        off += ops[j].count * es;
    }
    return DDP_SUCCESS;
}

/* The outermost group_end: the collectives in call order, then all sends and receives at once. */
static ddp_result_t _ddp_group_run(ddp_comm_t *c) {
    _ddp_call_t *ops = (_ddp_call_t *)c->group_ops;
    int n = c->group_n, i, nsend = 0, nrecv = 0;
    ddp_result_t r;
    c->group_n = 0;
    if (c->group_err != DDP_SUCCESS) {
        _DDP_LOG(c, DDP_LOG_TRACE, "group_end: %d calls not run: one failed its checks", n);
        return c->group_err;
    }
    for (i = 0; i < n; i++) nsend += ops[i].kind == _DDP_CALL_SEND, nrecv += ops[i].kind == _DDP_CALL_RECV;
    _DDP_LOG(c, DDP_LOG_TRACE, "group_end: %d calls: %d collectives, then %d sends and %d receives together",
             n, n - nsend - nrecv, nsend, nrecv);
    for (i = 0; i < n; i++) {
        int k;
        if (ops[i].kind == _DDP_CALL_SEND || ops[i].kind == _DDP_CALL_RECV) continue;
        k = _ddp_fuse_run_length(ops, i, n);
        r = k > 1 ? _ddp_fused_all_reduce(c, ops + i, k) : _ddp_call_run(c, &ops[i]);
        if (r != DDP_SUCCESS) return r;
        i += k - 1;
    }
    return nsend + nrecv ? _ddp_p2p_batch(c, ops, n) : DDP_SUCCESS;
}

#endif /* DDP_RING implementation */
