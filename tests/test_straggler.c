/* SPDX-License-Identifier: MIT (see LICENSE) */
/* tests/test_straggler.c — straggler attribution (ddp_straggler.h): the TIMING blob (encoded
 * from ddp_stats.h's record, decoded strictly), the analyser's alignment of the ranks' blobs by
 * call number, its per-call arithmetic (last = argmin of the durations, lag = second-smallest -
 * smallest, interval = the median of the ranks' gaps), the window's figures, the STRAGGLER
 * line, the WARN rule and its once-per-window rhythm, the INFO report, worlds of 1 and 2; then
 * 4 real ranks (forked, TCP) where rank 3 spends 30 ms more than the others before each
 * all-reduce: each publishes its blob in the store, rank 0 analyses them and names rank 3.
 * Synthetic blobs are built here byte by byte, not with the encoder, and malformed ones are
 * allocated at their exact length, so that ASan sees any read past it.
 * Compiles the implementation itself (IMPL_SELF): it reads the communicator's stats.
 */
#define _GNU_SOURCE
#define DDP_IMPLEMENTATION
#include "ddp.h"
#include "transports/ddp_tcp.h"
#include "ddp_straggler.h"
#include "tests/ddp_test.h"

/* ---------------------------------------------------------------- synthetic blobs */
typedef struct { uint32_t seq, kind, dur, gap; } rec_t;

static void put32(unsigned char *p, uint32_t v) {
    p[0] = (unsigned char)v; p[1] = (unsigned char)(v >> 8); p[2] = (unsigned char)(v >> 16); p[3] = (unsigned char)(v >> 24);
}

/* A blob of n records, malloc'ed at its exact length (*len). */
static unsigned char *mk_blob(const rec_t *r, int n, size_t *len) {
    unsigned char *b;
    int i;
    *len = 8 + 16 * (size_t)n;
    b = (unsigned char *)malloc(*len);
    if (!b) t_bail("malloc");
    b[0] = 'D'; b[1] = 'T'; b[2] = '1'; b[3] = 0;
    put32(b + 4, (uint32_t)n);
    for (i = 0; i < n; i++) {
        put32(b + 8 + 16 * i, r[i].seq);
        put32(b + 12 + 16 * i, r[i].kind);
        put32(b + 16 + 16 * i, r[i].dur);
        put32(b + 20 + 16 * i, r[i].gap);
    }
    return b;
}

static unsigned char *copy_of(const unsigned char *src, size_t len) {
    unsigned char *b = (unsigned char *)malloc(len ? len : 1);
    if (!b) t_bail("malloc");
    if (len) memcpy(b, src, len);
    return b;
}

/* A world of NR ranks fed by a function: durs and gaps for call seq. */
#define MAXR 8
typedef struct {
    int n;
    rec_t r[MAXR][300];
    int cnt[MAXR];
} world_t;

static void w_add(world_t *w, int rank, uint32_t seq, uint32_t kind, uint32_t dur, uint32_t gap) {
    rec_t *x = &w->r[rank][w->cnt[rank]++];
    x->seq = seq; x->kind = kind; x->dur = dur; x->gap = gap;
}

/* One call on every rank: the rank `last` arrives lag_us after the others (its duration 100 us,
 * theirs 100 + lag, +7 us per rank so that they differ); gap interval on each. last < 0: all
 * equal but for small per-rank differences, the smallest at rank (seq % n). */
static void w_call(world_t *w, uint32_t seq, int last, uint32_t lag, uint32_t interval) {
    int r;
    for (r = 0; r < w->n; r++) {
        uint32_t dur;
        if (last >= 0) dur = r == last ? 100 : 100 + lag + 7 * (uint32_t)r;
        else dur = 100 + 5 * (uint32_t)((r - (int)(seq % (uint32_t)w->n) + w->n) % w->n);
        w_add(w, r, seq, DDP_CALL_ALL_REDUCE, dur, interval);
    }
}

/* Ingests w's blobs (then empties w): the count analysed, or -1. */
static int w_ingest(world_t *w, _ddp_straggler_t *a, char *err, size_t cap) {
    unsigned char *b[MAXR];
    size_t len[MAXR];
    int r, n;
    for (r = 0; r < w->n; r++) b[r] = mk_blob(w->r[r], w->cnt[r], &len[r]);
    n = _ddp_straggler_ingest(a, (const unsigned char *const *)b, len, err, cap);
    for (r = 0; r < w->n; r++) { free(b[r]); w->cnt[r] = 0; }
    return n;
}

static world_t W;

/* ---------------------------------------------------------------- blob */
static void set_entry(_ddp_stats_t *s, uint32_t seq, int kind, uint32_t dur, uint32_t gap) {
    s->timing[seq % _DDP_TIMINGS].a = (uint64_t)seq << 32 | (uint32_t)kind;
    s->timing[seq % _DDP_TIMINGS].b = (uint64_t)dur << 32 | gap;
}

