/* SPDX-License-Identifier: MIT (see LICENSE) */
/* tests/test_shrink.c — ddp_comm_shrink: the survivors of a lost rank agree on who is left and
 * go on with a new communicator (ddp_comm_shrink.h). TAP.
 *
 *   build/test_shrink          (DDP_TEST_ONLY=<scenario> runs one)
 *
 * Every forked scenario runs 4 ranks over tcp, then over shm, with the store served by this
 * test's own process (as a launcher would: no rank hosts it, so rank 0 may die too). Each
 * survivor writes what it got (new rank, size, parent ranks, removed ranks, generation) into
 * shared memory; the parent checks that every survivor got the same membership.
 *   first     rank 0 SIGKILLed between calls
 *   middle    rank 1 SIGKILLed during an async all-reduce (from its progress thread's hook)
 *   last      rank 3 SIGKILLed while the others are inside a group of two all-reduces
 *   two       ranks 1 and 3 SIGKILLed at once
 *   during    rank 3 SIGKILLed; then rank 1 dies inside the shrink, right after the agreement
 *             included it: the build fails, the shrink retries without it
 *   stopped   rank 2 SIGSTOPped past the timeout: the others shrink without it; once they run
 *             on the new communicator it is continued: its next call fails with
 *             DDP_ERR_REMOVED naming the generation and its call, so do its shrink and a send,
 *             and the new communicator's results stay exact (nothing of it gets in)
 *   late      rank 0 SIGKILLed; rank 3, alive, computes until the others' shrink returned
 *             (past its deadline), then calls ddp_comm_shrink itself: DDP_ERR_REMOVED (one
 *             decision: the late rank does not make a membership of its own), and so are its
 *             calls on the old communicator
 *   again     shrink after shrink: ranks 0, 3, then 2 die, one per generation; rank 1 goes on
 *             alone (generation 3, a world of one)
 *   threads   threads as ranks: thread rank 2 stops calling; the others shrink; its next call
 *             is DDP_ERR_REMOVED
 * After each shrink the survivors' collectives on the new communicator are checked exactly,
 * and the time from the kill to the first all-reduce done there is printed as a TAP comment. */
#define _GNU_SOURCE
#include "ddp.h"
#include "transports/ddp_tcp.h"
#include "transports/ddp_shm.h"
#include "transports/ddp_threads.h"
#include "tests/ddp_test.h"

#include <pthread.h>

#define NP 4
#define COUNT 4099                  /* odd: uneven ring chunks */
#define KILL_AT 5                   /* the victims die at this iteration */

typedef struct {
    int done;                       /* the survivor reached the end */
    int rc;                         /* ddp_comm_shrink's result */
    int newrank, newsize, gen, nremoved;
    int parent_of[NP];              /* ddp_comm_parent_rank of each new rank */
    int removed[NP];
    double t_first;                 /* the first all-reduce on the new communicator done */
} survivor_t;

typedef struct {
    double t_kill;                  /* set by the (first) victim just before it dies */
    int pid[NP];
    survivor_t s[NP];
    int shrunk;                     /* survivors whose ddp_comm_shrink returned */
    int fenced_done;                /* the stopped (or late) rank finished its checks */
    int fenced_ok;
    char fenced_msg[600];
} shared_t;

typedef struct {
    const char *name;
    unsigned victims;               /* bit r: rank r is killed (or stopped) at KILL_AT */
    int how;                        /* 0 between calls, 1 async all-reduce, 2 inside a group,
                                     * 3 SIGSTOP */
    int dies_in_shrink;             /* this rank dies right after the agreement included it */
    int timeout_ms;
    int late;                       /* this rank (alive) calls only after the others shrank */
} scenario_t;

static shared_t *S;
static const char *g_transport = "tcp";
static int g_store_port;

static float val(int prank, size_t i, int k) { return (float)((prank + 1) * (int)((i % 13) + 1) + k); }

/* Fills buf with this rank's values (its rank in the first communicator) for step k; checks an
 * all-reduced buf against the sum over members[0..n). */
