/* SPDX-License-Identifier: MIT (see LICENSE) */
/* ddp_comm_grow.h — growing a running job back: a process started into it (a replacement for a
 * lost rank, or extra capacity) waits as a joiner; the members admit the joiners waiting at a
 * point they choose (a step boundary) in one collective call, which returns the grown
 * communicator: the members keep their ranks, the joiners follow in the order they came
 * (NCCL's ncclCommGrow; torchft's and Horovod's elastic re-rendezvous). The joiners then take
 * the job's state from the members (ddp_state.h).
 *
 *     // every member, at the end of a step (the elastic reducer agrees on the count for free):
 *     if (ddp_reducer_joiners_waiting(red) > 0) {
 *         ddp_comm_t *grown = NULL;
 *         if (ddp_comm_grow(comm, NULL, &grown) != DDP_SUCCESS) return fail;   // a member lost
 *         if (grown) { ddp_comm_destroy(comm); comm = grown; send the state; rebind; }
 *     }
 *     // a joiner (ddp_comm_init_env does this when DDP_ELASTIC_JOIN=1):
 *     ddp_comm_join(&comm, NULL, NULL);   // returns once admitted; then receive the state
 *
 * How (docs/elastic.md has the whole story), under the job's first communicator's store
 * prefix <root> (the members' line of shrinks and grows shares it; a joiner computes the same
 * from the same environment or desc.store_prefix):
 *  1. A joiner proves it belongs before anything: the store's handshake (the job secret; a
 *     wrong one is refused, DDP_ERR_AUTH), then the job identity the job's first rank wrote
 *     under <root>/job (another job's: DDP_ERR_MISMATCH, naming both). Only then does it take a
 *     ticket (<root>/join/tickets, a counter) and wait for a seat under <root>/join/seat/<t>.
 *  2. Waiting joiners = tickets - handled (<root>/join/handled). Each member's watcher thread
 *     (started by the first ddp_comm_joiners_waiting) reads both every DDP_JOIN_POLL_MS; the
 *     call itself reads the watcher's last answer.
 *  3. ddp_comm_grow, under <root>/grow<g>.<k> (g: the new generation, k: this communicator's
 *     grow calls): rank 0 offers a seat to each joiner waiting, waits up to accept_ms for each
 *     to take it, writes the plan (the world size and the tickets that took their seats, in
 *     ticket order) and counts them handled. Every member and seated joiner builds the
 *     communicator under <grow base>/c (the members' transport and settings; the rendezvous
 *     bounded by opts.timeout_ms), then they agree on a verdict by compare-and-set: "ok" once
 *     everyone built it, "fail" when someone could not or at the deadline. On "fail" nothing
 *     changes for the members (a joiner that died is dropped; joiners still alive take a new
 *     ticket and wait for the next grow); a member missing is named in the error.
 *  4. On "ok" the old communicator is retired (its calls fail: use the new one) and hands the
 *     store handle to the new one.
 *
 * Users include ddp.h (ddp_comm.h includes this). Depends on ddp_comm_shrink.h. Built by
 * DDP_IMPLEMENTATION (or DDP_COMM_GROW_IMPLEMENTATION).
 */
#if defined(DDP_IMPLEMENTATION) && !defined(DDP_COMM_GROW_IMPLEMENTATION)
#define DDP_COMM_GROW_IMPLEMENTATION
#endif
#if defined(DDP_COMM_GROW_IMPLEMENTATION)
#ifndef DDP_COMM_SHRINK_IMPLEMENTATION
#define DDP_COMM_SHRINK_IMPLEMENTATION
#endif
#endif
#include "ddp_comm_shrink.h"
#include "ddp_comm_types.h"

#ifndef DDP_COMM_GROW_H_INCLUDED
#define DDP_COMM_GROW_H_INCLUDED

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ddp_join_opts {     /* zero = defaults */
    int timeout_ms;                /* how long ddp_comm_join waits to be admitted: 0:
                                    * DDP_JOIN_TIMEOUT_MS, else 600000 (10 min); < 0: forever */
} ddp_join_opts_t;

/* A process started into a running job (the same job identity, store and secret as its ranks:
 * under ddprun --elastic --max-restarts, the replacement's environment) waits here as a joiner
 * until the members admit it with ddp_comm_grow, and returns the grown communicator: its rank
 * comes after every member's (ranks ddp_comm_grow_members(comm) .. size - 1 joined). desc as
 * ddp_comm_init's (the store prefix, if the job chose one, must be the job's first
 * communicator's). A joiner of another job, or with the wrong secret, is refused
 * (DDP_ERR_MISMATCH, DDP_ERR_AUTH) saying why; one nobody admits fails at opts->timeout_ms.
 * ddp_comm_init_env joins instead of initialising when DDP_ELASTIC_JOIN=1. */
DDP_API ddp_result_t ddp_comm_join(ddp_comm_t **newcomm, const ddp_comm_desc_t *desc, const ddp_join_opts_t *opts);

/* How many joiners wait to be admitted, as this rank last saw: a watcher thread of the
 * communicator (started by the first call) asks the store every DDP_JOIN_POLL_MS (default 100);
 * the call only reads its last answer, so it never blocks and costs nanoseconds. Ranks may see
 * different counts for a moment: agree before ddp_comm_grow (the elastic reducer does, in its
 * commit round: ddp_reducer_joiners_waiting). 0 until the watcher's first answer; -1 for a bad
 * communicator. */
DDP_API int ddp_comm_joiners_waiting(ddp_comm_t *comm);

typedef struct ddp_grow_opts {     /* zero = defaults */
    int max_joiners;               /* admit at most this many (0: every one waiting) */
    int accept_ms;                 /* how long a joiner offered a seat has to take it (0: 2000) */
    int timeout_ms;                /* bound on building the grown communicator, and on agreeing
                                    * that everyone did (0: the communicator's timeout, at most
                                    * 10 s; < 0: the communicator's timeout) */
} ddp_grow_opts_t;

