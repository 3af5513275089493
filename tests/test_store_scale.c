/* SPDX-License-Identifier: MIT (see LICENSE) */
/* tests/test_store_scale.c — what keeps the store's rendezvous linear in its clients, and a
 * client that cannot connect saying why. Prints TAP.
 *
 *   build/test_store_scale          (DDP_TEST_ONLY=<scenario name> runs one)
 *
 * The server's parts are driven without sockets, as the fuzzers do (_ddp_store_feed), so the
 * counts below are exact:
 *   waiters      a write wakes only the requests parked on the key it wrote: GET and WAIT on
 *                "b", WAIT-any on "x" or "b", WAIT-all on "a" and "b" run again after a write of
 *                "b" (the last parks again), a GET on "a" does not; after "a" is written both
 *                left are answered. s->nrerun counts the requests run again.
 *   many-waiters 2,000 GETs parked on one key: a write of another key runs none of them again;
 *                the key's write answers all 2,000, each with the value.
 *   leaving      waiters that leave while parked (dropped before the write, and after the write
 *                woke them but before they ran again): the others are answered, nothing is left
 *                filed (ASan checks the memory: build/san/test_store_scale).
 *   fork-drop    a connection the server drops (it sent bytes that are not the protocol) ends for
 *                the client although a child forked after the accept holds a copy of the server's
 *                socket: the client sees the end (the hangs of 16,384-client runs: the bench's client
 *                processes, forked while the server accepted, held such copies).
 *   growth       50,000 keys: the key table grows past its first 1,024 chains, every key reads
 *                back its own value, then again after half of them are deleted; 5,000 requests
 *                parked on distinct keys grow the waiters' index, and each key's write answers
 *                its own request only.
 * A client against a real socket, each with an 11 s timeout, side by side; each must WARN
 * before its timeout (the 10 s note of the waits that speak) and fail with an error that names
 * the address and the cause:
 *   refused      nothing listens on the port: "refused".
 *   local-port   desc.local_addr 192.0.2.1 is not this host's: EADDRNOTAVAIL said at once (a WARN
 *                before the 10 s note) and in the error, naming the address.
 *   syn-dropped  a listener whose queue (backlog 0) is full: the kernel drops the SYNs; "no answer
 *                to the connection request".
 *   no-challenge a listener that never accepts: the connection is made, the challenge never
 *                comes (as when a full queue drops a SYN cookie's final ACK); the client connects
 *                again (at least twice in all) and WARNs "no challenge" before its timeout,
 *                instead of waiting silently in one recv.
 */
#define _GNU_SOURCE
#define DDP_IMPLEMENTATION
#include "ddp.h"
#include "tests/ddp_test.h"

#include <pthread.h>
#include <sys/wait.h>

/* ----------------------------------------------------------------- the server without sockets */
static ddp_store_t *quiet_store(void) {
    ddp_store_desc_t d;
    memset(&d, 0, sizeof d);
    d.timeout_ms = 1000;
    d.secret = "";
    d.log_level = 1;                          /* none */
    return _ddp_store_new("127.0.0.1", 0, &d);
}

static int feed_request(ddp_store_t *s, _ddp_store_conn_t *c, uint32_t op, uint32_t flags, const char *key,
                        size_t klen, const void *val, size_t vlen) {
    _ddp_store_req_t rq;
    memset(&rq, 0, sizeof rq);
    rq.magic = _DDP_STORE_MAGIC;
    rq.op = op;
    rq.klen = (uint32_t)klen;
    rq.v1len = (uint32_t)vlen;
    rq.flags = flags;
    rq.arg = op == _DDP_ST_HELLO ? (int64_t)_DDP_STORE_PROTO : 0;
    if (_ddp_store_feed(s, c, &rq, sizeof rq) != 0) return -1;
    if (klen && _ddp_store_feed(s, c, key, klen) != 0) return -1;
    if (vlen && _ddp_store_feed(s, c, val, vlen) != 0) return -1;
    return 0;
}

