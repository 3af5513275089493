/* SPDX-License-Identifier: MIT (see LICENSE) */
/* tests/test_failures.c — what libddp does when things go wrong: bad arguments, dead, silent,
 * missing, duplicated and disagreeing ranks, strangers, bad environments. Prints TAP.
 *
 *   build/test_failures
 *
 * The rule under test (issue 2, "Failure behaviour"): every failure is a returned error, never
 * a crash, a hang, abort(), exit() or SIGPIPE; a dead peer makes every surviving rank return
 * DDP_ERR_REMOTE (or DDP_ERR_TIMEOUT) promptly, with ddp_comm_last_error naming the rank and
 * the phase; init failures are told by ddp_last_init_error, naming the variable or the rank.
 * "Promptly" is checked against timeouts set far above it (desc.timeout_ms = 20 s, elapsed
 * must stay under 10 s), so a library that merely times out fails the check. Every scenario
 * runs in real processes under the harness's watchdog. SIGPIPE keeps its default action
 * (t_init resets it), so a send that raised it would kill the rank and show in its exit status.
 * Expected failures are silenced (desc.log_level = 1) to keep the output readable.
 *
 * Scenarios: bad arguments (NULL comm/buffers, invalid dtype/op/root, count x size overflow,
 * bad init arguments; the communicator stays usable after rejected calls); calls on a destroyed
 * communicator (its memory kept alive by a run-time allocator, so the call is well defined); a
 * rank SIGKILLed mid-all-reduce (a middle rank, and rank 0, which also hosts the store; and in
 * the hierarchical and Rabenseifner all-reduces over two fake hosts: inside a host, across,
 * a folded rank); a rank alive but silent; a rank that never starts (also rank 0, the master); world-size
 * disagreement; two processes given the same rank; mismatched counts / dtypes / ops /
 * collectives / roots / algorithms and count 0 against 1000; strangers sending garbage to the
 * master port and to a rank's transport listener during rendezvous; ddp_comm_init_env with
 * missing or malformed variables (torchrun, Open MPI, PMI, Slurm names), with none (a world of
 * one) and real ranks started from the environment alone. */
#define _GNU_SOURCE
#include "ddp.h"
#include "transports/ddp_tcp.h"
#include "tests/ddp_test.h"

#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sys/resource.h>

typedef struct {
    double t_kill, t_err[T_MAX_RANKS];
    int rc[T_MAX_RANKS];
    int twice;                      /* processes whose error says "twice" */
    int flag[8];
    int returned;                   /* silent, same_rank: processes whose call has returned */
    pid_t pid0;
    char msg[T_MAX_RANKS][1024];
} fail_shm_t;

static fail_shm_t *S;

static ddp_comm_t *init_comm(int rank, int p, int timeout_ms, int quiet) {
    ddp_comm_desc_t d;
    t_desc(&d, timeout_ms);
    d.log_level = quiet ? 1 : 0;
    return t_comm_init(rank, p, &d);
}

/* ----------------------------------------------------------------- bad arguments */
typedef struct { void *p[256]; int n, freed; } keep_alloc_t;
static void *keep_alloc(size_t n, void *user) {
    keep_alloc_t *k = (keep_alloc_t *)user;
    void *p = malloc(n);
    if (p && k->n < 256) k->p[k->n++] = p;
    return p;
}
static void keep_free(void *p, void *user) { (void)p; ((keep_alloc_t *)user)->freed++; }   /* really freed later */

static int bad_args(int rank, int p, void *arg) {
    ddp_comm_t *c;
    float buf[64], out[64 * 4];
    ddp_result_t r;
    int i;
    (void)arg;
    if (rank == 0) {   /* ddp_comm_init's own checks need no network */
        ddp_comm_desc_t d;
        ddp_comm_t *x = (ddp_comm_t *)(uintptr_t)1;   /* must be set to NULL */
        ddp_allocator_t half = {keep_alloc, NULL, NULL};
        t_desc(&d, 2000);
        d.log_level = 1;
        ok(ddp_comm_init(NULL, 2, 0, &d) == DDP_ERR_INVALID_ARGUMENT, "ddp_comm_init(NULL comm out)");
        ok(ddp_comm_init(&x, 0, 0, &d) == DDP_ERR_INVALID_ARGUMENT && x == NULL, "ddp_comm_init nranks 0 (and *comm set to NULL)");
        ok(ddp_comm_init(&x, -3, 0, &d) == DDP_ERR_INVALID_ARGUMENT, "ddp_comm_init nranks -3");
        ok(ddp_comm_init(&x, 2, -1, &d) == DDP_ERR_INVALID_ARGUMENT, "ddp_comm_init rank -1");
        ok(ddp_comm_init(&x, 2, 2, &d) == DDP_ERR_INVALID_ARGUMENT, "ddp_comm_init rank == nranks");
        d.allocator = &half;
        ok(ddp_comm_init(&x, 1, 0, &d) == DDP_ERR_INVALID_ARGUMENT, "ddp_comm_init with an allocator lacking free");
        d.allocator = NULL;
        d.transport = "carrier-pigeon";
        r = ddp_comm_init(&x, 1, 0, &d);
        ok(r == DDP_ERR_UNSUPPORTED && strstr(ddp_last_init_error(), "carrier-pigeon") && strstr(ddp_last_init_error(), "tcp"),
           "an unknown transport -> %s, naming it and what is compiled in: %s", ddp_strerror(r), ddp_last_init_error());
        d.transport = NULL;
        d.master_port = 70000;
        r = ddp_comm_init(&x, 1, 0, &d);
        ok(r == DDP_ERR_INVALID_ARGUMENT, "master_port 70000 -> %s: %s", ddp_strerror(r), ddp_last_init_error());
        ok(ddp_comm_rank(NULL) == -1 && ddp_comm_size(NULL) == -1 && ddp_comm_local_rank(NULL) == -1,
           "rank/size/local_rank of a NULL comm are -1");
        ok(ddp_comm_last_error(NULL) != NULL && ddp_comm_destroy(NULL) == DDP_ERR_INVALID_ARGUMENT,
           "ddp_comm_last_error(NULL) is a string; ddp_comm_destroy(NULL) -> INVALID_ARGUMENT");
        ok(ddp_all_reduce(buf, buf, 4, DDP_FLOAT32, DDP_SUM, NULL) == DDP_ERR_INVALID_ARGUMENT &&
           ddp_reduce_scatter(buf, buf, 4, DDP_FLOAT32, DDP_SUM, NULL) == DDP_ERR_INVALID_ARGUMENT &&
           ddp_all_gather(buf, out, 4, DDP_FLOAT32, NULL) == DDP_ERR_INVALID_ARGUMENT &&
           ddp_broadcast(buf, buf, 4, DDP_FLOAT32, 0, NULL) == DDP_ERR_INVALID_ARGUMENT &&
           ddp_barrier(NULL) == DDP_ERR_INVALID_ARGUMENT, "every collective with a NULL comm -> INVALID_ARGUMENT");
    }
    c = init_comm(rank, p, 20000, 1);
    if (!c) return 1;
    for (i = 0; i < 64; i++) buf[i] = (float)(rank + 1);
#define BAD(call, what)                                                                         \
    do {                                                                                        \
        r = (call);                                                                             \
        ok(r == DDP_ERR_INVALID_ARGUMENT, "%s -> %s", what, ddp_strerror(r));                   \
    } while (0)
    BAD(ddp_all_reduce(NULL, out, 4, DDP_FLOAT32, DDP_SUM, c), "all_reduce NULL sendbuf, count 4");
    BAD(ddp_all_reduce(buf, NULL, 4, DDP_FLOAT32, DDP_SUM, c), "all_reduce NULL recvbuf, count 4");
    BAD(ddp_reduce_scatter(NULL, out, 4, DDP_FLOAT32, DDP_SUM, c), "reduce_scatter NULL sendbuf");
    BAD(ddp_reduce_scatter(buf, NULL, 4, DDP_FLOAT32, DDP_SUM, c), "reduce_scatter NULL recvbuf");
    BAD(ddp_all_gather(NULL, out, 4, DDP_FLOAT32, c), "all_gather NULL sendbuf");
    BAD(ddp_all_gather(buf, NULL, 4, DDP_FLOAT32, c), "all_gather NULL recvbuf");
    BAD(ddp_broadcast(rank == 0 ? NULL : buf, rank == 0 ? buf : NULL, 4, DDP_FLOAT32, 0, c),
        rank == 0 ? "broadcast: the root passes a NULL sendbuf" : "broadcast: a non-root passes a NULL recvbuf");
    BAD(ddp_all_reduce(buf, out, 4, (ddp_dtype_t)DDP_NUM_DTYPES, DDP_SUM, c), "all_reduce dtype 10");
    BAD(ddp_all_reduce(buf, out, 4, (ddp_dtype_t)-1, DDP_SUM, c), "all_reduce dtype -1");
    ok(strstr(ddp_comm_last_error(c), "dtype") != NULL, "ddp_comm_last_error says it was the dtype: %s", ddp_comm_last_error(c));
    BAD(ddp_reduce_scatter(buf, out, 4, (ddp_dtype_t)77, DDP_SUM, c), "reduce_scatter dtype 77");
    BAD(ddp_all_gather(buf, out, 4, (ddp_dtype_t)DDP_NUM_DTYPES, c), "all_gather dtype 10");
    BAD(ddp_broadcast(buf, buf, 4, (ddp_dtype_t)DDP_NUM_DTYPES, 0, c), "broadcast dtype 10");
    BAD(ddp_all_reduce(buf, out, 4, DDP_FLOAT32, (ddp_op_t)DDP_NUM_OPS, c), "all_reduce op 5");
    BAD(ddp_all_reduce(buf, out, 4, DDP_FLOAT32, (ddp_op_t)-1, c), "all_reduce op -1");
    ok(strstr(ddp_comm_last_error(c), "op") != NULL, "ddp_comm_last_error says it was the op: %s", ddp_comm_last_error(c));
    BAD(ddp_reduce_scatter(buf, out, 4, DDP_FLOAT32, (ddp_op_t)9, c), "reduce_scatter op 9");
    BAD(ddp_broadcast(buf, buf, 4, DDP_FLOAT32, -1, c), "broadcast root -1");
    BAD(ddp_broadcast(buf, buf, 4, DDP_FLOAT32, p, c), "broadcast root == nranks");
    ok(strstr(ddp_comm_last_error(c), "root") != NULL, "ddp_comm_last_error says it was the root: %s", ddp_comm_last_error(c));
    BAD(ddp_all_reduce(buf, out, SIZE_MAX / 2 + 1, DDP_FLOAT32, DDP_SUM, c), "all_reduce count SIZE_MAX/2+1 floats (bytes overflow)");
    BAD(ddp_reduce_scatter(buf, out, SIZE_MAX / 4 / (size_t)p + 1, DDP_FLOAT32, DDP_SUM, c), "reduce_scatter recvcount x nranks x 4 overflows");
    BAD(ddp_all_gather(buf, out, SIZE_MAX / 8 / (size_t)p + 1, DDP_FLOAT64, c), "all_gather sendcount x nranks x 8 overflows");
    BAD(ddp_broadcast(buf, buf, SIZE_MAX / 2 + 1, DDP_BFLOAT16, 0, c), "broadcast count x 2 overflows");
    ok(strstr(ddp_comm_last_error(c), "overflow") != NULL, "ddp_comm_last_error says it overflows: %s", ddp_comm_last_error(c));
#undef BAD
    /* Count 0 with NULL buffers is legal (NCCL); rejected calls must not have poisoned the
     * communicator or put the ranks out of step: a real all-reduce still works. */
    r = ddp_all_reduce(NULL, NULL, 0, DDP_FLOAT32, DDP_SUM, c);
    ok(r == DDP_SUCCESS, "all_reduce count 0 with NULL buffers -> %s", ddp_strerror(r));
    r = ddp_all_reduce(buf, out, 64, DDP_FLOAT32, DDP_SUM, c);
    {
        int good = r == DDP_SUCCESS;
        for (i = 0; i < 64 && good; i++) good = out[i] == (float)(p * (p + 1) / 2);
        ok(good, "after all the rejected calls the communicator still works (all_reduce -> %s)", ddp_strerror(r));
    }
    ok(ddp_comm_destroy(c) == DDP_SUCCESS, "destroy");
    return 0;
}