static void fill(float *buf, int prank, int k) { size_t i; for (i = 0; i < COUNT; i++) buf[i] = val(prank, i, k); }
static int exact(const float *buf, const int *members, int n, int k) {
    size_t i;
    int j;
    for (i = 0; i < COUNT; i++) {
        float want = 0;
        for (j = 0; j < n; j++) want += val(members[j], i, k);
        if (buf[i] != want) return 0;
    }
    return 1;
}

/* ---- the victim's ways to die */
static int g_hook_fd[2];
static void hook_before(void *arg) {
    char b = 1;
    (void)arg;
    if (write(g_hook_fd[1], &b, 1) != 1) _exit(3);
}

/* rank dies_in_shrink: its log names the agreement, which included it: it dies there. */
static void die_in_shrink_log(void *user, ddp_log_level_t level, int rank, const char *msg) {
    (void)user; (void)level; (void)rank;
    if (strstr(msg, "shrink 1 attempt 0: members")) raise(SIGKILL);
}

static ddp_comm_t *open_comm(int rank, const scenario_t *sc, ddp_store_t **st) {
    ddp_comm_desc_t d;
    ddp_comm_t *c = NULL;
    ddp_result_t r;
    if (t_store_client(st, g_store_port) != DDP_SUCCESS) {
        ok(0, "rank %d: store client", rank);
        return NULL;
    }
    t_desc(&d, sc->timeout_ms);
    d.store = *st;
    d.store_prefix = "shrinktest";
    d.transport = g_transport;
    d.log_level = 1;                                    /* quiet: failures are expected */
    if (sc->dies_in_shrink == rank) { d.log_level = DDP_LOG_INFO + 1; d.log_fn = die_in_shrink_log; }
    t_where("ddp_comm_init");
    r = ddp_comm_init(&c, NP, rank, &d);
    if (!ok(r == DDP_SUCCESS, "[%s] init rank %d -> %s %s", g_transport, rank, ddp_strerror(r),
            r ? ddp_last_init_error() : ""))
        return NULL;
    return c;
}

/* One training step: an all-reduce (or, how 2, a group of two). */
static ddp_result_t step(ddp_comm_t *c, float *a, float *b, int prank, int k, int how, const int *members, int n) {
    ddp_result_t r;
    fill(a, prank, k);
    if (how == 2) {
        fill(b, prank, k + 100);
        ddp_group_start(c);
        ddp_all_reduce(a, a, COUNT, DDP_FLOAT32, DDP_SUM, c);
        ddp_all_reduce(b, b, COUNT, DDP_FLOAT32, DDP_SUM, c);
        r = ddp_group_end(c);
        if (r == DDP_SUCCESS && !exact(b, members, n, k + 100)) return DDP_ERR_INTERNAL;
    } else {
        r = ddp_all_reduce(a, a, COUNT, DDP_FLOAT32, DDP_SUM, c);
    }
    if (r == DDP_SUCCESS && !exact(a, members, n, k)) return DDP_ERR_INTERNAL;
    return r;
}

static void die(int how, ddp_comm_t *c, float *a, int rank) {
    if (how == 1) {
        ddp_async_hooks_t h;
        ddp_request_t q;
        char b;
        memset(&h, 0, sizeof h);
        h.before = hook_before;
        if (pipe(g_hook_fd) != 0) _exit(3);
        fill(a, rank, KILL_AT);
        ddp_all_reduce_async_hooked(a, a, COUNT, DDP_FLOAT32, DDP_SUM, c, &h, &q);
        if (read(g_hook_fd[0], &b, 1) != 1) _exit(3);   /* the progress thread is in the call */
    }
    S->t_kill = t_now();
    if (how == 3) { raise(SIGSTOP); return; }
    raise(SIGKILL);
}

/* The stopped rank, continued (or the late one): everything it tries on the old communicator
 * is refused. The late rank starts with ddp_comm_shrink, as a trainer dropping stopped ranks
 * would: it must find the others' decision, not make a membership of its own. */
