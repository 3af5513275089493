/* SPDX-License-Identifier: MIT (see LICENSE) */
/* ddp_store.h — libddp's rendezvous key-value store, client and server (c10d TCPStore
 * semantics). Rank 0 of a communicator serves it on MASTER_ADDR:MASTER_PORT and every rank is a
 * client; it is also usable on its own:
 *
 *     #define DDP_IMPLEMENTATION        // in one .c file (or DDP_STORE_IMPLEMENTATION)
 *     #include "ddp_store.h"
 *
 *     ddp_store_t *s;
 *     ddp_store_open(&s, "127.0.0.1", 29500, is_server, NULL);
 *     ddp_store_set(s, "key", "v", 1);  ddp_store_get(s, "key", buf, sizeof buf, &len);
 *     ddp_store_close(s);
 *
 * RULES: every call blocks at most the store's timeout (desc.timeout_ms, else DDP_TIMEOUT_MS);
 * get and wait block until their keys exist. A store handle is safe to share between threads.
 * A client retries connecting (exponential backoff with jitter) until its timeout: ranks start
 * in any order, and a master flooded by thousands of connects may reset some.
 *
 * JOB SECRET: with one (desc.secret, else DDP_JOB_SECRET) every connection opens with a mutual
 * challenge-response (ddp_auth.h, label "store"): the secret itself never crosses the wire. A
 * client that cannot prove it knows the secret gets one DDP_ERR_AUTH answer and is
 * disconnected; a client refuses (DDP_ERR_AUTH) a master that cannot prove it, or that asks for
 * no secret when the client has one. The proofs are keyed with the secret stretched by PBKDF2
 * (ddp_auth.h: _ddp_auth_job_key) with a salt the server draws at start. Without a secret anyone
 * who reaches the port from another host may use the store, and on this host only the store's
 * own user: that is the insecure mode, fine on loopback or a private network (a WARN says so
 * when the server listens on a network address).
 *
 * THE SERVER listens on `host` when it is a loopback address (then nothing off this machine can
 * connect) or an address of this machine; otherwise, and when host is NULL, on every interface.
 * It logs the address at INFO. Before a connection has authenticated the server reads only the
 * hello (at most 128 bytes, whatever the peer announces) and allocates nothing the peer sizes;
 * a connection that has not authenticated within min(timeout, 10 s) (at least 1 s) is closed.
 * Wrong proofs are throttled per source (see "the throttle" in the implementation): after 3, a
 * source's next proof is checked only after 100 ms, doubling to 2 s. Without a secret, a
 * connection from this host whose socket another user owns is closed unread (sock_diag).
 * Failed handshakes are logged at most once a second, with a count of those not shown. The
 * server raises its soft RLIMIT_NOFILE to the hard limit; when it runs out of descriptors all
 * the same it closes the oldest unauthenticated connection (else refuses the newcomer) and goes
 * on serving. Linux only (epoll).
 *
 * PYTORCH'S STORE: ddp_store_connect_c10d(host, port, timeout_ms, &s) gives the same handle type
 * as a client of a c10d TCPStore: torchrun's agent store (TORCHELASTIC_USE_AGENT_STORE=True), or
 * any torch.distributed.TCPStore started from Python. Every call above works on it unchanged
 * (ddp_store_port returns the port it connected to). Keys get torch's "/" in front on the wire,
 * as Python's TCPStore does: ddp_store_set(s, "k", ...) is what store.get("k") reads in Python.
 * The handle finds out which of the protocol's dialects the server speaks (PyTorch 1.x to 2.x,
 * with or without the VALIDATE handshake that the libuv server of 2.4+ requires; see "c10d" in
 * the implementation). What the c10d protocol lacks: a wait for any one of several keys is
 * emulated by polling CHECK; a timed-out wait withdraws itself with CANCEL_WAIT where the server
 * has it, else the connection is dropped (the next call reconnects); a request the server's
 * dialect has no query for returns DDP_ERR_UNSUPPORTED with a message.
 * NO AUTHENTICATION: c10d has none, and nothing secret is ever sent to a c10d store. Anyone
 * who reaches the port can read and write it, as with torch itself; libddp hands out its data
 * connections' key through the store, so a job rendezvousing through torchrun's store without
 * DDP_JOB_SECRET is exactly as exposed as torch's own processes are. With DDP_JOB_SECRET set on
 * every rank the handle keeps it (never on the wire) and the communicator binds the data key to
 * it, so reading the store does not let a stranger join the data connections.
 * Depends on ddp_base.h, ddp_socket.h and ddp_auth.h (private); link with -pthread.
 */
#if defined(DDP_IMPLEMENTATION) && !defined(DDP_STORE_IMPLEMENTATION)
#define DDP_STORE_IMPLEMENTATION
#endif
#if defined(DDP_STORE_IMPLEMENTATION)
#ifndef DDP_BASE_IMPLEMENTATION
#define DDP_BASE_IMPLEMENTATION
#endif
#ifndef DDP_SOCKET_IMPLEMENTATION
#define DDP_SOCKET_IMPLEMENTATION
#endif
#ifndef DDP_AUTH_IMPLEMENTATION
#define DDP_AUTH_IMPLEMENTATION
#endif
#endif
#include "ddp_base.h"
#include "ddp_socket.h"
#include "ddp_auth.h"

#ifndef DDP_STORE_H_INCLUDED
#define DDP_STORE_H_INCLUDED

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ddp_store ddp_store_t;

/* One server (rank 0 of a communicator, or whoever creates it with is_server = 1); every
 * participant is a client. get/wait block until the key exists or the timeout passes. */
typedef struct ddp_store_desc {
    int timeout_ms;               /* 0: DDP_TIMEOUT_MS, else 600000; < 0 = wait forever */
    const char *secret;           /* NULL: DDP_JOB_SECRET, else none ("" = none) */
    int log_level;                /* as in ddp_comm_desc_t */
    int log_rank;                 /* rank shown in log lines, + 1 (0 = unknown) */
} ddp_store_desc_t;
#define DDP_STORE_MAX_KEY 1024
#define DDP_STORE_MAX_VALUE (16u << 20)
/* host: where clients connect (the server listens there when it can, see above; a server's
 * NULL host listens everywhere and connects its own handle to 127.0.0.1). */
DDP_API ddp_result_t ddp_store_open(ddp_store_t **store, const char *host, int port, int is_server,
                                    const ddp_store_desc_t *desc);
/* A client of PyTorch's c10d TCPStore at host:port (see PYTORCH'S STORE above); connecting is
 * retried with backoff until timeout_ms (0: DDP_TIMEOUT_MS, else 600000; < 0 = forever), which
 * then bounds every call. Close it with ddp_store_close. */
DDP_API ddp_result_t ddp_store_connect_c10d(const char *host, int port, int timeout_ms,
                                            ddp_store_t **out);
DDP_API ddp_result_t ddp_store_close(ddp_store_t *store);
DDP_API ddp_result_t ddp_store_set(ddp_store_t *store, const char *key, const void *value,
                                   size_t len);
/* Waits for the key; copies up to cap bytes; *len = the value's full length. */
DDP_API ddp_result_t ddp_store_get(ddp_store_t *store, const char *key, void *value, size_t cap,
                                   size_t *len);
DDP_API ddp_result_t ddp_store_add(ddp_store_t *store, const char *key, int64_t delta,
                                   int64_t *result);
/* Sets key to desired if its value equals expected (a missing key matches expected_len == 0);
 * *actual receives the value after the call (up to cap bytes, full length in *actual_len). */
DDP_API ddp_result_t ddp_store_compare_set(ddp_store_t *store, const char *key,
                                           const void *expected, size_t expected_len,
                                           const void *desired, size_t desired_len,
                                           void *actual, size_t cap, size_t *actual_len);
DDP_API ddp_result_t ddp_store_wait(ddp_store_t *store, const char *const *keys, int nkeys,
                                    int timeout_ms);        /* 0: the store's timeout */
DDP_API ddp_result_t ddp_store_check(ddp_store_t *store, const char *key, int *exists);
DDP_API ddp_result_t ddp_store_delete(ddp_store_t *store, const char *key, int *deleted);
DDP_API int ddp_store_port(const ddp_store_t *store);       /* server's port (useful with port 0) */
DDP_API const char *ddp_store_last_error(const ddp_store_t *store);

#ifdef __cplusplus
}
#endif
#endif /* DDP_STORE_H_INCLUDED */


/* ============================================================================================
 * IMPLEMENTATION
 * ========================================================================================== */
#if defined(DDP_STORE_IMPLEMENTATION) && !defined(DDP_STORE_IMPL_INCLUDED)
#define DDP_STORE_IMPL_INCLUDED
#if !defined(DDP_SOCKET_IMPL_INCLUDED) || !defined(DDP_AUTH_IMPL_INCLUDED)
#error "libddp: ddp_store.h's implementation needs ddp_base.h's, ddp_socket.h's and ddp_auth.h's (define DDP_IMPLEMENTATION)"
#endif
#if !defined(__linux__)
#error "libddp: ddp_store.h's server needs epoll (Linux)"
#endif
#include <sys/epoll.h>
#include <sys/resource.h>

/* ---------------------------------------------------------------- wire protocol, version 3
 * Native byte order; the magic rejects strangers and peers of the other byte order.
 *   challenge (server -> client, first thing on every connection)
 *            {u32 magic, u32 proto, u32 flags (1: a job secret is required), u32 pad} nonce_s[32]
 *            salt[16] (the server's, drawn at start: the key is the secret stretched with it)
 *   request  {u32 magic, u32 op, u32 klen, u32 v1len, u32 v2len, u32 flags, i64 arg} key v1 v2
 *   response {u32 magic, u32 status, u32 vlen, u32 pad, i64 num} value
 * The client's first request is HELLO: arg = protocol version, v1 = nonce_c, then (flags 1)
 * its proof; the answer's value is the server's proof (ddp_auth.h, label "store", keyed with
 * the stretched secret: a client stretches it once per salt, the server once at start). A wrong
 * proof or version gets one error answer, then the server closes the connection. GET and WAIT
 * are answered when their keys exist, so a client blocks in recv with its own timeout. */
#define _DDP_STORE_MAGIC 0x44445053u /* "DDPS" */
#define _DDP_STORE_PROTO 3u
#define _DDP_STORE_LABEL "store"
#define _DDP_STORE_HELLO_MAX 128            /* body bytes a peer may send before authenticating */
#define _DDP_STORE_HANDSHAKE_MAX_MS 10000
#define _DDP_STORE_HANDSHAKE_MIN_MS 1000
#define _DDP_STORE_BACKLOG 4096             /* a burst of 1,024+ connects; the kernel caps it at somaxconn */
#define _DDP_STORE_BACKOFF_MAX_MS 2000
#define _DDP_STORE_BATCH 64                 /* events per epoll_wait; reads or accepts per event */
/* Wrong proofs (see THE SERVER above): each source gets a few free, then waits BASE ms, doubling
 * per further failure up to MAX, before its next proof is checked (and before its refusal is
 * sent); a source silent for FORGET starts afresh. At most QUEUE of a source's hellos wait for
 * their turn; SOURCES sources are remembered (the least recently failing one goes). */
#define _DDP_STORE_THROTTLE_SOURCES 256
#define _DDP_STORE_THROTTLE_FREE 3
#define _DDP_STORE_THROTTLE_BASE_MS 100
#define _DDP_STORE_THROTTLE_MAX_MS 2000
#define _DDP_STORE_THROTTLE_QUEUE 4
#define _DDP_STORE_THROTTLE_FORGET_MS 60000
#define _DDP_STORE_SHORT_SECRET 16          /* a secret shorter than this gets a WARN */

enum { _DDP_ST_HELLO = 1, _DDP_ST_SET, _DDP_ST_GET, _DDP_ST_ADD, _DDP_ST_CAS, _DDP_ST_WAIT,
       _DDP_ST_CHECK, _DDP_ST_DELETE, _DDP_ST_NUM_OPS };
#define _DDP_ST_WAIT_ANY 1u                 /* WAIT flags: any of the keys is enough */
#define _DDP_ST_HELLO_PROOF 1u              /* HELLO flags: v1 = nonce_c || proof */
#define _DDP_ST_CHAL_SECRET 1u              /* challenge flags: the server requires a proof */

typedef struct { uint32_t magic, op, klen, v1len, v2len, flags; int64_t arg; } _ddp_store_req_t;
typedef struct { uint32_t magic, status, vlen, pad; int64_t num; } _ddp_store_resp_t;
typedef struct {
    uint32_t magic, proto, flags, pad;
    unsigned char nonce[_DDP_AUTH_NONCE_BYTES];
    unsigned char salt[_DDP_AUTH_SALT_BYTES];
} _ddp_store_chal_t;
#define _DDP_STORE_HELLO_BYTES (sizeof(_ddp_store_req_t) + 2 * _DDP_AUTH_NONCE_BYTES)

/* Whom wrong proofs are counted against: an IPv4 address, an IPv6 /64 (one host gets a whole
 * /64), or, for a connection from this host, the user that owns the connecting socket. */
enum { _DDP_SRC_NONE = 0, _DDP_SRC_V4, _DDP_SRC_V6, _DDP_SRC_LOOP, _DDP_SRC_LOOP_ADDR, _DDP_SRC_UID };
typedef struct { unsigned char kind, b[16]; } _ddp_src_t;
typedef struct {
    _ddp_src_t src;
    int used;
    int queued;               /* its hellos waiting for their turn */
    uint32_t failures;
    int64_t last_fail_us;
    int64_t next_us;          /* its next proof is checked no earlier than this */
} _ddp_throttle_t;

typedef struct _ddp_kv {
    struct _ddp_kv *next;
    uint32_t klen, vlen;
    char *key;
    unsigned char *val;
} _ddp_kv_t;

/* A server-side connection. Before it authenticates (state HELLO) it owns this struct, the
 * challenge in `out` and nothing else: the hello's body goes to the fixed `hello` buffer. */
