/* SPDX-License-Identifier: MIT (see LICENSE) */
/* ddp_powersgd.h — PowerSGD gradient compression for the reducer (Vogels, Karimireddy, Jaggi,
 * "PowerSGD: Practical Low-Rank Gradient Compression for Distributed Optimization", NeurIPS
 * 2019), with the semantics of PyTorch's DDP comm hook
 * (torch/distributed/algorithms/ddp_comm_hooks/powerSGD_hook.py, powerSGD_hook). Each matrix
 * gradient M (rows x cols) is sent as two thin factors instead: P = M Q (rows x r) and
 * Q = M^T P (cols x r), r the matrix_approximation_rank, so a 1024 x 1024 layer at rank 2 sends
 * 4,096 numbers instead of 1,048,576. Error feedback adds what compression lost back into the
 * next step's gradient; warm start makes each step one more power iteration.
 *
 * A comm hook (ddp_reducer.h's comm_hook and comm_hook_done), built on the reducer's public calls
 * (ddp_reducer_num_buckets, ddp_reducer_bucket_info, ddp_reducer_param_info, ddp_reducer_rebuilt)
 * and the communicator's all-reduce. Users include ddp.h, which includes this. Depends on
 * ddp_reducer.h. Built by DDP_IMPLEMENTATION (or DDP_POWERSGD_IMPLEMENTATION).
 *
 *     ddp_powersgd_desc_t pd = {0};
 *     ddp_reducer_desc_t rd = {0};
 *     ddp_powersgd_t *ps;
 *     ddp_reducer_t *red;
 *     pd.matrix_approximation_rank = 2;
 *     pd.start_iter = 100;                              // plain averages for the first 100 steps
 *     ddp_powersgd_create(&ps, &pd, &rd);               // fills rd's comm_hook fields
 *     ddp_reducer_create(&red, comm, &rd);
 *     w1 = ddp_reducer_add_param(red, g_w1, 784 * 256, DDP_FLOAT32);   // as always
 *     b1 = ddp_reducer_add_param(red, g_b1, 256, DDP_FLOAT32);
 *     ddp_powersgd_bind(ps, red);
 *     ddp_powersgd_set_shape(ps, w1, 256, 784);          // rows x cols; b1 stays a vector
 *     ... training: grad_ready, finish, as without PowerSGD ...
 *     ddp_reducer_destroy(red);
 *     ddp_powersgd_destroy(ps);
 *
 * PER BUCKET, PER ITERATION (an iteration is one synchronised finish):
 *  1. Before start_iter: the plain average (one async all-reduce, as without a hook); also for
 *     buckets of dtypes other than float32/float64 and buckets with no matrix worth compressing.
 *  2. Error feedback: M += the error this rank kept from the last step (zero at first).
 *  3. Parameters with a shape (ddp_powersgd_set_shape) of rows > 1 and cols > 1 are matrices
 *     (PyTorch: tensor.view(shape[0], -1)); one is compressed if rows * cols > (rows + cols) *
 *     r * min_compression_rate, r = min(rank, rows, cols) (PyTorch's _should_compress). The
 *     others (vectors, small matrices) go uncompressed.
 *  4. Q (cols x r): warm start keeps last step's; the first time (every time without warm
 *     start) standard normal numbers seeded by (random_seed, step, bucket), the same on every
 *     rank. Q is orthogonalised, then P = M Q.
 *  5. ONE async SUM all-reduce of [the uncompressed tensors | every P], the request the reducer
 *     waits for (PyTorch issues two, one per part: one message carries the same sums).
 *  6. At finish (comm_hook_done): the uncompressed part / world into place; each P
 *     orthogonalised (Gram-Schmidt); Q = M^T P; ONE blocking SUM all-reduce of every Q; Q /=
 *     world; M = P Q^T into the bucket: the gradients hold that approximation of the average.
 *  7. Error feedback: error = (M + old error) - P Q^T, this rank's, for the next step.
 *
 * RULES
 *   - Create before ddp_reducer_create (it fills the desc's hook fields: leave them to it), bind
 *     right after it, shape parameters after registering them and before the first step.
 *   - start_iter >= 2 with error feedback or warm start (PyTorch refuses it too): the copy-mode
 *     reducer rebuilds its buckets after the first step, and the per-bucket state would not
 *     match. If the buckets are rebuilt later anyway (rank 0 did not mark every gradient in the
 *     first step), the state is dropped and built again (INFO line).
 *   - Memory, per bucket, allocated at its first compressed step and reused: the error (one
 *     number per compressed element, with error feedback), [uncompressed | P's] and the Q's.
 *     No allocation per step.
 *   - Costs: the second all-reduce (the Q's) waits at finish, after every bucket's first one,
 *     so less communication overlaps backward (and in copy mode the averages reach the
 *     gradients at finish); the products M Q, M^T P and P Q^T (rows x cols x r multiply-adds
 *     each) are plain C loops on the calling thread: a few ms for 1024 x 1024 at rank 4.
 *   - Copy and flat mode; not with ZeRO-1 (ddp_reducer_create refuses a comm hook there), not
 *     with device buffers (DDP_ERR_UNSUPPORTED at the first step: it needs kernels).
 *   - Differences from PyTorch: one all-reduce for the first round instead of two (same sums);
 *     the error of an uncompressed tensor is kept at zero (PyTorch keeps local - average, which
 *     sums to zero over the ranks, so it never changes an average; it only adds rounding); a
 *     zero column in Gram-Schmidt with epsilon 0 becomes zeros (PyTorch means to, its code gets
 *     NaN); Q's random numbers come from our own generator (splitmix64 of random_seed, the step
 *     and the bucket; Box-Muller), not torch.randn, so runs match PyTorch's in distribution only.
 *   - At the first step, and the first on a new communicator (ddp_reducer_rebind, elastic), the
 *     ranks agree on the step count (one 8-byte all-reduce: a joiner has none) and start the
 *     error feedback and warm start again together.
 *   - Errors: ddp_result_t; ddp_powersgd_last_error says why (failures inside a step also reach
 *     ddp_reducer_finish's result and ddp_comm_last_error). One thread at a time, as the reducer.
 */