/* Calls on a destroyed communicator: well defined only if its memory is still there, so the
 * communicator's memory comes from an allocator that frees for real only at the end. */
static int destroyed(int rank, int p, void *arg) {
    keep_alloc_t k;
    ddp_allocator_t a;
    ddp_comm_desc_t d;
    ddp_comm_t *c = NULL;
    float buf[4] = {1, 2, 3, 4};
    ddp_result_t r;
    int i;
    (void)arg;
    memset(&k, 0, sizeof k);
    a.alloc = keep_alloc; a.free = keep_free; a.user = &k;
    t_desc(&d, 20000);
    d.allocator = &a;
    d.log_level = 1;
    r = ddp_comm_init(&c, p, rank, &d);
    if (!ok(r == DDP_SUCCESS, "init with a run-time allocator -> %s", ddp_strerror(r))) return 1;
    ok(k.n > 0, "the desc's allocator is used (%d allocations)", k.n);
    ok(ddp_all_reduce(buf, buf, 4, DDP_FLOAT32, DDP_SUM, c) == DDP_SUCCESS, "all_reduce before destroy");
    ok(ddp_comm_destroy(c) == DDP_SUCCESS, "destroy");
    ok(k.freed > 0, "destroy gives the memory back through the allocator (%d frees)", k.freed);
    if (k.n > 0) {   /* only meaningful (and safe) if the comm itself came from our allocator */
        r = ddp_all_reduce(buf, buf, 4, DDP_FLOAT32, DDP_SUM, c);
        ok(r == DDP_ERR_INVALID_USAGE || r == DDP_ERR_INVALID_ARGUMENT, "all_reduce on a destroyed comm -> %s", ddp_strerror(r));
        r = ddp_barrier(c);
        ok(r == DDP_ERR_INVALID_USAGE || r == DDP_ERR_INVALID_ARGUMENT, "barrier on a destroyed comm -> %s", ddp_strerror(r));
        r = ddp_comm_destroy(c);
        ok(r == DDP_ERR_INVALID_USAGE || r == DDP_ERR_INVALID_ARGUMENT, "destroy twice -> %s", ddp_strerror(r));
        ok(ddp_comm_last_error(c) != NULL, "ddp_comm_last_error on a destroyed comm: %s", ddp_comm_last_error(c));
    }
    for (i = 0; i < k.n; i++) free(k.p[i]);
    return 0;
}

/* ----------------------------------------------------------------- a rank killed mid-all-reduce */
typedef struct { int victim; } kill_arg_t;
static volatile int started;
static void *killer(void *arg) {
    (void)arg;
    while (!__atomic_load_n(&started, __ATOMIC_SEQ_CST)) t_sleep_ms(1);
    t_sleep_ms(60);
    S->t_kill = t_now();
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    raise(SIGKILL);
    return NULL;
}

static int killed(int rank, int p, void *arg) {
    const kill_arg_t *ka = (const kill_arg_t *)arg;
    const size_t n = (size_t)16 << 20;   /* 64 MiB of float: each all-reduce takes a while */
    float *buf;
    ddp_comm_t *c;
    ddp_result_t r = DDP_SUCCESS, r2;
    int it;
    double t_err;
    c = init_comm(rank, p, 20000, rank != (ka->victim + 1) % p);
    if (!c) return 1;
    buf = (float *)malloc(n * sizeof *buf);
    for (it = 0; it < (int)n; it++) buf[it] = 1.0f;
    if (rank == ka->victim) {
        pthread_t th;
        pthread_create(&th, NULL, killer, NULL);
    }
    t_where("all_reduce loop");
    for (it = 0; it < 1000; it++) {
        r = ddp_all_reduce(buf, buf, n, DDP_FLOAT32, DDP_MAX, c);
        if (it == 0) __atomic_store_n(&started, 1, __ATOMIC_SEQ_CST);
        if (r != DDP_SUCCESS) break;
    }
    t_err = t_now();
    S->rc[rank] = r;
    S->t_err[rank] = t_err;
    snprintf(S->msg[rank], sizeof S->msg[rank], "%s", ddp_comm_last_error(c));
    ok(r == DDP_ERR_REMOTE || r == DDP_ERR_TIMEOUT, "survivor: all_reduce #%d -> %s", it + 1, ddp_strerror(r));
    ok(S->t_kill > 0 && t_err - S->t_kill < 10, "... %.3f s after rank %d was killed (timeout 20 s)", t_err - S->t_kill, ka->victim);
    ok(t_mentions_rank(ddp_comm_last_error(c), ka->victim), "ddp_comm_last_error names the dead rank %d: %s", ka->victim, ddp_comm_last_error(c));
    ok(strstr(ddp_comm_last_error(c), "phase") != NULL, "... and the phase");
    {
        double t0 = t_now();
        r2 = ddp_all_reduce(buf, buf, 1024, DDP_FLOAT32, DDP_SUM, c);
        ok(r2 != DDP_SUCCESS && t_now() - t0 < 10, "the next call fails at once (%s, %.3f s, not after the 20 s timeout): "
           "the communicator stays failed", ddp_strerror(r2), t_now() - t0);
    }
    {
        struct sigaction sa;
        sigaction(SIGPIPE, NULL, &sa);
        ok(sa.sa_handler == SIG_DFL, "SIGPIPE still has its default action in this rank (so the test could catch it)");
    }
    {
        double t0 = t_now();
        t_where("ddp_comm_destroy after the failure");
        ok(ddp_comm_destroy(c) == DDP_SUCCESS && t_now() - t0 < 10, "destroy after the failure (%.3f s)", t_now() - t0);
    }
    free(buf);
    return 0;
}

