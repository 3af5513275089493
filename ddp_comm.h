/* SPDX-License-Identifier: MIT (see LICENSE) */
/* ddp_comm.h — libddp's communicator: its public calls, declared and documented here (their
 * types are in ddp_comm_types.h), and the entry points of those that issue an operation: every
 * one goes through one path (_ddp_issue: checks, device routing, the async queue, a group, or
 * run now). Here: the collectives, blocking and async, rooted ones, send/recv, groups (small
 * all-reduces fused) and split.
 *
 * The communicator by concept, each header built only on those below it (bottom first):
 *   ddp_comm_types.h     the public types (ddp_comm_t, the desc, requests, hooks)
 *   ddp_comm_core.h      the struct, live registry, logging and failure, peers, checks, the
 *                        operation record
 *   ddp_rendezvous.h     the rendezvous through the store
 *   ddp_comm_dispatch.h  the operation table and running one operation; the engine the
 *                        algorithms use and the context the transports see
 *   ddp_comm_device.h    device (GPU) buffers
 *   ddp_comm_queue.h     async requests, progress threads, abort
 *   ddp_comm_init.h      bootstrap: init, threads as ranks, env, destroy
 *   ddp_comm_shrink.h    shrink: the survivors of a lost rank agree and go on (its calls
 *                        are declared there)
 *   ddp_comm_grow.h      grow: joiners wait, the members admit them (declared there; also
 *                        ddp_comm_init_env, which joins when DDP_ELASTIC_JOIN=1)
 *   ddp_comm.h           the public calls (this file)
 * A blocking ddp_all_reduce: _ddp_issue here; _ddp_exec, _ddp_run_op and the algorithm choice in
 * ddp_comm_dispatch.h; the algorithm (ddp_algorithms.h) over the engine, whose isend
 * (ddp_comm_dispatch.h) hands the bytes to the peer's transport.
 *
 * Users include ddp.h, which includes this. Built by DDP_IMPLEMENTATION (or
 * DDP_COMM_IMPLEMENTATION).
 */
#if defined(DDP_IMPLEMENTATION) && !defined(DDP_COMM_IMPLEMENTATION)
#define DDP_COMM_IMPLEMENTATION
#endif
#if defined(DDP_COMM_IMPLEMENTATION)
#ifndef DDP_COMM_GROW_IMPLEMENTATION
#define DDP_COMM_GROW_IMPLEMENTATION
#endif
#endif
/* ddp_comm_grow.h (and under it ddp_comm_shrink.h, ddp_comm_init.h) first: the chain below it asks for the
 * implementations that ddp_comm_types.h includes (a vendored single-file copy inlines each
 * header once, at its first include). */
#include "ddp_comm_grow.h"
#include "ddp_comm_types.h"

#ifndef DDP_COMM_H_INCLUDED
#define DDP_COMM_H_INCLUDED

