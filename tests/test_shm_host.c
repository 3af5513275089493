/* SPDX-License-Identifier: MIT (see LICENSE) */
/* tests/test_shm_host.c — the shared-memory transport's host region: the ranks of a host join
 * one region (one handshake each with the host's lowest rank, the leader) instead of
 * connecting every pair, and every way that can fail is named. Prints TAP.
 *
 *   build/test_shm_host       (DDP_TEST_ONLY=<scenario name> runs one)
 *
 * This file renames connect() and syscall() before it compiles libddp, so that a rank can die
 * (or wait) at an exact step of the join: its first connect to a shm socket is its JOIN hello,
 * the leader's first memfd_create is the host region.
 *   join           p = 2, 5, 16: the leader logs "host region: p members joined", each other
 *                  rank joined it once, the pairs connected are the ring's and recursive
 *                  doubling's only (not p(p-1)/2), and all-reduces are exact.
 *   died-in-join   rank 2 of 4 dies (SIGKILL) as it would say its JOIN hello: every survivor's
 *                  init fails with DDP_ERR_REMOTE naming rank 2 and the join (not a timeout).
 *   leader-in-join rank 0 of 4 dies as it makes the host region: the members' inits fail with
 *                  DDP_ERR_REMOTE naming rank 0 and the join.
 *   killed         after the join, a member (rank 2 of 5) and the leader (rank 0 of 4) are
 *                  SIGKILLed in an all-reduce loop: every survivor gets DDP_ERR_REMOTE naming
 *                  the rank and the phase, and the communicator stays failed.
 *   stranger       a same-user process that knows the communicator id (from the store) but
 *                  not its key says a JOIN hello to the leader as rank 2, whose join waits
 *                  meanwhile: the leader challenges it without a memfd, closes it after its
 *                  wrong proof, still without one; then rank 2 joins and the job works. */
#define _GNU_SOURCE
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/un.h>
#include <stdarg.h>
#include <string.h>
#include <unistd.h>

enum { HOOK_NONE, HOOK_DIE_AT_JOIN, HOOK_DIE_AT_REGION, HOOK_WAIT_AT_JOIN };
static int hook;                       /* what this process does at the step */
static volatile int *hook_flag;        /* HOOK_WAIT_AT_JOIN: go on once it is set */
static int hook_connect(int fd, const struct sockaddr *sa, socklen_t len);
static long hook_syscall(long nr, ...);
#define connect hook_connect
#define syscall hook_syscall
#define DDP_IMPLEMENTATION
#include "ddp.h"
#include "transports/ddp_tcp.h"
#include "transports/ddp_shm.h"
#undef connect
#undef syscall
#include "tests/ddp_test.h"

/* A connect to a shm socket (abstract name "ddp-shm.*"): the first one of a rank is its JOIN. */
static int hook_connect(int fd, const struct sockaddr *sa, socklen_t len) {
    const struct sockaddr_un *un = (const struct sockaddr_un *)(const void *)sa;
    if (hook != HOOK_NONE && sa->sa_family == AF_UNIX && !strncmp(un->sun_path + 1, "ddp-shm.", 8)) {
        if (hook == HOOK_DIE_AT_JOIN) raise(SIGKILL);
        if (hook == HOOK_WAIT_AT_JOIN) {
            double t0 = t_now();
            while (!__atomic_load_n(hook_flag, __ATOMIC_SEQ_CST) && t_now() - t0 < 60) t_sleep_ms(2);
        }
        hook = HOOK_NONE;
    }
    return connect(fd, sa, len);
}

/* The calls libddp makes through syscall(): memfd_create (2 arguments) and pidfd_open (2). */
static long hook_syscall(long nr, ...) {
    va_list ap;
    long a, b;
    va_start(ap, nr);
    a = va_arg(ap, long);
    b = va_arg(ap, long);
    va_end(ap);
    if (nr == SYS_memfd_create && hook == HOOK_DIE_AT_REGION) raise(SIGKILL);
    return syscall(nr, a, b);
}

