/* SPDX-License-Identifier: MIT (see LICENSE) */
/* tests/test_flat_reducer.c — the reducer's flat-buffer mode and ZeRO-1 (issue 17). TAP.
 *
 *   build/test_flat_reducer     (DDP_TEST_ONLY=<scenario> runs one; DDP_TEST_QUICK=1: fewer
 *                                world sizes, for the sanitizer builds)
 *
 * Scenarios:
 *   bitwise   the flat reducer against one ddp_all_reduce(flat, flat, n, dtype, DDP_AVG) of a
 *             copy: 8 slices of odd sizes (1 .. 100003 elements, 108,381 in all), float32 and
 *             float64, three bucket caps (first / others: 64 B / 256 B, a bucket per parameter
 *             of 64 elements or more; 4 / 16 KiB; DDP's 1 / 25 MiB), two iterations, odd ranks
 *             marking in forward order, even ranks backward. Random data use every mantissa bit
 *             and exponents spread over e^[-4, 4), so that another order of additions shows
 *             (each check also reports how far another order could go). Bit for bit, always:
 *             tcp (the ring: a bucket is cut as the whole buffer would be, issue 18) p = 1..5;
 *             shm (rank order on both paths) and DDP_ALGO=rd p = 2..4; DDP_ALGO=rabenseifner
 *             p = 3..5; two fake hosts (DDP_TEST_HOSTS, auto: the cost model's pick) p = 3..5,
 *             and DDP_ALGO=hier_ring p = 3, 4. With the reducer's flat windows switched off, the
 *             tcp and hier runs at p >= 3 fail. Copy-free: ddp_reducer_grad(i) is the slice
 *             itself, the result is in the user's buffer, and the reducer allocated (counting
 *             allocator on the communicator) only bookkeeping: under 64 KiB for a 434 / 867 KB
 *             buffer, while a gradient_as_bucket_view reducer on the same gradients allocates
 *             all of them. No rebuild.
 *   layout    one rank: buckets are contiguous ranges from the end of the buffer down (the
 *             shards of zero_stage 0), whole parameters, never across memory between slices
 *             (a gap), registration order irrelevant; two ranks: the gap's bytes are never
 *             written (sentinel), in DDP and ZeRO-1 mode (reduce-scatter and all-gather).
 *   unused    find_unused in flat mode (p = 3): a slice nobody marks is zero after finish, one
 *             unmarked on rank 1 only (holding garbage there) is averaged with its zero;
 *             without find_unused finish names the unmarked parameter on every rank, nobody
 *             hangs, the next iteration works. The same in ZeRO-1 mode (checked on the shard).
 *   nosync    no_sync for two steps then a synchronised one: the average of the sums, in DDP
 *             and ZeRO-1 mode.
 *   hooks     flat mode with an async comm_hook (called once per bucket per iteration, on a range
 *             of the flat buffer, exact averages) and with fp16 compression (fp16 precision).
 *   misuse    slices outside the buffer (before, after, across its end), overlapping slices,
 *             mixed dtypes in one buffer, a slice not on an element boundary, NULL slice,
 *             flat_grads without flat_bytes, zero_stage 2, ZeRO-1 without a flat buffer or with a
 *             hook/compression: DDP_ERR_INVALID_ARGUMENT (or -1 from add_param, with
 *             "[invalid argument]" from ddp_comm_last_error) and a message naming the problem;
 *             shards and all_gather_params without flat mode, all_gather_params mid-iteration:
 *             DDP_ERR_INVALID_USAGE; the communicator and the reducer still work afterwards.
 *   shards    ZeRO-1, p = 1..5: single slices of n = 1, 2, 3, 7, 1001, 65537 elements, a
 *             7-slice buffer with a gap and 256-byte buckets (parameters straddling bucket
 *             boundaries), 100 small slices in up to 100 buckets (more than the reducer keeps in
 *             flight, for the reduce-scatters and the all-gathers): the ranks' shards (written
 *             to shared memory) cover every registered element exactly once and nothing else; per-rank state within one element per
 *             run of ceil(n/p); the reduce-scatter leaves the exact average in each shard;
 *             all_gather_params gives every rank every shard, bitwise identical everywhere.
 *   zero      ZeRO-1 vs replicated AdamW, p = 1..4, float32 and float64, 6 steps on a 20,011-
 *             element model: each step the ZeRO-1 shard of the averaged gradient equals the
 *             all-reduced one (bitwise at p <= 2, else within the rounding bound above), the
 *             parameters equal the replicated run's (bitwise at p <= 2, else within 1e-5 of
 *             their scale), and are bitwise identical on every rank after the all-gather;
 *             optimizer state per rank = its shard (sum over ranks = n).
 *   device    the fake NCCL and CUDA runtime (tests/fake_nccl; skipped when not built): a flat
 *             buffer in device memory (host reads of it crash), on a non-blocking stream whose
 *             work starts 1 ms late, p = 2, 3, 4, DDP and ZeRO-1 with find_unused (one slice
 *             unmarked on rank 1: zeroed on the device), a 1-element slice and a tail: the
 *             averages after ddp_comm_device_synchronize, grad(i) the device slice, and
 *             all_gather_params of a device parameter buffer (tail through device scratch).
 *             Exact at p = 2, 4 (ncclAvg divides first: by 2 or 4, exact), 1e-6 at p = 3.
 */
#define _GNU_SOURCE
#include "ddp.h"
#include "transports/ddp_tcp.h"
#include "transports/ddp_shm.h"
#include "transports/ddp_nccl.h"
#include "tests/ddp_test.h"
#include "tests/ddp_test_device.h"

#include <float.h>
#include <math.h>

static const char *g_mode = "tcp";   /* tcp, shm; rd, rab, hier_ring (tcp with that DDP_ALGO); hier (tcp, two test hosts) */

/* ---------------------------------------------------------------- a counting allocator */
static size_t g_alloc_total;   /* bytes ever allocated through the communicator's allocator */
static void *count_alloc(size_t n, void *user) {
    size_t *h = (size_t *)malloc(n + 16);
    (void)user;
    if (!h) return NULL;
    h[0] = n;
    __atomic_fetch_add(&g_alloc_total, n, __ATOMIC_RELAXED);
    return (unsigned char *)h + 16;
}
static void count_free(void *ptr, void *user) {
    (void)user;
    free((unsigned char *)ptr - 16);
}
static size_t alloc_total(void) { return __atomic_load_n(&g_alloc_total, __ATOMIC_RELAXED); }

static int g_p;   /* world size of the run (the hosts layout of the hier modes) */
static void set_mode(void) {
    static const char *const hosts[] = {"a", "a", "a,b", "a,a,b", "a,a,b,b", "a,a,b,b,b"};
    unsetenv("DDP_SHM_COLL");
    unsetenv("DDP_ALGO");
    unsetenv("DDP_TEST_HOSTS");
    if (!strcmp(g_mode, "shm")) unsetenv("DDP_TRANSPORT");
    else setenv("DDP_TRANSPORT", "tcp", 1);
    if (!strcmp(g_mode, "rd")) setenv("DDP_ALGO", "rd", 1);
    if (!strcmp(g_mode, "rab")) setenv("DDP_ALGO", "rabenseifner", 1);
    if (!strcmp(g_mode, "hier_ring")) setenv("DDP_ALGO", "hier_ring", 1);
    if (!strncmp(g_mode, "hier", 4) && g_p >= 1 && g_p <= 5) setenv("DDP_TEST_HOSTS", hosts[g_p], 1);
}

