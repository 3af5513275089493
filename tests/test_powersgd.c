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
 */
#define _GNU_SOURCE
#include "ddp.h"
#include "transports/ddp_tcp.h"
#include "tests/ddp_test.h"

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
 * header: every rank's error kept here, Q's from the generator the header documents
 * (splitmix64 seed stream from random_seed, one seed per bucket fill, Box-Muller cos then sin). */
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
    uint64_t rng;
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
    R->rng = 42;
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
        if (fill) s = ref_splitmix(&R->rng);
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
    return t_done();
}
