/* ddp.h — libddp: data-parallel collectives for C training code.           v0.1
 *
 * What torch.distributed + DistributedDataParallel give PyTorch, as a header-only C library:
 * several processes (ranks) each hold a model replica and their own data shard; libddp averages
 * their gradients with ring all-reduce over a pluggable transport (TCP sockets by default).
 *
 * DO THIS in exactly one .c file of your program:
 *
 *     #define DDP_IMPLEMENTATION
 *     #include "ddp.h"
 *     #include "transports/ddp_tcp.h"     // including a transport is what compiles it in
 *     #include "ddp_ring.h"               // the ring algorithms (required by ddp.h's collectives)
 *
 * and link with -pthread. Every other file just does #include "ddp.h".
 *
 * BUILD OPTIONS (define before including)
 *   DDP_IMPLEMENTATION     impl. file only  compile the implementation of every libddp header
 *                                           included after it in this file
 *   DDP_STATIC             global           make every public function static (private copy)
 *   DDP_MALLOC/DDP_FREE    impl. file only  allocator; define both or neither
 *   DDP_ASSERT(c)          impl. file only  checks for programmer bugs only (default: assert)
 *
 * RUN-TIME ENVIRONMENT (all optional; the desc struct wins over the environment)
 *   RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE MASTER_ADDR MASTER_PORT   (torchrun's names;
 *       also OMPI_COMM_WORLD_*, PMI_RANK/PMI_SIZE, SLURM_PROCID/SLURM_NTASKS/SLURM_LOCALID)
 *   DDP_TIMEOUT_MS      every blocking wait (default 600000 = 10 min, as torch.distributed)
 *   DDP_DEBUG           NONE | WARN (default: failures) | INFO (decisions) | TRACE, to stderr
 *   DDP_TRANSPORT       force a transport by name ("tcp", ...) instead of the best compiled in
 *   DDP_JOB_SECRET      shared secret; ranks that do not present it are refused at rendezvous
 *   DDP_SOCKET_IFNAME   NCCL syntax: "eth0", "eth,ib" (prefixes), "^docker" (exclude), "=eth0"
 *   DDP_SPIN_US         how long a waiting rank polls before it sleeps in the kernel
 *   DDP_SEGMENT_BYTES   pipeline segment of the ring algorithms
 *
 * EXAMPLE
 *     ddp_comm_t *comm;
 *     if (ddp_comm_init_env(&comm, NULL) != DDP_SUCCESS) { ... }   // under torchrun/ddprun/mpirun
 *     ddp_all_reduce(grad, grad, n, DDP_FLOAT32, DDP_AVG, comm);   // in place: send == recv
 *     ddp_comm_destroy(comm);
 *
 * RULES
 *   - Calls, counts and dtypes are NCCL's: (sendbuf, recvbuf, count, dtype, op, comm), counts in
 *     elements. In place by pointer equality: all-reduce/broadcast send == recv; all-gather
 *     send == recv + rank*sendcount*size; reduce-scatter recv == send + rank*recvcount*size.
 *   - DDP_AVG divides the sum by the world size once (integers: truncating division); fp16/bf16
 *     are reduced in fp32 and rounded to nearest even. Results are bitwise identical on every
 *     rank and deterministic run to run.
 *   - A communicator is used by one thread at a time. Several communicators may coexist.
 *   - Every blocking point times out (DDP_TIMEOUT_MS). A failed collective leaves the
 *     communicator in an error state: later calls return the same error; destroy it.
 *   - Errors: every call returns ddp_result_t; ddp_comm_last_error() says which rank, which peer,
 *     which phase, errno and what was expected. The library never calls abort() or exit().
 */
#ifndef DDP_H_INCLUDED
#define DDP_H_INCLUDED

#include <stddef.h>
#include <stdint.h>

#ifndef DDP_API
#if defined(DDP_STATIC) && (defined(__GNUC__) || defined(__clang__))
#define DDP_API static __attribute__((unused))
#elif defined(DDP_STATIC)
#define DDP_API static
#else
#define DDP_API extern
#endif
#endif

#ifdef __cplusplus
extern "C" {
#endif

#define DDP_VERSION_MAJOR 0
#define DDP_VERSION_MINOR 1

/* Shared with ddp_sampler.h, which may be used alone. */
#ifndef DDP_RESULT_DEFINED
#define DDP_RESULT_DEFINED
typedef enum { DDP_SUCCESS = 0, DDP_ERR_INVALID_ARGUMENT, DDP_ERR_INVALID_USAGE, DDP_ERR_SYSTEM,
               DDP_ERR_REMOTE, DDP_ERR_TIMEOUT, DDP_ERR_ABORTED, DDP_ERR_OUT_OF_MEMORY,
               DDP_ERR_MISMATCH, DDP_ERR_AUTH, DDP_ERR_UNSUPPORTED, DDP_ERR_INTERNAL } ddp_result_t;
#endif
#define DDP_NUM_RESULTS 12

/* Values are NCCL's (ncclDataType_t / ncclRedOp_t), so the NCCL transport can cast directly. */
typedef enum { DDP_INT8 = 0, DDP_UINT8, DDP_INT32, DDP_UINT32, DDP_INT64, DDP_UINT64,
               DDP_FLOAT16, DDP_FLOAT32, DDP_FLOAT64, DDP_BFLOAT16 } ddp_dtype_t;
#define DDP_NUM_DTYPES 10
typedef enum { DDP_SUM = 0, DDP_PROD, DDP_MAX, DDP_MIN, DDP_AVG } ddp_op_t;
#define DDP_NUM_OPS 5

typedef struct ddp_comm ddp_comm_t;
typedef struct ddp_store ddp_store_t;
struct ddp_transport;

typedef enum { DDP_LOG_NONE = 0, DDP_LOG_WARN, DDP_LOG_INFO, DDP_LOG_TRACE } ddp_log_level_t;

/* Run-time allocator (all or none). Zero = DDP_MALLOC/DDP_FREE. */
typedef struct ddp_allocator {
    void *(*alloc)(size_t size, void *user);
    void (*free)(void *ptr, void *user);
    void *user;
} ddp_allocator_t;

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
} ddp_comm_desc_t;

DDP_API const char *ddp_strerror(ddp_result_t r);                   /* never NULL */
DDP_API size_t ddp_dtype_size(ddp_dtype_t dtype);                   /* 0 if invalid */
DDP_API const char *ddp_dtype_name(ddp_dtype_t dtype);              /* "float32", ... */
DDP_API const char *ddp_op_name(ddp_op_t op);                       /* "sum", ... */

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
DDP_API ddp_result_t ddp_comm_get_async_error(ddp_comm_t *comm, ddp_result_t *async_error);
/* MPI_Comm_split / ncclCommSplit: collective over comm; ranks with the same color form a new
 * communicator, ordered by (key, rank in comm); color DDP_SPLIT_NOCOLOR gives *newcomm = NULL. */
#define DDP_SPLIT_NOCOLOR (-1)
DDP_API ddp_result_t ddp_comm_split(ddp_comm_t *comm, int color, int key, ddp_comm_t **newcomm);

/* ---- gradient bucket reducer (PyTorch DistributedDataParallel's Reducer) ----
 * Overlaps the gradient all-reduce with the backward pass. Register each parameter's gradient
 * in forward (model definition) order; from backward, call grad_ready as each gradient is
 * complete; finish before the optimizer step. Gradients are grouped into buckets in reverse
 * registration order (the order backward produces them), one dtype per bucket, up to
 * bucket_cap_bytes, the first bucket (the last parameters) up to first_bucket_bytes; a bucket's
 * async all-reduce starts as soon as all its gradients are ready and every earlier bucket has
 * started, so buckets are reduced in the same order on every rank whatever order the ranks mark
 * gradients in. After the first synchronised iteration the buckets are rebuilt once in the
 * order the gradients actually became ready on rank 0 (broadcast, so identical everywhere).
 * finish waits for every bucket and leaves each gradient holding the average over the ranks.
 *   - The parameter list closes (buckets laid out and allocated, once) at the first
 *     ddp_reducer_grad/grad_ready/finish/num_buckets/bucket_info; nothing allocates per
 *     iteration (the one-time rebuild reallocates the buckets).
 *   - gradient_as_bucket_view = 1: the gradients live in the buckets (no copy in or out); get
 *     parameter i's storage with ddp_reducer_grad, again after the first finish (the rebuild
 *     moves it, values kept). Otherwise the progress thread copies a bucket's gradients in
 *     when the bucket launches and the averages back as soon as its all-reduce completes
 *     (at finish with find_unused), so the training thread only marks: do not touch a gradient
 *     between marking it ready and finish (autograd does not either).
 *   - find_unused = 1: parameters not marked ready by finish are reduced as zeros; one whose
 *     gradient no rank produced keeps its gradient untouched (PyTorch: globally unused). Without
 *     it an unmarked parameter is DDP_ERR_INVALID_USAGE at finish, naming it (the buckets are
 *     still reduced, with zeros, so the other ranks do not hang). No rebuild with find_unused.
 *   - no_sync: grad_ready and finish do nothing; keep accumulating into the gradients; the next
 *     synchronised iteration reduces the sum (mark every accumulated gradient ready in it).
 *   - comm_hook replaces the all-reduce of each bucket (PyTorch's register_comm_hook): it gets
 *     the bucket's flat buffer, in bucket order on every rank, and must leave the global
 *     AVERAGE there (the reducer does not divide), synchronously (leave *req zeroed) or through
 *     an async collective on comm whose request it stores in *req; comm_hook_done, if set, runs
 *     at finish after that request completed (PyTorch's future.then: e.g. decompress).
 *     compression = DDP_COMPRESS_FP16/BF16 is the built-in fp16_compress_hook/bf16: float32 and
 *     float64 buckets are cast (after dividing by the world size), all-reduced, cast back.
 *   - Marking a parameter twice in an iteration, finish twice in a row, a bad index:
 *     DDP_ERR_INVALID_USAGE / DDP_ERR_INVALID_ARGUMENT, explained by ddp_reducer_last_error
 *     (and ddp_comm_last_error); the communicator stays usable.
 *   - Used by one thread at a time, as its communicator; it issues at most DDP_MAX_REQUESTS/2
 *     requests at once (it waits for the oldest bucket beyond that), the rest are the caller's. */
typedef struct ddp_reducer ddp_reducer_t;
typedef enum { DDP_COMPRESS_NONE = 0, DDP_COMPRESS_FP16, DDP_COMPRESS_BF16 } ddp_compress_t;
typedef ddp_result_t (*ddp_comm_hook_fn)(void *state, ddp_comm_t *comm, int bucket, void *buf,
                                         size_t count, ddp_dtype_t dtype, ddp_request_t *req);
typedef ddp_result_t (*ddp_comm_hook_done_fn)(void *state, ddp_comm_t *comm, int bucket,
                                              void *buf, size_t count, ddp_dtype_t dtype);
typedef struct ddp_reducer_desc {  /* zero = defaults */
    size_t bucket_cap_bytes;       /* 0: 25 MiB, as DDP */
    size_t first_bucket_bytes;     /* 0: 1 MiB, as DDP */
    int find_unused;               /* find_unused_parameters */
    int gradient_as_bucket_view;
    ddp_compress_t compression;    /* built-in hook; not together with comm_hook */
    ddp_comm_hook_fn comm_hook;    /* NULL: all-reduce (average) each bucket */
    ddp_comm_hook_done_fn comm_hook_done;   /* optional */
    void *comm_hook_state;
} ddp_reducer_desc_t;
#define DDP_REDUCER_DEFAULT_BUCKET_CAP_BYTES ((size_t)25 << 20)
#define DDP_REDUCER_DEFAULT_FIRST_BUCKET_BYTES ((size_t)1 << 20)
DDP_API ddp_result_t ddp_reducer_create(ddp_reducer_t **r, ddp_comm_t *comm,
                                        const ddp_reducer_desc_t *desc);
/* In forward (model definition) order; returns the parameter's index (from 0), or -1 (bad
 * arguments, out of memory, or the list is closed). grad may be NULL with gradient_as_bucket_view. */
DDP_API int ddp_reducer_add_param(ddp_reducer_t *r, void *grad, size_t count, ddp_dtype_t dtype);
DDP_API ddp_result_t ddp_reducer_grad_ready(ddp_reducer_t *r, int param);  /* from backward */
DDP_API ddp_result_t ddp_reducer_finish(ddp_reducer_t *r);  /* waits; grads hold the average */
DDP_API ddp_result_t ddp_reducer_set_no_sync(ddp_reducer_t *r, int no_sync);
DDP_API ddp_result_t ddp_reducer_destroy(ddp_reducer_t *r);
/* Parameter i's gradient storage: inside its bucket with gradient_as_bucket_view (zeroed at
 * first), else the pointer given to add_param. NULL for a bad index. */
DDP_API void *ddp_reducer_grad(ddp_reducer_t *r, int param);
DDP_API int ddp_reducer_num_buckets(ddp_reducer_t *r);     /* -1 on bad arguments */
/* Bucket b, in reduction order: its parameter indices (up to cap into params, in bucket order),
 * bytes and dtype; returns how many parameters it has, or -1. */
DDP_API int ddp_reducer_bucket_info(ddp_reducer_t *r, int bucket, int *params, int cap,
                                    size_t *bytes, ddp_dtype_t *dtype);
DDP_API int ddp_reducer_rebuilt(const ddp_reducer_t *r);   /* 1 once the buckets were rebuilt */
DDP_API const char *ddp_reducer_last_error(const ddp_reducer_t *r);   /* "" when none */
/* Every rank's params[i] (counts[i] x dtypes[i]) becomes root's: DDP's broadcast of the initial
 * model state; small parameters of one dtype travel coalesced. */
DDP_API ddp_result_t ddp_broadcast_params(ddp_comm_t *comm, void *const *params,
                                          const size_t *counts, const ddp_dtype_t *dtypes,
                                          int nparams, int root);

/* ---- key-value store (c10d TCPStore semantics) ----
 * One server (rank 0 of a communicator, or whoever creates it with is_server = 1); every
 * participant is a client. get/wait block until the key exists or the timeout passes. */
typedef struct ddp_store_desc {
    int timeout_ms;               /* 0: DDP_TIMEOUT_MS, else 600000; < 0 = wait forever */
    const char *secret;           /* NULL: DDP_JOB_SECRET, else none */
    int log_level;                /* as in ddp_comm_desc_t */
    int log_rank;                 /* rank shown in log lines, + 1 (0 = unknown) */
} ddp_store_desc_t;
#define DDP_STORE_MAX_KEY 1024
#define DDP_STORE_MAX_VALUE (16u << 20)
DDP_API ddp_result_t ddp_store_open(ddp_store_t **store, const char *host, int port, int is_server,
                                    const ddp_store_desc_t *desc);
DDP_API ddp_result_t ddp_store_close(ddp_store_t *store);
DDP_API ddp_result_t ddp_store_set(ddp_store_t *store, const char *key, const void *value,
                                   size_t len);
/* Waits for the key; copies up to cap bytes; *len = the value's full length. */
DDP_API ddp_result_t ddp_store_get(ddp_store_t *store, const char *key, void *value, size_t cap,
                                   size_t *len);
DDP_API ddp_result_t ddp_store_add(ddp_store_t *store, const char *key, int64_t delta,
                                   int64_t *result);
/* Sets key to desired if its value equals expected (a missing key matches expected_len == 0);
 * *actual receives the value after the call (up to cap bytes, full length in *actual_len). */
DDP_API ddp_result_t ddp_store_compare_set(ddp_store_t *store, const char *key,
                                           const void *expected, size_t expected_len,
                                           const void *desired, size_t desired_len,
                                           void *actual, size_t cap, size_t *actual_len);
DDP_API ddp_result_t ddp_store_wait(ddp_store_t *store, const char *const *keys, int nkeys,
                                    int timeout_ms);        /* 0: the store's timeout */
DDP_API ddp_result_t ddp_store_check(ddp_store_t *store, const char *key, int *exists);
DDP_API ddp_result_t ddp_store_delete(ddp_store_t *store, const char *key, int *deleted);
DDP_API int ddp_store_port(const ddp_store_t *store);       /* server's port (useful with port 0) */
DDP_API const char *ddp_store_last_error(const ddp_store_t *store);


/* ---- transport interface (for transport authors; users never call it) ----
 * Version 1. A transport moves tagged byte messages between two ranks over a bidirectional
 * connection (Gloo's "pair"), with non-blocking connect/accept and isend/irecv/test as NCCL's
 * net plugin. Messages on one connection and direction complete in posting order; a posted
 * irecv must match the next message's tag and length exactly (else DDP_ERR_MISMATCH), which is
 * how ranks calling different collectives or counts are caught instead of corrupting data.
 * Registered memory (reg_mr) lets RDMA transports write straight into user buffers; a transport
 * that replaces whole collectives (NCCL) fills `coll`; the communicator then skips the ring.
 * Including a transport header registers it (a constructor calls ddp_transport_register). */
#define DDP_TRANSPORT_VERSION 1
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
    /* Called once every peer is connected through this transport (and only then): DDP_SUCCESS
     * to take over the collectives, anything else to leave them to the ring. */
    ddp_result_t (*enable)(void *state);
} ddp_coll_provider_t;

typedef struct ddp_transport {
    int version;                  /* DDP_TRANSPORT_VERSION */
    const char *name;             /* "tcp", "shm", "ibverbs", "nccl" */
    int priority;                 /* "auto" picks the highest that reaches a peer */
    /* Per communicator: open listeners and publish this rank's address with ddp_comm_publish. */
    ddp_result_t (*init)(ddp_comm_t *comm, void **state);
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
    const ddp_coll_provider_t *coll;     /* NULL: point-to-point only */
} ddp_transport_t;

DDP_API ddp_result_t ddp_transport_register(const ddp_transport_t *transport);
DDP_API const ddp_transport_t *ddp_transport_find(const char *name);
/* Helpers a transport uses from init/connect/accept. */
DDP_API ddp_result_t ddp_comm_publish(ddp_comm_t *comm, const char *transport, const void *addr,
                                      size_t len);
DDP_API ddp_result_t ddp_comm_lookup(ddp_comm_t *comm, const char *transport, int peer,
                                     void *addr, size_t cap, size_t *len);
DDP_API uint64_t ddp_comm_id(const ddp_comm_t *comm);          /* random per communicator */
/* The communicator's allocator (desc.allocator, else DDP_MALLOC/DDP_FREE); calloc zeroes. */
DDP_API void *ddp_comm_calloc(ddp_comm_t *comm, size_t size);
DDP_API void ddp_comm_free(ddp_comm_t *comm, void *ptr);
DDP_API int ddp_comm_timeout_ms(const ddp_comm_t *comm);
DDP_API const char *ddp_comm_ifname(const ddp_comm_t *comm);   /* DDP_SOCKET_IFNAME or NULL */
DDP_API const char *ddp_comm_master_addr(const ddp_comm_t *comm);
DDP_API const char *ddp_comm_host_id(const ddp_comm_t *comm, int peer);
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

/* The ring algorithms and reduction kernels live in their own header; ddp.h's collectives need
 * them, so including ddp.h brings them in (and DDP_IMPLEMENTATION builds them). */
#include "ddp_ring.h"
#endif /* DDP_H_INCLUDED */

/* ============================================================================================
 * IMPLEMENTATION
 * ========================================================================================== */
#if defined(DDP_IMPLEMENTATION) && !defined(DDP_IMPL_INCLUDED)
#define DDP_IMPL_INCLUDED

#if !defined(_GNU_SOURCE)
#error "libddp: the implementation file must define _GNU_SOURCE before any #include (pipe2, accept4, MSG_NOSIGNAL, getifaddrs); or compile it with -D_GNU_SOURCE"
#endif

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <arpa/inet.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <sched.h>

#if defined(DDP_MALLOC) && defined(DDP_FREE)
#elif !defined(DDP_MALLOC) && !defined(DDP_FREE)
#define DDP_MALLOC(sz) malloc(sz)
#define DDP_FREE(p) free(p)
#else
#error "libddp: define both DDP_MALLOC and DDP_FREE, or neither"
#endif
#ifndef DDP_ASSERT
#include <assert.h>
#define DDP_ASSERT(c) assert(c)
#endif

#if defined(__GNUC__) || defined(__clang__)
#define _DDP_PRIVATE static __attribute__((unused))
#else
#define _DDP_PRIVATE static
#endif

#define _DDP_DEFAULT_TIMEOUT_MS 600000
#define _DDP_DEFAULT_PORT 29500
#define _DDP_DEFAULT_SPIN_US 50
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
#define _DDP_LANE_MIN_BYTES ((size_t)4 << 20)
#define _DDP_MAX_TRANSPORTS 8
#define _DDP_COMM_MAGIC 0x44445043u /* "DDPC" */
#define _DDP_STORE_MAGIC 0x44445053u /* "DDPS" */
#define _DDP_STORE_PROTO 1u

/* ---------------------------------------------------------------- small utilities */
_DDP_PRIVATE int64_t _ddp_now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

/* Milliseconds left before deadline_us (a deadline of 0 means none): what poll() should get. */
_DDP_PRIVATE int _ddp_ms_left(int64_t deadline_us) {
    int64_t left;
    if (deadline_us == 0) return -1;
    left = deadline_us - _ddp_now_us();
    if (left <= 0) return 0;
    return left / 1000 > INT_MAX ? INT_MAX : (int)((left + 999) / 1000);
}

_DDP_PRIVATE int64_t _ddp_deadline(int timeout_ms) {
    return timeout_ms < 0 ? 0 : _ddp_now_us() + (int64_t)timeout_ms * 1000;
}

_DDP_PRIVATE void *_ddp_alloc(const ddp_allocator_t *a, size_t n) {
    return (a && a->alloc) ? a->alloc(n, a->user) : DDP_MALLOC(n);
}
_DDP_PRIVATE void _ddp_free(const ddp_allocator_t *a, void *p) {
    if (!p) return;
    if (a && a->free) a->free(p, a->user); else DDP_FREE(p);
}
_DDP_PRIVATE void *_ddp_calloc(const ddp_allocator_t *a, size_t n) {
    void *p = _ddp_alloc(a, n);
    if (p) memset(p, 0, n);
    return p;
}

_DDP_PRIVATE void _ddp_strlcpy(char *dst, const char *src, size_t cap) {
    size_t n;
    if (!cap) return;
    n = src ? strlen(src) : 0;
    if (n >= cap) n = cap - 1;
    if (n) memcpy(dst, src, n);
    dst[n] = 0;
}

