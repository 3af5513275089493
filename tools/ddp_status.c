/* SPDX-License-Identifier: MIT (see LICENSE) */
/* ddp_status.c — ddp-status: asks a running libddp job how each rank is, through its store.
 *
 *     cc -std=c99 -O2 -Wall -Wextra -Wpedantic -Werror tools/ddp_status.c -o build/ddp-status -pthread
 *     build/ddp-status 127.0.0.1:29500            (the job's store; DDP_JOB_SECRET as the ranks')
 *
 * `ddp-status --help` is the manual; this comment records why things are the way they are.
 *
 * WHERE THE ANSWERS COME FROM. Each rank's health thread writes one STATUS line to the store
 * every period (P/health/s/<rank>: its position, a tick that grows every period, what it hears
 * from its two ring neighbours), rank 0 the STRAGGLER line (P/health/straggler) and the job's
 * prefix and size (ddp-status/current). ddp-status only reads: it is a client of the store like
 * any rank, needs the job secret like any rank, and writes nothing, so asking never disturbs the
 * job. It builds only libddp's store (as ddprun does), not ddp.h.
 *
 * DEAD, STUCK OR BUSY. A line alone cannot say whether its rank is alive: a stopped process
 * leaves its last line behind. So every line is read twice, --wait-ms apart at least (default
 * 1000: two of the default 500 ms periods), and a rank whose tick moved is answering. To answer
 * soon, ranks are read again every 100 ms until each tick has moved or been watched for the
 * whole wait; a job whose ranks all answer is told in about one period. A tick that stays put
 * for two of that rank's periods means its health thread did not run: the process is stopped,
 * hung or gone ("not answering"); the neighbours' lines then tell how long ago it was last heard
 * and whether its link is silent (stopped), unreachable (host or link gone) or closed (exited).
 * A tick watched for less than two of its periods is "not seen to tick", not a verdict.
 *
 * SPEED. Two round trips per rank and reading (check, then get: a get of a missing key would
 * wait for it), one connection: a world of 1,024 costs ~2,000 round trips per pass, milliseconds
 * on a store that answers (tests/test_ddp_status.c checks 1,024 ranks within 2 s).
 *
 * READING WHAT OTHERS WROTE. Every line is untrusted text: at most 4 KiB is read, a line must be
 * one line of printable characters with the keys v, rank (its own), tick and state, numbers must
 * be whole numbers; anything else is "unreadable status" with the reason, never a crash. Unknown
 * keys are ignored (shown in --json). What is printed is printable ASCII only.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define DDP_STATIC
#define DDP_STORE_IMPLEMENTATION
#include "../ddp_store.h"

#if defined(__GNUC__) || defined(__clang__)
#define PRINTF_LIKE(a, b) __attribute__((format(printf, a, b)))
#else
#define PRINTF_LIKE(a, b)
#endif

enum { EXIT_ANSWERING = 0, EXIT_FOUND = 1, EXIT_CANNOT_ASK = 2 };
#define LINE_CAP 4096          /* a STATUS line is < 2 KiB; longer is unreadable */
#define POLL_MS 100            /* between passes over the ranks not yet seen to tick */
#define MAX_WORLD 65536        /* libddp's largest world */
#define CONDENSE_ABOVE 32      /* larger worlds: one line per group of ranks in the same state */
#define MAX_VIEWS 4            /* neighbours' reports about one rank (2, both sides when n == 2) */

#define USAGE "usage: ddp-status [HOST:PORT] [--prefix P] [--size N] [--json] [--all] [--wait-ms N] " \
              "[--timeout-ms N] [--c10d]   (ddp-status --help for the manual)"

static const char *const HELP =
    USAGE "\n\n"
    "Asks a running libddp job how each of its ranks is: one line per rank (where it is: in which\n"
    "call and for how long, waiting on whom, or in user code since when; what its ring\n"
    "neighbours hear from it; whether it answers), then one verdict line. Needs the ranks'\n"
    "health threads (on unless DDP_HEALTH=0). It only reads the job's store.\n"
    "\n"
    "    HOST:PORT          the job's store: ddprun's (DDP_LAUNCHER_STORE in a rank's environment)\n"
    "                       or rank 0's (MASTER_ADDR:MASTER_PORT). Default: DDP_LAUNCHER_STORE,\n"
    "                       else MASTER_ADDR:MASTER_PORT, from this environment. [v6addr]:port too.\n"
    "    DDP_JOB_SECRET     the job's secret, as the ranks have it (ddprun passes its own to the\n"
    "                       ranks: export one before starting ddprun, or take a rank's).\n"
    "    --prefix P         the communicator's key prefix (default: the newest job's, from the\n"
    "                       store's ddp-status/current key); --size N its world size (default:\n"
    "                       from that key, or from rank 0's line)\n"
    "    --json             one JSON object instead: store, prefix, size, elapsed_ms, ranks (every\n"
    "                       field of each rank's line, answering true/false/null), straggler,\n"
    "                       verdict, exit\n"
    "    --all              one line per rank at any world size (default: above 32 ranks, one\n"
    "                       line per group of ranks in the same state, and every rank in trouble)\n"
    "    --wait-ms N        watch each rank's tick this long at most (default 1000: two of the\n"
    "                       default periods; a rank not seen to tick over two of its periods is\n"
    "                       not answering)\n"
    "    --timeout-ms N     give up on the store after this long (default 5000)\n"
    "    --c10d             the store is PyTorch's c10d TCPStore (torchrun's agent store)\n"
    "    -h, --help; -V, --version\n"
    "\n"
    "Exit status: 0 every rank answers and none failed; 1 something is wrong (a rank not\n"
    "answering, unreachable, failed, or without a readable status); 2 the job could not be asked\n"
    "(the store did not answer, refused the secret, or has no job's status; a usage error).\n";

/* ---------------------------------------------------------------- small things */
static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void sleep_s(double s) {
    struct timespec ts;
    if (s <= 0) return;
    ts.tv_sec = (time_t)s;
    ts.tv_nsec = (long)((s - (double)ts.tv_sec) * 1e9);
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {}
}

/* A growing string: what is printed is built here first. */
typedef struct { char *p; size_t len, cap; } sb_t;

