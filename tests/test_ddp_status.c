/* SPDX-License-Identifier: MIT (see LICENSE) */
/* tests/test_ddp_status.c — ddp-status (tools/ddp_status.c), the tool that asks a running job how
 * each rank is. Prints TAP.
 *
 * This process serves a store (with a job secret) and writes the keys the ranks' health threads
 * write (STATUS lines, the STRAGGLER line, ddp-status/current) for made-up jobs; a thread keeps
 * the ticks of the ranks meant to be alive moving, as health threads do. Then it runs the tool
 * (the build/ddp-status beside this program: build/san/ has its own, with the sanitizers) and
 * checks its lines, its verdict, its exit status, and its --json with python3's json module:
 *   - stuck: rank 2 of 4 does not tick, the others wait in all_reduce #1234: named as not
 *     answering, last heard 7.0 s ago by ranks 1 and 3, the others waiting for it; exit 1
 *   - busy: rank 1 in user code for 62 s (ticking), the others in all_reduce #1234: named with
 *     where it is, "answering", the others waiting for it; exit 0; the store found from
 *     DDP_LAUNCHER_STORE when no address is given
 *   - straggler: all in user code, the STRAGGLER line of rank 3: the verdict names it; exit 0
 *   - failed: rank 3's line with error=: the verdict quotes the error; exit 1; --prefix and
 *     --wait-ms 0: the ranks "not seen to tick yet"
 *   - unreachable: a neighbour says so of a rank that does not tick: "unreachable"; and of one
 *     that ticks: "cannot reach ... though it answers"
 *   - malformed lines (truncated, binary with NULs, 1 MiB, a word for a number, another rank's)
 *     and a missing one: "unreadable status" / "no status", no crash, exit 1
 *   - worlds of 2 (one neighbour on both sides, said once) and 1
 *   - 1,024 ranks, all in a call, and again with one of them stuck: the condensed lines and the
 *     verdict, within 2 s (the bound), default --wait-ms
 *   - the store does not answer (a port that listens and never accepts, as a stopped rank 0's
 *     does; a port nobody listens on), a wrong secret, a store without a job: exit 2, saying so
 *     with the address.
 */
#define _GNU_SOURCE
#include "ddp.h"
#include "tests/ddp_test.h"

#include <pthread.h>

#define SECRET "test-ddp-status-secret-0123456789"
#define MAXN 1024

/* ---------------------------------------------------------------- the made-up job */
typedef struct {
    char rest[512];           /* the line after "v=1 rank=K size=N tick=T " */
    int live;                 /* its tick moves */
    long long tick;
} fake_rank_t;

static struct {
    pthread_mutex_t mu;
    int n, stop;
    char prefix[64];
    fake_rank_t r[MAXN];
} J = {PTHREAD_MUTEX_INITIALIZER, 0, 0, "", {{"", 0, 0}}};

static ddp_store_t *srv;      /* the store, served here */
static int port;
static char tool[512];

static void put_line(ddp_store_t *st, int k) {
    char key[128], line[700];
    snprintf(key, sizeof key, "%s/health/s/%d", J.prefix, k);
    snprintf(line, sizeof line, "v=1 rank=%d size=%d tick=%lld %s", k, J.n, J.r[k].tick, J.r[k].rest);
    ddp_store_set(st, key, line, strlen(line));
}

/* As a health thread: every rank that is live gets its next tick, again and again. */
static void *ticker(void *arg) {
    ddp_store_t *st = (ddp_store_t *)arg;
    for (;;) {
        int k, n;
        pthread_mutex_lock(&J.mu);
        if (J.stop) { pthread_mutex_unlock(&J.mu); return NULL; }
        n = J.n;
        for (k = 0; k < n; k++)
            if (J.r[k].live) { J.r[k].tick++; put_line(st, k); }
        pthread_mutex_unlock(&J.mu);
        t_sleep_ms(50);
    }
}

/* A new job of n ranks under a new prefix, everyone in all_reduce #seq, live; ddp-status/current
 * names it. */
