/* SPDX-License-Identifier: MIT (see LICENSE) */
/* tests/test_grow.c — ddp_comm_join / ddp_comm_grow: processes started into a running job wait
 * as joiners; the members admit them at a step boundary and go on with the grown communicator
 * (ddp_comm_grow.h). TAP.
 *
 *   build/test_grow          (DDP_TEST_ONLY=<scenario> runs one)
 *
 * Each scenario forks members and joiners over tcp, then over shm; the store is served by a
 * process of its own with a job secret (as ddprun's). Members pass a store client in
 * desc.store; joiners find the store as a user's process would (master address, port, secret).
 * Members run steps of one all-reduce each; at each step boundary they agree (all-reduce MAX)
 * on ddp_comm_joiners_waiting and grow when it is > 0. Every all-reduce is checked exactly.
 *   basic     3 members; a joiner takes its ticket while member 0 is inside a step's
 *             all-reduce: it is admitted at a later boundary, never in the middle (every step
 *             exact, the grow's step after the one in flight); ranks, sizes, members, joined
 *   two       2 members, two joiners at once (the members wait until both do): one grow,
 *             ranks 2 and 3
 *   dies      3 members, two joiners, both seated in one grow; one dies right after taking
 *             its seat: the build fails, the grow gives no communicator (the members go on,
 *             nothing lost), the other joiner takes a new ticket and is admitted at the next
 *             boundary
 *   secret    a joiner with the wrong secret: refused (DDP_ERR_AUTH), the members never see it
 *   job       a joiner of another job (DDP_JOB_ID): refused (DDP_ERR_MISMATCH) naming both jobs
 *   ended     a joiner that comes after the members destroyed their communicator (the job is
 *             over): fails at once (DDP_ERR_ABORTED), not at its timeout
 *   again     grow, shrink, grow: 3 members + a joiner -> 4; member 1 killed -> shrink to 3;
 *             a second joiner -> 4 again (generation 3), every step exact
 *   decider   rank 0 dies inside a grow, right after it offered the joiner a seat: the other
 *             members' grow fails naming it (at their timeout); they shrink (the failed grow
 *             blamed rank 0, so at once) and grow again: the joiner, which took a seat in the
 *             grow that never finished, comes in with a new ticket (generation 2) */
#define _GNU_SOURCE
#include "ddp.h"
#include "transports/ddp_tcp.h"
#include "transports/ddp_shm.h"
#include "tests/ddp_test.h"

#define MAXP 8
#define COUNT 1031                  /* odd: uneven ring chunks */
#define SECRET "grow-test-secret-0123456789"

typedef struct {
    int done, rc;                   /* reached the end; the scenario's verdict (0 ok) */
    int rank, size, members, joined, gen;
    int grown_at;                   /* the step after which the last grow returned a communicator */
    int nulls;                      /* grows that admitted nobody */
    int grows;                      /* grows that returned a communicator */
    int retired_bad;                /* a call on the old communicator did not fail as retired */
    char grow_err[600];             /* a grow's failure (decider: rank 0 lost inside it) */
    char err[600];
} report_t;

typedef struct {
    report_t r[MAXP];
    int in_step;                    /* member 0 is inside this step's all-reduce (+1) */
    int ticket_taken_at;            /* the step member 0 was in when the joiner took its ticket */
    int first_admitted;             /* the first grow happened (for "again"'s second joiner) */
    int shrunk;                     /* "again": the survivors shrank */
} shared_t;

typedef struct {
    const char *name;
    int members, joiners;
    int dying_joiner;               /* process index of a joiner that dies after its seat (-1) */
    int bad;                        /* 1 wrong secret, 2 another job, 3 after the job ended */
    int again;                      /* grow, shrink, grow */
    int min_wait;                   /* grow only when this many wait (two: both at once) */
    int decider_dies;               /* rank 0 dies inside the grow, after offering the seats */
} scenario_t;

static shared_t *S;
static const char *g_transport = "tcp";
static int g_store_port;
static ddp_store_t *g_client;
static int sc_min_wait, sc_shrink_on_fail;

static float val(int rank, size_t i, int k) { return (float)((rank + 1) * (int)((i % 7) + 1) + k); }

