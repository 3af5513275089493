/* SPDX-License-Identifier: MIT (see LICENSE) */
/* tests/test_metrics.c — the metrics file (ddp_metrics.h), from made-up counters. Prints TAP.
 *
 *   build/test_metrics
 *
 * - The file name of a rank: "%r" replaced (every one), before a ".prom" ending, else
 *   ".<rank>.prom" appended; a name that does not fit refused. DDP_METRICS and
 *   DDP_METRICS_PERIOD_MS: unset, set, a malformed period. nccl-tests' busbw factors.
 * - Files for: no call made (a world of 1); every kind called, with a previous refresh (the
 *   bus bandwidth), the straggler figures and both neighbours; counters at 2^64 - 1; a failed
 *   communicator with neighbours silent and never heard; 2,000 ranks of straggler figures
 *   (bounded); label values that need escaping. Each is checked here (the lines it must have
 *   and must not have) and read back by a real Prometheus text parser (tests/metrics_check.py,
 *   Python's prometheus_client; skipped when no python3 has it) that checks HELP/TYPE, the
 *   rank label, histograms (cumulative, +Inf = _count = the timed calls) and the values.
 * - The parser check refuses broken files: a family without TYPE, buckets that are not
 *   cumulative, a line cut short.
 * - Whole files only: a reader that reads the file over and over while it is rewritten sees
 *   complete files every time; nothing is left beside it; a directory that does not exist is
 *   an error naming the file, and leaves nothing.
 */
#define _GNU_SOURCE
#define DDP_IMPLEMENTATION
#include "ddp_metrics.h"
#include "tests/ddp_test.h"

#include <dirent.h>
#include <pthread.h>
#include <sys/stat.h>

static char t_dir[256];
static char py[256];   /* a python3 with prometheus_client, or "" */

static char *slurp(const char *path) {
    FILE *f = fopen(path, "r");
    char *b;
    size_t n = 0, cap = 1 << 16, k;
    if (!f) return NULL;
    b = (char *)malloc(cap + 1);
    while (b && (k = fread(b + n, 1, cap - n, f)) > 0) {
        n += k;
        if (n == cap) { char *nb = (char *)realloc(b, cap * 2 + 1); if (!nb) { free(b); b = NULL; break; } b = nb; cap *= 2; }
    }
    fclose(f);
    if (b) b[n] = 0;
    return b;
}

static int has_line(const char *text, const char *line) {
    size_t n = strlen(line);
    const char *p = text;
    while ((p = strstr(p, line)) != NULL) {
        if ((p == text || p[-1] == '\n') && (p[n] == '\n' || p[n] == 0)) return 1;
        p += n;
    }
    return 0;
}

static int count_lines(const char *text, const char *prefix) {
    int c = 0;
    size_t n = strlen(prefix);
    const char *p = text;
    for (; *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : p + strlen(p))
        if (!strncmp(p, prefix, n)) c++;
    return c;
}

static void find_python(void) {
    const char *env = getenv("PYTHON");
    const char *cands[3];
    int i;
    char cmd[512];
    cands[0] = env && *env ? env : NULL;
    cands[1] = "/usr/bin/python3";
    cands[2] = "python3";
    for (i = 0; i < 3; i++) {
        if (!cands[i]) continue;
        snprintf(cmd, sizeof cmd, "%s -c 'import prometheus_client.parser' >/dev/null 2>&1", cands[i]);
        if (system(cmd) == 0) { snprintf(py, sizeof py, "%s", cands[i]); return; }
    }
}

/* tests/metrics_check.py on path with the expectations; 1 when it says ok. Its output goes to
 * diag (and stderr when want_ok and it failed). */