static ddp_comm_t *init_comm(int rank, int p, int quiet) {
    static ddp_allocator_t counting = { count_alloc, count_free, NULL };
    ddp_comm_desc_t d;
    ddp_comm_t *c = NULL;
    ddp_result_t r;
    set_mode();
    t_desc(&d, 20000);
    d.log_level = quiet ? 1 : 0;
    d.allocator = &counting;
    t_where("ddp_comm_init");
    r = ddp_comm_init(&c, p, rank, &d);
    if (!ok(r == DDP_SUCCESS, "[%s] ddp_comm_init rank %d of %d -> %s %s", g_mode, rank, p, ddp_strerror(r),
            r ? ddp_last_init_error() : ""))
        return NULL;
    return c;
}

/* A deterministic value in [-1, 1) for a key. */
static double u(uint64_t a, uint64_t b, uint64_t c) {
    return (double)(t_mix64((a << 40) ^ (b << 20) ^ c) >> 11) / (double)(1ull << 53) * 2.0 - 1.0;
}
/* Random with every mantissa bit used and exponents spread over [-4, 4) (u alone is a multiple
 * of 2^-52, whose float64 sums are mostly exact), so that summation order shows. */
static double rnd(uint64_t a, uint64_t b, uint64_t c) {
    return u(a, b, c) * exp(4.0 * u(a + 777, b, c));
}
/* A multiple of 1/8 in [-125, 125]: sums of a few are exact in float32, in any order. */
static double exact(uint64_t a, uint64_t b, uint64_t c) {
    return (double)((int)(t_mix64((a << 40) ^ (b << 20) ^ c) % 2001) - 1000) / 8.0;
}

static double getv(const void *a, ddp_dtype_t dt, size_t j) {
    return dt == DDP_FLOAT32 ? (double)((const float *)a)[j] : ((const double *)a)[j];
}
static void setv(void *a, ddp_dtype_t dt, size_t j, double v) {
    if (dt == DDP_FLOAT32) ((float *)a)[j] = (float)v; else ((double *)a)[j] = v;
}
static double eps_of(ddp_dtype_t dt) { return dt == DDP_FLOAT32 ? (double)FLT_EPSILON : DBL_EPSILON; }

static ddp_reducer_t *mk(ddp_comm_t *c, void *flat, size_t bytes, size_t first, size_t cap, int zero, int unused) {
    ddp_reducer_desc_t d;
    ddp_reducer_t *r = NULL;
    ddp_result_t e;
    memset(&d, 0, sizeof d);
    d.first_bucket_bytes = first;
    d.bucket_cap_bytes = cap;
    d.flat_grads = flat;
    d.flat_bytes = bytes;
    d.zero_stage = zero;
    d.find_unused = unused;
    if ((e = ddp_reducer_create(&r, c, &d)) != DDP_SUCCESS) {
        ok(0, "ddp_reducer_create -> %s: %s", ddp_strerror(e), ddp_comm_last_error(c));
        return NULL;
    }
    return r;
}

/* Registers n slices laid out one after the other from element 0; returns 0 if all were taken. */
static int add_slices(ddp_reducer_t *r, void *flat, ddp_dtype_t dt, const size_t *sz, int n, size_t *off) {
    size_t o = 0, es = ddp_dtype_size(dt);
    int k, bad = 0;
    for (k = 0; k < n; k++) {
        if (off) off[k] = o;
        if (ddp_reducer_add_param(r, (unsigned char *)flat + o * es, sz[k], dt) != k) bad++;
        o += sz[k];
    }
    return bad;
}

/* Marks every parameter ready, forward or backward, and finishes. */
static ddp_result_t mark_all(ddp_reducer_t *r, int n, int forward) {
    ddp_result_t e = DDP_SUCCESS;
    int k;
    for (k = 0; k < n && e == DDP_SUCCESS; k++) e = ddp_reducer_grad_ready(r, forward ? k : n - 1 - k);
    return e == DDP_SUCCESS ? ddp_reducer_finish(r) : e;
}

/* ----------------------------------------------------------------- bitwise */
#define NB 8
static const size_t bsz[NB] = {37, 700, 3, 2501, 129, 1, 5007, 100003};
typedef struct { ddp_dtype_t dt; } bitwise_arg_t;

static int bitwise(int rank, int p, void *arg) {
    static const size_t caps[3][2] = {{64, 256}, {4096, 16384}, {0, 0}};
    const bitwise_arg_t *a = (const bitwise_arg_t *)arg;
    const ddp_dtype_t dt = a->dt;
    const size_t es = ddp_dtype_size(dt);
    size_t n = 0, off[NB], j;
    unsigned char *g, *ref;
    ddp_comm_t *c;
    int k, ci, it, data;
    ddp_request_t warm;
    float w = 1.0f;
    for (k = 0; k < NB; k++) n += bsz[k];
    if (!(c = init_comm(rank, p, 1))) return 1;
    g = (unsigned char *)malloc(n * es);
    ref = (unsigned char *)malloc(n * es);
    /* the progress thread starts with the first async call: before counting */
    if (ddp_all_reduce_async(&w, &w, 1, DDP_FLOAT32, DDP_SUM, c, &warm) != DDP_SUCCESS || ddp_wait(&warm) != DDP_SUCCESS)
        ok(0, "warm-up all-reduce: %s", ddp_comm_last_error(c));
    for (ci = 0; ci < 3; ci++) {
        size_t before = alloc_total(), used;
        ddp_reducer_t *r = mk(c, g, n * es, caps[ci][0], caps[ci][1], 0, 0);
        int views = 1, nb, bad_call = 0;
        size_t bucket_bytes = 0;
        if (!r) break;
        if (add_slices(r, g, dt, bsz, NB, off)) bad_call++;
        for (k = 0; k < NB; k++) views &= ddp_reducer_grad(r, k) == (void *)(g + off[k] * es);
        nb = ddp_reducer_num_buckets(r);
        for (k = 0; k < nb; k++) {
            size_t by = 0;
            ddp_reducer_bucket_info(r, k, NULL, 0, &by, NULL);
            bucket_bytes += by;
        }
        for (it = 0; it < 2; it++)
            for (data = 0; data < 2; data++) {   /* 0: random in [-1, 1); 1: exact sums */
                double maxd = 0, maxabs = 0, tol;
                size_t ndiff = 0;
                ddp_result_t e;
                for (j = 0; j < n; j++) {
                    double v = data ? exact(11 + (uint64_t)it, (uint64_t)rank, j) : rnd(11 + (uint64_t)it, (uint64_t)rank, j);
                    setv(g, dt, j, v);
                }
                memcpy(ref, g, n * es);
                for (j = 0; j < n; j++) if (fabs(getv(g, dt, j)) > maxabs) maxabs = fabs(getv(g, dt, j));
                if (ddp_all_reduce(ref, ref, n, dt, DDP_AVG, c) != DDP_SUCCESS) bad_call++;
                e = mark_all(r, NB, rank % 2);
                if (e != DDP_SUCCESS) { bad_call++; diag("finish: %s", ddp_reducer_last_error(r)); }
                for (j = 0; j < n; j++) {
                    double d = fabs(getv(g, dt, j) - getv(ref, dt, j));
                    if (d > maxd || d != d) maxd = d;
                    if (memcmp(g + j * es, ref + j * es, es)) ndiff++;
                }
                /* what another order of additions would give: p values of magnitude <= maxabs,
                 * two orders differ by at most twice (p - 1) eps max|x| (reported, not allowed) */
                tol = 2.0 * (p - 1) * eps_of(dt) * maxabs;
                ok(!bad_call && ndiff == 0, "[%s p=%d %s caps %zu/%zu it %d %s] flat reducer (%d buckets) == flat "
                   "all-reduce, bit for bit (%zu of %zu elements differ, by up to %.2e; another order of "
                   "additions could differ by %.2e)", g_mode, p, ddp_dtype_name(dt), caps[ci][0], caps[ci][1], it,
                   data ? "exact-sum data" : "random data", nb, ndiff, n, maxd, tol);
            }
        used = alloc_total() - before;
        ok(views && bucket_bytes == n * es && !ddp_reducer_rebuilt(r) && used < (64u << 10),
           "[%s p=%d %s caps %zu/%zu] copy-free: grad(i) is the slice: %s; the %d buckets cover the %zu bytes; "
           "not rebuilt; the reducer allocated %zu bytes (bookkeeping) for a %zu-byte buffer", g_mode, p,
           ddp_dtype_name(dt), caps[ci][0], caps[ci][1], views ? "yes" : "NO", nb, n * es, used, n * es);
        ddp_reducer_destroy(r);
    }
    if (rank == 0 && p == 2 && !strcmp(g_mode, "tcp")) {   /* the counter does see bucket memory */
        size_t before = alloc_total(), used;
        ddp_reducer_desc_t d;
        ddp_reducer_t *r = NULL;
        memset(&d, 0, sizeof d);
        d.gradient_as_bucket_view = 1;
        ddp_reducer_create(&r, c, &d);
        for (k = 0; k < NB; k++) ddp_reducer_add_param(r, NULL, bsz[k], dt);
        ddp_reducer_num_buckets(r);
        used = alloc_total() - before;
        ok(used >= n * es, "the counting allocator sees a gradient_as_bucket_view reducer's buckets: %zu bytes "
           "for %zu bytes of gradients", used, n * es);
        ddp_reducer_destroy(r);
    }
    free(g);
    free(ref);
    ddp_comm_destroy(c);
    return 0;
}

