/* SPDX-License-Identifier: MIT (see LICENSE) */
/* tests/test_rdma.c — the ibverbs transport on a real (soft-RoCE) device. Prints TAP.
 *
 *   make test-rdma                                   (inside the VM: ../shared/rdma-vm/run.sh)
 *   build/test_rdma                                  (skips without an RDMA device)
 *   DDP_TEST_ONLY=dead build/test_rdma               (one scenario)
 *
 * WHAT RUNS
 *   - the core collective suite (tests/test_collectives.c, included, unchanged): every collective x
 *     dtype x op, in and out of place, counts {0, 1, 3, 1000} and the (1<<20)+7 count for a subset
 *     of dtype x op (up to 8 MiB buffers) at p = 2 and 4, counts up to 100003 at p = 3, with
 *     DDP_TRANSPORT=ibverbs; the ring with 4 KiB segments (many messages in flight, bounce-buffer
 *     and inline sizes) at p = 2; recursive doubling at p = 4. Its "tcp" mode is turned into ibverbs here (setenv wrapper),
 *     and its per-peer transport check demands ibverbs.
 *   - auto selection: two fake hosts (DDP_HOST_ID) x 2 ranks: shm inside a host, ibverbs across
 *     (priority between shm and tcp); an all-reduce across all four.
 *   - fallback: DDP_IB_HCA naming no device: forced ibverbs fails init naming the variable, auto
 *     goes on over tcp.
 *   - mismatch: ranks calling all-reduce with different counts (small: bounce path; large: zero
 *     copy) both get DDP_ERR_MISMATCH from ibverbs.
 *   - dead peer: a rank exits (SIGKILL, no goodbye) in the middle of a loop of all-reduces; the
 *     survivors must return DDP_ERR_REMOTE within 20 s (the keepalive + retry budget).
 *   - registration cache: the same 4 MiB buffer twice: registered on the first call only, cache hits
 *     on the second; the buffer munmap()ed and a new mapping made at the same address: the stale
 *     registration is detected and the result is right (a stale MR would send old data and land
 *     received data in the old pages); malloc/free/malloc: right results.
 * Built with DDP_IBV_DLOPEN, so the binary also links (and skips) on a host without libibverbs. */
#define _GNU_SOURCE
#define DDP_IMPLEMENTATION
#if defined(__has_include)
#if __has_include(<infiniband/verbs.h>)
#define T_HAVE_VERBS 1
#endif
#endif

#ifndef T_HAVE_VERBS
#include <stdio.h>
int main(void) {
    printf("1..0 # SKIP libibverbs headers not installed (apt-get install libibverbs-dev)\n");
    return 0;
}
#else

#ifndef DDP_IBV_DLOPEN
#define DDP_IBV_DLOPEN
#endif
#include "ddp.h"
#include "transports/ddp_ibverbs.h"
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

/* test_collectives.c's "tcp" mode, run over ibverbs: its mode_setup() sets DDP_TRANSPORT=tcp,
 * which becomes ibverbs; its check that every peer uses the mode's transport sees "tcp" only
 * for a peer on ibverbs. */
static int t_rdma_on;
static int t_rdma_setenv(const char *name, const char *value, int overwrite) {
    if (t_rdma_on && !strcmp(name, "DDP_TRANSPORT") && !strcmp(value, "tcp")) value = "ibverbs";
    return setenv(name, value, overwrite);
}
static const char *t_rdma_transport_name(const ddp_comm_t *c, int peer) {
    const char *t = ddp_comm_transport_name(c, peer);
    if (!t_rdma_on) return t;
    return !strcmp(t, "ibverbs") ? "tcp" : !strcmp(t, "tcp") ? "tcp, not ibverbs" : t;
}
#define setenv t_rdma_setenv
#define ddp_comm_transport_name t_rdma_transport_name
#define main test_collectives_main
#include "tests/test_collectives.c"
#undef main
#undef setenv
#undef ddp_comm_transport_name

