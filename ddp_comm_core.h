/* SPDX-License-Identifier: MIT (see LICENSE) */
/* ddp_comm_core.h — the communicator itself, private: struct ddp_comm and the live registry,
 * fork handling, logging and failure (ddp_comm_fail, last error), store keys, the peers
 * (connect, poison, goodbye, root cause), the argument checks, stuck-rank diagnosis, and the
 * operation record (_ddp_op_t) with the caller's side of running one (_ddp_begin, _ddp_enter).
 *
 * Everything above it (ddp_rendezvous.h, ddp_comm_dispatch.h, ddp_comm_device.h,
 * ddp_comm_queue.h, ddp_comm_init.h, ddp_comm.h) is built on this. Depends on ddp_comm_types.h,
 * ddp_base.h, ddp_store.h, ddp_auth.h, ddp_kernels.h, transports/ddp_transport.h, ddp_engine.h,
 * ddp_algorithms.h, ddp_trace.h and ddp_model.h. Built by DDP_IMPLEMENTATION (or
 * DDP_COMM_CORE_IMPLEMENTATION).
 */
#if defined(DDP_IMPLEMENTATION) && !defined(DDP_COMM_CORE_IMPLEMENTATION)
#define DDP_COMM_CORE_IMPLEMENTATION
#endif
#if defined(DDP_COMM_CORE_IMPLEMENTATION)
#ifndef DDP_BASE_IMPLEMENTATION
#define DDP_BASE_IMPLEMENTATION
#endif
#ifndef DDP_STORE_IMPLEMENTATION
#define DDP_STORE_IMPLEMENTATION
#endif
#ifndef DDP_AUTH_IMPLEMENTATION
#define DDP_AUTH_IMPLEMENTATION
#endif
#ifndef DDP_KERNELS_IMPLEMENTATION
#define DDP_KERNELS_IMPLEMENTATION
#endif
#ifndef DDP_TRANSPORT_IMPLEMENTATION
#define DDP_TRANSPORT_IMPLEMENTATION
#endif
#ifndef DDP_ENGINE_IMPLEMENTATION
#define DDP_ENGINE_IMPLEMENTATION
#endif
#ifndef DDP_ALGORITHMS_IMPLEMENTATION
#define DDP_ALGORITHMS_IMPLEMENTATION
#endif
#ifndef DDP_TRACE_IMPLEMENTATION
#define DDP_TRACE_IMPLEMENTATION
#endif
#ifndef DDP_MODEL_IMPLEMENTATION
#define DDP_MODEL_IMPLEMENTATION
#endif
#endif
#include "ddp_comm_types.h"
#include "ddp_base.h"
#include "ddp_store.h"
#include "ddp_auth.h"
#include "ddp_kernels.h"
#include "transports/ddp_transport.h"
#include "ddp_engine.h"
#include "ddp_algorithms.h"
#include "ddp_trace.h"
#include "ddp_stats.h"
#include "ddp_model.h"

#ifndef DDP_COMM_CORE_H_INCLUDED
#define DDP_COMM_CORE_H_INCLUDED
#ifdef __cplusplus
extern "C" {
#endif
/* Public (ddp_comm.h points here): defined below and used by every header above. A line in the
 * communicator's log (its prefix, level and sink: stderr, DDP_DEBUG_FILE or desc.log_fn). */
DDP_API void ddp_comm_log(const ddp_comm_t *comm, ddp_log_level_t level, const char *fmt, ...)
#if defined(__GNUC__) || defined(__clang__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
/* Records the failure (shown by ddp_comm_last_error, logged at WARN) and returns r. */
DDP_API ddp_result_t ddp_comm_fail(ddp_comm_t *comm, ddp_result_t r, const char *fmt, ...)
#if defined(__GNUC__) || defined(__clang__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
#ifdef __cplusplus
}
#endif
#endif /* DDP_COMM_CORE_H_INCLUDED */

/* ============================================================================================
 * IMPLEMENTATION
 * ========================================================================================== */
#if defined(DDP_COMM_CORE_IMPLEMENTATION) && !defined(DDP_COMM_CORE_IMPL_INCLUDED)
#define DDP_COMM_CORE_IMPL_INCLUDED
#if !defined(DDP_STORE_IMPL_INCLUDED) || !defined(DDP_TRANSPORT_IMPL_INCLUDED) || !defined(DDP_RING_IMPL_INCLUDED)
#error "libddp: ddp_comm_core.h's implementation needs those of the headers below it (define DDP_IMPLEMENTATION)"
#endif

