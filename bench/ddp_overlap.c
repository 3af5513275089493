/* SPDX-License-Identifier: MIT (see LICENSE) */
/* bench/ddp_overlap.c — ddp-overlap: how much of the gradient all-reduce the bucket reducer hides
 * behind the backward pass (issue 8).
 *
 *   make build/ddp-overlap
 *   build/ddp-overlap -p 2 -t tcp -c 300            # forks 2 ranks on this host itself
 *   build/ddprun -n 4 build/ddp-overlap -c 300      # or one rank per process under a launcher
 *
 * The model is ResNet-50's list of parameter tensors (161 of them, 25.56 M floats), written
 * down from its architecture (conv1 7x7; bottleneck stages of 3, 4, 6, 3 blocks, 1x1-3x3-1x1
 * convs, a batch norm weight and bias after each conv, a 1x1 downsample on each stage's first
 * block; fc 2048 -> 1000): real sizes, but no real compute. Backward is simulated: tensor i's
 * gradient "takes" a share of -c milliseconds (half spread evenly over the 161 tensors, half in
 * proportion to their size: a made-up cost model), then is marked ready. By default the compute
 * is a sleep, i.e. an accelerator doing the work while the CPU is free for communication, as
 * with GPUs; -m spin burns the CPU instead (a CPU-bound backward competing with the progress
 * thread; on a machine with fewer cores than ranks x 2 that cannot overlap).
 *
 * Each iteration is timed from a barrier to the end of the step, the slowest rank counts, the
 * median of -i iterations is reported (after one warm-up). Three ways to run an iteration:
 *   compute      backward only, no communication                                  -> t_compute
 *   no overlap   backward, then one ddp_all_reduce(AVG) of every gradient (flat)  -> t_no_overlap
 *   reducer      backward marking each gradient ready, then ddp_reducer_finish    -> t_reducer
 * hidden = (t_no_overlap - t_reducer) / (t_no_overlap - t_compute), the share of the
 * communication taken off the critical path. Then the reducer again with bucket caps of 1, 5, 25
 * and 100 MiB (DDP's bucket_cap_mb; 25 is the default), first bucket 1 MiB.
 *
 * Flags (--help lists them): -p ranks (fork mode, default 2)  -t transport (default tcp)  -c compute
 * ms per backward (default 300)  -i iterations (default 5)  -m sleep|spin  -v
 * gradient_as_bucket_view  -S no sweep
 */
#define _GNU_SOURCE
#define DDP_IMPLEMENTATION
#include "ddp.h"
#include "transports/ddp_tcp.h"
#include "transports/ddp_shm.h"

#include "bench/bench_fork.h"
#include "bench/bench_cli.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAXT 256

typedef struct {
    int nranks, iters, spin, view, sweep;
    double compute_ms;
    const char *transport;
} opts_t;

static size_t sizes[MAXT];
static int ntensors;
static size_t total;

static void add(size_t n) { sizes[ntensors++] = n; total += n; }
static void conv_bn(size_t cin, size_t cout, size_t k) { add(cin * cout * k * k); add(cout); add(cout); }

