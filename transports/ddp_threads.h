/* SPDX-License-Identifier: MIT (see LICENSE) */
/* transports/ddp_threads.h — libddp's in-process transport: ranks that are threads of one
 * process reduce and copy straight from each other's buffers (no staging copy, no socket).
 *
 * In the file that defines DDP_IMPLEMENTATION this compiles the transport and registers it
 * (priority 30, above shm's 20 and TCP's 10), so "auto" uses it for every peer in this same
 * process, and ddp_comm_init_threads prefers it. Peers in other processes of the same
 * communicator still go over shm, TCP or RDMA:
 *
 *     #define DDP_IMPLEMENTATION
 *     #include "ddp.h"
 *     #include "transports/ddp_tcp.h"
 *     #include "transports/ddp_threads.h"
 *
 *     ddp_comm_t *comms[4];
 *     ddp_comm_init_threads(comms, 4, NULL);      (then one thread per comms[i])
 *
 * Needs libc and pthreads (and the futex system call on Linux; elsewhere a sleeping rank naps
 * 1 ms at a time). It sees its communicator only through the ddp_transport_ctx_t given to init
 * (transports/ddp_transport.h).
 *
 * REACHABILITY. Each rank publishes its pid, a random 64-bit number drawn once per process and
 * the address of the process-wide registry; a peer is reachable only when all three equal ours.
 * A rank in another process never matches, nor one in a fork child (it inherits the addresses
 * and the number, not the pid; it draws a new number). Ranks meet in the registry, a
 * mutex-protected list keyed by communicator id + rank, where each rank's endpoint lives: its
 * collective progress word and buffer pointers, a wake-up word, flags, and one point-to-point
 * channel per peer. Endpoints are reference-counted: a peer may still look at one after its
 * owner destroyed its communicator.
 *
 * POINT-TO-POINT. One channel per direction of a pair: a FIFO of posted sends and a FIFO of
 * posted receives, at most one of them non-empty. Whoever posts second takes the head of the
 * other FIFO (tag and length must be equal, else DDP_ERR_MISMATCH on both sides, naming the
 * peer, the tags and the lengths) and copies straight from the send buffer into the receive
 * buffer: one copy, inside the isend/irecv call, outside the channel's lock. A request is done
 * once its data was copied. Messages match in posting order. Requests come from a pool per
 * connection (32; the ring engine keeps at most 2 x DDP_RING_WINDOW = 16 per connection); a
 * burst beyond it adds 32 more that the connection keeps until it closes: posting never fails
 * for want of room, and the steady state never allocates.
 *
 * COLLECTIVES (when every peer is reached through this transport). A rank publishes the
 * signature of its call (kind, dtype, op, count, root) and its buffer pointers, then waits for
 * everyone's; a signature that differs is DDP_ERR_MISMATCH naming both calls.
 *   all-reduce, small   (<= DDP_THREADS_SMALL_MAX bytes) each rank copies its data into its
 *                       endpoint (the first 32 bytes in the cache line that says "arrived") and
 *                       reduces all p copies in rank order: one synchronisation.
 *   all-reduce          rank r reduces slice r straight from the p send buffers, in rank order
 *                       0..p-1 (16 KiB at a time, through a block that stays in cache), and
 *                       writes the result into every rank's receive buffer; then everyone waits
 *                       for everyone. Two synchronisations, no staging copy. Each element is
 *                       reduced by one rank only: every rank gets the same bits, run after run.
 *   reduce-scatter      rank r reduces block r straight from the p send buffers; then a final
 *                       synchronisation (nobody returns while its send buffer is being read).
 *   all-gather          each rank copies the p send buffers; then a final synchronisation.
 *   broadcast           the others copy from the root's send buffer, then a final
 *                       synchronisation.
 *   (small)             reduce-scatter, all-gather and broadcast too: when a rank's send buffer
 *                       fits DDP_THREADS_SMALL_MAX, from copies in the endpoints, one step.
 *   barrier             one synchronisation.
 * AVG sums, then divides once by p (ddp_divide_local); fp16/bf16 go through fp32 at every step
 * (ddp_reduce_local), as in the ring and in shm. Why in place is safe: see _ddp_thr_all_reduce.
 *
 * WAITING. Spin (a pause loop; sched_yield instead when the ranks outnumber the CPUs this
 * process may use), then sleep on a futex in the waiter's endpoint; a rank that publishes
 * progress, completes a peer's request or closes wakes the peers that said they sleep. Every
 * wait honours the communicator's timeout (DDP_ERR_TIMEOUT naming the rank that did not arrive
 * and the phase), sees ddp_comm_abort within a millisecond (DDP_ERR_ABORTED; the transport's
 * abort entry wakes a sleeping rank), and a peer that closed its communicator (destroyed,
 * aborted or failed: DDP_ERR_REMOTE naming it), and says at WARN which ranks it waits for
 * after 10 s, 30 s, 60 s, then every 5 minutes, as the engine's algorithms do. A failed call
 * returns only after the communicator closed the connections, and closing waits until no peer
 * can still be reading or writing this rank's buffers.
 *
 * MEASURED (2-core AMD EPYC VM, 2 thread ranks, float64, medians of many runs; shm's in
 * brackets): all-reduce 8 B 0.24-0.27 us (0.25-0.28), 8 KiB 0.74-0.84 (1.0-1.4), 64 KiB 3.7-4.5
 * (7.2-8.4), 1 MiB 42-53 (540-550), 8 MiB 530-545 (1620-1645); broadcast 1 MiB 36-48 (150-235).
 *
 * LIMITS. Same process only, by construction. Zero copy means that peers read your send buffer
 * and write your receive buffer during the call: both must stay valid, and untouched by other
 * threads, until it returns (as for any collective). Endpoints are allocated with DDP_MALLOC
 * (not desc.allocator): they may outlive the communicator that made them. One transport per
 * process: two private copies of libddp (DDP_STATIC) in one process do not reach each other.
 *
 * ENVIRONMENT
 *   DDP_THREADS_COLL=0        point-to-point only (the ring and recursive doubling run over the
 *                             channels), for testing and comparison.
 *   DDP_THREADS_SMALL_MAX     one-step collectives up to this many bytes of send buffer
 *                             (0..1024; default 1024: the one step won everywhere below, p = 2
 *                             and 4).
 *   DDP_THREADS_SPIN_US       spin before sleeping (default: DDP_SPIN_US if set, else 2000 us
 *                             with a CPU per rank, 50 us with more ranks than CPUs, as shm).
 */
#if defined(DDP_IMPLEMENTATION) && !defined(DDP_THREADS_IMPLEMENTATION)
#define DDP_THREADS_IMPLEMENTATION
#endif
#if defined(DDP_THREADS_IMPLEMENTATION)
#ifndef DDP_TRANSPORT_IMPLEMENTATION
#define DDP_TRANSPORT_IMPLEMENTATION
#endif
#ifndef DDP_KERNELS_IMPLEMENTATION
#define DDP_KERNELS_IMPLEMENTATION
#endif
#endif
#include "ddp_transport.h"
#include "../ddp_kernels.h"

#ifndef DDP_THREADS_H_INCLUDED
#define DDP_THREADS_H_INCLUDED
#ifdef __cplusplus
extern "C" {
#endif
DDP_API const ddp_transport_t *ddp_transport_threads(void);
#ifdef __cplusplus
}
#endif
#endif /* DDP_THREADS_H_INCLUDED */

#if defined(DDP_THREADS_IMPLEMENTATION) && !defined(DDP_THREADS_IMPL_INCLUDED)
#define DDP_THREADS_IMPL_INCLUDED
#if !defined(DDP_TRANSPORT_IMPL_INCLUDED) || !defined(DDP_KERNELS_IMPL_INCLUDED)
#error "transports/ddp_threads.h's implementation needs ddp_transport.h's and ddp_kernels.h's (define DDP_IMPLEMENTATION)"
#endif

#define _DDP_THR_MAGIC 0x44445448u      /* "DDTH": published address */
#define _DDP_THR_VERSION 1u
#define _DDP_THR_POOL 32                /* requests per connection (and per extra chunk) */
#define _DDP_THR_INLINE 1024            /* bytes of a one-step collective, per slot */
#define _DDP_THR_SMALL_MAX 1024         /* default DDP_THREADS_SMALL_MAX (see _ddp_thr_enable) */
#define _DDP_THR_BLOCK (16u << 10)      /* reduction block: stays in L1 */
#define _DDP_THR_SLICE_MS 10            /* longest sleep between abort/peer checks */
#define _DDP_THR_LINE 64