#ifdef __cplusplus
extern "C" {
#endif

/* The types (ddp_comm_t, ddp_comm_desc_t, ddp_request_t, ddp_async_hooks_t) are in
 * ddp_comm_types.h. */

/* ---- communicator ---- */
DDP_API ddp_result_t ddp_comm_init(ddp_comm_t **comm, int nranks, int rank,
                                   const ddp_comm_desc_t *desc);
DDP_API ddp_result_t ddp_comm_init_env(ddp_comm_t **comm, const ddp_comm_desc_t *desc);
/* Threads as ranks: n communicators in this process, comms[i] of rank i, each for one thread
 * (collectives on them must run concurrently, one thread per rank). Rendezvous through a
 * private store; the ranks reduce straight from each other's buffers when
 * transports/ddp_threads.h is compiled in, else share memory through transports/ddp_shm.h. */
DDP_API ddp_result_t ddp_comm_init_threads(ddp_comm_t **comms, int n, const ddp_comm_desc_t *desc);
DDP_API ddp_result_t ddp_comm_destroy(ddp_comm_t *comm);
/* Why the last ddp_comm_init/ddp_comm_init_env of the calling thread failed ("" if none). */
DDP_API const char *ddp_last_init_error(void);
DDP_API int ddp_comm_rank(const ddp_comm_t *comm);                  /* -1 if comm is NULL */
DDP_API int ddp_comm_size(const ddp_comm_t *comm);
DDP_API int ddp_comm_local_rank(const ddp_comm_t *comm);
DDP_API int ddp_comm_local_size(const ddp_comm_t *comm);
DDP_API const char *ddp_comm_last_error(const ddp_comm_t *comm);   /* "" when none; never NULL */
DDP_API int ddp_comm_timeout_ms(const ddp_comm_t *comm);           /* the timeout in effect */
DDP_API ddp_store_t *ddp_comm_store(ddp_comm_t *comm);             /* the rendezvous store */
DDP_API const char *ddp_comm_transport_name(const ddp_comm_t *comm, int peer);

/* ---- collectives (blocking) ---- */
DDP_API ddp_result_t ddp_all_reduce(const void *sendbuf, void *recvbuf, size_t count,
                                    ddp_dtype_t dtype, ddp_op_t op, ddp_comm_t *comm);
DDP_API ddp_result_t ddp_reduce_scatter(const void *sendbuf, void *recvbuf, size_t recvcount,
                                        ddp_dtype_t dtype, ddp_op_t op, ddp_comm_t *comm);
DDP_API ddp_result_t ddp_all_gather(const void *sendbuf, void *recvbuf, size_t sendcount,
                                    ddp_dtype_t dtype, ddp_comm_t *comm);
DDP_API ddp_result_t ddp_broadcast(const void *sendbuf, void *recvbuf, size_t count,
                                   ddp_dtype_t dtype, int root, ddp_comm_t *comm);
DDP_API ddp_result_t ddp_barrier(ddp_comm_t *comm);
/* Rooted collectives (NCCL's): recvbuf matters at the root only (NULL elsewhere is fine) for
 * reduce and gather; sendbuf at the root only for scatter. In place: reduce send == recv;
 * gather send == recv + rank*sendcount*size; scatter recv == send + rank*recvcount*size. */
DDP_API ddp_result_t ddp_reduce(const void *sendbuf, void *recvbuf, size_t count, ddp_dtype_t dtype,
                                ddp_op_t op, int root, ddp_comm_t *comm);
DDP_API ddp_result_t ddp_gather(const void *sendbuf, void *recvbuf, size_t sendcount,
                                ddp_dtype_t dtype, int root, ddp_comm_t *comm);
DDP_API ddp_result_t ddp_scatter(const void *sendbuf, void *recvbuf, size_t recvcount,
                                 ddp_dtype_t dtype, int root, ddp_comm_t *comm);
/* Block j of sendbuf goes to rank j; block i of recvbuf comes from rank i (count elements each).
 * Not in place: sendbuf == recvbuf is DDP_ERR_INVALID_ARGUMENT (as NCCL) unless count is 0. */
DDP_API ddp_result_t ddp_all_to_all(const void *sendbuf, void *recvbuf, size_t count,
                                    ddp_dtype_t dtype, ddp_comm_t *comm);
/* Point-to-point: only the two ranks call. Counts and dtypes must agree (else DDP_ERR_MISMATCH).
 * Outside a group each call blocks until its buffer is handed over; peer == self only inside a
 * group (a local copy; outside one it would wait for itself: DDP_ERR_INVALID_USAGE). */
DDP_API ddp_result_t ddp_send(const void *buf, size_t count, ddp_dtype_t dtype, int peer,
                              ddp_comm_t *comm);
DDP_API ddp_result_t ddp_recv(void *buf, size_t count, ddp_dtype_t dtype, int peer, ddp_comm_t *comm);
/* Calls between group_start and group_end (nestable) are queued and return DDP_SUCCESS; the
 * outermost group_end runs them: the collectives in call order, then every send and receive
 * at once, so exchanges that would deadlock one by one (a ring shift) complete. Buffers must
 * stay valid until group_end. Failures come back from group_end; a call with invalid arguments
 * also returns its error at once, and then group_end runs nothing and returns that error. */
DDP_API ddp_result_t ddp_group_start(ddp_comm_t *comm);
DDP_API ddp_result_t ddp_group_end(ddp_comm_t *comm);

/* ---- asynchronous collectives ----
 * Same arguments as the blocking calls plus a request the caller owns. The first async call
 * starts the communicator's progress thread, which runs operations one after another in issue
 * order (the same order on every rank), while the caller computes; with DDP_ASYNC_LANES=N,
 * requests from DDP_LANE_MIN_BYTES up take turns over N threads with their own connections
 * (results as in issue order). Buffers belong to the library until the request completes, and
 * requests complete in issue order. Errors surface at ddp_wait/ddp_test (and poison the
 * communicator, as a blocking call would). A blocking call on the same communicator first waits
 * for everything issued before it. At most DDP_MAX_REQUESTS may be outstanding (uncollected).
 * Async calls are refused inside a group; several small blocking all-reduces in a group are
 * fused into one (the cheapest way to reduce many scalars). */
DDP_API ddp_result_t ddp_all_reduce_async(const void *sendbuf, void *recvbuf, size_t count,
                                          ddp_dtype_t dtype, ddp_op_t op, ddp_comm_t *comm,
                                          ddp_request_t *req);
DDP_API ddp_result_t ddp_reduce_scatter_async(const void *sendbuf, void *recvbuf, size_t recvcount,
                                              ddp_dtype_t dtype, ddp_op_t op, ddp_comm_t *comm,
                                              ddp_request_t *req);
DDP_API ddp_result_t ddp_all_gather_async(const void *sendbuf, void *recvbuf, size_t sendcount,
                                          ddp_dtype_t dtype, ddp_comm_t *comm, ddp_request_t *req);
DDP_API ddp_result_t ddp_broadcast_async(const void *sendbuf, void *recvbuf, size_t count,
                                         ddp_dtype_t dtype, int root, ddp_comm_t *comm,
                                         ddp_request_t *req);
DDP_API ddp_result_t ddp_barrier_async(ddp_comm_t *comm, ddp_request_t *req);
DDP_API ddp_result_t ddp_reduce_async(const void *sendbuf, void *recvbuf, size_t count,
                                      ddp_dtype_t dtype, ddp_op_t op, int root, ddp_comm_t *comm,
                                      ddp_request_t *req);
DDP_API ddp_result_t ddp_gather_async(const void *sendbuf, void *recvbuf, size_t sendcount,
                                      ddp_dtype_t dtype, int root, ddp_comm_t *comm, ddp_request_t *req);
DDP_API ddp_result_t ddp_scatter_async(const void *sendbuf, void *recvbuf, size_t recvcount,
                                       ddp_dtype_t dtype, int root, ddp_comm_t *comm, ddp_request_t *req);
DDP_API ddp_result_t ddp_all_to_all_async(const void *sendbuf, void *recvbuf, size_t count,
                                          ddp_dtype_t dtype, ddp_comm_t *comm, ddp_request_t *req);
/* An async all-reduce with work for the progress thread around it: hooks->before(arg) runs
 * just before the all-reduce, hooks->after(arg) right after it succeeded, both on the progress
 * thread, off the caller's (DDP's Reducer copies a bucket in and out this way, so the training
 * thread only marks gradients). Either may be NULL; they must not call libddp on comm. */
DDP_API ddp_result_t ddp_all_reduce_async_hooked(const void *sendbuf, void *recvbuf, size_t count,
                                                 ddp_dtype_t dtype, ddp_op_t op, ddp_comm_t *comm,
                                                 const ddp_async_hooks_t *hooks, ddp_request_t *req);
/* *done = 1 once complete; then the request is collected (zeroed) and its result returned. */
DDP_API ddp_result_t ddp_test(ddp_request_t *req, int *done);
DDP_API ddp_result_t ddp_wait(ddp_request_t *req);           /* waits, collects, returns result */

/* ---- abort, split ----
 * ddp_comm_abort, from any thread: every call blocked on comm returns DDP_ERR_ABORTED (within
 * ~100 ms), and so does every later call; the peers learn it (their calls fail with
 * DDP_ERR_REMOTE naming this rank). The communicator still has to be destroyed (by one thread,
 * once no call on it is running). ddp_comm_get_async_error: the communicator's error state,
 * safe from any thread (a watchdog's poll). */
DDP_API ddp_result_t ddp_comm_abort(ddp_comm_t *comm);
/* Device (GPU) buffers, with transports/ddp_nccl.h: calls on device buffers are enqueued on this
 * CUDA stream (a cudaStream_t; NULL: the default stream) and return (NCCL semantics). 1 from
 * ddp_comm_device_enabled when device buffers are usable on this communicator (every rank can
 * use NCCL), else 0 and ddp_comm_last_error-style text in why (may be NULL). */
DDP_API ddp_result_t ddp_comm_set_cuda_stream(ddp_comm_t *comm, void *cuda_stream);
DDP_API int ddp_comm_device_enabled(const ddp_comm_t *comm, char *why, size_t cap);
/* For code that stages device data through the communicator (the reducer's buckets): 1 when
 * ptr is device memory; device memory of the communicator's GPU (free waits for the
 * communicator's device work first); a copy (either direction) and a fill with zeros, both
 * enqueued on the communicator's stream. DDP_ERR_UNSUPPORTED without NCCL. */
DDP_API int ddp_comm_is_device(ddp_comm_t *comm, const void *ptr);
DDP_API ddp_result_t ddp_comm_device_alloc(ddp_comm_t *comm, size_t bytes, void **ptr);
DDP_API ddp_result_t ddp_comm_device_free(ddp_comm_t *comm, void *ptr);
DDP_API ddp_result_t ddp_comm_device_copy(ddp_comm_t *comm, void *dst, const void *src, size_t bytes);
DDP_API ddp_result_t ddp_comm_device_zero(ddp_comm_t *comm, void *dst, size_t bytes);
/* Waits (bounded by the timeout) until the device work enqueued by this communicator is done. */
DDP_API ddp_result_t ddp_comm_device_synchronize(ddp_comm_t *comm);
DDP_API ddp_result_t ddp_comm_get_async_error(ddp_comm_t *comm, ddp_result_t *async_error);
/* MPI_Comm_split / ncclCommSplit: collective over comm; ranks with the same color form a new
 * communicator, ordered by (key, rank in comm); color DDP_SPLIT_NOCOLOR gives *newcomm = NULL. */
#define DDP_SPLIT_NOCOLOR (-1)
DDP_API ddp_result_t ddp_comm_split(ddp_comm_t *comm, int color, int key, ddp_comm_t **newcomm);
/* Surviving a lost rank: ddp_comm_shrink, ddp_comm_parent_rank, ddp_comm_removed_ranks and
 * ddp_comm_generation are declared and documented in ddp_comm_shrink.h (docs/elastic.md). */


/* The communicator's allocator (desc.allocator, else DDP_MALLOC/DDP_FREE); calloc zeroes. For
 * layers built on the communicator (the reducer) and hooks. */
DDP_API void *ddp_comm_calloc(ddp_comm_t *comm, size_t size);
DDP_API void ddp_comm_free(ddp_comm_t *comm, void *ptr);
/* ddp_comm_log (a line in the communicator's log: its prefix, level and sink) and ddp_comm_fail
 * (records a failure, shown by ddp_comm_last_error and logged at WARN; returns r) are declared
 * with their definitions in ddp_comm_core.h, because every layer of the communicator uses them. */

#ifdef __cplusplus
}
#endif
#endif /* DDP_COMM_H_INCLUDED */

