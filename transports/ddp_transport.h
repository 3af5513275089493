/* SPDX-License-Identifier: MIT (see LICENSE) */
/* transports/ddp_transport.h — the transport interface, for transport authors.
 *
 * A transport moves tagged byte messages between two ranks over a bidirectional connection
 * (Gloo's "pair"), with non-blocking connect/accept and isend/irecv/test as NCCL's net plugin.
 * Messages on one connection and direction complete in posting order; a posted irecv must
 * match the next message's tag and length exactly (else DDP_ERR_MISMATCH), which is how ranks
 * calling different collectives or counts are caught instead of corrupting data. Registered
 * memory (reg_mr) lets RDMA transports write straight into user buffers; a transport that runs
 * whole collectives itself (shared memory, NCCL) fills `coll`.
 *
 * A transport sees its communicator only through the ddp_transport_ctx_t given to init (as
 * NCCL's net plugin sees only its init arguments): rank, size, timeouts, spin policy, an
 * abort flag, and callbacks to publish and look up addresses, log and record failures. It
 * never includes ddp.h and never reads the communicator. Including a transport header
 * registers it (a constructor calls ddp_transport_register); the communicator picks, per
 * peer, the highest-priority registered transport that reaches it.
 *
 * This header also holds what every transport needs the same way (the shared plumbing):
 * the registry, the context helpers, the request and connection heads with the isend, irecv
 * and test that serve every queued transport, and spin-then-block waiting.
 * Depends on ddp_base.h. Built by DDP_IMPLEMENTATION (or DDP_TRANSPORT_IMPLEMENTATION).
 */
#if defined(DDP_IMPLEMENTATION) && !defined(DDP_TRANSPORT_IMPLEMENTATION)
#define DDP_TRANSPORT_IMPLEMENTATION
#endif
#if defined(DDP_TRANSPORT_IMPLEMENTATION)
#ifndef DDP_BASE_IMPLEMENTATION
#define DDP_BASE_IMPLEMENTATION
#endif
#endif
#include "../ddp_base.h"

#ifndef DDP_TRANSPORT_H_INCLUDED
#define DDP_TRANSPORT_H_INCLUDED

