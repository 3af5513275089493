/* SPDX-License-Identifier: MIT (see LICENSE) */
/* transports/ddp_tcp.h — libddp's TCP socket transport (the default; needs only libc + pthreads).
 *
 * In the file that defines DDP_IMPLEMENTATION this compiles the transport and registers it (a
 * constructor), so ddp_comm_init can use it:
 *
 *     #define DDP_IMPLEMENTATION
 *     #include "ddp.h"
 *     #include "transports/ddp_tcp.h"
 *
 * It sees its communicator only through the ddp_transport_ctx_t given to init
 * (transports/ddp_transport.h). One connection per peer pair, both directions; non-blocking sockets with TCP_NODELAY, sends
 * with MSG_NOSIGNAL (a dead peer is an error, never SIGPIPE), IPv4 and IPv6.
 *
 * ENVIRONMENT
 *   DDP_SOCKET_IFNAME     which interface to listen on, NCCL's syntax: "eth0" or "eth,ib"
 *                         (prefixes), "=eth0" (exact), "^docker,lo" (exclude). Default: the
 *                         address this host uses to reach MASTER_ADDR.
 *   DDP_SOCKET_FAMILY     AF_INET or AF_INET6 to force one (with DDP_SOCKET_IFNAME).
 *   DDP_SOCKET_BUFSIZE    SO_SNDBUF/SO_RCVBUF in bytes (default: leave Linux's autotuning on).
 *
 * LISTENER: bound to the address chosen above (the interface that reaches the peers; with a
 * loopback MASTER_ADDR, loopback only), never the wildcard; backlog SOMAXCONN or 4096.
 *
 * HANDSHAKE (wire version 2): the connecting rank (the lower one) and the accepting rank prove
 * to each other that they know the communicator's key (ctx->auth_key), which never travels:
 *   connector -> acceptor  hello     {u32 magic, u32 version, u64 communicator id, i32 from,
 *                                     i32 to, u8 nonce_c[32]}                        56 bytes
 *   acceptor -> connector  challenge {u32 magic, u32 status, u8 nonce_s[32],
 *                                     u8 proof_s[32]}                                72 bytes
 *   connector -> acceptor  answer    {u32 magic, u32 status, u8 proof_c[32]}         40 bytes
 * proof_s = HMAC(key, "ddp-auth-v1 server" || label || nonce_c || nonce_s), proof_c the same
 * with "client" and the nonces swapped (ddp_auth.h), label = "tcp <comm id hex> <from>-><to>".
 * The connector refuses an acceptor whose proof_s is wrong (DDP_ERR_AUTH); the acceptor makes
 * the connection usable only once proof_c verifies and closes it at once otherwise. A hello for
 * another communicator, wire version or rank pair, bytes beyond the hello before the challenge,
 * no hello within 10 s, or no proof within the communicator's timeout (a peer with a valid
 * hello may be slow for good reasons): closed. Refusals are logged at most once a second.
 *
 * STRANGERS: connections still in their handshake live in a table of world size + 64 entries
 * allocated at init; when it is full, a newcomer evicts the oldest entry that has not sent its
 * hello (else the oldest), so idle connections cannot delay a rank's peers; accept4's EMFILE or
 * ENFILE evicts likewise and retries. Connects that are refused or reset (a listener's burst)
 * are retried with exponential backoff and jitter (5 ms .. 1 s, 12 attempts, within the
 * timeout).
 *
 * MESSAGES: {u32 magic, u32 0, u64 tag, u64 length} then the payload; the receiver checks tag
 * and length against what it posted.
 */
#if defined(DDP_IMPLEMENTATION) && !defined(DDP_TCP_IMPLEMENTATION)
#define DDP_TCP_IMPLEMENTATION
#endif
#if defined(DDP_TCP_IMPLEMENTATION)
#ifndef DDP_TRANSPORT_IMPLEMENTATION
#define DDP_TRANSPORT_IMPLEMENTATION
#endif
#ifndef DDP_SOCKET_IMPLEMENTATION
#define DDP_SOCKET_IMPLEMENTATION
#endif
#endif
#include "ddp_transport.h"
#include "../ddp_socket.h"

#ifndef DDP_TCP_H_INCLUDED
#define DDP_TCP_H_INCLUDED
#ifdef __cplusplus
extern "C" {
#endif
DDP_API const ddp_transport_t *ddp_transport_tcp(void);
#ifdef __cplusplus
}
#endif
#endif /* DDP_TCP_H_INCLUDED */

#if defined(DDP_TCP_IMPLEMENTATION) && !defined(DDP_TCP_IMPL_INCLUDED)
#define DDP_TCP_IMPL_INCLUDED
#if !defined(DDP_TRANSPORT_IMPL_INCLUDED) || !defined(DDP_SOCKET_IMPL_INCLUDED)
#error "transports/ddp_tcp.h's implementation needs ddp_transport.h's and ddp_socket.h's (define DDP_IMPLEMENTATION)"
#endif

#define _DDP_TCP_HELLO_MAGIC 0x44445448u /* "DDTH" */
#define _DDP_TCP_MSG_MAGIC 0x4444544du   /* "DDTM" */
#define _DDP_TCP_VERSION 2u              /* 2: mutual challenge-response */
#define _DDP_TCP_POOL 32                 /* requests per connection: 2 x DDP_RING_WINDOW + slack */
#define _DDP_TCP_HANDSHAKE_MS 10000
#define _DDP_TCP_CONNECT_TRIES 12        /* refused or reset connects, backing off 5 ms .. 1 s */

