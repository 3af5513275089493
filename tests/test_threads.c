/* SPDX-License-Identifier: MIT (see LICENSE) */
/* tests/test_threads.c — the in-process transport, transports/ddp_threads.h (issue 7). TAP.
 *
 *   build/test_threads      (DDP_TEST_ONLY=<scenario> runs one; DDP_TEST_QUICK=1, and the
 *                            sanitizer builds, run fewer world sizes and smaller big cases;
 *                            `make test-tsan` builds this file with -fsanitize=thread)
 *
 * Every rank is a thread of this process (ddp_comm_init_threads unless said otherwise), so the
 * transport's whole protocol, both sides, is in view of the sanitizers.
 *   results   n = 1..8: every peer is reached by "threads"; all-reduce (every dtype x op, avg
 *             included), reduce-scatter, all-gather, broadcast (root 0 and last), barrier, for
 *             counts 0, 1, 7, 128, 129, 1003 (128 x 8 bytes is the one-step threshold) and a big one
 *             (2 MiB of 8-byte elements), in place and out of place, against a reference
 *             computed sequentially from every rank's input (inputs on which every
 *             reduction order gives the same bits: tests/ddp_test_data.h). Out of place, the
 *             send buffer is unchanged; guard bytes around every buffer are untouched; the
 *             outputs of all-reduce, all-gather and broadcast are the same bytes on every rank.
 *             Also with DDP_THREADS_SMALL_MAX=0 (every size zero-copy) and 256.
 *   p2p       the same cases with DDP_THREADS_COLL=0: the ring, recursive doubling and their
 *             many messages over the point-to-point channels (4 KiB segments: windows full).
 *   rooted    ddp_reduce, ddp_gather, ddp_scatter (root 0 and last, tree and linear/chain
 *             sizes, in and out of place), ddp_all_to_all, and a group of 12 ddp_send to the
 *             next rank + 12 ddp_recv from the previous one (more than the window) + a send to
 *             itself.
 *   async     ddp_all_reduce_async x 6 (small and big) + an async broadcast, collected in
 *             reverse order; a blocking call in between.
 *   registered  n = 1..4: ddp_comm_mem_alloc gives ordinary memory here and stays collective:
 *             all-reduce on it in and out of place right, a size that differs on one rank
 *             gives DDP_ERR_MISMATCH and nothing on every rank, frees succeed, a second free is
 *             refused (under TSan too).
 *   mismatch  a rank all-reduces another count (small and big), a rank broadcasts while the
 *             others all-reduce, a send of 5 elements meets a recv of 6: DDP_ERR_MISMATCH (not a
 *             hang), explained.
 *   timeout   a rank never calls (all-reduce small and big, recv): DDP_ERR_TIMEOUT naming it,
 *             at the timeout.
 *   abort     ddp_comm_abort from another thread while rank 0 waits in an all-reduce (and in a
 *             recv): DDP_ERR_ABORTED within 1 s; the peer then fails with DDP_ERR_REMOTE
 *             naming rank 0.
 *   closed    a rank destroys its communicator while the others wait for it: DDP_ERR_REMOTE
 *             naming it, long before the timeout.
 *   hier      hierarchical all-reduce (issue 18), the thread ranks placed on fake hosts by
 *             DDP_TEST_HOSTS (still reached by "threads"): DDP_ALGO=hier_ring, hier_rd and
 *             hier_rabenseifner on 2+2, 3+1+2 (uneven) and 1+1, every dtype x op, counts
 *             {0, 1, 3, 1000, 100003}, in and out of place, checked bit for bit, plus random
 *             data (within (p+1) unit roundoffs, the same bits on every rank and when
 *             repeated) and (1<<20)+7 once per algorithm; the timeline (DDP_TRACE) shows
 *             that every all-reduce ran the algorithm asked for. Also hier_ring and
 *             hier_rabenseifner with 4 KiB segments, 3+2 (L = 2), non-consecutive hosts
 *             (1,0,1,0), one host, one rank, DDP_ALGO=hier and auto. A DDP_TEST_HOSTS with the
 *             wrong number of entries fails init with DDP_ERR_INVALID_ARGUMENT, saying so.
 *             Quick: each algorithm on one layout, hier_ring with 4 KiB segments, auto.
 *   process   4 ranks in 2 processes of 2 threads (ddp_comm_init): the peer in the same process
 *             is reached by "threads", the others by "shm"; collectives right (not under TSan).
 */
#define _GNU_SOURCE
#include "ddp.h"
#include "transports/ddp_tcp.h"
#include "transports/ddp_shm.h"
#include "transports/ddp_threads.h"
#include "tests/ddp_test.h"
#include "tests/ddp_test_data.h"

#include <math.h>
#include <pthread.h>

#define MAXN 8
#define GUARD 64
#define BIG ((size_t)(1u << 18) + 3)      /* 2 MiB of 8-byte elements */
#define NCOUNTS 6
static const size_t small_counts[NCOUNTS] = {0, 1, 7, 128, 129, 1003};

static int g_quick;

/* ----------------------------------------------------------------- thread ranks */
typedef struct world world_t;
typedef struct {
    world_t *w;
    int rank, checks, bad;
    char msg[700];
    ddp_result_t rc;                      /* scenario-specific */
    double t;
    char err[1100];
} rank_t;

struct world {
    int n;
    ddp_comm_t *comms[MAXN];
    pthread_barrier_t bar;
    rank_t ranks[MAXN];
    const unsigned char *out[MAXN];       /* each rank's output of the current case */
    void (*body)(rank_t *);
    const void *arg;
    int flag;                             /* scenario-specific, atomic */
};

static void rfail(rank_t *r, const char *fmt, ...) T_PRINTF(2, 3);
/* The first failure of a rank is kept; its communicator is aborted, so that the other ranks
 * fail at once instead of waiting for it until the timeout in every later case. */
static void rfail(rank_t *r, const char *fmt, ...) {
    va_list ap;
    if (r->bad++) return;
    va_start(ap, fmt);
    vsnprintf(r->msg, sizeof r->msg, fmt, ap);
    va_end(ap);
    if (r->w->comms[r->rank]) ddp_comm_abort(r->w->comms[r->rank]);
}

/* Every peer of R is reached by the threads transport (also on test hosts: a layout only). */
static void check_threads_transport(rank_t *R) {
    ddp_comm_t *c = R->w->comms[R->rank];
    int q;
    for (q = 0; q < R->w->n; q++) {
        const char *name = ddp_comm_transport_name(c, q);
        R->checks++;
        if (strcmp(name, q == R->rank ? "self" : "threads") != 0)
            rfail(R, "transport to rank %d is '%s', expected threads", q, name);
    }
}

static void *rank_main(void *arg) {
    rank_t *r = (rank_t *)arg;
    r->w->body(r);
    return NULL;
}

/* ddp_comm_init_threads(n) with desc, then body on n threads; 0 if init failed. Communicators
 * that a body leaves non-NULL are destroyed here. */
static int run_world(world_t *w, int n, const ddp_comm_desc_t *desc, void (*body)(rank_t *),
                     const void *arg) {
    pthread_t th[MAXN];
    ddp_result_t r;
    int i;
    memset(w, 0, sizeof *w);
    w->n = n;
    w->body = body;
    w->arg = arg;
    r = ddp_comm_init_threads(w->comms, n, desc);
    if (!ok(r == DDP_SUCCESS, "ddp_comm_init_threads(%d) -> %s %s", n, ddp_strerror(r),
            r ? ddp_last_init_error() : ""))
        return 0;
    pthread_barrier_init(&w->bar, NULL, (unsigned)n);
    for (i = 0; i < n; i++) {
        w->ranks[i].w = w;
        w->ranks[i].rank = i;
        pthread_create(&th[i], NULL, rank_main, &w->ranks[i]);
    }
    for (i = 0; i < n; i++) pthread_join(th[i], NULL);
    pthread_barrier_destroy(&w->bar);
    for (i = n - 1; i >= 0; i--)
        if (w->comms[i] && ddp_comm_destroy(w->comms[i]) != DDP_SUCCESS)
            ok(0, "destroy comm %d of %d", i, n);
    return 1;
}

static void report_world(const world_t *w, const char *what) {
    int i;
    for (i = 0; i < w->n; i++)
        ok(!w->ranks[i].bad, "%s, n = %d, rank %d: %d checks%s%s", what, w->n, i, w->ranks[i].checks,
           w->ranks[i].bad ? ", first failure: " : ", all right", w->ranks[i].bad ? w->ranks[i].msg : "");
}