#ifdef __cplusplus
extern "C" {
#endif

#define DDP_TRANSPORT_VERSION 5

/* What a transport knows of its communicator. Filled by the communicator before init and valid
 * (same address) until finalize; transports keep the pointer. */
typedef struct ddp_transport_ctx {
    int rank, nranks;
    int timeout_ms;               /* every blocking wait; < 0 = forever */
    int spin_us;                  /* poll this long before sleeping in the kernel; <= 0: never */
    int log_level;                /* a ddp_log_level_t: ddp_transport_log drops finer lines */
    uint64_t comm_id;             /* random per communicator, the same on every rank */
    const char *ifname;           /* DDP_SOCKET_IFNAME syntax, or NULL */
    const char *master_addr;      /* the rendezvous host: the route to it picks an interface */
    const ddp_allocator_t *allocator;   /* NULL: DDP_MALLOC/DDP_FREE */
    const int *abort_flag;        /* read it with ddp_transport_aborted (atomically) */
    int *waiting_on;              /* a wait that times out stores the peer it waited for here,
                                   * so the communicator can find which rank is stuck; a broken
                                   * connection its peer (_ddp_transport_blame) */
    /* The per-communicator key every data connection proves knowledge of, both ways, by
     * challenge-response (ddp_auth.h: _ddp_auth_proof); never sent. Filled once the rendezvous
     * is done, before any connect/accept. */
    const unsigned char *auth_key;
    size_t auth_key_len;
    /* 1: auth_key is bound to the job secret; 0: the job has none, so anyone who can read the
     * rendezvous store can derive it (a listener on a network address should say so). Filled
     * before init. */
    int key_from_secret;
    void *host;                   /* opaque: handed back to the callbacks below */
    /* The host identity of a rank (hostname + boot id + network namespace, or DDP_HOST_ID). */
    const char *(*host_id)(void *host, int peer);
    /* This rank's address for `name` (the transport's name, or name.suffix for more keys),
     * and a peer's: lookup waits until the peer published it (or the timeout); published
     * answers at once whether it has. */
    ddp_result_t (*publish)(void *host, const char *name, const void *addr, size_t len);
    ddp_result_t (*lookup)(void *host, const char *name, int peer, void *addr, size_t cap,
                           size_t *len);
    int (*published)(void *host, const char *name, int peer);
    void (*log)(void *host, ddp_log_level_t level, const char *msg);
    /* Records msg as the communicator's last error (the user's ddp_comm_last_error) and
     * returns r; last_error reads it back. */
    ddp_result_t (*fail)(void *host, ddp_result_t r, const char *msg);
    const char *(*last_error)(void *host);
    /* A note every rank of the communicator can read at once under `name` (one per name; the
     * first post wins, later ones change nothing): how a failure only this rank saw reaches the
     * others without a timeout. "abort" is the communicator's failure board (the first failure,
     * which every rank's error then names); "nccl.setup" says a device setup failed. posted
     * copies the note (NUL-terminated) and returns 1, or returns 0 when there is none. Both
     * may be called from a transport's own threads. */
    ddp_result_t (*post)(void *host, const char *name, const char *msg);
    int (*posted)(void *host, const char *name, char *msg, size_t cap);
    /* Nonzero (read it with ddp_transport_forked) while a fork child destroys its copy of the
     * communicator: close and finalize then release this process's descriptors, mappings and
     * memory only. The parent still uses the same sockets, shared memory and device or verbs
     * contexts: no messages, no shutdown(), no writes to shared memory, no calls into a
     * device or verbs library, no joins (the threads stayed in the parent). */
    const int *forked;
    /* The CPUs this host's ranks of the communicator may use together (the union of their
     * affinity masks), filled at the rendezvous; 0 until then or if unknown. */
    int host_cpus;
    /* The collectives this communicator issued, the running one included (the number a log
     * line gives a call: "all_reduce #12"); NULL where the host does not count them. */
    const uint32_t *calls;
    /* A wait that lasts past its spin may store the peer it waits on here (a relaxed atomic
     * store, at most once a millisecond), for the communicator's health thread; NULL: nobody
     * asks. */
    int *live_peer;
} ddp_transport_ctx_t;

static inline void _ddp_transport_waits_on(const ddp_transport_ctx_t *ctx, int peer) {
    if (ctx->live_peer) __atomic_store_n(ctx->live_peer, peer, __ATOMIC_RELAXED);
}

typedef struct ddp_coll_provider {
    ddp_result_t (*all_reduce)(void *state, const void *sendbuf, void *recvbuf, size_t count,
                               ddp_dtype_t dtype, ddp_op_t op);
    ddp_result_t (*reduce_scatter)(void *state, const void *sendbuf, void *recvbuf,
                                   size_t recvcount, ddp_dtype_t dtype, ddp_op_t op);
    ddp_result_t (*all_gather)(void *state, const void *sendbuf, void *recvbuf, size_t sendcount,
                               ddp_dtype_t dtype);
    ddp_result_t (*broadcast)(void *state, const void *sendbuf, void *recvbuf, size_t count,
                              ddp_dtype_t dtype, int root);
    ddp_result_t (*barrier)(void *state);
    /* Called once every peer is connected through this transport (and only then), or once join
     * (below) succeeded: DDP_SUCCESS to take over the collectives, anything else to leave them
     * to the ring. */
    ddp_result_t (*enable)(void *state);
    /* May be NULL. Called on every rank at the same point of init instead of connecting every
     * peer first, bounded by ctx->timeout_ms: the transport makes what its collectives need by
     * itself (shared memory: one region per host, one handshake per rank with the host's
     * lowest rank). DDP_SUCCESS: enable follows; DDP_ERR_UNSUPPORTED: the ring runs the
     * collectives, over connections made when used; anything else fails init. */
    ddp_result_t (*join)(void *state);
    /* Registered memory (optional, all four or none; NULL: every buffer is staged). Collective:
     * every rank calls them in the same order with the same bytes (ddp_window.h runs the
     * agreements between the steps). win_create makes this rank's part (memory its peers can
     * map) and publishes it; win_map, once every rank created, maps the peers' parts (a failure
     * is not fatal: DDP_ERR_UNSUPPORTED and the reason in why); win_use, after every rank said
     * whether it mapped, makes the collectives read the window directly (every = 1) or never
     * (0: the memory still works, staged); win_destroy releases this rank's part (after every
     * rank's last collective on it returned). */
    ddp_result_t (*win_create)(void *state, size_t bytes, void **ptr, void **win);
    ddp_result_t (*win_map)(void *state, void *win, char *why, size_t cap);
    void (*win_use)(void *state, void *win, int every);
    void (*win_destroy)(void *state, void *win);
} ddp_coll_provider_t;

/* ---- device (GPU) collectives
 * A transport that runs collectives on device buffers itself, enqueued on a stream (NCCL),
 * fills `device`. The communicator sends every call whose buffers are device memory here (host
 * buffers keep the host transports), after the setup below succeeded on every rank. Calls
 * return once enqueued (NCCL semantics): results are there when the stream gets to them. The
 * provider keeps its own watchdog (every wait bounded by ctx->timeout_ms, aborts on timeout or
 * on an asynchronous error) since the device library has no timeouts of its own. */
typedef struct ddp_device_call {
    ddp_call_kind_t kind;         /* ddp_base.h: the one numbering, values fixed by this ABI */
    const void *send;
    void *recv;
    size_t count;                 /* per rank where the host call says so (NCCL's counts) */
    ddp_dtype_t dtype;
    ddp_op_t op;
    int root;                     /* the root, or the peer of a send/recv */
    uint64_t seq;                 /* the communicator's device call number, from 1 */
} ddp_device_call_t;

typedef struct ddp_device_provider {
    /* Local and cheap: can this rank run device collectives? DDP_SUCCESS, or a one-line
     * reason in why (no library, too old, no device). Every rank must say yes: the
     * communicator agrees before anyone calls setup. */
    ddp_result_t (*probe)(void *state, char *why, size_t cap);
    /* Collective, bounded by ctx->timeout_ms: make the device communicator, or adopt
     * `inherited` (what split returned on the parent). */
    ddp_result_t (*setup)(void *state, void *inherited);
    /* 1 when ptr is device memory this provider can use, else 0. */
    int (*is_device)(void *state, const void *ptr);
    ddp_result_t (*set_stream)(void *state, void *stream);    /* NULL: the default stream */
    ddp_result_t (*enqueue)(void *state, const ddp_device_call_t *call);
    ddp_result_t (*group)(void *state, int start);            /* 1: start, 0: end */
    /* NCCL's groups belong to the calling thread, whatever communicator opened them: how deep
     * the calling thread's group is (0: none open), and in *held how many calls of this
     * communicator it holds (they run, and can be waited for, only at the outermost end). */
    int (*in_group)(void *state, int *held);
    /* A ticket for all the work enqueued so far; query/wait it (waits are bounded). */
    ddp_result_t (*mark)(void *state, uint64_t *ticket);
    ddp_result_t (*query)(void *state, uint64_t ticket, int *done);
    ddp_result_t (*wait)(void *state, uint64_t ticket);
    ddp_result_t (*async_error)(void *state);                 /* the sticky failure, if any */
    /* Collective over this communicator (every rank calls it, in the same order): the device
     * communicator of a split, NULL for DDP_SPLIT_NOCOLOR; handed to the child's setup. */
    ddp_result_t (*split)(void *state, int color, int key, void **inherited);
    void (*release_inherited)(void *state, void *inherited);  /* a child that never set up */
    /* Device memory and stream-ordered copies/fills, for the reducer's buckets. */
    ddp_result_t (*mem_alloc)(void *state, size_t bytes, void **ptr);
    ddp_result_t (*mem_free)(void *state, void *ptr);
    ddp_result_t (*copy)(void *state, void *dst, const void *src, size_t bytes);
    ddp_result_t (*fill_zero)(void *state, void *dst, size_t bytes);
} ddp_device_provider_t;

typedef struct ddp_transport {
    int version;                  /* DDP_TRANSPORT_VERSION */
    const char *name;             /* "tcp", "shm", "ibverbs", "threads", "nccl" */
    int priority;                 /* "auto" picks the highest that reaches a peer */
    /* Per communicator: open listeners and publish this rank's address (ctx->publish). */
    ddp_result_t (*init)(const ddp_transport_ctx_t *ctx, void **state);
    /* After every rank has published: 1 if this transport can reach peer. */
    int (*reachable)(void *state, int peer);
    /* Non-blocking: return DDP_SUCCESS with *conn == NULL to be called again. The rank with the
     * lower number connects, the other accepts; the transport checks the peer's identity. */
    ddp_result_t (*connect)(void *state, int peer, void **conn);
    ddp_result_t (*accept)(void *state, int peer, void **conn);
    ddp_result_t (*reg_mr)(void *state, void *buf, size_t len, void **mr);   /* may be NULL */
    ddp_result_t (*dereg_mr)(void *state, void *mr);
    ddp_result_t (*isend)(void *conn, const void *buf, size_t len, uint64_t tag, void *mr,
                          void **req);
    ddp_result_t (*irecv)(void *conn, void *buf, size_t len, uint64_t tag, void *mr, void **req);
    /* Advances the connection; *done = 1 once req completed (req is then released). */
    ddp_result_t (*test)(void *req, int *done);
    /* Sleeps until one of conns may progress or timeout_ms passes (the blocking half of
     * spin-then-block). */
    ddp_result_t (*wait)(void *state, void *const *conns, int nconns, int timeout_ms);
    ddp_result_t (*close)(void *conn);   /* also used after errors: wakes the peer with EOF */
    ddp_result_t (*finalize)(void *state);
    /* May be NULL. Called from any thread after *ctx->abort_flag was set: wake whatever this
     * transport sleeps on, so a blocked call sees the flag now rather than at its next poll. */
    void (*abort)(void *state);
    const ddp_coll_provider_t *coll;     /* NULL: point-to-point only */
    const ddp_device_provider_t *device; /* NULL: host buffers only */
} ddp_transport_t;

DDP_API ddp_result_t ddp_transport_register(const ddp_transport_t *transport);
DDP_API const ddp_transport_t *ddp_transport_find(const char *name);

/* Context helpers for transports: printf-style failure (recorded, logged at WARN, returns r)
 * and log lines (dropped above ctx->log_level), the communicator's allocator, the abort flag. */
DDP_API ddp_result_t ddp_transport_fail(const ddp_transport_ctx_t *ctx, ddp_result_t r,
                                        const char *fmt, ...)
#if defined(__GNUC__) || defined(__clang__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
DDP_API void ddp_transport_log(const ddp_transport_ctx_t *ctx, ddp_log_level_t level,
                               const char *fmt, ...)
#if defined(__GNUC__) || defined(__clang__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
DDP_API void *ddp_transport_calloc(const ddp_transport_ctx_t *ctx, size_t size);
DDP_API void ddp_transport_free(const ddp_transport_ctx_t *ctx, void *ptr);
DDP_API int ddp_transport_aborted(const ddp_transport_ctx_t *ctx);
DDP_API int ddp_transport_forked(const ddp_transport_ctx_t *ctx);

#ifdef __cplusplus
}
#endif
#endif /* DDP_TRANSPORT_H_INCLUDED */

