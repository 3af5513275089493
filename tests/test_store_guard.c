/* SPDX-License-Identifier: MIT */
/* tests/test_store_guard.c — the store against someone guessing its job secret, and a secretless
 * store against other users of the same host. Prints TAP.
 *
 *   build/test_store_guard          (DDP_TEST_ONLY=<scenario name> runs one)
 *
 *   stretched-key  the store's proofs are keyed with PBKDF2(secret, the salt in its challenge):
 *                a proof keyed with that is accepted, one keyed with the raw secret refused; a
 *                7-character secret gets a WARN at the default log level, a 24-character one none.
 *   throttle     a guesser (a forked process; as root it first becomes nobody, uid 65534)
 *                sends wrong proofs one after another over fresh connections. The first
 *                _DDP_STORE_THROTTLE_FREE are refused at once; the k-th after them is refused
 *                no earlier than 100 ms x 2^(k-1) after its hello was sent (a lower bound,
 *                which a busy machine cannot break). Then a rank with the right secret joins,
 *                and a second guesser with many connections at once gets no more checks than
 *                its turns allow: its verdicts come one turn apart. As root the failures were
 *                counted against uid 65534, not against the job's user (the server's table).
 *   same-source  without root: the guesser is this user, so the rank shares its source (the
 *                trade-off README "Security" describes): it still joins, after at most one turn.
 *   secretless-user  (root only, else skipped) a store without a job secret on 127.0.0.1, and
 *                one listening on every interface (dual stack): a process of another user
 *                (nobody) connecting over 127.0.0.1 or ::1 is closed before it is sent anything;
 *                this user's own client works on both.
 *   secretless-warn  a 2-rank TCP job without a secret whose MASTER_ADDR is this host's first
 *                non-loopback IPv4 address (skipped if none): rank 0's store and every rank's
 *                TCP listener WARN (default log level) that they listen on a network address
 *                without a secret; with MASTER_ADDR 127.0.0.1 none of them does.
 */
#define _GNU_SOURCE
#define DDP_IMPLEMENTATION
#include "ddp.h"
#include "transports/ddp_tcp.h"
#include "tests/ddp_test.h"

#include <grp.h>
#include <ifaddrs.h>

#define SECRET "guard-test-secret-4c1e7a"
#define NOBODY 65534

typedef struct {
    int port;
    int become_nobody;
} guess_arg_t;

static int become(uid_t uid) {
    return setgroups(0, NULL) == 0 && setgid((gid_t)uid) == 0 && setuid(uid) == 0;
}

static int connect_port(int family, int port) {
    struct sockaddr_storage ss;
    socklen_t sl;
    int fd = socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    memset(&ss, 0, sizeof ss);
    if (family == AF_INET) {
        struct sockaddr_in *a = (struct sockaddr_in *)&ss;
        a->sin_family = AF_INET;
        a->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        a->sin_port = htons((uint16_t)port);
        sl = sizeof *a;
    } else {
        struct sockaddr_in6 *a = (struct sockaddr_in6 *)&ss;
        a->sin6_family = AF_INET6;
        a->sin6_addr = in6addr_loopback;
        a->sin6_port = htons((uint16_t)port);
        sl = sizeof *a;
    }
    if (fd < 0) return -1;
    if (connect(fd, (struct sockaddr *)&ss, sl) != 0) { close(fd); return -1; }
    return fd;
}

/* Connects and reads the challenge: the fd, or -1. */
static int open_guess(int port) {
    unsigned char chal[sizeof(_ddp_store_chal_t)];
    int fd = connect_port(AF_INET, port);
    if (fd < 0) return -1;
    if (_ddp_recv_all(fd, chal, sizeof chal, _ddp_deadline(20000)) != 0) { close(fd); return -1; }
    return fd;
}

/* Sends a hello with a made-up proof. */
static int send_guess(int fd) {
    unsigned char msg[_DDP_STORE_HELLO_BYTES];
    _ddp_store_req_t rq;
    memset(&rq, 0, sizeof rq);
    rq.magic = _DDP_STORE_MAGIC;
    rq.op = _DDP_ST_HELLO;
    rq.v1len = _DDP_AUTH_NONCE_BYTES + _DDP_AUTH_PROOF_BYTES;
    rq.flags = _DDP_ST_HELLO_PROOF;
    rq.arg = _DDP_STORE_PROTO;
    memcpy(msg, &rq, sizeof rq);
    if (_ddp_auth_random(msg + sizeof rq, 2 * _DDP_AUTH_NONCE_BYTES) != 0) return 0;
    return _ddp_send_all(fd, msg, sizeof rq + rq.v1len, _ddp_deadline(20000)) == 0;
}

