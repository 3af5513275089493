/* tests/netns_rank.c — one libddp rank for tests/test_netns.sh, which runs several of these in
 * network namespaces joined by a bridge ("hosts"). Rank, world size, master and job secret come
 * from the environment (ddp_comm_init_env); the transport is the best per peer (tcp across
 * namespaces, shm inside one).
 *
 *   build/netns_rank coll     every collective at several sizes, each result checked exactly
 *   build/netns_rank cut      loop over all-reduces until one fails (the script cuts a link)
 *   build/netns_rank loss N   N checked all-reduces of 64 KiB (the script drops packets)
 *
 * Output, one line each, prefixed "rank R: ": "peer P via NAME" for every other rank after
 * init; "PASS what" / "FAIL what: why" per check; in cut mode "looping" once the loop is
 * warm, then "ERROR ...". Exit status: 0 all passed, 1 a check failed or init failed, 2 (cut
 * mode) a collective returned an error, as wanted, 3 (cut mode) no error within 60 s.
 *
 * Expected values are closed forms of (rank, index): contributions are small integers, so
 * float sums are exact whatever the order, and avg is the exact sum divided once by the world
 * size (IEEE division for floats, truncation toward zero for integers, as libddp documents). */
#define _GNU_SOURCE
#define DDP_IMPLEMENTATION
#include "ddp.h"
#include "transports/ddp_tcp.h"
#include "transports/ddp_shm.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int me, nranks, failures;

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* Rank r's contribution at index i: a small integer in [-8, 8] (floats) or up to ~1e6 with
 * both signs (int32, so that avg's truncation toward zero is exercised). */
static float fval(int r, size_t i) { return (float)((int)(((size_t)r * 7 + i * 3) % 17) - 8); }
static int32_t ival(int r, size_t i) {
    return (int32_t)(((int)(((size_t)r * 7 + i * 3) % 17) - 8) * 100003 + r);
}
static float fsum(size_t i) { float s = 0; int r; for (r = 0; r < nranks; r++) s += fval(r, i); return s; }
static int32_t isum(size_t i) { int32_t s = 0; int r; for (r = 0; r < nranks; r++) s += ival(r, i); return s; }

static const char *result_name(ddp_result_t r) {
    static const char *const names[] = {"DDP_SUCCESS", "DDP_ERR_INVALID_ARGUMENT", "DDP_ERR_INVALID_USAGE",
        "DDP_ERR_SYSTEM", "DDP_ERR_REMOTE", "DDP_ERR_TIMEOUT", "DDP_ERR_ABORTED", "DDP_ERR_OUT_OF_MEMORY",
        "DDP_ERR_MISMATCH", "DDP_ERR_AUTH", "DDP_ERR_UNSUPPORTED", "DDP_ERR_INTERNAL"};
    return (unsigned)r < sizeof names / sizeof names[0] ? names[r] : "DDP_ERR_?";
}

static void report(int good, const char *what, const char *why) {
    if (good) printf("rank %d: PASS %s\n", me, what);
    else { printf("rank %d: FAIL %s: %s\n", me, what, why); failures++; }
    fflush(stdout);
}

/* A call's result: on an error, one FAIL line with the library's message; returns 0. */
static int called(ddp_result_t r, const char *what, ddp_comm_t *comm) {
    char why[1400];
    if (r == DDP_SUCCESS) return 1;
    snprintf(why, sizeof why, "%s: %s", ddp_strerror(r), ddp_comm_last_error(comm));
    report(0, what, why);
    return 0;
}

/* Compares n floats or int32s with want(i); one PASS or FAIL line naming the first mismatch. */
static void check_f(const float *got, size_t n, float (*want)(size_t, int), int arg, const char *what) {
    size_t i;
    char why[200];
    for (i = 0; i < n; i++) {
        float w = want(i, arg);
        if (memcmp(&got[i], &w, sizeof w) != 0) {
            snprintf(why, sizeof why, "element %zu of %zu is %.9g, want %.9g", i, n, (double)got[i], (double)w);
            report(0, what, why);
            return;
        }
    }
    report(1, what, "");
}
static void check_i(const int32_t *got, size_t n, int32_t (*want)(size_t, int), int arg, const char *what) {
    size_t i;
    char why[200];
    for (i = 0; i < n; i++) {
        int32_t w = want(i, arg);
        if (got[i] != w) {
            snprintf(why, sizeof why, "element %zu of %zu is %ld, want %ld", i, n, (long)got[i], (long)w);
            report(0, what, why);
            return;
        }
    }
    report(1, what, "");
}

static float want_fsum(size_t i, int unused) { (void)unused; return fsum(i); }
static float want_favg(size_t i, int unused) { (void)unused; return fsum(i) / (float)nranks; }
static int32_t want_isum(size_t i, int unused) { (void)unused; return isum(i); }
static int32_t want_iavg(size_t i, int unused) { (void)unused; return isum(i) / nranks; }
static float want_fval(size_t i, int r) { return fval(r, i); }
static int32_t want_ival(size_t i, int r) { return ival(r, i); }
/* all_gather of sendcount c: element i came from rank i / c at index i % c (arg = c). */
static float want_gathered(size_t i, int c) { return fval((int)(i / (size_t)c), i % (size_t)c); }
/* reduce_scatter: this rank's block of recvcount c starts at me * c (arg = c). */
static float want_rs(size_t i, int c) { return fsum((size_t)me * (size_t)c + i); }

#define MAX_COUNT ((size_t)262144)    /* 1 MiB of float32 or int32 */

static void run_collectives(ddp_comm_t *comm) {
    static const size_t counts[] = {0, 1, 3, 7, 1001, 65536, MAX_COUNT};
    static const size_t gcounts[] = {0, 1, 333, 65536};
    const size_t ncounts = sizeof counts / sizeof counts[0];
    float *fs = (float *)malloc(MAX_COUNT * 4 * sizeof(float));
    float *fr = (float *)malloc((size_t)nranks * 65536 * sizeof(float) + MAX_COUNT * sizeof(float));
    int32_t *is = (int32_t *)malloc(MAX_COUNT * sizeof(int32_t));
    int32_t *ir = (int32_t *)malloc(MAX_COUNT * sizeof(int32_t));
    char what[160];
    size_t k, i, c;
    int op, root;
    if (!fs || !fr || !is || !ir) { report(0, "allocation", "out of memory"); return; }

    /* all_reduce: float32 and int32, sum and avg, every size; in place at odd positions. */
    for (op = 0; op < 2; op++) {
        ddp_op_t o = op ? DDP_AVG : DDP_SUM;
        const char *on = op ? "avg" : "sum";
        for (k = 0; k < ncounts; k++) {
            int inplace = (int)(k & 1);
            float *fout = inplace ? fs : fr;
            int32_t *iout = inplace ? is : ir;
            c = counts[k];
            for (i = 0; i < c; i++) { fs[i] = fval(me, i); is[i] = ival(me, i); }
            snprintf(what, sizeof what, "all_reduce float32 %s count %zu%s", on, c, inplace ? " in place" : "");
            if (called(ddp_all_reduce(fs, fout, c, DDP_FLOAT32, o, comm), what, comm))
                check_f(fout, c, op ? want_favg : want_fsum, 0, what);
            snprintf(what, sizeof what, "all_reduce int32 %s count %zu%s", on, c, inplace ? " in place" : "");
            if (called(ddp_all_reduce(is, iout, c, DDP_INT32, o, comm), what, comm))
                check_i(iout, c, op ? want_iavg : want_isum, 0, what);
        }
    }

    /* broadcast from every root (so from every host), and 1 MiB from the last rank. */
    for (root = 0; root <= nranks; root++) {
        int rt = root < nranks ? root : nranks - 1;
        c = root < nranks ? 1001 : MAX_COUNT;
        for (i = 0; i < c; i++) { fs[i] = me == rt ? fval(rt, i) : -99.0f; is[i] = me == rt ? ival(rt, i) : -99; }
        snprintf(what, sizeof what, "broadcast float32 count %zu root %d in place", c, rt);
        if (called(ddp_broadcast(fs, fs, c, DDP_FLOAT32, rt, comm), what, comm)) check_f(fs, c, want_fval, rt, what);
        snprintf(what, sizeof what, "broadcast int32 count %zu root %d", c, rt);
        if (called(ddp_broadcast(is, ir, c, DDP_INT32, rt, comm), what, comm)) check_i(ir, c, want_ival, rt, what);
    }

    /* all_gather and reduce_scatter (float32 sum); the largest in place. */
    for (k = 0; k < sizeof gcounts / sizeof gcounts[0]; k++) {
        int inplace = gcounts[k] == 65536;
        float *send;
        c = gcounts[k];
        send = inplace ? fr + (size_t)me * c : fs;
        for (i = 0; i < c; i++) send[i] = fval(me, i);
        snprintf(what, sizeof what, "all_gather float32 sendcount %zu%s", c, inplace ? " in place" : "");
        if (called(ddp_all_gather(send, fr, c, DDP_FLOAT32, comm), what, comm))
            check_f(fr, c * (size_t)nranks, want_gathered, (int)(c ? c : 1), what);

        for (i = 0; i < c * (size_t)nranks; i++) fr[i] = fval(me, i);
        snprintf(what, sizeof what, "reduce_scatter float32 sum recvcount %zu%s", c, inplace ? " in place" : "");
        {
            float *out = inplace ? fr + (size_t)me * c : fs;
            if (called(ddp_reduce_scatter(fr, out, c, DDP_FLOAT32, DDP_SUM, comm), what, comm))
                check_f(out, c, want_rs, (int)c, what);
        }
    }
    snprintf(what, sizeof what, "barrier");
    if (called(ddp_barrier(comm), what, comm)) report(1, what, "");
    free(fs); free(fr); free(is); free(ir);
}

/* Loops over all-reduces (1 KiB, checked) until one fails or 60 s pass. */
static int run_cut(ddp_comm_t *comm) {
    enum { COUNT = 256, WARM = 50 };
    float buf[COUNT];
    double t0 = now_ms();
    long it;
    size_t i;
    for (it = 0; now_ms() - t0 < 60000; it++) {
        ddp_result_t r;
        for (i = 0; i < COUNT; i++) buf[i] = fval(me, i + (size_t)it);
        r = ddp_all_reduce(buf, buf, COUNT, DDP_FLOAT32, DDP_SUM, comm);
        if (r != DDP_SUCCESS) {
            double t = now_ms();
            printf("rank %d: ERROR at %.0f ms (epoch) in all_reduce #%ld: %s (%s): %s\n", me, t, it,
                   result_name(r), ddp_strerror(r), ddp_comm_last_error(comm));
            fflush(stdout);
            return 2;
        }
        for (i = 0; i < COUNT; i++)
            if (buf[i] != fsum(i + (size_t)it)) {
                printf("rank %d: FAIL all_reduce #%ld: element %zu is %g, want %g\n", me, it, i,
                       (double)buf[i], (double)fsum(i + (size_t)it));
                fflush(stdout);
                return 1;
            }
        if (it == WARM) { printf("rank %d: looping (%d all-reduces done)\n", me, WARM); fflush(stdout); }
    }
    printf("rank %d: no error within 60 s (%ld all-reduces)\n", me, it);
    return 3;
}

/* n all-reduces of 64 KiB, each checked; one summary line. */
static void run_loss(ddp_comm_t *comm, long n) {
    enum { COUNT = 16384 };
    static float buf[COUNT];
    double t0 = now_ms();
    long it, bad = 0;
    size_t i;
    char what[200], why[1400];
    for (it = 0; it < n; it++) {
        ddp_result_t r;
        for (i = 0; i < COUNT; i++) buf[i] = fval(me, i + (size_t)it);
        r = ddp_all_reduce(buf, buf, COUNT, DDP_FLOAT32, DDP_SUM, comm);
        if (r != DDP_SUCCESS) {
            snprintf(what, sizeof what, "all_reduce 64 KiB #%ld of %ld", it, n);
            snprintf(why, sizeof why, "%s: %s", ddp_strerror(r), ddp_comm_last_error(comm));
            report(0, what, why);
            return;
        }
        for (i = 0; i < COUNT; i++)
            if (buf[i] != fsum(i + (size_t)it)) { bad++; break; }
    }
    snprintf(what, sizeof what, "%ld all_reduces of 64 KiB, each exact (%.0f ms)", n, now_ms() - t0);
    snprintf(why, sizeof why, "%ld of them wrong", bad);
    report(bad == 0, what, why);
}

int main(int argc, char **argv) {
    ddp_comm_t *comm = NULL;
    const char *mode = argc > 1 ? argv[1] : "";
    int p, rc = 0;
    ddp_result_t r;
    if (strcmp(mode, "coll") && strcmp(mode, "cut") && strcmp(mode, "loss")) {
        fprintf(stderr, "usage: %s coll | cut | loss N\n", argv[0]);
        return 1;
    }
    r = ddp_comm_init_env(&comm, NULL);
    if (r != DDP_SUCCESS) {
        printf("rank %s: FAIL init: %s: %s\n", getenv("RANK") ? getenv("RANK") : "?", ddp_strerror(r),
               ddp_last_init_error());
        return 1;
    }
    me = ddp_comm_rank(comm);
    nranks = ddp_comm_size(comm);
    for (p = 0; p < nranks; p++)
        if (p != me) printf("rank %d: peer %d via %s\n", me, p, ddp_comm_transport_name(comm, p));
    fflush(stdout);
    if (!strcmp(mode, "coll")) run_collectives(comm);
    else if (!strcmp(mode, "loss")) run_loss(comm, argc > 2 ? atol(argv[2]) : 200);
    else rc = run_cut(comm);
    if (rc == 2) {
        double t = now_ms();
        ddp_comm_destroy(comm);
        printf("rank %d: destroy took %.0f ms\n", me, now_ms() - t);
        return rc;
    }
    ddp_comm_destroy(comm);
    return rc ? rc : failures ? 1 : 0;
}