static int parser_check(const char *path, const char *args, int want_ok, const char *what) {
    char cmd[8192], line[1024], said[12][256];
    FILE *p;
    int rc, n = 0, i, pass;
    if (!*py) {
        printf("ok %d - %s # SKIP no python3 with prometheus_client (Debian: python3-prometheus-client)\n",
               ++t_ntests, what);
        return 1;
    }
    snprintf(cmd, sizeof cmd, "%s tests/metrics_check.py '%s' %s 2>&1", py, path, args);
    if (!(p = popen(cmd, "r"))) return ok(0, "%s: popen: %s", what, strerror(errno));
    while (fgets(line, sizeof line, p)) {
        line[strcspn(line, "\n")] = 0;
        if (n < 12) snprintf(said[n++], sizeof said[0], "%.255s", line);
    }
    rc = pclose(p);
    rc = WIFEXITED(rc) ? WEXITSTATUS(rc) : 128;
    pass = ok(want_ok ? rc == 0 : rc == 1, "%s (the parser check %s)", what,
              rc == 0 ? "passes" : rc == 1 ? "refuses it" : "did not run");
    for (i = 0; i < n; i++) diag("  parser: %s", said[i]);   /* after the check: on stderr if it failed */
    return pass;
}

static void write_ok(const char *path, const _ddp_metrics_in_t *in, const char *what) {
    char err[512] = "";
    int r = _ddp_metrics_write_file(path, in, err, sizeof err);
    ok(r == 0, "%s: written (%s)", what, r ? err : "ok");
}

/* Fills kind k with n timed calls of b bytes each, spread over the buckets. */
static void fill_kind(_ddp_kind_stats_t *s, uint64_t n, uint64_t b, uint64_t ns_each) {
    memset(s, 0, sizeof *s);
    s->calls = n;
    s->timed = n;
    s->bytes = n * b;
    s->ns = n * ns_each;
    s->errors = n / 10;
    s->bucket[_ddp_stats_bucket((int64_t)ns_each)] = n - n / 3;
    s->bucket[_ddp_stats_bucket((int64_t)ns_each * 100)] += n / 3;
}

static void test_names(void) {
    char out[64], err[256], pat[128];
    int period = 0, r;
    ok(_ddp_metrics_path("/m/ddp-%r.prom", 3, out, sizeof out) == 0 && !strcmp(out, "/m/ddp-3.prom"),
       "%%r is replaced by the rank: %s", out);
    ok(_ddp_metrics_path("/m/%r/ddp-%r.prom", 12, out, sizeof out) == 0 && !strcmp(out, "/m/12/ddp-12.prom"),
       "every %%r: %s", out);
    ok(_ddp_metrics_path("/m/ddp.prom", 7, out, sizeof out) == 0 && !strcmp(out, "/m/ddp.7.prom"),
       "no %%r, a .prom ending: the rank before it: %s", out);
    ok(_ddp_metrics_path("/m/ddp", 0, out, sizeof out) == 0 && !strcmp(out, "/m/ddp.0.prom"),
       "no %%r: .<rank>.prom appended: %s", out);
    ok(_ddp_metrics_path("/a/very/long/directory/name/for/the/metrics/of/this/job/ddp-%r.prom", 1234567, out,
                         sizeof out) == -1 &&
       _ddp_metrics_path("/a/very/long/directory/name/for/the/metrics/of/this/job/ddp.prom", 1234567, out,
                         sizeof out) == -1,
       "a name that does not fit is refused");
    unsetenv("DDP_METRICS");
    unsetenv("DDP_METRICS_PERIOD_MS");
    r = _ddp_metrics_env(pat, sizeof pat, &period, err, sizeof err);
    ok(r == 0 && period == 2000,
       "DDP_METRICS unset: off (period %d)", period);
    setenv("DDP_METRICS", "/m/ddp-%r.prom", 1);
    r = _ddp_metrics_env(pat, sizeof pat, &period, err, sizeof err);
    ok(r == 1 && period == 2000 &&
       !strcmp(pat, "/m/ddp-%r.prom"), "DDP_METRICS set: on, every 2000 ms (%s, %d)", pat, period);
    setenv("DDP_METRICS_PERIOD_MS", "500", 1);
    r = _ddp_metrics_env(pat, sizeof pat, &period, err, sizeof err);
    ok(r == 1 && period == 500,
       "DDP_METRICS_PERIOD_MS=500: %d", period);
    setenv("DDP_METRICS_PERIOD_MS", "5s", 1);
    err[0] = 0;
    r = _ddp_metrics_env(pat, sizeof pat, &period, err, sizeof err);
    ok(r == -1 && strstr(err, "DDP_METRICS_PERIOD_MS=5s"),
       "DDP_METRICS_PERIOD_MS=5s is refused, naming it: %s", err);
    unsetenv("DDP_METRICS");
    unsetenv("DDP_METRICS_PERIOD_MS");
    ok(_ddp_busbw_factor(DDP_CALL_ALL_REDUCE, 4) == 1.5 && _ddp_busbw_factor(DDP_CALL_ALL_GATHER, 4) == 0.75 &&
       _ddp_busbw_factor(DDP_CALL_REDUCE_SCATTER, 4) == 0.75 && _ddp_busbw_factor(DDP_CALL_ALL_TO_ALL, 4) == 0.75 &&
       _ddp_busbw_factor(DDP_CALL_BROADCAST, 4) == 1 && _ddp_busbw_factor(DDP_CALL_REDUCE, 4) == 1 &&
       _ddp_busbw_factor(DDP_CALL_BARRIER, 4) == 0 && _ddp_busbw_factor(DDP_CALL_ALL_REDUCE, 1) == 0,
       "busbw factors: nccl-tests' (all_reduce 2(n-1)/n, all_gather (n-1)/n, broadcast 1, barrier none)");
}

