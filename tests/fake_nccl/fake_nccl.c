/* SPDX-License-Identifier: MIT (see LICENSE) */
/* tests/fake_nccl/fake_nccl.c — a fake NCCL (soname libnccl.so.2) that really moves data between
 * ranks, for machines without a GPU. transports/ddp_nccl.h dlopens it (DDP_NCCL_LIBRARY); it is
 * linked against the fake CUDA runtime (fake_cudart.c) and finds it through RPATH $ORIGIN.
 *
 * THE MODEL
 *   Communicator  A POSIX shared-memory segment named by the ncclUniqueId (ncclGetUniqueId puts a
 *                 random name in it), so the ranks may be processes or threads of one process.
 *                 Every rank opens it with O_CREAT and grows it (under flock) to the size its
 *                 nranks implies; all-zero is the valid initial state, so nobody has to go first.
 *                 It holds, per rank, a slot (a doorbell, an attach flag, the descriptor of the
 *                 rank's current collective round, the split exchange) and a 1 MiB mailbox; and
 *                 a channel per ordered pair of ranks for send/recv. The last rank to attach
 *                 unlinks the name, so nothing is left in /dev/shm even if a rank later dies;
 *                 destroy/abort unlink it too when some rank never arrived (idempotent).
 *   Waiting       Every wait (peers, barrier, channel) sleeps on the waiting rank's own doorbell,
 *                 a futex word in the segment: whoever changes something a rank may wait for
 *                 bumps that rank's doorbell. No spinning, no timeouts: a rank that never comes
 *                 (dead, hung, dropped op) leaves its peers asleep until ncclCommAbort, which
 *                 sets a flag and rings its own doorbell.
 *   Collectives   Enqueued on the given stream (fake_cuda_enqueue) and run when the stream gets
 *                 there, on the stream's worker thread, reading and writing device memory
 *                 through the fake runtime's shadow mappings. A communicator runs its operations
 *                 one at a time in issue order. Each runs in rounds of at most one mailbox:
 *                 every rank writes its contribution and a descriptor (kind, count, dtype, op,
 *                 root, round), a barrier, every rank checks that the descriptors agree and
 *                 reads what it needs, a barrier. Reductions go in rank order 0..n-1 on every
 *                 rank, so all ranks get bitwise identical results. fp16/bf16 reduce through
 *                 fp32, rounded to nearest even after each step. ncclAvg: floating point divides
 *                 each input by nranks before summing; integers sum, then divide (truncating).
 *                 Buffers must be device memory of the fake runtime (else ncclInvalidArgument),
 *                 except the unused ones (non-roots), which may be NULL. In place as NCCL:
 *                 send == recv (all-reduce, broadcast, reduce), send == recv + rank*count
 *                 (all-gather), recv == send + rank*count (reduce-scatter), send == recv +
 *                 root*count (gather), recv == send + root*count (scatter). ncclAlltoAll with
 *                 send == recv is refused (ncclInvalidArgument), as libddp documents for NCCL.
 *                 Count 0 is a no-op that completes at once. Ranks that disagree on a
 *                 collective (kind, count, dtype, op, root) all complete it with the async
 *                 error ncclInvalidUsage instead of exchanging garbage.
 *   Send/recv     Per ordered pair, a channel of one chunk; messages match in order per pair;
 *                 a send completes once the receiver has taken all of it. If count*dtype size
 *                 disagree, both complete with the async error ncclInvalidUsage (the receive
 *                 buffer is left untouched). Outside a group each ncclSend/ncclRecv is its own
 *                 operation (so, as in NCCL, a rank that sends before it receives may wait for
 *                 a peer that does the same).
 *   Groups        ncclGroupStart/End nest, with one depth per thread for all communicators (NCCL:
 *                 "group primitives define the behavior of the current thread"). Calls in
 *                 between, whichever communicator they are for, are checked at once and held
 *                 (NCCL: inside a group an operation may return before it is enqueued), so
 *                 stream work enqueued between an inner End and the outermost one (an event
 *                 record) comes before them. The outermost End issues, per communicator in order
 *                 of first appearance, its collectives in call order, then all of its sends and
 *                 receives as one operation that progresses them together (sending to and
 *                 receiving from the same peer, or itself, cannot deadlock). ncclCommInitRank[Config] and
 *                 ncclCommSplit inside a group run their rendezvous in the background; End
 *                 waits for the blocking ones.
 *   Init/split    Blocking by default. With config->blocking == 0 the call returns
 *                 ncclInProgress and a background thread finishes the rendezvous;
 *                 ncclCommGetAsyncError says ncclInProgress until then (plus one poll, or see
 *                 FAKE_NCCL_INIT_INPROGRESS). ncclCommSplit exchanges (color, key) over the
 *                 parent (a collective; on the calling thread when blocking; the splits of one
 *                 parent exchange in call order), orders the new ranks by key then parent
 *                 rank, and opens a segment named after the parent's, the split's sequence
 *                 number and the color (keeping the parent's /fake_nccl_<pid>_ prefix).
 *                 NCCL_SPLIT_NOCOLOR gives *newcomm = NULL (nonblocking: the exchange finishes
 *                 in the background; the parent's ncclCommGetAsyncError says ncclInProgress
 *                 until it has). ncclCommDestroy of a communicator whose rendezvous never
 *                 ends waits for it: use ncclCommAbort.
 *   Abort         ncclCommAbort may be called from any thread while another thread or a stream
 *                 is inside an operation of that communicator: the waits return at once, the
 *                 operations complete (so events recorded after them complete), their results
 *                 are undefined, and the communicator is freed when its last operation has left.
 *                 It never touches a dead peer's state. ncclCommDestroy waits for the issued
 *                 operations to complete (forever, if a peer is gone: abort from another thread).
 *   Unload        The destructor aborts every live communicator and waits until the streams have
 *                 run every queued item, so no worker thread is in, or will enter, this code
 *                 after dlclose. fork(): the child starts with no communicators (the parent's
 *                 are parked, never touched).
 *   Nonblocking   Collectives, send/recv and ncclGroupEnd return ncclSuccess on nonblocking
 *   comms         communicators too (NCCL may return ncclInProgress there; callers must accept
 *                 both). A collective on a communicator still initialising: ncclInvalidUsage.
 *
 * INJECTION SWITCHES (environment, read when a communicator is created: init or split; they
 * act on the process that has them, so a test sets one in a single forked rank to fail that rank)
 *   FAKE_NCCL_VERSION=V          ncclGetVersion reports V (default 22809; 21805 plays NCCL 2.18.5);
 *                                read at every call. Every function exists whatever V says.
 *   FAKE_NCCL_CALL_FAIL=N        from this rank's N-th operation on, the call itself returns
 *                                ncclRemoteError and enqueues nothing (NCCL refusing a call at
 *                                once because a peer is gone); earlier operations are unaffected
 *                                (one still waiting for a peer waits until ncclCommAbort).
 *   FAKE_NCCL_ABORT_HANG_MS=N    ncclCommAbort sleeps N ms before it aborts (read at each call):
 *                                an abort that does not come back, as a real NCCL's can.
 *   FAKE_NCCL_INIT_FAIL=code     ncclCommInitRank[Config] fails with that ncclResult_t (1 is what
 *                                the real library returns without a GPU). Blocking: returned, and
 *                                *comm = NULL; nonblocking: ncclInProgress, then the async error.
 *                                The rank never joins: its peers' inits stay in progress (blocking:
 *                                never return) until ncclCommAbort, which returns at once.
 *   FAKE_NCCL_INIT_INPROGRESS=N  a nonblocking init/split reports ncclInProgress for the first N
 *                                polls of ncclCommGetAsyncError, and in any case until the peers
 *                                have all arrived (default: until they have, plus one poll).
 *   FAKE_NCCL_ASYNC_ERROR_AFTER=N after N operations have completed on this rank,
 *                                ncclCommGetAsyncError reports FAKE_NCCL_ASYNC_ERROR_CODE
 *                                (default 6, ncclRemoteError), and every later operation never
 *                                completes until ncclCommAbort (a broken NCCL communicator).
 *   FAKE_NCCL_HANG_RANK=r        on the rank r of the communicator, operations are dropped (the
 *                                call returns ncclSuccess, nothing is enqueued: that process is
 *                                "stuck before the call"); its peers wait until aborted.
 *   FAKE_NCCL_HANG_AFTER=N       with HANG_RANK: only from that rank's (N+1)-th operation on.
 *   FAKE_NCCL_FAIL_OP=N          this rank's N-th operation (from 1) fails as a broken NCCL
 *                                operation does: when the stream reaches it, the communicator's
 *                                async error becomes FAKE_NCCL_ASYNC_ERROR_CODE (default 6), then
 *                                it completes without doing its work (output buffers keep their
 *                                contents), so events recorded after it fire; so does every later
 *                                operation, until ncclCommAbort. The shared segment is marked
 *                                broken: whatever a peer is waiting for on it (its matching
 *                                operation, later ones, a split) ends with the async error
 *                                ncclRemoteError on the peer's communicator, as when a real
 *                                peer's connection closes; so the switch may be set on one rank
 *                                only. A peer that is not inside an operation learns of it with
 *                                its next one (nothing is reported while it is idle).
 *   An "operation" is what reaches a stream: a collective, an ncclSend or ncclRecv outside a
 *   group, or all of one communicator's sends and receives of one group. Count-0 collectives are
 *   not operations; operations dropped by HANG_RANK are.
 *   ncclGetLastError names each injected failure: "fake NCCL: operation 3 failed
 *   (FAKE_NCCL_FAIL_OP=3): error 6", "fake NCCL: peer rank 1 failed (FAKE_NCCL_FAIL_OP there):
 *   remote error", "fake NCCL: init failed (FAKE_NCCL_INIT_FAIL=1)", "fake NCCL: asynchronous
 *   error 6 after 2 operations (FAKE_NCCL_ASYNC_ERROR_AFTER)". NCCL's last error is per process
 *   (comm is unused); the fake returns comm's own injected failure when the latest one in the
 *   process was another communicator's (thread ranks sharing a process).
 *
 * Written from the public NCCL documentation and nccl.h's signatures; no NCCL or CUDA header is
 * included. Limits: at most 1024 ranks; dtypes 0..9 (no fp8); ops sum, prod, max, min, avg.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "fake_cuda.h"

#define API FAKE_EXPORT

/* ---------------------------------------------------------------- NCCL's public types */