/* algo / hosts: DDP_ALGO and DDP_TEST_HOSTS for the ranks (NULL: unset) */
static void run_killed_with(int p, int victim, const char *algo, const char *hosts) {
    kill_arg_t ka;
    int r, bad = 0;
    ka.victim = victim;
    S = (fail_shm_t *)t_shm_user(sizeof *S);
    if (!t_selected("killed")) return;
    diag("--- rank %d of %d killed (SIGKILL) in the middle of a 64 MiB all-reduce loop%s%s%s%s", victim, p,
         algo ? ", DDP_ALGO=" : "", algo ? algo : "", hosts ? ", DDP_TEST_HOSTS=" : "", hosts ? hosts : "");
    if (algo) setenv("DDP_ALGO", algo, 1);
    if (hosts) setenv("DDP_TEST_HOSTS", hosts, 1);
    t_run_ranks(p, killed, &ka, 120);
    unsetenv("DDP_ALGO");
    unsetenv("DDP_TEST_HOSTS");
    ok(t_rank_signaled(victim, SIGKILL), "the victim died of SIGKILL, mid-collective");
    for (r = 0; r < p; r++)
        if (r != victim && !(t_last_run.exited[r] && t_last_run.code[r] == 0)) bad++;
    ok(bad == 0, "every survivor returned normally: no crash, no SIGPIPE, no hang");
}

static void run_killed(int p, int victim) { run_killed_with(p, victim, NULL, NULL); }

/* ----------------------------------------------------------------- a silent rank */
static int silent(int rank, int p, void *arg) {
    ddp_comm_t *c = init_comm(rank, p, 1500, 1);
    float buf[256];
    ddp_result_t r;
    double t0, dt;
    int i;
    (void)arg;
    if (!c) return 1;
    for (i = 0; i < 256; i++) buf[i] = 1;
    if (rank == p - 1) {   /* alive, connected, but never calls the collective, until the others returned */
        double tw = t_now();
        t_where("being silent");
        while (__atomic_load_n(&S->returned, __ATOMIC_SEQ_CST) < p - 1 && t_now() - tw < 60) t_sleep_ms(5);
        ddp_comm_destroy(c);
        return 0;
    }
    t0 = t_now();
    r = ddp_all_reduce(buf, buf, 256, DDP_FLOAT32, DDP_SUM, c);
    dt = t_now() - t0;
    __atomic_add_fetch(&S->returned, 1, __ATOMIC_SEQ_CST);
    ok(r == DDP_ERR_TIMEOUT || r == DDP_ERR_REMOTE, "all_reduce with a rank that never calls it -> %s", ddp_strerror(r));
    /* The silent rank stays until every other rank has returned (60 s at most): returning before
     * 30 s is returning by the timeout, not because the silent rank gave up. */
    ok(dt > 1.0 && dt < 30, "... after about the timeout of 1.5 s (%.3f s), before the silent rank gives up", dt);
    if (rank == 0)   /* rank 0 receives from rank p-1: it waits for the silent one directly */
        ok(t_mentions_rank(ddp_comm_last_error(c), p - 1), "the rank that waits on it names rank %d: %s", p - 1, ddp_comm_last_error(c));
    else
        ok(t_mentions_rank(ddp_comm_last_error(c), 0) || t_mentions_rank(ddp_comm_last_error(c), p - 1),
           "the message names a rank: %s", ddp_comm_last_error(c));
    ddp_comm_destroy(c);
    return 0;
}

/* ----------------------------------------------------------------- where the log goes
 * desc.log_fn takes every line (level, rank, the message without libddp's prefix) and nothing
 * goes to stderr; DDP_DEBUG_FILE (%r the rank, %p the pid) takes them instead of stderr. */
static int log_to(char *path, size_t cap, const char *name);
static void log_read(const char *path, char *log, size_t cap);
typedef struct { int n, info, rank0, prefixed; } log_seen_t;
static void collect_log(void *user, ddp_log_level_t level, int rank, const char *msg) {
    log_seen_t *k = (log_seen_t *)user;
    k->n++;
    if (level == DDP_LOG_INFO && strncmp(msg, "libddp ", 7) == 0 && strstr(msg, "rank 0 of 1")) k->info++;
    if (rank == 0) k->rank0++;
    if (strstr(msg, "[ddp")) k->prefixed++;
}

static int log_routes(int rank, int p, void *arg) {
    ddp_comm_desc_t d;
    ddp_comm_t *c = NULL;
    log_seen_t k;
    char path[512], err[4096], file[512], *body;
    FILE *f;
    size_t n;
    (void)rank; (void)p; (void)arg;
    memset(&k, 0, sizeof k);
    if (!log_to(path, sizeof path, "logroute")) return 1;
    t_desc(&d, 10000);
    d.log_fn = collect_log;
    d.log_user = &k;
    d.log_level = 1 + DDP_LOG_INFO;
    if (ddp_comm_init(&c, 1, 0, &d) == DDP_SUCCESS) ddp_comm_destroy(c);
    c = NULL;
    /* DDP_DEBUG_FILE, no callback */
    snprintf(file, sizeof file, "%s/ddp_test_log.%%r.%%p", t_tmpdir());
    setenv("DDP_DEBUG_FILE", file, 1);
    setenv("DDP_DEBUG", "INFO", 1);
    t_desc(&d, 10000);
    if (ddp_comm_init(&c, 1, 0, &d) == DDP_SUCCESS) ddp_comm_destroy(c);
    unsetenv("DDP_DEBUG_FILE");
    unsetenv("DDP_DEBUG");
    log_read(path, err, sizeof err);
    snprintf(file, sizeof file, "%s/ddp_test_log.0.%ld", t_tmpdir(), (long)getpid());
    f = fopen(file, "r");
    body = (char *)calloc(1, 65536);
    n = f && body ? fread(body, 1, 65535, f) : 0;
    if (f) fclose(f);
    remove(file);
    ok(k.n > 3 && k.info == 1 && k.rank0 == k.n && k.prefixed == 0,
       "desc.log_fn gets every line: %d lines, the INFO version line %d time(s), all rank 0, none with libddp's prefix",
       k.n, k.info);
    ok(n > 0 && body && strstr(body, "[ddp rank 0] INFO libddp ") && strstr(body, "rank 0 of 1"),
       "DDP_DEBUG_FILE=$TMPDIR/ddp_test_log.%%r.%%p: the lines are in $TMPDIR/ddp_test_log.0.<pid> (%zu bytes)", n);
    ok(err[0] == 0, "... and nothing of either went to stderr: '%.200s'", err);
    free(body);
    return 0;
}

/* ----------------------------------------------------------------- a collective wait that speaks
 * Rank 1 enters the all_reduce only once rank 0 has said, at WARN, that it waits for it (after
 * 10 s without progress): the note names the call and rank 1, and the call then succeeds. No
 * time is assumed: rank 1 waits for rank 0's log (at most 60 s), not for a clock. */
static int late_rank_named(int rank, int p, void *arg) {
    ddp_comm_desc_t d;
    ddp_comm_t *c = NULL;
    float x[64];
    char path[512], log[8192];
    ddp_result_t r;
    int i;
    (void)arg;
    snprintf(path, sizeof path, "%s/ddp_test_latelog.%d", t_tmpdir(), (int)getppid());
    if (rank == 0 && !freopen(path, "w", stderr)) return 1;
    t_desc(&d, 60000);
    d.log_level = 1 + DDP_LOG_WARN;
    if (ddp_comm_init(&c, p, rank, &d) != DDP_SUCCESS) return 1;
    for (i = 0; i < 64; i++) x[i] = 1;
    if (rank == 1) {   /* late: until rank 0 has said it waits */
        double t0 = t_now();
        int said = 0;
        while (!said && t_now() - t0 < 60) {
            FILE *f = fopen(path, "r");
            size_t n = f ? fread(log, 1, sizeof log - 1, f) : 0;
            if (f) fclose(f);
            log[n] = 0;
            said = strstr(log, "no progress for") != NULL;
            if (!said) t_sleep_ms(50);
        }
        ok(said, "rank 1 holds back until rank 0 says it waits");
    }
    r = ddp_all_reduce(x, x, 64, DDP_FLOAT32, DDP_SUM, c);
    ok(r == DDP_SUCCESS && x[0] == 2, "the all_reduce then completes -> %s", ddp_strerror(r));
    if (rank == 0) {
        fflush(stderr);
        log_read(path, log, sizeof log);
        ok(strstr(log, "WARN all_reduce #1") && strstr(log, "no progress for 1") && strstr(log, "rank 1 (timeout in "),
           "rank 0's wait said what it waits for: %.300s", strstr(log, "WARN") ? strstr(log, "WARN") : log);
    }
    ddp_comm_destroy(c);
    return 0;
}