/* 1 when the verdict is DDP_ERR_AUTH. */
static int read_verdict(int fd) {
    _ddp_store_resp_t resp;
    return _ddp_recv_all(fd, &resp, sizeof resp, _ddp_deadline(30000)) == 0 &&
           resp.magic == _DDP_STORE_MAGIC && resp.status == DDP_ERR_AUTH;
}

/* The delay the k-th throttled failure (k >= 1) makes its source wait, as the server computes it
 * with a handshake deadline of 20 s. */
static double turn_s(int k) {
    double ms = (double)_DDP_STORE_THROTTLE_BASE_MS * (double)(1u << (k - 1));
    return (ms > _DDP_STORE_THROTTLE_MAX_MS ? _DDP_STORE_THROTTLE_MAX_MS : ms) / 1000.0;
}

static int guesser(int rank, int p, void *arg) {
    const guess_arg_t *g = (const guess_arg_t *)arg;
    const int n = _DDP_STORE_THROTTLE_FREE + 3;
    int k, refused = 0, early = 0;
    (void)rank; (void)p;
    if (g->become_nobody && !ok(become(NOBODY), "throttle: the guesser is now uid %d", NOBODY)) return 1;
    for (k = 1; k <= n; k++) {
        int fd = open_guess(g->port);
        double t0, dt;
        if (fd < 0) break;
        t0 = t_now();
        if (send_guess(fd) && read_verdict(fd)) refused++;
        dt = t_now() - t0;
        close(fd);
        if (k > _DDP_STORE_THROTTLE_FREE) {
            double want = turn_s(k - _DDP_STORE_THROTTLE_FREE);
            if (!ok(dt >= want, "throttle: wrong proof %d refused %.0f ms after its hello (no earlier than %.0f ms)",
                    k, dt * 1e3, want * 1e3))
                early++;
        } else {
            diag("wrong proof %d (free) refused after %.1f ms", k, dt * 1e3);
        }
    }
    ok(refused == n, "throttle: all %d wrong proofs were refused with DDP_ERR_AUTH (%d)", n, refused);
    return early ? 1 : 0;
}

/* A guesser with many connections at once: each checked proof takes a turn, so the verdicts
 * of Q hellos sent together come one turn (at least the current delay) apart. */
static int parallel_guesser(int rank, int p, void *arg) {
    const guess_arg_t *g = (const guess_arg_t *)arg;
    int fd[_DDP_STORE_THROTTLE_QUEUE], i, n = 0, got = 0;
    double t0, last = 0;
    (void)rank; (void)p;
    if (g->become_nobody && !become(NOBODY)) return 1;
    for (i = 0; i < _DDP_STORE_THROTTLE_QUEUE; i++) if ((fd[n] = open_guess(g->port)) >= 0) n++;
    t0 = t_now();
    for (i = 0; i < n; i++) send_guess(fd[i]);
    for (i = 0; i < n; i++) {
        struct pollfd pf[_DDP_STORE_THROTTLE_QUEUE];
        int j, m = 0, idx[_DDP_STORE_THROTTLE_QUEUE];
        for (j = 0; j < n; j++) if (fd[j] >= 0) { pf[m].fd = fd[j]; pf[m].events = POLLIN; pf[m].revents = 0; idx[m++] = j; }
        if (!m || poll(pf, (nfds_t)m, 30000) <= 0) break;
        for (j = 0; j < m; j++) {
            if (!pf[j].revents) continue;
            if (read_verdict(fd[idx[j]])) { got++; last = t_now() - t0; }
            close(fd[idx[j]]);
            fd[idx[j]] = -1;
        }
    }
    for (i = 0; i < n; i++) if (fd[i] >= 0) close(fd[i]);
    /* the source already failed FREE + 3 times: its turns are at least turn_s(4) each, and the
     * hellos sent together are checked one per turn */
    ok(n == _DDP_STORE_THROTTLE_QUEUE && got == n, "throttle: %d hellos sent at once, %d refused", n, got);
    return ok(last >= (double)(n - 1) * turn_s(4), "throttle: their last verdict came %.0f ms after they were sent "
              "(no earlier than %d turns of %.0f ms: one check per turn, however many connections)",
              last * 1e3, n - 1, turn_s(4) * 1e3) ? 0 : 1;
}

