/* SPDX-License-Identifier: MIT (see LICENSE) */
/* tests/ddp_test_data.h — inputs whose reductions are exact in any order, shared by the
 * collective suites (test_collectives.c, test_rooted_collectives.c). Include after tests/ddp_test.h.
 *
 * t_exact_bits(dtype, op, u) turns 64 random bits into an element such that p <= 8 of them
 * reduce to the same bits whatever the order: integers wrap (SUM/PROD use full-range values,
 * exact modulo 2^n) except for AVG (small values: the sum must not wrap before the division);
 * floating SUM/AVG use grids on which every partial sum is exact (fp16/bf16: integers in
 * [-16, 15]); PROD uses +-{0.5, 1, 2}; MAX/MIN use random bit patterns (subnormals and
 * infinities included; no NaN and no zero, whose -0/+0 order would make max/min
 * order-dependent). t_uniform_bits(dtype, op, u) gives uniform floats instead, whose reductions
 * round (the "random" cases).
 *
 * t_in_t does the same for a whole range of elements at once: a case's input generator is prepared
 * once (t_in_init), with loops specialised per kind of element, so that generating every rank's
 * input for a reference costs little more than the random numbers; t_in_ref_exact and
 * t_in_ref_sums compute the sequential reference of a range from it, and t_in_first_diff compares
 * a copy. They give the bits of the element-wise definitions (t_case_rnd with t_exact_bits or
 * t_uniform_bits; t_ref_exact_one), which t_in_selftest() checks: each suite runs it first. */
#ifndef DDP_TEST_DATA_H
#define DDP_TEST_DATA_H

#include <math.h>

/* Unit roundoff of a floating dtype (2^-p, p its significand bits with the hidden one): the
 * random-data cases' tolerance is a multiple of it. */
static T_UNUSED double t_unit_roundoff(int dt) {
    return dt == DDP_FLOAT16 ? 1.0 / 2048 : dt == DDP_BFLOAT16 ? 1.0 / 256 : dt == DDP_FLOAT32 ? 1.0 / 16777216
         : 1.0 / 9007199254740992.0;
}
static T_UNUSED int t_is_int(int dt) { return dt <= DDP_UINT64; }
static T_UNUSED int t_is_signed_int(int dt) { return dt == DDP_INT8 || dt == DDP_INT32 || dt == DDP_INT64; }
static inline uint64_t t_f32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline uint64_t t_f64_bits(double d) { uint64_t u; memcpy(&u, &d, 8); return u; }

static inline uint64_t t_enc_float(int dt, double v) {
    switch (dt) {
    case DDP_FLOAT16: return ddp_float_to_half((float)v);
    case DDP_BFLOAT16: return ddp_float_to_bfloat16((float)v);
    case DDP_FLOAT32: return t_f32_bits((float)v);
    default: return t_f64_bits(v);
    }
}

static inline double t_dec_float(int dt, uint64_t b) {
    switch (dt) {
    case DDP_FLOAT16: return ddp_half_to_float((uint16_t)b);
    case DDP_BFLOAT16: return ddp_bfloat16_to_float((uint16_t)b);
    case DDP_FLOAT32: { uint32_t u = (uint32_t)b; float f; memcpy(&f, &u, 4); return f; }
    default: { double d; memcpy(&d, &b, 8); return d; }
    }
}

/* A random non-NaN, non-zero bit pattern of a floating dtype. */
static inline uint64_t t_rand_float_bits(int dt, uint64_t u) {
    uint64_t b, sign, inf;
    switch (dt) {
    case DDP_FLOAT16: b = u & 0xffff; sign = 0x8000; inf = 0x7c00; break;
    case DDP_BFLOAT16: b = u & 0xffff; sign = 0x8000; inf = 0x7f80; break;
    case DDP_FLOAT32: b = u & 0xffffffffu; sign = 0x80000000u; inf = 0x7f800000u; break;
    default: b = u; sign = 0x8000000000000000ull; inf = 0x7ff0000000000000ull; break;
    }
    if ((b & ~sign) > inf) b = (b & sign) | inf;
    if (!(b & ~sign)) b |= 1;
    return b;
}