typedef struct {
    uint32_t magic, version;
    uint64_t comm_id;
    int32_t from, to;
    unsigned char nonce[_DDP_AUTH_NONCE_BYTES];           /* the connector's */
} _ddp_tcp_hello_t;
typedef struct {
    uint32_t magic, status;
    unsigned char nonce[_DDP_AUTH_NONCE_BYTES];           /* the acceptor's */
    unsigned char proof[_DDP_AUTH_PROOF_BYTES];           /* the acceptor's proof */
} _ddp_tcp_challenge_t;
typedef struct {
    uint32_t magic, status;
    unsigned char proof[_DDP_AUTH_PROOF_BYTES];           /* the connector's proof */
} _ddp_tcp_answer_t;
typedef struct { uint32_t magic, zero; uint64_t tag, len; } _ddp_tcp_hdr_t;

/* h.done counts the header's bytes and the payload's. */
typedef struct {
    _ddp_transport_req_t h;
    _ddp_tcp_hdr_t hdr;      /* sent, or received and then checked */
} _ddp_tcp_req_t;
#define _DDP_TCP_REQ(q) ((_ddp_tcp_req_t *)(void *)(q))

typedef struct _ddp_tcp_conn {
    _ddp_transport_conn_t h; /* peer, sticky failure, free list: the shared isend/irecv/test */
    int fd;
    struct _ddp_tcp *tp;
    _ddp_transport_queue_t sq, rq;
    _ddp_tcp_req_t pool[_DDP_TCP_POOL];
} _ddp_tcp_conn_t;

typedef struct {              /* an accepted socket in its handshake */
    _ddp_transport_pending_t h;   /* stage 0: reading the hello; 1: challenged, reading the answer */
    size_t got;
    _ddp_tcp_hello_t hello;
    _ddp_tcp_answer_t answer;
    unsigned char nonce[_DDP_AUTH_NONCE_BYTES];           /* ours */
    char addr[80];
} _ddp_tcp_pending_t;

typedef struct {              /* our side of a connect in progress */
    int fd, stage;            /* 0 idle (or backing off), 1 connecting, 2 hello sent, 3 done */
    int tries, have_addr;
    size_t got;
    _ddp_tcp_challenge_t ch;
    unsigned char nonce[_DDP_AUTH_NONCE_BYTES];
    int64_t deadline, retry_at;
    struct sockaddr_storage ss;
    socklen_t sl;
    char addr[96];
} _ddp_tcp_dial_t;

typedef struct _ddp_tcp {
    const ddp_transport_ctx_t *ctx;
    int listen_fd, bufsize;
    char addr_str[96];
    _ddp_tcp_pending_t *pending;  /* nranks + _DDP_TRANSPORT_STRANGER_SLOTS entries */
    int npending, pending_cap;
    uint64_t accepted;            /* connections accepted so far: the pending entries' age */
    int64_t last_pump;
    _ddp_transport_ratelimit_t warn;
    _ddp_tcp_conn_t **ready; /* accepted and proven, by peer rank, until accept() takes it */
    _ddp_tcp_dial_t *dial;   /* by peer rank */
} _ddp_tcp_t;

/* The address to listen on: an interface named by DDP_SOCKET_IFNAME, else the source address
 * the kernel would use to reach the master (a UDP connect sends nothing). */
_DDP_PRIVATE ddp_result_t _ddp_tcp_pick_addr(_ddp_tcp_t *tp, struct sockaddr_storage *ss, socklen_t *sl) {
    const ddp_transport_ctx_t *c = tp->ctx;
    const char *spec = c->ifname, *fam = getenv("DDP_SOCKET_FAMILY");
    int want = fam ? (!strcmp(fam, "AF_INET6") ? AF_INET6 : !strcmp(fam, "AF_INET") ? AF_INET : 0) : 0;
    memset(ss, 0, sizeof *ss);
    if (spec && *spec) {
        struct ifaddrs *ifs = NULL, *ifa;
        char seen[256] = "";
        size_t off = 0;
        if (getifaddrs(&ifs) != 0)
            return ddp_transport_fail(c, DDP_ERR_SYSTEM, "tcp: getifaddrs: %s", strerror(errno));
        for (int pass = 0; pass < 2; pass++) {
            for (ifa = ifs; ifa; ifa = ifa->ifa_next) {
                int f;
                if (!ifa->ifa_addr || !(ifa->ifa_flags & IFF_UP)) continue;
                f = ifa->ifa_addr->sa_family;
                if (f != AF_INET && f != AF_INET6) continue;
                if (want ? f != want : (pass == 0 ? f != AF_INET : f != AF_INET6)) continue;
                if (f == AF_INET6 && IN6_IS_ADDR_LINKLOCAL(&((struct sockaddr_in6 *)(void *)ifa->ifa_addr)->sin6_addr)) continue;
                if (pass == 0 && off + strlen(ifa->ifa_name) + 3 < sizeof seen && !strstr(seen, ifa->ifa_name))
                    off += (size_t)snprintf(seen + off, sizeof seen - off, "%s%s", off ? ", " : "", ifa->ifa_name);
                if (!_ddp_transport_match_list(spec, ifa->ifa_name, -1)) continue;
                *sl = f == AF_INET ? sizeof(struct sockaddr_in) : sizeof(struct sockaddr_in6);
                memcpy(ss, ifa->ifa_addr, *sl);
                _DDP_TLOG(c, DDP_LOG_INFO, "tcp: interface %s chosen by DDP_SOCKET_IFNAME=%s", ifa->ifa_name, spec);
                freeifaddrs(ifs);
                return DDP_SUCCESS;
            }
        }
        freeifaddrs(ifs);
        return ddp_transport_fail(c, DDP_ERR_INVALID_ARGUMENT, "tcp: no interface matches "
                                  "DDP_SOCKET_IFNAME=%s (interfaces up: %s)", spec, seen);
    } else {
        struct addrinfo hints, *res = NULL;
        int fd, rc;
        memset(&hints, 0, sizeof hints);
        hints.ai_family = AF_UNSPEC;
        hints.ai_socktype = SOCK_DGRAM;
        rc = getaddrinfo(c->master_addr, "9", &hints, &res);
        if (rc != 0)
            return ddp_transport_fail(c, DDP_ERR_SYSTEM, "tcp: cannot resolve master '%s': %s",
                                      c->master_addr, gai_strerror(rc));
        fd = socket(res->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
        if (fd < 0 || connect(fd, res->ai_addr, res->ai_addrlen) != 0) {
            int e = errno;
            if (fd >= 0) close(fd);
            freeaddrinfo(res);
            return ddp_transport_fail(c, DDP_ERR_SYSTEM, "tcp: no route to master '%s': %s",
                                      c->master_addr, strerror(e));
        }
        freeaddrinfo(res);
        *sl = sizeof *ss;
        getsockname(fd, (struct sockaddr *)ss, sl);
        close(fd);
        return DDP_SUCCESS;
    }
}

_DDP_PRIVATE void _ddp_tcp_tune(_ddp_tcp_t *tp, int fd) {
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (tp->bufsize > 0) {
        setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &tp->bufsize, sizeof tp->bufsize);
        setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &tp->bufsize, sizeof tp->bufsize);
    }
    _ddp_set_nonblock(fd, 1);
}

