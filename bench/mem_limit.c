/* SPDX-License-Identifier: MIT (see LICENSE) */
/* bench/mem_limit.c — what one thread of this machine's memory can do at the collectives'
 * sizes: the limits `make compare` (bench/compare.sh) sets the shared-memory all-reduce against.
 *
 *   cc -std=c99 -O2 -Wall -Wextra -Wpedantic -Werror -I. bench/mem_limit.c -o build/mem_limit
 *   ./build/mem_limit [-s 64K,1M,16M,64M] [-t 0.2] [-J out.json]
 *
 * Per size, one thread, each for about -t seconds (at least 2 calls):
 *   memcpy   memcpy(dst, src, size), back to back;
 *   a+b      c = a + b over size bytes of float with libddp's own kernel
 *            (ddp_reduce_local(c, a, b, n, DDP_FLOAT32, DDP_SUM)): the reduction every
 *            all-reduce step runs, three distinct buffers;
 *   x-core   (with -x, two threads on two CPUs) one thread rewrites src, the other then
 *            memcpys it into its own dst; only the copy is timed. This is the rate at which
 *            bytes written on one core reach another, which bounds every shared-memory
 *            collective whose buffers fit the caches: there a one-thread memcpy runs from the
 *            core's own cache, a rate no exchange between cores reaches.
 * GB/s counts the bytes of the destination written per second (GB = 1e9 B), the way busbw counts
 * an all-reduce's bytes: the memory traffic is 2x that for memcpy (read, write) and 3x for a+b
 * (read, read, write). The buffers have the size itself, so up to the caches' size they stay
 * cached, as a collective's buffer of that size does; they are touched before the clock starts.
 * Sizes take K/M/G suffixes (binary), as ddp-bench's -s.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#define DDP_IMPLEMENTATION
#include "ddp_kernels.h"

#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MAX_SIZES 32

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static size_t parse_size(const char *s, char **end) {
    double v = strtod(s, end);
    switch (**end) {
    case 'k': case 'K': v *= 1024.0; (*end)++; break;
    case 'm': case 'M': v *= 1048576.0; (*end)++; break;
    case 'g': case 'G': v *= 1073741824.0; (*end)++; break;
    default: break;
    }
    return v < 1 ? 0 : (size_t)v;
}

/* "64K,1M": the sizes into out; how many, or -1 when the list is malformed. */
static int parse_sizes(const char *s, size_t *out) {
    int n = 0;
    while (*s) {
        char *end;
        size_t v = parse_size(s, &end);
        if (!v || end == s || (*end && *end != ',') || n == MAX_SIZES) return -1;
        out[n++] = v;
        s = *end ? end + 1 : end;
    }
    return n;
}

/* kind 0: memcpy(d, a); 1: d = a + b (float sum). Returns GB/s of d written; *calls_out: calls. */
static double run_kernel(int kind, unsigned char *d, const unsigned char *a, const unsigned char *b,
                         size_t bytes, double secs, long *calls_out) {
    size_t n = bytes / sizeof(float);
    long calls = 0;
    double t0, t;
    t0 = now_s();
    do {
        if (kind == 0) memcpy(d, a, bytes);
        else ddp_reduce_local(d, a, b, n, DDP_FLOAT32, DDP_SUM);
        __asm__ __volatile__("" : : "r"(d) : "memory");   /* keep every call */
        calls++;
        t = now_s() - t0;
    } while (t < secs || calls < 2);
    *calls_out = calls;
    return (double)(kind == 0 ? bytes : n * sizeof(float)) * (double)calls / t / 1e9;
}

/* x-core: the writer thread (on the first CPU we may use) and the copier (the caller, on the
 * second) take turns through one flag: 1 = src rewritten, copy it; 0 = copied, rewrite it. */
typedef struct { unsigned char *src; size_t bytes; int turn, stop; unsigned char fill; } xcore_t;