typedef struct {
    int joined_line[T_MAX_RANKS];      /* the leader: N in "host region: N members joined" */
    int member_line[T_MAX_RANKS];      /* "joined the host region of rank 0" lines */
    int pairs[T_MAX_RANKS];            /* "connected to rank" lines */
    int flag;
    double t_kill;
    int noted[T_MAX_RANKS];            /* the first "no progress for" note of each rank */
    char note[T_MAX_RANKS][400];
} host_shared_t;
static host_shared_t *S;
static int store_port;                 /* > 0: the ranks use the store a process of its own serves */
static ddp_store_t *store_client;      /* this rank's handle of it (closed after the communicator) */

static void count_lines(void *user, ddp_log_level_t level, int rank, const char *msg) {
    const char *s;
    (void)user;
    (void)level;
    if (rank < 0 || rank >= T_MAX_RANKS) return;
    if ((s = strstr(msg, "host region: ")) != NULL) S->joined_line[rank] = atoi(s + 13);
    if (strstr(msg, "joined the host region of rank 0")) S->member_line[rank]++;
    if (strstr(msg, "connected to rank")) S->pairs[rank]++;
    if (level == DDP_LOG_WARN && strstr(msg, "no progress for") && !S->noted[rank]) {
        snprintf(S->note[rank], sizeof S->note[rank], "%s", msg);
        __atomic_store_n(&S->noted[rank], 1, __ATOMIC_RELEASE);
        if (rank == 0) __atomic_store_n(&S->flag, 1, __ATOMIC_SEQ_CST);   /* slow-join: rank 2 goes on */
    }
}

static ddp_result_t init(int rank, int p, int timeout_ms, ddp_comm_t **c) {
    ddp_comm_desc_t d;
    t_desc(&d, timeout_ms);
    d.transport = "shm";
    d.log_level = DDP_LOG_INFO + 1;
    d.log_fn = count_lines;
    *c = NULL;
    if (store_port > 0) {   /* rank 0 may die: the store must not die with it */
        if (t_store_client(&store_client, store_port) != DDP_SUCCESS) return DDP_ERR_SYSTEM;
        d.store = store_client;
    }
    t_where("ddp_comm_init");
    return ddp_comm_init(c, p, rank, &d);
}

static int all_reduce_exact(ddp_comm_t *c, int rank, int p, size_t n, const char *what) {
    float *v = (float *)malloc(n * sizeof *v);
    size_t i;
    int good = v != NULL;
    ddp_result_t r = DDP_ERR_OUT_OF_MEMORY;
    for (i = 0; v && i < n; i++) v[i] = (float)(rank + 1 + (int)(i % 7));
    t_where("all_reduce");
    if (v) r = ddp_all_reduce(v, v, n, DDP_FLOAT32, DDP_SUM, c);
    for (i = 0; v && r == DDP_SUCCESS && i < n; i++)
        if (v[i] != (float)(p * (p + 1) / 2 + p * (int)(i % 7))) good = 0;
    free(v);
    return ok(r == DDP_SUCCESS && good, "%s: rank %d's all-reduce of %zu floats is exact (%s %s)", what, rank, n,
              ddp_strerror(r), r ? ddp_comm_last_error(c) : "");
}

/* ----------------------------------------------------------------- join */
static int join_rank(int rank, int p, void *arg) {
    ddp_comm_t *c;
    ddp_result_t r;
    (void)arg;
    setenv("DDP_SHM_CHUNK", "65536", 1);   /* 16 ranks map 16 slots each */
    r = init(rank, p, 20000, &c);
    if (!ok(r == DDP_SUCCESS, "join: rank %d of %d initialises (%s %s)", rank, p, ddp_strerror(r),
            r ? ddp_last_init_error() : ""))
        return 1;
    all_reduce_exact(c, rank, p, 1000, "join");
    all_reduce_exact(c, rank, p, 100000, "join");
    ok(ddp_barrier(c) == DDP_SUCCESS, "join: rank %d: barrier", rank);
    ddp_comm_destroy(c);
    return 0;
}

/* The ring's and recursive doubling's partners of rank r (what init connects), deduplicated. */
static int partners(int r, int p) {
    int list[40], n = 0, p2 = 1, k, j, m, seen;
    list[n++] = (r + 1) % p;
    list[n++] = (r + p - 1) % p;
    while (p2 * 2 <= p) p2 *= 2;
    if (r >= p2) list[n++] = r - p2;
    else {
        if (r + p2 < p) list[n++] = r + p2;
        for (k = 1; k < p2; k <<= 1) list[n++] = r ^ k;
    }
    for (k = 0, j = 0; k < n; k++) {
        for (seen = 0, m = 0; m < j; m++) if (list[m] == list[k]) seen = 1;
        if (!seen && list[k] != r) list[j++] = list[k];
    }
    return j;
}

