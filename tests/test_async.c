/* SPDX-License-Identifier: MIT (see LICENSE) */
/* tests/test_async.c — async requests, abort, get_async_error, comm_split (issue 7). TAP.
 *
 *   build/test_async           (DDP_TEST_ONLY=<scenario> runs one; `make test-tsan` builds this
 *                               file with -fsanitize=thread: the progress thread and the abort
 *                               watchdog are real threads in each rank's process)
 *
 * Scenarios, each over tcp and over shm:
 *   order     16 async all-reduces of different sizes, broadcasts and barriers, collected in
 *             reverse order, mixed with blocking calls (which must wait for what was issued
 *             before them): every result right; requests complete in issue order; the caller
 *             computes meanwhile (the request is not done before we wait, for a big one).
 *   misuse    wait twice, a zeroed request, NULL request, DDP_MAX_REQUESTS + 1 outstanding.
 *   dead      a rank SIGKILLed while the others have requests queued: ddp_wait returns
 *             DDP_ERR_REMOTE naming it, the later requests fail too, destroy returns.
 *   abort     rank 1 never calls; rank 0 is blocked in all_reduce (and, second case, in an
 *             async one); a watchdog thread calls ddp_comm_abort after 300 ms: the call returns
 *             DDP_ERR_ABORTED within 1 s, get_async_error says so, rank 1 then fails with
 *             DDP_ERR_REMOTE naming rank 0.
 *   split     6 ranks: color rank % 2, key -rank (reverse order), nested split of a child,
 *             DDP_SPLIT_NOCOLOR -> NULL; all-reduce in each child against its members.
 *   threads   ddp_comm_init_threads for 2 and 3 ranks in this process: results, async, the
 *             transport used (shm), bad arguments. */
#define _GNU_SOURCE
#include "ddp.h"
#include "transports/ddp_tcp.h"
#include "transports/ddp_shm.h"
#include "tests/ddp_test.h"

#include <pthread.h>

typedef struct { double t_kill; int rc[T_MAX_RANKS]; } async_shared_t;
static async_shared_t *S;
static const char *g_mode = "tcp";

/* tcp-lanes: two async lanes (ddp.h), every request from 64 KiB up taking turns */
static void set_mode(void) {
    int lanes = !strcmp(g_mode, "tcp-lanes");
    unsetenv("DDP_SHM_COLL");
    if (!strncmp(g_mode, "tcp", 3)) setenv("DDP_TRANSPORT", "tcp", 1); else unsetenv("DDP_TRANSPORT");
    if (lanes) { setenv("DDP_ASYNC_LANES", "2", 1); setenv("DDP_LANE_MIN_BYTES", "65536", 1); }
    else { unsetenv("DDP_ASYNC_LANES"); unsetenv("DDP_LANE_MIN_BYTES"); }
}

static ddp_comm_t *init_comm(int rank, int p, int timeout_ms, int quiet) {
    ddp_comm_desc_t d;
    ddp_comm_t *c = NULL;
    ddp_result_t r;
    set_mode();
    t_desc(&d, timeout_ms);
    d.log_level = quiet ? 1 : 0;
    t_where("ddp_comm_init");
    r = ddp_comm_init(&c, p, rank, &d);
    if (!ok(r == DDP_SUCCESS, "[%s] ddp_comm_init rank %d of %d -> %s %s", g_mode, rank, p,
            ddp_strerror(r), r ? ddp_last_init_error() : ""))
        return NULL;
    return c;
}

