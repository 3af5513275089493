/* SPDX-License-Identifier: MIT (see LICENSE) */
/* bench/ddp_async.c — ddp-async: k all-reduces at once against k one after the other (issue 7).
 *
 *   make build/ddp-async
 *   build/ddp-async -p 2 -t tcp                      # forks 2 ranks on this host itself
 *   build/ddprun -n 4 build/ddp-async -t tcp         # or one rank per process under a launcher
 *
 * For each size (bytes per all-reduce), k distinct buffers (-k, default 4) are all-reduced
 * (float32 sum) three ways, interleaved round after round so that a noisy machine hurts all
 * three alike:
 *   blocking   k ddp_all_reduce calls, one after the other
 *   async      k ddp_all_reduce_async, then k ddp_wait (the progress thread runs them)
 *   group      ddp_group_start, k ddp_all_reduce, ddp_group_end (up to 64 KiB together they
 *              are fused into one reduction: one latency instead of k)
 * Reported: the median over -r rounds of the slowest rank's time for all k, and each mode's
 * ratio to blocking (< 1 is faster). "cpu" is the CPU time of the blocking rounds (all ranks'
 * processes, user + system) over their wall time, in cores, shown when they lasted 0.2 s or more
 * (getrusage counts in ticks): when it is close to the cores the machine has, the transfer is
 * CPU-bound and no overlap can make it faster.
 *
 * Flags (--help lists them): -p ranks (fork mode, default 2)  -t transport (default auto)
 * -k operations (4)  -r rounds (15)  -b bytes (repeatable; default 8 4K 64K 1M 16M)
 */
#define _GNU_SOURCE
#define DDP_IMPLEMENTATION
#include "ddp.h"
#include "transports/ddp_tcp.h"
#include "transports/ddp_shm.h"
#include "bench/bench_fork.h"
#include "bench/bench_cli.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#define MAXK 32
#define MAXSIZES 16
#define MAXROUNDS 101

typedef struct {
    int nranks, k, rounds, nsizes;
    size_t sizes[MAXSIZES];
    const char *transport;
} opts_t;