PRINTF_LIKE(2, 3) static void sb_printf(sb_t *b, const char *fmt, ...) {
    va_list ap;
    int n;
    for (;;) {
        size_t room = b->cap - b->len;
        va_start(ap, fmt);
        n = vsnprintf(b->p ? b->p + b->len : NULL, b->p ? room : 0, fmt, ap);
        va_end(ap);
        if (n < 0) return;
        if (b->p && (size_t)n < room) { b->len += (size_t)n; return; }
        {
            size_t cap = (b->cap ? b->cap * 2 : 256) + (size_t)n;
            char *q = (char *)realloc(b->p, cap);
            if (!q) { fputs("ddp-status: out of memory\n", stderr); exit(EXIT_CANNOT_ASK); }
            b->p = q;
            b->cap = cap;
        }
    }
}

/* Printable ASCII only: a line from the store may hold anything. */
static void sb_clean(sb_t *b, const char *s, size_t n) {
    size_t i;
    for (i = 0; i < n && s[i]; i++) {
        char c = s[i];
        sb_printf(b, "%c", (c >= 0x20 && c < 0x7f) ? c : '?');
    }
}

static void sb_json_str(sb_t *b, const char *s, size_t n) {
    size_t i;
    sb_printf(b, "\"");
    for (i = 0; i < n && s[i]; i++) {
        char c = s[i];
        if (c == '"' || c == '\\') sb_printf(b, "\\%c", c);
        else if (c >= 0x20 && c < 0x7f) sb_printf(b, "%c", c);
        else sb_printf(b, "?");
    }
    sb_printf(b, "\"");
}

/* 12 ms, 7.0 s */
static void sb_ms(sb_t *b, long long ms) {
    if (ms < 0) sb_printf(b, "never");
    else if (ms < 1000) sb_printf(b, "%lld ms", ms);
    else sb_printf(b, "%.1f s", (double)ms / 1000.0);
}

/* 1,024 */
static void sb_count(sb_t *b, long long v) {
    if (v < 0) { sb_printf(b, "-"); v = -v; }
    if (v >= 1000) { sb_count(b, v / 1000); sb_printf(b, ",%03lld", v % 1000); }
    else sb_printf(b, "%lld", v);
}

static void sb_bytes(sb_t *b, long long v) {
    const char *unit[] = {"KiB", "MiB", "GiB", "TiB"};
    double x = (double)v;
    int u = -1;
    while (x >= 1024.0 && u < 3) { x /= 1024.0; u++; }
    if (u < 0) sb_printf(b, "%lld B", v);
    else sb_printf(b, "%.1f %s", x, unit[u]);
}

/* "0, 1, 3" or "0-1021, 1023": runs of three or more as ranges. */
static void sb_ranks(sb_t *b, const int *r, int n) {
    int i = 0, first = 1;
    while (i < n) {
        int j = i;
        while (j + 1 < n && r[j + 1] == r[j] + 1) j++;
        if (j - i >= 2) { sb_printf(b, "%s%d-%d", first ? "" : ", ", r[i], r[j]); i = j + 1; }
        else { sb_printf(b, "%s%d", first ? "" : ", ", r[i]); i++; }
        first = 0;
    }
}

/* "rank 2" or "ranks 0, 1, 3" */
static void sb_who(sb_t *b, const int *r, int n) {
    sb_printf(b, n == 1 ? "rank " : "ranks ");
    sb_ranks(b, r, n);
}

/* ---------------------------------------------------------------- reading key=value lines */
/* The value of `key` in a line of space-separated key=value pairs ("error=" takes the rest of
 * the line): a pointer into the line and its length, or NULL. */
static const char *kv_find(const char *line, const char *key, size_t *vlen) {
    size_t klen = strlen(key);
    const char *p = line;
    while (*p) {
        const char *tok, *end;
        while (*p == ' ') p++;
        if (!*p) break;
        tok = p;
        if (!strncmp(tok, "error=", 6)) end = tok + strlen(tok);
        else { end = strchr(tok, ' '); if (!end) end = tok + strlen(tok); }
        if ((size_t)(end - tok) > klen && !strncmp(tok, key, klen) && tok[klen] == '=') {
            *vlen = (size_t)(end - tok) - klen - 1;
            return tok + klen + 1;
        }
        p = end;
    }
    return NULL;
}

/* A whole number: 1 found and valid, 0 absent, -1 present but not a number. */
static int kv_int(const char *line, const char *key, long long *out) {
    size_t n;
    const char *v = kv_find(line, key, &n);
    char buf[32], *end;
    long long x;
    if (!v) return 0;
    if (n == 0 || n >= sizeof buf) return -1;
    memcpy(buf, v, n);
    buf[n] = 0;
    errno = 0;
    x = strtoll(buf, &end, 10);
    if (errno || *end) return -1;
    *out = x;
    return 1;
}

/* A word (no spaces) into out; "" when absent; -1 when too long for out. */
static int kv_word(const char *line, const char *key, char *out, size_t cap) {
    size_t n;
    const char *v = kv_find(line, key, &n);
    out[0] = 0;
    if (!v) return 0;
    if (n >= cap) return -1;
    memcpy(out, v, n);
    out[n] = 0;
    return 1;
}

/* ---------------------------------------------------------------- a rank's status */
typedef struct { int from; char state[16]; long long ms; } view_t;

typedef struct {
    int have;                 /* 0: no key; 1: readable; -1: unreadable (why) */
    char line[LINE_CAP];
    char why[96];
    /* the STATUS line's fields (-1: absent) */
    long long v, size, pid, tick, period_ms, hb_timeout_ms, seq, bytes, for_ms, peer;
    long long left, left_ms, right, right_ms, calls, errors;
    char host[64], state[16], kind[24], left_state[16], right_state[16];
    const char *error;        /* into line, or NULL */
    /* watching the tick */
    long long tick0;
    double t0, tlast;         /* first and last read that had a readable line */
    int ticked;               /* the tick moved between reads */
    int answering;            /* 1 yes, 0 no (tick still for 2 periods), -1 not known */
    view_t views[MAX_VIEWS];  /* what its neighbours report of it */
    int nviews;
} rank_t;

static int st_is(const rank_t *r, const char *s) { return r->have == 1 && !strcmp(r->state, s); }