/* ----------------------------------------------------------------- order */
#define NREQ 16
static int order(int rank, int p, void *arg) {
    ddp_comm_t *c;
    ddp_request_t req[NREQ];
    float *buf[NREQ];
    size_t n[NREQ];
    int k, bad = 0, kind[NREQ];
    float blk[4] = {0};
    (void)arg;
    if (!(c = init_comm(rank, p, 30000, 0))) return 1;
    for (k = 0; k < NREQ; k++) {
        size_t i;
        n[k] = k % 4 == 3 ? (size_t)(1 << 20) + 3 : (size_t)(k * 37 + 1);
        kind[k] = k % 5 == 4 ? 1 : k % 7 == 6 ? 2 : 0;      /* 0 all_reduce, 1 broadcast, 2 barrier */
        buf[k] = (float *)malloc(n[k] * sizeof(float));
        for (i = 0; i < n[k]; i++) buf[k][i] = (float)(rank + 1) * (float)(i % 9 + k);
        {
            ddp_result_t r = kind[k] == 0 ? ddp_all_reduce_async(buf[k], buf[k], n[k], DDP_FLOAT32, DDP_SUM, c, &req[k])
                           : kind[k] == 1 ? ddp_broadcast_async(buf[k], buf[k], n[k], DDP_FLOAT32, k % p, c, &req[k])
                                          : ddp_barrier_async(c, &req[k]);
            if (r != DDP_SUCCESS) { ok(0, "rank %d: request #%d -> %s", rank, k, ddp_strerror(r)); bad++; }
        }
        if (k == 8) {   /* a blocking call in the middle: runs after the 9 issued before it */
            blk[0] = (float)rank;
            ok(ddp_all_reduce(blk, blk, 4, DDP_FLOAT32, DDP_MAX, c) == DDP_SUCCESS && blk[0] == (float)(p - 1),
               "rank %d: a blocking all_reduce between async ones", rank);
        }
    }
    for (k = NREQ - 1; k >= 0; k--) {
        ddp_result_t r = ddp_wait(&req[k]);
        size_t i;
        int wrong = 0;
        if (r != DDP_SUCCESS) { ok(0, "rank %d: wait #%d -> %s: %s", rank, k, ddp_strerror(r), ddp_comm_last_error(c)); bad++; continue; }
        for (i = 0; i < n[k] && kind[k] != 2; i++) {
            float want = kind[k] == 0 ? (float)(p * (p + 1) / 2) * (float)(i % 9 + k)
                                      : (float)(k % p + 1) * (float)(i % 9 + k);
            if (buf[k][i] != want) wrong++;
        }
        if (wrong) { ok(0, "rank %d: request #%d: %d wrong elements", rank, k, wrong); bad++; }
        if (req[k].comm || req[k].id) { ok(0, "rank %d: request #%d not zeroed after wait", rank, k); bad++; }
    }
    ok(!bad, "rank %d: %d requests (all_reduce, broadcast, barrier) collected in reverse order, all right", rank, NREQ);
    {   /* Requests on the same buffer see each other's results, as in issue order (with lanes,
         * the second waits for the first though another lane would be free). */
        const size_t m = (size_t)1 << 18;
        float *x = (float *)malloc(m * sizeof(float)), *y = (float *)malloc(2 * m * sizeof(float));
        ddp_request_t q[3];
        size_t i;
        int wrong = 0;
        for (i = 0; i < m; i++) x[i] = (float)(rank + 1);
        ddp_all_reduce_async(x, x, m, DDP_FLOAT32, DDP_SUM, c, &q[0]);
        ddp_all_reduce_async(x, x, m, DDP_FLOAT32, DDP_SUM, c, &q[1]);
        ddp_all_gather_async(x, y, m / (size_t)p, DDP_FLOAT32, c, &q[2]);
        if (ddp_wait(&q[2]) != DDP_SUCCESS || ddp_wait(&q[1]) != DDP_SUCCESS || ddp_wait(&q[0]) != DDP_SUCCESS)
            wrong = -1;
        for (i = 0; i < m && !wrong; i++)
            if (x[i] != (float)(p * p * (p + 1) / 2)) wrong = 1;
        for (i = 0; i < m / (size_t)p * (size_t)p && !wrong; i++)
            if (y[i] != (float)(p * p * (p + 1) / 2)) wrong = 2;
        ok(!wrong, "rank %d: all_reduce, all_reduce, all_gather on one buffer: as in issue order (%d)", rank, wrong);
        free(x);
        free(y);
    }
    {   /* The other collectives, async: reduce to the last rank, gather to 0, scatter from
         * the last, all_to_all; queued together, collected in reverse. */
        const size_t m = 1000;
        int32_t *in = (int32_t *)malloc(m * (size_t)p * 4), *red = (int32_t *)calloc(m, 4);
        int32_t *gat = (int32_t *)calloc(m * (size_t)p, 4), *sca = (int32_t *)calloc(m, 4);
        int32_t *a2a = (int32_t *)calloc(m * (size_t)p, 4);
        ddp_request_t q[5];
        ddp_result_t rr[4];
        size_t i;
        int wrong = 0, j, f;
        float one = 1;
        for (i = 0; i < m * (size_t)p; i++) in[i] = (int32_t)(rank * 100000 + (int)i);
        rr[0] = ddp_reduce_async(in, red, m, DDP_INT32, DDP_SUM, p - 1, c, &q[0]);
        rr[1] = ddp_gather_async(in, gat, m, DDP_INT32, 0, c, &q[1]);
        rr[2] = ddp_scatter_async(in, sca, m, DDP_INT32, p - 1, c, &q[2]);
        rr[3] = ddp_all_to_all_async(in, a2a, m, DDP_INT32, c, &q[3]);
        for (j = 0; j < 4; j++) if (rr[j] != DDP_SUCCESS) wrong = 10 + j;
        for (j = 3; j >= 0 && !wrong; j--) if (ddp_wait(&q[j]) != DDP_SUCCESS) wrong = 20 + j;
        for (i = 0; i < m && !wrong && rank == p - 1; i++)
            if (red[i] != 100000 * (p * (p - 1) / 2) + p * (int)i) wrong = 1;
        for (i = 0; i < m * (size_t)p && !wrong && rank == 0; i++)
            if (gat[i] != (int32_t)((int)(i / m) * 100000 + (int)(i % m))) wrong = 2;
        for (i = 0; i < m && !wrong; i++)
            if (sca[i] != (int32_t)((p - 1) * 100000 + rank * (int)m + (int)i)) wrong = 3;
        for (i = 0; i < m * (size_t)p && !wrong; i++)
            if (a2a[i] != (int32_t)((int)(i / m) * 100000 + rank * (int)m + (int)(i % m))) wrong = 4;
        ok(!wrong, "rank %d: reduce, gather, scatter, all_to_all async: right (%d)", rank, wrong);
        ddp_group_start(c);
        f = ddp_all_reduce_async(&one, &one, 1, DDP_FLOAT32, DDP_SUM, c, &q[4]) == DDP_ERR_INVALID_USAGE &&
            ddp_gather_async(in, gat, 1, DDP_INT32, 0, c, &q[4]) == DDP_ERR_INVALID_USAGE && !q[4].comm;
        ok(f && ddp_group_end(c) == DDP_SUCCESS, "rank %d: async calls refused inside a group: %s", rank,
           ddp_comm_last_error(c));
        ok(ddp_reduce_async(in, red, 1, DDP_INT32, DDP_SUM, 0, c, NULL) == DDP_ERR_INVALID_ARGUMENT,
           "rank %d: reduce_async with a NULL request -> invalid argument", rank);
        free(in); free(red); free(gat); free(sca); free(a2a);
    }
    /* Overlap with computation: a big request is still running while we compute. */
    {
        ddp_request_t q;
        int done = 0, polls = 0;
        ddp_all_reduce_async(buf[3], buf[3], n[3], DDP_FLOAT32, DDP_SUM, c, &q);
        while (!done && polls < 100000000) {
            if (ddp_test(&q, &done) != DDP_SUCCESS) break;
            polls++;
        }
        ok(done && polls > 1, "rank %d: ddp_test polled %d times before a 4 MiB all-reduce finished", rank, polls);
    }
    for (k = 0; k < NREQ; k++) free(buf[k]);
    ok(ddp_comm_destroy(c) == DDP_SUCCESS, "rank %d: destroy joins the progress thread", rank);
    return 0;
}

