/* SPDX-License-Identifier: MIT (see LICENSE) */
/* ddp_comm_shrink.h — shrinking a communicator after ranks were lost (ULFM's revoke, agree and
 * shrink; NCCL's ncclCommShrink): the survivors of a failed call agree, through the rendezvous
 * store, on who is still there and build a communicator of their own, ranks renumbered densely
 * in their old order, over new connections. A rank left out (stopped, or too slow) is fenced:
 * its calls on the old communicator fail with DDP_ERR_REMOVED.
 *
 *     ddp_comm_t *next;
 *     if (ddp_all_reduce(g, g, n, DDP_FLOAT32, DDP_SUM, comm) != DDP_SUCCESS) {
 *         if (ddp_comm_shrink(comm, NULL, &next) != DDP_SUCCESS) return fail;   // out, or too few
 *         ddp_comm_destroy(comm);          // waits on nobody
 *         comm = next;                     // redo the step with ddp_comm_size(comm) ranks
 *     }
 *
 * How (docs/elastic.md has the whole story), under "<prefix>/shrink<g>" in the parent's store
 * (<prefix>: the first communicator's of the line, so keys do not grow), g = the new
 * communicator's generation:
 *  1. Revoke: this rank aborts the parent (a call still running on it, the progress thread's,
 *     ends within ~100 ms), notes "closed/<rank>" (it closes on purpose: it is alive) and closes
 *     its connections, so a peer still blocked in the parent fails at once and shrinks too.
 *  2. Agree (attempt k): each rank checks in under attempt<k>/in/<rank> with the peer its
 *     failure blamed. A rank that did not check in is dead when a rank that did blames it and it
 *     never noted "closed" (it closed nothing on purpose: its process ended, or it stopped and
 *     a timeout named it). Whoever first sees every candidate checked in or dead, or the
 *     deadline pass, proposes the checked-in ranks with compare-and-set on attempt<k>/members:
 *     one proposal wins, everyone reads the same one. Fenced ranks find it under "decided".
 *  3. Build: the members init a communicator under attempt<k> (the parent's transport), and
 *     agree, compare-and-set again, on a verdict: "ok" once every member built it, "retry" as
 *     soon as one could not (a member died meanwhile) or at the deadline; on "retry" each
 *     destroys its child and attempt k+1 starts with attempt k's members.
 * Each phase is bounded (opts.timeout_ms); a shrink ends with a communicator, DDP_ERR_REMOVED,
 * or a failure naming the phase, never a hang.
 *
 * Transports: TCP, shared memory and threads as ranks build the child as any communicator;
 * RDMA too (new queue pairs). NCCL: a split's device communicator comes from ncclCommSplit,
 * which is collective over the parent's ranks, the dead included, so a shrink's child does not
 * inherit one: its init sets up a new NCCL communicator among the survivors (through the
 * store). The store must outlive the lost rank: a launcher's (ddprun's, torchrun's agent) does;
 * where rank 0 serves it and rank 0 is lost, the shrink fails, saying so.
 *
 * Users include ddp.h (ddp_comm.h includes this). Depends on ddp_comm_init.h. Built by
 * DDP_IMPLEMENTATION (or DDP_COMM_SHRINK_IMPLEMENTATION).
 */
#if defined(DDP_IMPLEMENTATION) && !defined(DDP_COMM_SHRINK_IMPLEMENTATION)
#define DDP_COMM_SHRINK_IMPLEMENTATION
#endif
#if defined(DDP_COMM_SHRINK_IMPLEMENTATION)
#ifndef DDP_COMM_INIT_IMPLEMENTATION
#define DDP_COMM_INIT_IMPLEMENTATION
#endif
#endif
#include "ddp_comm_init.h"
#include "ddp_comm_types.h"

#ifndef DDP_COMM_SHRINK_H_INCLUDED
#define DDP_COMM_SHRINK_H_INCLUDED

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ddp_shrink_opts {   /* zero = defaults */
    int timeout_ms;                /* bound on each phase (agreement, verdict) of each attempt:
                                    * how long a rank that neither checked in nor is known dead
                                    * is waited for. 0: twice the communicator's timeout + 1 s
                                    * (a live rank blocked on a stopped one fails only at its
                                    * own timeout); < 0: forever */
    int min_ranks;                 /* fewer survivors than this: fail (0: 1) */
} ddp_shrink_opts_t;

