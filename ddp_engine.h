/* SPDX-License-Identifier: MIT (see LICENSE) */
/* ddp_engine.h — what an algorithm sees of a communicator: the point-to-point engine.
 *
 * The algorithms (ddp_algorithms.h: ring, recursive doubling, Rabenseifner, hierarchical, trees,
 * chain, linear, pairwise) are written against this small interface, not against the
 * communicator: its rank and size, the scratch the communicator allocated once, its timeouts
 * and spin policy, and five calls (post a send, post a receive, test one, sleep until one of
 * some peers may progress, connect to peers on first use), plus failure recording and logging.
 * ddp_comm_dispatch.h fills one per communicator.
 *
 * "What operation is this" is ddp_call_kind_t (ddp_base.h), the one numbering the engine's tags,
 * the communicator's queue and the transports share.
 *
 * Private to libddp (every name is _ddp_); depends on ddp_base.h.
 */
#if defined(DDP_IMPLEMENTATION) && !defined(DDP_ENGINE_IMPLEMENTATION)
#define DDP_ENGINE_IMPLEMENTATION
#endif
#if defined(DDP_ENGINE_IMPLEMENTATION) && !defined(DDP_BASE_IMPLEMENTATION)
#define DDP_BASE_IMPLEMENTATION
#endif
#include "ddp_base.h"

#ifndef DDP_ENGINE_H_INCLUDED
#define DDP_ENGINE_H_INCLUDED

#ifdef __cplusplus
extern "C" {
#endif

#define DDP_RING_WINDOW 8   /* segments in flight per direction; also the scratch slots */

typedef struct _ddp_engine {
    int rank, nranks;
    int timeout_ms;                /* no progress for this long is DDP_ERR_TIMEOUT; < 0 never */
    int spin_us;                   /* poll this long (yielding) before sleeping; <= 0 never */
    int log_level;                 /* a ddp_log_level_t */
    size_t segment_bytes;          /* largest pipeline segment */
    unsigned char *scratch;        /* DDP_RING_WINDOW segments, allocated once by the host */
    size_t scratch_bytes;
    uint32_t seq;                  /* collectives issued: the low half of every tag */
    int waiting_on;                /* set by an algorithm that timed out: the peer it waited for */
    int *live_peer;                /* a wait past its spin stores its peer here (relaxed), for the
                                    * health thread's "waiting on" (NULL: nobody asks) */
    int64_t note_at_ms;            /* a wait without progress says so at this age (0: 10 s) */
    int64_t note_idle_ms;          /* the age the last check saw: shorter now means progress */
    void *host;                    /* the communicator, handed back to the calls below */
    ddp_result_t (*isend)(void *host, int peer, const void *buf, size_t len, uint64_t tag,
                          void **req);
    ddp_result_t (*irecv)(void *host, int peer, void *buf, size_t len, uint64_t tag, void **req);
    ddp_result_t (*test)(void *host, int peer, void *req, int *done);
    /* Sleeps until a connection to one of peers may progress, at most timeout_ms (and 100 ms,
     * so abort is seen); DDP_ERR_ABORTED once the communicator was aborted. */
    ddp_result_t (*block)(void *host, const int *peers, int n, int timeout_ms);
    /* Connects to these peers now if not yet (the ring's neighbours are connected at init). */
    ddp_result_t (*connect)(void *host, const int *peers, int n);
    ddp_result_t (*fail)(void *host, ddp_result_t r, const char *msg);
    const char *(*last_error)(void *host);
    void (*log)(void *host, ddp_log_level_t level, const char *msg);
} _ddp_engine_t;

#ifdef __cplusplus
}
#endif
#endif /* DDP_ENGINE_H_INCLUDED */

/* ============================================================================================
 * IMPLEMENTATION
 * ========================================================================================== */
#if defined(DDP_ENGINE_IMPLEMENTATION) && !defined(DDP_ENGINE_IMPL_INCLUDED)
#define DDP_ENGINE_IMPL_INCLUDED
#ifndef DDP_BASE_IMPL_INCLUDED
#error "libddp: ddp_engine.h's implementation needs ddp_base.h's (define DDP_IMPLEMENTATION)"
#endif

_DDP_PRIVATE ddp_result_t _ddp_eng_fail(const _ddp_engine_t *e, ddp_result_t r, const char *fmt, ...)
#if defined(__GNUC__) || defined(__clang__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
_DDP_PRIVATE ddp_result_t _ddp_eng_fail(const _ddp_engine_t *e, ddp_result_t r, const char *fmt, ...) {
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return e->fail(e->host, r, msg);
}

/* A wait past its spin: the health thread may say whom this rank waits on. */
static inline void _ddp_eng_waits_on(const _ddp_engine_t *e, int peer) {
    if (e->live_peer) __atomic_store_n(e->live_peer, peer, __ATOMIC_RELAXED);
}

/* A wait without progress that lasts says what it waits for, at WARN (after 10 s, 30 s, 60 s,
 * then every 5 minutes: ddp_base.h), long before the timeout: "all_reduce #12: no progress for
 * 30 s, waiting for data from rank 3 (timeout in 570 s)". Called by the algorithms' idle paths. */
_DDP_PRIVATE void _ddp_eng_note_wait(_ddp_engine_t *e, int64_t idle_us, const char *where,
                                     const char *waiting, int peer) {
    const int64_t ms = idle_us / 1000;
    char msg[512];
    if (!e->note_at_ms || ms < e->note_idle_ms) e->note_at_ms = _ddp_next_wait_note_ms(0);   /* a new wait */
    e->note_idle_ms = ms;
    if (ms < e->note_at_ms || e->log_level < DDP_LOG_WARN || !e->log) return;
    if (e->timeout_ms >= 0)
        snprintf(msg, sizeof msg, "%s: no progress for %lld s, %s rank %d (timeout in %lld s)", where,
                 (long long)(ms / 1000), waiting, peer, (long long)((e->timeout_ms - ms) / 1000));
    else
        snprintf(msg, sizeof msg, "%s: no progress for %lld s, %s rank %d (no timeout)", where,
                 (long long)(ms / 1000), waiting, peer);
    e->log(e->host, DDP_LOG_WARN, msg);
    e->note_at_ms = _ddp_next_wait_note_ms(ms);
}

_DDP_PRIVATE void _ddp_eng_log(const _ddp_engine_t *e, ddp_log_level_t level, const char *fmt, ...)
#if defined(__GNUC__) || defined(__clang__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
_DDP_PRIVATE void _ddp_eng_log(const _ddp_engine_t *e, ddp_log_level_t level, const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    e->log(e->host, level, msg);
}
/* Formats only when the level lets the line through. */
#define _DDP_ELOG(e, lvl, ...) \
    do { if ((e)->log_level >= (lvl)) _ddp_eng_log((e), (lvl), __VA_ARGS__); } while (0)

/* Tag of every message of one collective: a digest of what the caller asked for (so ranks
 * calling different collectives, dtypes, ops, counts or roots are caught) and its sequence. */
_DDP_PRIVATE uint64_t _ddp_eng_tag(_ddp_engine_t *e, int kind, ddp_dtype_t dtype, ddp_op_t op,
                                   size_t count, int root) {
    uint64_t h = _DDP_FNV_INIT;
    int64_t fields[5];
    fields[0] = kind; fields[1] = dtype; fields[2] = op; fields[3] = (int64_t)count; fields[4] = root;
    h = _ddp_fnv1a(fields, sizeof fields, h);
    e->seq++;
    return (h & 0xffffffff00000000ull) | e->seq;
}

#endif /* DDP_ENGINE_IMPLEMENTATION */
