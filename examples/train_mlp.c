/* SPDX-License-Identifier: MIT (see LICENSE) */
/* train_mlp.c — data-parallel SGD for a small MLP with libddp, checked against one process.
 *
 * What DistributedDataParallel promises, shown end to end: N ranks each hold a replica of an
 * MLP (32 -> 64 -> 64 -> 10, tanh (dense() says why not ReLU), softmax cross-entropy, 6922
 * parameters) and train it by SGD on their own shard of a synthetic 10-class dataset (8192
 * points, generated identically by every rank from a seed). Per step each rank computes the
 * mean gradient over its batch into one flat buffer (all parameters' gradients contiguous), and
 * the gradient bucket reducer (ddp_reducer_*, PyTorch DDP's Reducer) averages it across ranks:
 * the six tensors are registered in forward order, backward runs layer by layer and marks each
 * tensor's gradient ready as soon as it is final, so the all-reduce of the last layers' bucket
 * runs while the first layer's gradient is still being computed; ddp_reducer_finish waits for
 * the rest before the SGD step, and every replica takes the same step.
 * Shards come from ddp_sampler.h, PyTorch's DistributedSampler (shuffle, set_epoch every epoch,
 * drop_last = 0: padded with duplicates when the world size does not divide 8192). Rank 0's
 * initial weights are broadcast first (ddp_broadcast_params), as DDP does at construction.
 *
 * Rank 0 prints loss, accuracy (over all ranks' samples) and throughput per epoch, then checks:
 *   1. the replicas are bitwise identical (a hash of every rank's weights, all-reduced with MAX
 *      and MIN: equal only if every rank has the same bits);
 *   2. they equal the weights of a single-process run with the same global batch — rank 0
 *      replays the whole training alone, each step on the union of every rank's batch, computed
 *      by calling the sampler for every rank id — to 1e-5 relative (see weights_rel_diff);
 *   3. the model learned (final epoch accuracy >= 80%), so the check above is not vacuous.
 * and prints "train_mlp: PASS" (exit 0) or "train_mlp: FAIL" (exit 1).
 *
 * Run: make demo (4 ranks via build/ddprun), or build/ddprun -n N build/train_mlp for any N,
 * or under torchrun/mpirun/srun (ddp_comm_init_env reads their variables). No arguments.
 *
 * PowerSGD: DDP_POWERSGD_RANK=r (r >= 1) compresses the gradients with ddp_powersgd.h (rank-r
 * approximation of W1, W2 and W3 viewed as their [out][in] matrices, error feedback, warm start;
 * the biases go uncompressed), from step DDP_POWERSGD_START (default 10; PyTorch's default, 1000,
 * would leave most of this short run uncompressed). The run is then no longer equal to the
 * uncompressed reference, so check 2 is skipped: the replicas must still be bitwise identical
 * and the model must still learn (checks 1 and 3), and rank 0 prints how many gradient elements
 * went into the all-reduces per step against the uncompressed count. bench/powersgd_bench.sh
 * compares the loss curves with uncompressed training.
 *
 * TEST HOOK: DDP_DEMO_SKIP_ALLREDUCE=1 gives the reducer a communication hook that does nothing,
 * so the gradients are not all-reduced and each rank trains on its own shard alone; the checks
 * must then print FAIL and exit non-zero (tests/test_demo.sh).
 */
#ifndef _GNU_SOURCE /* g++ defines it already */
#define _GNU_SOURCE
#endif
#define DDP_IMPLEMENTATION
#include "ddp.h"
#include "ddp_sampler.h"
#include "transports/ddp_tcp.h"
#include "transports/ddp_shm.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { IN = 32, H1 = 64, H2 = 64, OUT = 10, CLUSTERS_PER_CLASS = 3, SAMPLES = 8192, BATCH = 32,
       EPOCHS = 8 };
#define LR 0.1f
#define SAMPLER_SEED 42
#define REL_TOL 1e-5
#define MIN_ACCURACY 0.80

/* ---------------------------------------------------------------- parameters, one flat array */
/* Weights are [out][in], row-major; every tensor is a view into one array, so the gradient is
 * one buffer too and a step needs one all-reduce. */