/* Answers pending in c's output: 1 and the first one's status and value (then cleared), else 0. */
static int take_answer(_ddp_store_conn_t *c, uint32_t *status, char *val, size_t cap) {
    _ddp_store_resp_t r;
    size_t n;
    if (c->out_len - c->out_off < sizeof r) return 0;
    memcpy(&r, c->out + c->out_off, sizeof r);
    n = r.vlen < cap - 1 ? r.vlen : cap - 1;
    if (val) { memcpy(val, c->out + c->out_off + sizeof r, n); val[n] = 0; }
    if (status) *status = r.status;
    c->out_len = c->out_off = 0;
    return 1;
}

static _ddp_store_conn_t *client(ddp_store_t *s) {
    unsigned char nonce[_DDP_AUTH_NONCE_BYTES];
    _ddp_store_conn_t *c = _ddp_store_conn_new(s, -1, "test");
    if (!c) t_bail("no memory for a connection");
    memset(nonce, 7, sizeof nonce);
    c->out_len = c->out_off = 0;              /* the challenge */
    if (feed_request(s, c, _DDP_ST_HELLO, 0, NULL, 0, nonce, sizeof nonce) != 0 || c->state != _DDP_CONN_READY)
        t_bail("hello refused");
    c->out_len = c->out_off = 0;
    return c;
}

static int set_key(ddp_store_t *s, _ddp_store_conn_t *w, const char *key, const char *val) {
    uint32_t st = 1;
    if (feed_request(s, w, _DDP_ST_SET, 0, key, strlen(key), val, strlen(val)) != 0) return 0;
    return take_answer(w, &st, NULL, 0) && st == DDP_SUCCESS;
}

/* Runs what the server loop runs after a round: the parked requests the round's writes woke. */
static void end_round(ddp_store_t *s) {
    if (s->changed || s->woken_head) _ddp_store_rerun_waiting(s);
}

static void scenario_waiters(void) {
    ddp_store_t *s = quiet_store();
    _ddp_store_conn_t *w = client(s), *ga = client(s), *gb = client(s), *wb = client(s), *all = client(s),
                      *any = client(s);
    char val[64];
    uint32_t st;
    uint64_t before;
    feed_request(s, ga, _DDP_ST_GET, 0, "a", 1, NULL, 0);
    feed_request(s, gb, _DDP_ST_GET, 0, "b", 1, NULL, 0);
    feed_request(s, wb, _DDP_ST_WAIT, 0, "b", 1, NULL, 0);
    feed_request(s, all, _DDP_ST_WAIT, 0, "a\0b", 3, NULL, 0);
    feed_request(s, any, _DDP_ST_WAIT, _DDP_ST_WAIT_ANY, "x\0b", 3, NULL, 0);
    ok(s->nwaiting == 5 && s->nwaiter_nodes == 7, "waiters: 5 requests parked, 7 keys filed (%d, %zu)",
       s->nwaiting, s->nwaiter_nodes);
    before = s->nrerun;
    ok(set_key(s, w, "b", "vb"), "waiters: b written");
    end_round(s);
    ok(s->nrerun - before == 4, "waiters: the write of b ran again the 4 requests parked on b, not the GET on a "
       "(%llu run again)", (unsigned long long)(s->nrerun - before));
    ok(take_answer(gb, &st, val, sizeof val) && st == DDP_SUCCESS && !strcmp(val, "vb"), "waiters: GET b answered 'vb'");
    ok(take_answer(wb, &st, NULL, 0) && st == DDP_SUCCESS, "waiters: WAIT b answered");
    ok(take_answer(any, &st, NULL, 0) && st == DDP_SUCCESS, "waiters: WAIT any of x, b answered");
    ok(!take_answer(ga, NULL, NULL, 0) && ga->waiting, "waiters: GET a still parked");
    ok(!take_answer(all, NULL, NULL, 0) && all->waiting, "waiters: WAIT a and b still parked (a missing)");
    ok(s->nwaiting == 2 && s->nwaiter_nodes == 3, "waiters: 2 parked, 3 keys filed (%d, %zu)", s->nwaiting,
       s->nwaiter_nodes);
    before = s->nrerun;
    ok(set_key(s, w, "a", "va"), "waiters: a written");
    end_round(s);
    ok(s->nrerun - before == 2, "waiters: the write of a ran again the 2 requests parked on it (%llu)",
       (unsigned long long)(s->nrerun - before));
    ok(take_answer(ga, &st, val, sizeof val) && st == DDP_SUCCESS && !strcmp(val, "va"), "waiters: GET a answered 'va'");
    ok(take_answer(all, &st, NULL, 0) && st == DDP_SUCCESS, "waiters: WAIT a and b answered");
    ok(s->nwaiting == 0 && s->nwaiter_nodes == 0 && !s->woken_head, "waiters: nothing parked or filed");
    _ddp_store_reap(s);
    ddp_store_close(s);
}

