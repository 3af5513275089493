/* SPDX-License-Identifier: MIT (see LICENSE) */
/* tests/test_collectives.c — every collective x dtype x op x count x world size, in place and out
 * of place, on real processes over loopback TCP, against a sequential reference. Prints TAP.
 *
 *   build/test_collectives            (DDP_TEST_QUICK=1: world sizes 1, 2, 3 and 5 only, and
 *                                      12 of the 21 hierarchical / Rabenseifner runs;
 *                                      DDP_TEST_ONLY=substring runs the runs whose name has it,
 *                                      e.g. "algo=hier_rd" or "mixed[2+1+2]")
 *
 * WHAT IS CHECKED, per case (one communicator per world size per child; all cases run in it):
 *   - the result, bit for bit, against a reference computed sequentially from every rank's
 *     input (each rank regenerates the others' inputs from the case's seed). Inputs are chosen
 *     so that every reduction order gives the same bits: integers wrap (SUM/PROD use full-range
 *     random values, which is exact modulo 2^n in any order) except for AVG (small values: the
 *     sum must not wrap before the division); floating SUM/AVG use values on a grid coarse
 *     enough that every partial sum is exact (fp16/bf16: integers in [-16, 15]); PROD uses
 *     +-{0.5, 1, 2}; MAX/MIN use random bit patterns (subnormals and infinities included; no
 *     NaN and no zero, whose -0/+0 order would make max/min order-dependent). The AVG reference
 *     is the exact sum divided once: truncating for integers, IEEE for fp32/fp64, fp32 then
 *     round-to-nearest-even for fp16/bf16 (ddp_float_to_half / ddp_float_to_bfloat16, which
 *     test_kernels checks exhaustively).
 *   - all-gather and broadcast move random bit patterns (NaN payloads included): exact copies.
 *   - "random" cases (fp16, bf16, fp32, fp64 x SUM/PROD/AVG, uniform data): the result is
 *     within (p+1) unit roundoffs of a double-precision reference, the same bits on every rank,
 *     and the same bits when the call is repeated (determinism).
 *   - the results of all-reduce, all-gather and broadcast hash to the same value on every rank
 *     (the parent compares the hashes children leave in shared memory).
 *   - out of place: sendbuf is unchanged; the receive buffer starts poisoned; count 0 is called
 *     with NULL buffers. Guard bytes before and after every buffer are untouched.
 *   - barrier: nobody leaves before the last rank (which sleeps first) has arrived.
 *   - runs with DDP_ALGO: every rank's timeline (DDP_TRACE, read by the parent) names the
 *     algorithm asked for on each all-reduce (rd, hier_rd: or their fallback above the scratch),
 *     so that a silent fallback cannot pass for a test of it; for "auto", the choice is shown.
 *
 * WHAT RUNS (this machine has 2 cores and the suite also runs under ASan+UBSan):
 *   - world sizes 1..8 with the library's default segment size: counts {0, 1, 3, 1000} for
 *     every collective x dtype x op, in and out of place. The (1<<20)+7 count runs for every
 *     dtype x op at p = 2, 3, 5, 8 (even, odd, prime, the largest); at p = 1, 4, 6, 7 it runs
 *     for one op per dtype ((dtype + op) % 5 == 0, so each op is met at some dtype). Big cases
 *     are in place when dtype + op is odd, out of place otherwise: the in/out-of-place paths do
 *     not depend on the size (the small counts run both), and the reference of a big case is
 *     what costs the time here (p x (1<<20) inputs regenerated per case). For reduce-scatter and all-gather the count is per rank, and
 *     the "big" one is ceil(((1<<20)+7) / p), so the whole buffer is the all-reduce's size
 *     (p x (1<<20) per rank would cost p times the memory and time for no new path).
 *   - p = 2, 3, 8 again with segment_bytes = 4096 (the minimum) and DDP_ALGO=ring, counts
 *     {0, 1, 3, 1000, 100003}: the ring also for the small all-reduces that the library would
 *     otherwise give to recursive doubling (counts below the world size: empty chunks), chunks
 *     of many segments, more segments than the pipeline window (DDP_RING_WINDOW), segments
 *     split unevenly between ranks.
 *   - all-reduce alone with DDP_ALGO=rd at p = 4 (a power of two) and p = 7 (three ranks folded
 *     in), counts {1, 3, 1000, 100003}: recursive doubling well above its automatic threshold.
 *     (The default runs already use it for their small counts.)
 *   - fake hosts ("mixed": shm inside a host, TCP across) in any layout: ranks per host
 *     ("2+1+2") or a host label per rank ("0,1,0,1,1"). The default halves run every collective.
 *   - hierarchical all-reduce alone (DDP_ALGO=hier_ring, hier_rd, hier_rabenseifner) on 2+2,
 *     2+1+2 and 1+3 (uneven: ranks whose local index is at least the smallest host's size only
 *     forward inside their host), counts {0, 1, 3, 1000, 100003}, every dtype x op, in and out
 *     of place, random data; (1<<20)+7 once per algorithm (one exact dtype x op, on 2+1+2).
 *     hier_ring also with 4 KiB segments (2+1+2; 3+1), on non-consecutive hosts (0,1,0,1,1);
 *     hier_rd with one rank per host (1+1+1); DDP_ALGO=hier (2+1+2) and auto (2+2: the cost
 *     model may choose hierarchical) likewise.
 *   - Rabenseifner's all-reduce alone (DDP_ALGO=rabenseifner) at p = 4, 5, 7 on one host (TCP,
 *     shm as point-to-point) and on fake hosts (2+2, 3+2, 1+4+2), the same counts; (1<<20)+7
 *     once (p = 5).
 * AR/AG/BC results are verified in full by one rank per big case (rotating) and by every
 * rank for small ones; the hash comparison then covers the other ranks. */
#define _GNU_SOURCE
#include "ddp.h"
#include "transports/ddp_tcp.h"
#include "transports/ddp_shm.h"
#include "tests/ddp_test.h"
#include "tests/ddp_test_data.h"

#include <math.h>