/* Element bits (low dtype-size bytes) for an order-independent reduction; see the top. */
static inline uint64_t t_exact_bits(int dt, int op, uint64_t u) {
    if (t_is_int(dt)) {
        if (op != DDP_AVG) return u;                      /* wraps exactly, in any order */
        /* AVG: the sum of 8 must not wrap. Top bits of u, no division: this runs a lot. */
        switch (dt) {
        case DDP_INT8: return (uint64_t)((int64_t)(u >> 59) - 16);           /* [-16, 15] */
        case DDP_UINT8: return u >> 59;                                      /* [0, 31] */
        case DDP_INT32: return (uint64_t)((int64_t)(u >> 43) - (1 << 20));
        case DDP_UINT32: return u >> 43;
        case DDP_INT64: return (uint64_t)((int64_t)(u >> 23) - ((int64_t)1 << 40));
        default: return u >> 23;
        }
    }
    switch (op) {
    case DDP_SUM: case DDP_AVG:
        /* Grids on which every partial sum of 8 values is exact. */
        if (dt == DDP_FLOAT16 || dt == DDP_BFLOAT16) return t_enc_float(dt, (double)((int64_t)(u >> 59) - 16));
        if (dt == DDP_FLOAT32) return t_enc_float(dt, (double)((int64_t)(u >> 43) - (1 << 20)) * (1.0 / 1024));
        return t_enc_float(dt, (double)((int64_t)(u >> 23) - ((int64_t)1 << 40)) * (1.0 / 1048576));
    case DDP_PROD: {
        static const double vals[8] = {0.5, 1.0, 2.0, -0.5, -1.0, -2.0, 1.0, -1.0};
        return t_enc_float(dt, vals[u >> 61]);
    }
    default:
        return t_rand_float_bits(dt, u);
    }
}

/* 64 random bits for element i of rank's input in a case with this seed. */
static inline uint64_t t_case_rnd(uint64_t seed, int rank, size_t i) {
    return t_mix64(seed ^ ((uint64_t)(rank + 1) << 52) ^ ((uint64_t)i * 0x9e3779b97f4a7c15ull));
}

/* Uniform random floats, where the reduction order shows in the rounding: magnitudes in
 * [0.5, 2) for PROD (no overflow or underflow), [0.001, 1) otherwise, random signs. */
static inline uint64_t t_uniform_bits(int dt, int op, uint64_t u) {
    double frac = (double)(u >> 11) * (1.0 / 9007199254740992.0), sign = (u & 1) ? -1.0 : 1.0;
    return t_enc_float(dt, sign * (op == DDP_PROD ? 0.5 + 1.5 * frac : 0.001 + 0.999 * frac));
}

/* What an input element is: any bits (copies), t_exact_bits (exact reductions), t_uniform_bits. */
enum { T_IN_BITS, T_IN_EXACT, T_IN_UNIFORM };

static inline uint64_t t_in_bits_one(int how, int dt, int op, uint64_t u) {
    return how == T_IN_BITS ? u : how == T_IN_EXACT ? t_exact_bits(dt, op, u) : t_uniform_bits(dt, op, u);
}

/* The sequential reference, element by element (the definition t_in_ref_exact follows): element
 * gi reduced over ranks 0..p-1 in rank order, exactly; for AVG the exact sum divided once
 * (truncating for integers, IEEE for fp32/fp64, fp32 then round-to-nearest-even for fp16/bf16).
 * The result's low dtype-size bytes are what counts. */
