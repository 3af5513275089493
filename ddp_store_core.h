/* SPDX-License-Identifier: MIT (see LICENSE) */
/* ddp_store_core.h — what every side of libddp's rendezvous store shares, private: the store
 * handle (one struct: a client, and on the server's rank the server behind it), libddp's own
 * wire protocol (spoken by ddp_store_server.h and ddp_store_client.h), the client interface
 * that libddp's client and the c10d client (ddp_store_c10d.h) each fill at connect, and a
 * client's connection: deadlines, the job key, dialing, connecting with backoff.
 * The public types (ddp_store_t, ddp_store_desc_t, the limits) are declared here so that every
 * store header below ddp_store.h can use them; users include ddp_store.h, which documents them
 * and declares the calls.
 * Depends on ddp_base.h, ddp_socket.h and ddp_auth.h. Built by DDP_IMPLEMENTATION (or
 * DDP_STORE_CORE_IMPLEMENTATION).
 */
#if defined(DDP_IMPLEMENTATION) && !defined(DDP_STORE_CORE_IMPLEMENTATION)
#define DDP_STORE_CORE_IMPLEMENTATION
#endif
#if defined(DDP_STORE_CORE_IMPLEMENTATION)
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

#ifndef DDP_STORE_CORE_H_INCLUDED
#define DDP_STORE_CORE_H_INCLUDED

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
    ddp_log_fn_t log_fn;          /* NULL: log lines go to stderr; else to this, with log_user */
    void *log_user;
    /* A client's connections leave from this numeric local address (NULL or "": the kernel
     * picks). Many clients of one host to one server share one address's ephemeral ports
     * (net.ipv4.ip_local_port_range, ~28,000 by default, TIME_WAIT sockets of earlier
     * connections included); spread over several (127.0.0.2, 127.0.0.3, ... all reach a
     * loopback server) they do not run out, and the kernel's search for a free port stays short. */
    const char *local_addr;
} ddp_store_desc_t;
#define DDP_STORE_MAX_KEY 1024
#define DDP_STORE_MAX_VALUE (16u << 20)

/* One request of ddp_store_batch (documented in ddp_store.h). Zero-initialise it, then set
 * kind, key and what the kind reads; the call fills result and what the kind answers. */
typedef enum ddp_store_op_kind {
    DDP_STORE_OP_SET = 1,     /* key = value (len bytes) */
    DDP_STORE_OP_GET,         /* waits for key; up to cap bytes into out; out_len = full length */
    DDP_STORE_OP_ADD,         /* key += delta; num = the new value */
    DDP_STORE_OP_COMPARE_SET, /* key = value if it equals expected; the value after, as GET */
    DDP_STORE_OP_WAIT,        /* waits for key (or for keys[0..nkeys), all of them or any) */
    DDP_STORE_OP_CHECK,       /* num = 1 when key exists */
    DDP_STORE_OP_DELETE,      /* num = 1 when key existed */
    DDP_STORE_OP_GET_IF_SET   /* at once: num = 1 and the value as GET when key exists, else 0 */
} ddp_store_op_kind_t;
typedef struct ddp_store_op {
    ddp_store_op_kind_t kind;
    const char *key;
    const void *value;        /* SET: the value; COMPARE_SET: the desired value */
    size_t len;
    const void *expected;     /* COMPARE_SET (a missing key matches expected_len == 0) */
    size_t expected_len;
    int64_t delta;            /* ADD */
    void *out;                /* GET, COMPARE_SET, GET_IF_SET: the value goes here, up to cap bytes */
    size_t cap;
    const char *const *keys;  /* WAIT on several keys (key unused): nkeys of them; any: one is enough */
    int nkeys, any;
    ddp_result_t result;      /* out: this request's own result */
    size_t out_len;           /* out: GET, COMPARE_SET, GET_IF_SET: the value's full length */
    int64_t num;              /* out: ADD's sum; CHECK's, DELETE's and GET_IF_SET's 0 or 1 */
} ddp_store_op_t;

#ifdef __cplusplus
}
#endif
#endif /* DDP_STORE_CORE_H_INCLUDED */


