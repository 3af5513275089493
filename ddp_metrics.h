/* SPDX-License-Identifier: MIT (see LICENSE) */
/* ddp_metrics.h — the metrics file: what one rank's communicator has done, in the Prometheus
 * text exposition format (version 0.0.4), for a Prometheus (through node-exporter's textfile
 * collector, or any scraper that reads a file) to collect. Private: the health thread
 * (ddp_health.h) fills a _ddp_metrics_in_t every DDP_METRICS_PERIOD_MS and calls
 * _ddp_metrics_write_file; users see DDP_METRICS and docs/operations.md ("Metrics"), which
 * lists every metric.
 *
 *   - One file per rank: DDP_METRICS's path with every "%r" replaced by the rank, else the rank
 *     put before a ".prom" ending ("ddp.prom" -> "ddp.3.prom"), else ".<rank>.prom" appended
 *     (DDP_TRACE's rule with the textfile collector's ending; it reads only "*.prom").
 *   - Whole files only: each refresh is written to "<path>.<pid>-<tid>.tmp" beside it and
 *     renamed over it, so a reader sees the previous file or the new one, never half of one.
 *   - Every series carries rank="<r>" (and job_id="<the launcher's job>" when there is one), so
 *     the files of all ranks, and of jobs sharing a directory, merge into one scrape; every
 *     family keeps the same label names in every file (the textfile collector refuses a family
 *     whose label names differ between series). Per call kind only the kinds that were called.
 *   - Bounded: the text goes through an 8 KiB buffer to write(2); nothing is allocated; the
 *     per-rank straggler series are listed for the first _DDP_METRICS_LISTED ranks, beyond
 *     that only for ranks that were last at least once, at most 2 x _DDP_METRICS_LISTED lines.
 *
 * Bus bandwidth: nccl-tests' busbw (bench/bench_common.h: algbw x 2(n-1)/n for all-reduce,
 * x (n-1)/n for reduce-scatter, all-gather, all-to-all, gather and scatter, x 1 for broadcast,
 * reduce, send and recv), over the calls of the last interval: the bytes of the calls made
 * since the previous refresh times the factor, over the time spent in them. Given only when
 * every such call was timed (the time is in the counters only then).
 *
 * Threads: called by the health thread alone, on copies it read (_ddp_metrics_read).
 * Depends on ddp_stats.h. Built by DDP_IMPLEMENTATION (or DDP_METRICS_IMPLEMENTATION).
 */
#if defined(DDP_IMPLEMENTATION) && !defined(DDP_METRICS_IMPLEMENTATION)
#define DDP_METRICS_IMPLEMENTATION
#endif
#if defined(DDP_METRICS_IMPLEMENTATION) && !defined(DDP_STATS_IMPLEMENTATION)
#define DDP_STATS_IMPLEMENTATION
#endif
#include "ddp_stats.h"

#if defined(DDP_METRICS_IMPLEMENTATION) && !defined(DDP_METRICS_IMPL_INCLUDED)
#define DDP_METRICS_IMPL_INCLUDED
#ifndef DDP_STATS_IMPL_INCLUDED
#error "libddp: ddp_metrics.h's implementation needs ddp_stats.h's (define DDP_IMPLEMENTATION)"
#endif
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#define _DDP_METRICS_PERIOD_MS 2000  /* DDP_METRICS_PERIOD_MS's default */
#define _DDP_METRICS_LISTED 1024     /* straggler figures per rank: every rank up to here */
#define _DDP_METRICS_PATH 4096       /* longest file name */

/* A ring neighbour as the health thread sees it. */
typedef struct {
    int rank;                        /* -1: none (a world of 1) */
    const char *state;               /* the STATUS line's <side>_state: "ok", "silent",
                                      * "unreachable", "closed", "connecting" */
    int64_t ms;                      /* since its last heartbeat; -1: never */
} _ddp_metrics_peer_t;

/* Rank 0's straggler analysis (the STRAGGLER line's figures). */
typedef struct {
    int valid;                       /* 0: none here (ranks but 0, or no analysis yet) */
    int kind;                        /* the calls analysed (ddp_call_kind_t) */
    uint64_t window;                 /* calls in the rolling window */
    uint64_t analysed;               /* calls analysed since the start */
    int last_rank;                   /* last to arrive most often in the window; -1: none yet */
    uint64_t last_count;             /* in how many of the window's calls */
    int64_t median_lag_us;           /* its median lag behind the next-latest rank */
    int64_t median_interval_us;      /* the median time between calls */
    double share;                    /* median_lag_us / median_interval_us */
    int warn;                        /* the WARN condition holds */
    const uint32_t *last_counts;     /* per rank, how often it was last; NULL: not given */
    int n;                           /* entries in last_counts */
} _ddp_metrics_straggler_t;