static void test_no_calls(void) {
    static _ddp_metrics_in_t in;
    char path[400], *t;
    memset(&in, 0, sizeof in);
    in.rank = 0; in.size = 1; in.transport = "tcp"; in.version = "0.2";
    in.peer[0].rank = in.peer[1].rank = -1;
    snprintf(path, sizeof path, "%s/none.prom", t_dir);
    write_ok(path, &in, "no calls");
    t = slurp(path);
    ok(t && has_line(t, "ddp_info{rank=\"0\",version=\"0.2\",transport=\"tcp\",size=\"1\"} 1") &&
       has_line(t, "ddp_communicator_failed{rank=\"0\"} 0") && !strstr(t, "ddp_calls_total") &&
       !strstr(t, "ddp_call_duration") && !strstr(t, "ddp_peer") && !strstr(t, "ddp_straggler") &&
       has_line(t, "ddp_heartbeat_bytes_total{rank=\"0\",direction=\"sent\"} 0"),
       "no calls: info, not failed, heartbeat bytes; no kind, no peer, no straggler families");
    if (t) free(t);
    parser_check(path, "--rank 0 'ddp_info{size=1}=1' 'ddp_calls_total=absent'", 1, "no calls: parses");
}

static void test_all_kinds(void) {
    static _ddp_metrics_in_t in;
    static const uint32_t counts[4] = {10, 40, 38, 912};
    char path[400], args[2048], *t;
    int k;
    memset(&in, 0, sizeof in);
    in.rank = 2; in.size = 4; in.transport = "shm+tcp"; in.version = "0.2";
    for (k = 1; k < _DDP_NUM_KINDS; k++) fill_kind(&in.now[k], 30 * (uint64_t)k, 4096, 20000);
    /* the previous refresh: all_reduce 100 calls of 4 KiB fewer, 200 us each -> in the last
     * interval 2 x 4096 x 100 x 3/4 / 0.02 s = 30,720,000 B/s at p = 4; all_gather 50 fewer,
     * of 1 MiB, 1 ms each: 0.75 x 1 MiB x 50 / 0.05 s = 786,432,000 B/s */
    in.now[DDP_CALL_ALL_REDUCE].calls += 100; in.now[DDP_CALL_ALL_REDUCE].timed += 100;
    in.now[DDP_CALL_ALL_REDUCE].bytes += 100 * 4096; in.now[DDP_CALL_ALL_REDUCE].ns += 100 * 200000;
    in.now[DDP_CALL_ALL_REDUCE].bucket[_ddp_stats_bucket(200000)] += 100;
    in.prev[DDP_CALL_ALL_REDUCE] = in.now[DDP_CALL_ALL_REDUCE];
    in.prev[DDP_CALL_ALL_REDUCE].calls -= 100; in.prev[DDP_CALL_ALL_REDUCE].timed -= 100;
    in.prev[DDP_CALL_ALL_REDUCE].bytes -= 100 * 4096; in.prev[DDP_CALL_ALL_REDUCE].ns -= 100 * 200000;
    in.prev[DDP_CALL_ALL_GATHER] = in.now[DDP_CALL_ALL_GATHER];
    in.now[DDP_CALL_ALL_GATHER].calls += 50; in.now[DDP_CALL_ALL_GATHER].timed += 50;
    in.now[DDP_CALL_ALL_GATHER].bytes += 50u << 20; in.now[DDP_CALL_ALL_GATHER].ns += 50 * 1000000;
    in.now[DDP_CALL_ALL_GATHER].bucket[_ddp_stats_bucket(1000000)] += 50;
    /* broadcast: untimed calls in the interval -> no bandwidth for it */
    in.prev[DDP_CALL_BROADCAST] = in.now[DDP_CALL_BROADCAST];
    in.now[DDP_CALL_BROADCAST].calls += 5; in.now[DDP_CALL_BROADCAST].bytes += 5000;
    in.straggler.valid = 1; in.straggler.kind = DDP_CALL_ALL_REDUCE; in.straggler.window = 1000;
    in.straggler.analysed = 123456; in.straggler.last_rank = 3; in.straggler.last_count = 912;
    in.straggler.median_lag_us = 12000; in.straggler.median_interval_us = 46000; in.straggler.share = 0.26;
    in.straggler.warn = 1; in.straggler.last_counts = counts; in.straggler.n = 4;
    in.peer[0].rank = 1; in.peer[0].state = "ok"; in.peer[0].ms = 120;
    in.peer[1].rank = 3; in.peer[1].state = "silent"; in.peer[1].ms = 7040;
    in.hb_sent_bytes = 1234; in.hb_recv_bytes = 5678;
    snprintf(path, sizeof path, "%s/all.prom", t_dir);
    write_ok(path, &in, "every kind");
    t = slurp(path);
    ok(t && has_line(t, "# TYPE ddp_calls_total counter") && has_line(t, "# TYPE ddp_call_duration_seconds histogram") &&
       has_line(t, "ddp_calls_total{rank=\"2\",kind=\"all_reduce\"} 130") &&
       has_line(t, "ddp_calls_total{rank=\"2\",kind=\"recv\"} 330") &&
       has_line(t, "ddp_call_bytes_total{rank=\"2\",kind=\"all_reduce\"} 532480") &&
       has_line(t, "ddp_call_errors_total{rank=\"2\",kind=\"all_reduce\"} 3") &&
       has_line(t, "ddp_call_duration_seconds_bucket{rank=\"2\",kind=\"all_reduce\",le=\"3e-05\"} 20") &&
       has_line(t, "ddp_call_duration_seconds_bucket{rank=\"2\",kind=\"all_reduce\",le=\"+Inf\"} 130") &&
       has_line(t, "ddp_call_duration_seconds_sum{rank=\"2\",kind=\"all_reduce\"} 0.020600000") &&
       has_line(t, "ddp_call_duration_seconds_count{rank=\"2\",kind=\"all_reduce\"} 130") &&
       has_line(t, "ddp_bus_bandwidth_bytes_per_second{rank=\"2\",kind=\"all_reduce\"} 30720000") &&
       has_line(t, "ddp_bus_bandwidth_bytes_per_second{rank=\"2\",kind=\"all_gather\"} 786432000") &&
       !strstr(t, "ddp_bus_bandwidth_bytes_per_second{rank=\"2\",kind=\"broadcast\"}") &&
       !strstr(t, "ddp_bus_bandwidth_bytes_per_second{rank=\"2\",kind=\"barrier\"}") &&
       has_line(t, "ddp_straggler_last_rank{rank=\"2\",kind=\"all_reduce\"} 3") &&
       has_line(t, "ddp_straggler_last_arrivals{rank=\"2\",kind=\"all_reduce\",peer=\"3\"} 912") &&
       has_line(t, "ddp_straggler_warning{rank=\"2\",kind=\"all_reduce\"} 1") &&
       has_line(t, "ddp_peer_up{rank=\"2\",peer=\"1\",side=\"left\",state=\"ok\"} 1") &&
       has_line(t, "ddp_peer_up{rank=\"2\",peer=\"3\",side=\"right\",state=\"silent\"} 0") &&
       has_line(t, "ddp_peer_heartbeat_age_seconds{rank=\"2\",peer=\"3\",side=\"right\"} 7.04") &&
       has_line(t, "ddp_heartbeat_bytes_total{rank=\"2\",direction=\"received\"} 5678") &&
       count_lines(t, "ddp_calls_total{") == _DDP_NUM_KINDS - 1 &&
       count_lines(t, "# TYPE ") == count_lines(t, "# HELP ") &&
       count_lines(t, "ddp_call_duration_seconds_bucket{") == (_DDP_NUM_KINDS - 1) * _DDP_STATS_BUCKETS,
       "every kind: counters, cumulative buckets, exact _sum, busbw of all_reduce and all_gather only, "
       "straggler figures, neighbours, heartbeat bytes");
    if (t) free(t);
    snprintf(args, sizeof args,
             "--rank 2 "
             "'ddp_calls_total{kind=all_reduce}=130' 'ddp_calls_total{kind=all_to_all}=270' "
             "'ddp_call_errors_total{kind=all_reduce}=3' 'ddp_call_bytes_total{kind=all_reduce}=532480' "
             "'ddp_call_duration_seconds_count{kind=all_reduce}=130' "
             "'ddp_call_duration_seconds_count{kind=all_gather}=140' "
             "'ddp_call_duration_seconds_bucket{kind=all_reduce,le=3e-05}=20' "
             "'ddp_call_duration_seconds_bucket{kind=all_reduce,le=0.0003}=120' "
             "'ddp_call_duration_seconds_sum{kind=all_reduce}=0.0206' "
             "'ddp_bus_bandwidth_bytes_per_second{kind=all_reduce}=30720000' "
             "'ddp_bus_bandwidth_bytes_per_second{kind=all_gather}=786432000' "
             "'ddp_bus_bandwidth_bytes_per_second{kind=broadcast}=absent' "
             "'ddp_straggler_last_rank{kind=all_reduce}=3' 'ddp_straggler_last_rank_calls=912' "
             "'ddp_straggler_lag_seconds=0.012' 'ddp_straggler_call_interval_seconds=0.046' "
             "'ddp_straggler_lag_ratio=0.26' 'ddp_straggler_warning=1' 'ddp_straggler_window_calls=1000' "
             "'ddp_straggler_analysed_calls_total=123456' "
             "'ddp_straggler_last_arrivals{peer=0}=10' 'ddp_straggler_last_arrivals{peer=3}=912' "
             "'ddp_peer_up{peer=1,side=left,state=ok}=1' 'ddp_peer_up{peer=3,state=silent}=0' "
             "'ddp_peer_heartbeat_age_seconds{peer=1}=0.12' 'ddp_peer_heartbeat_age_seconds{peer=3}=7.04' "
             "'ddp_heartbeat_bytes_total{direction=sent}=1234' 'ddp_heartbeat_bytes_total{direction=received}=5678' "
             "'ddp_info{version=0.2,transport=shm+tcp,size=4}=1' 'ddp_communicator_failed=0'");
    parser_check(path, args, 1, "every kind: parses; histograms cumulative, _count = timed calls; the values");
}

