/* SPDX-License-Identifier: MIT (see LICENSE) */
/* transports/ddp_nccl.h — libddp's NCCL transport: the same calls on GPU (device) buffers.
 *
 * In the file that defines DDP_IMPLEMENTATION:
 *
 *     #define DDP_IMPLEMENTATION
 *     #include "ddp.h"
 *     #include "transports/ddp_tcp.h"      (host buffers, and the rendezvous)
 *     #include "transports/ddp_nccl.h"     (device buffers)
 *
 * No -lnccl -lcudart needed: NCCL and the CUDA runtime are loaded at run time (dlopen) through
 * one function table (transports/ddp_nccl_api.h), so the program also runs on machines without
 * CUDA (the transport then declines, with one INFO line saying why, and host buffers work as
 * before). Define
 * DDP_NCCL_LINK (and link -lnccl -lcudart, with CUDA's include path) to call them directly.
 * Needs NCCL >= 2.19 (nonblocking communicators, ncclCommSplit, ncclMemAlloc); an older one is
 * declined, naming both versions.
 *
 * WHICH BUFFERS GO WHERE. Every call asks the CUDA runtime whether its buffers are device
 * memory (cached): device buffers go to NCCL, host buffers to the host transports (tcp/shm) on
 * the same communicator; a call that mixes them is DDP_ERR_INVALID_ARGUMENT. Every collective,
 * send/recv and group works on device buffers (gather/scatter/all-to-all as NCCL's own calls
 * when it has them, >= 2.28; otherwise as grouped send/recv), and ddp_comm_split splits the
 * NCCL communicator too (ncclCommSplit).
 *
 * STREAMS: NCCL SEMANTICS. A call on device buffers is enqueued on the communicator's CUDA
 * stream (the default stream unless ddp_comm_set_cuda_stream named one) and returns; the
 * result is in place when the stream gets there: work you enqueue after it on that stream
 * sees it; the host must synchronise (cudaStreamSynchronize, or ddp_wait on an async call)
 * before reading. Host buffers keep host semantics (a blocking call returns with the result
 * in place). The async forms return a request that ddp_test/ddp_wait complete through a CUDA
 * event (ddp_wait blocks the host until the device work is done). ddp_barrier first waits for
 * this communicator's device work, then meets the other ranks: when it returns, every rank's
 * device work enqueued before the barrier is done. DDP_AVG is ncclAvg, which divides before
 * summing for floats: results are identical on every rank but may differ from the host path's
 * in the last bit.
 *
 * NO HANGS. NCCL has no timeouts of its own (NVIDIA/nccl#1260): a watchdog thread records a
 * CUDA event after every call, enforces DDP_TIMEOUT_MS on each, polls ncclCommGetAsyncError,
 * and on a timeout or an error aborts the NCCL communicator (ncclCommAbort). The error names
 * the call, its number and how long it waited, followed by each rank's position (what it was
 * waiting in, through the rendezvous store) so that a mismatched call is explained. Every
 * wait of the host (init, ddp_wait, the ring of calls in flight) is bounded the same way.
 * ddp_comm_abort aborts the NCCL communicator. An operation is done only when its event fired
 * AND its communicator reports no asynchronous error (a failed operation ends too, its output
 * undefined). The first failure of a rank's device calls goes on the communicator's failure
 * board in the store; a peer whose call has waited 200 ms reads it (every 200 ms) and fails
 * with it, naming that rank, instead of waiting for its timeout. A rank whose NCCL setup fails
 * says so the same way, so every rank's init decides at once and alike (NCCL declined with the
 * failing rank named, or with DDP_NCCL=1 an init error naming it). Errors carry NCCL's own
 * text (ncclGetLastError).
 *
 * GROUPS ARE THE THREAD'S. NCCL holds every call a thread makes, on any communicator, from its
 * first ncclGroupStart to its outermost ncclGroupEnd. libddp follows: a device call on D inside
 * a group opened for C is held, and D's completion event is recorded at the outermost
 * ddp_group_end. Waiting for held calls inside the group (ddp_comm_device_synchronize or
 * ddp_barrier on D, an async call on any communicator while a group is open on the thread) is
 * DDP_ERR_INVALID_USAGE, which leaves the communicator usable.
 *
 * ENVIRONMENT
 *   DDP_NCCL              auto (default): use NCCL when every rank can; 0: never; 1: init fails
 *                         when NCCL cannot be used (instead of declining).
 *   DDP_NCCL_LIBRARY      the NCCL library to load (default libnccl.so.2 on the loader's path,
 *                         then CUDA_HOME's and /usr/local/cuda's lib64, CONDA_PREFIX/lib, and
 *                         the active virtualenv's site-packages/nvidia/<package>/lib, where
 *                         PyTorch's wheels put it).
 *   DDP_CUDART_LIBRARY    the CUDA runtime (libcudart.so.13, .so.12, .so; the same places).
 *   DDP_CUDA_DEVICE       the device this rank uses; default: local rank mod visible devices.
 *   DDP_NCCL_CHECK        1: before each device call, the ranks compare its fingerprint (kind,
 *                         count, dtype, op, root, number) over the host path, so a mismatched
 *                         call is DDP_ERR_MISMATCH naming both calls instead of a hang (costs a
 *                         host all-gather per call: for debugging).
 *
 * WHAT IS VERIFIED WHERE: against tests/fake_nccl (a fake NCCL and CUDA runtime whose streams
 * really run late and whose "device" memory the host cannot touch) and the real library's
 * failure paths; running on real GPUs is `make test-gpu` (see README, "NCCL").
 */
#if defined(DDP_IMPLEMENTATION) && !defined(DDP_NCCL_IMPLEMENTATION)
#define DDP_NCCL_IMPLEMENTATION
#endif
#if defined(DDP_NCCL_IMPLEMENTATION)
#ifndef DDP_TRANSPORT_IMPLEMENTATION
#define DDP_TRANSPORT_IMPLEMENTATION
#endif
#ifndef DDP_NCCL_API_IMPLEMENTATION
#define DDP_NCCL_API_IMPLEMENTATION
#endif
#endif
#include "ddp_transport.h"
#include "ddp_nccl_api.h"

#ifndef DDP_NCCL_H_INCLUDED
#define DDP_NCCL_H_INCLUDED
#ifdef __cplusplus
extern "C" {
#endif
DDP_API const ddp_transport_t *ddp_transport_nccl(void);
#ifdef __cplusplus
}
#endif
#endif /* DDP_NCCL_H_INCLUDED */

#if defined(DDP_NCCL_IMPLEMENTATION) && !defined(DDP_NCCL_IMPL_INCLUDED)
#define DDP_NCCL_IMPL_INCLUDED
#if !defined(DDP_TRANSPORT_IMPL_INCLUDED) || !defined(DDP_NCCL_API_IMPL_INCLUDED)
#error "transports/ddp_nccl.h's implementation needs ddp_transport.h's and ddp_nccl_api.h's (define DDP_IMPLEMENTATION)"
#endif
/* ---------------------------------------------------------------- per communicator */
#define _DDP_NCCL_INFLIGHT 256          /* calls in flight before an enqueue waits (events) */
#define _DDP_NCCL_PTR_CACHE 16
#define _DDP_NCCL_REPORT_RANKS 16       /* the hang report names at most this many ranks */

typedef struct {
    uint64_t seq;                       /* its ticket (this transport's numbering); 0: free */
    ddp_device_call_t call;             /* kind 0: copies/fills on the stream, no call */
    int ncalls;                         /* > 1: a group ending with `call` */
    int64_t t0_us;
    _ddp_cevent_t event;
} _ddp_nccl_rec_t;

typedef struct {
    const ddp_transport_ctx_t *ctx;
    const _ddp_nccl_api_t *api;
    char declined[384];                 /* why not (probe), "" when usable */
    int device, ndevices, device_forced;
    _ddp_ncomm_t comm;
    _ddp_cstream_t stream;
    /* comm_mu serialises the calls that use `comm` with the abort that frees it. */
    pthread_mutex_t comm_mu;
    int comm_dead;                      /* aborted or destroyed: never touch comm again */
    /* the calls in flight, oldest first: rec[head..tail) modulo _DDP_NCCL_INFLIGHT */
    pthread_mutex_t mu;
    pthread_cond_t cv;                  /* watchdog: something to watch, or stop */
    _ddp_nccl_rec_t rec[_DDP_NCCL_INFLIGHT];
    uint64_t head, tail;                /* positions, not seqs */
    uint64_t done_through;              /* every ticket <= this completed */
    uint64_t last_seq;                  /* the last ticket handed out */
    uint64_t done_call;                 /* the last call (its number) seen complete */
    int unrecorded;                     /* copies/fills enqueued since the last event */
    ddp_result_t error;                 /* sticky */
    char error_msg[1536];
    pthread_t watchdog;
    int watchdog_on, stop;
    /* a group in progress: calls held by NCCL until the end, then one event for them */
    int group_depth, group_n;
    ddp_device_call_t group_last;
    /* pointer classification cache (the caller's thread only) */
    const void *cache_ptr[_DDP_NCCL_PTR_CACHE];
    unsigned char cache_dev[_DDP_NCCL_PTR_CACHE];
    unsigned cache_next;
    int events_made;
} _ddp_nccl_t;