static T_UNUSED uint64_t t_ref_exact_one(int how, int dt, int op, uint64_t seed, int p, size_t gi) {
    int r;
    if (t_is_int(dt)) {
        uint64_t acc = t_ext_int(dt, t_in_bits_one(how, dt, op, t_case_rnd(seed, 0, gi)));
        for (r = 1; r < p; r++) {
            uint64_t v = t_ext_int(dt, t_in_bits_one(how, dt, op, t_case_rnd(seed, r, gi)));
            switch (op) {
            case DDP_SUM: case DDP_AVG: acc += v; break;
            case DDP_PROD: acc *= v; break;
            case DDP_MAX: if (t_is_signed_int(dt) ? (int64_t)v > (int64_t)acc : v > acc) acc = v; break;
            default: if (t_is_signed_int(dt) ? (int64_t)v < (int64_t)acc : v < acc) acc = v; break;
            }
        }
        if (op == DDP_AVG) {
            acc = t_ext_int(dt, acc);   /* the sum as the dtype holds it */
            acc = t_is_signed_int(dt) ? (uint64_t)((int64_t)acc / p) : acc / (uint64_t)p;
        }
        return acc;
    } else {
        uint64_t b0 = t_in_bits_one(how, dt, op, t_case_rnd(seed, 0, gi)), win = b0;
        double acc = t_dec_float(dt, b0), best = acc;
        for (r = 1; r < p; r++) {
            uint64_t b = t_in_bits_one(how, dt, op, t_case_rnd(seed, r, gi));
            double v = t_dec_float(dt, b);
            switch (op) {
            case DDP_SUM: case DDP_AVG: acc += v; break;
            case DDP_PROD: acc *= v; break;
            case DDP_MAX: if (v > best) { best = v; win = b; } break;
            default: if (v < best) { best = v; win = b; } break;
            }
        }
        if (op == DDP_MAX || op == DDP_MIN) return win;
        if (op == DDP_AVG) {
            float q;
            if (dt == DDP_FLOAT64) return t_f64_bits(acc / (double)p);
            q = (float)acc / (float)p;
            if (dt == DDP_FLOAT32) return t_f32_bits(q);
            return dt == DDP_FLOAT16 ? ddp_float_to_half(q) : ddp_float_to_bfloat16(q);
        }
        return t_enc_float(dt, acc);
    }
}

/* ---------------------------------------------------------------- whole ranges at once */
#define T_IN_BLOCK 1024   /* elements per step of the references (their arrays are on the stack) */

/* The loop each kind of element gets (t_in_fill). */
enum { T_IN_SHIFT, T_IN_TABLE, T_IN_F32_GRID, T_IN_F64_GRID, T_IN_RAND_FLOAT, T_IN_UNIFORM_FLOAT };

typedef struct {
    uint64_t seed;
    int how, dt, op;
    size_t es;
    int loop, shift;
    uint64_t off, sign, inf, mask;   /* T_IN_SHIFT: (u >> shift) - off; T_IN_RAND_FLOAT: the dtype's bits */
    uint64_t table[32];              /* T_IN_TABLE: table[u >> shift] */
} t_in_t;

static T_UNUSED void t_in_init(t_in_t *g, int how, int dt, int op, uint64_t seed) {
    int j;
    memset(g, 0, sizeof *g);
    g->seed = seed; g->how = how; g->dt = dt; g->op = op;
    g->es = ddp_dtype_size((ddp_dtype_t)dt);
    g->loop = T_IN_SHIFT;
    if (how == T_IN_UNIFORM) { g->loop = T_IN_UNIFORM_FLOAT; return; }
    if (how == T_IN_BITS || (t_is_int(dt) && op != DDP_AVG)) return;   /* the raw bits */
    if (t_is_int(dt)) {   /* AVG: t_exact_bits' top bits, less an offset for the signed types */
        static const int shifts[6] = {59, 59, 43, 43, 23, 23};
        g->shift = shifts[dt];
        g->off = t_is_signed_int(dt) ? (uint64_t)1 << (64 - g->shift - 1) : 0;
        return;
    }
    if (op == DDP_SUM || op == DDP_AVG) {
        if (dt == DDP_FLOAT32) { g->loop = T_IN_F32_GRID; return; }
        if (dt == DDP_FLOAT64) { g->loop = T_IN_F64_GRID; return; }
        g->loop = T_IN_TABLE; g->shift = 59;   /* fp16/bf16: the integers -16..15 */
    } else if (op == DDP_PROD) {
        g->loop = T_IN_TABLE; g->shift = 61;   /* +-{0.5, 1, 2} */
    } else {
        g->loop = T_IN_RAND_FLOAT;
        g->mask = g->es == 8 ? ~0ull : (1ull << (8 * g->es)) - 1;
        g->sign = 1ull << (8 * g->es - 1);
        g->inf = t_rand_float_bits(dt, ~0ull) & ~g->sign;   /* all ones -> the infinity */
        return;
    }
    for (j = 0; j < (1 << (64 - g->shift)); j++) g->table[j] = t_exact_bits(dt, op, (uint64_t)j << g->shift);
}

static inline uint64_t t_in_rand_float(const t_in_t *g, uint64_t u) {
    uint64_t b = u & g->mask;
    if ((b & ~g->sign) > g->inf) b = (b & g->sign) | g->inf;
    if (!(b & ~g->sign)) b |= 1;
    return b;
}

/* ddp_float_to_half's and ddp_float_to_bfloat16's bits, inline: the same integer rounding for
 * normal halves (every uniform input is one) and non-NaN floats; the library's call otherwise. */
