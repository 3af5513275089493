/* SPDX-License-Identifier: MIT (see LICENSE) */
/* ddp_ring.h — the ring, libddp's bandwidth-optimal algorithm family, private.
 *
 * all-reduce      = reduce-scatter then all-gather around the ring: each rank sends 2(p-1)/p of
 *                   the buffer, the bandwidth optimum (Patarasuk & Yuan, "Bandwidth optimal
 *                   all-reduce algorithms for clusters of workstations", JPDC 2009). It runs over
 *                   any group of ranks and any chunk geometry (ddp_algorithm.h), and can run one
 *                   half alone: the hierarchical all-reduce (ddp_hierarchical.h) is built of
 *                   such halves.
 * reduce-scatter  the first half alone; rank r ends with chunk r (NCCL's layout).
 * all-gather      the second half alone.
 * broadcast       a pipelined chain root -> root+1 -> ... around the ring (every link carries
 *                 the buffer once); the small ones go inside the call agreement (ddp_agree.h).
 * Chunks are cut into segments (DDP_SEGMENT_BYTES) and up to DDP_RING_WINDOW segments are in
 * flight per direction, so sending, receiving and reducing overlap; a step streams its chunk
 * while the previous step's data is still arriving. Scratch is the window, never the message.
 * Each chunk is reduced in one fixed order along the ring and then copied out, so every rank ends
 * with the same bits, run after run.
 *
 * Written against the point-to-point engine (ddp_engine.h), never against the communicator;
 * every function is _ddp_ and static: ddp_comm.h picks an algorithm per call after its entry
 * checks. Depends on ddp_algorithm.h and ddp_kernels.h. Built by DDP_IMPLEMENTATION.
 */
#if defined(DDP_IMPLEMENTATION) && !defined(DDP_RING_IMPLEMENTATION)
#define DDP_RING_IMPLEMENTATION
#endif
#if defined(DDP_RING_IMPLEMENTATION)
#ifndef DDP_ALGORITHM_IMPLEMENTATION
#define DDP_ALGORITHM_IMPLEMENTATION
#endif
#ifndef DDP_KERNELS_IMPLEMENTATION
#define DDP_KERNELS_IMPLEMENTATION
#endif
#endif
#include "ddp_algorithm.h"
#include "ddp_kernels.h"

#if defined(DDP_RING_IMPLEMENTATION) && !defined(DDP_RING_IMPL_INCLUDED)
#define DDP_RING_IMPL_INCLUDED
#if !defined(DDP_ALGORITHM_IMPL_INCLUDED) || !defined(DDP_KERNELS_IMPL_INCLUDED)
#error "libddp: ddp_ring.h's implementation needs ddp_algorithm.h's and ddp_kernels.h's (define DDP_IMPLEMENTATION)"
#endif

/* ---------------------------------------------------------------- the ring engine
 * Work items are (step t, segment k). Step t sends chunk (r - t + shift) mod p to the next rank
 * and receives chunk (r - t - 1 + shift) mod p from the previous one; the send of (t, k), t > 0,
 * forwards what the receive of (t - 1, k) produced, so it waits for it.
 * Items are posted in the order (group, t, k): a group of G segments goes through every step
 * before the next group starts. With G = all segments (all-reduce, all-gather, broadcast) each
 * step streams its whole chunk while the previous step's data is still arriving, so the pipe
 * stays full. Reduce-scatter parks each partial sum in scratch until it is forwarded, so it uses
 * groups of W/2 segments: the scratch needed is bounded by the window, not the message. */
/* The ring runs four of the operation kinds. */
enum { _DDP_RING_AR = DDP_CALL_ALL_REDUCE, _DDP_RING_RS = DDP_CALL_REDUCE_SCATTER,
       _DDP_RING_AG = DDP_CALL_ALL_GATHER, _DDP_RING_BCAST = DDP_CALL_BROADCAST };

typedef struct {
    _ddp_engine_t *e;
    int kind, p, r, next, prev, shift, nsteps, root;
    int t0;             /* the first step run: the hierarchical all-reduce runs an all-reduce's
                         * reduce-scatter half (t0 = 0, p - 1 steps) and later its all-gather
                         * half (t0 = p - 1) */
    const unsigned char *send;
    unsigned char *recv;
    size_t count, geo_total, geo_off;
    size_t geo_base, geo_rem;   /* geo_total / geo_parts and its remainder: no division per item */
    int geo_parts;
    size_t es, own_off, seg_elems, nseg, group;
    const char *label;  /* where in a bigger algorithm (" (hierarchical, inside the host)"), or NULL */
    ddp_dtype_t dtype;
    ddp_op_t op;
    uint64_t tag;
} _ddp_ring_t;

