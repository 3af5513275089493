/* SPDX-License-Identifier: MIT (see LICENSE) */
/* ddprun_allreduce.c — a libddp program for tests/test_ddprun.sh: proves that the environment
 * ddprun sets is enough for ddp_comm_init_env (ranks, rendezvous on the chosen port, the job
 * secret). Each rank contributes rank + 1; every rank checks the sum and prints one line.
 * Exit 0 on success, 1 with the reason on stderr otherwise. */
#define _GNU_SOURCE
#define DDP_IMPLEMENTATION
#include "ddp.h"
#include "transports/ddp_tcp.h"

#include <stdio.h>

int main(void) {
    ddp_comm_t *comm = NULL;
    int32_t v, want;
    int n;
    if (ddp_comm_init_env(&comm, NULL) != DDP_SUCCESS) {
        fprintf(stderr, "init failed: %s\n", ddp_last_init_error());
        return 1;
    }
    n = ddp_comm_size(comm);
    v = ddp_comm_rank(comm) + 1;
    want = n * (n + 1) / 2;
    if (ddp_all_reduce(&v, &v, 1, DDP_INT32, DDP_SUM, comm) != DDP_SUCCESS) {
        fprintf(stderr, "all_reduce failed: %s\n", ddp_comm_last_error(comm));
        ddp_comm_destroy(comm);
        return 1;
    }
    printf("allreduce rank %d of %d: sum %d (want %d)\n", ddp_comm_rank(comm), n, (int)v, (int)want);
    ddp_comm_destroy(comm);
    return v == want ? 0 : 1;
}
