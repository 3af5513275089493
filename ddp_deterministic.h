/* SPDX-License-Identifier: MIT (see LICENSE) */
/* ddp_deterministic.h — reductions whose bits depend only on the world size, private.
 *
 * DDP_DETERMINISTIC=1 (ddp_comm_desc_t.deterministic) promises, for all-reduce, reduce-scatter
 * and reduce, one result per (inputs, world size, rank order), whatever the algorithm, the
 * transport, the hosts' layout, the message size, the segment size or the reducer's buckets:
 * each element is folded left to right in rank order,
 *     acc = x_0;  acc = acc op x_1;  ...;  acc = acc op x_(p-1);   (AVG: then acc /= p)
 * with ddp_reduce_local's arithmetic. Floating-point addition is not associative, so any order
 * that depends on where chunks fall (the ring's), on a tree (recursive doubling, Rabenseifner)
 * or on the hosts (hierarchical) gives other bits; a fixed order needs every contribution to an
 * element at one place. So the element's owner gathers them:
 *
 *   reduce-scatter  direct: every rank sends each owner its block, segment by segment, and the
 *                   owner folds the p segments in rank order. Each rank sends and receives
 *                   (p-1)/p of the buffer, as the ring does (bandwidth-optimal), but over p-1
 *                   connections at once instead of two, and the owner does all p-1 additions
 *                   of its block (the ring spreads them over the steps: the same count).
 *   all-reduce      the direct reduce-scatter over the ring's chunk geometry, then the ring's
 *                   all-gather half (no arithmetic: copies keep the bits). Small messages
 *                   ((p-1) x bytes within the scratch and 64 KiB): every rank sends its whole
 *                   buffer to every other and folds locally, one round.
 *   reduce          the direct reduce-scatter, each owner's folded segment then sent to the
 *                   root (the root receives (p-1)/p of the buffer, no more than a chain's).
 *
 * At p <= 2 every algorithm already does the one addition x_0 op x_1 (commutative in IEEE
 * arithmetic), so nothing changes there. The shared-memory and threads transports add in rank
 * order themselves (their all-reduce and reduce-scatter), so they keep their own paths.
 * The cost and the latency at small sizes: docs/performance.md. Scratch: the engine's, cut into
 * two rounds of p slots; nothing is allocated.
 *
 * Written against the point-to-point engine (ddp_engine.h); every function is _ddp_ and static.
 * Depends on ddp_ring.h (its all-gather half) and ddp_kernels.h. Built by DDP_IMPLEMENTATION.
 */
#if defined(DDP_IMPLEMENTATION) && !defined(DDP_DETERMINISTIC_IMPLEMENTATION)
#define DDP_DETERMINISTIC_IMPLEMENTATION
#endif
#if defined(DDP_DETERMINISTIC_IMPLEMENTATION) && !defined(DDP_RING_IMPLEMENTATION)
#define DDP_RING_IMPLEMENTATION
#endif
#include "ddp_ring.h"

#if defined(DDP_DETERMINISTIC_IMPLEMENTATION) && !defined(DDP_DETERMINISTIC_IMPL_INCLUDED)
#define DDP_DETERMINISTIC_IMPL_INCLUDED
#ifndef DDP_RING_IMPL_INCLUDED
#error "libddp: ddp_deterministic.h's implementation needs ddp_ring.h's (define DDP_IMPLEMENTATION)"
#endif

#define _DDP_DET_SMALL_BYTES ((size_t)64 << 10)   /* (p-1) x message: the one-round path */

#define _DDP_DET_BATCH 16   /* peers whose messages are posted at once (bounds the requests) */

/* One direct reduce-scatter (or reduce): the call, the owners' blocks (the ring's chunk
 * geometry: block q = elements [geo(q), geo(q+1))), the segment size, and the scratch cut into
 * two rounds of p slots of seg elements (slot me of a round: our own segment when the output
 * would overwrite it before it is folded in, or the folded segment a reduce sends the root). */
typedef struct {
    _ddp_engine_t *e;
    _ddp_x_t x;
    const unsigned char *send;
    unsigned char *recv;
    size_t count, es, seg, nseg;
    size_t rs_count;     /* reduce-scatter: the per-rank count (blocks are rs_count apart), else 0 */
    int p, me, root;     /* root >= 0: a reduce */
    ddp_dtype_t dtype;
    ddp_op_t op;
    uint64_t tag;
} _ddp_det_t;