#define MANY 2000
static void scenario_many(void) {
    ddp_store_t *s = quiet_store();
    static _ddp_store_conn_t *c[MANY];
    _ddp_store_conn_t *w = client(s);
    char val[64];
    uint32_t st;
    uint64_t before;
    int i, answered = 0;
    for (i = 0; i < MANY; i++) {
        c[i] = client(s);
        feed_request(s, c[i], _DDP_ST_GET, 0, "ready", 5, NULL, 0);
    }
    ok(s->nwaiting == MANY, "many-waiters: %d GETs parked on one key", s->nwaiting);
    before = s->nrerun;
    ok(set_key(s, w, "other", "x"), "many-waiters: another key written");
    end_round(s);
    ok(s->nrerun == before, "many-waiters: none of the %d ran again (%llu did)", MANY,
       (unsigned long long)(s->nrerun - before));
    ok(set_key(s, w, "ready", "go"), "many-waiters: the key written");
    end_round(s);
    for (i = 0; i < MANY; i++)
        answered += take_answer(c[i], &st, val, sizeof val) && st == DDP_SUCCESS && !strcmp(val, "go");
    ok(answered == MANY, "many-waiters: %d of %d answered with the value", answered, MANY);
    ok(s->nrerun - before == MANY, "many-waiters: each ran again once (%llu)", (unsigned long long)(s->nrerun - before));
    ok(s->nwaiting == 0 && s->nwaiter_nodes == 0, "many-waiters: nothing parked or filed");
    _ddp_store_reap(s);
    ddp_store_close(s);
}

static void scenario_leaving(void) {
    ddp_store_t *s = quiet_store();
    _ddp_store_conn_t *w = client(s), *c[4];
    uint32_t st;
    uint64_t before;
    int i;
    for (i = 0; i < 4; i++) {
        c[i] = client(s);
        feed_request(s, c[i], _DDP_ST_WAIT, 0, i == 3 ? "k\0j" : "k", i == 3 ? 3 : 1, NULL, 0);
    }
    _ddp_store_drop(s, c[1]);                 /* leaves while parked */
    ok(s->nwaiting == 3 && s->nwaiter_nodes == 4, "leaving: one left while parked: 3 parked, 4 keys filed "
       "(%d, %zu)", s->nwaiting, s->nwaiter_nodes);
    before = s->nrerun;
    ok(set_key(s, w, "k", "v"), "leaving: k written");
    _ddp_store_drop(s, c[2]);                 /* woken by the write, gone before it runs again */
    end_round(s);
    ok(s->nrerun - before == 2, "leaving: the 2 still there ran again (%llu)", (unsigned long long)(s->nrerun - before));
    ok(take_answer(c[0], &st, NULL, 0) && st == DDP_SUCCESS, "leaving: the one that stayed is answered");
    ok(c[3]->waiting && s->nwaiter_nodes == 2, "leaving: the wait on k and j parks again on both (%zu filed)",
       s->nwaiter_nodes);
    _ddp_store_drop(s, c[3]);
    ok(s->nwaiting == 0 && s->nwaiter_nodes == 0 && !s->woken_head, "leaving: nothing parked, filed or woken");
    _ddp_store_reap(s);
    ddp_store_close(s);
}

