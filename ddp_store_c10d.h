/* SPDX-License-Identifier: MIT (see LICENSE) */
/* ddp_store_c10d.h — a client of PyTorch's c10d TCPStore, private: its wire (queries, strings,
 * the dialects' query numbers), finding which dialect a server speaks by probing, and the
 * requests as the client interface _ddp_store_c10d that ddp_store_connect_c10d's handles use
 * (what the c10d protocol lacks is emulated: see PYTORCH'S STORE in ddp_store.h). libddp's own
 * client (ddp_store_client.h) is the other implementation of the same interface.
 * Depends on ddp_store_core.h. Built by DDP_IMPLEMENTATION (or DDP_STORE_C10D_IMPLEMENTATION).
 */
#if defined(DDP_IMPLEMENTATION) && !defined(DDP_STORE_C10D_IMPLEMENTATION)
#define DDP_STORE_C10D_IMPLEMENTATION
#endif
#if defined(DDP_STORE_C10D_IMPLEMENTATION) && !defined(DDP_STORE_CORE_IMPLEMENTATION)
#define DDP_STORE_CORE_IMPLEMENTATION
#endif
#include "ddp_store_core.h"

#if defined(DDP_STORE_C10D_IMPLEMENTATION) && !defined(DDP_STORE_C10D_IMPL_INCLUDED)
#define DDP_STORE_C10D_IMPL_INCLUDED
#ifndef DDP_STORE_CORE_IMPL_INCLUDED
#error "libddp: ddp_store_c10d.h's implementation needs ddp_store_core.h's (define DDP_IMPLEMENTATION)"
#endif

/* ---------------------------------------------------------------- c10d TCPStore client: the wire
 * PyTorch's torch.distributed.TCPStore as its client writes it (torch/csrc/distributed/c10d/
 * TCPStore.cpp) and its servers read it (TCPStoreBackend.cpp, the "legacy" daemon, inside
 * TCPStore.cpp itself in 1.x; TCPStoreLibUvBackend.cpp, the default server from 2.4); the codecs
 * are tcputil's in Utils.hpp. Encoded here from those facts, not copied. Integers are in host
 * byte order, as torch sends them (little-endian wherever it runs). A request is
 *   u8 query number, then its arguments; a string (keys and values alike) is u64 length + bytes
 *   SET         key value             -> nothing
 *   COMPARE_SET key expected desired  -> string: the value after the call; but a missing key
 *                                        with a non-empty `expected` answers `expected` itself
 *   GET         key                   -> string (the legacy daemon closes the connection on a
 *                                        missing key: clients WAIT first, as torch's does)
 *   ADD         key i64               -> i64 (kept as decimal text; a non-number: closes)
 *   CHECK       u64 n, n keys         -> u8 0 READY (all exist) or 1 NOT_READY
 *   WAIT        u64 n, n keys         -> u8 0 STOP_WAITING once all exist; nothing until then
 *   DELETE_KEY  key                   -> i64 how many were deleted (0 or 1)
 *   CANCEL_WAIT                       -> u8 1 WAIT_CANCELED (after a STOP_WAITING that raced it)
 *   VALIDATE    u32 0x3C85F7CE        -> nothing; it must be the first query on a connection to
 *                                        a server that has it (legacy: else closes; libuv: else
 *                                        ignores the bytes, so an old client just hangs)
 *   PING        u32 nonce             -> u32 nonce (this client does not need it)
 * The query enum grew, so the numbers depend on the server (an unknown number: the server
 * closes the connection). Three dialects, found by probing (below), never by version:
 *                               VALIDATE SET CAS GET ADD CHECK WAIT NUMKEYS WATCH DELETE CANCEL PING
 *   watch    (1.x, to ~2.1)        -      0   1   2   3    4    5     6      7     8   (12)    -
 *   plain    (~2.2)                -      0   1   2   3    4    5     6      -     7    11     -
 *   validate (~2.3 on; 2.4+ libuv) 0      1   2   3   4    5    6     7      -     8    12    13
 * (release numbers approximate; CANCEL_WAIT 12 of 2.0-2.1 is not used: it cannot be told from
 * 1.x without one more probe, and dropping the connection does the same job.)
 * Keys: torch's TCPStore puts "/" before every user key (PrefixStore puts "prefix/" before that);
 * this client does too. "init/" (TCPStore's own worker count) never gets the "/".
 * TESTED against a real server: PyTorch 1.13 (Debian's python3-torch), the watch dialect. The
 * plain and validate dialects (torchrun's agent store on PyTorch >= 2.4 is the latter) follow
 * the source only; tests/test_c10d_store.c checks their bytes against a scripted server. */
