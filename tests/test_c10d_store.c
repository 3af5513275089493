/* SPDX-License-Identifier: MIT (see LICENSE) */
/* tests/test_c10d_store.c — ddp_store_connect_c10d, libddp's client of PyTorch's c10d TCPStore
 * (torchrun's agent store), against a real torch.distributed.TCPStore. Prints TAP.
 *
 *   build/test_c10d_store          (needs a python3 that imports torch: PYTHON=..., python3 or
 *                                   /usr/bin/python3; without one: 1..0 # SKIP no python3-torch)
 *
 * - tests/c10d_server.py runs the server and answers commands through its own Python client, so
 *   every check goes both ways: C sets / Python gets, Python sets / C gets (binary, empty and
 *   256 KiB values; a get into a smaller buffer), add from both sides, compare_set (missing key,
 *   right and wrong expected value, expected == desired on a missing key: torch's server answers
 *   `expected` for a missing key and the client must say "missing"), check, delete from both
 *   sides, wait that succeeds at once, wait on 10 keys (several WAITs), wait that times out
 *   (then the handle still works), wait, get and wait-any that succeed when Python sets the key
 *   later, 4 threads adding through one handle, a second handle (_ddp_store_client_like).
 * - the dialect: PyTorch 1.x must be found to speak the "watch" dialect (no VALIDATE).
 * - failures: the server killed during a wait -> DDP_ERR_REMOTE naming host:port and WAIT, long
 *   before the wait's timeout; then a call reconnecting to nothing times out with the address;
 *   connecting to a port with nothing -> DDP_ERR_TIMEOUT naming it.
 * - scripted servers (a thread that checks every byte the client sends against the layout read
 *   in PyTorch's source, and answers as the script says): the validate dialect (PyTorch >= 2.4,
 *   libuv; VALIDATE then shifted query numbers, CANCEL_WAIT after a timed-out wait, the
 *   STOP_WAITING that races a cancel), the plain dialect (~2.2: detected on a second connection,
 *   DELETE_KEY = 7, CANCEL_WAIT = 11), and garbage: a value length of 2^64-1, a CHECK answer
 *   of 7, a connection closed during ADD, a server that answers "HTTP", a libddp store, a
 *   server that accepts and never answers. Each is a clean error, never a hang or a huge
 *   allocation.
 * No check depends on timing beyond "before a generous timeout": elapsed times are only
 * bounded by several seconds, on a busy 2-core machine. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#define DDP_IMPLEMENTATION
#include "ddp_store.h"
#include "tests/ddp_test.h"

#include <fcntl.h>
#include <poll.h>
#include <pthread.h>

/* ============================================================ the Python server */
typedef struct {
    pid_t pid;
    int to, from;             /* its stdin, its stdout */
    int port;
    char version[64];
} py_t;

static const char *g_python;
static char g_script[4096] = "tests/c10d_server.py";

/* The helper script: from the repository root (make, prove), else beside this binary's ../tests. */
static void find_script(const char *argv0) {
    const char *slash = strrchr(argv0, '/');
    if (access(g_script, R_OK) == 0 || !slash) return;
    snprintf(g_script, sizeof g_script, "%.*s/../tests/c10d_server.py", (int)(slash - argv0), argv0);
}

/* 0 if argv runs and exits 0 (output discarded). */
static int run_quiet(const char *const *argv) {
    int st = 0;
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        int dn = open("/dev/null", O_RDWR);
        if (dn >= 0) { dup2(dn, 0); dup2(dn, 1); dup2(dn, 2); }
        execvp(argv[0], (char *const *)(uintptr_t)argv);
        _exit(127);
    }
    if (waitpid(pid, &st, 0) < 0) return -1;
    return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : -1;
}

static const char *find_python(void) {
    const char *cands[3];
    int i;
    cands[0] = getenv("PYTHON");
    cands[1] = "python3";
    cands[2] = "/usr/bin/python3";
    for (i = 0; i < 3; i++) {
        const char *argv[4];
        if (!cands[i] || !*cands[i]) continue;
        argv[0] = cands[i];
        argv[1] = "-c";
        argv[2] = "import torch.distributed as d; d.TCPStore";
        argv[3] = NULL;
        if (run_quiet(argv) == 0) return cands[i];
    }
    return NULL;
}

/* One line from the server (without the newline), waiting at most timeout_s. */
static int py_line(py_t *p, char *buf, size_t cap, int timeout_s) {
    size_t n = 0;
    double t0 = t_now();
    while (n + 1 < cap) {
        struct pollfd pfd;
        char c;
        ssize_t r;
        int left = (int)((timeout_s - (t_now() - t0)) * 1000);
        if (left <= 0) break;
        pfd.fd = p->from; pfd.events = POLLIN; pfd.revents = 0;
        if (poll(&pfd, 1, left) <= 0) continue;
        r = read(p->from, &c, 1);
        if (r <= 0) break;
        if (c == '\n') { buf[n] = 0; return 0; }
        buf[n++] = c;
    }
    buf[n] = 0;
    return -1;
}

static int py_start(py_t *p) {
    int in[2], out[2];
    char line[256];
    memset(p, 0, sizeof *p);
    p->to = p->from = -1;
    if (pipe(in) || pipe(out)) return -1;
    fflush(stdout);
    p->pid = fork();
    if (p->pid < 0) return -1;
    if (p->pid == 0) {
        dup2(in[0], 0);
        dup2(out[1], 1);
        close(in[0]); close(in[1]); close(out[0]); close(out[1]);
        execlp(g_python, g_python, g_script, (char *)NULL);
        _exit(127);
    }
    close(in[0]);
    close(out[1]);
    p->to = in[1];
    p->from = out[0];
    fcntl(p->to, F_SETFD, FD_CLOEXEC);
    fcntl(p->from, F_SETFD, FD_CLOEXEC);
    if (py_line(p, line, sizeof line, 120) != 0 ||
        sscanf(line, "port %d torch %63s", &p->port, p->version) != 2)
        return -1;
    return 0;
}