/* NCCL's group is the calling thread's, across communicators (nccl.h: ncclGroupStart "start a
 * group call"; calls on any communicator until the outermost ncclGroupEnd are held). An event
 * recorded at an inner end would precede the held calls on the stream, so the thread keeps the
 * depth and the communicators whose calls are held, and the outermost end records their
 * events. */
#define _DDP_NCCL_GROUP_COMMS 64
typedef struct {
    int depth;
    int n;
    _ddp_nccl_t *held[_DDP_NCCL_GROUP_COMMS];
} _ddp_nccl_tgroup_t;
static __thread _ddp_nccl_tgroup_t _ddp_nccl_tg;

_DDP_PRIVATE int _ddp_nccl_tg_find(const _ddp_nccl_t *s) {
    int i;
    for (i = 0; i < _ddp_nccl_tg.n; i++) if (_ddp_nccl_tg.held[i] == s) return i;
    return -1;
}

_DDP_PRIVATE void _ddp_nccl_describe(const ddp_device_call_t *k, int ncalls, char *out, size_t cap) {
    int n;
    if (k->kind == 0) {
        snprintf(out, cap, "copies on the stream after call #%llu", (unsigned long long)k->seq);
        return;
    }
    n = snprintf(out, cap, "%s #%llu (%zu x %s", _ddp_kind_name(k->kind),
                     (unsigned long long)k->seq, k->count, ddp_dtype_name(k->dtype));
    if (n < 0 || (size_t)n >= cap) return;
    if (k->kind == DDP_CALL_ALL_REDUCE || k->kind == DDP_CALL_REDUCE_SCATTER || k->kind == DDP_CALL_REDUCE)
        n += snprintf(out + n, cap - (size_t)n, " %s", ddp_op_name(k->op));
    if ((size_t)n >= cap) return;
    if (k->kind == DDP_CALL_SEND || k->kind == DDP_CALL_RECV)
        n += snprintf(out + n, cap - (size_t)n, " %s rank %d", k->kind == DDP_CALL_SEND ? "to" : "from", k->root);
    else if (k->kind == DDP_CALL_BROADCAST || k->kind == DDP_CALL_REDUCE || k->kind == DDP_CALL_GATHER ||
             k->kind == DDP_CALL_SCATTER)
        n += snprintf(out + n, cap - (size_t)n, " root %d", k->root);
    if ((size_t)n >= cap) return;
    if (ncalls > 1) n += snprintf(out + n, cap - (size_t)n, ", the last of a group of %d", ncalls);
    if ((size_t)n < cap) snprintf(out + n, cap - (size_t)n, ")");
}

_DDP_PRIVATE const char *_ddp_nccl_err(const _ddp_nccl_t *s, _ddp_nres_t r) {
    const char *m = s->api->NcclErrorString(r);
    return m ? m : "unknown NCCL error";
}

/* NCCL's own account of its last failure (ncclGetLastError, >= 2.13), as " (NCCL: ...)", or "".
 * The caller holds comm_mu or owns comm (setup). */
_DDP_PRIVATE const char *_ddp_nccl_last(const _ddp_nccl_t *s, _ddp_ncomm_t comm, char *out, size_t cap) {
    const char *last = s->api->NcclLastError ? s->api->NcclLastError(comm) : NULL;
    out[0] = 0;
    if (last && last[0]) snprintf(out, cap, " (NCCL: %.300s)", last);
    return out;
}

/* The sticky failure, from any thread (the watchdog's included): the first one wins, is logged
 * at WARN, and becomes the communicator's last error when the user's thread next returns from
 * this transport (_ddp_nccl_check: that buffer belongs to the user's thread). */
_DDP_PRIVATE ddp_result_t _ddp_nccl_fail(_ddp_nccl_t *s, ddp_result_t r, const char *fmt, ...)
#if defined(__GNUC__) || defined(__clang__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
_DDP_PRIVATE ddp_result_t _ddp_nccl_fail(_ddp_nccl_t *s, ddp_result_t r, const char *fmt, ...) {
    va_list ap;
    int first;
    char msg[sizeof s->error_msg];
    pthread_mutex_lock(&s->mu);
    first = s->error == DDP_SUCCESS;
    if (first) {
        va_start(ap, fmt);
        vsnprintf(s->error_msg, sizeof s->error_msg, fmt, ap);
        va_end(ap);
        _ddp_strlcpy(msg, s->error_msg, sizeof msg);
        __atomic_store_n(&s->error, r, __ATOMIC_SEQ_CST);
    }
    r = s->error;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    if (first) _DDP_TLOG(s->ctx, DDP_LOG_WARN, "%s [%s]", msg, ddp_strerror(r));
    return r;
}

/* The failure a call on this communicator returns now (sticky error, or an abort), recorded as
 * the communicator's last error. The user's thread only. */
_DDP_PRIVATE ddp_result_t _ddp_nccl_check(_ddp_nccl_t *s) {
    ddp_result_t e = (ddp_result_t)__atomic_load_n(&s->error, __ATOMIC_SEQ_CST);
    if (e != DDP_SUCCESS) {
        char msg[sizeof s->error_msg];
        pthread_mutex_lock(&s->mu);
        _ddp_strlcpy(msg, s->error_msg, sizeof msg);
        pthread_mutex_unlock(&s->mu);
        if (s->ctx->fail) s->ctx->fail(s->ctx->host, e, msg);
        return e;
    }
    if (ddp_transport_aborted(s->ctx)) return DDP_ERR_ABORTED;
    return DDP_SUCCESS;
}

/* A failure found on the user's thread: sticky, and recorded at once. */
#define _ddp_nccl_raise(s, ...) (_ddp_nccl_fail((s), __VA_ARGS__), _ddp_nccl_check(s))

/* ncclCommAbort, bounded. NCCL's abort waits for its own threads and the device work it ends,
 * which a wedged proxy or device can hold up, and nothing may hang: it runs on a thread of its own; if it has not returned within the communicator's
 * timeout (at least 1 s; 60 s when there is none), the communicator is abandoned (its memory
 * and NCCL's threads stay until the process exits) and the caller goes on. */
typedef struct {
    const _ddp_nccl_api_t *api;
    _ddp_ncomm_t comm;
    int device;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int done, abandoned;
} _ddp_nccl_aborter_t;

_DDP_PRIVATE void _ddp_nccl_aborter_free(_ddp_nccl_aborter_t *a) {
    pthread_mutex_destroy(&a->mu);
    pthread_cond_destroy(&a->cv);
    DDP_FREE(a);
}

_DDP_PRIVATE void *_ddp_nccl_aborter_main(void *arg) {
    _ddp_nccl_aborter_t *a = (_ddp_nccl_aborter_t *)arg;
    int abandoned;
    if (a->api->SetDevice(a->device) != 0) a->api->CudaLastError();
    a->api->CommAbort(a->comm);
    pthread_mutex_lock(&a->mu);
    a->done = 1;
    abandoned = a->abandoned;
    pthread_cond_signal(&a->cv);
    pthread_mutex_unlock(&a->mu);
    if (abandoned) _ddp_nccl_aborter_free(a);   /* nobody waits for it any more */
    return NULL;
}

_DDP_PRIVATE void _ddp_nccl_abort_bounded(_ddp_nccl_t *s, _ddp_ncomm_t comm) {
    const int ms = s->ctx->timeout_ms < 0 ? 60000 : s->ctx->timeout_ms < 1000 ? 1000 : s->ctx->timeout_ms;
    _ddp_nccl_aborter_t *a = (_ddp_nccl_aborter_t *)DDP_MALLOC(sizeof *a);   /* outlives s if abandoned */
    pthread_attr_t attr;
    pthread_t th;
    struct timespec until;
    int started = 0, done;
    if (!comm) return;
    if (a) {
        memset(a, 0, sizeof *a);
        a->api = s->api; a->comm = comm; a->device = s->device;
        pthread_mutex_init(&a->mu, NULL);
        pthread_cond_init(&a->cv, NULL);
        if (pthread_attr_init(&attr) == 0) {
            pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
            started = pthread_create(&th, &attr, _ddp_nccl_aborter_main, a) == 0;
            pthread_attr_destroy(&attr);
        }
    }
    if (!started) {   /* no thread: abort here, unbounded (what NCCL offers) */
        if (a) _ddp_nccl_aborter_free(a);
        s->api->CommAbort(comm);
        return;
    }
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += ms / 1000;
    until.tv_nsec += (long)(ms % 1000) * 1000000L;
    if (until.tv_nsec >= 1000000000L) { until.tv_sec++; until.tv_nsec -= 1000000000L; }
    pthread_mutex_lock(&a->mu);
    while (!a->done && pthread_cond_timedwait(&a->cv, &a->mu, &until) == 0) {}
    done = a->done;
    if (!done) a->abandoned = 1;
    pthread_mutex_unlock(&a->mu);
    if (done) _ddp_nccl_aborter_free(a);
    else
        _DDP_TLOG(s->ctx, DDP_LOG_WARN, "nccl: ncclCommAbort did not return within %d ms (NCCL's own "
                  "teardown is stuck); the NCCL communicator is abandoned: its GPU memory and threads "
                  "stay until the process exits", ms);
}