/* Called by every survivor after a call on comm failed (or to drop ranks that stopped calling).
 * Returns in *newcomm the survivors' communicator: ranks renumbered densely in parent-rank
 * order, new connections, the parent's transport and settings. comm is revoked either way
 * (every call on it fails from now on) and must then be destroyed (that waits on nobody). A
 * rank the others went on without gets DDP_ERR_REMOVED (and *newcomm = NULL), naming the
 * generation; fewer than opts->min_ranks survivors, or a store that does not answer, fail. */
DDP_API ddp_result_t ddp_comm_shrink(ddp_comm_t *comm, const ddp_shrink_opts_t *opts, ddp_comm_t **newcomm);
/* rank's rank in the communicator comm was shrunk from; -1 if comm came from no shrink or rank
 * is out of range. */
DDP_API int ddp_comm_parent_rank(const ddp_comm_t *comm, int rank);
/* The parent ranks the shrink that made comm removed, in increasing order: up to cap of them
 * into ranks (may be NULL with cap 0); returns how many there are (0 if comm came from no shrink). */
DDP_API int ddp_comm_removed_ranks(const ddp_comm_t *comm, int *ranks, int cap);
/* Shrinks from the first communicator to this one (0 for one made by init or split). */
DDP_API int ddp_comm_generation(const ddp_comm_t *comm);

#ifdef __cplusplus
}
#endif
#endif /* DDP_COMM_SHRINK_H_INCLUDED */

/* ============================================================================================
 * IMPLEMENTATION
 * ========================================================================================== */
#if defined(DDP_COMM_SHRINK_IMPLEMENTATION) && !defined(DDP_COMM_SHRINK_IMPL_INCLUDED)
#define DDP_COMM_SHRINK_IMPL_INCLUDED
#if !defined(DDP_COMM_INIT_IMPL_INCLUDED)
#error "libddp: ddp_comm_shrink.h's implementation needs those of the headers below it (define DDP_IMPLEMENTATION)"
#endif