static void test_round_trip(void) {
    static _ddp_stats_t s;
    static unsigned char buf[_DDP_STRAGGLER_BLOB_MAX];
    static _ddp_timing_rec_t recs[_DDP_TIMINGS];
    char err[200];
    size_t len = 0, n = 0, i;
    uint32_t seq;
    int good;

    memset(&s, 0, sizeof s);
    ok(_ddp_straggler_encode(&s, buf, sizeof buf, &len) == 0 && len == 8 && !memcmp(buf, "DT1\0\0\0\0\0", 8),
       "blob: no calls timed yet: the 8-byte header, count 0");
    ok(_ddp_straggler_decode(buf, len, recs, _DDP_TIMINGS, &n, err, sizeof err) == 0 && n == 0, "blob: decodes to 0 records");

    for (seq = 1; seq <= 300; seq++) set_entry(&s, seq, seq % 3 ? DDP_CALL_ALL_REDUCE : DDP_CALL_BROADCAST, seq * 3, seq * 5);
    s.timing[200 % _DDP_TIMINGS].a = 0;            /* being rewritten: left out */
    ok(_ddp_straggler_encode(&s, buf, sizeof buf, &len) == 0 && len == 8 + 16 * 255,
       "blob: the last 256 of 300 calls, one being rewritten left out: 255 records (%zu bytes)", len);
    {   /* the bytes themselves: little-endian, oldest first */
        const unsigned char *p = buf + 8;
        ok(buf[4] == 255 && buf[5] == 0 && p[0] == 45 && p[1] == 0 && p[4] == DDP_CALL_BROADCAST && p[8] == 135 &&
           p[12] == 225 && p[16] == 46 && p[20] == DDP_CALL_ALL_REDUCE,
           "blob: little-endian count and records, oldest (call 45) first");
    }
    good = _ddp_straggler_decode(buf, len, recs, _DDP_TIMINGS, &n, err, sizeof err) == 0 && n == 255;
    for (i = 0, seq = 45; good && i < n; i++, seq++) {
        if (seq == 200) seq++;
        good = recs[i].seq == seq && recs[i].kind == (uint32_t)(seq % 3 ? DDP_CALL_ALL_REDUCE : DDP_CALL_BROADCAST) &&
               recs[i].dur_us == seq * 3 && recs[i].gap_us == seq * 5;
    }
    ok(good, "blob: decodes to the same records, in call order (%s)", good ? "all 255" : err);
    ok(_ddp_straggler_encode(&s, buf, len - 1, &len) == -1, "blob: a buffer one byte short is refused");
    ok(_ddp_straggler_decode(buf, 8 + 16 * 255, recs, 254, &n, err, sizeof err) == -1,
       "blob: decoding into room for fewer records is refused (%s)", err);

    /* call numbers that wrap at 2^32 stay in call order */
    memset(&s, 0, sizeof s);
    for (seq = 0xffffff80u, i = 0; i < 256; i++, seq++) set_entry(&s, seq, DDP_CALL_ALL_REDUCE, 10, 20);
    good = _ddp_straggler_encode(&s, buf, sizeof buf, &len) == 0 &&
           _ddp_straggler_decode(buf, len, recs, _DDP_TIMINGS, &n, err, sizeof err) == 0 && n == 256 &&
           recs[0].seq == 0xffffff80u && recs[127].seq == 0xffffffffu && recs[128].seq == 0 && recs[255].seq == 127;
    ok(good, "blob: call numbers wrapping at 2^32 keep their order (first %u, last %u)", recs[0].seq, recs[255].seq);

    /* a stale entry far older than the rest (timing was off for a long time) is left out */
    memset(&s, 0, sizeof s);
    set_entry(&s, 5, DDP_CALL_ALL_REDUCE, 1, 1);
    for (seq = 3000000; seq < 3000010; seq++) set_entry(&s, seq, DDP_CALL_ALL_REDUCE, 1, 1);
    good = _ddp_straggler_encode(&s, buf, sizeof buf, &len) == 0 &&
           _ddp_straggler_decode(buf, len, recs, _DDP_TIMINGS, &n, err, sizeof err) == 0 && n == 10 &&
           recs[0].seq == 3000000;
    ok(good, "blob: an entry 3 million calls older than the rest is left out (%zu records)", n);

    /* real timing through the recorder's own entry points */
    memset(&s, 0, sizeof s);
    {
        _ddp_position_t pos;
        memset(&pos, 0, sizeof pos);
        s.timed = 1;
        for (seq = 1; seq <= 3; seq++) {
            int64_t t0 = _ddp_stats_begin(&s, &pos, DDP_CALL_ALL_GATHER, seq, 64, (int64_t)seq * 2000);   /* a call per 2 ms: each timed */
            _ddp_stats_end(&s, &pos, DDP_CALL_ALL_GATHER, seq, 64, 0, t0, 0);
        }
    }
    good = _ddp_straggler_encode(&s, buf, sizeof buf, &len) == 0 &&
           _ddp_straggler_decode(buf, len, recs, _DDP_TIMINGS, &n, err, sizeof err) == 0 && n == 3 &&
           recs[0].seq == 1 && recs[2].seq == 3 && recs[1].kind == DDP_CALL_ALL_GATHER && recs[0].gap_us == 0;
    ok(good, "blob: three calls timed by ddp_stats.h's begin/end come out as 3 records, the first with gap 0");
}