/* ============================================================================================
 * IMPLEMENTATION
 * ========================================================================================== */
#if defined(DDP_STORE_CORE_IMPLEMENTATION) && !defined(DDP_STORE_CORE_IMPL_INCLUDED)
#define DDP_STORE_CORE_IMPL_INCLUDED
#if !defined(DDP_SOCKET_IMPL_INCLUDED) || !defined(DDP_AUTH_IMPL_INCLUDED)
#error "libddp: ddp_store_core.h's implementation needs ddp_base.h's, ddp_socket.h's and ddp_auth.h's (define DDP_IMPLEMENTATION)"
#endif

/* ---------------------------------------------------------------- wire protocol, version 4
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
 * are answered when their keys exist, so a client blocks in recv with its own timeout.
 * Version 4 (was 3): GET_IF_SET (answers at once: num 1 and the value, or num 0); a client may
 * pipeline, sending several requests before reading their answers (ddp_store_batch); the server runs them in order, one connection's requests behind
 * its parked GET/WAIT (version 3 servers dropped a client that spoke while parked, so the two
 * versions refuse each other at the hello, each naming both versions). */
#define _DDP_STORE_MAGIC 0x44445053u /* "DDPS" */
#define _DDP_STORE_PROTO 4u
#define _DDP_STORE_LABEL "store"
#define _DDP_STORE_HELLO_MAX 128            /* body bytes a peer may send before authenticating */
#define _DDP_STORE_HANDSHAKE_MAX_MS 10000
#define _DDP_STORE_HANDSHAKE_MIN_MS 1000
#define _DDP_STORE_BACKOFF_MAX_MS 2000

enum { _DDP_ST_HELLO = 1, _DDP_ST_SET, _DDP_ST_GET, _DDP_ST_ADD, _DDP_ST_CAS, _DDP_ST_WAIT,
       _DDP_ST_CHECK, _DDP_ST_DELETE, _DDP_ST_GET_IF_SET, _DDP_ST_NUM_OPS };
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

/* ---------------------------------------------------------------- the client interface
 * One per protocol: libddp's own (ddp_store_client.h: _ddp_store_native) or PyTorch's c10d
 * TCPStore (ddp_store_c10d.h: _ddp_store_c10d), set on a handle just before its first connect
 * (ddp_store.h: _ddp_store_attach). The public calls (ddp_store.h) check their arguments, take
 * the handle's mutex and call through it; the connect loop below runs its handshake. Each
 * request connects first when the handle has no connection. */
typedef struct _ddp_store_client {
    const char *name;         /* the server, in an "unreachable" message ("c10d store", ...) */
    /* A fresh connection *fd: authenticate, or find the dialect (may replace *fd); *retry = 1
     * when the connection was lost on the way (then the caller connects again). */
    ddp_result_t (*handshake)(ddp_store_t *s, int *fd, int64_t deadline, int *retry);
    void (*connected)(ddp_store_t *s);       /* the INFO line of a connection made */
    void (*prepare)(ddp_store_t *s);         /* before the first connect (NULL: nothing) */
    ddp_result_t (*set)(ddp_store_t *s, const char *key, const void *value, size_t len);
    ddp_result_t (*get)(ddp_store_t *s, const char *key, void *value, size_t cap, size_t *len);
    ddp_result_t (*add)(ddp_store_t *s, const char *key, int64_t delta, int64_t *result);
    ddp_result_t (*compare_set)(ddp_store_t *s, const char *key, const void *expected,
                                size_t expected_len, const void *desired, size_t desired_len,
                                void *actual, size_t cap, size_t *actual_len);
    /* keys checked by the caller (1..DDP_STORE_MAX_KEY each, nkeys >= 1, together with their
     * NULs at most _DDP_STORE_WAIT_KEYS bytes); any: one key is enough. */
    ddp_result_t (*wait)(ddp_store_t *s, const char *const *keys, int nkeys, int timeout_ms, int any);
    ddp_result_t (*check)(ddp_store_t *s, const char *key, int *exists);
    ddp_result_t (*del)(ddp_store_t *s, const char *key, int *deleted);
    /* ops checked by the caller (ddp_store.h), within timeout_ms (0: the store's); NULL:
     * ddp_store_batch runs them one by one */
    ddp_result_t (*batch)(ddp_store_t *s, ddp_store_op_t *ops, int nops, int timeout_ms);
} _ddp_store_client_t;
#define _DDP_STORE_WAIT_KEYS 8192           /* the keys of one wait, NUL-separated */