/* Pins the calling thread to the nth CPU of the process's affinity mask at its first call (the
 * copier stays pinned between sizes); 0 when there is no such CPU. */
static int pin_to(int nth) {
    static cpu_set_t first;
    static int have;
    cpu_set_t set;
    int cpu, seen = 0;
    if (!have && sched_getaffinity(0, sizeof first, &first) != 0) return 0;
    have = 1;
    for (cpu = 0; cpu < CPU_SETSIZE; cpu++) {
        if (!CPU_ISSET(cpu, &first) || seen++ != nth) continue;
        CPU_ZERO(&set);
        CPU_SET(cpu, &set);
        return pthread_setaffinity_np(pthread_self(), sizeof set, &set) == 0;
    }
    return 0;
}

static void *xcore_writer(void *arg) {
    xcore_t *x = (xcore_t *)arg;
    pin_to(0);
    for (;;) {
        while (__atomic_load_n(&x->turn, __ATOMIC_ACQUIRE) != 0)
            if (__atomic_load_n(&x->stop, __ATOMIC_ACQUIRE)) return NULL;
        memset(x->src, ++x->fill, x->bytes);
        __atomic_store_n(&x->turn, 1, __ATOMIC_RELEASE);
    }
}

/* GB/s of dst written by the copier (copy time only); 0 when two CPUs are not available. */
static double run_xcore(unsigned char *d, unsigned char *src, size_t bytes, double secs, long *calls_out) {
    xcore_t x;
    pthread_t th;
    double spent = 0;
    long calls = 0;
    if (!pin_to(1)) { *calls_out = 0; return 0; }
    memset(&x, 0, sizeof x);
    x.src = src;
    x.bytes = bytes;
    if (pthread_create(&th, NULL, xcore_writer, &x) != 0) { *calls_out = 0; return 0; }
    do {
        double t0;
        while (__atomic_load_n(&x.turn, __ATOMIC_ACQUIRE) != 1) {}
        t0 = now_s();
        memcpy(d, src, bytes);
        __asm__ __volatile__("" : : "r"(d) : "memory");
        spent += now_s() - t0;
        __atomic_store_n(&x.turn, 0, __ATOMIC_RELEASE);
        calls++;
    } while (spent < secs || calls < 3);
    __atomic_store_n(&x.stop, 1, __ATOMIC_RELEASE);
    pthread_join(th, NULL);
    *calls_out = calls;
    return (double)bytes * (double)calls / spent / 1e9;
}

static void usage(FILE *f, const char *argv0) {
    fprintf(f, "usage: %s [-s 64K,1M,16M,64M] [-t seconds_per_kernel_and_size] [-x 1] [-J out.json]\n", argv0);
}