#ifdef __cplusplus
extern "C" {   /* the public calls defined here: C linkage, as ddp_comm.h declares them */
#endif

#define _DDP_DEFAULT_PORT 29500
/* Recursive doubling vs ring crossovers measured here (2-core VM, TCP loopback, float sum):
 * p=2 even at 32 KiB; p=4 even at 256 KiB; p=3 and p=6 (folded worlds) win at 64 KiB, lose
 * at 256 KiB. */
#define _DDP_RD_MAX_BYTES_P2 (16u << 10)
#define _DDP_RD_MAX_BYTES_POW2 (256u << 10)
#define _DDP_RD_MAX_BYTES_FOLDED (64u << 10)
/* Async lanes (DDP_ASYNC_LANES): off by default. On the 2-core VM this was built on, two TCP
 * connection sets carrying two 16 MiB all-reduces at once took 0.93-1.05x the time of one set
 * carrying them in turn: loopback TCP there is CPU-bound (1.9 of 2 cores busy), so nothing can
 * overlap. Where a NIC, not the CPU, is the limit, several streams are what NCCL and Gloo use
 * (bench/ddp_async.c measures it: try DDP_ASYNC_LANES=2). */
#define _DDP_DEFAULT_LANES 1
#define _DDP_AUTH_KEY_BYTES _DDP_SHA256_BYTES
/* World sizes beyond this fail at once instead of allocating per-rank tables first: rank 0's
 * store holds one connection per rank. */
#define _DDP_MAX_RANKS 65536
#define _DDP_LANE_MIN_BYTES ((size_t)4 << 20)

/* ---------------------------------------------------------------- communicator */
typedef struct { const ddp_transport_t *t; void *state; } _ddp_tinst_t;
typedef struct { int tinst; void *conn; } _ddp_peer_t;

#define _DDP_HOST_ID_LEN 160
#define _DDP_HOST_ENTRY (_DDP_HOST_ID_LEN + _DDP_CPU_MASK_BYTES)   /* host/N in the store */
#define _DDP_MAX_SLOTS 8
#define _DDP_MAX_LANES 4

/* A progress thread and the communicator it runs operations on (see "lanes" in ddp_comm_queue.h). */
typedef struct {
    struct ddp_comm *owner, *exec;
    int index;
    pthread_t thread;
    uint64_t cursor;               /* the last request this lane took */
} _ddp_lane_t;

/* Groups and send/recv: what ddp_group_start..ddp_group_end queue, and the sequence of the
 * messages to and from each peer. */
typedef struct {
    uint32_t *p2p;                 /* 4 per peer: ddp_send/ddp_recv messages sent to it and received
                                    * from it (the sequence in their tags); group_end's in flight */
    int depth, n, cap;             /* ddp_group_start nesting; calls queued, room */
    void *ops;                     /* the queued calls (_ddp_op_t), grown on demand, kept */
    unsigned char *fuse_buf;       /* a group's small all-reduces packed together (lazy, kept) */
    ddp_result_t err;              /* first failure of a call made inside the group */
} _ddp_comm_group_t;

/* Device (GPU) buffers: the device provider of a transport (transports/ddp_nccl.h). `provider`
 * once usable on every rank; `any` whenever one is compiled in (it still tells device pointers
 * apart, so that they get a clear error instead of a host dereference). */
typedef struct {
    const ddp_device_provider_t *provider, *any;
    void *state, *any_state;
    void *inherited;               /* a split's device communicator, for the child's setup */
    char declined[512];            /* why `provider` is NULL */
    uint64_t seq;                  /* device calls issued: their numbers in logs and errors */
    int check;                     /* DDP_NCCL_CHECK: ranks compare each call's fingerprint */
    uint64_t *prints;              /* nranks fingerprints (DDP_NCCL_CHECK only, kept) */
    int busy;                      /* the user's thread is in a device call (atomic, nests) */
} _ddp_comm_device_t;

/* Async requests and abort. aborted/busy are atomics (Dekker pair: an operation starts only if
 * no abort came first; abort poisons the communicator itself only if nothing runs). */
typedef struct {
    int aborted, busy, abort_claimed;
    pthread_mutex_t amu;           /* the request ring and the progress thread's state */
    pthread_cond_t acv;            /* something queued, or stop */
    pthread_cond_t adone;          /* an operation finished */
    int async_init, progress_on, progress_stop;
    struct _ddp_op *ops;           /* DDP_MAX_REQUESTS slots; op number n lives in slot n % max */
    uint64_t issued, finished;     /* requests submitted / done, all of 1..finished (issue order) */
    _ddp_lane_t lanes[_DDP_MAX_LANES]; /* lane 0 runs on this communicator, the others on copies */
    int nlanes, want_lanes;        /* running; DDP_ASYNC_LANES */
    size_t lane_min_bytes;         /* DDP_LANE_MIN_BYTES: smaller requests all go to lane 0 */
    uint64_t big_ops;              /* requests >= lane_min_bytes so far: picks their lane */
    ddp_result_t abort_code;       /* why it was aborted, when not by ddp_comm_abort */
    int abort_suspect;             /* 1 + the rank an internal abort blamed (0: none) */
    char abort_reason[640];
} _ddp_comm_queue_t;

/* The algorithm choice: who runs the collectives (a transport, or the algorithms over the
 * engine) and which all-reduce algorithm, from the settings, the hosts and the cost model. */
typedef struct {
    int algo;                      /* _DDP_ALGO_*: DDP_ALGO, else chosen by size */
    int deterministic;             /* 1: reductions add in rank order (ddp_deterministic.h) */
    const ddp_coll_provider_t *coll; /* a transport that runs the collectives itself, or NULL */
    void *coll_state;
    size_t rd_max_bytes;           /* auto: recursive doubling up to this many bytes */
    /* Hosts and the all-reduce cost model (issue 18): auto on several hosts picks by the model */
    _ddp_layout_t layout;          /* ranks, hosts, fewest/most ranks on a host */
    _ddp_hier_t hier;              /* this rank's groups in the hierarchical all-reduce */
    int *hier_ranks;               /* the storage of hier.local.ranks and hier.inter.ranks */
    int *host_of;                  /* DDP_TEST_HOSTS only: each rank's host number (for splits) */
    _ddp_model_t model;            /* rank 0's (DDP_MODEL, else built in): the same everywhere */
    signed char ar_pick[64];       /* calls of up to 2^k bytes: auto's algorithm (_ddp_ar_algo_t) */
    signed char hier_pick[64];     /* DDP_ALGO=hier: the hierarchical algorithm the model picks */
} _ddp_comm_choice_t;

/* Bootstrap: where and how the communicator met its peers (settings, the store, the job's
 * identity and keys, the host table), kept for lanes, splits and destroy. */
typedef struct {
    unsigned char token[_DDP_AUTH_KEY_BYTES];     /* rank 0's random, through the store */
    unsigned char data_key[_DDP_AUTH_KEY_BYTES];  /* what data connections prove (never sent) */
    int local_rank, local_size;
    char master_addr[256];
    int master_port;
    char ifname[256];
    char prefix[128];
    char job[160];                 /* the launcher's job identity ("" if none): rendezvous check */
    int foreign;                   /* the store belongs to another job: never write to it */
    ddp_store_t *store;
    int own_store;
    char *host_ids;                /* nranks * _DDP_HOST_ID_LEN */
    int64_t init_deadline_us;      /* the whole rendezvous ends by then (0: no timeout) */
    uint32_t splits;               /* ddp_comm_split calls: part of the child's store prefix */
    ddp_store_t *extra_store;      /* ddp_comm_init_threads' private store server (rank 0) */
    /* Addresses the transports publish while init opens them (hold_pub) are held here and go
     * to the store in one batch with the rank's join (ddp_rendezvous.h: _ddp_rendezvous_wait):
     * a round trip less per rank. Any other use of the store meanwhile (a lookup, a check)
     * sends them first, so no reader can miss one. */
    int hold_pub, nheld;
    struct { char key[256]; unsigned char val[256]; size_t len; } held[8];
} _ddp_comm_boot_t;

/* The peers: the transport instances this communicator opened, and per rank which one reaches
 * it and over which connection (picked at init, connected on first use). */
typedef struct {
    _ddp_tinst_t tinst[_DDP_MAX_TRANSPORTS];
    int ntinst;
    _ddp_peer_t *by_rank;          /* nranks entries */
    char transport_name[32];       /* desc.transport / DDP_TRANSPORT, "" for auto (for copies) */
} _ddp_comm_peers_t;

/* Shrinks (ddp_comm_shrink.h): where this communicator stands in a line of shrinks, and what
 * its failure tells the next one. */
typedef struct {
    int generation;                /* shrinks from the first communicator to this one */
    int *parent_ranks;             /* nranks entries: each rank's rank in the parent (NULL: none) */
    int *removed;                  /* the parent ranks the shrink that made this one removed */
    int nremoved;
    int suspect, has_suspect;      /* the peer this rank's failure blamed: the stuck rank of a
                                    * timeout, or the one whose connection broke */
    int closed_noted;              /* closed/<rank> is in the store: this rank closed on purpose */
    int revoked;                   /* ddp_comm_shrink ran on it: no second shrink */
    int64_t last_end_us;           /* when the last operation ended (0: none yet) */
    int root_len;                  /* boot.prefix's first root_len bytes: the prefix of the first
                                    * communicator of the line (0: all of it), under which every
                                    * shrink's keys live, so prefixes do not grow per shrink */
} _ddp_comm_shrink_t;

/* Grows (ddp_comm_grow.h): who joined the communicator, and the watcher that counts joiners
 * waiting. */
typedef struct _ddp_comm_grow _ddp_comm_grow_t;
struct _ddp_comm_grow {
    int members;                   /* made by a grow or a join: ranks 0..members-1 were members
                                    * before it (0: not made by one) */
    int joined;                    /* this rank joined (ddp_comm_join) */
    unsigned grows;                /* ddp_comm_grow calls on it: part of their keys */
    int retired;                   /* a grow replaced it: its calls fail */
    int waiting;                   /* joiners waiting, as the watcher last saw (atomic) */
    void *watch;                   /* the watcher (ddp_comm_grow.h), NULL until the first look */
    void (*watch_stop)(ddp_comm_t *c);   /* destroy ends the watcher through this */
};

struct ddp_comm {
    /* What the algorithms see (rank, size, timeouts, spin, segment, scratch, sequence) and the
     * calls they make: filled at init, the one copy of those settings. */
    _ddp_engine_t eng;
    /* What the transports see: filled before their init, kept for their lifetime. */
    ddp_transport_ctx_t tctx;
    _ddp_comm_boot_t boot;         /* where it met its peers (ddp_comm_init.h, ddp_rendezvous.h) */
    _ddp_comm_peers_t peers;       /* the transports and the connection to each rank */
    ddp_allocator_t alloc;
    ddp_result_t error;            /* sticky: set by a failed collective */
    int init_probe;                /* trying a transport under "auto": its failure is a notice */
    _ddp_log_sink_t log;           /* desc.log_fn, or DDP_DEBUG_FILE's descriptor, or stderr */
    int log_file;                  /* log.fd is DDP_DEBUG_FILE's: closed at destroy */
    int op_quiet;                  /* an operation runs on op_thread: its failures are logged once, */
    pthread_t op_thread;           /* at its end, whole (atomic: other threads read it) */
    char last_error[1024];
    _ddp_comm_queue_t queue;       /* async requests, progress threads, abort (ddp_comm_queue.h) */
    _ddp_comm_choice_t choice;     /* who runs the collectives, which algorithm (ddp_comm_dispatch.h) */
    _ddp_comm_group_t group;       /* groups and send/recv (ddp_comm.h, ddp_comm_dispatch.h) */
    _ddp_comm_device_t dev;        /* device (GPU) buffers (ddp_comm_device.h) */
    _ddp_comm_shrink_t shrink;     /* its line of shrinks, fencing (ddp_comm_shrink.h) */
    _ddp_comm_grow_t grow;         /* joiners admitted, the watcher (ddp_comm_grow.h) */
    _ddp_trace_t trace;            /* flight recorder (always), timeline (DDP_TRACE) */
    int trace_open;
    _ddp_stats_t stats;            /* counters per kind, last calls' timings (ddp_stats.h) */
    _ddp_position_t pos;           /* where the operations' thread is, for the health thread */
    void *health;                  /* the health thread (ddp_health.h), NULL: none */
    void (*health_stop)(ddp_comm_t *c);   /* destroy ends it through this */
    void *windows;                 /* registered memory (ddp_window.h), NULL: none yet */
    void (*windows_free)(ddp_comm_t *c);  /* destroy releases it through this */
    unsigned fork_gen;             /* _ddp_fork_gen when created: another value = a fork child */
    int pid;                       /* the creating process, for the fork error */
    int forked;                    /* destroy in a fork child: tctx.forked points here */
};
/* DDP_ALGO: auto, or one all-reduce algorithm (1 + _ddp_ar_algo_t), or "hier" (the hierarchical
 * one whose inter-host part the model picks). */
enum { _DDP_ALGO_AUTO = 0, _DDP_ALGO_RING = 1 + _DDP_AR_RING, _DDP_ALGO_RD = 1 + _DDP_AR_RD,
       _DDP_ALGO_HIER = 1 + _DDP_AR_NUM };

/* Live communicators, so that a call on a destroyed one is an error instead of a use after
 * free. Several communicators may live at once; the list is only touched at init/destroy and
 * read (under the lock) at the start of each collective. */
static pthread_mutex_t _ddp_live_mu = PTHREAD_MUTEX_INITIALIZER;
static const ddp_comm_t **_ddp_live;
static size_t _ddp_nlive, _ddp_live_cap;

/* Fork. A communicator belongs to the process that created it: a fork child gets a copy of its
 * memory but shares its sockets, epoll set, shared memory and device contexts with the parent,
 * so any use would race the parent on them. A child handler (registered once) bumps this
 * process-wide generation; entry points compare it with the communicator's, a plain load,
 * where getpid() would be a syscall per call. The handlers also hold the live list's lock
 * across fork, so a child never inherits it locked. */
static unsigned _ddp_fork_gen;
static pthread_once_t _ddp_fork_once = PTHREAD_ONCE_INIT;
_DDP_PRIVATE void _ddp_fork_prepare(void) { pthread_mutex_lock(&_ddp_live_mu); }
_DDP_PRIVATE void _ddp_fork_parent(void) { pthread_mutex_unlock(&_ddp_live_mu); }
_DDP_PRIVATE void _ddp_fork_child(void) {
    __atomic_add_fetch(&_ddp_fork_gen, 1u, __ATOMIC_RELAXED);
    /* The child runs in the thread that took the lock in prepare: it releases it (re-initialising
     * a held mutex is undefined, and ThreadSanitizer then sees the lock held forever). */
    pthread_mutex_unlock(&_ddp_live_mu);
}
_DDP_PRIVATE void _ddp_fork_register(void) {
    pthread_atfork(_ddp_fork_prepare, _ddp_fork_parent, _ddp_fork_child);
}
static inline int _ddp_forked(const ddp_comm_t *c) {
    return __atomic_load_n(&_ddp_fork_gen, __ATOMIC_RELAXED) != c->fork_gen;
}

_DDP_PRIVATE int _ddp_live_add(const ddp_comm_t *c) {
    int ok = 1;
    pthread_mutex_lock(&_ddp_live_mu);
    if (_ddp_nlive == _ddp_live_cap) {
        size_t cap = _ddp_live_cap ? _ddp_live_cap * 2 : 16;
        const ddp_comm_t **n = (const ddp_comm_t **)DDP_MALLOC(cap * sizeof *n);
        if (n) {
            if (_ddp_nlive) memcpy(n, _ddp_live, _ddp_nlive * sizeof *n);
            DDP_FREE(_ddp_live);
            _ddp_live = n;
            _ddp_live_cap = cap;
        } else {
            ok = 0;
        }
    }
    if (ok) _ddp_live[_ddp_nlive++] = c;
    pthread_mutex_unlock(&_ddp_live_mu);
    return ok;
}

/* Removes c if present; returns whether it was live. */
_DDP_PRIVATE int _ddp_live_check(const ddp_comm_t *c, int remove) {
    size_t i;
    int found = 0;
    pthread_mutex_lock(&_ddp_live_mu);
    for (i = 0; i < _ddp_nlive; i++) {
        if (_ddp_live[i] == c) {
            found = 1;
            if (remove) _ddp_live[i] = _ddp_live[--_ddp_nlive];
            break;
        }
    }
    if (remove && _ddp_nlive == 0) { DDP_FREE(_ddp_live); _ddp_live = NULL; _ddp_live_cap = 0; }
    pthread_mutex_unlock(&_ddp_live_mu);
    return found;
}

DDP_API void ddp_comm_log(const ddp_comm_t *c, ddp_log_level_t level, const char *fmt, ...) {
    va_list ap;
    if (!c || c->eng.log_level < (int)level || level == DDP_LOG_NONE) return;
    va_start(ap, fmt);
    _ddp_vlog_to(&c->log, c->eng.rank, level, fmt, ap);
    va_end(ap);
}

/* The communicator's store logs where the communicator does. */
_DDP_PRIVATE void _ddp_store_log_fwd(void *user, ddp_log_level_t level, int rank, const char *msg) {
    _ddp_log_emit(&((const ddp_comm_t *)user)->log, rank, (int)level, msg);
}

/* DDP_DEBUG_FILE (NCCL_DEBUG_FILE's form): the log goes to this file, %r the rank, %p the pid,
 * %h the host name; appended to. Unless desc.log_fn takes the lines. */
_DDP_PRIVATE void _ddp_log_open_file(ddp_comm_t *c, const char *tmpl) {
    char path[512], host[128] = "";
    size_t o = 0;
    int fd;
    gethostname(host, sizeof host - 1);
    for (; *tmpl && o + 24 < sizeof path; tmpl++) {
        if (tmpl[0] == '%' && tmpl[1] == 'r') { o += (size_t)snprintf(path + o, sizeof path - o, "%d", c->eng.rank); tmpl++; }
        else if (tmpl[0] == '%' && tmpl[1] == 'p') { o += (size_t)snprintf(path + o, sizeof path - o, "%ld", (long)getpid()); tmpl++; }
        else if (tmpl[0] == '%' && tmpl[1] == 'h') { o += (size_t)snprintf(path + o, sizeof path - o, "%.100s", host); tmpl++; }
        else path[o++] = *tmpl;
        if (o >= sizeof path) o = sizeof path - 1;
    }
    path[o] = 0;
    fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0) {
        ddp_comm_log(c, DDP_LOG_WARN, "DDP_DEBUG_FILE: cannot open %s (%s); logging to stderr", path, strerror(errno));
        return;
    }
    c->log.fd = fd;
    c->log_file = 1;
}
#define _DDP_LOG(c, lvl, ...) do { if ((c)->eng.log_level >= (lvl)) ddp_comm_log((c), (lvl), __VA_ARGS__); } while (0)