/* ============================================================================================
 * IMPLEMENTATION
 * ========================================================================================== */
#if defined(DDP_TRANSPORT_IMPLEMENTATION) && !defined(DDP_TRANSPORT_IMPL_INCLUDED)
#define DDP_TRANSPORT_IMPL_INCLUDED
#ifndef DDP_BASE_IMPL_INCLUDED
#error "libddp: ddp_transport.h's implementation needs ddp_base.h's (define DDP_IMPLEMENTATION)"
#endif
/* The handshake plumbing below proves keys with ddp_auth.h (below this layer, private). */
#ifndef DDP_AUTH_IMPLEMENTATION
#define DDP_AUTH_IMPLEMENTATION
#endif
#include "../ddp_auth.h"

#define _DDP_MAX_TRANSPORTS 8
/* Log only what the context's level lets through, without formatting the rest. */
#define _DDP_TLOG(ctx, lvl, ...) \
    do { if ((ctx)->log_level >= (lvl)) ddp_transport_log((ctx), (lvl), __VA_ARGS__); } while (0)

/* ---------------------------------------------------------------- transport registry
 * Filled by constructors of the transport headers before main(), read-only afterwards: the
 * one process-wide table, because "including a header compiles a transport in". */
static const ddp_transport_t *_ddp_transports[_DDP_MAX_TRANSPORTS];
static int _ddp_ntransports;

DDP_API ddp_result_t ddp_transport_register(const ddp_transport_t *t) {
    int i;
    if (!t || !t->name || t->version != DDP_TRANSPORT_VERSION) return DDP_ERR_INVALID_ARGUMENT;
    for (i = 0; i < _ddp_ntransports; i++)
        if (_ddp_transports[i] == t || !strcmp(_ddp_transports[i]->name, t->name)) return DDP_SUCCESS;
    if (_ddp_ntransports == _DDP_MAX_TRANSPORTS) return DDP_ERR_OUT_OF_MEMORY;
    _ddp_transports[_ddp_ntransports++] = t;
    return DDP_SUCCESS;
}

DDP_API const ddp_transport_t *ddp_transport_find(const char *name) {
    int i;
    for (i = 0; name && i < _ddp_ntransports; i++)
        if (!strcmp(_ddp_transports[i]->name, name)) return _ddp_transports[i];
    return NULL;
}

DDP_API ddp_result_t ddp_transport_fail(const ddp_transport_ctx_t *ctx, ddp_result_t r,
                                        const char *fmt, ...) {
    char msg[768];
    va_list ap;
    if (!ctx || !ctx->fail) return r;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return ctx->fail(ctx->host, r, msg);
}

DDP_API void ddp_transport_log(const ddp_transport_ctx_t *ctx, ddp_log_level_t level,
                               const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    if (!ctx || !ctx->log || level == DDP_LOG_NONE || ctx->log_level < (int)level) return;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    ctx->log(ctx->host, level, msg);
}

DDP_API void *ddp_transport_calloc(const ddp_transport_ctx_t *ctx, size_t size) {
    return _ddp_calloc(ctx ? ctx->allocator : NULL, size);
}
DDP_API void ddp_transport_free(const ddp_transport_ctx_t *ctx, void *ptr) {
    _ddp_free(ctx ? ctx->allocator : NULL, ptr);
}
DDP_API int ddp_transport_aborted(const ddp_transport_ctx_t *ctx) {
    return ctx && ctx->abort_flag && __atomic_load_n(ctx->abort_flag, __ATOMIC_SEQ_CST);
}
DDP_API int ddp_transport_forked(const ddp_transport_ctx_t *ctx) {
    return ctx && ctx->forked && *ctx->forked;
}

