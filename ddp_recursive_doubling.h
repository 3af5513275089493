/* SPDX-License-Identifier: MIT (see LICENSE) */
/* ddp_recursive_doubling.h — recursive doubling, libddp's latency-optimal all-reduce, private.
 *
 * Small all-reduces are latency-bound: the ring's 2(p-1) hops cost more than its bandwidth saves.
 * Recursive doubling takes log2(p) hops, each exchanging the whole buffer with rank r ^ 2^i
 * (Thakur, Rabenseifner & Gropp, "Optimization of collective communication operations in MPICH",
 * IJHPCA 2005). A non-power-of-two world first folds its extra ranks r >= 2^k into r - 2^k and
 * hands them the result at the end. Both partners of a pair combine (lower rank's data, higher
 * rank's data) in that order, so every rank ends with the same bits. The buffer must fit the
 * scratch (the caller checks). It runs over any group of ranks (the hierarchical all-reduce runs
 * it across hosts), and carries the call agreement of the rooted collectives (ddp_agree.h),
 * whose digests ride in a header combined under byte MAX before the data.
 *
 * Written against the point-to-point engine (ddp_engine.h); every function is _ddp_ and static.
 * Depends on ddp_algorithm.h and ddp_kernels.h. Built by DDP_IMPLEMENTATION.
 */
#if defined(DDP_IMPLEMENTATION) && !defined(DDP_RECURSIVE_DOUBLING_IMPLEMENTATION)
#define DDP_RECURSIVE_DOUBLING_IMPLEMENTATION
#endif
#if defined(DDP_RECURSIVE_DOUBLING_IMPLEMENTATION)
#ifndef DDP_ALGORITHM_IMPLEMENTATION
#define DDP_ALGORITHM_IMPLEMENTATION
#endif
#ifndef DDP_KERNELS_IMPLEMENTATION
#define DDP_KERNELS_IMPLEMENTATION
#endif
#endif
#include "ddp_algorithm.h"
#include "ddp_kernels.h"

#if defined(DDP_RECURSIVE_DOUBLING_IMPLEMENTATION) && !defined(DDP_RECURSIVE_DOUBLING_IMPL_INCLUDED)
#define DDP_RECURSIVE_DOUBLING_IMPL_INCLUDED
#if !defined(DDP_ALGORITHM_IMPL_INCLUDED) || !defined(DDP_KERNELS_IMPL_INCLUDED)
#error "libddp: ddp_recursive_doubling.h's implementation needs ddp_algorithm.h's and ddp_kernels.h's (define DDP_IMPLEMENTATION)"
#endif

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
            if (now - last >= 10000000) {
                _ddp_rd_where(where, what, sizeof what);
                _ddp_eng_note_wait(e, now - last, what, "waiting for", reqs[0] ? peers[0] : peers[n - 1]);
            }
            if (now - last < e->spin_us) sched_yield();
            else {
                _ddp_eng_waits_on(e, reqs[0] ? peers[0] : peers[n - 1]);
                if ((r = e->block(e->host, peers, n, 100)) != DDP_SUCCESS) return r;
            }
        }
    }
}

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
#endif /* DDP_RECURSIVE_DOUBLING_IMPLEMENTATION */