enum { _DDP_THR_FREE, _DDP_THR_POSTED, _DDP_THR_DONE, _DDP_THR_FAILED };

/* h.next links the free list or a channel's FIFO; h.done and h.complete stay unused: the peer's
 * post moves the bytes at once and says so in `state`. */
typedef struct {
    _ddp_transport_req_t h;
    size_t other_len;                 /* other_*: what the peer posted, on a mismatch */
    uint64_t other_tag;
    uint32_t state;                   /* _DDP_THR_*: atomic; the peer sets DONE or FAILED */
    ddp_result_t err;                 /* FAILED: why (written before state) */
} _ddp_thr_req_t;
#define _DDP_THR_REQ(q) ((_ddp_thr_req_t *)(void *)(q))

typedef struct _ddp_thr_chunk {       /* requests beyond the pool, kept until close */
    struct _ddp_thr_chunk *next;
    _ddp_thr_req_t req[_DDP_THR_POOL];
} _ddp_thr_chunk_t;

/* One direction of one pair; lives in the receiver's endpoint. FIFOs and flags change under mu;
 * the flags are read without it too (atomics). */
typedef struct {
    pthread_mutex_t mu;
    _ddp_transport_queue_t sends;     /* sends waiting for a receive (the sender's requests) */
    _ddp_transport_queue_t recvs;     /* receives waiting for a send (the receiver's) */
    uint32_t closed;                  /* one side closed the connection */
    uint32_t broken;                  /* a message did not match: nothing more goes through */
    uint32_t copying;                 /* matched pairs being copied outside the lock */
} _ddp_thr_chan_t;
typedef union {
    _ddp_thr_chan_t c;
    unsigned char pad[(sizeof(_ddp_thr_chan_t) + _DDP_THR_LINE - 1) / _DDP_THR_LINE * _DDP_THR_LINE];
} _ddp_thr_chan_slot_t;

/* Collective n's first step, in slot n & 1 of its rank's endpoint: the step number, the
 * signature and a one-step collective's data, whose first 32 bytes share the line: a tiny
 * all-reduce costs a rank one cache line per peer. */
typedef struct {
    uint64_t step;                    /* the step at which this slot was published (atomic) */
    _ddp_transport_sig_t sig;
    unsigned char data[_DDP_THR_INLINE];
} _ddp_thr_slot_t;
#define _DDP_THR_HEAD (_DDP_THR_LINE - offsetof(_ddp_thr_slot_t, data))   /* data bytes in line 1 */
#define _DDP_THR_SLOT_BYTES ((sizeof(_ddp_thr_slot_t) + _DDP_THR_LINE - 1) / _DDP_THR_LINE * _DDP_THR_LINE)
typedef struct { const void *send[2]; void *recv[2]; } _ddp_thr_bufs_t;
typedef struct { uint32_t closed, busy; } _ddp_thr_flags_t;

/* One rank's endpoint: what its peers read. Each line has one writer, except the wake-up line
 * (anyone rings) and the flags (the owner, or a thread calling ddp_comm_abort for it). */
typedef struct _ddp_thr_ep {
    /* steps published (owner writes) */
    union { uint64_t v; unsigned char line[_DDP_THR_LINE]; } phase;
    union { _ddp_thr_slot_t v; unsigned char line[_DDP_THR_SLOT_BYTES]; } slot[2];
    /* buffers of collective n in send/recv[n & 1] (owner writes, at the collective's start) */
    union { _ddp_thr_bufs_t v; unsigned char line[_DDP_THR_LINE]; } bufs;
    /* futex word (anyone bumps it) and "the owner sleeps on it" */
    union { _ddp_transport_bell_t v; unsigned char line[_DDP_THR_LINE]; } bell;
    /* closed: the owner closed its connections (gone, aborted or failed); busy: the owner is
     * inside a collective that may touch its peers' buffers */
    union { _ddp_thr_flags_t v; unsigned char line[_DDP_THR_LINE]; } flags;
    /* registry: set before registration; next and refs change under _ddp_thr_mu */
    struct _ddp_thr_ep *next;
    uint64_t comm_id;
    int rank, nranks, refs;
    _ddp_thr_chan_slot_t *inbox;      /* [nranks]: messages from rank i to this rank */
    void *raw;                        /* the allocation (this, aligned to a line) */
} _ddp_thr_ep_t;

struct _ddp_thr;
typedef struct _ddp_thr_conn {
    struct _ddp_thr *tp;
    int peer;
    _ddp_thr_ep_t *pep;               /* the peer's endpoint (we hold a reference) */
    _ddp_thr_chan_t *out, *in;        /* pep's inbox from us; our inbox from pep */
    _ddp_thr_req_t *free_list;
    _ddp_thr_chunk_t *chunks;
    _ddp_thr_req_t pool[_DDP_THR_POOL];
} _ddp_thr_conn_t;

typedef struct { uint32_t magic, version; int32_t pid; uint32_t pad; uint64_t nonce, registry; } _ddp_thr_addr_t;

typedef struct _ddp_thr {
    const ddp_transport_ctx_t *ctx;
    int rank, nranks;
    _ddp_thr_addr_t addr;             /* what this rank published */
    _ddp_thr_ep_t *me;                /* registered by the first reachable() (atomic: abort()
                                       * reads it from any thread) */
    int setup_failed;
    _ddp_thr_conn_t **conns;          /* by rank */
    /* collectives */
    int coll_enabled, oversubscribed, spin_us;
    size_t small_max;
    uint64_t phase;                   /* steps this rank published */
    uint64_t ncoll;                   /* collectives run: selects the slot (n & 1) */
    _ddp_thr_ep_t **eps;              /* every rank's endpoint, this one's included */
    const unsigned char **sendp;      /* the current collective's buffers, by rank */
    unsigned char **recvp;
    unsigned char *tmp;               /* _DDP_THR_BLOCK bytes */
} _ddp_thr_t;

/* ---------------------------------------------------------------- the process-wide registry
 * The one mutable global of this transport, because it is what "same process" means: ranks of
 * one process find each other here. The pid it was made for tells a fork child to start over
 * (the parent's ranks are not in the child). */
static pthread_mutex_t _ddp_thr_mu = PTHREAD_MUTEX_INITIALIZER;
static _ddp_thr_ep_t *_ddp_thr_registry;
static int32_t _ddp_thr_pid;
static uint64_t _ddp_thr_nonce;

/* Under _ddp_thr_mu: this process's random number (a new one after a fork). */
_DDP_PRIVATE uint64_t _ddp_thr_process_nonce(void) {
    if (_ddp_thr_pid != (int32_t)getpid()) {
        _ddp_thr_pid = (int32_t)getpid();
        _ddp_thr_nonce = _ddp_random64();
        _ddp_thr_registry = NULL;     /* the parent's endpoints: not ours to use or free */
    }
    return _ddp_thr_nonce;
}

/* fork() while another thread holds the registry lock must not leave the child a held lock. */
_DDP_PRIVATE void _ddp_thr_atfork_prepare(void) { pthread_mutex_lock(&_ddp_thr_mu); }
_DDP_PRIVATE void _ddp_thr_atfork_release(void) { pthread_mutex_unlock(&_ddp_thr_mu); }

_DDP_PRIVATE void _ddp_thr_ep_release(_ddp_thr_ep_t *e) {
    int last, i;
    pthread_mutex_lock(&_ddp_thr_mu);
    last = --e->refs == 0;
    pthread_mutex_unlock(&_ddp_thr_mu);
    if (!last) return;
    for (i = 0; i < e->nranks; i++) pthread_mutex_destroy(&e->inbox[i].c.mu);
    DDP_FREE(e->inbox);
    DDP_FREE(e->raw);
}

/* ---------------------------------------------------------------- small helpers */
/* Wakes the owner of e if it said it sleeps (private futex: the word is in this process). */
static inline void _ddp_thr_wake(_ddp_thr_ep_t *e) { _ddp_transport_bell_ring(&e->bell.v, 0); }

/* Waits until e's owner is inside no collective (so it no longer touches our buffers): short,
 * because a rank in a collective sees our closed flag within a millisecond and gives up. Bounded
 * by the communicator's timeout all the same. */
_DDP_PRIVATE void _ddp_thr_wait_idle(_ddp_thr_t *tp, _ddp_thr_ep_t *e) {
    int64_t start = 0, now;
    int spins = 0;
    while (__atomic_load_n(&e->flags.v.busy, __ATOMIC_ACQUIRE)) {
        if (spins < 64) { spins++; _ddp_transport_pause(); continue; }
        now = _ddp_now_us();
        if (!start) start = now;
        if (tp->ctx->timeout_ms >= 0 && now - start > (int64_t)tp->ctx->timeout_ms * 1000) {
            _DDP_TLOG(tp->ctx, DDP_LOG_WARN, "threads: rank %d still inside a collective after %d "
                      "ms; closing anyway", e->rank, tp->ctx->timeout_ms);
            return;
        }
        _ddp_thr_wake(e);
        if (now - start < 2000) sched_yield(); else usleep(50);
    }
}