enum {
    ncclSuccess = 0,
    ncclUnhandledCudaError = 1,
    ncclSystemError = 2,
    ncclInternalError = 3,
    ncclInvalidArgument = 4,
    ncclInvalidUsage = 5,
    ncclRemoteError = 6,
    ncclInProgress = 7
};
#define RC_ABORTED (-1)          /* internal: the wait was cut short by ncclCommAbort */
#define RC_BROKEN (-2)           /* internal: a peer's FAKE_NCCL_FAIL_OP broke the communicator */

enum {
    DT_INT8, DT_UINT8, DT_INT32, DT_UINT32, DT_INT64, DT_UINT64,
    DT_FLOAT16, DT_FLOAT32, DT_FLOAT64, DT_BFLOAT16, DT_COUNT
};
enum { OP_SUM, OP_PROD, OP_MAX, OP_MIN, OP_AVG, OP_COUNT };

#define NCCL_UNIQUE_ID_BYTES 128
typedef struct { char internal[NCCL_UNIQUE_ID_BYTES]; } ncclUniqueId;

/* The head of ncclConfig_t, the only part the fake reads (NCCL_CONFIG_INITIALIZER sets magic). */
struct config_head {
    size_t size;
    unsigned int magic;
    unsigned int version;
    int blocking;
};
#define CONFIG_MAGIC 0xcafebeefu
#define SPLIT_NOCOLOR (-1)

typedef struct comm *ncclComm_t;

/* ---------------------------------------------------------------- the shared segment */

#define MAX_RANKS 1024
#define UID_MAGIC "fake-nccl-uid-1"
#define NAME_LEN 64
#define CHAN_HEADER 64

struct bell {                      /* a rank sleeps on seq; whoever changes its world bumps it */
    _Atomic uint32_t seq;
    _Atomic uint32_t sleepers;     /* lets a ringer skip the futex syscall when nobody sleeps */
};

struct barrier {
    _Atomic uint32_t count;
    _Atomic uint32_t gen;
};

struct op_desc {                   /* what a rank is doing this round: must agree on all ranks */
    int32_t kind, dtype, redop, root;
    uint64_t count, round;
};

struct slot {
    _Alignas(64) struct bell bell;
    _Atomic uint32_t attached;
    int32_t pid;                   /* who holds the slot: for a human reading the segment */
    struct op_desc desc;
    int32_t split_color, split_key;
};

struct seg_header {
    _Atomic int32_t nranks;        /* the first rank to attach sets it; the others compare */
    _Atomic uint32_t attached;
    _Atomic int32_t broken_by;     /* 1 + the rank whose FAKE_NCCL_FAIL_OP fired; 0: none */
    struct barrier coll;           /* collectives, on stream workers */
    struct barrier boot;           /* host-side exchanges (split) */
};

struct chan {                      /* one per ordered pair (src, dst); data follows the header */
    _Atomic uint32_t posted, consumed;
    _Atomic uint32_t mismatch;     /* set by the receiver, read and cleared by the sender */
    uint32_t len;                  /* bytes in the posted chunk */
    uint64_t msg_bytes;            /* bytes in the whole message */
};

struct layout {
    size_t slots_off, mail_off, mail_bytes, chan_off, chan_bytes, chan_stride, total;
};

static size_t round_up(size_t v, size_t a) {
    return (v + a - 1) / a * a;
}

/* The same on every rank, from nranks alone. Big worlds get smaller chunks: the segment is
 * sparse (pages are used only when touched), but its address range is still mapped. */
static void layout_of(int n, struct layout *L) {
    size_t un = (size_t)n;
    L->mail_bytes = n <= 64 ? (size_t)1 << 20 : (size_t)256 << 10;
    L->chan_bytes = n <= 16 ? (size_t)64 << 10 : n <= 64 ? (size_t)16 << 10 : (size_t)1 << 10;
    L->chan_stride = CHAN_HEADER + L->chan_bytes;
    L->slots_off = 4096;
    L->mail_off = round_up(L->slots_off + un * sizeof(struct slot), 4096);
    L->chan_off = L->mail_off + un * L->mail_bytes;
    L->total = round_up(L->chan_off + un * un * L->chan_stride, 4096);
}

/* ---------------------------------------------------------------- communicators */

struct comm {
    struct comm *next;           /* g.comms */
    int refs;                    /* g.mu: the handle, each queued operation, each user inside */
    int handle_live;             /* g.mu: not yet destroyed or aborted */
    pthread_mutex_t mu;          /* the fields below marked (mu) */
    pthread_cond_t cv;           /* turns, finalize, abort, split turns (mu) */
    atomic_int aborted;
    atomic_int async_error;
    atomic_int ready;            /* the rendezvous is over (init_result says how it went) */
    int init_result;
    int rank, nranks, device, blocking;
    char name[NAME_LEN];
    char *seg;                   /* (mu) to publish; then read-only */
    struct layout L;
    char **srcs;                 /* nranks mailbox pointers, for reductions */
    /* The background rendezvous (nonblocking init/split) or NOCOLOR split exchange. */
    pthread_mutex_t task_mu;
    pthread_t task;
    atomic_int task_running;     /* started and not joined (changed under task_mu) */
    atomic_int task_done;
    void (*task_fn)(struct comm *);
    /* A split child: its parent (a reference), which split of the parent, color and key. */
    struct comm *parent;
    uint64_t split_seq;
    int color, key;
    /* A nonblocking NOCOLOR split of this communicator, exchanging on its task. */
    uint64_t nocolor_seq;
    int nocolor_key;
    /* ncclCommGetAsyncError's ncclInProgress rule for nonblocking init (mu). */
    int report_polls;            /* 1: a nonblocking init or split, the rule applies */
    long polls, polls_after_ready, inprogress_polls;
    /* Operations (mu). */
    uint64_t calls;              /* operations issued or dropped: the injections count these */
    uint64_t issued, executed;   /* stream operations: the next one runs when executed == seq */
    uint64_t ops_done;           /* completed, for FAKE_NCCL_ASYNC_ERROR_AFTER */
    char last_error[256];        /* the latest injected failure's text (mu), for ncclGetLastError */
    uint64_t splits, split_turn; /* splits called / finished their exchange on this parent */
    int finalizing;
    uint32_t coll_gen, boot_gen; /* barrier generations this rank has passed */
    /* Injections. */
    long async_error_after, hang_after, fail_op, call_fail;
    int hang_rank, async_error_code, init_fail;
};

enum op_kind {
    OP_INIT = 1,       /* a group's pending init/split: wait for it at ncclGroupEnd */
    OP_ALL_REDUCE, OP_REDUCE_SCATTER, OP_ALL_GATHER, OP_BROADCAST, OP_REDUCE,
    OP_ALL_TO_ALL, OP_GATHER, OP_SCATTER,
    OP_P2P             /* one or more sends and receives progressed together */
};

struct p2p {
    int is_send, peer;
    char *buf;                   /* shadow */
    size_t bytes, off;
    uint64_t chunks_left;
    int started, done, mismatch;
    void *stream;
};

struct op {
    struct op *next;             /* a group's held list */
    enum op_kind kind;
    struct comm *comm;           /* holds a reference */
    void *stream;
    const char *send;            /* shadow addresses; NULL where this rank does not use them */
    char *recv;
    size_t count;
    int dtype, redop, root;
    uint64_t seq;
    uint64_t number;             /* this rank's operation count, from 1 (FAKE_NCCL_FAIL_OP) */
    int broken;                  /* FAKE_NCCL_ASYNC_ERROR_AFTER: never completes until abort */
    int fail;                    /* FAKE_NCCL_FAIL_OP: fails, and so does every later one */
    struct p2p *p2p;
    int np2p;
};

static struct {
    pthread_mutex_t mu;          /* comms, refs, handle_live, last_error */
    struct comm *comms;
    struct comm *parked;         /* inherited by a forked child: never touched */
    char last_error[256];
    const struct comm *last_error_comm;   /* an injected failure's communicator (compared only) */
} g = {.mu = PTHREAD_MUTEX_INITIALIZER};

static _Thread_local struct {
    int depth;
    struct op *head, *tail;
} tl_group;

/* ---------------------------------------------------------------- small helpers */

static long env_long(const char *name, long def) {
    const char *s = getenv(name);
    char *end;
    long v;
    if (!s || !*s) return def;
    errno = 0;
    v = strtol(s, &end, 10);
    return errno || *end ? def : v;
}