static int fenced(ddp_comm_t *c, float *a, int rank, int shrink_first) {
    ddp_result_t r, r2, r3, r4;
    ddp_comm_t *nc = NULL;
    const char *e;
    int good, call = shrink_first ? KILL_AT : KILL_AT + 1;
    fill(a, rank, KILL_AT);
    r = shrink_first ? ddp_comm_shrink(c, NULL, &nc) : ddp_all_reduce(a, a, COUNT, DDP_FLOAT32, DDP_SUM, c);
    e = ddp_comm_last_error(c);
    snprintf(S->fenced_msg, sizeof S->fenced_msg, "%s", e);
    good = ok(r == DDP_ERR_REMOVED && nc == NULL, "[%s] the %s rank: its %s -> %s", g_transport,
              shrink_first ? "late" : "continued", shrink_first ? "ddp_comm_shrink" : "next call", ddp_strerror(r));
    good &= ok(strstr(e, "generation 1") && strstr(e, "call #") && t_mentions_int(e, call),
               "[%s] ... naming the generation and its call (#%d): %s", g_transport, call, e);
    r2 = ddp_all_reduce(a, a, COUNT, DDP_FLOAT32, DDP_SUM, c);
    r3 = ddp_send(a, 16, DDP_FLOAT32, 0, c);
    r4 = shrink_first ? ddp_all_reduce(a, a, COUNT, DDP_FLOAT32, DDP_SUM, c) : ddp_comm_shrink(c, NULL, &nc);
    good &= ok(r2 == DDP_ERR_REMOVED && r3 == DDP_ERR_REMOVED && r4 == DDP_ERR_REMOVED && nc == NULL,
               "[%s] ... and so do an all-reduce (%s), a send to rank 0 (%s) and %s (%s)",
               g_transport, ddp_strerror(r2), ddp_strerror(r3), shrink_first ? "another all-reduce" : "ddp_comm_shrink",
               ddp_strerror(r4));
    S->fenced_ok = good;
    __atomic_store_n(&S->fenced_done, 1, __ATOMIC_SEQ_CST);
    ok(ddp_comm_destroy(c) == DDP_SUCCESS, "[%s] the fenced rank destroys its communicator", g_transport);
    return 0;
}

/* Waits (bounded) until a counter other processes raise reaches n. */
static int wait_flag_n(const int *flag, int n, int ms) {
    double until = t_now() + ms / 1000.0;
    while (__atomic_load_n(flag, __ATOMIC_SEQ_CST) < n) {
        if (t_now() > until) return 0;
        t_sleep_ms(1);
    }
    return 1;
}
static int wait_flag(const int *flag, int ms) { return wait_flag_n(flag, 1, ms); }