/* ----------------------------------------------------------------- layout */
/* Slices (registered in this order) at these element offsets of a 1,200-element buffer:
 * elements [700, 760) are nobody's (a gap). */
#define NL 6
static const size_t lsz[NL] = {100, 37, 300, 3, 200, 500};
static const size_t loff[NL] = {0, 100, 137, 437, 440, 760};   /* 440 + 200 = 640: gap 640..760 */
#define LN 1260
#define LGAP_LO 640
#define LGAP_HI 760

static int layout(int rank, int p, void *arg) {
    float *g = (float *)calloc(LN, sizeof(float)), *w = (float *)calloc(LN, sizeof(float));
    ddp_comm_t *c;
    int zero, k;
    (void)arg;
    if (!(c = init_comm(rank, p, 1))) return 1;
    for (zero = 0; zero < 2; zero++) {
        ddp_reducer_t *r = mk(c, g, LN * sizeof(float), 256, 1024, zero, 0);
        int ns, nb, prev_lo_ok = 1, in_one_run = 1, whole = 1, bad = 0, it;
        size_t prev = (size_t)-1, covered = 0, elems = 0, o, cnt;
        if (!r) break;
        /* registered out of memory order: the layout follows the memory */
        for (k = NL - 1; k >= 0; k--)
            if (ddp_reducer_add_param(r, g + loff[k], lsz[k], DDP_FLOAT32) != NL - 1 - k) bad++;
        ns = ddp_reducer_num_shards(r, &elems);
        nb = ddp_reducer_num_buckets(r);
        if (!zero && p == 1) {
            for (k = 0; k < ns; k++) {
                int pr[8], np, q;
                ddp_reducer_shard(r, k, &o, &cnt, NULL);
                if (o + cnt > prev) prev_lo_ok = 0;     /* descending, contiguous ranges */
                prev = o;
                if (o < LGAP_HI && o + cnt > LGAP_LO) in_one_run = 0;
                covered += cnt;
                np = ddp_reducer_bucket_info(r, k, pr, 8, NULL, NULL);
                for (q = 0; q < np && q < 8; q++) {   /* whole parameters inside the range */
                    int pi = NL - 1 - pr[q];
                    if (loff[pi] < o || loff[pi] + lsz[pi] > o + cnt) whole = 0;
                }
            }
            ok(!bad && ns == nb && prev_lo_ok && in_one_run && whole && covered == LN - (LGAP_HI - LGAP_LO) &&
               elems == covered, "layout (p=1): %d buckets, contiguous ranges from the end of the buffer down, "
               "whole parameters, none across the gap, %zu elements covered", nb, covered);
        }
        for (it = 0; it < 2; it++) {
            size_t j;
            ddp_result_t e;
            for (j = 0; j < LN; j++) g[j] = (float)(rank + 1);
            for (j = LGAP_LO; j < LGAP_HI; j++) g[j] = w[j] = -7.0f;   /* sentinel */
            e = mark_all(r, NL, 0);
            if (e == DDP_SUCCESS && zero) e = ddp_reducer_all_gather_params(r, w, DDP_FLOAT32);
            for (j = LGAP_LO; j < LGAP_HI; j++) if (g[j] != -7.0f || w[j] != -7.0f) bad++;
            if (e != DDP_SUCCESS) { bad++; diag("%s", ddp_reducer_last_error(r)); }
        }
        ok(!bad, "[p=%d %s] the gap between slices is never written (%d bad)", p, zero ? "ZeRO-1" : "DDP", bad);
        ddp_reducer_destroy(r);
    }
    free(g);
    free(w);
    ddp_comm_destroy(c);
    return 0;
}

/* ----------------------------------------------------------------- unused */
static int unused(int rank, int p, void *arg) {
    const int *a = (const int *)arg, find = a[0], zero = a[1];
    static float g[6 * 50];
    ddp_comm_t *c;
    ddp_reducer_t *r;
    int it, k, bad = 0;
    size_t j;
    double t0 = t_now();
    if (!(c = init_comm(rank, p, 1))) return 1;
    if (!(r = mk(c, g, sizeof g, 200, 400, zero, find))) return 1;
    for (k = 0; k < 6; k++) if (ddp_reducer_add_param(r, g + 50 * k, 50, DDP_FLOAT32) != k) bad++;
    for (it = 0; it < 3; it++) {
        ddp_result_t e;
        int skip_all = !(it == 2 && !find);   /* the last no-find_unused iteration marks all */
        for (k = 0; k < 6; k++)
            for (j = 0; j < 50; j++) g[50 * k + j] = (float)((rank + 1) * (k + 1) + (int)j);
        if (skip_all) {   /* what a trainer that never wrote them might hold */
            for (j = 0; j < 50; j++) g[4 * 50 + j] = 42.0f;
            if (rank == 1) for (j = 0; j < 50; j++) g[2 * 50 + j] = 42.0f;
        }
        for (k = 5; k >= 0; k--) {
            if (skip_all && (k == 4 || (k == 2 && rank == 1))) continue;
            if (ddp_reducer_grad_ready(r, k) != DDP_SUCCESS) bad++;
        }
        e = ddp_reducer_finish(r);
        if (find || !skip_all) {
            int wrong = 0, ns = ddp_reducer_num_shards(r, NULL), s;
            if (e != DDP_SUCCESS) { bad++; diag("finish: %s", ddp_reducer_last_error(r)); }
            for (s = 0; s < ns; s++) {    /* the shards: everything without ZeRO-1 */
                size_t o, cnt, x;
                ddp_reducer_shard(r, s, &o, &cnt, NULL);
                for (x = o; x < o + cnt; x++) {
                    int kk = (int)(x / 50), jj = (int)(x % 50);
                    float want = (float)(p * (p + 1) / 2 * (kk + 1) + p * jj) / (float)p;
                    if (skip_all && kk == 2) want = (float)((p * (p + 1) / 2 - 2) * (kk + 1) + (p - 1) * jj) / (float)p;
                    if (skip_all && kk == 4) want = 0.0f;
                    if (fabsf(g[x] - want) > 1e-5f * fabsf(want)) wrong++;
                }
            }
            if (skip_all)
                ok(!wrong, "[%s] find_unused, iteration %d: unused everywhere: zero (reduced as zeros in place); "
                   "unused on rank 1 (holding 42s there): averaged with its zero; the rest averaged (%d wrong)",
                   zero ? "ZeRO-1" : "DDP", it, wrong);
            else
                ok(e == DDP_SUCCESS && !wrong, "[%s] without find_unused: after the errors, an iteration marking "
                   "every gradient works (%d wrong)", zero ? "ZeRO-1" : "DDP", wrong);
        } else {
            const char *msg = ddp_reducer_last_error(r);
            ok(e == DDP_ERR_INVALID_USAGE && t_mentions_int(msg, 4) && (rank != 1 || t_mentions_int(msg, 2)) &&
               strstr(msg, "find_unused"), "[%s] without find_unused, iteration %d: %s: %s", zero ? "ZeRO-1" : "DDP",
               it, ddp_strerror(e), msg);
        }
    }
    ok(!bad, "no failed calls besides the expected ones (%d)", bad);
    ok(t_now() - t0 < 15, "nobody hung (%.1f s)", t_now() - t0);
    ddp_reducer_destroy(r);
    ddp_comm_destroy(c);
    return 0;
}