/* Parses a whole decimal integer in [lo, hi]; 0 on success. */
_DDP_PRIVATE int _ddp_parse_long(const char *s, long lo, long hi, long *out) {
    char *end;
    long v;
    if (!s || !*s) return -1;
    errno = 0;
    v = strtol(s, &end, 10);
    if (errno || *end || v < lo || v > hi) return -1;
    *out = v;
    return 0;
}

_DDP_PRIVATE size_t _ddp_parse_size(const char *s) {
    char *end;
    unsigned long long v;
    if (!s || !*s) return 0;
    errno = 0;
    v = strtoull(s, &end, 10);
    if (errno) return 0;
    if (*end == 'k' || *end == 'K') v <<= 10, end++;
    else if (*end == 'm' || *end == 'M') v <<= 20, end++;
    return *end ? 0 : (size_t)v;
}

_DDP_PRIVATE int _ddp_log_level_from_env(void) {
    const char *s = getenv("DDP_DEBUG");
    if (!s || !*s) return DDP_LOG_WARN;   /* failures are always told, as NCCL's WARN */
    if (!strcasecmp(s, "NONE") || !strcmp(s, "0") || !strcasecmp(s, "OFF")) return DDP_LOG_NONE;
    if (!strcasecmp(s, "WARN")) return DDP_LOG_WARN;
    if (!strcasecmp(s, "INFO")) return DDP_LOG_INFO;
    if (!strcasecmp(s, "TRACE")) return DDP_LOG_TRACE;
    if (!strcasecmp(s, "VERSION")) return DDP_LOG_WARN;
    return DDP_LOG_WARN;
}

static const char *const _ddp_level_names[] = {"", "WARN", "INFO", "TRACE"};

/* One write(2) per line so ranks sharing a terminal never interleave mid-line. */
_DDP_PRIVATE void _ddp_vlog(int rank, int level, const char *fmt, va_list ap) {
    char line[2048];
    int n = snprintf(line, sizeof line, "[ddp rank %d] %s ", rank, _ddp_level_names[level]);
    if (n < 0) return;
    if ((size_t)n < sizeof line) {
        int m = vsnprintf(line + n, sizeof line - (size_t)n, fmt, ap);
        if (m > 0) n += m;
    }
    if ((size_t)n >= sizeof line - 1) n = (int)sizeof line - 2;
    line[n++] = '\n';
    if (write(2, line, (size_t)n) < 0) { /* nowhere left to report it */ }
}

_DDP_PRIVATE void _ddp_log_str(int rank, int level, const char *msg) {
    char line[1200];
    int n = snprintf(line, sizeof line, "[ddp rank %d] %s %s\n", rank, _ddp_level_names[level], msg);
    if (n > 0 && write(2, line, (size_t)n < sizeof line ? (size_t)n : sizeof line - 1) < 0) { }
}

/* The last failed ddp_comm_init* of this thread: there is no communicator to ask. */
static __thread char _ddp_init_error[1024];
DDP_API const char *ddp_last_init_error(void) { return _ddp_init_error; }

/* ---------------------------------------------------------------- names */
DDP_API const char *ddp_strerror(ddp_result_t r) {
    switch (r) {
    case DDP_SUCCESS: return "success";
    case DDP_ERR_INVALID_ARGUMENT: return "invalid argument";
    case DDP_ERR_INVALID_USAGE: return "invalid usage";
    case DDP_ERR_SYSTEM: return "system call failed";
    case DDP_ERR_REMOTE: return "remote rank failed or disconnected";
    case DDP_ERR_TIMEOUT: return "timed out";
    case DDP_ERR_ABORTED: return "aborted";
    case DDP_ERR_OUT_OF_MEMORY: return "out of memory";
    case DDP_ERR_MISMATCH: return "ranks disagree (mismatched call, count, dtype or world size)";
    case DDP_ERR_AUTH: return "authentication failed (job secret)";
    case DDP_ERR_UNSUPPORTED: return "unsupported";
    case DDP_ERR_INTERNAL: return "internal error";
    }
    return "unknown ddp_result_t";
}

DDP_API size_t ddp_dtype_size(ddp_dtype_t d) {
    switch (d) {
    case DDP_INT8: case DDP_UINT8: return 1;
    case DDP_FLOAT16: case DDP_BFLOAT16: return 2;
    case DDP_INT32: case DDP_UINT32: case DDP_FLOAT32: return 4;
    case DDP_INT64: case DDP_UINT64: case DDP_FLOAT64: return 8;
    }
    return 0;
}

DDP_API const char *ddp_dtype_name(ddp_dtype_t d) {
    static const char *const names[DDP_NUM_DTYPES] = {"int8", "uint8", "int32", "uint32", "int64",
        "uint64", "float16", "float32", "float64", "bfloat16"};
    return ((unsigned)d < DDP_NUM_DTYPES) ? names[d] : "invalid-dtype";
}

DDP_API const char *ddp_op_name(ddp_op_t op) {
    static const char *const names[DDP_NUM_OPS] = {"sum", "prod", "max", "min", "avg"};
    return ((unsigned)op < DDP_NUM_OPS) ? names[op] : "invalid-op";
}

/* ---------------------------------------------------------------- sockets (shared with TCP) */
_DDP_PRIVATE int _ddp_set_nonblock(int fd, int on) {
    int fl = fcntl(fd, F_GETFL, 0);
    if (fl < 0) return -1;
    return fcntl(fd, F_SETFL, on ? (fl | O_NONBLOCK) : (fl & ~O_NONBLOCK));
}

_DDP_PRIVATE void _ddp_sockaddr_str(const struct sockaddr *sa, char *out, size_t cap) {
    char host[INET6_ADDRSTRLEN] = "?";
    int port = 0;
    if (sa->sa_family == AF_INET) {
        const struct sockaddr_in *in = (const struct sockaddr_in *)(const void *)sa;
        inet_ntop(AF_INET, &in->sin_addr, host, sizeof host);
        port = ntohs(in->sin_port);
        snprintf(out, cap, "%s:%d", host, port);
    } else if (sa->sa_family == AF_INET6) {
        const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)(const void *)sa;
        inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof host);
        port = ntohs(in6->sin6_port);
        snprintf(out, cap, "[%s]:%d", host, port);
    } else {
        snprintf(out, cap, "(family %d)", sa->sa_family);
    }
}

/* Sends all of buf before the deadline; 0 on success, else -errno (-ETIMEDOUT, -EPIPE...). */
_DDP_PRIVATE int _ddp_send_all(int fd, const void *buf, size_t len, int64_t deadline_us) {
    const char *p = (const char *)buf;
    while (len) {
        ssize_t n = send(fd, p, len, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n > 0) { p += n; len -= (size_t)n; continue; }
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            struct pollfd pfd;
            int ms = _ddp_ms_left(deadline_us), r;
            if (ms == 0) return -ETIMEDOUT;
            pfd.fd = fd; pfd.events = POLLOUT; pfd.revents = 0;
            r = poll(&pfd, 1, ms);
            if (r < 0 && errno != EINTR) return -errno;
            continue;
        }
        return n == 0 ? -EPIPE : -errno;
    }
    return 0;
}

/* Receives exactly len bytes before the deadline; 0, -ECONNRESET on EOF, or -errno. */
_DDP_PRIVATE int _ddp_recv_all(int fd, void *buf, size_t len, int64_t deadline_us) {
    char *p = (char *)buf;
    while (len) {
        ssize_t n = recv(fd, p, len, MSG_DONTWAIT);
        if (n > 0) { p += n; len -= (size_t)n; continue; }
        if (n == 0) return -ECONNRESET;
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
            struct pollfd pfd;
            int ms = _ddp_ms_left(deadline_us), r;
            if (ms == 0) return -ETIMEDOUT;
            pfd.fd = fd; pfd.events = POLLIN; pfd.revents = 0;
            r = poll(&pfd, 1, ms);
            if (r < 0 && errno != EINTR) return -errno;
            continue;
        }
        return -errno;
    }
    return 0;
}

/* Connects to host:port, retrying refused/unreachable with backoff until the deadline (the
 * server may not be up yet: ranks start in any order). Returns fd or -errno; *why says what. */
_DDP_PRIVATE int _ddp_tcp_connect_retry(const char *host, int port, int64_t deadline_us,
                                        char *why, size_t whycap) {
    struct addrinfo hints, *res = NULL, *ai;
    char portstr[16];
    int backoff_ms = 10, last_err = ETIMEDOUT, rc;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    snprintf(portstr, sizeof portstr, "%d", port);
    for (;;) {
        rc = getaddrinfo(host, portstr, &hints, &res);
        if (rc != 0) {
            snprintf(why, whycap, "cannot resolve master address '%.200s': %s", host, gai_strerror(rc));
            if (rc != EAI_AGAIN) return -EHOSTUNREACH;
        } else {
            for (ai = res; ai; ai = ai->ai_next) {
                int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
                int one = 1, ms;
                if (fd < 0) { last_err = errno; continue; }
                setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
                _ddp_set_nonblock(fd, 1);
                if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0) { freeaddrinfo(res); return fd; }
                if (errno == EINPROGRESS) {
                    struct pollfd pfd;
                    pfd.fd = fd; pfd.events = POLLOUT; pfd.revents = 0;
                    ms = _ddp_ms_left(deadline_us);
                    if (ms < 0 || ms > 2000) ms = 2000;
                    if (poll(&pfd, 1, ms) == 1) {
                        int err = 0;
                        socklen_t len = sizeof err;
                        getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
                        if (err == 0) { freeaddrinfo(res); return fd; }
                        last_err = err;
                    } else {
                        last_err = ETIMEDOUT;
                    }
                } else {
                    last_err = errno;
                }
                close(fd);
            }
            freeaddrinfo(res);
            res = NULL;
            snprintf(why, whycap, "cannot connect to %.200s:%d: %s", host, port, strerror(last_err));
        }
        if (_ddp_ms_left(deadline_us) == 0) return -(last_err ? last_err : ETIMEDOUT);
        {
            int ms = _ddp_ms_left(deadline_us);
            struct timespec ts;
            if (ms >= 0 && ms < backoff_ms) backoff_ms = ms;
            ts.tv_sec = backoff_ms / 1000;
            ts.tv_nsec = (long)(backoff_ms % 1000) * 1000000L;
            nanosleep(&ts, NULL);
            backoff_ms = backoff_ms * 2 > 1000 ? 1000 : backoff_ms * 2;
        }
    }
}

/* ---------------------------------------------------------------- key-value store
 * Wire (native byte order; the magic rejects strangers and peers of the other byte order):
 *   request  {u32 magic, u32 op, u32 klen, u32 v1len, u32 v2len, u32 flags, i64 arg} key v1 v2
 *   response {u32 magic, u32 status, u32 vlen, u32 pad, i64 num} value
 * A connection must open with HELLO (v1 = job secret, arg = protocol version). GET and WAIT are
 * answered when their keys exist, so a client blocks in recv with its own timeout. */
enum { _DDP_ST_HELLO = 1, _DDP_ST_SET, _DDP_ST_GET, _DDP_ST_ADD, _DDP_ST_CAS, _DDP_ST_WAIT,
       _DDP_ST_CHECK, _DDP_ST_DELETE, _DDP_ST_NUM_OPS };
#define _DDP_ST_WAIT_ANY 1u

typedef struct { uint32_t magic, op, klen, v1len, v2len, flags; int64_t arg; } _ddp_store_req_t;
typedef struct { uint32_t magic, status, vlen, pad; int64_t num; } _ddp_store_resp_t;

typedef struct _ddp_kv {
    struct _ddp_kv *next;
    uint32_t klen, vlen;
    char *key;
    unsigned char *val;
} _ddp_kv_t;

typedef struct {
    int fd;
    int authed;
    int waiting;              /* a GET/WAIT parked until its keys exist */
    unsigned char *in;        /* the request being read (kept while waiting) */
    size_t in_len, in_cap;
    unsigned char *out;
    size_t out_len, out_off, out_cap;
    char addr[64];
} _ddp_store_client_t;

#define _DDP_KV_BUCKETS 1024
struct ddp_store {
    /* client side */
    int fd;
    pthread_mutex_t mu;
    char host[256];
    int port;
    int timeout_ms;
    int quick;                /* failure reporting: short waits, no reconnecting to a dead master */
    int log_level, log_rank;
    char secret[256];
    char last_error[512];
    /* server side (is_server) */
    int is_server;
    int listen_fd;
    int wake[2];
    pthread_t thread;
    int thread_started;
    int stop;                 /* set once by ddp_store_close; atomic access */
    pthread_mutex_t srv_mu;   /* guards nclients for ddp_store_close */
    int nclients;
    _ddp_store_client_t *clients;
    int clients_cap;
    _ddp_kv_t *buckets[_DDP_KV_BUCKETS];
};

_DDP_PRIVATE void _ddp_store_log(const ddp_store_t *s, int level, const char *fmt, ...) {
    va_list ap;
    if (!s || s->log_level < level) return;
    va_start(ap, fmt);
    _ddp_vlog(s->log_rank - 1, level, fmt, ap);
    va_end(ap);
}

_DDP_PRIVATE ddp_result_t _ddp_store_err(ddp_store_t *s, ddp_result_t r, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s->last_error, sizeof s->last_error, fmt, ap);
    va_end(ap);
    _ddp_store_log(s, DDP_LOG_WARN, "store: %s (%s)", s->last_error, ddp_strerror(r));
    return r;
}

/* FNV-1a (public domain hash, http://www.isthe.com/chongo/tech/comp/fnv/). */
_DDP_PRIVATE uint64_t _ddp_fnv1a(const void *data, size_t n, uint64_t h) {
    const unsigned char *p = (const unsigned char *)data;
    size_t i;
    for (i = 0; i < n; i++) { h ^= p[i]; h *= 1099511628211ull; }
    return h;
}
#define _DDP_FNV_INIT 14695981039346656037ull

_DDP_PRIVATE _ddp_kv_t **_ddp_kv_slot(ddp_store_t *s, const char *key, uint32_t klen) {
    _ddp_kv_t **pp = &s->buckets[_ddp_fnv1a(key, klen, _DDP_FNV_INIT) % _DDP_KV_BUCKETS];
    while (*pp && !((*pp)->klen == klen && memcmp((*pp)->key, key, klen) == 0)) pp = &(*pp)->next;
    return pp;
}

_DDP_PRIVATE int _ddp_kv_put(ddp_store_t *s, const char *key, uint32_t klen, const void *val,
                             uint32_t vlen) {
    _ddp_kv_t **pp = _ddp_kv_slot(s, key, klen), *e = *pp;
    unsigned char *v = (unsigned char *)DDP_MALLOC(vlen ? vlen : 1);
    if (!v) return -1;
    if (vlen) memcpy(v, val, vlen);
    if (!e) {
        e = (_ddp_kv_t *)DDP_MALLOC(sizeof *e);
        if (!e) { DDP_FREE(v); return -1; }
        e->key = (char *)DDP_MALLOC(klen ? klen : 1);
        if (!e->key) { DDP_FREE(v); DDP_FREE(e); return -1; }
        memcpy(e->key, key, klen);
        e->klen = klen;
        e->next = NULL;
        *pp = e;
    } else {
        DDP_FREE(e->val);
    }
    e->val = v;
    e->vlen = vlen;
    return 0;
}

_DDP_PRIVATE void _ddp_client_out(_ddp_store_client_t *c, uint32_t status, int64_t num,
                                  const void *val, uint32_t vlen) {
    _ddp_store_resp_t r;
    size_t need = c->out_len + sizeof r + vlen;
    if (need > c->out_cap) {
        size_t cap = need * 2;
        unsigned char *p = (unsigned char *)DDP_MALLOC(cap);
        if (!p) { shutdown(c->fd, SHUT_RDWR); return; }   /* the poll loop drops it */
        if (c->out_len) memcpy(p, c->out, c->out_len);
        DDP_FREE(c->out);
        c->out = p;
        c->out_cap = cap;
    }
    r.magic = _DDP_STORE_MAGIC; r.status = status; r.vlen = vlen; r.pad = 0; r.num = num;
    memcpy(c->out + c->out_len, &r, sizeof r);
    if (vlen) memcpy(c->out + c->out_len + sizeof r, val, vlen);
    c->out_len += sizeof r + vlen;
}

/* Keys of a WAIT are NUL-separated in the key field. 1 when the wait is satisfied. */
_DDP_PRIVATE int _ddp_store_wait_ready(ddp_store_t *s, const char *keys, uint32_t klen, int any) {
    uint32_t off = 0;
    int all = 1;
    while (off < klen) {
        uint32_t n = 0;
        while (off + n < klen && keys[off + n]) n++;
        if (*_ddp_kv_slot(s, keys + off, n)) { if (any) return 1; }
        else all = 0;
        off += n + 1;
    }
    return any ? 0 : all;
}

/* Executes the complete request in c->in. Returns 0 normally, -1 to drop the client. */
_DDP_PRIVATE int _ddp_store_serve(ddp_store_t *s, _ddp_store_client_t *c) {
    _ddp_store_req_t rq;
    const char *key;
    const unsigned char *v1, *v2;
    _ddp_kv_t *e;
    memcpy(&rq, c->in, sizeof rq);
    key = (const char *)c->in + sizeof rq;
    v1 = (const unsigned char *)key + rq.klen;
    v2 = v1 + rq.v1len;
    if (!c->authed) {
        size_t sl = strlen(s->secret), i;
        c->in_len = 0;
        unsigned diff = (unsigned)(sl != rq.v1len);
        if (rq.op != _DDP_ST_HELLO) {
            _ddp_store_log(s, DDP_LOG_WARN, "store: client %s sent op %u before HELLO; dropped",
                           c->addr, rq.op);
            return -1;
        }
        if (rq.arg != (int64_t)_DDP_STORE_PROTO) {
            _ddp_store_log(s, DDP_LOG_WARN, "store: client %s speaks protocol %lld, we speak %u",
                           c->addr, (long long)rq.arg, _DDP_STORE_PROTO);
            _ddp_client_out(c, DDP_ERR_MISMATCH, 0, NULL, 0);
            return 0;
        }
        for (i = 0; i < rq.v1len && i < sl; i++) diff |= (unsigned)(v1[i] ^ (unsigned char)s->secret[i]);
        if (diff) {
            _ddp_store_log(s, DDP_LOG_WARN, "store: client %s presented a wrong job secret; refused",
                           c->addr);
            _ddp_client_out(c, DDP_ERR_AUTH, 0, NULL, 0);
            return 0;
        }
        c->authed = 1;
        pthread_mutex_lock(&s->srv_mu);
        s->nclients++;
        pthread_mutex_unlock(&s->srv_mu);
        _ddp_client_out(c, DDP_SUCCESS, 0, NULL, 0);
        return 0;
    }
    switch (rq.op) {
    case _DDP_ST_SET:
        if (_ddp_kv_put(s, key, rq.klen, v1, rq.v1len)) { _ddp_client_out(c, DDP_ERR_OUT_OF_MEMORY, 0, NULL, 0); break; }
        _ddp_client_out(c, DDP_SUCCESS, 0, NULL, 0);
        break;
    case _DDP_ST_GET:
        e = *_ddp_kv_slot(s, key, rq.klen);
        if (!e) { c->waiting = 1; return 0; }
        _ddp_client_out(c, DDP_SUCCESS, e->vlen, e->val, e->vlen);
        break;
    case _DDP_ST_ADD: {
        char buf[32];
        long long cur = 0;
        e = *_ddp_kv_slot(s, key, rq.klen);
        if (e) {
            char tmp[32];
            size_t n = e->vlen < sizeof tmp - 1 ? e->vlen : sizeof tmp - 1;
            memcpy(tmp, e->val, n);
            tmp[n] = 0;
            cur = strtoll(tmp, NULL, 10);
        }
        cur = (long long)((unsigned long long)cur + (unsigned long long)rq.arg);
        snprintf(buf, sizeof buf, "%lld", cur);
        if (_ddp_kv_put(s, key, rq.klen, buf, (uint32_t)strlen(buf))) { _ddp_client_out(c, DDP_ERR_OUT_OF_MEMORY, 0, NULL, 0); break; }
        _ddp_client_out(c, DDP_SUCCESS, cur, NULL, 0);
        break;
    }
    case _DDP_ST_CAS:
        e = *_ddp_kv_slot(s, key, rq.klen);
        if ((!e && rq.v1len == 0) || (e && e->vlen == rq.v1len && memcmp(e->val, v1, rq.v1len) == 0)) {
            if (_ddp_kv_put(s, key, rq.klen, v2, rq.v2len)) { _ddp_client_out(c, DDP_ERR_OUT_OF_MEMORY, 0, NULL, 0); break; }
            e = *_ddp_kv_slot(s, key, rq.klen);
        }
        if (e) _ddp_client_out(c, DDP_SUCCESS, e->vlen, e->val, e->vlen);
        else _ddp_client_out(c, DDP_SUCCESS, 0, NULL, 0);
        break;
    case _DDP_ST_WAIT:
        if (!_ddp_store_wait_ready(s, key, rq.klen, (rq.flags & _DDP_ST_WAIT_ANY) != 0)) {
            c->waiting = 1;
            return 0;
        }
        _ddp_client_out(c, DDP_SUCCESS, 0, NULL, 0);
        break;
    case _DDP_ST_CHECK:
        _ddp_client_out(c, DDP_SUCCESS, *_ddp_kv_slot(s, key, rq.klen) != NULL, NULL, 0);
        break;
    case _DDP_ST_DELETE: {
        _ddp_kv_t **pp = _ddp_kv_slot(s, key, rq.klen);
        int found = *pp != NULL;
        if (found) {
            e = *pp;
            *pp = e->next;
            DDP_FREE(e->key); DDP_FREE(e->val); DDP_FREE(e);
        }
        _ddp_client_out(c, DDP_SUCCESS, found, NULL, 0);
        break;
    }
    default:
        _ddp_store_log(s, DDP_LOG_WARN, "store: client %s sent unknown op %u; dropped", c->addr, rq.op);
        return -1;
    }
    c->in_len = 0;
    return 0;
}

_DDP_PRIVATE void _ddp_store_drop(ddp_store_t *s, _ddp_store_client_t *c) {
    if (c->authed) {
        pthread_mutex_lock(&s->srv_mu);
        s->nclients--;
        pthread_mutex_unlock(&s->srv_mu);
    }
    if (c->fd >= 0) close(c->fd);
    c->fd = -1;
    DDP_FREE(c->in); DDP_FREE(c->out);
    c->in = c->out = NULL;
    c->in_len = c->in_cap = c->out_len = c->out_cap = c->out_off = 0;
    c->waiting = c->authed = 0;
}