static int set_error(int rc, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int set_error(int rc, const char *fmt, ...) {
    va_list ap;
    pthread_mutex_lock(&g.mu);
    va_start(ap, fmt);
    vsnprintf(g.last_error, sizeof g.last_error, fmt, ap);
    va_end(ap);
    g.last_error_comm = NULL;
    pthread_mutex_unlock(&g.mu);
    return rc;
}

/* An injected failure of communicator c: its text becomes the last error, and stays c's own
 * (ncclGetLastError(c)) even if another communicator of this process fails after it. Only the
 * first injected failure of c is kept: later ones are its consequences. */
struct comm;
static void comm_note_error(struct comm *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static size_t dtype_size(int dtype) {
    static const size_t sizes[DT_COUNT] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2};
    return dtype >= 0 && dtype < DT_COUNT ? sizes[dtype] : 0;
}

static void futex_wait(_Atomic uint32_t *word, uint32_t val) {
    syscall(SYS_futex, (void *)word, FUTEX_WAIT, val, NULL, NULL, 0);
}

static void futex_wake_all(_Atomic uint32_t *word) {
    syscall(SYS_futex, (void *)word, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

/* ---------------------------------------------------------------- segment access */

static struct seg_header *seg_header(const struct comm *c) {
    return (struct seg_header *)c->seg;
}

static struct slot *seg_slot(const struct comm *c, int r) {
    return (struct slot *)(c->seg + c->L.slots_off) + r;
}

static char *seg_mailbox(const struct comm *c, int r) {
    return c->seg + c->L.mail_off + (size_t)r * c->L.mail_bytes;
}

static struct chan *seg_chan(const struct comm *c, int src, int dst) {
    return (struct chan *)(c->seg + c->L.chan_off +
                           ((size_t)src * (size_t)c->nranks + (size_t)dst) * c->L.chan_stride);
}

static char *chan_data(struct chan *ch) {
    return (char *)ch + CHAN_HEADER;
}

static void bell_ring(struct bell *b) {
    atomic_fetch_add(&b->seq, 1);
    if (atomic_load(&b->sleepers)) futex_wake_all(&b->seq);
}

static void ring_rank(const struct comm *c, int r) {
    bell_ring(&seg_slot(c, r)->bell);
}

static void ring_all(const struct comm *c) {
    int r;
    for (r = 0; r < c->nranks; r++) ring_rank(c, r);
}

/* Sleep until the doorbell moves past `seen`. The ringer bumps seq before it looks at sleepers,
 * and we count ourselves a sleeper before the kernel compares seq: one of us sees the other. */
static void bell_sleep(struct bell *b, uint32_t seen) {
    atomic_fetch_add(&b->sleepers, 1);
    futex_wait(&b->seq, seen);
    atomic_fetch_sub(&b->sleepers, 1);
}

typedef int (*wait_pred)(const struct comm *c, const void *ctx);

/* Wait on c's segment until done(c, ctx) holds. 0, or RC_ABORTED when c or *also_stop (a split
 * child waiting on its parent's segment) is aborted, or RC_BROKEN when a rank's
 * FAKE_NCCL_FAIL_OP broke the communicator (as a real NCCL's wait ends when a peer's connection
 * closes). */
static int seg_wait(const struct comm *c, atomic_int *also_stop, wait_pred done, const void *ctx) {
    struct bell *b = &seg_slot(c, c->rank)->bell;
    for (;;) {
        uint32_t seen = atomic_load(&b->seq);
        if (done(c, ctx)) return 0;
        if (atomic_load(&((struct comm *)c)->aborted) || (also_stop && atomic_load(also_stop)))
            return RC_ABORTED;
        if (atomic_load(&seg_header(c)->broken_by)) return RC_BROKEN;
        bell_sleep(b, seen);
    }
}

struct barrier_ctx {
    struct barrier *b;
    uint32_t gen;
};

static int barrier_passed(const struct comm *c, const void *ctx) {
    const struct barrier_ctx *x = ctx;
    (void)c;
    return atomic_load(&x->b->gen) != x->gen;
}

/* A generation barrier over all ranks. The last to arrive resets the count before it opens the
 * next generation, so nobody can arrive early at the next barrier and be counted here. */
static int barrier_wait(const struct comm *c, atomic_int *also_stop, struct barrier *b, uint32_t *gen) {
    struct barrier_ctx x;
    int rc;
    x.b = b;
    x.gen = *gen;
    if (atomic_fetch_add(&b->count, 1) + 1 == (uint32_t)c->nranks) {
        atomic_store(&b->count, 0);
        atomic_store(&b->gen, x.gen + 1);
        ring_all(c);
    } else if ((rc = seg_wait(c, also_stop, barrier_passed, &x)) != 0) {
        return rc;
    }
    *gen = x.gen + 1;
    return 0;
}

/* ---------------------------------------------------------------- registry and references */

static struct comm *comm_acquire(ncclComm_t handle) {
    struct comm *c;
    if (!handle) return NULL;
    pthread_mutex_lock(&g.mu);
    for (c = g.comms; c; c = c->next)
        if (c == handle && c->handle_live) {
            c->refs++;
            break;
        }
    pthread_mutex_unlock(&g.mu);
    return c;
}

static void comm_release(struct comm *c);

/* The segment is left in /dev/shm only while some rank has not attached; then anyone leaving
 * removes it (shm_unlink is idempotent). Once all attached, the last one already unlinked it,
 * and unlinking again could remove a new segment made from a reused unique id. */
static void comm_free(struct comm *c) {
    if (c->seg) {
        if (atomic_load(&seg_header(c)->attached) < (uint32_t)c->nranks) shm_unlink(c->name);
        munmap(c->seg, c->L.total);
    }
    if (c->parent) comm_release(c->parent);
    free(c->srcs);
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->cv);
    pthread_mutex_destroy(&c->task_mu);
    free(c);
}

static void comm_release(struct comm *c) {
    struct comm **pp;
    int last;
    pthread_mutex_lock(&g.mu);
    last = --c->refs == 0;
    if (last)
        for (pp = &g.comms; *pp; pp = &(*pp)->next)
            if (*pp == c) {
                *pp = c->next;
                break;
            }
    pthread_mutex_unlock(&g.mu);
    if (last) comm_free(c);
}

/* Give up the handle's reference (destroy or abort, whichever comes first). */
static void comm_release_handle(struct comm *c) {
    int had;
    pthread_mutex_lock(&g.mu);
    had = c->handle_live;
    c->handle_live = 0;
    pthread_mutex_unlock(&g.mu);
    if (had) comm_release(c);
}

static struct comm *comm_new(int nranks, int rank, int blocking) {
    struct comm *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, NULL);
    pthread_mutex_init(&c->task_mu, NULL);
    c->nranks = nranks;
    c->rank = rank;
    c->blocking = blocking;
    if (cudaGetDevice(&c->device) != 0) c->device = 0;
    c->async_error_after = env_long("FAKE_NCCL_ASYNC_ERROR_AFTER", -1);
    c->async_error_code = (int)env_long("FAKE_NCCL_ASYNC_ERROR_CODE", ncclRemoteError);
    c->hang_rank = (int)env_long("FAKE_NCCL_HANG_RANK", -1);
    c->hang_after = env_long("FAKE_NCCL_HANG_AFTER", 0);
    c->inprogress_polls = env_long("FAKE_NCCL_INIT_INPROGRESS", -1);
    c->init_fail = (int)env_long("FAKE_NCCL_INIT_FAIL", 0);
    c->fail_op = env_long("FAKE_NCCL_FAIL_OP", 0);
    c->call_fail = env_long("FAKE_NCCL_CALL_FAIL", 0);
    c->refs = 1;
    c->handle_live = 1;
    pthread_mutex_lock(&g.mu);
    c->next = g.comms;
    g.comms = c;
    pthread_mutex_unlock(&g.mu);
    return c;
}

/* Wake everything that may wait on c: turns and finalize (cv), the segment (its doorbell), and
 * a split child's exchange on its parent. */
static void comm_wake(struct comm *c) {
    pthread_mutex_lock(&c->mu);
    pthread_cond_broadcast(&c->cv);
    if (c->seg) ring_rank(c, c->rank);
    pthread_mutex_unlock(&c->mu);
    if (c->parent) {
        pthread_mutex_lock(&c->parent->mu);
        pthread_cond_broadcast(&c->parent->cv);
        if (c->parent->seg) ring_rank(c->parent, c->parent->rank);
        pthread_mutex_unlock(&c->parent->mu);
    }
}

static void comm_join_task(struct comm *c) {
    pthread_mutex_lock(&c->task_mu);
    if (atomic_load(&c->task_running)) {
        pthread_join(c->task, NULL);
        atomic_store(&c->task_running, 0);
    }
    pthread_mutex_unlock(&c->task_mu);
}

static int comm_usable(struct comm *c) {
    if (!atomic_load(&c->ready)) return set_error(ncclInvalidUsage, "communicator is still initialising");
    if (c->init_result) return set_error(ncclInvalidUsage, "communicator failed to initialise");
    return ncclSuccess;
}

static void comm_note_error(struct comm *c, const char *fmt, ...) {
    char text[sizeof c->last_error];
    va_list ap;
    int first;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    pthread_mutex_lock(&c->mu);
    first = c->last_error[0] == 0;
    if (first) memcpy(c->last_error, text, sizeof text);
    pthread_mutex_unlock(&c->mu);
    if (!first) return;
    pthread_mutex_lock(&g.mu);
    memcpy(g.last_error, text, sizeof text);
    g.last_error_comm = c;
    pthread_mutex_unlock(&g.mu);
}

/* ---------------------------------------------------------------- rendezvous */

struct attach_ctx {
    uint32_t n;
};

static int all_attached(const struct comm *c, const void *ctx) {
    return atomic_load(&seg_header(c)->attached) >= ((const struct attach_ctx *)ctx)->n;
}

/* Open (creating if needed) and map the segment. Every rank grows it to its size under flock,
 * never shrinks it: so a rank that disagrees about nranks cannot cut the mapping of another. */
static int seg_open(struct comm *c, char **out) {
    struct stat st;
    int fd = shm_open(c->name, O_CREAT | O_RDWR | O_CLOEXEC, 0600);
    char *map;
    *out = NULL;
    if (fd < 0) return set_error(ncclSystemError, "shm_open(%s): %s", c->name, strerror(errno));
    if (flock(fd, LOCK_EX) != 0 || fstat(fd, &st) != 0 ||
        ((size_t)st.st_size < c->L.total && ftruncate(fd, (off_t)c->L.total) != 0)) {
        int e = errno;
        close(fd);
        return set_error(ncclSystemError, "sizing %s: %s", c->name, strerror(e));
    }
    flock(fd, LOCK_UN);
    map = mmap(NULL, c->L.total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (map == MAP_FAILED) return set_error(ncclSystemError, "mmap %s: %s", c->name, strerror(errno));
    *out = map;
    return ncclSuccess;
}

/* Claim nranks and our slot, then wait for everyone. The last to arrive unlinks the name. */
static int seg_attach(struct comm *c) {
    struct seg_header *h;
    struct attach_ctx all;
    int32_t expect = 0;
    uint32_t zero = 0;
    char *map = NULL;   /* gcc 13 -O2 cannot see that seg_open sets it whenever it returns 0 */
    int rc, r;
    layout_of(c->nranks, &c->L);
    if ((rc = seg_open(c, &map)) != 0) return rc;
    h = (struct seg_header *)map;
    if (!atomic_compare_exchange_strong(&h->nranks, &expect, c->nranks) && expect != c->nranks) {
        munmap(map, c->L.total);
        return set_error(ncclInvalidArgument, "nranks %d disagrees with a peer's %d", c->nranks, (int)expect);
    }
    pthread_mutex_lock(&c->mu);
    c->seg = map;                 /* published under mu: ncclCommAbort may ring our bell now */
    pthread_mutex_unlock(&c->mu);
    if (!atomic_compare_exchange_strong(&seg_slot(c, c->rank)->attached, &zero, 1)) {
        pthread_mutex_lock(&c->mu);
        c->seg = NULL;
        pthread_mutex_unlock(&c->mu);
        munmap(map, c->L.total);
        return set_error(ncclInvalidArgument, "rank %d joined twice", c->rank);
    }
    seg_slot(c, c->rank)->pid = (int32_t)getpid();
    if (atomic_fetch_add(&h->attached, 1) + 1 == (uint32_t)c->nranks) {
        shm_unlink(c->name);
        ring_all(c);
    }
    all.n = (uint32_t)c->nranks;
    if (seg_wait(c, NULL, all_attached, &all) != 0)
        return set_error(ncclInvalidUsage, "aborted while waiting for the peers to join");
    if (!(c->srcs = calloc((size_t)c->nranks, sizeof *c->srcs))) return ncclSystemError;
    for (r = 0; r < c->nranks; r++) c->srcs[r] = seg_mailbox(c, r);
    return ncclSuccess;
}

/* Wait until it is split number `seq`'s turn on parent p (splits exchange in call order). */
static int split_wait_turn(struct comm *p, uint64_t seq, atomic_int *also_stop) {
    int ok;
    pthread_mutex_lock(&p->mu);
    while (p->split_turn != seq && !atomic_load(&p->aborted) && !(also_stop && atomic_load(also_stop)))
        pthread_cond_wait(&p->cv, &p->mu);
    ok = p->split_turn == seq && !atomic_load(&p->aborted);
    pthread_mutex_unlock(&p->mu);
    return ok ? 0 : RC_ABORTED;
}

/* Exchange (color, key) over parent p: our rank and size among the ranks of our color, ordered
 * by key, then by parent rank. Two boot barriers: everyone has written; everyone has read. */
static int split_exchange(struct comm *p, uint64_t seq, int color, int key, atomic_int *also_stop,
                          int *new_rank, int *new_n) {
    struct slot *me = seg_slot(p, p->rank);
    int r, rank = 0, n = 0;
    int rc;
    if (split_wait_turn(p, seq, also_stop) != 0) return RC_ABORTED;
    me->split_color = color;
    me->split_key = key;
    if ((rc = barrier_wait(p, also_stop, &seg_header(p)->boot, &p->boot_gen)) != 0) return rc;
    for (r = 0; r < p->nranks; r++) {
        const struct slot *s = seg_slot(p, r);
        if (s->split_color != color || color == SPLIT_NOCOLOR) continue;
        n++;
        if (s->split_key < key || (s->split_key == key && r < p->rank)) rank++;
    }
    if ((rc = barrier_wait(p, also_stop, &seg_header(p)->boot, &p->boot_gen)) != 0) return rc;
    pthread_mutex_lock(&p->mu);
    p->split_turn++;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    *new_rank = rank;
    *new_n = n;
    return 0;
}

static uint64_t fnv1a(uint64_t h, const void *data, size_t n) {
    const unsigned char *p = data;
    size_t i;
    for (i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

/* The child's segment name: the same on every member, different for every (split, color).
 * It keeps the parent's "/fake_nccl_<pid>_" prefix (the pid of whoever made the first unique
 * id), so that a test can tell its own segments from another run's. */
static void split_name(const struct comm *p, uint64_t seq, int color, char *out) {
    uint64_t h = fnv1a(0xcbf29ce484222325ull, p->name, strlen(p->name));
    const char *last = strrchr(p->name, '_');
    int keep = last ? (int)(last - p->name) + 1 : 0;
    h = fnv1a(h, &seq, sizeof seq);
    h = fnv1a(h, &color, sizeof color);
    snprintf(out, NAME_LEN, "%.*s%016llx", keep, p->name, (unsigned long long)h);
}

/* Everything init (or a split) must do before the communicator is usable; on the caller's
 * thread (blocking) or the task's (nonblocking, or inside a group). */
static int comm_rendezvous(struct comm *c) {
    int rc;
    if (c->parent) {
        rc = split_exchange(c->parent, c->split_seq, c->color, c->key, &c->aborted, &c->rank, &c->nranks);
        if (rc == RC_BROKEN)
            return set_error(ncclRemoteError, "fake NCCL: split of a communicator a peer's FAKE_NCCL_FAIL_OP broke");
        if (rc) return set_error(ncclInvalidUsage, "split aborted");
        split_name(c->parent, c->split_seq, c->color, c->name);
    }
    return seg_attach(c);
}

/* Publish the outcome; FAKE_NCCL_ASYNC_ERROR_AFTER=0 breaks the communicator from the start. */
static void comm_set_ready(struct comm *c, int rc) {
    int broken = rc == 0 && c->async_error_after == 0;
    if (broken) comm_note_error(c, "fake NCCL: asynchronous error %d from the start (FAKE_NCCL_ASYNC_ERROR_AFTER=0)",
                                c->async_error_code);
    pthread_mutex_lock(&c->mu);
    c->init_result = rc;
    if (broken) atomic_store(&c->async_error, c->async_error_code);
    atomic_store(&c->ready, 1);
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
}

static void task_rendezvous(struct comm *c) {
    if (c->init_fail) comm_note_error(c, "fake NCCL: init failed (FAKE_NCCL_INIT_FAIL=%d)", c->init_fail);
    comm_set_ready(c, c->init_fail ? c->init_fail : comm_rendezvous(c));
}

/* A NOCOLOR split that must not block: the exchange runs on the parent's task. */
static void task_split_nocolor(struct comm *p) {
    int rank, n;
    split_exchange(p, p->nocolor_seq, SPLIT_NOCOLOR, p->nocolor_key, NULL, &rank, &n);
}

static void *task_main(void *arg) {
    struct comm *c = arg;
    pthread_setname_np(pthread_self(), "fake-nccl-init");
    c->task_fn(c);
    atomic_store(&c->task_done, 1);
    return NULL;
}

static int comm_start_task(struct comm *c, void (*fn)(struct comm *)) {
    int rc;
    comm_join_task(c);              /* a finished earlier task (the parent's own init) */
    pthread_mutex_lock(&c->task_mu);
    c->task_fn = fn;
    atomic_store(&c->task_done, 0);
    rc = pthread_create(&c->task, NULL, task_main, c);
    atomic_store(&c->task_running, rc == 0);
    pthread_mutex_unlock(&c->task_mu);
    return rc == 0 ? ncclSuccess : set_error(ncclSystemError, "pthread_create: %s", strerror(rc));
}

/* ---------------------------------------------------------------- groups (held operations) */

static void op_free(struct op *op) {
    if (op->comm) comm_release(op->comm);
    free(op->p2p);
    free(op);
}

static void group_hold(struct op *op) {
    op->next = NULL;
    if (tl_group.tail) tl_group.tail->next = op;
    else tl_group.head = op;
    tl_group.tail = op;
}

static int in_group(void) {
    return tl_group.depth > 0;
}

/* ---------------------------------------------------------------- init, split, lifetime */

static int read_config_blocking(const void *config, int def, int *blocking) {
    struct config_head h;
    if (!config) {
        *blocking = def;
        return ncclSuccess;
    }
    memcpy(&h, config, sizeof h);
    if (h.magic != CONFIG_MAGIC || h.size < sizeof h)
        return set_error(ncclInvalidArgument, "config not set up with NCCL_CONFIG_INITIALIZER");
    *blocking = h.blocking == INT_MIN ? 1 : h.blocking != 0;
    return ncclSuccess;
}

/* Finish creating c: inline when blocking, else on a task (and, inside a group, held so that
 * ncclGroupEnd waits for it when blocking). Returns what the init call returns. */
static int comm_launch(struct comm *c, ncclComm_t *out) {
    int rc;
    c->report_polls = !c->blocking;
    if (c->blocking && !in_group()) {
        rc = c->init_fail ? c->init_fail : comm_rendezvous(c);
        if (rc) {
            if (c->init_fail) set_error(rc, "fake NCCL: init failed (FAKE_NCCL_INIT_FAIL=%d)", rc);
            comm_wake(c);
            comm_release_handle(c);
            *out = NULL;
            return rc;
        }
        comm_set_ready(c, 0);
        *out = c;
        return ncclSuccess;
    }
    if ((rc = comm_start_task(c, task_rendezvous)) != 0) {
        comm_release_handle(c);
        *out = NULL;
        return rc;
    }
    *out = c;
    if (in_group()) {
        struct op *op = calloc(1, sizeof *op);
        if (!op) return ncclSystemError;
        op->kind = OP_INIT;
        op->comm = c;
        pthread_mutex_lock(&g.mu);
        c->refs++;
        pthread_mutex_unlock(&g.mu);
        group_hold(op);
        return ncclSuccess;
    }
    return ncclInProgress;
}

static int uid_name(const ncclUniqueId *id, char *name) {
    if (memcmp(id->internal, UID_MAGIC, sizeof UID_MAGIC) != 0 ||
        memchr(id->internal + 16, 0, NAME_LEN) == NULL || id->internal[16] != '/')
        return set_error(ncclInvalidArgument, "unique id was not made by ncclGetUniqueId");
    memcpy(name, id->internal + 16, NAME_LEN);
    return ncclSuccess;
}

API int ncclGetUniqueId(ncclUniqueId *uniqueId) {
    static atomic_uint counter;
    unsigned long long rnd;
    if (!uniqueId) return ncclInvalidArgument;
    if (getrandom(&rnd, sizeof rnd, 0) != (ssize_t)sizeof rnd) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        rnd = (unsigned long long)ts.tv_nsec * 0x9e3779b97f4a7c15ull ^ (unsigned long long)ts.tv_sec;
    }
    rnd ^= atomic_fetch_add(&counter, 1);
    memset(uniqueId, 0, sizeof *uniqueId);
    memcpy(uniqueId->internal, UID_MAGIC, sizeof UID_MAGIC);
    snprintf(uniqueId->internal + 16, NAME_LEN, "/fake_nccl_%d_%016llx", (int)getpid(), rnd);
    return ncclSuccess;
}

API int ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank, void *config) {
    struct comm *c;
    char name[NAME_LEN];
    int rc, blocking = 1;
    if (!comm) return set_error(ncclInvalidArgument, "comm is NULL");
    *comm = NULL;
    if (nranks < 1 || nranks > MAX_RANKS || rank < 0 || rank >= nranks)
        return set_error(ncclInvalidArgument, "rank %d of %d (at most %d ranks)", rank, nranks, MAX_RANKS);
    if ((rc = uid_name(&commId, name)) != 0) return rc;
    if ((rc = read_config_blocking(config, 1, &blocking)) != 0) return rc;
    if (!(c = comm_new(nranks, rank, blocking))) return ncclSystemError;
    memcpy(c->name, name, NAME_LEN);
    return comm_launch(c, comm);
}

API int ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank) {
    return ncclCommInitRankConfig(comm, nranks, commId, rank, NULL);
}

API int ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm, void *config) {
    struct comm *p = comm_acquire(comm), *c;
    uint64_t seq;
    int rc, blocking = 1, rank, n;
    if (!p) return set_error(ncclInvalidArgument, "invalid communicator");
    if (!newcomm || color < SPLIT_NOCOLOR) {
        comm_release(p);
        return set_error(ncclInvalidArgument, "split: newcomm NULL or color %d < 0", color);
    }
    *newcomm = NULL;
    if ((rc = comm_usable(p)) != 0 || (rc = read_config_blocking(config, p->blocking, &blocking)) != 0) {
        comm_release(p);
        return rc;
    }
    pthread_mutex_lock(&p->mu);
    seq = p->splits++;
    pthread_mutex_unlock(&p->mu);
    if (color == SPLIT_NOCOLOR) {
        if (blocking && !in_group()) {
            rc = split_exchange(p, seq, color, key, NULL, &rank, &n);
            comm_release(p);
            return rc ? set_error(ncclInvalidUsage, "split aborted") : ncclSuccess;
        }
        p->nocolor_seq = seq;
        p->nocolor_key = key;
        rc = comm_start_task(p, task_split_nocolor);
        comm_release(p);
        return rc ? rc : in_group() ? ncclSuccess : ncclInProgress;
    }
    if (!(c = comm_new(0, 0, blocking))) {
        comm_release(p);
        return ncclSystemError;
    }
    c->init_fail = 0;             /* FAKE_NCCL_INIT_FAIL is about init */
    c->parent = p;                /* our reference on p moves to the child */
    c->split_seq = seq;
    c->color = color;
    c->key = key;
    c->device = p->device;
    return comm_launch(c, newcomm);
}

