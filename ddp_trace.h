/* SPDX-License-Identifier: MIT (see LICENSE) */
/* ddp_trace.h — libddp's timeline and flight recorder: what each collective did and how long,
 * kept for the last calls always, written as Chrome trace events on request. Private: the
 * communicator (ddp_comm.h) records into it; users see DDP_TRACE and the failure logs.
 *
 *   - Flight recorder: the last _DDP_FLIGHT calls of a communicator (kind, size, algorithm,
 *     start, duration, result, the peer it waited on longest), in a ring allocated at init: no
 *     allocation per call, two clock reads per call. When a collective fails or times out, the
 *     ring is logged at WARN with the error (PyTorch's Flight Recorder, NCCL's RAS: what was
 *     this rank doing before it broke).
 *   - Timeline: DDP_TRACE=path writes every call as a Chrome trace event ("ph":"X", times in
 *     microseconds; the JSON array format of the Trace Event Format document, loadable in
 *     Perfetto and chrome://tracing): one file per rank (path with "%r" replaced by the rank,
 *     else path.<rank>.json); `ddprun --trace out.json` sets it and merges the ranks' files.
 *     pid = rank, tid = 0 for the caller's calls and 1 for requests run by the progress thread,
 *     2 for the reducer's buckets (hooked requests), 3 for device (NCCL) calls as enqueued. args: count, bytes,
 *     dtype, op, root, algorithm, transport, the time spent waiting on each peer.
 * Depends on ddp_base.h. Built by DDP_IMPLEMENTATION (or DDP_TRACE_IMPLEMENTATION).
 */
#if defined(DDP_IMPLEMENTATION) && !defined(DDP_TRACE_IMPLEMENTATION)
#define DDP_TRACE_IMPLEMENTATION
#endif
#if defined(DDP_TRACE_IMPLEMENTATION) && !defined(DDP_BASE_IMPLEMENTATION)
#define DDP_BASE_IMPLEMENTATION
#endif
#include "ddp_base.h"

#if defined(DDP_TRACE_IMPLEMENTATION) && !defined(DDP_TRACE_IMPL_INCLUDED)
#define DDP_TRACE_IMPL_INCLUDED
#ifndef DDP_BASE_IMPL_INCLUDED
#error "libddp: ddp_trace.h's implementation needs ddp_base.h's (define DDP_IMPLEMENTATION)"
#endif
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#define _DDP_FLIGHT 64               /* calls the flight recorder keeps */
#define _DDP_FLIGHT_DUMP 16          /* of which a failure logs the last this many */
#define _DDP_TRACE_PEERS 4           /* peers whose waits a record keeps apart */

typedef struct {
    uint64_t seq;                    /* the communicator's collective number */
    const char *what;                /* "all_reduce", ... (static) */
    const char *algo;                /* "ring", "recursive doubling", ... (static) */
    size_t count, bytes;
    int dtype, op, root, tid;
    int64_t t0_us, t1_us;
    ddp_result_t result;
    int npeers;
    int peer[_DDP_TRACE_PEERS];
    int64_t peer_wait_us[_DDP_TRACE_PEERS];
    int64_t other_wait_us;           /* waits on peers beyond _DDP_TRACE_PEERS */
} _ddp_trace_rec_t;

typedef struct {
    _ddp_trace_rec_t *ring;          /* _DDP_FLIGHT records, allocated once */
    uint64_t n;                      /* records ever written; the newest is (n - 1) % _DDP_FLIGHT */
    _ddp_trace_rec_t *cur;           /* the call in progress: the ring's next slot, filled in
                                      * place (no copy: the recorder is always on) */
    _ddp_trace_rec_t spare;          /* cur before the ring exists */
    int active;                      /* cur is being filled */
    FILE *file;                      /* DDP_TRACE, or NULL */
    int nevents;                     /* written to file (for the commas) */
    pthread_mutex_t mu;              /* file writes: device calls come from the user's thread
                                      * while the progress thread may be writing */
    int rank;
    char transport[48];              /* what carries the collectives, for args */
    int64_t t_base_us;               /* CLOCK_MONOTONIC of no importance: Chrome wants small ts */
} _ddp_trace_t;