static inline uint16_t t_in_f2h(float f) {
    uint32_t x, a;
    memcpy(&x, &f, 4);
    a = x & 0x7fffffffu;
    if (a - 0x38800000u < 0x477ff000u - 0x38800000u)   /* [2^-14, 65520): rebias, round half to even */
        return (uint16_t)(((x >> 16) & 0x8000u) | ((a + 0xc8000fffu + ((a >> 13) & 1u)) >> 13));
    return ddp_float_to_half(f);
}
static inline uint16_t t_in_f2bf(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7fffffffu) > 0x7f800000u) return ddp_float_to_bfloat16(f);
    return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

/* t_uniform_bits' value without a branch on the sign (sign * mag is mag with the sign bit set). */
static inline double t_in_uniform(int op, uint64_t u) {
    double frac = (double)(int64_t)(u >> 11) * (1.0 / 9007199254740992.0);
    double v = op == DDP_PROD ? 0.5 + 1.5 * frac : 0.001 + 0.999 * frac;
    uint64_t b = t_f64_bits(v) ^ (u << 63);
    memcpy(&v, &b, 8);
    return v;
}

/* Rank's input elements lo..lo+n-1 into buf (dtype-size elements, little-endian). */
static T_UNUSED void t_in_fill(const t_in_t *g, int rank, size_t lo, size_t n, void *buf) {
    unsigned char *b = (unsigned char *)buf;
    const uint64_t x0 = g->seed ^ ((uint64_t)(rank + 1) << 52);   /* t_case_rnd, the rank part hoisted */
    const int op = g->op, sh = g->shift;
    const uint64_t off = g->off;
    size_t i;
#define T_IN_LOOP(T, EXPR) \
    for (i = 0; i < n; i++) { \
        const uint64_t u = t_mix64(x0 ^ ((uint64_t)(lo + i) * 0x9e3779b97f4a7c15ull)); \
        const T v_ = (T)(EXPR); \
        memcpy(b + i * sizeof(T), &v_, sizeof(T)); \
    }
#define T_IN_LOOP_ES(EXPR) \
    switch (g->es) { \
    case 1: T_IN_LOOP(uint8_t, EXPR) break; \
    case 2: T_IN_LOOP(uint16_t, EXPR) break; \
    case 4: T_IN_LOOP(uint32_t, EXPR) break; \
    default: T_IN_LOOP(uint64_t, EXPR) break; \
    }
    (void)op;
    switch (g->loop) {
    case T_IN_SHIFT: if (!sh) { T_IN_LOOP_ES(u) } else { T_IN_LOOP_ES((u >> sh) - off) } break;
    case T_IN_TABLE: T_IN_LOOP_ES(g->table[u >> sh]) break;
    case T_IN_F32_GRID: T_IN_LOOP(uint32_t, t_f32_bits((float)((double)((int64_t)(u >> 43) - (1 << 20)) * (1.0 / 1024)))) break;
    case T_IN_F64_GRID: T_IN_LOOP(uint64_t, t_f64_bits((double)((int64_t)(u >> 23) - ((int64_t)1 << 40)) * (1.0 / 1048576))) break;
    case T_IN_RAND_FLOAT: T_IN_LOOP_ES(t_in_rand_float(g, u)) break;
    default:
        switch (g->dt) {
        case DDP_FLOAT16: T_IN_LOOP(uint16_t, t_in_f2h((float)t_in_uniform(op, u))) break;
        case DDP_BFLOAT16: T_IN_LOOP(uint16_t, t_in_f2bf((float)t_in_uniform(op, u))) break;
        case DDP_FLOAT32: T_IN_LOOP(uint32_t, t_f32_bits((float)t_in_uniform(op, u))) break;
        default: T_IN_LOOP(uint64_t, t_f64_bits(t_in_uniform(op, u))) break;
        }
    }
#undef T_IN_LOOP_ES
#undef T_IN_LOOP
}

/* fp16 -> float for every pattern: ddp_half_to_float's values, built on first use (by
 * t_in_selftest() in a suite's main, before any thread). */
static float t_in_half_table[65536];
static int t_in_half_ready;
static T_UNUSED void t_in_half_init(void) {
    int i;
    if (t_in_half_ready) return;
    for (i = 0; i < 65536; i++) t_in_half_table[i] = ddp_half_to_float((uint16_t)i);
    t_in_half_ready = 1;
}

