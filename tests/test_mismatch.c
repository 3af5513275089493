/* SPDX-License-Identifier: MIT */
/* tests/test_mismatch.c — calls the ranks cannot run together, and calls no rank can run.
 *
 * Disagreement: every rooted collective (broadcast, reduce, gather, scatter) with disagreeing
 * roots (2 ranks, each its own root; 4 ranks with roots 0, 0, 0, 3), counts, dtypes and (reduce)
 * ops, over tcp and shm (processes) and the threads transport (ranks as threads). Every rank
 * must get DDP_ERR_MISMATCH, with a message that shows both calls, and the communicator must be
 * unusable afterwards on every rank. All-reduce, all-gather and reduce-scatter with disagreeing
 * counts or dtypes: every rank says DDP_ERR_MISMATCH too (one that only sees a peer leave
 * over it reads why from the failure the peer published). The timeout is 60 s and the watchdog 20 s: a rank that
 * only returns through its timeout fails the run (no timing is measured beyond that).
 *
 * Impossible sizes: every collective and send/recv with a count whose bytes (times the world
 * size, where the call covers every rank's block) exceed PTRDIFF_MAX: every rank gets
 * DDP_ERR_INVALID_ARGUMENT naming the argument, without touching the buffers (no crash, nothing
 * for UBSan), and the communicator stays usable.
 *
 * DDP_TEST_ONLY=substring runs the scenarios whose name contains it.
 */
#define _GNU_SOURCE
#include "ddp.h"
#include "transports/ddp_tcp.h"
#include "transports/ddp_shm.h"
#include "transports/ddp_threads.h"
#include "tests/ddp_test.h"

#include <pthread.h>
#include <stdint.h>

#define TIMEOUT_MS 60000
#define WATCHDOG_S 20
#define MAXP 4
#define N 8                       /* elements per call (the odd rank's count: N + 1) */

enum { K_BROADCAST, K_REDUCE, K_GATHER, K_SCATTER, K_ROOTED, K_ALL_REDUCE = K_ROOTED, K_ALL_GATHER,
       K_REDUCE_SCATTER, K_NUM };
static const char *const kind_names[K_NUM] = {"broadcast", "reduce", "gather", "scatter", "all_reduce",
                                              "all_gather", "reduce_scatter"};
enum { V_ROOTS, V_COUNT, V_DTYPE, V_OP };
static const char *const var_names[] = {"roots", "counts", "dtypes", "ops"};

typedef struct {
    const char *mode;             /* tcp, shm, threads */
    int kind, var, p;
} scen_t;

typedef struct {
    int rc[MAXP], after[MAXP];
    char msg[MAXP][1024];
} res_t;

static res_t *R;                  /* shared with the forked ranks */

static void call_args(const scen_t *s, int rank, size_t *count, ddp_dtype_t *dt, ddp_op_t *op, int *root) {
    const int odd = rank == s->p - 1;
    *count = N;
    *dt = DDP_FLOAT32;
    *op = DDP_SUM;
    *root = 0;
    switch (s->var) {
    case V_ROOTS: *root = s->p == 2 ? rank : odd ? s->p - 1 : 0; break;
    case V_COUNT: if (odd) *count = N + 1; break;
    case V_DTYPE: if (odd) *dt = DDP_INT32; break;
    default: if (odd) *op = DDP_MAX; break;
    }
}