_DDP_PRIVATE size_t _ddp_det_block_lo(const _ddp_det_t *d, int q) {
    return d->rs_count ? d->rs_count * (size_t)q : _ddp_geo_start(d->count, d->p, (size_t)q);
}
_DDP_PRIVATE size_t _ddp_det_block_len(const _ddp_det_t *d, int q) {
    return d->rs_count ? d->rs_count : _ddp_det_block_lo(d, q + 1) - _ddp_det_block_lo(d, q);
}
/* Segment k of block q: [*off, *off + *n) of the whole buffer. */
_DDP_PRIVATE void _ddp_det_seg(const _ddp_det_t *d, int q, size_t k, size_t *off, size_t *n) {
    size_t len = _ddp_det_block_len(d, q), a = k * d->seg;
    *off = _ddp_det_block_lo(d, q) + (a < len ? a : len);
    *n = a < len ? (len - a < d->seg ? len - a : d->seg) : 0;
}
_DDP_PRIVATE unsigned char *_ddp_det_slot(const _ddp_det_t *d, size_t k, int q) {
    return d->e->scratch + ((size_t)(k & 1) * (size_t)d->p + (size_t)q) * d->seg * d->es;
}
/* Where our folded segment k goes: the output (reduce-scatter: our block of recvbuf; all-reduce:
 * our block's place in recvbuf), or, for a reduce, the root's recvbuf (at the root) or the slot
 * that is sent to it. */
_DDP_PRIVATE unsigned char *_ddp_det_out(const _ddp_det_t *d, size_t k, size_t off) {
    if (d->root >= 0 && d->me != d->root) return _ddp_det_slot(d, k, d->me);
    if (d->rs_count) return d->recv + (off - _ddp_det_block_lo(d, d->me)) * d->es;
    return d->recv + off * d->es;
}

/* Unit u = (round k, batch b): segment k of the blocks of peers me+i (to them) and of ours from
 * peers me-i, for i in the batch [1 + b*B, ...). ops: 2B entries. */
_DDP_PRIVATE ddp_result_t _ddp_det_post(const _ddp_det_t *d, size_t k, int b, _ddp_xop_t *ops, int *nops) {
    size_t off, n, moff, mn;
    int i, q, last = 1 + (b + 1) * _DDP_DET_BATCH;
    ddp_result_t r;
    _ddp_det_seg(d, d->me, k, &moff, &mn);
    *nops = 0;
    for (i = 1 + b * _DDP_DET_BATCH; i < d->p && i < last; i++) {
        q = (d->me + i) % d->p;          /* send to me+i, receive from me-i: spread the load */
        _ddp_det_seg(d, q, k, &off, &n);
        if (n && (r = _ddp_x_post(&d->x, &ops[(*nops)++], q, 1, d->send + off * d->es, n * d->es, d->tag,
                                  "exchange")) != DDP_SUCCESS)
            return r;
        q = (d->me - i + d->p) % d->p;
        if (mn && (r = _ddp_x_post(&d->x, &ops[(*nops)++], q, 0, _ddp_det_slot(d, k, q), mn * d->es, d->tag,
                                   "exchange")) != DDP_SUCCESS)
            return r;
    }
    return DDP_SUCCESS;
}

/* Round k arrived: fold our block's segment k in rank order, each element left to right. */
_DDP_PRIVATE void _ddp_det_fold_round(const _ddp_det_t *d, size_t k) {
    const unsigned char *own, *a, *b;
    unsigned char *dst;
    size_t off, n;
    int q;
    _ddp_det_seg(d, d->me, k, &off, &n);
    if (!n) return;
    own = d->send + off * d->es;
    dst = _ddp_det_out(d, k, off);
    /* In place the output is our own data: from rank 2 on the fold would overwrite it before
     * adding it, so it is parked in our slot first (a reduce's non-root folds into that slot,
     * and then the output is not our data). */
    if (d->me >= 2 && dst == own) {
        memcpy(_ddp_det_slot(d, k, d->me), own, n * d->es);
        own = _ddp_det_slot(d, k, d->me);
    }
    a = d->me == 0 ? own : _ddp_det_slot(d, k, 0);
    b = d->me == 1 ? own : _ddp_det_slot(d, k, 1);
    ddp_reduce_local(dst, a, b, n, d->dtype, d->op);
    for (q = 2; q < d->p; q++) ddp_reduce_local(dst, dst, q == d->me ? own : _ddp_det_slot(d, k, q), n, d->dtype, d->op);
    if (d->op == DDP_AVG) ddp_divide_local(dst, n, d->dtype, d->p);
}

/* A reduce: the owners' folded segment k to the root, in batches (the root receives straight
 * into its recvbuf). Not overlapped with the next round, so each pair's messages keep one order. */