/* ------------------------------------------------------------------------- own scenarios */
typedef struct {
    int r[T_MAX_RANKS];                 /* result code per rank */
    double secs[T_MAX_RANKS];
    char msg[T_MAX_RANKS][400];
    char tname[T_MAX_RANKS][T_MAX_RANKS][16];
    ddp_ibverbs_stats_t s0[T_MAX_RANKS], s1[T_MAX_RANKS], s2[T_MAX_RANKS];
    int same_addr[T_MAX_RANKS], bad[T_MAX_RANKS], bad2[T_MAX_RANKS], bad3[T_MAX_RANKS];
} rd_shm_t;
static rd_shm_t *R;

static void rd_msg(int rank, const char *m) { _ddp_strlcpy(R->msg[rank], m, sizeof R->msg[rank]); }

static ddp_result_t rd_init(ddp_comm_t **comm, int rank, int p, const char *transport) {
    ddp_comm_desc_t d;
    t_desc(&d, 60000);
    d.transport = transport;
    return ddp_comm_init(comm, p, rank, &d);
}

/* Every rank contributes rank + 1 + (i % 13): the sum is known. */
static void rd_fill(float *x, size_t n, int rank) { size_t i; for (i = 0; i < n; i++) x[i] = (float)(rank + 1 + (int)(i % 13)); }
static int rd_check(const float *x, size_t n, int p) {
    size_t i;
    for (i = 0; i < n; i++) {
        float want = (float)(p * (p + 1) / 2 + p * (int)(i % 13));
        if (x[i] != want) return 1;
    }
    return 0;
}

static int rd_auto_child(int rank, int p, void *arg) {
    ddp_comm_t *c = NULL;
    size_t n = (size_t)1 << 18;
    float *x;
    int k;
    (void)arg;
    setenv("DDP_HOST_ID", rank < p / 2 ? "fake-host-a" : "fake-host-b", 1);
    unsetenv("DDP_TRANSPORT");
    R->r[rank] = rd_init(&c, rank, p, NULL);
    if (R->r[rank] != DDP_SUCCESS) { rd_msg(rank, ddp_last_init_error()); return 1; }
    for (k = 0; k < p; k++) _ddp_strlcpy(R->tname[rank][k], ddp_comm_transport_name(c, k), sizeof R->tname[rank][k]);
    x = (float *)malloc(n * sizeof *x);
    rd_fill(x, n, rank);
    R->r[rank] = ddp_all_reduce(x, x, n, DDP_FLOAT32, DDP_SUM, c);
    R->bad[rank] = rd_check(x, n, p);
    rd_msg(rank, ddp_comm_last_error(c));
    free(x);
    ddp_comm_destroy(c);
    return R->r[rank] == DDP_SUCCESS && !R->bad[rank] ? 0 : 1;
}

static int rd_fallback_child(int rank, int p, void *arg) {
    ddp_comm_t *c = NULL;
    int forced = *(int *)arg;
    float x = 1.0f;
    setenv("DDP_IB_HCA", "=no_such_hca", 1);
    setenv("DDP_HOST_ID", rank == 0 ? "fake-host-a" : "fake-host-b", 1);
    R->r[rank] = rd_init(&c, rank, p, forced ? "ibverbs" : NULL);
    if (R->r[rank] != DDP_SUCCESS) { rd_msg(rank, ddp_last_init_error()); return 0; }
    _ddp_strlcpy(R->tname[rank][1 - rank], ddp_comm_transport_name(c, 1 - rank), sizeof R->tname[rank][0]);
    R->r[rank] = ddp_all_reduce(&x, &x, 1, DDP_FLOAT32, DDP_SUM, c);
    R->bad[rank] = x != 2.0f;
    ddp_comm_destroy(c);
    return 0;
}

static int rd_mismatch_child(int rank, int p, void *arg) {
    ddp_comm_t *c = NULL;
    size_t base = *(size_t *)arg, n = base + (size_t)rank;   /* rank 1 asks for one more */
    float *x = (float *)calloc(n, sizeof *x);
    if (rd_init(&c, rank, p, "ibverbs") != DDP_SUCCESS) { R->r[rank] = -1; rd_msg(rank, ddp_last_init_error()); free(x); return 1; }
    R->r[rank] = ddp_all_reduce(x, x, n, DDP_FLOAT32, DDP_SUM, c);
    rd_msg(rank, ddp_comm_last_error(c));
    free(x);
    ddp_comm_destroy(c);
    return 0;
}

