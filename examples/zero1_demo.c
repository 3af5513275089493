/* SPDX-License-Identifier: MIT (see LICENSE) */
/* zero1_demo.c — ZeRO-1 with libddp's flat-buffer reducer, checked against replicated AdamW.
 *
 * An llm.c-style trainer: one flat parameter buffer, one flat gradient buffer, AdamW written by
 * hand. The model is an MLP (64 -> 512 -> 512 -> 10, tanh, softmax cross-entropy, 301,066
 * parameters) on a synthetic 10-class problem; every rank takes its own 16 samples per step.
 * The same training runs twice from the same weights:
 *   replicated  the reducer in flat mode (desc.flat_grads: its buckets are views of the gradient
 *               buffer) all-reduces each bucket as backward produces it; every rank then runs
 *               AdamW on every parameter, with the full optimizer state (m and v: 2 x 4 bytes
 *               per parameter).
 *   ZeRO-1      the same reducer with zero_stage = 1 reduce-scatters each bucket instead, so a
 *               rank ends backward holding the average of its shard only; it runs AdamW on its
 *               shard, with optimizer state for the shard alone (1/world of it), then
 *               ddp_reducer_all_gather_params gives every rank the whole updated parameters.
 * The optimizer loop is the same code in both runs (loop over ddp_reducer_shard: in flat mode
 * without ZeRO the shards are the whole buffer).
 *
 * Rank 0 prints both runs' loss, step time (the slowest rank's mean after 3 warm-up steps, and
 * of it: finish, waiting for the buckets still in flight after backward; AdamW; the all-gather),
 * and optimizer state per rank (the allocation, and what VmRSS in
 * /proc/self/status grew by when it was allocated and touched), then checks:
 *   1. replicas: in each run every rank ends with bitwise identical parameters (a hash of the
 *      weights, all-reduced with MAX and MIN);
 *   2. ZeRO-1 == replicated: bit for bit on one or two ranks (an average of two numbers is one
 *      addition, in either order the same bits, and AdamW is elementwise: the same code on the
 *      same inputs). From three ranks on, the ring sums an element's p contributions starting at
 *      a rank that depends on where its chunk starts, and the chunks of a bucket's
 *      reduce-scatter are not those of its all-reduce: the averaged gradients may differ in the
 *      last bit (at most 2(p-1) eps of the largest contribution), and AdamW carries that into
 *      the weights. Required: max |difference| <= 1e-5 x max |weight| (float32 eps is 1.2e-7:
 *      ~100 last-bit differences' worth, still 100x below what a missing or wrong reduction
 *      does, which the test hook below shows). With DDP_DETERMINISTIC=1 every reduction adds in
 *      rank order, so bit for bit is required at any world size (shared memory on one host adds
 *      in rank order anyway, and is bit for bit without it too);
 *   3. memory: ZeRO-1's optimizer state on every rank is at most ceil(n / world) elements (the
 *      shards of all ranks cover the n parameters exactly once);
 *   4. training happened: the loss fell below 80% of where it started.
 * and prints "zero1_demo: PASS" (exit 0) or "zero1_demo: FAIL" (exit 1).
 *
 * Run: build/ddprun -n 4 build/zero1_demo (any -n), or build/zero1_demo alone (a world of one),
 * or under torchrun/mpirun/srun. Options: -s STEPS (default 30).
 *
 * TEST HOOK: DDP_ZERO1_DEMO_SKIP_GATHER=1 skips the all-gather, so a rank only ever updates its
 * own shard; with more than one rank the checks must print FAIL and exit non-zero.
 */