DDP_API ddp_result_t ddp_comm_fail(ddp_comm_t *c, ddp_result_t r, const char *fmt, ...) {
    va_list ap;
    char msg[768];
    if (!c) return r;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    snprintf(c->last_error, sizeof c->last_error, "rank %d: %s [%s]", c->eng.rank, msg, ddp_strerror(r));
    if (!c->init_probe && !(__atomic_load_n(&c->op_quiet, __ATOMIC_ACQUIRE) && pthread_equal(c->op_thread, pthread_self())))
        _DDP_LOG(c, DDP_LOG_WARN, "%s", c->last_error);
    return r;
}

/* A live communicator of this process: DDP_SUCCESS, else DDP_ERR_INVALID_USAGE (with the
 * reason as last error when it is a fork child's copy). */
_DDP_PRIVATE ddp_result_t _ddp_usable(ddp_comm_t *c) {
    if (!_ddp_live_check(c, 0)) return DDP_ERR_INVALID_USAGE;
    if (_ddp_forked(c))
        return ddp_comm_fail(c, DDP_ERR_INVALID_USAGE, "communicator created by pid %d, used from "
                             "pid %d after fork; destroy it in the child (that releases only the "
                             "child's copy) and create a new one there if the child needs one",
                             c->pid, (int)getpid());
    return DDP_SUCCESS;
}

