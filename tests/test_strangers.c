/* SPDX-License-Identifier: MIT (see LICENSE) */
/* tests/test_strangers.c — what strangers can do to a job's data connections: nothing. Prints TAP.
 *
 *   build/test_strangers          (DDP_TEST_ONLY=<scenario name> runs one; DDP_TEST_QUICK=1
 *                                  skips the 256-rank run)
 *
 * A stranger here is a process of the same user on the same host that reads the rendezvous
 * store (open by design without DDP_JOB_SECRET) and speaks the wire formats of
 * transports/ddp_tcp.h and transports/ddp_shm.h, but does not know the communicator's key.
 * Every scenario runs real ranks (forked) next to a stranger process; the ranks are held at the
 * rendezvous (the last one starts only when the stranger says so), so what the stranger sends
 * is on the wire before the ranks accept: nothing depends on timing.
 *   impostor     connects to rank 1's TCP listener as rank 0 with a made-up nonce, gets the
 *                challenge, answers with a wrong proof and then a data message: its connection
 *                is closed and every rank's all-reduce is exactly right.
 *   fake-acceptor  rewrites rank 1's address in the store to its own listener: rank 0 gets
 *                DDP_ERR_AUTH naming the impostor, and the fake acceptor never gets a proof.
 *   relay        a relay between rank 0 and rank 1 (rank 1's address in the store rewritten)
 *                with DDP_JOB_SECRET set: the handshake it forwards verifies with the key the
 *                test derives (so the test knows the key), neither the secret, the token nor
 *                the key appears anywhere in the bytes it carried, a replay of the captured
 *                hello + answer to rank 1 is refused, and the all-reduce through the relay is
 *                exactly right.
 *   flood        (also: 2,000 idle connections to the master port while ranks 1-3 initialise, every
 *                rank's soft and hard RLIMIT_NOFILE 1024: the store keeps strangers to a quarter of
 *                the descriptors, so rank 0's transports still get theirs)
 *                2,000 idle connections (fewer if the hard RLIMIT_NOFILE forbids: said so) to
 *                one rank's listener, ranks under a soft RLIMIT_NOFILE of 1024, then also with
 *                the flooded rank's soft limit a few descriptors above what it uses (accept4
 *                fails with EMFILE): init and an all-reduce succeed, each rank done well within
 *                the 10 s handshake deadline of an idle connection (< 5 s after the job starts).
 *   shm-stranger same-user process with the right communicator id connects to rank 1's shm
 *                socket, gets a challenge, answers with a wrong proof: closed, and never given
 *                a memfd; the job's all-reduce is exactly right.
 *   shm-many     128 ranks (and 256 unless DDP_TEST_QUICK) on this host over shm join the
 *                host's region (one handshake each with its lowest rank) and all-reduce.
 */
#define _GNU_SOURCE
#define DDP_IMPLEMENTATION
#include "ddp.h"
#include "transports/ddp_tcp.h"
#include "transports/ddp_shm.h"
#include "tests/ddp_test.h"

#include <dirent.h>
#include <sys/resource.h>
#include <sys/un.h>

#define SECRET "strangers-test-secret-7d1c"
#define CAP_BYTES (256u << 10)

typedef struct {
    int flag[4];
    double t_release, t_done[T_MAX_RANKS];
    int many_status[256];
    float many_value[256];
} strangers_shm_t;

static strangers_shm_t *S;

static void wait_flag(int i) {
    double t0 = t_now();
    while (!__atomic_load_n(&S->flag[i], __ATOMIC_SEQ_CST) && t_now() - t0 < 30) t_sleep_ms(5);
}
static void set_flag(int i) { __atomic_store_n(&S->flag[i], 1, __ATOMIC_SEQ_CST); }

static ddp_comm_t *init_comm(int rank, int p, const char *transport, const char *secret, int timeout_ms) {
    ddp_comm_desc_t d;
    t_desc(&d, timeout_ms);
    d.log_level = 1;
    d.transport = transport;
    d.job_secret = secret;
    return t_comm_init(rank, p, &d);
}

/* All-reduce of 100 floats, rank r contributing r + 1: exactly p(p+1)/2 everywhere, or an error. */
static int check_all_reduce(ddp_comm_t *c, int rank, int p, const char *what) {
    float v[100];
    ddp_result_t r;
    int i, good;
    for (i = 0; i < 100; i++) v[i] = (float)(rank + 1);
    t_where("all_reduce");
    r = ddp_all_reduce(v, v, 100, DDP_FLOAT32, DDP_SUM, c);
    for (good = 1, i = 0; i < 100; i++) if (v[i] != (float)(p * (p + 1) / 2)) good = 0;
    ok(r != DDP_SUCCESS || good, "%s: rank %d's all-reduce result is exactly right (never injected data)", what, rank);
    return ok(r == DDP_SUCCESS, "%s: rank %d's all-reduce succeeds (%s %s)", what, rank, ddp_strerror(r),
              r ? ddp_comm_last_error(c) : "");
}

