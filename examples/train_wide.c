/* SPDX-License-Identifier: MIT (see LICENSE) */
/* train_wide.c — a wide MLP trained data-parallel, plain or with PowerSGD: the second model of
 * bench/powersgd_bench.sh, with matrices large enough for gradient compression to matter.
 *
 * The model is examples/train_mlp.c's kind (tanh hidden layers, softmax cross-entropy, LeCun
 * initialisation, plain SGD) made wider: IN -> WIDTH -> WIDTH -> 10, by default
 * 256 -> 1024 -> 1024 -> 10, 1.32 million parameters, 5.3 MB of float32 gradients a step, in
 * the gradient bucket reducer (ddp_reducer_*, registered in forward order, each tensor marked
 * ready by a layer-by-layer backward pass). The data never ends: every sample is drawn from a
 * key (step, rank, position) out of 10 classes of 3 Gaussian clusters each, so every rank trains
 * on its own samples and every run with the same options sees the same ones.
 *
 * -r R compresses the gradients with ddp_powersgd.h, rank R, from step -s (default 10): the
 * weight matrices are given their [out][in] shapes, the biases stay vectors (uncompressed).
 *
 * Rank 0 prints one line a run:
 *   train_wide: RESULT world=.. rank=.. start=.. steps=.. step_ms_mean=.. step_ms_median=..
 *     finish_ms_mean=.. tx_bytes_per_step=.. rx_bytes_per_step=.. elems_sent_per_step=.. elems_full_per_step=..
 *     final_loss=.. eval_loss=.. eval_acc=.. identical=yes
 * step times (wall, rank 0) and bytes over the steps after the -W warm-up ones (finish_ms: the
 * part of a step spent in ddp_reducer_finish, i.e. communication not hidden behind backward,
 * PowerSGD's finish-time work and its blocking Q all-reduce included); the bytes are
 * MEASURED: the interface counters /sys/class/net/IFACE/statistics/{tx,rx}_bytes (-I, default
 * eth0: the emulated host's link in bench/netns_bench.sh, one rank per host, where nothing else
 * uses it; -1 when the file is missing), averaged over all ranks; elems_* are PowerSGD's own
 * count of gradient elements it put into all-reduces (the uncompressed count for a plain run).
 * final_loss is the training loss (mean over all ranks' samples) of the last 10% of the steps,
 * eval_loss/eval_acc are rank 0's on 2048 held-out samples. -c FILE: rank 0 writes the
 * per-step training loss there as CSV (step,loss). Exit 0 when the run completed and the
 * replicas are bitwise identical, else 1; 2 for bad options.
 *
 * Run: build/ddprun -n 2 build/train_wide -n 200 -r 2, or under bench/netns_bench.sh.
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
#include <unistd.h>

enum { OUT = 10, CLUSTERS = 30, NTENSORS = 6, EVAL_SAMPLES = 2048 };

typedef struct {
    int steps, width, in, batch, rank_r, start, warmup;
    double lr, noise;
    const char *csv, *iface;
} opts_t;

/* ---------------------------------------------------------------- deterministic randomness */
static uint64_t mix(uint64_t x) {   /* splitmix64's finaliser */
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}
static float gauss(uint64_t key) {  /* ~N(0, 1): four 16-bit uniforms, centred and scaled */
    uint64_t h = mix(key);
    double s = 0;
    int t;
    for (t = 0; t < 4; t++) s += (double)((h >> (16 * t)) & 0xffff) / 65536.0;
    return (float)((s - 2.0) * 1.7320508075688772);
}
static uint64_t key3(uint64_t a, uint64_t b, uint64_t c) { return mix(mix(mix(a) ^ b) ^ c); }

/* Sample `id` (any 64-bit key): cluster id % 30 (class cluster % 10), centre + noise. */
static int sample(const opts_t *o, const float *centres, uint64_t id, float *x) {
    uint64_t h = mix(id);
    int cl = (int)(h % CLUSTERS), j;
    for (j = 0; j < o->in; j++) x[j] = centres[cl * o->in + j] + (float)o->noise * gauss(key3(7, h, (uint64_t)j));
    return cl % OUT;
}

/* ---------------------------------------------------------------- the model */
typedef struct {
    int in, w;
    size_t off[NTENSORS], len[NTENSORS], n;   /* W1 b1 W2 b2 W3 b3 in one flat array */
} layout_t;
static void layout_init(layout_t *l, int in, int w) {
    size_t sz[NTENSORS];
    int t;
    sz[0] = (size_t)w * (size_t)in, sz[1] = (size_t)w, sz[2] = (size_t)w * (size_t)w, sz[3] = (size_t)w;
    sz[4] = (size_t)OUT * (size_t)w, sz[5] = OUT;
    l->in = in, l->w = w, l->n = 0;
    for (t = 0; t < NTENSORS; t++) l->off[t] = l->n, l->len[t] = sz[t], l->n += sz[t];
}