typedef struct {
    void *req;          /* NULL: nothing on the wire (empty segment), complete at once */
    size_t item;
    int slot;           /* scratch slot held by this item, or -1 */
} _ddp_ring_op_t;

static inline size_t _ddp_ring_mod(const _ddp_ring_t *g, long v) {
    long m = v % g->p;
    return (size_t)(m < 0 ? m + g->p : m);
}

/* Item number -> (step, segment); *gsize = segments in its group. The step is the
 * algorithm's (t0 added): only the dependency on the previous item looks at the item's own. */
static inline void _ddp_ring_item(const _ddp_ring_t *g, size_t i, int *t, size_t *k, size_t *gsize) {
    size_t per = g->group * (size_t)g->nsteps, b = i / per, rem = i % per;
    size_t gs = (b + 1) * g->group <= g->nseg ? g->group : g->nseg - b * g->group;
    *t = (int)(rem / gs) + g->t0;
    *k = b * g->group + rem % gs;
    *gsize = gs;
}

/* _ddp_geo_start with the division done once, in the plan (this runs for every item). */
static inline size_t _ddp_ring_geo_start(const _ddp_ring_t *g, size_t ch) {
    return ch >= (size_t)g->geo_parts ? g->geo_total : ch * g->geo_base + (ch < g->geo_rem ? ch : g->geo_rem);
}

/* Elements [*coff, *coff + *clen) of this call's buffer that chunk ch covers. */
static inline void _ddp_ring_chunk(const _ddp_ring_t *g, size_t ch, size_t *coff, size_t *clen) {
    size_t a = _ddp_ring_geo_start(g, ch), b = _ddp_ring_geo_start(g, ch + 1);
    const size_t lo = g->geo_off, hi = g->geo_off + g->count;
    if (a < lo) a = lo;
    if (b > hi) b = hi;
    *coff = b > a ? a - lo : 0;
    *clen = b > a ? b - a : 0;
}

/* Elements [*off, *off + *len) of the whole buffer that segment k of chunk ch covers. */
static inline void _ddp_ring_seg(const _ddp_ring_t *g, size_t ch, size_t k, size_t *off, size_t *len) {
    size_t clen, coff, s = k * g->seg_elems;
    _ddp_ring_chunk(g, ch, &coff, &clen);
    *off = coff + (s < clen ? s : clen);
    *len = s < clen ? (clen - s < g->seg_elems ? clen - s : g->seg_elems) : 0;
}

static inline int _ddp_ring_reduces(const _ddp_ring_t *g, int t) {
    return g->kind == _DDP_RING_RS || (g->kind == _DDP_RING_AR && t < g->p - 1);
}

_DDP_PRIVATE void _ddp_ring_where(const _ddp_ring_t *g, size_t item, char *out, size_t cap) {
    int t, step, steps;
    size_t k, gs;
    const char *phase;
    _ddp_ring_item(g, item, &t, &k, &gs);
    phase = g->kind == _DDP_RING_BCAST ? "chain" : _ddp_ring_reduces(g, t) ? "reduce-scatter" : "all-gather";
    step = (g->kind == _DDP_RING_AR && t >= g->p - 1) ? t - (g->p - 1) : t;   /* t0 included */
    steps = g->kind == _DDP_RING_BCAST ? 1 : g->p - 1;
    snprintf(out, cap, "%s #%u%s, phase %s step %d/%d, segment %zu/%zu", _ddp_kind_name(g->kind),
             (unsigned)(g->tag & 0xffffffffu), g->label ? g->label : "", phase, step + 1, steps, k + 1, g->nseg);
}