_DDP_PRIVATE ddp_result_t _ddp_det_to_root(const _ddp_det_t *d, size_t k) {
    _ddp_xop_t ops[_DDP_DET_BATCH];
    size_t off, n;
    int q = 0, nops;
    ddp_result_t r;
    if (d->me != d->root) {
        _ddp_det_seg(d, d->me, k, &off, &n);
        if (!n) return DDP_SUCCESS;
        if ((r = _ddp_x_post(&d->x, ops, d->root, 1, _ddp_det_slot(d, k, d->me), n * d->es, d->tag,
                             "to the root")) != DDP_SUCCESS)
            return r;
        return _ddp_x_waitall(&d->x, ops, 1, "to the root");
    }
    while (q < d->p) {
        for (nops = 0; q < d->p && nops < _DDP_DET_BATCH; q++) {
            _ddp_det_seg(d, q, k, &off, &n);
            if (q == d->root || !n) continue;
            if ((r = _ddp_x_post(&d->x, &ops[nops++], q, 0, d->recv + off * d->es, n * d->es, d->tag,
                                 "to the root")) != DDP_SUCCESS)
                return r;
        }
        if ((r = _ddp_x_waitall(&d->x, ops, nops, "to the root")) != DDP_SUCCESS) return r;
    }
    return DDP_SUCCESS;
}

/* Every unit in order; the next one is on the wire while we wait for (and fold) this one,
 * except for a reduce (its messages to the root must not overtake the next round's). */
_DDP_PRIVATE ddp_result_t _ddp_det_run(_ddp_det_t *d) {
    const int nb = (d->p - 2) / _DDP_DET_BATCH + 1, pipe = d->root < 0;
    const size_t units = d->nseg * (size_t)nb;
    _ddp_xop_t ops[2][2 * _DDP_DET_BATCH];
    int nops[2];
    size_t u;
    ddp_result_t r;
    if ((r = _ddp_x_connect(&d->x, NULL, d->p)) != DDP_SUCCESS) return r;
    if (pipe && (r = _ddp_det_post(d, 0, 0, ops[0], &nops[0])) != DDP_SUCCESS) return r;
    for (u = 0; u < units; u++) {
        const size_t k = u / (size_t)nb;
        const int b = (int)(u % (size_t)nb), i = (int)(u & 1);
        if (!pipe && (r = _ddp_det_post(d, k, b, ops[i], &nops[i])) != DDP_SUCCESS) return r;
        if (pipe && u + 1 < units &&
            (r = _ddp_det_post(d, (u + 1) / (size_t)nb, (int)((u + 1) % (size_t)nb), ops[i ^ 1], &nops[i ^ 1])) != DDP_SUCCESS)
            return r;
        if ((r = _ddp_x_waitall(&d->x, ops[i], nops[i], "exchange")) != DDP_SUCCESS) return r;
        if (b == nb - 1) {
            _ddp_det_fold_round(d, k);
            if (d->root >= 0 && (r = _ddp_det_to_root(d, k)) != DDP_SUCCESS) return r;
        }
    }
    return DDP_SUCCESS;
}

/* Segment size: two rounds of p slots in the scratch, at most DDP_SEGMENT_BYTES each. */
_DDP_PRIVATE ddp_result_t _ddp_det_setup(_ddp_det_t *d, _ddp_engine_t *e, const char *what, int kind,
                                         const void *send, void *recv, size_t count, size_t rs_count,
                                         ddp_dtype_t dtype, ddp_op_t op, int root) {
    memset(d, 0, sizeof *d);
    d->e = e; d->p = e->nranks; d->me = e->rank; d->root = root;
    d->send = (const unsigned char *)send; d->recv = (unsigned char *)recv;
    d->count = count; d->rs_count = rs_count; d->dtype = dtype; d->op = op;
    d->es = ddp_dtype_size(dtype);
    d->tag = _ddp_eng_tag(e, kind | _DDP_TAG_DETERMINISTIC, dtype, op, rs_count ? rs_count : count, root < 0 ? 0 : root);
    _ddp_x_setup(&d->x, e, what, "deterministic, rank order", d->tag);
    d->seg = e->scratch_bytes / (2 * (size_t)d->p) / d->es;
    if (d->seg > e->segment_bytes / d->es) d->seg = e->segment_bytes / d->es;
    if (!d->seg)
        return _ddp_eng_fail(e, DDP_ERR_UNSUPPORTED, "%s #%u (deterministic): %d ranks need %zu bytes "
                             "of scratch, there are %zu (raise DDP_SEGMENT_BYTES)", what, d->x.seq, d->p,
                             2 * (size_t)d->p * d->es, e->scratch_bytes);
    {
        size_t longest = rs_count ? rs_count : _ddp_geo_start(count, d->p, 1);   /* block 0 is the longest */
        d->nseg = longest ? (longest + d->seg - 1) / d->seg : 0;
    }
    return DDP_SUCCESS;
}

