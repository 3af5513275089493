/* SPDX-License-Identifier: MIT (see LICENSE) */
/* tests/test_rooted_collectives.c — reduce, gather, scatter, all-to-all, send/recv and groups, on real
 * processes, against a sequential reference. Prints TAP.
 *
 *   build/test_rooted_collectives          (DDP_TEST_ONLY=substring runs the matching runs/scenarios)
 *
 * WHAT IS CHECKED, per case (one communicator per run; every case of the run goes through it):
 *   - reduce: the root's result bit for bit against a reference computed from every rank's
 *     input (inputs exact by construction, as in test_collectives.c: wrapping integers, float
 *     grids where every partial sum is exact, +-{0.5,1,2} for PROD, random non-NaN non-zero bit
 *     patterns for MAX/MIN); every dtype x op. Non-roots: recvbuf NULL or left untouched.
 *   - gather, scatter, all-to-all: exact copies of random bit patterns, block by block.
 *   - out of place: sendbuf unchanged; in place (NCCL's layouts: reduce send == recv, gather
 *     send == recv + rank*count*size, scatter recv == send + rank*count*size): the rest of the
 *     buffer unchanged; guard bytes around every buffer untouched; count 0 with NULL buffers.
 *   - roots 0 and p-1, in and out of place, counts {0, 1, 3, 1000}; 100003 for one op per
 *     dtype at p = 2, 3, 8 (the chain reduce and linear gather/scatter), also with 4 KiB
 *     segments (many segments through the chain's window; the small-message thresholds fall).
 * Transports: tcp (every world size 1..8), shm with its collective provider on (every world
 * size 2..8: the new calls go point-to-point over its queues), shm-p2p (DDP_SHM_COLL=0, tiny
 * queues: every message fragmented).
 * SCENARIOS: a group that shifts 4 MiB around the ring (deadlocks one call at a time); a group
 * of sends/recvs to every peer and to itself (all-to-all by hand, posted in a scrambled order);
 * a group mixing collectives (reduce, all_to_all, gather, and an all_reduce) with a ring shift;
 * plain send/recv outside groups, count 0 included; mismatches (reduce against gather, send
 * against recv of another count) give DDP_ERR_MISMATCH and no hang; bad arguments (and inside a
 * group) are rejected without poisoning the communicator. */
#define _GNU_SOURCE
#define DDP_IMPLEMENTATION
#include "ddp.h"
#include "transports/ddp_tcp.h"
#include "transports/ddp_shm.h"
#include "tests/ddp_test.h"
#include "tests/ddp_test_data.h"

enum { C_REDUCE, C_GATHER, C_SCATTER, C_A2A, C_NCOLL };
static const char *const coll_names[] = {"reduce", "gather", "scatter", "all_to_all"};

#define MID 100003
#define GUARD 64
#define MAXC 3000

typedef struct {
    unsigned char coll, dtype, op, inplace;
    int root;
    size_t count;
    uint64_t seed;
} tcase_t;

typedef struct {
    const char *mode;
    int p;
    size_t segment_bytes;
    int big;                    /* also 100003, one op per dtype */
} run_cfg_t;

typedef struct {
    int ncases;
    int progress[T_MAX_RANKS];
    int init_failed[T_MAX_RANKS];
    int msg_claimed[MAXC];
    unsigned char fail[MAXC];
    char msg[MAXC][200];
    char init_msg[T_MAX_RANKS][300];
    int rc[T_MAX_RANKS][16];
    char emsg[T_MAX_RANKS][400];
} shm_t;

static shm_t *S;
static tcase_t cases[MAXC];

/* ------------------------------------------------------------------------- inputs, reference */
/* Case c's inputs (tests/ddp_test_data.h): reduce gets t_exact_bits, the copies any bits. */
static void case_inputs(const tcase_t *c, t_in_t *g) {
    t_in_init(g, c->coll == C_REDUCE ? T_IN_EXACT : T_IN_BITS, c->dtype, c->op, c->seed);
}

static void fill(unsigned char *buf, const t_in_t *g, int rank, size_t lo, size_t n) { t_in_fill(g, rank, lo, n, buf); }

static inline uint64_t load_elem(const unsigned char *buf, size_t i, size_t es) {
    uint64_t v = 0;
    memcpy(&v, buf + i * es, es);
    return v;
}

/* Set by test_nccl_rooted.c: NCCL's average divides each input by p before summing floats, so its
 * bits can differ from the exact sum divided once: 1 when got is within the rounding of that
 * (p + 1 unit roundoffs of the sum of magnitudes / p, plus 2 of the result); sum and abssum are
 * the inputs' sum and sum of magnitudes (t_in_ref_sums). */
static int avg_divides_first;
static int avg_close(int dt, int p, double sum, double abssum, double g) {
    const double u = dt == DDP_FLOAT16 ? 1.0 / 2048 : dt == DDP_BFLOAT16 ? 1.0 / 256 :
                     dt == DDP_FLOAT32 ? 1.0 / 16777216.0 : 1.0 / 9007199254740992.0;
    const double ref = sum / p;
    return (g > ref ? g - ref : ref - g) <= (p + 1) * u * abssum / p + 2 * u * (ref < 0 ? -ref : ref);
}

static void case_fail(int k, const char *fmt, ...) T_PRINTF(2, 3);

/* The root's n reduce results against the sequential reference (t_ref_exact_one, a block at a
 * time: t_in_ref_exact). */