static void test_malformed(void) {
    rec_t r[3] = {{1, 1, 10, 10}, {2, 1, 10, 10}, {3, 1, 10, 10}};
    size_t len, l2, n;
    unsigned char *good = mk_blob(r, 3, &len), *b;
    _ddp_timing_rec_t recs[8];
    char err[200];
    uint32_t cnt;
    int i, refused;

    for (i = 0, refused = 0; i < 8; i++) {          /* shorter than the header, exact allocations */
        b = copy_of(good, (size_t)i);
        refused += _ddp_straggler_decode(b, (size_t)i, recs, 8, &n, err, sizeof err) == -1;
        free(b);
    }
    ok(refused == 8, "malformed: 0..7 bytes refused (%s)", err);
    ok(_ddp_straggler_check(NULL, 40, &cnt, err, sizeof err) == -1, "malformed: no buffer refused");

    b = copy_of(good, len); b[2] = '2';
    ok(_ddp_straggler_decode(b, len, recs, 8, &n, err, sizeof err) == -1, "malformed: wrong magic refused (%s)", err);
    free(b);

    for (l2 = len - 15, refused = 0; l2 < len; l2++) {   /* cut inside the last record */
        b = copy_of(good, l2);
        refused += _ddp_straggler_decode(b, l2, recs, 8, &n, err, sizeof err) == -1;
        free(b);
    }
    ok(refused == 15, "malformed: a blob cut inside its last record refused at every length (%s)", err);

    b = (unsigned char *)malloc(len + 16);
    memcpy(b, good, len); memset(b + len, 0, 16);
    ok(_ddp_straggler_decode(b, len + 16, recs, 8, &n, err, sizeof err) == -1,
       "malformed: bytes after the last record refused (%s)", err);
    free(b);

    b = copy_of(good, len); put32(b + 4, 4);
    ok(_ddp_straggler_decode(b, len, recs, 8, &n, err, sizeof err) == -1,
       "malformed: a count larger than what follows refused, nothing read past the end (%s)", err);
    free(b);

    {   /* oversized: 257 records, a consistent length */
        rec_t *big = (rec_t *)calloc(257, sizeof *big);
        int k;
        for (k = 0; k < 257; k++) { big[k].seq = (uint32_t)k + 1; big[k].kind = 1; }
        b = mk_blob(big, 257, &l2);
        ok(_ddp_straggler_check(b, l2, &cnt, err, sizeof err) == -1, "malformed: 257 records (more than a rank keeps) refused (%s)", err);
        free(b);
        b = mk_blob(big, 256, &l2);
        ok(_ddp_straggler_check(b, l2, &cnt, err, sizeof err) == 0 && cnt == 256, "blob: 256 records accepted");
        free(b);
        free(big);
    }
    b = copy_of(good, len); put32(b + 4, 0xffffffffu);
    ok(_ddp_straggler_check(b, len, &cnt, err, sizeof err) == -1, "malformed: count 2^32-1 refused (%s)", err);
    free(b);

    b = copy_of(good, len); put32(b + 8 + 16, 1);      /* call 1 twice */
    ok(_ddp_straggler_decode(b, len, recs, 8, &n, err, sizeof err) == -1, "malformed: a call number repeated refused (%s)", err);
    free(b);
    b = copy_of(good, len); put32(b + 8 + 32, 0);      /* 1, 2, 0 */
    ok(_ddp_straggler_decode(b, len, recs, 8, &n, err, sizeof err) == -1, "malformed: call numbers going back refused (%s)", err);
    free(b);

    {   /* the analyser refuses the round and names the rank */
        _ddp_straggler_t a;
        unsigned char *bl[2];
        size_t ln[2];
        _ddp_straggler_init(&a, 2, NULL, NULL);
        bl[0] = copy_of(good, len); ln[0] = len;
        bl[1] = copy_of(good, len - 1); ln[1] = len - 1;
        ok(_ddp_straggler_ingest(&a, (const unsigned char *const *)bl, ln, err, sizeof err) == -1 &&
           t_mentions_rank(err, 1) && a.analysed == 0,
           "malformed: ingest refuses a round with one bad blob, naming its rank (%s)", err);
        free(bl[0]); free(bl[1]);
        _ddp_straggler_free(&a);
    }
    free(good);
}

