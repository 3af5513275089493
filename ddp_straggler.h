/* SPDX-License-Identifier: MIT (see LICENSE) */
/* ddp_straggler.h — which rank arrives last, and by how much: straggler attribution from what
 * each rank measures on its own clock. Private: every rank's health thread publishes its last
 * calls' timings as a TIMING blob (encoded here from ddp_stats.h's record); rank 0's health
 * thread decodes every rank's blob, feeds the analyser below, writes its STRAGGLER line to the
 * store and logs its INFO report and WARN (ddp_health.h; the formats: docs/operations.md).
 *
 * Why no clock sync is needed. In a call where every rank waits for every other (all-reduce,
 * reduce-scatter, all-gather, barrier, all-to-all) all ranks leave at about the same time, so
 * the rank that entered last spends the least time inside: last = argmin over ranks of the
 * call's duration, and how much later it came than the next-to-last is lag = second-smallest
 * duration - smallest. Durations are differences on one rank's own monotonic clock. Rooted
 * calls (broadcast, reduce, gather, scatter) and send/recv do not make everyone wait for
 * everyone and are left out. The time between calls (what the lag is a share of) is per call
 * the median over the ranks of gap_us (start to start on each rank): the ranks' gaps differ
 * only by their arrival jitter, and the median ignores one rank whose gap is off (its first
 * timed call, a pause of its own).
 *
 * The analyser keeps the last `window` analysed calls (default 1000) in a ring made at init:
 * per call the last rank (-1 for a tie or a world of 1), the lag, the interval and the kind;
 * per rank how often it was last in the window. A call is analysed once, when every rank's blob
 * holds it; a call missing from some rank's blob (it wrapped before it was read) is not
 * counted. The WARN rule: in a window of at least min_calls calls (default 100) one rank was
 * last in more than half of them, and the median of its lags is at least `share` (default 0.05)
 * of the median time between calls; logged at most once per window. The INFO report: every
 * report_calls analysed calls (default 1000).
 *
 * Use. Every rank, each period with new calls:
 *     _ddp_straggler_encode(&c->stats, buf, _DDP_STRAGGLER_BLOB_MAX, &len)  -> P/health/t/<rank>
 * Rank 0, once: _ddp_straggler_opts_env(&o, err, cap) (-1: log err at WARN, defaults kept), then
 * _ddp_straggler_init(&a, nranks, &o, alloc); each period, with blob[r], len[r] read from
 * P/health/t/<r> (NULL: not there yet):
 *     _ddp_straggler_ingest(&a, blob, len, err, cap)     (-1: log err; nothing analysed)
 *     _ddp_straggler_line(&a, line, _DDP_STRAGGLER_LINE_MAX(nranks))        -> P/health/straggler
 *     m = _ddp_straggler_report(&a, info, icap, warn, wcap)   (m & 1: log info at INFO; m & 2:
 *                                                              log warn at WARN; 512 bytes do)
 * and _ddp_straggler_free(&a) at the end. _ddp_straggler_figures gives the numbers (metrics);
 * a.last_counts[r] how often rank r was last in the window.
 *
 * Environment (read by _ddp_straggler_opts_env): DDP_STRAGGLER_WINDOW, DDP_STRAGGLER_SHARE,
 * DDP_STRAGGLER_REPORT_CALLS (docs/environment.md).
 * Threads: an analyser belongs to one thread (rank 0's health thread); encoding reads the
 * stats while the operations' thread writes them (ddp_stats.h says how that stays consistent).
 * Memory: the analyser allocates once, at init (16 bytes per window call, 12 per rank, and 4 x
 * max(window, nranks) of scratch for the medians); ingest reads the blobs where they lie, and
 * the texts go into the caller's buffers. Encoding uses 6 KiB of stack.
 * Depends on ddp_stats.h. Built by DDP_IMPLEMENTATION (or DDP_STRAGGLER_IMPLEMENTATION).
 */
#if defined(DDP_IMPLEMENTATION) && !defined(DDP_STRAGGLER_IMPLEMENTATION)
#define DDP_STRAGGLER_IMPLEMENTATION
#endif
#if defined(DDP_STRAGGLER_IMPLEMENTATION) && !defined(DDP_STATS_IMPLEMENTATION)
#define DDP_STATS_IMPLEMENTATION
#endif
#include "ddp_stats.h"