static ddp_store_t *open_store(const char *secret) {
    ddp_store_t *s = NULL;
    ddp_store_desc_t d;
    memset(&d, 0, sizeof d);
    d.timeout_ms = 20000;
    d.log_level = 1;
    d.secret = secret ? secret : "";
    if (ddp_store_open(&s, "127.0.0.1", t_master_port, 0, &d) != DDP_SUCCESS) return NULL;
    return s;
}

/* The communicator id (and the token after it) and a rank's published address. */
static int read_ident(ddp_store_t *s, uint64_t *id, unsigned char token[32]) {
    unsigned char ident[40];
    size_t len = 0;
    if (ddp_store_get(s, "ddp/comm_id", ident, sizeof ident, &len) != DDP_SUCCESS || len != sizeof ident) return 0;
    memcpy(id, ident, 8);
    if (token) memcpy(token, ident + 8, 32);
    return 1;
}

static int connect_to(const struct sockaddr_storage *ss, socklen_t len) {
    int fd = socket(ss->ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    if (connect(fd, (const struct sockaddr *)ss, len) != 0) { close(fd); return -1; }
    return fd;
}

static int read_full(int fd, void *buf, size_t n, int ms) {
    size_t got = 0;
    double t0 = t_now();
    while (got < n) {
        struct pollfd pfd;
        ssize_t k;
        int left = ms - (int)((t_now() - t0) * 1000);
        if (left <= 0) return 0;
        pfd.fd = fd; pfd.events = POLLIN; pfd.revents = 0;
        if (poll(&pfd, 1, left) <= 0) continue;
        k = recv(fd, (char *)buf + got, n - got, MSG_DONTWAIT);
        if (k == 0) return 0;
        if (k < 0) { if (errno == EAGAIN || errno == EINTR) continue; return 0; }
        got += (size_t)k;
    }
    return 1;
}

static int send_full(int fd, const void *buf, size_t n) {
    return send(fd, buf, n, MSG_NOSIGNAL) == (ssize_t)n;
}

/* A loopback listener on a kernel-chosen port; its address in *ss. */
static int listen_here(struct sockaddr_storage *ss, socklen_t *len) {
    struct sockaddr_in *a = (struct sockaddr_in *)ss;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    memset(ss, 0, sizeof *ss);
    a->sin_family = AF_INET;
    a->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    *len = sizeof *a;
    if (fd < 0 || bind(fd, (struct sockaddr *)ss, *len) != 0 || listen(fd, 16) != 0 ||
        getsockname(fd, (struct sockaddr *)ss, len) != 0) {
        if (fd >= 0) close(fd);
        return -1;
    }
    return fd;
}

static int accept_within(int lfd, int ms) {
    struct pollfd pfd;
    pfd.fd = lfd; pfd.events = POLLIN; pfd.revents = 0;
    if (poll(&pfd, 1, ms) != 1) return -1;
    return accept(lfd, NULL, NULL);
}

static int contains(const unsigned char *hay, size_t n, const void *needle, size_t m) {
    size_t i;
    for (i = 0; i + m <= n; i++) if (!memcmp(hay + i, needle, m)) return 1;
    return 0;
}

/* ----------------------------------------------------------------- impostor */
static int impostor(int idx, int nproc, void *arg) {
    const int p = nproc - 1;
    (void)arg;
    if (idx == p) {
        ddp_store_t *s = open_store(NULL);
        struct sockaddr_storage ss;
        size_t len = 0;
        uint64_t id = 0;
        _ddp_tcp_hello_t h;
        _ddp_tcp_challenge_t ch;
        int fd = -1;
        if (!ok(s && read_ident(s, &id, NULL) && ddp_store_get(s, "ddp/addr/tcp/1", &ss, sizeof ss, &len) == DDP_SUCCESS,
                "impostor: read the communicator id and rank 1's TCP address from the store (no job secret)")) {
            set_flag(0);
            if (s) ddp_store_close(s);
            return 1;
        }
        ddp_store_close(s);
        fd = connect_to(&ss, (socklen_t)len);
        memset(&h, 0, sizeof h);
        h.magic = _DDP_TCP_HELLO_MAGIC;
        h.version = _DDP_TCP_VERSION;
        h.comm_id = id;
        h.from = 0;
        h.to = 1;
        memset(h.nonce, 0x5a, sizeof h.nonce);     /* made up */
        ok(fd >= 0 && send_full(fd, &h, sizeof h), "impostor: hello sent to rank 1 as rank 0");
        set_flag(0);                               /* now the last rank may start */
        if (ok(fd >= 0 && read_full(fd, &ch, sizeof ch, 20000) && ch.magic == _DDP_TCP_HELLO_MAGIC && ch.status == 0,
               "impostor: rank 1 challenges the hello (right communicator id, right ranks)")) {
            struct { _ddp_tcp_answer_t a; _ddp_tcp_hdr_t m; float data[100]; } inj;
            int i;
            memset(&inj, 0, sizeof inj);
            inj.a.magic = _DDP_TCP_HELLO_MAGIC;
            memset(inj.a.proof, 0xa5, sizeof inj.a.proof);   /* wrong: it does not know the key */
            inj.m.magic = _DDP_TCP_MSG_MAGIC;
            inj.m.len = sizeof inj.data;
            for (i = 0; i < 100; i++) inj.data[i] = 1e6f;
            send(fd, &inj, sizeof inj, MSG_NOSIGNAL);
            ok(t_closed_within(fd, 20000), "impostor: a wrong proof gets the connection closed");
        }
        if (fd >= 0) close(fd);
        return 0;
    }
    {
        ddp_comm_t *c;
        if (idx == p - 1) wait_flag(0);
        if (!(c = init_comm(idx, p, "tcp", NULL, 20000))) return 1;
        check_all_reduce(c, idx, p, "impostor");
        ddp_comm_destroy(c);
    }
    return 0;
}

/* ----------------------------------------------------------------- fake acceptor */
static int fake_acceptor(int idx, int nproc, void *arg) {
    const int p = nproc - 1;
    (void)arg;
    if (idx == p) {
        ddp_store_t *s = open_store(NULL);
        struct sockaddr_storage me, real;
        socklen_t ml = 0;
        size_t len = 0;
        int lfd = listen_here(&me, &ml), fd;
        _ddp_tcp_hello_t h;
        _ddp_tcp_challenge_t ch;
        unsigned char rest[64];
        if (!ok(s && lfd >= 0 && ddp_store_get(s, "ddp/addr/tcp/1", &real, sizeof real, &len) == DDP_SUCCESS &&
                ddp_store_set(s, "ddp/addr/tcp/1", &me, ml) == DDP_SUCCESS,
                "fake acceptor: rank 1's address in the store now points to the stranger")) {
            set_flag(0);
            if (s) ddp_store_close(s);
            return 1;
        }
        ddp_store_close(s);
        set_flag(0);
        fd = accept_within(lfd, 20000);
        ok(fd >= 0 && read_full(fd, &h, sizeof h, 20000) && h.from == 0 && h.to == 1,
           "fake acceptor: rank 0 connects and says hello");
        memset(&ch, 0, sizeof ch);
        ch.magic = _DDP_TCP_HELLO_MAGIC;
        memset(ch.nonce, 0x11, sizeof ch.nonce);
        memset(ch.proof, 0x22, sizeof ch.proof);    /* it cannot make the right one */
        if (fd >= 0) send_full(fd, &ch, sizeof ch);
        {   /* Rank 0 must not answer with its proof: nothing more arrives, then EOF. */
            ssize_t n = 0, k;
            struct pollfd pfd;
            double t0 = t_now();
            while (fd >= 0 && t_now() - t0 < 20) {
                pfd.fd = fd; pfd.events = POLLIN; pfd.revents = 0;
                if (poll(&pfd, 1, 1000) <= 0) continue;
                k = recv(fd, rest, sizeof rest, 0);
                if (k <= 0) break;
                n += k;
            }
            ok(fd >= 0 && n == 0, "fake acceptor: rank 0 sends no proof to an acceptor that failed its own (%zd bytes came)", n);
        }
        if (fd >= 0) close(fd);
        close(lfd);
        return 0;
    }
    {
        ddp_comm_desc_t d;
        ddp_comm_t *c = NULL;
        ddp_result_t r;
        if (idx == p - 1) wait_flag(0);
        t_desc(&d, 4000);
        d.log_level = 1;
        d.transport = "tcp";
        r = ddp_comm_init(&c, p, idx, &d);
        if (idx == 0)
            ok(r == DDP_ERR_AUTH && strstr(ddp_last_init_error(), "key") && strstr(ddp_last_init_error(), "rank 1"),
               "fake acceptor: rank 0 refuses it: %s: %s", ddp_strerror(r), ddp_last_init_error());
        if (r == DDP_SUCCESS) ddp_comm_destroy(c);
    }
    return 0;
}

/* ----------------------------------------------------------------- relay */
typedef struct { unsigned char *buf; size_t n; } capture_t;

static void capture(capture_t *c, const void *p, size_t n) {
    size_t take = n < CAP_BYTES - c->n ? n : CAP_BYTES - c->n;
    memcpy(c->buf + c->n, p, take);
    c->n += take;
}

/* Forwards both ways until both sides closed (or 20 s), capturing. */
static void relay_pump(int a, int b, capture_t *ab, capture_t *ba) {
    int open_a = 1, open_b = 1;
    char buf[65536];
    double t0 = t_now();
    while ((open_a || open_b) && t_now() - t0 < 20) {
        struct pollfd pfd[2];
        int n = 0, i;
        if (open_a) { pfd[n].fd = a; pfd[n].events = POLLIN; pfd[n].revents = 0; n++; }
        if (open_b) { pfd[n].fd = b; pfd[n].events = POLLIN; pfd[n].revents = 0; n++; }
        if (poll(pfd, (nfds_t)n, 500) <= 0) continue;
        for (i = 0; i < n; i++) {
            int from = pfd[i].fd, to = from == a ? b : a;
            ssize_t k;
            if (!pfd[i].revents) continue;
            k = recv(from, buf, sizeof buf, MSG_DONTWAIT);
            if (k < 0 && (errno == EAGAIN || errno == EINTR)) continue;
            if (k <= 0) {
                shutdown(to, SHUT_WR);
                if (from == a) open_a = 0; else open_b = 0;
                continue;
            }
            capture(from == a ? ab : ba, buf, (size_t)k);
            if (!send_full(to, buf, (size_t)k)) { open_a = open_b = 0; }
        }
    }
}

static int relay(int idx, int nproc, void *arg) {
    const int p = nproc - 1;
    (void)arg;
    if (idx == p) {
        ddp_store_t *s = open_store(SECRET);
        struct sockaddr_storage me, real;
        socklen_t ml = 0;
        size_t len = 0;
        uint64_t id = 0;
        unsigned char token[32], key[32];
        int lfd = listen_here(&me, &ml), a = -1, b = -1, r = -1;
        _ddp_tcp_hello_t h;
        _ddp_tcp_challenge_t ch, ch2;
        _ddp_tcp_answer_t an;
        capture_t ab, ba;
        ab.buf = (unsigned char *)malloc(CAP_BYTES); ab.n = 0;
        ba.buf = (unsigned char *)malloc(CAP_BYTES); ba.n = 0;
        if (!ok(s && lfd >= 0 && ab.buf && ba.buf && read_ident(s, &id, token) &&
                ddp_store_get(s, "ddp/addr/tcp/1", &real, sizeof real, &len) == DDP_SUCCESS &&
                ddp_store_set(s, "ddp/addr/tcp/1", &me, ml) == DDP_SUCCESS,
                "relay: (with the job secret) rank 1's address in the store now points to the relay")) {
            set_flag(0);
            if (s) ddp_store_close(s);
            free(ab.buf); free(ba.buf);
            return 1;
        }
        {   /* The key the ranks prove, as the communicator derives it (ddp_rendezvous.h) from the
             * secret stretched with the store's salt (ddp_auth.h), as this client did. */
            _ddp_hmac_sha256_t hm;
            unsigned char job_key[32];
            _ddp_auth_job_key(SECRET, strlen(SECRET), s->salt, job_key);
            _ddp_hmac_sha256_init(&hm, job_key, sizeof job_key);
            _ddp_hmac_sha256_update(&hm, "ddp data key v1", 15);
            _ddp_hmac_sha256_update(&hm, token, sizeof token);
            _ddp_hmac_sha256_final(&hm, key);
        }
        ddp_store_close(s);
        set_flag(0);
        a = accept_within(lfd, 20000);
        b = connect_to(&real, (socklen_t)len);
        ok(a >= 0 && b >= 0 && read_full(a, &h, sizeof h, 20000) && send_full(b, &h, sizeof h) &&
           read_full(b, &ch, sizeof ch, 20000) && send_full(a, &ch, sizeof ch) &&
           read_full(a, &an, sizeof an, 20000),
           "relay: rank 0's hello, rank 1's challenge and rank 0's answer pass through the relay");
        capture(&ab, &h, sizeof h); capture(&ba, &ch, sizeof ch); capture(&ab, &an, sizeof an);
        {
            char label[96];
            snprintf(label, sizeof label, "tcp %016llx %d->%d", (unsigned long long)id, 0, 1);
            ok(_ddp_auth_verify(key, sizeof key, _DDP_AUTH_SERVER, label, ch.nonce, h.nonce, ch.proof) &&
               _ddp_auth_verify(key, sizeof key, _DDP_AUTH_CLIENT, label, ch.nonce, h.nonce, an.proof),
               "relay: both proofs verify with the key the test derived from the secret and the token");
        }
        /* Replay the captured connector side to rank 1, which still waits for rank 0. */
        r = connect_to(&real, (socklen_t)len);
        if (ok(r >= 0 && send_full(r, &h, sizeof h) && read_full(r, &ch2, sizeof ch2, 20000),
               "replay: rank 1 challenges the replayed hello")) {
            ok(memcmp(ch2.nonce, ch.nonce, sizeof ch.nonce) != 0, "replay: with a fresh nonce");
            send_full(r, &an, sizeof an);
            ok(t_closed_within(r, 20000), "replay: the captured answer does not prove anything: connection closed");
        }
        if (r >= 0) close(r);
        if (a >= 0 && b >= 0 && send_full(b, &an, sizeof an)) relay_pump(a, b, &ab, &ba);
        ok(ab.n > 200 && ba.n > 200, "relay: carried %zu bytes from rank 0 and %zu from rank 1", ab.n, ba.n);
        ok(!contains(ab.buf, ab.n, SECRET, strlen(SECRET)) && !contains(ba.buf, ba.n, SECRET, strlen(SECRET)),
           "wire: the job secret never crosses it");
        ok(!contains(ab.buf, ab.n, token, 16) && !contains(ba.buf, ba.n, token, 16) &&
           !contains(ab.buf, ab.n, key, 16) && !contains(ba.buf, ba.n, key, 16) &&
           !contains(ab.buf, ab.n, token + 16, 16) && !contains(ba.buf, ba.n, token + 16, 16) &&
           !contains(ab.buf, ab.n, key + 16, 16) && !contains(ba.buf, ba.n, key + 16, 16),
           "wire: neither the token nor the derived key (nor either half of them) crosses it");
        if (a >= 0) close(a);
        if (b >= 0) close(b);
        close(lfd);
        free(ab.buf); free(ba.buf);
        return 0;
    }
    {
        ddp_comm_t *c;
        if (idx == p - 1) wait_flag(0);
        if (!(c = init_comm(idx, p, "tcp", SECRET, 20000))) return 1;
        check_all_reduce(c, idx, p, "relay");
        ddp_comm_destroy(c);
    }
    return 0;
}

/* ----------------------------------------------------------------- flood */
typedef struct { int nidle, tight, store; } flood_arg_t;   /* store: flood the master port */

static int open_fds(void) {
    DIR *d = opendir("/proc/self/fd");
    struct dirent *e;
    int n = 0;
    if (!d) return 16;
    while ((e = readdir(d))) if (e->d_name[0] != '.') n++;
    closedir(d);
    return n - 1;
}

#define FLOODED 3
static int flood(int idx, int nproc, void *arg) {
    const flood_arg_t *fa = (const flood_arg_t *)arg;
    const int p = nproc - 1;
    if (idx == p) {
        ddp_store_t *s = open_store(NULL);   /* waits until rank 0 serves the store */
        struct sockaddr_storage ss;
        size_t len = 0;
        int *fds = (int *)malloc(sizeof(int) * (size_t)fa->nidle), n = 0, i, up = 0;
        char key[64];
        snprintf(key, sizeof key, "ddp/addr/tcp/%d", FLOODED);
        if (fa->store && s) {         /* the master port itself */
            struct sockaddr_in *a = (struct sockaddr_in *)&ss;
            memset(&ss, 0, sizeof ss);
            a->sin_family = AF_INET;
            a->sin_port = htons((uint16_t)t_master_port);
            a->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
            len = sizeof *a;
        } else if (!fds || !s || ddp_store_get(s, key, &ss, sizeof ss, &len) != DDP_SUCCESS) {
            ok(0, "flood: rank %d's address from the store", FLOODED);
            set_flag(0);
            if (s) ddp_store_close(s);
            free(fds);
            return 1;
        }
        ddp_store_close(s);
        for (i = 0; i < fa->nidle; i++) {
            int fd = socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
            if (fd < 0) break;
            if (connect(fd, (struct sockaddr *)&ss, (socklen_t)len) != 0 && errno != EINPROGRESS) { close(fd); break; }
            fds[n++] = fd;
        }
        for (i = 0; i < n; i++) {   /* established (queued in the listener's backlog)? */
            struct pollfd pfd;
            int err = 0;
            socklen_t el = sizeof err;
            pfd.fd = fds[i]; pfd.events = POLLOUT; pfd.revents = 0;
            if (poll(&pfd, 1, 5000) == 1 && getsockopt(fds[i], SOL_SOCKET, SO_ERROR, &err, &el) == 0 && !err) up++;
        }
        ok(up == fa->nidle, "flood: %d of %d idle connections to %s are up", up, fa->nidle,
           fa->store ? "the master port (rank 0's store)" : "rank 3's listener");
        S->t_release = t_now();
        set_flag(0);
        {   /* Hold them until every rank is done. */
            double t0 = t_now();
            while (!__atomic_load_n(&S->flag[1], __ATOMIC_SEQ_CST) && t_now() - t0 < 30) t_sleep_ms(5);
        }
        for (i = 0; i < n; i++) close(fds[i]);
        free(fds);
        return 0;
    }
    {
        ddp_comm_t *c;
        struct rlimit rl;
        getrlimit(RLIMIT_NOFILE, &rl);
        rl.rlim_cur = 1024;
        if (fa->tight && idx == FLOODED) rl.rlim_cur = (rlim_t)open_fds() + 24;
        if (rl.rlim_cur > rl.rlim_max) rl.rlim_cur = rl.rlim_max;
        if (fa->store) rl.rlim_max = rl.rlim_cur;   /* the store cannot raise its limit either */
        setrlimit(RLIMIT_NOFILE, &rl);
        if (fa->store ? idx != 0 : idx == 2) wait_flag(0);
        if (!(c = init_comm(idx, p, "tcp", NULL, 20000))) return 1;
        if (check_all_reduce(c, idx, p, "flood")) S->t_done[idx] = t_now();
        if (__atomic_add_fetch(&S->flag[2], 1, __ATOMIC_SEQ_CST) == p) set_flag(1);
        ddp_comm_destroy(c);
    }
    return 0;
}

/* ----------------------------------------------------------------- shm stranger */
static int shm_stranger(int idx, int nproc, void *arg) {
    const int p = nproc - 1;
    (void)arg;
    if (idx == p) {
        ddp_store_t *s = open_store(NULL);
        _ddp_shm_addr_t a;
        size_t len = 0;
        uint64_t id = 0;
        int fd = -1, got, memfd = -1, pipefd[2] = {-1, -1};
        struct sockaddr_un sa;
        _ddp_shm_hello_t h, ch;
        if (!ok(s && read_ident(s, &id, NULL) && ddp_store_get(s, "ddp/addr/shm/1", &a, sizeof a, &len) == DDP_SUCCESS &&
                len == sizeof a, "shm stranger: read the communicator id and rank 1's shm socket from the store")) {
            set_flag(0);
            if (s) ddp_store_close(s);
            return 1;
        }
        ddp_store_close(s);
        a.name[sizeof a.name - 1] = 0;
        memset(&sa, 0, sizeof sa);
        sa.sun_family = AF_UNIX;
        memcpy(sa.sun_path + 1, a.name, strlen(a.name));
        fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        memset(&h, 0, sizeof h);
        h.magic = _DDP_SHM_MAGIC;
        h.version = _DDP_SHM_VERSION;
        h.comm_id = id;
        h.from = 0;
        h.to = 1;
        h.kind = _DDP_SHM_HELLO;
        memset(h.nonce, 0x33, sizeof h.nonce);
        ok(fd >= 0 && connect(fd, (struct sockaddr *)&sa,
                              (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + strlen(a.name))) == 0 &&
           send_full(fd, &h, sizeof h), "shm stranger: hello sent to rank 1 as rank 0 (same user, right id)");
        set_flag(0);
        {   /* The challenge: no descriptor with it. */
            struct pollfd pfd;
            pfd.fd = fd; pfd.events = POLLIN; pfd.revents = 0;
            got = fd >= 0 && poll(&pfd, 1, 20000) == 1 ? _ddp_shm_recv_hello(fd, &ch, &memfd) : -1;
        }
        ok(got == 1 && ch.kind == _DDP_SHM_CHALLENGE && ch.status == 0 && memfd < 0,
           "shm stranger: rank 1 challenges it and hands out no memfd with the challenge");
        if (memfd >= 0) close(memfd);
        memfd = -1;
        if (got == 1 && pipe(pipefd) == 0) {
            /* A wrong proof, with a descriptor as a real answer would carry. */
            struct msghdr m;
            struct iovec iov;
            union { struct cmsghdr align; char buf[CMSG_SPACE(sizeof(int))]; } u;
            struct cmsghdr *cm;
            _ddp_shm_hello_t an = h;
            an.kind = _DDP_SHM_ANSWER;
            memset(an.proof, 0x44, sizeof an.proof);
            memset(&m, 0, sizeof m);
            memset(&u, 0, sizeof u);
            iov.iov_base = &an; iov.iov_len = sizeof an;
            m.msg_iov = &iov; m.msg_iovlen = 1;
            m.msg_control = u.buf; m.msg_controllen = sizeof u.buf;
            cm = CMSG_FIRSTHDR(&m);
            cm->cmsg_level = SOL_SOCKET; cm->cmsg_type = SCM_RIGHTS; cm->cmsg_len = CMSG_LEN(sizeof(int));
            memcpy(CMSG_DATA(cm), &pipefd[0], sizeof(int));
            sendmsg(fd, &m, MSG_NOSIGNAL);
            {
                struct pollfd pfd;
                double t0 = t_now();
                int closed = 0, fds_given = 0;
                while (t_now() - t0 < 20 && !closed) {
                    pfd.fd = fd; pfd.events = POLLIN; pfd.revents = 0;
                    if (poll(&pfd, 1, 1000) <= 0) continue;
                    got = _ddp_shm_recv_hello(fd, &ch, &memfd);
                    if (memfd >= 0) { fds_given++; close(memfd); memfd = -1; }
                    if (got < 0) closed = 1;
                }
                ok(closed && !fds_given, "shm stranger: a wrong proof gets the connection closed, and no memfd");
            }
            close(pipefd[0]);
            close(pipefd[1]);
        }
        if (fd >= 0) close(fd);
        return 0;
    }
    {
        ddp_comm_t *c;
        if (idx == p - 1) wait_flag(0);
        if (!(c = init_comm(idx, p, "shm", NULL, 20000))) return 1;
        check_all_reduce(c, idx, p, "shm stranger");
        ddp_comm_destroy(c);
    }
    return 0;
}

/* ----------------------------------------------------------------- many shm ranks */
static void shm_many(int n, int timeout_s) {
    pid_t *pids = (pid_t *)calloc((size_t)n, sizeof *pids);
    int port = t_free_port(), r, done = 0, good = 0, value_ok = 0;
    double t0 = t_now();
    if (!pids) t_bail("calloc");
    memset(S->many_status, 0, sizeof S->many_status);
    fflush(stdout);
    fflush(stderr);
    for (r = 0; r < n; r++) {
        pid_t pid = fork();
        if (pid < 0) t_bail("fork: %s", strerror(errno));
        if (pid == 0) {
            ddp_comm_desc_t d;
            ddp_comm_t *c = NULL;
            float x = (float)(r + 1);
            int st = 2;
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            /* Small regions: n ranks map one region of n slots each. */
            setenv("DDP_SHM_CELLS", "2", 1);
            setenv("DDP_SHM_CELL_BYTES", "4096", 1);
            setenv("DDP_SHM_CHUNK", "65536", 1);
            memset(&d, 0, sizeof d);
            d.master_addr = "127.0.0.1";
            d.master_port = port;
            d.timeout_ms = timeout_s * 1000 - 5000;
            d.log_level = 1;
            d.transport = "shm";
            if (ddp_comm_init(&c, n, r, &d) == DDP_SUCCESS) {
                st = 3;
                if (ddp_all_reduce(&x, &x, 1, DDP_FLOAT32, DDP_SUM, c) == DDP_SUCCESS) st = 1;
                S->many_value[r] = x;
                ddp_comm_destroy(c);
            } else {
                fprintf(stderr, "shm-many rank %d: %s\n", r, ddp_last_init_error());
            }
            S->many_status[r] = st;
            free(pids);
            exit(0);
        }
        pids[r] = pid;
    }
    while (done < n) {
        for (r = 0; r < n; r++) {
            if (pids[r] && waitpid(pids[r], NULL, WNOHANG) == pids[r]) { pids[r] = 0; done++; }
        }
        if (t_now() - t0 > timeout_s) {
            for (r = 0; r < n; r++) if (pids[r]) { kill(pids[r], SIGKILL); waitpid(pids[r], NULL, 0); pids[r] = 0; done++; }
        }
        t_sleep_ms(5);
    }
    for (r = 0; r < n; r++) {
        if (S->many_status[r] == 1) good++;
        if (S->many_value[r] == (float)(n * (n + 1) / 2)) value_ok++;
    }
    ok(good == n && value_ok == n, "shm-many: %d ranks on this host join one shm region and "
       "all-reduce: %d succeeded, %d exact (%.1f s)", n, good, value_ok, t_now() - t0);
    free(pids);
}

int main(void) {
    int bad;
    const int quick = getenv("DDP_TEST_QUICK") != NULL;
    t_init();
    S = (strangers_shm_t *)t_shm_user(sizeof *S);
    unsetenv("DDP_JOB_SECRET");
    unsetenv("DDP_TRANSPORT");
    if (t_selected("impostor")) {
        diag("--- impostor: a stranger speaks rank 0's TCP hello to rank 1, with a wrong proof");
        memset(S, 0, sizeof *S);
        bad = t_run_ranks(4, impostor, NULL, 60);
        ok(bad == 0, "impostor: every process exited cleanly (%.1f s)", t_last_run.seconds);
    }
    if (t_selected("fake-acceptor")) {
        diag("--- fake-acceptor: a stranger takes rank 1's place in the store");
        memset(S, 0, sizeof *S);
        bad = t_run_ranks(4, fake_acceptor, NULL, 60);
        ok(bad == 0, "fake acceptor: every process exited (%.1f s)", t_last_run.seconds);
    }
    if (t_selected("relay")) {
        diag("--- relay: a relay between rank 0 and rank 1 captures and replays (DDP_JOB_SECRET set)");
        memset(S, 0, sizeof *S);
        bad = t_run_ranks(4, relay, NULL, 60);
        ok(bad == 0, "relay: every process exited cleanly (%.1f s)", t_last_run.seconds);
    }
    if (t_selected("flood")) {
        struct rlimit rl;
        flood_arg_t fa;
        int k, r;
        getrlimit(RLIMIT_NOFILE, &rl);
        fa.nidle = 2000;
        if (rl.rlim_max != RLIM_INFINITY && rl.rlim_max < 2000 + 64) {
            fa.nidle = (int)rl.rlim_max - 64;
            diag("flood: the hard RLIMIT_NOFILE is %llu: %d idle connections instead of 2000",
                 (unsigned long long)rl.rlim_max, fa.nidle);
        }
        if (rl.rlim_cur < (rlim_t)fa.nidle + 64) {   /* the helper inherits it */
            rl.rlim_cur = (rlim_t)fa.nidle + 64;
            setrlimit(RLIMIT_NOFILE, &rl);
        }
        for (k = 0; k < 3; k++) {
            double worst = 0;
            fa.tight = k == 1;
            fa.store = k == 2;
            if (k == 2)
                diag("--- flood: %d idle connections to the master port (rank 0's store) while ranks 1-3 "
                     "initialise; every rank's RLIMIT_NOFILE 1024, soft and hard", fa.nidle);
            else
                diag("--- flood: %d idle connections to rank %d's listener; ranks' soft RLIMIT_NOFILE %s",
                     fa.nidle, FLOODED, k ? "1024, the flooded rank's a few above what it uses (EMFILE)" : "1024");
            memset(S, 0, sizeof *S);
            bad = t_run_ranks(5, flood, &fa, 60);
            for (r = 0; r < 4; r++) {
                double dt = S->t_done[r] ? S->t_done[r] - S->t_release : 99;
                if (dt > worst) worst = dt;
            }
            ok(bad == 0 && worst < 5.0, "flood%s: init and all-reduce done on every rank %.2f s after the "
               "last rank started (an idle connection's handshake deadline is 10 s)",
               k == 2 ? " (store port, hard limit 1024)" : k ? " (EMFILE)" : "", worst);
        }
    }
    if (t_selected("shm-stranger")) {
        diag("--- shm-stranger: a same-user process with the communicator id but no key");
        memset(S, 0, sizeof *S);
        bad = t_run_ranks(4, shm_stranger, NULL, 60);
        ok(bad == 0, "shm stranger: every process exited cleanly (%.1f s)", t_last_run.seconds);
    }
    if (t_selected("shm-many")) {
        diag("--- shm-many: 128%s ranks on this host over shared memory", quick ? "" : " and 256");
        shm_many(128, 90);
        if (!quick) shm_many(256, 150);
    }
    return t_done();
}
