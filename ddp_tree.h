/* SPDX-License-Identifier: MIT (see LICENSE) */
/* ddp_tree.h — binomial trees for the small rooted collectives (reduce, gather, scatter), private.
 *
 * A binomial tree over the ranks relative to the root reaches every rank in log2 p hops, the
 * latency optimum for small messages (MPICH's choice for short reduce, gather and scatter:
 * Thakur, Rabenseifner & Gropp, "Optimization of collective communication operations in MPICH",
 * IJHPCA 2005).
 *   reduce          every rank adds its children's partial results in rank order, then sends
 *                   to its parent: the same bits every run. (1 + log2 p) buffers in scratch.
 *   gather/scatter  subtrees staged in scratch, in relative rank order: p blocks in scratch.
 * Large messages go to the pipelined chain (ddp_chain.h) and linear (ddp_linear.h) instead:
 * ddp_comm_dispatch.h chooses by _DDP_TREE_MAX_BYTES, after the call agreement (ddp_agree.h).
 *
 * Written against the point-to-point engine (ddp_engine.h); every function is _ddp_ and static.
 * Depends on ddp_algorithm.h and ddp_kernels.h. Built by DDP_IMPLEMENTATION.
 */
#if defined(DDP_IMPLEMENTATION) && !defined(DDP_TREE_IMPLEMENTATION)
#define DDP_TREE_IMPLEMENTATION
#endif
#if defined(DDP_TREE_IMPLEMENTATION)
#ifndef DDP_ALGORITHM_IMPLEMENTATION
#define DDP_ALGORITHM_IMPLEMENTATION
#endif
#ifndef DDP_KERNELS_IMPLEMENTATION
#define DDP_KERNELS_IMPLEMENTATION
#endif
#endif
#include "ddp_algorithm.h"
#include "ddp_kernels.h"

#if defined(DDP_TREE_IMPLEMENTATION) && !defined(DDP_TREE_IMPL_INCLUDED)
#define DDP_TREE_IMPL_INCLUDED
#if !defined(DDP_ALGORITHM_IMPL_INCLUDED) || !defined(DDP_KERNELS_IMPL_INCLUDED)
#error "libddp: ddp_tree.h's implementation needs ddp_algorithm.h's and ddp_kernels.h's (define DDP_IMPLEMENTATION)"
#endif

/* The largest message ddp_comm.h gives a tree rather than the chain or linear. Measured over
 * TCP at p = 3 and 4 on the 2-core VM (each call followed by a barrier, slowest rank, best of 3;
 * tree forced with -D_DDP_TREE_MAX_BYTES=256M against chain/linear with 0):
 * up to 16 KiB the two are within the noise (0.85-1.2x either way); from 64 KiB the chain and
 * the linear forms win, 1.2-2.7x. -D overrides it for such a measurement. */
#ifndef _DDP_TREE_MAX_BYTES
#define _DDP_TREE_MAX_BYTES (16u << 10)
#endif

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

#endif /* DDP_TREE_IMPLEMENTATION */
