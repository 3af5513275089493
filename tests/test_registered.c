/* SPDX-License-Identifier: MIT (see LICENSE) */
/* tests/test_registered.c — registered (symmetric) buffers: ddp_comm_mem_alloc / _free
 * (ddp_window.h) and the shared-memory collectives that read them in place
 * (transports/ddp_shm_window.h). Prints TAP.
 *
 *   build/test_registered          (DDP_TEST_ONLY=<scenario name> runs one)
 *
 *   matrix      p = 1..8 ranks over shm (small chunks, so big buffers take many): all-reduce on
 *               every dtype x op, reduce-scatter, all-gather and broadcast on every dtype, sizes
 *               0, 1, odd, p-1, p, p+1 and a big odd one, with the buffers of every rank in
 *               windows (in place and out of place), mixed across ranks (even ranks in windows,
 *               odd ones in ordinary memory; one rank's input in ordinary memory), and only the
 *               input in a window; with the zero-copy all-reduce pushing in tiny pieces, with
 *               streaming stores (DDP_SHM_STREAM_MIN=64), pulling
 *               (DDP_SHM_ZC_PUSH=0), below DDP_SHM_ZC_MIN and at the default thresholds. Each result is compared, bit for bit, with the rank-order
 *               fold of ddp_reduce_local over every rank's input (what the staged path gives;
 *               floating inputs are uniform random, so a different order shows in the bits).
 *   refused     a rank that cannot map the others' windows (DDP_SHM_WINDOW=0 there): the
 *               allocation still succeeds everywhere and collectives on it are right.
 *   fallback    where shared memory does not run the collectives (DDP_SHM_COLL=0; TCP): the
 *               memory is still given and works.
 *   mismatch    ranks asking for different sizes: DDP_ERR_MISMATCH on every rank, nothing
 *               allocated; a matching call after it works.
 *   inflight    ddp_comm_mem_free while an async all-reduce on the memory cannot finish (its
 *               peer has not called it yet): DDP_ERR_INVALID_USAGE naming the call, nothing
 *               freed; after ddp_wait the result is right and free succeeds.
 *   killed      a rank SIGKILLed between zero-copy all-reduces while the others map its
 *               window: they return DDP_ERR_REMOTE naming it, free and destroy cleanly. */
#define _GNU_SOURCE
#include "ddp.h"
#include "transports/ddp_tcp.h"
#include "transports/ddp_shm.h"
#include "tests/ddp_test.h"
#include "tests/ddp_test_data.h"

#define BIG_ODD 12345
#define MAX_P 8

typedef struct {
    volatile int go;                /* inflight: rank 0 tried its free */
    char msg[MAX_P][1024];
} reg_shared_t;
static reg_shared_t *S;

static void clear_env(void) {
    static const char *const vars[] = {"DDP_TRANSPORT", "DDP_HOST_ID", "DDP_SHM_COLL", "DDP_SHM_CHUNK",
                                       "DDP_SHM_SMALL_MAX", "DDP_SHM_WINDOW", "DDP_SHM_ZC_CHUNK", "DDP_SHM_ZC_MIN",
                                       "DDP_SHM_ZC_PIECE", "DDP_SHM_ZC_PUSH", "DDP_SHM_STREAM_MIN",
                                       "DDP_ALGO"};
    size_t i;
    for (i = 0; i < sizeof vars / sizeof vars[0]; i++) unsetenv(vars[i]);
}

static ddp_comm_t *init_comm(int rank, int p, int timeout_ms, int quiet) {
    ddp_comm_desc_t d;
    t_desc(&d, timeout_ms);
    d.log_level = quiet ? 1 : 0;
    return t_comm_init(rank, p, &d);
}

/* Rank q's input of case (dt, op, seed): elements [0, n). */
static void input(int dt, int op, uint64_t seed, int q, size_t n, void *buf) {
    t_in_t g;
    t_in_init(&g, t_is_int(dt) ? T_IN_EXACT : T_IN_UNIFORM, dt, op, seed);
    if (n) t_in_fill(&g, q, 0, n, buf);
}