_DDP_PRIVATE ddp_result_t _ddp_tcp_finalize(void *state);

_DDP_PRIVATE ddp_result_t _ddp_tcp_init(const ddp_transport_ctx_t *c, void **state) {
    _ddp_tcp_t *tp;
    struct sockaddr_storage ss;
    socklen_t sl = 0;
    ddp_result_t r;
    int n = c->nranks, i;
    const char *bs = getenv("DDP_SOCKET_BUFSIZE");
    *state = NULL;
    tp = (_ddp_tcp_t *)ddp_transport_calloc(c, sizeof *tp);
    if (!tp) return ddp_transport_fail(c, DDP_ERR_OUT_OF_MEMORY, "tcp: init");
    tp->ctx = c;
    tp->listen_fd = -1;
    tp->bufsize = bs ? (int)_ddp_parse_size(bs) : 0;
    tp->ready = (_ddp_tcp_conn_t **)ddp_transport_calloc(c, (size_t)n * sizeof *tp->ready);
    tp->dial = (_ddp_tcp_dial_t *)ddp_transport_calloc(c, (size_t)n * sizeof *tp->dial);
    tp->pending_cap = n + _DDP_TRANSPORT_STRANGER_SLOTS;
    tp->pending = (_ddp_tcp_pending_t *)ddp_transport_calloc(c, (size_t)tp->pending_cap * sizeof *tp->pending);
    if (!tp->ready || !tp->dial || !tp->pending) { _ddp_tcp_finalize(tp); return ddp_transport_fail(c, DDP_ERR_OUT_OF_MEMORY, "tcp: init"); }
    for (i = 0; i < n; i++) tp->dial[i].fd = -1;
    if ((r = _ddp_tcp_pick_addr(tp, &ss, &sl)) != DDP_SUCCESS) { _ddp_tcp_finalize(tp); return r; }
    if (ss.ss_family == AF_INET) ((struct sockaddr_in *)&ss)->sin_port = 0;
    else ((struct sockaddr_in6 *)&ss)->sin6_port = 0;
    tp->listen_fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (tp->listen_fd < 0 || bind(tp->listen_fd, (struct sockaddr *)&ss, sl) != 0 ||
        listen(tp->listen_fd, _DDP_TRANSPORT_BACKLOG) != 0) {
        int e = errno;
        char a[96];
        _ddp_sockaddr_str((struct sockaddr *)&ss, a, sizeof a);
        _ddp_tcp_finalize(tp);
        return ddp_transport_fail(c, DDP_ERR_SYSTEM, "tcp: cannot listen on %s: %s", a, strerror(e));
    }
    _ddp_set_nonblock(tp->listen_fd, 1);
    sl = sizeof ss;
    getsockname(tp->listen_fd, (struct sockaddr *)&ss, &sl);
    _ddp_sockaddr_str((struct sockaddr *)&ss, tp->addr_str, sizeof tp->addr_str);
    if ((r = c->publish(c->host, "tcp", &ss, sl)) != DDP_SUCCESS) { _ddp_tcp_finalize(tp); return r; }
    _DDP_TLOG(c, DDP_LOG_INFO, "tcp: listening on %s only (%s)%s", tp->addr_str,
              c->ifname && *c->ifname ? "the interface DDP_SOCKET_IFNAME chose"
                                      : "the address that reaches the master",
              tp->bufsize > 0 ? "; fixed socket buffers" : "; autotuned socket buffers");
    if (!c->key_from_secret && !_ddp_sockaddr_is_loopback((struct sockaddr *)&ss))
        _DDP_TLOG(c, DDP_LOG_WARN, "tcp: listening on %s, a network address, and the job has no secret: "
                  "a peer must prove this communicator's key, but without DDP_JOB_SECRET that key "
                  "is handed out through the rendezvous store, so anyone who can reach %s's store "
                  "port can join these connections; set the same DDP_JOB_SECRET on every rank",
                  tp->addr_str, c->master_addr ? c->master_addr : "the master");
    *state = tp;
    return DDP_SUCCESS;
}

_DDP_PRIVATE int _ddp_tcp_reachable(void *state, int peer) { (void)state; (void)peer; return 1; }

_DDP_PRIVATE ddp_result_t _ddp_tcp_progress(_ddp_transport_conn_t *h);
_DDP_PRIVATE ddp_result_t _ddp_tcp_post(_ddp_transport_conn_t *h, int is_send, void *buf, size_t len,
                                        uint64_t tag, void *mr, void **req);

_DDP_PRIVATE _ddp_tcp_conn_t *_ddp_tcp_new_conn(_ddp_tcp_t *tp, int fd, int peer) {
    _ddp_tcp_conn_t *k = (_ddp_tcp_conn_t *)ddp_transport_calloc(tp->ctx, sizeof *k);
    if (!k) return NULL;
    k->fd = fd;
    k->tp = tp;
    _ddp_transport_conn_init(&k->h, tp->ctx, "tcp", peer, k->pool, sizeof k->pool[0], _DDP_TCP_POOL);
    k->h.post = _ddp_tcp_post;
    k->h.progress = _ddp_tcp_progress;
    _ddp_tcp_tune(tp, fd);
    return k;
}