/* ----------------------------------------------------------------- cases */
enum { C_AR, C_RS, C_AG, C_BC, C_BARRIER, C_REDUCE, C_GATHER, C_SCATTER, C_A2A, C_GROUP };
static const char *const coll_names[] = {"all_reduce", "reduce_scatter", "all_gather", "broadcast",
                                         "barrier", "reduce", "gather", "scatter", "all_to_all", "group"};

typedef struct {
    int coll, dt, op, inplace, root;
    int random;        /* floating all-reduce on uniform data: checked within a tolerance */
    size_t count;      /* AR/BC/reduce: elements; RS/scatter: per rank received; AG/gather: per rank
                        * sent; all_to_all: per block; group: the first message's */
    uint64_t seed;
} tc_t;

#define MAXCASES 4096
typedef struct { int n; tc_t c[MAXCASES]; } caselist_t;

static void add(caselist_t *L, int coll, int dt, int op, size_t count, int inplace, int root) {
    tc_t *c;
    if (L->n == MAXCASES) t_bail("too many cases");
    c = &L->c[L->n++];
    c->coll = coll; c->dt = dt; c->op = op; c->count = count; c->inplace = inplace; c->root = root;
    c->random = 0;
    c->seed = t_mix64(0x7468726561647300ull + (uint64_t)L->n);
}

static void case_str(const tc_t *c, int n, char *out, size_t cap) {
    snprintf(out, cap, "%s %s %s count %zu %s%s root %d (n = %d)", coll_names[c->coll],
             ddp_dtype_name((ddp_dtype_t)c->dt), ddp_op_name((ddp_op_t)c->op), c->count,
             c->inplace ? "in place" : "out of place", c->random ? " random" : "", c->root, n);
}

static int is_reduction(int coll) { return coll == C_AR || coll == C_RS || coll == C_REDUCE; }

/* What a case's inputs are (tests/ddp_test_data.h): reductions get order-independent values
 * (or uniform ones in a random case), copies any bits. */
static int case_how(const tc_t *c) {
    return c->random ? T_IN_UNIFORM : is_reduction(c->coll) ? T_IN_EXACT : T_IN_BITS;
}

/* Element i of rank's input. */
static uint64_t in_bits(const tc_t *c, int rank, size_t i) {
    return t_in_bits_one(case_how(c), c->dt, c->op, t_case_rnd(c->seed, rank, i));
}

/* The same inputs a range at a time (t_in_fill gives in_bits' bits). */
static void case_inputs(const tc_t *c, t_in_t *g) {
    t_in_init(g, case_how(c), c->dt, c->op, c->seed);
}

static void fill(unsigned char *buf, const tc_t *c, int rank, size_t lo, size_t n) {
    t_in_t g;
    case_inputs(c, &g);
    t_in_fill(&g, rank, lo, n, buf);
}

static uint64_t load(const unsigned char *buf, size_t i, size_t es) {
    uint64_t v = 0;
    memcpy(&v, buf + i * es, es);
    return v;
}

static uint64_t low_bits(uint64_t v, size_t es) { return es == 8 ? v : v & ((1ull << (8 * es)) - 1); }

/* The expected bits of reduction element gi over p ranks: the shared sequential reference
 * (tests/ddp_test_data.h), on the inputs in_bits gives. */
static uint64_t ref_reduce(const tc_t *c, int p, size_t gi) {
    return low_bits(t_ref_exact_one(case_how(c), c->dt, c->op, c->seed, p, gi), ddp_dtype_size((ddp_dtype_t)c->dt));
}

/* A random case's element gi: within (p+1) unit roundoffs of the double-precision reference
 * (PROD: 2p+2 of the product; AVG: the sum's bound divided by p, plus the division's). */
static int near_ref(const tc_t *c, int p, size_t gi, uint64_t got, double *ref, double *tol) {
    double sum = 0, abssum = 0, prod = 1, u = t_unit_roundoff(c->dt);
    int r;
    for (r = 0; r < p; r++) {
        double v = t_dec_float(c->dt, in_bits(c, r, gi));
        sum += v; abssum += fabs(v); prod *= v;
    }
    if (c->op == DDP_PROD) { *ref = prod; *tol = (2 * p + 2) * u * fabs(prod); }
    else if (c->op == DDP_AVG) { *ref = sum / p; *tol = (p + 1) * u * abssum / p + 2 * u * fabs(*ref); }
    else { *ref = sum; *tol = (p + 1) * u * abssum; }
    return fabs(t_dec_float(c->dt, got) - *ref) <= *tol;
}

static void guard_set(unsigned char *reg, size_t bytes) {
    memset(reg, 0x5a, GUARD);
    memset(reg + GUARD + bytes, 0x5a, GUARD);
}
static int guard_ok(const unsigned char *reg, size_t bytes) {
    size_t i;
    for (i = 0; i < GUARD; i++)
        if (reg[i] != 0x5a || reg[GUARD + bytes + i] != 0x5a) return 0;
    return 1;
}

/* Runs case c on this rank: fills, calls, checks; then (after everyone is done) compares the
 * outputs that must be equal on every rank. sreg/rreg have room for the biggest case. */
static void run_case(rank_t *R, const tc_t *c, unsigned char *sreg, unsigned char *rreg) {
    world_t *w = R->w;
    const int p = w->n, me = R->rank;
    const size_t es = ddp_dtype_size((ddp_dtype_t)c->dt), n = c->count;
    const ddp_dtype_t dt = (ddp_dtype_t)c->dt;
    const ddp_op_t op = (ddp_op_t)c->op;
    size_t in_n = n, out_n = n, i, lo = 0, hi;
    unsigned char *sb = sreg + GUARD, *rb = rreg + GUARD;
    const unsigned char *send = NULL;
    unsigned char *recv = NULL, *out;
    ddp_result_t r;
    int same_everywhere;
    char what[160];
    if (c->coll == C_RS) in_n = n * (size_t)p;
    if (c->coll == C_AG) out_n = n * (size_t)p;
    guard_set(sreg, in_n * es);
    guard_set(rreg, (in_n > out_n ? in_n : out_n) * es);
    memset(rb, 0xa5, out_n * es);
    switch (c->coll) {
    case C_AR:
        if (c->inplace) { fill(rb, c, me, 0, n); send = recv = rb; }
        else { fill(sb, c, me, 0, n); send = sb; recv = rb; }
        break;
    case C_RS:
        if (c->inplace) { fill(rb, c, me, 0, in_n); send = rb; recv = rb + (size_t)me * n * es; }
        else { fill(sb, c, me, 0, in_n); send = sb; recv = rb; }
        break;
    case C_AG:
        if (c->inplace) { fill(rb + (size_t)me * n * es, c, me, 0, n); send = rb + (size_t)me * n * es; }
        else { fill(sb, c, me, 0, n); send = sb; }
        recv = rb;
        break;
    default:   /* C_BC */
        if (c->inplace) { if (me == c->root) fill(rb, c, me, 0, n); send = recv = rb; }
        else { if (me == c->root) { fill(sb, c, me, 0, n); send = sb; } recv = rb; }
        break;
    }
    if (!n && !c->inplace) { send = NULL; recv = NULL; }    /* count 0: NULL buffers are fine */
    same_everywhere = (c->coll == C_AR || c->coll == C_AG || c->coll == C_BC) && out_n;
    out = c->coll == C_RS && c->inplace ? rb + (size_t)me * n * es : rb;
    if (R->bad) goto compare;   /* after a failure: no more calls, but the barriers below */
    switch (c->coll) {
    case C_AR: r = ddp_all_reduce(send, recv, n, dt, op, w->comms[me]); break;
    case C_RS: r = ddp_reduce_scatter(send, recv, n, dt, op, w->comms[me]); break;
    case C_AG: r = ddp_all_gather(send, recv, n, dt, w->comms[me]); break;
    default: r = ddp_broadcast(send, recv, n, dt, c->root, w->comms[me]); break;
    }
    R->checks++;
    if (r != DDP_SUCCESS) {
        case_str(c, p, what, sizeof what);
        rfail(R, "%s -> %s: %s", what, ddp_strerror(r), ddp_comm_last_error(w->comms[me]));
        goto compare;
    }
    /* Verify: all of it for small cases; this rank's slice of a big all-reduce (the comparison
     * between ranks below covers the rest). */
    hi = out_n;
    if (c->coll == C_AR && n > 10000) { lo = n * (size_t)me / (size_t)p; hi = n * (size_t)(me + 1) / (size_t)p; }
    if ((c->coll == C_AR || c->coll == C_RS) && !c->random) {
        /* The reductions' reference a block at a time (t_in_ref_exact: ref_reduce's bits); the
         * element loop below then reports the first element that differs, if one does. */
        const size_t base = c->coll == C_RS ? (size_t)me * n : 0;
        t_in_t g;
        case_inputs(c, &g);
        while (lo < hi) {
            const size_t m = hi - lo < T_IN_BLOCK ? hi - lo : T_IN_BLOCK;
            uint64_t ref[T_IN_BLOCK];
            unsigned char want[T_IN_BLOCK * 8];
            t_in_ref_exact(&g, p, base + lo, m, ref);
            t_in_narrow(es, ref, m, want);
            if (memcmp(out + lo * es, want, m * es) != 0) break;
            lo += m;
        }
    }
    for (i = lo; i < hi; i++) {
        uint64_t want, got = load(out, i, es);
        if (c->random) {
            double ref, tol;
            if (near_ref(c, p, c->coll == C_RS ? (size_t)me * n + i : i, got, &ref, &tol)) continue;
            case_str(c, p, what, sizeof what);
            rfail(R, "%s: element %zu is %.9g, reference %.9g, tolerance %.3g", what, i,
                  t_dec_float(c->dt, got), ref, tol);
            break;
        }
        switch (c->coll) {
        case C_AR: want = ref_reduce(c, p, i); break;
        case C_RS: want = ref_reduce(c, p, (size_t)me * n + i); break;
        case C_AG: want = low_bits(in_bits(c, (int)(i / n), i % n), es); break;
        default: want = low_bits(in_bits(c, c->root, i), es); break;
        }
        if (got != want) {
            case_str(c, p, what, sizeof what);
            rfail(R, "%s: element %zu is %llx, expected %llx", what, i, (unsigned long long)got,
                  (unsigned long long)want);
            break;
        }
    }
    if (!c->inplace && send && (c->coll != C_BC || me == c->root)) {
        t_in_t g;
        case_inputs(c, &g);
        i = t_in_first_diff(&g, me, 0, sb, in_n);
        if (i < in_n) { case_str(c, p, what, sizeof what); rfail(R, "%s: send buffer changed at %zu", what, i); }
    }
    if (!guard_ok(sreg, in_n * es) || !guard_ok(rreg, (in_n > out_n ? in_n : out_n) * es)) {
        case_str(c, p, what, sizeof what);
        rfail(R, "%s: guard bytes around a buffer overwritten", what);
    }
    /* Determinism: the same all-reduce again, out of place, gives the same bits. */
    if (c->random && c->coll == C_AR && n && !R->bad) {
        unsigned char *again = (unsigned char *)malloc(n * es);
        fill(sb, c, me, 0, n);
        r = again ? ddp_all_reduce(sb, again, n, dt, op, w->comms[me]) : DDP_ERR_OUT_OF_MEMORY;
        R->checks++;
        case_str(c, p, what, sizeof what);
        if (r != DDP_SUCCESS) rfail(R, "%s, repeated -> %s: %s", what, ddp_strerror(r), ddp_comm_last_error(w->comms[me]));
        else if (memcmp(again, out, n * es) != 0) rfail(R, "%s: repeating the call gave different bits", what);
        free(again);
    }
compare:
    /* Every rank passes both barriers of a case whatever happened, so nobody waits here for a
     * rank that gave up. */
    if (!same_everywhere) return;
    w->out[me] = out;
    pthread_barrier_wait(&w->bar);
    if (!R->bad && !w->ranks[0].bad && memcmp(out, w->out[0], out_n * es) != 0) {
        case_str(c, p, what, sizeof what);
        rfail(R, "%s: this rank's output differs from rank 0's", what);
    }
    pthread_barrier_wait(&w->bar);        /* nobody reuses its buffer while others compare */
}