enum { _DDP_CONN_HELLO, _DDP_CONN_READY, _DDP_CONN_CLOSING, _DDP_CONN_DEAD };
typedef struct _ddp_store_conn {
    int fd;                   /* -1: no socket (driven from a buffer, as the fuzzers do) */
    int state;
    int waiting;              /* a GET/WAIT parked until its keys exist */
    int in_pending;           /* on the server's list of unauthenticated connections */
    uint32_t events;          /* what epoll watches for it */
    uint32_t serial;          /* never 0; with slot, the epoll token (_ddp_store_token) */
    size_t slot;              /* index in the server's connection table (stable while it lives) */
    struct _ddp_store_conn *prev, *next;   /* pending list (accept order), or the dead list */
    int64_t deadline_us;      /* authenticate before this, or be closed */
    unsigned char nonce[_DDP_AUTH_NONCE_BYTES];   /* our challenge's nonce */
    unsigned char head[sizeof(_ddp_store_req_t)]; /* the request header being read */
    size_t head_len, body_len, body_need;
    unsigned char hello[_DDP_STORE_HELLO_MAX];    /* the body before authentication */
    unsigned char *in;        /* the body after authentication (kept while waiting) */
    size_t in_cap;
    unsigned char *out;       /* answers not yet sent */
    size_t out_len, out_off, out_cap;
    char addr[64];
    _ddp_src_t src;           /* for the throttle */
    int held;                 /* 1: its hello waits for its source's turn; 2: its refusal waits */
    int64_t held_until_us;
    struct _ddp_store_conn *hprev, *hnext;   /* the server's held list */
} _ddp_store_conn_t;

/* At most one log line a second per kind of trouble; the next line counts the others. */
typedef struct { int64_t last_us; unsigned long suppressed; } _ddp_store_rate_t;

#define _DDP_KV_BUCKETS 1024
struct ddp_store {
    /* client side */
    int fd;
    pid_t owner_pid;          /* the process that opened the handle (not a forked child) */
    pthread_mutex_t mu;
    char host[256];
    int port;
    int timeout_ms;
    int64_t bound_us;         /* 0, or no request (connecting included) waits past it */
    int quick;                /* failure reporting: short waits, no reconnecting to a dead master */
    int c10d;                 /* 0: libddp's protocol; else a c10d client, its dialect (_DDP_C10D_*) */
    int log_level, log_rank;
    char secret[256];         /* the job secret: never written to a socket or a log */
    unsigned char key[_DDP_SHA256_BYTES];   /* the secret stretched with `salt` (ddp_auth.h:
                                             * _ddp_auth_job_key): the HMAC key of every proof */
    size_t keylen;            /* 0: no key yet (or no job secret) */
    unsigned char salt[_DDP_AUTH_SALT_BYTES];   /* the server's (in every challenge) */
    char last_error[512];
    /* server side (the store was opened with is_server); the server thread owns all of it but
     * stop (atomic) and nclients (srv_mu) */
    int listen_fd;
    int wake[2];
    int epfd;
    int spare_fd;             /* given up to refuse a connection when out of descriptors */
    pthread_t thread;
    int thread_started;
    int stop;                 /* set once by ddp_store_close; atomic access */
    pthread_mutex_t srv_mu;   /* guards nclients for ddp_store_close */
    int nclients;             /* authenticated connections */
    int handshake_ms;
    _ddp_store_conn_t **conns;  /* by slot; NULL = free (a slot keeps its connection for life) */
    size_t *free_slots;       /* freed slots, reused first; as many entries as conns */
    size_t nconns, conns_hwm, conns_cap, nfree;   /* live, slots ever used, allocated, free */
    uint32_t next_serial;
    _ddp_store_conn_t *pending_head, *pending_tail;   /* unauthenticated, oldest first */
    int npending, max_pending;  /* how many; at most a quarter of the descriptors (set at start) */
    _ddp_store_conn_t *dead;  /* dropped during this round; freed at its end */
    int nwaiting;
    int changed;              /* a key was written: parked GET/WAITs may be answerable */
    int64_t accept_resume_us; /* accepting paused until then (0: not paused) */
    _ddp_store_rate_t rate_peer, rate_fds, rate_throttle, rate_uid;
    int diag_fd;              /* NETLINK_SOCK_DIAG: who owns a local peer's socket (-1: none) */
    uid_t euid;
    _ddp_throttle_t *throttle;   /* _DDP_STORE_THROTTLE_SOURCES, allocated at start (a secret) */
    _ddp_store_conn_t *held_head, *held_tail;   /* connections the throttle holds back */
    int64_t held_next_us;     /* the earliest held_until_us (0: none held) */
    _ddp_kv_t *buckets[_DDP_KV_BUCKETS];
};

_DDP_PRIVATE void _ddp_store_log(const ddp_store_t *s, int level, const char *fmt, ...) {
    va_list ap;
    if (!s || s->log_level < level) return;
    va_start(ap, fmt);
    _ddp_vlog(s->log_rank - 1, level, fmt, ap);
    va_end(ap);
}

_DDP_PRIVATE ddp_result_t _ddp_store_err(ddp_store_t *s, ddp_result_t r, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s->last_error, sizeof s->last_error, fmt, ap);
    va_end(ap);
    _ddp_store_log(s, DDP_LOG_WARN, "store: %s (%s)", s->last_error, ddp_strerror(r));
    return r;
}

/* A WARN line, unless one of this kind went out less than a second ago (then it is counted). */
_DDP_PRIVATE void _ddp_store_warn_rate(ddp_store_t *s, _ddp_store_rate_t *rl, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    int64_t now = _ddp_now_us();
    if (s->log_level < DDP_LOG_WARN) return;
    if (rl->last_us && now - rl->last_us < 1000000) { rl->suppressed++; return; }
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (rl->suppressed)
        _ddp_store_log(s, DDP_LOG_WARN, "%s (and %lu more like it since the last such line)", msg, rl->suppressed);
    else
        _ddp_store_log(s, DDP_LOG_WARN, "%s", msg);
    rl->last_us = now;
    rl->suppressed = 0;
}

/* ---------------------------------------------------------------- key-value table */
_DDP_PRIVATE _ddp_kv_t **_ddp_kv_slot(ddp_store_t *s, const char *key, uint32_t klen) {
    _ddp_kv_t **pp = &s->buckets[_ddp_fnv1a(key, klen, _DDP_FNV_INIT) % _DDP_KV_BUCKETS];
    while (*pp && !((*pp)->klen == klen && memcmp((*pp)->key, key, klen) == 0)) pp = &(*pp)->next;
    return pp;
}

_DDP_PRIVATE int _ddp_kv_put(ddp_store_t *s, const char *key, uint32_t klen, const void *val,
                             uint32_t vlen) {
    _ddp_kv_t **pp = _ddp_kv_slot(s, key, klen), *e = *pp;
    unsigned char *v = (unsigned char *)DDP_MALLOC(vlen ? vlen : 1);
    if (!v) return -1;
    if (vlen) memcpy(v, val, vlen);
    if (!e) {
        e = (_ddp_kv_t *)DDP_MALLOC(sizeof *e);
        if (!e) { DDP_FREE(v); return -1; }
        e->key = (char *)DDP_MALLOC(klen ? klen : 1);
        if (!e->key) { DDP_FREE(v); DDP_FREE(e); return -1; }
        if (klen) memcpy(e->key, key, klen);
        e->klen = klen;
        e->next = NULL;
        *pp = e;
    } else {
        DDP_FREE(e->val);
    }
    e->val = v;
    e->vlen = vlen;
    s->changed = 1;
    return 0;
}

/* Keys of a WAIT are NUL-separated in the key field. 1 when the wait is satisfied. */
_DDP_PRIVATE int _ddp_store_wait_ready(ddp_store_t *s, const char *keys, uint32_t klen, int any) {
    uint32_t off = 0;
    int all = 1;
    while (off < klen) {
        uint32_t n = 0;
        while (off + n < klen && keys[off + n]) n++;
        if (*_ddp_kv_slot(s, keys + off, n)) { if (any) return 1; }
        else all = 0;
        off += n + 1;
    }
    return any ? 0 : all;
}

/* ---------------------------------------------------------------- a connection's output */
/* Queues a + b for sending; -1 when out of memory (the connection is dropped). */
_DDP_PRIVATE int _ddp_conn_queue(_ddp_store_conn_t *c, const void *a, size_t na, const void *b,
                                 size_t nb) {
    size_t need;
    if (c->out_off) {
        memmove(c->out, c->out + c->out_off, c->out_len - c->out_off);
        c->out_len -= c->out_off;
        c->out_off = 0;
    }
    need = c->out_len + na + nb;
    if (need > c->out_cap) {
        size_t cap = need < 128 ? 128 : need + need / 2;
        unsigned char *p = (unsigned char *)DDP_MALLOC(cap);
        if (!p) return -1;
        if (c->out_len) memcpy(p, c->out, c->out_len);
        DDP_FREE(c->out);
        c->out = p;
        c->out_cap = cap;
    }
    if (na) memcpy(c->out + c->out_len, a, na);
    if (nb) memcpy(c->out + c->out_len + na, b, nb);
    c->out_len += na + nb;
    return 0;
}

_DDP_PRIVATE int _ddp_conn_reply(_ddp_store_conn_t *c, uint32_t status, int64_t num,
                                 const void *val, uint32_t vlen) {
    _ddp_store_resp_t r;
    r.magic = _DDP_STORE_MAGIC; r.status = status; r.vlen = vlen; r.pad = 0; r.num = num;
    return _ddp_conn_queue(c, &r, sizeof r, val, vlen);
}

/* Sends what is queued, as far as the socket takes it; -1 if the peer is gone. */
_DDP_PRIVATE int _ddp_conn_flush(_ddp_store_conn_t *c) {
    while (c->fd >= 0 && c->out_off < c->out_len) {
        ssize_t w = send(c->fd, c->out + c->out_off, c->out_len - c->out_off, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w > 0) { c->out_off += (size_t)w; continue; }
        if (w < 0 && errno == EINTR) continue;
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return 0;
        return -1;
    }
    if (c->fd >= 0 && c->out_off == c->out_len) {
        c->out_off = c->out_len = 0;
        /* An idle or unauthenticated connection keeps no buffer; a 16 MiB answer's goes. */
        if (c->state != _DDP_CONN_READY || c->out_cap > ((size_t)1 << 16)) {
            DDP_FREE(c->out);
            c->out = NULL;
            c->out_cap = 0;
        }
    }
    return 0;
}

/* What epoll hands back for a connection: its serial and slot, not its address. An event that
 * outlives its connection (dropped earlier in the same batch, or a slot since reused) then
 * names nothing instead of freed memory. Serial 0 is the server's own descriptors. */
#define _DDP_STORE_TOKEN_WAKE 0u
#define _DDP_STORE_TOKEN_LISTEN 1u
_DDP_PRIVATE uint64_t _ddp_store_token(const _ddp_store_conn_t *c) {
    return ((uint64_t)c->serial << 32) | (uint64_t)(uint32_t)c->slot;
}

_DDP_PRIVATE _ddp_store_conn_t *_ddp_store_conn_of(const ddp_store_t *s, uint64_t token) {
    uint32_t serial = (uint32_t)(token >> 32);
    size_t slot = (size_t)(uint32_t)token;
    _ddp_store_conn_t *c;
    if (serial == 0 || slot >= s->conns_hwm || !(c = s->conns[slot])) return NULL;
    return c->serial == serial && c->state != _DDP_CONN_DEAD ? c : NULL;
}

/* Every descriptor leaves epoll before it is closed. Closing is not enough: a registration
 * belongs to the open file, which lives on while any copy of the descriptor does (a child
 * forked after the server started holds copies of them all), and it would go on reporting
 * events for a connection the server has freed. */
_DDP_PRIVATE void _ddp_store_close_fd(ddp_store_t *s, int fd) {
    if (fd < 0) return;
    if (s->epfd >= 0) epoll_ctl(s->epfd, EPOLL_CTL_DEL, fd, NULL);   /* ENOENT when not watched */
    close(fd);
}

/* Closes the client's connection. In the process that opened it, the connection ends for the
 * server too, even where a forked child holds a copy of the descriptor (close alone would leave
 * the socket open: a parked request, or a server's close waiting for its clients to leave). In
 * such a child only its copy goes: the connection is the parent's. */
_DDP_PRIVATE void _ddp_store_hangup(ddp_store_t *s) {
    if (s->fd < 0) return;
    if (getpid() == s->owner_pid) shutdown(s->fd, SHUT_RDWR);
    close(s->fd);
    s->fd = -1;
}

/* epoll interest: input unless closing, output while something is queued. */
_DDP_PRIVATE void _ddp_conn_watch(ddp_store_t *s, _ddp_store_conn_t *c) {
    struct epoll_event ev;
    uint32_t want = c->state == _DDP_CONN_CLOSING || c->held ? 0u : (uint32_t)EPOLLIN;
    if (s->epfd < 0 || c->fd < 0 || c->state == _DDP_CONN_DEAD) return;
    if (c->out_len > c->out_off && !c->held) want |= (uint32_t)EPOLLOUT;
    if (want == c->events) return;
    memset(&ev, 0, sizeof ev);
    ev.events = want;
    ev.data.u64 = _ddp_store_token(c);
    if (epoll_ctl(s->epfd, EPOLL_CTL_MOD, c->fd, &ev) == 0) c->events = want;
}

/* ---------------------------------------------------------------- wrong proofs: the throttle
 * Guessing the secret online costs a source one proof per turn: after _DDP_STORE_THROTTLE_FREE
 * wrong proofs, each further one makes the source wait 100 ms, 200 ms, ... up to 2 s before its
 * next proof is even checked, and holds the refusal for the same time (so one thread trying in
 * sequence, and many connections trying at once, both get one check per turn). A correct proof
 * from a penalised source waits for the turn too: answering it at once would tell a guesser with
 * many connections which one was right. Never a sleep: held connections are timers in the loop.
 * A connection from this host is counted against the user that owns its socket (sock_diag), so
 * another user hammering 127.0.0.1 does not delay the job's own ranks. */