/* What one refresh writes. Zero-initialise it once; the health thread sets the fields, and
 * copies now into prev after each refresh (prev all zero at the first: the bandwidth then
 * covers the calls since init). */
typedef struct {
    int rank, size;
    const char *job;                 /* the launcher's job identity (c->boot.job): the job_id label
                                      * when not empty, so that jobs sharing a directory differ */
    const char *transport;           /* what carries the collectives ("tcp", "shm+tcp", ...) */
    const char *version;             /* libddp's ("0.2") */
    _ddp_kind_stats_t now[_DDP_NUM_KINDS];    /* the counters, indexed by ddp_call_kind_t */
    _ddp_kind_stats_t prev[_DDP_NUM_KINDS];   /* the previous refresh's */
    _ddp_metrics_straggler_t straggler;
    _ddp_metrics_peer_t peer[2];     /* the ring neighbours: [0] left (rank - 1), [1] right */
    uint64_t hb_sent_bytes, hb_recv_bytes;    /* heartbeat traffic since the start */
    int failed;                      /* the communicator has failed */
} _ddp_metrics_in_t;

/* DDP_METRICS (the path pattern) and DDP_METRICS_PERIOD_MS. 1: metrics on (pattern and
 * period_ms set); 0: DDP_METRICS unset or empty; -1: a value that cannot be used (err says
 * which; metrics are then off). */
_DDP_PRIVATE int _ddp_metrics_env(char *pattern, size_t pattern_cap, int *period_ms, char *err, size_t cap) {
    const char *p = getenv("DDP_METRICS");
    long v = _DDP_METRICS_PERIOD_MS;
    int r = _ddp_env_int("DDP_METRICS_PERIOD_MS", 100, 86400000L, &v);
    *period_ms = _DDP_METRICS_PERIOD_MS;
    if (!p || !*p) return 0;
    if (r < 0) {
        snprintf(err, cap, "DDP_METRICS_PERIOD_MS=%s: expected milliseconds, 100 .. 86400000",
                 getenv("DDP_METRICS_PERIOD_MS"));
        return -1;
    }
    if (strlen(p) >= pattern_cap) {
        snprintf(err, cap, "DDP_METRICS: a path of %zu characters (at most %zu)", strlen(p), pattern_cap - 1);
        return -1;
    }
    memcpy(pattern, p, strlen(p) + 1);
    *period_ms = (int)v;
    return 1;
}

/* Every kind's counters as a reader sees them now. */
_DDP_PRIVATE void _ddp_metrics_read(const _ddp_stats_t *s, _ddp_kind_stats_t out[_DDP_NUM_KINDS]) {
    int k;
    for (k = 0; k < _DDP_NUM_KINDS; k++) _ddp_stats_read_kind(s, k, &out[k]);
}

/* nccl-tests' bus bandwidth factor for a call kind in a world of n (0: no bandwidth to speak of). */
_DDP_PRIVATE double _ddp_busbw_factor(int kind, int n) {
    if (n < 1) return 0;
    switch (kind) {
    case DDP_CALL_ALL_REDUCE: return 2.0 * (n - 1) / n;
    case DDP_CALL_REDUCE_SCATTER: case DDP_CALL_ALL_GATHER: case DDP_CALL_ALL_TO_ALL:
    case DDP_CALL_GATHER: case DDP_CALL_SCATTER: return (double)(n - 1) / n;
    case DDP_CALL_BROADCAST: case DDP_CALL_REDUCE: case DDP_CALL_SEND: case DDP_CALL_RECV: return 1.0;
    default: return 0;
    }
}

