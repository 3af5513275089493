/* SPDX-License-Identifier: MIT (see LICENSE) */
/* bench/straggler_bench.c — does straggler attribution (ddp_straggler.h) name a rank that is
 * a few milliseconds late every step, and stay quiet when all ranks are equal?
 *
 *   build/straggler-bench [-p RANKS] [-r TRIALS] [-s STEPS] [-b BASE_MS] [-x EXTRA_MS] [-t tcp|shm]
 *
 * Defaults: 4 ranks, 20 trials, 200 steps, 10 ms base, 5 ms extra, the transport libddp picks.
 * A trial is a fresh job of forked ranks on this host. Each step a rank sleeps BASE_MS (its
 * "compute"), the slow rank EXTRA_MS more, then all-reduces a small gradient (256 floats). Calls
 * are timed as with the health thread on (stats.timed = 1). After the last step each rank
 * encodes its TIMING blob and puts it in the job's store; rank 0 feeds them to an analyser with
 * the defaults (window 1000, the WARN after 100 calls, share 0.05) and asks for its report, as
 * its health thread does every period (the analysis does not depend on how the calls are split
 * into rounds: the unit tests check that). The slow rank is trial % RANKS, so rank 0 (which
 * serves the store) is the slow one in some trials. Then the same number of trials with all
 * ranks equal.
 * Prints one row per trial and the two counts: trials where the WARN named the slow rank, and
 * trials with a WARN when all were equal. Exits 1 if a run failed. */
#define _GNU_SOURCE
#define DDP_IMPLEMENTATION
#include "ddp.h"
#include "transports/ddp_tcp.h"
#include "transports/ddp_shm.h"
#include "ddp_straggler.h"
#include "bench/bench_fork.h"
#include "bench/bench_cli.h"

#include <sys/mman.h>

#define MAX_RANKS 16

typedef struct {
    int last_rank, warned, window;
    unsigned last_count, lag_us, interval_us;
    double share, seconds;
    char warn[400];
} result_t;

typedef struct {
    int nranks, trials, steps, base_ms, extra_ms, slow, trial;
    const char *transport;
    result_t *res;               /* MAP_SHARED: rank 0 writes the trial's result */
} opts_t;

static void sleep_us(long us) {
    struct timespec ts;
    ts.tv_sec = us / 1000000;
    ts.tv_nsec = (us % 1000000) * 1000;
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {}
}

static int run_rank(void *arg, int n, int rank, int port) {
    opts_t *o = (opts_t *)arg;
    ddp_comm_desc_t d;
    ddp_comm_t *c;
    ddp_store_t *st;
    float g[256];
    unsigned char blob[_DDP_STRAGGLER_BLOB_MAX];
    char key[96];
    size_t len = 0;
    int i, k;
    double t0;
    memset(&d, 0, sizeof d);
    d.transport = o->transport;
    if (!(c = bench_ddp_init(&d, n, rank, port, "straggler-bench"))) return 1;
    st = ddp_comm_store(c);
    __atomic_store_n(&c->stats.timed, 1, __ATOMIC_RELAXED);    /* as the health thread does */
    t0 = bench_fork_now_s();
    for (i = 0; i < o->steps; i++) {
        sleep_us(1000L * o->base_ms + (rank == o->slow ? 1000L * o->extra_ms : 0));
        for (k = 0; k < 256; k++) g[k] = (float)(rank + k + i);
        if (ddp_all_reduce(g, g, 256, DDP_FLOAT32, DDP_SUM, c) != DDP_SUCCESS) {
            fprintf(stderr, "straggler-bench: rank %d: all_reduce %d: %s\n", rank, i, ddp_comm_last_error(c));
            return 1;
        }
    }
    if (_ddp_straggler_encode(&c->stats, blob, sizeof blob, &len) != 0) return 1;
    snprintf(key, sizeof key, "straggler-bench/%d/t/%d", o->trial, rank);
    if (ddp_store_set(st, key, blob, len) != DDP_SUCCESS) return 1;
    if (rank == 0) {
        static unsigned char all[MAX_RANKS][_DDP_STRAGGLER_BLOB_MAX];
        const unsigned char *bp[MAX_RANKS];
        size_t lens[MAX_RANKS];
        _ddp_straggler_t a;
        _ddp_straggler_figures_t f;
        char err[200], info[600];
        result_t *r = o->res;
        int rc;
        for (k = 0; k < n; k++) {
            snprintf(key, sizeof key, "straggler-bench/%d/t/%d", o->trial, k);
            if (ddp_store_get(st, key, all[k], sizeof all[k], &lens[k]) != DDP_SUCCESS) return 1;
            bp[k] = all[k];
        }
        if (_ddp_straggler_init(&a, n, NULL, NULL) != 0) return 1;
        if (_ddp_straggler_ingest(&a, bp, lens, err, sizeof err) < 0) {
            fprintf(stderr, "straggler-bench: %s\n", err);
            return 1;
        }
        _ddp_straggler_figures(&a, &f);
        rc = _ddp_straggler_report(&a, info, sizeof info, r->warn, sizeof r->warn);
        r->last_rank = f.last_rank;
        r->last_count = f.last_count;
        r->window = f.window;
        r->lag_us = f.median_lag_us;
        r->interval_us = f.median_interval_us;
        r->share = f.share;
        r->warned = (rc & 2) != 0;
        r->seconds = bench_fork_now_s() - t0;
        _ddp_straggler_free(&a);
    }
    ddp_barrier(c);               /* rank 0 has read every blob before the store goes */
    ddp_comm_destroy(c);
    return 0;
}