static void throttle(int as_nobody) {
    ddp_store_t *srv = NULL, *c = NULL;
    ddp_store_desc_t d;
    guess_arg_t g;
    double t0;
    ddp_result_t r;
    char buf[16];
    size_t len = 0;
    const char *name = as_nobody ? "throttle" : "same-source";
    memset(&d, 0, sizeof d);
    d.secret = SECRET;
    d.timeout_ms = 20000;
    d.log_level = 1;
    if (!ok(ddp_store_open(&srv, "127.0.0.1", 0, 1, &d) == DDP_SUCCESS, "%s: store server with a job secret", name)) return;
    g.port = ddp_store_port(srv);
    g.become_nobody = as_nobody;
    ok(t_run_ranks(1, guesser, &g, 60) == 0, "%s: the guesser's wrong proofs were throttled", name);
    t0 = t_now();
    r = ddp_store_open(&c, "127.0.0.1", g.port, 0, &d);
    ok(r == DDP_SUCCESS && ddp_store_set(c, "k", "v", 1) == DDP_SUCCESS &&
       ddp_store_get(c, "k", buf, sizeof buf, &len) == DDP_SUCCESS && len == 1,
       "%s: a rank with the right secret joins after the guesser's failures (%.0f ms) -> %s", name,
       (t_now() - t0) * 1e3, ddp_strerror(r));
    if (c) ddp_store_close(c);
    if (as_nobody) {
        /* The server thread is idle now (nothing connected): its table can be read. */
        int i, nobody = -1, mine = 0;
        uid_t me = geteuid();
        for (i = 0; i < _DDP_STORE_THROTTLE_SOURCES; i++) {
            const _ddp_throttle_t *e = &srv->throttle[i];
            uid_t u;
            if (!e->used || e->src.kind != _DDP_SRC_UID) continue;
            memcpy(&u, e->src.b, sizeof u);
            if (u == NOBODY) nobody = (int)e->failures;
            if (u == me) mine++;
        }
        ok(nobody == _DDP_STORE_THROTTLE_FREE + 3 && mine == 0,
           "throttle: the failures were counted against uid %d (%d of them), none against the job's "
           "user (uid %u)", NOBODY, nobody, (unsigned)me);
        /* Fork only once the server has closed the rank's connection: a child holding a copy
         * of a socket the server closes would keep it in the server's epoll set. */
        for (i = 0; i < 2000; i++) {
            int n;
            pthread_mutex_lock(&srv->srv_mu);
            n = srv->nclients;
            pthread_mutex_unlock(&srv->srv_mu);
            if (n <= 1) break;               /* the server's own handle */
            t_sleep_ms(5);
        }
        ok(t_run_ranks(1, parallel_guesser, &g, 60) == 0, "throttle: many connections at once get one check per turn");
    }
    ddp_store_close(srv);
}

static int file_has(const char *path, const char *a, const char *b) {
    char buf[65536];
    size_t n;
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    return strstr(buf, a) && (!b || strstr(buf, b));
}

/* ----------------------------------------------------------------- stretched-key */
/* A hello whose proof is keyed with key (keylen bytes): 1 when the store accepts it. */
static int prove_with(int port, int stretch, const char *secret) {
    unsigned char chal_b[sizeof(_ddp_store_chal_t)], msg[_DDP_STORE_HELLO_BYTES], nc[32], key[32];
    _ddp_store_chal_t ch;
    _ddp_store_resp_t resp;
    size_t n = 0;
    int fd = connect_port(AF_INET, port), good = 0;
    if (fd < 0) return 0;
    if (_ddp_recv_all(fd, chal_b, sizeof chal_b, _ddp_deadline(20000)) == 0 && _ddp_auth_nonce(nc) == 0) {
        unsigned char ns[32];
        memcpy(&ch, chal_b, sizeof ch);
        if (stretch) _ddp_auth_job_key(secret, strlen(secret), ch.salt, key);
        if (_ddp_store_hs_hello(stretch ? key : (const unsigned char *)secret, stretch ? sizeof key : strlen(secret),
                                chal_b, sizeof chal_b, nc, msg, &n, ns) == _DDP_HS_OK &&
            _ddp_send_all(fd, msg, n, _ddp_deadline(20000)) == 0 &&
            _ddp_recv_all(fd, &resp, sizeof resp, _ddp_deadline(20000)) == 0)
            good = resp.status == DDP_SUCCESS;
    }
    close(fd);
    return good;
}

