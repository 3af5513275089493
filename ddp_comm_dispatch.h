/* SPDX-License-Identifier: MIT (see LICENSE) */
/* ddp_comm_dispatch.h — how one operation runs, private: the operation table (per kind: its
 * checks, its algorithm over the engine, its entry in a transport that runs collectives
 * itself), the all-reduce algorithm choice, send/recv batches, the flight recorder's dump on a
 * failure, and _ddp_run_op / _ddp_exec. Also the two views of a communicator: the engine the
 * algorithms (ddp_algorithms.h) send and receive through, and the context the transports see.
 *
 * ddp_comm.h issues every call through here; the progress threads (ddp_comm_queue.h) run their
 * requests through _ddp_run_op. Depends on ddp_comm_core.h. Built by DDP_IMPLEMENTATION (or
 * DDP_COMM_DISPATCH_IMPLEMENTATION).
 */
#if defined(DDP_IMPLEMENTATION) && !defined(DDP_COMM_DISPATCH_IMPLEMENTATION)
#define DDP_COMM_DISPATCH_IMPLEMENTATION
#endif
#if defined(DDP_COMM_DISPATCH_IMPLEMENTATION)
#ifndef DDP_COMM_CORE_IMPLEMENTATION
#define DDP_COMM_CORE_IMPLEMENTATION
#endif
#endif
#include "ddp_comm_core.h"

/* ============================================================================================
 * IMPLEMENTATION
 * ========================================================================================== */
#if defined(DDP_COMM_DISPATCH_IMPLEMENTATION) && !defined(DDP_COMM_DISPATCH_IMPL_INCLUDED)
#define DDP_COMM_DISPATCH_IMPL_INCLUDED
#if !defined(DDP_COMM_CORE_IMPL_INCLUDED)
#error "libddp: ddp_comm_dispatch.h's implementation needs those of the headers below it (define DDP_IMPLEMENTATION)"
#endif

/* ---------------------------------------------------------------- point-to-point plumbing
 * What the algorithms in ddp_ring.h use: per-peer isend/irecv/test through the peer's transport,
 * and the blocking half of spin-then-block. */
_DDP_PRIVATE ddp_result_t _ddp_isend(ddp_comm_t *c, int peer, const void *buf, size_t len,
                                     uint64_t tag, void **req) {
    _ddp_peer_t *p = &c->peers.by_rank[peer];
    if (!p->conn) return ddp_comm_fail(c, DDP_ERR_INTERNAL, "no connection to rank %d", peer);
    return c->peers.tinst[p->tinst].t->isend(p->conn, buf, len, tag, NULL, req);
}

_DDP_PRIVATE ddp_result_t _ddp_irecv(ddp_comm_t *c, int peer, void *buf, size_t len, uint64_t tag,
                                     void **req) {
    _ddp_peer_t *p = &c->peers.by_rank[peer];
    if (!p->conn) return ddp_comm_fail(c, DDP_ERR_INTERNAL, "no connection to rank %d", peer);
    return c->peers.tinst[p->tinst].t->irecv(p->conn, buf, len, tag, NULL, req);
}

_DDP_PRIVATE ddp_result_t _ddp_test(ddp_comm_t *c, int peer, void *req, int *done) {
    return c->peers.tinst[c->peers.by_rank[peer].tinst].t->test(req, done);
}

/* Sleeps until a connection to one of the peers may progress (or timeout_ms). Peers on
 * different transports cannot share one kernel wait: then nap briefly instead. */
_DDP_PRIVATE ddp_result_t _ddp_block(ddp_comm_t *c, const int *peers, int n, int timeout_ms) {
    void *conns[8];
    int i, k = 0, ti = -1;
    /* Every stalled wait passes here at least every 100 ms: where ddp_comm_abort is seen. */
    if (__atomic_load_n(&c->queue.aborted, __ATOMIC_SEQ_CST))
        return ddp_comm_fail(c, DDP_ERR_ABORTED, "ddp_comm_abort was called on this rank");
    if (timeout_ms < 0 || timeout_ms > 100) timeout_ms = 100;
    for (i = 0; i < n && k < 8; i++) {
        _ddp_peer_t *p = &c->peers.by_rank[peers[i]];
        if (!p->conn) continue;
        if (ti >= 0 && p->tinst != ti) { usleep(20); return DDP_SUCCESS; }
        ti = p->tinst;
        conns[k++] = p->conn;
    }
    if (ti < 0 || !c->peers.tinst[ti].t->wait) { usleep(20); return DDP_SUCCESS; }
    {   /* the timeline's "time spent waiting on each peer": the first one waited for */
        int64_t t0 = _ddp_now_us();
        ddp_result_t r = c->peers.tinst[ti].t->wait(c->peers.tinst[ti].state, conns, k, timeout_ms);
        _ddp_trace_wait(&c->trace, peers[0], _ddp_now_us() - t0);
        return r;
    }
}


/* ---------------------------------------------------------------- the two views of a communicator
 * The algorithms get _ddp_engine_t (ddp_engine.h) and the transports ddp_transport_ctx_t
 * (ddp_transport.h); these adapters are the only way either reaches the communicator. */