/* The rank-order fold of every rank's elements [lo, lo + n) (of inputs of total elements). */
static void fold_ref(int dt, int op, uint64_t seed, int p, size_t total, size_t lo, size_t n,
                     unsigned char *tmp, unsigned char *ref) {
    const size_t es = ddp_dtype_size((ddp_dtype_t)dt);
    int q;
    if (!n) return;
    for (q = 0; q < p; q++) {
        input(dt, op, seed, q, total, tmp);
        if (q == 0) memcpy(ref, tmp + lo * es, n * es);
        else ddp_reduce_local(ref, ref, tmp + lo * es, n, (ddp_dtype_t)dt, (ddp_op_t)op);
    }
    if (op == DDP_AVG) ddp_divide_local(ref, n, (ddp_dtype_t)dt, p);
}

/* Where a case's buffers are, for this rank. */
enum { M_REG_OOP, M_REG_IP, M_MIXED_IP, M_ONE_PLAIN, M_SEND_ONLY, M_NMODES };
static const char *const mode_names[] = {"registered out of place", "registered in place",
                                         "even ranks registered, in place", "rank 0's input plain",
                                         "only the input registered"};

typedef struct {
    unsigned char *wa, *wb, *pa, *pb;   /* windows A, B; plain A, B */
    unsigned char *tmp, *ref;
    int fails;
    char first[300];
} bufs_t;

static void pick(const bufs_t *b, int mode, int rank, unsigned char **send, unsigned char **recv) {
    switch (mode) {
    case M_REG_OOP: *send = b->wa; *recv = b->wb; break;
    case M_REG_IP: *send = *recv = b->wa; break;
    case M_MIXED_IP: *send = *recv = rank % 2 ? b->pa : b->wa; break;
    case M_ONE_PLAIN: *send = rank == 0 ? b->pa : b->wa; *recv = b->wb; break;
    default: *send = b->wa; *recv = b->pb; break;
    }
}

static void fail_case(bufs_t *b, const char *what, int dt, int op, size_t n, int mode, ddp_result_t r,
                      const char *detail) {
    if (!b->fails++)
        snprintf(b->first, sizeof b->first, "%s %s %s n=%zu (%s): %s %s", what, ddp_dtype_name((ddp_dtype_t)dt),
                 ddp_op_name((ddp_op_t)op), n, mode_names[mode], r ? ddp_strerror(r) : "", detail);
}

static void check_out(bufs_t *b, const char *what, int dt, int op, size_t n, int mode, ddp_result_t r,
                      const void *got, const void *want, size_t bytes, const char *err) {
    if (r != DDP_SUCCESS) fail_case(b, what, dt, op, n, mode, r, err);
    else if (bytes && memcmp(got, want, bytes)) {
        size_t i;
        char d[80];
        for (i = 0; i < bytes && ((const unsigned char *)got)[i] == ((const unsigned char *)want)[i]; i++) {}
        snprintf(d, sizeof d, "byte %zu of %zu differs", i, bytes);
        fail_case(b, what, dt, op, n, mode, r, d);
    }
}