static void job_begin(const char *name, int n, long long seq) {
    int k;
    char v[128];
    pthread_mutex_lock(&J.mu);
    J.n = 0;
    snprintf(J.prefix, sizeof J.prefix, "libddp/%s/attempt_0", name);
    for (k = 0; k < n; k++) {
        snprintf(J.r[k].rest, sizeof J.r[k].rest,
                 "pid=%d host=node%d period_ms=500 hb_timeout_ms=10000 state=call kind=all_reduce seq=%lld "
                 "bytes=4096 for_ms=%d peer=%d left=%d left_state=ok left_ms=120 right=%d right_state=ok right_ms=130 "
                 "calls=%lld errors=0 recent=256 recent_p50_us=830 recent_max_us=12000",
                 1000 + k, k / 8, seq, 7000 + k, (k + n - 1) % n, (k + n - 1) % n, (k + 1) % n, seq);
        J.r[k].live = 1;
        J.r[k].tick = 50;
    }
    snprintf(v, sizeof v, "%s %d", J.prefix, n);
    ddp_store_set(srv, "ddp-status/current", v, strlen(v));
    pthread_mutex_unlock(&J.mu);
}

/* Rank k's line after tick: printf-style; live: whether it ticks. */
static void rank_set(int k, int live, const char *fmt, ...) T_PRINTF(3, 4);
static void rank_set(int k, int live, const char *fmt, ...) {
    va_list ap;
    pthread_mutex_lock(&J.mu);
    va_start(ap, fmt);
    vsnprintf(J.r[k].rest, sizeof J.r[k].rest, fmt, ap);
    va_end(ap);
    J.r[k].live = live;
    pthread_mutex_unlock(&J.mu);
}

/* Writes every rank's line once (the frozen ones get their only line here), then lets the
 * ticker go. */
static void job_go(int n) {
    int k;
    pthread_mutex_lock(&J.mu);
    J.n = n;
    for (k = 0; k < n; k++) put_line(srv, k);
    pthread_mutex_unlock(&J.mu);
}

/* ---------------------------------------------------------------- running the tool */
typedef struct {
    int rc;                   /* exit status, or 128 + signal */
    double secs;
    char *out;                /* stdout */
    char err[4096];           /* stderr */
} run_t;

static void run_tool(run_t *r, const char *env, const char *args) {
    char cmd[2048], errpath[512];
    size_t cap = 1 << 16, len = 0, got;
    FILE *f;
    int st;
    double t0 = t_now();
    snprintf(errpath, sizeof errpath, "%s/ddp-status.err", t_tmpdir());
    snprintf(cmd, sizeof cmd, "%s %s %s 2>%s", env, tool, args, errpath);
    r->out = (char *)malloc(cap);
    r->out[0] = 0;
    r->err[0] = 0;
    fflush(stdout);
    f = popen(cmd, "r");
    if (!f) { r->rc = -1; return; }
    while ((got = fread(r->out + len, 1, cap - len - 1, f)) > 0) {
        len += got;
        if (len + 1 == cap) { cap *= 2; r->out = (char *)realloc(r->out, cap); }
    }
    r->out[len] = 0;
    st = pclose(f);
    r->secs = t_now() - t0;
    r->rc = WIFEXITED(st) ? WEXITSTATUS(st) : WIFSIGNALED(st) ? 128 + WTERMSIG(st) : -1;
    if ((f = fopen(errpath, "r"))) {
        got = fread(r->err, 1, sizeof r->err - 1, f);
        r->err[got] = 0;
        fclose(f);
    }
}

static void run_free(run_t *r) { free(r->out); r->out = NULL; }

/* The store's address and the secret, as a user gives them. */
static void ask(run_t *r, const char *args) {
    char a[600];
    snprintf(a, sizeof a, "127.0.0.1:%d %s", port, args);
    run_tool(r, "DDP_JOB_SECRET=" SECRET, a);
}

/* The line of the output that starts with `start` ("" if none). */
static const char *line_of(const run_t *r, const char *start, char *buf, size_t cap) {
    const char *p = r->out;
    size_t n = strlen(start);
    buf[0] = 0;
    while (p && *p) {
        const char *e = strchr(p, '\n');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        if (len >= n && !strncmp(p, start, n)) {
            if (len >= cap) len = cap - 1;
            memcpy(buf, p, len);
            buf[len] = 0;
            return buf;
        }
        p = e ? e + 1 : NULL;
    }
    return buf;
}

