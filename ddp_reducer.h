/* SPDX-License-Identifier: MIT (see LICENSE) */
/* ddp_reducer.h — libddp's gradient bucket reducer (PyTorch DistributedDataParallel's Reducer),
 * its flat-buffer mode and ZeRO-1 (ZeroRedundancyOptimizer: reduce-scatter, shard, all-gather),
 * and ddp_broadcast_params (DDP's broadcast of the initial model state).
 *
 * Built on the communicator's public calls (async all-reduce with progress-thread hooks,
 * test/wait, broadcast) plus one declared layer interface of ddp_comm.h,
 * _ddp_all_reduce_async_part: a flat buffer's bucket all-reduced as a part of the whole, so the
 * flat reducer matches one all-reduce of the flat buffer bit for bit (no public call can ask
 * for that). See the rules below. Users include ddp.h, which includes this.
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
#ifndef DDP_WINDOW_IMPLEMENTATION
#define DDP_WINDOW_IMPLEMENTATION
#endif
#endif
#include "ddp_window.h"

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
 *     at finish after that request completed (PyTorch's future.then: e.g. decompress), in
 *     bucket order, at the same point of the issue order on every rank, so it may issue
 *     collectives on comm (the buckets' averages reach the gradients only then in copy mode).
 *     ddp_reducer_bucket_info and ddp_reducer_param_info say which parameters a bucket holds
 *     and where each starts in it (ddp_powersgd.h works on whole tensors with them).
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
 *     requests at once (it waits for the oldest bucket beyond that), the rest are the caller's.
 *
 * FLAT-BUFFER TRAINERS (llm.c style: every gradient in one buffer). Set desc.flat_grads and
 * desc.flat_bytes to that buffer and register each parameter's gradient as its slice (add_param
 * with a pointer inside it, as before): the buckets are then views of the buffer itself, so
 * there is no bucket memory, no copy, and ddp_reducer_grad(r, i) is the slice. A bucket is a
 * contiguous range of registered slices, cut from the end of the buffer down (the first one up
 * to first_bucket_bytes, then bucket_cap_bytes, whole parameters, as DDP): register in forward
 * order with the buffer laid out in that order (llm.c's is) and the buckets follow backward.
 * Slices must lie inside the buffer, share one dtype and not overlap (else add_param refuses
 * with DDP_ERR_INVALID_ARGUMENT, named by ddp_reducer_last_error); memory between slices is
 * never touched (a bucket never spans it). No rebuild: memory cannot be reordered, and bucket
 * order only matters for overlap. find_unused: an unmarked slice is zeroed in place before its
 * bucket is reduced (as with gradient_as_bucket_view), so it ends with the average of the
 * ranks that used it, zero if none did. no_sync, comm hooks, compression and device buffers
 * (a device flat buffer) work as above.
 *
 * ZeRO-1 (desc.zero_stage = 1, flat mode only; llm.c's multi-GPU path, PyTorch's
 * ZeroRedundancyOptimizer): each bucket is reduce-scattered (DDP_AVG) instead of all-reduced,
 * still launched from grad_ready while backward runs. After finish each rank holds the average
 * of ITS shard only (the rest of the gradient buffer is unspecified); it updates its shard of
 * the parameters, keeping optimizer state for the shard only (1/world of it), then
 * ddp_reducer_all_gather_params makes every rank's parameter buffer whole again. A shard is one
 * block per bucket: bucket boundaries are moved down to multiples of the world size from the
 * start of each contiguous run of slices, so every bucket splits into world equal blocks in
 * place (NCCL's reduce-scatter layout, no padding of the user's buffers); the last n mod world
 * elements of a run (its tail) go through a scratch of world elements, one element to each of
 * the first ranks. Loop over the shards (ddp_reducer_num_shards, ddp_reducer_shard); the shards
 * cover every registered element exactly once across the ranks. Not with comm_hook or
 * compression. zero_stage = 0 in flat mode: the shards are the buckets (every rank owns
 * everything) and all_gather_params does nothing, so one optimizer loop serves both.
 *
 * ELASTIC (desc.elastic = 1: training goes on when a rank dies, and ranks may join). finish
 * ends with a commit round, a one-int MIN all-reduce of "my gradient exchange completed", and
 * returns success (apply the step) only when that round agreed on it. A round completes at a
 * rank only after every rank contributed, so one rank's commit proves that every rank, the dead
 * one included, held the complete average; a rank whose commit round failed may still hold
 * it. After ddp_comm_shrink, ddp_reducer_rebind(r, newcomm, &apply) exchanges the survivors'
 * (last committed step, last completed exchange) over newcomm, so all end on the same step:
 * apply = 1 on a rank that lacks a step another survivor committed ("your gradients hold that
 * step's average: apply it"), 0 everywhere else (redo the batch whose finish failed). From then
 * on the reducer averages over newcomm. The loop (docs/elastic_training.md has the whole one):
 *
 *     while (done < nsteps) {                     // nsteps = ddp_sampler_num_steps(&smp, batch)
 *         forward_backward(next_batch(&smp));      // marks gradients ready
 *         if (ddp_reducer_finish(red) != DDP_SUCCESS) {   // a rank died: not committed here
 *             if (ddp_comm_shrink(comm, NULL, &nc) != DDP_SUCCESS) fail();
 *             ddp_comm_destroy(comm);              // before rebind (see below)
 *             comm = nc;
 *             if (ddp_reducer_rebind(red, comm, &apply) != DDP_SUCCESS) fail();
 *             ddp_sampler_consumed_after(&smp, done + apply, batch, &pos);   // the rest of
 *             ddp_sampler_reshard(&smp, ddp_comm_size(comm), ddp_comm_rank(comm), pos);  // the epoch
 *             nsteps = ddp_sampler_num_steps(&smp, batch), done = 0;
 *             if (!apply) continue;                // redo: a batch of the re-sharded epoch
 *         } else done++;
 *         optimizer_step();                        // the gradients hold the average
 *     }
 *
 *   - Do not touch the gradients between a failed finish and rebind: with apply = 1 they hold
 *     the step to apply. rebind never waits on the old communicator (its requests failed);
 *     destroy it first (its progress thread may run a bucket's copies until then). newcomm
 *     must use the old one's allocator (shrink and split keep it): the reducer's memory moves
 *     with it. ddp_reducer_committed_steps is then the same on every survivor.
 *   - rebind also checks that every rank registered the same parameters (counts, dtypes, flat
 *     offsets) with the same settings (DDP_ERR_MISMATCH on every rank, naming the first rank
 *     and parameter that differ), and makes every rank take the bucket layout (and the
 *     "rebuilt" state) of the first rank that has run a step: the one-time rebuild is a
 *     broadcast inside finish, and a rank that died in it may leave the survivors with
 *     different layouts, which would pair different buckets. no_sync steps have no commit round.
 *
 * GROW (ranks join: ddp_comm_grow returns a communicator with the members at ranks 0 .. m-1,
 * the joiners after them). At a step boundary (the last finish succeeded), every rank of the
 * grown communicator calls ddp_reducer_rebind(r, grown, &apply) once: a member with its
 * reducer, a joiner with a FRESH one (created on the grown communicator, same desc, the same
 * add_param calls in the same order: the same program; no finish yet, which is how rebind
 * knows it is fresh). Afterwards apply = 0 everywhere, ddp_reducer_committed_steps is the
 * members' on every rank, the buckets are the members' (a joiner takes their rebuilt layout
 * and does not rebuild again) and every average divides by the new size. The joiner's model
 * and optimizer state come from the members (the reducer holds none); its sampler from their
 * position (ddp_sampler_position_after, ddp_sampler_resume). A fresh reducer beside members
 * whose last step failed on some (a shrink and a grow at once) works too: the members get
 * their usual apply, the joiner none (take its state after the members applied theirs).
 *   - ddp_reducer_joiners_waiting(r), after a finish that committed: how many joiners wait to
 *     be admitted, the MAX over the ranks, agreed in the same commit round, so every rank
 *     decides alike whether to grow at this boundary, without another collective: the round's
 *     one int is ok * 2^30 + (2^30 - 1 - waiting), whose MIN is the AND of the oks and, when
 *     all are ok, the largest count (counts clamped to [0, 2^30 - 1]). A rank's count comes
 *     from its communicator (ddp_comm_joiners_waiting: it never blocks).
 *
 *   - Flat mode: the buckets are ranges of the flat buffer, independent of the world size;
 *     nothing moves. Not with zero_stage = 1 (refused at create): a rank's shards are cut for
 *     the world size, so a shrink loses the dead rank's shard of the optimizer state (and of
 *     the parameters, if it died in all_gather_params) and a grow would re-cut every shard
 *     (each rank's optimizer state would have to move); restart from a checkpoint. Nor with
 *     device gradients (finish returns before the exchange completes, so it has nothing to
 *     commit: refused when the list closes).
 *   - Without elastic nothing changes: no commit round, no extra collective. */
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
    void *flat_grads;              /* flat mode: the trainer's gradient buffer; slices are views */
    size_t flat_bytes;             /* its size (its dtype is the slices') */
    int zero_stage;                /* 1: ZeRO-1, reduce-scatter per bucket (flat mode only) */
    int elastic;                   /* 1: commit round in finish; ddp_reducer_rebind after a shrink */
    /* 1: the buckets (copy mode) in registered memory (ddp_comm_mem_alloc), which shared-memory
     * all-reduces read in place; -1: ordinary memory; 0: DDP_REDUCER_REGISTERED (default 0).
     * Not with elastic or device buckets. Flat mode: allocate flat_grads itself with
     * ddp_comm_mem_alloc for the same gain. */
    int registered;
} ddp_reducer_desc_t;
#define DDP_REDUCER_DEFAULT_BUCKET_CAP_BYTES ((size_t)25 << 20)
#define DDP_REDUCER_DEFAULT_FIRST_BUCKET_BYTES ((size_t)1 << 20)
DDP_API ddp_result_t ddp_reducer_create(ddp_reducer_t **r, ddp_comm_t *comm,
                                        const ddp_reducer_desc_t *desc);