static int rd_dead_child(int rank, int p, void *arg) {
    ddp_comm_t *c = NULL;
    size_t n = (size_t)1 << 16;
    float *x = (float *)calloc(n, sizeof *x);
    double t0 = 0;
    int i;
    (void)arg;
    if (rd_init(&c, rank, p, "ibverbs") != DDP_SUCCESS) { R->r[rank] = -1; rd_msg(rank, ddp_last_init_error()); free(x); return 1; }
    for (i = 0; i < 1000; i++) {
        if (i == 3 && rank == p - 1) raise(SIGKILL);        /* no goodbye, no close */
        if (i == 3) t0 = t_now();
        R->r[rank] = ddp_all_reduce(x, x, n, DDP_FLOAT32, DDP_SUM, c);
        if (R->r[rank] != DDP_SUCCESS) break;
    }
    R->secs[rank] = t_now() - t0;
    ddp_ibverbs_stats(&R->s0[rank]);
    rd_msg(rank, ddp_comm_last_error(c));
    free(x);
    ddp_comm_destroy(c);
    return 0;
}

static int rd_regcache_child(int rank, int p, void *arg) {
    ddp_comm_t *c = NULL;
    const size_t n = (size_t)1 << 20, bytes = n * sizeof(float);   /* 4 MiB */
    float *x, *y;
    void *again;
    (void)arg;
    if (rd_init(&c, rank, p, "ibverbs") != DDP_SUCCESS) { R->r[rank] = -1; rd_msg(rank, ddp_last_init_error()); return 1; }
    x = (float *)mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    rd_fill(x, n, rank);
    ddp_ibverbs_stats(&R->s0[rank]);
    R->r[rank] = ddp_all_reduce(x, x, n, DDP_FLOAT32, DDP_SUM, c);
    R->bad[rank] = rd_check(x, n, p);
    ddp_ibverbs_stats(&R->s1[rank]);
    rd_fill(x, n, rank);
    if (R->r[rank] == DDP_SUCCESS) R->r[rank] = ddp_all_reduce(x, x, n, DDP_FLOAT32, DDP_SUM, c);
    R->bad[rank] |= rd_check(x, n, p) << 1;
    ddp_ibverbs_stats(&R->s2[rank]);
    /* Unmapped and mapped again at the same address: new pages behind the old registration. */
    munmap(x, bytes);
    again = mmap(x, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
    if (again == MAP_FAILED) again = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    R->same_addr[rank] = again == (void *)x;
    x = (float *)again;
    rd_fill(x, n, rank);
    if (R->r[rank] == DDP_SUCCESS) R->r[rank] = ddp_all_reduce(x, x, n, DDP_FLOAT32, DDP_SUM, c);
    R->bad2[rank] = rd_check(x, n, p);
    ddp_ibverbs_stats(&R->s0[rank]);          /* reused: after the remap */
    munmap(x, bytes);
    /* malloc / free / malloc, out of place. */
    x = (float *)malloc(bytes);
    y = (float *)malloc(bytes);
    rd_fill(x, n, rank);
    if (R->r[rank] == DDP_SUCCESS) R->r[rank] = ddp_all_reduce(x, y, n, DDP_FLOAT32, DDP_SUM, c);
    R->bad3[rank] = rd_check(y, n, p);
    free(x);
    free(y);
    x = (float *)malloc(bytes);
    y = (float *)malloc(bytes);
    rd_fill(x, n, rank);
    if (R->r[rank] == DDP_SUCCESS) R->r[rank] = ddp_all_reduce(x, y, n, DDP_FLOAT32, DDP_SUM, c);
    R->bad3[rank] |= rd_check(y, n, p) << 1;
    free(x);
    free(y);
    rd_msg(rank, ddp_comm_last_error(c));
    ddp_comm_destroy(c);
    return 0;
}

static int rd_probe_child(int rank, int p, void *arg) {
    ddp_comm_t *c = NULL;
    (void)arg;
    setenv("DDP_DEBUG", "NONE", 1);       /* the skip line says why */
    R->r[rank] = rd_init(&c, rank, p, "ibverbs");
    rd_msg(rank, ddp_last_init_error());
    if (c) ddp_comm_destroy(c);
    return 0;
}

static void *rd_shm(void) { R = (rd_shm_t *)t_shm_user(sizeof(rd_shm_t)); return R; }

int main(void) {
    static const size_t base_counts[] = {0, 1, 3, 1000};
    static const size_t ring_counts[] = {0, 1, 3, 1000, MID};
    static const size_t rd_counts[] = {1, 3, 1000, MID};
    run_cfg_t runs[16];
    int nruns = 0, i, r;
    double t0;
    t_init();
    setvbuf(stdout, NULL, _IOLBF, 0);
    /* An RDMA device at all? One rank, forced ibverbs: init opens the device. */
    rd_shm();
    t_run_ranks(1, rd_probe_child, NULL, 60);
    if (R->r[0] != DDP_SUCCESS) {
        printf("1..0 # SKIP no usable RDMA device here (%.200s); run it in the VM: "
               "../shared/rdma-vm/run.sh 'make test-rdma'\n", R->msg[0]);
        return 0;
    }
    t0 = t_now();
    if (t_selected("suite")) {
        /* About 4 minutes in the 2-vCPU TCG VM (the references cost more than the transfers). */
        add_run(runs, &nruns, "tcp", 2, 0, NULL, BIG_SUBSET, 0, base_counts, 4);
        add_run(runs, &nruns, "tcp", 3, 0, NULL, BIG_NONE, 0, ring_counts, 5);
        add_run(runs, &nruns, "tcp", 4, 0, NULL, BIG_SUBSET, 0, base_counts, 4);
        add_run(runs, &nruns, "tcp", 2, 4096, "ring", BIG_NONE, 0, ring_counts, 5);
        add_run(runs, &nruns, "tcp", 4, 0, "rd", BIG_NONE, 1, rd_counts, 4);
        t_rdma_on = 1;
        for (i = 0; i < nruns; i++) {
            int nbad;
            S = (coll_shm_t *)t_shm_user(sizeof(coll_shm_t));
            S->ncases = build_cases(&runs[i]);
            nbad = t_run_ranks(runs[i].p, child, &runs[i], 600);
            report_run(&runs[i], nbad);
        }
        t_rdma_on = 0;
        diag("collective suite over ibverbs: %.1f s", t_now() - t0);
    }

    if (t_selected("auto")) {
        int okk = 1;
        rd_shm();
        r = t_run_ranks(4, rd_auto_child, NULL, 120);
        for (i = 0; i < 4; i++) {
            int k;
            if (R->r[i] != DDP_SUCCESS || R->bad[i]) { okk = 0; diag("rank %d: %s %s", i, ddp_strerror((ddp_result_t)R->r[i]), R->msg[i]); }
            for (k = 0; k < 4; k++) {
                const char *want = k == i ? "self" : (k < 2) == (i < 2) ? "shm" : "ibverbs";
                if (strcmp(R->tname[i][k], want)) { okk = 0; diag("rank %d -> %d: %s, want %s", i, k, R->tname[i][k], want); }
            }
        }
        ok(r == 0 && okk, "auto, 2 fake hosts x 2 ranks: shm within a host, ibverbs across; 1 MiB all_reduce right");
    }

    if (t_selected("fallback")) {
        int forced = 1;
        rd_shm();
        t_run_ranks(2, rd_fallback_child, &forced, 120);
        ok(R->r[0] != DDP_SUCCESS && strstr(R->msg[0], "DDP_IB_HCA") != NULL,
           "DDP_TRANSPORT=ibverbs, DDP_IB_HCA matching nothing: init fails naming it (%.160s)", R->msg[0]);
        forced = 0;
        rd_shm();
        t_run_ranks(2, rd_fallback_child, &forced, 120);
        ok(R->r[0] == DDP_SUCCESS && R->r[1] == DDP_SUCCESS && !R->bad[0] && !strcmp(R->tname[0][1], "tcp"),
           "auto, no usable HCA: falls back to tcp (rank 0 -> 1: %s; %s)", R->tname[0][1], R->msg[0]);
    }

    if (t_selected("mismatch")) {
        static const size_t bases[2] = {100, 300000};
        int j;
        for (j = 0; j < 2; j++) {
            size_t base = bases[j];
            rd_shm();
            t_run_ranks(2, rd_mismatch_child, &base, 120);
            ok(R->r[0] == DDP_ERR_MISMATCH && R->r[1] == DDP_ERR_MISMATCH &&
               strstr(R->msg[0], "ibverbs") && strstr(R->msg[1], "ibverbs"),
               "all_reduce of %zu vs %zu floats: both ranks DDP_ERR_MISMATCH", base, base + 1);
            for (i = 0; i < 2; i++) diag("  rank %d: %s", i, R->msg[i]);
        }
    }

    if (t_selected("dead")) {
        int okk = 1;
        rd_shm();
        t_run_ranks(3, rd_dead_child, NULL, 120);
        for (i = 0; i < 2; i++) {
            if (R->r[i] != DDP_ERR_REMOTE || R->secs[i] > 30) okk = 0;   /* half the 60 s timeout */
            diag("  survivor rank %d: %s after %.2f s (%llu keepalive probes): %.300s", i,
                 ddp_strerror((ddp_result_t)R->r[i]), R->secs[i],
                 (unsigned long long)R->s0[i].keepalive_probes, R->msg[i]);
        }
        ok(okk, "a rank killed (SIGKILL) mid-loop: both survivors return DDP_ERR_REMOTE within 30 s (timeout 60 s)");
    }

    if (t_selected("regcache")) {
        int okk1 = 1, okk2 = 1, okk3 = 1;
        rd_shm();
        t_run_ranks(2, rd_regcache_child, NULL, 120);
        for (i = 0; i < 2; i++) {
            uint64_t reg1 = R->s1[i].reg_registrations - 0, reg2 = R->s2[i].reg_registrations - R->s1[i].reg_registrations;
            uint64_t hits2 = R->s2[i].reg_hits - R->s1[i].reg_hits;
            uint64_t stale = R->s0[i].reg_stale - R->s2[i].reg_stale;
            diag("  rank %d: registrations %llu then %llu (hits %llu); after remap (same address: %s) "
                 "stale %llu, registrations %llu; zero-copy sends %llu, bounce %llu, inline %llu",
                 i, (unsigned long long)reg1, (unsigned long long)reg2, (unsigned long long)hits2,
                 R->same_addr[i] ? "yes" : "no", (unsigned long long)stale,
                 (unsigned long long)(R->s0[i].reg_registrations - R->s2[i].reg_registrations),
                 (unsigned long long)R->s0[i].zero_copy_sends, (unsigned long long)R->s0[i].bounce_sends,
                 (unsigned long long)R->s0[i].inline_sends);
            if (R->r[i] != DDP_SUCCESS) diag("  rank %d: %s", i, R->msg[i]);
            if (R->r[i] != DDP_SUCCESS || R->bad[i] || reg1 < 1 || reg2 != 0 || hits2 == 0) okk1 = 0;
            if (R->bad2[i] || (R->same_addr[i] && stale == 0)) okk2 = 0;
            if (R->bad3[i]) okk3 = 0;
        }
        ok(okk1, "registration cache: a 4 MiB buffer is registered on the first all_reduce, only hit on the second");
        ok(okk2, "registration cache: munmap + mmap at the same address: stale entry detected, result right");
        ok(okk3, "registration cache: malloc/free/malloc (out of place): results right");
    }
    diag("total %.1f s", t_now() - t0);
    return t_done();
}
#endif /* T_HAVE_VERBS */
