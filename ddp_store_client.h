/* SPDX-License-Identifier: MIT (see LICENSE) */
/* ddp_store_client.h — libddp's own store client, private: the client side of the handshake
 * (the server's challenge, our proof, the server's proof: ddp_store_core.h has the wire), one
 * request/response round trip (_ddp_store_rpc), and the requests as the client interface
 * _ddp_store_native that ddp_store_open's handles use. The c10d client (ddp_store_c10d.h) is
 * the other implementation of the same interface.
 * Depends on ddp_store_core.h. Built by DDP_IMPLEMENTATION (or DDP_STORE_CLIENT_IMPLEMENTATION).
 */
#if defined(DDP_IMPLEMENTATION) && !defined(DDP_STORE_CLIENT_IMPLEMENTATION)
#define DDP_STORE_CLIENT_IMPLEMENTATION
#endif
#if defined(DDP_STORE_CLIENT_IMPLEMENTATION) && !defined(DDP_STORE_CORE_IMPLEMENTATION)
#define DDP_STORE_CORE_IMPLEMENTATION
#endif
#include "ddp_store_core.h"

#if defined(DDP_STORE_CLIENT_IMPLEMENTATION) && !defined(DDP_STORE_CLIENT_IMPL_INCLUDED)
#define DDP_STORE_CLIENT_IMPL_INCLUDED
#ifndef DDP_STORE_CORE_IMPL_INCLUDED
#error "libddp: ddp_store_client.h's implementation needs ddp_store_core.h's (define DDP_IMPLEMENTATION)"
#endif

/* ---------------------------------------------------------------- the client's handshake
 * Two pure steps (no socket: the fuzzers call them on arbitrary bytes), _DDP_HS_* results. */
enum { _DDP_HS_OK = 0, _DDP_HS_NOT_STORE, _DDP_HS_PROTO, _DDP_HS_NEED_SECRET, _DDP_HS_NO_SECRET,
       _DDP_HS_REFUSED, _DDP_HS_BAD_PROOF, _DDP_HS_MALFORMED };

/* Step 1: the server's challenge (n bytes) -> the HELLO to send (*msglen bytes into msg, which
 * holds _DDP_STORE_HELLO_BYTES) and the server's nonce. */
_DDP_PRIVATE int _ddp_store_hs_hello(const unsigned char *key, size_t keylen, const void *chal, size_t n,
                                     const unsigned char nonce_c[_DDP_AUTH_NONCE_BYTES],
                                     unsigned char *msg, size_t *msglen,
                                     unsigned char nonce_s[_DDP_AUTH_NONCE_BYTES]) {
    _ddp_store_chal_t ch;
    _ddp_store_req_t rq;
    *msglen = 0;
    if (n != sizeof ch) return _DDP_HS_MALFORMED;
    memcpy(&ch, chal, sizeof ch);
    if (ch.magic != _DDP_STORE_MAGIC) return _DDP_HS_NOT_STORE;
    if (ch.proto != _DDP_STORE_PROTO) return _DDP_HS_PROTO;
    if ((ch.flags & _DDP_ST_CHAL_SECRET) && !keylen) return _DDP_HS_NEED_SECRET;
    if (!(ch.flags & _DDP_ST_CHAL_SECRET) && keylen) return _DDP_HS_NO_SECRET;
    memcpy(nonce_s, ch.nonce, _DDP_AUTH_NONCE_BYTES);
    memset(&rq, 0, sizeof rq);
    rq.magic = _DDP_STORE_MAGIC;
    rq.op = _DDP_ST_HELLO;
    rq.v1len = _DDP_AUTH_NONCE_BYTES + (keylen ? _DDP_AUTH_PROOF_BYTES : 0u);
    rq.flags = keylen ? _DDP_ST_HELLO_PROOF : 0u;
    rq.arg = _DDP_STORE_PROTO;
    memcpy(msg, &rq, sizeof rq);
    memcpy(msg + sizeof rq, nonce_c, _DDP_AUTH_NONCE_BYTES);
    if (keylen)
        _ddp_auth_proof(key, keylen, _DDP_AUTH_CLIENT, _DDP_STORE_LABEL, nonce_s, nonce_c,
                        msg + sizeof rq + _DDP_AUTH_NONCE_BYTES);
    *msglen = sizeof rq + rq.v1len;
    return _DDP_HS_OK;
}