/* Collective over comm, at a point every member chose (a step boundary, no async request
 * pending): admits the joiners waiting and returns in *newcomm the grown communicator (members
 * keep their ranks, joiners follow in the order they came), or *newcomm = NULL and DDP_SUCCESS
 * when nobody was admitted (none waiting, or every one offered a seat died or did not take it:
 * comm goes on as it was). After a grow, comm is retired (its calls fail: use the new one) and
 * must be destroyed. A member that does not take part fails the grow on every member (naming
 * it); comm is then as after any failed call: shrink it. Destroying a healthy communicator that
 * looked for joiners (neither grown nor shrunk: the job is ending) closes the job to joiners:
 * those still waiting fail at once (DDP_ERR_ABORTED). */
DDP_API ddp_result_t ddp_comm_grow(ddp_comm_t *comm, const ddp_grow_opts_t *opts, ddp_comm_t **newcomm);
/* A communicator made by ddp_comm_grow or ddp_comm_join: how many of its ranks (0 .. m-1) were
 * members before it grew (they hold the job's state); ddp_comm_size for any other; -1 if NULL. */
DDP_API int ddp_comm_grow_members(const ddp_comm_t *comm);
/* 1 if this rank joined (ddp_comm_join made its communicator): its state comes from the members. */
DDP_API int ddp_comm_joined(const ddp_comm_t *comm);

#ifdef __cplusplus
}
#endif
#endif /* DDP_COMM_GROW_H_INCLUDED */

/* ============================================================================================
 * IMPLEMENTATION
 * ========================================================================================== */
#if defined(DDP_COMM_GROW_IMPLEMENTATION) && !defined(DDP_COMM_GROW_IMPL_INCLUDED)
#define DDP_COMM_GROW_IMPL_INCLUDED
#if !defined(DDP_COMM_SHRINK_IMPL_INCLUDED)
#error "libddp: ddp_comm_grow.h's implementation needs those of the headers below it (define DDP_IMPLEMENTATION)"
#endif