static void test_huge_and_failed(void) {
    static _ddp_metrics_in_t in;
    char path[400], *t;
    int k, b;
    memset(&in, 0, sizeof in);
    in.rank = 5; in.size = 8; in.transport = "tcp"; in.version = "0.2"; in.failed = 1;
    for (k = 1; k < _DDP_NUM_KINDS; k++) {
        _ddp_kind_stats_t *s = &in.now[k];
        s->calls = s->errors = s->bytes = s->timed = s->ns = UINT64_MAX;
        for (b = 0; b < _DDP_STATS_BUCKETS; b++) s->bucket[b] = UINT64_MAX / 4;   /* adds past 2^64 */
    }
    in.peer[0].rank = 4; in.peer[0].state = "unreachable"; in.peer[0].ms = 10000;
    in.peer[1].rank = 6; in.peer[1].state = "connecting"; in.peer[1].ms = -1;
    in.hb_sent_bytes = in.hb_recv_bytes = UINT64_MAX;
    snprintf(path, sizeof path, "%s/huge.prom", t_dir);
    write_ok(path, &in, "counters at 2^64 - 1, failed");
    t = slurp(path);
    ok(t && has_line(t, "ddp_calls_total{rank=\"5\",kind=\"barrier\"} 18446744073709551615") &&
       has_line(t, "ddp_call_duration_seconds_sum{rank=\"5\",kind=\"barrier\"} 18446744073.709551615") &&
       has_line(t, "ddp_call_duration_seconds_bucket{rank=\"5\",kind=\"barrier\",le=\"1e-05\"} 4611686018427387903") &&
       has_line(t, "ddp_call_duration_seconds_bucket{rank=\"5\",kind=\"barrier\",le=\"+Inf\"} 18446744073709551615") &&
       has_line(t, "ddp_communicator_failed{rank=\"5\"} 1") &&
       has_line(t, "ddp_peer_up{rank=\"5\",peer=\"4\",side=\"left\",state=\"unreachable\"} 0") &&
       has_line(t, "ddp_peer_up{rank=\"5\",peer=\"6\",side=\"right\",state=\"connecting\"} 0") &&
       !strstr(t, "ddp_peer_heartbeat_age_seconds{rank=\"5\",peer=\"6\"") &&
       has_line(t, "ddp_bus_bandwidth_bytes_per_second{rank=\"5\",kind=\"all_reduce\"} 1750000000") &&
       !strstr(t, "ddp_bus_bandwidth_bytes_per_second{rank=\"5\",kind=\"barrier\"}"),
       "2^64 - 1: printed whole, buckets saturate instead of wrapping; failed = 1; a neighbour never "
       "heard has no age; the first refresh's bandwidth counts from zero (as many bytes as ns: 1e9 x 7/4)");
    if (t) free(t);
    parser_check(path,
                 "--rank 5 'ddp_calls_total{kind=recv}=18446744073709551615' "
                 "'ddp_call_duration_seconds_count{kind=recv}=18446744073709551615' 'ddp_communicator_failed=1' "
                 "'ddp_peer_up{peer=4,state=unreachable}=0' 'ddp_peer_heartbeat_age_seconds{peer=4}=10' "
                 "'ddp_peer_heartbeat_age_seconds{peer=6}=absent'",
                 1, "counters at 2^64 - 1, failed: parses; the values");
}