static int matrix(int rank, int p, void *arg) {
    const size_t sizes[] = {0, 1, 7, (size_t)p - 1, (size_t)p, (size_t)p + 1, BIG_ODD};
    const size_t nsizes = sizeof sizes / sizeof sizes[0];
    const size_t cap = (size_t)p * (BIG_ODD + 16) * 8;
    ddp_comm_t *c;
    bufs_t b;
    int dt, op, mode, ok_all = 1;
    size_t si;
    (void)arg;
    memset(&b, 0, sizeof b);
    if (!(c = init_comm(rank, p, 60000, 0))) return 1;
    t_where("ddp_comm_mem_alloc");
    if (!ok(ddp_comm_mem_alloc(c, cap, (void **)&b.wa) == DDP_SUCCESS &&
            ddp_comm_mem_alloc(c, cap, (void **)&b.wb) == DDP_SUCCESS, "p=%d: two windows of %zu bytes: %s",
            p, cap, ddp_comm_last_error(c)))
        return 1;
    b.pa = (unsigned char *)malloc(cap);
    b.pb = (unsigned char *)malloc(cap);
    b.tmp = (unsigned char *)malloc(cap);
    b.ref = (unsigned char *)malloc(cap);
    if (!b.pa || !b.pb || !b.tmp || !b.ref) t_bail("malloc");
    /* all-reduce: every dtype x op */
    for (dt = 0; dt < DDP_NUM_DTYPES; dt++)
        for (op = 0; op < DDP_NUM_OPS; op++)
            for (si = 0; si < nsizes; si++)
                for (mode = 0; mode < M_NMODES; mode++) {
                    const size_t n = sizes[si], es = ddp_dtype_size((ddp_dtype_t)dt);
                    const uint64_t seed = ((uint64_t)dt << 40) ^ ((uint64_t)op << 32) ^ (si << 8) ^ (uint64_t)mode;
                    unsigned char *send, *recv;
                    ddp_result_t r;
                    pick(&b, mode, rank, &send, &recv);
                    t_where("all_reduce %s %s n=%zu mode %d", ddp_dtype_name((ddp_dtype_t)dt),
                            ddp_op_name((ddp_op_t)op), n, mode);
                    input(dt, op, seed, rank, n, send);
                    r = ddp_all_reduce(send, recv, n, (ddp_dtype_t)dt, (ddp_op_t)op, c);
                    fold_ref(dt, op, seed, p, n, 0, n, b.tmp, b.ref);
                    check_out(&b, "all_reduce", dt, op, n, mode, r, recv, b.ref, n * es, ddp_comm_last_error(c));
                    if (r) goto out;
                }
    ok_all &= ok(!b.fails, "p=%d: all-reduce, every dtype x op x size x placement, bit for bit%s%s", p,
                 b.fails ? ": " : "", b.first);
    b.fails = 0;
    /* reduce-scatter (sum and avg), all-gather and broadcast: every dtype */
    for (dt = 0; dt < DDP_NUM_DTYPES; dt++)
        for (si = 0; si < nsizes; si++)
            for (mode = 0; mode < M_NMODES; mode++) {
                const size_t n = sizes[si], es = ddp_dtype_size((ddp_dtype_t)dt);
                const uint64_t seed = ((uint64_t)dt << 40) ^ (si << 8) ^ (uint64_t)mode ^ 0x5151;
                const int rop = si % 2 ? DDP_AVG : DDP_SUM, root = (int)(si % (size_t)p);
                unsigned char *send, *recv, *in;
                ddp_result_t r;
                pick(&b, mode, rank, &send, &recv);
                /* reduce-scatter: in place, recvbuf is our block of sendbuf */
                t_where("reduce_scatter %s n=%zu mode %d", ddp_dtype_name((ddp_dtype_t)dt), n, mode);
                input(dt, rop, seed, rank, n * (size_t)p, send);
                r = ddp_reduce_scatter(send, send == recv ? send + (size_t)rank * n * es : recv, n,
                                       (ddp_dtype_t)dt, (ddp_op_t)rop, c);
                fold_ref(dt, rop, seed, p, n * (size_t)p, (size_t)rank * n, n, b.tmp, b.ref);
                check_out(&b, "reduce_scatter", dt, rop, n, mode, r, send == recv ? send + (size_t)rank * n * es : recv,
                          b.ref, n * es, ddp_comm_last_error(c));
                if (r) goto out;
                /* all-gather: in place, sendbuf is our block of recvbuf */
                t_where("all_gather %s n=%zu mode %d", ddp_dtype_name((ddp_dtype_t)dt), n, mode);
                in = send == recv ? recv + (size_t)rank * n * es : send;
                input(dt, DDP_SUM, seed, rank, n, in);
                r = ddp_all_gather(in, recv, n, (ddp_dtype_t)dt, c);
                {
                    int q;
                    for (q = 0; q < p; q++) input(dt, DDP_SUM, seed, q, n, b.ref + (size_t)q * n * es);
                }
                check_out(&b, "all_gather", dt, DDP_SUM, n, mode, r, recv, b.ref, n * (size_t)p * es,
                          ddp_comm_last_error(c));
                if (r) goto out;
                /* broadcast from a root that moves with the size */
                t_where("broadcast %s n=%zu mode %d root %d", ddp_dtype_name((ddp_dtype_t)dt), n, mode, root);
                input(dt, DDP_SUM, seed, rank, n, send);
                r = ddp_broadcast(send, recv, n, (ddp_dtype_t)dt, root, c);
                input(dt, DDP_SUM, seed, root, n, b.ref);
                check_out(&b, "broadcast", dt, DDP_SUM, n, mode, r, recv, b.ref, n * es, ddp_comm_last_error(c));
                if (r) goto out;
            }
    ok_all &= ok(!b.fails, "p=%d: reduce-scatter, all-gather, broadcast, every dtype x size x placement%s%s", p,
                 b.fails ? ": " : "", b.first);
out:
    if (b.fails && b.first[0] && ok_all) ok(0, "p=%d: %s", p, b.first);
    t_where("ddp_comm_mem_free");
    ok(ddp_comm_mem_free(c, b.wa) == DDP_SUCCESS && ddp_comm_mem_free(c, b.wb) == DDP_SUCCESS,
       "p=%d: both windows freed: %s", p, ddp_comm_last_error(c));
    ddp_comm_destroy(c);
    free(b.pa); free(b.pb); free(b.tmp); free(b.ref);
    return 0;
}