/* The file of a rank (rules at the top). 0, or -1 when it does not fit in cap. */
_DDP_PRIVATE int _ddp_metrics_path(const char *pattern, int rank, char *out, size_t cap) {
    size_t n = 0, plen = strlen(pattern);
    const char *s;
    int w;
    if (!cap) return -1;
    if (strstr(pattern, "%r")) {
        for (s = pattern; *s; s++) {
            if (s[0] == '%' && s[1] == 'r') {
                w = snprintf(out + n, cap - n, "%d", rank);
                if (w < 0 || (size_t)w >= cap - n) return -1;
                n += (size_t)w;
                s++;
            } else {
                if (n + 1 >= cap) return -1;
                out[n++] = *s;
            }
        }
        out[n] = 0;
        return 0;
    }
    if (plen > 5 && !strcmp(pattern + plen - 5, ".prom"))
        w = snprintf(out, cap, "%.*s.%d.prom", (int)(plen - 5), pattern, rank);
    else
        w = snprintf(out, cap, "%s.%d.prom", pattern, rank);
    return w < 0 || (size_t)w >= cap ? -1 : 0;
}

/* The text, through a bounded buffer to a descriptor; a family's HELP and TYPE lines are
 * written with its first sample, so a family without samples is left out. */
typedef struct {
    int fd;
    int err;                         /* errno of the first failed write; 0: none */
    size_t len;
    const char *name, *type, *help;  /* the family being written */
    int headed;                      /* its HELP and TYPE are out */
    char rank[200];                  /* the labels of every series: rank="r"[,job_id="j"] */
    char buf[8192];
} _ddp_prom_t;

_DDP_PRIVATE void _ddp_prom_flush(_ddp_prom_t *w) {
    size_t off = 0;
    while (off < w->len && !w->err) {
        ssize_t k = write(w->fd, w->buf + off, w->len - off);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) { w->err = k < 0 ? errno : EIO; break; }
        off += (size_t)k;
    }
    w->len = 0;
}

_DDP_PRIVATE void _ddp_prom_put(_ddp_prom_t *w, const char *s) {
    size_t n = strlen(s);
    if (w->len + n > sizeof w->buf) _ddp_prom_flush(w);
    if (n > sizeof w->buf) n = sizeof w->buf;   /* lines are far shorter: never */
    memcpy(w->buf + w->len, s, n);
    w->len += n;
}

/* A label value as the format wants it (\\, \" and \n escaped), cut to fit cap. */
_DDP_PRIVATE void _ddp_prom_escape(char *out, size_t cap, const char *s) {
    size_t n = 0;
    for (; s && *s && n + 3 <= cap; s++) {
        if (*s == '\\' || *s == '"') { out[n++] = '\\'; out[n++] = *s; }
        else if (*s == '\n') { out[n++] = '\\'; out[n++] = 'n'; }
        else out[n++] = *s;
    }
    out[n] = 0;
}

_DDP_PRIVATE void _ddp_prom_family(_ddp_prom_t *w, const char *name, const char *type, const char *help) {
    w->name = name; w->type = type; w->help = help; w->headed = 0;
}

/* name<suffix>{rank="r",<labels>} <value> */
_DDP_PRIVATE void _ddp_prom_sample(_ddp_prom_t *w, const char *suffix, const char *labels, const char *value) {
    char line[1024];
    if (!w->headed) {
        snprintf(line, sizeof line, "# HELP %s %s\n# TYPE %s %s\n", w->name, w->help, w->name, w->type);
        _ddp_prom_put(w, line);
        w->headed = 1;
    }
    snprintf(line, sizeof line, "%s%s{%s%s%s} %s\n", w->name, suffix, w->rank,
             labels && *labels ? "," : "", labels ? labels : "", value);
    _ddp_prom_put(w, line);
}

_DDP_PRIVATE const char *_ddp_prom_u64(char *buf, size_t cap, uint64_t v) {
    snprintf(buf, cap, "%llu", (unsigned long long)v);
    return buf;
}

_DDP_PRIVATE const char *_ddp_prom_double(char *buf, size_t cap, double v) {
    if (v != v) snprintf(buf, cap, "NaN");
    else if (v > 1.7976931348623157e308) snprintf(buf, cap, "+Inf");
    else if (v < -1.7976931348623157e308) snprintf(buf, cap, "-Inf");
    else snprintf(buf, cap, "%.17g", v);
    return buf;
}

/* Nanoseconds as seconds, exactly. */
_DDP_PRIVATE const char *_ddp_prom_ns(char *buf, size_t cap, uint64_t ns) {
    snprintf(buf, cap, "%llu.%09llu", (unsigned long long)(ns / 1000000000u),
             (unsigned long long)(ns % 1000000000u));
    return buf;
}

_DDP_PRIVATE const char *_ddp_metrics_kind_label(int kind) {
    return kind > 0 && kind < _DDP_NUM_KINDS ? _ddp_kind_name(kind) : "other";
}