static void test_bounded(void) {
    static _ddp_metrics_in_t in;
    static uint32_t counts[2000];
    char path[400], *t;
    struct stat st;
    int i;
    memset(&in, 0, sizeof in);
    in.rank = 0; in.size = 2000; in.transport = "tcp"; in.version = "0.2";
    in.peer[0].rank = 1999; in.peer[0].state = "ok"; in.peer[0].ms = 0;
    in.peer[1].rank = 1; in.peer[1].state = "closed"; in.peer[1].ms = 3;
    fill_kind(&in.now[DDP_CALL_ALL_REDUCE], 1000, 8, 5000);
    for (i = 1500; i < 2000; i += 10) counts[i] = 20;
    in.straggler.valid = 1; in.straggler.kind = 0; in.straggler.window = 1000; in.straggler.last_rank = -1;
    in.straggler.share = 0.0 / 1.0; in.straggler.last_counts = counts; in.straggler.n = 2000;
    snprintf(path, sizeof path, "%s/big.prom", t_dir);
    write_ok(path, &in, "2,000 ranks");
    t = slurp(path);
    if (stat(path, &st)) st.st_size = -1;
    ok(t && count_lines(t, "ddp_straggler_last_arrivals{") == 1024 + 50 &&
       has_line(t, "ddp_straggler_last_arrivals{rank=\"0\",kind=\"none\",peer=\"1023\"} 0") &&
       !strstr(t, "peer=\"1024\"") && has_line(t, "ddp_straggler_last_arrivals{rank=\"0\",kind=\"none\",peer=\"1990\"} 20") &&
       has_line(t, "ddp_straggler_last_rank{rank=\"0\",kind=\"none\"} -1") && st.st_size > 0 &&
       st.st_size < 200000,
       "2,000 ranks: straggler figures for the first 1,024 and the 50 beyond that were last (%d lines, %lld bytes)",
       t ? count_lines(t, "ddp_straggler_last_arrivals{") : -1, (long long)st.st_size);
    if (t) free(t);
    parser_check(path, "--rank 0 'ddp_straggler_last_rank=-1' 'ddp_peer_up{peer=1,state=closed}=0'", 1,
                 "2,000 ranks: parses");
}