/* ---------------------------------------------------------------- setup */
_DDP_PRIVATE ddp_result_t _ddp_thr_init(const ddp_transport_ctx_t *c, void **state) {
    _ddp_thr_t *tp;
    ddp_result_t r;
    *state = NULL;
    tp = (_ddp_thr_t *)ddp_transport_calloc(c, sizeof *tp);
    if (!tp) return ddp_transport_fail(c, DDP_ERR_OUT_OF_MEMORY, "threads: init");
    tp->ctx = c;
    tp->rank = c->rank;
    tp->nranks = c->nranks;
    tp->addr.magic = _DDP_THR_MAGIC;
    tp->addr.version = _DDP_THR_VERSION;
    pthread_mutex_lock(&_ddp_thr_mu);
    tp->addr.nonce = _ddp_thr_process_nonce();
    pthread_mutex_unlock(&_ddp_thr_mu);
    tp->addr.pid = (int32_t)getpid();
    tp->addr.registry = (uint64_t)(uintptr_t)&_ddp_thr_registry;
    r = c->publish(c->host, "threads", &tp->addr, sizeof tp->addr);
    if (r != DDP_SUCCESS) {
        ddp_transport_free(c, tp);
        return r;
    }
    *state = tp;
    return DDP_SUCCESS;
}

/* After the rendezvous (the communicator id is known only then): make and register this rank's
 * endpoint. Called by the first reachable(). */
_DDP_PRIVATE ddp_result_t _ddp_thr_setup(_ddp_thr_t *tp) {
    const ddp_transport_ctx_t *c = tp->ctx;
    const int n = tp->nranks;
    _ddp_thr_ep_t *e, *x;
    void *raw;
    int i, dup = 0, forked;
    tp->conns = (_ddp_thr_conn_t **)ddp_transport_calloc(c, sizeof(void *) * (size_t)n);
    raw = DDP_MALLOC(sizeof *e + _DDP_THR_LINE);
    if (!tp->conns || !raw) {
        DDP_FREE(raw);
        return ddp_transport_fail(c, DDP_ERR_OUT_OF_MEMORY, "threads: endpoint");
    }
    e = (_ddp_thr_ep_t *)(void *)((unsigned char *)raw +
                                  ((_DDP_THR_LINE - (uintptr_t)raw % _DDP_THR_LINE) % _DDP_THR_LINE));
    memset(e, 0, sizeof *e);
    e->raw = raw;
    e->inbox = (_ddp_thr_chan_slot_t *)DDP_MALLOC(sizeof *e->inbox * (size_t)n);
    if (!e->inbox) {
        DDP_FREE(raw);
        return ddp_transport_fail(c, DDP_ERR_OUT_OF_MEMORY, "threads: endpoint");
    }
    memset(e->inbox, 0, sizeof *e->inbox * (size_t)n);
    for (i = 0; i < n; i++) pthread_mutex_init(&e->inbox[i].c.mu, NULL);
    e->comm_id = c->comm_id;
    e->rank = tp->rank;
    e->nranks = n;
    e->refs = 1;
    pthread_mutex_lock(&_ddp_thr_mu);
    forked = _ddp_thr_process_nonce() != tp->addr.nonce;
    for (x = _ddp_thr_registry; x && !forked; x = x->next)
        if (x->comm_id == e->comm_id && x->rank == e->rank) dup = 1;
    if (!dup && !forked) {
        e->next = _ddp_thr_registry;
        _ddp_thr_registry = e;
    }
    pthread_mutex_unlock(&_ddp_thr_mu);
    if (dup || forked) {
        _ddp_thr_ep_release(e);
        return ddp_transport_fail(c, DDP_ERR_INTERNAL, "threads: %s", forked
                                  ? "the process forked between init and connecting"
                                  : "this communicator id and rank are registered twice in this process");
    }
    __atomic_store_n(&tp->me, e, __ATOMIC_RELEASE);
    return DDP_SUCCESS;
}

_DDP_PRIVATE int _ddp_thr_reachable(void *state, int peer) {
    _ddp_thr_t *tp = (_ddp_thr_t *)state;
    const ddp_transport_ctx_t *c = tp->ctx;
    _ddp_thr_addr_t a;
    size_t len = 0;
    if (!tp->me) {
        if (tp->setup_failed) return 0;
        if (_ddp_thr_setup(tp) != DDP_SUCCESS) { tp->setup_failed = 1; return 0; }
    }
    /* Same process means same host: skip the store for everyone else. */
    if (strcmp(c->host_id(c->host, peer), c->host_id(c->host, tp->rank)) != 0) return 0;
    /* A peer without this transport (another binary, another DDP_TRANSPORT) published nothing:
     * ask first, since a lookup would wait for the key until the timeout. */
    if (!c->published(c->host, "threads", peer)) return 0;
    if (c->lookup(c->host, "threads", peer, &a, sizeof a, &len) != DDP_SUCCESS || len != sizeof a)
        return 0;
    return a.magic == _DDP_THR_MAGIC && a.version == _DDP_THR_VERSION && a.pid == tp->addr.pid &&
           a.nonce == tp->addr.nonce && a.registry == tp->addr.registry;
}

/* Both sides do the same: find the peer's endpoint in the registry (not there yet: call again).
 * The registry key (communicator id, rank) is the identity check; reachable() already made sure
 * the peer is in this process. */
_DDP_PRIVATE void _ddp_thr_req_put(_ddp_thr_conn_t *k, _ddp_thr_req_t *q);

_DDP_PRIVATE ddp_result_t _ddp_thr_connect(void *state, int peer, void **conn) {
    _ddp_thr_t *tp = (_ddp_thr_t *)state;
    const ddp_transport_ctx_t *c = tp->ctx;
    _ddp_thr_ep_t *x;
    _ddp_thr_conn_t *k;
    int i;
    *conn = NULL;
    if (!tp->me) return ddp_transport_fail(c, DDP_ERR_INTERNAL, "threads: connect before setup");
    pthread_mutex_lock(&_ddp_thr_mu);
    for (x = _ddp_thr_registry; x; x = x->next)
        if (x->comm_id == tp->me->comm_id && x->rank == peer) break;
    if (x) x->refs++;
    pthread_mutex_unlock(&_ddp_thr_mu);
    if (!x) return DDP_SUCCESS;
    if (x->nranks != tp->nranks) {
        _ddp_thr_ep_release(x);
        return ddp_transport_fail(c, DDP_ERR_MISMATCH, "threads: rank %d has %d ranks, this rank %d",
                                  peer, x->nranks, tp->nranks);
    }
    k = (_ddp_thr_conn_t *)ddp_transport_calloc(c, sizeof *k);
    if (!k) {
        _ddp_thr_ep_release(x);
        return ddp_transport_fail(c, DDP_ERR_OUT_OF_MEMORY, "threads: connection");
    }
    k->tp = tp;
    k->peer = peer;
    k->pep = x;
    k->out = &x->inbox[tp->rank].c;
    k->in = &tp->me->inbox[peer].c;
    for (i = _DDP_THR_POOL - 1; i >= 0; i--) _ddp_thr_req_put(k, &k->pool[i]);
    tp->conns[peer] = k;
    *conn = k;
    _DDP_TLOG(c, DDP_LOG_TRACE, "threads: connected to rank %d (same process)", peer);
    return DDP_SUCCESS;
}

/* ---------------------------------------------------------------- point-to-point */
_DDP_PRIVATE _ddp_thr_req_t *_ddp_thr_req_get(_ddp_thr_conn_t *k) {
    _ddp_thr_req_t *q;
    if (!k->free_list) {
        /* A burst beyond the pool (a group posting more than the window, a transport user
         * with many requests): 32 more, kept until close. */
        _ddp_thr_chunk_t *ch = (_ddp_thr_chunk_t *)ddp_transport_calloc(k->tp->ctx, sizeof *ch);
        int i;
        if (!ch) return NULL;
        ch->next = k->chunks;
        k->chunks = ch;
        for (i = _DDP_THR_POOL - 1; i >= 0; i--) _ddp_thr_req_put(k, &ch->req[i]);
    }
    q = k->free_list;
    k->free_list = _DDP_THR_REQ(q->h.next);
    q->h.next = NULL;
    return q;
}