#ifndef _GNU_SOURCE /* g++ defines it already */
#define _GNU_SOURCE
#endif
#define DDP_IMPLEMENTATION
#include "ddp.h"
#include "transports/ddp_tcp.h"
#include "transports/ddp_shm.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { IN = 64, H = 512, OUT = 10, BATCH = 16, WARMUP = 3 };
/* the flat layout, in forward order (the reducer's buckets follow it backwards) */
enum {
    OFF_W1 = 0, OFF_B1 = OFF_W1 + H * IN,
    OFF_W2 = OFF_B1 + H, OFF_B2 = OFF_W2 + H * H,
    OFF_W3 = OFF_B2 + H, OFF_B3 = OFF_W3 + OUT * H,
    NPARAM = OFF_B3 + OUT
};
static const int tensor_off[6] = {OFF_W1, OFF_B1, OFF_W2, OFF_B2, OFF_W3, OFF_B3};
static const int tensor_len[6] = {H * IN, H, H * H, H, OUT * H, OUT};
#define LR 1e-3f
#define BETA1 0.9f
#define BETA2 0.999f
#define ADAM_EPS 1e-8f
#define WEIGHT_DECAY 0.01f
#define REL_TOL 1e-5

/* ---------------------------------------------------------------- data and initial weights */
static uint64_t mix(uint64_t x) {   /* splitmix64: every value is a pure function of its key */
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}
static uint64_t key(uint64_t stream, uint64_t i, uint64_t j) { return (stream << 48) ^ (i << 20) ^ j; }
static float gauss(uint64_t k) {   /* ~N(0, 1): four 16-bit uniforms, centred and scaled */
    uint64_t h = mix(k);
    double s = 0;
    int t;
    for (t = 0; t < 4; t++) s += (double)((h >> (16 * t)) & 0xffff) / 65536.0;
    return (float)((s - 2.0) * 1.7320508075688772);
}
/* Sample i: class i mod 10, features its class centre plus unit noise. */
static int sample(uint64_t i, float *x) {
    int c = (int)(mix(key(2, i, 0)) % OUT), j;
    for (j = 0; j < IN; j++) x[j] = gauss(key(1, (uint64_t)c, (uint64_t)j)) + 1.5f * gauss(key(3, i, (uint64_t)j));
    return c;
}
static void init_params(float *p) {   /* LeCun (variance 1 / fan_in, for tanh); biases 0 */
    int k;
    memset(p, 0, sizeof(float) * NPARAM);
    for (k = 0; k < H * IN; k++) p[OFF_W1 + k] = gauss(key(4, 0, (uint64_t)k)) * sqrtf(1.0f / IN);
    for (k = 0; k < H * H; k++) p[OFF_W2 + k] = gauss(key(5, 0, (uint64_t)k)) * sqrtf(1.0f / H);
    for (k = 0; k < OUT * H; k++) p[OFF_W3 + k] = gauss(key(6, 0, (uint64_t)k)) * sqrtf(1.0f / H);
}

/* ---------------------------------------------------------------- the model */
/* tanh, not ReLU: check 2 compares two runs whose gradients may differ in the last bit, and a
 * ReLU's derivative jumps at 0 (a last-bit difference moving a pre-activation across 0 parts
 * the runs for good); with tanh they stay within rounding. */
static void dense(const float *w, const float *b, const float *in, int nin, float *out, int nout, int act) {
    int o, i;
    for (o = 0; o < nout; o++) {
        float a = b[o];
        for (i = 0; i < nin; i++) a += w[o * nin + i] * in[i];
        out[o] = act ? tanhf(a) : a;
    }
}
static void outer_acc(float *g, float *gb, const float *d, const float *in, int nin, int nout, float scale) {
    int o, i;
    for (o = 0; o < nout; o++) {
        float s = d[o] * scale;
        for (i = 0; i < nin; i++) g[o * nin + i] += s * in[i];
        gb[o] += s;
    }
}
static void back_tanh(const float *w, const float *d, const float *h, int nin, int nout, float *din) {
    int o, i;
    for (i = 0; i < nin; i++) din[i] = 0;
    for (o = 0; o < nout; o++)
        for (i = 0; i < nin; i++) din[i] += w[o * nin + i] * d[o];
    for (i = 0; i < nin; i++) din[i] *= 1 - h[i] * h[i];
}

/* A batch's inputs, activations and deltas: backward goes layer by layer over all of them. */
typedef struct {
    float x[BATCH][IN], h1[BATCH][H], h2[BATCH][H], d3[BATCH][OUT], d2[BATCH][H], d1[BATCH][H];
    int y[BATCH];
} batch_t;