static void run_join(int p) {
    int r, members = 0, pairs = 0, want = 0;
    S = (host_shared_t *)t_shm_user(sizeof *S);
    diag("--- join: %d ranks on this host", p);
    ok(t_run_ranks(p, join_rank, NULL, 120) == 0, "join: %d ranks exit 0", p);
    for (r = 0; r < p; r++) {
        members += S->member_line[r] == 1;
        pairs += S->pairs[r];
        want += partners(r, p);
    }
    ok(S->joined_line[0] == p, "join: rank 0 logs \"host region: %d members joined\" (it logged %d)", p,
       S->joined_line[0]);
    ok(members == p - 1 && S->member_line[0] == 0, "join: each of the %d other ranks joined it once (%d did)", p - 1,
       members);
    ok(pairs == want, "join: %d pair connections logged, the ring's and recursive doubling's (%d), not every "
       "pair's (%d)", pairs, want, p * (p - 1));
}

/* ----------------------------------------------------------------- a join that lasts speaks */
static int slow_join_rank(int rank, int p, void *arg) {
    ddp_comm_t *c;
    ddp_result_t r;
    (void)arg;
    if (rank == 2) {            /* holds its JOIN back until the leader said it waits for it */
        hook = HOOK_WAIT_AT_JOIN;
        hook_flag = &S->flag;
    }
    r = init(rank, p, 90000, &c);
    if (!ok(r == DDP_SUCCESS, "slow-join: rank %d initialises (%s %s)", rank, ddp_strerror(r),
            r ? ddp_last_init_error() : ""))
        return 1;
    all_reduce_exact(c, rank, p, 1000, "slow-join");
    ddp_comm_destroy(c);
    return 0;
}

static void run_slow_join(void) {
    S = (host_shared_t *)t_shm_user(sizeof *S);
    diag("--- slow-join: rank 2 of 3 comes to the join only once the leader said it waits for it (>= 10 s)");
    ok(t_run_ranks(3, slow_join_rank, NULL, 180) == 0, "slow-join: every rank exited 0");
    ok(S->noted[0] && strstr(S->note[0], "phase join") && strstr(S->note[0], "waiting for rank 2 to join"),
       "slow-join: the leader's wait said what it waits for: '%s'", S->noted[0] ? S->note[0] : "(nothing)");
}

/* ----------------------------------------------------------------- died in the join */
static int died_rank(int rank, int p, void *arg) {
    const int victim = *(const int *)arg;
    ddp_comm_t *c;
    ddp_result_t r;
    if (rank == victim) hook = victim == 0 ? HOOK_DIE_AT_REGION : HOOK_DIE_AT_JOIN;
    r = init(rank, p, 30000, &c);
    if (rank == victim) return 1;   /* not reached */
    ok(r == DDP_ERR_REMOTE, "%s: survivor rank %d: init -> %s (not a timeout)", victim ? "died-in-join" : "leader-in-join",
       rank, ddp_strerror(r));
    ok(t_mentions_rank(ddp_last_init_error(), victim) && strstr(ddp_last_init_error(), "join"),
       "... naming rank %d and the join: %s", victim, ddp_last_init_error());
    if (r == DDP_SUCCESS) ddp_comm_destroy(c);
    if (store_client) ddp_store_close(store_client);
    return 0;
}

static void run_died(int p, int victim) {
    int r, bad = 0, stop = -1;
    pid_t store = t_store_process(&store_port, &stop);
    if (!ok(store > 0 && store_port > 0, "the store (a process of its own, as ddprun's)")) return;
    S = (host_shared_t *)t_shm_user(sizeof *S);
    diag("--- rank %d of %d dies %s", victim, p, victim ? "as it would say its JOIN hello" : "as it makes the host region");
    t_run_ranks(p, died_rank, &victim, 120);
    ok(t_rank_signaled(victim, SIGKILL), "rank %d died of SIGKILL in the join", victim);
    for (r = 0; r < p; r++)
        if (r != victim && !(t_last_run.exited[r] && t_last_run.code[r] == 0)) bad++;
    ok(bad == 0, "every survivor returned (no hang, no crash)");
    close(stop);
    waitpid(store, NULL, 0);
    store_port = 0;
}