/* The server's parts (ddp_store_server.h); the handle holds them by pointer. */
typedef struct _ddp_store_conn _ddp_store_conn_t;
typedef struct _ddp_throttle _ddp_throttle_t;
typedef struct _ddp_kv _ddp_kv_t;
typedef struct _ddp_waiter _ddp_waiter_t;
/* At most one log line a second per kind of trouble; the next line counts the others. */
typedef struct { int64_t last_us; unsigned long suppressed; } _ddp_store_rate_t;

#define _DDP_KV_BUCKETS 1024
#define _DDP_STORE_CLIENT_RX 4096                  /* a client's read-ahead of answers */
#define _DDP_STORE_LISTENERS 8              /* the server's listen queues (ddp_store_server.h) */
struct ddp_store {
    /* client side */
    const _ddp_store_client_t *client;   /* its protocol (NULL: none yet, as the fuzzers' store) */
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
    _ddp_log_sink_t log;      /* log_fn and log_user, else stderr */
    char secret[256];         /* the job secret: never written to a socket or a log */
    unsigned char key[_DDP_SHA256_BYTES];   /* the secret stretched with `salt` (ddp_auth.h:
                                             * _ddp_auth_job_key): the HMAC key of every proof */
    size_t keylen;            /* 0: no key yet (or no job secret) */
    unsigned char salt[_DDP_AUTH_SALT_BYTES];   /* the server's (in every challenge) */
    char last_error[512];
    /* libddp's client reads answers through this buffer: the answers to a batch arrive
     * together and one recv takes them all (rx_off..rx_len not yet used; empty on connect) */
    unsigned char rx[_DDP_STORE_CLIENT_RX];
    size_t rx_off, rx_len;
    /* Who serves the store, for messages ("rank 0", "the launcher (ddprun)"; "": not known, then
     * messages say "rank 0's store" as they always did). When a rank serves it and a connection
     * was made once, a refused reconnect means the server is gone for good: it fails at once
     * instead of retrying until the timeout (nothing restarts one rank's store). */
    char hosted_by[64];
    int connected_once;
    char local_addr[64];      /* desc.local_addr ("": none) */
    int chal_misses;          /* this connect's connections that got no challenge in time */
    int64_t connect_t0_us, connect_note_ms;   /* this connect's start, and its next WARN note */
    /* server side (the store was opened with is_server); the server thread owns all of it but
     * stop (atomic) and nclients (srv_mu) */
    int listen_fd;            /* the first of the listeners: listen_fds[0] */
    int listen_fds[_DDP_STORE_LISTENERS];   /* sockets sharing one port (SO_REUSEPORT) */
    int nlisten;
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
    _ddp_kv_t *buckets[_DDP_KV_BUCKETS];   /* the key table until it grows (kv_big) */
    _ddp_kv_t **kv_big;       /* the grown table, kv_nbuckets chains (NULL: buckets) */
    size_t kv_nbuckets, kv_count;
    /* Parked GET/WAITs filed under each key they wait for, so that a write re-checks only the
     * requests parked on the keys it wrote (ddp_store_server.h: the waiters' index). */
    _ddp_waiter_t **waiters;  /* nwaiter_chains chains (NULL: nothing filed yet) */
    size_t nwaiter_chains, nwaiter_nodes;
    _ddp_store_conn_t *woken_head, *woken_tail;   /* parked requests a write may have answered */
    int nunfiled;             /* parked but not filed (no memory): re-checked after every write */
    uint64_t nrerun;          /* parked requests run again after writes (tests read it) */
    unsigned char *srv_rx;    /* the server's read buffer, shared by every authenticated
                               * connection (ddp_store_server.h: reading ahead) */
};