/* In forward (model definition) order; returns the parameter's index (from 0), or -1 (bad
 * arguments, out of memory, or the list is closed). grad may be NULL with gradient_as_bucket_view.
 * Flat mode: grad is the parameter's slice of flat_grads. */
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
/* Parameter i: *count its elements (at once); *bucket the (first) bucket holding it and
 * *offset_in_bucket where it starts there, in bytes, once the parameter list is closed (-1 and 0
 * while it is open: this call does not close it). A comm hook that works on whole tensors
 * (ddp_powersgd.h) finds them in its bucket with it. Any pointer may be NULL. */
DDP_API ddp_result_t ddp_reducer_param_info(ddp_reducer_t *r, int param, int *bucket,
                                            size_t *offset_in_bucket, size_t *count);
DDP_API int ddp_reducer_rebuilt(const ddp_reducer_t *r);   /* 1 once the buckets were rebuilt */
/* Flat mode: this rank's shards, in bucket order; -1 on bad arguments or without flat_grads.
 * *elems (may be NULL): their total, the elements of optimizer state the rank needs. */
DDP_API int ddp_reducer_num_shards(ddp_reducer_t *r, size_t *elems);
/* Shard k: elements [*offset, *offset + *count) of the flat buffers (gradients, parameters,
 * anything laid out like them), and [*state, *state + *count) of the rank's packed optimizer
 * state. Any pointer may be NULL. */
DDP_API ddp_result_t ddp_reducer_shard(ddp_reducer_t *r, int k, size_t *offset, size_t *count,
                                       size_t *state);
/* ZeRO-1, after finish and the shard update: every rank's flat_params (laid out like the
 * gradients, element for element; any dtype) gets every rank's shards (all-gather per bucket,
 * in place). Host buffers: done on return; device: enqueued (NCCL semantics). Without
 * zero_stage or with one rank: nothing to do. Not during an iteration (DDP_ERR_INVALID_USAGE). */
DDP_API ddp_result_t ddp_reducer_all_gather_params(ddp_reducer_t *r, void *flat_params,
                                                   ddp_dtype_t dtype);
DDP_API const char *ddp_reducer_last_error(const ddp_reducer_t *r);   /* "" when none */
/* Elastic: after ddp_comm_shrink (the old communicator destroyed) or a grow, collective over
 * newcomm (every rank, a joiner's fresh reducer too): the reducer moves there (averages over its
 * size, no request of the old one waited for, the failed step's state dropped, the bucket
 * layout of the first rank that ran a step) and *apply_pending says what to do with the step
 * that failed (see ELASTIC and GROW above). DDP_ERR_MISMATCH on every rank if their states
 * cannot be reconciled or their parameter lists or settings differ (naming the rank, and the
 * parameter); a failure of newcomm leaves the reducer bound to it: shrink again, rebind again. */
DDP_API ddp_result_t ddp_reducer_rebind(ddp_reducer_t *r, ddp_comm_t *newcomm, int *apply_pending);
/* Synchronised steps applied everywhere so far: elastic, those committed (after rebind: the
 * survivors' common count); else those whose finish succeeded. -1 for NULL. (The sampler's
 * position is ddp_sampler_consumed_after's: a short last batch and a re-shard's uneven shares
 * make steps times the global batch wrong.) */
DDP_API int64_t ddp_reducer_committed_steps(const ddp_reducer_t *r);
/* Elastic, after a finish that committed: how many joiners wait to be admitted, the MAX of
 * the ranks' counts agreed in the commit round (no extra collective), so the same on every
 * rank: grow the communicator when it is > 0, and every rank decides alike. 0 after a finish
 * that did not commit, after a no_sync finish (not a step boundary), after rebind, and
 * without elastic; -1 for NULL. */
DDP_API int ddp_reducer_joiners_waiting(const ddp_reducer_t *r);
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
    int bucket, nb;                /* its buckets: [bucket, bucket + nb) (nb > 1: flat mode only) */
    size_t offset;                 /* where in its bucket (bytes; not used in flat mode) */
    size_t off;                    /* flat mode: its first element in the flat buffer */
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
    size_t lo;                     /* flat mode: its first element in the flat buffer */
    int tail;                      /* ZeRO-1: fewer elements than ranks, through scratch */
    unsigned char *scratch;        /* ZeRO-1 tail: world elements of up to 8 bytes */
} _ddp_rbucket_t;

typedef struct { size_t off, count, state; } _ddp_rshard_t;

