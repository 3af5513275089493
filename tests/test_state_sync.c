/* SPDX-License-Identifier: MIT (see LICENSE) */
/* tests/test_state_sync.c — live state from peers (ddp_state.h): ddp_state_sync moves the
 * senders' state into the receivers' buffers, a share from each sender, verified. TAP.
 *
 *   build/test_state_sync          (DDP_TEST_ONLY=<scenario> runs one)
 *
 * Scenarios:
 *   digest   XXH64 against the specification's published vectors (the private _ddp_xxh64);
 *            ddp_state_digest against its definition (block digests seeded by index, summed),
 *            the same however the bytes are split into buffers (0-byte buffers included),
 *            different for one flipped bit, the empty state.
 *   sync     senders 1..3 x receivers 1..2 (world sizes 2..5), tcp and shm: a state of odd-sized
 *            buffers (a 0-byte one among them, ~1.3 MiB, many pieces of 64 KiB; one run of 150
 *            small buffers, more than one group holds; one at the default piece size; one
 *            without the hashing thread, the fallback) lands in the receivers' buffers bit for
 *            bit (memcmp against the pattern, and the digest the receivers report is the
 *            senders' ddp_state_digest); the report's counts.
 *   threads  ranks as threads of one process (transports/ddp_threads.h): 2 senders, 2 receivers.
 *   edges    a state of 0 bytes (no buffers; only 0-byte ones); senders == size (nothing to
 *            receive, check_senders still compares); a state smaller than one block.
 *   refuse   senders out of range, NULL bufs, a NULL ptr with bytes, on ONE rank: every rank
 *            fails with DDP_ERR_INVALID_ARGUMENT naming it; a rank with a different buffer size,
 *            another buffer count, the same total split differently, other options: every rank
 *            fails with DDP_ERR_MISMATCH naming it (and the buffer whose size differs); nothing
 *            moved (the receivers' buffers untouched); the communicator still works after (a
 *            sync that succeeds).
 *   senders  check_senders: a sender whose replica differs in one byte fails the call on every
 *            rank naming it, before anything moves.
 *   corrupt  a byte of one share changed in transit (this test's hook, _DDP_STATE_TEST_RECEIVED,
 *            compiled into this program only): every rank fails with DDP_ERR_MISMATCH naming the
 *            share, its sender and the receiver; tcp and shm; also without the hashing thread.
 *   dies     a receiver SIGKILLs itself after its first piece: the senders fail (no hang) naming
 *            it, and so does the other receiver's call; a sender does the same after its first
 *            piece went out: the receiver fails naming it; tcp and shm (_DDP_STATE_TEST_SENT).
 * tests/state_sync_mutants.sh disables each check in turn (the share digests not compared, what
 * arrived not hashed, the senders' digests not compared, the sizes not compared) and shows that
 * corrupt, senders and refuse then fail.
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stddef.h>
#include <signal.h>
#include <unistd.h>
/* The test hook: what a receiver got, before it is hashed (ddp_state.h calls it in test builds). */
static void t_state_received(int share, uint64_t off, unsigned char *p, size_t n);
#define _DDP_STATE_TEST_RECEIVED(share, off, p, n) t_state_received(share, off, p, n)
/* After a sender's piece went out. */
static void t_state_sent(uint64_t pieces);
#define _DDP_STATE_TEST_SENT(pieces) t_state_sent(pieces)
/* 1: as if no hashing thread could be started (the transfer hashes each piece itself). */
static int g_no_thread;
#define _DDP_STATE_TEST_NO_THREAD g_no_thread
#define DDP_IMPLEMENTATION
#include "ddp.h"
#include "transports/ddp_tcp.h"
#include "transports/ddp_shm.h"
#include "transports/ddp_threads.h"
#include "tests/ddp_test.h"

#include <pthread.h>

#define MAXB 160
static const char *g_mode = "tcp";

/* The hook's orders (set in the rank before the call). */
static int g_corrupt_share = -1, g_die_after_first = 0;
static void t_state_received(int share, uint64_t off, unsigned char *p, size_t n) {
    (void)off;
    if (g_corrupt_share == share && n) { p[n / 2] ^= 0x10; g_corrupt_share = -1; }
    if (g_die_after_first) kill(getpid(), SIGKILL);
}
static void t_state_sent(uint64_t pieces) {
    if (g_die_after_first && pieces == 1) kill(getpid(), SIGKILL);
}