/* ----------------------------------------------------------------- a rank that leaves early
 * Uneven inputs, the classic DDP bug: rank 1 makes 2 calls and destroys its communicator, rank 0
 * makes a third. Rank 0's error names rank 1, its 2 calls and this rank's call 3, not just a
 * closed connection (rank 1 leaves a note before its connections close). */
static int leaves_early(int rank, int p, void *arg) {
    ddp_comm_desc_t d;
    ddp_comm_t *c = NULL;
    float buf[256];
    ddp_result_t r;
    int i, calls = rank == 1 ? 2 : 3;
    (void)arg;
    t_desc(&d, 20000);
    d.log_level = 1;
    if (ddp_comm_init(&c, p, rank, &d) != DDP_SUCCESS) return 1;
    for (i = 0; i < 256; i++) buf[i] = 1;
    for (i = 0, r = DDP_SUCCESS; i < calls && r == DDP_SUCCESS; i++)
        r = ddp_all_reduce(buf, buf, 256, DDP_FLOAT32, DDP_SUM, c);
    if (rank == 0) {
        const char *e = ddp_comm_last_error(c);
        ok(r == DDP_ERR_REMOTE && i == 3, "the third all_reduce, which rank 1 never makes -> %s (call %d)",
           ddp_strerror(r), i);
        ok(strstr(e, "rank 1 destroyed its communicator after 2 calls; this rank is in call 3") != NULL,
           "the error names who left and when: %s", e);
    } else {
        ok(r == DDP_SUCCESS, "rank 1's two calls -> %s", ddp_strerror(r));
    }
    ddp_comm_destroy(c);
    return 0;
}

/* ----------------------------------------------------------------- a rank that never joins */
static int never_joins(int rank, int p, void *arg) {
    const int missing = *(const int *)arg;
    ddp_comm_desc_t d;
    ddp_comm_t *c = NULL;
    ddp_result_t r;
    double t0, dt;
    const char *msg, *tail;
    if (rank == missing) return 0;
    t_desc(&d, 1000);
    d.log_level = 1;
    t0 = t_now();
    r = ddp_comm_init(&c, p, rank, &d);
    dt = t_now() - t0;
    msg = ddp_last_init_error();
    /* TIMEOUT, or REMOTE when another waiting rank timed out first and told the rest. */
    ok((r == DDP_ERR_TIMEOUT || (r == DDP_ERR_REMOTE && missing != 0)) && c == NULL,
       "ddp_comm_init while rank %d never starts -> %s", missing, ddp_strerror(r));
    /* Its own timeout cannot fire early; a peer's (REMOTE) may come first, by how much earlier
     * that peer started. The upper bound only says it ended (not a speed claim). */
    ok((r != DDP_ERR_TIMEOUT || dt >= 0.9) && dt < 30, "... after the 1 s timeout, or a peer's (%.3f s, %s)",
       dt, ddp_strerror(r));
    if (missing == 0) {
        ok(strstr(msg, "127.0.0.1") != NULL && t_mentions_int(msg, t_master_port),
           "the message names the master it could not reach (127.0.0.1:%d): %s", t_master_port, msg);
    } else {
        tail = strstr(msg, "joined");
        ok(tail && t_mentions_int(tail, missing), "the message names the missing rank %d: %s", missing, msg);
        ok(tail && !t_mentions_int(tail, rank), "... and not this rank, which did join");
    }
    if (c) ddp_comm_destroy(c);
    return 0;
}

/* A rank's own log: stderr goes to a file from here (log_to), and is read back (log_read). */
static int log_to(char *path, size_t cap, const char *name) {
    snprintf(path, cap, "%s/ddp_test_%s.%d", t_tmpdir(), name, (int)getpid());
    return freopen(path, "w", stderr) != NULL;
}
static void log_read(const char *path, char *log, size_t cap) {
    FILE *f;
    size_t n;
    fflush(stderr);
    f = fopen(path, "r");
    n = f ? fread(log, 1, cap - 1, f) : 0;
    log[n] = 0;
    if (f) fclose(f);
    remove(path);
}

/* ----------------------------------------------------------------- a wait that speaks
 * A rank missing for longer than 10 s is named at WARN while the others still wait, by every
 * waiting rank, with the store's host saying it hosts it; the message is checked, not the time
 * (the 13 s timeout leaves the first note, due at 10 s, inside the wait under any load). */
static int never_joins_speaks(int rank, int p, void *arg) {
    ddp_comm_desc_t d;
    ddp_comm_t *c = NULL;
    ddp_result_t r;
    char path[512], log[8192];
    (void)arg;
    if (rank == p - 1) return 0;
    if (!log_to(path, sizeof path, "speaks")) return 1;
    t_desc(&d, 13000);
    d.log_level = 1 + DDP_LOG_WARN;   /* the default level */
    r = ddp_comm_init(&c, p, rank, &d);
    log_read(path, log, sizeof log);
    ok(r != DDP_SUCCESS && c == NULL, "init fails without rank %d -> %s", p - 1, ddp_strerror(r));
    ok(strstr(log, "WARN") && strstr(log, "still waiting for rank 2 (check WORLD_SIZE") &&
       strstr(log, "2 of 3 ranks joined"), "while it waits, a WARN says 2 of 3 joined and names rank 2: %.300s",
       strstr(log, "still waiting") ? strstr(log, "init:") : log);
    ok(rank != 0 || strstr(log, "(hosted by this rank)"), "rank 0 says it hosts the store");
    ok(!strstr(log, "did not answer"), "no rank says the store did not answer (it did: the key was not set yet)");
    if (c) ddp_comm_destroy(c);
    return 0;
}

/* A rank given a port nobody listens on (a wrong MASTER_PORT) says, while it retries, which
 * address it tries and what to check: a WARN after 10 s. The retries sleep up to 3 s apart
 * (backoff at most 2 s, jitter x1.5), so the timeout, 25 s, leaves 15 s after the 10 s mark for
 * a retry to say it, under any load (12.5 s left only 2.5 s: the note was missed once beside
 * other tests); the message is checked, not the time. */
static int wrong_port_speaks(int rank, int p, void *arg) {
    ddp_comm_desc_t d;
    ddp_comm_t *c = NULL;
    ddp_result_t r;
    char path[512], log[8192], want[96];
    (void)rank; (void)p; (void)arg;
    if (!log_to(path, sizeof path, "wrongport")) return 1;
    t_desc(&d, 25000);
    d.master_port = t_free_port();   /* nobody listens there */
    d.log_level = 1 + DDP_LOG_WARN;
    r = ddp_comm_init(&c, 2, 1, &d);
    log_read(path, log, sizeof log);
    snprintf(want, sizeof want, "WARN store: connecting to 127.0.0.1:%d for ", d.master_port);   /* then "N s: " */
    ok(r == DDP_ERR_TIMEOUT && c == NULL, "init as rank 1 with a port nobody serves -> %s", ddp_strerror(r));
    ok(strstr(log, want) && strstr(log, "MASTER_ADDR/MASTER_PORT the same on every rank"),
       "while it retries, a WARN names the address and what to check: %.200s", strstr(log, "WARN") ? strstr(log, "WARN") : log);
    if (c) ddp_comm_destroy(c);
    return 0;
}

/* ----------------------------------------------------------------- rank 0 stopped under its listening store
 * Rank 0 stops (SIGSTOP: hung, swapped out, in a debugger) while its store listens: the kernel
 * still completes every connect, so the others reach a socket that never answers. Mode 0: it
 * stops before the others start. Mode 1: it stops once the others have joined and wait for the
 * last rank, which never comes (the last process only watches). The whole rendezvous has one
 * deadline: each rank's error comes within the timeout and a margin, not a timeout per store
 * request or per rank, and it names rank 0's store as not answering. */