static int rank_main(int rank, int p, void *arg) {
    const scenario_t *sc = (const scenario_t *)arg;
    ddp_store_t *st = NULL;
    ddp_comm_t *c, *nc = NULL;
    float *a = (float *)malloc(COUNT * sizeof(float)), *b = (float *)malloc(COUNT * sizeof(float));
    int all[NP], members[NP], n = 0, k, failed_at = -1, i;
    ddp_shrink_opts_t o;
    ddp_result_t r;
    survivor_t *me = &S->s[rank];
    double t0;
    (void)p;
    S->pid[rank] = (int)getpid();
    for (i = 0; i < NP; i++) all[i] = i;
    if (!(c = open_comm(rank, sc, &st))) return 1;
    for (k = 0; k < 40; k++) {
        if ((sc->victims >> rank & 1u) && k == KILL_AT) {
            die(sc->how, c, a, rank);
            k = fenced(c, a, rank, 0);          /* only a stopped rank gets here */
            goto out;
        }
        if (rank == sc->late && k == KILL_AT) {   /* computes until the others went on */
            int n_out = 0;
            for (i = 0; i < NP; i++) n_out += (sc->victims >> i & 1u) || i == sc->late;
            t_where("late: waiting for the others' shrink");
            if (!ok(wait_flag_n(&S->shrunk, NP - n_out, 60000), "[%s] rank %d: the others shrank", g_transport, rank))
                return 1;
            k = fenced(c, a, rank, 1);
            goto out;
        }
        t_where("step %d", k);
        r = step(c, a, b, rank, k, sc->how, all, NP);
        if (r != DDP_SUCCESS) { failed_at = k; break; }
    }
    ok(failed_at >= KILL_AT && failed_at <= KILL_AT + 1, "[%s] rank %d: step %d failed (%s): %s", g_transport,
       rank, failed_at, ddp_strerror(r), ddp_comm_last_error(c));
    t0 = t_now();
    memset(&o, 0, sizeof o);
    t_where("ddp_comm_shrink");
    r = ddp_comm_shrink(c, &o, &nc);
    me->rc = (int)r;
    __atomic_add_fetch(&S->shrunk, 1, __ATOMIC_SEQ_CST);
    if (!ok(r == DDP_SUCCESS && nc, "[%s] rank %d: ddp_comm_shrink -> %s in %.0f ms %s", g_transport, rank,
            ddp_strerror(r), (t_now() - t0) * 1e3, r ? ddp_comm_last_error(c) : ""))
        return 1;
    t0 = t_now();
    ok(ddp_comm_destroy(c) == DDP_SUCCESS && t_now() - t0 < 1.0, "[%s] rank %d: destroying the parent "
       "waits on nobody (%.0f ms)", g_transport, rank, (t_now() - t0) * 1e3);
    me->newrank = ddp_comm_rank(nc);
    me->newsize = n = ddp_comm_size(nc);
    me->gen = ddp_comm_generation(nc);
    for (i = 0; i < n && i < NP; i++) members[i] = me->parent_of[i] = ddp_comm_parent_rank(nc, i);
    me->nremoved = ddp_comm_removed_ranks(nc, me->removed, NP);
    /* the first step on the new communicator, then more: exact against the members' values */
    t_where("first step on the new communicator");
    r = step(nc, a, b, rank, 100, 0, members, n);
    me->t_first = t_now();
    ok(r == DDP_SUCCESS, "[%s] rank %d -> new rank %d of %d: first all-reduce exact (%s)", g_transport, rank,
       me->newrank, n, ddp_strerror(r));
    if (sc->how == 3 && me->newrank == 0) {
        for (i = 0; i < NP; i++) if (sc->victims >> i & 1u) kill(S->pid[i], SIGCONT);
    }
    if (sc->how == 3 || sc->late >= 0)
        ok(wait_flag(&S->fenced_done, 60000), "[%s] rank %d: the continued rank finished its tries", g_transport, rank);
    for (k = 101; k < 106; k++) {
        r = step(nc, a, b, rank, k, k & 1 ? 2 : 0, members, n);
        if (r != DDP_SUCCESS) break;
    }
    ok(r == DDP_SUCCESS, "[%s] rank %d: 5 more steps (all-reduces and groups) on the new communicator exact (%s) %s",
       g_transport, rank, ddp_strerror(r), r ? ddp_comm_last_error(nc) : "");
    {
        int x = me->newrank == 0 ? 4242 : 0;
        r = ddp_broadcast(&x, &x, 1, DDP_INT32, 0, nc);
        ok(r == DDP_SUCCESS && x == 4242, "[%s] rank %d: broadcast from new rank 0 (%s)", g_transport, rank, ddp_strerror(r));
    }
    ok(ddp_comm_destroy(nc) == DDP_SUCCESS, "[%s] rank %d: destroy the new communicator", g_transport, rank);
    me->done = 1;
    k = 0;
out:
    ddp_store_close(st);
    free(a);
    free(b);
    return k;
}

/* again: shrink after shrink down to a world of one. Rank 0 dies in the first communicator,
 * rank 3 in the second, rank 2 in the third; rank 1 ends alone (generation 3), its all-reduces
 * a copy. Each shrink's parent ranks, removed rank and generation are checked here. */