/* ----------------------------------------------------------------- misuse */
static int misuse(int rank, int p, void *arg) {
    ddp_comm_t *c;
    ddp_request_t req[DDP_MAX_REQUESTS + 1], zero;
    float x[4] = {1, 2, 3, 4};
    int k, queued = 0;
    ddp_result_t r;
    (void)arg;
    if (!(c = init_comm(rank, p, 30000, 1))) return 1;
    memset(&zero, 0, sizeof zero);
    ok(ddp_wait(&zero) == DDP_SUCCESS, "wait on a zeroed request: nothing to do");
    ok(ddp_wait(NULL) == DDP_ERR_INVALID_ARGUMENT, "wait(NULL) -> invalid argument");
    ok(ddp_all_reduce_async(x, x, 4, DDP_FLOAT32, DDP_SUM, c, NULL) == DDP_ERR_INVALID_ARGUMENT,
       "async with a NULL request -> invalid argument");
    ok(ddp_all_reduce_async(x, x, 4, (ddp_dtype_t)99, DDP_SUM, c, &req[0]) == DDP_ERR_INVALID_ARGUMENT &&
       !req[0].comm, "async with a bad dtype -> invalid argument at once, request zeroed");
    ok(ddp_all_reduce_async(x, x, 4, DDP_FLOAT32, DDP_SUM, c, &req[0]) == DDP_SUCCESS, "queued");
    {
        ddp_request_t copy = req[0];
        ok(ddp_wait(&req[0]) == DDP_SUCCESS, "wait");
        r = ddp_wait(&copy);
        ok(r == DDP_ERR_INVALID_USAGE, "waiting a second time (a copy of the handle) -> %s: %s",
           ddp_strerror(r), ddp_comm_last_error(c));
    }
    for (k = 0; k <= DDP_MAX_REQUESTS; k++) {
        r = ddp_all_reduce_async(x, x, 1, DDP_FLOAT32, DDP_MAX, c, &req[k]);
        if (r == DDP_SUCCESS) queued++;
        else break;
    }
    ok(queued == DDP_MAX_REQUESTS && r == DDP_ERR_INVALID_USAGE, "request %d of %d outstanding -> %s",
       DDP_MAX_REQUESTS + 1, DDP_MAX_REQUESTS + 1, ddp_strerror(r));
    for (k = 0; k < queued; k++) if (ddp_wait(&req[k]) != DDP_SUCCESS) break;
    ok(k == queued, "all %d collected", queued);
    ok(ddp_comm_destroy(c) == DDP_SUCCESS, "destroy");
    return 0;
}