static void set_mode(void) {
    unsetenv("DDP_SHM_COLL");
    setenv("DDP_TRANSPORT", g_mode, 1);
}

static ddp_comm_t *init_comm(int rank, int p) {
    ddp_comm_desc_t d;
    set_mode();
    t_desc(&d, 20000);
    d.log_level = 1;
    return t_comm_init(rank, p, &d);
}

/* A state layout: n buffers of these sizes, byte j of buffer b = pattern(b, j). */
typedef struct {
    int n;
    size_t sizes[MAXB];
    size_t piece;
    int check;
} layout_t;

static unsigned char pattern(int b, size_t j) {
    return (unsigned char)(t_mix64(((uint64_t)b << 40) ^ j ^ 0x5eed) >> 17);
}

/* Allocates the buffers; fills them with the pattern (a sender) or 0xA5 (a receiver). */
static void state_make(const layout_t *L, ddp_state_buf_t *bufs, int fill) {
    int b;
    size_t j;
    for (b = 0; b < L->n; b++) {
        bufs[b].bytes = L->sizes[b];
        bufs[b].ptr = L->sizes[b] ? malloc(L->sizes[b]) : NULL;
        for (j = 0; j < L->sizes[b]; j++) ((unsigned char *)bufs[b].ptr)[j] = fill ? pattern(b, j) : 0xA5;
    }
}

static void state_free(ddp_state_buf_t *bufs, int n) {
    int b;
    for (b = 0; b < n; b++) free(bufs[b].ptr);
}

/* 1 when every buffer holds the pattern; else says where it does not. */
static int state_is_pattern(const ddp_state_buf_t *bufs, int n, char *why, size_t cap) {
    int b;
    size_t j;
    for (b = 0; b < n; b++)
        for (j = 0; j < bufs[b].bytes; j++)
            if (((const unsigned char *)bufs[b].ptr)[j] != pattern(b, j)) {
                snprintf(why, cap, "buffer %d byte %zu: %02x, expected %02x", b, j,
                         ((const unsigned char *)bufs[b].ptr)[j], pattern(b, j));
                return 0;
            }
    snprintf(why, cap, "all %d buffers", n);
    return 1;
}

static uint64_t layout_total(const layout_t *L) {
    uint64_t t = 0;
    int b;
    for (b = 0; b < L->n; b++) t += L->sizes[b];
    return t;
}

/* ---- sync: every rank checks its own side ---- */
typedef struct { const layout_t *L; int senders; } sync_arg_t;

static int sync_rank(int rank, int p, void *argp) {
    const sync_arg_t *a = (const sync_arg_t *)argp;
    const layout_t *L = a->L;
    ddp_state_buf_t bufs[MAXB];
    ddp_state_opts_t o;
    ddp_state_report_t rep;
    ddp_comm_t *c = init_comm(rank, p);
    const int sender = rank < a->senders;
    const uint64_t total = layout_total(L);
    uint64_t want;
    ddp_result_t e;
    char why[160];
    if (!c) return 1;
    state_make(L, bufs, sender);
    {   /* the digest the senders hold (computed here, from the pattern, on every rank) */
        ddp_state_buf_t ref[MAXB];
        state_make(L, ref, 1);
        want = ddp_state_digest(ref, L->n);
        state_free(ref, L->n);
    }
    memset(&o, 0, sizeof o);
    o.piece_bytes = L->piece;
    o.check_senders = L->check;
    t_where("ddp_state_sync rank %d of %d (%d senders)", rank, p, a->senders);
    e = ddp_state_sync(c, a->senders, L->n ? bufs : NULL, L->n, &o, &rep);
    ok(e == DDP_SUCCESS, "[%s] %d senders, %d receivers, %llu bytes in %d buffers: rank %d (%s) -> %s %s", g_mode,
       a->senders, p - a->senders, (unsigned long long)total, L->n, rank, sender ? "sender" : "receiver",
       ddp_strerror(e), e ? ddp_comm_last_error(c) : "");
    ok(state_is_pattern(bufs, L->n, why, sizeof why), "[%s] rank %d holds the senders' bytes: %s", g_mode, rank, why);
    ok(rep.bytes == total && rep.senders == a->senders && rep.receivers == p - a->senders,
       "[%s] rank %d: report: %llu bytes, %d senders, %d receivers", g_mode, rank, (unsigned long long)rep.bytes,
       rep.senders, rep.receivers);
    if (!sender) {
        ok(rep.digest == want && ddp_state_digest(bufs, L->n) == want,
           "[%s] receiver %d: reported digest %016llx = the senders' %016llx = its buffers'", g_mode, rank,
           (unsigned long long)rep.digest, (unsigned long long)want);
        ok(rep.moved == total, "[%s] receiver %d received %llu bytes", g_mode, rank, (unsigned long long)rep.moved);
    } else {
        uint64_t lo, hi;
        _ddp_state_share(total, a->senders, rank, &lo, &hi);
        ok(rep.moved == (hi - lo) * (uint64_t)(p - a->senders) && rep.digest == (L->check ? want : 0),
           "[%s] sender %d sent its share ([%llu, %llu)) to each receiver: %llu bytes; digest %016llx", g_mode, rank,
           (unsigned long long)lo, (unsigned long long)hi, (unsigned long long)rep.moved,
           (unsigned long long)rep.digest);
    }
    state_free(bufs, L->n);
    ddp_comm_destroy(c);
    return 0;
}