_DDP_PRIVATE ddp_result_t _ddp_eng_isend(void *h, int peer, const void *buf, size_t len, uint64_t tag, void **req) {
    return _ddp_isend((ddp_comm_t *)h, peer, buf, len, tag, req);
}
_DDP_PRIVATE ddp_result_t _ddp_eng_irecv(void *h, int peer, void *buf, size_t len, uint64_t tag, void **req) {
    return _ddp_irecv((ddp_comm_t *)h, peer, buf, len, tag, req);
}
_DDP_PRIVATE ddp_result_t _ddp_eng_test(void *h, int peer, void *req, int *done) {
    return _ddp_test((ddp_comm_t *)h, peer, req, done);
}
_DDP_PRIVATE ddp_result_t _ddp_eng_block(void *h, const int *peers, int n, int timeout_ms) {
    return _ddp_block((ddp_comm_t *)h, peers, n, timeout_ms);
}
_DDP_PRIVATE ddp_result_t _ddp_eng_connect(void *h, const int *peers, int n) {
    return _ddp_connect_peers((ddp_comm_t *)h, peers, n);
}
_DDP_PRIVATE ddp_result_t _ddp_host_fail(void *h, ddp_result_t r, const char *msg) {
    return ddp_comm_fail((ddp_comm_t *)h, r, "%s", msg);
}
_DDP_PRIVATE const char *_ddp_host_last_error(void *h) { return ((ddp_comm_t *)h)->last_error; }
_DDP_PRIVATE void _ddp_host_log(void *h, ddp_log_level_t level, const char *msg) {
    ddp_comm_log((const ddp_comm_t *)h, level, "%s", msg);
}
_DDP_PRIVATE const char *_ddp_host_peer_id(void *h, int peer) { return _ddp_comm_host_id((const ddp_comm_t *)h, peer); }
_DDP_PRIVATE ddp_result_t _ddp_host_publish(void *h, const char *name, const void *addr, size_t len) {
    return _ddp_comm_publish((ddp_comm_t *)h, name, addr, len);
}
_DDP_PRIVATE ddp_result_t _ddp_host_lookup(void *h, const char *name, int peer, void *addr, size_t cap, size_t *len) {
    return _ddp_comm_lookup((ddp_comm_t *)h, name, peer, addr, cap, len);
}
/* Whether peer published an address under name, without waiting (a peer whose binary lacks a
 * transport publishes nothing, and a lookup would wait for it until the timeout). */
_DDP_PRIVATE int _ddp_host_published(void *h, const char *name, int peer) {
    ddp_comm_t *c = (ddp_comm_t *)h;
    char key[256];
    int exists = 0;
    if (_ddp_comm_send_held(c) != DDP_SUCCESS) return 0;
    _ddp_key(c, key, sizeof key, "addr/%s/%d", name, peer);
    return ddp_store_check(c->boot.store, key, &exists) == DDP_SUCCESS && exists;
}

/* A note under name for every rank (ddp_transport.h: post/posted). */
_DDP_PRIVATE ddp_result_t _ddp_host_post(void *h, const char *name, const char *msg) {
    ddp_comm_t *c = (ddp_comm_t *)h;
    char key[256], cur[8];
    size_t curlen = 0;
    ddp_result_t r;
    if (!c->boot.store || c->boot.foreign || !name || !msg) return DDP_ERR_INVALID_ARGUMENT;
    if ((r = _ddp_comm_send_held(c)) != DDP_SUCCESS) return r;
    _ddp_key(c, key, sizeof key, "%s", name);
    return ddp_store_compare_set(c->boot.store, key, NULL, 0, msg, strlen(msg), cur, sizeof cur, &curlen);
}
_DDP_PRIVATE int _ddp_host_posted(void *h, const char *name, char *msg, size_t cap) {
    ddp_comm_t *c = (ddp_comm_t *)h;
    char key[256];
    size_t len = 0;
    int exists = 0;
    if (!c->boot.store || !name || !msg || cap < 1 || _ddp_comm_send_held(c) != DDP_SUCCESS) return 0;
    _ddp_key(c, key, sizeof key, "%s", name);
    if (ddp_store_check(c->boot.store, key, &exists) != DDP_SUCCESS || !exists) return 0;
    if (ddp_store_get(c->boot.store, key, msg, cap - 1, &len) != DDP_SUCCESS) return 0;
    msg[len < cap - 1 ? len : cap - 1] = 0;
    return 1;
}

/* After the settings: both views read the communicator's fields through these. */
_DDP_PRIVATE void _ddp_init_contexts(ddp_comm_t *c) {
    _ddp_engine_t *e = &c->eng;
    ddp_transport_ctx_t *x = &c->tctx;
    e->host = c;
    e->waiting_on = -1;
    e->live_peer = &c->pos.peer;
    c->pos.peer = -1;
    e->isend = _ddp_eng_isend; e->irecv = _ddp_eng_irecv; e->test = _ddp_eng_test;
    e->block = _ddp_eng_block; e->connect = _ddp_eng_connect;
    e->fail = _ddp_host_fail; e->last_error = _ddp_host_last_error; e->log = _ddp_host_log;
    x->rank = e->rank; x->nranks = e->nranks;
    x->timeout_ms = e->timeout_ms; x->spin_us = e->spin_us; x->log_level = e->log_level;
    x->ifname = c->boot.ifname[0] ? c->boot.ifname : NULL;
    x->master_addr = c->boot.master_addr;
    x->allocator = c->alloc.alloc ? &c->alloc : NULL;
    x->abort_flag = &c->queue.aborted;
    x->forked = &c->forked;
    x->waiting_on = &e->waiting_on;
    x->calls = &e->seq;
    x->live_peer = &c->pos.peer;
    x->auth_key = c->boot.data_key;
    x->auth_key_len = sizeof c->boot.data_key;
    x->host = c;
    x->host_id = _ddp_host_peer_id; x->publish = _ddp_host_publish; x->lookup = _ddp_host_lookup;
    x->published = _ddp_host_published; x->log = _ddp_host_log; x->fail = _ddp_host_fail;
    x->last_error = _ddp_host_last_error;
    x->post = _ddp_host_post; x->posted = _ddp_host_posted;
}

/* What the logs and the timeline call each all-reduce algorithm. */
static const char *const _ddp_ar_long_names[_DDP_AR_NUM] = {
    "ring", "recursive doubling", "rabenseifner", "hierarchical (ring across hosts)",
    "hierarchical (recursive doubling across hosts)", "hierarchical (rabenseifner across hosts)"};

/* The all-reduce algorithm for a call whose whole (virtual) buffer has `bytes`: the same on
 * every rank. */
_DDP_PRIVATE int _ddp_ar_pick_index(size_t bytes) {   /* the smallest k with 2^k >= bytes */
    int k = 0;
    while (k < 63 && ((uint64_t)1 << k) < (uint64_t)bytes) k++;
    return k;
}

