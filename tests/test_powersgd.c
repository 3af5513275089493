/* SPDX-License-Identifier: MIT (see LICENSE) */
/* tests/test_powersgd.c — PowerSGD gradient compression on the reducer (ddp_powersgd.h). TAP.
 *
 *   build/test_powersgd          (DDP_TEST_ONLY=<scenario> runs one)
 *
 * Scenarios:
 *   reference  the low-rank step against a naive reference written here (each rank simulates
 *              every rank: error feedback, the same Q's from the documented generator,
 *              Gram-Schmidt, P = M Q summed, Q = M^T P summed / world, P Q^T): copy and flat
 *              mode, float32 and float64, two buckets, p = 1, 2, 3; the steps before start_iter
 *              equal the plain average (an all-reduce of each bucket) bit for bit.
 *   plain      the steps before start_iter against a reducer without the hook: bitwise equal.
 *   feedback   a constant gradient of rank 3 compressed at rank 1: with error feedback the
 *              applied updates add up to k times the gradient (the error stays bounded); without
 *              it they do not.
 *   warm       warm start: a rank-1 gradient is recovered exactly at once; a rank-2 one converges
 *              to its best rank-1 approximation (error = the second singular value); without warm
 *              start it does not.
 *   rate       min_compression_rate: a matrix that would not compress goes uncompressed (the
 *              exact average); a bucket with nothing to compress is the plain average; the stats.
 *   done       the reducer runs comm_hook_done at the same point on every rank even when the
 *              ranks mark in orders that complete the buckets at different grad_ready calls
 *              (PowerSGD's second all-reduce is issued there).
 *   misuse     bad arguments, start_iter < 2 with error feedback or warm start, bind twice,
 *              shapes that do not fit, set_shape after the first step, ZeRO-1 refused.
 *   rejoin     elastic: after 4 steps (2 compressed) the ranks move to a new communicator with
 *              ddp_reducer_rebind, rank 2 with a fresh reducer and PowerSGD state (a joiner's);
 *              the ranks agree on the step count and start error feedback and warm start again
 *              together: the next steps equal the reference (reset there) on every rank.
 *   device     the fake NCCL and CUDA runtime (tests/fake_nccl; skipped when not built): device
 *              gradients refused at the first step (DDP_ERR_UNSUPPORTED, saying why) on every
 *              rank, nobody hangs.
 */
#define _GNU_SOURCE
#include "ddp.h"
#include "transports/ddp_tcp.h"
#include "tests/ddp_test.h"
#include "tests/ddp_test_device.h"

#include <math.h>

static ddp_comm_t *init_comm(int rank, int p) {
    ddp_comm_desc_t d;
    ddp_comm_t *c = NULL;
    ddp_result_t r;
    setenv("DDP_TRANSPORT", "tcp", 1);
    t_desc(&d, 20000);
    d.log_level = 1;
    t_where("ddp_comm_init");
    r = ddp_comm_init(&c, p, rank, &d);
    if (!ok(r == DDP_SUCCESS, "ddp_comm_init rank %d of %d -> %s %s", rank, p, ddp_strerror(r),
            r ? ddp_last_init_error() : ""))
        return NULL;
    return c;
}

/* A value in [-1, 1) from (a, b, c, d): the test's gradients. */
static double val(uint64_t a, uint64_t b, uint64_t c, uint64_t d) {
    uint64_t x = a * 0x9E3779B97F4A7C15ull ^ (b + 0x632BE59BD9B4E019ull) * 0xBF58476D1CE4E5B9ull ^
                 (c + 7) * 0x94D049BB133111EBull ^ (d + 13) * 0xD6E8FEB86659FD93ull;
    x ^= x >> 31;
    x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 29;
    return (double)(x >> 11) / 4503599627370496.0 - 1.0;
}

/* ---------------------------------------------------------------- the model
 * W1 12x9, b1 12, W2 3x4 (too small to compress at rank >= 1), W3 20x16, b3 20; with these bucket
 * limits two buckets: {b3, W3} and {W2, b1, W1}. */
#define NP 5
static const size_t rows_of[NP] = {12, 12, 3, 20, 20}, cols_of[NP] = {9, 1, 4, 16, 1};
static const int shaped[NP] = {1, 0, 1, 1, 0};
#define TOTAL (108 + 12 + 12 + 320 + 20)

typedef struct {
    int f32, flat, rank_r, start, steps;
    int no_ef, no_warm;
    double rate;
    int elastic;
} cfg_t;

typedef struct {                 /* the reducer under test, its gradients */
    ddp_reducer_t *r;
    ddp_powersgd_t *ps;
    void *flat;                  /* flat mode: every gradient; else NULL */
    void *g[NP];
    size_t off[NP];
} net_t;

static size_t count_of(int k) { return rows_of[k] * cols_of[k]; }

static double get(const cfg_t *c, const void *g, size_t i) {
    return c->f32 ? (double)((const float *)g)[i] : ((const double *)g)[i];
}
static void put(const cfg_t *c, void *g, size_t i, double v) {
    if (c->f32) ((float *)g)[i] = (float)v; else ((double *)g)[i] = v;
}

static int net_make(net_t *n, ddp_comm_t *comm, const cfg_t *c, int with_psgd) {
    ddp_reducer_desc_t rd;
    ddp_powersgd_desc_t pd;
    const size_t es = c->f32 ? 4 : 8;
    size_t at = 0;
    int k;
    memset(n, 0, sizeof *n);
    memset(&rd, 0, sizeof rd);
    memset(&pd, 0, sizeof pd);
    rd.first_bucket_bytes = 64 * es;
    rd.elastic = c->elastic;
    rd.bucket_cap_bytes = 256 * es;
    if (c->flat) {
        n->flat = calloc(TOTAL, es);
        rd.flat_grads = n->flat;
        rd.flat_bytes = TOTAL * es;
    }
    pd.matrix_approximation_rank = c->rank_r;
    pd.start_iter = c->start;
    pd.no_error_feedback = c->no_ef;
    pd.no_warm_start = c->no_warm;
    pd.min_compression_rate = c->rate;
    pd.random_seed = 42;
    if (with_psgd && ddp_powersgd_create(&n->ps, &pd, &rd) != DDP_SUCCESS) return -1;
    if (ddp_reducer_create(&n->r, comm, &rd) != DDP_SUCCESS) return -1;
    for (k = 0; k < NP; k++) {
        n->off[k] = at;
        n->g[k] = c->flat ? (unsigned char *)n->flat + at * es : calloc(count_of(k), es);
        at += count_of(k);
        if (ddp_reducer_add_param(n->r, n->g[k], count_of(k), c->f32 ? DDP_FLOAT32 : DDP_FLOAT64) != k) return -1;
    }
    if (!with_psgd) return 0;
    if (ddp_powersgd_bind(n->ps, n->r) != DDP_SUCCESS) return -1;
    for (k = 0; k < NP; k++)
        if (shaped[k] && ddp_powersgd_set_shape(n->ps, k, rows_of[k], cols_of[k]) != DDP_SUCCESS) return -1;
    return 0;
}