static void run_sync(const layout_t *L, int senders, int receivers) {
    sync_arg_t a;
    a.L = L;
    a.senders = senders;
    ok(t_run_ranks(senders + receivers, sync_rank, &a, 120) == 0, "[%s] sync %d -> %d: every rank exited cleanly",
       g_mode, senders, receivers);
}

/* ---- refuse: one rank differs ---- */
enum { R_SENDERS0, R_SENDERS_BIG, R_NULL_BUFS, R_NULL_PTR, R_SIZE, R_COUNT, R_SPLIT, R_PIECE, R_NUM };
static const char *const g_refusal[R_NUM] = {"senders = 0", "senders > size", "NULL bufs", "NULL ptr with bytes",
                                              "one buffer 1 byte longer", "one buffer more",
                                              "the same total split differently", "another piece_bytes"};
typedef struct { int kind, odd; } refuse_arg_t;

static int refuse_rank(int rank, int p, void *argp) {
    const refuse_arg_t *a = (const refuse_arg_t *)argp;
    layout_t L;
    ddp_state_buf_t bufs[MAXB];
    ddp_state_opts_t o;
    ddp_state_report_t rep;
    ddp_comm_t *c = init_comm(rank, p);
    const int odd = rank == a->odd, invalid = a->kind <= R_NULL_PTR;
    const ddp_result_t want = invalid ? DDP_ERR_INVALID_ARGUMENT : DDP_ERR_MISMATCH;
    int senders = 2, nb;
    void *keep = NULL;
    ddp_result_t e;
    char why[160];
    if (!c) return 1;
    memset(&L, 0, sizeof L);
    L.n = 3;
    L.sizes[0] = 70000, L.sizes[1] = 33, L.sizes[2] = 90001;
    if (odd && a->kind == R_SIZE) L.sizes[2]++;
    if (odd && a->kind == R_COUNT) L.sizes[L.n++] = 5;
    if (odd && a->kind == R_SPLIT) L.sizes[0]--, L.sizes[1]++;
    state_make(&L, bufs, rank < senders);
    nb = L.n;
    memset(&o, 0, sizeof o);
    if (odd && a->kind == R_PIECE) o.piece_bytes = 128 << 10;
    if (odd && a->kind == R_SENDERS0) senders = 0;
    if (odd && a->kind == R_SENDERS_BIG) senders = p + 1;
    if (odd && a->kind == R_NULL_PTR) keep = bufs[1].ptr, bufs[1].ptr = NULL;
    t_where("ddp_state_sync (%s on rank %d)", g_refusal[a->kind], a->odd);
    e = ddp_state_sync(c, senders, odd && a->kind == R_NULL_BUFS ? NULL : bufs, nb, &o, &rep);
    if (keep) bufs[1].ptr = keep;
    ok(e == want && (odd || t_mentions_rank(ddp_comm_last_error(c), a->odd)) &&
       (a->kind != R_SIZE || strstr(ddp_comm_last_error(c), "buffer 2 is")) &&
       (a->kind != R_SPLIT || strstr(ddp_comm_last_error(c), "buffer 0 is")),
       "[%s] %s on rank %d: rank %d -> %s (want %s): %s", g_mode, g_refusal[a->kind], a->odd, rank, ddp_strerror(e),
       ddp_strerror(want), ddp_comm_last_error(c));
    if (rank >= 2 && !(odd && a->kind >= R_SIZE)) {
        size_t j;
        int b, untouched = 1;
        for (b = 0; b < L.n; b++)
            for (j = 0; j < L.sizes[b]; j++) untouched &= ((unsigned char *)bufs[b].ptr)[j] == 0xA5;
        ok(untouched, "[%s] receiver %d: nothing was written (refused before any data moved)", g_mode, rank);
    }
    ok(rep.bytes == 0 && rep.moved == 0, "[%s] rank %d: the report is zeroed", g_mode, rank);
    state_free(bufs, L.n);
    /* The communicator still works: the same call, everyone agreeing. */
    L.n = 3;
    L.sizes[0] = 70000, L.sizes[1] = 33, L.sizes[2] = 90001;
    state_make(&L, bufs, rank < 2);
    e = ddp_state_sync(c, 2, bufs, L.n, NULL, &rep);
    ok(e == DDP_SUCCESS && state_is_pattern(bufs, L.n, why, sizeof why),
       "[%s] rank %d: after the refusal a sync succeeds: %s %s (%s)", g_mode, rank, ddp_strerror(e),
       e ? ddp_comm_last_error(c) : "", why);
    state_free(bufs, L.n);
    ddp_comm_destroy(c);
    return 0;
}