static void show(const run_t *r) {
    const char *p = r->out;
    diag("exit %d after %.2f s; stdout:", r->rc, r->secs);
    while (p && *p) {
        const char *e = strchr(p, '\n');
        diag("  %.*s", (int)(e ? e - p : (long)strlen(p)), p);
        p = e ? e + 1 : NULL;
    }
    if (r->err[0]) diag("stderr: %s", r->err);
}

/* Checks the verdict line equals `want` and the exit status; shows the output when not. */
static int check_verdict(const run_t *r, const char *name, const char *want, int rc) {
    char v[4096];
    int good;
    line_of(r, "verdict: ", v, sizeof v);
    good = ok(!strcmp(v, want) && r->rc == rc, "%s: the verdict and exit %d", name, rc);
    if (!good) { diag("want: %s", want); diag("got:  %s", v); }
    if (!good || getenv("T_SHOW")) show(r);   /* T_SHOW=1: every output (docs take examples from it) */
    return good;
}

static int have_python(void) {
    static int h = -1;
    if (h < 0) h = system("python3 -c 'import json' >/dev/null 2>&1") == 0;
    return h;
}

/* --json: parsed by python3; prints "answering=<per rank 1/0/->;verdict=<...>;exit=<n>". */
static void json_summary(const char *args, char *sum, size_t cap) {
    char path[512], cmd[2048];
    run_t r;
    FILE *f;
    size_t got;
    sum[0] = 0;
    ask(&r, args);
    snprintf(path, sizeof path, "%s/status.json", t_tmpdir());
    if ((f = fopen(path, "w"))) { fputs(r.out, f); fclose(f); }
    snprintf(cmd, sizeof cmd,
             "python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); "
             "m={True:\"1\",False:\"0\",None:\"-\"}; "
             "a=\"\".join(m[x[\"answering\"]] for x in d[\"ranks\"]); "
             "assert len(d[\"ranks\"])==d[\"size\"]; "
             "print(\"answering=%%s;verdict=%%s;exit=%%d\" %% (a, d[\"verdict\"], d[\"exit\"]))' %s 2>&1", path);
    if ((f = popen(cmd, "r"))) {
        got = fread(sum, 1, cap - 1, f);
        sum[got] = 0;
        if (got && sum[got - 1] == '\n') sum[got - 1] = 0;
        pclose(f);
    }
    if (r.rc != 0 && r.rc != 1) show(&r);
    run_free(&r);
}

static void check_json(const char *name, const char *args, const char *answering, const char *verdict_line, int rc) {
    char want[4096], got[8192];
    if (!have_python()) { ok(1, "# SKIP %s --json: no python3", name); return; }
    json_summary(args, got, sizeof got);
    snprintf(want, sizeof want, "answering=%s;verdict=%s;exit=%d", answering, verdict_line + strlen("verdict: "), rc);
    if (!ok(!strcmp(got, want), "%s --json: parses; answering per rank, verdict and exit as the text's", name)) {
        diag("want: %s", want);
        diag("got:  %s", got);
    }
}