static void build_results(caselist_t *L, int p, int big_all) {
    int dt, op, k, ip, root;
    const size_t big = g_quick ? BIG / 4 : BIG;
    L->n = 0;
    for (dt = 0; dt < DDP_NUM_DTYPES; dt++)
        for (op = 0; op < DDP_NUM_OPS; op++)
            for (k = 0; k < NCOUNTS; k++)
                for (ip = 0; ip < 2; ip++) {
                    if (g_quick && (k == 3 || (ip && (dt + op + k) % 2))) continue;
                    add(L, C_AR, dt, op, small_counts[k], ip, 0);
                    if (!g_quick || (dt + op) % 3 == 0) add(L, C_RS, dt, op, small_counts[k], ip, 0);
                }
    for (dt = 0; dt < DDP_NUM_DTYPES; dt++)
        for (k = 0; k < NCOUNTS; k++)
            for (ip = 0; ip < 2; ip++) {
                if (g_quick && dt % 3) continue;
                add(L, C_AG, dt, DDP_SUM, small_counts[k], ip, 0);
                for (root = 0; root < 2; root++) add(L, C_BC, dt, DDP_SUM, small_counts[k], ip, root ? p - 1 : 0);
            }
    /* Big: every dtype, one op each (all ops met), in place and out alternating; AVG again for
     * the floating types. Reduce-scatter and all-gather: the same whole-buffer size. */
    for (dt = 0; dt < DDP_NUM_DTYPES; dt++) {
        if (!big_all && dt % 3) continue;
        add(L, C_AR, dt, dt % DDP_NUM_OPS, big, dt & 1, 0);
        if (!t_is_int(dt)) add(L, C_AR, dt, DDP_AVG, big + 1, !(dt & 1), 0);
        add(L, C_RS, dt, (dt + 2) % DDP_NUM_OPS, (big + (size_t)p - 1) / (size_t)p, !(dt & 1), 0);
        add(L, C_AG, dt, DDP_SUM, (big + (size_t)p - 1) / (size_t)p, dt & 1, 0);
        add(L, C_BC, dt, DDP_SUM, big, dt & 1, dt % 2 ? p - 1 : 0);
    }
    add(L, C_BARRIER, 0, 0, 0, 0, 0);
}

static void results_body(rank_t *R) {
    const caselist_t *L = (const caselist_t *)R->w->arg;
    const size_t cap = (BIG + 2 * MAXN) * 8 + 2 * GUARD;
    unsigned char *sreg = (unsigned char *)malloc(cap), *rreg = (unsigned char *)malloc(cap);
    ddp_comm_t *c = R->w->comms[R->rank];
    int k;
    if (!sreg || !rreg) { rfail(R, "out of memory"); free(sreg); free(rreg); return; }
    check_threads_transport(R);
    for (k = 0; k < L->n; k++) {
        if (L->c[k].coll == C_BARRIER) {
            R->checks++;
            if (!R->bad && ddp_barrier(c) != DDP_SUCCESS) rfail(R, "barrier: %s", ddp_comm_last_error(c));
            continue;
        }
        run_case(R, &L->c[k], sreg, rreg);
    }
    free(sreg);
    free(rreg);
}

static caselist_t g_cases;

static void run_results(const char *label, int n, size_t segment, int big_all) {
    world_t w;
    ddp_comm_desc_t d;
    memset(&d, 0, sizeof d);
    d.timeout_ms = 60000;
    d.segment_bytes = segment;
    build_results(&g_cases, n, big_all);
    if (run_world(&w, n, &d, results_body, &g_cases)) {
        char what[96];
        snprintf(what, sizeof what, "%s (%d cases)", label, g_cases.n);
        report_world(&w, what);
    }
}

/* ----------------------------------------------------------------- hierarchical */
/* All-reduce alone: every dtype x op, counts {0, 1, 3, 1000, 100003}, in and out of place;
 * random data (floating SUM/PROD/AVG; tolerance, determinism); big_dt >= 0: (1<<20)+7 once, of
 * that dtype with op big_op. Quick (sanitizers): 100003 for a third of the dtype x op pairs. */
static void build_hier(caselist_t *L, int big_dt, int big_op) {
    static const size_t counts[5] = {0, 1, 3, 1000, 100003};
    static const int fdts[4] = {DDP_FLOAT16, DDP_BFLOAT16, DDP_FLOAT32, DDP_FLOAT64};
    int dt, op, k, ip;
    L->n = 0;
    for (dt = 0; dt < DDP_NUM_DTYPES; dt++)
        for (op = 0; op < DDP_NUM_OPS; op++)
            for (k = 0; k < 5; k++)
                for (ip = 0; ip < 2; ip++) {
                    if (g_quick && k == 4 && (dt + op + ip) % 3) continue;
                    add(L, C_AR, dt, op, counts[k], ip, 0);
                }
    for (dt = 0; dt < 4; dt++)
        for (op = 0; op < 3; op++)
            for (k = 3; k < 5; k++) {
                static const int fops[3] = {DDP_SUM, DDP_PROD, DDP_AVG};
                if (g_quick && k == 4 && (dt + op) % 3) continue;
                add(L, C_AR, fdts[dt], fops[op], counts[k], (dt + op + k) % 2, 0);
                L->c[L->n - 1].random = 1;
            }
    if (big_dt >= 0) add(L, C_AR, big_dt, big_op, ((size_t)1 << 20) + 7, big_dt % 2, 0);
}

