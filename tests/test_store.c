/* SPDX-License-Identifier: MIT (see LICENSE) */
/* tests/test_store.c — the rendezvous key-value store (ddp_store_*), c10d TCPStore semantics,
 * with clients in several real processes over loopback TCP. Prints TAP.
 *
 *   build/test_store
 *
 * - set/get (binary values with NUL bytes, empty and 1 MiB values, a get into a smaller buffer
 *   copies what fits and reports the full length), add (concurrent from 4 processes and from
 *   4 threads sharing one handle), compare_set (missing key, wrong/right expected value, a
 *   lock-free counter from 4 processes), check, delete, wait on several keys.
 * - get and wait block until another process sets the key; a wait or get that times out
 *   returns DDP_ERR_TIMEOUT promptly and the handle keeps working afterwards.
 * - job secret: wrong, missing or prefix secret -> DDP_ERR_AUTH at once; the right one, or the
 *   same one from DDP_JOB_SECRET, is accepted; communicators with different secrets fail.
 * - strangers: garbage, a request before the handshake, an absurd length, a half request left
 *   hanging: each is dropped (or ignored) while real clients go on being served; an idle
 *   stranger must not keep the server's close waiting for the whole timeout.
 * - a port another listener holds: ddp_store_open and ddp_comm_init fail at once with an error
 *   that says the port is in use; nobody listening: a client times out when told to.
 * - the server dying under a blocked client: the client gets DDP_ERR_REMOTE promptly; writing
 *   1 MiB to the dead server is an error, not SIGPIPE.
 * - invalid arguments: NULL store/key/value, bad ports, over-long keys and values.
 * - two communicators per process over one store the user opened (desc.store, store_prefix),
 *   local ranks from DDP_HOST_ID; the user's store outlives them.
 * - hardening (protocol 2, ddp_auth.h's challenge-response):
 *   - a stranger speaking the raw protocol without the secret (no proof, a proof under a wrong
 *     key, a replayed proof made for another nonce, a request instead of the hello, a hello
 *     with a SET behind it) gets at most one DDP_ERR_AUTH answer and is disconnected; it never
 *     receives a value; the keys on the server are unchanged afterwards.
 *   - a fake master (a raw listener) that asks for no secret, or answers with a wrong proof, is
 *     refused by a client with DDP_ERR_AUTH; the secret is not in what the fake master received.
 *   - the secret never crosses the wire: a relay thread records both directions of a whole
 *     session (every operation); neither the secret nor its hex appears in the capture.
 *   - the server for 127.0.0.1 listens on loopback only, for an address of this host on that
 *     address, for no host on every interface.
 *   - pre-auth memory is bounded: 16 connections announcing huge lengths are closed and the
 *     process's VmRSS grows by at most 1 MiB; a real client is served afterwards.
 *   - 2,000 idle connections against a server whose process starts with RLIMIT_NOFILE soft
 *     1024: it raises the soft limit to the hard one and keeps serving; with hard = 1024 too it
 *     cannot, sheds unauthenticated connections and still serves set/get/add/wait/compare_set
 *     to real clients (its own handle and a fresh connection work at the end).
 *   - a forked child holds copies of the server's sockets (a data-loader worker): strangers and
 *     a real client that leave after the fork must not leave epoll pointing at freed memory;
 *     the server serves on and closes cleanly.
 * - batches (ddp_store_batch): every kind in one batch with its own answer (get_if_set found
 *   and not, a wait for any of several keys), 200 ops over
 *   several windows in order, an invalid op sends nothing; requests pipelined behind a parked
 *   WAIT run once it is answered; a raw client that pipelines 512 GETs of 1 MiB and never reads
 *   grows the server's process by at most 8 MiB while others are served. */
#define _GNU_SOURCE
#define DDP_IMPLEMENTATION
#include "ddp.h"
#include "transports/ddp_tcp.h"
#include "tests/ddp_test.h"

#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sys/resource.h>
#include <ifaddrs.h>

typedef struct {
    int port;                 /* published by the server rank */
    int server_dead;
    int strangers_ready, client_done;
    double t_set[3];          /* when "late", "w/a", "w/b" were set (CLOCK_MONOTONIC) */
    int idle_open;            /* connections the idle-stranger process holds */
    int server_soft, server_hard;   /* the server process's RLIMIT_NOFILE after opening it */
} store_shm_t;

static store_shm_t *S;

/* Waits (polling shared memory) for rank 0 to publish its store's port. */
static int wait_port(void) {
    double t0 = t_now();
    while (!__atomic_load_n(&S->port, __ATOMIC_SEQ_CST)) {
        if (t_now() - t0 > 20) return 0;
        t_sleep_ms(2);
    }
    return S->port;
}

static ddp_store_desc_t sdesc(int timeout_ms, const char *secret, int quiet) {
    ddp_store_desc_t d;
    memset(&d, 0, sizeof d);
    d.timeout_ms = timeout_ms;
    d.secret = secret;
    d.log_level = quiet ? 1 : 0;
    d.log_rank = t_rank + 1;
    return d;
}

/* Rank 0 opens the server on port 0 (any) and publishes it; others connect to it. */
static ddp_store_t *open_store(int rank, int timeout_ms, const char *secret) {
    ddp_store_t *s = NULL;
    ddp_store_desc_t d = sdesc(timeout_ms, secret, 0);
    ddp_result_t r;
    if (rank == 0) {
        r = ddp_store_open(&s, NULL, 0, 1, &d);
        if (!ok(r == DDP_SUCCESS && s && ddp_store_port(s) > 0, "server ddp_store_open on port 0 -> %s, port %d",
                ddp_strerror(r), s ? ddp_store_port(s) : -1))
            return NULL;
        __atomic_store_n(&S->port, ddp_store_port(s), __ATOMIC_SEQ_CST);
    } else {
        int port = wait_port();
        if (!port) { ok(0, "the server never published its port"); return NULL; }
        r = ddp_store_open(&s, "127.0.0.1", port, 0, &d);
        if (!ok(r == DDP_SUCCESS && s, "client ddp_store_open 127.0.0.1:%d -> %s", port, ddp_strerror(r))) return NULL;
    }
    return s;
}

/* A barrier among p store clients, by key. */
static int sbarrier(ddp_store_t *s, const char *name, int p) {
    char key[128], go[140];
    int64_t v = 0;
    const char *keys[1];
    snprintf(key, sizeof key, "barrier/%s", name);
    snprintf(go, sizeof go, "barrier/%s/go", name);
    if (ddp_store_add(s, key, 1, &v) != DDP_SUCCESS) return 0;
    if (v == p && ddp_store_set(s, go, "1", 1) != DDP_SUCCESS) return 0;
    keys[0] = go;
    return ddp_store_wait(s, keys, 1, 0) == DDP_SUCCESS;
}

static int get_str(ddp_store_t *s, const char *key, char *buf, size_t cap) {
    size_t len = 0;
    if (ddp_store_get(s, key, buf, cap - 1, &len) != DDP_SUCCESS) return 0;
    buf[len < cap - 1 ? len : cap - 1] = 0;
    return 1;
}

/* ----------------------------------------------------------------- basic semantics, 4 procs */
typedef struct { ddp_store_t *s; int n; int fails; } adder_t;
static void *adder(void *arg) {
    adder_t *a = (adder_t *)arg;
    int i;
    for (i = 0; i < a->n; i++) if (ddp_store_add(a->s, "tcounter", 1, NULL) != DDP_SUCCESS) a->fails++;
    return NULL;
}