/* Reads what is available; runs the request once complete. -1 = drop the client. */
_DDP_PRIVATE int _ddp_store_read(ddp_store_t *s, _ddp_store_client_t *c) {
    for (;;) {
        size_t need = sizeof(_ddp_store_req_t);
        ssize_t n;
        if (c->in_len >= sizeof(_ddp_store_req_t)) {
            _ddp_store_req_t rq;
            memcpy(&rq, c->in, sizeof rq);
            if (rq.magic != _DDP_STORE_MAGIC || rq.op == 0 || rq.op >= _DDP_ST_NUM_OPS ||
                rq.klen > DDP_STORE_MAX_KEY * 64u || rq.v1len > DDP_STORE_MAX_VALUE ||
                rq.v2len > DDP_STORE_MAX_VALUE) {
                _ddp_store_log(s, DDP_LOG_WARN, "store: malformed request from %s (magic %08x op %u); "
                               "connection dropped", c->addr, rq.magic, rq.op);
                return -1;
            }
            need += (size_t)rq.klen + rq.v1len + rq.v2len;
        }
        if (need > c->in_cap) {
            unsigned char *p = (unsigned char *)DDP_MALLOC(need);
            if (!p) return -1;
            if (c->in_len) memcpy(p, c->in, c->in_len);
            DDP_FREE(c->in);
            c->in = p;
            c->in_cap = need;
        }
        if (c->in_len >= sizeof(_ddp_store_req_t) && c->in_len == need) return _ddp_store_serve(s, c);
        n = recv(c->fd, c->in + c->in_len, need - c->in_len, MSG_DONTWAIT);
        if (n == 0) return -1;
        if (n < 0) return (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) ? 0 : -1;
        c->in_len += (size_t)n;
    }
}

_DDP_PRIVATE void *_ddp_store_thread(void *arg) {
    ddp_store_t *s = (ddp_store_t *)arg;
    struct pollfd *pfds = NULL;
    int pcap = 0;
    while (!__atomic_load_n(&s->stop, __ATOMIC_ACQUIRE)) {
        int i, n = 0, changed = 0;
        if (pcap < s->clients_cap + 2) {
            DDP_FREE(pfds);
            pcap = s->clients_cap + 2;
            pfds = (struct pollfd *)DDP_MALLOC(sizeof *pfds * (size_t)pcap);
            if (!pfds) { pcap = 0; usleep(10000); continue; }
        }
        pfds[n].fd = s->wake[0]; pfds[n].events = POLLIN; pfds[n].revents = 0; n++;
        pfds[n].fd = s->listen_fd; pfds[n].events = POLLIN; pfds[n].revents = 0; n++;
        for (i = 0; i < s->clients_cap; i++) {
            _ddp_store_client_t *c = &s->clients[i];
            pfds[n].fd = c->fd;
            pfds[n].events = (short)(POLLIN | (c->out_len > c->out_off ? POLLOUT : 0));
            pfds[n].revents = 0;
            n++;
        }
        if (poll(pfds, (nfds_t)n, 1000) < 0 && errno != EINTR) break;
        if (pfds[0].revents) { char b[16]; if (read(s->wake[0], b, sizeof b) < 0) {} }
        if (pfds[1].revents & POLLIN) {
            struct sockaddr_storage ss;
            socklen_t sl = sizeof ss;
            int fd = accept4(s->listen_fd, (struct sockaddr *)&ss, &sl, SOCK_CLOEXEC | SOCK_NONBLOCK);
            if (fd >= 0) {
                int one = 1, slot = -1;
                setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
                for (i = 0; i < s->clients_cap; i++) if (s->clients[i].fd < 0) { slot = i; break; }
                if (slot < 0) {
                    int cap = s->clients_cap ? s->clients_cap * 2 : 16;
                    _ddp_store_client_t *nc = (_ddp_store_client_t *)DDP_MALLOC(sizeof *nc * (size_t)cap);
                    if (!nc) { close(fd); continue; }
                    if (s->clients_cap) memcpy(nc, s->clients, sizeof *nc * (size_t)s->clients_cap);
                    for (i = s->clients_cap; i < cap; i++) { memset(&nc[i], 0, sizeof nc[i]); nc[i].fd = -1; }
                    DDP_FREE(s->clients);
                    slot = s->clients_cap;
                    s->clients = nc;
                    s->clients_cap = cap;
                }
                s->clients[slot].fd = fd;
                _ddp_sockaddr_str((struct sockaddr *)&ss, s->clients[slot].addr, sizeof s->clients[slot].addr);
                _ddp_store_log(s, DDP_LOG_TRACE, "store: client connected from %s", s->clients[slot].addr);
            }
            continue; /* the client array may have moved; poll again */
        }
        for (i = 0; i < s->clients_cap && i + 2 < n; i++) {
            _ddp_store_client_t *c = &s->clients[i];
            short re = pfds[i + 2].revents;
            if (c->fd < 0 || pfds[i + 2].fd != c->fd) continue;
            if (re & POLLOUT) {
                ssize_t w = send(c->fd, c->out + c->out_off, c->out_len - c->out_off, MSG_NOSIGNAL | MSG_DONTWAIT);
                if (w > 0) c->out_off += (size_t)w;
                else if (w < 0 && errno != EAGAIN && errno != EINTR) { _ddp_store_drop(s, c); continue; }
                if (c->out_off == c->out_len) c->out_off = c->out_len = 0;
            }
            if (re & (POLLIN | POLLHUP | POLLERR)) {
                size_t before = c->out_len;
                if (c->waiting) {
                    /* A parked client speaks only after its answer: readable now means it hung
                     * up (its own timeout ran out) or broke the protocol. Either way, drop it. */
                    _ddp_store_log(s, DDP_LOG_TRACE, "store: client %s left while waiting", c->addr);
                    _ddp_store_drop(s, c);
                    continue;
                }
                if (!c->waiting && _ddp_store_read(s, c) < 0) { _ddp_store_drop(s, c); continue; }
                if (c->out_len != before || !c->waiting) changed = 1;
            }
        }
        /* A mutation may satisfy parked GET/WAITs; re-run them (at most one pass per change). */
        if (changed) {
            for (i = 0; i < s->clients_cap; i++) {
                _ddp_store_client_t *c = &s->clients[i];
                if (c->fd >= 0 && c->waiting) {
                    c->waiting = 0;
                    if (_ddp_store_serve(s, c) < 0) _ddp_store_drop(s, c);
                }
            }
        }
        /* Flush eagerly: most responses fit the socket buffer. */
        for (i = 0; i < s->clients_cap; i++) {
            _ddp_store_client_t *c = &s->clients[i];
            if (c->fd >= 0 && c->out_len > c->out_off) {
                ssize_t w = send(c->fd, c->out + c->out_off, c->out_len - c->out_off, MSG_NOSIGNAL | MSG_DONTWAIT);
                if (w > 0) c->out_off += (size_t)w;
                else if (w < 0 && errno != EAGAIN && errno != EINTR) { _ddp_store_drop(s, c); continue; }
                if (c->out_off == c->out_len) c->out_off = c->out_len = 0;
            }
        }
    }
    DDP_FREE(pfds);
    return NULL;
}

_DDP_PRIVATE int _ddp_env_timeout_ms(void) {
    long v;
    const char *e = getenv("DDP_TIMEOUT_MS");
    if (e && _ddp_parse_long(e, -1, INT_MAX, &v) == 0 && v != 0) return (int)v;
    return _DDP_DEFAULT_TIMEOUT_MS;
}

/* One request/response round trip under the store's mutex. */
_DDP_PRIVATE ddp_result_t _ddp_store_rpc(ddp_store_t *s, uint32_t op, uint32_t flags, const char *key,
                                         size_t klen, const void *v1, size_t v1len, const void *v2,
                                         size_t v2len, int64_t arg, int timeout_ms,
                                         _ddp_store_resp_t *resp, void *out, size_t cap,
                                         size_t *outlen);

_DDP_PRIVATE ddp_result_t _ddp_store_connect(ddp_store_t *s) {
    char why[512] = "";
    int64_t deadline = _ddp_deadline(s->timeout_ms);
    _ddp_store_resp_t resp;
    ddp_result_t r;
    int fd = _ddp_tcp_connect_retry(s->host, s->port, deadline, why, sizeof why);
    if (fd < 0)
        return _ddp_store_err(s, fd == -EHOSTUNREACH ? DDP_ERR_SYSTEM : DDP_ERR_TIMEOUT,
                              "rendezvous: master %s:%d unreachable after %d ms: %s", s->host,
                              s->port, s->timeout_ms, why);
    s->fd = fd;
    r = _ddp_store_rpc(s, _DDP_ST_HELLO, 0, "", 0, s->secret, strlen(s->secret), NULL, 0,
                       _DDP_STORE_PROTO, 0, &resp, NULL, 0, NULL);
    if (r == DDP_SUCCESS && resp.status != DDP_SUCCESS) {
        close(s->fd);
        s->fd = -1;
        if (resp.status == DDP_ERR_AUTH)
            return _ddp_store_err(s, DDP_ERR_AUTH, "rendezvous: master %s:%d refused our job secret "
                                  "(DDP_JOB_SECRET differs between ranks?)", s->host, s->port);
        return _ddp_store_err(s, DDP_ERR_MISMATCH, "rendezvous: master %s:%d speaks another store "
                              "protocol version (mixed libddp versions?)", s->host, s->port);
    }
    if (r == DDP_SUCCESS)
        _ddp_store_log(s, DDP_LOG_INFO, "store: connected to master %s:%d", s->host, s->port);
    return r;
}

_DDP_PRIVATE ddp_result_t _ddp_store_rpc(ddp_store_t *s, uint32_t op, uint32_t flags, const char *key,
                                         size_t klen, const void *v1, size_t v1len, const void *v2,
                                         size_t v2len, int64_t arg, int timeout_ms,
                                         _ddp_store_resp_t *resp, void *out, size_t cap,
                                         size_t *outlen) {
    _ddp_store_req_t rq;
    struct iovec iov[4];
    int64_t deadline;
    int rc;
    ddp_result_t r;
    if (s->fd < 0 && op != _DDP_ST_HELLO) {
        if (s->quick) return DDP_ERR_REMOTE;
        r = _ddp_store_connect(s);
        if (r != DDP_SUCCESS) return r;
    }
    deadline = _ddp_deadline(timeout_ms ? timeout_ms : s->timeout_ms);
    rq.magic = _DDP_STORE_MAGIC; rq.op = op; rq.klen = (uint32_t)klen; rq.v1len = (uint32_t)v1len;
    rq.v2len = (uint32_t)v2len; rq.flags = flags; rq.arg = arg;
    iov[0].iov_base = &rq; iov[0].iov_len = sizeof rq;
    iov[1].iov_base = (void *)(uintptr_t)key; iov[1].iov_len = klen;
    iov[2].iov_base = (void *)(uintptr_t)v1; iov[2].iov_len = v1len;
    iov[3].iov_base = (void *)(uintptr_t)v2; iov[3].iov_len = v2len;
    {
        int i;
        for (i = 0, rc = 0; i < 4 && rc == 0; i++)
            if (iov[i].iov_len) rc = _ddp_send_all(s->fd, iov[i].iov_base, iov[i].iov_len, deadline);
    }
    if (rc == 0) rc = _ddp_recv_all(s->fd, resp, sizeof *resp, deadline);
    if (rc == 0 && resp->magic != _DDP_STORE_MAGIC) rc = -EPROTO;
    if (rc == 0 && resp->vlen) {
        size_t take = resp->vlen < cap ? resp->vlen : cap;
        if (take) rc = _ddp_recv_all(s->fd, out, take, deadline);
        while (rc == 0 && take < resp->vlen) {
            char sink[4096];
            size_t n = resp->vlen - take < sizeof sink ? resp->vlen - take : sizeof sink;
            rc = _ddp_recv_all(s->fd, sink, n, deadline);
            take += n;
        }
    }
    if (outlen) *outlen = rc == 0 ? resp->vlen : 0;
    if (rc != 0) {
        /* The stream is out of step now: drop it; the next call reconnects. */
        close(s->fd);
        s->fd = -1;
        if (rc == -ETIMEDOUT)
            return _ddp_store_err(s, DDP_ERR_TIMEOUT, "no answer from master %s:%d within %d ms "
                                  "(key '%.*s')", s->host, s->port,
                                  timeout_ms ? timeout_ms : s->timeout_ms, (int)(klen > 200 ? 200 : klen), key);
        return _ddp_store_err(s, DDP_ERR_REMOTE, "lost the connection to master %s:%d (rank 0's "
                              "store): %s", s->host, s->port, strerror(-rc));
    }
    return DDP_SUCCESS;
}

_DDP_PRIVATE ddp_result_t _ddp_store_listen(ddp_store_t *s) {
    struct sockaddr_in6 a6;
    struct sockaddr_in a4;
    int one = 1, zero = 0;
    int fd = socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd >= 0) {
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
        memset(&a6, 0, sizeof a6);
        a6.sin6_family = AF_INET6;
        a6.sin6_addr = in6addr_any;
        a6.sin6_port = htons((uint16_t)s->port);
        if (bind(fd, (struct sockaddr *)&a6, sizeof a6) != 0) {
            int e = errno;
            close(fd);
            fd = -1;
            if (e == EADDRINUSE) goto in_use;
        }
    }
    if (fd < 0) {
        fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0) return _ddp_store_err(s, DDP_ERR_SYSTEM, "socket: %s", strerror(errno));
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        memset(&a4, 0, sizeof a4);
        a4.sin_family = AF_INET;
        a4.sin_addr.s_addr = htonl(INADDR_ANY);
        a4.sin_port = htons((uint16_t)s->port);
        if (bind(fd, (struct sockaddr *)&a4, sizeof a4) != 0) {
            int e = errno;
            close(fd);
            if (e == EADDRINUSE) goto in_use;
            return _ddp_store_err(s, DDP_ERR_SYSTEM, "bind port %d: %s", s->port, strerror(e));
        }
    }
    if (listen(fd, 1024) != 0) {
        int e = errno;
        close(fd);
        return _ddp_store_err(s, DDP_ERR_SYSTEM, "listen on port %d: %s", s->port, strerror(e));
    }
    if (s->port == 0) {
        struct sockaddr_storage ss;
        socklen_t sl = sizeof ss;
        getsockname(fd, (struct sockaddr *)&ss, &sl);
        s->port = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                                 : ((struct sockaddr_in *)&ss)->sin_port);
    }
    _ddp_set_nonblock(fd, 1);
    s->listen_fd = fd;
    return DDP_SUCCESS;
in_use:
    return _ddp_store_err(s, DDP_ERR_SYSTEM, "rendezvous: master port %d is already in use on "
                          "this host (another job, or a previous run still exiting?): pick another "
                          "MASTER_PORT", s->port);
}

_DDP_PRIVATE ddp_result_t _ddp_store_open(ddp_store_t **out, const char *host, int port,
                                          int is_server, const ddp_store_desc_t *d, char *err,
                                          size_t errcap) {
    ddp_store_t *s;
    ddp_result_t r;
    const char *secret;
    if (!out) return DDP_ERR_INVALID_ARGUMENT;
    *out = NULL;
    if (port < 0 || port > 65535 || (!is_server && (port == 0 || !host || !*host)))
        return DDP_ERR_INVALID_ARGUMENT;
    s = (ddp_store_t *)DDP_MALLOC(sizeof *s);
    if (!s) return DDP_ERR_OUT_OF_MEMORY;
    memset(s, 0, sizeof *s);
    s->fd = s->listen_fd = -1;
    s->wake[0] = s->wake[1] = -1;
    pthread_mutex_init(&s->mu, NULL);
    pthread_mutex_init(&s->srv_mu, NULL);
    _ddp_strlcpy(s->host, host && *host ? host : "127.0.0.1", sizeof s->host);
    s->port = port;
    s->timeout_ms = (d && d->timeout_ms) ? d->timeout_ms : _ddp_env_timeout_ms();
    secret = (d && d->secret) ? d->secret : getenv("DDP_JOB_SECRET");
    _ddp_strlcpy(s->secret, secret ? secret : "", sizeof s->secret);
    s->log_level = (d && d->log_level) ? d->log_level - 1 : _ddp_log_level_from_env();
    s->log_rank = d ? d->log_rank : 0;
    s->is_server = is_server;
    if (is_server) {
        r = _ddp_store_listen(s);
        if (r != DDP_SUCCESS) { _ddp_strlcpy(err, s->last_error, errcap); ddp_store_close(s); return r; }
        if (pipe2(s->wake, O_CLOEXEC | O_NONBLOCK) != 0 ||
            pthread_create(&s->thread, NULL, _ddp_store_thread, s) != 0) {
            r = _ddp_store_err(s, DDP_ERR_SYSTEM, "store server thread: %s", strerror(errno));
            _ddp_strlcpy(err, s->last_error, errcap);
            ddp_store_close(s);
            return r;
        }
        s->thread_started = 1;
        _ddp_store_log(s, DDP_LOG_INFO, "store: serving rendezvous on port %d%s", s->port,
                       s->secret[0] ? " (job secret required)" : "");
    }
    pthread_mutex_lock(&s->mu);
    r = _ddp_store_connect(s);
    pthread_mutex_unlock(&s->mu);
    if (r != DDP_SUCCESS) {
        _ddp_strlcpy(err, s->last_error, errcap);
        ddp_store_close(s);
        return r;
    }
    *out = s;
    return DDP_SUCCESS;
}

DDP_API ddp_result_t ddp_store_open(ddp_store_t **out, const char *host, int port, int is_server,
                                    const ddp_store_desc_t *d) {
    char err[512];
    return _ddp_store_open(out, host, port, is_server, d, err, sizeof err);
}

DDP_API ddp_result_t ddp_store_close(ddp_store_t *s) {
    if (!s) return DDP_ERR_INVALID_ARGUMENT;
    if (s->fd >= 0) close(s->fd);
    s->fd = -1;
    if (s->thread_started) {
        /* Others may still read keys (late joiners, failure reasons): serve until every client
         * has gone, at most the store's timeout. A dead client's socket closes by itself. */
        int64_t deadline = _ddp_deadline(s->timeout_ms);
        for (;;) {
            int n;
            pthread_mutex_lock(&s->srv_mu);
            n = s->nclients;
            pthread_mutex_unlock(&s->srv_mu);
            if (n <= 0 || _ddp_ms_left(deadline) == 0) break;
            usleep(2000);
        }
        __atomic_store_n(&s->stop, 1, __ATOMIC_RELEASE);
        if (write(s->wake[1], "x", 1) < 0) {}
        pthread_join(s->thread, NULL);
    }
    if (s->listen_fd >= 0) close(s->listen_fd);
    if (s->wake[0] >= 0) close(s->wake[0]);
    if (s->wake[1] >= 0) close(s->wake[1]);
    {
        int i;
        for (i = 0; i < s->clients_cap; i++) {
            if (s->clients[i].fd >= 0) close(s->clients[i].fd);
            DDP_FREE(s->clients[i].in);
            DDP_FREE(s->clients[i].out);
        }
        DDP_FREE(s->clients);
        for (i = 0; i < _DDP_KV_BUCKETS; i++) {
            _ddp_kv_t *e = s->buckets[i];
            while (e) { _ddp_kv_t *n = e->next; DDP_FREE(e->key); DDP_FREE(e->val); DDP_FREE(e); e = n; }
        }
    }
    pthread_mutex_destroy(&s->mu);
    pthread_mutex_destroy(&s->srv_mu);
    DDP_FREE(s);
    return DDP_SUCCESS;
}

_DDP_PRIVATE ddp_result_t _ddp_store_check_key(ddp_store_t *s, const char *key) {
    size_t n;
    if (!s || !key) return DDP_ERR_INVALID_ARGUMENT;
    n = strlen(key);
    if (n == 0 || n > DDP_STORE_MAX_KEY) {
        snprintf(s->last_error, sizeof s->last_error, "key length %zu not in 1..%d", n, DDP_STORE_MAX_KEY);
        return DDP_ERR_INVALID_ARGUMENT;
    }
    return DDP_SUCCESS;
}

DDP_API ddp_result_t ddp_store_set(ddp_store_t *s, const char *key, const void *value, size_t len) {
    _ddp_store_resp_t resp;
    ddp_result_t r = _ddp_store_check_key(s, key);
    if (r != DDP_SUCCESS) return r;
    if ((len && !value) || len > DDP_STORE_MAX_VALUE) return DDP_ERR_INVALID_ARGUMENT;
    pthread_mutex_lock(&s->mu);
    r = _ddp_store_rpc(s, _DDP_ST_SET, 0, key, strlen(key), value, len, NULL, 0, 0, 0, &resp, NULL, 0, NULL);
    pthread_mutex_unlock(&s->mu);
    return r != DDP_SUCCESS ? r : (ddp_result_t)resp.status;
}

DDP_API ddp_result_t ddp_store_get(ddp_store_t *s, const char *key, void *value, size_t cap, size_t *len) {
    _ddp_store_resp_t resp;
    ddp_result_t r = _ddp_store_check_key(s, key);
    if (r != DDP_SUCCESS) return r;
    if (cap && !value) return DDP_ERR_INVALID_ARGUMENT;
    pthread_mutex_lock(&s->mu);
    r = _ddp_store_rpc(s, _DDP_ST_GET, 0, key, strlen(key), NULL, 0, NULL, 0, 0, 0, &resp, value, cap, len);
    pthread_mutex_unlock(&s->mu);
    return r != DDP_SUCCESS ? r : (ddp_result_t)resp.status;
}

DDP_API ddp_result_t ddp_store_add(ddp_store_t *s, const char *key, int64_t delta, int64_t *result) {
    _ddp_store_resp_t resp;
    ddp_result_t r = _ddp_store_check_key(s, key);
    if (r != DDP_SUCCESS) return r;
    pthread_mutex_lock(&s->mu);
    r = _ddp_store_rpc(s, _DDP_ST_ADD, 0, key, strlen(key), NULL, 0, NULL, 0, delta, 0, &resp, NULL, 0, NULL);
    pthread_mutex_unlock(&s->mu);
    if (r == DDP_SUCCESS && result) *result = resp.num;
    return r != DDP_SUCCESS ? r : (ddp_result_t)resp.status;
}

