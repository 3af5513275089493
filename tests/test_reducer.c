/* SPDX-License-Identifier: MIT (see LICENSE) */
/* tests/test_reducer.c — the gradient bucket reducer (issue 8: PyTorch DDP's Reducer). TAP.
 *
 *   build/test_reducer          (DDP_TEST_ONLY=<scenario> runs one)
 *
 * Scenarios:
 *   layout    one rank: buckets in reverse registration order, the first up to
 *             first_bucket_bytes, the others up to bucket_cap_bytes; one dtype per bucket
 *             (mixed dtypes); the defaults (25 MiB, 1 MiB); add_param closed afterwards.
 *   equiv     a small model (6 tensors, float32 and float64) trained 4 SGD steps through the
 *             reducer equals one process on the global batch (1e-5 relative), replicas
 *             bitwise identical; initial weights made equal by ddp_broadcast_params; ranks
 *             mark gradients in different orders (odd ranks forward, even ranks backward);
 *             copy and gradient_as_bucket_view modes; p = 1..4, over tcp and over shm.
 *   rebuild   first iteration: rank 0 marks in forward order, rank 1 in a scrambled one: no
 *             deadlock, right averages; the buckets are then rebuilt in rank 0's order, the
 *             same on both ranks, once; the bucket views move with their values (view mode).
 *   many      80 buckets (more than the reducer keeps in flight), every rank marking in its
 *             own random order, 3 iterations.
 *   nosync    no_sync over 2 steps, then a synchronised one: equals the gradient of one step
 *             on the 3x larger global batch (copy and view modes).
 *   unused    find_unused: a parameter no rank uses keeps its gradient, one unused on a
 *             single rank gets the average with its zero; without find_unused: every rank's
 *             finish fails naming the missing index, nobody hangs, the next iteration works.
 *   hooks     fp16 and bf16 compression within their precision (and really compressed),
 *             float64 and int32 buckets alongside; a user hook returning async requests with a
 *             done callback, and a synchronous one; each bucket in order.
 *   misuse    NULL, bad index, marking twice, finish twice, set_no_sync mid-iteration,
 *             compression + hook, add_param after close: the right error and message, and
 *             the communicator still works.
 *   bcast     ddp_broadcast_params: mixed dtypes, small (coalesced) and large tensors, root 1.
 */
#define _GNU_SOURCE
#include "ddp.h"
#include "transports/ddp_tcp.h"
#include "transports/ddp_shm.h"
#include "tests/ddp_test.h"

#include <math.h>

static const char *g_mode = "tcp";

static void set_mode(void) {
    unsetenv("DDP_SHM_COLL");
    if (!strcmp(g_mode, "tcp")) setenv("DDP_TRANSPORT", "tcp", 1); else unsetenv("DDP_TRANSPORT");
}

static ddp_comm_t *init_comm(int rank, int p, int quiet) {
    ddp_comm_desc_t d;
    ddp_comm_t *c = NULL;
    ddp_result_t r;
    set_mode();
    t_desc(&d, 20000);
    d.log_level = quiet ? 1 : 0;
    t_where("ddp_comm_init");
    r = ddp_comm_init(&c, p, rank, &d);
    if (!ok(r == DDP_SUCCESS, "[%s] ddp_comm_init rank %d of %d -> %s %s", g_mode, rank, p,
            ddp_strerror(r), r ? ddp_last_init_error() : ""))
        return NULL;
    return c;
}

/* A deterministic value in [-1, 1) for a key. */
static double u(uint64_t a, uint64_t b, uint64_t c) {
    return (double)(t_mix64((a << 40) ^ (b << 20) ^ c) >> 11) / (double)(1ull << 53) * 2.0 - 1.0;
}

static ddp_reducer_t *mk(ddp_comm_t *c, size_t first, size_t cap, int view, int unused) {
    ddp_reducer_desc_t d;
    ddp_reducer_t *r = NULL;
    memset(&d, 0, sizeof d);
    d.first_bucket_bytes = first;
    d.bucket_cap_bytes = cap;
    d.gradient_as_bucket_view = view;
    d.find_unused = unused;
    if (ddp_reducer_create(&r, c, &d) != DDP_SUCCESS) return NULL;
    return r;
}

/* "[3,4] [0,1,2]": the bucket layout as text (compared between ranks through a hash). */
static void layout_str(ddp_reducer_t *r, char *out, size_t cap) {
    int b, k, nb = ddp_reducer_num_buckets(r), ps[256];
    size_t off = 0;
    out[0] = 0;
    for (b = 0; b < nb && off < cap; b++) {
        int n = ddp_reducer_bucket_info(r, b, ps, 256, NULL, NULL);
        off += (size_t)snprintf(out + off, cap - off, "%s[", b ? " " : "");
        for (k = 0; k < n && off < cap; k++) off += (size_t)snprintf(out + off, cap - off, "%s%d", k ? "," : "", ps[k]);
        if (off < cap) off += (size_t)snprintf(out + off, cap - off, "]");
    }
}