_DDP_PRIVATE int _ddp_tcp_again(int e) { return e == EAGAIN || e == EWOULDBLOCK || e == EINTR; }

/* A connect attempt failed in a way a burst explains (refused, reset, or closed before the
 * challenge: the listener's backlog overflowed, or it evicted us as idle): try again after a
 * backoff, while attempts and time are left. */
_DDP_PRIVATE ddp_result_t _ddp_tcp_dial_retry(_ddp_tcp_t *tp, _ddp_tcp_dial_t *d, int peer, const char *what) {
    const ddp_transport_ctx_t *c = tp->ctx;
    if (d->fd >= 0) close(d->fd);
    d->fd = -1;
    d->stage = 0;
    d->got = 0;
    if (++d->tries >= _DDP_TCP_CONNECT_TRIES || (d->deadline && _ddp_now_us() >= d->deadline))
        return ddp_transport_fail(c, DDP_ERR_REMOTE, "tcp: connecting to rank %d at %s: %s (%d "
                                  "attempts)", peer, d->addr, what, d->tries);
    d->retry_at = _ddp_now_us() + _ddp_transport_backoff_us(d->tries);
    _DDP_TLOG(c, DDP_LOG_TRACE, "tcp: connecting to rank %d at %s: %s; attempt %d follows", peer,
              d->addr, what, d->tries + 1);
    return DDP_SUCCESS;
}