_DDP_PRIVATE int _ddp_ar_choose(const ddp_comm_t *c, size_t bytes) {
    switch (c->choice.algo) {
    case _DDP_ALGO_AUTO:
        if (c->choice.layout.nhosts > 1) return c->choice.ar_pick[_ddp_ar_pick_index(bytes)];
        return bytes <= c->eng.scratch_bytes && bytes <= c->choice.rd_max_bytes ? _DDP_AR_RD : _DDP_AR_RING;
    case _DDP_ALGO_HIER: return c->choice.hier_pick[_ddp_ar_pick_index(bytes)];
    case 1 + _DDP_AR_RD: return bytes <= c->eng.scratch_bytes ? _DDP_AR_RD : _DDP_AR_RING;
    case 1 + _DDP_AR_HIER_RD:   /* above the scratch: Rabenseifner, which adds in rd's order */
        return (bytes + (size_t)c->choice.hier.slices - 1) / (size_t)c->choice.hier.slices <= c->eng.scratch_bytes
               ? _DDP_AR_HIER_RD : _DDP_AR_HIER_RAB;
    default: return c->choice.algo - 1;
    }
}

/* DDP_DETERMINISTIC over the engine: from 3 ranks on (at 2 every algorithm does the one,
 * commutative, addition). Transports that run the collectives themselves add in rank order. */
_DDP_PRIVATE int _ddp_det_applies(const ddp_comm_t *c) { return c->choice.deterministic && c->eng.nranks > 2; }

/* The algorithm depends only on (bytes of the whole buffer, world size, hosts, settings): the
 * same on every rank. The call's buffers may hold elements [v_off, v_off + count) of a virtual
 * buffer of v_total (the reducer's flat buckets; v_total 0: the call is the whole): the choice
 * and the chunks are then the whole's, so each element gets the whole's additions. */
_DDP_PRIVATE ddp_result_t _ddp_all_reduce_algo(ddp_comm_t *c, const void *sendbuf, void *recvbuf,
                                               size_t count, ddp_dtype_t dtype, ddp_op_t op,
                                               size_t v_total, size_t v_off) {
    const size_t total = v_total ? v_total : count, off = v_total ? v_off : 0;
    const int a = _ddp_ar_choose(c, total * ddp_dtype_size(dtype));
    if (_ddp_det_applies(c)) {   /* each element on its own: the whole's geometry does not matter */
        _DDP_LOG(c, DDP_LOG_TRACE, "all_reduce #%u: %zu x %s %s, %s, deterministic (rank order)", c->eng.seq + 1,
                 count, ddp_dtype_name(dtype), ddp_op_name(op), sendbuf == recvbuf ? "in place" : "out of place");
        c->trace.cur->algo = "deterministic (rank order)";
        return _ddp_det_all_reduce(&c->eng, sendbuf, recvbuf, count, dtype, op);
    }
    _DDP_LOG(c, DDP_LOG_TRACE, "all_reduce #%u: %zu x %s %s, %s, %s%s", c->eng.seq + 1, count,
             ddp_dtype_name(dtype), ddp_op_name(op), sendbuf == recvbuf ? "in place" : "out of place",
             _ddp_ar_long_names[a], v_total ? " (a part of a flat buffer: cut as the whole)" : "");
    c->trace.cur->algo = _ddp_ar_long_names[a];
    switch (a) {
    case _DDP_AR_RD: return _ddp_rd_all_reduce(&c->eng, sendbuf, recvbuf, count, dtype, op);
    case _DDP_AR_RAB: return _ddp_rab_all_reduce(&c->eng, sendbuf, recvbuf, count, dtype, op);
    case _DDP_AR_HIER_RING: case _DDP_AR_HIER_RD: case _DDP_AR_HIER_RAB:
        return _ddp_hier_all_reduce(&c->eng, &c->choice.hier, a == _DDP_AR_HIER_RD ? _DDP_INTER_RD
                                    : a == _DDP_AR_HIER_RAB ? _DDP_INTER_RAB : _DDP_INTER_RING,
                                    sendbuf, recvbuf, count, dtype, op, total, off);
    default: return _ddp_ring_all_reduce(&c->eng, sendbuf, recvbuf, count, dtype, op, total, off);
    }
}

/* ---- the operation table
 * One row per ddp_call_kind_t: its checks, its algorithm choice (by_algorithm: over the
 * engine) and its entry in a transport that runs collectives itself (by_transport: NULL when
 * the transport has none, so the algorithm runs even then). Every call, blocking, async or
 * queued in a group, is issued by _ddp_issue (ddp_comm.h) and run by _ddp_run_op_raw through it. */
typedef struct {
    int kind;                         /* its ddp_call_kind_t: row k is kind k + 1 */
    /* the arguments (what: the name the messages give the call) */
    ddp_result_t (*check)(ddp_comm_t *c, const _ddp_op_t *o, const char *what);
    ddp_result_t (*by_algorithm)(ddp_comm_t *c, const _ddp_op_t *o);
    ddp_result_t (*by_transport)(ddp_comm_t *c, const _ddp_op_t *o);
    const char *algo;                 /* the flight recorder's algorithm until the choice is made */
    /* 1: a call refused by its checks inside a group also fails group_end (NCCL); 0: only the
     * call itself fails (the first five kinds always behaved so). */
    int group_fails;
} _ddp_kind_row_t;
_DDP_PRIVATE const _ddp_kind_row_t *_ddp_row(int kind);   /* the table, after the rows' parts */

/* Checks of the first five kinds: their messages name the kind (also for the async forms). */
_DDP_PRIVATE ddp_result_t _ddp_check_all_reduce(ddp_comm_t *c, const _ddp_op_t *o, const char *what) {
    (void)what;
    return _ddp_check_args(c, "all_reduce", o->send, o->recv, o->count, 1, o->dtype, 1, o->op);
}
_DDP_PRIVATE ddp_result_t _ddp_check_reduce_scatter(ddp_comm_t *c, const _ddp_op_t *o, const char *what) {
    (void)what;
    return _ddp_check_args(c, "reduce_scatter", o->send, o->recv, o->count, (size_t)c->eng.nranks,
                           o->dtype, 1, o->op);
}
_DDP_PRIVATE ddp_result_t _ddp_check_all_gather(ddp_comm_t *c, const _ddp_op_t *o, const char *what) {
    (void)what;
    return _ddp_check_args(c, "all_gather", o->send, o->recv, o->count, (size_t)c->eng.nranks,
                           o->dtype, 0, DDP_SUM);
}
_DDP_PRIVATE ddp_result_t _ddp_check_rank(ddp_comm_t *c, const char *what, const char *role, int v) {
    if (v >= 0 && v < c->eng.nranks) return DDP_SUCCESS;
    return ddp_comm_fail(c, DDP_ERR_INVALID_ARGUMENT, "%s: %s %d not in 0..%d", what, role, v,
                         c->eng.nranks - 1);
}
_DDP_PRIVATE ddp_result_t _ddp_check_broadcast(ddp_comm_t *c, const _ddp_op_t *o, const char *what) {
    ddp_result_t r = _ddp_check_rank(c, "broadcast", "root", o->root);
    (void)what;
    if (r != DDP_SUCCESS) return r;
    /* Only the root reads sendbuf (NCCL): others may pass NULL. */
    return _ddp_check_args(c, "broadcast", c->eng.rank == o->root ? o->send : o->recv, o->recv,
                           o->count, 1, o->dtype, 0, DDP_SUM);
}
_DDP_PRIVATE ddp_result_t _ddp_check_nothing(ddp_comm_t *c, const _ddp_op_t *o, const char *what) {
    (void)c; (void)o; (void)what;
    return DDP_SUCCESS;
}