#if defined(DDP_IMPLEMENTATION) && !defined(DDP_POWERSGD_IMPLEMENTATION)
#define DDP_POWERSGD_IMPLEMENTATION
#endif
#if defined(DDP_POWERSGD_IMPLEMENTATION)
#ifndef DDP_REDUCER_IMPLEMENTATION
#define DDP_REDUCER_IMPLEMENTATION
#endif
#endif
#include "ddp_reducer.h"

#ifndef DDP_POWERSGD_H_INCLUDED
#define DDP_POWERSGD_H_INCLUDED

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ddp_powersgd ddp_powersgd_t;
typedef struct ddp_powersgd_desc {       /* zero = PyTorch's defaults */
    int matrix_approximation_rank;       /* 0: 1 */
    int start_iter;                      /* 0: 1000 (start_powerSGD_iter); >= 2 with error feedback or warm start */
    double min_compression_rate;         /* 0: 2.0 */
    int no_error_feedback;               /* 1: use_error_feedback=False */
    int no_warm_start;                   /* 1: warm_start=False */
    double orthogonalization_epsilon;    /* 0: 0 (PyTorch's default) */
    uint64_t random_seed;                /* 0: 0 */
} ddp_powersgd_desc_t;
#define DDP_POWERSGD_DEFAULT_START_ITER 1000
/* Before ddp_reducer_create: fills rd->comm_hook, comm_hook_done, comm_hook_state (which must be
 * unset, as compression). DDP_ERR_INVALID_ARGUMENT (and *ps NULL) for NULL pointers, a negative
 * field, start_iter < 2 with error feedback or warm start, or a hook already in rd. */
DDP_API ddp_result_t ddp_powersgd_create(ddp_powersgd_t **ps, const ddp_powersgd_desc_t *d,
                                         ddp_reducer_desc_t *rd);
/* After ddp_reducer_create, before the first step: the reducer it serves (once). */
DDP_API ddp_result_t ddp_powersgd_bind(ddp_powersgd_t *ps, ddp_reducer_t *red);
/* A parameter's matrix shape (rows * cols == its count); parameters never shaped are vectors.
 * After bind and the parameter's add_param, before the first step. */
DDP_API ddp_result_t ddp_powersgd_set_shape(ddp_powersgd_t *ps, int param, size_t rows, size_t cols);
/* What went over the wire for gradients, as element counts: for the stats lines and benches.
 * iterations: steps seen; compressed_iterations: those at or after start_iter;
 * elements_uncompressed_equivalent: what plain averaging would have sent (every bucket's count);
 * elements_sent: what was sent (a compressed bucket: its uncompressed part + P's + Q's). */
typedef struct { uint64_t iterations, compressed_iterations, elements_uncompressed_equivalent,
                 elements_sent; } ddp_powersgd_stats_t;
DDP_API ddp_result_t ddp_powersgd_stats(const ddp_powersgd_t *ps, ddp_powersgd_stats_t *st);
DDP_API const char *ddp_powersgd_last_error(const ddp_powersgd_t *ps);   /* "" when none */
DDP_API void ddp_powersgd_destroy(ddp_powersgd_t *ps);   /* after ddp_reducer_destroy */

#ifdef __cplusplus
}
#endif
#endif /* DDP_POWERSGD_H_INCLUDED */

/* ============================================================================================
 * IMPLEMENTATION
 * ========================================================================================== */
#if defined(DDP_POWERSGD_IMPLEMENTATION) && !defined(DDP_POWERSGD_IMPL_INCLUDED)
#define DDP_POWERSGD_IMPL_INCLUDED
#ifndef DDP_REDUCER_IMPL_INCLUDED
#error "libddp: ddp_powersgd.h's implementation needs ddp_reducer.h's (define DDP_IMPLEMENTATION)"
#endif
#include <math.h>

typedef struct { size_t off, count, at; } _ddp_psgd_seg_t;   /* an uncompressed tensor: where */
typedef struct {                         /* a compressed matrix: where, its shape, its factors */
    size_t off, rows, cols, rank;        /* off: first element in the bucket */
    size_t p_at, q_at, e_at;             /* its P in send (after the segments), Q in q, error */
} _ddp_psgd_mat_t;

typedef struct {                         /* one bucket's state, from its first compressed step */
    int ready;                           /* laid out (segments, matrices, memory) */
    int plain;                           /* nothing to compress in it: plain averages */
    ddp_dtype_t dtype;
    size_t count;
    _ddp_psgd_seg_t *segs;
    _ddp_psgd_mat_t *mats;
    int nsegs, nmats;
    size_t nu, np, nq, ne;               /* elements: uncompressed, P's, Q's, error */
    unsigned char *send, *q, *err;       /* [uncompressed | P's], Q's, error (or NULL) */
    double *acc;                         /* Q = M^T P's sums: the largest cols x r */
    int q_valid;                         /* warm start: q holds last step's Q's */
    int pending;                         /* the hook sent its first round; done has not run */
    int err_stale;                       /* a step failed between hook and done: drop the error */
} _ddp_psgd_bucket_t;

struct ddp_powersgd {
    ddp_powersgd_desc_t d;               /* defaults filled in */
    ddp_reducer_t *red;
    int started;                         /* the first step began: shapes are fixed */
    int dev_checked, logged_start;
    int64_t iter;                        /* PyTorch's state.iter: steps seen by the hook */
    int iter_compressed;                 /* this step compressed a bucket */
    ddp_comm_t *comm;                    /* the communicator of the last step */
    size_t *rows, *cols;                 /* per parameter; 0: a vector */
    int nshapes;
    _ddp_psgd_bucket_t *b;
    int nb, layout_rebuilt;              /* buckets the state is for; ddp_reducer_rebuilt then */
    ddp_powersgd_stats_t st;
    char err[512];
};

