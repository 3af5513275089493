/* SPDX-License-Identifier: MIT (see LICENSE) */
/* tests/test_deterministic.c — the deterministic reduction mode (DDP_DETERMINISTIC=1, or
 * ddp_comm_desc_t.deterministic = 1): all-reduce, reduce-scatter and reduce give, bit for bit,
 * the left-to-right fold in rank order, whatever the algorithm, transport, hosts layout, size,
 * segment size and bucket layout. Prints TAP.
 *
 *   build/test_deterministic     (DDP_TEST_QUICK=1: fewer world sizes and runs, no 16 MiB case,
 *                                 for the sanitizer build; DDP_TEST_FULL=1: the larger sweep,
 *                                 every algorithm at every p = 2..6 (3..6 without hosts), 1 MiB
 *                                 + odd everywhere, 16 MiB + odd in every run of the library's
 *                                 choice; DDP_TEST_ONLY=substring: the runs whose name has it;
 *                                 DDP_TEST_DET_OFF=1: the same checks with the mode forced off,
 *                                 which must fail: how to see that the checks see the order;
 *                                 built with -DT_NO_DET_FIELD it compiles against a libddp
 *                                 without desc.deterministic, to show it failing there)
 *
 * THE RESULT (the mode's definition): for every element i, with x_q rank q's input,
 *     acc = x_0;  for q = 1 .. p-1: ddp_reduce_local(acc, acc, x_q, 1, dtype, op)   (AVG: SUM)
 *     op == DDP_AVG: ddp_divide_local(acc, 1, dtype, p)
 * Every rank regenerates every rank's input from the case's seed, folds it so (a block at a time:
 * the kernels are element-wise, and a self-check compares that with the one-element fold), and
 * compares its output with memcmp, naming the first element that differs. Inputs make the order
 * show: floats x * 2^k with k in -20..20 (fp16: -6..6, to stay in range), every mantissa bit
 * random, random signs; a check with the mode off shows that today's ring at p = 3 on these data
 * differs from rank order (so a pass with the mode on is not a property of the data).
 *
 * WHAT RUNS (make test: well under a minute on 2 cores, see the diagnostic "total"):
 *   - tcp p = 1..6, shm p = 2..6, threads (one process, ddp_comm_init_threads) p = 2..6, two
 *     fake hosts (DDP_HOST_ID: shm inside a host, tcp across) p = 2..6, the library's choice:
 *     all-reduce in and out of place, float32/float64/float16/bfloat16 x SUM/AVG, counts
 *     {0, 1, 2, 3, p-1, p, p+1, 1023, 4099, 65537}; MAX and MIN once, int32 SUM once; the async
 *     form once per dtype; reduce-scatter (recvcounts 0, 1, 3, p+1, 1023, 4099) and reduce to
 *     root 0 and to the last rank, in and out of place.
 *   - DDP_ALGO = ring, rd, rabenseifner on tcp p = 3, 4, 5, 6 and hier, hier_ring, hier_rd,
 *     hier_rabenseifner, auto on fake hosts 2+1, 2+2, 3+2 (and 3+3 for some): all-reduce of
 *     every float dtype x SUM/AVG, counts {1, 3, p+1, 1023, 4099, 65537}; also hier_ring on
 *     thread ranks in two labelled hosts (DDP_TEST_HOSTS), ring and rabenseifner over shm as a
 *     point-to-point transport (DDP_SHM_COLL=0).
 *   - DDP_SEGMENT_BYTES = 4096: ring p = 3, 5 (tcp), hier_ring 3+2; shm with 4 KiB chunks.
 *   - 1 MiB + odd (float32 (1<<18)+3 and float64 (1<<17)+3 elements) on tcp, shm, threads and
 *     fake hosts; 16 MiB + odd (float32 (1<<22)+1) on tcp ring p = 3, fake hosts hier 2+1, shm p = 4.
 *   - the desc field (and env unset) instead of the env var, at p = 3 and 5; a split of a
 *     deterministic communicator (3 ranks of 4) inherits the mode.
 *   - the reducer, p = 3, 4, 5 (tcp) and 3, 5 (shm), 4 (fake hosts): the same float32 gradients
 *     (9 parameters, 108,384 elements) through copy mode with bucket caps 1 KiB, 64 KiB and
 *     25 MiB, flat mode with the same caps, and ZeRO-1 (each rank's shards against the reference
 *     average), two iterations each: every gradient equals the reference average bit for bit.
 */
#define _GNU_SOURCE
#include "ddp.h"
#include "transports/ddp_tcp.h"
#include "transports/ddp_shm.h"
#include "transports/ddp_threads.h"
#include "tests/ddp_test.h"

#include <pthread.h>

/* Built against a libddp without the desc field (to show the test failing on it): the runs
 * that would set it use the environment variable instead. */
#ifdef T_NO_DET_FIELD
#define T_SET_DESC_DET(d, v) ((void)(d), (void)(v))
#else
#define T_SET_DESC_DET(d, v) ((d)->deterministic = (v))
#endif

enum { C_AR, C_AR_ASYNC, C_RS, C_RED };
static const char *const coll_names[] = {"all_reduce", "all_reduce_async", "reduce_scatter", "reduce"};
enum { DET_ENV, DET_DESC, DET_OFF };          /* how the mode is asked for */
enum { SET_FULL, SET_ALGO };                  /* which case list a run gets */

#define MAXC 640
#define MAXP 6
#define BLOCK 4096
#define MIB1_F32 (((size_t)1 << 18) + 3)
#define MIB1_F64 (((size_t)1 << 17) + 3)
#define MIB16_F32 (((size_t)1 << 22) + 1)

typedef struct {
    unsigned char coll, dtype, op, inplace;
    int root;
    size_t count;        /* AR/RED: elements; RS: recvcount */
    uint64_t seed;
} dcase_t;