static int basic(int rank, int p, void *arg) {
    ddp_store_t *s;
    char buf[256];
    size_t len = 0;
    int64_t v = 0;
    int i;
    ddp_result_t r;
    (void)arg;
    t_where("open");
    s = open_store(rank, 8000, NULL);   /* also what the server's close may wait, at most */
    if (!s) return 1;
    t_where("own keys");
    {   /* every rank: a binary value under its own key; then everyone reads everyone's */
        unsigned char val[16], got[16];
        char key[32];
        const char *keys[T_MAX_RANKS] = {0};
        char names[T_MAX_RANKS][32];
        int q, good = 1;
        for (i = 0; i < 16; i++) val[i] = (unsigned char)(i % 3 == 0 ? 0 : rank * 16 + i);
        snprintf(key, sizeof key, "rank/%d", rank);
        ok(ddp_store_set(s, key, val, sizeof val) == DDP_SUCCESS, "set %s (16 bytes with NULs)", key);
        for (q = 0; q < p; q++) { snprintf(names[q], sizeof names[q], "rank/%d", q); keys[q] = names[q]; }
        r = ddp_store_wait(s, keys, p, 0);
        ok(r == DDP_SUCCESS, "wait for all %d ranks' keys -> %s", p, ddp_strerror(r));
        for (q = 0; q < p; q++) {
            len = 0;
            memset(got, 0, sizeof got);
            if (ddp_store_get(s, names[q], got, sizeof got, &len) != DDP_SUCCESS || len != 16) { good = 0; continue; }
            for (i = 0; i < 16; i++) if (got[i] != (unsigned char)(i % 3 == 0 ? 0 : q * 16 + i)) good = 0;
        }
        ok(good, "every rank's binary value reads back exactly, NUL bytes included");
    }
    if (rank == 0) {
        t_where("rank 0 single-client checks");
        ok(ddp_store_set(s, "greeting", "hello", 5) == DDP_SUCCESS, "set greeting");
        memset(buf, 0, sizeof buf);
        r = ddp_store_get(s, "greeting", buf, 3, &len);
        ok(r == DDP_SUCCESS && len == 5 && !memcmp(buf, "hel", 3) && buf[3] == 0,
           "get into a 3-byte buffer copies 3 bytes and reports the full length 5 (len %zu)", len);
        ok(get_str(s, "greeting", buf, sizeof buf) && !strcmp(buf, "hello"), "the connection is still in step after a short read");
        ok(ddp_store_set(s, "greeting", "bye", 3) == DDP_SUCCESS && get_str(s, "greeting", buf, sizeof buf) && !strcmp(buf, "bye"),
           "set overwrites");
        ok(ddp_store_set(s, "empty", NULL, 0) == DDP_SUCCESS, "set an empty value");
        len = 99;
        r = ddp_store_get(s, "empty", buf, sizeof buf, &len);
        ok(r == DDP_SUCCESS && len == 0, "get an empty value -> %s, len %zu", ddp_strerror(r), len);
        len = 99;
        r = ddp_store_get(s, "greeting", NULL, 0, &len);
        ok(r == DDP_SUCCESS && len == 3, "get with no buffer (cap 0) just reports the length (%zu)", len);
        {
            int ex = -1, del = -1;
            ok(ddp_store_check(s, "greeting", &ex) == DDP_SUCCESS && ex == 1, "check: an existing key exists");
            ok(ddp_store_check(s, "no-such-key", &ex) == DDP_SUCCESS && ex == 0, "check: a missing key does not");
            ok(ddp_store_delete(s, "greeting", &del) == DDP_SUCCESS && del == 1, "delete an existing key -> deleted 1");
            ok(ddp_store_check(s, "greeting", &ex) == DDP_SUCCESS && ex == 0, "check after delete: gone");
            ok(ddp_store_delete(s, "greeting", &del) == DDP_SUCCESS && del == 0, "delete it again -> deleted 0");
        }
        {   /* compare_set */
            char actual[64];
            size_t alen = 0;
            r = ddp_store_compare_set(s, "cas", NULL, 0, "one", 3, actual, sizeof actual, &alen);
            ok(r == DDP_SUCCESS && alen == 3 && !memcmp(actual, "one", 3), "compare_set on a missing key with expected_len 0 sets it");
            r = ddp_store_compare_set(s, "cas", "xxx", 3, "two", 3, actual, sizeof actual, &alen);
            ok(r == DDP_SUCCESS && alen == 3 && !memcmp(actual, "one", 3), "compare_set with a wrong expected value changes nothing, returns the current");
            r = ddp_store_compare_set(s, "cas", NULL, 0, "two", 3, actual, sizeof actual, &alen);
            ok(r == DDP_SUCCESS && alen == 3 && !memcmp(actual, "one", 3), "compare_set expecting 'missing' on an existing key changes nothing");
            r = ddp_store_compare_set(s, "cas", "one", 3, "three", 5, actual, sizeof actual, &alen);
            ok(r == DDP_SUCCESS && alen == 5 && !memcmp(actual, "three", 5), "compare_set with the right expected value swaps");
            ok(get_str(s, "cas", buf, sizeof buf) && !strcmp(buf, "three"), "get sees the swapped value");
        }
        {   /* add */
            ok(ddp_store_add(s, "n", 5, &v) == DDP_SUCCESS && v == 5, "add to a missing key starts from 0 (5)");
            ok(ddp_store_add(s, "n", -7, &v) == DDP_SUCCESS && v == -2, "add a negative delta (-2)");
            ok(ddp_store_add(s, "n", 0, &v) == DDP_SUCCESS && v == -2 && get_str(s, "n", buf, sizeof buf) && !strcmp(buf, "-2"),
               "add 0 reads the counter; get sees it as decimal text");
            ok(ddp_store_add(s, "n", INT64_MAX, &v) == DDP_SUCCESS && v == INT64_MAX - 2, "add a large delta (64-bit)");
        }
        {   /* a 1 MiB value */
            size_t n = 1 << 20;
            unsigned char *big = (unsigned char *)malloc(n), *back = (unsigned char *)malloc(n);
            for (i = 0; i < (int)n; i++) big[i] = (unsigned char)(i * 7 + (i >> 11));
            ok(ddp_store_set(s, "big", big, n) == DDP_SUCCESS, "set a 1 MiB value");
            len = 0;
            ok(ddp_store_get(s, "big", back, n, &len) == DDP_SUCCESS && len == n && !memcmp(big, back, n), "get it back intact");
            free(big);
            free(back);
        }
    }
    t_where("concurrent add");
    for (i = 0; i < 100; i++) if (ddp_store_add(s, "counter", 1, NULL) != DDP_SUCCESS) break;
    ok(i == 100, "100 concurrent adds of 1 from this process");
    t_where("concurrent compare_set");
    {   /* A lock-free counter: read "n:writer", compare_set it to "n+1:me:seq", retry on
         * conflict. Every written value is unique, so "actual == desired" means we won. */
        int done = 0, tries = 0;
        while (done < 25 && tries < 100000) {
            char cur[64], nxt[64], actual[64];
            size_t clen = 0, alen = 0;
            int exists = 0;
            long val = 0;
            tries++;
            if (ddp_store_check(s, "cas_counter", &exists) != DDP_SUCCESS) break;
            if (exists) {
                if (ddp_store_get(s, "cas_counter", cur, sizeof cur - 1, &clen) != DDP_SUCCESS) break;
                cur[clen] = 0;
                val = atol(cur);
            } else {
                clen = 0;
            }
            snprintf(nxt, sizeof nxt, "%ld:%d:%d", val + 1, rank, tries);
            if (ddp_store_compare_set(s, "cas_counter", cur, clen, nxt, strlen(nxt), actual, sizeof actual, &alen) != DDP_SUCCESS) break;
            if (alen == strlen(nxt) && !memcmp(actual, nxt, alen)) done++;
        }
        ok(done == 25, "25 increments through compare_set (%d tries)", tries);
    }
    if (rank == p - 1) {   /* 4 threads sharing this process's handle */
        pthread_t th[4];
        adder_t a[4];
        int fails = 0;
        for (i = 0; i < 4; i++) { a[i].s = s; a[i].n = 50; a[i].fails = 0; pthread_create(&th[i], NULL, adder, &a[i]); }
        for (i = 0; i < 4; i++) { pthread_join(th[i], NULL); fails += a[i].fails; }
        ok(fails == 0, "4 threads x 50 adds through one handle");
    }
    ok(sbarrier(s, "counted", p), "store barrier");
    ok(ddp_store_add(s, "counter", 0, &v) == DDP_SUCCESS && v == 100 * p, "concurrent adds from %d processes add up (%lld)", p, (long long)v);
    ok(get_str(s, "cas_counter", buf, sizeof buf) && atol(buf) == 25L * p, "compare_set counter from %d processes is exact (%s)", p, buf);
    ok(ddp_store_add(s, "tcounter", 0, &v) == DDP_SUCCESS && v == 200, "adds from 4 threads on one handle add up (%lld)", (long long)v);

    /* get and wait block until another process sets */
    t_where("blocking get");
    ok(sbarrier(s, "before-late", p), "store barrier");
    if (rank == 1) {
        int good = get_str(s, "late", buf, sizeof buf);
        double back = t_now();
        ok(good && !strcmp(buf, "finally"), "get blocks until another process sets the key (got '%s')", good ? buf : "?");
        ok(S->t_set[0] > 0 && back >= S->t_set[0] && back - S->t_set[0] < 5,
           "... and returns once it is set (%.3f s after the set)", back - S->t_set[0]);
    } else if (rank == 2) {
        t_sleep_ms(300);
        S->t_set[0] = t_now();
        ok(ddp_store_set(s, "late", "finally", 7) == DDP_SUCCESS, "set the key another process waits for");
    } else if (rank == 3) {
        const char *keys[2] = {"w/a", "w/b"};
        double back;
        r = ddp_store_wait(s, keys, 2, 0);
        back = t_now();
        ok(r == DDP_SUCCESS && S->t_set[1] > 0 && S->t_set[2] > 0 && back >= S->t_set[1] && back >= S->t_set[2],
           "wait for two keys returns after both were set by two other processes -> %s", ddp_strerror(r));
    }
    if (rank == 1) { t_sleep_ms(200); S->t_set[1] = t_now(); ddp_store_set(s, "w/a", "1", 1); }
    if (rank == 2) { t_sleep_ms(200); S->t_set[2] = t_now(); ddp_store_set(s, "w/b", "1", 1); }
    if (rank == 0) {
        const char *keys[1] = {"never"};
        double t0 = t_now(), dt;
        t_where("wait timeout");
        r = ddp_store_wait(s, keys, 1, 300);
        dt = t_now() - t0;
        ok(r == DDP_ERR_TIMEOUT, "wait(timeout 300 ms) on a key nobody sets -> %s", ddp_strerror(r));
        ok(dt >= 0.25 && dt < 4.0, "... promptly (%.3f s; the store's own timeout is 8 s)", dt);
        ok(ddp_store_set(s, "after-timeout", "x", 1) == DDP_SUCCESS && get_str(s, "after-timeout", buf, sizeof buf) &&
           !strcmp(buf, "x"), "the handle works after a timed-out wait");
    }
    if (rank == 1) {   /* a client whose own timeout is short: get times out */
        ddp_store_t *s2 = NULL;
        ddp_store_desc_t d = sdesc(400, NULL, 1);
        double t0, dt;
        t_where("get timeout");
        r = ddp_store_open(&s2, "127.0.0.1", S->port, 0, &d);
        ok(r == DDP_SUCCESS, "second client with timeout 400 ms");
        if (s2) {
            t0 = t_now();
            r = ddp_store_get(s2, "never2", buf, sizeof buf, &len);
            dt = t_now() - t0;
            ok(r == DDP_ERR_TIMEOUT && dt >= 0.3 && dt < 4.0, "get on a key nobody sets -> %s after %.3f s (timeout 0.4 s; the server's 8 s)",
               ddp_strerror(r), dt);
            ok(ddp_store_get(s2, "after-timeout", buf, sizeof buf, &len) == DDP_SUCCESS || ddp_store_set(s2, "k2", "v", 1) == DDP_SUCCESS,
               "the handle works after a timed-out get");
            ok(ddp_store_last_error(s2)[0] != 0, "ddp_store_last_error says why: %s", ddp_store_last_error(s2));
            ok(ddp_store_close(s2) == DDP_SUCCESS, "close the second client");
        }
    }
    t_where("final barrier");
    ok(sbarrier(s, "end", p), "store barrier at the end");
    ok(ddp_store_port(s) == S->port, "ddp_store_port is the server's port on every handle");
    if (rank == 0) {
        double t0 = t_now();
        /* the clients close right after the barrier; the server then closes */
        r = ddp_store_close(s);
        ok(r == DDP_SUCCESS && t_now() - t0 < 6, "server close returns once the clients are gone, including those whose "
           "get/wait timed out (%.3f s; store timeout 8 s)", t_now() - t0);
    } else {
        ok(ddp_store_close(s) == DDP_SUCCESS, "client close");
    }
    return 0;
}

/* ----------------------------------------------------------------- job secret */
static int auth(int rank, int p, void *arg) {
    ddp_store_t *s = NULL, *c = NULL;
    ddp_result_t r;
    char buf[32];
    (void)p; (void)arg;
    unsetenv("DDP_JOB_SECRET");
    if (rank == 0) {
        ddp_store_desc_t d = sdesc(20000, "s3cret", 1);
        r = ddp_store_open(&s, NULL, 0, 1, &d);
        if (!ok(r == DDP_SUCCESS, "server with a job secret")) return 1;
        __atomic_store_n(&S->port, ddp_store_port(s), __ATOMIC_SEQ_CST);
        ok(ddp_store_set(s, "k", "v", 1) == DDP_SUCCESS, "the server's own handle knows the secret");
        while (!__atomic_load_n(&S->server_dead, __ATOMIC_SEQ_CST)) t_sleep_ms(5);   /* "client done" */
        ddp_store_close(s);
        return 0;
    } else {
        static const char *const wrong[] = {"wrong", NULL, "s3cre", "s3cret!", ""};
        int port = wait_port(), i;
        for (i = 0; i < 5; i++) {
            ddp_store_desc_t d = sdesc(20000, wrong[i], 1);
            double t0 = t_now();
            c = NULL;
            r = ddp_store_open(&c, "127.0.0.1", port, 0, &d);
            ok(r == DDP_ERR_AUTH && c == NULL && t_now() - t0 < 10, "secret %s%s%s -> %s (%.3f s, timeout 20 s)", wrong[i] ? "'" : "",
               wrong[i] ? wrong[i] : "NULL (none)", wrong[i] ? "'" : "", ddp_strerror(r), t_now() - t0);
            if (c) ddp_store_close(c);
        }
        {
            ddp_store_desc_t d = sdesc(20000, "s3cret", 1);
            c = NULL;
            r = ddp_store_open(&c, "127.0.0.1", port, 0, &d);
            ok(r == DDP_SUCCESS && c && get_str(c, "k", buf, sizeof buf) && !strcmp(buf, "v"), "the right secret is accepted -> %s", ddp_strerror(r));
            if (c) ddp_store_close(c);
        }
        {
            ddp_store_desc_t d = sdesc(20000, NULL, 1);
            setenv("DDP_JOB_SECRET", "s3cret", 1);
            c = NULL;
            r = ddp_store_open(&c, "127.0.0.1", port, 0, &d);
            ok(r == DDP_SUCCESS && c, "the secret from DDP_JOB_SECRET is used when the desc has none -> %s", ddp_strerror(r));
            if (c) ddp_store_close(c);
            unsetenv("DDP_JOB_SECRET");
        }
        __atomic_store_n(&S->server_dead, 1, __ATOMIC_SEQ_CST);
        return 0;
    }
}