_DDP_PRIVATE ddp_result_t _ddp_psgd_fail(ddp_powersgd_t *ps, ddp_result_t e, const char *fmt, ...)
#if defined(__GNUC__) || defined(__clang__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
_DDP_PRIVATE ddp_result_t _ddp_psgd_fail(ddp_powersgd_t *ps, ddp_result_t e, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ps->err, sizeof ps->err, fmt, ap);
    va_end(ap);
    return e;
}

/* A failure inside a step: also the communicator's last error, so finish's message names it. */
_DDP_PRIVATE ddp_result_t _ddp_psgd_step_fail(ddp_powersgd_t *ps, ddp_comm_t *comm, ddp_result_t e) {
    return ddp_comm_fail(comm, e, "powersgd: %s", ps->err);
}

/* splitmix64 (Steele, Lea, Flood, "Fast splittable pseudorandom number generators", OOPSLA
 * 2014): the seed stream, and each fill's numbers. */
_DDP_PRIVATE uint64_t _ddp_psgd_next(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Standard normal numbers by Box-Muller, from 53-bit uniforms in (0, 1]. */
_DDP_PRIVATE double _ddp_psgd_normal(uint64_t *s, double *spare, int *has_spare) {
    double u1, u2, m;
    if (*has_spare) { *has_spare = 0; return *spare; }
    u1 = ((double)(_ddp_psgd_next(s) >> 11) + 1.0) * (1.0 / 9007199254740992.0);
    u2 = (double)(_ddp_psgd_next(s) >> 11) * (1.0 / 9007199254740992.0);
    m = sqrt(-2.0 * log(u1));
    *spare = m * sin(6.283185307179586 * u2);
    *has_spare = 1;
    return m * cos(6.283185307179586 * u2);
}

/* The linear algebra, for float and double: P and Q are row-major (rows x r), (cols x r), as
 * PyTorch's views of its flat P and Q memory. Dot products accumulate in double. */
#define _DDP_PSGD_KERNELS(T, S)                                                                    \
    /* PyTorch's _orthogonalize_gram_schmidt: normalise column i (by its norm + eps), then remove   \
     * its projection from the columns after it. A zero column with eps == 0 becomes zeros. */    \
    _DDP_PRIVATE void _ddp_psgd_ortho_##S(T *a, size_t n, size_t r, double eps) {                 \
        size_t i, k, j;                                                                           \
        for (i = 0; i < r; i++) {                                                                 \
            double nrm = 0, inv;                                                                  \
            for (j = 0; j < n; j++) nrm += (double)a[j * r + i] * (double)a[j * r + i];           \
            nrm = sqrt(nrm);                                                                      \
            inv = eps == 0 ? (nrm > 0 ? 1.0 / nrm : 0.0) : 1.0 / (nrm + eps);                     \
            for (j = 0; j < n; j++) a[j * r + i] = (T)(a[j * r + i] * inv);                       \
            for (k = i + 1; k < r; k++) {                                                         \
                double dot = 0;                                                                   \
                for (j = 0; j < n; j++) dot += (double)a[j * r + i] * (double)a[j * r + k];       \
                for (j = 0; j < n; j++) a[j * r + k] = (T)(a[j * r + k] - dot * a[j * r + i]);    \
            }                                                                                     \
        }                                                                                         \
    }                                                                                             \
    /* P = M Q: each dot product in four partial sums (independent chains: the loop runs at    \
     * the multiply-add's throughput, not its latency) */                                        \
    _DDP_PRIVATE void _ddp_psgd_mq_##S(const T *m, size_t rows, size_t cols, const T *q, size_t r, \
                                       T *p) {                                                    \
        size_t i, j, k;                                                                           \
        for (i = 0; i < rows; i++) {                                                              \
            const T *mi = m + i * cols;                                                           \
            for (k = 0; k < r; k++) {                                                             \
                const T *qk = q + k;                                                              \
                double s0 = 0, s1 = 0, s2 = 0, s3 = 0;                                            \
                for (j = 0; j + 4 <= cols; j += 4) {                                              \
                    s0 += (double)mi[j] * (double)qk[j * r];                                      \
                    s1 += (double)mi[j + 1] * (double)qk[(j + 1) * r];                            \
                    s2 += (double)mi[j + 2] * (double)qk[(j + 2) * r];                            \
                    s3 += (double)mi[j + 3] * (double)qk[(j + 3) * r];                            \
                }                                                                                 \
                for (; j < cols; j++) s0 += (double)mi[j] * (double)qk[j * r];                   \
                p[i * r + k] = (T)((s0 + s1) + (s2 + s3));                                        \
            }                                                                                     \
        }                                                                                         \
    }                                                                                             \
    /* Q = M^T P, row by row of M (M is read once, in order); acc: cols x r doubles */            \
    _DDP_PRIVATE void _ddp_psgd_mtp_##S(const T *m, size_t rows, size_t cols, const T *p, size_t r, \
                                        T *q, double *acc) {                                      \
        size_t i, j, k;                                                                           \
        for (j = 0; j < cols * r; j++) acc[j] = 0;                                                \
        for (i = 0; i < rows; i++) {                                                              \
            const T *mi = m + i * cols, *pi = p + i * r;                                          \
            for (j = 0; j < cols; j++) {                                                          \
                double x = (double)mi[j];                                                         \
                for (k = 0; k < r; k++) acc[j * r + k] += x * (double)pi[k];                      \
            }                                                                                     \
        }                                                                                         \
        for (j = 0; j < cols * r; j++) q[j] = (T)acc[j];                                          \
    }                                                                                             \
    /* M = P Q^T */                                                                               \
    _DDP_PRIVATE void _ddp_psgd_pqt_##S(T *m, size_t rows, size_t cols, const T *p, const T *q,   \
                                        size_t r) {                                               \
        size_t i, j, k;                                                                           \
        for (i = 0; i < rows; i++)                                                                \
            for (j = 0; j < cols; j++) {                                                          \
                double s = 0;                                                                     \
                for (k = 0; k < r; k++) s += (double)p[i * r + k] * (double)q[j * r + k];         \
                m[i * cols + j] = (T)s;                                                           \
            }                                                                                     \
    }