/* Collectives run by the transport (c->choice.coll). The sequence number counts them as the engine
 * counts its own, never inside _DDP_LOG: the count must not depend on the log level. */
_DDP_PRIVATE ddp_result_t _ddp_coll_all_reduce(ddp_comm_t *c, const _ddp_op_t *o) {
    c->eng.seq++;
    _DDP_LOG(c, DDP_LOG_TRACE, "all_reduce #%u: %zu x %s %s, %s, by the transport", c->eng.seq,
             o->count, ddp_dtype_name(o->dtype), ddp_op_name(o->op),
             o->send == o->recv ? "in place" : "out of place");
    return c->choice.coll->all_reduce(c->choice.coll_state, o->send, o->recv, o->count, o->dtype, o->op);
}
_DDP_PRIVATE ddp_result_t _ddp_coll_reduce_scatter(ddp_comm_t *c, const _ddp_op_t *o) {
    _DDP_LOG(c, DDP_LOG_TRACE, "reduce_scatter #%u: %zu x %s per rank, %s, %s", c->eng.seq + 1,
             o->count, ddp_dtype_name(o->dtype), ddp_op_name(o->op), "by the transport");
    c->eng.seq++;
    return c->choice.coll->reduce_scatter(c->choice.coll_state, o->send, o->recv, o->count, o->dtype, o->op);
}
_DDP_PRIVATE ddp_result_t _ddp_coll_all_gather(ddp_comm_t *c, const _ddp_op_t *o) {
    _DDP_LOG(c, DDP_LOG_TRACE, "all_gather #%u: %zu x %s per rank, %s", c->eng.seq + 1, o->count,
             ddp_dtype_name(o->dtype), "by the transport");
    c->eng.seq++;
    return c->choice.coll->all_gather(c->choice.coll_state, o->send, o->recv, o->count, o->dtype);
}
_DDP_PRIVATE ddp_result_t _ddp_coll_broadcast(ddp_comm_t *c, const _ddp_op_t *o) {
    _DDP_LOG(c, DDP_LOG_TRACE, "broadcast #%u: %zu x %s from root %d, %s", c->eng.seq + 1, o->count,
             ddp_dtype_name(o->dtype), o->root, "by the transport");
    c->eng.seq++;   /* the transport compares every rank's call, root included */
    return c->choice.coll->broadcast(c->choice.coll_state, o->send, o->recv, o->count, o->dtype, o->root);
}
_DDP_PRIVATE ddp_result_t _ddp_coll_barrier(ddp_comm_t *c, const _ddp_op_t *o) {
    (void)o;
    c->eng.seq++;
    _DDP_LOG(c, DDP_LOG_TRACE, "barrier #%u, by the transport", c->eng.seq);
    return c->choice.coll->barrier(c->choice.coll_state);
}

/* The same collectives over the engine (ddp_ring.h's algorithms). */
_DDP_PRIVATE ddp_result_t _ddp_algo_all_reduce(ddp_comm_t *c, const _ddp_op_t *o) {
    return _ddp_all_reduce_algo(c, o->send, o->recv, o->count, o->dtype, o->op, o->v_total, o->v_off);
}
_DDP_PRIVATE ddp_result_t _ddp_algo_reduce_scatter(ddp_comm_t *c, const _ddp_op_t *o) {
    const int det = _ddp_det_applies(c);
    _DDP_LOG(c, DDP_LOG_TRACE, "reduce_scatter #%u: %zu x %s per rank, %s, %s", c->eng.seq + 1,
             o->count, ddp_dtype_name(o->dtype), ddp_op_name(o->op), det ? "deterministic (rank order)" : "ring");
    if (det) {
        c->trace.cur->algo = "deterministic (rank order)";
        return _ddp_det_reduce_scatter(&c->eng, o->send, o->recv, o->count, o->dtype, o->op);
    }
    return _ddp_ring_reduce_scatter(&c->eng, o->send, o->recv, o->count, o->dtype, o->op);
}
_DDP_PRIVATE ddp_result_t _ddp_algo_all_gather(ddp_comm_t *c, const _ddp_op_t *o) {
    _DDP_LOG(c, DDP_LOG_TRACE, "all_gather #%u: %zu x %s per rank, %s", c->eng.seq + 1, o->count,
             ddp_dtype_name(o->dtype), "ring");
    return _ddp_ring_all_gather(&c->eng, o->send, o->recv, o->count, o->dtype);
}
/* Small: the agreement carries the data; else agree, then the chain. */
_DDP_PRIVATE ddp_result_t _ddp_algo_broadcast(ddp_comm_t *c, const _ddp_op_t *o) {
    ddp_result_t r;
    int done;
    _DDP_LOG(c, DDP_LOG_TRACE, "broadcast #%u: %zu x %s from root %d, %s", c->eng.seq + 1, o->count,
             ddp_dtype_name(o->dtype), o->root, "agreed on, then the data "
             "(up to 16 KiB inside the agreement's recursive doubling, else the pipelined chain)");
    r = _ddp_agree_with_data(&c->eng, o->kind, o->send, o->recv, o->count, o->dtype, DDP_SUM, o->root, &done);
    if (done) c->trace.cur->algo = "recursive doubling, with the agreement";
    else if (r == DDP_SUCCESS &&
             (r = _ddp_agree(&c->eng, o->kind, o->dtype, DDP_SUM, o->count, o->root)) == DDP_SUCCESS)
        r = _ddp_ring_broadcast(&c->eng, o->send, o->recv, o->count, o->dtype, o->root);
    return r;
}
_DDP_PRIVATE ddp_result_t _ddp_algo_barrier(ddp_comm_t *c, const _ddp_op_t *o) {
    unsigned char token = 0;
    (void)o;
    _DDP_LOG(c, DDP_LOG_TRACE, "barrier #%u: a one-byte all_reduce", c->eng.seq + 1);
    return _ddp_all_reduce_algo(c, &token, &token, 1, DDP_UINT8, DDP_MAX, 0, 0);
}