/* One step: every rank contributes val(its rank, i, k); the sum over the ranks is known. */
static ddp_result_t step(ddp_comm_t *c, float *a, int k) {
    size_t i;
    int j, me = ddp_comm_rank(c), n = ddp_comm_size(c);
    ddp_result_t r;
    for (i = 0; i < COUNT; i++) a[i] = val(me, i, k);
    if ((r = ddp_all_reduce(a, a, COUNT, DDP_FLOAT32, DDP_SUM, c)) != DDP_SUCCESS) return r;
    for (i = 0; i < COUNT; i++) {
        float want = 0;
        for (j = 0; j < n; j++) want += val(j, i, k);
        if (a[i] != want) return DDP_ERR_INTERNAL;
    }
    return DDP_SUCCESS;
}

static void joiner_desc(ddp_comm_desc_t *d, const char *secret) {
    memset(d, 0, sizeof *d);
    d->master_addr = "127.0.0.1";
    d->master_port = g_store_port;
    d->job_secret = secret;
    d->store_prefix = "growtest";
    d->transport = g_transport;
    d->timeout_ms = 10000;
    d->log_level = getenv("T_GROW_DEBUG") ? 0 : 1;
}

/* A joiner that dies right after taking its seat. */
static void die_on_seat(void *user, ddp_log_level_t level, int rank, const char *msg) {
    (void)user; (void)level; (void)rank;
    if (strstr(msg, "comm_join: took a seat")) raise(SIGKILL);
}

/* Rank 0, deciding a grow, dies right after it offered the seats (the plan never comes). */
static void die_on_offer(void *user, ddp_log_level_t level, int rank, const char *msg) {
    (void)user; (void)level; (void)rank;
    if (strstr(msg, "offering seats")) raise(SIGKILL);
}

/* The members' agreement at a step boundary: the most joiners any member saw waiting. */
static ddp_result_t agreed_waiting(ddp_comm_t *c, int *w) {
    int32_t v = ddp_comm_joiners_waiting(c);
    ddp_result_t r = ddp_all_reduce(&v, &v, 1, DDP_INT32, DDP_MAX, c);
    *w = (int)v;
    return r;
}

/* Steps on c until someone waits; then a grow; until the communicator has want ranks. Returns
 * it (c destroyed if it grew) or NULL when the steps ran out or a call failed. */
static ddp_comm_t *grow_to(ddp_comm_t *c, int proc, int *k, int want) {
    float *a = (float *)malloc(COUNT * sizeof *a);
    ddp_comm_t *g = NULL;
    ddp_grow_opts_t go;
    ddp_result_t r = DDP_SUCCESS;
    memset(&go, 0, sizeof go);
    go.timeout_ms = 3000;
    go.accept_ms = 3000;
    /* (decider: until the grow after the shrink, generation 2) */
    for (; (ddp_comm_size(c) < want || (sc_shrink_on_fail && ddp_comm_generation(c) < 2)) && *k < 100000; (*k)++) {
        int w = 0;
        if (ddp_comm_rank(c) == 0) __atomic_store_n(&S->in_step, *k + 1, __ATOMIC_SEQ_CST);
        if ((r = step(c, a, *k)) != DDP_SUCCESS) break;
        if (ddp_comm_rank(c) == 0) __atomic_store_n(&S->in_step, 0, __ATOMIC_SEQ_CST);
        if ((r = agreed_waiting(c, &w)) != DDP_SUCCESS) break;
        /* min_wait: the first grow waits until that many joiners wait (both seated at once) */
        if (w == 0 || (!S->r[proc].grows && !S->r[proc].nulls && w < sc_min_wait)) { usleep(1000); continue; }
        t_where("ddp_comm_grow at step %d", *k);
        if ((r = ddp_comm_grow(c, &go, &g)) != DDP_SUCCESS) {
            ddp_comm_t *nc = NULL;
            if (!sc_shrink_on_fail) break;
            /* a member was lost during the grow: shrink, as after any failed call, and go on */
            snprintf(S->r[proc].grow_err, sizeof S->r[proc].grow_err, "%s", ddp_comm_last_error(c));
            t_where("ddp_comm_shrink after the failed grow");
            if ((r = ddp_comm_shrink(c, NULL, &nc)) != DDP_SUCCESS) break;
            ddp_comm_destroy(c);
            c = nc;
            *k = -1;
            continue;
        }
        if (!g) { S->r[proc].nulls++; continue; }   /* nobody admitted (a joiner died): go on */
        if (ddp_barrier(c) != DDP_ERR_ABORTED || !strstr(ddp_comm_last_error(c), "retired by ddp_comm_grow"))
            S->r[proc].retired_bad = 1;   /* the old communicator must refuse, saying why */
        ddp_comm_destroy(c);
        c = g;
        g = NULL;
        S->r[proc].grown_at = *k;
        S->r[proc].grows++;
        *k = -1;   /* a joiner starts counting at 0: so does everyone on the grown communicator */
    }
    free(a);
    if (ddp_comm_size(c) < want) {
        snprintf(S->r[proc].err, sizeof S->r[proc].err, "%s at step %d: %s",
                 r == DDP_SUCCESS ? "out of steps" : ddp_strerror(r), *k, ddp_comm_last_error(c));
        ddp_comm_destroy(c);
        return NULL;
    }
    return c;
}