static int again_main(int rank, int p, void *arg) {
    static const int dies_in[NP] = {0, -1, 2, 1};   /* the generation each rank dies in */
    const scenario_t *sc = (const scenario_t *)arg;
    ddp_store_t *st = NULL;
    ddp_comm_t *c, *nc = NULL;
    float *a = (float *)malloc(COUNT * sizeof(float)), *b = (float *)malloc(COUNT * sizeof(float));
    int members[NP] = {0, 1, 2, 3}, n = NP, g, k, i, good = 1;
    ddp_result_t r = DDP_SUCCESS;
    (void)p;
    if (!(c = open_comm(rank, sc, &st))) return 1;
    for (g = 0; g < NP && good; g++) {
        int was[NP], wn = n, victim = -1, removed = -1;
        for (k = 0; k < 20; k++) {
            if (dies_in[rank] == g && k == KILL_AT) { S->t_kill = t_now(); raise(SIGKILL); }
            t_where("generation %d step %d", g, k);
            if ((r = step(c, a, b, rank, k, 0, members, n)) != DDP_SUCCESS) break;
        }
        if (g == NP - 1) {
            good &= ok(r == DDP_SUCCESS && n == 1 && ddp_comm_size(c) == 1 && ddp_comm_generation(c) == 3,
                       "[%s] rank %d alone: 20 all-reduces on a world of 1, generation %d (%s)", g_transport,
                       rank, ddp_comm_generation(c), ddp_strerror(r));
            break;
        }
        memcpy(was, members, sizeof was);
        for (i = 0; i < NP; i++) if (dies_in[i] == g) victim = i;
        r = ddp_comm_shrink(c, NULL, &nc);
        if (!ok(r == DDP_SUCCESS, "[%s] rank %d: shrink %d -> %s %s", g_transport, rank, g + 1, ddp_strerror(r),
                r ? ddp_comm_last_error(c) : ""))
            { good = 0; break; }
        ddp_comm_destroy(c);
        c = nc;
        n = ddp_comm_size(c);
        for (i = 0; i < n; i++) members[i] = was[ddp_comm_parent_rank(c, i)];
        for (i = 0; i < wn; i++) if (was[i] == victim) removed = i;
        ddp_comm_removed_ranks(c, &i, 1);
        good &= ok(ddp_comm_generation(c) == g + 1 && n == wn - 1 && ddp_comm_removed_ranks(c, NULL, 0) == 1 &&
                   i == removed && ddp_comm_parent_rank(c, ddp_comm_rank(c)) >= 0 &&
                   was[ddp_comm_parent_rank(c, ddp_comm_rank(c))] == rank,
                   "[%s] rank %d: generation %d: %d ranks, removed parent rank %d (rank %d at first)", g_transport,
                   rank, ddp_comm_generation(c), n, i, victim);
    }
    ddp_comm_destroy(c);
    ddp_store_close(st);
    free(a);
    free(b);
    return good ? 0 : 1;
}

/* The parent: the victims died, every survivor got the same membership, right. */
static void check_run(const scenario_t *sc) {
    int r, want_n = 0, want_parent[NP], want_removed[NP], nrem = 0, good = 1;
    double worst = 0;
    unsigned out = sc->victims | (sc->dies_in_shrink >= 0 ? 1u << sc->dies_in_shrink : 0u) |
                   (sc->late >= 0 ? 1u << sc->late : 0u);
    for (r = 0; r < NP; r++) {
        if (out >> r & 1u) want_removed[nrem++] = r;
        else want_parent[want_n++] = r;
    }
    for (r = 0; r < NP; r++) {
        const survivor_t *s = &S->s[r];
        int i, newrank = 0;
        if (out >> r & 1u) {
            if ((sc->how == 3 && (sc->victims >> r & 1u)) || r == sc->late)
                good &= ok(t_last_run.exited[r] && t_last_run.code[r] == 0 && S->fenced_ok,
                           "[%s] %s: the %s rank %d was fenced and exited", g_transport, sc->name,
                           r == sc->late ? "late" : "stopped", r);
            else
                good &= ok(t_rank_signaled(r, SIGKILL), "[%s] %s: rank %d died (SIGKILL)", g_transport, sc->name, r);
            continue;
        }
        for (i = 0; i < r; i++) newrank += !(out >> i & 1u);
        good &= ok(t_last_run.exited[r] && t_last_run.code[r] == 0 && s->done, "[%s] %s: survivor %d finished",
                   g_transport, sc->name, r);
        good &= ok(s->newrank == newrank && s->newsize == want_n && s->gen == 1 && s->nremoved == nrem &&
                   !memcmp(s->parent_of, want_parent, sizeof(int) * (size_t)want_n) &&
                   !memcmp(s->removed, want_removed, sizeof(int) * (size_t)nrem),
                   "[%s] %s: survivor %d: rank %d of %d (want %d of %d), generation %d, parent ranks %d %d %d, "
                   "removed %d: %d %d", g_transport, sc->name, r, s->newrank, s->newsize, newrank, want_n, s->gen,
                   s->parent_of[0], s->parent_of[1], s->parent_of[2], s->nremoved, s->removed[0], s->removed[1]);
        if (s->t_first - S->t_kill > worst) worst = s->t_first - S->t_kill;
    }
    if (good)
        diag("shrink at p=%d over %s (%s): kill -> first all-reduce on the new communicator done: %.0f ms "
             "(the slowest survivor)", NP, g_transport, sc->name, worst * 1e3);
}