/* ---------------------------------------------------------------- arithmetic, alignment */
static void test_hand_computed(void) {
    _ddp_straggler_t a;
    _ddp_straggler_figures_t f;
    char err[200], line[512];
    int n;
    memset(&W, 0, sizeof W);
    W.n = 4;
    w_add(&W, 0, 5, DDP_CALL_ALL_REDUCE, 1200, 10000);
    w_add(&W, 1, 5, DDP_CALL_ALL_REDUCE, 300, 10400);
    w_add(&W, 2, 5, DDP_CALL_ALL_REDUCE, 1500, 9800);
    w_add(&W, 3, 5, DDP_CALL_ALL_REDUCE, 900, 10100);
    _ddp_straggler_init(&a, 4, NULL, NULL);
    n = w_ingest(&W, &a, err, sizeof err);
    ok(n == 1 && a.ring[0].last == 1 && a.ring[0].lag_us == 600 && a.ring[0].interval_us == 10050,
       "arithmetic: durations 1200,300,1500,900 -> last rank 1, lag 900-300 = 600 us; gaps 10000,10400,9800,10100 -> "
       "interval (10000+10100)/2 = 10050 us (got %d: last %d lag %u interval %u)", n, a.ring[0].last, a.ring[0].lag_us,
       a.ring[0].interval_us);
    _ddp_straggler_figures(&a, &f);
    ok(f.window == 1 && f.last_rank == 1 && f.last_count == 1 && f.median_lag_us == 600 && f.median_interval_us == 10050 &&
       f.warn == 0, "figures: one call: rank 1 once, no WARN (far below 100 calls)");
    _ddp_straggler_line(&a, line, sizeof line);
    ok(!strcmp(line, "v=1 window=1 analysed=1 kind=all_reduce last_rank=1 last_count=1 median_lag_us=600 "
                     "median_interval_us=10050 share=0.06 warn=0 last_counts=0,1,0,0"),
       "STRAGGLER line: %s", line);
    ok(_ddp_straggler_line(&a, line, 60) == -1 && line[0] == 0, "STRAGGLER line: a buffer too small gets no partial line");

    /* a tie names nobody; a first call (gap 0 on every rank) has no interval */
    w_add(&W, 0, 6, DDP_CALL_ALL_REDUCE, 500, 0);
    w_add(&W, 1, 6, DDP_CALL_ALL_REDUCE, 400, 0);
    w_add(&W, 2, 6, DDP_CALL_ALL_REDUCE, 400, 0);
    w_add(&W, 3, 6, DDP_CALL_ALL_REDUCE, 700, 0);
    n = w_ingest(&W, &a, err, sizeof err);
    ok(n == 1 && a.ring[1].last == -1 && a.ring[1].lag_us == 0 && a.ring[1].interval_us == 0,
       "arithmetic: two ranks tied for the shortest: nobody last; gaps all 0: interval unknown");
    /* the gaps' median leaves out ranks without one */
    w_add(&W, 0, 7, DDP_CALL_BARRIER, 500, 0);
    w_add(&W, 1, 7, DDP_CALL_BARRIER, 100, 8000);
    w_add(&W, 2, 7, DDP_CALL_BARRIER, 900, 9000);
    w_add(&W, 3, 7, DDP_CALL_BARRIER, 700, 30000);
    n = w_ingest(&W, &a, err, sizeof err);
    ok(n == 1 && a.ring[2].last == 1 && a.ring[2].lag_us == 400 && a.ring[2].interval_us == 9000 && a.ring[2].kind == DDP_CALL_BARRIER,
       "arithmetic: a barrier: last rank 1, lag 400; gaps 0 (left out), 8000, 9000, 30000 -> interval 9000");
    _ddp_straggler_figures(&a, &f);
    ok(f.window == 3 && f.last_rank == 1 && f.last_count == 2 && f.median_lag_us == 500 && f.median_interval_us == 9525 &&
       f.mixed && f.kind == DDP_CALL_ALL_REDUCE,
       "figures: rank 1 last twice, median lag (600+400)/2, median interval of the known ones (10050+9000)/2, mixed kinds");
    _ddp_straggler_free(&a);
}

static int ring_has(const _ddp_straggler_t *a, int i, int last, uint32_t lag) {
    int idx = (a->head - a->count + i + a->o.window) % a->o.window;
    return a->ring[idx].last == last && a->ring[idx].lag_us == lag;
}