/* ----------------------------------------------------------------- nosync */
static int nosync(int rank, int p, void *arg) {
    static const size_t sz[4] = {300, 7, 1000, 33};
    static double g[1340];
    const int zero = *(const int *)arg;
    ddp_comm_t *c;
    ddp_reducer_t *r;
    int s, bad = 0, wrong = 0, ns, k;
    size_t j;
    if (!(c = init_comm(rank, p, 1))) return 1;
    if (!(r = mk(c, g, sizeof g, 512, 2048, zero, 0))) return 1;
    bad += add_slices(r, g, DDP_FLOAT64, sz, 4, NULL);
    memset(g, 0, sizeof g);
    for (s = 0; s < 3; s++) {   /* accumulate 3 steps, synchronise in the last */
        if (ddp_reducer_set_no_sync(r, s < 2) != DDP_SUCCESS) bad++;
        for (j = 0; j < 1340; j++) g[j] += (double)(rank + 1) * (double)(s + 1) + (double)j;
        if (mark_all(r, 4, 0) != DDP_SUCCESS) bad++;
    }
    ns = ddp_reducer_num_shards(r, NULL);
    for (k = 0; k < ns; k++) {
        size_t o, cnt;
        ddp_reducer_shard(r, k, &o, &cnt, NULL);
        for (j = o; j < o + cnt; j++)   /* sum over steps and ranks of (rank+1)(s+1) + j, over p */
            if (g[j] != ((double)(p * (p + 1) / 2) * 6.0 + 3.0 * (double)p * (double)j) / (double)p) wrong++;
    }
    ok(!bad && !wrong, "[%s p=%d] no_sync for 2 steps, then a synchronised one: the average of the sums (%d "
       "wrong, %d failed calls)", zero ? "ZeRO-1" : "DDP", p, wrong, bad);
    ddp_reducer_destroy(r);
    ddp_comm_destroy(c);
    return 0;
}

/* ----------------------------------------------------------------- hooks */
typedef struct { const unsigned char *lo, *hi; int calls, inside; } hook_seen_t;
static ddp_result_t hook_avg(void *st, ddp_comm_t *c, int b, void *buf, size_t n, ddp_dtype_t dt, ddp_request_t *req) {
    hook_seen_t *h = (hook_seen_t *)st;
    (void)b;
    h->calls++;
    h->inside += (const unsigned char *)buf >= h->lo && (const unsigned char *)buf + n * ddp_dtype_size(dt) <= h->hi;
    return ddp_all_reduce_async(buf, buf, n, dt, DDP_AVG, c, req);
}

static int hooks(int rank, int p, void *arg) {
    static const size_t sz[3] = {1000, 3, 2000};
    static float g[3003];
    ddp_comm_t *c;
    int mode, it;
    (void)arg;
    if (!(c = init_comm(rank, p, 1))) return 1;
    for (mode = 0; mode < 2; mode++) {   /* 0: an async user hook; 1: built-in fp16 compression */
        ddp_reducer_desc_t d;
        ddp_reducer_t *r = NULL;
        hook_seen_t hs;
        double maxrel = 0;
        int bad = 0, nb;
        memset(&d, 0, sizeof d);
        memset(&hs, 0, sizeof hs);
        hs.lo = (const unsigned char *)g;
        hs.hi = (const unsigned char *)(g + 3003);
        d.flat_grads = g;
        d.flat_bytes = sizeof g;
        d.first_bucket_bytes = 1024;
        d.bucket_cap_bytes = 4096;
        if (mode == 0) { d.comm_hook = hook_avg; d.comm_hook_state = &hs; }
        else d.compression = DDP_COMPRESS_FP16;
        if (ddp_reducer_create(&r, c, &d) != DDP_SUCCESS) return 1;
        bad += add_slices(r, g, DDP_FLOAT32, sz, 3, NULL);
        nb = ddp_reducer_num_buckets(r);
        for (it = 0; it < 2; it++) {
            size_t j;
            /* sixteenths: exact sums for the hook; thousandths: not fp16 numbers, so compression shows */
            const double step = mode ? 1e-3 : 1.0 / 16;
            for (j = 0; j < 3003; j++) g[j] = (float)((rank + 1) * (1.0 + (double)(j % 11) * step));
            if (mark_all(r, 3, rank % 2) != DDP_SUCCESS) { bad++; diag("%s", ddp_reducer_last_error(r)); }
            for (j = 0; j < 3003; j++) {
                double want = (double)(p + 1) / 2.0 * (1.0 + (double)(j % 11) * step);
                double rel = fabs(g[j] - want) / want;
                if (rel > maxrel) maxrel = rel;
            }
        }
        if (mode == 0)
            ok(!bad && maxrel == 0 && hs.calls == 2 * nb && hs.inside == hs.calls, "[p=%d] flat mode, async comm_hook: "
               "%d calls for %d buckets x 2, each on a range of the flat buffer (%d), exact averages (max rel %.1e)",
               p, hs.calls, nb, hs.inside, maxrel);
        else
            ok(!bad && maxrel > 0 && maxrel <= 2e-3, "[p=%d] flat mode, fp16 compression: averages within fp16 "
               "precision, and really compressed (max rel %.1e)", p, maxrel);
        ddp_reducer_destroy(r);
    }
    ddp_comm_destroy(c);
    return 0;
}

/* ----------------------------------------------------------------- misuse */
static ddp_result_t hook_nop(void *st, ddp_comm_t *c, int b, void *buf, size_t n, ddp_dtype_t dt, ddp_request_t *req) {
    (void)st; (void)c; (void)b; (void)buf; (void)n; (void)dt; (void)req;
    return DDP_SUCCESS;
}
static int invalid_arg(ddp_comm_t *c) { return strstr(ddp_comm_last_error(c), "[invalid argument]") != NULL; }