/* One window, one all-reduce in place and one all-gather on it, checked (refused, fallback). */
static int one_window(int rank, int p, void *arg) {
    const size_t n = 100003;   /* big enough for the two-step (zero-copy) path */
    const size_t cap = n * 4 * (size_t)p;
    const char *what = (const char *)arg;
    unsigned char *w, *tmp = (unsigned char *)malloc(cap), *ref = (unsigned char *)malloc(cap);
    ddp_comm_t *c;
    ddp_result_t r;
    int q;
    if (!tmp || !ref) t_bail("malloc");
    if (!strcmp(what, "refused") && rank == 1) setenv("DDP_SHM_WINDOW", "0", 1);
    if (!(c = init_comm(rank, p, 30000, 0))) return 1;
    r = ddp_comm_mem_alloc(c, cap, (void **)&w);
    if (!ok(r == DDP_SUCCESS && w, "%s: ddp_comm_mem_alloc -> %s %s", what, ddp_strerror(r), ddp_comm_last_error(c)))
        return 1;
    ok(w[0] == 0 && w[cap - 1] == 0, "%s: the memory is zero-filled", what);
    input(DDP_INT32, DDP_SUM, 7, rank, n, w);
    r = ddp_all_reduce(w, w, n, DDP_INT32, DDP_SUM, c);   /* exact: the ring's order gives the same */
    fold_ref(DDP_INT32, DDP_SUM, 7, p, n, 0, n, tmp, ref);
    ok(r == DDP_SUCCESS && !memcmp(w, ref, n * 4), "%s: all-reduce in place on it: %s %s", what, ddp_strerror(r),
       ddp_comm_last_error(c));
    input(DDP_FLOAT32, DDP_SUM, 8, rank, n, w + (size_t)rank * n * 4);
    r = ddp_all_gather(w + (size_t)rank * n * 4, w, n, DDP_FLOAT32, c);
    for (q = 0; q < p; q++) input(DDP_FLOAT32, DDP_SUM, 8, q, n, ref + (size_t)q * n * 4);
    ok(r == DDP_SUCCESS && !memcmp(w, ref, cap), "%s: all-gather in place on it: %s", what, ddp_strerror(r));
    r = ddp_comm_mem_free(c, w);
    ok(r == DDP_SUCCESS, "%s: freed: %s", what, ddp_strerror(r));
    ddp_comm_destroy(c);
    free(tmp);
    free(ref);
    return 0;
}

static int mismatch(int rank, int p, void *arg) {
    ddp_comm_t *c;
    void *w = (void *)1;
    ddp_result_t r;
    (void)arg;
    if (!(c = init_comm(rank, p, 30000, 1))) return 1;
    r = ddp_comm_mem_alloc(c, 4096 * (size_t)(rank + 1), &w);
    ok(r == DDP_ERR_MISMATCH && !w && strstr(ddp_comm_last_error(c), "different sizes"),
       "mismatch: sizes differ -> %s, ptr %p: %s", ddp_strerror(r), w, ddp_comm_last_error(c));
    r = ddp_comm_mem_alloc(c, 1 << 20, &w);
    ok(r == DDP_SUCCESS && w, "mismatch: a matching call after it works: %s", ddp_strerror(r));
    ok(ddp_comm_mem_free(c, w) == DDP_SUCCESS, "mismatch: freed");
    ddp_comm_destroy(c);
    return 0;
}