/* ----------------------------------------------------------------- dead */
static void *killer(void *arg) {
    double t;
    (void)arg;
    t_sleep_ms(150);
    t = t_now();
    __atomic_store(&S->t_kill, &t, __ATOMIC_SEQ_CST);
    raise(SIGKILL);
    return NULL;
}

static int dead(int rank, int p, void *arg) {
    ddp_comm_t *c;
    ddp_request_t req[8];
    const size_t n = (size_t)4 << 20;
    float *buf = (float *)calloc(n, sizeof(float));
    int k, failed = 0;
    double t_err;
    (void)arg;
    if (!(c = init_comm(rank, p, 20000, rank != 0))) return 1;
    if (rank == p - 1) { pthread_t th; pthread_create(&th, NULL, killer, NULL); }
    for (k = 0; k < 400; k++) {         /* keep the queue full until the victim dies */
        /* The failure may surface at the next enqueue instead of a wait (a lane that failed has
         * poisoned the communicator by then): either call reports it; the next check asks that
         * it names the victim. */
        if (ddp_all_reduce_async(buf, buf, n, DDP_FLOAT32, DDP_MAX, c, &req[k % 8]) != DDP_SUCCESS) {
            failed = 1;
            break;
        }
        if (k >= 7 && ddp_wait(&req[(k + 1) % 8]) != DDP_SUCCESS) { failed = 1; break; }
    }
    t_err = t_now();
    ok(failed, "rank %d: a request failed after the victim died (%.2f s after)", rank, t_err - S->t_kill);
    ok(t_mentions_rank(ddp_comm_last_error(c), p - 1), "... naming rank %d: %s", p - 1, ddp_comm_last_error(c));
    for (k = 0; k < 8; k++) ddp_wait(&req[k]);       /* the rest fail, without hanging */
    /* With lanes, the others' requests fail quoting the lane that failed: one "[reason]". */
    ok(!strstr(ddp_comm_last_error(c), "] ["), "rank %d: the last error says its reason once: %s", rank,
       ddp_comm_last_error(c));
    {
        ddp_result_t e = DDP_SUCCESS;
        ok(ddp_comm_get_async_error(c, &e) == DDP_SUCCESS && e != DDP_SUCCESS,
           "get_async_error -> %s", ddp_strerror(e));
    }
    ok(ddp_comm_destroy(c) == DDP_SUCCESS, "destroy after the failure");
    free(buf);
    return 0;
}