static void run_forked(const scenario_t *sc) {
    int stop = -1;
    pid_t store = t_store_process(&g_store_port, &stop);
    if (!ok(store > 0 && g_store_port > 0, "[%s] %s: the store (a process of its own)", g_transport, sc->name))
        return;
    S = (shared_t *)t_shm_user(sizeof *S);
    diag("--- [%s] %s", g_transport, sc->name);
    if (!strcmp(sc->name, "again")) {
        t_run_ranks(NP, again_main, (void *)sc, 120);
        ok(t_rank_signaled(0, SIGKILL) && t_rank_signaled(2, SIGKILL) && t_rank_signaled(3, SIGKILL) &&
           t_last_run.exited[1] && t_last_run.code[1] == 0, "[%s] again: three shrinks, rank 1 finished alone",
           g_transport);
    } else {
        t_run_ranks(NP, rank_main, (void *)sc, 120);
        check_run(sc);
    }
    close(stop);
    waitpid(store, NULL, 0);
}

/* ---------------------------------------------------------------- threads as ranks */
typedef struct {
    ddp_comm_t *c, *nc;
    int rank, stop, failed_at, newrank, newsize, parent_of[NP], nremoved, removed[NP];
    ddp_result_t shrink_rc, first_rc, fenced_rc;
    char err[600];
} th_t;

static pthread_mutex_t th_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t th_cv = PTHREAD_COND_INITIALIZER;
static int th_shrunk, th_fenced;

static void *th_main(void *arg) {
    th_t *t = (th_t *)arg;
    float a[64];
    int k, i, members[NP], all[NP] = {0, 1, 2, 3};
    ddp_result_t r = DDP_SUCCESS;
    for (k = 0; k < 40; k++) {
        if (t->stop && k == KILL_AT) {
            /* stops calling until the others went on without it */
            pthread_mutex_lock(&th_mu);
            while (th_shrunk < NP - 1) pthread_cond_wait(&th_cv, &th_mu);
            pthread_mutex_unlock(&th_mu);
            for (i = 0; i < 64; i++) a[i] = val(t->rank, (size_t)i, k);
            t->fenced_rc = ddp_all_reduce(a, a, 64, DDP_FLOAT32, DDP_SUM, t->c);
            snprintf(t->err, sizeof t->err, "%s", ddp_comm_last_error(t->c));
            pthread_mutex_lock(&th_mu);
            th_fenced = 1;
            pthread_cond_broadcast(&th_cv);
            pthread_mutex_unlock(&th_mu);
            return NULL;
        }
        for (i = 0; i < 64; i++) a[i] = val(t->rank, (size_t)i, k);
        r = ddp_all_reduce(a, a, 64, DDP_FLOAT32, DDP_SUM, t->c);
        if (r != DDP_SUCCESS) break;
        (void)all;
    }
    t->failed_at = k;
    t->shrink_rc = ddp_comm_shrink(t->c, NULL, &t->nc);
    if (t->shrink_rc == DDP_SUCCESS) {
        t->newrank = ddp_comm_rank(t->nc);
        t->newsize = ddp_comm_size(t->nc);
        for (i = 0; i < t->newsize && i < NP; i++) members[i] = t->parent_of[i] = ddp_comm_parent_rank(t->nc, i);
        t->nremoved = ddp_comm_removed_ranks(t->nc, t->removed, NP);
        for (i = 0; i < 64; i++) a[i] = val(t->rank, (size_t)i, 100);
        t->first_rc = ddp_all_reduce(a, a, 64, DDP_FLOAT32, DDP_SUM, t->nc);
        for (i = 0; t->first_rc == DDP_SUCCESS && i < 64; i++) {
            float want = 0;
            int j;
            for (j = 0; j < t->newsize; j++) want += val(members[j], (size_t)i, 100);
            if (a[i] != want) t->first_rc = DDP_ERR_INTERNAL;
        }
    } else {
        snprintf(t->err, sizeof t->err, "%s", ddp_comm_last_error(t->c));
    }
    pthread_mutex_lock(&th_mu);
    th_shrunk++;
    pthread_cond_broadcast(&th_cv);
    while (!th_fenced) pthread_cond_wait(&th_cv, &th_mu);   /* the store lives in a survivor's child */
    pthread_mutex_unlock(&th_mu);
    return NULL;
}

