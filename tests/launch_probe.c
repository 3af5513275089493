/* SPDX-License-Identifier: MIT (see LICENSE) */
/* tests/launch_probe.c — one rank of a job started by a launcher (ddprun, torchrun, mpirun, srun,
 * or none): ddp_comm_init_env, then proves that the communicator holds exactly this job's ranks.
 *
 *   launch_probe TOKEN [EXPECTED_WORLD_SIZE]
 *
 * Every rank of one job is given the same TOKEN (a different one per job). The ranks all-reduce
 * the token with MIN and MAX and their rank numbers with SUM: a communicator that mixed two
 * jobs sees min != max (or a rank sum other than n(n-1)/2, or the wrong size). Prints one line
 * "launch_probe: ok token T rank R of N" per rank and exits 0; anything else exits 1 with the
 * reason. Used by tests/test_launchers.sh. */
#include "ddp.h"
#include "transports/ddp_tcp.h"
#include "transports/ddp_shm.h"
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv) {
    ddp_comm_t *c = NULL;
    int64_t tok, mn, mx, rsum;
    long want = argc > 2 ? atol(argv[2]) : -1;
    int rank, n;
    ddp_result_t r;
    if (argc < 2) { fprintf(stderr, "usage: launch_probe TOKEN [WORLD_SIZE]\n"); return 2; }
    tok = atoll(argv[1]);
    if ((r = ddp_comm_init_env(&c, NULL)) != DDP_SUCCESS) {
        fprintf(stderr, "launch_probe: init: %s\n", ddp_last_init_error());
        return 1;
    }
    rank = ddp_comm_rank(c);
    n = ddp_comm_size(c);
    mn = mx = tok;
    rsum = rank;
    if ((r = ddp_all_reduce(&mn, &mn, 1, DDP_INT64, DDP_MIN, c)) != DDP_SUCCESS ||
        (r = ddp_all_reduce(&mx, &mx, 1, DDP_INT64, DDP_MAX, c)) != DDP_SUCCESS ||
        (r = ddp_all_reduce(&rsum, &rsum, 1, DDP_INT64, DDP_SUM, c)) != DDP_SUCCESS) {
        fprintf(stderr, "launch_probe: rank %d: %s\n", rank, ddp_comm_last_error(c));
        ddp_comm_destroy(c);
        return 1;
    }
    ddp_comm_destroy(c);
    if (mn != tok || mx != tok || rsum != (int64_t)n * (n - 1) / 2 || (want > 0 && n != want)) {
        fprintf(stderr, "launch_probe: rank %d of %d, token %lld: MIXED or wrong communicator "
                "(tokens %lld..%lld, rank sum %lld, expected world size %ld)\n", rank, n,
                (long long)tok, (long long)mn, (long long)mx, (long long)rsum, want);
        return 1;
    }
    printf("launch_probe: ok token %lld rank %d of %d\n", (long long)tok, rank, n);
    return 0;
}