/* ---- senders: check_senders catches a replica that differs ---- */
static int senders_rank(int rank, int p, void *argp) {
    layout_t L;
    ddp_state_buf_t bufs[MAXB];
    ddp_state_opts_t o;
    ddp_state_report_t rep;
    ddp_comm_t *c = init_comm(rank, p);
    const int odd = *(const int *)argp;
    ddp_result_t e;
    if (!c) return 1;
    memset(&L, 0, sizeof L);
    L.n = 2;
    L.sizes[0] = 200000, L.sizes[1] = 77;
    state_make(&L, bufs, rank < 3);
    if (rank == odd) ((unsigned char *)bufs[1].ptr)[40] ^= 1;   /* its replica: one bit off */
    memset(&o, 0, sizeof o);
    o.check_senders = 1;
    e = ddp_state_sync(c, 3, bufs, L.n, &o, &rep);
    ok(e == DDP_ERR_MISMATCH && t_mentions_rank(ddp_comm_last_error(c), odd) &&
       strstr(ddp_comm_last_error(c), "check_senders"),
       "[%s] check_senders, sender %d's replica differs: rank %d -> %s: %s", g_mode, odd, rank, ddp_strerror(e),
       ddp_comm_last_error(c));
    if (rank == 3)
        ok(((unsigned char *)bufs[0].ptr)[0] == 0xA5, "[%s] the receiver got nothing", g_mode);
    state_free(bufs, L.n);
    ddp_comm_destroy(c);
    return 0;
}

/* ---- corrupt: a share changed in transit ---- */
typedef struct { int senders, victim, share; } corrupt_arg_t;

static int corrupt_rank(int rank, int p, void *argp) {
    const corrupt_arg_t *a = (const corrupt_arg_t *)argp;
    layout_t L;
    ddp_state_buf_t bufs[MAXB];
    ddp_state_opts_t o;
    ddp_state_report_t rep;
    ddp_comm_t *c = init_comm(rank, p);
    const char *m;
    char share[32];
    ddp_result_t e;
    if (!c) return 1;
    memset(&L, 0, sizeof L);
    L.n = 4;
    L.sizes[0] = 300001, L.sizes[1] = 0, L.sizes[2] = 123457, L.sizes[3] = 9;
    state_make(&L, bufs, rank < a->senders);
    memset(&o, 0, sizeof o);
    o.piece_bytes = 64 << 10;
    if (rank == a->victim) g_corrupt_share = a->share;
    e = ddp_state_sync(c, a->senders, bufs, L.n, &o, &rep);
    m = ddp_comm_last_error(c);
    snprintf(share, sizeof share, "share %d", a->share);
    ok(e == DDP_ERR_MISMATCH && strstr(m, share) && t_mentions_rank(m, a->share) && t_mentions_rank(m, a->victim),
       "[%s] share %d corrupted at rank %d: rank %d -> %s: %s", g_mode, a->share, a->victim, rank, ddp_strerror(e), m);
    state_free(bufs, L.n);
    ddp_comm_destroy(c);
    return 0;
}