static void test_alignment(void) {
    _ddp_straggler_t a;
    char err[200];
    uint32_t s;
    int n, r, good, i;
    static const uint32_t want1[] = {3, 4, 5, 6, 8, 9, 10};
    memset(&W, 0, sizeof W);
    W.n = 4;
    _ddp_straggler_init(&a, 4, NULL, NULL);
    /* call s: rank s % 4 last by 10 * s us. Rank 0 holds 1..10, rank 1 3..12, rank 2 1..12
     * without 7, rank 3 2..11: every blob holds 3..10 but 7. */
    for (s = 1; s <= 12; s++) {
        for (r = 0; r < 4; r++) {
            uint32_t dur = r == (int)(s % 4) ? 100 : 100 + 10 * s;
            if ((r == 0 && s > 10) || (r == 1 && s < 3) || (r == 2 && s == 7) || (r == 3 && (s < 2 || s > 11))) continue;
            w_add(&W, r, s, DDP_CALL_ALL_REDUCE, dur, 1000);
        }
    }
    n = w_ingest(&W, &a, err, sizeof err);
    for (i = 0, good = n == 7; good && i < 7; i++) good = ring_has(&a, i, (int)(want1[i] % 4), 10 * want1[i]);
    ok(good, "alignment: blobs holding 1..10, 3..12, 1..12 but 7, 2..11: calls 3..10 but 7 analysed, in order (%d)", n);

    /* the next round: rank 0 now holds 13..20 (it never published 11 and 12: they wrapped out of
     * its ring between two reads), the others 5..20: 11 and 12 are not counted; 13..20 are */
    for (s = 5; s <= 20; s++)
        for (r = 0; r < 4; r++) {
            if (r == 0 && s < 13) continue;
            w_add(&W, r, s, DDP_CALL_ALL_REDUCE, r == (int)(s % 4) ? 100 : 100 + 10 * s, 1000);
        }
    n = w_ingest(&W, &a, err, sizeof err);
    for (i = 0, good = n == 8 && a.analysed == 15; good && i < 8; i++) good = ring_has(&a, 7 + i, (int)((13 + i) % 4), 10 * (13 + i));
    ok(good, "alignment: the next round analyses only newer calls, 13..20; 11 and 12, wrapped out of one blob, are not counted (%d)", n);

    for (s = 5; s <= 20; s++) for (r = 0; r < 4; r++) w_add(&W, r, s, DDP_CALL_ALL_REDUCE, 100 + (uint32_t)r, 1000);
    n = w_ingest(&W, &a, err, sizeof err);
    ok(n == 0 && a.analysed == 15, "alignment: the same calls again: nothing new");

    {   /* a rank that has published nothing yet */
        unsigned char *bl[4];
        size_t ln[4];
        rec_t one = {21, DDP_CALL_ALL_REDUCE, 10, 10};
        for (r = 0; r < 4; r++) bl[r] = r == 2 ? NULL : mk_blob(&one, 1, &ln[r]);
        ln[2] = 0;
        n = _ddp_straggler_ingest(&a, (const unsigned char *const *)bl, ln, err, sizeof err);
        ok(n == 0 && a.analysed == 15, "alignment: one rank without a blob yet: nothing analysed, no error");
        for (r = 0; r < 4; r++) free(bl[r]);
    }

    /* kinds: a call whose kind differs on one rank, and rooted calls and send/recv, are skipped */
    for (r = 0; r < 4; r++) {
        w_add(&W, r, 21, r == 3 ? DDP_CALL_SEND : DDP_CALL_ALL_REDUCE, 100 + (uint32_t)r, 1000);
        w_add(&W, r, 22, DDP_CALL_BROADCAST, 100 + (uint32_t)r, 1000);
        w_add(&W, r, 23, DDP_CALL_REDUCE, 100 + (uint32_t)r, 1000);
        w_add(&W, r, 24, DDP_CALL_RECV, 100 + (uint32_t)r, 1000);
        w_add(&W, r, 25, DDP_CALL_ALL_TO_ALL, 100 + (uint32_t)r, 1000);
        w_add(&W, r, 26, 77, 100 + (uint32_t)r, 1000);
    }
    n = w_ingest(&W, &a, err, sizeof err);
    ok(n == 1 && a.analysed == 16 && ring_has(&a, 15, 0, 1) && a.last_seq == 26,
       "kinds: a call whose kind differs between ranks, broadcast, reduce, recv and an unknown kind are consumed "
       "but not counted; the all-to-all is (%d)", n);
    _ddp_straggler_free(&a);

    /* call numbers wrapping at 2^32 across two rounds */
    _ddp_straggler_init(&a, 2, NULL, NULL);
    memset(&W, 0, sizeof W);
    W.n = 2;
    for (s = 0xfffffff0u; s != 0x4u; s++) w_call(&W, s, 1, 3000, 10000);
    n = w_ingest(&W, &a, err, sizeof err);
    for (s = 0xfffffff8u; s != 0x10u; s++) w_call(&W, s, 0, 3000, 10000);
    i = w_ingest(&W, &a, err, sizeof err);
    ok(n == 20 && i == 12 && a.last_counts[1] == 20 && a.last_counts[0] == 12,
       "alignment: call numbers wrapping at 2^32: 20 calls, then only the 12 newer ones (%d, %d)", n, i);
    _ddp_straggler_free(&a);
}