/* ----------------------------------------------------------------- layout */
static int layout(int rank, int p, void *arg) {
    ddp_comm_t *c;
    ddp_reducer_t *r;
    static float g[8][100];
    static double gd[2][100];
    static int32_t gi[10];
    char s[512];
    size_t bytes;
    ddp_dtype_t dt;
    int k, ps[16], n;
    (void)arg;
    if (!(c = init_comm(rank, p, 1))) return 1;
    /* 8 x 400 B float32, first 800 B, cap 1200 B: reverse order [7,6] [5,4,3] [2,1,0] */
    r = mk(c, 800, 1200, 0, 0);
    for (k = 0; k < 8; k++) ok(ddp_reducer_add_param(r, g[k], 100, DDP_FLOAT32) == k, "add_param -> %d", k);
    layout_str(r, s, sizeof s);
    ok(!strcmp(s, "[7,6] [5,4,3] [2,1,0]"), "reverse registration order, first bucket 800 B, then 1200 B: %s", s);
    n = ddp_reducer_bucket_info(r, 0, ps, 16, &bytes, &dt);
    ok(n == 2 && bytes == 800 && dt == DDP_FLOAT32, "bucket 0: %d params, %zu bytes, %s", n, bytes, ddp_dtype_name(dt));
    ok(ddp_reducer_bucket_info(r, 3, ps, 16, &bytes, &dt) == -1, "bucket_info of bucket 3 of 3 -> -1");
    ok(ddp_reducer_add_param(r, g[0], 1, DDP_FLOAT32) == -1 && strstr(ddp_reducer_last_error(r), "closed"),
       "add_param after the list closed -> -1: %s", ddp_reducer_last_error(r));
    ddp_reducer_destroy(r);
    /* a parameter bigger than the cap closes a bucket on its own; 5 x 400 B, first 100, cap 1000 */
    r = mk(c, 100, 1000, 1, 0);
    for (k = 0; k < 5; k++) ddp_reducer_add_param(r, NULL, 100, DDP_FLOAT32);
    layout_str(r, s, sizeof s);
    ok(!strcmp(s, "[4] [3,2,1] [0]"), "first bucket of one 400 B parameter (limit 100), then up to 1000 B: %s", s);
    ok(ddp_reducer_grad(r, 4) != NULL && (char *)ddp_reducer_grad(r, 2) == (char *)ddp_reducer_grad(r, 3) + 400 &&
       ((uintptr_t)ddp_reducer_grad(r, 4) & 63) == 0,
       "gradient_as_bucket_view: views inside the buckets, in bucket order, buckets 64-byte aligned");
    ddp_reducer_destroy(r);
    /* mixed dtypes: a bucket holds one dtype. f32 800 B, f64 800 B, f32 400 B, f64 800 B, i32 40 B;
     * first 500, cap 1000. Reverse: i32 opens; f64#3 closes at 800 >= 500 -> bucket 0 {3};
     * f32#2 opens; f64#1 opens (limit now 1000); f32#0: 1200 >= 500 -> bucket 1 {2,0};
     * the open ones in the order they opened: {4} (int32), {1} (float64). */
    r = mk(c, 500, 1000, 0, 0);
    ddp_reducer_add_param(r, g[0], 200, DDP_FLOAT32);
    ddp_reducer_add_param(r, gd[0], 100, DDP_FLOAT64);
    ddp_reducer_add_param(r, g[1], 100, DDP_FLOAT32);
    ddp_reducer_add_param(r, gd[1], 100, DDP_FLOAT64);
    ddp_reducer_add_param(r, gi, 10, DDP_INT32);
    layout_str(r, s, sizeof s);
    ok(!strcmp(s, "[3] [2,0] [4] [1]"), "mixed dtypes: %s", s);
    {
        static const ddp_dtype_t want[4] = {DDP_FLOAT64, DDP_FLOAT32, DDP_INT32, DDP_FLOAT64};
        int b, good = 1;
        for (b = 0; b < 4; b++) { ddp_reducer_bucket_info(r, b, NULL, 0, NULL, &dt); good &= dt == want[b]; }
        ok(good, "each bucket has its parameters' dtype");
    }
    ddp_reducer_destroy(r);
    /* defaults: 3 x 1.2 MB float32: the first bucket closes at 1 MiB, the rest fit 25 MiB */
    {
        float *big = (float *)calloc(3 * 300000, sizeof(float));
        r = mk(c, 0, 0, 0, 0);
        for (k = 0; k < 3; k++) ddp_reducer_add_param(r, big + k * 300000, 300000, DDP_FLOAT32);
        layout_str(r, s, sizeof s);
        ok(!strcmp(s, "[2] [1,0]"), "defaults (first 1 MiB, cap 25 MiB) on 3 x 1.2 MB: %s", s);
        ddp_reducer_destroy(r);
        free(big);
    }
    ddp_comm_destroy(c);
    return 0;
}

/* ----------------------------------------------------------------- the model */
#define NT 6
#define BATCH 8
#define STEPS 4
static const size_t msz[NT] = {37, 700, 3, 2500, 129, 1};
static const ddp_dtype_t mdt[NT] = {DDP_FLOAT32, DDP_FLOAT32, DDP_FLOAT64, DDP_FLOAT32, DDP_FLOAT32, DDP_FLOAT64};

typedef struct { void *w[NT], *g[NT]; } model_t;

static double getv(const void *a, ddp_dtype_t dt, size_t j) {
    return dt == DDP_FLOAT32 ? (double)((const float *)a)[j] : ((const double *)a)[j];
}
static void setv(void *a, ddp_dtype_t dt, size_t j, double v) {
    if (dt == DDP_FLOAT32) ((float *)a)[j] = (float)v; else ((double *)a)[j] = v;
}
static void addv(void *a, ddp_dtype_t dt, size_t j, double v) {
    if (dt == DDP_FLOAT32) ((float *)a)[j] += (float)v; else ((double *)a)[j] += v;
}

static void model_alloc(model_t *m) {
    int t;
    for (t = 0; t < NT; t++) {
        m->w[t] = calloc(msz[t], ddp_dtype_size(mdt[t]));
        m->g[t] = calloc(msz[t], ddp_dtype_size(mdt[t]));
    }
}
static void model_free(model_t *m) {
    int t;
    for (t = 0; t < NT; t++) { free(m->w[t]); free(m->g[t]); }
}
static void model_init(model_t *m, int seed) {
    int t;
    size_t j;
    for (t = 0; t < NT; t++)
        for (j = 0; j < msz[t]; j++) setv(m->w[t], mdt[t], j, 0.1 * u(7, (uint64_t)(seed * 16 + t), j));
}

