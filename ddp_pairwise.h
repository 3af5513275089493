/* SPDX-License-Identifier: MIT (see LICENSE) */
/* ddp_pairwise.h — pairwise-exchange all-to-all, private.
 *
 * Step k (k = 1 .. p-1) sends block r+k to rank r+k and receives block r-k from rank r-k, so
 * every rank talks to one partner per direction per step and each pair's data moves once,
 * buffer to buffer (MPICH's long-message all-to-all: Thakur, Rabenseifner & Gropp,
 * "Optimization of collective communication operations in MPICH", IJHPCA 2005). Up to
 * DDP_RING_WINDOW steps are in flight at once.
 *
 * Written against the point-to-point engine (ddp_engine.h); every function is _ddp_ and static.
 * Depends on ddp_algorithm.h. Built by DDP_IMPLEMENTATION.
 */
#if defined(DDP_IMPLEMENTATION) && !defined(DDP_PAIRWISE_IMPLEMENTATION)
#define DDP_PAIRWISE_IMPLEMENTATION
#endif
#if defined(DDP_PAIRWISE_IMPLEMENTATION) && !defined(DDP_ALGORITHM_IMPLEMENTATION)
#define DDP_ALGORITHM_IMPLEMENTATION
#endif
#include "ddp_algorithm.h"

#if defined(DDP_PAIRWISE_IMPLEMENTATION) && !defined(DDP_PAIRWISE_IMPL_INCLUDED)
#define DDP_PAIRWISE_IMPL_INCLUDED
#ifndef DDP_ALGORITHM_IMPL_INCLUDED
#error "libddp: ddp_pairwise.h's implementation needs ddp_algorithm.h's (define DDP_IMPLEMENTATION)"
#endif

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

#endif /* DDP_PAIRWISE_IMPLEMENTATION */