/* Stage 0 -> 1: a non-blocking connect. */
_DDP_PRIVATE ddp_result_t _ddp_tcp_dial_start(_ddp_tcp_t *tp, _ddp_tcp_dial_t *d, int peer) {
    const ddp_transport_ctx_t *c = tp->ctx;
    d->fd = socket(d->ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (d->fd < 0) return ddp_transport_fail(c, DDP_ERR_SYSTEM, "tcp: socket: %s", strerror(errno));
    _ddp_tcp_tune(tp, d->fd);
    _DDP_TLOG(c, DDP_LOG_TRACE, "tcp: connecting to rank %d at %s", peer, d->addr);
    d->stage = 1;
    if (connect(d->fd, (struct sockaddr *)&d->ss, d->sl) != 0 && errno != EINPROGRESS) {
        int e = errno;
        if (e == ECONNREFUSED || e == ECONNRESET || e == EAGAIN || e == ETIMEDOUT)
            return _ddp_tcp_dial_retry(tp, d, peer, strerror(e));
        return ddp_transport_fail(c, DDP_ERR_SYSTEM, "tcp: connect to rank %d at %s: %s", peer,
                                  d->addr, strerror(e));
    }
    return DDP_SUCCESS;
}

/* Stage 1 -> 2: connected; our hello (it fits an empty socket buffer: one send). */
_DDP_PRIVATE ddp_result_t _ddp_tcp_dial_hello(_ddp_tcp_t *tp, _ddp_tcp_dial_t *d, int peer) {
    const ddp_transport_ctx_t *c = tp->ctx;
    struct pollfd pfd;
    _ddp_tcp_hello_t h;
    int err = 0;
    socklen_t el = sizeof err;
    pfd.fd = d->fd; pfd.events = POLLOUT; pfd.revents = 0;
    if (poll(&pfd, 1, 0) != 1) {
        if (d->deadline && _ddp_now_us() >= d->deadline)
            return ddp_transport_fail(c, DDP_ERR_TIMEOUT, "tcp: connect to rank %d at %s timed out",
                                      peer, d->addr);
        return DDP_SUCCESS;
    }
    getsockopt(d->fd, SOL_SOCKET, SO_ERROR, &err, &el);
    if (err == ECONNREFUSED || err == ECONNRESET || err == EAGAIN || err == ETIMEDOUT)
        return _ddp_tcp_dial_retry(tp, d, peer, strerror(err));
    if (err) return ddp_transport_fail(c, DDP_ERR_SYSTEM, "tcp: connect to rank %d at %s: %s", peer,
                                       d->addr, strerror(err));
    if (!_ddp_transport_auth_ready(c))
        return ddp_transport_fail(c, DDP_ERR_INTERNAL, "tcp: no communicator key to prove to rank %d", peer);
    if (_ddp_auth_nonce(d->nonce) != 0)
        return ddp_transport_fail(c, DDP_ERR_SYSTEM, "tcp: no random bytes for the handshake with rank %d", peer);
    memset(&h, 0, sizeof h);
    h.magic = _DDP_TCP_HELLO_MAGIC; h.version = _DDP_TCP_VERSION; h.comm_id = c->comm_id;
    h.from = c->rank; h.to = peer;
    memcpy(h.nonce, d->nonce, sizeof h.nonce);
    if (send(d->fd, &h, sizeof h, MSG_NOSIGNAL | MSG_DONTWAIT) != (ssize_t)sizeof h)
        return _ddp_tcp_dial_retry(tp, d, peer, "closed before our hello");
    d->stage = 2;
    d->got = 0;
    return DDP_SUCCESS;
}

/* Stage 2 -> 3: the acceptor's challenge; it must prove the key before we prove ours. */
_DDP_PRIVATE ddp_result_t _ddp_tcp_dial_answer(_ddp_tcp_t *tp, _ddp_tcp_dial_t *d, int peer, void **conn) {
    const ddp_transport_ctx_t *c = tp->ctx;
    _ddp_tcp_answer_t a;
    ssize_t n = recv(d->fd, (char *)&d->ch + d->got, sizeof d->ch - d->got, MSG_DONTWAIT);
    if (n > 0) {
        d->got += (size_t)n;
    } else if (n == 0 || !_ddp_tcp_again(errno)) {
        const char *why = n == 0 ? "EOF" : strerror(errno);
        if (d->got == 0 && (n == 0 || errno == ECONNRESET))
            return _ddp_tcp_dial_retry(tp, d, peer, "closed before its challenge");
        return ddp_transport_fail(c, DDP_ERR_REMOTE, "tcp: rank %d refused our connection "
                                  "(handshake closed: %s)", peer, why);
    }
    if (d->got < sizeof d->ch) {
        if (d->deadline && _ddp_now_us() >= d->deadline)
            return ddp_transport_fail(c, DDP_ERR_TIMEOUT, "tcp: rank %d never answered our handshake", peer);
        return DDP_SUCCESS;
    }
    if (d->ch.magic != _DDP_TCP_HELLO_MAGIC || d->ch.status != DDP_SUCCESS)
        return ddp_transport_fail(c, DDP_ERR_MISMATCH, "tcp: rank %d rejected our handshake (status %u)",
                                  peer, d->ch.status);
    if (!_ddp_transport_auth_verify(c, "tcp", c->rank, peer, _DDP_AUTH_SERVER, d->ch.nonce, d->nonce,
                                    d->ch.proof))
        return ddp_transport_fail(c, DDP_ERR_AUTH, "tcp: whoever listens at %s, where rank %d published "
                                  "its address, does not know this communicator's key: it is not "
                                  "rank %d of this job (an impostor, or a stale address); refused",
                                  d->addr, peer, peer);
    memset(&a, 0, sizeof a);
    a.magic = _DDP_TCP_HELLO_MAGIC;
    a.status = DDP_SUCCESS;
    _ddp_transport_auth_proof(c, "tcp", c->rank, peer, _DDP_AUTH_CLIENT, d->ch.nonce, d->nonce, a.proof);
    n = send(d->fd, &a, sizeof a, MSG_NOSIGNAL | MSG_DONTWAIT);
    _ddp_auth_wipe(&a, sizeof a);
    if (n != (ssize_t)sizeof a)
        return ddp_transport_fail(c, DDP_ERR_REMOTE, "tcp: rank %d closed during the handshake", peer);
    *conn = _ddp_tcp_new_conn(tp, d->fd, peer);
    if (!*conn) return ddp_transport_fail(c, DDP_ERR_OUT_OF_MEMORY, "tcp: connection");
    d->fd = -1;
    d->stage = 3;
    return DDP_SUCCESS;
}

_DDP_PRIVATE ddp_result_t _ddp_tcp_connect(void *state, int peer, void **conn) {
    _ddp_tcp_t *tp = (_ddp_tcp_t *)state;
    const ddp_transport_ctx_t *c = tp->ctx;
    _ddp_tcp_dial_t *d = &tp->dial[peer];
    ddp_result_t r;
    *conn = NULL;
    if (!d->have_addr) {
        size_t len = 0;
        r = c->lookup(c->host, "tcp", peer, &d->ss, sizeof d->ss, &len);
        if (r != DDP_SUCCESS) return r;
        d->sl = (socklen_t)len;
        _ddp_sockaddr_str((struct sockaddr *)&d->ss, d->addr, sizeof d->addr);
        d->deadline = _ddp_deadline(c->timeout_ms);
        d->have_addr = 1;
    }
    if (d->stage == 0) {
        if (d->retry_at && _ddp_now_us() < d->retry_at) return DDP_SUCCESS;
        if ((r = _ddp_tcp_dial_start(tp, d, peer)) != DDP_SUCCESS) return r;
    }
    if (d->stage == 1 && (r = _ddp_tcp_dial_hello(tp, d, peer)) != DDP_SUCCESS) return r;
    if (d->stage == 2) return _ddp_tcp_dial_answer(tp, d, peer, conn);
    return DDP_SUCCESS;
}

/* Advances one accepted connection's handshake as far as the bytes that arrived allow: 0 to
 * wait for more, 1 when it is over (its peer is in ready[], or *why says why to drop it), -1
 * when out of memory. Reads exactly what each stage expects, never into the data stream. */
_DDP_PRIVATE int _ddp_tcp_pending_step(_ddp_tcp_t *tp, _ddp_tcp_pending_t *p, const char **why) {
    const ddp_transport_ctx_t *c = tp->ctx;
    ssize_t n;
    *why = NULL;
    if (p->h.stage == 0) {
        _ddp_tcp_hello_t *h = &p->hello;
        _ddp_tcp_challenge_t ch;
        char extra;
        n = recv(p->h.fd, (char *)h + p->got, sizeof *h - p->got, MSG_DONTWAIT);
        if (n > 0) p->got += (size_t)n;
        else if (n == 0) { *why = "closed before its handshake"; return 1; }
        else if (!_ddp_tcp_again(errno)) { *why = strerror(errno); return 1; }
        if (p->got >= 8 && h->magic != _DDP_TCP_HELLO_MAGIC) { *why = "is not a libddp rank (bad magic)"; return 1; }
        if (p->got >= 8 && h->version != _DDP_TCP_VERSION) { *why = "speaks another libddp wire version"; return 1; }
        if (p->got < sizeof *h) {
            if (_ddp_now_us() >= p->h.deadline) { *why = "sent no handshake in time"; return 1; }
            return 0;
        }
        if (h->comm_id != c->comm_id) { *why = "belongs to another communicator or job"; return 1; }
        if (h->to != c->rank || h->from < 0 || h->from >= c->nranks || h->from == c->rank) {
            *why = "names ranks that do not fit this communicator";
            return 1;
        }
        if (tp->ready[h->from]) { *why = "is a second connection from the same rank"; return 1; }
        /* A rank says nothing more until it is challenged. */
        if (recv(p->h.fd, &extra, 1, MSG_PEEK | MSG_DONTWAIT) > 0) {
            *why = "sent more than a hello before being challenged";
            return 1;
        }
        if (!_ddp_transport_auth_ready(c)) { *why = "came before this rank had the communicator's key"; return 1; }
        if (_ddp_auth_nonce(p->nonce) != 0) { *why = "could not be challenged (no random bytes)"; return 1; }
        memset(&ch, 0, sizeof ch);
        ch.magic = _DDP_TCP_HELLO_MAGIC;
        ch.status = DDP_SUCCESS;
        memcpy(ch.nonce, p->nonce, sizeof ch.nonce);
        _ddp_transport_auth_proof(c, "tcp", h->from, c->rank, _DDP_AUTH_SERVER, p->nonce, h->nonce, ch.proof);
        n = send(p->h.fd, &ch, sizeof ch, MSG_NOSIGNAL | MSG_DONTWAIT);
        _ddp_auth_wipe(&ch, sizeof ch);
        if (n != (ssize_t)sizeof ch) { *why = "went away before its challenge"; return 1; }
        p->h.stage = 1;
        p->h.deadline = _ddp_transport_proof_deadline(c, _DDP_TCP_HANDSHAKE_MS);
        p->got = 0;
    }
    n = recv(p->h.fd, (char *)&p->answer + p->got, sizeof p->answer - p->got, MSG_DONTWAIT);
    if (n > 0) p->got += (size_t)n;
    else if (n == 0) { *why = "closed before proving it knows the communicator's key"; return 1; }
    else if (!_ddp_tcp_again(errno)) { *why = strerror(errno); return 1; }
    if (p->got < sizeof p->answer) {
        if (_ddp_now_us() >= p->h.deadline) { *why = "never proved it knows the communicator's key"; return 1; }
        return 0;
    }
    if (p->answer.magic != _DDP_TCP_HELLO_MAGIC || p->answer.status != DDP_SUCCESS ||
        !_ddp_transport_auth_verify(c, "tcp", p->hello.from, c->rank, _DDP_AUTH_CLIENT, p->nonce,
                                    p->hello.nonce, p->answer.proof)) {
        *why = "failed to prove it knows the communicator's key (not a rank of this job, or a "
               "replayed handshake)";
        return 1;
    }
    tp->ready[p->hello.from] = _ddp_tcp_new_conn(tp, p->h.fd, p->hello.from);
    if (!tp->ready[p->hello.from]) return -1;
    _DDP_TLOG(c, DDP_LOG_TRACE, "tcp: accepted rank %d from %s", p->hello.from, p->addr);
    p->h.fd = -1;
    return 1;
}

/* Entry i is over: dropped (why) or handed on; its slot goes to the last entry. */
_DDP_PRIVATE void _ddp_tcp_pending_end(_ddp_tcp_t *tp, int i, const char *why) {
    _ddp_tcp_pending_t *p = &tp->pending[i];
    if (why) {
        char claim[48] = "";
        if (p->h.stage > 0 || p->got >= sizeof p->hello)
            snprintf(claim, sizeof claim, " (claiming to be rank %d)", (int)p->hello.from);
        _ddp_transport_warn_limited(tp->ctx, &tp->warn, "tcp: rank %d dropped a connection from %s%s: "
                                    "it %s", tp->ctx->rank, p->addr, claim, why);
    }
    if (p->h.fd >= 0) close(p->h.fd);
    tp->pending[i] = tp->pending[--tp->npending];
}

/* Makes room in the table: evicts the oldest connection that has not sent its hello (it gets
 * one last look first: a hello that just arrived makes it a peer, not an idle stranger), else
 * the oldest. */
_DDP_PRIVATE ddp_result_t _ddp_tcp_evict(_ddp_tcp_t *tp, const char *reason) {
    int tries;
    for (tries = 0; tries <= tp->pending_cap && tp->npending > 0; tries++) {
        int v = _ddp_transport_pending_victim(tp->pending, sizeof tp->pending[0], tp->npending);
        _ddp_tcp_pending_t *p = &tp->pending[v];
        const char *why = NULL;
        if (p->h.stage == 0) {
            int rc = _ddp_tcp_pending_step(tp, p, &why);
            if (rc < 0) return ddp_transport_fail(tp->ctx, DDP_ERR_OUT_OF_MEMORY, "tcp: connection");
            if (rc > 0) { _ddp_tcp_pending_end(tp, v, why); return DDP_SUCCESS; }
            if (p->h.stage > 0) continue;   /* it spoke: look for another */
        }
        _ddp_transport_warn_limited(tp->ctx, &tp->warn, "tcp: rank %d evicted a connection from %s "
                                    "that %s (%s; %d handshakes pending)", tp->ctx->rank, p->addr,
                                    p->h.stage == 0 ? "sent no hello yet" : "was slow to prove its key",
                                    reason, tp->npending);
        close(p->h.fd);
        p->h.fd = -1;
        tp->pending[v] = tp->pending[--tp->npending];
        return DDP_SUCCESS;
    }
    return DDP_SUCCESS;
}

/* Accepts whatever has arrived and advances every handshake; strangers are dropped. */
_DDP_PRIVATE ddp_result_t _ddp_tcp_pump_accept(_ddp_tcp_t *tp) {
    int i, budget = tp->pending_cap + _DDP_TRANSPORT_BACKLOG;   /* a steady flood cannot pin us here */
    ddp_result_t r;
    while (budget-- > 0) {
        struct sockaddr_storage ss;
        socklen_t sl = sizeof ss;
        _ddp_tcp_pending_t *p;
        const char *why;
        int rc, fd = _ddp_accept4(tp->listen_fd, (struct sockaddr *)&ss, &sl, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED) continue;
            if ((errno == EMFILE || errno == ENFILE) && tp->npending > 0) {
                if ((r = _ddp_tcp_evict(tp, "out of file descriptors")) != DDP_SUCCESS) return r;
                continue;
            }
            break;   /* EAGAIN: nobody waits; else try again at the next poll */
        }
        if (tp->npending == tp->pending_cap && (r = _ddp_tcp_evict(tp, "handshake table full")) != DDP_SUCCESS) {
            close(fd);
            return r;
        }
        p = &tp->pending[tp->npending++];
        memset(p, 0, sizeof *p);
        p->h.fd = fd;
        p->h.seq = ++tp->accepted;
        p->h.deadline = _ddp_now_us() + (int64_t)_DDP_TCP_HANDSHAKE_MS * 1000;
        _ddp_sockaddr_str((struct sockaddr *)&ss, p->addr, sizeof p->addr);
        /* A peer's hello is usually here already: read it now, before newer connections come. */
        rc = _ddp_tcp_pending_step(tp, p, &why);
        if (rc < 0) return ddp_transport_fail(tp->ctx, DDP_ERR_OUT_OF_MEMORY, "tcp: connection");
        if (rc > 0) _ddp_tcp_pending_end(tp, tp->npending - 1, why);
    }
    for (i = 0; i < tp->npending; i++) {
        const char *why;
        int rc = _ddp_tcp_pending_step(tp, &tp->pending[i], &why);
        if (rc < 0) return ddp_transport_fail(tp->ctx, DDP_ERR_OUT_OF_MEMORY, "tcp: connection");
        if (rc > 0) _ddp_tcp_pending_end(tp, i--, why);
    }
    return DDP_SUCCESS;
}