_DDP_PRIVATE void _ddp_thr_req_put(_ddp_thr_conn_t *k, _ddp_thr_req_t *q) {
    __atomic_store_n(&q->state, (uint32_t)_DDP_THR_FREE, __ATOMIC_RELAXED);
    q->h.conn = k;
    q->h.next = k->free_list ? &k->free_list->h : NULL;
    k->free_list = q;
}

/* Under ch->mu: removes q from its FIFO; 0 if it is not there (a peer is copying it). */
_DDP_PRIVATE int _ddp_thr_unlink(_ddp_thr_chan_t *ch, _ddp_thr_req_t *q) {
    _ddp_transport_queue_t *f = q->h.is_send ? &ch->sends : &ch->recvs;
    _ddp_transport_req_t *prev = NULL, *x;
    for (x = f->head; x && x != &q->h; x = x->next) prev = x;
    if (!x) return 0;
    if (prev) prev->next = x->next; else f->head = x->next;
    if (f->tail == x) f->tail = prev;
    x->next = NULL;
    return 1;
}

/* "collective #N (signature S)" for a tag made by the communicator (digest << 32 | sequence). */
_DDP_PRIVATE ddp_result_t _ddp_thr_mismatch(_ddp_thr_t *tp, int peer, int i_send, uint64_t my_tag,
                                            size_t my_len, uint64_t their_tag, size_t their_len) {
    return ddp_transport_fail(tp->ctx, DDP_ERR_MISMATCH, "threads: rank %d %s message #%u "
                              "(signature %08x) of %zu bytes, this rank %s #%u (signature %08x) of "
                              "%zu bytes: the ranks called different collectives, dtypes, ops, "
                              "roots or counts", peer, i_send ? "posted a receive for" : "sent",
                              (unsigned)(their_tag & 0xffffffffu), (unsigned)(their_tag >> 32),
                              their_len, i_send ? "sent" : "expected",
                              (unsigned)(my_tag & 0xffffffffu), (unsigned)(my_tag >> 32), my_len);
}

_DDP_PRIVATE ddp_result_t _ddp_thr_post(_ddp_thr_conn_t *k, int is_send, unsigned char *buf, size_t len,
                                        uint64_t tag, void **req) {
    _ddp_thr_t *tp = k->tp;
    _ddp_thr_chan_t *ch = is_send ? k->out : k->in;
    _ddp_thr_req_t *q, *o;
    *req = NULL;
    q = _ddp_thr_req_get(k);
    if (!q)
        return ddp_transport_fail(tp->ctx, DDP_ERR_OUT_OF_MEMORY, "threads: requests to rank %d",
                                  k->peer);
    q->h.buf = buf;
    q->h.len = len;
    q->h.tag = tag;
    q->h.is_send = is_send;
    q->err = DDP_SUCCESS;
    pthread_mutex_lock(&ch->mu);
    if (__atomic_load_n(&ch->closed, __ATOMIC_RELAXED) || __atomic_load_n(&ch->broken, __ATOMIC_RELAXED)) {
        int closed = (int)__atomic_load_n(&ch->closed, __ATOMIC_RELAXED);
        pthread_mutex_unlock(&ch->mu);
        _ddp_thr_req_put(k, q);
        if (closed) {
            _ddp_transport_blame(tp->ctx, k->peer);
            return ddp_transport_fail(tp->ctx, DDP_ERR_REMOTE, "threads: rank %d closed the "
                                      "connection (its communicator was destroyed, aborted or "
                                      "failed)", k->peer);
        }
        return ddp_transport_fail(tp->ctx, DDP_ERR_MISMATCH, "threads: an earlier message with "
                                  "rank %d did not match: the connection is unusable", k->peer);
    }
    o = _DDP_THR_REQ(is_send ? ch->recvs.head : ch->sends.head);
    if (!o) {
        /* First here: wait in our FIFO for the peer's matching post. */
        __atomic_store_n(&q->state, (uint32_t)_DDP_THR_POSTED, __ATOMIC_RELAXED);
        _ddp_transport_queue_push(is_send ? &ch->sends : &ch->recvs, &q->h);
        pthread_mutex_unlock(&ch->mu);
        *req = q;
        return DDP_SUCCESS;
    }
    /* Second: take the head of the peer's FIFO. */
    _ddp_transport_queue_pop(is_send ? &ch->recvs : &ch->sends);
    o->h.next = NULL;
    if (o->h.tag != tag || o->h.len != len) {
        __atomic_store_n(&ch->broken, 1u, __ATOMIC_RELEASE);
        o->other_tag = tag;
        o->other_len = len;
        o->err = DDP_ERR_MISMATCH;
        __atomic_store_n(&o->state, (uint32_t)_DDP_THR_FAILED, __ATOMIC_SEQ_CST);
        pthread_mutex_unlock(&ch->mu);
        _ddp_thr_wake(k->pep);
        _ddp_thr_req_put(k, q);
        return _ddp_thr_mismatch(tp, k->peer, is_send, tag, len, o->h.tag, o->h.len);
    }
    /* The copy runs outside the lock; `copying` tells a closing peer to wait for it. */
    __atomic_add_fetch(&ch->copying, 1u, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&ch->mu);
    if (len) memcpy(is_send ? o->h.buf : buf, is_send ? buf : o->h.buf, len);
    __atomic_store_n(&o->state, (uint32_t)_DDP_THR_DONE, __ATOMIC_SEQ_CST);
    __atomic_sub_fetch(&ch->copying, 1u, __ATOMIC_RELEASE);
    _ddp_thr_wake(k->pep);
    __atomic_store_n(&q->state, (uint32_t)_DDP_THR_DONE, __ATOMIC_RELAXED);
    *req = q;
    return DDP_SUCCESS;
}

_DDP_PRIVATE ddp_result_t _ddp_thr_isend(void *conn, const void *buf, size_t len, uint64_t tag, void *mr,
                                         void **req) {
    (void)mr;
    return _ddp_thr_post((_ddp_thr_conn_t *)conn, 1, (unsigned char *)(uintptr_t)buf, len, tag, req);
}

_DDP_PRIVATE ddp_result_t _ddp_thr_irecv(void *conn, void *buf, size_t len, uint64_t tag, void *mr, void **req) {
    (void)mr;
    return _ddp_thr_post((_ddp_thr_conn_t *)conn, 0, (unsigned char *)buf, len, tag, req);
}

/* Nothing to advance: the peer's post does the copy. A failed request stays out of the free list
 * (the communicator is going down anyway); close reclaims it. */
_DDP_PRIVATE ddp_result_t _ddp_thr_test(void *req, int *done) {
    _ddp_thr_req_t *q = (_ddp_thr_req_t *)req;
    _ddp_thr_conn_t *k = (_ddp_thr_conn_t *)q->h.conn;
    uint32_t s = __atomic_load_n(&q->state, __ATOMIC_ACQUIRE);
    *done = 0;
    if (s == _DDP_THR_POSTED) {
        _ddp_thr_chan_t *ch = q->h.is_send ? k->out : k->in;
        if (!__atomic_load_n(&ch->closed, __ATOMIC_ACQUIRE) && !__atomic_load_n(&ch->broken, __ATOMIC_ACQUIRE))
            return DDP_SUCCESS;
        pthread_mutex_lock(&ch->mu);
        s = __atomic_load_n(&q->state, __ATOMIC_ACQUIRE);
        if (s == _DDP_THR_POSTED && _ddp_thr_unlink(ch, q)) {
            q->err = __atomic_load_n(&ch->closed, __ATOMIC_RELAXED) ? DDP_ERR_REMOTE : DDP_ERR_MISMATCH;
            q->other_len = (size_t)-1;
            __atomic_store_n(&q->state, (uint32_t)_DDP_THR_FAILED, __ATOMIC_RELAXED);
            s = _DDP_THR_FAILED;
        }
        pthread_mutex_unlock(&ch->mu);
    }
    if (s == _DDP_THR_DONE) {
        _ddp_thr_req_put(k, q);
        *done = 1;
        return DDP_SUCCESS;
    }
    if (s != _DDP_THR_FAILED) return DDP_SUCCESS;
    if (q->err == DDP_ERR_MISMATCH && q->other_len != (size_t)-1)
        return _ddp_thr_mismatch(k->tp, k->peer, q->h.is_send, q->h.tag, q->h.len, q->other_tag, q->other_len);
    if (q->err == DDP_ERR_MISMATCH)
        return ddp_transport_fail(k->tp->ctx, DDP_ERR_MISMATCH, "threads: an earlier message "
                                  "with rank %d did not match: the connection is unusable",
                                  k->peer);
    _ddp_transport_blame(k->tp->ctx, k->peer);
    return ddp_transport_fail(k->tp->ctx, DDP_ERR_REMOTE, "threads: rank %d closed the connection "
                              "(its communicator was destroyed, aborted or failed) while this "
                              "rank %s %zu bytes (message #%u)", k->peer,
                              q->h.is_send ? "sent it" : "waited for", q->h.len,
                              (unsigned)(q->h.tag & 0xffffffffu));
}