_DDP_PSGD_KERNELS(float, f)
_DDP_PSGD_KERNELS(double, d)
#undef _DDP_PSGD_KERNELS

_DDP_PRIVATE void _ddp_psgd_free_bucket(_ddp_psgd_bucket_t *b) {
    DDP_FREE(b->segs);
    DDP_FREE(b->mats);
    DDP_FREE(b->send);
    DDP_FREE(b->q);
    DDP_FREE(b->err);
    DDP_FREE(b->acc);
    memset(b, 0, sizeof *b);
}

_DDP_PRIVATE void _ddp_psgd_free_buckets(ddp_powersgd_t *ps) {
    int k;
    for (k = 0; k < ps->nb; k++) _ddp_psgd_free_bucket(&ps->b[k]);
    DDP_FREE(ps->b);
    ps->b = NULL;
    ps->nb = 0;
}

/* The per-bucket state follows the reducer's buckets: sized at the first step, dropped once if
 * the reducer rebuilds them while compression runs (their contents would belong elsewhere). */
_DDP_PRIVATE ddp_result_t _ddp_psgd_sync_buckets(ddp_powersgd_t *ps, ddp_comm_t *comm) {
    int rebuilt = ddp_reducer_rebuilt(ps->red), nb;
    if (ps->b && rebuilt == ps->layout_rebuilt) return DDP_SUCCESS;
    if (ps->b) {
        int k, had = 0;
        for (k = 0; k < ps->nb; k++) had |= ps->b[k].ready && !ps->b[k].plain;
        if (had)
            ddp_comm_log(comm, DDP_LOG_INFO, "powersgd: the reducer rebuilt its buckets: the error "
                         "feedback and warm-start state starts again");
    }
    _ddp_psgd_free_buckets(ps);
    nb = ddp_reducer_num_buckets(ps->red);
    if (nb < 1)
        return _ddp_psgd_fail(ps, DDP_ERR_INVALID_USAGE, "the bound reducer has no buckets: %s",
                              ddp_reducer_last_error(ps->red));
    ps->b = (_ddp_psgd_bucket_t *)DDP_MALLOC(sizeof *ps->b * (size_t)nb);
    if (!ps->b) return _ddp_psgd_fail(ps, DDP_ERR_OUT_OF_MEMORY, "no memory for %d buckets' state", nb);
    memset(ps->b, 0, sizeof *ps->b * (size_t)nb);
    ps->nb = nb;
    ps->layout_rebuilt = rebuilt;
    return DDP_SUCCESS;
}

/* One tensor of a bucket: a matrix worth compressing (PyTorch's _should_compress: (rows + cols)
 * r * min_compression_rate < rows cols, r = min(rank, rows, cols)) or an uncompressed segment.
 * Returns cols * r for a matrix (its Q's size), else 0. */
_DDP_PRIVATE size_t _ddp_psgd_classify(ddp_powersgd_t *ps, _ddp_psgd_bucket_t *b, int id, size_t es) {
    size_t off = 0, cnt = 0, rows = 0, cols = 0, r = (size_t)ps->d.matrix_approximation_rank;
    int bk = -1;
    ddp_reducer_param_info(ps->red, id, &bk, &off, &cnt);
    off /= es;
    if (id < ps->nshapes) { rows = ps->rows[id]; cols = ps->cols[id]; }
    if (r > rows) r = rows;
    if (r > cols) r = cols;
    if (rows > 1 && cols > 1 &&
        (double)(rows + cols) * (double)r * ps->d.min_compression_rate < (double)rows * (double)cols) {
        _ddp_psgd_mat_t *m = &b->mats[b->nmats++];
        m->off = off;
        m->rows = rows;
        m->cols = cols;
        m->rank = r;
        m->p_at = b->np;     /* among the P's; the segments come first (added later) */
        m->q_at = b->nq;
        m->e_at = b->ne;
        b->np += rows * r;
        b->nq += cols * r;
        b->ne += rows * cols;
        return cols * r;
    } else {
        _ddp_psgd_seg_t *sg = &b->segs[b->nsegs++];
        sg->off = off;
        sg->count = cnt;
        sg->at = b->nu;
        b->nu += cnt;
        return 0;
    }
}

/* A bucket with matrices: [uncompressed | P's], the Q's, Q = M^T P's sums, the error. */
_DDP_PRIVATE ddp_result_t _ddp_psgd_alloc(ddp_powersgd_t *ps, _ddp_psgd_bucket_t *b, int k, size_t qacc) {
    const size_t es = ddp_dtype_size(b->dtype);
    b->send = (unsigned char *)DDP_MALLOC((b->nu + b->np) * es);
    b->q = (unsigned char *)DDP_MALLOC(b->nq * es);
    b->acc = (double *)DDP_MALLOC(qacc * sizeof(double));
    b->err = ps->d.no_error_feedback ? NULL : (unsigned char *)DDP_MALLOC(b->ne * es);
    if (!b->send || !b->q || !b->acc || (!ps->d.no_error_feedback && !b->err)) {
        _ddp_psgd_free_bucket(b);
        return _ddp_psgd_fail(ps, DDP_ERR_OUT_OF_MEMORY, "no memory for bucket %d's factors (%zu + %zu "
                              "elements)", k, b->nu + b->np, b->nq);
    }
    if (b->err) memset(b->err, 0, b->ne * es);   /* error feedback starts at zero */
    return DDP_SUCCESS;
}