#ifdef __cplusplus
extern "C" {   /* the public calls defined here: C linkage, as declared above */
#endif

#define _DDP_JOIN_DEFAULT_MS 600000
#define _DDP_GROW_DEFAULT_ACCEPT_MS 2000
#define _DDP_GROW_DEFAULT_BUILD_MS 10000

/* "<root>/<what>": the job's first communicator's prefix, where joiners and members meet. */
_DDP_PRIVATE void _ddp_root_key(const ddp_comm_t *c, char *out, size_t cap, const char *fmt, ...)
#if defined(__GNUC__) || defined(__clang__)
    __attribute__((format(printf, 4, 5)))
#endif
    ;
_DDP_PRIVATE void _ddp_root_key(const ddp_comm_t *c, char *out, size_t cap, const char *fmt, ...) {
    va_list ap;
    int len = c->shrink.root_len > 0 ? c->shrink.root_len : (int)strlen(c->boot.prefix);
    va_start(ap, fmt);
    _ddp_vkey(out, cap, c->boot.prefix, len, fmt, ap);
    va_end(ap);
}

/* A counter's value (0 when it was never added to). */
_DDP_PRIVATE ddp_result_t _ddp_grow_counter(ddp_store_t *st, const char *key, int64_t delta, int64_t *v) {
    return ddp_store_add(st, key, delta, v);
}

/* Waits (polling, naps up to 10 ms) until key exists or the deadline passes; 1 if it exists. */
_DDP_PRIVATE ddp_result_t _ddp_grow_await(ddp_store_t *st, const char *key, int64_t deadline, int *exists) {
    int nap = 100;
    ddp_result_t r;
    for (;;) {
        if ((r = ddp_store_check(st, key, exists)) != DDP_SUCCESS || *exists) return r;
        if (_ddp_ms_left(deadline) == 0) return DDP_SUCCESS;
        _ddp_shrink_nap(&nap);
    }
}

/* A string value (NUL-terminated; truncated to cap - 1). */
_DDP_PRIVATE ddp_result_t _ddp_grow_get(ddp_store_t *st, const char *key, char *val, size_t cap) {
    size_t len = 0;
    ddp_result_t r = ddp_store_get(st, key, val, cap - 1, &len);
    val[r == DDP_SUCCESS ? (len < cap ? len : cap - 1) : 0] = 0;
    return r;
}

/* ---------------------------------------------------------------- the watcher
 * One thread per communicator, from the first ddp_comm_joiners_waiting to destroy: its own
 * client of the store (a client serves one thread at a time), two counters per look. */
typedef struct {
    ddp_comm_t *c;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int stop, poll_ms, started;
    char tickets[256], handled[256];
} _ddp_grow_watch_t;

static void *_ddp_grow_watch_main(void *arg) {
    _ddp_grow_watch_t *w = (_ddp_grow_watch_t *)arg;
    ddp_comm_t *c = w->c;
    ddp_store_t *st = NULL;
    ddp_store_desc_t sd;
    char err[512] = "";
    int said = 0;
    memset(&sd, 0, sizeof sd);
    sd.timeout_ms = c->eng.timeout_ms < 0 || c->eng.timeout_ms > 5000 ? 5000 : c->eng.timeout_ms;
    sd.log_level = DDP_LOG_WARN + 1;
    sd.log_rank = c->eng.rank + 1;
    sd.secret = "";   /* takes the communicator's client's stretched key */
    pthread_mutex_lock(&w->mu);
    while (!w->stop) {
        int64_t t = 0, h = 0;
        struct timespec ts;
        pthread_mutex_unlock(&w->mu);
        if (!st && _ddp_store_client_like(&st, c->boot.store, &sd, err, sizeof err) != DDP_SUCCESS) {
            if (st) { ddp_store_close(st); st = NULL; }
        }
        if (st && _ddp_grow_counter(st, w->tickets, 0, &t) == DDP_SUCCESS &&
            _ddp_grow_counter(st, w->handled, 0, &h) == DDP_SUCCESS) {
            int n = t > h ? (int)(t - h > INT_MAX ? INT_MAX : t - h) : 0;
            if (n != __atomic_load_n(&c->grow.waiting, __ATOMIC_RELAXED))
                _DDP_LOG(c, DDP_LOG_INFO, "joiners: %d waiting to be admitted (tickets %lld, handled %lld)",
                         n, (long long)t, (long long)h);
            __atomic_store_n(&c->grow.waiting, n, __ATOMIC_RELEASE);
            said = 0;
        } else if (!said) {
            _DDP_LOG(c, DDP_LOG_INFO, "joiners: the watcher cannot ask the store (%s); trying again "
                     "every %d ms", st ? ddp_store_last_error(st) : err, w->poll_ms);
            said = 1;
            if (st) { ddp_store_close(st); st = NULL; }
        }
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_sec += w->poll_ms / 1000;
        ts.tv_nsec += (long)(w->poll_ms % 1000) * 1000000L;
        if (ts.tv_nsec >= 1000000000L) { ts.tv_sec++; ts.tv_nsec -= 1000000000L; }
        pthread_mutex_lock(&w->mu);
        if (!w->stop) pthread_cond_timedwait(&w->cv, &w->mu, &ts);
    }
    pthread_mutex_unlock(&w->mu);
    if (st) ddp_store_close(st);
    return NULL;
}

/* At destroy. A healthy communicator that looked for joiners and goes away unreplaced (not
 * grown, not shrunk: the job is ending) closes the job to joiners: rank 0 says so in the store,
 * so a joiner still waiting fails at once instead of at its timeout. */
static void _ddp_grow_watch_stop(ddp_comm_t *c) {
    _ddp_grow_watch_t *w = (_ddp_grow_watch_t *)c->grow.watch;
    c->grow.watch_stop = NULL;
    c->grow.watch = NULL;
    if (!c->forked && c->eng.rank == 0 && !c->grow.retired && !c->shrink.revoked && c->boot.store &&
        !c->boot.foreign && __atomic_load_n(&c->error, __ATOMIC_SEQ_CST) == DDP_SUCCESS) {
        char key[256];
        _ddp_root_key(c, key, sizeof key, "join/closed");
        _ddp_store_quick(c->boot.store, 1);
        ddp_store_set(c->boot.store, key, "destroyed", 9);
        _ddp_store_quick(c->boot.store, 0);
    }
    if (!w) return;
    if (w->started && !c->forked) {   /* a fork child has no thread to end: its copy goes */
        pthread_mutex_lock(&w->mu);
        w->stop = 1;
        pthread_cond_signal(&w->cv);
        pthread_mutex_unlock(&w->mu);
        pthread_join(w->thread, NULL);
    }
    if (!c->forked) {
        pthread_mutex_destroy(&w->mu);
        pthread_cond_destroy(&w->cv);
    }
    _ddp_free(&c->alloc, w);
}

_DDP_PRIVATE void _ddp_grow_watch_start(ddp_comm_t *c) {
    _ddp_grow_watch_t *w;
    long v;
    if (c->grow.watch || !c->boot.store || c->boot.foreign) return;
    if (!(w = (_ddp_grow_watch_t *)_ddp_alloc(&c->alloc, sizeof *w))) return;
    memset(w, 0, sizeof *w);
    w->c = c;
    w->poll_ms = _ddp_env_int("DDP_JOIN_POLL_MS", 1, 600000, &v) == 1 ? (int)v : 100;
    _ddp_root_key(c, w->tickets, sizeof w->tickets, "join/tickets");
    _ddp_root_key(c, w->handled, sizeof w->handled, "join/handled");
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
    c->grow.watch = w;   /* marks the attempt: a failed start is not retried every step */
    c->grow.watch_stop = _ddp_grow_watch_stop;
    if (pthread_create(&w->thread, NULL, _ddp_grow_watch_main, w) != 0) {
        _DDP_LOG(c, DDP_LOG_WARN, "joiners: cannot start the watcher thread (%s): "
                 "ddp_comm_joiners_waiting stays 0", strerror(errno));
        return;
    }
    w->started = 1;
    _DDP_LOG(c, DDP_LOG_INFO, "joiners: a watcher asks the store every %d ms (DDP_JOIN_POLL_MS) how many "
             "wait under %s", w->poll_ms, w->tickets);
}

DDP_API int ddp_comm_joiners_waiting(ddp_comm_t *c) {
    if (!c || !_ddp_live_check(c, 0)) return -1;
    if (!c->grow.watch) _ddp_grow_watch_start(c);
    return __atomic_load_n(&c->grow.waiting, __ATOMIC_ACQUIRE);
}

/* ---------------------------------------------------------------- members: ddp_comm_grow */
typedef struct {
    ddp_comm_t *c;
    int m, n, gen, accept_ms, build_ms, max_joiners;
    char base[160];                /* "<root>/grow<gen>.<k>" */
    int64_t *tickets;              /* n - m: the joiners seated, in rank order */
    int cap;                       /* room in tickets */
} _ddp_grow_t;

_DDP_PRIVATE void _ddp_grow_key(const _ddp_grow_t *g, char *out, size_t cap, const char *what, int64_t i) {
    if (i >= 0) snprintf(out, cap, "%s/%s/%lld", g->base, what, (long long)i);
    else snprintf(out, cap, "%s/%s", g->base, what);
}

/* Rank 0: seats for the joiners waiting, their answers, the plan. */
_DDP_PRIVATE ddp_result_t _ddp_grow_decide(_ddp_grow_t *g) {
    ddp_comm_t *c = g->c;
    ddp_store_t *st = c->boot.store;
    char key[256], seat[320], *plan;
    int64_t t = 0, h = 0, i, deadline;
    int n_offer, k, accepted = 0;
    size_t o, cap;
    ddp_result_t r;
    unsigned char *took;
    _ddp_root_key(c, key, sizeof key, "join/tickets");
    if ((r = _ddp_grow_counter(st, key, 0, &t)) != DDP_SUCCESS) return r;
    _ddp_root_key(c, key, sizeof key, "join/handled");
    if ((r = _ddp_grow_counter(st, key, 0, &h)) != DDP_SUCCESS) return r;
    n_offer = t > h ? (int)(t - h > _DDP_MAX_RANKS ? _DDP_MAX_RANKS : t - h) : 0;
    if (g->max_joiners > 0 && n_offer > g->max_joiners) n_offer = g->max_joiners;
    if (n_offer > _DDP_MAX_RANKS - g->m) n_offer = _DDP_MAX_RANKS - g->m;
    cap = (size_t)n_offer * 24 + 32;
    plan = (char *)_ddp_alloc(&c->alloc, cap);
    took = (unsigned char *)_ddp_calloc(&c->alloc, (size_t)n_offer + 1);
    if (!plan || !took) { _ddp_free(&c->alloc, plan); _ddp_free(&c->alloc, took); return DDP_ERR_OUT_OF_MEMORY; }
    /* The seat says where to build and how: generation, members, the members' transport and
     * timeout (a joiner's own settings may differ), the prefix. */
    snprintf(seat, sizeof seat, "%d %d %d %d %s %s", g->gen, g->m, c->eng.timeout_ms, g->build_ms,
             c->peers.transport_name[0] ? c->peers.transport_name : "-", g->base);
    for (k = 0; k < n_offer; k++) {
        _ddp_root_key(c, key, sizeof key, "join/seat/%lld", (long long)(h + k));
        if ((r = ddp_store_set(st, key, seat, strlen(seat))) != DDP_SUCCESS) goto done;
    }
    if (n_offer)
        _DDP_LOG(c, DDP_LOG_INFO, "grow %d: offering seats to joiner ticket(s) %lld..%lld; each has %d ms "
                 "to take it", g->gen, (long long)h, (long long)(h + n_offer - 1), g->accept_ms);
    deadline = _ddp_deadline(g->accept_ms);
    for (;;) {   /* every answer, or the deadline */
        int nap = 100;
        for (k = 0; k < n_offer; k++) {
            int exists = 0;
            if (took[k]) continue;
            _ddp_grow_key(g, key, sizeof key, "accept", h + k);
            if ((r = ddp_store_check(st, key, &exists)) != DDP_SUCCESS) goto done;
            if (exists) { took[k] = 1; accepted++; }
        }
        if (accepted == n_offer || _ddp_ms_left(deadline) == 0) break;
        _ddp_shrink_nap(&nap);
    }
    o = (size_t)snprintf(plan, cap, "%d", g->m + accepted);
    for (k = 0; k < n_offer; k++) {
        if (took[k]) o += (size_t)snprintf(plan + o, cap - o, " %lld", (long long)(h + k));
        else _DDP_LOG(c, DDP_LOG_WARN, "grow %d: joiner ticket %lld did not take its seat within %d ms "
                      "(gone, or stopped): admitted without it", g->gen, (long long)(h + k), g->accept_ms);
    }
    _ddp_grow_key(g, key, sizeof key, "plan", -1);
    if ((r = ddp_store_set(st, key, plan, o)) != DDP_SUCCESS) goto done;
    _ddp_root_key(c, key, sizeof key, "join/handled");
    r = n_offer ? _ddp_grow_counter(st, key, n_offer, &i) : DDP_SUCCESS;
done:
    _ddp_free(&c->alloc, plan);
    _ddp_free(&c->alloc, took);
    return r;
}

/* Everyone: the plan ("<world> <ticket>..."): the world size and, into g->tickets, the
 * joiners' tickets in rank order. */
_DDP_PRIVATE ddp_result_t _ddp_grow_read_plan(ddp_store_t *st, _ddp_grow_t *g, const char *key) {
    char *plan;
    const char *p;
    int used = 0, k = 0;
    long long t;
    size_t cap = (size_t)_DDP_MAX_RANKS * 24 + 32;
    ddp_result_t r;
    if (!(plan = (char *)_ddp_alloc(&g->c->alloc, cap))) return DDP_ERR_OUT_OF_MEMORY;
    if ((r = _ddp_grow_get(st, key, plan, cap)) != DDP_SUCCESS) goto done;
    if (sscanf(plan, "%d%n", &g->n, &used) != 1 || g->n < g->m || g->n > _DDP_MAX_RANKS) { r = DDP_ERR_INTERNAL; goto done; }
    for (p = plan + used; k < g->n - g->m && sscanf(p, "%lld%n", &t, &used) == 1; p += used) {
        if (k < g->cap) g->tickets[k] = t;
        k++;
    }
    if (k != g->n - g->m) r = DDP_ERR_INTERNAL;
done:
    _ddp_free(&g->c->alloc, plan);
    return r;
}

/* Everyone of the plan: whether every rank built the communicator ("ok"), or who did not. The
 * verdict is one compare-and-set: every rank reads the same one. *missing: the lowest new rank
 * that did not say (-1: all said). */
_DDP_PRIVATE ddp_result_t _ddp_grow_verdict(ddp_store_t *st, const char *base, int n, int me, int built,
                                            int wait_ms, int *ok, int *missing) {
    char key[256], val[16];
    int64_t deadline = _ddp_deadline(wait_ms);
    int i, nap = 100, exists = 0;
    ddp_result_t r;
    size_t len = 0;
    *missing = -1;
    snprintf(key, sizeof key, "%s/built/%d", base, me);
    if ((r = ddp_store_set(st, key, built ? "ok" : "fail", built ? 2 : 4)) != DDP_SUCCESS) return r;
    for (;;) {
        int nok = 0, said = 0;
        const char *want = NULL;
        snprintf(key, sizeof key, "%s/verdict", base);
        if ((r = ddp_store_check(st, key, &exists)) != DDP_SUCCESS) return r;
        if (exists) break;
        *missing = -1;
        for (i = 0; i < n; i++) {
            snprintf(key, sizeof key, "%s/built/%d", base, i);
            if ((r = ddp_store_check(st, key, &exists)) != DDP_SUCCESS) return r;
            if (!exists) { if (*missing < 0) *missing = i; continue; }
            said++;
            if ((r = ddp_store_get(st, key, val, sizeof val - 1, &len)) != DDP_SUCCESS) return r;
            if (len == 2 && !memcmp(val, "ok", 2)) nok++;
        }
        if (nok == n) want = "ok";
        else if (said == n || _ddp_ms_left(deadline) == 0) want = "fail";
        if (want) {
            snprintf(key, sizeof key, "%s/verdict", base);
            r = ddp_store_compare_set(st, key, NULL, 0, want, strlen(want), val, sizeof val - 1, &len);
            if (r != DDP_SUCCESS) return r;
            break;
        }
        _ddp_shrink_nap(&nap);
    }
    snprintf(key, sizeof key, "%s/verdict", base);
    if ((r = ddp_store_get(st, key, val, sizeof val - 1, &len)) != DDP_SUCCESS) return r;
    *ok = len == 2 && !memcmp(val, "ok", 2);
    if (*ok) *missing = -1;
    return DDP_SUCCESS;
}

/* The grown communicator learns where it came from: generation, root, which ranks joined. */
_DDP_PRIVATE ddp_result_t _ddp_grow_mark(ddp_comm_t *child, int gen, int root_len, int m, int joined) {
    int i;
    child->shrink.generation = gen;
    child->shrink.root_len = root_len;
    child->grow.members = m;
    child->grow.joined = joined;
    child->shrink.parent_ranks = (int *)_ddp_alloc(&child->alloc, sizeof(int) * (size_t)child->eng.nranks);
    if (!child->shrink.parent_ranks) return DDP_ERR_OUT_OF_MEMORY;
    for (i = 0; i < child->eng.nranks; i++) child->shrink.parent_ranks[i] = i < m ? i : -1;
    return DDP_SUCCESS;
}

/* A member's communicator after a grow: every call on it fails from now on, saying to use the
 * new one (quietly: nothing failed); its connections close (the new communicator has its
 * own); the store handle goes to the new one. No async request is pending (checked first). */
_DDP_PRIVATE void _ddp_grow_retire(ddp_comm_t *c, ddp_comm_t *child, int gen) {
    int i;
    for (i = 0; i < (c->queue.nlanes > 0 ? c->queue.nlanes : 1); i++) {
        ddp_comm_t *x = i ? c->queue.lanes[i].exec : c;
        snprintf(x->last_error, sizeof x->last_error, "rank %d: retired by ddp_comm_grow (generation %d): use "
                 "the new communicator [%s]", x->eng.rank, gen, ddp_strerror(DDP_ERR_ABORTED));
        __atomic_store_n(&x->error, DDP_ERR_ABORTED, __ATOMIC_SEQ_CST);
        if (!i) _ddp_note_closed(x);
        _ddp_close_peers(x);
    }
    c->grow.retired = 1;
    c->shrink.revoked = 1;
    if (child->boot.store == c->boot.store && c->boot.own_store) {
        child->boot.own_store = 1;
        c->boot.own_store = 0;
    }
    if (c->boot.extra_store && !child->boot.extra_store) {
        child->boot.extra_store = c->boot.extra_store;
        c->boot.extra_store = NULL;
    }
}

_DDP_PRIVATE int _ddp_grow_build_ms(const ddp_comm_t *c, const ddp_grow_opts_t *o) {
    if (o && o->timeout_ms > 0) return o->timeout_ms;
    if (o && o->timeout_ms < 0) return c->eng.timeout_ms;
    return c->eng.timeout_ms < 0 || c->eng.timeout_ms > _DDP_GROW_DEFAULT_BUILD_MS ? _DDP_GROW_DEFAULT_BUILD_MS
                                                                                   : c->eng.timeout_ms;
}

_DDP_PRIVATE ddp_result_t _ddp_grow_check(ddp_comm_t *c, const ddp_grow_opts_t *opts, ddp_comm_t **out) {
    ddp_result_t r;
    if (out) *out = NULL;
    if (!c) return DDP_ERR_INVALID_ARGUMENT;
    if ((r = _ddp_usable(c)) != DDP_SUCCESS) return r;
    if (!out) return ddp_comm_fail(c, DDP_ERR_INVALID_ARGUMENT, "comm_grow: NULL newcomm");
    if (opts && (opts->max_joiners < 0 || opts->accept_ms < 0))
        return ddp_comm_fail(c, DDP_ERR_INVALID_ARGUMENT, "comm_grow: max_joiners %d and accept_ms %d "
                             "must be >= 0", opts->max_joiners, opts->accept_ms);
    if (c->grow.retired || c->shrink.revoked)
        return ddp_comm_fail(c, DDP_ERR_INVALID_USAGE, "comm_grow: this communicator was %s already: "
                             "use the one that returned", c->grow.retired ? "grown" : "shrunk");
    if ((r = (ddp_result_t)__atomic_load_n(&c->error, __ATOMIC_SEQ_CST)) != DDP_SUCCESS)
        return ddp_comm_fail(c, r, "comm_grow: the communicator failed before (%s): shrink it first",
                             ddp_strerror(r));
    if (!c->boot.store || c->boot.foreign)
        return ddp_comm_fail(c, DDP_ERR_UNSUPPORTED, "comm_grow: %s", c->boot.store ? "the rendezvous "
                             "store belongs to another job" : "no rendezvous store");
    if (c->queue.progress_on &&
        __atomic_load_n(&c->queue.finished, __ATOMIC_ACQUIRE) < __atomic_load_n(&c->queue.issued, __ATOMIC_ACQUIRE))
        return ddp_comm_fail(c, DDP_ERR_INVALID_USAGE, "comm_grow: async requests are pending: grow at a "
                             "step boundary (wait for them first)");
    return DDP_SUCCESS;
}

/* The members' part after the plan: build, verdict, adopt or report. */
_DDP_PRIVATE ddp_result_t _ddp_grow_finish(_ddp_grow_t *g, ddp_comm_t **out, int64_t t0) {
    ddp_comm_t *c = g->c, *child = NULL;
    ddp_comm_desc_t d;
    _ddp_parent_t from;
    char prefix[192];
    int ok = 0, missing = -1;
    ddp_result_t r;
    snprintf(prefix, sizeof prefix, "%s/c", g->base);
    _ddp_child_desc(c, prefix, &d);
    memset(&from, 0, sizeof from);
    from.rendezvous_ms = g->build_ms;
    r = _ddp_comm_init(&child, g->n, c->eng.rank, &d, &from);
    if (r != DDP_SUCCESS)
        _DDP_LOG(c, DDP_LOG_WARN, "comm_grow %d: building the grown communicator failed: %s", g->gen,
                 ddp_last_init_error());
    r = _ddp_grow_verdict(c->boot.store, prefix, g->n, c->eng.rank, child != NULL, 2 * g->build_ms + 1000,
                          &ok, &missing);
    if (r != DDP_SUCCESS || !ok) {
        if (child) { _ddp_abort_internal(child, DDP_ERR_ABORTED, "comm_grow failed"); ddp_comm_destroy(child); }
        if (r != DDP_SUCCESS)
            return ddp_comm_fail(c, r, "comm_grow %d: verdict: the store did not answer (%s)", g->gen,
                                 ddp_store_last_error(c->boot.store));
        if (missing >= 0 && missing < g->m) {
            c->shrink.suspect = missing;   /* the shrink that follows blames it */
            c->shrink.has_suspect = 1;
            return ddp_comm_fail(c, DDP_ERR_REMOTE, "comm_grow %d: member rank %d did not build the "
                                 "grown communicator (lost, or not calling ddp_comm_grow): shrink",
                                 g->gen, missing);
        }
        _DDP_LOG(c, DDP_LOG_WARN, "comm_grow %d: not every joiner built the communicator (new rank %d "
                 "%s): going on with the %d members; the joiners still alive wait for the next grow",
                 g->gen, missing, missing >= 0 ? "never said" : "failed", g->m);
        return DDP_SUCCESS;
    }
    if ((r = _ddp_grow_mark(child, g->gen, c->shrink.root_len > 0 ? c->shrink.root_len
                            : (int)strlen(c->boot.prefix), g->m, 0)) != DDP_SUCCESS) {
        ddp_comm_destroy(child);
        return ddp_comm_fail(c, r, "comm_grow");
    }
    _ddp_grow_retire(c, child, g->gen);
    _DDP_LOG(c, DDP_LOG_INFO, "comm_grow %d: %d -> %d ranks in %.1f ms (joiners at ranks %d..%d)",
             g->gen, g->m, g->n, (double)(_ddp_now_us() - t0) / 1000.0, g->m, g->n - 1);
    *out = child;
    return DDP_SUCCESS;
}

DDP_API ddp_result_t ddp_comm_grow(ddp_comm_t *c, const ddp_grow_opts_t *opts, ddp_comm_t **out) {
    _ddp_grow_t g;
    char key[256];
    int exists = 0;
    int64_t t0 = _ddp_now_us();
    ddp_result_t r;
    if ((r = _ddp_grow_check(c, opts, out)) != DDP_SUCCESS) return r;
    memset(&g, 0, sizeof g);
    g.c = c;
    g.m = c->eng.nranks;
    g.gen = c->shrink.generation + 1;
    g.accept_ms = opts && opts->accept_ms ? opts->accept_ms : _DDP_GROW_DEFAULT_ACCEPT_MS;
    g.build_ms = _ddp_grow_build_ms(c, opts);
    g.max_joiners = opts ? opts->max_joiners : 0;
    _ddp_root_key(c, g.base, sizeof g.base, "grow%d.%u", g.gen, c->grow.grows++);
    /* Every member here first: one that is lost fails the barrier at once, naming it (the
     * communicator is then failed: shrink it), and rank 0 seats nobody for a grow that cannot
     * happen. */
    {
        _ddp_op_t barrier = _ddp_op_make(DDP_CALL_BARRIER, NULL, NULL, 0, DDP_UINT8, DDP_MAX, 0);
        if ((r = _ddp_exec(c, &barrier)) != DDP_SUCCESS) return r;
    }
    if (strlen(g.base) + 8 >= sizeof c->boot.prefix)
        return ddp_comm_fail(c, DDP_ERR_INVALID_USAGE, "comm_grow: the store prefix %s is too long for a "
                             "grow's keys", c->boot.prefix);
    if (c->eng.rank == 0 && (r = _ddp_grow_decide(&g)) != DDP_SUCCESS)
        return ddp_comm_fail(c, r, "comm_grow %d: admitting the joiners: the store did not answer (%s)",
                             g.gen, ddp_store_last_error(c->boot.store));
    _ddp_grow_key(&g, key, sizeof key, "plan", -1);
    /* Rank 0 decides: the others wait for it as for any collective (the timeout). */
    if ((r = _ddp_grow_await(c->boot.store, key, _ddp_deadline(c->eng.timeout_ms), &exists)) != DDP_SUCCESS || !exists) {
        if (r == DDP_SUCCESS) { c->shrink.suspect = 0; c->shrink.has_suspect = 1; }   /* a shrink blames it */
        return ddp_comm_fail(c, r != DDP_SUCCESS ? r : DDP_ERR_TIMEOUT, "comm_grow %d: rank 0 did not "
                             "decide within %d ms (lost, or not calling ddp_comm_grow)%s", g.gen,
                             c->eng.timeout_ms, r != DDP_SUCCESS ? ": the store did not answer" : "");
    }
    if ((r = _ddp_grow_read_plan(c->boot.store, &g, key)) != DDP_SUCCESS)
        return ddp_comm_fail(c, r, "comm_grow %d: reading the plan", g.gen);
    if (g.n == g.m) {
        _DDP_LOG(c, DDP_LOG_INFO, "comm_grow %d: nobody to admit; the communicator goes on with %d ranks",
                 g.gen, g.m);
        return DDP_SUCCESS;
    }
    return _ddp_grow_finish(&g, out, t0);
}

DDP_API int ddp_comm_grow_members(const ddp_comm_t *c) {
    if (!c || !_ddp_live_check(c, 0)) return -1;
    return c->grow.members > 0 ? c->grow.members : c->eng.nranks;
}

DDP_API int ddp_comm_joined(const ddp_comm_t *c) {
    return c && _ddp_live_check(c, 0) ? c->grow.joined : 0;
}

/* ---------------------------------------------------------------- joiners: ddp_comm_join */
typedef struct {
    ddp_comm_t *lobby;             /* settings and the store only */
    int64_t ticket, deadline;
    int timeout_ms;
} _ddp_joiner_t;

/* The job this store serves, as its first rank wrote it: a joiner of another job is refused
 * before it takes a ticket. Waits (to the join deadline) for a job that has not started yet. */
_DDP_PRIVATE ddp_result_t _ddp_join_check_job(_ddp_joiner_t *j) {
    ddp_comm_t *c = j->lobby;
    char key[256], theirs[sizeof c->boot.job];
    int exists = 0;
    ddp_result_t r;
    _ddp_root_key(c, key, sizeof key, "job");
    if ((r = _ddp_grow_await(c->boot.store, key, j->deadline, &exists)) != DDP_SUCCESS)
        return ddp_comm_fail(c, r, "comm_join: the store: %s", ddp_store_last_error(c->boot.store));
    if (!exists)
        return ddp_comm_fail(c, DDP_ERR_TIMEOUT, "comm_join: no job under %s/ in the store at %s:%d "
                             "within %d ms (not started, or another store prefix)", c->boot.prefix,
                             c->boot.master_addr, c->boot.master_port, j->timeout_ms);
    if ((r = _ddp_grow_get(c->boot.store, key, theirs, sizeof theirs)) != DDP_SUCCESS)
        return ddp_comm_fail(c, r, "comm_join: the store: %s", ddp_store_last_error(c->boot.store));
    if (strcmp(theirs, c->boot.job) != 0) {
        c->boot.foreign = 1;
        return ddp_comm_fail(c, DDP_ERR_MISMATCH, "comm_join: refused: this process belongs to job '%s' "
                             "but the store at %s:%d serves job '%s'", c->boot.job[0] ? c->boot.job : "(none)",
                             c->boot.master_addr, c->boot.master_port, theirs[0] ? theirs : "(none)");
    }
    return DDP_SUCCESS;
}

/* A ticket, and a note of who holds it (for people reading the store). */
_DDP_PRIVATE ddp_result_t _ddp_join_take_ticket(_ddp_joiner_t *j) {
    ddp_comm_t *c = j->lobby;
    char key[256], who[320], host[256];
    int64_t t = 0;
    ddp_result_t r;
    _ddp_root_key(c, key, sizeof key, "join/tickets");
    if ((r = _ddp_grow_counter(c->boot.store, key, 1, &t)) != DDP_SUCCESS) return r;
    j->ticket = t - 1;
    if (gethostname(host, sizeof host) != 0) _ddp_strlcpy(host, "?", sizeof host);
    host[sizeof host - 1] = 0;
    snprintf(who, sizeof who, "%.200s %d", host, (int)getpid());
    _ddp_root_key(c, key, sizeof key, "join/who/%lld", (long long)j->ticket);
    r = ddp_store_set(c->boot.store, key, who, strlen(who));
    _DDP_LOG(c, DDP_LOG_INFO, "comm_join: waiting to be admitted: ticket %lld under %s/join (store %s:%d)",
             (long long)j->ticket, c->boot.prefix, c->boot.master_addr, c->boot.master_port);
    return r;
}

/* One admission: the seat, taking it, the plan, the build, the verdict. *child on success;
 * *again = 1 when this joiner was left out and must take a new ticket. */
_DDP_PRIVATE ddp_result_t _ddp_join_admission(_ddp_joiner_t *j, const char *seat, ddp_comm_t **child, int *again) {
    ddp_comm_t *c = j->lobby;
    ddp_store_t *st = c->boot.store;
    _ddp_grow_t g;
    char key[256], transport[40], base[160], prefix[192];
    int gen = 0, members = 0, tmo = 0, exists = 0, k, me = -1, ok = 0, missing = -1;
    int64_t *tk = NULL;
    int build_ms = 0;
    ddp_comm_desc_t d;
    _ddp_parent_t from;
    ddp_result_t r;
    *again = 0;
    if (sscanf(seat, "%d %d %d %d %39s %159s", &gen, &members, &tmo, &build_ms, transport, base) != 6 ||
        members < 1 || build_ms < 1)
        return ddp_comm_fail(c, DDP_ERR_INTERNAL, "comm_join: a malformed seat '%.100s'", seat);
    snprintf(key, sizeof key, "%s/accept/%lld", base, (long long)j->ticket);
    if ((r = ddp_store_set(st, key, "1", 1)) != DDP_SUCCESS) return r;
    _DDP_LOG(c, DDP_LOG_INFO, "comm_join: took a seat in grow %d of %d members (ticket %lld)", gen, members,
             (long long)j->ticket);
    /* The plan comes once rank 0 heard every seated joiner, or its accept window closed. */
    snprintf(key, sizeof key, "%s/plan", base);
    if ((r = _ddp_grow_await(st, key, _ddp_deadline(tmo > 0 ? tmo : -1), &exists)) != DDP_SUCCESS) return r;
    if (!exists) { *again = 1; return DDP_SUCCESS; }
    memset(&g, 0, sizeof g);
    g.c = c;
    g.m = members;
    g.cap = _DDP_MAX_RANKS;
    if (!(tk = (int64_t *)_ddp_alloc(&c->alloc, sizeof *tk * (size_t)g.cap))) return DDP_ERR_OUT_OF_MEMORY;
    g.tickets = tk;
    if ((r = _ddp_grow_read_plan(st, &g, key)) != DDP_SUCCESS) goto done;
    for (k = 0; k < g.n - g.m; k++) if (tk[k] == j->ticket) me = g.m + k;
    if (me < 0) {
        _DDP_LOG(c, DDP_LOG_WARN, "comm_join: grow %d went on without ticket %lld (it took its seat too "
                 "late): waiting for the next one with a new ticket", gen, (long long)j->ticket);
        *again = 1;
        goto done;
    }
    snprintf(prefix, sizeof prefix, "%s/c", base);
    _ddp_child_desc(c, prefix, &d);
    d.transport = strcmp(transport, "-") ? transport : NULL;
    d.timeout_ms = tmo;
    memset(&from, 0, sizeof from);
    from.rendezvous_ms = build_ms;
    r = _ddp_comm_init(child, g.n, me, &d, &from);
    if (r != DDP_SUCCESS)
        _DDP_LOG(c, DDP_LOG_WARN, "comm_join: building the grown communicator failed: %s", ddp_last_init_error());
    r = _ddp_grow_verdict(st, prefix, g.n, me, *child != NULL, 2 * from.rendezvous_ms + 1000, &ok, &missing);
    if (r != DDP_SUCCESS || !ok) {
        if (*child) { _ddp_abort_internal(*child, DDP_ERR_ABORTED, "comm_join: not admitted"); ddp_comm_destroy(*child); }
        *child = NULL;
        if (r == DDP_SUCCESS) {
            _DDP_LOG(c, DDP_LOG_WARN, "comm_join: grow %d failed (new rank %d did not build it): waiting for "
                     "the next one with a new ticket", gen, missing);
            *again = 1;
        }
        goto done;
    }
    r = _ddp_grow_mark(*child, gen, (int)strlen(c->boot.prefix), g.m, 1);
    if (r != DDP_SUCCESS) { ddp_comm_destroy(*child); *child = NULL; }
done:
    _ddp_free(&c->alloc, tk);
    return r;
}

/* Waits for a seat (to the join deadline), saying every 10 s what it waits for; fails at once
 * when the job ended (its members destroyed their communicator). */
_DDP_PRIVATE ddp_result_t _ddp_join_wait_seat(_ddp_joiner_t *j, char *seat, size_t cap) {
    ddp_comm_t *c = j->lobby;
    char key[256], closed[256];
    int exists = 0, nap = 100;
    int64_t t0 = _ddp_now_us(), next_note = t0 + 10000000;
    ddp_result_t r;
    _ddp_root_key(c, key, sizeof key, "join/seat/%lld", (long long)j->ticket);
    _ddp_root_key(c, closed, sizeof closed, "join/closed");
    for (;;) {
        if ((r = ddp_store_check(c->boot.store, key, &exists)) != DDP_SUCCESS) return r;
        if (exists) return _ddp_grow_get(c->boot.store, key, seat, cap);
        if ((r = ddp_store_check(c->boot.store, closed, &exists)) != DDP_SUCCESS) return r;
        if (exists)
            return ddp_comm_fail(c, DDP_ERR_ABORTED, "comm_join: the job ended before admitting this joiner "
                                 "(ticket %lld): its members destroyed their communicator", (long long)j->ticket);
        if (_ddp_ms_left(j->deadline) == 0)
            return ddp_comm_fail(c, DDP_ERR_TIMEOUT, "comm_join: not admitted within %d ms (ticket %lld): "
                                 "the members never called ddp_comm_grow", j->timeout_ms, (long long)j->ticket);
        if (_ddp_now_us() >= next_note) {
            _DDP_LOG(c, DDP_LOG_INFO, "comm_join: still waiting to be admitted (ticket %lld, %.0f s so far): the "
                     "members admit joiners when they call ddp_comm_grow", (long long)j->ticket,
                     (double)(_ddp_now_us() - t0) / 1e6);
            next_note += 10000000;
        }
        _ddp_shrink_nap(&nap);
    }
}

DDP_API ddp_result_t ddp_comm_join(ddp_comm_t **out, const ddp_comm_desc_t *desc, const ddp_join_opts_t *opts) {
    _ddp_joiner_t j;
    ddp_comm_desc_t zero;
    ddp_comm_t *child = NULL;
    const char *forced = NULL;
    char seat[320];
    long v;
    ddp_result_t r;
    int again = 1;
    if (!out) return _ddp_init_refuse(DDP_ERR_INVALID_ARGUMENT, "comm_join: NULL newcomm");
    *out = NULL;
    memset(&j, 0, sizeof j);
    j.timeout_ms = opts && opts->timeout_ms ? opts->timeout_ms
                 : _ddp_env_int("DDP_JOIN_TIMEOUT_MS", -1, INT_MAX, &v) == 1 && v ? (int)v : _DDP_JOIN_DEFAULT_MS;
    j.deadline = _ddp_deadline(j.timeout_ms);
    if (!desc) { memset(&zero, 0, sizeof zero); desc = &zero; }
    /* The lobby: settings and a client of the store, never its server (rank 1 of 2: where rank 0
     * of the job serves the store, the lobby must not try to). */
    if ((r = _ddp_comm_new(&j.lobby, 2, 1, desc, &forced)) != DDP_SUCCESS) return r;
    if ((r = _ddp_init_store(j.lobby, desc)) != DDP_SUCCESS) goto fail;
    if ((r = _ddp_join_check_job(&j)) != DDP_SUCCESS) goto fail;
    while (again) {
        if ((r = _ddp_join_take_ticket(&j)) != DDP_SUCCESS) {
            r = ddp_comm_fail(j.lobby, r, "comm_join: taking a ticket: %s", ddp_store_last_error(j.lobby->boot.store));
            goto fail;
        }
        if ((r = _ddp_join_wait_seat(&j, seat, sizeof seat)) != DDP_SUCCESS) goto fail;
        if ((r = _ddp_join_admission(&j, seat, &child, &again)) != DDP_SUCCESS) {
            r = ddp_comm_fail(j.lobby, r, "comm_join: admission: %s", j.lobby->last_error[0] ? j.lobby->last_error
                              : ddp_store_last_error(j.lobby->boot.store));
            goto fail;
        }
    }
    if (child->boot.store == j.lobby->boot.store && j.lobby->boot.own_store) {
        child->boot.own_store = 1;
        j.lobby->boot.own_store = 0;
    }
    _DDP_LOG(child, DDP_LOG_INFO, "comm_join: admitted as rank %d of %d (generation %d, ticket %lld)",
             child->eng.rank, child->eng.nranks, child->shrink.generation, (long long)j.ticket);
    ddp_comm_destroy(j.lobby);
    *out = child;
    return DDP_SUCCESS;
fail:
    {   /* the lobby's "rank 1" means nothing to the user: a joiner has no rank yet */
        char body[900];
        snprintf(_ddp_init_error, sizeof _ddp_init_error, "joiner (pid %d): %s [%s]", (int)getpid(),
                 _ddp_error_body(j.lobby->last_error, body, sizeof body), ddp_strerror(r));
    }
    ddp_comm_destroy(j.lobby);
    return r;
}

/* Under a launcher: the ranks from the environment; a replacement (DDP_ELASTIC_JOIN=1) joins. */
DDP_API ddp_result_t ddp_comm_init_env(ddp_comm_t **out, const ddp_comm_desc_t *d) {
    const char *join = getenv("DDP_ELASTIC_JOIN");
    if (join && !strcmp(join, "1")) {
        if (_ddp_log_level_from_env() >= DDP_LOG_INFO && !(d && d->log_level))
            _ddp_log_str(0, DDP_LOG_INFO, "init: DDP_ELASTIC_JOIN=1: joining the running job (ddp_comm_join)");
        return ddp_comm_join(out, d, NULL);
    }
    return _ddp_comm_init_env(out, d);
}

#ifdef __cplusplus
}
#endif

#endif /* DDP_COMM_GROW_IMPLEMENTATION */