/* Communicators whose ranks were given different secrets. */
static int comm_auth(int rank, int p, void *arg) {
    ddp_comm_desc_t d;
    ddp_comm_t *comm = NULL;
    ddp_result_t r;
    double t0;
    (void)arg;
    unsetenv("DDP_JOB_SECRET");
    /* Rank 1 is refused at once: its timeout is long so that "at once" is far from it; rank 0
     * learns it by its own short timeout. */
    t_desc(&d, rank == 1 ? 30000 : 1500);
    d.job_secret = rank == 0 ? "alpha" : "beta";
    d.log_level = 1;
    t0 = t_now();
    r = ddp_comm_init(&comm, p, rank, &d);
    if (rank == 1) {
        ok(r == DDP_ERR_AUTH, "rank with the wrong job secret: ddp_comm_init -> %s", ddp_strerror(r));
        ok(strstr(ddp_last_init_error(), "secret") != NULL, "the message says it is the secret: %s", ddp_last_init_error());
        ok(t_now() - t0 < 15, "... at once (%.3f s, timeout 30 s)", t_now() - t0);
    } else {
        ok(r != DDP_SUCCESS && t_now() - t0 < 10, "rank 0, whose peer was refused, fails too (%s) within %.3f s (timeout 1.5 s)",
           ddp_strerror(r), t_now() - t0);
    }
    if (comm) ddp_comm_destroy(comm);
    return 0;
}

/* ----------------------------------------------------------------- strangers */
static int raw_connect(int port) {
    struct sockaddr_in a;
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd < 0) return -1;
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) { close(fd); return -1; }
    return fd;
}

/* 1 if the peer closes the connection within ms (reading and discarding whatever comes). */

static int strangers(int rank, int p, void *arg) {
    ddp_store_t *s;
    char buf[64];
    int i;
    (void)arg; (void)p;
    if (rank == 2) {   /* the stranger */
        int port = wait_port(), fd, silent;
        unsigned char junk[256];
        uint32_t hdr[8];
        for (i = 0; i < (int)sizeof junk; i++) junk[i] = (unsigned char)(i * 37 + 11);
        fd = raw_connect(port);
        ok(fd >= 0 && send(fd, junk, sizeof junk, MSG_NOSIGNAL) == (ssize_t)sizeof junk && t_closed_within(fd, 20000),
           "a stranger sending 256 bytes of garbage is disconnected");
        if (fd >= 0) close(fd);
        /* The store's wire header: {u32 magic, op, klen, v1len, v2len, flags; i64 arg}. */
        memset(hdr, 0, sizeof hdr);
        hdr[0] = 0x44445053u;      /* "DDPS" */
        hdr[1] = 2;                /* SET, without the HELLO handshake first */
        hdr[2] = 1; hdr[3] = 1;
        fd = raw_connect(port);
        ok(fd >= 0 && send(fd, hdr, sizeof hdr, MSG_NOSIGNAL) == (ssize_t)sizeof hdr && send(fd, "kv", 2, MSG_NOSIGNAL) == 2 &&
           t_closed_within(fd, 20000), "a stranger sending a request before the handshake is disconnected");
        if (fd >= 0) close(fd);
        hdr[1] = 1;                /* HELLO with an absurd key length */
        hdr[2] = 0xffffff00u;
        fd = raw_connect(port);
        ok(fd >= 0 && send(fd, hdr, sizeof hdr, MSG_NOSIGNAL) == (ssize_t)sizeof hdr && t_closed_within(fd, 20000),
           "a stranger announcing a 4 GiB key is disconnected (no allocation of that size)");
        if (fd >= 0) close(fd);
        /* Half a header, then silence, while rank 1 works; then an idle connection that stays
         * open until the server closes (the server's close must not wait for it). */
        fd = raw_connect(port);
        ok(fd >= 0 && send(fd, hdr, 10, MSG_NOSIGNAL) == 10, "a stranger sends half a header and goes quiet");
        silent = raw_connect(port);
        __atomic_store_n(&S->strangers_ready, 1, __ATOMIC_SEQ_CST);          /* "strangers in place" */
        while (!__atomic_load_n(&S->client_done, __ATOMIC_SEQ_CST)) t_sleep_ms(5);   /* rank 1 done */
        if (fd >= 0) close(fd);
        /* keep `silent` open until the server is gone (or 10 s) */
        if (silent >= 0) { t_closed_within(silent, 10000); close(silent); }
        return 0;
    }
    s = open_store(rank, 8000, NULL);
    if (!s) return 1;
    if (rank == 1) {
        int good = 1;
        double t0 = t_now();
        while (!__atomic_load_n(&S->strangers_ready, __ATOMIC_SEQ_CST) && t_now() - t0 < 20) t_sleep_ms(5);
        for (i = 0; i < 200 && good; i++) {
            char key[32], val[32];
            snprintf(key, sizeof key, "k%d", i);
            snprintf(val, sizeof val, "v%d", i * i);
            good = ddp_store_set(s, key, val, strlen(val)) == DDP_SUCCESS && get_str(s, key, buf, sizeof buf) && !strcmp(buf, val);
        }
        ok(good, "a real client is served normally while strangers misbehave (200 set/get)");
        __atomic_store_n(&S->client_done, 1, __ATOMIC_SEQ_CST);
        ddp_store_close(s);
        return 0;
    }
    /* rank 0, the server */
    while (!__atomic_load_n(&S->client_done, __ATOMIC_SEQ_CST)) t_sleep_ms(5);
    t_sleep_ms(100);   /* rank 1's close reaches the server */
    {
        double t0 = t_now();
        ddp_result_t r = ddp_store_close(s);
        double dt = t_now() - t0;
        ok(r == DDP_SUCCESS && dt < 6, "server close is not held up by an idle unauthenticated connection (%.3f s; store timeout 8 s)", dt);
    }
    return 0;
}

/* ----------------------------------------------------------------- ports */
static int listen_on(const char *ip, int port) {
    struct sockaddr_in a;
    int one = 1, fd = socket(AF_INET, SOCK_STREAM, 0);
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)port);
    inet_pton(AF_INET, ip, &a.sin_addr);
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd, (struct sockaddr *)&a, sizeof a) != 0 || listen(fd, 16) != 0) { close(fd); return -1; }
    return fd;
}

/* Runs f with fd 2 captured; returns what was written to it (static buffer). */
static const char *captured;
static ddp_result_t with_stderr_captured(ddp_result_t (*f)(void *), void *arg) {
    static char out[4096];
    int pfd[2], saved = dup(2);
    ssize_t n;
    ddp_result_t r;
    out[0] = 0;
    if (pipe(pfd) != 0) return f(arg);
    fflush(stderr);
    dup2(pfd[1], 2);
    r = f(arg);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    close(pfd[1]);
    fcntl(pfd[0], F_SETFL, O_NONBLOCK);
    n = read(pfd[0], out, sizeof out - 1);
    out[n > 0 ? n : 0] = 0;
    close(pfd[0]);
    captured = out;
    return r;
}

static int held_port;
static ddp_result_t open_server_on_held(void *arg) {
    ddp_store_t **s = (ddp_store_t **)arg;
    ddp_store_desc_t d = sdesc(30000, NULL, 0);   /* "at once" below is far from it */
    d.log_level = DDP_LOG_WARN + 1;
    return ddp_store_open(s, NULL, held_port, 1, &d);
}

static int ports(int rank, int p, void *arg) {
    static const char *const ips[2] = {"0.0.0.0", "127.0.0.1"};
    int i;
    (void)rank; (void)p; (void)arg;
    for (i = 0; i < 2; i++) {
        int port = t_free_port(), fd = listen_on(ips[i], port);
        ddp_store_t *s = NULL;
        ddp_result_t r;
        double t0;
        if (!ok(fd >= 0, "hold port %d on %s", port, ips[i])) continue;
        held_port = port;
        t0 = t_now();
        r = with_stderr_captured(open_server_on_held, &s);
        ok(r != DDP_SUCCESS && s == NULL && t_now() - t0 < 15, "ddp_store_open(server) on a port %s holds -> %s (%.3f s, timeout 30 s)",
           ips[i], ddp_strerror(r), t_now() - t0);
        ok(strstr(captured, "in use") != NULL && t_mentions_int(captured, port), "the warning says port %d is in use: %.200s", port, captured);
        if (s) ddp_store_close(s);
        {
            ddp_comm_desc_t d;
            ddp_comm_t *comm = NULL;
            t_desc(&d, 30000);
            d.master_port = port;
            d.log_level = 1;
            t0 = t_now();
            r = ddp_comm_init(&comm, 1, 0, &d);
            ok(r != DDP_SUCCESS && comm == NULL && t_now() - t0 < 15, "ddp_comm_init as rank 0 on a port %s holds -> %s (%.3f s, timeout 30 s)",
               ips[i], ddp_strerror(r), t_now() - t0);
            ok(strstr(ddp_last_init_error(), "in use") != NULL && t_mentions_int(ddp_last_init_error(), port),
               "ddp_last_init_error says port %d is in use: %s", port, ddp_last_init_error());
            if (comm) ddp_comm_destroy(comm);
        }
        close(fd);
    }
    {   /* nobody listening: a client gives up after its timeout */
        int port = t_free_port();
        ddp_store_t *s = NULL;
        ddp_store_desc_t d = sdesc(500, NULL, 1);
        double t0 = t_now(), dt;
        ddp_result_t r = ddp_store_open(&s, "127.0.0.1", port, 0, &d);
        dt = t_now() - t0;
        ok(r == DDP_ERR_TIMEOUT && s == NULL, "client to a port nobody listens on -> %s", ddp_strerror(r));
        ok(dt >= 0.4 && dt < 5, "... after its timeout of 0.5 s (%.3f s)", dt);
    }
    {   /* two servers on one port: the second fails */
        ddp_store_t *a = NULL, *b = NULL;
        ddp_store_desc_t d = sdesc(3000, NULL, 1);
        ddp_result_t r = ddp_store_open(&a, NULL, 0, 1, &d);
        if (ok(r == DDP_SUCCESS, "server on port 0")) {
            r = ddp_store_open(&b, NULL, ddp_store_port(a), 1, &d);
            ok(r != DDP_SUCCESS && b == NULL, "a second server on the same port -> %s", ddp_strerror(r));
            if (b) ddp_store_close(b);
            ddp_store_close(a);
        }
    }
    return 0;
}

/* ----------------------------------------------------------------- the server dies */
static int server_dies(int rank, int p, void *arg) {
    ddp_store_t *s;
    (void)p; (void)arg;
    s = open_store(rank, 20000, NULL);
    if (!s) return 1;
    if (rank == 0) {
        t_sleep_ms(400);
        __atomic_store_n(&S->server_dead, 1, __ATOMIC_SEQ_CST);
        _exit(0);   /* no close: the kernel drops the connections, as when a process crashes */
    } else {
        char buf[16];
        size_t len;
        double t0 = t_now(), dt;
        ddp_result_t r = ddp_store_get(s, "never", buf, sizeof buf, &len);
        dt = t_now() - t0;
        ok(r == DDP_ERR_REMOTE, "a get blocked on a server that dies -> %s", ddp_strerror(r));
        ok(dt < 10, "... promptly (%.3f s; timeout 20 s)", dt);
        ok(strstr(ddp_store_last_error(s), "127.0.0.1") != NULL, "the error names the master: %s", ddp_store_last_error(s));
        ddp_store_close(s);
    }
    return 0;
}