/* m elements of dtype dt at b, widened: integers sign- or zero-extended (t_ext_int) ... */
static T_UNUSED void t_in_widen_int(int dt, const unsigned char *b, size_t m, uint64_t *v) {
    size_t j;
    switch (dt) {
    case DDP_INT8: for (j = 0; j < m; j++) v[j] = (uint64_t)(int64_t)(int8_t)b[j]; break;
    case DDP_UINT8: for (j = 0; j < m; j++) v[j] = b[j]; break;
    case DDP_INT32: for (j = 0; j < m; j++) { int32_t x; memcpy(&x, b + 4 * j, 4); v[j] = (uint64_t)(int64_t)x; } break;
    case DDP_UINT32: for (j = 0; j < m; j++) { uint32_t x; memcpy(&x, b + 4 * j, 4); v[j] = x; } break;
    default: memcpy(v, b, 8 * m); break;
    }
}

/* ... floats decoded to double (t_dec_float) ... */
static T_UNUSED void t_in_decode(int dt, const unsigned char *b, size_t m, double *v) {
    size_t j;
    switch (dt) {
    case DDP_FLOAT16:
        t_in_half_init();
        for (j = 0; j < m; j++) { uint16_t h; memcpy(&h, b + 2 * j, 2); v[j] = t_in_half_table[h]; }
        break;
    case DDP_BFLOAT16:
        for (j = 0; j < m; j++) { uint16_t h; uint32_t x; float f; memcpy(&h, b + 2 * j, 2); x = (uint32_t)h << 16; memcpy(&f, &x, 4); v[j] = f; }
        break;
    case DDP_FLOAT32: for (j = 0; j < m; j++) { float f; memcpy(&f, b + 4 * j, 4); v[j] = f; } break;
    default: memcpy(v, b, 8 * m); break;
    }
}

/* ... and raw bits, zero-extended. */
static T_UNUSED void t_in_widen_bits(size_t es, const unsigned char *b, size_t m, uint64_t *v) {
    size_t j;
    switch (es) {
    case 1: for (j = 0; j < m; j++) v[j] = b[j]; break;
    case 2: for (j = 0; j < m; j++) { uint16_t x; memcpy(&x, b + 2 * j, 2); v[j] = x; } break;
    case 4: for (j = 0; j < m; j++) { uint32_t x; memcpy(&x, b + 4 * j, 4); v[j] = x; } break;
    default: memcpy(v, b, 8 * m); break;
    }
}

/* The low es bytes of m values, packed (the inverse of t_in_widen_bits). */
static T_UNUSED void t_in_narrow(size_t es, const uint64_t *v, size_t m, unsigned char *b) {
    size_t j;
    switch (es) {
    case 1: for (j = 0; j < m; j++) b[j] = (unsigned char)v[j]; break;
    case 2: for (j = 0; j < m; j++) { uint16_t x = (uint16_t)v[j]; memcpy(b + 2 * j, &x, 2); } break;
    case 4: for (j = 0; j < m; j++) { uint32_t x = (uint32_t)v[j]; memcpy(b + 4 * j, &x, 4); } break;
    default: memcpy(b, v, 8 * m); break;
    }
}

/* ref[j] = t_ref_exact_one(...) of element lo + j, j < m <= T_IN_BLOCK: the same reduction, in the
 * same order, one rank's range at a time. */
