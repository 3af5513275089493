/* SPDX-License-Identifier: MIT (see LICENSE) */
/* ddp_kernels.h — libddp's local reduction kernels and fp16/bf16 conversion.
 *
 * ddp_reduce_local(dst, a, b, n, dtype, op) computes dst = a op b elementwise for every
 * dtype/op (dst may equal a or b). Integers wrap (computed unsigned); fp16/bf16 go through fp32
 * and round to nearest even. Loops work on fixed blocks so compilers vectorise them at -O2; on
 * x86 the fp16/bf16 kernels pick F16C/AVX2 at run time (CPU feature dispatch), so a binary
 * built without -march=native still uses them. The same inputs give the same bits everywhere.
 * Depends on ddp_base.h. Built by DDP_IMPLEMENTATION (or DDP_KERNELS_IMPLEMENTATION).
 */
#if defined(DDP_IMPLEMENTATION) && !defined(DDP_KERNELS_IMPLEMENTATION)
#define DDP_KERNELS_IMPLEMENTATION
#endif
#if defined(DDP_KERNELS_IMPLEMENTATION)
#ifndef DDP_BASE_IMPLEMENTATION
#define DDP_BASE_IMPLEMENTATION
#endif
#endif
#include "ddp_base.h"

#ifndef DDP_KERNELS_H_INCLUDED
#define DDP_KERNELS_H_INCLUDED

#ifdef __cplusplus
extern "C" {
#endif

DDP_API void ddp_reduce_local(void *dst, const void *a, const void *b, size_t count,
                              ddp_dtype_t dtype, ddp_op_t op);
/* x[i] /= divisor (the AVG finish): truncating for integers, IEEE division (in fp32 for
 * fp16/bf16) for floating point. */
DDP_API void ddp_divide_local(void *x, size_t count, ddp_dtype_t dtype, int divisor);
DDP_API float ddp_half_to_float(uint16_t h);
DDP_API uint16_t ddp_float_to_half(float f);          /* round to nearest even */
DDP_API float ddp_bfloat16_to_float(uint16_t h);
DDP_API uint16_t ddp_float_to_bfloat16(float f);      /* round to nearest even */

#ifdef __cplusplus
}
#endif
#endif /* DDP_KERNELS_H_INCLUDED */

/* ============================================================================================
 * IMPLEMENTATION
 * ========================================================================================== */
#if defined(DDP_KERNELS_IMPLEMENTATION) && !defined(DDP_KERNELS_IMPL_INCLUDED)
#define DDP_KERNELS_IMPL_INCLUDED
#ifndef DDP_BASE_IMPL_INCLUDED
#error "libddp: ddp_kernels.h's implementation needs ddp_base.h's (define DDP_IMPLEMENTATION)"
#endif

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
/* Buffers may start at any byte (a user's buffer, a segment of one, a field of a packed
 * struct): the kernels read and write through element types of alignment 1, which is defined
 * behaviour and compiles to the same (unaligned) vector moves the compilers use anyway, since
 * they cannot know a buffer's alignment. libddp needs GCC or Clang (or a compiler that accepts
 * their __atomic builtins and attributes, which all take this one); elsewhere the types are the
 * plain ones. */