/* A client writing 1 MiB to a server that is gone: an error, not SIGPIPE. */
static int dead_write(int rank, int p, void *arg) {
    ddp_store_t *s;
    (void)p; (void)arg;
    s = open_store(rank, 2000, NULL);
    if (!s) return 1;
    if (rank == 0) {
        while (!__atomic_load_n(&S->server_dead, __ATOMIC_SEQ_CST)) t_sleep_ms(2);  /* client ready */
        _exit(0);
    } else {
        size_t n = 1 << 20, i;
        unsigned char *big = (unsigned char *)malloc(n);
        ddp_result_t r;
        for (i = 0; i < n; i++) big[i] = (unsigned char)i;
        ok(ddp_store_set(s, "x", "y", 1) == DDP_SUCCESS, "client connected");
        __atomic_store_n(&S->server_dead, 1, __ATOMIC_SEQ_CST);
        /* Wait until the server really is gone (its port refuses connections): a fixed sleep
         * was too short under TSan, whose exit path is slow. */
        {
            int tries;
            for (tries = 0; tries < 500; tries++) {
                struct sockaddr_in a;
                int fd = socket(AF_INET, SOCK_STREAM, 0), rc;
                memset(&a, 0, sizeof a);
                a.sin_family = AF_INET;
                a.sin_port = htons((uint16_t)S->port);
                a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
                rc = connect(fd, (struct sockaddr *)&a, sizeof a);
                close(fd);
                if (rc != 0) break;
                t_sleep_ms(20);
            }
        }
        r = ddp_store_set(s, "big", big, n);
        ok(r != DDP_SUCCESS, "set of 1 MiB to a dead server -> %s (and this process is still alive)", ddp_strerror(r));
        free(big);
        ddp_store_close(s);
    }
    return 0;
}

/* ----------------------------------------------------------------- communicators on a user's store */
/* Two communicators per process rendezvous through one store the user opened (rank 0 serves
 * it), told apart by store_prefix; DDP_HOST_ID fakes two hosts, so local ranks are per host.
 * Destroying the communicators must leave the user's store open and working. */
static int user_store(int rank, int p, void *arg) {
    ddp_store_t *s;
    ddp_comm_t *a = NULL, *b = NULL;
    ddp_comm_desc_t d;
    ddp_result_t ra, rb;
    int32_t x[64], y[64];
    int i, good, lr_expect = rank / 2, ls_expect = (p + 1 - rank % 2) / 2;
    char buf[16];
    (void)arg;
    setenv("DDP_HOST_ID", rank % 2 ? "host-odd" : "host-even", 1);
    s = open_store(rank, 20000, NULL);
    if (!s) return 1;
    memset(&d, 0, sizeof d);
    d.timeout_ms = 20000;
    d.store = s;
    d.store_prefix = "job-a";
    ra = ddp_comm_init(&a, p, rank, &d);
    d.store_prefix = "job-b";
    rb = ddp_comm_init(&b, p, (rank + 1) % p, &d);   /* another rank order in the second one */
    if (!ok(ra == DDP_SUCCESS && rb == DDP_SUCCESS, "two communicators on the user's store, prefixes job-a and job-b -> %s, %s",
            ddp_strerror(ra), ddp_strerror(rb)))
        return 1;
    ok(ddp_comm_store(a) == s, "ddp_comm_store is the user's store");
    ok(ddp_comm_local_rank(a) == lr_expect && ddp_comm_local_size(a) == ls_expect,
       "DDP_HOST_ID: local rank %d of %d on this fake host (want %d of %d)", ddp_comm_local_rank(a), ddp_comm_local_size(a),
       lr_expect, ls_expect);
    for (i = 0; i < 64; i++) { x[i] = rank; y[i] = 10 * rank; }
    ra = ddp_all_reduce(x, x, 64, DDP_INT32, DDP_SUM, a);
    rb = ddp_all_reduce(y, y, 64, DDP_INT32, DDP_MAX, b);
    for (i = 0, good = ra == DDP_SUCCESS && rb == DDP_SUCCESS; i < 64 && good; i++)
        good = x[i] == p * (p - 1) / 2 && y[i] == 10 * (p - 1);
    ok(good, "all_reduce on both, interleaved (%s, %s)", ddp_strerror(ra), ddp_strerror(rb));
    ok(ddp_comm_destroy(a) == DDP_SUCCESS && ddp_comm_destroy(b) == DDP_SUCCESS, "destroy both");
    ok(ddp_store_set(s, "mine", "still", 5) == DDP_SUCCESS && get_str(s, "mine", buf, sizeof buf) && !strcmp(buf, "still"),
       "the user's store still works after the communicators are gone");
    ok(sbarrier(s, "end", p), "store barrier");
    ok(ddp_store_close(s) == DDP_SUCCESS, "close the user's store");
    return 0;
}

/* ----------------------------------------------------------------- invalid arguments */
static int invalid(int rank, int p, void *arg) {
    ddp_store_t *s = NULL, *x = NULL;
    ddp_store_desc_t d = sdesc(3000, NULL, 1);
    char key[DDP_STORE_MAX_KEY + 2], buf[8];
    size_t len;
    int ex;
    int64_t v;
    const char *keys[2];
    (void)rank; (void)p; (void)arg;
    ok(ddp_store_open(NULL, NULL, 0, 1, &d) == DDP_ERR_INVALID_ARGUMENT, "ddp_store_open(NULL out) -> INVALID_ARGUMENT");
    ok(ddp_store_open(&x, NULL, -1, 1, &d) == DDP_ERR_INVALID_ARGUMENT && !x, "server port -1 -> INVALID_ARGUMENT");
    ok(ddp_store_open(&x, NULL, 65536, 1, &d) == DDP_ERR_INVALID_ARGUMENT && !x, "server port 65536 -> INVALID_ARGUMENT");
    ok(ddp_store_open(&x, "127.0.0.1", 0, 0, &d) == DDP_ERR_INVALID_ARGUMENT && !x, "client port 0 -> INVALID_ARGUMENT");
    ok(ddp_store_open(&x, NULL, 29500, 0, &d) == DDP_ERR_INVALID_ARGUMENT && !x, "client host NULL -> INVALID_ARGUMENT");
    ok(ddp_store_open(&x, "", 29500, 0, &d) == DDP_ERR_INVALID_ARGUMENT && !x, "client host \"\" -> INVALID_ARGUMENT");
    ok(ddp_store_set(NULL, "k", "v", 1) == DDP_ERR_INVALID_ARGUMENT, "set on a NULL store");
    ok(ddp_store_get(NULL, "k", buf, sizeof buf, &len) == DDP_ERR_INVALID_ARGUMENT, "get on a NULL store");
    ok(ddp_store_add(NULL, "k", 1, &v) == DDP_ERR_INVALID_ARGUMENT, "add on a NULL store");
    ok(ddp_store_check(NULL, "k", &ex) == DDP_ERR_INVALID_ARGUMENT, "check on a NULL store");
    ok(ddp_store_delete(NULL, "k", &ex) == DDP_ERR_INVALID_ARGUMENT, "delete on a NULL store");
    keys[0] = "k";
    ok(ddp_store_wait(NULL, keys, 1, 10) == DDP_ERR_INVALID_ARGUMENT, "wait on a NULL store");
    ok(ddp_store_compare_set(NULL, "k", NULL, 0, "v", 1, NULL, 0, NULL) == DDP_ERR_INVALID_ARGUMENT, "compare_set on a NULL store");
    ok(ddp_store_close(NULL) == DDP_ERR_INVALID_ARGUMENT, "ddp_store_close(NULL)");
    ok(ddp_store_port(NULL) == -1, "ddp_store_port(NULL) == -1");
    ok(ddp_store_last_error(NULL) != NULL, "ddp_store_last_error(NULL) is not NULL");
    if (!ok(ddp_store_open(&s, NULL, 0, 1, &d) == DDP_SUCCESS, "a server to misuse")) return 1;
    ok(ddp_store_set(s, NULL, "v", 1) == DDP_ERR_INVALID_ARGUMENT, "set with a NULL key");
    ok(ddp_store_set(s, "", "v", 1) == DDP_ERR_INVALID_ARGUMENT, "set with an empty key");
    memset(key, 'k', sizeof key);
    key[DDP_STORE_MAX_KEY + 1] = 0;
    ok(ddp_store_set(s, key, "v", 1) == DDP_ERR_INVALID_ARGUMENT, "set with a %d-byte key (max %d)", DDP_STORE_MAX_KEY + 1, DDP_STORE_MAX_KEY);
    key[DDP_STORE_MAX_KEY] = 0;
    ok(ddp_store_set(s, key, "v", 1) == DDP_SUCCESS && ddp_store_get(s, key, buf, sizeof buf, &len) == DDP_SUCCESS && len == 1,
       "a key of exactly %d bytes works", DDP_STORE_MAX_KEY);
    ok(ddp_store_set(s, "k", NULL, 5) == DDP_ERR_INVALID_ARGUMENT, "set with a NULL value of length 5");
    ok(ddp_store_set(s, "k", buf, (size_t)DDP_STORE_MAX_VALUE + 1) == DDP_ERR_INVALID_ARGUMENT, "set with a value over DDP_STORE_MAX_VALUE (not read)");
    ok(ddp_store_set(s, "k", buf, SIZE_MAX) == DDP_ERR_INVALID_ARGUMENT, "set with a SIZE_MAX length (not read)");
    ok(ddp_store_get(s, "k", NULL, 4, &len) == DDP_ERR_INVALID_ARGUMENT, "get with a NULL buffer and cap 4");
    ok(ddp_store_get(s, NULL, buf, sizeof buf, &len) == DDP_ERR_INVALID_ARGUMENT, "get with a NULL key");
    ok(ddp_store_add(s, NULL, 1, &v) == DDP_ERR_INVALID_ARGUMENT, "add with a NULL key");
    ok(ddp_store_wait(s, keys, -1, 10) == DDP_ERR_INVALID_ARGUMENT, "wait with nkeys -1");
    ok(ddp_store_wait(s, NULL, 1, 10) == DDP_ERR_INVALID_ARGUMENT, "wait with NULL keys");
    keys[0] = "k"; keys[1] = NULL;
    ok(ddp_store_wait(s, keys, 2, 10) == DDP_ERR_INVALID_ARGUMENT, "wait with a NULL key in the list");
    ok(ddp_store_wait(s, keys, 0, 10) == DDP_SUCCESS, "wait for no keys returns at once");
    ok(ddp_store_compare_set(s, "k", NULL, 3, "v", 1, NULL, 0, NULL) == DDP_ERR_INVALID_ARGUMENT, "compare_set with a NULL expected of length 3");
    ok(ddp_store_compare_set(s, "k", NULL, 0, NULL, 1, NULL, 0, NULL) == DDP_ERR_INVALID_ARGUMENT, "compare_set with a NULL desired of length 1");
    ok(ddp_store_compare_set(s, "k", NULL, 0, "v", 1, NULL, 4, &len) == DDP_ERR_INVALID_ARGUMENT, "compare_set with a NULL actual and cap 4");
    ok(ddp_store_set(s, "still", "ok", 2) == DDP_SUCCESS && ddp_store_get(s, "still", buf, sizeof buf, &len) == DDP_SUCCESS && len == 2,
       "the store still works after all that");
    ok(ddp_store_close(s) == DDP_SUCCESS, "close");
    return 0;
}