/* ---- dies: a receiver killed mid-transfer ---- */
typedef struct { int senders, victim; } dies_arg_t;

static int dies_rank(int rank, int p, void *argp) {
    const dies_arg_t *a = (const dies_arg_t *)argp;
    layout_t L;
    ddp_state_buf_t bufs[MAXB];
    ddp_state_opts_t o;
    ddp_state_report_t rep;
    ddp_comm_t *c;
    ddp_result_t e;
    int b;
    memset(&L, 0, sizeof L);
    L.n = 4;
    /* 24 MiB, more than loopback TCP buffers hold: the senders are still sending when it dies */
    for (b = 0; b < L.n; b++) L.sizes[b] = (size_t)(6 << 20) + (size_t)b * 3;
    if (!(c = init_comm(rank, p))) return 1;
    state_make(&L, bufs, rank < a->senders);
    memset(&o, 0, sizeof o);
    o.piece_bytes = 64 << 10;
    if (rank == a->victim) g_die_after_first = 1;
    t_where("ddp_state_sync, rank %d to die", a->victim);
    e = ddp_state_sync(c, a->senders, bufs, L.n, &o, &rep);
    if (a->victim < a->senders)   /* a sender died: every receiver's error names it */
        ok(e != DDP_SUCCESS && (rank < a->senders || t_mentions_rank(ddp_comm_last_error(c), a->victim)),
           "[%s] sender %d died: %s %d -> %s: %s", g_mode, a->victim, rank < a->senders ? "sender" : "receiver", rank,
           ddp_strerror(e), ddp_comm_last_error(c));
    else if (rank < a->senders)
        ok(e != DDP_SUCCESS && t_mentions_rank(ddp_comm_last_error(c), a->victim),
           "[%s] receiver %d died: sender %d -> %s: %s", g_mode, a->victim, rank, ddp_strerror(e),
           ddp_comm_last_error(c));
    else
        ok(e != DDP_SUCCESS, "[%s] receiver %d died: receiver %d -> %s: %s", g_mode, a->victim, rank, ddp_strerror(e),
           ddp_comm_last_error(c));
    state_free(bufs, L.n);
    ddp_comm_destroy(c);
    return 0;
}

/* ---- edges ---- */
static int edges_rank(int rank, int p, void *argp) {
    ddp_comm_t *c = init_comm(rank, p);
    ddp_state_buf_t z[3] = {{NULL, 0}, {NULL, 0}, {NULL, 0}}, small[1];
    unsigned char byte[100];
    ddp_state_opts_t o;
    ddp_state_report_t rep;
    ddp_result_t e;
    int j;
    (void)argp;
    if (!c) return 1;
    e = ddp_state_sync(c, 1, NULL, 0, NULL, &rep);
    ok(e == DDP_SUCCESS && rep.bytes == 0 && rep.moved == 0 && (rank == 0 || rep.digest == ddp_state_digest(NULL, 0)),
       "[%s] no buffers: rank %d -> %s %s", g_mode, rank, ddp_strerror(e), e ? ddp_comm_last_error(c) : "");
    e = ddp_state_sync(c, 2, z, 3, NULL, &rep);
    ok(e == DDP_SUCCESS && rep.bytes == 0, "[%s] three 0-byte buffers (NULL ptrs): rank %d -> %s %s", g_mode, rank,
       ddp_strerror(e), e ? ddp_comm_last_error(c) : "");
    for (j = 0; j < 100; j++) byte[j] = rank < 2 ? (unsigned char)(j * 7) : 0;
    small[0].ptr = byte, small[0].bytes = 100;
    e = ddp_state_sync(c, 2, small, 1, NULL, &rep);
    for (j = 0; j < 100 && byte[j] == (unsigned char)(j * 7); j++) {}
    ok(e == DDP_SUCCESS && j == 100, "[%s] 100 bytes (less than a block: sender 1's share is empty): rank %d -> %s %s",
       g_mode, rank, ddp_strerror(e), e ? ddp_comm_last_error(c) : "");
    memset(&o, 0, sizeof o);
    o.check_senders = 1;
    e = ddp_state_sync(c, p, small, 1, &o, &rep);
    ok(e == DDP_SUCCESS && rep.receivers == 0 && rep.moved == 0 && rep.digest == ddp_state_digest(small, 1),
       "[%s] senders == size, check_senders: rank %d -> %s %s", g_mode, rank, ddp_strerror(e),
       e ? ddp_comm_last_error(c) : "");
    if (rank == 1) byte[3] ^= 1;
    e = ddp_state_sync(c, p, small, 1, &o, &rep);
    ok(e == DDP_ERR_MISMATCH && t_mentions_rank(ddp_comm_last_error(c), 1),
       "[%s] senders == size, rank 1's replica differs: rank %d -> %s: %s", g_mode, rank, ddp_strerror(e),
       ddp_comm_last_error(c));
    ddp_comm_destroy(c);
    return 0;
}