#define _DDP_C10D_VALIDATE_MAGIC 0x3C85F7CEu
#define _DDP_C10D_Q_VALIDATE 0
#define _DDP_C10D_Q_WATCH_OR_DELETE 7         /* WATCH_KEY (watch) or DELETE_KEY (plain) */
#define _DDP_C10D_PROBE_KEY "libddp.c10d.probe" /* no "/": no Python key can be it */
#define _DDP_C10D_MAX_VALUE ((uint64_t)64 << 20)  /* an answer announcing more is malformed */
#define _DDP_C10D_LIBUV_MAX_VALUE ((size_t)8 << 20)  /* libuv servers close on bigger values */
#define _DDP_C10D_MAX_IOV 48
#define _DDP_C10D_BATCH 8                     /* keys per WAIT, CHECKs per message */
#define _DDP_C10D_PROBE_MS 5000               /* servers answer a probe at once: else retry */
#define _DDP_C10D_GRACE_MS 2000               /* for an answer asked for at a wait's deadline */
#define _DDP_C10D_POLL_MAX_MS 100             /* wait-any polls CHECK, napping up to this long */
#define _DDP_C10D_TOO_LONG (-1000001)         /* recv result: an answer over _DDP_C10D_MAX_VALUE */
enum { _DDP_C10D_CHECK_READY = 0, _DDP_C10D_CHECK_NOT_READY = 1 };
enum { _DDP_C10D_STOP_WAITING = 0, _DDP_C10D_WAIT_CANCELED = 1, _DDP_C10D_WATCH_REGISTERED = 3 };

/* ddp_store_t.c10d: 0 = libddp's own protocol; UNKNOWN until the first connection probed. */
enum { _DDP_C10D_OFF = 0, _DDP_C10D_UNKNOWN, _DDP_C10D_WATCH, _DDP_C10D_PLAIN, _DDP_C10D_VALIDATE };
enum { _DDP_CQ_SET, _DDP_CQ_CAS, _DDP_CQ_GET, _DDP_CQ_ADD, _DDP_CQ_CHECK, _DDP_CQ_WAIT,
       _DDP_CQ_DELETE, _DDP_CQ_CANCEL_WAIT, _DDP_CQ_COUNT };
static const signed char _ddp_c10d_queries[3][_DDP_CQ_COUNT] = {   /* -1: the dialect has none */
    /* watch    */ {0, 1, 2, 3, 4, 5, 8, -1},
    /* plain    */ {0, 1, 2, 3, 4, 5, 7, 11},
    /* validate */ {1, 2, 3, 4, 5, 6, 8, 12}};
static const char *const _ddp_c10d_dialects[3] = {
    "watch dialect (PyTorch 1.x-2.1: no VALIDATE, WATCH_KEY)",
    "plain dialect (PyTorch ~2.2: no VALIDATE)",
    "validate dialect (PyTorch ~2.3+: VALIDATE first)"};
static const char *const _ddp_c10d_query_names[_DDP_CQ_COUNT] = {
    "SET", "COMPARE_SET", "GET", "ADD", "CHECK", "WAIT", "DELETE_KEY", "CANCEL_WAIT"};

/* One message, possibly several queries: iovecs over the caller's keys and values and over the
 * numbers kept here (so a 16 MiB value is never copied). Sizes fit the batches above. */
typedef struct {
    struct iovec iov[_DDP_C10D_MAX_IOV];
    uint64_t num[_DDP_C10D_MAX_IOV];
    unsigned char q[_DDP_C10D_BATCH + 1];
    int niov, nnum, nq, overflow;
} _ddp_c10d_msg_t;

_DDP_PRIVATE void _ddp_c10d_raw(_ddp_c10d_msg_t *m, const void *p, size_t n) {
    if (m->niov >= _DDP_C10D_MAX_IOV) { m->overflow = 1; return; }
    m->iov[m->niov].iov_base = (void *)(uintptr_t)p;
    m->iov[m->niov].iov_len = n;
    m->niov++;
}

_DDP_PRIVATE void _ddp_c10d_u64(_ddp_c10d_msg_t *m, uint64_t v) {
    if (m->nnum >= _DDP_C10D_MAX_IOV) { m->overflow = 1; return; }
    m->num[m->nnum] = v;
    _ddp_c10d_raw(m, &m->num[m->nnum++], sizeof v);
}

_DDP_PRIVATE void _ddp_c10d_str(_ddp_c10d_msg_t *m, const void *p, size_t n) {
    _ddp_c10d_u64(m, n);
    if (n) _ddp_c10d_raw(m, p, n);
}

/* A user key as torch's TCPStore sends it: "/" + key. */
_DDP_PRIVATE void _ddp_c10d_key(_ddp_c10d_msg_t *m, const char *key) {
    size_t n = strlen(key);
    _ddp_c10d_u64(m, n + 1);
    _ddp_c10d_raw(m, "/", 1);
    _ddp_c10d_raw(m, key, n);
}

_DDP_PRIVATE void _ddp_c10d_q(_ddp_c10d_msg_t *m, int q) {
    if (m->nq >= (int)sizeof m->q) { m->overflow = 1; return; }
    m->q[m->nq] = (unsigned char)q;
    _ddp_c10d_raw(m, &m->q[m->nq++], 1);
}