typedef struct {
    const char *mode;    /* tcp, shm, shm-small, threads, hosts */
    const char *layout;  /* hosts: ranks per fake host, "2+1" */
    int p;
    const char *algo;    /* DDP_ALGO (NULL: unset) */
    size_t seg;          /* DDP_SEGMENT_BYTES (0: unset) */
    int det;             /* DET_* */
    int set;             /* SET_* */
    int big;             /* 1: 1 MiB + odd; 2: also 16 MiB + odd */
} run_t;

typedef struct {
    int ncases;
    int init_failed[MAXP];
    char init_msg[MAXP][300];
    int done[MAXP];                   /* cases completed */
    int msg_claimed[MAXC];
    unsigned char fail[MAXC];
    char msg[MAXC][220];
    /* reducer scenario */
    int red_bad[MAXP][12];
    char red_msg[12][220];
    int red_claimed[12];
} det_shm_t;

static det_shm_t *S;
static dcase_t cases[MAXC];
static int g_det_off;                 /* DDP_TEST_DET_OFF */

/* ------------------------------------------------------------------------- inputs */
/* Rank q's element i of a case: bits of a float x * 2^k (k in -20..20; fp16 -6..6), random sign
 * and mantissa; int32: any bits (SUM wraps, exact in any order). Never zero, never NaN. */
static uint64_t elem_bits(int dt, uint64_t seed, int q, size_t i) {
    uint64_t h = t_mix64(seed ^ ((uint64_t)q << 48) ^ (uint64_t)i), m = t_mix64(h);
    uint64_t s = h & 1;
    int k = (int)((h >> 8) % 41) - 20;
    switch (dt) {
    case DDP_FLOAT32: return s << 31 | (uint64_t)(127 + k) << 23 | (m & 0x7fffffu);
    case DDP_FLOAT64: return s << 63 | (uint64_t)(1023 + k) << 52 | (m & 0xfffffffffffffull);
    case DDP_FLOAT16: k = (int)((h >> 8) % 13) - 6; return s << 15 | (uint64_t)(15 + k) << 10 | (m & 0x3ffu);
    case DDP_BFLOAT16: return s << 15 | (uint64_t)(127 + k) << 7 | (m & 0x7fu);
    default: return m & 0xffffffffu;
    }
}

static void gen_fill(int dt, uint64_t seed, int q, size_t lo, size_t n, unsigned char *out) {
    const size_t es = ddp_dtype_size((ddp_dtype_t)dt);
    size_t i;
    for (i = 0; i < n; i++) {
        uint64_t b = elem_bits(dt, seed, q, lo + i);
        memcpy(out + i * es, &b, es);   /* little-endian: the low bytes */
    }
}

/* The reference for elements lo..lo+n-1 of the inputs (the fold above, n at a time). */
static void ref_block(int dt, int op, uint64_t seed, int p, size_t lo, size_t n, unsigned char *acc,
                      unsigned char *tmp) {
    int q;
    gen_fill(dt, seed, 0, lo, n, acc);
    for (q = 1; q < p; q++) {
        gen_fill(dt, seed, q, lo, n, tmp);
        ddp_reduce_local(acc, acc, tmp, n, (ddp_dtype_t)dt, op == DDP_AVG ? DDP_SUM : (ddp_op_t)op);
    }
    if (op == DDP_AVG) ddp_divide_local(acc, n, (ddp_dtype_t)dt, p);
}

/* The definition literally: one element at a time. */
static void ref_one(int dt, int op, uint64_t seed, int p, size_t i, unsigned char *acc) {
    unsigned char x[8];
    int q;
    gen_fill(dt, seed, 0, i, 1, acc);
    for (q = 1; q < p; q++) {
        gen_fill(dt, seed, q, i, 1, x);
        ddp_reduce_local(acc, acc, x, 1, (ddp_dtype_t)dt, op == DDP_AVG ? DDP_SUM : (ddp_op_t)op);
    }
    if (op == DDP_AVG) ddp_divide_local(acc, 1, (ddp_dtype_t)dt, p);
}

static double elem_value(int dt, const unsigned char *b) {
    uint64_t v = 0;
    uint16_t h;
    float f;
    double d;
    switch (dt) {
    case DDP_FLOAT32: memcpy(&f, b, 4); return f;
    case DDP_FLOAT64: memcpy(&d, b, 8); return d;
    case DDP_FLOAT16: memcpy(&h, b, 2); return ddp_half_to_float(h);
    case DDP_BFLOAT16: memcpy(&h, b, 2); return ddp_bfloat16_to_float(h);
    default: memcpy(&v, b, 4); return (double)(int32_t)(uint32_t)v;
    }
}

/* Compares out (n elements, reference elements lo..) with the reference; 0 if equal, else
 * describes the first difference in why. */
static int check_out(int dt, int op, uint64_t seed, int p, size_t lo, size_t n, const unsigned char *out,
                     char *why, size_t cap) {
    unsigned char acc[BLOCK * 8], tmp[BLOCK * 8];   /* not static: thread ranks check at once */
    const size_t es = ddp_dtype_size((ddp_dtype_t)dt);
    size_t i0, i, bad = 0, first = 0;
    unsigned char got[8], want[8];
    for (i0 = 0; i0 < n; i0 += BLOCK) {
        const size_t m = n - i0 < BLOCK ? n - i0 : BLOCK;
        ref_block(dt, op, seed, p, lo + i0, m, acc, tmp);
        if (memcmp(acc, out + i0 * es, m * es) == 0) continue;
        for (i = 0; i < m; i++)
            if (memcmp(acc + i * es, out + (i0 + i) * es, es) != 0 && !bad++) {
                first = i0 + i;
                memcpy(got, out + first * es, es);
                memcpy(want, acc + i * es, es);
            }
    }
    if (bad) {
        uint64_t g = 0, w = 0;
        memcpy(&g, got, es);
        memcpy(&w, want, es);
        snprintf(why, cap, "%zu of %zu elements differ from the rank-order fold; first: element %zu, got 0x%llx "
                 "(%.9g), expected 0x%llx (%.9g)", bad, n, first, (unsigned long long)g, elem_value(dt, got),
                 (unsigned long long)w, elem_value(dt, want));
    }
    return bad != 0;
}

