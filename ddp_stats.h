/* SPDX-License-Identifier: MIT (see LICENSE) */
/* ddp_stats.h — what a communicator's calls add up to: per call kind the calls, errors, bytes,
 * the time spent in them and a latency histogram; and the last calls' timings (how long each
 * took on this rank, how long since the previous one started), which the health thread
 * publishes so that rank 0 can say which rank arrives last (ddp_health.h). Private: the
 * communicator records here around every host operation (ddp_comm_dispatch.h); the health
 * thread reads. Nothing is allocated: the record lives in the communicator.
 *
 * Threads. One writer at a time: the thread that runs the communicator's operations (the
 * caller or the progress thread, which hand over through the communicator's busy flag). The
 * health thread reads while it writes: every word is written and read whole (relaxed atomics),
 * so a snapshot may mix two calls, which a metrics refresh every few seconds tolerates; a
 * timing entry is read consistently (its first word is cleared while it is rewritten).
 *
 * Cost. Counting is a few plain stores per call. Timing (two reads of the precise clock) is on
 * only while a health thread runs (stats.timed = 1), and then for at most one call per clock
 * tick (_DDP_STATS_EVERY_US).
 * Depends on ddp_base.h. Built by DDP_IMPLEMENTATION (or DDP_STATS_IMPLEMENTATION).
 */
#if defined(DDP_IMPLEMENTATION) && !defined(DDP_STATS_IMPLEMENTATION)
#define DDP_STATS_IMPLEMENTATION
#endif
#if defined(DDP_STATS_IMPLEMENTATION) && !defined(DDP_BASE_IMPLEMENTATION)
#define DDP_BASE_IMPLEMENTATION
#endif
#include "ddp_base.h"

#if defined(DDP_STATS_IMPLEMENTATION) && !defined(DDP_STATS_IMPL_INCLUDED)
#define DDP_STATS_IMPL_INCLUDED
#ifndef DDP_BASE_IMPL_INCLUDED
#error "libddp: ddp_stats.h's implementation needs ddp_base.h's (define DDP_IMPLEMENTATION)"
#endif

/* Timing a call costs two reads of the precise clock (~50 ns on the 2-core VMs: a quarter of a
 * small shared-memory all-reduce). So at most one call is timed per this many microseconds of
 * the recorder's clock, which without DDP_TRACE is the kernel's tick (~4 ms): a loop of small
 * calls pays one branch per call; a training step (milliseconds of compute, then its calls) has
 * its first call timed on every rank, the call a late rank delays. */
#define _DDP_STATS_EVERY_US 1000

/* Latency histogram: upper bounds in seconds, 1-3 steps from 10 us to 10 s, then +Inf. */
#define _DDP_STATS_BUCKETS 14
static const double _ddp_stats_le_s[_DDP_STATS_BUCKETS - 1] = {
    1e-5, 3e-5, 1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 1e-1, 3e-1, 1.0, 3.0, 10.0};

typedef struct {
    uint64_t calls;                  /* calls of this kind that ran (failed ones included) */
    uint64_t errors;                 /* of which failed */
    uint64_t bytes;                  /* what they moved: the larger of the send and receive side */
    uint64_t timed;                  /* of which timed (the histogram's count) */
    uint64_t ns;                     /* time in the timed calls, nanoseconds */
    uint64_t bucket[_DDP_STATS_BUCKETS];   /* timed calls by duration, not cumulative */
} _ddp_kind_stats_t;

/* The last calls' timings. Entry k holds call seq with seq % _DDP_TIMINGS == k:
 *   a = seq << 32 | kind (0 while being rewritten: readers skip it)
 *   b = dur_us << 32 | gap_us: the call's duration on this rank, and the time from the start
 *       of the previous timed call to this one's (0 for the first), each capped at 2^32-1 us. */
#define _DDP_TIMINGS 256
typedef struct { uint64_t a, b; } _ddp_timing_t;

typedef struct {
    _ddp_kind_stats_t kind[_DDP_NUM_KINDS];
    _ddp_timing_t timing[_DDP_TIMINGS];
    int timed;                       /* time the calls (a health thread reads them) */
    int64_t last_start_us;           /* the previous timed call's start (0: none) */
    int64_t last_try_us;             /* its start on the caller's clock (the recorder's) */
} _ddp_stats_t;

/* Where the caller's thread is, for the health thread: in a call (kind, number, bytes, since
 * when, the peer it waits on once a wait lasts) or in user code since the last call ended.
 * Written with relaxed atomic stores by the operations' thread, read by the health thread. */
typedef struct {
    int kind;                        /* ddp_call_kind_t of the call running; 0: none (user code) */
    uint32_t seq;                    /* its number, or the last call's */
    uint64_t bytes;
    int64_t since_us;                /* the call's start, or the last call's end (0: none yet) */
    int peer;                        /* the peer a lasting wait waits on (-1: none known) */
} _ddp_position_t;

#define _DDP_RELAXED_ADD(p, v) __atomic_store_n((p), __atomic_load_n((p), __ATOMIC_RELAXED) + (v), __ATOMIC_RELAXED)

_DDP_PRIVATE int _ddp_stats_bucket(int64_t ns) {
    int i;
    for (i = 0; i < _DDP_STATS_BUCKETS - 1; i++)
        if ((double)ns <= _ddp_stats_le_s[i] * 1e9) return i;
    return _DDP_STATS_BUCKETS - 1;
}