/* Appends query `which` in the handle's dialect; DDP_ERR_UNSUPPORTED if the dialect has none. */
_DDP_PRIVATE ddp_result_t _ddp_c10d_query(ddp_store_t *s, _ddp_c10d_msg_t *m, int which) {
    int q;
    if (s->c10d < _DDP_C10D_WATCH)         /* no connection ever got through the probe */
        return _ddp_store_err(s, DDP_ERR_INTERNAL, "c10d store %s:%d: dialect unknown", s->host, s->port);
    q = _ddp_c10d_queries[s->c10d - _DDP_C10D_WATCH][which];
    if (q < 0)
        return _ddp_store_err(s, DDP_ERR_UNSUPPORTED, "c10d store %s:%d speaks the %s, which has "
                              "no %s query", s->host, s->port, _ddp_c10d_dialects[s->c10d -
                              _DDP_C10D_WATCH], _ddp_c10d_query_names[which]);
    _ddp_c10d_q(m, q);
    return DDP_SUCCESS;
}

/* Sends the whole message before the deadline: 0 or -errno. The iovecs are consumed. */
_DDP_PRIVATE int _ddp_c10d_sendv(int fd, _ddp_c10d_msg_t *m, int64_t deadline) {
    if (m->overflow) return -EMSGSIZE;
    return _ddp_store_sendv(fd, m->iov, m->niov, deadline);
}

/* Reads a string answer: up to cap bytes into out, the rest drained; *len = its length (also
 * when it is over _DDP_C10D_MAX_VALUE: then nothing more is read). With cmp, *same says
 * whether the answer equals cmp[0..cmplen). 0, -errno or _DDP_C10D_TOO_LONG. */
_DDP_PRIVATE int _ddp_c10d_recv_value(int fd, void *out, size_t cap, uint64_t *len, const void *cmp,
                                      size_t cmplen, int *same, int64_t deadline) {
    unsigned char sink[4096];
    uint64_t n = 0, off = 0;
    int rc = _ddp_recv_all(fd, &n, sizeof n, deadline);
    *len = n;
    if (rc != 0) return rc;
    if (n > _DDP_C10D_MAX_VALUE) return _DDP_C10D_TOO_LONG;
    if (same) *same = cmp && n == cmplen;
    while (off < n) {
        unsigned char *dst = off < cap ? (unsigned char *)out + off : sink;
        size_t room = off < cap ? cap - (size_t)off : sizeof sink;
        size_t take = n - off < room ? (size_t)(n - off) : room;
        if ((rc = _ddp_recv_all(fd, dst, take, deadline)) != 0) return rc;
        if (same && *same && memcmp(dst, (const unsigned char *)cmp + off, take) != 0) *same = 0;
        off += take;
    }
    return 0;
}

_DDP_PRIVATE void _ddp_c10d_drop(ddp_store_t *s) {
    _ddp_store_hangup(s);
}

/* A request failed: the stream is out of step or gone, so the connection is dropped (the next
 * call reconnects). The message names the server, the request and its key. */
_DDP_PRIVATE ddp_result_t _ddp_c10d_fail(ddp_store_t *s, int rc, const char *what, const char *key,
                                         int timeout_ms, const char *hint) {
    _ddp_c10d_drop(s);
    if (rc == -ETIMEDOUT)
        return _ddp_store_err(s, DDP_ERR_TIMEOUT, "c10d store %s:%d: no answer to %s of key "
                              "'%.200s' within %d ms", s->host, s->port, what, key, timeout_ms);
    return _ddp_store_err(s, DDP_ERR_REMOTE, "c10d store %s:%d: connection lost during %s of key "
                          "'%.200s': %s%s", s->host, s->port, what, key, rc == -ECONNRESET ?
                          "closed by the server" : strerror(-rc), hint);
}

_DDP_PRIVATE ddp_result_t _ddp_c10d_malformed(ddp_store_t *s, const char *what, const char *key,
                                              const char *fmt, ...) {
    char detail[160];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(detail, sizeof detail, fmt, ap);
    va_end(ap);
    _ddp_c10d_drop(s);
    return _ddp_store_err(s, DDP_ERR_MISMATCH, "c10d store %s:%d sent a malformed answer to %s of "
                          "key '%.200s' (%s); connection dropped", s->host, s->port, what, key,
                          detail);
}

/* ---------------------------------------------------------------- c10d: which dialect
 * A connection's first write is one 9-byte message: VALIDATE, then four CANCEL_WAITs in the
 * validate dialect's numbers:   00 | CE F7 85 3C | 0C 0C 0C 0C
 *   - a server with VALIDATE takes it and answers 01 01 01 01 (four WAIT_CANCELED);
 *   - an older one reads 00 as SET and the next 8 bytes as the key's length, 0x0C0C0C0C3C85F7CE
 *     (about 8.7e17): it cannot allocate that, throws and closes the connection having read
 *     all we sent (so no reset can eat an answer): end of stream, no byte.
 *   (A PING would not do as the answer: a validating server without PING closes as well.)
 * After the close, a second connection sends query 7 with a key nobody uses: the watch dialect
 * registers a watch on it and answers 03 (KEY_CALLBACK_REGISTERED), the plain dialect deletes
 * it and answers i64 0. That connection stays: it is clean in both. A libddp store answers the
 * first bytes with its own challenge ("SPDD"...) and is refused by name. On a reconnect the
 * first message is the same, and a server that answers another dialect than before is refused. */
_DDP_PRIVATE int64_t _ddp_c10d_probe_deadline(int64_t deadline) {
    const int64_t soon = _ddp_deadline(_DDP_C10D_PROBE_MS);
    return deadline != 0 && deadline < soon ? deadline : soon;
}