API int ncclCommGetAsyncError(ncclComm_t comm, int *asyncError) {
    struct comm *c = comm_acquire(comm);
    int rc = ncclInProgress;
    if (!c) return set_error(ncclInvalidArgument, "invalid communicator");
    if (!asyncError) {
        comm_release(c);
        return ncclInvalidArgument;
    }
    pthread_mutex_lock(&c->mu);
    if (c->report_polls && c->inprogress_polls >= 0 && c->polls < c->inprogress_polls) {
        c->polls++;
    } else if (!atomic_load(&c->ready)) {
        c->polls++;
    } else if (c->report_polls && c->inprogress_polls < 0 && c->polls_after_ready < 1) {
        c->polls_after_ready++;       /* the default: one more ncclInProgress once ready */
    } else if (c->init_result) {
        rc = c->init_result;
    } else if (atomic_load(&c->task_running) && !atomic_load(&c->task_done)) {
        /* a NOCOLOR split still exchanging */
    } else if (c->finalizing && c->executed < c->issued) {
        /* ncclCommFinalize on a nonblocking communicator, still flushing */
    } else {
        rc = atomic_load(&c->async_error);
    }
    pthread_mutex_unlock(&c->mu);
    if (atomic_load(&c->ready) && atomic_load(&c->task_done)) comm_join_task(c);
    *asyncError = rc;
    comm_release(c);
    return ncclSuccess;
}