/* Re-words the transport's error with where in the algorithm it happened. */
_DDP_PRIVATE ddp_result_t _ddp_ring_fail(const _ddp_ring_t *g, ddp_result_t r, size_t item) {
    char where[160], prev[1024];
    const char *msg = g->e->last_error(g->e->host);
    size_t skip = 0;
    _ddp_ring_where(g, item, where, sizeof where);
    if (!strncmp(msg, "rank ", 5)) { /* drop our own "rank N: " prefix; fail() adds it back */
        const char *colon = strstr(msg, ": ");
        if (colon) skip = (size_t)(colon + 2 - msg);
    }
    _ddp_strlcpy(prev, msg + skip, sizeof prev);
    {
        char *tail = strstr(prev, " [");
        if (tail) *tail = 0;
    }
    return _ddp_eng_fail(g->e, r, "%s: %s", where, prev[0] ? prev : ddp_strerror(r));
}

/* One run's progress: the requests in flight per direction (in item order) and the scratch
 * slots. Items [0, total); sends and receives posted (ns, nr) and retired (ds, dr). */
typedef struct {
    _ddp_ring_op_t sq[DDP_RING_WINDOW], rq[DDP_RING_WINDOW];
    int free_slots[DDP_RING_WINDOW], nfree;
    /* Reduce-scatter: slots holding partial sums, in the order their forwarding sends come. */
    int parked[DDP_RING_WINDOW];
    size_t park_head, park_tail;
    size_t total, ns, nr, ds, dr;
    int bcast, pos;     /* a broadcast, and this rank's place in its chain (0: the root) */
    int progressed;     /* something was retired in this turn */
} _ddp_ring_run_t;

_DDP_PRIVATE void _ddp_ring_run_init(const _ddp_ring_t *g, _ddp_ring_run_t *s) {
    int i, sends, recvs;
    s->nfree = 0;
    for (i = 0; i < DDP_RING_WINDOW; i++) s->free_slots[s->nfree++] = i;
    s->park_head = s->park_tail = 0;
    s->total = g->nseg * (size_t)g->nsteps;
    s->ns = s->nr = s->ds = s->dr = 0;
    s->bcast = g->kind == _DDP_RING_BCAST;
    s->pos = s->bcast ? (int)_ddp_ring_mod(g, g->r - g->root) : 0;
    sends = !s->bcast || s->pos != g->p - 1;    /* the chain's last rank only receives */
    recvs = !s->bcast || s->pos != 0;           /* its root only sends */
    if (!sends) s->ds = s->ns = s->total;
    if (!recvs) s->dr = s->nr = s->total;
    s->progressed = 0;
}

/* Posts receives while the window and the scratch allow. */
_DDP_PRIVATE ddp_result_t _ddp_ring_post_recvs(const _ddp_ring_t *g, _ddp_ring_run_t *s) {
    _ddp_engine_t *e = g->e;
    const size_t W = DDP_RING_WINDOW;
    ddp_result_t r;
    while (s->nr < s->total && s->nr - s->dr < W) {
        int t;
        size_t k, gs, ch, off, len;
        _ddp_ring_op_t *o = &s->rq[s->nr % W];
        _ddp_ring_item(g, s->nr, &t, &k, &gs);
        ch = s->bcast ? 0 : _ddp_ring_mod(g, (long)g->r - t - 1 + g->shift);
        _ddp_ring_seg(g, ch, k, &off, &len);
        o->item = s->nr;
        o->req = NULL;
        o->slot = -1;
        if (len) {
            void *dst;
            if (_ddp_ring_reduces(g, t)) {
                if (!s->nfree) break;
                o->slot = s->free_slots[--s->nfree];
                dst = e->scratch + (size_t)o->slot * e->segment_bytes;
            } else {
                dst = g->recv + off * g->es;
            }
            r = e->irecv(e->host, g->prev, dst, len * g->es, g->tag, &o->req);
            if (r != DDP_SUCCESS) return _ddp_ring_fail(g, r, s->nr);
        }
        s->nr++;
    }
    return DDP_SUCCESS;
}

/* What the send of item (t, segment at off) carries: a parked partial sum (reduce-scatter past
 * its first step, o->slot takes it), the caller's data (the first step, the broadcast's root),
 * or what an earlier step received into recvbuf. */