static void stretched_key(void) {
    ddp_store_t *srv = NULL;
    ddp_store_desc_t d;
    int port;
    memset(&d, 0, sizeof d);
    d.secret = SECRET;
    d.timeout_ms = 20000;
    d.log_level = 1;
    if (!ok(ddp_store_open(&srv, "127.0.0.1", 0, 1, &d) == DDP_SUCCESS, "stretched-key: store server with a job secret")) return;
    port = ddp_store_port(srv);
    {   /* a short secret gets a WARN at the default level; this one (24 characters) none */
        static const char *const secrets[2] = {"hunter2", SECRET};
        char path[512];
        int k;
        snprintf(path, sizeof path, "%s/ddp_guard_short_%d.log", t_tmpdir(), (int)getpid());
        for (k = 0; k < 2; k++) {
            ddp_store_t *x = NULL;
            int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600), saved = dup(2);
            d.secret = secrets[k];
            d.log_level = DDP_LOG_WARN + 1;
            if (fd >= 0 && saved >= 0) dup2(fd, 2);
            if (ddp_store_open(&x, "127.0.0.1", 0, 1, &d) == DDP_SUCCESS) ddp_store_close(x);
            if (saved >= 0) { dup2(saved, 2); close(saved); }
            if (fd >= 0) close(fd);
            ok(file_has(path, "WARN store: the job secret is 7 characters", NULL) == (k == 0),
               "stretched-key: a %zu-character secret %s a WARN", strlen(secrets[k]), k == 0 ? "gets" : "does not get");
        }
        unlink(path);
        d.secret = SECRET;
    }
    ok(prove_with(port, 1, SECRET), "stretched-key: a proof keyed with PBKDF2(secret, the challenge's salt) is accepted");
    ok(!prove_with(port, 0, SECRET), "stretched-key: a proof keyed with the raw secret is refused (one HMAC per guess "
       "no longer checks a guess)");
    ddp_store_close(srv);
}

/* ----------------------------------------------------------------- secretless-user */
typedef struct { int port; int family; } stranger_arg_t;

static int stranger(int rank, int p, void *arg) {
    const stranger_arg_t *a = (const stranger_arg_t *)arg;
    unsigned char b[64];
    ssize_t n = -1;
    int fd;
    struct pollfd pfd;
    (void)rank; (void)p;
    if (!become(NOBODY)) return 1;
    fd = connect_port(a->family, a->port);
    if (fd < 0) return ok(0, "stranger: could not even connect (%s)", strerror(errno)) ? 0 : 1;
    pfd.fd = fd; pfd.events = POLLIN; pfd.revents = 0;
    if (poll(&pfd, 1, 20000) == 1) n = recv(fd, b, sizeof b, 0);
    close(fd);
    return ok(n <= 0, "secretless-user: uid %d connecting over %s is closed before it is sent anything "
              "(%zd bytes came)", NOBODY, a->family == AF_INET ? "127.0.0.1" : "::1", n) ? 0 : 1;
}

static void secretless_user(void) {
    const char *hosts[2] = {"127.0.0.1", NULL};
    int h;
    if (geteuid() != 0) {
        ok(1, "# SKIP secretless-user: needs root (to run a process as another user)");
        return;
    }
    for (h = 0; h < 2; h++) {
        ddp_store_t *srv = NULL, *c = NULL;
        ddp_store_desc_t d;
        stranger_arg_t a;
        char buf[16];
        size_t len = 0;
        const char *where = hosts[h] ? hosts[h] : "every interface";
        memset(&d, 0, sizeof d);
        d.secret = "";
        d.timeout_ms = 20000;
        d.log_level = 1;
        if (!ok(ddp_store_open(&srv, hosts[h], 0, 1, &d) == DDP_SUCCESS, "secretless-user: store without a secret on %s", where))
            continue;
        a.port = ddp_store_port(srv);
        a.family = AF_INET;
        ok(t_run_ranks(1, stranger, &a, 60) == 0, "secretless-user: another user is refused over 127.0.0.1 (store on %s)", where);
        if (!hosts[h]) {
            /* Is there an IPv6 loopback? (Not by connecting to the store: a child forked while
             * the server still held that connection would keep its socket in the epoll set.) */
            struct sockaddr_in6 l6;
            int v6 = socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0), have6;
            memset(&l6, 0, sizeof l6);
            l6.sin6_family = AF_INET6;
            l6.sin6_addr = in6addr_loopback;
            have6 = v6 >= 0 && bind(v6, (struct sockaddr *)&l6, sizeof l6) == 0;
            if (v6 >= 0) close(v6);
            if (have6) {
                a.family = AF_INET6;
                ok(t_run_ranks(1, stranger, &a, 60) == 0, "secretless-user: another user is refused over ::1 (store on %s)", where);
            } else {
                ok(1, "# SKIP secretless-user: no IPv6 loopback here");
            }
        }
        ok(ddp_store_open(&c, "127.0.0.1", a.port, 0, &d) == DDP_SUCCESS && ddp_store_set(c, "k", "v", 1) == DDP_SUCCESS &&
           ddp_store_get(c, "k", buf, sizeof buf, &len) == DDP_SUCCESS && len == 1,
           "secretless-user: this user's own client works (store on %s)", where);
        if (c) ddp_store_close(c);
        ddp_store_close(srv);
    }
}