/* out[o] = act(b[o] + w[o][:] . in), four partial sums (the order is fixed: every rank and run
 * gets the same bits). */
static void dense(const float *w, const float *b, const float *in, int nin, float *out, int nout, int act) {
    int o, i;
    for (o = 0; o < nout; o++) {
        const float *wr = w + (size_t)o * (size_t)nin;
        float a0 = 0, a1 = 0, a2 = 0, a3 = 0;
        for (i = 0; i + 3 < nin; i += 4) {
            a0 += wr[i] * in[i], a1 += wr[i + 1] * in[i + 1];
            a2 += wr[i + 2] * in[i + 2], a3 += wr[i + 3] * in[i + 3];
        }
        for (; i < nin; i++) a0 += wr[i] * in[i];
        a0 = b[o] + ((a0 + a1) + (a2 + a3));
        out[o] = act ? tanhf(a0) : a0;
    }
}
/* g[o][:] += d[o] * in, gb[o] += d[o] */
static void outer_acc(float *g, float *gb, const float *d, const float *in, int nin, int nout) {
    int o, i;
    for (o = 0; o < nout; o++) {
        float *gr = g + (size_t)o * (size_t)nin, dv = d[o];
        for (i = 0; i < nin; i++) gr[i] += dv * in[i];
        gb[o] += dv;
    }
}
/* din = (w^T d) * (1 - h^2) */
static void back_tanh(const float *w, const float *d, const float *h, int nin, int nout, float *din) {
    int o, i;
    for (i = 0; i < nin; i++) din[i] = 0;
    for (o = 0; o < nout; o++) {
        const float *wr = w + (size_t)o * (size_t)nin;
        float dv = d[o];
        for (i = 0; i < nin; i++) din[i] += wr[i] * dv;
    }
    for (i = 0; i < nin; i++) din[i] *= 1 - h[i] * h[i];
}

typedef struct { float *x, *h1, *h2, *d3, *d2, *d1; int *y; } work_t;

/* Forward over the batch; returns the loss sum, adds the correct count to *correct. With g set,
 * the mean gradient goes to g, layer by layer, each finished tensor handed to the reducer. */
static int batch(const layout_t *l, const float *p, float *g, const work_t *ws, int n,
                 ddp_reducer_t *red, double *loss, double *correct) {
    int k, o, t, w = l->w, in = l->in;
    *loss = 0;
    for (k = 0; k < n; k++) {
        float z[OUT], m, s = 0, lse, *h1 = ws->h1 + (size_t)k * w, *h2 = ws->h2 + (size_t)k * w;
        int best = 0, y = ws->y[k];
        dense(p + l->off[0], p + l->off[1], ws->x + (size_t)k * in, in, h1, w, 1);
        dense(p + l->off[2], p + l->off[3], h1, w, h2, w, 1);
        dense(p + l->off[4], p + l->off[5], h2, w, z, OUT, 0);
        for (o = 1; o < OUT; o++)
            if (z[o] > z[best]) best = o;
        m = z[best];
        for (o = 0; o < OUT; o++) s += expf(z[o] - m);
        lse = m + logf(s);
        *loss += lse - z[y];
        *correct += best == y;
        for (o = 0; o < OUT; o++) ws->d3[(size_t)k * OUT + o] = (expf(z[o] - lse) - (o == y ? 1.0f : 0.0f)) / (float)n;
    }
    if (!g) return 0;
    memset(g, 0, sizeof(float) * l->n);
    for (k = 0; k < n; k++) {
        outer_acc(g + l->off[4], g + l->off[5], ws->d3 + (size_t)k * OUT, ws->h2 + (size_t)k * w, w, OUT);
        back_tanh(p + l->off[4], ws->d3 + (size_t)k * OUT, ws->h2 + (size_t)k * w, w, OUT, ws->d2 + (size_t)k * w);
    }
    for (t = 5; t >= 4; t--)
        if (ddp_reducer_grad_ready(red, t) != DDP_SUCCESS) return -1;
    for (k = 0; k < n; k++) {
        outer_acc(g + l->off[2], g + l->off[3], ws->d2 + (size_t)k * w, ws->h1 + (size_t)k * w, w, w);
        back_tanh(p + l->off[2], ws->d2 + (size_t)k * w, ws->h1 + (size_t)k * w, w, w, ws->d1 + (size_t)k * w);
    }
    for (t = 3; t >= 2; t--)
        if (ddp_reducer_grad_ready(red, t) != DDP_SUCCESS) return -1;
    for (k = 0; k < n; k++)
        outer_acc(g + l->off[0], g + l->off[1], ws->d1 + (size_t)k * w, ws->x + (size_t)k * in, in, w);
    for (t = 1; t >= 0; t--)
        if (ddp_reducer_grad_ready(red, t) != DDP_SUCCESS) return -1;
    return 0;
}