static int misuse(int rank, int p, void *arg) {
    static float g[100], w[100];
    static double gd[10];
    ddp_comm_t *c;
    ddp_reducer_t *r = NULL, *plain = NULL;
    ddp_reducer_desc_t d;
    ddp_result_t e;
    float x = 1.0f;
    int k;
    (void)arg;
    if (!(c = init_comm(rank, p, 1))) return 1;
    memset(&d, 0, sizeof d);
    d.flat_grads = g;
    e = ddp_reducer_create(&r, c, &d);
    ok(e == DDP_ERR_INVALID_ARGUMENT && !r && strstr(ddp_comm_last_error(c), "flat_bytes"),
       "flat_grads without flat_bytes -> %s: %s", ddp_strerror(e), ddp_comm_last_error(c));
    d.flat_bytes = sizeof g;
    d.zero_stage = 2;
    e = ddp_reducer_create(&r, c, &d);
    ok(e == DDP_ERR_INVALID_ARGUMENT && t_mentions_int(ddp_comm_last_error(c), 2), "zero_stage 2 -> %s: %s",
       ddp_strerror(e), ddp_comm_last_error(c));
    d.zero_stage = 1;
    d.comm_hook = hook_nop;
    e = ddp_reducer_create(&r, c, &d);
    ok(e == DDP_ERR_INVALID_ARGUMENT && strstr(ddp_comm_last_error(c), "hook"), "ZeRO-1 with a comm_hook -> %s: %s",
       ddp_strerror(e), ddp_comm_last_error(c));
    d.comm_hook = NULL;
    d.compression = DDP_COMPRESS_BF16;
    ok(ddp_reducer_create(&r, c, &d) == DDP_ERR_INVALID_ARGUMENT, "ZeRO-1 with compression -> invalid argument");
    d.compression = DDP_COMPRESS_NONE;
    d.flat_grads = NULL;
    d.flat_bytes = 0;
    e = ddp_reducer_create(&r, c, &d);
    ok(e == DDP_ERR_INVALID_ARGUMENT && strstr(ddp_comm_last_error(c), "flat_grads"),
       "ZeRO-1 without a flat buffer -> %s: %s", ddp_strerror(e), ddp_comm_last_error(c));

    if (!(r = mk(c, g, sizeof g, 0, 0, 1, 0))) return 1;
    ok(ddp_reducer_add_param(r, g + 90, 11, DDP_FLOAT32) == -1 && invalid_arg(c) &&
       strstr(ddp_reducer_last_error(r), "not inside"), "a slice across the end of the buffer -> -1, %s",
       ddp_comm_last_error(c));
    ok(ddp_reducer_add_param(r, g + 100, 1, DDP_FLOAT32) == -1 && invalid_arg(c), "a slice just past the end -> -1");
    ok(ddp_reducer_add_param(r, w, 5, DDP_FLOAT32) == -1 && invalid_arg(c), "a slice of another buffer -> -1");
    ok(ddp_reducer_add_param(r, (void *)((uintptr_t)g - sizeof(float)), 1, DDP_FLOAT32) == -1 && invalid_arg(c),
       "a slice starting before the buffer -> -1");
    ok(ddp_reducer_add_param(r, NULL, 5, DDP_FLOAT32) == -1 && invalid_arg(c) &&
       strstr(ddp_reducer_last_error(r), "NULL"), "a NULL slice -> -1: %s", ddp_reducer_last_error(r));
    ok(ddp_reducer_add_param(r, (unsigned char *)g + 2, 5, DDP_FLOAT32) == -1 && invalid_arg(c) &&
       strstr(ddp_reducer_last_error(r), "element"), "a slice 2 bytes into the buffer -> -1: %s",
       ddp_reducer_last_error(r));
    ok(ddp_reducer_add_param(r, g, 40, DDP_FLOAT32) == 0 && ddp_reducer_add_param(r, g + 40, 60, DDP_FLOAT32) == 1,
       "two slices tiling the buffer");
    ok(ddp_reducer_add_param(r, g + 39, 2, DDP_FLOAT32) == -1 && invalid_arg(c) &&
       t_mentions_int(ddp_reducer_last_error(r), 0) && strstr(ddp_reducer_last_error(r), "overlap"),
       "an overlapping slice -> -1, naming parameter 0: %s", ddp_reducer_last_error(r));
    ok(ddp_reducer_add_param(r, g + 50, 5, DDP_FLOAT32) == -1 && invalid_arg(c) &&
       t_mentions_int(ddp_reducer_last_error(r), 1), "a slice inside another -> -1, naming parameter 1: %s",
       ddp_reducer_last_error(r));
    ok(ddp_reducer_add_param(r, g, 2, DDP_FLOAT64) == -1 && invalid_arg(c) &&
       strstr(ddp_reducer_last_error(r), "float64") && strstr(ddp_reducer_last_error(r), "float32"),
       "a float64 slice in a float32 buffer -> -1: %s", ddp_reducer_last_error(r));
    e = ddp_reducer_all_gather_params(r, NULL, DDP_FLOAT32);
    ok(e == DDP_ERR_INVALID_ARGUMENT, "all_gather_params(NULL) -> %s", ddp_strerror(e));
    for (k = 0; k < 100; k++) g[k] = (float)rank;
    ok(ddp_reducer_grad_ready(r, 1) == DDP_SUCCESS, "grad_ready(1)");
    e = ddp_reducer_all_gather_params(r, w, DDP_FLOAT32);
    ok(e == DDP_ERR_INVALID_USAGE && strstr(ddp_reducer_last_error(r), "iteration"),
       "all_gather_params mid-iteration -> %s: %s", ddp_strerror(e), ddp_reducer_last_error(r));
    e = ddp_reducer_shard(r, 99, NULL, NULL, NULL);
    ok(e == DDP_ERR_INVALID_ARGUMENT && t_mentions_int(ddp_reducer_last_error(r), 99), "shard(99) -> %s: %s",
       ddp_strerror(e), ddp_reducer_last_error(r));
    ok(ddp_reducer_grad_ready(r, 0) == DDP_SUCCESS && ddp_reducer_finish(r) == DDP_SUCCESS &&
       ddp_reducer_all_gather_params(r, w, DDP_FLOAT32) == DDP_SUCCESS, "the iteration still completes");
    ok(ddp_reducer_add_param(r, gd, 1, DDP_FLOAT64) == -1, "add_param after the first iteration -> -1");
    ddp_reducer_destroy(r);

    if (!(r = mk(c, gd, sizeof gd, 0, 0, 0, 0))) return 1;
    ok(ddp_reducer_add_param(r, gd + 2, 3, DDP_FLOAT64) == 0 && ddp_reducer_add_param(r, gd + 5, 5, DDP_FLOAT32) == -1 &&
       invalid_arg(c), "a float32 slice in a float64 buffer (DDP mode) -> -1: %s", ddp_reducer_last_error(r));
    ddp_reducer_destroy(r);

    ok(ddp_reducer_create(&plain, c, NULL) == DDP_SUCCESS && ddp_reducer_add_param(plain, g, 10, DDP_FLOAT32) == 0,
       "a reducer without a flat buffer");
    ok(ddp_reducer_num_shards(plain, NULL) == -1 && strstr(ddp_reducer_last_error(plain), "flat"),
       "num_shards without a flat buffer -> -1: %s", ddp_reducer_last_error(plain));
    e = ddp_reducer_all_gather_params(plain, w, DDP_FLOAT32);
    ok(e == DDP_ERR_INVALID_USAGE && ddp_reducer_shard(plain, 0, NULL, NULL, NULL) == DDP_ERR_INVALID_USAGE,
       "all_gather_params and shard without a flat buffer -> %s", ddp_strerror(e));
    ok(ddp_reducer_num_shards(NULL, NULL) == -1 && ddp_reducer_shard(NULL, 0, NULL, NULL, NULL) == DDP_ERR_INVALID_ARGUMENT &&
       ddp_reducer_all_gather_params(NULL, w, DDP_FLOAT32) == DDP_ERR_INVALID_ARGUMENT, "NULL reducer: refused");
    ddp_reducer_destroy(plain);
    ok(ddp_all_reduce(&x, &x, 1, DDP_FLOAT32, DDP_SUM, c) == DDP_SUCCESS && x == (float)p,
       "the communicator still works after the usage errors");
    ddp_comm_destroy(c);
    return 0;
}

/* ----------------------------------------------------------------- shards */
/* Configurations: single slices of n elements; 7 slices with a gap (two runs) and 256-byte
 * buckets; 100 small slices with 8-byte buckets (a bucket per slice before ZeRO-1 merges the
 * cuts that land on one another: more buckets than the reducer keeps in flight). */
