/* SPDX-License-Identifier: MIT (see LICENSE) */
/* tests/ddp_test_elastic.h — the model the elastic reducer suites train (test_reducer_elastic.c,
 * test_reducer_grow.c): five float64 parameters whose gradients are small integers, so every
 * average is exact and a replica's weights can be compared bitwise. Include after
 * tests/ddp_test.h, in a test that compiles the implementation itself (t_el_poke writes the
 * reducer's private step counters).
 *
 * t_el_gradient(who, step, i, j) is process who's gradient; t_el_expect() the average over a set
 * of processes. t_el_reducer() builds the reducer every process builds the same way (a tweak
 * makes a joiner's deliberate difference); t_el_step_run() marks the gradients (in t_el_order,
 * else reverse registration order) and finishes, t_el_step_check() counts the elements that are
 * not the average, t_el_step_apply() subtracts them from the weights. t_el_comm_on_store() opens
 * a communicator through the store process at t_el_store_port, over t_el_transport. */
#ifndef DDP_TEST_ELASTIC_H
#define DDP_TEST_ELASTIC_H

#include <math.h>

#define T_EL_NP 5
#define T_EL_TOTAL 460
static const size_t t_el_sizes[T_EL_NP] = {37, 200, 64, 150, 9};   /* float64; 460 elements */

enum { T_EL_COPY, T_EL_VIEW, T_EL_FLAT, T_EL_FP16, T_EL_NUM_MODES };
static const char *const t_el_mode_names[T_EL_NUM_MODES] = {"copy", "bucket views", "flat", "fp16 compression"};

static const char *t_el_transport = "tcp";   /* "tcp" or "shm" */
static int t_el_store_port;                  /* the store process's port (t_store_process) */
static const int *t_el_order;                /* the order backward marks gradients in; NULL: reverse */

static T_UNUSED void t_el_set_transport(void) {
    unsetenv("DDP_SHM_COLL");
    if (!strcmp(t_el_transport, "tcp")) setenv("DDP_TRANSPORT", "tcp", 1); else unsetenv("DDP_TRANSPORT");
}

/* A communicator of p ranks under `prefix` in the test's store process; *st is this process's
 * store client, made on first use. The store in a process of its own (as ddprun's) lets any rank
 * die, rank 0 included, and the others still agree through it. */
static T_UNUSED ddp_comm_t *t_el_comm_on_store(int rank, int p, const char *prefix, ddp_store_t **st) {
    ddp_comm_desc_t d;
    ddp_comm_t *c = NULL;
    ddp_result_t r;
    if (!*st && !ok(t_store_client(st, t_el_store_port) == DDP_SUCCESS, "rank %d: store client", rank))
        return NULL;
    t_el_set_transport();
    t_desc(&d, 20000);
    d.store = *st;
    d.store_prefix = prefix;
    d.log_level = 1;
    t_where("ddp_comm_init rank %d of %d (%s)", rank, p, prefix);
    r = ddp_comm_init(&c, p, rank, &d);
    if (!ok(r == DDP_SUCCESS, "[%s] ddp_comm_init rank %d of %d (%s) -> %s %s", t_el_transport, rank, p, prefix,
            ddp_strerror(r), r ? ddp_last_init_error() : ""))
        return NULL;
    return c;
}

/* Process `who`'s gradient of step `step`, element j of parameter i: an integer in [-8, 8], so
 * sums are exact and the average is one correctly rounded division, as the library's. */
static T_UNUSED double t_el_gradient(int who, int step, int i, size_t j) {
    return (double)(int)(t_mix64(((uint64_t)who << 48) ^ ((uint64_t)step << 32) ^ ((uint64_t)i << 20) ^ j) % 17) - 8;
}

/* The average over the processes who[0..n). */
static T_UNUSED double t_el_expect(const int *who, int n, int step, int i, size_t j) {
    int k;
    double s = 0;
    for (k = 0; k < n; k++) s += t_el_gradient(who[k], step, i, j);
    return s / n;
}

typedef struct {
    ddp_reducer_t *r;
    int mode;                            /* T_EL_COPY .. T_EL_FP16 */
    double own[T_EL_NP][200];            /* copy and fp16 modes: the caller's gradients */
    double flat[T_EL_TOTAL];             /* flat mode: the buffer */
    double w[T_EL_TOTAL];                /* the weights, w -= average per applied step */
    int abandon;                         /* see t_el_step_run */
    ddp_comm_t *comm;                    /* the communicator abandon watches */
} t_el_model_t;

static T_UNUSED double *t_el_grad_of(t_el_model_t *m, int i) { return (double *)ddp_reducer_grad(m->r, i); }

/* The reducer every process builds the same way; tweak: a joiner's deliberate difference
 * (parameter 2 one element short, the last parameter missing, another bucket cap), or a
 * reducer that is not elastic. */