/* Wait until every issued operation has run (or been cut short by abort). */
static void comm_wait_flushed(struct comm *c) {
    pthread_mutex_lock(&c->mu);
    while (c->executed < c->issued && !atomic_load(&c->aborted)) pthread_cond_wait(&c->cv, &c->mu);
    pthread_mutex_unlock(&c->mu);
}

API int ncclCommFinalize(ncclComm_t comm) {
    struct comm *c = comm_acquire(comm);
    int rc = ncclSuccess;
    if (!c) return set_error(ncclInvalidArgument, "invalid communicator");
    if (c->blocking) {
        comm_wait_flushed(c);
    } else {
        pthread_mutex_lock(&c->mu);
        c->finalizing = 1;
        if (c->executed < c->issued) rc = ncclInProgress;
        pthread_mutex_unlock(&c->mu);
    }
    comm_release(c);
    return rc;
}

API int ncclCommDestroy(ncclComm_t comm) {
    struct comm *c = comm_acquire(comm);
    if (!c) return set_error(ncclInvalidArgument, "invalid communicator");
    comm_join_task(c);
    comm_wait_flushed(c);
    comm_release_handle(c);
    comm_release(c);
    return ncclSuccess;
}

static void comm_abort(struct comm *c) {
    atomic_store(&c->aborted, 1);
    comm_wake(c);
    comm_join_task(c);              /* its waits see the flag and return */
    comm_release_handle(c);
}

API int ncclCommAbort(ncclComm_t comm) {
    struct comm *c = comm_acquire(comm);
    long stuck_ms = env_long("FAKE_NCCL_ABORT_HANG_MS", 0);
    if (!c) return set_error(ncclInvalidArgument, "invalid communicator");
    if (stuck_ms > 0) {   /* an abort that does not come back (seen with NCCL 2.28.3) */
        struct timespec ts = { stuck_ms / 1000, (stuck_ms % 1000) * 1000000L };
        nanosleep(&ts, NULL);
    }
    comm_abort(c);
    comm_release(c);
    return ncclSuccess;
}

API int ncclCommCount(const ncclComm_t comm, int *count) {
    struct comm *c = comm_acquire(comm);
    int rc = ncclSuccess;
    if (!c || !count) rc = set_error(ncclInvalidArgument, "invalid communicator or count");
    else if (c->parent && !atomic_load(&c->ready)) rc = ncclInProgress;
    else *count = c->nranks;
    if (c) comm_release(c);
    return rc;
}

API int ncclCommUserRank(const ncclComm_t comm, int *rank) {
    struct comm *c = comm_acquire(comm);
    int rc = ncclSuccess;
    if (!c || !rank) rc = set_error(ncclInvalidArgument, "invalid communicator or rank");
    else if (c->parent && !atomic_load(&c->ready)) rc = ncclInProgress;
    else *rank = c->rank;
    if (c) comm_release(c);
    return rc;
}

API int ncclCommCuDevice(const ncclComm_t comm, int *device) {
    struct comm *c = comm_acquire(comm);
    int rc = ncclSuccess;
    if (!c || !device) rc = set_error(ncclInvalidArgument, "invalid communicator or device");
    else *device = c->device;
    if (c) comm_release(c);
    return rc;
}

/* ---------------------------------------------------------------- versions and errors */

API int ncclGetVersion(int *version) {
    if (!version) return ncclInvalidArgument;
    *version = (int)env_long("FAKE_NCCL_VERSION", 22809);
    return ncclSuccess;
}

API const char *ncclGetErrorString(int result) {
    switch (result) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (fake NCCL)";
    case ncclSystemError: return "unhandled system error (fake NCCL)";
    case ncclInternalError: return "internal error (fake NCCL)";
    case ncclInvalidArgument: return "invalid argument (fake NCCL)";
    case ncclInvalidUsage: return "invalid usage (fake NCCL)";
    case ncclRemoteError: return "remote process exited or there was a network error (fake NCCL)";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
    }
}

/* NCCL's last error is the process's (its comm argument is unused). Here too, except that when
 * the latest error was another communicator's injected failure and comm has one of its own,
 * comm's is returned: thread ranks of one process do not read each other's. */
API const char *ncclGetLastError(ncclComm_t comm) {
    static _Thread_local char copy[sizeof g.last_error];
    struct comm *c = comm_acquire(comm);
    int own = 0;
    if (c) {
        pthread_mutex_lock(&c->mu);
        if (c->last_error[0]) {
            pthread_mutex_lock(&g.mu);
            own = g.last_error_comm && g.last_error_comm != c;
            pthread_mutex_unlock(&g.mu);
            if (own) memcpy(copy, c->last_error, sizeof copy);
        }
        pthread_mutex_unlock(&c->mu);
        comm_release(c);
    }
    if (!own) {
        pthread_mutex_lock(&g.mu);
        memcpy(copy, g.last_error, sizeof copy);
        pthread_mutex_unlock(&g.mu);
    }
    return copy;
}

/* ---------------------------------------------------------------- memory */

API int ncclMemAlloc(void **ptr, size_t size) {
    if (!ptr) return ncclInvalidArgument;
    return cudaMalloc(ptr, size) == 0 ? ncclSuccess : set_error(ncclUnhandledCudaError, "cudaMalloc failed");
}

API int ncclMemFree(void *ptr) {
    return cudaFree(ptr) == 0 ? ncclSuccess : set_error(ncclUnhandledCudaError, "cudaFree failed");
}

/* ---------------------------------------------------------------- reductions */

static float half_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu, bits;
    float f;
    if (exp == 0) {                             /* zero or subnormal: man * 2^-24, exact */
        f = (float)man * (1.0f / 16777216.0f);
        return sign ? -f : f;
    }
    if (exp == 31) bits = sign | 0x7f800000u | (man << 13);
    else bits = sign | ((exp + 112) << 23) | (man << 13);
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* Round to nearest, ties to even, on the dropped bits. */
static uint32_t shift_round_even(uint32_t m, unsigned s) {
    uint32_t r = m >> s, rem = m & ((1u << s) - 1), half = 1u << (s - 1);
    return r + (rem > half || (rem == half && (r & 1u)));
}

static uint16_t float_to_half(float f) {
    uint32_t u, a, sign;
    memcpy(&u, &f, sizeof u);
    sign = (u >> 16) & 0x8000u;
    a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);              /* NaN */
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);             /* >= 65520: inf */
    if (a < 0x38800000u) {                                               /* below 2^-14 */
        uint32_t e = a >> 23;
        if (e < 102) return (uint16_t)sign;                              /* below 2^-25 */
        return (uint16_t)(sign | shift_round_even((a & 0x7fffffu) | 0x800000u, 126 - e));
    }
    return (uint16_t)(sign | shift_round_even(a - 0x38000000u, 13));     /* rebias 127 -> 15 */
}

static float bf16_to_float(uint16_t b) {
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static uint16_t float_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);   /* quiet NaN */
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

/* dst[i] = src[0][i] op src[1][i] op ... src[n-1][i], left to right, for each of k elements.
 * Loads and stores go through memcpy: user offsets need not be aligned. */
#define DEFINE_INT_REDUCE(NAME, T, U, WIDE)                                                   \
    static void NAME(char *dst, char *const *src, int n, size_t k, int op) {                  \
        size_t i;                                                                              \
        int r;                                                                                 \
        for (i = 0; i < k; i++) {                                                              \
            U acc, x;                                                                          \
            T sa, sx;                                                                          \
            memcpy(&acc, src[0] + i * sizeof(T), sizeof acc);                                  \
            for (r = 1; r < n; r++) {                                                          \
                memcpy(&x, src[r] + i * sizeof(T), sizeof x);                                  \
                sa = (T)acc;                                                                   \
                sx = (T)x;                                                                     \
                switch (op) {                                                                  \
                case OP_PROD: acc = (U)(acc * x); break;                                       \
                case OP_MAX: acc = sa > sx ? acc : x; break;                                   \
                case OP_MIN: acc = sa < sx ? acc : x; break;                                   \
                default: acc = (U)(acc + x); break; /* sum, avg */                             \
                }                                                                              \
            }                                                                                  \
            if (op == OP_AVG) acc = (U)(T)((WIDE)(T)acc / (WIDE)n);                            \
            memcpy(dst + i * sizeof(T), &acc, sizeof acc);                                     \
        }                                                                                      \
    }