/* Sends one command and reads its one-line answer into out. */
static int py_cmd(py_t *p, char *out, size_t cap, const char *fmt, ...) T_PRINTF(4, 5);
static int py_cmd(py_t *p, char *out, size_t cap, const char *fmt, ...) {
    static char cmd[1 << 20];
    va_list ap;
    size_t n, off = 0;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd - 1, fmt, ap);
    va_end(ap);
    n = strlen(cmd);
    cmd[n++] = '\n';
    while (off < n) {
        ssize_t w = write(p->to, cmd + off, n - off);
        if (w <= 0) return -1;
        off += (size_t)w;
    }
    return py_line(p, out, cap, 120);
}

static int py_alive(py_t *p) {
    int st;
    return p->pid > 0 && waitpid(p->pid, &st, WNOHANG) == 0;
}

static void py_stop(py_t *p) {
    int st, i;
    if (p->to >= 0) close(p->to);
    if (p->from >= 0) close(p->from);
    p->to = p->from = -1;
    if (p->pid <= 0) return;
    for (i = 0; i < 3000; i++) {
        if (waitpid(p->pid, &st, WNOHANG) == p->pid) { p->pid = 0; return; }
        t_sleep_ms(10);
    }
    kill(p->pid, SIGKILL);
    waitpid(p->pid, &st, 0);
    p->pid = 0;
}

/* ============================================================ small helpers */
static void to_hex(const void *v, size_t n, char *out) {
    static const char d[] = "0123456789abcdef";
    const unsigned char *b = (const unsigned char *)v;
    size_t i;
    if (!n) { strcpy(out, "-"); return; }
    for (i = 0; i < n; i++) { out[2 * i] = d[b[i] >> 4]; out[2 * i + 1] = d[b[i] & 15]; }
    out[2 * n] = 0;
}

static ddp_store_t *connect_or_bail(int port, int timeout_ms) {
    ddp_store_t *s = NULL;
    ddp_result_t r = ddp_store_connect_c10d("127.0.0.1", port, timeout_ms, &s);
    if (!ok(r == DDP_SUCCESS && s, "ddp_store_connect_c10d 127.0.0.1:%d -> %s", port, ddp_strerror(r)))
        return NULL;
    return s;
}

/* The message names host:port. */
static int names_addr(const ddp_store_t *s, int port) {
    char want[64];
    snprintf(want, sizeof want, "127.0.0.1:%d", port);
    return strstr(ddp_store_last_error(s), want) != NULL;
}

/* ============================================================ against the real server */
static char g_hex[1 << 20], g_ans[1 << 20];

static void real_set_get(ddp_store_t *s, py_t *p) {
    static unsigned char big[256 << 10], back[256 << 10];
    const unsigned char bin[] = {'a', 0, 'b', 0xff, 0x80, 0};
    unsigned char buf[64];
    size_t len = 0, i;
    ddp_result_t r;

    r = ddp_store_set(s, "c_bin", bin, sizeof bin);
    to_hex(bin, sizeof bin, g_hex);
    ok(r == DDP_SUCCESS && py_cmd(p, g_ans, sizeof g_ans, "get c_bin") == 0 && !strcmp(g_ans, g_hex),
       "C sets a binary value (NUL, 0xff), Python gets it: %s (want %s)", g_ans, g_hex);

    py_cmd(p, g_ans, sizeof g_ans, "set py_bin 00ff1000617a");
    r = ddp_store_get(s, "py_bin", buf, sizeof buf, &len);
    ok(r == DDP_SUCCESS && len == 6 && !memcmp(buf, "\x00\xff\x10\x00\x61\x7a", 6),
       "Python sets a binary value, C gets it: %s, %zu bytes", ddp_strerror(r), len);
    memset(buf, 0x55, sizeof buf);
    r = ddp_store_get(s, "py_bin", buf, 3, &len);
    ok(r == DDP_SUCCESS && len == 6 && !memcmp(buf, "\x00\xff\x10", 3) && buf[3] == 0x55,
       "a get into a 3-byte buffer copies 3 bytes and reports the full length 6 (%zu)", len);

    r = ddp_store_set(s, "c_empty", NULL, 0);
    ok(r == DDP_SUCCESS && py_cmd(p, g_ans, sizeof g_ans, "get c_empty") == 0 && !strcmp(g_ans, "-"),
       "C sets an empty value, Python gets b'' (%s)", g_ans);
    py_cmd(p, g_ans, sizeof g_ans, "set py_empty -");
    len = 99;
    r = ddp_store_get(s, "py_empty", buf, sizeof buf, &len);
    ok(r == DDP_SUCCESS && len == 0, "Python sets b'', C gets 0 bytes (%s, %zu)", ddp_strerror(r), len);

    for (i = 0; i < sizeof big; i++) big[i] = (unsigned char)(i * 131 + (i >> 9));
    r = ddp_store_set(s, "c_big", big, sizeof big);
    to_hex(big, sizeof big, g_hex);
    ok(r == DDP_SUCCESS && py_cmd(p, g_ans, sizeof g_ans, "get c_big") == 0 && !strcmp(g_ans, g_hex),
       "C sets 256 KiB, Python gets the same bytes");
    for (i = 0; i < sizeof big; i++) big[i] = (unsigned char)(i * 7 + 3);
    to_hex(big, sizeof big, g_hex);
    py_cmd(p, g_ans, sizeof g_ans, "set py_big %s", g_hex);
    r = ddp_store_get(s, "py_big", back, sizeof back, &len);
    ok(r == DDP_SUCCESS && len == sizeof big && !memcmp(back, big, sizeof big),
       "Python sets 256 KiB, C gets the same bytes (%s, %zu)", ddp_strerror(r), len);

    r = ddp_store_set(s, "over", "1", 1);
    if (r == DDP_SUCCESS) r = ddp_store_set(s, "over", "22", 2);
    ok(r == DDP_SUCCESS && py_cmd(p, g_ans, sizeof g_ans, "get over") == 0 && !strcmp(g_ans, "3232"),
       "a second set overwrites: Python reads '22' (%s)", g_ans);
}