/* ---------------------------------------------------------------- scenarios */
static void stuck(void) {
    run_t r;
    char l[4096];
    const char *v = "verdict: rank 2 is not answering (last heartbeat 7.0 s ago, seen by ranks 1 and 3); "
                    "ranks 0, 1, 3 wait for it in all_reduce #1234";
    job_begin("stuck", 4, 1234);
    rank_set(1, 1, "pid=1001 host=node0 period_ms=500 hb_timeout_ms=10000 state=call kind=all_reduce seq=1234 "
                   "bytes=4096 for_ms=7100 peer=0 left=0 left_state=ok left_ms=100 right=2 right_state=silent "
                   "right_ms=7040 calls=1234");
    rank_set(2, 0, "pid=1002 host=node0 period_ms=500 hb_timeout_ms=10000 state=user seq=1233 for_ms=40 "
                   "left=1 left_state=ok left_ms=90 right=3 right_state=ok right_ms=80 calls=1233");
    rank_set(3, 1, "pid=1003 host=node0 period_ms=500 hb_timeout_ms=10000 state=call kind=all_reduce seq=1234 "
                   "bytes=4096 for_ms=7050 peer=2 left=2 left_state=silent left_ms=7000 right=0 right_state=ok "
                   "right_ms=100 calls=1234");
    job_go(4);
    ask(&r, "");
    check_verdict(&r, "stuck: rank 2 of 4 does not tick", v, 1);
    line_of(&r, "rank 2 ", l, sizeof l);
    if (!ok(strstr(l, "NOT ANSWERING") && strstr(l, "in user code since 40 ms") &&
            strstr(l, "heartbeat seen by rank 1 7.0 s ago (silent), rank 3 7.0 s ago (silent)"),
            "stuck: rank 2's line: where it was, what its neighbours hear, NOT ANSWERING"))
        show(&r);
    line_of(&r, "rank 3 ", l, sizeof l);
    if (!ok(strstr(l, "in all_reduce #1234 (4.0 KiB) for 7.0 s, waiting on rank 2") && strstr(l, "; answering"),
            "stuck: rank 3's line: in all_reduce #1234 waiting on rank 2, answering"))
        show(&r);
    ok(strstr(r.out, "job libddp/stuck/attempt_0 at 127.0.0.1:") != NULL, "stuck: the first line names the job and the store");
    run_free(&r);
    check_json("stuck", "--json", "1101", v, 1);
}

static void busy(void) {
    run_t r;
    const char *v = "verdict: rank 1 is in user code since 62.0 s (answering); ranks 0, 2, 3 wait for it in "
                    "all_reduce #1234";
    job_begin("busy", 4, 1234);
    rank_set(1, 1, "pid=1001 host=node0 period_ms=500 hb_timeout_ms=10000 state=user seq=1233 for_ms=62000 "
                   "left=0 left_state=ok left_ms=100 right=2 right_state=ok right_ms=100");
    job_go(4);
    ask(&r, "");
    check_verdict(&r, "busy: rank 1 in user code for 62 s, ticking", v, 0);
    ok(strstr(r.out, "rank 1 (node0 pid 1001): in user code since 62.0 s (after #1233)") != NULL,
       "busy: rank 1's line says where it is");
    run_free(&r);
    {   /* no address: DDP_LAUNCHER_STORE's, as in a rank's environment */
        char env[256];
        snprintf(env, sizeof env, "DDP_JOB_SECRET=%s DDP_LAUNCHER_STORE=127.0.0.1:%d", SECRET, port);
        run_tool(&r, env, "");
        check_verdict(&r, "busy, the store from DDP_LAUNCHER_STORE", v, 0);
        run_free(&r);
    }
    check_json("busy", "--json", "1111", v, 0);
}

static void straggler(void) {
    run_t r;
    int k;
    const char *s = "v=1 window=1000 analysed=123456 kind=all_reduce last_rank=3 last_count=912 median_lag_us=12000 "
                    "median_interval_us=46000 share=0.26 warn=1 last_counts=10,40,38,912";
    const char *v = "verdict: all ranks in user code; slowest to arrive in the last 1,000 calls: rank 3 (912 of "
                    "1,000, a median 12 ms after the others, 26% of the time between calls)";
    char key[128];
    job_begin("straggler", 4, 0);
    for (k = 0; k < 4; k++)
        rank_set(k, 1, "pid=%d host=node0 period_ms=500 state=user seq=56 for_ms=%d left=%d left_state=ok "
                       "left_ms=10 right=%d right_state=ok right_ms=10", 1000 + k, 30 + k, (k + 3) % 4, (k + 1) % 4);
    snprintf(key, sizeof key, "%s/health/straggler", J.prefix);
    ddp_store_set(srv, key, s, strlen(s));
    job_go(4);
    ask(&r, "");
    check_verdict(&r, "straggler: all in user code, rank 3 last most often", v, 0);
    run_free(&r);
    check_json("straggler", "--json", "1111", v, 0);
    if (have_python()) {
        char cmd[1024], path[512], out[256] = "";
        FILE *f;
        ask(&r, "--json");
        snprintf(path, sizeof path, "%s/s.json", t_tmpdir());
        if ((f = fopen(path, "w"))) { fputs(r.out, f); fclose(f); }
        snprintf(cmd, sizeof cmd, "python3 -c 'import json,sys; s=json.load(open(sys.argv[1]))[\"straggler\"]; "
                                  "print(s[\"last_rank\"], s[\"last_count\"], s[\"share\"], s[\"last_counts\"])' %s 2>&1", path);
        if ((f = popen(cmd, "r"))) { if (!fgets(out, sizeof out, f)) out[0] = 0; pclose(f); }
        ok(!strcmp(out, "3 912 0.26 10,40,38,912\n"), "straggler --json: the straggler object's fields (%s)", out);
        run_free(&r);
    }
}

