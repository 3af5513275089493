/* SPDX-License-Identifier: MIT (see LICENSE) */
/* ddp_agree.h — the call agreement of libddp's rooted collectives, private.
 *
 * Before a broadcast, reduce, gather or scatter moves any data, the ranks agree on the call with
 * one recursive-doubling all-reduce (ddp_recursive_doubling.h) of a digest of it: a tag cannot
 * catch a rank that wrongly thinks it is the root (it receives nothing). A small broadcast or
 * reduce carries its data in that same exchange and is done. ddp_comm.h calls _ddp_agree or
 * _ddp_agree_with_data, then the tree, chain, linear or ring algorithm. How and why it is
 * complete is below.
 *
 * Written against the point-to-point engine (ddp_engine.h); every function is _ddp_ and static.
 * Depends on ddp_recursive_doubling.h. Built by DDP_IMPLEMENTATION.
 */
#if defined(DDP_IMPLEMENTATION) && !defined(DDP_AGREE_IMPLEMENTATION)
#define DDP_AGREE_IMPLEMENTATION
#endif
#if defined(DDP_AGREE_IMPLEMENTATION) && !defined(DDP_RECURSIVE_DOUBLING_IMPLEMENTATION)
#define DDP_RECURSIVE_DOUBLING_IMPLEMENTATION
#endif
#include "ddp_recursive_doubling.h"

#if defined(DDP_AGREE_IMPLEMENTATION) && !defined(DDP_AGREE_IMPL_INCLUDED)
#define DDP_AGREE_IMPL_INCLUDED
#ifndef DDP_RECURSIVE_DOUBLING_IMPL_INCLUDED
#error "libddp: ddp_agree.h's implementation needs ddp_recursive_doubling.h's (define DDP_IMPLEMENTATION)"
#endif

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

#endif /* DDP_AGREE_IMPLEMENTATION */