/* 1 if one of k's requests finished or failed since it was posted, or the connection closed. */
_DDP_PRIVATE int _ddp_thr_conn_ready(_ddp_thr_conn_t *k) {
    const _ddp_thr_chunk_t *ch;
    int i;
    if (__atomic_load_n(&k->out->closed, __ATOMIC_SEQ_CST) || __atomic_load_n(&k->in->closed, __ATOMIC_SEQ_CST) ||
        __atomic_load_n(&k->out->broken, __ATOMIC_SEQ_CST) || __atomic_load_n(&k->in->broken, __ATOMIC_SEQ_CST))
        return 1;
    for (i = 0; i < _DDP_THR_POOL; i++)
        if (__atomic_load_n(&k->pool[i].state, __ATOMIC_SEQ_CST) >= _DDP_THR_DONE) return 1;
    for (ch = k->chunks; ch; ch = ch->next)
        for (i = 0; i < _DDP_THR_POOL; i++)
            if (__atomic_load_n(&ch->req[i].state, __ATOMIC_SEQ_CST) >= _DDP_THR_DONE) return 1;
    return 0;
}

_DDP_PRIVATE ddp_result_t _ddp_thr_wait(void *state, void *const *conns, int n, int timeout_ms) {
    _ddp_thr_t *tp = (_ddp_thr_t *)state;
    uint32_t seen;
    int i, ms = timeout_ms < 0 || timeout_ms > _DDP_THR_SLICE_MS ? _DDP_THR_SLICE_MS : timeout_ms;
    if (ms <= 0 || !tp->me) return DDP_SUCCESS;
    seen = _ddp_transport_bell_arm(&tp->me->bell.v);
    if (ddp_transport_aborted(tp->ctx)) ms = 0;
    for (i = 0; i < n && ms > 0; i++)
        if (_ddp_thr_conn_ready((_ddp_thr_conn_t *)conns[i])) ms = 0;
    _ddp_transport_bell_sleep(&tp->me->bell.v, seen, ms, 0);
    return DDP_SUCCESS;
}

/* Any thread, after the abort flag was set: wake this rank if it sleeps on its endpoint's bell
 * (every wait re-checks the flag after arming the bell, so the ring is never lost). */
_DDP_PRIVATE void _ddp_thr_abort(void *state) {
    _ddp_thr_t *tp = (_ddp_thr_t *)state;
    _ddp_thr_ep_t *me = tp ? __atomic_load_n(&tp->me, __ATOMIC_ACQUIRE) : NULL;
    if (me) _ddp_thr_wake(me);
}

/* Under ch->mu: marks the channel closed and takes our own waiting requests out of it. */
_DDP_PRIVATE void _ddp_thr_chan_close(_ddp_thr_chan_t *ch, int ours_are_sends) {
    _ddp_transport_queue_t *f = ours_are_sends ? &ch->sends : &ch->recvs;
    _ddp_transport_req_t *q, *next;
    pthread_mutex_lock(&ch->mu);
    __atomic_store_n(&ch->closed, 1u, __ATOMIC_SEQ_CST);
    for (q = f->head; q; q = next) {
        next = q->next;
        q->next = NULL;
        __atomic_store_n(&_DDP_THR_REQ(q)->state, (uint32_t)_DDP_THR_FAILED, __ATOMIC_RELAXED);
    }
    f->head = f->tail = NULL;
    pthread_mutex_unlock(&ch->mu);
}

/* Tells the peer at once (our closed flag, its channels, its doorbell), then waits until it no
 * longer touches our buffers: a copy it started, or a collective it is in. */
_DDP_PRIVATE ddp_result_t _ddp_thr_close(void *conn) {
    _ddp_thr_conn_t *k = (_ddp_thr_conn_t *)conn;
    _ddp_thr_t *tp;
    _ddp_thr_chunk_t *ch, *next;
    int spins = 0;
    if (!k) return DDP_SUCCESS;
    tp = k->tp;
    /* A fork child: the peers were threads of the parent; nothing here is this process's to
     * release but memory, left to its exit (their locks may have been copied held). */
    if (ddp_transport_forked(tp->ctx)) return DDP_SUCCESS;
    __atomic_store_n(&tp->me->flags.v.closed, 1u, __ATOMIC_SEQ_CST);
    _ddp_thr_chan_close(k->out, 1);
    _ddp_thr_chan_close(k->in, 0);
    _ddp_thr_wake(k->pep);
    while (__atomic_load_n(&k->out->copying, __ATOMIC_ACQUIRE) || __atomic_load_n(&k->in->copying, __ATOMIC_ACQUIRE))
        if (spins < 64) { spins++; _ddp_transport_pause(); } else sched_yield();
    _ddp_thr_wait_idle(tp, k->pep);
    if (tp->conns[k->peer] == k) tp->conns[k->peer] = NULL;
    tp->coll_enabled = 0;
    _ddp_thr_ep_release(k->pep);
    for (ch = k->chunks; ch; ch = next) {
        next = ch->next;
        ddp_transport_free(tp->ctx, ch);
    }
    ddp_transport_free(tp->ctx, k);
    return DDP_SUCCESS;
}

_DDP_PRIVATE ddp_result_t _ddp_thr_finalize(void *state) {
    _ddp_thr_t *tp = (_ddp_thr_t *)state;
    int i;
    if (!tp || ddp_transport_forked(tp->ctx)) return DDP_SUCCESS;   /* see _ddp_thr_close */
    for (i = 0; tp->conns && i < tp->nranks; i++) if (tp->conns[i]) _ddp_thr_close(tp->conns[i]);
    if (tp->me) {
        _ddp_thr_ep_t **pp;
        __atomic_store_n(&tp->me->flags.v.closed, 1u, __ATOMIC_SEQ_CST);
        pthread_mutex_lock(&_ddp_thr_mu);
        for (pp = &_ddp_thr_registry; *pp; pp = &(*pp)->next)
            if (*pp == tp->me) { *pp = tp->me->next; break; }
        pthread_mutex_unlock(&_ddp_thr_mu);
        _ddp_thr_ep_release(tp->me);
    }
    ddp_transport_free(tp->ctx, tp->conns);
    ddp_transport_free(tp->ctx, tp->eps);
    ddp_transport_free(tp->ctx, (void *)tp->sendp);
    ddp_transport_free(tp->ctx, tp->recvp);
    ddp_transport_free(tp->ctx, tp->tmp);
    ddp_transport_free(tp->ctx, tp);
    return DDP_SUCCESS;
}

/* ---------------------------------------------------------------- collectives */
/* A rank that closed its communicator, or -1: preferably one that never reached step `target`
 * (it left; the others may have failed only because of it). */
_DDP_PRIVATE int _ddp_thr_closed_peer(const _ddp_thr_t *tp, uint64_t target) {
    int q, first = -1;
    for (q = 0; q < tp->nranks; q++) {
        const _ddp_thr_ep_t *e = tp->eps[q];
        if (q == tp->rank || !__atomic_load_n(&e->flags.v.closed, __ATOMIC_SEQ_CST)) continue;
        if (__atomic_load_n(&e->phase.v, __ATOMIC_SEQ_CST) < target) return q;
        if (first < 0) first = q;
    }
    return first;
}

/* Publishes this rank's next step (with arrive: the first step of a collective, in its slot
 * too: the word the peers then wait on). */
_DDP_PRIVATE void _ddp_thr_publish(_ddp_thr_t *tp, int arrive) {
    int q;
    if (!arrive) {
        __atomic_store_n(&tp->me->phase.v, ++tp->phase, __ATOMIC_SEQ_CST);
    } else {
        __atomic_store_n(&tp->me->phase.v, ++tp->phase, __ATOMIC_RELEASE);
        __atomic_store_n(&tp->me->slot[tp->ncoll & 1].v.step, tp->phase, __ATOMIC_SEQ_CST);
    }
    for (q = 0; q < tp->nranks; q++) if (q != tp->rank) _ddp_thr_wake(tp->eps[q]);
}

/* Waits until every other rank has published step tp->phase; with sig (the first step of a
 * collective: watch the slots), checks that they called the same thing. Spin, then yield, then
 * sleep; the clock is read only now and then. */