#ifdef __cplusplus
extern "C" {   /* the public calls defined here: C linkage, as declared above */
#endif

/* One shrink: the parent, where its keys live, the candidates of the current attempt. */
typedef struct {
    ddp_comm_t *c;
    int n, me, gen, attempt, timeout_ms, min_ranks;
    char base[160];                /* "<root prefix>/shrink<gen>" (_ddp_shrink_base) */
    unsigned char *cand;           /* n: a candidate of this attempt */
    unsigned char *member;         /* n: in this attempt's decision */
    int *blame;                    /* n: the peer each checked-in rank blamed (-1), -2: not in */
    signed char *closed;           /* n: 0 unknown, 1 noted closed (alive), -1 not noted */
    int nmembers;
    char story[512];               /* who was removed and why, for the logs */
} _ddp_shrink_t;

_DDP_PRIVATE void _ddp_shk(const _ddp_shrink_t *s, char *out, size_t cap, const char *fmt, ...)
#if defined(__GNUC__) || defined(__clang__)
    __attribute__((format(printf, 4, 5)))
#endif
    ;
_DDP_PRIVATE void _ddp_shk(const _ddp_shrink_t *s, char *out, size_t cap, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    _ddp_vkey(out, cap, s->base, (int)strlen(s->base), fmt, ap);
    va_end(ap);
}

/* A deadline for one phase: from now, the shrink's timeout (0: none). */
static inline int64_t _ddp_shrink_deadline(const _ddp_shrink_t *s) { return _ddp_deadline(s->timeout_ms); }

/* Naps between polls of the store: short at first (a shrink should take milliseconds when
 * everyone is there), then up to 10 ms. */
static inline void _ddp_shrink_nap(int *nap_us) {
    usleep((useconds_t)*nap_us);
    if (*nap_us < 10000) *nap_us *= 2;
}

/* "a b c" from a rank set, into out. */
_DDP_PRIVATE void _ddp_shrink_list(const unsigned char *set, int n, char *out, size_t cap) {
    size_t o = 0;
    int i;
    out[0] = 0;
    for (i = 0; i < n && o + 12 < cap; i++)
        if (set[i]) o += (size_t)snprintf(out + o, cap - o, "%s%d", o ? " " : "", i);
}

/* Parses "a b c" into set (cleared first); the count, or -1 if a rank is out of range. */
_DDP_PRIVATE int _ddp_shrink_parse(const char *text, unsigned char *set, int n) {
    int r, used = 0, count = 0;
    memset(set, 0, (size_t)n);
    for (; sscanf(text, "%d%n", &r, &used) == 1; text += used) {
        if (r < 0 || r >= n) return -1;
        if (!set[r]) count++;
        set[r] = 1;
    }
    return count;
}

/* Step 1: the parent ends here. Running work (the progress thread's) sees the abort within
 * ~100 ms; this rank notes that it closes on purpose, then closes its connections, so that a
 * peer still inside a call on the parent fails now instead of at its timeout. */
_DDP_PRIVATE ddp_result_t _ddp_shrink_revoke(_ddp_shrink_t *s) {
    ddp_comm_t *c = s->c;
    char key[256], val[64], why[128];
    int64_t deadline = _ddp_shrink_deadline(s);
    int i;
    snprintf(why, sizeof why, "revoked by ddp_comm_shrink (generation %d): use the new communicator", s->gen);
    _ddp_abort_internal(c, DDP_ERR_ABORTED, why);
    for (i = 1; i < c->queue.nlanes; i++) _ddp_abort_internal(c->queue.lanes[i].exec, DDP_ERR_ABORTED, why);
    /* The progress thread (if any) drains its queue: every request fails at once now. */
    while (c->queue.progress_on &&
           __atomic_load_n(&c->queue.finished, __ATOMIC_ACQUIRE) < __atomic_load_n(&c->queue.issued, __ATOMIC_ACQUIRE)) {
        if (_ddp_ms_left(deadline) == 0)
            return ddp_comm_fail(c, DDP_ERR_TIMEOUT, "comm_shrink: revoke: the parent's async requests "
                                 "did not end within %d ms", s->timeout_ms);
        usleep(1000);
    }
    while (__atomic_load_n(&c->queue.busy, __ATOMIC_SEQ_CST)) {
        if (_ddp_ms_left(deadline) == 0)
            return ddp_comm_fail(c, DDP_ERR_INVALID_USAGE, "comm_shrink: revoke: a call on the parent "
                                 "is still running in another thread after %d ms", s->timeout_ms);
        usleep(1000);
    }
    _ddp_abort_poison(c);          /* a healthy parent: poisoned now (no-op if it failed before) */
    _ddp_note_closed(c);
    _ddp_close_peers(c);
    for (i = 1; i < c->queue.nlanes; i++) _ddp_close_peers(c->queue.lanes[i].exec);
    c->shrink.revoked = 1;
    _ddp_shk(s, key, sizeof key, "revoked");
    snprintf(val, sizeof val, "%d %u", s->me, c->eng.seq);
    ddp_store_set(c->boot.store, key, val, strlen(val));   /* a note for people reading the store */
    return DDP_SUCCESS;
}

/* Whether candidate r, which has not checked in, is dead: a checked-in rank blamed it and r
 * never said it closed its connections on purpose. Writes who blamed it into *by. */
_DDP_PRIVATE ddp_result_t _ddp_shrink_dead(_ddp_shrink_t *s, int r, int *dead, int *by) {
    char key[256];
    int i, exists = 0;
    ddp_result_t e;
    *dead = 0;
    *by = -1;
    for (i = 0; i < s->n && *by < 0; i++)
        if (s->cand[i] && s->blame[i] == r) *by = i;
    if (*by < 0) return DDP_SUCCESS;
    if (s->closed[r] == 0) {
        /* r's connections closed (or r stopped) before its blamer looked; a live r notes
         * "closed" before it closes anything, so the answer cannot change later. */
        _ddp_key(s->c, key, sizeof key, "closed/%d", r);
        if ((e = ddp_store_check(s->c->boot.store, key, &exists)) != DDP_SUCCESS) return e;
        s->closed[r] = exists ? 1 : -1;
    }
    *dead = s->closed[r] < 0;
    return DDP_SUCCESS;
}

/* The story of a decision, for the logs: who is out, and who blamed them (as far as this rank
 * saw). */
_DDP_PRIVATE void _ddp_shrink_story(_ddp_shrink_t *s) {
    size_t o = 0;
    int i;
    s->story[0] = 0;
    for (i = 0; i < s->n && o + 64 < sizeof s->story; i++) {
        int j, by = -1;
        if (!s->cand[i] || s->member[i]) continue;
        for (j = 0; j < s->n && by < 0; j++) if (s->cand[j] && s->blame[j] == i) by = j;
        if (by >= 0) o += (size_t)snprintf(s->story + o, sizeof s->story - o, "%s%d (blamed by %d)", o ? ", " : "", i, by);
        else o += (size_t)snprintf(s->story + o, sizeof s->story - o, "%s%d (did not check in)", o ? ", " : "", i);
    }
    if (!o) _ddp_strlcpy(s->story, "none", sizeof s->story);
}

/* The fence: "<attempt> <members>" under "decided", what a removed rank's failed call finds. */
_DDP_PRIVATE void _ddp_shrink_post_fence(_ddp_shrink_t *s, const char *members, size_t cap) {
    char key[256], *fence = (char *)_ddp_alloc(&s->c->alloc, cap + 16);
    if (!fence) return;
    snprintf(fence, cap + 16, "%d %s", s->attempt, members);
    _ddp_shk(s, key, sizeof key, "decided");
    ddp_store_set(s->c->boot.store, key, fence, strlen(fence));
    _ddp_free(&s->c->alloc, fence);
}

/* The candidates that checked in since the last look: whom each blamed (s->blame, -2 while
 * not in). */
_DDP_PRIVATE ddp_result_t _ddp_shrink_read_checkins(_ddp_shrink_t *s) {
    char key[256], val[16];
    size_t len = 0;
    int i, exists = 0;
    ddp_result_t r;
    for (i = 0; i < s->n; i++) {
        if (!s->cand[i] || s->blame[i] != -2) continue;
        _ddp_shk(s, key, sizeof key, "attempt%d/in/%d", s->attempt, i);
        if ((r = ddp_store_check(s->c->boot.store, key, &exists)) != DDP_SUCCESS) return r;
        if (!exists) continue;
        if ((r = ddp_store_get(s->c->boot.store, key, val, sizeof val - 1, &len)) != DDP_SUCCESS) return r;
        val[len < sizeof val ? len : sizeof val - 1] = 0;
        s->blame[i] = atoi(val);
        if (s->blame[i] < -1 || s->blame[i] >= s->n) s->blame[i] = -1;
    }
    return DDP_SUCCESS;
}

/* Step 2: agreement on the members of this attempt. */
_DDP_PRIVATE ddp_result_t _ddp_shrink_agree(_ddp_shrink_t *s) {
    ddp_comm_t *c = s->c;
    ddp_store_t *st = c->boot.store;
    char key[256], val[16], *buf;
    size_t cap = (size_t)s->n * 12 + 64, len = 0;
    int64_t deadline = _ddp_shrink_deadline(s), next_note = _ddp_now_us() + 1000000;
    int i, nap = 100, exists, blame = -1;
    ddp_result_t r = DDP_SUCCESS;
    if (!(buf = (char *)_ddp_alloc(&c->alloc, cap)))
        return ddp_comm_fail(c, DDP_ERR_OUT_OF_MEMORY, "comm_shrink: agreement");
    for (i = 0; i < s->n; i++) { s->blame[i] = -2; s->closed[i] = 0; }
    if (s->attempt == 0 && c->shrink.has_suspect) blame = c->shrink.suspect;
    snprintf(val, sizeof val, "%d", blame);
    _ddp_shk(s, key, sizeof key, "attempt%d/in/%d", s->attempt, s->me);
    if ((r = ddp_store_set(st, key, val, strlen(val))) != DDP_SUCCESS) goto store_failed;
    for (;;) {
        int all = 1, late = _ddp_ms_left(deadline) == 0;
        _ddp_shk(s, key, sizeof key, "attempt%d/members", s->attempt);
        if ((r = ddp_store_check(st, key, &exists)) != DDP_SUCCESS) goto store_failed;
        if (exists) break;
        if ((r = _ddp_shrink_read_checkins(s)) != DDP_SUCCESS) goto store_failed;
        for (i = 0; i < s->n && (all || late); i++) {
            int dead = 0, by = -1;
            if (!s->cand[i] || s->blame[i] != -2) continue;
            if ((r = _ddp_shrink_dead(s, i, &dead, &by)) != DDP_SUCCESS) goto store_failed;
            if (!dead) all = 0;
        }
        if (all || late) {
            /* Propose the ranks that checked in; the first proposal is the decision. */
            unsigned char *in = s->member;
            size_t o;
            for (i = 0; i < s->n; i++) in[i] = s->cand[i] && s->blame[i] != -2;
            _ddp_shrink_list(in, s->n, buf, cap);
            o = strlen(buf);
            _ddp_shk(s, key, sizeof key, "attempt%d/members", s->attempt);
            r = ddp_store_compare_set(st, key, NULL, 0, buf, o, NULL, 0, &len);
            if (r != DDP_SUCCESS) goto store_failed;
            _DDP_LOG(c, DDP_LOG_TRACE, "comm_shrink: generation %d attempt %d: proposed {%.*s}%s",
                     s->gen, s->attempt, (int)o, buf, late ? " at the deadline" : "");
            break;
        }
        if (_ddp_now_us() >= next_note) {
            char missing[256];
            unsigned char *w = s->member;
            for (i = 0; i < s->n; i++) w[i] = s->cand[i] && s->blame[i] == -2;
            _ddp_shrink_list(w, s->n, missing, sizeof missing);
            _DDP_LOG(c, DDP_LOG_INFO, "comm_shrink: generation %d attempt %d: waiting for rank(s) %s "
                     "to check in (alive: they closed on purpose, or nobody blamed them); at most "
                     "%d ms more", s->gen, s->attempt, missing, _ddp_ms_left(deadline));
            next_note = _ddp_now_us() + 1000000;
        }
        _ddp_shrink_nap(&nap);
    }
    /* The decision: ours, or the one that won before it. */
    _ddp_shk(s, key, sizeof key, "attempt%d/members", s->attempt);
    if ((r = ddp_store_get(st, key, buf, cap - 1, &len)) != DDP_SUCCESS) goto store_failed;
    buf[len < cap ? len : cap - 1] = 0;
    s->nmembers = _ddp_shrink_parse(buf, s->member, s->n);
    if (s->nmembers < 0) {
        _ddp_free(&c->alloc, buf);
        return ddp_comm_fail(c, DDP_ERR_INTERNAL, "comm_shrink: generation %d attempt %d: a malformed "
                             "decision in the store", s->gen, s->attempt);
    }
    _ddp_shrink_story(s);
    _DDP_LOG(c, DDP_LOG_INFO, "shrink %d attempt %d: members %s, removed %s", s->gen, s->attempt, buf, s->story);
    _ddp_shrink_post_fence(s, buf, cap);
    _ddp_free(&c->alloc, buf);
    return DDP_SUCCESS;
store_failed:
    _ddp_free(&c->alloc, buf);
    return ddp_comm_fail(c, r, "comm_shrink: generation %d attempt %d, agreement: the store did not "
                         "answer (%s)%s", s->gen, s->attempt, ddp_store_last_error(st),
                         c->boot.own_store && c->eng.rank != 0 ? ": if rank 0 serves it and was lost, "
                         "no agreement is possible (run under a launcher that holds the store)" : "");
}

/* Step 3: the members build their communicator (split's recipe, under the attempt's prefix). */
_DDP_PRIVATE ddp_result_t _ddp_shrink_build(_ddp_shrink_t *s, ddp_comm_t **out) {
    ddp_comm_t *c = s->c;
    char prefix[192];
    ddp_comm_desc_t d;
    _ddp_parent_t from;
    int i, me = 0;
    for (i = 0; i < s->me; i++) me += s->member[i];
    snprintf(prefix, sizeof prefix, "%s/attempt%d", s->base, s->attempt);
    _ddp_child_desc(c, prefix, &d);
    memset(&from, 0, sizeof from);   /* no device communicator: ncclCommSplit needs the dead too */
    return _ddp_comm_init(out, s->nmembers, me, &d, &from);
}

/* The verdict on this attempt's communicator: "ok" once every member built it, "retry" when
 * one could not or at the deadline. 1 for ok. */
_DDP_PRIVATE ddp_result_t _ddp_shrink_verdict(_ddp_shrink_t *s, int built, int *ok) {
    ddp_comm_t *c = s->c;
    ddp_store_t *st = c->boot.store;
    char key[256], val[16];
    size_t len = 0;
    int64_t deadline = _ddp_shrink_deadline(s);
    int i, nap = 100, exists = 0;
    ddp_result_t r;
    _ddp_shk(s, key, sizeof key, "attempt%d/built/%d", s->attempt, s->me);
    if ((r = ddp_store_set(st, key, built ? "ok" : "fail", built ? 2 : 4)) != DDP_SUCCESS) goto store_failed;
    for (;;) {
        int nok = 0, failed = 0;
        const char *want = NULL;
        _ddp_shk(s, key, sizeof key, "attempt%d/verdict", s->attempt);
        if ((r = ddp_store_check(st, key, &exists)) != DDP_SUCCESS) goto store_failed;
        if (exists) break;
        for (i = 0; i < s->n && !failed; i++) {
            if (!s->member[i]) continue;
            _ddp_shk(s, key, sizeof key, "attempt%d/built/%d", s->attempt, i);
            if ((r = ddp_store_check(st, key, &exists)) != DDP_SUCCESS) goto store_failed;
            if (!exists) continue;
            if ((r = ddp_store_get(st, key, val, sizeof val - 1, &len)) != DDP_SUCCESS) goto store_failed;
            if (len == 2 && !memcmp(val, "ok", 2)) nok++;
            else failed = 1;
        }
        if (nok == s->nmembers) want = "ok";
        else if (failed || _ddp_ms_left(deadline) == 0) want = "retry";
        if (want) {
            _ddp_shk(s, key, sizeof key, "attempt%d/verdict", s->attempt);
            r = ddp_store_compare_set(st, key, NULL, 0, want, strlen(want), val, sizeof val - 1, &len);
            if (r != DDP_SUCCESS) goto store_failed;
            break;
        }
        _ddp_shrink_nap(&nap);
    }
    _ddp_shk(s, key, sizeof key, "attempt%d/verdict", s->attempt);
    if ((r = ddp_store_get(st, key, val, sizeof val - 1, &len)) != DDP_SUCCESS) goto store_failed;
    *ok = len == 2 && !memcmp(val, "ok", 2);
    return DDP_SUCCESS;
store_failed:
    return ddp_comm_fail(c, r, "comm_shrink: generation %d attempt %d, verdict: the store did not "
                         "answer (%s)", s->gen, s->attempt, ddp_store_last_error(st));
}

/* The child learns where it came from, and takes over what must outlive the parent: the store
 * handle (and ddp_comm_init_threads' server), so that destroying the parent touches nothing the
 * child uses. */
_DDP_PRIVATE ddp_result_t _ddp_shrink_adopt(_ddp_shrink_t *s, ddp_comm_t *child) {
    ddp_comm_t *c = s->c;
    int i, j = 0, k = 0;
    child->shrink.generation = s->gen;
    child->shrink.root_len = c->shrink.root_len > 0 ? c->shrink.root_len : (int)strlen(c->boot.prefix);
    child->shrink.parent_ranks = (int *)_ddp_alloc(&child->alloc, sizeof(int) * (size_t)s->nmembers);
    child->shrink.nremoved = s->n - s->nmembers;
    child->shrink.removed = child->shrink.nremoved
        ? (int *)_ddp_alloc(&child->alloc, sizeof(int) * (size_t)child->shrink.nremoved) : NULL;
    if (!child->shrink.parent_ranks || (child->shrink.nremoved && !child->shrink.removed)) return DDP_ERR_OUT_OF_MEMORY;
    for (i = 0; i < s->n; i++) {
        if (s->member[i]) child->shrink.parent_ranks[j++] = i;
        else child->shrink.removed[k++] = i;
    }
    if (child->boot.store == c->boot.store && c->boot.own_store) {
        child->boot.own_store = 1;
        c->boot.own_store = 0;
    }
    if (c->boot.extra_store && !child->boot.extra_store) {
        child->boot.extra_store = c->boot.extra_store;
        c->boot.extra_store = NULL;
    }
    return DDP_SUCCESS;
}

/* The default bound of each phase: a live rank blocked on a third one (one that stopped, or
 * is late) learns of the failure only at its own timeout, then names the stuck rank (up to
 * half its timeout, in [1, 10] s: _ddp_name_stuck_rank) before it checks in; waiting less
 * would drop it. Ranks that fail by a broken connection are all accounted at once. */
_DDP_PRIVATE int _ddp_shrink_default_ms(int timeout_ms) {
    if (timeout_ms < 0) return -1;
    if (timeout_ms > (INT_MAX - 1000) / 2) return INT_MAX;
    return 2 * timeout_ms + 1000;
}

DDP_API ddp_result_t ddp_comm_shrink(ddp_comm_t *c, const ddp_shrink_opts_t *opts, ddp_comm_t **out) {
    _ddp_shrink_t s;
    ddp_result_t r;
    unsigned char *mem;
    int gen = 0, attempt = 0;
    int64_t t0 = _ddp_now_us();
    if (out) *out = NULL;
    if (!c) return DDP_ERR_INVALID_ARGUMENT;
    if ((r = _ddp_usable(c)) != DDP_SUCCESS) return r;
    if (!out) return ddp_comm_fail(c, DDP_ERR_INVALID_ARGUMENT, "comm_shrink: NULL newcomm");
    if (__atomic_load_n(&c->error, __ATOMIC_SEQ_CST) == DDP_ERR_REMOVED)
        return DDP_ERR_REMOVED;   /* a failed call (or shrink) said so already */
    if (c->shrink.revoked)
        return ddp_comm_fail(c, DDP_ERR_INVALID_USAGE, "comm_shrink: this communicator was shrunk "
                             "already (generation %d): shrink the communicator that returned", c->shrink.generation + 1);
    if (!c->boot.store || c->boot.foreign)
        return ddp_comm_fail(c, DDP_ERR_UNSUPPORTED, "comm_shrink: %s", c->boot.store ? "the rendezvous "
                             "store belongs to another job: this communicator may not write to it" :
                             "no rendezvous store");
    memset(&s, 0, sizeof s);
    s.c = c;
    s.n = c->eng.nranks;
    s.me = c->eng.rank;
    s.gen = c->shrink.generation + 1;
    s.timeout_ms = opts && opts->timeout_ms ? opts->timeout_ms : _ddp_shrink_default_ms(c->eng.timeout_ms);
    s.min_ranks = opts && opts->min_ranks > 0 ? opts->min_ranks : 1;
    _ddp_shrink_base(c, s.gen, s.base, sizeof s.base);
    if (strlen(s.base) + 16 >= sizeof c->boot.prefix)   /* the child's prefix: base/attempt<k> */
        return ddp_comm_fail(c, DDP_ERR_INVALID_USAGE, "comm_shrink: the store prefix %s is too long "
                             "for a shrink's keys (at most %d bytes with /shrink<g>/attempt<k>)",
                             c->boot.prefix, (int)sizeof c->boot.prefix - 1);
    if (_ddp_shrink_excluded(c, &gen, &attempt)) {
        c->shrink.revoked = 1;
        __atomic_store_n(&c->error, DDP_ERR_REMOVED, __ATOMIC_SEQ_CST);
        _ddp_close_peers(c);
        return ddp_comm_fail(c, DDP_ERR_REMOVED, "comm_shrink: removed by shrink generation %d "
                             "(attempt %d) while in call #%u: the other ranks went on without this "
                             "one (it stopped or was too slow); destroy this communicator",
                             gen, attempt, c->eng.seq);
    }
    mem = (unsigned char *)_ddp_alloc(&c->alloc, (size_t)s.n * (2 + sizeof(int) + 1));
    if (!mem) return ddp_comm_fail(c, DDP_ERR_OUT_OF_MEMORY, "comm_shrink");
    s.blame = (int *)(void *)mem;
    s.cand = mem + (size_t)s.n * sizeof(int);
    s.member = s.cand + s.n;
    s.closed = (signed char *)(s.member + s.n);
    memset(s.cand, 1, (size_t)s.n);
    _DDP_LOG(c, DDP_LOG_INFO, "comm_shrink: generation %d from %d ranks at call #%u (store prefix %s)%s",
             s.gen, s.n, c->eng.seq, s.base, c->shrink.has_suspect ? "" : "; this rank blames nobody");
    if ((r = _ddp_shrink_revoke(&s)) != DDP_SUCCESS) goto done;
    for (;;) {
        ddp_comm_t *child = NULL;
        int ok = 0;
        if ((r = _ddp_shrink_agree(&s)) != DDP_SUCCESS) goto done;
        if (!s.member[s.me]) {
            r = ddp_comm_fail(c, DDP_ERR_REMOVED, "comm_shrink: removed by shrink generation %d "
                              "(attempt %d) while in call #%u: the others decided without this rank "
                              "(it checked in too late); destroy this communicator", s.gen, s.attempt,
                              c->eng.seq);
            __atomic_store_n(&c->error, DDP_ERR_REMOVED, __ATOMIC_SEQ_CST);
            goto done;
        }
        if (s.nmembers < s.min_ranks) {
            r = ddp_comm_fail(c, DDP_ERR_REMOTE, "comm_shrink: generation %d attempt %d: %d rank(s) "
                              "left (removed: %s), fewer than min_ranks %d", s.gen, s.attempt,
                              s.nmembers, s.story, s.min_ranks);
            goto done;
        }
        r = _ddp_shrink_build(&s, &child);
        if (r != DDP_SUCCESS)
            _DDP_LOG(c, DDP_LOG_WARN, "comm_shrink: generation %d attempt %d: building the new "
                     "communicator failed (a member lost meanwhile?): %s", s.gen, s.attempt,
                     ddp_last_init_error());
        if ((r = _ddp_shrink_verdict(&s, child != NULL, &ok)) != DDP_SUCCESS) {
            if (child) { _ddp_abort_internal(child, DDP_ERR_ABORTED, "comm_shrink failed"); ddp_comm_destroy(child); }
            goto done;
        }
        if (ok && !child) {   /* cannot be: "ok" needs this rank's own "built ok" */
            r = ddp_comm_fail(c, DDP_ERR_INTERNAL, "comm_shrink: generation %d attempt %d: verdict ok "
                              "without this rank's communicator", s.gen, s.attempt);
            goto done;
        }
        if (ok && (r = _ddp_shrink_adopt(&s, child)) != DDP_SUCCESS) {
            ddp_comm_destroy(child);
            r = ddp_comm_fail(c, r, "comm_shrink");
            goto done;
        }
        if (ok) {
            _DDP_LOG(c, DDP_LOG_INFO, "comm_shrink: generation %d: rank %d of %d (was %d of %d) "
                     "after %d attempt(s), %.1f ms; removed %s", s.gen, ddp_comm_rank(child),
                     s.nmembers, s.me, s.n, s.attempt + 1, (double)(_ddp_now_us() - t0) / 1000.0, s.story);
            *out = child;
            r = DDP_SUCCESS;
            goto done;
        }
        /* retry: with this attempt's members, whoever of them is still there */
        _DDP_LOG(c, DDP_LOG_WARN, "comm_shrink: generation %d attempt %d: not every member built "
                 "the new communicator; trying again with %d candidate(s)", s.gen, s.attempt, s.nmembers);
        if (child) { _ddp_abort_internal(child, DDP_ERR_ABORTED, "comm_shrink: retry"); ddp_comm_destroy(child); }
        memcpy(s.cand, s.member, (size_t)s.n);
        s.attempt++;
        if (s.attempt > s.n) {
            r = ddp_comm_fail(c, DDP_ERR_INTERNAL, "comm_shrink: generation %d: %d attempts", s.gen, s.attempt);
            goto done;
        }
    }
done:
    _ddp_free(&c->alloc, mem);
    return r;
}

DDP_API int ddp_comm_parent_rank(const ddp_comm_t *c, int rank) {
    if (!c || !_ddp_live_check(c, 0) || !c->shrink.parent_ranks || rank < 0 || rank >= c->eng.nranks) return -1;
    return c->shrink.parent_ranks[rank];
}

DDP_API int ddp_comm_removed_ranks(const ddp_comm_t *c, int *ranks, int cap) {
    int i;
    if (!c || !_ddp_live_check(c, 0)) return 0;
    for (i = 0; ranks && i < cap && i < c->shrink.nremoved; i++) ranks[i] = c->shrink.removed[i];
    return c->shrink.nremoved;
}

DDP_API int ddp_comm_generation(const ddp_comm_t *c) {
    return c && _ddp_live_check(c, 0) ? c->shrink.generation : -1;
}

#ifdef __cplusplus
}
#endif

#endif /* DDP_COMM_SHRINK_IMPLEMENTATION */