/* Parses r->line (len bytes as read, full length `full`) for rank k; sets have and why. */
static void status_parse(rank_t *r, int k, size_t len, size_t full) {
    static const char *const ints[] = {"v", "size", "pid", "tick", "period_ms", "hb_timeout_ms", "seq",
                                       "bytes", "for_ms", "peer", "left", "left_ms", "right", "right_ms",
                                       "calls", "errors"};
    long long *const dst[] = {&r->v, &r->size, &r->pid, &r->tick, &r->period_ms, &r->hb_timeout_ms,
                              &r->seq, &r->bytes, &r->for_ms, &r->peer, &r->left, &r->left_ms,
                              &r->right, &r->right_ms, &r->calls, &r->errors};
    long long rank = -1;
    size_t i;
    r->have = -1;
    r->error = NULL;
    if (full >= LINE_CAP) { snprintf(r->why, sizeof r->why, "%zu bytes, longer than a status line", full); return; }
    r->line[len] = 0;
    if (len && r->line[len - 1] == '\n') r->line[--len] = 0;
    for (i = 0; i < len; i++) {
        unsigned char c = (unsigned char)r->line[i];
        if (c < 0x20 || c == 0x7f) {
            snprintf(r->why, sizeof r->why, "byte 0x%02x at offset %zu: not one line of text", c, i);
            return;
        }
    }
    for (i = 0; i < sizeof ints / sizeof ints[0]; i++) {
        *dst[i] = -1;
        if (kv_int(r->line, ints[i], dst[i]) < 0) {
            snprintf(r->why, sizeof r->why, "%s= is not a whole number", ints[i]);
            return;
        }
    }
    if (kv_int(r->line, "rank", &rank) <= 0 || rank != k) {
        snprintf(r->why, sizeof r->why, "no rank=%d in it", k);
        return;
    }
    if (r->v < 1 || r->tick < 0) { snprintf(r->why, sizeof r->why, "no v= or tick= in it"); return; }
    if (kv_word(r->line, "state", r->state, sizeof r->state) <= 0) {
        snprintf(r->why, sizeof r->why, "no state= in it");
        return;
    }
    if (kv_word(r->line, "host", r->host, sizeof r->host) < 0) strcpy(r->host, "?");
    if (kv_word(r->line, "kind", r->kind, sizeof r->kind) < 0) strcpy(r->kind, "?");
    if (kv_word(r->line, "left_state", r->left_state, sizeof r->left_state) < 0) strcpy(r->left_state, "?");
    if (kv_word(r->line, "right_state", r->right_state, sizeof r->right_state) < 0) strcpy(r->right_state, "?");
    {
        size_t n;
        r->error = kv_find(r->line, "error", &n);
    }
    if (r->peer < -1) r->peer = -1;
    r->have = 1;
}

/* ---------------------------------------------------------------- the job */
typedef struct {
    char host[256];
    int port, c10d, json, all, wait_ms, timeout_ms, size;
    char prefix[DDP_STORE_MAX_KEY / 2];
    ddp_store_t *st;
    rank_t *r;
    char strag[LINE_CAP];     /* the STRAGGLER line ("" if none) */
    double t_start;
} job_t;

PRINTF_LIKE(2, 3) static void cannot_ask(const job_t *j, const char *fmt, ...) {
    char msg[2048], addr[300];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(stderr, "ddp-status: %s\n", msg);
    if (j && j->json) {   /* a machine reading stdout gets the same, as JSON */
        sb_t b = {0, 0, 0};
        snprintf(addr, sizeof addr, "%s:%d", j->host, j->port);
        sb_printf(&b, "{\"store\":");
        sb_json_str(&b, addr, strlen(addr));
        sb_printf(&b, ",\"error\":");
        sb_json_str(&b, msg, strlen(msg));
        sb_printf(&b, ",\"exit\":%d}\n", EXIT_CANNOT_ASK);
        fwrite(b.p, 1, b.len, stdout);
        free(b.p);
    }
    exit(EXIT_CANNOT_ASK);
}

static void store_lost(const job_t *j, ddp_result_t r) {
    cannot_ask(j, "the store at %s:%d stopped answering: %s (%s). When rank 0 serves the store (no ddprun), "
               "a stopped or hung rank 0 stops its store too: look at rank 0's process.",
               j->host, j->port, ddp_strerror(r), ddp_store_last_error(j->st));
}

/* 1: read (len: bytes copied, full: its length); 0: no such key. A store error ends the run. */
static int read_key(const job_t *j, const char *key, char *buf, size_t cap, size_t *len, size_t *full) {
    int exists = 0;
    ddp_result_t r = ddp_store_check(j->st, key, &exists);
    if (r == DDP_SUCCESS && exists) r = ddp_store_get(j->st, key, buf, cap - 1, full);
    if (r != DDP_SUCCESS) store_lost(j, r);
    if (!exists) return 0;
    *len = *full < cap - 1 ? *full : cap - 1;
    buf[*len] = 0;
    return 1;
}

static void read_rank(job_t *j, int k) {
    rank_t *r = &j->r[k];
    char key[DDP_STORE_MAX_KEY];
    size_t len = 0, full = 0;
    int had = r->have == 1;
    snprintf(key, sizeof key, "%s/health/s/%d", j->prefix, k);
    if (!read_key(j, key, r->line, sizeof r->line, &len, &full)) {
        if (!had) r->have = 0;
        return;   /* a line that was there and is gone (communicator destroyed): keep the last */
    }
    status_parse(r, k, len, full);
    if (r->have != 1) return;
    if (!had || r->t0 == 0) { r->tick0 = r->tick; r->t0 = now_s(); }
    else if (r->tick != r->tick0) r->ticked = 1;
    r->tlast = now_s();
}

static void open_store(job_t *j) {
    ddp_store_desc_t d;
    char err[512] = "";
    ddp_result_t r;
    memset(&d, 0, sizeof d);
    d.timeout_ms = j->timeout_ms;
    d.log_level = 1;   /* none: what went wrong is said below, once */
    r = j->c10d ? _ddp_store_connect_c10d(&j->st, j->host, j->port, &d, err, sizeof err)
                : _ddp_store_open(&j->st, j->host, j->port, 0, &d, err, sizeof err);
    if (r == DDP_ERR_AUTH)
        cannot_ask(j, "the store at %s:%d refused us: %s (set DDP_JOB_SECRET to the job's secret, as its "
                   "ranks have it)", j->host, j->port, err);
    if (r != DDP_SUCCESS)
        cannot_ask(j, "the store at %s:%d did not answer within %.1f s: %s (%s). Is the job running, and is this "
                   "its store (ddprun's DDP_LAUNCHER_STORE, else MASTER_ADDR:MASTER_PORT)? When rank 0 serves "
                   "the store (no ddprun), a stopped or hung rank 0 stops its store too: look at rank 0's "
                   "process.", j->host, j->port, j->timeout_ms / 1000.0, ddp_strerror(r), err);
}