/* Checks of reduce, gather, scatter, all_to_all, send and recv: what names the call as asked
 * ("reduce" or "reduce_async"). */
_DDP_PRIVATE ddp_result_t _ddp_check_reduce(ddp_comm_t *c, const _ddp_op_t *o, const char *what) {
    ddp_result_t r = _ddp_check_rank(c, what, "root", o->root);
    if (r != DDP_SUCCESS) return r;
    /* Only the root writes recvbuf (NCCL): others may pass NULL. */
    return _ddp_check_args(c, what, o->send, c->eng.rank == o->root ? o->recv : o->send, o->count, 1,
                           o->dtype, 1, o->op);
}
_DDP_PRIVATE ddp_result_t _ddp_check_gather(ddp_comm_t *c, const _ddp_op_t *o, const char *what) {
    ddp_result_t r = _ddp_check_rank(c, what, "root", o->root);
    if (r != DDP_SUCCESS) return r;
    return _ddp_check_args(c, what, o->send, c->eng.rank == o->root ? o->recv : o->send, o->count,
                           (size_t)c->eng.nranks, o->dtype, 0, DDP_SUM);
}
_DDP_PRIVATE ddp_result_t _ddp_check_scatter(ddp_comm_t *c, const _ddp_op_t *o, const char *what) {
    ddp_result_t r = _ddp_check_rank(c, what, "root", o->root);
    if (r != DDP_SUCCESS) return r;
    /* Only the root reads sendbuf (NCCL): others may pass NULL. */
    return _ddp_check_args(c, what, c->eng.rank == o->root ? o->send : o->recv, o->recv, o->count,
                           (size_t)c->eng.nranks, o->dtype, 0, DDP_SUM);
}
_DDP_PRIVATE ddp_result_t _ddp_check_all_to_all(ddp_comm_t *c, const _ddp_op_t *o, const char *what) {
    ddp_result_t r = _ddp_check_args(c, what, o->send, o->recv, o->count, (size_t)c->eng.nranks,
                                     o->dtype, 0, DDP_SUM);
    if (r != DDP_SUCCESS) return r;
    if (o->count && o->send == o->recv)
        return ddp_comm_fail(c, DDP_ERR_INVALID_ARGUMENT, "%s: sendbuf == recvbuf: in place is not "
                             "supported (as NCCL); use two buffers", what);
    return DDP_SUCCESS;
}
_DDP_PRIVATE ddp_result_t _ddp_check_p2p(ddp_comm_t *c, const _ddp_op_t *o, const char *what) {
    const void *buf = o->kind == DDP_CALL_SEND ? o->send : o->recv;
    ddp_result_t r = _ddp_check_rank(c, what, "peer", o->root);
    if (r != DDP_SUCCESS) return r;
    if ((r = _ddp_check_args(c, what, buf, buf, o->count, 1, o->dtype, 0, DDP_SUM)) != DDP_SUCCESS) return r;
    if (o->root == c->eng.rank && !c->group.depth)
        return ddp_comm_fail(c, DDP_ERR_INVALID_USAGE, "%s: peer %d is this rank: outside a group "
                             "it would wait for itself; put the send and the recv between "
                             "ddp_group_start and ddp_group_end (a local copy)", what, o->root);
    return DDP_SUCCESS;
}

/* ---------------------------------------------------------------- send/recv batches
 * Over the engine, like ddp_ring.h's algorithms: nothing here reads the communicator but its
 * engine and its p2p counters (4 per peer: messages sent to it and received from it, then the
 * sends and receives in flight). */
_DDP_PRIVATE uint64_t _ddp_p2p_tag(ddp_dtype_t dtype, size_t count, uint32_t seq) {
    int64_t fields[5];
    fields[0] = DDP_CALL_SEND; fields[1] = dtype; fields[2] = 0; fields[3] = (int64_t)count; fields[4] = -1;
    return (_ddp_fnv1a(fields, sizeof fields, _DDP_FNV_INIT) & 0xffffffff00000000ull) | seq;
}

_DDP_PRIVATE void _ddp_p2p_where(const _ddp_op_t *k, int n, char *out, size_t cap) {
    size_t bytes = k->count * ddp_dtype_size(k->dtype);
    snprintf(out, cap, "%s #%u %s rank %d (%zu bytes%s)", k->kind == DDP_CALL_SEND ? "send" : "recv",
             (unsigned)(k->tag & 0xffffffffu), k->kind == DDP_CALL_SEND ? "to" : "from", k->root,
             bytes, n > 1 ? ", in a group" : "");
}

/* Phase 1: every send and receive's tag, and the peers to connect, each once, in list (the
 * in-flight counters are zero here: marks). Returns how many (more than list_cap: all). */
_DDP_PRIVATE int _ddp_p2p_prepare(_ddp_engine_t *e, uint32_t *p2p, _ddp_op_t *ops, int n, int *list,
                                  int list_cap) {
    int i, npeers = 0;
    char where[200];
    for (i = 0; i < n; i++) {
        _ddp_op_t *k = &ops[i];
        int peer = k->root, is_send = k->kind == DDP_CALL_SEND;
        if (k->kind != DDP_CALL_SEND && k->kind != DDP_CALL_RECV) { k->post = 2; continue; }
        k->post = 0;
        k->req = NULL;
        if (peer == e->rank) { k->tag = 0; continue; }
        k->tag = _ddp_p2p_tag(k->dtype, k->count, ++p2p[4 * peer + (is_send ? 0 : 1)]);
        if (e->log_level >= DDP_LOG_TRACE) {
            _ddp_p2p_where(k, n, where, sizeof where);
            _DDP_ELOG(e, DDP_LOG_TRACE, "%s: %zu x %s, direct", where, k->count, ddp_dtype_name(k->dtype));
        }
        if (!p2p[4 * peer + 2]) {
            p2p[4 * peer + 2] = 1;
            if (npeers < list_cap) list[npeers] = peer;
            npeers++;
        }
    }
    for (i = 0; i < n; i++) if (ops[i].post == 0 && ops[i].root != e->rank) p2p[4 * ops[i].root + 2] = 0;
    return npeers;
}