static void real_add(ddp_store_t *s, py_t *p) {
    int64_t v = 0;
    ddp_result_t r = ddp_store_add(s, "ctr", 5, &v);
    ok(r == DDP_SUCCESS && v == 5, "C add 5 to a missing key -> 5 (%lld)", (long long)v);
    py_cmd(p, g_ans, sizeof g_ans, "add ctr 3");
    ok(!strcmp(g_ans, "8"), "Python add 3 -> 8 (%s)", g_ans);
    r = ddp_store_add(s, "ctr", -10, &v);
    ok(r == DDP_SUCCESS && v == -2, "C add -10 -> -2 (%lld)", (long long)v);
    py_cmd(p, g_ans, sizeof g_ans, "get ctr");
    ok(!strcmp(g_ans, "2d32"), "Python reads the counter as the text '-2' (%s)", g_ans);
    py_cmd(p, g_ans, sizeof g_ans, "set pyctr 3430");
    r = ddp_store_add(s, "pyctr", 1, &v);
    ok(r == DDP_SUCCESS && v == 41, "C adds 1 to the text '40' Python set -> 41 (%lld)", (long long)v);
    r = ddp_store_add(s, "big_ctr", INT64_C(1) << 40, &v);
    ok(r == DDP_SUCCESS && v == INT64_C(1) << 40, "add of 2^40 -> %lld", (long long)v);
}

static void real_cas(ddp_store_t *s, py_t *p) {
    char act[32];
    size_t alen = 99;
    ddp_result_t r = ddp_store_compare_set(s, "cas1", NULL, 0, "x", 1, act, sizeof act, &alen);
    ok(r == DDP_SUCCESS && alen == 1 && act[0] == 'x', "compare_set on a missing key with empty "
       "expected sets it: actual 'x' (%s, %zu)", ddp_strerror(r), alen);
    py_cmd(p, g_ans, sizeof g_ans, "get cas1");
    ok(!strcmp(g_ans, "78"), "Python reads 'x' (%s)", g_ans);
    r = ddp_store_compare_set(s, "cas1", "x", 1, "yy", 2, act, sizeof act, &alen);
    ok(r == DDP_SUCCESS && alen == 2 && !memcmp(act, "yy", 2), "right expected value: swapped to 'yy' (%zu)", alen);
    r = ddp_store_compare_set(s, "cas1", "zz", 2, "q", 1, act, sizeof act, &alen);
    ok(r == DDP_SUCCESS && alen == 2 && !memcmp(act, "yy", 2), "wrong expected value: unchanged, actual 'yy' (%zu)", alen);
    py_cmd(p, g_ans, sizeof g_ans, "get cas1");
    ok(!strcmp(g_ans, "7979"), "Python still reads 'yy' (%s)", g_ans);

    alen = 99;
    r = ddp_store_compare_set(s, "cas_missing", "e", 1, "d", 1, act, sizeof act, &alen);
    ok(r == DDP_SUCCESS && alen == 0, "compare_set on a missing key with expected 'e': the server answers "
       "'e', the client reports the key missing (actual length %zu)", alen);
    py_cmd(p, g_ans, sizeof g_ans, "check cas_missing");
    ok(!strcmp(g_ans, "0"), "and the key was not created (Python check: %s)", g_ans);
    alen = 99;
    r = ddp_store_compare_set(s, "cas_missing", "s", 1, "s", 1, act, sizeof act, &alen);
    ok(r == DDP_SUCCESS && alen == 0, "missing key, expected == desired: reported missing (%zu)", alen);
    r = ddp_store_compare_set(s, "cas1", "yy", 2, "yy", 2, act, sizeof act, &alen);
    ok(r == DDP_SUCCESS && alen == 2, "existing key, expected == desired == its value: actual 'yy' (%zu)", alen);

    r = ddp_store_set(s, "pcas", "1", 1);
    py_cmd(p, g_ans, sizeof g_ans, "cas pcas 31 32");
    ok(r == DDP_SUCCESS && !strcmp(g_ans, "32"), "Python compare_set on a key C set: '2' (%s)", g_ans);
    alen = 0;
    r = ddp_store_get(s, "pcas", act, sizeof act, &alen);
    ok(r == DDP_SUCCESS && alen == 1 && act[0] == '2', "C reads Python's swap: '2'");
}