/* Bucket k's tensors, sorted into uncompressed segments and compressed matrices (PyTorch's
 * Step I), and its memory. Once per bucket (per layout), at its first compressed step. */
_DDP_PRIVATE ddp_result_t _ddp_psgd_layout(ddp_powersgd_t *ps, ddp_comm_t *comm, int k, size_t count,
                                           ddp_dtype_t dtype) {
    _ddp_psgd_bucket_t *b = &ps->b[k];
    int n = ddp_reducer_bucket_info(ps->red, k, NULL, 0, NULL, NULL), *ids, j;
    size_t qacc = 0, sent;
    if (n < 1) return _ddp_psgd_fail(ps, DDP_ERR_INVALID_USAGE, "bucket %d: %s", k, ddp_reducer_last_error(ps->red));
    ids = (int *)DDP_MALLOC(sizeof *ids * (size_t)n);
    b->segs = (_ddp_psgd_seg_t *)DDP_MALLOC(sizeof *b->segs * (size_t)n);
    b->mats = (_ddp_psgd_mat_t *)DDP_MALLOC(sizeof *b->mats * (size_t)n);
    if (!ids || !b->segs || !b->mats) {
        DDP_FREE(ids);
        _ddp_psgd_free_bucket(b);
        return _ddp_psgd_fail(ps, DDP_ERR_OUT_OF_MEMORY, "no memory for bucket %d's layout", k);
    }
    ddp_reducer_bucket_info(ps->red, k, ids, n, NULL, NULL);
    b->dtype = dtype;
    b->count = count;
    for (j = 0; j < n; j++) {
        size_t qn = _ddp_psgd_classify(ps, b, ids[j], ddp_dtype_size(dtype));
        if (qn > qacc) qacc = qn;
    }
    DDP_FREE(ids);
    b->ready = 1;
    b->plain = !b->nmats;   /* nothing worth compressing: the plain average (the same sums) */
    sent = b->nu + b->np + b->nq;
    ddp_comm_log(comm, DDP_LOG_INFO, "powersgd: bucket %d: %d of %d tensors compressed (rank %d), %zu "
                 "elements -> %zu per step (%.1fx)%s", k, b->nmats, n, ps->d.matrix_approximation_rank,
                 count, sent, (double)count / (double)sent, b->plain ? ": plain averages" : "");
    if (b->plain) return DDP_SUCCESS;
    for (j = 0; j < b->nmats; j++) b->mats[j].p_at += b->nu;
    return _ddp_psgd_alloc(ps, b, k, qacc);
}

/* Fresh Q's: standard normal, the same on every rank. PyTorch seeds each fill with
 * state.rng.randint(...), a stream seeded by random_seed; here the fill's seed is a function of
 * (random_seed, step, bucket), so a rank that joins later (elastic) draws what the others draw. */
_DDP_PRIVATE void _ddp_psgd_random_q(ddp_powersgd_t *ps, _ddp_psgd_bucket_t *b, int k) {
    uint64_t x = ps->d.random_seed ^ (uint64_t)ps->iter * 0x9E3779B97F4A7C15ull ^
                 ((uint64_t)k + 1) * 0xD1B54A32D192ED03ull, s = _ddp_psgd_next(&x);
    double spare = 0;
    int has = 0;
    size_t i;
    for (i = 0; i < b->nq; i++) {
        double z = _ddp_psgd_normal(&s, &spare, &has);
        if (b->dtype == DDP_FLOAT32) ((float *)(void *)b->q)[i] = (float)z;
        else ((double *)(void *)b->q)[i] = z;
    }
}

/* Element i of a float32 or float64 array, through double: for +, -, / of two floats the
 * double result rounded to float is the float operation's own (53 >= 2 * 24 + 2 bits). */
static inline double _ddp_psgd_get(const unsigned char *a, int f32, size_t i) {
    return f32 ? (double)((const float *)(const void *)a)[i] : ((const double *)(const void *)a)[i];
}
static inline void _ddp_psgd_set(unsigned char *a, int f32, size_t i, double v) {
    if (f32) ((float *)(void *)a)[i] = (float)v;
    else ((double *)(void *)a)[i] = v;
}

/* Error feedback: M += error; the error memory keeps M (PyTorch's input_tensor_cp). */
_DDP_PRIVATE void _ddp_psgd_add_error(const _ddp_psgd_bucket_t *b, const _ddp_psgd_mat_t *m, unsigned char *buf) {
    const int f32 = b->dtype == DDP_FLOAT32;
    const size_t n = m->rows * m->cols, es = f32 ? 4 : 8;
    unsigned char *x = buf + m->off * es, *e = b->err + m->e_at * es;
    size_t i;
    for (i = 0; i < n; i++) {
        double v = _ddp_psgd_get(x, f32, i) + _ddp_psgd_get(e, f32, i);
        _ddp_psgd_set(x, f32, i, v);
        _ddp_psgd_set(e, f32, i, _ddp_psgd_get(x, f32, i));
    }
}

