/* SPDX-License-Identifier: MIT (see LICENSE) */
/* ddp_comm_queue.h — the operation queue, private: async requests run by progress threads
 * ("lanes") in issue order, submit, ddp_wait/ddp_test, abort and the async error.
 *
 * Depends on ddp_comm_device.h (a request may be a device one). Built by DDP_IMPLEMENTATION (or
 * DDP_COMM_QUEUE_IMPLEMENTATION).
 */
#if defined(DDP_IMPLEMENTATION) && !defined(DDP_COMM_QUEUE_IMPLEMENTATION)
#define DDP_COMM_QUEUE_IMPLEMENTATION
#endif
#if defined(DDP_COMM_QUEUE_IMPLEMENTATION)
#ifndef DDP_COMM_DEVICE_IMPLEMENTATION
#define DDP_COMM_DEVICE_IMPLEMENTATION
#endif
#endif
#include "ddp_comm_device.h"

/* ============================================================================================
 * IMPLEMENTATION
 * ========================================================================================== */
#if defined(DDP_COMM_QUEUE_IMPLEMENTATION) && !defined(DDP_COMM_QUEUE_IMPL_INCLUDED)
#define DDP_COMM_QUEUE_IMPL_INCLUDED
#if !defined(DDP_COMM_DEVICE_IMPL_INCLUDED)
#error "libddp: ddp_comm_queue.h's implementation needs those of the headers below it (define DDP_IMPLEMENTATION)"
#endif