/* Phase 2: sends to this rank, matched in order with receives from it: copies. */
_DDP_PRIVATE ddp_result_t _ddp_p2p_self(_ddp_engine_t *e, _ddp_op_t *ops, int n) {
    int i, j;
    for (i = 0, j = 0; i < n; i++) {
        _ddp_op_t *k = &ops[i];
        size_t sb;
        if (k->post != 0 || k->root != e->rank || k->kind != DDP_CALL_SEND) continue;
        while (j < n && !(ops[j].post == 0 && ops[j].root == e->rank && ops[j].kind == DDP_CALL_RECV)) j++;
        if (j == n)
            return _ddp_eng_fail(e, DDP_ERR_MISMATCH, "group: a send to this rank (itself, %zu x %s) "
                                 "has no matching recv from itself in the group", k->count, ddp_dtype_name(k->dtype));
        sb = k->count * ddp_dtype_size(k->dtype);
        if (ops[j].dtype != k->dtype || ops[j].count != k->count)
            return _ddp_eng_fail(e, DDP_ERR_MISMATCH, "group: send to itself of %zu x %s, but its recv "
                                 "from itself expects %zu x %s", k->count, ddp_dtype_name(k->dtype),
                                 ops[j].count, ddp_dtype_name(ops[j].dtype));
        if (sb && ops[j].recv != k->send) memmove(ops[j].recv, k->send, sb);
        k->post = ops[j].post = 2;
    }
    for (i = 0; i < n; i++)
        if (ops[i].post == 0 && ops[i].root == e->rank)
            return _ddp_eng_fail(e, DDP_ERR_MISMATCH, "group: a recv from this rank (itself, %zu x %s) "
                                 "has no matching send to itself in the group", ops[i].count,
                                 ddp_dtype_name(ops[i].dtype));
    return DDP_SUCCESS;
}

/* Phase 3: the rest, per peer and direction in call order, DDP_RING_WINDOW in flight. */
_DDP_PRIVATE ddp_result_t _ddp_p2p_progress(_ddp_engine_t *e, uint32_t *p2p, _ddp_op_t *ops, int n) {
    int i, j, lo = 0;
    int64_t last = _ddp_now_us();
    char where[200];
    ddp_result_t r = DDP_SUCCESS;
    for (;;) {
        int progressed = 0, pending = 0, peers[8], first = -1;
        while (lo < n && ops[lo].post == 2) lo++;
        if (lo == n) break;
        for (i = lo; i < n; i++) {
            _ddp_op_t *k = &ops[i];
            int is_send = k->kind == DDP_CALL_SEND, done = 0;
            uint32_t *inflight = &p2p[4 * k->root + (is_send ? 2 : 3)];
            size_t bytes;
            if (k->post == 2) continue;
            bytes = k->count * ddp_dtype_size(k->dtype);
            if (k->post == 0) {
                if (*inflight >= DDP_RING_WINDOW) continue;
                r = is_send ? e->isend(e->host, k->root, k->send, bytes, k->tag, &k->req)
                            : e->irecv(e->host, k->root, k->recv, bytes, k->tag, &k->req);
                if (r != DDP_SUCCESS) goto fail;
                k->post = 1;
                (*inflight)++;
            }
            if ((r = e->test(e->host, k->root, k->req, &done)) != DDP_SUCCESS) goto fail;
            if (done) {
                k->post = 2;
                k->req = NULL;
                (*inflight)--;
                progressed = 1;
                continue;
            }
            if (pending < 8) peers[pending] = k->root;
            if (first < 0) first = i;
            pending++;
        }
        if (progressed) { last = _ddp_now_us(); continue; }
        if (first < 0) continue;
        r = _ddp_x_idle(e, last, peers, pending, ops[first].kind == DDP_CALL_SEND ? "send" : "recv",
                        (unsigned)(ops[first].tag & 0xffffffffu),
                        ops[first].kind == DDP_CALL_SEND ? "waiting to send to" : "waiting for data from",
                        ops[first].root);
        if (r != DDP_SUCCESS) { i = -1; goto fail; }
    }
    return DDP_SUCCESS;
fail:
    for (j = 0; j < n; j++) if (ops[j].root != e->rank) p2p[4 * ops[j].root + 2] = p2p[4 * ops[j].root + 3] = 0;
    if (i < 0) return r;
    _ddp_p2p_where(&ops[i], n, where, sizeof where);
    return _ddp_x_fail(e, r, where);
}

/* Runs the sends and receives of ops[0..n) together (other calls are skipped). A send to this
 * rank is the next receive from this rank: a copy. */
_DDP_PRIVATE ddp_result_t _ddp_p2p_batch(_ddp_engine_t *e, uint32_t *p2p, _ddp_op_t *ops, int n) {
    int *list = (int *)(void *)e->scratch;
    const int list_cap = (int)(e->scratch_bytes / sizeof(int));
    const int npeers = _ddp_p2p_prepare(e, p2p, ops, n, list, list_cap);
    ddp_result_t r = _ddp_p2p_self(e, ops, n);
    if (r != DDP_SUCCESS) return r;
    if (npeers) {
        r = e->connect(e->host, npeers <= list_cap ? list : NULL, npeers <= list_cap ? npeers : e->nranks);
        if (r != DDP_SUCCESS) return _ddp_x_fail(e, r, n > 1 ? "group, phase connect" : "send/recv, phase connect");
    }
    return _ddp_p2p_progress(e, p2p, ops, n);
}

/* reduce, gather, scatter, all_to_all, send and recv, over the engine: the algorithm depends
 * only on (bytes, world size, scratch), the same on every rank. A rank that is wrongly the root
 * would wait for (or send) what nobody expects: reduce, gather and scatter agree on the call
 * first (ddp_ring.h, _ddp_agree). */