/* "<the first len bytes of prefix>/<fmt ...>" into out: every store key a communicator makes. */
_DDP_PRIVATE void _ddp_vkey(char *out, size_t cap, const char *prefix, int len, const char *fmt, va_list ap) {
    int n = snprintf(out, cap, "%.*s/", len, prefix);
    if (n > 0 && (size_t)n < cap) vsnprintf(out + n, cap - (size_t)n, fmt, ap);
}

_DDP_PRIVATE void _ddp_key(const ddp_comm_t *c, char *out, size_t cap, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    _ddp_vkey(out, cap, c->boot.prefix, (int)strlen(c->boot.prefix), fmt, ap);
    va_end(ap);
}

/* The held addresses as SETs into ops (at most max): how many. */
_DDP_PRIVATE int _ddp_comm_held_ops(const ddp_comm_t *c, ddp_store_op_t *ops, int max) {
    int i;
    for (i = 0; i < c->boot.nheld && i < max; i++) {
        memset(&ops[i], 0, sizeof ops[i]);
        ops[i].kind = DDP_STORE_OP_SET;
        ops[i].key = c->boot.held[i].key;
        ops[i].value = c->boot.held[i].val;
        ops[i].len = c->boot.held[i].len;
    }
    return i;
}

/* Sends the held addresses now (one batch), if there are any. */
_DDP_PRIVATE ddp_result_t _ddp_comm_send_held(ddp_comm_t *c) {
    ddp_store_op_t ops[8];
    const int n = _ddp_comm_held_ops(c, ops, 8);
    ddp_result_t r;
    if (n == 0) return DDP_SUCCESS;
    c->boot.nheld = 0;
    r = ddp_store_batch(c->boot.store, ops, n);
    if (r != DDP_SUCCESS)
        return ddp_comm_fail(c, r, "init: rendezvous: publishing this rank's addresses: %s",
                             ddp_store_last_error(c->boot.store));
    return DDP_SUCCESS;
}

_DDP_PRIVATE ddp_result_t _ddp_comm_publish(ddp_comm_t *c, const char *transport, const void *addr, size_t len) {
    char key[256];
    ddp_result_t r;
    if (!c || !transport || (len && !addr)) return DDP_ERR_INVALID_ARGUMENT;
    _ddp_key(c, key, sizeof key, "addr/%s/%d", transport, c->eng.rank);
    if (c->boot.hold_pub && c->boot.nheld < 8 && len <= sizeof c->boot.held[0].val) {
        _ddp_strlcpy(c->boot.held[c->boot.nheld].key, key, sizeof c->boot.held[0].key);
        if (len) memcpy(c->boot.held[c->boot.nheld].val, addr, len);
        c->boot.held[c->boot.nheld++].len = len;
        return DDP_SUCCESS;
    }
    if ((r = _ddp_comm_send_held(c)) != DDP_SUCCESS) return r;
    return ddp_store_set(c->boot.store, key, addr, len);
}

_DDP_PRIVATE ddp_result_t _ddp_comm_lookup(ddp_comm_t *c, const char *transport, int peer, void *addr,
                                     size_t cap, size_t *len) {
    char key[256];
    ddp_result_t r;
    if (!c || !transport || peer < 0 || peer >= c->eng.nranks) return DDP_ERR_INVALID_ARGUMENT;
    if ((r = _ddp_comm_send_held(c)) != DDP_SUCCESS) return r;
    _ddp_key(c, key, sizeof key, "addr/%s/%d", transport, peer);
    r = ddp_store_get(c->boot.store, key, addr, cap, len);
    if (r != DDP_SUCCESS)
        return ddp_comm_fail(c, r, "looking up rank %d's %s address: %s", peer, transport,
                             ddp_store_last_error(c->boot.store));
    return r;
}

DDP_API int ddp_comm_timeout_ms(const ddp_comm_t *c) { return c ? c->eng.timeout_ms : 0; }
DDP_API void *ddp_comm_calloc(ddp_comm_t *c, size_t n) { return _ddp_calloc(c ? &c->alloc : NULL, n); }
DDP_API void ddp_comm_free(ddp_comm_t *c, void *p) { _ddp_free(c ? &c->alloc : NULL, p); }
_DDP_PRIVATE const char *_ddp_comm_host_id(const ddp_comm_t *c, int peer) {
    if (!c || !c->boot.host_ids || peer < 0 || peer >= c->eng.nranks) return "";
    return c->boot.host_ids + (size_t)peer * _DDP_HOST_ID_LEN;
}
DDP_API int ddp_comm_rank(const ddp_comm_t *c) { return c && _ddp_live_check(c, 0) ? c->eng.rank : -1; }
DDP_API int ddp_comm_size(const ddp_comm_t *c) { return c && _ddp_live_check(c, 0) ? c->eng.nranks : -1; }
DDP_API int ddp_comm_local_rank(const ddp_comm_t *c) { return c && _ddp_live_check(c, 0) ? c->boot.local_rank : -1; }
DDP_API int ddp_comm_local_size(const ddp_comm_t *c) { return c && _ddp_live_check(c, 0) ? c->boot.local_size : -1; }
DDP_API const char *ddp_comm_last_error(const ddp_comm_t *c) {
    if (!c) return "NULL communicator";
    if (!_ddp_live_check(c, 0)) return "not a live communicator (destroyed, or never created)";
    return c->last_error;
}
/* Not in a fork child: its connection to the store is the parent's too. */
DDP_API ddp_store_t *ddp_comm_store(ddp_comm_t *c) { return c && !_ddp_forked(c) ? c->boot.store : NULL; }
DDP_API const char *ddp_comm_transport_name(const ddp_comm_t *c, int peer) {
    if (!c || !c->peers.by_rank || peer < 0 || peer >= c->eng.nranks) return "";
    if (peer == c->eng.rank) return "self";
    if (c->peers.by_rank[peer].tinst < 0) return "none";
    return c->peers.tinst[c->peers.by_rank[peer].tinst].t->name;
}