/* ----------------------------------------------------------------- killed after the join */
static volatile int started;
static void *killer(void *arg) {
    (void)arg;
    while (!__atomic_load_n(&started, __ATOMIC_SEQ_CST)) t_sleep_ms(1);
    t_sleep_ms(30);
    {
        double t = t_now();
        __atomic_store(&S->t_kill, &t, __ATOMIC_SEQ_CST);
    }
    raise(SIGKILL);
    return NULL;
}

static int killed_rank(int rank, int p, void *arg) {
    const int victim = *(const int *)arg;
    const size_t n = (size_t)4 << 20;
    ddp_comm_t *c;
    ddp_result_t r = DDP_SUCCESS;
    float *buf;
    int it;
    if (init(rank, p, 20000, &c) != DDP_SUCCESS) return 1;
    buf = (float *)calloc(n, sizeof *buf);
    if (!buf) return 1;
    if (rank == victim) {
        pthread_t th;
        pthread_create(&th, NULL, killer, NULL);
    }
    t_where("all_reduce loop");
    for (it = 0; it < 100000; it++) {
        r = ddp_all_reduce(buf, buf, n, DDP_FLOAT32, DDP_MAX, c);
        if (it == 0) __atomic_store_n(&started, 1, __ATOMIC_SEQ_CST);
        if (r != DDP_SUCCESS) break;
    }
    ok(r == DDP_ERR_REMOTE, "killed: survivor rank %d: all_reduce #%d -> %s", rank, it + 1, ddp_strerror(r));
    ok(t_mentions_rank(ddp_comm_last_error(c), victim) && strstr(ddp_comm_last_error(c), "phase"),
       "... naming rank %d and the phase: %s", victim, ddp_comm_last_error(c));
    ok(ddp_all_reduce(buf, buf, 4, DDP_FLOAT32, DDP_SUM, c) != DDP_SUCCESS, "... the communicator stays failed");
    ok(ddp_comm_destroy(c) == DDP_SUCCESS, "... destroy after the failure");
    free(buf);
    return 0;
}

static void run_killed(int p, int victim) {
    int r, bad = 0;
    S = (host_shared_t *)t_shm_user(sizeof *S);
    diag("--- rank %d of %d (%s) SIGKILLed in an all-reduce loop", victim, p, victim ? "a member" : "the leader");
    t_run_ranks(p, killed_rank, &victim, 120);
    ok(t_rank_signaled(victim, SIGKILL), "the victim died of SIGKILL mid-collective");
    for (r = 0; r < p; r++)
        if (r != victim && !(t_last_run.exited[r] && t_last_run.code[r] == 0)) bad++;
    ok(bad == 0, "every survivor returned (no hang, no crash)");
}