/* The prefix and size: --prefix/--size, else ddp-status/current, else rank 0's line. */
static void find_job(job_t *j) {
    char buf[LINE_CAP], p[sizeof j->prefix];
    size_t len, full;
    long long n;
    if (!j->prefix[0]) {
        char *sp, *end;
        if (!read_key(j, "ddp-status/current", buf, sizeof buf, &len, &full))
            cannot_ask(j, "the store at %s:%d has no job's status (no ddp-status/current key): the job's health "
                       "threads are off (DDP_HEALTH=0) or not started yet, or this is another store",
                       j->host, j->port);
        sp = strchr(buf, ' ');
        if (!sp || full >= sizeof buf || (size_t)(sp - buf) >= sizeof p || sp == buf)
            cannot_ask(j, "the store's ddp-status/current is not \"<prefix> <size>\"");
        memcpy(p, buf, (size_t)(sp - buf));
        p[sp - buf] = 0;
        for (len = 0; p[len]; len++)
            if ((unsigned char)p[len] <= 0x20 || p[len] == 0x7f)
                cannot_ask(j, "the store's ddp-status/current is not \"<prefix> <size>\"");
        errno = 0;
        n = strtoll(sp + 1, &end, 10);
        if (errno || (*end && *end != '\n') || n < 1 || n > MAX_WORLD)
            cannot_ask(j, "the store's ddp-status/current is not \"<prefix> <size>\"");
        memcpy(j->prefix, p, sizeof p);
        if (!j->size) j->size = (int)n;
    }
    if (!j->size) {
        rank_t r0;
        char key[DDP_STORE_MAX_KEY];
        memset(&r0, 0, sizeof r0);
        snprintf(key, sizeof key, "%s/health/s/0", j->prefix);
        if (!read_key(j, key, r0.line, sizeof r0.line, &len, &full))
            cannot_ask(j, "no status of rank 0 under %s/ in the store at %s:%d (give --size N)", j->prefix, j->host,
                       j->port);
        status_parse(&r0, 0, len, full);
        if (r0.have != 1 || r0.size < 1 || r0.size > MAX_WORLD)
            cannot_ask(j, "rank 0's status under %s/ says no world size (give --size N)", j->prefix);
        j->size = (int)r0.size;
    }
}

/* Reads every rank, then again those not yet seen to tick, every POLL_MS, until each ticked or
 * was watched for wait_ms. */
static void watch(job_t *j) {
    int k, n = j->size;
    const double wait = j->wait_ms / 1000.0;
    for (k = 0; k < n; k++) read_rank(j, k);
    for (;;) {
        double t = now_s(), next = t + POLL_MS / 1000.0;
        int left = 0;
        for (k = 0; k < n; k++) {
            const rank_t *r = &j->r[k];
            double since = r->have == 1 ? r->t0 : j->t_start;
            if (r->have >= 0 && !r->ticked && t - since < wait) {
                left = 1;
                if (since + wait < next) next = since + wait;
            }
        }
        if (!left) break;
        sleep_s(next - now_s());
        for (k = 0; k < n; k++) {
            const rank_t *r = &j->r[k];
            if (r->have >= 0 && !r->ticked) read_rank(j, k);
        }
    }
    for (k = 0; k < n; k++) {
        rank_t *r = &j->r[k];
        long long period = r->period_ms > 0 ? r->period_ms : 500;
        r->answering = -1;
        if (r->have != 1) continue;
        if (r->ticked) r->answering = 1;
        else if ((r->tlast - r->t0) * 1000.0 >= 2.0 * (double)period) r->answering = 0;
    }
}

/* What each rank's neighbours say of it. */
static void gather_views(job_t *j) {
    int k;
    for (k = 0; k < j->size; k++) {
        const rank_t *r = &j->r[k];
        int side;
        if (r->have != 1) continue;
        for (side = 0; side < 2; side++) {
            long long to = side ? r->right : r->left;
            rank_t *t;
            view_t *v;
            if (to < 0 || to >= j->size || to == k) continue;
            t = &j->r[to];
            /* n == 2: both sides are one rank, one link: say it once */
            if (t->nviews == MAX_VIEWS || (t->nviews && t->views[t->nviews - 1].from == k)) continue;
            v = &t->views[t->nviews++];
            v->from = k;
            strcpy(v->state, side ? r->right_state : r->left_state);
            v->ms = side ? r->right_ms : r->left_ms;
        }
    }
}

static void read_straggler(job_t *j) {
    char key[DDP_STORE_MAX_KEY];
    size_t len, full, i;
    snprintf(key, sizeof key, "%s/health/straggler", j->prefix);
    if (!read_key(j, key, j->strag, sizeof j->strag, &len, &full) || full >= sizeof j->strag) {
        j->strag[0] = 0;
        return;
    }
    for (i = 0; i < len; i++)
        if ((unsigned char)j->strag[i] < 0x20 || j->strag[i] == 0x7f) { j->strag[i] = 0; break; }
}

/* ---------------------------------------------------------------- telling it */
/* "in all_reduce #1234 (4.0 KiB) for 12.0 s, waiting on rank 3" and the like: with P_TIMES how
 * long and on whom, P_DETAIL the bytes and the call before user code. */
enum { P_TIMES = 1, P_DETAIL = 2 };
static void sb_position(sb_t *b, const rank_t *r, int flags) {
    const int brief = !(flags & P_TIMES);
    if (st_is(r, "call")) {
        sb_printf(b, "in ");
        sb_clean(b, r->kind, sizeof r->kind);
        sb_printf(b, " #%lld", r->seq);
        if ((flags & P_DETAIL) && r->bytes >= 0) { sb_printf(b, " ("); sb_bytes(b, r->bytes); sb_printf(b, ")"); }
        if (!brief) {
            sb_printf(b, " for ");
            sb_ms(b, r->for_ms);
            if (r->peer >= 0) sb_printf(b, ", waiting on rank %lld", r->peer);
        }
    } else if (st_is(r, "user")) {
        sb_printf(b, "in user code");
        if (!brief) { sb_printf(b, " since "); sb_ms(b, r->for_ms); }
        if ((flags & P_DETAIL) && r->seq >= 0) sb_printf(b, " (after #%lld)", r->seq);
    } else if (st_is(r, "idle")) {
        sb_printf(b, "idle, no call yet");
        if (!brief) { sb_printf(b, " (init "); sb_ms(b, r->for_ms); sb_printf(b, " ago)"); }
    } else if (st_is(r, "failed")) {
        sb_printf(b, "failed");
        if (!brief) {
            sb_printf(b, ": ");
            if (r->error) sb_clean(b, r->error, strlen(r->error));
            else sb_printf(b, "(no error text)");
        }
    } else {
        sb_printf(b, "in state ");
        sb_clean(b, r->state, sizeof r->state);
    }
}