_DDP_PRIVATE void _ddp_metrics_calls(_ddp_prom_t *w, const _ddp_metrics_in_t *in) {
    static const char *const fam[3][2] = {
        {"ddp_calls_total", "Operations run on this rank, by kind (failed ones included)."},
        {"ddp_call_errors_total", "Operations that failed on this rank, by kind."},
        {"ddp_call_bytes_total", "Bytes the operations moved, by kind: per call the larger of its send and "
                                 "receive buffers (nccl-tests' size)."}};
    char lab[64], v[32];
    int f, k;
    for (f = 0; f < 3; f++) {
        _ddp_prom_family(w, fam[f][0], "counter", fam[f][1]);
        for (k = 0; k < _DDP_NUM_KINDS; k++) {
            const _ddp_kind_stats_t *s = &in->now[k];
            if (!s->calls) continue;
            snprintf(lab, sizeof lab, "kind=\"%s\"", _ddp_metrics_kind_label(k));
            _ddp_prom_sample(w, "", lab, _ddp_prom_u64(v, sizeof v, f == 0 ? s->calls : f == 1 ? s->errors : s->bytes));
        }
    }
}

/* Cumulative buckets; _count is the +Inf bucket (so the two agree even when a snapshot mixed
 * two calls), saturating rather than wrapping. */
_DDP_PRIVATE void _ddp_metrics_histogram(_ddp_prom_t *w, const _ddp_metrics_in_t *in) {
    char lab[96], v[48];
    int k, b;
    _ddp_prom_family(w, "ddp_call_duration_seconds", "histogram",
                     "Time from entering an operation to its return on this rank, by kind (the timed "
                     "calls: those made while the health thread runs).");
    for (k = 0; k < _DDP_NUM_KINDS; k++) {
        const _ddp_kind_stats_t *s = &in->now[k];
        const char *kn = _ddp_metrics_kind_label(k);
        uint64_t cum = 0;
        if (!s->calls) continue;
        for (b = 0; b < _DDP_STATS_BUCKETS; b++) {
            cum = s->bucket[b] > UINT64_MAX - cum ? UINT64_MAX : cum + s->bucket[b];
            if (b < _DDP_STATS_BUCKETS - 1) snprintf(lab, sizeof lab, "kind=\"%s\",le=\"%g\"", kn, _ddp_stats_le_s[b]);
            else snprintf(lab, sizeof lab, "kind=\"%s\",le=\"+Inf\"", kn);
            _ddp_prom_sample(w, "_bucket", lab, _ddp_prom_u64(v, sizeof v, cum));
        }
        snprintf(lab, sizeof lab, "kind=\"%s\"", kn);
        _ddp_prom_sample(w, "_sum", lab, _ddp_prom_ns(v, sizeof v, s->ns));
        _ddp_prom_sample(w, "_count", lab, _ddp_prom_u64(v, sizeof v, cum));
    }
}

_DDP_PRIVATE void _ddp_metrics_busbw(_ddp_prom_t *w, const _ddp_metrics_in_t *in) {
    char lab[64], v[48];
    int k;
    _ddp_prom_family(w, "ddp_bus_bandwidth_bytes_per_second", "gauge",
                     "nccl-tests' bus bandwidth over the calls since the previous refresh, by kind: "
                     "their bytes times the kind's factor (all_reduce 2(n-1)/n; reduce_scatter, all_gather, "
                     "all_to_all, gather, scatter (n-1)/n; others 1) over the time spent in them.");
    for (k = 1; k < _DDP_NUM_KINDS; k++) {
        const _ddp_kind_stats_t *s = &in->now[k], *p = &in->prev[k];
        double factor = _ddp_busbw_factor(k, in->size);
        uint64_t calls, timed, bytes, ns;
        if (!s->calls || factor <= 0 || s->calls < p->calls || s->timed < p->timed || s->bytes < p->bytes ||
            s->ns < p->ns)
            continue;   /* a counter went back: another communicator's, or torn; say nothing */
        calls = s->calls - p->calls;
        timed = s->timed - p->timed;
        bytes = s->bytes - p->bytes;
        ns = s->ns - p->ns;
        if (!calls || timed != calls || !ns) continue;
        snprintf(lab, sizeof lab, "kind=\"%s\"", _ddp_kind_name(k));
        _ddp_prom_sample(w, "", lab, _ddp_prom_double(v, sizeof v, (double)bytes * factor / ((double)ns * 1e-9)));
    }
}