/* Forward and backward of this rank's batch at step s into the flat gradient g (zeroed first),
 * layer by layer over the whole batch, marking each tensor ready as soon as it is final: the
 * reducer starts a bucket's collective while the layers below are still being computed.
 * Returns the mean loss, or a negative value if the reducer failed. */
static double step_grad(const float *p, float *g, batch_t *b, int s, int rank, int world, ddp_reducer_t *red) {
    double loss = 0;
    int k, o;
    memset(g, 0, sizeof(float) * NPARAM);
    for (k = 0; k < BATCH; k++) {
        float z[OUT], m, sum = 0, lse;
        b->y[k] = sample((uint64_t)s * (uint64_t)(BATCH * world) + (uint64_t)(rank * BATCH + k), b->x[k]);
        dense(p + OFF_W1, p + OFF_B1, b->x[k], IN, b->h1[k], H, 1);
        dense(p + OFF_W2, p + OFF_B2, b->h1[k], H, b->h2[k], H, 1);
        dense(p + OFF_W3, p + OFF_B3, b->h2[k], H, z, OUT, 0);
        for (m = z[0], o = 1; o < OUT; o++) if (z[o] > m) m = z[o];
        for (o = 0; o < OUT; o++) sum += expf(z[o] - m);
        lse = m + logf(sum);
        loss += lse - z[b->y[k]];
        for (o = 0; o < OUT; o++) b->d3[k][o] = expf(z[o] - lse) - (o == b->y[k] ? 1.0f : 0.0f);
    }
    for (k = 0; k < BATCH; k++) {
        outer_acc(g + OFF_W3, g + OFF_B3, b->d3[k], b->h2[k], H, OUT, 1.0f / BATCH);
        back_tanh(p + OFF_W3, b->d3[k], b->h2[k], H, OUT, b->d2[k]);
    }
    if (ddp_reducer_grad_ready(red, 5) || ddp_reducer_grad_ready(red, 4)) return -1;
    for (k = 0; k < BATCH; k++) {
        outer_acc(g + OFF_W2, g + OFF_B2, b->d2[k], b->h1[k], H, H, 1.0f / BATCH);
        back_tanh(p + OFF_W2, b->d2[k], b->h1[k], H, H, b->d1[k]);
    }
    if (ddp_reducer_grad_ready(red, 3) || ddp_reducer_grad_ready(red, 2)) return -1;
    for (k = 0; k < BATCH; k++) outer_acc(g + OFF_W1, g + OFF_B1, b->d1[k], b->x[k], IN, H, 1.0f / BATCH);
    if (ddp_reducer_grad_ready(red, 1) || ddp_reducer_grad_ready(red, 0)) return -1;
    return loss / BATCH;
}

/* AdamW (llm.c's update) on parameters [o, o + n); their state at m + so, v + so. */
static void adamw(float *p, const float *g, float *m, float *v, size_t o, size_t n, size_t so, int t) {
    const float c1 = 1.0f - powf(BETA1, (float)t), c2 = 1.0f - powf(BETA2, (float)t);
    size_t j;
    for (j = 0; j < n; j++) {
        float gj = g[o + j], *mj = m + so + j, *vj = v + so + j;
        *mj = BETA1 * *mj + (1.0f - BETA1) * gj;
        *vj = BETA2 * *vj + (1.0f - BETA2) * gj * gj;
        p[o + j] -= LR * ((*mj / c1) / (sqrtf(*vj / c2) + ADAM_EPS) + WEIGHT_DECAY * p[o + j]);
    }
}