/* Sample s: features x_t[j] = u(s, t, j), target y = u(s, 99, 0); prediction f = sum <w_t, x_t>
 * (scaled); loss (f - y)^2 / 2. err[k] = f - y of the k-th sample of the list. */
static void forward(const model_t *m, const uint64_t *smp, int n, double *err) {
    int k, t;
    size_t j;
    for (k = 0; k < n; k++) {
        double f = 0;
        for (t = 0; t < NT; t++)
            for (j = 0; j < msz[t]; j++) f += getv(m->w[t], mdt[t], j) * u(smp[k] + 1000, (uint64_t)t, j);
        err[k] = f * 0.05 - u(smp[k] + 1000, 99, 0);
    }
}
/* The mean gradient of tensor t over the samples into g (accumulated onto what g holds). */
static void backward_tensor(int t, void *g, const uint64_t *smp, int n, const double *err, int nmean) {
    int k;
    size_t j;
    for (k = 0; k < n; k++)
        for (j = 0; j < msz[t]; j++) addv(g, mdt[t], j, err[k] * 0.05 * u(smp[k] + 1000, (uint64_t)t, j) / nmean);
}
static void sgd(model_t *m, void *const *g) {
    int t;
    size_t j;
    for (t = 0; t < NT; t++)
        for (j = 0; j < msz[t]; j++) addv(m->w[t], mdt[t], j, -0.5 * getv(g[t], mdt[t], j));
}
static void zero(void *const *g) {
    int t;
    for (t = 0; t < NT; t++) memset(g[t], 0, msz[t] * ddp_dtype_size(mdt[t]));
}
/* max over tensors of max|a - b| / max|b| */
static double rel_diff(void *const *a, void *const *b) {
    double worst = 0;
    int t;
    size_t j;
    for (t = 0; t < NT; t++) {
        double dm = 0, bm = 1e-30;
        for (j = 0; j < msz[t]; j++) {
            double d = fabs(getv(a[t], mdt[t], j) - getv(b[t], mdt[t], j));
            if (d > dm || d != d) dm = d;
            if (fabs(getv(b[t], mdt[t], j)) > bm) bm = fabs(getv(b[t], mdt[t], j));
        }
        if (dm / bm > worst || dm != dm) worst = dm / bm;
    }
    return worst;
}
static uint64_t model_hash(const model_t *m) {
    uint64_t h = 0;
    int t;
    for (t = 0; t < NT; t++) h ^= t_hash(m->w[t], msz[t] * ddp_dtype_size(mdt[t])) + (uint64_t)t;
    return h;
}

/* Global sample ids of rank q's batch at step s, in a world of p ranks. */
static void batch_ids(uint64_t *ids, int s, int q, int p, int n) {
    int k;
    for (k = 0; k < n; k++) ids[k] = (uint64_t)s * (uint64_t)(n * p) + (uint64_t)(q * n + k);
}

/* ----------------------------------------------------------------- equiv */
typedef struct { int view; } equiv_arg_t;
static int equiv(int rank, int p, void *arg) {
    const equiv_arg_t *a = (const equiv_arg_t *)arg;
    ddp_comm_t *c;
    ddp_reducer_t *r;
    model_t m, ref;
    void *gref[NT], *gv[NT];
    uint64_t ids[BATCH * 4], all[BATCH * 4 * 4], h[2];
    double err[BATCH * 4 * 4], rel;
    size_t counts[NT];
    ddp_dtype_t dts[NT];
    int s, t, k, bad = 0;
    if (!(c = init_comm(rank, p, 0))) return 1;
    model_alloc(&m);
    model_alloc(&ref);
    model_init(&m, rank);          /* different on purpose: broadcast_params makes them rank 0's */
    model_init(&ref, 0);
    for (t = 0; t < NT; t++) { counts[t] = msz[t]; dts[t] = mdt[t]; gref[t] = ref.g[t]; }
    ok(ddp_broadcast_params(c, m.w, counts, dts, NT, 0) == DDP_SUCCESS && rel_diff(m.w, ref.w) == 0,
       "[%s p=%d] broadcast_params: rank 0's initial weights everywhere", g_mode, p);
    r = mk(c, 256, 4096, a->view, 0);
    for (t = 0; t < NT; t++)
        if (ddp_reducer_add_param(r, a->view ? NULL : m.g[t], msz[t], mdt[t]) != t) bad++;
    for (s = 0; s < STEPS; s++) {
        t_where("step %d", s);
        for (t = 0; t < NT; t++) gv[t] = ddp_reducer_grad(r, t);   /* views move at the rebuild */
        zero(gv);
        batch_ids(ids, s, rank, p, BATCH);
        forward(&m, ids, BATCH, err);
        for (k = 0; k < NT; k++) {          /* backward: odd ranks mark in forward order */
            t = rank % 2 ? k : NT - 1 - k;
            backward_tensor(t, gv[t], ids, BATCH, err, BATCH);
            if (ddp_reducer_grad_ready(r, t) != DDP_SUCCESS) bad++;
        }
        if (ddp_reducer_finish(r) != DDP_SUCCESS) { bad++; diag("finish: %s", ddp_reducer_last_error(r)); }
        for (t = 0; t < NT; t++) gv[t] = ddp_reducer_grad(r, t);
        sgd(&m, gv);
        /* the reference: one process, the global batch */
        for (k = 0; k < p; k++) batch_ids(all + k * BATCH, s, k, p, BATCH);
        zero(gref);
        forward(&ref, all, BATCH * p, err);
        for (t = 0; t < NT; t++) backward_tensor(t, ref.g[t], all, BATCH * p, err, BATCH * p);
        sgd(&ref, gref);
    }
    rel = rel_diff(m.w, ref.w);
    ok(!bad && rel <= 1e-5, "[%s p=%d %s] %d SGD steps through the reducer = one process on the global "
       "batch: max relative difference %.2e (limit 1e-5), %d failed calls", g_mode, p,
       a->view ? "bucket views" : "copy", STEPS, rel, bad);
    ok(ddp_reducer_rebuilt(r), "[%s p=%d] buckets rebuilt after the first iteration", g_mode, p);
    h[0] = h[1] = model_hash(&m);
    ddp_all_reduce(&h[0], &h[0], 1, DDP_UINT64, DDP_MAX, c);
    ddp_all_reduce(&h[1], &h[1], 1, DDP_UINT64, DDP_MIN, c);
    ok(h[0] == h[1], "[%s p=%d] replicas bitwise identical", g_mode, p);
    ok(ddp_reducer_destroy(r) == DDP_SUCCESS, "reducer destroyed");
    model_free(&m);
    model_free(&ref);
    ddp_comm_destroy(c);
    return 0;
}