/* ----------------------------------------------------------------- abort */
typedef struct { ddp_comm_t *c; int ms; } wd_t;
static void *watchdog(void *arg) {
    wd_t *w = (wd_t *)arg;
    t_sleep_ms(w->ms);
    ddp_comm_abort(w->c);
    return NULL;
}

static int aborted(int rank, int p, void *arg) {
    int async = *(int *)arg;
    ddp_comm_t *c;
    float x[256] = {0};
    ddp_result_t r, e = DDP_SUCCESS;
    double t0;
    if (!(c = init_comm(rank, p, 30000, 1))) return 1;
    if (rank == 0) {
        pthread_t th;
        wd_t w;
        w.c = c;
        w.ms = 300;
        pthread_create(&th, NULL, watchdog, &w);
        t0 = t_now();
        if (async) {
            ddp_request_t q;
            r = ddp_all_reduce_async(x, x, 256, DDP_FLOAT32, DDP_SUM, c, &q);
            if (r == DDP_SUCCESS) r = ddp_wait(&q);
        } else {
            r = ddp_all_reduce(x, x, 256, DDP_FLOAT32, DDP_SUM, c);
        }
        ok(r == DDP_ERR_ABORTED, "[%s] rank 0, %s all_reduce blocked, aborted by a watchdog thread -> %s",
           g_mode, async ? "async" : "blocking", ddp_strerror(r));
        /* ABORTED (not TIMEOUT) says the abort ended it; the bound, half the 30 s timeout, that it
         * did not wait for the timeout first. */
        ok(t_now() - t0 < 15, "... %.2f s after the call (abort came at 0.3 s), long before the 30 s timeout", t_now() - t0);
        pthread_join(th, NULL);
        ok(ddp_comm_get_async_error(c, &e) == DDP_SUCCESS && e == DDP_ERR_ABORTED, "get_async_error -> %s", ddp_strerror(e));
        ok(ddp_barrier(c) == DDP_ERR_ABORTED, "a later call -> aborted");
        __atomic_store_n(&S->rc[0], 1, __ATOMIC_SEQ_CST);
    } else {
        while (!__atomic_load_n(&S->rc[0], __ATOMIC_SEQ_CST)) t_sleep_ms(5);   /* late on purpose */
        t0 = t_now();
        /* Rank 0's half of that all-reduce may already sit in our socket (it sent before it
         * blocked), so the first call can still complete here; the next one cannot. */
        r = ddp_all_reduce(x, x, 256, DDP_FLOAT32, DDP_SUM, c);
        if (r == DDP_SUCCESS) r = ddp_barrier(c);
        ok(r == DDP_ERR_REMOTE, "[%s] rank %d, calling after rank 0 aborted -> %s (%.2f s)", g_mode, rank,
           ddp_strerror(r), t_now() - t0);
        ok(t_mentions_rank(ddp_comm_last_error(c), 0), "... naming rank 0: %s", ddp_comm_last_error(c));
    }
    ok(ddp_comm_destroy(c) == DDP_SUCCESS, "rank %d: destroy", rank);
    return 0;
}

/* ----------------------------------------------------------------- lanes mismatch */
static int lanes_mismatch(int rank, int p, void *arg) {
    ddp_comm_desc_t d;
    ddp_comm_t *c = NULL;
    ddp_result_t r;
    (void)arg;
    (void)p;
    setenv("DDP_TRANSPORT", "tcp", 1);
    setenv("DDP_ASYNC_LANES", rank == 0 ? "2" : "1", 1);
    t_desc(&d, 60000);   /* "at once" below: far below this timeout, whatever the load */
    d.log_level = 1;
    r = ddp_comm_init(&c, p, rank, &d);
    ok(r != DDP_SUCCESS && strstr(ddp_last_init_error(), "DDP_ASYNC_LANES"), "rank %d: DDP_ASYNC_LANES %s "
       "here, %s on rank 0 -> init fails: %s", rank, rank ? "1" : "2", "2", ddp_last_init_error());
    if (c) ddp_comm_destroy(c);
    return 0;
}

/* ----------------------------------------------------------------- split */
static int check_sum(ddp_comm_t *c, const int *members, int n, const char *what, int rank) {
    double v = (double)(rank + 1), want = 0;
    int i;
    for (i = 0; i < n; i++) want += members[i] + 1;
    if (ddp_all_reduce(&v, &v, 1, DDP_FLOAT64, DDP_SUM, c) != DDP_SUCCESS)
        return ok(0, "%s: all_reduce: %s", what, ddp_comm_last_error(c));
    return ok(v == want, "rank %d %s: all_reduce over the members = %g (want %g)", rank, what, v, want);
}