_DDP_PRIVATE void _ddp_src_from(_ddp_src_t *src, const struct sockaddr *sa) {
    struct sockaddr_storage ss;
    memset(src, 0, sizeof *src);
    memset(&ss, 0, sizeof ss);
    memcpy(&ss, sa, sa->sa_family == AF_INET6 ? sizeof(struct sockaddr_in6) : sizeof(struct sockaddr_in));
    _ddp_sa_unmap(&ss);
    if (ss.ss_family == AF_INET) {
        src->kind = _ddp_sockaddr_is_loopback((struct sockaddr *)&ss) ? _DDP_SRC_LOOP : _DDP_SRC_V4;
        memcpy(src->b, &((struct sockaddr_in *)(void *)&ss)->sin_addr, 4);
    } else if (ss.ss_family == AF_INET6) {
        const struct in6_addr *a = &((struct sockaddr_in6 *)(void *)&ss)->sin6_addr;
        src->kind = IN6_IS_ADDR_LOOPBACK(a) ? _DDP_SRC_LOOP : _DDP_SRC_V6;
        memcpy(src->b, a, src->kind == _DDP_SRC_LOOP ? 16 : 8);
    }
}

/* A loopback source becomes its socket's owner when sock_diag can tell (once per connection). */
_DDP_PRIVATE void _ddp_src_resolve(ddp_store_t *s, _ddp_store_conn_t *c) {
    uid_t uid = 0;
    if (c->src.kind != _DDP_SRC_LOOP) return;
    if (c->fd >= 0 && _ddp_tcp_peer_uid(s->diag_fd, c->fd, &uid) == 0) {
        memset(c->src.b, 0, sizeof c->src.b);
        memcpy(c->src.b, &uid, sizeof uid);
        c->src.kind = _DDP_SRC_UID;
    } else {
        c->src.kind = _DDP_SRC_LOOP_ADDR;
    }
}

/* The source's entry (add: make one, evicting the one that failed least recently, preferring
 * one with nothing queued). NULL when there is none (or no table: the fuzzers' store). */
_DDP_PRIVATE _ddp_throttle_t *_ddp_throttle_find(ddp_store_t *s, const _ddp_src_t *src, int add) {
    _ddp_throttle_t *victim = NULL;
    int i;
    if (!s->throttle) return NULL;
    for (i = 0; i < _DDP_STORE_THROTTLE_SOURCES; i++) {
        _ddp_throttle_t *e = &s->throttle[i];
        if (e->used && !memcmp(&e->src, src, sizeof *src)) return e;
        if (!add) continue;
        if (!e->used) { if (!victim || victim->used) victim = e; continue; }
        if (!victim || (victim->used && ((victim->queued && !e->queued) ||
                                         (!victim->queued == !e->queued && e->last_fail_us < victim->last_fail_us))))
            victim = e;
    }
    if (!victim) return NULL;
    memset(victim, 0, sizeof *victim);
    victim->src = *src;
    victim->used = 1;
    return victim;
}

_DDP_PRIVATE void _ddp_held_add(ddp_store_t *s, _ddp_store_conn_t *c, int held, int64_t until) {
    c->held = held;
    c->held_until_us = until;
    c->hnext = NULL;
    c->hprev = s->held_tail;
    if (s->held_tail) s->held_tail->hnext = c; else s->held_head = c;
    s->held_tail = c;
    if (!s->held_next_us || until < s->held_next_us) s->held_next_us = until;
}

_DDP_PRIVATE void _ddp_held_unlink(ddp_store_t *s, _ddp_store_conn_t *c) {
    if (!c->held) return;
    if (c->held == 1) {
        _ddp_throttle_t *e = _ddp_throttle_find(s, &c->src, 0);
        if (e && e->queued > 0) e->queued--;
    }
    if (c->hprev) c->hprev->hnext = c->hnext; else s->held_head = c->hnext;
    if (c->hnext) c->hnext->hprev = c->hprev; else s->held_tail = c->hprev;
    c->hprev = c->hnext = NULL;
    c->held = 0;
}

/* Before checking a proof: 0 check it now, 1 held until the source's turn, -1 the source has
 * _DDP_STORE_THROTTLE_QUEUE hellos waiting already (closed unanswered: nothing was checked). */
_DDP_PRIVATE int _ddp_throttle_admit(ddp_store_t *s, _ddp_store_conn_t *c) {
    _ddp_throttle_t *e;
    int64_t now;
    int i, any = 0;
    if (!s->throttle) return 0;
    for (i = 0; i < _DDP_STORE_THROTTLE_SOURCES && !any; i++) any = s->throttle[i].used;
    if (!any) return 0;                   /* nobody failed yet: no sock_diag query either */
    _ddp_src_resolve(s, c);
    now = _ddp_now_us();
    if (!(e = _ddp_throttle_find(s, &c->src, 0)) || now >= e->next_us) return 0;
    if (e->queued >= _DDP_STORE_THROTTLE_QUEUE) {
        _ddp_store_warn_rate(s, &s->rate_throttle, "store: %s: %d hellos of this source already wait for "
                             "their turn after %u wrong proofs; closed this one unanswered", c->addr,
                             e->queued, e->failures);
        return -1;
    }
    e->queued++;
    _ddp_held_add(s, c, 1, e->next_us);
    return 1;
}

/* A wrong proof: counted against the source; past the free ones the refusal is held back. */
_DDP_PRIVATE void _ddp_throttle_failed(ddp_store_t *s, _ddp_store_conn_t *c) {
    int64_t now = _ddp_now_us(), ms;
    uint32_t k;
    _ddp_throttle_t *e;
    _ddp_src_resolve(s, c);
    if (!(e = _ddp_throttle_find(s, &c->src, 1))) return;
    if (now - e->last_fail_us > (int64_t)_DDP_STORE_THROTTLE_FORGET_MS * 1000) e->failures = 0;
    e->failures++;
    e->last_fail_us = now;
    if (e->failures <= _DDP_STORE_THROTTLE_FREE) return;
    k = e->failures - _DDP_STORE_THROTTLE_FREE - 1;
    ms = k >= 16 ? _DDP_STORE_THROTTLE_MAX_MS : (int64_t)_DDP_STORE_THROTTLE_BASE_MS << k;
    if (ms > _DDP_STORE_THROTTLE_MAX_MS) ms = _DDP_STORE_THROTTLE_MAX_MS;
    if (ms > s->handshake_ms / 2) ms = s->handshake_ms / 2;   /* a waiting rank still makes it */
    e->next_us = now + ms * 1000;
    if (c->fd >= 0) _ddp_held_add(s, c, 2, e->next_us);
    _ddp_store_warn_rate(s, &s->rate_throttle, "store: %u wrong proofs from %s's source: its next proof "
                         "waits %lld ms", e->failures, c->addr, (long long)ms);
}

/* ---------------------------------------------------------------- connections come and go */
_DDP_PRIVATE void _ddp_pending_unlink(ddp_store_t *s, _ddp_store_conn_t *c) {
    if (!c->in_pending) return;
    if (c->prev) c->prev->next = c->next; else s->pending_head = c->next;
    if (c->next) c->next->prev = c->prev; else s->pending_tail = c->prev;
    c->prev = c->next = NULL;
    c->in_pending = 0;
    s->npending--;
}

/* Closes a connection now and frees its slot; its memory is freed by _ddp_store_reap (the
 * handler that dropped it may still hold it; events of this round no longer find it). */
_DDP_PRIVATE void _ddp_store_drop(ddp_store_t *s, _ddp_store_conn_t *c) {
    if (c->state == _DDP_CONN_DEAD) return;
    _ddp_pending_unlink(s, c);
    _ddp_held_unlink(s, c);
    if (c->state == _DDP_CONN_READY) {
        pthread_mutex_lock(&s->srv_mu);
        s->nclients--;
        pthread_mutex_unlock(&s->srv_mu);
    }
    if (c->waiting) { c->waiting = 0; s->nwaiting--; }
    s->conns[c->slot] = NULL;
    s->free_slots[s->nfree++] = c->slot;
    s->nconns--;
    _ddp_store_close_fd(s, c->fd);
    c->fd = -1;
    c->state = _DDP_CONN_DEAD;
    c->next = s->dead;
    s->dead = c;
}

_DDP_PRIVATE void _ddp_store_reap(ddp_store_t *s) {
    while (s->dead) {
        _ddp_store_conn_t *c = s->dead;
        s->dead = c->next;
        DDP_FREE(c->in);
        DDP_FREE(c->out);
        DDP_FREE(c);
    }
}

/* A new connection (fd < 0: none, for driving the parser from a buffer): it joins the table and
 * the pending list, and its challenge is queued. NULL when out of memory or randomness. */
_DDP_PRIVATE _ddp_store_conn_t *_ddp_store_conn_new(ddp_store_t *s, int fd, const char *addr) {
    _ddp_store_conn_t *c;
    _ddp_store_chal_t ch;
    size_t slot;
    if (!s->nfree && s->conns_hwm == s->conns_cap) {
        size_t cap = s->conns_cap ? s->conns_cap * 2 : 64;
        _ddp_store_conn_t **t = (_ddp_store_conn_t **)DDP_MALLOC(sizeof *t * cap);
        size_t *f = (size_t *)DDP_MALLOC(sizeof *f * cap);
        if (!t || !f) { DDP_FREE(t); DDP_FREE(f); return NULL; }
        if (s->conns_hwm) memcpy(t, s->conns, sizeof *t * s->conns_hwm);
        DDP_FREE(s->conns);
        DDP_FREE(s->free_slots);
        s->conns = t;
        s->free_slots = f;
        s->conns_cap = cap;
    }
    c = (_ddp_store_conn_t *)DDP_MALLOC(sizeof *c);
    if (!c) return NULL;
    memset(c, 0, sizeof *c);
    c->fd = fd;
    c->state = _DDP_CONN_HELLO;
    slot = s->nfree ? s->free_slots[s->nfree - 1] : s->conns_hwm;
    c->slot = slot;
    if (++s->next_serial == 0) s->next_serial = 1;
    c->serial = s->next_serial;
    _ddp_strlcpy(c->addr, addr, sizeof c->addr);
    memset(&ch, 0, sizeof ch);
    if (_ddp_auth_nonce(c->nonce) != 0) { DDP_FREE(c); return NULL; }   /* never a weak nonce */
    ch.magic = _DDP_STORE_MAGIC;
    ch.proto = _DDP_STORE_PROTO;
    ch.flags = s->keylen ? _DDP_ST_CHAL_SECRET : 0u;
    memcpy(ch.nonce, c->nonce, sizeof ch.nonce);
    memcpy(ch.salt, s->salt, sizeof ch.salt);
    if (_ddp_conn_queue(c, &ch, sizeof ch, NULL, 0) != 0) { DDP_FREE(c); return NULL; }
    if (fd >= 0 && s->epfd >= 0) {
        struct epoll_event ev;
        memset(&ev, 0, sizeof ev);
        ev.events = EPOLLIN;
        ev.data.u64 = _ddp_store_token(c);
        if (epoll_ctl(s->epfd, EPOLL_CTL_ADD, fd, &ev) != 0) { DDP_FREE(c->out); DDP_FREE(c); return NULL; }
        c->events = EPOLLIN;
    }
    c->deadline_us = _ddp_now_us() + (int64_t)s->handshake_ms * 1000;
    if (s->nfree) s->nfree--;
    else s->conns_hwm++;
    s->conns[slot] = c;
    s->nconns++;
    c->in_pending = 1;
    s->npending++;
    c->prev = s->pending_tail;
    if (s->pending_tail) s->pending_tail->next = c; else s->pending_head = c;
    s->pending_tail = c;
    return c;
}

/* ---------------------------------------------------------------- one handler per request
 * Each gets the complete request and answers it: 0 answered, 1 parked (GET/WAIT whose keys do
 * not exist yet: run again after the next write), 2 answered and the connection closes once the
 * answer is out, 3 (HELLO) held by the throttle: run again at its source's turn, -1 drop the
 * connection now. */
typedef struct {
    _ddp_store_req_t rq;
    const char *key;
    const unsigned char *v1, *v2;
} _ddp_store_msg_t;

_DDP_PRIVATE int _ddp_store_on_hello(ddp_store_t *s, _ddp_store_conn_t *c, const _ddp_store_msg_t *m) {
    const size_t keylen = s->keylen;
    const int need_proof = keylen != 0, has_proof = (m->rq.flags & _DDP_ST_HELLO_PROOF) != 0;
    unsigned char proof[_DDP_AUTH_PROOF_BYTES];
    if (c->state != _DDP_CONN_HELLO || m->rq.klen || m->rq.v2len ||
        m->rq.v1len != _DDP_AUTH_NONCE_BYTES + (has_proof ? _DDP_AUTH_PROOF_BYTES : 0u)) {
        _ddp_store_warn_rate(s, &s->rate_peer, "store: malformed hello from %s; connection closed", c->addr);
        return -1;
    }
    if (m->rq.arg != (int64_t)_DDP_STORE_PROTO) {
        _ddp_store_warn_rate(s, &s->rate_peer, "store: client %s speaks store protocol %lld, this "
                             "master %u (mixed libddp versions?); connection closed", c->addr,
                             (long long)m->rq.arg, _DDP_STORE_PROTO);
        return _ddp_conn_reply(c, DDP_ERR_MISMATCH, 0, NULL, 0) ? -1 : 2;
    }
    if (need_proof && has_proof) {
        int t = _ddp_throttle_admit(s, c);
        if (t) return t > 0 ? 3 : -1;
    }
    if (need_proof != has_proof ||
        (need_proof && !_ddp_auth_verify(s->key, keylen, _DDP_AUTH_CLIENT, _DDP_STORE_LABEL,
                                         c->nonce, m->v1, m->v1 + _DDP_AUTH_NONCE_BYTES))) {
        _ddp_store_warn_rate(s, &s->rate_peer, "store: %s failed to authenticate (%s); connection "
                             "closed", c->addr, !has_proof ? "no job secret" : need_proof ?
                             "wrong job secret" : "it has a job secret and this store has none");
        if (_ddp_conn_reply(c, DDP_ERR_AUTH, 0, NULL, 0)) return -1;
        if (need_proof && has_proof) _ddp_throttle_failed(s, c);
        return 2;
    }
    if (need_proof)
        _ddp_auth_proof(s->key, keylen, _DDP_AUTH_SERVER, _DDP_STORE_LABEL, c->nonce, m->v1, proof);
    if (_ddp_conn_reply(c, DDP_SUCCESS, 0, proof, need_proof ? _DDP_AUTH_PROOF_BYTES : 0u)) return -1;
    _ddp_pending_unlink(s, c);
    c->state = _DDP_CONN_READY;
    pthread_mutex_lock(&s->srv_mu);
    s->nclients++;
    pthread_mutex_unlock(&s->srv_mu);
    _ddp_store_log(s, DDP_LOG_TRACE, "store: client %s authenticated", c->addr);
    return 0;
}

