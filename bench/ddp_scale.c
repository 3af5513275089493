/* SPDX-License-Identifier: MIT (see LICENSE) */
/* bench/ddp_scale.c — init and the first collective at scale: run under a launcher
 * (build/ddprun -n N build/ddp-scale). Every rank times ddp_comm_init_env and its first
 * all-reduce (one float, then 1 MiB); rank 0 prints the slowest rank's times and checks the
 * sums. bench/scale.sh runs it for N = 64 ... 1024 and prints the curve. */
#define _GNU_SOURCE
#define DDP_IMPLEMENTATION
#include "ddp.h"
#include "transports/ddp_tcp.h"
#include "transports/ddp_shm.h"
#include "bench/bench_cli.h"

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static const char usage[] =
    "usage: ddp-scale [options]\n"
    "Init and the first all-reduce at scale, one rank per process under a launcher\n"
    "(build/ddprun -n N build/ddp-scale; bench/scale.sh runs the curve). The environment\n"
    "configures it as any libddp program (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT,\n"
    "DDP_TRANSPORT, DDP_TIMEOUT_MS, ...).\n"
    "  -h, --help              this text\n"
    "      --version           the version\n";

int main(int argc, char **argv) {
    static const struct option longopts[] = {BENCH_CLI_COMMON, {NULL, 0, NULL, 0}};
    bench_cli_t cli;
    ddp_comm_t *c;
    double t0, t_init, t_ar, t_big, times[3];
    float one = 1.0f, *big;
    const size_t nbig = (size_t)1 << 18;   /* 1 MiB of float */
    size_t i;
    int rank, n, bad = 0;
    bench_cli_init(&cli, "ddp-scale", usage, argc, argv);
    while (bench_cli_next(&cli, "+:h", longopts) != -1) { }
    if (!bench_cli_end(&cli)) return cli.rc;
    t0 = now_s();
    if (ddp_comm_init_env(&c, NULL) != DDP_SUCCESS) {
        fprintf(stderr, "ddp-scale: init failed: %s\n", ddp_last_init_error());
        return 1;
    }
    t_init = now_s() - t0;
    rank = ddp_comm_rank(c);
    n = ddp_comm_size(c);
    t0 = now_s();
    if (ddp_all_reduce(&one, &one, 1, DDP_FLOAT32, DDP_SUM, c) != DDP_SUCCESS) {
        fprintf(stderr, "ddp-scale: rank %d: all_reduce: %s\n", rank, ddp_comm_last_error(c));
        return 1;
    }
    t_ar = now_s() - t0;
    big = (float *)malloc(nbig * sizeof *big);
    if (!big) return 1;
    for (i = 0; i < nbig; i++) big[i] = 1.0f;
    t0 = now_s();
    if (ddp_all_reduce(big, big, nbig, DDP_FLOAT32, DDP_SUM, c) != DDP_SUCCESS) {
        fprintf(stderr, "ddp-scale: rank %d: all_reduce 1 MiB: %s\n", rank, ddp_comm_last_error(c));
        return 1;
    }
    t_big = now_s() - t0;
    for (i = 0; i < nbig; i++) bad += big[i] != (float)n;
    bad += one != (float)n;
    times[0] = t_init; times[1] = t_ar; times[2] = (double)bad;
    if (ddp_all_reduce(times, times, 3, DDP_FLOAT64, DDP_MAX, c) != DDP_SUCCESS) return 1;
    (void)t_big;
    if (rank == 0)
        printf("ddp-scale: %d ranks, transport to rank 1: %s; slowest init %.3f s, slowest first "
               "all_reduce %.3f s; sums %s\n", n, n > 1 ? ddp_comm_transport_name(c, 1) : "self",
               times[0], times[1], times[2] == 0 ? "right" : "WRONG");
    free(big);
    ddp_comm_destroy(c);
    return times[2] == 0 ? 0 : 1;
}