enum {
    OFF_W1 = 0, OFF_B1 = OFF_W1 + H1 * IN,
    OFF_W2 = OFF_B1 + H1, OFF_B2 = OFF_W2 + H2 * H1,
    OFF_W3 = OFF_B2 + H2, OFF_B3 = OFF_W3 + OUT * H2,
    NPARAM = OFF_B3 + OUT
};
static const struct { const char *name; int off, len; } tensors[] = {
    {"W1", OFF_W1, H1 * IN}, {"b1", OFF_B1, H1}, {"W2", OFF_W2, H2 * H1},
    {"b2", OFF_B2, H2},      {"W3", OFF_W3, OUT * H2}, {"b3", OFF_B3, OUT},
};
#define NTENSORS ((int)(sizeof tensors / sizeof tensors[0]))

/* ---------------------------------------------------------------- deterministic randomness */
/* splitmix64 of a key: every value below is a pure function of its key, so every rank (and the
 * reference) generates the same dataset without talking, and no libm call is involved. */
static uint64_t mix(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}
/* ~N(0, 1): the sum of four 16-bit uniforms (Irwin-Hall), centred and scaled to unit variance. */
static float gauss(uint64_t key) {
    uint64_t h = mix(key);
    double s = 0;
    int t;
    for (t = 0; t < 4; t++) s += (double)((h >> (16 * t)) & 0xffff) / 65536.0;
    return (float)((s - 2.0) * 1.7320508075688772);
}
static uint64_t key(uint64_t stream, uint64_t i, uint64_t j) { return (stream << 48) ^ (i << 16) ^ j; }

/* Class c is the union of CLUSTERS_PER_CLASS Gaussian clusters (unit variance, centres drawn
 * from N(0, 1) per coordinate too): not linearly separable, so the hidden layers have something
 * to do, and overlapping enough that accuracy climbs over several epochs. */
static void make_dataset(float *x, int *label) {
    float centre[OUT * CLUSTERS_PER_CLASS][IN];
    int c, j;
    size_t i;
    for (c = 0; c < OUT * CLUSTERS_PER_CLASS; c++)
        for (j = 0; j < IN; j++) centre[c][j] = gauss(key(1, (uint64_t)c, (uint64_t)j));
    for (i = 0; i < SAMPLES; i++) {
        uint64_t h = mix(key(2, i, 0));
        int cl = (int)(h % (OUT * CLUSTERS_PER_CLASS));
        label[i] = cl % OUT;
        for (j = 0; j < IN; j++) x[i * IN + (size_t)j] = centre[cl][j] + gauss(key(3, i, (uint64_t)j));
    }
}

/* LeCun initialisation (variance 1 / fan_in, the usual one for tanh); biases 0. */
static void init_params(float *p, uint64_t seed) {
    int k;
    memset(p, 0, sizeof(float) * NPARAM);
    for (k = 0; k < H1 * IN; k++) p[OFF_W1 + k] = gauss(key(4, seed, (uint64_t)k)) * sqrtf(1.0f / IN);
    for (k = 0; k < H2 * H1; k++) p[OFF_W2 + k] = gauss(key(5, seed, (uint64_t)k)) * sqrtf(1.0f / H1);
    for (k = 0; k < OUT * H2; k++) p[OFF_W3 + k] = gauss(key(6, seed, (uint64_t)k)) * sqrtf(1.0f / H2);
}

/* ---------------------------------------------------------------- the model */
/* tanh, not ReLU: the check below compares two float computations that round differently, and
 * it needs training to be a smooth function of those last-bit differences. ReLU's derivative
 * jumps at 0: a last-bit difference that moves one of the ~8 million pre-activations of a run
 * across 0 changes that sample's gradient by a finite amount, and the runs part for good (a ReLU
 * version of this demo ended 8e-2 from its reference on 2 ranks and 9e-7 on 4, depending on
 * whether such a crossing happened). With tanh they stay within ~1e-6 on 1 to 8 ranks. */