/* One rank's call; records its result, its message and whether the next call fails too. */
static void one_rank(const scen_t *s, ddp_comm_t *c, int rank) {
    float send[MAXP * (N + 1)], recv[MAXP * (N + 1)];
    size_t count;
    ddp_dtype_t dt;
    ddp_op_t op;
    int root, i;
    ddp_result_t r;
    for (i = 0; i < MAXP * (N + 1); i++) { send[i] = (float)(rank + 1); recv[i] = 0; }
    call_args(s, rank, &count, &dt, &op, &root);
    t_where("%s %s: %s", s->mode, kind_names[s->kind], var_names[s->var]);
    switch (s->kind) {
    case K_BROADCAST: r = ddp_broadcast(send, recv, count, dt, root, c); break;
    case K_REDUCE: r = ddp_reduce(send, recv, count, dt, op, root, c); break;
    case K_GATHER: r = ddp_gather(send, recv, count, dt, root, c); break;
    case K_SCATTER: r = ddp_scatter(send, recv, count, dt, root, c); break;
    case K_ALL_REDUCE: r = ddp_all_reduce(send, recv, count, dt, op, c); break;
    case K_ALL_GATHER: r = ddp_all_gather(send, recv, count, dt, c); break;
    default: r = ddp_reduce_scatter(send, recv, count, dt, op, c); break;
    }
    R->rc[rank] = r;
    snprintf(R->msg[rank], sizeof R->msg[rank], "%s", ddp_comm_last_error(c));
    t_where("the call after");
    R->after[rank] = ddp_all_reduce(send, send, 1, DDP_FLOAT32, DDP_SUM, c);
}

static int proc_rank(int rank, int p, void *arg) {
    const scen_t *s = (const scen_t *)arg;
    ddp_comm_desc_t d;
    ddp_comm_t *c;
    t_desc(&d, TIMEOUT_MS);
    d.transport = s->mode;
    if (!(c = t_comm_init(rank, p, &d))) return 1;
    one_rank(s, c, rank);
    ddp_comm_destroy(c);
    return 0;
}

typedef struct { const scen_t *s; ddp_comm_t *c; int rank; } thr_arg_t;
static void *thr_main(void *arg) {
    thr_arg_t *a = (thr_arg_t *)arg;
    one_rank(a->s, a->c, a->rank);
    return NULL;
}

/* Ranks as threads, inside one forked process (so the watchdog covers them). */
static int threads_world(int rank, int p, void *arg) {
    const scen_t *s = (const scen_t *)arg;
    ddp_comm_t *comms[MAXP];
    pthread_t th[MAXP];
    thr_arg_t ta[MAXP];
    ddp_comm_desc_t d;
    ddp_result_t r;
    int i;
    (void)rank; (void)p;
    memset(&d, 0, sizeof d);
    d.timeout_ms = TIMEOUT_MS;
    d.transport = "threads";
    r = ddp_comm_init_threads(comms, s->p, &d);
    if (!ok(r == DDP_SUCCESS, "ddp_comm_init_threads(%d) -> %s %s", s->p, ddp_strerror(r),
            r ? ddp_last_init_error() : ""))
        return 1;
    for (i = 0; i < s->p; i++) {
        ta[i].s = s; ta[i].c = comms[i]; ta[i].rank = i;
        pthread_create(&th[i], NULL, thr_main, &ta[i]);
    }
    for (i = 0; i < s->p; i++) pthread_join(th[i], NULL);
    for (i = s->p - 1; i >= 0; i--) ddp_comm_destroy(comms[i]);
    return 0;
}

/* The message shows both calls: the two roots, counts, dtypes or ops. */
static int shows_both(const scen_t *s, const char *msg) {
    char a[32], b[32];
    switch (s->var) {
    case V_ROOTS:
        snprintf(a, sizeof a, "root 0");
        snprintf(b, sizeof b, "root %d", s->p - 1);
        break;
    case V_COUNT: snprintf(a, sizeof a, "%d x", N); snprintf(b, sizeof b, "%d x", N + 1); break;
    case V_DTYPE: snprintf(a, sizeof a, "float32"); snprintf(b, sizeof b, "int32"); break;
    default: snprintf(a, sizeof a, "sum"); snprintf(b, sizeof b, "max"); break;
    }
    if (s->var == V_COUNT && (s->kind == K_BROADCAST || s->kind == K_REDUCE)) {
        /* a small broadcast or reduce travels with its agreement: the other count shows as the
         * other length (16 bytes of digests + the data) */
        char la[32], lb[32];
        snprintf(la, sizeof la, "%d bytes", 16 + 4 * N);
        snprintf(lb, sizeof lb, "%d bytes", 16 + 4 * (N + 1));
        return (strstr(msg, a) || strstr(msg, la)) && (strstr(msg, b) || strstr(msg, lb)) &&
               strstr(msg, kind_names[s->kind]);
    }
    return strstr(msg, a) && strstr(msg, b) && strstr(msg, kind_names[s->kind]);
}

