/* ddp_reducer.h — libddp's gradient bucket reducer (PyTorch DistributedDataParallel's Reducer)
 * and ddp_broadcast_params (DDP's broadcast of the initial model state).
 *
 * Built on the communicator's public calls only (async all-reduce with progress-thread hooks,
 * test/wait, broadcast); see the rules below. Users include ddp.h, which includes this.
 * Depends on ddp_comm.h. Built by DDP_IMPLEMENTATION (or DDP_REDUCER_IMPLEMENTATION).
 */
#if defined(DDP_IMPLEMENTATION) && !defined(DDP_REDUCER_IMPLEMENTATION)
#define DDP_REDUCER_IMPLEMENTATION
#endif
#if defined(DDP_REDUCER_IMPLEMENTATION)
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
#ifndef DDP_RING_IMPLEMENTATION
#define DDP_RING_IMPLEMENTATION
#endif
#ifndef DDP_COMM_IMPLEMENTATION
#define DDP_COMM_IMPLEMENTATION
#endif
#endif
#include "ddp_comm.h"

#ifndef DDP_REDUCER_H_INCLUDED
#define DDP_REDUCER_H_INCLUDED

#ifdef __cplusplus
extern "C" {
#endif

/* Overlaps the gradient all-reduce with the backward pass. Register each parameter's gradient
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
 *   - Device (GPU) gradients, with transports/ddp_nccl.h: registered gradients in device
 *     memory (or on_device = 1, for views) put the buckets in device memory; the copies in and
 *     out and the all-reduces are enqueued on the communicator's CUDA stream in bucket order,
 *     and finish enqueues the rest and returns (NCCL semantics: the averages are in the
 *     gradients when that stream gets there; work enqueued after finish on it sees them).
 *     Built-in compression on device buffers is DDP_ERR_UNSUPPORTED (it needs kernels).
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
    int on_device;                 /* 1: gradients/buckets in device memory (0: found from them) */
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

#ifdef __cplusplus
}
#endif
#endif /* DDP_REDUCER_H_INCLUDED */

/* ============================================================================================
 * IMPLEMENTATION
 * ========================================================================================== */
#if defined(DDP_REDUCER_IMPLEMENTATION) && !defined(DDP_REDUCER_IMPL_INCLUDED)
#define DDP_REDUCER_IMPL_INCLUDED
#ifndef DDP_COMM_IMPL_INCLUDED
#error "libddp: ddp_reducer.h's implementation needs ddp_comm.h's (define DDP_IMPLEMENTATION)"
#endif

/* PyTorch DDP's Reducer (torch/csrc/distributed/c10d/reducer.cpp; Li et al., "PyTorch
 * Distributed: Experiences on Accelerating Data Parallel Training", VLDB 2020, section 3.2.3
 * "Gradient bucketing" and 3.2.4 "Overlap computation with communication"), built on the public
 * async collectives only: a bucket is one ddp_all_reduce_async_hooked, which the communicator's
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
    struct ddp_reducer *owner;     /* for the progress thread's hooks */
    int index;
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
    ddp_result_t iter_err;         /* first communication failure of this iteration */
    int dev;                       /* buckets in device memory: stream-ordered copies */
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

_DDP_PRIVATE void _ddp_reducer_free_arena(ddp_reducer_t *r, void *arena) {
    if (!arena) return;
    if (r->dev) ddp_comm_device_free(r->comm, arena);   /* after the device work using it */
    else ddp_comm_free(r->comm, arena);
}