/* Frees the NCCL communicator now, whatever it is doing (once). */
_DDP_PRIVATE void _ddp_nccl_abort_comm(_ddp_nccl_t *s, const char *why) {
    pthread_mutex_lock(&s->comm_mu);
    if (!s->comm_dead && s->comm) {
        s->comm_dead = 1;
        _DDP_TLOG(s->ctx, DDP_LOG_WARN, "nccl: ncclCommAbort (%s)", why);
        _ddp_nccl_abort_bounded(s, s->comm);
    }
    s->comm_dead = 1;
    pthread_mutex_unlock(&s->comm_mu);
}

/* A rank whose device setup failed says so at once (the others would wait in NCCL's init for
 * it until the timeout), then fails. */
_DDP_PRIVATE ddp_result_t _ddp_nccl_setup_fail(_ddp_nccl_t *s, ddp_result_t r, const char *fmt, ...)
#if defined(__GNUC__) || defined(__clang__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
_DDP_PRIVATE ddp_result_t _ddp_nccl_setup_fail(_ddp_nccl_t *s, ddp_result_t r, const char *fmt, ...) {
    const ddp_transport_ctx_t *x = s->ctx;
    char msg[1024], note[1100];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    /* a rank that gave up because of a peer's note adds none of its own */
    if (r != DDP_ERR_REMOTE && x->post) {
        snprintf(note, sizeof note, "rank %d: %s", x->rank, msg);
        if (x->post(x->host, "nccl.setup", note) != DDP_SUCCESS)
            _DDP_TLOG(x, DDP_LOG_WARN, "nccl: could not tell the other ranks that this rank's NCCL "
                      "setup failed; they learn it at their timeout");
    }
    return _ddp_nccl_raise(s, r, "%s", msg);
}

/* A peer's setup failure (its note), while this rank waits in a collective setup. 1: there is
 * one, in out. Asked at most every 50 ms. */
_DDP_PRIVATE int _ddp_nccl_peer_setup_failed(_ddp_nccl_t *s, int64_t *next_us, char *out, size_t cap) {
    const ddp_transport_ctx_t *x = s->ctx;
    int64_t now = _ddp_now_us();
    if (!x->posted || now < *next_us) return 0;
    *next_us = now + 50000;
    return x->posted(x->host, "nccl.setup", out, cap);
}

/* After a call on a nonblocking communicator: ncclInProgress means "still being set up" (init,
 * split, the first connection to a peer), to be polled until it settles. Bounded; in a setup
 * (init, split), a peer's posted setup failure ends it too (DDP_ERR_REMOTE). */
_DDP_PRIVATE ddp_result_t _ddp_nccl_settle(_ddp_nccl_t *s, _ddp_ncomm_t comm, _ddp_nres_t r,
                                           const char *what, int setup) {
    int64_t deadline = _ddp_deadline(s->ctx->timeout_ms), t0 = _ddp_now_us(), next_note = t0;
    int nap = 50;
    while (r == _DDP_NCCL_IN_PROGRESS) {
        struct timespec ts;
        _ddp_nres_t async = _DDP_NRES(0);
        char note[1100];
        if (ddp_transport_aborted(s->ctx)) return DDP_ERR_ABORTED;
        if (setup && _ddp_nccl_peer_setup_failed(s, &next_note, note, sizeof note))
            return _ddp_nccl_raise(s, DDP_ERR_REMOTE, "nccl: %s abandoned: the NCCL setup failed on "
                                  "another rank: %s", what, note);
        if (deadline && _ddp_now_us() >= deadline)
            return _ddp_nccl_raise(s, DDP_ERR_TIMEOUT, "nccl: %s still in progress after %d ms "
                                  "(DDP_TIMEOUT_MS): a rank never joined it?", what,
                                  (int)((_ddp_now_us() - t0) / 1000));
        ts.tv_sec = 0;
        ts.tv_nsec = (long)nap * 1000;
        nanosleep(&ts, NULL);
        if (nap < 10000) nap *= 2;
        pthread_mutex_lock(&s->comm_mu);
        if (s->comm_dead && comm == s->comm) { pthread_mutex_unlock(&s->comm_mu); return _ddp_nccl_check(s); }
        if (s->api->CommGetAsyncError(comm, &async) != 0) async = _DDP_NRES(3);
        pthread_mutex_unlock(&s->comm_mu);
        r = async;
    }
    if (r != 0) {
        char last[340];
        pthread_mutex_lock(&s->comm_mu);
        if (!s->comm_dead || comm != s->comm) _ddp_nccl_last(s, comm, last, sizeof last);
        else last[0] = 0;
        pthread_mutex_unlock(&s->comm_mu);
        if (setup)
            return _ddp_nccl_setup_fail(s, r == 6 ? DDP_ERR_REMOTE : DDP_ERR_SYSTEM, "nccl: %s: %s%s",
                                        what, _ddp_nccl_err(s, r), last);
        return _ddp_nccl_raise(s, r == 6 ? DDP_ERR_REMOTE : DDP_ERR_SYSTEM, "nccl: %s: %s%s", what,
                              _ddp_nccl_err(s, r), last);
    }
    return DDP_SUCCESS;
}

/* ---------------------------------------------------------------- the watchdog
 * Watches the oldest call in flight: completes it when its event fired, fails everything when
 * it waited longer than the timeout or NCCL reported an asynchronous error. */

/* Every rank that times out says where it is (through the store); the others' answers within a
 * grace explain a mismatch (rank 0 in all_reduce #7, rank 1 in broadcast #7) or name the rank
 * that stopped (no answer: it is not waiting in a device call). */
_DDP_PRIVATE void _ddp_nccl_hang_report(_ddp_nccl_t *s, const char *mine, char *out, size_t cap) {
    const ddp_transport_ctx_t *x = s->ctx;
    int n = x->nranks, i, listed = 0, silent = 0;
    int64_t until;
    size_t off = 0;
    char pos[384];
    out[0] = 0;
    _ddp_strlcpy(pos, mine, sizeof pos);
    if (!x->publish || !x->published || !x->lookup ||
        x->publish(x->host, "nccl.pos", pos, strlen(pos) + 1) != DDP_SUCCESS) return;
    /* Healthy ranks time out within a short spread of each other: half a second of grace,
     * so the error still comes well within DDP_TIMEOUT_MS + 1 s. */
    until = _ddp_now_us() + 500000;
    for (i = 0; i < n && off + 96 < cap; i++) {
        char theirs[384];
        size_t len = 0;
        if (i == x->rank) continue;
        while (!x->published(x->host, "nccl.pos", i) && _ddp_now_us() < until) {
            struct timespec ts = { 0, 20000000 };
            nanosleep(&ts, NULL);
        }
        if (!x->published(x->host, "nccl.pos", i)) {
            silent++;
            if (listed < _DDP_NCCL_REPORT_RANKS) {
                off += (size_t)snprintf(out + off, cap - off, "; rank %d: no report (not waiting in a "
                                        "device call: stuck before it, or dead)", i);
                listed++;
            }
            continue;
        }
        if (x->lookup(x->host, "nccl.pos", i, theirs, sizeof theirs - 1, &len) != DDP_SUCCESS) continue;
        theirs[len < sizeof theirs ? len : sizeof theirs - 1] = 0;
        if (listed < _DDP_NCCL_REPORT_RANKS) {
            off += (size_t)snprintf(out + off, cap - off, "; rank %d: %s", i, theirs);
            listed++;
        }
    }
    if (silent && off + 64 < cap)
        snprintf(out + off, cap - off, " (%d rank%s without a report)", silent, silent == 1 ? "" : "s");
}

_DDP_PRIVATE void _ddp_nccl_timeout(_ddp_nccl_t *s, const _ddp_nccl_rec_t *r, int64_t waited_ms) {
    char what[200], mine[320], report[1024];
    _ddp_nccl_describe(&r->call, r->ncalls, what, sizeof what);
    snprintf(mine, sizeof mine, "waiting in %s for %lld ms, completed through #%llu", what,
             (long long)waited_ms, (unsigned long long)s->done_call);
    _ddp_nccl_hang_report(s, mine, report, sizeof report);
    _ddp_nccl_fail(s, DDP_ERR_TIMEOUT, "nccl: %s did not complete within %d ms (DDP_TIMEOUT_MS; "
                   "waited %lld ms): NCCL communicator aborted. Rank %d: %s%s", what,
                   s->ctx->timeout_ms, (long long)waited_ms, s->ctx->rank, mine, report);
    _ddp_nccl_abort_comm(s, "timeout");
}