static void test_escaping(void) {
    static _ddp_metrics_in_t in;
    char path[400], *t;
    memset(&in, 0, sizeof in);
    in.rank = 1; in.size = 2; in.transport = "a\"b\\c\nd"; in.version = "0.2-\"x\"";
    in.job = "torchrun \"7\"";
    in.peer[0].rank = 0; in.peer[0].state = "ok"; in.peer[0].ms = 1;
    in.peer[1].rank = 0; in.peer[1].state = "ok"; in.peer[1].ms = 2;
    snprintf(path, sizeof path, "%s/esc.prom", t_dir);
    write_ok(path, &in, "escaping");
    t = slurp(path);
    ok(t && has_line(t, "ddp_info{rank=\"1\",job_id=\"torchrun \\\"7\\\"\",version=\"0.2-\\\"x\\\"\","
                        "transport=\"a\\\"b\\\\c\\nd\",size=\"2\"} 1") &&
       has_line(t, "ddp_peer_up{rank=\"1\",job_id=\"torchrun \\\"7\\\"\",peer=\"0\",side=\"left\",state=\"ok\"} 1") &&
       has_line(t, "ddp_peer_up{rank=\"1\",job_id=\"torchrun \\\"7\\\"\",peer=\"0\",side=\"right\",state=\"ok\"} 1") &&
       count_lines(t, "ddp_") == 8,
       "label values escaped (\\\", \\\\, \\n); the job on every series; a world of 2: one neighbour on both "
       "sides, two series");
    if (t) free(t);
    parser_check(path, "--rank 1 --job 'torchrun \"7\"' 'ddp_peer_up{side=left}=1' 'ddp_peer_up{side=right}=1'", 1,
                 "escaping: parses (no series twice)");
}