static void real_check_delete(ddp_store_t *s, py_t *p) {
    int ex = -1, del = -1;
    ddp_result_t r = ddp_store_check(s, "c_bin", &ex);
    ok(r == DDP_SUCCESS && ex == 1, "check of a key C set: 1 (%d)", ex);
    r = ddp_store_check(s, "never_set", &ex);
    ok(r == DDP_SUCCESS && ex == 0, "check of a missing key: 0 (%d)", ex);
    py_cmd(p, g_ans, sizeof g_ans, "set py_del 01");
    r = ddp_store_check(s, "py_del", &ex);
    ok(r == DDP_SUCCESS && ex == 1, "check of a key Python set: 1 (%d)", ex);
    r = ddp_store_delete(s, "py_del", &del);
    ok(r == DDP_SUCCESS && del == 1, "C deletes a key Python set: deleted 1 (%d)", del);
    py_cmd(p, g_ans, sizeof g_ans, "check py_del");
    ok(!strcmp(g_ans, "0"), "Python no longer sees it (%s)", g_ans);
    r = ddp_store_delete(s, "py_del", &del);
    ok(r == DDP_SUCCESS && del == 0, "deleting it again: deleted 0 (%d)", del);
    ddp_store_set(s, "c_del", "z", 1);
    py_cmd(p, g_ans, sizeof g_ans, "delete c_del");
    r = ddp_store_check(s, "c_del", &ex);
    ok(!strcmp(g_ans, "1") && r == DDP_SUCCESS && ex == 0, "Python deletes a key C set (%s); C's check: %d", g_ans, ex);
}

static void real_wait(ddp_store_t *s, py_t *p) {
    const char *two[2] = {"w_a", "w_b"}, *never[1] = {"never_set"}, *late[1] = {"late"};
    const char *any[2] = {"any_a", "any_b"}, *any_never[2] = {"nope_a", "nope_b"};
    const char *ten[10] = {"t0", "t1", "t2", "t3", "t4", "t5", "t6", "t7", "t8", "t9"};
    const char *ten_miss[10] = {"t0", "t1", "t2", "t3", "t4", "t5", "t6", "t7", "t8", "t_missing"};
    char buf[16];
    size_t len = 0;
    double t0;
    int i;
    ddp_result_t r;

    py_cmd(p, g_ans, sizeof g_ans, "set w_a 61");
    py_cmd(p, g_ans, sizeof g_ans, "set w_b 62");
    r = ddp_store_wait(s, two, 2, 30000);
    ok(r == DDP_SUCCESS, "wait on two keys Python set: %s", ddp_strerror(r));
    for (i = 0; i < 10; i++) py_cmd(p, g_ans, sizeof g_ans, "set %s 01", ten[i]);
    r = ddp_store_wait(s, ten, 10, 30000);
    ok(r == DDP_SUCCESS, "wait on ten keys (two WAITs of at most 8): %s", ddp_strerror(r));

    t0 = t_now();
    r = ddp_store_wait(s, never, 1, 1000);
    ok(r == DDP_ERR_TIMEOUT && t_now() - t0 > 0.9 && t_now() - t0 < 30 && names_addr(s, p->port) &&
       strstr(ddp_store_last_error(s), "never_set"),
       "a wait on a key nobody sets times out after its 1000 ms (%.2f s): %s", t_now() - t0,
       ddp_store_last_error(s));
    r = ddp_store_set(s, "after_timeout", "ok", 2);
    ok(r == DDP_SUCCESS && py_cmd(p, g_ans, sizeof g_ans, "get after_timeout") == 0 && !strcmp(g_ans, "6f6b"),
       "the handle works after the timed-out wait (%s, %s)", ddp_strerror(r), g_ans);
    t0 = t_now();
    r = ddp_store_wait(s, ten_miss, 10, 800);
    ok(r == DDP_ERR_TIMEOUT && t_now() - t0 < 30, "a wait on ten keys, one missing, times out: %s",
       ddp_store_last_error(s));

    py_cmd(p, g_ans, sizeof g_ans, "setlater 1000 late 6c");
    r = ddp_store_wait(s, late, 1, 60000);
    ok(r == DDP_SUCCESS, "a wait succeeds when Python sets the key a second later: %s", ddp_strerror(r));
    r = ddp_store_get(s, "late", buf, sizeof buf, &len);
    ok(r == DDP_SUCCESS && len == 1 && buf[0] == 'l', "and get reads it");
    py_cmd(p, g_ans, sizeof g_ans, "setlater 800 late_get 6d6d");
    r = ddp_store_get(s, "late_get", buf, sizeof buf, &len);
    ok(r == DDP_SUCCESS && len == 2 && !memcmp(buf, "mm", 2), "get blocks until Python sets the key (%s)",
       ddp_strerror(r));

    py_cmd(p, g_ans, sizeof g_ans, "setlater 600 any_b 01");
    r = _ddp_store_wait_keys(s, any, 2, 60000, 1);
    ok(r == DDP_SUCCESS, "wait for any of two keys (polled CHECK) ends when Python sets one: %s",
       ddp_strerror(r));
    t0 = t_now();
    r = _ddp_store_wait_keys(s, any_never, 2, 500, 1);
    ok(r == DDP_ERR_TIMEOUT && t_now() - t0 < 30 && names_addr(s, p->port),
       "wait for any of two keys nobody sets times out: %s", ddp_store_last_error(s));
}

typedef struct { ddp_store_t *s; int fails; } adder_t;
static void *adder(void *arg) {
    adder_t *a = (adder_t *)arg;
    int i;
    for (i = 0; i < 50; i++) {
        int64_t v;
        if (ddp_store_add(a->s, "tctr", 1, &v) != DDP_SUCCESS) a->fails++;
    }
    return NULL;
}