/* ----------------------------------------------------------------- rebuild */
static int rebuild(int rank, int p, void *arg) {
    int view = *(const int *)arg;
    static const int scrambled[8] = {3, 1, 4, 0, 5, 2, 7, 6};
    ddp_comm_t *c;
    ddp_reducer_t *r;
    static float g[8][100];
    float *gp[8];
    char s[256];
    uint64_t hs[2];
    int it, k, j, bad = 0;
    if (!(c = init_comm(rank, p, 0))) return 1;
    r = mk(c, 800, 1200, view, 0);
    for (k = 0; k < 8; k++) ddp_reducer_add_param(r, view ? NULL : g[k], 100, DDP_FLOAT32);
    layout_str(r, s, sizeof s);
    ok(!strcmp(s, "[7,6] [5,4,3] [2,1,0]"), "[%s] initial layout %s", view ? "view" : "copy", s);
    for (it = 0; it < 3; it++) {
        ddp_result_t e;
        for (k = 0; k < 8; k++) gp[k] = (float *)ddp_reducer_grad(r, k);
        for (k = 0; k < 8; k++) {
            /* iteration 0: rank 0 forward order, rank 1 scrambled; later: rank 1 forward */
            int q = rank == 0 ? (it == 0 ? k : 7 - k) : it == 0 ? scrambled[k] : k;
            for (j = 0; j < 100; j++) gp[q][j] = (float)((rank + 1) * (q + 1)) + (float)j * 0.25f + (float)it;
            if (ddp_reducer_grad_ready(r, q) != DDP_SUCCESS) bad++;
        }
        e = ddp_reducer_finish(r);
        if (e != DDP_SUCCESS) { bad++; diag("finish: %s: %s", ddp_strerror(e), ddp_reducer_last_error(r)); }
        for (k = 0; k < 8; k++) {
            float *res = (float *)ddp_reducer_grad(r, k);
            for (j = 0; j < 100; j++) {
                float want = (float)(p * (p + 1) / 2 * (k + 1)) / (float)p + (float)j * 0.25f + (float)it;
                if (fabsf(res[j] - want) > 1e-5f * fabsf(want)) bad++;
            }
        }
        if (it == 0) {
            layout_str(r, s, sizeof s);
            ok(ddp_reducer_rebuilt(r) && !strcmp(s, "[0,1] [2,3,4] [5,6,7]"),
               "[%s] after iteration 0: rebuilt in rank 0's order: %s", view ? "view" : "copy", s);
            hs[0] = hs[1] = t_hash(s, strlen(s));
            ddp_all_reduce(&hs[0], &hs[0], 1, DDP_UINT64, DDP_MAX, c);
            ddp_all_reduce(&hs[1], &hs[1], 1, DDP_UINT64, DDP_MIN, c);
            ok(hs[0] == hs[1], "[%s] the same layout on every rank", view ? "view" : "copy");
            if (view) ok(ddp_reducer_grad(r, 0) != (void *)gp[0], "[view] the views moved (the results with them)");
        }
    }
    layout_str(r, s, sizeof s);
    ok(!bad && !strcmp(s, "[0,1] [2,3,4] [5,6,7]"), "[%s] 3 iterations, marked in different orders on the "
       "ranks: right averages, rebuilt once (%s), %d problems", view ? "view" : "copy", s, bad);
    ddp_reducer_destroy(r);
    ddp_comm_destroy(c);
    return 0;
}

/* ----------------------------------------------------------------- many */
#define NMANY 80
static int many(int rank, int p, void *arg) {
    ddp_comm_t *c;
    ddp_reducer_t *r;
    static float g[NMANY][16];
    int perm[NMANY], it, k, j, bad = 0, nb;
    (void)arg;
    if (!(c = init_comm(rank, p, 0))) return 1;
    r = mk(c, 64, 64, 0, 0);
    for (k = 0; k < NMANY; k++) ddp_reducer_add_param(r, g[k], 16, DDP_FLOAT32);
    nb = ddp_reducer_num_buckets(r);
    for (it = 0; it < 3; it++) {
        for (k = 0; k < NMANY; k++) perm[k] = k;
        for (k = NMANY - 1; k > 0; k--) {   /* this rank's own order */
            int x = (int)(t_mix64((uint64_t)(rank * 1000 + it * 100 + k)) % (uint64_t)(k + 1)), tmp = perm[k];
            perm[k] = perm[x];
            perm[x] = tmp;
        }
        for (k = 0; k < NMANY; k++) {
            for (j = 0; j < 16; j++) g[perm[k]][j] = (float)(rank + 1) * (float)(perm[k] + j);
            if (ddp_reducer_grad_ready(r, perm[k]) != DDP_SUCCESS) bad++;
        }
        if (ddp_reducer_finish(r) != DDP_SUCCESS) { bad++; diag("%s", ddp_reducer_last_error(r)); }
        for (k = 0; k < NMANY; k++)
            for (j = 0; j < 16; j++)
                if (g[k][j] != (float)(p + 1) / 2.0f * (float)(k + j)) bad++;
    }
    ok(nb == NMANY && !bad, "%d buckets (more than DDP_MAX_REQUESTS/2 in flight), each rank marking in "
       "its own random order, 3 iterations: right averages (%d problems)", nb, bad);
    ddp_reducer_destroy(r);
    ddp_comm_destroy(c);
    return 0;
}