static void failed(void) {
    run_t r;
    const char *v = "verdict: rank 3 failed: rank 3: all_reduce #7, phase all-gather step 1/3: tcp: rank 2 closed "
                    "the connection";
    job_begin("failed", 4, 8);
    rank_set(3, 1, "pid=1003 host=node0 period_ms=500 state=failed kind=all_reduce seq=7 for_ms=10 left=2 "
                   "left_state=ok left_ms=100 right=0 right_state=ok right_ms=100 error=rank 3: all_reduce #7, "
                   "phase all-gather step 1/3: tcp: rank 2 closed the connection");
    job_go(4);
    ask(&r, "");
    check_verdict(&r, "failed: rank 3's line has error=", v, 1);
    run_free(&r);
    check_json("failed", "--json", "1111", v, 1);
    /* a job by its prefix (its size from rank 0's line, not ddp-status/current), watched for no time */
    ask(&r, "--prefix libddp/failed/attempt_0 --wait-ms 0");
    check_verdict(&r, "--prefix, --wait-ms 0",
                  "verdict: ranks 0-3: not seen to tick yet (ask again with a longer --wait-ms)", 1);
    ok(!strncmp(r.out, "job libddp/failed/attempt_0 at 127.0.0.1:", 41) && strstr(r.out, ": 4 ranks, asked in "),
       "--prefix: that job, its size from rank 0's line");
    run_free(&r);
}

static void unreachable(void) {
    run_t r;
    const char *v = "verdict: rank 2 is unreachable (rank 1 has had nothing acknowledged for 12.0 s); ranks 0, 1, 3 "
                    "wait for it in all_reduce #5";
    const char *v2 = "verdict: rank 1 cannot reach rank 2 (nothing acknowledged for 11.0 s), though rank 2 answers";
    job_begin("unreachable", 4, 5);
    rank_set(1, 1, "pid=1001 host=node0 period_ms=500 state=call kind=all_reduce seq=5 for_ms=12500 peer=0 left=0 "
                   "left_state=ok left_ms=100 right=2 right_state=unreachable right_ms=12000");
    rank_set(2, 0, "pid=1002 host=node1 period_ms=500 state=call kind=all_reduce seq=5 for_ms=100 peer=1 left=1 "
                   "left_state=ok left_ms=100 right=3 right_state=ok right_ms=100");
    rank_set(3, 1, "pid=1003 host=node0 period_ms=500 state=call kind=all_reduce seq=5 for_ms=12500 peer=2 left=2 "
                   "left_state=unreachable left_ms=11900 right=0 right_state=ok right_ms=100");
    job_go(4);
    ask(&r, "");
    check_verdict(&r, "unreachable: a neighbour says so of a rank that does not tick", v, 1);
    run_free(&r);
    /* the same link report about a rank that ticks (the store reaches it, its neighbour does not) */
    job_begin("unreachable-link", 4, 5);
    rank_set(1, 1, "pid=1001 host=node0 period_ms=500 state=user seq=4 for_ms=500 left=0 left_state=ok left_ms=100 "
                   "right=2 right_state=unreachable right_ms=11000");
    rank_set(0, 1, "pid=1000 host=node0 period_ms=500 state=user seq=4 for_ms=500 left=3 left_state=ok left_ms=100 "
                   "right=1 right_state=ok right_ms=100");
    rank_set(2, 1, "pid=1002 host=node1 period_ms=500 state=user seq=4 for_ms=500 left=1 left_state=ok left_ms=100 "
                   "right=3 right_state=ok right_ms=100");
    rank_set(3, 1, "pid=1003 host=node0 period_ms=500 state=user seq=4 for_ms=500 left=2 left_state=ok left_ms=100 "
                   "right=0 right_state=ok right_ms=100");
    job_go(4);
    ask(&r, "");
    check_verdict(&r, "unreachable: a neighbour says so of a rank that ticks", v2, 1);
    run_free(&r);
}