/* ----------------------------------------------------------------- a stranger's join */
static int stranger_rank(int idx, int nproc, void *arg) {
    const int p = nproc - 1;
    (void)arg;
    if (idx == p) {
        ddp_store_desc_t sd;
        ddp_store_t *s = NULL;
        _ddp_shm_addr_t a;
        _ddp_shm_hello_t h, ch;
        unsigned char ident[40];
        size_t len = 0, alen = 0;
        struct sockaddr_un sa;
        struct pollfd pfd;
        int fd = -1, got = -1, memfd = -1, given = 0, closed = 0;
        double t0;
        memset(&sd, 0, sizeof sd);
        sd.timeout_ms = 20000;
        sd.log_level = 1;
        sd.secret = "";
        if (!ok(ddp_store_open(&s, "127.0.0.1", t_master_port, 0, &sd) == DDP_SUCCESS &&
                ddp_store_get(s, "ddp/comm_id", ident, sizeof ident, &len) == DDP_SUCCESS && len == sizeof ident &&
                ddp_store_get(s, "ddp/addr/shm/0", &a, sizeof a, &alen) == DDP_SUCCESS && alen == sizeof a,
                "stranger: read the communicator id and the leader's shm socket from the store")) {
            __atomic_store_n(&S->flag, 1, __ATOMIC_SEQ_CST);
            if (s) ddp_store_close(s);
            return 1;
        }
        ddp_store_close(s);
        a.name[sizeof a.name - 1] = 0;
        memset(&sa, 0, sizeof sa);
        sa.sun_family = AF_UNIX;
        memcpy(sa.sun_path + 1, a.name, strlen(a.name));
        memset(&h, 0, sizeof h);
        h.magic = _DDP_SHM_MAGIC;
        h.version = _DDP_SHM_VERSION;
        memcpy(&h.comm_id, ident, 8);
        h.from = 2;
        h.to = 0;
        h.kind = _DDP_SHM_HELLO;
        h.purpose = _DDP_SHM_JOIN;
        memset(h.nonce, 0x33, sizeof h.nonce);
        fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        ok(fd >= 0 && connect(fd, (struct sockaddr *)&sa,
                              (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + strlen(a.name))) == 0 &&
           send(fd, &h, sizeof h, MSG_NOSIGNAL) == (ssize_t)sizeof h,
           "stranger: a JOIN hello sent to the leader as rank 2 (same user, right id)");
        pfd.fd = fd;
        pfd.events = POLLIN;
        pfd.revents = 0;
        if (fd >= 0 && poll(&pfd, 1, 20000) == 1) got = _ddp_shm_recv_hello(fd, &ch, &memfd);
        ok(got == 1 && ch.kind == _DDP_SHM_CHALLENGE && ch.status == 0 && memfd < 0,
           "stranger: the leader challenges it, and hands out no memfd with the challenge");
        if (memfd >= 0) close(memfd);
        memfd = -1;
        if (got == 1) {   /* a wrong proof */
            _ddp_shm_hello_t an = h;
            an.kind = _DDP_SHM_ANSWER;
            memset(an.proof, 0x44, sizeof an.proof);
            if (send(fd, &an, sizeof an, MSG_NOSIGNAL) != (ssize_t)sizeof an) closed = 1;
        }
        for (t0 = t_now(); !closed && t_now() - t0 < 20;) {
            pfd.fd = fd;
            pfd.events = POLLIN;
            pfd.revents = 0;
            if (poll(&pfd, 1, 1000) <= 0) continue;
            got = _ddp_shm_recv_hello(fd, &ch, &memfd);
            if (memfd >= 0) { given++; close(memfd); memfd = -1; }
            if (got < 0) closed = 1;
        }
        ok(closed && !given, "stranger: its wrong proof gets the connection closed, and no memfd");
        if (fd >= 0) close(fd);
        __atomic_store_n(&S->flag, 1, __ATOMIC_SEQ_CST);
        return 0;
    }
    {
        ddp_comm_t *c;
        ddp_result_t r;
        if (idx == 2) {
            hook = HOOK_WAIT_AT_JOIN;
            hook_flag = &S->flag;
        }
        r = init(idx, p, 30000, &c);
        if (!ok(r == DDP_SUCCESS, "stranger: rank %d initialises (%s %s)", idx, ddp_strerror(r),
                r ? ddp_last_init_error() : ""))
            return 1;
        all_reduce_exact(c, idx, p, 1000, "stranger");
        ddp_comm_destroy(c);
    }
    return 0;
}

int main(void) {
    static const int join_sizes[] = {2, 5, 16};
    size_t i;
    t_init();
    unsetenv("DDP_TRANSPORT");
    unsetenv("DDP_SHM_COLL");
    unsetenv("DDP_ALGO");
    if (t_selected("join"))
        for (i = 0; i < sizeof join_sizes / sizeof join_sizes[0]; i++) run_join(join_sizes[i]);
    if (t_selected("slow-join")) run_slow_join();
    if (t_selected("died-in-join")) run_died(4, 2);
    if (t_selected("leader-in-join")) run_died(4, 0);
    if (t_selected("killed")) {
        run_killed(5, 2);
        run_killed(4, 0);
    }
    if (t_selected("stranger")) {
        S = (host_shared_t *)t_shm_user(sizeof *S);
        diag("--- stranger: a same-user process with the communicator id but no key asks to join");
        ok(t_run_ranks(4, stranger_rank, NULL, 120) == 0, "stranger: every process exited 0");
    }
    return t_done();
}