_DDP_PRIVATE ddp_result_t _ddp_tcp_accept(void *state, int peer, void **conn) {
    _ddp_tcp_t *tp = (_ddp_tcp_t *)state;
    ddp_result_t r;
    *conn = NULL;
    if (!tp->ready[peer] && _ddp_transport_pump_due(&tp->last_pump) &&
        (r = _ddp_tcp_pump_accept(tp)) != DDP_SUCCESS) return r;
    if (tp->ready[peer]) { *conn = tp->ready[peer]; tp->ready[peer] = NULL; }
    return DDP_SUCCESS;
}

/* The connection's first failure is recorded and sticks: every later call on it returns it. Its
 * peer is blamed (a shrink asks whether it died). */
#define _DDP_TCP_BROKEN(k, ...) (_ddp_transport_blame((k)->tp->ctx, (k)->h.peer), \
                                 _ddp_transport_conn_fail((k)->tp->ctx, &(k)->h.err, __VA_ARGS__))

/* Sends: header + payload of several queued messages in one writev, as many bytes as the socket
 * takes. */
_DDP_PRIVATE ddp_result_t _ddp_tcp_send_some(_ddp_tcp_conn_t *k) {
    while (k->sq.head) {
        struct iovec iov[16];
        struct msghdr mh;
        int n = 0;
        ssize_t w;
        _ddp_transport_req_t *q;
        for (q = k->sq.head; q && n + 2 <= 16; q = q->next) {
            const size_t hs = sizeof(_ddp_tcp_hdr_t), pd = q->done > hs ? q->done - hs : 0;
            if (q->done < hs) {
                iov[n].iov_base = (char *)&_DDP_TCP_REQ(q)->hdr + q->done;
                iov[n++].iov_len = hs - q->done;
            }
            if (pd < q->len) {
                iov[n].iov_base = q->buf + pd;
                iov[n++].iov_len = q->len - pd;
            }
        }
        memset(&mh, 0, sizeof mh);
        mh.msg_iov = iov;
        mh.msg_iovlen = (size_t)n;
        w = sendmsg(k->fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) break;
            return _DDP_TCP_BROKEN(k, DDP_ERR_REMOTE, "tcp: sending to rank %d failed: %s (rank %d "
                                   "exited or closed the connection)", k->h.peer, strerror(errno), k->h.peer);
        }
        while (w > 0 && (q = k->sq.head) != NULL) {
            size_t left = sizeof(_ddp_tcp_hdr_t) + q->len - q->done;
            size_t take = (size_t)w < left ? (size_t)w : left;
            q->done += take;
            w -= (ssize_t)take;
            if (q->done == sizeof(_ddp_tcp_hdr_t) + q->len) {
                q->complete = 1;
                _ddp_transport_queue_pop(&k->sq);
            }
        }
        if (k->sq.head) break; /* the socket buffer is full */
    }
    return DDP_SUCCESS;
}