_DDP_PRIVATE int _ddp_store_on_set(ddp_store_t *s, _ddp_store_conn_t *c, const _ddp_store_msg_t *m) {
    if (_ddp_kv_put(s, m->key, m->rq.klen, m->v1, m->rq.v1len))
        return _ddp_conn_reply(c, DDP_ERR_OUT_OF_MEMORY, 0, NULL, 0);
    return _ddp_conn_reply(c, DDP_SUCCESS, 0, NULL, 0);
}

_DDP_PRIVATE int _ddp_store_on_get(ddp_store_t *s, _ddp_store_conn_t *c, const _ddp_store_msg_t *m) {
    _ddp_kv_t *e = *_ddp_kv_slot(s, m->key, m->rq.klen);
    if (!e) return 1;
    return _ddp_conn_reply(c, DDP_SUCCESS, e->vlen, e->val, e->vlen);
}

_DDP_PRIVATE int _ddp_store_on_add(ddp_store_t *s, _ddp_store_conn_t *c, const _ddp_store_msg_t *m) {
    _ddp_kv_t *e = *_ddp_kv_slot(s, m->key, m->rq.klen);
    char buf[32];
    long long cur = 0;
    if (e) {
        char tmp[32];
        size_t n = e->vlen < sizeof tmp - 1 ? e->vlen : sizeof tmp - 1;
        memcpy(tmp, e->val, n);
        tmp[n] = 0;
        cur = strtoll(tmp, NULL, 10);
    }
    cur = (long long)((unsigned long long)cur + (unsigned long long)m->rq.arg);
    snprintf(buf, sizeof buf, "%lld", cur);
    if (_ddp_kv_put(s, m->key, m->rq.klen, buf, (uint32_t)strlen(buf)))
        return _ddp_conn_reply(c, DDP_ERR_OUT_OF_MEMORY, 0, NULL, 0);
    return _ddp_conn_reply(c, DDP_SUCCESS, cur, NULL, 0);
}

_DDP_PRIVATE int _ddp_store_on_cas(ddp_store_t *s, _ddp_store_conn_t *c, const _ddp_store_msg_t *m) {
    _ddp_kv_t *e = *_ddp_kv_slot(s, m->key, m->rq.klen);
    if ((!e && m->rq.v1len == 0) ||
        (e && e->vlen == m->rq.v1len && memcmp(e->val, m->v1, m->rq.v1len) == 0)) {
        if (_ddp_kv_put(s, m->key, m->rq.klen, m->v2, m->rq.v2len))
            return _ddp_conn_reply(c, DDP_ERR_OUT_OF_MEMORY, 0, NULL, 0);
        e = *_ddp_kv_slot(s, m->key, m->rq.klen);
    }
    if (e) return _ddp_conn_reply(c, DDP_SUCCESS, e->vlen, e->val, e->vlen);
    return _ddp_conn_reply(c, DDP_SUCCESS, 0, NULL, 0);
}

_DDP_PRIVATE int _ddp_store_on_wait(ddp_store_t *s, _ddp_store_conn_t *c, const _ddp_store_msg_t *m) {
    if (!_ddp_store_wait_ready(s, m->key, m->rq.klen, (m->rq.flags & _DDP_ST_WAIT_ANY) != 0)) return 1;
    return _ddp_conn_reply(c, DDP_SUCCESS, 0, NULL, 0);
}

_DDP_PRIVATE int _ddp_store_on_check(ddp_store_t *s, _ddp_store_conn_t *c, const _ddp_store_msg_t *m) {
    return _ddp_conn_reply(c, DDP_SUCCESS, *_ddp_kv_slot(s, m->key, m->rq.klen) != NULL, NULL, 0);
}

_DDP_PRIVATE int _ddp_store_on_delete(ddp_store_t *s, _ddp_store_conn_t *c, const _ddp_store_msg_t *m) {
    _ddp_kv_t **pp = _ddp_kv_slot(s, m->key, m->rq.klen), *e = *pp;
    if (e) {
        *pp = e->next;
        DDP_FREE(e->key); DDP_FREE(e->val); DDP_FREE(e);
    }
    return _ddp_conn_reply(c, DDP_SUCCESS, e != NULL, NULL, 0);
}

typedef int (*_ddp_store_handler_t)(ddp_store_t *, _ddp_store_conn_t *, const _ddp_store_msg_t *);
static const _ddp_store_handler_t _ddp_store_handlers[_DDP_ST_NUM_OPS] = {
    NULL, _ddp_store_on_hello, _ddp_store_on_set, _ddp_store_on_get, _ddp_store_on_add,
    _ddp_store_on_cas, _ddp_store_on_wait, _ddp_store_on_check, _ddp_store_on_delete};

/* ---------------------------------------------------------------- reading requests
 * Requests are read in place, exactly as many bytes as the current one still needs: first the
 * header, then the body its lengths announce (checked before anything is sized from them).
 * _ddp_conn_rx_space says where the next bytes go, _ddp_conn_rx_done takes n of them there;
 * the socket loop recv()s between the two, _ddp_store_feed memcpy()s (tests, fuzzers). */
static const unsigned char _ddp_store_nothing[1] = {0};

/* The header is complete: may it be read further? Sizes the body buffer. 0 or -1 (drop). */
_DDP_PRIVATE int _ddp_store_check_head(ddp_store_t *s, _ddp_store_conn_t *c) {
    _ddp_store_req_t rq;
    uint64_t body;
    memcpy(&rq, c->head, sizeof rq);
    body = (uint64_t)rq.klen + rq.v1len + rq.v2len;
    if (c->state == _DDP_CONN_HELLO) {
        if (rq.magic != _DDP_STORE_MAGIC || rq.op != _DDP_ST_HELLO || body > _DDP_STORE_HELLO_MAX) {
            _ddp_store_warn_rate(s, &s->rate_peer, "store: %s sent %s before authenticating; connection "
                                 "closed", c->addr, rq.magic != _DDP_STORE_MAGIC ? "bytes that are not "
                                 "the store protocol" : rq.op != _DDP_ST_HELLO ? "a request" :
                                 "an oversized hello");
            return -1;
        }
        c->body_need = (size_t)body;
        return 0;
    }
    if (rq.magic != _DDP_STORE_MAGIC || rq.op <= _DDP_ST_HELLO || rq.op >= _DDP_ST_NUM_OPS ||
        rq.klen > DDP_STORE_MAX_KEY * 64u || rq.v1len > DDP_STORE_MAX_VALUE ||
        rq.v2len > DDP_STORE_MAX_VALUE) {
        _ddp_store_log(s, DDP_LOG_WARN, "store: malformed request from %s (magic %08x op %u); "
                       "connection dropped", c->addr, rq.magic, rq.op);
        return -1;
    }
    c->body_need = (size_t)body;
    if (c->body_need > c->in_cap) {
        DDP_FREE(c->in);
        c->in_cap = 0;
        c->in = (unsigned char *)DDP_MALLOC(c->body_need);
        if (!c->in) {
            _ddp_store_log(s, DDP_LOG_WARN, "store: no memory for a %zu-byte request from %s; "
                           "connection dropped", c->body_need, c->addr);
            return -1;
        }
        c->in_cap = c->body_need;
    }
    return 0;
}

/* Runs the complete request in head/body. 0, or -1 to drop the connection. */
_DDP_PRIVATE int _ddp_store_execute(ddp_store_t *s, _ddp_store_conn_t *c) {
    _ddp_store_msg_t m;
    const unsigned char *body = c->state == _DDP_CONN_HELLO ? c->hello : c->in ? c->in : _ddp_store_nothing;
    int r;
    memcpy(&m.rq, c->head, sizeof m.rq);
    m.key = (const char *)body;
    m.v1 = body + m.rq.klen;
    m.v2 = m.v1 + m.rq.v1len;
    r = _ddp_store_handlers[m.rq.op](s, c, &m);   /* op checked by _ddp_store_check_head */
    if (r == 3) return 0;                          /* the hello stays where it is */
    if (r == 1) {
        if (!c->waiting) { c->waiting = 1; s->nwaiting++; }
        return 0;
    }
    if (c->waiting) { c->waiting = 0; s->nwaiting--; }
    c->head_len = c->body_len = c->body_need = 0;
    if (c->in_cap > ((size_t)1 << 20)) {          /* a big SET's buffer is not kept */
        DDP_FREE(c->in);
        c->in = NULL;
        c->in_cap = 0;
    }
    if (r == 2) { c->state = _DDP_CONN_CLOSING; return 0; }
    return r;
}

_DDP_PRIVATE int _ddp_conn_rx_space(_ddp_store_conn_t *c, unsigned char **p, size_t *n) {
    if (c->waiting || c->held || (c->state != _DDP_CONN_HELLO && c->state != _DDP_CONN_READY)) return -1;
    if (c->head_len < sizeof c->head) {
        *p = c->head + c->head_len;
        *n = sizeof c->head - c->head_len;
    } else {
        *p = (c->state == _DDP_CONN_HELLO ? c->hello : c->in) + c->body_len;
        *n = c->body_need - c->body_len;
    }
    return 0;
}

_DDP_PRIVATE int _ddp_conn_rx_done(ddp_store_t *s, _ddp_store_conn_t *c, size_t n) {
    if (c->head_len < sizeof c->head) {
        c->head_len += n;
        if (c->head_len < sizeof c->head) return 0;
        if (_ddp_store_check_head(s, c) != 0) return -1;
    } else {
        c->body_len += n;
    }
    if (c->body_len < c->body_need) return 0;
    return _ddp_store_execute(s, c);
}

/* Feeds bytes to a connection as if they came from its socket; answers accumulate in c->out.
 * 0, or -1: the server would drop the connection (the caller drops it). */
_DDP_PRIVATE int _ddp_store_feed(ddp_store_t *s, _ddp_store_conn_t *c, const void *data, size_t n) {
    const unsigned char *p = (const unsigned char *)data;
    while (n) {
        unsigned char *dst;
        size_t room;
        if (_ddp_conn_rx_space(c, &dst, &room) != 0) return -1;
        if (room > n) room = n;
        memcpy(dst, p, room);
        p += room;
        n -= room;
        if (_ddp_conn_rx_done(s, c, room) != 0) return -1;
    }
    return 0;
}

/* ---------------------------------------------------------------- the server loop */
/* After input or output: send what is queued, close a connection whose last answer is out,
 * keep epoll's interest right. */
_DDP_PRIVATE void _ddp_conn_settle(ddp_store_t *s, _ddp_store_conn_t *c) {
    if (c->state == _DDP_CONN_DEAD) return;
    if (c->held) { _ddp_conn_watch(s, c); return; }   /* its answer waits for the throttle */
    if (_ddp_conn_flush(c) != 0) { _ddp_store_drop(s, c); return; }
    if (c->state == _DDP_CONN_CLOSING && c->out_len == c->out_off && c->fd >= 0) {
        _ddp_store_drop(s, c);
        return;
    }
    _ddp_conn_watch(s, c);
}

/* Reads what the socket has (a bounded amount per call, so one big request does not starve the
 * others). -1 = drop the connection. */
_DDP_PRIVATE int _ddp_conn_readable(ddp_store_t *s, _ddp_store_conn_t *c) {
    int round;
    for (round = 0; round < _DDP_STORE_BATCH; round++) {
        unsigned char *dst;
        size_t room;
        ssize_t n;
        if (c->waiting) {
            /* A parked client speaks only after its answer: readable now means it hung up (its
             * own timeout ran out) or broke the protocol. Either way, drop it. */
            _ddp_store_log(s, DDP_LOG_TRACE, "store: client %s left while waiting", c->addr);
            return -1;
        }
        if (_ddp_conn_rx_space(c, &dst, &room) != 0) return -1;
        n = recv(c->fd, dst, room, MSG_DONTWAIT);
        if (n == 0) return -1;
        if (n < 0) return (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) ? 0 : -1;
        if (_ddp_conn_rx_done(s, c, (size_t)n) != 0) return -1;
        if (c->waiting || c->held || c->state == _DDP_CONN_CLOSING) return 0;
    }
    return 0;
}

_DDP_PRIVATE void _ddp_conn_event(ddp_store_t *s, _ddp_store_conn_t *c, uint32_t ev) {
    if (c->state == _DDP_CONN_DEAD) return;
    if ((ev & EPOLLOUT) && !c->held && _ddp_conn_flush(c) != 0) { _ddp_store_drop(s, c); return; }
    if (ev & (EPOLLIN | EPOLLHUP | EPOLLERR)) {
        if (c->state == _DDP_CONN_CLOSING) {
            if (ev & (EPOLLHUP | EPOLLERR)) { _ddp_store_drop(s, c); return; }
        } else if (_ddp_conn_readable(s, c) != 0) {
            _ddp_store_drop(s, c);
            return;
        }
    }
    _ddp_conn_settle(s, c);
}

/* A write happened: answer the parked GET/WAITs whose keys now exist. */
_DDP_PRIVATE void _ddp_store_rerun_waiting(ddp_store_t *s) {
    size_t i;
    s->changed = 0;
    for (i = 0; s->nwaiting && i < s->conns_hwm; i++) {
        _ddp_store_conn_t *c = s->conns[i];
        if (!c || !c->waiting) continue;
        if (_ddp_store_execute(s, c) != 0) { _ddp_store_drop(s, c); continue; }
        _ddp_conn_settle(s, c);
    }
}