/* ============================================================================================
 * Shared plumbing: private helpers that the transports in this folder need the same way, kept
 * here once so that a fix (a lost wake-up, a miscounted pool) is made once. Private (_ddp_,
 * static): not part of the transport interface, and a transport of another library need not
 * use them. Hot-path ones are static inline: a transport pays no call for them.
 * ========================================================================================== */
#if defined(__linux__)
#include <linux/futex.h>
#include <sys/syscall.h>
#endif

/* "Including a header registers the transport": a constructor runs before main(). Usage:
 *     _DDP_TRANSPORT_CONSTRUCTOR(_ddp_x_register) { ddp_transport_register(&_ddp_x_transport); } */
#if defined(__GNUC__) || defined(__clang__)
#define _DDP_TRANSPORT_CONSTRUCTOR(fn) __attribute__((constructor)) static void fn(void)
#else
#error "libddp: transports register themselves with a constructor (GCC/Clang)"
#endif

/* ---------------------------------------------------------------- failures
 * A connection's sticky failure: the first one is recorded (ddp_transport_fail) and kept in
 * *err, which every later call on the connection returns; later ones change nothing, so the
 * user reads what broke first, not its echoes. */
_DDP_PRIVATE ddp_result_t _ddp_transport_conn_fail(const ddp_transport_ctx_t *ctx, ddp_result_t *err,
                                                   ddp_result_t r, const char *fmt, ...)
#if defined(__GNUC__) || defined(__clang__)
    __attribute__((format(printf, 4, 5)))
#endif
    ;
_DDP_PRIVATE ddp_result_t _ddp_transport_conn_fail(const ddp_transport_ctx_t *ctx, ddp_result_t *err,
                                                   ddp_result_t r, const char *fmt, ...) {
    char msg[768];
    va_list ap;
    if (*err != DDP_SUCCESS) return *err;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    *err = r;
    return ddp_transport_fail(ctx, r, "%s", msg);
}

/* A connection to `peer` broke (closed, reset, gone): the communicator blames that peer (a
 * shrink then asks whether it closed on purpose or died). */
static inline void _ddp_transport_blame(const ddp_transport_ctx_t *ctx, int peer) {
    if (ctx->waiting_on) *ctx->waiting_on = peer;
}

/* ---------------------------------------------------------------- requests and connections
 * Every transport's request starts with this head (its first member): one message posted on
 * one connection, moving through the connection's send or receive queue in posting order. A
 * transport adds what its wire needs after it (TCP a header, RDMA its registrations). */
typedef struct _ddp_transport_req {
    struct _ddp_transport_req *next;   /* the queue it waits in, or the free list */
    void *conn;                        /* the transport's connection */
    unsigned char *buf;
    size_t len, done;                  /* done: bytes moved so far (the transport says which) */
    uint64_t tag;
    int complete, is_send;             /* complete: test() may hand it back */
} _ddp_transport_req_t;

/* A FIFO of requests: posted first, completed first. */
typedef struct { _ddp_transport_req_t *head, *tail; } _ddp_transport_queue_t;

static inline void _ddp_transport_queue_push(_ddp_transport_queue_t *f, _ddp_transport_req_t *q) {
    q->next = NULL;
    if (f->tail) f->tail->next = q; else f->head = q;
    f->tail = q;
}

/* Takes the head off (it completed). */
static inline void _ddp_transport_queue_pop(_ddp_transport_queue_t *f) {
    f->head = f->head->next;
    if (!f->head) f->tail = NULL;
}

/* A connection's requests live in an array in the connection (allocated with it: the steady
 * state never allocates); the free list is a stack of pointers into it, LIFO so that the
 * request used last, still in cache, is used next. Pointers rather than `next`: `next` is the
 * request's queue link while it is posted. */
#define _DDP_TRANSPORT_MAX_REQS 64
typedef struct {
    int n, cap;
    _ddp_transport_req_t *req[_DDP_TRANSPORT_MAX_REQS];
} _ddp_transport_freelist_t;

/* The head of a queued connection (its first member): the connections of transports that move
 * their requests in a progress function (tcp, shm, ibverbs), which isend, irecv and test below
 * serve for all of them. */
typedef struct _ddp_transport_conn {
    /* The transport's half of isend/irecv: take a request (_ddp_transport_req_take), queue it,
     * start it; *req is set once it is queued. */
    ddp_result_t (*post)(struct _ddp_transport_conn *k, int is_send, void *buf, size_t len,
                         uint64_t tag, void *mr, void **req);
    /* Moves what it can, both directions, without blocking; marks finished requests complete.
     * Returns the connection's sticky failure. */
    ddp_result_t (*progress)(struct _ddp_transport_conn *k);
    const ddp_transport_ctx_t *ctx;
    const char *name;                  /* the transport's, for messages */
    int peer;
    ddp_result_t err;                  /* sticky once the connection broke */
    _ddp_transport_freelist_t free;
} _ddp_transport_conn_t;

/* Fills in a connection's head; its n requests are reqs[0..n), each `stride` bytes and each
 * starting with a _ddp_transport_req_t (n <= _DDP_TRANSPORT_MAX_REQS). */
_DDP_PRIVATE void _ddp_transport_conn_init(_ddp_transport_conn_t *k, const ddp_transport_ctx_t *ctx,
                                           const char *name, int peer, void *reqs, size_t stride, int n) {
    int i;
    DDP_ASSERT(n <= _DDP_TRANSPORT_MAX_REQS);
    k->ctx = ctx;
    k->name = name;
    k->peer = peer;
    k->err = DDP_SUCCESS;
    k->free.cap = n;
    for (k->free.n = 0, i = 0; i < n; i++)
        k->free.req[k->free.n++] = (_ddp_transport_req_t *)(void *)((unsigned char *)reqs + (size_t)i * stride);
}

/* A free request of k with its head filled in (not queued yet), in *out. The connection's
 * sticky failure, or DDP_ERR_INTERNAL (recorded) when the caller posted more than the pool
 * holds. */