#define STOPPED_TIMEOUT_MS 2000
static int raw_connect_port(int port);
static int run(const char *name, int p, int (*fn)(int, int, void *), void *arg, int timeout_s);

/* The watcher: once rank 0's store serves (mode 1: once `joined` ranks joined), stop rank 0. */
static int stop_rank0(int joined) {
    double tw = t_now();
    pid_t pid0;
    int fd = -1, ok_ = 0;
    while (!(pid0 = __atomic_load_n(&S->pid0, __ATOMIC_SEQ_CST)) && t_now() - tw < 20) t_sleep_ms(2);
    if (!joined) {
        while (pid0 && (fd = raw_connect_port(t_master_port)) < 0 && t_now() - tw < 20) t_sleep_ms(5);
        if (fd >= 0) close(fd);
        ok_ = fd >= 0;
    } else {
        ddp_store_desc_t sd;
        ddp_store_t *st = NULL;
        int64_t n = 0;
        memset(&sd, 0, sizeof sd);
        sd.timeout_ms = 10000;
        sd.log_level = 1;
        if (pid0 && ddp_store_open(&st, "127.0.0.1", t_master_port, 0, &sd) == DDP_SUCCESS) {
            while (ddp_store_add(st, "ddp/joined", 0, &n) == DDP_SUCCESS && n < joined && t_now() - tw < 20)
                t_sleep_ms(5);
            ddp_store_close(st);
        }
        ok_ = n == joined;
    }
    if (!ok(ok_ && kill(pid0, SIGSTOP) == 0, "rank 0's store serves%s; rank 0 stopped", joined ? " and the others joined" : ""))
        return 1;
    __atomic_store_n(&S->flag[0], 1, __ATOMIC_SEQ_CST);
    return 0;
}

static int stopped_master(int rank, int p, void *arg) {
    const int mode = *(const int *)arg, ranks = mode ? p - 1 : p;   /* processes that init */
    ddp_comm_desc_t d;
    ddp_comm_t *c = NULL;
    ddp_result_t r;
    double t0, dt;
    const char *msg;
    char where[64];
    t_desc(&d, STOPPED_TIMEOUT_MS);
    d.log_level = 1;
    if (rank == 0) {
        __atomic_store_n(&S->pid0, getpid(), __ATOMIC_SEQ_CST);
        if (ddp_comm_init(&c, p, rank, &d) == DDP_SUCCESS) ddp_comm_destroy(c);   /* stopped in there */
        return 0;
    }
    if (mode == 1 && rank == p - 1) return stop_rank0(p - 1);
    if (mode == 0) {
        if (rank == 1 && stop_rank0(0) != 0) return 1;
        t0 = t_now();
        while (!__atomic_load_n(&S->flag[0], __ATOMIC_SEQ_CST) && t_now() - t0 < 20) t_sleep_ms(2);
    }
    t0 = t_now();
    r = ddp_comm_init(&c, p, rank, &d);
    dt = t_now() - t0;
    msg = ddp_last_init_error();
    snprintf(where, sizeof where, "127.0.0.1:%d", t_master_port);
    ok(r != DDP_SUCCESS && c == NULL, "ddp_comm_init with rank 0 stopped -> %s", ddp_strerror(r));
    /* generous (a busy machine), yet far below a timeout per request or per rank */
    ok(dt < 3.0 * STOPPED_TIMEOUT_MS / 1000, "... within 3x the %d ms timeout: %.2f s", STOPPED_TIMEOUT_MS, dt);
    ok(strstr(msg, where) && strstr(msg, "rank 0's store") && strstr(msg, "not answer"),
       "the message names rank 0's store (%s) as not answering: %s", where, msg);
    S->t_err[rank] = dt;
    if (c) ddp_comm_destroy(c);
    if (__atomic_add_fetch(&S->flag[1], 1, __ATOMIC_SEQ_CST) == ranks - 1)
        kill(__atomic_load_n(&S->pid0, __ATOMIC_SEQ_CST), SIGCONT);   /* let rank 0 end */
    return 0;
}

static void run_stopped_master(int mode) {
    char name[128];
    snprintf(name, sizeof name, "rank 0 stopped while its store listens, %s", mode ? "after the others joined" :
             "before the others start");
    if (run(name, 8, stopped_master, &mode, 120)) {
        int r;
        double worst = 0;
        for (r = 1; r < 8; r++) if (S->t_err[r] > worst) worst = S->t_err[r];
        diag("%s: 8 ranks, timeout %d ms: slowest error after %.2f s", name, STOPPED_TIMEOUT_MS, worst);
    }
}

/* ----------------------------------------------------------------- rank 0 out of descriptors
 * Rank 0 runs under RLIMIT_NOFILE 12 (soft and hard): its store cannot take every rank's
 * connection, nor, at times, its own handle's. Whatever each rank's result, it comes within the
 * rendezvous' deadline and a margin (asking who was missing used to reconnect once per rank, a
 * timeout each: rank 0 outlived a 60 s watchdog with an 8 s timeout). */
static int rank0_few_fds(int rank, int p, void *arg) {
    ddp_comm_desc_t d;
    ddp_comm_t *c = NULL;
    ddp_result_t r;
    double t0, dt;
    (void)arg;
    if (rank == 0) {
        struct rlimit rl;
        rl.rlim_cur = rl.rlim_max = 12;
        if (!ok(setrlimit(RLIMIT_NOFILE, &rl) == 0, "rank 0 under RLIMIT_NOFILE 12")) return 1;
    }
    t_desc(&d, STOPPED_TIMEOUT_MS);
    d.log_level = 1;
    t0 = t_now();
    r = ddp_comm_init(&c, p, rank, &d);
    dt = t_now() - t0;
    ok(dt < 3.0 * STOPPED_TIMEOUT_MS / 1000, "ddp_comm_init -> %s within 3x the %d ms timeout: %.2f s%s%.300s",
       ddp_strerror(r), STOPPED_TIMEOUT_MS, dt, r ? ": " : "", r ? ddp_last_init_error() : "");
    if (c) ddp_comm_destroy(c);
    return 0;
}

/* ----------------------------------------------------------------- a master address that does not resolve
 * Said at once, at the default log level (a WARN naming the address and the resolver's reason,
 * saying it retries: DNS may come up late), retried until the timeout, and the error says
 * "cannot resolve". */
static int unresolvable(int rank, int p, void *arg) {
    ddp_comm_desc_t d;
    ddp_comm_t *c = NULL;
    ddp_result_t r;
    char path[512], log[8192];
    int fd = (snprintf(path, sizeof path, "%s/ddp_test_dns_XXXXXX", t_tmpdir()), mkstemp(path)), saved = dup(2), warns = 0;
    ssize_t n;
    const char *msg, *q;
    (void)rank; (void)p; (void)arg;
    if (!ok(fd >= 0 && saved >= 0, "a file for this rank's log")) return 1;
    unlink(path);
    unsetenv("DDP_DEBUG");
    t_desc(&d, 1500);
    d.master_addr = "no-such-host.invalid";
    fflush(stderr);
    dup2(fd, 2);
    r = ddp_comm_init(&c, 2, 1, &d);   /* rank 1: a client only */
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    msg = ddp_last_init_error();
    n = pread(fd, log, sizeof log - 1, 0);
    close(fd);
    log[n > 0 ? n : 0] = 0;
    for (q = log; (q = strstr(q, "WARN store: cannot resolve master address 'no-such-host.invalid'")) != NULL; q++) warns++;
    ok(r != DDP_SUCCESS && c == NULL, "ddp_comm_init with MASTER_ADDR no-such-host.invalid -> %s", ddp_strerror(r));
    ok(strstr(msg, "cannot resolve") && strstr(msg, "no-such-host.invalid"), "the error says it cannot resolve it: %s", msg);
    ok(warns == 1, "one WARN at the default log level names the address (%d)", warns);
    q = strstr(log, "WARN store: cannot resolve");
    ok(q && strstr(q, "retrying"), "... with the resolver's reason, and says it retries: %.300s", q ? q : log);
    if (c) ddp_comm_destroy(c);
    return 0;
}