#define NCONF 8
#define MAXSL 100
static const size_t single_n[6] = {1, 2, 3, 7, 1001, 65537};
typedef struct { int ns, runs; size_t n, first, cap, sz[MAXSL], off[MAXSL]; const char *what; } conf_t;
static void conf_get(int cf, conf_t *c) {
    static const size_t sz7[7] = {5, 1, 333, 2, 64, 9, 1000}, off7[7] = {0, 5, 6, 339, 341, 420, 429};
    int k;
    memset(c, 0, sizeof *c);
    c->runs = 1;
    if (cf < 6) {
        c->ns = 1;
        c->n = c->sz[0] = single_n[cf];
        c->what = "one slice";
    } else if (cf == 6) {   /* elements 405..420 are nobody's */
        c->ns = 7;
        for (k = 0; k < 7; k++) { c->sz[k] = sz7[k]; c->off[k] = off7[k]; }
        c->n = 1429;
        c->runs = 2;
        c->first = 64;
        c->cap = 256;
        c->what = "7 slices and a gap";
    } else {
        c->ns = MAXSL;
        for (k = 0; k < MAXSL; k++) { c->sz[k] = (size_t)(k * 5 % 13) + 1; c->off[k] = c->n; c->n += c->sz[k]; }
        c->first = 4;
        c->cap = 8;
        c->what = "100 slices, tiny buckets";
    }
}
static int conf_registered(const conf_t *c, size_t x) {
    int k;
    for (k = 0; k < c->ns; k++) if (x >= c->off[k] && x < c->off[k] + c->sz[k]) return 1;
    return 0;
}
#define MAXSH 1024
typedef struct { int n, nb; size_t elems; size_t off[MAXSH], cnt[MAXSH]; int bad, wrong, gathered_bad; uint64_t hash; } shard_rep_t;

static int shards(int rank, int p, void *arg) {
    shard_rep_t *rep = (shard_rep_t *)arg + (size_t)rank * NCONF;
    ddp_comm_t *c;
    int cf, k;
    if (!(c = init_comm(rank, p, 1))) return 1;
    for (cf = 0; cf < NCONF; cf++) {
        conf_t cfg;
        size_t n, j;
        float *g, *w;
        ddp_reducer_t *r;
        shard_rep_t *s = &rep[cf];
        conf_get(cf, &cfg);
        n = cfg.n;
        g = (float *)calloc(n, sizeof(float));
        w = (float *)calloc(n, sizeof(float));
        if (!(r = mk(c, g, n * sizeof(float), cfg.first, cfg.cap, 1, 0))) return 1;
        for (k = 0; k < cfg.ns; k++) s->bad += ddp_reducer_add_param(r, g + cfg.off[k], cfg.sz[k], DDP_FLOAT32) != k;
        s->n = ddp_reducer_num_shards(r, &s->elems);
        s->nb = ddp_reducer_num_buckets(r);
        if (s->n < 0 || s->n > MAXSH) { s->bad++; s->n = 0; }
        for (k = 0; k < s->n; k++) ddp_reducer_shard(r, k, &s->off[k], &s->cnt[k], NULL);
        /* (rank + 1) + j mod 7: the average (p + 1)/2 + j mod 7 is exact */
        for (j = 0; j < n; j++) g[j] = (float)(rank + 1 + (int)(j % 7));
        if (mark_all(r, cfg.ns, rank % 2) != DDP_SUCCESS) { s->bad++; diag("%s", ddp_reducer_last_error(r)); }
        for (j = 0; j < n; j++) w[j] = -1.0f;
        for (k = 0; k < s->n; k++) {
            size_t x;
            for (x = s->off[k]; x < s->off[k] + s->cnt[k]; x++) {
                if (g[x] != (float)(p + 1) / 2.0f + (float)(x % 7)) s->wrong++;
                w[x] = (float)x * 0.5f + 0.25f;   /* "the updated shard" */
            }
        }
        if (ddp_reducer_all_gather_params(r, w, DDP_FLOAT32) != DDP_SUCCESS) { s->bad++; diag("%s", ddp_reducer_last_error(r)); }
        for (j = 0; j < n; j++)
            if (conf_registered(&cfg, j) ? w[j] != (float)j * 0.5f + 0.25f : w[j] != -1.0f) s->gathered_bad++;
        s->hash = t_hash(w, n * sizeof(float));
        ddp_reducer_destroy(r);
        free(g);
        free(w);
    }
    ddp_comm_destroy(c);
    return 0;
}

static void check_shards(int p, const shard_rep_t *all) {
    int cf, q, k;
    for (cf = 0; cf < NCONF; cf++) {
        conf_t cfg;
        size_t n, j, registered = 0, total = 0, maxe = 0, mine = (size_t)-1;
        unsigned char *seen;
        int twice = 0, outside = 0, stray = 0, bad = 0, wrong = 0, gbad = 0, hash_same = 1;
        conf_get(cf, &cfg);
        n = cfg.n;
        seen = (unsigned char *)calloc(n + 1, 1);
        for (q = 0; q < p; q++) {
            const shard_rep_t *s = &all[(size_t)q * NCONF + cf];
            size_t sum = 0;
            bad += s->bad;
            wrong += s->wrong;
            gbad += s->gathered_bad;
            hash_same &= s->hash == all[cf].hash;
            for (k = 0; k < s->n; k++) {
                sum += s->cnt[k];
                for (j = s->off[k]; j < s->off[k] + s->cnt[k]; j++) {
                    if (j >= n) { outside++; continue; }
                    if (seen[j]++) twice++;
                    if (!conf_registered(&cfg, j)) stray++;
                }
            }
            if (sum != s->elems) bad++;
            total += s->elems;
            if (s->elems > maxe) maxe = s->elems;
            if (s->elems < mine) mine = s->elems;
        }
        for (j = 0; j < n; j++)
            if (conf_registered(&cfg, j)) { registered++; if (!seen[j]) outside++; }
        /* the only imbalance: one element per run's tail */
        ok(!twice && !outside && !stray && total == registered && maxe - mine <= (size_t)cfg.runs &&
           maxe <= (registered + (size_t)p - 1) / (size_t)p + (size_t)cfg.runs - 1,
           "[p=%d %s, %zu elements, %d buckets] shards cover every registered element once (%d twice, %d missed "
           "or outside, %d in a gap); optimizer state per rank %zu..%zu of %zu", p, cfg.what, registered, all[cf].nb,
           twice, outside, stray, mine, maxe, registered);
        ok(!bad && !wrong && !gbad && hash_same, "[p=%d %s, %zu elements] reduce-scatter: exact averages in every "
           "shard (%d wrong); all_gather_params: every rank has every shard, gaps untouched (%d wrong), bitwise "
           "identical on every rank: %s; %d failed calls", p, cfg.what, registered, wrong, gbad,
           hash_same ? "yes" : "NO", bad);
        free(seen);
    }
}

/* ----------------------------------------------------------------- zero (vs replicated AdamW) */
#define NZ 5
static const size_t zsz[NZ] = {4000, 11, 15000, 999, 1};   /* 20,011 */
#define ZN 20011
#define ZSTEPS 6
typedef struct { ddp_dtype_t dt; } zero_arg_t;

/* AdamW on elements [o, o + n) of the flat buffers, state at m + so, v + so (llm.c's update). */
static void adamw(void *w, const void *g, double *m, double *v, size_t o, size_t n, size_t so, ddp_dtype_t dt, int t) {
    const double lr = 1e-2, b1 = 0.9, b2 = 0.999, eps = 1e-8, wd = 0.01;
    size_t j;
    for (j = 0; j < n; j++) {
        double gj = getv(g, dt, o + j), wj = getv(w, dt, o + j);
        double *mj = &m[so + j], *vj = &v[so + j];
        *mj = b1 * *mj + (1 - b1) * gj;
        *vj = b2 * *vj + (1 - b2) * gj * gj;
        setv(w, dt, o + j, wj - lr * ((*mj / (1 - pow(b1, t))) / (sqrt(*vj / (1 - pow(b2, t))) + eps) + wd * wj));
    }
}