/* A call starts: the position says so; the start is timed (precise clock) when timing is on.
 * Returns the start in ns (0: not timed). */
_DDP_PRIVATE int64_t _ddp_stats_begin(_ddp_stats_t *s, _ddp_position_t *p, int kind, uint32_t seq,
                                      uint64_t bytes, int64_t coarse_us) {
    int64_t t0 = 0;
    if (__atomic_load_n(&s->timed, __ATOMIC_RELAXED) && coarse_us - s->last_try_us >= _DDP_STATS_EVERY_US) {
        s->last_try_us = coarse_us;
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        t0 = (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
        coarse_us = t0 / 1000;
    }
    __atomic_store_n(&p->peer, -1, __ATOMIC_RELAXED);
    __atomic_store_n(&p->seq, seq, __ATOMIC_RELAXED);
    __atomic_store_n(&p->bytes, bytes, __ATOMIC_RELAXED);
    __atomic_store_n(&p->since_us, coarse_us, __ATOMIC_RELAXED);
    __atomic_store_n(&p->kind, kind, __ATOMIC_RELEASE);
    return t0;
}

/* A call ended: counted, and timed if its start was. */
_DDP_PRIVATE void _ddp_stats_end(_ddp_stats_t *s, _ddp_position_t *p, int kind, uint32_t seq,
                                 uint64_t bytes, int failed, int64_t t0_ns, int64_t coarse_us) {
    _ddp_kind_stats_t *k = &s->kind[kind > 0 && kind < _DDP_NUM_KINDS ? kind : 0];
    _DDP_RELAXED_ADD(&k->calls, 1);
    _DDP_RELAXED_ADD(&k->bytes, bytes);
    if (failed) _DDP_RELAXED_ADD(&k->errors, 1);
    if (t0_ns) {
        struct timespec ts;
        int64_t t1, dur, gap;
        _ddp_timing_t *e = &s->timing[seq % _DDP_TIMINGS];
        uint64_t dus, gus;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        t1 = (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
        coarse_us = t1 / 1000;
        dur = t1 - t0_ns;
        gap = s->last_start_us ? t0_ns / 1000 - s->last_start_us : 0;
        s->last_start_us = t0_ns / 1000;
        _DDP_RELAXED_ADD(&k->timed, 1);
        _DDP_RELAXED_ADD(&k->ns, (uint64_t)dur);
        _DDP_RELAXED_ADD(&k->bucket[_ddp_stats_bucket(dur)], 1);
        dus = (uint64_t)(dur / 1000) > 0xffffffffu ? 0xffffffffu : (uint64_t)(dur / 1000);
        gus = gap < 0 ? 0 : (uint64_t)gap > 0xffffffffu ? 0xffffffffu : (uint64_t)gap;
        /* a seqlock of one entry without fences (TSan does not model them): b's release
         * orders a = 0 before it, a's release orders b before the new a */
        __atomic_store_n(&e->a, (uint64_t)0, __ATOMIC_RELAXED);
        __atomic_store_n(&e->b, dus << 32 | gus, __ATOMIC_RELEASE);
        __atomic_store_n(&e->a, (uint64_t)seq << 32 | (uint32_t)kind, __ATOMIC_RELEASE);
    }
    __atomic_store_n(&p->since_us, coarse_us, __ATOMIC_RELAXED);
    __atomic_store_n(&p->kind, 0, __ATOMIC_RELEASE);
}

/* Entry k as one consistent record; 0 when it is empty or being rewritten. */
_DDP_PRIVATE int _ddp_stats_timing(const _ddp_stats_t *s, int k, uint32_t *seq, int *kind,
                                   uint32_t *dur_us, uint32_t *gap_us) {
    uint64_t a1 = __atomic_load_n(&s->timing[k].a, __ATOMIC_ACQUIRE), b, a2;
    if (!a1) return 0;
    b = __atomic_load_n(&s->timing[k].b, __ATOMIC_ACQUIRE);   /* a rewrite's b: a2 sees its a = 0 or later */
    a2 = __atomic_load_n(&s->timing[k].a, __ATOMIC_RELAXED);
    if (a1 != a2) return 0;
    *seq = (uint32_t)(a1 >> 32);
    *kind = (int)(a1 & 0xffffffffu);
    *dur_us = (uint32_t)(b >> 32);
    *gap_us = (uint32_t)(b & 0xffffffffu);
    return 1;
}

/* One kind's counters as a reader sees them now. */
_DDP_PRIVATE void _ddp_stats_read_kind(const _ddp_stats_t *s, int kind, _ddp_kind_stats_t *out) {
    const _ddp_kind_stats_t *k = &s->kind[kind];
    int i;
    out->calls = __atomic_load_n(&k->calls, __ATOMIC_RELAXED);
    out->errors = __atomic_load_n(&k->errors, __ATOMIC_RELAXED);
    out->bytes = __atomic_load_n(&k->bytes, __ATOMIC_RELAXED);
    out->timed = __atomic_load_n(&k->timed, __ATOMIC_RELAXED);
    out->ns = __atomic_load_n(&k->ns, __ATOMIC_RELAXED);
    for (i = 0; i < _DDP_STATS_BUCKETS; i++) out->bucket[i] = __atomic_load_n(&k->bucket[i], __ATOMIC_RELAXED);
}

#endif /* DDP_STATS_IMPLEMENTATION */