enum { C_AR, C_RS, C_AG, C_BC, C_BARRIER };
static const char *const coll_names[] = {"all_reduce", "reduce_scatter", "all_gather", "broadcast", "barrier"};
enum { K_EXACT, K_RANDOM };

#define BIG ((size_t)(1u << 20) + 7)
#define MID 100003
#define GUARD 64
#define MAXC 4096
#define FULL_CHECK_MAX 100003   /* up to this many output elements every rank checks in full */

typedef struct {
    unsigned char coll, dtype, op, inplace, kind;
    int root;
    size_t count;       /* AR/BC: elements; RS: recvcount; AG: sendcount */
    uint64_t seed;
} tcase_t;

enum { BIG_NONE, BIG_ALL, BIG_SUBSET, BIG_ONE };
typedef struct {
    int p;
    size_t segment_bytes;  /* 0: the library's default */
    const char *algo;      /* DDP_ALGO for the children (NULL: unset, the library's choice) */
    size_t counts[6];
    int ncounts;
    int big;               /* BIG_*: the (1<<20)+7 count for every dtype x op, a subset, or one */
    int big_pick;          /* BIG_ONE: the exact case dtype * DDP_NUM_OPS + op gets the big count */
    int ar_only;
    const char *mode;      /* transport set-up: see mode_setup() */
    const char *layout;    /* mode "mixed": ranks per fake host, see layout_host() (NULL: halves) */
} run_cfg_t;

typedef struct {
    int ncases;
    int progress[T_MAX_RANKS];        /* cases completed */
    int init_failed[T_MAX_RANKS];
    int barrier_arrived[T_MAX_RANKS];
    int msg_claimed[MAXC];
    unsigned char fail[MAXC];
    unsigned char ran[T_MAX_RANKS][MAXC];
    uint64_t hash[T_MAX_RANKS][MAXC];
    char msg[MAXC][200];
    char init_msg[T_MAX_RANKS][400];
} coll_shm_t;

static coll_shm_t *S;
static tcase_t cases[MAXC];

/* ------------------------------------------------------------------------- case list */

static int add_case(int n, int coll, int dt, int op, size_t count, int inplace, int kind, int root) {
    tcase_t *c;
    if (n >= MAXC) t_bail("too many cases");
    c = &cases[n];
    c->coll = (unsigned char)coll; c->dtype = (unsigned char)dt; c->op = (unsigned char)op;
    c->count = count; c->inplace = (unsigned char)inplace; c->kind = (unsigned char)kind;
    c->root = root;
    c->seed = t_mix64(0x5eed0000ull + (uint64_t)n * 7919u);
    return n + 1;
}

static size_t per_rank(size_t total, int p) { return (total + (size_t)p - 1) / (size_t)p; }

static int build_cases(const run_cfg_t *cfg) {
    const int p = cfg->p;
    const size_t top = cfg->counts[cfg->ncounts - 1];
    int n = 0, coll, dt, op, ci, ip, ri;
    for (coll = C_AR; coll <= (cfg->ar_only ? C_AR : C_BC); coll++) {
        int nops = (coll == C_AR || coll == C_RS) ? DDP_NUM_OPS : (coll == C_BC ? (p > 1 ? 2 : 1) : 1);
        for (dt = 0; dt < DDP_NUM_DTYPES; dt++) {
            for (op = 0; op < nops; op++) {
                int root = coll == C_BC ? (op == 0 ? 0 : p - 1) : 0;
                int rop = coll == C_BC ? root : op;  /* the broadcast "op" slot is the root */
                for (ci = 0; ci < cfg->ncounts; ci++) {
                    size_t cnt = cfg->counts[ci];
                    if ((coll == C_RS || coll == C_AG) && cnt > 1000) cnt = per_rank(cnt, p);
                    for (ip = 0; ip < 2; ip++) n = add_case(n, coll, dt, rop, cnt, ip, K_EXACT, root);
                }
                if (cfg->big != BIG_NONE) {
                    size_t cnt = (coll == C_RS || coll == C_AG) ? per_rank(BIG, p) : BIG;
                    if (cfg->big == BIG_ONE ? dt * DDP_NUM_OPS + op == cfg->big_pick
                                            : cfg->big == BIG_ALL || (dt + op) % 5 == 0)
                        n = add_case(n, coll, dt, rop, cnt, (dt + op) % 2, K_EXACT, root);
                }
            }
        }
    }
    /* Random data: rounding behaviour, cross-rank identity and determinism. */
    for (coll = C_AR; coll <= (cfg->ar_only ? C_AR : C_RS); coll++) {
        static const int fdts[] = {DDP_FLOAT16, DDP_BFLOAT16, DDP_FLOAT32, DDP_FLOAT64};
        static const int fops[] = {DDP_SUM, DDP_PROD, DDP_AVG};
        for (dt = 0; dt < 4; dt++)
            for (op = 0; op < 3; op++)
                for (ri = 0; ri < 2; ri++) {
                    size_t cnt = ri == 0 ? 1000 : (cfg->big == BIG_ALL || cfg->big == BIG_SUBSET ? BIG : top);
                    if (ri == 1 && cfg->big == BIG_SUBSET && (dt + op) % 3 != 0) continue;
                    if (ri == 1 && cnt <= 1000) continue;
                    if (coll == C_RS && cnt > 1000) cnt = per_rank(cnt, p);
                    n = add_case(n, coll, fdts[dt], fops[op], cnt, (dt + op + ri) % 2, K_RANDOM, 0);
                }
    }
    if (!cfg->ar_only) n = add_case(n, C_BARRIER, DDP_UINT8, 0, 0, 0, K_EXACT, 0);
    return n;
}

static void case_str(const tcase_t *c, char *out, size_t cap) {
    if (c->coll == C_BARRIER) { snprintf(out, cap, "barrier"); return; }
    snprintf(out, cap, "%s %s%s%s count %zu %s%s%s", coll_names[c->coll], ddp_dtype_name((ddp_dtype_t)c->dtype),
             (c->coll == C_AR || c->coll == C_RS) ? " " : "",
             (c->coll == C_AR || c->coll == C_RS) ? ddp_op_name((ddp_op_t)c->op) : "", c->count,
             c->inplace ? "in-place" : "out-of-place", c->kind == K_RANDOM ? " random" : "",
             c->coll == C_BC ? (c->root == 0 ? " root 0" : " root last") : "");
}