/* ------------------------------------------------------------------------- cases */
static int add_case(int n, int coll, int dt, int op, size_t count, int inplace, int root) {
    dcase_t *c;
    if (n >= MAXC) t_bail("too many cases");
    c = &cases[n];
    c->coll = (unsigned char)coll; c->dtype = (unsigned char)dt; c->op = (unsigned char)op;
    c->inplace = (unsigned char)inplace; c->root = root; c->count = count;
    c->seed = t_mix64(0xde7e2000ull + (uint64_t)n * 104729u);
    return n + 1;
}

static const int fdts[4] = {DDP_FLOAT32, DDP_FLOAT64, DDP_FLOAT16, DDP_BFLOAT16};

static int build_cases(const run_t *R) {
    const int p = R->p;
    const size_t pz = (size_t)p;
    const size_t full[10] = {0, 1, 2, 3, pz - 1, pz, pz + 1, 1023, 4099, 65537};
    const size_t algo[6] = {1, 3, pz + 1, 1023, 4099, 65537};
    const size_t rs[6] = {0, 1, 3, pz + 1, 1023, 4099};
    int n = 0, d, op, i, ip;
    for (d = 0; d < 4; d++)
        for (op = 0; op < 2; op++) {
            const int o = op ? DDP_AVG : DDP_SUM;
            if (R->set == SET_ALGO) {
                for (i = 0; i < 6; i++) n = add_case(n, C_AR, fdts[d], o, algo[i], (i + d + op) & 1, 0);
            } else {
                for (i = 0; i < 10; i++)
                    for (ip = 0; ip < 2; ip++) n = add_case(n, C_AR, fdts[d], o, full[i], ip, 0);
            }
            if (R->big && fdts[d] == DDP_FLOAT32) n = add_case(n, C_AR, fdts[d], o, MIB1_F32, op, 0);
            if (R->big && fdts[d] == DDP_FLOAT64 && (R->set == SET_FULL || op == 0))
                n = add_case(n, C_AR, fdts[d], o, MIB1_F64, !op, 0);
            if (R->big > 1 && fdts[d] == DDP_FLOAT32 && op == 0) n = add_case(n, C_AR, fdts[d], o, MIB16_F32, 1, 0);
        }
    if (R->set == SET_ALGO) return n;
    n = add_case(n, C_AR, DDP_FLOAT32, DDP_MAX, 1023, 0, 0);
    n = add_case(n, C_AR, DDP_BFLOAT16, DDP_MIN, 4099, 1, 0);
    n = add_case(n, C_AR, DDP_INT32, DDP_SUM, 4099, 0, 0);
    for (d = 0; d < 4; d++) n = add_case(n, C_AR_ASYNC, fdts[d], d & 1 ? DDP_AVG : DDP_SUM, 4099, d >> 1, 0);
    for (d = 0; d < 4; d++)
        for (op = 0; op < 2; op++)
            for (i = 0; i < 6; i++) n = add_case(n, C_RS, fdts[d], op ? DDP_AVG : DDP_SUM, rs[i], (i + op) & 1, 0);
    for (d = 0; d < 4; d++)
        for (op = 0; op < 2; op++)
            for (i = 1; i < 6; i++)
                n = add_case(n, C_RED, fdts[d], op ? DDP_AVG : DDP_SUM, i == 5 ? 65537 : algo[i - 1] + 1, (i + d) & 1,
                             (i & 1) ? p - 1 : 0);
    return n;
}

static void case_str(const dcase_t *c, char *out, size_t cap) {
    snprintf(out, cap, "%s %s %s count %zu %s%s", coll_names[c->coll], ddp_dtype_name((ddp_dtype_t)c->dtype),
             ddp_op_name((ddp_op_t)c->op), c->count, c->inplace ? "in-place" : "out-of-place",
             c->coll == C_RED ? (c->root ? " root last" : " root 0") : "");
}

static void case_fail(int k, int rank, const char *fmt, ...) T_PRINTF(3, 4);
static void case_fail(int k, int rank, const char *fmt, ...) {
    va_list ap;
    char m[200];
    S->fail[k] = 1;
    if (__atomic_exchange_n(&S->msg_claimed[k], 1, __ATOMIC_SEQ_CST)) return;
    va_start(ap, fmt);
    vsnprintf(m, sizeof m, fmt, ap);
    va_end(ap);
    snprintf(S->msg[k], sizeof S->msg[k], "rank %d: %s", rank, m);
}

/* One case on one rank; anything but DDP_SUCCESS from the library stops the run. */
static ddp_result_t run_case(int k, const dcase_t *c, ddp_comm_t *comm, int rank, int p) {
    const int dt = c->dtype, op = c->op;
    const size_t es = ddp_dtype_size((ddp_dtype_t)dt), n = c->count;
    const size_t sn = c->coll == C_RS ? (size_t)p * n : n;   /* send elements */
    unsigned char *sbuf = (unsigned char *)malloc(sn * es + 16), *rbuf = (unsigned char *)malloc(n * es + 16);
    unsigned char *send, *recv, *out;
    ddp_result_t r = DDP_SUCCESS;
    ddp_request_t req;
    char why[200];
    if (!sbuf || !rbuf) { free(sbuf); free(rbuf); case_fail(k, rank, "out of memory"); return DDP_ERR_OUT_OF_MEMORY; }
    gen_fill(dt, c->seed, rank, 0, sn, sbuf);
    memset(rbuf, 0xcd, n * es);
    send = sbuf;
    if (c->inplace) recv = c->coll == C_RS ? sbuf + (size_t)rank * n * es : sbuf;
    else recv = rbuf;
    out = recv;
    switch (c->coll) {
    case C_AR: r = ddp_all_reduce(send, recv, n, (ddp_dtype_t)dt, (ddp_op_t)op, comm); break;
    case C_AR_ASYNC:
        memset(&req, 0, sizeof req);
        r = ddp_all_reduce_async(send, recv, n, (ddp_dtype_t)dt, (ddp_op_t)op, comm, &req);
        if (r == DDP_SUCCESS) r = ddp_wait(&req);
        break;
    case C_RS: r = ddp_reduce_scatter(send, recv, n, (ddp_dtype_t)dt, (ddp_op_t)op, comm); break;
    default: r = ddp_reduce(send, recv, n, (ddp_dtype_t)dt, (ddp_op_t)op, c->root, comm); break;
    }
    if (r != DDP_SUCCESS) {
        case_fail(k, rank, "returned %s: %s", ddp_strerror(r), ddp_comm_last_error(comm));
    } else if (c->coll != C_RED || rank == c->root) {
        const size_t lo = c->coll == C_RS ? (size_t)rank * n : 0;
        if (check_out(dt, op, c->seed, p, lo, n, out, why, sizeof why)) case_fail(k, rank, "%s", why);
    }
    free(sbuf);
    free(rbuf);
    return r;
}