static void sb_views(sb_t *b, const rank_t *r) {
    int i;
    if (!r->nviews) return;
    sb_printf(b, "; heartbeat seen by ");
    for (i = 0; i < r->nviews; i++) {
        const view_t *v = &r->views[i];
        sb_printf(b, "%srank %d ", i ? ", " : "", v->from);
        sb_ms(b, v->ms);
        if (v->ms >= 0) sb_printf(b, " ago");
        if (strcmp(v->state, "ok")) { sb_printf(b, " ("); sb_clean(b, v->state, sizeof v->state); sb_printf(b, ")"); }
    }
}

static void sb_answer(sb_t *b, const rank_t *r) {
    double watched = r->tlast - r->t0;
    if (r->answering == 1) sb_printf(b, "; answering");
    else if (r->answering == 0)
        sb_printf(b, "; NOT ANSWERING (tick %lld unchanged for %.1f s)", r->tick, watched);
    else
        sb_printf(b, "; not seen to tick in %.1f s, under two of its periods (ask again with --wait-ms %lld)",
                  watched, 2 * (r->period_ms > 0 ? r->period_ms : 500) + 100);
}

static void rank_line(sb_t *b, const job_t *j, int k) {
    const rank_t *r = &j->r[k];
    sb_printf(b, "rank %d", k);
    if (r->have == 0) { sb_printf(b, ": no status (no health thread: DDP_HEALTH=0, not started, or gone)\n"); return; }
    if (r->have < 0) { sb_printf(b, ": unreadable status (%s)\n", r->why); return; }
    sb_printf(b, " (");
    sb_clean(b, r->host[0] ? r->host : "?", sizeof r->host);
    if (r->pid >= 0) sb_printf(b, " pid %lld", r->pid);
    sb_printf(b, "): ");
    sb_position(b, r, P_TIMES | P_DETAIL);
    sb_views(b, r);
    sb_answer(b, r);
    sb_printf(b, "\n");
}

static int in_trouble(const rank_t *r) {
    int i;
    if (r->have != 1 || r->answering != 1 || st_is(r, "failed")) return 1;
    for (i = 0; i < r->nviews; i++)
        if (strcmp(r->views[i].state, "ok") && strcmp(r->views[i].state, "connecting")) return 1;
    return 0;
}

/* A rank's state without its times: ranks with the same one share a line when condensed. */
static char *state_key(const rank_t *r) {
    sb_t k = {0, 0, 0};
    if (r->have != 1) sb_printf(&k, "%s", r->have ? "unreadable status" : "no status");
    else {
        sb_position(&k, r, 0);
        sb_printf(&k, "%s", r->answering == 1 ? "; answering" : r->answering ? "; not seen to tick" : "; NOT ANSWERING");
    }
    return k.p;
}

/* Large worlds: ranks in the same state on one line ("ranks 0-1022: in all_reduce #5 for
 * 0.1 s to 0.4 s; answering"), then every rank in trouble on its own line (at most 16; a group
 * whose ranks all have their own line is not said twice). */
static void condensed(sb_t *b, const job_t *j) {
    int n = j->size, k, i, shown = 0;
    int *ranks = (int *)malloc(sizeof(int) * (size_t)n);
    char **keys = (char **)calloc((size_t)n, sizeof(char *)), *done = (char *)calloc((size_t)n, 1);
    char *solo = (char *)calloc((size_t)n, 1);
    if (!ranks || !keys || !done || !solo) { fputs("ddp-status: out of memory\n", stderr); exit(EXIT_CANNOT_ASK); }
    for (k = 0; k < n && shown < 16; k++)
        if (in_trouble(&j->r[k])) { solo[k] = 1; shown++; }
    for (k = 0; k < n; k++)
        if (!(keys[k] = state_key(&j->r[k]))) { fputs("ddp-status: out of memory\n", stderr); exit(EXIT_CANNOT_ASK); }
    for (k = 0; k < n; k++) {
        const rank_t *r = &j->r[k];
        long long lo = r->for_ms, hi = r->for_ms;
        int m = 0, nsolo = 0;
        if (done[k]) continue;
        for (i = k; i < n; i++) {
            if (done[i] || strcmp(keys[i], keys[k])) continue;
            done[i] = 1;
            ranks[m++] = i;
            nsolo += solo[i];
            if (j->r[i].for_ms < lo) lo = j->r[i].for_ms;
            if (j->r[i].for_ms > hi) hi = j->r[i].for_ms;
        }
        if (nsolo == m) continue;
        sb_who(b, ranks, m);
        sb_printf(b, ": ");
        if (st_is(r, "call") || st_is(r, "user")) {
            const char *semi = strchr(keys[k], ';');
            sb_printf(b, "%.*s %s ", (int)(semi - keys[k]), keys[k], st_is(r, "call") ? "for" : "since");
            sb_ms(b, lo);
            if (hi != lo) { sb_printf(b, " to "); sb_ms(b, hi); }
            sb_printf(b, "%s\n", semi);
        } else sb_printf(b, "%s\n", keys[k]);
    }
    for (k = 0; k < n; k++)
        if (solo[k]) rank_line(b, j, k);
    for (k = 0; k < n; k++) free(keys[k]);
    free(solo);
    free(keys);
    free(ranks);
    free(done);
}

/* ---------------------------------------------------------------- the verdict */
typedef struct { int *r; int n; } set_t;

static void set_add(set_t *s, int k) { s->r[s->n++] = k; }

/* The ranks in the call most ranks that are in a call are in (kind and seq), answering. */
static void biggest_call(const job_t *j, set_t *out, const rank_t **which) {
    int k, i, best = 0;
    *which = NULL;
    out->n = 0;
    for (k = 0; k < j->size; k++) {
        const rank_t *r = &j->r[k];
        int m = 0;
        if (!st_is(r, "call") || r->answering != 1) continue;
        for (i = 0; i < j->size; i++) {
            const rank_t *q = &j->r[i];
            if (st_is(q, "call") && q->answering == 1 && q->seq == r->seq && !strcmp(q->kind, r->kind)) m++;
        }
        if (m > best || (m == best && *which && r->seq > (*which)->seq)) { best = m; *which = r; }
    }
    if (!*which) return;
    for (k = 0; k < j->size; k++) {
        const rank_t *q = &j->r[k];
        if (st_is(q, "call") && q->answering == 1 && q->seq == (*which)->seq && !strcmp(q->kind, (*which)->kind))
            set_add(out, k);
    }
}

static void sb_waiters(sb_t *b, const set_t *w, const rank_t *call, int nfor) {
    if (!w->n || !call) return;
    sb_printf(b, "; ");
    sb_who(b, w->r, w->n);
    sb_printf(b, " wait%s for %s in ", w->n == 1 ? "s" : "", nfor == 1 ? "it" : "them");
    sb_clean(b, call->kind, sizeof call->kind);
    sb_printf(b, " #%lld", call->seq);
}