/* Small: every rank sends its whole buffer to every other and folds all p locally. */
_DDP_PRIVATE ddp_result_t _ddp_det_all_reduce_small(_ddp_det_t *d) {
    const size_t bytes = d->count * d->es;
    const unsigned char *own = d->send;
    _ddp_xop_t ops[2 * _DDP_DET_BATCH];
    int i = 1, q, nops;
    ddp_result_t r;
    if ((r = _ddp_x_connect(&d->x, NULL, d->p)) != DDP_SUCCESS) return r;
    while (i < d->p) {
        for (nops = 0; i < d->p && nops < 2 * _DDP_DET_BATCH; i++) {
            q = (d->me + i) % d->p;
            if ((r = _ddp_x_post(&d->x, &ops[nops++], q, 1, d->send, bytes, d->tag, "exchange")) != DDP_SUCCESS) return r;
            q = (d->me - i + d->p) % d->p;
            if ((r = _ddp_x_post(&d->x, &ops[nops++], q, 0, d->e->scratch + (size_t)q * bytes, bytes, d->tag,
                                 "exchange")) != DDP_SUCCESS)
                return r;
        }
        if ((r = _ddp_x_waitall(&d->x, ops, nops, "exchange")) != DDP_SUCCESS) return r;
    }
    if (d->me >= 2 && d->recv == d->send) {
        memcpy(d->e->scratch + (size_t)d->me * bytes, own, bytes);
        own = d->e->scratch + (size_t)d->me * bytes;
    }
    ddp_reduce_local(d->recv, d->me == 0 ? own : d->e->scratch, d->me == 1 ? own : d->e->scratch + bytes,
                     d->count, d->dtype, d->op);
    for (q = 2; q < d->p; q++)
        ddp_reduce_local(d->recv, d->recv, q == d->me ? own : d->e->scratch + (size_t)q * bytes, d->count, d->dtype, d->op);
    if (d->op == DDP_AVG) ddp_divide_local(d->recv, d->count, d->dtype, d->p);
    return DDP_SUCCESS;
}

_DDP_PRIVATE ddp_result_t _ddp_det_all_reduce(_ddp_engine_t *e, const void *sendbuf, void *recvbuf,
                                              size_t count, ddp_dtype_t dtype, ddp_op_t op) {
    const size_t bytes = count * ddp_dtype_size(dtype);
    _ddp_det_t d;
    _ddp_group_t world = _ddp_group_world(e);
    ddp_result_t r = _ddp_det_setup(&d, e, "all_reduce", DDP_CALL_ALL_REDUCE, sendbuf, recvbuf, count, 0,
                                    dtype, op, -1);
    if (r != DDP_SUCCESS || !count) return r;
    if (bytes * (size_t)e->nranks <= e->scratch_bytes && bytes * (size_t)(e->nranks - 1) <= _DDP_DET_SMALL_BYTES)
        return _ddp_det_all_reduce_small(&d);
    if ((r = _ddp_det_run(&d)) != DDP_SUCCESS) return r;
    /* the ring's all-gather half: rank q holds chunk q of the same geometry */
    return _ddp_ring_all_reduce_in(e, &world, d.tag ^ (1ull << 56), recvbuf, recvbuf, count, dtype, DDP_SUM,
                                   count, 0, e->nranks, e->nranks - 1, e->nranks - 1, " (deterministic, all-gather)");
}

_DDP_PRIVATE ddp_result_t _ddp_det_reduce_scatter(_ddp_engine_t *e, const void *sendbuf, void *recvbuf,
                                                  size_t recvcount, ddp_dtype_t dtype, ddp_op_t op) {
    _ddp_det_t d;
    ddp_result_t r = _ddp_det_setup(&d, e, "reduce_scatter", DDP_CALL_REDUCE_SCATTER, sendbuf, recvbuf,
                                    recvcount * (size_t)e->nranks, recvcount, dtype, op, -1);
    if (r != DDP_SUCCESS || !recvcount) return r;
    return _ddp_det_run(&d);
}

_DDP_PRIVATE ddp_result_t _ddp_det_reduce(_ddp_engine_t *e, const void *sendbuf, void *recvbuf,
                                          size_t count, ddp_dtype_t dtype, ddp_op_t op, int root) {
    _ddp_det_t d;
    ddp_result_t r = _ddp_det_setup(&d, e, "reduce", DDP_CALL_REDUCE, sendbuf, recvbuf, count, 0, dtype, op, root);
    if (r != DDP_SUCCESS || !count) return r;
    return _ddp_det_run(&d);
}

#endif /* DDP_DETERMINISTIC_IMPLEMENTATION */