static void hier_body(rank_t *R) {
    const caselist_t *L = (const caselist_t *)R->w->arg;
    size_t cap = 64;
    unsigned char *sreg, *rreg;
    int k;
    for (k = 0; k < L->n; k++) {
        size_t b = L->c[k].count * ddp_dtype_size((ddp_dtype_t)L->c[k].dt);
        if (b > cap) cap = b;
    }
    sreg = (unsigned char *)malloc(cap + 2 * GUARD);
    rreg = (unsigned char *)malloc(cap + 2 * GUARD);
    if (!sreg || !rreg) { rfail(R, "out of memory"); free(sreg); free(rreg); return; }
    check_threads_transport(R);
    for (k = 0; k < L->n; k++) run_case(R, &L->c[k], sreg, rreg);
    free(sreg);
    free(rreg);
}

/* Where the hier worlds write their timelines (DDP_TRACE): which algorithm ran. */
static char g_trace_dir[512];

/* The all-reduce events of the DDP_TRACE file `path`: how many, and how many of them ran an
 * algorithm whose name does not start with `want` (when `also` is not NULL, nor is `also`).
 * The names met are appended to seen. -1 if there is no such file. */
static int trace_algorithms(const char *path, const char *want, const char *also, int *other,
                            char *seen, size_t cap) {
    FILE *f = fopen(path, "r");
    char line[4096];
    int events = 0;
    if (!f) return -1;
    while (fgets(line, sizeof line, f)) {
        char name[64];
        size_t len;
        if (!t_trace_all_reduce_algo(line, name, sizeof name)) continue;
        len = strlen(name);
        events++;
        if (strncmp(name, want, strlen(want)) != 0 && !(also && !strcmp(name, also))) (*other)++;
        if (!strstr(seen, name) && strlen(seen) + len + 3 < cap) { if (*seen) strcat(seen, ", "); strcat(seen, name); }
    }
    fclose(f);
    return events;
}

/* One world of thread ranks on the fake hosts `hosts` (DDP_TEST_HOSTS) with DDP_ALGO=algo. */
static void run_hier_world(const char *label, const char *hosts, const char *algo, size_t segment,
                           int big_dt, int big_op) {
    world_t w;
    ddp_comm_desc_t d;
    int n = 1;
    const char *s;
    char path[600];
    for (s = hosts; *s; s++) n += *s == ',';
    memset(&d, 0, sizeof d);
    d.timeout_ms = 60000;
    d.segment_bytes = segment;
    setenv("DDP_TEST_HOSTS", hosts, 1);
    setenv("DDP_ALGO", algo, 1);
    snprintf(path, sizeof path, "%s/rank%%r.json", g_trace_dir);
    if (g_trace_dir[0]) setenv("DDP_TRACE", path, 1);
    build_hier(&g_cases, big_dt, big_op);
    diag("--- hier: DDP_TEST_HOSTS=%s (%s), DDP_ALGO=%s%s", hosts, label, algo, segment ? ", 4 KiB segments" : "");
    if (run_world(&w, n, &d, hier_body, &g_cases)) {
        char what[160], seen[400] = "";
        int i, events = 0, other = 0, missing = 0;
        /* DDP_ALGO=hier_X runs X across hosts (hier_rd: Rabenseifner above the scratch); hier:
         * one of the three; auto: anything. */
        const char *want = !strcmp(algo, "hier_ring") ? "hierarchical (ring across hosts)"
                         : !strcmp(algo, "hier_rd") ? "hierarchical (recursive doubling across hosts)"
                         : !strcmp(algo, "hier_rabenseifner") ? "hierarchical (rabenseifner across hosts)"
                         : !strcmp(algo, "hier") ? "hierarchical" : "";
        snprintf(what, sizeof what, "all_reduce, hosts %s (%s), DDP_ALGO=%s%s (%d cases)", hosts, label, algo,
                 segment ? ", 4 KiB segments" : "", g_cases.n);
        report_world(&w, what);
        for (i = 0; g_trace_dir[0] && i < n; i++) {
            int e;
            snprintf(path, sizeof path, "%s/rank%d.json", g_trace_dir, i);
            e = trace_algorithms(path, want, !strcmp(algo, "hier_rd") ? "hierarchical (rabenseifner across hosts)" : NULL,
                                 &other, seen, sizeof seen);
            if (e < 0) missing++; else events += e;
            unlink(path);
        }
        if (!g_trace_dir[0]) diag("no trace directory: the algorithm is not checked");
        else if (!*want) diag("... DDP_ALGO=%s chose: %s", algo, seen);
        else ok(!missing && events > 0 && !other, "... every all-reduce ran %s%s (trace of %d ranks, %d events: %s)",
                want, !strcmp(algo, "hier_rd") ? " or Rabenseifner across hosts" : "", n - missing, events, seen);
    }
    unsetenv("DDP_TEST_HOSTS");
    unsetenv("DDP_ALGO");
    unsetenv("DDP_TRACE");
}

/* DDP_TEST_HOSTS naming another number of ranks than the world's: init fails, explained. */
static void run_hier_bad_hosts(void) {
    static const char *const bad[2] = {"0,0,1", "0,0,1,1,1"};
    int k, i;
    for (k = 0; k < 2; k++) {
        ddp_comm_t *comms[4] = {NULL, NULL, NULL, NULL};
        ddp_comm_desc_t d;
        ddp_result_t r;
        int left = 0;
        memset(&d, 0, sizeof d);
        d.timeout_ms = 10000;
        d.log_level = 1;
        setenv("DDP_TEST_HOSTS", bad[k], 1);
        r = ddp_comm_init_threads(comms, 4, &d);
        unsetenv("DDP_TEST_HOSTS");
        for (i = 0; i < 4; i++)
            if (comms[i]) { left++; if (r == DDP_SUCCESS) ddp_comm_destroy(comms[i]); }
        ok(r == DDP_ERR_INVALID_ARGUMENT && !left, "4 thread ranks, DDP_TEST_HOSTS=%s (%d entries): %s, "
           "%d communicators left", bad[k], k ? 5 : 3, ddp_strerror(r), left);
        ok(r != DDP_SUCCESS && strstr(ddp_last_init_error(), "DDP_TEST_HOSTS") != NULL,
           "... the error names DDP_TEST_HOSTS: %s", r != DDP_SUCCESS ? ddp_last_init_error() : "(init succeeded)");
    }
}

/* Splits of a communicator on test hosts 0,0,1,1 (DDP_ALGO=hier_ring): across the hosts
 * (colour rank % 2: one rank per host) and inside each (colour rank / 2): each child keeps its
 * members' test hosts (it cannot read them again from DDP_TEST_HOSTS, which names the parent's
 * four), and its all-reduce is right. */
static void hier_split_body(rank_t *R) {
    ddp_comm_t *c = R->w->comms[R->rank];
    float x[1001];
    int k, i;
    for (k = 0; k < 2 && !R->bad; k++) {
        ddp_comm_t *sub = NULL;
        const int color = k ? R->rank / 2 : R->rank % 2;
        ddp_result_t r = ddp_comm_split(c, color, R->rank, &sub);
        if (r != DDP_SUCCESS || !sub) { rfail(R, "split %d: %s: %s", k, ddp_strerror(r), ddp_comm_last_error(c)); break; }
        for (i = 0; i < 1001; i++) x[i] = (float)(R->rank + i % 5);
        r = ddp_all_reduce(x, x, 1001, DDP_FLOAT32, DDP_SUM, sub);
        for (i = 0; i < 1001 && r == DDP_SUCCESS; i++) {
            /* members: {c, c + 2} across, {2c, 2c + 1} inside */
            const float want = (float)(k ? 4 * color + 1 : 2 * color + 2) + 2.0f * (float)(i % 5);
            if (x[i] != want) { rfail(R, "split %d: element %d = %g, expected %g", k, i, (double)x[i], (double)want); break; }
        }
        if (r != DDP_SUCCESS) rfail(R, "split %d all_reduce: %s: %s", k, ddp_strerror(r), ddp_comm_last_error(sub));
        R->checks++;
        ddp_comm_destroy(sub);
    }
}

static void run_hier_split(void) {
    world_t w;
    ddp_comm_desc_t d;
    memset(&d, 0, sizeof d);
    d.timeout_ms = 60000;
    setenv("DDP_TEST_HOSTS", "0,0,1,1", 1);
    setenv("DDP_ALGO", "hier_ring", 1);
    if (run_world(&w, 4, &d, hier_split_body, NULL))
        report_world(&w, "DDP_TEST_HOSTS=0,0,1,1, hier_ring: comm_split across the hosts and inside each, "
                     "then an all-reduce in each child");
    unsetenv("DDP_TEST_HOSTS");
    unsetenv("DDP_ALGO");
}