/* ------------------------------------------------------------------------- inputs */
/* Case c's inputs (tests/ddp_test_data.h): copies move any bits; exact cases t_exact_bits; random
 * cases uniform floats (t_uniform_bits). Element i of rank r's input is element i of its range. */
static void case_inputs(const tcase_t *c, t_in_t *g) {
    int how = c->coll == C_AG || c->coll == C_BC ? T_IN_BITS : c->kind == K_RANDOM ? T_IN_UNIFORM : T_IN_EXACT;
    t_in_init(g, how, c->dtype, c->op, c->seed);
}

static void fill(unsigned char *buf, const t_in_t *g, int rank, size_t lo, size_t n) { t_in_fill(g, rank, lo, n, buf); }

static inline uint64_t load_elem(const unsigned char *buf, size_t i, size_t es) {
    uint64_t v = 0;
    memcpy(&v, buf + i * es, es);   /* little-endian: the low bytes */
    return v;
}

/* ------------------------------------------------------------------------- checking */
static void case_fail(int k, const char *fmt, ...) T_PRINTF(2, 3);
static void case_fail(int k, const char *fmt, ...) {
    va_list ap;
    S->fail[k] = 1;
    if (__atomic_exchange_n(&S->msg_claimed[k], 1, __ATOMIC_SEQ_CST)) return;
    {
        char m[180];
        va_start(ap, fmt);
        vsnprintf(m, sizeof m, fmt, ap);
        va_end(ap);
        snprintf(S->msg[k], sizeof S->msg[k], "rank %d: %s", t_rank, m);
    }
}

static void guard_set(unsigned char *region, size_t bytes) {
    size_t i;
    for (i = 0; i < GUARD; i++) {
        region[i] = (unsigned char)(0xa5 ^ i);
        region[GUARD + bytes + i] = (unsigned char)(0x5a ^ i);
    }
}

static int guard_ok(const unsigned char *region, size_t bytes) {
    size_t i;
    for (i = 0; i < GUARD; i++)
        if (region[i] != (unsigned char)(0xa5 ^ i) || region[GUARD + bytes + i] != (unsigned char)(0x5a ^ i)) return 0;
    return 1;
}

/* Set by test_nccl.c: NCCL's average divides each input by p before summing floats, so its
 * bits can differ from the exact sum divided once; floating AVG is then held to the random
 * cases' tolerance (the same bits on every rank are still checked, through the hashes). */
static int avg_divides_first;

/* Compares n output elements (global indices lo..) of a reduction with the sequential reference
 * (t_ref_exact_one, computed a block at a time by t_in_ref_exact / t_in_ref_sums). */
static void check_reduction(int k, const tcase_t *c, const t_in_t *g, int p, const unsigned char *out, size_t lo, size_t n) {
    const size_t es = g->es;
    const int dt = c->dtype;
    const int exact = c->kind == K_EXACT && !(avg_divides_first && c->op == DDP_AVG && !t_is_int(dt));
    const uint64_t mask = es == 8 ? ~0ull : ((1ull << (8 * es)) - 1);
    size_t i0, i, bad = 0, first = 0;
    uint64_t got_first = 0, exp_first = 0;
    double tol_first = 0;
    for (i0 = 0; i0 < n; i0 += T_IN_BLOCK) {
        const size_t m = n - i0 < T_IN_BLOCK ? n - i0 : T_IN_BLOCK;
        const unsigned char *o = out + i0 * es;
        if (exact) {
            uint64_t ref[T_IN_BLOCK];
            unsigned char want[T_IN_BLOCK * 8];
            t_in_ref_exact(g, p, lo + i0, m, ref);
            t_in_narrow(es, ref, m, want);
            if (memcmp(o, want, m * es) == 0) continue;
            for (i = 0; i < m; i++) {
                uint64_t got = load_elem(o, i, es);
                if (got != (ref[i] & mask) && !bad++) { first = i0 + i; got_first = got; exp_first = ref[i] & mask; }
            }
        } else {
            double sum[T_IN_BLOCK], abssum[T_IN_BLOCK], prod[T_IN_BLOCK], gotv[T_IN_BLOCK];
            const double u = t_unit_roundoff(dt);
            unsigned char gotb[T_IN_BLOCK * 8];
            t_in_ref_sums(g, p, lo + i0, m, sum, abssum, prod);
            memcpy(gotb, o, m * es);
            t_in_decode(dt, gotb, m, gotv);
            for (i = 0; i < m; i++) {
                double ref, tol;
                if (c->op == DDP_PROD) { ref = prod[i]; tol = (2 * p + 2) * u * fabs(prod[i]); }
                else if (c->op == DDP_AVG) { ref = sum[i] / p; tol = (p + 1) * u * abssum[i] / p + 2 * u * fabs(ref); }
                else { ref = sum[i]; tol = (p + 1) * u * abssum[i]; }
                if (!(fabs(gotv[i] - ref) <= tol)) {
                    if (!bad++) { first = i0 + i; got_first = load_elem(o, i, es); exp_first = t_f64_bits(ref); tol_first = tol; }
                }
            }
        }
    }
    if (bad) {
        if (exact)
            case_fail(k, "%zu of %zu elements wrong; first at output index %zu: got 0x%llx, expected 0x%llx",
                      bad, n, first, (unsigned long long)got_first, (unsigned long long)exp_first);
        else
            case_fail(k, "%zu of %zu elements off; first at %zu: got %.9g, reference %.9g, tolerance %.3g",
                      bad, n, first, t_dec_float(dt, got_first), t_dec_float(DDP_FLOAT64, exp_first), tol_first);
    }
}