/* "rank 2 is not answering (last heartbeat 7.0 s ago, seen by ranks 1 and 3)", or unreachable,
 * or closed, from its neighbours' reports. */
static void sb_silent_rank(sb_t *b, const rank_t *r, int k) {
    int i, unreach = -1, closed = -1;
    long long last = -1;
    for (i = 0; i < r->nviews; i++) {
        const view_t *v = &r->views[i];
        if (!strcmp(v->state, "unreachable") && unreach < 0) unreach = i;
        if (!strcmp(v->state, "closed") && closed < 0) closed = i;
        if (v->ms >= 0 && (last < 0 || v->ms < last)) last = v->ms;
    }
    if (unreach >= 0) sb_printf(b, "rank %d is unreachable (rank %d has had nothing acknowledged for ", k,
                                r->views[unreach].from);
    else if (closed >= 0) sb_printf(b, "rank %d closed its links: exited or destroyed its communicator (", k);
    else sb_printf(b, "rank %d is not answering (", k);
    if (unreach >= 0) { sb_ms(b, r->views[unreach].ms); sb_printf(b, ")"); return; }
    if (!r->nviews) { sb_printf(b, "its tick stopped; no neighbour reports on it)"); return; }
    sb_printf(b, "last heartbeat ");
    sb_ms(b, last);
    if (last >= 0) sb_printf(b, " ago");
    {
        int from[MAX_VIEWS], m = 0;
        for (i = 0; i < r->nviews; i++)
            if (!m || from[m - 1] != r->views[i].from) from[m++] = r->views[i].from;
        sb_printf(b, ", seen by rank%s ", m > 1 ? "s" : "");
        for (i = 0; i < m; i++) sb_printf(b, "%s%d", i == 0 ? "" : i == m - 1 ? " and " : ", ", from[i]);
    }
    sb_printf(b, ")");
}

/* The straggler clause from P/health/straggler, or nothing. */
static void sb_straggler(sb_t *b, const job_t *j) {
    long long window = -1, last = -1, count = -1, lag = -1;
    char share[32];
    if (!j->strag[0] || kv_int(j->strag, "last_rank", &last) <= 0 || last < 0 || last >= j->size) return;
    if (kv_int(j->strag, "window", &window) <= 0 || window <= 0) return;
    kv_int(j->strag, "last_count", &count);
    kv_int(j->strag, "median_lag_us", &lag);
    sb_printf(b, "; slowest to arrive in the last ");
    sb_count(b, window);
    sb_printf(b, " calls: rank %lld", last);
    if (count >= 0) {
        sb_printf(b, " (");
        sb_count(b, count);
        sb_printf(b, " of ");
        sb_count(b, window);
        if (lag >= 0) { sb_printf(b, ", a median "); sb_ms(b, lag / 1000); sb_printf(b, " after the others"); }
        if (kv_word(j->strag, "share", share, sizeof share) > 0) {
            double s = strtod(share, NULL);
            if (s > 0 && s < 1000) sb_printf(b, ", %.0f%% of the time between calls", s * 100.0);
        }
        sb_printf(b, ")");
    }
}

/* The ranks sorted by what the verdict says of them. */
typedef struct {
    set_t failed, silent, missing, unreadable, unsure, waiters;
    const rank_t *call;       /* the call the waiters are in */
    int *mem;
} sorted_t;

static void sort_ranks(const job_t *j, sorted_t *s) {
    int n = j->size, k;
    s->mem = (int *)malloc(sizeof(int) * (size_t)n * 6);
    if (!s->mem) { fputs("ddp-status: out of memory\n", stderr); exit(EXIT_CANNOT_ASK); }
    s->failed.r = s->mem; s->silent.r = s->mem + n; s->missing.r = s->mem + 2 * n;
    s->unreadable.r = s->mem + 3 * n; s->unsure.r = s->mem + 4 * n; s->waiters.r = s->mem + 5 * n;
    s->failed.n = s->silent.n = s->missing.n = s->unreadable.n = s->unsure.n = s->waiters.n = 0;
    for (k = 0; k < n; k++) {
        const rank_t *r = &j->r[k];
        if (r->have == 0) set_add(&s->missing, k);
        else if (r->have < 0) set_add(&s->unreadable, k);
        else if (r->answering == 0) set_add(&s->silent, k);
        else if (r->answering < 0) set_add(&s->unsure, k);
        else if (st_is(r, "failed")) set_add(&s->failed, k);
    }
    biggest_call(j, &s->waiters, &s->call);
}

/* "; " between clauses of the verdict (it starts at `start`). */
static void sb_next(sb_t *b, size_t start) { if (b->len > start) sb_printf(b, "; "); }

/* What is wrong: ranks not answering (and who waits for them), failed, cut off from a
 * neighbour, without a readable status, not seen to tick. Nothing when all is well. */
static void verdict_trouble(sb_t *b, const job_t *j, const sorted_t *s, size_t start) {
    int k, i;
    for (i = 0; i < s->silent.n; i++) {
        sb_next(b, start);
        sb_silent_rank(b, &j->r[s->silent.r[i]], s->silent.r[i]);
    }
    if (s->silent.n) sb_waiters(b, &s->waiters, s->call, s->silent.n);
    for (i = 0; i < s->failed.n; i++) {
        const rank_t *r = &j->r[s->failed.r[i]];
        sb_next(b, start);
        sb_printf(b, "rank %d failed: ", s->failed.r[i]);
        if (r->error) sb_clean(b, r->error, strlen(r->error));
        else sb_printf(b, "(no error text)");
    }
    /* an answering rank a neighbour cannot reach: the link between them is gone */
    for (k = 0; k < j->size; k++) {
        const rank_t *r = &j->r[k];
        if (r->answering != 1) continue;
        for (i = 0; i < r->nviews; i++)
            if (!strcmp(r->views[i].state, "unreachable")) {
                sb_next(b, start);
                sb_printf(b, "rank %d cannot reach rank %d (nothing acknowledged for ", r->views[i].from, k);
                sb_ms(b, r->views[i].ms);
                sb_printf(b, "), though rank %d answers", k);
            }
    }
    if (s->missing.n) { sb_next(b, start); sb_who(b, s->missing.r, s->missing.n); sb_printf(b, ": no status"); }
    if (s->unreadable.n) {
        sb_next(b, start);
        sb_who(b, s->unreadable.r, s->unreadable.n);
        sb_printf(b, ": unreadable status");
    }
    if (s->unsure.n) {
        sb_next(b, start);
        sb_who(b, s->unsure.r, s->unsure.n);
        sb_printf(b, ": not seen to tick yet (ask again with a longer --wait-ms)");
    }
}