/* *validated: 1 the server took VALIDATE, 0 it closed without a byte (an older dialect). */
_DDP_PRIVATE ddp_result_t _ddp_c10d_probe_validate(ddp_store_t *s, int fd, int64_t deadline,
                                                   int *validated, int *retry) {
    const uint32_t magic = _DDP_C10D_VALIDATE_MAGIC, libddp = _DDP_STORE_MAGIC;
    const int64_t until = _ddp_c10d_probe_deadline(deadline);
    unsigned char msg[9], ans[4];
    int rc, i, all = 1;
    msg[0] = _DDP_C10D_Q_VALIDATE;
    memcpy(msg + 1, &magic, sizeof magic);
    memset(msg + 5, _ddp_c10d_queries[_DDP_C10D_VALIDATE - _DDP_C10D_WATCH][_DDP_CQ_CANCEL_WAIT], 4);
    *validated = 0;
    rc = _ddp_send_all(fd, msg, sizeof msg, until);
    if (rc == 0) {
        rc = _ddp_recv_all(fd, ans, 1, until);
        if (rc == -ECONNRESET) return DDP_SUCCESS;          /* closed without a word */
    }
    if (rc == 0) rc = _ddp_recv_all(fd, ans + 1, sizeof ans - 1, until);
    if (rc != 0) {
        *retry = 1;
        snprintf(s->last_error, sizeof s->last_error, "c10d store %s:%d: %s%s during the VALIDATE "
                 "probe", s->host, s->port, rc == -ETIMEDOUT ? "no answer within a few seconds" :
                 "connection lost: ", rc == -ETIMEDOUT ? "" : strerror(-rc));
        return rc == -ETIMEDOUT ? DDP_ERR_TIMEOUT : DDP_ERR_REMOTE;
    }
    for (i = 0; i < 4; i++) all &= ans[i] == _DDP_C10D_WAIT_CANCELED;
    if (all) { *validated = 1; return DDP_SUCCESS; }
    if (memcmp(ans, &libddp, sizeof ans) == 0)
        return _ddp_store_err(s, DDP_ERR_MISMATCH, "%s:%d is a libddp store (ddp_store_open), not a "
                              "c10d TCPStore", s->host, s->port);
    return _ddp_store_err(s, DDP_ERR_MISMATCH, "%s:%d is not a c10d TCPStore: it answered %02x %02x "
                          "%02x %02x to VALIDATE", s->host, s->port, ans[0], ans[1], ans[2], ans[3]);
}

/* An older server (no VALIDATE): query 7 on the probe key tells watch from plain. */
_DDP_PRIVATE ddp_result_t _ddp_c10d_probe_dialect(ddp_store_t *s, int fd, int64_t deadline,
                                                  int *retry) {
    static const unsigned char zeros[7] = {0, 0, 0, 0, 0, 0, 0};
    const int64_t until = _ddp_c10d_probe_deadline(deadline);
    unsigned char ans[8];
    _ddp_c10d_msg_t m;
    int rc;
    memset(&m, 0, sizeof m);
    _ddp_c10d_q(&m, _DDP_C10D_Q_WATCH_OR_DELETE);
    _ddp_c10d_str(&m, _DDP_C10D_PROBE_KEY, strlen(_DDP_C10D_PROBE_KEY));
    rc = _ddp_c10d_sendv(fd, &m, until);
    if (rc == 0) rc = _ddp_recv_all(fd, ans, 1, until);
    if (rc == 0 && ans[0] == _DDP_C10D_WATCH_REGISTERED) {
        s->c10d = _DDP_C10D_WATCH;
        return DDP_SUCCESS;
    }
    if (rc == 0 && ans[0] == 0) rc = _ddp_recv_all(fd, ans + 1, 7, until);
    if (rc == 0 && ans[0] == 0 && memcmp(ans + 1, zeros, 7) == 0) {
        s->c10d = _DDP_C10D_PLAIN;
        return DDP_SUCCESS;
    }
    if (rc == 0)
        return _ddp_store_err(s, DDP_ERR_MISMATCH, "%s:%d is not a c10d TCPStore of a known "
                              "dialect: it closed the connection on VALIDATE and answered %02x to "
                              "query 7", s->host, s->port, ans[0]);
    /* A validating server that closed the first connection for another reason (a flood) drops
     * this one too, or (libuv) ignores it: try everything again. */
    *retry = 1;
    snprintf(s->last_error, sizeof s->last_error, "c10d store %s:%d: %s during the dialect probe",
             s->host, s->port, rc == -ETIMEDOUT ? "no answer" : "connection lost");
    return rc == -ETIMEDOUT ? DDP_ERR_TIMEOUT : DDP_ERR_REMOTE;
}

/* A fresh connection: which dialect (the first time), the same one (later). May replace *fd:
 * an older server closes the first one. *retry as in the client interface (ddp_store_core.h). */