static inline ddp_result_t _ddp_transport_req_take(_ddp_transport_conn_t *k, int is_send, void *buf,
                                                   size_t len, uint64_t tag, _ddp_transport_req_t **out) {
    _ddp_transport_req_t *q;
    *out = NULL;
    if (k->err != DDP_SUCCESS) return k->err;
    if (!k->free.n) {
        ddp_transport_fail(k->ctx, DDP_ERR_INTERNAL, "%s: more than %d requests outstanding to rank %d",
                           k->name, k->free.cap, k->peer);
        return DDP_ERR_INTERNAL;
    }
    q = k->free.req[--k->free.n];
    q->next = NULL;
    q->conn = k;
    q->buf = (unsigned char *)buf;
    q->len = len;
    q->done = 0;
    q->tag = tag;
    q->complete = 0;
    q->is_send = is_send;
    *out = q;
    return DDP_SUCCESS;
}

/* Gives back a request taken with _ddp_transport_req_take (once). */
static inline void _ddp_transport_req_put(_ddp_transport_conn_t *k, _ddp_transport_req_t *q) {
    k->free.req[k->free.n++] = q;
}

/* A received message is not the one the receive was posted for (tags are the communicator's:
 * signature digest << 32 | sequence): k's sticky failure, naming both. */
_DDP_PRIVATE ddp_result_t _ddp_transport_conn_mismatch(_ddp_transport_conn_t *k, uint64_t their_tag,
                                                       uint64_t their_len, const _ddp_transport_req_t *q) {
    return _ddp_transport_conn_fail(k->ctx, &k->err, DDP_ERR_MISMATCH, "%s: rank %d sent collective "
        "#%u (signature %08x) of %llu bytes, this rank expected #%u (signature %08x) of %zu bytes: "
        "the ranks called different collectives, dtypes, ops, roots or counts (or differ in DDP_DETERMINISTIC)", k->name, k->peer,
        (unsigned)(their_tag & 0xffffffffu), (unsigned)(their_tag >> 32),
        (unsigned long long)their_len, (unsigned)(q->tag & 0xffffffffu), (unsigned)(q->tag >> 32),
        q->len);
}

/* The vtable's isend, irecv and test for queued connections. */
_DDP_PRIVATE ddp_result_t _ddp_transport_isend(void *conn, const void *buf, size_t len, uint64_t tag,
                                               void *mr, void **req) {
    _ddp_transport_conn_t *k = (_ddp_transport_conn_t *)conn;
    return k->post(k, 1, (void *)(uintptr_t)buf, len, tag, mr, req);
}

_DDP_PRIVATE ddp_result_t _ddp_transport_irecv(void *conn, void *buf, size_t len, uint64_t tag,
                                               void *mr, void **req) {
    _ddp_transport_conn_t *k = (_ddp_transport_conn_t *)conn;
    return k->post(k, 0, buf, len, tag, mr, req);
}

/* Advances the connection unless req is complete already; a complete request goes back to the
 * free list. */
_DDP_PRIVATE ddp_result_t _ddp_transport_test(void *req, int *done) {
    _ddp_transport_req_t *q = (_ddp_transport_req_t *)req;
    _ddp_transport_conn_t *k = (_ddp_transport_conn_t *)q->conn;
    *done = 0;
    if (!q->complete) {
        ddp_result_t r = k->progress(k);
        if (r != DDP_SUCCESS) return r;
    }
    if (q->complete) {
        _ddp_transport_req_put(k, q);
        *done = 1;
    }
    return DDP_SUCCESS;
}

/* ---------------------------------------------------------------- device and interface lists
 * NCCL's list syntax (NCCL_SOCKET_IFNAME, NCCL_IB_HCA): "a,b" name prefixes, "=a,b" exact
 * names, "^a,b" everything but those; with port >= 0 an entry may end in ":port" (IB devices),
 * with port < 0 a colon is part of the name (interface aliases such as eth0:1). */
_DDP_PRIVATE int _ddp_transport_match_list(const char *spec, const char *name, int port) {
    int exclude = 0, exact = 0, hit = 0;
    char buf[256], *tok, *next;
    if (*spec == '^') { exclude = 1; spec++; }
    if (*spec == '=') { exact = 1; spec++; }
    _ddp_strlcpy(buf, spec, sizeof buf);
    for (tok = buf; tok; tok = next) {   /* strtok_r's split, without its POSIX-only declaration */
        char *colon;
        int want_port;
        if ((next = strchr(tok, ',')) != NULL) *next++ = 0;
        if (!*tok) continue;             /* empty entries ("a,,b", a trailing comma) name nothing */
        colon = port >= 0 ? strchr(tok, ':') : NULL;
        want_port = colon ? atoi(colon + 1) : 0;
        if (colon) *colon = 0;
        if ((exact ? !strcmp(name, tok) : !strncmp(name, tok, strlen(tok))) &&
            (!want_port || want_port == port)) { hit = 1; break; }
    }
    return exclude ? !hit : hit;
}

/* ---------------------------------------------------------------- waiting on shared memory
 * For transports whose ranks wait on words another rank writes (shm across processes, threads
 * within one): spin, then sleep on a futex that the writer rings. */
