/* SPDX-License-Identifier: MIT (see LICENSE) */
/* ddp_linear.h — linear gather and scatter: the root exchanges with every rank at once, private.
 *
 * For large gathers and scatters the root's link is the bottleneck whatever the shape, so the
 * root posts a send or receive to every other rank, buffer to buffer, with no staging and no
 * forwarding (the "basic linear" algorithm of MPICH and Open MPI; a binomial tree (ddp_tree.h)
 * wins only while latency dominates). At most _DDP_LINEAR_FAN requests are posted at a time.
 *
 * Written against the point-to-point engine (ddp_engine.h); every function is _ddp_ and static.
 * Depends on ddp_algorithm.h. Built by DDP_IMPLEMENTATION.
 */
#if defined(DDP_IMPLEMENTATION) && !defined(DDP_LINEAR_IMPLEMENTATION)
#define DDP_LINEAR_IMPLEMENTATION
#endif
#if defined(DDP_LINEAR_IMPLEMENTATION) && !defined(DDP_ALGORITHM_IMPLEMENTATION)
#define DDP_ALGORITHM_IMPLEMENTATION
#endif
#include "ddp_algorithm.h"

#if defined(DDP_LINEAR_IMPLEMENTATION) && !defined(DDP_LINEAR_IMPL_INCLUDED)
#define DDP_LINEAR_IMPL_INCLUDED
#ifndef DDP_ALGORITHM_IMPL_INCLUDED
#error "libddp: ddp_linear.h's implementation needs ddp_algorithm.h's (define DDP_IMPLEMENTATION)"
#endif

#define _DDP_LINEAR_FAN 32                /* requests a linear root keeps posted */

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
#endif /* DDP_LINEAR_IMPLEMENTATION */