/* One gradient's bytes from src to dst: memcpy, or a copy on the communicator's stream. */
_DDP_PRIVATE void _ddp_reducer_move(ddp_reducer_t *r, void *dst, const void *src, size_t bytes) {
    if (!r->dev) { memcpy(dst, src, bytes); return; }
    if (ddp_comm_device_copy(r->comm, dst, src, bytes) != DDP_SUCCESS && r->iter_err == DDP_SUCCESS) {
        r->iter_err = DDP_ERR_SYSTEM;
        snprintf(r->err, sizeof r->err, "device copy: %.700s", ddp_comm_last_error(r->comm));
    }
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
    if (r->dev) {
        void *a = NULL;
        if (ddp_comm_device_alloc(r->comm, total + _DDP_REDUCER_ALIGN, &a) == DDP_SUCCESS &&
            ddp_comm_device_zero(r->comm, a, total + _DDP_REDUCER_ALIGN) != DDP_SUCCESS) {
            ddp_comm_device_free(r->comm, a);
            a = NULL;
        }
        r->arena = (unsigned char *)a;
        r->half_arena = NULL;
    } else {
        r->arena = (unsigned char *)ddp_comm_calloc(r->comm, total + _DDP_REDUCER_ALIGN);
        r->half_arena = halves ? (unsigned char *)ddp_comm_calloc(r->comm, halves * 2 + _DDP_REDUCER_ALIGN) : NULL;
    }
    if (!r->arena || (halves && !r->half_arena)) {
        _ddp_reducer_free_arena(r, r->arena);
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
    ddp_comm_log(r->comm, DDP_LOG_INFO, "reducer: %s: %d parameters in %d buckets (cap %zu bytes, first "
             "%zu)%s%s", why, r->nparams, r->nbuckets, r->d.bucket_cap_bytes, r->d.first_bucket_bytes,
             r->d.gradient_as_bucket_view ? ", gradients as bucket views" : "",
             r->d.find_unused ? ", find_unused" : "");
    for (b = 0; b < r->nbuckets; b++)
        ddp_comm_log(r->comm, DDP_LOG_TRACE, "reducer: bucket %d: %d parameters (first %d), %zu x %s",
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
    {   /* device gradients: all of them (or views asked for with on_device) */
        int ndev = 0, nuser = 0;
        for (k = 0; k < n; k++)
            if (r->params[k].user) { nuser++; ndev += ddp_comm_is_device(r->comm, r->params[k].user); }
        if (ndev && ndev != nuser)
            return _ddp_reducer_fail(r, DDP_ERR_INVALID_ARGUMENT, "%d of the %d gradients are device "
                                     "memory and the others host memory: one or the other", ndev, nuser);
        r->dev = ndev > 0 || r->d.on_device;
        if (r->dev && !ddp_comm_device_enabled(r->comm, NULL, 0))
            return _ddp_reducer_fail(r, DDP_ERR_UNSUPPORTED, "device gradients, but the communicator "
                                     "cannot use NCCL: %.600s", ddp_comm_last_error(r->comm));
        if (r->dev && r->d.compression != DDP_COMPRESS_NONE)
            return _ddp_reducer_fail(r, DDP_ERR_UNSUPPORTED, "built-in fp16/bf16 compression on "
                                     "device gradients (it needs CUDA kernels): use a comm_hook");
    }
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
    if (r->dev) {   /* stream-ordered: nothing to wait for on the host; a failure is sticky */
        ddp_result_t e = DDP_SUCCESS;
        ddp_comm_get_async_error(r->comm, &e);
        r->buckets[b].req.comm = NULL;
        r->buckets[b].req.id = 0;
        _ddp_reducer_post(r, b, e);
        return;
    }
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
        if (p->marked) _ddp_reducer_move(r, p->user, bk->buf + p->offset, p->bytes);
    }
}

/* Copy mode: the bucket gathers its gradients (unmarked ones are the zeros finish wrote). */
_DDP_PRIVATE void _ddp_reducer_copy_in(ddp_reducer_t *r, int b) {
    const _ddp_rbucket_t *bk = &r->buckets[b];
    int j;
    for (j = 0; j < bk->n; j++) {
        const _ddp_rparam_t *p = &r->params[r->params_of[bk->first + j]];
        if (p->marked) _ddp_reducer_move(r, bk->buf + p->offset, p->user, p->bytes);
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
_DDP_PRIVATE void _ddp_reducer_before(void *arg) {
    const _ddp_rbucket_t *bk = (const _ddp_rbucket_t *)arg;
    ddp_reducer_t *r = bk->owner;
    if (!r->d.gradient_as_bucket_view) _ddp_reducer_copy_in(r, bk->index);
    if (bk->half) _ddp_reducer_compress(r, bk);
}
_DDP_PRIVATE void _ddp_reducer_after(void *arg) {
    const _ddp_rbucket_t *bk = (const _ddp_rbucket_t *)arg;
    ddp_reducer_t *r = bk->owner;
    if (bk->half) _ddp_reducer_decompress(r, bk);
    if (!r->d.gradient_as_bucket_view && !r->d.find_unused) _ddp_reducer_copy_back(r, bk->index);
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
    ddp_comm_log(r->comm, DDP_LOG_TRACE, "reducer: launching bucket %d (%zu x %s)", b, bk->count,
             ddp_dtype_name(bk->dtype));
    if (r->d.comm_hook) {   /* the user's code runs on the user's thread */
        if (!r->d.gradient_as_bucket_view) _ddp_reducer_copy_in(r, b);
        e = r->d.comm_hook(r->d.comm_hook_state, r->comm, b, bk->buf, bk->count, bk->dtype, &bk->req);
        if (e != DDP_SUCCESS) _ddp_reducer_comm_err(r, e, "comm_hook", b);
    } else if (r->dev) {   /* stream order does what the hooks do on the host */
        if (!r->d.gradient_as_bucket_view) _ddp_reducer_copy_in(r, b);
        e = ddp_all_reduce_async(bk->buf, bk->buf, bk->count, bk->dtype, DDP_AVG, r->comm, &bk->req);
        if (e != DDP_SUCCESS) _ddp_reducer_comm_err(r, e, "all-reduce", b);
        else if (!r->d.gradient_as_bucket_view && !r->d.find_unused) _ddp_reducer_copy_back(r, b);
    } else {
        void *data = bk->half ? bk->half : (void *)bk->buf;
        int bf = r->d.compression == DDP_COMPRESS_BF16;
        ddp_async_hooks_t hooks;
        bk->owner = r;
        bk->index = b;
        hooks.before = _ddp_reducer_before;
        hooks.after = _ddp_reducer_after;
        hooks.arg = bk;
        e = ddp_all_reduce_async_hooked(data, data, bk->count,
                                        bk->half ? (bf ? DDP_BFLOAT16 : DDP_FLOAT16) : bk->dtype,
                                        bk->half ? DDP_SUM : DDP_AVG, r->comm, &hooks, &bk->req);
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
        ddp_comm_log(r->comm, DDP_LOG_INFO, "reducer: not rebuilt: rank 0 did not mark every parameter");
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
            _ddp_reducer_move(r, r->buckets[r->params[k].bucket].buf + r->params[k].offset, old[k],
                              r->params[k].bytes);
    ddp_comm_free(r->comm, old);
    _ddp_reducer_free_arena(r, old_arena);
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
        if (r->dev) ddp_comm_device_zero(r->comm, bk->buf + p->offset, p->bytes);
        else memset(bk->buf + p->offset, 0, p->bytes);
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
            _ddp_reducer_move(r, p->user, r->buckets[p->bucket].buf + p->offset, p->bytes);
        }
    }

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
    _ddp_reducer_free_arena(r, r->arena);
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
 * staging buffer of up to 4 MiB (one broadcast instead of many small ones); larger ones and
 * device ones (enqueued on the communicator's stream, NCCL semantics) directly. The grouping depends only on counts and dtypes, so it is the same on every rank. */
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
        /* device parameters go one by one, straight to NCCL (the staging buffer is host memory) */
        if (total < cap / 2 && !ddp_comm_is_device(comm, params[i]))
            while (j < nparams && dtypes[j] == dtypes[i] && counts[j] * es < cap / 2 &&
                   total + counts[j] * es <= cap && !ddp_comm_is_device(comm, params[j]))
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

#endif /* DDP_REDUCER_IMPLEMENTATION */