/* Broken files: each must be refused by the parser check (which otherwise would prove nothing). */
static void test_parser_refuses(void) {
    char good[400], bad[400], *t, *p, *q;
    FILE *f;
    snprintf(good, sizeof good, "%s/all.prom", t_dir);
    if (!(t = slurp(good))) { ok(0, "read %s", good); return; }
    snprintf(bad, sizeof bad, "%s/bad_type.prom", t_dir);
    p = strstr(t, "# TYPE ddp_calls_total counter\n");
    if ((f = fopen(bad, "w"))) {
        if (p) { fwrite(t, 1, (size_t)(p - t), f); fputs(p + strlen("# TYPE ddp_calls_total counter\n"), f); }
        fclose(f);
    }
    parser_check(bad, "--rank 2", 0, "a family without its TYPE line is refused");
    snprintf(bad, sizeof bad, "%s/bad_buckets.prom", t_dir);
    p = strstr(t, "ddp_call_duration_seconds_bucket{rank=\"2\",kind=\"all_reduce\",le=\"0.0003\"} 120\n");
    if ((f = fopen(bad, "w"))) {
        if (p) {
            q = p + strlen("ddp_call_duration_seconds_bucket{rank=\"2\",kind=\"all_reduce\",le=\"0.0003\"} ");
            fwrite(t, 1, (size_t)(q - t), f);
            fputs("10", f);   /* the buckets before say 20 */
            fputs(q + 3, f);
        }
        fclose(f);
    }
    parser_check(bad, "--rank 2", 0, "buckets that are not cumulative are refused");
    snprintf(bad, sizeof bad, "%s/bad_cut.prom", t_dir);
    if ((f = fopen(bad, "w"))) { fwrite(t, 1, strlen(t) / 2, f); fclose(f); }
    parser_check(bad, "--rank 2", 0, "a file cut in the middle is refused");
    free(t);
}

/* A reader reading the file over and over while it is rewritten. */
typedef struct {
    const char *path;
    int stop, reads, partial;        /* stop and reads: atomics (the two threads share them) */
    char first_partial[160];
} reader_t;

static void *reader(void *arg) {
    reader_t *r = (reader_t *)arg;
    static const char last[] = "ddp_heartbeat_bytes_total{rank=\"0\",direction=\"received\"} 7\n";
    while (!__atomic_load_n(&r->stop, __ATOMIC_ACQUIRE)) {
        char *t = slurp(r->path);
        size_t n;
        if (!t) continue;   /* before the first file */
        n = strlen(t);
        if (n < sizeof last - 1 || strcmp(t + n - (sizeof last - 1), last) || strncmp(t, "# HELP ddp_info", 15)) {
            if (!r->partial++) snprintf(r->first_partial, sizeof r->first_partial, "%zu bytes", n);
        }
        __atomic_fetch_add(&r->reads, 1, __ATOMIC_RELAXED);
        free(t);
    }
    return NULL;
}