struct ddp_reducer {
    ddp_comm_t *comm;
    ddp_reducer_desc_t d;
    int world, rank;
    _ddp_rparam_t *params;
    int nparams, params_cap;
    int closed;                    /* buckets laid out: add_param refused from then on */
    ddp_result_t broken;           /* an allocation failed at close or rebuild */
    _ddp_rbucket_t *buckets;       /* nparams slots (a bucket has >= 1 parameter); flat: 2 nparams */
    int nbuckets;
    int *params_of;                /* parameter indices grouped by bucket (flat: 3 nparams slots, a
                                    * parameter straddling buckets is in each) */
    int *work;                     /* 2 * nparams: scratch of the bucket assignment */
    int32_t *order;                /* 1 + nparams: [0] a flag, then this iteration's ready order */
    int nready;
    unsigned char *used;           /* find_unused: marked on this rank, then on any (MAX) */
    unsigned char *arena, *half_arena;
    int registered;                /* the arena from ddp_comm_mem_alloc (desc.registered) */
    void *reg_arena;               /* the registered allocation in use, or NULL */
    int next_launch, next_collect; /* buckets [next_collect, next_launch) are in flight */
    int in_iteration, finished, no_sync, rebuilt;
    ddp_result_t iter_err;         /* first communication failure of this iteration */
    int dev;                       /* buckets in device memory: stream-ordered copies */
    unsigned char *flat;           /* flat mode: desc.flat_grads; buckets are views of it */
    size_t flat_es;                /* its element size, from the first slice (0 before) */
    ddp_dtype_t flat_dtype;
    int zero;                      /* ZeRO-1: reduce-scatter per bucket */
    unsigned char *tail_arena;     /* ZeRO-1: the tails' scratch */
    _ddp_rshard_t *shards;         /* flat mode: this rank's shards, packed state offsets */
    int nshards;
    size_t shard_elems;
    /* Step numbers, from 1: synchronised finishes begun, the last whose exchange completed
     * here, the last committed here (elastic: its commit round gave 1; else finish succeeded). */
    int64_t step, exchanged, committed;
    /* Elastic: how many joiners this rank sees waiting (asked at each finish, before the commit
     * round: ddp_comm_joiners_waiting, -1 counted as 0), and the MAX over the ranks that the
     * last commit round agreed on. */
    int (*joiners_fn)(ddp_comm_t *comm);
    int joiners;
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
        p->nb = 1;
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
    else if (arena == r->reg_arena) {
        ddp_comm_mem_free(r->comm, arena);   /* collective, as its allocation: every rank frees it here */
        r->reg_arena = NULL;
    } else ddp_comm_free(r->comm, arena);
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
 * aligned), plus the 16-bit copies the built-in compression sends. Flat mode: no arena (the
 * buckets are the user's buffer), only the 16-bit copies and the ZeRO-1 tails' scratch. */
_DDP_PRIVATE ddp_result_t _ddp_reducer_alloc_flat(ddp_reducer_t *r, size_t halves, size_t tails);
_DDP_PRIVATE ddp_result_t _ddp_reducer_alloc(ddp_reducer_t *r) {
    size_t total = 0, halves = 0, tails = 0;
    int b;
    for (b = 0; b < r->nbuckets; b++) {
        if (!r->flat)
            total += (r->buckets[b].bytes + _DDP_REDUCER_ALIGN - 1) & ~(size_t)(_DDP_REDUCER_ALIGN - 1);
        if (_ddp_reducer_compressed(r, &r->buckets[b])) halves += (r->buckets[b].count + 31) & ~(size_t)31;
        if (r->buckets[b].tail) tails++;
    }
    if (r->flat) return _ddp_reducer_alloc_flat(r, halves, tails);
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
        void *a = NULL;
        /* Registered: zero-filled and page-aligned; a failure leaves ordinary memory. */
        if (r->registered && !r->dev && ddp_comm_mem_alloc(r->comm, total + _DDP_REDUCER_ALIGN, &a) == DDP_SUCCESS)
            r->reg_arena = a;
        r->arena = a ? (unsigned char *)a : (unsigned char *)ddp_comm_calloc(r->comm, total + _DDP_REDUCER_ALIGN);
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

/* Flat mode: the buckets point into the user's buffer; only the 16-bit copies of the built-in
 * compression (host only) and 8 bytes x world per ZeRO-1 tail (any dtype fits) are ours. */
_DDP_PRIVATE ddp_result_t _ddp_reducer_alloc_flat(ddp_reducer_t *r, size_t halves, size_t tails) {
    size_t per_tail = (size_t)r->world * 8, h = 0, t = 0;
    int b;
    r->arena = NULL;
    r->half_arena = halves ? (unsigned char *)ddp_comm_calloc(r->comm, halves * 2 + _DDP_REDUCER_ALIGN) : NULL;
    r->tail_arena = NULL;
    if (tails && r->dev) {
        void *a = NULL;
        if (ddp_comm_device_alloc(r->comm, tails * per_tail, &a) == DDP_SUCCESS) r->tail_arena = (unsigned char *)a;
    } else if (tails) {
        r->tail_arena = (unsigned char *)ddp_comm_calloc(r->comm, tails * per_tail);
    }
    if ((halves && !r->half_arena) || (tails && !r->tail_arena)) {
        ddp_comm_free(r->comm, r->half_arena);
        if (r->tail_arena && r->dev) ddp_comm_device_free(r->comm, r->tail_arena);
        else ddp_comm_free(r->comm, r->tail_arena);
        r->half_arena = r->tail_arena = NULL;
        r->broken = DDP_ERR_OUT_OF_MEMORY;
        return _ddp_reducer_fail(r, DDP_ERR_OUT_OF_MEMORY, "no memory for the %s", tails ?
                                 "ZeRO-1 tails' scratch" : "16-bit copies of the buckets");
    }
    for (b = 0; b < r->nbuckets; b++) {
        _ddp_rbucket_t *bk = &r->buckets[b];
        bk->buf = r->flat + bk->lo * r->flat_es;
        bk->half = NULL;
        bk->scratch = NULL;
        if (_ddp_reducer_compressed(r, bk)) {
            bk->half = r->half_arena + (_DDP_REDUCER_ALIGN - (uintptr_t)r->half_arena % _DDP_REDUCER_ALIGN) +
                       2 * h;
            h += (bk->count + 31) & ~(size_t)31;
        }
        if (bk->tail) bk->scratch = r->tail_arena + per_tail * t++;
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
             r->zero ? ", ZeRO-1 (reduce-scatter)" : r->flat ? ", flat buffer" :
             r->d.gradient_as_bucket_view ? ", gradients as bucket views" : "",
             r->d.find_unused ? ", find_unused" : "");
    for (b = 0; b < r->nbuckets; b++)
        ddp_comm_log(r->comm, DDP_LOG_TRACE, "reducer: bucket %d: %d parameters (first %d), %zu x %s",
                 b, r->buckets[b].n, r->params_of[r->buckets[b].first], r->buckets[b].count,
                 ddp_dtype_name(r->buckets[b].dtype));
}

/* ---------------------------------------------------------------- flat mode
 * The buckets are ranges of the user's buffer, so the layout is a function of where the slices
 * are, not of the registration order: sort the slices, find the runs of adjacent ones (a bucket
 * never spans memory nobody registered), and cut each run from its end down. */
typedef struct { size_t off; int idx; } _ddp_rsorted_t;

_DDP_PRIVATE int _ddp_reducer_cmp_off(const void *a, const void *b) {
    size_t x = ((const _ddp_rsorted_t *)a)->off, y = ((const _ddp_rsorted_t *)b)->off;
    return x < y ? -1 : x > y;
}

_DDP_PRIVATE void _ddp_reducer_emit(ddp_reducer_t *r, size_t lo, size_t hi, int tail) {
    _ddp_rbucket_t *bk = &r->buckets[r->nbuckets++];
    memset(bk, 0, sizeof *bk);
    bk->lo = lo;
    bk->count = hi - lo;
    bk->bytes = bk->count * r->flat_es;
    bk->dtype = r->flat_dtype;
    bk->tail = tail;
}

/* One run of adjacent slices, sorted[i..j], elements [s, e): DDP's cut (whole parameters, from
 * the top, the first bucket of the buffer up to first_bucket_bytes, the others up to
 * bucket_cap_bytes, each closing once it reaches its limit). ZeRO-1 moves every cut down to
 * s + a multiple of the world size, so that a bucket splits into world equal blocks in place
 * (a cut that lands on the previous one vanishes, its parameters join the bucket below); the
 * e - s mod world elements at the top are the run's tail. */
_DDP_PRIVATE void _ddp_reducer_cut_run(ddp_reducer_t *r, const _ddp_rsorted_t *sorted, int i, int j,
                                      int *first) {
    const size_t P = (size_t)r->world;
    size_t s = sorted[i].off, e = sorted[j].off + r->params[sorted[j].idx].count, top = e, acc = 0;
    int k;
    if (r->zero && (e - s) % P) {
        top = s + (e - s) / P * P;
        _ddp_reducer_emit(r, top, e, 1);
    }
    for (k = j; k >= i; k--) {
        size_t c = sorted[k].off;
        acc += r->params[sorted[k].idx].bytes;
        if (acc < (*first ? r->d.first_bucket_bytes : r->d.bucket_cap_bytes) && k > i) continue;
        if (r->zero) c = s + (c - s) / P * P;
        if (c < top) {
            _ddp_reducer_emit(r, c, top, 0);
            top = c;
            *first = 0;
        }
        acc = 0;
    }
}

/* Buckets in descending address order (bucket 0 holds the buffer's last elements); then each
 * bucket's parameters (those overlapping it, from the top; one straddling a ZeRO-1 boundary is
 * in both buckets) by one sweep down the sorted slices; then this rank's shards. */
_DDP_PRIVATE ddp_result_t _ddp_reducer_layout_flat(ddp_reducer_t *r) {
    int n = r->nparams, i, j, k, b, npairs = 0, first = 1;
    const size_t P = (size_t)r->world, me = (size_t)r->rank;
    size_t state = 0;
    _ddp_rsorted_t *sorted = (_ddp_rsorted_t *)ddp_comm_calloc(r->comm, sizeof *sorted * (size_t)n);
    r->shards = (_ddp_rshard_t *)ddp_comm_calloc(r->comm, sizeof *r->shards * 2 * (size_t)n);
    if (!sorted || !r->shards) {
        ddp_comm_free(r->comm, sorted);
        r->broken = DDP_ERR_OUT_OF_MEMORY;
        return _ddp_reducer_fail(r, DDP_ERR_OUT_OF_MEMORY, "no memory for the flat layout of %d parameters", n);
    }
    for (k = 0; k < n; k++) { sorted[k].off = r->params[k].off; sorted[k].idx = k; }
    qsort(sorted, (size_t)n, sizeof *sorted, _ddp_reducer_cmp_off);
    r->nbuckets = 0;
    for (j = n - 1; j >= 0; j = i - 1) {
        for (i = j; i > 0 && sorted[i - 1].off + r->params[sorted[i - 1].idx].count == sorted[i].off; i--) {}
        _ddp_reducer_cut_run(r, sorted, i, j, &first);
    }
    for (b = 0, k = n - 1; b < r->nbuckets; b++) {
        _ddp_rbucket_t *bk = &r->buckets[b];
        size_t lo = bk->lo, hi = bk->lo + bk->count;
        while (k >= 0 && sorted[k].off >= hi) k--;
        bk->first = npairs;
        for (; k >= 0 && sorted[k].off + r->params[sorted[k].idx].count > lo; k--) {
            _ddp_rparam_t *p = &r->params[sorted[k].idx];
            if (!p->nb) p->bucket = b;
            p->nb++;
            r->params_of[npairs++] = sorted[k].idx;
            if (sorted[k].off < lo) break;      /* it goes on in the next bucket */
        }
        bk->n = npairs - bk->first;
    }
    ddp_comm_free(r->comm, sorted);
    for (b = 0, r->nshards = 0; b < r->nbuckets; b++) {
        const _ddp_rbucket_t *bk = &r->buckets[b];
        _ddp_rshard_t *sh = &r->shards[r->nshards];
        if (!r->zero) { sh->off = bk->lo; sh->count = bk->count; }
        else if (!bk->tail) { sh->count = bk->count / P; sh->off = bk->lo + me * sh->count; }
        else if (me < bk->count) { sh->off = bk->lo + me; sh->count = 1; }
        else continue;
        sh->state = state;
        state += sh->count;
        r->nshards++;
    }
    r->shard_elems = state;
    return _ddp_reducer_alloc(r);
}

/* add_param in flat mode: a slice of the flat buffer, of its dtype, overlapping no other.
 * 0, or -1 after recording why (DDP_ERR_INVALID_ARGUMENT). */
_DDP_PRIVATE int _ddp_reducer_check_slice(ddp_reducer_t *r, const void *grad, size_t count, ddp_dtype_t dtype,
                                          size_t *off_out) {
    const int me = r->nparams;
    size_t es = ddp_dtype_size(dtype), at = (size_t)((uintptr_t)grad - (uintptr_t)r->flat), off;
    int k;
    if (!grad) {
        _ddp_reducer_fail(r, DDP_ERR_INVALID_ARGUMENT, "add_param #%d: NULL gradient: in flat mode pass the "
                          "parameter's slice of flat_grads", me);
        return -1;
    }
    if (r->flat_es && dtype != r->flat_dtype) {
        _ddp_reducer_fail(r, DDP_ERR_INVALID_ARGUMENT, "add_param #%d: dtype %s, but the flat buffer's earlier "
                          "slices are %s: one dtype per flat buffer (a reducer per dtype)", me,
                          ddp_dtype_name(dtype), ddp_dtype_name(r->flat_dtype));
        return -1;
    }
    if ((uintptr_t)grad < (uintptr_t)r->flat || at > r->d.flat_bytes || count > (r->d.flat_bytes - at) / es) {
        _ddp_reducer_fail(r, DDP_ERR_INVALID_ARGUMENT, "add_param #%d: %zu x %s at %p is not inside flat_grads "
                          "(%p, %zu bytes)", me, count, ddp_dtype_name(dtype), grad, (void *)r->flat,
                          r->d.flat_bytes);
        return -1;
    }
    if (at % es) {
        _ddp_reducer_fail(r, DDP_ERR_INVALID_ARGUMENT, "add_param #%d: starts %zu bytes into flat_grads, not a "
                          "whole number of %s elements", me, at, ddp_dtype_name(dtype));
        return -1;
    }
    off = at / es;
    for (k = 0; k < me; k++) {
        const _ddp_rparam_t *q = &r->params[k];
        if (off < q->off + q->count && q->off < off + count) {
            _ddp_reducer_fail(r, DDP_ERR_INVALID_ARGUMENT, "add_param #%d: elements [%zu, %zu) of the flat buffer "
                              "overlap parameter #%d's [%zu, %zu)", me, off, off + count, k, q->off,
                              q->off + q->count);
            return -1;
        }
    }
    r->flat_es = es;
    r->flat_dtype = dtype;
    *off_out = off;
    return 0;
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
        for (k = 0; k < n && !r->flat; k++)
            if (r->params[k].user) { nuser++; ndev += ddp_comm_is_device(r->comm, r->params[k].user); }
        if (ndev && ndev != nuser)
            return _ddp_reducer_fail(r, DDP_ERR_INVALID_ARGUMENT, "%d of the %d gradients are device "
                                     "memory and the others host memory: one or the other", ndev, nuser);
        r->dev = ndev > 0 || r->d.on_device;
        if (r->flat) {   /* the buffer says where the buckets are */
            r->dev = ddp_comm_is_device(r->comm, r->flat);
            if (r->d.on_device && !r->dev)
                return _ddp_reducer_fail(r, DDP_ERR_INVALID_ARGUMENT, "on_device = 1, but flat_grads is "
                                         "host memory");
        }
        if (r->dev && !ddp_comm_device_enabled(r->comm, NULL, 0))
            return _ddp_reducer_fail(r, DDP_ERR_UNSUPPORTED, "device gradients, but the communicator "
                                     "cannot use NCCL: %.600s", ddp_comm_last_error(r->comm));
        if (r->dev && r->d.elastic)
            return _ddp_reducer_fail(r, DDP_ERR_UNSUPPORTED, "elastic with device gradients: finish "
                                     "returns before the stream-ordered exchange completes, so it cannot "
                                     "commit the step");
        if (r->dev && r->d.compression != DDP_COMPRESS_NONE)
            return _ddp_reducer_fail(r, DDP_ERR_UNSUPPORTED, "built-in fp16/bf16 compression on "
                                     "device gradients (it needs CUDA kernels): use a comm_hook");
    }
    r->buckets = (_ddp_rbucket_t *)ddp_comm_calloc(r->comm, sizeof *r->buckets * (size_t)n * (r->flat ? 2 : 1));
    r->params_of = (int *)ddp_comm_calloc(r->comm, sizeof(int) * (size_t)n * (r->flat ? 3 : 1));
    r->work = (int *)ddp_comm_calloc(r->comm, sizeof(int) * 2 * (size_t)n);
    r->order = (int32_t *)ddp_comm_calloc(r->comm, sizeof(int32_t) * ((size_t)n + 1));
    if (r->d.find_unused) r->used = (unsigned char *)ddp_comm_calloc(r->comm, (size_t)n);
    if (!r->buckets || !r->params_of || !r->work || !r->order || (r->d.find_unused && !r->used)) {
        r->broken = DDP_ERR_OUT_OF_MEMORY;
        return _ddp_reducer_fail(r, DDP_ERR_OUT_OF_MEMORY, "no memory for %d parameters", n);
    }
    if (r->flat) {
        if ((e = _ddp_reducer_layout_flat(r)) != DDP_SUCCESS) return e;
    } else {
        for (k = 0; k < n; k++) r->order[1 + k] = n - 1 - k;
        _ddp_reducer_assign(r, r->order + 1);
        if ((e = _ddp_reducer_alloc(r)) != DDP_SUCCESS) return e;
    }
    r->closed = 1;
    _ddp_reducer_reset(r);
    _ddp_reducer_log_layout(r, r->flat ? "views of the flat buffer, from its end" : "built in reverse registration order");
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

/* Collects the oldest buckets whose reductions are done, without waiting. Not with a
 * comm_hook_done: it may issue collectives (PowerSGD's second all-reduce), and whether a request
 * has completed at a given grad_ready differs from rank to rank, so the ranks would issue them
 * between different buckets; at finish (or when launch waits for the oldest bucket beyond the
 * in-flight limit) every rank runs them at the same point of its issue order. */
_DDP_PRIVATE void _ddp_reducer_poll(ddp_reducer_t *r) {
    if (r->d.comm_hook_done) return;
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
    if (e != DDP_SUCCESS) { _ddp_reducer_comm_err(r, e, r->zero ? "reduce-scatter" : "all-reduce", b); return; }
    if (bk->tail && !r->dev && (size_t)r->rank < bk->count)   /* ZeRO-1: our element of the tail */
        memcpy(bk->buf + (size_t)r->rank * r->flat_es, bk->scratch + (size_t)r->rank * r->flat_es, r->flat_es);
    if (!r->d.comm_hook) return;     /* the progress thread finished the bucket */
    if (r->d.comm_hook_done) {
        e = r->d.comm_hook_done(r->d.comm_hook_state, r->comm, b, bk->buf, bk->count, bk->dtype);
        if (e != DDP_SUCCESS) _ddp_reducer_comm_err(r, e, "comm_hook_done", b);
    }
    if (!r->d.gradient_as_bucket_view && !r->d.find_unused && r->iter_err == DDP_SUCCESS)
        _ddp_reducer_copy_back(r, b);
}

/* ZeRO-1: bucket bk's reduce-scatter (DDP_AVG), in place: rank r's block is [r rc, (r+1) rc)
 * of the bucket (NCCL's layout, recvbuf = sendbuf + r rc). A tail (fewer elements than ranks)
 * goes through its scratch, zero-padded to one element per rank; rank r < count gets element r
 * back into the buffer (post, or a stream-ordered copy right behind the collective). */
_DDP_PRIVATE ddp_result_t _ddp_reducer_launch_zero(ddp_reducer_t *r, _ddp_rbucket_t *bk) {
    const size_t es = r->flat_es, me = (size_t)r->rank, P = (size_t)r->world;
    ddp_result_t e;
    if (!bk->tail) {
        size_t rc = bk->count / P;
        return ddp_reduce_scatter_async(bk->buf, bk->buf + me * rc * es, rc, bk->dtype, DDP_AVG, r->comm, &bk->req);
    }
    if (r->dev) {
        _ddp_reducer_move(r, bk->scratch, bk->buf, bk->bytes);
        if (ddp_comm_device_zero(r->comm, bk->scratch + bk->bytes, (P - bk->count) * es) != DDP_SUCCESS &&
            r->iter_err == DDP_SUCCESS)
            _ddp_reducer_comm_err(r, DDP_ERR_SYSTEM, "device fill of the tail", bk->index);
    } else {
        memcpy(bk->scratch, bk->buf, bk->bytes);
        memset(bk->scratch + bk->bytes, 0, (P - bk->count) * es);
    }
    e = ddp_reduce_scatter_async(bk->scratch, bk->scratch + me * es, 1, bk->dtype, DDP_AVG, r->comm, &bk->req);
    if (e == DDP_SUCCESS && r->dev && me < bk->count)
        _ddp_reducer_move(r, bk->buf + me * es, bk->scratch + me * es, es);
    return e;
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
    } else if (r->zero) {
        bk->index = b;
        e = _ddp_reducer_launch_zero(r, bk);
        if (e != DDP_SUCCESS) _ddp_reducer_comm_err(r, e, "reduce-scatter", b);
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
        const size_t es = ddp_dtype_size(bk->dtype);
        const size_t at = r->flat ? (size_t)((unsigned char *)bk->buf - r->flat) : 0;
        if (r->flat && !bk->half && r->d.flat_bytes % es == 0 && at % es == 0)
            /* A view of the flat buffer: cut as one all-reduce of the whole would be, so the
             * result is that all-reduce's, bit for bit, whatever the bucket boundaries. */
            e = _ddp_all_reduce_async_part(data, data, bk->count, bk->dtype, DDP_AVG, r->comm, &hooks, &bk->req,
                                           r->d.flat_bytes / es, at / es);
        else
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
    if (!d.flat_grads != !d.flat_bytes)
        return ddp_comm_fail(comm, DDP_ERR_INVALID_ARGUMENT, "reducer_create: flat_grads %s but "
                             "flat_bytes %zu: give both (flat mode) or neither", d.flat_grads ? "set" : "NULL",
                             d.flat_bytes);
    if (d.zero_stage != 0 && d.zero_stage != 1)
        return ddp_comm_fail(comm, DDP_ERR_INVALID_ARGUMENT, "reducer_create: zero_stage %d (0: all-reduce, "
                             "1: ZeRO-1; stages 2 and 3 shard gradients and parameters: not here)", d.zero_stage);
    if (d.zero_stage && !d.flat_grads)
        return ddp_comm_fail(comm, DDP_ERR_INVALID_ARGUMENT, "reducer_create: zero_stage 1 needs flat_grads "
                             "(a rank's shard is a range of the flat buffers)");
    if (d.zero_stage && (d.comm_hook || d.compression != DDP_COMPRESS_NONE))
        return ddp_comm_fail(comm, DDP_ERR_INVALID_ARGUMENT, "reducer_create: zero_stage 1 reduce-scatters "
                             "each bucket: not with a comm_hook (PowerSGD's included) or compression (they replace "
                             "an all-reduce)");
    if (d.elastic && d.zero_stage)
        return ddp_comm_fail(comm, DDP_ERR_INVALID_ARGUMENT, "reducer_create: elastic with zero_stage 1: a "
                             "lost rank takes its shard of the optimizer state (and, in all_gather_params, of "
                             "the parameters) with it; restart from a checkpoint instead");
    if (d.flat_grads) d.gradient_as_bucket_view = 1;   /* the buffer is the buckets */
    r = (ddp_reducer_t *)ddp_comm_calloc(comm, sizeof *r);
    if (!r) return ddp_comm_fail(comm, DDP_ERR_OUT_OF_MEMORY, "reducer_create");
    r->comm = comm;
    r->d = d;
    r->world = world;
    r->rank = ddp_comm_rank(comm);
    r->flat = (unsigned char *)d.flat_grads;
    r->zero = d.zero_stage == 1;
    {
        const char *env = getenv("DDP_REDUCER_REGISTERED");
        r->registered = d.registered ? d.registered > 0 : env && !strcmp(env, "1");
        /* elastic: the arena would belong to a communicator a rebind leaves behind */
        if (d.elastic || d.flat_grads) r->registered = 0;
    }
    r->joiners_fn = ddp_comm_joiners_waiting;   /* (tests point it elsewhere to inject counts) */
    *out = r;
    return DDP_SUCCESS;
}

DDP_API int ddp_reducer_add_param(ddp_reducer_t *r, void *grad, size_t count, ddp_dtype_t dtype) {
    size_t es = ddp_dtype_size(dtype), off = 0;
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
    if (r->flat && _ddp_reducer_check_slice(r, grad, count, dtype, &off) != 0) return -1;
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
    p->off = off;
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
    {   /* flat ZeRO-1: a parameter may straddle bucket boundaries */
        int b, launch = 0;
        for (b = p->bucket; b < p->bucket + p->nb; b++) {
            bk = &r->buckets[b];
            launch |= --bk->pending == 0;
        }
        if (launch) _ddp_reducer_launch_ready(r);
    }
    return r->iter_err;
}

/* The buckets (not flat mode) laid out again from `order` (a permutation of the parameters, not
 * in r->work), in new memory; with bucket views the gradients' values move along. */
_DDP_PRIVATE ddp_result_t _ddp_reducer_relayout(ddp_reducer_t *r, const int32_t *order) {
    int n = r->nparams, k;
    ddp_result_t e;
    unsigned char **old = NULL, *old_arena = r->arena, *old_half = r->half_arena;
    void *old_reg = r->reg_arena;
    if (r->d.gradient_as_bucket_view) {   /* the views move: keep their values (the result) */
        old = (unsigned char **)ddp_comm_calloc(r->comm, sizeof *old * (size_t)n);
        if (!old) return _ddp_reducer_fail(r, DDP_ERR_OUT_OF_MEMORY, "laying out the buckets again");
        for (k = 0; k < n; k++) old[k] = r->buckets[r->params[k].bucket].buf + r->params[k].offset;
    }
    _ddp_reducer_assign(r, order);
    r->reg_arena = NULL;
    if ((e = _ddp_reducer_alloc(r)) != DDP_SUCCESS) { r->reg_arena = old_reg; ddp_comm_free(r->comm, old); return e; }
    if (old)
        for (k = 0; k < n; k++)
            _ddp_reducer_move(r, r->buckets[r->params[k].bucket].buf + r->params[k].offset, old[k],
                              r->params[k].bytes);
    ddp_comm_free(r->comm, old);
    if (old_reg) ddp_comm_mem_free(r->comm, old_reg);   /* collective: every rank relays out here */
    else _ddp_reducer_free_arena(r, old_arena);
    ddp_comm_free(r->comm, old_half);
    _ddp_reducer_reset(r);
    return DDP_SUCCESS;
}

/* After the first synchronised iteration: buckets in the order rank 0's gradients became ready
 * (Reducer::rebuild_buckets + sync_bucket_indices: rank 0's order is broadcast so every rank
 * builds the same buckets). order[0] says whether rank 0 saw every parameter ready; if not,
 * no rebuild this time. */
_DDP_PRIVATE ddp_result_t _ddp_reducer_rebuild(ddp_reducer_t *r) {
    int n = r->nparams, k;
    ddp_result_t e;
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
    if ((e = _ddp_reducer_relayout(r, r->order + 1)) != DDP_SUCCESS) return e;
    r->rebuilt = 1;
    _ddp_reducer_log_layout(r, "rebuilt in rank 0's gradient ready order");
    return DDP_SUCCESS;
}

/* Elastic: the commit round's one int carries two agreements in one MIN all-reduce: "my
 * exchange completed" (ok, 0 or 1) in its high part, so the MIN is 1 there only if every rank's
 * is, and BIG - 1 - waiting in its low part, so that among ranks that all say ok the MIN picks
 * the largest waiting count. waiting is clamped to [0, BIG - 1] (a billion joiners). */
#define _DDP_REDUCER_COMMIT_BIG ((int32_t)1 << 30)
_DDP_PRIVATE int32_t _ddp_reducer_commit_value(int ok, int waiting) {
    if (waiting < 0) waiting = 0;
    if (waiting > _DDP_REDUCER_COMMIT_BIG - 1) waiting = _DDP_REDUCER_COMMIT_BIG - 1;
    return (ok ? _DDP_REDUCER_COMMIT_BIG : 0) + (_DDP_REDUCER_COMMIT_BIG - 1 - waiting);
}

/* Elastic: the commit round, on the buckets' communicator after them. Every rank takes part,
 * whatever its exchange did (a 0 from a rank whose exchange failed keeps the others from
 * committing), so the round is the same collective everywhere. Returns what finish returns.
 * It also agrees on the joiners waiting (the MAX of the ranks' counts; 0 unless committed). */
_DDP_PRIVATE ddp_result_t _ddp_reducer_commit(ddp_reducer_t *r, ddp_result_t e, ddp_result_t usage) {
    int32_t flag = _ddp_reducer_commit_value(e == DDP_SUCCESS && usage == DDP_SUCCESS,
                                             r->joiners_fn ? r->joiners_fn(r->comm) : 0);
    ddp_result_t ce = ddp_all_reduce(&flag, &flag, 1, DDP_INT32, DDP_MIN, r->comm);
    r->joiners = 0;
    if (ce == DDP_SUCCESS && flag >= _DDP_REDUCER_COMMIT_BIG) {
        r->committed = r->step;
        r->joiners = (int)(_DDP_REDUCER_COMMIT_BIG - 1 - (flag - _DDP_REDUCER_COMMIT_BIG));
        return e;
    }
    if (e != DDP_SUCCESS || usage != DDP_SUCCESS) return e;   /* r->err says why */
    if (ce != DDP_SUCCESS) {
        snprintf(r->err, sizeof r->err, "step %lld not committed: its gradient exchange completed here "
                 "but the commit round failed (after the shrink, ddp_reducer_rebind says whether to apply "
                 "it): %.600s", (long long)r->step, ddp_comm_last_error(r->comm));
        return ce;
    }
    return _ddp_reducer_fail(r, DDP_ERR_REMOTE, "step %lld not committed: another rank's gradient "
                             "exchange failed (the commit round gave 0); do not apply it", (long long)r->step);
}

/* Rebind's all-gather: what each rank of the new communicator says about itself. */
enum {
    _DDP_RB_COMMITTED, _DDP_RB_EXCHANGED,
    _DDP_RB_STEP,                  /* finishes begun: 0 for a fresh reducer (a joiner's) */
    _DDP_RB_CLOSE,                 /* its parameter list could not be closed: why (a ddp_result_t) */
    _DDP_RB_NPARAMS,
    _DDP_RB_PARAMS,                /* digest of the parameters' counts, dtypes (and flat offsets) */
    _DDP_RB_SETTINGS,              /* digest of the settings that shape the collectives */
    _DDP_RB_FIELDS
};

_DDP_PRIVATE void _ddp_reducer_param_fields(const ddp_reducer_t *r, int k, int64_t *f) {
    f[0] = (int64_t)r->params[k].count;
    f[1] = (int64_t)r->params[k].dtype;
    f[2] = r->flat ? (int64_t)r->params[k].off : 0;
}

_DDP_PRIVATE void _ddp_reducer_rebind_mine(ddp_reducer_t *r, int64_t *mine) {
    uint64_t h = _DDP_FNV_INIT, set[9];
    int k;
    memset(mine, 0, sizeof *mine * _DDP_RB_FIELDS);
    mine[_DDP_RB_COMMITTED] = r->committed;
    mine[_DDP_RB_EXCHANGED] = r->exchanged;
    mine[_DDP_RB_STEP] = r->step;
    mine[_DDP_RB_CLOSE] = (int64_t)_ddp_reducer_close(r);   /* a joiner's may be open still */
    mine[_DDP_RB_NPARAMS] = r->nparams;
    for (k = 0; k < r->nparams; k++) {
        int64_t f[3];
        _ddp_reducer_param_fields(r, k, f);
        h = _ddp_fnv1a(f, sizeof f, h);
    }
    mine[_DDP_RB_PARAMS] = (int64_t)h;
    set[0] = r->d.bucket_cap_bytes;
    set[1] = r->d.first_bucket_bytes;
    set[2] = (uint64_t)r->d.find_unused;
    set[3] = (uint64_t)r->d.compression;
    set[4] = r->d.comm_hook != NULL;
    set[5] = r->flat != NULL;
    set[6] = r->d.flat_bytes;
    set[7] = (uint64_t)r->d.zero_stage;
    set[8] = (uint64_t)r->d.elastic;
    mine[_DDP_RB_SETTINGS] = (int64_t)_ddp_fnv1a(set, sizeof set, _DDP_FNV_INIT);
}

/* Every rank runs this on the same gathered rows, so every rank returns the same verdict. */
_DDP_PRIVATE ddp_result_t _ddp_reducer_rebind_check(ddp_reducer_t *r, const int64_t *all, int n, int *params_differ) {
    int j;
    *params_differ = 0;
    for (j = 0; j < n; j++) {
        const int64_t *row = all + (size_t)j * _DDP_RB_FIELDS;
        if (row[_DDP_RB_CLOSE] != DDP_SUCCESS)
            return _ddp_reducer_fail(r, (ddp_result_t)row[_DDP_RB_CLOSE], "rebind: rank %d of the new "
                                     "communicator cannot use its reducer (%s%s)", j,
                                     ddp_strerror((ddp_result_t)row[_DDP_RB_CLOSE]), row[_DDP_RB_NPARAMS] ? "" :
                                     ": no parameters registered");
    }
    for (j = 1; j < n; j++) {
        const int64_t *row = all + (size_t)j * _DDP_RB_FIELDS;
        if (row[_DDP_RB_SETTINGS] != all[_DDP_RB_SETTINGS])
            return _ddp_reducer_fail(r, DDP_ERR_MISMATCH, "rebind: rank %d of the new communicator created its "
                                     "reducer with other settings than rank 0 (bucket_cap_bytes, first_bucket_bytes, "
                                     "find_unused, compression, comm_hook, flat_grads/flat_bytes): every rank must "
                                     "use the same desc", j);
        if (row[_DDP_RB_NPARAMS] != all[_DDP_RB_NPARAMS])
            return _ddp_reducer_fail(r, DDP_ERR_MISMATCH, "rebind: rank %d of the new communicator registered "
                                     "%lld parameters, rank 0 %lld: every rank must register the same ones, in "
                                     "the same order", j, (long long)row[_DDP_RB_NPARAMS],
                                     (long long)all[_DDP_RB_NPARAMS]);
        if (row[_DDP_RB_PARAMS] != all[_DDP_RB_PARAMS]) *params_differ = 1;
    }
    return DDP_SUCCESS;
}

/* The parameter lists differ somewhere (their digests do): collective, to name the first rank
 * and parameter on every rank. Rank 0's list is broadcast; each rank finds its first parameter
 * unlike it; the all-gather of those tells everyone. */
_DDP_PRIVATE ddp_result_t _ddp_reducer_rebind_name_param(ddp_reducer_t *r, int n) {
    const int np = r->nparams;
    int64_t *ref = (int64_t *)ddp_comm_calloc(r->comm, sizeof *ref * (3 * (size_t)np + 4 * (size_t)n));
    int64_t *bad, mine[4] = {-1, 0, 0, 0};
    ddp_result_t e;
    int k, j;
    if (!ref) return _ddp_reducer_fail(r, DDP_ERR_OUT_OF_MEMORY, "rebind: the parameter lists differ");
    bad = ref + 3 * (size_t)np;
    for (k = 0; k < np && r->rank == 0; k++) _ddp_reducer_param_fields(r, k, ref + 3 * (size_t)k);
    e = ddp_broadcast(ref, ref, 3 * (size_t)np, DDP_INT64, 0, r->comm);
    for (k = 0; k < np && e == DDP_SUCCESS && mine[0] < 0; k++) {
        int64_t f[3];
        _ddp_reducer_param_fields(r, k, f);
        if (memcmp(f, ref + 3 * (size_t)k, sizeof f) == 0) continue;
        mine[0] = k;
        memcpy(mine + 1, f, sizeof f);
    }
    if (e == DDP_SUCCESS) e = ddp_all_gather(mine, bad, 4, DDP_INT64, r->comm);
    if (e != DDP_SUCCESS) {
        snprintf(r->err, sizeof r->err, "rebind: the parameter lists differ; naming the first difference: "
                 "%.600s", ddp_comm_last_error(r->comm));
        ddp_comm_free(r->comm, ref);
        return e;
    }
    for (j = 1; j < n && bad[4 * (size_t)j] < 0; j++) {}
    if (j == n) e = _ddp_reducer_fail(r, DDP_ERR_MISMATCH, "rebind: the parameter lists differ");
    else {
        const int64_t *b = bad + 4 * (size_t)j, *f0 = ref + 3 * (size_t)b[0];
        char at_j[40] = "", at_0[40] = "";   /* flat mode: where the slices start */
        if (r->flat) {
            snprintf(at_j, sizeof at_j, " at element %lld", (long long)b[3]);
            snprintf(at_0, sizeof at_0, " at element %lld", (long long)f0[2]);
        }
        e = _ddp_reducer_fail(r, DDP_ERR_MISMATCH, "rebind: rank %d of the new communicator registered parameter "
                              "%lld as %lld x %s%s, rank 0 as %lld x %s%s: every rank must register the same "
                              "parameters in the same order (the same program)", j, (long long)b[0], (long long)b[1],
                              ddp_dtype_name((ddp_dtype_t)b[2]), at_j, (long long)f0[0],
                              ddp_dtype_name((ddp_dtype_t)f0[1]), at_0);
    }
    ddp_comm_free(r->comm, ref);
    return e;
}

/* Every rank takes rank src's bucket layout (and whether it was rebuilt: a rank that adopted a
 * rebuilt layout must not rebuild again, and one whose source has not rebuilt yet rebuilds
 * with the others). A layout is its parameters in bucket order (params_of): laying them out in
 * that order gives the same buckets again (buckets of one dtype close in order; a bucket's
 * parameters are contiguous in it). Flat mode: the layout is the slices' (already compared). */
_DDP_PRIVATE ddp_result_t _ddp_reducer_rebind_layout(ddp_reducer_t *r, int src) {
    const int n = r->nparams;
    ddp_result_t e;
    int k, same = 1;
    if (r->flat) return DDP_SUCCESS;
    if (r->rank == src) {
        r->order[0] = r->rebuilt;
        for (k = 0; k < n; k++) r->order[1 + k] = r->params_of[k];
    }
    e = ddp_broadcast(r->order, r->order, (size_t)n + 1, DDP_INT32, src, r->comm);
    if (e != DDP_SUCCESS) {
        snprintf(r->err, sizeof r->err, "rebind: the broadcast of rank %d's bucket layout: %.680s", src,
                 ddp_comm_last_error(r->comm));
        return e;
    }
    for (k = 0; k < n; k++) r->work[k] = 0;
    for (k = 0; k < n; k++) {
        int32_t q = r->order[1 + k];
        if (q < 0 || q >= n || r->work[q]++)
            return _ddp_reducer_fail(r, DDP_ERR_MISMATCH, "rebind: rank %d's bucket layout is not a permutation "
                                     "of this rank's %d parameters", src, n);
        same &= q == r->params_of[k];
    }
    if (!same) {
        if ((e = _ddp_reducer_relayout(r, r->order + 1)) != DDP_SUCCESS) return e;
        _ddp_reducer_log_layout(r, "rebind: took the bucket layout the other ranks train with");
    }
    r->rebuilt = r->order[0] != 0;
    return DDP_SUCCESS;
}

/* Elastic: the ranks' (committed, exchanged) steps, gathered over the new communicator.
 * S, the latest step any of them committed, is the one all of them end on: every rank that has
 * not committed S completed S's exchange (a commit of S proves that all did), and every
 * survivor committed S - 1 (it began S only after finish S - 1 succeeded). Anything else cannot
 * be reconciled. A later step some rank exchanged but nobody committed is dropped. A fresh
 * reducer (no finish begun: a joiner's after a grow) has nothing to reconcile: it takes S, and
 * nothing is pending for it (its state comes from the others). */
_DDP_PRIVATE ddp_result_t _ddp_reducer_decide(ddp_reducer_t *r, const int64_t *all, int n, int *apply) {
    int64_t S = 0;
    int j, fresh = 0;
    for (j = 0; j < n; j++) {
        const int64_t *row = all + (size_t)j * _DDP_RB_FIELDS;
        if (row[_DDP_RB_STEP] == 0) fresh++;
        else if (row[_DDP_RB_COMMITTED] > S) S = row[_DDP_RB_COMMITTED];
    }
    for (j = 0; j < n; j++) {
        const int64_t *row = all + (size_t)j * _DDP_RB_FIELDS;
        int64_t c = row[_DDP_RB_COMMITTED], x = row[_DDP_RB_EXCHANGED];
        if (row[_DDP_RB_STEP] == 0) continue;
        if (c < S - 1 || (c < S && x < S))
            return _ddp_reducer_fail(r, DDP_ERR_MISMATCH, "rebind: rank %d of the new communicator "
                                     "committed step %lld and exchanged step %lld, but step %lld was committed "
                                     "elsewhere: its gradients cannot be made the others' (restart from a "
                                     "checkpoint)", j, (long long)c, (long long)x, (long long)S);
    }
    *apply = r->step > 0 && r->committed < S;
    ddp_comm_log(r->comm, DDP_LOG_INFO, "reducer: rebound to %d ranks (%d of them fresh) at step %lld: %s", n,
                 fresh, (long long)S, r->step == 0 ? "fresh: takes the step count (its state comes from the others)" :
                 *apply ? "apply it (committed elsewhere, its exchange completed here)" :
                 r->exchanged > S || r->step > S ? "the step after it is dropped: redo it" : "nothing pending");
    r->step = r->exchanged = r->committed = S;
    return DDP_SUCCESS;
}

/* The rank whose layout everyone takes: the first with a finish begun (a member's, never a
 * fresh joiner's), else rank 0. */
_DDP_PRIVATE int _ddp_reducer_layout_source(const int64_t *all, int n) {
    int j;
    for (j = 0; j < n; j++) if (all[(size_t)j * _DDP_RB_FIELDS + _DDP_RB_STEP] > 0) return j;
    return 0;
}

DDP_API ddp_result_t ddp_reducer_rebind(ddp_reducer_t *r, ddp_comm_t *newcomm, int *apply_pending) {
    int64_t mine[_DDP_RB_FIELDS], *all;
    ddp_result_t e;
    int world, params_differ = 0;
    if (apply_pending) *apply_pending = 0;
    if (!r || !newcomm || !apply_pending) return DDP_ERR_INVALID_ARGUMENT;
    if ((world = ddp_comm_size(newcomm)) < 1) return DDP_ERR_INVALID_USAGE;   /* destroyed */
    if (!r->d.elastic || r->dev) {   /* refused: still bound to the old one, which is not touched */
        snprintf(r->err, sizeof r->err, "%s", r->dev ? "rebind with device gradients" : "rebind needs "
                 "elastic = 1: without the commit round nothing says whether the last step was applied everywhere");
        return ddp_comm_fail(newcomm, r->dev ? DDP_ERR_UNSUPPORTED : DDP_ERR_INVALID_USAGE, "reducer: %s", r->err);
    }
    r->comm = newcomm;   /* the old communicator is never used again, not even for an error */
    /* The failed step's state: its requests belonged to the old communicator (they failed or
     * never will complete). */
    if (r->closed) _ddp_reducer_reset(r);
    r->in_iteration = 0;
    r->finished = 1;
    r->world = world;
    r->rank = ddp_comm_rank(newcomm);
    r->joiners = 0;
    _ddp_reducer_rebind_mine(r, mine);
    all = (int64_t *)ddp_comm_calloc(newcomm, sizeof *all * _DDP_RB_FIELDS * (size_t)world);
    if (!all) return _ddp_reducer_fail(r, DDP_ERR_OUT_OF_MEMORY, "rebind: %d ranks' states", world);
    e = ddp_all_gather(mine, all, _DDP_RB_FIELDS, DDP_INT64, newcomm);
    if (e != DDP_SUCCESS)
        snprintf(r->err, sizeof r->err, "rebind: the all-gather of the ranks' steps: %.700s",
                 ddp_comm_last_error(newcomm));
    if (e == DDP_SUCCESS) e = _ddp_reducer_rebind_check(r, all, world, &params_differ);
    if (e == DDP_SUCCESS && params_differ) e = _ddp_reducer_rebind_name_param(r, world);
    if (e == DDP_SUCCESS) e = _ddp_reducer_rebind_layout(r, _ddp_reducer_layout_source(all, world));
    if (e == DDP_SUCCESS) e = _ddp_reducer_decide(r, all, world, apply_pending);
    ddp_comm_free(newcomm, all);
    if (e == DDP_SUCCESS) r->err[0] = 0;
    return e;
}

DDP_API int64_t ddp_reducer_committed_steps(const ddp_reducer_t *r) { return r ? r->committed : -1; }
DDP_API int ddp_reducer_joiners_waiting(const ddp_reducer_t *r) { return r ? r->joiners : -1; }

DDP_API ddp_result_t ddp_reducer_finish(ddp_reducer_t *r) {
    ddp_result_t e, usage = DDP_SUCCESS;
    ddp_request_t ureq;
    int k, nmissing = 0;
    char missing[256];
    size_t mlen = 0;
    if (!r) return DDP_ERR_INVALID_ARGUMENT;
    if ((e = _ddp_reducer_close(r)) != DDP_SUCCESS) return e;
    if (r->no_sync) {   /* not a step boundary: nobody grows in the middle of an accumulation */
        r->joiners = 0;
        return DDP_SUCCESS;
    }
    if (r->finished)
        return _ddp_reducer_fail(r, DDP_ERR_INVALID_USAGE, "finish called twice: no gradient was "
                                 "marked ready since the last finish");
    r->step++;
    /* Parameters nobody marked: zeros in the bucket (as mark_variable_ready_dense does for an
     * undefined grad), so that every bucket is reduced and no rank waits for this one. */
    missing[0] = 0;
    for (k = 0; k < r->nparams; k++) {
        _ddp_rparam_t *p = &r->params[k];
        unsigned char *g;
        int b;
        if (p->marked) continue;
        g = r->flat ? (unsigned char *)p->user : r->buckets[p->bucket].buf + p->offset;
        if (r->dev) ddp_comm_device_zero(r->comm, g, p->bytes);
        else memset(g, 0, p->bytes);
        for (b = p->bucket; b < p->bucket + p->nb; b++) r->buckets[b].pending--;
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
    /* flat mode: the buckets are the user's memory, which cannot be reordered. Elastic: a rank
     * dying in the broadcast may leave the survivors with different layouts; rebind makes them
     * agree again (and a joiner's fresh reducer adopts the members' layout there). */
    if (!r->rebuilt && !r->d.find_unused && !r->flat && e == DDP_SUCCESS)
        e = _ddp_reducer_rebuild(r);
    _ddp_reducer_reset(r);
    r->finished = 1;
    if (e == DDP_SUCCESS && usage == DDP_SUCCESS) r->exchanged = r->step;
    if (r->d.elastic) e = _ddp_reducer_commit(r, e, usage);
    else if (e == DDP_SUCCESS && usage == DDP_SUCCESS) r->committed = r->step;
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
    _ddp_reducer_free_arena(r, r->tail_arena);
    ddp_comm_free(c, r->half_arena);
    ddp_comm_free(c, r->shards);
    ddp_comm_free(c, r);
    return DDP_SUCCESS;
}

DDP_API void *ddp_reducer_grad(ddp_reducer_t *r, int i) {
    if (!r || i < 0 || i >= r->nparams) return NULL;
    if (!r->d.gradient_as_bucket_view || r->flat) return r->params[i].user;
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

DDP_API ddp_result_t ddp_reducer_param_info(ddp_reducer_t *r, int i, int *bucket, size_t *offset,
                                            size_t *count) {
    const _ddp_rparam_t *p;
    if (bucket) *bucket = -1;
    if (offset) *offset = 0;
    if (count) *count = 0;
    if (!r) return DDP_ERR_INVALID_ARGUMENT;
    if (i < 0 || i >= r->nparams)
        return _ddp_reducer_fail(r, DDP_ERR_INVALID_ARGUMENT, "param_info: parameter %d is not one of "
                                 "the %d registered", i, r->nparams);
    p = &r->params[i];
    if (count) *count = p->count;
    if (!r->closed) return DDP_SUCCESS;
    if (bucket) *bucket = p->bucket;
    if (offset)   /* flat mode: where the slice starts in the buffer, less where the bucket does */
        *offset = r->flat ? (p->off - r->buckets[p->bucket].lo) * r->flat_es : p->offset;
    return DDP_SUCCESS;
}

DDP_API int ddp_reducer_rebuilt(const ddp_reducer_t *r) { return r ? r->rebuilt : 0; }

DDP_API int ddp_reducer_num_shards(ddp_reducer_t *r, size_t *elems) {
    if (elems) *elems = 0;
    if (!r || _ddp_reducer_close(r) != DDP_SUCCESS) return -1;
    if (!r->flat) {
        _ddp_reducer_fail(r, DDP_ERR_INVALID_USAGE, "num_shards: shards are ranges of a flat buffer: "
                          "create the reducer with flat_grads");
        return -1;
    }
    if (elems) *elems = r->shard_elems;
    return r->nshards;
}

DDP_API ddp_result_t ddp_reducer_shard(ddp_reducer_t *r, int k, size_t *offset, size_t *count, size_t *state) {
    int n;
    if (!r) return DDP_ERR_INVALID_ARGUMENT;
    if ((n = ddp_reducer_num_shards(r, NULL)) < 0) return r->broken ? r->broken : DDP_ERR_INVALID_USAGE;
    if (k < 0 || k >= n)
        return _ddp_reducer_fail(r, DDP_ERR_INVALID_ARGUMENT, "shard %d: this rank has %d (0 .. %d)", k, n, n - 1);
    if (offset) *offset = r->shards[k].off;
    if (count) *count = r->shards[k].count;
    if (state) *state = r->shards[k].state;
    return DDP_SUCCESS;
}

/* A request of the reducer's, done: host requests are waited for; device ones are stream-ordered
 * (the communicator's sticky error says whether something failed). */
_DDP_PRIVATE ddp_result_t _ddp_reducer_wait_req(ddp_reducer_t *r, ddp_request_t *req) {
    ddp_result_t e = DDP_SUCCESS;
    if (!r->dev) return ddp_wait(req);
    ddp_comm_get_async_error(r->comm, &e);
    req->comm = NULL;
    req->id = 0;
    return e;
}

/* Bucket b's all-gather: in place (sendbuf = recvbuf + r rc, NCCL's layout); a tail through its
 * scratch, one element per rank (ranks past its count send a dummy nobody keeps). */
_DDP_PRIVATE ddp_result_t _ddp_reducer_gather_bucket(ddp_reducer_t *r, int b, unsigned char *params,
                                                    size_t es, ddp_dtype_t dtype) {
    _ddp_rbucket_t *bk = &r->buckets[b];
    const size_t me = (size_t)r->rank, P = (size_t)r->world;
    unsigned char *base = params + bk->lo * es;
    ddp_result_t e;
    bk->req.comm = NULL;
    bk->req.id = 0;
    if (!bk->tail) {
        size_t rc = bk->count / P;
        return ddp_all_gather_async(base + me * rc * es, base, rc, dtype, r->comm, &bk->req);
    }
    if (me < bk->count) _ddp_reducer_move(r, bk->scratch + me * es, base + me * es, es);
    e = ddp_all_gather_async(bk->scratch + me * es, bk->scratch, 1, dtype, r->comm, &bk->req);
    if (e == DDP_SUCCESS && r->dev) _ddp_reducer_move(r, base, bk->scratch, bk->count * es);
    return e;
}

DDP_API ddp_result_t ddp_reducer_all_gather_params(ddp_reducer_t *r, void *flat_params, ddp_dtype_t dtype) {
    size_t es = ddp_dtype_size(dtype);
    ddp_result_t e, first = DDP_SUCCESS;
    int b, done = 0, launched = 0;
    if (!r) return DDP_ERR_INVALID_ARGUMENT;
    if ((e = _ddp_reducer_close(r)) != DDP_SUCCESS) return e;
    if (!r->flat)
        return _ddp_reducer_fail(r, DDP_ERR_INVALID_USAGE, "all_gather_params: needs flat mode (flat_grads "
                                 "and zero_stage = 1)");
    if (!flat_params || !es)
        return _ddp_reducer_fail(r, DDP_ERR_INVALID_ARGUMENT, "all_gather_params: %s", !es ? "invalid dtype" :
                                 "NULL flat_params");
    if (r->in_iteration && !r->no_sync)
        return _ddp_reducer_fail(r, DDP_ERR_INVALID_USAGE, "all_gather_params during an iteration (%d "
                                 "gradients marked ready): call it after finish and the shard update", r->nready);
    if (!r->zero || r->world == 1) return DDP_SUCCESS;   /* every rank holds every parameter */
    if (ddp_comm_is_device(r->comm, flat_params) != r->dev)
        return _ddp_reducer_fail(r, DDP_ERR_INVALID_ARGUMENT, "all_gather_params: flat_params is %s memory, "
                                 "the gradients %s memory", r->dev ? "host" : "device", r->dev ? "device" : "host");
    r->iter_err = DDP_SUCCESS;
    for (b = 0; b < r->nbuckets; b++) {
        while (launched - done >= _DDP_REDUCER_MAX_INFLIGHT) {
            _ddp_rbucket_t *bk = &r->buckets[done++];
            if ((e = _ddp_reducer_wait_req(r, &bk->req)) != DDP_SUCCESS && first == DDP_SUCCESS) first = e;
            if (e == DDP_SUCCESS && bk->tail && !r->dev)
                memcpy((unsigned char *)flat_params + bk->lo * es, bk->scratch, bk->count * es);
        }
        if ((e = _ddp_reducer_gather_bucket(r, b, (unsigned char *)flat_params, es, dtype)) != DDP_SUCCESS) {
            if (first == DDP_SUCCESS) first = e;
            break;
        }
        launched++;
    }
    while (done < launched) {   /* the buffers are the library's until every request is done */
        _ddp_rbucket_t *bk = &r->buckets[done++];
        if ((e = _ddp_reducer_wait_req(r, &bk->req)) != DDP_SUCCESS && first == DDP_SUCCESS) first = e;
        if (e == DDP_SUCCESS && bk->tail && !r->dev)
            memcpy((unsigned char *)flat_params + bk->lo * es, bk->scratch, bk->count * es);
    }
    if (first == DDP_SUCCESS && r->iter_err != DDP_SUCCESS) first = r->iter_err;   /* a device copy */
    r->iter_err = DDP_SUCCESS;
    if (first != DDP_SUCCESS) {
        snprintf(r->err, sizeof r->err, "all_gather_params (%d of %d buckets launched): %.700s", launched,
                 r->nbuckets, ddp_comm_last_error(r->comm));
        return first;
    }
    return DDP_SUCCESS;
}
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