/* The first failure of this rank's device calls goes on the communicator's failure board, so
 * that peers waiting in the same call stop at once instead of at their timeout. */
_DDP_PRIVATE void _ddp_nccl_tell_peers(_ddp_nccl_t *s) {
    const ddp_transport_ctx_t *x = s->ctx;
    char note[sizeof s->error_msg + 16];
    pthread_mutex_lock(&s->mu);
    snprintf(note, sizeof note, "rank %d: %s", x->rank, s->error_msg);
    pthread_mutex_unlock(&s->mu);
    if (x->post) x->post(x->host, "abort", note);
}

/* NCCL reported an asynchronous error (ncclCommGetAsyncError) during the call r: fail, abort
 * the NCCL communicator, tell the peers. Any thread. */
_DDP_PRIVATE ddp_result_t _ddp_nccl_async_failed(_ddp_nccl_t *s, const _ddp_nccl_rec_t *r,
                                                 const ddp_device_call_t *k, int ncalls, _ddp_nres_t async) {
    char what[200], last[340] = "";
    ddp_result_t e;
    if (r || k) _ddp_nccl_describe(r ? &r->call : k, r ? r->ncalls : ncalls, what, sizeof what);
    else snprintf(what, sizeof what, "the device work through call #%llu", (unsigned long long)s->done_call);
    pthread_mutex_lock(&s->comm_mu);
    if (!s->comm_dead) _ddp_nccl_last(s, s->comm, last, sizeof last);
    pthread_mutex_unlock(&s->comm_mu);
    e = _ddp_nccl_fail(s, async == 6 ? DDP_ERR_REMOTE : DDP_ERR_SYSTEM, "nccl: asynchronous error "
                       "during %s: %s%s; NCCL communicator aborted", what, _ddp_nccl_err(s, async), last);
    _ddp_nccl_abort_comm(s, "asynchronous error");
    _ddp_nccl_tell_peers(s);
    return e;
}

/* NCCL's asynchronous error of this communicator: 0, or the ncclResult_t (not ncclInProgress). */
_DDP_PRIVATE _ddp_nres_t _ddp_nccl_async(_ddp_nccl_t *s) {
    _ddp_nres_t async = _DDP_NRES(0);
    pthread_mutex_lock(&s->comm_mu);
    if (!s->comm_dead && s->api->CommGetAsyncError(s->comm, &async) != 0) async = _DDP_NRES(3);
    pthread_mutex_unlock(&s->comm_mu);
    return async == _DDP_NCCL_IN_PROGRESS ? _DDP_NRES(0) : async;
}