/* ----------------------------------------------------------------- hardening: raw protocol */
/* Reads exactly n bytes within ms; 1 on success. */
static int recv_exact(int fd, void *buf, size_t n, int ms) {
    char *p = (char *)buf;
    double t0 = t_now();
    while (n) {
        struct pollfd pfd;
        int left = ms - (int)((t_now() - t0) * 1000);
        ssize_t k;
        if (left <= 0) return 0;
        pfd.fd = fd; pfd.events = POLLIN; pfd.revents = 0;
        if (poll(&pfd, 1, left) <= 0) continue;
        k = recv(fd, p, n, MSG_DONTWAIT);
        if (k == 0 || (k < 0 && errno != EAGAIN && errno != EINTR)) return 0;
        if (k > 0) { p += k; n -= (size_t)k; }
    }
    return 1;
}

/* Builds a HELLO carrying nonce_c and (if proof) a proof; returns its length. */
static size_t raw_hello(unsigned char *msg, const unsigned char *nonce_c, const unsigned char *proof) {
    _ddp_store_req_t rq;
    memset(&rq, 0, sizeof rq);
    rq.magic = _DDP_STORE_MAGIC;
    rq.op = _DDP_ST_HELLO;
    rq.v1len = proof ? 64 : 32;
    rq.flags = proof ? _DDP_ST_HELLO_PROOF : 0;
    rq.arg = _DDP_STORE_PROTO;
    memcpy(msg, &rq, sizeof rq);
    memcpy(msg + sizeof rq, nonce_c, 32);
    if (proof) memcpy(msg + sizeof rq + 32, proof, 32);
    return sizeof rq + rq.v1len;
}

static size_t raw_request(unsigned char *msg, uint32_t op, const char *key, const char *val) {
    _ddp_store_req_t rq;
    memset(&rq, 0, sizeof rq);
    rq.magic = _DDP_STORE_MAGIC;
    rq.op = op;
    rq.klen = (uint32_t)strlen(key);
    rq.v1len = val ? (uint32_t)strlen(val) : 0;
    memcpy(msg, &rq, sizeof rq);
    memcpy(msg + sizeof rq, key, rq.klen);
    if (val) memcpy(msg + sizeof rq + rq.klen, val, rq.v1len);
    return sizeof rq + rq.klen + rq.v1len;
}

/* One stranger attempt: read the challenge, send `how`, expect one DDP_ERR_AUTH answer (or
 * none) and then the end of the connection. Returns 1 if that is what happened. */
enum { SEND_NO_PROOF, SEND_WRONG_KEY, SEND_REPLAY, SEND_SET_FIRST, SEND_GET_FIRST, SEND_HELLO_THEN_SET };
static int stranger_attempt(int port, int how, char *what, size_t whatcap) {
    static const char *const names[] = {"a hello without proof", "a proof under a wrong key",
        "a replayed proof (right key, another server nonce)", "a SET instead of the hello",
        "a GET instead of the hello", "a wrong proof with a SET right behind it"};
    _ddp_store_chal_t ch;
    _ddp_store_resp_t resp;
    unsigned char msg[512], nc[32], proof[32], other[32];
    size_t n = 0;
    int fd = raw_connect(port), good = 1, expect_answer = how != SEND_SET_FIRST && how != SEND_GET_FIRST;
    snprintf(what, whatcap, "%s", names[how]);
    if (fd < 0) return 0;
    if (!recv_exact(fd, &ch, sizeof ch, 5000) || ch.magic != _DDP_STORE_MAGIC || !(ch.flags & _DDP_ST_CHAL_SECRET)) {
        close(fd);
        return 0;
    }
    memset(nc, 0x5a, sizeof nc);
    memset(other, 0x11, sizeof other);
    switch (how) {
    case SEND_NO_PROOF: n = raw_hello(msg, nc, NULL); break;
    case SEND_WRONG_KEY:
        _ddp_auth_proof("not-the-secret", 14, _DDP_AUTH_CLIENT, "store", ch.nonce, nc, proof);
        n = raw_hello(msg, nc, proof);
        break;
    case SEND_REPLAY:   /* what an eavesdropper captured from an earlier session: valid, for another nonce */
        _ddp_auth_proof("raw-s3cret", 10, _DDP_AUTH_CLIENT, "store", other, nc, proof);
        n = raw_hello(msg, nc, proof);
        break;
    case SEND_SET_FIRST: n = raw_request(msg, _DDP_ST_SET, "a", "evil"); break;
    case SEND_GET_FIRST: n = raw_request(msg, _DDP_ST_GET, "a", NULL); break;
    case SEND_HELLO_THEN_SET:
        memset(proof, 0x77, sizeof proof);
        n = raw_hello(msg, nc, proof);
        n += raw_request(msg + n, _DDP_ST_SET, "evil", "x");
        break;
    }
    if (send(fd, msg, n, MSG_NOSIGNAL) != (ssize_t)n) good = 0;
    if (good && expect_answer)
        good = recv_exact(fd, &resp, sizeof resp, 5000) && resp.magic == _DDP_STORE_MAGIC &&
               resp.status == DDP_ERR_AUTH && resp.vlen == 0;
    /* then nothing more (no value ever), and the server closes the connection */
    if (good) good = t_closed_within(fd, 20000);
    close(fd);
    return good;
}

static int raw_strangers(int rank, int p, void *arg) {
    char buf[32];
    (void)p; (void)arg;
    unsetenv("DDP_JOB_SECRET");
    if (rank == 0) {
        ddp_store_t *s = NULL;
        ddp_store_desc_t d = sdesc(20000, "raw-s3cret", 1);
        int ex = 1;
        if (!ok(ddp_store_open(&s, NULL, 0, 1, &d) == DDP_SUCCESS, "server with a job secret")) return 1;
        ok(ddp_store_set(s, "a", "1", 1) == DDP_SUCCESS, "set a = 1");
        __atomic_store_n(&S->port, ddp_store_port(s), __ATOMIC_SEQ_CST);
        while (!__atomic_load_n(&S->client_done, __ATOMIC_SEQ_CST)) t_sleep_ms(5);
        ok(get_str(s, "a", buf, sizeof buf) && !strcmp(buf, "1"), "after the strangers: a is still 1 (got '%s')", buf);
        ok(ddp_store_check(s, "evil", &ex) == DDP_SUCCESS && ex == 0, "after the strangers: no key 'evil'");
        ddp_store_close(s);
        return 0;
    } else {
        int port = wait_port(), how;
        char what[128];
        for (how = SEND_NO_PROOF; how <= SEND_HELLO_THEN_SET; how++) {
            int good = stranger_attempt(port, how, what, sizeof what);
            ok(good, "a stranger sending %s %s", what, how == SEND_SET_FIRST || how == SEND_GET_FIRST ?
               "gets no answer and is disconnected" : "gets one DDP_ERR_AUTH answer, nothing else, and is disconnected");
        }
        {   /* the library's own client with a wrong secret */
            ddp_store_t *c = NULL;
            ddp_store_desc_t d = sdesc(5000, "raw-s3cret-but-wrong", 1);
            ok(ddp_store_open(&c, "127.0.0.1", port, 0, &d) == DDP_ERR_AUTH && !c, "a client with a wrong secret -> DDP_ERR_AUTH");
            if (c) ddp_store_close(c);
        }
        __atomic_store_n(&S->client_done, 1, __ATOMIC_SEQ_CST);
        return 0;
    }
}

/* ----------------------------------------------------------------- hardening: a fake master */
typedef struct { int listen_fd; int mode; unsigned char got[4096]; size_t got_len; } fake_master_t;
static void *fake_master(void *arg) {
    fake_master_t *f = (fake_master_t *)arg;
    int fd = accept(f->listen_fd, NULL, NULL);
    _ddp_store_chal_t ch;
    _ddp_store_resp_t resp;
    unsigned char proof[32];
    if (fd < 0) return NULL;
    memset(&ch, 0, sizeof ch);
    ch.magic = _DDP_STORE_MAGIC;
    ch.proto = f->mode == 2 ? 3u : _DDP_STORE_PROTO;   /* 2: an older libddp (protocol 3) */
    ch.flags = f->mode == 0 ? 0 : _DDP_ST_CHAL_SECRET;   /* 0: "no secret needed", 1: a wrong proof */
    memset(ch.nonce, 3, sizeof ch.nonce);
    if (send(fd, &ch, sizeof ch, MSG_NOSIGNAL) == (ssize_t)sizeof ch && f->mode == 1 &&
        recv_exact(fd, f->got, _DDP_STORE_HELLO_BYTES, 5000)) {
        f->got_len = _DDP_STORE_HELLO_BYTES;
        memset(&resp, 0, sizeof resp);
        resp.magic = _DDP_STORE_MAGIC;
        resp.status = DDP_SUCCESS;
        resp.vlen = 32;
        memset(proof, 0x42, sizeof proof);
        if (send(fd, &resp, sizeof resp, MSG_NOSIGNAL) < 0 || send(fd, proof, sizeof proof, MSG_NOSIGNAL) < 0) {}
    }
    t_closed_within(fd, 5000);
    close(fd);
    return NULL;
}

static int contains(const unsigned char *hay, size_t n, const void *needle, size_t m) {
    size_t i;
    for (i = 0; m && i + m <= n; i++) if (!memcmp(hay + i, needle, m)) return 1;
    return 0;
}

static int fake_masters(int rank, int p, void *arg) {
    static const char secret[] = "fake-master-test-secret";
    int mode;
    (void)rank; (void)p; (void)arg;
    for (mode = 0; mode < 2; mode++) {
        fake_master_t f;
        pthread_t th;
        ddp_store_t *c = NULL;
        ddp_store_desc_t d = sdesc(5000, secret, 1);
        int port = t_free_port();
        ddp_result_t r;
        memset(&f, 0, sizeof f);
        f.mode = mode;
        f.listen_fd = listen_on("127.0.0.1", port);
        if (!ok(f.listen_fd >= 0, "fake master listens on %d", port)) continue;
        pthread_create(&th, NULL, fake_master, &f);
        r = ddp_store_open(&c, "127.0.0.1", port, 0, &d);
        ok(r == DDP_ERR_AUTH && !c, "a client refuses a fake master that %s -> %s", mode == 0 ? "asks for no secret" :
           "answers with a wrong proof", ddp_strerror(r));
        if (c) ddp_store_close(c);
        pthread_join(th, NULL);
        close(f.listen_fd);
        if (mode == 1)
            ok(f.got_len > 0 && !contains(f.got, f.got_len, secret, strlen(secret)),
               "the fake master got a hello (%zu bytes) without the secret in it", f.got_len);
    }
    {   /* a master of another store protocol version: refused at once, naming both versions */
        fake_master_t f;
        pthread_t th;
        ddp_store_t *c = NULL;
        ddp_store_desc_t d = sdesc(5000, secret, 1);
        char err[512] = "", want[64];
        int port = t_free_port();
        ddp_result_t r;
        memset(&f, 0, sizeof f);
        f.mode = 2;
        f.listen_fd = listen_on("127.0.0.1", port);
        if (ok(f.listen_fd >= 0, "fake master listens on %d", port)) {
            pthread_create(&th, NULL, fake_master, &f);
            r = _ddp_store_open(&c, "127.0.0.1", port, 0, &d, err, sizeof err);
            snprintf(want, sizeof want, "version 3, this rank %u", _DDP_STORE_PROTO);
            ok(r == DDP_ERR_MISMATCH && !c && strstr(err, want), "a master speaking store protocol 3 -> %s: %s",
               ddp_strerror(r), err);
            if (c) ddp_store_close(c);
            pthread_join(th, NULL);
            close(f.listen_fd);
        }
    }
    return 0;
}

/* ----------------------------------------------------------------- hardening: the wire */
typedef struct { int listen_fd, target_port; unsigned char *cap; size_t cap_len, cap_max; int done; } relay_t;