/* ----------------------------------------------------------------- world size disagreement */
static int world_size(int rank, int p, void *arg) {
    ddp_comm_desc_t d;
    ddp_comm_t *c = NULL;
    ddp_result_t r;
    double t0;
    int claimed = rank == 0 ? p : p + 1;
    (void)arg;
    t_desc(&d, 60000);   /* "promptly" below: far below this timeout, whatever the load */
    d.log_level = 1;
    t0 = t_now();
    r = ddp_comm_init(&c, claimed, rank, &d);
    S->rc[rank] = r;
    snprintf(S->msg[rank], sizeof S->msg[rank], "%s", ddp_last_init_error());
    ok(r == DDP_ERR_MISMATCH || r == DDP_ERR_REMOTE, "rank %d told world size %d -> %s", rank, claimed, ddp_strerror(r));
    ok(t_now() - t0 < 30, "... promptly (%.3f s, timeout 60 s)", t_now() - t0);
    ok(strstr(ddp_last_init_error(), "world size") != NULL, "the message says world size: %s", ddp_last_init_error());
    if (c) ddp_comm_destroy(c);
    return 0;
}

/* ----------------------------------------------------------------- the same rank twice */
/* Processes 1 and 2 both say rank 1. Rank 0 (the store) starts 0.2 s late, so both are
 * already knocking when the rendezvous opens, and whoever gets a communicator keeps it (and
 * the store) until all three processes have their answer (12 s at most), so that a duplicate
 * still backing off between connection attempts finds the store up: one of the two must be
 * told it joined twice. */
static int same_rank(int idx, int nproc, void *arg) {
    const int rank = idx == 2 ? 1 : idx;
    ddp_comm_desc_t d;
    ddp_comm_t *c = NULL;
    ddp_result_t r;
    double t0;
    (void)arg;
    if (idx == 0) t_sleep_ms(200);
    t0 = t_now();
    t_desc(&d, 20000);
    d.log_level = 1;
    r = ddp_comm_init(&c, 2, rank, &d);
    S->rc[idx] = r;
    __atomic_add_fetch(&S->returned, 1, __ATOMIC_SEQ_CST);
    if (r == DDP_ERR_INVALID_USAGE && strstr(ddp_last_init_error(), "twice")) {
        __atomic_fetch_add(&S->twice, 1, __ATOMIC_SEQ_CST);
        ok(rank == 1, "process %d (rank %d) is told it joined twice: %s", idx, rank, ddp_last_init_error());
    } else if (r != DDP_SUCCESS) {
        ok(r == DDP_ERR_REMOTE && strstr(ddp_last_init_error(), "twice"),
           "process %d (rank %d) fails because of the other's duplicate -> %s: %s", idx, rank, ddp_strerror(r), ddp_last_init_error());
    } else {
        float v[8] = {1, 1, 1, 1, 1, 1, 1, 1};
        ddp_result_t r2 = ddp_all_reduce(v, v, 8, DDP_FLOAT32, DDP_SUM, c);
        ok(r2 != DDP_SUCCESS || v[0] == 2.0f, "process %d (rank %d) initialised; its all_reduce is right or fails (%s)", idx, rank, ddp_strerror(r2));
        {   /* keep the store up: a duplicate that is still retrying its connect must get in */
            double tw = t_now();
            while (__atomic_load_n(&S->returned, __ATOMIC_SEQ_CST) < nproc && t_now() - tw < 12) t_sleep_ms(5);
        }
    }
    if (c) ddp_comm_destroy(c);
    ok(t_now() - t0 < 15, "process %d (rank %d) done in %.3f s, before its 20 s timeout: %s", idx, rank, t_now() - t0,
       ddp_strerror(r));
    return 0;
}

/* ----------------------------------------------------------------- mismatched calls */
enum { MM_COUNT, MM_DTYPE, MM_OP, MM_KIND, MM_ROOT, MM_ZERO, MM_ALGO };
typedef struct { int kind; const char *name; } mm_arg_t;

static int mismatch(int rank, int p, void *arg) {
    const mm_arg_t *m = (const mm_arg_t *)arg;
    ddp_comm_t *c = init_comm(rank, p, m->kind == MM_ZERO ? 3000 : 20000, 1);
    float *buf = (float *)calloc(4096, sizeof(float)), *out = (float *)calloc(4096 * 4, sizeof(float));
    ddp_result_t r = DDP_SUCCESS, r2;
    double t0, dt;
    const int odd = rank == p - 1;   /* the last rank calls something else */
    if (!c) return 1;
    t0 = t_now();
    switch (m->kind) {
    case MM_COUNT: r = ddp_all_reduce(buf, buf, odd ? 1001 : 1000, DDP_FLOAT32, DDP_SUM, c); break;
    case MM_DTYPE: r = ddp_all_reduce(buf, buf, 1000, odd ? DDP_INT32 : DDP_FLOAT32, DDP_SUM, c); break;
    case MM_OP: r = ddp_all_reduce(buf, buf, 1000, DDP_FLOAT32, odd ? DDP_MAX : DDP_SUM, c); break;
    case MM_KIND:   /* the same bytes on the wire: 1000 floats reduced, or 1000/p gathered */
        r = odd ? ddp_all_gather(buf, out, 1000 / (size_t)p, DDP_FLOAT32, c) : ddp_all_reduce(buf, buf, 1000, DDP_FLOAT32, DDP_SUM, c);
        break;
    case MM_ROOT:
        /* Each root only sends: the broadcast itself may "succeed"; the next call must not. */
        r = ddp_broadcast(buf, buf, 1000, DDP_FLOAT32, odd ? p - 1 : 0, c);
        if (r == DDP_SUCCESS) r = ddp_barrier(c);
        break;
    case MM_ZERO:
        r = ddp_all_reduce(buf, buf, rank == 0 ? 0 : 1000, DDP_FLOAT32, DDP_SUM, c);
        break;
    case MM_ALGO: {   /* 4 bytes vs 400 KB: recursive doubling on one side, the ring on the other */
        float *big = (float *)calloc(100000, sizeof(float));
        r = ddp_all_reduce(big, big, odd ? 1 : 100000, DDP_FLOAT32, DDP_SUM, c);
        free(big);
        break;
    }
    }
    dt = t_now() - t0;
    S->rc[rank] = r;
    if (m->kind == MM_ZERO) {
        if (rank == 0) {
            ok(r == DDP_SUCCESS, "count 0 on this rank: nothing to do -> %s", ddp_strerror(r));
        } else {
            ok(r != DDP_SUCCESS, "count 1000 here, 0 on rank 0: an error, not a hang -> %s", ddp_strerror(r));
            ok(dt < 15, "... by the timeout of 3 s, with generous slack (%.3f s; a hang meets the watchdog)", dt);
        }
    } else {
        ok(r == DDP_ERR_MISMATCH || r == DDP_ERR_REMOTE, "%s -> %s", m->name, ddp_strerror(r));
        ok(dt < 10, "... promptly (%.3f s; timeout 20 s)", dt);
        if (r == DDP_ERR_MISMATCH) {   /* the peer it disagreed with, or the one that left over it */
            int q, named = 0;
            for (q = 0; q < p; q++) named |= q != rank && t_mentions_rank(ddp_comm_last_error(c), q);
            ok(named, "the message names a peer: %s", ddp_comm_last_error(c));
        }
        t0 = t_now();
        r2 = ddp_all_reduce(buf, buf, 10, DDP_FLOAT32, DDP_SUM, c);
        ok(r2 != DDP_SUCCESS && t_now() - t0 < 10, "use after the failed collective -> %s at once (%.3f s, timeout 20 s)",
           ddp_strerror(r2), t_now() - t0);
        ok(r2 == r || r2 == DDP_ERR_INVALID_USAGE, "... the same error again (sticky) or INVALID_USAGE");
    }
    t0 = t_now();
    ok(ddp_comm_destroy(c) == DDP_SUCCESS && t_now() - t0 < 10, "destroy (%.3f s)", t_now() - t0);
    free(buf);
    free(out);
    return 0;
}

static void run_mismatch(int p, int kind, const char *name) {
    mm_arg_t m;
    int r, nmm = 0;
    m.kind = kind;
    m.name = name;
    S = (fail_shm_t *)t_shm_user(sizeof *S);
    if (!t_selected(name)) return;
    diag("--- %s (p = %d)", name, p);
    r = t_run_ranks(p, mismatch, &m, 60);
    ok(r == 0, "%s: every rank exited cleanly (%.1f s)", name, t_last_run.seconds);
    if (kind == MM_ZERO) return;
    for (r = 0; r < p; r++) nmm += S->rc[r] == DDP_ERR_MISMATCH;
    ok(nmm >= 1, "%s: at least one rank says DDP_ERR_MISMATCH (%d do)", name, nmm);
}

/* ----------------------------------------------------------------- strangers */
static int raw_connect_addr(const struct sockaddr *sa, socklen_t len) {
    int fd = socket(sa->sa_family, SOCK_STREAM, 0);
    if (fd < 0) return -1;
    if (connect(fd, sa, len) != 0) { close(fd); return -1; }
    return fd;
}
static int raw_connect_port(int port) {
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    return raw_connect_addr((struct sockaddr *)&a, sizeof a);
}

