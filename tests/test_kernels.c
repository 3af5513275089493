/* SPDX-License-Identifier: MIT (see LICENSE) */
/* tests/test_kernels.c — ddp_ring.h's local kernels and fp16/bf16 conversions against scalar
 * references written here. Prints TAP.
 *
 *   build/test_kernels
 *
 * - fp16 -> fp32: all 65536 values, against a reference built from ldexp (and against GCC's
 *   _Float16 where the compiler has it); every non-NaN half survives fp16 -> fp32 -> fp16.
 * - fp32 -> fp16 (round to nearest, ties to even): for every half value x and its successor y:
 *   x, y's neighbours, the midpoint (a tie), the floats just around the midpoint and random
 *   floats in between; every fp32 NaN pattern (2^24); millions of random fp32 patterns; against
 *   a slow reference (exact arithmetic in double, nearbyint) and, when __FLT16_MAX__ is
 *   defined, against the compiler's own float -> _Float16 conversion, which also validates the
 *   slow reference.
 * - bf16 the same way (bf16 -> fp32 for all 65536; fp32 -> bf16 around every bf16 value, every
 *   NaN pattern stays NaN, overflow to inf, inf stays inf, ties to even).
 * - ddp_reduce_local: every dtype x op, lengths around the kernels' block size, dst apart /
 *   dst == a / dst == b, integer wrap-around, IEEE specials (inf, NaN, -0, subnormals), fp16 and
 *   bf16 computed in fp32 then rounded; the vector and scalar paths give the same bits (NaN
 *   payloads included), whatever the position of an element in the buffer.
 * - ddp_divide_local: every dtype, divisors 1..8 and 16: truncating integer division (negative
 *   values included), IEEE division, fp16/bf16 divided in fp32 then rounded.
 * - both at odd byte offsets (any dtype, dst apart / == a / == b, a == b): the aligned results,
 *   and no misaligned access for UBSan (build/san/test_kernels).
 * ddp_ring.h picks F16C / AVX2 kernels at run time when the CPU has them: the position test
 * compares those vector paths with the scalar tails (the diagnostics say which ones ran). */
#define _GNU_SOURCE
#include "ddp.h"
#include "transports/ddp_tcp.h"
#include "tests/ddp_test.h"

#include <float.h>
#include <math.h>
#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
#include <cpuid.h>
#endif

#if defined(__FLT16_MAX__)
#define HAVE_FLT16 1
__extension__ typedef _Float16 t_f16;
static uint16_t cc_f2h(float f) { t_f16 h = (t_f16)f; uint16_t u; memcpy(&u, &h, 2); return u; }
static float cc_h2f(uint16_t u) { t_f16 h; memcpy(&h, &u, 2); return (float)h; }
#endif