_DDP_PRIVATE void _ddp_store_log(const ddp_store_t *s, int level, const char *fmt, ...) {
    va_list ap;
    if (!s || s->log_level < level) return;
    va_start(ap, fmt);
    _ddp_vlog_to(&s->log, s->log_rank - 1, level, fmt, ap);
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

/* ---------------------------------------------------------------- a client's connection
 * Closes the client's connection. In the process that opened it, the connection ends for the
 * server too, even where a forked child holds a copy of the descriptor (close alone would leave
 * the socket open: a parked request, or a server's close waiting for its clients to leave). In
 * such a child only its copy goes: the connection is the parent's. */
_DDP_PRIVATE void _ddp_store_hangup(ddp_store_t *s) {
    if (s->fd < 0) return;
    if (getpid() == s->owner_pid) shutdown(s->fd, SHUT_RDWR);
    close(s->fd);
    s->fd = -1;
    s->rx_off = s->rx_len = 0;   /* answers of that connection */
}

/* Sends every iovec before the deadline, in as few sendmsg calls as the socket allows (a
 * request, or a whole window of them, is one segment on the wire; both clients, libddp's and c10d's). iov is consumed. 0 or
 * -errno. */
_DDP_PRIVATE int _ddp_store_sendv(int fd, struct iovec *iov, int niov, int64_t deadline) {
    while (niov > 0) {
        struct msghdr mh;
        ssize_t n;
        memset(&mh, 0, sizeof mh);
        mh.msg_iov = iov;
        mh.msg_iovlen = (size_t)niov;
        n = sendmsg(fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            struct pollfd pfd;
            int ms = _ddp_ms_left(deadline);
            if (ms == 0) return -ETIMEDOUT;
            pfd.fd = fd; pfd.events = POLLOUT; pfd.revents = 0;
            if (poll(&pfd, 1, ms) < 0 && errno != EINTR) return -errno;
            continue;
        }
        if (n <= 0) return n == 0 ? -EPIPE : -errno;
        while (niov > 0 && (size_t)n >= iov->iov_len) { n -= (ssize_t)iov->iov_len; iov++; niov--; }
        if (niov > 0) { iov->iov_base = (char *)iov->iov_base + n; iov->iov_len -= (size_t)n; }
    }
    return 0;
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

/* The dial result for a host name that does not resolve. Said at once (WARN), then retried like
 * a refused connect: DNS may come up after the job (a Kubernetes service's name). */
#define _DDP_STORE_UNRESOLVABLE (-1000000)

/* How long one try waits for the server to accept a connection (its SYN answered). */
#define _DDP_STORE_DIAL_MS 2000

/* Binds fd to the handle's local address (desc.local_addr) of fd's family, the port left to
 * connect() (IP_BIND_ADDRESS_NO_PORT: a port bound early would be reserved for any peer).
 * 0 or -errno. */
_DDP_PRIVATE int _ddp_store_bind_local(const ddp_store_t *s, int fd, int family) {
    struct addrinfo hints, *res = NULL;
    int rc = 0, one = 1;
    if (!s->local_addr[0]) return 0;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = family;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICHOST | AI_PASSIVE;
    if (getaddrinfo(s->local_addr, "0", &hints, &res) != 0 || !res) return -EAFNOSUPPORT;
#ifdef IP_BIND_ADDRESS_NO_PORT
    setsockopt(fd, IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, &one, sizeof one);
#else
    (void)one;
#endif
    if (bind(fd, res->ai_addr, res->ai_addrlen) != 0) rc = -errno;
    freeaddrinfo(res);
    return rc;
}

/* Why a connect failed, in words that say what to look at. */
_DDP_PRIVATE void _ddp_store_dial_why(const ddp_store_t *s, int err, int bind_failed, char *why, size_t whycap) {
    if (bind_failed)
        snprintf(why, whycap, "cannot connect to %.200s:%d from the local address %s (desc.local_addr): "
                 "%s", s->host, s->port, s->local_addr, strerror(err));
    else if (err == EADDRNOTAVAIL)
        snprintf(why, whycap, "cannot connect to %.200s:%d: no free local port to connect from "
                 "(EADDRNOTAVAIL: the ephemeral ports of net.ipv4.ip_local_port_range are used up, "
                 "TIME_WAIT sockets of earlier connections included: ss -tan state time-wait | wc -l)",
                 s->host, s->port);
    else if (err == ETIMEDOUT)
        snprintf(why, whycap, "cannot connect to %.200s:%d: no answer to the connection request within "
                 "%d ms (SYNs dropped: the server's listen queue is full, see ListenOverflows in "
                 "/proc/net/netstat on its host, or a firewall, or the host is down)", s->host, s->port,
                 _DDP_STORE_DIAL_MS);
    else if (err == ECONNREFUSED)
        snprintf(why, whycap, "cannot connect to %.200s:%d: connection refused (nothing listens there "
                 "yet)", s->host, s->port);
    else
        snprintf(why, whycap, "cannot connect to %.200s:%d: %s", s->host, s->port, strerror(err));
}

/* One try at every address host resolves to: a connected fd, or -errno (*why says what). */
_DDP_PRIVATE int _ddp_store_dial(ddp_store_t *s, int64_t deadline, char *why, size_t whycap) {
    struct addrinfo hints, *res = NULL, *ai;
    char portstr[16];
    int last_err = ECONNREFUSED, rc, bind_failed = 0;
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
        int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol), one = 1;
        if (fd < 0) { last_err = errno; continue; }
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        if ((rc = _ddp_store_bind_local(s, fd, ai->ai_family)) != 0) {
            last_err = -rc;
            bind_failed = 1;
            close(fd);
            continue;
        }
        bind_failed = 0;
        if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0) { freeaddrinfo(res); return fd; }
        if (errno == EINPROGRESS) {
            struct pollfd pfd;
            int ms = _ddp_ms_left(deadline);
            if (ms < 0 || ms > _DDP_STORE_DIAL_MS) ms = _DDP_STORE_DIAL_MS;
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
    _ddp_store_dial_why(s, last_err, bind_failed, why, whycap);
    return -last_err;
}

/* Sleeps one backoff step (drawn from [b/2, 3b/2], never past the deadline: the connect's next
 * note when that comes first, so that the note is said on time) and doubles it. */
_DDP_PRIVATE void _ddp_store_backoff(int *backoff_ms, int64_t deadline) {
    int ms = (int)(_ddp_jitter_us((int64_t)*backoff_ms * 1000) / 1000), left = _ddp_ms_left(deadline);
    struct timespec ts;
    if (left >= 0 && ms > left) ms = left;
    ts.tv_sec = ms / 1000;
    ts.tv_nsec = (long)(ms % 1000) * 1000000L;
    nanosleep(&ts, NULL);
    *backoff_ms = *backoff_ms * 2 > _DDP_STORE_BACKOFF_MAX_MS ? _DDP_STORE_BACKOFF_MAX_MS : *backoff_ms * 2;
}

/* The note of a connect that lasts (the waits that speak: 10 s, 30 s, 60 s, then every 5 min),
 * when one is due: what it waits for. Also said while a connection waits for its challenge. */
_DDP_PRIVATE void _ddp_store_connect_note(ddp_store_t *s, const char *why) {
    const int64_t waited_ms = (_ddp_now_us() - s->connect_t0_us) / 1000;
    if (waited_ms < s->connect_note_ms) return;
    _ddp_store_log(s, DDP_LOG_WARN, "store: connecting to %s:%d for %lld s: %s (is MASTER_ADDR/MASTER_PORT "
                   "the same on every rank, and rank 0 running?)", s->host, s->port,
                   (long long)(waited_ms / 1000), why);
    s->connect_note_ms = _ddp_next_wait_note_ms(waited_ms);
}

/* Connects and authenticates, retrying until the store's timeout with exponential backoff and
 * jitter (10 ms doubling to 2 s, each wait drawn from [b/2, 3b/2]): ranks that all start at
 * once then do not retry in lockstep, the failure PyTorch's TCPStore saw as "connection reset
 * by peer" at 1,536 ranks. Wrong secrets and versions are final at once. The handshake is the
 * handle's protocol's (s->client). */
_DDP_PRIVATE ddp_result_t _ddp_store_connect(ddp_store_t *s) {
    char why[512] = "";
    const int64_t t0 = _ddp_now_us(), deadline = _ddp_store_deadline(s, s->timeout_ms);
    int backoff_ms = 10, attempts = 0, unresolved = 0, last_unresolved = 0, no_port = 0;
    s->chal_misses = 0;
    s->connect_t0_us = t0;
    s->connect_note_ms = _ddp_next_wait_note_ms(0);
    for (;;) {
        int retry = 1, fd = _ddp_store_dial(s, deadline, why, sizeof why);
        attempts++;
        last_unresolved = fd == _DDP_STORE_UNRESOLVABLE;
        if (last_unresolved && !unresolved++)
            _ddp_store_log(s, DDP_LOG_WARN, "store: %s; retrying until the timeout (%d ms), as DNS "
                           "may come up late", why, _ddp_ms_left(deadline));
        if (fd == -EADDRNOTAVAIL && !no_port++)   /* this host's trouble: said at once */
            _ddp_store_log(s, DDP_LOG_WARN, "store: %s; retrying until the timeout (%d ms)", why,
                           _ddp_ms_left(deadline));
        if (fd >= 0) {
            ddp_result_t r = s->client->handshake(s, &fd, deadline, &retry);
            if (r == DDP_SUCCESS) {
                s->fd = fd;
                s->connected_once = 1;
                s->client->connected(s);
                if (attempts > 1)
                    _ddp_store_log(s, DDP_LOG_TRACE, "store: after %d attempts", attempts);
                return r;
            }
            if (fd >= 0) close(fd);
            if (!retry) return r;
            _ddp_strlcpy(why, s->last_error, sizeof why);
            _ddp_store_log(s, DDP_LOG_TRACE, "store: %s; retrying", why);
        }
        if (fd == -ECONNREFUSED && s->connected_once && !strncmp(s->hosted_by, "rank ", 5))
            return _ddp_store_err(s, DDP_ERR_REMOTE, "the store at %s:%d was hosted by %s, which is "
                                  "gone (it served this rank before; now the connection is refused): "
                                  "%s exited or was killed, and the store went with it; launched "
                                  "without ddprun (mpirun, srun), a job cannot outlive its %s "
                                  "(ddprun keeps the store in the launcher)", s->host, s->port,
                                  s->hosted_by, s->hosted_by, s->hosted_by);
        if (_ddp_ms_left(deadline) == 0 && last_unresolved)
            return _ddp_store_err(s, DDP_ERR_TIMEOUT, "rendezvous: %s (retried for %d ms, %d attempts)",
                                  why, (int)((_ddp_now_us() - t0) / 1000), attempts);
        if (_ddp_ms_left(deadline) == 0)
            return _ddp_store_err(s, DDP_ERR_TIMEOUT, "%s %s:%d unreachable after %d ms (%d attempts): "
                                  "%s", s->client->name, s->host, s->port,
                                  (int)((_ddp_now_us() - t0) / 1000), attempts, why);
        _ddp_store_connect_note(s, why);       /* a wait that lasts says what it waits for */
        {
            const int64_t note_us = t0 + s->connect_note_ms * 1000;
            _ddp_store_backoff(&backoff_ms, deadline && deadline < note_us ? deadline : note_us);
        }
    }
}

/* A store with no sockets yet (also what the fuzzers drive with _ddp_store_feed). */
_DDP_PRIVATE ddp_store_t *_ddp_store_new(const char *host, int port, const ddp_store_desc_t *d) {
    const char *secret;
    ddp_store_t *s = (ddp_store_t *)DDP_MALLOC(sizeof *s);
    if (!s) return NULL;
    memset(s, 0, sizeof *s);
    s->fd = s->listen_fd = s->epfd = s->spare_fd = s->diag_fd = -1;
    s->listen_fds[0] = -1;
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
    s->log.fn = d ? d->log_fn : NULL;
    s->log.user = d ? d->log_user : NULL;
    s->log.fd = 2;
    _ddp_strlcpy(s->local_addr, d && d->local_addr ? d->local_addr : "", sizeof s->local_addr);
    return s;
}

#endif /* DDP_STORE_CORE_IMPLEMENTATION */