/* ---------------------------------------------------------------- measuring */
static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}
/* The interface's byte counter (tx or rx), or -1 when there is none to read. */
static double iface_bytes(const char *iface, const char *dir) {
    char path[256];
    unsigned long long v;
    FILE *f;
    int ok;
    snprintf(path, sizeof path, "/sys/class/net/%s/statistics/%s_bytes", iface, dir);
    if (!(f = fopen(path, "r"))) return -1;
    ok = fscanf(f, "%llu", &v) == 1;
    fclose(f);
    return ok ? (double)v : -1;
}
static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}
static uint64_t weights_hash(const float *p, size_t n) {   /* FNV-1a over the bytes */
    const unsigned char *b = (const unsigned char *)p;
    uint64_t h = 0xcbf29ce484222325ull;
    size_t i;
    for (i = 0; i < sizeof(float) * n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

static const char usage[] =
    "usage: ddprun -n NPROC build/train_wide [options]   (see examples/train_wide.c)\n"
    "  -n steps [200]  -w width [1024]  -i input dim [256]  -b batch per rank [16]\n"
    "  -r PowerSGD rank [0: uncompressed]  -s PowerSGD start step [10]  -l lr [0.05]\n"
    "  -W warm-up steps not timed [5]  -N noise [4.0]  -c CSV of per-step loss (rank 0)\n"
    "  -I interface whose counters give the bytes [eth0]\n";

static int parse(opts_t *o, int argc, char **argv) {
    int c;
    o->steps = 200, o->width = 1024, o->in = 256, o->batch = 16, o->rank_r = 0, o->start = 10;
    o->warmup = 5, o->lr = 0.05, o->noise = 4.0, o->csv = NULL, o->iface = "eth0";
    while ((c = getopt(argc, argv, "n:w:i:b:r:s:l:W:N:c:I:h")) != -1) {
        switch (c) {
        case 'n': o->steps = atoi(optarg); break;
        case 'w': o->width = atoi(optarg); break;
        case 'i': o->in = atoi(optarg); break;
        case 'b': o->batch = atoi(optarg); break;
        case 'r': o->rank_r = atoi(optarg); break;
        case 's': o->start = atoi(optarg); break;
        case 'l': o->lr = atof(optarg); break;
        case 'W': o->warmup = atoi(optarg); break;
        case 'N': o->noise = atof(optarg); break;
        case 'c': o->csv = optarg; break;
        case 'I': o->iface = optarg; break;
        default: fputs(usage, stderr); return -1;
        }
    }
    if (optind < argc || o->steps < 1 || o->width < 1 || o->in < 1 || o->batch < 1 || o->rank_r < 0 ||
        o->start < 2 || o->warmup < 0 || o->warmup >= o->steps || !(o->lr > 0)) {
        fputs(usage, stderr);
        return -1;
    }
    return 0;
}

static int fail(const char *what, const char *why) {
    fprintf(stderr, "train_wide: %s: %s\n", what, why);
    return 1;
}

int main(int argc, char **argv) {
    opts_t o;
    layout_t l;
    work_t ws;
    ddp_comm_t *comm;
    ddp_reducer_t *red;
    ddp_reducer_desc_t rd;
    ddp_powersgd_t *ps = NULL;
    ddp_powersgd_stats_t st0, st1;
    float *p, *g, *centres;
    double *loss, *step_s, io[4] = {-1, -1, -1, -1}, e_loss = 0, e_correct = 0, t0 = 0, corr = 0, fin = 0;
    double wait_s = 0;   /* time in ddp_reducer_finish over the timed steps: exposed communication */
    uint64_t hash[2];
    int rank, world, t, s, k, last;
    size_t i;

    if (parse(&o, argc, argv) != 0) return 2;
    if (ddp_comm_init_env(&comm, NULL) != DDP_SUCCESS) return fail("ddp_comm_init_env", ddp_last_init_error());
    rank = ddp_comm_rank(comm), world = ddp_comm_size(comm);
    layout_init(&l, o.in, o.width);
    p = (float *)malloc(sizeof(float) * l.n);
    g = (float *)malloc(sizeof(float) * l.n);
    centres = (float *)malloc(sizeof(float) * CLUSTERS * (size_t)o.in);
    loss = (double *)calloc((size_t)o.steps, sizeof *loss);
    step_s = (double *)calloc((size_t)o.steps, sizeof *step_s);
    k = o.batch > EVAL_SAMPLES ? o.batch : EVAL_SAMPLES;   /* the work arrays serve eval too */
    ws.x = (float *)malloc(sizeof(float) * (size_t)k * (size_t)o.in);
    ws.h1 = (float *)malloc(sizeof(float) * (size_t)k * (size_t)o.width);
    ws.h2 = (float *)malloc(sizeof(float) * (size_t)k * (size_t)o.width);
    ws.d2 = (float *)malloc(sizeof(float) * (size_t)o.batch * (size_t)o.width);
    ws.d1 = (float *)malloc(sizeof(float) * (size_t)o.batch * (size_t)o.width);
    ws.d3 = (float *)malloc(sizeof(float) * (size_t)k * OUT);
    ws.y = (int *)malloc(sizeof(int) * (size_t)k);
    if (!p || !g || !centres || !loss || !step_s || !ws.x || !ws.h1 || !ws.h2 || !ws.d2 || !ws.d1 || !ws.d3 || !ws.y)
        return fail("setup", "out of memory");
    for (i = 0; i < CLUSTERS * (size_t)o.in; i++) centres[i] = gauss(key3(1, i, 0));
    memset(p, 0, sizeof(float) * l.n);   /* the same initial weights on every rank, biases 0 */
    for (t = 0; t < NTENSORS; t += 2) {
        float sc = sqrtf(1.0f / (float)(t == 0 ? o.in : o.width));
        for (i = 0; i < l.len[t]; i++) p[l.off[t] + i] = gauss(key3(2, (uint64_t)t, i)) * sc;
    }

    memset(&rd, 0, sizeof rd);
    if (o.rank_r > 0) {
        ddp_powersgd_desc_t pd;
        memset(&pd, 0, sizeof pd);
        pd.matrix_approximation_rank = o.rank_r;
        pd.start_iter = o.start;
        if (ddp_powersgd_create(&ps, &pd, &rd) != DDP_SUCCESS)
            return fail("ddp_powersgd_create", ps ? ddp_powersgd_last_error(ps) : "failed");
    }
    if (ddp_reducer_create(&red, comm, &rd) != DDP_SUCCESS) return fail("ddp_reducer_create", ddp_comm_last_error(comm));
    for (t = 0; t < NTENSORS; t++)
        if (ddp_reducer_add_param(red, g + l.off[t], l.len[t], DDP_FLOAT32) != t)
            return fail("ddp_reducer_add_param", ddp_reducer_last_error(red));
    if (ps && (ddp_powersgd_bind(ps, red) != DDP_SUCCESS ||
               ddp_powersgd_set_shape(ps, 0, (size_t)o.width, (size_t)o.in) != DDP_SUCCESS ||
               ddp_powersgd_set_shape(ps, 2, (size_t)o.width, (size_t)o.width) != DDP_SUCCESS ||
               ddp_powersgd_set_shape(ps, 4, OUT, (size_t)o.width) != DDP_SUCCESS))
        return fail("PowerSGD", ddp_powersgd_last_error(ps));
    if (rank == 0)
        printf("train_wide: MLP %d-%d-%d-%d (%zu parameters), %d ranks x batch %d, %d steps, lr %g, %s\n",
               o.in, o.width, o.width, OUT, l.n, world, o.batch, o.steps, o.lr,
               ps ? "PowerSGD" : "uncompressed");
    memset(&st0, 0, sizeof st0), memset(&st1, 0, sizeof st1);

    for (s = 0; s < o.steps; s++) {
        double ts = now_s(), lsum, tw;
        if (s == o.warmup) {   /* the measured steps start here */
            io[0] = iface_bytes(o.iface, "tx"), io[1] = iface_bytes(o.iface, "rx");
            if (ps) ddp_powersgd_stats(ps, &st0);
            t0 = ts;
        }
        for (k = 0; k < o.batch; k++)
            ws.y[k] = sample(&o, centres, key3(3, (uint64_t)s, (uint64_t)rank * 1000003u + (uint64_t)k),
                             ws.x + (size_t)k * (size_t)o.in);
        if (batch(&l, p, g, &ws, o.batch, red, &lsum, &corr) != 0)
            return fail("gradient reduction", ddp_reducer_last_error(red));
        tw = now_s();
        if (ddp_reducer_finish(red) != DDP_SUCCESS) return fail("gradient reduction", ddp_reducer_last_error(red));
        if (s >= o.warmup) wait_s += now_s() - tw;
        for (i = 0; i < l.n; i++) p[i] -= (float)o.lr * g[i];
        loss[s] = lsum / o.batch / world;
        step_s[s] = now_s() - ts;
    }
    fin = now_s() - t0;
    io[2] = iface_bytes(o.iface, "tx"), io[3] = iface_bytes(o.iface, "rx");
    if (ps) ddp_powersgd_stats(ps, &st1);

    /* After the timed steps: losses averaged over ranks, bytes summed, replicas compared. */
    {
        double b[3];
        int nb = o.steps - o.warmup;
        b[0] = io[0] >= 0 && io[2] >= 0 ? (io[2] - io[0]) / nb : -1e30;
        b[1] = io[1] >= 0 && io[3] >= 0 ? (io[3] - io[1]) / nb : -1e30;
        b[2] = 1;
        hash[0] = hash[1] = weights_hash(p, l.n);
        if (ddp_all_reduce(loss, loss, (size_t)o.steps, DDP_FLOAT64, DDP_SUM, comm) != DDP_SUCCESS ||
            ddp_all_reduce(b, b, 3, DDP_FLOAT64, DDP_SUM, comm) != DDP_SUCCESS ||
            ddp_all_reduce(&hash[0], &hash[0], 1, DDP_UINT64, DDP_MAX, comm) != DDP_SUCCESS ||
            ddp_all_reduce(&hash[1], &hash[1], 1, DDP_UINT64, DDP_MIN, comm) != DDP_SUCCESS)
            return fail("all_reduce (results)", ddp_comm_last_error(comm));
        io[0] = b[0] < 0 ? -1 : b[0] / world, io[1] = b[1] < 0 ? -1 : b[1] / world;
    }
    ddp_reducer_destroy(red);
    ddp_comm_destroy(comm);
    if (ps) ddp_powersgd_destroy(ps);

    if (rank == 0) {
        double med, elem_sent, elem_full, tail = 0;
        int nb = o.steps - o.warmup;
        FILE *f;
        for (k = 0; k < EVAL_SAMPLES; k++)
            ws.y[k] = sample(&o, centres, key3(4, (uint64_t)k, 0), ws.x + (size_t)k * (size_t)o.in);
        batch(&l, p, NULL, &ws, EVAL_SAMPLES, NULL, &e_loss, &e_correct);
        last = o.steps / 10 > 0 ? o.steps / 10 : 1;
        for (s = o.steps - last; s < o.steps; s++) tail += loss[s];
        qsort(step_s + o.warmup, (size_t)nb, sizeof *step_s, cmp_double);
        med = step_s[o.warmup + nb / 2];
        elem_full = (double)l.n, elem_sent = elem_full;
        if (ps && st1.iterations > st0.iterations) {
            elem_sent = (double)(st1.elements_sent - st0.elements_sent) / (double)(st1.iterations - st0.iterations);
            elem_full = (double)(st1.elements_uncompressed_equivalent - st0.elements_uncompressed_equivalent) /
                        (double)(st1.iterations - st0.iterations);
        }
        if (o.csv) {
            if (!(f = fopen(o.csv, "w"))) return fail(o.csv, "cannot write");
            fprintf(f, "step,loss\n");
            for (s = 0; s < o.steps; s++) fprintf(f, "%d,%.6f\n", s + 1, loss[s]);
            fclose(f);
        }
        printf("train_wide: RESULT world=%d rank=%d start=%d steps=%d step_ms_mean=%.2f step_ms_median=%.2f "
               "finish_ms_mean=%.2f tx_bytes_per_step=%.0f rx_bytes_per_step=%.0f elems_sent_per_step=%.0f "
               "elems_full_per_step=%.0f final_loss=%.4f eval_loss=%.4f eval_acc=%.4f identical=%s\n",
               world, o.rank_r, o.start, o.steps, 1e3 * fin / nb, 1e3 * med, 1e3 * wait_s / nb, io[0], io[1], elem_sent,
               elem_full, tail / last, e_loss / EVAL_SAMPLES, e_correct / EVAL_SAMPLES,
               hash[0] == hash[1] ? "yes" : "NO");
    }
    free(p), free(g), free(centres), free(loss), free(step_s);
    free(ws.x), free(ws.h1), free(ws.h2), free(ws.d2), free(ws.d1), free(ws.d3), free(ws.y);
    return hash[0] == hash[1] ? 0 : 1;
}