/* This rank's gradient at step t: a function of the weights, so the runs feed back. */
static void zgrad(void *g, const void *w, ddp_dtype_t dt, int rank, int t) {
    size_t j;
    for (j = 0; j < ZN; j++) setv(g, dt, j, 0.3 * getv(w, dt, j) + rnd(33 + (uint64_t)t, (uint64_t)rank, j));
}

static int zero(int rank, int p, void *arg) {
    const ddp_dtype_t dt = ((const zero_arg_t *)arg)->dt;
    const size_t es = ddp_dtype_size(dt);
    unsigned char *wr = (unsigned char *)calloc(ZN, es), *gr = (unsigned char *)calloc(ZN, es);
    unsigned char *wz = (unsigned char *)calloc(ZN, es), *gz = (unsigned char *)calloc(ZN, es);
    double *mr = (double *)calloc(ZN, sizeof(double)), *vr = (double *)calloc(ZN, sizeof(double)), *mz, *vz;
    double gmax = 0, wdiff = 0, wscale = 0, tol;
    size_t elems = 0, j, gdiff_n = 0, wdiff_n = 0;
    ddp_comm_t *c;
    ddp_reducer_t *rr, *rz;
    int t, k, ns, bad = 0;
    uint64_t h[2];
    if (!(c = init_comm(rank, p, 1))) return 1;
    rr = mk(c, gr, ZN * es, 4096, 16384, 0, 0);
    rz = mk(c, gz, ZN * es, 4096, 16384, 1, 0);
    if (!rr || !rz) return 1;
    bad += add_slices(rr, gr, dt, zsz, NZ, NULL) + add_slices(rz, gz, dt, zsz, NZ, NULL);
    ns = ddp_reducer_num_shards(rz, &elems);
    mz = (double *)calloc(elems + 1, sizeof(double));
    vz = (double *)calloc(elems + 1, sizeof(double));
    for (j = 0; j < ZN; j++) setv(wr, dt, j, u(5, 0, j));
    memcpy(wz, wr, ZN * es);
    for (t = 1; t <= ZSTEPS; t++) {
        zgrad(gr, wr, dt, rank, t);
        zgrad(gz, wz, dt, rank, t);
        if (t == 1) {   /* the largest contribution of any rank, for the rounding bound */
            for (j = 0; j < ZN; j++) if (fabs(getv(gz, dt, j)) > gmax) gmax = fabs(getv(gz, dt, j));
            if (ddp_all_reduce(&gmax, &gmax, 1, DDP_FLOAT64, DDP_MAX, c) != DDP_SUCCESS) bad++;
        }
        if (mark_all(rr, NZ, 0) != DDP_SUCCESS || mark_all(rz, NZ, rank % 2) != DDP_SUCCESS) bad++;
        for (k = 0; k < ns; k++) {   /* the shard's averaged gradient vs the all-reduced one */
            size_t o, cnt, so;
            ddp_reducer_shard(rz, k, &o, &cnt, &so);
            for (j = o; j < o + cnt; j++) {
                double d = fabs(getv(gz, dt, j) - getv(gr, dt, j));
                if ((t == 1 || p <= 2) && d > 0) gdiff_n++;
                if (t == 1 && d > 2.0 * (p - 1) * eps_of(dt) * gmax) bad++;
            }
            adamw(wz, gz, mz, vz, o, cnt, so, dt, t);
        }
        adamw(wr, gr, mr, vr, 0, ZN, 0, dt, t);   /* replicated: every element on every rank */
        if (ddp_reducer_all_gather_params(rz, wz, dt) != DDP_SUCCESS) { bad++; diag("%s", ddp_reducer_last_error(rz)); }
    }
    for (j = 0; j < ZN; j++) {
        double d = fabs(getv(wz, dt, j) - getv(wr, dt, j));
        if (d > wdiff || d != d) wdiff = d;
        if (d != 0) wdiff_n++;
        if (fabs(getv(wr, dt, j)) > wscale) wscale = fabs(getv(wr, dt, j));
    }
    h[0] = h[1] = t_hash(wz, ZN * es);
    if (ddp_all_reduce(&h[0], &h[0], 1, DDP_UINT64, DDP_MIN, c) != DDP_SUCCESS ||
        ddp_all_reduce(&h[1], &h[1], 1, DDP_UINT64, DDP_MAX, c) != DDP_SUCCESS) bad++;
    tol = p <= 2 ? 0.0 : 1e-5 * wscale;
    ok(!bad && (p > 2 || gdiff_n == 0), "[p=%d %s] the ZeRO-1 shard of the averaged gradient == the all-reduced "
       "one: %s (%zu elements of this rank's shard differ in the last bits%s)", p, ddp_dtype_name(dt),
       p <= 2 ? "bit for bit at every step" : "at step 1 within 2(p-1) eps max|x|", gdiff_n,
       p <= 2 ? "" : " at step 1; later the inputs differ too");
    ok(!bad && wdiff <= tol, "[p=%d %s] after %d AdamW steps: ZeRO-1 parameters == replicated ones %s (max "
       "difference %.2e, %zu of %d elements differ; parameter scale %.2f)", p, ddp_dtype_name(dt), ZSTEPS,
       p <= 2 ? "bit for bit" : "within 1e-5 of their scale", wdiff, wdiff_n, ZN, wscale);
    ok(h[0] == h[1], "[p=%d %s] parameters bitwise identical on every rank after the all-gather", p, ddp_dtype_name(dt));
    ok(elems <= (ZN + (size_t)p - 1) / (size_t)p && elems + 1 >= ZN / (size_t)p,
       "[p=%d %s] optimizer state: %zu of %d elements on this rank (%d shards)", p, ddp_dtype_name(dt), elems, ZN, ns);
    ddp_reducer_destroy(rr);
    ddp_reducer_destroy(rz);
    free(wr); free(gr); free(wz); free(gz); free(mr); free(vr); free(mz); free(vz);
    ddp_comm_destroy(c);
    return 0;
}