static inline const unsigned char *_ddp_ring_send_src(const _ddp_ring_t *g, _ddp_ring_run_t *s,
                                                      _ddp_ring_op_t *o, int t, size_t off, size_t len) {
    if (g->kind == _DDP_RING_RS && t > g->t0) {
        if (!len) return NULL;
        o->slot = s->parked[s->park_head++ % DDP_RING_WINDOW];
        return g->e->scratch + (size_t)o->slot * g->e->segment_bytes;
    }
    if (t == g->t0 && !(s->bcast && s->pos != 0))
        return g->kind == _DDP_RING_AG ? g->send + (off - g->own_off) * g->es : g->send + off * g->es;
    return g->recv + off * g->es;
}

/* Posts sends whose data is ready. */
_DDP_PRIVATE ddp_result_t _ddp_ring_post_sends(const _ddp_ring_t *g, _ddp_ring_run_t *s) {
    _ddp_engine_t *e = g->e;
    const size_t W = DDP_RING_WINDOW;
    ddp_result_t r;
    while (s->ns < s->total && s->ns - s->ds < W) {
        int t;
        size_t k, gs, ch, off, len;
        const unsigned char *src;
        _ddp_ring_op_t *o = &s->sq[s->ns % W];
        _ddp_ring_item(g, s->ns, &t, &k, &gs);
        if (s->bcast && s->pos != 0) { if (s->dr <= s->ns) break; }   /* forward what arrived */
        else if (t > g->t0 && s->dr <= s->ns - gs) break;             /* needs recv (t - 1, k) */
        ch = s->bcast ? 0 : _ddp_ring_mod(g, (long)g->r - t + g->shift);
        _ddp_ring_seg(g, ch, k, &off, &len);
        o->item = s->ns;
        o->req = NULL;
        o->slot = -1;
        src = _ddp_ring_send_src(g, s, o, t, off, len);
        if (len) {
            r = e->isend(e->host, g->next, src, len * g->es, g->tag, &o->req);
            if (r != DDP_SUCCESS) return _ddp_ring_fail(g, r, s->ns);
        }
        s->ns++;
    }
    return DDP_SUCCESS;
}

/* Retires completed sends, in order. */
_DDP_PRIVATE ddp_result_t _ddp_ring_retire_sends(const _ddp_ring_t *g, _ddp_ring_run_t *s) {
    _ddp_engine_t *e = g->e;
    ddp_result_t r;
    while (s->ds < s->ns) {
        _ddp_ring_op_t *o = &s->sq[s->ds % DDP_RING_WINDOW];
        int done = 1;
        if (o->req && (r = e->test(e->host, g->next, o->req, &done)) != DDP_SUCCESS)
            return _ddp_ring_fail(g, r, o->item);
        if (!done) break;
        if (o->slot >= 0) s->free_slots[s->nfree++] = o->slot;
        s->ds++;
        s->progressed = 1;
    }
    return DDP_SUCCESS;
}

/* A received segment in scratch slot o->slot: reduce it with our data. */
_DDP_PRIVATE void _ddp_ring_land(const _ddp_ring_t *g, _ddp_ring_run_t *s, const _ddp_ring_op_t *o) {
    int t;
    size_t k, gs, off, len, ch;
    unsigned char *scr = g->e->scratch + (size_t)o->slot * g->e->segment_bytes;
    _ddp_ring_item(g, o->item, &t, &k, &gs);
    ch = _ddp_ring_mod(g, (long)g->r - t - 1 + g->shift);
    _ddp_ring_seg(g, ch, k, &off, &len);
    if (g->kind == _DDP_RING_AR || t == g->p - 2) {
        /* All-reduce accumulates in recvbuf; reduce-scatter's last step is our chunk. */
        unsigned char *dst = g->kind == _DDP_RING_AR ? g->recv + off * g->es
                           : g->recv + (off - g->own_off) * g->es;
        ddp_reduce_local(dst, scr, g->send + off * g->es, len, g->dtype, g->op);
        if (t == g->p - 2 && g->op == DDP_AVG) ddp_divide_local(dst, len, g->dtype, g->p);
        s->free_slots[s->nfree++] = o->slot;
    } else {
        ddp_reduce_local(scr, scr, g->send + off * g->es, len, g->dtype, g->op);
        s->parked[s->park_tail++ % DDP_RING_WINDOW] = o->slot;   /* freed once forwarded */
    }
}