static void real_threads(ddp_store_t *s, py_t *p) {
    pthread_t th[4];
    adder_t a[4];
    ddp_store_t *s2 = NULL;
    ddp_store_desc_t d;
    char err[512] = "";
    ddp_result_t r;
    int64_t v = 0;
    int i, fails = 0;
    for (i = 0; i < 4; i++) { a[i].s = s; a[i].fails = 0; pthread_create(&th[i], NULL, adder, &a[i]); }
    for (i = 0; i < 4; i++) { pthread_join(th[i], NULL); fails += a[i].fails; }
    py_cmd(p, g_ans, sizeof g_ans, "get tctr");
    ok(fails == 0 && !strcmp(g_ans, "323030"), "4 threads x 50 adds through one handle: Python reads "
       "'200' (%s, %d failures)", g_ans, fails);
    memset(&d, 0, sizeof d);
    d.timeout_ms = 30000;
    r = _ddp_store_client_like(&s2, s, &d, err, sizeof err);
    if (ok(r == DDP_SUCCESS && s2 && s2->c10d == s->c10d, "a second client like the first (as a "
           "communicator's lanes open): %s %s", ddp_strerror(r), r ? err : "")) {
        ddp_store_add(s2, "tctr", 1, &v);
        ok(v == 201, "it adds to the same counter: 201 (%lld)", (long long)v);
        ddp_store_close(s2);
    }
}

/* The server dies under a wait: the client learns it from the closed connection. */
typedef struct { pid_t pid; int ms; } killer_t;
static void *killer(void *arg) {
    killer_t *k = (killer_t *)arg;
    t_sleep_ms(k->ms);
    kill(k->pid, SIGKILL);
    return NULL;
}

static void real_server_dies(void) {
    const char *never[1] = {"never_set"};
    pthread_t th;
    killer_t k;
    py_t p;
    ddp_store_t *s;
    double t0;
    ddp_result_t r;
    if (py_start(&p) != 0) { ok(0, "second Python TCPStore server started"); py_stop(&p); return; }
    if ((s = connect_or_bail(p.port, 3000)) == NULL) { py_stop(&p); return; }
    k.pid = p.pid;
    k.ms = 700;
    pthread_create(&th, NULL, killer, &k);
    t0 = t_now();
    r = ddp_store_wait(s, never, 1, 60000);
    pthread_join(th, NULL);
    ok(r == DDP_ERR_REMOTE && t_now() - t0 < 30 && names_addr(s, p.port) &&
       strstr(ddp_store_last_error(s), "WAIT"),
       "server killed during a 60 s wait: %s after %.2f s: %s", ddp_strerror(r), t_now() - t0,
       ddp_store_last_error(s));
    t0 = t_now();
    r = ddp_store_set(s, "k", "v", 1);
    ok(r == DDP_ERR_TIMEOUT && t_now() - t0 < 30 && names_addr(s, p.port),
       "the next call tries to reconnect for the handle's 3 s and times out: %s (%.2f s)",
       ddp_store_last_error(s), t_now() - t0);
    ddp_store_close(s);
    py_stop(&p);
}

static void nothing_listening(void) {
    const int port = t_free_port();
    ddp_store_t *s = (ddp_store_t *)1;
    double t0 = t_now();
    ddp_result_t r = ddp_store_connect_c10d("127.0.0.1", port, 1500, &s);
    ok(r == DDP_ERR_TIMEOUT && s == NULL && t_now() - t0 > 1.0 && t_now() - t0 < 30,
       "connecting to a port with nothing (%d) times out after its 1.5 s: %s (%.2f s)", port,
       ddp_strerror(r), t_now() - t0);
    r = ddp_store_connect_c10d(NULL, port, 1000, &s);
    ok(r == DDP_ERR_INVALID_ARGUMENT, "NULL host: invalid argument");
    r = ddp_store_connect_c10d("127.0.0.1", 0, 1000, &s);
    ok(r == DDP_ERR_INVALID_ARGUMENT, "port 0: invalid argument");
}

/* ============================================================ scripted servers */
typedef struct { unsigned char b[512]; size_t n; } bytes_t;
static void bb_u8(bytes_t *x, unsigned v) { x->b[x->n++] = (unsigned char)v; }
static void bb_u64(bytes_t *x, uint64_t v) { memcpy(x->b + x->n, &v, 8); x->n += 8; }
static void bb_raw(bytes_t *x, const void *p, size_t n) { memcpy(x->b + x->n, p, n); x->n += n; }
static void bb_str(bytes_t *x, const char *s) { bb_u64(x, strlen(s)); bb_raw(x, s, strlen(s)); }
static void bb_key(bytes_t *x, const char *k) { bb_u64(x, strlen(k) + 1); bb_u8(x, '/'); bb_raw(x, k, strlen(k)); }
static bytes_t bb_make(const char *spec, ...);

#define FAKE_MAX_STEPS 32
enum { GO_ON = 0, CLOSE_AFTER = 1 };
typedef struct { bytes_t expect, reply; int action; } fake_step_t;
typedef struct {
    int lfd, port, nsteps, done, failed;
    fake_step_t steps[FAKE_MAX_STEPS];
    char why[512];
    pthread_t th;
    int stop;                 /* atomic: set by the main thread */
} fake_t;

/* Bytes with a format: 'b' u8, 'q' u64, 's' string (u64 length + bytes), 'k' key ("/" + key),
 * 'r' raw (pointer, length). */
static bytes_t bb_make(const char *spec, ...) {
    bytes_t x;
    va_list ap;
    x.n = 0;
    va_start(ap, spec);
    for (; *spec; spec++) {
        switch (*spec) {
        case 'b': bb_u8(&x, (unsigned)va_arg(ap, int)); break;
        case 'q': bb_u64(&x, va_arg(ap, uint64_t)); break;
        case 's': bb_str(&x, va_arg(ap, const char *)); break;
        case 'k': bb_key(&x, va_arg(ap, const char *)); break;
        case 'r': { const void *p = va_arg(ap, const void *); bb_raw(&x, p, va_arg(ap, size_t)); break; }
        }
    }
    va_end(ap);
    return x;
}