static void net_free(net_t *n, const cfg_t *c) {
    int k;
    ddp_reducer_destroy(n->r);
    ddp_powersgd_destroy(n->ps);
    if (c->flat) free(n->flat);
    else for (k = 0; k < NP; k++) free(n->g[k]);
}

/* One step: this rank's gradients from gen, marked in reverse order (the buckets stay in
 * reverse registration order after the rebuild), finish. */
typedef double (*gen_fn)(int rank, int step, int k, size_t i, void *arg);
static ddp_result_t net_step(net_t *n, const cfg_t *c, int rank, int step, gen_fn gen, void *arg) {
    int k;
    size_t i;
    ddp_result_t e;
    for (k = 0; k < NP; k++)
        for (i = 0; i < count_of(k); i++) put(c, n->g[k], i, gen(rank, step, k, i, arg));
    for (k = NP - 1; k >= 0; k--)
        if ((e = ddp_reducer_grad_ready(n->r, k)) != DDP_SUCCESS) return e;
    return ddp_reducer_finish(n->r);
}

static double gen_random(int rank, int step, int k, size_t i, void *arg) {
    (void)arg;
    return val((uint64_t)rank, (uint64_t)step, (uint64_t)k, i);
}

/* ---------------------------------------------------------------- the reference
 * Written from the algorithm's description (the paper and PyTorch's hook), not from the
 * header: every rank's error kept here, Q's from the generator the header documents (a
 * splitmix64 seed from random_seed, the step and the bucket; Box-Muller, cos then sin). */