/* Rank `gone` closed while this one waited for step `target`: the failure to report. A rank
 * that saw another call here fails and closes at once, maybe before the rank we wait for
 * arrives: every rank must still say MISMATCH, so look at the calls of all who did arrive
 * before blaming the closed one. */
_DDP_PRIVATE ddp_result_t _ddp_thr_peer_left(_ddp_thr_t *tp, const _ddp_transport_sig_t *sig,
                                             uint64_t target, int gone, int kind, const char *step) {
    const int slot = (int)(tp->ncoll & 1);
    int o;
    for (o = 0; sig && o < tp->nranks; o++) {
        const _ddp_thr_ep_t *f = tp->eps[o];
        char theirs[160], ours[160];
        if (o == tp->rank || __atomic_load_n(&f->slot[slot].v.step, __ATOMIC_ACQUIRE) < target ||
            !_ddp_transport_sig_differs(&f->slot[slot].v.sig, sig))
            continue;
        _ddp_transport_sig_str(&f->slot[slot].v.sig, theirs, sizeof theirs);
        _ddp_transport_sig_str(sig, ours, sizeof ours);
        return ddp_transport_fail(tp->ctx, DDP_ERR_MISMATCH, "threads: rank %d called %s, this "
                                  "rank %s: the ranks called different collectives, dtypes, ops, "
                                  "roots or counts", o, theirs, ours);
    }
    return ddp_transport_fail(tp->ctx, DDP_ERR_REMOTE, "threads: rank %d closed the connection "
                              "(its communicator was destroyed, aborted or failed) during %s "
                              "(phase %s)", gone, _ddp_kind_name(kind), step);
}

/* A wait that lasts says so (transports/ddp_transport.h), naming every rank from q on that has
 * not reached step tp->phase yet (those before it have). */
_DDP_PRIVATE void _ddp_thr_note_wait(_ddp_thr_t *tp, _ddp_transport_spin_t *s, const _ddp_transport_sig_t *sig,
                                     int kind, const char *step, int q) {
    const int slot = (int)(tp->ncoll & 1);
    _ddp_transport_ranks_t missing;
    char detail[64];
    _ddp_transport_ranks_init(&missing);
    for (; q < tp->nranks; q++) {
        const _ddp_thr_ep_t *e = tp->eps[q];
        if (q != tp->rank && __atomic_load_n(sig ? &e->slot[slot].v.step : &e->phase.v, __ATOMIC_ACQUIRE) < tp->phase)
            _ddp_transport_ranks_add(&missing, q);
    }
    if (!missing.n) return;   /* they all came meanwhile */
    snprintf(detail, sizeof detail, "threads, phase %s", step);
    _ddp_transport_note_wait(tp->ctx, s, kind, detail, _ddp_transport_ranks_str(&missing));
}

_DDP_PRIVATE ddp_result_t _ddp_thr_wait_all(_ddp_thr_t *tp, const _ddp_transport_sig_t *sig, int kind,
                                            const char *step) {
    const uint64_t target = tp->phase;
    const int p = tp->nranks, slot = (int)(tp->ncoll & 1);
    const ddp_transport_ctx_t *c = tp->ctx;
    _ddp_transport_spin_t s;
    int q = 0;
    _ddp_transport_spin_start(&s, tp->spin_us, tp->oversubscribed, c->timeout_ms);
    while (q < p) {
        _ddp_thr_ep_t *e;
        const uint64_t *word;
        if (q == tp->rank) { q++; continue; }
        e = tp->eps[q];
        word = sig ? &e->slot[slot].v.step : &e->phase.v;
        if (__atomic_load_n(word, __ATOMIC_ACQUIRE) >= target) {
            const _ddp_transport_sig_t *g = &e->slot[slot].v.sig;
            if (sig && _ddp_transport_sig_differs(g, sig)) {
                char theirs[160], ours[160];
                _ddp_transport_sig_str(g, theirs, sizeof theirs);
                _ddp_transport_sig_str(sig, ours, sizeof ours);
                return ddp_transport_fail(c, DDP_ERR_MISMATCH, "threads: rank %d called %s, this "
                                          "rank %s: the ranks called different collectives, "
                                          "dtypes, ops, roots or counts", q, theirs, ours);
            }
            q++;
            continue;
        }
        if (_ddp_transport_spin_fast(&s)) continue;
        if (_ddp_transport_spin_tick(&s)) {
            int gone;
            if (ddp_transport_aborted(c))
                return ddp_transport_fail(c, DDP_ERR_ABORTED, "threads: %s (phase %s), waiting for "
                                          "rank %d: ddp_comm_abort was called on this rank",
                                          _ddp_kind_name(kind), step, q);
            /* A peer that closed will not come; the one we wait for may still have arrived
             * meanwhile (the closer left after the end of this step): look again first. */
            if ((gone = _ddp_thr_closed_peer(tp, target)) >= 0 &&
                __atomic_load_n(word, __ATOMIC_SEQ_CST) < target)
                return _ddp_thr_peer_left(tp, sig, target, gone, kind, step);
            if (_ddp_transport_spin_expired(&s)) {
                if (c->waiting_on) *c->waiting_on = q;
                return ddp_transport_fail(c, DDP_ERR_TIMEOUT, "threads: %s (phase %s): rank %d did "
                                          "not arrive within %d ms", _ddp_kind_name(kind),
                                          step, q, s.timeout_ms);
            }
            if (_ddp_transport_note_due(c, &s)) _ddp_thr_note_wait(tp, &s, sig, kind, step, q);
        }
        if (_ddp_transport_spin_slow(&s)) continue;
        {
            int ms = _DDP_THR_SLICE_MS;
            uint32_t seen;
            if (s.deadline && (s.deadline - s.now) / 1000 + 1 < ms)
                ms = (int)((s.deadline - s.now) / 1000) + 1;
            seen = _ddp_transport_bell_arm(&tp->me->bell.v);
            if (__atomic_load_n(word, __ATOMIC_SEQ_CST) >= target ||
                _ddp_thr_closed_peer(tp, target) >= 0 || ddp_transport_aborted(c))
                ms = 0;
            _ddp_transport_bell_sleep(&tp->me->bell.v, seen, ms, 0);
        }
    }
    return DDP_SUCCESS;
}

/* Starts collective tp->ncoll: publishes the signature, the buffers and (one-step collectives)
 * inl_bytes of data, then waits for everyone. zero_copy: the peers will touch these buffers and
 * we theirs; `busy` is then set first and the peers' closed flags read after the wait (a Dekker
 * pair with _ddp_thr_close: either we see a peer closed and touch nothing of it, or it sees us
 * busy and waits before its owner may reuse or free its buffers). */
_DDP_PRIVATE ddp_result_t _ddp_thr_arrive(_ddp_thr_t *tp, const _ddp_transport_sig_t *sig, const void *send,
                                          void *recv, const void *inl, size_t inl_bytes, int zero_copy) {
    const int slot = (int)(tp->ncoll & 1);
    _ddp_thr_ep_t *e = tp->me;
    ddp_result_t r;
    int q;
    if (!tp->coll_enabled)
        return ddp_transport_fail(tp->ctx, DDP_ERR_INTERNAL, "threads: %s: a connection is "
                                  "closed", _ddp_kind_name(sig->kind));
    /* The line the peers spin on (step, signature, first data bytes) is written last, all at
     * once: writing it first would make it bounce between the cores while the rest is copied. */
    if (inl_bytes > _DDP_THR_HEAD)
        memcpy(e->slot[slot].v.data + _DDP_THR_HEAD, (const unsigned char *)inl + _DDP_THR_HEAD,
               inl_bytes - _DDP_THR_HEAD);
    e->bufs.v.send[slot] = send;
    e->bufs.v.recv[slot] = recv;
    e->slot[slot].v.sig = *sig;
    if (inl_bytes) memcpy(e->slot[slot].v.data, inl, inl_bytes < _DDP_THR_HEAD ? inl_bytes : _DDP_THR_HEAD);
    if (zero_copy) __atomic_store_n(&e->flags.v.busy, 1u, __ATOMIC_SEQ_CST);
    _ddp_thr_publish(tp, 1);
    r = _ddp_thr_wait_all(tp, sig, sig->kind, "arrive");
    if (r != DDP_SUCCESS || !zero_copy) return r;
    if ((q = _ddp_thr_closed_peer(tp, tp->phase)) >= 0)
        return ddp_transport_fail(tp->ctx, DDP_ERR_REMOTE, "threads: rank %d closed the "
                                  "connection (its communicator was destroyed, aborted or failed) "
                                  "during %s", q, _ddp_kind_name(sig->kind));
    for (q = 0; q < tp->nranks; q++) {
        tp->sendp[q] = (const unsigned char *)tp->eps[q]->bufs.v.send[slot];
        tp->recvp[q] = (unsigned char *)tp->eps[q]->bufs.v.recv[slot];
    }
    return DDP_SUCCESS;
}