/* ---- threads: ranks as threads of one process (transports/ddp_threads.h) ---- */
#define THR_N 4
typedef struct {
    ddp_comm_t *c;
    ddp_state_buf_t bufs[3];
    ddp_result_t e;
    ddp_state_report_t rep;
} thr_rank_t;

static void *thr_rank(void *arg) {
    thr_rank_t *t = (thr_rank_t *)arg;
    t->e = ddp_state_sync(t->c, 2, t->bufs, 3, NULL, &t->rep);
    return NULL;
}

/* One process (a forked child: the test process itself stays single-threaded for its forks)
 * whose THR_N threads are the ranks: 2 senders, 2 receivers. */
static int threads_run(int rank, int p, void *argp) {
    static const layout_t L = {3, {150001, 0, 98765}, 64 << 10, 0};
    ddp_comm_t *comms[THR_N];
    thr_rank_t t[THR_N];
    pthread_t th[THR_N];
    ddp_comm_desc_t d;
    ddp_result_t e;
    uint64_t want;
    char why[160];
    int r;
    (void)rank, (void)p, (void)argp;
    t_desc(&d, 20000);
    d.log_level = 1;
    e = ddp_comm_init_threads(comms, THR_N, &d);
    if (!ok(e == DDP_SUCCESS, "[threads] init: %s %s", ddp_strerror(e), e ? ddp_last_init_error() : "")) return 1;
    for (r = 0; r < THR_N; r++) {
        t[r].c = comms[r];
        state_make(&L, t[r].bufs, r < 2);
    }
    want = ddp_state_digest(t[0].bufs, L.n);
    for (r = 0; r < THR_N; r++) pthread_create(&th[r], NULL, thr_rank, &t[r]);
    for (r = 0; r < THR_N; r++) pthread_join(th[r], NULL);
    for (r = 0; r < THR_N; r++) {
        ok(t[r].e == DDP_SUCCESS && state_is_pattern(t[r].bufs, L.n, why, sizeof why) &&
           (r < 2 || t[r].rep.digest == want), "[threads] rank %d (%s, transport %s) -> %s %s (%s)", r,
           r < 2 ? "sender" : "receiver", ddp_comm_transport_name(comms[r], (r + 1) % THR_N), ddp_strerror(t[r].e),
           t[r].e ? ddp_comm_last_error(comms[r]) : "", why);
        state_free(t[r].bufs, L.n);
    }
    for (r = THR_N - 1; r >= 0; r--) ddp_comm_destroy(comms[r]);
    return 0;
}