#if defined(__GNUC__) || defined(__clang__)
#define _DDP_ALIGN1 __attribute__((aligned(1)))
#else
#define _DDP_ALIGN1
#endif
typedef uint8_t _ddp_u_uint8_t;
typedef int8_t _ddp_u_int8_t;
typedef uint16_t _ddp_u_uint16_t _DDP_ALIGN1;
typedef uint32_t _ddp_u_uint32_t _DDP_ALIGN1;
typedef int32_t _ddp_u_int32_t _DDP_ALIGN1;
typedef uint64_t _ddp_u_uint64_t _DDP_ALIGN1;
typedef int64_t _ddp_u_int64_t _DDP_ALIGN1;
typedef float _ddp_u_float _DDP_ALIGN1;
typedef double _ddp_u_double _DDP_ALIGN1;
#define _DDP_KERNEL_VARIANTS(name, attr, T, LOAD, STORE, expr)                                             \
    attr static void name##_ab(_ddp_u_##T *_DDP_RESTRICT d, const _ddp_u_##T *_DDP_RESTRICT a,             \
                          const _ddp_u_##T *_DDP_RESTRICT b, size_t n) {                                   \
        size_t i = 0, j;                                                                                   \
        for (; i + _DDP_KB <= n; i += _DDP_KB)                                                             \
            for (j = 0; j < _DDP_KB; j++) {                                                                \
                size_t k = i + j;                                                                          \
                LOAD(p, a[k]); LOAD(q, b[k]); d[k] = STORE(expr);                                          \
            }                                                                                              \
        for (; i < n; i++) { size_t k = i; LOAD(p, a[k]); LOAD(q, b[k]); d[k] = STORE(expr); }             \
    }                                                                                                      \
    attr static void name##_da(_ddp_u_##T *_DDP_RESTRICT d, const _ddp_u_##T *_DDP_RESTRICT b, size_t n) { \
        size_t i = 0, j;                                                                                   \
        for (; i + _DDP_KB <= n; i += _DDP_KB)                                                             \
            for (j = 0; j < _DDP_KB; j++) {                                                                \
                size_t k = i + j;                                                                          \
                LOAD(p, d[k]); LOAD(q, b[k]); d[k] = STORE(expr);                                          \
            }                                                                                              \
        for (; i < n; i++) { size_t k = i; LOAD(p, d[k]); LOAD(q, b[k]); d[k] = STORE(expr); }             \
    }                                                                                                      \
    attr static void name##_db(_ddp_u_##T *_DDP_RESTRICT d, const _ddp_u_##T *_DDP_RESTRICT a, size_t n) { \
        size_t i = 0, j;                                                                                   \
        for (; i + _DDP_KB <= n; i += _DDP_KB)                                                             \
            for (j = 0; j < _DDP_KB; j++) {                                                                \
                size_t k = i + j;                                                                          \
                LOAD(p, a[k]); LOAD(q, d[k]); d[k] = STORE(expr);                                          \
            }                                                                                              \
        for (; i < n; i++) { size_t k = i; LOAD(p, a[k]); LOAD(q, d[k]); d[k] = STORE(expr); }             \
    }                                                                                                      \
    attr static void name(void *d, const void *a, const void *b, size_t n) {                               \
        if (a == b) { /* both inputs the same buffer: no restrict version fits */                          \
            _ddp_u_##T *x = (_ddp_u_##T *)d;                                                               \
            const _ddp_u_##T *y = (const _ddp_u_##T *)a;                                                   \
            size_t i;                                                                                      \
            for (i = 0; i < n; i++) { LOAD(p, y[i]); LOAD(q, y[i]); x[i] = STORE(expr); }                  \
        } else if (d == a) name##_da((_ddp_u_##T *)d, (const _ddp_u_##T *)b, n);                           \
        else if (d == b) name##_db((_ddp_u_##T *)d, (const _ddp_u_##T *)a, n);                             \
        else name##_ab((_ddp_u_##T *)d, (const _ddp_u_##T *)a, (const _ddp_u_##T *)b, n);                  \
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
#define _DDP_KERNEL_F16C(name, vexpr, expr)                                                         \
    __attribute__((target("avx,f16c"))) static void name(void *dst_, const void *a_,                \
                                                         const void *b_, size_t n) {                \
        _ddp_u_uint16_t *d = (_ddp_u_uint16_t *)dst_;                                               \
        const _ddp_u_uint16_t *a = (const _ddp_u_uint16_t *)a_, *b = (const _ddp_u_uint16_t *)b_;   \
        size_t i = 0;                                                                               \
        for (; i + 8 <= n; i += 8) {                                                                \
            __m256 p = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(a + i)));    \
            __m256 q = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(b + i)));    \
            _mm_storeu_si128((__m128i *)(void *)(d + i),                                            \
                             _mm256_cvtps_ph(vexpr, _MM_FROUND_TO_NEAREST_INT));                    \
        }                                                                                           \
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
    case DDP_INT8: { _ddp_u_int8_t *v = (_ddp_u_int8_t *)x; for (i = 0; i < n; i++) v[i] = (int8_t)(v[i] / divisor); break; }
    case DDP_UINT8: { _ddp_u_uint8_t *v = (_ddp_u_uint8_t *)x; for (i = 0; i < n; i++) v[i] = (uint8_t)(v[i] / (unsigned)divisor); break; }
    case DDP_INT32: { _ddp_u_int32_t *v = (_ddp_u_int32_t *)x; for (i = 0; i < n; i++) v[i] = v[i] / divisor; break; }
    case DDP_UINT32: { _ddp_u_uint32_t *v = (_ddp_u_uint32_t *)x; for (i = 0; i < n; i++) v[i] = v[i] / (uint32_t)divisor; break; }
    case DDP_INT64: { _ddp_u_int64_t *v = (_ddp_u_int64_t *)x; for (i = 0; i < n; i++) v[i] = v[i] / divisor; break; }
    case DDP_UINT64: { _ddp_u_uint64_t *v = (_ddp_u_uint64_t *)x; for (i = 0; i < n; i++) v[i] = v[i] / (uint64_t)divisor; break; }
    case DDP_FLOAT32: { _ddp_u_float *v = (_ddp_u_float *)x; float d = (float)divisor; for (i = 0; i < n; i++) v[i] = v[i] / d; break; }
    case DDP_FLOAT64: { _ddp_u_double *v = (_ddp_u_double *)x; double d = (double)divisor; for (i = 0; i < n; i++) v[i] = v[i] / d; break; }
    case DDP_FLOAT16: { _ddp_u_uint16_t *v = (_ddp_u_uint16_t *)x; float d = (float)divisor; for (i = 0; i < n; i++) v[i] = _ddp_f2h(_ddp_h2f(v[i]) / d); break; }
    case DDP_BFLOAT16: { _ddp_u_uint16_t *v = (_ddp_u_uint16_t *)x; float d = (float)divisor; for (i = 0; i < n; i++) v[i] = _ddp_f2bf(_ddp_bf2f(v[i]) / d); break; }
    }
}

#endif /* DDP_KERNELS_IMPLEMENTATION */