static void dense(const float *w, const float *b, const float *in, int nin, float *out, int nout,
                  int act) {
    int o, i;
    for (o = 0; o < nout; o++) {
        float a = b[o];
        for (i = 0; i < nin; i++) a += w[o * nin + i] * in[i];
        out[o] = act ? tanhf(a) : a;
    }
}
/* g[o][i] += d[o] * in[i], gb[o] += d[o] */
static void outer_acc(float *g, float *gb, const float *d, const float *in, int nin, int nout) {
    int o, i;
    for (o = 0; o < nout; o++) {
        for (i = 0; i < nin; i++) g[o * nin + i] += d[o] * in[i];
        gb[o] += d[o];
    }
}
/* din[i] = sum_o w[o][i] * d[o], times tanh'(a) = 1 - h^2 of the layer's output h */
static void back_tanh(const float *w, const float *d, const float *h, int nin, int nout, float *din) {
    int o, i;
    for (i = 0; i < nin; i++) din[i] = 0;
    for (o = 0; o < nout; o++)
        for (i = 0; i < nin; i++) din[i] += w[o * nin + i] * d[o];
    for (i = 0; i < nin; i++)
        din[i] *= 1 - h[i] * h[i];
}

/* Activations and deltas of a whole batch, so that backward can go layer by layer (as autograd
 * does) and each layer's gradient is complete, over the whole batch, before the layer below is
 * touched: that is when DDP can start reducing it. Sized for the largest batch (the reference's
 * global one); allocated once. */
typedef struct { float *h1, *h2, *d3, *d2, *d1; } workspace_t;
static int workspace_alloc(workspace_t *w, size_t n) {
    w->h1 = (float *)malloc(sizeof(float) * H1 * n);
    w->h2 = (float *)malloc(sizeof(float) * H2 * n);
    w->d3 = (float *)malloc(sizeof(float) * OUT * n);
    w->d2 = (float *)malloc(sizeof(float) * H2 * n);
    w->d1 = (float *)malloc(sizeof(float) * H1 * n);
    return w->h1 && w->h2 && w->d3 && w->d2 && w->d1 ? 0 : -1;
}
static void workspace_free(workspace_t *w) { free(w->h1), free(w->h2), free(w->d3), free(w->d2), free(w->d1); }

/* Called by backward as soon as tensor t's gradient is final (the reducer's grad_ready). */
typedef int (*grad_ready_fn)(int tensor, void *ctx);

/* The mean gradient of the cross-entropy over the n samples idx[0..n) into g (NPARAM floats);
 * adds the loss sum and the number of correct predictions to stats[0] and stats[1]. Backward
 * runs layer by layer over the whole batch (W3/b3, then W2/b2, then W1/b1) and reports each
 * finished tensor to ready (may be NULL); every gradient element is still summed over the
 * samples in the same order, then divided by n, so the numbers are those of a per-sample loop.
 * Returns 0, or the first non-zero value ready returned. */
static int batch_grad(const float *p, const float *data, const int *label, const uint64_t *idx,
                      uint64_t n, float *g, double *stats, const workspace_t *w, grad_ready_fn ready,
                      void *ctx) {
    uint64_t k;
    int o, t, rc;
    memset(g, 0, sizeof(float) * NPARAM);
    for (k = 0; k < n; k++) {   /* forward, and the loss gradient at the output */
        const float *x = data + idx[k] * IN;
        float *h1 = w->h1 + k * H1, *h2 = w->h2 + k * H2, *d3 = w->d3 + k * OUT, z[OUT];
        int y = label[idx[k]], best = 0;
        float m, s = 0, lse;
        dense(p + OFF_W1, p + OFF_B1, x, IN, h1, H1, 1);
        dense(p + OFF_W2, p + OFF_B2, h1, H1, h2, H2, 1);
        dense(p + OFF_W3, p + OFF_B3, h2, H2, z, OUT, 0);
        for (o = 1; o < OUT; o++)
            if (z[o] > z[best]) best = o;
        m = z[best];
        for (o = 0; o < OUT; o++) s += expf(z[o] - m);
        lse = m + logf(s);
        stats[0] += lse - z[y];
        stats[1] += best == y;
        for (o = 0; o < OUT; o++) d3[o] = expf(z[o] - lse) - (o == y ? 1.0f : 0.0f);
    }
    /* layer 3 */
    for (k = 0; k < n; k++) {
        outer_acc(g + OFF_W3, g + OFF_B3, w->d3 + k * OUT, w->h2 + k * H2, H2, OUT);
        back_tanh(p + OFF_W3, w->d3 + k * OUT, w->h2 + k * H2, H2, OUT, w->d2 + k * H2);
    }
    for (o = OFF_W3; o < OFF_B3 + OUT; o++) g[o] /= (float)n;
    if (ready) /* b3, W3: the reverse of registration order, as autograd produces them */
        for (t = 5; t >= 4; t--)
            if ((rc = ready(t, ctx)) != 0) return rc;
    /* layer 2 */
    for (k = 0; k < n; k++) {
        outer_acc(g + OFF_W2, g + OFF_B2, w->d2 + k * H2, w->h1 + k * H1, H1, H2);
        back_tanh(p + OFF_W2, w->d2 + k * H2, w->h1 + k * H1, H1, H2, w->d1 + k * H1);
    }
    for (o = OFF_W2; o < OFF_B2 + H2; o++) g[o] /= (float)n;
    if (ready)
        for (t = 3; t >= 2; t--)
            if ((rc = ready(t, ctx)) != 0) return rc;
    /* layer 1 */
    for (k = 0; k < n; k++)
        outer_acc(g + OFF_W1, g + OFF_B1, w->d1 + k * H1, data + idx[k] * IN, IN, H1);
    for (o = OFF_W1; o < OFF_B1 + H1; o++) g[o] /= (float)n;
    if (ready)
        for (t = 1; t >= 0; t--)
            if ((rc = ready(t, ctx)) != 0) return rc;
    return 0;
}