enum { T_EL_SAME, T_EL_COUNT, T_EL_FEWER, T_EL_CAP, T_EL_PLAIN };
static T_UNUSED ddp_reducer_t *t_el_reducer(ddp_comm_t *c, t_el_model_t *m, int tweak) {
    ddp_reducer_desc_t d;
    ddp_reducer_t *r = NULL;
    size_t off = 0;
    int i;
    memset(&d, 0, sizeof d);
    d.first_bucket_bytes = 256;
    d.bucket_cap_bytes = tweak == T_EL_CAP ? 2048 : 1024;
    d.elastic = tweak != T_EL_PLAIN;
    d.gradient_as_bucket_view = m->mode == T_EL_VIEW;
    if (m->mode == T_EL_FP16) d.compression = DDP_COMPRESS_FP16;
    if (m->mode == T_EL_FLAT) { d.flat_grads = m->flat; d.flat_bytes = sizeof m->flat; }
    if (!ok(ddp_reducer_create(&r, c, &d) == DDP_SUCCESS, "reducer_create (elastic, %s)", t_el_mode_names[m->mode]))
        return NULL;
    for (i = 0; i < T_EL_NP - (tweak == T_EL_FEWER); off += t_el_sizes[i], i++) {
        void *p = m->mode == T_EL_FLAT ? (void *)(m->flat + off) : m->mode == T_EL_VIEW ? NULL : (void *)m->own[i];
        size_t n = tweak == T_EL_COUNT && i == 2 ? t_el_sizes[i] - 1 : t_el_sizes[i];
        if (ddp_reducer_add_param(r, p, n, DDP_FLOAT64) != i) {
            ok(0, "add_param %d: %s", i, ddp_reducer_last_error(r));
            ddp_reducer_destroy(r);
            return NULL;
        }
    }
    return r;
}

/* One step's backward and finish, as process `who`. With m->abandon (bucket-view and fp16
 * modes, on a communicator whose peer is dead) the trainer marks the first bucket's gradients
 * (parameters 4 and 3 in reverse order), learns of the failure from the communicator (its
 * launched bucket fails) and abandons backward without finish: rebind must drop the step's
 * bucket state. */
static T_UNUSED ddp_result_t t_el_step_run(t_el_model_t *m, int who, int step) {
    int k;
    size_t j;
    for (k = 0; k < T_EL_NP; k++) {
        int i = t_el_order ? t_el_order[k] : T_EL_NP - 1 - k;
        double *gr = t_el_grad_of(m, i);
        if (m->abandon && i == T_EL_NP - 3) {
            ddp_result_t e = DDP_SUCCESS;
            double t0 = t_now();
            t_where("waiting for the first bucket of step %d to fail", step);
            while (ddp_comm_get_async_error(m->comm, &e) == DDP_SUCCESS && e == DDP_SUCCESS && t_now() - t0 < 30)
                t_sleep_ms(1);
            return e != DDP_SUCCESS ? e : DDP_ERR_TIMEOUT;
        }
        for (j = 0; j < t_el_sizes[i]; j++) gr[j] = t_el_gradient(who, step, i, j);
        ddp_reducer_grad_ready(m->r, i);     /* a failure shows again at finish */
    }
    t_where("finish of step %d", step);
    return ddp_reducer_finish(m->r);
}

/* How many gradient elements differ from the average over who[0..n) (fp16: beyond its precision). */
static T_UNUSED int t_el_step_check(t_el_model_t *m, const int *who, int n, int step) {
    int i, bad = 0;
    size_t j;
    for (i = 0; i < T_EL_NP; i++) {
        const double *gr = t_el_grad_of(m, i);
        for (j = 0; j < t_el_sizes[i]; j++) {
            double want = t_el_expect(who, n, step, i, j);
            if (m->mode == T_EL_FP16 ? fabs(gr[j] - want) > 0.01 : gr[j] != want) bad++;
        }
    }
    return bad;
}

static T_UNUSED void t_el_step_apply(t_el_model_t *m) {
    size_t off = 0, j;
    int i;
    for (i = 0; i < T_EL_NP; off += t_el_sizes[i], i++) {
        const double *gr = t_el_grad_of(m, i);
        for (j = 0; j < t_el_sizes[i]; j++) m->w[off + j] -= gr[j];
    }
}

/* The reducer's step counters, set as a commit round failing on some ranks would leave them. */
typedef struct { int64_t step, exchanged, committed; } t_el_poke_t;

static T_UNUSED void t_el_poke(ddp_reducer_t *r, const t_el_poke_t *s) {
    r->step = s->step;
    r->exchanged = s->exchanged;
    r->committed = s->committed;
}

#endif /* DDP_TEST_ELASTIC_H */