static void run_threads(void) {
    ddp_comm_t *comms[NP];
    pthread_t th[NP];
    th_t t[NP];
    ddp_comm_desc_t d;
    ddp_result_t r;
    int i, stopped = 2;
    memset(&d, 0, sizeof d);
    d.timeout_ms = 1000;
    d.transport = "threads";
    d.log_level = 1;
    th_shrunk = th_fenced = 0;
    r = ddp_comm_init_threads(comms, NP, &d);
    if (!ok(r == DDP_SUCCESS, "init_threads(%d) -> %s %s", NP, ddp_strerror(r), r ? ddp_last_init_error() : ""))
        return;
    for (i = 0; i < NP; i++) {
        memset(&t[i], 0, sizeof t[i]);
        t[i].c = comms[i];
        t[i].rank = i;
        t[i].stop = i == stopped;
        pthread_create(&th[i], NULL, th_main, &t[i]);
    }
    for (i = 0; i < NP; i++) pthread_join(th[i], NULL);
    for (i = 0; i < NP; i++) {
        int want = i < stopped ? i : i - 1;
        static const int parents[3] = {0, 1, 3};
        if (i == stopped) {
            ok(t[i].fenced_rc == DDP_ERR_REMOVED && strstr(t[i].err, "generation 1"),
               "[threads] thread rank %d, which stopped calling: its next call -> %s: %s", i,
               ddp_strerror(t[i].fenced_rc), t[i].err);
            continue;
        }
        ok(t[i].failed_at == KILL_AT && t[i].shrink_rc == DDP_SUCCESS, "[threads] rank %d: step %d failed, "
           "shrink -> %s %s", i, t[i].failed_at, ddp_strerror(t[i].shrink_rc), t[i].err);
        ok(t[i].newrank == want && t[i].newsize == NP - 1 && !memcmp(t[i].parent_of, parents, sizeof parents) &&
           t[i].nremoved == 1 && t[i].removed[0] == stopped, "[threads] rank %d -> rank %d of %d, removed %d (%d)",
           i, t[i].newrank, t[i].newsize, t[i].nremoved, t[i].removed[0]);
        ok(t[i].first_rc == DDP_SUCCESS, "[threads] rank %d: all-reduce on the new communicator exact (%s)", i,
           ddp_strerror(t[i].first_rc));
    }
    for (i = 0; i < NP; i++) if (i != stopped) ok(ddp_comm_destroy(comms[i]) == DDP_SUCCESS, "[threads] destroy parent %d", i);
    ok(ddp_comm_destroy(comms[stopped]) == DDP_SUCCESS, "[threads] destroy the stopped rank's communicator");
    for (i = NP - 1; i >= 0; i--)
        if (t[i].nc) ok(ddp_comm_destroy(t[i].nc) == DDP_SUCCESS, "[threads] destroy new communicator of rank %d", i);
}

int main(void) {
    static const scenario_t sc[] = {
        {"first", 1u << 0, 0, -1, 5000, -1},
        {"middle", 1u << 1, 1, -1, 5000, -1},
        {"last", 1u << 3, 2, -1, 5000, -1},
        {"two", (1u << 1) | (1u << 3), 0, -1, 3000, -1},
        {"during", 1u << 3, 0, 1, 3000, -1},
        {"stopped", 1u << 2, 3, -1, 1500, -1},
        {"late", 1u << 0, 0, -1, 1500, 3},
        {"again", 0, 0, -1, 5000, -1},
    };
    static const char *const transports[] = {"tcp", "shm"};
    size_t i, m;
    t_init();
    for (m = 0; m < 2; m++) {
        g_transport = transports[m];
        for (i = 0; i < sizeof sc / sizeof sc[0]; i++)
            if (t_selected(sc[i].name)) run_forked(&sc[i]);
    }
    if (t_selected("threads")) {
        diag("--- [threads] thread rank 2 stops calling");
        run_threads();
    }
    return t_done();
}