/* ---------------------------------------------------------------- the WARN rule, the report */
static void test_warn_rule(void) {
    _ddp_straggler_t a;
    _ddp_straggler_opts_t o;
    _ddp_straggler_figures_t f;
    char err[200], info[512], warn[512];
    uint32_t s = 1;
    int i, rc;

    memset(&o, 0, sizeof o);
    o.window = 100;
    o.report_calls = -1;
    memset(&W, 0, sizeof W);
    W.n = 4;
    _ddp_straggler_init(&a, 4, &o, NULL);
    ok(a.o.min_calls == 100 && a.o.share == 0.05, "defaults: the WARN needs 100 calls (the window here) and a 5%% share");
    /* 99 calls, rank 2 last by 5 ms in 60, the others spread: not enough calls yet */
    for (i = 0; i < 99; i++, s++) w_call(&W, s, i < 60 ? 2 : i % 4 == 2 ? 3 : i % 4, 5000, 15000);
    w_ingest(&W, &a, err, sizeof err);
    _ddp_straggler_figures(&a, &f);
    rc = _ddp_straggler_report(&a, info, sizeof info, warn, sizeof warn);
    ok(f.last_rank == 2 && f.last_count == 60 && !f.warn && rc == 0, "WARN: 99 calls (< 100): none yet");
    w_call(&W, s++, 1, 5000, 15000);
    w_ingest(&W, &a, err, sizeof err);
    rc = _ddp_straggler_report(&a, info, sizeof info, warn, sizeof warn);
    ok(rc == 2 && !strcmp(warn, "rank 2 arrived last in 60 of the last 100 all-reduces, a median 5.0 ms after the others "
                                "(33% of the time between calls)"),
       "WARN at 100 calls: %s", warn);
    _ddp_straggler_line(&a, info, sizeof info);
    ok(strstr(info, " warn=1 ") && strstr(info, " last_rank=2 last_count=60 median_lag_us=5000 median_interval_us=15000 share=0.33 "),
       "STRAGGLER line says so: %s", info);
    /* still true for the next 99 calls: not again */
    for (i = 0, rc = 0; i < 99; i++) {
        w_call(&W, s++, 2, 5000, 15000);
        w_ingest(&W, &a, err, sizeof err);
        rc |= _ddp_straggler_report(&a, info, sizeof info, warn, sizeof warn);
    }
    _ddp_straggler_figures(&a, &f);
    ok(rc == 0 && f.warn && f.last_count == 99, "WARN: at most once per window: the condition held for 99 more calls, no second WARN");
    w_call(&W, s++, 2, 5000, 15000);
    w_ingest(&W, &a, err, sizeof err);
    rc = _ddp_straggler_report(&a, info, sizeof info, warn, sizeof warn);
    ok(rc == 2 && strstr(warn, "rank 2 arrived last in 100 of the last 100 all-reduces"), "WARN: again a window (100 calls) later: %s", warn);
    _ddp_straggler_free(&a);

    /* exactly half is not most */
    _ddp_straggler_init(&a, 4, &o, NULL);
    for (i = 0; i < 100; i++) w_call(&W, s++, i % 2 ? 2 : 1, 5000, 15000);
    w_ingest(&W, &a, err, sizeof err);
    _ddp_straggler_figures(&a, &f);
    ok(!f.warn && _ddp_straggler_report(&a, info, sizeof info, warn, sizeof warn) == 0 && f.last_count == 50,
       "WARN: last in 50 of 100 (half, not most): none");
    _ddp_straggler_free(&a);

    /* most calls but a small lag: 0.7 ms of 15 ms is 4.7% < 5% */
    _ddp_straggler_init(&a, 4, &o, NULL);
    for (i = 0; i < 100; i++) w_call(&W, s++, 3, 700, 15000);
    w_ingest(&W, &a, err, sizeof err);
    _ddp_straggler_figures(&a, &f);
    ok(!f.warn && f.last_count == 100 && f.share < 0.05, "WARN: last in 100 of 100 by 0.7 ms of 15 ms (%.3f < 0.05): none", f.share);
    _ddp_straggler_free(&a);
    o.share = 0.04;
    _ddp_straggler_init(&a, 4, &o, NULL);
    for (i = 0; i < 100; i++) w_call(&W, s++, 3, 700, 15000);
    w_ingest(&W, &a, err, sizeof err);
    ok(_ddp_straggler_report(&a, info, sizeof info, warn, sizeof warn) == 2 && strstr(warn, "a median 700 us after") &&
       strstr(warn, "(5% of the time"), "WARN: the same with share 0.04: %s", warn);
    _ddp_straggler_free(&a);

    /* all equal but for small differences: nobody is last most of the time */
    o.share = 0;
    _ddp_straggler_init(&a, 4, &o, NULL);
    for (i = 0; i < 100; i++) w_call(&W, s++, -1, 0, 15000);
    w_ingest(&W, &a, err, sizeof err);
    _ddp_straggler_figures(&a, &f);
    ok(!f.warn && f.last_count == 25, "WARN: all equal, the last one rotating: none (most often last: %u of 100)", f.last_count);
    _ddp_straggler_free(&a);

    /* the INFO report: every report_calls analysed calls, once per ingest however many it added */
    o.window = 100;
    o.report_calls = 30;
    _ddp_straggler_init(&a, 4, &o, NULL);
    for (i = 0; i < 29; i++) w_call(&W, s++, 1, 2000, 10000);
    w_ingest(&W, &a, err, sizeof err);
    rc = _ddp_straggler_report(&a, info, sizeof info, warn, sizeof warn);
    ok(rc == 0, "INFO: none after 29 calls (every 30)");
    w_call(&W, s++, 1, 2000, 10000);
    w_ingest(&W, &a, err, sizeof err);
    rc = _ddp_straggler_report(&a, info, sizeof info, warn, sizeof warn);
    ok(rc == 1 && strstr(info, "of the last 30 all-reduces, rank 1 arrived last in 30, a median 2.0 ms after the others "
                               "(20% of the median 10 ms between calls)"), "INFO at 30 calls: %s", info);
    for (i = 0; i < 65; i++) w_call(&W, s++, i % 3 ? 2 : 0, 4000, 10000);
    w_ingest(&W, &a, err, sizeof err);
    rc = _ddp_straggler_report(&a, info, sizeof info, warn, sizeof warn);
    ok(rc == 1 && strstr(info, "of the last 95 all-reduces, rank 2 arrived last in 43") && strstr(info, "; then rank 1 in 30, rank 0 in 22"),
       "INFO: 65 calls in one round (past 60 and 90): one report, the next most often last named: %s", info);
    rc = _ddp_straggler_report(&a, info, sizeof info, warn, sizeof warn);
    ok(rc == 0, "INFO: nothing new, no report");
    _ddp_straggler_free(&a);
}