/* Q orthogonalised (PyTorch orthogonalises warm and fresh Q's alike), then P = M Q. */
_DDP_PRIVATE void _ddp_psgd_project(const _ddp_psgd_bucket_t *b, const _ddp_psgd_mat_t *m,
                                    const unsigned char *buf, double eps) {
    if (b->dtype == DDP_FLOAT32) {
        float *q = (float *)(void *)b->q + m->q_at;
        _ddp_psgd_ortho_f(q, m->cols, m->rank, eps);
        _ddp_psgd_mq_f((const float *)(const void *)buf + m->off, m->rows, m->cols, q, m->rank,
                       (float *)(void *)b->send + m->p_at);
    } else {
        double *q = (double *)(void *)b->q + m->q_at;
        _ddp_psgd_ortho_d(q, m->cols, m->rank, eps);
        _ddp_psgd_mq_d((const double *)(const void *)buf + m->off, m->rows, m->cols, q, m->rank,
                       (double *)(void *)b->send + m->p_at);
    }
}

/* The summed P orthogonalised (not divided by the world size: orthogonalisation normalises it
 * anyway, as PyTorch's compute_qs), then Q = M^T P. */
_DDP_PRIVATE void _ddp_psgd_back_project(const _ddp_psgd_bucket_t *b, const _ddp_psgd_mat_t *m,
                                         const unsigned char *buf, double eps) {
    if (b->dtype == DDP_FLOAT32) {
        float *p = (float *)(void *)b->send + m->p_at;
        _ddp_psgd_ortho_f(p, m->rows, m->rank, eps);
        _ddp_psgd_mtp_f((const float *)(const void *)buf + m->off, m->rows, m->cols, p, m->rank,
                        (float *)(void *)b->q + m->q_at, b->acc);
    } else {
        double *p = (double *)(void *)b->send + m->p_at;
        _ddp_psgd_ortho_d(p, m->rows, m->rank, eps);
        _ddp_psgd_mtp_d((const double *)(const void *)buf + m->off, m->rows, m->cols, p, m->rank,
                        (double *)(void *)b->q + m->q_at, b->acc);
    }
}

/* The summed Q / world; M = P Q^T into the bucket; error = (M + old error) - P Q^T. */
_DDP_PRIVATE void _ddp_psgd_decompress(const _ddp_psgd_bucket_t *b, const _ddp_psgd_mat_t *m,
                                       unsigned char *buf, int world) {
    const int f32 = b->dtype == DDP_FLOAT32;
    const size_t es = f32 ? 4 : 8, n = m->rows * m->cols;
    unsigned char *q = b->q + m->q_at * es, *x = buf + m->off * es;
    size_t i;
    for (i = 0; i < m->cols * m->rank; i++) _ddp_psgd_set(q, f32, i, _ddp_psgd_get(q, f32, i) / world);
    if (f32)
        _ddp_psgd_pqt_f((float *)(void *)x, m->rows, m->cols, (const float *)(const void *)b->send + m->p_at,
                        (const float *)(const void *)q, m->rank);
    else
        _ddp_psgd_pqt_d((double *)(void *)x, m->rows, m->cols, (const double *)(const void *)b->send + m->p_at,
                        (const double *)(const void *)q, m->rank);
    if (b->err)
        for (i = 0; i < n; i++) {
            unsigned char *e = b->err + m->e_at * es;
            _ddp_psgd_set(e, f32, i, _ddp_psgd_get(e, f32, i) - _ddp_psgd_get(x, f32, i));
        }
}

/* The first round (PyTorch's powerSGD_hook up to its first all-reduce): error feedback, the
 * Q's (warm or fresh), P = M Q, the uncompressed tensors packed before the P's, one async SUM
 * all-reduce of the lot. */
_DDP_PRIVATE ddp_result_t _ddp_psgd_first_round(ddp_powersgd_t *ps, ddp_comm_t *comm, int k,
                                                unsigned char *buf, ddp_request_t *req) {
    _ddp_psgd_bucket_t *b = &ps->b[k];
    const size_t es = ddp_dtype_size(b->dtype);
    int j;
    if (b->err && (b->pending || b->err_stale)) memset(b->err, 0, b->ne * es);   /* a step failed */
    b->err_stale = 0;
    if (b->err)
        for (j = 0; j < b->nmats; j++) _ddp_psgd_add_error(b, &b->mats[j], buf);
    if (!b->q_valid || ps->d.no_warm_start) _ddp_psgd_random_q(ps, b, k);
    b->q_valid = 1;
    for (j = 0; j < b->nmats; j++) _ddp_psgd_project(b, &b->mats[j], buf, ps->d.orthogonalization_epsilon);
    for (j = 0; j < b->nsegs; j++)
        memcpy(b->send + b->segs[j].at * es, buf + b->segs[j].off * es, b->segs[j].count * es);
    /* PyTorch all-reduces the uncompressed tensors and the P's in two calls, one after the
     * other; one call of both sends the same sums in one message instead of two. */
    return ddp_all_reduce_async(b->send, b->send, b->nu + b->np, b->dtype, DDP_SUM, comm, req);
}

/* A new communicator (the first step, or ddp_reducer_rebind after a shrink or a grow): the
 * ranks agree on the step count (a joiner's fresh state has none: the MAX is the members') in
 * one small all-reduce, issued at bucket 0's launch, the same point everywhere; the per-bucket
 * state is dropped on every rank alike (a joiner has none to offer), so error feedback and warm
 * start begin again. */
_DDP_PRIVATE ddp_result_t _ddp_psgd_new_comm(ddp_powersgd_t *ps, ddp_comm_t *comm) {
    int64_t it = ps->iter;
    ddp_result_t e;
    if (ps->comm)
        ddp_comm_log(comm, DDP_LOG_INFO, "powersgd: a new communicator (%d ranks): the error feedback "
                     "and warm-start state starts again", ddp_comm_size(comm));
    _ddp_psgd_free_buckets(ps);
    if ((e = ddp_all_reduce(&it, &it, 1, DDP_INT64, DDP_MAX, comm)) != DDP_SUCCESS)
        return _ddp_psgd_fail(ps, e, "agreeing on the step count: %s", ddp_comm_last_error(comm));
    ps->iter = it;
    ps->comm = comm;
    return DDP_SUCCESS;
}