#define KEYS 50000
#define WAITERS 5000
static void scenario_growth(void) {
    ddp_store_t *s = quiet_store();
    static _ddp_store_conn_t *c[WAITERS];
    _ddp_store_conn_t *w = client(s);
    char key[64], want[64], val[64];
    uint32_t st;
    int i, good = 0, gone = 0, answered = 0, early = 0;
    uint64_t before;
    for (i = 0; i < KEYS; i++) {
        snprintf(key, sizeof key, "rank/%d/addr", i);
        snprintf(want, sizeof want, "v%d", i * 7);
        good += set_key(s, w, key, want);
    }
    ok(good == KEYS && s->kv_count == KEYS, "growth: %d keys written (%zu in the table)", good, s->kv_count);
    ok(s->kv_nbuckets * 2 >= KEYS / 2, "growth: the table grew to %zu chains (from %d)", s->kv_nbuckets, _DDP_KV_BUCKETS);
    for (good = 0, i = 0; i < KEYS; i++) {
        snprintf(key, sizeof key, "rank/%d/addr", i);
        snprintf(want, sizeof want, "v%d", i * 7);
        feed_request(s, w, _DDP_ST_GET, 0, key, strlen(key), NULL, 0);
        good += take_answer(w, &st, val, sizeof val) && st == DDP_SUCCESS && !strcmp(val, want);
    }
    ok(good == KEYS, "growth: %d of %d keys read back their own value", good, KEYS);
    for (i = 0; i < KEYS; i += 2) {
        snprintf(key, sizeof key, "rank/%d/addr", i);
        feed_request(s, w, _DDP_ST_DELETE, 0, key, strlen(key), NULL, 0);
        take_answer(w, NULL, NULL, 0);
    }
    for (good = 0, i = 0; i < KEYS; i++) {
        int exists;
        _ddp_store_resp_t r;
        snprintf(key, sizeof key, "rank/%d/addr", i);
        feed_request(s, w, _DDP_ST_CHECK, 0, key, strlen(key), NULL, 0);
        memcpy(&r, w->out, sizeof r);
        exists = (int)r.num;
        w->out_len = w->out_off = 0;
        if (i % 2) good += exists; else gone += !exists;
    }
    ok(good == KEYS / 2 && gone == KEYS / 2 && s->kv_count == KEYS / 2, "growth: after deleting every other key, "
       "%d remain and %d are gone (%zu in the table)", good, gone, s->kv_count);
    for (i = 0; i < WAITERS; i++) {
        c[i] = client(s);
        snprintf(key, sizeof key, "wait/%d", i);
        feed_request(s, c[i], _DDP_ST_GET, 0, key, strlen(key), NULL, 0);
    }
    ok(s->nwaiter_nodes == WAITERS && s->nwaiter_chains * 2 >= WAITERS, "growth: %zu requests filed in %zu chains",
       s->nwaiter_nodes, s->nwaiter_chains);
    before = s->nrerun;
    for (i = 0; i < WAITERS; i++) {
        snprintf(key, sizeof key, "wait/%d", i);
        snprintf(want, sizeof want, "w%d", i);
        set_key(s, w, key, want);
        end_round(s);
        answered += take_answer(c[i], &st, val, sizeof val) && st == DDP_SUCCESS && !strcmp(val, want);
        if (i + 1 < WAITERS) early += take_answer(c[i + 1], NULL, NULL, 0);
    }
    ok(answered == WAITERS && early == 0, "growth: each key's write answered its own request (%d of %d; %d early)",
       answered, WAITERS, early);
    ok(s->nrerun - before == WAITERS, "growth: %llu requests ran again for %d writes",
       (unsigned long long)(s->nrerun - before), WAITERS);
    _ddp_store_reap(s);
    ddp_store_close(s);
}

static int fill(int port, int blocking);