_DDP_PRIVATE ddp_result_t _ddp_c10d_handshake(ddp_store_t *s, int *fd, int64_t deadline,
                                              int *retry) {
    const int known = s->c10d;
    char why[512];
    int validated = 0;
    ddp_result_t r;
    *retry = 0;
    if ((r = _ddp_c10d_probe_validate(s, *fd, deadline, &validated, retry)) != DDP_SUCCESS) return r;
    if (known != _DDP_C10D_UNKNOWN && (known == _DDP_C10D_VALIDATE) != validated)
        return _ddp_store_err(s, DDP_ERR_MISMATCH, "c10d store %s:%d now %s VALIDATE; it spoke "
                              "the %s before (another server on that port?)", s->host, s->port,
                              validated ? "takes" : "refuses",
                              _ddp_c10d_dialects[known - _DDP_C10D_WATCH]);
    if (validated) { s->c10d = _DDP_C10D_VALIDATE; return DDP_SUCCESS; }
    close(*fd);
    *fd = _ddp_store_dial(s, deadline, why, sizeof why);
    if (*fd < 0) {
        *retry = *fd != _DDP_STORE_UNRESOLVABLE;
        snprintf(s->last_error, sizeof s->last_error, "%s", why);
        return DDP_ERR_REMOTE;
    }
    if (known != _DDP_C10D_UNKNOWN) return DDP_SUCCESS;   /* an older dialect: nothing to send */
    return _ddp_c10d_probe_dialect(s, *fd, deadline, retry);
}

/* ---------------------------------------------------------------- c10d: one function per request
 * Each runs under the handle's mutex, connects first when there is no connection, and bounds
 * every send and recv by its deadline. */
_DDP_PRIVATE ddp_result_t _ddp_c10d_ready(ddp_store_t *s) {
    if (s->fd >= 0) return DDP_SUCCESS;
    if (s->quick)
        return _ddp_store_err(s, DDP_ERR_REMOTE, "c10d store %s:%d: the connection was lost earlier "
                              "(not reconnecting while a failure is reported)", s->host, s->port);
    return _ddp_store_connect(s);
}

/* Starts a message with query `which`, connecting first if needed. */
_DDP_PRIVATE ddp_result_t _ddp_c10d_begin(ddp_store_t *s, _ddp_c10d_msg_t *m, int which) {
    ddp_result_t r = _ddp_c10d_ready(s);
    m->niov = m->nnum = m->nq = m->overflow = 0;
    return r != DDP_SUCCESS ? r : _ddp_c10d_query(s, m, which);
}

_DDP_PRIVATE int _ddp_c10d_ms(const ddp_store_t *s, int timeout_ms) {
    return timeout_ms ? timeout_ms : s->timeout_ms;
}

/* The deadline of a request made after a wait under `deadline` (a CHECK of wait-any's poll, the
 * GET after its WAIT): the wait's, but at least _DDP_C10D_GRACE_MS from now, so that a request
 * sent just before the deadline is not mistaken for a server that does not answer. */
_DDP_PRIVATE int64_t _ddp_c10d_after(const ddp_store_t *s, int64_t deadline) {
    const int64_t grace = _ddp_deadline(_DDP_C10D_GRACE_MS);
    if (deadline == 0) return _ddp_store_deadline(s, s->timeout_ms);
    return deadline > grace ? deadline : grace;
}

/* CHECK of each key alone (n <= _DDP_C10D_BATCH), in one message: exists[i]. */
_DDP_PRIVATE ddp_result_t _ddp_c10d_exists(ddp_store_t *s, const char *const *keys, int n, int *exists,
                                           int64_t deadline, int timeout_ms) {
    _ddp_c10d_msg_t m;
    unsigned char ans[_DDP_C10D_BATCH];
    ddp_result_t r = _ddp_c10d_begin(s, &m, _DDP_CQ_CHECK);
    int i, rc;
    for (i = 0; r == DDP_SUCCESS && i < n; i++) {
        if (i) r = _ddp_c10d_query(s, &m, _DDP_CQ_CHECK);
        _ddp_c10d_u64(&m, 1);
        _ddp_c10d_key(&m, keys[i]);
    }
    if (r != DDP_SUCCESS) return r;
    rc = _ddp_c10d_sendv(s->fd, &m, deadline);
    if (rc == 0) rc = _ddp_recv_all(s->fd, ans, (size_t)n, deadline);
    if (rc != 0) return _ddp_c10d_fail(s, rc, "CHECK", keys[0], timeout_ms, "");
    for (i = 0; i < n; i++) {
        if (ans[i] != _DDP_C10D_CHECK_READY && ans[i] != _DDP_C10D_CHECK_NOT_READY)
            return _ddp_c10d_malformed(s, "CHECK", keys[i], "answer byte %u, not 0 or 1", ans[i]);
        exists[i] = ans[i] == _DDP_C10D_CHECK_READY;
    }
    return DDP_SUCCESS;
}

/* SET has no answer: a CHECK of the key behind it makes one, so a set that returns success has
 * been applied (one round trip, as our own store's SET). */