/* Output elements oi.. of a copy collective: rank src's input elements si... */
static void check_copy(int k, const t_in_t *g, const unsigned char *out, int src, size_t si, size_t n, size_t oi) {
    const size_t es = g->es, i = t_in_first_diff(g, src, si, out + oi * es, n);
    if (i < n) {
        unsigned char want[8];
        t_in_fill(g, src, si + i, 1, want);
        case_fail(k, "output element %zu wrong (from rank %d element %zu): got 0x%llx, expected 0x%llx",
                  oi + i, src, si + i, (unsigned long long)load_elem(out, oi + i, es),
                  (unsigned long long)load_elem(want, 0, es));
    }
}

/* ------------------------------------------------------------------------- running a case */
typedef struct {
    unsigned char *sreg, *rreg, *copy, *rep;   /* regions: GUARD + bytes + GUARD */
    size_t cap;                                /* bytes of the largest buffer */
} bufs_t;

/* Returns the library's result (anything else than DDP_SUCCESS stops the run). */
static ddp_result_t run_case(int k, const tcase_t *c, ddp_comm_t *comm, bufs_t *b, int rank, int p) {
    const ddp_dtype_t dt = (ddp_dtype_t)c->dtype;
    const ddp_op_t op = (ddp_op_t)c->op;
    const size_t es = ddp_dtype_size(dt), n = c->count;
    size_t sbytes = 0, rbytes = 0, out_elems = 0;
    unsigned char *send = b->sreg + GUARD, *recv = b->rreg + GUARD, *sendp, *recvp, *out;
    ddp_result_t r = DDP_SUCCESS;
    int checker;
    t_in_t g;

    if (c->coll == C_BARRIER) {
        int it, q;
        for (it = 1; it <= 3; it++) {
            if (rank == it % p) t_sleep_ms(30);
            __atomic_store_n(&S->barrier_arrived[rank], it, __ATOMIC_SEQ_CST);
            r = ddp_barrier(comm);
            if (r != DDP_SUCCESS) { case_fail(k, "ddp_barrier: %s: %s", ddp_strerror(r), ddp_comm_last_error(comm)); return r; }
            for (q = 0; q < p; q++)
                if (__atomic_load_n(&S->barrier_arrived[q], __ATOMIC_SEQ_CST) < it)
                    case_fail(k, "left barrier %d before rank %d arrived", it, q);
        }
        return r;
    }
    case_inputs(c, &g);
    switch (c->coll) {
    case C_AR: case C_BC: sbytes = rbytes = n * es; out_elems = n; break;
    case C_RS: sbytes = (size_t)p * n * es; rbytes = n * es; out_elems = n; break;
    case C_AG: sbytes = n * es; rbytes = (size_t)p * n * es; out_elems = (size_t)p * n; break;
    }
    if (c->inplace) {
        /* One region holds both: NCCL's in-place layouts. */
        size_t bytes = c->coll == C_RS ? sbytes : rbytes;
        unsigned char *base = recv;
        guard_set(b->rreg, bytes);
        memset(base, 0xcd, bytes);
        switch (c->coll) {
        case C_AR: fill(base, &g, rank, 0, n); sendp = recvp = base; break;
        case C_RS: fill(base, &g, rank, 0, (size_t)p * n); sendp = base; recvp = base + (size_t)rank * n * es; break;
        case C_AG: fill(base + (size_t)rank * n * es, &g, rank, 0, n); recvp = base; sendp = base + (size_t)rank * n * es; break;
        default: if (rank == c->root) fill(base, &g, rank, 0, n); sendp = recvp = base; break;
        }
        if (n == 0 && (k & 1)) sendp = recvp = NULL;    /* count 0: NULL is fine too */
        out = recvp;
    } else {
        guard_set(b->sreg, sbytes);
        guard_set(b->rreg, rbytes);
        memset(recv, 0xcd, rbytes);
        if (c->coll == C_RS) fill(send, &g, rank, 0, (size_t)p * n);
        else if (c->coll != C_BC || rank == c->root) fill(send, &g, rank, 0, n);
        else memset(send, 0x3c, sbytes);  /* a non-root's sendbuf: must be left alone */
        memcpy(b->copy, send, sbytes);
        sendp = send;
        recvp = recv;
        if (c->coll == C_BC && rank != c->root && (k & 2)) sendp = NULL;   /* NCCL: unused */
        if (n == 0) sendp = recvp = NULL;
        out = recv;
    }

    switch (c->coll) {
    case C_AR: r = ddp_all_reduce(sendp, recvp, n, dt, op, comm); break;
    case C_RS: r = ddp_reduce_scatter(sendp, recvp, n, dt, op, comm); break;
    case C_AG: r = ddp_all_gather(sendp, recvp, n, dt, comm); break;
    default: r = ddp_broadcast(sendp, recvp, n, dt, c->root, comm); break;
    }
    if (r != DDP_SUCCESS) {
        case_fail(k, "returned %s: %s", ddp_strerror(r), ddp_comm_last_error(comm));
        return r;
    }
    if (c->inplace) {
        if (!guard_ok(b->rreg, c->coll == C_RS ? sbytes : rbytes)) case_fail(k, "guard bytes around the buffer overwritten");
    } else {
        if (!guard_ok(b->sreg, sbytes)) case_fail(k, "guard bytes around sendbuf overwritten");
        if (!guard_ok(b->rreg, rbytes)) case_fail(k, "guard bytes around recvbuf overwritten");
        if (memcmp(send, b->copy, sbytes) != 0) case_fail(k, "out-of-place call modified sendbuf");
    }
    S->hash[rank][k] = t_hash(out ? out : (const unsigned char *)"", out_elems * es);

    checker = out_elems <= FULL_CHECK_MAX || c->coll == C_RS || k % p == rank;
    if (checker && n) {
        switch (c->coll) {
        case C_AR: check_reduction(k, c, &g, p, out, 0, n); break;
        case C_RS: check_reduction(k, c, &g, p, out, (size_t)rank * n, n); break;
        case C_AG: { int q; for (q = 0; q < p; q++) check_copy(k, &g, out, q, 0, n, (size_t)q * n); } break;
        default: check_copy(k, &g, out, c->root, 0, n, 0); break;
        }
    }
    /* Determinism: the same call again gives the same bits. */
    if (c->kind == K_RANDOM && n) {
        uint64_t h1 = S->hash[rank][k];
        unsigned char *again = b->rep + GUARD;
        if (c->coll == C_AR) {
            fill(send, &g, rank, 0, n);
            r = ddp_all_reduce(send, again, n, dt, op, comm);
        } else {
            fill(send, &g, rank, 0, (size_t)p * n);
            r = ddp_reduce_scatter(send, again, n, dt, op, comm);
        }
        if (r != DDP_SUCCESS) { case_fail(k, "repeat returned %s: %s", ddp_strerror(r), ddp_comm_last_error(comm)); return r; }
        if (t_hash(again, out_elems * es) != h1) case_fail(k, "repeating the call gave different bits (not deterministic)");
    }
    return DDP_SUCCESS;
}