/* Every rank answers: where they are, and whom the ranks in a call wait for. */
static void verdict_answering(sb_t *b, const job_t *j, const sorted_t *s) {
    int n = j->size, k, i, nuser = 0, nidle = 0, nothers = 0;
    if (s->waiters.n && s->waiters.n < n) {
        char *in = (char *)calloc((size_t)n, 1);
        if (!in) { fputs("ddp-status: out of memory\n", stderr); exit(EXIT_CANNOT_ASK); }
        for (i = 0; i < s->waiters.n; i++) in[s->waiters.r[i]] = 1;
        for (k = 0; k < n; k++) {
            if (in[k]) continue;
            if (nothers++ >= 8) continue;
            sb_printf(b, "%srank %d is ", nothers > 1 ? "; " : "", k);
            sb_position(b, &j->r[k], P_TIMES);
            sb_printf(b, " (answering)");
        }
        if (nothers > 8) { sb_printf(b, "; and "); sb_count(b, nothers - 8); sb_printf(b, " more"); }
        sb_waiters(b, &s->waiters, s->call, nothers);
        free(in);
        return;
    }
    if (s->waiters.n == n) {
        long long longest = 0;
        for (k = 0; k < n; k++) if (j->r[k].for_ms > longest) longest = j->r[k].for_ms;
        sb_printf(b, "all ranks in ");
        sb_clean(b, s->call->kind, sizeof s->call->kind);
        sb_printf(b, " #%lld (for up to ", s->call->seq);
        sb_ms(b, longest);
        sb_printf(b, "), all answering");
        return;
    }
    for (k = 0; k < n; k++) {
        nuser += st_is(&j->r[k], "user");
        nidle += st_is(&j->r[k], "idle");
    }
    if (nuser + nidle == n)
        sb_printf(b, "all ranks %s", nidle == n ? "idle, no call yet" : nidle ? "in user code or idle" : "in user code");
    else sb_printf(b, "all ranks answering");
}

/* Builds the verdict line; returns the exit status. */
static int verdict(sb_t *b, const job_t *j) {
    sorted_t s;
    size_t start;
    int rc = EXIT_ANSWERING;
    sort_ranks(j, &s);
    sb_printf(b, "verdict: ");
    start = b->len;
    verdict_trouble(b, j, &s, start);
    if (b->len > start || s.failed.n) rc = EXIT_FOUND;
    else {
        long long warn = 0;
        verdict_answering(b, j, &s);
        /* beside ranks waiting for a busy one, who was last so far is noise unless it warns */
        if (j->strag[0]) kv_int(j->strag, "warn", &warn);
        if (warn == 1 || !b->p || !strstr(b->p + start, "wait for it")) sb_straggler(b, j);
    }
    sb_printf(b, "\n");
    free(s.mem);
    return rc;
}

/* ---------------------------------------------------------------- JSON */
/* -?(0|[1-9][0-9]*)(.[0-9]+)?: what JSON takes as a number. */
static int json_number(const char *v, size_t n) {
    size_t i = 0;
    if (i < n && v[i] == '-') i++;
    if (i >= n || v[i] < '0' || v[i] > '9') return 0;
    if (v[i] == '0') i++;
    else while (i < n && v[i] >= '0' && v[i] <= '9') i++;
    if (i < n && v[i] == '.') {
        size_t d = ++i;
        while (i < n && v[i] >= '0' && v[i] <= '9') i++;
        if (i == d) return 0;
    }
    return i == n && n < 24;
}

/* The fields ddp-status adds to a rank's object: a line's keys of these names are left out. */
static int json_ours(const char *k, size_t n) {
    static const char *const ours[] = {"rank", "status", "why", "answering", "tick_first", "watched_ms",
                                       "seen_by", "line"};
    size_t i;
    for (i = 0; i < sizeof ours / sizeof ours[0]; i++)
        if (strlen(ours[i]) == n && !strncmp(ours[i], k, n)) return 1;
    return 0;
}

/* Every key=value of a line: numbers as numbers, the rest as strings. */
static void json_fields(sb_t *b, const char *line) {
    const char *p = line;
    while (*p) {
        const char *tok, *eq, *end;
        size_t vn;
        while (*p == ' ') p++;
        if (!*p) break;
        tok = p;
        end = !strncmp(tok, "error=", 6) ? tok + strlen(tok) : strchr(tok, ' ');
        if (!end) end = tok + strlen(tok);
        p = end;
        eq = (const char *)memchr(tok, '=', (size_t)(end - tok));
        if (!eq || eq == tok || json_ours(tok, (size_t)(eq - tok))) continue;
        vn = (size_t)(end - eq - 1);
        sb_printf(b, ",");
        sb_json_str(b, tok, (size_t)(eq - tok));
        sb_printf(b, ":");
        if (json_number(eq + 1, vn) && strncmp(tok, "host=", 5) && strncmp(tok, "kind=", 5))
            sb_printf(b, "%.*s", (int)vn, eq + 1);
        else sb_json_str(b, eq + 1, vn);
    }
}

static void json_out(sb_t *b, const job_t *j, const char *verdict_line, int rc) {
    int k, i;
    sb_printf(b, "{\"store\":");
    {
        char a[300];
        snprintf(a, sizeof a, "%s:%d", j->host, j->port);
        sb_json_str(b, a, strlen(a));
    }
    sb_printf(b, ",\"prefix\":");
    sb_json_str(b, j->prefix, strlen(j->prefix));
    sb_printf(b, ",\"size\":%d,\"wait_ms\":%d,\"elapsed_ms\":%.0f,\"ranks\":[", j->size, j->wait_ms,
              (now_s() - j->t_start) * 1000.0);
    for (k = 0; k < j->size; k++) {
        const rank_t *r = &j->r[k];
        sb_printf(b, "%s\n{\"rank\":%d,\"status\":\"%s\"", k ? "," : "", k,
                  r->have == 1 ? "ok" : r->have ? "unreadable" : "missing");
        if (r->have < 0) { sb_printf(b, ",\"why\":"); sb_json_str(b, r->why, strlen(r->why)); }
        sb_printf(b, ",\"answering\":%s", r->answering == 1 ? "true" : r->answering == 0 ? "false" : "null");
        if (r->have == 1) {
            sb_printf(b, ",\"tick_first\":%lld,\"watched_ms\":%.0f", r->tick0, (r->tlast - r->t0) * 1000.0);
            json_fields(b, r->line);
            sb_printf(b, ",\"seen_by\":[");
            for (i = 0; i < r->nviews; i++) {
                sb_printf(b, "%s{\"rank\":%d,\"state\":", i ? "," : "", r->views[i].from);
                sb_json_str(b, r->views[i].state, strlen(r->views[i].state));
                sb_printf(b, ",\"ms\":%lld}", r->views[i].ms);
            }
            sb_printf(b, "]");
        }
        sb_printf(b, "}");
    }
    sb_printf(b, "],\n\"straggler\":");
    if (j->strag[0]) { sb_printf(b, "{\"line\":"); sb_json_str(b, j->strag, strlen(j->strag)); json_fields(b, j->strag); sb_printf(b, "}"); }
    else sb_printf(b, "null");
    sb_printf(b, ",\n\"verdict\":");
    {
        const char *v = verdict_line + strlen("verdict: ");
        sb_json_str(b, v, strcspn(v, "\n"));
    }
    sb_printf(b, ",\"exit\":%d}\n", rc);
}