_DDP_PRIVATE ddp_result_t _ddp_algo_reduce(ddp_comm_t *c, const _ddp_op_t *k) {
    const size_t bytes = k->count * ddp_dtype_size(k->dtype);
    int tree, done;
    ddp_result_t r;
    if (_ddp_det_applies(c)) {   /* the agreement's small path adds in recursive doubling's order */
        if ((r = _ddp_agree(&c->eng, k->kind, k->dtype, k->op, k->count, k->root)) != DDP_SUCCESS) return r;
        _DDP_LOG(c, DDP_LOG_TRACE, "reduce #%u: %zu x %s %s to root %d, deterministic (rank order)",
                 c->eng.seq + 1, k->count, ddp_dtype_name(k->dtype), ddp_op_name(k->op), k->root);
        c->trace.cur->algo = "deterministic (rank order)";
        return _ddp_det_reduce(&c->eng, k->send, k->recv, k->count, k->dtype, k->op, k->root);
    }
    /* small: the agreement carries the data */
    r = _ddp_agree_with_data(&c->eng, k->kind, k->send, k->recv, k->count, k->dtype, k->op, k->root, &done);
    if (done) {
        _DDP_LOG(c, DDP_LOG_TRACE, "reduce #%u: %zu x %s %s to root %d, recursive doubling with the agreement",
                 c->eng.seq, k->count, ddp_dtype_name(k->dtype), ddp_op_name(k->op), k->root);
        c->trace.cur->algo = "recursive doubling, with the agreement";
        return r;
    }
    if ((r = _ddp_agree(&c->eng, k->kind, k->dtype, k->op, k->count, k->root)) != DDP_SUCCESS) return r;
    tree = bytes <= _DDP_TREE_MAX_BYTES && bytes <= c->eng.scratch_bytes / (size_t)(1 + _ddp_log2(c->eng.nranks));
    _DDP_LOG(c, DDP_LOG_TRACE, "reduce #%u: %zu x %s %s to root %d, %s, %s", c->eng.seq + 1, k->count,
             ddp_dtype_name(k->dtype), ddp_op_name(k->op), k->root,
             k->send == k->recv ? "in place" : "out of place", tree ? "binomial tree" : "pipelined chain");
    return tree ? _ddp_tree_reduce(&c->eng, k->send, k->recv, k->count, k->dtype, k->op, k->root)
                : _ddp_chain_reduce(&c->eng, k->send, k->recv, k->count, k->dtype, k->op, k->root);
}

_DDP_PRIVATE ddp_result_t _ddp_algo_gather_scatter(ddp_comm_t *c, const _ddp_op_t *k) {
    const int p = c->eng.nranks, gather = k->kind == DDP_CALL_GATHER;
    const size_t bytes = k->count * ddp_dtype_size(k->dtype);
    int tree;
    ddp_result_t r = _ddp_agree(&c->eng, k->kind, k->dtype, k->op, k->count, k->root);
    if (r != DDP_SUCCESS) return r;
    tree = p > 2 && bytes <= _DDP_TREE_MAX_BYTES / (size_t)p && bytes <= c->eng.scratch_bytes / (size_t)p;
    _DDP_LOG(c, DDP_LOG_TRACE, "%s #%u: %zu x %s per rank, root %d, %s", gather ? "gather" : "scatter",
             c->eng.seq + 1, k->count, ddp_dtype_name(k->dtype), k->root, tree ? "binomial tree" : "linear");
    if (gather)
        return tree ? _ddp_tree_gather(&c->eng, k->send, k->recv, k->count, k->dtype, k->root)
                    : _ddp_linear_gather(&c->eng, k->send, k->recv, k->count, k->dtype, k->root);
    return tree ? _ddp_tree_scatter(&c->eng, k->send, k->recv, k->count, k->dtype, k->root)
                : _ddp_linear_scatter(&c->eng, k->send, k->recv, k->count, k->dtype, k->root);
}

_DDP_PRIVATE ddp_result_t _ddp_algo_all_to_all(ddp_comm_t *c, const _ddp_op_t *k) {
    _DDP_LOG(c, DDP_LOG_TRACE, "all_to_all #%u: %zu x %s per peer, pairwise exchange", c->eng.seq + 1,
             k->count, ddp_dtype_name(k->dtype));
    return _ddp_pairwise_all_to_all(&c->eng, k->send, k->recv, k->count, k->dtype);
}

_DDP_PRIVATE ddp_result_t _ddp_algo_p2p(ddp_comm_t *c, const _ddp_op_t *k) {
    _ddp_op_t one = *k;
    return _ddp_p2p_batch(&c->eng, c->group.p2p, &one, 1);
}

static const _ddp_kind_row_t _ddp_kinds[_DDP_NUM_KINDS - 1] = {
    {DDP_CALL_ALL_REDUCE, _ddp_check_all_reduce, _ddp_algo_all_reduce, _ddp_coll_all_reduce, "ring", 0},
    {DDP_CALL_REDUCE_SCATTER, _ddp_check_reduce_scatter, _ddp_algo_reduce_scatter, _ddp_coll_reduce_scatter,
     "ring", 0},
    {DDP_CALL_ALL_GATHER, _ddp_check_all_gather, _ddp_algo_all_gather, _ddp_coll_all_gather, "ring", 0},
    {DDP_CALL_BROADCAST, _ddp_check_broadcast, _ddp_algo_broadcast, _ddp_coll_broadcast, "pipelined chain", 0},
    {DDP_CALL_BARRIER, _ddp_check_nothing, _ddp_algo_barrier, _ddp_coll_barrier, "", 0},
    {DDP_CALL_REDUCE, _ddp_check_reduce, _ddp_algo_reduce, NULL, "", 1},
    {DDP_CALL_GATHER, _ddp_check_gather, _ddp_algo_gather_scatter, NULL, "", 1},
    {DDP_CALL_SCATTER, _ddp_check_scatter, _ddp_algo_gather_scatter, NULL, "", 1},
    {DDP_CALL_ALL_TO_ALL, _ddp_check_all_to_all, _ddp_algo_all_to_all, NULL, "", 1},
    {DDP_CALL_SEND, _ddp_check_p2p, _ddp_algo_p2p, NULL, "", 1},
    {DDP_CALL_RECV, _ddp_check_p2p, _ddp_algo_p2p, NULL, "", 1}
};
_DDP_PRIVATE const _ddp_kind_row_t *_ddp_row(int kind) {
    DDP_ASSERT(kind >= 1 && kind < _DDP_NUM_KINDS && _ddp_kinds[kind - 1].kind == kind);
    return &_ddp_kinds[kind - 1];
}

