/* SPDX-License-Identifier: MIT (see LICENSE) */
/* ddp_algorithm.h — what libddp's algorithm families share, private.
 *
 * Each family lives in its own header (ddp_ring.h, ddp_recursive_doubling.h, ddp_rabenseifner.h,
 * ddp_hierarchical.h, ddp_tree.h, ddp_chain.h, ddp_linear.h, ddp_pairwise.h; the call agreement
 * in ddp_agree.h; ddp_algorithms.h includes them all). They are written against the
 * point-to-point engine of ddp_engine.h, never against the communicator, and build on what is
 * here:
 *   - groups: the set of ranks an algorithm runs over (the world, or a host's ranks, or one rank
 *     per host for the hierarchical all-reduce);
 *   - chunk geometry: where chunk ch of a virtual buffer starts, so that a bucket of a flat
 *     buffer meets the same chunks, hence the same additions, as the whole buffer;
 *   - the bits each family adds to its tag digest, side by side so that they stay distinct;
 *   - the exchange helpers (_ddp_x_*): post a send or receive, wait for a set of them, connect
 *     to peers on first use, fail with where in the algorithm it happened, and idle (yield,
 *     then sleep in the transport, then time out naming the peer waited for). The trees, the
 *     chain, linear, pairwise, Rabenseifner and the hierarchical all-reduce use them;
 *     ddp_comm.h posts send/recv and groups through them too.
 * Every function here is _ddp_ and static. Depends on ddp_engine.h. Built by DDP_IMPLEMENTATION.
 */
#if defined(DDP_IMPLEMENTATION) && !defined(DDP_ALGORITHM_IMPLEMENTATION)
#define DDP_ALGORITHM_IMPLEMENTATION
#endif
#if defined(DDP_ALGORITHM_IMPLEMENTATION) && !defined(DDP_ENGINE_IMPLEMENTATION)
#define DDP_ENGINE_IMPLEMENTATION
#endif
#include "ddp_engine.h"

#if defined(DDP_ALGORITHM_IMPLEMENTATION) && !defined(DDP_ALGORITHM_IMPL_INCLUDED)
#define DDP_ALGORITHM_IMPL_INCLUDED
#ifndef DDP_ENGINE_IMPL_INCLUDED
#error "libddp: ddp_algorithm.h's implementation needs ddp_engine.h's (define DDP_IMPLEMENTATION)"
#endif

/* Bits a family adds to the kind in its tag digest (_ddp_eng_tag): the all-reduce algorithms'
 * messages carry other digests than the ring's, so ranks that chose different all-reduce
 * algorithms (DDP_ALGO set differently) fail with a mismatch. The hierarchical all-reduce also
 * puts its inter-host algorithm at bit 12 and its phase in the top byte of the tag. */
#define _DDP_TAG_RECURSIVE_DOUBLING 0x100
#define _DDP_TAG_RABENSEIFNER 0x200
#define _DDP_TAG_HIER 0x400
#define _DDP_TAG_DETERMINISTIC 0x800   /* a rank without the mode fails with DDP_ERR_MISMATCH */

/* A set of ranks an algorithm runs over: member i is rank ranks[i] (ranks NULL: rank i, the
 * whole communicator); me is this rank's member number. The hierarchical all-reduce runs the
 * ring over the ranks of one host, then over one rank per host. */
typedef struct { int n, me; const int *ranks; } _ddp_group_t;
static inline int _ddp_group_rank(const _ddp_group_t *gr, int i) { return gr->ranks ? gr->ranks[i] : i; }
static inline _ddp_group_t _ddp_group_world(const _ddp_engine_t *e) {
    _ddp_group_t gr;
    gr.n = e->nranks; gr.me = e->rank; gr.ranks = NULL;
    return gr;
}

/* Chunk geometry: chunk ch (of p) covers elements [start(ch), start(ch + 1)) of a "virtual" buffer
 * of geo_total elements cut into geo_parts near-equal parts (chunks ch >= geo_parts are empty),
 * seen through the window [geo_off, geo_off + count) that this call's buffers hold. The plain
 * collectives use the whole buffer cut in p; the hierarchical all-reduce cuts a host's buffer in
 * as many slices as the smallest host has ranks; a bucket of a flat gradient buffer (the
 * reducer) is a window of that buffer, so each element meets the same chunk, hence the same
 * order of additions, as in one all-reduce of the whole flat buffer. */
static inline size_t _ddp_geo_start(size_t total, int parts, size_t ch) {
    size_t base = total / (size_t)parts, rem = total % (size_t)parts;
    return ch >= (size_t)parts ? total : ch * base + (ch < rem ? ch : rem);
}

_DDP_PRIVATE int _ddp_log2(int v) { int k = 0; while ((1 << k) < v) k++; return k; }

/* ---------------------------------------------------------------- exchange helpers
 * Every message of a collective carries its _ddp_eng_tag (a digest of kind, dtype, op, count,
 * root, and the collective's number), so ranks calling different things fail with
 * DDP_ERR_MISMATCH at the first message that reaches the wrong call. A send/recv carries a
 * digest of (dtype, count) and its number among the messages of that direction of that pair:
 * only the two ranks take part, so the collectives' sequence (e->seq) stays untouched. Peers
 * beyond the ring and recursive-doubling partners are connected on first use: both sides of a
 * pair ask for each other in the same call. */