/* Step 2: the answer to HELLO (header, then the vlen bytes of value that were read). */
_DDP_PRIVATE int _ddp_store_hs_welcome(const unsigned char *key, size_t keylen,
                                       const unsigned char nonce_s[_DDP_AUTH_NONCE_BYTES],
                                       const unsigned char nonce_c[_DDP_AUTH_NONCE_BYTES],
                                       const void *resp, size_t n, const unsigned char *val,
                                       size_t vlen) {
    _ddp_store_resp_t r;
    if (n != sizeof r) return _DDP_HS_MALFORMED;
    memcpy(&r, resp, sizeof r);
    if (r.magic != _DDP_STORE_MAGIC) return _DDP_HS_NOT_STORE;
    if (r.status == DDP_ERR_AUTH) return _DDP_HS_REFUSED;
    if (r.status == DDP_ERR_MISMATCH) return _DDP_HS_PROTO;
    if (r.status != DDP_SUCCESS || r.vlen != vlen) return _DDP_HS_MALFORMED;
    if (!keylen) return vlen == 0 ? _DDP_HS_OK : _DDP_HS_MALFORMED;
    if (vlen != _DDP_AUTH_PROOF_BYTES ||
        !_ddp_auth_verify(key, keylen, _DDP_AUTH_SERVER, _DDP_STORE_LABEL, nonce_s, nonce_c, val))
        return _DDP_HS_BAD_PROOF;
    return _DDP_HS_OK;
}

_DDP_PRIVATE ddp_result_t _ddp_store_hs_error(ddp_store_t *s, int hs) {
    switch (hs) {
    case _DDP_HS_NOT_STORE:
        return _ddp_store_err(s, DDP_ERR_MISMATCH, "rendezvous: %s:%d is not a libddp store (another "
                              "service on MASTER_PORT?)", s->host, s->port);
    case _DDP_HS_PROTO:
        return _ddp_store_err(s, DDP_ERR_MISMATCH, "rendezvous: master %s:%d speaks another store "
                              "protocol version (mixed libddp versions?)", s->host, s->port);
    case _DDP_HS_NEED_SECRET:
        return _ddp_store_err(s, DDP_ERR_AUTH, "rendezvous: master %s:%d requires a job secret and "
                              "this rank has none (set DDP_JOB_SECRET the same on every rank)",
                              s->host, s->port);
    case _DDP_HS_NO_SECRET:
        return _ddp_store_err(s, DDP_ERR_AUTH, "rendezvous: master %s:%d asks for no job secret but "
                              "this rank has one: not talking to it (DDP_JOB_SECRET set on some "
                              "ranks only, or not the real master)", s->host, s->port);
    case _DDP_HS_REFUSED:
        return _ddp_store_err(s, DDP_ERR_AUTH, "rendezvous: master %s:%d refused our job secret "
                              "(DDP_JOB_SECRET differs between ranks?)", s->host, s->port);
    case _DDP_HS_BAD_PROOF:
        return _ddp_store_err(s, DDP_ERR_AUTH, "rendezvous: master %s:%d could not prove it knows "
                              "the job secret: not talking to it (not the real master, or "
                              "DDP_JOB_SECRET differs between ranks)", s->host, s->port);
    default:
        return _ddp_store_err(s, DDP_ERR_MISMATCH, "rendezvous: master %s:%d sent a malformed "
                              "handshake", s->host, s->port);
    }
}

/* How long a fresh connection waits for the server's challenge, which a libddp server sends as
 * it accepts: half the handshake bound (at least 2 s: a loaded server may take a while to reach
 * its listen queue's tail), doubling with each connection of this connect that got none, up to
 * the bound. A connection the client sees as made may not
 * exist on the server: when the listen queue is full, the kernel answers SYNs with SYN cookies
 * and drops the final ACK of a connection it cannot queue; the client, which speaks second,
 * would then wait for its challenge until the timeout, silently. It connects again instead. */
_DDP_PRIVATE int64_t _ddp_store_chal_deadline(const ddp_store_t *s, int64_t deadline) {
    int64_t ms = s->handshake_ms / 2, d;
    int i;
    if (ms < 2 * _DDP_STORE_HANDSHAKE_MIN_MS) ms = 2 * _DDP_STORE_HANDSHAKE_MIN_MS;
    for (i = 0; i < s->chal_misses && ms < s->handshake_ms; i++) ms *= 2;
    if (ms > s->handshake_ms) ms = s->handshake_ms;
    d = _ddp_now_us() + ms * 1000;
    return deadline && deadline < d ? deadline : d;
}

/* Receives the challenge before chal_deadline, saying so when a note of the connect falls due
 * meanwhile (the connection is kept: it may be next in a long queue). 0 or -errno. */