static void fake_step(fake_t *f, bytes_t expect, bytes_t reply, int action) {
    fake_step_t *st = &f->steps[f->nsteps++];
    st->expect = expect;
    st->reply = reply;
    st->action = action;
}

static int fake_read(fake_t *f, int fd, unsigned char *buf, size_t n) {
    size_t got = 0;
    double t0 = t_now();
    while (got < n && !__atomic_load_n(&f->stop, __ATOMIC_ACQUIRE) && t_now() - t0 < 60) {
        struct pollfd pfd;
        ssize_t r;
        pfd.fd = fd; pfd.events = POLLIN; pfd.revents = 0;
        if (poll(&pfd, 1, 100) <= 0) continue;
        r = recv(fd, buf + got, n - got, 0);
        if (r <= 0) return -1;
        got += (size_t)r;
    }
    return got == n ? 0 : -1;
}

static int fake_accept(fake_t *f) {
    double t0 = t_now();
    while (!__atomic_load_n(&f->stop, __ATOMIC_ACQUIRE) && t_now() - t0 < 60) {
        struct pollfd pfd;
        pfd.fd = f->lfd; pfd.events = POLLIN; pfd.revents = 0;
        if (poll(&pfd, 1, 100) == 1) return accept(f->lfd, NULL, NULL);
    }
    return -1;
}

static void *fake_thread(void *arg) {
    fake_t *f = (fake_t *)arg;
    unsigned char got[512];
    int fd = fake_accept(f), i;
    for (i = 0; i < f->nsteps && fd >= 0; i++) {
        fake_step_t *st = &f->steps[i];
        if (st->expect.n && (fake_read(f, fd, got, st->expect.n) != 0 || memcmp(got, st->expect.b, st->expect.n))) {
            char a[200], b[200];
            size_t n = st->expect.n > 60 ? 60 : st->expect.n;
            to_hex(st->expect.b, n, a);
            to_hex(got, n, b);
            snprintf(f->why, sizeof f->why, "step %d: expected %s, got %s", i, a, b);
            f->failed = 1;
            break;
        }
        if (st->reply.n && send(fd, st->reply.b, st->reply.n, MSG_NOSIGNAL) != (ssize_t)st->reply.n) {
            snprintf(f->why, sizeof f->why, "step %d: send failed", i);
            f->failed = 1;
            break;
        }
        f->done = i + 1;
        if (st->action == CLOSE_AFTER) {
            close(fd);
            fd = i + 1 < f->nsteps ? fake_accept(f) : -1;
        }
    }
    while (fd >= 0 && !__atomic_load_n(&f->stop, __ATOMIC_ACQUIRE)) {   /* hold it until stopped */
        struct pollfd pfd;
        pfd.fd = fd; pfd.events = POLLIN; pfd.revents = 0;
        if (poll(&pfd, 1, 100) == 1 && recv(fd, got, sizeof got, 0) <= 0) break;
    }
    if (fd >= 0) close(fd);
    return NULL;
}

static void fake_start(fake_t *f) {
    struct sockaddr_in a;
    socklen_t sl = sizeof a;
    f->lfd = socket(AF_INET, SOCK_STREAM, 0);
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (f->lfd < 0 || bind(f->lfd, (struct sockaddr *)&a, sizeof a) || listen(f->lfd, 8) ||
        getsockname(f->lfd, (struct sockaddr *)&a, &sl))
        t_bail("fake server: %s", strerror(errno));
    f->port = ntohs(a.sin_port);
    pthread_create(&f->th, NULL, fake_thread, f);
}

/* All steps ran and every byte the client sent was the expected one. */
static int fake_finish(fake_t *f, const char *what) {
    int good;
    __atomic_store_n(&f->stop, 1, __ATOMIC_RELEASE);
    pthread_join(f->th, NULL);
    close(f->lfd);
    good = !f->failed && f->done == f->nsteps;
    ok(good, "%s: the client sent exactly the scripted bytes (%d of %d steps%s%s)", what, f->done,
       f->nsteps, f->why[0] ? "; " : "", f->why);
    return good;
}

static bytes_t probe_bytes(void) {
    return bb_make("bbbbbbbbb", 0x00, 0xCE, 0xF7, 0x85, 0x3C, 0x0C, 0x0C, 0x0C, 0x0C);
}
static const bytes_t nothing = {{0}, 0};