DDP_API ddp_result_t ddp_store_compare_set(ddp_store_t *s, const char *key, const void *expected,
                                           size_t expected_len, const void *desired, size_t desired_len,
                                           void *actual, size_t cap, size_t *actual_len) {
    _ddp_store_resp_t resp;
    ddp_result_t r = _ddp_store_check_key(s, key);
    if (r != DDP_SUCCESS) return r;
    if ((expected_len && !expected) || (desired_len && !desired) || (cap && !actual) ||
        expected_len > DDP_STORE_MAX_VALUE || desired_len > DDP_STORE_MAX_VALUE)
        return DDP_ERR_INVALID_ARGUMENT;
    pthread_mutex_lock(&s->mu);
    r = _ddp_store_rpc(s, _DDP_ST_CAS, 0, key, strlen(key), expected, expected_len, desired,
                       desired_len, 0, 0, &resp, actual, cap, actual_len);
    pthread_mutex_unlock(&s->mu);
    return r != DDP_SUCCESS ? r : (ddp_result_t)resp.status;
}

_DDP_PRIVATE ddp_result_t _ddp_store_wait_keys(ddp_store_t *s, const char *const *keys, int nkeys,
                                               int timeout_ms, int any) {
    char buf[8192];
    size_t off = 0;
    int i;
    _ddp_store_resp_t resp;
    ddp_result_t r;
    if (!s || nkeys < 0 || (nkeys && !keys)) return DDP_ERR_INVALID_ARGUMENT;
    for (i = 0; i < nkeys; i++) {
        size_t n;
        if ((r = _ddp_store_check_key(s, keys[i])) != DDP_SUCCESS) return r;
        n = strlen(keys[i]);
        if (off + n + 1 > sizeof buf) return DDP_ERR_INVALID_ARGUMENT;
        memcpy(buf + off, keys[i], n + 1);
        off += n + 1;
    }
    if (nkeys == 0) return DDP_SUCCESS;
    pthread_mutex_lock(&s->mu);
    r = _ddp_store_rpc(s, _DDP_ST_WAIT, any ? _DDP_ST_WAIT_ANY : 0, buf, off - 1, NULL, 0, NULL, 0,
                       0, timeout_ms, &resp, NULL, 0, NULL);
    pthread_mutex_unlock(&s->mu);
    return r != DDP_SUCCESS ? r : (ddp_result_t)resp.status;
}

DDP_API ddp_result_t ddp_store_wait(ddp_store_t *s, const char *const *keys, int nkeys, int timeout_ms) {
    return _ddp_store_wait_keys(s, keys, nkeys, timeout_ms, 0);
}

DDP_API ddp_result_t ddp_store_check(ddp_store_t *s, const char *key, int *exists) {
    _ddp_store_resp_t resp;
    ddp_result_t r = _ddp_store_check_key(s, key);
    if (r != DDP_SUCCESS) return r;
    pthread_mutex_lock(&s->mu);
    r = _ddp_store_rpc(s, _DDP_ST_CHECK, 0, key, strlen(key), NULL, 0, NULL, 0, 0, 0, &resp, NULL, 0, NULL);
    pthread_mutex_unlock(&s->mu);
    if (r == DDP_SUCCESS && exists) *exists = (int)resp.num;
    return r != DDP_SUCCESS ? r : (ddp_result_t)resp.status;
}

DDP_API ddp_result_t ddp_store_delete(ddp_store_t *s, const char *key, int *deleted) {
    _ddp_store_resp_t resp;
    ddp_result_t r = _ddp_store_check_key(s, key);
    if (r != DDP_SUCCESS) return r;
    pthread_mutex_lock(&s->mu);
    r = _ddp_store_rpc(s, _DDP_ST_DELETE, 0, key, strlen(key), NULL, 0, NULL, 0, 0, 0, &resp, NULL, 0, NULL);
    pthread_mutex_unlock(&s->mu);
    if (r == DDP_SUCCESS && deleted) *deleted = (int)resp.num;
    return r != DDP_SUCCESS ? r : (ddp_result_t)resp.status;
}

DDP_API int ddp_store_port(const ddp_store_t *s) { return s ? s->port : -1; }
DDP_API const char *ddp_store_last_error(const ddp_store_t *s) { return s ? s->last_error : "NULL store"; }

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

/* ---------------------------------------------------------------- communicator */
typedef struct { const ddp_transport_t *t; void *state; } _ddp_tinst_t;
typedef struct { int tinst; void *conn; } _ddp_peer_t;

#define _DDP_HOST_ID_LEN 160
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
    uint32_t magic;
    int rank, nranks, local_rank, local_size;
    int timeout_ms, spin_us, log_level;
    size_t segment_bytes;
    char master_addr[256];
    int master_port;
    char ifname[256];
    char prefix[128];
    ddp_store_t *store;
    int own_store;
    uint64_t id;
    char *host_ids;                /* nranks * _DDP_HOST_ID_LEN */
    _ddp_tinst_t tinst[_DDP_MAX_TRANSPORTS];
    int ntinst;
    _ddp_peer_t *peers;
    ddp_allocator_t alloc;
    ddp_result_t error;            /* sticky: set by a failed collective */
    int init_probe;                /* trying a transport under "auto": its failure is a notice */
    char last_error[1024];
    uint32_t seq;                  /* collectives issued: part of every message tag */
    /* Async requests and abort. aborted/busy are atomics (Dekker pair: an operation starts only
     * if no abort came first; abort poisons the communicator itself only if nothing runs). */
    int aborted, busy, abort_claimed;
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
    unsigned char *scratch;        /* bounded, allocated once: _DDP_MAX_SLOTS segments */
    size_t scratch_bytes;
    int algo;                      /* _DDP_ALGO_*: DDP_ALGO, else chosen by size */
    const ddp_coll_provider_t *coll; /* a transport that runs the collectives itself, or NULL */
    void *coll_state;
    size_t rd_max_bytes;           /* auto: recursive doubling up to this many bytes */
    uint32_t *p2p;                 /* 4 per peer: ddp_send/ddp_recv messages sent to it and received
                                    * from it (the sequence in their tags); group_end's in flight */
    int group_depth, group_n, group_cap; /* ddp_group_start nesting; calls queued, room */
    void *group_ops;               /* the queued calls (_ddp_call_t), grown on demand, kept */
    unsigned char *fuse_buf;       /* a group's small all-reduces packed together (lazy, kept) */
    ddp_result_t group_err;        /* first failure of a call made inside the group */
};
enum { _DDP_ALGO_AUTO, _DDP_ALGO_RING, _DDP_ALGO_RD };

/* Live communicators, so that a call on a destroyed one is an error instead of a use after
 * free. Several communicators may live at once; the list is only touched at init/destroy and
 * read (under the lock) at the start of each collective. */
static pthread_mutex_t _ddp_live_mu = PTHREAD_MUTEX_INITIALIZER;
static const ddp_comm_t **_ddp_live;
static size_t _ddp_nlive, _ddp_live_cap;

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
    if (!c || c->log_level < (int)level || level == DDP_LOG_NONE) return;
    va_start(ap, fmt);
    _ddp_vlog(c->rank, level, fmt, ap);
    va_end(ap);
}
#define _DDP_LOG(c, lvl, ...) do { if ((c)->log_level >= (lvl)) ddp_comm_log((c), (lvl), __VA_ARGS__); } while (0)

DDP_API ddp_result_t ddp_comm_fail(ddp_comm_t *c, ddp_result_t r, const char *fmt, ...) {
    va_list ap;
    char msg[768];
    if (!c) return r;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    snprintf(c->last_error, sizeof c->last_error, "rank %d: %s [%s]", c->rank, msg, ddp_strerror(r));
    if (!c->init_probe) _DDP_LOG(c, DDP_LOG_WARN, "%s", c->last_error);
    return r;
}

_DDP_PRIVATE void _ddp_key(const ddp_comm_t *c, char *out, size_t cap, const char *fmt, ...) {
    va_list ap;
    int n = snprintf(out, cap, "%s/", c->prefix);
    va_start(ap, fmt);
    if (n > 0 && (size_t)n < cap) vsnprintf(out + n, cap - (size_t)n, fmt, ap);
    va_end(ap);
}

DDP_API ddp_result_t ddp_comm_publish(ddp_comm_t *c, const char *transport, const void *addr, size_t len) {
    char key[256];
    if (!c || !transport || (len && !addr)) return DDP_ERR_INVALID_ARGUMENT;
    _ddp_key(c, key, sizeof key, "addr/%s/%d", transport, c->rank);
    return ddp_store_set(c->store, key, addr, len);
}

DDP_API ddp_result_t ddp_comm_lookup(ddp_comm_t *c, const char *transport, int peer, void *addr,
                                     size_t cap, size_t *len) {
    char key[256];
    ddp_result_t r;
    if (!c || !transport || peer < 0 || peer >= c->nranks) return DDP_ERR_INVALID_ARGUMENT;
    _ddp_key(c, key, sizeof key, "addr/%s/%d", transport, peer);
    r = ddp_store_get(c->store, key, addr, cap, len);
    if (r != DDP_SUCCESS)
        return ddp_comm_fail(c, r, "looking up rank %d's %s address: %s", peer, transport,
                             ddp_store_last_error(c->store));
    return r;
}

DDP_API uint64_t ddp_comm_id(const ddp_comm_t *c) { return c ? c->id : 0; }
DDP_API void *ddp_comm_calloc(ddp_comm_t *c, size_t n) { return _ddp_calloc(c ? &c->alloc : NULL, n); }
DDP_API void ddp_comm_free(ddp_comm_t *c, void *p) { _ddp_free(c ? &c->alloc : NULL, p); }
DDP_API int ddp_comm_timeout_ms(const ddp_comm_t *c) { return c ? c->timeout_ms : 0; }
DDP_API const char *ddp_comm_ifname(const ddp_comm_t *c) { return (c && c->ifname[0]) ? c->ifname : NULL; }
DDP_API const char *ddp_comm_master_addr(const ddp_comm_t *c) { return c ? c->master_addr : NULL; }
DDP_API const char *ddp_comm_host_id(const ddp_comm_t *c, int peer) {
    if (!c || !c->host_ids || peer < 0 || peer >= c->nranks) return "";
    return c->host_ids + (size_t)peer * _DDP_HOST_ID_LEN;
}
DDP_API int ddp_comm_rank(const ddp_comm_t *c) { return c && _ddp_live_check(c, 0) ? c->rank : -1; }
DDP_API int ddp_comm_size(const ddp_comm_t *c) { return c && _ddp_live_check(c, 0) ? c->nranks : -1; }
DDP_API int ddp_comm_local_rank(const ddp_comm_t *c) { return c && _ddp_live_check(c, 0) ? c->local_rank : -1; }
DDP_API int ddp_comm_local_size(const ddp_comm_t *c) { return c && _ddp_live_check(c, 0) ? c->local_size : -1; }
DDP_API const char *ddp_comm_last_error(const ddp_comm_t *c) {
    if (!c) return "NULL communicator";
    if (!_ddp_live_check(c, 0)) return "not a live communicator (destroyed, or never created)";
    return c->last_error;
}
DDP_API ddp_store_t *ddp_comm_store(ddp_comm_t *c) { return c ? c->store : NULL; }
DDP_API const char *ddp_comm_transport_name(const ddp_comm_t *c, int peer) {
    if (!c || !c->peers || peer < 0 || peer >= c->nranks) return "";
    if (peer == c->rank) return "self";
    if (c->peers[peer].tinst < 0) return "none";
    return c->tinst[c->peers[peer].tinst].t->name;
}

/* Host identity: boot id + hostname + network namespace (two containers on one kernel share the
 * boot id but not the namespace; two hosts may share a name). DDP_HOST_ID overrides, so tests
 * can fake several hosts on one machine. */
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

/* Reads an integer environment variable; 1 if present and valid, 0 if absent, -1 if malformed. */
_DDP_PRIVATE int _ddp_env_int(const char *name, long lo, long hi, long *out) {
    const char *s = getenv(name);
    if (!s) return 0;
    return _ddp_parse_long(s, lo, hi, out) == 0 ? 1 : -1;
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
    snprintf(e->err, sizeof e->err, "no rank in the environment: set RANK and WORLD_SIZE (as "
             "torchrun does), or run under ddprun, mpirun or srun");
    return DDP_ERR_INVALID_ARGUMENT;
}

/* While reporting a failure the store must not become a second wait: short timeouts and no
 * reconnecting (the master may be the rank that died). */
_DDP_PRIVATE void _ddp_store_quick(ddp_store_t *s, int on) {
    static const int quick_ms = 1000;
    if (on && !s->quick) { s->quick = s->timeout_ms; s->timeout_ms = quick_ms; }
    else if (!on && s->quick) { s->timeout_ms = s->quick; s->quick = 0; }
}

/* Publishes the first failure of this communicator so that ranks which only see a closed
 * connection can tell the user where it started. Best effort, short timeout. */
_DDP_PRIVATE void _ddp_publish_failure(ddp_comm_t *c) {
    char key[256], cur[8];
    size_t curlen = 0;
    if (!c->store) return;
    _ddp_key(c, key, sizeof key, "abort");
    _ddp_store_quick(c->store, 1);
    ddp_store_compare_set(c->store, key, NULL, 0, c->last_error, strlen(c->last_error), cur,
                          sizeof cur, &curlen);
    _ddp_store_quick(c->store, 0);
}

/* Appends the first failure published by another rank, if any, to this rank's error.
 * Returns 1 if there was one. */
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
    } else if (r == DDP_ERR_REMOTE && c->rank != 0 && n + 32 < sizeof c->last_error) {
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
    for (i = 0; i < c->nranks; i++) {
        _ddp_peer_t *p = &c->peers[i];
        if (p->conn && p->tinst >= 0) c->tinst[p->tinst].t->close(p->conn);
        p->conn = NULL;
    }
}

/* A collective failed: make the error sticky, tell the others (closing our connections wakes
 * every neighbour with EOF at once instead of after a timeout), and say where it started. */
_DDP_PRIVATE ddp_result_t _ddp_comm_poison(ddp_comm_t *c, ddp_result_t r) {
    if (r == DDP_SUCCESS) return r;
    if (r != DDP_ERR_REMOTE || !_ddp_add_root_cause(c)) _ddp_publish_failure(c);
    __atomic_store_n(&c->error, r, __ATOMIC_SEQ_CST);
    _ddp_close_peers(c);
    _DDP_LOG(c, DDP_LOG_WARN, "communicator is now unusable: %s", c->last_error);
    return r;
}

/* Connects to each listed peer (lower rank connects, higher accepts), all at once, within
 * the timeout. */
_DDP_PRIVATE ddp_result_t _ddp_connect_peers(ddp_comm_t *c, const int *list, int n) {
    int64_t deadline = _ddp_deadline(c->timeout_ms);
    int pending, i;
    for (;;) {
        int progressed = 0;
        pending = 0;
        for (i = 0; i < n; i++) {
            int peer = list ? list[i] : i;   /* NULL: everyone */
            _ddp_peer_t *p = &c->peers[peer];
            const ddp_transport_t *t;
            ddp_result_t r;
            if (p->conn || peer == c->rank) continue;
            t = c->tinst[p->tinst].t;
            r = c->rank < peer ? t->connect(c->tinst[p->tinst].state, peer, &p->conn)
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
                if (!c->peers[peer].conn && peer != c->rank)
                    off += (size_t)snprintf(who + off, sizeof who - off, "%s%d", off ? "," : "", peer);
            }
            return ddp_comm_fail(c, DDP_ERR_TIMEOUT, "init: no connection with rank(s) %s after "
                                 "%d ms (phase connect)", who, c->timeout_ms);
        }
        if (!progressed) usleep(200);
    }
}

DDP_API ddp_result_t ddp_comm_destroy(ddp_comm_t *c) {
    int i;
    ddp_allocator_t a;
    if (!c) return DDP_ERR_INVALID_ARGUMENT;
    if (!_ddp_live_check(c, 0)) return DDP_ERR_INVALID_USAGE;
    _DDP_LOG(c, DDP_LOG_INFO, "destroying communicator");
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
    _ddp_close_peers(c);
    for (i = 0; i < c->ntinst; i++)
        if (c->tinst[i].state) c->tinst[i].t->finalize(c->tinst[i].state);
    if (c->store && c->own_store) ddp_store_close(c->store);
    if (c->extra_store) ddp_store_close(c->extra_store);
    a = c->alloc;
    _ddp_free(&a, c->peers);
    _ddp_free(&a, c->p2p);
    _ddp_free(&a, c->group_ops);
    _ddp_free(&a, c->fuse_buf);
    _ddp_free(&a, c->host_ids);
    _ddp_free(&a, c->scratch);
    _ddp_free(&a, c->ops);
    if (c->async_init) {
        pthread_mutex_destroy(&c->amu);
        pthread_cond_destroy(&c->acv);
        pthread_cond_destroy(&c->adone);
    }
    c->magic = 0;
    _ddp_free(&a, c);
    return DDP_SUCCESS;
}

_DDP_PRIVATE uint64_t _ddp_random64(void) {
    uint64_t v = 0;
    int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        if (read(fd, &v, sizeof v) != (ssize_t)sizeof v) v = 0;
        close(fd);
    }
    if (!v) v = (uint64_t)_ddp_now_us() * 6364136223846793005ull ^ (uint64_t)getpid();
    return v;
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