static T_UNUSED void t_in_ref_exact(const t_in_t *g, int p, size_t lo, size_t m, uint64_t *ref) {
    unsigned char raw[T_IN_BLOCK * 8];
    const int dt = g->dt, op = g->op;
    size_t j;
    int r;
    if (m > T_IN_BLOCK) t_bail("t_in_ref_exact: %zu elements at once", m);
    if (t_is_int(dt)) {
        uint64_t v[T_IN_BLOCK];
        const int sgn = t_is_signed_int(dt);
        t_in_fill(g, 0, lo, m, raw);
        t_in_widen_int(dt, raw, m, ref);
        for (r = 1; r < p; r++) {
            t_in_fill(g, r, lo, m, raw);
            t_in_widen_int(dt, raw, m, v);
            switch (op) {
            case DDP_SUM: case DDP_AVG: for (j = 0; j < m; j++) ref[j] += v[j]; break;
            case DDP_PROD: for (j = 0; j < m; j++) ref[j] *= v[j]; break;
            /* max/min as selects, not branches: the inputs are random */
            case DDP_MAX:
                if (sgn) { for (j = 0; j < m; j++) ref[j] = (int64_t)v[j] > (int64_t)ref[j] ? v[j] : ref[j]; }
                else for (j = 0; j < m; j++) ref[j] = v[j] > ref[j] ? v[j] : ref[j];
                break;
            default:
                if (sgn) { for (j = 0; j < m; j++) ref[j] = (int64_t)v[j] < (int64_t)ref[j] ? v[j] : ref[j]; }
                else for (j = 0; j < m; j++) ref[j] = v[j] < ref[j] ? v[j] : ref[j];
                break;
            }
        }
        if (op == DDP_AVG)
            for (j = 0; j < m; j++) {
                uint64_t a = t_ext_int(dt, ref[j]);   /* the sum as the dtype holds it */
                ref[j] = sgn ? (uint64_t)((int64_t)a / p) : a / (uint64_t)p;
            }
    } else {
        double acc[T_IN_BLOCK], v[T_IN_BLOCK];
        uint64_t bits[T_IN_BLOCK];
        const int pick = op == DDP_MAX || op == DDP_MIN;
        t_in_fill(g, 0, lo, m, raw);
        t_in_decode(dt, raw, m, acc);
        if (pick) t_in_widen_bits(g->es, raw, m, ref);   /* the winner so far */
        for (r = 1; r < p; r++) {
            t_in_fill(g, r, lo, m, raw);
            t_in_decode(dt, raw, m, v);
            switch (op) {
            case DDP_SUM: case DDP_AVG: for (j = 0; j < m; j++) acc[j] += v[j]; break;
            case DDP_PROD: for (j = 0; j < m; j++) acc[j] *= v[j]; break;
            default:   /* MAX, MIN: the first of the largest (smallest) wins; selects, not branches */
                t_in_widen_bits(g->es, raw, m, bits);
                for (j = 0; j < m; j++) {
                    const uint64_t take = 0 - (uint64_t)(op == DDP_MAX ? v[j] > acc[j] : v[j] < acc[j]);
                    uint64_t a, b;
                    memcpy(&a, &acc[j], 8);
                    memcpy(&b, &v[j], 8);
                    a = (b & take) | (a & ~take);
                    memcpy(&acc[j], &a, 8);
                    ref[j] = (bits[j] & take) | (ref[j] & ~take);
                }
                break;
            }
        }
        if (pick) return;
        if (op == DDP_AVG) {
            switch (dt) {
            case DDP_FLOAT64: for (j = 0; j < m; j++) ref[j] = t_f64_bits(acc[j] / (double)p); break;
            case DDP_FLOAT32: for (j = 0; j < m; j++) ref[j] = t_f32_bits((float)acc[j] / (float)p); break;
            case DDP_FLOAT16: for (j = 0; j < m; j++) ref[j] = ddp_float_to_half((float)acc[j] / (float)p); break;
            default: for (j = 0; j < m; j++) ref[j] = ddp_float_to_bfloat16((float)acc[j] / (float)p); break;
            }
        } else {
            for (j = 0; j < m; j++) ref[j] = t_enc_float(dt, acc[j]);
        }
    }
}

/* For the checks within a tolerance: over ranks 0..p-1 in rank order, element lo + j's decoded
 * inputs' sum, sum of magnitudes and product (from 0, 0 and 1), j < m <= T_IN_BLOCK; prod may be
 * NULL. */
static T_UNUSED void t_in_ref_sums(const t_in_t *g, int p, size_t lo, size_t m, double *sum, double *abssum, double *prod) {
    unsigned char raw[T_IN_BLOCK * 8];
    double v[T_IN_BLOCK];
    size_t j;
    int r;
    if (m > T_IN_BLOCK) t_bail("t_in_ref_sums: %zu elements at once", m);
    for (j = 0; j < m; j++) { sum[j] = 0; abssum[j] = 0; if (prod) prod[j] = 1; }
    for (r = 0; r < p; r++) {
        t_in_fill(g, r, lo, m, raw);
        t_in_decode(g->dt, raw, m, v);
        for (j = 0; j < m; j++) { sum[j] += v[j]; abssum[j] += fabs(v[j]); }
        if (prod) for (j = 0; j < m; j++) prod[j] *= v[j];
    }
}