_DDP_PRIVATE void _ddp_store_pause_accept(ddp_store_t *s, int ms) {
    if (s->accept_resume_us || s->epfd < 0) return;
    epoll_ctl(s->epfd, EPOLL_CTL_DEL, s->listen_fd, NULL);
    s->accept_resume_us = _ddp_now_us() + (int64_t)ms * 1000;
}

_DDP_PRIVATE void _ddp_store_resume_accept(ddp_store_t *s, int64_t now) {
    struct epoll_event ev;
    if (!s->accept_resume_us || now < s->accept_resume_us) return;
    memset(&ev, 0, sizeof ev);
    ev.events = EPOLLIN;
    ev.data.u64 = _DDP_STORE_TOKEN_LISTEN;
    if (epoll_ctl(s->epfd, EPOLL_CTL_ADD, s->listen_fd, &ev) == 0) s->accept_resume_us = 0;
    else s->accept_resume_us = now + 100000;
}

/* accept() failed for want of descriptors or memory: make room and go on serving. 1 = try
 * accept again. The oldest unauthenticated connection goes first (a rank authenticates in
 * milliseconds, so that is a stranger or a stalled peer; a rank that is cut off retries); with
 * none, the spare descriptor lets us accept and close the newcomer, so the listen queue drains. */
_DDP_PRIVATE int _ddp_store_out_of_fds(ddp_store_t *s, int err) {
    struct rlimit rl;
    unsigned long long lim = 0;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0) lim = (unsigned long long)rl.rlim_cur;
    if (s->pending_head) {
        _ddp_store_warn_rate(s, &s->rate_fds, "store: cannot accept (%s; RLIMIT_NOFILE %llu, %zu "
                             "connections): closing the oldest unauthenticated one (%s) to make room",
                             strerror(err), lim, s->nconns, s->pending_head->addr);
        _ddp_store_drop(s, s->pending_head);
        return 1;
    }
    if (s->spare_fd >= 0) {
        int fd;
        close(s->spare_fd);
        fd = _ddp_accept4(s->listen_fd, NULL, NULL, SOCK_CLOEXEC);
        if (fd >= 0) close(fd);
        s->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
        _ddp_store_warn_rate(s, &s->rate_fds, "store: cannot accept (%s; RLIMIT_NOFILE %llu, %zu "
                             "authenticated connections): refused a connection; raise ulimit -n",
                             strerror(err), lim, s->nconns);
        if (fd >= 0) return 1;
    } else {
        _ddp_store_warn_rate(s, &s->rate_fds, "store: cannot accept (%s; RLIMIT_NOFILE %llu); "
                             "pausing accepts for 100 ms", strerror(err), lim);
    }
    _ddp_store_pause_accept(s, 100);
    return 0;
}

/* Without a job secret, who may use the store from this host: only the store's own user. A
 * connection whose socket (looked up by its exact 4-tuple, _ddp_tcp_peer_uid) belongs to
 * another user is closed before anything is read or allocated for it; so is a loopback one
 * whose socket no process owns any more. A peer on another host (not found here) is let in:
 * that is the insecure mode the listen WARN names. 1 = refuse. */
_DDP_PRIVATE int _ddp_store_foreign_user(ddp_store_t *s, int fd, const struct sockaddr *peer, const char *addr) {
    uid_t uid = 0;
    int rc;
    if (s->diag_fd < 0) return 0;
    rc = _ddp_tcp_peer_uid(s->diag_fd, fd, &uid);
    if (rc == 0 && uid == s->euid) return 0;
    if (rc == 0) {
        _ddp_store_warn_rate(s, &s->rate_uid, "store: refused %s: its socket belongs to uid %u, not "
                             "this job's user (uid %u); without a job secret only this user's "
                             "processes on this host may use the store (ranks run by several users: "
                             "set the same DDP_JOB_SECRET on every rank)", addr, (unsigned)uid,
                             (unsigned)s->euid);
        return 1;
    }
    if (rc == -ENOENT) {
        if (!_ddp_sockaddr_is_loopback(peer)) return 0;
        _ddp_store_warn_rate(s, &s->rate_uid, "store: refused %s: no process on this host owns its "
                             "socket any more, so its user cannot be checked", addr);
        return 1;
    }
    _ddp_store_log(s, DDP_LOG_WARN, "store: cannot tell which user a connection from this host "
                   "comes from (sock_diag: %s): without a job secret any user of this host may "
                   "use the store", strerror(-rc));
    close(s->diag_fd);
    s->diag_fd = -1;
    return 0;
}

_DDP_PRIVATE void _ddp_store_accept(ddp_store_t *s) {
    int i;
    for (i = 0; i < _DDP_STORE_BATCH; i++) {
        struct sockaddr_storage ss;
        socklen_t sl = sizeof ss;
        char addr[64];
        _ddp_store_conn_t *c;
        int one = 1, fd = _ddp_accept4(s->listen_fd, (struct sockaddr *)&ss, &sl, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd < 0) {
            int e = errno;
            if (e == EAGAIN || e == EWOULDBLOCK) return;
            if (e == EINTR || e == ECONNABORTED || e == EPROTO || e == EPERM) continue;
            if (e == EMFILE || e == ENFILE || e == ENOBUFS || e == ENOMEM) {
                if (_ddp_store_out_of_fds(s, e)) continue;
                return;
            }
            _ddp_store_warn_rate(s, &s->rate_fds, "store: accept: %s; pausing accepts for 100 ms", strerror(e));
            _ddp_store_pause_accept(s, 100);
            return;
        }
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        _ddp_sockaddr_str((struct sockaddr *)&ss, addr, sizeof addr);
        if (!s->keylen && _ddp_store_foreign_user(s, fd, (struct sockaddr *)&ss, addr)) {
            close(fd);
            continue;
        }
        c = _ddp_store_conn_new(s, fd, addr);
        if (!c) {
            close(fd);
            _ddp_store_warn_rate(s, &s->rate_fds, "store: no memory or no random nonce for the "
                                 "connection from %s; closed it", addr);
            continue;
        }
        _ddp_src_from(&c->src, (struct sockaddr *)&ss);
        _ddp_store_log(s, DDP_LOG_TRACE, "store: client connected from %s", addr);
        /* The descriptors are the whole process's (the rank's transports need theirs too):
         * strangers that have not authenticated may hold at most a quarter of them. */
        while (s->npending > s->max_pending && s->pending_head && s->pending_head != c) {
            _ddp_store_warn_rate(s, &s->rate_fds, "store: %d unauthenticated connections (at most %d: a "
                                 "quarter of RLIMIT_NOFILE); closing the oldest (%s)", s->npending,
                                 s->max_pending, s->pending_head->addr);
            _ddp_store_drop(s, s->pending_head);
        }
        _ddp_conn_settle(s, c);
    }
}

/* Held connections whose time has come: a refusal goes out (and the connection closes), a
 * hello is run again (checked now, or held again if another wrong proof moved its source's
 * turn). */
_DDP_PRIVATE void _ddp_store_release_held(ddp_store_t *s, int64_t now) {
    _ddp_store_conn_t *c, *next;
    if (!s->held_next_us || now < s->held_next_us) return;
    for (c = s->held_head; c; c = next) {      /* one held again goes to the tail, in the future */
        next = c->hnext;
        if (c->held_until_us > now) continue;
        _ddp_held_unlink(s, c);
        if (c->state == _DDP_CONN_HELLO && _ddp_store_execute(s, c) != 0) { _ddp_store_drop(s, c); continue; }
        _ddp_conn_settle(s, c);
    }
    s->held_next_us = 0;
    for (c = s->held_head; c; c = c->hnext)
        if (!s->held_next_us || c->held_until_us < s->held_next_us) s->held_next_us = c->held_until_us;
}

/* Unauthenticated connections past their deadline go (the pending list is in deadline order). */
_DDP_PRIVATE void _ddp_store_expire(ddp_store_t *s, int64_t now) {
    while (s->pending_head && s->pending_head->deadline_us <= now) {
        _ddp_store_conn_t *c = s->pending_head;
        if (c->state == _DDP_CONN_HELLO)
            _ddp_store_warn_rate(s, &s->rate_peer, "store: %s did not authenticate within %d ms; "
                                 "connection closed", c->addr, s->handshake_ms);
        _ddp_store_drop(s, c);
    }
}

/* epoll_wait's timeout: the next handshake deadline or accept resumption, at most 1 s. */
_DDP_PRIVATE int _ddp_store_wait_ms(const ddp_store_t *s, int64_t now) {
    int64_t next = now + 1000000;
    if (s->pending_head && s->pending_head->deadline_us < next) next = s->pending_head->deadline_us;
    if (s->accept_resume_us && s->accept_resume_us < next) next = s->accept_resume_us;
    if (s->held_next_us && s->held_next_us < next) next = s->held_next_us;
    return next <= now ? 0 : (int)((next - now + 999) / 1000);
}

/* The server thread. Nothing but ddp_store_close ends it: every failure is per connection. */
_DDP_PRIVATE void *_ddp_store_thread(void *arg) {
    ddp_store_t *s = (ddp_store_t *)arg;
    struct epoll_event ev[_DDP_STORE_BATCH];
    while (!__atomic_load_n(&s->stop, __ATOMIC_ACQUIRE)) {
        int i, n = epoll_wait(s->epfd, ev, _DDP_STORE_BATCH, _ddp_store_wait_ms(s, _ddp_now_us()));
        int64_t now;
        if (n < 0) {
            if (errno != EINTR) {
                _ddp_store_warn_rate(s, &s->rate_fds, "store: epoll_wait: %s", strerror(errno));
                usleep(10000);
            }
            n = 0;
        }
        for (i = 0; i < n; i++) {
            uint64_t token = ev[i].data.u64;
            if (token == _DDP_STORE_TOKEN_WAKE) {
                char b[64];
                while (read(s->wake[0], b, sizeof b) > 0) {}
            } else if (token == _DDP_STORE_TOKEN_LISTEN) {
                if (!s->accept_resume_us) _ddp_store_accept(s);
            } else {
                /* NULL: its connection was dropped earlier in this batch */
                _ddp_store_conn_t *c = _ddp_store_conn_of(s, token);
                if (c) _ddp_conn_event(s, c, ev[i].events);
            }
        }
        if (s->changed) _ddp_store_rerun_waiting(s);
        now = _ddp_now_us();
        _ddp_store_release_held(s, now);
        _ddp_store_expire(s, now);
        _ddp_store_resume_accept(s, now);
        _ddp_store_reap(s);
    }
    return NULL;
}

/* ---------------------------------------------------------------- the client's deadlines
 * A request waits at most timeout_ms, and never past the handle's bound: a communicator's init
 * sets one for the whole rendezvous, so that n requests cannot cost n timeouts. */
_DDP_PRIVATE int64_t _ddp_store_deadline(const ddp_store_t *s, int timeout_ms) {
    int64_t d = _ddp_deadline(timeout_ms);
    if (s->bound_us && (d == 0 || d > s->bound_us)) d = s->bound_us;
    return d;
}

/* Sets (deadline_us != 0) or lifts the bound; the caller owns the handle for the while. */
_DDP_PRIVATE void _ddp_store_bound(ddp_store_t *s, int64_t deadline_us) {
    pthread_mutex_lock(&s->mu);
    s->bound_us = deadline_us;
    pthread_mutex_unlock(&s->mu);
}

/* The key proofs are made with: the job secret stretched with `salt` (ddp_auth.h:
 * _ddp_auth_job_key), computed only when the salt is new to this handle, so a process pays
 * for it once: the server when it starts (its own client handle shares it), a client at its
 * first handshake, a lane's client never (it copies its communicator's store: _ddp_store_copy_key). */
_DDP_PRIVATE void _ddp_store_key_for(ddp_store_t *s, const unsigned char salt[_DDP_AUTH_SALT_BYTES]) {
    if (!s->secret[0] || (s->keylen && !memcmp(s->salt, salt, sizeof s->salt))) return;
    memcpy(s->salt, salt, sizeof s->salt);
    _ddp_auth_job_key(s->secret, strlen(s->secret), s->salt, s->key);
    s->keylen = sizeof s->key;
}

_DDP_PRIVATE void _ddp_store_copy_key(ddp_store_t *s, const ddp_store_t *like) {
    if (!like || !like->secret[0]) return;
    memcpy(s->secret, like->secret, sizeof s->secret);
    memcpy(s->salt, like->salt, sizeof s->salt);
    memcpy(s->key, like->key, sizeof s->key);
    s->keylen = like->keylen;
}

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

/* The handshake on a fresh connection. *retry = 1 when the connection was lost during it (a
 * master out of descriptors, or flooded, drops some): then the caller connects again. */