/* ----------------------------------------------------------------- nosync */
static int nosync(int rank, int p, void *arg) {
    int view = *(const int *)arg;
    ddp_comm_t *c;
    ddp_reducer_t *r;
    model_t m;
    void *gv[NT], *gref[NT];
    uint64_t ids[BATCH], all[3 * BATCH * 4];
    double err[3 * BATCH * 4], rel;
    int s, t, k, bad = 0;
    if (!(c = init_comm(rank, p, 0))) return 1;
    model_alloc(&m);
    model_init(&m, 0);
    for (t = 0; t < NT; t++) gref[t] = calloc(msz[t], ddp_dtype_size(mdt[t]));
    r = mk(c, 256, 4096, view, 0);
    for (t = 0; t < NT; t++) ddp_reducer_add_param(r, view ? NULL : m.g[t], msz[t], mdt[t]);
    for (t = 0; t < NT; t++) gv[t] = ddp_reducer_grad(r, t);
    zero(gv);
    for (s = 0; s < 3; s++) {       /* gradient accumulation: no_sync for the first two */
        if (ddp_reducer_set_no_sync(r, s < 2) != DDP_SUCCESS) bad++;
        batch_ids(ids, s, rank, p, BATCH);
        forward(&m, ids, BATCH, err);
        for (t = NT - 1; t >= 0; t--) {
            backward_tensor(t, gv[t], ids, BATCH, err, BATCH);
            if (ddp_reducer_grad_ready(r, t) != DDP_SUCCESS) bad++;
        }
        if (ddp_reducer_finish(r) != DDP_SUCCESS) bad++;
    }
    for (t = 0; t < NT; t++) {      /* the sum of 3 means: a third of it is the mean over 3x */
        size_t j;
        gv[t] = ddp_reducer_grad(r, t);
        for (j = 0; j < msz[t]; j++) setv(gv[t], mdt[t], j, getv(gv[t], mdt[t], j) / 3);
    }
    for (s = 0; s < 3; s++)
        for (k = 0; k < p; k++) batch_ids(all + (s * p + k) * BATCH, s, k, p, BATCH);
    forward(&m, all, 3 * BATCH * p, err);
    for (t = 0; t < NT; t++) backward_tensor(t, gref[t], all, 3 * BATCH * p, err, 3 * BATCH * p);
    rel = rel_diff(gv, gref);
    ok(!bad && rel <= 1e-5, "[%s] no_sync for 2 steps then a synchronised one = one step on 3x the data: "
       "max relative difference %.2e, %d failed calls", view ? "view" : "copy", rel, bad);
    ddp_reducer_destroy(r);
    for (t = 0; t < NT; t++) free(gref[t]);
    model_free(&m);
    ddp_comm_destroy(c);
    return 0;
}

/* ----------------------------------------------------------------- unused */
static int unused(int rank, int p, void *arg) {
    int find = *(const int *)arg;
    ddp_comm_t *c;
    ddp_reducer_t *r;
    static float g[6][50];
    int it, k, j, bad = 0;
    double t0 = t_now();
    if (!(c = init_comm(rank, p, !find))) return 1;
    r = mk(c, 200, 400, 0, find);
    for (k = 0; k < 6; k++) ddp_reducer_add_param(r, g[k], 50, DDP_FLOAT32);
    for (it = 0; it < 3; it++) {
        ddp_result_t e;
        /* parameter 4: nobody uses it; parameter 2: rank 1 does not (the last iteration of the
         * no-find_unused case marks everything, to show the reducer recovered) */
        int skip_all = !(it == 2 && !find);
        for (k = 0; k < 6; k++)
            for (j = 0; j < 50; j++) g[k][j] = (float)((rank + 1) * (k + 1) + j);
        if (skip_all) for (j = 0; j < 50; j++) g[4][j] = 42.0f;
        for (k = 5; k >= 0; k--) {
            if (skip_all && (k == 4 || (k == 2 && rank == 1))) continue;
            if (ddp_reducer_grad_ready(r, k) != DDP_SUCCESS) bad++;
        }
        e = ddp_reducer_finish(r);
        if (find || !skip_all) {
            int wrong = 0;
            if (e != DDP_SUCCESS) { bad++; diag("finish: %s", ddp_reducer_last_error(r)); }
            for (k = 0; k < 6; k++)
                for (j = 0; j < 50; j++) {
                    float want = (float)(p * (p + 1) / 2 * (k + 1) + p * j) / (float)p;
                    if (skip_all && k == 2) want = (float)((p * (p + 1) / 2 - 2) * (k + 1) + (p - 1) * j) / (float)p;
                    if (skip_all && k == 4) want = 42.0f;
                    if (fabsf(g[k][j] - want) > 1e-5f * fabsf(want)) wrong++;
                }
            if (skip_all)
                ok(!wrong, "find_unused, iteration %d: unused everywhere: gradient untouched; unused on rank 1: "
                   "averaged with its zero; the rest averaged (%d wrong)", it, wrong);
            else
                ok(e == DDP_SUCCESS && !wrong, "without find_unused: after the errors, an iteration marking "
                   "every gradient works (%d wrong)", wrong);
        } else {
            const char *msg = ddp_reducer_last_error(r);
            ok(e == DDP_ERR_INVALID_USAGE && t_mentions_int(msg, 4) && (rank != 1 || t_mentions_int(msg, 2)) &&
               strstr(msg, "find_unused"), "without find_unused, iteration %d: %s: %s", it, ddp_strerror(e), msg);
        }
    }
    ok(!bad, "no failed calls besides the expected ones (%d)", bad);
    ok(t_now() - t0 < 15, "nobody hung (%.1f s)", t_now() - t0);
    ddp_reducer_destroy(r);
    ddp_comm_destroy(c);
    return 0;
}