/* ----------------------------------------------------------------- secretless-warn */
typedef struct { const char *master; char files[2][512]; } warn_arg_t;

/* A 2-rank job over TCP without a secret, each rank's stderr (its log) in a file. */
static int warn_rank(int rank, int p, void *arg) {
    warn_arg_t *a = (warn_arg_t *)arg;
    ddp_comm_desc_t d;
    ddp_comm_t *c;
    int fd = open(a->files[rank], O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600), saved = dup(2);
    if (fd < 0 || saved < 0 || dup2(fd, 2) < 0) return 1;
    close(fd);
    t_desc(&d, 20000);
    d.master_addr = a->master;
    d.job_secret = "";
    d.transport = "tcp";
    d.log_level = DDP_LOG_WARN + 1;
    c = t_comm_init(rank, p, &d);
    if (c) ddp_comm_destroy(c);
    dup2(saved, 2);
    close(saved);
    return c ? 0 : 1;
}

static void secretless_warn(void) {
    struct ifaddrs *ifs = NULL, *i;
    char ip[INET_ADDRSTRLEN] = "";
    warn_arg_t a;
    int r, k;
    if (getifaddrs(&ifs) == 0) {
        for (i = ifs; i && !ip[0]; i = i->ifa_next)
            if (i->ifa_addr && i->ifa_addr->sa_family == AF_INET && (i->ifa_flags & IFF_UP) &&
                !(i->ifa_flags & IFF_LOOPBACK))
                inet_ntop(AF_INET, &((struct sockaddr_in *)(void *)i->ifa_addr)->sin_addr, ip, sizeof ip);
        freeifaddrs(ifs);
    }
    for (k = 0; k < 2; k++)
        snprintf(a.files[k], sizeof a.files[k], "%s/ddp_guard_warn_%d_%d.log", t_tmpdir(), (int)getpid(), k);
    if (!ip[0]) {
        ok(1, "# SKIP secretless-warn: no non-loopback IPv4 address here");
    } else {
        a.master = ip;
        r = t_run_ranks(2, warn_rank, &a, 60);
        ok(r == 0, "secretless-warn: a 2-rank job without a secret, MASTER_ADDR %s, initialises", ip);
        ok(file_has(a.files[0], "WARN store: listening on a network address", "no job secret"),
           "secretless-warn: rank 0 WARNs that its store listens on a network address without a secret");
        for (k = 0; k < 2; k++)
            ok(file_has(a.files[k], "WARN tcp: listening on", "the job has no secret"),
               "secretless-warn: rank %d WARNs that its TCP listener is on a network address without a secret", k);
    }
    a.master = "127.0.0.1";
    r = t_run_ranks(2, warn_rank, &a, 60);
    ok(r == 0 && !file_has(a.files[0], "network address", NULL) && !file_has(a.files[1], "network address", NULL),
       "secretless-warn: on loopback (MASTER_ADDR 127.0.0.1) neither the store nor the listeners WARN");
    for (k = 0; k < 2; k++) unlink(a.files[k]);
}

int main(void) {
    t_init();
    if (t_selected("stretched-key")) stretched_key();
    if (t_selected("throttle")) throttle(geteuid() == 0);
    if (t_selected("same-source")) throttle(0);
    if (t_selected("secretless-user")) secretless_user();
    if (t_selected("secretless-warn")) secretless_warn();
    return t_done();
}