static uint64_t ref_splitmix(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Orthonormal columns of a (n x r, row-major), left to right (zero columns stay zero). */
static void ref_orthonormalize(double *a, size_t n, size_t r) {
    size_t i, j, t;
    for (i = 0; i < r; i++) {
        double nrm = 0;
        for (j = 0; j < i; j++) {   /* subtract the projections on the columns before */
            double d = 0;
            for (t = 0; t < n; t++) d += a[t * r + i] * a[t * r + j];
            for (t = 0; t < n; t++) a[t * r + i] -= d * a[t * r + j];
        }
        for (t = 0; t < n; t++) nrm += a[t * r + i] * a[t * r + i];
        nrm = sqrt(nrm);
        for (t = 0; t < n; t++) a[t * r + i] = nrm > 0 ? a[t * r + i] / nrm : 0;
    }
}

#define MAXP 4
typedef struct {
    const cfg_t *c;
    int p;
    double *err[MAXP][NP];       /* every rank's error, per matrix */
    double *q[NP];               /* the Q's (warm start) */
    int qvalid[NP];
    double *out[NP];             /* what this step should leave in the gradients */
} ref_t;

static size_t ref_rank(const ref_t *R, int k) {
    size_t r = (size_t)R->c->rank_r;
    if (r > rows_of[k]) r = rows_of[k];
    if (r > cols_of[k]) r = cols_of[k];
    return r;
}

static int ref_compressed(const ref_t *R, int k) {
    size_t r = ref_rank(R, k);
    double rate = R->c->rate ? R->c->rate : 2.0;
    return shaped[k] && rows_of[k] > 1 && cols_of[k] > 1 &&
           (double)(rows_of[k] + cols_of[k]) * (double)r * rate < (double)(rows_of[k] * cols_of[k]);
}

static void ref_init(ref_t *R, const cfg_t *c, int p) {
    int q, k;
    memset(R, 0, sizeof *R);
    R->c = c;
    R->p = p;
    for (k = 0; k < NP; k++) {
        for (q = 0; q < p; q++) R->err[q][k] = (double *)calloc(count_of(k), sizeof(double));
        R->q[k] = (double *)calloc(cols_of[k] * 16, sizeof(double));
        R->out[k] = (double *)calloc(count_of(k), sizeof(double));
    }
}

static void ref_free(ref_t *R) {
    int q, k;
    for (k = 0; k < NP; k++) {
        for (q = 0; q < R->p; q++) free(R->err[q][k]);
        free(R->q[k]);
        free(R->out[k]);
    }
}

/* Step `step` with the reducer's bucket layout (bucket order, and the order inside a bucket). */
static void ref_step(ref_t *R, ddp_reducer_t *red, int step, gen_fn gen, void *arg) {
    const int p = R->p, nb = ddp_reducer_num_buckets(red);
    int b, j, k, q, ids[NP];
    size_t i, t, n;
    for (k = 0; k < NP; k++)   /* the plain average, of everything */
        for (i = 0; i < count_of(k); i++) {
            double s = 0;
            for (q = 0; q < p; q++) s += R->c->f32 ? (double)(float)gen(q, step, k, i, arg) : gen(q, step, k, i, arg);
            R->out[k][i] = s / p;
        }
    if (step < R->c->start) return;
    for (b = 0; b < nb; b++) {
        int nin = ddp_reducer_bucket_info(red, b, ids, NP, NULL, NULL), fill = 0, any = 0;
        uint64_t s = 0;
        double spare = 0;
        int has = 0;
        for (j = 0; j < nin; j++) any |= ref_compressed(R, ids[j]);
        if (!any) continue;
        for (j = 0; j < nin; j++)
            if (ref_compressed(R, ids[j]) && (!R->qvalid[ids[j]] || R->c->no_warm)) fill = 1;
        if (fill) {   /* the fill's seed: from (random_seed, step, bucket) */
            uint64_t x = 42 ^ (uint64_t)step * 0x9E3779B97F4A7C15ull ^ (uint64_t)(b + 1) * 0xD1B54A32D192ED03ull;
            s = ref_splitmix(&x);
        }
        for (j = 0; j < nin; j++) {
            double *m[MAXP], *P, *Q = R->q[ids[j]];
            size_t rows, cols, r;
            k = ids[j];
            if (!ref_compressed(R, k)) continue;
            rows = rows_of[k], cols = cols_of[k], r = ref_rank(R, k), n = rows * cols;
            if (fill) {
                for (i = 0; i < cols * r; i++) {
                    double z;
                    if (has) { z = spare; has = 0; }
                    else {
                        double u1 = ((double)(ref_splitmix(&s) >> 11) + 1.0) / 9007199254740992.0;
                        double u2 = (double)(ref_splitmix(&s) >> 11) / 9007199254740992.0;
                        z = sqrt(-2 * log(u1)) * cos(2 * M_PI * u2);
                        spare = sqrt(-2 * log(u1)) * sin(2 * M_PI * u2);
                        has = 1;
                    }
                    Q[i] = R->c->f32 ? (double)(float)z : z;
                }
                R->qvalid[k] = 1;
            }
            ref_orthonormalize(Q, cols, r);
            for (q = 0; q < p; q++) {   /* every rank's M + its error */
                m[q] = (double *)malloc(n * sizeof(double));
                for (i = 0; i < n; i++) {
                    double g = gen(q, step, k, i, arg);
                    m[q][i] = (R->c->f32 ? (double)(float)g : g) + (R->c->no_ef ? 0 : R->err[q][k][i]);
                }
            }
            P = (double *)calloc(rows * r, sizeof(double));
            for (q = 0; q < p; q++)   /* P = sum over the ranks of M Q */
                for (i = 0; i < rows; i++)
                    for (t = 0; t < r; t++) {
                        double d = 0;
                        size_t jj;
                        for (jj = 0; jj < cols; jj++) d += m[q][i * cols + jj] * Q[jj * r + t];
                        P[i * r + t] += d;
                    }
            ref_orthonormalize(P, rows, r);
            memset(Q, 0, cols * r * sizeof(double));
            for (q = 0; q < p; q++)   /* Q = sum over the ranks of M^T P, / p */
                for (i = 0; i < cols; i++)
                    for (t = 0; t < r; t++) {
                        double d = 0;
                        size_t ii;
                        for (ii = 0; ii < rows; ii++) d += m[q][ii * cols + i] * P[ii * r + t];
                        Q[i * r + t] += d / p;
                    }
            for (i = 0; i < rows; i++)
                for (t = 0; t < cols; t++) {
                    double d = 0;
                    size_t u;
                    for (u = 0; u < r; u++) d += P[i * r + u] * Q[t * r + u];
                    R->out[k][i * cols + t] = d;
                }
            for (q = 0; q < p; q++) {
                if (!R->c->no_ef)
                    for (i = 0; i < n; i++) R->err[q][k][i] = m[q][i] - R->out[k][i];
                free(m[q]);
            }
            free(P);
        }
    }
}

/* max |got - want| over the model, and max |want| */
static void compare(const net_t *n, const ref_t *R, double *maxerr, double *maxabs) {
    int k;
    size_t i;
    *maxerr = *maxabs = 0;
    for (k = 0; k < NP; k++)
        for (i = 0; i < count_of(k); i++) {
            double w = R->out[k][i], d = fabs(get(R->c, n->g[k], i) - w);
            if (d > *maxerr) *maxerr = d;
            if (fabs(w) > *maxabs) *maxabs = fabs(w);
        }
}

static int reference(int rank, int p, void *arg) {
    const cfg_t *c = (const cfg_t *)arg;
    ddp_comm_t *comm;
    net_t n;
    ref_t R;
    int step, bad = 0, plain_exact = 1;
    double worst = 0;
    if (!(comm = init_comm(rank, p))) return 1;
    if (net_make(&n, comm, c, 1) != 0) {
        ok(0, "set up: %s / %s", ddp_comm_last_error(comm), n.ps ? ddp_powersgd_last_error(n.ps) : "");
        return 1;
    }
    ref_init(&R, c, p);
    for (step = 0; step < c->steps; step++) {
        double maxerr, maxabs;
        ddp_result_t e;
        t_where("step %d", step);
        if ((e = net_step(&n, c, rank, step, gen_random, NULL)) != DDP_SUCCESS) {
            bad++;
            diag("step %d: %s: %s", step, ddp_strerror(e), ddp_reducer_last_error(n.r));
            break;
        }
        ref_step(&R, n.r, step, gen_random, NULL);
        compare(&n, &R, &maxerr, &maxabs);
        if (step < c->start) {
            /* bit for bit: each bucket's plain average is one all-reduce of it */
            int b, nb = ddp_reducer_num_buckets(n.r), k;
            for (b = 0; b < nb; b++) {
                int ids[NP], nin = ddp_reducer_bucket_info(n.r, b, ids, NP, NULL, NULL), j;
                size_t tot = 0, at = 0, es = c->f32 ? 4 : 8;
                unsigned char *buf;
                for (j = 0; j < nin; j++) tot += count_of(ids[j]);
                buf = (unsigned char *)malloc(tot * es);
                for (j = 0, at = 0; j < nin; j++) {   /* this rank's gradients, in bucket order */
                    size_t i;
                    k = ids[j];
                    for (i = 0; i < count_of(k); i++)
                        put(c, buf + (at + i) * es, 0, gen_random(rank, step, k, i, NULL));
                    at += count_of(k);
                }
                ddp_all_reduce(buf, buf, tot, c->f32 ? DDP_FLOAT32 : DDP_FLOAT64, DDP_AVG, comm);
                for (j = 0, at = 0; j < nin; j++) {
                    k = ids[j];
                    if (memcmp(buf + at * es, n.g[k], count_of(k) * es)) plain_exact = 0;
                    at += count_of(k);
                }
                free(buf);
            }
        } else if (maxerr / maxabs > worst) worst = maxerr / maxabs;
    }
    {
        double tol = c->f32 ? 1e-5 : 1e-11;
        ddp_powersgd_stats_t st;
        ddp_powersgd_stats(n.ps, &st);
        ok(!bad && worst <= tol && plain_exact && st.iterations == (uint64_t)c->steps &&
           st.compressed_iterations == (uint64_t)(c->steps - c->start),
           "[p=%d %s %s rank %d] %d steps from step %d against the reference: max error %.2e relative "
           "(limit %.0e); plain steps bit for bit: %s; stats %llu steps, %llu compressed, %llu of %llu elements sent",
           p, c->flat ? "flat" : "copy", c->f32 ? "float32" : "float64", c->rank_r, c->steps - c->start,
           c->start, worst, tol, plain_exact ? "yes" : "NO", (unsigned long long)st.iterations,
           (unsigned long long)st.compressed_iterations, (unsigned long long)st.elements_sent,
           (unsigned long long)st.elements_uncompressed_equivalent);
    }
    ref_free(&R);
    net_free(&n, c);
    ddp_comm_destroy(comm);
    return 0;
}

/* ---------------------------------------------------------------- rejoin */
static void ref_reset(ref_t *R) {
    int q, k;
    for (k = 0; k < NP; k++) {
        for (q = 0; q < R->p; q++) memset(R->err[q][k], 0, count_of(k) * sizeof(double));
        R->qvalid[k] = 0;
    }
}

static int rejoin(int rank, int p, void *arg) {
    cfg_t c;
    ddp_comm_t *comm, *nc = NULL;
    net_t n;
    ref_t R;
    int step, bad = 0, apply = -1;
    double worst = 0;
    (void)arg;
    memset(&c, 0, sizeof c);
    c.rank_r = 2;
    c.start = 2;
    c.elastic = 1;
    if (!(comm = init_comm(rank, p))) return 1;
    if (net_make(&n, comm, &c, 1) != 0) return 1;
    ref_init(&R, &c, p);
    for (step = 0; step < 7; step++) {
        double maxerr, maxabs;
        if (step == 4) {   /* a new communicator, the same ranks; rank 2 comes with fresh state */
            if (ddp_comm_split(comm, 0, rank, &nc) != DDP_SUCCESS) { bad++; break; }
            if (rank == 2) {
                net_free(&n, &c);
                if (net_make(&n, nc, &c, 1) != 0) { bad++; break; }
            }
            if (ddp_reducer_rebind(n.r, nc, &apply) != DDP_SUCCESS || apply != 0) {
                bad++;
                diag("rebind: %s (apply %d)", ddp_reducer_last_error(n.r), apply);
                break;
            }
            ref_reset(&R);
        }
        t_where("step %d", step);
        if (net_step(&n, &c, rank, step, gen_random, NULL) != DDP_SUCCESS) {
            bad++;
            diag("step %d: %s", step, ddp_reducer_last_error(n.r));
            break;
        }
        ref_step(&R, n.r, step, gen_random, NULL);
        compare(&n, &R, &maxerr, &maxabs);
        if (maxerr / maxabs > worst) worst = maxerr / maxabs;
    }
    ok(!bad && worst <= 1e-11, "[p=%d] rank %d%s: 7 steps, a new communicator before step 4 (rebind): every step "
       "equals the reference (error feedback and warm start begun again at step 4): max error %.1e relative",
       p, rank, rank == 2 ? " (fresh state at step 4)" : "", worst);
    ref_free(&R);
    net_free(&n, &c);
    if (nc) ddp_comm_destroy(nc);
    ddp_comm_destroy(comm);
    return 0;
}

/* ---------------------------------------------------------------- plain
 * Before start_iter the hook's average is the reducer's own, bit for bit (copy mode: the same
 * all-reduce of the same bucket). p = 3, so that the sums are not exact. */
static int plain(int rank, int p, void *arg) {
    cfg_t c;
    ddp_comm_t *comm;
    net_t a, b;
    int step, k, same = 1, bad = 0;
    (void)arg;
    memset(&c, 0, sizeof c);
    c.f32 = 1;
    c.rank_r = 1;
    c.start = 3;
    if (!(comm = init_comm(rank, p))) return 1;
    if (net_make(&a, comm, &c, 1) != 0 || net_make(&b, comm, &c, 0) != 0) return 1;
    for (step = 0; step < c.start; step++) {
        if (net_step(&a, &c, rank, step, gen_random, NULL) != DDP_SUCCESS) bad++;
        if (net_step(&b, &c, rank, step, gen_random, NULL) != DDP_SUCCESS) bad++;
        for (k = 0; k < NP; k++)
            if (memcmp(a.g[k], b.g[k], count_of(k) * 4)) same = 0;
    }
    ok(!bad && same, "[p=%d] the %d steps before start_iter equal a reducer without the hook bit for bit", p, c.start);
    net_free(&a, &c);
    net_free(&b, &c);
    ddp_comm_destroy(comm);
    return 0;
}

/* ---------------------------------------------------------------- low-rank gradients
 * Matrices: sum over t < nsv of s[t] u_t v_t^T (u, v fixed random vectors), plus on ranks 0 and 1
 * a deviation +dev D and -dev D (ranks from 2 on: none), so the average over 2 or 3 ranks is the
 * low-rank part; vectors: fixed random values. The same every step. */
typedef struct { int nsv; double s[3], dev; } lowrank_t;

static double gen_lowrank(int rank, int step, int k, size_t i, void *arg) {
    const lowrank_t *L = (const lowrank_t *)arg;
    size_t row = i / cols_of[k], col = i % cols_of[k];
    double x = 0;
    int t;
    (void)step;
    if (!shaped[k]) return val(9, 0, (uint64_t)k, i);
    for (t = 0; t < L->nsv; t++)
        x += L->s[t] * val(100 + (uint64_t)t, (uint64_t)k, row, 1) * val(200 + (uint64_t)t, (uint64_t)k, col, 2);
    if (rank < 2) x += (rank ? -1 : 1) * L->dev * val(300, (uint64_t)k, i, 3);
    return x;
}

/* The average of the ranks' gradients (what plain averaging applies). */
static double avg_lowrank(int p, int k, size_t i, lowrank_t *L) {
    double s = 0;
    int q;
    for (q = 0; q < p; q++) s += gen_lowrank(q, 0, k, i, L);
    return s / p;
}

/* ---------------------------------------------------------------- feedback
 * A constant gradient of rank 3 compressed at rank 1: the applied updates' running sum after n
 * compressed steps should be n times the average gradient. With error feedback what compression
 * leaves out goes into the next step, so the difference is the error left, bounded: relative to
 * n |G| it falls like 1/n. Without it every step leaves out the same part (about the second and
 * third singular directions): the relative difference stays near that part's share. */
typedef struct { int no_ef; double ratio[MAXP]; } fb_res_t;

static int feedback(int rank, int p, void *arg) {
    fb_res_t *res = (fb_res_t *)arg;
    cfg_t c;
    ddp_comm_t *comm;
    net_t n;
    lowrank_t L = {3, {3, 2, 1}, 0.5};
    double *sum[NP], worst = 0;
    int step, k, bad = 0;
    size_t i;
    memset(&c, 0, sizeof c);
    c.rank_r = 1;
    c.start = 2;
    c.steps = 80;
    c.no_ef = res->no_ef;
    if (!(comm = init_comm(rank, p))) return 1;
    if (net_make(&n, comm, &c, 1) != 0) return 1;
    for (k = 0; k < NP; k++) sum[k] = (double *)calloc(count_of(k), sizeof(double));
    for (step = 0; step < c.steps; step++) {
        if (net_step(&n, &c, rank, step, gen_lowrank, &L) != DDP_SUCCESS) { bad++; break; }
        if (step >= c.start)
            for (k = 0; k < NP; k++)
                for (i = 0; i < count_of(k); i++) sum[k][i] += get(&c, n.g[k], i);
    }
    for (k = 0; k < NP; k++) {
        double d2 = 0, g2 = 0, m = c.steps - c.start;
        if (!shaped[k] || rows_of[k] * cols_of[k] < 100) continue;   /* W1 and W3: compressed */
        for (i = 0; i < count_of(k); i++) {
            double g = avg_lowrank(p, k, i, &L);
            d2 += (sum[k][i] - m * g) * (sum[k][i] - m * g);
            g2 += m * g * m * g;
        }
        if (sqrt(d2 / g2) > worst) worst = sqrt(d2 / g2);
        free(sum[k]);
        sum[k] = NULL;
    }
    for (k = 0; k < NP; k++) free(sum[k]);
    res->ratio[rank] = bad ? -1 : worst;
    net_free(&n, &c);
    ddp_comm_destroy(comm);
    return bad;
}

/* ---------------------------------------------------------------- warm
 * No error feedback, rank 1. A rank-1 average is recovered at the first compressed step (P spans
 * its columns). A rank-2 one: with warm start each step is one more power iteration, so the
 * approximation converges to the best rank-1 one, whose error (Frobenius) is the second singular
 * value; with fresh Q's every step it keeps whatever the random start gives. */
static double sigma2(int p, int k, lowrank_t *L) {   /* sqrt(|A|^2 - sigma1^2), by power iteration */
    size_t rows = rows_of[k], cols = cols_of[k], i, j;
    double *a = (double *)malloc(rows * cols * sizeof(double)), *v = (double *)malloc(cols * sizeof(double)),
           *w = (double *)malloc(rows * sizeof(double)), f2 = 0, s1 = 0;
    int it;
    for (i = 0; i < rows * cols; i++) { a[i] = avg_lowrank(p, k, i, L); f2 += a[i] * a[i]; }
    for (j = 0; j < cols; j++) v[j] = 1.0 + 0.1 * (double)j;
    for (it = 0; it < 500; it++) {
        double nv = 0;
        for (i = 0; i < rows; i++) { w[i] = 0; for (j = 0; j < cols; j++) w[i] += a[i * cols + j] * v[j]; }
        for (j = 0; j < cols; j++) { v[j] = 0; for (i = 0; i < rows; i++) v[j] += a[i * cols + j] * w[i]; nv += v[j] * v[j]; }
        nv = sqrt(nv);
        for (j = 0; j < cols; j++) v[j] /= nv;
        s1 = sqrt(nv);   /* |A^T A v| = sigma1^2 at convergence */
    }
    free(a); free(v); free(w);
    return sqrt(f2 - s1 * s1);
}

static double approx_error(const net_t *n, const cfg_t *c, int p, int k, lowrank_t *L) {
    double d2 = 0;
    size_t i;
    for (i = 0; i < count_of(k); i++) {
        double d = get(c, n->g[k], i) - avg_lowrank(p, k, i, L);
        d2 += d * d;
    }
    return sqrt(d2);
}

static int warm(int rank, int p, void *arg) {
    const int no_warm = *(const int *)arg;
    cfg_t c;
    ddp_comm_t *comm;
    net_t n;
    lowrank_t one = {1, {2, 0, 0}, 0.25}, two = {2, {3, 1, 0}, 0.25};
    int step, bad = 0;
    double e1 = 0, a1 = 0, dev3 = 0, last = 0;
    size_t i;
    memset(&c, 0, sizeof c);
    c.f32 = 0;
    c.rank_r = 1;
    c.start = 2;
    c.no_ef = 1;
    c.no_warm = no_warm;
    if (!(comm = init_comm(rank, p))) return 1;
    /* rank 1: exact at the first compressed step */
    if (net_make(&n, comm, &c, 1) != 0) return 1;
    for (step = 0; step <= c.start; step++)
        if (net_step(&n, &c, rank, step, gen_lowrank, &one) != DDP_SUCCESS) bad++;
    for (i = 0; i < count_of(3); i++) {
        double w = avg_lowrank(p, 3, i, &one);
        if (fabs(get(&c, n.g[3], i) - w) > e1) e1 = fabs(get(&c, n.g[3], i) - w);
        if (fabs(w) > a1) a1 = fabs(w);
    }
    net_free(&n, &c);
    /* rank 2: the error after 30 compressed steps, and how far the last 5 are from sigma2 */
    if (net_make(&n, comm, &c, 1) != 0) return 1;
    {
        double s2 = sigma2(p, 3, &two);
        for (step = 0; step < c.start + 30; step++) {
            if (net_step(&n, &c, rank, step, gen_lowrank, &two) != DDP_SUCCESS) bad++;
            if (step >= c.start + 25) {
                double e = approx_error(&n, &c, p, 3, &two);
                if (fabs(e - s2) / s2 > dev3) dev3 = fabs(e - s2) / s2;
                last = e;
            }
        }
        if (!no_warm)
            ok(!bad && e1 <= 1e-12 * a1 && dev3 <= 1e-6,
               "[p=%d] warm start: a rank-1 gradient exact at the first compressed step (max error %.1e of %.2f); a "
               "rank-2 one converges to its best rank-1 approximation: error %.6f, sigma2 %.6f (last 5 steps within "
               "%.1e relative)", p, e1, a1, last, s2, dev3);
        else
            ok(!bad && e1 <= 1e-12 * a1 && dev3 > 1e-3,
               "[p=%d] without warm start: the rank-1 gradient still exact (%.1e); the rank-2 one does not converge "
               "(error %.6f, sigma2 %.6f, up to %.1e relative off in the last 5 steps)", p, e1, last, s2, dev3);
    }
    net_free(&n, &c);
    ddp_comm_destroy(comm);
    return 0;
}

/* ---------------------------------------------------------------- rate
 * min_compression_rate 6 at rank 1: W1 (12 x 9: 21 x 6 = 126 >= 108) goes uncompressed, W3
 * (20 x 16: 36 x 6 = 216 < 320) compressed; 100: nothing is, the buckets are plain averages. */
static int rate(int rank, int p, void *arg) {
    cfg_t c;
    ddp_comm_t *comm;
    net_t n;
    int step, bad = 0, v;
    (void)arg;
    if (!(comm = init_comm(rank, p))) return 1;
    for (v = 0; v < 2; v++) {
        ddp_powersgd_stats_t st;
        double w1 = 0, w3 = 0, vec = 0;
        size_t i;
        int k;
        memset(&c, 0, sizeof c);
        c.rank_r = 1;
        c.start = 2;
        c.rate = v ? 100 : 6;
        if (net_make(&n, comm, &c, 1) != 0) return 1;
        for (step = 0; step < 4; step++)
            if (net_step(&n, &c, rank, step, gen_random, NULL) != DDP_SUCCESS) bad++;
        for (k = 0; k < NP; k++)
            for (i = 0; i < count_of(k); i++) {
                double s = 0, d;
                int q;
                for (q = 0; q < p; q++) s += gen_random(q, 3, k, i, NULL);
                d = fabs(get(&c, n.g[k], i) - s / p);
                if (k == 0 && d > w1) w1 = d;
                if (k == 3 && d > w3) w3 = d;
                if (k != 0 && k != 3 && d > vec) vec = d;
            }
        ddp_powersgd_stats(n.ps, &st);
        if (!v)
            ok(!bad && w1 <= 1e-15 && vec <= 1e-15 && w3 > 1e-2 && st.elements_sent == 2 * 472 + 2 * (20 + 20 + 16 + 132),
               "[p=%d] min_compression_rate 6: W1 uncompressed (off the average by %.1e), the vectors and the small "
               "W2 too (%.1e), W3 compressed (off by %.2f); %llu elements sent, of %llu", p, w1, vec, w3,
               (unsigned long long)st.elements_sent, (unsigned long long)st.elements_uncompressed_equivalent);
        else
            ok(!bad && w1 <= 1e-15 && vec <= 1e-15 && w3 <= 1e-15 && st.elements_sent == 4 * 472 &&
               st.elements_uncompressed_equivalent == 4 * 472,
               "[p=%d] min_compression_rate 100: nothing compressed, plain averages (off by %.1e), %llu elements "
               "sent in 4 steps", p, w1 > w3 ? w1 : w3, (unsigned long long)st.elements_sent);
        net_free(&n, &c);
    }
    ddp_comm_destroy(comm);
    return 0;
}

/* ---------------------------------------------------------------- done
 * Two buckets, {B} then {A}; a synchronous hook (its average done inside, the request left
 * empty, so the bucket is complete at once) and a done that issues a collective of its own. Rank
 * 0 marks A then B: both buckets launch in B's grad_ready; the others mark B, then A: bucket 0
 * launches (and is complete) before bucket 1. If done ran whenever a poll found its bucket
 * complete, rank 0 would issue hook, hook, done, done and the others hook, done, hook, done. */
typedef struct { int hooks, dones, bad; } order_t;

static ddp_result_t order_hook(void *st, ddp_comm_t *c, int b, void *buf, size_t n, ddp_dtype_t dt,
                               ddp_request_t *req) {
    (void)req;
    (void)b;
    ((order_t *)st)->hooks++;
    return ddp_all_reduce(buf, buf, n, dt, DDP_AVG, c);
}

static ddp_result_t order_done(void *st, ddp_comm_t *c, int b, void *buf, size_t n, ddp_dtype_t dt) {
    order_t *o = (order_t *)st;
    int32_t mark = 1000 + b;
    ddp_result_t e;
    (void)buf; (void)n; (void)dt;
    o->dones++;
    e = ddp_all_reduce(&mark, &mark, 1, DDP_INT32, DDP_SUM, c);
    if (e == DDP_SUCCESS && mark != (1000 + b) * ddp_comm_size(c)) o->bad++;
    return e;
}

static int done_order(int rank, int p, void *arg) {
    ddp_comm_t *comm;
    ddp_reducer_t *r = NULL;
    ddp_reducer_desc_t d;
    order_t o;
    float ga[100], gb[300];
    int it, bad = 0;
    size_t i;
    (void)arg;
    if (!(comm = init_comm(rank, p))) return 1;
    memset(&d, 0, sizeof d);
    memset(&o, 0, sizeof o);
    d.first_bucket_bytes = 4;
    d.bucket_cap_bytes = 4;
    d.comm_hook = order_hook;
    d.comm_hook_done = order_done;
    d.comm_hook_state = &o;
    d.find_unused = 1;   /* no rebuild: rank 0's order would become everyone's bucket order */
    if (ddp_reducer_create(&r, comm, &d) != DDP_SUCCESS) return 1;
    if (ddp_reducer_add_param(r, ga, 100, DDP_FLOAT32) != 0 || ddp_reducer_add_param(r, gb, 300, DDP_FLOAT32) != 1)
        return 1;
    for (it = 0; it < 3; it++) {
        for (i = 0; i < 100; i++) ga[i] = (float)(rank + 1);
        for (i = 0; i < 300; i++) gb[i] = (float)(2 * (rank + 1));
        t_where("iteration %d", it);
        if (rank == 0) bad += ddp_reducer_grad_ready(r, 0) != DDP_SUCCESS, bad += ddp_reducer_grad_ready(r, 1) != DDP_SUCCESS;
        else bad += ddp_reducer_grad_ready(r, 1) != DDP_SUCCESS, bad += ddp_reducer_grad_ready(r, 0) != DDP_SUCCESS;
        if (ddp_reducer_finish(r) != DDP_SUCCESS) { bad++; diag("finish: %s", ddp_reducer_last_error(r)); break; }
        for (i = 0; i < 100; i++) if (ga[i] != (float)(p + 1) / 2) bad++;
        for (i = 0; i < 300; i++) if (gb[i] != (float)(p + 1)) bad++;
    }
    ok(!bad && !o.bad && o.dones == 2 * it && o.hooks == 2 * it,
       "[p=%d] comm_hook_done issuing a collective, ranks marking in different orders: %d iterations, %d hooks, %d "
       "dones, every collective paired with its own (%d wrong, %d problems)", p, it, o.hooks, o.dones, o.bad, bad);
    ddp_reducer_destroy(r);
    ddp_comm_destroy(comm);
    return 0;
}

/* ---------------------------------------------------------------- misuse */
static int misuse(int rank, int p, void *arg) {
    static float flat[64];
    ddp_comm_t *comm;
    ddp_powersgd_t *ps = NULL;
    ddp_powersgd_desc_t pd;
    ddp_reducer_desc_t rd;
    ddp_reducer_t *r = NULL;
    ddp_powersgd_stats_t st;
    ddp_result_t e;
    float g[40], h[7];
    int k;
    (void)arg;
    if (!(comm = init_comm(rank, p))) return 1;
    memset(&pd, 0, sizeof pd);
    memset(&rd, 0, sizeof rd);
    ok(ddp_powersgd_create(NULL, &pd, &rd) == DDP_ERR_INVALID_ARGUMENT &&
       ddp_powersgd_create(&ps, &pd, NULL) == DDP_ERR_INVALID_ARGUMENT && !ps &&
       ddp_powersgd_bind(NULL, NULL) == DDP_ERR_INVALID_ARGUMENT &&
       ddp_powersgd_set_shape(NULL, 0, 1, 1) == DDP_ERR_INVALID_ARGUMENT &&
       ddp_powersgd_stats(NULL, &st) == DDP_ERR_INVALID_ARGUMENT && *ddp_powersgd_last_error(NULL),
       "NULL arguments refused; last_error(NULL) is a message");
    pd.start_iter = 1;
    ok(ddp_powersgd_create(&ps, &pd, &rd) == DDP_ERR_INVALID_ARGUMENT && !ps && !rd.comm_hook,
       "start_iter 1 with error feedback and warm start refused (PyTorch: start_powerSGD_iter > 1)");
    pd.no_error_feedback = 1;
    ok(ddp_powersgd_create(&ps, &pd, &rd) == DDP_ERR_INVALID_ARGUMENT && !ps, "start_iter 1 with warm start refused");
    pd.no_warm_start = 1;
    ok(ddp_powersgd_create(&ps, &pd, &rd) == DDP_SUCCESS && ps && rd.comm_hook && rd.comm_hook_done &&
       rd.comm_hook_state == (void *)ps, "start_iter 1 without both: accepted, the desc's hook fields filled");
    ddp_powersgd_destroy(ps);
    ps = NULL;
    memset(&pd, 0, sizeof pd);
    pd.matrix_approximation_rank = -1;
    ok(ddp_powersgd_create(&ps, &pd, &rd) == DDP_ERR_INVALID_ARGUMENT && !ps, "a negative rank refused");
    pd.matrix_approximation_rank = 0;
    ok(ddp_powersgd_create(&ps, &pd, &rd) == DDP_ERR_INVALID_ARGUMENT && !ps,
       "a desc whose comm_hook is already set refused");
    memset(&rd, 0, sizeof rd);
    rd.compression = DDP_COMPRESS_BF16;
    ok(ddp_powersgd_create(&ps, &pd, &rd) == DDP_ERR_INVALID_ARGUMENT && !ps, "a desc with compression refused");

    /* ZeRO-1: the reducer refuses a comm hook, saying so */
    memset(&rd, 0, sizeof rd);
    rd.flat_grads = flat;
    rd.flat_bytes = sizeof flat;
    rd.zero_stage = 1;
    if (ddp_powersgd_create(&ps, &pd, &rd) != DDP_SUCCESS) return 1;
    e = ddp_reducer_create(&r, comm, &rd);
    ok(e == DDP_ERR_INVALID_ARGUMENT && !r && strstr(ddp_comm_last_error(comm), "comm_hook") &&
       strstr(ddp_comm_last_error(comm), "zero_stage 1"), "ZeRO-1 with PowerSGD -> %s: %s", ddp_strerror(e),
       ddp_comm_last_error(comm));
    ddp_powersgd_destroy(ps);

    /* bind, shapes */
    memset(&rd, 0, sizeof rd);
    pd.start_iter = 2;
    if (ddp_powersgd_create(&ps, &pd, &rd) != DDP_SUCCESS || ddp_reducer_create(&r, comm, &rd) != DDP_SUCCESS) return 1;
    e = ddp_powersgd_set_shape(ps, 0, 5, 8);
    ok(e == DDP_ERR_INVALID_USAGE && strstr(ddp_powersgd_last_error(ps), "bind"), "set_shape before bind -> %s: %s",
       ddp_strerror(e), ddp_powersgd_last_error(ps));
    ok(ddp_powersgd_bind(ps, NULL) == DDP_ERR_INVALID_ARGUMENT, "bind(NULL reducer) refused");
    ok(ddp_powersgd_bind(ps, r) == DDP_SUCCESS, "bind");
    e = ddp_powersgd_bind(ps, r);
    ok(e == DDP_ERR_INVALID_USAGE && strstr(ddp_powersgd_last_error(ps), "already"), "bind twice -> %s: %s",
       ddp_strerror(e), ddp_powersgd_last_error(ps));
    if (ddp_reducer_add_param(r, g, 40, DDP_FLOAT32) != 0 || ddp_reducer_add_param(r, h, 7, DDP_FLOAT32) != 1) return 1;
    e = ddp_powersgd_set_shape(ps, 2, 1, 1);
    ok(e == DDP_ERR_INVALID_ARGUMENT && t_mentions_int(ddp_powersgd_last_error(ps), 2),
       "set_shape of an unregistered parameter -> %s: %s", ddp_strerror(e), ddp_powersgd_last_error(ps));
    ok(ddp_powersgd_set_shape(ps, -1, 1, 1) == DDP_ERR_INVALID_ARGUMENT, "set_shape(-1) refused");
    e = ddp_powersgd_set_shape(ps, 0, 6, 7);
    ok(e == DDP_ERR_INVALID_ARGUMENT && t_mentions_int(ddp_powersgd_last_error(ps), 40),
       "a shape whose product is not the count -> %s: %s", ddp_strerror(e), ddp_powersgd_last_error(ps));
    ok(ddp_powersgd_set_shape(ps, 0, 0, 40) == DDP_ERR_INVALID_ARGUMENT &&
       ddp_powersgd_set_shape(ps, 0, (size_t)1 << 40, ((size_t)1 << 40) + 40) == DDP_ERR_INVALID_ARGUMENT,
       "a zero or overflowing shape refused");
    ok(ddp_powersgd_set_shape(ps, 0, 5, 8) == DDP_SUCCESS, "set_shape(0, 5, 8)");
    for (k = 0; k < 40; k++) g[k] = 1;
    for (k = 0; k < 7; k++) h[k] = 1;
    ok(ddp_reducer_grad_ready(r, 1) == DDP_SUCCESS && ddp_reducer_grad_ready(r, 0) == DDP_SUCCESS &&
       ddp_reducer_finish(r) == DDP_SUCCESS, "a step");
    e = ddp_powersgd_set_shape(ps, 0, 8, 5);
    ok(e == DDP_ERR_INVALID_USAGE && strstr(ddp_powersgd_last_error(ps), "first step"),
       "set_shape after the first step -> %s: %s", ddp_strerror(e), ddp_powersgd_last_error(ps));
    ok(ddp_powersgd_stats(ps, &st) == DDP_SUCCESS && st.iterations == 1 && st.compressed_iterations == 0 &&
       st.elements_sent == 47 && st.elements_uncompressed_equivalent == 47, "stats after one plain step");
    ddp_reducer_destroy(r);
    ddp_powersgd_destroy(ps);
    ddp_powersgd_destroy(NULL);

    /* not bound: the first step fails, saying why, on every rank, and nobody hangs */
    memset(&rd, 0, sizeof rd);
    if (ddp_powersgd_create(&ps, &pd, &rd) != DDP_SUCCESS || ddp_reducer_create(&r, comm, &rd) != DDP_SUCCESS) return 1;
    if (ddp_reducer_add_param(r, g, 40, DDP_FLOAT32) != 0) return 1;
    ddp_reducer_grad_ready(r, 0);
    e = ddp_reducer_finish(r);
    ok(e == DDP_ERR_INVALID_USAGE && strstr(ddp_reducer_last_error(r), "ddp_powersgd_bind"),
       "a step without bind -> %s: %s", ddp_strerror(e), ddp_reducer_last_error(r));
    ddp_reducer_destroy(r);
    ddp_powersgd_destroy(ps);
    ddp_comm_destroy(comm);
    return 0;
}

/* ---------------------------------------------------------------- device (fake NCCL) */
static int device(int rank, int p, void *arg) {
    ddp_comm_t *comm;
    ddp_powersgd_t *ps = NULL;
    ddp_powersgd_desc_t pd;
    ddp_reducer_desc_t rd;
    ddp_reducer_t *r = NULL;
    float *gd = NULL;
    ddp_result_t e;
    (void)arg;
    if (!(comm = init_comm(rank, p))) return 1;
    t_dev_load();
    if (t_dev_cu.Malloc((void **)&gd, 64 * sizeof(float)) != 0) { ok(0, "device setup"); return 1; }
    memset(&pd, 0, sizeof pd);
    memset(&rd, 0, sizeof rd);
    pd.start_iter = 2;
    if (ddp_powersgd_create(&ps, &pd, &rd) != DDP_SUCCESS || ddp_reducer_create(&r, comm, &rd) != DDP_SUCCESS ||
        ddp_reducer_add_param(r, gd, 64, DDP_FLOAT32) != 0 || ddp_powersgd_bind(ps, r) != DDP_SUCCESS ||
        ddp_powersgd_set_shape(ps, 0, 8, 8) != DDP_SUCCESS) {
        ok(0, "set up: %s", ddp_comm_last_error(comm));
        return 1;
    }
    ddp_reducer_grad_ready(r, 0);
    e = ddp_reducer_finish(r);
    ok(e == DDP_ERR_UNSUPPORTED && strstr(ddp_reducer_last_error(r), "device") &&
       strstr(ddp_powersgd_last_error(ps), "device"), "[p=%d] device gradients -> %s: %s", p, ddp_strerror(e),
       ddp_reducer_last_error(r));
    ddp_comm_device_synchronize(comm);
    ddp_reducer_destroy(r);
    ddp_powersgd_destroy(ps);
    t_dev_cu.Free(gd);
    ddp_comm_destroy(comm);
    return 0;
}

int main(void) {
    int p;
    t_init();
    if (t_selected("reference")) {
        int v;
        for (v = 0; v < 4; v++)
            for (p = 1; p <= 3; p++) {
                cfg_t c;
                memset(&c, 0, sizeof c);
                c.f32 = v & 1;
                c.flat = (v >> 1) & 1;
                c.rank_r = 1 + (p + v) % 3;
                c.start = 2;
                c.steps = 6;
                diag("--- reference: p = %d, %s mode, %s, rank %d", p, c.flat ? "flat" : "copy",
                     c.f32 ? "float32" : "float64", c.rank_r);
                ok(t_run_ranks(p, reference, &c, 60) == 0, "reference p=%d: every rank exited cleanly", p);
            }
    }
    if (t_selected("plain")) {
        diag("--- plain averages before start_iter");
        ok(t_run_ranks(3, plain, NULL, 60) == 0, "plain: every rank exited cleanly");
    }
    if (t_selected("feedback")) {
        for (p = 2; p <= 3; p++) {
            fb_res_t *res = (fb_res_t *)t_shm_user(sizeof(fb_res_t) * 2), *off = res + 1;
            off->no_ef = 1;
            diag("--- error feedback, p = %d", p);
            ok(t_run_ranks(p, feedback, res, 120) == 0 && t_run_ranks(p, feedback, off, 120) == 0,
               "feedback p=%d: every rank exited cleanly", p);
            ok(res->ratio[0] >= 0 && res->ratio[0] < 0.03 && off->ratio[0] > 0.2,
               "[p=%d] 78 compressed steps of a constant rank-3 gradient at rank 1: the applied updates' sum is off "
               "n G by %.4f of |n G| with error feedback (limit 0.03), %.4f without (must be > 0.2)", p,
               res->ratio[0], off->ratio[0]);
        }
    }
    if (t_selected("warm")) {
        int nw;
        for (nw = 0; nw < 2; nw++) {
            diag("--- %s", nw ? "no warm start" : "warm start");
            ok(t_run_ranks(2, warm, &nw, 60) == 0, "warm: every rank exited cleanly");
        }
    }
    if (t_selected("rate")) {
        diag("--- min_compression_rate");
        ok(t_run_ranks(2, rate, NULL, 60) == 0, "rate: every rank exited cleanly");
    }
    if (t_selected("done")) {
        for (p = 2; p <= 3; p++) {
            diag("--- comm_hook_done at the same point on every rank, p = %d", p);
            ok(t_run_ranks(p, done_order, NULL, 60) == 0, "done: every rank exited cleanly");
        }
    }
    if (t_selected("misuse")) {
        diag("--- misuse");
        ok(t_run_ranks(2, misuse, NULL, 60) == 0, "misuse: every rank exited cleanly");
    }
    if (t_selected("rejoin")) {
        diag("--- elastic: a new communicator, one rank with fresh state");
        ok(t_run_ranks(3, rejoin, NULL, 90) == 0, "rejoin: every rank exited cleanly");
    }
    if (t_selected("device")) {
        if (!t_dev_use_fakes()) {
            ok(1, "# SKIP device: the fake NCCL is not built (make build/fake_nccl/libnccl.so.2)");
        } else {
            diag("--- device gradients (fake NCCL)");
            ok(t_run_ranks(2, device, NULL, 90) == 0, "device: every rank exited cleanly");
            unsetenv("DDP_NCCL");
        }
    }
    return t_done();
}