/* ------------------------------------------------------------------------- run set-up */
/* The fake host of rank in a "2+1"-style layout (NULL: the first (p+1)/2 ranks, the rest). */
static int layout_host(const char *layout, int p, int rank) {
    const char *s = layout;
    int h = 0, i = 0;
    if (!layout) return rank < (p + 1) / 2 ? 0 : 1;
    while (*s) {
        int v = (int)strtol(s, (char **)&s, 10);
        if (rank >= i && rank < i + v) return h;
        i += v;
        h++;
        if (*s == '+') s++;
    }
    return h;
}

static int layout_ranks(const char *layout) {
    const char *s = layout;
    int i = 0;
    while (*s) { i += (int)strtol(s, (char **)&s, 10); if (*s == '+') s++; }
    return i;
}

/* The environment of a run's ranks, whatever the caller's says. */
static void env_setup(const run_t *R, int rank) {
    static const char *const vars[] = {"DDP_TRANSPORT", "DDP_HOST_ID", "DDP_SHM_COLL", "DDP_SHM_CHUNK",
                                       "DDP_SHM_SMALL_MAX", "DDP_ALGO", "DDP_SEGMENT_BYTES",
                                       "DDP_DETERMINISTIC", "DDP_TEST_HOSTS", "DDP_RD_MAX_BYTES"};
    size_t i;
    char v[64];
    for (i = 0; i < sizeof vars / sizeof vars[0]; i++) unsetenv(vars[i]);
    if (!strcmp(R->mode, "tcp")) setenv("DDP_TRANSPORT", "tcp", 1);
    if (!strcmp(R->mode, "shm-p2p")) setenv("DDP_SHM_COLL", "0", 1);
    if (!strcmp(R->mode, "shm-small")) { setenv("DDP_SHM_CHUNK", "4096", 1); setenv("DDP_SHM_SMALL_MAX", "64", 1); }
    if (!strcmp(R->mode, "hosts")) {
        snprintf(v, sizeof v, "fake-host-%d", layout_host(R->layout, R->p, rank));
        setenv("DDP_HOST_ID", v, 1);
    }
    if (R->algo) setenv("DDP_ALGO", R->algo, 1);
    if (R->seg) { snprintf(v, sizeof v, "%zu", R->seg); setenv("DDP_SEGMENT_BYTES", v, 1); }
    if (g_det_off || R->det == DET_OFF) {
#ifdef T_NO_DET_FIELD
        setenv("DDP_DETERMINISTIC", "0", 1);
#else
        setenv("DDP_DETERMINISTIC", "1", 1);   /* and the desc says -1: off whatever the env says */
#endif
    } else if (R->det == DET_ENV) {
        setenv("DDP_DETERMINISTIC", "1", 1);
    }
#ifdef T_NO_DET_FIELD
    if (R->det == DET_DESC && !g_det_off) setenv("DDP_DETERMINISTIC", "1", 1);
#endif
}

static void desc_setup(const run_t *R, ddp_comm_desc_t *d) {
    t_desc(d, 60000);
    d->log_level = 1;
    if (g_det_off || R->det == DET_OFF) T_SET_DESC_DET(d, -1);
    else if (R->det == DET_DESC) T_SET_DESC_DET(d, 1);
}

static int rank_cases(const run_t *R, ddp_comm_t *comm, int rank) {
    int k;
    for (k = 0; k < S->ncases; k++) {
        char what[160];
        case_str(&cases[k], what, sizeof what);
        if (!strcmp(R->mode, "threads")) { if (rank == 0) t_where("case %d: %s", k, what); }
        else t_where("case %d: %s", k, what);
        if (run_case(k, &cases[k], comm, rank, R->p) != DDP_SUCCESS) return 4;
        S->done[rank] = k + 1;
    }
    return 0;
}

static int proc_rank(int rank, int p, void *arg) {
    const run_t *R = (const run_t *)arg;
    ddp_comm_desc_t d;
    ddp_comm_t *comm = NULL;
    ddp_result_t r;
    int st;
    env_setup(R, rank);
    desc_setup(R, &d);
    t_where("ddp_comm_init");
    r = ddp_comm_init(&comm, p, rank, &d);
    if (r != DDP_SUCCESS) {
        S->init_failed[rank] = 1;
        snprintf(S->init_msg[rank], sizeof S->init_msg[rank], "%s: %.250s", ddp_strerror(r), ddp_last_init_error());
        return 2;
    }
    st = rank_cases(R, comm, rank);
    t_where("ddp_comm_destroy");
    if (ddp_comm_destroy(comm) != DDP_SUCCESS && !st) st = 5;
    return st;
}

/* Threads as ranks: one process (a t_run_ranks child) runs p threads. */
typedef struct { const run_t *R; ddp_comm_t *comm; int rank, st; } thr_arg_t;
static void *thr_main(void *a) {
    thr_arg_t *t = (thr_arg_t *)a;
    t->st = rank_cases(t->R, t->comm, t->rank);
    if (t->st) ddp_comm_abort(t->comm);   /* the others fail at once instead of timing out */
    return NULL;
}