/* Opens the per-rank trace file when DDP_TRACE names one; the ring always. 0 on success. */
_DDP_PRIVATE int _ddp_trace_open(_ddp_trace_t *t, const ddp_allocator_t *a, int rank, int with_file,
                                 char *err, size_t cap) {
    const char *path = with_file ? getenv("DDP_TRACE") : NULL;
    memset(t, 0, sizeof *t);
    t->cur = &t->spare;
    t->rank = rank;
    t->t_base_us = 0;   /* CLOCK_MONOTONIC as is: the ranks of one host share it, so a merged
                         * trace lines them up */
    pthread_mutex_init(&t->mu, NULL);
    t->ring = (_ddp_trace_rec_t *)_ddp_calloc(a, sizeof *t->ring * _DDP_FLIGHT);
    if (!t->ring) { snprintf(err, cap, "the flight recorder (%zu bytes)", sizeof *t->ring * _DDP_FLIGHT); return -1; }
    t->cur = &t->ring[0];
    if (path && *path) {
        char name[512];
        const char *r = strstr(path, "%r");
        if (r) snprintf(name, sizeof name, "%.*s%d%s", (int)(r - path), path, rank, r + 2);
        else snprintf(name, sizeof name, "%s.%d.json", path, rank);
        if (!(t->file = fopen(name, "w"))) {
            snprintf(err, cap, "DDP_TRACE: cannot write %s: %s", name, strerror(errno));
            return -1;
        }
        fputs("[\n", t->file);
    }
    return 0;
}

_DDP_PRIVATE void _ddp_trace_close(_ddp_trace_t *t, const ddp_allocator_t *a) {
    if (t->file) {
        fputs("\n]\n", t->file);
        fclose(t->file);
        t->file = NULL;
    }
    if (t->ring) { _ddp_free(a, t->ring); t->ring = NULL; }
    t->cur = &t->spare;
    pthread_mutex_destroy(&t->mu);
}

/* The recorder's clock. Without DDP_TRACE a call's start is read from the coarse clock (the
 * kernel's tick, ~4 ms, in ~6 ns against ~25 ns for the precise one on the 2-core VMs) and its
 * end only when it fails: two precise reads per call were the 0.05-0.1 us that small
 * shared-memory all-reduces lost when the recorder came (bench/ab.sh, issue 17). A failure's
 * dump then says how long before it each call started, to the tick; DDP_TRACE times every
 * call to the microsecond. */
_DDP_PRIVATE int64_t _ddp_trace_clock_us(const _ddp_trace_t *t) {
#ifdef CLOCK_MONOTONIC_COARSE
    if (!t->file) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
        return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
    }
#else
    (void)t;
#endif
    return _ddp_now_us();
}

/* A call starts: cheap (one coarse clock read), always. */
_DDP_PRIVATE void _ddp_trace_begin(_ddp_trace_t *t, uint64_t seq, const char *what, size_t count,
                                   size_t bytes, int dtype, int op, int root, int tid) {
    _ddp_trace_rec_t *c = t->cur;
    c->seq = seq; c->what = what; c->algo = ""; c->count = count; c->bytes = bytes;
    c->dtype = dtype; c->op = op; c->root = root; c->tid = tid;
    c->npeers = 0; c->other_wait_us = 0;
    c->result = DDP_SUCCESS;
    c->t0_us = _ddp_trace_clock_us(t);
    t->active = 1;
}

/* Time the call spent blocked waiting on peer. */
_DDP_PRIVATE void _ddp_trace_wait(_ddp_trace_t *t, int peer, int64_t us) {
    _ddp_trace_rec_t *c = t->cur;
    int i;
    if (!t->active) return;
    for (i = 0; i < c->npeers; i++)
        if (c->peer[i] == peer) { c->peer_wait_us[i] += us; return; }
    if (c->npeers < _DDP_TRACE_PEERS) {
        c->peer[c->npeers] = peer;
        c->peer_wait_us[c->npeers++] = us;
    } else {
        c->other_wait_us += us;
    }
}

