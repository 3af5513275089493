/* SPDX-License-Identifier: MIT (see LICENSE) */
/* ddp_comm_device.h — device (GPU) buffers, private: routing a call to the device provider of
 * a transport (transports/ddp_nccl.h), enqueueing it (with DDP_NCCL_CHECK's fingerprints),
 * completing and draining device requests, and the public device calls (stream, allocation,
 * copies).
 *
 * Depends on ddp_comm_dispatch.h. Built by DDP_IMPLEMENTATION (or DDP_COMM_DEVICE_IMPLEMENTATION).
 */
#if defined(DDP_IMPLEMENTATION) && !defined(DDP_COMM_DEVICE_IMPLEMENTATION)
#define DDP_COMM_DEVICE_IMPLEMENTATION
#endif
#if defined(DDP_COMM_DEVICE_IMPLEMENTATION)
#ifndef DDP_COMM_DISPATCH_IMPLEMENTATION
#define DDP_COMM_DISPATCH_IMPLEMENTATION
#endif
#endif
#include "ddp_comm_dispatch.h"

/* ============================================================================================
 * IMPLEMENTATION
 * ========================================================================================== */
#if defined(DDP_COMM_DEVICE_IMPLEMENTATION) && !defined(DDP_COMM_DEVICE_IMPL_INCLUDED)
#define DDP_COMM_DEVICE_IMPL_INCLUDED
#if !defined(DDP_COMM_DISPATCH_IMPL_INCLUDED)
#error "libddp: ddp_comm_device.h's implementation needs those of the headers below it (define DDP_IMPLEMENTATION)"
#endif