/* Retires completed receives, in order, reducing as they land. */
_DDP_PRIVATE ddp_result_t _ddp_ring_retire_recvs(const _ddp_ring_t *g, _ddp_ring_run_t *s) {
    _ddp_engine_t *e = g->e;
    ddp_result_t r;
    while (s->dr < s->nr) {
        _ddp_ring_op_t *o = &s->rq[s->dr % DDP_RING_WINDOW];
        int done = 1;
        if (o->req && (r = e->test(e->host, g->prev, o->req, &done)) != DDP_SUCCESS)
            return _ddp_ring_fail(g, r, o->item);
        if (!done) break;
        if (o->slot >= 0) _ddp_ring_land(g, s, o);
        s->dr++;
        s->progressed = 1;
    }
    return DDP_SUCCESS;
}

/* Nothing moved this turn: time out (naming the neighbour waited for), else yield while
 * spinning, else sleep in the transport until a neighbour may progress. */
_DDP_PRIVATE ddp_result_t _ddp_ring_idle(const _ddp_ring_t *g, const _ddp_ring_run_t *s, int64_t last,
                                         int64_t spin_until) {
    _ddp_engine_t *e = g->e;
    int64_t now = _ddp_now_us();
    int peers[2];
    ddp_result_t r;
    if (e->timeout_ms >= 0 && now - last > (int64_t)e->timeout_ms * 1000) {
        char where[160];
        int waiting_recv = s->dr < s->total;
        _ddp_ring_where(g, waiting_recv ? s->dr : s->ds, where, sizeof where);
        e->waiting_on = waiting_recv ? g->prev : g->next;
        return _ddp_eng_fail(e, DDP_ERR_TIMEOUT, "%s: no progress for %d ms: %s rank %d",
                             where, e->timeout_ms,
                             waiting_recv ? "waiting for data from" : "waiting to send to",
                             waiting_recv ? g->prev : g->next);
    }
    if (now < spin_until) {
        /* Give the CPU to a runnable peer, if any: costs ~1 us when there is none. */
        sched_yield();
        return DDP_SUCCESS;
    }
    if (now - last >= 10000000) {
        char where[160];
        int waiting_recv = s->dr < s->total;
        _ddp_ring_where(g, waiting_recv ? s->dr : s->ds, where, sizeof where);
        _ddp_eng_note_wait(e, now - last, where, waiting_recv ? "waiting for data from" : "waiting to send to",
                           waiting_recv ? g->prev : g->next);
    }
    {
        int ms = 100;
        if (e->timeout_ms >= 0) {
            int64_t left = (int64_t)e->timeout_ms * 1000 - (now - last);
            if (left / 1000 + 1 < ms) ms = (int)(left / 1000) + 1;
        }
        peers[0] = g->next;
        peers[1] = g->prev;
        _ddp_eng_waits_on(e, s->dr < s->total ? g->prev : g->next);
        r = e->block(e->host, peers, g->next == g->prev ? 1 : 2, ms);
        if (r != DDP_SUCCESS) return _ddp_ring_fail(g, r, s->dr < s->total ? s->dr : s->ds);
    }
    return DDP_SUCCESS;
}

/* Each turn posts what the window allows, retires what completed, and idles if nothing did. */
_DDP_PRIVATE ddp_result_t _ddp_ring_run(_ddp_ring_t *g) {
    _ddp_engine_t *e = g->e;
    _ddp_ring_run_t s;
    int64_t last = _ddp_now_us(), spin_until = last + e->spin_us;
    ddp_result_t r;
    _ddp_ring_run_init(g, &s);
    while (s.ds < s.total || s.dr < s.total) {
        s.progressed = 0;
        if ((r = _ddp_ring_post_recvs(g, &s)) != DDP_SUCCESS || (r = _ddp_ring_post_sends(g, &s)) != DDP_SUCCESS ||
            (r = _ddp_ring_retire_sends(g, &s)) != DDP_SUCCESS || (r = _ddp_ring_retire_recvs(g, &s)) != DDP_SUCCESS)
            return r;
        if (s.progressed) {
            last = _ddp_now_us();
            spin_until = last + e->spin_us;
            continue;
        }
        if ((r = _ddp_ring_idle(g, &s, last, spin_until)) != DDP_SUCCESS) return r;
    }
    return DDP_SUCCESS;
}

/* The ring over the members of gr, with this tag (the caller's _ddp_eng_tag: one per collective,
 * whatever its phases). */