/* Hierarchical all-reduce with the thread ranks on fake hosts: even (2+2), uneven (3+1+2:
 * L = 1, the other ranks of the first and last hosts only forward inside them), one rank per
 * host (1+1); each algorithm meets the big count once, on 3+1+2. Then the smallest segments,
 * hosts whose ranks are not consecutive, the library's choices (hier, auto). */
static void run_hier(void) {
    static const char *const hosts[3] = {"0,0,1,1", "0,0,0,1,2,2", "0,1"};
    static const char *const labels[3] = {"2+2", "3+1+2", "1+1"};
    static const char *const algos[3] = {"hier_ring", "hier_rd", "hier_rabenseifner"};
    static const int big_dts[3] = {DDP_FLOAT32, DDP_UINT8, DDP_FLOAT64};
    static const int big_ops[3] = {DDP_AVG, DDP_MIN, DDP_SUM};
    int a, l;
    snprintf(g_trace_dir, sizeof g_trace_dir, "%s/ddp_test_threads_XXXXXX", t_tmpdir());
    if (!mkdtemp(g_trace_dir)) g_trace_dir[0] = 0;
    for (a = 0; a < 3; a++)
        for (l = 0; l < 3; l++) {
            if (g_quick && l != a) continue;
            run_hier_world(labels[l], hosts[l], algos[a], 0, l == 1 || g_quick ? big_dts[a] : -1, big_ops[a]);
        }
    run_hier_world("3+1+2", hosts[1], "hier_ring", 4096, -1, 0);
    if (!g_quick) {
        run_hier_world("3+1+2", hosts[1], "hier_rabenseifner", 4096, -1, 0);
        run_hier_world("3+2: L = 2, rank 2 forwards", "0,0,0,1,1", "hier_rd", 0, -1, 0);
        run_hier_world("hosts 1 and 0 alternating", "1,0,1,0", "hier_rabenseifner", 0, -1, 0);
        run_hier_world("one host", "a,a,a", "hier_ring", 0, -1, 0);
        run_hier_world("one rank", "0", "hier_rd", 0, -1, 0);
        run_hier_world("3+1+2", hosts[1], "hier", 0, -1, 0);
    }
    run_hier_world("2+2", hosts[0], "auto", 0, -1, 0);
    if (g_trace_dir[0]) rmdir(g_trace_dir);
    run_hier_bad_hosts();
    run_hier_split();
}

/* ----------------------------------------------------------------- rooted and p2p */
static void rooted_body(rank_t *R) {
    world_t *w = R->w;
    ddp_comm_t *c = w->comms[R->rank];
    const int p = w->n, me = R->rank;
    static const int dts[4] = {DDP_FLOAT32, DDP_INT32, DDP_FLOAT16, DDP_UINT8};
    static const int ops[4] = {DDP_AVG, DDP_SUM, DDP_SUM, DDP_MAX};
    const size_t counts[5] = {0, 1, 7, 1003, g_quick ? 20011 : 100003};
    size_t cap = 100003 * 4 * (size_t)p + 64 < (1u << 20) ? (1u << 20) : 100003 * 4 * (size_t)p + 64, i, es;
    unsigned char *sb = (unsigned char *)malloc(cap), *rb = (unsigned char *)malloc(cap);
    int di, k, root, ip, kind;
    char what[200];
    tc_t tc;
    if (!sb || !rb) { rfail(R, "out of memory"); free(sb); free(rb); return; }
    memset(&tc, 0, sizeof tc);
    for (kind = C_REDUCE; kind <= C_A2A && !R->bad; kind++)
        for (di = 0; di < 4 && !R->bad; di++)
            for (k = 0; k < 5 && !R->bad; k++)
                for (root = 0; root < (kind == C_A2A ? 1 : 2) && !R->bad; root++)
                    for (ip = 0; ip < (kind == C_A2A ? 1 : 2) && !R->bad; ip++) {
                        const size_t n = counts[k];
                        const int rt = root ? p - 1 : 0, at_root = me == rt;
                        ddp_result_t r;
                        tc.coll = kind; tc.dt = dts[di]; tc.op = kind == C_REDUCE ? ops[di] : DDP_SUM;
                        tc.count = n; tc.inplace = ip; tc.root = rt;
                        tc.seed = t_mix64(0x726f6f746564ull + (uint64_t)(((kind * 4 + di) * 5 + k) * 4 + root * 2 + ip));
                        es = ddp_dtype_size((ddp_dtype_t)tc.dt);
                        memset(rb, 0xa5, n * es * (size_t)p);
                        switch (kind) {
                        case C_REDUCE:
                            fill(ip && at_root ? rb : sb, &tc, me, 0, n);
                            r = ddp_reduce(ip && at_root ? rb : sb, at_root ? rb : NULL, n,
                                           (ddp_dtype_t)tc.dt, (ddp_op_t)tc.op, rt, c);
                            break;
                        case C_GATHER:
                            fill(ip && at_root ? rb + (size_t)me * n * es : sb, &tc, me, 0, n);
                            r = ddp_gather(ip && at_root ? rb + (size_t)me * n * es : sb, at_root ? rb : NULL, n,
                                           (ddp_dtype_t)tc.dt, rt, c);
                            break;
                        case C_SCATTER:
                            if (at_root) fill(ip ? rb : sb, &tc, me, 0, n * (size_t)p);
                            r = ddp_scatter(at_root ? (ip ? rb : sb) : NULL,
                                            ip && at_root ? rb + (size_t)me * n * es : rb, n, (ddp_dtype_t)tc.dt, rt, c);
                            break;
                        default:
                            fill(sb, &tc, me, 0, n * (size_t)p);
                            r = ddp_all_to_all(sb, rb, n, (ddp_dtype_t)tc.dt, c);
                            break;
                        }
                        R->checks++;
                        case_str(&tc, p, what, sizeof what);
                        if (r != DDP_SUCCESS) { rfail(R, "%s -> %s: %s", what, ddp_strerror(r), ddp_comm_last_error(c)); break; }
                        for (i = 0; i < n * (size_t)p; i++) {
                            uint64_t want, got;
                            const unsigned char *out = rb;
                            size_t j = i;
                            if (kind == C_REDUCE) { if (!at_root || i >= n) break; want = ref_reduce(&tc, p, i); }
                            else if (kind == C_GATHER) { if (!at_root) break; want = low_bits(in_bits(&tc, (int)(i / n), i % n), es); }
                            else if (kind == C_SCATTER) {
                                if (i >= n) break;
                                if (ip && at_root) out = rb + (size_t)me * n * es;
                                want = low_bits(in_bits(&tc, rt, (size_t)me * n + i), es);
                            } else want = low_bits(in_bits(&tc, (int)(i / n), (size_t)me * n + i % n), es);
                            got = load(out, j, es);
                            if (got != want) {
                                rfail(R, "%s: element %zu is %llx, expected %llx", what, i,
                                      (unsigned long long)got, (unsigned long long)want);
                                break;
                            }
                        }
                    }
    /* A group: 12 messages to the next rank and 12 from the previous one (more than
     * DDP_RING_WINDOW in flight per direction), sizes 1..~300000 bytes, and one to itself. */
    if (!R->bad) {
        const int next = (me + 1) % p, prev = (me + p - 1) % p, nmsg = 12;
        size_t off[13], total = 0;
        unsigned char *self_in = (unsigned char *)malloc(4096), *self_out = (unsigned char *)malloc(4096);
        ddp_result_t r;
        int m;
        for (m = 0; m < nmsg; m++) { off[m] = total; total += (size_t)(m % 4 == 3 ? 70001 : m * 37 + 1); }
        off[nmsg] = total;
        if (total * 4 > cap || !self_in || !self_out) { rfail(R, "group: buffers"); free(self_in); free(self_out); goto out; }
        memset(&tc, 0, sizeof tc);
        tc.coll = C_GROUP; tc.dt = DDP_FLOAT32; tc.seed = 0x67726f7570ull;
        fill(sb, &tc, me, 0, total);
        memset(rb, 0xa5, total * 4);
        for (i = 0; i < 1024; i++) { uint32_t v = (uint32_t)(i * 2654435761u) ^ (uint32_t)me; memcpy(self_in + 4 * i, &v, 4); }
        ddp_group_start(c);
        for (m = 0; m < nmsg; m++) {
            if (p > 1) {
                ddp_send(sb + off[m] * 4, off[m + 1] - off[m], DDP_FLOAT32, next, c);
                ddp_recv(rb + off[m] * 4, off[m + 1] - off[m], DDP_FLOAT32, prev, c);
            }
        }
        ddp_send(self_in, 1024, DDP_FLOAT32, me, c);
        ddp_recv(self_out, 1024, DDP_FLOAT32, me, c);
        r = ddp_group_end(c);
        R->checks++;
        if (r != DDP_SUCCESS) rfail(R, "group of %d sends + %d recvs -> %s: %s", nmsg, nmsg, ddp_strerror(r), ddp_comm_last_error(c));
        else {
            for (i = 0; p > 1 && i < total; i++)
                if (load(rb, i, 4) != low_bits(in_bits(&tc, prev, i), 4)) {
                    rfail(R, "group: element %zu from rank %d wrong", i, prev);
                    break;
                }
            if (memcmp(self_in, self_out, 4096) != 0) rfail(R, "group: the send to itself arrived wrong");
        }
        free(self_in);
        free(self_out);
    }
out:
    free(sb);
    free(rb);
}