static int inflight(int rank, int p, void *arg) {
    const size_t n = 1 << 18;
    ddp_comm_t *c;
    float *w, *ref = (float *)malloc(n * 4), *tmp = (float *)malloc(n * 4);
    ddp_request_t req;
    ddp_result_t r;
    double deadline;
    (void)arg;
    if (!(c = init_comm(rank, p, 30000, 1))) return 1;
    if (!ok(ddp_comm_mem_alloc(c, n * 4, (void **)&w) == DDP_SUCCESS, "inflight: alloc")) return 1;
    input(DDP_FLOAT32, DDP_SUM, 9, rank, n, w);
    fold_ref(DDP_FLOAT32, DDP_SUM, 9, p, n, 0, n, (unsigned char *)tmp, (unsigned char *)ref);
    if (rank == 0) {
        r = ddp_all_reduce_async(w, w, n, DDP_FLOAT32, DDP_SUM, c, &req);
        ok(r == DDP_SUCCESS, "inflight: async all-reduce issued");
        /* Rank 1 has not called it: it cannot have finished. */
        r = ddp_comm_mem_free(c, w);
        ok(r == DDP_ERR_INVALID_USAGE && strstr(ddp_comm_last_error(c), "all_reduce") &&
           strstr(ddp_comm_last_error(c), "in flight"),
           "inflight: free while it runs -> %s: %s", ddp_strerror(r), ddp_comm_last_error(c));
        __atomic_store_n(&S->go, 1, __ATOMIC_SEQ_CST);
        r = ddp_wait(&req);
    } else {
        deadline = t_now() + 60;
        while (!__atomic_load_n(&S->go, __ATOMIC_SEQ_CST) && t_now() < deadline) t_sleep_ms(1);
        r = ddp_all_reduce(w, w, n, DDP_FLOAT32, DDP_SUM, c);
    }
    ok(r == DDP_SUCCESS && !memcmp(w, ref, n * 4), "inflight: the all-reduce is right (nothing was freed): %s",
       ddp_strerror(r));
    ok(ddp_comm_mem_free(c, w) == DDP_SUCCESS, "inflight: free after ddp_wait: %s", ddp_comm_last_error(c));
    ddp_comm_destroy(c);
    free(ref);
    free(tmp);
    return 0;
}

#define VICTIM 1
static int killed(int rank, int p, void *arg) {
    const size_t n = 1 << 20;
    ddp_comm_t *c;
    float *w;
    ddp_result_t r = DDP_SUCCESS;
    int i;
    (void)arg;
    if (!(c = init_comm(rank, p, 20000, 1))) return 1;
    if (!ok(ddp_comm_mem_alloc(c, n * 4, (void **)&w) == DDP_SUCCESS, "killed: alloc")) return 1;
    for (i = 0; i < 100000 && r == DDP_SUCCESS; i++) {
        if (rank == VICTIM && i == 3) raise(SIGKILL);
        w[0] = 1.0f;
        r = ddp_all_reduce(w, w, n, DDP_FLOAT32, DDP_SUM, c);
    }
    snprintf(S->msg[rank], sizeof S->msg[rank], "%s", ddp_comm_last_error(c));
    ok(r == DDP_ERR_REMOTE && t_mentions_rank(ddp_comm_last_error(c), VICTIM),
       "killed: rank %d's all-reduce on windows -> %s naming rank %d: %s", rank, ddp_strerror(r), VICTIM,
       ddp_comm_last_error(c));
    w[n - 1] = 2.0f;   /* our own window is still ours */
    ok(ddp_comm_mem_free(c, w) == DDP_SUCCESS, "killed: free after the failure");
    ddp_comm_destroy(c);
    return 0;
}