/* PyTorch >= 2.4 (libuv, torchrun's default), from the source: VALIDATE, numbers + 1. */
static void fake_validate_dialect(void) {
    static fake_t f;
    const char *w[1] = {"w"};
    char buf[16];
    size_t len = 0;
    int64_t v = 0;
    int ex = -1, del = -1;
    ddp_store_t *s;
    ddp_result_t r;
    memset(&f, 0, sizeof f);
    fake_step(&f, probe_bytes(), bb_make("bbbb", 1, 1, 1, 1), GO_ON);
    /* set: SET(1) "/k" "v", CHECK(5) 1 "/k" */
    fake_step(&f, bb_make("bksbqk", 1, "k", "v", 5, (uint64_t)1, "k"), bb_make("b", 0), GO_ON);
    /* get: WAIT(6) 1 "/k", then GET(3) "/k" */
    fake_step(&f, bb_make("bqk", 6, (uint64_t)1, "k"), bb_make("b", 0), GO_ON);
    fake_step(&f, bb_make("bk", 3, "k"), bb_make("s", "v"), GO_ON);
    /* add: ADD(4) "/n" i64 5 -> 7 */
    fake_step(&f, bb_make("bkq", 4, "n", (uint64_t)5), bb_make("q", (uint64_t)7), GO_ON);
    /* check: CHECK(5) 1 "/k" -> READY */
    fake_step(&f, bb_make("bqk", 5, (uint64_t)1, "k"), bb_make("b", 0), GO_ON);
    /* delete: DELETE_KEY(8) "/k" -> 1 */
    fake_step(&f, bb_make("bk", 8, "k"), bb_make("q", (uint64_t)1), GO_ON);
    /* compare_set(2) on a missing key: the server answers `expected` */
    fake_step(&f, bb_make("bkss", 2, "c", "e", "d"), bb_make("s", "e"), GO_ON);
    /* a wait that times out, then CANCEL_WAIT(12) -> WAIT_CANCELED */
    fake_step(&f, bb_make("bqk", 6, (uint64_t)1, "w"), nothing, GO_ON);
    fake_step(&f, bb_make("b", 12), bb_make("b", 1), GO_ON);
    /* again, but the key came just before the cancel: STOP_WAITING, WAIT_CANCELED */
    fake_step(&f, bb_make("bqk", 6, (uint64_t)1, "w"), nothing, GO_ON);
    fake_step(&f, bb_make("b", 12), bb_make("bb", 0, 1), GO_ON);
    fake_start(&f);
    if ((s = connect_or_bail(f.port, 20000)) != NULL) {
        ok(s->c10d == _DDP_C10D_VALIDATE, "validate dialect detected (%d)", s->c10d);
        r = ddp_store_set(s, "k", "v", 1);
        ok(r == DDP_SUCCESS, "set: %s", ddp_strerror(r));
        r = ddp_store_get(s, "k", buf, sizeof buf, &len);
        ok(r == DDP_SUCCESS && len == 1 && buf[0] == 'v', "get (WAIT then GET): %s", ddp_strerror(r));
        r = ddp_store_add(s, "n", 5, &v);
        ok(r == DDP_SUCCESS && v == 7, "add: %lld", (long long)v);
        r = ddp_store_check(s, "k", &ex);
        ok(r == DDP_SUCCESS && ex == 1, "check: %d", ex);
        r = ddp_store_delete(s, "k", &del);
        ok(r == DDP_SUCCESS && del == 1, "delete with query 8: %d", del);
        len = 99;
        r = ddp_store_compare_set(s, "c", "e", 1, "d", 1, buf, sizeof buf, &len);
        ok(r == DDP_SUCCESS && len == 0, "compare_set answered with `expected`: reported missing (%zu)", len);
        r = ddp_store_wait(s, w, 1, 300);
        ok(r == DDP_ERR_TIMEOUT, "wait times out, CANCEL_WAIT answered WAIT_CANCELED: %s", ddp_strerror(r));
        r = ddp_store_wait(s, w, 1, 300);
        ok(r == DDP_SUCCESS, "wait times out but STOP_WAITING raced the cancel: success (%s)", ddp_strerror(r));
        ddp_store_close(s);
    }
    fake_finish(&f, "validate dialect");
}

/* ~2.2, from the source: no VALIDATE (the probe's connection is closed), DELETE_KEY 7, CANCEL 11. */
static void fake_plain_dialect(void) {
    static fake_t f;
    const char *w[1] = {"w"};
    int ex = -1, del = -1;
    ddp_store_t *s;
    ddp_result_t r;
    memset(&f, 0, sizeof f);
    fake_step(&f, probe_bytes(), nothing, CLOSE_AFTER);
    fake_step(&f, bb_make("bs", 7, "libddp.c10d.probe"), bb_make("q", (uint64_t)0), GO_ON);
    fake_step(&f, bb_make("bksbqk", 0, "k", "v", 4, (uint64_t)1, "k"), bb_make("b", 0), GO_ON);
    fake_step(&f, bb_make("bk", 7, "k"), bb_make("q", (uint64_t)1), GO_ON);
    fake_step(&f, bb_make("bqk", 5, (uint64_t)1, "w"), nothing, GO_ON);
    fake_step(&f, bb_make("b", 11), bb_make("b", 1), GO_ON);
    fake_step(&f, bb_make("bqk", 4, (uint64_t)1, "k"), bb_make("b", 1), GO_ON);
    fake_start(&f);
    if ((s = connect_or_bail(f.port, 20000)) != NULL) {
        ok(s->c10d == _DDP_C10D_PLAIN, "plain dialect detected on the second connection (%d)", s->c10d);
        r = ddp_store_set(s, "k", "v", 1);
        ok(r == DDP_SUCCESS, "set with queries 0 and 4: %s", ddp_strerror(r));
        r = ddp_store_delete(s, "k", &del);
        ok(r == DDP_SUCCESS && del == 1, "delete with query 7: %d", del);
        r = ddp_store_wait(s, w, 1, 300);
        ok(r == DDP_ERR_TIMEOUT, "wait times out, CANCEL_WAIT is query 11: %s", ddp_strerror(r));
        r = ddp_store_check(s, "k", &ex);
        ok(r == DDP_SUCCESS && ex == 0, "the connection stays in step: check -> NOT_READY (%d)", ex);
        ddp_store_close(s);
    }
    fake_finish(&f, "plain dialect");
}