static int strangers(int idx, int nproc, void *arg) {
    const int p = nproc - 1;
    unsigned char junk[512];
    int i;
    (void)arg;
    for (i = 0; i < (int)sizeof junk; i++) junk[i] = (unsigned char)(i * 131 + 7);
    if (idx == p) {   /* the stranger */
        int fd = -1;
        double t0 = t_now();
        while (fd < 0 && t_now() - t0 < 20) { fd = raw_connect_port(t_master_port); if (fd < 0) t_sleep_ms(10); }
        ok(fd >= 0 && send(fd, junk, sizeof junk, MSG_NOSIGNAL) == (ssize_t)sizeof junk && t_closed_within(fd, 20000),
           "garbage sent to the master port during rendezvous: the connection is dropped");
        if (fd >= 0) close(fd);
        {   /* Rank 1's transport address is in the store (no job secret): knock on it too. */
            ddp_store_t *s = NULL;
            ddp_store_desc_t d;
            struct sockaddr_storage ss;
            size_t len = 0;
            memset(&d, 0, sizeof d);
            d.timeout_ms = 10000;
            d.log_level = 1;
            if (ddp_store_open(&s, "127.0.0.1", t_master_port, 0, &d) == DDP_SUCCESS &&
                ddp_store_get(s, "ddp/addr/tcp/1", &ss, sizeof ss, &len) == DDP_SUCCESS) {
                int sent;
                ddp_store_close(s);
                s = NULL;
                fd = raw_connect_addr((struct sockaddr *)&ss, (socklen_t)len);
                sent = fd >= 0 && send(fd, junk, sizeof junk, MSG_NOSIGNAL) == (ssize_t)sizeof junk;
                /* Rank 1 only accepts once everyone joined: let the last rank start now. */
                __atomic_store_n(&S->flag[0], 1, __ATOMIC_SEQ_CST);
                ok(sent && t_closed_within(fd, 20000),
                   "garbage sent to rank 1's transport listener before it accepts: the connection is dropped");
                if (fd >= 0) close(fd);
            } else {
                ok(0, "the stranger could not read rank 1's transport address from the store");
            }
            if (s) ddp_store_close(s);
        }
        __atomic_store_n(&S->flag[0], 1, __ATOMIC_SEQ_CST);
        return 0;
    }
    {
        ddp_comm_t *c;
        float v[100];
        ddp_result_t r;
        int good;
        /* The last rank starts late, so that the others sit in the rendezvous with their
         * transport listeners open while the stranger knocks. */
        if (idx == p - 1) { double t0 = t_now(); while (!__atomic_load_n(&S->flag[0], __ATOMIC_SEQ_CST) && t_now() - t0 < 20) t_sleep_ms(10); }
        c = init_comm(idx, p, 20000, 1);
        if (!c) return 1;
        for (i = 0; i < 100; i++) v[i] = (float)idx;
        r = ddp_all_reduce(v, v, 100, DDP_FLOAT32, DDP_SUM, c);
        good = r == DDP_SUCCESS;
        for (i = 0; i < 100 && good; i++) good = v[i] == (float)(p * (p - 1) / 2);
        ok(good, "with strangers around, init and all_reduce still work (%s)", ddp_strerror(r));
        ddp_comm_destroy(c);
    }
    return 0;
}

/* ----------------------------------------------------------------- the environment */
static const char *const rank_vars[] = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
    "MASTER_PORT", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
    "OMPI_COMM_WORLD_LOCAL_SIZE", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS", "SLURM_PROCID",
    "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE", "DDP_TIMEOUT_MS", "DDP_TRANSPORT", "DDP_JOB_SECRET"};

static void clear_env(void) {
    size_t i;
    for (i = 0; i < sizeof rank_vars / sizeof rank_vars[0]; i++) unsetenv(rank_vars[i]);
    setenv("DDP_DEBUG", "NONE", 1);   /* these failures are expected */
}

/* "NAME=value NAME=value": sets them on a clean environment. */
static void set_env(const char *spec) {
    char buf[512], *tok, *save = NULL;
    clear_env();
    snprintf(buf, sizeof buf, "%s", spec);
    for (tok = strtok_r(buf, " ", &save); tok; tok = strtok_r(NULL, " ", &save)) {
        char *eq = strchr(tok, '=');
        if (!eq) continue;
        *eq = 0;
        setenv(tok, eq + 1, 1);
    }
}

/* ddp_comm_init_env with stderr caught: what it logged, in log. */
static ddp_result_t init_env_log(ddp_comm_t **c, char *log, size_t cap) {
    char path[512];
    int saved = dup(2), fd;
    ssize_t n = 0;
    ddp_result_t r = DDP_ERR_SYSTEM;
    snprintf(path, sizeof path, "%s/ddp_test_initlog.%d", t_tmpdir(), (int)getpid());
    fd = open(path, O_CREAT | O_TRUNC | O_RDWR, 0600);
    if (fd >= 0 && saved >= 0) {
        dup2(fd, 2);
        r = ddp_comm_init_env(c, NULL);
        dup2(saved, 2);
        n = pread(fd, log, cap - 1, 0);
    }
    log[n > 0 ? n : 0] = 0;
    if (fd >= 0) close(fd);
    if (saved >= 0) close(saved);
    remove(path);
    return r;
}

static int env_cases(int rank, int p, void *arg) {
    static const struct { const char *env; const char *names; } bad[] = {
        {"RANK=0", "WORLD_SIZE"},
        {"WORLD_SIZE=2", "RANK"},
        {"RANK=x WORLD_SIZE=2", "RANK"},
        {"RANK=-1 WORLD_SIZE=2", "RANK"},
        {"RANK=1_ WORLD_SIZE=2", "RANK"},
        {"RANK=0 WORLD_SIZE=0", "WORLD_SIZE"},
        {"RANK=0 WORLD_SIZE=two", "WORLD_SIZE"},
        {"RANK=0 WORLD_SIZE=99999999999999999999", "WORLD_SIZE"},
        {"RANK=2 WORLD_SIZE=2", "RANK"},
        {"RANK=0 WORLD_SIZE=1 MASTER_PORT=abc", "MASTER_PORT"},
        {"RANK=0 WORLD_SIZE=1 MASTER_PORT=70000", "MASTER_PORT"},
        {"RANK=0 WORLD_SIZE=1 MASTER_PORT=0", "MASTER_PORT"},
        {"RANK=0 WORLD_SIZE=1 MASTER_PORT=", "MASTER_PORT"},
        {"RANK=0 WORLD_SIZE=1 DDP_TIMEOUT_MS=soon", "DDP_TIMEOUT_MS"},
        {"OMPI_COMM_WORLD_RANK=x OMPI_COMM_WORLD_SIZE=2", "OMPI_COMM_WORLD_RANK"},
        {"SLURM_PROCID=3 SLURM_NTASKS=2", "SLURM_PROCID"},
        {"PMI_RANK=0", "PMI_SIZE"},
    };
    size_t i;
    char port[16];
    ddp_comm_t *c = NULL;
    ddp_result_t r;
    (void)rank; (void)p; (void)arg;
    for (i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        double t0;
        set_env(bad[i].env);
        c = NULL;
        t0 = t_now();
        r = ddp_comm_init_env(&c, NULL);
        ok(r == DDP_ERR_INVALID_ARGUMENT && c == NULL && t_now() - t0 < 30, "ddp_comm_init_env with {%s} -> %s at once "
           "(%.3f s: no rendezvous tried)", bad[i].env, ddp_strerror(r), t_now() - t0);
        ok(strstr(ddp_last_init_error(), bad[i].names) != NULL, "... and ddp_last_init_error names %s: %s", bad[i].names, ddp_last_init_error());
        if (c) ddp_comm_destroy(c);
    }
    {   /* Before the rank is known a message says "init", not a rank of -1; a WARN line carries
         * the time (UTC, ISO 8601); an unknown DDP_DEBUG is a WARN naming the accepted values. */
        char log[2048];
        int y, mo, dd, h, mi, sec, ms;
        char z = 0;
        set_env("RANK=x WORLD_SIZE=2");
        setenv("DDP_DEBUG", "WARN", 1);
        c = NULL;
        init_env_log(&c, log, sizeof log);
        ok(strncmp(log, "[ddp init] ", 11) == 0 && strstr(log, " WARN init: RANK='x'") && !strstr(log, "rank -1"),
           "a message before the rank is known begins '[ddp init]': %s", log);
        ok(sscanf(log, "[ddp init] %4d-%2d-%2dT%2d:%2d:%2d.%3d%c WARN", &y, &mo, &dd, &h, &mi, &sec, &ms, &z) == 8 &&
           z == 'Z' && y >= 2024 && mo >= 1 && mo <= 12, "a WARN line carries the UTC time to the millisecond: %.60s", log);
        set_env("");
        setenv("DDP_DEBUG", "bogus", 1);
        c = NULL;
        init_env_log(&c, log, sizeof log);
        ok(c != NULL && strstr(log, "WARN DDP_DEBUG='bogus' is not a level: NONE, WARN, INFO, TRACE or VERSION"),
           "DDP_DEBUG=bogus: a WARN names the accepted values: %s", log);
        if (c) ddp_comm_destroy(c);
        clear_env();
    }
    ok(ddp_comm_init_env(NULL, NULL) == DDP_ERR_INVALID_ARGUMENT, "ddp_comm_init_env(NULL comm out)");
    /* No launcher at all: a world of one (issue 16), its store on a port the kernel picks. */
    set_env("");
    c = NULL;
    r = ddp_comm_init_env(&c, NULL);
    ok(r == DDP_SUCCESS && ddp_comm_size(c) == 1 && ddp_comm_rank(c) == 0, "ddp_comm_init_env with {} -> "
       "%s: a world of one (%s)", ddp_strerror(r), r ? ddp_last_init_error() : "rank 0 of 1");
    if (c) ddp_comm_destroy(c);
    snprintf(port, sizeof port, "%d", t_free_port());
    {
        static const char *const good[] = {
            "RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=",
            "OMPI_COMM_WORLD_RANK=0 OMPI_COMM_WORLD_SIZE=1 OMPI_COMM_WORLD_LOCAL_RANK=0 MASTER_PORT=",
            "PMI_RANK=0 PMI_SIZE=1 MASTER_PORT=",
            "SLURM_PROCID=0 SLURM_NTASKS=1 SLURM_LOCALID=0 MASTER_PORT=",
        };
        for (i = 0; i < 4; i++) {
            char spec[256];
            snprintf(spec, sizeof spec, "%s%s", good[i], port);
            set_env(spec);
            c = NULL;
            r = ddp_comm_init_env(&c, NULL);
            ok(r == DDP_SUCCESS && c && ddp_comm_rank(c) == 0 && ddp_comm_size(c) == 1 && ddp_comm_local_rank(c) == 0,
               "ddp_comm_init_env with {%s} -> %s (%s)", spec, ddp_strerror(r), r ? ddp_last_init_error() : "rank 0 of 1");
            if (c) ddp_comm_destroy(c);
        }
    }
    clear_env();
    return 0;
}