DEFINE_INT_REDUCE(reduce_i8, int8_t, uint8_t, long long)
DEFINE_INT_REDUCE(reduce_u8, uint8_t, uint8_t, unsigned long long)
DEFINE_INT_REDUCE(reduce_i32, int32_t, uint32_t, long long)
DEFINE_INT_REDUCE(reduce_u32, uint32_t, uint32_t, unsigned long long)
DEFINE_INT_REDUCE(reduce_i64, int64_t, uint64_t, long long)
DEFINE_INT_REDUCE(reduce_u64, uint64_t, uint64_t, unsigned long long)

#define DEFINE_FLOAT_REDUCE(NAME, T)                                                          \
    static void NAME(char *dst, char *const *src, int n, size_t k, int op) {                  \
        size_t i;                                                                              \
        int r;                                                                                 \
        for (i = 0; i < k; i++) {                                                              \
            T acc, x;                                                                          \
            memcpy(&acc, src[0] + i * sizeof(T), sizeof acc);                                  \
            if (op == OP_AVG) acc = acc / (T)n;                                                \
            for (r = 1; r < n; r++) {                                                          \
                memcpy(&x, src[r] + i * sizeof(T), sizeof x);                                  \
                switch (op) {                                                                  \
                case OP_PROD: acc = acc * x; break;                                            \
                case OP_MAX: acc = acc > x ? acc : x; break;                                   \
                case OP_MIN: acc = acc < x ? acc : x; break;                                   \
                case OP_AVG: acc = acc + x / (T)n; break;                                      \
                default: acc = acc + x; break;                                                 \
                }                                                                              \
            }                                                                                  \
            memcpy(dst + i * sizeof(T), &acc, sizeof acc);                                     \
        }                                                                                      \
    }

DEFINE_FLOAT_REDUCE(reduce_f32, float)
DEFINE_FLOAT_REDUCE(reduce_f64, double)

/* fp16/bf16: each step in fp32, rounded back to 16 bits (as a GPU's __hadd does). */
static void reduce_16(char *dst, char *const *src, int n, size_t k, int op,
                      float (*widen)(uint16_t), uint16_t (*narrow)(float)) {
    size_t i;
    int r;
    for (i = 0; i < k; i++) {
        uint16_t acc, x;
        memcpy(&acc, src[0] + i * 2, 2);
        if (op == OP_AVG) acc = narrow(widen(acc) / (float)n);
        for (r = 1; r < n; r++) {
            float a, b;
            memcpy(&x, src[r] + i * 2, 2);
            if (op == OP_AVG) x = narrow(widen(x) / (float)n);
            a = widen(acc);
            b = widen(x);
            switch (op) {
            case OP_PROD: a = a * b; break;
            case OP_MAX: a = a > b ? a : b; break;
            case OP_MIN: a = a < b ? a : b; break;
            default: a = a + b; break;
            }
            acc = narrow(a);
        }
        memcpy(dst + i * 2, &acc, 2);
    }
}

static void reduce(char *dst, char *const *src, int n, size_t k, int dtype, int op) {
    switch (dtype) {
    case DT_INT8: reduce_i8(dst, src, n, k, op); break;
    case DT_UINT8: reduce_u8(dst, src, n, k, op); break;
    case DT_INT32: reduce_i32(dst, src, n, k, op); break;
    case DT_UINT32: reduce_u32(dst, src, n, k, op); break;
    case DT_INT64: reduce_i64(dst, src, n, k, op); break;
    case DT_UINT64: reduce_u64(dst, src, n, k, op); break;
    case DT_FLOAT16: reduce_16(dst, src, n, k, op, half_to_float, float_to_half); break;
    case DT_FLOAT32: reduce_f32(dst, src, n, k, op); break;
    case DT_FLOAT64: reduce_f64(dst, src, n, k, op); break;
    default: reduce_16(dst, src, n, k, op, bf16_to_float, float_to_bf16); break;
    }
}

/* ---------------------------------------------------------------- collectives (stream side) */

static int kind_reduces(enum op_kind k) {
    return k == OP_ALL_REDUCE || k == OP_REDUCE_SCATTER || k == OP_REDUCE;
}

static int kind_rooted(enum op_kind k) {
    return k == OP_BROADCAST || k == OP_REDUCE || k == OP_GATHER || k == OP_SCATTER;
}

/* Kinds whose mailbox holds one slot per destination rank. */
static int kind_slotted(enum op_kind k) {
    return k == OP_REDUCE_SCATTER || k == OP_ALL_TO_ALL || k == OP_SCATTER;
}

static size_t coll_chunk_elems(const struct comm *c, const struct op *op) {
    size_t bytes = c->L.mail_bytes;
    if (kind_slotted(op->kind)) bytes /= (size_t)c->nranks;
    return bytes / dtype_size(op->dtype);
}

/* Round part 1: this rank's contribution to elements [lo, lo+k) into its mailbox. */
static void coll_write(const struct comm *c, const struct op *op, size_t lo, size_t k, size_t chunk) {
    size_t es = dtype_size(op->dtype), j;
    char *box = seg_mailbox(c, c->rank);
    int me = c->rank;
    switch (op->kind) {
    case OP_BROADCAST:
        if (me != op->root) break;
        /* fall through */
    case OP_ALL_REDUCE: case OP_REDUCE: case OP_ALL_GATHER: case OP_GATHER:
        memcpy(box, op->send + lo * es, k * es);
        break;
    case OP_SCATTER:
        if (me != op->root) break;
        /* fall through */
    case OP_REDUCE_SCATTER: case OP_ALL_TO_ALL:
        for (j = 0; j < (size_t)c->nranks; j++)
            memcpy(box + j * chunk * es, op->send + (j * op->count + lo) * es, k * es);
        break;
    default:
        break;
    }
}

/* Round part 2: this rank's results for elements [lo, lo+k), from all mailboxes. memmove where
 * the destination may be our own send data (in place) that the mailbox holds a copy of. */
static void coll_read(const struct comm *c, const struct op *op, size_t lo, size_t k, size_t chunk) {
    size_t es = dtype_size(op->dtype), mine = (size_t)c->rank * chunk * es;
    int i, n = c->nranks, me = c->rank;
    switch (op->kind) {
    case OP_REDUCE:
        if (me != op->root) break;
        /* fall through */
    case OP_ALL_REDUCE:
        reduce(op->recv + lo * es, c->srcs, n, k, op->dtype, op->redop);
        break;
    case OP_REDUCE_SCATTER: {
        char **at = c->srcs;
        for (i = 0; i < n; i++) at[i] = seg_mailbox(c, i) + mine;
        reduce(op->recv + lo * es, at, n, k, op->dtype, op->redop);
        for (i = 0; i < n; i++) at[i] = seg_mailbox(c, i);
        break;
    }
    case OP_BROADCAST:
        memmove(op->recv + lo * es, seg_mailbox(c, op->root), k * es);
        break;
    case OP_GATHER:
        if (me != op->root) break;
        /* fall through */
    case OP_ALL_GATHER:
        for (i = 0; i < n; i++) memmove(op->recv + ((size_t)i * op->count + lo) * es, seg_mailbox(c, i), k * es);
        break;
    case OP_ALL_TO_ALL:
        for (i = 0; i < n; i++)
            memmove(op->recv + ((size_t)i * op->count + lo) * es, seg_mailbox(c, i) + mine, k * es);
        break;
    case OP_SCATTER:
        memmove(op->recv + lo * es, seg_mailbox(c, op->root) + mine, k * es);
        break;
    default:
        break;
    }
}

static void coll_describe(const struct op *op, uint64_t round, struct op_desc *d) {
    memset(d, 0, sizeof *d);
    d->kind = (int32_t)op->kind;
    d->dtype = op->dtype;
    d->redop = kind_reduces(op->kind) ? op->redop : 0;
    d->root = kind_rooted(op->kind) ? op->root : 0;
    d->count = op->count;
    d->round = round;
}

/* Every rank compares every descriptor with rank 0's, so all reach the same verdict. */
static int coll_descs_agree(const struct comm *c) {
    const struct op_desc *d0 = &seg_slot(c, 0)->desc;
    int r;
    for (r = 1; r < c->nranks; r++)
        if (memcmp(&seg_slot(c, r)->desc, d0, sizeof *d0) != 0) return 0;
    return 1;
}

static int coll_run(struct comm *c, const struct op *op) {
    struct barrier *b = &seg_header(c)->coll;
    size_t chunk = coll_chunk_elems(c, op);
    uint64_t rounds = (op->count + chunk - 1) / chunk, r;
    for (r = 0; r < rounds; r++) {
        size_t lo = (size_t)r * chunk, k = op->count - lo < chunk ? op->count - lo : chunk;
        int agree, rc;
        coll_write(c, op, lo, k, chunk);
        coll_describe(op, r, &seg_slot(c, c->rank)->desc);
        if ((rc = barrier_wait(c, NULL, b, &c->coll_gen)) != 0) return rc;
        agree = coll_descs_agree(c);
        if (agree) coll_read(c, op, lo, k, chunk);
        if ((rc = barrier_wait(c, NULL, b, &c->coll_gen)) != 0) return rc;
        if (!agree) {
            set_error(ncclInvalidUsage, "ranks disagree on a collective (kind, count, dtype, op or root)");
            return ncclInvalidUsage;
        }
    }
    return ncclSuccess;
}

/* ---------------------------------------------------------------- send/recv (stream side) */

static uint64_t p2p_chunks(const struct comm *c, size_t bytes) {
    return bytes == 0 ? 1 : (bytes + c->L.chan_bytes - 1) / c->L.chan_bytes;
}

/* One step of a send: post a chunk when the channel is empty; once all are posted, finish when
 * the receiver has taken the last one. Returns 1 when it made progress. */
static int p2p_send_step(const struct comm *c, struct p2p *p) {
    struct chan *ch = seg_chan(c, c->rank, p->peer);
    uint32_t posted = atomic_load(&ch->posted);
    if (posted != atomic_load(&ch->consumed)) return 0;
    if (p->chunks_left == 0) {
        p->mismatch = atomic_exchange(&ch->mismatch, 0) != 0;
        p->done = 1;
        return 1;
    }
    ch->len = (uint32_t)(p->bytes - p->off < c->L.chan_bytes ? p->bytes - p->off : c->L.chan_bytes);
    ch->msg_bytes = p->bytes;
    if (ch->len) memcpy(chan_data(ch), p->buf + p->off, ch->len);   /* an empty message has no buf */
    p->off += ch->len;
    p->chunks_left--;
    atomic_store(&ch->posted, posted + 1);
    ring_rank(c, p->peer);
    return 1;
}

/* One step of a receive: take a posted chunk. The first chunk says how long the message is; if
 * that is not what we expect, we still drain it (so the channel stays in step) but keep none. */