int main(int argc, char **argv) {
    size_t sizes[MAX_SIZES], maxb = 0;
    double secs = 0.2, cp[MAX_SIZES], add[MAX_SIZES], xc[MAX_SIZES];
    long cp_calls[MAX_SIZES], add_calls[MAX_SIZES], xc_calls[MAX_SIZES];
    int nsizes = 4, i, xcore = 0;
    const char *json = NULL;
    unsigned char *a, *b, *d;
    sizes[0] = 64u << 10;
    sizes[1] = 1u << 20;
    sizes[2] = 16u << 20;
    sizes[3] = 64u << 20;
    for (i = 1; i < argc; i += 2) {   /* every option takes a value */
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) { usage(stdout, argv[0]); return 0; }
        if (!v) { usage(stderr, argv[0]); return 2; }
        if (!strcmp(argv[i], "-s")) {
            nsizes = parse_sizes(v, sizes);
            if (nsizes <= 0) { fprintf(stderr, "%s: bad size list '%s' (e.g. 64K,1M,16M)\n", argv[0], v); return 2; }
        } else if (!strcmp(argv[i], "-t")) {
            secs = atof(v);
            if (!(secs > 0)) { fprintf(stderr, "%s: -t wants seconds > 0, not '%s'\n", argv[0], v); return 2; }
        } else if (!strcmp(argv[i], "-x")) {
            xcore = atoi(v) != 0;
        } else if (!strcmp(argv[i], "-J")) {
            json = v;
        } else {
            fprintf(stderr, "%s: unknown option %s\n", argv[0], argv[i]);
            usage(stderr, argv[0]);
            return 2;
        }
    }
    for (i = 0; i < nsizes; i++) {
        sizes[i] -= sizes[i] % sizeof(float);   /* a+b works on whole floats */
        if (!sizes[i]) { fprintf(stderr, "%s: sizes must be at least 4 bytes\n", argv[0]); return 2; }
        if (sizes[i] > maxb) maxb = sizes[i];
    }
    if (posix_memalign((void **)&a, 4096, maxb) || posix_memalign((void **)&b, 4096, maxb) ||
        posix_memalign((void **)&d, 4096, maxb)) {
        fprintf(stderr, "%s: cannot allocate 3 x %zu bytes\n", argv[0], maxb);
        return 1;
    }
    memset(a, 0, maxb);   /* zeros: no denormals in the float sum */
    memset(b, 0, maxb);
    memset(d, 0, maxb);
    printf("# one thread%s; GB/s = bytes of the destination written per second (GB = 1e9 B)\n",
           xcore ? " (x-core: two, on two CPUs; copy time only)" : "");
    printf("# %12s %10s %10s %10s %8s %8s %8s\n", "bytes", "memcpy", "a+b", "x-core", "calls", "calls", "calls");
    for (i = 0; i < nsizes; i++) {
        long dummy;
        run_kernel(0, d, a, b, sizes[i], 0, &dummy);   /* warm: the caches, the TLB */
        cp[i] = run_kernel(0, d, a, b, sizes[i], secs, &cp_calls[i]);
        run_kernel(1, d, a, b, sizes[i], 0, &dummy);
        add[i] = run_kernel(1, d, a, b, sizes[i], secs, &add_calls[i]);
        xc[i] = 0;
        xc_calls[i] = 0;
        if (xcore) xc[i] = run_xcore(d, a, sizes[i], secs, &xc_calls[i]);
        printf("  %12zu %10.3f %10.3f %10.3f %8ld %8ld %8ld\n", sizes[i], cp[i], add[i], xc[i], cp_calls[i],
               add_calls[i], xc_calls[i]);
        fflush(stdout);
    }
    if (json) {
        FILE *f = fopen(json, "w");
        if (!f) { perror(json); return 1; }
        fprintf(f, "{\n  \"bench\": \"mem_limit\",\n  \"mode\": \"mem_limit\",\n  \"threads\": 1,\n"
                   "  \"seconds_per_kernel\": %.3f,\n"
                   "  \"units\": \"GB/s of the destination written (GB = 1e9 B); memory traffic: "
                   "memcpy 2x, a+b 3x\",\n  \"add_kernel\": \"ddp_reduce_local float sum, c = a + b\",\n"
                   "  \"results\": [\n", secs);
        for (i = 0; i < nsizes; i++) {
            fprintf(f, "    {\"bytes\": %zu, \"memcpy_GBs\": %.6f, \"add_GBs\": %.6f, \"memcpy_calls\": %ld, "
                       "\"add_calls\": %ld%s", sizes[i], cp[i], add[i], cp_calls[i], add_calls[i],
                    xcore ? ", " : "}");
            if (xcore) fprintf(f, "\"xcore_GBs\": %.6f, \"xcore_calls\": %ld}", xc[i], xc_calls[i]);
            fprintf(f, "%s\n", i + 1 < nsizes ? "," : "");
        }
        fprintf(f, "  ]\n}\n");
        fclose(f);
    }
    free(a);
    free(b);
    free(d);
    return 0;
}