/* Ends the collective. A failure goes back to the communicator, which poisons itself: it
 * publishes the failure (so that the peers can name the first one) and then closes every
 * connection, and _ddp_thr_close marks this rank closed and waits until no peer is inside a
 * collective that may still touch our buffers, all before the call returns to the user. */
_DDP_PRIVATE ddp_result_t _ddp_thr_finish(_ddp_thr_t *tp, ddp_result_t r, int zero_copy) {
    if (zero_copy) __atomic_store_n(&tp->me->flags.v.busy, 0u, __ATOMIC_RELEASE);
    tp->ncoll++;
    return r;
}

/* Publishes the end of this rank's part and waits until everyone is done with our buffers. */
_DDP_PRIVATE ddp_result_t _ddp_thr_depart(_ddp_thr_t *tp, int kind) {
    _ddp_thr_publish(tp, 0);
    return _ddp_thr_wait_all(tp, NULL, kind, "depart");
}

/* The all-reduce's copies into the other ranks' receive buffers (lines another core holds).
 * x86-64: 16-byte vector moves, because glibc's memcpy switches to rep movsb from about 2 KiB,
 * and that measured 2.5-4x slower for these writes (AMD EPYC VM, p = 2: 8 KiB all-reduce 3.0 vs
 * 0.8 us, 64 KiB 13.8 vs 3.2 us; equal from 1 MiB). Copies into our own buffers (all-gather,
 * broadcast) measured as fast or faster with memcpy and keep it. */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <emmintrin.h>
_DDP_PRIVATE void _ddp_thr_push(unsigned char *dst, const unsigned char *src, size_t n) {
    size_t i;
    if (n < 256) { memcpy(dst, src, n); return; }
    for (i = 0; i + 64 <= n; i += 64) {
        __m128i a = _mm_loadu_si128((const __m128i *)(const void *)(src + i));
        __m128i b = _mm_loadu_si128((const __m128i *)(const void *)(src + i + 16));
        __m128i c = _mm_loadu_si128((const __m128i *)(const void *)(src + i + 32));
        __m128i d = _mm_loadu_si128((const __m128i *)(const void *)(src + i + 48));
        _mm_storeu_si128((__m128i *)(void *)(dst + i), a);
        _mm_storeu_si128((__m128i *)(void *)(dst + i + 16), b);
        _mm_storeu_si128((__m128i *)(void *)(dst + i + 32), c);
        _mm_storeu_si128((__m128i *)(void *)(dst + i + 48), d);
    }
    memcpy(dst + i, src + i, n - i);
}
#else
_DDP_PRIVATE void _ddp_thr_push(unsigned char *dst, const unsigned char *src, size_t n) { memcpy(dst, src, n); }
#endif

/* dst = src[0] op src[1] op ... op src[p-1] over n elements at element offset off, in rank order;
 * AVG divides once at the end. */
_DDP_PRIVATE void _ddp_thr_reduce_block(_ddp_thr_t *tp, unsigned char *dst, const unsigned char *const *src,
                                        size_t off, size_t n, ddp_dtype_t dtype, ddp_op_t op) {
    const size_t es = ddp_dtype_size(dtype);
    int q;
    ddp_reduce_local(dst, src[0] + off * es, src[1] + off * es, n, dtype, op);
    for (q = 2; q < tp->nranks; q++) ddp_reduce_local(dst, dst, src[q] + off * es, n, dtype, op);
    if (op == DDP_AVG) ddp_divide_local(dst, n, dtype, tp->nranks);
}

/* In place (send == recv on some or all ranks) is race-free:
 *  - slice r of every send buffer is read by rank r only, and slice r of every receive buffer
 *    is written by rank r only. Rank r reads a block of slice r from all p send buffers into
 *    tmp before it writes that block anywhere, and later blocks are disjoint from it: what it
 *    overwrites (in place, recv q = send q) it has already read, and nobody else reads it.
 *  - the other slices of our buffers are read and written by their owners only, and the
 *    depart step makes every rank wait until all p slices are written everywhere.
 *  - the small path copies the data into the endpoint before anything is written. */
_DDP_PRIVATE ddp_result_t _ddp_thr_all_reduce(void *state, const void *sendbuf, void *recvbuf,
                                              size_t count, ddp_dtype_t dtype, ddp_op_t op) {
    _ddp_thr_t *tp = (_ddp_thr_t *)state;
    const size_t es = ddp_dtype_size(dtype), bytes = count * es;
    const int p = tp->nranks, me = tp->rank;
    _ddp_transport_sig_t sig;
    ddp_result_t r;
    _ddp_transport_sig_set(&sig, DDP_CALL_ALL_REDUCE, dtype, op, count, 0);
    if (bytes <= tp->small_max) {
        const int slot = (int)(tp->ncoll & 1);
        r = _ddp_thr_arrive(tp, &sig, sendbuf, recvbuf, sendbuf, bytes, 0);
        if (r == DDP_SUCCESS && bytes) {
            int q;
            unsigned char *dst = (unsigned char *)recvbuf;
            ddp_reduce_local(dst, tp->eps[0]->slot[slot].v.data, tp->eps[1]->slot[slot].v.data,
                             count, dtype, op);
            for (q = 2; q < p; q++) ddp_reduce_local(dst, dst, tp->eps[q]->slot[slot].v.data, count, dtype, op);
            if (op == DDP_AVG) ddp_divide_local(dst, count, dtype, p);
        }
        return _ddp_thr_finish(tp, r, 0);
    }
    r = _ddp_thr_arrive(tp, &sig, sendbuf, recvbuf, NULL, 0, 1);
    if (r == DDP_SUCCESS) {
        const size_t lo = count * (size_t)me / (size_t)p, hi = count * (size_t)(me + 1) / (size_t)p;
        const size_t per = _DDP_THR_BLOCK / es;
        size_t off, n;
        int j;
        for (off = lo; off < hi; off += n) {
            n = hi - off < per ? hi - off : per;
            _ddp_thr_reduce_block(tp, tp->tmp, tp->sendp, off, n, dtype, op);
            for (j = 0; j < p; j++)   /* starting with the next rank: not everyone at rank 0 */
                _ddp_thr_push(tp->recvp[(me + 1 + j) % p] + off * es, tp->tmp, n * es);
        }
        r = _ddp_thr_depart(tp, DDP_CALL_ALL_REDUCE);
    }
    return _ddp_thr_finish(tp, r, 1);
}

/* In place, recvbuf is block r of rank r's send buffer (NCCL's layout): only rank r reads that
 * block, into tmp before writing it. Small (the whole send buffer fits the endpoint): one step,
 * rank r reduces block r of the p copies. */
_DDP_PRIVATE ddp_result_t _ddp_thr_reduce_scatter(void *state, const void *sendbuf, void *recvbuf,
                                                  size_t rc, ddp_dtype_t dtype, ddp_op_t op) {
    _ddp_thr_t *tp = (_ddp_thr_t *)state;
    const size_t es = ddp_dtype_size(dtype), total = rc * es * (size_t)tp->nranks;
    _ddp_transport_sig_t sig;
    ddp_result_t r;
    _ddp_transport_sig_set(&sig, DDP_CALL_REDUCE_SCATTER, dtype, op, rc, 0);
    if (total <= tp->small_max) {
        const int slot = (int)(tp->ncoll & 1);
        const size_t off = rc * es * (size_t)tp->rank;
        r = _ddp_thr_arrive(tp, &sig, sendbuf, recvbuf, sendbuf, total, 0);
        if (r == DDP_SUCCESS && rc) {
            int q;
            unsigned char *dst = (unsigned char *)recvbuf;
            ddp_reduce_local(dst, tp->eps[0]->slot[slot].v.data + off, tp->eps[1]->slot[slot].v.data + off,
                             rc, dtype, op);
            for (q = 2; q < tp->nranks; q++)
                ddp_reduce_local(dst, dst, tp->eps[q]->slot[slot].v.data + off, rc, dtype, op);
            if (op == DDP_AVG) ddp_divide_local(dst, rc, dtype, tp->nranks);
        }
        return _ddp_thr_finish(tp, r, 0);
    }
    r = _ddp_thr_arrive(tp, &sig, sendbuf, recvbuf, NULL, 0, 1);
    if (r == DDP_SUCCESS) {
        const size_t per = _DDP_THR_BLOCK / es, base = rc * (size_t)tp->rank;
        size_t off, n;
        for (off = 0; off < rc; off += n) {
            n = rc - off < per ? rc - off : per;
            _ddp_thr_reduce_block(tp, tp->tmp, tp->sendp, base + off, n, dtype, op);
            memcpy((unsigned char *)recvbuf + off * es, tp->tmp, n * es);
        }
        r = _ddp_thr_depart(tp, DDP_CALL_REDUCE_SCATTER);
    }
    return _ddp_thr_finish(tp, r, 1);
}

