/* SPDX-License-Identifier: MIT (see LICENSE) */
/* ddp_chain.h — the pipelined chain reduce, for large reduces, private.
 *
 * The ranks form a chain root+p-1 -> ... -> root+1 -> root; the buffer moves in segments, and
 * each rank adds its own data to every segment passing through before forwarding it, so every
 * link carries the buffer once and the links work at the same time (the segmented chain of
 * Open MPI's tuned collectives: Pjesivac-Grbovic et al., "Performance analysis of MPI collective
 * operations", Cluster Computing 2007). The sum runs in one fixed order (from the far end of the
 * chain towards the root), so the root gets the same bits every run. Segments are >= 64 KiB and
 * at least 4 when the message allows, at most a scratch slot; up to DDP_RING_WINDOW are in
 * flight per direction. (The broadcast's chain, root -> root+1 -> ..., is the ring's:
 * ddp_ring.h.) Small reduces use a binomial tree (ddp_tree.h).
 *
 * Written against the point-to-point engine (ddp_engine.h); every function is _ddp_ and static.
 * Depends on ddp_algorithm.h and ddp_kernels.h. Built by DDP_IMPLEMENTATION.
 */
#if defined(DDP_IMPLEMENTATION) && !defined(DDP_CHAIN_IMPLEMENTATION)
#define DDP_CHAIN_IMPLEMENTATION
#endif
#if defined(DDP_CHAIN_IMPLEMENTATION)
#ifndef DDP_ALGORITHM_IMPLEMENTATION
#define DDP_ALGORITHM_IMPLEMENTATION
#endif
#ifndef DDP_KERNELS_IMPLEMENTATION
#define DDP_KERNELS_IMPLEMENTATION
#endif
#endif
#include "ddp_algorithm.h"
#include "ddp_kernels.h"

#if defined(DDP_CHAIN_IMPLEMENTATION) && !defined(DDP_CHAIN_IMPL_INCLUDED)
#define DDP_CHAIN_IMPL_INCLUDED
#if !defined(DDP_ALGORITHM_IMPL_INCLUDED) || !defined(DDP_KERNELS_IMPL_INCLUDED)
#error "libddp: ddp_chain.h's implementation needs ddp_algorithm.h's and ddp_kernels.h's (define DDP_IMPLEMENTATION)"
#endif

/* Segment size for streaming count elements: >= 4 segments of >= 64 KiB when the message allows
 * (so the chain pipelines), never above DDP_SEGMENT_BYTES (a scratch slot). */
_DDP_PRIVATE size_t _ddp_chain_seg_elems(const _ddp_engine_t *e, size_t count, size_t es) {
    size_t cap = e->segment_bytes, want = (count * es / 4 + 4095) & ~(size_t)4095;
    size_t lo = (size_t)(64u << 10) < cap ? (size_t)(64u << 10) : cap;
    size_t seg = want < lo ? lo : want > cap ? cap : want;
    return seg / es;
}

/* One chain reduce: the call, this rank's place in the chain, and its segments in flight (in
 * order) per direction. Sends hold the scratch slot their data was received into (-1: the
 * head's own data); receives hold the slot they land in. */
typedef struct {
    _ddp_engine_t *e;
    _ddp_x_t x;
    const unsigned char *send;
    unsigned char *recv;
    size_t count, es, seg, nseg;
    ddp_dtype_t dtype;
    ddp_op_t op;
    uint64_t tag;
    int p, from, to, head, is_root;
    int peers[2], npeers;           /* the neighbours this rank talks to: from and/or to */
    size_t ns, ds, nr, dr, nsend, nrecv;
    void *sreq[DDP_RING_WINDOW], *rreq[DDP_RING_WINDOW];
    int sslot[DDP_RING_WINDOW], rslot[DDP_RING_WINDOW], free_slots[DDP_RING_WINDOW], nfree;
    int progressed;                 /* something was retired in this turn */
} _ddp_chain_t;

static inline size_t _ddp_chain_len(const _ddp_chain_t *c, size_t i) {   /* elements in segment i */
    size_t off = i * c->seg;
    return c->count - off < c->seg ? c->count - off : c->seg;
}

_DDP_PRIVATE ddp_result_t _ddp_chain_fail(const _ddp_chain_t *c, ddp_result_t r, int is_send) {
    char where[200];
    snprintf(where, sizeof where, "reduce #%u (pipelined chain), segment %zu/%zu, %s rank %d", c->x.seq,
             (is_send ? c->ds : c->dr) + 1, c->nseg, is_send ? "sending to" : "receiving from",
             is_send ? c->to : c->from);
    return _ddp_x_fail(c->e, r, where);
}

/* The head of the chain streams its own data; the others post receives while slots are free. */
_DDP_PRIVATE ddp_result_t _ddp_chain_post(_ddp_chain_t *c) {
    _ddp_engine_t *e = c->e;
    const size_t W = DDP_RING_WINDOW;
    ddp_result_t r;
    while (c->head && c->ns < c->nsend && c->ns - c->ds < W) {
        size_t off = c->ns * c->seg, len = _ddp_chain_len(c, c->ns);
        c->sslot[c->ns % W] = -1;
        if ((r = e->isend(e->host, c->to, c->send + off * c->es, len * c->es, c->tag, &c->sreq[c->ns % W])) !=
            DDP_SUCCESS)
            return _ddp_chain_fail(c, r, 1);
        c->ns++;
    }
    while (c->nr < c->nrecv && c->nr - c->dr < W && c->nfree) {
        size_t len = _ddp_chain_len(c, c->nr);
        int s = c->free_slots[--c->nfree];
        c->rslot[c->nr % W] = s;
        if ((r = e->irecv(e->host, c->from, e->scratch + (size_t)s * e->segment_bytes, len * c->es, c->tag,
                          &c->rreq[c->nr % W])) != DDP_SUCCESS)
            return _ddp_chain_fail(c, r, 0);
        c->nr++;
    }
    return DDP_SUCCESS;
}