_DDP_PRIVATE ddp_result_t _ddp_rendezvous(ddp_comm_t *c, const char *forced) {
    char key[256], host[_DDP_HOST_ID_LEN], why_none[512] = "";
    size_t len = 0;
    int64_t joined = 0, n;
    ddp_result_t r;
    int i;

    /* World size, and DDP_ASYNC_LANES (each rank opens that many connection sets at init):
     * the first rank decides; anyone who disagrees fails loudly. */
    if ((r = _ddp_rendezvous_agree(c, "world_size", c->nranks, "world size disagreement: this rank "
                                   "was started with world size %d, the job's first rank with %s")) != DDP_SUCCESS ||
        (r = _ddp_rendezvous_agree(c, "async_lanes", c->want_lanes, "DDP_ASYNC_LANES is %d on this "
                                   "rank, %s on the job's first rank: set it the same everywhere")) != DDP_SUCCESS)
        return r;
    _ddp_key(c, key, sizeof key, "rank/%d", c->rank);
    r = ddp_store_add(c->store, key, 1, &n);
    if (r != DDP_SUCCESS) return ddp_comm_fail(c, r, "init: rendezvous: %s", ddp_store_last_error(c->store));
    if (n > 1) {
        r = ddp_comm_fail(c, DDP_ERR_INVALID_USAGE, "init: rank %d joined twice (two processes "
                          "were given RANK=%d)", c->rank, c->rank);
        _ddp_publish_failure(c);
        return r;
    }
    _ddp_host_id(host, sizeof host);
    _ddp_key(c, key, sizeof key, "host/%d", c->rank);
    if ((r = ddp_store_set(c->store, key, host, strlen(host))) != DDP_SUCCESS)
        return ddp_comm_fail(c, r, "init: rendezvous: %s", ddp_store_last_error(c->store));
    if (c->rank == 0) {
        c->id = _ddp_random64();
        _ddp_key(c, key, sizeof key, "comm_id");
        if ((r = ddp_store_set(c->store, key, &c->id, sizeof c->id)) != DDP_SUCCESS)
            return ddp_comm_fail(c, r, "init: rendezvous: %s", ddp_store_last_error(c->store));
    }

    /* Transports listen and publish their addresses before we count ourselves in. */
    for (i = 0; i < _ddp_ntransports && c->ntinst < _DDP_MAX_TRANSPORTS; i++) {
        const ddp_transport_t *t = _ddp_transports[i];
        void *state = NULL;
        if (forced && strcmp(forced, t->name) != 0) continue;
        c->init_probe = !forced;
        r = t->init(c, &state);
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
    if (c->ntinst == 0 && c->nranks > 1)
        return ddp_comm_fail(c, DDP_ERR_UNSUPPORTED, "init: no usable transport (%s)",
                             why_none[0] ? why_none : "none compiled in: include transports/ddp_tcp.h");

    _ddp_key(c, key, sizeof key, "joined");
    if ((r = ddp_store_add(c->store, key, 1, &joined)) != DDP_SUCCESS)
        return ddp_comm_fail(c, r, "init: rendezvous: %s", ddp_store_last_error(c->store));
    _DDP_LOG(c, DDP_LOG_INFO, "joined rendezvous at %s:%d as rank %d of %d (%lld joined so far)",
             c->master_addr, c->master_port, c->rank, c->nranks, (long long)joined);
    if (joined == c->nranks) {
        _ddp_key(c, key, sizeof key, "ready");
        if ((r = ddp_store_set(c->store, key, "1", 1)) != DDP_SUCCESS)
            return ddp_comm_fail(c, r, "init: rendezvous: %s", ddp_store_last_error(c->store));
    }
    {
        char k1[256], k2[256];
        const char *keys[2];
        _ddp_key(c, k1, sizeof k1, "ready");
        _ddp_key(c, k2, sizeof k2, "abort");
        keys[0] = k1; keys[1] = k2;
        r = _ddp_store_wait_keys(c->store, keys, 2, 0, 1);
        if (r == DDP_ERR_TIMEOUT) {
            char missing[256] = "";
            size_t off = 0;
            for (i = 0; i < c->nranks && off + 12 < sizeof missing; i++) {
                int ex = 1;
                _ddp_key(c, key, sizeof key, "rank/%d", i);
                if (ddp_store_check(c->store, key, &ex) == DDP_SUCCESS && !ex)
                    off += (size_t)snprintf(missing + off, sizeof missing - off, "%s%d", off ? "," : "", i);
            }
            return ddp_comm_fail(c, DDP_ERR_TIMEOUT, "init: rendezvous at %s:%d: ranks never "
                                 "joined within %d ms: %s", c->master_addr, c->master_port,
                                 c->timeout_ms, off ? missing : "(unknown)");
        }
        if (r != DDP_SUCCESS) return ddp_comm_fail(c, r, "init: rendezvous: %s", ddp_store_last_error(c->store));
        {
            int ex = 0;
            if (ddp_store_check(c->store, k2, &ex) == DDP_SUCCESS && ex) {
                char why[512];
                len = 0;
                ddp_store_get(c->store, k2, why, sizeof why - 1, &len);
                why[len < sizeof why ? len : sizeof why - 1] = 0;
                return ddp_comm_fail(c, DDP_ERR_REMOTE, "init: rendezvous aborted by another "
                                     "rank: %s", why);
            }
        }
    }
    if (c->rank != 0) {
        _ddp_key(c, key, sizeof key, "comm_id");
        if ((r = ddp_store_get(c->store, key, &c->id, sizeof c->id, &len)) != DDP_SUCCESS)
            return ddp_comm_fail(c, r, "init: rendezvous: %s", ddp_store_last_error(c->store));
    }
    /* Hosts: for local rank/size and for transports that reach same-host peers only. */
    c->host_ids = (char *)_ddp_calloc(&c->alloc, (size_t)c->nranks * _DDP_HOST_ID_LEN);
    if (!c->host_ids) return ddp_comm_fail(c, DDP_ERR_OUT_OF_MEMORY, "init: host table");
    {
        int lr = 0, ls = 0;
        for (i = 0; i < c->nranks; i++) {
            char *h = c->host_ids + (size_t)i * _DDP_HOST_ID_LEN;
            _ddp_key(c, key, sizeof key, "host/%d", i);
            len = 0;
            if ((r = ddp_store_get(c->store, key, h, _DDP_HOST_ID_LEN - 1, &len)) != DDP_SUCCESS)
                return ddp_comm_fail(c, r, "init: rendezvous: %s", ddp_store_last_error(c->store));
            h[len < _DDP_HOST_ID_LEN ? len : _DDP_HOST_ID_LEN - 1] = 0;
            if (!strcmp(h, host)) { if (i < c->rank) lr++; ls++; }
        }
        if (c->local_rank < 0) c->local_rank = lr;
        if (c->local_size < 0) c->local_size = ls;
    }
    return DDP_SUCCESS;
}

_DDP_PRIVATE ddp_result_t _ddp_lanes_create(ddp_comm_t *c);

_DDP_PRIVATE ddp_result_t _ddp_comm_init(ddp_comm_t **out, int nranks, int rank, const ddp_comm_desc_t *d,
                                         int is_lane);

DDP_API ddp_result_t ddp_comm_init(ddp_comm_t **out, int nranks, int rank, const ddp_comm_desc_t *d) {
    return _ddp_comm_init(out, nranks, rank, d, 0);
}

_DDP_PRIVATE ddp_result_t _ddp_comm_init(ddp_comm_t **out, int nranks, int rank, const ddp_comm_desc_t *d,
                                         int is_lane) {
    ddp_comm_desc_t zero;
    ddp_comm_t *c;
    ddp_result_t r;
    const char *s, *forced;
    long v;
    int i;
    if (!out) return DDP_ERR_INVALID_ARGUMENT;
    *out = NULL;
    if (nranks < 1 || rank < 0 || rank >= nranks) return DDP_ERR_INVALID_ARGUMENT;
    if (!d) { memset(&zero, 0, sizeof zero); d = &zero; }
    if (d->allocator && (!d->allocator->alloc || !d->allocator->free)) return DDP_ERR_INVALID_ARGUMENT;
    c = (ddp_comm_t *)_ddp_calloc(d->allocator, sizeof *c);
    if (!c) return DDP_ERR_OUT_OF_MEMORY;
    c->magic = _DDP_COMM_MAGIC;
    pthread_mutex_init(&c->amu, NULL);
    pthread_cond_init(&c->acv, NULL);
    pthread_cond_init(&c->adone, NULL);
    c->async_init = 1;
    if (!_ddp_live_add(c)) { _ddp_free(d->allocator, c); return DDP_ERR_OUT_OF_MEMORY; }
    if (d->allocator) c->alloc = *d->allocator;
    c->rank = rank;
    c->nranks = nranks;
    c->local_rank = c->local_size = -1;
    c->log_level = d->log_level ? d->log_level - 1 : _ddp_log_level_from_env();
    c->timeout_ms = d->timeout_ms ? d->timeout_ms : _ddp_env_timeout_ms();
    s = getenv("DDP_TIMEOUT_MS");
    if (!d->timeout_ms && s && _ddp_parse_long(s, -1, INT_MAX, &v) != 0) {
        r = ddp_comm_fail(c, DDP_ERR_INVALID_ARGUMENT, "init: DDP_TIMEOUT_MS='%s' is not a "
                          "number of milliseconds", s);
        goto fail;
    }
    c->spin_us = d->spin_us ? d->spin_us : -2;
    if (c->spin_us == -2) {
        s = getenv("DDP_SPIN_US");
        /* Measured (README): polling with sched_yield beats sleeping at once even with 4 ranks
         * on 2 CPUs, because the yield hands the CPU to the peer we wait for. */
        c->spin_us = (s && _ddp_parse_long(s, -1, 10000000, &v) == 0) ? (int)v : _DDP_DEFAULT_SPIN_US;
    }
    if (c->spin_us < 0) c->spin_us = 0;
    c->segment_bytes = d->segment_bytes ? d->segment_bytes : _ddp_parse_size(getenv("DDP_SEGMENT_BYTES"));
    if (!c->segment_bytes) c->segment_bytes = 512u << 10;
    if (c->segment_bytes < 4096) c->segment_bytes = 4096;
    if (c->segment_bytes > (64u << 20)) c->segment_bytes = 64u << 20;
    c->segment_bytes &= ~(size_t)63;
    s = getenv("DDP_ALGO");
    c->algo = !s || !*s || !strcmp(s, "auto") ? _DDP_ALGO_AUTO : !strcmp(s, "ring") ? _DDP_ALGO_RING
            : !strcmp(s, "rd") || !strcmp(s, "recursive_doubling") ? _DDP_ALGO_RD : -1;
    if (c->algo < 0) {
        r = ddp_comm_fail(c, DDP_ERR_INVALID_ARGUMENT, "init: DDP_ALGO='%s': expected auto, ring "
                          "or rd", s);
        goto fail;
    }
    /* Measured crossover (README, bench/): below it the ring's 2(p-1) hops cost more than
     * recursive doubling's extra bytes. */
    c->rd_max_bytes = _ddp_parse_size(getenv("DDP_RD_MAX_BYTES"));
    if (!c->rd_max_bytes)
        c->rd_max_bytes = nranks == 2 ? _DDP_RD_MAX_BYTES_P2
                        : (nranks & (nranks - 1)) == 0 ? _DDP_RD_MAX_BYTES_POW2 : _DDP_RD_MAX_BYTES_FOLDED;
    _ddp_strlcpy(c->prefix, d->store_prefix ? d->store_prefix : "ddp", sizeof c->prefix);
    {
        long v;
        s = getenv("DDP_ASYNC_LANES");
        c->want_lanes = (s && _ddp_parse_long(s, 1, _DDP_MAX_LANES, &v) == 0) ? (int)v : _DDP_DEFAULT_LANES;
        c->lane_min_bytes = _ddp_parse_size(getenv("DDP_LANE_MIN_BYTES"));
        if (!c->lane_min_bytes) c->lane_min_bytes = _DDP_LANE_MIN_BYTES;
    }
    s = d->socket_ifname ? d->socket_ifname : getenv("DDP_SOCKET_IFNAME");
    _ddp_strlcpy(c->ifname, s ? s : "", sizeof c->ifname);
    s = d->master_addr ? d->master_addr : getenv("MASTER_ADDR");
    _ddp_strlcpy(c->master_addr, (s && *s) ? s : "127.0.0.1", sizeof c->master_addr);
    if (d->master_port) {
        c->master_port = d->master_port;
    } else if ((i = _ddp_env_int("MASTER_PORT", 1, 65535, &v)) == 1) {
        c->master_port = (int)v;
    } else if (i < 0) {
        r = ddp_comm_fail(c, DDP_ERR_INVALID_ARGUMENT, "init: MASTER_PORT='%s' is not a port "
                          "number (1..65535)", getenv("MASTER_PORT"));
        goto fail;
    } else {
        c->master_port = _DDP_DEFAULT_PORT;
    }
    if (c->master_port < 1 || c->master_port > 65535) {
        r = ddp_comm_fail(c, DDP_ERR_INVALID_ARGUMENT, "init: master port %d out of range", c->master_port);
        goto fail;
    }
    forced = d->transport ? d->transport : getenv("DDP_TRANSPORT");
    if (forced && (!*forced || !strcmp(forced, "auto"))) forced = NULL;
    if (forced) _ddp_strlcpy(c->transport_name, forced, sizeof c->transport_name);
    if (forced && !ddp_transport_find(forced)) {
        char names[128] = "";
        size_t off = 0;
        for (i = 0; i < _ddp_ntransports && off + 16 < sizeof names; i++)
            off += (size_t)snprintf(names + off, sizeof names - off, "%s%s", i ? ", " : "", _ddp_transports[i]->name);
        r = ddp_comm_fail(c, DDP_ERR_UNSUPPORTED, "init: transport '%s' is not compiled into "
                          "this program (compiled in: %s; include transports/ddp_%s.h)", forced,
                          off ? names : "none", forced);
        goto fail;
    }
    c->peers = (_ddp_peer_t *)_ddp_calloc(&c->alloc, sizeof *c->peers * (size_t)nranks);
    c->p2p = (uint32_t *)_ddp_calloc(&c->alloc, sizeof *c->p2p * 4 * (size_t)nranks);
    c->scratch_bytes = c->segment_bytes * _DDP_MAX_SLOTS;
    c->scratch = (unsigned char *)_ddp_alloc(&c->alloc, c->scratch_bytes);
    if (!c->peers || !c->scratch || !c->p2p) { r = ddp_comm_fail(c, DDP_ERR_OUT_OF_MEMORY, "init: allocating"); goto fail; }
    for (i = 0; i < nranks; i++) c->peers[i].tinst = -1;
    _DDP_LOG(c, DDP_LOG_INFO, "init: rank %d of %d, master %s:%d, timeout %d ms, spin %d us, "
             "segment %zu bytes, transport %s", rank, nranks, c->master_addr, c->master_port,
             c->timeout_ms, c->spin_us, c->segment_bytes, forced ? forced : "auto");

    if (d->store) {
        c->store = d->store;
    } else {
        ddp_store_desc_t sd;
        char err[512] = "";
        memset(&sd, 0, sizeof sd);
        sd.timeout_ms = c->timeout_ms;
        sd.secret = d->job_secret;
        sd.log_level = c->log_level + 1;
        sd.log_rank = rank + 1;
        r = _ddp_store_open(&c->store, c->master_addr, c->master_port, rank == 0, &sd, err, sizeof err);
        if (r != DDP_SUCCESS) {
            r = ddp_comm_fail(c, r, "init: %s", err);
            goto fail;
        }
        c->own_store = 1;
    }
    r = _ddp_rendezvous(c, forced);
    if (r != DDP_SUCCESS) goto fail;

    /* Per-peer transport: the highest priority one that reaches the peer (same rule on both
     * sides, so they agree without talking). */
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
                              i, ddp_comm_host_id(c, i));
            goto fail;
        }
        c->peers[i].tinst = best;
        _DDP_LOG(c, DDP_LOG_TRACE, "peer %d (host %s): transport %s", i, ddp_comm_host_id(c, i),
                 c->tinst[best].t->name);
    }
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
        /* One transport reaches everyone and can run the collectives itself (shared memory on
         * one host): it needs every peer connected. */
        {
            int same = c->peers[rank == 0 ? 1 : 0].tinst;
            for (k = 0; k < nranks; k++) if (k != rank && c->peers[k].tinst != same) same = -1;
            if (same >= 0 && c->algo == _DDP_ALGO_AUTO && c->tinst[same].t->coll &&
                c->tinst[same].t->coll->enable) {
                r = _ddp_connect_peers(c, NULL, nranks);
                if (r != DDP_SUCCESS) { _ddp_publish_failure(c); goto fail; }
                if (c->tinst[same].t->coll->enable(c->tinst[same].state) == DDP_SUCCESS) {
                    c->coll = c->tinst[same].t->coll;
                    c->coll_state = c->tinst[same].state;
                }
            }
        }
        _DDP_LOG(c, DDP_LOG_INFO, "ring: send to rank %d via %s, receive from rank %d via %s; "
                 "%d peers connected in all", list[0], ddp_comm_transport_name(c, list[0]), list[1],
                 ddp_comm_transport_name(c, list[1]), j);
        if (c->coll)
            _DDP_LOG(c, DDP_LOG_INFO, "collectives: run by the %s transport itself (all %d ranks "
                     "reach each other through it); DDP_ALGO=ring or rd to use those instead",
                     c->tinst[c->peers[list[0]].tinst].t->name, nranks);
        else if (c->algo != _DDP_ALGO_AUTO)
            _DDP_LOG(c, DDP_LOG_INFO, "all_reduce algorithm: %s",
                     c->algo == _DDP_ALGO_RING ? "ring (DDP_ALGO)"
                     : "recursive doubling up to the scratch size, ring above (DDP_ALGO)");
        else
            _DDP_LOG(c, DDP_LOG_INFO, "all_reduce algorithm: recursive doubling up to %zu bytes, "
                     "ring above (DDP_ALGO, DDP_RD_MAX_BYTES override)", c->rd_max_bytes);
        r = _ddp_connect_peers(c, list, j);
        if (r != DDP_SUCCESS) { _ddp_publish_failure(c); goto fail; }
    }
    c->nlanes = 1;
    if (!is_lane && (r = _ddp_lanes_create(c)) != DDP_SUCCESS) goto fail;
    {
        cpu_set_t set;
        int ncpu = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 1;
        _DDP_LOG(c, DDP_LOG_INFO, "wait policy: poll %d us (yielding the CPU between polls), then "
                 "sleep in the kernel; %d ranks on this host, %d CPUs", c->spin_us, c->local_size, ncpu);
    }
    _DDP_LOG(c, DDP_LOG_INFO, "init done: local rank %d of %d", c->local_rank, c->local_size);
    *out = c;
    return DDP_SUCCESS;
fail:
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
    return c->tinst[ti].t->wait(c->tinst[ti].state, conns, k, timeout_ms);
}

/* Tag of every message of one collective: a digest of what the caller asked for (so ranks
 * calling different collectives, dtypes, ops, counts or roots are caught) and its sequence. */
_DDP_PRIVATE uint64_t _ddp_coll_tag(ddp_comm_t *c, int kind, ddp_dtype_t dtype, ddp_op_t op,
                                    size_t count, int root) {
    uint64_t h = _DDP_FNV_INIT;
    int64_t fields[5];
    fields[0] = kind; fields[1] = dtype; fields[2] = op; fields[3] = (int64_t)count; fields[4] = root;
    h = _ddp_fnv1a(fields, sizeof fields, h);
    c->seq++;
    return (h & 0xffffffff00000000ull) | c->seq;
}

/* ---------------------------------------------------------------- collectives: checks */
_DDP_PRIVATE ddp_result_t _ddp_check_comm(ddp_comm_t *c) {
    if (!c) return DDP_ERR_INVALID_ARGUMENT;
    if (!_ddp_live_check(c, 0)) return DDP_ERR_INVALID_USAGE;
    return (ddp_result_t)__atomic_load_n(&c->error, __ATOMIC_SEQ_CST);
}

_DDP_PRIVATE ddp_result_t _ddp_check_args(ddp_comm_t *c, const char *what, const void *sendbuf,
                                          const void *recvbuf, size_t count, size_t mult,
                                          ddp_dtype_t dtype, int check_op, ddp_op_t op) {
    size_t es = ddp_dtype_size(dtype);
    if (!es) return ddp_comm_fail(c, DDP_ERR_INVALID_ARGUMENT, "%s: invalid dtype %d", what, (int)dtype);
    if (check_op && (unsigned)op >= DDP_NUM_OPS)
        return ddp_comm_fail(c, DDP_ERR_INVALID_ARGUMENT, "%s: invalid op %d", what, (int)op);
    if (count > SIZE_MAX / es / mult)
        return ddp_comm_fail(c, DDP_ERR_INVALID_ARGUMENT, "%s: count %zu x %zu ranks x %zu bytes "
                             "overflows size_t", what, count, mult, es);
    if (count && (!sendbuf || !recvbuf))
        return ddp_comm_fail(c, DDP_ERR_INVALID_ARGUMENT, "%s: NULL %s buffer with count %zu",
                             what, sendbuf ? "receive" : "send", count);
    return DDP_SUCCESS;
}

/* The communicator's error state, NCCL-style: a failed collective poisons it. */
_DDP_PRIVATE ddp_result_t _ddp_finish(ddp_comm_t *c, ddp_result_t r) {
    return r == DDP_SUCCESS ? r : _ddp_comm_poison(c, r);
}

/* ---------------------------------------------------------------- operations, async, abort
 * Every collective is an operation record. A blocking call runs it on the caller's thread; an
 * async call queues it for the communicator's progress thread, which runs the queue in issue
 * order. Only one thread runs operations at a time: a blocking call first waits until the
 * queue is empty. The slots are allocated once, at the first async call: no allocation per
 * call. */
enum { _DDP_OP_ALL_REDUCE = 1, _DDP_OP_REDUCE_SCATTER, _DDP_OP_ALL_GATHER, _DDP_OP_BROADCAST,
       _DDP_OP_BARRIER };