static size_t case_max_bytes(const tcase_t *c, int p) {
    size_t es = ddp_dtype_size((ddp_dtype_t)c->dtype);
    if (c->coll == C_RS || c->coll == C_AG) return (size_t)p * c->count * es;
    return c->count * es;
}

/* The fake host of `rank` in a "mixed" run of p ranks. The layout is either the ranks per host
 * in rank order, "2+1+2" (ranks 0-1 on host 0, rank 2 on host 1, ranks 3-4 on host 2), or a host
 * label per rank, "0,1,0,1,1" (a host's ranks need not be consecutive). NULL: the first (p+1)/2
 * ranks on one host, the others on another. -1 if the layout does not describe p ranks. */
static int layout_host(const char *layout, int p, int rank) {
    const char *s = layout;
    const int labels = layout && strchr(layout, ',') != NULL;
    int i = 0, h = 0, host = -1;
    if (!layout) return rank < (p + 1) / 2 ? 0 : 1;
    for (;;) {
        char *end;
        long v = strtol(s, &end, 10);
        if (end == s || v < (labels ? 0 : 1) || v > T_MAX_RANKS) return -1;
        if (labels ? i == rank : rank >= i && rank < i + (int)v) host = labels ? (int)v : h;
        i += labels ? 1 : (int)v;
        h++;
        if (!*end) break;
        if (*end != (labels ? ',' : '+')) return -1;
        s = end + 1;
    }
    return i == p ? host : -1;
}

/* The children's transport environment for a run (whatever the caller's environment says):
 *   tcp        every peer over TCP loopback (DDP_TRANSPORT=tcp)
 *   shm        all ranks on one host: shared memory, collectives run by the shm transport
 *   shm-small  the same with 4 KiB staging chunks and the two-step all-reduce from 64 bytes:
 *              many chunks, slices of 0 or 1 element, uneven slices
 *   shm-p2p    shared memory as a point-to-point transport under the ring / recursive doubling
 *              (DDP_SHM_COLL=0), with tiny queues (2 cells of 256 bytes): every message is
 *              fragmented and the sender waits for room
 *   mixed      fake hosts (DDP_HOST_ID "fake-host-<n>", n from the run's layout): shm inside
 *              each, TCP between them */
static void mode_setup(const run_cfg_t *cfg, int rank) {
    static const char *const vars[] = {"DDP_TRANSPORT", "DDP_HOST_ID", "DDP_SHM_COLL", "DDP_SHM_CHUNK",
                                       "DDP_SHM_SMALL_MAX", "DDP_SHM_CELLS", "DDP_SHM_CELL_BYTES"};
    const char *mode = cfg->mode;
    size_t i;
    for (i = 0; i < sizeof vars / sizeof vars[0]; i++) unsetenv(vars[i]);
    if (!strcmp(mode, "tcp")) setenv("DDP_TRANSPORT", "tcp", 1);
    if (!strcmp(mode, "shm-small")) { setenv("DDP_SHM_CHUNK", "4096", 1); setenv("DDP_SHM_SMALL_MAX", "64", 1); }
    if (!strcmp(mode, "shm-p2p")) {
        setenv("DDP_SHM_COLL", "0", 1);
        setenv("DDP_SHM_CELLS", "2", 1);
        setenv("DDP_SHM_CELL_BYTES", "256", 1);
    }
    if (!strcmp(mode, "mixed")) {
        char id[32];
        snprintf(id, sizeof id, "fake-host-%d", layout_host(cfg->layout, cfg->p, rank));
        setenv("DDP_HOST_ID", id, 1);
    }
}

/* The transport each peer must be using in this mode ("" = don't care). */
static const char *mode_expect(const run_cfg_t *cfg, int rank, int peer) {
    if (!strcmp(cfg->mode, "tcp")) return "tcp";
    if (!strcmp(cfg->mode, "mixed"))
        return layout_host(cfg->layout, cfg->p, rank) == layout_host(cfg->layout, cfg->p, peer) ? "shm" : "tcp";
    return "shm";
}

/* Set by main(): runs with a DDP_ALGO write their timelines here (DDP_TRACE), and the parent
 * checks that the all-reduces ran the algorithm asked for. */
static char trace_dir[512];