static int split(int rank, int p, void *arg) {
    ddp_comm_t *c, *child = NULL, *grand = NULL, *none = (ddp_comm_t *)(uintptr_t)1;
    int members[8], n = 0, i, want_rank = 0;
    ddp_result_t r;
    (void)arg;
    if (!(c = init_comm(rank, p, 30000, 0))) return 1;
    r = ddp_comm_split(c, rank % 2, -rank, &child);
    ok(r == DDP_SUCCESS && child, "rank %d: split color %d key %d -> %s", rank, rank % 2, -rank, ddp_strerror(r));
    if (!child) return 1;
    for (i = p - 1; i >= 0; i--) if (i % 2 == rank % 2) { if (i > rank) want_rank++; members[n++] = i; }
    ok(ddp_comm_size(child) == n && ddp_comm_rank(child) == want_rank,
       "rank %d: child rank %d of %d (keys reverse the order: want %d of %d)", rank,
       ddp_comm_rank(child), ddp_comm_size(child), want_rank, n);
    check_sum(child, members, n, "child", rank);
    /* Nested: the child's ranks 0 and 1 together; the rest out. */
    r = ddp_comm_split(child, ddp_comm_rank(child) < 2 ? 7 : DDP_SPLIT_NOCOLOR, 0, &grand);
    if (ddp_comm_rank(child) < 2) {
        int gm[2];
        gm[0] = members[0]; gm[1] = members[1];
        ok(r == DDP_SUCCESS && grand && ddp_comm_size(grand) == 2, "rank %d: nested split -> size %d", rank,
           grand ? ddp_comm_size(grand) : -1);
        if (grand) check_sum(grand, gm, 2, "grandchild", rank);
    } else {
        ok(r == DDP_SUCCESS && !grand, "rank %d: DDP_SPLIT_NOCOLOR -> NULL", rank);
    }
    r = ddp_comm_split(c, DDP_SPLIT_NOCOLOR, 0, &none);
    ok(r == DDP_SUCCESS && none == NULL, "rank %d: everyone NOCOLOR -> NULL", rank);
    {   /* the parent still works, after its children */
        int all[8];
        for (i = 0; i < p; i++) all[i] = i;
        check_sum(c, all, p, "parent after splits", rank);
    }
    if (grand) ddp_comm_destroy(grand);
    ddp_comm_destroy(child);
    ddp_comm_destroy(c);
    return 0;
}

/* ----------------------------------------------------------------- threads as ranks */
typedef struct { ddp_comm_t *c; int rank, n, good; double lat_us; char err[1100]; } th_t;
static void *th_main(void *arg) {
    th_t *t = (th_t *)arg;
    float x[1000];
    int it, i;
    ddp_request_t q;
    double t0;
    t->good = 1;
    for (it = 0; it < 50 && t->good; it++) {
        for (i = 0; i < 1000; i++) x[i] = (float)(t->rank + i % 3);
        if (ddp_all_reduce(x, x, 1000, DDP_FLOAT32, DDP_SUM, t->c) != DDP_SUCCESS) t->good = 0;
        for (i = 0; i < 1000 && t->good; i++)
            if (x[i] != (float)(t->n * (t->n - 1) / 2 + t->n * (i % 3))) t->good = 0;
        if (t->good && (ddp_broadcast_async(x, x, 1000, DDP_FLOAT32, it % t->n, t->c, &q) != DDP_SUCCESS ||
                        ddp_wait(&q) != DDP_SUCCESS)) t->good = 0;
    }
    if (!t->good) snprintf(t->err, sizeof t->err, "%s", ddp_comm_last_error(t->c));
    /* 8-byte all-reduce latency (reported, not asserted: speed is for benchmarks) */
    ddp_barrier(t->c);
    t0 = t_now();
    for (it = 0; it < 20000; it++) ddp_all_reduce(x, x, 2, DDP_FLOAT32, DDP_SUM, t->c);
    t->lat_us = (t_now() - t0) / 20000 * 1e6;
    return NULL;
}