/* "rank R: <where>: <the transport's detail>" (the transport said "rank R: <detail> [...]"). */
_DDP_PRIVATE ddp_result_t _ddp_x_fail(_ddp_engine_t *e, ddp_result_t r, const char *where) {
    char prev[1024], *tail;
    const char *msg = e->last_error(e->host), *colon;
    size_t skip = 0;
    if (!strncmp(msg, "rank ", 5) && (colon = strstr(msg, ": ")) != NULL) skip = (size_t)(colon + 2 - msg);
    _ddp_strlcpy(prev, msg + skip, sizeof prev);
    if ((tail = strstr(prev, " [")) != NULL) *tail = 0;
    return _ddp_eng_fail(e, r, "%s: %s", where, prev[0] ? prev : ddp_strerror(r));
}

/* Nothing moved since `last`: yield while spinning, then sleep in the transport; a timeout
 * names the call and the peer it waits for. */
_DDP_PRIVATE ddp_result_t _ddp_x_idle(_ddp_engine_t *e, int64_t last, const int *peers, int n,
                                const char *what, unsigned seq, const char *waiting, int peer) {
    int64_t now = _ddp_now_us();
    if (e->timeout_ms >= 0 && now - last > (int64_t)e->timeout_ms * 1000) {
        e->waiting_on = peer;
        return _ddp_eng_fail(e, DDP_ERR_TIMEOUT, "%s #%u: no progress for %d ms %s rank %d", what,
                             seq, e->timeout_ms, waiting, peer);
    }
    if (now - last < e->spin_us) { sched_yield(); return DDP_SUCCESS; }
    if (now - last >= 10000000) {
        char where[96];
        snprintf(where, sizeof where, "%s #%u", what, seq);
        _ddp_eng_note_wait(e, now - last, where, waiting, peer);
    }
    {
        int ms = 100;
        if (e->timeout_ms >= 0) {
            int64_t left = (int64_t)e->timeout_ms * 1000 - (now - last);
            if (left / 1000 + 1 < ms) ms = (int)(left / 1000) + 1;
        }
        _ddp_eng_waits_on(e, peer);
        return e->block(e->host, peers, n < 8 ? n : 8, ms);
    }
}

typedef struct { int peer, is_send; void *req; } _ddp_xop_t;
typedef struct { _ddp_engine_t *e; const char *what, *algo; unsigned seq; } _ddp_x_t;

_DDP_PRIVATE void _ddp_x_setup(_ddp_x_t *x, _ddp_engine_t *e, const char *what, const char *algo, uint64_t tag) {
    x->e = e; x->what = what; x->algo = algo; x->seq = (unsigned)(tag & 0xffffffffu);
}

_DDP_PRIVATE ddp_result_t _ddp_x_post(const _ddp_x_t *x, _ddp_xop_t *o, int peer, int is_send,
                                const void *buf, size_t len, uint64_t tag, const char *phase) {
    ddp_result_t r;
    o->peer = peer;
    o->is_send = is_send;
    o->req = NULL;
    r = is_send ? x->e->isend(x->e->host, peer, buf, len, tag, &o->req)
                : x->e->irecv(x->e->host, peer, (void *)(uintptr_t)buf, len, tag, &o->req);
    if (r != DDP_SUCCESS) {
        char where[200];
        snprintf(where, sizeof where, "%s #%u (%s), %s, %s rank %d", x->what, x->seq, x->algo, phase,
                 is_send ? "sending to" : "receiving from", peer);
        return _ddp_x_fail(x->e, r, where);
    }
    return DDP_SUCCESS;
}

/* Waits for every posted request of ops[0..n). */
_DDP_PRIVATE ddp_result_t _ddp_x_waitall(const _ddp_x_t *x, _ddp_xop_t *ops, int n, const char *phase) {
    _ddp_engine_t *e = x->e;
    int64_t last = _ddp_now_us();
    ddp_result_t r;
    for (;;) {
        int i, pending = 0, progressed = 0, peers[8], first = -1;
        for (i = 0; i < n; i++) {
            int done = 1;
            if (!ops[i].req) continue;
            if ((r = e->test(e->host, ops[i].peer, ops[i].req, &done)) != DDP_SUCCESS) {
                char where[200];
                snprintf(where, sizeof where, "%s #%u (%s), %s, %s rank %d", x->what, x->seq,
                         x->algo, phase, ops[i].is_send ? "sending to" : "receiving from", ops[i].peer);
                return _ddp_x_fail(e, r, where);
            }
            if (done) { ops[i].req = NULL; progressed = 1; continue; }
            if (pending < 8) peers[pending] = ops[i].peer;
            if (first < 0) first = i;
            pending++;
        }
        if (!pending) return DDP_SUCCESS;
        if (progressed) { last = _ddp_now_us(); continue; }
        {
            char what[96];
            snprintf(what, sizeof what, "%s (%s), %s", x->what, x->algo, phase);
            r = _ddp_x_idle(e, last, peers, pending, what, x->seq,
                            ops[first].is_send ? "waiting to send to" : "waiting for data from",
                            ops[first].peer);
            if (r != DDP_SUCCESS) return r;
        }
    }
}

_DDP_PRIVATE ddp_result_t _ddp_x_connect(const _ddp_x_t *x, const int *list, int n) {
    ddp_result_t r = x->e->connect(x->e->host, list, n);
    if (r != DDP_SUCCESS) {
        char where[160];
        snprintf(where, sizeof where, "%s #%u (%s), phase connect", x->what, x->seq, x->algo);
        return _ddp_x_fail(x->e, r, where);
    }
    return DDP_SUCCESS;
}

#endif /* DDP_ALGORITHM_IMPLEMENTATION */