static int threads_proc(int rank, int p1, void *arg) {
    const run_t *R = (const run_t *)arg;
    ddp_comm_desc_t d;
    ddp_comm_t *comms[MAXP];
    thr_arg_t ta[MAXP];
    pthread_t th[MAXP];
    ddp_result_t r;
    int i, st = 0;
    (void)rank; (void)p1;
    env_setup(R, 0);
    if (R->layout) setenv("DDP_TEST_HOSTS", R->layout, 1);
    desc_setup(R, &d);
    d.master_port = 0;
    d.master_addr = NULL;
    t_where("ddp_comm_init_threads");
    r = ddp_comm_init_threads(comms, R->p, &d);
    if (r != DDP_SUCCESS) {
        S->init_failed[0] = 1;
        snprintf(S->init_msg[0], sizeof S->init_msg[0], "%s: %.250s", ddp_strerror(r), ddp_last_init_error());
        return 2;
    }
    for (i = 0; i < R->p; i++) {
        ta[i].R = R; ta[i].comm = comms[i]; ta[i].rank = i; ta[i].st = 0;
        if (pthread_create(&th[i], NULL, thr_main, &ta[i]) != 0) t_bail("pthread_create");
    }
    for (i = 0; i < R->p; i++) { pthread_join(th[i], NULL); if (ta[i].st) st = ta[i].st; }
    for (i = 0; i < R->p; i++) ddp_comm_destroy(comms[i]);
    return st;
}

static void run_tag(const run_t *R, char *out, size_t cap) {
    char seg[32] = "";
    if (R->seg) snprintf(seg, sizeof seg, " seg=%zu", R->seg);
    snprintf(out, cap, "%s%s%s%s p=%d%s%s%s%s", R->mode, R->layout ? "[" : "", R->layout ? R->layout : "",
             R->layout ? "]" : "", R->p, seg, R->algo ? " algo=" : "", R->algo ? R->algo : "",
             R->det == DET_DESC ? " (desc)" : "");
}

/* One check per (collective, dtype, op) group of the run. */
static void report(const run_t *R, int nbad) {
    const int nr = !strcmp(R->mode, "threads") ? 1 : R->p;
    int k = 0, r;
    char tag[128];
    run_tag(R, tag, sizeof tag);
    for (r = 0; r < nr; r++)
        if (S->init_failed[r]) diag("%s rank %d init: %s", tag, r, S->init_msg[r]);
    ok(nbad == 0, "%s: every rank ran all %d cases and exited cleanly (%.1f s)", tag, S->ncases, t_last_run.seconds);
    while (k < S->ncases) {
        int g0 = k, bad = 0, shown = 0, notrun = 0;
        char counts[160] = "";
        size_t off = 0;
        while (k < S->ncases && cases[k].coll == cases[g0].coll && cases[k].dtype == cases[g0].dtype &&
               cases[k].op == cases[g0].op) k++;
        for (r = g0; r < k; r++) {
            int ran = 1, q;
            for (q = 0; q < R->p; q++) if (S->done[q] <= r) ran = 0;
            if (off + 24 < sizeof counts) off += (size_t)snprintf(counts + off, sizeof counts - off, "%s%zu", off ? "," : "", cases[r].count);
            if (!S->fail[r] && ran) continue;
            bad++;
            if (!ran && !S->fail[r]) notrun++;
            if (shown++ < 2) {
                char what[160];
                case_str(&cases[r], what, sizeof what);
                diag("  %s: %s", what, S->fail[r] ? S->msg[r] : "not run by every rank");
            }
        }
        ok(!bad, "%s %s %s %s: counts {%s} equal the rank-order fold%s", tag, coll_names[cases[g0].coll],
           ddp_dtype_name((ddp_dtype_t)cases[g0].dtype), ddp_op_name((ddp_op_t)cases[g0].op), counts,
           notrun ? " (some not run)" : "");
    }
}

static void do_run(const run_t *R) {
    char tag[128];
    int nbad;
    run_tag(R, tag, sizeof tag);
    if (!t_selected(tag)) return;
    S = (det_shm_t *)t_shm_user(sizeof(det_shm_t));
    S->ncases = build_cases(R);
    if (!strcmp(R->mode, "threads")) nbad = t_run_ranks(1, threads_proc, (void *)R, 240);
    else nbad = t_run_ranks(R->p, proc_rank, (void *)R, 240);
    report(R, nbad);
}

/* ------------------------------------------------------------------------- split */
/* A split of a deterministic communicator (4 ranks -> {0,1,2}, {3}) is deterministic too: the
 * 3-rank one's ring all-reduce gives the fold over its ranks in their new order. */
static int split_rank(int rank, int p, void *arg) {
    const run_t *R = (const run_t *)arg;
    ddp_comm_desc_t d;
    ddp_comm_t *comm = NULL, *sub = NULL;
    ddp_result_t r;
    const size_t n = 4099;
    const uint64_t seed = 0x5b117ull;
    float *buf = (float *)malloc(n * sizeof *buf);
    char why[200];
    env_setup(R, rank);
    desc_setup(R, &d);
    if (!buf || !(comm = t_comm_init(rank, p, &d))) return 2;
    t_where("ddp_comm_split");
    r = ddp_comm_split(comm, rank < 3 ? 0 : 1, rank, &sub);
    if (!ok(r == DDP_SUCCESS, "ddp_comm_split -> %s: %s", ddp_strerror(r), ddp_comm_last_error(comm))) return 3;
    if (rank < 3) {
        int it, differs;
        for (it = 0; it < 2; it++) {
            const int op = it ? DDP_AVG : DDP_SUM;
            gen_fill(DDP_FLOAT32, seed + (uint64_t)it, rank, 0, n, (unsigned char *)buf);
            t_where("all_reduce on the split");
            r = ddp_all_reduce(buf, buf, n, DDP_FLOAT32, (ddp_op_t)op, sub);
            why[0] = 0;
            differs = r != DDP_SUCCESS || check_out(DDP_FLOAT32, op, seed + (uint64_t)it, 3, 0, n, (unsigned char *)buf, why, sizeof why);
            ok(!differs, "split of a deterministic communicator (ranks 0-2 of 4, ring): float32 %s of %zu equals the "
               "fold over its ranks%s%s", ddp_op_name((ddp_op_t)op), n, r ? ": " : "", r ? ddp_strerror(r) : "");
            if (*why) diag("%s", why);
        }
    }
    ddp_comm_destroy(sub);
    ddp_comm_destroy(comm);
    free(buf);
    return 0;
}