/* Runs one operation on the calling thread (the caller's, or the progress thread). */
_DDP_PRIVATE ddp_result_t _ddp_run_op_raw(ddp_comm_t *c, const _ddp_op_t *o) {
    const _ddp_kind_row_t *row = _ddp_row(o->kind);
    c->trace.cur->algo = c->choice.coll ? "by the transport" : row->algo;
    return c->choice.coll && row->by_transport ? row->by_transport(c, o) : row->by_algorithm(c, o);
}

/* The flight recorder's dump, with a failure: in the log at DDP_DEBUG=INFO or finer; at the
 * default level in a file that one WARN line names, so a failure costs a rank at most three
 * lines at WARN (the error, where the dump is, "communicator is now unusable"). */
typedef struct { const ddp_comm_t *c; FILE *f; } _ddp_dump_sink_t;

_DDP_PRIVATE void _ddp_trace_log_line(void *arg, const char *s) {
    _ddp_dump_sink_t *k = (_ddp_dump_sink_t *)arg;
    if (k->f) fprintf(k->f, "%s\n", s);
    else ddp_comm_log(k->c, DDP_LOG_INFO, "%s", s);
}

_DDP_PRIVATE void _ddp_flight_dump(ddp_comm_t *c) {
    _ddp_dump_sink_t k;
    char path[512];
    const char *dir = getenv("TMPDIR");
    const unsigned long long n = c->trace.n, shown = n > _DDP_FLIGHT_DUMP ? _DDP_FLIGHT_DUMP : n;
    k.c = c;
    k.f = NULL;
    if (c->eng.log_level >= DDP_LOG_INFO) { _ddp_trace_dump(&c->trace, _ddp_trace_log_line, &k); return; }
    if (c->eng.log_level < DDP_LOG_WARN || !n) return;
    snprintf(path, sizeof path, "%s/libddp-flight-rank%d-pid%ld.txt", dir && *dir ? dir : "/tmp",
             c->eng.rank, (long)getpid());
    k.f = fopen(path, "a");
    if (!k.f) {
        _DDP_LOG(c, DDP_LOG_WARN, "flight recorder: cannot write %s (%s); DDP_DEBUG=INFO logs this "
                 "rank's last calls with a failure", path, strerror(errno));
        return;
    }
    fprintf(k.f, "%s\n", c->last_error);
    _ddp_trace_dump(&c->trace, _ddp_trace_log_line, &k);
    fclose(k.f);
    _DDP_LOG(c, DDP_LOG_WARN, "flight recorder: the last %llu of this rank's %llu calls are in %s "
             "(DDP_DEBUG=INFO logs them instead)", shown, n, path);
}

/* Every host operation passes here: the flight recorder's record around it, and on a failure
 * the recorder's last calls logged with the error. */
_DDP_PRIVATE ddp_result_t _ddp_run_op(ddp_comm_t *c, const _ddp_op_t *o) {
    ddp_result_t r;
    /* hooked requests are the reducer's buckets (its own thread row in the timeline) */
    const int tid = o->hooks.before || o->hooks.after ? 2 :
                    c->queue.progress_on && pthread_equal(pthread_self(), c->queue.lanes[0].thread) ? 1 : 0;
    const uint32_t seq = c->eng.seq + 1;
    const size_t bytes = _ddp_op_bytes(c, o, 1);
    int64_t t0;
    _ddp_trace_begin(&c->trace, seq, _ddp_kind_name(o->kind), o->count, bytes, (int)o->dtype,
                     (int)o->op, o->root, tid);
    t0 = _ddp_stats_begin(&c->stats, &c->pos, o->kind, seq, (uint64_t)bytes, c->trace.cur->t0_us);
    /* A failure inside is said once, whole, when the communicator is poisoned (_ddp_finish):
     * not again at each layer that adds its context (transport, algorithm, call). */
    c->op_thread = pthread_self();
    __atomic_store_n(&c->op_quiet, 1, __ATOMIC_RELEASE);
    r = _ddp_run_op_raw(c, o);
    __atomic_store_n(&c->op_quiet, 0, __ATOMIC_RELEASE);
    _ddp_trace_end(&c->trace, r);
    /* the gap check reads the clock at the end anyway: the position's "user code since" */
    if (r == DDP_SUCCESS) r = _ddp_fence_after_gap(c, r);
    _ddp_stats_end(&c->stats, &c->pos, o->kind, seq, bytes, r != DDP_SUCCESS, t0,
                   r == DDP_SUCCESS ? c->shrink.last_end_us : _ddp_trace_clock_us(&c->trace));
    if (r == DDP_SUCCESS) return r;
    if (r == DDP_ERR_ABORTED && _ddp_abort_has_reason(c)) r = _ddp_abort_poison(c);
    else if (r != DDP_ERR_REMOVED) r = _ddp_finish(c, r);
    _ddp_flight_dump(c);
    return r;
}

_DDP_PRIVATE ddp_result_t _ddp_exec(ddp_comm_t *c, const _ddp_op_t *o) {
    ddp_result_t r = _ddp_enter(c);
    if (r != DDP_SUCCESS) return r;
    r = _ddp_run_op(c, o);
    _ddp_end(c);
    return r;
}

/* The communicator's own agreements at init (_ddp_init_device): the minimum of one int32 over
 * the ranks, run here as a blocking all-reduce (host buffers, no user arguments to check). */
_DDP_PRIVATE ddp_result_t _ddp_exec_min_int32(ddp_comm_t *c, int32_t *v) {
    _ddp_op_t o = _ddp_op_make(DDP_CALL_ALL_REDUCE, v, v, 1, DDP_INT32, DDP_MIN, 0);
    return _ddp_exec(c, &o);
}

#endif /* DDP_COMM_DISPATCH_IMPLEMENTATION */