_DDP_PRIVATE ddp_result_t _ddp_store_handshake(ddp_store_t *s, int fd, int64_t deadline, int *retry) {
    unsigned char chal[sizeof(_ddp_store_chal_t)], msg[_DDP_STORE_HELLO_BYTES];
    unsigned char ns[_DDP_AUTH_NONCE_BYTES], nc[_DDP_AUTH_NONCE_BYTES], val[_DDP_AUTH_PROOF_BYTES];
    _ddp_store_resp_t resp;
    size_t msglen = 0, vlen = 0;
    int rc, hs;
    const int64_t t0 = _ddp_now_us();
    *retry = 0;
    if ((rc = _ddp_auth_nonce(nc)) != 0)
        return _ddp_store_err(s, DDP_ERR_SYSTEM, "rendezvous: no random nonce for the handshake "
                              "(getrandom and /dev/urandom failed: %s)", strerror(-rc));
    rc = _ddp_recv_all(fd, chal, sizeof chal, deadline);
    if (rc == 0) {
        _ddp_store_chal_t ch;
        memcpy(&ch, chal, sizeof ch);
        /* The key exists once the salt is known; a secret without one yet still says "I have
         * a secret" to hs_hello, which refuses a master that asks for none. */
        if (ch.magic == _DDP_STORE_MAGIC && ch.proto == _DDP_STORE_PROTO && (ch.flags & _DDP_ST_CHAL_SECRET))
            _ddp_store_key_for(s, ch.salt);
        hs = _ddp_store_hs_hello(s->key, s->secret[0] ? sizeof s->key : 0, chal, sizeof chal, nc, msg,
                                 &msglen, ns);
        if (hs != _DDP_HS_OK) return _ddp_store_hs_error(s, hs);
        rc = _ddp_send_all(fd, msg, msglen, deadline);
    }
    if (rc == 0) rc = _ddp_recv_all(fd, &resp, sizeof resp, deadline);
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

/* The dial result for a host name that does not resolve. Said at once (WARN), then retried like
 * a refused connect: DNS may come up after the job (a Kubernetes service's name). */
#define _DDP_STORE_UNRESOLVABLE (-1000000)

/* One try at every address host resolves to: a connected fd, or -errno (*why says what). */
_DDP_PRIVATE int _ddp_store_dial(ddp_store_t *s, int64_t deadline, char *why, size_t whycap) {
    struct addrinfo hints, *res = NULL, *ai;
    char portstr[16];
    int last_err = ECONNREFUSED, rc;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    snprintf(portstr, sizeof portstr, "%d", s->port);
    rc = getaddrinfo(s->host, portstr, &hints, &res);
    if (rc != 0) {
        snprintf(why, whycap, "cannot resolve master address '%.200s': %s", s->host,
                 rc == EAI_SYSTEM ? strerror(errno) : gai_strerror(rc));
        return _DDP_STORE_UNRESOLVABLE;
    }
    for (ai = res; ai; ai = ai->ai_next) {
        int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol), one = 1;
        if (fd < 0) { last_err = errno; continue; }
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        _ddp_set_nonblock(fd, 1);
        if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0) { freeaddrinfo(res); return fd; }
        if (errno == EINPROGRESS) {
            struct pollfd pfd;
            int ms = _ddp_ms_left(deadline);
            if (ms < 0 || ms > 2000) ms = 2000;
            pfd.fd = fd; pfd.events = POLLOUT; pfd.revents = 0;
            if (poll(&pfd, 1, ms) == 1) {
                int err = 0;
                socklen_t len = sizeof err;
                getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
                if (err == 0) { freeaddrinfo(res); return fd; }
                last_err = err;
            } else {
                last_err = ETIMEDOUT;
            }
        } else {
            last_err = errno;
        }
        close(fd);
    }
    freeaddrinfo(res);
    snprintf(why, whycap, "cannot connect to %.200s:%d: %s", s->host, s->port, strerror(last_err));
    return -last_err;
}

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
    struct iovec *iov = m->iov;
    int n = m->niov;
    if (m->overflow) return -EMSGSIZE;
    while (n > 0) {
        struct msghdr mh;
        ssize_t w;
        memset(&mh, 0, sizeof mh);
        mh.msg_iov = iov;
        mh.msg_iovlen = (size_t)n;
        w = sendmsg(fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w < 0 && errno == EINTR) continue;
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            struct pollfd pfd;
            int ms = _ddp_ms_left(deadline);
            if (ms == 0) return -ETIMEDOUT;
            pfd.fd = fd; pfd.events = POLLOUT; pfd.revents = 0;
            if (poll(&pfd, 1, ms) < 0 && errno != EINTR) return -errno;
            continue;
        }
        if (w < 0) return -errno;
        while (n > 0 && (size_t)w >= iov->iov_len) { w -= (ssize_t)iov->iov_len; iov++; n--; }
        if (n > 0) { iov->iov_base = (char *)iov->iov_base + w; iov->iov_len -= (size_t)w; }
    }
    return 0;
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
 * an older server closes the first one. *retry as in _ddp_store_handshake. */
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

/* Connects and authenticates, retrying until the store's timeout with exponential backoff and
 * jitter (10 ms doubling to 2 s, each wait drawn from [b/2, 3b/2]): ranks that all start at
 * once then do not retry in lockstep, the failure PyTorch's TCPStore saw as "connection reset
 * by peer" at 1,536 ranks. Wrong secrets and versions are final at once. */
_DDP_PRIVATE ddp_result_t _ddp_store_connect(ddp_store_t *s) {
    char why[512] = "";
    const int64_t t0 = _ddp_now_us(), deadline = _ddp_store_deadline(s, s->timeout_ms);
    int backoff_ms = 10, attempts = 0, unresolved = 0, last_unresolved = 0;
    for (;;) {
        int retry = 1, fd = _ddp_store_dial(s, deadline, why, sizeof why);
        attempts++;
        last_unresolved = fd == _DDP_STORE_UNRESOLVABLE;
        if (last_unresolved && !unresolved++)
            _ddp_store_log(s, DDP_LOG_WARN, "store: %s; retrying until the timeout (%d ms), as DNS "
                           "may come up late", why, _ddp_ms_left(deadline));
        if (fd >= 0) {
            ddp_result_t r = s->c10d ? _ddp_c10d_handshake(s, &fd, deadline, &retry)
                                     : _ddp_store_handshake(s, fd, deadline, &retry);
            if (r == DDP_SUCCESS) {
                s->fd = fd;
                if (s->c10d)
                    _ddp_store_log(s, DDP_LOG_INFO, "store: connected to c10d TCPStore %s:%d (%s; no "
                                   "authentication)", s->host, s->port,
                                   _ddp_c10d_dialects[s->c10d - _DDP_C10D_WATCH]);
                else
                    _ddp_store_log(s, DDP_LOG_INFO, "store: connected to master %s:%d%s", s->host,
                                   s->port, s->keylen ? " (job secret proven both ways)" : "");
                if (attempts > 1)
                    _ddp_store_log(s, DDP_LOG_TRACE, "store: after %d attempts", attempts);
                return r;
            }
            if (fd >= 0) close(fd);
            if (!retry) return r;
            _ddp_strlcpy(why, s->last_error, sizeof why);
            _ddp_store_log(s, DDP_LOG_TRACE, "store: %s; retrying", why);
        }
        if (_ddp_ms_left(deadline) == 0 && last_unresolved)
            return _ddp_store_err(s, DDP_ERR_TIMEOUT, "rendezvous: %s (retried for %d ms, %d attempts)",
                                  why, (int)((_ddp_now_us() - t0) / 1000), attempts);
        if (_ddp_ms_left(deadline) == 0)
            return _ddp_store_err(s, DDP_ERR_TIMEOUT, "%s %s:%d unreachable after %d ms (%d attempts): "
                                  "%s", s->c10d ? "c10d store" : "rendezvous: rank 0's store at", s->host,
                                  s->port, (int)((_ddp_now_us() - t0) / 1000), attempts, why);
        {
            int ms = (int)(_ddp_jitter_us((int64_t)backoff_ms * 1000) / 1000), left = _ddp_ms_left(deadline);
            struct timespec ts;
            if (left >= 0 && ms > left) ms = left;
            ts.tv_sec = ms / 1000;
            ts.tv_nsec = (long)(ms % 1000) * 1000000L;
            nanosleep(&ts, NULL);
            backoff_ms = backoff_ms * 2 > _DDP_STORE_BACKOFF_MAX_MS ? _DDP_STORE_BACKOFF_MAX_MS : backoff_ms * 2;
        }
    }
}

/* One request/response round trip; the caller holds the store's mutex. */
_DDP_PRIVATE ddp_result_t _ddp_store_rpc(ddp_store_t *s, uint32_t op, uint32_t flags, const char *key,
                                         size_t klen, const void *v1, size_t v1len, const void *v2,
                                         size_t v2len, int64_t arg, int timeout_ms,
                                         _ddp_store_resp_t *resp, void *out, size_t cap,
                                         size_t *outlen) {
    _ddp_store_req_t rq;
    struct iovec iov[4];
    int64_t deadline;
    const int64_t t0 = _ddp_now_us();
    int rc, i;
    ddp_result_t r;
    if (s->fd < 0) {
        if (s->quick) return DDP_ERR_REMOTE;
        r = _ddp_store_connect(s);
        if (r != DDP_SUCCESS) return r;
    }
    deadline = _ddp_store_deadline(s, timeout_ms ? timeout_ms : s->timeout_ms);
    memset(&rq, 0, sizeof rq);
    rq.magic = _DDP_STORE_MAGIC; rq.op = op; rq.klen = (uint32_t)klen; rq.v1len = (uint32_t)v1len;
    rq.v2len = (uint32_t)v2len; rq.flags = flags; rq.arg = arg;
    iov[0].iov_base = &rq; iov[0].iov_len = sizeof rq;
    iov[1].iov_base = (void *)(uintptr_t)key; iov[1].iov_len = klen;
    iov[2].iov_base = (void *)(uintptr_t)v1; iov[2].iov_len = v1len;
    iov[3].iov_base = (void *)(uintptr_t)v2; iov[3].iov_len = v2len;
    for (i = 0, rc = 0; i < 4 && rc == 0; i++)
        if (iov[i].iov_len) rc = _ddp_send_all(s->fd, iov[i].iov_base, iov[i].iov_len, deadline);
    if (rc == 0) rc = _ddp_recv_all(s->fd, resp, sizeof *resp, deadline);
    if (rc == 0 && resp->magic != _DDP_STORE_MAGIC) rc = -EPROTO;
    if (rc == 0 && resp->vlen) {
        size_t take = resp->vlen < cap ? resp->vlen : cap;
        if (take) rc = _ddp_recv_all(s->fd, out, take, deadline);
        while (rc == 0 && take < resp->vlen) {
            char sink[4096];
            size_t n = resp->vlen - take < sizeof sink ? resp->vlen - take : sizeof sink;
            rc = _ddp_recv_all(s->fd, sink, n, deadline);
            take += n;
        }
    }
    if (outlen) *outlen = rc == 0 ? resp->vlen : 0;
    if (rc != 0) {
        /* The stream is out of step now: drop it; the next call reconnects. */
        _ddp_store_hangup(s);
        if (rc == -ETIMEDOUT)
            return _ddp_store_err(s, DDP_ERR_TIMEOUT, "rank 0's store at %s:%d did not answer within "
                                  "%d ms (key '%.*s')", s->host, s->port, (int)((_ddp_now_us() - t0) / 1000),
                                  (int)(klen > 200 ? 200 : klen), key);
        return _ddp_store_err(s, DDP_ERR_REMOTE, "lost the connection to master %s:%d (rank 0's "
                              "store): %s", s->host, s->port, strerror(-rc));
    }
    return DDP_SUCCESS;
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

/* ---------------------------------------------------------------- starting the server */
_DDP_PRIVATE int _ddp_sa_same_ip(const struct sockaddr *a, const struct sockaddr *b) {
    if (a->sa_family != b->sa_family) return 0;
    if (a->sa_family == AF_INET)
        return ((const struct sockaddr_in *)(const void *)a)->sin_addr.s_addr ==
               ((const struct sockaddr_in *)(const void *)b)->sin_addr.s_addr;
    if (a->sa_family == AF_INET6)
        return memcmp(&((const struct sockaddr_in6 *)(const void *)a)->sin6_addr,
                      &((const struct sockaddr_in6 *)(const void *)b)->sin6_addr, sizeof(struct in6_addr)) == 0;
    return 0;
}

/* Where to listen for host: 1 = loopback (host resolves only to loopback addresses), 2 = an
 * address of one of this machine's interfaces, 0 = every interface (host NULL, unresolvable, or
 * somewhere else: behind NAT, a DNS alias). *out gets the address (port 0) for 1 and 2. */
_DDP_PRIVATE int _ddp_store_bind_choice(const char *host, struct sockaddr_storage *out, socklen_t *outlen) {
    struct addrinfo hints, *res = NULL, *ai;
    struct ifaddrs *ifs = NULL, *ifa;
    const struct addrinfo *loop = NULL, *local = NULL;
    int only_loopback = 1;
    if (!host || !*host) return 0;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    if (getaddrinfo(host, NULL, &hints, &res) != 0 || !res) return 0;
    for (ai = res; ai; ai = ai->ai_next) {
        if (_ddp_sockaddr_is_loopback(ai->ai_addr)) {
            if (!loop || (loop->ai_family != AF_INET && ai->ai_family == AF_INET)) loop = ai;
        } else {
            only_loopback = 0;
        }
    }
    if (!only_loopback && getifaddrs(&ifs) == 0) {
        for (ai = res; ai && !local; ai = ai->ai_next)
            for (ifa = ifs; ifa && !local; ifa = ifa->ifa_next)
                if (ifa->ifa_addr && !_ddp_sockaddr_is_loopback(ai->ai_addr) && _ddp_sa_same_ip(ai->ai_addr, ifa->ifa_addr))
                    local = ai;
        freeifaddrs(ifs);
    }
    if (only_loopback) local = loop;
    if (local && local->ai_addrlen <= sizeof *out) {
        memset(out, 0, sizeof *out);
        memcpy(out, local->ai_addr, local->ai_addrlen);
        *outlen = (socklen_t)local->ai_addrlen;
        freeaddrinfo(res);
        return only_loopback ? 1 : 2;
    }
    freeaddrinfo(res);
    return 0;
}

/* Binds and listens: -errno or the fd. */
_DDP_PRIVATE int _ddp_store_bind(const struct sockaddr *sa, socklen_t len, int v6only) {
    int one = 1, fd = socket(sa->sa_family, SOCK_STREAM | SOCK_CLOEXEC, 0), e;
    if (fd < 0) return -errno;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (sa->sa_family == AF_INET6) setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &v6only, sizeof v6only);
    if (bind(fd, sa, len) != 0 || listen(fd, _DDP_STORE_BACKLOG) != 0) {
        e = errno;
        close(fd);
        return -e;
    }
    return fd;
}