static void run_rooted(int n) {
    world_t w;
    ddp_comm_desc_t d;
    memset(&d, 0, sizeof d);
    d.timeout_ms = 60000;
    if (run_world(&w, n, &d, rooted_body, NULL)) report_world(&w, "reduce/gather/scatter/all_to_all/group");
}

/* ----------------------------------------------------------------- async */
static void async_body(rank_t *R) {
    world_t *w = R->w;
    ddp_comm_t *c = w->comms[R->rank];
    const int p = w->n;
    enum { NA = 6 };
    static const size_t counts[NA] = {1, 2, 100, 1000, 70001, 300000};
    float *buf[NA], *bc;
    ddp_request_t req[NA + 1];
    ddp_result_t r;
    int k;
    size_t i;
    for (k = 0; k < NA; k++) {
        buf[k] = (float *)malloc(counts[k] * sizeof(float));
        for (i = 0; i < counts[k]; i++) buf[k][i] = (float)(R->rank + 1) * (float)(i % 7 + k);
    }
    bc = (float *)malloc(5000 * sizeof(float));
    for (i = 0; i < 5000; i++) bc[i] = R->rank == p - 1 ? (float)i : -1.0f;
    for (k = 0; k < NA; k++) {
        r = ddp_all_reduce_async(buf[k], buf[k], counts[k], DDP_FLOAT32, DDP_SUM, c, &req[k]);
        if (r != DDP_SUCCESS) rfail(R, "all_reduce_async #%d -> %s", k, ddp_strerror(r));
        if (k == 2) {   /* a blocking call waits for what was issued before it */
            R->checks++;
            if ((r = ddp_barrier(c)) != DDP_SUCCESS) rfail(R, "barrier between async calls -> %s", ddp_strerror(r));
        }
    }
    r = ddp_broadcast_async(bc, bc, 5000, DDP_FLOAT32, p - 1, c, &req[NA]);
    if (r != DDP_SUCCESS) rfail(R, "broadcast_async -> %s", ddp_strerror(r));
    for (k = NA; k >= 0; k--) {
        R->checks++;
        if ((r = ddp_wait(&req[k])) != DDP_SUCCESS) rfail(R, "wait #%d -> %s: %s", k, ddp_strerror(r), ddp_comm_last_error(c));
    }
    for (k = 0; k < NA; k++) {
        for (i = 0; i < counts[k]; i++)
            if (buf[k][i] != (float)(p * (p + 1) / 2) * (float)(i % 7 + k)) {
                rfail(R, "async all_reduce #%d (%zu floats): element %zu is %g", k, counts[k], i, (double)buf[k][i]);
                break;
            }
        free(buf[k]);
    }
    for (i = 0; i < 5000; i++) if (bc[i] != (float)i) { rfail(R, "async broadcast: element %zu", i); break; }
    free(bc);
}

/* ----------------------------------------------------------------- failures */
typedef struct { int what; size_t count; } fail_arg_t;

static void mismatch_body(rank_t *R) {
    world_t *w = R->w;
    const fail_arg_t *a = (const fail_arg_t *)w->arg;
    ddp_comm_t *c = w->comms[R->rank];
    size_t n = a->count;
    float *x = (float *)calloc(n + 8, sizeof(float));
    double t0 = t_now();
    if (a->what == 0) R->rc = ddp_all_reduce(x, x, R->rank == 1 ? n + 1 : n, DDP_FLOAT32, DDP_SUM, c);
    else if (a->what == 1) R->rc = R->rank == 0 ? ddp_broadcast(x, x, n, DDP_FLOAT32, 0, c)
                                                : ddp_all_reduce(x, x, n, DDP_FLOAT32, DDP_SUM, c);
    else if (R->rank == 0) R->rc = ddp_send(x, 5, DDP_FLOAT32, 1, c);
    else if (R->rank == 1) R->rc = ddp_recv(x, 6, DDP_FLOAT32, 0, c);
    R->t = t_now() - t0;
    snprintf(R->err, sizeof R->err, "%s", ddp_comm_last_error(c));
    free(x);
}

static void run_mismatch(void) {
    static const char *const names[] = {"rank 1 all-reduces one element more", "rank 0 broadcasts, the others all-reduce",
                                        "a send of 5 floats meets a recv of 6"};
    const size_t sizes[2] = {10, 100000};
    int what, s, i;
    for (what = 0; what < 3; what++)
        for (s = 0; s < (what == 2 ? 1 : 2); s++) {
            world_t w;
            fail_arg_t a;
            ddp_comm_desc_t d;
            int nmis = 0, nret = 0, explained = 0, p = what == 2 ? 2 : 3;
            double worst = 0;
            memset(&d, 0, sizeof d);
            d.timeout_ms = 20000;
            d.log_level = 1;
            a.what = what;
            a.count = sizes[s];
            if (!run_world(&w, p, &d, mismatch_body, &a)) continue;
            for (i = 0; i < p; i++) {
                if (w.ranks[i].rc != DDP_SUCCESS) nret++;
                if (w.ranks[i].rc == DDP_ERR_MISMATCH) {
                    nmis++;
                    if (strstr(w.ranks[i].err, "different")) explained = i + 1;
                }
                if (w.ranks[i].t > worst) worst = w.ranks[i].t;
            }
            ok(nret == p && nmis >= 1 && worst < 10, "%s (%zu floats): %d of %d ranks fail, %d with "
               "DDP_ERR_MISMATCH, the slowest after %.2f s", names[what], a.count, nret, p, nmis, worst);
            ok(explained, "... explained: %s", explained ? w.ranks[explained - 1].err : w.ranks[0].err);
            if (what == 2)
                ok(w.ranks[0].rc == DDP_ERR_MISMATCH && w.ranks[1].rc == DDP_ERR_MISMATCH &&
                   t_mentions_rank(w.ranks[1].err, 0) && t_mentions_rank(w.ranks[0].err, 1),
                   "both sides of the send/recv say DDP_ERR_MISMATCH and name each other: %s | %s",
                   w.ranks[0].err, w.ranks[1].err);
        }
}

/* Rank p-1 never calls (it waits until the others returned, then only destroys). */
static void silent_body(rank_t *R) {
    world_t *w = R->w;
    const fail_arg_t *a = (const fail_arg_t *)w->arg;
    ddp_comm_t *c = w->comms[R->rank];
    float *x;
    double t0;
    if (R->rank == w->n - 1) {
        while (__atomic_load_n(&w->flag, __ATOMIC_SEQ_CST) < w->n - 1) t_sleep_ms(5);
        return;
    }
    x = (float *)calloc(a->count + 1, sizeof(float));
    t0 = t_now();
    if (a->what == 0) R->rc = ddp_all_reduce(x, x, a->count, DDP_FLOAT32, DDP_SUM, c);
    else R->rc = ddp_recv(x, a->count, DDP_FLOAT32, w->n - 1, c);
    R->t = t_now() - t0;
    snprintf(R->err, sizeof R->err, "%s", ddp_comm_last_error(c));
    __atomic_add_fetch(&w->flag, 1, __ATOMIC_SEQ_CST);
    free(x);
}