/* The index of the first of out's n elements that is not rank src's input element si + i (all
 * es bytes compared); n if they all are. */
static T_UNUSED size_t t_in_first_diff(const t_in_t *g, int src, size_t si, const void *out, size_t n) {
    const unsigned char *o = (const unsigned char *)out;
    unsigned char want[T_IN_BLOCK * 8];
    size_t i0, j;
    for (i0 = 0; i0 < n; i0 += T_IN_BLOCK) {
        size_t m = n - i0 < T_IN_BLOCK ? n - i0 : T_IN_BLOCK;
        t_in_fill(g, src, si + i0, m, want);
        if (memcmp(o + i0 * g->es, want, m * g->es) == 0) continue;
        for (j = 0; j < m; j++)
            if (memcmp(o + (i0 + j) * g->es, want + j * g->es, g->es) != 0) return i0 + j;
    }
    return n;
}

/* Checks the range functions against the element-wise definitions
 * for every how x dtype x op: t_in_fill, and at p = 1..8 t_in_ref_exact and t_in_ref_sums. 0 if
 * they agree; else -1 and what differs in why. */
static T_UNUSED int t_in_selftest(char *why, size_t cap) {
    enum { N = 97 };
    const size_t lo = 123457;   /* odd: not a multiple of any block */
    int how, dt, op, p, i;
    t_in_half_init();
    for (how = T_IN_BITS; how <= T_IN_UNIFORM; how++)
        for (dt = 0; dt < DDP_NUM_DTYPES; dt++)
            for (op = 0; op < DDP_NUM_OPS; op++) {
                uint64_t seed = t_mix64(0x5e1f7e57ull + (uint64_t)(how * 100 + dt * 10 + op)), ref[N], w;
                unsigned char raw[N * 8];
                double sum[N], abssum[N], prod[N];
                t_in_t g;
                size_t es;
                if (how == T_IN_UNIFORM && t_is_int(dt)) continue;
                t_in_init(&g, how, dt, op, seed);
                es = g.es;
                t_in_fill(&g, 3, lo, N, raw);
                for (i = 0; i < N; i++) {
                    w = t_in_bits_one(how, dt, op, t_case_rnd(seed, 3, lo + (size_t)i));
                    if (memcmp(raw + (size_t)i * es, &w, es)) {
                        snprintf(why, cap, "t_in_fill how %d %s %s element %d: 0x%llx", how, ddp_dtype_name((ddp_dtype_t)dt),
                                 ddp_op_name((ddp_op_t)op), i, (unsigned long long)w);
                        return -1;
                    }
                }
                if (t_in_first_diff(&g, 3, lo, raw, N) != N) { snprintf(why, cap, "t_in_first_diff"); return -1; }
                if (how == T_IN_BITS) continue;
                for (p = 1; p <= 8; p++) {
                    t_in_ref_exact(&g, p, lo, N, ref);
                    t_in_ref_sums(&g, p, lo, N, sum, abssum, prod);
                    for (i = 0; i < N; i++) {
                        double s = 0, a = 0, q = 1;
                        int r;
                        w = t_ref_exact_one(how, dt, op, seed, p, lo + (size_t)i);
                        if (memcmp(&ref[i], &w, es)) {
                            snprintf(why, cap, "t_in_ref_exact how %d %s %s p %d element %d: 0x%llx, not 0x%llx", how,
                                     ddp_dtype_name((ddp_dtype_t)dt), ddp_op_name((ddp_op_t)op), p, i,
                                     (unsigned long long)ref[i], (unsigned long long)w);
                            return -1;
                        }
                        if (t_is_int(dt)) continue;
                        for (r = 0; r < p; r++) {
                            double v = t_dec_float(dt, t_in_bits_one(how, dt, op, t_case_rnd(seed, r, lo + (size_t)i)));
                            s += v; a += fabs(v); q *= v;
                        }
                        if (memcmp(&s, &sum[i], 8) || memcmp(&a, &abssum[i], 8) || memcmp(&q, &prod[i], 8)) {
                            snprintf(why, cap, "t_in_ref_sums how %d %s %s p %d element %d", how,
                                     ddp_dtype_name((ddp_dtype_t)dt), ddp_op_name((ddp_op_t)op), p, i);
                            return -1;
                        }
                    }
                }
            }
    return 0;
}

#endif /* DDP_TEST_DATA_H */
