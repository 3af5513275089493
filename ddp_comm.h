/* SPDX-License-Identifier: MIT (see LICENSE) */
/* ddp_comm.h — libddp's communicator: rendezvous, the operation engine and the public
 * collectives.
 *
 * What it holds, in order: the communicator and its rendezvous through the store (settings,
 * transports per peer, connections, host table); the point-to-point engine it gives the
 * algorithms (ddp_engine.h) and the context it gives the transports (ddp_transport.h); the
 * operation engine: one record per requested operation, run blocking on the caller's thread or
 * queued for the progress thread (async, lanes), or queued by a group (with small all-reduces
 * fused); abort, split, errors and logging; the public collectives, which check their arguments
 * and pick an algorithm from ddp_ring.h (or hand the call to a transport that runs collectives).
 *
 * Users include ddp.h, which includes this. Depends on ddp_base.h, ddp_store.h, ddp_kernels.h,
 * transports/ddp_transport.h, ddp_engine.h and ddp_ring.h. Built by DDP_IMPLEMENTATION.
 */
#if defined(DDP_IMPLEMENTATION) && !defined(DDP_COMM_IMPLEMENTATION)
#define DDP_COMM_IMPLEMENTATION
#endif
#if defined(DDP_COMM_IMPLEMENTATION)
#ifndef DDP_BASE_IMPLEMENTATION
#define DDP_BASE_IMPLEMENTATION
#endif
#ifndef DDP_SOCKET_IMPLEMENTATION
#define DDP_SOCKET_IMPLEMENTATION
#endif
#ifndef DDP_STORE_IMPLEMENTATION
#define DDP_STORE_IMPLEMENTATION
#endif
#ifndef DDP_KERNELS_IMPLEMENTATION
#define DDP_KERNELS_IMPLEMENTATION
#endif
#ifndef DDP_TRANSPORT_IMPLEMENTATION
#define DDP_TRANSPORT_IMPLEMENTATION
#endif
#ifndef DDP_ENGINE_IMPLEMENTATION
#define DDP_ENGINE_IMPLEMENTATION
#endif
#ifndef DDP_ALGORITHMS_IMPLEMENTATION
#define DDP_ALGORITHMS_IMPLEMENTATION
#endif
#ifndef DDP_TRACE_IMPLEMENTATION
#define DDP_TRACE_IMPLEMENTATION
#endif
#ifndef DDP_MODEL_IMPLEMENTATION
#define DDP_MODEL_IMPLEMENTATION
#endif
#endif
#include "ddp_base.h"
#include "ddp_store.h"
#include "ddp_auth.h"
#include "ddp_kernels.h"
#include "transports/ddp_transport.h"
#include "ddp_engine.h"
#include "ddp_algorithms.h"
#include "ddp_trace.h"
#include "ddp_model.h"

#ifndef DDP_COMM_H_INCLUDED
#define DDP_COMM_H_INCLUDED

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ddp_comm ddp_comm_t;

/* Zero-initialised = defaults. Values where 0 is legitimate (rank) are arguments, not fields. */
typedef struct ddp_comm_desc {
    const char *transport;        /* NULL/"auto": DDP_TRANSPORT, else the best compiled in */
    const char *master_addr;      /* NULL: MASTER_ADDR, else "127.0.0.1" */
    int master_port;              /* 0: MASTER_PORT, else 29500 */
    int timeout_ms;               /* 0: DDP_TIMEOUT_MS, else 600000; < 0 = wait forever */
    const char *job_secret;       /* NULL: DDP_JOB_SECRET, else no authentication */
    const char *socket_ifname;    /* NULL: DDP_SOCKET_IFNAME, else the route to the master */
    ddp_store_t *store;           /* use this store for rendezvous instead of MASTER_ADDR:PORT */
    const char *store_prefix;     /* key namespace in a shared store (default "ddp") */
    size_t segment_bytes;         /* 0: DDP_SEGMENT_BYTES, else measured default */
    int spin_us;                  /* 0: DDP_SPIN_US, else measured default; < 0 = never spin */
    int log_level;                /* 0: DDP_DEBUG; else a ddp_log_level_t + 1 (1 = silence) */
    const ddp_allocator_t *allocator; /* communicator + transport memory (the store: DDP_MALLOC) */
    ddp_log_fn_t log_fn;          /* NULL: stderr, or DDP_DEBUG_FILE; else every line, to this */
    void *log_user;               /* handed to log_fn */
} ddp_comm_desc_t;

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
#define DDP_MAX_REQUESTS 64
typedef struct ddp_request { ddp_comm_t *comm; uint64_t id; } ddp_request_t;  /* zero = none */
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
typedef struct ddp_async_hooks {
    void (*before)(void *arg);
    void (*after)(void *arg);
    void *arg;
} ddp_async_hooks_t;
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


/* The communicator's allocator (desc.allocator, else DDP_MALLOC/DDP_FREE); calloc zeroes. For
 * layers built on the communicator (the reducer) and hooks. */
DDP_API void *ddp_comm_calloc(ddp_comm_t *comm, size_t size);
DDP_API void ddp_comm_free(ddp_comm_t *comm, void *ptr);
DDP_API void ddp_comm_log(const ddp_comm_t *comm, ddp_log_level_t level, const char *fmt, ...)
#if defined(__GNUC__) || defined(__clang__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
/* Records the failure (shown by ddp_comm_last_error, logged at WARN) and returns r. */
DDP_API ddp_result_t ddp_comm_fail(ddp_comm_t *comm, ddp_result_t r, const char *fmt, ...)
#if defined(__GNUC__) || defined(__clang__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

#ifdef __cplusplus
}
#endif
#endif /* DDP_COMM_H_INCLUDED */

/* ============================================================================================
 * IMPLEMENTATION
 * ========================================================================================== */
#if defined(DDP_COMM_IMPLEMENTATION) && !defined(DDP_COMM_IMPL_INCLUDED)
#define DDP_COMM_IMPL_INCLUDED
#if !defined(DDP_STORE_IMPL_INCLUDED) || !defined(DDP_TRANSPORT_IMPL_INCLUDED) || !defined(DDP_RING_IMPL_INCLUDED)
#error "libddp: ddp_comm.h's implementation needs those of the headers below it (define DDP_IMPLEMENTATION)"
#endif

#define _DDP_DEFAULT_PORT 29500
/* Recursive doubling vs ring crossovers measured here (2-core VM, TCP loopback, float sum):
 * p=2 even at 32 KiB; p=4 even at 256 KiB; p=3 and p=6 (folded worlds) win at 64 KiB, lose
 * at 256 KiB. */
#define _DDP_RD_MAX_BYTES_P2 (16u << 10)
#define _DDP_RD_MAX_BYTES_POW2 (256u << 10)
#define _DDP_RD_MAX_BYTES_FOLDED (64u << 10)
/* Async lanes (DDP_ASYNC_LANES): off by default. On the 2-core VM this was built on, two TCP
 * connection sets carrying two 16 MiB all-reduces at once took 0.93-1.05x the time of one set
 * carrying them in turn: loopback TCP there is CPU-bound (1.9 of 2 cores busy), so nothing can
 * overlap. Where a NIC, not the CPU, is the limit, several streams are what NCCL and Gloo use
 * (bench/ddp_async.c measures it: try DDP_ASYNC_LANES=2). */
#define _DDP_DEFAULT_LANES 1
#define _DDP_AUTH_KEY_BYTES _DDP_SHA256_BYTES
/* World sizes beyond this fail at once instead of allocating per-rank tables first: rank 0's
 * store holds one connection per rank. */
#define _DDP_MAX_RANKS 65536
#define _DDP_LANE_MIN_BYTES ((size_t)4 << 20)

/* The last failed ddp_comm_init* of this thread: there is no communicator to ask. */
static __thread char _ddp_init_error[1024];
DDP_API const char *ddp_last_init_error(void) { return _ddp_init_error; }

/* ---------------------------------------------------------------- communicator */
typedef struct { const ddp_transport_t *t; void *state; } _ddp_tinst_t;
typedef struct { int tinst; void *conn; } _ddp_peer_t;

#define _DDP_HOST_ID_LEN 160
#define _DDP_HOST_ENTRY (_DDP_HOST_ID_LEN + _DDP_CPU_MASK_BYTES)   /* host/N in the store */
#define _DDP_MAX_SLOTS 8
#define _DDP_MAX_LANES 4

/* A progress thread and the communicator it runs operations on (see "lanes" below). */
typedef struct {
    struct ddp_comm *owner, *exec;
    int index;
    pthread_t thread;
    uint64_t cursor;               /* the last request this lane took */
} _ddp_lane_t;

struct ddp_comm {
    /* What the algorithms see (rank, size, timeouts, spin, segment, scratch, sequence) and the
     * calls they make: filled at init, the one copy of those settings. */
    _ddp_engine_t eng;
    /* What the transports see: filled before their init, kept for their lifetime. */
    ddp_transport_ctx_t tctx;
    unsigned char token[_DDP_AUTH_KEY_BYTES];     /* rank 0's random, through the store */
    unsigned char data_key[_DDP_AUTH_KEY_BYTES];  /* what data connections prove (never sent) */
    int local_rank, local_size;
    char master_addr[256];
    int master_port;
    char ifname[256];
    char prefix[128];
    char job[160];                 /* the launcher's job identity ("" if none): rendezvous check */
    int foreign;                   /* the store belongs to another job: never write to it */
    ddp_store_t *store;
    int own_store;
    char *host_ids;                /* nranks * _DDP_HOST_ID_LEN */
    _ddp_tinst_t tinst[_DDP_MAX_TRANSPORTS];
    int ntinst;
    _ddp_peer_t *peers;
    ddp_allocator_t alloc;
    ddp_result_t error;            /* sticky: set by a failed collective */
    int init_probe;                /* trying a transport under "auto": its failure is a notice */
    _ddp_log_sink_t log;           /* desc.log_fn, or DDP_DEBUG_FILE's descriptor, or stderr */
    int log_file;                  /* log.fd is DDP_DEBUG_FILE's: closed at destroy */
    int op_quiet;                  /* an operation runs on op_thread: its failures are logged once, */
    pthread_t op_thread;           /* at its end, whole (atomic: other threads read it) */
    int64_t init_deadline_us;      /* the whole rendezvous ends by then (0: no timeout) */
    char last_error[1024];
    /* Async requests and abort. aborted/busy are atomics (Dekker pair: an operation starts only
     * if no abort came first; abort poisons the communicator itself only if nothing runs). */
    int aborted, busy, abort_claimed;
    int dev_busy;                  /* the user's thread is in a device call (atomic, nests) */
    pthread_mutex_t amu;           /* the request ring and the progress thread's state */
    pthread_cond_t acv;            /* something queued, or stop */
    pthread_cond_t adone;          /* an operation finished */
    int async_init, progress_on, progress_stop;
    struct _ddp_op *ops;           /* DDP_MAX_REQUESTS slots; op number n lives in slot n % max */
    uint64_t issued, finished;     /* requests submitted / done, all of 1..finished (issue order) */
    _ddp_lane_t lanes[_DDP_MAX_LANES]; /* lane 0 runs on this communicator, the others on copies */
    int nlanes, want_lanes;        /* running; DDP_ASYNC_LANES */
    size_t lane_min_bytes;         /* DDP_LANE_MIN_BYTES: smaller requests all go to lane 0 */
    uint64_t big_ops;              /* requests >= lane_min_bytes so far: picks their lane */
    char transport_name[32];       /* desc.transport / DDP_TRANSPORT, "" for auto (for copies) */
    ddp_result_t abort_code;       /* why it was aborted, when not by ddp_comm_abort */
    char abort_reason[640];
    uint32_t splits;               /* ddp_comm_split calls: part of the child's store prefix */
    ddp_store_t *extra_store;      /* ddp_comm_init_threads' private store server (rank 0) */
    int algo;                      /* _DDP_ALGO_*: DDP_ALGO, else chosen by size */
    const ddp_coll_provider_t *coll; /* a transport that runs the collectives itself, or NULL */
    void *coll_state;
    size_t rd_max_bytes;           /* auto: recursive doubling up to this many bytes */
    /* Hosts and the all-reduce cost model (issue 18): auto on several hosts picks by the model */
    _ddp_layout_t layout;          /* ranks, hosts, fewest/most ranks on a host */
    _ddp_hier_t hier;              /* this rank's groups in the hierarchical all-reduce */
    int *hier_ranks;               /* the storage of hier.local.ranks and hier.inter.ranks */
    int *host_of;                  /* DDP_TEST_HOSTS only: each rank's host number (for splits) */
    _ddp_model_t model;            /* rank 0's (DDP_MODEL, else built in): the same everywhere */
    signed char ar_pick[64];       /* calls of up to 2^k bytes: auto's algorithm (_ddp_ar_algo_t) */
    signed char hier_pick[64];     /* DDP_ALGO=hier: the hierarchical algorithm the model picks */
    uint32_t *p2p;                 /* 4 per peer: ddp_send/ddp_recv messages sent to it and received
                                    * from it (the sequence in their tags); group_end's in flight */
    int group_depth, group_n, group_cap; /* ddp_group_start nesting; calls queued, room */
    void *group_ops;               /* the queued calls (_ddp_op_t), grown on demand, kept */
    unsigned char *fuse_buf;       /* a group's small all-reduces packed together (lazy, kept) */
    ddp_result_t group_err;        /* first failure of a call made inside the group */
    /* Device (GPU) buffers: the device provider of a transport (transports/ddp_nccl.h). `dev`
     * once usable on every rank; `dev_any` whenever one is compiled in (it still tells device
     * pointers apart, so that they get a clear error instead of a host dereference). */
    const ddp_device_provider_t *dev, *dev_any;
    void *dev_state, *dev_any_state;
    void *dev_inherited;           /* a split's device communicator, for the child's setup */
    char dev_declined[512];        /* why `dev` is NULL */
    uint64_t dev_seq;              /* device calls issued: their numbers in logs and errors */
    int dev_check;                 /* DDP_NCCL_CHECK: ranks compare each call's fingerprint */
    uint64_t *dev_prints;          /* nranks fingerprints (DDP_NCCL_CHECK only, kept) */
    _ddp_trace_t trace;            /* flight recorder (always), timeline (DDP_TRACE) */
    int trace_open;
    unsigned fork_gen;             /* _ddp_fork_gen when created: another value = a fork child */
    int pid;                       /* the creating process, for the fork error */
    int forked;                    /* destroy in a fork child: tctx.forked points here */
};
/* DDP_ALGO: auto, or one all-reduce algorithm (1 + _ddp_ar_algo_t), or "hier" (the hierarchical
 * one whose inter-host part the model picks). */
enum { _DDP_ALGO_AUTO = 0, _DDP_ALGO_RING = 1 + _DDP_AR_RING, _DDP_ALGO_RD = 1 + _DDP_AR_RD,
       _DDP_ALGO_HIER = 1 + _DDP_AR_NUM };

/* Live communicators, so that a call on a destroyed one is an error instead of a use after
 * free. Several communicators may live at once; the list is only touched at init/destroy and
 * read (under the lock) at the start of each collective. */
static pthread_mutex_t _ddp_live_mu = PTHREAD_MUTEX_INITIALIZER;
static const ddp_comm_t **_ddp_live;
static size_t _ddp_nlive, _ddp_live_cap;

/* Fork. A communicator belongs to the process that created it: a fork child gets a copy of its
 * memory but shares its sockets, epoll set, shared memory and device contexts with the parent,
 * so any use would race the parent on them. A child handler (registered once) bumps this
 * process-wide generation; entry points compare it with the communicator's, a plain load,
 * where getpid() would be a syscall per call. The handlers also hold the live list's lock
 * across fork, so a child never inherits it locked. */
static unsigned _ddp_fork_gen;
static pthread_once_t _ddp_fork_once = PTHREAD_ONCE_INIT;
_DDP_PRIVATE void _ddp_fork_prepare(void) { pthread_mutex_lock(&_ddp_live_mu); }
_DDP_PRIVATE void _ddp_fork_parent(void) { pthread_mutex_unlock(&_ddp_live_mu); }
_DDP_PRIVATE void _ddp_fork_child(void) {
    __atomic_add_fetch(&_ddp_fork_gen, 1u, __ATOMIC_RELAXED);
    /* The child runs in the thread that took the lock in prepare: it releases it (re-initialising
     * a held mutex is undefined, and ThreadSanitizer then sees the lock held forever). */
    pthread_mutex_unlock(&_ddp_live_mu);
}
_DDP_PRIVATE void _ddp_fork_register(void) {
    pthread_atfork(_ddp_fork_prepare, _ddp_fork_parent, _ddp_fork_child);
}
static inline int _ddp_forked(const ddp_comm_t *c) {
    return __atomic_load_n(&_ddp_fork_gen, __ATOMIC_RELAXED) != c->fork_gen;
}

_DDP_PRIVATE int _ddp_live_add(const ddp_comm_t *c) {
    int ok = 1;
    pthread_mutex_lock(&_ddp_live_mu);
    if (_ddp_nlive == _ddp_live_cap) {
        size_t cap = _ddp_live_cap ? _ddp_live_cap * 2 : 16;
        const ddp_comm_t **n = (const ddp_comm_t **)DDP_MALLOC(cap * sizeof *n);
        if (n) {
            if (_ddp_nlive) memcpy(n, _ddp_live, _ddp_nlive * sizeof *n);
            DDP_FREE(_ddp_live);
            _ddp_live = n;
            _ddp_live_cap = cap;
        } else {
            ok = 0;
        }
    }
    if (ok) _ddp_live[_ddp_nlive++] = c;
    pthread_mutex_unlock(&_ddp_live_mu);
    return ok;
}

/* Removes c if present; returns whether it was live. */
_DDP_PRIVATE int _ddp_live_check(const ddp_comm_t *c, int remove) {
    size_t i;
    int found = 0;
    pthread_mutex_lock(&_ddp_live_mu);
    for (i = 0; i < _ddp_nlive; i++) {
        if (_ddp_live[i] == c) {
            found = 1;
            if (remove) _ddp_live[i] = _ddp_live[--_ddp_nlive];
            break;
        }
    }
    if (remove && _ddp_nlive == 0) { DDP_FREE(_ddp_live); _ddp_live = NULL; _ddp_live_cap = 0; }
    pthread_mutex_unlock(&_ddp_live_mu);
    return found;
}

DDP_API void ddp_comm_log(const ddp_comm_t *c, ddp_log_level_t level, const char *fmt, ...) {
    va_list ap;
    if (!c || c->eng.log_level < (int)level || level == DDP_LOG_NONE) return;
    va_start(ap, fmt);
    _ddp_vlog_to(&c->log, c->eng.rank, level, fmt, ap);
    va_end(ap);
}

/* The communicator's store logs where the communicator does. */
_DDP_PRIVATE void _ddp_store_log_fwd(void *user, ddp_log_level_t level, int rank, const char *msg) {
    _ddp_log_emit(&((const ddp_comm_t *)user)->log, rank, (int)level, msg);
}

/* DDP_DEBUG_FILE (NCCL_DEBUG_FILE's form): the log goes to this file, %r the rank, %p the pid,
 * %h the host name; appended to. Unless desc.log_fn takes the lines. */
_DDP_PRIVATE void _ddp_log_open_file(ddp_comm_t *c, const char *tmpl) {
    char path[512], host[128] = "";
    size_t o = 0;
    int fd;
    gethostname(host, sizeof host - 1);
    for (; *tmpl && o + 24 < sizeof path; tmpl++) {
        if (tmpl[0] == '%' && tmpl[1] == 'r') { o += (size_t)snprintf(path + o, sizeof path - o, "%d", c->eng.rank); tmpl++; }
        else if (tmpl[0] == '%' && tmpl[1] == 'p') { o += (size_t)snprintf(path + o, sizeof path - o, "%ld", (long)getpid()); tmpl++; }
        else if (tmpl[0] == '%' && tmpl[1] == 'h') { o += (size_t)snprintf(path + o, sizeof path - o, "%.100s", host); tmpl++; }
        else path[o++] = *tmpl;
        if (o >= sizeof path) o = sizeof path - 1;
    }
    path[o] = 0;
    fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0) {
        ddp_comm_log(c, DDP_LOG_WARN, "DDP_DEBUG_FILE: cannot open %s (%s); logging to stderr", path, strerror(errno));
        return;
    }
    c->log.fd = fd;
    c->log_file = 1;
}
#define _DDP_LOG(c, lvl, ...) do { if ((c)->eng.log_level >= (lvl)) ddp_comm_log((c), (lvl), __VA_ARGS__); } while (0)

DDP_API ddp_result_t ddp_comm_fail(ddp_comm_t *c, ddp_result_t r, const char *fmt, ...) {
    va_list ap;
    char msg[768];
    if (!c) return r;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    snprintf(c->last_error, sizeof c->last_error, "rank %d: %s [%s]", c->eng.rank, msg, ddp_strerror(r));
    if (!c->init_probe && !(__atomic_load_n(&c->op_quiet, __ATOMIC_ACQUIRE) && pthread_equal(c->op_thread, pthread_self())))
        _DDP_LOG(c, DDP_LOG_WARN, "%s", c->last_error);
    return r;
}

/* A live communicator of this process: DDP_SUCCESS, else DDP_ERR_INVALID_USAGE (with the
 * reason as last error when it is a fork child's copy). */
_DDP_PRIVATE ddp_result_t _ddp_usable(ddp_comm_t *c) {
    if (!_ddp_live_check(c, 0)) return DDP_ERR_INVALID_USAGE;
    if (_ddp_forked(c))
        return ddp_comm_fail(c, DDP_ERR_INVALID_USAGE, "communicator created by pid %d, used from "
                             "pid %d after fork; destroy it in the child (that releases only the "
                             "child's copy) and create a new one there if the child needs one",
                             c->pid, (int)getpid());
    return DDP_SUCCESS;
}

_DDP_PRIVATE void _ddp_key(const ddp_comm_t *c, char *out, size_t cap, const char *fmt, ...) {
    va_list ap;
    int n = snprintf(out, cap, "%s/", c->prefix);
    va_start(ap, fmt);
    if (n > 0 && (size_t)n < cap) vsnprintf(out + n, cap - (size_t)n, fmt, ap);
    va_end(ap);
}

_DDP_PRIVATE ddp_result_t _ddp_comm_publish(ddp_comm_t *c, const char *transport, const void *addr, size_t len) {
    char key[256];
    if (!c || !transport || (len && !addr)) return DDP_ERR_INVALID_ARGUMENT;
    _ddp_key(c, key, sizeof key, "addr/%s/%d", transport, c->eng.rank);
    return ddp_store_set(c->store, key, addr, len);
}

_DDP_PRIVATE ddp_result_t _ddp_comm_lookup(ddp_comm_t *c, const char *transport, int peer, void *addr,
                                     size_t cap, size_t *len) {
    char key[256];
    ddp_result_t r;
    if (!c || !transport || peer < 0 || peer >= c->eng.nranks) return DDP_ERR_INVALID_ARGUMENT;
    _ddp_key(c, key, sizeof key, "addr/%s/%d", transport, peer);
    r = ddp_store_get(c->store, key, addr, cap, len);
    if (r != DDP_SUCCESS)
        return ddp_comm_fail(c, r, "looking up rank %d's %s address: %s", peer, transport,
                             ddp_store_last_error(c->store));
    return r;
}