static const char usage[] =
    "usage: straggler-bench [options]\n"
    "  Is a rank that is late every step named by the straggler WARN, and is nobody named when all\n"
    "  ranks are equal? Forked ranks on this host, a fresh job per trial (bench/results/straggler.md).\n"
    "  -p, --nranks N      ranks (default 4, 2..16)\n"
    "  -r, --trials N      trials with a slow rank, and as many with all equal (default 20)\n"
    "  -s, --steps N       steps per trial (default 200, at most the 256 calls a rank's record keeps)\n"
    "  -b, --base-ms MS    each step's sleep on every rank (default 10)\n"
    "  -x, --extra-ms MS   the slow rank's extra sleep per step (default 5)\n"
    "  -t, --transport T   tcp, shm or auto (default auto)\n"
    "  -h, --help          this text\n"
    "      --version       the version\n";

int main(int argc, char **argv) {
    static const struct option longopts[] = {
        {"nranks", required_argument, NULL, 'p'}, {"trials", required_argument, NULL, 'r'},
        {"steps", required_argument, NULL, 's'}, {"base-ms", required_argument, NULL, 'b'},
        {"extra-ms", required_argument, NULL, 'x'}, {"transport", required_argument, NULL, 't'},
        BENCH_CLI_COMMON, {NULL, 0, NULL, 0}};
    bench_cli_t cli;
    opts_t o;
    int i, eq, opt, ok = 1, named = 0, false_warns = 0, failed = 0;
    memset(&o, 0, sizeof o);
    o.nranks = 4; o.trials = 20; o.steps = 200; o.base_ms = 10; o.extra_ms = 5; o.transport = NULL;
    bench_cli_init(&cli, "straggler-bench", usage, argc, argv);
    while (ok && (opt = bench_cli_next(&cli, "+:p:r:s:b:x:t:h", longopts)) != -1) {
        switch (opt) {
        case 'p': ok = bench_cli_int(&cli, 2, MAX_RANKS, &o.nranks); break;
        case 'r': ok = bench_cli_int(&cli, 1, 1000, &o.trials); break;
        case 's': ok = bench_cli_int(&cli, 1, _DDP_TIMINGS, &o.steps); break;
        case 'b': ok = bench_cli_int(&cli, 0, 10000, &o.base_ms); break;
        case 'x': ok = bench_cli_int(&cli, 0, 10000, &o.extra_ms); break;
        case 't': o.transport = strcmp(optarg, "auto") ? optarg : NULL; break;
        }
    }
    if (!ok || !bench_cli_end(&cli)) return cli.rc;
    o.res = (result_t *)mmap(NULL, sizeof(result_t), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (o.res == MAP_FAILED) { perror("mmap"); return 1; }
    printf("straggler-bench: %d ranks, %d trials x %d steps, %d ms per step, +%d ms on one rank; transport %s\n",
           o.nranks, o.trials, o.steps, o.base_ms, o.extra_ms, o.transport ? o.transport : "auto");
    printf("%-6s %-5s %5s %9s %10s %8s %13s %6s %5s %7s\n", "set", "trial", "slow", "last", "last_in", "lag_ms",
           "interval_ms", "share", "WARN", "secs");
    for (eq = 0; eq < 2; eq++) {
        for (i = 0; i < o.trials; i++) {
            int port = bench_free_port();
            result_t *r = o.res;
            memset(r, 0, sizeof *r);
            r->last_rank = -2;
            o.trial = eq * o.trials + i;
            o.slow = eq ? -1 : i % o.nranks;
            if (!port || bench_fork_ranks(o.nranks, run_rank, &o, "straggler-bench", port) != 0 || r->last_rank == -2) {
                printf("%-6s %-5d run failed\n", eq ? "equal" : "slow", i);
                failed = 1;
                continue;
            }
            if (!eq && r->warned && r->last_rank == o.slow) named++;
            if (eq && r->warned) false_warns++;
            printf("%-6s %-5d %5d %9d %5u/%-4d %8.2f %13.2f %6.3f %5s %7.1f\n", eq ? "equal" : "slow", i, o.slow,
                   r->last_rank, r->last_count, r->window, r->lag_us / 1e3, r->interval_us / 1e3, r->share,
                   r->warned ? "yes" : "no", r->seconds);
            fflush(stdout);
        }
    }
    printf("slow rank named by the WARN: %d of %d trials\n", named, o.trials);
    printf("false WARN with all ranks equal: %d of %d trials\n", false_warns, o.trials);
    return failed;
}