_DDP_PRIVATE void _ddp_metrics_straggler(_ddp_prom_t *w, const _ddp_metrics_in_t *in) {
    const _ddp_metrics_straggler_t *g = &in->straggler;
    char lab[64], lab2[96], v[48];
    int i, listed = 0;
    if (!g->valid) return;
    snprintf(lab, sizeof lab, "kind=\"%s\"", g->kind > 0 && g->kind < _DDP_NUM_KINDS ? _ddp_kind_name(g->kind) : "none");
    _ddp_prom_family(w, "ddp_straggler_window_calls", "gauge",
                     "Calls in the straggler analysis's rolling window (rank 0 analyses every rank's timings).");
    _ddp_prom_sample(w, "", lab, _ddp_prom_u64(v, sizeof v, g->window));
    _ddp_prom_family(w, "ddp_straggler_analysed_calls_total", "counter", "Calls the straggler analysis has seen.");
    _ddp_prom_sample(w, "", lab, _ddp_prom_u64(v, sizeof v, g->analysed));
    _ddp_prom_family(w, "ddp_straggler_last_rank", "gauge",
                     "The rank that arrived last in most calls of the window; -1: none yet.");
    snprintf(v, sizeof v, "%d", g->last_rank);
    _ddp_prom_sample(w, "", lab, v);
    _ddp_prom_family(w, "ddp_straggler_last_rank_calls", "gauge", "In how many calls of the window that rank arrived last.");
    _ddp_prom_sample(w, "", lab, _ddp_prom_u64(v, sizeof v, g->last_count));
    _ddp_prom_family(w, "ddp_straggler_lag_seconds", "gauge",
                     "Over the calls where that rank was last: the median time it arrived after the rank before it.");
    _ddp_prom_sample(w, "", lab, _ddp_prom_double(v, sizeof v, (double)g->median_lag_us * 1e-6));
    _ddp_prom_family(w, "ddp_straggler_call_interval_seconds", "gauge", "The median time between calls in the window.");
    _ddp_prom_sample(w, "", lab, _ddp_prom_double(v, sizeof v, (double)g->median_interval_us * 1e-6));
    _ddp_prom_family(w, "ddp_straggler_lag_ratio", "gauge",
                     "The lag over the interval between calls: the share of the step lost waiting for that rank.");
    _ddp_prom_sample(w, "", lab, _ddp_prom_double(v, sizeof v, g->share));
    _ddp_prom_family(w, "ddp_straggler_warning", "gauge",
                     "1 while one rank is last in most calls by more than the set share of the step (the WARN).");
    _ddp_prom_sample(w, "", lab, g->warn ? "1" : "0");
    _ddp_prom_family(w, "ddp_straggler_last_arrivals", "gauge",
                     "Per rank (peer): in how many calls of the window it arrived last (beyond 1024 ranks only "
                     "those that were last at least once).");
    for (i = 0; g->last_counts && i < g->n && listed < 2 * _DDP_METRICS_LISTED; i++) {
        if (i >= _DDP_METRICS_LISTED && !g->last_counts[i]) continue;
        snprintf(lab2, sizeof lab2, "%s,peer=\"%d\"", lab, i);
        _ddp_prom_sample(w, "", lab2, _ddp_prom_u64(v, sizeof v, g->last_counts[i]));
        listed++;
    }
}

_DDP_PRIVATE void _ddp_metrics_peers(_ddp_prom_t *w, const _ddp_metrics_in_t *in) {
    static const char *const side[2] = {"left", "right"};
    char lab[160], st[64], v[48];
    int i;
    _ddp_prom_family(w, "ddp_peer_heartbeat_age_seconds", "gauge",
                     "Time since the last heartbeat from a ring neighbour (left: rank - 1, right: rank + 1); "
                     "absent while none came.");
    for (i = 0; i < 2; i++) {
        const _ddp_metrics_peer_t *p = &in->peer[i];
        if (p->rank < 0 || p->ms < 0) continue;
        snprintf(lab, sizeof lab, "peer=\"%d\",side=\"%s\"", p->rank, side[i]);
        _ddp_prom_sample(w, "", lab, _ddp_prom_double(v, sizeof v, (double)p->ms * 1e-3));
    }
    _ddp_prom_family(w, "ddp_peer_up", "gauge",
                     "1 while a ring neighbour's heartbeats arrive (state ok), else 0 with its state: silent "
                     "(link up, no heartbeat: stopped or hung), unreachable, closed, connecting.");
    for (i = 0; i < 2; i++) {
        const _ddp_metrics_peer_t *p = &in->peer[i];
        const char *s = p->state && *p->state ? p->state : "unknown";
        if (p->rank < 0) continue;
        _ddp_prom_escape(st, sizeof st, s);
        snprintf(lab, sizeof lab, "peer=\"%d\",side=\"%s\",state=\"%s\"", p->rank, side[i], st);
        _ddp_prom_sample(w, "", lab, strcmp(s, "ok") ? "0" : "1");
    }
}