static void run_scen(const scen_t *s) {
    char name[128];
    int r, bad;
    snprintf(name, sizeof name, "%s p=%d %s: disagreeing %s", s->mode, s->p, kind_names[s->kind],
             var_names[s->var]);
    if (!t_selected(name)) return;
    R = (res_t *)t_shm_user(sizeof *R);
    for (r = 0; r < MAXP; r++) R->rc[r] = R->after[r] = -1;
    bad = !strcmp(s->mode, "threads") ? t_run_ranks(1, threads_world, (void *)s, WATCHDOG_S)
                                      : t_run_ranks(s->p, proc_rank, (void *)s, WATCHDOG_S);
    ok(bad == 0, "%s: every rank returned, none hung (%.1f s; timeout 60 s)", name, t_last_run.seconds);
    if (s->kind >= K_ROOTED) {
        /* Unrooted: every rank receives from a neighbour, so the first message with another
         * digest stops a rank at once; ranks whose own messages all matched learn it from a
         * peer that left over it (its published failure): MISMATCH too. */
        for (r = 0; r < s->p; r++) {
            ok(R->rc[r] == DDP_ERR_MISMATCH, "%s: rank %d gets DDP_ERR_MISMATCH (got %s): %s", name, r,
               R->rc[r] < 0 ? "no return" : ddp_strerror((ddp_result_t)R->rc[r]), R->msg[r]);
            ok(R->after[r] != DDP_SUCCESS && R->after[r] != -1, "%s: rank %d: the next call fails too", name, r);
        }
        return;
    }
    for (r = 0; r < s->p; r++) {
        ok(R->rc[r] == DDP_ERR_MISMATCH, "%s: rank %d gets DDP_ERR_MISMATCH (got %s)", name, r,
           R->rc[r] < 0 ? "no return" : ddp_strerror((ddp_result_t)R->rc[r]));
        ok(R->rc[r] != DDP_ERR_MISMATCH || shows_both(s, R->msg[r]), "%s: rank %d's message shows both calls: %s",
           name, r, R->msg[r]);
        ok(R->after[r] != DDP_SUCCESS && R->after[r] != -1, "%s: rank %d: the next call fails too (%s)", name, r,
           R->after[r] < 0 ? "no return" : ddp_strerror((ddp_result_t)R->after[r]));
    }
}

/* ----------------------------------------------------------------- impossible sizes */
enum { H_ALL_REDUCE, H_REDUCE_SCATTER, H_ALL_GATHER, H_BROADCAST, H_REDUCE, H_GATHER, H_SCATTER,
       H_ALL_TO_ALL, H_SENDRECV, H_ALL_REDUCE_ASYNC, H_NUM };
static const char *const huge_names[H_NUM] = {"all_reduce", "reduce_scatter", "all_gather", "broadcast",
    "reduce", "gather", "scatter", "all_to_all", "send/recv", "all_reduce_async"};
static const char *const huge_arg[H_NUM] = {"count", "recvcount", "sendcount", "count", "count",
    "sendcount", "recvcount", "count", "count", "count"};

typedef struct { const char *mode; int which; size_t count; } huge_t;