static void test_small_worlds(void) {
    _ddp_straggler_t a;
    _ddp_straggler_opts_t o;
    _ddp_straggler_figures_t f;
    char err[200], info[512], warn[512], line[512];
    int i, rc;
    uint32_t s = 1;

    memset(&o, 0, sizeof o);
    o.window = 100;
    o.report_calls = 100;
    memset(&W, 0, sizeof W);
    W.n = 1;
    ok(_ddp_straggler_init(&a, 0, &o, NULL) == -1, "n = 0 refused");
    _ddp_straggler_init(&a, 1, &o, NULL);
    for (i = 0; i < 150; i++) w_add(&W, 0, s++, DDP_CALL_ALL_REDUCE, 50, 10000);
    ok(w_ingest(&W, &a, err, sizeof err) == 150, "n = 1: every call analysed");
    _ddp_straggler_figures(&a, &f);
    rc = _ddp_straggler_report(&a, info, sizeof info, warn, sizeof warn);
    _ddp_straggler_line(&a, line, sizeof line);
    ok(f.last_rank == -1 && !f.warn && rc == 1 && strstr(info, "named nobody") && strstr(info, "a world of 1") &&
       strstr(line, "last_rank=-1 last_count=0 median_lag_us=0 median_interval_us=10000 share=0.00 warn=0 last_counts=0"),
       "n = 1: nobody is ever last; %s; %s", info, line);
    _ddp_straggler_free(&a);

    W.n = 2;
    _ddp_straggler_init(&a, 2, &o, NULL);
    w_add(&W, 0, 1, DDP_CALL_ALL_REDUCE, 500, 10000);
    w_add(&W, 1, 1, DDP_CALL_ALL_REDUCE, 2500, 12000);
    ok(w_ingest(&W, &a, err, sizeof err) == 1 && a.ring[0].last == 0 && a.ring[0].lag_us == 2000 && a.ring[0].interval_us == 11000,
       "n = 2: durations 500, 2500 -> rank 0 last by 2000 us; gaps 10000, 12000 -> interval 11000");
    for (i = 0; i < 120; i++) w_call(&W, s + 1 + (uint32_t)i, 1, 3000, 12000);
    w_ingest(&W, &a, err, sizeof err);
    rc = _ddp_straggler_report(&a, info, sizeof info, warn, sizeof warn);
    ok(rc == 3 && !strcmp(warn, "rank 1 arrived last in 100 of the last 100 all-reduces, a median 3.0 ms after the others "
                                "(25% of the time between calls)"), "n = 2: WARN: %s", warn);
    _ddp_straggler_free(&a);
}

static void test_env(void) {
    _ddp_straggler_opts_t o;
    _ddp_straggler_t a;
    char err[200];
    ok(_ddp_straggler_opts_env(&o, err, sizeof err) == 0 && o.window == 0 && o.share == 0 && o.report_calls == 0,
       "env: nothing set: every field 0 (the defaults)");
    setenv("DDP_STRAGGLER_SHARE", "0.2", 1);
    setenv("DDP_STRAGGLER_WINDOW", "500", 1);
    setenv("DDP_STRAGGLER_REPORT_CALLS", "0", 1);
    ok(_ddp_straggler_opts_env(&o, err, sizeof err) == 0 && o.share == 0.2 && o.window == 500 && o.report_calls == -1,
       "env: share 0.2, window 500, REPORT_CALLS=0 means never");
    _ddp_straggler_init(&a, 3, &o, NULL);
    ok(a.o.window == 500 && a.o.min_calls == 100 && a.o.report_calls == -1 && a.o.share == 0.2, "env: the analyser takes them");
    _ddp_straggler_free(&a);
    setenv("DDP_STRAGGLER_SHARE", "5%", 1);
    ok(_ddp_straggler_opts_env(&o, err, sizeof err) == -1 && o.share == 0 && strstr(err, "DDP_STRAGGLER_SHARE"),
       "env: SHARE=5%% refused, the default kept: %s", err);
    setenv("DDP_STRAGGLER_SHARE", "1.5", 1);
    ok(_ddp_straggler_opts_env(&o, err, sizeof err) == -1 && o.share == 0, "env: SHARE=1.5 refused");
    unsetenv("DDP_STRAGGLER_SHARE");
    setenv("DDP_STRAGGLER_WINDOW", "5", 1);
    ok(_ddp_straggler_opts_env(&o, err, sizeof err) == -1 && o.window == 0 && strstr(err, "DDP_STRAGGLER_WINDOW"),
       "env: WINDOW=5 refused: %s", err);
    unsetenv("DDP_STRAGGLER_WINDOW");
    unsetenv("DDP_STRAGGLER_REPORT_CALLS");
}