static int child(int rank, int p, void *arg) {
    const run_cfg_t *cfg = (const run_cfg_t *)arg;
    ddp_comm_desc_t d;
    ddp_comm_t *comm = NULL;
    ddp_result_t r;
    bufs_t b;
    size_t cap = 64;
    int k, status = 0;
    /* The run's settings, whatever the environment says. */
    if (cfg->algo) setenv("DDP_ALGO", cfg->algo, 1); else unsetenv("DDP_ALGO");
    if (cfg->algo && trace_dir[0]) {   /* which algorithm ran: see check_algorithm() */
        char path[600];
        snprintf(path, sizeof path, "%s/rank%%r.json", trace_dir);
        setenv("DDP_TRACE", path, 1);
    }
    mode_setup(cfg, rank);
    unsetenv("DDP_RD_MAX_BYTES");
    unsetenv("DDP_SEGMENT_BYTES");
    t_desc(&d, 60000);
    d.segment_bytes = cfg->segment_bytes;
    t_where("ddp_comm_init");
    r = ddp_comm_init(&comm, p, rank, &d);
    if (r != DDP_SUCCESS) {
        S->init_failed[rank] = 1;
        snprintf(S->init_msg[rank], sizeof S->init_msg[rank], "%s: %.360s", ddp_strerror(r), ddp_last_init_error());
        return 2;
    }
    if (ddp_comm_rank(comm) != rank || ddp_comm_size(comm) != p) {
        S->init_failed[rank] = 1;
        snprintf(S->init_msg[rank], sizeof S->init_msg[rank], "ddp_comm_rank/size say %d/%d",
                 ddp_comm_rank(comm), ddp_comm_size(comm));
    }
    for (k = 0; k < p; k++) {
        const char *want = mode_expect(cfg, rank, k), *got = ddp_comm_transport_name(comm, k);
        if (k == rank || !strcmp(want, got)) continue;
        S->init_failed[rank] = 1;
        snprintf(S->init_msg[rank], sizeof S->init_msg[rank], "peer %d uses transport '%s', "
                 "expected '%s' in mode %s", k, got, want, cfg->mode);
        break;
    }
    for (k = 0; k < S->ncases; k++) { size_t m = case_max_bytes(&cases[k], p); if (m > cap) cap = m; }
    b.cap = cap;
    b.sreg = (unsigned char *)malloc(cap + 2 * GUARD);
    b.rreg = (unsigned char *)malloc(cap + 2 * GUARD);
    b.rep = (unsigned char *)malloc(cap + 2 * GUARD);
    b.copy = (unsigned char *)malloc(cap);
    if (!b.sreg || !b.rreg || !b.rep || !b.copy) { ddp_comm_destroy(comm); return 3; }
    for (k = 0; k < S->ncases; k++) {
        char what[160];
        case_str(&cases[k], what, sizeof what);
        t_where("case %d: %s", k, what);
        r = run_case(k, &cases[k], comm, &b, rank, p);
        S->ran[rank][k] = 1;
        if (r != DDP_SUCCESS) { status = 4; break; }
        S->progress[rank] = k + 1;
    }
    t_where("ddp_comm_destroy");
    if (ddp_comm_destroy(comm) != DDP_SUCCESS) status = 5;
    free(b.sreg); free(b.rreg); free(b.rep); free(b.copy);
    return status;
}

/* ------------------------------------------------------------------------- the parent */
/* A run's name in the report, and what DDP_TEST_ONLY matches: "mixed[2+1+2] p=5 algo=hier_rd". */
static void run_tag(const run_cfg_t *cfg, char *out, size_t cap) {
    char seg[32] = "";
    if (cfg->segment_bytes) snprintf(seg, sizeof seg, " seg=%zu", cfg->segment_bytes);
    snprintf(out, cap, "%s%s%s%s p=%d%s%s%s", cfg->mode, cfg->layout ? "[" : "", cfg->layout ? cfg->layout : "",
             cfg->layout ? "]" : "", cfg->p, seg, cfg->algo ? " algo=" : "", cfg->algo ? cfg->algo : "");
}

static void report_run(const run_cfg_t *cfg, int nbad) {
    const int p = cfg->p;
    int k = 0, r;
    char tag[96];
    run_tag(cfg, tag, sizeof tag);
    for (r = 0; r < p; r++)
        if (S->init_failed[r]) diag("%s rank %d init: %s", tag, r, S->init_msg[r]);
    ok(nbad == 0, "%s: every rank ran all %d cases and exited cleanly (%.1f s)", tag, S->ncases, t_last_run.seconds);
    while (k < S->ncases) {
        /* A group: the same collective, dtype, op (root) and kind; its counts and in/out. */
        int g0 = k, g1, bad = 0, shown = 0, notrun = 0;
        char counts[128] = "", what[160];
        size_t off = 0, lastc = (size_t)-1;
        while (k < S->ncases && cases[k].coll == cases[g0].coll && cases[k].dtype == cases[g0].dtype &&
               cases[k].op == cases[g0].op && cases[k].kind == cases[g0].kind) k++;
        g1 = k;
        for (k = g0; k < g1; k++) {
            int fail = S->fail[k], ranks_ran = 1, same = 1;
            const tcase_t *c = &cases[k];
            if (c->count != lastc && off + 24 < sizeof counts) {
                off += (size_t)snprintf(counts + off, sizeof counts - off, "%s%zu", off ? "," : "", c->count);
                lastc = c->count;
            }
            for (r = 0; r < p; r++) if (!S->ran[r][k] || S->progress[r] <= k) ranks_ran = 0;
            if (!ranks_ran && !fail) { notrun++; fail = 1; }
            if (ranks_ran && c->coll != C_RS && c->coll != C_BARRIER)
                for (r = 1; r < p; r++) if (S->hash[r][k] != S->hash[0][k]) same = 0;
            if (!same) fail = 1;
            if (fail) {
                bad++;
                if (shown < 3) {
                    case_str(c, what, sizeof what);
                    if (!same) diag("  %s: results differ between ranks (hash rank 0 %016llx)", what, (unsigned long long)S->hash[0][k]);
                    if (S->fail[k]) diag("  %s: %s", what, S->msg[k]);
                    else if (!ranks_ran) diag("  %s: not run by every rank", what);
                    shown++;
                }
            }
        }
        k = g1;
        {
            const tcase_t *c = &cases[g0];
            if (c->coll == C_BARRIER)
                ok(!bad, "%s barrier: nobody leaves before everyone arrived", tag);
            else if (c->coll == C_AR || c->coll == C_RS)
                ok(!bad, "%s %s %s %s%s: counts {%s}, in/out of place%s", tag, coll_names[c->coll],
                   ddp_dtype_name((ddp_dtype_t)c->dtype), ddp_op_name((ddp_op_t)c->op),
                   c->kind == K_RANDOM ? " random data" : "", counts, notrun ? " (some not run)" : "");
            else
                ok(!bad, "%s %s %s%s: counts {%s}, in/out of place%s", tag, coll_names[c->coll],
                   ddp_dtype_name((ddp_dtype_t)c->dtype),
                   c->coll == C_BC ? (c->root == 0 ? " root 0" : " root last") : "", counts,
                   notrun ? " (some not run)" : "");
        }
    }
}