_DDP_PRIVATE ddp_result_t _ddp_c10d_set(ddp_store_t *s, const char *key, const void *value,
                                        size_t len) {
    const int64_t deadline = _ddp_store_deadline(s, s->timeout_ms);
    _ddp_c10d_msg_t m;
    unsigned char ans = 0xff;
    ddp_result_t r = _ddp_c10d_begin(s, &m, _DDP_CQ_SET);
    int rc;
    if (r != DDP_SUCCESS) return r;
    _ddp_c10d_key(&m, key);
    _ddp_c10d_str(&m, value, len);
    if ((r = _ddp_c10d_query(s, &m, _DDP_CQ_CHECK)) != DDP_SUCCESS) return r;
    _ddp_c10d_u64(&m, 1);
    _ddp_c10d_key(&m, key);
    rc = _ddp_c10d_sendv(s->fd, &m, deadline);
    if (rc == 0) rc = _ddp_recv_all(s->fd, &ans, 1, deadline);
    if (rc != 0)
        return _ddp_c10d_fail(s, rc, "SET", key, s->timeout_ms, len > _DDP_C10D_LIBUV_MAX_VALUE ?
                              " (a libuv server, PyTorch 2.4+, refuses values over 8 MiB)" : "");
    if (ans != _DDP_C10D_CHECK_READY && ans != _DDP_C10D_CHECK_NOT_READY)
        return _ddp_c10d_malformed(s, "SET", key, "the CHECK behind it answered %u", ans);
    return DDP_SUCCESS;
}

/* A WAIT that timed out stays registered on the server, which would answer it later and put the
 * stream out of step: CANCEL_WAIT withdraws it. The answer is WAIT_CANCELED, or STOP_WAITING
 * then WAIT_CANCELED when the keys came in the meantime (then the wait succeeded after all).
 * Without CANCEL_WAIT (watch dialect), or without an answer in time, the connection goes: a
 * server forgets the waits of a closed socket, and the next call reconnects. */
_DDP_PRIVATE ddp_result_t _ddp_c10d_cancel_wait(ddp_store_t *s, const char *const *keys, int n,
                                                int timeout_ms) {
    const int q = _ddp_c10d_queries[s->c10d - _DDP_C10D_WATCH][_DDP_CQ_CANCEL_WAIT];
    const int64_t until = _ddp_deadline(_DDP_C10D_GRACE_MS);
    unsigned char ans[2] = {0xff, 0xff};
    _ddp_c10d_msg_t m;
    int rc = -1;
    if (q >= 0) {
        m.niov = m.nnum = m.nq = m.overflow = 0;
        _ddp_c10d_q(&m, q);
        rc = _ddp_c10d_sendv(s->fd, &m, until);
        if (rc == 0) rc = _ddp_recv_all(s->fd, ans, 1, until);
        if (rc == 0 && ans[0] == _DDP_C10D_STOP_WAITING) rc = _ddp_recv_all(s->fd, ans + 1, 1, until);
    }
    if (rc == 0 && ans[0] == _DDP_C10D_STOP_WAITING && ans[1] == _DDP_C10D_WAIT_CANCELED)
        return DDP_SUCCESS;
    if (rc != 0 || ans[0] != _DDP_C10D_WAIT_CANCELED) _ddp_c10d_drop(s);
    if (n > 1)
        return _ddp_store_err(s, DDP_ERR_TIMEOUT, "c10d store %s:%d: keys '%.200s' and %d more not "
                              "all set within %d ms", s->host, s->port, keys[0], n - 1, timeout_ms);
    return _ddp_store_err(s, DDP_ERR_TIMEOUT, "c10d store %s:%d: key '%.200s' not set within %d ms",
                          s->host, s->port, keys[0], timeout_ms);
}

/* One WAIT (n <= _DDP_C10D_BATCH keys): STOP_WAITING comes when all exist. */
_DDP_PRIVATE ddp_result_t _ddp_c10d_wait_batch(ddp_store_t *s, const char *const *keys, int n,
                                               int64_t deadline, int timeout_ms) {
    _ddp_c10d_msg_t m;
    unsigned char ans = 0xff;
    ddp_result_t r = _ddp_c10d_begin(s, &m, _DDP_CQ_WAIT);
    int i, rc;
    if (r != DDP_SUCCESS) return r;
    _ddp_c10d_u64(&m, (uint64_t)n);
    for (i = 0; i < n; i++) _ddp_c10d_key(&m, keys[i]);
    if ((rc = _ddp_c10d_sendv(s->fd, &m, deadline)) != 0)
        return _ddp_c10d_fail(s, rc, "WAIT", keys[0], timeout_ms, "");
    rc = _ddp_recv_all(s->fd, &ans, 1, deadline);
    if (rc == -ETIMEDOUT) return _ddp_c10d_cancel_wait(s, keys, n, timeout_ms);
    if (rc != 0) return _ddp_c10d_fail(s, rc, "WAIT", keys[0], timeout_ms, "");
    if (ans != _DDP_C10D_STOP_WAITING)
        return _ddp_c10d_malformed(s, "WAIT", keys[0], "answer byte %u, not STOP_WAITING", ans);
    return DDP_SUCCESS;
}

/* All keys: one WAIT per batch, under one deadline (a key once set stays, so this is the same
 * as one WAIT for all). */