/* The whole exposition to fd; 0, or an errno. */
_DDP_PRIVATE int _ddp_metrics_write_fd(int fd, const _ddp_metrics_in_t *in) {
    _ddp_prom_t w;
    char lab[400], ver[96], tr[96], job[160], v[48];
    memset(&w, 0, offsetof(_ddp_prom_t, buf));
    w.fd = fd;
    _ddp_prom_escape(job, sizeof job, in->job);
    if (job[0]) snprintf(w.rank, sizeof w.rank, "rank=\"%d\",job_id=\"%s\"", in->rank, job);
    else snprintf(w.rank, sizeof w.rank, "rank=\"%d\"", in->rank);
    _ddp_prom_family(&w, "ddp_info", "gauge", "Always 1: libddp's version, the transport and the world size as labels.");
    _ddp_prom_escape(ver, sizeof ver, in->version ? in->version : "");
    _ddp_prom_escape(tr, sizeof tr, in->transport ? in->transport : "");
    snprintf(lab, sizeof lab, "version=\"%s\",transport=\"%s\",size=\"%d\"", ver, tr, in->size);
    _ddp_prom_sample(&w, "", lab, "1");
    _ddp_prom_family(&w, "ddp_communicator_failed", "gauge",
                     "1 once the communicator has failed (its error is in the log and in ddp-status), else 0.");
    _ddp_prom_sample(&w, "", "", in->failed ? "1" : "0");
    _ddp_metrics_calls(&w, in);
    _ddp_metrics_histogram(&w, in);
    _ddp_metrics_busbw(&w, in);
    _ddp_metrics_straggler(&w, in);
    _ddp_metrics_peers(&w, in);
    _ddp_prom_family(&w, "ddp_heartbeat_bytes_total", "counter", "Bytes of heartbeats to and from the ring neighbours.");
    _ddp_prom_sample(&w, "", "direction=\"sent\"", _ddp_prom_u64(v, sizeof v, in->hb_sent_bytes));
    _ddp_prom_sample(&w, "", "direction=\"received\"", _ddp_prom_u64(v, sizeof v, in->hb_recv_bytes));
    _ddp_prom_flush(&w);
    return w.err;
}

/* Writes the file at path whole: into "<path>.<pid>-<tid>.tmp" (mode 0644 less the umask: a
 * collector may run as another user), then renamed over path. 0, or -1 with err saying what. */
_DDP_PRIVATE int _ddp_metrics_write_file(const char *path, const _ddp_metrics_in_t *in, char *err, size_t cap) {
    char tmp[_DDP_METRICS_PATH + 48];
    int fd, e, n;
    n = snprintf(tmp, sizeof tmp, "%s.%ld-%ld.tmp", path, (long)getpid(), (long)syscall(SYS_gettid));
    if (n < 0 || (size_t)n >= sizeof tmp) {
        snprintf(err, cap, "DDP_METRICS: the file name %.64s... is too long", path);
        return -1;
    }
    fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        snprintf(err, cap, "DDP_METRICS: cannot write %.300s (a temporary file beside it): %s", path, strerror(errno));
        return -1;
    }
    e = _ddp_metrics_write_fd(fd, in);
    if (close(fd) < 0 && !e) e = errno;
    if (e) {
        snprintf(err, cap, "DDP_METRICS: cannot write %.300s (a temporary file beside it): %s", path, strerror(e));
        unlink(tmp);
        return -1;
    }
    if (rename(tmp, path) < 0) {
        snprintf(err, cap, "DDP_METRICS: cannot rename the new file onto %.300s: %s", path, strerror(errno));
        unlink(tmp);
        return -1;
    }
    return 0;
}

#endif /* DDP_METRICS_IMPLEMENTATION */