static void scenario_fork_drop(void) {
    ddp_store_t *srv = NULL;
    ddp_store_desc_t d;
    unsigned char chal[sizeof(_ddp_store_chal_t)], junk[sizeof(_ddp_store_req_t)];
    struct pollfd pfd;
    int fd, p[2], got_end = 0;
    pid_t child;
    char b;
    memset(&d, 0, sizeof d);
    d.timeout_ms = 5000;
    d.secret = "";
    d.log_level = 1;
    if (!ok(ddp_store_open(&srv, "127.0.0.1", 0, 1, &d) == DDP_SUCCESS, "fork-drop: a server")) return;
    fd = fill(ddp_store_port(srv), 1);
    ok(fd >= 0 && _ddp_recv_all(fd, chal, sizeof chal, _ddp_deadline(5000)) == 0,
       "fork-drop: connected, the challenge came (the server accepted it)");
    if (pipe(p) != 0) t_bail("pipe");
    child = fork();
    if (child == 0) {                         /* holds copies of every descriptor, the server's socket too */
        close(p[1]);
        while (read(p[0], &b, 1) < 0 && errno == EINTR) {}
        _exit(0);
    }
    close(p[0]);
    memset(junk, 0x5a, sizeof junk);
    ok(send(fd, junk, sizeof junk, MSG_NOSIGNAL) == (ssize_t)sizeof junk, "fork-drop: bytes that are not the protocol sent");
    pfd.fd = fd; pfd.events = POLLIN; pfd.revents = 0;
    if (poll(&pfd, 1, 10000) == 1) {
        ssize_t n = recv(fd, chal, sizeof chal, MSG_DONTWAIT);
        got_end = n == 0 || (n < 0 && errno == ECONNRESET);
    }
    ok(got_end, "fork-drop: the client saw its connection end (bound 10 s), though a forked child holds the "
       "server's copy");
    close(p[1]);
    waitpid(child, NULL, 0);
    close(fd);
    ddp_store_close(srv);
}

/* ----------------------------------------------------------------- clients that cannot connect */
typedef struct {
    const char *name, *local_addr, *want_err, *want_warn;
    int port, warn_early;      /* warn_early: a WARN naming the cause must come before the 10 s note */
    ddp_result_t r;
    char err[512];
    char warns[4][600];
    int nwarn;
    double took;
    pthread_mutex_t mu;
} dial_case_t;

static void capture(void *user, ddp_log_level_t level, int rank, const char *msg) {
    dial_case_t *k = (dial_case_t *)user;
    (void)rank;
    if (level != DDP_LOG_WARN) return;
    pthread_mutex_lock(&k->mu);
    if (k->nwarn < 4) _ddp_strlcpy(k->warns[k->nwarn], msg, sizeof k->warns[0]);
    k->nwarn++;
    pthread_mutex_unlock(&k->mu);
}

static void *dial_thread(void *arg) {
    dial_case_t *k = (dial_case_t *)arg;
    ddp_store_desc_t d;
    ddp_store_t *s = NULL;
    double t0 = t_now();
    memset(&d, 0, sizeof d);
    d.timeout_ms = 11000;
    d.secret = "";
    d.log_level = DDP_LOG_WARN + 1;
    d.log_fn = capture;
    d.log_user = k;
    d.local_addr = k->local_addr;
    k->r = _ddp_store_open(&s, "127.0.0.1", k->port, 0, &d, k->err, sizeof k->err);
    k->took = t_now() - t0;
    if (s) ddp_store_close(s);
    return NULL;
}

static int listener(int backlog) {
    struct sockaddr_in a;
    socklen_t sl = sizeof a;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), one = 1;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) != 0 || listen(fd, backlog) != 0 ||
        getsockname(fd, (struct sockaddr *)&a, &sl) != 0)
        t_bail("listener: %s", strerror(errno));
    return fd;
}

static int port_of(int fd) {
    struct sockaddr_in a;
    socklen_t sl = sizeof a;
    getsockname(fd, (struct sockaddr *)&a, &sl);
    return ntohs(a.sin_port);
}