#ifdef __cplusplus
extern "C" {   /* the public calls defined here: C linkage, as ddp_comm.h declares them */
#endif

/* ---- lanes
 * Requests run on progress threads ("lanes"), each in issue order. Lane 0 runs on the
 * communicator itself; with DDP_ASYNC_LANES > 1 (default 1: off) and the ring doing the
 * collectives (no transport-run collectives: shared memory gains nothing), requests of
 * DDP_LANE_MIN_BYTES or more take turns over the lanes, each lane > 0 running on its own copy
 * of the communicator (own connections), so that several large requests are on the wire at
 * once (NCCL's channels, Gloo's multiple pairs). Which lane runs a request depends only on the
 * sequence of requests, the same on every rank. A request waits for earlier requests of other
 * lanes whose buffers it would read or write while they write or read them, so the results are
 * those of issue order; and requests complete, for ddp_wait/ddp_test, in issue order. A lane
 * that fails aborts the others, which tells every peer. */

_DDP_PRIVATE int _ddp_ranges_meet(const void *a, size_t alen, const void *b, size_t blen) {
    uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
    return a && b && alen && blen && x < y + blen && y < x + alen;
}

/* 1 if o must wait for the earlier request e (another lane's): one writes what the other uses. */
_DDP_PRIVATE int _ddp_op_depends(const ddp_comm_t *c, const _ddp_op_t *o, const _ddp_op_t *e) {
    size_t os = _ddp_op_bytes(c, o, 0), orb = _ddp_op_bytes(c, o, 1);
    size_t es = _ddp_op_bytes(c, e, 0), erb = _ddp_op_bytes(c, e, 1);
    return _ddp_ranges_meet(o->send, os, e->recv, erb) || _ddp_ranges_meet(o->recv, orb, e->recv, erb) ||
           _ddp_ranges_meet(o->recv, orb, e->send, es);
}

/* Called with amu held: the next request of lane l that may start, or NULL. */
_DDP_PRIVATE _ddp_op_t *_ddp_lane_next(ddp_comm_t *c, _ddp_lane_t *l) {
    uint64_t id, e;
    for (id = l->cursor + 1; id <= c->queue.issued; id++) {
        _ddp_op_t *o = &c->queue.ops[(id - 1) % DDP_MAX_REQUESTS];
        if (o->lane != l->index) continue;
        for (e = c->queue.finished + 1; e < id; e++) {
            const _ddp_op_t *q = &c->queue.ops[(e - 1) % DDP_MAX_REQUESTS];
            if (q->lane != l->index && q->state != 3 && _ddp_op_depends(c, o, q)) return NULL;
        }
        return o;
    }
    return NULL;
}

_DDP_PRIVATE void _ddp_abort_internal(ddp_comm_t *c, ddp_result_t code, const char *reason);

/* A failure message without the "rank N: " and " [reason]" that ddp_comm_fail wrapped it in:
 * quoted inside another failure, which wraps it again (said once, not twice). */
_DDP_PRIVATE const char *_ddp_error_body(const char *err, char *out, size_t cap) {
    const char *s = err, *end;
    size_t n;
    if (!strncmp(s, "rank ", 5)) {
        const char *q = s + 5;
        while (*q >= '0' && *q <= '9') q++;
        if (q > s + 5 && q[0] == ':' && q[1] == ' ') s = q + 2;
    }
    n = strlen(s);
    end = s + n;
    if (n > 2 && end[-1] == ']') {
        const char *b = end - 1;
        while (b > s && *b != '[') b--;
        if (b > s + 1 && b[-1] == ' ' && b[0] == '[') end = b - 1;
    }
    n = (size_t)(end - s);
    if (n >= cap) n = cap - 1;
    memcpy(out, s, n);
    out[n] = 0;
    return out;
}

static void *_ddp_progress_main(void *arg) {
    _ddp_lane_t *l = (_ddp_lane_t *)arg;
    ddp_comm_t *c = l->owner, *x = l->exec;
    pthread_mutex_lock(&c->queue.amu);
    for (;;) {
        _ddp_op_t *o = _ddp_lane_next(c, l);
        ddp_result_t r;
        if (!o) {
            int more = 0;
            uint64_t id;
            for (id = l->cursor + 1; id <= c->queue.issued && !more; id++)
                more = c->queue.ops[(id - 1) % DDP_MAX_REQUESTS].lane == l->index;
            if (c->queue.progress_stop && !more) break;
            if (!more) {   /* nothing of ours queued: lane 0 polls a while for a new request */
                uint64_t next = c->queue.issued + 1;
                if (l->index == 0) {
                    pthread_mutex_unlock(&c->queue.amu);
                    _ddp_poll_u64(c, &c->queue.issued, next);
                    pthread_mutex_lock(&c->queue.amu);
                    if (c->queue.issued >= next || c->queue.progress_stop) continue;   /* re-check both */
                }
                pthread_cond_wait(&c->queue.acv, &c->queue.amu);
            } else {       /* ours, behind another lane's request it depends on */
                pthread_cond_wait(&c->queue.adone, &c->queue.amu);
            }
            continue;
        }
        o->state = 2;
        l->cursor = o->id;
        pthread_mutex_unlock(&c->queue.amu);
        r = _ddp_begin(x);
        if (r == DDP_SUCCESS) {
            if (o->hooks.before) o->hooks.before(o->hooks.arg);
            r = _ddp_run_op(x, o);
            _ddp_end(x);
            if (r == DDP_SUCCESS && o->hooks.after) o->hooks.after(o->hooks.arg);
        }
        if (r != DDP_SUCCESS && c->queue.nlanes > 1 && !__atomic_load_n(&x->queue.aborted, __ATOMIC_SEQ_CST)) {
            char why[640], body[600];
            int j;
            snprintf(why, sizeof why, "async lane %d failed: %.560s", l->index, _ddp_error_body(x->last_error, body, sizeof body));
            for (j = 0; j < c->queue.nlanes; j++)
                if (j != l->index) _ddp_abort_internal(c->queue.lanes[j].exec, r, why);
        }
        pthread_mutex_lock(&c->queue.amu);
        o->result = r;
        o->state = 3;
        while (c->queue.finished < c->queue.issued && c->queue.ops[c->queue.finished % DDP_MAX_REQUESTS].state == 3)
            __atomic_store_n(&c->queue.finished, c->queue.finished + 1, __ATOMIC_RELEASE);
        pthread_cond_broadcast(&c->queue.adone);
    }
    pthread_mutex_unlock(&c->queue.amu);
    return NULL;
}

/* The first async call: the lanes' progress threads. */
_DDP_PRIVATE ddp_result_t _ddp_lanes_start(ddp_comm_t *c, const char *what) {
    int i;
    ddp_result_t r;
    if (!c->queue.ops) {
        c->queue.ops = (_ddp_op_t *)_ddp_calloc(&c->alloc, sizeof *c->queue.ops * DDP_MAX_REQUESTS);
        if (!c->queue.ops) return ddp_comm_fail(c, DDP_ERR_OUT_OF_MEMORY, "%s: request slots", what);
    }
    for (i = 0; i < c->queue.nlanes; i++) {
        c->queue.lanes[i].index = i;
        c->queue.lanes[i].cursor = c->queue.issued;
        if (pthread_create(&c->queue.lanes[i].thread, NULL, _ddp_progress_main, &c->queue.lanes[i]) != 0) {
            r = ddp_comm_fail(c, DDP_ERR_SYSTEM, "%s: starting progress thread %d: %s", what, i,
                              strerror(errno));
            pthread_mutex_lock(&c->queue.amu);
            c->queue.progress_stop = 1;
            pthread_cond_broadcast(&c->queue.acv);
            pthread_mutex_unlock(&c->queue.amu);
            while (i-- > 0) pthread_join(c->queue.lanes[i].thread, NULL);
            c->queue.progress_stop = 0;
            return _ddp_comm_poison(c, r);   /* the peers may have queued theirs: fail them */
        }
    }
    c->queue.progress_on = 1;
    _DDP_LOG(c, DDP_LOG_INFO, "async: %d progress thread%s started (each runs its requests in issue order)",
             c->queue.nlanes, c->queue.nlanes > 1 ? "s" : "");
    return DDP_SUCCESS;
}

_DDP_PRIVATE ddp_result_t _ddp_submit(ddp_comm_t *c, const char *what, const _ddp_op_t *o,
                                      ddp_request_t *req) {
    _ddp_op_t *slot;
    int lane = 0;
    if (!c->queue.progress_on) {
        ddp_result_t r = _ddp_lanes_start(c, what);
        if (r != DDP_SUCCESS) return r;
    }
    if (c->queue.nlanes > 1 && _ddp_op_bytes(c, o, 1) >= c->queue.lane_min_bytes)
        lane = (int)(c->queue.big_ops++ % (uint64_t)c->queue.nlanes);
    pthread_mutex_lock(&c->queue.amu);
    slot = &c->queue.ops[c->queue.issued % DDP_MAX_REQUESTS];
    if (slot->state != 0) {
        pthread_mutex_unlock(&c->queue.amu);
        return ddp_comm_fail(c, DDP_ERR_INVALID_USAGE, "%s: %d requests outstanding already: "
                             "ddp_wait or ddp_test the oldest first", what, DDP_MAX_REQUESTS);
    }
    *slot = *o;
    slot->state = 1;
    slot->lane = lane;
    slot->id = c->queue.issued + 1;
    __atomic_store_n(&c->queue.issued, slot->id, __ATOMIC_RELEASE);
    pthread_cond_broadcast(&c->queue.acv);
    pthread_mutex_unlock(&c->queue.amu);
    req->comm = c;
    req->id = slot->id;
    _DDP_LOG(c, DDP_LOG_TRACE, "async: %s queued as request %llu (lane %d)", what,
             (unsigned long long)req->id, lane);
    return DDP_SUCCESS;
}

/* The slot of a live request, or NULL (the message says why). Called with amu held. */
_DDP_PRIVATE _ddp_op_t *_ddp_req_slot(ddp_request_t *req, const char *what, ddp_result_t *err) {
    ddp_comm_t *c = req->comm;
    _ddp_op_t *slot = &c->queue.ops[(req->id - 1) % DDP_MAX_REQUESTS];
    if (slot->id != req->id || slot->state == 0) {
        *err = ddp_comm_fail(c, DDP_ERR_INVALID_USAGE, "%s: request %llu was already collected",
                             what, (unsigned long long)req->id);
        return NULL;
    }
    return slot;
}

/* 1: a live request, go on; 0: *r is the answer (the null request, or misuse). */
_DDP_PRIVATE int _ddp_req_check(ddp_request_t *req, const char *what, ddp_result_t *r) {
    *r = DDP_SUCCESS;
    if (!req) { *r = DDP_ERR_INVALID_ARGUMENT; return 0; }
    if (!req->comm || !req->id) return 0;                        /* the null request */
    if (_ddp_usable(req->comm) != DDP_SUCCESS) { *r = DDP_ERR_INVALID_USAGE; return 0; }
    if (!req->comm->queue.ops) {
        *r = ddp_comm_fail(req->comm, DDP_ERR_INVALID_USAGE, "%s: not a request of this "
                           "communicator", what);
        return 0;
    }
    return 1;
}


DDP_API ddp_result_t ddp_wait(ddp_request_t *req) {
    ddp_result_t r;
    ddp_comm_t *c;
    _ddp_op_t *slot;
    if (req && req->comm && (req->id & _DDP_DEV_REQ) && _ddp_live_check(req->comm, 0))
        return _ddp_usable(req->comm) ? DDP_ERR_INVALID_USAGE : _ddp_dev_complete(req, NULL);
    if (!_ddp_req_check(req, "ddp_wait", &r)) return r;
    c = req->comm;
    pthread_mutex_lock(&c->queue.amu);
    if ((slot = _ddp_req_slot(req, "ddp_wait", &r)) != NULL) {
        if (c->queue.finished < req->id) {   /* requests finish in issue order */
            pthread_mutex_unlock(&c->queue.amu);
            _ddp_poll_u64(c, &c->queue.finished, req->id);
            pthread_mutex_lock(&c->queue.amu);
        }
        while (c->queue.finished < req->id) pthread_cond_wait(&c->queue.adone, &c->queue.amu);
        r = slot->result;
        slot->state = 0;
    }
    pthread_mutex_unlock(&c->queue.amu);
    if (slot) { req->comm = NULL; req->id = 0; }
    return r;
}

DDP_API ddp_result_t ddp_test(ddp_request_t *req, int *done) {
    ddp_result_t r;
    ddp_comm_t *c;
    _ddp_op_t *slot;
    if (!done) return DDP_ERR_INVALID_ARGUMENT;
    *done = 0;
    if (req && req->comm && (req->id & _DDP_DEV_REQ) && _ddp_live_check(req->comm, 0))
        return _ddp_usable(req->comm) ? DDP_ERR_INVALID_USAGE : _ddp_dev_complete(req, done);
    if (!_ddp_req_check(req, "ddp_test", &r)) { if (r == DDP_SUCCESS) *done = 1; return r; }
    c = req->comm;
    pthread_mutex_lock(&c->queue.amu);
    r = DDP_SUCCESS;
    if ((slot = _ddp_req_slot(req, "ddp_test", &r)) != NULL && c->queue.finished >= req->id) {
        r = slot->result;
        slot->state = 0;
        *done = 1;
    }
    pthread_mutex_unlock(&c->queue.amu);
    if (*done) { req->comm = NULL; req->id = 0; }
    return r;
}

/* Sets the abort flag (with a reason, when not the user's ddp_comm_abort). Nothing running: it
 * tells the peers now (closing our connections). Something running: that sees the flag at its
 * next wait and does it. */
_DDP_PRIVATE void _ddp_abort_internal(ddp_comm_t *c, ddp_result_t code, const char *reason) {
    pthread_mutex_lock(&c->queue.amu);
    if (reason && !c->queue.abort_reason[0] && !__atomic_load_n(&c->queue.aborted, __ATOMIC_SEQ_CST)) {
        _ddp_strlcpy(c->queue.abort_reason, reason, sizeof c->queue.abort_reason);
        c->queue.abort_code = code;
    }
    pthread_mutex_unlock(&c->queue.amu);
    __atomic_store_n(&c->queue.aborted, 1, __ATOMIC_SEQ_CST);
    {   /* wake a call asleep in a transport now, not at its next 100 ms poll */
        int i;
        for (i = 0; i < c->peers.ntinst; i++)
            if (c->peers.tinst[i].t->abort && c->peers.tinst[i].state) c->peers.tinst[i].t->abort(c->peers.tinst[i].state);
    }
    if (!__atomic_load_n(&c->queue.busy, __ATOMIC_SEQ_CST) && !__atomic_load_n(&c->dev.busy, __ATOMIC_SEQ_CST))
        _ddp_abort_poison(c);
    pthread_mutex_lock(&c->queue.amu);
    pthread_cond_broadcast(&c->queue.acv);
    pthread_cond_broadcast(&c->queue.adone);
    pthread_mutex_unlock(&c->queue.amu);
}

/* An abort by the library itself (the health thread: a neighbour unreachable), blaming a rank:
 * the call running fails with the reason, and a shrink that follows knows whom to leave out. */
_DDP_PRIVATE void _ddp_abort_blaming(ddp_comm_t *c, ddp_result_t code, const char *reason, int suspect) {
    int i;
    pthread_mutex_lock(&c->queue.amu);
    if (!c->queue.abort_suspect) c->queue.abort_suspect = suspect + 1;
    pthread_mutex_unlock(&c->queue.amu);
    _ddp_abort_internal(c, code, reason);
    for (i = 1; i < c->queue.nlanes; i++) _ddp_abort_internal(c->queue.lanes[i].exec, code, reason);
}

DDP_API ddp_result_t ddp_comm_abort(ddp_comm_t *c) {
    int i;
    if (!c) return DDP_ERR_INVALID_ARGUMENT;
    if (_ddp_usable(c) != DDP_SUCCESS) return DDP_ERR_INVALID_USAGE;
    _DDP_LOG(c, DDP_LOG_WARN, "ddp_comm_abort: every call on this communicator now returns "
             "DDP_ERR_ABORTED");
    _ddp_abort_internal(c, DDP_ERR_ABORTED, NULL);
    /* the lanes' copies (made at init) */
    for (i = 1; i < c->queue.nlanes; i++) _ddp_abort_internal(c->queue.lanes[i].exec, DDP_ERR_ABORTED, NULL);
    return DDP_SUCCESS;
}

DDP_API ddp_result_t ddp_comm_get_async_error(ddp_comm_t *c, ddp_result_t *e) {
    if (!c || !e) return DDP_ERR_INVALID_ARGUMENT;
    if (_ddp_usable(c) != DDP_SUCCESS) return DDP_ERR_INVALID_USAGE;
    *e = (ddp_result_t)__atomic_load_n(&c->error, __ATOMIC_SEQ_CST);
    if (*e == DDP_SUCCESS && __atomic_load_n(&c->queue.aborted, __ATOMIC_SEQ_CST)) *e = DDP_ERR_ABORTED;
    if (*e == DDP_SUCCESS && c->dev.provider) *e = c->dev.provider->async_error(c->dev.state);   /* the watchdog's */
    {
        int i;
        for (i = 1; *e == DDP_SUCCESS && i < c->queue.nlanes; i++)
            *e = (ddp_result_t)__atomic_load_n(&c->queue.lanes[i].exec->error, __ATOMIC_SEQ_CST);
    }
    return DDP_SUCCESS;
}

#ifdef __cplusplus
}
#endif

#endif /* DDP_COMM_QUEUE_IMPLEMENTATION */
