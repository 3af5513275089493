/* SPDX-License-Identifier: MIT (see LICENSE) */
/* tests/netns_rank.c — one libddp rank for tests/test_netns.sh, which runs several of these in
 * network namespaces joined by a bridge ("hosts"). Rank, world size, master and job secret come
 * from the environment (ddp_comm_init_env); the transport is the best per peer (tcp across
 * namespaces, shm inside one).
 *
 *   build/netns_rank coll     every collective at several sizes, each result checked exactly
 *   build/netns_rank cut      loop over all-reduces until one fails (the script cuts a link)
 *   build/netns_rank loss N   N checked all-reduces of 64 KiB (the script drops packets)
 *   build/netns_rank matrix FILE [COLL,...]   every collective (or those named: all_reduce
 *                             reduce_scatter all_gather broadcast reduce) x dtype x op x count,
 *                             in and out of place, checked bit for bit; result hashes to
 *                             FILE.RANK (below)
 *
 * Output, one line each, prefixed "rank R: ": "peer P via NAME" for every other rank after
 * init; "PASS what" / "FAIL what: why" per check; in cut mode "looping" once the loop is
 * warm, then "ERROR ...". Exit status: 0 all passed, 1 a check failed or init failed, 2 (cut
 * mode) a collective returned an error, as wanted, 3 (cut mode) no error within 100 s. Matrix
 * mode prints FAIL lines (the first few) and one "PASS matrix: N cases" or "FAIL matrix" line.
 *
 * Expected values are closed forms of (rank, index): contributions are small integers, so
 * float sums are exact whatever the order, and avg is the exact sum divided once by the world
 * size (IEEE division for floats, truncation toward zero for integers, as libddp documents). */