typedef struct _ddp_op {
    int kind, root, state;            /* state: 0 free, 1 queued, 2 running, 3 done */
    const void *send;
    void *recv;
    size_t count;
    ddp_dtype_t dtype;
    ddp_op_t op;
    uint64_t id;                      /* issue number, from 1 */
    ddp_result_t result;
    /* Work the progress thread does before the operation and, if it succeeded, after it (the
     * reducer's copy in and out of a bucket: off the caller's thread, which is computing). */
    void (*around)(void *arg, int index, int before);
    void *around_arg;
    int around_index;
    int lane;                         /* the progress thread that runs it */
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
    __atomic_store_n(&c->busy, 1, __ATOMIC_SEQ_CST);
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
    if (c->spin_us <= 0) return 0;
    until = _ddp_now_us() + c->spin_us;
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

/* ---- lanes
 * Requests run on progress threads ("lanes"), each in issue order. Lane 0 runs on the
 * communicator itself; with DDP_ASYNC_LANES > 1 (default 2) and the ring doing the
 * collectives (no transport-run collectives: shared memory gains nothing), requests of
 * DDP_LANE_MIN_BYTES or more take turns over the lanes, each lane > 0 running on its own copy
 * of the communicator (own connections), so that several large requests are on the wire at
 * once (NCCL's channels, Gloo's multiple pairs). Which lane runs a request depends only on the
 * sequence of requests, the same on every rank. A request waits for earlier requests of other
 * lanes whose buffers it would read or write while they write or read them, so the results are
 * those of issue order; and requests complete, for ddp_wait/ddp_test, in issue order. A lane
 * that fails aborts the others, which tells every peer. */
enum { _DDP_CALL_REDUCE = 20, _DDP_CALL_GATHER, _DDP_CALL_SCATTER, _DDP_CALL_ALL_TO_ALL,
       _DDP_CALL_SEND, _DDP_CALL_RECV };   /* also the kind in their message tags */

/* The bytes an operation reads (recv_side 0) or writes (1). */
_DDP_PRIVATE size_t _ddp_op_bytes(const ddp_comm_t *c, const _ddp_op_t *o, int recv_side) {
    size_t b = o->count * ddp_dtype_size(o->dtype), p = (size_t)c->nranks;
    switch (o->kind) {
    case _DDP_OP_BARRIER: return 0;
    case _DDP_OP_REDUCE_SCATTER: case _DDP_CALL_SCATTER: return recv_side ? b : b * p;
    case _DDP_OP_ALL_GATHER: case _DDP_CALL_GATHER: return recv_side ? b * p : b;
    case _DDP_CALL_ALL_TO_ALL: return b * p;
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
            if (o->around) o->around(o->around_arg, o->around_index, 1);
            r = _ddp_run_op(x, o);
            _ddp_end(x);
            if (r == DDP_SUCCESS && o->around) o->around(o->around_arg, o->around_index, 0);
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
    int want = c->coll || c->nranks < 2 ? 1 : c->want_lanes, i;
    ddp_comm_desc_t d;
    ddp_store_desc_t sd;
    char prefix[192];
    ddp_result_t r;
    c->lanes[0].owner = c->lanes[0].exec = c;
    for (i = 1; i < want; i++) {
        ddp_store_t *client = NULL;
        snprintf(prefix, sizeof prefix, "%s/lane%d", c->prefix, i);
        /* Its own client of the store: a store client serves one thread at a time, and the
         * lanes report failures from their own threads. */
        memset(&sd, 0, sizeof sd);
        sd.timeout_ms = c->timeout_ms;
        sd.secret = c->store->secret;
        sd.log_level = c->log_level + 1;
        sd.log_rank = c->rank + 1;
        if ((r = ddp_store_open(&client, c->store->host, c->store->port, 0, &sd)) != DDP_SUCCESS) {
            ddp_comm_fail(c, r, "init: async lane %d: connecting to the store at %s:%d: %.400s", i,
                          c->store->host, c->store->port, client ? ddp_store_last_error(client) : "");
            if (client) ddp_store_close(client);
            return r;
        }
        memset(&d, 0, sizeof d);
        d.master_addr = c->master_addr;
        d.master_port = c->master_port;
        d.timeout_ms = c->timeout_ms;
        d.socket_ifname = c->ifname[0] ? c->ifname : NULL;
        d.store = client;
        d.store_prefix = prefix;
        d.transport = c->transport_name[0] ? c->transport_name : NULL;
        d.segment_bytes = c->segment_bytes;
        d.spin_us = c->spin_us ? c->spin_us : -1;
        d.log_level = (c->log_level >= DDP_LOG_TRACE ? c->log_level : DDP_LOG_WARN) + 1;
        d.allocator = c->alloc.alloc ? &c->alloc : NULL;
        c->lanes[i].owner = c;
        if ((r = _ddp_comm_init(&c->lanes[i].exec, c->nranks, c->rank, &d, 1)) != DDP_SUCCESS) {
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
    if (!_ddp_live_check(req->comm, 0)) { *r = DDP_ERR_INVALID_USAGE; return 0; }
    if (!req->comm->ops) {
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
    if (!__atomic_load_n(&c->busy, __ATOMIC_SEQ_CST)) _ddp_abort_poison(c);
    pthread_mutex_lock(&c->amu);
    pthread_cond_broadcast(&c->acv);
    pthread_cond_broadcast(&c->adone);
    pthread_mutex_unlock(&c->amu);
}

DDP_API ddp_result_t ddp_comm_abort(ddp_comm_t *c) {
    int i;
    if (!c) return DDP_ERR_INVALID_ARGUMENT;
    if (!_ddp_live_check(c, 0)) return DDP_ERR_INVALID_USAGE;
    _DDP_LOG(c, DDP_LOG_WARN, "ddp_comm_abort: every call on this communicator now returns "
             "DDP_ERR_ABORTED");
    _ddp_abort_internal(c, DDP_ERR_ABORTED, NULL);
    /* the lanes' copies (made at init) */
    for (i = 1; i < c->nlanes; i++) _ddp_abort_internal(c->lanes[i].exec, DDP_ERR_ABORTED, NULL);
    return DDP_SUCCESS;
}

DDP_API ddp_result_t ddp_comm_get_async_error(ddp_comm_t *c, ddp_result_t *e) {
    if (!c || !e) return DDP_ERR_INVALID_ARGUMENT;
    if (!_ddp_live_check(c, 0)) return DDP_ERR_INVALID_USAGE;
    *e = (ddp_result_t)__atomic_load_n(&c->error, __ATOMIC_SEQ_CST);
    if (*e == DDP_SUCCESS && __atomic_load_n(&c->aborted, __ATOMIC_SEQ_CST)) *e = DDP_ERR_ABORTED;
    {
        int i;
        for (i = 1; *e == DDP_SUCCESS && i < c->nlanes; i++)
            *e = (ddp_result_t)__atomic_load_n(&c->lanes[i].exec->error, __ATOMIC_SEQ_CST);
    }
    return DDP_SUCCESS;
}


/* The algorithm depends only on (bytes, world size, settings): the same on every rank. */
_DDP_PRIVATE ddp_result_t _ddp_all_reduce_algo(ddp_comm_t *c, const void *sendbuf, void *recvbuf,
                                               size_t count, ddp_dtype_t dtype, ddp_op_t op) {
    size_t bytes = count * ddp_dtype_size(dtype);
    int rd = bytes <= c->scratch_bytes &&
             (c->algo == _DDP_ALGO_RD || (c->algo == _DDP_ALGO_AUTO && bytes <= c->rd_max_bytes));
    _DDP_LOG(c, DDP_LOG_TRACE, "all_reduce #%u: %zu x %s %s, %s, %s", c->seq + 1, count,
             ddp_dtype_name(dtype), ddp_op_name(op), sendbuf == recvbuf ? "in place" : "out of place",
             rd ? "recursive doubling" : "ring");
    return rd ? ddp_rd_all_reduce(c, sendbuf, recvbuf, count, dtype, op)
              : ddp_ring_all_reduce(c, sendbuf, recvbuf, count, dtype, op);
}

/* Argument checks, shared by the blocking and async entry points. */
_DDP_PRIVATE ddp_result_t _ddp_prep(ddp_comm_t *c, _ddp_op_t *o) {
    ddp_result_t r = _ddp_check_comm(c);
    if (r != DDP_SUCCESS) return r;
    switch (o->kind) {
    case _DDP_OP_ALL_REDUCE:
        return _ddp_check_args(c, "all_reduce", o->send, o->recv, o->count, 1, o->dtype, 1, o->op);
    case _DDP_OP_REDUCE_SCATTER:
        return _ddp_check_args(c, "reduce_scatter", o->send, o->recv, o->count, (size_t)c->nranks,
                               o->dtype, 1, o->op);
    case _DDP_OP_ALL_GATHER:
        return _ddp_check_args(c, "all_gather", o->send, o->recv, o->count, (size_t)c->nranks,
                               o->dtype, 0, DDP_SUM);
    case _DDP_OP_BROADCAST:
        if (o->root < 0 || o->root >= c->nranks)
            return ddp_comm_fail(c, DDP_ERR_INVALID_ARGUMENT, "broadcast: root %d not in 0..%d",
                                 o->root, c->nranks - 1);
        /* Only the root reads sendbuf (NCCL): others may pass NULL. */
        return _ddp_check_args(c, "broadcast", c->rank == o->root ? o->send : o->recv, o->recv,
                               o->count, 1, o->dtype, 0, DDP_SUM);
    default:
        return DDP_SUCCESS;
    }
}

_DDP_PRIVATE ddp_result_t _ddp_run_call_op(ddp_comm_t *c, const _ddp_op_t *o);   /* below */

/* Runs one operation on the calling thread (the caller's, or the progress thread). */
_DDP_PRIVATE ddp_result_t _ddp_run_op_raw(ddp_comm_t *c, const _ddp_op_t *o) {
    ddp_result_t r;
    unsigned char token = 0;
    switch (o->kind) {
    case _DDP_OP_ALL_REDUCE:
        if (c->coll) {
            c->seq++;   /* never inside _DDP_LOG: the count must not depend on the log level */
            _DDP_LOG(c, DDP_LOG_TRACE, "all_reduce #%u: %zu x %s %s, %s, by the transport", c->seq,
                     o->count, ddp_dtype_name(o->dtype), ddp_op_name(o->op),
                     o->send == o->recv ? "in place" : "out of place");
            r = c->coll->all_reduce(c->coll_state, o->send, o->recv, o->count, o->dtype, o->op);
        } else {
            r = _ddp_all_reduce_algo(c, o->send, o->recv, o->count, o->dtype, o->op);
        }
        break;
    case _DDP_OP_REDUCE_SCATTER:
        _DDP_LOG(c, DDP_LOG_TRACE, "reduce_scatter #%u: %zu x %s per rank, %s, %s", c->seq + 1,
                 o->count, ddp_dtype_name(o->dtype), ddp_op_name(o->op), c->coll ? "by the transport" : "ring");
        if (c->coll) {
            c->seq++;
            r = c->coll->reduce_scatter(c->coll_state, o->send, o->recv, o->count, o->dtype, o->op);
        } else {
            r = ddp_ring_reduce_scatter(c, o->send, o->recv, o->count, o->dtype, o->op);
        }
        break;
    case _DDP_OP_ALL_GATHER:
        _DDP_LOG(c, DDP_LOG_TRACE, "all_gather #%u: %zu x %s per rank, %s", c->seq + 1, o->count,
                 ddp_dtype_name(o->dtype), c->coll ? "by the transport" : "ring");
        if (c->coll) {
            c->seq++;
            r = c->coll->all_gather(c->coll_state, o->send, o->recv, o->count, o->dtype);
        } else {
            r = ddp_ring_all_gather(c, o->send, o->recv, o->count, o->dtype);
        }
        break;
    case _DDP_OP_BROADCAST:
        _DDP_LOG(c, DDP_LOG_TRACE, "broadcast #%u: %zu x %s from root %d, %s", c->seq + 1, o->count,
                 ddp_dtype_name(o->dtype), o->root, c->coll ? "by the transport" : "pipelined chain");
        if (c->coll) {
            c->seq++;
            r = c->coll->broadcast(c->coll_state, o->send, o->recv, o->count, o->dtype, o->root);
        } else {
            r = ddp_ring_broadcast(c, o->send, o->recv, o->count, o->dtype, o->root);
        }
        break;
    case _DDP_OP_BARRIER:
        if (c->coll) {
            c->seq++;
            _DDP_LOG(c, DDP_LOG_TRACE, "barrier #%u, by the transport", c->seq);
            r = c->coll->barrier(c->coll_state);
        } else {
            _DDP_LOG(c, DDP_LOG_TRACE, "barrier #%u: a one-byte all_reduce", c->seq + 1);
            r = _ddp_all_reduce_algo(c, &token, &token, 1, DDP_UINT8, DDP_MAX);
        }
        break;
    default:   /* reduce, gather, scatter, all_to_all made async */
        r = _ddp_run_call_op(c, o);
    }
    return r;
}

_DDP_PRIVATE ddp_result_t _ddp_run_op(ddp_comm_t *c, const _ddp_op_t *o) {
    return _ddp_finish(c, _ddp_run_op_raw(c, o));
}

_DDP_PRIVATE ddp_result_t _ddp_group_queue_op(ddp_comm_t *c, const _ddp_op_t *o);  /* below */

_DDP_PRIVATE ddp_result_t _ddp_blocking(ddp_comm_t *c, _ddp_op_t o) {
    ddp_result_t r = _ddp_prep(c, &o);
    if (r != DDP_SUCCESS) return r;
    if (c->group_depth) return _ddp_group_queue_op(c, &o);     /* runs at group_end, in order */
    return _ddp_exec(c, &o);
}

_DDP_PRIVATE ddp_result_t _ddp_async(ddp_comm_t *c, _ddp_op_t o, const char *what, ddp_request_t *req) {
    ddp_result_t r;
    if (req) { req->comm = NULL; req->id = 0; }
    if ((r = _ddp_prep(c, &o)) != DDP_SUCCESS) return r;
    if (!req) return ddp_comm_fail(c, DDP_ERR_INVALID_ARGUMENT, "%s: NULL request", what);
    if (c->group_depth)
        return ddp_comm_fail(c, DDP_ERR_INVALID_USAGE, "%s inside a group: groups take blocking "
                             "calls (they run together at group_end)", what);
    return _ddp_submit(c, what, &o, req);
}

DDP_API ddp_result_t ddp_all_reduce(const void *sendbuf, void *recvbuf, size_t count,
                                    ddp_dtype_t dtype, ddp_op_t op, ddp_comm_t *c) {
    return _ddp_blocking(c, _ddp_op_make(_DDP_OP_ALL_REDUCE, sendbuf, recvbuf, count, dtype, op, 0));
}

DDP_API ddp_result_t ddp_reduce_scatter(const void *sendbuf, void *recvbuf, size_t recvcount,
                                        ddp_dtype_t dtype, ddp_op_t op, ddp_comm_t *c) {
    return _ddp_blocking(c, _ddp_op_make(_DDP_OP_REDUCE_SCATTER, sendbuf, recvbuf, recvcount, dtype, op, 0));
}

DDP_API ddp_result_t ddp_all_gather(const void *sendbuf, void *recvbuf, size_t sendcount,
                                    ddp_dtype_t dtype, ddp_comm_t *c) {
    return _ddp_blocking(c, _ddp_op_make(_DDP_OP_ALL_GATHER, sendbuf, recvbuf, sendcount, dtype, DDP_SUM, 0));
}

DDP_API ddp_result_t ddp_broadcast(const void *sendbuf, void *recvbuf, size_t count,
                                   ddp_dtype_t dtype, int root, ddp_comm_t *c) {
    return _ddp_blocking(c, _ddp_op_make(_DDP_OP_BROADCAST, sendbuf, recvbuf, count, dtype, DDP_SUM, root));
}

DDP_API ddp_result_t ddp_barrier(ddp_comm_t *c) {
    return _ddp_blocking(c, _ddp_op_make(_DDP_OP_BARRIER, NULL, NULL, 0, DDP_UINT8, DDP_MAX, 0));
}

DDP_API ddp_result_t ddp_all_reduce_async(const void *sendbuf, void *recvbuf, size_t count,
                                          ddp_dtype_t dtype, ddp_op_t op, ddp_comm_t *c,
                                          ddp_request_t *req) {
    return _ddp_async(c, _ddp_op_make(_DDP_OP_ALL_REDUCE, sendbuf, recvbuf, count, dtype, op, 0),
                      "all_reduce_async", req);
}

DDP_API ddp_result_t ddp_reduce_scatter_async(const void *sendbuf, void *recvbuf, size_t recvcount,
                                              ddp_dtype_t dtype, ddp_op_t op, ddp_comm_t *c,
                                              ddp_request_t *req) {
    return _ddp_async(c, _ddp_op_make(_DDP_OP_REDUCE_SCATTER, sendbuf, recvbuf, recvcount, dtype, op, 0),
                      "reduce_scatter_async", req);
}

DDP_API ddp_result_t ddp_all_gather_async(const void *sendbuf, void *recvbuf, size_t sendcount,
                                          ddp_dtype_t dtype, ddp_comm_t *c, ddp_request_t *req) {
    return _ddp_async(c, _ddp_op_make(_DDP_OP_ALL_GATHER, sendbuf, recvbuf, sendcount, dtype, DDP_SUM, 0),
                      "all_gather_async", req);
}

DDP_API ddp_result_t ddp_broadcast_async(const void *sendbuf, void *recvbuf, size_t count,
                                         ddp_dtype_t dtype, int root, ddp_comm_t *c,
                                         ddp_request_t *req) {
    return _ddp_async(c, _ddp_op_make(_DDP_OP_BROADCAST, sendbuf, recvbuf, count, dtype, DDP_SUM, root),
                      "broadcast_async", req);
}

DDP_API ddp_result_t ddp_barrier_async(ddp_comm_t *c, ddp_request_t *req) {
    return _ddp_async(c, _ddp_op_make(_DDP_OP_BARRIER, NULL, NULL, 0, DDP_UINT8, DDP_MAX, 0),
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
    int i, n = 0, me = 0;
    char prefix[192];
    ddp_comm_desc_t d;
    if (r != DDP_SUCCESS) return r;
    if (!out) return ddp_comm_fail(c, DDP_ERR_INVALID_ARGUMENT, "comm_split: NULL newcomm");
    *out = NULL;
    if (color < 0 && color != DDP_SPLIT_NOCOLOR)
        return ddp_comm_fail(c, DDP_ERR_INVALID_ARGUMENT, "comm_split: color %d (colors are >= 0, "
                             "or DDP_SPLIT_NOCOLOR)", color);
    all = (int32_t *)_ddp_alloc(&c->alloc, sizeof *all * 2 * (size_t)c->nranks);
    if (!all) return ddp_comm_fail(c, DDP_ERR_OUT_OF_MEMORY, "comm_split");
    mine[0] = color;
    mine[1] = key;
    r = ddp_all_gather(mine, all, 2, DDP_INT32, c);
    c->splits++;
    if (r == DDP_SUCCESS && color != DDP_SPLIT_NOCOLOR) {
        for (i = 0; i < c->nranks; i++) {
            if (all[2 * i] != color) continue;
            n++;
            if (all[2 * i + 1] < key || (all[2 * i + 1] == key && i < c->rank)) me++;
        }
    }
    _ddp_free(&c->alloc, all);
    if (r != DDP_SUCCESS || color == DDP_SPLIT_NOCOLOR) return r;
    snprintf(prefix, sizeof prefix, "%s/split%u/color%d", c->prefix, c->splits, color);
    memset(&d, 0, sizeof d);
    d.master_addr = c->master_addr;
    d.master_port = c->master_port;
    d.timeout_ms = c->timeout_ms;
    d.socket_ifname = c->ifname[0] ? c->ifname : NULL;
    d.store = c->store;
    d.store_prefix = prefix;
    d.transport = c->transport_name[0] ? c->transport_name : NULL;   /* as the parent's */
    d.segment_bytes = c->segment_bytes;
    d.spin_us = c->spin_us ? c->spin_us : -1;
    d.log_level = c->log_level + 1;
    d.allocator = c->alloc.alloc ? &c->alloc : NULL;
    _DDP_LOG(c, DDP_LOG_INFO, "comm_split: color %d key %d -> rank %d of %d (store prefix %s)",
             color, key, me, n, prefix);
    r = ddp_comm_init(out, n, me, &d);
    if (r != DDP_SUCCESS)
        ddp_comm_fail(c, r, "comm_split: the new communicator (color %d, rank %d of %d): %s",
                      color, me, n, ddp_last_init_error());
    return r;
}

/* ---------------------------------------------------------------- reduce, gather, scatter,
 * all-to-all, send/recv, groups: the checks. The algorithms and the group queue are in
 * ddp_ring.h (built below), over point-to-point even when a transport runs the collectives. */
typedef struct {
    int kind;                      /* _DDP_CALL_* */
    const void *send;
    void *recv;
    size_t count;
    ddp_dtype_t dtype;
    ddp_op_t op;
    int root;                      /* the root, or the peer of a send/recv */
    int state;                     /* group_end: 0 queued, 1 posted, 2 done */
    void *req;
    uint64_t tag;
} _ddp_call_t;
_DDP_PRIVATE ddp_result_t _ddp_call_run(ddp_comm_t *c, _ddp_call_t *k);           /* ddp_ring.h */
_DDP_PRIVATE ddp_result_t _ddp_group_queue(ddp_comm_t *c, const _ddp_call_t *k);
_DDP_PRIVATE ddp_result_t _ddp_group_run(ddp_comm_t *c);

_DDP_PRIVATE ddp_result_t _ddp_run_call_op(ddp_comm_t *c, const _ddp_op_t *o) {
    _ddp_call_t k;
    memset(&k, 0, sizeof k);
    k.kind = o->kind; k.send = o->send; k.recv = o->recv; k.count = o->count;
    k.dtype = o->dtype; k.op = o->op; k.root = o->root;
    return _ddp_call_run(c, &k);
}

/* With req: queued for the progress thread (ddp_reduce_async ...). Else queued inside a
 * group, or run now (a failure poisons the communicator). */
_DDP_PRIVATE ddp_result_t _ddp_call(ddp_comm_t *c, int kind, const void *send, void *recv,
                                    size_t count, ddp_dtype_t dtype, ddp_op_t op, int root,
                                    const char *what, ddp_request_t *req) {
    _ddp_call_t k;
    if (req) {
        _ddp_op_t o = _ddp_op_make(kind, send, recv, count, dtype, op, root);
        return _ddp_submit(c, what, &o, req);
    }
    memset(&k, 0, sizeof k);
    k.kind = kind; k.send = send; k.recv = recv; k.count = count;
    k.dtype = dtype; k.op = op; k.root = root;
    if (c->group_depth) return _ddp_group_queue(c, &k);
    {
        ddp_result_t r = _ddp_enter(c);     /* after queued async requests; not after an abort */
        if (r != DDP_SUCCESS) return r;
        r = _ddp_finish(c, _ddp_call_run(c, &k));
        _ddp_end(c);
        return r;
    }
}

/* The original collectives (all_reduce ... barrier) inside a group: queued as calls too, with
 * kind _DDP_CALL_OP + their operation kind; _ddp_call_run hands them back to _ddp_run_op_raw. */
#define _DDP_CALL_OP 100
_DDP_PRIVATE ddp_result_t _ddp_group_queue_op(ddp_comm_t *c, const _ddp_op_t *o) {
    _ddp_call_t k;
    memset(&k, 0, sizeof k);
    k.kind = _DDP_CALL_OP + o->kind; k.send = o->send; k.recv = o->recv; k.count = o->count;
    k.dtype = o->dtype; k.op = o->op; k.root = o->root;
    return _ddp_group_queue(c, &k);
}

/* Bad arguments inside a group also fail its group_end (NCCL). */
_DDP_PRIVATE ddp_result_t _ddp_call_reject(ddp_comm_t *c, ddp_result_t r) {
    if (c->group_depth && c->group_err == DDP_SUCCESS) c->group_err = r;
    return r;
}

_DDP_PRIVATE ddp_result_t _ddp_check_rank(ddp_comm_t *c, const char *what, const char *role, int v) {
    if (v >= 0 && v < c->nranks) return DDP_SUCCESS;
    return _ddp_call_reject(c, ddp_comm_fail(c, DDP_ERR_INVALID_ARGUMENT, "%s: %s %d not in 0..%d",
                                             what, role, v, c->nranks - 1));
}

/* The async forms check their arguments at once and refuse a group (the group would run its
 * calls after this one: out of issue order). */
_DDP_PRIVATE ddp_result_t _ddp_async_start(ddp_comm_t *c, const char *what, ddp_request_t *req) {
    ddp_result_t r = _ddp_check_comm(c);
    if (req) { req->comm = NULL; req->id = 0; }
    if (r != DDP_SUCCESS) return r;
    if (!req) return ddp_comm_fail(c, DDP_ERR_INVALID_ARGUMENT, "%s: NULL request", what);
    if (c->group_depth)
        return ddp_comm_fail(c, DDP_ERR_INVALID_USAGE, "%s inside a group: groups take blocking "
                             "calls (they run together at group_end)", what);
    return DDP_SUCCESS;
}

_DDP_PRIVATE ddp_result_t _ddp_reduce(const void *sendbuf, void *recvbuf, size_t count, ddp_dtype_t dtype,
                                      ddp_op_t op, int root, ddp_comm_t *c, ddp_request_t *req) {
    const char *what = req ? "reduce_async" : "reduce";
    ddp_result_t r = req ? _ddp_async_start(c, what, req) : _ddp_check_comm(c);
    if (r != DDP_SUCCESS) return r;
    if ((r = _ddp_check_rank(c, what, "root", root)) != DDP_SUCCESS) return r;
    /* Only the root writes recvbuf (NCCL): others may pass NULL. */
    if ((r = _ddp_check_args(c, what, sendbuf, c->rank == root ? recvbuf : sendbuf, count, 1,
                             dtype, 1, op)) != DDP_SUCCESS) return _ddp_call_reject(c, r);
    return _ddp_call(c, _DDP_CALL_REDUCE, sendbuf, recvbuf, count, dtype, op, root, what, req);
}

_DDP_PRIVATE ddp_result_t _ddp_gather(const void *sendbuf, void *recvbuf, size_t sendcount,
                                      ddp_dtype_t dtype, int root, ddp_comm_t *c, ddp_request_t *req) {
    const char *what = req ? "gather_async" : "gather";
    ddp_result_t r = req ? _ddp_async_start(c, what, req) : _ddp_check_comm(c);
    if (r != DDP_SUCCESS) return r;
    if ((r = _ddp_check_rank(c, what, "root", root)) != DDP_SUCCESS) return r;
    if ((r = _ddp_check_args(c, what, sendbuf, c->rank == root ? recvbuf : sendbuf, sendcount,
                             (size_t)c->nranks, dtype, 0, DDP_SUM)) != DDP_SUCCESS) return _ddp_call_reject(c, r);
    return _ddp_call(c, _DDP_CALL_GATHER, sendbuf, recvbuf, sendcount, dtype, DDP_SUM, root, what, req);
}

_DDP_PRIVATE ddp_result_t _ddp_scatter(const void *sendbuf, void *recvbuf, size_t recvcount,
                                       ddp_dtype_t dtype, int root, ddp_comm_t *c, ddp_request_t *req) {
    const char *what = req ? "scatter_async" : "scatter";
    ddp_result_t r = req ? _ddp_async_start(c, what, req) : _ddp_check_comm(c);
    if (r != DDP_SUCCESS) return r;
    if ((r = _ddp_check_rank(c, what, "root", root)) != DDP_SUCCESS) return r;
    /* Only the root reads sendbuf (NCCL): others may pass NULL. */
    if ((r = _ddp_check_args(c, what, c->rank == root ? sendbuf : recvbuf, recvbuf, recvcount,
                             (size_t)c->nranks, dtype, 0, DDP_SUM)) != DDP_SUCCESS) return _ddp_call_reject(c, r);
    return _ddp_call(c, _DDP_CALL_SCATTER, sendbuf, recvbuf, recvcount, dtype, DDP_SUM, root, what, req);
}

_DDP_PRIVATE ddp_result_t _ddp_all_to_all(const void *sendbuf, void *recvbuf, size_t count,
                                          ddp_dtype_t dtype, ddp_comm_t *c, ddp_request_t *req) {
    const char *what = req ? "all_to_all_async" : "all_to_all";
    ddp_result_t r = req ? _ddp_async_start(c, what, req) : _ddp_check_comm(c);
    if (r != DDP_SUCCESS) return r;
    if ((r = _ddp_check_args(c, what, sendbuf, recvbuf, count, (size_t)c->nranks, dtype, 0,
                             DDP_SUM)) != DDP_SUCCESS) return _ddp_call_reject(c, r);
    if (count && sendbuf == recvbuf)
        return _ddp_call_reject(c, ddp_comm_fail(c, DDP_ERR_INVALID_ARGUMENT, "%s: sendbuf == "
                                "recvbuf: in place is not supported (as NCCL); use two buffers", what));
    return _ddp_call(c, _DDP_CALL_ALL_TO_ALL, sendbuf, recvbuf, count, dtype, DDP_SUM, 0, what, req);
}

DDP_API ddp_result_t ddp_reduce(const void *sendbuf, void *recvbuf, size_t count, ddp_dtype_t dtype,
                                ddp_op_t op, int root, ddp_comm_t *c) {
    return _ddp_reduce(sendbuf, recvbuf, count, dtype, op, root, c, NULL);
}
DDP_API ddp_result_t ddp_gather(const void *sendbuf, void *recvbuf, size_t sendcount,
                                ddp_dtype_t dtype, int root, ddp_comm_t *c) {
    return _ddp_gather(sendbuf, recvbuf, sendcount, dtype, root, c, NULL);
}
DDP_API ddp_result_t ddp_scatter(const void *sendbuf, void *recvbuf, size_t recvcount,
                                 ddp_dtype_t dtype, int root, ddp_comm_t *c) {
    return _ddp_scatter(sendbuf, recvbuf, recvcount, dtype, root, c, NULL);
}
DDP_API ddp_result_t ddp_all_to_all(const void *sendbuf, void *recvbuf, size_t count,
                                    ddp_dtype_t dtype, ddp_comm_t *c) {
    return _ddp_all_to_all(sendbuf, recvbuf, count, dtype, c, NULL);
}
/* A NULL req is refused by _ddp_async_start (a NULL req means "blocking" further down). */
DDP_API ddp_result_t ddp_reduce_async(const void *sendbuf, void *recvbuf, size_t count, ddp_dtype_t dtype,
                                      ddp_op_t op, int root, ddp_comm_t *c, ddp_request_t *req) {
    if (!req) return _ddp_async_start(c, "reduce_async", NULL);
    return _ddp_reduce(sendbuf, recvbuf, count, dtype, op, root, c, req);
}
DDP_API ddp_result_t ddp_gather_async(const void *sendbuf, void *recvbuf, size_t sendcount,
                                      ddp_dtype_t dtype, int root, ddp_comm_t *c, ddp_request_t *req) {
    if (!req) return _ddp_async_start(c, "gather_async", NULL);
    return _ddp_gather(sendbuf, recvbuf, sendcount, dtype, root, c, req);
}
DDP_API ddp_result_t ddp_scatter_async(const void *sendbuf, void *recvbuf, size_t recvcount,
                                       ddp_dtype_t dtype, int root, ddp_comm_t *c, ddp_request_t *req) {
    if (!req) return _ddp_async_start(c, "scatter_async", NULL);
    return _ddp_scatter(sendbuf, recvbuf, recvcount, dtype, root, c, req);
}
DDP_API ddp_result_t ddp_all_to_all_async(const void *sendbuf, void *recvbuf, size_t count,
                                          ddp_dtype_t dtype, ddp_comm_t *c, ddp_request_t *req) {
    if (!req) return _ddp_async_start(c, "all_to_all_async", NULL);
    return _ddp_all_to_all(sendbuf, recvbuf, count, dtype, c, req);
}

_DDP_PRIVATE ddp_result_t _ddp_p2p_call(ddp_comm_t *c, int kind, const void *send, void *recv,
                                        size_t count, ddp_dtype_t dtype, int peer) {
    const char *what = kind == _DDP_CALL_SEND ? "send" : "recv";
    ddp_result_t r = _ddp_check_comm(c);
    if (r != DDP_SUCCESS) return r;
    if ((r = _ddp_check_rank(c, what, "peer", peer)) != DDP_SUCCESS) return r;
    if ((r = _ddp_check_args(c, what, kind == _DDP_CALL_SEND ? send : recv, kind == _DDP_CALL_SEND ?
                             send : recv, count, 1, dtype, 0, DDP_SUM)) != DDP_SUCCESS) return _ddp_call_reject(c, r);
    if (peer == c->rank && !c->group_depth)
        return ddp_comm_fail(c, DDP_ERR_INVALID_USAGE, "%s: peer %d is this rank: outside a group "
                             "it would wait for itself; put the send and the recv between "
                             "ddp_group_start and ddp_group_end (a local copy)", what, peer);
    return _ddp_call(c, kind, send, recv, count, dtype, DDP_SUM, peer, NULL, NULL);
}

DDP_API ddp_result_t ddp_send(const void *buf, size_t count, ddp_dtype_t dtype, int peer, ddp_comm_t *c) {
    return _ddp_p2p_call(c, _DDP_CALL_SEND, buf, NULL, count, dtype, peer);
}

DDP_API ddp_result_t ddp_recv(void *buf, size_t count, ddp_dtype_t dtype, int peer, ddp_comm_t *c) {
    return _ddp_p2p_call(c, _DDP_CALL_RECV, NULL, buf, count, dtype, peer);
}

DDP_API ddp_result_t ddp_group_start(ddp_comm_t *c) {
    ddp_result_t r = _ddp_check_comm(c);
    if (r != DDP_SUCCESS) return r;
    if (c->group_depth++ == 0) { c->group_n = 0; c->group_err = DDP_SUCCESS; }
    return DDP_SUCCESS;
}

DDP_API ddp_result_t ddp_group_end(ddp_comm_t *c) {
    ddp_result_t r;
    if (!c) return DDP_ERR_INVALID_ARGUMENT;
    if (!_ddp_live_check(c, 0)) return DDP_ERR_INVALID_USAGE;
    if (c->group_depth == 0)
        return ddp_comm_fail(c, DDP_ERR_INVALID_USAGE, "group_end without a group_start");
    if (--c->group_depth) return DDP_SUCCESS;
    if (c->error != DDP_SUCCESS) { c->group_n = 0; return c->error; }
    if ((r = _ddp_enter(c)) != DDP_SUCCESS) { c->group_n = 0; return r; }
    r = _ddp_group_run(c);   /* empties the queue */
    r = r == DDP_SUCCESS || c->group_err != DDP_SUCCESS ? r : _ddp_finish(c, r);
    _ddp_end(c);
    return r;
}

/* ---------------------------------------------------------------- gradient bucket reducer
 * PyTorch DDP's Reducer (torch/csrc/distributed/c10d/reducer.cpp; Li et al., "PyTorch
 * Distributed: Experiences on Accelerating Data Parallel Training", VLDB 2020, section 3.2.3
 * "Gradient bucketing" and 3.2.4 "Overlap computation with communication"), built on the public
 * async collectives only: a bucket is one ddp_all_reduce_async, which the communicator's
 * progress thread runs in issue order while the caller's backward pass goes on. The same
 * issue order on every rank is what keeps ranks that mark gradients in different orders from
 * deadlocking or mixing buckets: like the Reducer's mark_bucket_ready, a bucket launches only
 * after every bucket before it has, so bucket k is always the k-th reducer collective. */
typedef struct {
    void *user;                    /* the caller's gradient (NULL allowed in view mode) */
    size_t count, bytes;
    ddp_dtype_t dtype;
    int bucket;                    /* its bucket, and where in it (bytes) */
    size_t offset;
    unsigned char marked;          /* ready in this iteration */
} _ddp_rparam_t;

typedef struct {
    unsigned char *buf;            /* in the arena: the bucket's gradients, contiguous */
    size_t count, bytes;
    ddp_dtype_t dtype;
    int first, n;                  /* its parameters: params_of[first .. first + n) */
    int pending;                   /* parameters not ready yet in this iteration */
    ddp_request_t req;
    void *half;                    /* built-in compression: count 16-bit values, else NULL */
} _ddp_rbucket_t;

struct ddp_reducer {
    ddp_comm_t *comm;
    ddp_reducer_desc_t d;
    int world, rank;
    _ddp_rparam_t *params;
    int nparams, params_cap;
    int closed;                    /* buckets laid out: add_param refused from then on */
    ddp_result_t broken;           /* an allocation failed at close or rebuild */
    _ddp_rbucket_t *buckets;       /* nparams slots (a bucket has >= 1 parameter) */
    int nbuckets;
    int *params_of;                /* nparams: parameter indices grouped by bucket */
    int *work;                     /* 2 * nparams: scratch of the bucket assignment */
    int32_t *order;                /* 1 + nparams: [0] a flag, then this iteration's ready order */
    int nready;
    unsigned char *used;           /* find_unused: marked on this rank, then on any (MAX) */
    unsigned char *arena, *half_arena;
    int next_launch, next_collect; /* buckets [next_collect, next_launch) are in flight */
    int in_iteration, finished, no_sync, rebuilt;
    uint64_t iterations;           /* synchronised finishes */
    ddp_result_t iter_err;         /* first communication failure of this iteration */
    char err[768];
};

#define _DDP_REDUCER_MAX_INFLIGHT (DDP_MAX_REQUESTS / 2)
#define _DDP_REDUCER_ALIGN 64

_DDP_PRIVATE ddp_result_t _ddp_reducer_fail(ddp_reducer_t *r, ddp_result_t e, const char *fmt, ...)
#if defined(__GNUC__) || defined(__clang__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
_DDP_PRIVATE ddp_result_t _ddp_reducer_fail(ddp_reducer_t *r, ddp_result_t e, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->err, sizeof r->err, fmt, ap);
    va_end(ap);
    return ddp_comm_fail(r->comm, e, "reducer: %s", r->err);
}

/* A communication failure: the communicator already says what happened. */
_DDP_PRIVATE void _ddp_reducer_comm_err(ddp_reducer_t *r, ddp_result_t e, const char *what, int bucket) {
    if (r->iter_err != DDP_SUCCESS) return;
    r->iter_err = e;
    if (bucket >= 0)
        snprintf(r->err, sizeof r->err, "%.40s of bucket %d: %.700s", what, bucket,
                 ddp_comm_last_error(r->comm));
    else
        snprintf(r->err, sizeof r->err, "%.60s: %.700s", what, ddp_comm_last_error(r->comm));
}

/* compute_bucket_assignment_by_size: walk the parameters in `order` (the predicted or observed
 * ready order), one open bucket per dtype (PyTorch's BucketKey: a bucket holds one type); a
 * bucket closes once it reaches its limit (first_bucket_bytes for a dtype's first bucket,
 * bucket_cap_bytes after), so it may exceed the limit by its last parameter. Buckets are
 * numbered in the order they close, then the ones still open in the order they opened: with
 * one dtype, consecutive runs of `order`. PyTorch's constructor puts its small bucket on the
 * first-defined parameters (reduced last); like its rebuild, we put it on the first-ready ones,
 * so that communication starts as early as possible. No allocation. */
_DDP_PRIVATE void _ddp_reducer_assign(ddp_reducer_t *r, const int32_t *order) {
    int open_id[DDP_NUM_DTYPES], nlim[DDP_NUM_DTYPES], k, nprov = 0, nfinal = 0, b;
    size_t open_bytes[DDP_NUM_DTYPES];
    int *prov = r->work, *final_of = r->work + r->nparams;
    for (k = 0; k < DDP_NUM_DTYPES; k++) { open_id[k] = -1; nlim[k] = 0; open_bytes[k] = 0; }
    for (k = 0; k < r->nparams; k++) final_of[k] = -1;
    for (k = 0; k < r->nparams; k++) {
        const _ddp_rparam_t *p = &r->params[order[k]];
        int d = (int)p->dtype;
        size_t limit = nlim[d] ? r->d.bucket_cap_bytes : r->d.first_bucket_bytes;
        if (open_id[d] < 0) open_id[d] = nprov++;
        prov[order[k]] = open_id[d];
        open_bytes[d] += p->bytes;
        if (open_bytes[d] >= limit) {
            final_of[open_id[d]] = nfinal++;
            open_id[d] = -1;
            open_bytes[d] = 0;
            nlim[d] = 1;
        }
    }
    for (k = 0; k < nprov; k++)
        if (final_of[k] < 0) final_of[k] = nfinal++;
    r->nbuckets = nfinal;
    for (b = 0; b < nfinal; b++) {
        memset(&r->buckets[b], 0, sizeof r->buckets[b]);
    }
    for (k = 0; k < r->nparams; k++) {
        _ddp_rparam_t *p = &r->params[order[k]];
        _ddp_rbucket_t *bk;
        b = final_of[prov[order[k]]];
        bk = &r->buckets[b];
        p->bucket = b;
        p->offset = bk->bytes;
        bk->bytes += p->bytes;
        bk->count += p->count;
        bk->dtype = p->dtype;
        bk->n++;
    }
    for (b = 0, k = 0; b < nfinal; b++) {
        r->buckets[b].first = k;
        k += r->buckets[b].n;
        r->buckets[b].pending = 0;     /* a fill counter for the next loop */
    }
    for (k = 0; k < r->nparams; k++) {   /* within a bucket: in `order` */
        _ddp_rbucket_t *bk = &r->buckets[r->params[order[k]].bucket];
        r->params_of[bk->first + bk->pending++] = order[k];
    }
}

_DDP_PRIVATE int _ddp_reducer_compressed(const ddp_reducer_t *r, const _ddp_rbucket_t *b) {
    return r->d.compression != DDP_COMPRESS_NONE && (b->dtype == DDP_FLOAT32 || b->dtype == DDP_FLOAT64);
}

/* The buckets' memory for the current assignment: one zeroed arena (each bucket 64-byte
 * aligned), plus the 16-bit copies the built-in compression sends. */
_DDP_PRIVATE ddp_result_t _ddp_reducer_alloc(ddp_reducer_t *r) {
    size_t total = 0, halves = 0;
    int b;
    for (b = 0; b < r->nbuckets; b++) {
        total += (r->buckets[b].bytes + _DDP_REDUCER_ALIGN - 1) & ~(size_t)(_DDP_REDUCER_ALIGN - 1);
        if (_ddp_reducer_compressed(r, &r->buckets[b])) halves += (r->buckets[b].count + 31) & ~(size_t)31;
    }
    /* + ALIGN: the allocator promises malloc's alignment only; buckets start on cache lines */
    r->arena = (unsigned char *)ddp_comm_calloc(r->comm, total + _DDP_REDUCER_ALIGN);
    r->half_arena = halves ? (unsigned char *)ddp_comm_calloc(r->comm, halves * 2 + _DDP_REDUCER_ALIGN) : NULL;
    if (!r->arena || (halves && !r->half_arena)) {
        ddp_comm_free(r->comm, r->arena);
        ddp_comm_free(r->comm, r->half_arena);
        r->arena = r->half_arena = NULL;
        r->broken = DDP_ERR_OUT_OF_MEMORY;
        return _ddp_reducer_fail(r, DDP_ERR_OUT_OF_MEMORY, "no memory for the buckets (%zu bytes)", total);
    }
    total = halves = 0;
    for (b = 0; b < r->nbuckets; b++) {
        _ddp_rbucket_t *bk = &r->buckets[b];
        bk->buf = r->arena + (_DDP_REDUCER_ALIGN - (uintptr_t)r->arena % _DDP_REDUCER_ALIGN) + total;
        total += (bk->bytes + _DDP_REDUCER_ALIGN - 1) & ~(size_t)(_DDP_REDUCER_ALIGN - 1);
        bk->half = NULL;
        if (_ddp_reducer_compressed(r, bk)) {
            bk->half = r->half_arena + (_DDP_REDUCER_ALIGN - (uintptr_t)r->half_arena % _DDP_REDUCER_ALIGN) +
                       2 * halves;
            halves += (bk->count + 31) & ~(size_t)31;
        }
    }
    return DDP_SUCCESS;
}

/* Back to "no gradient ready": after finish, and once the buckets exist. */
_DDP_PRIVATE void _ddp_reducer_reset(ddp_reducer_t *r) {
    int k;
    for (k = 0; k < r->nparams; k++) r->params[k].marked = 0;
    for (k = 0; k < r->nbuckets; k++) {
        r->buckets[k].pending = r->buckets[k].n;
        r->buckets[k].req.comm = NULL;
        r->buckets[k].req.id = 0;
    }
    if (r->used) memset(r->used, 0, (size_t)r->nparams);
    r->nready = 0;
    r->next_launch = r->next_collect = 0;
    r->in_iteration = 0;
    r->iter_err = DDP_SUCCESS;
}

_DDP_PRIVATE void _ddp_reducer_log_layout(ddp_reducer_t *r, const char *why) {
    int b;
    _DDP_LOG(r->comm, DDP_LOG_INFO, "reducer: %s: %d parameters in %d buckets (cap %zu bytes, first "
             "%zu)%s%s", why, r->nparams, r->nbuckets, r->d.bucket_cap_bytes, r->d.first_bucket_bytes,
             r->d.gradient_as_bucket_view ? ", gradients as bucket views" : "",
             r->d.find_unused ? ", find_unused" : "");
    for (b = 0; b < r->nbuckets; b++)
        _DDP_LOG(r->comm, DDP_LOG_TRACE, "reducer: bucket %d: %d parameters (first %d), %zu x %s",
                 b, r->buckets[b].n, r->params_of[r->buckets[b].first], r->buckets[b].count,
                 ddp_dtype_name(r->buckets[b].dtype));
}

/* Closes the parameter list: the initial buckets, in reverse registration order. */
_DDP_PRIVATE ddp_result_t _ddp_reducer_close(ddp_reducer_t *r) {
    int k, n = r->nparams;
    ddp_result_t e;
    if (r->broken != DDP_SUCCESS)
        return _ddp_reducer_fail(r, r->broken, "unusable: its buckets could not be allocated");
    if (r->closed) return DDP_SUCCESS;
    if (n == 0) return _ddp_reducer_fail(r, DDP_ERR_INVALID_USAGE, "no parameters: call "
                                         "ddp_reducer_add_param first");
    r->buckets = (_ddp_rbucket_t *)ddp_comm_calloc(r->comm, sizeof *r->buckets * (size_t)n);
    r->params_of = (int *)ddp_comm_calloc(r->comm, sizeof(int) * (size_t)n);
    r->work = (int *)ddp_comm_calloc(r->comm, sizeof(int) * 2 * (size_t)n);
    r->order = (int32_t *)ddp_comm_calloc(r->comm, sizeof(int32_t) * ((size_t)n + 1));
    if (r->d.find_unused) r->used = (unsigned char *)ddp_comm_calloc(r->comm, (size_t)n);
    if (!r->buckets || !r->params_of || !r->work || !r->order || (r->d.find_unused && !r->used)) {
        r->broken = DDP_ERR_OUT_OF_MEMORY;
        return _ddp_reducer_fail(r, DDP_ERR_OUT_OF_MEMORY, "no memory for %d parameters", n);
    }
    for (k = 0; k < n; k++) r->order[1 + k] = n - 1 - k;
    _ddp_reducer_assign(r, r->order + 1);
    if ((e = _ddp_reducer_alloc(r)) != DDP_SUCCESS) return e;
    r->closed = 1;
    _ddp_reducer_reset(r);
    _ddp_reducer_log_layout(r, "built in reverse registration order");
    return DDP_SUCCESS;
}

_DDP_PRIVATE void _ddp_reducer_post(ddp_reducer_t *r, int b, ddp_result_t e);

/* Waits for bucket b's reduction, then finishes it (hook's done, or decompression). */
_DDP_PRIVATE void _ddp_reducer_collect(ddp_reducer_t *r, int b) {
    _ddp_reducer_post(r, b, ddp_wait(&r->buckets[b].req));
}

/* Copy mode without find_unused: a finished bucket's averages go back to the caller's
 * gradients at once, while backward still runs, instead of all of them at finish. (With
 * find_unused, finish must first learn which parameters no rank used.) */
_DDP_PRIVATE void _ddp_reducer_copy_back(ddp_reducer_t *r, int b) {
    const _ddp_rbucket_t *bk = &r->buckets[b];
    int j;
    for (j = 0; j < bk->n; j++) {
        const _ddp_rparam_t *p = &r->params[r->params_of[bk->first + j]];
        if (p->marked) memcpy(p->user, bk->buf + p->offset, p->bytes);
    }
}

/* Copy mode: the bucket gathers its gradients (unmarked ones are the zeros finish wrote). */
_DDP_PRIVATE void _ddp_reducer_copy_in(ddp_reducer_t *r, int b) {
    const _ddp_rbucket_t *bk = &r->buckets[b];
    int j;
    for (j = 0; j < bk->n; j++) {
        const _ddp_rparam_t *p = &r->params[r->params_of[bk->first + j]];
        if (p->marked) memcpy(bk->buf + p->offset, p->user, p->bytes);
    }
}

/* fp16_compress_hook / bf16_compress_hook: divide by the world size before the cast (as they
 * do, so that the sum cannot overflow fp16), sum in 16 bits, cast back. The division happens in
 * the source precision, the cast rounds once. */
_DDP_PRIVATE void _ddp_reducer_compress(ddp_reducer_t *r, const _ddp_rbucket_t *bk) {
    uint16_t *h = (uint16_t *)bk->half;
    int bf = r->d.compression == DDP_COMPRESS_BF16;
    size_t i;
    if (bk->dtype == DDP_FLOAT32) {
        const float *x = (const float *)(const void *)bk->buf;
        float inv = 1.0f / (float)r->world;
        for (i = 0; i < bk->count; i++)
            h[i] = bf ? ddp_float_to_bfloat16(x[i] * inv) : ddp_float_to_half(x[i] * inv);
    } else {
        const double *x = (const double *)(const void *)bk->buf;
        for (i = 0; i < bk->count; i++) {
            float v = (float)(x[i] / r->world);
            h[i] = bf ? ddp_float_to_bfloat16(v) : ddp_float_to_half(v);
        }
    }
}

_DDP_PRIVATE void _ddp_reducer_decompress(ddp_reducer_t *r, const _ddp_rbucket_t *bk) {
    const uint16_t *h = (const uint16_t *)bk->half;
    int bf = r->d.compression == DDP_COMPRESS_BF16;
    size_t i;
    if (bk->dtype == DDP_FLOAT32) {
        float *x = (float *)(void *)bk->buf;
        for (i = 0; i < bk->count; i++) x[i] = bf ? ddp_bfloat16_to_float(h[i]) : ddp_half_to_float(h[i]);
    } else {
        double *x = (double *)(void *)bk->buf;
        for (i = 0; i < bk->count; i++) x[i] = bf ? ddp_bfloat16_to_float(h[i]) : ddp_half_to_float(h[i]);
    }
}

/* Run by the progress thread around bucket b's all-reduce, so that the training thread only
 * marks gradients: copy in and compress before, decompress and copy back after. The caller
 * promises not to touch a gradient between marking it ready and finish (as autograd does not),
 * and the bucket's parameters were all marked (or zeroed by finish) before the launch. */
_DDP_PRIVATE void _ddp_reducer_around(void *arg, int b, int before) {
    ddp_reducer_t *r = (ddp_reducer_t *)arg;
    const _ddp_rbucket_t *bk = &r->buckets[b];
    if (before) {
        if (!r->d.gradient_as_bucket_view) _ddp_reducer_copy_in(r, b);
        if (bk->half) _ddp_reducer_compress(r, bk);
    } else {
        if (bk->half) _ddp_reducer_decompress(r, bk);
        if (!r->d.gradient_as_bucket_view && !r->d.find_unused) _ddp_reducer_copy_back(r, b);
    }
}

/* Collects the oldest buckets whose reductions are done, without waiting. */
_DDP_PRIVATE void _ddp_reducer_poll(ddp_reducer_t *r) {
    while (r->next_collect < r->next_launch) {
        int done = 0, b = r->next_collect;
        ddp_result_t e = ddp_test(&r->buckets[b].req, &done);
        if (!done && e == DDP_SUCCESS) return;
        r->next_collect++;
        _ddp_reducer_post(r, b, e);
    }
}

_DDP_PRIVATE void _ddp_reducer_post(ddp_reducer_t *r, int b, ddp_result_t e) {
    _ddp_rbucket_t *bk = &r->buckets[b];
    if (e != DDP_SUCCESS) { _ddp_reducer_comm_err(r, e, "all-reduce", b); return; }
    if (!r->d.comm_hook) return;     /* the progress thread finished the bucket */
    if (r->d.comm_hook_done) {
        e = r->d.comm_hook_done(r->d.comm_hook_state, r->comm, b, bk->buf, bk->count, bk->dtype);
        if (e != DDP_SUCCESS) _ddp_reducer_comm_err(r, e, "comm_hook_done", b);
    }
    if (!r->d.gradient_as_bucket_view && !r->d.find_unused && r->iter_err == DDP_SUCCESS)
        _ddp_reducer_copy_back(r, b);
}

/* Starts bucket b's reduction (b == next_launch). */
_DDP_PRIVATE void _ddp_reducer_launch(ddp_reducer_t *r, int b) {
    _ddp_rbucket_t *bk = &r->buckets[b];
    ddp_result_t e;
    /* Leave room in the communicator's request ring for the caller's own requests. */
    while (r->next_launch - r->next_collect >= _DDP_REDUCER_MAX_INFLIGHT)
        _ddp_reducer_collect(r, r->next_collect++);
    bk->req.comm = NULL;
    bk->req.id = 0;
    _DDP_LOG(r->comm, DDP_LOG_TRACE, "reducer: launching bucket %d (%zu x %s)", b, bk->count,
             ddp_dtype_name(bk->dtype));
    if (r->d.comm_hook) {   /* the user's code runs on the user's thread */
        if (!r->d.gradient_as_bucket_view) _ddp_reducer_copy_in(r, b);
        e = r->d.comm_hook(r->d.comm_hook_state, r->comm, b, bk->buf, bk->count, bk->dtype, &bk->req);
        if (e != DDP_SUCCESS) _ddp_reducer_comm_err(r, e, "comm_hook", b);
    } else {
        void *data = bk->half ? bk->half : (void *)bk->buf;
        int bf = r->d.compression == DDP_COMPRESS_BF16;
        _ddp_op_t o = _ddp_op_make(_DDP_OP_ALL_REDUCE, data, data, bk->count,
                                   bk->half ? (bf ? DDP_BFLOAT16 : DDP_FLOAT16) : bk->dtype,
                                   bk->half ? DDP_SUM : DDP_AVG, 0);
        o.around = _ddp_reducer_around;
        o.around_arg = r;
        o.around_index = b;
        e = _ddp_async(r->comm, o, "reducer: bucket all-reduce", &bk->req);
        if (e != DDP_SUCCESS) _ddp_reducer_comm_err(r, e, "all-reduce", b);
    }
}

/* mark_bucket_ready: launch every bucket whose turn it is and whose gradients are all ready. */
_DDP_PRIVATE void _ddp_reducer_launch_ready(ddp_reducer_t *r) {
    while (r->next_launch < r->nbuckets && r->buckets[r->next_launch].pending == 0)
        _ddp_reducer_launch(r, r->next_launch++);
    _ddp_reducer_poll(r);
}

DDP_API ddp_result_t ddp_reducer_create(ddp_reducer_t **out, ddp_comm_t *comm,
                                        const ddp_reducer_desc_t *desc) {
    ddp_reducer_t *r;
    ddp_reducer_desc_t d;
    int world;
    if (out) *out = NULL;
    if (!out || !comm) return DDP_ERR_INVALID_ARGUMENT;
    if ((world = ddp_comm_size(comm)) < 1) return DDP_ERR_INVALID_USAGE;   /* destroyed */
    memset(&d, 0, sizeof d);
    if (desc) d = *desc;
    if (!d.bucket_cap_bytes) d.bucket_cap_bytes = DDP_REDUCER_DEFAULT_BUCKET_CAP_BYTES;
    if (!d.first_bucket_bytes) d.first_bucket_bytes = DDP_REDUCER_DEFAULT_FIRST_BUCKET_BYTES;
    if ((unsigned)d.compression > (unsigned)DDP_COMPRESS_BF16)
        return ddp_comm_fail(comm, DDP_ERR_INVALID_ARGUMENT, "reducer_create: compression %d "
                             "(DDP_COMPRESS_NONE, _FP16 or _BF16)", (int)d.compression);
    if (d.compression != DDP_COMPRESS_NONE && d.comm_hook)
        return ddp_comm_fail(comm, DDP_ERR_INVALID_ARGUMENT, "reducer_create: compression and "
                             "comm_hook both set: one communication hook per reducer (as DDP)");
    if (d.comm_hook_done && !d.comm_hook)
        return ddp_comm_fail(comm, DDP_ERR_INVALID_ARGUMENT, "reducer_create: comm_hook_done "
                             "without comm_hook");
    r = (ddp_reducer_t *)ddp_comm_calloc(comm, sizeof *r);
    if (!r) return ddp_comm_fail(comm, DDP_ERR_OUT_OF_MEMORY, "reducer_create");
    r->comm = comm;
    r->d = d;
    r->world = world;
    r->rank = ddp_comm_rank(comm);
    *out = r;
    return DDP_SUCCESS;
}

DDP_API int ddp_reducer_add_param(ddp_reducer_t *r, void *grad, size_t count, ddp_dtype_t dtype) {
    size_t es = ddp_dtype_size(dtype);
    _ddp_rparam_t *p;
    if (!r) return -1;
    if (r->closed) {
        _ddp_reducer_fail(r, DDP_ERR_INVALID_USAGE, "add_param after the parameter list was closed "
                          "(by the first grad/grad_ready/finish): register every parameter first");
        return -1;
    }
    if (!es || !count || count > SIZE_MAX / es || (!grad && !r->d.gradient_as_bucket_view)) {
        _ddp_reducer_fail(r, DDP_ERR_INVALID_ARGUMENT, "add_param #%d: %s", r->nparams,
                          !es ? "invalid dtype" : !count ? "count 0" : count > SIZE_MAX / es ?
                          "count overflows size_t" : "NULL gradient (allowed only with "
                          "gradient_as_bucket_view)");
        return -1;
    }
    if (r->nparams == r->params_cap) {
        int cap = r->params_cap ? 2 * r->params_cap : 64;
        _ddp_rparam_t *np = (_ddp_rparam_t *)ddp_comm_calloc(r->comm, sizeof *np * (size_t)cap);
        if (!np) {
            _ddp_reducer_fail(r, DDP_ERR_OUT_OF_MEMORY, "add_param #%d", r->nparams);
            return -1;
        }
        if (r->nparams) memcpy(np, r->params, sizeof *np * (size_t)r->nparams);
        ddp_comm_free(r->comm, r->params);
        r->params = np;
        r->params_cap = cap;
    }
    p = &r->params[r->nparams];
    p->user = grad;
    p->count = count;
    p->bytes = count * es;
    p->dtype = dtype;
    return r->nparams++;
}

DDP_API ddp_result_t ddp_reducer_grad_ready(ddp_reducer_t *r, int i) {
    _ddp_rparam_t *p;
    _ddp_rbucket_t *bk;
    ddp_result_t e;
    if (!r) return DDP_ERR_INVALID_ARGUMENT;
    if (i < 0 || i >= r->nparams)
        return _ddp_reducer_fail(r, DDP_ERR_INVALID_ARGUMENT, "grad_ready: parameter %d is not "
                                 "one of the %d registered", i, r->nparams);
    if ((e = _ddp_reducer_close(r)) != DDP_SUCCESS) return e;
    if (r->no_sync) return DDP_SUCCESS;     /* the caller keeps accumulating */
    p = &r->params[i];
    if (p->marked)
        return _ddp_reducer_fail(r, DDP_ERR_INVALID_USAGE, "grad_ready: parameter %d marked ready "
                                 "twice in one iteration (PyTorch: \"Expected to mark a variable "
                                 "ready only once\"); call ddp_reducer_finish between iterations", i);
    if (!r->in_iteration) { r->in_iteration = 1; r->finished = 0; }
    p->marked = 1;
    r->order[1 + r->nready++] = i;
    if (r->used) r->used[i] = 1;
    bk = &r->buckets[p->bucket];
    if (--bk->pending == 0) _ddp_reducer_launch_ready(r);
    return r->iter_err;
}

/* After the first synchronised iteration: buckets in the order rank 0's gradients became ready
 * (Reducer::rebuild_buckets + sync_bucket_indices: rank 0's order is broadcast so every rank
 * builds the same buckets). order[0] says whether rank 0 saw every parameter ready; if not,
 * no rebuild this time. */
_DDP_PRIVATE ddp_result_t _ddp_reducer_rebuild(ddp_reducer_t *r) {
    int n = r->nparams, k;
    ddp_result_t e;
    unsigned char **old = NULL, *old_arena = r->arena, *old_half = r->half_arena;
    r->order[0] = r->nready == n;
    e = ddp_broadcast(r->order, r->order, (size_t)n + 1, DDP_INT32, 0, r->comm);
    if (e != DDP_SUCCESS) {
        snprintf(r->err, sizeof r->err, "rebuilding the buckets (broadcast of rank 0's order): %.700s",
                 ddp_comm_last_error(r->comm));
        return e;
    }
    if (!r->order[0]) {
        _DDP_LOG(r->comm, DDP_LOG_INFO, "reducer: not rebuilt: rank 0 did not mark every parameter");
        return DDP_SUCCESS;
    }
    for (k = 0; k < n; k++) r->work[k] = 0;
    for (k = 0; k < n; k++) {
        int32_t q = r->order[1 + k];
        if (q < 0 || q >= n || r->work[q]++)
            return _ddp_reducer_fail(r, DDP_ERR_MISMATCH, "rank 0's gradient order is not a "
                                     "permutation of this rank's %d parameters", n);
    }
    if (r->d.gradient_as_bucket_view) {   /* the views move: keep their values (the result) */
        old = (unsigned char **)ddp_comm_calloc(r->comm, sizeof *old * (size_t)n);
        if (!old) return _ddp_reducer_fail(r, DDP_ERR_OUT_OF_MEMORY, "rebuilding the buckets");
        for (k = 0; k < n; k++) old[k] = r->buckets[r->params[k].bucket].buf + r->params[k].offset;
    }
    _ddp_reducer_assign(r, r->order + 1);
    if ((e = _ddp_reducer_alloc(r)) != DDP_SUCCESS) { ddp_comm_free(r->comm, old); return e; }
    if (old)
        for (k = 0; k < n; k++)
            memcpy(r->buckets[r->params[k].bucket].buf + r->params[k].offset, old[k],
                   r->params[k].bytes);
    ddp_comm_free(r->comm, old);
    ddp_comm_free(r->comm, old_arena);
    ddp_comm_free(r->comm, old_half);
    r->rebuilt = 1;
    _ddp_reducer_log_layout(r, "rebuilt in rank 0's gradient ready order");
    return DDP_SUCCESS;
}

DDP_API ddp_result_t ddp_reducer_finish(ddp_reducer_t *r) {
    ddp_result_t e, usage = DDP_SUCCESS;
    ddp_request_t ureq;
    int k, nmissing = 0;
    char missing[256];
    size_t mlen = 0;
    if (!r) return DDP_ERR_INVALID_ARGUMENT;
    if ((e = _ddp_reducer_close(r)) != DDP_SUCCESS) return e;
    if (r->no_sync) return DDP_SUCCESS;
    if (r->finished)
        return _ddp_reducer_fail(r, DDP_ERR_INVALID_USAGE, "finish called twice: no gradient was "
                                 "marked ready since the last finish");
    /* Parameters nobody marked: zeros in the bucket (as mark_variable_ready_dense does for an
     * undefined grad), so that every bucket is reduced and no rank waits for this one. */
    missing[0] = 0;
    for (k = 0; k < r->nparams; k++) {
        _ddp_rparam_t *p = &r->params[k];
        _ddp_rbucket_t *bk;
        if (p->marked) continue;
        bk = &r->buckets[p->bucket];
        memset(bk->buf + p->offset, 0, p->bytes);
        bk->pending--;
        if (nmissing++ < 16 && mlen < sizeof missing - 16)
            mlen += (size_t)snprintf(missing + mlen, sizeof missing - mlen, "%s%d", mlen ? ", " : "", k);
    }
    if (nmissing && !r->d.find_unused)
        usage = DDP_ERR_INVALID_USAGE;
    _ddp_reducer_launch_ready(r);
    ureq.comm = NULL;
    ureq.id = 0;
    if (r->used) {   /* all_reduce_local_used_map: which parameters any rank used */
        e = ddp_all_reduce_async(r->used, r->used, (size_t)r->nparams, DDP_UINT8, DDP_MAX, r->comm, &ureq);
        if (e != DDP_SUCCESS) _ddp_reducer_comm_err(r, e, "all-reduce of the used-parameter map", -1);
    }
    while (r->next_collect < r->next_launch) _ddp_reducer_collect(r, r->next_collect++);
    if ((e = ddp_wait(&ureq)) != DDP_SUCCESS)
        _ddp_reducer_comm_err(r, e, "all-reduce of the used-parameter map", -1);
    if (!r->d.gradient_as_bucket_view && r->d.find_unused && r->iter_err == DDP_SUCCESS) {
        for (k = 0; k < r->nparams; k++) {
            const _ddp_rparam_t *p = &r->params[k];
            /* unmarked: an error without find_unused; globally unused: left untouched */
            if (!p->marked && (!r->used || !r->used[k])) continue;
            memcpy(p->user, r->buckets[p->bucket].buf + p->offset, p->bytes);
        }
    }
    r->iterations++;
    e = r->iter_err;
    if (!r->rebuilt && !r->d.find_unused && e == DDP_SUCCESS) e = _ddp_reducer_rebuild(r);
    _ddp_reducer_reset(r);
    r->finished = 1;
    if (e != DDP_SUCCESS) return e;   /* r->err and the communicator say what failed */
    if (usage != DDP_SUCCESS)
        return _ddp_reducer_fail(r, usage, "finish: parameter(s) %s%s (%d of %d) were never marked "
                                 "ready in this iteration on rank %d (reduced as zeros, so that no "
                                 "rank hangs). Mark every gradient ready, or "
                                 "create the reducer with find_unused = 1 (PyTorch: "
                                 "find_unused_parameters=True)", missing, nmissing > 16 ? ", ..." : "",
                                 nmissing, r->nparams, r->rank);
    r->err[0] = 0;
    return DDP_SUCCESS;
}

DDP_API ddp_result_t ddp_reducer_set_no_sync(ddp_reducer_t *r, int no_sync) {
    if (!r) return DDP_ERR_INVALID_ARGUMENT;
    if (r->in_iteration && !r->no_sync)
        return _ddp_reducer_fail(r, DDP_ERR_INVALID_USAGE, "set_no_sync in the middle of an "
                                 "iteration (%d gradients marked ready): call it before backward",
                                 r->nready);
    r->no_sync = no_sync != 0;
    return DDP_SUCCESS;
}

DDP_API ddp_result_t ddp_reducer_destroy(ddp_reducer_t *r) {
    ddp_comm_t *c;
    if (!r) return DDP_ERR_INVALID_ARGUMENT;
    c = r->comm;
    if (ddp_comm_size(c) < 1) return DDP_ERR_INVALID_USAGE;   /* its communicator is gone */
    /* Buckets in flight belong to the progress thread until they complete. */
    if (r->closed) while (r->next_collect < r->next_launch) _ddp_reducer_collect(r, r->next_collect++);
    ddp_comm_free(c, r->params);
    ddp_comm_free(c, r->buckets);
    ddp_comm_free(c, r->params_of);
    ddp_comm_free(c, r->work);
    ddp_comm_free(c, r->order);
    ddp_comm_free(c, r->used);
    ddp_comm_free(c, r->arena);
    ddp_comm_free(c, r->half_arena);
    ddp_comm_free(c, r);
    return DDP_SUCCESS;
}

DDP_API void *ddp_reducer_grad(ddp_reducer_t *r, int i) {
    if (!r || i < 0 || i >= r->nparams) return NULL;
    if (!r->d.gradient_as_bucket_view) return r->params[i].user;
    if (_ddp_reducer_close(r) != DDP_SUCCESS) return NULL;
    return r->buckets[r->params[i].bucket].buf + r->params[i].offset;
}

DDP_API int ddp_reducer_num_buckets(ddp_reducer_t *r) {
    if (!r || _ddp_reducer_close(r) != DDP_SUCCESS) return -1;
    return r->nbuckets;
}

DDP_API int ddp_reducer_bucket_info(ddp_reducer_t *r, int b, int *params, int cap, size_t *bytes,
                                    ddp_dtype_t *dtype) {
    int k;
    if (!r || _ddp_reducer_close(r) != DDP_SUCCESS || b < 0 || b >= r->nbuckets) return -1;
    for (k = 0; params && k < cap && k < r->buckets[b].n; k++)
        params[k] = r->params_of[r->buckets[b].first + k];
    if (bytes) *bytes = r->buckets[b].bytes;
    if (dtype) *dtype = r->buckets[b].dtype;
    return r->buckets[b].n;
}

DDP_API int ddp_reducer_rebuilt(const ddp_reducer_t *r) { return r ? r->rebuilt : 0; }
DDP_API const char *ddp_reducer_last_error(const ddp_reducer_t *r) { return r ? r->err : "NULL reducer"; }

/* DDP's _sync_module_states: consecutive parameters of one dtype travel together through a
 * staging buffer of up to 4 MiB (one broadcast instead of many small ones); larger ones
 * directly. The grouping depends only on counts and dtypes, so it is the same on every rank. */
DDP_API ddp_result_t ddp_broadcast_params(ddp_comm_t *comm, void *const *params, const size_t *counts,
                                          const ddp_dtype_t *dtypes, int nparams, int root) {
    const size_t cap = (size_t)4 << 20;
    unsigned char *stage = NULL;
    ddp_result_t e = DDP_SUCCESS;
    int i, j, me;
    if (!comm) return DDP_ERR_INVALID_ARGUMENT;
    if ((me = ddp_comm_rank(comm)) < 0) return DDP_ERR_INVALID_USAGE;
    if (nparams < 0 || (nparams && (!params || !counts || !dtypes)))
        return ddp_comm_fail(comm, DDP_ERR_INVALID_ARGUMENT, "broadcast_params: %s", nparams < 0 ?
                             "nparams < 0" : "NULL params, counts or dtypes");
    for (i = 0; i < nparams; i++) {
        size_t es = ddp_dtype_size(dtypes[i]);
        if (!es || counts[i] > SIZE_MAX / es || (counts[i] && !params[i]))
            return ddp_comm_fail(comm, DDP_ERR_INVALID_ARGUMENT, "broadcast_params: parameter %d: %s",
                                 i, !es ? "invalid dtype" : counts[i] && !params[i] ? "NULL buffer" :
                                 "count overflows size_t");
    }
    for (i = 0; i < nparams && e == DDP_SUCCESS; i = j) {
        size_t es = ddp_dtype_size(dtypes[i]), total = counts[i] * es, off;
        int k;
        j = i + 1;
        if (total < cap / 2)
            while (j < nparams && dtypes[j] == dtypes[i] && counts[j] * es < cap / 2 &&
                   total + counts[j] * es <= cap)
                total += counts[j++] * es;
        if (j == i + 1) {
            e = ddp_broadcast(params[i], params[i], counts[i], dtypes[i], root, comm);
            continue;
        }
        if (!stage && !(stage = (unsigned char *)ddp_comm_calloc(comm, cap)))
            return ddp_comm_fail(comm, DDP_ERR_OUT_OF_MEMORY, "broadcast_params: staging buffer");
        if (me == root)
            for (off = 0, k = i; k < j; off += counts[k] * es, k++)
                if (counts[k]) memcpy(stage + off, params[k], counts[k] * es);
        e = ddp_broadcast(stage, stage, total / es, dtypes[i], root, comm);
        if (e == DDP_SUCCESS && me != root)
            for (off = 0, k = i; k < j; off += counts[k] * es, k++)
                if (counts[k]) memcpy(params[k], stage + off, counts[k] * es);
    }
    ddp_comm_free(comm, stage);
    return e;
}

/* Now that the communicator's internals are defined, build the ring algorithms. */
#include "ddp_ring.h"

#endif /* DDP_IMPLEMENTATION */