static int p2p_recv_step(const struct comm *c, struct p2p *p) {
    struct chan *ch = seg_chan(c, p->peer, c->rank);
    uint32_t consumed = atomic_load(&ch->consumed);
    if (atomic_load(&ch->posted) == consumed) return 0;
    if (!p->started) {
        p->started = 1;
        p->mismatch = ch->msg_bytes != p->bytes;
        p->chunks_left = p2p_chunks(c, ch->msg_bytes);
    }
    if (p->mismatch) {
        atomic_store(&ch->mismatch, 1);
    } else if (ch->len) {
        memcpy(p->buf + p->off, chan_data(ch), ch->len);
        p->off += ch->len;
    }
    if (--p->chunks_left == 0) p->done = 1;
    atomic_store(&ch->consumed, consumed + 1);
    ring_rank(c, p->peer);
    return 1;
}

/* Messages match in order per pair and direction: only the first unfinished one moves. */
static int p2p_is_next(const struct op *op, int i) {
    int j;
    for (j = 0; j < i; j++)
        if (!op->p2p[j].done && op->p2p[j].is_send == op->p2p[i].is_send && op->p2p[j].peer == op->p2p[i].peer)
            return 0;
    return 1;
}

static int p2p_run(struct comm *c, struct op *op) {
    struct bell *bell = &seg_slot(c, c->rank)->bell;
    int i, mismatch = 0;
    for (i = 0; i < op->np2p; i++)
        op->p2p[i].chunks_left = op->p2p[i].is_send ? p2p_chunks(c, op->p2p[i].bytes) : 0;
    for (;;) {
        uint32_t seen = atomic_load(&bell->seq);
        int pending = 0, moved = 0;
        for (i = 0; i < op->np2p; i++) {
            struct p2p *p = &op->p2p[i];
            if (p->done) continue;
            pending++;
            if (p2p_is_next(op, i)) moved |= p->is_send ? p2p_send_step(c, p) : p2p_recv_step(c, p);
        }
        if (!pending) break;
        if (moved) continue;
        if (atomic_load(&c->aborted)) return RC_ABORTED;
        if (atomic_load(&seg_header(c)->broken_by)) return RC_BROKEN;
        bell_sleep(bell, seen);
    }
    for (i = 0; i < op->np2p; i++) mismatch |= op->p2p[i].mismatch;
    if (mismatch) return set_error(ncclInvalidUsage, "send/recv sizes disagree");
    return ncclSuccess;
}

/* ---------------------------------------------------------------- running operations */

static int comm_wait_turn(struct comm *c, uint64_t seq) {
    int ok;
    pthread_mutex_lock(&c->mu);
    while (c->executed != seq && !atomic_load(&c->aborted)) pthread_cond_wait(&c->cv, &c->mu);
    ok = !atomic_load(&c->aborted);
    pthread_mutex_unlock(&c->mu);
    return ok ? 0 : RC_ABORTED;
}

static void comm_wait_abort(struct comm *c) {
    pthread_mutex_lock(&c->mu);
    while (!atomic_load(&c->aborted)) pthread_cond_wait(&c->cv, &c->mu);
    pthread_mutex_unlock(&c->mu);
}

/* The operation is over (done, failed, or cut short): let the next one run, and count it for
 * FAKE_NCCL_ASYNC_ERROR_AFTER. */
static void comm_finish_turn(struct comm *c, int rc) {
    int injected = 0;
    pthread_mutex_lock(&c->mu);
    c->executed++;
    if (rc > 0 && atomic_load(&c->async_error) == 0) atomic_store(&c->async_error, rc);
    if (rc != RC_ABORTED && ++c->ops_done == (uint64_t)c->async_error_after) injected = 1;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    if (injected) {   /* the text first: whoever sees the error may ask for it at once */
        comm_note_error(c, "fake NCCL: asynchronous error %d after %ld operations (FAKE_NCCL_ASYNC_ERROR_AFTER)",
                        c->async_error_code, c->async_error_after);
        atomic_store(&c->async_error, c->async_error_code);
    }
}

/* FAKE_NCCL_FAIL_OP: operation op->number, or a later one, on this rank. The first sets the
 * asynchronous error and marks the shared segment broken (ringing every rank, so that peers
 * waiting for us give up: seg_wait, p2p_run); each completes without touching its buffers. */
static int op_fail(struct comm *c, const struct op *op) {
    int32_t none = 0;
    int first = atomic_load(&c->async_error) == 0;
    if (first) {   /* the text first: whoever sees the error may ask for it at once */
        comm_note_error(c, "fake NCCL: operation %llu failed (FAKE_NCCL_FAIL_OP=%ld): error %d",
                        (unsigned long long)op->number, c->fail_op, c->async_error_code);
        atomic_store(&c->async_error, c->async_error_code);
    }
    if (atomic_compare_exchange_strong(&seg_header(c)->broken_by, &none, c->rank + 1)) ring_all(c);
    return c->async_error_code;
}

/* A peer's FAKE_NCCL_FAIL_OP broke the communicator: the wait ends with ncclRemoteError, as a
 * real NCCL's does when the peer's proxy closes the connection. */
static int op_peer_failed(struct comm *c) {
    int by = atomic_load(&seg_header(c)->broken_by) - 1;
    if (atomic_load(&c->async_error) == 0) {
        comm_note_error(c, "fake NCCL: peer rank %d failed (FAKE_NCCL_FAIL_OP there): remote error", by);
        atomic_store(&c->async_error, ncclRemoteError);
    }
    return ncclRemoteError;
}

/* The stream worker's entry point for every operation. */
static void op_run(void *arg) {
    struct op *op = arg;
    struct comm *c = op->comm;
    int rc = RC_ABORTED;
    if (comm_wait_turn(c, op->seq) == 0) {
        if (op->fail) rc = op_fail(c, op);
        else if (op->broken) comm_wait_abort(c);
        else if (atomic_load(&seg_header(c)->broken_by)) rc = RC_BROKEN;
        else rc = op->kind == OP_P2P ? p2p_run(c, op) : coll_run(c, op);
    }
    if (rc == RC_BROKEN) rc = op_peer_failed(c);
    comm_finish_turn(c, rc);
    op_free(op);                    /* drops the reference: may free an aborted comm */
}

/* Make `to` wait for the work enqueued on `from` so far (the fake runtime's events). */
static void stream_order(void *from, void *to) {
    void *ev;
    if (cudaEventCreateWithFlags(&ev, 0x2) != 0) return;
    if (cudaEventRecord(ev, from) == 0) cudaStreamWaitEvent(to, ev, 0);
    cudaEventDestroy(ev);
}

/* A group's sends and receives on several streams run as one operation on the first stream:
 * it waits for the others' earlier work, and their later work waits for it. */
static void p2p_join_streams(const struct op *op, int before) {
    int i, j;
    for (i = 0; i < op->np2p; i++) {
        void *s = op->p2p[i].stream;
        int seen = s == op->stream;
        for (j = 0; j < i && !seen; j++) seen = op->p2p[j].stream == s;
        if (seen) continue;
        if (before) stream_order(s, op->stream);
        else stream_order(op->stream, s);
    }
}

/* Put op on its stream (or drop it, FAKE_NCCL_HANG_RANK). Consumes op. */
static int op_issue(struct op *op) {
    struct comm *c = op->comm;
    uint64_t index;
    int err;
    pthread_mutex_lock(&c->mu);
    index = c->calls++;
    if (c->hang_rank == c->rank && index >= (uint64_t)c->hang_after) {
        pthread_mutex_unlock(&c->mu);
        op_free(op);
        return ncclSuccess;
    }
    if (c->call_fail > 0 && index + 1 >= (uint64_t)c->call_fail) {
        c->calls--;
        pthread_mutex_unlock(&c->mu);
        op_free(op);
        return set_error(ncclRemoteError, "fake NCCL: operation %llu refused (FAKE_NCCL_CALL_FAIL=%ld): "
                         "a peer is gone", (unsigned long long)(index + 1), c->call_fail);
    }
    op->broken = c->async_error_after >= 0 && index >= (uint64_t)c->async_error_after;
    op->number = index + 1;
    op->fail = c->fail_op > 0 && op->number >= (uint64_t)c->fail_op;
    op->seq = c->issued++;
    if (op->kind == OP_P2P) p2p_join_streams(op, 1);
    err = fake_cuda_enqueue(op->stream, op_run, op);
    if (err) {
        c->issued--;
        c->calls--;
        pthread_mutex_unlock(&c->mu);
        op_free(op);
        return set_error(ncclUnhandledCudaError, "enqueue on the stream failed: cuda error %d", err);
    }
    if (op->kind == OP_P2P) p2p_join_streams(op, 0);
    pthread_mutex_unlock(&c->mu);
    return ncclSuccess;
}

/* Inside a group: hold; outside: issue now. */
static int op_submit(struct op *op) {
    if (in_group()) {
        group_hold(op);
        return ncclSuccess;
    }
    return op_issue(op);
}

/* ---------------------------------------------------------------- argument checks */

/* The shadow of a device buffer of `elems` elements; NULL-and-unused is fine. */
static int shadow_of(const void *p, size_t elems, size_t es, int used, char **out) {
    *out = NULL;
    if (!used) return ncclSuccess;
    if (!p) return set_error(ncclInvalidArgument, "buffer is NULL");
    if (elems > SIZE_MAX / es) return set_error(ncclInvalidArgument, "count overflows");
    if (!(*out = fake_cuda_shadow(p, elems * es)))
        return set_error(ncclInvalidArgument, "buffer %p (%zu bytes) is not device memory of the fake runtime",
                         p, elems * es);
    return ncclSuccess;
}

struct coll_args {
    enum op_kind kind;
    const void *send;
    void *recv;
    size_t count;
    int dtype, redop, root;
};

/* Which buffers this rank uses, and how many elements each: NCCL's definitions. */
static void coll_extents(const struct coll_args *a, int rank, int n, size_t *send_elems, int *send_used,
                         size_t *recv_elems, int *recv_used) {
    size_t un = (size_t)n, cnt = a->count;
    int root = rank == a->root;
    *send_elems = *recv_elems = cnt;
    *send_used = *recv_used = 1;
    switch (a->kind) {
    case OP_REDUCE_SCATTER: *send_elems = cnt * un; break;
    case OP_ALL_GATHER: *recv_elems = cnt * un; break;
    case OP_BROADCAST: *send_used = root; break;
    case OP_REDUCE: *recv_used = root; break;
    case OP_ALL_TO_ALL: *send_elems = *recv_elems = cnt * un; break;
    case OP_GATHER: *recv_elems = cnt * un; *recv_used = root; break;
    case OP_SCATTER: *send_elems = cnt * un; *send_used = root; break;
    default: break;
    }
}