static void sgd_step(float *p, const float *g) {
    int k;
    for (k = 0; k < NPARAM; k++) p[k] -= LR * g[k];
}

/* ---------------------------------------------------------------- the single-process reference */
/* One process replays the data-parallel training of a world of `world` ranks: per step s the
 * global batch is the concatenation of every rank's s-th batch (each rank's sampler, computed
 * here for every rank id), padding duplicates included, and the gradient is the mean over that
 * global batch. This is what the ranks compute: DDP averages per-rank means (DDP_AVG), which
 * equals the global mean only when every rank's s-th batch has the same length. It does here:
 * without drop_last every rank's shard has ceil(SAMPLES / world) entries (the padding exists to
 * make that so) and all use the same batch size, so even the short last batch of an epoch is
 * equally short everywhere. The loop below checks it rather than assume it. Returns 0, or -1
 * on an error (printed). */
static int reference_run(float *p, int world, const float *data, const int *label) {
    ddp_sampler_t *smp = (ddp_sampler_t *)calloc((size_t)world, sizeof *smp);
    ddp_batch_iter_t *it = (ddp_batch_iter_t *)calloc((size_t)world, sizeof *it);
    uint64_t nsamp = 0, *idx = NULL, *global = NULL;
    float *g = (float *)malloc(sizeof(float) * NPARAM);
    double stats[2] = {0, 0}; /* batch_grad's loss and accuracy sums, unused here */
    workspace_t ws;
    int q, epoch, rc = -1;
    if (workspace_alloc(&ws, (size_t)BATCH * (size_t)world) != 0 || !smp || !it || !g) goto out;
    for (q = 0; q < world; q++)
        if (ddp_sampler_init(&smp[q], SAMPLES, world, q, 1, SAMPLER_SEED, 0) != DDP_SUCCESS) {
            fprintf(stderr, "train_mlp: reference sampler: %s\n", ddp_sampler_last_error(&smp[q]));
            goto out;
        }
    nsamp = ddp_sampler_num_samples(&smp[0]);
    idx = (uint64_t *)malloc(sizeof *idx * nsamp * (size_t)world);
    global = (uint64_t *)malloc(sizeof *global * BATCH * (size_t)world);
    if (!idx || !global) goto out;
    for (epoch = 0; epoch < EPOCHS; epoch++) {
        for (q = 0; q < world; q++) {
            ddp_sampler_set_epoch(&smp[q], (uint64_t)epoch);
            if (ddp_sampler_indices(&smp[q], idx + nsamp * (size_t)q) != DDP_SUCCESS ||
                ddp_batch_iter_init(&it[q], idx + nsamp * (size_t)q, nsamp, BATCH, 0) != DDP_SUCCESS)
                goto out;
        }
        for (;;) {
            const uint64_t *b;
            uint64_t len = ddp_batch_iter_next(&it[0], &b), n = len;
            if (len == 0) break;
            memcpy(global, b, sizeof *b * len);
            for (q = 1; q < world; q++) {
                if (ddp_batch_iter_next(&it[q], &b) != len) {
                    fprintf(stderr, "train_mlp: reference: rank %d's batch is not %llu long\n", q,
                            (unsigned long long)len);
                    goto out;
                }
                memcpy(global + n, b, sizeof *b * len);
                n += len;
            }
            batch_grad(p, data, label, global, n, g, stats, &ws, NULL, NULL);
            sgd_step(p, g);
        }
    }
    rc = 0;
out:
    if (rc) fprintf(stderr, "train_mlp: reference run failed\n");
    free(smp);
    free(it);
    free(idx);
    free(global);
    free(g);
    workspace_free(&ws);
    return rc;
}