_DDP_PRIVATE void _ddp_ring_setup_in(_ddp_ring_t *g, _ddp_engine_t *e, const _ddp_group_t *gr, uint64_t tag,
                                     int kind, const void *send, void *recv, ddp_dtype_t dtype, ddp_op_t op,
                                     int root) {
    memset(g, 0, sizeof *g);
    g->e = e;
    g->kind = kind;
    g->p = gr->n;
    g->r = gr->me;
    g->next = _ddp_group_rank(gr, (gr->me + 1) % gr->n);
    g->prev = _ddp_group_rank(gr, (gr->me + gr->n - 1) % gr->n);
    g->send = (const unsigned char *)send;
    g->recv = (unsigned char *)recv;
    g->dtype = dtype;
    g->op = op;
    g->es = ddp_dtype_size(dtype);
    g->root = root;
    g->tag = tag;
}

_DDP_PRIVATE void _ddp_ring_setup(_ddp_ring_t *g, _ddp_engine_t *e, int kind, const void *send, void *recv,
                            ddp_dtype_t dtype, ddp_op_t op, size_t count, int root) {
    _ddp_group_t world = _ddp_group_world(e);
    _ddp_ring_setup_in(g, e, &world, _ddp_eng_tag(e, kind, dtype, op, count, root), kind, send, recv,
                       dtype, op, root);
}

/* Chunk geometry (see _ddp_geo_start) and segment size. A chunk is cut into at least
 * _DDP_RING_MIN_SEGS segments when that keeps them >= 64 KiB, so that mid-size messages pipeline
 * too (a chunk sent as one segment cannot be forwarded before it has fully arrived); never above
 * DDP_SEGMENT_BYTES, the scratch slot size. Every rank derives the same numbers from (count,
 * geometry, dtype, p, DDP_SEGMENT_BYTES). */
#define _DDP_RING_MIN_SEGS 4
#define _DDP_RING_MIN_SEG_BYTES (64u << 10)
_DDP_PRIVATE void _ddp_ring_plan(_ddp_ring_t *g, size_t count, size_t geo_total, size_t geo_off, int geo_parts,
                                 size_t group) {
    size_t maxc = 0, cap = g->e->segment_bytes, want, lo, seg, ch, coff, clen;
    g->count = count;
    g->geo_total = geo_total;
    g->geo_off = geo_off;
    g->geo_parts = geo_parts;
    g->geo_base = geo_total / (size_t)geo_parts;
    g->geo_rem = geo_total % (size_t)geo_parts;
    if (!geo_off && count == geo_total) {   /* the whole buffer: the first chunk is the largest */
        _ddp_ring_chunk(g, 0, &coff, &maxc);
        _ddp_ring_chunk(g, (size_t)g->r, &g->own_off, &clen);
    } else {                                /* a window: look at every chunk's part of it */
        for (ch = 0; ch < (size_t)g->p; ch++) {
            _ddp_ring_chunk(g, ch, &coff, &clen);
            if (clen > maxc) maxc = clen;
            if (ch == (size_t)g->r) g->own_off = coff;
        }
    }
    want = (maxc * g->es / _DDP_RING_MIN_SEGS + 4095) & ~(size_t)4095;
    lo = _DDP_RING_MIN_SEG_BYTES < cap ? _DDP_RING_MIN_SEG_BYTES : cap;
    seg = want < lo ? lo : want > cap ? cap : want;
    g->seg_elems = seg / g->es;
    /* Number of segments of the largest chunk (empty segments of smaller chunks are skipped on
     * both sides, which compute the same geometry). */
    g->nseg = (maxc + g->seg_elems - 1) / g->seg_elems;
    g->group = group ? group : (g->nseg ? g->nseg : 1);
}

/* All-reduce over the members of gr, steps [t0, t0 + nsteps) of the 2(p - 1): the whole of it, or
 * one half for the hierarchical all-reduce. The buffers hold elements [geo_off, geo_off + count)
 * of a virtual buffer of geo_total cut into geo_parts chunks. */