/* ---------------------------------------------------------------- measuring */
static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}
static long vmrss_kb(void) {   /* -1 where /proc/self/status is not there */
    char line[256];
    long kb = -1;
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return -1;
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, "VmRSS:", 6)) { kb = strtol(line + 6, NULL, 10); break; }
    fclose(f);
    return kb;
}
/* Writes every page (a compiler may drop a memset of calloc'd memory). */
static void touch(float *a, size_t n) {
    volatile float *q = a;
    size_t i;
    for (i = 0; i < n; i += 512) q[i] = 0.0f;
}
static uint64_t weights_hash(const float *p) {   /* FNV-1a over the bytes */
    const unsigned char *b = (const unsigned char *)p;
    uint64_t h = 1469598103934665603ull;
    size_t i;
    for (i = 0; i < sizeof(float) * NPARAM; i++) h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

typedef struct {
    double loss_first, loss_last;
    double step_ms, finish_ms, adam_ms, gather_ms;     /* per step: the slowest rank's means */
    size_t state_bytes, state_bytes_max;               /* this rank's, and the largest rank's */
    long rss_kb;                                       /* VmRSS growth for the state, this rank */
    int nbuckets, nshards, identical;
} run_t;

static int fail(const char *what, ddp_comm_t *c, ddp_reducer_t *r) {
    fprintf(stderr, "[rank %d] zero1_demo: %s failed: %s\n", ddp_comm_rank(c), what,
            r && *ddp_reducer_last_error(r) ? ddp_reducer_last_error(r) : ddp_comm_last_error(c));
    return 1;
}

/* STEPS steps of AdamW from p0 into p, all-reducing (zero = 0) or reduce-scattering (zero = 1). */
static int train(ddp_comm_t *comm, int zero, int steps, const float *p0, float *p, float *g, batch_t *b, run_t *out) {
    const int rank = ddp_comm_rank(comm), world = ddp_comm_size(comm);
    const char *skip = getenv("DDP_ZERO1_DEMO_SKIP_GATHER");
    ddp_reducer_desc_t rd;
    ddp_reducer_t *red = NULL;
    float *m, *v;
    size_t elems = 0, o, cnt, so;
    double tsum[4] = {0, 0, 0, 0};   /* step, finish, AdamW, all-gather */
    uint64_t hash[2];
    long rss0;
    int s, k, t;
    memset(&rd, 0, sizeof rd);
    rd.flat_grads = g;
    rd.flat_bytes = sizeof(float) * NPARAM;
    rd.zero_stage = zero;
    rd.first_bucket_bytes = 16 << 10;   /* this model is 1.2 MB: one bucket per layer, not DDP's */
    rd.bucket_cap_bytes = 256 << 10;    /* one bucket for everything */
    if (ddp_reducer_create(&red, comm, &rd) != DDP_SUCCESS) return fail("ddp_reducer_create", comm, NULL);
    for (k = 0; k < 6; k++)
        if (ddp_reducer_add_param(red, g + tensor_off[k], (size_t)tensor_len[k], DDP_FLOAT32) != k)
            return fail("ddp_reducer_add_param", comm, red);
    out->nshards = ddp_reducer_num_shards(red, &elems);
    out->nbuckets = ddp_reducer_num_buckets(red);
    if (out->nshards < 0) return fail("ddp_reducer_num_shards", comm, red);
    /* The optimizer state: what ZeRO-1 divides by the world size. Touched at once, so VmRSS
     * shows it (calloc of this size maps fresh zero pages, resident only once written). */
    rss0 = vmrss_kb();
    m = (float *)calloc(elems ? elems : 1, sizeof(float));
    v = (float *)calloc(elems ? elems : 1, sizeof(float));
    if (!m || !v) { fprintf(stderr, "zero1_demo: out of memory\n"); return 1; }
    touch(m, elems);
    touch(v, elems);
    out->rss_kb = rss0 >= 0 ? vmrss_kb() - rss0 : -1;
    out->state_bytes = 2 * elems * sizeof(float);
    out->state_bytes_max = out->state_bytes;
    if (ddp_all_reduce(&out->state_bytes_max, &out->state_bytes_max, 1, DDP_UINT64, DDP_MAX, comm) != DDP_SUCCESS)
        return fail("all_reduce (state size)", comm, NULL);

    memcpy(p, p0, sizeof(float) * NPARAM);
    for (s = 0, t = 1; s < steps; s++, t++) {
        double t0 = now_s(), t1, t2, t3, t4, loss = step_grad(p, g, b, s, rank, world, red);
        if (loss < 0) return fail("ddp_reducer_grad_ready", comm, red);
        t1 = now_s();
        if (ddp_reducer_finish(red) != DDP_SUCCESS) return fail("ddp_reducer_finish", comm, red);
        t2 = now_s();
        for (k = 0; k < out->nshards; k++) {   /* this rank's shards: everything when replicated */
            ddp_reducer_shard(red, k, &o, &cnt, &so);
            adamw(p, g, m, v, o, cnt, so, t);
        }
        t3 = now_s();
        if (!(skip && !strcmp(skip, "1")) && ddp_reducer_all_gather_params(red, p, DDP_FLOAT32) != DDP_SUCCESS)
            return fail("ddp_reducer_all_gather_params", comm, red);
        t4 = now_s();
        if (ddp_all_reduce(&loss, &loss, 1, DDP_FLOAT64, DDP_AVG, comm) != DDP_SUCCESS)
            return fail("all_reduce (loss)", comm, NULL);
        if (s == 0) out->loss_first = loss;
        out->loss_last = loss;
        if (s >= WARMUP || steps <= WARMUP) {
            tsum[0] += t4 - t0;
            tsum[1] += t2 - t1;
            tsum[2] += t3 - t2;
            tsum[3] += t4 - t3;
        }
    }
    for (k = 0; k < 4; k++) tsum[k] *= 1e3 / (steps > WARMUP ? steps - WARMUP : steps);
    if (ddp_all_reduce(tsum, tsum, 4, DDP_FLOAT64, DDP_MAX, comm) != DDP_SUCCESS)
        return fail("all_reduce (times)", comm, NULL);
    out->step_ms = tsum[0];
    out->finish_ms = tsum[1];
    out->adam_ms = tsum[2];
    out->gather_ms = tsum[3];
    hash[0] = hash[1] = weights_hash(p);
    if (ddp_all_reduce(&hash[0], &hash[0], 1, DDP_UINT64, DDP_MAX, comm) != DDP_SUCCESS ||
        ddp_all_reduce(&hash[1], &hash[1], 1, DDP_UINT64, DDP_MIN, comm) != DDP_SUCCESS)
        return fail("all_reduce (hash)", comm, NULL);
    out->identical = hash[0] == hash[1];
    ddp_reducer_destroy(red);
    free(m);
    free(v);
    return 0;
}

static void report(const char *name, const run_t *r, const run_t *base) {
    char rss[64];
    if (r->rss_kb >= 0) snprintf(rss, sizeof rss, "VmRSS +%.3f MB", (double)r->rss_kb * 1024.0 / 1e6);
    else snprintf(rss, sizeof rss, "VmRSS n/a");
    printf("%-10s loss %.4f -> %.4f  step %6.2f ms (finish %5.2f, AdamW %5.2f, all-gather %5.2f)  "
           "optimizer state %.3f MB/rank (%s)", name, r->loss_first, r->loss_last, r->step_ms, r->finish_ms,
           r->adam_ms, r->gather_ms, (double)r->state_bytes / 1e6, rss);
    if (base) printf(" = 1/%.2f of replicated", (double)base->state_bytes / (double)r->state_bytes_max);
    printf("   [%d buckets, %d shard%s]\n", r->nbuckets, r->nshards, r->nshards == 1 ? "" : "s");
}

int main(int argc, char **argv) {
    ddp_comm_t *comm = NULL;
    float *p0 = (float *)malloc(sizeof(float) * NPARAM), *pr = (float *)malloc(sizeof(float) * NPARAM);
    float *pz = (float *)malloc(sizeof(float) * NPARAM), *g = (float *)malloc(sizeof(float) * NPARAM);
    batch_t *b = (batch_t *)malloc(sizeof(batch_t));
    run_t rep, zer;
    int steps = 30, rank, world, i, pass, exact;
    double maxd = 0, scale = 0, rel;
    size_t ndiff = 0, ceil_share;
    for (i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-s") && i + 1 < argc) steps = atoi(argv[++i]);
        else { fprintf(stderr, "usage: %s [-s steps]\n", argv[0]); return 2; }
    }
    if (steps < 1 || !p0 || !pr || !pz || !g || !b) { fprintf(stderr, "zero1_demo: bad -s or out of memory\n"); return 2; }
    if (ddp_comm_init_env(&comm, NULL) != DDP_SUCCESS) {
        fprintf(stderr, "zero1_demo: ddp_comm_init_env: %s\n", ddp_last_init_error());
        return 1;
    }
    rank = ddp_comm_rank(comm);
    world = ddp_comm_size(comm);
    init_params(p0);
    if (ddp_broadcast(p0, p0, NPARAM, DDP_FLOAT32, 0, comm) != DDP_SUCCESS) return fail("broadcast", comm, NULL);
    if (rank == 0)
        printf("zero1_demo: MLP %d-%d-%d-%d (%d parameters) trained by AdamW, %d rank%s x %d samples, "
               "%d steps, replicated then ZeRO-1\n", IN, H, H, OUT, NPARAM, world, world == 1 ? "" : "s", BATCH, steps);
    memset(&rep, 0, sizeof rep);
    memset(&zer, 0, sizeof zer);
    if (train(comm, 0, steps, p0, pr, g, b, &rep) || train(comm, 1, steps, p0, pz, g, b, &zer)) return 1;
    for (i = 0; i < NPARAM; i++) {
        double d = fabs((double)pz[i] - (double)pr[i]);
        if (d > maxd || d != d) maxd = d;
        if (d != 0) ndiff++;
        if (fabs((double)pr[i]) > scale) scale = fabs((double)pr[i]);
    }
    if (ddp_all_reduce(&maxd, &maxd, 1, DDP_FLOAT64, DDP_MAX, comm) != DDP_SUCCESS)
        return fail("all_reduce (difference)", comm, NULL);
    rel = maxd / (scale > 0 ? scale : 1);
    ceil_share = (NPARAM + (size_t)world - 1) / (size_t)world;
    exact = world <= 2 || (getenv("DDP_DETERMINISTIC") && !strcmp(getenv("DDP_DETERMINISTIC"), "1"));
    pass = rep.identical && zer.identical && (exact ? maxd == 0 : rel <= REL_TOL) &&
           zer.state_bytes_max <= 2 * ceil_share * sizeof(float) && rep.loss_last < 0.8 * rep.loss_first &&
           zer.loss_last < 0.8 * zer.loss_first;
    if (rank == 0) {
        report("replicated", &rep, NULL);
        report("ZeRO-1", &zer, &rep);
        printf("replicas bitwise identical on all %d ranks: replicated %s, ZeRO-1 %s\n", world,
               rep.identical ? "yes" : "NO", zer.identical ? "yes" : "NO");
        printf("ZeRO-1 vs replicated: max |difference| %.3g = %.3g of max |weight| (%zu of %d differ on "
               "rank 0); required: %s: %s\n", maxd, rel, ndiff, NPARAM,
               world <= 2 ? "bit for bit (world <= 2)" : exact ? "bit for bit (DDP_DETERMINISTIC=1)"
               : "<= 1e-05 (world > 2: last-bit differences in the averages)",
               (exact ? maxd == 0 : rel <= REL_TOL) ? "equal" : "DIFFERENT");
        printf("optimizer state: replicated %zu bytes per rank, ZeRO-1 at most %zu (ceil(%d / %d) = %zu "
               "parameters x 8 bytes: %s)\n", rep.state_bytes, zer.state_bytes_max, NPARAM, world, ceil_share,
               zer.state_bytes_max <= 2 * ceil_share * sizeof(float) ? "yes" : "NO");
        printf("zero1_demo: %s\n", pass ? "PASS" : "FAIL");
        fflush(stdout);
    }
    /* a launcher stops the job at the first rank that exits non-zero: not before rank 0 spoke */
    ddp_barrier(comm);
    ddp_comm_destroy(comm);
    free(p0); free(pr); free(pz); free(g); free(b);
    return pass ? 0 : 1;
}