/* ----------------------------------------------------------------- device (fake NCCL) */
#define DN 1001
static int device(int rank, int p, void *arg) {
    static const size_t dsz[3] = {600, 1, 400}, doff[3] = {0, 600, 601};
    static float h[DN];
    float *gd = NULL, *wd = NULL;
    void *stream = NULL;
    ddp_comm_t *c;
    int zero, it, k, bad = 0, wrong = 0, gwrong = 0, views = 1;
    const double tol = p == 3 ? 1e-6 : 0.0;
    size_t j;
    (void)arg;
    setenv("FAKE_CUDA_STREAM_DELAY_US", "1000", 1);   /* streams made from now on run late */
    if (!(c = init_comm(rank, p, 1))) return 1;
    t_dev_load();
    if (t_dev_cu.StreamCreateWithFlags(&stream, 1 /* cudaStreamNonBlocking */) != 0 ||
        ddp_comm_set_cuda_stream(c, stream) != DDP_SUCCESS || t_dev_cu.Malloc((void **)&gd, DN * sizeof(float)) != 0 ||
        t_dev_cu.Malloc((void **)&wd, DN * sizeof(float)) != 0) {
        ok(0, "device setup: %s", ddp_comm_last_error(c));
        return 1;
    }
    for (zero = 0; zero < 2; zero++) {
        ddp_reducer_t *r = mk(c, gd, DN * sizeof(float), 64, 256, zero, 1);
        int ns;
        if (!r) return 1;
        for (k = 0; k < 3; k++) bad += ddp_reducer_add_param(r, gd + doff[k], dsz[k], DDP_FLOAT32) != k;
        for (k = 0; k < 3; k++) views &= ddp_reducer_grad(r, k) == (void *)(gd + doff[k]);
        ns = ddp_reducer_num_shards(r, NULL);
        for (it = 0; it < 2; it++) {
            for (j = 0; j < DN; j++) h[j] = (float)(rank + 1 + (int)(j % 5) + it);
            /* cudaMemcpy from pageable memory may return before the data lands (CUDA runtime
             * API, "API synchronization behavior"), and the reducer's stream is non-blocking:
             * it does not wait for the legacy stream the copy runs on. */
            t_dev_cu.Memcpy(gd, h, sizeof h, T_DEV_H2D);
            t_dev_cu.DeviceSynchronize();
            for (k = 2; k >= 0; k--)
                if (!(k == 1 && rank == 1) && ddp_reducer_grad_ready(r, k) != DDP_SUCCESS) bad++;
            if (ddp_reducer_finish(r) != DDP_SUCCESS || ddp_comm_device_synchronize(c) != DDP_SUCCESS) {
                bad++;
                diag("%s", ddp_reducer_last_error(r));
            }
            t_dev_cu.Memcpy(h, gd, sizeof h, T_DEV_D2H);
            for (k = 0; k < ns; k++) {
                size_t o, cnt;
                ddp_reducer_shard(r, k, &o, &cnt, NULL);
                for (j = o; j < o + cnt; j++) {
                    double want = (double)(p * (p + 1) / 2) / p + (double)(j % 5 + (size_t)it);
                    if (j == 600) want = (double)(p * (p + 1) / 2 - 2 + (p - 1) * it) / p;   /* unmarked on rank 1 */
                    if (fabs(h[j] - want) > tol * fabs(want)) wrong++;
                }
            }
        }
        if (zero) {   /* "updated" shards, -1 elsewhere; all_gather_params on the device */
            int s;
            for (j = 0; j < DN; j++) h[j] = -1.0f;
            for (s = 0; s < ns; s++) {
                size_t o, cnt;
                ddp_reducer_shard(r, s, &o, &cnt, NULL);
                for (j = o; j < o + cnt; j++) h[j] = (float)j + 0.5f;
            }
            t_dev_cu.Memcpy(wd, h, sizeof h, T_DEV_H2D);
            t_dev_cu.DeviceSynchronize();   /* as above */
            if (ddp_reducer_all_gather_params(r, wd, DDP_FLOAT32) != DDP_SUCCESS ||
                ddp_comm_device_synchronize(c) != DDP_SUCCESS) {
                bad++;
                diag("%s", ddp_reducer_last_error(r));
            }
            t_dev_cu.Memcpy(h, wd, sizeof h, T_DEV_D2H);
            for (j = 0; j < DN; j++) gwrong += h[j] != (float)j + 0.5f;
        }
        ok(!bad && !wrong && !gwrong && views, "[device p=%d %s] flat device buffer: grad(i) the device slice: %s; "
           "averages in the shards after device_synchronize, the unmarked slice zeroed on the device (%d wrong); "
           "all_gather_params of device parameters (%d wrong); %d failed calls", p, zero ? "ZeRO-1" : "DDP",
           views ? "yes" : "NO", wrong, gwrong, bad);
        ddp_reducer_destroy(r);
    }
    t_dev_cu.Free(gd);
    t_dev_cu.Free(wd);
    ddp_comm_destroy(c);
    return 0;
}

int main(void) {
    static const char *const modes[] = {"tcp", "shm", "rd", "rab", "hier", "hier_ring"};
    const int quick = getenv("DDP_TEST_QUICK") && atoi(getenv("DDP_TEST_QUICK"));
    int m, p, v, d;
    t_init();
    if (t_selected("bitwise")) {
        for (m = 0; m < 6; m++)
            for (p = 1; p <= 5; p++)
                for (d = 0; d < 2; d++) {
                    bitwise_arg_t a;
                    if (quick && (p == 2 || (m > 0 && p == 1))) continue;
                    if (m > 0 && p == 1) continue;   /* one rank: the same as tcp */
                    if (p == 5 && m != 0 && m != 3 && m != 4) continue;   /* odd: the ring, folding, uneven hosts */
                    if (m >= 3 && p == 2) continue;
                    a.dt = d ? DDP_FLOAT64 : DDP_FLOAT32;
                    g_mode = modes[m];
                    g_p = p;
                    diag("--- [%s] flat reducer vs flat all-reduce, p = %d, %s", g_mode, p, ddp_dtype_name(a.dt));
                    ok(t_run_ranks(p, bitwise, &a, 90) == 0, "[%s p=%d] bitwise: every rank exited cleanly", g_mode, p);
                }
        g_mode = "tcp";
    }
    if (t_selected("layout")) {
        for (p = 1; p <= 2; p++) {
            diag("--- layout and gaps, p = %d", p);
            ok(t_run_ranks(p, layout, NULL, 60) == 0, "layout: every rank exited cleanly");
        }
    }
    if (t_selected("unused")) {
        for (v = 3; v >= 0; v--) {
            int a[2];
            a[0] = v & 1;
            a[1] = v >> 1;
            diag("--- unused parameters, %s find_unused, %s", a[0] ? "with" : "without", a[1] ? "ZeRO-1" : "DDP");
            ok(t_run_ranks(3, unused, a, 60) == 0, "unused: every rank exited cleanly");
        }
    }
    if (t_selected("nosync")) {
        for (v = 0; v < 2; v++) {
            diag("--- no_sync accumulation (%s)", v ? "ZeRO-1" : "DDP");
            ok(t_run_ranks(3, nosync, &v, 60) == 0, "nosync: every rank exited cleanly");
        }
    }
    if (t_selected("hooks")) {
        for (p = 2; p <= 3; p++) {
            diag("--- flat mode with a comm hook and with compression, p = %d", p);
            ok(t_run_ranks(p, hooks, NULL, 60) == 0, "hooks: every rank exited cleanly");
        }
    }
    if (t_selected("misuse")) {
        diag("--- misuse");
        ok(t_run_ranks(2, misuse, NULL, 60) == 0, "misuse: every rank exited cleanly");
    }
    if (t_selected("shards")) {
        shard_rep_t *rep = (shard_rep_t *)t_shm_user(sizeof(shard_rep_t) * NCONF * 5);
        for (p = 1; p <= 5; p++) {
            if (quick && (p == 2 || p == 4)) continue;
            memset(rep, 0, sizeof(shard_rep_t) * NCONF * 5);
            diag("--- ZeRO-1 shards, p = %d", p);
            if (ok(t_run_ranks(p, shards, rep, 90) == 0, "shards: every rank exited cleanly")) check_shards(p, rep);
        }
    }
    if (t_selected("zero")) {
        for (p = 1; p <= 4; p++)
            for (d = 0; d < 2; d++) {
                zero_arg_t a;
                if (quick && p == 2) continue;
                a.dt = d ? DDP_FLOAT64 : DDP_FLOAT32;
                diag("--- ZeRO-1 vs replicated AdamW, p = %d, %s", p, ddp_dtype_name(a.dt));
                ok(t_run_ranks(p, zero, &a, 90) == 0, "zero: every rank exited cleanly");
            }
    }
    if (t_selected("device")) {
        if (!t_dev_use_fakes()) {
            ok(1, "# SKIP device: the fake NCCL is not built (make build/fake_nccl/libnccl.so.2)");
        } else {
            for (p = 2; p <= 4; p++) {
                diag("--- device flat buffer (fake NCCL), p = %d", p);
                ok(t_run_ranks(p, device, NULL, 90) == 0, "device: every rank exited cleanly");
            }
            unsetenv("DDP_NCCL");
        }
    }
    return t_done();
}