/* ============================================================================================
 * IMPLEMENTATION
 * ========================================================================================== */
#if defined(DDP_COMM_IMPLEMENTATION) && !defined(DDP_COMM_IMPL_INCLUDED)
#define DDP_COMM_IMPL_INCLUDED
#if !defined(DDP_COMM_SHRINK_IMPL_INCLUDED)
#error "libddp: ddp_comm.h's implementation needs those of the headers below it (define DDP_IMPLEMENTATION)"
#endif

_DDP_PRIVATE ddp_result_t _ddp_group_queue(ddp_comm_t *c, const _ddp_op_t *o);  /* below */

/* Bad arguments inside a group also fail its group_end (NCCL). */
_DDP_PRIVATE ddp_result_t _ddp_call_reject(ddp_comm_t *c, ddp_result_t r) {
    if (c->group.depth && c->group.err == DDP_SUCCESS) c->group.err = r;
    return r;
}

/* The async forms refuse a missing request and a group (the group would run its calls after
 * this one: out of issue order). */
_DDP_PRIVATE ddp_result_t _ddp_async_refusal(ddp_comm_t *c, const char *what, const ddp_request_t *req) {
    if (!req) return ddp_comm_fail(c, DDP_ERR_INVALID_ARGUMENT, "%s: NULL request", what);
    if (c->group.depth)
        return ddp_comm_fail(c, DDP_ERR_INVALID_USAGE, "%s inside a group: groups take blocking "
                             "calls (they run together at group_end)", what);
    return DDP_SUCCESS;
}