static void malformed(void) {
    run_t r;
    char key[128], big[1 << 20], l[4096];
    static const char garbage[] = "\x01\x02v=1\0rank=2 tick=\xff\xfe";
    int k;
    const char *v = "verdict: rank 6: no status; ranks 1-5: unreadable status";
    job_begin("malformed", 7, 3);
    job_go(7);
    pthread_mutex_lock(&J.mu);
    for (k = 1; k <= 6; k++) J.r[k].live = 0;
    pthread_mutex_unlock(&J.mu);   /* the ticker writes under the lock: from here on it leaves them */
#define SETRAW(k, s, n) (snprintf(key, sizeof key, "%s/health/s/%d", J.prefix, k), ddp_store_set(srv, key, s, n))
    SETRAW(1, "v=1 rank=1 si", 13);                                  /* truncated */
    SETRAW(2, garbage, sizeof garbage - 1);                                         /* binary, a NUL */
    memset(big, 'x', sizeof big);
    memcpy(big, "v=1 rank=3 tick=1 state=user ", 29);
    SETRAW(3, big, sizeof big);                                      /* 1 MiB */
    SETRAW(4, "v=1 rank=4 tick=abc state=user", 30);                 /* a word for a number */
    SETRAW(5, "v=1 rank=0 tick=9 state=user", 28);                   /* another rank's line */
    snprintf(key, sizeof key, "%s/health/s/6", J.prefix);
    { int del; ddp_store_delete(srv, key, &del); }                   /* none */
#undef SETRAW
    ask(&r, "");
    ok(r.rc == 1, "malformed: no crash, exit 1 (got %d)", r.rc);
    check_verdict(&r, "malformed: the verdict names them", v, 1);
    ok(!strcmp(line_of(&r, "rank 1:", l, sizeof l), "rank 1: unreadable status (no v= or tick= in it)"), "malformed: truncated: %s", l);
    ok(!strncmp(line_of(&r, "rank 2:", l, sizeof l), "rank 2: unreadable status (byte 0x01", 36), "malformed: binary: %s", l);
    ok(!strcmp(line_of(&r, "rank 3:", l, sizeof l), "rank 3: unreadable status (1048576 bytes, longer than a status line)"),
       "malformed: 1 MiB: %s", l);
    ok(!strcmp(line_of(&r, "rank 4:", l, sizeof l), "rank 4: unreadable status (tick= is not a whole number)"), "malformed: a word: %s", l);
    ok(!strcmp(line_of(&r, "rank 5:", l, sizeof l), "rank 5: unreadable status (no rank=5 in it)"), "malformed: rank 0's line at 5: %s", l);
    ok(!strncmp(line_of(&r, "rank 6:", l, sizeof l), "rank 6: no status", 17), "malformed: missing: %s", l);
    run_free(&r);
    check_json("malformed", "--json", "1------", v, 1);
}

/* Worlds of 2 (both neighbours are the same rank) and 1 (none). */
static void small(void) {
    run_t r;
    char l[4096];
    job_begin("two", 2, 3);
    rank_set(0, 1, "pid=1000 host=node0 period_ms=500 state=call kind=all_reduce seq=3 for_ms=7100 peer=1 left=1 "
                   "left_state=silent left_ms=7000 right=1 right_state=silent right_ms=7000");
    rank_set(1, 0, "pid=1001 host=node0 period_ms=500 state=call kind=all_reduce seq=3 for_ms=5 peer=0 left=0 "
                   "left_state=ok left_ms=100 right=0 right_state=ok right_ms=100");
    job_go(2);
    ask(&r, "");
    check_verdict(&r, "world of 2, rank 1 stuck",
                  "verdict: rank 1 is not answering (last heartbeat 7.0 s ago, seen by rank 0); rank 0 waits for it "
                  "in all_reduce #3", 1);
    ok(strstr(line_of(&r, "rank 1 ", l, sizeof l), "; heartbeat seen by rank 0 7.0 s ago (silent); NOT ANSWERING") != NULL,
       "world of 2: rank 0's one link reported once: %s", l);
    run_free(&r);
    job_begin("one", 1, 3);
    rank_set(0, 1, "pid=1000 host=node0 period_ms=500 state=user seq=3 for_ms=10");
    job_go(1);
    ask(&r, "");
    check_verdict(&r, "world of 1", "verdict: all ranks in user code", 0);
    run_free(&r);
}