#define _GNU_SOURCE
#include "ddp.h"
#include "transports/ddp_tcp.h"
#include "transports/ddp_shm.h"
#include "tests/ddp_test.h"        /* t_hash, t_mix64, t_ext_int */
#include "tests/ddp_test_data.h"   /* t_exact_bits, t_case_rnd, t_enc_float, t_dec_float */

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int me, nranks, failures;

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* Rank r's contribution at index i: a small integer in [-8, 8] (floats) or up to ~1e6 with
 * both signs (int32, so that avg's truncation toward zero is exercised). */
static float fval(int r, size_t i) { return (float)((int)(((size_t)r * 7 + i * 3) % 17) - 8); }
static int32_t ival(int r, size_t i) {
    return (int32_t)(((int)(((size_t)r * 7 + i * 3) % 17) - 8) * 100003 + r);
}
static float fsum(size_t i) { float s = 0; int r; for (r = 0; r < nranks; r++) s += fval(r, i); return s; }
static int32_t isum(size_t i) { int32_t s = 0; int r; for (r = 0; r < nranks; r++) s += ival(r, i); return s; }

static const char *result_name(ddp_result_t r) {
    static const char *const names[] = {"DDP_SUCCESS", "DDP_ERR_INVALID_ARGUMENT", "DDP_ERR_INVALID_USAGE",
        "DDP_ERR_SYSTEM", "DDP_ERR_REMOTE", "DDP_ERR_TIMEOUT", "DDP_ERR_ABORTED", "DDP_ERR_OUT_OF_MEMORY",
        "DDP_ERR_MISMATCH", "DDP_ERR_AUTH", "DDP_ERR_UNSUPPORTED", "DDP_ERR_INTERNAL", "DDP_ERR_REMOVED"};
    return (unsigned)r < sizeof names / sizeof names[0] ? names[r] : "DDP_ERR_?";
}

static void report(int good, const char *what, const char *why) {
    if (good) printf("rank %d: PASS %s\n", me, what);
    else { printf("rank %d: FAIL %s: %s\n", me, what, why); failures++; }
    fflush(stdout);
}

/* A call's result: on an error, one FAIL line with the library's message; returns 0. */
static int called(ddp_result_t r, const char *what, ddp_comm_t *comm) {
    char why[1400];
    if (r == DDP_SUCCESS) return 1;
    snprintf(why, sizeof why, "%s: %s", ddp_strerror(r), ddp_comm_last_error(comm));
    report(0, what, why);
    return 0;
}

/* Compares n floats or int32s with want(i); one PASS or FAIL line naming the first mismatch. */
static void check_f(const float *got, size_t n, float (*want)(size_t, int), int arg, const char *what) {
    size_t i;
    char why[200];
    for (i = 0; i < n; i++) {
        float w = want(i, arg);
        if (memcmp(&got[i], &w, sizeof w) != 0) {
            snprintf(why, sizeof why, "element %zu of %zu is %.9g, want %.9g", i, n, (double)got[i], (double)w);
            report(0, what, why);
            return;
        }
    }
    report(1, what, "");
}
static void check_i(const int32_t *got, size_t n, int32_t (*want)(size_t, int), int arg, const char *what) {
    size_t i;
    char why[200];
    for (i = 0; i < n; i++) {
        int32_t w = want(i, arg);
        if (got[i] != w) {
            snprintf(why, sizeof why, "element %zu of %zu is %ld, want %ld", i, n, (long)got[i], (long)w);
            report(0, what, why);
            return;
        }
    }
    report(1, what, "");
}

static float want_fsum(size_t i, int unused) { (void)unused; return fsum(i); }
static float want_favg(size_t i, int unused) { (void)unused; return fsum(i) / (float)nranks; }
static int32_t want_isum(size_t i, int unused) { (void)unused; return isum(i); }
static int32_t want_iavg(size_t i, int unused) { (void)unused; return isum(i) / nranks; }
static float want_fval(size_t i, int r) { return fval(r, i); }
static int32_t want_ival(size_t i, int r) { return ival(r, i); }
/* all_gather of sendcount c: element i came from rank i / c at index i % c (arg = c). */
static float want_gathered(size_t i, int c) { return fval((int)(i / (size_t)c), i % (size_t)c); }
/* reduce_scatter: this rank's block of recvcount c starts at me * c (arg = c). */
static float want_rs(size_t i, int c) { return fsum((size_t)me * (size_t)c + i); }

#define MAX_COUNT ((size_t)262144)    /* 1 MiB of float32 or int32 */

static void run_collectives(ddp_comm_t *comm) {
    static const size_t counts[] = {0, 1, 3, 7, 1001, 65536, MAX_COUNT};
    static const size_t gcounts[] = {0, 1, 333, 65536};
    const size_t ncounts = sizeof counts / sizeof counts[0];
    float *fs = (float *)malloc(MAX_COUNT * 4 * sizeof(float));
    float *fr = (float *)malloc((size_t)nranks * 65536 * sizeof(float) + MAX_COUNT * sizeof(float));
    int32_t *is = (int32_t *)malloc(MAX_COUNT * sizeof(int32_t));
    int32_t *ir = (int32_t *)malloc(MAX_COUNT * sizeof(int32_t));
    char what[160];
    size_t k, i, c;
    int op, root;
    if (!fs || !fr || !is || !ir) { report(0, "allocation", "out of memory"); return; }

    /* all_reduce: float32 and int32, sum and avg, every size; in place at odd positions. */
    for (op = 0; op < 2; op++) {
        ddp_op_t o = op ? DDP_AVG : DDP_SUM;
        const char *on = op ? "avg" : "sum";
        for (k = 0; k < ncounts; k++) {
            int inplace = (int)(k & 1);
            float *fout = inplace ? fs : fr;
            int32_t *iout = inplace ? is : ir;
            c = counts[k];
            for (i = 0; i < c; i++) { fs[i] = fval(me, i); is[i] = ival(me, i); }
            snprintf(what, sizeof what, "all_reduce float32 %s count %zu%s", on, c, inplace ? " in place" : "");
            if (called(ddp_all_reduce(fs, fout, c, DDP_FLOAT32, o, comm), what, comm))
                check_f(fout, c, op ? want_favg : want_fsum, 0, what);
            snprintf(what, sizeof what, "all_reduce int32 %s count %zu%s", on, c, inplace ? " in place" : "");
            if (called(ddp_all_reduce(is, iout, c, DDP_INT32, o, comm), what, comm))
                check_i(iout, c, op ? want_iavg : want_isum, 0, what);
        }
    }

    /* broadcast from every root (so from every host), and 1 MiB from the last rank. */
    for (root = 0; root <= nranks; root++) {
        int rt = root < nranks ? root : nranks - 1;
        c = root < nranks ? 1001 : MAX_COUNT;
        for (i = 0; i < c; i++) { fs[i] = me == rt ? fval(rt, i) : -99.0f; is[i] = me == rt ? ival(rt, i) : -99; }
        snprintf(what, sizeof what, "broadcast float32 count %zu root %d in place", c, rt);
        if (called(ddp_broadcast(fs, fs, c, DDP_FLOAT32, rt, comm), what, comm)) check_f(fs, c, want_fval, rt, what);
        snprintf(what, sizeof what, "broadcast int32 count %zu root %d", c, rt);
        if (called(ddp_broadcast(is, ir, c, DDP_INT32, rt, comm), what, comm)) check_i(ir, c, want_ival, rt, what);
    }

    /* all_gather and reduce_scatter (float32 sum); the largest in place. */
    for (k = 0; k < sizeof gcounts / sizeof gcounts[0]; k++) {
        int inplace = gcounts[k] == 65536;
        float *send;
        c = gcounts[k];
        send = inplace ? fr + (size_t)me * c : fs;
        for (i = 0; i < c; i++) send[i] = fval(me, i);
        snprintf(what, sizeof what, "all_gather float32 sendcount %zu%s", c, inplace ? " in place" : "");
        if (called(ddp_all_gather(send, fr, c, DDP_FLOAT32, comm), what, comm))
            check_f(fr, c * (size_t)nranks, want_gathered, (int)(c ? c : 1), what);

        for (i = 0; i < c * (size_t)nranks; i++) fr[i] = fval(me, i);
        snprintf(what, sizeof what, "reduce_scatter float32 sum recvcount %zu%s", c, inplace ? " in place" : "");
        {
            float *out = inplace ? fr + (size_t)me * c : fs;
            if (called(ddp_reduce_scatter(fr, out, c, DDP_FLOAT32, DDP_SUM, comm), what, comm))
                check_f(out, c, want_rs, (int)c, what);
        }
    }
    snprintf(what, sizeof what, "barrier");
    if (called(ddp_barrier(comm), what, comm)) report(1, what, "");
    free(fs); free(fr); free(is); free(ir);
}

/* Loops over all-reduces (1 KiB, checked) until one fails or 60 s pass. */
static int run_cut(ddp_comm_t *comm) {
    enum { COUNT = 256, WARM = 50 };
    float buf[COUNT];
    double t0 = now_ms();
    long it;
    size_t i;
    for (it = 0; now_ms() - t0 < 100000; it++) {
        ddp_result_t r;
        for (i = 0; i < COUNT; i++) buf[i] = fval(me, i + (size_t)it);
        r = ddp_all_reduce(buf, buf, COUNT, DDP_FLOAT32, DDP_SUM, comm);
        if (r != DDP_SUCCESS) {
            double t = now_ms();
            printf("rank %d: ERROR at %.0f ms (epoch) in all_reduce #%ld: %s (%s): %s\n", me, t, it,
                   result_name(r), ddp_strerror(r), ddp_comm_last_error(comm));
            fflush(stdout);
            return 2;
        }
        for (i = 0; i < COUNT; i++)
            if (buf[i] != fsum(i + (size_t)it)) {
                printf("rank %d: FAIL all_reduce #%ld: element %zu is %g, want %g\n", me, it, i,
                       (double)buf[i], (double)fsum(i + (size_t)it));
                fflush(stdout);
                return 1;
            }
        if (it == WARM) { printf("rank %d: looping (%d all-reduces done)\n", me, WARM); fflush(stdout); }
    }
    printf("rank %d: no error within 100 s (%ld all-reduces)\n", me, it);
    return 3;
}

/* n all-reduces of 64 KiB, each checked; one summary line. */
static void run_loss(ddp_comm_t *comm, long n) {
    enum { COUNT = 16384 };
    static float buf[COUNT];
    double t0 = now_ms();
    long it, bad = 0;
    size_t i;
    char what[200], why[1400];
    for (it = 0; it < n; it++) {
        ddp_result_t r;
        for (i = 0; i < COUNT; i++) buf[i] = fval(me, i + (size_t)it);
        r = ddp_all_reduce(buf, buf, COUNT, DDP_FLOAT32, DDP_SUM, comm);
        if (r != DDP_SUCCESS) {
            snprintf(what, sizeof what, "all_reduce 64 KiB #%ld of %ld", it, n);
            snprintf(why, sizeof why, "%s: %s", ddp_strerror(r), ddp_comm_last_error(comm));
            report(0, what, why);
            return;
        }
        for (i = 0; i < COUNT; i++)
            if (buf[i] != fsum(i + (size_t)it)) { bad++; break; }
    }
    snprintf(what, sizeof what, "%ld all_reduces of 64 KiB, each exact (%.0f ms)", n, now_ms() - t0);
    snprintf(why, sizeof why, "%ld of them wrong", bad);
    report(bad == 0, what, why);
}

/* ------------------------------------------------------------------------- matrix mode
 * Every collective x dtype x op x count, in and out of place, as the hierarchical and
 * Rabenseifner all-reduces (DDP_ALGO) must get them right on any layout of ranks over hosts.
 * Each rank regenerates every rank's input from the case's seed and computes the reference
 * itself. Inputs come from tests/ddp_test_data.h's t_exact_bits: their reductions give the same
 * bits in any order and any grouping, so a hierarchical sum (inside hosts, then across) must
 * equal the flat one bit for bit. "Random" float cases (uniform data: the rounding depends on
 * the order) are held to a rounding bound; for them what matters is that every rank ends with
 * the same bits, so each rank writes "case hash" lines for the results every rank shares
 * (all_reduce, all_gather, broadcast) to FILE.RANK, and the script compares the files.
 * Out of place, the send buffer must come back unchanged; 64 guard bytes on both sides of
 * every buffer must stay untouched; count 0 out of place passes NULL buffers. Little-endian
 * (elements are read and written as the low bytes of a uint64_t). */
enum { M_AR, M_RS, M_AG, M_BC, M_RED, M_NCOLL };
static const char *const m_coll_name[M_NCOLL] = {"all_reduce", "reduce_scatter", "all_gather", "broadcast",
                                                 "reduce"};
#define M_GUARD 64
#define M_MAX_FAIL_LINES 8

typedef struct {
    int coll, dtype, op, root, inplace, random;
    size_t count;      /* elements: per rank for reduce_scatter (recv) and all_gather (send) */
    uint64_t seed;
} m_case_t;

static m_case_t *m_cases;
static size_t m_ncases, m_cap;

static void m_add(int coll, int dt, int op, int root, size_t count, int inplace, int random) {
    m_case_t *c;
    if (m_ncases == m_cap) {
        m_cap = m_cap ? 2 * m_cap : 1024;
        m_cases = (m_case_t *)realloc(m_cases, m_cap * sizeof *m_cases);
        if (!m_cases) { fprintf(stderr, "out of memory\n"); exit(1); }
    }
    c = &m_cases[m_ncases];
    c->coll = coll; c->dtype = dt; c->op = op; c->root = root; c->count = count;
    c->inplace = inplace; c->random = random;
    c->seed = t_mix64(0x6e65746e73ull * 1000003u + (uint64_t)m_ncases);
    m_ncases++;
}

/* Just over 1 MiB in all (an odd count), whatever the element size; per rank for
 * reduce_scatter and all_gather, so that their whole buffer is past 1 MiB too. */
static size_t m_big(int dt, int coll) {
    size_t n = ((size_t)1 << 20) / ddp_dtype_size((ddp_dtype_t)dt) + 13;
    return coll == M_RS || coll == M_AG ? n / (size_t)nranks + 1 + (n / (size_t)nranks) % 2 : n;
}

/* The same list on every rank, for the collectives whose bit is set in `colls`. Small counts for
 * every combination; 65537 for half of them; the big count for one op per dtype (each op is met
 * at two dtypes). */
static void m_build(unsigned colls) {
    static const size_t small[] = {0, 1, 3, 7, 1001};
    static const int fdts[] = {DDP_FLOAT16, DDP_BFLOAT16, DDP_FLOAT32, DDP_FLOAT64};
    static const int fops[] = {DDP_SUM, DDP_PROD, DDP_AVG};
    size_t k;
    int coll, dt, op, ip, f, g;
    for (coll = M_AR; coll < M_NCOLL; coll++)
        for (dt = 0; dt < DDP_NUM_DTYPES && (colls >> coll & 1); dt++) {
            int nops = coll == M_AG || coll == M_BC ? 1 : DDP_NUM_OPS;
            for (op = 0; op < nops; op++) {
                /* broadcast and reduce: roots on the first and the last host, and one inside */
                int root = coll == M_BC || coll == M_RED ? (dt + op) % 3 == 0 ? 0 : (dt + op) % 3 == 1 ? nranks - 1
                           : nranks / 2 : 0;
                for (k = 0; k < sizeof small / sizeof small[0]; k++)
                    for (ip = 0; ip < 2; ip++)
                        if (coll != M_RED || k == 1 || k == 4) m_add(coll, dt, op, root, small[k], ip, 0);
                if ((dt + op) % 2 == 0 && coll != M_RED) m_add(coll, dt, op, root, 65537, (dt + op) % 4 == 0, 0);
                if (nops == 1 ? dt % 3 == 0 : (dt + op) % 5 == 0)
                    m_add(coll, dt, op, root, m_big(dt, coll), (dt + op) % 2, 0);
            }
        }
    for (f = 0; f < 4; f++)
        for (g = 0; g < 3; g++) {
            if (colls >> M_AR & 1) {
                m_add(M_AR, fdts[f], fops[g], 0, 1001, (f + g) % 2, 1);
                m_add(M_AR, fdts[f], fops[g], 0, m_big(fdts[f], M_AR), (f + g + 1) % 2, 1);
            }
            if (colls >> M_RS & 1) m_add(M_RS, fdts[f], fops[g], 0, 1001, (f + g) % 2, 1);
        }
}

static void m_name(const m_case_t *c, char *out, size_t cap) {
    int red = c->coll == M_AR || c->coll == M_RS || c->coll == M_RED;
    char root[24] = "";
    if (c->coll == M_BC || c->coll == M_RED) snprintf(root, sizeof root, " root %d", c->root);
    snprintf(out, cap, "%s %s%s%s count %zu%s%s%s", m_coll_name[c->coll], ddp_dtype_name((ddp_dtype_t)c->dtype),
             red ? " " : "", red ? ddp_op_name((ddp_op_t)c->op) : "", c->count, root,
             c->inplace ? " in place" : "", c->random ? " random" : "");
}

/* Rank r's element i, as bits in the low bytes. */
static uint64_t m_input(const m_case_t *c, int r, size_t i) {
    uint64_t u = t_case_rnd(c->seed, r, i);
    double unit;
    if (c->coll == M_AG || c->coll == M_BC) return u;          /* copies: any bits, NaNs too */
    if (!c->random) return t_exact_bits(c->dtype, c->op, u);
    unit = (double)(u >> 12) * (1.0 / 4503599627370496.0);     /* [0, 1) */
    if (c->op == DDP_PROD) return t_enc_float(c->dtype, (u & 1 ? -1.0 : 1.0) * (0.5 + unit));
    return t_enc_float(c->dtype, 2.0 * unit - 1.0);
}

static uint64_t m_mask(size_t es) { return es == 8 ? ~(uint64_t)0 : ((uint64_t)1 << (8 * es)) - 1; }
static uint64_t m_load(const unsigned char *b, size_t i, size_t es) { uint64_t v = 0; memcpy(&v, b + i * es, es); return v; }
static void m_fill(unsigned char *b, const m_case_t *c, int r, size_t n) {
    size_t es = ddp_dtype_size((ddp_dtype_t)c->dtype), i;
    for (i = 0; i < n; i++) { uint64_t v = m_input(c, r, i); memcpy(b + i * es, &v, es); }
}

/* The reduction of every rank's element gi, exact case: the bits the library must produce. */
static uint64_t m_expect(const m_case_t *c, size_t gi) {
    int dt = c->dtype, r;
    if (t_is_int(dt)) {
        int sgn = t_is_signed_int(dt);
        uint64_t acc = t_ext_int(dt, m_input(c, 0, gi));
        for (r = 1; r < nranks; r++) {
            uint64_t v = t_ext_int(dt, m_input(c, r, gi));
            if (c->op == DDP_PROD) acc *= v;
            else if (c->op == DDP_MAX) { if (sgn ? (int64_t)v > (int64_t)acc : v > acc) acc = v; }
            else if (c->op == DDP_MIN) { if (sgn ? (int64_t)v < (int64_t)acc : v < acc) acc = v; }
            else acc += v;
        }
        if (c->op == DDP_AVG) {
            acc = t_ext_int(dt, acc);   /* the sum as the dtype holds it (small inputs: no wrap) */
            acc = sgn ? (uint64_t)((int64_t)acc / nranks) : acc / (uint64_t)nranks;
        }
        return acc;
    } else {
        uint64_t pick = m_input(c, 0, gi);
        double acc = t_dec_float(dt, pick);
        for (r = 1; r < nranks; r++) {
            uint64_t b = m_input(c, r, gi);
            double v = t_dec_float(dt, b);
            if (c->op == DDP_PROD) acc *= v;
            else if (c->op == DDP_MAX) { if (v > t_dec_float(dt, pick)) pick = b; }
            else if (c->op == DDP_MIN) { if (v < t_dec_float(dt, pick)) pick = b; }
            else acc += v;   /* exact on t_exact_bits' grid */
        }
        if (c->op == DDP_MAX || c->op == DDP_MIN) return pick;
        if (c->op == DDP_AVG && dt == DDP_FLOAT64) return t_f64_bits(acc / nranks);
        if (c->op == DDP_AVG) {   /* fp32 division; fp16/bf16 rounded from it (ddp.h) */
            float q = (float)acc / (float)nranks;
            return dt == DDP_FLOAT32 ? t_f32_bits(q) : dt == DDP_FLOAT16 ? ddp_float_to_half(q) : ddp_float_to_bfloat16(q);
        }
        return t_enc_float(dt, acc);
    }
}

/* Random case: |got - exact| within the classic bound for p terms in any order, in the
 * dtype's unit roundoff (fp16/bf16 rounded once more at the end). */
static int m_within(const m_case_t *c, size_t gi, uint64_t got, double *want) {
    int dt = c->dtype, r;
    double u = t_unit_roundoff(dt);
    double sum = 0, mag = 0, prod = 1, tol, g = t_dec_float(dt, got);
    for (r = 0; r < nranks; r++) {
        double v = t_dec_float(dt, m_input(c, r, gi));
        sum += v; mag += fabs(v); prod *= v;
    }
    if (c->op == DDP_PROD) { *want = prod; tol = (2.0 * nranks + 2) * u * fabs(prod); }
    else if (c->op == DDP_AVG) { *want = sum / nranks; tol = ((nranks + 1) * u * mag + 2 * u * fabs(sum)) / nranks; }
    else { *want = sum; tol = (nranks + 1) * u * mag; }
    return fabs(g - *want) <= tol;
}

/* Elements [0, n) of a reduction's output, global indices from lo. 0 and *why on a mismatch. */
static int m_check_reduction(const m_case_t *c, const unsigned char *out, size_t lo, size_t n, char *why, size_t cap) {
    size_t es = ddp_dtype_size((ddp_dtype_t)c->dtype), i;
    uint64_t mask = m_mask(es);
    for (i = 0; i < n; i++) {
        uint64_t got = m_load(out, i, es);
        if (c->random) {
            double want;
            if (!m_within(c, lo + i, got, &want)) {
                snprintf(why, cap, "element %zu: %.9g, want %.9g within the rounding bound", lo + i,
                         t_dec_float(c->dtype, got), want);
                return 0;
            }
        } else {
            uint64_t want = m_expect(c, lo + i) & mask;
            if (got != want) {
                snprintf(why, cap, "element %zu: bits %#llx, want %#llx", lo + i, (unsigned long long)got,
                         (unsigned long long)want);
                return 0;
            }
        }
    }
    return 1;
}

/* Elements [0, n) equal rank r's input from index lo (copies; sendbuf unchanged). */
static int m_check_copy(const m_case_t *c, const unsigned char *b, int r, size_t lo, size_t n, char *why, size_t cap) {
    size_t es = ddp_dtype_size((ddp_dtype_t)c->dtype), i;
    uint64_t mask = m_mask(es);
    for (i = 0; i < n; i++) {
        uint64_t got = m_load(b, i, es), want = m_input(c, r, lo + i) & mask;
        if (got != want) {
            snprintf(why, cap, "element %zu: bits %#llx, want %#llx (rank %d's element %zu)", i,
                     (unsigned long long)got, (unsigned long long)want, r, lo + i);
            return 0;
        }
    }
    return 1;
}

/* A buffer of n bytes with guards on both sides; the guards' pattern depends on where. */
static unsigned char *m_alloc(size_t n) {
    unsigned char *g = (unsigned char *)malloc(n + 2 * M_GUARD);
    size_t i;
    if (!g) { fprintf(stderr, "rank %d: out of memory (%zu bytes)\n", me, n); exit(1); }
    for (i = 0; i < M_GUARD; i++) { g[i] = (unsigned char)(0x3c + i); g[M_GUARD + n + i] = (unsigned char)(0xc3 - i); }
    memset(g + M_GUARD, 0xcd, n);   /* poison: the output must overwrite it */
    return g + M_GUARD;
}
static int m_guards_ok(unsigned char *b, size_t n) {
    const unsigned char *g = b - M_GUARD;
    size_t i;
    for (i = 0; i < M_GUARD; i++)
        if (g[i] != (unsigned char)(0x3c + i) || g[M_GUARD + n + i] != (unsigned char)(0xc3 - i)) return 0;
    return 1;
}

/* Runs one case; 1 if every check held, 0 with *why. The result's hash goes to *hash when every
 * rank holds the same result (else *hash stays 0). -1 if the call itself failed. */
static int m_run(const m_case_t *c, ddp_comm_t *comm, uint64_t *hash, char *why, size_t cap) {
    const size_t es = ddp_dtype_size((ddp_dtype_t)c->dtype), n = c->count, p = (size_t)nranks;
    const size_t me_z = (size_t)me;
    size_t sbytes, rbytes;
    unsigned char *s = NULL, *r = NULL;
    const void *sp;
    void *rp;
    int good = 1;
    ddp_result_t res;
    switch (c->coll) {
    case M_RS: sbytes = p * n * es; rbytes = n * es; break;
    case M_AG: sbytes = n * es; rbytes = p * n * es; break;
    default: sbytes = rbytes = n * es; break;
    }
    /* In place there is one buffer, the larger; the send or receive part is inside it. */
    r = m_alloc(c->inplace ? (sbytes > rbytes ? sbytes : rbytes) : rbytes);
    if (!c->inplace) s = m_alloc(sbytes);
    {
        unsigned char *in = c->inplace ? r + (c->coll == M_AG ? me_z * n * es : 0) : s;
        if (c->coll == M_RS) m_fill(in, c, me, p * n);
        else if (c->coll != M_BC || me == c->root || !c->inplace) m_fill(in, c, me, n);
    }
    sp = c->inplace ? (c->coll == M_AG ? r + me_z * n * es : r) : s;
    rp = c->inplace && c->coll == M_RS ? r + me_z * n * es : r;
    if (!c->inplace && n == 0) { sp = NULL; rp = NULL; }
    switch (c->coll) {
    case M_AR: res = ddp_all_reduce(sp, rp, n, (ddp_dtype_t)c->dtype, (ddp_op_t)c->op, comm); break;
    case M_RS: res = ddp_reduce_scatter(sp, rp, n, (ddp_dtype_t)c->dtype, (ddp_op_t)c->op, comm); break;
    case M_AG: res = ddp_all_gather(sp, rp, n, (ddp_dtype_t)c->dtype, comm); break;
    case M_BC: res = ddp_broadcast(sp, rp, n, (ddp_dtype_t)c->dtype, c->root, comm); break;
    default: res = ddp_reduce(sp, rp, n, (ddp_dtype_t)c->dtype, (ddp_op_t)c->op, c->root, comm); break;
    }
    if (res != DDP_SUCCESS) {
        snprintf(why, cap, "%s: %s", ddp_strerror(res), ddp_comm_last_error(comm));
        good = -1;
        goto out;
    }
    switch (c->coll) {
    case M_AR: good = m_check_reduction(c, (unsigned char *)rp, 0, n, why, cap); break;
    case M_RS: good = m_check_reduction(c, (unsigned char *)rp, me_z * n, n, why, cap); break;
    case M_RED: if (me == c->root) good = m_check_reduction(c, (unsigned char *)rp, 0, n, why, cap); break;
    case M_BC: good = m_check_copy(c, r, c->root, 0, n, why, cap); break;
    default: {
        size_t k;
        for (k = 0; k < p && good; k++) good = m_check_copy(c, r + k * n * es, (int)k, 0, n, why, cap);
    }
    }
    if (good && !c->inplace && c->coll != M_BC) {
        good = c->coll == M_RS ? m_check_copy(c, s, me, 0, p * n, why, cap) : m_check_copy(c, s, me, 0, n, why, cap);
        if (!good) { size_t l = strlen(why); snprintf(why + l, cap - l, " (sendbuf changed)"); }
    }
    if (good && !(m_guards_ok(r, c->inplace ? (sbytes > rbytes ? sbytes : rbytes) : rbytes) && (!s || m_guards_ok(s, sbytes)))) {
        snprintf(why, cap, "a guard byte before or after a buffer was overwritten");
        good = 0;
    }
    if (c->coll == M_AR || c->coll == M_AG || c->coll == M_BC) *hash = t_hash(r, rbytes);
out:
    free(r - M_GUARD);
    if (s) free(s - M_GUARD);
    return good;
}

/* "all_reduce,broadcast" -> the bits of those collectives; NULL: all; 0 if a name is unknown. */
static unsigned m_parse_colls(const char *list) {
    unsigned m = 0;
    int k;
    if (!list) return (1u << M_NCOLL) - 1;
    while (*list) {
        size_t len = strcspn(list, ",");
        for (k = 0; k < M_NCOLL; k++)
            if (strlen(m_coll_name[k]) == len && !strncmp(list, m_coll_name[k], len)) break;
        if (k == M_NCOLL) return 0;
        m |= 1u << k;
        list += len + (list[len] == ',');
    }
    return m;
}

static void run_matrix(ddp_comm_t *comm, const char *hashfile, const char *colls) {
    char path[4096], name[200], why[1400], what[1700];
    FILE *hf;
    size_t k, failed = 0;
    double t0 = now_ms();
    unsigned which = m_parse_colls(colls);
    if (!which) { report(0, "matrix", "unknown collective in the list"); return; }
    snprintf(path, sizeof path, "%s.%d", hashfile, me);
    if (!(hf = fopen(path, "w"))) { report(0, "matrix", "cannot write the hash file"); return; }
    m_build(which);
    for (k = 0; k < m_ncases; k++) {
        uint64_t hash = 0;
        int good;
        m_name(&m_cases[k], name, sizeof name);
        good = m_run(&m_cases[k], comm, &hash, why, sizeof why);
        if (hash) fprintf(hf, "%s: %016llx\n", name, (unsigned long long)hash);
        if (good == 1) continue;
        if (++failed <= M_MAX_FAIL_LINES) {
            snprintf(what, sizeof what, "%s", name);
            report(0, what, why);
        }
        if (good < 0) break;   /* the communicator is in its error state: later calls would say the same */
    }
    fclose(hf);
    if (failed) {
        snprintf(why, sizeof why, "%zu of %zu cases failed%s", failed, m_ncases, k < m_ncases ? " (stopped at an error)" : "");
        report(0, "matrix", why);
    } else {
        snprintf(what, sizeof what, "matrix: %zu cases (%.0f ms)", m_ncases, now_ms() - t0);
        report(1, what, "");
    }
    free(m_cases);
}

int main(int argc, char **argv) {
    ddp_comm_t *comm = NULL;
    const char *mode = argc > 1 ? argv[1] : "";
    int p, rc = 0;
    ddp_result_t r;
    if ((strcmp(mode, "coll") && strcmp(mode, "cut") && strcmp(mode, "loss") && strcmp(mode, "matrix")) ||
        (!strcmp(mode, "matrix") && argc < 3)) {
        fprintf(stderr, "usage: %s coll | cut | loss N | matrix HASHFILE [COLL,...]\n", argv[0]);
        return 1;
    }
    r = ddp_comm_init_env(&comm, NULL);
    if (r != DDP_SUCCESS) {
        printf("rank %s: FAIL init: %s: %s\n", getenv("RANK") ? getenv("RANK") : "?", ddp_strerror(r),
               ddp_last_init_error());
        return 1;
    }
    me = ddp_comm_rank(comm);
    nranks = ddp_comm_size(comm);
    for (p = 0; p < nranks; p++)
        if (p != me) printf("rank %d: peer %d via %s\n", me, p, ddp_comm_transport_name(comm, p));
    fflush(stdout);
    if (!strcmp(mode, "coll")) run_collectives(comm);
    else if (!strcmp(mode, "loss")) run_loss(comm, argc > 2 ? atol(argv[2]) : 200);
    else if (!strcmp(mode, "matrix")) run_matrix(comm, argv[2], argc > 3 ? argv[3] : NULL);
    else rc = run_cut(comm);
    if (rc == 2) {
        double t = now_ms();
        ddp_comm_destroy(comm);
        printf("rank %d: destroy took %.0f ms\n", me, now_ms() - t);
        return rc;
    }
    ddp_comm_destroy(comm);
    return rc ? rc : failures ? 1 : 0;
}