static int coll_call(const struct coll_args *a, ncclComm_t comm, void *stream) {
    struct comm *c = comm_acquire(comm);
    struct op *op = NULL;
    size_t es = dtype_size(a->dtype), se, re;
    int su, ru, rc;
    char *send = NULL, *recv = NULL;
    if (!c) return set_error(ncclInvalidArgument, "invalid communicator");
    rc = comm_usable(c);
    if (!rc && es == 0) rc = set_error(ncclInvalidArgument, "invalid datatype %d", a->dtype);
    if (!rc && kind_reduces(a->kind) && (a->redop < 0 || a->redop >= OP_COUNT))
        rc = set_error(ncclInvalidArgument, "invalid reduction op %d", a->redop);
    if (!rc && kind_rooted(a->kind) && (a->root < 0 || a->root >= c->nranks))
        rc = set_error(ncclInvalidArgument, "invalid root %d", a->root);
    if (!rc && (size_t)c->nranks > 1 && a->count > SIZE_MAX / (size_t)c->nranks / es)
        rc = set_error(ncclInvalidArgument, "count overflows");
    if (!rc && a->count == 0) {               /* legal, nothing to do */
        comm_release(c);
        return ncclSuccess;
    }
    if (!rc && a->kind == OP_ALL_TO_ALL && a->send == a->recv)
        rc = set_error(ncclInvalidArgument, "ncclAlltoAll cannot run in place");
    if (!rc && fake_cuda_stream_check(stream) != 0)
        rc = set_error(ncclUnhandledCudaError, "invalid stream %p", stream);
    if (!rc) {
        coll_extents(a, c->rank, c->nranks, &se, &su, &re, &ru);
        rc = shadow_of(a->send, se, es, su, &send);
        if (!rc) rc = shadow_of(a->recv, re, es, ru, &recv);
    }
    if (rc || !(op = calloc(1, sizeof *op))) {
        comm_release(c);
        return rc ? rc : ncclSystemError;
    }
    op->kind = a->kind;
    op->comm = c;                             /* our reference moves to the op */
    op->stream = stream;
    op->send = send;
    op->recv = recv;
    op->count = a->count;
    op->dtype = a->dtype;
    op->redop = a->redop;
    op->root = a->root;
    return op_submit(op);
}

static int p2p_call(int is_send, const void *buf, size_t count, int dtype, int peer, ncclComm_t comm, void *stream) {
    struct comm *c = comm_acquire(comm);
    struct op *op = NULL;
    size_t es = dtype_size(dtype);
    char *shadow = NULL;
    int rc;
    if (!c) return set_error(ncclInvalidArgument, "invalid communicator");
    rc = comm_usable(c);
    if (!rc && es == 0) rc = set_error(ncclInvalidArgument, "invalid datatype %d", dtype);
    if (!rc && (peer < 0 || peer >= c->nranks)) rc = set_error(ncclInvalidArgument, "invalid peer %d", peer);
    if (!rc && fake_cuda_stream_check(stream) != 0)
        rc = set_error(ncclUnhandledCudaError, "invalid stream %p", stream);
    if (!rc && count > 0) rc = shadow_of(buf, count, es, 1, &shadow);
    if (rc || !(op = calloc(1, sizeof *op)) || !(op->p2p = calloc(1, sizeof *op->p2p))) {
        if (!rc) free(op);
        comm_release(c);
        return rc ? rc : ncclSystemError;
    }
    op->kind = OP_P2P;
    op->comm = c;
    op->stream = stream;
    op->np2p = 1;
    op->p2p->is_send = is_send;
    op->p2p->peer = peer;
    op->p2p->buf = shadow;
    op->p2p->bytes = count * es;
    op->p2p->stream = stream;
    return op_submit(op);
}

/* ---------------------------------------------------------------- the public collectives */

API int ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count, int datatype, int op,
                      ncclComm_t comm, void *stream) {
    struct coll_args a = {OP_ALL_REDUCE, sendbuff, recvbuff, count, datatype, op, 0};
    return coll_call(&a, comm, stream);
}

API int ncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount, int datatype, int op,
                          ncclComm_t comm, void *stream) {
    struct coll_args a = {OP_REDUCE_SCATTER, sendbuff, recvbuff, recvcount, datatype, op, 0};
    return coll_call(&a, comm, stream);
}

API int ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount, int datatype,
                      ncclComm_t comm, void *stream) {
    struct coll_args a = {OP_ALL_GATHER, sendbuff, recvbuff, sendcount, datatype, 0, 0};
    return coll_call(&a, comm, stream);
}

API int ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count, int datatype, int root,
                      ncclComm_t comm, void *stream) {
    struct coll_args a = {OP_BROADCAST, sendbuff, recvbuff, count, datatype, 0, root};
    return coll_call(&a, comm, stream);
}

API int ncclBcast(void *buff, size_t count, int datatype, int root, ncclComm_t comm, void *stream) {
    return ncclBroadcast(buff, buff, count, datatype, root, comm, stream);
}

API int ncclReduce(const void *sendbuff, void *recvbuff, size_t count, int datatype, int op, int root,
                   ncclComm_t comm, void *stream) {
    struct coll_args a = {OP_REDUCE, sendbuff, recvbuff, count, datatype, op, root};
    return coll_call(&a, comm, stream);
}

API int ncclAlltoAll(const void *sendbuff, void *recvbuff, size_t count, int datatype,
                     ncclComm_t comm, void *stream) {
    struct coll_args a = {OP_ALL_TO_ALL, sendbuff, recvbuff, count, datatype, 0, 0};
    return coll_call(&a, comm, stream);
}

API int ncclGather(const void *sendbuff, void *recvbuff, size_t count, int datatype, int root,
                   ncclComm_t comm, void *stream) {
    struct coll_args a = {OP_GATHER, sendbuff, recvbuff, count, datatype, 0, root};
    return coll_call(&a, comm, stream);
}

API int ncclScatter(const void *sendbuff, void *recvbuff, size_t count, int datatype, int root,
                    ncclComm_t comm, void *stream) {
    struct coll_args a = {OP_SCATTER, sendbuff, recvbuff, count, datatype, 0, root};
    return coll_call(&a, comm, stream);
}

API int ncclSend(const void *sendbuff, size_t count, int datatype, int peer, ncclComm_t comm, void *stream) {
    return p2p_call(1, sendbuff, count, datatype, peer, comm, stream);
}

API int ncclRecv(void *recvbuff, size_t count, int datatype, int peer, ncclComm_t comm, void *stream) {
    return p2p_call(0, recvbuff, count, datatype, peer, comm, stream);
}

/* ---------------------------------------------------------------- group start / end */

API int ncclGroupStart(void) {
    tl_group.depth++;
    return ncclSuccess;
}

/* Fold a held single send/recv into the communicator's batch. Consumes op. */
static struct op *p2p_merge(struct op *batch, struct op *op) {
    struct p2p *grown;
    if (!batch) return op;
    grown = realloc(batch->p2p, (size_t)(batch->np2p + 1) * sizeof *grown);
    if (!grown) {
        op_free(op);
        return batch;
    }
    batch->p2p = grown;
    batch->p2p[batch->np2p++] = op->p2p[0];
    op_free(op);
    return batch;
}

/* A held init/split: blocking ones are waited for here; nonblocking ones only looked at. */
static int group_wait_init(struct comm *c) {
    if (!c->blocking) return atomic_load(&c->ready) ? c->init_result : ncclInProgress;
    comm_join_task(c);
    return c->init_result;
}

/* Issue everything held, one communicator at a time in order of first appearance: its
 * collectives in call order, then its sends and receives as one operation. */
static int group_flush(struct op *list) {
    int rc = ncclSuccess;
    while (list) {
        struct comm *c = list->comm;
        struct op **pp = &list, *op, *batch = NULL;
        while ((op = *pp) != NULL) {
            int r = ncclSuccess;
            if (op->comm != c) {
                pp = &op->next;
                continue;
            }
            *pp = op->next;
            op->next = NULL;
            if (op->kind == OP_INIT) {
                r = group_wait_init(c);
                op_free(op);
            } else if (op->kind == OP_P2P) {
                batch = p2p_merge(batch, op);
            } else {
                r = op_issue(op);
            }
            if (r && (rc == ncclSuccess || rc == ncclInProgress)) rc = r;
        }
        if (batch) {
            int r = op_issue(batch);
            if (r && (rc == ncclSuccess || rc == ncclInProgress)) rc = r;
        }
    }
    return rc;
}

API int ncclGroupEnd(void) {
    struct op *list;
    if (tl_group.depth == 0) return set_error(ncclInvalidUsage, "ncclGroupEnd without ncclGroupStart");
    if (--tl_group.depth > 0) return ncclSuccess;
    list = tl_group.head;
    tl_group.head = tl_group.tail = NULL;
    return group_flush(list);
}

/* ---------------------------------------------------------------- load, unload, fork */

static void fork_prepare(void) {
    pthread_mutex_lock(&g.mu);
}

static void fork_parent(void) {
    pthread_mutex_unlock(&g.mu);
}

/* The child has no stream workers and no tasks: park every communicator (their own locks may
 * be held by threads that do not exist here) and start with none. */
static void fork_child(void) {
    struct comm *c;
    while ((c = g.comms) != NULL) {
        g.comms = c->next;
        c->next = g.parked;
        g.parked = c;
    }
    tl_group.depth = 0;
    tl_group.head = tl_group.tail = NULL;
    pthread_mutex_unlock(&g.mu);    /* locked by fork_prepare, in this (the forking) thread */
}

__attribute__((constructor)) static void fake_nccl_load(void) {
    pthread_atfork(fork_prepare, fork_parent, fork_child);
}

/* Abort what is still alive, then wait until the streams have run every queued operation (they
 * return at once once aborted), so no worker is in, or will enter, this code after dlclose. */
__attribute__((destructor)) static void fake_nccl_unload(void) {
    struct comm *c;
    for (;;) {
        pthread_mutex_lock(&g.mu);
        for (c = g.comms; c && !c->handle_live; c = c->next) {}
        if (c) c->refs++;
        pthread_mutex_unlock(&g.mu);
        if (!c) break;
        comm_abort(c);
        comm_release(c);
    }
    fake_cuda_quiesce();
    /* What is left is still referenced: by operations held in a group that never ended, or by
     * another thread inside a call while the process exits. Those are not freed: a leak in that
     * abnormal case is better than freeing memory under a running thread. */
}