_DDP_PRIVATE ddp_result_t _ddp_c10d_wait_all(ddp_store_t *s, const char *const *keys, int nkeys,
                                             int timeout_ms) {
    const int64_t deadline = _ddp_store_deadline(s, _ddp_c10d_ms(s, timeout_ms));
    ddp_result_t r = DDP_SUCCESS;
    int i;
    for (i = 0; i < nkeys && r == DDP_SUCCESS; i += _DDP_C10D_BATCH)
        r = _ddp_c10d_wait_batch(s, keys + i, nkeys - i < _DDP_C10D_BATCH ? nkeys - i : _DDP_C10D_BATCH,
                                 deadline, _ddp_c10d_ms(s, timeout_ms));
    return r;
}

/* Any one key: c10d has no such wait, so CHECK every key, napping 2 ms doubling to 100 ms
 * between rounds. */
_DDP_PRIVATE ddp_result_t _ddp_c10d_wait_any(ddp_store_t *s, const char *const *keys, int nkeys,
                                             int timeout_ms) {
    const int ms = _ddp_c10d_ms(s, timeout_ms);
    const int64_t deadline = _ddp_store_deadline(s, ms);
    int nap = 2;
    for (;;) {
        int i, j, left, exists[_DDP_C10D_BATCH];
        struct timespec ts;
        for (i = 0; i < nkeys; i += _DDP_C10D_BATCH) {
            const int n = nkeys - i < _DDP_C10D_BATCH ? nkeys - i : _DDP_C10D_BATCH;
            ddp_result_t r = _ddp_c10d_exists(s, keys + i, n, exists, _ddp_c10d_after(s, deadline), ms);
            if (r != DDP_SUCCESS) return r;
            for (j = 0; j < n; j++) if (exists[j]) return DDP_SUCCESS;
        }
        left = _ddp_ms_left(deadline);
        if (left == 0)
            return _ddp_store_err(s, DDP_ERR_TIMEOUT, "c10d store %s:%d: none of '%.200s'%s set "
                                  "within %d ms", s->host, s->port, keys[0],
                                  nkeys > 1 ? " and the others" : "", ms);
        if (left > 0 && left < nap) nap = left;
        ts.tv_sec = nap / 1000;
        ts.tv_nsec = (long)(nap % 1000) * 1000000L;
        nanosleep(&ts, NULL);
        nap = nap * 2 > _DDP_C10D_POLL_MAX_MS ? _DDP_C10D_POLL_MAX_MS : nap * 2;
    }
}

/* GET of a missing key makes the legacy daemon close the connection: WAIT for it first, as
 * torch's client does. */
_DDP_PRIVATE ddp_result_t _ddp_c10d_get(ddp_store_t *s, const char *key, void *value, size_t cap,
                                        size_t *len) {
    const int64_t deadline = _ddp_store_deadline(s, s->timeout_ms);
    _ddp_c10d_msg_t m;
    uint64_t n = 0;
    ddp_result_t r = _ddp_c10d_wait_batch(s, &key, 1, deadline, s->timeout_ms);
    int rc;
    if (len) *len = 0;
    if (r == DDP_SUCCESS) r = _ddp_c10d_begin(s, &m, _DDP_CQ_GET);
    if (r != DDP_SUCCESS) return r;
    _ddp_c10d_key(&m, key);
    rc = _ddp_c10d_sendv(s->fd, &m, _ddp_c10d_after(s, deadline));
    if (rc == 0)
        rc = _ddp_c10d_recv_value(s->fd, value, cap, &n, NULL, 0, NULL, _ddp_c10d_after(s, deadline));
    if (rc == _DDP_C10D_TOO_LONG)
        return _ddp_c10d_malformed(s, "GET", key, "a value of %llu bytes announced, over the 64 MiB "
                                   "this client accepts", (unsigned long long)n);
    if (rc != 0) return _ddp_c10d_fail(s, rc, "GET", key, s->timeout_ms, "");
    if (len) *len = (size_t)n;
    return DDP_SUCCESS;
}

_DDP_PRIVATE ddp_result_t _ddp_c10d_add(ddp_store_t *s, const char *key, int64_t delta,
                                        int64_t *result) {
    const int64_t deadline = _ddp_store_deadline(s, s->timeout_ms);
    _ddp_c10d_msg_t m;
    int64_t v = 0;
    ddp_result_t r = _ddp_c10d_begin(s, &m, _DDP_CQ_ADD);
    int rc;
    if (r != DDP_SUCCESS) return r;
    _ddp_c10d_key(&m, key);
    _ddp_c10d_u64(&m, (uint64_t)delta);
    rc = _ddp_c10d_sendv(s->fd, &m, deadline);
    if (rc == 0) rc = _ddp_recv_all(s->fd, &v, sizeof v, deadline);
    if (rc != 0)
        return _ddp_c10d_fail(s, rc, "ADD", key, s->timeout_ms, " (a c10d server closes the "
                              "connection when the key's value is not a decimal number)");
    if (result) *result = v;
    return DDP_SUCCESS;
}

/* COMPARE_SET answers `expected` itself for a missing key (torch's own comment calls it lying):
 * since an existing key equal to `expected` would have become `desired`, getting `expected`
 * back (when it differs from `desired`) means the key is missing, reported here as our store
 * does, as an empty value. When expected == desired a CHECK settles it. */