static run_cfg_t *add_run(run_cfg_t *runs, int *n, const char *mode, int p, size_t seg, const char *algo,
                           int big, int ar_only, const size_t *counts, int ncounts) {
    run_cfg_t *c = &runs[(*n)++];
    memset(c, 0, sizeof *c);
    c->mode = mode;
    c->p = p;
    c->segment_bytes = seg;
    c->algo = algo;
    c->big = big;
    c->ar_only = ar_only;
    memcpy(c->counts, counts, sizeof *counts * (size_t)ncounts);
    c->ncounts = ncounts;
    return c;
}

/* The all-reduce algorithms named by the trace events in `path` (DDP_TRACE's JSON, one event a
 * line), added to names/counts (at most 8 names); -1 if there is no such file. */
static int tally_algorithms(const char *path, char names[8][64], int counts[8], int *nnames) {
    FILE *f = fopen(path, "r");
    char line[4096];
    int events = 0;
    if (!f) return -1;
    while (fgets(line, sizeof line, f)) {
        char name[64];
        int i;
        if (!t_trace_all_reduce_algo(line, name, sizeof name)) continue;
        for (i = 0; i < *nnames; i++) if (!strcmp(names[i], name)) break;
        if (i == *nnames) {
            if (i == 8) continue;
            strcpy(names[i], name);
            counts[i] = 0;
            (*nnames)++;
        }
        counts[i]++;
        events++;
    }
    fclose(f);
    return events;
}

/* After a run with DDP_ALGO: its all-reduces ran that algorithm on every rank (or its documented
 * fallback: rd and hier_rd above the scratch), so a silent fallback cannot pass for a test of it;
 * "hier" runs only hierarchical ones, "auto" anything (said in a diagnostic). */
static void check_algorithm(const run_cfg_t *cfg, const char *tag) {
    static const char *const table[][3] = {
        {"ring", "ring", NULL},
        {"rd", "recursive doubling", "ring"},
        {"rabenseifner", "rabenseifner", NULL},
        {"hier_ring", "hierarchical (ring across hosts)", NULL},
        {"hier_rd", "hierarchical (recursive doubling across hosts)", "hierarchical (rabenseifner across hosts)"},
        {"hier_rabenseifner", "hierarchical (rabenseifner across hosts)", NULL},
        {"hier", "hierarchical", NULL},   /* a prefix: any of the three */
        {"auto", "", NULL}};
    char names[8][64], summary[600] = "", path[600];
    int counts[8], nnames = 0, r, i, events = 0, missing = 0, bad = 0, want_seen = 0;
    size_t k, off = 0;
    const char *want = NULL, *also = NULL;
    for (k = 0; k < sizeof table / sizeof table[0]; k++)
        if (!strcmp(cfg->algo, table[k][0])) { want = table[k][1]; also = table[k][2]; }
    for (r = 0; r < cfg->p; r++) {
        int e;
        snprintf(path, sizeof path, "%s/rank%d.json", trace_dir, r);
        e = tally_algorithms(path, names, counts, &nnames);
        if (e < 0) missing++; else events += e;
        unlink(path);
    }
    for (i = 0; i < nnames; i++) {
        int is_want = want && (!strcmp(cfg->algo, "hier") ? !strncmp(names[i], want, strlen(want)) : !strcmp(names[i], want));
        if (is_want) want_seen = 1;
        else if (!(also && !strcmp(names[i], also))) bad += counts[i];
        if (off < sizeof summary)
            off += (size_t)snprintf(summary + off, sizeof summary - off, "%s%s x %d", i ? ", " : "", names[i], counts[i]);
    }
    if (!want) { diag("%s: no expectation for DDP_ALGO=%s: %s", tag, cfg->algo, summary); return; }
    if (!*want) { diag("%s: the library chose: %s", tag, summary); return; }
    ok(!missing && events > 0 && want_seen && !bad, "%s: every rank's all-reduces ran %s%s%s%s (trace: %d events%s%s)",
       tag, want, also ? " (or " : "", also ? also : "", also ? ")" : "", events, *summary ? ": " : "", summary);
    if (missing) diag("%s: %d of %d ranks wrote no trace to %s", tag, missing, cfg->p, trace_dir);
}

/* An all-reduce-only run on fake hosts (mode "mixed"); p is what the layout describes. */
static run_cfg_t *add_hosts_run(run_cfg_t *runs, int *n, const char *layout, size_t seg, const char *algo,
                                int big_pick, const size_t *counts, int ncounts) {
    int p = 1;
    run_cfg_t *c;
    while (p <= T_MAX_RANKS && layout_host(layout, p, 0) < 0) p++;
    if (p > T_MAX_RANKS) t_bail("layout '%s' describes no world", layout);
    c = add_run(runs, n, "mixed", p, seg, algo, big_pick >= 0 ? BIG_ONE : BIG_NONE, 1, counts, ncounts);
    c->layout = layout;
    c->big_pick = big_pick;
    return c;
}

/* Hierarchical and Rabenseifner all-reduce (issue 18): every dtype x op, counts {0, 1, 3, 1000,
 * 100003}, in and out of place, random data; each algorithm meets the big count once, on one
 * exact dtype x op (its own, so that every element size is met). */