/* The one path of every call. async NULL: blocking (run now, or queued inside a group; a
 * failure poisons the communicator); else the async form's name, and the call is queued for
 * the progress thread as req. Device buffers go to the device provider either way. */
_DDP_PRIVATE ddp_result_t _ddp_issue(ddp_comm_t *c, _ddp_op_t o, const char *async, ddp_request_t *req) {
    const _ddp_kind_row_t *row = _ddp_row(o.kind);
    const char *what = async ? async : _ddp_kind_name(o.kind);
    ddp_result_t r;
    int dev;
    if (async && req) { req->comm = NULL; req->id = 0; }
    if ((r = _ddp_check_comm(c)) != DDP_SUCCESS) return r;
    if (async && (r = _ddp_async_refusal(c, what, req)) != DDP_SUCCESS) return r;
    if ((r = row->check(c, &o, what)) != DDP_SUCCESS) return row->group_fails ? _ddp_call_reject(c, r) : r;
    if ((dev = _ddp_route(c, &o, &r)) < 0) return _ddp_call_reject(c, r);
    if (dev) return _ddp_dev_call(c, &o, async ? req : NULL);   /* inside a group: NCCL holds it */
    if (o.kind == DDP_CALL_BARRIER && !c->group.depth && (r = _ddp_dev_drain(c)) != DDP_SUCCESS) return r;
    if (async) return _ddp_submit(c, what, &o, req);
    if (c->group.depth) return _ddp_group_queue(c, &o);     /* runs at group_end, in order */
    return _ddp_exec(c, &o);    /* after queued async requests; not after an abort */
}

DDP_API ddp_result_t ddp_all_reduce(const void *sendbuf, void *recvbuf, size_t count,
                                    ddp_dtype_t dtype, ddp_op_t op, ddp_comm_t *c) {
    return _ddp_issue(c, _ddp_op_make(DDP_CALL_ALL_REDUCE, sendbuf, recvbuf, count, dtype, op, 0), NULL, NULL);
}

DDP_API ddp_result_t ddp_reduce_scatter(const void *sendbuf, void *recvbuf, size_t recvcount,
                                        ddp_dtype_t dtype, ddp_op_t op, ddp_comm_t *c) {
    return _ddp_issue(c, _ddp_op_make(DDP_CALL_REDUCE_SCATTER, sendbuf, recvbuf, recvcount, dtype, op, 0), NULL, NULL);
}

DDP_API ddp_result_t ddp_all_gather(const void *sendbuf, void *recvbuf, size_t sendcount,
                                    ddp_dtype_t dtype, ddp_comm_t *c) {
    return _ddp_issue(c, _ddp_op_make(DDP_CALL_ALL_GATHER, sendbuf, recvbuf, sendcount, dtype, DDP_SUM, 0), NULL, NULL);
}

DDP_API ddp_result_t ddp_broadcast(const void *sendbuf, void *recvbuf, size_t count,
                                   ddp_dtype_t dtype, int root, ddp_comm_t *c) {
    return _ddp_issue(c, _ddp_op_make(DDP_CALL_BROADCAST, sendbuf, recvbuf, count, dtype, DDP_SUM, root), NULL, NULL);
}

DDP_API ddp_result_t ddp_barrier(ddp_comm_t *c) {
    return _ddp_issue(c, _ddp_op_make(DDP_CALL_BARRIER, NULL, NULL, 0, DDP_UINT8, DDP_MAX, 0), NULL, NULL);
}

