/* SPDX-License-Identifier: MIT (see LICENSE) */
/* ddp_ring.h — libddp's collective algorithms, private.
 *
 * Written against the point-to-point engine of ddp_engine.h (rank, size, scratch, isend/irecv/
 * test/block), never against the communicator; ddp_comm.h picks one per call (by size, world
 * size and settings, the same on every rank) after its entry checks, and runs it. Every
 * function here is _ddp_ and static: users reach them only through the public collectives.
 * Depends on ddp_engine.h and ddp_kernels.h. Built by DDP_IMPLEMENTATION.
 *
 * ALGORITHMS
 *   all-reduce      = reduce-scatter then all-gather around the ring: each rank sends
 *                     2(p-1)/p of the buffer, the bandwidth optimum (Patarasuk & Yuan, "Bandwidth
 *                     optimal all-reduce algorithms for clusters of workstations", JPDC 2009).
 *   reduce-scatter  the first half alone; rank r ends with chunk r (NCCL's layout).
 *   all-gather      the second half alone.
 *   broadcast       a pipelined chain root -> root+1 -> ... (every link carries the buffer once);
 *                   up to 16 KiB inside the agreement below (recursive doubling).
 *   reduce          small: inside the agreement (recursive doubling, up to 16 KiB), else a
 *                   binomial tree towards the root (log2 p hops; every rank adds its
 *                   children's partial results in rank order); large: a pipelined chain
 *                   root+p-1 -> ... -> root+1 -> root, each rank adding its own data to the
 *                   segment passing through (every link carries the buffer once).
 *   gather/scatter  small: a binomial tree (log2 p hops, subtrees staged in scratch); large:
 *                   linear, the root exchanging with every rank at once, buffer to buffer.
 *   all-to-all      pairwise exchange: step k sends block r+k to rank r+k and receives block
 *                   r-k from rank r-k, DDP_RING_WINDOW steps in flight, buffer to buffer.
 *   send/recv       direct; a group posts all of its sends and receives together (per peer
 *                   and direction DDP_RING_WINDOW in flight) and progresses them all.
 * Small means: reduce up to _DDP_TREE_MAX_BYTES (16 KiB) when (1 + log2 p) buffers fit the
 * scratch; gather/scatter up to 16 KiB for the whole p-block buffer, p > 2.
 * The rooted ones (broadcast, reduce, gather, scatter) first have the ranks agree on the call
 * (_ddp_agree: a tag cannot catch a rank that wrongly thinks it is the root, it receives
 * nothing); a small broadcast or reduce carries its data in that exchange.
 * Chunks are cut into segments (DDP_SEGMENT_BYTES) and up to DDP_RING_WINDOW segments are in
 * flight per direction, so sending, receiving and reducing overlap; a step streams its chunk
 * while the previous step's data is still arriving. Scratch is the window, never the message.
 * Each chunk is reduced in one fixed order along the ring and then copied out, so every rank ends
 * with the same bits, run after run.
 *
 */
#if defined(DDP_IMPLEMENTATION) && !defined(DDP_RING_IMPLEMENTATION)
#define DDP_RING_IMPLEMENTATION
#endif
#if defined(DDP_RING_IMPLEMENTATION)
#ifndef DDP_BASE_IMPLEMENTATION
#define DDP_BASE_IMPLEMENTATION
#endif
#ifndef DDP_ENGINE_IMPLEMENTATION
#define DDP_ENGINE_IMPLEMENTATION
#endif
#ifndef DDP_KERNELS_IMPLEMENTATION
#define DDP_KERNELS_IMPLEMENTATION
#endif
#endif
#include "ddp_engine.h"
#include "ddp_kernels.h"

#if defined(DDP_RING_IMPLEMENTATION) && !defined(DDP_RING_IMPL_INCLUDED)
#define DDP_RING_IMPL_INCLUDED
#if !defined(DDP_ENGINE_IMPL_INCLUDED) || !defined(DDP_KERNELS_IMPL_INCLUDED)
#error "libddp: ddp_ring.h's implementation needs ddp_engine.h's and ddp_kernels.h's (define DDP_IMPLEMENTATION)"
#endif

/* Recursive doubling's messages carry another digest than the ring's, so ranks that chose
 * different all-reduce algorithms (DDP_ALGO set differently) fail with a mismatch. */
#define _DDP_TAG_RECURSIVE_DOUBLING 0x100

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