/* Publishes the first failure of this communicator so that ranks which only see a closed
 * connection can tell the user where it started. Best effort, short timeout. */
_DDP_PRIVATE void _ddp_publish_failure(ddp_comm_t *c) {
    char key[256], cur[8];
    size_t curlen = 0;
    if (!c->boot.store || c->boot.foreign) return;   /* another job's store is not ours to write */
    _ddp_key(c, key, sizeof key, "abort");
    _ddp_store_quick(c->boot.store, 1);
    ddp_store_compare_set(c->boot.store, key, NULL, 0, c->last_error, strlen(c->last_error), cur,
                          sizeof cur, &curlen);
    _ddp_store_quick(c->boot.store, 0);
}

/* A healthy communicator being destroyed leaves a note (the first rank to leave wins): a peer
 * still inside a call then sees a closed connection and can say who left, after how many calls,
 * instead of "connection reset by peer" (uneven inputs: one rank stopped calling early). */
_DDP_PRIVATE void _ddp_say_goodbye(ddp_comm_t *c) {
    char key[256], msg[96], cur[8];
    size_t curlen = 0;
    if (!c->boot.store || c->boot.foreign || c->forked || c->eng.nranks < 2 ||
        __atomic_load_n(&c->error, __ATOMIC_SEQ_CST) != DDP_SUCCESS)
        return;
    snprintf(msg, sizeof msg, "%d %u", c->eng.rank, c->eng.seq);
    _ddp_key(c, key, sizeof key, "bye");
    _ddp_store_quick(c->boot.store, 1);
    ddp_store_compare_set(c->boot.store, key, NULL, 0, msg, strlen(msg), cur, sizeof cur, &curlen);
    _ddp_store_quick(c->boot.store, 0);
}

/* A rank that destroyed its communicator before the call this rank is in: its note, appended
 * to this rank's error. 1 if there was one. */
_DDP_PRIVATE int _ddp_add_goodbye(ddp_comm_t *c) {
    char key[256], note[64];
    size_t len = 0, n = strlen(c->last_error);
    int exists = 0, who = -1;
    unsigned calls = 0;
    _ddp_key(c, key, sizeof key, "bye");
    if (ddp_store_check(c->boot.store, key, &exists) != DDP_SUCCESS || !exists ||
        ddp_store_get(c->boot.store, key, note, sizeof note - 1, &len) != DDP_SUCCESS)
        return 0;
    note[len < sizeof note ? len : sizeof note - 1] = 0;
    if (sscanf(note, "%d %u", &who, &calls) != 2 || who == c->eng.rank || calls >= c->eng.seq) return 0;
    if (n + 32 < sizeof c->last_error)
        snprintf(c->last_error + n, sizeof c->last_error - n, "; rank %d destroyed its communicator "
                 "after %u calls; this rank is in call %u (every rank must make the same calls: "
                 "uneven inputs?)", who, calls, c->eng.seq);
    return 1;
}

/* Appends the first failure published by another rank, if any, to this rank's error.
 * Returns 1 if there was one, 2 if it was a disagreement (DDP_ERR_MISMATCH). */
_DDP_PRIVATE int _ddp_add_root_cause(ddp_comm_t *c) {
    char key[256], why[512];
    size_t len = 0, n = strlen(c->last_error);
    int exists = 0;
    ddp_result_t r;
    if (!c->boot.store) return 0;
    _ddp_key(c, key, sizeof key, "abort");
    _ddp_store_quick(c->boot.store, 1);
    r = ddp_store_check(c->boot.store, key, &exists);
    if (r == DDP_SUCCESS && exists &&
        ddp_store_get(c->boot.store, key, why, sizeof why - 1, &len) == DDP_SUCCESS) {
        why[len < sizeof why - 1 ? len : sizeof why - 1] = 0;
        if (strstr(c->last_error, why) == NULL && n + 32 < sizeof c->last_error)
            snprintf(c->last_error + n, sizeof c->last_error - n, "; first failure: %s", why);
        if (strstr(why, ddp_strerror(DDP_ERR_MISMATCH))) exists = 2;
    } else if (r == DDP_SUCCESS && _ddp_add_goodbye(c)) {
        exists = 1;
    } else if (r == DDP_ERR_REMOTE && c->eng.rank != 0 && n + 32 < sizeof c->last_error) {
        /* The store lives in rank 0: losing it too means rank 0 is gone, most likely first. */
        snprintf(c->last_error + n, sizeof c->last_error - n, "; rank 0 is gone as well (its "
                 "rendezvous store no longer answers): it probably failed first");
        exists = 1;
    }
    _ddp_store_quick(c->boot.store, 0);
    return exists;
}

/* "<root prefix>/shrink<gen>": where the shrink that makes generation gen keeps its keys. */
static inline void _ddp_shrink_base(const ddp_comm_t *c, int gen, char *out, size_t cap) {
    int len = c->shrink.root_len > 0 ? c->shrink.root_len : (int)strlen(c->boot.prefix);
    snprintf(out, cap, "%.*s/shrink%d", len, c->boot.prefix, gen);
}

/* Fencing (ddp_comm_shrink.h writes the decision): 1 when a shrink of this communicator
 * decided on a membership without this rank; then *gen and *attempt say which. The decision's
 * key is "<root prefix>/shrink<generation + 1>/decided", its value "<attempt> <parent ranks...>". */
_DDP_PRIVATE int _ddp_shrink_excluded(ddp_comm_t *c, int *gen, int *attempt) {
    char key[256], val[2048];
    size_t len = 0;
    int exists = 0, in = 0, r, used = 0;
    const char *p;
    if (!c->boot.store || c->boot.foreign || c->eng.nranks < 2) return 0;
    *gen = c->shrink.generation + 1;
    _ddp_shrink_base(c, *gen, key, sizeof key - 16);
    strcat(key, "/decided");
    _ddp_store_quick(c->boot.store, 1);
    if (ddp_store_check(c->boot.store, key, &exists) != DDP_SUCCESS || !exists ||
        ddp_store_get(c->boot.store, key, val, sizeof val - 1, &len) != DDP_SUCCESS)
        exists = 0;
    _ddp_store_quick(c->boot.store, 0);
    if (!exists || len >= sizeof val) return 0;   /* a longer list: not a decision on this size */
    val[len] = 0;
    if (sscanf(val, "%d%n", attempt, &used) != 1) return 0;
    for (p = val + used; sscanf(p, "%d%n", &r, &used) == 1; p += used)
        if (r == c->eng.rank) in = 1;
    return !in;
}