_DDP_PRIVATE int _ddp_store_recv_challenge(ddp_store_t *s, int fd, void *buf, size_t len, int64_t chal_deadline) {
    const int64_t t0 = _ddp_now_us();
    size_t got = 0;
    while (got < len) {
        ssize_t n = recv(fd, (char *)buf + got, len - got, MSG_DONTWAIT);
        if (n > 0) { got += (size_t)n; continue; }
        if (n == 0) return -ECONNRESET;
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
            struct pollfd pfd;
            const int64_t note_us = s->connect_t0_us + s->connect_note_ms * 1000;
            int ms = _ddp_ms_left(chal_deadline);
            if (ms == 0) return -ETIMEDOUT;
            if (s->connect_t0_us && note_us > _ddp_now_us() && (note_us - _ddp_now_us()) / 1000 + 1 < ms)
                ms = (int)((note_us - _ddp_now_us()) / 1000 + 1);
            pfd.fd = fd; pfd.events = POLLIN; pfd.revents = 0;
            if (poll(&pfd, 1, ms) < 0 && errno != EINTR) return -errno;
            if (s->connect_t0_us) {
                char why[320];
                snprintf(why, sizeof why, "connected to %.120s:%d, but no challenge has come in %d ms (a "
                         "connection the server's full listen queue dropped, or a stopped or overloaded "
                         "server); still waiting on it", s->host, s->port, (int)((_ddp_now_us() - t0) / 1000));
                _ddp_store_connect_note(s, why);
            }
            continue;
        }
        return -errno;
    }
    return 0;
}

/* Receives exactly len bytes that the server has yet to send (the answer to our hello): polls
 * first, as reading first would find nothing. 0 or -errno (-ECONNRESET on EOF). */