/* Before the first step of a bucket: bound, host memory, the per-bucket state in step with
 * the reducer's buckets and communicator. */
_DDP_PRIVATE ddp_result_t _ddp_psgd_check(ddp_powersgd_t *ps, ddp_comm_t *comm, int k, const void *buf) {
    ddp_result_t e;
    if (!ps->red)
        return _ddp_psgd_fail(ps, DDP_ERR_INVALID_USAGE, "not bound: call ddp_powersgd_bind(ps, reducer) "
                              "after ddp_reducer_create");
    ps->started = 1;
    if (!ps->dev_checked) {
        if (ddp_comm_is_device(comm, buf))
            return _ddp_psgd_fail(ps, DDP_ERR_UNSUPPORTED, "the buckets are device memory: PowerSGD's "
                                  "matrix products need GPU kernels (not here); use host gradients");
        ps->dev_checked = 1;
    }
    if (k == 0 && comm != ps->comm && (e = _ddp_psgd_new_comm(ps, comm)) != DDP_SUCCESS) return e;
    if ((e = _ddp_psgd_sync_buckets(ps, comm)) != DDP_SUCCESS) return e;
    if (k < 0 || k >= ps->nb) return _ddp_psgd_fail(ps, DDP_ERR_INVALID_USAGE, "bucket %d of %d", k, ps->nb);
    return DDP_SUCCESS;
}

/* The comm hook: the bucket's first round, or its plain average. */
_DDP_PRIVATE ddp_result_t _ddp_psgd_hook(void *state, ddp_comm_t *comm, int k, void *buf, size_t count,
                                         ddp_dtype_t dtype, ddp_request_t *req) {
    ddp_powersgd_t *ps = (ddp_powersgd_t *)state;
    _ddp_psgd_bucket_t *b;
    ddp_result_t e;
    int compress;
    if ((e = _ddp_psgd_check(ps, comm, k, buf)) != DDP_SUCCESS) return _ddp_psgd_step_fail(ps, comm, e);
    b = &ps->b[k];
    compress = ps->iter >= ps->d.start_iter && (dtype == DDP_FLOAT32 || dtype == DDP_FLOAT64);
    if (compress && !ps->logged_start) {
        ps->logged_start = 1;
        ddp_comm_log(comm, DDP_LOG_INFO, "powersgd: compressing from step %lld on (rank %d, min "
                     "compression rate %g, error feedback %s, warm start %s)", (long long)ps->iter,
                     ps->d.matrix_approximation_rank, ps->d.min_compression_rate,
                     ps->d.no_error_feedback ? "off" : "on", ps->d.no_warm_start ? "off" : "on");
    }
    if (compress && !b->ready && (e = _ddp_psgd_layout(ps, comm, k, count, dtype)) != DDP_SUCCESS)
        return _ddp_psgd_step_fail(ps, comm, e);
    compress = compress && !b->plain;
    ps->st.elements_uncompressed_equivalent += count;
    ps->st.elements_sent += compress ? b->nu + b->np + b->nq : count;
    if (compress) {
        ps->iter_compressed = 1;
        e = _ddp_psgd_first_round(ps, comm, k, (unsigned char *)buf, req);
        b->pending = e == DDP_SUCCESS;
        if (e != DDP_SUCCESS) b->err_stale = 1;   /* the error memory holds M, not the error */
    } else {
        b->pending = 0;
        e = ddp_all_reduce_async(buf, buf, count, dtype, DDP_AVG, comm, req);
    }
    if (k == ps->nb - 1) {   /* PyTorch's maybe_increase_iter: the last bucket of a step counts it */
        ps->st.iterations++;
        if (ps->iter_compressed) ps->st.compressed_iterations++;
        ps->iter_compressed = 0;
        ps->iter++;
    }
    return e;
}

/* At finish, after the first round completed (PyTorch's unpack_uncompressed_tensors_and_
 * allreduce_ps, compute_qs and decompress). */
_DDP_PRIVATE ddp_result_t _ddp_psgd_done(void *state, ddp_comm_t *comm, int k, void *bufv, size_t count,
                                         ddp_dtype_t dtype) {
    ddp_powersgd_t *ps = (ddp_powersgd_t *)state;
    _ddp_psgd_bucket_t *b;
    unsigned char *buf = (unsigned char *)bufv;
    const int world = ddp_comm_size(comm), f32 = dtype == DDP_FLOAT32;
    const size_t es = ddp_dtype_size(dtype);
    size_t i;
    ddp_result_t e;
    int j;
    (void)count;
    if (!ps->b || k < 0 || k >= ps->nb || !ps->b[k].pending) return DDP_SUCCESS;   /* plain */
    b = &ps->b[k];
    b->pending = 0;
    for (j = 0; j < b->nsegs; j++) {   /* the uncompressed average, into place */
        const _ddp_psgd_seg_t *sg = &b->segs[j];
        for (i = 0; i < sg->count; i++)
            _ddp_psgd_set(buf + sg->off * es, f32, i, _ddp_psgd_get(b->send + sg->at * es, f32, i) / world);
    }
    for (j = 0; j < b->nmats; j++) _ddp_psgd_back_project(b, &b->mats[j], buf, ps->d.orthogonalization_epsilon);
    /* Blocking: it queues behind the buckets still in flight, and every rank issues it at the
     * same point (the reducer runs comm_hook_done at finish, in bucket order). */
    if ((e = ddp_all_reduce(b->q, b->q, b->nq, dtype, DDP_SUM, comm)) != DDP_SUCCESS) {
        b->err_stale = 1;
        b->q_valid = 0;
        return e;   /* the communicator says what failed */
    }
    for (j = 0; j < b->nmats; j++) _ddp_psgd_decompress(b, &b->mats[j], buf, world);
    return DDP_SUCCESS;
}