/* ------------------------------------------------------------------------- off means off */
/* With the mode off (the desc's -1 beside DDP_DETERMINISTIC=1), today's ring at p = 3 sums each
 * chunk starting elsewhere than rank 0: on these inputs some elements must differ from the fold.
 * This is what makes a pass with the mode on mean something. */
static int off_rank(int rank, int p, void *arg) {
    const run_t *R = (const run_t *)arg;
    ddp_comm_desc_t d;
    ddp_comm_t *comm;
    const size_t n = 65537;
    const uint64_t seed = 0x0ff0ull;
    float *buf = (float *)malloc(n * sizeof *buf);
    char why[200] = "";
    ddp_result_t r;
    env_setup(R, rank);
    desc_setup(R, &d);
    if (!buf || !(comm = t_comm_init(rank, p, &d))) return 2;
    gen_fill(DDP_FLOAT32, seed, rank, 0, n, (unsigned char *)buf);
    r = ddp_all_reduce(buf, buf, n, DDP_FLOAT32, DDP_SUM, comm);
    if (rank == 0) {
        const int differs = r == DDP_SUCCESS && check_out(DDP_FLOAT32, DDP_SUM, seed, p, 0, n, (unsigned char *)buf, why, sizeof why);
        ok(differs, "mode off (desc -1, env 1): the ring at p = 3 differs from the rank-order fold on these inputs%s",
           differs ? "" : " (it does not: these inputs would not show another order)");
        if (differs) diag("%s", why);
    }
    ddp_comm_destroy(comm);
    free(buf);
    return r == DDP_SUCCESS ? 0 : 3;
}

/* Rank 0 with the mode, the others without: they run different algorithms, and the first
 * message that meets the wrong one says so (a mismatch naming the setting), on every rank:
 * nothing hangs, nothing succeeds. */
static int mixed_rank(int rank, int p, void *arg) {
    const run_t *R = (const run_t *)arg;
    ddp_comm_desc_t d;
    ddp_comm_t *comm;
    float buf[5] = {1, 2, 3, 4, 5};
    ddp_result_t r;
    env_setup(R, rank);
    desc_setup(R, &d);
    T_SET_DESC_DET(&d, rank == 0 ? 1 : -1);
    if (!(comm = t_comm_init(rank, p, &d))) return 2;
    r = ddp_all_reduce(buf, buf, 5, DDP_FLOAT32, DDP_SUM, comm);
    ok(r != DDP_SUCCESS, "mixed modes: rank %d's all_reduce fails (%s)", rank, ddp_strerror(r));
    if (rank == 0)
        ok(r == DDP_ERR_MISMATCH && strstr(ddp_comm_last_error(comm), "DDP_DETERMINISTIC") != NULL,
           "mixed modes: rank 0 reports a mismatch that names DDP_DETERMINISTIC: %s", ddp_comm_last_error(comm));
    ddp_comm_destroy(comm);
    return 0;
}

/* ------------------------------------------------------------------------- the reducer */
#define NPAR 9
static const size_t psz[NPAR] = {37, 700, 3, 2501, 129, 1, 5007, 100003, 3};
enum { RED_COPY, RED_FLAT, RED_ZERO };
static const char *const red_names[3] = {"copy", "flat", "ZeRO-1"};
static const size_t red_caps[3] = {1024, 65536, (size_t)25 << 20};

static void red_fail(int slot, int rank, const char *fmt, ...) T_PRINTF(3, 4);
static void red_fail(int slot, int rank, const char *fmt, ...) {
    va_list ap;
    char m[200];
    S->red_bad[rank][slot]++;
    if (__atomic_exchange_n(&S->red_claimed[slot], 1, __ATOMIC_SEQ_CST)) return;
    va_start(ap, fmt);
    vsnprintf(m, sizeof m, fmt, ap);
    va_end(ap);
    snprintf(S->red_msg[slot], sizeof S->red_msg[slot], "rank %d: %s", rank, m);
}

/* The gradients of rank q, iteration it: element g of the concatenated parameters. */
static uint64_t red_seed(int kind, int ci, int it) { return t_mix64(0x6ead0000ull + (uint64_t)(kind * 16 + ci * 4 + it)); }