_DDP_PRIVATE void *_ddp_nccl_watchdog_main(void *arg) {
    _ddp_nccl_t *s = (_ddp_nccl_t *)arg;
    int64_t next_board = 0;
    int nap = 100;
    if (s->api->SetDevice(s->device) != 0) s->api->CudaLastError();
    pthread_mutex_lock(&s->mu);
    for (;;) {
        _ddp_nccl_rec_t *r;
        _ddp_cerr_t q;
        _ddp_nres_t async = _DDP_NRES(0);
        struct timespec ts;
        while (!s->stop && (s->head == s->tail || s->error != DDP_SUCCESS)) {
            pthread_cond_wait(&s->cv, &s->mu);
            nap = 100;
        }
        if (s->stop) break;
        r = &s->rec[s->head % _DDP_NCCL_INFLIGHT];
        pthread_mutex_unlock(&s->mu);
        q = s->api->EventQuery(r->event);   /* before the error: done means done without one */
        async = _ddp_nccl_async(s);
        if (async != 0) {
            _ddp_nccl_async_failed(s, r, NULL, 0, async);
        } else if (q != 0 && q != _DDP_CUDA_NOT_READY) {
            char what[200];
            s->api->CudaLastError();
            _ddp_nccl_describe(&r->call, r->ncalls, what, sizeof what);
            _ddp_nccl_fail(s, DDP_ERR_SYSTEM, "nccl: cudaEventQuery after %s: %s", what,
                           s->api->CudaErrorString(q));
            _ddp_nccl_abort_comm(s, "CUDA error");
            _ddp_nccl_tell_peers(s);
        } else if (q == 0) {
            pthread_mutex_lock(&s->mu);
            if (r->seq > s->done_through) s->done_through = r->seq;
            if (r->call.kind && r->call.seq > s->done_call) s->done_call = r->call.seq;
            r->seq = 0;
            s->head++;
            pthread_cond_broadcast(&s->cv);
            nap = 100;
            continue;   /* holding mu */
        } else if (s->ctx->timeout_ms >= 0 &&
                   _ddp_now_us() - r->t0_us > (int64_t)s->ctx->timeout_ms * 1000) {
            _ddp_nccl_timeout(s, r, (_ddp_now_us() - r->t0_us) / 1000);
        } else if (_ddp_now_us() - r->t0_us > 200000 && _ddp_now_us() >= next_board && s->ctx->posted) {
            /* waiting long: has another rank failed (its NCCL error, a host failure)? Then this
             * call cannot complete; say why now, not at the timeout. */
            char note[1100];
            next_board = _ddp_now_us() + 200000;
            if (s->ctx->posted(s->ctx->host, "abort", note, sizeof note)) {
                char what[200];
                _ddp_nccl_describe(&r->call, r->ncalls, what, sizeof what);
                _ddp_nccl_fail(s, DDP_ERR_REMOTE, "nccl: %s cannot complete: another rank failed "
                               "(%s); NCCL communicator aborted", what, note);
                _ddp_nccl_abort_comm(s, "a peer failed");
            }
        }
        /* nothing finished: poll again soon, backing off to 5 ms (a device call takes
         * microseconds to seconds; the watchdog must not cost a core) */
        ts.tv_sec = 0;
        ts.tv_nsec = (long)nap * 1000;
        nanosleep(&ts, NULL);
        if (nap < 5000) nap *= 2;
        pthread_mutex_lock(&s->mu);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

/* Records an event after the work just enqueued: the watchdog watches it, tickets wait on it.
 * Waits (bounded) for the oldest call when _DDP_NCCL_INFLIGHT are in flight. */
_DDP_PRIVATE ddp_result_t _ddp_nccl_record(_ddp_nccl_t *s, const ddp_device_call_t *k, int ncalls) {
    _ddp_nccl_rec_t *r;
    _ddp_cerr_t e;
    int64_t deadline = _ddp_deadline(s->ctx->timeout_ms < 0 ? -1 : s->ctx->timeout_ms + 2000);
    pthread_mutex_lock(&s->mu);
    while (s->tail - s->head == _DDP_NCCL_INFLIGHT && s->error == DDP_SUCCESS) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 10000000;
        if (ts.tv_nsec >= 1000000000) { ts.tv_sec++; ts.tv_nsec -= 1000000000; }
        pthread_cond_timedwait(&s->cv, &s->mu, &ts);
        if (deadline && _ddp_now_us() > deadline) break;   /* the watchdog fails it first */
    }
    if (s->error != DDP_SUCCESS || s->tail - s->head == _DDP_NCCL_INFLIGHT) {
        pthread_mutex_unlock(&s->mu);
        return _ddp_nccl_check(s) != DDP_SUCCESS ? _ddp_nccl_check(s)
               : _ddp_nccl_raise(s, DDP_ERR_TIMEOUT, "nccl: %d calls in flight and the oldest never "
                                "completed", _DDP_NCCL_INFLIGHT);
    }
    r = &s->rec[s->tail % _DDP_NCCL_INFLIGHT];
    pthread_mutex_unlock(&s->mu);
    e = s->api->EventRecord(r->event, s->stream);
    if (e != 0) {
        s->api->CudaLastError();
        return _ddp_nccl_raise(s, DDP_ERR_SYSTEM, "nccl: cudaEventRecord: %s", s->api->CudaErrorString(e));
    }
    s->unrecorded = 0;   /* this event comes after them */
    pthread_mutex_lock(&s->mu);
    r->call = *k;
    r->ncalls = ncalls;
    r->t0_us = _ddp_now_us();
    r->seq = ++s->last_seq;   /* under mu: tickets increase in record order */
    s->tail++;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return DDP_SUCCESS;
}

/* ---------------------------------------------------------------- vtable: setup */
_DDP_PRIVATE ddp_result_t _ddp_nccl_init(const ddp_transport_ctx_t *ctx, void **state) {
    _ddp_nccl_t *s = (_ddp_nccl_t *)ddp_transport_calloc(ctx, sizeof *s);
    const char *mode = getenv("DDP_NCCL");
    if (!s) return ddp_transport_fail(ctx, DDP_ERR_OUT_OF_MEMORY, "nccl: state");
    s->ctx = ctx;
    pthread_mutex_init(&s->comm_mu, NULL);
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    s->api = _ddp_nccl_load(s->declined, sizeof s->declined);
    if (mode && !strcmp(mode, "0")) snprintf(s->declined, sizeof s->declined, "DDP_NCCL=0");
    *state = s;
    return DDP_SUCCESS;
}

/* Never a host transport: device buffers only. */
_DDP_PRIVATE int _ddp_nccl_reachable(void *state, int peer) { (void)state; (void)peer; return 0; }

_DDP_PRIVATE int _ddp_nccl_local_rank(const ddp_transport_ctx_t *x) {
    int i, lr = 0;
    const char *me = x->host_id ? x->host_id(x->host, x->rank) : NULL;
    for (i = 0; me && i < x->rank; i++) {
        const char *h = x->host_id(x->host, i);
        if (h && !strcmp(h, me)) lr++;
    }
    return lr;
}

_DDP_PRIVATE ddp_result_t _ddp_nccl_probe(void *state, char *why, size_t cap) {
    _ddp_nccl_t *s = (_ddp_nccl_t *)state;
    _ddp_cerr_t e;
    long forced = -1;
    int env;
    if (s->api) {   /* also when NCCL is unusable: is_device needs to know */
        e = s->api->GetDeviceCount(&s->ndevices);
        if (e != 0) {
            s->api->CudaLastError();
            s->ndevices = 0;
            if (!s->declined[0])
                snprintf(s->declined, sizeof s->declined, "no usable CUDA device: cudaGetDeviceCount: %s "
                         "(CUDA error %d)", s->api->CudaErrorString(e), (int)e);
        } else if (s->ndevices < 1 && !s->declined[0]) {
            snprintf(s->declined, sizeof s->declined, "no CUDA device visible");
        }
    } else if (!s->declined[0]) {
        snprintf(s->declined, sizeof s->declined, "no CUDA runtime");
    }
    if (!s->declined[0]) {
        env = _ddp_env_int("DDP_CUDA_DEVICE", 0, 1 << 20, &forced);
        if (env < 0) {
            snprintf(s->declined, sizeof s->declined, "DDP_CUDA_DEVICE=%s is not a device number",
                     getenv("DDP_CUDA_DEVICE"));
        } else if (env > 0 && forced >= s->ndevices) {
            snprintf(s->declined, sizeof s->declined, "DDP_CUDA_DEVICE=%ld but only %d devices are "
                     "visible", forced, s->ndevices);
        } else {
            s->device_forced = env > 0;
            s->device = env > 0 ? (int)forced : _ddp_nccl_local_rank(s->ctx) % s->ndevices;
            if ((e = s->api->SetDevice(s->device)) != 0) {
                s->api->CudaLastError();
                snprintf(s->declined, sizeof s->declined, "cudaSetDevice(%d): %s", s->device,
                         s->api->CudaErrorString(e));
            }
        }
    }
    _ddp_strlcpy(why, s->declined, cap);
    return s->declined[0] ? DDP_ERR_UNSUPPORTED : DDP_SUCCESS;
}

/* NCCL's unique id: made and published by rank 0, looked up by the others (unless rank 0 said
 * its setup failed: it then never publishes one). */
_DDP_PRIVATE ddp_result_t _ddp_nccl_unique_id(_ddp_nccl_t *s, _ddp_nid_t *id) {
    const ddp_transport_ctx_t *x = s->ctx;
    int64_t deadline = _ddp_deadline(x->timeout_ms), next_note = 0;
    size_t len = 0;
    int nap = 1000;
    char note[1100];
    ddp_result_t r;
    _ddp_nres_t nr;
    memset(id, 0, sizeof *id);
    if (x->rank == 0) {
        if ((nr = s->api->GetUniqueId(id)) != 0)
            return _ddp_nccl_setup_fail(s, DDP_ERR_SYSTEM, "nccl: ncclGetUniqueId: %s", _ddp_nccl_err(s, nr));
        return x->publish(x->host, "nccl", id, sizeof *id);
    }
    while (!x->published(x->host, "nccl", 0)) {
        struct timespec ts;
        if (ddp_transport_aborted(x)) return DDP_ERR_ABORTED;
        if (_ddp_nccl_peer_setup_failed(s, &next_note, note, sizeof note))
            return _ddp_nccl_raise(s, DDP_ERR_REMOTE, "nccl: the NCCL setup failed on another "
                                  "rank: %s", note);
        if (deadline && _ddp_now_us() >= deadline) break;   /* the lookup says so */
        ts.tv_sec = 0;
        ts.tv_nsec = (long)nap * 1000;
        nanosleep(&ts, NULL);
        if (nap < 20000) nap *= 2;
    }
    if ((r = x->lookup(x->host, "nccl", 0, id, sizeof *id, &len)) != DDP_SUCCESS) return r;
    if (len != sizeof *id)
        return ddp_transport_fail(x, DDP_ERR_MISMATCH, "nccl: rank 0's unique id has %zu bytes, "
                                  "expected %zu", len, sizeof *id);
    return DDP_SUCCESS;
}

_DDP_PRIVATE ddp_result_t _ddp_nccl_setup(void *state, void *inherited) {
    _ddp_nccl_t *s = (_ddp_nccl_t *)state;
    const ddp_transport_ctx_t *x = s->ctx;
    _ddp_nconfig_t cfg;
    _ddp_nid_t id;
    _ddp_nres_t nr;
    ddp_result_t r;
    int i;
    if (s->declined[0] || !s->api)
        return ddp_transport_fail(x, DDP_ERR_UNSUPPORTED, "nccl: %s", s->declined);
    if (inherited) {
        s->comm = (_ddp_ncomm_t)inherited;
        if ((r = _ddp_nccl_settle(s, s->comm, _DDP_NCCL_IN_PROGRESS, "ncclCommSplit", 1)) != DDP_SUCCESS) {
            _ddp_nccl_abort_comm(s, "split did not complete");
            return r;
        }
    } else {
        if ((r = _ddp_nccl_unique_id(s, &id)) != DDP_SUCCESS) return r;
        _DDP_NCCL_CONFIG_INIT(cfg);
        cfg.blocking = 0;   /* so that init can be bounded (polled) and aborted */
        nr = s->api->CommInitRankConfig(&s->comm, x->nranks, id, x->rank, &cfg);
        if (nr != 0 && nr != _DDP_NCCL_IN_PROGRESS) {
            char last[340];
            _ddp_nccl_last(s, NULL, last, sizeof last);
            s->comm = NULL;
            return _ddp_nccl_setup_fail(s, nr == 6 ? DDP_ERR_REMOTE : DDP_ERR_SYSTEM, "nccl: "
                                        "ncclCommInitRankConfig (rank %d of %d, device %d): %s%s", x->rank,
                                        x->nranks, s->device, _ddp_nccl_err(s, nr), last);
        }
        if ((r = _ddp_nccl_settle(s, s->comm, nr, "ncclCommInitRankConfig", 1)) != DDP_SUCCESS) {
            _ddp_nccl_abort_comm(s, "init did not complete");
            return r;
        }
    }
    for (i = 0; i < _DDP_NCCL_INFLIGHT; i++) {
        _ddp_cerr_t e = s->api->EventCreateWithFlags(&s->rec[i].event, _DDP_CUDA_EVENT_NO_TIMING);
        if (e != 0) {
            s->api->CudaLastError();
            _ddp_nccl_abort_comm(s, "setup failed");
            return _ddp_nccl_setup_fail(s, DDP_ERR_SYSTEM, "nccl: cudaEventCreateWithFlags: %s",
                                        s->api->CudaErrorString(e));
        }
        s->events_made = i + 1;
    }
    if (pthread_create(&s->watchdog, NULL, _ddp_nccl_watchdog_main, s) != 0) {
        _ddp_nccl_abort_comm(s, "setup failed");
        return _ddp_nccl_setup_fail(s, DDP_ERR_SYSTEM, "nccl: watchdog thread: %s", strerror(errno));
    }
    s->watchdog_on = 1;
    _DDP_TLOG(x, DDP_LOG_INFO, "nccl: NCCL %d.%d.%d (%s), CUDA runtime %d (%s); device %d of %d "
              "(%s); %s; watchdog: %d ms per call (DDP_TIMEOUT_MS)", s->api->version / 10000,
              s->api->version / 100 % 100, s->api->version % 100, s->api->nccl_path,
              s->api->runtime_version, s->api->cudart_path, s->device, s->ndevices,
              s->device_forced ? "DDP_CUDA_DEVICE" : "local rank mod visible devices",
              inherited ? "communicator split from the parent's" : "communicator made through the store",
              x->timeout_ms);
    return DDP_SUCCESS;
}

/* ---------------------------------------------------------------- vtable: calls */
_DDP_PRIVATE int _ddp_nccl_is_device(void *state, const void *ptr) {
    _ddp_nccl_t *s = (_ddp_nccl_t *)state;
    _ddp_cattr_t a;
    unsigned i;
    int dev;
    if (!ptr || !s->api || s->ndevices < 1) return 0;
    for (i = 0; i < _DDP_NCCL_PTR_CACHE; i++)
        if (s->cache_ptr[i] == ptr) return s->cache_dev[i];
    memset(&a, 0, sizeof a);
    if (s->api->PointerGetAttributes(&a, ptr) != 0) { s->api->CudaLastError(); dev = 0; }
    else dev = a.type == _DDP_CUDA_MEM_DEVICE || a.type == _DDP_CUDA_MEM_MANAGED;
    i = s->cache_next++ % _DDP_NCCL_PTR_CACHE;
    s->cache_ptr[i] = ptr;
    s->cache_dev[i] = (unsigned char)dev;
    return dev;
}

_DDP_PRIVATE ddp_result_t _ddp_nccl_set_stream(void *state, void *stream) {
    _ddp_nccl_t *s = (_ddp_nccl_t *)state;
    s->stream = (_ddp_cstream_t)stream;
    _DDP_TLOG(s->ctx, DDP_LOG_INFO, "nccl: device calls now go on CUDA stream %p", stream);
    return DDP_SUCCESS;
}

/* One NCCL call for k, under comm_mu (so an abort from the watchdog cannot free the comm under
 * it). Gather/scatter/all-to-all are NCCL's own calls when it has them (>= 2.28), else grouped
 * send/recv. */
_DDP_PRIVATE _ddp_nres_t _ddp_nccl_issue(_ddp_nccl_t *s, const ddp_device_call_t *k) {
    const _ddp_nccl_api_t *a = s->api;
    _ddp_ncomm_t c = s->comm;
    _ddp_cstream_t st = s->stream;
    _ddp_ndtype_t dt = (_ddp_ndtype_t)k->dtype;   /* libddp's dtype and op values are NCCL's */
    _ddp_nop_t op = (_ddp_nop_t)k->op;
    const int n = s->ctx->nranks, me = s->ctx->rank;
    const size_t bytes = k->count * ddp_dtype_size(k->dtype);
    _ddp_nres_t r = _DDP_NRES(0), r2;
    int i;
    /* One rank: the average is the sum (its own values). NCCL 2.28.3's one-rank ncclAvg left the
     * last 7 of 2^20 + 7 elements wrong for fp16, bf16, fp32 and fp64 on an H200 (make
     * test-gpu); its one-rank sum is a copy. */
    if (n == 1 && k->op == DDP_AVG) op = (_ddp_nop_t)DDP_SUM;
    switch (k->kind) {
    case DDP_CALL_ALL_REDUCE: return a->AllReduce(k->send, k->recv, k->count, dt, op, c, st);
    case DDP_CALL_REDUCE_SCATTER: return a->ReduceScatter(k->send, k->recv, k->count, dt, op, c, st);
    case DDP_CALL_ALL_GATHER: return a->AllGather(k->send, k->recv, k->count, dt, c, st);
    case DDP_CALL_BROADCAST: return a->Broadcast(k->send, k->recv, k->count, dt, k->root, c, st);
    case DDP_CALL_REDUCE: return a->Reduce(k->send, k->recv, k->count, dt, op, k->root, c, st);
    case DDP_CALL_SEND: return a->Send(k->send, k->count, dt, k->root, c, st);
    case DDP_CALL_RECV: return a->Recv(k->recv, k->count, dt, k->root, c, st);
    case DDP_CALL_ALL_TO_ALL:
        if (a->AlltoAll) return a->AlltoAll(k->send, k->recv, k->count, dt, c, st);
        a->GroupStart();
        for (i = 0; i < n && r == 0; i++) {
            r = a->Send((const char *)k->send + (size_t)i * bytes, k->count, dt, i, c, st);
            if (r == 0) r = a->Recv((char *)k->recv + (size_t)i * bytes, k->count, dt, i, c, st);
        }
        r2 = a->GroupEnd();
        return r ? r : r2;
    case DDP_CALL_GATHER:
        if (a->Gather) return a->Gather(k->send, k->recv, k->count, dt, k->root, c, st);
        a->GroupStart();
        r = a->Send(k->send, k->count, dt, k->root, c, st);
        for (i = 0; me == k->root && i < n && r == 0; i++)
            r = a->Recv((char *)k->recv + (size_t)i * bytes, k->count, dt, i, c, st);
        r2 = a->GroupEnd();
        return r ? r : r2;
    case DDP_CALL_SCATTER:
        if (a->Scatter) return a->Scatter(k->send, k->recv, k->count, dt, k->root, c, st);
        a->GroupStart();
        for (i = 0; me == k->root && i < n && r == 0; i++)
            r = a->Send((const char *)k->send + (size_t)i * bytes, k->count, dt, i, c, st);
        if (r == 0) r = a->Recv(k->recv, k->count, dt, k->root, c, st);
        r2 = a->GroupEnd();
        return r ? r : r2;
    default:
        return _DDP_NRES(4);   /* ncclInvalidArgument */
    }
}

_DDP_PRIVATE ddp_result_t _ddp_nccl_enqueue(void *state, const ddp_device_call_t *k) {
    _ddp_nccl_t *s = (_ddp_nccl_t *)state;
    char what[200];
    _ddp_nres_t nr;
    _ddp_nccl_tgroup_t *tg = &_ddp_nccl_tg;
    ddp_result_t r = _ddp_nccl_check(s);
    if (r != DDP_SUCCESS) return r;
    if (tg->depth && _ddp_nccl_tg_find(s) < 0 && tg->n == _DDP_NCCL_GROUP_COMMS)
        return ddp_transport_fail(s->ctx, DDP_ERR_INVALID_USAGE, "nccl: calls on more than %d "
                                  "communicators in one group", _DDP_NCCL_GROUP_COMMS);
    if (s->api->SetDevice(s->device) != 0) s->api->CudaLastError();
    pthread_mutex_lock(&s->comm_mu);
    nr = s->comm_dead ? _DDP_NRES(5) : _ddp_nccl_issue(s, k);
    pthread_mutex_unlock(&s->comm_mu);
    if (nr != 0 && nr != _DDP_NCCL_IN_PROGRESS) {
        char last[340];
        if ((r = _ddp_nccl_check(s)) != DDP_SUCCESS) return r;
        _ddp_nccl_describe(k, 1, what, sizeof what);
        pthread_mutex_lock(&s->comm_mu);
        if (!s->comm_dead) _ddp_nccl_last(s, s->comm, last, sizeof last);
        else last[0] = 0;
        pthread_mutex_unlock(&s->comm_mu);
        r = _ddp_nccl_fail(s, nr == 4 ? DDP_ERR_INVALID_ARGUMENT : nr == 5 ? DDP_ERR_INVALID_USAGE
                           : nr == 6 ? DDP_ERR_REMOTE : DDP_ERR_SYSTEM, "nccl: %s: %s%s", what,
                           _ddp_nccl_err(s, nr), last);
        if (nr != 4 && nr != 5) {   /* NCCL itself failed (a peer, the network): as an async error */
            _ddp_nccl_abort_comm(s, "the call failed");
            _ddp_nccl_tell_peers(s);
        }
        return _ddp_nccl_check(s);
    }
    if (tg->depth) {   /* held by NCCL until the thread's outermost ncclGroupEnd: events then */
        if (_ddp_nccl_tg_find(s) < 0) tg->held[tg->n++] = s;
        s->group_n++;
        s->group_last = *k;
        return DDP_SUCCESS;
    }
    if (nr == _DDP_NCCL_IN_PROGRESS) {
        _ddp_nccl_describe(k, 1, what, sizeof what);
        if ((r = _ddp_nccl_settle(s, s->comm, nr, what, 0)) != DDP_SUCCESS) return r;
    }
    return _ddp_nccl_record(s, k, 1);
}

/* ncclGroupEnd with the communicators whose calls it issues locked (in address order, so two
 * threads cannot deadlock): the watchdog must not abort one of them meanwhile. */
_DDP_PRIVATE _ddp_nres_t _ddp_nccl_group_end_locked(_ddp_nccl_t *s, int outermost) {
    _ddp_nccl_t *lk[_DDP_NCCL_GROUP_COMMS + 1];
    int n = 0, i, j;
    _ddp_nres_t nr;
    lk[n++] = s;
    for (i = 0; outermost && i < _ddp_nccl_tg.n; i++)
        if (_ddp_nccl_tg.held[i] != s) lk[n++] = _ddp_nccl_tg.held[i];
    for (i = 1; i < n; i++)   /* insertion sort by address */
        for (j = i; j > 0 && (uintptr_t)lk[j] < (uintptr_t)lk[j - 1]; j--) {
            _ddp_nccl_t *t = lk[j]; lk[j] = lk[j - 1]; lk[j - 1] = t;
        }
    for (i = 0; i < n; i++) pthread_mutex_lock(&lk[i]->comm_mu);
    nr = s->api->GroupEnd();
    for (i = n - 1; i >= 0; i--) pthread_mutex_unlock(&lk[i]->comm_mu);
    return nr;
}

_DDP_PRIVATE ddp_result_t _ddp_nccl_group(void *state, int start) {
    _ddp_nccl_t *s = (_ddp_nccl_t *)state;
    _ddp_nccl_tgroup_t *tg = &_ddp_nccl_tg;
    _ddp_nccl_t *held[_DDP_NCCL_GROUP_COMMS];
    ddp_result_t r = _ddp_nccl_check(s), mine = DDP_SUCCESS;
    _ddp_nres_t nr;
    int nheld, i;
    if (start) {
        if (r != DDP_SUCCESS) return r;
        s->group_depth++;
        tg->depth++;
        s->api->GroupStart();
        return DDP_SUCCESS;
    }
    if (s->group_depth == 0 || tg->depth == 0) return DDP_ERR_INVALID_USAGE;
    /* NCCL's group ends whatever this communicator's state (the thread's depth must match) */
    s->group_depth--;
    nr = _ddp_nccl_group_end_locked(s, tg->depth == 1);
    if (--tg->depth > 0) return r;   /* inner: the calls stay held */
    nheld = tg->n;
    memcpy(held, tg->held, sizeof held[0] * (size_t)nheld);
    tg->n = 0;
    for (i = 0; i < nheld; i++) {
        _ddp_nccl_t *h = held[i];
        const int calls = h->group_n;
        ddp_result_t hr = _ddp_nccl_check(h);
        h->group_n = 0;
        if (hr == DDP_SUCCESS && nr != 0 && nr != _DDP_NCCL_IN_PROGRESS) {
            char last[340];
            pthread_mutex_lock(&h->comm_mu);
            if (!h->comm_dead) _ddp_nccl_last(h, h->comm, last, sizeof last);
            else last[0] = 0;
            pthread_mutex_unlock(&h->comm_mu);
            hr = _ddp_nccl_fail(h, nr == 6 ? DDP_ERR_REMOTE : DDP_ERR_SYSTEM, "nccl: ncclGroupEnd (a group "
                                "holding %d calls of this communicator): %s%s", calls, _ddp_nccl_err(h, nr), last);
        }
        if (hr == DDP_SUCCESS && nr == _DDP_NCCL_IN_PROGRESS)
            hr = _ddp_nccl_settle(h, h->comm, nr, "ncclGroupEnd", 0);
        if (hr == DDP_SUCCESS) hr = _ddp_nccl_record(h, &h->group_last, calls);
        if (h == s) mine = hr;
    }
    if (r != DDP_SUCCESS) return r;
    return mine != DDP_SUCCESS ? _ddp_nccl_check(s) : DDP_SUCCESS;
}

_DDP_PRIVATE int _ddp_nccl_in_group(void *state, int *held) {
    _ddp_nccl_t *s = (_ddp_nccl_t *)state;
    *held = _ddp_nccl_tg.depth && _ddp_nccl_tg_find(s) >= 0 ? s->group_n : 0;
    return _ddp_nccl_tg.depth;
}

_DDP_PRIVATE ddp_result_t _ddp_nccl_mark(void *state, uint64_t *ticket) {
    _ddp_nccl_t *s = (_ddp_nccl_t *)state;
    int held = 0;
    if (_ddp_nccl_in_group(s, &held) && held)   /* no event can follow them yet */
        return ddp_transport_fail(s->ctx, DDP_ERR_INVALID_USAGE, "nccl: %d call(s) of this "
                                  "communicator are held in a group still open on this thread", held);
    if (s->unrecorded) {   /* copies since the last event: a ticket must cover them too */
        ddp_device_call_t k;
        ddp_result_t r;
        memset(&k, 0, sizeof k);
        pthread_mutex_lock(&s->mu);
        k.seq = s->done_call;
        pthread_mutex_unlock(&s->mu);
        if ((r = _ddp_nccl_record(s, &k, 1)) != DDP_SUCCESS) return r;
        s->unrecorded = 0;
    }
    pthread_mutex_lock(&s->mu);
    *ticket = s->last_seq;
    pthread_mutex_unlock(&s->mu);
    return _ddp_nccl_check(s);
}

/* Done once the watchdog saw everything through ticket complete, or ticket's own event fired
 * (calls on different streams may finish out of order), and NCCL reports no asynchronous
 * error: a failed operation ends too (its kernel leaves, the stream moves on and the event
 * fires) with its output undefined, so a fired event alone proves nothing. */
_DDP_PRIVATE ddp_result_t _ddp_nccl_query(void *state, uint64_t ticket, int *done) {
    _ddp_nccl_t *s = (_ddp_nccl_t *)state;
    uint64_t p;
    _ddp_cevent_t ev = NULL;
    ddp_device_call_t k;
    int ncalls = 1;
    _ddp_nres_t async;
    ddp_result_t r = _ddp_nccl_check(s);
    *done = 0;
    if (r != DDP_SUCCESS) return r;
    memset(&k, 0, sizeof k);
    pthread_mutex_lock(&s->mu);
    if (ticket <= s->done_through) *done = 1;
    for (p = s->head; !*done && p < s->tail; p++)
        if (s->rec[p % _DDP_NCCL_INFLIGHT].seq == ticket) {
            ev = s->rec[p % _DDP_NCCL_INFLIGHT].event;
            k = s->rec[p % _DDP_NCCL_INFLIGHT].call;
            ncalls = s->rec[p % _DDP_NCCL_INFLIGHT].ncalls;
        }
    if (!*done && !ev) *done = 1;   /* no longer in flight: the watchdog completed it */
    pthread_mutex_unlock(&s->mu);
    if (ev) {
        _ddp_cerr_t q = s->api->EventQuery(ev);
        if (q == 0) *done = 1;
        else if (q != _DDP_CUDA_NOT_READY) s->api->CudaLastError();
    }
    if (*done && (async = _ddp_nccl_async(s)) != 0) {
        *done = 0;
        _ddp_nccl_async_failed(s, NULL, ev ? &k : NULL, ncalls, async);
    }
    return _ddp_nccl_check(s);
}

_DDP_PRIVATE ddp_result_t _ddp_nccl_wait(void *state, uint64_t ticket) {
    _ddp_nccl_t *s = (_ddp_nccl_t *)state;
    /* The watchdog fails the call at the timeout; this bound only guards the watchdog. */
    int64_t deadline = _ddp_deadline(s->ctx->timeout_ms < 0 ? -1 : s->ctx->timeout_ms + 5000);
    int64_t t0 = _ddp_now_us(), waited;
    int nap = 20, done = 0;
    for (;;) {
        struct timespec ts;
        ddp_result_t r = _ddp_nccl_query(state, ticket, &done);
        if (r != DDP_SUCCESS || done) return r;
        waited = _ddp_now_us() - t0;
        if (waited < s->ctx->spin_us) { sched_yield(); continue; }   /* DDP_SPIN_US: ask again */
        if (deadline && _ddp_now_us() > deadline)
            return _ddp_nccl_raise(s, DDP_ERR_TIMEOUT, "nccl: call #%llu not complete after %d ms "
                                  "(the watchdog did not see it end)", (unsigned long long)ticket,
                                  s->ctx->timeout_ms + 5000);
        /* The host learns of completion only by asking: after DDP_SPIN_US of polling, naps of
         * 20 us for the first millisecond (a call of tens of microseconds is seen within a few
         * of its end: an H200 at p = 1 ran 1 MiB all-reduces in 11 us), then doubling to 250 us
         * until 20 ms, then to 2 ms (a long wait must not cost a core). */
        ts.tv_sec = 0;
        ts.tv_nsec = (long)nap * 1000;
        nanosleep(&ts, NULL);
        if (waited > 1000 && nap < (waited < 20000 ? 250 : 2000)) nap *= 2;
    }
}

_DDP_PRIVATE ddp_result_t _ddp_nccl_async_error(void *state) {
    _ddp_nccl_t *s = (_ddp_nccl_t *)state;
    return (ddp_result_t)__atomic_load_n(&s->error, __ATOMIC_SEQ_CST);
}

_DDP_PRIVATE ddp_result_t _ddp_nccl_split(void *state, int color, int key, void **inherited) {
    _ddp_nccl_t *s = (_ddp_nccl_t *)state;
    _ddp_nconfig_t cfg;
    _ddp_ncomm_t child = NULL;
    _ddp_nres_t nr;
    ddp_result_t r = _ddp_nccl_check(s);
    *inherited = NULL;
    if (r != DDP_SUCCESS) return r;
    _DDP_NCCL_CONFIG_INIT(cfg);
    cfg.blocking = 0;
    pthread_mutex_lock(&s->comm_mu);
    nr = s->comm_dead ? _DDP_NRES(5) : s->api->CommSplit(s->comm, color < 0 ? _DDP_NCCL_SPLIT_NOCOLOR : color, key,
                                               &child, &cfg);
    pthread_mutex_unlock(&s->comm_mu);
    if (nr != 0 && nr != _DDP_NCCL_IN_PROGRESS)
        return _ddp_nccl_raise(s, DDP_ERR_SYSTEM, "nccl: ncclCommSplit (color %d key %d): %s", color,
                              key, _ddp_nccl_err(s, nr));
    /* The parent settles first (the split is a collective over it); the child in its setup. */
    if (nr == _DDP_NCCL_IN_PROGRESS && !child &&
        (r = _ddp_nccl_settle(s, s->comm, nr, "ncclCommSplit", 0)) != DDP_SUCCESS) return r;
    *inherited = child;
    return DDP_SUCCESS;
}

_DDP_PRIVATE void _ddp_nccl_release_inherited(void *state, void *inherited) {
    _ddp_nccl_t *s = (_ddp_nccl_t *)state;
    if (inherited && s->api) _ddp_nccl_abort_bounded(s, (_ddp_ncomm_t)inherited);
}

_DDP_PRIVATE ddp_result_t _ddp_nccl_cuda(_ddp_nccl_t *s, _ddp_cerr_t e, const char *what) {
    if (e == 0) return DDP_SUCCESS;
    s->api->CudaLastError();
    return ddp_transport_fail(s->ctx, e == 2 ? DDP_ERR_OUT_OF_MEMORY : DDP_ERR_SYSTEM, "nccl: %s: %s",
                              what, s->api->CudaErrorString(e));
}

_DDP_PRIVATE ddp_result_t _ddp_nccl_mem_alloc(void *state, size_t bytes, void **ptr) {
    _ddp_nccl_t *s = (_ddp_nccl_t *)state;
    if (s->api->SetDevice(s->device) != 0) s->api->CudaLastError();
    return _ddp_nccl_cuda(s, s->api->Malloc(ptr, bytes ? bytes : 1), "cudaMalloc");
}
_DDP_PRIVATE ddp_result_t _ddp_nccl_mem_free(void *state, void *ptr) {
    _ddp_nccl_t *s = (_ddp_nccl_t *)state;
    unsigned i;
    for (i = 0; i < _DDP_NCCL_PTR_CACHE; i++) if (s->cache_ptr[i] == ptr) s->cache_ptr[i] = NULL;
    return ptr ? _ddp_nccl_cuda(s, s->api->Free(ptr), "cudaFree") : DDP_SUCCESS;
}
_DDP_PRIVATE ddp_result_t _ddp_nccl_copy(void *state, void *dst, const void *src, size_t bytes) {
    _ddp_nccl_t *s = (_ddp_nccl_t *)state;
    if (!bytes) return DDP_SUCCESS;
    s->unrecorded = 1;
    return _ddp_nccl_cuda(s, s->api->MemcpyAsync(dst, src, bytes, (_ddp_ckind_t)_DDP_CUDA_COPY_DEFAULT, s->stream),
                          "cudaMemcpyAsync");
}
_DDP_PRIVATE ddp_result_t _ddp_nccl_fill_zero(void *state, void *dst, size_t bytes) {
    _ddp_nccl_t *s = (_ddp_nccl_t *)state;
    if (!bytes) return DDP_SUCCESS;
    s->unrecorded = 1;
    return _ddp_nccl_cuda(s, s->api->MemsetAsync(dst, 0, bytes, s->stream), "cudaMemsetAsync");
}

/* ---------------------------------------------------------------- vtable: teardown */
_DDP_PRIVATE void _ddp_nccl_abort(void *state) {
    _ddp_nccl_t *s = (_ddp_nccl_t *)state;
    if (!s->comm) return;
    _ddp_nccl_fail(s, DDP_ERR_ABORTED, "nccl: ddp_comm_abort: NCCL communicator aborted");
    _ddp_nccl_abort_comm(s, "ddp_comm_abort");
}

_DDP_PRIVATE ddp_result_t _ddp_nccl_finalize(void *state) {
    _ddp_nccl_t *s = (_ddp_nccl_t *)state;
    const ddp_transport_ctx_t *ctx = s->ctx;
    int i;
    int alive;
    /* A fork child: the device context and the watchdog thread are the parent's (CUDA is not
     * usable after fork); leave everything to the child's exit. */
    if (ddp_transport_forked(ctx)) return DDP_SUCCESS;
    if ((i = _ddp_nccl_tg_find(s)) >= 0) {   /* destroyed inside an open group: forget it */
        _ddp_nccl_tg.held[i] = _ddp_nccl_tg.held[--_ddp_nccl_tg.n];
        s->group_n = 0;
    }
    pthread_mutex_lock(&s->comm_mu);
    alive = s->comm && !s->comm_dead;
    pthread_mutex_unlock(&s->comm_mu);
    if (alive) {
        /* What is still in flight completes first (bounded), then a clean finalize; anything
         * wrong, and the communicator is aborted instead. */
        uint64_t last = 0;
        ddp_result_t r = _ddp_nccl_mark(s, &last);
        if (r == DDP_SUCCESS && last) r = _ddp_nccl_wait(s, last);
        if (r == DDP_SUCCESS) {
            _ddp_nres_t nr;
            pthread_mutex_lock(&s->comm_mu);
            nr = s->api->CommFinalize(s->comm);
            pthread_mutex_unlock(&s->comm_mu);
            r = _ddp_nccl_settle(s, s->comm, nr, "ncclCommFinalize", 0);
        }
        pthread_mutex_lock(&s->comm_mu);
        if (!s->comm_dead) {
            if (r == DDP_SUCCESS) s->api->CommDestroy(s->comm);
            else _ddp_nccl_abort_bounded(s, s->comm);
            s->comm_dead = 1;
        }
        pthread_mutex_unlock(&s->comm_mu);
    }
    if (s->watchdog_on) {
        pthread_mutex_lock(&s->mu);
        s->stop = 1;
        pthread_cond_broadcast(&s->cv);
        pthread_mutex_unlock(&s->mu);
        pthread_join(s->watchdog, NULL);
    }
    for (i = 0; i < s->events_made; i++) s->api->EventDestroy(s->rec[i].event);
    pthread_mutex_destroy(&s->comm_mu);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    ddp_transport_free(ctx, s);
    return DDP_SUCCESS;
}

/* The point-to-point entries are never called (reachable says no peer). */
_DDP_PRIVATE ddp_result_t _ddp_nccl_no_connect(void *state, int peer, void **conn) {
    (void)state; (void)peer; *conn = NULL; return DDP_ERR_UNSUPPORTED;
}
_DDP_PRIVATE ddp_result_t _ddp_nccl_no_isend(void *conn, const void *buf, size_t len, uint64_t tag,
                                             void *mr, void **req) {
    (void)conn; (void)buf; (void)len; (void)tag; (void)mr; *req = NULL; return DDP_ERR_UNSUPPORTED;
}
_DDP_PRIVATE ddp_result_t _ddp_nccl_no_irecv(void *conn, void *buf, size_t len, uint64_t tag,
                                             void *mr, void **req) {
    (void)conn; (void)buf; (void)len; (void)tag; (void)mr; *req = NULL; return DDP_ERR_UNSUPPORTED;
}
_DDP_PRIVATE ddp_result_t _ddp_nccl_no_test(void *req, int *done) { (void)req; *done = 0; return DDP_ERR_UNSUPPORTED; }
_DDP_PRIVATE ddp_result_t _ddp_nccl_no_wait(void *state, void *const *conns, int n, int ms) {
    (void)state; (void)conns; (void)n; (void)ms; return DDP_ERR_UNSUPPORTED;
}
_DDP_PRIVATE ddp_result_t _ddp_nccl_no_close(void *conn) { (void)conn; return DDP_SUCCESS; }

static const ddp_device_provider_t _ddp_nccl_device = {
    _ddp_nccl_probe, _ddp_nccl_setup, _ddp_nccl_is_device, _ddp_nccl_set_stream, _ddp_nccl_enqueue,
    _ddp_nccl_group, _ddp_nccl_in_group, _ddp_nccl_mark, _ddp_nccl_query, _ddp_nccl_wait, _ddp_nccl_async_error,
    _ddp_nccl_split, _ddp_nccl_release_inherited, _ddp_nccl_mem_alloc, _ddp_nccl_mem_free,
    _ddp_nccl_copy, _ddp_nccl_fill_zero,
};

static const ddp_transport_t _ddp_nccl_transport = {
    DDP_TRANSPORT_VERSION, "nccl", 40,
    _ddp_nccl_init, _ddp_nccl_reachable, _ddp_nccl_no_connect, _ddp_nccl_no_connect,
    NULL, NULL, _ddp_nccl_no_isend, _ddp_nccl_no_irecv, _ddp_nccl_no_test, _ddp_nccl_no_wait,
    _ddp_nccl_no_close, _ddp_nccl_finalize, _ddp_nccl_abort, NULL, &_ddp_nccl_device,
};

DDP_API const ddp_transport_t *ddp_transport_nccl(void) { return &_ddp_nccl_transport; }

_DDP_TRANSPORT_CONSTRUCTOR(_ddp_nccl_register) { ddp_transport_register(&_ddp_nccl_transport); }

#endif /* DDP_NCCL implementation */