_DDP_PRIVATE ddp_result_t _ddp_ring_all_reduce_in(_ddp_engine_t *e, const _ddp_group_t *gr, uint64_t tag,
                                                  const void *sendbuf, void *recvbuf, size_t count,
                                                  ddp_dtype_t dtype, ddp_op_t op, size_t geo_total,
                                                  size_t geo_off, int geo_parts, int t0, int nsteps,
                                                  const char *label) {
    _ddp_ring_t g;
    _ddp_ring_setup_in(&g, e, gr, tag, _DDP_RING_AR, sendbuf, recvbuf, dtype, op, 0);
    g.label = label;
    if (gr->n == 1 || !nsteps) {
        if (count && sendbuf != recvbuf) memcpy(recvbuf, sendbuf, count * g.es);
        return DDP_SUCCESS;
    }
    g.shift = -1;
    g.t0 = t0;
    g.nsteps = nsteps;
    _ddp_ring_plan(&g, count, geo_total, geo_off, geo_parts, 0);
    return _ddp_ring_run(&g);
}

/* The buffers hold elements [geo_off, geo_off + count) of a virtual buffer of geo_total (count
 * and 0: the buffer is the whole). */
_DDP_PRIVATE ddp_result_t _ddp_ring_all_reduce(_ddp_engine_t *e, const void *sendbuf, void *recvbuf,
                                         size_t count, ddp_dtype_t dtype, ddp_op_t op, size_t geo_total,
                                         size_t geo_off) {
    _ddp_group_t world = _ddp_group_world(e);
    uint64_t tag = _ddp_eng_tag(e, _DDP_RING_AR, dtype, op, count, 0);
    return _ddp_ring_all_reduce_in(e, &world, tag, sendbuf, recvbuf, count, dtype, op, geo_total, geo_off,
                                   e->nranks, 0, 2 * (e->nranks - 1), NULL);
}

_DDP_PRIVATE ddp_result_t _ddp_ring_reduce_scatter(_ddp_engine_t *e, const void *sendbuf, void *recvbuf,
                                             size_t recvcount, ddp_dtype_t dtype, ddp_op_t op) {
    _ddp_ring_t g;
    _ddp_ring_setup(&g, e, _DDP_RING_RS, sendbuf, recvbuf, dtype, op, recvcount, 0);
    if (e->nranks == 1) {
        if (recvcount && sendbuf != recvbuf) memmove(recvbuf, sendbuf, recvcount * g.es);
        return DDP_SUCCESS;
    }
    g.shift = -1;
    g.nsteps = g.p - 1;
    _ddp_ring_plan(&g, recvcount * (size_t)g.p, recvcount * (size_t)g.p, 0, g.p, DDP_RING_WINDOW / 2);
    return _ddp_ring_run(&g);
}

_DDP_PRIVATE ddp_result_t _ddp_ring_all_gather(_ddp_engine_t *e, const void *sendbuf, void *recvbuf,
                                         size_t sendcount, ddp_dtype_t dtype) {
    _ddp_ring_t g;
    unsigned char *own;
    _ddp_ring_setup(&g, e, _DDP_RING_AG, sendbuf, recvbuf, dtype, DDP_SUM, sendcount, 0);
    own = g.recv + (size_t)e->rank * sendcount * g.es;
    if (sendcount && (const unsigned char *)sendbuf != own) memmove(own, sendbuf, sendcount * g.es);
    if (e->nranks == 1) return DDP_SUCCESS;
    g.shift = 0;
    g.nsteps = g.p - 1;
    _ddp_ring_plan(&g, sendcount * (size_t)g.p, sendcount * (size_t)g.p, 0, g.p, 0);
    return _ddp_ring_run(&g);
}

_DDP_PRIVATE ddp_result_t _ddp_ring_broadcast(_ddp_engine_t *e, const void *sendbuf, void *recvbuf,
                                        size_t count, ddp_dtype_t dtype, int root) {
    _ddp_ring_t g;
    _ddp_ring_setup(&g, e, _DDP_RING_BCAST, sendbuf, recvbuf, dtype, DDP_SUM, count, root);
    if (e->rank == root && count && sendbuf != recvbuf) memmove(recvbuf, sendbuf, count * g.es);
    if (e->nranks == 1) return DDP_SUCCESS;
    g.nsteps = 1;
    _ddp_ring_plan(&g, count, count, 0, 1, 0);   /* one chunk: the whole buffer */
    /* The chain forwards from recvbuf: the root's copy is already there. */
    g.send = g.recv;
    return _ddp_ring_run(&g);
}

#endif /* DDP_RING_IMPLEMENTATION */