static int reducer_rank(int rank, int p, void *arg) {
    const run_t *R = (const run_t *)arg;
    ddp_comm_desc_t d;
    ddp_comm_t *comm;
    size_t total = 0, off[NPAR];
    int kind, ci, it, k;
    char why[200];
    env_setup(R, rank);
    desc_setup(R, &d);
    if (!(comm = t_comm_init(rank, p, &d))) return 2;
    for (k = 0; k < NPAR; k++) { off[k] = total; total += psz[k]; }
    for (kind = 0; kind < 3; kind++)
        for (ci = 0; ci < 3; ci++) {
            const int slot = kind * 3 + ci;
            float *flat = (float *)malloc(total * sizeof(float));
            float *grads[NPAR];
            ddp_reducer_desc_t rd;
            ddp_reducer_t *red = NULL;
            ddp_result_t e;
            memset(&rd, 0, sizeof rd);
            rd.bucket_cap_bytes = red_caps[ci];
            rd.first_bucket_bytes = red_caps[ci];
            if (kind != RED_COPY) { rd.flat_grads = flat; rd.flat_bytes = total * sizeof(float); }
            rd.zero_stage = kind == RED_ZERO;
            t_where("reducer %s cap %zu", red_names[kind], red_caps[ci]);
            if (!flat || (e = ddp_reducer_create(&red, comm, &rd)) != DDP_SUCCESS) {
                red_fail(slot, rank, "ddp_reducer_create -> %s: %s", flat ? ddp_strerror(e) : "no memory", ddp_comm_last_error(comm));
                free(flat);
                continue;
            }
            for (k = 0; k < NPAR; k++) {
                grads[k] = kind == RED_COPY ? (float *)malloc(psz[k] * sizeof(float)) : flat + off[k];
                if (ddp_reducer_add_param(red, grads[k], psz[k], DDP_FLOAT32) != k)
                    red_fail(slot, rank, "add_param %d refused: %s", k, ddp_reducer_last_error(red));
            }
            for (it = 0; it < 2; it++) {
                const uint64_t seed = red_seed(kind, ci, it);
                for (k = 0; k < NPAR; k++) gen_fill(DDP_FLOAT32, seed, rank, off[k], psz[k], (unsigned char *)grads[k]);
                for (k = NPAR - 1, e = DDP_SUCCESS; k >= 0 && e == DDP_SUCCESS; k--) e = ddp_reducer_grad_ready(red, k);
                if (e == DDP_SUCCESS) e = ddp_reducer_finish(red);
                if (e != DDP_SUCCESS) {
                    red_fail(slot, rank, "iteration %d: %s: %s", it, ddp_strerror(e), ddp_reducer_last_error(red));
                    break;
                }
                if (kind != RED_ZERO) {
                    for (k = 0; k < NPAR; k++) {
                        const float *g = (const float *)ddp_reducer_grad(red, k);
                        if (g && check_out(DDP_FLOAT32, DDP_AVG, seed, p, off[k], psz[k], (const unsigned char *)g, why, sizeof why)) {
                            red_fail(slot, rank, "iteration %d, parameter %d (%zu elements at %zu): %s", it, k, psz[k], off[k], why);
                            break;
                        }
                    }
                } else {
                    int ns = ddp_reducer_num_shards(red, NULL), s;
                    for (s = 0; s < ns; s++) {
                        size_t so = 0, sc = 0;
                        if (ddp_reducer_shard(red, s, &so, &sc, NULL) != DDP_SUCCESS) { red_fail(slot, rank, "shard %d refused", s); break; }
                        if (sc && check_out(DDP_FLOAT32, DDP_AVG, seed, p, so, sc, (const unsigned char *)(flat + so), why, sizeof why)) {
                            red_fail(slot, rank, "iteration %d, shard %d (%zu elements at %zu): %s", it, s, sc, so, why);
                            break;
                        }
                    }
                    if (ns <= 0) red_fail(slot, rank, "no shards (%d)", ns);
                }
            }
            ddp_reducer_destroy(red);
            if (kind == RED_COPY) for (k = 0; k < NPAR; k++) free(grads[k]);
            free(flat);
        }
    ddp_comm_destroy(comm);
    return 0;
}

static void do_reducer_run(const run_t *R) {
    char tag[128];
    int nbad, kind, ci, q;
    run_tag(R, tag, sizeof tag);
    if (!t_selected("reducer") && !t_selected(tag)) return;
    S = (det_shm_t *)t_shm_user(sizeof(det_shm_t));
    nbad = t_run_ranks(R->p, reducer_rank, (void *)R, 240);
    ok(nbad == 0, "reducer %s: every rank exited cleanly (%.1f s)", tag, t_last_run.seconds);
    for (kind = 0; kind < 3; kind++)
        for (ci = 0; ci < 3; ci++) {
            const int slot = kind * 3 + ci;
            int bad = 0;
            for (q = 0; q < R->p; q++) bad += S->red_bad[q][slot];
            ok(!bad, "reducer %s %s mode, bucket cap %zu: every gradient%s equals the rank-order average, 2 iterations",
               tag, red_names[kind], red_caps[ci], kind == RED_ZERO ? " shard" : "");
            if (bad) diag("  %s", S->red_msg[slot]);
        }
}

/* ------------------------------------------------------------------------- main */
static run_t runs[160];
static int nruns;

static run_t *add(const char *mode, const char *layout, int p, const char *algo, size_t seg, int det, int set, int big) {
    run_t *R = &runs[nruns++];
    if (nruns > (int)(sizeof runs / sizeof runs[0])) t_bail("too many runs");
    R->mode = mode; R->layout = layout; R->p = layout ? layout_ranks(layout) : p; R->algo = algo; R->seg = seg;
    R->det = det; R->set = set; R->big = big;
    return R;
}

static const char *hosts_layout(int p) {
    static const char *const l[7] = {NULL, "1", "1+1", "2+1", "2+2", "3+2", "3+3"};
    return l[p];
}

/* The definition, one element at a time, against the block fold the checks use. */
static void selftest(void) {
    static unsigned char acc[BLOCK * 8], tmp[BLOCK * 8];
    static const int ops[3] = {DDP_SUM, DDP_AVG, DDP_MAX};
    int d, o, bad = 0;
    size_t i;
    for (d = 0; d < 5; d++)
        for (o = 0; o < 3; o++) {
            const int dt = d < 4 ? fdts[d] : DDP_INT32;
            const size_t es = ddp_dtype_size((ddp_dtype_t)dt);
            ref_block(dt, ops[o], 77 + (uint64_t)d, 5, 1000, 1000, acc, tmp);
            for (i = 0; i < 1000; i++) {
                unsigned char one[8];
                ref_one(dt, ops[o], 77 + (uint64_t)d, 5, 1000 + i, one);
                if (memcmp(one, acc + i * es, es)) bad++;
            }
        }
    ok(!bad, "the block fold the checks use equals the one-element fold of the definition (%d differ)", bad);
}