enum { M_BLOCKING, M_ASYNC, M_GROUP, NMODES };

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static double cpu_s(void) {   /* this process, every thread */
    struct rusage u;
    getrusage(RUSAGE_SELF, &u);
    return (double)u.ru_utime.tv_sec + (double)u.ru_utime.tv_usec * 1e-6 +
           (double)u.ru_stime.tv_sec + (double)u.ru_stime.tv_usec * 1e-6;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static ddp_result_t run_mode(ddp_comm_t *c, int mode, float **buf, size_t count, int k) {
    ddp_request_t req[MAXK];
    ddp_result_t r = DDP_SUCCESS, w;
    int i;
    switch (mode) {
    case M_BLOCKING:
        for (i = 0; i < k && r == DDP_SUCCESS; i++) r = ddp_all_reduce(buf[i], buf[i], count, DDP_FLOAT32, DDP_SUM, c);
        break;
    case M_ASYNC:
        for (i = 0; i < k; i++) {
            r = ddp_all_reduce_async(buf[i], buf[i], count, DDP_FLOAT32, DDP_SUM, c, &req[i]);
            if (r != DDP_SUCCESS) break;
        }
        while (i-- > 0) if ((w = ddp_wait(&req[i])) != DDP_SUCCESS && r == DDP_SUCCESS) r = w;
        break;
    default:
        if ((r = ddp_group_start(c)) != DDP_SUCCESS) break;
        for (i = 0; i < k; i++) ddp_all_reduce(buf[i], buf[i], count, DDP_FLOAT32, DDP_SUM, c);
        r = ddp_group_end(c);   /* reports a refused call of the group too */
        break;
    }
    return r;
}

static int run_rank(void *arg, int nranks, int rank, int port) {
    const opts_t *o = (const opts_t *)arg;
    ddp_comm_t *c = NULL;
    ddp_comm_desc_t d;
    float *buf[MAXK];
    double t[NMODES][MAXROUNDS], busy[2];
    size_t maxb = 0;
    int s, i, m, me;
    memset(&d, 0, sizeof d);
    d.transport = o->transport;
    if (!(c = bench_ddp_init(&d, nranks, rank, port, "ddp-async"))) return 1;
    me = ddp_comm_rank(c);
    for (s = 0; s < o->nsizes; s++) if (o->sizes[s] > maxb) maxb = o->sizes[s];
    for (i = 0; i < o->k; i++)
        if (!(buf[i] = (float *)calloc(maxb / 4 + 1, 4))) return 1;
    if (me == 0) {
        printf("# ddp-async: %d float32 sum all-reduces at once vs one by one; %d ranks, transport %s;\n"
               "# median of %d interleaved rounds, slowest rank; ratio < 1: faster than blocking\n"
               "%10s %12s %12s %7s %12s %7s %6s\n", o->k, ddp_comm_size(c),
               ddp_comm_size(c) > 1 ? ddp_comm_transport_name(c, (me + 1) % ddp_comm_size(c)) : "none",
               o->rounds, "bytes", "blocking us", "async us", "ratio", "group us", "ratio", "cpu");
        fflush(stdout);
    }
    for (s = 0; s < o->nsizes; s++) {
        size_t count = o->sizes[s] / 4;
        double med[NMODES];
        busy[0] = busy[1] = 0;
        for (i = -1; i < o->rounds; i++) {   /* round -1 warms up */
            for (m = 0; m < NMODES; m++) {
                double t0, c0, dt;
                if (ddp_barrier(c) != DDP_SUCCESS) goto fail;
                c0 = cpu_s();
                t0 = now_s();
                if (run_mode(c, m, buf, count, o->k) != DDP_SUCCESS) goto fail;
                dt = now_s() - t0;
                if (ddp_all_reduce(&dt, &dt, 1, DDP_FLOAT64, DDP_MAX, c) != DDP_SUCCESS) goto fail;
                if (i < 0) continue;
                t[m][i] = dt;
                if (m == M_BLOCKING) { busy[0] += cpu_s() - c0; busy[1] += dt; }
            }
        }
        if (ddp_all_reduce(busy, busy, 1, DDP_FLOAT64, DDP_SUM, c) != DDP_SUCCESS) goto fail;
        for (m = 0; m < NMODES; m++) {
            qsort(t[m], (size_t)o->rounds, sizeof t[m][0], cmp_double);
            med[m] = t[m][o->rounds / 2] * 1e6;
        }
        if (me == 0) {
            char cpu[16] = "-";   /* getrusage counts in ticks: only long runs say anything */
            if (busy[1] >= 0.2) snprintf(cpu, sizeof cpu, "%.2f", busy[0] / busy[1]);
            printf("%10zu %12.1f %12.1f %7.2f %12.1f %7.2f %6s\n", count * 4, med[M_BLOCKING],
                   med[M_ASYNC], med[M_ASYNC] / med[M_BLOCKING], med[M_GROUP],
                   med[M_GROUP] / med[M_BLOCKING], cpu);
            fflush(stdout);
        }
    }
    for (i = 0; i < o->k; i++) free(buf[i]);
    ddp_comm_destroy(c);
    return 0;
fail:
    fprintf(stderr, "ddp-async: rank %d: %s\n", me, ddp_comm_last_error(c));
    return 1;
}

static const char usage[] =
    "usage: ddp-async [options]\n"
    "k all-reduces blocking, async and in a group, per size (see the comment at the top of\n"
    "bench/ddp_async.c). Forks the ranks on this host, or runs one rank under a launcher (RANK\n"
    "and WORLD_SIZE set).\n"
    "  -p, --nranks N          ranks to fork (default 2; 1..64)\n"
    "  -t, --transport NAME    tcp, shm, or auto (default: DDP_TRANSPORT, else auto)\n"
    "  -k, --ops N             all-reduces at once (default 4; 1..32)\n"
    "  -r, --rounds N          rounds, the median counts (default 15; 1..101)\n"
    "  -b, --bytes N           bytes per all-reduce, K/M suffixes; repeat for more sizes (at\n"
    "                          most 16; default 8 4K 64K 1M 16M)\n"
    "  -h, --help              this text\n"
    "      --version           the version\n";

/* -b's value: bytes with an optional K or M (binary), rounded down to whole floats. */
static int parse_bytes(bench_cli_t *cli, size_t *out) {
    char *end;
    double x = strtod(optarg, &end);
    if (end == optarg || x < 0) return bench_cli_bad(cli);
    if (*end == 'K' || *end == 'k') x *= 1024, end++;
    else if (*end == 'M' || *end == 'm') x *= 1024 * 1024, end++;
    if (*end) return bench_cli_bad(cli);
    *out = (size_t)x & ~(size_t)3;
    return 1;
}

int main(int argc, char **argv) {
    static const size_t defaults[] = {8, 4096, 65536, 1 << 20, 16 << 20};
    static const struct option longopts[] = {
        {"nranks", required_argument, NULL, 'p'}, {"transport", required_argument, NULL, 't'},
        {"ops", required_argument, NULL, 'k'}, {"rounds", required_argument, NULL, 'r'},
        {"bytes", required_argument, NULL, 'b'}, BENCH_CLI_COMMON, {NULL, 0, NULL, 0}};
    bench_cli_t cli;
    opts_t o;
    int i, opt, port, ok = 1;
    memset(&o, 0, sizeof o);
    o.nranks = 2;
    o.k = 4;
    o.rounds = 15;
    bench_cli_init(&cli, "ddp-async", usage, argc, argv);
    while (ok && (opt = bench_cli_next(&cli, "+:p:t:k:r:b:h", longopts)) != -1) {
        switch (opt) {
        case 'p': ok = bench_cli_int(&cli, 1, 64, &o.nranks); break;
        case 'k': ok = bench_cli_int(&cli, 1, MAXK, &o.k); break;
        case 'r': ok = bench_cli_int(&cli, 1, MAXROUNDS, &o.rounds); break;
        case 't': o.transport = strcmp(optarg, "auto") ? optarg : NULL; break;
        case 'b':
            if (o.nsizes == MAXSIZES) ok = bench_cli_bad(&cli);
            else ok = parse_bytes(&cli, &o.sizes[o.nsizes++]);
            break;
        }
    }
    if (!ok || !bench_cli_end(&cli)) return cli.rc;
    if (!o.nsizes) {
        for (i = 0; i < 5; i++) o.sizes[i] = defaults[i];
        o.nsizes = 5;
    }
    if (getenv("RANK") && getenv("WORLD_SIZE")) return run_rank(&o, 0, 0, 0);
    if (!(port = bench_free_port())) return 1;
    return bench_fork_ranks(o.nranks, run_rank, &o, "ddp-async", port);
}