_DDP_PRIVATE ddp_result_t _ddp_store_listen(ddp_store_t *s, const char *host) {
    struct sockaddr_storage ss;
    socklen_t sl = 0;
    char where[96];
    int choice = _ddp_store_bind_choice(host, &ss, &sl), fd;
    if (choice) {
        if (ss.ss_family == AF_INET) ((struct sockaddr_in *)(void *)&ss)->sin_port = htons((uint16_t)s->port);
        else ((struct sockaddr_in6 *)(void *)&ss)->sin6_port = htons((uint16_t)s->port);
        fd = _ddp_store_bind((struct sockaddr *)&ss, sl, 1);
    } else {
        /* Every interface: IPv6 and IPv4 on one socket where the host has IPv6, else IPv4. */
        struct sockaddr_in6 a6;
        struct sockaddr_in a4;
        memset(&a6, 0, sizeof a6);
        a6.sin6_family = AF_INET6;
        a6.sin6_addr = in6addr_any;
        a6.sin6_port = htons((uint16_t)s->port);
        fd = _ddp_store_bind((struct sockaddr *)&a6, sizeof a6, 0);
        if (fd < 0 && fd != -EADDRINUSE) {
            memset(&a4, 0, sizeof a4);
            a4.sin_family = AF_INET;
            a4.sin_addr.s_addr = htonl(INADDR_ANY);
            a4.sin_port = htons((uint16_t)s->port);
            fd = _ddp_store_bind((struct sockaddr *)&a4, sizeof a4, 0);
        }
    }
    if (fd == -EADDRINUSE)
        return _ddp_store_err(s, DDP_ERR_SYSTEM, "rendezvous: master port %d is already in use on "
                              "this host (another job, or a previous run still exiting?): pick another "
                              "MASTER_PORT", s->port);
    if (fd < 0) return _ddp_store_err(s, DDP_ERR_SYSTEM, "listen on port %d: %s", s->port, strerror(-fd));
    sl = sizeof ss;
    getsockname(fd, (struct sockaddr *)&ss, &sl);
    s->port = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)(void *)&ss)->sin6_port
                                             : ((struct sockaddr_in *)(void *)&ss)->sin_port);
    _ddp_set_nonblock(fd, 1);
    s->listen_fd = fd;
    _ddp_sockaddr_str((struct sockaddr *)&ss, where, sizeof where);
    _ddp_store_log(s, DDP_LOG_INFO, "store: listening on %s (%s%s%s)", where,
                   choice == 1 ? "loopback only: " : choice == 2 ? "" : "every interface",
                   choice ? host : "", choice == 1 ? " is this host's loopback, so no other host can "
                   "connect" : choice == 2 ? " is an address of this host" : "");
    return DDP_SUCCESS;
}

/* One descriptor per rank: the soft limit goes up to the hard one (said at INFO). Strangers get
 * at most a quarter of whatever the limit ends up being. */
_DDP_PRIVATE void _ddp_store_pending_cap(ddp_store_t *s) {
    struct rlimit rl;
    rlim_t q = getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY ? rl.rlim_cur / 4 : 4096;
    s->max_pending = q < 64 ? 64 : q > 65536 ? 65536 : (int)q;
}

_DDP_PRIVATE void _ddp_store_raise_nofile(ddp_store_t *s) {
    struct rlimit rl;
    unsigned long long was;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0) return;
    was = (unsigned long long)rl.rlim_cur;
    if (rl.rlim_cur >= rl.rlim_max) {
        _ddp_store_log(s, DDP_LOG_INFO, "store: open-file limit (RLIMIT_NOFILE) %llu is also the hard "
                       "limit: the server holds at most about that many connections", was);
        return;
    }
    rl.rlim_cur = rl.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &rl) == 0)
        _ddp_store_log(s, DDP_LOG_INFO, "store: raised the open-file limit (RLIMIT_NOFILE) from %llu "
                       "to the hard limit %llu, one descriptor per rank", was, (unsigned long long)rl.rlim_max);
    else
        _ddp_store_log(s, DDP_LOG_INFO, "store: could not raise the open-file limit (RLIMIT_NOFILE) "
                       "%llu to %llu: %s", was, (unsigned long long)rl.rlim_max, strerror(errno));
}

/* What the server's security rests on, said once at start: the throttle's table and the socket
 * that tells local users apart; a WARN for a short secret, and for a secretless store that
 * other hosts can reach. */
_DDP_PRIVATE ddp_result_t _ddp_store_guard(ddp_store_t *s) {
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    int exposed = getsockname(s->listen_fd, (struct sockaddr *)&ss, &sl) != 0 ||
                  !_ddp_sockaddr_is_loopback((struct sockaddr *)&ss);
    size_t len = strlen(s->secret);
    s->euid = geteuid();
    s->diag_fd = _ddp_sock_diag_open();
    if (len) {
        s->throttle = (_ddp_throttle_t *)DDP_MALLOC(sizeof *s->throttle * _DDP_STORE_THROTTLE_SOURCES);
        if (!s->throttle) return _ddp_store_err(s, DDP_ERR_OUT_OF_MEMORY, "store server: throttle table");
        memset(s->throttle, 0, sizeof *s->throttle * _DDP_STORE_THROTTLE_SOURCES);
    }
    if (len && len < _DDP_STORE_SHORT_SECRET)
        _ddp_store_log(s, DDP_LOG_WARN, "store: the job secret is %zu characters: if a person chose "
                       "it, it can be guessed offline from one captured handshake (each guess costs "
                       "%u PBKDF2 iterations, not enough for a short word); use %d or more random "
                       "characters (ddprun makes 64 random hex digits when DDP_JOB_SECRET is unset)",
                       len, (unsigned)_DDP_AUTH_KDF_ITERATIONS, _DDP_STORE_SHORT_SECRET);
    if (!len && exposed)
        _ddp_store_log(s, DDP_LOG_WARN, "store: listening on a network address (port %d) with no job "
                       "secret: anyone on another host who can reach it can read and write the "
                       "rendezvous store, and so join this job and see or alter its data (the data "
                       "connections' key is handed out through it); set the same DDP_JOB_SECRET on "
                       "every rank (ddprun makes one per job), or use a loopback MASTER_ADDR",
                       s->port);
    if (!len && s->diag_fd < 0)
        _ddp_store_log(s, DDP_LOG_WARN, "store: cannot tell which user a connection from this host "
                       "comes from (sock_diag: %s): without a job secret any user of this host may "
                       "use the store", strerror(-s->diag_fd));
    return DDP_SUCCESS;
}

_DDP_PRIVATE ddp_result_t _ddp_store_start_server(ddp_store_t *s, const char *host) {
    struct epoll_event ev;
    ddp_result_t r;
    _ddp_store_raise_nofile(s);
    _ddp_store_pending_cap(s);
    if ((r = _ddp_store_listen(s, host)) != DDP_SUCCESS) return r;
    if (s->secret[0]) {                       /* a fresh salt per server: per job */
        unsigned char salt[_DDP_AUTH_SALT_BYTES];
        int rc = _ddp_auth_random(salt, sizeof salt);
        if (rc != 0)
            return _ddp_store_err(s, DDP_ERR_SYSTEM, "store server: no random salt (getrandom and "
                                  "/dev/urandom failed: %s)", strerror(-rc));
        _ddp_store_key_for(s, salt);
    }
    if ((r = _ddp_store_guard(s)) != DDP_SUCCESS) return r;
    s->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    s->epfd = epoll_create1(EPOLL_CLOEXEC);
    if (s->epfd < 0 || _ddp_pipe2(s->wake, O_CLOEXEC | O_NONBLOCK) != 0)
        return _ddp_store_err(s, DDP_ERR_SYSTEM, "store server: %s", strerror(errno));
    memset(&ev, 0, sizeof ev);
    ev.events = EPOLLIN;
    ev.data.u64 = _DDP_STORE_TOKEN_WAKE;
    if (epoll_ctl(s->epfd, EPOLL_CTL_ADD, s->wake[0], &ev) != 0)
        return _ddp_store_err(s, DDP_ERR_SYSTEM, "store server: epoll_ctl: %s", strerror(errno));
    ev.data.u64 = _DDP_STORE_TOKEN_LISTEN;
    if (epoll_ctl(s->epfd, EPOLL_CTL_ADD, s->listen_fd, &ev) != 0)
        return _ddp_store_err(s, DDP_ERR_SYSTEM, "store server: epoll_ctl: %s", strerror(errno));
    if (pthread_create(&s->thread, NULL, _ddp_store_thread, s) != 0)
        return _ddp_store_err(s, DDP_ERR_SYSTEM, "store server thread: %s", strerror(errno));
    s->thread_started = 1;
    _ddp_store_log(s, DDP_LOG_INFO, "store: serving rendezvous on port %d%s", s->port,
                   s->keylen ? " (job secret required, proven by challenge-response)" :
                   s->diag_fd >= 0 ? " (no job secret: on this host only this user's processes may use "
                   "it; anyone on a host that reaches the port may)" :
                   " (no job secret: anyone who reaches the port may use it)");
    return DDP_SUCCESS;
}

/* A store with no sockets yet (also what the fuzzers drive with _ddp_store_feed). */
_DDP_PRIVATE ddp_store_t *_ddp_store_new(const char *host, int port, const ddp_store_desc_t *d) {
    const char *secret;
    ddp_store_t *s = (ddp_store_t *)DDP_MALLOC(sizeof *s);
    if (!s) return NULL;
    memset(s, 0, sizeof *s);
    s->fd = s->listen_fd = s->epfd = s->spare_fd = s->diag_fd = -1;
    s->owner_pid = getpid();
    s->wake[0] = s->wake[1] = -1;
    pthread_mutex_init(&s->mu, NULL);
    pthread_mutex_init(&s->srv_mu, NULL);
    _ddp_strlcpy(s->host, host && *host ? host : "127.0.0.1", sizeof s->host);
    s->port = port;
    s->timeout_ms = (d && d->timeout_ms) ? d->timeout_ms : _ddp_env_timeout_ms();
    s->handshake_ms = s->timeout_ms < 0 || s->timeout_ms > _DDP_STORE_HANDSHAKE_MAX_MS
                          ? _DDP_STORE_HANDSHAKE_MAX_MS : s->timeout_ms;
    if (s->handshake_ms < _DDP_STORE_HANDSHAKE_MIN_MS) s->handshake_ms = _DDP_STORE_HANDSHAKE_MIN_MS;
    secret = (d && d->secret) ? d->secret : getenv("DDP_JOB_SECRET");
    _ddp_strlcpy(s->secret, secret ? secret : "", sizeof s->secret);
    s->log_level = (d && d->log_level) ? d->log_level - 1 : _ddp_log_level_from_env();
    s->log_rank = d ? d->log_rank : 0;
    return s;
}

/* like: a handle whose key this one reuses (NULL: stretch the secret here). */
_DDP_PRIVATE ddp_result_t _ddp_store_open_like(ddp_store_t **out, const char *host, int port,
                                               int is_server, const ddp_store_desc_t *d,
                                               const ddp_store_t *like, char *err, size_t errcap) {
    ddp_store_t *s;
    ddp_result_t r;
    if (!out) return DDP_ERR_INVALID_ARGUMENT;
    *out = NULL;
    if (port < 0 || port > 65535 || (!is_server && (port == 0 || !host || !*host)))
        return DDP_ERR_INVALID_ARGUMENT;
    if (!(s = _ddp_store_new(host, port, d))) return DDP_ERR_OUT_OF_MEMORY;
    if (is_server && (r = _ddp_store_start_server(s, host)) != DDP_SUCCESS) {
        _ddp_strlcpy(err, s->last_error, errcap);
        ddp_store_close(s);
        return r;
    }
    _ddp_store_copy_key(s, like);
    pthread_mutex_lock(&s->mu);
    r = _ddp_store_connect(s);
    pthread_mutex_unlock(&s->mu);
    if (r != DDP_SUCCESS) {
        _ddp_strlcpy(err, s->last_error, errcap);
        ddp_store_close(s);
        return r;
    }
    *out = s;
    return DDP_SUCCESS;
}

_DDP_PRIVATE ddp_result_t _ddp_store_open(ddp_store_t **out, const char *host, int port,
                                          int is_server, const ddp_store_desc_t *d, char *err,
                                          size_t errcap) {
    return _ddp_store_open_like(out, host, port, is_server, d, NULL, err, errcap);
}

DDP_API ddp_result_t ddp_store_open(ddp_store_t **out, const char *host, int port, int is_server,
                                    const ddp_store_desc_t *d) {
    char err[512];
    return _ddp_store_open(out, host, port, is_server, d, err, sizeof err);
}

/* A c10d client: d as for ddp_store_open (timeout, log level and rank; the secret is kept for
 * the communicator's data key and never sent). On failure err says why (the handle is gone). */
_DDP_PRIVATE ddp_result_t _ddp_store_connect_c10d_like(ddp_store_t **out, const char *host, int port,
                                                       const ddp_store_desc_t *d, const ddp_store_t *like,
                                                       char *err, size_t errcap) {
    ddp_store_t *s;
    ddp_result_t r;
    if (!out) return DDP_ERR_INVALID_ARGUMENT;
    *out = NULL;
    if (port <= 0 || port > 65535 || !host || !*host) return DDP_ERR_INVALID_ARGUMENT;
    if (!(s = _ddp_store_new(host, port, d))) return DDP_ERR_OUT_OF_MEMORY;
    s->c10d = _DDP_C10D_UNKNOWN;
    _ddp_store_copy_key(s, like);
    {   /* No libddp server to send a salt: a fixed one. The key is never sent; it binds the data
         * key (ddp_comm.h), which a guess must then stretch to check. */
        static const unsigned char c10d_salt[_DDP_AUTH_SALT_BYTES] = {'c', '1', '0', 'd'};
        _ddp_store_key_for(s, c10d_salt);
    }
    pthread_mutex_lock(&s->mu);
    r = _ddp_store_connect(s);
    pthread_mutex_unlock(&s->mu);
    if (r != DDP_SUCCESS) {
        _ddp_strlcpy(err, s->last_error, errcap);
        ddp_store_close(s);
        return r;
    }
    *out = s;
    return DDP_SUCCESS;
}

_DDP_PRIVATE ddp_result_t _ddp_store_connect_c10d(ddp_store_t **out, const char *host, int port,
                                                  const ddp_store_desc_t *d, char *err, size_t errcap) {
    return _ddp_store_connect_c10d_like(out, host, port, d, NULL, err, errcap);
}