int main(void) {
    const int quick = getenv("DDP_TEST_QUICK") && atoi(getenv("DDP_TEST_QUICK"));
    const int full = getenv("DDP_TEST_FULL") && atoi(getenv("DDP_TEST_FULL"));
    static const char *const flat_algos[3] = {"ring", "rd", "rabenseifner"};
    static const char *const hier_algos[5] = {"hier", "hier_ring", "hier_rd", "hier_rabenseifner", "auto"};
    double t0 = t_now();
    int p, a, i;

    t_init();
    g_det_off = getenv("DDP_TEST_DET_OFF") && atoi(getenv("DDP_TEST_DET_OFF"));
    if (sizeof(det_shm_t) > T_USER_BYTES) t_bail("det_shm_t too big");
    if (g_det_off) diag("DDP_TEST_DET_OFF: the mode is forced off; the checks must fail");
    selftest();
    /* The library's choice, every transport and world size. */
    for (p = 1; p <= MAXP; p++) {
        if (quick && p != 1 && p != 3 && p != 5) continue;
        add("tcp", NULL, p, NULL, 0, DET_ENV, SET_FULL, full ? 2 : p == 3 ? 1 : 0);
        if (p >= 2) add("shm", NULL, p, NULL, 0, DET_ENV, SET_FULL, full ? 2 : p == 4 ? (quick ? 1 : 2) : 0);
        if (p >= 2) add("threads", NULL, p, NULL, 0, DET_ENV, SET_FULL, full ? 2 : p == 5 ? 1 : 0);
        if (p >= 2) add("hosts", hosts_layout(p), p, NULL, 0, DET_ENV, SET_FULL, full ? 2 : p == 5 ? 1 : 0);
    }
    /* Every DDP_ALGO value. */
    for (a = 0; a < 3; a++)
        for (p = 3; p <= MAXP; p++) {
            if (!full && (quick ? p != 5 : (p != 3 && p != 5 && !(p == 4 && a) && !(p == 6 && a == 0)))) continue;
            add("tcp", NULL, p, flat_algos[a], 0, DET_ENV, SET_ALGO, full ? 1 : 0);
        }
    for (a = 0; a < 5; a++)
        for (p = 2; p <= MAXP; p++) {
            if (!full && (quick ? p != 5 : (p != 3 && p != 4 && p != 5 && !(p == 6 && a == 1)))) continue;
            add("hosts", hosts_layout(p), p, hier_algos[a], 0, DET_ENV, SET_ALGO, full ? 1 : 0);
        }
    if (!quick) add("threads", NULL, 4, "hier_ring", 0, DET_ENV, SET_ALGO, 0)->layout = "a,a,b,b";
    if (!quick) add("shm-p2p", NULL, 3, "ring", 0, DET_ENV, SET_ALGO, 0);   /* shm under the ring */
    if (!quick) add("shm-p2p", NULL, 4, "rabenseifner", 0, DET_ENV, SET_ALGO, 0);
    /* Segments and chunks moved. */
    add("tcp", NULL, 3, "ring", 4096, DET_ENV, SET_ALGO, 0);
    if (!quick) add("tcp", NULL, 5, "ring", 4096, DET_ENV, SET_ALGO, 0);
    add("hosts", "3+2", 5, "hier_ring", 4096, DET_ENV, SET_ALGO, 0);
    add("shm-small", NULL, 3, NULL, 0, DET_ENV, SET_FULL, 0);
    /* 16 MiB + odd. */
    if (!quick) {
        add("tcp", NULL, 3, "ring", 0, DET_ENV, SET_ALGO, 2);
        add("hosts", "2+1", 3, "hier", 0, DET_ENV, SET_ALGO, 2);
    }
    /* The desc field instead of the environment. */
    add("tcp", NULL, 3, NULL, 0, DET_DESC, SET_FULL, 0);
    if (!quick) add("hosts", "3+2", 5, NULL, 0, DET_DESC, SET_ALGO, 0);
    for (i = 0; i < nruns; i++) do_run(&runs[i]);
    /* Mode off means off (and the inputs show the order). */
    if (t_selected("off")) {
        static run_t off;
        off.mode = "tcp"; off.p = 3; off.algo = "ring"; off.det = DET_OFF;
        S = (det_shm_t *)t_shm_user(sizeof(det_shm_t));
        ok(t_run_ranks(3, off_rank, &off, 120) == 0, "mode off: every rank exited cleanly");
    }
    if (t_selected("mixed") && !g_det_off) {
        static run_t mx;
        mx.mode = "tcp"; mx.p = 3; mx.det = DET_DESC;
        S = (det_shm_t *)t_shm_user(sizeof(det_shm_t));
        ok(t_run_ranks(3, mixed_rank, &mx, 120) == 0, "mixed modes: every rank exited cleanly");
    }
    if (t_selected("split")) {
        static run_t sp;
        sp.mode = "tcp"; sp.p = 4; sp.algo = "ring"; sp.det = DET_ENV;
        S = (det_shm_t *)t_shm_user(sizeof(det_shm_t));
        ok(t_run_ranks(4, split_rank, &sp, 120) == 0, "split: every rank exited cleanly");
    }
    /* The reducer: copy, flat, ZeRO-1. */
    {
        static run_t rr[6];
        int nr = 0;
        rr[nr].mode = "tcp"; rr[nr++].p = 3;
        if (!quick) { rr[nr].mode = "tcp"; rr[nr++].p = 4; }
        rr[nr].mode = "tcp"; rr[nr++].p = 5;
        rr[nr].mode = "shm"; rr[nr++].p = 3;
        if (!quick) { rr[nr].mode = "shm"; rr[nr++].p = 5; }
        if (!quick) { rr[nr].mode = "hosts"; rr[nr].layout = "2+2"; rr[nr++].p = 4; }
        for (i = 0; i < nr; i++) { rr[i].det = DET_ENV; do_reducer_run(&rr[i]); }
    }
    diag("total %.1f s", t_now() - t0);
    return t_done();
}
