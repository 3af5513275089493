/* SPDX-License-Identifier: MIT (see LICENSE) */
/* ddp_rabenseifner.h — Rabenseifner's all-reduce (recursive halving, then doubling), private.
 *
 * For messages too big for recursive doubling's whole-buffer exchanges and too small for the
 * ring's 2(p - 1) steps: a reduce-scatter by recursive halving, then an all-gather by recursive
 * doubling (R. Rabenseifner, "Optimization of collective reduction operations", ICCS 2004;
 * Thakur, Rabenseifner & Gropp, "Optimization of collective communication operations in MPICH",
 * IJHPCA 2005): 2 log2 p steps, each rank sending 2(p - 1)/p of the buffer, as the ring does. It
 * gives the same bits as recursive doubling (see below), runs over any group of ranks (the
 * hierarchical all-reduce runs it across hosts), and moves messages in scratch-slot pieces.
 *
 * Written against the point-to-point engine (ddp_engine.h); every function is _ddp_ and static.
 * Depends on ddp_algorithm.h and ddp_kernels.h. Built by DDP_IMPLEMENTATION.
 */
#if defined(DDP_IMPLEMENTATION) && !defined(DDP_RABENSEIFNER_IMPLEMENTATION)
#define DDP_RABENSEIFNER_IMPLEMENTATION
#endif
#if defined(DDP_RABENSEIFNER_IMPLEMENTATION)
#ifndef DDP_ALGORITHM_IMPLEMENTATION
#define DDP_ALGORITHM_IMPLEMENTATION
#endif
#ifndef DDP_KERNELS_IMPLEMENTATION
#define DDP_KERNELS_IMPLEMENTATION
#endif
#endif
#include "ddp_algorithm.h"
#include "ddp_kernels.h"

#if defined(DDP_RABENSEIFNER_IMPLEMENTATION) && !defined(DDP_RABENSEIFNER_IMPL_INCLUDED)
#define DDP_RABENSEIFNER_IMPL_INCLUDED
#if !defined(DDP_ALGORITHM_IMPL_INCLUDED) || !defined(DDP_KERNELS_IMPL_INCLUDED)
#error "libddp: ddp_rabenseifner.h's implementation needs ddp_algorithm.h's and ddp_kernels.h's (define DDP_IMPLEMENTATION)"
#endif

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
#endif /* DDP_RABENSEIFNER_IMPLEMENTATION */