#if defined(DDP_STRAGGLER_IMPLEMENTATION) && !defined(DDP_STRAGGLER_IMPL_INCLUDED)
#define DDP_STRAGGLER_IMPL_INCLUDED
#ifndef DDP_STATS_IMPL_INCLUDED
#error "libddp: ddp_straggler.h's implementation needs ddp_stats.h's (define DDP_IMPLEMENTATION)"
#endif
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* TIMING blob: 'D' 'T' '1' 0, uint32 count, then count records of 4 uint32 (seq, kind, dur_us,
 * gap_us), little-endian, seq increasing; count <= _DDP_TIMINGS. */
#define _DDP_STRAGGLER_HEADER 8
#define _DDP_STRAGGLER_RECORD 16
#define _DDP_STRAGGLER_BLOB_MAX (_DDP_STRAGGLER_HEADER + _DDP_STRAGGLER_RECORD * _DDP_TIMINGS)
/* A STRAGGLER line for n ranks fits in this many bytes (last_counts: up to 10 digits and a comma
 * per rank). */
#define _DDP_STRAGGLER_LINE_MAX(n) ((size_t)256 + (size_t)11 * (size_t)(n))

#define _DDP_STRAGGLER_WINDOW 1000
#define _DDP_STRAGGLER_MIN_CALLS 100
#define _DDP_STRAGGLER_REPORT_CALLS 1000
#define _DDP_STRAGGLER_SHARE 0.05

typedef struct {
    uint32_t seq, kind, dur_us, gap_us;
} _ddp_timing_rec_t;

/* Settings; 0 in a field means its default. */
typedef struct {
    int window;                      /* calls the rolling window holds (10 .. 100000) */
    int min_calls;                   /* the WARN needs a window at least this full (capped at window) */
    int report_calls;                /* an INFO report every this many analysed calls (-1: never) */
    double share;                    /* the WARN needs median lag >= share x median interval */
} _ddp_straggler_opts_t;

/* One analysed call. */
typedef struct {
    int32_t last;                    /* the rank that arrived last; -1: a tie or a world of 1 */
    uint32_t lag_us;                 /* second-smallest duration - smallest */
    uint32_t interval_us;            /* median of the ranks' gaps (0: unknown) */
    uint32_t kind;
} _ddp_straggler_call_t;

typedef struct {
    int nranks;
    _ddp_straggler_opts_t o;         /* defaults filled in */
    ddp_allocator_t alloc;
    _ddp_straggler_call_t *ring;     /* o.window calls, the oldest at (head - count) mod window */
    int head, count;
    uint32_t *last_counts;           /* per rank: calls of the window it was last in */
    uint32_t kind_counts[_DDP_NUM_KINDS];
    int *cursor;                     /* per rank: ingest's position in its blob */
    uint32_t *scratch;               /* max(window, nranks) values for the medians */
    uint32_t *blob_count;            /* per rank: records in this ingest's blob */
    uint64_t analysed;               /* calls ever pushed into the window */
    uint32_t last_seq;               /* the newest call consumed (valid once have_seq) */
    int have_seq;
    uint64_t reported_at;            /* analysed at the last INFO report */
    uint64_t warned_at;              /* analysed at the last WARN (valid once warned) */
    int warned;
} _ddp_straggler_t;

/* What the window says now. */
typedef struct {
    int window;                      /* calls in the window */
    uint64_t analysed;
    int kind;                        /* the kind of most calls in the window (0: none yet) */
    int mixed;                       /* the window holds other kinds too */
    int last_rank;                   /* last most often (-1: nobody yet) */
    uint32_t last_count;
    uint32_t median_lag_us;          /* over the calls last_rank was last in */
    uint32_t median_interval_us;     /* over the window's calls */
    double share;                    /* median_lag / median_interval (0 when unknown) */
    int warn;                        /* the WARN condition holds */
} _ddp_straggler_figures_t;

