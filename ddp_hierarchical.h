/* SPDX-License-Identifier: MIT (see LICENSE) */
/* ddp_hierarchical.h — the two-level (hosts, then across hosts) all-reduce, private.
 *
 * Many ranks on few hosts: reduce-scatter inside each host with the ring, all-reduce each slice
 * across the hosts (the ring, recursive doubling or Rabenseifner, one stream per slice), then
 * all-gather inside each host: the two-level scheme of NCCL's trees and rings over nodes and of
 * Horovod's hierarchical all-reduce (HOROVOD_HIERARCHICAL_ALLREDUCE). ddp_comm.h fills the
 * groups (_ddp_hier_t) from its host table at init. Details below.
 *
 * Written against the point-to-point engine (ddp_engine.h); every function is _ddp_ and static.
 * Depends on ddp_ring.h, ddp_recursive_doubling.h and ddp_rabenseifner.h. Built by
 * DDP_IMPLEMENTATION.
 */
#if defined(DDP_IMPLEMENTATION) && !defined(DDP_HIERARCHICAL_IMPLEMENTATION)
#define DDP_HIERARCHICAL_IMPLEMENTATION
#endif
#if defined(DDP_HIERARCHICAL_IMPLEMENTATION)
#ifndef DDP_RING_IMPLEMENTATION
#define DDP_RING_IMPLEMENTATION
#endif
#ifndef DDP_RECURSIVE_DOUBLING_IMPLEMENTATION
#define DDP_RECURSIVE_DOUBLING_IMPLEMENTATION
#endif
#ifndef DDP_RABENSEIFNER_IMPLEMENTATION
#define DDP_RABENSEIFNER_IMPLEMENTATION
#endif
#endif
#include "ddp_ring.h"
#include "ddp_recursive_doubling.h"
#include "ddp_rabenseifner.h"

#if defined(DDP_HIERARCHICAL_IMPLEMENTATION) && !defined(DDP_HIERARCHICAL_IMPL_INCLUDED)
#define DDP_HIERARCHICAL_IMPL_INCLUDED
#if !defined(DDP_RING_IMPL_INCLUDED) || !defined(DDP_RECURSIVE_DOUBLING_IMPL_INCLUDED) || \
    !defined(DDP_RABENSEIFNER_IMPL_INCLUDED)
#error "libddp: ddp_hierarchical.h's implementation needs those of the ring, recursive doubling and Rabenseifner (define DDP_IMPLEMENTATION)"
#endif

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

#endif /* DDP_HIERARCHICAL_IMPLEMENTATION */