/* ---- digest: local ---- */
static void test_digest(void) {
    static const struct { const char *s; uint64_t seed, want; } v[] = {
        /* XXH64's published values (seed 0 and 5381) */
        {"", 0, UINT64_C(0xef46db3751d8e999)}, {"a", 0, UINT64_C(0xd24ec4f1a98c6e5b)},
        {"abc", 0, UINT64_C(0x44bc2cf5ad770999)}, {"1234", 0, UINT64_C(0xd8316e61d84f6ba4)},
        {"12345678", 0, UINT64_C(0xd2d02f08cf7cfd4a)}, {"123456789012345", 0, UINT64_C(0xc377d78ade001a3c)},
        {"1234567890123456", 0, UINT64_C(0xb61c33dc6c59f270)},
        {"1234567890123456789012345678901", 0, UINT64_C(0x8f367cb873a5376e)},
        {"12345678901234567890123456789012", 0, UINT64_C(0x40fd1aa52d98274c)},
        {"The quick brown fox jumps over the lazy dog", 0, UINT64_C(0x0b242d361fda71bc)},
        {"", 5381, UINT64_C(0xaf382146d5c3cacf)}, {"abc", 5381, UINT64_C(0x19d1c1b5c673451f)},
        {"12345678901234567890123456789012", 5381, UINT64_C(0x38ea26e7c55f8095)}};
    const size_t n = 3 * DDP_STATE_BLOCK_BYTES + 1234;
    unsigned char *buf = (unsigned char *)malloc(n);
    ddp_state_buf_t one, split[6];
    uint64_t sum = 0, d, b;
    size_t i, bad = 0;
    _ddp_xxh64_t h;
    for (i = 0; i < sizeof v / sizeof v[0]; i++) {
        uint64_t got = _ddp_xxh64(v[i].s, strlen(v[i].s), v[i].seed);
        if (got != v[i].want) {
            bad++;
            diag("XXH64(\"%s\", %llu) = %016llx, want %016llx", v[i].s, (unsigned long long)v[i].seed,
                 (unsigned long long)got, (unsigned long long)v[i].want);
        }
    }
    ok(bad == 0, "XXH64: the %zu published vectors", sizeof v / sizeof v[0]);
    for (i = 0; i < n; i++) buf[i] = pattern(0, i);
    _ddp_xxh64_init(&h, 0);   /* streamed in odd pieces = one shot */
    for (i = 0; i < n; i += 1 + i % 61) _ddp_xxh64_update(&h, buf + i, (1 + i % 61 < n - i) ? 1 + i % 61 : n - i);
    ok(_ddp_xxh64_digest(&h) == _ddp_xxh64(buf, n, 0), "XXH64 streamed in pieces of 1..61 bytes = in one call");
    for (b = 0; b * DDP_STATE_BLOCK_BYTES < n; b++) {
        const size_t lo = (size_t)b * DDP_STATE_BLOCK_BYTES;
        const size_t len = n - lo < DDP_STATE_BLOCK_BYTES ? n - lo : DDP_STATE_BLOCK_BYTES;
        sum += _ddp_xxh64(buf + lo, len, b);
    }
    one.ptr = buf, one.bytes = n;
    d = ddp_state_digest(&one, 1);
    {
        unsigned char le[16];
        for (i = 0; i < 8; i++)
            le[i] = (unsigned char)(sum >> (8 * i)), le[8 + i] = (unsigned char)((uint64_t)n >> (8 * i));
        ok(d == _ddp_xxh64(le, 16, 0), "ddp_state_digest = XXH64(sum of the blocks' XXH64 seeded by index, total)");
    }
    split[0].ptr = buf, split[0].bytes = 1;
    split[1].ptr = NULL, split[1].bytes = 0;
    split[2].ptr = buf + 1, split[2].bytes = DDP_STATE_BLOCK_BYTES + 40;
    split[3].ptr = buf + 41 + DDP_STATE_BLOCK_BYTES, split[3].bytes = 0;
    split[4].ptr = buf + 41 + DDP_STATE_BLOCK_BYTES, split[4].bytes = 7;
    split[5].ptr = buf + 48 + DDP_STATE_BLOCK_BYTES, split[5].bytes = n - 48 - DDP_STATE_BLOCK_BYTES;
    ok(ddp_state_digest(split, 6) == d, "the same bytes split into 6 buffers (two of 0 bytes): the same digest");
    buf[n - 1] ^= 0x80;
    ok(ddp_state_digest(&one, 1) != d, "one bit flipped in the last byte: another digest");
    buf[n - 1] ^= 0x80;
    split[0].bytes = 0;
    ok(ddp_state_digest(split, 6) != d, "one byte less: another digest");
    ok(ddp_state_digest(NULL, 0) == ddp_state_digest(split + 1, 1) && ddp_state_digest(NULL, 0) != 0,
       "the empty state: one digest, with or without 0-byte buffers");
    free(buf);
}