/* Another client of the store `like` is connected to, in the same protocol (a communicator's
 * lanes open their own): ddp_store_open's client, or a c10d one, with like's key (the secret
 * is not stretched again; d->secret is ignored). */
_DDP_PRIVATE ddp_result_t _ddp_store_client_like(ddp_store_t **out, const ddp_store_t *like,
                                                 const ddp_store_desc_t *d, char *err, size_t errcap) {
    if (!like) return DDP_ERR_INVALID_ARGUMENT;
    if (like->c10d) return _ddp_store_connect_c10d_like(out, like->host, like->port, d, like, err, errcap);
    return _ddp_store_open_like(out, like->host, like->port, 0, d, like, err, errcap);
}

DDP_API ddp_result_t ddp_store_connect_c10d(const char *host, int port, int timeout_ms, ddp_store_t **out) {
    ddp_store_desc_t d;
    char err[512];
    memset(&d, 0, sizeof d);
    d.timeout_ms = timeout_ms;
    return _ddp_store_connect_c10d(out, host, port, &d, err, sizeof err);
}

/* A server's close never waits on its clients for long: others may still read keys (a slower
 * rank reading why the job failed), so it serves on while clients are connected, for at most
 * grace_ms (the caller's bound: ddp_store_close uses _DDP_STORE_CLOSE_GRACE_MS or the store's
 * timeout if shorter; ddp_comm_init_threads' private store, whose clients live in this very
 * process, 0). A dead client's socket closes by itself. */
#ifndef _DDP_STORE_CLOSE_GRACE_MS
#define _DDP_STORE_CLOSE_GRACE_MS 2000
#endif
_DDP_PRIVATE ddp_result_t _ddp_store_close_within(ddp_store_t *s, int grace_ms) {
    size_t slot;
    int i;
    if (!s) return DDP_ERR_INVALID_ARGUMENT;
    _ddp_store_hangup(s);
    if (s->thread_started) {
        int64_t deadline = _ddp_deadline(grace_ms < 0 ? 0 : grace_ms);
        for (;;) {
            int n;
            pthread_mutex_lock(&s->srv_mu);
            n = s->nclients;
            pthread_mutex_unlock(&s->srv_mu);
            if (n <= 0 || _ddp_ms_left(deadline) == 0) break;
            usleep(2000);
        }
        __atomic_store_n(&s->stop, 1, __ATOMIC_RELEASE);
        if (write(s->wake[1], "x", 1) < 0) {}
        pthread_join(s->thread, NULL);
    }
    for (slot = 0; slot < s->conns_hwm; slot++) if (s->conns[slot]) _ddp_store_drop(s, s->conns[slot]);
    _ddp_store_reap(s);
    DDP_FREE(s->conns);
    DDP_FREE(s->free_slots);
    _ddp_store_close_fd(s, s->listen_fd);
    _ddp_store_close_fd(s, s->wake[0]);
    if (s->epfd >= 0) close(s->epfd);
    if (s->spare_fd >= 0) close(s->spare_fd);   /* never watched */
    if (s->diag_fd >= 0) close(s->diag_fd);     /* never watched */
    DDP_FREE(s->throttle);
    if (s->wake[1] >= 0) close(s->wake[1]);     /* the write end: never watched */
    for (i = 0; i < _DDP_KV_BUCKETS; i++) {
        _ddp_kv_t *e = s->buckets[i];
        while (e) { _ddp_kv_t *n = e->next; DDP_FREE(e->key); DDP_FREE(e->val); DDP_FREE(e); e = n; }
    }
    _ddp_auth_wipe(s->secret, sizeof s->secret);
    _ddp_auth_wipe(s->key, sizeof s->key);
    pthread_mutex_destroy(&s->mu);
    pthread_mutex_destroy(&s->srv_mu);
    DDP_FREE(s);
    return DDP_SUCCESS;
}

DDP_API ddp_result_t ddp_store_close(ddp_store_t *s) {
    int grace = _DDP_STORE_CLOSE_GRACE_MS;
    if (s && s->timeout_ms >= 0 && s->timeout_ms < grace) grace = s->timeout_ms;
    return _ddp_store_close_within(s, grace);
}

/* A fork child's copy of a store: close this process's descriptors, nothing more. A client
 * sends nothing on close, so it goes as usual. A server's thread stayed in the parent and its
 * connections may have been copied mid-change: nothing is joined, sent or taken off the epoll
 * set (shared with the parent), and its memory is left to the child's exit. */
_DDP_PRIVATE void _ddp_store_forget(ddp_store_t *s) {
    int *fds[6];
    int i;
    if (!s) return;
    if (!s->thread_started) { _ddp_store_close_within(s, 0); return; }
    fds[0] = &s->fd; fds[1] = &s->listen_fd; fds[2] = &s->epfd; fds[3] = &s->spare_fd;
    fds[4] = &s->wake[0]; fds[5] = &s->wake[1];
    for (i = 0; i < 6; i++) {
        if (*fds[i] >= 0) close(*fds[i]);
        *fds[i] = -1;
    }
}

_DDP_PRIVATE ddp_result_t _ddp_store_check_key(ddp_store_t *s, const char *key) {
    size_t n;
    if (!s || !key) return DDP_ERR_INVALID_ARGUMENT;
    n = strlen(key);
    if (n == 0 || n > DDP_STORE_MAX_KEY) {
        snprintf(s->last_error, sizeof s->last_error, "key length %zu not in 1..%d", n, DDP_STORE_MAX_KEY);
        return DDP_ERR_INVALID_ARGUMENT;
    }
    return DDP_SUCCESS;
}

DDP_API ddp_result_t ddp_store_set(ddp_store_t *s, const char *key, const void *value, size_t len) {
    _ddp_store_resp_t resp;
    ddp_result_t r = _ddp_store_check_key(s, key);
    if (r != DDP_SUCCESS) return r;
    if ((len && !value) || len > DDP_STORE_MAX_VALUE) return DDP_ERR_INVALID_ARGUMENT;
    pthread_mutex_lock(&s->mu);
    if (s->c10d) {
        r = _ddp_c10d_set(s, key, value, len);
        pthread_mutex_unlock(&s->mu);
        return r;
    }
    r = _ddp_store_rpc(s, _DDP_ST_SET, 0, key, strlen(key), value, len, NULL, 0, 0, 0, &resp, NULL, 0, NULL);
    pthread_mutex_unlock(&s->mu);
    return r != DDP_SUCCESS ? r : (ddp_result_t)resp.status;
}

DDP_API ddp_result_t ddp_store_get(ddp_store_t *s, const char *key, void *value, size_t cap, size_t *len) {
    _ddp_store_resp_t resp;
    ddp_result_t r = _ddp_store_check_key(s, key);
    if (r != DDP_SUCCESS) return r;
    if (cap && !value) return DDP_ERR_INVALID_ARGUMENT;
    pthread_mutex_lock(&s->mu);
    if (s->c10d) {
        r = _ddp_c10d_get(s, key, value, cap, len);
        pthread_mutex_unlock(&s->mu);
        return r;
    }
    r = _ddp_store_rpc(s, _DDP_ST_GET, 0, key, strlen(key), NULL, 0, NULL, 0, 0, 0, &resp, value, cap, len);
    pthread_mutex_unlock(&s->mu);
    return r != DDP_SUCCESS ? r : (ddp_result_t)resp.status;
}

DDP_API ddp_result_t ddp_store_add(ddp_store_t *s, const char *key, int64_t delta, int64_t *result) {
    _ddp_store_resp_t resp;
    ddp_result_t r = _ddp_store_check_key(s, key);
    if (r != DDP_SUCCESS) return r;
    pthread_mutex_lock(&s->mu);
    if (s->c10d) {
        r = _ddp_c10d_add(s, key, delta, result);
        pthread_mutex_unlock(&s->mu);
        return r;
    }
    r = _ddp_store_rpc(s, _DDP_ST_ADD, 0, key, strlen(key), NULL, 0, NULL, 0, delta, 0, &resp, NULL, 0, NULL);
    pthread_mutex_unlock(&s->mu);
    if (r == DDP_SUCCESS && result) *result = resp.num;
    return r != DDP_SUCCESS ? r : (ddp_result_t)resp.status;
}

DDP_API ddp_result_t ddp_store_compare_set(ddp_store_t *s, const char *key, const void *expected,
                                           size_t expected_len, const void *desired, size_t desired_len,
                                           void *actual, size_t cap, size_t *actual_len) {
    _ddp_store_resp_t resp;
    ddp_result_t r = _ddp_store_check_key(s, key);
    if (r != DDP_SUCCESS) return r;
    if ((expected_len && !expected) || (desired_len && !desired) || (cap && !actual) ||
        expected_len > DDP_STORE_MAX_VALUE || desired_len > DDP_STORE_MAX_VALUE)
        return DDP_ERR_INVALID_ARGUMENT;
    pthread_mutex_lock(&s->mu);
    if (s->c10d) {
        r = _ddp_c10d_cas(s, key, expected, expected_len, desired, desired_len, actual, cap, actual_len);
        pthread_mutex_unlock(&s->mu);
        return r;
    }
    r = _ddp_store_rpc(s, _DDP_ST_CAS, 0, key, strlen(key), expected, expected_len, desired,
                       desired_len, 0, 0, &resp, actual, cap, actual_len);
    pthread_mutex_unlock(&s->mu);
    return r != DDP_SUCCESS ? r : (ddp_result_t)resp.status;
}

_DDP_PRIVATE ddp_result_t _ddp_store_wait_keys(ddp_store_t *s, const char *const *keys, int nkeys,
                                               int timeout_ms, int any) {
    char buf[8192];
    size_t off = 0;
    int i;
    _ddp_store_resp_t resp;
    ddp_result_t r;
    if (!s || nkeys < 0 || (nkeys && !keys)) return DDP_ERR_INVALID_ARGUMENT;
    for (i = 0; i < nkeys; i++) {
        size_t n;
        if ((r = _ddp_store_check_key(s, keys[i])) != DDP_SUCCESS) return r;
        n = strlen(keys[i]);
        if (off + n + 1 > sizeof buf) return DDP_ERR_INVALID_ARGUMENT;
        memcpy(buf + off, keys[i], n + 1);
        off += n + 1;
    }
    if (nkeys == 0) return DDP_SUCCESS;
    pthread_mutex_lock(&s->mu);
    if (s->c10d) {
        r = any ? _ddp_c10d_wait_any(s, keys, nkeys, timeout_ms) : _ddp_c10d_wait_all(s, keys, nkeys, timeout_ms);
        pthread_mutex_unlock(&s->mu);
        return r;
    }
    r = _ddp_store_rpc(s, _DDP_ST_WAIT, any ? _DDP_ST_WAIT_ANY : 0, buf, off - 1, NULL, 0, NULL, 0,
                       0, timeout_ms, &resp, NULL, 0, NULL);
    pthread_mutex_unlock(&s->mu);
    return r != DDP_SUCCESS ? r : (ddp_result_t)resp.status;
}

DDP_API ddp_result_t ddp_store_wait(ddp_store_t *s, const char *const *keys, int nkeys, int timeout_ms) {
    return _ddp_store_wait_keys(s, keys, nkeys, timeout_ms, 0);
}

DDP_API ddp_result_t ddp_store_check(ddp_store_t *s, const char *key, int *exists) {
    _ddp_store_resp_t resp;
    ddp_result_t r = _ddp_store_check_key(s, key);
    if (r != DDP_SUCCESS) return r;
    pthread_mutex_lock(&s->mu);
    if (s->c10d) {
        int ex = 0;
        r = _ddp_c10d_exists(s, &key, 1, &ex, _ddp_store_deadline(s, s->timeout_ms), s->timeout_ms);
        pthread_mutex_unlock(&s->mu);
        if (r == DDP_SUCCESS && exists) *exists = ex;
        return r;
    }
    r = _ddp_store_rpc(s, _DDP_ST_CHECK, 0, key, strlen(key), NULL, 0, NULL, 0, 0, 0, &resp, NULL, 0, NULL);
    pthread_mutex_unlock(&s->mu);
    if (r == DDP_SUCCESS && exists) *exists = (int)resp.num;
    return r != DDP_SUCCESS ? r : (ddp_result_t)resp.status;
}

DDP_API ddp_result_t ddp_store_delete(ddp_store_t *s, const char *key, int *deleted) {
    _ddp_store_resp_t resp;
    ddp_result_t r = _ddp_store_check_key(s, key);
    if (r != DDP_SUCCESS) return r;
    pthread_mutex_lock(&s->mu);
    if (s->c10d) {
        r = _ddp_c10d_delete(s, key, deleted);
        pthread_mutex_unlock(&s->mu);
        return r;
    }
    r = _ddp_store_rpc(s, _DDP_ST_DELETE, 0, key, strlen(key), NULL, 0, NULL, 0, 0, 0, &resp, NULL, 0, NULL);
    pthread_mutex_unlock(&s->mu);
    if (r == DDP_SUCCESS && deleted) *deleted = (int)resp.num;
    return r != DDP_SUCCESS ? r : (ddp_result_t)resp.status;
}

DDP_API int ddp_store_port(const ddp_store_t *s) { return s ? s->port : -1; }
DDP_API const char *ddp_store_last_error(const ddp_store_t *s) { return s ? s->last_error : "NULL store"; }

/* While reporting a failure the store must not become a second wait: short timeouts and no
 * reconnecting (the master may be the rank that died). */
_DDP_PRIVATE void _ddp_store_quick(ddp_store_t *s, int on) {
    static const int quick_ms = 1000;
    pthread_mutex_lock(&s->mu);   /* a transport's thread may be in a request (its timeout) */
    if (on && !s->quick) { s->quick = s->timeout_ms; s->timeout_ms = quick_ms; }
    else if (!on && s->quick) { s->timeout_ms = s->quick; s->quick = 0; }
    pthread_mutex_unlock(&s->mu);
}

#endif /* DDP_STORE_IMPLEMENTATION */