/* Accepts one connection, forwards both ways to target_port, records every byte. */
static void *relay_thread(void *arg) {
    relay_t *r = (relay_t *)arg;
    int a = accept(r->listen_fd, NULL, NULL), b = a >= 0 ? raw_connect(r->target_port) : -1;
    int open_a = 1, open_b = 1;
    while (a >= 0 && b >= 0 && (open_a || open_b)) {
        struct pollfd pfd[2];
        int i;
        pfd[0].fd = open_a ? a : -1; pfd[0].events = POLLIN; pfd[0].revents = 0;
        pfd[1].fd = open_b ? b : -1; pfd[1].events = POLLIN; pfd[1].revents = 0;
        if (poll(pfd, 2, 20000) <= 0) break;
        for (i = 0; i < 2; i++) {
            unsigned char buf[65536];
            ssize_t n;
            int from = i == 0 ? a : b, to = i == 0 ? b : a;
            if (!pfd[i].revents) continue;
            n = recv(from, buf, sizeof buf, 0);
            if (n <= 0) {
                shutdown(to, SHUT_WR);
                if (i == 0) open_a = 0; else open_b = 0;
                continue;
            }
            if (r->cap_len + (size_t)n <= r->cap_max) { memcpy(r->cap + r->cap_len, buf, (size_t)n); r->cap_len += (size_t)n; }
            if (send(to, buf, (size_t)n, MSG_NOSIGNAL) != n) { open_a = open_b = 0; }
        }
    }
    if (a >= 0) close(a);
    if (b >= 0) close(b);
    __atomic_store_n(&r->done, 1, __ATOMIC_SEQ_CST);
    return NULL;
}

static int wire(int rank, int p, void *arg) {
    static const char secret[] = "Zq9-wire-secret-7fK2";
    ddp_store_t *srv = NULL, *c = NULL;
    ddp_store_desc_t d = sdesc(10000, secret, 1);
    relay_t r;
    pthread_t th;
    char hex[2 * sizeof secret + 1], HEX[2 * sizeof secret + 1], buf[64];
    const char *keys[2] = {"wire/k", "wire/n"};
    int64_t v = 0;
    int i, ex = 0, good, rport = t_free_port();
    size_t len = 0, sl = strlen(secret);
    (void)rank; (void)p; (void)arg;
    unsetenv("DDP_JOB_SECRET");
    if (!ok(ddp_store_open(&srv, NULL, 0, 1, &d) == DDP_SUCCESS, "server with a distinctive secret")) return 1;
    memset(&r, 0, sizeof r);
    r.cap_max = 1 << 20;
    r.cap = (unsigned char *)malloc(r.cap_max);
    r.target_port = ddp_store_port(srv);
    r.listen_fd = listen_on("127.0.0.1", rport);
    if (!ok(r.listen_fd >= 0 && r.cap, "relay listening on %d", rport)) return 1;
    pthread_create(&th, NULL, relay_thread, &r);
    good = ddp_store_open(&c, "127.0.0.1", rport, 0, &d) == DDP_SUCCESS;
    ok(good, "a client through the relay authenticates");
    if (good) {
        good = ddp_store_set(c, "wire/k", "value-1", 7) == DDP_SUCCESS &&
               get_str(c, "wire/k", buf, sizeof buf) && !strcmp(buf, "value-1") &&
               ddp_store_add(c, "wire/n", 5, &v) == DDP_SUCCESS && v == 5 &&
               ddp_store_compare_set(c, "wire/k", "value-1", 7, "value-2", 7, buf, sizeof buf, &len) == DDP_SUCCESS &&
               ddp_store_wait(c, keys, 2, 0) == DDP_SUCCESS &&
               ddp_store_check(c, "wire/k", &ex) == DDP_SUCCESS && ex == 1 &&
               ddp_store_delete(c, "wire/n", &ex) == DDP_SUCCESS && ex == 1;
        ok(good, "set, get, add, compare_set, wait, check and delete through the relay");
        ddp_store_close(c);
    }
    for (i = 0; i < 400 && !__atomic_load_n(&r.done, __ATOMIC_SEQ_CST); i++) t_sleep_ms(10);
    pthread_join(th, NULL);
    close(r.listen_fd);
    for (i = 0; i < (int)sl; i++) {
        snprintf(hex + 2 * i, 3, "%02x", (unsigned char)secret[i]);
        snprintf(HEX + 2 * i, 3, "%02X", (unsigned char)secret[i]);
    }
    ok(r.cap_len > 200 && contains(r.cap, r.cap_len, "wire/k", 6) && contains(r.cap, r.cap_len, "value-2", 7),
       "the relay captured the session (%zu bytes, keys and values in clear)", r.cap_len);
    ok(!contains(r.cap, r.cap_len, secret, sl), "the secret is not in the capture");
    ok(!contains(r.cap, r.cap_len, hex, 2 * sl) && !contains(r.cap, r.cap_len, HEX, 2 * sl), "nor its hex");
    ok(!contains(r.cap, r.cap_len, secret, 8), "nor its first 8 bytes");
    free(r.cap);
    ddp_store_close(srv);
    return 0;
}

/* ----------------------------------------------------------------- hardening: pre-auth memory */
static long rss_kib(void) {
    char line[256];
    long kib = -1;
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return -1;
    while (fgets(line, sizeof line, f)) if (!strncmp(line, "VmRSS:", 6)) { kib = atol(line + 6); break; }
    fclose(f);
    return kib;
}

static int preauth_memory(int rank, int p, void *arg) {
    ddp_store_t *s = NULL, *c = NULL;
    ddp_store_desc_t d = sdesc(10000, "mem-secret", 1);
    static unsigned char junk[65536];
    long before, after;
    int i, closed = 0;
    char buf[16];
    (void)rank; (void)p; (void)arg;
    unsetenv("DDP_JOB_SECRET");
    if (!ok(ddp_store_open(&s, NULL, 0, 1, &d) == DDP_SUCCESS, "server")) return 1;
    memset(junk, 0xab, sizeof junk);
    before = rss_kib();
    for (i = 0; i < 16; i++) {
        _ddp_store_chal_t ch;
        _ddp_store_req_t rq;
        int fd = raw_connect(ddp_store_port(s));
        memset(&rq, 0, sizeof rq);
        rq.magic = _DDP_STORE_MAGIC;
        rq.op = i % 4 == 3 ? _DDP_ST_SET : _DDP_ST_HELLO;
        rq.klen = i % 4 == 0 ? 0xfffffff0u : 0;
        rq.v1len = i % 4 == 1 || i % 4 == 3 ? DDP_STORE_MAX_VALUE : 0;
        rq.v2len = i % 4 == 2 ? 0x7fffffffu : 0;
        rq.arg = _DDP_STORE_PROTO;
        if (fd < 0) continue;
        if (recv_exact(fd, &ch, sizeof ch, 5000) && send(fd, &rq, sizeof rq, MSG_NOSIGNAL) == (ssize_t)sizeof rq) {
            if (send(fd, junk, sizeof junk, MSG_NOSIGNAL | MSG_DONTWAIT) < 0) {}   /* best effort: it may be closed already */
            closed += t_closed_within(fd, 20000);
        }
        close(fd);
    }
    after = rss_kib();
    ok(closed == 16, "16 connections announcing up to 4 GiB before authenticating are all closed (%d)", closed);
    ok(before > 0 && after - before <= 1024, "the server's process grew by %ld KiB (at most 1024)", after - before);
    ok(ddp_store_open(&c, "127.0.0.1", ddp_store_port(s), 0, &d) == DDP_SUCCESS &&
       ddp_store_set(c, "k", "v", 1) == DDP_SUCCESS && get_str(c, "k", buf, sizeof buf) && !strcmp(buf, "v"),
       "a real client is served afterwards");
    if (c) ddp_store_close(c);
    ddp_store_close(s);
    return 0;
}

/* ----------------------------------------------------------------- batches (ddp_store_batch) */
typedef struct { ddp_store_t *c; ddp_store_op_t ops[3]; char got[16]; ddp_result_t r; } parked_batch_t;
static void *parked_batch(void *arg) {
    parked_batch_t *b = (parked_batch_t *)arg;
    b->r = ddp_store_batch(b->c, b->ops, 3);
    return NULL;
}

static int batches(int rank, int p, void *arg) {
    ddp_store_t *s = NULL, *c = NULL;
    ddp_store_desc_t d = sdesc(10000, "", 1);
    ddp_store_op_t ops[200];
    parked_batch_t pb;
    pthread_t th;
    char got[16], cas[16];
    double t0;
    int i, exists = 1;
    ddp_result_t r;
    (void)rank; (void)p; (void)arg;
    unsetenv("DDP_JOB_SECRET");
    if (!ok(ddp_store_open(&s, NULL, 0, 1, &d) == DDP_SUCCESS &&
            ddp_store_open(&c, "127.0.0.1", ddp_store_port(s), 0, &d) == DDP_SUCCESS, "server and client")) return 1;
    /* every kind, each with its own answer */
    memset(ops, 0, sizeof ops);
    ops[0].kind = DDP_STORE_OP_SET; ops[0].key = "a"; ops[0].value = "va"; ops[0].len = 2;
    ops[1].kind = DDP_STORE_OP_ADD; ops[1].key = "n"; ops[1].delta = 5;
    ops[2].kind = DDP_STORE_OP_GET; ops[2].key = "a"; ops[2].out = got; ops[2].cap = 1;   /* full length 2 */
    ops[3].kind = DDP_STORE_OP_COMPARE_SET; ops[3].key = "c"; ops[3].value = "x"; ops[3].len = 1;
    ops[3].out = cas; ops[3].cap = sizeof cas;
    ops[4].kind = DDP_STORE_OP_WAIT; ops[4].key = "a";
    ops[5].kind = DDP_STORE_OP_CHECK; ops[5].key = "a";
    ops[6].kind = DDP_STORE_OP_DELETE; ops[6].key = "a";
    ops[7].kind = DDP_STORE_OP_CHECK; ops[7].key = "a";
    ops[8].kind = DDP_STORE_OP_ADD; ops[8].key = "n"; ops[8].delta = -2;
    r = ddp_store_batch(c, ops, 9);
    ok(r == DDP_SUCCESS, "batch of 9 (set, add, get, compare_set, wait, check, "
       "delete, check, add) -> success");
    for (i = 0; i < 9 && ops[i].result == DDP_SUCCESS; i++) {}
    ok(i == 9, "batch: every op's own result is success (first other: %d)", i);
    ok(ops[1].num == 5 && ops[8].num == 3, "batch: the adds answer 5 and 3 (%lld, %lld)",
       (long long)ops[1].num, (long long)ops[8].num);
    ok(ops[2].out_len == 2 && got[0] == 'v', "batch: get into 1 byte copies 'v' and says 2 (%zu)", ops[2].out_len);
    ok(ops[3].out_len == 1 && cas[0] == 'x', "batch: compare_set on a missing key sets it (%zu)", ops[3].out_len);
    ok(ops[5].num == 1 && ops[6].num == 1 && ops[7].num == 0, "batch: check 1, delete 1, check 0 (%lld %lld %lld)",
       (long long)ops[5].num, (long long)ops[6].num, (long long)ops[7].num);
    /* GET_IF_SET answers at once, found or not; a WAIT on several keys, any of them */
    {
        const char *wk[2] = {"absent", "n"};
        char v[8];
        memset(ops, 0, sizeof ops);
        ops[0].kind = DDP_STORE_OP_GET_IF_SET; ops[0].key = "n"; ops[0].out = v; ops[0].cap = sizeof v;
        ops[1].kind = DDP_STORE_OP_GET_IF_SET; ops[1].key = "absent"; ops[1].out = v; ops[1].cap = sizeof v;
        ops[2].kind = DDP_STORE_OP_WAIT; ops[2].keys = wk; ops[2].nkeys = 2; ops[2].any = 1;
        r = ddp_store_batch(c, ops, 3);
        ok(r == DDP_SUCCESS && ops[0].num == 1 && ops[0].out_len == 1 && v[0] == '3' && ops[1].num == 0 &&
           ops[1].out_len == 0, "batch: get_if_set finds 'n' = 3 and answers 'absent' missing at once (%s)",
           ddp_strerror(r));
        ok(ops[2].result == DDP_SUCCESS, "batch: a wait for any of 'absent' and 'n' is answered");
    }
    /* more than one window: 200 adds, in order */
    memset(ops, 0, sizeof ops);
    for (i = 0; i < 200; i++) { ops[i].kind = DDP_STORE_OP_ADD; ops[i].key = "w"; ops[i].delta = 1; }
    r = ddp_store_batch(c, ops, 200);
    ok(r == DDP_SUCCESS && ops[0].num == 1 && ops[63].num == 64 && ops[64].num == 65 && ops[199].num == 200,
       "batch of 200 adds (windows of 64): answers 1, 64, 65, 200 in order (%lld %lld)",
       (long long)ops[64].num, (long long)ops[199].num);
    /* an invalid op: nothing is sent */
    memset(ops, 0, sizeof ops);
    ops[0].kind = DDP_STORE_OP_SET; ops[0].key = "never"; ops[0].value = "1"; ops[0].len = 1;
    ops[1].kind = DDP_STORE_OP_GET; ops[1].key = "";
    ok(ddp_store_batch(c, ops, 2) == DDP_ERR_INVALID_ARGUMENT && ops[1].result == DDP_ERR_INVALID_ARGUMENT &&
       ddp_store_check(c, "never", &exists) == DDP_SUCCESS && !exists,
       "batch with an empty key -> invalid argument, and none of it ran: %s", ddp_store_last_error(c));
    /* requests pipelined behind a parked wait run once it is answered (protocol 4) */
    memset(&pb, 0, sizeof pb);
    pb.c = c;
    pb.ops[0].kind = DDP_STORE_OP_WAIT; pb.ops[0].key = "late";
    pb.ops[1].kind = DDP_STORE_OP_GET; pb.ops[1].key = "late"; pb.ops[1].out = pb.got; pb.ops[1].cap = sizeof pb.got;
    pb.ops[2].kind = DDP_STORE_OP_ADD; pb.ops[2].key = "after"; pb.ops[2].delta = 1;
    t0 = t_now();
    if (pthread_create(&th, NULL, parked_batch, &pb) == 0) {
        t_sleep_ms(300);
        ddp_store_set(s, "late", "L", 1);
        pthread_join(th, NULL);
        ok(pb.r == DDP_SUCCESS && pb.ops[1].out_len == 1 && pb.got[0] == 'L' && pb.ops[2].num == 1,
           "batch [wait late, get late, add] behind a wait parked %.2f s: all answered after the set (%s)",
           t_now() - t0, ddp_strerror(pb.r));
    }
    ok(ddp_store_add(c, "after", 1, NULL) == DDP_SUCCESS, "the client's connection serves on afterwards");
    ddp_store_close(c);
    ddp_store_close(s);
    return 0;
}