static uint32_t fbits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static float bitsf(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static uint64_t dbits(double d) { uint64_t u; memcpy(&u, &d, 8); return u; }
static double bitsd(uint64_t u) { double d; memcpy(&d, &u, 8); return d; }

static uint64_t rng_state = 0x1234567887654321ull;
static uint64_t rng(void) { rng_state += 0x9e3779b97f4a7c15ull; return t_mix64(rng_state); }

/* ------------------------------------------------------------------ reference conversions */
static int h_isnan(uint16_t h) { return (h & 0x7c00) == 0x7c00 && (h & 0x3ff); }
static int bf_isnan(uint16_t h) { return (h & 0x7f80) == 0x7f80 && (h & 0x7f); }

static float ref_h2f(uint16_t h) {
    int e = (h >> 10) & 31, m = h & 1023;
    double v;
    if (e == 31) v = m ? NAN : INFINITY;
    else if (e == 0) v = ldexp((double)m, -24);
    else v = ldexp((double)(1024 + m), e - 25);
    return (float)((h & 0x8000) ? -v : v);
}

static float ref_bf2f(uint16_t h) {
    int e = (h >> 7) & 255, m = h & 127;
    double v;
    if (e == 255) v = m ? NAN : INFINITY;
    else if (e == 0) v = ldexp((double)m, -133);
    else v = ldexp((double)(128 + m), e - 134);
    return (float)((h & 0x8000) ? -v : v);
}

/* Round |f| to a grid of (mant_bits + 1) significant bits with exponent >= emin, nearest-even:
 * exact in double (a float scaled by a power of two), nearbyint does the tie rule. */
static double ref_round(double a, int mant_bits, int emin) {
    int e = ilogb(a);
    double q;
    if (e < emin) e = emin;
    q = ldexp(1.0, e - mant_bits);
    return nearbyint(a / q) * q;
}

static uint16_t ref_f2h(float f) {
    uint16_t sign = (fbits(f) >> 16) & 0x8000;
    double a = fabs((double)f), v;
    int e;
    if (isnan(f)) return (uint16_t)(sign | 0x7e00);
    if (isinf(f)) return (uint16_t)(sign | 0x7c00);
    if (a == 0) return sign;
    v = ref_round(a, 10, -14);
    if (v >= 65536.0) return (uint16_t)(sign | 0x7c00);
    if (v < ldexp(1.0, -14)) return (uint16_t)(sign | (uint16_t)(v * ldexp(1.0, 24)));  /* subnormal (or 0) */
    e = ilogb(v);
    return (uint16_t)(sign | ((e + 15) << 10) | (uint16_t)(v * ldexp(1.0, 10 - e) - 1024));
}

static uint16_t ref_f2bf(float f) {
    uint16_t sign = (fbits(f) >> 16) & 0x8000;
    double a = fabs((double)f), v;
    if (isnan(f)) return (uint16_t)(sign | 0x7fc0);
    if (isinf(f)) return (uint16_t)(sign | 0x7f80);
    if (a == 0) return sign;
    v = ref_round(a, 7, -126);
    if (v >= ldexp(1.0, 128)) return (uint16_t)(sign | 0x7f80);
    return (uint16_t)(sign | (fbits((float)v) >> 16));    /* v has 8 significant bits: exact */
}

/* ------------------------------------------------------------------ conversions */
static void test_half_to_float(void) {
    int bad = 0, h;
#ifdef HAVE_FLT16
    int badcc = 0;
#endif
    for (h = 0; h < 65536; h++) {
        float got = ddp_half_to_float((uint16_t)h), want = ref_h2f((uint16_t)h);
        if (h_isnan((uint16_t)h)) {
            if (!isnan(got) || (fbits(got) >> 31) != (unsigned)(h >> 15)) { if (bad++ < 3) diag("half 0x%04x -> 0x%08x, want a NaN of the same sign", h, fbits(got)); }
        } else if (fbits(got) != fbits(want)) {
            if (bad++ < 3) diag("half 0x%04x -> 0x%08x, want 0x%08x", h, fbits(got), fbits(want));
        }
#ifdef HAVE_FLT16
        if (!h_isnan((uint16_t)h) && fbits(cc_h2f((uint16_t)h)) != fbits(want)) badcc++;
#endif
    }
    ok(bad == 0, "ddp_half_to_float: all 65536 halves exact (%d wrong)", bad);
#ifdef HAVE_FLT16
    ok(badcc == 0, "the test's own half reference agrees with _Float16 on all non-NaN halves (%d differ)", badcc);
#endif
}

static void test_half_round_trip(void) {
    int bad = 0, h;
    for (h = 0; h < 65536; h++) {
        uint16_t back = ddp_float_to_half(ddp_half_to_float((uint16_t)h));
        if (h_isnan((uint16_t)h) ? !(h_isnan(back) && (back & 0x8000) == (h & 0x8000)) : back != h)
            if (bad++ < 3) diag("half 0x%04x -> float -> 0x%04x", h, back);
    }
    ok(bad == 0, "fp16 -> fp32 -> fp16 gives back every half (NaNs stay NaN, sign kept) (%d wrong)", bad);
}

typedef struct { long n, bad, badcc, refbad; } conv_stats_t;

/* Checks one float through both conversions against the references. */
static void check_f2h(float f, conv_stats_t *s) {
    uint16_t got = ddp_float_to_half(f), want = ref_f2h(f);
    s->n++;
    if (isnan(f)) {
        if (!h_isnan(got) || (got & 0x8000) != (uint16_t)((fbits(f) >> 16) & 0x8000)) {
            if (s->bad++ < 3) diag("float 0x%08x (NaN) -> half 0x%04x: want a NaN of the same sign", fbits(f), got);
        }
        return;
    }
    if (got != want && s->bad++ < 3) diag("float 0x%08x (%.9g) -> half 0x%04x, want 0x%04x", fbits(f), f, got, want);
#ifdef HAVE_FLT16
    if (cc_f2h(f) != want && s->refbad++ < 3)
        diag("test reference bug: float 0x%08x -> ref 0x%04x, _Float16 0x%04x", fbits(f), want, cc_f2h(f));
#endif
}

static void check_f2bf(float f, conv_stats_t *s) {
    uint16_t got = ddp_float_to_bfloat16(f), want = ref_f2bf(f);
    s->n++;
    if (isnan(f)) {
        if (!bf_isnan(got) || (got & 0x8000) != (uint16_t)((fbits(f) >> 16) & 0x8000)) {
            if (s->bad++ < 3) diag("float 0x%08x (NaN) -> bf16 0x%04x: want a NaN of the same sign", fbits(f), got);
        }
        return;
    }
    if (got != want && s->bad++ < 3) diag("float 0x%08x (%.9g) -> bf16 0x%04x, want 0x%04x", fbits(f), f, got, want);
}

/* For every value x of a 16-bit format and its successor y: x, x's float neighbours, the tie
 * (x+y)/2 and the floats around it, and a few random floats strictly between. */
static void sweep_grid(float (*to_f)(uint16_t), int (*isnan16)(uint16_t), void (*check)(float, conv_stats_t *),
                       conv_stats_t *s) {
    int h, k;
    for (h = 0; h < 0x8000; h++) {
        float x, y, mid;
        int sgn;
        if (isnan16((uint16_t)h) || ((h & 0x7fff) == (isnan16 == h_isnan ? 0x7c00 : 0x7f80))) continue;
        x = to_f((uint16_t)h);
        y = to_f((uint16_t)(h + 1));   /* the successor (inf after the largest finite) */
        mid = isinf(y) ? x + (x - to_f((uint16_t)(h - 1))) / 2 : (x + y) / 2;   /* exact: 1 more bit */
        for (sgn = 0; sgn < 2; sgn++) {
            float m = sgn ? -1.0f : 1.0f;
            check(m * x, s);
            check(m * nextafterf(x, INFINITY), s);
            if (x > 0) check(m * nextafterf(x, 0), s);
            check(m * mid, s);
            check(m * nextafterf(mid, INFINITY), s);
            check(m * nextafterf(mid, 0), s);
            for (k = 0; k < 2; k++) {
                uint32_t lo = fbits(x), hi = fbits(isinf(y) ? 2 * mid - x : y);
                if (hi > lo + 1) check(m * bitsf(lo + 1 + (uint32_t)(rng() % (hi - lo - 1))), s);
            }
        }
    }
}

static void test_float_to_half(void) {
    conv_stats_t s;
    uint32_t m;
    long i;
    memset(&s, 0, sizeof s);
    sweep_grid(ddp_half_to_float, h_isnan, check_f2h, &s);
    ok(s.bad == 0, "ddp_float_to_half around every half value (ties, tie +- 1 ulp, between): %ld floats, %ld wrong", s.n, s.bad);
    memset(&s, 0, sizeof s);
    for (m = 1; m < (1u << 23); m++) {   /* every NaN, both signs */
        check_f2h(bitsf(0x7f800000u | m), &s);
        check_f2h(bitsf(0xff800000u | m), &s);
    }
    ok(s.bad == 0, "ddp_float_to_half: all %ld fp32 NaN patterns give a NaN of the same sign (%ld wrong)", s.n, s.bad);
    memset(&s, 0, sizeof s);
    for (i = 0; i < 4000000; i++) check_f2h(bitsf((uint32_t)rng()), &s);
    check_f2h(INFINITY, &s); check_f2h(-INFINITY, &s); check_f2h(0.0f, &s); check_f2h(-0.0f, &s);
    check_f2h(65504.0f, &s); check_f2h(65519.996f, &s); check_f2h(65520.0f, &s); check_f2h(FLT_MAX, &s);
    check_f2h(ldexpf(1, -24), &s); check_f2h(ldexpf(1, -25), &s); check_f2h(ldexpf(3, -26), &s);
    check_f2h(nextafterf(ldexpf(1, -25), 1), &s); check_f2h(bitsf(1u), &s);
    ok(s.bad == 0, "ddp_float_to_half on %ld random fp32 bit patterns and edge values (%ld wrong)", s.n, s.bad);
    {
        int spot = ddp_float_to_half(65520.0f) == 0x7c00 && ddp_float_to_half(65519.996f) == 0x7bff &&
                   ddp_float_to_half(1.0f + ldexpf(1, -11)) == 0x3c00 &&                  /* tie -> even (down) */
                   ddp_float_to_half(1.0f + 3 * ldexpf(1, -11)) == 0x3c02 &&              /* tie -> even (up) */
                   ddp_float_to_half(ldexpf(1, -25)) == 0x0000 &&                         /* subnormal tie -> 0 */
                   ddp_float_to_half(ldexpf(3, -25)) == 0x0002 &&                         /* subnormal tie -> even */
                   ddp_float_to_half(-INFINITY) == 0xfc00 && ddp_float_to_half(-0.0f) == 0x8000;
        ok(spot, "ddp_float_to_half spot values: 65520 -> inf, ties to even (normal and subnormal), -inf, -0");
    }
#ifdef HAVE_FLT16
    ok(s.refbad == 0, "the test's slow fp16 rounding reference agrees with the compiler's _Float16 conversion");
#else
    diag("no _Float16 in this compiler: fp16 rounding checked against the slow reference only");
#endif
}

static void test_bfloat16(void) {
    conv_stats_t s;
    int bad = 0, h;
    uint32_t m;
    long i;
    for (h = 0; h < 65536; h++) {
        float got = ddp_bfloat16_to_float((uint16_t)h), want = ref_bf2f((uint16_t)h);
        if (bf_isnan((uint16_t)h) ? !(isnan(got) && (fbits(got) >> 31) == (unsigned)(h >> 15)) : fbits(got) != fbits(want))
            if (bad++ < 3) diag("bf16 0x%04x -> 0x%08x, want 0x%08x", h, fbits(got), fbits(want));
    }
    ok(bad == 0, "ddp_bfloat16_to_float: all 65536 values exact (%d wrong)", bad);
    bad = 0;
    for (h = 0; h < 65536; h++) {
        uint16_t back = ddp_float_to_bfloat16(ddp_bfloat16_to_float((uint16_t)h));
        if (bf_isnan((uint16_t)h) ? !(bf_isnan(back) && (back & 0x8000) == (h & 0x8000)) : back != h)
            if (bad++ < 3) diag("bf16 0x%04x -> float -> 0x%04x", h, back);
    }
    ok(bad == 0, "bf16 -> fp32 -> bf16 gives back every value (NaNs stay NaN) (%d wrong)", bad);
    memset(&s, 0, sizeof s);
    sweep_grid(ddp_bfloat16_to_float, bf_isnan, check_f2bf, &s);
    ok(s.bad == 0, "ddp_float_to_bfloat16 around every bf16 value (ties, tie +- 1 ulp, between): %ld floats, %ld wrong", s.n, s.bad);
    memset(&s, 0, sizeof s);
    for (m = 1; m < (1u << 23); m++) {
        check_f2bf(bitsf(0x7f800000u | m), &s);
        check_f2bf(bitsf(0xff800000u | m), &s);
    }
    ok(s.bad == 0, "ddp_float_to_bfloat16: all %ld fp32 NaN patterns stay NaN, sign kept (%ld wrong)", s.n, s.bad);
    memset(&s, 0, sizeof s);
    for (i = 0; i < 4000000; i++) check_f2bf(bitsf((uint32_t)rng()), &s);
    ok(s.bad == 0, "ddp_float_to_bfloat16 on %ld random fp32 bit patterns (%ld wrong)", s.n, s.bad);
    ok(ddp_float_to_bfloat16(bitsf(0x3f808000u)) == 0x3f80 && ddp_float_to_bfloat16(bitsf(0x3f818000u)) == 0x3f82 &&
       ddp_float_to_bfloat16(bitsf(0x3f808001u)) == 0x3f81 && ddp_float_to_bfloat16(bitsf(0xbf818000u)) == 0xbf82,
       "bf16: ties go to even, just above a tie goes up, negative ties to even");
    ok(ddp_float_to_bfloat16(INFINITY) == 0x7f80 && ddp_float_to_bfloat16(-INFINITY) == 0xff80 &&
       ddp_float_to_bfloat16(FLT_MAX) == 0x7f80 && ddp_float_to_bfloat16(-FLT_MAX) == 0xff80 &&
       ddp_float_to_bfloat16(bitsf(0x7f7f7fffu)) == 0x7f7f,
       "bf16: inf stays inf, FLT_MAX rounds to inf, just below the tie stays finite");
    ok(bf_isnan(ddp_float_to_bfloat16(bitsf(0x7f800001u))) && bf_isnan(ddp_float_to_bfloat16(bitsf(0x7fffffffu))) &&
       bf_isnan(ddp_float_to_bfloat16(bitsf(0xffffffffu))) && (ddp_float_to_bfloat16(bitsf(0xffffffffu)) & 0x8000) &&
       bf_isnan(ddp_float_to_bfloat16(NAN)),
       "bf16: NaNs whose payload is only in the low bits, or all ones, stay NaN (no carry into inf or -0)");
    ok(ddp_float_to_bfloat16(0.0f) == 0 && ddp_float_to_bfloat16(-0.0f) == 0x8000 &&
       ddp_float_to_bfloat16(bitsf(1u)) == 0 && ddp_float_to_bfloat16(bitsf(0x00008000u)) == 0 &&
       ddp_float_to_bfloat16(bitsf(0x00018000u)) == 0x0002 && ddp_float_to_bfloat16(bitsf(0x00008001u)) == 0x0001,
       "bf16: zeros keep their sign; subnormal ties to even");
}

/* ------------------------------------------------------------------ kernels */
static const size_t lens[] = {0, 1, 2, 7, 15, 16, 17, 31, 32, 33, 63, 100, 1000};
#define NLENS (sizeof lens / sizeof lens[0])
#define KMAX 1000

/* Random element bits with plenty of special values for floating dtypes. */
static uint64_t rand_elem(int dt) {
    uint64_t u = rng();
    int pick = (int)(rng() % 16);
    switch (dt) {
    case DDP_FLOAT16: {
        static const uint16_t sp[] = {0x0000, 0x8000, 0x7c00, 0xfc00, 0x7e00, 0x7d01, 0x0001, 0x83ff, 0x7bff, 0xfbff, 0x3c00, 0x0400};
        if (pick < 4) return sp[rng() % (sizeof sp / sizeof sp[0])];
        if (pick < 10) return ddp_float_to_half((float)((double)((int64_t)u >> 40) * ldexp(1, -16)));   /* |x| < 128 */
        return u & 0xffff;
    }
    case DDP_BFLOAT16: {
        static const uint16_t sp[] = {0x0000, 0x8000, 0x7f80, 0xff80, 0x7fc0, 0x7f81, 0x0001, 0x807f, 0x7f7f, 0xff7f, 0x3f80};
        if (pick < 4) return sp[rng() % (sizeof sp / sizeof sp[0])];
        if (pick < 10) return ddp_float_to_bfloat16((float)((double)((int64_t)u >> 40) * ldexp(1, -16)));
        return u & 0xffff;
    }
    case DDP_FLOAT32: {
        static const uint32_t sp[] = {0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00000u, 0x7f800001u,
                                      0x00000001u, 0x807fffffu, 0x7f7fffffu, 0xff7fffffu, 0x3f800000u};
        if (pick < 4) return sp[rng() % (sizeof sp / sizeof sp[0])];
        if (pick < 10) return fbits((float)((double)(int64_t)u * ldexp(1, -50)));
        return u & 0xffffffffu;
    }
    case DDP_FLOAT64: {
        static const uint64_t sp[] = {0, 0x8000000000000000ull, 0x7ff0000000000000ull, 0xfff0000000000000ull,
                                      0x7ff8000000000000ull, 0x7ff0000000000001ull, 1, 0x800fffffffffffffull,
                                      0x7fefffffffffffffull, 0x3ff0000000000000ull};
        if (pick < 4) return sp[rng() % (sizeof sp / sizeof sp[0])];
        if (pick < 10) return dbits((double)(int64_t)u * ldexp(1, -50));
        return u;
    }
    default:
        return u;
    }
}

static int is_nan_bits(int dt, uint64_t b) {
    switch (dt) {
    case DDP_FLOAT16: return h_isnan((uint16_t)b);
    case DDP_BFLOAT16: return bf_isnan((uint16_t)b);
    case DDP_FLOAT32: return isnan(bitsf((uint32_t)b));
    case DDP_FLOAT64: return isnan(bitsd(b));
    default: return 0;
    }
}

static double as_double(int dt, uint64_t b) {
    switch (dt) {
    case DDP_FLOAT16: return ref_h2f((uint16_t)b);
    case DDP_BFLOAT16: return ref_bf2f((uint16_t)b);
    case DDP_FLOAT32: return bitsf((uint32_t)b);
    default: return bitsd(b);
    }
}


/* The reference of one element: 1 = exact bits in *out; 0 = "any NaN" (*out unused);
 * 2 = "either input" (max/min with NaN or with +0/-0, which the spec leaves open; a NaN input
 * may also come out as another NaN: fp16/bf16 go through fp32, which quiets signalling NaNs). */
static int ref_op(int dt, int op, uint64_t a, uint64_t b, uint64_t *out) {
    const uint64_t mask = ddp_dtype_size((ddp_dtype_t)dt) == 8 ? ~0ull : ((1ull << (8 * ddp_dtype_size((ddp_dtype_t)dt))) - 1);
    if (op == DDP_AVG) op = DDP_SUM;   /* the kernel sums; the division is ddp_divide_local's */
    if (dt <= DDP_UINT64) {
        int sgn = dt == DDP_INT8 || dt == DDP_INT32 || dt == DDP_INT64;
        uint64_t x = t_ext_int(dt, a), y = t_ext_int(dt, b), r;
        switch (op) {
        case DDP_SUM: r = x + y; break;
        case DDP_PROD: r = x * y; break;
        case DDP_MAX: r = (sgn ? (int64_t)x > (int64_t)y : x > y) ? x : y; break;
        default: r = (sgn ? (int64_t)x < (int64_t)y : x < y) ? x : y; break;
        }
        *out = r & mask;
        return 1;
    }
    if (op == DDP_MAX || op == DDP_MIN) {
        double x = as_double(dt, a), y = as_double(dt, b);
        if (is_nan_bits(dt, a) || is_nan_bits(dt, b) || (x == 0 && y == 0)) return 2;
        *out = (op == DDP_MAX ? x > y : x < y) ? a : b;   /* equal and non-zero: the same bits */
        return 1;
    }
    if (dt == DDP_FLOAT32) {
        float x = bitsf((uint32_t)a), y = bitsf((uint32_t)b), r = op == DDP_SUM ? x + y : x * y;
        if (isnan(r)) return 0;
        *out = fbits(r);
        return 1;
    }
    if (dt == DDP_FLOAT64) {
        double x = bitsd(a), y = bitsd(b), r = op == DDP_SUM ? x + y : x * y;
        if (isnan(r)) return 0;
        *out = dbits(r);
        return 1;
    }
    {   /* fp16 / bf16: in fp32, then round to nearest even */
        float x = dt == DDP_FLOAT16 ? ref_h2f((uint16_t)a) : ref_bf2f((uint16_t)a);
        float y = dt == DDP_FLOAT16 ? ref_h2f((uint16_t)b) : ref_bf2f((uint16_t)b);
        float r = op == DDP_SUM ? x + y : x * y;
        if (isnan(r)) return 0;
        *out = dt == DDP_FLOAT16 ? ref_f2h(r) : ref_f2bf(r);
        return 1;
    }
}

static uint64_t get_el(const unsigned char *buf, size_t i, size_t es) { uint64_t v = 0; memcpy(&v, buf + i * es, es); return v; }
static void put_el(unsigned char *buf, size_t i, size_t es, uint64_t v) { memcpy(buf + i * es, &v, es); }

static void test_reduce_local(void) {
    static unsigned char A[KMAX * 8], B[KMAX * 8], D[KMAX * 8 + 64], A0[KMAX * 8], B0[KMAX * 8];
    int dt, op;
    for (dt = 0; dt < DDP_NUM_DTYPES; dt++) {
        size_t es = ddp_dtype_size((ddp_dtype_t)dt);
        for (op = 0; op < DDP_NUM_OPS; op++) {
            long bad = 0, n_el = 0;
            size_t li, i;
            int mode, rep;
            char first[200] = "";
            for (rep = 0; rep < 4; rep++)
                for (li = 0; li < NLENS; li++)
                    for (mode = 0; mode < 3; mode++) {   /* dst apart, dst == a, dst == b */
                        size_t n = lens[li];
                        unsigned char *dst;
                        for (i = 0; i < n; i++) { put_el(A0, i, es, rand_elem(dt)); put_el(B0, i, es, rand_elem(dt)); }
                        memcpy(A, A0, n * es);
                        memcpy(B, B0, n * es);
                        memset(D, 0xee, sizeof D);
                        dst = mode == 0 ? D : mode == 1 ? A : B;
                        ddp_reduce_local(dst, A, B, n, (ddp_dtype_t)dt, (ddp_op_t)op);
                        if (mode == 0 && D[n * es] != 0xee) { if (!bad++) snprintf(first, sizeof first, "wrote past dst[%zu]", n); }
                        if (mode != 1 && memcmp(A, A0, n * es)) { if (!bad++) snprintf(first, sizeof first, "modified a (n %zu)", n); }
                        if (mode != 2 && memcmp(B, B0, n * es)) { if (!bad++) snprintf(first, sizeof first, "modified b (n %zu)", n); }
                        for (i = 0; i < n; i++) {
                            uint64_t a = get_el(A0, i, es), b = get_el(B0, i, es), got = get_el(dst, i, es), want = 0;
                            int kind = ref_op(dt, op, a, b, &want), good;
                            n_el++;
                            if (kind == 1) good = got == want;
                            else if (kind == 0) good = is_nan_bits(dt, got);
                            else good = got == a || got == b ||   /* a NaN may come out quieted */
                                        ((is_nan_bits(dt, a) || is_nan_bits(dt, b)) && is_nan_bits(dt, got));
                            if (!good && !bad++)
                                snprintf(first, sizeof first, "n %zu mode %d [%zu]: %llx op %llx = %llx, want %s%llx", n, mode, i,
                                         (unsigned long long)a, (unsigned long long)b, (unsigned long long)got,
                                         kind == 0 ? "NaN, e.g. " : kind == 2 ? "a or b, e.g. " : "", (unsigned long long)want);
                        }
                    }
            if (bad) diag("%s %s: %s", ddp_dtype_name((ddp_dtype_t)dt), ddp_op_name((ddp_op_t)op), first);
            ok(bad == 0, "ddp_reduce_local %s %s: %ld elements, dst apart/== a/== b, lengths 0..1000 (%ld wrong)",
               ddp_dtype_name((ddp_dtype_t)dt), ddp_op_name((ddp_op_t)op), n_el, bad);
        }
    }
}

/* Every element must get the same bits whether it sits in a full block (vector path) or is
 * reduced alone (scalar tail): otherwise results depend on where segments are cut. The one
 * exception IEEE allows: when both inputs are NaN, which payload survives is unspecified (it
 * follows the operand order the compiler chose), so any NaN is accepted there (and counted). */
static void test_reduce_position_independent(void) {
    enum { N = 4096 };
    static unsigned char A[N * 8], B[N * 8], D1[N * 8], D2[8];
    int dt, op;
    for (dt = 0; dt < DDP_NUM_DTYPES; dt++) {
        size_t es = ddp_dtype_size((ddp_dtype_t)dt), i;
        long bad = 0, two_nans = 0;
        for (op = 0; op < DDP_NUM_OPS; op++) {
            for (i = 0; i < N; i++) { put_el(A, i, es, rand_elem(dt)); put_el(B, i, es, rand_elem(dt)); }
            ddp_reduce_local(D1, A, B, N, (ddp_dtype_t)dt, (ddp_op_t)op);
            for (i = 0; i < N; i++) {
                uint64_t x = get_el(D1, i, es), y;
                ddp_reduce_local(D2, A + i * es, B + i * es, 1, (ddp_dtype_t)dt, (ddp_op_t)op);
                y = get_el(D2, 0, es);
                if (x == y) continue;
                if (is_nan_bits(dt, get_el(A, i, es)) && is_nan_bits(dt, get_el(B, i, es)) && is_nan_bits(dt, x) && is_nan_bits(dt, y)) {
                    two_nans++;
                    continue;
                }
                if (bad++ < 2)
                    diag("%s %s element %zu: 0x%llx op 0x%llx = 0x%llx in a block, 0x%llx alone", ddp_dtype_name((ddp_dtype_t)dt),
                         ddp_op_name((ddp_op_t)op), i, (unsigned long long)get_el(A, i, es), (unsigned long long)get_el(B, i, es),
                         (unsigned long long)x, (unsigned long long)y);
            }
        }
        if (two_nans) diag("%s: %ld NaN op NaN results kept another NaN payload in a block than alone (allowed)",
                           ddp_dtype_name((ddp_dtype_t)dt), two_nans);
        ok(bad == 0, "ddp_reduce_local %s: same bits in a block and alone, every op (%ld differ)", ddp_dtype_name((ddp_dtype_t)dt), bad);
    }
}

static void test_divide_local(void) {
    static const int divs[] = {1, 2, 3, 4, 5, 6, 7, 8, 16};
    static unsigned char X[KMAX * 8], X0[KMAX * 8];
    int dt;
    for (dt = 0; dt < DDP_NUM_DTYPES; dt++) {
        size_t es = ddp_dtype_size((ddp_dtype_t)dt), di, i, li;
        long bad = 0, n_el = 0;
        char first[200] = "";
        for (di = 0; di < sizeof divs / sizeof divs[0]; di++)
            for (li = 0; li < NLENS; li++) {
                size_t n = lens[li];
                int d = divs[di];
                for (i = 0; i < n; i++) put_el(X0, i, es, rand_elem(dt));
                memcpy(X, X0, n * es);
                ddp_divide_local(X, n, (ddp_dtype_t)dt, d);
                for (i = 0; i < n; i++) {
                    uint64_t a = get_el(X0, i, es), got = get_el(X, i, es), want;
                    int nan_ok = 0;
                    n_el++;
                    switch (dt) {
                    case DDP_INT8: want = (uint8_t)(int8_t)((int8_t)a / d); break;
                    case DDP_UINT8: want = (uint8_t)a / (unsigned)d; break;
                    case DDP_INT32: want = (uint32_t)((int32_t)(uint32_t)a / d); break;
                    case DDP_UINT32: want = (uint32_t)a / (uint32_t)d; break;
                    case DDP_INT64: want = (uint64_t)((int64_t)a / d); break;
                    case DDP_UINT64: want = a / (uint64_t)d; break;
                    case DDP_FLOAT32: { float r = bitsf((uint32_t)a) / (float)d; nan_ok = isnan(r); want = fbits(r); break; }
                    case DDP_FLOAT64: { double r = bitsd(a) / (double)d; nan_ok = isnan(r); want = dbits(r); break; }
                    case DDP_FLOAT16: { float r = ref_h2f((uint16_t)a) / (float)d; nan_ok = isnan(r); want = ref_f2h(r); break; }
                    default: { float r = ref_bf2f((uint16_t)a) / (float)d; nan_ok = isnan(r); want = ref_f2bf(r); break; }
                    }
                    if (nan_ok ? !is_nan_bits(dt, got) : got != want) {
                        if (!bad++) snprintf(first, sizeof first, "0x%llx / %d = 0x%llx, want 0x%llx", (unsigned long long)a, d,
                                             (unsigned long long)got, (unsigned long long)want);
                    }
                }
            }
        if (bad) diag("%s: %s", ddp_dtype_name((ddp_dtype_t)dt), first);
        ok(bad == 0, "ddp_divide_local %s: divisors 1..8,16, %ld elements (%ld wrong)", ddp_dtype_name((ddp_dtype_t)dt), n_el, bad);
    }
    {   /* truncation toward zero, spelled out */
        int8_t i8[4] = {-7, 7, -128, 127};
        int64_t i64[3] = {-7, INT64_MIN, -1};
        ddp_divide_local(i8, 4, DDP_INT8, 2);
        ddp_divide_local(i64, 3, DDP_INT64, 8);
        ok(i8[0] == -3 && i8[1] == 3 && i8[2] == -64 && i8[3] == 63 && i64[0] == 0 && i64[1] == INT64_MIN / 8 && i64[2] == 0,
           "ddp_divide_local truncates toward zero (-7/2 = -3, -7/8 = 0)");
    }
}

static void test_names_and_invalid(void) {
    int i, good = 1;
    unsigned char d[16], a[16], b[16];
    static const size_t sizes[DDP_NUM_DTYPES] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2};
    for (i = 0; i < DDP_NUM_DTYPES; i++) good &= ddp_dtype_size((ddp_dtype_t)i) == sizes[i];
    ok(good, "ddp_dtype_size of every dtype");
    ok(ddp_dtype_size((ddp_dtype_t)DDP_NUM_DTYPES) == 0 && ddp_dtype_size((ddp_dtype_t)-1) == 0, "ddp_dtype_size of an invalid dtype is 0");
    good = 1;
    for (i = -1; i <= DDP_NUM_DTYPES; i++) good &= ddp_dtype_name((ddp_dtype_t)i) != NULL && ddp_dtype_name((ddp_dtype_t)i)[0];
    for (i = -1; i <= DDP_NUM_OPS; i++) good &= ddp_op_name((ddp_op_t)i) != NULL && ddp_op_name((ddp_op_t)i)[0];
    ok(good && !strcmp(ddp_dtype_name(DDP_BFLOAT16), "bfloat16") && !strcmp(ddp_op_name(DDP_AVG), "avg"),
       "ddp_dtype_name / ddp_op_name never NULL, also for invalid values");
    good = 1;
    for (i = 0; i < DDP_NUM_RESULTS + 2; i++) good &= ddp_strerror((ddp_result_t)i) != NULL && ddp_strerror((ddp_result_t)i)[0];
    good &= ddp_strerror((ddp_result_t)-1) != NULL;
    ok(good && !strcmp(ddp_strerror(DDP_SUCCESS), "success"), "ddp_strerror never NULL, also for unknown codes");
    ok(DDP_INT8 == 0 && DDP_UINT8 == 1 && DDP_INT32 == 2 && DDP_UINT32 == 3 && DDP_INT64 == 4 && DDP_UINT64 == 5 &&
       DDP_FLOAT16 == 6 && DDP_FLOAT32 == 7 && DDP_FLOAT64 == 8 && DDP_BFLOAT16 == 9 && DDP_SUM == 0 && DDP_PROD == 1 &&
       DDP_MAX == 2 && DDP_MIN == 3 && DDP_AVG == 4, "dtype and op values are NCCL's");
    memset(d, 0x77, sizeof d); memset(a, 1, sizeof a); memset(b, 2, sizeof b);
    ddp_reduce_local(d, a, b, 4, (ddp_dtype_t)DDP_NUM_DTYPES, DDP_SUM);
    ddp_reduce_local(d, a, b, 4, DDP_INT32, (ddp_op_t)DDP_NUM_OPS);
    ddp_reduce_local(d, a, b, 4, (ddp_dtype_t)-1, DDP_SUM);
    ddp_divide_local(d, 4, (ddp_dtype_t)DDP_NUM_DTYPES, 2);
    for (i = 0, good = 1; i < 16; i++) good &= d[i] == 0x77;
    ok(good, "ddp_reduce_local / ddp_divide_local with an invalid dtype or op leave dst alone");
}