/* A connection into fd's queue (blocking: made when the kernel answered; -1 when it did not). */
static int fill(int port, int blocking) {
    struct sockaddr_in a;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | (blocking ? 0 : SOCK_NONBLOCK), 0);
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons((uint16_t)port);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0 && (blocking || errno != EINPROGRESS)) {
        close(fd);
        return -1;
    }
    return fd;
}

static void scenario_dial(void) {
    dial_case_t k[4];
    pthread_t th[4];
    int i, full, silent, held[3], nconn = 0;
    char where[64];
    full = listener(0);
    silent = listener(16);
    held[0] = fill(port_of(full), 1);         /* the one connection a backlog of 0 queues */
    held[1] = fill(port_of(full), 0);         /* its SYN is dropped, as the client's will be */
    held[2] = -1;
    memset(k, 0, sizeof k);
    k[0].name = "refused"; k[0].port = t_free_port(); k[0].want_err = "refused"; k[0].want_warn = "refused";
    k[1].name = "local-port"; k[1].port = t_free_port(); k[1].local_addr = "192.0.2.1";
    k[1].want_err = strerror(EADDRNOTAVAIL); k[1].want_warn = "192.0.2.1"; k[1].warn_early = 1;
    k[2].name = "syn-dropped"; k[2].port = port_of(full); k[2].want_err = "no answer to the connection request";
    k[2].want_warn = "SYNs dropped";
    k[3].name = "no-challenge"; k[3].port = port_of(silent); k[3].want_err = "did not answer the handshake";
    k[3].want_warn = "no challenge";
    for (i = 0; i < 4; i++) {
        pthread_mutex_init(&k[i].mu, NULL);
        if (pthread_create(&th[i], NULL, dial_thread, &k[i]) != 0) t_bail("pthread_create");
    }
    for (i = 0; i < 4; i++) pthread_join(th[i], NULL);
    for (i = 0; i < 4; i++) {
        int named = 0, w;
        snprintf(where, sizeof where, "127.0.0.1:%d", k[i].port);
        for (w = 0; w < k[i].nwarn && w < 4; w++)
            named += strstr(k[i].warns[w], k[i].want_warn) != NULL && strstr(k[i].warns[w], where) != NULL;
        ok(k[i].r != DDP_SUCCESS && strstr(k[i].err, where) && strstr(k[i].err, k[i].want_err),
           "%s: fails after %.1f s (timeout 11 s) naming %s and '%s': %s", k[i].name, k[i].took, where,
           k[i].want_err, k[i].err);
        ok(k[i].took < 60, "%s: within the bound (%.1f s)", k[i].name, k[i].took);
        /* the final error is a WARN too: the lines before it are the ones that speak while it lasts */
        ok(k[i].nwarn >= 2 && named >= 1, "%s: %d WARN line(s) before the error, naming %s and '%s'%s%s",
           k[i].name, k[i].nwarn - 1, where, k[i].want_warn, k[i].nwarn ? ": " : "", k[i].nwarn ? k[i].warns[0] : "");
        if (k[i].warn_early)
            ok(k[i].nwarn >= 3, "%s: said at once, then in the 10 s note (%d WARN lines before the error)",
               k[i].name, k[i].nwarn - 1);
    }
    _ddp_set_nonblock(silent, 1);
    for (;;) {
        int fd = accept(silent, NULL, NULL);
        if (fd < 0) break;
        nconn++;
        close(fd);
    }
    ok(nconn >= 2, "no-challenge: the client connected again instead of waiting on one connection (%d made)", nconn);
    for (i = 0; i < 3; i++) if (held[i] >= 0) close(held[i]);
    close(full);
    close(silent);
}

int main(void) {
    t_init();
    if (t_selected("waiters")) scenario_waiters();
    if (t_selected("many-waiters")) scenario_many();
    if (t_selected("leaving")) scenario_leaving();
    if (t_selected("fork-drop")) scenario_fork_drop();
    if (t_selected("growth")) scenario_growth();
    if (t_selected("dial")) scenario_dial();
    return t_done();
}