static void run_threads(int n) {
    ddp_comm_t *comms[8];
    pthread_t th[8];
    th_t t[8];
    ddp_comm_desc_t d;
    ddp_result_t r;
    int i;
    memset(&d, 0, sizeof d);
    d.timeout_ms = 30000;
    unsetenv("DDP_TRANSPORT");
    r = ddp_comm_init_threads(comms, n, &d);
    if (!ok(r == DDP_SUCCESS, "ddp_comm_init_threads(%d) -> %s %s", n, ddp_strerror(r), r ? ddp_last_init_error() : ""))
        return;
    for (i = 0; i < n; i++) {
        ok(ddp_comm_rank(comms[i]) == i && ddp_comm_size(comms[i]) == n, "comm %d: rank %d of %d", i,
           ddp_comm_rank(comms[i]), ddp_comm_size(comms[i]));
        memset(&t[i], 0, sizeof t[i]);
        t[i].c = comms[i]; t[i].rank = i; t[i].n = n;
        pthread_create(&th[i], NULL, th_main, &t[i]);
    }
    for (i = 0; i < n; i++) pthread_join(th[i], NULL);
    for (i = 0; i < n; i++)
        ok(t[i].good, "thread rank %d of %d (transport %s): 50 all-reduces + async broadcasts right %s", i, n,
           ddp_comm_transport_name(comms[i], (i + 1) % n), t[i].err);
    diag("threads as ranks, n = %d: 8-byte all-reduce %.2f us (rank 0's mean of 20000; not a benchmark)", n, t[0].lat_us);
    for (i = n - 1; i >= 0; i--) ok(ddp_comm_destroy(comms[i]) == DDP_SUCCESS, "destroy comm %d", i);
    r = ddp_comm_init_threads(NULL, n, &d);
    ok(r == DDP_ERR_INVALID_ARGUMENT, "init_threads(NULL) -> %s: %s", ddp_strerror(r), ddp_last_init_error());
}

int main(void) {
    static const char *const modes[] = {"tcp", "shm", "tcp-lanes"};
    int m;
    t_init();
    S = (async_shared_t *)t_shm_user(sizeof *S);
    if (t_selected("threads")) {
        diag("--- threads as ranks (ddp_comm_init_threads)");
        run_threads(2);
        run_threads(3);
    }
    if (t_selected("lanes")) {
        double t0 = t_now();
        diag("--- DDP_ASYNC_LANES not the same on every rank");
        ok(t_run_ranks(2, lanes_mismatch, NULL, 90) == 0 && t_now() - t0 < 30, "both ranks returned at once (%.2f s; "
           "their init timeout is 60 s)", t_now() - t0);
    }
    for (m = 0; m < 3; m++) {
        g_mode = modes[m];
        if (t_selected("order")) {
            diag("--- [%s] async ordering", g_mode);
            ok(t_run_ranks(3, order, NULL, 120) == 0, "[%s] every rank exited cleanly", g_mode);
        }
        if (t_selected("misuse")) {
            diag("--- [%s] request misuse", g_mode);
            ok(t_run_ranks(2, misuse, NULL, 60) == 0, "[%s] every rank exited cleanly", g_mode);
        }
        if (t_selected("dead")) {
            S = (async_shared_t *)t_shm_user(sizeof *S);
            diag("--- [%s] rank 2 of 3 SIGKILLed with requests queued", g_mode);
            t_run_ranks(3, dead, NULL, 120);
            ok(t_rank_signaled(2, SIGKILL) && t_last_run.exited[0] && t_last_run.code[0] == 0 &&
               t_last_run.exited[1] && t_last_run.code[1] == 0, "[%s] the victim died; the others returned", g_mode);
        }
        if (t_selected("abort")) {
            int async;
            for (async = 0; async < 2; async++) {
                S = (async_shared_t *)t_shm_user(sizeof *S);
                diag("--- [%s] abort from a watchdog thread (%s call)", g_mode, async ? "async" : "blocking");
                ok(t_run_ranks(2, aborted, &async, 60) == 0, "[%s] both ranks returned", g_mode);
            }
        }
        if (t_selected("split")) {
            diag("--- [%s] comm_split", g_mode);
            ok(t_run_ranks(6, split, NULL, 120) == 0, "[%s] every rank exited cleanly", g_mode);
        }
    }
    return t_done();
}