/* After the last grow: steps on the grown communicator, then the report. */
static int finish(ddp_comm_t *c, int proc) {
    float a[COUNT];
    report_t *rep = &S->r[proc];
    int j;
    ddp_result_t r = DDP_SUCCESS;
    for (j = 0; j < 5 && r == DDP_SUCCESS; j++) r = step(c, a, 1000 + j);
    rep->rank = ddp_comm_rank(c);
    rep->size = ddp_comm_size(c);
    rep->members = ddp_comm_grow_members(c);
    rep->joined = ddp_comm_joined(c);
    rep->gen = ddp_comm_generation(c);
    rep->rc = r;
    if (r != DDP_SUCCESS) snprintf(rep->err, sizeof rep->err, "steps after the grow: %s", ddp_comm_last_error(c));
    rep->done = 1;
    ddp_comm_destroy(c);
    return r == DDP_SUCCESS ? 0 : 1;
}

/* Everyone's life from its first communicator (a member's from init, a joiner's from join):
 * grow to the scenario's size; for "again" then lose original member 1, shrink, grow again. */
static int life(ddp_comm_t *c, int proc, const scenario_t *sc, int stage) {
    int k = 0;   /* steps on the current communicator */
    if (stage == 0) {
        int want = sc->again ? sc->members + 1 : sc->members + sc->joiners - (sc->dying_joiner >= 0) - sc->decider_dies;
        if (!(c = grow_to(c, proc, &k, want))) return 1;
        if (!sc->again) return finish(c, proc);
        __atomic_store_n(&S->first_admitted, 1, __ATOMIC_SEQ_CST);
        stage = 1;
    }
    if (stage == 1) {
        float a[COUNT];
        ddp_comm_t *nc = NULL;
        if (proc == 1) raise(SIGKILL);   /* original member 1 is lost at this step */
        if (step(c, a, 500) == DDP_SUCCESS) {
            snprintf(S->r[proc].err, sizeof S->r[proc].err, "a step with a dead member succeeded");
            return 1;
        }
        if (ddp_comm_shrink(c, NULL, &nc) != DDP_SUCCESS) {
            snprintf(S->r[proc].err, sizeof S->r[proc].err, "shrink: %s", ddp_comm_last_error(c));
            return 1;
        }
        ddp_comm_destroy(c);
        __atomic_add_fetch(&S->shrunk, 1, __ATOMIC_SEQ_CST);
        k = 0;   /* the first joiner came in at stage 1: every rank counts steps from here */
        if (!(c = grow_to(nc, proc, &k, sc->members + 1))) return 1;
    }
    return finish(c, proc);
}

static int member_main(int proc, const scenario_t *sc) {
    ddp_comm_desc_t d;
    ddp_store_t *st = NULL;
    ddp_comm_t *c = NULL;
    if (t_store_client_secret(&st, g_store_port, SECRET) != DDP_SUCCESS) return 2;
    t_desc(&d, 5000);
    d.store = st;
    d.store_prefix = "growtest";
    d.transport = g_transport;
    d.log_level = 1;
    if (getenv("T_GROW_DEBUG")) d.log_level = 0;
    if (sc->decider_dies && proc == 0) { d.log_level = DDP_LOG_INFO + 1; d.log_fn = die_on_offer; }
    t_where("ddp_comm_init");
    if (ddp_comm_init(&c, sc->members, proc, &d) != DDP_SUCCESS) {
        snprintf(S->r[proc].err, sizeof S->r[proc].err, "init: %s", ddp_last_init_error());
        return 1;
    }
    g_client = st;   /* closed when the process is done (the communicators do not own it) */
    if (sc->bad) {   /* the refused joiner never shows: a few steps, nobody waiting, done */
        float a[COUNT];
        int w = 0, k;
        ddp_result_t r = DDP_SUCCESS;
        if (sc->bad != 3) {   /* (3: the joiner comes after the job ended) */
            while (!__atomic_load_n(&S->r[sc->members].done, __ATOMIC_SEQ_CST)) usleep(1000);
            usleep(50000);   /* ten of the watcher's looks: a refused joiner must not be counted */
        }
        for (k = 0; k < 3 && r == DDP_SUCCESS; k++) {
            r = step(c, a, k);
            if (r == DDP_SUCCESS) r = agreed_waiting(c, &w);
            if (w) r = DDP_ERR_INTERNAL;
        }
        S->r[proc].rank = ddp_comm_rank(c);
        S->r[proc].size = ddp_comm_size(c);
        S->r[proc].rc = r;
        ddp_comm_destroy(c);
        __atomic_store_n(&S->r[proc].done, 1, __ATOMIC_SEQ_CST);
        return r == DDP_SUCCESS ? 0 : 1;
    }
    return life(c, proc, sc, 0);
}