/* A client that pipelines requests and never reads the answers: the server stops reading it
 * once 256 KiB of answers wait (and keeps at most 64 KiB read ahead), so 512 GETs of a 1 MiB
 * value do not become 512 MiB of answers in the server's memory; other clients are served. */
static int pipeline_memory(int rank, int p, void *arg) {
    ddp_store_t *s = NULL, *c = NULL;
    ddp_store_desc_t d = sdesc(10000, "", 1);
    static unsigned char big[1 << 20], reqs[512 * 64];
    unsigned char msg[128], nonce[32];
    _ddp_store_chal_t ch;
    _ddp_store_resp_t w;
    size_t n = 0, sent = 0;
    long before, after;
    double t0;
    int fd, i;
    char buf[16];
    (void)rank; (void)p; (void)arg;
    unsetenv("DDP_JOB_SECRET");
    if (!ok(ddp_store_open(&s, NULL, 0, 1, &d) == DDP_SUCCESS, "server")) return 1;
    memset(big, 0x5a, sizeof big);
    memset(nonce, 7, sizeof nonce);
    ddp_store_set(s, "big", big, sizeof big);
    fd = raw_connect(ddp_store_port(s));
    if (!ok(fd >= 0 && recv_exact(fd, &ch, sizeof ch, 5000) &&
            send(fd, msg, raw_hello(msg, nonce, NULL), MSG_NOSIGNAL) > 0 && recv_exact(fd, &w, sizeof w, 5000) &&
            w.status == DDP_SUCCESS, "a raw client authenticates (no secret)")) return 1;
    for (i = 0; i < 512; i++) n += raw_request(reqs + n, _DDP_ST_GET, "big", NULL);
    before = rss_kib();
    t0 = t_now();
    while (sent < n && t_now() - t0 < 3) {   /* as far as the sockets take them */
        ssize_t k = send(fd, reqs + sent, n - sent, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (k > 0) sent += (size_t)k;
        else t_sleep_ms(10);
    }
    t_sleep_ms(300);
    after = rss_kib();
    ok(before > 0 && after - before <= 8192, "512 pipelined GETs of 1 MiB never read (%zu of %zu bytes sent): "
       "the server's process grew by %ld KiB (at most 8192)", sent, n, after - before);
    ok(ddp_store_open(&c, "127.0.0.1", ddp_store_port(s), 0, &d) == DDP_SUCCESS &&
       ddp_store_set(c, "k", "v", 1) == DDP_SUCCESS && get_str(c, "k", buf, sizeof buf) && !strcmp(buf, "v"),
       "another client is served meanwhile");
    close(fd);
    /* parked with requests read ahead, then more comes: no busy loop, and its hangup is seen */
    fd = raw_connect(ddp_store_port(s));
    if (fd >= 0 && recv_exact(fd, &ch, sizeof ch, 5000) && send(fd, msg, raw_hello(msg, nonce, NULL), MSG_NOSIGNAL) > 0 &&
        recv_exact(fd, &w, sizeof w, 5000)) {
        struct rusage ru0, ru1;
        double cpu;
        n = raw_request(reqs, _DDP_ST_WAIT, "never", NULL);
        n += raw_request(reqs + n, _DDP_ST_GET, "k", NULL);
        if (send(fd, reqs, n, MSG_NOSIGNAL) < 0) {}
        t_sleep_ms(100);
        n = raw_request(reqs, _DDP_ST_GET, "k", NULL);
        if (send(fd, reqs, n, MSG_NOSIGNAL) < 0) {}
        getrusage(RUSAGE_SELF, &ru0);
        t_sleep_ms(500);
        getrusage(RUSAGE_SELF, &ru1);
        cpu = (double)(ru1.ru_utime.tv_sec - ru0.ru_utime.tv_sec + ru1.ru_stime.tv_sec - ru0.ru_stime.tv_sec) +
              (double)(ru1.ru_utime.tv_usec - ru0.ru_utime.tv_usec + ru1.ru_stime.tv_usec - ru0.ru_stime.tv_usec) * 1e-6;
        ok(cpu < 0.25, "a parked client with requests read ahead that sends more: the server idles (%.3f s of "
           "CPU in 0.5 s)", cpu);
        close(fd);
        t_sleep_ms(100);
        ok(c && get_str(c, "k", buf, sizeof buf) && !strcmp(buf, "v"), "its hangup is seen; others are served");
    }
    if (c) ddp_store_close(c);
    ddp_store_close(s);
    return 0;
}

/* ----------------------------------------------------------------- hardening: 2,000 idle connections */
#define IDLE_CONNS 2000
static int idle_hard_1024;   /* set by the parent before the run */

static void *idle_waiter(void *arg) {
    ddp_store_t *s = (ddp_store_t *)arg;
    const char *keys[1] = {"idle/go"};
    return (void *)(intptr_t)(ddp_store_wait(s, keys, 1, 0) == DDP_SUCCESS);
}

static int idle_conns(int rank, int p, void *arg) {
    static const char secret[] = "idle-secret";
    (void)p; (void)arg;
    unsetenv("DDP_JOB_SECRET");
    if (rank == 0) {   /* the server, started under RLIMIT_NOFILE soft 1024 */
        struct rlimit rl;
        ddp_store_t *s = NULL, *c = NULL;
        ddp_store_desc_t d = sdesc(60000, secret, 1);
        char buf[16];
        getrlimit(RLIMIT_NOFILE, &rl);
        rl.rlim_cur = 1024;
        if (idle_hard_1024) rl.rlim_max = 1024;
        else if (rl.rlim_max < 4 * IDLE_CONNS) rl.rlim_max = 4 * IDLE_CONNS;   /* root may raise it; else kept */
        if (setrlimit(RLIMIT_NOFILE, &rl) != 0) { getrlimit(RLIMIT_NOFILE, &rl); rl.rlim_cur = 1024; setrlimit(RLIMIT_NOFILE, &rl); }
        if (!ok(ddp_store_open(&s, NULL, 0, 1, &d) == DDP_SUCCESS, "server under RLIMIT_NOFILE 1024 (hard %s)",
                idle_hard_1024 ? "1024" : "higher"))
            return 1;
        getrlimit(RLIMIT_NOFILE, &rl);
        S->server_soft = (int)(rl.rlim_cur > 1u << 30 ? 1u << 30 : rl.rlim_cur);
        S->server_hard = (int)(rl.rlim_max > 1u << 30 ? 1u << 30 : rl.rlim_max);
        __atomic_store_n(&S->port, ddp_store_port(s), __ATOMIC_SEQ_CST);
        while (!__atomic_load_n(&S->client_done, __ATOMIC_SEQ_CST)) t_sleep_ms(5);
        ok(ddp_store_set(s, "idle/end", "1", 1) == DDP_SUCCESS && get_str(s, "idle/end", buf, sizeof buf),
           "the server's own handle works at the end");
        ok(ddp_store_open(&c, "127.0.0.1", ddp_store_port(s), 0, &d) == DDP_SUCCESS &&
           get_str(c, "idle/x3", buf, sizeof buf) && !strcmp(buf, "9"), "a fresh connection is served at the end: the server thread lives");
        if (c) ddp_store_close(c);
        __atomic_store_n(&S->server_dead, 1, __ATOMIC_SEQ_CST);   /* the strangers may go */
        ddp_store_close(s);
        return 0;
    }
    if (rank == 1) {   /* 2,000 idle strangers */
        struct rlimit rl;
        static int fds[IDLE_CONNS];
        int port = wait_port(), i, n = 0;
        getrlimit(RLIMIT_NOFILE, &rl);
        if (rl.rlim_max < IDLE_CONNS + 64) rl.rlim_max = IDLE_CONNS + 64;
        rl.rlim_cur = rl.rlim_max;
        if (setrlimit(RLIMIT_NOFILE, &rl) != 0) { getrlimit(RLIMIT_NOFILE, &rl); rl.rlim_cur = rl.rlim_max; setrlimit(RLIMIT_NOFILE, &rl); }
        for (i = 0; i < IDLE_CONNS; i++) if ((fds[i] = raw_connect(port)) >= 0) n++;
        S->idle_open = n;
        ok(n == IDLE_CONNS, "%d of %d idle connections opened", n, IDLE_CONNS);
        __atomic_store_n(&S->strangers_ready, 1, __ATOMIC_SEQ_CST);
        while (!__atomic_load_n(&S->server_dead, __ATOMIC_SEQ_CST)) t_sleep_ms(5);
        for (i = 0; i < IDLE_CONNS; i++) if (fds[i] >= 0) close(fds[i]);
        return 0;
    }
    {   /* rank 2: real clients while the idle connections are open */
        ddp_store_t *a = NULL, *b = NULL;
        ddp_store_desc_t d = sdesc(60000, secret, 1);
        int port = wait_port(), i, good = 1;
        pthread_t th;
        void *waited = NULL;
        char buf[32];
        int64_t v = 0;
        size_t len = 0;
        while (!__atomic_load_n(&S->strangers_ready, __ATOMIC_SEQ_CST)) t_sleep_ms(5);
        ok(ddp_store_open(&a, "127.0.0.1", port, 0, &d) == DDP_SUCCESS && ddp_store_open(&b, "127.0.0.1", port, 0, &d) == DDP_SUCCESS,
           "two real clients connect while %d idle connections are open", S->idle_open);
        if (!a || !b) { __atomic_store_n(&S->client_done, 1, __ATOMIC_SEQ_CST); return 1; }
        pthread_create(&th, NULL, idle_waiter, b);
        for (i = 0; i < 100 && good; i++) {
            char key[32], val[32];
            snprintf(key, sizeof key, "idle/k%d", i);
            snprintf(val, sizeof val, "v%d", i);
            good = ddp_store_set(a, key, val, strlen(val)) == DDP_SUCCESS && get_str(a, key, buf, sizeof buf) && !strcmp(buf, val);
        }
        ok(good, "100 set/get pairs");
        ok(ddp_store_add(a, "idle/n", 7, &v) == DDP_SUCCESS && v == 7, "add");
        ok(ddp_store_compare_set(a, "idle/x3", NULL, 0, "9", 1, buf, sizeof buf, &len) == DDP_SUCCESS && len == 1, "compare_set");
        ok(ddp_store_set(a, "idle/go", "1", 1) == DDP_SUCCESS, "set the key the other client waits for");
        pthread_join(th, &waited);
        ok(waited != NULL, "the other client's wait returned once the key was set");
        ddp_store_close(a);
        ddp_store_close(b);
        __atomic_store_n(&S->client_done, 1, __ATOMIC_SEQ_CST);
        return 0;
    }
}

static void idle_scenario(int hard_1024) {
    char name[128];
    int bad;
    S = (store_shm_t *)t_shm_user(sizeof *S);
    idle_hard_1024 = hard_1024;
    snprintf(name, sizeof name, "%d idle connections, server under RLIMIT_NOFILE 1024 (hard %s)", IDLE_CONNS,
             hard_1024 ? "1024 too" : "higher");
    if (!t_selected(name)) return;
    diag("--- %s (3 processes)", name);
    bad = t_run_ranks(3, idle_conns, NULL, 120);
    ok(bad == 0, "%s: every process exited cleanly (%.1f s)", name, t_last_run.seconds);
    if (hard_1024)
        ok(S->server_soft == 1024 && S->server_hard == 1024, "the server could not raise its limit (soft %d, hard %d)",
           S->server_soft, S->server_hard);
    else if (S->server_hard > 1024)
        ok(S->server_soft == S->server_hard, "the server raised its soft limit to the hard one (%d)", S->server_soft);
    else
        diag("this host's hard RLIMIT_NOFILE is %d: the raise cannot be seen", S->server_hard);
}

/* ----------------------------------------------------------------- a fork holds the server's sockets
 * A rank that forks a long-lived child (a data-loader worker) after its store started leaves the
 * child holding copies of every descriptor, the server's connections included. epoll keeps a
 * registration while any copy of the file lives, so a connection closed without leaving epoll
 * first goes on reporting events for memory the server has freed. Strangers and a real client
 * connect before the fork and leave after it; the server must go on serving and close cleanly. */
#define FORK_STRANGERS 3
static int fork_holds_fds(int rank, int p, void *arg) {
    static const char secret[] = "fork-secret";
    ddp_store_desc_t d = sdesc(10000, secret, 1);
    ddp_store_t *s = NULL, *c = NULL, *late = NULL;
    int fds[FORK_STRANGERS], go[2], ready[2], i, good = 1, st = 0, got = 0;
    pid_t child;
    char buf[32];
    (void)rank; (void)p; (void)arg;
    unsetenv("DDP_JOB_SECRET");
    if (!ok(ddp_store_open(&s, "127.0.0.1", 0, 1, &d) == DDP_SUCCESS, "server") ||
        !ok(ddp_store_open(&c, "127.0.0.1", ddp_store_port(s), 0, &d) == DDP_SUCCESS, "a real client"))
        return 1;
    for (i = 0; i < FORK_STRANGERS; i++) {
        struct pollfd pfd;
        fds[i] = raw_connect(ddp_store_port(s));
        /* the challenge arriving says the server has accepted it (and registered it with epoll) */
        pfd.fd = fds[i]; pfd.events = POLLIN; pfd.revents = 0;
        if (fds[i] >= 0 && poll(&pfd, 1, 10000) == 1) got++;
    }
    ok(got == FORK_STRANGERS, "%d of %d stranger connections accepted before the fork", got, FORK_STRANGERS);
    if (pipe(go) != 0 || pipe(ready) != 0) return 1;
    fflush(stdout);
    child = fork();
    if (child == 0) {   /* the worker: holds the server's descriptors until the parent is done */
        char b = 1;
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        close(go[1]);
        close(ready[0]);
        /* the clients' ends are the strangers' (another process's, in life): let them go */
        for (i = 0; i < FORK_STRANGERS; i++) if (fds[i] >= 0) close(fds[i]);
        close(c->fd);
        if (write(ready[1], &b, 1) != 1) _exit(1);
        while (read(go[0], &b, 1) < 0 && errno == EINTR) {}
        _exit(0);
    }
    close(go[0]);
    close(ready[1]);
    ok(child > 0 && read(ready[0], buf, 1) == 1, "forked a child that holds the server's sockets");
    close(ready[0]);
    for (i = 0; i < FORK_STRANGERS; i++) if (fds[i] >= 0) close(fds[i]);
    ddp_store_close(c);   /* an authenticated connection leaves too */
    for (i = 0; i < 200 && good; i++) {
        char key[32], val[32];
        snprintf(key, sizeof key, "fork/k%d", i);
        snprintf(val, sizeof val, "v%d", i);
        good = ddp_store_set(s, key, val, strlen(val)) == DDP_SUCCESS && get_str(s, key, buf, sizeof buf) &&
               !strcmp(buf, val) && ddp_store_add(s, "fork/n", 1, NULL) == DDP_SUCCESS;
    }
    ok(good, "200 set/get/add rounds after the connections left (stopped at %d)", i);
    ok(ddp_store_open(&late, "127.0.0.1", ddp_store_port(s), 0, &d) == DDP_SUCCESS &&
       get_str(late, "fork/k7", buf, sizeof buf) && !strcmp(buf, "v7"), "a client connecting after the fork is served");
    if (late) ddp_store_close(late);
    ok(ddp_store_close(s) == DDP_SUCCESS, "the server closes cleanly while the child still holds its sockets");
    close(go[1]);
    ok(child > 0 && waitpid(child, &st, 0) == child && WIFEXITED(st) && WEXITSTATUS(st) == 0, "the child exited");
    return 0;
}

/* ----------------------------------------------------------------- hardening: where the server listens */
static int bound_to(ddp_store_t *s, char *out, size_t cap) {
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    if (getsockname(s->listen_fd, (struct sockaddr *)&ss, &sl) != 0) return 0;
    if (ss.ss_family == AF_INET) inet_ntop(AF_INET, &((struct sockaddr_in *)(void *)&ss)->sin_addr, out, (socklen_t)cap);
    else inet_ntop(AF_INET6, &((struct sockaddr_in6 *)(void *)&ss)->sin6_addr, out, (socklen_t)cap);
    return 1;
}

static int bind_address(int rank, int p, void *arg) {
    ddp_store_desc_t d = sdesc(3000, NULL, 1);
    ddp_store_t *s = NULL;
    char where[INET6_ADDRSTRLEN] = "?", local[INET6_ADDRSTRLEN] = "";
    struct ifaddrs *ifs = NULL, *ifa;
    (void)rank; (void)p; (void)arg;
    unsetenv("DDP_JOB_SECRET");
    if (ok(ddp_store_open(&s, "127.0.0.1", t_free_port(), 1, &d) == DDP_SUCCESS, "server for 127.0.0.1")) {
        ok(bound_to(s, where, sizeof where) && !strcmp(where, "127.0.0.1"), "listens on loopback only (%s)", where);
        ddp_store_close(s);
    }
    s = NULL;
    if (ok(ddp_store_open(&s, NULL, 0, 1, &d) == DDP_SUCCESS, "server with no host")) {
        ok(bound_to(s, where, sizeof where) && (!strcmp(where, "::") || !strcmp(where, "0.0.0.0")),
           "listens on every interface (%s)", where);
        ddp_store_close(s);
    }
    if (getifaddrs(&ifs) == 0) {
        for (ifa = ifs; ifa && !local[0]; ifa = ifa->ifa_next)
            if (ifa->ifa_addr && ifa->ifa_addr->sa_family == AF_INET &&
                (ntohl(((struct sockaddr_in *)(void *)ifa->ifa_addr)->sin_addr.s_addr) >> 24) != 127)
                inet_ntop(AF_INET, &((struct sockaddr_in *)(void *)ifa->ifa_addr)->sin_addr, local, sizeof local);
        freeifaddrs(ifs);
    }
    if (!local[0]) { diag("no non-loopback IPv4 address on this host: interface case skipped"); return 0; }
    s = NULL;
    if (ok(ddp_store_open(&s, local, 0, 1, &d) == DDP_SUCCESS, "server for this host's address %s", local)) {
        ok(bound_to(s, where, sizeof where) && !strcmp(where, local), "listens on that address only (%s)", where);
        ddp_store_close(s);
    }
    return 0;
}

static void run(const char *name, int p, int (*fn)(int, int, void *), int timeout_s) {
    int bad;
    if (!t_selected(name)) return;
    S = (store_shm_t *)t_shm_user(sizeof *S);
    diag("--- %s (%d processes)", name, p);
    bad = t_run_ranks(p, fn, NULL, timeout_s);
    ok(bad == 0, "%s: every process exited cleanly (%.1f s)", name, t_last_run.seconds);
}

int main(void) {
    t_init();
    run("basic semantics", 4, basic, 120);
    run("job secret", 2, auth, 60);
    run("communicators with different job secrets", 2, comm_auth, 60);
    run("strangers on the store port", 3, strangers, 60);
    run("ports in use / nobody listening", 1, ports, 60);
    run("server dies under a blocked get", 2, server_dies, 60);
    run("writing to a dead server", 2, dead_write, 60);
    run("invalid arguments", 1, invalid, 60);
    run("communicators on a user's store (store_prefix, DDP_HOST_ID)", 3, user_store, 60);
    run("strangers speaking the protocol without the secret", 2, raw_strangers, 60);
    run("fake masters", 1, fake_masters, 60);
    run("the secret never crosses the wire", 1, wire, 60);
    run("pre-auth memory is bounded", 1, preauth_memory, 60);
    run("where the server listens", 1, bind_address, 60);
    run("a forked child holds the server's sockets", 1, fork_holds_fds, 60);
    run("batches", 1, batches, 60);
    run("a client that pipelines and never reads", 1, pipeline_memory, 60);
    idle_scenario(0);
    idle_scenario(1);
    return t_done();
}