/* ResNet-50's parameter tensors, in forward (registration) order. */
static void resnet50(void) {
    static const size_t mid[4] = {64, 128, 256, 512}, blocks[4] = {3, 4, 6, 3};
    size_t in = 64, s, b;
    conv_bn(3, 64, 7);
    for (s = 0; s < 4; s++) {
        size_t out = mid[s] * 4;
        for (b = 0; b < blocks[s]; b++) {
            conv_bn(b ? out : in, mid[s], 1);
            conv_bn(mid[s], mid[s], 3);
            conv_bn(mid[s], out, 1);
            if (b == 0) conv_bn(in, out, 1);      /* downsample */
        }
        in = out;
    }
    add(2048 * 1000);
    add(1000);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void compute(double s, int spin) {
    if (s <= 0) return;
    if (spin) {
        double end = now_s() + s;
        while (now_s() < end) { }
    } else {
        struct timespec ts;
        ts.tv_sec = (time_t)s;
        ts.tv_nsec = (long)((s - (double)ts.tv_sec) * 1e9);
        while (nanosleep(&ts, &ts) != 0 && errno == EINTR) { }
    }
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

enum { MODE_COMPUTE, MODE_NO_OVERLAP, MODE_REDUCER };

/* Median over iterations of the slowest rank's iteration time, in ms; < 0 on failure. */
static double run_mode(ddp_comm_t *c, const opts_t *o, int mode, size_t cap, float *flat, int *nbuckets,
                       double *backward_ms) {
    ddp_reducer_t *r = NULL;
    double t[64], tb[64], cost[MAXT];
    int it, i, n = o->iters + 1;
    if (n > 64) n = 64;
    for (i = 0; i < ntensors; i++)
        cost[i] = o->compute_ms * 1e-3 * (0.5 / ntensors + 0.5 * (double)sizes[i] / (double)total);
    if (mode == MODE_REDUCER) {
        ddp_reducer_desc_t d;
        size_t off = 0;
        memset(&d, 0, sizeof d);
        d.bucket_cap_bytes = cap;
        d.gradient_as_bucket_view = o->view;
        if (ddp_reducer_create(&r, c, &d) != DDP_SUCCESS) return -1;
        for (i = 0; i < ntensors; i++) {
            ddp_reducer_add_param(r, flat + off, sizes[i], DDP_FLOAT32);
            off += sizes[i];
        }
        *nbuckets = ddp_reducer_num_buckets(r);
    }
    for (it = 0; it < n; it++) {
        double t0;
        if (ddp_barrier(c) != DDP_SUCCESS) return -1;
        t0 = now_s();
        for (i = ntensors - 1; i >= 0; i--) {
            compute(cost[i], o->spin);
            if (mode == MODE_REDUCER && ddp_reducer_grad_ready(r, i) != DDP_SUCCESS) return -1;
        }
        tb[it] = now_s() - t0;
        if (mode == MODE_NO_OVERLAP && ddp_all_reduce(flat, flat, total, DDP_FLOAT32, DDP_AVG, c) != DDP_SUCCESS)
            return -1;
        if (mode == MODE_REDUCER && ddp_reducer_finish(r) != DDP_SUCCESS) {
            fprintf(stderr, "ddp-overlap: %s\n", ddp_reducer_last_error(r));
            return -1;
        }
        t[it] = now_s() - t0;
        if (ddp_all_reduce(&t[it], &t[it], 1, DDP_FLOAT64, DDP_MAX, c) != DDP_SUCCESS ||
            ddp_all_reduce(&tb[it], &tb[it], 1, DDP_FLOAT64, DDP_MAX, c) != DDP_SUCCESS) return -1;
    }
    if (r) ddp_reducer_destroy(r);
    qsort(t + 1, (size_t)(n - 1), sizeof t[0], cmp_double);   /* t[0]: warm-up (and the rebuild) */
    qsort(tb + 1, (size_t)(n - 1), sizeof tb[0], cmp_double);
    if (backward_ms) *backward_ms = tb[1 + (n - 1) / 2] * 1e3;
    return t[1 + (n - 1) / 2] * 1e3;
}

static int run_rank(const opts_t *o, int nranks, int rank, int port) {
    ddp_comm_t *c = NULL;
    ddp_comm_desc_t d;
    float *flat;
    double tc, tn, tr, tb;
    int me, nb = 0, k;
    memset(&d, 0, sizeof d);
    d.transport = o->transport;
    if (!(c = bench_ddp_init(&d, nranks, rank, port, "ddp-overlap"))) return 1;
    me = ddp_comm_rank(c);
    flat = (float *)calloc(total, sizeof(float));
    if (!flat) return 1;
    if (me == 0) {
        printf("# ddp-overlap: ResNet-50's %d gradient tensors, %zu floats (%.1f MB); %d ranks, transport %s;\n"
               "# backward compute %.0f ms (%s), median of %d iterations, slowest rank; timings on a shared "
               "machine are noisy\n", ntensors, total, (double)total * 4 / 1e6, ddp_comm_size(c),
               ddp_comm_transport_name(c, (me + 1) % ddp_comm_size(c)), o->compute_ms,
               o->spin ? "spinning CPU" : "sleep: an accelerator's time", o->iters);
        fflush(stdout);
    }
    tc = run_mode(c, o, MODE_COMPUTE, 0, flat, &nb, NULL);
    tn = run_mode(c, o, MODE_NO_OVERLAP, 0, flat, &nb, NULL);
    tr = run_mode(c, o, MODE_REDUCER, DDP_REDUCER_DEFAULT_BUCKET_CAP_BYTES, flat, &nb, &tb);
    if (tc < 0 || tn < 0 || tr < 0) { fprintf(stderr, "ddp-overlap: rank %d: %s\n", me, ddp_comm_last_error(c)); return 1; }
    if (me == 0) {
        printf("%-34s %9s %8s\n", "# mode", "iter ms", "hidden");
        printf("%-34s %9.1f\n", "compute only", tc);
        printf("%-34s %9.1f   (all-reduce %.1f ms after backward)\n", "no overlap: all-reduce after", tn, tn - tc);
        printf("%-34s %9.1f %7.0f%%   (%d buckets, %.1f ms exposed: backward slower by %.1f, "
               "finish %.1f)\n", "reducer, 25 MiB buckets", tr, 100 * (tn - tr) / (tn - tc), nb, tr - tc,
               tb - tc, tr - tb);
        fflush(stdout);
    }
    if (o->sweep) {
        static const size_t caps[4] = {1, 5, 25, 100};
        if (me == 0) printf("# bucket-size sweep (first bucket 1 MiB)\n%-34s %9s %8s\n", "# bucket cap", "iter ms", "hidden");
        for (k = 0; k < 4; k++) {
            double t = run_mode(c, o, MODE_REDUCER, caps[k] << 20, flat, &nb, &tb);
            char label[64];
            if (t < 0) { fprintf(stderr, "ddp-overlap: %s\n", ddp_comm_last_error(c)); return 1; }
            snprintf(label, sizeof label, "reducer, %zu MiB buckets (%d)", caps[k], nb);
            if (me == 0) {
                printf("%-34s %9.1f %7.0f%%   (backward +%.1f, finish %.1f)\n", label, t,
                       100 * (tn - t) / (tn - tc), tb - tc, t - tb);
                fflush(stdout);
            }
        }
    }
    free(flat);
    ddp_comm_destroy(c);
    return 0;
}

static int run_rank_forked(void *arg, int n, int rank, int port) {
    return run_rank((const opts_t *)arg, n, rank, port);
}

static const char usage[] =
    "usage: ddp-overlap [options]\n"
    "How much of the gradient all-reduce the bucket reducer hides behind a simulated ResNet-50\n"
    "backward (see the comment at the top of bench/ddp_overlap.c). Forks the ranks on this host,\n"
    "or runs one rank under a launcher (RANK and WORLD_SIZE set).\n"
    "  -p, --nranks N          ranks to fork (default 2; 1..64)\n"
    "  -t, --transport NAME    tcp (default), shm, or auto\n"
    "  -c, --compute-ms MS     simulated backward compute per iteration (default 300)\n"
    "  -i, --iters N           timed iterations, the median counts (default 5; 1..63)\n"
    "  -m, --mode sleep|spin   the compute sleeps (an accelerator; default) or burns the CPU\n"
    "  -v, --bucket-view       gradient_as_bucket_view\n"
    "  -S, --no-sweep          skip the bucket-cap sweep (1, 5, 25, 100 MiB)\n"
    "  -h, --help              this text\n"
    "      --version           the version\n";

int main(int argc, char **argv) {
    static const struct option longopts[] = {
        {"nranks", required_argument, NULL, 'p'}, {"transport", required_argument, NULL, 't'},
        {"compute-ms", required_argument, NULL, 'c'}, {"iters", required_argument, NULL, 'i'},
        {"mode", required_argument, NULL, 'm'}, {"bucket-view", no_argument, NULL, 'v'},
        {"no-sweep", no_argument, NULL, 'S'}, BENCH_CLI_COMMON, {NULL, 0, NULL, 0}};
    bench_cli_t cli;
    opts_t o;
    int opt, port, ok = 1;
    memset(&o, 0, sizeof o);
    o.nranks = 2;
    o.iters = 5;
    o.compute_ms = 300;
    o.transport = "tcp";
    o.sweep = 1;
    bench_cli_init(&cli, "ddp-overlap", usage, argc, argv);
    while (ok && (opt = bench_cli_next(&cli, "+:p:t:c:i:m:vSh", longopts)) != -1) {
        switch (opt) {
        case 'p': ok = bench_cli_int(&cli, 1, 64, &o.nranks); break;
        case 'i': ok = bench_cli_int(&cli, 1, 63, &o.iters); break;
        case 'c': ok = bench_cli_double(&cli, 0, &o.compute_ms); break;
        case 't': o.transport = strcmp(optarg, "auto") ? optarg : NULL; break;
        case 'm':
            if (strcmp(optarg, "sleep") && strcmp(optarg, "spin")) ok = bench_cli_bad(&cli);
            o.spin = !strcmp(optarg, "spin");
            break;
        case 'v': o.view = 1; break;
        case 'S': o.sweep = 0; break;
        }
    }
    if (!ok || !bench_cli_end(&cli)) return cli.rc;
    resnet50();
    if (getenv("RANK") && getenv("WORLD_SIZE")) return run_rank(&o, 0, 0, 0);
    if (!(port = bench_free_port())) return 1;
    return bench_fork_ranks(o.nranks, run_rank_forked, &o, "ddp-overlap", port);
}