/* A received header, as soon as it is complete: the message the receive was posted for? */
_DDP_PRIVATE ddp_result_t _ddp_tcp_check_hdr(_ddp_tcp_conn_t *k, const _ddp_tcp_req_t *q) {
    if (q->hdr.magic != _DDP_TCP_MSG_MAGIC)
        return _DDP_TCP_BROKEN(k, DDP_ERR_MISMATCH, "tcp: malformed message from rank "
                               "%d (bad magic %08x)", k->h.peer, q->hdr.magic);
    if (q->hdr.tag != q->h.tag || q->hdr.len != q->h.len)
        return _ddp_transport_conn_mismatch(&k->h, q->hdr.tag, q->hdr.len, &q->h);
    return DDP_SUCCESS;
}

/* Receives: header and payload of the head request in one readv; the payload lands in the
 * user's buffer directly. */
_DDP_PRIVATE ddp_result_t _ddp_tcp_recv_some(_ddp_tcp_conn_t *k) {
    const size_t hs = sizeof(_ddp_tcp_hdr_t);
    while (k->rq.head) {
        _ddp_tcp_req_t *q = _DDP_TCP_REQ(k->rq.head);
        struct iovec iov[2];
        int n = 0, had_hdr = q->h.done >= hs;
        ssize_t got;
        if (!had_hdr) {
            iov[n].iov_base = (char *)&q->hdr + q->h.done;
            iov[n++].iov_len = hs - q->h.done;
            if (q->h.len) { iov[n].iov_base = q->h.buf; iov[n++].iov_len = q->h.len; }
        } else {
            iov[n].iov_base = q->h.buf + (q->h.done - hs);
            iov[n++].iov_len = q->h.len - (q->h.done - hs);
        }
        got = readv(k->fd, iov, n);
        if (got == 0)
            return _DDP_TCP_BROKEN(k, DDP_ERR_REMOTE, "tcp: rank %d closed the connection (it "
                                   "exited, crashed or failed)", k->h.peer);
        if (got < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) break;
            return _DDP_TCP_BROKEN(k, DDP_ERR_REMOTE, "tcp: receiving from rank %d failed: %s",
                                   k->h.peer, strerror(errno));
        }
        q->h.done += (size_t)got;
        if (!had_hdr && q->h.done >= hs) {
            ddp_result_t r = _ddp_tcp_check_hdr(k, q);
            if (r != DDP_SUCCESS) return r;
        }
        if (q->h.done < hs + q->h.len) break;
        q->h.complete = 1;
        _ddp_transport_queue_pop(&k->rq);
    }
    return DDP_SUCCESS;
}