_DDP_PRIVATE void _ddp_trace_event_json(_ddp_trace_t *t, const _ddp_trace_rec_t *c) {
    int i;
    if (!t->file) return;
    pthread_mutex_lock(&t->mu);
    fprintf(t->file, "%s{\"name\":\"%s\",\"cat\":\"%s\",\"ph\":\"X\",\"pid\":%d,\"tid\":%d,\"ts\":%lld,"
            "\"dur\":%lld,\"args\":{\"seq\":%llu,\"count\":%zu,\"bytes\":%zu,\"dtype\":\"%s\",\"op\":\"%s\","
            "\"root\":%d,\"algorithm\":\"%s\",\"transport\":\"%s\",\"result\":\"%s\",\"wait_us\":{",
            t->nevents++ ? ",\n" : "", c->what, c->tid == 2 ? "reducer" : c->tid == 3 ? "device" : "collective",
            t->rank, c->tid, (long long)(c->t0_us - t->t_base_us), (long long)(c->t1_us - c->t0_us),
            (unsigned long long)c->seq, c->count, c->bytes, ddp_dtype_name((ddp_dtype_t)c->dtype),
            ddp_op_name((ddp_op_t)c->op), c->root, c->algo, t->transport, ddp_strerror(c->result));
    for (i = 0; i < c->npeers; i++)
        fprintf(t->file, "%s\"%d\":%lld", i ? "," : "", c->peer[i], (long long)c->peer_wait_us[i]);
    if (c->other_wait_us) fprintf(t->file, "%s\"other\":%lld", c->npeers ? "," : "", (long long)c->other_wait_us);
    fputs("}}}", t->file);
    pthread_mutex_unlock(&t->mu);
}

/* A call ends: into the ring (always) and the file (DDP_TRACE). */
_DDP_PRIVATE void _ddp_trace_end(_ddp_trace_t *t, ddp_result_t r) {
    _ddp_trace_rec_t *c = t->cur;
    if (!t->active || !t->ring) return;
    t->active = 0;
    c->t1_us = t->file || r != DDP_SUCCESS ? _ddp_trace_clock_us(t) : 0;   /* 0: not timed */
    c->result = r;
    t->n++;
    t->cur = &t->ring[t->n % _DDP_FLIGHT];
    if (t->file) _ddp_trace_event_json(t, c);
}

/* An event recorded whole by its caller (the reducer's buckets, device calls as enqueued):
 * the file only. */
_DDP_PRIVATE void _ddp_trace_span(_ddp_trace_t *t, const _ddp_trace_rec_t *c) {
    _ddp_trace_event_json(t, c);
}

/* The last calls, oldest first, one line each, for the failure log. */
_DDP_PRIVATE void _ddp_trace_dump(const _ddp_trace_t *t, void (*line)(void *arg, const char *s), void *arg) {
    uint64_t first = t->n > _DDP_FLIGHT_DUMP ? t->n - _DDP_FLIGHT_DUMP : 0, k;
    const int64_t now = _ddp_trace_clock_us(t);
    char s[512], took[48];
    if (!t->ring || !t->n) return;
    snprintf(s, sizeof s, "flight recorder: the last %llu of this rank's %llu calls (oldest first%s):",
             (unsigned long long)(t->n - first), (unsigned long long)t->n,
             t->file ? "" : "; starts to the clock tick, DDP_TRACE times every call");
    line(arg, s);
    for (k = first; k < t->n; k++) {
        const _ddp_trace_rec_t *c = &t->ring[k % _DDP_FLIGHT];
        int i, top = -1;
        int64_t topw = 0, w = c->other_wait_us;
        for (i = 0; i < c->npeers; i++) {
            w += c->peer_wait_us[i];
            if (c->peer_wait_us[i] > topw) { topw = c->peer_wait_us[i]; top = c->peer[i]; }
        }
        if (c->t1_us)
            snprintf(took, sizeof took, "%.3f ms", (double)(c->t1_us - c->t0_us) / 1e3);
        else
            snprintf(took, sizeof took, "started %.0f ms before", (double)(now - c->t0_us) / 1e3);
        if (top >= 0)
            snprintf(s, sizeof s, "  #%llu %s %zu x %s (%s) %s, waited %.3f ms (most on rank %d): %s",
                     (unsigned long long)c->seq, c->what, c->count, ddp_dtype_name((ddp_dtype_t)c->dtype),
                     c->algo[0] ? c->algo : "-", took, (double)w / 1e3, top, ddp_strerror(c->result));
        else
            snprintf(s, sizeof s, "  #%llu %s %zu x %s (%s) %s: %s", (unsigned long long)c->seq,
                     c->what, c->count, ddp_dtype_name((ddp_dtype_t)c->dtype), c->algo[0] ? c->algo : "-",
                     took, ddp_strerror(c->result));
        line(arg, s);
    }
}

#endif /* DDP_TRACE_IMPLEMENTATION */