static void check_reduce(int k, const tcase_t *c, const t_in_t *g, int p, const unsigned char *out, size_t n) {
    const size_t es = g->es;
    const uint64_t mask = es == 8 ? ~0ull : ((1ull << (8 * es)) - 1);
    const int nccl_avg = avg_divides_first && c->op == DDP_AVG && !t_is_int(c->dtype);
    size_t i0, i, bad = 0, first = 0;
    uint64_t g0 = 0, e0 = 0;
    for (i0 = 0; i0 < n; i0 += T_IN_BLOCK) {
        const size_t m = n - i0 < T_IN_BLOCK ? n - i0 : T_IN_BLOCK;
        uint64_t ref[T_IN_BLOCK];
        unsigned char want[T_IN_BLOCK * 8];
        double sum[T_IN_BLOCK], abssum[T_IN_BLOCK];
        int sums = 0;
        t_in_ref_exact(g, p, i0, m, ref);
        t_in_narrow(es, ref, m, want);
        if (memcmp(out + i0 * es, want, m * es) == 0) continue;
        for (i = 0; i < m; i++) {
            uint64_t got = load_elem(out, i0 + i, es), exp = ref[i] & mask;
            if (got != exp && nccl_avg) {
                if (!sums) { t_in_ref_sums(g, p, i0, m, sum, abssum, NULL); sums = 1; }
                if (avg_close(c->dtype, p, sum[i], abssum[i], t_dec_float(c->dtype, got))) continue;
            }
            if (got != exp && !bad++) { first = i0 + i; g0 = got; e0 = exp; }
        }
    }
    if (bad) case_fail(k, "%zu of %zu elements wrong; first %zu: got 0x%llx, expected 0x%llx", bad, n,
                       first, (unsigned long long)g0, (unsigned long long)e0);
}

/* ------------------------------------------------------------------------- cases */
static int add_case(int n, int coll, int dt, int op, int root, size_t count, int inplace) {
    tcase_t *c;
    if (n >= MAXC) t_bail("too many cases");
    c = &cases[n];
    c->coll = (unsigned char)coll; c->dtype = (unsigned char)dt; c->op = (unsigned char)op;
    c->root = root; c->count = count; c->inplace = (unsigned char)inplace;
    c->seed = t_mix64(0xc0112ull + (uint64_t)n * 7919u);
    return n + 1;
}

static int build_cases(const run_cfg_t *cfg) {
    static const size_t counts[] = {0, 1, 3, 1000};
    const int p = cfg->p;
    int n = 0, coll, dt, op, ri, ci, ip;
    for (coll = 0; coll < C_NCOLL; coll++)
        for (dt = 0; dt < DDP_NUM_DTYPES; dt++)
            for (op = 0; op < (coll == C_REDUCE ? DDP_NUM_OPS : 1); op++) {
                for (ri = 0; ri < (coll == C_A2A || p == 1 ? 1 : 2); ri++)
                    for (ci = 0; ci < 4; ci++)
                        for (ip = 0; ip < (coll == C_A2A ? 1 : 2); ip++) {
                            /* With 4 KiB segments: the reduce ops once each, to save time. */
                            if (cfg->segment_bytes && coll == C_REDUCE && (dt + op + ri + ip) % 3) continue;
                            n = add_case(n, coll, dt, op, ri ? p - 1 : 0, counts[ci], ip);
                        }
                if (cfg->big && (coll != C_REDUCE || (dt + op) % DDP_NUM_OPS == 0))
                    n = add_case(n, coll, dt, op, (dt & 1) ? p - 1 : 0, coll == C_REDUCE ? MID : MID / (size_t)p + 1,
                                 coll != C_A2A && (dt & 2));
            }
    return n;
}

static void case_str(const tcase_t *c, char *out, size_t cap) {
    snprintf(out, cap, "%s %s%s%s count %zu root %d %s", coll_names[c->coll],
             ddp_dtype_name((ddp_dtype_t)c->dtype), c->coll == C_REDUCE ? " " : "",
             c->coll == C_REDUCE ? ddp_op_name((ddp_op_t)c->op) : "", c->count, c->root,
             c->inplace ? "in-place" : "out-of-place");
}