/* Real ranks started the torchrun way: everything from the environment, desc NULL. */
static int env_ranks(int rank, int p, void *arg) {
    char v[32];
    ddp_comm_t *c = NULL;
    ddp_result_t r;
    int64_t x[16];
    int i, good;
    (void)arg;
    clear_env();
    unsetenv("DDP_DEBUG");
    snprintf(v, sizeof v, "%d", rank); setenv("RANK", v, 1);
    snprintf(v, sizeof v, "%d", p); setenv("WORLD_SIZE", v, 1);
    snprintf(v, sizeof v, "%d", p - 1 - rank); setenv("LOCAL_RANK", v, 1);
    snprintf(v, sizeof v, "%d", t_master_port); setenv("MASTER_PORT", v, 1);
    setenv("MASTER_ADDR", "127.0.0.1", 1);
    setenv("DDP_TIMEOUT_MS", "20000", 1);
    r = ddp_comm_init_env(&c, NULL);
    if (!ok(r == DDP_SUCCESS, "ddp_comm_init_env(NULL desc) from RANK/WORLD_SIZE/MASTER_* -> %s %s", ddp_strerror(r),
            r ? ddp_last_init_error() : ""))
        return 1;
    ok(ddp_comm_rank(c) == rank && ddp_comm_size(c) == p && ddp_comm_local_rank(c) == p - 1 - rank,
       "rank %d, size %d, LOCAL_RANK honoured (%d)", ddp_comm_rank(c), ddp_comm_size(c), ddp_comm_local_rank(c));
    ok(ddp_comm_timeout_ms(c) == 20000, "DDP_TIMEOUT_MS honoured (%d)", ddp_comm_timeout_ms(c));
    for (i = 0; i < 16; i++) x[i] = rank;
    r = ddp_all_reduce(x, x, 16, DDP_INT64, DDP_SUM, c);
    for (i = 0, good = r == DDP_SUCCESS; i < 16 && good; i++) good = x[i] == (int64_t)p * (p - 1) / 2;
    ok(good, "all_reduce on it works");
    ddp_comm_destroy(c);
    return 0;
}

/* ----------------------------------------------------------------- main */
static int run(const char *name, int p, int (*fn)(int, int, void *), void *arg, int timeout_s) {
    int bad;
    S = (fail_shm_t *)t_shm_user(sizeof *S);
    if (!t_selected(name)) return 0;
    diag("--- %s (%d processes)", name, p);
    bad = t_run_ranks(p, fn, arg, timeout_s);
    ok(bad == 0, "%s: every process exited cleanly (%.1f s)", name, t_last_run.seconds);
    return 1;
}

int main(void) {
    int missing;
    t_init();
    run("bad arguments", 2, bad_args, NULL, 60);
    run("calls on a destroyed communicator", 2, destroyed, NULL, 60);
    run_killed(4, 2);
    run_killed(4, 0);
    /* the algorithms for several hosts: a rank inside a host, one across */
    run_killed_with(4, 1, "hier_ring", "a,a,b,b");
    run_killed_with(5, 3, "hier_rabenseifner", "a,a,b,b,b");
    run_killed_with(5, 4, "rabenseifner", NULL);
    run("a silent rank (alive, never calls the collective)", 3, silent, NULL, 120);
    run("a rank that destroys its communicator after 2 calls, the other makes 3", 2, leaves_early, NULL, 60);
    run("the log to the trainer's function, or to DDP_DEBUG_FILE", 1, log_routes, NULL, 60);
    if (!getenv("DDP_TEST_QUICK")) run("a collective waiting 10 s names the rank it waits for", 2, late_rank_named, NULL, 120);
    missing = 2;
    run("rank 2 never joins", 3, never_joins, &missing, 60);
    missing = 0;
    run("rank 0 (the master) never starts", 2, never_joins, &missing, 60);
    if (!getenv("DDP_TEST_QUICK")) {
        run("a rank missing for 10 s is named while the others wait", 3, never_joins_speaks, NULL, 60);
        run("a wrong MASTER_PORT: the connecting rank says what it tries", 1, wrong_port_speaks, NULL, 60);
    }
    run_stopped_master(0);
    run_stopped_master(1);
    run("a master address that does not resolve", 1, unresolvable, NULL, 60);
    run("rank 0 out of descriptors (RLIMIT_NOFILE 12)", 8, rank0_few_fds, NULL, 120);
    if (run("world size disagreement", 2, world_size, NULL, 60)) {
        int r, nmm = 0;
        for (r = 0; r < 2; r++) nmm += S->rc[r] == DDP_ERR_MISMATCH;
        ok(nmm >= 1, "world size disagreement: at least one rank says DDP_ERR_MISMATCH");
    }
    if (run("two processes given the same rank", 3, same_rank, NULL, 60)) {
        ok(S->twice == 1, "exactly one of the two processes given rank 1 is told it joined twice (%d)", S->twice);
        ok(!(S->rc[1] == DDP_SUCCESS && S->rc[2] == DDP_SUCCESS), "not both of them got a communicator");
    }
    run_mismatch(2, MM_COUNT, "all_reduce counts 1000 vs 1001");
    run_mismatch(3, MM_COUNT, "all_reduce counts 1000 vs 1001");
    run_mismatch(2, MM_DTYPE, "all_reduce float32 vs int32 (same size)");
    run_mismatch(2, MM_OP, "all_reduce sum vs max");
    run_mismatch(2, MM_KIND, "all_reduce vs all_gather of the same bytes");
    run_mismatch(2, MM_ROOT, "broadcast roots 0 vs 1, then barrier");
    run_mismatch(2, MM_ZERO, "all_reduce count 0 on one rank, 1000 on the other");
    run_mismatch(3, MM_ALGO, "all_reduce counts that pick different algorithms (1 vs 100000 floats)");
    run("strangers on the master port and a transport port", 4, strangers, NULL, 90);
    run("ddp_comm_init_env: missing and malformed variables", 1, env_cases, NULL, 60);
    run("ddp_comm_init_env: 3 ranks from the environment", 3, env_ranks, NULL, 60);
    return t_done();
}