DDP_API ddp_result_t ddp_all_reduce_async(const void *sendbuf, void *recvbuf, size_t count,
                                          ddp_dtype_t dtype, ddp_op_t op, ddp_comm_t *c,
                                          ddp_request_t *req) {
    return _ddp_issue(c, _ddp_op_make(DDP_CALL_ALL_REDUCE, sendbuf, recvbuf, count, dtype, op, 0),
                      "all_reduce_async", req);
}

DDP_API ddp_result_t ddp_all_reduce_async_hooked(const void *sendbuf, void *recvbuf, size_t count,
                                                 ddp_dtype_t dtype, ddp_op_t op, ddp_comm_t *c,
                                                 const ddp_async_hooks_t *hooks, ddp_request_t *req) {
    _ddp_op_t o = _ddp_op_make(DDP_CALL_ALL_REDUCE, sendbuf, recvbuf, count, dtype, op, 0);
    if (hooks) o.hooks = *hooks;
    return _ddp_issue(c, o, "all_reduce_async_hooked", req);
}

/* LAYER INTERFACE for ddp_reducer.h (the one private call a header above this one may make;
 * keep its signature and meaning stable for it). The reducer's buckets of a flat gradient
 * buffer: elements [v_off, v_off + count) of a buffer of v_total, all-reduced so that every
 * element gets the additions of one all-reduce of the whole (same algorithm, same chunks): the
 * flat reducer's result is the flat all-reduce's, bit for bit. No public call can say "a part
 * of a larger buffer, cut as the whole", and users have no need to: so it stays private to
 * libddp instead of widening ddp.h. Otherwise ddp_all_reduce_async_hooked. */
_DDP_PRIVATE ddp_result_t _ddp_all_reduce_async_part(const void *sendbuf, void *recvbuf, size_t count,
                                                     ddp_dtype_t dtype, ddp_op_t op, ddp_comm_t *c,
                                                     const ddp_async_hooks_t *hooks, ddp_request_t *req,
                                                     size_t v_total, size_t v_off) {
    _ddp_op_t o = _ddp_op_make(DDP_CALL_ALL_REDUCE, sendbuf, recvbuf, count, dtype, op, 0);
    if (hooks) o.hooks = *hooks;
    if (v_total < count || v_off > v_total - count)
        return ddp_comm_fail(c, DDP_ERR_INVALID_ARGUMENT, "all_reduce: part [%zu, %zu) outside a buffer "
                             "of %zu elements", v_off, v_off + count, v_total);
    o.v_total = v_total;
    o.v_off = v_off;
    return _ddp_issue(c, o, "all_reduce_async_hooked", req);
}

DDP_API ddp_result_t ddp_reduce_scatter_async(const void *sendbuf, void *recvbuf, size_t recvcount,
                                              ddp_dtype_t dtype, ddp_op_t op, ddp_comm_t *c,
                                              ddp_request_t *req) {
    return _ddp_issue(c, _ddp_op_make(DDP_CALL_REDUCE_SCATTER, sendbuf, recvbuf, recvcount, dtype, op, 0),
                      "reduce_scatter_async", req);
}

DDP_API ddp_result_t ddp_all_gather_async(const void *sendbuf, void *recvbuf, size_t sendcount,
                                          ddp_dtype_t dtype, ddp_comm_t *c, ddp_request_t *req) {
    return _ddp_issue(c, _ddp_op_make(DDP_CALL_ALL_GATHER, sendbuf, recvbuf, sendcount, dtype, DDP_SUM, 0),
                      "all_gather_async", req);
}

DDP_API ddp_result_t ddp_broadcast_async(const void *sendbuf, void *recvbuf, size_t count,
                                         ddp_dtype_t dtype, int root, ddp_comm_t *c,
                                         ddp_request_t *req) {
    return _ddp_issue(c, _ddp_op_make(DDP_CALL_BROADCAST, sendbuf, recvbuf, count, dtype, DDP_SUM, root),
                      "broadcast_async", req);
}

DDP_API ddp_result_t ddp_barrier_async(ddp_comm_t *c, ddp_request_t *req) {
    return _ddp_issue(c, _ddp_op_make(DDP_CALL_BARRIER, NULL, NULL, 0, DDP_UINT8, DDP_MAX, 0),
                      "barrier_async", req);
}

/* ---------------------------------------------------------------- split
 * The members exchange (color, key) over the parent, then build a communicator of their own
 * through the parent's store, under a prefix unique to this split and color. Its connections
 * are new ones (sharing the parent's would interleave two communicators' messages on one
 * stream, and their progress threads could race on it). */