/* ----------------------------------------------------------------- hooks */
typedef struct { int calls, done, next, order_ok; } hook_state_t;
static ddp_result_t hook_async(void *st, ddp_comm_t *c, int b, void *buf, size_t n, ddp_dtype_t dt,
                               ddp_request_t *req) {
    hook_state_t *s = (hook_state_t *)st;
    if (b != s->next) s->order_ok = 0;
    s->next = b + 1;
    s->calls++;
    return ddp_all_reduce_async(buf, buf, n, dt, DDP_SUM, c, req);
}
static ddp_result_t hook_done(void *st, ddp_comm_t *c, int b, void *buf, size_t n, ddp_dtype_t dt) {
    hook_state_t *s = (hook_state_t *)st;
    size_t i;
    (void)b;
    s->done++;
    if (dt == DDP_FLOAT32) for (i = 0; i < n; i++) ((float *)buf)[i] /= (float)ddp_comm_size(c);
    return DDP_SUCCESS;
}
static ddp_result_t hook_sync(void *st, ddp_comm_t *c, int b, void *buf, size_t n, ddp_dtype_t dt,
                              ddp_request_t *req) {
    hook_state_t *s = (hook_state_t *)st;
    (void)b;
    (void)req;
    s->calls++;
    return ddp_all_reduce(buf, buf, n, dt, DDP_AVG, c);
}

#define NH 4
static int hooks(int rank, int p, void *arg) {
    static const size_t hsz[NH] = {1000, 17, 3000, 500};
    ddp_comm_t *c;
    int mode;
    (void)arg;
    if (!(c = init_comm(rank, p, 0))) return 1;
    for (mode = 0; mode < 4; mode++) {   /* fp16, bf16, async user hook, sync user hook */
        static const char *const names[4] = {"fp16 compression", "bf16 compression", "async user hook",
                                             "synchronous user hook"};
        ddp_reducer_desc_t d;
        ddp_reducer_t *r = NULL;
        hook_state_t hs;
        float *g[NH];
        double *gd = (double *)calloc(200, sizeof(double)), maxerr = 0, maxabs = 0;
        int32_t gi[8];
        int k, it, bad = 0, exact = 1;
        size_t j;
        memset(&d, 0, sizeof d);
        memset(&hs, 0, sizeof hs);
        hs.order_ok = 1;
        d.first_bucket_bytes = 1024;
        d.bucket_cap_bytes = 8192;
        if (mode < 2) d.compression = mode == 0 ? DDP_COMPRESS_FP16 : DDP_COMPRESS_BF16;
        else {
            d.comm_hook = mode == 2 ? hook_async : hook_sync;
            d.comm_hook_done = mode == 2 ? hook_done : NULL;
            d.comm_hook_state = &hs;
        }
        if (ddp_reducer_create(&r, c, &d) != DDP_SUCCESS) { ok(0, "create (%s)", names[mode]); continue; }
        for (k = 0; k < NH; k++) { g[k] = (float *)calloc(hsz[k], sizeof(float)); ddp_reducer_add_param(r, g[k], hsz[k], DDP_FLOAT32); }
        if (mode < 2) {
            ddp_reducer_add_param(r, gd, 200, DDP_FLOAT64);
            ddp_reducer_add_param(r, gi, 8, DDP_INT32);
        }
        for (it = 0; it < 2; it++) {
            hs.next = 0;
            for (k = 0; k < NH; k++)
                for (j = 0; j < hsz[k]; j++) g[k][j] = (float)(u((uint64_t)rank, (uint64_t)(k + 10 * it), j) * (k + 1));
            for (j = 0; j < 200; j++) gd[j] = u((uint64_t)rank, 77, j);
            for (j = 0; j < 8; j++) gi[j] = (rank + 1) * 10 + (int32_t)j;
            for (k = (mode < 2 ? NH + 2 : NH) - 1; k >= 0; k--)
                if (ddp_reducer_grad_ready(r, k) != DDP_SUCCESS) bad++;
            if (ddp_reducer_finish(r) != DDP_SUCCESS) { bad++; diag("finish: %s", ddp_reducer_last_error(r)); }
            for (k = 0; k < NH; k++)
                for (j = 0; j < hsz[k]; j++) {
                    double want = 0;
                    int q;
                    for (q = 0; q < p; q++) want += u((uint64_t)q, (uint64_t)(k + 10 * it), j) * (k + 1);
                    want /= p;
                    if (fabs(want) > maxabs) maxabs = fabs(want);
                    if (fabs(g[k][j] - want) > maxerr) maxerr = fabs(g[k][j] - want);
                    if (g[k][j] != (float)want) exact = 0;
                }
            if (mode < 2) {
                for (j = 0; j < 200; j++) {
                    double want = 0;
                    int q;
                    for (q = 0; q < p; q++) want += u((uint64_t)q, 77, j);
                    if (fabs(gd[j] - want / p) > (mode == 0 ? 4e-3 : 3e-2)) bad++;
                }
                for (j = 0; j < 8; j++) if (gi[j] != (int32_t)(((p + 1) * 10 + 2 * (int)j) / 2)) bad++;
            }
        }
        if (mode < 2) {
            double tol = mode == 0 ? 4e-3 : 3e-2;
            ok(!bad && maxerr <= tol * maxabs && (p == 1 || !exact),
               "[p=%d] %s: max error %.2e of max |avg| %.2f (limit %.0e relative), %s; float64 bucket too, "
               "int32 bucket exact (%d problems)", p, names[mode], maxerr, maxabs, tol,
               exact ? "EXACT (not compressed?)" : "really compressed", bad);
        } else {
            ok(!bad && maxerr <= 1e-6 * maxabs && hs.calls == 2 * ddp_reducer_num_buckets(r) && hs.order_ok &&
               (mode == 3 || hs.done == hs.calls),
               "[p=%d] %s: %d calls for %d buckets x 2 iterations, in bucket order: %s, done %d, max error %.1e",
               p, names[mode], hs.calls, ddp_reducer_num_buckets(r), hs.order_ok ? "yes" : "NO", hs.done, maxerr);
        }
        ddp_reducer_destroy(r);
        for (k = 0; k < NH; k++) free(g[k]);
        free(gd);
    }
    ddp_comm_destroy(c);
    return 0;
}