/* ---------------------------------------------------------------- the TIMING blob */
_DDP_PRIVATE void _ddp_straggler_put32(unsigned char *p, uint32_t v) {
    p[0] = (unsigned char)v;
    p[1] = (unsigned char)(v >> 8);
    p[2] = (unsigned char)(v >> 16);
    p[3] = (unsigned char)(v >> 24);
}
_DDP_PRIVATE uint32_t _ddp_straggler_get32(const unsigned char *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
/* Is seq a newer than b? Serial-number arithmetic: call numbers wrap at 2^32. */
_DDP_PRIVATE int _ddp_straggler_newer(uint32_t a, uint32_t b) { return (int32_t)(a - b) > 0; }

typedef struct { int64_t key; _ddp_timing_rec_t r; } _ddp_straggler_keyed_t;
_DDP_PRIVATE int _ddp_straggler_cmp_key(const void *x, const void *y) {
    int64_t a = ((const _ddp_straggler_keyed_t *)x)->key, b = ((const _ddp_straggler_keyed_t *)y)->key;
    return a < b ? -1 : a > b;
}

/* The entries of s that are valid now, oldest first, as a TIMING blob in buf. 0 on success
 * (*len its size), -1 when cap is too small (_DDP_STRAGGLER_BLOB_MAX always does). Entries
 * more than 2^20 calls older than the newest (timing was off in between) are left out, so
 * the seqs of a blob are always in serial order. */
_DDP_PRIVATE int _ddp_straggler_encode(const _ddp_stats_t *s, unsigned char *buf, size_t cap, size_t *len) {
    _ddp_straggler_keyed_t e[_DDP_TIMINGS];
    int k, n = 0, i, first;
    uint32_t ref = 0;
    int64_t newest = INT64_MIN;
    size_t need;
    for (k = 0; k < _DDP_TIMINGS; k++) {
        uint32_t seq, dur, gap;
        int kind;
        if (!_ddp_stats_timing(s, k, &seq, &kind, &dur, &gap)) continue;
        if (!n) ref = seq;
        e[n].key = (int32_t)(seq - ref);
        e[n].r.seq = seq;
        e[n].r.kind = (uint32_t)kind;
        e[n].r.dur_us = dur;
        e[n].r.gap_us = gap;
        if (e[n].key > newest) newest = e[n].key;
        n++;
    }
    qsort(e, (size_t)n, sizeof e[0], _ddp_straggler_cmp_key);
    for (first = 0; first < n && e[first].key <= newest - ((int64_t)1 << 20); first++) {}
    need = _DDP_STRAGGLER_HEADER + (size_t)(n - first) * _DDP_STRAGGLER_RECORD;
    if (!buf || cap < need) return -1;
    buf[0] = 'D'; buf[1] = 'T'; buf[2] = '1'; buf[3] = 0;
    _ddp_straggler_put32(buf + 4, (uint32_t)(n - first));
    for (i = first; i < n; i++) {
        unsigned char *p = buf + _DDP_STRAGGLER_HEADER + (size_t)(i - first) * _DDP_STRAGGLER_RECORD;
        _ddp_straggler_put32(p, e[i].r.seq);
        _ddp_straggler_put32(p + 4, e[i].r.kind);
        _ddp_straggler_put32(p + 8, e[i].r.dur_us);
        _ddp_straggler_put32(p + 12, e[i].r.gap_us);
    }
    *len = need;
    return 0;
}

/* Record i of a blob already checked. */
_DDP_PRIVATE void _ddp_straggler_record(const unsigned char *buf, uint32_t i, _ddp_timing_rec_t *r) {
    const unsigned char *p = buf + _DDP_STRAGGLER_HEADER + (size_t)i * _DDP_STRAGGLER_RECORD;
    r->seq = _ddp_straggler_get32(p);
    r->kind = _ddp_straggler_get32(p + 4);
    r->dur_us = _ddp_straggler_get32(p + 8);
    r->gap_us = _ddp_straggler_get32(p + 12);
}

/* A blob is well formed: the magic, count <= _DDP_TIMINGS, exactly count records in len, seqs
 * increasing. Reads nothing past len. 0 (and *count) or -1 with why in err. */
_DDP_PRIVATE int _ddp_straggler_check(const unsigned char *buf, size_t len, uint32_t *count, char *err,
                                      size_t cap) {
    uint32_t n, i, prev = 0;
    if (!buf || len < _DDP_STRAGGLER_HEADER) {
        snprintf(err, cap, "%zu bytes, shorter than the %d-byte header", buf ? len : (size_t)0, _DDP_STRAGGLER_HEADER);
        return -1;
    }
    if (buf[0] != 'D' || buf[1] != 'T' || buf[2] != '1' || buf[3] != 0) {
        snprintf(err, cap, "not a TIMING blob (its first bytes are not DT1)");
        return -1;
    }
    n = _ddp_straggler_get32(buf + 4);
    if (n > _DDP_TIMINGS) {
        snprintf(err, cap, "%u records, more than the %d a rank keeps", n, _DDP_TIMINGS);
        return -1;
    }
    if (len != _DDP_STRAGGLER_HEADER + (size_t)n * _DDP_STRAGGLER_RECORD) {
        snprintf(err, cap, "%zu bytes for %u records (%zu expected)", len, n,
                 _DDP_STRAGGLER_HEADER + (size_t)n * _DDP_STRAGGLER_RECORD);
        return -1;
    }
    for (i = 0; i < n; i++) {
        uint32_t seq = _ddp_straggler_get32(buf + _DDP_STRAGGLER_HEADER + (size_t)i * _DDP_STRAGGLER_RECORD);
        if (i && !_ddp_straggler_newer(seq, prev)) {
            snprintf(err, cap, "record %u (call %u) does not follow call %u", i, seq, prev);
            return -1;
        }
        prev = seq;
    }
    *count = n;
    return 0;
}

/* The records of a blob into recs (cap of them). 0 (*n records) or -1: malformed (why in err)
 * or more records than cap. */
_DDP_PRIVATE int _ddp_straggler_decode(const unsigned char *buf, size_t len, _ddp_timing_rec_t *recs, size_t cap,
                                       size_t *n, char *err, size_t errcap) {
    uint32_t count, i;
    if (_ddp_straggler_check(buf, len, &count, err, errcap) != 0) return -1;
    if (count > cap) {
        snprintf(err, errcap, "%u records, room for %zu", count, cap);
        return -1;
    }
    for (i = 0; i < count; i++) _ddp_straggler_record(buf, i, &recs[i]);
    *n = count;
    return 0;
}

/* ---------------------------------------------------------------- settings */
/* The defaults, then the environment. 0, or -1 when a variable was malformed (its default is
 * kept; err says which, for a WARN). */
_DDP_PRIVATE int _ddp_straggler_opts_env(_ddp_straggler_opts_t *o, char *err, size_t cap) {
    long v;
    int rc = 0, r;
    const char *s;
    memset(o, 0, sizeof *o);
    if (cap) err[0] = 0;
    r = _ddp_env_int("DDP_STRAGGLER_WINDOW", 10, 100000, &v);
    if (r > 0) o->window = (int)v;
    if (r < 0) { rc = -1; snprintf(err, cap, "DDP_STRAGGLER_WINDOW is not a whole number in 10..100000; %d used", _DDP_STRAGGLER_WINDOW); }
    r = _ddp_env_int("DDP_STRAGGLER_REPORT_CALLS", 0, 100000000, &v);
    if (r > 0) o->report_calls = v ? (int)v : -1;
    if (r < 0) { rc = -1; snprintf(err, cap, "DDP_STRAGGLER_REPORT_CALLS is not a whole number in 0..100000000; %d used", _DDP_STRAGGLER_REPORT_CALLS); }
    s = getenv("DDP_STRAGGLER_SHARE");
    if (s) {
        char *end;
        double d = strtod(s, &end);
        if (!*s || *end || !(d > 0.0 && d <= 1.0)) {
            rc = -1;
            snprintf(err, cap, "DDP_STRAGGLER_SHARE is not a number in (0, 1]; %.2f used", _DDP_STRAGGLER_SHARE);
        } else {
            o->share = d;
        }
    }
    return rc;
}

/* ---------------------------------------------------------------- the analyser */
_DDP_PRIVATE void _ddp_straggler_free(_ddp_straggler_t *a) {
    if (!a) return;
    _ddp_free(&a->alloc, a->ring);
    _ddp_free(&a->alloc, a->last_counts);
    _ddp_free(&a->alloc, a->cursor);
    _ddp_free(&a->alloc, a->scratch);
    _ddp_free(&a->alloc, a->blob_count);
    memset(a, 0, sizeof *a);
}

/* An analyser for nranks ranks (opts NULL or zero fields: defaults; alloc NULL: DDP_MALLOC).
 * 0, or -1 (bad nranks, or out of memory; nothing is left allocated). */
_DDP_PRIVATE int _ddp_straggler_init(_ddp_straggler_t *a, int nranks, const _ddp_straggler_opts_t *opts,
                                     const ddp_allocator_t *alloc) {
    size_t w, nscr;
    memset(a, 0, sizeof *a);
    if (nranks < 1) return -1;
    if (opts) a->o = *opts;
    if (alloc) a->alloc = *alloc;
    if (a->o.window <= 0) a->o.window = _DDP_STRAGGLER_WINDOW;
    if (a->o.window < 10) a->o.window = 10;
    if (a->o.window > 100000) a->o.window = 100000;
    if (a->o.min_calls <= 0) a->o.min_calls = _DDP_STRAGGLER_MIN_CALLS;
    if (a->o.min_calls > a->o.window) a->o.min_calls = a->o.window;
    if (a->o.report_calls == 0) a->o.report_calls = _DDP_STRAGGLER_REPORT_CALLS;
    if (!(a->o.share > 0.0)) a->o.share = _DDP_STRAGGLER_SHARE;
    a->nranks = nranks;
    w = (size_t)a->o.window;
    nscr = w > (size_t)nranks ? w : (size_t)nranks;
    a->ring = (_ddp_straggler_call_t *)_ddp_calloc(&a->alloc, w * sizeof *a->ring);
    a->last_counts = (uint32_t *)_ddp_calloc(&a->alloc, (size_t)nranks * sizeof *a->last_counts);
    a->cursor = (int *)_ddp_calloc(&a->alloc, (size_t)nranks * sizeof *a->cursor);
    a->blob_count = (uint32_t *)_ddp_calloc(&a->alloc, (size_t)nranks * sizeof *a->blob_count);
    a->scratch = (uint32_t *)_ddp_calloc(&a->alloc, nscr * sizeof *a->scratch);
    if (!a->ring || !a->last_counts || !a->cursor || !a->blob_count || !a->scratch) {
        _ddp_straggler_free(a);
        return -1;
    }
    return 0;
}

/* The calls in which every rank waits for every other. */
_DDP_PRIVATE int _ddp_straggler_kind_counts(uint32_t kind) {
    return kind == DDP_CALL_ALL_REDUCE || kind == DDP_CALL_REDUCE_SCATTER || kind == DDP_CALL_ALL_GATHER ||
           kind == DDP_CALL_BARRIER || kind == DDP_CALL_ALL_TO_ALL;
}

_DDP_PRIVATE int _ddp_straggler_cmp_u32(const void *x, const void *y) {
    uint32_t a = *(const uint32_t *)x, b = *(const uint32_t *)y;
    return a < b ? -1 : a > b;
}

/* The median of v[0..n) (the mean of the middle two for even n; 0 for n = 0); sorts v. At most
 * the window's or the world's size, once per call or per period: a sort is cheap enough. */
_DDP_PRIVATE uint32_t _ddp_straggler_median(uint32_t *v, size_t n) {
    if (!n) return 0;
    qsort(v, n, sizeof *v, _ddp_straggler_cmp_u32);
    if (n % 2) return v[n / 2];
    return (uint32_t)(((uint64_t)v[n / 2 - 1] + v[n / 2]) / 2);
}

_DDP_PRIVATE void _ddp_straggler_push(_ddp_straggler_t *a, const _ddp_straggler_call_t *c) {
    _ddp_straggler_call_t *slot = &a->ring[a->head];
    if (a->count == a->o.window) {
        if (slot->last >= 0) a->last_counts[slot->last]--;
        if (slot->kind < (uint32_t)_DDP_NUM_KINDS) a->kind_counts[slot->kind]--;
    } else {
        a->count++;
    }
    *slot = *c;
    if (c->last >= 0) a->last_counts[c->last]++;
    if (c->kind < (uint32_t)_DDP_NUM_KINDS) a->kind_counts[c->kind]++;
    a->head = (a->head + 1) % a->o.window;
    a->analysed++;
}

/* One call seen by every rank, at each rank's cursor. */
_DDP_PRIVATE void _ddp_straggler_one(_ddp_straggler_t *a, const unsigned char *const *blob) {
    _ddp_straggler_call_t c;
    _ddp_timing_rec_t r;
    uint32_t min1 = UINT32_MAX, min2 = UINT32_MAX, kind = 0;
    size_t ngaps = 0;
    int i, argmin = -1;
    for (i = 0; i < a->nranks; i++) {
        _ddp_straggler_record(blob[i], (uint32_t)a->cursor[i], &r);
        if (i == 0) kind = r.kind;
        if (r.kind != kind) return;                 /* not the same call everywhere: skipped */
        if (r.dur_us < min1) { min2 = min1; min1 = r.dur_us; argmin = i; }
        else if (r.dur_us < min2) min2 = r.dur_us;
        if (r.gap_us) a->scratch[ngaps++] = r.gap_us;
    }
    if (!_ddp_straggler_kind_counts(kind)) return;
    c.kind = kind;
    c.interval_us = _ddp_straggler_median(a->scratch, ngaps);
    if (a->nranks < 2 || min2 == min1) {            /* nobody to be last after, or a tie */
        c.last = -1;
        c.lag_us = 0;
    } else {
        c.last = argmin;
        c.lag_us = min2 - min1;
    }
    _ddp_straggler_push(a, &c);
}

/* Every rank's TIMING blob (blob[r], len[r]; a NULL blob: that rank published none yet): the
 * calls every blob holds and that were not analysed before go into the window, oldest first.
 * Returns how many calls were analysed (0 when a blob is missing), or -1 when a blob is
 * malformed (err names the rank and why; nothing is analysed). */
_DDP_PRIVATE int _ddp_straggler_ingest(_ddp_straggler_t *a, const unsigned char *const *blob, const size_t *len,
                                       char *err, size_t cap) {
    int r;
    uint64_t n0 = a->analysed;
    char why[160];
    for (r = 0; r < a->nranks; r++) {
        if (!blob[r]) return 0;
        if (_ddp_straggler_check(blob[r], len[r], &a->blob_count[r], why, sizeof why) != 0) {
            snprintf(err, cap, "rank %d's timing blob is malformed: %.120s", r, why);
            return -1;
        }
        a->cursor[r] = 0;
        if (a->have_seq)
            while ((uint32_t)a->cursor[r] < a->blob_count[r] &&
                   !_ddp_straggler_newer(_ddp_straggler_get32(blob[r] + _DDP_STRAGGLER_HEADER +
                                                              (size_t)a->cursor[r] * _DDP_STRAGGLER_RECORD),
                                         a->last_seq))
                a->cursor[r]++;
    }
#define _DDP_STRAGGLER_SEQ(r) _ddp_straggler_get32(blob[r] + _DDP_STRAGGLER_HEADER + (size_t)a->cursor[r] * _DDP_STRAGGLER_RECORD)
    for (;;) {
        uint32_t target;
        int all = 1;
        for (r = 0; r < a->nranks; r++)
            if ((uint32_t)a->cursor[r] >= a->blob_count[r]) goto done;
        /* the newest call at any cursor: no older one can be in every blob */
        target = _DDP_STRAGGLER_SEQ(0);
        for (r = 1; r < a->nranks; r++)
            if (_ddp_straggler_newer(_DDP_STRAGGLER_SEQ(r), target)) target = _DDP_STRAGGLER_SEQ(r);
        for (r = 0; r < a->nranks; r++) {
            while ((uint32_t)a->cursor[r] < a->blob_count[r] && _ddp_straggler_newer(target, _DDP_STRAGGLER_SEQ(r)))
                a->cursor[r]++;
            if ((uint32_t)a->cursor[r] >= a->blob_count[r]) goto done;
            if (_DDP_STRAGGLER_SEQ(r) != target) all = 0;
        }
        if (!all) continue;
        _ddp_straggler_one(a, blob);
        a->last_seq = target;
        a->have_seq = 1;
        for (r = 0; r < a->nranks; r++) a->cursor[r]++;
    }
#undef _DDP_STRAGGLER_SEQ
done:
    return (int)(a->analysed - n0);
}

/* The window's figures (uses the analyser's scratch, hence not const). */
_DDP_PRIVATE void _ddp_straggler_figures(_ddp_straggler_t *a, _ddp_straggler_figures_t *f) {
    int r, i, k;
    size_t n;
    memset(f, 0, sizeof *f);
    f->window = a->count;
    f->analysed = a->analysed;
    f->last_rank = -1;
    for (k = 1; k < _DDP_NUM_KINDS; k++)
        if (a->kind_counts[k] > (f->kind ? a->kind_counts[f->kind] : 0)) f->kind = k;
    f->mixed = f->kind && a->kind_counts[f->kind] != (uint32_t)a->count;
    for (r = 0; r < a->nranks; r++)
        if (a->last_counts[r] > f->last_count) { f->last_count = a->last_counts[r]; f->last_rank = r; }
    for (i = 0, n = 0; i < a->count; i++)
        if (a->ring[i].last == f->last_rank && f->last_rank >= 0) a->scratch[n++] = a->ring[i].lag_us;
    f->median_lag_us = _ddp_straggler_median(a->scratch, n);
    for (i = 0, n = 0; i < a->count; i++)
        if (a->ring[i].interval_us) a->scratch[n++] = a->ring[i].interval_us;
    f->median_interval_us = _ddp_straggler_median(a->scratch, n);
    f->share = f->median_interval_us ? (double)f->median_lag_us / f->median_interval_us : 0.0;
    f->warn = f->last_rank >= 0 && f->window >= a->o.min_calls && (uint64_t)f->last_count * 2 > (uint64_t)f->window &&
              f->share >= a->o.share;
}

/* The STRAGGLER line (docs/operations.md) into buf: its length, or -1 when cap is too small
 * (_DDP_STRAGGLER_LINE_MAX(nranks) always does; nothing partial is left as a line). */
_DDP_PRIVATE int _ddp_straggler_line(_ddp_straggler_t *a, char *buf, size_t cap) {
    _ddp_straggler_figures_t f;
    size_t len;
    int r, w;
    _ddp_straggler_figures(a, &f);
    w = snprintf(buf, cap,
                 "v=1 window=%d analysed=%llu kind=%s last_rank=%d last_count=%u median_lag_us=%u "
                 "median_interval_us=%u share=%.2f warn=%d last_counts=",
                 f.window, (unsigned long long)f.analysed, f.kind ? _ddp_kind_name(f.kind) : "none", f.last_rank,
                 f.last_count, f.median_lag_us, f.median_interval_us, f.share, f.warn);
    if (w < 0 || (size_t)w >= cap) { if (cap) buf[0] = 0; return -1; }
    len = (size_t)w;
    for (r = 0; r < a->nranks; r++) {
        w = snprintf(buf + len, cap - len, "%s%u", r ? "," : "", a->last_counts[r]);
        if (w < 0 || (size_t)w >= cap - len) { buf[0] = 0; return -1; }
        len += (size_t)w;
    }
    return (int)len;
}

/* "1,000", "12,345,678". */
_DDP_PRIVATE void _ddp_straggler_fmt_count(char *out, size_t cap, uint64_t v) {
    char d[32];
    size_t n = (size_t)snprintf(d, sizeof d, "%llu", (unsigned long long)v), i, o = 0;
    for (i = 0; i < n && o + 2 < cap; i++) {
        out[o++] = d[i];
        if (i + 1 < n && (n - i - 1) % 3 == 0) out[o++] = ',';
    }
    if (cap) out[o < cap ? o : cap - 1] = 0;
}

/* "850 us", "4.9 ms", "12 ms", "1.5 s". */
_DDP_PRIVATE void _ddp_straggler_fmt_us(char *out, size_t cap, uint32_t us) {
    if (us < 1000) snprintf(out, cap, "%u us", us);
    else if (us < 9950) snprintf(out, cap, "%.1f ms", us / 1e3);
    else if (us < 999500) snprintf(out, cap, "%.0f ms", us / 1e3);
    else snprintf(out, cap, "%.1f s", us / 1e6);
}

/* "all-reduces", ...; "collectives" for a window of several kinds. */
_DDP_PRIVATE const char *_ddp_straggler_plural(const _ddp_straggler_figures_t *f) {
    if (f->mixed) return "collectives";
    switch (f->kind) {
    case DDP_CALL_ALL_REDUCE: return "all-reduces";
    case DDP_CALL_REDUCE_SCATTER: return "reduce-scatters";
    case DDP_CALL_ALL_GATHER: return "all-gathers";
    case DDP_CALL_BARRIER: return "barriers";
    case DDP_CALL_ALL_TO_ALL: return "all-to-alls";
    default: return "collectives";
    }
}

/* The WARN sentence for figures whose warn holds. */
_DDP_PRIVATE void _ddp_straggler_warn_text(const _ddp_straggler_figures_t *f, char *out, size_t cap) {
    char cnt[32], win[32], lag[32];
    _ddp_straggler_fmt_count(cnt, sizeof cnt, f->last_count);
    _ddp_straggler_fmt_count(win, sizeof win, (uint64_t)f->window);
    _ddp_straggler_fmt_us(lag, sizeof lag, f->median_lag_us);
    snprintf(out, cap, "rank %d arrived last in %s of the last %s %s, a median %s after the others "
             "(%.0f%% of the time between calls)", f->last_rank, cnt, win, _ddp_straggler_plural(f), lag,
             f->share * 100.0);
}

/* The INFO report: the window's most-often-last rank and the two after it. */
_DDP_PRIVATE void _ddp_straggler_info_text(_ddp_straggler_t *a, const _ddp_straggler_figures_t *f, char *out,
                                           size_t cap) {
    char win[32], cnt[32], lag[32], itv[32];
    int top[3] = {-1, -1, -1}, r, j, k;
    size_t len;
    _ddp_straggler_fmt_count(win, sizeof win, (uint64_t)f->window);
    if (f->last_rank < 0) {
        snprintf(out, cap, "straggler report: the last %s %s named nobody as last to arrive (%s)", win,
                 _ddp_straggler_plural(f), a->nranks < 2 ? "a world of 1" : "ties");
        return;
    }
    _ddp_straggler_fmt_count(cnt, sizeof cnt, f->last_count);
    _ddp_straggler_fmt_us(lag, sizeof lag, f->median_lag_us);
    _ddp_straggler_fmt_us(itv, sizeof itv, f->median_interval_us);
    snprintf(out, cap, "straggler report: of the last %s %s, rank %d arrived last in %s, a median %s after the "
             "others (%.0f%% of the median %s between calls)", win, _ddp_straggler_plural(f), f->last_rank, cnt, lag,
             f->share * 100.0, itv);
    for (r = 0; r < a->nranks; r++) {               /* the three most often last, rank order on ties */
        if (!a->last_counts[r]) continue;
        for (j = 0; j < 3; j++)
            if (top[j] < 0 || a->last_counts[r] > a->last_counts[top[j]]) break;
        if (j == 3) continue;
        for (k = 2; k > j; k--) top[k] = top[k - 1];
        top[j] = r;
    }
    for (j = 1; j < 3 && top[j] >= 0; j++) {
        len = strlen(out);
        if (len + 1 >= cap) break;
        snprintf(out + len, cap - len, "%s rank %d in %u", j == 1 ? "; then" : ",", top[j], a->last_counts[top[j]]);
    }
}

/* What to log now, called after each ingest: the INFO report when report_calls more calls were
 * analysed since the last one; the WARN when its condition holds and none was logged in the
 * last window's worth of calls. Returns 1 (info written), 2 (warn written), 3 (both) or 0. */
_DDP_PRIVATE int _ddp_straggler_report(_ddp_straggler_t *a, char *info, size_t icap, char *warn, size_t wcap) {
    _ddp_straggler_figures_t f;
    int out = 0;
    _ddp_straggler_figures(a, &f);
    if (icap) info[0] = 0;
    if (wcap) warn[0] = 0;
    if (a->o.report_calls > 0 && f.window > 0 &&
        a->analysed / (uint64_t)a->o.report_calls > a->reported_at / (uint64_t)a->o.report_calls) {
        _ddp_straggler_info_text(a, &f, info, icap);
        a->reported_at = a->analysed;
        out |= 1;
    }
    if (f.warn && (!a->warned || a->analysed >= a->warned_at + (uint64_t)a->o.window)) {
        _ddp_straggler_warn_text(&f, warn, wcap);
        a->warned = 1;
        a->warned_at = a->analysed;
        out |= 2;
    }
    return out;
}

#endif /* DDP_STRAGGLER_IMPLEMENTATION */