DDP_API int ddp_comm_timeout_ms(const ddp_comm_t *c) { return c ? c->eng.timeout_ms : 0; }
DDP_API void *ddp_comm_calloc(ddp_comm_t *c, size_t n) { return _ddp_calloc(c ? &c->alloc : NULL, n); }
DDP_API void ddp_comm_free(ddp_comm_t *c, void *p) { _ddp_free(c ? &c->alloc : NULL, p); }
_DDP_PRIVATE const char *_ddp_comm_host_id(const ddp_comm_t *c, int peer) {
    if (!c || !c->host_ids || peer < 0 || peer >= c->eng.nranks) return "";
    return c->host_ids + (size_t)peer * _DDP_HOST_ID_LEN;
}
DDP_API int ddp_comm_rank(const ddp_comm_t *c) { return c && _ddp_live_check(c, 0) ? c->eng.rank : -1; }
DDP_API int ddp_comm_size(const ddp_comm_t *c) { return c && _ddp_live_check(c, 0) ? c->eng.nranks : -1; }
DDP_API int ddp_comm_local_rank(const ddp_comm_t *c) { return c && _ddp_live_check(c, 0) ? c->local_rank : -1; }
DDP_API int ddp_comm_local_size(const ddp_comm_t *c) { return c && _ddp_live_check(c, 0) ? c->local_size : -1; }
DDP_API const char *ddp_comm_last_error(const ddp_comm_t *c) {
    if (!c) return "NULL communicator";
    if (!_ddp_live_check(c, 0)) return "not a live communicator (destroyed, or never created)";
    return c->last_error;
}
/* Not in a fork child: its connection to the store is the parent's too. */
DDP_API ddp_store_t *ddp_comm_store(ddp_comm_t *c) { return c && !_ddp_forked(c) ? c->store : NULL; }
DDP_API const char *ddp_comm_transport_name(const ddp_comm_t *c, int peer) {
    if (!c || !c->peers || peer < 0 || peer >= c->eng.nranks) return "";
    if (peer == c->eng.rank) return "self";
    if (c->peers[peer].tinst < 0) return "none";
    return c->tinst[c->peers[peer].tinst].t->name;
}

/* Host identity: boot id + hostname + network namespace (two containers on one kernel share the
 * boot id but not the namespace; two hosts may share a name). DDP_HOST_ID overrides, so tests
 * can fake several hosts on one machine (DDP_TEST_HOSTS, for the hierarchical algorithms'
 * layout only, is read where the layout is made). */
_DDP_PRIVATE void _ddp_host_id(char *out, size_t cap) {
    char boot[64] = "", host[64] = "", ns[64] = "";
    const char *env = getenv("DDP_HOST_ID");
    FILE *f;
    ssize_t n;
    if (env && *env) { _ddp_strlcpy(out, env, cap); return; }
    f = fopen("/proc/sys/kernel/random/boot_id", "r");
    if (f) {
        if (!fgets(boot, sizeof boot, f)) boot[0] = 0;
        fclose(f);
        boot[strcspn(boot, "\n")] = 0;
    }
    gethostname(host, sizeof host - 1);
    n = readlink("/proc/self/ns/net", ns, sizeof ns - 1);
    ns[n > 0 ? n : 0] = 0;
    snprintf(out, cap, "%.63s|%.40s|%.40s", host, boot, ns);
}

typedef struct {
    int rank, nranks, local_rank, local_size;
    char err[256];
} _ddp_env_ranks_t;