/* ------------------------------------------------------------------------- running a case */
static void case_fail(int k, const char *fmt, ...) {
    va_list ap;
    char m[180];
    S->fail[k] = 1;
    if (__atomic_exchange_n(&S->msg_claimed[k], 1, __ATOMIC_SEQ_CST)) return;
    va_start(ap, fmt);
    vsnprintf(m, sizeof m, fmt, ap);
    va_end(ap);
    snprintf(S->msg[k], sizeof S->msg[k], "rank %d: %s", t_rank, m);
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

/* out[oi..oi+n) == rank src's input elements si.. */
static void check_copy(int k, const t_in_t *g, const unsigned char *out, size_t oi, int src, size_t si, size_t n,
                       const char *what) {
    const size_t es = g->es, i = t_in_first_diff(g, src, si, out + oi * es, n);
    if (i < n) {
        unsigned char want[8];
        t_in_fill(g, src, si + i, 1, want);
        case_fail(k, "%s: element %zu is 0x%llx, expected 0x%llx (rank %d's element %zu)", what,
                  oi + i, (unsigned long long)load_elem(out, oi + i, es), (unsigned long long)load_elem(want, 0, es),
                  src, si + i);
    }
}

static int all_bytes(const unsigned char *b, size_t n, unsigned char v) {
    size_t i;
    for (i = 0; i < n; i++) if (b[i] != v) return 0;
    return 1;
}

typedef struct { unsigned char *sreg, *rreg; } bufs_t;

static ddp_result_t run_case(int k, const tcase_t *c, ddp_comm_t *comm, bufs_t *b, int rank, int p) {
    const ddp_dtype_t dt = (ddp_dtype_t)c->dtype;
    const size_t es = ddp_dtype_size(dt), n = c->count, blk = n * es;
    const int root = c->root, is_root = rank == root;
    unsigned char *send = b->sreg + GUARD, *recv = b->rreg + GUARD, *sp, *rp;
    size_t sbytes = 0, rbytes = 0;
    ddp_result_t r;
    t_in_t g;
    case_inputs(c, &g);
    switch (c->coll) {
    case C_REDUCE: sbytes = rbytes = blk; break;
    case C_GATHER: sbytes = blk; rbytes = (size_t)p * blk; break;
    case C_SCATTER: sbytes = (size_t)p * blk; rbytes = blk; break;
    default: sbytes = rbytes = (size_t)p * blk; break;
    }
    guard_set(b->sreg, sbytes);
    guard_set(b->rreg, rbytes);
    memset(recv, 0xcd, rbytes);
    memset(send, 0x3c, sbytes);
    sp = send;
    rp = recv;
    if (c->inplace) {
        /* One buffer (the receive region, sized for the larger side), NCCL's layouts. */
        switch (c->coll) {
        case C_REDUCE: fill(recv, &g, rank, 0, n); sp = rp = recv; break;
        case C_GATHER:
            if (is_root) { fill(recv + (size_t)rank * blk, &g, rank, 0, n); sp = recv + (size_t)rank * blk; }
            else { fill(send, &g, rank, 0, n); rp = (k & 2) ? NULL : recv; }
            break;
        default: /* scatter */
            if (is_root) { guard_set(b->rreg, sbytes); fill(recv, &g, rank, 0, (size_t)p * n); sp = recv; rp = recv + (size_t)rank * blk; }
            else sp = (k & 2) ? NULL : send;
            break;
        }
    } else {
        if (c->coll == C_SCATTER) { if (is_root) fill(send, &g, rank, 0, (size_t)p * n); else if (k & 2) sp = NULL; }
        else if (c->coll == C_A2A) fill(send, &g, rank, 0, (size_t)p * n);
        else fill(send, &g, rank, 0, n);
        if (!is_root && (c->coll == C_REDUCE || c->coll == C_GATHER) && (k & 2)) rp = NULL;
    }
    if (n == 0 && (k & 4)) sp = rp = NULL;
    t_where("case %d", k);
    switch (c->coll) {
    case C_REDUCE: r = ddp_reduce(sp, rp, n, dt, (ddp_op_t)c->op, root, comm); break;
    case C_GATHER: r = ddp_gather(sp, rp, n, dt, root, comm); break;
    case C_SCATTER: r = ddp_scatter(sp, rp, n, dt, root, comm); break;
    default: r = ddp_all_to_all(sp, rp, n, dt, comm); break;
    }
    if (r != DDP_SUCCESS) {
        case_fail(k, "returned %s: %s", ddp_strerror(r), ddp_comm_last_error(comm));
        return r;
    }
    if (n == 0) return DDP_SUCCESS;
    /* Results. */
    switch (c->coll) {
    case C_REDUCE:
        if (is_root) {
            check_reduce(k, c, &g, p, rp, n);
        } else if (c->inplace) {
            check_copy(k, &g, recv, 0, rank, 0, n, "non-root's in-place buffer changed");
        } else if (rp && !all_bytes(recv, rbytes, 0xcd)) {
            case_fail(k, "non-root's recvbuf written");
        }
        break;
    case C_GATHER:
        if (is_root) { int q; for (q = 0; q < p; q++) check_copy(k, &g, recv, (size_t)q * n, q, 0, n, "gathered"); }
        else if (rp && !all_bytes(recv, rbytes, 0xcd)) case_fail(k, "non-root's recvbuf written");
        break;
    case C_SCATTER:
        check_copy(k, &g, rp, 0, root, (size_t)rank * n, n, "scattered");
        if (is_root && c->inplace) check_copy(k, &g, recv, 0, rank, 0, (size_t)p * n, "root's in-place buffer");
        break;
    default: { int q; for (q = 0; q < p; q++) check_copy(k, &g, recv, (size_t)q * n, q, (size_t)rank * n, n, "all_to_all block"); }
    }
    /* Inputs unchanged, guards intact. */
    if (!c->inplace) {
        if (c->coll == C_SCATTER && !is_root) { if (sp && !all_bytes(send, sbytes, 0x3c)) case_fail(k, "non-root's sendbuf written"); }
        else check_copy(k, &g, send, 0, rank, 0, c->coll == C_SCATTER || c->coll == C_A2A ? (size_t)p * n : n, "sendbuf changed");
        if (!guard_ok(b->sreg, sbytes)) case_fail(k, "guard bytes around sendbuf overwritten");
    }
    if (!guard_ok(b->rreg, c->inplace && c->coll == C_SCATTER && is_root ? sbytes : rbytes))
        case_fail(k, "guard bytes around recvbuf overwritten");
    return DDP_SUCCESS;
}

/* ------------------------------------------------------------------------- transports */
static void mode_setup(const char *mode) {
    static const char *const vars[] = {"DDP_TRANSPORT", "DDP_HOST_ID", "DDP_SHM_COLL", "DDP_SHM_CHUNK",
                                       "DDP_SHM_SMALL_MAX", "DDP_SHM_CELLS", "DDP_SHM_CELL_BYTES", "DDP_ALGO",
                                       "DDP_SEGMENT_BYTES", "DDP_RD_MAX_BYTES"};
    size_t i;
    for (i = 0; i < sizeof vars / sizeof vars[0]; i++) unsetenv(vars[i]);
    if (!strcmp(mode, "tcp")) setenv("DDP_TRANSPORT", "tcp", 1);
    if (!strcmp(mode, "shm-p2p")) {
        setenv("DDP_SHM_COLL", "0", 1);
        setenv("DDP_SHM_CELLS", "2", 1);
        setenv("DDP_SHM_CELL_BYTES", "256", 1);
    }
}

static ddp_comm_t *init_comm(const char *mode, int rank, int p, size_t seg, int timeout_ms, int quiet) {
    ddp_comm_desc_t d;
    ddp_comm_t *comm = NULL;
    ddp_result_t r;
    int k;
    mode_setup(mode);
    t_desc(&d, timeout_ms);
    d.segment_bytes = seg;
    d.log_level = quiet ? 1 : 0;
    t_where("ddp_comm_init");
    r = ddp_comm_init(&comm, p, rank, &d);
    if (r != DDP_SUCCESS) {
        S->init_failed[rank] = 1;
        snprintf(S->init_msg[rank], sizeof S->init_msg[rank], "%s: %.250s", ddp_strerror(r), ddp_last_init_error());
        return NULL;
    }
    for (k = 0; k < p; k++) {
        const char *want = !strcmp(mode, "tcp") ? "tcp" : "shm", *got = ddp_comm_transport_name(comm, k);
        if (k == rank || !strcmp(want, got)) continue;
        S->init_failed[rank] = 1;
        snprintf(S->init_msg[rank], sizeof S->init_msg[rank], "peer %d uses '%s', expected '%s'", k, got, want);
        ddp_comm_destroy(comm);
        return NULL;
    }
    return comm;
}

static int child(int rank, int p, void *arg) {
    const run_cfg_t *cfg = (const run_cfg_t *)arg;
    ddp_comm_t *comm = init_comm(cfg->mode, rank, p, cfg->segment_bytes, 60000, 0);
    size_t cap = 64;
    bufs_t b;
    int k, status = 0;
    if (!comm) return 2;
    for (k = 0; k < S->ncases; k++) {
        size_t m = cases[k].count * ddp_dtype_size((ddp_dtype_t)cases[k].dtype) * (cases[k].coll == C_REDUCE ? 1 : (size_t)p);
        if (m > cap) cap = m;
    }
    b.sreg = (unsigned char *)malloc(cap + 2 * GUARD);
    b.rreg = (unsigned char *)malloc(cap + 2 * GUARD);
    if (!b.sreg || !b.rreg) { ddp_comm_destroy(comm); return 3; }
    for (k = 0; k < S->ncases; k++) {
        if (run_case(k, &cases[k], comm, &b, rank, p) != DDP_SUCCESS) { status = 4; break; }
        S->progress[rank] = k + 1;
    }
    t_where("ddp_comm_destroy");
    if (ddp_comm_destroy(comm) != DDP_SUCCESS) status = 5;
    free(b.sreg);
    free(b.rreg);
    return status;
}

static void report_run(const run_cfg_t *cfg, int nbad) {
    const int p = cfg->p;
    int k = 0, r;
    char tag[64];
    snprintf(tag, sizeof tag, "%s p=%d%s", cfg->mode, p, cfg->segment_bytes ? " seg=4096" : "");
    for (r = 0; r < p; r++) if (S->init_failed[r]) diag("%s rank %d init: %s", tag, r, S->init_msg[r]);
    ok(nbad == 0, "%s: every rank ran all %d cases and exited cleanly (%.1f s)", tag, S->ncases, t_last_run.seconds);
    while (k < S->ncases) {
        int g0 = k, bad = 0, shown = 0;
        char what[160];
        while (k < S->ncases && cases[k].coll == cases[g0].coll && cases[k].dtype == cases[g0].dtype) k++;
        for (r = g0; r < k; r++) {
            int q, ran = 1;
            for (q = 0; q < p; q++) if (S->progress[q] <= r) ran = 0;
            if (!S->fail[r] && ran) continue;
            bad++;
            if (shown++ < 3) {
                case_str(&cases[r], what, sizeof what);
                diag("  %s: %s", what, S->fail[r] ? S->msg[r] : "not run by every rank");
            }
        }
        ok(!bad, "%s %s %s: %s, roots 0 and %d, in/out of place (%d cases)", tag, coll_names[cases[g0].coll],
           ddp_dtype_name((ddp_dtype_t)cases[g0].dtype), cases[g0].coll == C_REDUCE ? "every op" : "copies",
           p - 1, k - g0);
    }
}

/* ------------------------------------------------------------------------- scenarios */
typedef struct { const char *mode; int p; int which; } scen_t;
enum { SC_SHIFT, SC_A2A_BY_HAND, SC_MIXED, SC_FUSED, SC_PLAIN, SC_MISMATCH_COLL, SC_MISMATCH_P2P, SC_ARGS };

static uint32_t word(int from, int to, size_t i) { return (uint32_t)t_mix64(((uint64_t)from << 40) ^ ((uint64_t)to << 20) ^ i); }

static int check_words(const uint32_t *buf, size_t n, int from, int to, const char *what) {
    size_t i;
    for (i = 0; i < n; i++)
        if (buf[i] != word(from, to, i))
            return ok(0, "%s: word %zu from rank %d is 0x%08x, expected 0x%08x", what, i, from, buf[i], word(from, to, i));
    return 1;
}

static int scenario(int rank, int p, void *arg) {
    const scen_t *sc = (const scen_t *)arg;
    const int next = (rank + 1) % p, prev = (rank + p - 1) % p;
    int quiet = sc->which == SC_MISMATCH_COLL || sc->which == SC_MISMATCH_P2P || sc->which == SC_ARGS;
    ddp_comm_t *comm = init_comm(sc->mode, rank, p, 0, quiet ? 10000 : 60000, quiet);
    ddp_result_t r, r2;
    int status = 0, q;
    if (!comm) return 2;
    t_where("scenario %d", sc->which);
    switch (sc->which) {
    case SC_SHIFT: {   /* 4 MiB to rank+1, from rank-1: one by one, every rank would wait in send */
        const size_t n = (size_t)1 << 20;
        uint32_t *out = (uint32_t *)malloc(n * 4), *in = (uint32_t *)malloc(n * 4);
        size_t i;
        for (i = 0; i < n; i++) out[i] = word(rank, next, i);
        memset(in, 0, n * 4);
        r = ddp_group_start(comm);
        if (r == DDP_SUCCESS) r = ddp_send(out, n, DDP_UINT32, next, comm);
        if (r == DDP_SUCCESS) r = ddp_recv(in, n, DDP_UINT32, prev, comm);
        r2 = ddp_group_end(comm);
        if (!ok(r == DDP_SUCCESS && r2 == DDP_SUCCESS, "ring shift of 4 MiB in a group: %s / %s %s",
                ddp_strerror(r), ddp_strerror(r2), ddp_comm_last_error(comm))) status = 1;
        else if (!check_words(in, n, prev, rank, "ring shift")) status = 1;
        free(out); free(in);
        break;
    }
    case SC_A2A_BY_HAND: {   /* every peer and itself; receives first, sends in the opposite order */
        const size_t n = 30000;
        uint32_t *out = (uint32_t *)malloc(n * 4 * (size_t)p), *in = (uint32_t *)malloc(n * 4 * (size_t)p);
        size_t i;
        for (q = 0; q < p; q++) for (i = 0; i < n; i++) out[(size_t)q * n + i] = word(rank, q, i);
        memset(in, 0, n * 4 * (size_t)p);
        r = ddp_group_start(comm);
        for (q = 0; q < p && r == DDP_SUCCESS; q++) r = ddp_recv(in + (size_t)((rank + q) % p) * n, n, DDP_UINT32, (rank + q) % p, comm);
        for (q = p; q > 0 && r == DDP_SUCCESS; q--) r = ddp_send(out + (size_t)((rank + q) % p) * n, n, DDP_UINT32, (rank + q) % p, comm);
        r2 = ddp_group_end(comm);
        if (!ok(r == DDP_SUCCESS && r2 == DDP_SUCCESS, "group of sends/recvs to every peer and itself: %s / %s %s",
                ddp_strerror(r), ddp_strerror(r2), ddp_comm_last_error(comm))) status = 1;
        else for (q = 0; q < p; q++) if (!check_words(in + (size_t)q * n, n, q, rank, "all-to-all by hand")) status = 1;
        free(out); free(in);
        break;
    }
    case SC_MIXED: {   /* collectives and a ring shift in one group */
        const size_t n = 200000;
        int64_t *red = (int64_t *)calloc(n, 8), *own = (int64_t *)malloc(n * 8);
        uint32_t *a2s = (uint32_t *)malloc((size_t)p * 16), *a2r = (uint32_t *)calloc((size_t)p, 16);
        uint32_t *out = (uint32_t *)malloc(n * 4), *in = (uint32_t *)calloc(n, 4);
        int32_t *gat = (int32_t *)calloc((size_t)p, 4), mine = 100 + rank;
        double ar = rank + 1.0;
        size_t i;
        for (i = 0; i < n; i++) { own[i] = (int64_t)(i * (size_t)(rank + 1)); out[i] = word(rank, next, i); }
        for (q = 0; q < 4 * p; q++) a2s[q] = word(rank, q / 4, (size_t)q);
        r = ddp_group_start(comm);
        if (r == DDP_SUCCESS) r = ddp_send(out, n, DDP_UINT32, next, comm);
        if (r == DDP_SUCCESS) r = ddp_reduce(own, red, n, DDP_INT64, DDP_SUM, p - 1, comm);
        if (r == DDP_SUCCESS) r = ddp_all_to_all(a2s, a2r, 4, DDP_UINT32, comm);
        if (r == DDP_SUCCESS) r = ddp_group_start(comm);   /* nested */
        if (r == DDP_SUCCESS) r = ddp_recv(in, n, DDP_UINT32, prev, comm);
        if (r == DDP_SUCCESS) r = ddp_gather(&mine, gat, 1, DDP_INT32, 0, comm);
        if (r == DDP_SUCCESS) r = ddp_group_end(comm);
        /* ddp.h's older collectives run at once even inside a group */
        if (r == DDP_SUCCESS) r = ddp_all_reduce(&ar, &ar, 1, DDP_FLOAT64, DDP_SUM, comm);
        r2 = ddp_group_end(comm);
        if (!ok(r == DDP_SUCCESS && r2 == DDP_SUCCESS, "group of send, reduce, all_to_all, nested group (recv, gather), "
                "all_reduce: %s / %s %s", ddp_strerror(r), ddp_strerror(r2), ddp_comm_last_error(comm))) { status = 1; }
        else {
            int good = check_words(in, n, prev, rank, "mixed group's shift");
            if (rank == p - 1)
                for (i = 0; i < n && good; i++)
                    if (red[i] != (int64_t)(i * (size_t)(p * (p + 1) / 2))) good = ok(0, "reduce in group: element %zu", i);
            for (q = 0; q < 4 * p && good; q++)
                if (a2r[q] != word(q / 4, rank, (size_t)(4 * rank + q % 4))) good = ok(0, "all_to_all in group: word %d", q);
            if (rank == 0) for (q = 0; q < p && good; q++) if (gat[q] != 100 + q) good = ok(0, "gather in group: block %d", q);
            if (ar != p * (p + 1) / 2.0) good = ok(0, "all_reduce in group: %g", ar);
            if (!ok(good, "results of the mixed group")) status = 1;
        }
        free(red); free(own); free(a2s); free(a2r); free(out); free(in); free(gat);
        break;
    }
    case SC_FUSED: {   /* a group's small all-reduces are fused (ddp_comm.h, group_end); results as one by one */
        const size_t nbig = 20000;                     /* 80 KB: above the fusion limit, alone */
        int32_t a1 = rank + 1, a1out = -1, a3[1000], *big = (int32_t *)malloc(nbig * 4);
        float f4[7], f4out[7], f5[5], f6[3];
        int64_t chain[4];
        unsigned seq0 = comm->eng.seq;
        const int tri = p * (p + 1) / 2;
        int good = 1;
        size_t i;
        for (i = 0; i < 1000; i++) a3[i] = (int32_t)(i + (size_t)rank);
        for (i = 0; i < 7; i++) f4[i] = (float)(rank + (int)i);
        for (i = 0; i < 5; i++) f5[i] = (float)(2 * rank);
        for (i = 0; i < 3; i++) f6[i] = (float)(rank * 10 + (int)i);
        for (i = 0; i < nbig; i++) big[i] = 1;
        for (i = 0; i < 4; i++) chain[i] = rank + 1;
        r = ddp_group_start(comm);
        if (r == DDP_SUCCESS) r = ddp_all_reduce(&a1, &a1out, 1, DDP_INT32, DDP_SUM, comm);   /* fused: */
        if (r == DDP_SUCCESS) r = ddp_all_reduce(&a1, &a1out, 0, DDP_INT32, DDP_SUM, comm);   /* count 0 */
        if (r == DDP_SUCCESS) r = ddp_all_reduce(a3, a3, 1000, DDP_INT32, DDP_SUM, comm);
        if (r == DDP_SUCCESS) r = ddp_all_reduce(f4, f4out, 7, DDP_FLOAT32, DDP_AVG, comm);   /* fused: */
        if (r == DDP_SUCCESS) r = ddp_all_reduce(f5, f5, 5, DDP_FLOAT32, DDP_AVG, comm);
        if (r == DDP_SUCCESS) r = ddp_all_reduce(f6, f6, 3, DDP_FLOAT32, DDP_MAX, comm);      /* other op */
        if (r == DDP_SUCCESS) r = ddp_all_reduce(big, big, nbig, DDP_INT32, DDP_SUM, comm);   /* too big */
        if (r == DDP_SUCCESS) r = ddp_all_reduce(chain, chain, 4, DDP_INT64, DDP_SUM, comm);
        if (r == DDP_SUCCESS) r = ddp_all_reduce(chain, chain, 4, DDP_INT64, DDP_SUM, comm);  /* overlaps */
        r2 = ddp_group_end(comm);
        if (!ok(r == DDP_SUCCESS && r2 == DDP_SUCCESS, "group of 9 all_reduces: %s / %s %s", ddp_strerror(r),
                ddp_strerror(r2), ddp_comm_last_error(comm))) { status = 1; free(big); break; }
        if (a1out != tri) good = ok(0, "fused int32 sum: %d, expected %d", a1out, tri);
        for (i = 0; i < 1000 && good; i++)
            if (a3[i] != (int32_t)((size_t)p * i + (size_t)(tri - p))) good = ok(0, "fused in-place a3[%zu] = %d", i, a3[i]);
        for (i = 0; i < 7 && good; i++)
            if (f4out[i] != (float)(tri - p) / (float)p + (float)i) good = ok(0, "fused avg f4[%zu] = %g", i, f4out[i]);
        for (i = 0; i < 5 && good; i++)
            if (f5[i] != (float)(p - 1)) good = ok(0, "fused avg f5[%zu] = %g", i, f5[i]);
        for (i = 0; i < 3 && good; i++)
            if (f6[i] != (float)((p - 1) * 10 + (int)i)) good = ok(0, "max f6[%zu] = %g", i, f6[i]);
        for (i = 0; i < nbig && good; i++) if (big[i] != p) good = ok(0, "big[%zu] = %d", i, big[i]);
        for (i = 0; i < 4 && good; i++)   /* one by one: the second sums the first's results */
            if (chain[i] != (int64_t)p * tri) good = ok(0, "chained in-place sums: %lld, expected %lld",
                                                       (long long)chain[i], (long long)p * tri);
        /* 9 calls, 6 reductions: (a1, empty, a3) (f4, f5) f6 big chain chain */
        if (good && comm->eng.seq - seq0 != 6)
            good = ok(0, "the group used %u sequence numbers, expected 6 (fusion)", comm->eng.seq - seq0);
        if (!ok(good, "results of the fused group (3 + 2 fused, other op, too big, overlapping buffers apart)"))
            status = 1;
        free(big);
        break;
    }
    case SC_PLAIN: {   /* outside groups: rank 0 sends to each, each answers */
        uint32_t buf[1000], back[1000];
        size_t i;
        int good = 1;
        for (q = 1; q < p && good; q++) {
            if (rank == 0) {
                for (i = 0; i < 1000; i++) buf[i] = word(0, q, i);
                good = ddp_send(buf, 1000, DDP_UINT32, q, comm) == DDP_SUCCESS &&
                       ddp_send(NULL, 0, DDP_UINT32, q, comm) == DDP_SUCCESS &&
                       ddp_recv(back, 1000, DDP_UINT32, q, comm) == DDP_SUCCESS &&
                       check_words(back, 1000, q, 0, "answer");
            } else if (rank == q) {
                good = ddp_recv(buf, 1000, DDP_UINT32, 0, comm) == DDP_SUCCESS && check_words(buf, 1000, 0, q, "send") &&
                       ddp_recv(NULL, 0, DDP_UINT32, 0, comm) == DDP_SUCCESS;
                for (i = 0; i < 1000; i++) back[i] = word(q, 0, i);
                good = good && ddp_send(back, 1000, DDP_UINT32, 0, comm) == DDP_SUCCESS;
            }
        }
        if (!ok(good, "plain send/recv (count 0 too) between rank 0 and every rank: %s", ddp_comm_last_error(comm))) status = 1;
        r = ddp_barrier(comm);
        if (!ok(r == DDP_SUCCESS, "a barrier after them: %s", ddp_strerror(r))) status = 1;
        break;
    }
    case SC_MISMATCH_COLL: {   /* rank 0 reduces, the others gather, to root 0 */
        int32_t v[64], out[64 * 8];
        double t0 = t_now();
        memset(v, 0, sizeof v);
        r = rank == 0 ? ddp_reduce(v, out, 64, DDP_INT32, DDP_SUM, 0, comm) : ddp_gather(v, out, 64, DDP_INT32, 0, comm);
        r2 = ddp_barrier(comm);
        S->rc[rank][0] = (int)r;
        S->rc[rank][1] = (int)r2;
        snprintf(S->emsg[rank], sizeof S->emsg[rank], "%.390s", ddp_comm_last_error(comm));
        if (rank == 0) ok(r == DDP_ERR_MISMATCH, "reduce against gather: rank 0 gets %s (%.2f s): %s", ddp_strerror(r),
                          t_now() - t0, ddp_comm_last_error(comm));
        else ok(r2 != DDP_SUCCESS && (r == DDP_SUCCESS || r == DDP_ERR_MISMATCH || r == DDP_ERR_REMOTE),
                "gather against reduce: %s, then the next call %s (no hang, %.2f s)", ddp_strerror(r), ddp_strerror(r2), t_now() - t0);
        break;
    }
    case SC_MISMATCH_P2P: {   /* rank 1 expects 100 elements, rank 0 sends 99 */
        uint32_t buf[100];
        memset(buf, 0, sizeof buf);
        if (rank == 0) {
            r = ddp_send(buf, 99, DDP_UINT32, 1, comm);
            r2 = ddp_barrier(comm);
            ok(r2 != DDP_SUCCESS, "send of 99 against recv of 100: sender %s, then %s", ddp_strerror(r), ddp_strerror(r2));
        } else if (rank == 1) {
            r = ddp_recv(buf, 100, DDP_UINT32, 0, comm);
            ok(r == DDP_ERR_MISMATCH && t_mentions_rank(ddp_comm_last_error(comm), 0),
               "recv of 100 against send of 99: %s: %s", ddp_strerror(r), ddp_comm_last_error(comm));
            ddp_barrier(comm);
        } else {
            ddp_barrier(comm);
        }
        break;
    }
    case SC_ARGS: {   /* every rank makes the same bad calls: rejected, and the comm still works */
        int32_t a[8] = {0}, bb[64] = {0};
        int good = 1;
        good &= ok(ddp_reduce(a, bb, 8, DDP_INT32, DDP_SUM, p, comm) == DDP_ERR_INVALID_ARGUMENT, "reduce: root p rejected");
        good &= ok(ddp_reduce(a, bb, 8, DDP_INT32, (ddp_op_t)9, 0, comm) == DDP_ERR_INVALID_ARGUMENT, "reduce: op 9 rejected");
        good &= ok(ddp_reduce(NULL, bb, 8, DDP_INT32, DDP_SUM, 0, comm) == DDP_ERR_INVALID_ARGUMENT, "reduce: NULL sendbuf rejected");
        good &= ok(ddp_reduce(a, NULL, 8, DDP_INT32, DDP_SUM, rank, comm) == DDP_ERR_INVALID_ARGUMENT, "reduce: NULL recvbuf at the root rejected");
        good &= ok(ddp_gather(a, bb, 8, (ddp_dtype_t)77, 0, comm) == DDP_ERR_INVALID_ARGUMENT, "gather: dtype 77 rejected");
        good &= ok(ddp_gather(a, bb, SIZE_MAX / 4, DDP_INT32, 0, comm) == DDP_ERR_INVALID_ARGUMENT, "gather: count x p x size overflow rejected");
        good &= ok(ddp_scatter(NULL, bb, 1, DDP_INT32, rank, comm) == DDP_ERR_INVALID_ARGUMENT, "scatter: NULL sendbuf at the root rejected");
        good &= ok(ddp_scatter(a, bb, 1, DDP_INT32, -1, comm) == DDP_ERR_INVALID_ARGUMENT, "scatter: root -1 rejected");
        good &= ok(ddp_all_to_all(bb, bb, 1, DDP_INT32, comm) == DDP_ERR_INVALID_ARGUMENT &&
                   strstr(ddp_comm_last_error(comm), "in place") != NULL, "all_to_all in place rejected: %s", ddp_comm_last_error(comm));
        good &= ok(ddp_all_to_all(bb, bb, 0, DDP_INT32, comm) == DDP_SUCCESS, "all_to_all in place with count 0 is fine");
        good &= ok(ddp_send(a, 8, DDP_INT32, p, comm) == DDP_ERR_INVALID_ARGUMENT, "send: peer p rejected");
        good &= ok(ddp_recv(NULL, 8, DDP_INT32, 0, comm) == DDP_ERR_INVALID_ARGUMENT, "recv: NULL buffer rejected");
        good &= ok(ddp_send(a, 8, DDP_INT32, rank, comm) == DDP_ERR_INVALID_USAGE, "send to itself outside a group: %s", ddp_comm_last_error(comm));
        good &= ok(ddp_group_end(comm) == DDP_ERR_INVALID_USAGE, "group_end without group_start rejected");
        /* A bad call inside a group: returned at once and by group_end, which runs nothing. */
        r = ddp_group_start(comm);
        r2 = ddp_send(a, 8, DDP_INT32, next, comm);
        good &= ok(r == DDP_SUCCESS && r2 == DDP_SUCCESS, "a send inside a group is queued: %s", ddp_strerror(r2));
        good &= ok(ddp_gather(a, bb, 8, DDP_INT32, p + 3, comm) == DDP_ERR_INVALID_ARGUMENT, "bad root inside a group rejected at once");
        good &= ok(ddp_recv(bb, 8, DDP_INT32, prev, comm) == DDP_SUCCESS, "a later call still queues");
        good &= ok(ddp_group_end(comm) == DDP_ERR_INVALID_ARGUMENT, "group_end returns the bad call's error");
        /* Self send/recv inside a group: a copy. */
        a[3] = 1234 + rank;
        r = ddp_group_start(comm);
        if (r == DDP_SUCCESS) r = ddp_recv(bb, 8, DDP_INT32, rank, comm);
        if (r == DDP_SUCCESS) r = ddp_send(a, 8, DDP_INT32, rank, comm);
        r2 = ddp_group_end(comm);
        good &= ok(r == DDP_SUCCESS && r2 == DDP_SUCCESS && bb[3] == 1234 + rank, "send to itself inside a group: %s %s",
                   ddp_strerror(r2), ddp_comm_last_error(comm));
        r = ddp_barrier(comm);
        good &= ok(r == DDP_SUCCESS, "the communicator still works after the rejected calls: %s %s", ddp_strerror(r), ddp_comm_last_error(comm));
        if (!good) status = 1;
        break;
    }
    }
    t_where("ddp_comm_destroy");
    ddp_comm_destroy(comm);
    return status;
}

static void run_scenario(const char *mode, int p, int which, const char *name) {
    scen_t sc;
    char full[160];
    int nbad;
    snprintf(full, sizeof full, "%s %s p=%d", name, mode, p);
    if (!t_selected(full)) return;
    sc.mode = mode; sc.p = p; sc.which = which;
    S = (shm_t *)t_shm_user(sizeof(shm_t));
    nbad = t_run_ranks(p, scenario, &sc, 60);
    ok(nbad == 0 || which == SC_MISMATCH_COLL || which == SC_MISMATCH_P2P, "%s: ranks exited cleanly (%.1f s)", full,
       t_last_run.seconds);
    if (which == SC_MISMATCH_COLL || which == SC_MISMATCH_P2P) {
        int r;
        for (r = 0; r < p; r++) if (t_last_run.killed_by_watchdog[r]) break;
        ok(r == p, "%s: no rank hung", full);
    }
}

int main(void) {
    static const char *const modes[] = {"tcp", "shm", "shm-p2p"};
    run_cfg_t runs[40];
    int nruns = 0, i, m;
    double t0;
    char why[200] = "";
    t_init();
    if (sizeof(shm_t) > T_USER_BYTES) t_bail("shm_t too big");
    if (!ok(t_in_selftest(why, sizeof why) == 0, "inputs and references a block at a time give the element-wise definitions' bits"))
        t_bail("%s", why);
    for (i = 1; i <= 8; i++) {
        run_cfg_t *c = &runs[nruns++];
        memset(c, 0, sizeof *c);
        c->mode = "tcp"; c->p = i; c->big = i == 2 || i == 3 || i == 8;
    }
    for (i = 2; i <= 8; i++) {
        run_cfg_t *c = &runs[nruns++];
        memset(c, 0, sizeof *c);
        c->mode = "shm"; c->p = i; c->big = i == 3;
    }
    {
        static const struct { const char *mode; int p; size_t seg; int big; } extra[] = {
            {"shm-p2p", 3, 0, 0}, {"shm-p2p", 4, 4096, 1}, {"tcp", 3, 4096, 1}, {"tcp", 5, 4096, 0}};
        for (i = 0; i < 4; i++) {
            run_cfg_t *c = &runs[nruns++];
            memset(c, 0, sizeof *c);
            c->mode = extra[i].mode; c->p = extra[i].p; c->segment_bytes = extra[i].seg; c->big = extra[i].big;
        }
    }
    t0 = t_now();
    for (i = 0; i < nruns; i++) {
        char name[64];
        int nbad;
        snprintf(name, sizeof name, "matrix %s p=%d%s", runs[i].mode, runs[i].p, runs[i].segment_bytes ? " seg" : "");
        if (!t_selected(name)) continue;
        S = (shm_t *)t_shm_user(sizeof(shm_t));
        S->ncases = build_cases(&runs[i]);
        nbad = t_run_ranks(runs[i].p, child, &runs[i], 120);
        report_run(&runs[i], nbad);
    }
    for (m = 0; m < 3; m++) {
        run_scenario(modes[m], 4, SC_SHIFT, "group ring shift 4 MiB");
        run_scenario(modes[m], m == 1 ? 3 : 5, SC_A2A_BY_HAND, "group all-to-all by send/recv");
        run_scenario(modes[m], m == 2 ? 3 : 4, SC_MIXED, "group with collectives");
        run_scenario(modes[m], m == 1 ? 2 : 3, SC_FUSED, "group of small all-reduces fused");
        run_scenario(modes[m], 3, SC_PLAIN, "plain send/recv");
    }
    run_scenario("tcp", 2, SC_SHIFT, "group ring shift 4 MiB");
    for (m = 0; m < 2; m++) {
        run_scenario(modes[m], 2, SC_MISMATCH_COLL, "mismatch reduce/gather");
        run_scenario(modes[m], 3, SC_MISMATCH_COLL, "mismatch reduce/gather");
        run_scenario(modes[m], 2, SC_MISMATCH_P2P, "mismatch send/recv counts");
        run_scenario(modes[m], 3, SC_ARGS, "bad arguments");
    }
    diag("total %.1f s", t_now() - t0);
    return t_done();
}