/* ---------------------------------------------------------------- the command line */
static void usage_error(const char *fmt, const char *what) {
    fprintf(stderr, "ddp-status: ");
    fprintf(stderr, fmt, what);
    fprintf(stderr, "\n%s\n", USAGE);
    exit(EXIT_CANNOT_ASK);
}

static int number(const char *opt, const char *v, long lo, long hi) {
    char *end;
    long x;
    errno = 0;
    x = strtol(v, &end, 10);
    if (errno || !*v || *end || x < lo || x > hi) usage_error("%s: not a whole number in range", opt);
    return (int)x;
}

/* HOST:PORT or [V6]:PORT */
static void parse_addr(job_t *j, const char *a) {
    const char *colon = strrchr(a, ':');
    size_t hl;
    if (!colon || colon == a) usage_error("'%s' is not HOST:PORT", a);
    hl = (size_t)(colon - a);
    if (a[0] == '[' && hl >= 2 && a[hl - 1] == ']') { a++; hl -= 2; }
    if (hl == 0 || hl >= sizeof j->host) usage_error("'%s' is not HOST:PORT", a);
    memcpy(j->host, a, hl);
    j->host[hl] = 0;
    j->port = number("port", colon + 1, 1, 65535);
}

static void parse_args(job_t *j, int argc, char **argv) {
    enum { O_PREFIX = 256, O_SIZE, O_JSON, O_ALL, O_WAIT, O_TIMEOUT, O_C10D };
    static const struct option opts[] = {
        {"prefix", required_argument, NULL, O_PREFIX}, {"size", required_argument, NULL, O_SIZE},
        {"json", no_argument, NULL, O_JSON},           {"all", no_argument, NULL, O_ALL},
        {"wait-ms", required_argument, NULL, O_WAIT},  {"timeout-ms", required_argument, NULL, O_TIMEOUT},
        {"c10d", no_argument, NULL, O_C10D},           {"help", no_argument, NULL, 'h'},
        {"version", no_argument, NULL, 'V'},           {NULL, 0, NULL, 0}};
    int c;
    j->wait_ms = 1000;
    j->timeout_ms = 5000;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "hV", opts, NULL)) != -1) {
        switch (c) {
        case O_PREFIX:
            if (!*optarg || strlen(optarg) >= sizeof j->prefix) usage_error("--prefix: '%s' is empty or too long", optarg);
            strcpy(j->prefix, optarg);
            break;
        case O_SIZE: j->size = number("--size", optarg, 1, MAX_WORLD); break;
        case O_JSON: j->json = 1; break;
        case O_ALL: j->all = 1; break;
        case O_WAIT: j->wait_ms = number("--wait-ms", optarg, 0, 3600000); break;
        case O_TIMEOUT: j->timeout_ms = number("--timeout-ms", optarg, 1, 3600000); break;
        case O_C10D: j->c10d = 1; break;
        case 'h': fputs(HELP, stdout); exit(0);
        case 'V': printf("ddp-status (libddp %d.%d)\n", DDP_VERSION_MAJOR, DDP_VERSION_MINOR); exit(0);
        default: usage_error("unknown option or missing value: '%s'", argv[optind - 1]);
        }
    }
    if (optind < argc - 1) usage_error("one store address only (got '%s' too)", argv[optind + 1]);
    if (optind == argc - 1) parse_addr(j, argv[optind]);
    else if (getenv("DDP_LAUNCHER_STORE") && *getenv("DDP_LAUNCHER_STORE")) parse_addr(j, getenv("DDP_LAUNCHER_STORE"));
    else if (getenv("MASTER_ADDR") && getenv("MASTER_PORT")) {
        const char *u = getenv("TORCHELASTIC_USE_AGENT_STORE");
        snprintf(j->host, sizeof j->host, "%s", getenv("MASTER_ADDR"));
        j->port = number("MASTER_PORT", getenv("MASTER_PORT"), 1, 65535);
        if (u && (!strcmp(u, "True") || !strcmp(u, "1") || !strcmp(u, "true"))) j->c10d = 1;
    } else usage_error("%s", "no store address (give HOST:PORT)");
}

int main(int argc, char **argv) {
    static job_t job;
    job_t *j = &job;
    sb_t out = {0, 0, 0}, v = {0, 0, 0};
    int rc, k;
    parse_args(j, argc, argv);
    j->t_start = now_s();
    open_store(j);
    find_job(j);
    j->r = (rank_t *)calloc((size_t)j->size, sizeof(rank_t));
    if (!j->r) { fputs("ddp-status: out of memory\n", stderr); return EXIT_CANNOT_ASK; }
    watch(j);
    read_straggler(j);
    gather_views(j);
    rc = verdict(&v, j);
    if (j->json) json_out(&out, j, v.p, rc);
    else {
        sb_printf(&out, "job %s at %s:%d: ", j->prefix, j->host, j->port);
        sb_count(&out, j->size);
        sb_printf(&out, " rank%s, asked in %.2f s\n", j->size == 1 ? "" : "s", now_s() - j->t_start);
        if (j->all || j->size <= CONDENSE_ABOVE)
            for (k = 0; k < j->size; k++) rank_line(&out, j, k);
        else condensed(&out, j);
        sb_printf(&out, "%s", v.p);
    }
    fwrite(out.p, 1, out.len, stdout);
    fflush(stdout);
    ddp_store_close(j->st);
    free(j->r);
    free(out.p);
    free(v.p);
    return rc;
}