/* Before closing its connections on purpose (a failure, a revoke), a rank says so in the store:
 * a peer that then sees the connection close knows this rank is alive (a shrink waits for it)
 * rather than dead (a shrink may go on without it). Best effort, short timeout. */
_DDP_PRIVATE void _ddp_note_closed(ddp_comm_t *c) {
    char key[256], val[32];
    if (!c->boot.store || c->boot.foreign || c->forked || c->shrink.closed_noted || c->eng.nranks < 2) return;
    _ddp_key(c, key, sizeof key, "closed/%d", c->eng.rank);
    snprintf(val, sizeof val, "%u", c->eng.seq);
    _ddp_store_quick(c->boot.store, 1);
    if (ddp_store_set(c->boot.store, key, val, strlen(val)) == DDP_SUCCESS) c->shrink.closed_noted = 1;
    _ddp_store_quick(c->boot.store, 0);
}

_DDP_PRIVATE void _ddp_close_peers(ddp_comm_t *c) {
    int i;
    if (!c->peers.by_rank) return;
    for (i = 0; i < c->eng.nranks; i++) {
        _ddp_peer_t *p = &c->peers.by_rank[i];
        if (p->conn && p->tinst >= 0) c->peers.tinst[p->tinst].t->close(p->conn);
        p->conn = NULL;
    }
}

/* A collective failed: make the error sticky, tell the others (closing our connections wakes
 * every neighbour with EOF at once instead of after a timeout), and say where it started. */
/* Fenced: the survivors shrank without this rank (it was stopped or too slow); whatever it was
 * doing, the answer is that it is out. Sticky, as any failure. */
_DDP_PRIVATE ddp_result_t _ddp_fence(ddp_comm_t *c, int gen, int attempt, int succeeded) {
    char was[640];
    _ddp_strlcpy(was, succeeded ? "its call completed from data sent before the others gave up "
                 "on it: not to be used" : c->last_error, sizeof was);
    ddp_comm_fail(c, DDP_ERR_REMOVED, "removed from the communicator by shrink generation %d "
                  "(attempt %d) while in call #%u: the other ranks went on without it (it stopped "
                  "or was too slow); destroy this communicator (%.400s)", gen, attempt, c->eng.seq, was);
    __atomic_store_n(&c->error, DDP_ERR_REMOVED, __ATOMIC_SEQ_CST);
    _ddp_close_peers(c);
    return DDP_ERR_REMOVED;
}

/* A rank stopped past the timeout (SIGSTOP, a debugger, a host paused) can find its next call
 * complete from data its peers sent before they gave up on it, and never see a failure to
 * learn it was fenced by. So a call that ends more than the timeout after the previous one
 * asks the store whether a shrink went on without this rank: one round trip, only then (a
 * rank that computes longer than the timeout between calls pays it once per call). */
_DDP_PRIVATE ddp_result_t _ddp_fence_after_gap(ddp_comm_t *c, ddp_result_t r) {
    /* the recorder's clock: the kernel's tick without DDP_TRACE (a gap of a timeout needs no
     * more), as cheap as a call's start; a precise read here cost small calls ~0.03 us */
    int64_t now = _ddp_trace_clock_us(&c->trace), last = c->shrink.last_end_us;
    int gen = 0, attempt = 0;
    c->shrink.last_end_us = now;
    if (r != DDP_SUCCESS || !last || c->eng.timeout_ms < 0 || now - last <= (int64_t)c->eng.timeout_ms * 1000)
        return r;
    return _ddp_shrink_excluded(c, &gen, &attempt) ? _ddp_fence(c, gen, attempt, 1) : r;
}

_DDP_PRIVATE ddp_result_t _ddp_comm_poison(ddp_comm_t *c, ddp_result_t r) {
    int cause = 0, gen = 0, attempt = 0;
    if (r == DDP_SUCCESS) return r;
    if (r != DDP_ERR_REMOVED && _ddp_shrink_excluded(c, &gen, &attempt)) return _ddp_fence(c, gen, attempt, 0);
    if (r == DDP_ERR_REMOTE) cause = _ddp_add_root_cause(c);
    if (!cause) _ddp_publish_failure(c);
    /* A peer that left because the ranks called different things: this rank's call was part of
     * the disagreement too, so it says so (the failure is published before the connections
     * close, so whoever sees them close finds it). */
    if (cause == 2) r = DDP_ERR_MISMATCH;
    __atomic_store_n(&c->error, r, __ATOMIC_SEQ_CST);
    _ddp_note_closed(c);
    _ddp_close_peers(c);
    _DDP_LOG(c, DDP_LOG_WARN, "communicator is now unusable: %s", c->last_error);
    return r;
}

/* Connects to each listed peer (lower rank connects, higher accepts), all at once, within
 * the timeout. */
_DDP_PRIVATE ddp_result_t _ddp_connect_peers(ddp_comm_t *c, const int *list, int n) {
    int64_t deadline = _ddp_deadline(c->eng.timeout_ms);
    int pending, i, nap_us = 200;
    for (;;) {
        int progressed = 0;
        pending = 0;
        for (i = 0; i < n; i++) {
            int peer = list ? list[i] : i;   /* NULL: everyone */
            _ddp_peer_t *p = &c->peers.by_rank[peer];
            const ddp_transport_t *t;
            ddp_result_t r;
            if (p->conn || peer == c->eng.rank) continue;
            t = c->peers.tinst[p->tinst].t;
            r = c->eng.rank < peer ? t->connect(c->peers.tinst[p->tinst].state, peer, &p->conn)
                               : t->accept(c->peers.tinst[p->tinst].state, peer, &p->conn);
            if (r != DDP_SUCCESS) return r;
            if (p->conn) {
                progressed = 1;
                _DDP_LOG(c, DDP_LOG_INFO, "connected to rank %d via %s", peer, t->name);
            } else {
                pending++;
            }
        }
        if (!pending) return DDP_SUCCESS;
        if (_ddp_ms_left(deadline) == 0) {
            char who[256] = "";
            size_t off = 0;
            for (i = 0; i < n && off + 12 < sizeof who; i++) {
                int peer = list ? list[i] : i;
                if (!c->peers.by_rank[peer].conn && peer != c->eng.rank)
                    off += (size_t)snprintf(who + off, sizeof who - off, "%s%d", off ? "," : "", peer);
            }
            return ddp_comm_fail(c, DDP_ERR_TIMEOUT, "init: no connection with rank(s) %s after "
                                 "%d ms (phase connect)", who, c->eng.timeout_ms);
        }
        /* Nothing moved: nap, longer each time (to 10 ms). A fixed 200 us nap made 1,024 ranks
         * on 2 cores ask for 5 million wake-ups a second, starving the peers and the store
         * they wait for: init grew with the square of the ranks. */
        if (progressed) nap_us = 200;
        else {
            usleep((useconds_t)nap_us);
            if (nap_us < 10000) nap_us *= 2;
        }
    }
}

/* ---------------------------------------------------------------- collectives: checks */
_DDP_PRIVATE ddp_result_t _ddp_check_comm(ddp_comm_t *c) {
    ddp_result_t r;
    if (!c) return DDP_ERR_INVALID_ARGUMENT;
    if ((r = _ddp_usable(c)) != DDP_SUCCESS) return r;
    return (ddp_result_t)__atomic_load_n(&c->error, __ATOMIC_SEQ_CST);
}