_DDP_PRIVATE ddp_result_t _ddp_ring_run(_ddp_ring_t *g) {
    _ddp_engine_t *e = g->e;
    const size_t total = g->nseg * (size_t)g->nsteps, W = DDP_RING_WINDOW;
    _ddp_ring_op_t sq[DDP_RING_WINDOW], rq[DDP_RING_WINDOW];
    int free_slots[DDP_RING_WINDOW], nfree = 0;
    /* Reduce-scatter: slots holding partial sums, in the order their forwarding sends come. */
    int parked[DDP_RING_WINDOW];
    size_t park_head = 0, park_tail = 0;
    size_t ns = 0, nr = 0, ds = 0, dr = 0;
    int64_t last = _ddp_now_us(), spin_until;
    int peers[2];
    const int bcast = g->kind == _DDP_RING_BCAST;
    const int pos = bcast ? (int)_ddp_ring_mod(g, g->r - g->root) : 0;
    const int sends = !bcast || pos != g->p - 1, recvs = !bcast || pos != 0;
    ddp_result_t r;
    int i;
    for (i = 0; i < DDP_RING_WINDOW; i++) free_slots[nfree++] = i;
    peers[0] = g->next;
    peers[1] = g->prev;
    if (!sends) ds = ns = total;
    if (!recvs) dr = nr = total;
    spin_until = last + e->spin_us;

    while (ds < total || dr < total) {
        int progressed = 0;
        /* Post receives while the window and the scratch allow. */
        while (nr < total && nr - dr < W) {
            int t;
            size_t k, gs, ch, off, len;
            _ddp_ring_op_t *o = &rq[nr % W];
            _ddp_ring_item(g, nr, &t, &k, &gs);
            ch = bcast ? 0 : _ddp_ring_mod(g, (long)g->r - t - 1 + g->shift);
            _ddp_ring_seg(g, ch, k, &off, &len);
            o->item = nr;
            o->req = NULL;
            o->slot = -1;
            if (len) {
                void *dst;
                if (_ddp_ring_reduces(g, t)) {
                    if (!nfree) break;
                    o->slot = free_slots[--nfree];
                    dst = e->scratch + (size_t)o->slot * e->segment_bytes;
                } else {
                    dst = g->recv + off * g->es;
                }
                r = e->irecv(e->host, g->prev, dst, len * g->es, g->tag, &o->req);
                if (r != DDP_SUCCESS) return _ddp_ring_fail(g, r, nr);
            }
            nr++;
        }
        /* Post sends whose data is ready. */
        while (ns < total && ns - ds < W) {
            int t;
            size_t k, gs, ch, off, len;
            const unsigned char *src;
            _ddp_ring_op_t *o = &sq[ns % W];
            _ddp_ring_item(g, ns, &t, &k, &gs);
            if (bcast && pos != 0) { if (dr <= ns) break; }       /* forward what arrived */
            else if (t > g->t0 && dr <= ns - gs) break;           /* needs recv (t - 1, k) */
            ch = bcast ? 0 : _ddp_ring_mod(g, (long)g->r - t + g->shift);
            _ddp_ring_seg(g, ch, k, &off, &len);
            o->item = ns;
            o->req = NULL;
            o->slot = -1;
            if (g->kind == _DDP_RING_RS && t > g->t0) {
                if (len) {
                    o->slot = parked[park_head++ % W];            /* the partial sum */
                    src = e->scratch + (size_t)o->slot * e->segment_bytes;
                } else {
                    src = NULL;
                }
            } else if (t == g->t0 && !(bcast && pos != 0)) {
                src = g->kind == _DDP_RING_AG ? g->send + (off - g->own_off) * g->es
                                              : g->send + off * g->es;
            } else {
                src = g->recv + off * g->es;
            }
            if (len) {
                r = e->isend(e->host, g->next, src, len * g->es, g->tag, &o->req);
                if (r != DDP_SUCCESS) return _ddp_ring_fail(g, r, ns);
            }
            ns++;
        }
        /* Retire completed sends, in order. */
        while (ds < ns) {
            _ddp_ring_op_t *o = &sq[ds % W];
            int done = 1;
            if (o->req && (r = e->test(e->host, g->next, o->req, &done)) != DDP_SUCCESS)
                return _ddp_ring_fail(g, r, o->item);
            if (!done) break;
            if (o->slot >= 0) free_slots[nfree++] = o->slot;
            ds++;
            progressed = 1;
        }
        /* Retire completed receives, in order, reducing as they land. */
        while (dr < nr) {
            _ddp_ring_op_t *o = &rq[dr % W];
            int done = 1;
            if (o->req && (r = e->test(e->host, g->prev, o->req, &done)) != DDP_SUCCESS)
                return _ddp_ring_fail(g, r, o->item);
            if (!done) break;
            if (o->slot >= 0) {
                int t;
                size_t k, gs, off, len, ch;
                unsigned char *scr = e->scratch + (size_t)o->slot * e->segment_bytes;
                _ddp_ring_item(g, o->item, &t, &k, &gs);
                ch = _ddp_ring_mod(g, (long)g->r - t - 1 + g->shift);
                _ddp_ring_seg(g, ch, k, &off, &len);
                if (g->kind == _DDP_RING_AR || t == g->p - 2) {
                    /* All-reduce accumulates in recvbuf; reduce-scatter's last step is our chunk. */
                    unsigned char *dst = g->kind == _DDP_RING_AR ? g->recv + off * g->es
                                       : g->recv + (off - g->own_off) * g->es;
                    ddp_reduce_local(dst, scr, g->send + off * g->es, len, g->dtype, g->op);
                    if (t == g->p - 2 && g->op == DDP_AVG) ddp_divide_local(dst, len, g->dtype, g->p);
                    free_slots[nfree++] = o->slot;
                } else {
                    ddp_reduce_local(scr, scr, g->send + off * g->es, len, g->dtype, g->op);
                    parked[park_tail++ % W] = o->slot;            /* freed once forwarded */
                }
            }
            dr++;
            progressed = 1;
        }
        if (progressed) {
            last = _ddp_now_us();
            spin_until = last + e->spin_us;
            continue;
        }
        {
            int64_t now = _ddp_now_us();
            if (e->timeout_ms >= 0 && now - last > (int64_t)e->timeout_ms * 1000) {
                char where[160];
                int waiting_recv = dr < total;
                _ddp_ring_where(g, waiting_recv ? dr : ds, where, sizeof where);
                e->waiting_on = waiting_recv ? g->prev : g->next;
                return _ddp_eng_fail(e, DDP_ERR_TIMEOUT, "%s: no progress for %d ms: %s rank %d",
                                     where, e->timeout_ms,
                                     waiting_recv ? "waiting for data from" : "waiting to send to",
                                     waiting_recv ? g->prev : g->next);
            }
            if (now < spin_until) {
                /* Give the CPU to a runnable peer, if any: costs ~1 us when there is none. */
                sched_yield();
            } else {
                int ms = 100;
                if (e->timeout_ms >= 0) {
                    int64_t left = (int64_t)e->timeout_ms * 1000 - (now - last);
                    if (left / 1000 + 1 < ms) ms = (int)(left / 1000) + 1;
                }
                r = e->block(e->host, peers, g->next == g->prev ? 1 : 2, ms);
                if (r != DDP_SUCCESS) return _ddp_ring_fail(g, r, dr < total ? dr : ds);
            }
        }
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

/* ---------------------------------------------------------------- recursive doubling
 * Small all-reduces are latency-bound: the ring's 2(p-1) hops cost more than its bandwidth saves.
 * Recursive doubling takes log2(p) hops, each exchanging the whole buffer with rank r ^ 2^i
 * (Thakur, Rabenseifner & Gropp, "Optimization of collective communication operations in MPICH",
 * IJHPCA 2005). A non-power-of-two world first folds its extra ranks r >= 2^k into r - 2^k and
 * hands them the result at the end. Both partners of a pair combine (lower rank's data, higher
 * rank's data) in that order, so every rank ends with the same bits. The buffer must fit the
 * scratch (the caller checks). */
/* Where a recursive-doubling wait is, formatted only if it fails (no snprintf per step). */
typedef struct { unsigned seq; int step, steps, partner; const char *stage; } _ddp_rd_where_t;
_DDP_PRIVATE void _ddp_rd_where(const _ddp_rd_where_t *w, char *out, size_t cap) {
    if (w->steps)
        snprintf(out, cap, "all_reduce #%u, recursive doubling step %d/%d with rank %d", w->seq,
                 w->step, w->steps, w->partner);
    else
        snprintf(out, cap, "all_reduce #%u, recursive doubling %s rank %d", w->seq, w->stage, w->partner);
}

_DDP_PRIVATE ddp_result_t _ddp_p2p_wait(_ddp_engine_t *e, const int *peers, void **reqs, int n,
                                  const _ddp_rd_where_t *where) {
    char what[160];
    int64_t last = _ddp_now_us();
    ddp_result_t r;
    for (;;) {
        int i, pending = 0, progressed = 0;
        for (i = 0; i < n; i++) {
            int done = 1;
            if (!reqs[i]) continue;
            if ((r = e->test(e->host, peers[i], reqs[i], &done)) != DDP_SUCCESS) {
                /* Re-word the transport's message: "rank R: <what>: <transport detail>". */
                char prev[1024], *detail = prev, *tail;
                _ddp_strlcpy(prev, e->last_error(e->host), sizeof prev);
                if (!strncmp(prev, "rank ", 5) && strstr(prev, ": ")) detail = strstr(prev, ": ") + 2;
                if ((tail = strstr(detail, " [")) != NULL) *tail = 0;
                _ddp_rd_where(where, what, sizeof what);
                return _ddp_eng_fail(e, r, "%s: %s", what, detail);
            }
            if (done) { reqs[i] = NULL; progressed = 1; } else pending++;
        }
        if (!pending) return DDP_SUCCESS;
        {
            int64_t now = _ddp_now_us();
            if (progressed) { last = now; continue; }
            if (e->timeout_ms >= 0 && now - last > (int64_t)e->timeout_ms * 1000) {
                _ddp_rd_where(where, what, sizeof what);
                e->waiting_on = reqs[0] ? peers[0] : peers[n - 1];
                return _ddp_eng_fail(e, DDP_ERR_TIMEOUT, "%s: no progress for %d ms waiting for "
                                     "rank %d", what, e->timeout_ms, reqs[0] ? peers[0] : peers[n - 1]);
            }
            if (now - last < e->spin_us) sched_yield();
            else if ((r = e->block(e->host, peers, n, 100)) != DDP_SUCCESS) return r;
        }
    }
}

_DDP_PRIVATE int _ddp_log2(int v) { int k = 0; while ((1 << k) < v) k++; return k; }

/* a op b into d, after hdr bytes combined as unsigned bytes under MAX (the agreement's digests) */
static inline void _ddp_rd_combine(unsigned char *d, const unsigned char *a, const unsigned char *b, size_t hdr,
                                   size_t count, ddp_dtype_t dtype, ddp_op_t op) {
    if (hdr) ddp_reduce_local(d, a, b, hdr, DDP_UINT8, DDP_MAX);
    ddp_reduce_local(d + hdr, a + hdr, b + hdr, count, dtype, op);
}

/* Over the members of gr (member numbers in the algorithm, ranks on the wire). The buffers may
 * start with hdr bytes reduced under byte MAX (_ddp_agree_reduce); 0 for a plain all-reduce. */
_DDP_PRIVATE ddp_result_t _ddp_rd_all_reduce_hdr(_ddp_engine_t *e, const _ddp_group_t *gr, uint64_t tag,
                                                 const void *sendbuf, void *recvbuf, size_t hdr, size_t count,
                                                 ddp_dtype_t dtype, ddp_op_t op) {
    const int p = gr->n, r = gr->me;
    const size_t bytes = hdr + count * ddp_dtype_size(dtype);
    unsigned char *buf = (unsigned char *)recvbuf, *tmp = e->scratch;
    int p2 = 1, extra, mask, peers[2];
    void *reqs[2];
    _ddp_rd_where_t w;
    ddp_result_t rc;
    if (bytes > e->scratch_bytes)   /* the callers choose rd only below it */
        return _ddp_eng_fail(e, DDP_ERR_INVALID_ARGUMENT, "all_reduce: recursive doubling: %zu bytes do not "
                             "fit the %zu-byte scratch", bytes, e->scratch_bytes);
    if (bytes && sendbuf != recvbuf) memcpy(recvbuf, sendbuf, bytes);
    if (p == 1 || !bytes) return DDP_SUCCESS;
    while (p2 * 2 <= p) p2 *= 2;
    extra = p - p2;
    w.seq = (unsigned)(tag & 0xffffffffu);
    w.step = w.steps = 0;
    w.stage = r >= p2 ? "fold into" : "fold from";
    w.partner = _ddp_group_rank(gr, r >= p2 ? r - p2 : r < extra ? r + p2 : r);
    if (r >= p2) {          /* folded: give our data to r - p2, get the result back */
        peers[0] = peers[1] = _ddp_group_rank(gr, r - p2);
        reqs[1] = NULL;
        if ((rc = e->isend(e->host, peers[0], buf, bytes, tag, &reqs[0])) != DDP_SUCCESS ||
            (rc = _ddp_p2p_wait(e, peers, reqs, 1, &w)) != DDP_SUCCESS ||
            (rc = e->irecv(e->host, peers[0], buf, bytes, tag, &reqs[0])) != DDP_SUCCESS ||
            (rc = _ddp_p2p_wait(e, peers, reqs, 1, &w)) != DDP_SUCCESS)
            return rc;
        return DDP_SUCCESS;
    }
    if (r < extra) {
        peers[0] = _ddp_group_rank(gr, r + p2);
        if ((rc = e->irecv(e->host, peers[0], tmp, bytes, tag, &reqs[0])) != DDP_SUCCESS ||
            (rc = _ddp_p2p_wait(e, peers, reqs, 1, &w)) != DDP_SUCCESS)
            return rc;
        _ddp_rd_combine(buf, buf, tmp, hdr, count, dtype, op);
    }
    for (mask = 1; mask < p2; mask <<= 1) {
        int partner = r ^ mask, step = 0;
        while ((1 << step) < mask) step++;
        w.step = step + 1;
        w.steps = _ddp_log2(p2);
        w.partner = _ddp_group_rank(gr, partner);
        peers[0] = peers[1] = w.partner;
        if ((rc = e->irecv(e->host, w.partner, tmp, bytes, tag, &reqs[1])) != DDP_SUCCESS ||
            (rc = e->isend(e->host, w.partner, buf, bytes, tag, &reqs[0])) != DDP_SUCCESS ||
            (rc = _ddp_p2p_wait(e, peers, reqs, 2, &w)) != DDP_SUCCESS)
            return rc;
        if (r < partner) _ddp_rd_combine(buf, buf, tmp, hdr, count, dtype, op);
        else _ddp_rd_combine(buf, tmp, buf, hdr, count, dtype, op);
    }
    if (op == DDP_AVG) ddp_divide_local(buf + hdr, count, dtype, p);
    w.steps = 0;
    w.stage = "result to";
    w.partner = _ddp_group_rank(gr, r < extra ? r + p2 : r);
    if (r < extra) {
        peers[0] = w.partner;
        if ((rc = e->isend(e->host, w.partner, buf, bytes, tag, &reqs[0])) != DDP_SUCCESS ||
            (rc = _ddp_p2p_wait(e, peers, reqs, 1, &w)) != DDP_SUCCESS)
            return rc;
    }
    return DDP_SUCCESS;
}

_DDP_PRIVATE ddp_result_t _ddp_rd_all_reduce_in(_ddp_engine_t *e, const _ddp_group_t *gr, uint64_t tag,
                                                const void *sendbuf, void *recvbuf, size_t count,
                                                ddp_dtype_t dtype, ddp_op_t op) {
    return _ddp_rd_all_reduce_hdr(e, gr, tag, sendbuf, recvbuf, 0, count, dtype, op);
}

_DDP_PRIVATE ddp_result_t _ddp_rd_all_reduce(_ddp_engine_t *e, const void *sendbuf, void *recvbuf,
                                       size_t count, ddp_dtype_t dtype, ddp_op_t op) {
    _ddp_group_t world = _ddp_group_world(e);
    uint64_t tag = _ddp_eng_tag(e, DDP_CALL_ALL_REDUCE | _DDP_TAG_RECURSIVE_DOUBLING, dtype, op, count, 0);
    return _ddp_rd_all_reduce_in(e, &world, tag, sendbuf, recvbuf, count, dtype, op);
}

/* ---------------------------------------------------------------- rooted calls: agree first
 * Every message carries its collective's digest (root included), but a tag only catches a
 * message that arrives: in a broadcast or scatter a rank that thinks it is the root receives
 * nothing, so two self-made roots both "succeed", and in a reduce or gather a rank waits for a
 * child nobody sends as. So before a rooted collective moves any data the ranks agree on the
 * call: a recursive-doubling all-reduce (MAX) of (d, ~d), d a digest of (kind, dtype, op,
 * count, root), leaves every rank with the largest and the smallest digest in log2(p)
 * exchanges (one more for a world that is not a power of two). They are equal iff every rank
 * called the same thing: each rank's digest enters the result (recursive doubling combines all
 * inputs), and every rank computes the same result. Complete whatever the disagreement:
 *   - the exchange's partners depend only on the world size and the rank, never on the root,
 *     count or kind, so every rank reaches the same messages (a rank in another, unrooted
 *     collective fails on the first message's tag, as before);
 *   - each send meets its receive, so nothing is left on a connection either way;
 *   - every rank gets the same verdict: on a mismatch all return DDP_ERR_MISMATCH, and the
 *     communicator then poisons itself on every rank, like any failed collective.
 * On a mismatch only, a second all-reduce tells every rank who called what: the highest rank
 * holding the largest digest and the highest holding the smallest, with their calls (holders
 * of one digest made the same call, so MAX over their fields is that call). Cost: one
 * 16-byte exchange per step, before the data. */
/* "reduce of 8 x float32, sum, root 0" */
_DDP_PRIVATE void _ddp_call_str(const uint64_t f[5], char *out, size_t cap) {
    const int red = f[0] == DDP_CALL_REDUCE;
    snprintf(out, cap, "%s of %llu x %s%s%s, root %llu", _ddp_kind_name((int)f[0]), (unsigned long long)f[3],
             ddp_dtype_name((ddp_dtype_t)f[1]), red ? ", " : "", red ? ddp_op_name((ddp_op_t)f[2]) : "",
             (unsigned long long)f[4]);
}

_DDP_PRIVATE ddp_result_t _ddp_agree_fail(_ddp_engine_t *e, ddp_result_t r, const uint64_t mine[5]) {
    /* the exchange said "all_reduce #N, recursive doubling ... [code]": say what it was for,
     * and what this rank called (a peer with another count sent another length) */
    char prev[1024], me[160], *rd, *tail;
    _ddp_strlcpy(prev, e->last_error(e->host), sizeof prev);
    if ((rd = strstr(prev, "recursive doubling")) == NULL) {   /* failed posting: "rank R: detail" */
        rd = prev;
        if (!strncmp(prev, "rank ", 5) && strstr(prev, ": ")) rd = strstr(prev, ": ") + 2;
    }
    if ((tail = strstr(rd, " [")) != NULL) *tail = 0;
    _ddp_call_str(mine, me, sizeof me);
    return _ddp_eng_fail(e, r, "%s #%u: agreeing on the call with the other ranks, %s; this rank called %s",
                         _ddp_kind_name((int)mine[0]), e->seq + 1, rd, me);
}

static inline uint64_t _ddp_agree_tag(const char *what, uint64_t seq) {
    return (_ddp_fnv1a(what, strlen(what), _DDP_FNV_INIT) & 0xffffffff00000000ull) | seq;
}

static inline uint64_t _ddp_agree_digest(uint64_t mine[5], int kind, ddp_dtype_t dtype, ddp_op_t op, size_t count,
                                         int root) {
    mine[0] = (uint64_t)kind; mine[1] = (uint64_t)dtype; mine[2] = (uint64_t)op; mine[3] = count;
    mine[4] = (uint64_t)root;
    return _ddp_fnv1a(mine, 5 * sizeof mine[0], _DDP_FNV_INIT);
}

/* The ranks disagree (every rank knows it): find out who called what, for the message. */
_DDP_PRIVATE ddp_result_t _ddp_agree_explain(_ddp_engine_t *e, int kind, const uint64_t mine[5], uint64_t d,
                                             uint64_t seq, const uint64_t *v) {
    const _ddp_group_t world = _ddp_group_world(e);
    uint64_t w[2], who[12];
    char hi[160], lo[160], me[160];
    ddp_result_t rc;
    if (!v) {   /* the verdict came from another exchange: get the extreme digests */
        w[0] = d;
        w[1] = ~d;
        rc = _ddp_rd_all_reduce_in(e, &world, _ddp_agree_tag("agree extremes", seq), w, w, 2, DDP_UINT64, DDP_MAX);
        if (rc != DDP_SUCCESS) return _ddp_agree_fail(e, rc, mine);
        v = w;
    }
    memset(who, 0, sizeof who);
    if (d == v[0]) { who[0] = (uint64_t)e->rank; memcpy(who + 1, mine, 5 * sizeof mine[0]); }
    if (d == ~v[1]) { who[6] = (uint64_t)e->rank; memcpy(who + 7, mine, 5 * sizeof mine[0]); }
    rc = _ddp_rd_all_reduce_in(e, &world, _ddp_agree_tag("agree who", seq), who, who, 12, DDP_UINT64, DDP_MAX);
    if (rc != DDP_SUCCESS) return _ddp_agree_fail(e, rc, mine);
    _ddp_call_str(who + 1, hi, sizeof hi);
    _ddp_call_str(who + 7, lo, sizeof lo);
    _ddp_call_str(mine, me, sizeof me);
    return _ddp_eng_fail(e, DDP_ERR_MISMATCH, "%s #%u: the ranks called different things (found before any data "
                         "was used): rank %llu called %s, rank %llu called %s; this rank called %s",
                         _ddp_kind_name(kind), (unsigned)seq, (unsigned long long)who[0], hi,
                         (unsigned long long)who[6], lo, me);
}

_DDP_PRIVATE ddp_result_t _ddp_agree(_ddp_engine_t *e, int kind, ddp_dtype_t dtype, ddp_op_t op, size_t count,
                                     int root) {
    const _ddp_group_t world = _ddp_group_world(e);
    const uint64_t seq = (uint32_t)(e->seq + 1);   /* the collective's own number: seq moves once */
    uint64_t mine[5], v[2], d;
    ddp_result_t rc;
    if (e->nranks == 1) return DDP_SUCCESS;
    d = _ddp_agree_digest(mine, kind, dtype, op, count, root);
    v[0] = d;
    v[1] = ~d;
    rc = _ddp_rd_all_reduce_in(e, &world, _ddp_agree_tag("agree", seq), v, v, 2, DDP_UINT64, DDP_MAX);
    if (rc != DDP_SUCCESS) return _ddp_agree_fail(e, rc, mine);
    if (v[0] == ~v[1]) return DDP_SUCCESS;
    return _ddp_agree_explain(e, kind, mine, d, seq, v);
}

/* A small broadcast or reduce is the agreement itself: one recursive-doubling exchange of
 * (d, ~d, data), the 16 digest bytes combined under byte MAX and the data under the call's op
 * (a broadcast's as bytes under MAX, with the root's data and zeros elsewhere: max(x, 0) = x).
 * The digests agree everywhere iff each byte's largest value equals its smallest (the
 * complement of the complements' largest), i.e. iff every rank made the same call; so this is
 * as complete as _ddp_agree, for one exchange per step instead of an agreement and then the
 * data's own hops. The data is used (copied out) only after the verdict. Ranks with different
 * counts send different lengths: the transport says DDP_ERR_MISMATCH at the first receive, and
 * the others learn it from the failure it publishes. *done = 0 when it does not fit (the
 * caller agrees, then runs the chain or the tree). */
#define _DDP_AGREE_HDR 16
#ifndef _DDP_AGREE_DATA_MAX_BYTES
#define _DDP_AGREE_DATA_MAX_BYTES (16u << 10)
#endif
_DDP_PRIVATE ddp_result_t _ddp_agree_with_data(_ddp_engine_t *e, int kind, const void *sendbuf, void *recvbuf,
                                               size_t count, ddp_dtype_t dtype, ddp_op_t op, int root, int *done) {
    const _ddp_group_t world = _ddp_group_world(e);
    const size_t bytes = count * ddp_dtype_size(dtype), half = (e->scratch_bytes / 2) & ~(size_t)15;
    const uint64_t seq = (uint32_t)(e->seq + 1);
    const int bcast = kind == DDP_CALL_BROADCAST;
    unsigned char *stage = e->scratch + half;   /* the exchange itself uses the first half */
    uint64_t mine[5], d, nd;
    ddp_result_t rc;
    int i;
    *done = 0;
    if (e->nranks == 1 || bytes > _DDP_AGREE_DATA_MAX_BYTES || _DDP_AGREE_HDR + bytes > half) return DDP_SUCCESS;
    *done = 1;
    d = _ddp_agree_digest(mine, kind, dtype, bcast ? DDP_SUM : op, count, root);
    nd = ~d;
    memcpy(stage, &d, 8);
    memcpy(stage + 8, &nd, 8);
    if (!bcast || e->rank == root) { if (bytes) memcpy(stage + _DDP_AGREE_HDR, sendbuf, bytes); }
    else memset(stage + _DDP_AGREE_HDR, 0, bytes);
    rc = _ddp_rd_all_reduce_hdr(e, &world, _ddp_agree_tag(bcast ? "broadcast" : "reduce", seq), stage, stage,
                                _DDP_AGREE_HDR, bcast ? bytes : count, bcast ? DDP_UINT8 : dtype,
                                bcast ? DDP_MAX : op);
    if (rc != DDP_SUCCESS) return _ddp_agree_fail(e, rc, mine);
    for (i = 0; i < 8; i++)
        if (stage[i] != (unsigned char)~stage[8 + i])
            return _ddp_agree_explain(e, kind, mine, d, seq, NULL);
    e->seq++;   /* this was the collective */
    if (bytes && (bcast || e->rank == root)) memcpy(recvbuf, stage + _DDP_AGREE_HDR, bytes);
    return DDP_SUCCESS;
}

/* ---------------------------------------------------------------- reduce, gather, scatter,
 * all-to-all (ddp_comm.h posts send/recv and groups through the same helpers)
 * Every message of a collective carries its _ddp_eng_tag (a digest of kind, dtype, op, count,
 * root, and the collective's number), so ranks calling different things fail with
 * DDP_ERR_MISMATCH at the first message that reaches the wrong call. A send/recv carries a
 * digest of (dtype, count) and its number among the messages of that direction of that pair:
 * only the two ranks take part, so the collectives' sequence (e->seq) stays untouched. Peers
 * beyond the ring and recursive-doubling partners are connected on first use: both sides of a
 * pair ask for each other in the same call. */
/* Measured over TCP at p = 3 and 4 on the 2-core VM (each call followed by a barrier, slowest
 * rank, best of 3; tree forced with -D_DDP_TREE_MAX_BYTES=256M against chain/linear with 0):
 * up to 16 KiB the two are within the noise (0.85-1.2x either way); from 64 KiB the chain and
 * the linear forms win, 1.2-2.7x. -D overrides it for such a measurement. */
#ifndef _DDP_TREE_MAX_BYTES
#define _DDP_TREE_MAX_BYTES (16u << 10)
#endif
#define _DDP_LINEAR_FAN 32                /* requests a linear root keeps posted */

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
    {
        int ms = 100;
        if (e->timeout_ms >= 0) {
            int64_t left = (int64_t)e->timeout_ms * 1000 - (now - last);
            if (left / 1000 + 1 < ms) ms = (int)(left / 1000) + 1;
        }
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

/* ---------------------------------------------------------------- Rabenseifner
 * For messages too big for recursive doubling's whole-buffer exchanges and too small for the
 * ring's 2(p - 1) steps: a reduce-scatter by recursive halving, then an all-gather by recursive
 * doubling (R. Rabenseifner, "Optimization of collective reduction operations", ICCS 2004;
 * Thakur, Rabenseifner & Gropp 2005): 2 log2 p steps, each rank sending 2(p - 1)/p of the
 * buffer, as the ring does. Extra members of a non-power-of-two group fold in first and get the
 * result back, as in recursive doubling. Step i pairs member r with r ^ 2^i (i = 0, 1, ...); the
 * two hold the same range, keep one half each (the lower member the lower half) and combine
 * (lower member's data, higher member's): the additions of recursive doubling, in its order, so
 * the two algorithms give the same bits, and a bucket of a flat buffer gets the bits of the whole
 * (nothing depends on where the halves fall). Messages move in pieces of a scratch slot,
 * DDP_RING_WINDOW of them per direction at a time. */
#define _DDP_TAG_RABENSEIFNER 0x200

/* Sends sn elements from sbuf to peer while receiving rn from it into rbuf: straight in
 * (reduce 0), or through the scratch and combined into rbuf (lower: ours first). */
_DDP_PRIVATE ddp_result_t _ddp_rab_xchg(const _ddp_x_t *x, int peer, const unsigned char *sbuf, size_t sn,
                                        unsigned char *rbuf, size_t rn, int reduce, int lower,
                                        ddp_dtype_t dtype, ddp_op_t op, uint64_t tag, const char *phase) {
    _ddp_engine_t *e = x->e;
    const size_t es = ddp_dtype_size(dtype), pe = e->segment_bytes / es ? e->segment_bytes / es : 1;
    _ddp_xop_t ops[2 * DDP_RING_WINDOW];
    size_t so = 0, ro = 0;
    ddp_result_t r;
    while (so < sn || ro < rn) {
        size_t roff[DDP_RING_WINDOW], rlen[DDP_RING_WINDOW];
        int n = 0, nrecv = 0, i;
        for (i = 0; i < DDP_RING_WINDOW && ro < rn; i++, nrecv++) {
            roff[i] = ro;
            rlen[i] = rn - ro < pe ? rn - ro : pe;
            r = _ddp_x_post(x, &ops[n++], peer, 0, reduce ? e->scratch + (size_t)i * e->segment_bytes
                                                          : rbuf + ro * es, rlen[i] * es, tag, phase);
            if (r != DDP_SUCCESS) return r;
            ro += rlen[i];
        }
        for (i = 0; i < DDP_RING_WINDOW && so < sn; i++) {
            size_t len = sn - so < pe ? sn - so : pe;
            if ((r = _ddp_x_post(x, &ops[n++], peer, 1, sbuf + so * es, len * es, tag, phase)) != DDP_SUCCESS)
                return r;
            so += len;
        }
        if ((r = _ddp_x_waitall(x, ops, n, phase)) != DDP_SUCCESS) return r;
        for (i = 0; reduce && i < nrecv; i++) {
            unsigned char *acc = rbuf + roff[i] * es;
            const unsigned char *in = e->scratch + (size_t)i * e->segment_bytes;
            if (lower) ddp_reduce_local(acc, acc, in, rlen[i], dtype, op);
            else ddp_reduce_local(acc, in, acc, rlen[i], dtype, op);
        }
    }
    return DDP_SUCCESS;
}

_DDP_PRIVATE ddp_result_t _ddp_rab_all_reduce_in(_ddp_engine_t *e, const _ddp_group_t *gr, uint64_t tag,
                                                 const void *sendbuf, void *recvbuf, size_t count,
                                                 ddp_dtype_t dtype, ddp_op_t op) {
    const int p = gr->n, r = gr->me;
    const size_t es = ddp_dtype_size(dtype);
    unsigned char *buf = (unsigned char *)recvbuf;
    size_t lo = 0, hi = count, los[32], his[32];
    int p2 = 1, extra, mask, level = 0, nlist = 0, list[34];
    char phase[96];
    _ddp_x_t x;
    ddp_result_t rc;
    _ddp_x_setup(&x, e, "all_reduce", "rabenseifner", tag);
    if (count && sendbuf != recvbuf) memcpy(recvbuf, sendbuf, count * es);
    if (p == 1 || !count) return DDP_SUCCESS;
    while (p2 * 2 <= p) p2 *= 2;
    extra = p - p2;
    if (r >= p2) list[nlist++] = _ddp_group_rank(gr, r - p2);
    else {
        if (r < extra) list[nlist++] = _ddp_group_rank(gr, r + p2);
        for (mask = 1; mask < p2; mask <<= 1) list[nlist++] = _ddp_group_rank(gr, r ^ mask);
    }
    if ((rc = _ddp_x_connect(&x, list, nlist)) != DDP_SUCCESS) return rc;
    if (r >= p2) {          /* folded: our data to r - p2, the result back */
        snprintf(phase, sizeof phase, "phase fold into rank %d", list[0]);
        if ((rc = _ddp_rab_xchg(&x, list[0], buf, count, NULL, 0, 0, 0, dtype, op, tag, phase)) != DDP_SUCCESS)
            return rc;
        snprintf(phase, sizeof phase, "phase result from rank %d", list[0]);
        return _ddp_rab_xchg(&x, list[0], NULL, 0, buf, count, 0, 0, dtype, op, tag, phase);
    }
    if (r < extra) {
        snprintf(phase, sizeof phase, "phase fold from rank %d", list[0]);
        if ((rc = _ddp_rab_xchg(&x, list[0], NULL, 0, buf, count, 1, 1, dtype, op, tag, phase)) != DDP_SUCCESS)
            return rc;
    }
    for (mask = 1; mask < p2; mask <<= 1, level++) {     /* recursive halving */
        const int partner = r ^ mask, peer = _ddp_group_rank(gr, partner);
        const size_t mid = lo + (hi - lo) / 2;
        const int keep_low = r < partner;
        los[level] = lo; his[level] = hi;
        snprintf(phase, sizeof phase, "phase reduce-scatter step %d/%d with rank %d", level + 1, _ddp_log2(p2), peer);
        rc = _ddp_rab_xchg(&x, peer, buf + (keep_low ? mid : lo) * es, keep_low ? hi - mid : mid - lo,
                           buf + (keep_low ? lo : mid) * es, keep_low ? mid - lo : hi - mid, 1, keep_low,
                           dtype, op, tag, phase);
        if (rc != DDP_SUCCESS) return rc;
        if (keep_low) hi = mid; else lo = mid;
    }
    if (op == DDP_AVG && hi > lo) ddp_divide_local(buf + lo * es, hi - lo, dtype, p);
    for (mask = p2 >> 1; mask >= 1; mask >>= 1) {         /* recursive doubling, in reverse */
        const int partner = r ^ mask, peer = _ddp_group_rank(gr, partner);
        const size_t plo = los[--level], phi = his[level];
        const size_t olo = lo == plo ? hi : plo, ohi = lo == plo ? phi : lo;   /* the partner's half */
        snprintf(phase, sizeof phase, "phase all-gather step %d/%d with rank %d", _ddp_log2(p2) - level,
                 _ddp_log2(p2), peer);
        rc = _ddp_rab_xchg(&x, peer, buf + lo * es, hi - lo, buf + olo * es, ohi - olo, 0, 0, dtype, op,
                           tag, phase);
        if (rc != DDP_SUCCESS) return rc;
        lo = plo; hi = phi;
    }
    if (r < extra) {
        snprintf(phase, sizeof phase, "phase result to rank %d", list[0]);
        return _ddp_rab_xchg(&x, list[0], buf, count, NULL, 0, 0, 0, dtype, op, tag, phase);
    }
    return DDP_SUCCESS;
}

_DDP_PRIVATE ddp_result_t _ddp_rab_all_reduce(_ddp_engine_t *e, const void *sendbuf, void *recvbuf,
                                              size_t count, ddp_dtype_t dtype, ddp_op_t op) {
    _ddp_group_t world = _ddp_group_world(e);
    uint64_t tag = _ddp_eng_tag(e, DDP_CALL_ALL_REDUCE | _DDP_TAG_RABENSEIFNER, dtype, op, count, 0);
    return _ddp_rab_all_reduce_in(e, &world, tag, sendbuf, recvbuf, count, dtype, op);
}

/* ---------------------------------------------------------------- hierarchical all-reduce
 * Many ranks on few hosts: a flat ring pays 2(p - 1) network latencies and drives each host's
 * link with one stream. The two-level scheme of NCCL's trees/rings over nodes and Horovod's
 * hierarchical all-reduce instead: (1) reduce-scatter inside each host (the ring over its
 * ranks, shared memory) into L slices, L = the fewest ranks any host has; (2) the ranks with
 * local number i < L, one per host, all-reduce slice i across the hosts (ring, recursive doubling
 * or Rabenseifner), L of these at once, so every host's link carries L streams; (3) all-gather
 * inside each host. A host with more than L ranks: its ranks >= L own empty slices and only
 * forward inside the host. Each element is reduced in one fixed order (host ring, then across)
 * and then copied, so every rank gets the same bits, run after run. AVG sums, then divides once
 * by the world size where the slice is complete. The buffer may be a window of a virtual one
 * (the reducer's flat buffers): slices and the ring's chunks are cut in the virtual buffer. */
#define _DDP_TAG_HIER 0x400

typedef struct {
    _ddp_group_t local;   /* this host's ranks, in rank order */
    _ddp_group_t inter;   /* the ranks with our local number, one per host in host order (if < slices) */
    int slices;           /* fewest ranks on any host */
    int nhosts, nranks;
} _ddp_hier_t;

enum { _DDP_INTER_RING, _DDP_INTER_RD, _DDP_INTER_RAB };

_DDP_PRIVATE ddp_result_t _ddp_hier_all_reduce(_ddp_engine_t *e, const _ddp_hier_t *h, int inter,
                                               const void *sendbuf, void *recvbuf, size_t count,
                                               ddp_dtype_t dtype, ddp_op_t op, size_t v_total, size_t v_off) {
    const uint64_t tag = _ddp_eng_tag(e, DDP_CALL_ALL_REDUCE | _DDP_TAG_HIER | (inter << 12), dtype, op, count, 0);
    const ddp_op_t sop = op == DDP_AVG ? DDP_SUM : op;
    const int nl = h->local.n, L = h->slices;
    const size_t es = ddp_dtype_size(dtype);
    unsigned char *buf = (unsigned char *)recvbuf;
    ddp_result_t r;
    {   /* neighbours inside the host and partners across, connected on first use (both sides) */
        int list[2 + 34], n = 0, mask, p2 = 1;
        _ddp_x_t x;
        _ddp_x_setup(&x, e, "all_reduce", "hierarchical", tag);
        if (nl > 1) {
            list[n++] = _ddp_group_rank(&h->local, (h->local.me + 1) % nl);
            list[n++] = _ddp_group_rank(&h->local, (h->local.me + nl - 1) % nl);
        }
        if (h->local.me < L && h->inter.n > 1) {
            const int hn = h->inter.n, me = h->inter.me;
            list[n++] = _ddp_group_rank(&h->inter, (me + 1) % hn);
            list[n++] = _ddp_group_rank(&h->inter, (me + hn - 1) % hn);
            if (inter != _DDP_INTER_RING) {
                while (p2 * 2 <= hn) p2 *= 2;
                if (me >= p2) list[n++] = _ddp_group_rank(&h->inter, me - p2);
                else {
                    if (me + p2 < hn) list[n++] = _ddp_group_rank(&h->inter, me + p2);
                    for (mask = 1; mask < p2; mask <<= 1) list[n++] = _ddp_group_rank(&h->inter, me ^ mask);
                }
            }
        }
        if (n && (r = _ddp_x_connect(&x, list, n)) != DDP_SUCCESS) return r;
    }
    /* (1) reduce-scatter inside the host: slice i ends on local rank i */
    r = _ddp_ring_all_reduce_in(e, &h->local, tag ^ (1ull << 56), sendbuf, recvbuf, count, dtype, sop,
                                v_total, v_off, L, 0, nl - 1, " (hierarchical, inside the host)");
    if (r != DDP_SUCCESS) return r;
    /* (2) slice i across the hosts: the part of it this window holds */
    if (h->local.me < L) {
        const size_t a = _ddp_geo_start(v_total, L, (size_t)h->local.me);
        const size_t b = _ddp_geo_start(v_total, L, (size_t)h->local.me + 1);
        const size_t wa = a > v_off ? a : v_off, wb = b < v_off + count ? b : v_off + count;
        if (wb > wa) {
            unsigned char *s = buf + (wa - v_off) * es;
            const size_t n = wb - wa;
            const uint64_t t2 = tag ^ (2ull << 56);
            if (h->inter.n > 1) {
                r = inter == _DDP_INTER_RD ? _ddp_rd_all_reduce_in(e, &h->inter, t2, s, s, n, dtype, sop)
                  : inter == _DDP_INTER_RAB ? _ddp_rab_all_reduce_in(e, &h->inter, t2, s, s, n, dtype, sop)
                  : _ddp_ring_all_reduce_in(e, &h->inter, t2, s, s, n, dtype, sop, b - a, wa - a, h->inter.n,
                                            0, 2 * (h->inter.n - 1), " (hierarchical, across hosts)");
                if (r != DDP_SUCCESS) return r;
            }
            if (op == DDP_AVG) ddp_divide_local(s, n, dtype, h->nranks);
        }
    }
    /* (3) all-gather inside the host */
    return _ddp_ring_all_reduce_in(e, &h->local, tag ^ (3ull << 56), recvbuf, recvbuf, count, dtype, sop,
                                   v_total, v_off, L, nl - 1, nl - 1, " (hierarchical, inside the host)");
}

_DDP_PRIVATE int _ddp_pow2_ceil(int v) { int k = 1; while (k < v) k <<= 1; return k; }

/* Binomial tree over ranks relative to the root (v = rank - root mod p): v's children are
 * v + k for k = 1, 2, 4, ... below lowbit(v) (below p for the root), child v + k heads the
 * subtree [v + k, v + 2k); v's parent is v - lowbit(v). Returns the number of children; list
 * gets their ranks, then the parent's (if any). */
_DDP_PRIVATE int _ddp_tree(const _ddp_engine_t *e, int root, int *list, int *nlist, int *span) {
    const int p = e->nranks, v = (e->rank - root + p) % p;
    int k, n = 0, nchild;
    *span = v ? (v & -v) : _ddp_pow2_ceil(p);
    for (k = 1; k < *span && v + k < p; k <<= 1) list[n++] = (v + k + root) % p;
    nchild = n;
    if (v) list[n++] = (v - *span + root) % p;
    *nlist = n;
    return nchild;
}

_DDP_PRIVATE size_t _ddp_tree_blocks(int p, int v, int k) {   /* blocks in the subtree of v + k */
    return (size_t)(p - v - k < k ? p - v - k : k);
}

_DDP_PRIVATE ddp_result_t _ddp_tree_reduce(_ddp_engine_t *e, const void *sendbuf, void *recvbuf,
                                     size_t count, ddp_dtype_t dtype, ddp_op_t op, int root) {
    const int p = e->nranks, v = (e->rank - root + p) % p;
    const size_t es = ddp_dtype_size(dtype), bytes = count * es;
    int list[34] = {0}, n, nchild, span, i;
    _ddp_xop_t ops[34];
    unsigned char *acc, *in;
    uint64_t tag;
    _ddp_x_t x;
    ddp_result_t r;
    if (bytes && bytes > e->scratch_bytes / (size_t)(1 + _ddp_log2(p)))
        return _ddp_eng_fail(e, DDP_ERR_INVALID_ARGUMENT, "reduce: binomial tree: %d x %zu bytes "
                             "do not fit the %zu-byte scratch", 1 + _ddp_log2(p), bytes, e->scratch_bytes);
    tag = _ddp_eng_tag(e, DDP_CALL_REDUCE, dtype, op, count, root);
    _ddp_x_setup(&x, e, "reduce", "binomial tree", tag);
    if (p == 1 || !count) {
        if (count && sendbuf != recvbuf) memcpy(recvbuf, sendbuf, bytes);
        return DDP_SUCCESS;
    }
    nchild = _ddp_tree(e, root, list, &n, &span);
    if ((r = _ddp_x_connect(&x, list, n)) != DDP_SUCCESS) return r;
    /* The root accumulates in recvbuf, the others in scratch; children's data lands after it. */
    acc = v == 0 ? (unsigned char *)recvbuf : e->scratch;
    in = v == 0 ? e->scratch : e->scratch + bytes;
    for (i = 0; i < nchild; i++)
        if ((r = _ddp_x_post(&x, &ops[i], list[i], 0, in + (size_t)i * bytes, bytes, tag,
                             "phase receive from children")) != DDP_SUCCESS) return r;
    if (acc != (const unsigned char *)sendbuf) memcpy(acc, sendbuf, bytes);
    if ((r = _ddp_x_waitall(&x, ops, nchild, "phase receive from children")) != DDP_SUCCESS) return r;
    /* Own data, then the subtrees v+1, v+2.., v+4.. : rank order, the same bits every run. */
    for (i = 0; i < nchild; i++) ddp_reduce_local(acc, acc, in + (size_t)i * bytes, count, dtype, op);
    if (v == 0) {
        if (op == DDP_AVG) ddp_divide_local(acc, count, dtype, p);
        return DDP_SUCCESS;
    }
    if ((r = _ddp_x_post(&x, &ops[0], list[nchild], 1, acc, bytes, tag, "phase send to parent")) != DDP_SUCCESS)
        return r;
    return _ddp_x_waitall(&x, ops, 1, "phase send to parent");
}

/* Segment size for streaming count elements: >= 4 segments of >= 64 KiB when the message allows
 * (so the chain pipelines), never above DDP_SEGMENT_BYTES (a scratch slot). */
_DDP_PRIVATE size_t _ddp_x_seg_elems(const _ddp_engine_t *e, size_t count, size_t es) {
    size_t cap = e->segment_bytes, want = (count * es / 4 + 4095) & ~(size_t)4095;
    size_t lo = (size_t)(64u << 10) < cap ? (size_t)(64u << 10) : cap;
    size_t seg = want < lo ? lo : want > cap ? cap : want;
    return seg / es;
}

_DDP_PRIVATE ddp_result_t _ddp_chain_reduce(_ddp_engine_t *e, const void *sendbuf, void *recvbuf,
                                      size_t count, ddp_dtype_t dtype, ddp_op_t op, int root) {
    const int p = e->nranks, v = (e->rank - root + p) % p, W = DDP_RING_WINDOW;
    const int from = (e->rank + 1) % p, to = (e->rank + p - 1) % p;
    const int head = v == p - 1, is_root = v == 0;
    const size_t es = ddp_dtype_size(dtype);
    const unsigned char *send = (const unsigned char *)sendbuf;
    unsigned char *recv = (unsigned char *)recvbuf;
    size_t seg, nseg, ns = 0, ds = 0, nr = 0, dr = 0, nsend, nrecv;
    void *sreq[DDP_RING_WINDOW], *rreq[DDP_RING_WINDOW];
    int sslot[DDP_RING_WINDOW], rslot[DDP_RING_WINDOW], free_slots[DDP_RING_WINDOW], nfree = 0, i;
    int peers[2];
    int64_t last;
    uint64_t tag = _ddp_eng_tag(e, DDP_CALL_REDUCE, dtype, op, count, root);
    char where[200];
    _ddp_x_t x;
    ddp_result_t r;
    _ddp_x_setup(&x, e, "reduce", "pipelined chain", tag);
    if (p == 1 || !count) {
        if (count && sendbuf != recvbuf) memcpy(recvbuf, sendbuf, count * es);
        return DDP_SUCCESS;
    }
    peers[0] = from; peers[1] = to;
    if ((r = _ddp_x_connect(&x, head ? &to : is_root ? &from : peers, head || is_root ? 1 : 2)) != DDP_SUCCESS)
        return r;
    seg = _ddp_x_seg_elems(e, count, es);
    nseg = (count + seg - 1) / seg;
    nsend = is_root ? 0 : nseg;
    nrecv = head ? 0 : nseg;
    for (i = 0; i < W; i++) free_slots[nfree++] = i;
    last = _ddp_now_us();
    while (ds < nsend || dr < nrecv) {
        int progressed = 0, done;
        /* The head of the chain streams its own data. */
        while (head && ns < nsend && ns - ds < (size_t)W) {
            size_t off = ns * seg, len = count - off < seg ? count - off : seg;
            sslot[ns % W] = -1;
            if ((r = e->isend(e->host, to, send + off * es, len * es, tag, &sreq[ns % W])) != DDP_SUCCESS) goto fail_send;
            ns++;
        }
        while (nr < nrecv && nr - dr < (size_t)W && nfree) {
            size_t off = nr * seg, len = count - off < seg ? count - off : seg;
            int s = free_slots[--nfree];
            rslot[nr % W] = s;
            if ((r = e->irecv(e->host, from, e->scratch + (size_t)s * e->segment_bytes, len * es, tag,
                                &rreq[nr % W])) != DDP_SUCCESS) goto fail_recv;
            nr++;
        }
        while (ds < ns) {
            if ((r = e->test(e->host, to, sreq[ds % W], &done)) != DDP_SUCCESS) goto fail_send;
            if (!done) break;
            if (sslot[ds % W] >= 0) free_slots[nfree++] = sslot[ds % W];
            ds++;
            progressed = 1;
        }
        while (dr < nr) {
            size_t off = dr * seg, len = count - off < seg ? count - off : seg;
            int s = rslot[dr % W];
            unsigned char *scr = e->scratch + (size_t)s * e->segment_bytes;
            if ((r = e->test(e->host, from, rreq[dr % W], &done)) != DDP_SUCCESS) goto fail_recv;
            if (!done) break;
            if (is_root) {
                ddp_reduce_local(recv + off * es, send + off * es, scr, len, dtype, op);
                if (op == DDP_AVG) ddp_divide_local(recv + off * es, len, dtype, p);
                free_slots[nfree++] = s;
            } else {
                /* Add our data and pass it on; the slot is free once the send is done (a send
                 * holds a slot that a receive had, so at most W sends are in flight). */
                ddp_reduce_local(scr, send + off * es, scr, len, dtype, op);
                sslot[ns % W] = s;
                if ((r = e->isend(e->host, to, scr, len * es, tag, &sreq[ns % W])) != DDP_SUCCESS) goto fail_send;
                ns++;
            }
            dr++;
            progressed = 1;
        }
        if (progressed) { last = _ddp_now_us(); continue; }
        snprintf(where, sizeof where, "reduce (pipelined chain), segment %zu/%zu", (dr < nrecv ? dr : ds) + 1, nseg);
        r = _ddp_x_idle(e, last, head ? &to : is_root ? &from : peers, head || is_root ? 1 : 2, where,
                        x.seq, dr < nrecv ? "waiting for data from" : "waiting to send to",
                        dr < nrecv ? from : to);
        if (r != DDP_SUCCESS) return r;
    }
    return DDP_SUCCESS;
fail_send:
    snprintf(where, sizeof where, "reduce #%u (pipelined chain), segment %zu/%zu, sending to rank %d",
             x.seq, ds + 1, nseg, to);
    return _ddp_x_fail(e, r, where);
fail_recv:
    snprintf(where, sizeof where, "reduce #%u (pipelined chain), segment %zu/%zu, receiving from rank %d",
             x.seq, dr + 1, nseg, from);
    return _ddp_x_fail(e, r, where);
}

_DDP_PRIVATE ddp_result_t _ddp_tree_gather(_ddp_engine_t *e, const void *sendbuf, void *recvbuf,
                                     size_t sendcount, ddp_dtype_t dtype, int root) {
    const int p = e->nranks, v = (e->rank - root + p) % p;
    const size_t bytes = sendcount * ddp_dtype_size(dtype);
    int list[34] = {0}, n, nchild, span, i, j;
    _ddp_xop_t ops[34];
    size_t mine;
    uint64_t tag;
    _ddp_x_t x;
    ddp_result_t r;
    if (bytes > e->scratch_bytes / (size_t)p)
        return _ddp_eng_fail(e, DDP_ERR_INVALID_ARGUMENT, "gather: binomial tree: %d x %zu bytes do "
                             "not fit the %zu-byte scratch", p, bytes, e->scratch_bytes);
    tag = _ddp_eng_tag(e, DDP_CALL_GATHER, dtype, DDP_SUM, sendcount, root);
    _ddp_x_setup(&x, e, "gather", "binomial tree", tag);
    if (p == 1 || !sendcount) {
        unsigned char *own = (unsigned char *)recvbuf + (size_t)e->rank * bytes;
        if (sendcount && own != sendbuf) memmove(own, sendbuf, bytes);
        return DDP_SUCCESS;
    }
    nchild = _ddp_tree(e, root, list, &n, &span);
    if ((r = _ddp_x_connect(&x, list, n)) != DDP_SUCCESS) return r;
    /* Scratch holds our subtree's blocks in relative order: ours first. */
    for (i = 0, j = 1; i < nchild; i++, j <<= 1)
        if ((r = _ddp_x_post(&x, &ops[i], list[i], 0, e->scratch + (size_t)j * bytes,
                             _ddp_tree_blocks(p, v, j) * bytes, tag, "phase receive from children")) != DDP_SUCCESS)
            return r;
    memcpy(e->scratch, sendbuf, bytes);
    if ((r = _ddp_x_waitall(&x, ops, nchild, "phase receive from children")) != DDP_SUCCESS) return r;
    if (v) {
        mine = (size_t)(p - v < span ? p - v : span);
        if ((r = _ddp_x_post(&x, &ops[0], list[nchild], 1, e->scratch, mine * bytes, tag,
                             "phase send to parent")) != DDP_SUCCESS) return r;
        return _ddp_x_waitall(&x, ops, 1, "phase send to parent");
    }
    for (j = 0; j < p; j++)
        memcpy((unsigned char *)recvbuf + (size_t)((j + root) % p) * bytes, e->scratch + (size_t)j * bytes, bytes);
    return DDP_SUCCESS;
}

_DDP_PRIVATE ddp_result_t _ddp_tree_scatter(_ddp_engine_t *e, const void *sendbuf, void *recvbuf,
                                      size_t recvcount, ddp_dtype_t dtype, int root) {
    const int p = e->nranks, v = (e->rank - root + p) % p;
    const size_t bytes = recvcount * ddp_dtype_size(dtype);
    int list[34] = {0}, n, nchild, span, i, j;
    _ddp_xop_t ops[34];
    uint64_t tag;
    _ddp_x_t x;
    ddp_result_t r;
    if (bytes > e->scratch_bytes / (size_t)p)
        return _ddp_eng_fail(e, DDP_ERR_INVALID_ARGUMENT, "scatter: binomial tree: %d x %zu bytes do "
                             "not fit the %zu-byte scratch", p, bytes, e->scratch_bytes);
    tag = _ddp_eng_tag(e, DDP_CALL_SCATTER, dtype, DDP_SUM, recvcount, root);
    _ddp_x_setup(&x, e, "scatter", "binomial tree", tag);
    if (p == 1 || !recvcount) {
        const unsigned char *own = (const unsigned char *)sendbuf + (size_t)e->rank * bytes;
        if (recvcount && own != recvbuf) memmove(recvbuf, own, bytes);
        return DDP_SUCCESS;
    }
    nchild = _ddp_tree(e, root, list, &n, &span);
    if ((r = _ddp_x_connect(&x, list, n)) != DDP_SUCCESS) return r;
    if (v == 0) {
        for (j = 0; j < p; j++)
            memcpy(e->scratch + (size_t)j * bytes, (const unsigned char *)sendbuf + (size_t)((j + root) % p) * bytes, bytes);
    } else {
        size_t mine = (size_t)(p - v < span ? p - v : span);
        if ((r = _ddp_x_post(&x, &ops[0], list[nchild], 0, e->scratch, mine * bytes, tag,
                             "phase receive from parent")) != DDP_SUCCESS ||
            (r = _ddp_x_waitall(&x, ops, 1, "phase receive from parent")) != DDP_SUCCESS)
            return r;
    }
    for (i = 0, j = 1; i < nchild; i++, j <<= 1)
        if ((r = _ddp_x_post(&x, &ops[i], list[i], 1, e->scratch + (size_t)j * bytes,
                             _ddp_tree_blocks(p, v, j) * bytes, tag, "phase send to children")) != DDP_SUCCESS)
            return r;
    if (recvbuf != e->scratch) memcpy(recvbuf, e->scratch, bytes);
    return _ddp_x_waitall(&x, ops, nchild, "phase send to children");
}

/* The root exchanges with every other rank directly, _DDP_LINEAR_FAN requests at a time. */
_DDP_PRIVATE ddp_result_t _ddp_linear(_ddp_engine_t *e, int is_gather, const void *sendbuf, void *recvbuf,
                                size_t count, ddp_dtype_t dtype, int root) {
    const int p = e->nranks;
    const size_t bytes = count * ddp_dtype_size(dtype);
    const char *phase = e->rank == root ? "phase root, every rank at once" : "phase to/from the root";
    _ddp_xop_t ops[_DDP_LINEAR_FAN];
    uint64_t tag = _ddp_eng_tag(e, is_gather ? DDP_CALL_GATHER : DDP_CALL_SCATTER, dtype, DDP_SUM, count, root);
    _ddp_x_t x;
    ddp_result_t r;
    int q, n;
    _ddp_x_setup(&x, e, is_gather ? "gather" : "scatter", "linear", tag);
    if (e->rank == root) {
        unsigned char *own = is_gather ? (unsigned char *)recvbuf + (size_t)root * bytes
                                       : (unsigned char *)(uintptr_t)sendbuf + (size_t)root * bytes;
        if (count && own != (is_gather ? sendbuf : recvbuf)) {
            if (is_gather) memmove(own, sendbuf, bytes); else memmove(recvbuf, own, bytes);
        }
        if (p == 1 || !count) return DDP_SUCCESS;
        if ((r = _ddp_x_connect(&x, NULL, p)) != DDP_SUCCESS) return r;
        for (q = 0, n = 0; q < p; q++) {
            if (q == root) continue;
            r = _ddp_x_post(&x, &ops[n++], q, !is_gather,
                            is_gather ? (const unsigned char *)recvbuf + (size_t)q * bytes
                                      : (const unsigned char *)sendbuf + (size_t)q * bytes, bytes, tag, phase);
            if (r == DDP_SUCCESS && n == _DDP_LINEAR_FAN) { r = _ddp_x_waitall(&x, ops, n, phase); n = 0; }
            if (r != DDP_SUCCESS) return r;
        }
        return _ddp_x_waitall(&x, ops, n, phase);
    }
    if (!count) return DDP_SUCCESS;
    if ((r = _ddp_x_connect(&x, &root, 1)) != DDP_SUCCESS ||
        (r = _ddp_x_post(&x, &ops[0], root, is_gather, is_gather ? sendbuf : recvbuf, bytes, tag, phase)) != DDP_SUCCESS)
        return r;
    return _ddp_x_waitall(&x, ops, 1, phase);
}

_DDP_PRIVATE ddp_result_t _ddp_linear_gather(_ddp_engine_t *e, const void *sendbuf, void *recvbuf,
                                       size_t sendcount, ddp_dtype_t dtype, int root) {
    return _ddp_linear(e, 1, sendbuf, recvbuf, sendcount, dtype, root);
}

_DDP_PRIVATE ddp_result_t _ddp_linear_scatter(_ddp_engine_t *e, const void *sendbuf, void *recvbuf,
                                        size_t recvcount, ddp_dtype_t dtype, int root) {
    return _ddp_linear(e, 0, sendbuf, recvbuf, recvcount, dtype, root);
}

_DDP_PRIVATE ddp_result_t _ddp_pairwise_all_to_all(_ddp_engine_t *e, const void *sendbuf, void *recvbuf,
                                             size_t count, ddp_dtype_t dtype) {
    const int p = e->nranks, me = e->rank, W = DDP_RING_WINDOW;
    const size_t bytes = count * ddp_dtype_size(dtype);
    const unsigned char *send = (const unsigned char *)sendbuf;
    unsigned char *recv = (unsigned char *)recvbuf;
    void *sreq[DDP_RING_WINDOW], *rreq[DDP_RING_WINDOW];
    uint64_t tag = _ddp_eng_tag(e, DDP_CALL_ALL_TO_ALL, dtype, DDP_SUM, count, 0);
    int ns = 1, ds = 1, peers[2];
    int64_t last;
    char where[200];
    ddp_result_t r = DDP_SUCCESS;
    _ddp_x_t x;
    _ddp_x_setup(&x, e, "all_to_all", "pairwise exchange", tag);
    if (count) memcpy(recv + (size_t)me * bytes, send + (size_t)me * bytes, bytes);
    if (p == 1 || !count) return DDP_SUCCESS;
    if ((r = _ddp_x_connect(&x, NULL, p)) != DDP_SUCCESS) return r;
    last = _ddp_now_us();
    while (ds < p) {
        int progressed = 0, to, from;
        /* Step k: block me+k to rank me+k, block me-k from rank me-k. */
        while (ns < p && ns - ds < W) {
            to = (me + ns) % p;
            from = (me - ns + p) % p;
            if ((r = e->irecv(e->host, from, recv + (size_t)from * bytes, bytes, tag, &rreq[ns % W])) != DDP_SUCCESS) {
                snprintf(where, sizeof where, "all_to_all #%u (pairwise exchange), step %d/%d, receiving from rank %d", x.seq, ns, p - 1, from);
                return _ddp_x_fail(e, r, where);
            }
            if ((r = e->isend(e->host, to, send + (size_t)to * bytes, bytes, tag, &sreq[ns % W])) != DDP_SUCCESS) {
                snprintf(where, sizeof where, "all_to_all #%u (pairwise exchange), step %d/%d, sending to rank %d", x.seq, ns, p - 1, to);
                return _ddp_x_fail(e, r, where);
            }
            ns++;
        }
        while (ds < ns) {
            int done;
            to = (me + ds) % p;
            from = (me - ds + p) % p;
            if (rreq[ds % W]) {
                if ((r = e->test(e->host, from, rreq[ds % W], &done)) != DDP_SUCCESS) {
                    snprintf(where, sizeof where, "all_to_all #%u (pairwise exchange), step %d/%d, receiving from rank %d", x.seq, ds, p - 1, from);
                    return _ddp_x_fail(e, r, where);
                }
                if (done) { rreq[ds % W] = NULL; progressed = 1; }
            }
            if (sreq[ds % W]) {
                if ((r = e->test(e->host, to, sreq[ds % W], &done)) != DDP_SUCCESS) {
                    snprintf(where, sizeof where, "all_to_all #%u (pairwise exchange), step %d/%d, sending to rank %d", x.seq, ds, p - 1, to);
                    return _ddp_x_fail(e, r, where);
                }
                if (done) { sreq[ds % W] = NULL; progressed = 1; }
            }
            if (rreq[ds % W] || sreq[ds % W]) break;
            ds++;
        }
        if (progressed || ds == p) { last = _ddp_now_us(); continue; }
        peers[0] = (me - ds + p) % p;
        peers[1] = (me + ds) % p;
        snprintf(where, sizeof where, "all_to_all (pairwise exchange), step %d/%d", ds, p - 1);
        r = _ddp_x_idle(e, last, peers, 2, where, x.seq, rreq[ds % W] ? "waiting for data from" :
                        "waiting to send to", rreq[ds % W] ? peers[0] : peers[1]);
        if (r != DDP_SUCCESS) return r;
    }
    return DDP_SUCCESS;
}

#endif /* DDP_RING_IMPLEMENTATION */