/* Asks with a long --wait-ms: the ticker thread rewrites 1,024 lines per pass, which a busy
 * machine (a sanitizer build beside a CPU hog) can stretch past a second, and a rank whose tick
 * has not moved yet must not be called not answering for it. Answering ranks are told as soon
 * as their ticks move; only the stopped one costs the wait. How fast ddp-status answers a real
 * 1,024-rank job is measured by bench/status_scale.sh (make scale), not here. */
static void ask_patient(run_t *r, char *times, size_t cap) {
    ask(r, "--wait-ms 20000");
    snprintf(times, cap, "%.2f s", r->secs);
}

/* 1,024 ranks: the answer within 2 s of asking, condensed. */
static void world_1024(void) {
    run_t r;
    char l[4096], times[128];
    job_begin("big", MAXN, 5);
    job_go(MAXN);
    ask_patient(&r, times, sizeof times);
    ok(r.rc == 0 && strstr(r.out, "\nranks 0-1023: in all_reduce #5 for 7.0 s to 8.0 s; answering\n") &&
       !strcmp(line_of(&r, "verdict: ", l, sizeof l), "verdict: all ranks in all_reduce #5 (for up to 8.0 s), all answering"),
       "1,024 ranks in all_reduce #5: one condensed line, all answering, exit 0");
    diag("1,024 ranks, all answering: answered in %s", times);
    if (r.rc != 0 || getenv("T_SHOW")) show(&r);
    run_free(&r);
    rank_set(517, 0, "pid=1517 host=node64 period_ms=500 state=call kind=all_reduce seq=4 for_ms=3 left=516 "
                     "left_state=ok left_ms=100 right=518 right_state=ok right_ms=100");
    job_go(MAXN);
    ask_patient(&r, times, sizeof times);
    ok(r.rc == 1 &&
       !strcmp(line_of(&r, "verdict: ", l, sizeof l),
               "verdict: rank 517 is not answering (last heartbeat 120 ms ago, seen by ranks 516 and 518); "
               "ranks 0-516, 518-1023 wait for it in all_reduce #5") &&
       strstr(r.out, "\nrank 517 (node64 pid 1517): in all_reduce #4 for 3 ms; heartbeat seen by rank 516 130 ms ago, rank 518 120 ms ago; NOT ANSWERING") &&
       strstr(r.out, "\nranks 0-516, 518-1023: in all_reduce #5 for 7.0 s to 8.0 s; answering\n"),
       "1,024 ranks, rank 517 stuck in the call before: condensed, its own line, the verdict");
    diag("1,024 ranks, one stuck: answered in %s (it waits --wait-ms for the stuck one)", times);
    if (r.rc != 1 || getenv("T_SHOW")) show(&r);
    run_free(&r);
}

/* A port that listens and never accepts: a stopped process's listening socket. */
static int silent_listener(int *p) {
    struct sockaddr_in a;
    socklen_t al = sizeof a;
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) != 0 || listen(fd, 16) != 0 ||
        getsockname(fd, (struct sockaddr *)&a, &al) != 0)
        return -1;
    *p = ntohs(a.sin_port);
    return fd;
}