/* Garbage answers: clean errors, the connection dropped, the next call reconnects. */
static void fake_garbage(void) {
    static fake_t f;
    char buf[16];
    size_t len = 0;
    int64_t v = 0;
    int ex = -1;
    ddp_store_t *s;
    ddp_result_t r;
    double t0;
    memset(&f, 0, sizeof f);
    fake_step(&f, probe_bytes(), bb_make("bbbb", 1, 1, 1, 1), GO_ON);
    fake_step(&f, bb_make("bqk", 6, (uint64_t)1, "big"), bb_make("b", 0), GO_ON);
    fake_step(&f, bb_make("bk", 3, "big"), bb_make("q", ~(uint64_t)0), CLOSE_AFTER);
    fake_step(&f, probe_bytes(), bb_make("bbbb", 1, 1, 1, 1), GO_ON);
    fake_step(&f, bb_make("bqk", 5, (uint64_t)1, "k"), bb_make("b", 7), CLOSE_AFTER);
    fake_step(&f, probe_bytes(), bb_make("bbbb", 1, 1, 1, 1), GO_ON);
    fake_step(&f, bb_make("bkq", 4, "n", (uint64_t)1), nothing, CLOSE_AFTER);
    fake_start(&f);
    if ((s = connect_or_bail(f.port, 20000)) != NULL) {
        t0 = t_now();
        r = ddp_store_get(s, "big", buf, sizeof buf, &len);
        ok(r == DDP_ERR_MISMATCH && strstr(ddp_store_last_error(s), "malformed") && names_addr(s, f.port) &&
           t_now() - t0 < 15, "a GET answer announcing 2^64-1 bytes: %s: %s", ddp_strerror(r),
           ddp_store_last_error(s));
        r = ddp_store_check(s, "k", &ex);
        ok(r == DDP_ERR_MISMATCH && strstr(ddp_store_last_error(s), "CHECK"),
           "a CHECK answered 7 (after reconnecting): %s: %s", ddp_strerror(r), ddp_store_last_error(s));
        r = ddp_store_add(s, "n", 1, &v);
        ok(r == DDP_ERR_REMOTE && strstr(ddp_store_last_error(s), "ADD") && names_addr(s, f.port),
           "the server closes during ADD: %s: %s", ddp_strerror(r), ddp_store_last_error(s));
        ddp_store_close(s);
    }
    fake_finish(&f, "garbage answers");
}

static void fake_not_c10d(void) {
    static fake_t f, g;
    ddp_store_t *s = NULL, *own = NULL;
    ddp_store_desc_t d;
    double t0;
    ddp_result_t r;

    memset(&f, 0, sizeof f);
    fake_step(&f, probe_bytes(), bb_make("r", "HTTP/1.1 400 Bad Request\r\n", (size_t)26), CLOSE_AFTER);
    fake_start(&f);
    r = ddp_store_connect_c10d("127.0.0.1", f.port, 20000, &s);
    ok(r == DDP_ERR_MISMATCH && s == NULL, "a server answering HTTP is refused at once: %s", ddp_strerror(r));
    fake_finish(&f, "HTTP server");

    memset(&d, 0, sizeof d);
    d.timeout_ms = 20000;
    d.secret = "";
    d.log_level = 1;
    r = ddp_store_open(&own, "127.0.0.1", 0, 1, &d);
    if (ok(r == DDP_SUCCESS, "a libddp store server for the next check")) {
        r = ddp_store_connect_c10d("127.0.0.1", ddp_store_port(own), 20000, &s);
        ok(r == DDP_ERR_MISMATCH && s == NULL, "a libddp store is refused at once: %s", ddp_strerror(r));
        ddp_store_close(own);
    }

    memset(&g, 0, sizeof g);
    fake_step(&g, probe_bytes(), nothing, GO_ON);      /* takes the probe, says nothing */
    fake_start(&g);
    t0 = t_now();
    r = ddp_store_connect_c10d("127.0.0.1", g.port, 2000, &s);
    ok(r == DDP_ERR_TIMEOUT && s == NULL && t_now() - t0 < 30,
       "a server that accepts and never answers: %s after %.2f s", ddp_strerror(r), t_now() - t0);
    __atomic_store_n(&g.stop, 1, __ATOMIC_RELEASE);
    pthread_join(g.th, NULL);
    close(g.lfd);
}

/* ============================================================ main */
int main(int argc, char **argv) {
    py_t p;
    ddp_store_t *s;
    (void)argc;
    t_init();
    find_script(argv[0]);
    setenv("DDP_DEBUG", "NONE", 0);     /* the expected failures would each log a WARN line */
    g_python = find_python();
    if (!g_python) {
        printf("1..0 # SKIP no python3-torch\n");
        return 0;
    }
    if (t_selected("fake")) {
        fake_validate_dialect();
        fake_plain_dialect();
        fake_garbage();
        fake_not_c10d();
    }
    if (t_selected("nothing")) nothing_listening();
    if (t_selected("real")) {
        if (!ok(py_start(&p) == 0, "Python TCPStore server started (%s)", g_python)) {
            py_stop(&p);
            return t_done();
        }
        diag("torch %s via %s, server on 127.0.0.1:%d", p.version, g_python, p.port);
        if ((s = connect_or_bail(p.port, 20000)) != NULL) {
            if (p.version[0] == '1' && p.version[1] == '.')
                ok(s->c10d == _DDP_C10D_WATCH, "PyTorch %s speaks the watch dialect (%d)", p.version, s->c10d);
            else
                diag("PyTorch %s: dialect %d", p.version, s->c10d);
            ok(ddp_store_port(s) == p.port, "ddp_store_port is the server's port");
            static void (*const scenario[])(ddp_store_t *, py_t *) = {
                real_set_get, real_add, real_cas, real_check_delete, real_wait, real_threads};
            size_t i;
            for (i = 0; i < sizeof scenario / sizeof scenario[0]; i++) {
                scenario[i](s, &p);
                if (!py_alive(&p)) t_bail("the Python server died (its error is above)");
            }
            ok(ddp_store_close(s) == DDP_SUCCESS, "ddp_store_close");
        }
        py_stop(&p);
        real_server_dies();
    }
    return t_done();
}