/* The count argument's name in the call's documentation (NCCL's names). */
_DDP_PRIVATE const char *_ddp_count_name(const char *what) {
    if (!strncmp(what, "reduce_scatter", 14) || !strncmp(what, "scatter", 7)) return "recvcount";
    if (!strncmp(what, "all_gather", 10) || !strncmp(what, "gather", 6)) return "sendcount";
    return "count";
}

_DDP_PRIVATE ddp_result_t _ddp_check_args(ddp_comm_t *c, const char *what, const void *sendbuf,
                                          const void *recvbuf, size_t count, size_t mult,
                                          ddp_dtype_t dtype, int check_op, ddp_op_t op) {
    size_t es = ddp_dtype_size(dtype);
    if (!es) return ddp_comm_fail(c, DDP_ERR_INVALID_ARGUMENT, "%s: invalid dtype %d", what, (int)dtype);
    if (check_op && (unsigned)op >= DDP_NUM_OPS)
        return ddp_comm_fail(c, DDP_ERR_INVALID_ARGUMENT, "%s: invalid op %d", what, (int)op);
    /* A buffer holds at most PTRDIFF_MAX bytes (pointer differences, the transports' ssize_t
     * lengths): refused here, on every rank alike, before any pointer is formed past it. */
    if (count > (size_t)PTRDIFF_MAX / es / mult) {
        char ranks[48] = "";
        if (mult > 1) snprintf(ranks, sizeof ranks, " x %zu ranks", mult);
        return ddp_comm_fail(c, DDP_ERR_INVALID_ARGUMENT, "%s: %s %zu x %zu bytes%s overflows what a "
                             "buffer can hold (PTRDIFF_MAX bytes)", what, _ddp_count_name(what), count,
                             es, ranks);
    }
    if (count && (!sendbuf || !recvbuf))
        return ddp_comm_fail(c, DDP_ERR_INVALID_ARGUMENT, "%s: NULL %s buffer with count %zu",
                             what, sendbuf ? "receive" : "send", count);
    return DDP_SUCCESS;
}

/* ---------------------------------------------------------------- who is stuck
 * A wait that times out knows only the peer it waited on, which may itself be waiting (a ring
 * stalls behind one stopped rank). So, before giving up (and before closing connections, which
 * would turn the others' waits into "connection closed"), every rank that timed out publishes
 * its position (the peer it waited on, its collective number, its error) under pos/<rank>, then
 * follows the chain from its own peer: a peer that publishes within the grace is waiting too,
 * so follow whom it waits on; the first rank on the chain that does not publish is the one
 * that stopped making progress (stopped, hung in user code, or cut off). Same idea as
 * PyTorch's Flight Recorder and NCCL's RAS, with the rendezvous store as the meeting point.
 * Healthy ranks time out within a short spread of each other (their last progress was the
 * same collective), so a grace of timeout/2 in [1, 10] s is enough. When the store itself does
 * not answer, rank 0 (which serves it) is the one to blame. */
_DDP_PRIVATE void _ddp_name_stuck_rank(ddp_comm_t *c) {
    const int me = c->eng.rank, n = c->eng.nranks;
    int grace = c->eng.timeout_ms < 0 ? 5000 : c->eng.timeout_ms / 2;
    int64_t deadline;
    char key[256], val[600], chain[640] = "", orig[1024], why[160] = "";
    const char *body;
    int cur, hops, stuck = -1;
    size_t off = 0;
    if (!c->boot.store || n < 2) return;
    if (grace < 1000) grace = 1000;
    if (grace > 10000) grace = 10000;
    deadline = _ddp_now_us() + (int64_t)grace * 1000;
    _ddp_strlcpy(orig, c->last_error, sizeof orig);
    body = strncmp(orig, "rank ", 5) == 0 && strstr(orig, ": ") ? strstr(orig, ": ") + 2 : orig;
    snprintf(val, sizeof val, "%d %u %.560s", c->eng.waiting_on, c->eng.seq, body);
    _ddp_key(c, key, sizeof key, "pos/%d", me);
    _ddp_store_quick(c->boot.store, 1);
    if (ddp_store_set(c->boot.store, key, val, strlen(val)) != DDP_SUCCESS) {
        stuck = 0;
        snprintf(why, sizeof why, "its rendezvous store does not answer: rank 0 stopped, hung or "
                 "cut off, or this rank is cut off from it");
    }
    for (cur = c->eng.waiting_on, hops = 0; stuck < 0 && cur >= 0 && cur < n && cur != me && hops < 32; hops++) {
        int next = -1, exists = 0;
        unsigned seq = 0;
        size_t len = 0;
        ddp_result_t r;
        _ddp_key(c, key, sizeof key, "pos/%d", cur);
        /* Short checks, not one long wait: a wait that times out costs the connection, and the
         * failure still has to be published after this. */
        while ((r = ddp_store_check(c->boot.store, key, &exists)) == DDP_SUCCESS && !exists) {
            if (_ddp_ms_left(deadline) == 0) { r = DDP_ERR_TIMEOUT; break; }
            usleep(20000);
        }
        if (r == DDP_SUCCESS) r = ddp_store_get(c->boot.store, key, val, sizeof val - 1, &len);
        if (r != DDP_SUCCESS) {
            stuck = cur;
            snprintf(why, sizeof why, r == DDP_ERR_TIMEOUT ? "no report of its position within "
                     "%d ms: stopped, hung or cut off" : "the store could not be asked (%d ms)", grace);
            break;
        }
        val[len] = 0;
        if (sscanf(val, "%d %u", &next, &seq) != 2) next = -1;
        if (off < sizeof chain - 1) {
            const char *text = strchr(val, ' ');
            text = text ? strchr(text + 1, ' ') : NULL;
            off += (size_t)snprintf(chain + off, sizeof chain - off, "%srank %d at #%u (%.120s)",
                                    off ? "; " : "", cur, seq, text ? text + 1 : "?");
            if (off >= sizeof chain) off = sizeof chain - 1;
        }
        if (next == me || next < 0) break;     /* a cycle back to us, or it knows no more */
        cur = next;
    }
    _ddp_store_quick(c->boot.store, 0);
    if (stuck >= 0)
        snprintf(c->last_error, sizeof c->last_error, "rank %d: stuck rank: %d (%s); here: %.400s%s%.300s",
                 me, stuck, why, body, off ? "; waiting chain: " : "", chain);
    else if (off)
        snprintf(c->last_error, sizeof c->last_error, "rank %d: %.500s; waiting chain (every rank "
                 "on it reported: they wait on each other, e.g. different collectives): %.400s",
                 me, body, chain);
    if (stuck >= 0 || off) _DDP_LOG(c, DDP_LOG_WARN, "%s", c->last_error);
    if (stuck >= 0 && stuck != me) { c->shrink.suspect = stuck; c->shrink.has_suspect = 1; }
}

/* The communicator's error state, NCCL-style: a failed collective poisons it. A timeout first
 * finds out which rank stopped making progress. */
_DDP_PRIVATE ddp_result_t _ddp_finish(ddp_comm_t *c, ddp_result_t r) {
    if (r == DDP_ERR_TIMEOUT) _ddp_name_stuck_rank(c);
    /* A broken connection: the transport named the peer (a timeout's peer may only be waiting
     * itself: the stuck rank above is the one to blame). */
    else if (r != DDP_SUCCESS && !c->shrink.has_suspect && c->eng.waiting_on >= 0 &&
             c->eng.waiting_on < c->eng.nranks && c->eng.waiting_on != c->eng.rank) {
        c->shrink.suspect = c->eng.waiting_on;
        c->shrink.has_suspect = 1;
    }
    return r == DDP_SUCCESS ? r : _ddp_comm_poison(c, r);
}