int main(void) {
    static const char *const modes[] = {"tcp", "shm"};
    static layout_t odd, many, deflt;
    int m, s, r, b;
    t_init();
    odd.n = 6;   /* ~1.3 MiB, shares across buffer boundaries, 64 KiB pieces */
    odd.sizes[0] = 700001, odd.sizes[1] = 0, odd.sizes[2] = 3, odd.sizes[3] = 65536, odd.sizes[4] = 555555;
    odd.sizes[5] = 17;
    odd.piece = 64 << 10;
    many.n = 150;   /* more segments than one group takes (64 per share) */
    for (b = 0; b < many.n; b++) many.sizes[b] = (size_t)(b % 7 == 3 ? 0 : 1000 + 37 * b);
    many.piece = 0;
    deflt.n = 3;    /* the default piece (4 MiB): 9 MiB in a few pieces; check_senders */
    deflt.sizes[0] = (size_t)5 << 20, deflt.sizes[1] = 11, deflt.sizes[2] = (size_t)4 << 20;
    deflt.check = 1;
    if (t_selected("digest")) test_digest();
    if (t_selected("threads")) {
        diag("--- threads as ranks: 2 senders, 2 receivers in one process");
        unsetenv("DDP_TRANSPORT");
        ok(t_run_ranks(1, threads_run, NULL, 60) == 0, "[threads] the process exited cleanly");
    }
    for (m = 0; m < 2; m++) {
        g_mode = modes[m];
        if (t_selected("sync")) {
            diag("--- [%s] sync: senders 1..3 x receivers 1..2", g_mode);
            for (s = 1; s <= 3; s++)
                for (r = 1; r <= 2; r++) run_sync(&odd, s, r);
            run_sync(&many, 2, 1);
            run_sync(&deflt, 3, 1);
            g_no_thread = 1;   /* the fallback: no hashing thread */
            run_sync(&odd, 2, 2);
            g_no_thread = 0;
        }
        if (t_selected("edges")) {
            diag("--- [%s] edges: empty states, senders == size, less than a block", g_mode);
            ok(t_run_ranks(3, edges_rank, NULL, 60) == 0, "[%s] edges: every rank exited cleanly", g_mode);
        }
        if (t_selected("refuse") && m == 0) {
            refuse_arg_t a;
            diag("--- [%s] refuse: one rank's arguments differ", g_mode);
            for (a.kind = 0; a.kind < R_NUM; a.kind++) {
                a.odd = a.kind % 2 ? 3 : 1;   /* a sender, a receiver */
                ok(t_run_ranks(4, refuse_rank, &a, 60) == 0, "[%s] refuse (%s on rank %d): every rank exited cleanly",
                   g_mode, g_refusal[a.kind], a.odd);
            }
        }
        if (t_selected("senders")) {
            int odd_sender = m ? 2 : 1;
            diag("--- [%s] check_senders", g_mode);
            ok(t_run_ranks(4, senders_rank, &odd_sender, 60) == 0, "[%s] senders: every rank exited cleanly", g_mode);
        }
        if (t_selected("corrupt")) {
            corrupt_arg_t a;
            diag("--- [%s] a share corrupted in transit", g_mode);
            a.senders = 3, a.victim = 3, a.share = 1;
            ok(t_run_ranks(4, corrupt_rank, &a, 60) == 0, "[%s] corrupt: every rank exited cleanly", g_mode);
            a.senders = 2, a.victim = 3, a.share = 0;
            ok(t_run_ranks(4, corrupt_rank, &a, 60) == 0, "[%s] corrupt (2 receivers): every rank exited cleanly",
               g_mode);
            g_no_thread = 1;
            ok(t_run_ranks(4, corrupt_rank, &a, 60) == 0, "[%s] corrupt, no hashing thread: every rank exited cleanly",
               g_mode);
            g_no_thread = 0;
        }
        if (t_selected("dies")) {
            dies_arg_t a;
            diag("--- [%s] a receiver dies mid-transfer", g_mode);
            a.senders = 3, a.victim = 3;
            t_run_ranks(4, dies_rank, &a, 90);
            ok(t_last_run.exited[0] && t_last_run.exited[1] && t_last_run.exited[2] && !t_last_run.timed_out &&
               t_rank_signaled(3, SIGKILL), "[%s] dies: the senders returned (no hang), the victim was killed", g_mode);
            a.senders = 2, a.victim = 2;
            t_run_ranks(4, dies_rank, &a, 90);
            ok(t_last_run.exited[0] && t_last_run.exited[1] && t_last_run.exited[3] && !t_last_run.timed_out &&
               t_rank_signaled(2, SIGKILL), "[%s] dies (2 receivers): the others returned (no hang)", g_mode);
            a.senders = 3, a.victim = 1;   /* a member dies while it sends */
            t_run_ranks(4, dies_rank, &a, 90);
            ok(t_last_run.exited[0] && t_last_run.exited[2] && t_last_run.exited[3] && !t_last_run.timed_out &&
               t_rank_signaled(1, SIGKILL), "[%s] dies (sender 1): the others returned (no hang)", g_mode);
        }
    }
    return t_done();
}