int main(void) {
    int p, bad;
    t_init();
    S = (reg_shared_t *)t_shm_user(sizeof *S);
    clear_env();
    if (t_selected("matrix")) {
        /* Small chunks: a big buffer takes many (and the zero-copy chunk several of them). */
        setenv("DDP_SHM_CHUNK", "8192", 1);
        setenv("DDP_SHM_SMALL_MAX", "64", 1);
        setenv("DDP_SHM_ZC_MIN", "128", 1);   /* the zero-copy all-reduce from small sizes on */
        for (p = 1; p <= MAX_P; p++) {
            bad = t_run_ranks(p, matrix, NULL, 600);
            ok(!bad, "matrix p=%d: every rank exited cleanly%s%s", p, bad ? ": " : "", bad ? t_last_why : "");
        }
        {   /* One knob set at a time, the matrix at two world sizes each. */
            static const struct { const char *env, *val, *what; int p0, p1; } knob[] = {
                /* odd counts end pieces mid-slice, slices span many */
                {"DDP_SHM_ZC_PIECE", "320", "zero-copy pieces of 320 bytes", 2, 3},
                /* streaming stores into the peers' outputs, pieces of DDP_SHM_CHUNK */
                {"DDP_SHM_STREAM_MIN", "64", "streaming stores from 64 bytes", 2, 3},
                {"DDP_SHM_ZC_PUSH", "0", "DDP_SHM_ZC_PUSH=0 (the pulling zero-copy all-reduce)", 2, 5},
                /* registered inputs read in place, outputs through staging */
                {"DDP_SHM_ZC_MIN", "1G", "below DDP_SHM_ZC_MIN", 2, 5},
            };
            const char *zc_min = "128";   /* restored after each knob */
            size_t k;
            for (k = 0; k < sizeof knob / sizeof knob[0]; k++) {
                int two[2];
                two[0] = knob[k].p0;
                two[1] = knob[k].p1;
                setenv(knob[k].env, knob[k].val, 1);
                for (p = 0; p < 2; p++) {
                    bad = t_run_ranks(two[p], matrix, NULL, 600);
                    ok(!bad, "matrix p=%d, %s: every rank exited cleanly%s%s", two[p], knob[k].what,
                       bad ? ": " : "", bad ? t_last_why : "");
                }
                if (strcmp(knob[k].env, "DDP_SHM_ZC_MIN") == 0) setenv("DDP_SHM_ZC_MIN", zc_min, 1);
                else unsetenv(knob[k].env);
            }
        }
        /* The defaults (zero-copy above DDP_SHM_SMALL_MAX: 8 KiB at p = 3) at p = 3: the matrix's
         * sizes fall on both sides of it. */
        clear_env();
        setenv("DDP_SHM_CHUNK", "8192", 1);
        bad = t_run_ranks(3, matrix, NULL, 600);
        ok(!bad, "matrix p=3, default thresholds: every rank exited cleanly%s%s", bad ? ": " : "",
           bad ? t_last_why : "");
        clear_env();
    }
    if (t_selected("refused")) {
        bad = t_run_ranks(3, one_window, (void *)"refused", 120);
        ok(!bad, "refused: every rank exited cleanly %s", bad ? t_last_why : "");
    }
    if (t_selected("fallback")) {
        setenv("DDP_SHM_COLL", "0", 1);
        bad = t_run_ranks(3, one_window, (void *)"DDP_SHM_COLL=0", 120);
        ok(!bad, "fallback DDP_SHM_COLL=0: every rank exited cleanly %s", bad ? t_last_why : "");
        clear_env();
        setenv("DDP_TRANSPORT", "tcp", 1);
        bad = t_run_ranks(2, one_window, (void *)"tcp", 120);
        ok(!bad, "fallback tcp: every rank exited cleanly %s", bad ? t_last_why : "");
        clear_env();
    }
    if (t_selected("mismatch")) {
        bad = t_run_ranks(2, mismatch, NULL, 120);
        ok(!bad, "mismatch: every rank exited cleanly %s", bad ? t_last_why : "");
    }
    if (t_selected("inflight")) {
        S->go = 0;
        bad = t_run_ranks(2, inflight, NULL, 120);
        ok(!bad, "inflight: every rank exited cleanly %s", bad ? t_last_why : "");
    }
    if (t_selected("killed")) {
        bad = t_run_ranks(3, killed, NULL, 120);
        ok(t_last_run.code[VICTIM] == SIGKILL && !t_last_run.exited[VICTIM] && bad == 1,
           "killed: only the victim died (of SIGKILL); the others exited cleanly %s", bad != 1 ? t_last_why : "");
    }
    return t_done();
}