static int huge_rank(int rank, int p, void *arg) {
    const huge_t *h = (const huge_t *)arg;
    float buf[64], out[64];
    ddp_comm_desc_t d;
    ddp_comm_t *c;
    ddp_request_t req;
    ddp_result_t r = DDP_SUCCESS;
    size_t n = h->count;
    t_desc(&d, TIMEOUT_MS);
    d.transport = h->mode;
    memset(buf, 0, sizeof buf);
    if (!(c = t_comm_init(rank, p, &d))) return 1;
    t_where("%s with count %zu", huge_names[h->which], n);
    switch (h->which) {
    case H_ALL_REDUCE: r = ddp_all_reduce(buf, out, n, DDP_FLOAT32, DDP_SUM, c); break;
    case H_REDUCE_SCATTER: r = ddp_reduce_scatter(buf, out, n, DDP_FLOAT32, DDP_SUM, c); break;
    case H_ALL_GATHER: r = ddp_all_gather(buf, out, n, DDP_FLOAT32, c); break;
    case H_BROADCAST: r = ddp_broadcast(buf, buf, n, DDP_FLOAT32, 0, c); break;
    case H_REDUCE: r = ddp_reduce(buf, out, n, DDP_FLOAT32, DDP_SUM, 0, c); break;
    case H_GATHER: r = ddp_gather(buf, out, n, DDP_FLOAT32, 0, c); break;
    case H_SCATTER: r = ddp_scatter(buf, out, n, DDP_FLOAT32, 0, c); break;
    case H_ALL_TO_ALL: r = ddp_all_to_all(buf, out, n, DDP_FLOAT32, c); break;
    case H_SENDRECV:
        r = rank == 0 ? ddp_send(buf, n, DDP_FLOAT32, 1, c) : ddp_recv(out, n, DDP_FLOAT32, 0, c);
        break;
    default:
        r = ddp_all_reduce_async(buf, out, n, DDP_FLOAT32, DDP_SUM, c, &req);
        if (r == DDP_SUCCESS) r = ddp_wait(&req);
    }
    ok(r == DDP_ERR_INVALID_ARGUMENT, "%s %s, count %zu: rank %d gets DDP_ERR_INVALID_ARGUMENT (got %s)",
       h->mode, huge_names[h->which], n, rank, ddp_strerror(r));
    ok(r != DDP_ERR_INVALID_ARGUMENT || strstr(ddp_comm_last_error(c), huge_arg[h->which]),
       "... the message names %s: %s", huge_arg[h->which], ddp_comm_last_error(c));
    t_where("an all_reduce after it");
    r = ddp_all_reduce(buf, buf, 4, DDP_FLOAT32, DDP_SUM, c);
    ok(r == DDP_SUCCESS, "... and the communicator still works: all_reduce -> %s", ddp_strerror(r));
    ddp_comm_destroy(c);
    return 0;
}

static void run_huge(const char *mode, int which, size_t count) {
    huge_t h;
    char name[96];
    int bad;
    snprintf(name, sizeof name, "%s huge %s %zu", mode, huge_names[which], count);
    if (!t_selected(name)) return;
    h.mode = mode; h.which = which; h.count = count;
    bad = t_run_ranks(2, huge_rank, &h, WATCHDOG_S);
    ok(bad == 0, "%s: both ranks exited cleanly (%.1f s)", name, t_last_run.seconds);
}

int main(void) {
    static const char *const modes[] = {"tcp", "shm", "threads"};
    static const int ps[] = {2, 4};
    int m, k, v, i;
    t_init();
    for (m = 0; m < 3; m++)
        for (k = 0; k < K_NUM; k++)
            for (v = V_ROOTS; v <= V_OP; v++) {
                scen_t s;
                if (v == V_OP && k != K_REDUCE) continue;
                if (k >= K_ROOTED && v != V_COUNT && v != V_DTYPE) continue;
                for (i = 0; i < 2; i++) {
                    if (v != V_ROOTS && ps[i] != 2 && m != 0 && k < K_ROOTED) continue;
                    s.mode = modes[m]; s.kind = k; s.var = v; s.p = ps[i];
                    run_scen(&s);
                }
            }
    for (m = 0; m < 2; m++)
        for (k = 0; k < H_NUM; k++) {
            /* bytes beyond PTRDIFF_MAX for one rank's block ... */
            run_huge(modes[m], k, SIZE_MAX / 4);
            /* ... or only once multiplied by the world size (2) */
            if (k == H_REDUCE_SCATTER || k == H_ALL_GATHER || k == H_GATHER || k == H_SCATTER || k == H_ALL_TO_ALL)
                run_huge(modes[m], k, (size_t)PTRDIFF_MAX / 4 / 2 + 1);
        }
    return t_done();
}