static inline void _ddp_transport_pause(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/* Sleeps while *word == val, at most ms. shared: the word is in memory shared between
 * processes (no FUTEX_PRIVATE). Off Linux: a nap of at most 1 ms (the sleeper polls). */
_DDP_PRIVATE void _ddp_futex_wait(uint32_t *word, uint32_t val, int ms, int shared) {
#if defined(__linux__)
    struct timespec ts;
    ts.tv_sec = ms / 1000;
    ts.tv_nsec = (long)(ms % 1000) * 1000000L;
    syscall(SYS_futex, word, shared ? FUTEX_WAIT : FUTEX_WAIT_PRIVATE, val, &ts, NULL, 0);
#else
    (void)word; (void)val; (void)shared;
    usleep(ms > 1 ? 1000 : (useconds_t)ms * 1000);
#endif
}

_DDP_PRIVATE void _ddp_futex_wake(uint32_t *word, int shared) {
#if defined(__linux__)
    syscall(SYS_futex, word, shared ? FUTEX_WAKE : FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
#else
    (void)word; (void)shared;
#endif
}

/* A wake-up word: its owner sleeps on doorbell; anyone rings it, paying the system call only
 * when the owner said it sleeps. No lost wake-up: the ringer publishes its progress (or flag)
 * with a sequentially consistent store, then reads `sleeping`; the sleeper stores sleeping = 1
 * (seq_cst), reads the doorbell, then re-checks what it waits for: one of the two always sees
 * the other (Dekker), and a ring between the re-check and the futex call changes the doorbell,
 * so the futex returns at once. Two 32-bit words: the same layout as shm's region header. */
typedef struct { uint32_t doorbell, sleeping; } _ddp_transport_bell_t;

static inline void _ddp_transport_bell_ring(_ddp_transport_bell_t *b, int shared) {
    if (__atomic_load_n(&b->sleeping, __ATOMIC_SEQ_CST)) {
        __atomic_add_fetch(&b->doorbell, 1u, __ATOMIC_SEQ_CST);
        _ddp_futex_wake(&b->doorbell, shared);
    }
}

/* The sleeper's half: arm, re-check (the caller), then sleep up to ms (0: not at all) and
 * disarm. */
static inline uint32_t _ddp_transport_bell_arm(_ddp_transport_bell_t *b) {
    __atomic_store_n(&b->sleeping, 1u, __ATOMIC_SEQ_CST);
    return __atomic_load_n(&b->doorbell, __ATOMIC_SEQ_CST);
}
static inline void _ddp_transport_bell_sleep(_ddp_transport_bell_t *b, uint32_t seen, int ms,
                                             int shared) {
    if (ms > 0) _ddp_futex_wait(&b->doorbell, seen, ms, shared);
    __atomic_store_n(&b->sleeping, 0u, __ATOMIC_SEQ_CST);
}

/* How long to spin before sleeping, and whether the ranks outnumber the CPUs they may use
 * (nlocal ranks on this host; the CPUs of all their affinity masks, ctx->host_cpus, else this
 * process's own): the transport's own variable (env) first, then the
 * communicator's spin when the user chose one (DDP_SPIN_US, or the desc), else 2000 us with a
 * CPU per rank (spinning costs nothing the peer needs, and a futex wake-up across CPUs costs
 * tens of microseconds), 50 us oversubscribed (spinning would steal the peer's CPU). */
_DDP_PRIVATE int _ddp_transport_spin_us(const ddp_transport_ctx_t *ctx, const char *env, int nlocal,
                                        int *oversubscribed) {
    long v;
    const char *s = getenv(env);
    int ncpu = ctx->host_cpus > 0 ? ctx->host_cpus : _ddp_cpu_count();
    *oversubscribed = nlocal > ncpu;
    if (s && _ddp_parse_long(s, 0, 10000000, &v) == 0) return (int)v;
    if (getenv("DDP_SPIN_US") || ctx->spin_us != _DDP_DEFAULT_SPIN_US) return ctx->spin_us;
    return *oversubscribed ? 50 : 2000;
}

/* Spin-then-block pacing of a loop that polls a word until it changes. Each time the word has
 * not changed yet:
 *     if (_ddp_transport_spin_fast(&s)) continue;      a bare pause, no clock read
 *     if (_ddp_transport_spin_tick(&s)) { ... }         every ms: abort, dead peers, timeout
 *     if (_ddp_transport_spin_slow(&s)) continue;      pauses or sched_yield until spin_us
 *     ... sleep on the bell ...
 * Oversubscribed, it skips the bare pauses and always yields: the CPU goes to the peer we wait
 * for. Even with a CPU per rank it yields every 8th round: other work may want this CPU, and
 * sched_yield costs ~0.3 us when nobody does. */
typedef struct {
    int spins, spin_us, oversubscribed, timeout_ms;
    int64_t start, now, deadline, next_check;
    int64_t note_at_ms;   /* the wait says what it waits for at this age (_ddp_transport_note_wait) */
} _ddp_transport_spin_t;

static inline void _ddp_transport_spin_start(_ddp_transport_spin_t *s, int spin_us,
                                             int oversubscribed, int timeout_ms) {
    s->spins = 0;
    s->spin_us = spin_us;
    s->oversubscribed = oversubscribed;
    s->timeout_ms = timeout_ms;
    s->start = s->now = s->deadline = s->next_check = 0;
    s->note_at_ms = _ddp_next_wait_note_ms(0);
}

static inline int _ddp_transport_spin_fast(_ddp_transport_spin_t *s) {
    if (s->spins < 64 && !s->oversubscribed) { s->spins++; _ddp_transport_pause(); return 1; }
    if (++s->spins == 1 << 30) s->spins = 64;
    return 0;
}

/* Reads the clock into s->now (starting the clocks the first time); 1 when the periodic checks
 * are due (once per millisecond). s->deadline is 0 without a timeout. */
static inline int _ddp_transport_spin_tick(_ddp_transport_spin_t *s) {
    s->now = _ddp_now_us();
    if (!s->start) {
        s->start = s->now;
        s->deadline = s->timeout_ms < 0 ? 0 : s->now + (int64_t)s->timeout_ms * 1000;
        s->next_check = s->now + 1000;
    }
    if (s->now < s->next_check) return 0;
    s->next_check = s->now + 1000;
    return 1;
}

static inline int _ddp_transport_spin_expired(const _ddp_transport_spin_t *s) {
    return s->deadline && s->now >= s->deadline;
}

/* 1 after a round of pauses or a yield while within spin_us; 0: time to sleep. */
static inline int _ddp_transport_spin_slow(const _ddp_transport_spin_t *s) {
    if (s->now - s->start >= s->spin_us) return 0;
    if (s->oversubscribed || (s->spins & 7) == 0) {
        sched_yield();
    } else {
        int j;
        for (j = 0; j < 32; j++) _ddp_transport_pause();
    }
    return 1;
}

/* ---------------------------------------------------------------- waits that speak
 * A wait that lasts says what it waits for and who is missing, at WARN, after 10 s, 30 s, 60 s,
 * then every 5 minutes (ddp_base.h), as the engine's algorithms do (ddp_engine.h), long before
 * the timeout: "all_reduce #12 (shm, phase exchange, chunk 1 of 1): no progress for 30 s,
 * waiting for ranks 2, 5-7 (timeout in 570 s)". In the periodic checks of a spin loop:
 *     if (_ddp_transport_note_due(ctx, &s)) { list the missing ranks; _ddp_transport_note_wait }
 * The list is built only when a note is due. */
static inline int _ddp_transport_note_due(const ddp_transport_ctx_t *ctx, const _ddp_transport_spin_t *s) {
    return s->start && (s->now - s->start) / 1000 >= s->note_at_ms && ctx->log_level >= DDP_LOG_WARN;
}

/* Ranks for a message, added in increasing order: "rank 2" or "ranks 2, 5-7". */
typedef struct {
    char body[200], text[240];
    size_t off;
    int n, run_first, run_last, more;
} _ddp_transport_ranks_t;

static inline void _ddp_transport_ranks_init(_ddp_transport_ranks_t *l) {
    l->body[0] = l->text[0] = 0;
    l->off = 0;
    l->n = l->more = 0;
    l->run_first = l->run_last = -1;
}
_DDP_PRIVATE void _ddp_transport_ranks_flush(_ddp_transport_ranks_t *l) {
    if (l->run_first < 0) return;
    if (l->off + 32 < sizeof l->body)
        l->off += (size_t)snprintf(l->body + l->off, sizeof l->body - l->off,
                                   l->run_last > l->run_first ? "%s%d-%d" : "%s%d", l->off ? ", " : "",
                                   l->run_first, l->run_last);
    else
        l->more += l->run_last - l->run_first + 1;
    l->run_first = -1;
}
_DDP_PRIVATE void _ddp_transport_ranks_add(_ddp_transport_ranks_t *l, int rank) {
    l->n++;
    if (l->run_first >= 0 && rank == l->run_last + 1) { l->run_last = rank; return; }
    _ddp_transport_ranks_flush(l);
    l->run_first = l->run_last = rank;
}
_DDP_PRIVATE const char *_ddp_transport_ranks_str(_ddp_transport_ranks_t *l) {
    _ddp_transport_ranks_flush(l);
    if (l->more)
        snprintf(l->text, sizeof l->text, "ranks %s and %d more", l->body, l->more);
    else
        snprintf(l->text, sizeof l->text, "%s %s", l->n == 1 ? "rank" : "ranks", l->body);
    return l->text;
}

/* Logs the note (see above) for a wait in collective `kind` that has lasted since s->start;
 * detail says where in it ("shm, phase exchange, chunk 1 of 1"), missing who has not arrived.
 * The next note is due at the next step of the schedule. */
_DDP_PRIVATE void _ddp_transport_note_wait(const ddp_transport_ctx_t *ctx, _ddp_transport_spin_t *s,
                                           int kind, const char *detail, const char *missing) {
    const int64_t ms = (s->now - s->start) / 1000;
    char call[64], left[48];
    if (ctx->calls)
        snprintf(call, sizeof call, "%s #%u", _ddp_kind_name(kind), (unsigned)*ctx->calls);
    else
        snprintf(call, sizeof call, "%s", _ddp_kind_name(kind));
    if (s->deadline)
        snprintf(left, sizeof left, "timeout in %lld s", (long long)((s->deadline - s->now) / 1000000));
    else
        snprintf(left, sizeof left, "no timeout");
    ddp_transport_log(ctx, DDP_LOG_WARN, "%s (%s): no progress for %lld s, waiting for %s (%s)", call,
                      detail, (long long)(ms / 1000), missing, left);
    s->note_at_ms = _ddp_next_wait_note_ms(ms);
}

/* ---------------------------------------------------------------- collective signatures
 * Transports that run collectives themselves (coll) publish what each rank called, so a rank
 * that called something else is named (DDP_ERR_MISMATCH) instead of reading the wrong bytes.
 * Part of shm's region layout: a fixed-size, 8-byte aligned record. */
typedef struct { int32_t kind, dtype, op, root; uint64_t count; } _ddp_transport_sig_t;
/* kind is a ddp_call_kind_t (ddp_base.h). */

static inline void _ddp_transport_sig_set(_ddp_transport_sig_t *g, int kind, ddp_dtype_t dtype,
                                          ddp_op_t op, size_t count, int root) {
    g->kind = kind;
    g->dtype = (int32_t)dtype;
    g->op = (int32_t)op;
    g->root = root;
    g->count = count;
}

static inline int _ddp_transport_sig_differs(const _ddp_transport_sig_t *a,
                                             const _ddp_transport_sig_t *b) {
    return a->kind != b->kind || a->dtype != b->dtype || a->op != b->op || a->root != b->root ||
           a->count != b->count;
}

/* "all_reduce of 1024 x float32, sum root 0" (for the mismatch message). */
_DDP_PRIVATE void _ddp_transport_sig_str(const _ddp_transport_sig_t *g, char *out, size_t cap) {
    const int red = g->kind == DDP_CALL_ALL_REDUCE || g->kind == DDP_CALL_REDUCE_SCATTER;
    snprintf(out, cap, "%s of %llu x %s%s%s root %d", _ddp_kind_name(g->kind),
             (unsigned long long)g->count, ddp_dtype_name((ddp_dtype_t)g->dtype), red ? ", " : "",
             red ? ddp_op_name((ddp_op_t)g->op) : "", g->root);
}

/* ---------------------------------------------------------------- handshakes and strangers
 * A transport's listener is reachable by anyone who can read the store (always, without a job
 * secret) or scan ports. Every transport here answers the same way:
 *   - a connection is usable only after both sides proved, by challenge-response, that they
 *     know the communicator's key (ctx->auth_key; ddp_auth.h). The proofs are bound to a label
 *     naming the transport, the communicator and the direction, so a proof made for one pair
 *     is worthless for another, and to a fresh nonce from each side, so a replay fails;
 *   - the table of connections still in their handshake is allocated at init (world size + a
 *     margin), nothing is allocated per stranger, and when it is full the oldest connection
 *     that has not even sent its hello is evicted for the newcomer: idle strangers cannot keep
 *     a rank's peers waiting in the kernel's backlog;
 *   - refused attempts are told at most once a second per transport instance, with a count of
 *     those not shown: a flood cannot flood the log. Keys and proofs never reach a log line. */
#define _DDP_TRANSPORT_BACKLOG (SOMAXCONN > 4096 ? SOMAXCONN : 4096)
#define _DDP_TRANSPORT_STRANGER_SLOTS 64      /* handshake slots beyond one per rank */

/* The head of a transport's handshake-table entry (its first member). */
typedef struct {
    int fd, stage;            /* stage 0: nothing complete yet (the hello is awaited) */
    uint64_t seq;             /* accept order: lower is older */
    int64_t deadline;         /* us; the handshake must be over by then */
} _ddp_transport_pending_t;

/* The entry to evict from a full table of n entries of `stride` bytes: the oldest that has not
 * completed its hello; if every one has, the oldest. -1 for an empty table. */
_DDP_PRIVATE int _ddp_transport_pending_victim(const void *table, size_t stride, int n) {
    int i, idle = -1, any = -1;
    uint64_t idle_seq = 0, any_seq = 0;
    for (i = 0; i < n; i++) {
        const _ddp_transport_pending_t *e =
            (const _ddp_transport_pending_t *)(const void *)((const unsigned char *)table + (size_t)i * stride);
        if (any < 0 || e->seq < any_seq) { any = i; any_seq = e->seq; }
        if (e->stage == 0 && (idle < 0 || e->seq < idle_seq)) { idle = i; idle_seq = e->seq; }
    }
    return idle >= 0 ? idle : any;
}

/* When a connection that said a valid hello (this communicator, ranks that fit) must have
 * proven the key: the communicator's timeout, at least `floor_ms`. Such a peer may be slow to
 * answer for good reasons (hundreds of ranks on a few CPUs, each looking up its peers in the
 * store first); idle strangers get only the short deadline of the hello, and eviction. */
_DDP_PRIVATE int64_t _ddp_transport_proof_deadline(const ddp_transport_ctx_t *ctx, int floor_ms) {
    int ms = ctx->timeout_ms < 0 ? INT_MAX / 2 : ctx->timeout_ms;
    if (ms < floor_ms) ms = floor_ms;
    return _ddp_now_us() + (int64_t)ms * 1000;
}

/* The communicator calls accept(peer) for every peer it still waits for, back to back; each
 * call pumping the whole handshake table would cost (waiting peers) x (pending entries) system
 * calls per round, which at hundreds of ranks on one host starves the handshakes themselves.
 * One pump per 100 us serves every accept() of a round. 1 when a pump is due (and records it). */
_DDP_PRIVATE int _ddp_transport_pump_due(int64_t *last_us) {
    int64_t now = _ddp_now_us();
    if (*last_us && now - *last_us < 100) return 0;
    *last_us = now;
    return 1;
}

/* At most one WARN line a second; the next line that is shown says how many were not. */
typedef struct { int64_t next_us; unsigned suppressed; } _ddp_transport_ratelimit_t;

_DDP_PRIVATE void _ddp_transport_warn_limited(const ddp_transport_ctx_t *ctx, _ddp_transport_ratelimit_t *rl,
                                              const char *fmt, ...)
#if defined(__GNUC__) || defined(__clang__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
_DDP_PRIVATE void _ddp_transport_warn_limited(const ddp_transport_ctx_t *ctx, _ddp_transport_ratelimit_t *rl,
                                              const char *fmt, ...) {
    char msg[640];
    va_list ap;
    int64_t now;
    if (!ctx || ctx->log_level < (int)DDP_LOG_WARN) return;
    now = _ddp_now_us();
    if (now < rl->next_us) { rl->suppressed++; return; }
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (rl->suppressed)
        ddp_transport_log(ctx, DDP_LOG_WARN, "%s (%u more refused or evicted connections since the "
                          "last such line were not shown)", msg, rl->suppressed);
    else
        ddp_transport_log(ctx, DDP_LOG_WARN, "%s", msg);
    rl->next_us = now + 1000000;
    rl->suppressed = 0;
}

/* Pause before connect attempt `tries` + 1 (tries >= 1 failed so far): exponential from 5 ms,
 * at most 1 s, scaled by a random 0.5..1.5 so that ranks refused together do not come back
 * together. */
_DDP_PRIVATE int64_t _ddp_transport_backoff_us(int tries) {
    int64_t base = 5000;
    while (--tries > 0 && base < 1000000) base *= 2;
    return _ddp_jitter_us(base > 1000000 ? 1000000 : base);
}

/* The proofs of a data connection from rank `from` to rank `to` over transport `name`: the
 * label binds them to this communicator and direction (ddp_auth.h's top explains the rest). */
_DDP_PRIVATE void _ddp_transport_auth_label(const ddp_transport_ctx_t *ctx, const char *name, int from,
                                            int to, char *out, size_t cap) {
    snprintf(out, cap, "%s %016llx %d->%d", name, (unsigned long long)ctx->comm_id, from, to);
}

/* 1 when the communicator gave this transport a key to prove (it always does before the first
 * connect or accept; a transport refuses to handshake without one). */
_DDP_PRIVATE int _ddp_transport_auth_ready(const ddp_transport_ctx_t *ctx) {
    return ctx && ctx->auth_key && ctx->auth_key_len > 0;
}

_DDP_PRIVATE void _ddp_transport_auth_proof(const ddp_transport_ctx_t *ctx, const char *name, int from,
                                            int to, int role,
                                            const unsigned char nonce_server[_DDP_AUTH_NONCE_BYTES],
                                            const unsigned char nonce_client[_DDP_AUTH_NONCE_BYTES],
                                            unsigned char out[_DDP_AUTH_PROOF_BYTES]) {
    char label[96];
    _ddp_transport_auth_label(ctx, name, from, to, label, sizeof label);
    _ddp_auth_proof(ctx->auth_key, ctx->auth_key_len, role, label, nonce_server, nonce_client, out);
}

_DDP_PRIVATE int _ddp_transport_auth_verify(const ddp_transport_ctx_t *ctx, const char *name, int from,
                                            int to, int role,
                                            const unsigned char nonce_server[_DDP_AUTH_NONCE_BYTES],
                                            const unsigned char nonce_client[_DDP_AUTH_NONCE_BYTES],
                                            const unsigned char proof[_DDP_AUTH_PROOF_BYTES]) {
    char label[96];
    _ddp_transport_auth_label(ctx, name, from, to, label, sizeof label);
    return _ddp_auth_verify(ctx->auth_key, ctx->auth_key_len, role, label, nonce_server, nonce_client,
                            proof);
}

#endif /* DDP_TRANSPORT_IMPLEMENTATION */