/* ---------------------------------------------------------------- operations, async, abort
 * Every collective is an operation record. A blocking call runs it on the caller's thread; an
 * async call queues it for the communicator's progress thread, which runs the queue in issue
 * order. Only one thread runs operations at a time: a blocking call first waits until the
 * queue is empty. The slots are allocated once, at the first async call: no allocation per
 * call. */
typedef struct _ddp_op {
    int kind;                         /* a ddp_call_kind_t (ddp_base.h) */
    int root;                         /* the root, or the peer of a send/recv */
    const void *send;
    void *recv;
    size_t count;
    ddp_dtype_t dtype;
    ddp_op_t op;
    size_t v_total, v_off;            /* all-reduce of a part of a flat buffer (0: the whole) */
    /* queued for the progress thread */
    int state;                        /* 0 free, 1 queued, 2 running, 3 done */
    uint64_t id;                      /* issue number, from 1 */
    ddp_result_t result;
    ddp_async_hooks_t hooks;          /* work before and after it, on the progress thread */
    int lane;                         /* the progress thread that runs it */
    /* queued by a group: its sends and receives are posted together at group_end */
    int post;                         /* 0 queued, 1 posted, 2 done */
    void *req;
    uint64_t tag;
} _ddp_op_t;

_DDP_PRIVATE _ddp_op_t _ddp_op_make(int kind, const void *send, void *recv, size_t count,
                                    ddp_dtype_t dtype, ddp_op_t op, int root) {
    _ddp_op_t o;
    memset(&o, 0, sizeof o);
    o.kind = kind; o.send = send; o.recv = recv; o.count = count; o.dtype = dtype; o.op = op;
    o.root = root;
    return o;
}

/* The bytes an operation reads (recv_side 0) or writes (1). */
_DDP_PRIVATE size_t _ddp_op_bytes(const ddp_comm_t *c, const _ddp_op_t *o, int recv_side) {
    size_t b = o->count * ddp_dtype_size(o->dtype), p = (size_t)c->eng.nranks;
    switch (o->kind) {
    case DDP_CALL_BARRIER: return 0;
    case DDP_CALL_REDUCE_SCATTER: case DDP_CALL_SCATTER: return recv_side ? b : b * p;
    case DDP_CALL_ALL_GATHER: case DDP_CALL_GATHER: return recv_side ? b * p : b;
    case DDP_CALL_ALL_TO_ALL: return b * p;
    default: return b;
    }
}


/* Abort's poisoning happens once, by whichever thread gets there first. The reason is
 * ddp_comm_abort's, or another async lane's failure (_ddp_abort_internal). */
_DDP_PRIVATE ddp_result_t _ddp_abort_poison(ddp_comm_t *c) {
    int expect = 0, suspect;
    ddp_result_t code = DDP_ERR_ABORTED;
    char why[sizeof c->queue.abort_reason];
    pthread_mutex_lock(&c->queue.amu);
    _ddp_strlcpy(why, c->queue.abort_reason[0] ? c->queue.abort_reason : "ddp_comm_abort was called on this rank",
                 sizeof why);
    if (c->queue.abort_reason[0]) code = c->queue.abort_code;
    suspect = c->queue.abort_suspect - 1;
    pthread_mutex_unlock(&c->queue.amu);
    if (__atomic_compare_exchange_n(&c->queue.abort_claimed, &expect, 1, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST) &&
        __atomic_load_n(&c->error, __ATOMIC_SEQ_CST) == DDP_SUCCESS) {
        ddp_comm_fail(c, code, "%s", why);
        if (suspect >= 0 && suspect < c->eng.nranks) { c->shrink.suspect = suspect; c->shrink.has_suspect = 1; }
        _ddp_comm_poison(c, code);
    }
    return code;
}

/* A call that saw the abort flag: 1 when the abort has a reason of its own (the health thread's,
 * another lane's), which the call's error then carries instead of "ddp_comm_abort was called". */
_DDP_PRIVATE int _ddp_abort_has_reason(ddp_comm_t *c) {
    int has;
    if (!__atomic_load_n(&c->queue.aborted, __ATOMIC_SEQ_CST)) return 0;
    pthread_mutex_lock(&c->queue.amu);
    has = c->queue.abort_reason[0] != 0;
    pthread_mutex_unlock(&c->queue.amu);
    return has;
}

/* Marks an operation running, unless an abort came first (Dekker with ddp_comm_abort). */
_DDP_PRIVATE ddp_result_t _ddp_begin(ddp_comm_t *c) {
    ddp_result_t e;
    int expect = 0;
    /* The owner check: a communicator is used by one thread at a time (its progress thread
     * included, which runs only while the caller waits or is in no call). A second thread gets
     * an error instead of racing the first on the connections. Not recorded as last_error:
     * that buffer belongs to the thread inside. */
    if (!__atomic_compare_exchange_n(&c->queue.busy, &expect, 1, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {
        _DDP_LOG(c, DDP_LOG_WARN, "two threads used this communicator at once: the second call "
                 "returns DDP_ERR_INVALID_USAGE (use one communicator per thread, or serialise)");
        return DDP_ERR_INVALID_USAGE;
    }
    if (__atomic_load_n(&c->queue.aborted, __ATOMIC_SEQ_CST)) {
        __atomic_store_n(&c->queue.busy, 0, __ATOMIC_SEQ_CST);
        return _ddp_abort_poison(c);
    }
    e = (ddp_result_t)__atomic_load_n(&c->error, __ATOMIC_SEQ_CST);
    if (e != DDP_SUCCESS) __atomic_store_n(&c->queue.busy, 0, __ATOMIC_SEQ_CST);
    return e;
}
_DDP_PRIVATE void _ddp_end(ddp_comm_t *c) { __atomic_store_n(&c->queue.busy, 0, __ATOMIC_SEQ_CST); }

/* The hand-offs between the caller and the progress thread poll for the communicator's spin
 * time (yielding the CPU between polls, as the transports do) before sleeping on a condition
 * variable: a futex wake-up costs tens of microseconds on a busy machine, more than a small
 * all-reduce. 1 when *word reached want in time; the caller still re-checks under the mutex. */
_DDP_PRIVATE int _ddp_poll_u64(ddp_comm_t *c, const uint64_t *word, uint64_t want) {
    int64_t until;
    if (__atomic_load_n(word, __ATOMIC_ACQUIRE) >= want) return 1;
    if (c->eng.spin_us <= 0) return 0;
    until = _ddp_now_us() + c->eng.spin_us;
    do {
        sched_yield();
        if (__atomic_load_n(word, __ATOMIC_ACQUIRE) >= want) return 1;
    } while (_ddp_now_us() < until);
    return 0;
}

/* A blocking call: wait for everything issued before it, then run it here. */
_DDP_PRIVATE ddp_result_t _ddp_enter(ddp_comm_t *c) {
    if (c->queue.progress_on) {
        _ddp_poll_u64(c, &c->queue.finished, __atomic_load_n(&c->queue.issued, __ATOMIC_ACQUIRE));
        pthread_mutex_lock(&c->queue.amu);
        while (c->queue.finished < c->queue.issued) pthread_cond_wait(&c->queue.adone, &c->queue.amu);
        pthread_mutex_unlock(&c->queue.amu);
    }
    return _ddp_begin(c);
}

#ifdef __cplusplus
}
#endif

#endif /* DDP_COMM_CORE_IMPLEMENTATION */