/* ---------------------------------------------------------------- 4 real ranks */
#define REAL_NP 4
#define REAL_STEPS 40
#define REAL_SLOW 3
#define REAL_EXTRA_MS 30
static int g_store_port;

static int real_rank(int rank, int p, void *arg) {
    ddp_store_t *st = NULL;
    ddp_comm_desc_t d;
    ddp_comm_t *c = NULL;
    float g[16];
    unsigned char blob[_DDP_STRAGGLER_BLOB_MAX];
    char key[64];
    size_t len = 0;
    int i, bad = 0;
    (void)arg;
    if (!ok(t_store_client(&st, g_store_port) == DDP_SUCCESS, "real: rank %d store client", rank)) return 1;
    t_desc(&d, 60000);
    d.store = st;
    d.store_prefix = "stragglertest";
    d.transport = "tcp";
    if (!(c = t_comm_init(rank, p, &d))) return 1;
    __atomic_store_n(&c->stats.timed, 1, __ATOMIC_RELAXED);     /* what the health thread does */
    for (i = 0; i < REAL_STEPS && !bad; i++) {
        int k;
        t_where("step %d", i);
        if (rank == REAL_SLOW) t_sleep_ms(REAL_EXTRA_MS);
        for (k = 0; k < 16; k++) g[k] = (float)(rank + k);
        bad = ddp_all_reduce(g, g, 16, DDP_FLOAT32, DDP_SUM, c) != DDP_SUCCESS;
    }
    ok(!bad, "real: rank %d ran %d all-reduces", rank, REAL_STEPS);
    i = _ddp_straggler_encode(&c->stats, blob, sizeof blob, &len);
    ok(i == 0 && len == 8 + 16 * REAL_STEPS, "real: rank %d's blob holds its %d calls (%zu bytes)", rank, REAL_STEPS, len);
    snprintf(key, sizeof key, "stragglertest/t/%d", rank);
    ok(ddp_store_set(st, key, blob, len) == DDP_SUCCESS, "real: rank %d published its blob", rank);
    if (rank == 0) {
        static unsigned char blobs[REAL_NP][_DDP_STRAGGLER_BLOB_MAX];
        const unsigned char *bp[REAL_NP];
        size_t lens[REAL_NP];
        _ddp_straggler_t a;
        _ddp_straggler_opts_t o;
        _ddp_straggler_figures_t f;
        char err[200], info[512], warn[512], line[512];
        int r, n, rc, got = 1;
        for (r = 0; r < p; r++) {
            snprintf(key, sizeof key, "stragglertest/t/%d", r);
            got &= ddp_store_get(st, key, blobs[r], sizeof blobs[r], &lens[r]) == DDP_SUCCESS;
            bp[r] = blobs[r];
        }
        ok(got, "real: rank 0 read every rank's blob from the store");
        memset(&o, 0, sizeof o);
        o.min_calls = REAL_STEPS / 2;                   /* 40 calls, not the default 100 */
        _ddp_straggler_init(&a, p, &o, NULL);
        n = _ddp_straggler_ingest(&a, bp, lens, err, sizeof err);
        _ddp_straggler_figures(&a, &f);
        rc = _ddp_straggler_report(&a, info, sizeof info, warn, sizeof warn);
        _ddp_straggler_line(&a, line, sizeof line);
        diag("real: %s", line);
        ok(n == REAL_STEPS, "real: all %d calls aligned across the 4 blobs (%d)", REAL_STEPS, n);
        ok(f.last_rank == REAL_SLOW && f.last_count * 2 > REAL_STEPS,
           "real: rank %d (%d ms more per step) is the one last in most calls: rank %d in %u of %d", REAL_SLOW,
           REAL_EXTRA_MS, f.last_rank, f.last_count, f.window);
        ok((rc & 2) && t_mentions_rank(warn, REAL_SLOW), "real: the WARN names it: %s", warn);
        _ddp_straggler_free(&a);
    }
    ddp_barrier(c);                                     /* rank 0 read the blobs before the store may go */
    ddp_comm_destroy(c);
    ddp_store_close(st);
    return 0;
}

static void test_real(void) {
    int stop = -1;
    pid_t store = t_store_process(&g_store_port, &stop);
    if (!ok(store > 0 && g_store_port > 0, "real: the store (a process of its own)")) return;
    t_run_ranks(REAL_NP, real_rank, NULL, 120);
    ok(t_last_run.exited[0] && !t_last_run.code[0] && t_last_run.exited[REAL_SLOW] && !t_last_run.code[REAL_SLOW],
       "real: the ranks exited cleanly");
    close(stop);
    waitpid(store, NULL, 0);
}

int main(void) {
    t_init();
    if (t_selected("blob")) { test_round_trip(); test_malformed(); }
    if (t_selected("arithmetic")) test_hand_computed();
    if (t_selected("alignment")) test_alignment();
    if (t_selected("warn")) test_warn_rule();
    if (t_selected("small")) test_small_worlds();
    if (t_selected("env")) test_env();
    if (t_selected("real")) test_real();
    return t_done();
}