_DDP_PRIVATE ddp_result_t _ddp_chain_retire_sends(_ddp_chain_t *c) {
    const size_t W = DDP_RING_WINDOW;
    ddp_result_t r;
    int done;
    while (c->ds < c->ns) {
        if ((r = c->e->test(c->e->host, c->to, c->sreq[c->ds % W], &done)) != DDP_SUCCESS)
            return _ddp_chain_fail(c, r, 1);
        if (!done) break;
        if (c->sslot[c->ds % W] >= 0) c->free_slots[c->nfree++] = c->sslot[c->ds % W];
        c->ds++;
        c->progressed = 1;
    }
    return DDP_SUCCESS;
}

/* Received segments, in order: the root finishes them into recvbuf; the others add their data
 * and pass them on (the slot is free once that send is done: a send holds a slot that a receive
 * had, so at most W sends are in flight). */
_DDP_PRIVATE ddp_result_t _ddp_chain_retire_recvs(_ddp_chain_t *c) {
    _ddp_engine_t *e = c->e;
    const size_t W = DDP_RING_WINDOW, es = c->es;
    ddp_result_t r;
    int done;
    while (c->dr < c->nr) {
        size_t off = c->dr * c->seg, len = _ddp_chain_len(c, c->dr);
        int s = c->rslot[c->dr % W];
        unsigned char *scr = e->scratch + (size_t)s * e->segment_bytes;
        if ((r = e->test(e->host, c->from, c->rreq[c->dr % W], &done)) != DDP_SUCCESS)
            return _ddp_chain_fail(c, r, 0);
        if (!done) break;
        if (c->is_root) {
            ddp_reduce_local(c->recv + off * es, c->send + off * es, scr, len, c->dtype, c->op);
            if (c->op == DDP_AVG) ddp_divide_local(c->recv + off * es, len, c->dtype, c->p);
            c->free_slots[c->nfree++] = s;
        } else {
            ddp_reduce_local(scr, c->send + off * es, scr, len, c->dtype, c->op);
            c->sslot[c->ns % W] = s;
            if ((r = e->isend(e->host, c->to, scr, len * es, c->tag, &c->sreq[c->ns % W])) != DDP_SUCCESS)
                return _ddp_chain_fail(c, r, 1);
            c->ns++;
        }
        c->dr++;
        c->progressed = 1;
    }
    return DDP_SUCCESS;
}

_DDP_PRIVATE ddp_result_t _ddp_chain_reduce(_ddp_engine_t *e, const void *sendbuf, void *recvbuf,
                                      size_t count, ddp_dtype_t dtype, ddp_op_t op, int root) {
    _ddp_chain_t c;
    const int p = e->nranks, v = (e->rank - root + p) % p;
    int i;
    int64_t last;
    char where[200];
    ddp_result_t r;
    c.tag = _ddp_eng_tag(e, DDP_CALL_REDUCE, dtype, op, count, root);
    _ddp_x_setup(&c.x, e, "reduce", "pipelined chain", c.tag);
    c.es = ddp_dtype_size(dtype);
    if (p == 1 || !count) {
        if (count && sendbuf != recvbuf) memcpy(recvbuf, sendbuf, count * c.es);
        return DDP_SUCCESS;
    }
    c.e = e;
    c.send = (const unsigned char *)sendbuf;
    c.recv = (unsigned char *)recvbuf;
    c.count = count;
    c.dtype = dtype;
    c.op = op;
    c.p = p;
    c.from = (e->rank + 1) % p;
    c.to = (e->rank + p - 1) % p;
    c.head = v == p - 1;
    c.is_root = v == 0;
    c.npeers = 0;
    if (!c.head) c.peers[c.npeers++] = c.from;
    if (!c.is_root) c.peers[c.npeers++] = c.to;
    if ((r = _ddp_x_connect(&c.x, c.peers, c.npeers)) != DDP_SUCCESS) return r;
    c.seg = _ddp_chain_seg_elems(e, count, c.es);
    c.nseg = (count + c.seg - 1) / c.seg;
    c.nsend = c.is_root ? 0 : c.nseg;
    c.nrecv = c.head ? 0 : c.nseg;
    c.ns = c.ds = c.nr = c.dr = 0;
    for (i = 0, c.nfree = 0; i < DDP_RING_WINDOW; i++) c.free_slots[c.nfree++] = i;
    last = _ddp_now_us();
    while (c.ds < c.nsend || c.dr < c.nrecv) {
        c.progressed = 0;
        if ((r = _ddp_chain_post(&c)) != DDP_SUCCESS || (r = _ddp_chain_retire_sends(&c)) != DDP_SUCCESS ||
            (r = _ddp_chain_retire_recvs(&c)) != DDP_SUCCESS)
            return r;
        if (c.progressed) { last = _ddp_now_us(); continue; }
        snprintf(where, sizeof where, "reduce (pipelined chain), segment %zu/%zu",
                 (c.dr < c.nrecv ? c.dr : c.ds) + 1, c.nseg);
        r = _ddp_x_idle(e, last, c.peers, c.npeers, where, c.x.seq,
                        c.dr < c.nrecv ? "waiting for data from" : "waiting to send to",
                        c.dr < c.nrecv ? c.from : c.to);
        if (r != DDP_SUCCESS) return r;
    }
    return DDP_SUCCESS;
}

#endif /* DDP_CHAIN_IMPLEMENTATION */