static void test_whole_files(void) {
    static _ddp_metrics_in_t in;
    static uint32_t counts[1024];
    reader_t r;
    pthread_t th;
    char path[512], err[700], tmpd[400];
    int writes = 0, bad = 0, left = 0, i;
    double t0 = t_now();
    DIR *d;
    struct dirent *e;
    memset(&in, 0, sizeof in);
    in.rank = 0; in.size = 1024; in.transport = "tcp"; in.version = "0.2"; in.hb_recv_bytes = 7;
    for (i = 1; i < _DDP_NUM_KINDS; i++) fill_kind(&in.now[i], 1000, 8, 5000);
    in.straggler.valid = 1; in.straggler.kind = DDP_CALL_ALL_REDUCE; in.straggler.last_counts = counts; in.straggler.n = 1024;
    snprintf(tmpd, sizeof tmpd, "%s/whole", t_dir);
    mkdir(tmpd, 0755);
    snprintf(path, sizeof path, "%s/ddp.0.prom", tmpd);
    memset(&r, 0, sizeof r);
    r.path = path;
    if (pthread_create(&th, NULL, reader, &r)) { ok(0, "pthread_create"); return; }
    /* until the reader has read 300 times (bounded: 60 s, 100,000 writes) */
    while ((__atomic_load_n(&r.reads, __ATOMIC_RELAXED) < 300 || writes < 300) && writes < 100000 && t_now() - t0 < 60) {
        for (i = 0; i < 1024; i++) counts[i] = (uint32_t)(writes + i);
        if (_ddp_metrics_write_file(path, &in, err, sizeof err)) bad++;
        writes++;
    }
    __atomic_store_n(&r.stop, 1, __ATOMIC_RELEASE);
    pthread_join(th, NULL);
    if ((d = opendir(tmpd))) {
        while ((e = readdir(d))) if (e->d_name[0] != '.' && strcmp(e->d_name, "ddp.0.prom")) left++;
        closedir(d);
    }
    ok(!bad && r.reads > 0 && !r.partial && !left,
       "whole files only: %d reads while it was rewritten %d times, %d partial%s%s; %d other files left beside it",
       r.reads, writes, r.partial, r.partial ? ", the first: " : "", r.first_partial, left);
    snprintf(path, sizeof path, "%s/no/such/dir/ddp.prom", t_dir);
    err[0] = 0;
    ok(_ddp_metrics_write_file(path, &in, err, sizeof err) == -1 && strstr(err, path) && strstr(err, "No such file"),
       "a directory that does not exist: an error naming the file (%s)", err);
    snprintf(path, sizeof path, "%s", tmpd);   /* a directory as the file: the rename fails */
    err[0] = 0;
    left = 0;
    i = _ddp_metrics_write_file(path, &in, err, sizeof err);
    if ((d = opendir(t_dir))) {
        while ((e = readdir(d))) if (strstr(e->d_name, ".tmp")) left++;
        closedir(d);
    }
    ok(i == -1 && strstr(err, "rename") && !left, "a directory in the file's place: refused, no temporary left (%s)", err);
}

int main(void) {
    t_init();
    snprintf(t_dir, sizeof t_dir, "%s/test_metrics.%d", t_tmpdir(), (int)getpid());
    if (mkdir(t_dir, 0755) && errno != EEXIST) t_bail("mkdir %s: %s", t_dir, strerror(errno));
    find_python();
    diag("parser: %s", *py ? py : "none (the parser checks skip)");
    if (t_selected("names")) test_names();
    if (t_selected("none")) test_no_calls();
    if (t_selected("all")) test_all_kinds();
    if (t_selected("huge")) test_huge_and_failed();
    if (t_selected("bounded")) test_bounded();
    if (t_selected("escaping")) test_escaping();
    if (t_selected("all")) test_parser_refuses();
    if (t_selected("whole")) test_whole_files();
    return t_done();
}