_DDP_PRIVATE ddp_result_t _ddp_c10d_cas(ddp_store_t *s, const char *key, const void *expected,
                                        size_t expected_len, const void *desired, size_t desired_len,
                                        void *actual, size_t cap, size_t *actual_len) {
    const int64_t deadline = _ddp_store_deadline(s, s->timeout_ms);
    _ddp_c10d_msg_t m;
    uint64_t n = 0;
    int rc, same = 0, exists = 1;
    ddp_result_t r = _ddp_c10d_begin(s, &m, _DDP_CQ_CAS);
    if (actual_len) *actual_len = 0;
    if (r != DDP_SUCCESS) return r;
    _ddp_c10d_key(&m, key);
    _ddp_c10d_str(&m, expected, expected_len);
    _ddp_c10d_str(&m, desired, desired_len);
    rc = _ddp_c10d_sendv(s->fd, &m, deadline);
    if (rc == 0)
        rc = _ddp_c10d_recv_value(s->fd, actual, cap, &n, expected, expected_len, &same, deadline);
    if (rc == _DDP_C10D_TOO_LONG)
        return _ddp_c10d_malformed(s, "COMPARE_SET", key, "a value of %llu bytes announced, over the "
                                   "64 MiB this client accepts", (unsigned long long)n);
    if (rc != 0) return _ddp_c10d_fail(s, rc, "COMPARE_SET", key, s->timeout_ms, "");
    if (expected_len && same) {
        if (desired_len != expected_len || memcmp(desired, expected, expected_len) != 0) exists = 0;
        else if ((r = _ddp_c10d_exists(s, &key, 1, &exists, _ddp_c10d_after(s, deadline),
                                       s->timeout_ms)) != DDP_SUCCESS)
            return r;
    }
    if (actual_len) *actual_len = exists ? (size_t)n : 0;
    return DDP_SUCCESS;
}

_DDP_PRIVATE ddp_result_t _ddp_c10d_delete(ddp_store_t *s, const char *key, int *deleted) {
    const int64_t deadline = _ddp_store_deadline(s, s->timeout_ms);
    _ddp_c10d_msg_t m;
    int64_t v = 0;
    ddp_result_t r = _ddp_c10d_begin(s, &m, _DDP_CQ_DELETE);
    int rc;
    if (r != DDP_SUCCESS) return r;
    _ddp_c10d_key(&m, key);
    rc = _ddp_c10d_sendv(s->fd, &m, deadline);
    if (rc == 0) rc = _ddp_recv_all(s->fd, &v, sizeof v, deadline);
    if (rc != 0) return _ddp_c10d_fail(s, rc, "DELETE_KEY", key, s->timeout_ms, "");
    if (v != 0 && v != 1) return _ddp_c10d_malformed(s, "DELETE_KEY", key, "count %lld", (long long)v);
    if (deleted) *deleted = (int)v;
    return DDP_SUCCESS;
}

/* ---------------------------------------------------------------- the client interface */
_DDP_PRIVATE void _ddp_c10d_connected(ddp_store_t *s) {
    _ddp_store_log(s, DDP_LOG_INFO, "store: connected to c10d TCPStore %s:%d (%s; no "
                   "authentication)", s->host, s->port, _ddp_c10d_dialects[s->c10d - _DDP_C10D_WATCH]);
}

/* The dialect is found at the first connection. No libddp server sends a salt: a fixed one. The
 * key is never sent; it binds the data key (ddp_rendezvous.h), which a guess must then stretch to
 * check. */
_DDP_PRIVATE void _ddp_c10d_prepare(ddp_store_t *s) {
    static const unsigned char c10d_salt[_DDP_AUTH_SALT_BYTES] = {'c', '1', '0', 'd'};
    s->c10d = _DDP_C10D_UNKNOWN;
    _ddp_store_key_for(s, c10d_salt);
}

_DDP_PRIVATE ddp_result_t _ddp_c10d_wait(ddp_store_t *s, const char *const *keys, int nkeys,
                                         int timeout_ms, int any) {
    return any ? _ddp_c10d_wait_any(s, keys, nkeys, timeout_ms) : _ddp_c10d_wait_all(s, keys, nkeys, timeout_ms);
}

_DDP_PRIVATE ddp_result_t _ddp_c10d_check(ddp_store_t *s, const char *key, int *exists) {
    int ex = 0;
    ddp_result_t r = _ddp_c10d_exists(s, &key, 1, &ex, _ddp_store_deadline(s, s->timeout_ms), s->timeout_ms);
    if (r == DDP_SUCCESS && exists) *exists = ex;
    return r;
}

_DDP_PRIVATE const _ddp_store_client_t _ddp_store_c10d = {
    "c10d store", _ddp_c10d_handshake, _ddp_c10d_connected, _ddp_c10d_prepare,
    _ddp_c10d_set, _ddp_c10d_get, _ddp_c10d_add, _ddp_c10d_cas,
    _ddp_c10d_wait, _ddp_c10d_check, _ddp_c10d_delete, NULL};   /* batch: one by one */

#endif /* DDP_STORE_C10D_IMPLEMENTATION */