static int joiner_main(int proc, const scenario_t *sc) {
    ddp_comm_desc_t d;
    ddp_comm_t *c = NULL;
    ddp_result_t r;
    int first_joiner = proc == sc->members, i;
    report_t *rep = &S->r[proc];
    joiner_desc(&d, sc->bad == 1 ? "not-the-secret-of-this-job-987" : SECRET);
    if (sc->bad == 2) setenv("DDP_JOB_ID", "another-job", 1);
    if (proc == sc->dying_joiner) { d.log_level = DDP_LOG_INFO + 1; d.log_fn = die_on_seat; }
    if (first_joiner && !strcmp(sc->name, "basic")) {
        /* take the ticket while member 0 is inside a step's all-reduce */
        while (!__atomic_load_n(&S->in_step, __ATOMIC_SEQ_CST)) usleep(100);
        S->ticket_taken_at = __atomic_load_n(&S->in_step, __ATOMIC_SEQ_CST) - 1;
    }
    if (sc->again && !first_joiner)
        while (!__atomic_load_n(&S->shrunk, __ATOMIC_SEQ_CST)) usleep(1000);
    if (sc->bad == 3)   /* after the members destroyed their communicator */
        for (i = 0; i < sc->members; i++) while (!__atomic_load_n(&S->r[i].done, __ATOMIC_SEQ_CST)) usleep(1000);
    t_where("ddp_comm_join");
    r = ddp_comm_join(&c, &d, NULL);
    if (sc->bad) {
        rep->rc = r;
        snprintf(rep->err, sizeof rep->err, "%s", ddp_last_init_error());
        __atomic_store_n(&rep->done, 1, __ATOMIC_SEQ_CST);
        return 0;
    }
    if (r != DDP_SUCCESS) {
        snprintf(rep->err, sizeof rep->err, "join: %s", ddp_last_init_error());
        rep->rc = r;
        return 1;
    }
    return life(c, proc, sc, sc->again && !first_joiner ? 2 : sc->again ? 1 : 0);
}

static int proc_main(int proc, int p, void *arg) {
    const scenario_t *sc = (const scenario_t *)arg;
    (void)p;
    int rc;
    setenv("DDP_JOIN_POLL_MS", "5", 1);
    sc_min_wait = sc->min_wait;
    sc_shrink_on_fail = sc->decider_dies;
    rc = proc < sc->members ? member_main(proc, sc) : joiner_main(proc, sc);
    if (g_client) ddp_store_close(g_client);
    return rc;
}