/* In place, sendbuf is block r of rank r's receive buffer: the others read it, nobody writes
 * it (each rank writes its own receive buffer only, and block r of it is left as is). Small:
 * one step, from copies in the endpoints. */
_DDP_PRIVATE ddp_result_t _ddp_thr_all_gather(void *state, const void *sendbuf, void *recvbuf,
                                              size_t sc, ddp_dtype_t dtype) {
    _ddp_thr_t *tp = (_ddp_thr_t *)state;
    const size_t bytes = sc * ddp_dtype_size(dtype);
    const int p = tp->nranks, me = tp->rank, small = bytes <= tp->small_max;
    _ddp_transport_sig_t sig;
    ddp_result_t r;
    _ddp_transport_sig_set(&sig, DDP_CALL_ALL_GATHER, dtype, DDP_SUM, sc, 0);
    r = _ddp_thr_arrive(tp, &sig, sendbuf, recvbuf, sendbuf, small ? bytes : 0, !small);
    if (r == DDP_SUCCESS && bytes) {
        int j;
        for (j = 0; j < p; j++) {
            const int q = (me + j) % p;
            unsigned char *dst = (unsigned char *)recvbuf + (size_t)q * bytes;
            if (q == me) { if (dst != sendbuf) memmove(dst, sendbuf, bytes); }
            else memcpy(dst, small ? tp->eps[q]->slot[tp->ncoll & 1].v.data : tp->sendp[q], bytes);
        }
    }
    if (r == DDP_SUCCESS && !small) r = _ddp_thr_depart(tp, DDP_CALL_ALL_GATHER);
    return _ddp_thr_finish(tp, r, !small);
}

_DDP_PRIVATE ddp_result_t _ddp_thr_broadcast(void *state, const void *sendbuf, void *recvbuf,
                                             size_t count, ddp_dtype_t dtype, int root) {
    _ddp_thr_t *tp = (_ddp_thr_t *)state;
    const size_t bytes = count * ddp_dtype_size(dtype);
    const int me = tp->rank;
    const int small = bytes <= tp->small_max;
    _ddp_transport_sig_t sig;
    ddp_result_t r;
    _ddp_transport_sig_set(&sig, DDP_CALL_BROADCAST, dtype, DDP_SUM, count, root);
    r = _ddp_thr_arrive(tp, &sig, sendbuf, recvbuf, me == root ? sendbuf : NULL,
                        me == root && small ? bytes : 0, !small);
    if (r == DDP_SUCCESS && bytes) {
        if (me == root) { if (recvbuf != sendbuf) memmove(recvbuf, sendbuf, bytes); }
        else memcpy(recvbuf, small ? tp->eps[root]->slot[tp->ncoll & 1].v.data : tp->sendp[root], bytes);
    }
    if (r == DDP_SUCCESS && !small) r = _ddp_thr_depart(tp, DDP_CALL_BROADCAST);
    return _ddp_thr_finish(tp, r, !small);
}

_DDP_PRIVATE ddp_result_t _ddp_thr_barrier(void *state) {
    _ddp_thr_t *tp = (_ddp_thr_t *)state;
    _ddp_transport_sig_t sig;
    memset(&sig, 0, sizeof sig);
    sig.kind = DDP_CALL_BARRIER;
    return _ddp_thr_finish(tp, _ddp_thr_arrive(tp, &sig, NULL, NULL, NULL, 0, 0), 0);
}

/* The communicator asks once every peer is connected through this transport. */
_DDP_PRIVATE ddp_result_t _ddp_thr_enable(void *state) {
    _ddp_thr_t *tp = (_ddp_thr_t *)state;
    const ddp_transport_ctx_t *c = tp->ctx;
    const char *s = getenv("DDP_THREADS_COLL");
    const int n = tp->nranks;
    long v;
    int q;
    if (s && !strcmp(s, "0")) {
        _DDP_TLOG(c, DDP_LOG_INFO, "threads: collectives over point-to-point (DDP_THREADS_COLL=0)");
        return DDP_ERR_UNSUPPORTED;
    }
    if (!tp->me) return DDP_ERR_UNSUPPORTED;
    for (q = 0; q < n; q++) if (q != tp->rank && !tp->conns[q]) return DDP_ERR_UNSUPPORTED;
    if (!tp->eps) {
        tp->eps = (_ddp_thr_ep_t **)ddp_transport_calloc(c, sizeof(void *) * (size_t)n);
        tp->sendp = (const unsigned char **)ddp_transport_calloc(c, sizeof(void *) * (size_t)n);
        tp->recvp = (unsigned char **)ddp_transport_calloc(c, sizeof(void *) * (size_t)n);
        tp->tmp = (unsigned char *)ddp_transport_calloc(c, _DDP_THR_BLOCK);
        if (!tp->eps || !tp->sendp || !tp->recvp || !tp->tmp) {
            _DDP_TLOG(c, DDP_LOG_WARN, "threads: out of memory for the collectives; using the ring");
            return DDP_ERR_OUT_OF_MEMORY;
        }
    }
    for (q = 0; q < n; q++) tp->eps[q] = q == tp->rank ? tp->me : tp->conns[q]->pep;
    /* As shm, measured there: with a CPU each, spinning costs nothing the peer needs and a futex
     * wake-up costs tens of microseconds; oversubscribed, spinning steals the peer's CPU. */
    tp->spin_us = _ddp_transport_spin_us(c, "DDP_THREADS_SPIN_US", n, &tp->oversubscribed);
    /* Measured (2-core AMD EPYC VM, float64, medians): p = 2, one step vs two: 64 B 0.31 vs
     * 0.39 us, 512 B 0.31-0.39 vs 0.45-0.53, 1 KiB 0.39-0.51 vs 0.48-0.60; p = 4 (2 CPUs)
     * 64 B-1 KiB 3-6.5 vs 6-12 us. Two steps win from 2 KiB (p = 2: 0.48 vs 0.66 us). */
    s = getenv("DDP_THREADS_SMALL_MAX");
    tp->small_max = s && _ddp_parse_long(s, 0, _DDP_THR_INLINE, &v) == 0 ? (size_t)v : _DDP_THR_SMALL_MAX;
    tp->coll_enabled = 1;
    _DDP_TLOG(c, DDP_LOG_INFO, "threads: collectives straight from the %d ranks' buffers (same "
              "process): all-reduce up to %zu bytes in one step through the endpoints, above: each "
              "rank reduces its slice from every send buffer into every receive buffer (2 steps); "
              "spin %d us%s; DDP_THREADS_COLL=0 for the ring", n, tp->small_max, tp->spin_us,
              tp->oversubscribed ? " (more ranks than CPUs: yielding while spinning)" : "");
    return DDP_SUCCESS;
}

static const ddp_coll_provider_t _ddp_thr_coll = {
    _ddp_thr_all_reduce, _ddp_thr_reduce_scatter, _ddp_thr_all_gather, _ddp_thr_broadcast,
    _ddp_thr_barrier, _ddp_thr_enable, NULL, NULL, NULL, NULL, NULL,
};

static const ddp_transport_t _ddp_threads_transport = {
    DDP_TRANSPORT_VERSION, "threads", 30,
    _ddp_thr_init, _ddp_thr_reachable, _ddp_thr_connect, _ddp_thr_connect,
    NULL, NULL, _ddp_thr_isend, _ddp_thr_irecv, _ddp_thr_test, _ddp_thr_wait,
    _ddp_thr_close, _ddp_thr_finalize, _ddp_thr_abort, &_ddp_thr_coll, NULL,
};

DDP_API const ddp_transport_t *ddp_transport_threads(void) { return &_ddp_threads_transport; }

_DDP_TRANSPORT_CONSTRUCTOR(_ddp_thr_register) {
    pthread_atfork(_ddp_thr_atfork_prepare, _ddp_thr_atfork_release, _ddp_thr_atfork_release);
    ddp_transport_register(&_ddp_threads_transport);
}

#endif /* DDP_THREADS implementation */