static void cannot_ask(void) {
    run_t r;
    char args[256];
    int lp = 0, fd = silent_listener(&lp);
    ddp_store_t *empty = NULL;
    ddp_store_desc_t sd;
    snprintf(args, sizeof args, "127.0.0.1:%d --timeout-ms 1000", lp);
    run_tool(&r, "DDP_JOB_SECRET=" SECRET, args);
    snprintf(args, sizeof args, "127.0.0.1:%d did not answer within 1.0 s", lp);
    if (!ok(fd >= 0 && r.rc == 2 && strstr(r.err, args) && strstr(r.err, "rank 0") && r.secs < 1.0 + 5.0,
            "a store that never answers: exit 2 within the timeout, naming host:port and rank 0"))
        show(&r);
    run_free(&r);
    if (fd >= 0) close(fd);
    snprintf(args, sizeof args, "127.0.0.1:%d --timeout-ms 500 --json", t_free_port());
    run_tool(&r, "DDP_JOB_SECRET=" SECRET, args);
    if (!ok(r.rc == 2 && strstr(r.err, "did not answer") && strstr(r.out, "{\"store\":\"127.0.0.1:") &&
            strstr(r.out, "\"exit\":2}"), "nobody listening: exit 2, and --json says so as JSON too"))
        show(&r);
    run_free(&r);
    snprintf(args, sizeof args, "127.0.0.1:%d", port);
    run_tool(&r, "DDP_JOB_SECRET=wrong-secret-0123456789", args);
    if (!ok(r.rc == 2 && strstr(r.err, "refused") && strstr(r.err, "DDP_JOB_SECRET"), "a wrong secret: exit 2, says so"))
        show(&r);
    run_free(&r);
    memset(&sd, 0, sizeof sd);
    sd.secret = SECRET;
    sd.log_level = 1;
    if (ddp_store_open(&empty, "127.0.0.1", 0, 1, &sd) == DDP_SUCCESS) {
        snprintf(args, sizeof args, "127.0.0.1:%d", ddp_store_port(empty));
        run_tool(&r, "DDP_JOB_SECRET=" SECRET, args);
        if (!ok(r.rc == 2 && strstr(r.err, "no job's status"), "a store without a job: exit 2, says so")) show(&r);
        run_free(&r);
        ddp_store_close(empty);
    }
    run_tool(&r, "", "--wait-ms x 127.0.0.1:1");
    ok(r.rc == 2 && strstr(r.err, "usage:"), "a usage error: exit 2 with the usage line");
    run_free(&r);
}

int main(int argc, char **argv) {
    ddp_store_desc_t sd;
    ddp_store_t *tick_st = NULL;
    pthread_t th;
    const char *slash = strrchr(argv[0], '/');
    (void)argc;
    t_init();
    if (getenv("T_DDP_STATUS")) snprintf(tool, sizeof tool, "%s", getenv("T_DDP_STATUS"));
    else if (slash) snprintf(tool, sizeof tool, "%.*s/ddp-status", (int)(slash - argv[0]), argv[0]);
    else snprintf(tool, sizeof tool, "build/ddp-status");
    if (access(tool, X_OK) != 0) t_bail("no %s (make %s)", tool, tool);
    memset(&sd, 0, sizeof sd);
    sd.timeout_ms = 30000;
    sd.secret = SECRET;
    sd.log_level = 1;
    if (ddp_store_open(&srv, "127.0.0.1", 0, 1, &sd) != DDP_SUCCESS) t_bail("cannot serve a store");
    port = ddp_store_port(srv);
    if (ddp_store_open(&tick_st, "127.0.0.1", port, 0, &sd) != DDP_SUCCESS) t_bail("cannot connect to the store");
    if (pthread_create(&th, NULL, ticker, tick_st) != 0) t_bail("pthread_create");
    if (t_selected("stuck")) stuck();
    if (t_selected("busy")) busy();
    if (t_selected("straggler")) straggler();
    if (t_selected("failed")) failed();
    if (t_selected("unreachable")) unreachable();
    if (t_selected("malformed")) malformed();
    if (t_selected("small")) small();
    if (t_selected("1024")) world_1024();
    if (t_selected("cannot")) cannot_ask();
    pthread_mutex_lock(&J.mu);
    J.stop = 1;
    pthread_mutex_unlock(&J.mu);
    pthread_join(th, NULL);
    ddp_store_close(tick_st);
    ddp_store_close(srv);
    return t_done();
}