DDP_API ddp_result_t ddp_powersgd_create(ddp_powersgd_t **out, const ddp_powersgd_desc_t *desc,
                                         ddp_reducer_desc_t *rd) {
    ddp_powersgd_t *ps;
    ddp_powersgd_desc_t d;
    if (out) *out = NULL;
    if (!out || !rd) return DDP_ERR_INVALID_ARGUMENT;
    memset(&d, 0, sizeof d);
    if (desc) d = *desc;
    if (d.matrix_approximation_rank < 0 || d.start_iter < 0 || d.min_compression_rate < 0 ||
        d.orthogonalization_epsilon < 0 || rd->comm_hook || rd->comm_hook_done ||
        rd->compression != DDP_COMPRESS_NONE)
        return DDP_ERR_INVALID_ARGUMENT;
    if (!d.matrix_approximation_rank) d.matrix_approximation_rank = 1;
    if (!d.start_iter) d.start_iter = DDP_POWERSGD_DEFAULT_START_ITER;
    if (d.min_compression_rate == 0) d.min_compression_rate = 2.0;
    /* PyTorch's PowerSGDState refuses start_powerSGD_iter <= 1 with either: the buckets are
     * rebuilt after the first step, and memorised errors and Q's would not fit them. */
    if ((!d.no_error_feedback || !d.no_warm_start) && d.start_iter < 2) return DDP_ERR_INVALID_ARGUMENT;
    ps = (ddp_powersgd_t *)DDP_MALLOC(sizeof *ps);
    if (!ps) return DDP_ERR_OUT_OF_MEMORY;
    memset(ps, 0, sizeof *ps);
    ps->d = d;
    rd->comm_hook = _ddp_psgd_hook;
    rd->comm_hook_done = _ddp_psgd_done;
    rd->comm_hook_state = ps;
    *out = ps;
    return DDP_SUCCESS;
}

DDP_API ddp_result_t ddp_powersgd_bind(ddp_powersgd_t *ps, ddp_reducer_t *red) {
    if (!ps) return DDP_ERR_INVALID_ARGUMENT;
    if (!red) return _ddp_psgd_fail(ps, DDP_ERR_INVALID_ARGUMENT, "bind: NULL reducer");
    if (ps->red)
        return _ddp_psgd_fail(ps, DDP_ERR_INVALID_USAGE, "bind: already bound to a reducer (one "
                              "PowerSGD state per reducer)");
    ps->red = red;
    ps->err[0] = 0;
    return DDP_SUCCESS;
}

DDP_API ddp_result_t ddp_powersgd_set_shape(ddp_powersgd_t *ps, int param, size_t rows, size_t cols) {
    size_t count = 0;
    if (!ps) return DDP_ERR_INVALID_ARGUMENT;
    if (!ps->red)
        return _ddp_psgd_fail(ps, DDP_ERR_INVALID_USAGE, "set_shape: bind the reducer first (the shape is "
                              "checked against the parameter's count)");
    if (ps->started)
        return _ddp_psgd_fail(ps, DDP_ERR_INVALID_USAGE, "set_shape(%d) after the first step: shapes are "
                              "fixed once the buckets are compressed; set them before training", param);
    if (param < 0 || ddp_reducer_param_info(ps->red, param, NULL, NULL, &count) != DDP_SUCCESS)
        return _ddp_psgd_fail(ps, DDP_ERR_INVALID_ARGUMENT, "set_shape: parameter %d is not registered "
                              "with the reducer", param);
    if (!rows || !cols || rows > count / cols || rows * cols != count)
        return _ddp_psgd_fail(ps, DDP_ERR_INVALID_ARGUMENT, "set_shape: parameter %d has %zu elements, not "
                              "%zu x %zu", param, count, rows, cols);
    if (param >= ps->nshapes) {
        int n = ps->nshapes ? ps->nshapes : 16;
        size_t *nr, *nc;
        while (n <= param) n *= 2;
        nr = (size_t *)DDP_MALLOC(sizeof *nr * (size_t)n);
        nc = (size_t *)DDP_MALLOC(sizeof *nc * (size_t)n);
        if (!nr || !nc) {
            DDP_FREE(nr);
            DDP_FREE(nc);
            return _ddp_psgd_fail(ps, DDP_ERR_OUT_OF_MEMORY, "set_shape(%d)", param);
        }
        memset(nr, 0, sizeof *nr * (size_t)n);
        memset(nc, 0, sizeof *nc * (size_t)n);
        if (ps->nshapes) {
            memcpy(nr, ps->rows, sizeof *nr * (size_t)ps->nshapes);
            memcpy(nc, ps->cols, sizeof *nc * (size_t)ps->nshapes);
        }
        DDP_FREE(ps->rows);
        DDP_FREE(ps->cols);
        ps->rows = nr;
        ps->cols = nc;
        ps->nshapes = n;
    }
    ps->rows[param] = rows;
    ps->cols[param] = cols;
    return DDP_SUCCESS;
}

DDP_API ddp_result_t ddp_powersgd_stats(const ddp_powersgd_t *ps, ddp_powersgd_stats_t *st) {
    if (!ps || !st) return DDP_ERR_INVALID_ARGUMENT;
    *st = ps->st;
    return DDP_SUCCESS;
}

DDP_API const char *ddp_powersgd_last_error(const ddp_powersgd_t *ps) {
    return ps ? ps->err : "NULL PowerSGD state";
}

DDP_API void ddp_powersgd_destroy(ddp_powersgd_t *ps) {
    if (!ps) return;
    _ddp_psgd_free_buckets(ps);
    DDP_FREE(ps->rows);
    DDP_FREE(ps->cols);
    DDP_FREE(ps);
}

#endif /* DDP_POWERSGD_IMPLEMENTATION */