static void run_timeout(void) {
    const fail_arg_t cases[3] = {{0, 2}, {0, 100000}, {1, 1000}};
    int k, i;
    for (k = 0; k < 3; k++) {
        world_t w;
        ddp_comm_desc_t d;
        const int p = k == 1 ? 3 : 2;
        memset(&d, 0, sizeof d);
        d.timeout_ms = 400;
        d.log_level = 1;
        if (!run_world(&w, p, &d, silent_body, &cases[k])) continue;
        /* With 3 ranks, the rank whose deadline comes second may see the first one give up a
         * moment before its own deadline: DDP_ERR_REMOTE naming it, with the first failure
         * ("rank 2 did not arrive") appended. */
        for (i = 0; i < p - 1; i++)
            ok((w.ranks[i].rc == DDP_ERR_TIMEOUT ||
                (w.ranks[i].rc == DDP_ERR_REMOTE && w.ranks[!i].rc == DDP_ERR_TIMEOUT)) &&
               t_mentions_rank(w.ranks[i].err, p - 1) && w.ranks[i].t > 0.35 && w.ranks[i].t < 3,
               "rank %d of %d, %s of %zu floats, rank %d silent: %s after %.2f s (timeout 0.4 s): %s", i, p,
               cases[k].what ? "recv" : "all_reduce", cases[k].count, p - 1, ddp_strerror(w.ranks[i].rc),
               w.ranks[i].t, w.ranks[i].err);
    }
}

typedef struct { ddp_comm_t *c; double t; } aborter_t;
static void *aborter(void *arg) {
    aborter_t *a = (aborter_t *)arg;
    t_sleep_ms(200);
    a->t = t_now();
    ddp_comm_abort(a->c);
    return NULL;
}

/* Rank 0 waits (rank 1 does not call) until another thread aborts it; then rank 1 calls. */
static void abort_body(rank_t *R) {
    world_t *w = R->w;
    const fail_arg_t *a = (const fail_arg_t *)w->arg;
    ddp_comm_t *c = w->comms[R->rank];
    float *x = (float *)calloc(a->count + 1, sizeof(float));
    if (R->rank == 0) {
        pthread_t th;
        aborter_t ab;
        ab.c = c;
        ab.t = 0;
        pthread_create(&th, NULL, aborter, &ab);
        R->rc = a->what == 0 ? ddp_all_reduce(x, x, a->count, DDP_FLOAT32, DDP_SUM, c)
                             : ddp_recv(x, a->count, DDP_FLOAT32, 1, c);
        R->t = t_now();
        pthread_join(th, NULL);
        R->t -= ab.t;
        snprintf(R->err, sizeof R->err, "%s", ddp_comm_last_error(c));
        __atomic_store_n(&w->flag, 1, __ATOMIC_SEQ_CST);
    } else {
        double t0;
        while (!__atomic_load_n(&w->flag, __ATOMIC_SEQ_CST)) t_sleep_ms(5);
        t0 = t_now();
        R->rc = a->what == 0 ? ddp_all_reduce(x, x, a->count, DDP_FLOAT32, DDP_SUM, c)
                             : ddp_send(x, a->count, DDP_FLOAT32, 0, c);
        /* Rank 0 published its part of that all-reduce before it was aborted (small: a copy in
         * its endpoint), so the first call may still complete here; the next one cannot. */
        if (R->rc == DDP_SUCCESS) R->rc = ddp_barrier(c);
        R->t = t_now() - t0;
        snprintf(R->err, sizeof R->err, "%s", ddp_comm_last_error(c));
    }
    free(x);
}

static void run_abort(void) {
    const fail_arg_t cases[3] = {{0, 2}, {0, 100000}, {1, 1000}};
    int k;
    for (k = 0; k < 3; k++) {
        world_t w;
        ddp_comm_desc_t d;
        memset(&d, 0, sizeof d);
        d.timeout_ms = 30000;
        d.log_level = 1;
        if (!run_world(&w, 2, &d, abort_body, &cases[k])) continue;
        ok(w.ranks[0].rc == DDP_ERR_ABORTED && w.ranks[0].t >= 0 && w.ranks[0].t < 1.0,
           "%s of %zu floats, aborted from another thread: %s %.3f s after the abort: %s",
           cases[k].what ? "recv" : "all_reduce", cases[k].count, ddp_strerror(w.ranks[0].rc),
           w.ranks[0].t, w.ranks[0].err);
        ok(w.ranks[1].rc == DDP_ERR_REMOTE && w.ranks[1].t < 5 && t_mentions_rank(w.ranks[1].err, 0),
           "... then rank 1's %s (+ barrier): %s after %.2f s, naming rank 0: %s", cases[k].what ? "send" : "all_reduce",
           ddp_strerror(w.ranks[1].rc), w.ranks[1].t, w.ranks[1].err);
    }
}

/* Rank p-1 destroys its communicator while the others wait for it in an all-reduce. */
static void closed_body(rank_t *R) {
    world_t *w = R->w;
    const fail_arg_t *a = (const fail_arg_t *)w->arg;
    ddp_comm_t *c = w->comms[R->rank];
    float *x;
    double t0;
    if (R->rank == w->n - 1) {
        t_sleep_ms(200);
        R->rc = ddp_comm_destroy(c);
        w->comms[R->rank] = NULL;
        return;
    }
    x = (float *)calloc(a->count + 1, sizeof(float));
    t0 = t_now();
    R->rc = ddp_all_reduce(x, x, a->count, DDP_FLOAT32, DDP_SUM, c);
    R->t = t_now() - t0;
    snprintf(R->err, sizeof R->err, "%s", ddp_comm_last_error(c));
    free(x);
}

static void run_closed(void) {
    const fail_arg_t cases[2] = {{0, 2}, {0, 100000}};
    int k, i;
    for (k = 0; k < 2; k++) {
        world_t w;
        ddp_comm_desc_t d;
        memset(&d, 0, sizeof d);
        d.timeout_ms = 30000;
        d.log_level = 1;
        if (!run_world(&w, 3, &d, closed_body, &cases[k])) continue;
        ok(w.ranks[2].rc == DDP_SUCCESS, "rank 2 destroyed its communicator in the middle: %s", ddp_strerror(w.ranks[2].rc));
        for (i = 0; i < 2; i++)
            ok(w.ranks[i].rc == DDP_ERR_REMOTE && w.ranks[i].t < 5 && t_mentions_rank(w.ranks[i].err, 2),
               "rank %d, all_reduce of %zu floats: %s after %.2f s (timeout 30 s): %s", i, cases[k].count,
               ddp_strerror(w.ranks[i].rc), w.ranks[i].t, w.ranks[i].err);
    }
}

/* ----------------------------------------------------------------- ranks in two processes */
typedef struct { int rank, p; int bad; char msg[1200]; } proc_rank_t;
static void *proc_thread(void *arg) {
    proc_rank_t *pr = (proc_rank_t *)arg;
    ddp_comm_desc_t d;
    ddp_comm_t *c = NULL;
    ddp_result_t r;
    float *x;
    size_t n, i;
    int q, it;
    t_desc(&d, 30000);
    d.log_level = 1;
    if ((r = ddp_comm_init(&c, pr->p, pr->rank, &d)) != DDP_SUCCESS) {
        pr->bad = 1;
        snprintf(pr->msg, sizeof pr->msg, "init -> %s: %s", ddp_strerror(r), ddp_last_init_error());
        return NULL;
    }
    for (q = 0; q < pr->p; q++) {
        const char *want = q == pr->rank ? "self" : q / 2 == pr->rank / 2 ? "threads" : "shm";
        if (strcmp(ddp_comm_transport_name(c, q), want) != 0 && !pr->bad) {
            pr->bad = 1;
            snprintf(pr->msg, sizeof pr->msg, "transport to rank %d is %s, expected %s", q,
                     ddp_comm_transport_name(c, q), want);
        }
    }
    x = (float *)malloc(100003 * sizeof(float));
    for (it = 0; it < 6 && !pr->bad; it++) {
        n = it % 2 ? 100003 : 1000;
        for (i = 0; i < n; i++) x[i] = (float)(pr->rank + (int)(i % 5));
        if ((r = ddp_all_reduce(x, x, n, DDP_FLOAT32, DDP_SUM, c)) != DDP_SUCCESS) {
            pr->bad = 1;
            snprintf(pr->msg, sizeof pr->msg, "all_reduce -> %s: %s", ddp_strerror(r), ddp_comm_last_error(c));
            break;
        }
        for (i = 0; i < n; i++)
            if (x[i] != (float)(pr->p * (pr->p - 1) / 2 + pr->p * (int)(i % 5))) {
                pr->bad = 1;
                snprintf(pr->msg, sizeof pr->msg, "all_reduce of %zu: element %zu is %g", n, i, (double)x[i]);
                break;
            }
        if (!pr->bad && (r = ddp_broadcast(x, x, n, DDP_FLOAT32, it % pr->p, c)) != DDP_SUCCESS) {
            pr->bad = 1;
            snprintf(pr->msg, sizeof pr->msg, "broadcast -> %s", ddp_strerror(r));
        }
    }
    free(x);
    ddp_comm_destroy(c);
    return NULL;
}