/* ----------------------------------------------------------------- misuse */
static ddp_result_t hook_nop(void *st, ddp_comm_t *c, int b, void *buf, size_t n, ddp_dtype_t dt,
                             ddp_request_t *req) {
    (void)st; (void)c; (void)b; (void)buf; (void)n; (void)dt; (void)req;
    return DDP_SUCCESS;
}
static int misuse(int rank, int p, void *arg) {
    ddp_comm_t *c;
    ddp_reducer_t *r = NULL;
    ddp_reducer_desc_t d;
    float g[2][10], x = (float)rank;
    ddp_result_t e;
    int k;
    (void)arg;
    if (!(c = init_comm(rank, p, 1))) return 1;
    ok(ddp_reducer_create(NULL, c, NULL) == DDP_ERR_INVALID_ARGUMENT, "create(NULL) -> invalid argument");
    ok(ddp_reducer_create(&r, NULL, NULL) == DDP_ERR_INVALID_ARGUMENT && !r, "create with a NULL comm");
    ok(ddp_reducer_grad_ready(NULL, 0) == DDP_ERR_INVALID_ARGUMENT && ddp_reducer_finish(NULL) == DDP_ERR_INVALID_ARGUMENT &&
       ddp_reducer_set_no_sync(NULL, 1) == DDP_ERR_INVALID_ARGUMENT && ddp_reducer_destroy(NULL) == DDP_ERR_INVALID_ARGUMENT &&
       ddp_reducer_add_param(NULL, g[0], 10, DDP_FLOAT32) == -1 && ddp_reducer_grad(NULL, 0) == NULL &&
       ddp_reducer_num_buckets(NULL) == -1, "NULL reducer: every call refuses");
    memset(&d, 0, sizeof d);
    d.compression = DDP_COMPRESS_FP16;
    d.comm_hook = hook_nop;
    e = ddp_reducer_create(&r, c, &d);
    ok(e == DDP_ERR_INVALID_ARGUMENT && !r, "compression and comm_hook together -> %s: %s", ddp_strerror(e), ddp_comm_last_error(c));
    d.comm_hook = NULL;
    d.compression = (ddp_compress_t)7;
    ok(ddp_reducer_create(&r, c, &d) == DDP_ERR_INVALID_ARGUMENT, "compression 7 -> invalid argument");
    ok(ddp_reducer_create(&r, c, NULL) == DDP_SUCCESS, "create with defaults (NULL desc)");
    e = ddp_reducer_finish(r);
    ok(e == DDP_ERR_INVALID_USAGE && strstr(ddp_reducer_last_error(r), "no parameters"), "finish with no parameters -> %s: %s",
       ddp_strerror(e), ddp_reducer_last_error(r));
    ok(ddp_reducer_add_param(r, NULL, 10, DDP_FLOAT32) == -1, "add_param(NULL grad) without bucket views -> -1: %s", ddp_reducer_last_error(r));
    ok(ddp_reducer_add_param(r, g[0], 10, (ddp_dtype_t)42) == -1, "add_param(bad dtype) -> -1");
    ok(ddp_reducer_add_param(r, g[0], 0, DDP_FLOAT32) == -1, "add_param(count 0) -> -1");
    ok(ddp_reducer_add_param(r, g[0], 10, DDP_FLOAT32) == 0 && ddp_reducer_add_param(r, g[1], 10, DDP_FLOAT32) == 1, "two parameters");
    for (k = -1; k <= 2; k += 3) {
        e = ddp_reducer_grad_ready(r, k);
        ok(e == DDP_ERR_INVALID_ARGUMENT && t_mentions_int(ddp_reducer_last_error(r), k), "grad_ready(%d) -> %s: %s", k,
           ddp_strerror(e), ddp_reducer_last_error(r));
    }
    ok(ddp_reducer_grad(r, 2) == NULL && ddp_reducer_grad(r, 0) == (void *)g[0], "grad(): the registered pointer; NULL for a bad index");
    for (k = 0; k < 10; k++) g[0][k] = g[1][k] = 1.0f;
    ok(ddp_reducer_grad_ready(r, 1) == DDP_SUCCESS, "grad_ready(1)");
    e = ddp_reducer_grad_ready(r, 1);
    ok(e == DDP_ERR_INVALID_USAGE && t_mentions_int(ddp_reducer_last_error(r), 1) && strstr(ddp_reducer_last_error(r), "twice"),
       "marking parameter 1 twice -> %s: %s", ddp_strerror(e), ddp_reducer_last_error(r));
    e = ddp_reducer_set_no_sync(r, 1);
    ok(e == DDP_ERR_INVALID_USAGE, "set_no_sync in the middle of an iteration -> %s: %s", ddp_strerror(e), ddp_reducer_last_error(r));
    ok(ddp_reducer_grad_ready(r, 0) == DDP_SUCCESS && ddp_reducer_finish(r) == DDP_SUCCESS && g[0][0] == 1.0f,
       "the iteration still completes");
    e = ddp_reducer_finish(r);
    ok(e == DDP_ERR_INVALID_USAGE && strstr(ddp_reducer_last_error(r), "twice"), "finish twice -> %s: %s", ddp_strerror(e),
       ddp_reducer_last_error(r));
    ok(strstr(ddp_comm_last_error(c), "reducer") != NULL, "ddp_comm_last_error tells it too: %s", ddp_comm_last_error(c));
    ok(ddp_reducer_add_param(r, g[0], 10, DDP_FLOAT32) == -1, "add_param after the first iteration -> -1");
    ok(ddp_all_reduce(&x, &x, 1, DDP_FLOAT32, DDP_SUM, c) == DDP_SUCCESS && x == (float)(p * (p - 1) / 2),
       "the communicator still works after the usage errors");
    ok(ddp_reducer_grad_ready(r, 0) == DDP_SUCCESS && ddp_reducer_grad_ready(r, 1) == DDP_SUCCESS &&
       ddp_reducer_finish(r) == DDP_SUCCESS, "and so does the reducer");
    ok(ddp_reducer_destroy(r) == DDP_SUCCESS, "destroy");
    ddp_comm_destroy(c);
    return 0;
}