/* How far the data-parallel weights a are from the reference b. Per tensor, the largest
 * absolute difference over the tensor's largest magnitude, max|a - b| / max|b|; the result is
 * the worst tensor's. Norm-wise rather than per weight: float sums in a different order (a
 * rank's batch, then the ring's order across ranks, against one sum over the global batch)
 * differ in the last bits, and SGD carries those differences along; on a weight that happens to
 * be near 0 they would be a large fraction of the weight itself while being as small as
 * anywhere else on the scale of the tensor, which is the scale that matters. Per tensor so a
 * small-valued tensor (a bias) is not judged on the scale of the large ones. */
static double weights_rel_diff(const float *a, const float *b, int *worst) {
    double rel = 0;
    int t, k;
    *worst = 0;
    for (t = 0; t < NTENSORS; t++) {
        double dmax = 0, bmax = 1e-30, r;
        for (k = tensors[t].off; k < tensors[t].off + tensors[t].len; k++) {
            double d = fabs((double)a[k] - (double)b[k]);
            if (d > dmax || d != d) dmax = d; /* a NaN must fail, not compare false */
            if (fabs((double)b[k]) > bmax) bmax = fabs((double)b[k]);
        }
        r = dmax / bmax;
        if (r > rel || r != r) { rel = r; *worst = t; }
    }
    return rel;
}