/* Buffers need no alignment (a user's, or a segment of one, may start at any byte): the kernels
 * at odd byte offsets must give the aligned kernels' bits, and the san build (UBSan's alignment
 * check, fatal there) must find no misaligned load or store. */
static void test_odd_offsets(void) {
    enum { N = 100 };
    static uint64_t abuf[N + 2], bbuf[N + 2], dbuf[N + 2], ref[N + 2], xa[N + 2], xb[N + 2];
    static const size_t offs[] = {1, 3};
    int dt, op;
    for (dt = 0; dt < DDP_NUM_DTYPES; dt++) {
        size_t es = ddp_dtype_size((ddp_dtype_t)dt), oi, i;
        long bad = 0;
        for (op = 0; op < DDP_NUM_OPS; op++)
            for (oi = 0; oi < 2; oi++) {
                unsigned char *a = (unsigned char *)abuf + offs[oi], *b = (unsigned char *)bbuf + offs[oi] + 1;
                unsigned char *d = (unsigned char *)dbuf + offs[oi] + 2;
                int mode;
                for (i = 0; i < N; i++) { put_el((unsigned char *)xa, i, es, rand_elem(dt)); put_el((unsigned char *)xb, i, es, rand_elem(dt)); }
                ddp_reduce_local(ref, xa, xb, N, (ddp_dtype_t)dt, (ddp_op_t)op);   /* aligned */
                for (mode = 0; mode < 4; mode++) {   /* dst apart, dst == a, dst == b, a == b */
                    unsigned char *dst = mode == 1 ? a : mode == 2 ? b : d;
                    memcpy(a, xa, N * es);
                    memcpy(b, mode == 3 ? xa : xb, N * es);
                    ddp_reduce_local(dst, a, mode == 3 ? a : b, N, (ddp_dtype_t)dt, (ddp_op_t)op);
                    if (mode == 3) {
                        ddp_reduce_local(xb, xa, xa, N, (ddp_dtype_t)dt, (ddp_op_t)op);
                        bad += memcmp(dst, xb, N * es) != 0;
                        for (i = 0; i < N; i++) put_el((unsigned char *)xb, i, es, rand_elem(dt));
                    } else {
                        bad += memcmp(dst, ref, N * es) != 0;
                    }
                }
                memcpy(a, xa, N * es);
                memcpy(ref, xa, N * es);
                ddp_divide_local(a, N, (ddp_dtype_t)dt, 3);
                ddp_divide_local(ref, N, (ddp_dtype_t)dt, 3);
                bad += memcmp(a, ref, N * es) != 0;
            }
        ok(bad == 0, "ddp_reduce_local / ddp_divide_local %s at odd byte offsets: the aligned results (%ld differ)",
           ddp_dtype_name((ddp_dtype_t)dt), bad);
    }
}

int main(void) {
    double t0;
    t_init();
    t0 = t_now();
#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
    {
        unsigned a = 0, b = 0, c = 0, d = 0, f16c = 0, avx2 = 0;
        if (__get_cpuid(1, &a, &b, &c, &d)) f16c = (c >> 29) & 1;
        if (__get_cpuid_count(7, 0, &a, &b, &c, &d)) avx2 = (b >> 5) & 1;
        diag("this CPU: F16C %s, AVX2 %s (ddp_ring.h uses them for fp16 / bf16 kernels when present)",
             f16c ? "yes" : "no", avx2 ? "yes" : "no");
    }
#endif
    test_names_and_invalid();
    test_half_to_float();
    test_half_round_trip();
    test_float_to_half();
    test_bfloat16();
    test_reduce_local();
    test_reduce_position_independent();
    test_divide_local();
    test_odd_offsets();
    diag("%.1f s", t_now() - t0);
    return t_done();
}
