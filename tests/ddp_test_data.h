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
 * order-dependent). */
#ifndef DDP_TEST_DATA_H
#define DDP_TEST_DATA_H

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

#endif /* DDP_TEST_DATA_H */
