/* SPDX-License-Identifier: MIT (see LICENSE) */
/* ddprun_store_survives.c — a libddp program for tests/test_ddprun_elastic.sh: does the
 * rendezvous store outlive rank 0? Every rank joins a communicator (ddp_comm_init_env) and checks
 * one all-reduce, then writes DIR/pid.RANK. Rank 0 then waits to be killed (the test kills it).
 * The others wait for DIR/go (the test makes it once rank 0 is gone) and use the communicator's
 * store: each sets survivor/RANK, adds 1 to survivors and gets every other survivor's key.
 * Under ddprun the store is ddprun's and all of that succeeds; under a launcher where rank 0
 * hosts the store (mpirun, srun) it must fail with an error that says the store went with rank 0.
 *
 *     ddprun_store_survives DIR
 *
 * Prints "rank R: DDP_ELASTIC_MIN_RANKS=..." and, on success, "rank R: store ok after rank 0 was
 * lost ..." to stdout; exit 0. On a store error, "rank R: store failed after rank 0 was lost:
 * <the error>" and "rank R: the next store call failed too: <its error>" to stderr; exit 1. Every wait is bounded (60 s for a file). */
#define _GNU_SOURCE
#define DDP_IMPLEMENTATION
#include "ddp.h"
#include "transports/ddp_tcp.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* Waits (at most 60 s) until path exists: 1 if it does. */
static int wait_file(const char *path) {
    const struct timespec step = {0, 10 * 1000 * 1000};
    int i;
    for (i = 0; i < 6000; i++) {
        if (access(path, F_OK) == 0) return 1;
        nanosleep(&step, NULL);
    }
    return 0;
}

/* DIR/pid.RANK, whole or not at all (written aside, then renamed). */
static int write_pid(const char *dir, int rank) {
    char tmp[4096], path[4096];
    FILE *f;
    snprintf(tmp, sizeof tmp, "%s/.pid.%d", dir, rank);
    snprintf(path, sizeof path, "%s/pid.%d", dir, rank);
    if (!(f = fopen(tmp, "w"))) return 0;
    fprintf(f, "%ld\n", (long)getpid());
    if (fclose(f) != 0) return 0;
    return rename(tmp, path) == 0;
}

/* A store call failed: says why, then tries one more (a lost connection is retried by the next
 * call; a store that is gone must say so at once there too, not after DDP_TIMEOUT_MS). */
static int store_failed(int rank, ddp_store_t *s) {
    int exists = 0;
    fprintf(stderr, "rank %d: store failed after rank 0 was lost: %s\n", rank, ddp_store_last_error(s));
    if (ddp_store_check(s, "survivors", &exists) != DDP_SUCCESS)
        fprintf(stderr, "rank %d: the next store call failed too: %s\n", rank, ddp_store_last_error(s));
    else
        fprintf(stderr, "rank %d: the next store call succeeded\n", rank);
    return 1;
}

int main(int argc, char **argv) {
    ddp_comm_t *comm = NULL;
    ddp_store_t *s;
    char path[4096], key[64], val[16];
    const char *min = getenv("DDP_ELASTIC_MIN_RANKS");
    int32_t v;
    int64_t count = 0;
    int n, rank, q;
    if (argc != 2) {
        fprintf(stderr, "usage: ddprun_store_survives DIR\n");
        return 2;
    }
    if (ddp_comm_init_env(&comm, NULL) != DDP_SUCCESS) {
        fprintf(stderr, "init failed: %s\n", ddp_last_init_error());
        return 1;
    }
    n = ddp_comm_size(comm);
    rank = ddp_comm_rank(comm);
    v = 1;
    if (ddp_all_reduce(&v, &v, 1, DDP_INT32, DDP_SUM, comm) != DDP_SUCCESS || v != n) {
        fprintf(stderr, "rank %d: all_reduce failed: %s\n", rank, ddp_comm_last_error(comm));
        return 1;
    }
    printf("rank %d: DDP_ELASTIC_MIN_RANKS=%s\n", rank, min ? min : "(unset)");
    fflush(stdout);
    if (!write_pid(argv[1], rank)) {
        fprintf(stderr, "rank %d: cannot write %s/pid.%d\n", rank, argv[1], rank);
        return 1;
    }
    if (rank == 0) {   /* to be killed; the bound only keeps a broken test from hanging */
        snprintf(path, sizeof path, "%s/never", argv[1]);
        wait_file(path);
        fprintf(stderr, "rank 0: was not killed within 60 s\n");
        return 3;
    }
    snprintf(path, sizeof path, "%s/go", argv[1]);
    if (!wait_file(path)) {
        fprintf(stderr, "rank %d: no %s within 60 s\n", rank, path);
        return 1;
    }
    /* Rank 0 is gone. The communicator is not used again: only its store. */
    s = ddp_comm_store(comm);
    snprintf(key, sizeof key, "survivor/%d", rank);
    if (ddp_store_set(s, key, "ok", 2) != DDP_SUCCESS) return store_failed(rank, s);
    if (ddp_store_add(s, "survivors", 1, &count) != DDP_SUCCESS) return store_failed(rank, s);
    for (q = 1; q < n; q++) {
        size_t len = 0;
        snprintf(key, sizeof key, "survivor/%d", q);
        if (ddp_store_get(s, key, val, sizeof val, &len) != DDP_SUCCESS) return store_failed(rank, s);
        if (len != 2 || memcmp(val, "ok", 2) != 0) {
            fprintf(stderr, "rank %d: %s holds %zu bytes, not \"ok\"\n", rank, key, len);
            return 1;
        }
    }
    printf("rank %d: store ok after rank 0 was lost: set, add (%lld so far), get of ranks 1-%d\n", rank,
           (long long)count, n - 1);
    fflush(stdout);
    return 0;   /* no destroy: it would wait on rank 0 (the shrink is another test's business) */
}