/* torchrun's names first, then Open MPI, PMI (MPICH/Intel MPI), Slurm. */
_DDP_PRIVATE ddp_result_t _ddp_ranks_from_env(_ddp_env_ranks_t *e) {
    static const char *const sets[][4] = {
        {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"},
        {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"},
        {"PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"},
        {"SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE"},
    };
    size_t i;
    e->local_rank = e->local_size = -1;
    for (i = 0; i < sizeof sets / sizeof sets[0]; i++) {
        long r, n, v;
        int hr = _ddp_env_int(sets[i][0], 0, INT_MAX - 1, &r);
        int hn = _ddp_env_int(sets[i][1], 1, INT_MAX, &n);
        if (hr == 0 && hn == 0) continue;
        if (hr < 0) { snprintf(e->err, sizeof e->err, "%s='%s' is not a rank (a whole number >= 0)", sets[i][0], getenv(sets[i][0])); return DDP_ERR_INVALID_ARGUMENT; }
        if (hn < 0) { snprintf(e->err, sizeof e->err, "%s='%s' is not a world size (a whole number >= 1)", sets[i][1], getenv(sets[i][1])); return DDP_ERR_INVALID_ARGUMENT; }
        if (hr == 0) { snprintf(e->err, sizeof e->err, "%s is set but %s is missing", sets[i][1], sets[i][0]); return DDP_ERR_INVALID_ARGUMENT; }
        if (hn == 0) { snprintf(e->err, sizeof e->err, "%s is set but %s is missing", sets[i][0], sets[i][1]); return DDP_ERR_INVALID_ARGUMENT; }
        if (r >= n) { snprintf(e->err, sizeof e->err, "%s=%ld is not below %s=%ld", sets[i][0], r, sets[i][1], n); return DDP_ERR_INVALID_ARGUMENT; }
        e->rank = (int)r;
        e->nranks = (int)n;
        if (_ddp_env_int(sets[i][2], 0, INT_MAX, &v) == 1) e->local_rank = (int)v;
        if (_ddp_env_int(sets[i][3], 1, INT_MAX, &v) == 1) e->local_size = (int)v;
        return DDP_SUCCESS;
    }
    snprintf(e->err, sizeof e->err, "no rank in the environment");
    return DDP_ERR_UNSUPPORTED;   /* the caller makes it a world of one */
}

/* Publishes the first failure of this communicator so that ranks which only see a closed
 * connection can tell the user where it started. Best effort, short timeout. */
_DDP_PRIVATE void _ddp_publish_failure(ddp_comm_t *c) {
    char key[256], cur[8];
    size_t curlen = 0;
    if (!c->store || c->foreign) return;   /* another job's store is not ours to write */
    _ddp_key(c, key, sizeof key, "abort");
    _ddp_store_quick(c->store, 1);
    ddp_store_compare_set(c->store, key, NULL, 0, c->last_error, strlen(c->last_error), cur,
                          sizeof cur, &curlen);
    _ddp_store_quick(c->store, 0);
}

/* A healthy communicator being destroyed leaves a note (the first rank to leave wins): a peer
 * still inside a call then sees a closed connection and can say who left, after how many calls,
 * instead of "connection reset by peer" (uneven inputs: one rank stopped calling early). */
_DDP_PRIVATE void _ddp_say_goodbye(ddp_comm_t *c) {
    char key[256], msg[96], cur[8];
    size_t curlen = 0;
    if (!c->store || c->foreign || c->forked || c->eng.nranks < 2 ||
        __atomic_load_n(&c->error, __ATOMIC_SEQ_CST) != DDP_SUCCESS)
        return;
    snprintf(msg, sizeof msg, "%d %u", c->eng.rank, c->eng.seq);
    _ddp_key(c, key, sizeof key, "bye");
    _ddp_store_quick(c->store, 1);
    ddp_store_compare_set(c->store, key, NULL, 0, msg, strlen(msg), cur, sizeof cur, &curlen);
    _ddp_store_quick(c->store, 0);
}

/* A rank that destroyed its communicator before the call this rank is in: its note, appended
 * to this rank's error. 1 if there was one. */
_DDP_PRIVATE int _ddp_add_goodbye(ddp_comm_t *c) {
    char key[256], note[64];
    size_t len = 0, n = strlen(c->last_error);
    int exists = 0, who = -1;
    unsigned calls = 0;
    _ddp_key(c, key, sizeof key, "bye");
    if (ddp_store_check(c->store, key, &exists) != DDP_SUCCESS || !exists ||
        ddp_store_get(c->store, key, note, sizeof note - 1, &len) != DDP_SUCCESS)
        return 0;
    note[len < sizeof note ? len : sizeof note - 1] = 0;
    if (sscanf(note, "%d %u", &who, &calls) != 2 || who == c->eng.rank || calls >= c->eng.seq) return 0;
    if (n + 32 < sizeof c->last_error)
        snprintf(c->last_error + n, sizeof c->last_error - n, "; rank %d destroyed its communicator "
                 "after %u calls; this rank is in call %u (every rank must make the same calls: "
                 "uneven inputs?)", who, calls, c->eng.seq);
    return 1;
}

/* Appends the first failure published by another rank, if any, to this rank's error.
 * Returns 1 if there was one, 2 if it was a disagreement (DDP_ERR_MISMATCH). */
_DDP_PRIVATE int _ddp_add_root_cause(ddp_comm_t *c) {
    char key[256], why[512];
    size_t len = 0, n = strlen(c->last_error);
    int exists = 0;
    ddp_result_t r;
    if (!c->store) return 0;
    _ddp_key(c, key, sizeof key, "abort");
    _ddp_store_quick(c->store, 1);
    r = ddp_store_check(c->store, key, &exists);
    if (r == DDP_SUCCESS && exists &&
        ddp_store_get(c->store, key, why, sizeof why - 1, &len) == DDP_SUCCESS) {
        why[len < sizeof why - 1 ? len : sizeof why - 1] = 0;
        if (strstr(c->last_error, why) == NULL && n + 32 < sizeof c->last_error)
            snprintf(c->last_error + n, sizeof c->last_error - n, "; first failure: %s", why);
        if (strstr(why, ddp_strerror(DDP_ERR_MISMATCH))) exists = 2;
    } else if (r == DDP_SUCCESS && _ddp_add_goodbye(c)) {
        exists = 1;
    } else if (r == DDP_ERR_REMOTE && c->eng.rank != 0 && n + 32 < sizeof c->last_error) {
        /* The store lives in rank 0: losing it too means rank 0 is gone, most likely first. */
        snprintf(c->last_error + n, sizeof c->last_error - n, "; rank 0 is gone as well (its "
                 "rendezvous store no longer answers): it probably failed first");
        exists = 1;
    }
    _ddp_store_quick(c->store, 0);
    return exists;
}

_DDP_PRIVATE void _ddp_close_peers(ddp_comm_t *c) {
    int i;
    if (!c->peers) return;
    for (i = 0; i < c->eng.nranks; i++) {
        _ddp_peer_t *p = &c->peers[i];
        if (p->conn && p->tinst >= 0) c->tinst[p->tinst].t->close(p->conn);
        p->conn = NULL;
    }
}

/* A collective failed: make the error sticky, tell the others (closing our connections wakes
 * every neighbour with EOF at once instead of after a timeout), and say where it started. */
_DDP_PRIVATE ddp_result_t _ddp_comm_poison(ddp_comm_t *c, ddp_result_t r) {
    int cause = 0;
    if (r == DDP_SUCCESS) return r;
    if (r == DDP_ERR_REMOTE) cause = _ddp_add_root_cause(c);
    if (!cause) _ddp_publish_failure(c);
    /* A peer that left because the ranks called different things: this rank's call was part of
     * the disagreement too, so it says so (the failure is published before the connections
     * close, so whoever sees them close finds it). */
    if (cause == 2) r = DDP_ERR_MISMATCH;
    __atomic_store_n(&c->error, r, __ATOMIC_SEQ_CST);
    _ddp_close_peers(c);
    _DDP_LOG(c, DDP_LOG_WARN, "communicator is now unusable: %s", c->last_error);
    return r;
}

/* Connects to each listed peer (lower rank connects, higher accepts), all at once, within
 * the timeout. */
_DDP_PRIVATE ddp_result_t _ddp_connect_peers(ddp_comm_t *c, const int *list, int n) {
    int64_t deadline = _ddp_deadline(c->eng.timeout_ms);
    int pending, i, nap_us = 200;
    for (;;) {
        int progressed = 0;
        pending = 0;
        for (i = 0; i < n; i++) {
            int peer = list ? list[i] : i;   /* NULL: everyone */
            _ddp_peer_t *p = &c->peers[peer];
            const ddp_transport_t *t;
            ddp_result_t r;
            if (p->conn || peer == c->eng.rank) continue;
            t = c->tinst[p->tinst].t;
            r = c->eng.rank < peer ? t->connect(c->tinst[p->tinst].state, peer, &p->conn)
                               : t->accept(c->tinst[p->tinst].state, peer, &p->conn);
            if (r != DDP_SUCCESS) return r;
            if (p->conn) {
                progressed = 1;
                _DDP_LOG(c, DDP_LOG_INFO, "connected to rank %d via %s", peer, t->name);
            } else {
                pending++;
            }
        }
        if (!pending) return DDP_SUCCESS;
        if (_ddp_ms_left(deadline) == 0) {
            char who[256] = "";
            size_t off = 0;
            for (i = 0; i < n && off + 12 < sizeof who; i++) {
                int peer = list ? list[i] : i;
                if (!c->peers[peer].conn && peer != c->eng.rank)
                    off += (size_t)snprintf(who + off, sizeof who - off, "%s%d", off ? "," : "", peer);
            }
            return ddp_comm_fail(c, DDP_ERR_TIMEOUT, "init: no connection with rank(s) %s after "
                                 "%d ms (phase connect)", who, c->eng.timeout_ms);
        }
        /* Nothing moved: nap, longer each time (to 10 ms). A fixed 200 us nap made 1,024 ranks
         * on 2 cores ask for 5 million wake-ups a second, starving the peers and the store
         * they wait for: init grew with the square of the ranks. */
        if (progressed) nap_us = 200;
        else {
            usleep((useconds_t)nap_us);
            if (nap_us < 10000) nap_us *= 2;
        }
    }
}

DDP_API ddp_result_t ddp_comm_destroy(ddp_comm_t *c) {
    int i;
    ddp_allocator_t a;
    if (!c) return DDP_ERR_INVALID_ARGUMENT;
    if (!_ddp_live_check(c, 0)) return DDP_ERR_INVALID_USAGE;
    /* A fork child's copy: release what this process holds (memory, descriptors, mappings),
     * nothing the parent still uses; the threads stayed in the parent. */
    c->forked = _ddp_forked(c);
    _DDP_LOG(c, DDP_LOG_INFO, "destroying communicator%s", c->forked ? " (a fork child's copy)" : "");
    if (c->forked) c->progress_on = 0;
    if (c->progress_on) {
        /* Requests still queued run first (the peers run them too); then the threads end. */
        pthread_mutex_lock(&c->amu);
        c->progress_stop = 1;
        pthread_cond_broadcast(&c->acv);
        pthread_mutex_unlock(&c->amu);
        for (i = 0; i < c->nlanes; i++) pthread_join(c->lanes[i].thread, NULL);
        c->progress_on = 0;
    }
    for (i = 1; i < c->nlanes; i++) ddp_comm_destroy(c->lanes[i].exec);
    c->nlanes = 0;
    if (!_ddp_live_check(c, 1)) return DDP_ERR_INVALID_USAGE;   /* destroyed by another thread */
    _ddp_say_goodbye(c);
    _ddp_close_peers(c);   /* transports see tctx.forked */
    if (c->dev_inherited && c->dev_any && c->dev_any->release_inherited && !c->forked)
        c->dev_any->release_inherited(c->dev_any_state, c->dev_inherited);
    for (i = 0; i < c->ntinst; i++)
        if (c->tinst[i].state) c->tinst[i].t->finalize(c->tinst[i].state);
    if (c->forked) {
        if (c->store && c->own_store) _ddp_store_forget(c->store);
        if (c->extra_store) _ddp_store_forget(c->extra_store);
    } else {
        if (c->store && c->own_store) ddp_store_close(c->store);
        /* ddp_comm_init_threads' private server: its clients are this process's other ranks,
         * which need it no more (any destroy order returns at once, as NCCL's ncclCommInitAll
         * users destroy 0..n-1 from one thread). */
        if (c->extra_store) _ddp_store_close_within(c->extra_store, 0);
    }
    a = c->alloc;
    _ddp_auth_wipe(c->token, sizeof c->token);
    _ddp_auth_wipe(c->data_key, sizeof c->data_key);
    _ddp_free(&a, c->peers);
    _ddp_free(&a, c->p2p);
    _ddp_free(&a, c->group_ops);
    _ddp_free(&a, c->fuse_buf);
    _ddp_free(&a, c->dev_prints);
    /* The parent's trace file: a child's fclose would write the parent's buffered lines again
     * (the FILE and its descriptor are left to the child's exit). */
    if (c->forked) c->trace.file = NULL;
    if (c->trace_open) _ddp_trace_close(&c->trace, &a);
    _ddp_free(&a, c->host_ids);
    _ddp_free(&a, c->hier_ranks);
    _ddp_free(&a, c->host_of);
    _ddp_free(&a, c->eng.scratch);
    _ddp_free(&a, c->ops);
    if (c->async_init && !c->forked) {   /* a progress thread's lock may be copied held */
        pthread_mutex_destroy(&c->amu);
        pthread_cond_destroy(&c->acv);
        pthread_cond_destroy(&c->adone);
    }
    if (c->log_file) close(c->log.fd);
    _ddp_free(&a, c);
    return DDP_SUCCESS;
}

/* A setting every rank must share: the first to publish it under key decides; another value
 * is DDP_ERR_MISMATCH, told with fmt (this rank's %d, then the first rank's %s). */
_DDP_PRIVATE ddp_result_t _ddp_rendezvous_agree(ddp_comm_t *c, const char *name, int mine, const char *fmt) {
    char key[256], val[64], want[32];
    size_t len = 0;
    ddp_result_t r;
    _ddp_key(c, key, sizeof key, "%s", name);
    snprintf(want, sizeof want, "%d", mine);
    r = ddp_store_compare_set(c->store, key, NULL, 0, want, strlen(want), val, sizeof val - 1, &len);
    if (r != DDP_SUCCESS) return ddp_comm_fail(c, r, "init: rendezvous: %s", ddp_store_last_error(c->store));
    val[len < sizeof val ? len : sizeof val - 1] = 0;
    if (strcmp(val, want) == 0) return DDP_SUCCESS;
    {
        char msg[512];
#if defined(__GNUC__) || defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wformat-nonliteral"
#endif
        snprintf(msg, sizeof msg, fmt, mine, val);
#if defined(__GNUC__) || defined(__clang__)
#pragma GCC diagnostic pop
#endif
        r = ddp_comm_fail(c, DDP_ERR_MISMATCH, "init: %s", msg);
    }
    _ddp_publish_failure(c);
    return r;
}

/* The key every data connection proves knowledge of (challenge-response, ddp_auth.h): rank 0's
 * random per-communicator token, handed out through the store, bound to the job secret when
 * there is one (then a token seen on the wire is useless without the secret). The store holds
 * the secret already stretched (ddp_auth.h: _ddp_auth_job_key), so a guess checked against a
 * captured data handshake costs the same as one against the store's. */
_DDP_PRIVATE void _ddp_derive_data_key(ddp_comm_t *c) {
    if (c->store && c->store->keylen) {
        _ddp_hmac_sha256_t h;
        _ddp_hmac_sha256_init(&h, c->store->key, c->store->keylen);
        _ddp_hmac_sha256_update(&h, "ddp data key v1", 15);
        _ddp_hmac_sha256_update(&h, c->token, sizeof c->token);
        _ddp_hmac_sha256_final(&h, c->data_key);
        _ddp_auth_wipe(&h, sizeof h);
    } else {
        memcpy(c->data_key, c->token, sizeof c->data_key);
    }
}

/* Who has not joined yet, from the join masks (a few reads, not one per rank), written as ranks:
 * "ranks 2, 5-7" (at most `cap` bytes, then "and N more"). Returns the store's error, if any. */
#define _DDP_JOINMASK_BITS 62
_DDP_PRIVATE ddp_result_t _ddp_rendezvous_absent(ddp_comm_t *c, char *out, size_t cap, int *nmissing) {
    char key[256];
    size_t off = 0;
    int g, shown = 0, run_start = -1, run_end = -1, more = 0;
    const int groups = (c->eng.nranks + _DDP_JOINMASK_BITS - 1) / _DDP_JOINMASK_BITS;
    *nmissing = 0;
    out[0] = 0;
    for (g = 0; g <= groups; g++) {
        int64_t mask = 0;
        int b;
        if (g < groups) {
            ddp_result_t r;
            _ddp_key(c, key, sizeof key, "joinmask/%d", g);
            if ((r = ddp_store_add(c->store, key, 0, &mask)) != DDP_SUCCESS) return r;   /* adding 0 reads */
        }
        for (b = 0; b < _DDP_JOINMASK_BITS; b++) {
            const int rank = g * _DDP_JOINMASK_BITS + b, absent = g < groups && rank < c->eng.nranks &&
                             !(mask & ((int64_t)1 << b));
            if (absent) {
                ++*nmissing;
                if (run_start >= 0 && rank == run_end + 1) { run_end = rank; continue; }
            }
            if (run_start >= 0) {   /* a run of absent ranks ended: write it */
                if (off + 32 < cap) {
                    off += (size_t)snprintf(out + off, cap - off, run_end > run_start ? "%s%d-%d" : "%s%d",
                                            shown ? ", " : "", run_start, run_end);
                    shown++;
                } else {
                    more += run_end - run_start + 1;
                }
                run_start = -1;
            }
            if (absent) run_start = run_end = rank;
            if (g == groups) break;
        }
    }
    if (more && off + 24 < cap) snprintf(out + off, cap - off, " and %d more", more);
    return DDP_SUCCESS;
}

/* "rank 2" or "ranks 2, 5-7". */
_DDP_PRIVATE const char *_ddp_ranks_word(int n) { return n == 1 ? "rank" : "ranks"; }

/* The rendezvous timed out waiting for "ready": who is missing, in what the deadline left (the
 * ready wait kept a slice for it). Whether the store answers at all is what tells a stopped,
 * overloaded or unreachable rank 0 from ranks that never came. */
_DDP_PRIVATE ddp_result_t _ddp_rendezvous_missing(ddp_comm_t *c) {
    char missing[400];
    int nmissing = 0;
    if (_ddp_rendezvous_absent(c, missing, sizeof missing, &nmissing) != DDP_SUCCESS)
        return ddp_comm_fail(c, DDP_ERR_TIMEOUT, "init: rendezvous at %s:%d: rank 0's store does "
                             "not answer: no rendezvous within %d ms, then no answer to a query "
                             "(rank 0 stopped, hung, overloaded or out of descriptors, or cut off "
                             "from this host)", c->master_addr, c->master_port, c->eng.timeout_ms);
    if (!nmissing)
        return ddp_comm_fail(c, DDP_ERR_TIMEOUT, "init: rendezvous at %s:%d: no rendezvous within %d "
                             "ms, yet every rank joined as the wait ended", c->master_addr,
                             c->master_port, c->eng.timeout_ms);
    return ddp_comm_fail(c, DDP_ERR_TIMEOUT, "init: rendezvous at %s:%d: %d of %d ranks never joined "
                         "within %d ms: %s %s (check WORLD_SIZE and that every rank was started)",
                         c->master_addr, c->master_port, nmissing, c->eng.nranks, c->eng.timeout_ms,
                         _ddp_ranks_word(nmissing), missing);
}

/* What is left of the rendezvous' deadline, less `keep` ms kept for what follows; at least 1
 * (0 would mean the store's own timeout). */
_DDP_PRIVATE int _ddp_init_ms_left(const ddp_comm_t *c, int keep) {
    int left = _ddp_ms_left(c->init_deadline_us);
    if (left < 0) return -1;   /* no deadline: wait forever */
    left -= keep;
    return left < 1 ? 1 : left;
}

/* Rendezvous, phase 1: rank 0 says which job this store serves; a rank of another job that
 * reached it (two jobs on one host and port) is refused here, naming both, before it counts in. */
_DDP_PRIVATE ddp_result_t _ddp_rendezvous_job(ddp_comm_t *c) {
    char key[256];
    ddp_result_t r;
    _ddp_key(c, key, sizeof key, "job");
    if (c->eng.rank == 0) {
        r = ddp_store_set(c->store, key, c->job, strlen(c->job));
    } else {
        char theirs[sizeof c->job];
        size_t len = 0;
        r = ddp_store_get(c->store, key, theirs, sizeof theirs - 1, &len);
        if (r == DDP_SUCCESS) {
            theirs[len < sizeof theirs ? len : sizeof theirs - 1] = 0;
            if (strcmp(theirs, c->job) != 0) {
                c->foreign = 1;   /* not our store: leave its job alone (no failure published) */
                return ddp_comm_fail(c, DDP_ERR_MISMATCH, "init: this rank belongs to job '%s' but the "
                                     "store at %s:%d serves job '%s': two jobs met on one port; give "
                                     "each job its own MASTER_PORT", c->job[0] ? c->job : "(none)",
                                     c->master_addr, c->master_port, theirs[0] ? theirs : "(none)");
            }
        }
    }
    if (r != DDP_SUCCESS) return ddp_comm_fail(c, r, "init: rendezvous: %s", ddp_store_last_error(c->store));
    /* World size, and DDP_ASYNC_LANES (each rank opens that many connection sets at init):
     * the first rank decides; anyone who disagrees fails loudly. */
    if ((r = _ddp_rendezvous_agree(c, "world_size", c->eng.nranks, "world size disagreement: this rank "
                                   "was started with world size %d, the job's first rank with %s")) != DDP_SUCCESS ||
        (r = _ddp_rendezvous_agree(c, "async_lanes", c->want_lanes, "DDP_ASYNC_LANES is %d on this "
                                   "rank, %s on the job's first rank: set it the same everywhere")) != DDP_SUCCESS)
        return r;
    return DDP_SUCCESS;
}

/* Phase 2: this rank counts once, sets its join-mask bit, publishes its host; rank 0 draws the
 * communicator's identity (id and connection token). */
_DDP_PRIVATE ddp_result_t _ddp_rendezvous_register(ddp_comm_t *c, const char *host) {
    char key[256];
    int64_t n;
    ddp_result_t r;
    _ddp_key(c, key, sizeof key, "rank/%d", c->eng.rank);
    r = ddp_store_add(c->store, key, 1, &n);
    if (r != DDP_SUCCESS) return ddp_comm_fail(c, r, "init: rendezvous: %s", ddp_store_last_error(c->store));
    if (n > 1) {
        r = ddp_comm_fail(c, DDP_ERR_INVALID_USAGE, "init: rank %d joined twice (two processes "
                          "were given RANK=%d)", c->eng.rank, c->eng.rank);
        _ddp_publish_failure(c);
        return r;
    }
    /* This rank's bit in its group's join mask (a sum of distinct powers of two is their OR):
     * a timed-out rendezvous names the missing ranks from a few reads, not one per rank. */
    _ddp_key(c, key, sizeof key, "joinmask/%d", c->eng.rank / _DDP_JOINMASK_BITS);
    r = ddp_store_add(c->store, key, (int64_t)1 << (c->eng.rank % _DDP_JOINMASK_BITS), NULL);
    if (r != DDP_SUCCESS) return ddp_comm_fail(c, r, "init: rendezvous: %s", ddp_store_last_error(c->store));
    {   /* host/N: the host's identity (NUL-padded) and the CPUs this rank may use */
        unsigned char entry[_DDP_HOST_ENTRY];
        memset(entry, 0, sizeof entry);
        memcpy(entry, host, strlen(host) < _DDP_HOST_ID_LEN ? strlen(host) : _DDP_HOST_ID_LEN - 1);
        _ddp_cpu_mask(entry + _DDP_HOST_ID_LEN);
        _ddp_key(c, key, sizeof key, "host/%d", c->eng.rank);
        if ((r = ddp_store_set(c->store, key, entry, sizeof entry)) != DDP_SUCCESS)
            return ddp_comm_fail(c, r, "init: rendezvous: %s", ddp_store_last_error(c->store));
    }
    if (c->eng.rank == 0) {
        unsigned char ident[8 + _DDP_AUTH_KEY_BYTES];
        c->tctx.comm_id = _ddp_random64();
        if (_ddp_auth_random(c->token, sizeof c->token) != 0)
            return ddp_comm_fail(c, DDP_ERR_SYSTEM, "init: no random bytes for the connection token");
        memcpy(ident, &c->tctx.comm_id, 8);
        memcpy(ident + 8, c->token, sizeof c->token);
        _ddp_key(c, key, sizeof key, "comm_id");
        r = ddp_store_set(c->store, key, ident, sizeof ident);
        _ddp_auth_wipe(ident, sizeof ident);
        if (r != DDP_SUCCESS)
            return ddp_comm_fail(c, r, "init: rendezvous: %s", ddp_store_last_error(c->store));
        _ddp_derive_data_key(c);
    }
    return DDP_SUCCESS;
}

/* Phase 3: the transports listen and publish their addresses before this rank counts itself in. */
_DDP_PRIVATE ddp_result_t _ddp_rendezvous_transports(ddp_comm_t *c, const char *forced) {
    char why_none[512] = "";
    int i;
    for (i = 0; i < _ddp_ntransports && c->ntinst < _DDP_MAX_TRANSPORTS; i++) {
        const ddp_transport_t *t = _ddp_transports[i];
        void *state = NULL;
        ddp_result_t r;
        /* DDP_TRANSPORT picks the host transport; a device one (NCCL) is for device buffers */
        if (forced && strcmp(forced, t->name) != 0 && !t->device) continue;
        c->init_probe = !forced;
        r = t->init(&c->tctx, &state);
        c->init_probe = 0;
        if (r != DDP_SUCCESS) {
            if (forced) return r;
            /* One line, with the reason; the communicator goes on without it. */
            _DDP_LOG(c, DDP_LOG_WARN, "transport %s unavailable, using the others (%s): %s",
                     t->name, "DDP_TRANSPORT=auto", c->last_error);
            _ddp_strlcpy(why_none, c->last_error, sizeof why_none);
            c->last_error[0] = 0;   /* not this communicator's error: init goes on */
            continue;
        }
        c->tinst[c->ntinst].t = t;
        c->tinst[c->ntinst].state = state;
        c->ntinst++;
    }
    if (c->ntinst == 0 && c->eng.nranks > 1)
        return ddp_comm_fail(c, DDP_ERR_UNSUPPORTED, "init: no usable transport (%s)",
                             why_none[0] ? why_none : "none compiled in: include transports/ddp_tcp.h");
    return DDP_SUCCESS;
}

_DDP_PRIVATE int _ddp_torchrun_agent_store(void);

/* "2 of 3 ranks joined after 30 s; still waiting for rank 2": said at WARN while the ready
 * wait lasts, by every waiting rank (and the rank hosting the store says so). */
_DDP_PRIVATE void _ddp_rendezvous_note(ddp_comm_t *c, int64_t waited_ms) {
    char missing[400];
    int nmissing = 0;
    const int hosts = c->own_store && c->eng.rank == 0 && !_ddp_torchrun_agent_store();
    if (_ddp_rendezvous_absent(c, missing, sizeof missing, &nmissing) != DDP_SUCCESS)
        _DDP_LOG(c, DDP_LOG_WARN, "init: waiting %lld s for the rendezvous at %s:%d%s; the store does "
                 "not answer a query", (long long)(waited_ms / 1000), c->master_addr, c->master_port,
                 hosts ? " (this rank hosts the store)" : "");
    else if (nmissing)
        _DDP_LOG(c, DDP_LOG_WARN, "init: %d of %d ranks joined the rendezvous at %s:%d%s after %lld s; "
                 "still waiting for %s %s (check WORLD_SIZE and that every rank was started)",
                 c->eng.nranks - nmissing, c->eng.nranks, c->master_addr, c->master_port,
                 hosts ? " (hosted by this rank)" : "", (long long)(waited_ms / 1000),
                 _ddp_ranks_word(nmissing), missing);
}

/* Phase 4: count in, then wait until every rank has (or one aborted the rendezvous). */
_DDP_PRIVATE ddp_result_t _ddp_rendezvous_wait(ddp_comm_t *c) {
    char k_ready[256], k_abort[256];
    const char *keys[2];
    int64_t joined = 0, t0 = _ddp_now_us(), waited_ms = 0;
    int keep = c->eng.timeout_ms / 10, ex = 0;
    ddp_result_t r;
    _ddp_key(c, k_ready, sizeof k_ready, "ready");
    _ddp_key(c, k_abort, sizeof k_abort, "abort");
    keys[0] = k_ready; keys[1] = k_abort;
    {
        char key[256];
        _ddp_key(c, key, sizeof key, "joined");
        if ((r = ddp_store_add(c->store, key, 1, &joined)) != DDP_SUCCESS)
            return ddp_comm_fail(c, r, "init: rendezvous: %s", ddp_store_last_error(c->store));
    }
    _DDP_LOG(c, DDP_LOG_INFO, "joined rendezvous at %s:%d as rank %d of %d (%lld joined so far)",
             c->master_addr, c->master_port, c->eng.rank, c->eng.nranks, (long long)joined);
    if (joined == c->eng.nranks && (r = ddp_store_set(c->store, k_ready, "1", 1)) != DDP_SUCCESS)
        return ddp_comm_fail(c, r, "init: rendezvous: %s", ddp_store_last_error(c->store));
    /* A slice of the deadline is kept to ask who is missing (a tenth, 100 ms to 1 s). */
    keep = keep < 100 ? 100 : keep > 1000 ? 1000 : keep;
    for (;;) {
        const int left = _ddp_init_ms_left(c, keep);
        const int64_t note = _ddp_next_wait_note_ms(waited_ms) - waited_ms;
        const int slice = left >= 0 && left <= note ? left : (int)(note < 1 ? 1 : note);
        r = _ddp_store_wait_keys(c->store, keys, 2, slice, 1);
        waited_ms = (_ddp_now_us() - t0) / 1000;
        if (r != DDP_ERR_TIMEOUT || slice == left) break;
        _ddp_rendezvous_note(c, waited_ms);   /* the wait goes on: say for whom */
    }
    if (r == DDP_ERR_TIMEOUT) {
        /* A store init did not open is bounded only while it is asked who is missing. */
        if (!c->own_store && c->init_deadline_us) _ddp_store_bound(c->store, c->init_deadline_us);
        r = _ddp_rendezvous_missing(c);
        if (!c->own_store) _ddp_store_bound(c->store, 0);
        return r;
    }
    if (r != DDP_SUCCESS) return ddp_comm_fail(c, r, "init: rendezvous: %s", ddp_store_last_error(c->store));
    if (ddp_store_check(c->store, k_abort, &ex) == DDP_SUCCESS && ex) {
        char why[512];
        size_t len = 0;
        ddp_store_get(c->store, k_abort, why, sizeof why - 1, &len);
        why[len < sizeof why ? len : sizeof why - 1] = 0;
        return ddp_comm_fail(c, DDP_ERR_REMOTE, "init: rendezvous aborted by another rank: %s", why);
    }
    return DDP_SUCCESS;
}

/* Phase 5 (ranks but 0): the communicator's identity that rank 0 drew. */
_DDP_PRIVATE ddp_result_t _ddp_rendezvous_identity(ddp_comm_t *c) {
    unsigned char ident[8 + _DDP_AUTH_KEY_BYTES];
    char key[256];
    size_t len = 0;
    ddp_result_t r;
    _ddp_key(c, key, sizeof key, "comm_id");
    if ((r = ddp_store_get(c->store, key, ident, sizeof ident, &len)) != DDP_SUCCESS)
        return ddp_comm_fail(c, r, "init: rendezvous: %s", ddp_store_last_error(c->store));
    if (len != sizeof ident)
        return ddp_comm_fail(c, DDP_ERR_MISMATCH, "init: rendezvous: the communicator's identity "
                             "has %zu bytes, expected %zu (mixed libddp versions?)", len, sizeof ident);
    memcpy(&c->tctx.comm_id, ident, 8);
    memcpy(c->token, ident + 8, sizeof c->token);
    _ddp_auth_wipe(ident, sizeof ident);
    _ddp_derive_data_key(c);
    return DDP_SUCCESS;
}

/* Phase 6: every rank's host, for local rank/size and for transports that reach same-host peers
 * only, and the CPUs this host's ranks may use together (the union of their affinity masks: a
 * launcher that binds each rank to its own core, as mpirun does, leaves each one CPU, yet the
 * ranks are not oversubscribed). Rank 0 collects the table once and publishes it whole; everyone
 * else reads one value: O(n) store requests in all instead of every rank asking for every host
 * (O(n^2): a million requests at 1,024 ranks). */
_DDP_PRIVATE ddp_result_t _ddp_rendezvous_table(ddp_comm_t *c, unsigned char *table, size_t bytes) {
    char key[256];
    size_t len = 0;
    int i;
    ddp_result_t r;
    _ddp_key(c, key, sizeof key, "hosts");
    if (c->eng.rank == 0) {
        for (i = 0; i < c->eng.nranks; i++) {
            char hk[256];
            _ddp_key(c, hk, sizeof hk, "host/%d", i);
            len = 0;
            if ((r = ddp_store_get(c->store, hk, table + (size_t)i * _DDP_HOST_ENTRY, _DDP_HOST_ENTRY, &len)) != DDP_SUCCESS)
                return ddp_comm_fail(c, r, "init: rendezvous: %s", ddp_store_last_error(c->store));
            if (len != _DDP_HOST_ENTRY)
                return ddp_comm_fail(c, DDP_ERR_MISMATCH, "init: rendezvous: rank %d's host entry has %zu "
                                     "bytes, expected %d (mixed libddp versions?)", i, len, _DDP_HOST_ENTRY);
        }
        r = ddp_store_set(c->store, key, table, bytes);
    } else {
        r = ddp_store_get(c->store, key, table, bytes, &len);
        if (r == DDP_SUCCESS && len != bytes)
            return ddp_comm_fail(c, DDP_ERR_MISMATCH, "init: rendezvous: the host table has %zu bytes, "
                                 "expected %zu", len, bytes);
    }
    if (r != DDP_SUCCESS) return ddp_comm_fail(c, r, "init: rendezvous: %s", ddp_store_last_error(c->store));
    return DDP_SUCCESS;
}

_DDP_PRIVATE ddp_result_t _ddp_rendezvous_hosts(ddp_comm_t *c, const char *host) {
    const size_t bytes = (size_t)c->eng.nranks * _DDP_HOST_ENTRY;
    unsigned char *table, cpus[_DDP_CPU_MASK_BYTES];
    int i, k, lr = 0, ls = 0;
    ddp_result_t r;
    c->host_ids = (char *)_ddp_calloc(&c->alloc, (size_t)c->eng.nranks * _DDP_HOST_ID_LEN);
    table = (unsigned char *)_ddp_calloc(&c->alloc, bytes);
    if (!c->host_ids || !table) {
        _ddp_free(&c->alloc, table);
        return ddp_comm_fail(c, DDP_ERR_OUT_OF_MEMORY, "init: host table");
    }
    if ((r = _ddp_rendezvous_table(c, table, bytes)) != DDP_SUCCESS) {
        _ddp_free(&c->alloc, table);
        return r;
    }
    memset(cpus, 0, sizeof cpus);
    for (i = 0; i < c->eng.nranks; i++) {
        const unsigned char *e = table + (size_t)i * _DDP_HOST_ENTRY;
        char *h = c->host_ids + (size_t)i * _DDP_HOST_ID_LEN;
        memcpy(h, e, _DDP_HOST_ID_LEN - 1);
        h[_DDP_HOST_ID_LEN - 1] = 0;
        if (strcmp(h, host) != 0) continue;
        if (i < c->eng.rank) lr++;
        ls++;
        for (k = 0; k < _DDP_CPU_MASK_BYTES; k++) cpus[k] = (unsigned char)(cpus[k] | e[_DDP_HOST_ID_LEN + k]);
    }
    _ddp_free(&c->alloc, table);
    if (c->local_rank < 0) c->local_rank = lr;
    if (c->local_size < 0) c->local_size = ls;
    c->tctx.host_cpus = _ddp_cpu_mask_count(cpus);
    /* Across hosts without a secret the store and the token are readable by anyone who can
     * reach MASTER_PORT: say so once (rank 0), with the fix. */
    if (c->eng.rank == 0 && c->store && !c->store->keylen) {
        int other = 0;
        for (i = 1; i < c->eng.nranks && !other; i++)
            other = strcmp(c->host_ids + (size_t)i * _DDP_HOST_ID_LEN, c->host_ids) != 0;
        if (other)
            _DDP_LOG(c, DDP_LOG_WARN, "ranks span several hosts and no job secret is set: anyone who "
                     "can reach %s:%d can read the rendezvous store, join this job and see or alter "
                     "its data; set the same DDP_JOB_SECRET on every rank (ddprun makes one per job) "
                     "or desc.job_secret", c->master_addr, c->master_port);
    }
    return DDP_SUCCESS;
}

_DDP_PRIVATE ddp_result_t _ddp_rendezvous(ddp_comm_t *c, const char *forced) {
    char host[_DDP_HOST_ID_LEN];
    ddp_result_t r;
    c->tctx.key_from_secret = c->store && c->store->keylen;   /* before any transport's init */
    _ddp_host_id(host, sizeof host);
    if ((r = _ddp_rendezvous_job(c)) != DDP_SUCCESS ||
        (r = _ddp_rendezvous_register(c, host)) != DDP_SUCCESS ||
        (r = _ddp_rendezvous_transports(c, forced)) != DDP_SUCCESS ||
        (r = _ddp_rendezvous_wait(c)) != DDP_SUCCESS ||
        (c->eng.rank != 0 && (r = _ddp_rendezvous_identity(c)) != DDP_SUCCESS))
        return r;
    return _ddp_rendezvous_hosts(c, host);
}

_DDP_PRIVATE ddp_result_t _ddp_lanes_create(ddp_comm_t *c);

/* What a communicator made from another one (an async lane, a split's child) takes from it;
 * all zero for ddp_comm_init. */
typedef struct {
    int is_lane;                /* a lane: never runs device calls, no lanes of its own */
    void **dev_inherited;       /* the device communicator of a split (adopted: set to NULL) */
    const int *split_hosts;     /* a split of a DDP_TEST_HOSTS layout: the members' host numbers,
                                 * in the new ranks' order */
} _ddp_parent_t;

_DDP_PRIVATE ddp_result_t _ddp_comm_init(ddp_comm_t **out, int nranks, int rank, const ddp_comm_desc_t *d,
                                         const _ddp_parent_t *from);

DDP_API ddp_result_t ddp_comm_init(ddp_comm_t **out, int nranks, int rank, const ddp_comm_desc_t *d) {
    _ddp_parent_t none;
    memset(&none, 0, sizeof none);
    return _ddp_comm_init(out, nranks, rank, d, &none);
}

/* Step 1: settings from the desc, else the environment, else measured defaults; the bounded
 * scratch and per-peer tables (the only allocations sized by the world). */
/* ---- the launcher's job: what keeps two jobs on one host apart
 * The job's identity as its launcher names it: torchrun's run id, Slurm's job and step, Open
 * MPI's job (PMIx namespace); "" when none says. */
_DDP_PRIVATE void _ddp_job_identity(char *out, size_t cap) {
    const char *v;
    out[0] = 0;
    if ((v = getenv("DDP_JOB_ID")) && *v) snprintf(out, cap, "%.120s", v);
    else if ((v = getenv("TORCHELASTIC_RUN_ID")) && *v && getenv("TORCHELASTIC_RESTART_COUNT"))
        snprintf(out, cap, "torchrun:%.100s/attempt_%.16s", v, getenv("TORCHELASTIC_RESTART_COUNT"));
    else if ((v = getenv("SLURM_JOB_ID")) && *v && getenv("SLURM_PROCID"))
        snprintf(out, cap, "slurm:%.40s.%.40s", v, getenv("SLURM_STEP_ID") ? getenv("SLURM_STEP_ID") : "0");
    else if ((v = getenv("PMIX_NAMESPACE")) && *v) snprintf(out, cap, "pmix:%.100s", v);
    else if ((v = getenv("OMPI_MCA_ess_base_jobid")) && *v) snprintf(out, cap, "ompi:%.100s", v);
    else if ((v = getenv("PMI_KVSNAME")) && *v) snprintf(out, cap, "pmi:%.100s", v);
}

/* The first host of a Slurm node list ("node[07-09,12],login1" -> "node07"); 0 if none. */
_DDP_PRIVATE int _ddp_slurm_first_host(const char *list, char *out, size_t cap) {
    size_t n = 0;
    const char *p = list;
    if (!list || !*list || cap < 2) return 0;
    while (*p && *p != ',' && *p != '[' && n + 1 < cap) out[n++] = *p++;
    if (*p == '[') {
        p++;
        while (*p >= '0' && *p <= '9' && n + 1 < cap) out[n++] = *p++;
    }
    out[n] = 0;
    return n > 0;
}

/* Settings, part 1: logging, timeout, spinning, segments, the algorithm and its crossover,
 * async lanes: desc first, then DDP_* variables, then defaults. */
_DDP_PRIVATE ddp_result_t _ddp_init_tuning(ddp_comm_t *c, const ddp_comm_desc_t *d) {
    const int nranks = c->eng.nranks;
    const char *s;
    long v;
    c->eng.log_level = d->log_level ? d->log_level - 1 : _ddp_log_level_from_env();
    c->log.fn = d->log_fn;
    c->log.user = d->log_user;
    if (!d->log_fn && (s = getenv("DDP_DEBUG_FILE")) && *s) _ddp_log_open_file(c, s);
    s = getenv("DDP_DEBUG");
    if (!d->log_level && s && _ddp_log_level_parse(s) < 0)
        _DDP_LOG(c, DDP_LOG_WARN, "DDP_DEBUG='%s' is not a level: NONE, WARN, INFO, TRACE or VERSION "
                 "(NCCL_DEBUG's names); WARN is in force", s);
    else if (!d->log_level && s && !strcasecmp(s, "VERSION") && c->eng.rank == 0)
        _DDP_LOG(c, DDP_LOG_WARN, "libddp %d.%d", DDP_VERSION_MAJOR, DDP_VERSION_MINOR);
    c->eng.timeout_ms = d->timeout_ms ? d->timeout_ms : _ddp_env_timeout_ms();
    s = getenv("DDP_TIMEOUT_MS");
    if (!d->timeout_ms && s && _ddp_parse_long(s, -1, INT_MAX, &v) != 0)
        return ddp_comm_fail(c, DDP_ERR_INVALID_ARGUMENT, "init: DDP_TIMEOUT_MS='%s' is not a "
                             "number of milliseconds", s);
    c->eng.spin_us = d->spin_us ? d->spin_us : -2;
    if (c->eng.spin_us == -2) {
        s = getenv("DDP_SPIN_US");
        /* Measured (README): polling with sched_yield beats sleeping at once even with 4 ranks
         * on 2 CPUs, because the yield hands the CPU to the peer we wait for. */
        c->eng.spin_us = (s && _ddp_parse_long(s, -1, 10000000, &v) == 0) ? (int)v : _DDP_DEFAULT_SPIN_US;
    }
    if (c->eng.spin_us < 0) c->eng.spin_us = 0;
    c->eng.segment_bytes = d->segment_bytes ? d->segment_bytes : _ddp_parse_size(getenv("DDP_SEGMENT_BYTES"));
    if (!c->eng.segment_bytes) c->eng.segment_bytes = 512u << 10;
    if (c->eng.segment_bytes < 4096) c->eng.segment_bytes = 4096;
    if (c->eng.segment_bytes > (64u << 20)) c->eng.segment_bytes = 64u << 20;
    c->eng.segment_bytes &= ~(size_t)63;
    s = getenv("DDP_ALGO");
    c->algo = !s || !*s || !strcmp(s, "auto") ? _DDP_ALGO_AUTO : !strcmp(s, "hier") ? _DDP_ALGO_HIER
            : 1 + _ddp_ar_algo_parse(s);
    if (c->algo < 0 || (c->algo == 0 && s && *s && strcmp(s, "auto")))
        return ddp_comm_fail(c, DDP_ERR_INVALID_ARGUMENT, "init: DDP_ALGO='%s': expected auto, ring, rd, "
                             "rabenseifner, hier, hier_ring, hier_rd or hier_rabenseifner", s);
    /* Measured crossover (README, bench/): below it the ring's 2(p-1) hops cost more than
     * recursive doubling's extra bytes. */
    c->rd_max_bytes = _ddp_parse_size(getenv("DDP_RD_MAX_BYTES"));
    if (!c->rd_max_bytes)
        c->rd_max_bytes = nranks == 2 ? _DDP_RD_MAX_BYTES_P2
                        : (nranks & (nranks - 1)) == 0 ? _DDP_RD_MAX_BYTES_POW2 : _DDP_RD_MAX_BYTES_FOLDED;
    s = getenv("DDP_ASYNC_LANES");
    c->want_lanes = (s && _ddp_parse_long(s, 1, _DDP_MAX_LANES, &v) == 0) ? (int)v : _DDP_DEFAULT_LANES;
    c->lane_min_bytes = _ddp_parse_size(getenv("DDP_LANE_MIN_BYTES"));
    if (!c->lane_min_bytes) c->lane_min_bytes = _DDP_LANE_MIN_BYTES;
    return DDP_SUCCESS;
}

/* Settings, part 2: where the rendezvous is: MASTER_ADDR (else Slurm's first host, else this
 * host) and MASTER_PORT (else one derived from the job's identity, else the default). */
_DDP_PRIVATE ddp_result_t _ddp_init_master(ddp_comm_t *c, const ddp_comm_desc_t *d) {
    const int nranks = c->eng.nranks;
    const char *s = d->master_addr ? d->master_addr : getenv("MASTER_ADDR");
    long v;
    int i;
    if (s && *s) {
        _ddp_strlcpy(c->master_addr, s, sizeof c->master_addr);
    } else if (getenv("SLURM_PROCID") &&
               (_ddp_slurm_first_host(getenv("SLURM_STEP_NODELIST"), c->master_addr, sizeof c->master_addr) ||
                _ddp_slurm_first_host(getenv("SLURM_JOB_NODELIST"), c->master_addr, sizeof c->master_addr))) {
        _DDP_LOG(c, DDP_LOG_INFO, "init: master %s: the first host of Slurm's node list (MASTER_ADDR unset)",
                 c->master_addr);
    } else {
        _ddp_strlcpy(c->master_addr, "127.0.0.1", sizeof c->master_addr);
    }
    if (d->master_port) {
        c->master_port = d->master_port;
    } else if ((i = _ddp_env_int("MASTER_PORT", 1, 65535, &v)) == 1) {
        c->master_port = (int)v;
    } else if (i < 0) {
        return ddp_comm_fail(c, DDP_ERR_INVALID_ARGUMENT, "init: MASTER_PORT='%s' is not a port "
                             "number (1..65535)", getenv("MASTER_PORT"));
    } else if (nranks == 1 && !d->store) {
        c->master_port = 0;   /* nobody else connects: a port the kernel picks, never a clash */
    } else if (c->job[0]) {
        /* mpirun and srun set no MASTER_PORT: every job on a host would meet on 29500. A port
         * from the job's identity (20000..31999, below Linux's ephemeral range) keeps them
         * apart; the rendezvous still refuses a rank of another job (same port by chance). */
        c->master_port = 20000 + (int)(_ddp_fnv1a(c->job, strlen(c->job), _DDP_FNV_INIT) % 12000u);
        _DDP_LOG(c, DDP_LOG_INFO, "init: master port %d derived from the job's identity %s "
                 "(MASTER_PORT unset)", c->master_port, c->job);
    } else {
        c->master_port = _DDP_DEFAULT_PORT;
    }
    if ((c->master_port < 1 && !(nranks == 1 && c->master_port == 0)) || c->master_port > 65535)
        return ddp_comm_fail(c, DDP_ERR_INVALID_ARGUMENT, "init: master port %d out of range", c->master_port);
    return DDP_SUCCESS;
}

/* Settings, part 3: a host transport forced by desc.transport or DDP_TRANSPORT, which must be
 * compiled in; NULL is "auto". */
_DDP_PRIVATE ddp_result_t _ddp_init_forced_transport(ddp_comm_t *c, const ddp_comm_desc_t *d, const char **forced_out) {
    const char *forced = d->transport ? d->transport : getenv("DDP_TRANSPORT");
    int i;
    if (forced && (!*forced || !strcmp(forced, "auto"))) forced = NULL;
    if (forced) _ddp_strlcpy(c->transport_name, forced, sizeof c->transport_name);
    if (forced && !ddp_transport_find(forced)) {
        char names[128] = "";
        size_t off = 0;
        for (i = 0; i < _ddp_ntransports && off + 16 < sizeof names; i++)
            off += (size_t)snprintf(names + off, sizeof names - off, "%s%s", i ? ", " : "", _ddp_transports[i]->name);
        return ddp_comm_fail(c, DDP_ERR_UNSUPPORTED, "init: transport '%s' is not compiled into "
                             "this program (compiled in: %s; include transports/ddp_%s.h)", forced,
                             off ? names : "none", forced);
    }
    *forced_out = forced;
    return DDP_SUCCESS;
}

_DDP_PRIVATE ddp_result_t _ddp_init_settings(ddp_comm_t *c, const ddp_comm_desc_t *d, const char **forced_out) {
    const int nranks = c->eng.nranks;
    const char *s, *forced = NULL;
    ddp_result_t r;
    int i;
    if ((r = _ddp_init_tuning(c, d)) != DDP_SUCCESS) return r;
    _ddp_strlcpy(c->prefix, d->store_prefix ? d->store_prefix : "ddp", sizeof c->prefix);
    s = d->socket_ifname ? d->socket_ifname : getenv("DDP_SOCKET_IFNAME");
    _ddp_strlcpy(c->ifname, s ? s : "", sizeof c->ifname);
    _ddp_job_identity(c->job, sizeof c->job);
    if ((r = _ddp_init_master(c, d)) != DDP_SUCCESS || (r = _ddp_init_forced_transport(c, d, &forced)) != DDP_SUCCESS)
        return r;
    c->peers = (_ddp_peer_t *)_ddp_calloc(&c->alloc, sizeof *c->peers * (size_t)nranks);
    c->p2p = (uint32_t *)_ddp_calloc(&c->alloc, sizeof *c->p2p * 4 * (size_t)nranks);
    c->eng.scratch_bytes = c->eng.segment_bytes * _DDP_MAX_SLOTS;
    c->eng.scratch = (unsigned char *)_ddp_alloc(&c->alloc, c->eng.scratch_bytes);
    if (!c->peers || !c->eng.scratch || !c->p2p) return ddp_comm_fail(c, DDP_ERR_OUT_OF_MEMORY, "init: allocating");
    for (i = 0; i < nranks; i++) c->peers[i].tinst = -1;
    _DDP_LOG(c, DDP_LOG_INFO, "libddp %d.%d: rank %d of %d, master %s:%d, timeout %d ms, spin %d us, "
             "segment %zu bytes, transport %s, DDP_ALGO %s, async lanes %d", DDP_VERSION_MAJOR,
             DDP_VERSION_MINOR, c->eng.rank, nranks, c->master_addr, c->master_port, c->eng.timeout_ms,
             c->eng.spin_us, c->eng.segment_bytes, forced ? forced : "auto",
             getenv("DDP_ALGO") && *getenv("DDP_ALGO") ? getenv("DDP_ALGO") : "auto", c->want_lanes);
    *forced_out = forced;
    return DDP_SUCCESS;
}

/* Step 2: the store: the caller's (split, threads), else rank 0 serves MASTER_ADDR:PORT. */
/* torchrun without --standalone: its agent serves the store (TORCHELASTIC_USE_AGENT_STORE). */
_DDP_PRIVATE int _ddp_torchrun_agent_store(void) {
    const char *a = getenv("TORCHELASTIC_USE_AGENT_STORE");
    return a && (!strcmp(a, "True") || !strcmp(a, "true") || !strcmp(a, "1"));
}

_DDP_PRIVATE ddp_result_t _ddp_init_store(ddp_comm_t *c, const ddp_comm_desc_t *d) {
    const int rank = c->eng.rank;
    ddp_result_t r;
    if (d->store) {
        c->store = d->store;
    } else {
        ddp_store_desc_t sd;
        char err[512] = "";
        memset(&sd, 0, sizeof sd);
        sd.timeout_ms = c->eng.timeout_ms;
        sd.secret = d->job_secret;
        sd.log_level = c->eng.log_level + 1;
        sd.log_rank = rank + 1;
        if (c->log.fn || c->log_file) { sd.log_fn = _ddp_store_log_fwd; sd.log_user = c; }
        if (_ddp_torchrun_agent_store()) {
            /* torchrun (not --standalone) already serves a c10d TCPStore on MASTER_PORT: every
             * rank is a client of it. It outlives worker restarts, so the keys of this attempt
             * get their own namespace unless the caller chose one. */
            const char *run = getenv("TORCHELASTIC_RUN_ID"), *att = getenv("TORCHELASTIC_RESTART_COUNT");
            if (!d->store_prefix)
                snprintf(c->prefix, sizeof c->prefix, "libddp/%.40s/attempt_%.16s", run ? run : "none",
                         att ? att : "0");
            _DDP_LOG(c, DDP_LOG_INFO, "rendezvous through torchrun's agent store at %s:%d (c10d TCPStore "
                     "protocol, TORCHELASTIC_USE_AGENT_STORE=True), keys under %s/", c->master_addr,
                     c->master_port, c->prefix);
            r = _ddp_store_connect_c10d(&c->store, c->master_addr, c->master_port, &sd, err, sizeof err);
        } else {
            r = _ddp_store_open(&c->store, c->master_addr, c->master_port, rank == 0, &sd, err, sizeof err);
        }
        if (r != DDP_SUCCESS) {
            r = ddp_comm_fail(c, r, "init: %s", err);
            return r;
        }
        c->own_store = 1;
        if (c->master_port == 0) c->master_port = ddp_store_port(c->store);   /* world of one */
        /* Every request of this init ends by the rendezvous' deadline, not a timeout each. */
        if (c->init_deadline_us) _ddp_store_bound(c->store, c->init_deadline_us);
    }
    return DDP_SUCCESS;
}

/* Step 4: per peer, the highest-priority transport that reaches it (same rule on both sides,
 * so they agree without talking). */
_DDP_PRIVATE ddp_result_t _ddp_init_pick_transports(ddp_comm_t *c) {
    const int nranks = c->eng.nranks, rank = c->eng.rank;
    ddp_result_t r;
    int i;
    for (i = 0; i < nranks; i++) {
        int k, best = -1;
        if (i == rank) continue;
        for (k = 0; k < c->ntinst; k++) {
            const ddp_transport_t *t = c->tinst[k].t;
            if (t->reachable && !t->reachable(c->tinst[k].state, i)) continue;
            if (best < 0 || t->priority > c->tinst[best].t->priority) best = k;
        }
        if (best < 0) {
            r = ddp_comm_fail(c, DDP_ERR_UNSUPPORTED, "init: no transport reaches rank %d (host %s)",
                              i, _ddp_comm_host_id(c, i));
            return r;
        }
        c->peers[i].tinst = best;
        _DDP_LOG(c, DDP_LOG_TRACE, "peer %d (host %s): transport %s", i, _ddp_comm_host_id(c, i),
                 c->tinst[best].t->name);
    }
    return DDP_SUCCESS;
}

/* Step 5: one transport reaches everyone and can run the collectives itself (shared memory on
 * one host): it needs every peer connected, then may take the collectives over. */
_DDP_PRIVATE ddp_result_t _ddp_init_coll_provider(ddp_comm_t *c) {
    const int nranks = c->eng.nranks, rank = c->eng.rank;
    ddp_result_t r;
    int k;
        /* One transport reaches everyone and can run the collectives itself (shared memory on
     * one host): it needs every peer connected. */
    {
        int same = c->peers[rank == 0 ? 1 : 0].tinst;
        for (k = 0; k < nranks; k++) if (k != rank && c->peers[k].tinst != same) same = -1;
        /* (Several hosts in the layout: DDP_TEST_HOSTS over one transport; the model decides.) */
        if (same >= 0 && c->algo == _DDP_ALGO_AUTO && c->layout.nhosts == 1 && c->tinst[same].t->coll &&
            c->tinst[same].t->coll->enable) {
            r = _ddp_connect_peers(c, NULL, nranks);
            if (r != DDP_SUCCESS) { _ddp_publish_failure(c); return r; }
            if (c->tinst[same].t->coll->enable(c->tinst[same].state) == DDP_SUCCESS) {
                c->coll = c->tinst[same].t->coll;
                c->coll_state = c->tinst[same].state;
            }
        }
    }
    return DDP_SUCCESS;
}

/* What the logs and the timeline call each all-reduce algorithm. */
static const char *const _ddp_ar_long_names[_DDP_AR_NUM] = {
    "ring", "recursive doubling", "rabenseifner", "hierarchical (ring across hosts)",
    "hierarchical (recursive doubling across hosts)", "hierarchical (rabenseifner across hosts)"};

/* Step 6: the ring's neighbours and recursive doubling's partners, connected now (others on
 * first use). */
_DDP_PRIVATE ddp_result_t _ddp_init_connect_neighbours(ddp_comm_t *c) {
    const int nranks = c->eng.nranks, rank = c->eng.rank;
    ddp_result_t r;
    if (nranks > 1) {
        /* Ring neighbours, and the partners of recursive doubling: r ^ 2^i within the largest
         * power of two, r +- 2^k for the folded extra ranks. */
        int list[2 + 2 + 32], n = 0, p2 = 1, k, j;
        list[n++] = (rank + 1) % nranks;
        list[n++] = (rank + nranks - 1) % nranks;
        while (p2 * 2 <= nranks) p2 *= 2;
        if (rank >= p2) list[n++] = rank - p2;
        else {
            if (rank + p2 < nranks) list[n++] = rank + p2;
            for (k = 1; k < p2; k <<= 1) list[n++] = rank ^ k;
        }
        for (k = 0, j = 0; k < n; k++) {   /* dedupe */
            int seen = 0, m;
            for (m = 0; m < j; m++) if (list[m] == list[k]) seen = 1;
            if (!seen) list[j++] = list[k];
        }
        _DDP_LOG(c, DDP_LOG_INFO, "ring: send to rank %d via %s, receive from rank %d via %s; "
                 "%d peers connected in all", list[0], ddp_comm_transport_name(c, list[0]), list[1],
                 ddp_comm_transport_name(c, list[1]), j);
        if (c->coll)
            _DDP_LOG(c, DDP_LOG_INFO, "collectives: run by the %s transport itself (all %d ranks "
                     "reach each other through it); DDP_ALGO=ring or rd to use those instead",
                     c->tinst[c->peers[list[0]].tinst].t->name, nranks);
        else if (c->algo == _DDP_ALGO_RD)
            _DDP_LOG(c, DDP_LOG_INFO, "all_reduce algorithm: recursive doubling up to the scratch size "
                     "(%zu bytes), ring above (DDP_ALGO)", c->eng.scratch_bytes);
        else if (c->algo == 1 + _DDP_AR_HIER_RD)
            _DDP_LOG(c, DDP_LOG_INFO, "all_reduce algorithm: hierarchical, recursive doubling across "
                     "hosts while a slice fits the scratch (%zu bytes), Rabenseifner above (DDP_ALGO)",
                     c->eng.scratch_bytes);
        else if (c->algo == _DDP_ALGO_HIER)
            _DDP_LOG(c, DDP_LOG_INFO, "all_reduce algorithm: hierarchical, across hosts as the cost "
                     "model picks (DDP_ALGO)");
        else if (c->algo != _DDP_ALGO_AUTO)
            _DDP_LOG(c, DDP_LOG_INFO, "all_reduce algorithm: %s (DDP_ALGO)", _ddp_ar_long_names[c->algo - 1]);
        else if (c->layout.nhosts == 1)
            _DDP_LOG(c, DDP_LOG_INFO, "all_reduce algorithm: recursive doubling up to %zu bytes, "
                     "ring above (one host: measured thresholds; DDP_ALGO, DDP_RD_MAX_BYTES override)",
                     c->rd_max_bytes);
        else
            _DDP_LOG(c, DDP_LOG_INFO, "all_reduce algorithm: by the cost model, per call size (%d hosts; "
                     "rank 0 logs the table; DDP_ALGO overrides)", c->layout.nhosts);
        r = _ddp_connect_peers(c, list, j);
        if (r != DDP_SUCCESS) { _ddp_publish_failure(c); return r; }
    }
    return DDP_SUCCESS;
}

/* Step 6b: the hosts layout (from the host table, or DDP_TEST_HOSTS: a label per rank, for tests
 * of the hierarchical algorithms with ranks that are threads of one process) and this rank's
 * groups for the hierarchical all-reduce: the ranks of its host, and the ranks that have its
 * local number on the other hosts. Hosts are told apart by hashing (a million ranks: no n^2
 * string compares). split_hosts: a split's (_ddp_parent_t), else NULL. */
_DDP_PRIVATE ddp_result_t _ddp_init_layout(ddp_comm_t *c, const int *split_hosts) {
    const int n = c->eng.nranks, me = c->eng.rank;
    const char *labels = getenv("DDP_TEST_HOSTS");
    const char **key = NULL;
    int *lab_len = NULL, *host = NULL, *local = NULL, *count = NULL, *table = NULL;
    size_t tsize = 4, mask;
    int i, nhosts = 0, lmin = n, lmax = 0, nlocal, ninter;
    ddp_result_t r = DDP_SUCCESS;
    while (tsize < 2 * (size_t)n) tsize <<= 1;
    mask = tsize - 1;
    key = (const char **)_ddp_calloc(&c->alloc, sizeof *key * (size_t)n);
    lab_len = (int *)_ddp_calloc(&c->alloc, sizeof *lab_len * (size_t)n);
    host = (int *)_ddp_calloc(&c->alloc, sizeof *host * (size_t)n);
    local = (int *)_ddp_calloc(&c->alloc, sizeof *local * (size_t)n);
    count = (int *)_ddp_calloc(&c->alloc, sizeof *count * (size_t)n);
    table = (int *)_ddp_calloc(&c->alloc, sizeof *table * tsize);
    if (!key || !lab_len || !host || !local || !count || !table) {
        r = ddp_comm_fail(c, DDP_ERR_OUT_OF_MEMORY, "init: hosts layout (%d ranks)", n);
        goto done;
    }
    if (split_hosts) {   /* a split under DDP_TEST_HOSTS: the parent's layout */
        for (i = 0; i < n; i++) { key[i] = (const char *)&split_hosts[i]; lab_len[i] = (int)sizeof(int); }
    } else if (labels && *labels) {
        const char *q = labels;
        for (i = 0; i < n; i++) {
            key[i] = q;
            lab_len[i] = (int)strcspn(q, ",");
            q += lab_len[i];
            if (!lab_len[i] || (i < n - 1 && *q != ',')) break;
            if (*q == ',') q++;
        }
        if (i < n || *q) {
            r = ddp_comm_fail(c, DDP_ERR_INVALID_ARGUMENT, "init: DDP_TEST_HOSTS='%.200s': expected %d "
                              "comma-separated host labels, one per rank (none empty)", labels, n);
            goto done;
        }
    } else {
        for (i = 0; i < n; i++) {
            key[i] = c->host_ids + (size_t)i * _DDP_HOST_ID_LEN;
            lab_len[i] = (int)strlen(key[i]);
        }
    }
    for (i = 0; i < (int)tsize; i++) table[i] = -1;
    for (i = 0; i < n; i++) {
        size_t h = (size_t)_ddp_fnv1a(key[i], (size_t)lab_len[i], _DDP_FNV_INIT) & mask;
        for (;; h = (h + 1) & mask) {
            const int j = table[h];
            if (j < 0) { table[h] = i; host[i] = nhosts++; break; }
            if (lab_len[j] == lab_len[i] && !memcmp(key[j], key[i], (size_t)lab_len[i])) { host[i] = host[j]; break; }
        }
        local[i] = count[host[i]]++;
    }
    for (i = 0; i < nhosts; i++) {
        if (count[i] < lmin) lmin = count[i];
        if (count[i] > lmax) lmax = count[i];
    }
    c->layout.nranks = n;
    c->layout.nhosts = nhosts;
    c->layout.local_min = lmin;
    c->layout.local_max = lmax;
    nlocal = count[host[me]];
    ninter = local[me] < lmin ? nhosts : 0;
    c->hier_ranks = (int *)_ddp_calloc(&c->alloc, sizeof *c->hier_ranks * (size_t)(nlocal + ninter + 1));
    if (!c->hier_ranks) { r = ddp_comm_fail(c, DDP_ERR_OUT_OF_MEMORY, "init: hosts layout"); goto done; }
    c->hier.local.ranks = c->hier_ranks;
    c->hier.inter.ranks = c->hier_ranks + nlocal;
    c->hier.local.n = c->hier.inter.n = 0;
    for (i = 0; i < n; i++) {   /* both in rank order: every member makes the same list */
        if (host[i] == host[me]) {
            if (i == me) c->hier.local.me = c->hier.local.n;
            c->hier_ranks[c->hier.local.n++] = i;
        }
        if (ninter && local[i] == local[me]) {
            if (i == me) c->hier.inter.me = c->hier.inter.n;
            c->hier_ranks[nlocal + c->hier.inter.n++] = i;
        }
    }
    c->hier.slices = lmin;
    c->hier.nhosts = nhosts;
    c->hier.nranks = n;
    if (split_hosts || (labels && *labels)) {   /* kept for this communicator's splits */
        if (!(c->host_of = (int *)_ddp_calloc(&c->alloc, sizeof *c->host_of * (size_t)n))) {
            r = ddp_comm_fail(c, DDP_ERR_OUT_OF_MEMORY, "init: hosts layout");
            goto done;
        }
        memcpy(c->host_of, host, sizeof *host * (size_t)n);
        if (split_hosts)
            _DDP_LOG(c, DDP_LOG_INFO, "hosts: DDP_TEST_HOSTS: the parent communicator's test hosts");
        else
            _DDP_LOG(c, DDP_LOG_INFO, "hosts: DDP_TEST_HOSTS: this rank on test host '%.*s'", lab_len[me], key[me]);
    }
    _DDP_LOG(c, DDP_LOG_INFO, "hosts: %d ranks on %d host%s, %d to %d per host; this host's ranks: %d, "
             "local number %d%s", n, nhosts, nhosts == 1 ? "" : "s", lmin, lmax, nlocal, c->hier.local.me,
             ninter ? "" : " (forwards only in the hierarchical all-reduce: more ranks here than on the "
             "smallest host)");
done:
    _ddp_free(&c->alloc, key);
    _ddp_free(&c->alloc, lab_len);
    _ddp_free(&c->alloc, host);
    _ddp_free(&c->alloc, local);
    _ddp_free(&c->alloc, count);
    _ddp_free(&c->alloc, table);
    return r;
}

/* Which algorithms can run a call of `bytes` here (recursive doubling exchanges whole buffers
 * through the scratch; the hierarchical ones need a host with two ranks to pay). */
_DDP_PRIVATE unsigned _ddp_ar_allowed(const ddp_comm_t *c, double bytes, int hier_only) {
    const double L = c->layout.local_min > 0 ? c->layout.local_min : 1;
    unsigned m = 0;
    if (!hier_only) {
        m |= 1u << _DDP_AR_RING | 1u << _DDP_AR_RAB;
        if (bytes <= (double)c->eng.scratch_bytes) m |= 1u << _DDP_AR_RD;
    }
    if (hier_only || c->layout.local_max > 1) {
        m |= 1u << _DDP_AR_HIER_RING | 1u << _DDP_AR_HIER_RAB;
        if (bytes / L <= (double)c->eng.scratch_bytes) m |= 1u << _DDP_AR_HIER_RD;
    }
    return m;
}

_DDP_PRIVATE void _ddp_fmt_bytes(char *out, size_t cap, double b) {
    if (b >= 1073741824.0) snprintf(out, cap, "%g GiB", b / 1073741824.0);
    else if (b >= 1048576.0) snprintf(out, cap, "%g MiB", b / 1048576.0);
    else if (b >= 1024.0) snprintf(out, cap, "%g KiB", b / 1024.0);
    else snprintf(out, cap, "%g B", b);
}

/* Step 6c: the cost model. Rank 0 reads DDP_MODEL (else the built-in parameters) and publishes
 * them: every rank must choose alike. Then the choice per power of two of the call size, and at
 * INFO (rank 0) the table of predicted times it chose from and the crossovers. */
_DDP_PRIVATE ddp_result_t _ddp_init_model(ddp_comm_t *c) {
    const int multi = c->layout.nhosts > 1;
    char key[256], err[512];
    size_t len = 0;
    ddp_result_t r;
    int k, a;
    _ddp_model_defaults(&c->model);
    for (k = 0; k < 64; k++) c->ar_pick[k] = c->hier_pick[k] = (signed char)_DDP_AR_RING;
    if (c->eng.nranks == 1 || (!multi && c->algo != _DDP_ALGO_HIER)) return DDP_SUCCESS;
    _ddp_key(c, key, sizeof key, "model");
    if (c->eng.rank == 0) {
        const char *path = getenv("DDP_MODEL");
        if (path && *path && _ddp_model_load(&c->model, path, err, sizeof err) != 0) {
            r = ddp_comm_fail(c, DDP_ERR_INVALID_ARGUMENT, "init: DDP_MODEL: %s", err);
            _ddp_publish_failure(c);
            return r;
        }
        r = ddp_store_set(c->store, key, &c->model, sizeof c->model);
    } else {
        r = ddp_store_get(c->store, key, &c->model, sizeof c->model, &len);
        if (r == DDP_SUCCESS && len != sizeof c->model)
            return ddp_comm_fail(c, DDP_ERR_MISMATCH, "init: rank 0's cost model has %zu bytes, this "
                                 "build's %zu: every rank must run the same libddp", len, sizeof c->model);
    }
    if (r != DDP_SUCCESS) return ddp_comm_fail(c, r, "init: cost model: %s", ddp_store_last_error(c->store));
    c->model.source[sizeof c->model.source - 1] = 0;
    for (k = 0; k < 64; k++) {
        const double b = k < 50 ? (double)((uint64_t)1 << k) : 1125899906842624.0;
        c->ar_pick[k] = (signed char)_ddp_model_ar_pick(&c->model, b, &c->layout, _ddp_ar_allowed(c, b, 0), NULL);
        c->hier_pick[k] = (signed char)_ddp_model_ar_pick(&c->model, b, &c->layout, _ddp_ar_allowed(c, b, 1), NULL);
    }
    if (c->eng.rank == 0 && c->eng.log_level >= DDP_LOG_INFO) {
        const signed char *pick = c->algo == _DDP_ALGO_HIER ? c->hier_pick : c->ar_pick;
        char line[1024], sz[32], lo[32];
        size_t o;
        _DDP_LOG(c, DDP_LOG_INFO, "cost model (%s): alpha %.3g us local, %.3g us net; beta %.3g ns/B "
                 "local, %.3g ns/B net; host link %.3g ns/B; reduce %.3g ns/B", c->model.source,
                 c->model.alpha_us[0], c->model.alpha_us[1], c->model.beta_ns[0], c->model.beta_ns[1],
                 c->model.nic_ns, c->model.gamma_ns);
        o = (size_t)snprintf(line, sizeof line, "all_reduce predicted us:  %9s", "size");
        for (a = 0; a < _DDP_AR_NUM; a++) o += (size_t)snprintf(line + o, sizeof line - o, " %17s", _ddp_ar_algo_name(a));
        _DDP_LOG(c, DDP_LOG_INFO, "%s  -> %s", line, c->algo == _DDP_ALGO_HIER ? "DDP_ALGO=hier picks"
                 : c->algo == _DDP_ALGO_AUTO ? "auto picks" : "(DDP_ALGO fixes the algorithm)");
        for (k = 3; k <= 30; k += 3) {
            const double b = (double)((uint64_t)1 << k);
            double t[_DDP_AR_NUM];
            unsigned allowed = _ddp_ar_allowed(c, b, c->algo == _DDP_ALGO_HIER);
            _ddp_model_ar_pick(&c->model, b, &c->layout, allowed, t);
            _ddp_fmt_bytes(sz, sizeof sz, b);
            o = (size_t)snprintf(line, sizeof line, "all_reduce predicted us:  %9s", sz);
            for (a = 0; a < _DDP_AR_NUM; a++) {
                if (allowed & (1u << a) && t[a] < 1e15) o += (size_t)snprintf(line + o, sizeof line - o, " %17.1f", t[a]);
                else o += (size_t)snprintf(line + o, sizeof line - o, " %17s", "-");
            }
            _DDP_LOG(c, DDP_LOG_INFO, "%s  -> %s", line, _ddp_ar_algo_name(pick[k]));
        }
        o = 0;
        line[0] = 0;
        for (k = 0; k < 64; k++) {
            if (k < 63 && pick[k + 1] == pick[k]) continue;
            _ddp_fmt_bytes(lo, sizeof lo, k < 50 ? (double)((uint64_t)1 << k) : 1125899906842624.0);
            o += (size_t)snprintf(line + o, sizeof line - o, "%s%s%s%s", o ? ", " : "", _ddp_ar_algo_name(pick[k]),
                                  k < 63 ? " up to " : " above", k < 63 ? lo : "");
            if (o >= sizeof line) break;
        }
        _DDP_LOG(c, DDP_LOG_INFO, "all_reduce %s: %s (DDP_ALGO=... to force one, DDP_MODEL=file from "
                 "`make calibrate`)", c->algo == _DDP_ALGO_HIER ? "DDP_ALGO=hier" : "auto", line);
    }
    return DDP_SUCCESS;
}

/* The all-reduce algorithm for a call whose whole (virtual) buffer has `bytes`: the same on
 * every rank. */
_DDP_PRIVATE int _ddp_ar_pick_index(size_t bytes) {   /* the smallest k with 2^k >= bytes */
    int k = 0;
    while (k < 63 && ((uint64_t)1 << k) < (uint64_t)bytes) k++;
    return k;
}

_DDP_PRIVATE int _ddp_ar_choose(const ddp_comm_t *c, size_t bytes) {
    switch (c->algo) {
    case _DDP_ALGO_AUTO:
        if (c->layout.nhosts > 1) return c->ar_pick[_ddp_ar_pick_index(bytes)];
        return bytes <= c->eng.scratch_bytes && bytes <= c->rd_max_bytes ? _DDP_AR_RD : _DDP_AR_RING;
    case _DDP_ALGO_HIER: return c->hier_pick[_ddp_ar_pick_index(bytes)];
    case 1 + _DDP_AR_RD: return bytes <= c->eng.scratch_bytes ? _DDP_AR_RD : _DDP_AR_RING;
    case 1 + _DDP_AR_HIER_RD:   /* above the scratch: Rabenseifner, which adds in rd's order */
        return (bytes + (size_t)c->hier.slices - 1) / (size_t)c->hier.slices <= c->eng.scratch_bytes
               ? _DDP_AR_HIER_RD : _DDP_AR_HIER_RAB;
    default: return c->algo - 1;
    }
}

/* Step 7: device (GPU) buffers, when a transport offers them (transports/ddp_nccl.h). Every
 * rank must be able to (a rank without a device would leave the others waiting in NCCL's
 * init): the ranks agree on the probe first, then set up together, then agree on the setup.
 * "auto" (DDP_NCCL unset) declines with one line and the host path goes on; DDP_NCCL=1 makes
 * it an init error. Lanes (copies of this communicator) never run device calls. */
_DDP_PRIVATE ddp_result_t _ddp_exec_min_int32(ddp_comm_t *c, int32_t *v);   /* the op queue's, below */
_DDP_PRIVATE ddp_result_t _ddp_init_device(ddp_comm_t *c, int is_lane) {
    const char *mode = getenv("DDP_NCCL");
    const int required = mode && !strcmp(mode, "1");
    char why[384] = "";
    int32_t first_no;
    ddp_result_t r;
    long chk = 0;
    int local_no;
    int k;
    for (k = 0; k < c->ntinst && !c->dev_any; k++)
        if (c->tinst[k].t->device) {
            c->dev_any = c->tinst[k].t->device;
            c->dev_any_state = c->tinst[k].state;
        }
    if (!c->dev_any) {
        _ddp_strlcpy(c->dev_declined, "no device transport compiled in (include transports/ddp_nccl.h)",
                     sizeof c->dev_declined);
        return DDP_SUCCESS;
    }
    if (is_lane) { _ddp_strlcpy(c->dev_declined, "a lane", sizeof c->dev_declined); return DDP_SUCCESS; }
    /* The first rank that cannot (INT32_MAX: all can), the same on every rank. */
    local_no = c->dev_any->probe(c->dev_any_state, why, sizeof why) != DDP_SUCCESS;
    first_no = local_no ? c->eng.rank : INT32_MAX;
    c->last_error[0] = 0;
    if ((r = _ddp_exec_min_int32(c, &first_no)) != DDP_SUCCESS) return r;
    if (first_no == INT32_MAX) {
        /* DDP_ERR_REMOTE: this rank gave up because another's setup failed (it said so through
         * the store), so the ranks agree at once; that rank is the one to name. */
        ddp_result_t sr = c->dev_any->setup(c->dev_any_state, c->dev_inherited);
        local_no = sr != DDP_SUCCESS;
        c->dev_inherited = NULL;   /* the setup's now, whatever happened */
        if (local_no) _ddp_strlcpy(why, c->last_error, sizeof why);
        c->last_error[0] = 0;
        first_no = !local_no ? INT32_MAX : sr == DDP_ERR_REMOTE ? INT32_MAX - 1 : c->eng.rank;
        if ((r = _ddp_exec_min_int32(c, &first_no)) != DDP_SUCCESS) return r;
        if (first_no == INT32_MAX) {
            c->dev = c->dev_any;
            c->dev_state = c->dev_any_state;
            c->dev_check = _ddp_env_int("DDP_NCCL_CHECK", 0, 1, &chk) > 0 && chk;
            _DDP_LOG(c, DDP_LOG_INFO, "device buffers: NCCL on all %d ranks (device calls are "
                     "enqueued on the communicator's CUDA stream and return)%s", c->eng.nranks,
                     c->dev_check ? "; DDP_NCCL_CHECK: each call's fingerprint compared across ranks" : "");
            return DDP_SUCCESS;
        }
        if (local_no && sr != DDP_ERR_REMOTE)
            snprintf(c->dev_declined, sizeof c->dev_declined, "NCCL setup failed on this rank: %s", why);
        else if (local_no) {   /* gave up: why names the rank and its reason */
            char me[24];
            int skip = snprintf(me, sizeof me, "rank %d: ", c->eng.rank);
            snprintf(c->dev_declined, sizeof c->dev_declined, "%s",
                     strncmp(why, me, (size_t)skip) ? why : why + skip);
        }
        else if (first_no == INT32_MAX - 1)
            snprintf(c->dev_declined, sizeof c->dev_declined, "NCCL setup failed on another rank");
        else
            snprintf(c->dev_declined, sizeof c->dev_declined, "NCCL setup failed on rank %d (its log "
                     "says why)", (int)first_no);
        if (!required)
            _DDP_LOG(c, DDP_LOG_WARN, "device buffers: NCCL not used: %s; host buffers go on as "
                     "before (DDP_NCCL=1 makes this an init error)", c->dev_declined);
    } else {
        if (c->dev_inherited && c->dev_any->release_inherited)
            c->dev_any->release_inherited(c->dev_any_state, c->dev_inherited);
        c->dev_inherited = NULL;
        if (local_no)
            snprintf(c->dev_declined, sizeof c->dev_declined, "NCCL declined on this rank: %s", why);
        else
            snprintf(c->dev_declined, sizeof c->dev_declined, "NCCL declined on rank %d (its log says "
                     "why; this rank could use it)", (int)first_no);
        if (!required)
            _DDP_LOG(c, DDP_LOG_INFO, "device buffers: %s; host buffers use the host transports "
                     "(DDP_NCCL=0 to skip NCCL, =1 to require it)", c->dev_declined);
    }
    if (required)
        return ddp_comm_fail(c, DDP_ERR_UNSUPPORTED, "init: DDP_NCCL=1 but %s", c->dev_declined);
    return DDP_SUCCESS;
}

_DDP_PRIVATE void _ddp_init_contexts(ddp_comm_t *c);

/* A failure before there is a communicator: the story goes to ddp_last_init_error. */
_DDP_PRIVATE ddp_result_t _ddp_init_refuse(ddp_result_t r, const char *fmt, ...)
#if defined(__GNUC__) || defined(__clang__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
_DDP_PRIVATE ddp_result_t _ddp_init_refuse(ddp_result_t r, const char *fmt, ...) {
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    snprintf(_ddp_init_error, sizeof _ddp_init_error, "%s [%s]", msg, ddp_strerror(r));
    if (_ddp_log_level_from_env() >= DDP_LOG_WARN) _ddp_log_str(-1, DDP_LOG_WARN, _ddp_init_error);
    return r;
}

/* Settings, store, rendezvous (transports open listeners and publish), transport per peer,
 * collective provider, neighbour connections, lanes: each step names its failure. */
_DDP_PRIVATE ddp_result_t _ddp_comm_init(ddp_comm_t **out, int nranks, int rank, const ddp_comm_desc_t *d,
                                         const _ddp_parent_t *from) {
    ddp_comm_desc_t zero;
    ddp_comm_t *c;
    ddp_result_t r;
    const char *forced = NULL;
    _ddp_init_error[0] = 0;
    if (!out) return _ddp_init_refuse(DDP_ERR_INVALID_ARGUMENT, "ddp_comm_init: NULL comm pointer");
    *out = NULL;
    if (nranks < 1 || nranks > _DDP_MAX_RANKS)
        return _ddp_init_refuse(DDP_ERR_INVALID_ARGUMENT, "ddp_comm_init: world size %d is not in "
                                "1..%d (rank 0's store holds a connection per rank)", nranks, _DDP_MAX_RANKS);
    if (rank < 0 || rank >= nranks)
        return _ddp_init_refuse(DDP_ERR_INVALID_ARGUMENT, "ddp_comm_init: rank %d is not in 0..%d "
                                "(world size %d)", rank, nranks - 1, nranks);
    if (!d) { memset(&zero, 0, sizeof zero); d = &zero; }
    if (d->allocator && (!d->allocator->alloc || !d->allocator->free))
        return _ddp_init_refuse(DDP_ERR_INVALID_ARGUMENT, "ddp_comm_init: desc.allocator needs both "
                                "alloc and free");
    c = (ddp_comm_t *)_ddp_calloc(d->allocator, sizeof *c);
    if (!c) return _ddp_init_refuse(DDP_ERR_OUT_OF_MEMORY, "ddp_comm_init: allocating the communicator");
    c->log.fd = 2;   /* stderr until the settings say otherwise */
    pthread_mutex_init(&c->amu, NULL);
    pthread_cond_init(&c->acv, NULL);
    pthread_cond_init(&c->adone, NULL);
    c->async_init = 1;
    pthread_once(&_ddp_fork_once, _ddp_fork_register);
    c->fork_gen = __atomic_load_n(&_ddp_fork_gen, __ATOMIC_RELAXED);
    c->pid = (int)getpid();
    if (!_ddp_live_add(c)) { _ddp_free(d->allocator, c); return DDP_ERR_OUT_OF_MEMORY; }
    if (d->allocator) c->alloc = *d->allocator;
    c->eng.rank = rank;
    c->eng.nranks = nranks;
    c->local_rank = c->local_size = -1;
    if ((r = _ddp_init_settings(c, d, &forced)) != DDP_SUCCESS) goto fail;
    c->init_deadline_us = _ddp_deadline(c->eng.timeout_ms);   /* one deadline for the rendezvous */
    _ddp_init_contexts(c);
    {
        char terr[600];
        if (_ddp_trace_open(&c->trace, &c->alloc, rank, !from->is_lane, terr, sizeof terr) != 0) {
            r = ddp_comm_fail(c, DDP_ERR_SYSTEM, "init: %s", terr);
            c->trace_open = 1;
            goto fail;
        }
        c->trace_open = 1;
    }
    if ((r = _ddp_init_store(c, d)) != DDP_SUCCESS) goto fail;
    if ((r = _ddp_rendezvous(c, forced)) != DDP_SUCCESS) goto fail;
    if ((r = _ddp_init_pick_transports(c)) != DDP_SUCCESS) goto fail;
    if ((r = _ddp_init_layout(c, from->split_hosts)) != DDP_SUCCESS) goto fail;
    if ((r = _ddp_init_model(c)) != DDP_SUCCESS) goto fail;
    if (nranks > 1 && (r = _ddp_init_coll_provider(c)) != DDP_SUCCESS) goto fail;
    if (nranks > 1 && (r = _ddp_init_connect_neighbours(c)) != DDP_SUCCESS) goto fail;
    if (from->dev_inherited) {   /* ours from here on (the caller keeps it if we fail before) */
        c->dev_inherited = *from->dev_inherited;
        *from->dev_inherited = NULL;
    }
    if ((r = _ddp_init_device(c, from->is_lane)) != DDP_SUCCESS) goto fail;
    snprintf(c->trace.transport, sizeof c->trace.transport, "%s", nranks == 1 ? "self" : c->coll ?
             c->tinst[c->peers[(rank + 1) % nranks].tinst].t->name : ddp_comm_transport_name(c, (rank + 1) % nranks));
    if (c->trace.file)
        _DDP_LOG(c, DDP_LOG_INFO, "DDP_TRACE: writing this rank's calls as Chrome trace events");
    c->nlanes = 1;
    if (!from->is_lane && (r = _ddp_lanes_create(c)) != DDP_SUCCESS) goto fail;
    _DDP_LOG(c, DDP_LOG_INFO, "wait policy: poll %d us (yielding the CPU between polls), then "
             "sleep in the kernel; %d ranks on this host, %d CPUs for them (their affinity masks "
             "together; %d for this rank)", c->eng.spin_us, c->local_size, c->tctx.host_cpus,
             _ddp_cpu_count());
    _DDP_LOG(c, DDP_LOG_INFO, "init done: local rank %d of %d", c->local_rank, c->local_size);
    if (c->own_store) _ddp_store_bound(c->store, 0);   /* later requests: a timeout each */
    *out = c;
    return DDP_SUCCESS;
fail:
    if (c->store && c->own_store) _ddp_store_bound(c->store, 0);
    /* Ranks waiting in the rendezvous learn at once instead of at their timeout; a rank that
     * only saw a peer go away says why that peer went, if it told the store. */
    if (c->store && (r != DDP_ERR_REMOTE || !_ddp_add_root_cause(c))) _ddp_publish_failure(c);
    /* The caller gets no communicator to ask, so keep the story per thread. */
    _ddp_strlcpy(_ddp_init_error, c->last_error, sizeof _ddp_init_error);
    ddp_comm_destroy(c);
    return r;
}

/* ---------------------------------------------------------------- threads as ranks
 * n communicators in this process, one per thread (the C answer to nn.DataParallel). A private
 * store on 127.0.0.1 (a free port the kernel picks) does the rendezvous; each rank has its own
 * client of it. Ranks talk through transports/ddp_threads.h when it is compiled in (reducing
 * straight from each other's buffers), else through the shared-memory transport (ranks of one
 * process share its mappings), else the default: no socket is involved with either, and a small
 * all-reduce costs well under a microsecond. desc->transport or DDP_TRANSPORT still decide. */
typedef struct {
    ddp_comm_t **out;
    int rank, n, port;
    const ddp_comm_desc_t *desc;
    const char *transport;
    ddp_result_t r;
    char err[1024];
} _ddp_thread_init_t;

static void *_ddp_thread_init_main(void *arg) {
    _ddp_thread_init_t *t = (_ddp_thread_init_t *)arg;
    ddp_comm_desc_t d = *t->desc;
    ddp_store_desc_t sd;
    ddp_store_t *client = NULL;
    memset(&sd, 0, sizeof sd);
    sd.timeout_ms = d.timeout_ms;
    sd.log_level = d.log_level;
    sd.log_rank = t->rank + 1;
    sd.secret = "";
    t->r = ddp_store_open(&client, "127.0.0.1", t->port, 0, &sd);
    if (t->r != DDP_SUCCESS) {
        snprintf(t->err, sizeof t->err, "init_threads: rank %d: store: %s", t->rank, "cannot reach the private store");
        return NULL;
    }
    d.store = client;
    d.store_prefix = "threads";
    d.transport = t->transport;
    d.master_addr = "127.0.0.1";
    d.master_port = t->port;
    t->r = ddp_comm_init(t->out, t->n, t->rank, &d);
    if (t->r != DDP_SUCCESS) {
        _ddp_strlcpy(t->err, ddp_last_init_error(), sizeof t->err);
        ddp_store_close(client);
        return NULL;
    }
    (*t->out)->own_store = 1;          /* destroy closes this rank's client */
    return NULL;
}

DDP_API ddp_result_t ddp_comm_init_threads(ddp_comm_t **comms, int n, const ddp_comm_desc_t *desc) {
    ddp_comm_desc_t zero;
    ddp_store_desc_t sd;
    ddp_store_t *srv = NULL;
    _ddp_thread_init_t *t;
    pthread_t *th;
    ddp_result_t r = DDP_SUCCESS;
    int i, started = 0;
    if (!comms || n < 1) {
        snprintf(_ddp_init_error, sizeof _ddp_init_error, "init_threads: %s",
                 comms ? "n must be >= 1" : "NULL comms");
        return DDP_ERR_INVALID_ARGUMENT;
    }
    for (i = 0; i < n; i++) comms[i] = NULL;
    if (!desc) { memset(&zero, 0, sizeof zero); desc = &zero; }
    memset(&sd, 0, sizeof sd);
    sd.timeout_ms = desc->timeout_ms;
    sd.log_level = desc->log_level;
    sd.secret = "";
    r = ddp_store_open(&srv, "127.0.0.1", 0, 1, &sd);
    if (r != DDP_SUCCESS) {
        snprintf(_ddp_init_error, sizeof _ddp_init_error, "init_threads: private store: %s",
                 srv ? ddp_store_last_error(srv) : ddp_strerror(r));
        return r;
    }
    t = (_ddp_thread_init_t *)DDP_MALLOC(sizeof *t * (size_t)n);
    th = (pthread_t *)DDP_MALLOC(sizeof *th * (size_t)n);
    if (!t || !th) {
        DDP_FREE(t);
        DDP_FREE(th);
        ddp_store_close(srv);
        snprintf(_ddp_init_error, sizeof _ddp_init_error, "init_threads: out of memory");
        return DDP_ERR_OUT_OF_MEMORY;
    }
    for (i = 0; i < n; i++) {
        memset(&t[i], 0, sizeof t[i]);
        t[i].out = &comms[i];
        t[i].rank = i;
        t[i].n = n;
        t[i].port = ddp_store_port(srv);
        t[i].desc = desc;
        t[i].transport = desc->transport ? desc->transport
                       : getenv("DDP_TRANSPORT") ? NULL : ddp_transport_find("threads") ? "threads"
                       : ddp_transport_find("shm") ? "shm" : NULL;
        if (pthread_create(&th[i], NULL, _ddp_thread_init_main, &t[i]) != 0) {
            t[i].r = DDP_ERR_SYSTEM;
            snprintf(t[i].err, sizeof t[i].err, "init_threads: pthread_create: %s", strerror(errno));
            break;
        }
        started++;
    }
    for (i = 0; i < started; i++) pthread_join(th[i], NULL);
    for (i = 0; i < n; i++) {
        if (i >= started || t[i].r != DDP_SUCCESS) {
            if (r == DDP_SUCCESS) {
                r = i >= started ? DDP_ERR_SYSTEM : t[i].r;
                _ddp_strlcpy(_ddp_init_error, i >= started ? "init_threads: a thread did not start"
                                                           : t[i].err, sizeof _ddp_init_error);
            }
        }
    }
    if (r != DDP_SUCCESS) {
        for (i = 0; i < n; i++) if (comms[i]) { ddp_comm_destroy(comms[i]); comms[i] = NULL; }
        ddp_store_close(srv);
    } else {
        comms[0]->extra_store = srv;    /* the server lives as long as rank 0's communicator */
    }
    DDP_FREE(t);
    DDP_FREE(th);
    return r;
}

DDP_API ddp_result_t ddp_comm_init_env(ddp_comm_t **out, const ddp_comm_desc_t *d) {
    _ddp_env_ranks_t e;
    ddp_result_t r;
    ddp_comm_t *c;
    if (!out) return DDP_ERR_INVALID_ARGUMENT;
    *out = NULL;
    memset(&e, 0, sizeof e);
    r = _ddp_ranks_from_env(&e);
    if (r == DDP_ERR_UNSUPPORTED) {
        /* No launcher: the program was run directly. A world of one (every collective a
         * local copy), as users of a single process expect. */
        if (_ddp_log_level_from_env() >= DDP_LOG_INFO && !(d && d->log_level))
            _ddp_log_str(0, DDP_LOG_INFO, "init: no launcher in the environment (RANK/WORLD_SIZE, "
                         "OMPI_COMM_WORLD_*, PMI_*, SLURM_*): a world of one");
        e.rank = 0;
        e.nranks = 1;
        r = DDP_SUCCESS;
    }
    if (r != DDP_SUCCESS) {
        snprintf(_ddp_init_error, sizeof _ddp_init_error, "init: %s [%s]", e.err, ddp_strerror(r));
        if (_ddp_log_level_from_env() >= DDP_LOG_WARN) {
            _ddp_log_str(-1, DDP_LOG_WARN, _ddp_init_error);
        }
        return r;
    }
    r = ddp_comm_init(&c, e.nranks, e.rank, d);
    if (r != DDP_SUCCESS) return r;
    if (e.local_rank >= 0) c->local_rank = e.local_rank;
    if (e.local_size >= 0) c->local_size = e.local_size;
    *out = c;
    return DDP_SUCCESS;
}

/* ---------------------------------------------------------------- point-to-point plumbing
 * What the algorithms in ddp_ring.h use: per-peer isend/irecv/test through the peer's transport,
 * and the blocking half of spin-then-block. */
_DDP_PRIVATE ddp_result_t _ddp_isend(ddp_comm_t *c, int peer, const void *buf, size_t len,
                                     uint64_t tag, void **req) {
    _ddp_peer_t *p = &c->peers[peer];
    if (!p->conn) return ddp_comm_fail(c, DDP_ERR_INTERNAL, "no connection to rank %d", peer);
    return c->tinst[p->tinst].t->isend(p->conn, buf, len, tag, NULL, req);
}

_DDP_PRIVATE ddp_result_t _ddp_irecv(ddp_comm_t *c, int peer, void *buf, size_t len, uint64_t tag,
                                     void **req) {
    _ddp_peer_t *p = &c->peers[peer];
    if (!p->conn) return ddp_comm_fail(c, DDP_ERR_INTERNAL, "no connection to rank %d", peer);
    return c->tinst[p->tinst].t->irecv(p->conn, buf, len, tag, NULL, req);
}

_DDP_PRIVATE ddp_result_t _ddp_test(ddp_comm_t *c, int peer, void *req, int *done) {
    return c->tinst[c->peers[peer].tinst].t->test(req, done);
}

/* Sleeps until a connection to one of the peers may progress (or timeout_ms). Peers on
 * different transports cannot share one kernel wait: then nap briefly instead. */
_DDP_PRIVATE ddp_result_t _ddp_block(ddp_comm_t *c, const int *peers, int n, int timeout_ms) {
    void *conns[8];
    int i, k = 0, ti = -1;
    /* Every stalled wait passes here at least every 100 ms: where ddp_comm_abort is seen. */
    if (__atomic_load_n(&c->aborted, __ATOMIC_SEQ_CST))
        return ddp_comm_fail(c, DDP_ERR_ABORTED, "ddp_comm_abort was called on this rank");
    if (timeout_ms < 0 || timeout_ms > 100) timeout_ms = 100;
    for (i = 0; i < n && k < 8; i++) {
        _ddp_peer_t *p = &c->peers[peers[i]];
        if (!p->conn) continue;
        if (ti >= 0 && p->tinst != ti) { usleep(20); return DDP_SUCCESS; }
        ti = p->tinst;
        conns[k++] = p->conn;
    }
    if (ti < 0 || !c->tinst[ti].t->wait) { usleep(20); return DDP_SUCCESS; }
    {   /* the timeline's "time spent waiting on each peer": the first one waited for */
        int64_t t0 = _ddp_now_us();
        ddp_result_t r = c->tinst[ti].t->wait(c->tinst[ti].state, conns, k, timeout_ms);
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
    _ddp_key(c, key, sizeof key, "addr/%s/%d", name, peer);
    return ddp_store_check(c->store, key, &exists) == DDP_SUCCESS && exists;
}

/* A note under name for every rank (ddp_transport.h: post/posted). */
_DDP_PRIVATE ddp_result_t _ddp_host_post(void *h, const char *name, const char *msg) {
    ddp_comm_t *c = (ddp_comm_t *)h;
    char key[256], cur[8];
    size_t curlen = 0;
    if (!c->store || c->foreign || !name || !msg) return DDP_ERR_INVALID_ARGUMENT;
    _ddp_key(c, key, sizeof key, "%s", name);
    return ddp_store_compare_set(c->store, key, NULL, 0, msg, strlen(msg), cur, sizeof cur, &curlen);
}
_DDP_PRIVATE int _ddp_host_posted(void *h, const char *name, char *msg, size_t cap) {
    ddp_comm_t *c = (ddp_comm_t *)h;
    char key[256];
    size_t len = 0;
    int exists = 0;
    if (!c->store || !name || !msg || cap < 1) return 0;
    _ddp_key(c, key, sizeof key, "%s", name);
    if (ddp_store_check(c->store, key, &exists) != DDP_SUCCESS || !exists) return 0;
    if (ddp_store_get(c->store, key, msg, cap - 1, &len) != DDP_SUCCESS) return 0;
    msg[len < cap - 1 ? len : cap - 1] = 0;
    return 1;
}

/* After the settings: both views read the communicator's fields through these. */
_DDP_PRIVATE void _ddp_init_contexts(ddp_comm_t *c) {
    _ddp_engine_t *e = &c->eng;
    ddp_transport_ctx_t *x = &c->tctx;
    e->host = c;
    e->waiting_on = -1;
    e->isend = _ddp_eng_isend; e->irecv = _ddp_eng_irecv; e->test = _ddp_eng_test;
    e->block = _ddp_eng_block; e->connect = _ddp_eng_connect;
    e->fail = _ddp_host_fail; e->last_error = _ddp_host_last_error; e->log = _ddp_host_log;
    x->rank = e->rank; x->nranks = e->nranks;
    x->timeout_ms = e->timeout_ms; x->spin_us = e->spin_us; x->log_level = e->log_level;
    x->ifname = c->ifname[0] ? c->ifname : NULL;
    x->master_addr = c->master_addr;
    x->allocator = c->alloc.alloc ? &c->alloc : NULL;
    x->abort_flag = &c->aborted;
    x->forked = &c->forked;
    x->waiting_on = &e->waiting_on;
    x->calls = &e->seq;
    x->auth_key = c->data_key;
    x->auth_key_len = sizeof c->data_key;
    x->host = c;
    x->host_id = _ddp_host_peer_id; x->publish = _ddp_host_publish; x->lookup = _ddp_host_lookup;
    x->published = _ddp_host_published; x->log = _ddp_host_log; x->fail = _ddp_host_fail;
    x->last_error = _ddp_host_last_error;
    x->post = _ddp_host_post; x->posted = _ddp_host_posted;
}

/* ---------------------------------------------------------------- collectives: checks */
_DDP_PRIVATE ddp_result_t _ddp_check_comm(ddp_comm_t *c) {
    ddp_result_t r;
    if (!c) return DDP_ERR_INVALID_ARGUMENT;
    if ((r = _ddp_usable(c)) != DDP_SUCCESS) return r;
    return (ddp_result_t)__atomic_load_n(&c->error, __ATOMIC_SEQ_CST);
}

/* The count argument's name in the call's documentation (NCCL's names). */
_DDP_PRIVATE const char *_ddp_count_name(const char *what) {
    if (!strncmp(what, "reduce_scatter", 14) || !strncmp(what, "scatter", 7)) return "recvcount";
    if (!strncmp(what, "all_gather", 10) || !strncmp(what, "gather", 6)) return "sendcount";
    return "count";
}

_DDP_PRIVATE ddp_result_t _ddp_check_args(ddp_comm_t *c, const char *what, const void *sendbuf,
                                          const void *recvbuf, size_t count, size_t mult,
                                          ddp_dtype_t dtype, int check_op, ddp_op_t op) {
    size_t es = ddp_dtype_size(dtype);
    if (!es) return ddp_comm_fail(c, DDP_ERR_INVALID_ARGUMENT, "%s: invalid dtype %d", what, (int)dtype);
    if (check_op && (unsigned)op >= DDP_NUM_OPS)
        return ddp_comm_fail(c, DDP_ERR_INVALID_ARGUMENT, "%s: invalid op %d", what, (int)op);
    /* A buffer holds at most PTRDIFF_MAX bytes (pointer differences, the transports' ssize_t
     * lengths): refused here, on every rank alike, before any pointer is formed past it. */
    if (count > (size_t)PTRDIFF_MAX / es / mult) {
        char ranks[48] = "";
        if (mult > 1) snprintf(ranks, sizeof ranks, " x %zu ranks", mult);
        return ddp_comm_fail(c, DDP_ERR_INVALID_ARGUMENT, "%s: %s %zu x %zu bytes%s overflows what a "
                             "buffer can hold (PTRDIFF_MAX bytes)", what, _ddp_count_name(what), count,
                             es, ranks);
    }
    if (count && (!sendbuf || !recvbuf))
        return ddp_comm_fail(c, DDP_ERR_INVALID_ARGUMENT, "%s: NULL %s buffer with count %zu",
                             what, sendbuf ? "receive" : "send", count);
    return DDP_SUCCESS;
}

/* ---------------------------------------------------------------- who is stuck
 * A wait that times out knows only the peer it waited on, which may itself be waiting (a ring
 * stalls behind one stopped rank). So, before giving up (and before closing connections, which
 * would turn the others' waits into "connection closed"), every rank that timed out publishes
 * its position (the peer it waited on, its collective number, its error) under pos/<rank>, then
 * follows the chain from its own peer: a peer that publishes within the grace is waiting too,
 * so follow whom it waits on; the first rank on the chain that does not publish is the one
 * that stopped making progress (stopped, hung in user code, or cut off). Same idea as
 * PyTorch's Flight Recorder and NCCL's RAS, with the rendezvous store as the meeting point.
 * Healthy ranks time out within a short spread of each other (their last progress was the
 * same collective), so a grace of timeout/2 in [1, 10] s is enough. When the store itself does
 * not answer, rank 0 (which serves it) is the one to blame. */
_DDP_PRIVATE void _ddp_name_stuck_rank(ddp_comm_t *c) {
    const int me = c->eng.rank, n = c->eng.nranks;
    int grace = c->eng.timeout_ms < 0 ? 5000 : c->eng.timeout_ms / 2;
    int64_t deadline;
    char key[256], val[600], chain[640] = "", orig[1024], why[160] = "";
    const char *body;
    int cur, hops, stuck = -1;
    size_t off = 0;
    if (!c->store || n < 2) return;
    if (grace < 1000) grace = 1000;
    if (grace > 10000) grace = 10000;
    deadline = _ddp_now_us() + (int64_t)grace * 1000;
    _ddp_strlcpy(orig, c->last_error, sizeof orig);
    body = strncmp(orig, "rank ", 5) == 0 && strstr(orig, ": ") ? strstr(orig, ": ") + 2 : orig;
    snprintf(val, sizeof val, "%d %u %.560s", c->eng.waiting_on, c->eng.seq, body);
    _ddp_key(c, key, sizeof key, "pos/%d", me);
    _ddp_store_quick(c->store, 1);
    if (ddp_store_set(c->store, key, val, strlen(val)) != DDP_SUCCESS) {
        stuck = 0;
        snprintf(why, sizeof why, "its rendezvous store does not answer: rank 0 stopped, hung or "
                 "cut off, or this rank is cut off from it");
    }
    for (cur = c->eng.waiting_on, hops = 0; stuck < 0 && cur >= 0 && cur < n && cur != me && hops < 32; hops++) {
        int next = -1, exists = 0;
        unsigned seq = 0;
        size_t len = 0;
        ddp_result_t r;
        _ddp_key(c, key, sizeof key, "pos/%d", cur);
        /* Short checks, not one long wait: a wait that times out costs the connection, and the
         * failure still has to be published after this. */
        while ((r = ddp_store_check(c->store, key, &exists)) == DDP_SUCCESS && !exists) {
            if (_ddp_ms_left(deadline) == 0) { r = DDP_ERR_TIMEOUT; break; }
            usleep(20000);
        }
        if (r == DDP_SUCCESS) r = ddp_store_get(c->store, key, val, sizeof val - 1, &len);
        if (r != DDP_SUCCESS) {
            stuck = cur;
            snprintf(why, sizeof why, r == DDP_ERR_TIMEOUT ? "no report of its position within "
                     "%d ms: stopped, hung or cut off" : "the store could not be asked (%d ms)", grace);
            break;
        }
        val[len] = 0;
        if (sscanf(val, "%d %u", &next, &seq) != 2) next = -1;
        if (off < sizeof chain - 1) {
            const char *text = strchr(val, ' ');
            text = text ? strchr(text + 1, ' ') : NULL;
            off += (size_t)snprintf(chain + off, sizeof chain - off, "%srank %d at #%u (%.120s)",
                                    off ? "; " : "", cur, seq, text ? text + 1 : "?");
            if (off >= sizeof chain) off = sizeof chain - 1;
        }
        if (next == me || next < 0) break;     /* a cycle back to us, or it knows no more */
        cur = next;
    }
    _ddp_store_quick(c->store, 0);
    if (stuck >= 0)
        snprintf(c->last_error, sizeof c->last_error, "rank %d: stuck rank: %d (%s); here: %.400s%s%.300s",
                 me, stuck, why, body, off ? "; waiting chain: " : "", chain);
    else if (off)
        snprintf(c->last_error, sizeof c->last_error, "rank %d: %.500s; waiting chain (every rank "
                 "on it reported: they wait on each other, e.g. different collectives): %.400s",
                 me, body, chain);
    if (stuck >= 0 || off) _DDP_LOG(c, DDP_LOG_WARN, "%s", c->last_error);
}

/* The communicator's error state, NCCL-style: a failed collective poisons it. A timeout first
 * finds out which rank stopped making progress. */
_DDP_PRIVATE ddp_result_t _ddp_finish(ddp_comm_t *c, ddp_result_t r) {
    if (r == DDP_ERR_TIMEOUT) _ddp_name_stuck_rank(c);
    return r == DDP_SUCCESS ? r : _ddp_comm_poison(c, r);
}

/* ---------------------------------------------------------------- operations, async, abort
 * Every collective is an operation record. A blocking call runs it on the caller's thread; an
 * async call queues it for the communicator's progress thread, which runs the queue in issue
 * order. Only one thread runs operations at a time: a blocking call first waits until the
 * queue is empty. The slots are allocated once, at the first async call: no allocation per
 * call. */
typedef struct _ddp_op {
    int kind;                         /* a ddp_call_kind_t (ddp_base.h) */
    int root;                         /* the root, or the peer of a send/recv */
    const void *send;
    void *recv;
    size_t count;
    ddp_dtype_t dtype;
    ddp_op_t op;
    size_t v_total, v_off;            /* all-reduce of a part of a flat buffer (0: the whole) */
    /* queued for the progress thread */
    int state;                        /* 0 free, 1 queued, 2 running, 3 done */
    uint64_t id;                      /* issue number, from 1 */
    ddp_result_t result;
    ddp_async_hooks_t hooks;          /* work before and after it, on the progress thread */
    int lane;                         /* the progress thread that runs it */
    /* queued by a group: its sends and receives are posted together at group_end */
    int post;                         /* 0 queued, 1 posted, 2 done */
    void *req;
    uint64_t tag;
} _ddp_op_t;

static _ddp_op_t _ddp_op_make(int kind, const void *send, void *recv, size_t count,
                              ddp_dtype_t dtype, ddp_op_t op, int root) {
    _ddp_op_t o;
    memset(&o, 0, sizeof o);
    o.kind = kind; o.send = send; o.recv = recv; o.count = count; o.dtype = dtype; o.op = op;
    o.root = root;
    return o;
}

_DDP_PRIVATE ddp_result_t _ddp_run_op(ddp_comm_t *c, const _ddp_op_t *o);

/* Abort's poisoning happens once, by whichever thread gets there first. The reason is
 * ddp_comm_abort's, or another async lane's failure (_ddp_abort_internal). */
_DDP_PRIVATE ddp_result_t _ddp_abort_poison(ddp_comm_t *c) {
    int expect = 0;
    ddp_result_t code = DDP_ERR_ABORTED;
    char why[sizeof c->abort_reason];
    pthread_mutex_lock(&c->amu);
    _ddp_strlcpy(why, c->abort_reason[0] ? c->abort_reason : "ddp_comm_abort was called on this rank",
                 sizeof why);
    if (c->abort_reason[0]) code = c->abort_code;
    pthread_mutex_unlock(&c->amu);
    if (__atomic_compare_exchange_n(&c->abort_claimed, &expect, 1, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST) &&
        __atomic_load_n(&c->error, __ATOMIC_SEQ_CST) == DDP_SUCCESS) {
        ddp_comm_fail(c, code, "%s", why);
        _ddp_comm_poison(c, code);
    }
    return code;
}

/* Marks an operation running, unless an abort came first (Dekker with ddp_comm_abort). */
_DDP_PRIVATE ddp_result_t _ddp_begin(ddp_comm_t *c) {
    ddp_result_t e;
    int expect = 0;
    /* The owner check: a communicator is used by one thread at a time (its progress thread
     * included, which runs only while the caller waits or is in no call). A second thread gets
     * an error instead of racing the first on the connections. Not recorded as last_error:
     * that buffer belongs to the thread inside. */
    if (!__atomic_compare_exchange_n(&c->busy, &expect, 1, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {
        _DDP_LOG(c, DDP_LOG_WARN, "two threads used this communicator at once: the second call "
                 "returns DDP_ERR_INVALID_USAGE (use one communicator per thread, or serialise)");
        return DDP_ERR_INVALID_USAGE;
    }
    if (__atomic_load_n(&c->aborted, __ATOMIC_SEQ_CST)) {
        __atomic_store_n(&c->busy, 0, __ATOMIC_SEQ_CST);
        return _ddp_abort_poison(c);
    }
    e = (ddp_result_t)__atomic_load_n(&c->error, __ATOMIC_SEQ_CST);
    if (e != DDP_SUCCESS) __atomic_store_n(&c->busy, 0, __ATOMIC_SEQ_CST);
    return e;
}
_DDP_PRIVATE void _ddp_end(ddp_comm_t *c) { __atomic_store_n(&c->busy, 0, __ATOMIC_SEQ_CST); }

/* The hand-offs between the caller and the progress thread poll for the communicator's spin
 * time (yielding the CPU between polls, as the transports do) before sleeping on a condition
 * variable: a futex wake-up costs tens of microseconds on a busy machine, more than a small
 * all-reduce. 1 when *word reached want in time; the caller still re-checks under the mutex. */
_DDP_PRIVATE int _ddp_poll_u64(ddp_comm_t *c, const uint64_t *word, uint64_t want) {
    int64_t until;
    if (__atomic_load_n(word, __ATOMIC_ACQUIRE) >= want) return 1;
    if (c->eng.spin_us <= 0) return 0;
    until = _ddp_now_us() + c->eng.spin_us;
    do {
        sched_yield();
        if (__atomic_load_n(word, __ATOMIC_ACQUIRE) >= want) return 1;
    } while (_ddp_now_us() < until);
    return 0;
}

/* A blocking call: wait for everything issued before it, then run it here. */
_DDP_PRIVATE ddp_result_t _ddp_enter(ddp_comm_t *c) {
    if (c->progress_on) {
        _ddp_poll_u64(c, &c->finished, __atomic_load_n(&c->issued, __ATOMIC_ACQUIRE));
        pthread_mutex_lock(&c->amu);
        while (c->finished < c->issued) pthread_cond_wait(&c->adone, &c->amu);
        pthread_mutex_unlock(&c->amu);
    }
    return _ddp_begin(c);
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

/* The bytes an operation reads (recv_side 0) or writes (1). */
_DDP_PRIVATE size_t _ddp_op_bytes(const ddp_comm_t *c, const _ddp_op_t *o, int recv_side) {
    size_t b = o->count * ddp_dtype_size(o->dtype), p = (size_t)c->eng.nranks;
    switch (o->kind) {
    case DDP_CALL_BARRIER: return 0;
    case DDP_CALL_REDUCE_SCATTER: case DDP_CALL_SCATTER: return recv_side ? b : b * p;
    case DDP_CALL_ALL_GATHER: case DDP_CALL_GATHER: return recv_side ? b * p : b;
    case DDP_CALL_ALL_TO_ALL: return b * p;
    default: return b;
    }
}

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
    for (id = l->cursor + 1; id <= c->issued; id++) {
        _ddp_op_t *o = &c->ops[(id - 1) % DDP_MAX_REQUESTS];
        if (o->lane != l->index) continue;
        for (e = c->finished + 1; e < id; e++) {
            const _ddp_op_t *q = &c->ops[(e - 1) % DDP_MAX_REQUESTS];
            if (q->lane != l->index && q->state != 3 && _ddp_op_depends(c, o, q)) return NULL;
        }
        return o;
    }
    return NULL;
}

_DDP_PRIVATE void _ddp_abort_internal(ddp_comm_t *c, ddp_result_t code, const char *reason);

static void *_ddp_progress_main(void *arg) {
    _ddp_lane_t *l = (_ddp_lane_t *)arg;
    ddp_comm_t *c = l->owner, *x = l->exec;
    pthread_mutex_lock(&c->amu);
    for (;;) {
        _ddp_op_t *o = _ddp_lane_next(c, l);
        ddp_result_t r;
        if (!o) {
            int more = 0;
            uint64_t id;
            for (id = l->cursor + 1; id <= c->issued && !more; id++)
                more = c->ops[(id - 1) % DDP_MAX_REQUESTS].lane == l->index;
            if (c->progress_stop && !more) break;
            if (!more) {   /* nothing of ours queued: lane 0 polls a while for a new request */
                uint64_t next = c->issued + 1;
                if (l->index == 0) {
                    pthread_mutex_unlock(&c->amu);
                    _ddp_poll_u64(c, &c->issued, next);
                    pthread_mutex_lock(&c->amu);
                    if (c->issued >= next || c->progress_stop) continue;   /* re-check both */
                }
                pthread_cond_wait(&c->acv, &c->amu);
            } else {       /* ours, behind another lane's request it depends on */
                pthread_cond_wait(&c->adone, &c->amu);
            }
            continue;
        }
        o->state = 2;
        l->cursor = o->id;
        pthread_mutex_unlock(&c->amu);
        r = _ddp_begin(x);
        if (r == DDP_SUCCESS) {
            if (o->hooks.before) o->hooks.before(o->hooks.arg);
            r = _ddp_run_op(x, o);
            _ddp_end(x);
            if (r == DDP_SUCCESS && o->hooks.after) o->hooks.after(o->hooks.arg);
        }
        if (r != DDP_SUCCESS && c->nlanes > 1 && !__atomic_load_n(&x->aborted, __ATOMIC_SEQ_CST)) {
            char why[640];
            int j;
            snprintf(why, sizeof why, "async lane %d failed: %.560s", l->index, x->last_error);
            for (j = 0; j < c->nlanes; j++)
                if (j != l->index) _ddp_abort_internal(c->lanes[j].exec, r, why);
        }
        pthread_mutex_lock(&c->amu);
        o->result = r;
        o->state = 3;
        while (c->finished < c->issued && c->ops[c->finished % DDP_MAX_REQUESTS].state == 3)
            __atomic_store_n(&c->finished, c->finished + 1, __ATOMIC_RELEASE);
        pthread_cond_broadcast(&c->adone);
    }
    pthread_mutex_unlock(&c->amu);
    return NULL;
}

/* At init, when lanes may help (the ring does the collectives: shared memory gains nothing):
 * copies of the communicator with their own connections, every rank at the same point, so
 * async and blocking calls stay interchangeable. Their threads start at the first async call. */
_DDP_PRIVATE ddp_result_t _ddp_lanes_create(ddp_comm_t *c) {
    int want = c->coll || c->eng.nranks < 2 ? 1 : c->want_lanes, i;
    ddp_comm_desc_t d;
    ddp_store_desc_t sd;
    _ddp_parent_t lane;
    char prefix[192], err[512] = "";
    ddp_result_t r;
    c->lanes[0].owner = c->lanes[0].exec = c;
    for (i = 1; i < want; i++) {
        ddp_store_t *client = NULL;
        snprintf(prefix, sizeof prefix, "%s/lane%d", c->prefix, i);
        /* Its own client of the store: a store client serves one thread at a time, and the
         * lanes report failures from their own threads. */
        memset(&sd, 0, sizeof sd);
        sd.timeout_ms = c->eng.timeout_ms;
        sd.secret = "";                /* the lane's client takes the store's stretched key */
        sd.log_level = c->eng.log_level + 1;
        sd.log_rank = c->eng.rank + 1;
        if (c->log.fn || c->log_file) { sd.log_fn = _ddp_store_log_fwd; sd.log_user = c; }
        if ((r = _ddp_store_client_like(&client, c->store, &sd, err, sizeof err)) != DDP_SUCCESS) {
            ddp_comm_fail(c, r, "init: async lane %d: connecting to the store at %s:%d: %.400s", i,
                          c->store->host, c->store->port, err);
            if (client) ddp_store_close(client);
            return r;
        }
        memset(&d, 0, sizeof d);
        d.master_addr = c->master_addr;
        d.master_port = c->master_port;
        d.timeout_ms = c->eng.timeout_ms;
        d.socket_ifname = c->ifname[0] ? c->ifname : NULL;
        d.store = client;
        d.store_prefix = prefix;
        d.transport = c->transport_name[0] ? c->transport_name : NULL;
        d.segment_bytes = c->eng.segment_bytes;
        d.spin_us = c->eng.spin_us ? c->eng.spin_us : -1;
        d.log_level = (c->eng.log_level >= DDP_LOG_TRACE ? c->eng.log_level : DDP_LOG_WARN) + 1;
        d.allocator = c->alloc.alloc ? &c->alloc : NULL;
        d.log_fn = c->log.fn;   /* a lane logs where its communicator does */
        d.log_user = c->log.user;
        c->lanes[i].owner = c;
        memset(&lane, 0, sizeof lane);
        lane.is_lane = 1;
        if ((r = _ddp_comm_init(&c->lanes[i].exec, c->eng.nranks, c->eng.rank, &d, &lane)) != DDP_SUCCESS) {
            ddp_store_close(client);
            return ddp_comm_fail(c, r, "init: the connections of async lane %d: %.600s", i,
                                 ddp_last_init_error());
        }
        c->lanes[i].exec->own_store = 1;   /* destroy closes the client */
        c->nlanes = i + 1;
    }
    _DDP_LOG(c, DDP_LOG_INFO, "async: %d lane%s: %s", want, want > 1 ? "s" : "",
             want > 1 ? "async requests from DDP_LANE_MIN_BYTES up take turns, each lane with its "
             "own connections (DDP_ASYNC_LANES=1: one)" : c->coll ? "collectives run by the "
             "transport" : "one");
    return DDP_SUCCESS;
}

/* The first async call: the lanes' progress threads. */
_DDP_PRIVATE ddp_result_t _ddp_lanes_start(ddp_comm_t *c, const char *what) {
    int i;
    ddp_result_t r;
    if (!c->ops) {
        c->ops = (_ddp_op_t *)_ddp_calloc(&c->alloc, sizeof *c->ops * DDP_MAX_REQUESTS);
        if (!c->ops) return ddp_comm_fail(c, DDP_ERR_OUT_OF_MEMORY, "%s: request slots", what);
    }
    for (i = 0; i < c->nlanes; i++) {
        c->lanes[i].index = i;
        c->lanes[i].cursor = c->issued;
        if (pthread_create(&c->lanes[i].thread, NULL, _ddp_progress_main, &c->lanes[i]) != 0) {
            r = ddp_comm_fail(c, DDP_ERR_SYSTEM, "%s: starting progress thread %d: %s", what, i,
                              strerror(errno));
            pthread_mutex_lock(&c->amu);
            c->progress_stop = 1;
            pthread_cond_broadcast(&c->acv);
            pthread_mutex_unlock(&c->amu);
            while (i-- > 0) pthread_join(c->lanes[i].thread, NULL);
            c->progress_stop = 0;
            return _ddp_comm_poison(c, r);   /* the peers may have queued theirs: fail them */
        }
    }
    c->progress_on = 1;
    _DDP_LOG(c, DDP_LOG_INFO, "async: %d progress thread%s started (each runs its requests in issue order)",
             c->nlanes, c->nlanes > 1 ? "s" : "");
    return DDP_SUCCESS;
}

_DDP_PRIVATE ddp_result_t _ddp_submit(ddp_comm_t *c, const char *what, const _ddp_op_t *o,
                                      ddp_request_t *req) {
    _ddp_op_t *slot;
    int lane = 0;
    if (!c->progress_on) {
        ddp_result_t r = _ddp_lanes_start(c, what);
        if (r != DDP_SUCCESS) return r;
    }
    if (c->nlanes > 1 && _ddp_op_bytes(c, o, 1) >= c->lane_min_bytes)
        lane = (int)(c->big_ops++ % (uint64_t)c->nlanes);
    pthread_mutex_lock(&c->amu);
    slot = &c->ops[c->issued % DDP_MAX_REQUESTS];
    if (slot->state != 0) {
        pthread_mutex_unlock(&c->amu);
        return ddp_comm_fail(c, DDP_ERR_INVALID_USAGE, "%s: %d requests outstanding already: "
                             "ddp_wait or ddp_test the oldest first", what, DDP_MAX_REQUESTS);
    }
    *slot = *o;
    slot->state = 1;
    slot->lane = lane;
    slot->id = c->issued + 1;
    __atomic_store_n(&c->issued, slot->id, __ATOMIC_RELEASE);
    pthread_cond_broadcast(&c->acv);
    pthread_mutex_unlock(&c->amu);
    req->comm = c;
    req->id = slot->id;
    _DDP_LOG(c, DDP_LOG_TRACE, "async: %s queued as request %llu (lane %d)", what,
             (unsigned long long)req->id, lane);
    return DDP_SUCCESS;
}

/* The slot of a live request, or NULL (the message says why). Called with amu held. */
_DDP_PRIVATE _ddp_op_t *_ddp_req_slot(ddp_request_t *req, const char *what, ddp_result_t *err) {
    ddp_comm_t *c = req->comm;
    _ddp_op_t *slot = &c->ops[(req->id - 1) % DDP_MAX_REQUESTS];
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
    if (!req->comm->ops) {
        *r = ddp_comm_fail(req->comm, DDP_ERR_INVALID_USAGE, "%s: not a request of this "
                           "communicator", what);
        return 0;
    }
    return 1;
}

/* Device requests (transports/ddp_nccl.h) carry this bit in their id: below. */
#define _DDP_DEV_REQ ((uint64_t)1 << 63)
_DDP_PRIVATE ddp_result_t _ddp_dev_complete(ddp_request_t *req, int *done);

DDP_API ddp_result_t ddp_wait(ddp_request_t *req) {
    ddp_result_t r;
    ddp_comm_t *c;
    _ddp_op_t *slot;
    if (req && req->comm && (req->id & _DDP_DEV_REQ) && _ddp_live_check(req->comm, 0))
        return _ddp_usable(req->comm) ? DDP_ERR_INVALID_USAGE : _ddp_dev_complete(req, NULL);
    if (!_ddp_req_check(req, "ddp_wait", &r)) return r;
    c = req->comm;
    pthread_mutex_lock(&c->amu);
    if ((slot = _ddp_req_slot(req, "ddp_wait", &r)) != NULL) {
        if (c->finished < req->id) {   /* requests finish in issue order */
            pthread_mutex_unlock(&c->amu);
            _ddp_poll_u64(c, &c->finished, req->id);
            pthread_mutex_lock(&c->amu);
        }
        while (c->finished < req->id) pthread_cond_wait(&c->adone, &c->amu);
        r = slot->result;
        slot->state = 0;
    }
    pthread_mutex_unlock(&c->amu);
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
    pthread_mutex_lock(&c->amu);
    r = DDP_SUCCESS;
    if ((slot = _ddp_req_slot(req, "ddp_test", &r)) != NULL && c->finished >= req->id) {
        r = slot->result;
        slot->state = 0;
        *done = 1;
    }
    pthread_mutex_unlock(&c->amu);
    if (*done) { req->comm = NULL; req->id = 0; }
    return r;
}

/* Sets the abort flag (with a reason, when not the user's ddp_comm_abort). Nothing running: it
 * tells the peers now (closing our connections). Something running: that sees the flag at its
 * next wait and does it. */
_DDP_PRIVATE void _ddp_abort_internal(ddp_comm_t *c, ddp_result_t code, const char *reason) {
    pthread_mutex_lock(&c->amu);
    if (reason && !c->abort_reason[0] && !__atomic_load_n(&c->aborted, __ATOMIC_SEQ_CST)) {
        _ddp_strlcpy(c->abort_reason, reason, sizeof c->abort_reason);
        c->abort_code = code;
    }
    pthread_mutex_unlock(&c->amu);
    __atomic_store_n(&c->aborted, 1, __ATOMIC_SEQ_CST);
    {   /* wake a call asleep in a transport now, not at its next 100 ms poll */
        int i;
        for (i = 0; i < c->ntinst; i++)
            if (c->tinst[i].t->abort && c->tinst[i].state) c->tinst[i].t->abort(c->tinst[i].state);
    }
    if (!__atomic_load_n(&c->busy, __ATOMIC_SEQ_CST) && !__atomic_load_n(&c->dev_busy, __ATOMIC_SEQ_CST))
        _ddp_abort_poison(c);
    pthread_mutex_lock(&c->amu);
    pthread_cond_broadcast(&c->acv);
    pthread_cond_broadcast(&c->adone);
    pthread_mutex_unlock(&c->amu);
}

DDP_API ddp_result_t ddp_comm_abort(ddp_comm_t *c) {
    int i;
    if (!c) return DDP_ERR_INVALID_ARGUMENT;
    if (_ddp_usable(c) != DDP_SUCCESS) return DDP_ERR_INVALID_USAGE;
    _DDP_LOG(c, DDP_LOG_WARN, "ddp_comm_abort: every call on this communicator now returns "
             "DDP_ERR_ABORTED");
    _ddp_abort_internal(c, DDP_ERR_ABORTED, NULL);
    /* the lanes' copies (made at init) */
    for (i = 1; i < c->nlanes; i++) _ddp_abort_internal(c->lanes[i].exec, DDP_ERR_ABORTED, NULL);
    return DDP_SUCCESS;
}

DDP_API ddp_result_t ddp_comm_get_async_error(ddp_comm_t *c, ddp_result_t *e) {
    if (!c || !e) return DDP_ERR_INVALID_ARGUMENT;
    if (_ddp_usable(c) != DDP_SUCCESS) return DDP_ERR_INVALID_USAGE;
    *e = (ddp_result_t)__atomic_load_n(&c->error, __ATOMIC_SEQ_CST);
    if (*e == DDP_SUCCESS && __atomic_load_n(&c->aborted, __ATOMIC_SEQ_CST)) *e = DDP_ERR_ABORTED;
    if (*e == DDP_SUCCESS && c->dev) *e = c->dev->async_error(c->dev_state);   /* the watchdog's */
    {
        int i;
        for (i = 1; *e == DDP_SUCCESS && i < c->nlanes; i++)
            *e = (ddp_result_t)__atomic_load_n(&c->lanes[i].exec->error, __ATOMIC_SEQ_CST);
    }
    return DDP_SUCCESS;
}


/* The algorithm depends only on (bytes of the whole buffer, world size, hosts, settings): the
 * same on every rank. The call's buffers may hold elements [v_off, v_off + count) of a virtual
 * buffer of v_total (the reducer's flat buckets; v_total 0: the call is the whole): the choice
 * and the chunks are then the whole's, so each element gets the whole's additions. */
_DDP_PRIVATE ddp_result_t _ddp_all_reduce_algo(ddp_comm_t *c, const void *sendbuf, void *recvbuf,
                                               size_t count, ddp_dtype_t dtype, ddp_op_t op,
                                               size_t v_total, size_t v_off) {
    const size_t total = v_total ? v_total : count, off = v_total ? v_off : 0;
    const int a = _ddp_ar_choose(c, total * ddp_dtype_size(dtype));
    _DDP_LOG(c, DDP_LOG_TRACE, "all_reduce #%u: %zu x %s %s, %s, %s%s", c->eng.seq + 1, count,
             ddp_dtype_name(dtype), ddp_op_name(op), sendbuf == recvbuf ? "in place" : "out of place",
             _ddp_ar_long_names[a], v_total ? " (a part of a flat buffer: cut as the whole)" : "");
    c->trace.cur->algo = _ddp_ar_long_names[a];
    switch (a) {
    case _DDP_AR_RD: return _ddp_rd_all_reduce(&c->eng, sendbuf, recvbuf, count, dtype, op);
    case _DDP_AR_RAB: return _ddp_rab_all_reduce(&c->eng, sendbuf, recvbuf, count, dtype, op);
    case _DDP_AR_HIER_RING: case _DDP_AR_HIER_RD: case _DDP_AR_HIER_RAB:
        return _ddp_hier_all_reduce(&c->eng, &c->hier, a == _DDP_AR_HIER_RD ? _DDP_INTER_RD
                                    : a == _DDP_AR_HIER_RAB ? _DDP_INTER_RAB : _DDP_INTER_RING,
                                    sendbuf, recvbuf, count, dtype, op, total, off);
    default: return _ddp_ring_all_reduce(&c->eng, sendbuf, recvbuf, count, dtype, op, total, off);
    }
}

/* ---- the operation table
 * One row per ddp_call_kind_t: its checks, its algorithm choice (by_algorithm: over the
 * engine) and its entry in a transport that runs collectives itself (by_transport: NULL when
 * the transport has none, so the algorithm runs even then). Every call, blocking, async or
 * queued in a group, is issued by _ddp_issue (below) and run by _ddp_run_op_raw through it. */
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

/* Collectives run by the transport (c->coll). The sequence number counts them as the engine
 * counts its own, never inside _DDP_LOG: the count must not depend on the log level. */
_DDP_PRIVATE ddp_result_t _ddp_coll_all_reduce(ddp_comm_t *c, const _ddp_op_t *o) {
    c->eng.seq++;
    _DDP_LOG(c, DDP_LOG_TRACE, "all_reduce #%u: %zu x %s %s, %s, by the transport", c->eng.seq,
             o->count, ddp_dtype_name(o->dtype), ddp_op_name(o->op),
             o->send == o->recv ? "in place" : "out of place");
    return c->coll->all_reduce(c->coll_state, o->send, o->recv, o->count, o->dtype, o->op);
}
_DDP_PRIVATE ddp_result_t _ddp_coll_reduce_scatter(ddp_comm_t *c, const _ddp_op_t *o) {
    _DDP_LOG(c, DDP_LOG_TRACE, "reduce_scatter #%u: %zu x %s per rank, %s, %s", c->eng.seq + 1,
             o->count, ddp_dtype_name(o->dtype), ddp_op_name(o->op), "by the transport");
    c->eng.seq++;
    return c->coll->reduce_scatter(c->coll_state, o->send, o->recv, o->count, o->dtype, o->op);
}
_DDP_PRIVATE ddp_result_t _ddp_coll_all_gather(ddp_comm_t *c, const _ddp_op_t *o) {
    _DDP_LOG(c, DDP_LOG_TRACE, "all_gather #%u: %zu x %s per rank, %s", c->eng.seq + 1, o->count,
             ddp_dtype_name(o->dtype), "by the transport");
    c->eng.seq++;
    return c->coll->all_gather(c->coll_state, o->send, o->recv, o->count, o->dtype);
}
_DDP_PRIVATE ddp_result_t _ddp_coll_broadcast(ddp_comm_t *c, const _ddp_op_t *o) {
    _DDP_LOG(c, DDP_LOG_TRACE, "broadcast #%u: %zu x %s from root %d, %s", c->eng.seq + 1, o->count,
             ddp_dtype_name(o->dtype), o->root, "by the transport");
    c->eng.seq++;   /* the transport compares every rank's call, root included */
    return c->coll->broadcast(c->coll_state, o->send, o->recv, o->count, o->dtype, o->root);
}
_DDP_PRIVATE ddp_result_t _ddp_coll_barrier(ddp_comm_t *c, const _ddp_op_t *o) {
    (void)o;
    c->eng.seq++;
    _DDP_LOG(c, DDP_LOG_TRACE, "barrier #%u, by the transport", c->eng.seq);
    return c->coll->barrier(c->coll_state);
}

/* The same collectives over the engine (ddp_ring.h's algorithms). */
_DDP_PRIVATE ddp_result_t _ddp_algo_all_reduce(ddp_comm_t *c, const _ddp_op_t *o) {
    return _ddp_all_reduce_algo(c, o->send, o->recv, o->count, o->dtype, o->op, o->v_total, o->v_off);
}
_DDP_PRIVATE ddp_result_t _ddp_algo_reduce_scatter(ddp_comm_t *c, const _ddp_op_t *o) {
    _DDP_LOG(c, DDP_LOG_TRACE, "reduce_scatter #%u: %zu x %s per rank, %s, %s", c->eng.seq + 1,
             o->count, ddp_dtype_name(o->dtype), ddp_op_name(o->op), "ring");
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

/* Runs one operation on the calling thread (the caller's, or the progress thread). */
_DDP_PRIVATE ddp_result_t _ddp_run_op_raw(ddp_comm_t *c, const _ddp_op_t *o) {
    const _ddp_kind_row_t *row = _ddp_row(o->kind);
    c->trace.cur->algo = c->coll ? "by the transport" : row->algo;
    return c->coll && row->by_transport ? row->by_transport(c, o) : row->by_algorithm(c, o);
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
                    c->progress_on && pthread_equal(pthread_self(), c->lanes[0].thread) ? 1 : 0;
    _ddp_trace_begin(&c->trace, c->eng.seq + 1, _ddp_kind_name(o->kind), o->count,
                     _ddp_op_bytes(c, o, 1), (int)o->dtype, (int)o->op, o->root, tid);
    /* A failure inside is said once, whole, when the communicator is poisoned (_ddp_finish):
     * not again at each layer that adds its context (transport, algorithm, call). */
    c->op_thread = pthread_self();
    __atomic_store_n(&c->op_quiet, 1, __ATOMIC_RELEASE);
    r = _ddp_run_op_raw(c, o);
    __atomic_store_n(&c->op_quiet, 0, __ATOMIC_RELEASE);
    _ddp_trace_end(&c->trace, r);
    if (r == DDP_SUCCESS) return r;
    r = _ddp_finish(c, r);
    _ddp_flight_dump(c);
    return r;
}

/* ---------------------------------------------------------------- device (GPU) buffers
 * A call whose buffers are device memory goes to the device provider (NCCL), enqueued on the
 * communicator's stream; host buffers stay on this file's paths. Its requests carry
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
    if (!c->dev_any) return 0;
    _ddp_op_buffers(c, o, &a, &b);
    da = a && c->dev_any->is_device(c->dev_any_state, a);
    db = b && c->dev_any->is_device(c->dev_any_state, b);
    if (!da && !db) return 0;
    if (a && b && da != db) {
        *err = ddp_comm_fail(c, DDP_ERR_INVALID_ARGUMENT, "%s: sendbuf is %s memory and recvbuf %s "
                             "memory: a call takes device buffers or host buffers, not both",
                             _ddp_kind_name(o->kind), da ? "device" : "host", db ? "device" : "host");
        return -1;
    }
    if (!c->dev) {
        *err = ddp_comm_fail(c, DDP_ERR_UNSUPPORTED, "%s: device buffers, but this communicator "
                             "cannot use NCCL: %s", _ddp_kind_name(o->kind), c->dev_declined);
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
    if (!c->dev_prints && !(c->dev_prints = (uint64_t *)ddp_comm_calloc(c, sizeof mine * (size_t)n)))
        return ddp_comm_fail(c, DDP_ERR_OUT_OF_MEMORY, "DDP_NCCL_CHECK: fingerprints");
    ag = _ddp_op_make(DDP_CALL_ALL_GATHER, mine, c->dev_prints, 6, DDP_UINT64, DDP_SUM, 0);
    if ((r = _ddp_run_op_raw(c, &ag)) != DDP_SUCCESS) return r;
    for (i = 0; i < n; i++) {
        const uint64_t *t = c->dev_prints + 6 * (size_t)i;
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
 * thread may hold c->busy for host requests meanwhile, which device calls do not touch. */
_DDP_PRIVATE void _ddp_dev_enter(ddp_comm_t *c) { __atomic_add_fetch(&c->dev_busy, 1, __ATOMIC_SEQ_CST); }
_DDP_PRIVATE ddp_result_t _ddp_dev_leave(ddp_comm_t *c, ddp_result_t r) {
    if (r != DDP_SUCCESS)
        r = __atomic_load_n(&c->aborted, __ATOMIC_SEQ_CST) ? _ddp_abort_poison(c) : _ddp_comm_poison(c, r);
    __atomic_sub_fetch(&c->dev_busy, 1, __ATOMIC_SEQ_CST);
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
    if (req && c->dev->in_group(c->dev_state, &held))
        return ddp_comm_fail(c, DDP_ERR_INVALID_USAGE, "%s_async on device buffers while an NCCL group "
                             "is open on this thread (ddp_group_start, on this or another communicator): "
                             "NCCL holds the call until the outermost ddp_group_end, so there would be "
                             "nothing to wait for yet; make it a blocking call in the group, or end the "
                             "group first", _ddp_kind_name(o->kind));
    _ddp_dev_enter(c);
    if (__atomic_load_n(&c->aborted, __ATOMIC_SEQ_CST)) return _ddp_dev_leave(c, DDP_ERR_ABORTED);
    memset(&k, 0, sizeof k);
    k.kind = (ddp_call_kind_t)o->kind;
    k.send = o->send; k.recv = o->recv; k.count = o->count; k.dtype = o->dtype; k.op = o->op;
    k.root = o->root;
    k.seq = ++c->dev_seq;
    _DDP_LOG(c, DDP_LOG_TRACE, "%s device #%llu: %zu x %s, %s, enqueued on NCCL", _ddp_kind_name(o->kind),
             (unsigned long long)k.seq, o->count, ddp_dtype_name(o->dtype),
             o->send == o->recv ? "in place" : "out of place");
    if (c->dev_check && o->kind != DDP_CALL_SEND && o->kind != DDP_CALL_RECV &&
        (r = _ddp_enter(c)) == DDP_SUCCESS) {   /* a host all-gather: after queued host requests */
        r = _ddp_dev_check_call(c, o, k.seq);
        _ddp_end(c);
    }
    {
        _ddp_trace_rec_t tr;
        memset(&tr, 0, sizeof tr);
        tr.t0_us = _ddp_now_us();
        if (r == DDP_SUCCESS) r = c->dev->enqueue(c->dev_state, &k);
        if (c->trace.file) {   /* the enqueue (the device runs it later, on its stream) */
            tr.seq = k.seq; tr.what = _ddp_kind_name(o->kind); tr.algo = "nccl (enqueued)";
            tr.count = o->count; tr.bytes = _ddp_op_bytes(c, o, 1); tr.dtype = (int)o->dtype;
            tr.op = (int)o->op; tr.root = o->root; tr.tid = 3; tr.result = r; tr.t1_us = _ddp_now_us();
            _ddp_trace_span(&c->trace, &tr);
        }
    }
    if (r == DDP_SUCCESS && req) r = c->dev->mark(c->dev_state, &ticket);
    if (r == DDP_SUCCESS && req) { req->comm = c; req->id = ticket | _DDP_DEV_REQ; }
    return _ddp_dev_leave(c, r);
}

/* ddp_wait/ddp_test of a device request. */
_DDP_PRIVATE ddp_result_t _ddp_dev_complete(ddp_request_t *req, int *done) {
    ddp_comm_t *c = req->comm;
    uint64_t ticket = req->id & ~_DDP_DEV_REQ;
    ddp_result_t r;
    int fin = 0;
    if (!c->dev) return ddp_comm_fail(c, DDP_ERR_INVALID_USAGE, "not a request of this communicator");
    _ddp_dev_enter(c);
    r = done ? c->dev->query(c->dev_state, ticket, &fin) : c->dev->wait(c->dev_state, ticket);
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
    if (!c->dev) return DDP_SUCCESS;
    if (c->dev->in_group(c->dev_state, &held) && held)
        return ddp_comm_fail(c, DDP_ERR_INVALID_USAGE, "%d device call(s) of this communicator are held "
                             "in an NCCL group still open on this thread (ddp_group_start, on this or "
                             "another communicator); NCCL issues them at the outermost ddp_group_end: "
                             "end the group before waiting for them", held);
    _ddp_dev_enter(c);
    r = c->dev->mark(c->dev_state, &ticket);
    if (r == DDP_SUCCESS && ticket) r = c->dev->wait(c->dev_state, ticket);
    return _ddp_dev_leave(c, r);
}

DDP_API ddp_result_t ddp_comm_set_cuda_stream(ddp_comm_t *c, void *stream) {
    ddp_result_t r = _ddp_check_comm(c);
    if (r != DDP_SUCCESS) return r;
    if (!c->dev)
        return ddp_comm_fail(c, DDP_ERR_UNSUPPORTED, "set_cuda_stream: this communicator cannot use "
                             "NCCL: %s", c->dev_declined);
    return c->dev->set_stream(c->dev_state, stream);
}

DDP_API int ddp_comm_is_device(ddp_comm_t *c, const void *ptr) {
    if (!c || !ptr || !_ddp_live_check(c, 0) || _ddp_forked(c) || !c->dev_any) return 0;
    return c->dev_any->is_device(c->dev_any_state, ptr);
}

_DDP_PRIVATE ddp_result_t _ddp_dev_usable(ddp_comm_t *c, const char *what) {
    ddp_result_t r = _ddp_check_comm(c);
    if (r != DDP_SUCCESS) return r;
    if (!c->dev)
        return ddp_comm_fail(c, DDP_ERR_UNSUPPORTED, "%s: this communicator cannot use NCCL: %s", what,
                             c->dev_declined);
    return DDP_SUCCESS;
}

DDP_API ddp_result_t ddp_comm_device_alloc(ddp_comm_t *c, size_t bytes, void **ptr) {
    ddp_result_t r = _ddp_dev_usable(c, "device_alloc");
    if (ptr) *ptr = NULL;
    if (r != DDP_SUCCESS) return r;
    if (!ptr) return ddp_comm_fail(c, DDP_ERR_INVALID_ARGUMENT, "device_alloc: NULL ptr");
    _ddp_dev_enter(c);   /* a failure here (out of memory) leaves the communicator usable */
    r = c->dev->mem_alloc(c->dev_state, bytes, ptr);
    __atomic_sub_fetch(&c->dev_busy, 1, __ATOMIC_SEQ_CST);
    return r;
}

DDP_API ddp_result_t ddp_comm_device_free(ddp_comm_t *c, void *ptr) {
    ddp_result_t r = _ddp_dev_usable(c, "device_free");
    if (r != DDP_SUCCESS || !ptr) return r;
    _ddp_dev_drain(c);   /* enqueued work may still read it; freed even if that failed */
    _ddp_dev_enter(c);   /* a failure here (out of memory) leaves the communicator usable */
    r = c->dev->mem_free(c->dev_state, ptr);
    __atomic_sub_fetch(&c->dev_busy, 1, __ATOMIC_SEQ_CST);
    return r;
}

DDP_API ddp_result_t ddp_comm_device_copy(ddp_comm_t *c, void *dst, const void *src, size_t bytes) {
    ddp_result_t r = _ddp_dev_usable(c, "device_copy");
    if (r != DDP_SUCCESS || !bytes) return r;
    if (!dst || !src) return ddp_comm_fail(c, DDP_ERR_INVALID_ARGUMENT, "device_copy: NULL buffer");
    _ddp_dev_enter(c);   /* a failure here (out of memory) leaves the communicator usable */
    r = c->dev->copy(c->dev_state, dst, src, bytes);
    __atomic_sub_fetch(&c->dev_busy, 1, __ATOMIC_SEQ_CST);
    return r;
}

DDP_API ddp_result_t ddp_comm_device_zero(ddp_comm_t *c, void *dst, size_t bytes) {
    ddp_result_t r = _ddp_dev_usable(c, "device_zero");
    if (r != DDP_SUCCESS || !bytes) return r;
    if (!dst) return ddp_comm_fail(c, DDP_ERR_INVALID_ARGUMENT, "device_zero: NULL buffer");
    _ddp_dev_enter(c);   /* a failure here (out of memory) leaves the communicator usable */
    r = c->dev->fill_zero(c->dev_state, dst, bytes);
    __atomic_sub_fetch(&c->dev_busy, 1, __ATOMIC_SEQ_CST);
    return r;
}

DDP_API ddp_result_t ddp_comm_device_synchronize(ddp_comm_t *c) {
    ddp_result_t r = _ddp_dev_usable(c, "device_synchronize");
    return r != DDP_SUCCESS ? r : _ddp_dev_drain(c);
}

DDP_API int ddp_comm_device_enabled(const ddp_comm_t *c, char *why, size_t cap) {
    if (!c || !_ddp_live_check(c, 0)) { if (why && cap) _ddp_strlcpy(why, "no communicator", cap); return 0; }
    if (why && cap) _ddp_strlcpy(why, c->dev ? "" : c->dev_declined, cap);
    return c->dev != NULL;
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
    if (o->root == c->eng.rank && !c->group_depth)
        return ddp_comm_fail(c, DDP_ERR_INVALID_USAGE, "%s: peer %d is this rank: outside a group "
                             "it would wait for itself; put the send and the recv between "
                             "ddp_group_start and ddp_group_end (a local copy)", what, o->root);
    return DDP_SUCCESS;
}

/* Over the engine, below (reduce, gather, scatter and all_to_all have no transport entry). */
_DDP_PRIVATE ddp_result_t _ddp_algo_reduce(ddp_comm_t *c, const _ddp_op_t *k);
_DDP_PRIVATE ddp_result_t _ddp_algo_gather_scatter(ddp_comm_t *c, const _ddp_op_t *k);
_DDP_PRIVATE ddp_result_t _ddp_algo_all_to_all(ddp_comm_t *c, const _ddp_op_t *k);
_DDP_PRIVATE ddp_result_t _ddp_algo_p2p(ddp_comm_t *c, const _ddp_op_t *k);

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

_DDP_PRIVATE ddp_result_t _ddp_group_queue(ddp_comm_t *c, const _ddp_op_t *o);  /* below */

/* Bad arguments inside a group also fail its group_end (NCCL). */
_DDP_PRIVATE ddp_result_t _ddp_call_reject(ddp_comm_t *c, ddp_result_t r) {
    if (c->group_depth && c->group_err == DDP_SUCCESS) c->group_err = r;
    return r;
}

/* The async forms refuse a missing request and a group (the group would run its calls after
 * this one: out of issue order). */
_DDP_PRIVATE ddp_result_t _ddp_async_refusal(ddp_comm_t *c, const char *what, const ddp_request_t *req) {
    if (!req) return ddp_comm_fail(c, DDP_ERR_INVALID_ARGUMENT, "%s: NULL request", what);
    if (c->group_depth)
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
    if (o.kind == DDP_CALL_BARRIER && !c->group_depth && (r = _ddp_dev_drain(c)) != DDP_SUCCESS) return r;
    if (async) return _ddp_submit(c, what, &o, req);
    if (c->group_depth) return _ddp_group_queue(c, &o);     /* runs at group_end, in order */
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
    c->splits++;
    if (r == DDP_SUCCESS && color != DDP_SPLIT_NOCOLOR) {
        for (i = 0; i < c->eng.nranks; i++) {
            if (all[2 * i] != color) continue;
            n++;
            if (all[2 * i + 1] < key || (all[2 * i + 1] == key && i < c->eng.rank)) me++;
        }
    }
    if (r == DDP_SUCCESS && color != DDP_SPLIT_NOCOLOR && c->host_of) {
        /* test hosts: the new ranks' host numbers, in their order (key, then parent rank) */
        if (!(hosts = (int *)_ddp_alloc(&c->alloc, sizeof *hosts * (size_t)n))) r = DDP_ERR_OUT_OF_MEMORY;
        for (i = 0; hosts && i < c->eng.nranks; i++) {
            int j, at = 0;
            if (all[2 * i] != color) continue;
            for (j = 0; j < c->eng.nranks; j++)
                if (all[2 * j] == color && (all[2 * j + 1] < all[2 * i + 1] || (all[2 * j + 1] == all[2 * i + 1] && j < i)))
                    at++;
            hosts[at] = c->host_of[i];
        }
    }
    _ddp_free(&c->alloc, all);
    if (r == DDP_ERR_OUT_OF_MEMORY) return ddp_comm_fail(c, r, "comm_split");
    /* NCCL's split is a collective over the parent too (DDP_SPLIT_NOCOLOR ranks included). */
    if (r == DDP_SUCCESS && c->dev) {
        _ddp_dev_enter(c);
        r = _ddp_dev_leave(c, c->dev->split(c->dev_state, color, key, &inherited));
    }
    if (r != DDP_SUCCESS || color == DDP_SPLIT_NOCOLOR) { _ddp_free(&c->alloc, hosts); return r; }
    snprintf(prefix, sizeof prefix, "%s/split%u/color%d", c->prefix, c->splits, color);
    memset(&d, 0, sizeof d);
    d.master_addr = c->master_addr;
    d.master_port = c->master_port;
    d.timeout_ms = c->eng.timeout_ms;
    d.socket_ifname = c->ifname[0] ? c->ifname : NULL;
    d.store = c->store;
    d.store_prefix = prefix;
    d.transport = c->transport_name[0] ? c->transport_name : NULL;   /* as the parent's */
    d.segment_bytes = c->eng.segment_bytes;
    d.spin_us = c->eng.spin_us ? c->eng.spin_us : -1;
    d.log_level = c->eng.log_level + 1;
    d.allocator = c->alloc.alloc ? &c->alloc : NULL;
    d.log_fn = c->log.fn;   /* the child logs where its parent does */
    d.log_user = c->log.user;
    _DDP_LOG(c, DDP_LOG_INFO, "comm_split: color %d key %d -> rank %d of %d (store prefix %s)",
             color, key, me, n, prefix);
    memset(&child, 0, sizeof child);
    child.dev_inherited = &inherited;
    child.split_hosts = hosts;
    r = _ddp_comm_init(out, n, me, &d, &child);
    _ddp_free(&c->alloc, hosts);
    if (inherited && c->dev->release_inherited) c->dev->release_inherited(c->dev_state, inherited);
    if (r != DDP_SUCCESS)
        ddp_comm_fail(c, r, "comm_split: the new communicator (color %d, rank %d of %d): %s",
                      color, me, n, ddp_last_init_error());
    return r;
}

/* ---------------------------------------------------------------- reduce, gather, scatter,
 * all-to-all, send/recv, groups: the entry points (their rows are in the operation table
 * above). Their algorithms (ddp_ring.h) run over point-to-point even when a transport runs
 * the collectives; the group queue is below. */
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
    if (c->group_depth++ == 0) { c->group_n = 0; c->group_err = DDP_SUCCESS; }
    if (c->dev) {   /* NCCL's group too */
        _ddp_dev_enter(c);
        if ((r = _ddp_dev_leave(c, c->dev->group(c->dev_state, 1))) != DDP_SUCCESS) {
            c->group_depth--;
            return r;
        }
    }
    return DDP_SUCCESS;
}

DDP_API ddp_result_t ddp_group_end(ddp_comm_t *c) {
    ddp_result_t r;
    if (!c) return DDP_ERR_INVALID_ARGUMENT;
    if (_ddp_usable(c) != DDP_SUCCESS) return DDP_ERR_INVALID_USAGE;
    if (c->group_depth == 0)
        return ddp_comm_fail(c, DDP_ERR_INVALID_USAGE, "group_end without a group_start");
    if (c->dev) {   /* NCCL's group ends with ours: its device calls are issued now */
        ddp_result_t dr;
        _ddp_dev_enter(c);
        dr = _ddp_dev_leave(c, c->dev->group(c->dev_state, 0));
        if (dr != DDP_SUCCESS && c->group_err == DDP_SUCCESS) c->group_err = dr;
    }
    if (--c->group_depth) return DDP_SUCCESS;
    if (c->error != DDP_SUCCESS) { c->group_n = 0; return c->error; }
    if ((r = _ddp_enter(c)) != DDP_SUCCESS) { c->group_n = 0; return r; }
    r = _ddp_group_run(c);   /* empties the queue */
    r = r == DDP_SUCCESS || c->group_err != DDP_SUCCESS ? r : _ddp_finish(c, r);
    _ddp_end(c);
    return r;
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
    return _ddp_p2p_batch(&c->eng, c->p2p, &one, 1);
}

_DDP_PRIVATE ddp_result_t _ddp_group_queue(ddp_comm_t *c, const _ddp_op_t *k) {
    if (c->group_err != DDP_SUCCESS) return DDP_SUCCESS;   /* group_end reports the first */
    if (c->group_n == c->group_cap) {
        int cap = c->group_cap ? 2 * c->group_cap : 16;
        _ddp_op_t *ops = (_ddp_op_t *)ddp_comm_calloc(c, sizeof *ops * (size_t)cap);
        if (!ops) {
            c->group_err = ddp_comm_fail(c, DDP_ERR_OUT_OF_MEMORY, "group: queueing call %d", c->group_n + 1);
            return c->group_err;
        }
        if (c->group_n) memcpy(ops, c->group_ops, sizeof *ops * (size_t)c->group_n);
        ddp_comm_free(c, c->group_ops);
        c->group_ops = ops;
        c->group_cap = cap;
    }
    ((_ddp_op_t *)c->group_ops)[c->group_n++] = *k;
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
    if (!c->fuse_buf && !(c->fuse_buf = (unsigned char *)ddp_comm_calloc(c, _DDP_FUSE_BYTES)))
        return ddp_comm_fail(c, DDP_ERR_OUT_OF_MEMORY, "group_end: the fusion buffer (%zu bytes)",
                             (size_t)_DDP_FUSE_BYTES);
    for (j = 0; j < k; j++) {
        if (ops[j].count) memcpy(c->fuse_buf + off, ops[j].send, ops[j].count * es);
        off += ops[j].count * es;
    }
    _DDP_LOG(c, DDP_LOG_TRACE, "group_end: %d all_reduces fused into one of %zu bytes", k, off);
    o = _ddp_op_make(DDP_CALL_ALL_REDUCE, c->fuse_buf, c->fuse_buf, off / es, ops[0].dtype, ops[0].op, 0);
    if ((r = _ddp_run_op_raw(c, &o)) != DDP_SUCCESS) return r;
    for (off = 0, j = 0; j < k; j++) {
        if (ops[j].count) memcpy(ops[j].recv, c->fuse_buf + off, ops[j].count * es);
        off += ops[j].count * es;
    }
    return DDP_SUCCESS;
}

/* The outermost group_end: the collectives in call order, then all sends and receives at once. */
_DDP_PRIVATE ddp_result_t _ddp_group_run(ddp_comm_t *c) {
    _ddp_op_t *ops = (_ddp_op_t *)c->group_ops;
    int n = c->group_n, i, nsend = 0, nrecv = 0;
    ddp_result_t r;
    c->group_n = 0;
    if (c->group_err != DDP_SUCCESS) {
        _DDP_LOG(c, DDP_LOG_TRACE, "group_end: %d calls not run: one failed its checks", n);
        return c->group_err;
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
    return nsend + nrecv ? _ddp_p2p_batch(&c->eng, c->p2p, ops, n) : DDP_SUCCESS;
}

#endif /* DDP_COMM_IMPLEMENTATION */