_DDP_PRIVATE int _ddp_store_recv_answer(int fd, void *buf, size_t len, int64_t deadline) {
    char *p = (char *)buf;
    while (len) {
        struct pollfd pfd;
        ssize_t n;
        int ms = _ddp_ms_left(deadline);
        if (ms == 0) return -ETIMEDOUT;
        pfd.fd = fd; pfd.events = POLLIN; pfd.revents = 0;
        if (poll(&pfd, 1, ms) < 0 && errno != EINTR) return -errno;
        if (!pfd.revents) continue;
        n = recv(fd, p, len, MSG_DONTWAIT);
        if (n == 0) return -ECONNRESET;
        if (n < 0) {
            if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
            return -errno;
        }
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

/* The handshake on a fresh connection. *retry = 1 when the connection was lost during it (a
 * master out of descriptors, or flooded, drops some), or brought no challenge in time (see
 * above): then the caller connects again. */
_DDP_PRIVATE ddp_result_t _ddp_store_handshake(ddp_store_t *s, int fd, int64_t deadline, int *retry) {
    unsigned char chal[sizeof(_ddp_store_chal_t)], msg[_DDP_STORE_HELLO_BYTES];
    unsigned char ns[_DDP_AUTH_NONCE_BYTES], nc[_DDP_AUTH_NONCE_BYTES], val[_DDP_AUTH_PROOF_BYTES];
    _ddp_store_resp_t resp;
    size_t msglen = 0, vlen = 0;
    int rc, hs;
    const int64_t t0 = _ddp_now_us(), chal_deadline = _ddp_store_chal_deadline(s, deadline);
    *retry = 0;
    if ((rc = _ddp_auth_nonce(nc)) != 0)
        return _ddp_store_err(s, DDP_ERR_SYSTEM, "rendezvous: no random nonce for the handshake "
                              "(getrandom and /dev/urandom failed: %s)", strerror(-rc));
    rc = _ddp_store_recv_challenge(s, fd, chal, sizeof chal, chal_deadline);
    if (rc == -ETIMEDOUT && chal_deadline != deadline) {
        s->chal_misses++;
        *retry = 1;
        snprintf(s->last_error, sizeof s->last_error, "connected to %.120s:%d, but no challenge came within "
                 "%d ms (the server's listen queue overflowed and dropped a connection made by a SYN "
                 "cookie: see ListenOverflows and SyncookiesSent in /proc/net/netstat on its host; or "
                 "the server is stopped or overloaded); connecting again", s->host, s->port,
                 (int)((_ddp_now_us() - t0) / 1000));
        return DDP_ERR_TIMEOUT;
    }
    if (rc == 0) {
        _ddp_store_chal_t ch;
        memcpy(&ch, chal, sizeof ch);
        /* The key exists once the salt is known; a secret without one yet still says "I have
         * a secret" to hs_hello, which refuses a master that asks for none. */
        if (ch.magic == _DDP_STORE_MAGIC && ch.proto != _DDP_STORE_PROTO)
            return _ddp_store_err(s, DDP_ERR_MISMATCH, "rendezvous: master %s:%d speaks store protocol "
                                  "version %u, this rank %u (mixed libddp versions: run one libddp "
                                  "everywhere)", s->host, s->port, ch.proto, _DDP_STORE_PROTO);
        if (ch.magic == _DDP_STORE_MAGIC && (ch.flags & _DDP_ST_CHAL_SECRET))
            _ddp_store_key_for(s, ch.salt);
        hs = _ddp_store_hs_hello(s->key, s->secret[0] ? sizeof s->key : 0, chal, sizeof chal, nc, msg,
                                 &msglen, ns);
        if (hs != _DDP_HS_OK) return _ddp_store_hs_error(s, hs);
        rc = _ddp_send_all(fd, msg, msglen, deadline);
    }
    if (rc == 0) rc = _ddp_store_recv_answer(fd, &resp, sizeof resp, deadline);
    if (rc == 0 && resp.magic == _DDP_STORE_MAGIC && resp.vlen <= sizeof val) {
        vlen = resp.vlen;
        if (vlen) rc = _ddp_recv_all(fd, val, vlen, deadline);
    }
    if (rc == 0) {
        hs = _ddp_store_hs_welcome(s->key, s->keylen, ns, nc, &resp, sizeof resp, val, vlen);
        return hs == _DDP_HS_OK ? DDP_SUCCESS : _ddp_store_hs_error(s, hs);
    }
    if (rc == -ETIMEDOUT)
        return _ddp_store_err(s, DDP_ERR_TIMEOUT, "rendezvous: rank 0's store at %s:%d accepted the "
                              "connection but did not answer the handshake (waited %d ms, timeout %d "
                              "ms): rank 0 is stopped, hung or overloaded, or out of descriptors (its "
                              "log says so), or this port is not a libddp store of this version",
                              s->host, s->port, (int)((_ddp_now_us() - t0) / 1000), s->timeout_ms);
    *retry = 1;
    snprintf(s->last_error, sizeof s->last_error, "connection to %s:%d lost during the handshake: %s "
             "(a store out of descriptors or flooded drops what it cannot serve: see rank 0's log)",
             s->host, s->port, strerror(-rc));
    return DDP_ERR_REMOTE;
}

/* ---------------------------------------------------------------- one round trip
 * A request of libddp's protocol: what _ddp_store_rpc sends, and where the answer's value goes
 * (up to cap bytes into out; the rest is read and dropped). Zero-initialised = no values, the
 * store's timeout. */
typedef struct {
    uint32_t op, flags;       /* _DDP_ST_*, and its flags (WAIT: _DDP_ST_WAIT_ANY) */
    const char *key;          /* klen bytes; a WAIT's keys NUL-separated */
    size_t klen;
    const void *v1, *v2;      /* SET: the value; CAS: expected, desired */
    size_t v1len, v2len;
    int64_t arg;              /* ADD: the delta */
    int timeout_ms;           /* 0: the store's */
    void *out;                /* the answer's value */
    size_t cap;
} _ddp_store_call_t;

_DDP_PRIVATE _ddp_store_call_t _ddp_store_call(uint32_t op, const char *key) {
    _ddp_store_call_t q;
    memset(&q, 0, sizeof q);
    q.op = op;
    q.key = key;
    q.klen = strlen(key);
    return q;
}

/* Receives exactly n bytes of answers before the deadline, through the handle's read-ahead
 * (s->rx): one recv takes every answer that has arrived. It polls before it reads (an answer
 * is awaited: reading first would mostly find nothing). 0, -ECONNRESET on EOF, or -errno. */
_DDP_PRIVATE int _ddp_store_rx_read(ddp_store_t *s, void *dst, size_t n, int64_t deadline) {
    unsigned char *p = (unsigned char *)dst;
    while (n) {
        struct pollfd pfd;
        ssize_t got;
        int ms, direct;
        if (s->rx_off < s->rx_len) {
            size_t k = s->rx_len - s->rx_off < n ? s->rx_len - s->rx_off : n;
            memcpy(p, s->rx + s->rx_off, k);
            s->rx_off += k; p += k; n -= k;
            continue;
        }
        s->rx_off = s->rx_len = 0;
        if ((ms = _ddp_ms_left(deadline)) == 0) return -ETIMEDOUT;
        pfd.fd = s->fd; pfd.events = POLLIN; pfd.revents = 0;
        if (poll(&pfd, 1, ms) < 0 && errno != EINTR) return -errno;
        if (!pfd.revents) continue;
        direct = n >= sizeof s->rx;               /* a big value goes straight to its place */
        got = recv(s->fd, direct ? (void *)p : (void *)s->rx, direct ? n : sizeof s->rx, MSG_DONTWAIT);
        if (got == 0) return -ECONNRESET;
        if (got < 0) {
            if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
            return -errno;
        }
        if (direct) { p += got; n -= (size_t)got; }
        else s->rx_len = (size_t)got;
    }
    return 0;
}

/* Reads the answer: its header into *resp, its value into q->out (as far as q->cap). */
_DDP_PRIVATE int _ddp_store_rpc_recv(ddp_store_t *s, const _ddp_store_call_t *q, _ddp_store_resp_t *resp,
                                     int64_t deadline) {
    int rc = _ddp_store_rx_read(s, resp, sizeof *resp, deadline);
    if (rc == 0 && resp->magic != _DDP_STORE_MAGIC) rc = -EPROTO;
    if (rc == 0 && resp->vlen) {
        size_t take = resp->vlen < q->cap ? resp->vlen : q->cap;
        if (take) rc = _ddp_store_rx_read(s, q->out, take, deadline);
        while (rc == 0 && take < resp->vlen) {
            char sink[4096];
            size_t n = resp->vlen - take < sizeof sink ? resp->vlen - take : sizeof sink;
            rc = _ddp_store_rx_read(s, sink, n, deadline);
            take += n;
        }
    }
    return rc;
}

/* A round trip that broke (rc: -errno) for request q: the stream is out of step, so it is
 * dropped (the next call reconnects); says why. */
_DDP_PRIVATE ddp_result_t _ddp_store_rpc_failed(ddp_store_t *s, const _ddp_store_call_t *q, int rc, int64_t t0) {
    _ddp_store_hangup(s);
    if (rc == -ETIMEDOUT && q->op == _DDP_ST_WAIT) {
        /* The server parks a wait until its keys exist: no answer is the answer "not yet",
         * the caller's to judge (the rendezvous waits in slices and says who is missing). */
        snprintf(s->last_error, sizeof s->last_error, "waited %d ms at the store %s:%d: key '%.*s' "
                 "not set yet", (int)((_ddp_now_us() - t0) / 1000), s->host, s->port,
                 (int)(q->klen > 200 ? 200 : q->klen), q->key);
        _ddp_store_log(s, DDP_LOG_INFO, "store: %s", s->last_error);
        return DDP_ERR_TIMEOUT;
    }
    if (rc == -ETIMEDOUT)
        return _ddp_store_err(s, DDP_ERR_TIMEOUT, "%s%s at %s:%d did not answer within %d ms (key "
                              "'%.*s')", s->hosted_by[0] ? s->hosted_by : "rank 0",
                              s->hosted_by[0] && strncmp(s->hosted_by, "rank ", 5) ? ": the store" : "'s store",
                              s->host, s->port, (int)((_ddp_now_us() - t0) / 1000),
                              (int)(q->klen > 200 ? 200 : q->klen), q->key);
    if (!strncmp(s->hosted_by, "rank ", 5)) {
        /* A rank's store: one look says whether it is gone (refused) or the stream broke
         * (briefer while reporting a failure: that must not wait on a dead host). */
        char why[256];
        const int fd = _ddp_store_dial(s, _ddp_deadline(s->quick ? 100 : 1000), why, sizeof why);
        if (fd >= 0) close(fd);
        if (fd == -ECONNREFUSED)
            return _ddp_store_err(s, DDP_ERR_REMOTE, "the store at %s:%d was hosted by %s, which is "
                                  "gone (the connection was lost: %s; a new one is refused): %s "
                                  "exited or was killed, and the store went with it; launched "
                                  "without ddprun (mpirun, srun), a job cannot outlive its %s "
                                  "(ddprun keeps the store in the launcher)", s->host, s->port,
                                  s->hosted_by, strerror(-rc), s->hosted_by, s->hosted_by);
    }
    if (s->hosted_by[0])
        return _ddp_store_err(s, DDP_ERR_REMOTE, "lost the connection to the store at %s:%d, hosted "
                              "by %s: %s", s->host, s->port, s->hosted_by, strerror(-rc));
    return _ddp_store_err(s, DDP_ERR_REMOTE, "lost the connection to master %s:%d (rank 0's "
                          "store): %s", s->host, s->port, strerror(-rc));
}

/* A window of pipelined requests: at most this many, and this many bytes of them (one request
 * may be bigger alone). The server reads a window whole, so a client that sends one and then
 * reads its answers never waits on a server that waits on it. */
#define _DDP_STORE_WINDOW_OPS 64
#define _DDP_STORE_WINDOW_BYTES 16384

/* n requests in one write, then their n answers in order: one round trip for all of them. The
 * caller holds the store's mutex and keeps n <= _DDP_STORE_WINDOW_OPS. DDP_SUCCESS means every
 * answer came (each status is in resp[i]); else *done answers came, and the failure is
 * request *done's. *outlen[i]: answer i's full value length. */
_DDP_PRIVATE ddp_result_t _ddp_store_rpcv(ddp_store_t *s, const _ddp_store_call_t *q, int n,
                                          _ddp_store_resp_t *resp, int *done) {
    _ddp_store_req_t rq[_DDP_STORE_WINDOW_OPS];
    struct iovec iov[4 * _DDP_STORE_WINDOW_OPS];
    int64_t deadline;
    const int64_t t0 = _ddp_now_us();
    int rc, i, niov = 0;
    *done = 0;
    if (s->fd < 0) {
        ddp_result_t r;
        if (s->quick) return DDP_ERR_REMOTE;
        if ((r = _ddp_store_connect(s)) != DDP_SUCCESS) return r;
    }
    deadline = _ddp_store_deadline(s, q[0].timeout_ms ? q[0].timeout_ms : s->timeout_ms);
    for (i = 0; i < n; i++) {
        memset(&rq[i], 0, sizeof rq[i]);
        rq[i].magic = _DDP_STORE_MAGIC; rq[i].op = q[i].op; rq[i].klen = (uint32_t)q[i].klen;
        rq[i].v1len = (uint32_t)q[i].v1len; rq[i].v2len = (uint32_t)q[i].v2len;
        rq[i].flags = q[i].flags; rq[i].arg = q[i].arg;
        iov[niov].iov_base = &rq[i]; iov[niov++].iov_len = sizeof rq[i];
        if (q[i].klen) { iov[niov].iov_base = (void *)(uintptr_t)q[i].key; iov[niov++].iov_len = q[i].klen; }
        if (q[i].v1len) { iov[niov].iov_base = (void *)(uintptr_t)q[i].v1; iov[niov++].iov_len = q[i].v1len; }
        if (q[i].v2len) { iov[niov].iov_base = (void *)(uintptr_t)q[i].v2; iov[niov++].iov_len = q[i].v2len; }
    }
    rc = _ddp_store_sendv(s->fd, iov, niov, deadline);
    for (i = 0; rc == 0 && i < n; i++)
        if ((rc = _ddp_store_rpc_recv(s, &q[i], &resp[i], deadline)) == 0) *done = i + 1;
    return rc == 0 ? DDP_SUCCESS : _ddp_store_rpc_failed(s, &q[*done], rc, t0);
}

/* One request/response round trip; the caller holds the store's mutex. *outlen (if not NULL):
 * the answer value's full length. DDP_SUCCESS means an answer came: its status is resp->status. */
_DDP_PRIVATE ddp_result_t _ddp_store_rpc(ddp_store_t *s, const _ddp_store_call_t *q,
                                         _ddp_store_resp_t *resp, size_t *outlen) {
    int done;
    ddp_result_t r = _ddp_store_rpcv(s, q, 1, resp, &done);
    if (outlen) *outlen = r == DDP_SUCCESS ? resp->vlen : 0;
    return r;
}

/* The call's result: the round trip's failure, else the server's status. */
_DDP_PRIVATE ddp_result_t _ddp_store_status(ddp_result_t r, const _ddp_store_resp_t *resp) {
    return r != DDP_SUCCESS ? r : (ddp_result_t)resp->status;
}

/* ---------------------------------------------------------------- the client interface */
_DDP_PRIVATE ddp_result_t _ddp_store_native_handshake(ddp_store_t *s, int *fd, int64_t deadline, int *retry) {
    return _ddp_store_handshake(s, *fd, deadline, retry);
}

_DDP_PRIVATE void _ddp_store_native_connected(ddp_store_t *s) {
    _ddp_store_log(s, DDP_LOG_INFO, "store: connected to master %s:%d%s", s->host, s->port,
                   s->keylen ? " (job secret proven both ways)" : "");
}

_DDP_PRIVATE ddp_result_t _ddp_store_native_set(ddp_store_t *s, const char *key, const void *value, size_t len) {
    _ddp_store_call_t q = _ddp_store_call(_DDP_ST_SET, key);
    _ddp_store_resp_t resp;
    q.v1 = value;
    q.v1len = len;
    return _ddp_store_status(_ddp_store_rpc(s, &q, &resp, NULL), &resp);
}

_DDP_PRIVATE ddp_result_t _ddp_store_native_get(ddp_store_t *s, const char *key, void *value, size_t cap,
                                                size_t *len) {
    _ddp_store_call_t q = _ddp_store_call(_DDP_ST_GET, key);
    _ddp_store_resp_t resp;
    q.out = value;
    q.cap = cap;
    return _ddp_store_status(_ddp_store_rpc(s, &q, &resp, len), &resp);
}

_DDP_PRIVATE ddp_result_t _ddp_store_native_add(ddp_store_t *s, const char *key, int64_t delta,
                                                int64_t *result) {
    _ddp_store_call_t q = _ddp_store_call(_DDP_ST_ADD, key);
    _ddp_store_resp_t resp;
    ddp_result_t r;
    q.arg = delta;
    r = _ddp_store_rpc(s, &q, &resp, NULL);
    if (r == DDP_SUCCESS && result) *result = resp.num;
    return _ddp_store_status(r, &resp);
}

_DDP_PRIVATE ddp_result_t _ddp_store_native_cas(ddp_store_t *s, const char *key, const void *expected,
                                                size_t expected_len, const void *desired,
                                                size_t desired_len, void *actual, size_t cap,
                                                size_t *actual_len) {
    _ddp_store_call_t q = _ddp_store_call(_DDP_ST_CAS, key);
    _ddp_store_resp_t resp;
    q.v1 = expected;
    q.v1len = expected_len;
    q.v2 = desired;
    q.v2len = desired_len;
    q.out = actual;
    q.cap = cap;
    return _ddp_store_status(_ddp_store_rpc(s, &q, &resp, actual_len), &resp);
}

/* One WAIT request: the keys NUL-separated in its key field (they fit: see the interface). */
_DDP_PRIVATE ddp_result_t _ddp_store_native_wait(ddp_store_t *s, const char *const *keys, int nkeys,
                                                 int timeout_ms, int any) {
    char buf[_DDP_STORE_WAIT_KEYS];
    size_t off = 0;
    int i;
    _ddp_store_call_t q;
    _ddp_store_resp_t resp;
    for (i = 0; i < nkeys; i++) {
        size_t n = strlen(keys[i]);
        memcpy(buf + off, keys[i], n + 1);
        off += n + 1;
    }
    memset(&q, 0, sizeof q);
    q.op = _DDP_ST_WAIT;
    q.flags = any ? _DDP_ST_WAIT_ANY : 0;
    q.key = buf;
    q.klen = off - 1;
    q.timeout_ms = timeout_ms;
    return _ddp_store_status(_ddp_store_rpc(s, &q, &resp, NULL), &resp);
}

_DDP_PRIVATE ddp_result_t _ddp_store_native_check(ddp_store_t *s, const char *key, int *exists) {
    _ddp_store_call_t q = _ddp_store_call(_DDP_ST_CHECK, key);
    _ddp_store_resp_t resp;
    ddp_result_t r = _ddp_store_rpc(s, &q, &resp, NULL);
    if (r == DDP_SUCCESS && exists) *exists = (int)resp.num;
    return _ddp_store_status(r, &resp);
}

_DDP_PRIVATE ddp_result_t _ddp_store_native_delete(ddp_store_t *s, const char *key, int *deleted) {
    _ddp_store_call_t q = _ddp_store_call(_DDP_ST_DELETE, key);
    _ddp_store_resp_t resp;
    ddp_result_t r = _ddp_store_rpc(s, &q, &resp, NULL);
    if (r == DDP_SUCCESS && deleted) *deleted = (int)resp.num;
    return _ddp_store_status(r, &resp);
}

/* A batch's requests as calls (ops checked by ddp_store_batch). */
_DDP_PRIVATE _ddp_store_call_t _ddp_store_op_call(const ddp_store_op_t *op) {
    static const uint32_t wire[] = {0, _DDP_ST_SET, _DDP_ST_GET, _DDP_ST_ADD, _DDP_ST_CAS, _DDP_ST_WAIT,
                                    _DDP_ST_CHECK, _DDP_ST_DELETE, _DDP_ST_GET_IF_SET};
    _ddp_store_call_t q = _ddp_store_call(wire[op->kind], op->key ? op->key : "");
    if (op->kind == DDP_STORE_OP_SET) { q.v1 = op->value; q.v1len = op->len; }
    if (op->kind == DDP_STORE_OP_COMPARE_SET) {
        q.v1 = op->expected; q.v1len = op->expected_len;
        q.v2 = op->value; q.v2len = op->len;
    }
    if (op->kind == DDP_STORE_OP_ADD) q.arg = op->delta;
    if (op->kind == DDP_STORE_OP_GET || op->kind == DDP_STORE_OP_COMPARE_SET || op->kind == DDP_STORE_OP_GET_IF_SET) {
        q.out = op->out;
        q.cap = op->cap;
    }
    if (op->kind == DDP_STORE_OP_WAIT && op->any) q.flags = _DDP_ST_WAIT_ANY;
    return q;
}

/* A WAIT on several keys: its key field, the keys NUL-separated, in a buffer of its own (freed
 * by the caller; checked by ddp_store_batch to fit _DDP_STORE_WAIT_KEYS). NULL: no memory. */
_DDP_PRIVATE char *_ddp_store_op_wait_keys(const ddp_store_op_t *op, _ddp_store_call_t *q) {
    char *buf = (char *)DDP_MALLOC(_DDP_STORE_WAIT_KEYS);
    size_t off = 0;
    int i;
    if (!buf) return NULL;
    for (i = 0; i < op->nkeys; i++) {
        const size_t n = strlen(op->keys[i]);
        memcpy(buf + off, op->keys[i], n + 1);
        off += n + 1;
    }
    q->key = buf;
    q->klen = off - 1;
    return buf;
}

/* How many of ops (at least one) make the next window. */
_DDP_PRIVATE int _ddp_store_window(const _ddp_store_call_t *q, int nops) {
    size_t bytes = 0;
    int n = 0;
    while (n < nops && n < _DDP_STORE_WINDOW_OPS) {
        const size_t b = sizeof(_ddp_store_req_t) + q[n].klen + q[n].v1len + q[n].v2len;
        if (n && bytes + b > _DDP_STORE_WINDOW_BYTES) break;
        bytes += b;
        n++;
    }
    return n;
}

/* The requests pipelined, a window at a time (see _ddp_store_rpcv), within timeout_ms (0: the
 * store's): each op gets its own result; a lost connection fails the op it broke on and every
 * op after it. */
_DDP_PRIVATE ddp_result_t _ddp_store_batch_within(ddp_store_t *s, ddp_store_op_t *ops, int nops, int timeout_ms) {
    _ddp_store_call_t q[_DDP_STORE_WINDOW_OPS];
    _ddp_store_resp_t resp[_DDP_STORE_WINDOW_OPS];
    char *keys[_DDP_STORE_WINDOW_OPS];
    ddp_result_t first = DDP_SUCCESS;
    int at = 0, i;
    while (at < nops) {
        int n = nops - at < _DDP_STORE_WINDOW_OPS ? nops - at : _DDP_STORE_WINDOW_OPS, done = 0, nomem = 0;
        ddp_result_t r;
        for (i = 0; i < n; i++) {
            q[i] = _ddp_store_op_call(&ops[at + i]);
            keys[i] = NULL;
            if (ops[at + i].kind == DDP_STORE_OP_WAIT && ops[at + i].keys &&
                !(keys[i] = _ddp_store_op_wait_keys(&ops[at + i], &q[i])))
                nomem = 1;
        }
        q[0].timeout_ms = timeout_ms;
        n = _ddp_store_window(q, n);
        r = nomem ? DDP_ERR_OUT_OF_MEMORY : _ddp_store_rpcv(s, q, n, resp, &done);
        for (i = 0; i < _DDP_STORE_WINDOW_OPS && i < nops - at; i++) DDP_FREE(keys[i]);
        for (i = 0; i < done; i++) {
            ddp_store_op_t *op = &ops[at + i];
            op->result = (ddp_result_t)resp[i].status;
            op->num = resp[i].num;
            op->out_len = op->kind == DDP_STORE_OP_GET || op->kind == DDP_STORE_OP_COMPARE_SET ||
                          op->kind == DDP_STORE_OP_GET_IF_SET ? resp[i].vlen : 0;
            if (op->result != DDP_SUCCESS && first == DDP_SUCCESS) first = op->result;
        }
        if (r != DDP_SUCCESS) {
            for (i = at + done; i < nops; i++) { ops[i].result = r; ops[i].out_len = 0; }
            return first != DDP_SUCCESS ? first : r;
        }
        at += n;
    }
    return first;
}

_DDP_PRIVATE const _ddp_store_client_t _ddp_store_native = {
    "rendezvous: rank 0's store at", _ddp_store_native_handshake, _ddp_store_native_connected, NULL,
    _ddp_store_native_set, _ddp_store_native_get, _ddp_store_native_add, _ddp_store_native_cas,
    _ddp_store_native_wait, _ddp_store_native_check, _ddp_store_native_delete, _ddp_store_batch_within};

#endif /* DDP_STORE_CLIENT_IMPLEMENTATION */