DDP_API ddp_result_t ddp_comm_split(ddp_comm_t *c, int color, int key, ddp_comm_t **out) {
    ddp_result_t r = _ddp_check_comm(c);
    int32_t mine[2], *all;
    int i, n = 0, me = 0, *hosts = NULL;
    void *inherited = NULL;
    char prefix[192];
    ddp_comm_desc_t d;
    _ddp_parent_t child;
    if (r != DDP_SUCCESS) return r;
    if (!out) return ddp_comm_fail(c, DDP_ERR_INVALID_ARGUMENT, "comm_split: NULL newcomm");
    *out = NULL;
    if (color < 0 && color != DDP_SPLIT_NOCOLOR)
        return ddp_comm_fail(c, DDP_ERR_INVALID_ARGUMENT, "comm_split: color %d (colors are >= 0, "
                             "or DDP_SPLIT_NOCOLOR)", color);
    all = (int32_t *)_ddp_alloc(&c->alloc, sizeof *all * 2 * (size_t)c->eng.nranks);
    if (!all) return ddp_comm_fail(c, DDP_ERR_OUT_OF_MEMORY, "comm_split");
    mine[0] = color;
    mine[1] = key;
    r = ddp_all_gather(mine, all, 2, DDP_INT32, c);
    c->boot.splits++;
    if (r == DDP_SUCCESS && color != DDP_SPLIT_NOCOLOR) {
        for (i = 0; i < c->eng.nranks; i++) {
            if (all[2 * i] != color) continue;
            n++;
            if (all[2 * i + 1] < key || (all[2 * i + 1] == key && i < c->eng.rank)) me++;
        }
    }
    if (r == DDP_SUCCESS && color != DDP_SPLIT_NOCOLOR && c->choice.host_of) {
        /* test hosts: the new ranks' host numbers, in their order (key, then parent rank) */
        if (!(hosts = (int *)_ddp_alloc(&c->alloc, sizeof *hosts * (size_t)n))) r = DDP_ERR_OUT_OF_MEMORY;
        for (i = 0; hosts && i < c->eng.nranks; i++) {
            int j, at = 0;
            if (all[2 * i] != color) continue;
            for (j = 0; j < c->eng.nranks; j++)
                if (all[2 * j] == color && (all[2 * j + 1] < all[2 * i + 1] || (all[2 * j + 1] == all[2 * i + 1] && j < i)))
                    at++;
            hosts[at] = c->choice.host_of[i];
        }
    }
    _ddp_free(&c->alloc, all);
    if (r == DDP_ERR_OUT_OF_MEMORY) return ddp_comm_fail(c, r, "comm_split");
    /* NCCL's split is a collective over the parent too (DDP_SPLIT_NOCOLOR ranks included). */
    if (r == DDP_SUCCESS && c->dev.provider) {
        _ddp_dev_enter(c);
        r = _ddp_dev_leave(c, c->dev.provider->split(c->dev.state, color, key, &inherited));
    }
    if (r != DDP_SUCCESS || color == DDP_SPLIT_NOCOLOR) { _ddp_free(&c->alloc, hosts); return r; }
    snprintf(prefix, sizeof prefix, "%s/split%u/color%d", c->boot.prefix, c->boot.splits, color);
    _ddp_child_desc(c, prefix, &d);
    _DDP_LOG(c, DDP_LOG_INFO, "comm_split: color %d key %d -> rank %d of %d (store prefix %s)",
             color, key, me, n, prefix);
    memset(&child, 0, sizeof child);
    child.dev_inherited = &inherited;
    child.split_hosts = hosts;
    child.no_health = 1;
    r = _ddp_comm_init(out, n, me, &d, &child);
    _ddp_free(&c->alloc, hosts);
    if (inherited && c->dev.provider->release_inherited) c->dev.provider->release_inherited(c->dev.state, inherited);
    if (r != DDP_SUCCESS)
        ddp_comm_fail(c, r, "comm_split: the new communicator (color %d, rank %d of %d): %s",
                      color, me, n, ddp_last_init_error());
    return r;
}

/* ---------------------------------------------------------------- reduce, gather, scatter,
 * all-to-all, send/recv, groups: the entry points (their rows are in the operation table,
 * ddp_comm_dispatch.h). Their algorithms (ddp_ring.h) run over point-to-point even when a
 * transport runs the collectives; the group queue is below. */
_DDP_PRIVATE ddp_result_t _ddp_group_run(ddp_comm_t *c);

