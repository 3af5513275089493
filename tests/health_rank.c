/* SPDX-License-Identifier: MIT (see LICENSE) */
/* tests/health_rank.c — a rank for tests/test_health.sh: all-reduces in a loop, with a plan for
 * one rank at one step, so that the script can ask ddp-status about a job in a known state.
 *
 *   build/health_rank STEPS PLAN_RANK PLAN_STEP PLAN [ARG]
 *     PLAN stop       PLAN_RANK stops itself (SIGSTOP) before PLAN_STEP's all-reduce; the script
 *                     sends SIGCONT once it has asked
 *     sleep MS        PLAN_RANK sleeps MS ms in "user code" before PLAN_STEP's all-reduce
 *     none            nothing
 * Every rank prints "rank R: pid P" after init, "rank R: at STEP" before PLAN_STEP's all-reduce, and "rank R: done" at the end
 * (after destroy), or "rank R: ERROR ..." and exits 2 when a call fails. Environment: RANK,
 * WORLD_SIZE, MASTER_ADDR, MASTER_PORT, DDP_JOB_SECRET (ddp_comm_init_env).
 */
#define _POSIX_C_SOURCE 200809L
#include "ddp.h"   /* linked with build/libddp.o: tcp and shm */
#include <time.h>
#include <unistd.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void nap_ms(int ms) {
    struct timespec ts;
    ts.tv_sec = ms / 1000;
    ts.tv_nsec = (long)(ms % 1000) * 1000000L;
    while (nanosleep(&ts, &ts) != 0) {}
}

int main(int argc, char **argv) {
    ddp_comm_t *c;
    float x[256];
    int steps, who, at, i, me;
    const char *plan;
    if (argc < 5) {
        fprintf(stderr, "usage: %s STEPS PLAN_RANK PLAN_STEP stop|sleep MS|none\n", argv[0]);
        return 1;
    }
    steps = atoi(argv[1]);
    who = atoi(argv[2]);
    at = atoi(argv[3]);
    plan = argv[4];
    if (ddp_comm_init_env(&c, NULL) != DDP_SUCCESS) {
        printf("rank ?: ERROR init: %s\n", ddp_last_init_error());
        return 2;
    }
    me = ddp_comm_rank(c);
    printf("rank %d: pid %d\n", me, (int)getpid());
    fflush(stdout);
    for (i = 0; i < 256; i++) x[i] = (float)me;
    for (i = 0; i < steps; i++) {
        ddp_result_t r;
        if (i == at) {
            printf("rank %d: at %d\n", me, i);
            fflush(stdout);
            if (me == who && !strcmp(plan, "stop")) raise(SIGSTOP);
            if (me == who && !strcmp(plan, "sleep") && argc > 5) nap_ms(atoi(argv[5]));
        }
        nap_ms(2);
        if ((r = ddp_all_reduce(x, x, 256, DDP_FLOAT32, DDP_SUM, c)) != DDP_SUCCESS) {
            printf("rank %d: ERROR at step %d: %s\n", me, i, ddp_comm_last_error(c));
            fflush(stdout);
            ddp_comm_destroy(c);
            return 2;
        }
    }
    ddp_comm_destroy(c);
    printf("rank %d: done\n", me);
    return 0;
}