#ifdef __cplusplus
extern "C" {   /* the public calls defined here: C linkage, as ddp_comm.h declares them */
#endif

/* Device requests (transports/ddp_nccl.h) carry this bit in their id: ddp_wait and
 * ddp_test (ddp_comm_queue.h) tell them apart by it. */
#define _DDP_DEV_REQ ((uint64_t)1 << 63)

/* ---------------------------------------------------------------- device (GPU) buffers
 * A call whose buffers are device memory goes to the device provider (NCCL), enqueued on the
 * communicator's stream; host buffers stay on the host paths. Its requests carry
 * _DDP_DEV_REQ in their id: the provider's ticket (a CUDA event) completes them. */


/* The buffers this rank touches in o (NCCL: non-roots' unused buffers may be anything). */
_DDP_PRIVATE void _ddp_op_buffers(const ddp_comm_t *c, const _ddp_op_t *o, const void **a, const void **b) {
    const int root = c->eng.rank == o->root;
    *a = o->send;
    *b = o->recv;
    switch (o->kind) {
    case DDP_CALL_BROADCAST: case DDP_CALL_SCATTER: if (!root) *a = NULL; break;
    case DDP_CALL_REDUCE: case DDP_CALL_GATHER: if (!root) *b = NULL; break;
    case DDP_CALL_SEND: *b = NULL; break;
    case DDP_CALL_RECV: *a = NULL; break;
    default: break;
    }
    if (!o->count) *a = *b = NULL;
}

/* 1: a device call; 0: a host call; < 0: refused (recorded). */
_DDP_PRIVATE int _ddp_route(ddp_comm_t *c, const _ddp_op_t *o, ddp_result_t *err) {
    const void *a, *b;
    int da, db;
    *err = DDP_SUCCESS;
    if (!c->dev.any) return 0;
    _ddp_op_buffers(c, o, &a, &b);
    da = a && c->dev.any->is_device(c->dev.any_state, a);
    db = b && c->dev.any->is_device(c->dev.any_state, b);
    if (!da && !db) return 0;
    if (a && b && da != db) {
        *err = ddp_comm_fail(c, DDP_ERR_INVALID_ARGUMENT, "%s: sendbuf is %s memory and recvbuf %s "
                             "memory: a call takes device buffers or host buffers, not both",
                             _ddp_kind_name(o->kind), da ? "device" : "host", db ? "device" : "host");
        return -1;
    }
    if (!c->dev.provider) {
        *err = ddp_comm_fail(c, DDP_ERR_UNSUPPORTED, "%s: device buffers, but this communicator "
                             "cannot use NCCL: %s", _ddp_kind_name(o->kind), c->dev.declined);
        return -1;
    }
    return 1;
}

/* DDP_NCCL_CHECK: every rank compares the call it is about to enqueue (a host all-gather of its
 * fingerprint), so a mismatch is an error naming both calls instead of a hang inside NCCL. */
_DDP_PRIVATE ddp_result_t _ddp_dev_check_call(ddp_comm_t *c, const _ddp_op_t *o, uint64_t seq) {
    const int n = c->eng.nranks;
    uint64_t mine[6];
    _ddp_op_t ag;
    ddp_result_t r;
    int i;
    mine[0] = (uint64_t)o->kind; mine[1] = o->count; mine[2] = (uint64_t)o->dtype;
    mine[3] = o->kind == DDP_CALL_ALL_REDUCE || o->kind == DDP_CALL_REDUCE ||
              o->kind == DDP_CALL_REDUCE_SCATTER ? (uint64_t)o->op : 0;
    mine[4] = o->kind == DDP_CALL_ALL_REDUCE || o->kind == DDP_CALL_REDUCE_SCATTER ||
              o->kind == DDP_CALL_ALL_GATHER || o->kind == DDP_CALL_ALL_TO_ALL ? 0 : (uint64_t)o->root;
    mine[5] = seq;
    if (!c->dev.prints && !(c->dev.prints = (uint64_t *)ddp_comm_calloc(c, sizeof mine * (size_t)n)))
        return ddp_comm_fail(c, DDP_ERR_OUT_OF_MEMORY, "DDP_NCCL_CHECK: fingerprints");
    ag = _ddp_op_make(DDP_CALL_ALL_GATHER, mine, c->dev.prints, 6, DDP_UINT64, DDP_SUM, 0);
    if ((r = _ddp_run_op_raw(c, &ag)) != DDP_SUCCESS) return r;
    for (i = 0; i < n; i++) {
        const uint64_t *t = c->dev.prints + 6 * (size_t)i;
        if (!memcmp(t, mine, sizeof mine)) continue;
        return ddp_comm_fail(c, DDP_ERR_MISMATCH, "DDP_NCCL_CHECK: device call #%llu differs: this "
                             "rank: %s of %llu x %s (op %llu, root %llu); rank %d: %s #%llu of %llu x %s "
                             "(op %llu, root %llu)", (unsigned long long)seq, _ddp_kind_name(o->kind),
                             (unsigned long long)mine[1], ddp_dtype_name(o->dtype),
                             (unsigned long long)mine[3], (unsigned long long)mine[4], i,
                             _ddp_kind_name((int)t[0]), (unsigned long long)t[5], (unsigned long long)t[1],
                             ddp_dtype_name((ddp_dtype_t)t[2]), (unsigned long long)t[3],
                             (unsigned long long)t[4]);
    }
    return DDP_SUCCESS;
}

/* Device calls own the communicator as host calls do (an abort from another thread leaves the
 * poisoning to them: Dekker with _ddp_abort_internal), through their own flag: the progress
 * thread may hold c->queue.busy for host requests meanwhile, which device calls do not touch. */
_DDP_PRIVATE void _ddp_dev_enter(ddp_comm_t *c) { __atomic_add_fetch(&c->dev.busy, 1, __ATOMIC_SEQ_CST); }
_DDP_PRIVATE ddp_result_t _ddp_dev_leave(ddp_comm_t *c, ddp_result_t r) {
    if (r != DDP_SUCCESS)
        r = __atomic_load_n(&c->queue.aborted, __ATOMIC_SEQ_CST) ? _ddp_abort_poison(c) : _ddp_comm_poison(c, r);
    __atomic_sub_fetch(&c->dev.busy, 1, __ATOMIC_SEQ_CST);
    return r;
}

/* Enqueues o on the device; with req, also a ticket that ddp_wait/ddp_test complete. A failure
 * poisons the communicator as a host failure does (the NCCL communicator was aborted). */
_DDP_PRIVATE ddp_result_t _ddp_dev_call(ddp_comm_t *c, const _ddp_op_t *o, ddp_request_t *req) {
    ddp_device_call_t k;
    uint64_t ticket = 0;
    ddp_result_t r = _ddp_check_comm(c);
    int held = 0;
    if (r != DDP_SUCCESS) return r;
    if (req && c->dev.provider->in_group(c->dev.state, &held))
        return ddp_comm_fail(c, DDP_ERR_INVALID_USAGE, "%s_async on device buffers while an NCCL group "
                             "is open on this thread (ddp_group_start, on this or another communicator): "
                             "NCCL holds the call until the outermost ddp_group_end, so there would be "
                             "nothing to wait for yet; make it a blocking call in the group, or end the "
                             "group first", _ddp_kind_name(o->kind));
    _ddp_dev_enter(c);
    if (__atomic_load_n(&c->queue.aborted, __ATOMIC_SEQ_CST)) return _ddp_dev_leave(c, DDP_ERR_ABORTED);
    memset(&k, 0, sizeof k);
    k.kind = (ddp_call_kind_t)o->kind;
    k.send = o->send; k.recv = o->recv; k.count = o->count; k.dtype = o->dtype; k.op = o->op;
    k.root = o->root;
    k.seq = ++c->dev.seq;
    _DDP_LOG(c, DDP_LOG_TRACE, "%s device #%llu: %zu x %s, %s, enqueued on NCCL", _ddp_kind_name(o->kind),
             (unsigned long long)k.seq, o->count, ddp_dtype_name(o->dtype),
             o->send == o->recv ? "in place" : "out of place");
    if (c->dev.check && o->kind != DDP_CALL_SEND && o->kind != DDP_CALL_RECV &&
        (r = _ddp_enter(c)) == DDP_SUCCESS) {   /* a host all-gather: after queued host requests */
        r = _ddp_dev_check_call(c, o, k.seq);
        _ddp_end(c);
    }
    {
        _ddp_trace_rec_t tr;
        memset(&tr, 0, sizeof tr);
        tr.t0_us = _ddp_now_us();
        if (r == DDP_SUCCESS) r = c->dev.provider->enqueue(c->dev.state, &k);
        if (c->trace.file) {   /* the enqueue (the device runs it later, on its stream) */
            tr.seq = k.seq; tr.what = _ddp_kind_name(o->kind); tr.algo = "nccl (enqueued)";
            tr.count = o->count; tr.bytes = _ddp_op_bytes(c, o, 1); tr.dtype = (int)o->dtype;
            tr.op = (int)o->op; tr.root = o->root; tr.tid = 3; tr.result = r; tr.t1_us = _ddp_now_us();
            _ddp_trace_span(&c->trace, &tr);
        }
    }
    if (r == DDP_SUCCESS && req) r = c->dev.provider->mark(c->dev.state, &ticket);
    if (r == DDP_SUCCESS && req) { req->comm = c; req->id = ticket | _DDP_DEV_REQ; }
    return _ddp_dev_leave(c, r);
}

/* ddp_wait/ddp_test of a device request. */
_DDP_PRIVATE ddp_result_t _ddp_dev_complete(ddp_request_t *req, int *done) {
    ddp_comm_t *c = req->comm;
    uint64_t ticket = req->id & ~_DDP_DEV_REQ;
    ddp_result_t r;
    int fin = 0;
    if (!c->dev.provider) return ddp_comm_fail(c, DDP_ERR_INVALID_USAGE, "not a request of this communicator");
    _ddp_dev_enter(c);
    r = done ? c->dev.provider->query(c->dev.state, ticket, &fin) : c->dev.provider->wait(c->dev.state, ticket);
    if (!done) fin = 1;
    if (r != DDP_SUCCESS) fin = 1;
    r = _ddp_dev_leave(c, r);
    if (done) *done = fin;
    if (fin) { req->comm = NULL; req->id = 0; }
    return r;
}

/* Device work first (bounded), so that a barrier also means "every rank's device work enqueued
 * before it is done" (PyTorch's barrier on NCCL). */
_DDP_PRIVATE ddp_result_t _ddp_dev_drain(ddp_comm_t *c) {
    uint64_t ticket = 0;
    ddp_result_t r;
    int held = 0;
    if (!c->dev.provider) return DDP_SUCCESS;
    if (c->dev.provider->in_group(c->dev.state, &held) && held)
        return ddp_comm_fail(c, DDP_ERR_INVALID_USAGE, "%d device call(s) of this communicator are held "
                             "in an NCCL group still open on this thread (ddp_group_start, on this or "
                             "another communicator); NCCL issues them at the outermost ddp_group_end: "
                             "end the group before waiting for them", held);
    _ddp_dev_enter(c);
    r = c->dev.provider->mark(c->dev.state, &ticket);
    if (r == DDP_SUCCESS && ticket) r = c->dev.provider->wait(c->dev.state, ticket);
    return _ddp_dev_leave(c, r);
}

DDP_API ddp_result_t ddp_comm_set_cuda_stream(ddp_comm_t *c, void *stream) {
    ddp_result_t r = _ddp_check_comm(c);
    if (r != DDP_SUCCESS) return r;
    if (!c->dev.provider)
        return ddp_comm_fail(c, DDP_ERR_UNSUPPORTED, "set_cuda_stream: this communicator cannot use "
                             "NCCL: %s", c->dev.declined);
    return c->dev.provider->set_stream(c->dev.state, stream);
}

DDP_API int ddp_comm_is_device(ddp_comm_t *c, const void *ptr) {
    if (!c || !ptr || !_ddp_live_check(c, 0) || _ddp_forked(c) || !c->dev.any) return 0;
    return c->dev.any->is_device(c->dev.any_state, ptr);
}

_DDP_PRIVATE ddp_result_t _ddp_dev_usable(ddp_comm_t *c, const char *what) {
    ddp_result_t r = _ddp_check_comm(c);
    if (r != DDP_SUCCESS) return r;
    if (!c->dev.provider)
        return ddp_comm_fail(c, DDP_ERR_UNSUPPORTED, "%s: this communicator cannot use NCCL: %s", what,
                             c->dev.declined);
    return DDP_SUCCESS;
}

DDP_API ddp_result_t ddp_comm_device_alloc(ddp_comm_t *c, size_t bytes, void **ptr) {
    ddp_result_t r = _ddp_dev_usable(c, "device_alloc");
    if (ptr) *ptr = NULL;
    if (r != DDP_SUCCESS) return r;
    if (!ptr) return ddp_comm_fail(c, DDP_ERR_INVALID_ARGUMENT, "device_alloc: NULL ptr");
    _ddp_dev_enter(c);   /* a failure here (out of memory) leaves the communicator usable */
    r = c->dev.provider->mem_alloc(c->dev.state, bytes, ptr);
    __atomic_sub_fetch(&c->dev.busy, 1, __ATOMIC_SEQ_CST);
    return r;
}

DDP_API ddp_result_t ddp_comm_device_free(ddp_comm_t *c, void *ptr) {
    ddp_result_t r = _ddp_dev_usable(c, "device_free");
    if (r != DDP_SUCCESS || !ptr) return r;
    _ddp_dev_drain(c);   /* enqueued work may still read it; freed even if that failed */
    _ddp_dev_enter(c);   /* a failure here (out of memory) leaves the communicator usable */
    r = c->dev.provider->mem_free(c->dev.state, ptr);
    __atomic_sub_fetch(&c->dev.busy, 1, __ATOMIC_SEQ_CST);
    return r;
}

DDP_API ddp_result_t ddp_comm_device_copy(ddp_comm_t *c, void *dst, const void *src, size_t bytes) {
    ddp_result_t r = _ddp_dev_usable(c, "device_copy");
    if (r != DDP_SUCCESS || !bytes) return r;
    if (!dst || !src) return ddp_comm_fail(c, DDP_ERR_INVALID_ARGUMENT, "device_copy: NULL buffer");
    _ddp_dev_enter(c);   /* a failure here (out of memory) leaves the communicator usable */
    r = c->dev.provider->copy(c->dev.state, dst, src, bytes);
    __atomic_sub_fetch(&c->dev.busy, 1, __ATOMIC_SEQ_CST);
    return r;
}

DDP_API ddp_result_t ddp_comm_device_zero(ddp_comm_t *c, void *dst, size_t bytes) {
    ddp_result_t r = _ddp_dev_usable(c, "device_zero");
    if (r != DDP_SUCCESS || !bytes) return r;
    if (!dst) return ddp_comm_fail(c, DDP_ERR_INVALID_ARGUMENT, "device_zero: NULL buffer");
    _ddp_dev_enter(c);   /* a failure here (out of memory) leaves the communicator usable */
    r = c->dev.provider->fill_zero(c->dev.state, dst, bytes);
    __atomic_sub_fetch(&c->dev.busy, 1, __ATOMIC_SEQ_CST);
    return r;
}

DDP_API ddp_result_t ddp_comm_device_synchronize(ddp_comm_t *c) {
    ddp_result_t r = _ddp_dev_usable(c, "device_synchronize");
    return r != DDP_SUCCESS ? r : _ddp_dev_drain(c);
}

DDP_API int ddp_comm_device_enabled(const ddp_comm_t *c, char *why, size_t cap) {
    if (!c || !_ddp_live_check(c, 0)) { if (why && cap) _ddp_strlcpy(why, "no communicator", cap); return 0; }
    if (why && cap) _ddp_strlcpy(why, c->dev.provider ? "" : c->dev.declined, cap);
    return c->dev.provider != NULL;
}

#ifdef __cplusplus
}
#endif

#endif /* DDP_COMM_DEVICE_IMPLEMENTATION */