/* FNV-1a over the weights' bytes: equal hashes on every rank <=> (in practice) equal bits. */
static uint64_t weights_hash(const float *p) {
    const unsigned char *b = (const unsigned char *)p;
    uint64_t h = 0xcbf29ce484222325ull;
    size_t i;
    for (i = 0; i < sizeof(float) * NPARAM; i++) h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* The demo's buckets: 27.7 KB of gradients would fit one bucket of DDP's default 25 MiB, so
 * the caps are scaled down with the model (first 4 KiB, then 16 KiB): two buckets, {b3 W3 b2
 * W2} reduced while layer 1's gradient is computed, then {b1 W1}. */
#define FIRST_BUCKET_BYTES (4u << 10)
#define BUCKET_CAP_BYTES (16u << 10)

/* batch_grad's grad_ready_fn: hand the finished tensor to the reducer. */
static int mark_ready(int tensor, void *reducer) {
    return ddp_reducer_grad_ready((ddp_reducer_t *)reducer, tensor) != DDP_SUCCESS;
}

/* DDP_DEMO_SKIP_ALLREDUCE: a communication hook that leaves each bucket as it is (local). */
static ddp_result_t skip_hook(void *state, ddp_comm_t *c, int bucket, void *buf, size_t count,
                              ddp_dtype_t dtype, ddp_request_t *req) {
    (void)state, (void)c, (void)bucket, (void)buf, (void)count, (void)dtype, (void)req;
    return DDP_SUCCESS;
}

static void print_buckets(ddp_reducer_t *r, const char *when) {
    int b, k, n, nb = ddp_reducer_num_buckets(r), ps[NTENSORS];
    printf("train_mlp: gradient buckets %s:", when);
    for (b = 0; b < nb; b++) {
        n = ddp_reducer_bucket_info(r, b, ps, NTENSORS, NULL, NULL);
        printf(" {");
        for (k = 0; k < n; k++) printf("%s%s", k ? " " : "", tensors[ps[k]].name);
        printf("}");
    }
    printf("\n");
}

/* DDP_POWERSGD_RANK / DDP_POWERSGD_START: a whole number >= lo, or def when unset; -1 if bad. */
static int env_int(const char *name, int def, int lo) {
    const char *v = getenv(name);
    char *end;
    long x;
    if (!v || !*v) return def;
    x = strtol(v, &end, 10);
    if (*end || x < lo || x > 1000000) {
        fprintf(stderr, "train_mlp: %s=%s: want a whole number >= %d\n", name, v, lo);
        return -1;
    }
    return (int)x;
}

static int comm_fail(const char *what, ddp_comm_t *c) {
    fprintf(stderr, "train_mlp: %s failed: %s\n", what, c ? ddp_comm_last_error(c) : ddp_last_init_error());
    if (c) ddp_comm_destroy(c);
    return 1;
}

int main(int argc, char **argv) {
    ddp_comm_t *comm;
    ddp_reducer_t *reducer;
    ddp_reducer_desc_t rdesc;
    workspace_t ws;
    void *views[NTENSORS];
    size_t counts[NTENSORS];
    ddp_dtype_t dtypes[NTENSORS];
    int t;
    ddp_sampler_t smp;
    ddp_batch_iter_t it;
    float *data, *p, *p0, *g;
    int *label, rank, world, epoch, worst = 0;
    uint64_t nsamp, *idx, hash[2];
    double stats[3], acc = 0, t_train = 0, t_ref, rel = 0;
    const char *skip_env = getenv("DDP_DEMO_SKIP_ALLREDUCE");
    int skip_allreduce = skip_env && *skip_env && strcmp(skip_env, "0") != 0;
    int identical, pass;
    int psgd_rank = env_int("DDP_POWERSGD_RANK", 0, 0), psgd_start = env_int("DDP_POWERSGD_START", 10, 2);
    ddp_powersgd_t *psgd = NULL;
    ddp_powersgd_stats_t pst;

    if (argc > 1) {
        fprintf(stderr, "usage: ddprun -n NPROC %s   (no arguments; see the comment at the top of "
                        "examples/train_mlp.c)\n", argv[0]);
        return 2;
    }
    if (psgd_rank < 0 || psgd_start < 0) return 2;
    if (skip_allreduce) psgd_rank = 0; /* the test hook replaces every communication hook */
    if (ddp_comm_init_env(&comm, NULL) != DDP_SUCCESS) return comm_fail("ddp_comm_init_env", NULL);
    rank = ddp_comm_rank(comm);
    world = ddp_comm_size(comm);

    data = (float *)malloc(sizeof(float) * SAMPLES * IN);
    label = (int *)malloc(sizeof(int) * SAMPLES);
    p = (float *)malloc(sizeof(float) * NPARAM);
    p0 = (float *)malloc(sizeof(float) * NPARAM);
    g = (float *)malloc(sizeof(float) * NPARAM);
    if (ddp_sampler_init(&smp, SAMPLES, world, rank, 1, SAMPLER_SEED, 0) != DDP_SUCCESS) {
        fprintf(stderr, "train_mlp: sampler: %s\n", ddp_sampler_last_error(&smp));
        return 1;
    }
    nsamp = ddp_sampler_num_samples(&smp);
    idx = (uint64_t *)malloc(sizeof *idx * nsamp);
    if (!data || !label || !p || !p0 || !g || !idx || workspace_alloc(&ws, BATCH) != 0) {
        fprintf(stderr, "train_mlp: out of memory\n");
        return 1;
    }
    make_dataset(data, label);

    /* Different initial weights per rank on purpose: the broadcast must make them one. */
    init_params(p, 1000 + (uint64_t)rank);
    for (t = 0; t < NTENSORS; t++) {
        views[t] = p + tensors[t].off;
        counts[t] = (size_t)tensors[t].len;
        dtypes[t] = DDP_FLOAT32;
    }
    if (ddp_broadcast_params(comm, views, counts, dtypes, NTENSORS, 0) != DDP_SUCCESS)
        return comm_fail("broadcast_params", comm);
    memcpy(p0, p, sizeof(float) * NPARAM);

    /* The reducer: gradients registered in forward order (W1 b1 W2 b2 W3 b3). */
    memset(&rdesc, 0, sizeof rdesc);
    rdesc.first_bucket_bytes = FIRST_BUCKET_BYTES;
    rdesc.bucket_cap_bytes = BUCKET_CAP_BYTES;
    if (skip_allreduce) rdesc.comm_hook = skip_hook;
    if (psgd_rank > 0) { /* PowerSGD sets the reducer's comm hook: before ddp_reducer_create */
        ddp_powersgd_desc_t pd;
        memset(&pd, 0, sizeof pd);
        pd.matrix_approximation_rank = psgd_rank;
        pd.start_iter = psgd_start;
        if (ddp_powersgd_create(&psgd, &pd, &rdesc) != DDP_SUCCESS) {
            fprintf(stderr, "train_mlp: ddp_powersgd_create: %s\n",
                    psgd ? ddp_powersgd_last_error(psgd) : "failed");
            if (psgd) ddp_powersgd_destroy(psgd);
            return comm_fail("powersgd_create", comm);
        }
    }
    if (ddp_reducer_create(&reducer, comm, &rdesc) != DDP_SUCCESS) return comm_fail("reducer_create", comm);
    for (t = 0; t < NTENSORS; t++)
        if (ddp_reducer_add_param(reducer, g + tensors[t].off, (size_t)tensors[t].len, DDP_FLOAT32) != t)
            return comm_fail("reducer_add_param", comm);
    /* The weights are [out][in] matrices; the biases stay vectors (sent uncompressed). */
    if (psgd && (ddp_powersgd_bind(psgd, reducer) != DDP_SUCCESS ||
                 ddp_powersgd_set_shape(psgd, 0, H1, IN) != DDP_SUCCESS ||
                 ddp_powersgd_set_shape(psgd, 2, H2, H1) != DDP_SUCCESS ||
                 ddp_powersgd_set_shape(psgd, 4, OUT, H2) != DDP_SUCCESS)) {
        fprintf(stderr, "train_mlp: PowerSGD: %s\n", ddp_powersgd_last_error(psgd));
        return comm_fail("powersgd_bind", comm);
    }

    if (rank == 0) {
        printf("train_mlp: MLP %d-%d-%d-%d (%d parameters), %d samples, %d ranks x batch %d = global "
               "batch %d, %d epochs, SGD lr %g\n",
               IN, H1, H2, OUT, (int)NPARAM, SAMPLES, world, BATCH, BATCH * world, EPOCHS, (double)LR);
        printf("train_mlp: each rank's shard: %llu samples an epoch (DistributedSampler: reshuffled "
               "every epoch, %d repeated as padding)\n",
               (unsigned long long)nsamp, (int)(nsamp * (uint64_t)world - SAMPLES));
        if (psgd)
            printf("train_mlp: PowerSGD rank %d from step %d (DDP_POWERSGD_RANK, DDP_POWERSGD_START): "
                   "W1 W2 W3 compressed, error feedback, warm start\n", psgd_rank, psgd_start);
        if (skip_allreduce)
            printf("train_mlp: DDP_DEMO_SKIP_ALLREDUCE set: gradients are NOT all-reduced (test "
                   "hook); the check must FAIL\n");
    }
    if (rank == 0) print_buckets(reducer, "(reverse registration order)");

    for (epoch = 0; epoch < EPOCHS; epoch++) {
        const uint64_t *b;
        uint64_t len;
        double t0 = now_s(), dt;
        ddp_sampler_set_epoch(&smp, (uint64_t)epoch);
        if (ddp_sampler_indices(&smp, idx) != DDP_SUCCESS ||
            ddp_batch_iter_init(&it, idx, nsamp, BATCH, 0) != DDP_SUCCESS) {
            fprintf(stderr, "train_mlp: sampler: %s\n", ddp_sampler_last_error(&smp));
            return 1;
        }
        stats[0] = stats[1] = 0;
        stats[2] = (double)nsamp;
        while ((len = ddp_batch_iter_next(&it, &b)) != 0) {
            if (batch_grad(p, data, label, b, len, g, stats, &ws, mark_ready, reducer) != 0 ||
                ddp_reducer_finish(reducer) != DDP_SUCCESS) {
                fprintf(stderr, "train_mlp: reducer: %s\n", ddp_reducer_last_error(reducer));
                return comm_fail("gradient reduction", comm);
            }
            sgd_step(p, g);
        }
        /* loss sum, correct, samples: summed over ranks (exact in float64 at these counts) */
        if (ddp_all_reduce(stats, stats, 3, DDP_FLOAT64, DDP_SUM, comm) != DDP_SUCCESS)
            return comm_fail("all_reduce (stats)", comm);
        dt = now_s() - t0;
        t_train += dt;
        acc = stats[1] / stats[2];
        if (rank == 0)
            printf("epoch %d/%d  loss %.4f  accuracy %5.1f%%  %6.0f samples/s\n", epoch + 1, EPOCHS,
                   stats[0] / stats[2], 100 * acc, stats[2] / dt);
        if (rank == 0 && epoch == 0)
            print_buckets(reducer, ddp_reducer_rebuilt(reducer) ? "(rebuilt in rank 0's ready order)" : "");
    }

    /* 1. Bitwise-identical replicas: the largest and the smallest hash across ranks agree. */
    hash[0] = hash[1] = weights_hash(p);
    if (ddp_all_reduce(&hash[0], &hash[0], 1, DDP_UINT64, DDP_MAX, comm) != DDP_SUCCESS ||
        ddp_all_reduce(&hash[1], &hash[1], 1, DDP_UINT64, DDP_MIN, comm) != DDP_SUCCESS)
        return comm_fail("all_reduce (hash)", comm);
    identical = hash[0] == hash[1];
    ddp_reducer_destroy(reducer);   /* before its communicator */
    ddp_comm_destroy(comm);
    memset(&pst, 0, sizeof pst);
    if (psgd && ddp_powersgd_stats(psgd, &pst) != DDP_SUCCESS) memset(&pst, 0, sizeof pst);
    if (psgd) ddp_powersgd_destroy(psgd);   /* after its reducer */
    workspace_free(&ws);

    pass = 1; /* rank 0 alone replays the training and gives the verdict; the others are done */
    if (rank == 0) {
        printf("train_mlp: trained in %.2f s (%.0f samples/s over all ranks)\n", t_train,
               (double)EPOCHS * (double)nsamp * world / t_train);
        if (pst.iterations > 0)
            printf("train_mlp: PowerSGD: %llu of %llu steps compressed; gradient elements all-reduced "
                   "per step, mean over the run: %.0f, uncompressed %.0f (%.1fx fewer)\n",
                   (unsigned long long)pst.compressed_iterations, (unsigned long long)pst.iterations,
                   (double)pst.elements_sent / (double)pst.iterations,
                   (double)pst.elements_uncompressed_equivalent / (double)pst.iterations,
                   pst.elements_sent ? (double)pst.elements_uncompressed_equivalent / (double)pst.elements_sent : 0.0);
        printf("replicas bitwise identical on all %d ranks: %s\n", world, identical ? "yes" : "NO");

        /* 2. The single-process reference from the same initial weights: uncompressed, so it
         * is no reference for a PowerSGD run (checks 1 and 3 still apply). */
        if (psgd) {
            printf("single-process reference: skipped (PowerSGD approximates the gradients)\n");
            printf("final accuracy %.1f%% (need >= %.0f%%): %s\n", 100 * acc, 100 * MIN_ACCURACY,
                   acc >= MIN_ACCURACY ? "learned" : "did NOT learn");
            pass = identical && acc >= MIN_ACCURACY;
            printf("train_mlp: %s\n", pass ? "PASS" : "FAIL");
            free(data), free(label), free(p), free(p0), free(g), free(idx);
            return pass ? 0 : 1;
        }
        t_ref = now_s();
        if (reference_run(p0, world, data, label) != 0) {
            free(data), free(label), free(p), free(p0), free(g), free(idx);
            return 1;
        }
        t_ref = now_s() - t_ref;
        rel = weights_rel_diff(p, p0, &worst);
        printf("single-process reference (global batch %d, the same samples each step): %.2f s\n",
               BATCH * world, t_ref);
        printf("max relative difference to the reference: %.2e in %s (limit %.0e): %s\n", rel,
               tensors[worst].name, REL_TOL, rel <= REL_TOL ? "equal" : "DIFFERENT");

        /* 3. It learned, so the comparison is not between two untrained models. */
        printf("final accuracy %.1f%% (need >= %.0f%%): %s\n", 100 * acc, 100 * MIN_ACCURACY,
               acc >= MIN_ACCURACY ? "learned" : "did NOT learn");

        pass = identical && rel <= REL_TOL && acc >= MIN_ACCURACY;
        printf("train_mlp: %s\n", pass ? "PASS" : "FAIL");
    }
    free(data), free(label), free(p), free(p0), free(g), free(idx);
    return pass ? 0 : 1;
}