static T_UNUSED int process_child(int rank, int p, void *arg) {
    proc_rank_t pr[2];
    pthread_t th[2];
    int t;
    (void)p; (void)arg;
    for (t = 0; t < 2; t++) {
        memset(&pr[t], 0, sizeof pr[t]);
        pr[t].rank = 2 * rank + t;
        pr[t].p = 4;
        pthread_create(&th[t], NULL, proc_thread, &pr[t]);
    }
    for (t = 0; t < 2; t++) pthread_join(th[t], NULL);
    for (t = 0; t < 2; t++)
        ok(!pr[t].bad, "rank %d (process %d, thread %d): transports threads/shm as expected, 6 all-reduces "
           "and broadcasts right %s", pr[t].rank, rank, t, pr[t].msg);
    return 0;
}

/* ----------------------------------------------------------------- registered memory */
/* ddp_comm_mem_alloc on thread ranks: ordinary memory (one address space, nothing to map), and
 * still a collective: same sizes or DDP_ERR_MISMATCH on every rank, frees in the same order. */
static void registered_body(rank_t *R) {
    world_t *w = R->w;
    ddp_comm_t *c = w->comms[R->rank];
    const int p = w->n;
    const size_t n = 12345;
    float *a = NULL, *b = NULL;
    void *odd = NULL;
    ddp_result_t r;
    size_t i;
    int q;
    R->checks++;
    if ((r = ddp_comm_mem_alloc(c, n * sizeof *a, (void **)&a)) != DDP_SUCCESS || !a ||
        (r = ddp_comm_mem_alloc(c, n * sizeof *b, (void **)&b)) != DDP_SUCCESS || !b) {
        rfail(R, "ddp_comm_mem_alloc -> %s %s", ddp_strerror(r), ddp_comm_last_error(c));
        return;
    }
    for (i = 0; i < n; i++) a[i] = (float)(R->rank + 1) * (float)(i % 97);
    R->checks++;
    if ((r = ddp_all_reduce(a, b, n, DDP_FLOAT32, DDP_SUM, c)) != DDP_SUCCESS)
        rfail(R, "out-of-place all-reduce -> %s %s", ddp_strerror(r), ddp_comm_last_error(c));
    R->checks++;
    if (!R->bad && (r = ddp_all_reduce(a, a, n, DDP_FLOAT32, DDP_SUM, c)) != DDP_SUCCESS)
        rfail(R, "in-place all-reduce -> %s %s", ddp_strerror(r), ddp_comm_last_error(c));
    for (i = 0; i < n && !R->bad; i++) {   /* sums of small integers: exact in any order */
        const float want = (float)(p * (p + 1) / 2) * (float)(i % 97);
        R->checks++;
        if (a[i] != want || b[i] != want) rfail(R, "element %zu: %g in place, %g out, want %g", i, a[i], b[i], want);
    }
    R->checks++;
    r = ddp_comm_mem_alloc(c, R->rank == p - 1 ? 8192 : 4096, &odd);
    if (p > 1 && (r != DDP_ERR_MISMATCH || odd || !strstr(ddp_comm_last_error(c), "different sizes")))
        rfail(R, "sizes differ across ranks: %s (%p) %s, want DDP_ERR_MISMATCH and nothing", ddp_strerror(r),
              odd, ddp_comm_last_error(c));
    if (p == 1 && r == DDP_SUCCESS) r = ddp_comm_mem_free(c, odd);
    for (q = 0; q < 2; q++) {
        R->checks++;
        if ((r = ddp_comm_mem_free(c, q ? (void *)a : (void *)b)) != DDP_SUCCESS)
            rfail(R, "ddp_comm_mem_free #%d -> %s %s", q, ddp_strerror(r), ddp_comm_last_error(c));
    }
    R->checks++;
    if ((r = ddp_comm_mem_free(c, a)) != DDP_ERR_INVALID_ARGUMENT)
        rfail(R, "a second free -> %s, want DDP_ERR_INVALID_ARGUMENT", ddp_strerror(r));
}

/* ----------------------------------------------------------------- main */
int main(void) {
    const int quick_sizes[4] = {1, 2, 3, 5};
    int n, k;
    world_t w;
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
    g_quick = 1;
#endif
    if (getenv("DDP_TEST_QUICK")) g_quick = 1;
    t_init();
    {   /* before any thread: it also builds the fp16 table the references read */
        char why[200] = "";
        if (!ok(t_in_selftest(why, sizeof why) == 0, "inputs and references a block at a time give the element-wise definitions' bits"))
            t_bail("%s", why);
    }
    unsetenv("DDP_TRANSPORT");
    unsetenv("DDP_ALGO");
    unsetenv("DDP_THREADS_COLL");
    unsetenv("DDP_THREADS_SMALL_MAX");
    unsetenv("DDP_TEST_HOSTS");
    setenv("DDP_DEBUG", "NONE", 0);
    if (t_selected("results")) {
        for (k = 0; k < (g_quick ? 4 : MAXN); k++) {
            n = g_quick ? quick_sizes[k] : k + 1;
            diag("--- results: %d thread rank%s over the threads transport", n, n > 1 ? "s" : "");
            run_results("collectives", n, 0, n == 2 || n == 3 || n == 8 || g_quick);
        }
        setenv("DDP_THREADS_SMALL_MAX", "0", 1);
        diag("--- results with DDP_THREADS_SMALL_MAX=0 (every size zero-copy), n = 3");
        run_results("collectives, DDP_THREADS_SMALL_MAX=0", 3, 0, 0);
        setenv("DDP_THREADS_SMALL_MAX", "256", 1);
        diag("--- results with DDP_THREADS_SMALL_MAX=256, n = 4");
        run_results("collectives, DDP_THREADS_SMALL_MAX=256", 4, 0, 0);
        unsetenv("DDP_THREADS_SMALL_MAX");
    }
    if (t_selected("p2p")) {
        static const int sizes[3] = {2, 3, 5};
        setenv("DDP_THREADS_COLL", "0", 1);
        for (k = 0; k < 3; k++) {
            n = sizes[k];
            if (g_quick && n == 5) continue;
            diag("--- p2p: %d ranks, DDP_THREADS_COLL=0: ring / recursive doubling over the channels, 4 KiB segments", n);
            run_results("collectives over point-to-point", n, 4096, 0);
        }
        setenv("DDP_ALGO", "ring", 1);
        diag("--- p2p: 3 ranks, DDP_ALGO=ring (the ring also for small counts)");
        run_results("collectives over point-to-point, DDP_ALGO=ring", 3, 4096, 0);
        unsetenv("DDP_ALGO");
        unsetenv("DDP_THREADS_COLL");
    }
    if (t_selected("hier")) run_hier();
    if (t_selected("rooted")) {
        for (k = 0; k < (g_quick ? 4 : MAXN); k++) {
            n = g_quick ? quick_sizes[k] : k + 1;
            diag("--- rooted and point-to-point calls: %d thread ranks", n);
            run_rooted(n);
        }
    }
    if (t_selected("async")) {
        for (n = 2; n <= 3; n++) {
            ddp_comm_desc_t d;
            memset(&d, 0, sizeof d);
            d.timeout_ms = 60000;
            diag("--- async: %d thread ranks", n);
            if (run_world(&w, n, &d, async_body, NULL)) report_world(&w, "async all-reduces + broadcast, waited in reverse");
        }
    }
    if (t_selected("registered")) {
        for (n = 1; n <= 4; n++) {
            ddp_comm_desc_t d;
            memset(&d, 0, sizeof d);
            d.timeout_ms = 60000;
            d.log_level = 1;
            diag("--- ddp_comm_mem_alloc: %d thread rank%s", n, n > 1 ? "s" : "");
            if (run_world(&w, n, &d, registered_body, NULL))
                report_world(&w, "ddp_comm_mem_alloc, all-reduce in and out of place, a size mismatch, frees");
        }
    }
    if (t_selected("mismatch")) { diag("--- mismatched calls"); run_mismatch(); }
    if (t_selected("timeout")) { diag("--- a rank that never calls (timeout 400 ms)"); run_timeout(); }
    if (t_selected("abort")) { diag("--- ddp_comm_abort from another thread"); run_abort(); }
    if (t_selected("closed")) { diag("--- a rank destroys its communicator while the others wait"); run_closed(); }
#if !defined(__SANITIZE_THREAD__)
    if (t_selected("process")) {
        diag("--- 4 ranks: 2 processes x 2 threads (threads inside a process, shm between them)");
        ok(t_run_ranks(2, process_child, NULL, 120) == 0, "both processes exited cleanly");
    }
#endif
    return t_done();
}