/* Moves as many bytes as the socket takes, both directions. Never blocks. */
_DDP_PRIVATE ddp_result_t _ddp_tcp_progress(_ddp_transport_conn_t *h) {
    _ddp_tcp_conn_t *k = (_ddp_tcp_conn_t *)(void *)h;
    ddp_result_t r;
    if (k->h.err != DDP_SUCCESS) return k->h.err;
    if ((r = _ddp_tcp_send_some(k)) != DDP_SUCCESS) return r;
    return _ddp_tcp_recv_some(k);
}

_DDP_PRIVATE ddp_result_t _ddp_tcp_post(_ddp_transport_conn_t *h, int is_send, void *buf, size_t len,
                                        uint64_t tag, void *mr, void **req) {
    _ddp_tcp_conn_t *k = (_ddp_tcp_conn_t *)(void *)h;
    _ddp_transport_req_t *t;
    _ddp_tcp_req_t *q;
    ddp_result_t r = _ddp_transport_req_take(h, is_send, buf, len, tag, &t);
    (void)mr;
    if (r != DDP_SUCCESS) return r;
    q = _DDP_TCP_REQ(t);
    if (is_send) {
        q->hdr.magic = _DDP_TCP_MSG_MAGIC;
        q->hdr.zero = 0;
        q->hdr.tag = tag;
        q->hdr.len = len;
    } else {
        memset(&q->hdr, 0, sizeof q->hdr);
    }
    _ddp_transport_queue_push(is_send ? &k->sq : &k->rq, t);
    *req = q;
    return DDP_SUCCESS;
}

_DDP_PRIVATE ddp_result_t _ddp_tcp_wait(void *state, void *const *conns, int n, int timeout_ms) {
    struct pollfd pfd[8];
    int i, m = 0;
    (void)state;
    for (i = 0; i < n && m < 8; i++) {
        _ddp_tcp_conn_t *k = (_ddp_tcp_conn_t *)conns[i];
        short ev = (short)((k->rq.head ? POLLIN : 0) | (k->sq.head ? POLLOUT : 0));
        int j, dup = 0;
        if (!ev || k->h.err != DDP_SUCCESS) continue;
        for (j = 0; j < m; j++) if (pfd[j].fd == k->fd) { pfd[j].events |= ev; dup = 1; }
        if (dup) continue;
        pfd[m].fd = k->fd; pfd[m].events = ev; pfd[m].revents = 0;
        m++;
    }
    if (m == 0) return DDP_SUCCESS;
    if (poll(pfd, (nfds_t)m, timeout_ms) < 0 && errno != EINTR)
        return ddp_transport_fail(((_ddp_tcp_t *)state)->ctx, DDP_ERR_SYSTEM, "tcp: poll: %s", strerror(errno));
    return DDP_SUCCESS;
}

_DDP_PRIVATE ddp_result_t _ddp_tcp_close(void *conn) {
    _ddp_tcp_conn_t *k = (_ddp_tcp_conn_t *)conn;
    if (!k) return DDP_SUCCESS;
    if (k->fd >= 0) close(k->fd);
    ddp_transport_free(k->tp->ctx, k);
    return DDP_SUCCESS;
}

_DDP_PRIVATE ddp_result_t _ddp_tcp_finalize(void *state) {
    _ddp_tcp_t *tp = (_ddp_tcp_t *)state;
    int i, n;
    if (!tp) return DDP_SUCCESS;
    n = tp->ctx->nranks;
    if (tp->listen_fd >= 0) close(tp->listen_fd);
    for (i = 0; tp->pending && i < tp->npending; i++) if (tp->pending[i].h.fd >= 0) close(tp->pending[i].h.fd);
    ddp_transport_free(tp->ctx, tp->pending);
    for (i = 0; tp->ready && i < n; i++) _ddp_tcp_close(tp->ready[i]);
    for (i = 0; tp->dial && i < n; i++) if (tp->dial[i].fd >= 0) close(tp->dial[i].fd);
    ddp_transport_free(tp->ctx, tp->ready);
    ddp_transport_free(tp->ctx, tp->dial);
    ddp_transport_free(tp->ctx, tp);
    return DDP_SUCCESS;
}

static const ddp_transport_t _ddp_tcp_transport = {
    DDP_TRANSPORT_VERSION, "tcp", 10,
    _ddp_tcp_init, _ddp_tcp_reachable, _ddp_tcp_connect, _ddp_tcp_accept,
    NULL, NULL, _ddp_transport_isend, _ddp_transport_irecv, _ddp_transport_test, _ddp_tcp_wait,
    _ddp_tcp_close, _ddp_tcp_finalize, NULL, NULL, NULL,
};

DDP_API const ddp_transport_t *ddp_transport_tcp(void) { return &_ddp_tcp_transport; }

_DDP_TRANSPORT_CONSTRUCTOR(_ddp_tcp_register) { ddp_transport_register(&_ddp_tcp_transport); }

#endif /* DDP_TCP implementation */