static void run(const scenario_t *sc) {
    int stop = -1, p = sc->members + sc->joiners, i;
    pid_t store = t_store_process_secret(&g_store_port, &stop, SECRET);
    if (!ok(store > 0 && g_store_port > 0, "[%s] %s: the store", g_transport, sc->name)) return;
    S = (shared_t *)t_shm_user(sizeof *S);
    diag("--- [%s] %s", g_transport, sc->name);
    t_run_ranks(p, proc_main, (void *)sc, 120);
    close(stop);
    waitpid(store, NULL, 0);
    if (sc->bad) {
        report_t *j = &S->r[sc->members];
        if (sc->bad == 1)
            ok(j->done && j->rc == DDP_ERR_AUTH, "[%s] %s: a joiner with the wrong secret is refused -> %s: %s",
               g_transport, sc->name, ddp_strerror((ddp_result_t)j->rc), j->err);
        else if (sc->bad == 2)
            ok(j->done && j->rc == DDP_ERR_MISMATCH && strstr(j->err, "another-job"), "[%s] %s: a joiner of "
               "another job is refused naming it -> %s: %s", g_transport, sc->name, ddp_strerror((ddp_result_t)j->rc), j->err);
        else
            ok(j->done && j->rc == DDP_ERR_ABORTED && strstr(j->err, "ended"), "[%s] %s: a joiner that comes "
               "after the members destroyed their communicator fails at once -> %s: %s", g_transport, sc->name,
               ddp_strerror((ddp_result_t)j->rc), j->err);
        for (i = 0; i < sc->members; i++)
            ok(S->r[i].done && S->r[i].rc == 0 && S->r[i].size == sc->members, "[%s] %s: member %d went on "
               "with %d ranks, nobody waiting (%s)", g_transport, sc->name, i, S->r[i].size, S->r[i].err);
        return;
    }
    for (i = 0; i < p; i++) {
        report_t *r = &S->r[i];
        int want_size = sc->again ? sc->members + 1 : p - (sc->dying_joiner >= 0) - sc->decider_dies;
        int want_gen = sc->again ? 3 : sc->decider_dies ? 2 : 1, joiner = i >= sc->members;
        if (i == sc->dying_joiner || (sc->again && i == 1) || (sc->decider_dies && i == 0)) {
            ok(t_rank_signaled(i, SIGKILL), "[%s] %s: process %d was killed as planned", g_transport, sc->name, i);
            continue;
        }
        ok(r->done && r->rc == 0 && !r->retired_bad, "[%s] %s: process %d (%s) finished, every step exact, "
           "the old communicator refused calls as retired (%s)", g_transport, sc->name, i, joiner ? "joiner" : "member", r->err);
        ok(r->size == want_size && r->gen == want_gen && r->joined == (joiner && !(sc->again && i == sc->members)) &&
           r->members == sc->members - sc->decider_dies,
           "[%s] %s: process %d -> rank %d of %d, %d members before the grow, joined %d, generation %d",
           g_transport, sc->name, i, r->rank, r->size, r->members, r->joined, r->gen);
    }
    if (!strcmp(sc->name, "basic"))
        ok(S->r[0].grown_at >= S->ticket_taken_at && S->r[3].rank == 3, "[%s] basic: the joiner took its ticket "
           "during step %d's all-reduce, was admitted after step %d (a boundary) as rank %d", g_transport,
           S->ticket_taken_at, S->r[0].grown_at, S->r[3].rank);
    if (!strcmp(sc->name, "two"))
        ok(S->r[0].grows == 1 && S->r[0].rank == 0 && S->r[1].rank == 1 && S->r[2].rank + S->r[3].rank == 5 &&
           S->r[2].rank != S->r[3].rank, "[%s] two: both joiners in %d grow; members keep ranks 0 and 1, the "
           "joiners get 2 and 3 (%d, %d)", g_transport, S->r[0].grows, S->r[2].rank, S->r[3].rank);
    if (!strcmp(sc->name, "dies"))
        ok(S->r[0].nulls >= 1 && S->r[4].rank == 3, "[%s] dies: %d grow(s) admitted nobody while the joiner died; "
           "the other joiner came in as rank %d", g_transport, S->r[0].nulls, S->r[4].rank);
    if (sc->decider_dies)
        ok(strstr(S->r[1].grow_err, "rank 0 did not decide") && S->r[3].rank == 2, "[%s] decider: rank 0 lost inside "
           "the grow: the others' grow failed naming it (%s), they shrank and admitted the joiner (rank %d) at a later "
           "grow", g_transport, S->r[1].grow_err, S->r[3].rank);
    if (!strcmp(sc->name, "again"))
        ok(S->r[0].rank == 0 && S->r[2].rank == 1 && S->r[3].rank == 2 && S->r[4].rank == 3, "[%s] again: after "
           "grow, shrink, grow: ranks %d %d %d %d", g_transport, S->r[0].rank, S->r[2].rank, S->r[3].rank, S->r[4].rank);
}

int main(void) {
    static const scenario_t sc[] = {
        {"basic", 3, 1, -1, 0, 0, 0, 0},
        {"two", 2, 2, -1, 0, 0, 2, 0},
        {"dies", 3, 2, 3, 0, 0, 2, 0},
        {"secret", 2, 1, -1, 1, 0, 0, 0},
        {"job", 2, 1, -1, 2, 0, 0, 0},
        {"ended", 2, 1, -1, 3, 0, 0, 0},
        {"again", 3, 2, -1, 0, 1, 0, 0},
        {"decider", 3, 1, -1, 0, 0, 0, 1},
    };
    static const char *const transports[] = {"tcp", "shm"};
    size_t i, m;
    t_init();
    for (m = 0; m < 2; m++) {
        g_transport = transports[m];
        for (i = 0; i < sizeof sc / sizeof sc[0]; i++)
            if (t_selected(sc[i].name)) run(&sc[i]);
    }
    return t_done();
}