DDP_API ddp_result_t ddp_reduce(const void *sendbuf, void *recvbuf, size_t count, ddp_dtype_t dtype,
                                ddp_op_t op, int root, ddp_comm_t *c) {
    return _ddp_issue(c, _ddp_op_make(DDP_CALL_REDUCE, sendbuf, recvbuf, count, dtype, op, root), NULL, NULL);
}
DDP_API ddp_result_t ddp_gather(const void *sendbuf, void *recvbuf, size_t sendcount,
                                ddp_dtype_t dtype, int root, ddp_comm_t *c) {
    return _ddp_issue(c, _ddp_op_make(DDP_CALL_GATHER, sendbuf, recvbuf, sendcount, dtype, DDP_SUM, root),
                      NULL, NULL);
}
DDP_API ddp_result_t ddp_scatter(const void *sendbuf, void *recvbuf, size_t recvcount,
                                 ddp_dtype_t dtype, int root, ddp_comm_t *c) {
    return _ddp_issue(c, _ddp_op_make(DDP_CALL_SCATTER, sendbuf, recvbuf, recvcount, dtype, DDP_SUM, root),
                      NULL, NULL);
}
DDP_API ddp_result_t ddp_all_to_all(const void *sendbuf, void *recvbuf, size_t count,
                                    ddp_dtype_t dtype, ddp_comm_t *c) {
    return _ddp_issue(c, _ddp_op_make(DDP_CALL_ALL_TO_ALL, sendbuf, recvbuf, count, dtype, DDP_SUM, 0),
                      NULL, NULL);
}
DDP_API ddp_result_t ddp_reduce_async(const void *sendbuf, void *recvbuf, size_t count, ddp_dtype_t dtype,
                                      ddp_op_t op, int root, ddp_comm_t *c, ddp_request_t *req) {
    return _ddp_issue(c, _ddp_op_make(DDP_CALL_REDUCE, sendbuf, recvbuf, count, dtype, op, root),
                      "reduce_async", req);
}
DDP_API ddp_result_t ddp_gather_async(const void *sendbuf, void *recvbuf, size_t sendcount,
                                      ddp_dtype_t dtype, int root, ddp_comm_t *c, ddp_request_t *req) {
    return _ddp_issue(c, _ddp_op_make(DDP_CALL_GATHER, sendbuf, recvbuf, sendcount, dtype, DDP_SUM, root),
                      "gather_async", req);
}
DDP_API ddp_result_t ddp_scatter_async(const void *sendbuf, void *recvbuf, size_t recvcount,
                                       ddp_dtype_t dtype, int root, ddp_comm_t *c, ddp_request_t *req) {
    return _ddp_issue(c, _ddp_op_make(DDP_CALL_SCATTER, sendbuf, recvbuf, recvcount, dtype, DDP_SUM, root),
                      "scatter_async", req);
}
DDP_API ddp_result_t ddp_all_to_all_async(const void *sendbuf, void *recvbuf, size_t count,
                                          ddp_dtype_t dtype, ddp_comm_t *c, ddp_request_t *req) {
    return _ddp_issue(c, _ddp_op_make(DDP_CALL_ALL_TO_ALL, sendbuf, recvbuf, count, dtype, DDP_SUM, 0),
                      "all_to_all_async", req);
}

DDP_API ddp_result_t ddp_send(const void *buf, size_t count, ddp_dtype_t dtype, int peer, ddp_comm_t *c) {
    return _ddp_issue(c, _ddp_op_make(DDP_CALL_SEND, buf, NULL, count, dtype, DDP_SUM, peer), NULL, NULL);
}

DDP_API ddp_result_t ddp_recv(void *buf, size_t count, ddp_dtype_t dtype, int peer, ddp_comm_t *c) {
    return _ddp_issue(c, _ddp_op_make(DDP_CALL_RECV, NULL, buf, count, dtype, DDP_SUM, peer), NULL, NULL);
}

DDP_API ddp_result_t ddp_group_start(ddp_comm_t *c) {
    ddp_result_t r = _ddp_check_comm(c);
    if (r != DDP_SUCCESS) return r;
    if (c->group.depth++ == 0) { c->group.n = 0; c->group.err = DDP_SUCCESS; }
    if (c->dev.provider) {   /* NCCL's group too */
        _ddp_dev_enter(c);
        if ((r = _ddp_dev_leave(c, c->dev.provider->group(c->dev.state, 1))) != DDP_SUCCESS) {
            c->group.depth--;
            return r;
        }
    }
    return DDP_SUCCESS;
}

DDP_API ddp_result_t ddp_group_end(ddp_comm_t *c) {
    ddp_result_t r;
    if (!c) return DDP_ERR_INVALID_ARGUMENT;
    if (_ddp_usable(c) != DDP_SUCCESS) return DDP_ERR_INVALID_USAGE;
    if (c->group.depth == 0)
        return ddp_comm_fail(c, DDP_ERR_INVALID_USAGE, "group_end without a group_start");
    if (c->dev.provider) {   /* NCCL's group ends with ours: its device calls are issued now */
        ddp_result_t dr;
        _ddp_dev_enter(c);
        dr = _ddp_dev_leave(c, c->dev.provider->group(c->dev.state, 0));
        if (dr != DDP_SUCCESS && c->group.err == DDP_SUCCESS) c->group.err = dr;
    }
    if (--c->group.depth) return DDP_SUCCESS;
    if (c->error != DDP_SUCCESS) { c->group.n = 0; return c->error; }
    if ((r = _ddp_enter(c)) != DDP_SUCCESS) { c->group.n = 0; return r; }
    r = _ddp_group_run(c);   /* empties the queue */
    r = r == DDP_SUCCESS || c->group.err != DDP_SUCCESS ? r : _ddp_finish(c, r);
    r = _ddp_fence_after_gap(c, r);
    _ddp_end(c);
    return r;
}

_DDP_PRIVATE ddp_result_t _ddp_group_queue(ddp_comm_t *c, const _ddp_op_t *k) {
    if (c->group.err != DDP_SUCCESS) return DDP_SUCCESS;   /* group_end reports the first */
    if (c->group.n == c->group.cap) {
        int cap = c->group.cap ? 2 * c->group.cap : 16;
        _ddp_op_t *ops = (_ddp_op_t *)ddp_comm_calloc(c, sizeof *ops * (size_t)cap);
        if (!ops) {
            c->group.err = ddp_comm_fail(c, DDP_ERR_OUT_OF_MEMORY, "group: queueing call %d", c->group.n + 1);
            return c->group.err;
        }
        if (c->group.n) memcpy(ops, c->group.ops, sizeof *ops * (size_t)c->group.n);
        ddp_comm_free(c, c->group.ops);
        c->group.ops = ops;
        c->group.cap = cap;
    }
    ((_ddp_op_t *)c->group.ops)[c->group.n++] = *k;
    return DDP_SUCCESS;
}