/* ----------------------------------------------------------------- bcast */
static int bcast(int rank, int p, void *arg) {
    enum { NB = 7 };
    static const size_t n[NB] = {5, 1000, 3, 700000, 17, 0, 9};
    static const ddp_dtype_t dt[NB] = {DDP_FLOAT32, DDP_FLOAT32, DDP_FLOAT64, DDP_FLOAT32, DDP_INT32, DDP_FLOAT32, DDP_UINT8};
    void *buf[NB];
    ddp_comm_t *c;
    ddp_result_t e;
    int k, bad = 0;
    size_t j;
    (void)arg;
    if (!(c = init_comm(rank, p, 1))) return 1;
    for (k = 0; k < NB; k++) {
        unsigned char *b = (unsigned char *)malloc(n[k] * ddp_dtype_size(dt[k]) + 1);
        for (j = 0; j < n[k] * ddp_dtype_size(dt[k]); j++) b[j] = (unsigned char)(t_mix64((uint64_t)(rank * 100 + k) * 1000003u + j));
        buf[k] = b;
    }
    e = ddp_broadcast_params(c, buf, n, dt, NB, 1);
    for (k = 0; k < NB; k++)
        for (j = 0; j < n[k] * ddp_dtype_size(dt[k]); j++)
            if (((unsigned char *)buf[k])[j] != (unsigned char)(t_mix64((uint64_t)(100 + k) * 1000003u + j))) { bad++; break; }
    ok(e == DDP_SUCCESS && !bad, "broadcast_params from root 1: 7 tensors (mixed dtypes, an empty one, a 2.8 MB one) "
       "equal root's (%d differ)", bad);
    ok(ddp_broadcast_params(c, NULL, n, dt, 2, 0) == DDP_ERR_INVALID_ARGUMENT, "NULL params -> invalid argument");
    ok(ddp_broadcast_params(NULL, buf, n, dt, 2, 0) == DDP_ERR_INVALID_ARGUMENT, "NULL comm -> invalid argument");
    ok(ddp_broadcast_params(c, buf, n, dt, 0, 0) == DDP_SUCCESS, "zero parameters: nothing to do");
    for (k = 0; k < NB; k++) free(buf[k]);
    ddp_comm_destroy(c);
    return 0;
}

int main(void) {
    static const char *const modes[] = {"tcp", "shm"};
    int m, p, v;
    double t0;
    t_init();
    if (t_selected("layout")) {
        diag("--- bucket layout");
        ok(t_run_ranks(1, layout, NULL, 60) == 0, "layout: clean exit");
    }
    if (t_selected("equiv")) {
        for (m = 0; m < 2; m++) {
            g_mode = modes[m];
            for (p = 1; p <= 4; p++) {
                equiv_arg_t a;
                a.view = (p + m) % 2;     /* both modes on both transports */
                diag("--- [%s] equivalence with one process, p = %d, %s", g_mode, p, a.view ? "bucket views" : "copy");
                t0 = t_now();
                ok(t_run_ranks(p, equiv, &a, 60) == 0, "[%s p=%d] every rank exited cleanly (%.1f s)", g_mode, p, t_now() - t0);
            }
        }
    }
    g_mode = "tcp";
    if (t_selected("rebuild")) {
        for (v = 0; v < 2; v++) {
            diag("--- rebuild after the first iteration (%s)", v ? "bucket views" : "copy");
            ok(t_run_ranks(2, rebuild, &v, 60) == 0, "rebuild: every rank exited cleanly");
        }
    }
    if (t_selected("many")) {
        g_mode = "shm";
        diag("--- [shm] 80 buckets, random marking orders, p = 3");
        ok(t_run_ranks(3, many, NULL, 60) == 0, "many: every rank exited cleanly");
        g_mode = "tcp";
    }
    if (t_selected("nosync")) {
        for (v = 0; v < 2; v++) {
            diag("--- no_sync accumulation (%s)", v ? "bucket views" : "copy");
            ok(t_run_ranks(2 + v, nosync, &v, 60) == 0, "nosync: every rank exited cleanly");
        }
    }
    if (t_selected("unused")) {
        for (v = 1; v >= 0; v--) {
            diag("--- unused parameters, %s find_unused", v ? "with" : "without");
            ok(t_run_ranks(3, unused, &v, 60) == 0, "unused: every rank exited cleanly");
        }
    }
    if (t_selected("hooks")) {
        for (p = 1; p <= 3; p += 2) {
            diag("--- communication hooks, p = %d", p);
            ok(t_run_ranks(p, hooks, NULL, 60) == 0, "hooks: every rank exited cleanly");
        }
    }
    if (t_selected("misuse")) {
        diag("--- misuse");
        ok(t_run_ranks(2, misuse, NULL, 60) == 0, "misuse: every rank exited cleanly");
    }
    if (t_selected("bcast")) {
        diag("--- broadcast_params");
        ok(t_run_ranks(3, bcast, NULL, 60) == 0, "bcast: every rank exited cleanly");
    }
    return t_done();
}
