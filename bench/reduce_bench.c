/* SPDX-License-Identifier: MIT (see LICENSE) */
/* bench/reduce_bench.c — speed of libddp's reduction kernels (ddp_reduce_local), the local work
 * of every reduce-scatter step, next to a plain loop and memcpy.
 *
 *   cc -std=c99 -O2 -Wall -Wextra -Wpedantic -Werror -I. -pthread bench/reduce_bench.c \
 *      -o build/reduce_bench -lm          (and again with -O3 -march=native to compare)
 *   ./build/reduce_bench [-t seconds_per_case]
 *
 * For each dtype (sum) at 512 KiB (a ring segment: cache-resident) and 64 MiB (memory-resident),
 * the ring's in-place form dst = a (op) b with dst == a. GB/s = bytes of dst written per second
 * (GB = 1e9 B); the memory traffic is about 3x that. "plain" is `d[i] = a[i] + b[i]` over
 * restrict pointers in this file, compiled with the same flags: what the compiler makes of the
 * simplest loop. memcpy(dst, b) is the ceiling for moving the bytes at all.
 */
#define _GNU_SOURCE
#define DDP_IMPLEMENTATION
#include "ddp.h"
#include "transports/ddp_tcp.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void plain_f32(float *restrict d, const float *restrict b, size_t n) {
    size_t i;
    for (i = 0; i < n; i++) d[i] = d[i] + b[i];
}
static void plain_f64(double *restrict d, const double *restrict b, size_t n) {
    size_t i;
    for (i = 0; i < n; i++) d[i] = d[i] + b[i];
}
static void plain_i32(int32_t *restrict d, const int32_t *restrict b, size_t n) {
    size_t i;
    for (i = 0; i < n; i++) d[i] = (int32_t)((uint32_t)d[i] + (uint32_t)b[i]);
}

typedef struct { const char *name; ddp_dtype_t dtype; int plain; } kcase_t;

/* Runs one case for about secs seconds; returns GB/s of dst. kind: 0 ddp, 1 plain, 2 memcpy. */
static double run_case(int kind, const kcase_t *k, unsigned char *a, const unsigned char *b,
                       size_t bytes, double secs) {
    size_t es = ddp_dtype_size(k->dtype), n = bytes / es;
    double t0, t;
    long reps = 0;
    t0 = now_s();
    do {
        int r;
        for (r = 0; r < 8; r++) {
            if (kind == 2) memcpy(a, b, bytes);
            else if (kind == 1 && k->dtype == DDP_FLOAT32) plain_f32((float *)(void *)a, (const float *)(const void *)b, n);
            else if (kind == 1 && k->dtype == DDP_FLOAT64) plain_f64((double *)(void *)a, (const double *)(const void *)b, n);
            else if (kind == 1) plain_i32((int32_t *)(void *)a, (const int32_t *)(const void *)b, n);
            else ddp_reduce_local(a, a, b, n, k->dtype, DDP_SUM);
            __asm__ __volatile__("" : : "r"(a) : "memory");
        }
        reps += 8;
        t = now_s() - t0;
    } while (t < secs);
    return (double)bytes * (double)reps / t / 1e9;
}

int main(int argc, char **argv) {
    static const kcase_t cases[] = {
        {"float32", DDP_FLOAT32, 1}, {"float64", DDP_FLOAT64, 1}, {"int32", DDP_INT32, 1},
        {"float16", DDP_FLOAT16, 0}, {"bfloat16", DDP_BFLOAT16, 0}, {"int8", DDP_INT8, 0}};
    static const size_t sizes[] = {512u << 10, 64u << 20};
    double secs = 0.3;
    unsigned char *a, *b;
    size_t s, c;
    if (argc == 3 && !strcmp(argv[1], "-t")) secs = atof(argv[2]);
    else if (argc != 1) { fprintf(stderr, "usage: %s [-t seconds_per_case]\n", argv[0]); return 2; }
    if (posix_memalign((void **)&a, 4096, 64u << 20) || posix_memalign((void **)&b, 4096, 64u << 20)) return 1;
    memset(a, 0, 64u << 20);   /* zeros: finite in every dtype, no denormals */
    memset(b, 0, 64u << 20);
    printf("# ddp_reduce_local(dst=a, a, b, n, dtype, DDP_SUM); GB/s of dst (traffic ~3x); %s\n",
#if defined(__OPTIMIZE__) && defined(__AVX2__)
           "built with AVX2 enabled (-march=native or similar)"
#elif defined(__OPTIMIZE__)
           "built optimised, baseline x86-64 ISA (SSE2)"
#else
           "built WITHOUT optimisation"
#endif
    );
    printf("# %-9s %9s %12s %12s %12s\n", "dtype", "size", "ddp GB/s", "plain GB/s", "memcpy GB/s");
    for (s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        for (c = 0; c < sizeof cases / sizeof cases[0]; c++) {
            const kcase_t *k = &cases[c];
            double d = run_case(0, k, a, b, sizes[s], secs);
            double p = k->plain ? run_case(1, k, a, b, sizes[s], secs) : 0;
            double m = c == 0 ? run_case(2, k, a, b, sizes[s], secs) : 0;
            char ps[16] = "-", ms[16] = "";
            if (k->plain) snprintf(ps, sizeof ps, "%.2f", p);
            if (c == 0) snprintf(ms, sizeof ms, "%.2f", m);
            printf("  %-9s %8zuK %12.2f %12s %12s\n", k->name, sizes[s] >> 10, d, ps, ms);
            fflush(stdout);
        }
    }
    free(a);
    free(b);
    return 0;
}