/* Tensor fusion (Horovod: Sergeev and Del Balso, "Horovod: fast and easy distributed deep
 * learning in TensorFlow", 2018, section "Tensor Fusion") for a group's small all-reduces: a run
 * of consecutive ones with the same dtype and op, at most _DDP_FUSE_BYTES together, is packed
 * into one buffer, reduced once and unpacked: one latency instead of one per call. A group holds
 * the same calls on every rank, so every rank packs the same way. A call whose buffers overlap
 * an earlier member's is not fused (in order, it would see that member's result). */
#define _DDP_FUSE_BYTES ((size_t)64 << 10)

/* How many calls from ops[i] on can run as one fused all-reduce (1: just ops[i]). */
_DDP_PRIVATE int _ddp_fuse_run_length(const _ddp_op_t *ops, int i, int n) {
    const _ddp_op_t *a = &ops[i];
    size_t es = ddp_dtype_size(a->dtype), total = a->count * es;
    int j, m;
    if (a->kind != DDP_CALL_ALL_REDUCE || total > _DDP_FUSE_BYTES) return 1;
    for (j = i + 1; j < n; j++) {
        const _ddp_op_t *b = &ops[j];
        size_t bytes = b->count * es;
        if (b->kind != a->kind || b->dtype != a->dtype || b->op != a->op ||
            total + bytes > _DDP_FUSE_BYTES)
            break;
        for (m = i; m < j; m++) {
            size_t mb = ops[m].count * es;
            if (_ddp_ranges_meet(b->recv, bytes, ops[m].send, mb) ||
                _ddp_ranges_meet(b->recv, bytes, ops[m].recv, mb) ||
                _ddp_ranges_meet(b->send, bytes, ops[m].recv, mb))
                break;
        }
        if (m < j) break;
        total += bytes;
    }
    return j - i;
}

_DDP_PRIVATE ddp_result_t _ddp_fused_all_reduce(ddp_comm_t *c, const _ddp_op_t *ops, int k) {
    size_t es = ddp_dtype_size(ops[0].dtype), off = 0;
    _ddp_op_t o;
    ddp_result_t r;
    int j;
    if (!c->group.fuse_buf && !(c->group.fuse_buf = (unsigned char *)ddp_comm_calloc(c, _DDP_FUSE_BYTES)))
        return ddp_comm_fail(c, DDP_ERR_OUT_OF_MEMORY, "group_end: the fusion buffer (%zu bytes)",
                             (size_t)_DDP_FUSE_BYTES);
    for (j = 0; j < k; j++) {
        if (ops[j].count) memcpy(c->group.fuse_buf + off, ops[j].send, ops[j].count * es);
        off += ops[j].count * es;
    }
    _DDP_LOG(c, DDP_LOG_TRACE, "group_end: %d all_reduces fused into one of %zu bytes", k, off);
    o = _ddp_op_make(DDP_CALL_ALL_REDUCE, c->group.fuse_buf, c->group.fuse_buf, off / es, ops[0].dtype, ops[0].op, 0);
    if ((r = _ddp_run_op_raw(c, &o)) != DDP_SUCCESS) return r;
    for (off = 0, j = 0; j < k; j++) {
        if (ops[j].count) memcpy(ops[j].recv, c->group.fuse_buf + off, ops[j].count * es);
        off += ops[j].count * es;
    }
    return DDP_SUCCESS;
}

/* The outermost group_end: the collectives in call order, then all sends and receives at once. */
_DDP_PRIVATE ddp_result_t _ddp_group_run(ddp_comm_t *c) {
    _ddp_op_t *ops = (_ddp_op_t *)c->group.ops;
    int n = c->group.n, i, nsend = 0, nrecv = 0;
    ddp_result_t r;
    c->group.n = 0;
    if (c->group.err != DDP_SUCCESS) {
        _DDP_LOG(c, DDP_LOG_TRACE, "group_end: %d calls not run: one failed its checks", n);
        return c->group.err;
    }
    for (i = 0; i < n; i++) nsend += ops[i].kind == DDP_CALL_SEND, nrecv += ops[i].kind == DDP_CALL_RECV;
    _DDP_LOG(c, DDP_LOG_TRACE, "group_end: %d calls: %d collectives, then %d sends and %d receives together",
             n, n - nsend - nrecv, nsend, nrecv);
    for (i = 0; i < n; i++) {
        int k;
        if (ops[i].kind == DDP_CALL_SEND || ops[i].kind == DDP_CALL_RECV) continue;
        k = _ddp_fuse_run_length(ops, i, n);
        r = k > 1 ? _ddp_fused_all_reduce(c, ops + i, k) : _ddp_run_op_raw(c, &ops[i]);
        if (r != DDP_SUCCESS) return r;
        i += k - 1;
    }
    return nsend + nrecv ? _ddp_p2p_batch(&c->eng, c->group.p2p, ops, n) : DDP_SUCCESS;
}

#endif /* DDP_COMM_IMPLEMENTATION */