static void add_hier_runs(run_cfg_t *runs, int *n, int quick) {
    static const size_t counts[] = {0, 1, 3, 1000, MID};
    static const char *const algos[3] = {"hier_ring", "hier_rd", "hier_rabenseifner"};
    static const int picks[3] = {DDP_FLOAT16 * DDP_NUM_OPS + DDP_SUM, DDP_INT64 * DDP_NUM_OPS + DDP_PROD,
                                 DDP_BFLOAT16 * DDP_NUM_OPS + DDP_AVG};
    /* Even; uneven with a one-rank host in the middle (L = 1: ranks 1 and 4 only forward
     * inside their host); the one-rank host first. */
    static const char *const layouts[3] = {"2+2", "2+1+2", "1+3"};
    int a, l;
    for (a = 0; a < 3; a++)
        for (l = 0; l < 3; l++) {
            if (quick && l != 1 && l != a % 2 * 2) continue;   /* 2+1+2 and one other */
            add_hosts_run(runs, n, layouts[l], 0, algos[a], l == 1 ? picks[a] : -1, counts, 5);
        }
    /* hier_ring with the smallest segments: a host's slice spans many of them. */
    add_hosts_run(runs, n, "2+1+2", 4096, "hier_ring", -1, counts, 5);
    if (!quick) add_hosts_run(runs, n, "3+1", 4096, "hier_ring", -1, counts, 5);
    /* A host's ranks not consecutive; one rank per host (nothing to do inside a host); the
     * library's choice of inner and outer algorithm. */
    add_hosts_run(runs, n, "0,1,0,1,1", 0, "hier_ring", -1, counts, 5);
    if (!quick) add_hosts_run(runs, n, "1+1+1", 0, "hier_rd", -1, counts, 5);
    if (!quick) add_hosts_run(runs, n, "2+1+2", 0, "hier", -1, counts, 5);
    /* The cost model's choice where hierarchical is a candidate. */
    add_hosts_run(runs, n, "2+2", 0, "auto", DDP_UINT8 * DDP_NUM_OPS + DDP_MIN, counts, 5);
    /* Rabenseifner: a power of two, an odd and a prime world, on one host and on fake hosts. */
    add_run(runs, n, "tcp", 4, 0, "rabenseifner", BIG_NONE, 1, counts, 5);
    add_run(runs, n, "shm", 5, 0, "rabenseifner", BIG_ONE, 1, counts, 5)->big_pick = DDP_FLOAT32 * DDP_NUM_OPS + DDP_MAX;
    if (!quick) add_run(runs, n, "tcp", 7, 0, "rabenseifner", BIG_NONE, 1, counts, 5);
    if (!quick) add_hosts_run(runs, n, "2+2", 0, "rabenseifner", -1, counts, 5);
    add_hosts_run(runs, n, "3+2", 0, "rabenseifner", -1, counts, 5);
    if (!quick) add_hosts_run(runs, n, "1+4+2", 0, "rabenseifner", -1, counts, 5);
}

int main(void) {
    static const size_t base_counts[] = {0, 1, 3, 1000};
    static const size_t ring_counts[] = {0, 1, 3, 1000, MID};
    static const size_t rd_counts[] = {1, 3, 1000, MID};
    run_cfg_t runs[96];
    int nruns = 0, i, quick = getenv("DDP_TEST_QUICK") && atoi(getenv("DDP_TEST_QUICK"));
    double t0;
    char why[200] = "";
    t_init();
    if (sizeof(coll_shm_t) > T_USER_BYTES) t_bail("coll_shm_t too big");
    if (!ok(t_in_selftest(why, sizeof why) == 0, "inputs and references a block at a time give the element-wise definitions' bits"))
        t_bail("%s", why);
    /* TCP: everything. */
    for (i = 1; i <= 8; i++) {
        if (quick && i != 1 && i != 2 && i != 3 && i != 5) continue;
        add_run(runs, &nruns, "tcp", i, 0, NULL, (i == 2 || i == 3 || i == 5 || i == 8) ? BIG_ALL : BIG_SUBSET, 0, base_counts, 4);
    }
    for (i = 0; i < 3; i++) {
        static const int ps[3] = {2, 3, 8};
        if (quick && ps[i] == 8) continue;
        add_run(runs, &nruns, "tcp", ps[i], 4096, "ring", BIG_NONE, 0, ring_counts, 5);
    }
    add_run(runs, &nruns, "tcp", 4, 0, "rd", BIG_NONE, 1, rd_counts, 4);
    add_run(runs, &nruns, "tcp", quick ? 3 : 7, 0, "rd", BIG_NONE, 1, rd_counts, 4);
    /* Shared memory: its own collectives at every world size (the big count for every
     * dtype x op where TCP has it too), with tiny chunks, and as the ring's transport. */
    for (i = 2; i <= 8; i++) {
        if (quick && i != 2 && i != 3 && i != 5) continue;
        add_run(runs, &nruns, "shm", i, 0, NULL, (i == 2 || i == 3 || i == 5 || i == 8) ? BIG_ALL : BIG_SUBSET, 0, base_counts, 4);
    }
    for (i = 0; i < 3; i++) {
        static const int ps[3] = {2, 3, 8};
        if (quick && ps[i] == 8) continue;
        add_run(runs, &nruns, "shm-small", ps[i], 0, NULL, BIG_NONE, 0, ring_counts, 5);
        add_run(runs, &nruns, "shm-p2p", ps[i], 4096, "ring", BIG_NONE, 0, ring_counts, 5);
    }
    add_run(runs, &nruns, "shm-p2p", 5, 0, NULL, BIG_NONE, 1, rd_counts, 4);
    /* Two fake hosts: shm and TCP in one ring. */
    add_run(runs, &nruns, "mixed", 3, 4096, NULL, BIG_NONE, 0, ring_counts, 5);
    add_run(runs, &nruns, "mixed", 4, 0, NULL, BIG_SUBSET, 0, base_counts, 4);
    if (!quick) add_run(runs, &nruns, "mixed", 8, 0, NULL, BIG_NONE, 0, ring_counts, 5);
    add_hier_runs(runs, &nruns, quick);
    snprintf(trace_dir, sizeof trace_dir, "%s/ddp_test_collectives_XXXXXX", t_tmpdir());
    if (!mkdtemp(trace_dir)) trace_dir[0] = 0;
    t0 = t_now();
    for (i = 0; i < nruns; i++) {
        int nbad;
        char tag[96];
        run_tag(&runs[i], tag, sizeof tag);
        if (!t_selected(tag)) continue;
        S = (coll_shm_t *)t_shm_user(sizeof(coll_shm_t));
        S->ncases = build_cases(&runs[i]);
        nbad = t_run_ranks(runs[i].p, child, &runs[i], 300);
        report_run(&runs[i], nbad);
        if (runs[i].algo && trace_dir[0]) check_algorithm(&runs[i], tag);
    }
    if (trace_dir[0]) rmdir(trace_dir);
    diag("total %.1f s", t_now() - t0);
    return t_done();
}
