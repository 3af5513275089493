/* SPDX-License-Identifier: MIT (see LICENSE) */
/* ddp_store_server.h — libddp's rendezvous store server, private: the key-value table, the
 * connections (read in place, one handler per request, GET/WAIT parked until their keys
 * exist), the handshake's server side and the throttle on wrong proofs, the epoll loop on its
 * own thread, and starting and stopping it (listening, descriptor limits, what its security
 * rests on). What it promises is in ddp_store.h ("THE SERVER"); ddp_store_open(is_server = 1)
 * starts it. Linux only (epoll).
 * Depends on ddp_store_core.h. Built by DDP_IMPLEMENTATION (or DDP_STORE_SERVER_IMPLEMENTATION).
 */
#if defined(DDP_IMPLEMENTATION) && !defined(DDP_STORE_SERVER_IMPLEMENTATION)
#define DDP_STORE_SERVER_IMPLEMENTATION
#endif
#if defined(DDP_STORE_SERVER_IMPLEMENTATION) && !defined(DDP_STORE_CORE_IMPLEMENTATION)
#define DDP_STORE_CORE_IMPLEMENTATION
#endif
#include "ddp_store_core.h"

#if defined(DDP_STORE_SERVER_IMPLEMENTATION) && !defined(DDP_STORE_SERVER_IMPL_INCLUDED)
#define DDP_STORE_SERVER_IMPL_INCLUDED
#ifndef DDP_STORE_CORE_IMPL_INCLUDED
#error "libddp: ddp_store_server.h's implementation needs ddp_store_core.h's (define DDP_IMPLEMENTATION)"
#endif
#if !defined(__linux__)
#error "libddp: ddp_store_server.h needs epoll (Linux)"
#endif
#include <sys/epoll.h>
#include <sys/resource.h>

#define _DDP_STORE_BACKLOG 4096             /* a burst of 1,024+ connects; the kernel caps it at somaxconn */
#define _DDP_STORE_BATCH 64                 /* events per epoll_wait; reads per event */
/* Reading ahead (see "reading requests"): an authenticated connection's recv takes up to RX
 * bytes into the server's one read buffer, so a pipelined batch costs one recv; what cannot run
 * yet (behind a parked GET/WAIT, or while OUT_MAX bytes of answers wait for the client to read
 * them) is kept in the connection's `ahead`, and nothing more is read from it until that is
 * used up: a client that pipelines without reading holds at most RX bytes ahead and OUT_MAX
 * bytes (plus one answer) of output on the server. */
#define _DDP_STORE_SERVER_RX (64u << 10)
#define _DDP_STORE_OUT_MAX (256u << 10)
/* Accepts per wake-up. A listen queue that fills drops SYNs (and final ACKs: then a connection
 * the client sees made never reaches the server), and every drop costs a client a
 * retransmission timeout (1 s, 3 s, 7 s...): taken 64 at a time between rounds of requests,
 * 16,384 clients arriving at once overflowed it. Not the whole queue at once either: the hellos
 * of those accepted must be read before too many wait (max_pending closes the oldest). */
#define _DDP_STORE_ACCEPT_BATCH 512
#define _DDP_STORE_ACCEPT_MIN 16
/* Wrong proofs (see THE SERVER in ddp_store.h): each source gets a few free, then waits BASE ms, doubling
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

/* Whom wrong proofs are counted against: an IPv4 address, an IPv6 /64 (one host gets a whole
 * /64), or, for a connection from this host, the user that owns the connecting socket. */
enum { _DDP_SRC_NONE = 0, _DDP_SRC_V4, _DDP_SRC_V6, _DDP_SRC_LOOP, _DDP_SRC_LOOP_ADDR, _DDP_SRC_UID };
typedef struct { unsigned char kind, b[16]; } _ddp_src_t;
struct _ddp_throttle {
    _ddp_src_t src;
    int used;
    int queued;               /* its hellos waiting for their turn */
    uint32_t failures;
    int64_t last_fail_us;
    int64_t next_us;          /* its next proof is checked no earlier than this */
};

struct _ddp_kv {
    struct _ddp_kv *next;
    uint32_t klen, vlen;
    char *key;
    unsigned char *val;
};

/* A server-side connection. Before it authenticates (state HELLO) it owns this struct, the
 * challenge in `out` and nothing else: the hello's body goes to the fixed `hello` buffer. */
enum { _DDP_CONN_HELLO, _DDP_CONN_READY, _DDP_CONN_CLOSING, _DDP_CONN_DEAD };
struct _ddp_store_conn {
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
    unsigned char *ahead;     /* read ahead, not yet run (READY only; at most _DDP_STORE_SERVER_RX) */
    size_t ahead_len, ahead_off;
    int hangup_only;          /* parked, read ahead, and more came: watched for its hangup only */
    char addr[64];
    _ddp_src_t src;           /* for the throttle */
    int held;                 /* 1: its hello waits for its source's turn; 2: its refusal waits */
    int64_t held_until_us;
    struct _ddp_store_conn *hprev, *hnext;   /* the server's held list */
    /* A parked request's keys, each filed in the waiters' index (see there) */
    _ddp_waiter_t *wk;        /* nwk of wk_cap in use */
    size_t nwk, wk_cap;
    int filed;                /* 1: its keys are filed; -1: parked unfiled (no memory); 0: not parked */
    int woken;                /* on the server's woken list */
    struct _ddp_store_conn *wprev, *wnext;   /* the woken list */
};

/* One key of a parked request, in the chain of the waiters' index its key hashes to. */
struct _ddp_waiter {
    struct _ddp_waiter *next, **pprev;
    _ddp_store_conn_t *conn;
    uint64_t hash;            /* of the key (_ddp_fnv1a): equal hashes are re-checked, so a
                               * collision costs a look, never a wrong answer */
};

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

/* ---------------------------------------------------------------- the waiters' index
 * A GET or WAIT whose keys do not exist yet is parked; each of its keys is filed here, in a
 * chain chosen by the key's hash (the nodes live in the connection: c->wk). A write looks at
 * the one chain of the key it wrote and puts the requests filed under that key on the woken
 * list; after the round, only those are run again (a request on several keys is woken by any of
 * them, and parked again if it still waits). Before, every write made the server run every
 * parked request again: with N clients parked on one key while N others write, N^2 re-checks.
 * The chains double when the filed keys outnumber them twice over, so a write's look stays
 * short whatever the job's size (a key with many waiters makes one long chain, which a write
 * of another key reaches with probability 1 / chains). Memory: the chains, and per parked
 * connection its keys' nodes, allocated when it parks with more keys than ever before. Without
 * memory a request is parked unfiled and re-checked after every write, as before. */
_DDP_PRIVATE void _ddp_waiters_link(_ddp_waiter_t **chain, _ddp_waiter_t *w) {
    w->next = *chain;
    if (w->next) w->next->pprev = &w->next;
    w->pprev = chain;
    *chain = w;
}

/* Enough chains for `nodes` filed keys: 0, or -1 when out of memory (the table is kept). */
_DDP_PRIVATE int _ddp_waiters_reserve(ddp_store_t *s, size_t nodes) {
    size_t n = s->nwaiter_chains, m = n ? n : _DDP_KV_BUCKETS, i;
    _ddp_waiter_t **t;
    while (nodes > 2 * m && m <= (size_t)-1 / 4 / sizeof *t) m *= 2;
    if (m == n) return 0;
    if (!(t = (_ddp_waiter_t **)DDP_MALLOC(m * sizeof *t))) return n ? 0 : -1;   /* longer chains */
    memset(t, 0, m * sizeof *t);
    for (i = 0; i < n; i++) {
        while (s->waiters[i]) {
            _ddp_waiter_t *w = s->waiters[i];
            s->waiters[i] = w->next;
            _ddp_waiters_link(&t[w->hash % m], w);
        }
    }
    DDP_FREE(s->waiters);
    s->waiters = t;
    s->nwaiter_chains = m;
    return 0;
}

_DDP_PRIVATE void _ddp_woken_unlink(ddp_store_t *s, _ddp_store_conn_t *c) {
    if (!c->woken) return;
    if (c->wprev) c->wprev->wnext = c->wnext; else s->woken_head = c->wnext;
    if (c->wnext) c->wnext->wprev = c->wprev; else s->woken_tail = c->wprev;
    c->wprev = c->wnext = NULL;
    c->woken = 0;
}

_DDP_PRIVATE void _ddp_woken_add(ddp_store_t *s, _ddp_store_conn_t *c) {
    if (c->woken) return;
    c->woken = 1;
    c->wnext = NULL;
    c->wprev = s->woken_tail;
    if (s->woken_tail) s->woken_tail->wnext = c; else s->woken_head = c;
    s->woken_tail = c;
}

/* A parked request's keys: GET has one; WAIT's are NUL-separated (as _ddp_store_wait_ready
 * reads them). Counts them, and with `w` hashes them into w[0..]. */
_DDP_PRIVATE size_t _ddp_waiter_keys(const _ddp_store_req_t *rq, const char *key, _ddp_waiter_t *w) {
    uint32_t off = 0;
    size_t k = 0;
    if (rq->op != _DDP_ST_WAIT) {
        if (w) w[0].hash = _ddp_fnv1a(key, rq->klen, _DDP_FNV_INIT);
        return 1;
    }
    while (off < rq->klen) {
        uint32_t n = 0;
        while (off + n < rq->klen && key[off + n]) n++;
        if (w) w[k].hash = _ddp_fnv1a(key + off, n, _DDP_FNV_INIT);
        k++;
        off += n + 1;
    }
    return k;
}

/* Files a request that was just parked under each of its keys (or parks it unfiled). */
_DDP_PRIVATE void _ddp_waiter_file(ddp_store_t *s, _ddp_store_conn_t *c, const _ddp_store_req_t *rq,
                                   const char *key) {
    size_t k = _ddp_waiter_keys(rq, key, NULL), i;
    if (c->filed) return;
    if (k > c->wk_cap) {
        _ddp_waiter_t *w = k <= (size_t)-1 / sizeof *w ? (_ddp_waiter_t *)DDP_MALLOC(k * sizeof *w) : NULL;
        if (w) { DDP_FREE(c->wk); c->wk = w; c->wk_cap = k; }
    }
    if (k > c->wk_cap || _ddp_waiters_reserve(s, s->nwaiter_nodes + k) != 0) {
        c->filed = -1;
        s->nunfiled++;
        return;
    }
    _ddp_waiter_keys(rq, key, c->wk);
    for (i = 0; i < k; i++) {
        c->wk[i].conn = c;
        _ddp_waiters_link(&s->waiters[c->wk[i].hash % s->nwaiter_chains], &c->wk[i]);
    }
    c->nwk = k;
    s->nwaiter_nodes += k;
    c->filed = 1;
}

/* Takes a request's keys out of the index (it was answered, woken or dropped). */
_DDP_PRIVATE void _ddp_waiter_unfile(ddp_store_t *s, _ddp_store_conn_t *c) {
    size_t i;
    if (c->filed < 0) s->nunfiled--;
    if (c->filed > 0) {
        for (i = 0; i < c->nwk; i++) {
            _ddp_waiter_t *w = &c->wk[i];
            *w->pprev = w->next;
            if (w->next) w->next->pprev = w->pprev;
        }
        s->nwaiter_nodes -= c->nwk;
    }
    c->nwk = 0;
    c->filed = 0;
}

/* A key was written: the requests filed under it are woken (run again after this round). */
_DDP_PRIVATE void _ddp_waiters_wake(ddp_store_t *s, const char *key, uint32_t klen) {
    uint64_t h;
    _ddp_waiter_t *w;
    if (!s->nwaiter_nodes) return;
    h = _ddp_fnv1a(key, klen, _DDP_FNV_INIT);
    for (w = s->waiters[h % s->nwaiter_chains]; w; w = w->next)
        if (w->hash == h) _ddp_woken_add(s, w->conn);
}

/* ---------------------------------------------------------------- key-value table
 * Chains: _DDP_KV_BUCKETS inline at first, doubled (rehashed) whenever the keys outnumber them
 * twice over, so a lookup stays short at any job size (a fixed 1024 made every lookup walk
 * keys/1024 entries, and a rendezvous of N ranks grow as N^2). A doubling that finds no memory
 * keeps the table: slower, still correct. */
_DDP_PRIVATE _ddp_kv_t **_ddp_kv_table(ddp_store_t *s, size_t *n) {
    if (!s->kv_big) { *n = _DDP_KV_BUCKETS; return s->buckets; }
    *n = s->kv_nbuckets;
    return s->kv_big;
}

_DDP_PRIVATE void _ddp_kv_grow(ddp_store_t *s) {
    size_t n, m, i;
    _ddp_kv_t **old = _ddp_kv_table(s, &n), **t;
    if (s->kv_count <= 2 * n || n > (size_t)-1 / 2 / sizeof *t) return;
    m = 2 * n;
    if (!(t = (_ddp_kv_t **)DDP_MALLOC(m * sizeof *t))) return;
    memset(t, 0, m * sizeof *t);
    for (i = 0; i < n; i++) {
        _ddp_kv_t *e = old[i];
        while (e) {
            _ddp_kv_t *next = e->next;
            size_t b = (size_t)(_ddp_fnv1a(e->key, e->klen, _DDP_FNV_INIT) % m);
            e->next = t[b];
            t[b] = e;
            e = next;
        }
    }
    if (s->kv_big) DDP_FREE(s->kv_big);
    else memset(s->buckets, 0, sizeof s->buckets);
    s->kv_big = t;
    s->kv_nbuckets = m;
}

_DDP_PRIVATE _ddp_kv_t **_ddp_kv_slot(ddp_store_t *s, const char *key, uint32_t klen) {
    size_t n;
    _ddp_kv_t **table = _ddp_kv_table(s, &n);
    _ddp_kv_t **pp = &table[_ddp_fnv1a(key, klen, _DDP_FNV_INIT) % n];
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
        e->val = v;
        e->vlen = vlen;
        *pp = e;
        s->kv_count++;
        s->changed = 1;
        _ddp_kv_grow(s);
        _ddp_waiters_wake(s, key, klen);
        return 0;
    }
    DDP_FREE(e->val);
    e->val = v;
    e->vlen = vlen;
    s->changed = 1;
    _ddp_waiters_wake(s, key, klen);
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
#define _DDP_STORE_TOKEN_LISTEN 1u      /* the first listener; listener i is TOKEN_LISTEN + i */
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

/* Whether a connection's next request may run now: authenticated, nothing parked, and its
 * client reading its answers (at most _DDP_STORE_OUT_MAX bytes of them unsent). */
_DDP_PRIVATE int _ddp_conn_can_take(const _ddp_store_conn_t *c) {
    return c->state == _DDP_CONN_READY && !c->waiting && !c->held && c->out_len - c->out_off <= _DDP_STORE_OUT_MAX;
}

/* epoll interest: input while requests may run and nothing read ahead waits, output while
 * something is queued. A parked request keeps the input interest, so that its client's hangup
 * or pipelined requests are noticed without a change of interest in the common case, where the
 * client sends nothing more while it waits (a batch's requests behind the wait came with it and
 * are read ahead); only when more comes while read-ahead bytes wait is it watched for its
 * hangup alone (EPOLLRDHUP). */
_DDP_PRIVATE void _ddp_conn_watch(ddp_store_t *s, _ddp_store_conn_t *c) {
    struct epoll_event ev;
    uint32_t want = 0;
    if (s->epfd < 0 || c->fd < 0 || c->state == _DDP_CONN_DEAD) return;
    if (c->state == _DDP_CONN_CLOSING || c->held) want = 0;
    else if (c->waiting) want = c->hangup_only ? (uint32_t)EPOLLRDHUP : (uint32_t)EPOLLIN;
    else if (c->state == _DDP_CONN_HELLO || (_ddp_conn_can_take(c) && c->ahead_off == c->ahead_len)) want = (uint32_t)EPOLLIN;
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
    _ddp_waiter_unfile(s, c);
    _ddp_woken_unlink(s, c);
    s->conns[c->slot] = NULL;
    s->free_slots[s->nfree++] = c->slot;
    s->nconns--;
    /* The connection ends for the client too, even where a child forked after the accept holds
     * a copy of the descriptor (close alone would leave the socket open there: the client would
     * wait for an answer or an end that never comes, until its timeout). */
    if (c->fd >= 0 && getpid() == s->owner_pid) shutdown(c->fd, SHUT_RDWR);
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
        DDP_FREE(c->ahead);
        DDP_FREE(c->wk);
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

_DDP_PRIVATE int _ddp_store_on_get_if_set(ddp_store_t *s, _ddp_store_conn_t *c, const _ddp_store_msg_t *m) {
    _ddp_kv_t *e = *_ddp_kv_slot(s, m->key, m->rq.klen);
    if (!e) return _ddp_conn_reply(c, DDP_SUCCESS, 0, NULL, 0);
    return _ddp_conn_reply(c, DDP_SUCCESS, 1, e->val, e->vlen);
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
        s->kv_count--;
    }
    return _ddp_conn_reply(c, DDP_SUCCESS, e != NULL, NULL, 0);
}

typedef int (*_ddp_store_handler_t)(ddp_store_t *, _ddp_store_conn_t *, const _ddp_store_msg_t *);
static const _ddp_store_handler_t _ddp_store_handlers[_DDP_ST_NUM_OPS] = {
    NULL, _ddp_store_on_hello, _ddp_store_on_set, _ddp_store_on_get, _ddp_store_on_add,
    _ddp_store_on_cas, _ddp_store_on_wait, _ddp_store_on_check, _ddp_store_on_delete,
    _ddp_store_on_get_if_set};

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
        _ddp_waiter_file(s, c, &m.rq, m.key);
        return 0;
    }
    if (c->waiting) { c->waiting = 0; s->nwaiting--; }
    c->hangup_only = 0;
    _ddp_waiter_unfile(s, c);
    if (c->wk_cap > 1024) {                       /* an answered wait on many keys: its nodes go */
        DDP_FREE(c->wk);
        c->wk = NULL;
        c->wk_cap = 0;
    }
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

/* An authenticated connection's bytes p[0..n) as far as its requests may run now (see
 * _ddp_conn_can_take): how many it took, or -1 (drop the connection). */
_DDP_PRIVATE ssize_t _ddp_conn_take(ddp_store_t *s, _ddp_store_conn_t *c, const unsigned char *p, size_t n) {
    size_t used = 0;
    while (used < n && _ddp_conn_can_take(c)) {
        unsigned char *dst;
        size_t room;
        if (_ddp_conn_rx_space(c, &dst, &room) != 0) return -1;
        if (room > n - used) room = n - used;
        memcpy(dst, p + used, room);
        used += room;
        if (_ddp_conn_rx_done(s, c, room) != 0) return -1;
    }
    return (ssize_t)used;
}

/* Runs what was read ahead, as far as it may run now; the rest stays. 0, or -1 (drop). */
_DDP_PRIVATE int _ddp_conn_run_ahead(ddp_store_t *s, _ddp_store_conn_t *c) {
    ssize_t used = _ddp_conn_take(s, c, c->ahead + c->ahead_off, c->ahead_len - c->ahead_off);
    if (used < 0) return -1;
    c->ahead_off += (size_t)used;
    if (c->ahead_off == c->ahead_len) {
        DDP_FREE(c->ahead);
        c->ahead = NULL;
        c->ahead_off = c->ahead_len = 0;
    }
    return 0;
}

/* One recv of up to _DDP_STORE_SERVER_RX bytes into the server's read buffer, for an
 * authenticated connection whose requests may run: they run there, and what cannot run yet is
 * kept in its `ahead` (then nothing more is read from it until that has run). A read that
 * fills the buffer is followed by another (a few at most: the others' turn). 0, or -1 (drop). */
_DDP_PRIVATE int _ddp_conn_read_ahead(ddp_store_t *s, _ddp_store_conn_t *c) {
    int round;
    for (round = 0; round < 4 && _ddp_conn_can_take(c) && c->ahead_off == c->ahead_len; round++) {
        ssize_t used, n = recv(c->fd, s->srv_rx, _DDP_STORE_SERVER_RX, MSG_DONTWAIT);
        if (n == 0) return -1;
        if (n < 0) return (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) ? 0 : -1;
        if ((used = _ddp_conn_take(s, c, s->srv_rx, (size_t)n)) < 0) return -1;
        if (used < n) {
            c->ahead = (unsigned char *)DDP_MALLOC((size_t)(n - used));
            if (!c->ahead) {
                _ddp_store_log(s, DDP_LOG_WARN, "store: no memory to keep %zd pipelined bytes from %s; "
                               "connection dropped", n - used, c->addr);
                return -1;
            }
            memcpy(c->ahead, s->srv_rx + used, (size_t)(n - used));
            c->ahead_off = 0;
            c->ahead_len = (size_t)(n - used);
            return 0;
        }
        if ((size_t)n < _DDP_STORE_SERVER_RX) return 0;   /* the socket is empty for now */
    }
    return 0;
}

/* ---------------------------------------------------------------- the server loop */
/* After input or output: send what is queued, close a connection whose last answer is out,
 * keep epoll's interest right. */
_DDP_PRIVATE void _ddp_conn_settle(ddp_store_t *s, _ddp_store_conn_t *c) {
    if (c->state == _DDP_CONN_DEAD) return;
    if (c->held) { _ddp_conn_watch(s, c); return; }   /* its answer waits for the throttle */
    for (;;) {                                          /* answers out, then what was read ahead */
        if (_ddp_conn_flush(c) != 0) { _ddp_store_drop(s, c); return; }
        if (c->ahead_off == c->ahead_len || !_ddp_conn_can_take(c)) break;
        if (_ddp_conn_run_ahead(s, c) != 0) { _ddp_store_drop(s, c); return; }
    }
    if (c->state == _DDP_CONN_CLOSING && c->out_len == c->out_off && c->fd >= 0) {
        _ddp_store_drop(s, c);
        return;
    }
    _ddp_conn_watch(s, c);
}

/* A parked client's socket is readable: requests it pipelined behind the parked one are read
 * ahead (they run once it is answered); when some already are, the rest stays in the socket and
 * from now on only its hangup is watched; its end (its own timeout ran out) drops it. */
_DDP_PRIVATE int _ddp_conn_read_parked(ddp_store_t *s, _ddp_store_conn_t *c) {
    ssize_t n = -1;
    if (c->ahead_off < c->ahead_len && !c->hangup_only) {   /* no room: only look (its end?) */
        unsigned char b;
        n = recv(c->fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
        if (n > 0) { c->hangup_only = 1; return 0; }
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return 0;
    } else if (c->ahead_off == c->ahead_len && s->srv_rx) {
        n = recv(c->fd, s->srv_rx, _DDP_STORE_SERVER_RX, MSG_DONTWAIT);
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return 0;
    }
    if (n <= 0) {
        _ddp_store_log(s, DDP_LOG_TRACE, "store: client %s left while waiting", c->addr);
        return -1;
    }
    DDP_FREE(c->ahead);
    if (!(c->ahead = (unsigned char *)DDP_MALLOC((size_t)n))) return -1;
    memcpy(c->ahead, s->srv_rx, (size_t)n);
    c->ahead_off = 0;
    c->ahead_len = (size_t)n;
    return 0;
}

/* Reads what the socket has (a bounded amount per call, so one big request does not starve the
 * others): before authentication exactly the hello (nothing of the peer's is kept past it),
 * then through the read buffer (_ddp_conn_read_ahead). -1 = drop the connection. */
_DDP_PRIVATE int _ddp_conn_readable(ddp_store_t *s, _ddp_store_conn_t *c) {
    int round;
    for (round = 0; round < _DDP_STORE_BATCH; round++) {
        unsigned char *dst;
        size_t room;
        ssize_t n;
        if (c->waiting) return _ddp_conn_read_parked(s, c);
        if (c->state == _DDP_CONN_READY && s->srv_rx) return _ddp_conn_read_ahead(s, c);
        if (_ddp_conn_rx_space(c, &dst, &room) != 0) return -1;
        n = recv(c->fd, dst, room, MSG_DONTWAIT);
        if (n == 0) return -1;
        if (n < 0) return (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) ? 0 : -1;
        if (_ddp_conn_rx_done(s, c, (size_t)n) != 0) return -1;
        /* After the hello, the client speaks only once it has the answer: nothing to read now
         * (were there, epoll says so again) */
        if (c->waiting || c->held || c->state != _DDP_CONN_HELLO) return 0;
    }
    return 0;
}

_DDP_PRIVATE void _ddp_conn_event(ddp_store_t *s, _ddp_store_conn_t *c, uint32_t ev) {
    if (c->state == _DDP_CONN_DEAD) return;
    if ((ev & EPOLLOUT) && !c->held && _ddp_conn_flush(c) != 0) { _ddp_store_drop(s, c); return; }
    if (ev & (EPOLLIN | EPOLLHUP | EPOLLERR | EPOLLRDHUP)) {
        if (c->state == _DDP_CONN_CLOSING || (c->state == _DDP_CONN_READY && !c->waiting && !(ev & EPOLLIN))) {
            /* nothing to read now (input not watched): only a peer that is gone matters */
            if (ev & (EPOLLHUP | EPOLLERR)) { _ddp_store_drop(s, c); return; }
        } else if (_ddp_conn_readable(s, c) != 0) {
            _ddp_store_drop(s, c);
            return;
        }
    }
    _ddp_conn_settle(s, c);
}

/* Writes happened: run again the parked GET/WAITs they woke (answered now, or parked again),
 * and, only when memory ran short, the ones parked unfiled. */
_DDP_PRIVATE void _ddp_store_rerun_one(ddp_store_t *s, _ddp_store_conn_t *c) {
    s->nrerun++;
    _ddp_waiter_unfile(s, c);
    if (_ddp_store_execute(s, c) != 0) { _ddp_store_drop(s, c); return; }
    _ddp_conn_settle(s, c);
}

_DDP_PRIVATE void _ddp_store_rerun_waiting(ddp_store_t *s) {
    const int changed = s->changed;
    size_t i;
    s->changed = 0;
    while (s->woken_head) {                   /* handlers that park write nothing: none join */
        _ddp_store_conn_t *c = s->woken_head;
        _ddp_woken_unlink(s, c);
        if (c->waiting) _ddp_store_rerun_one(s, c);
    }
    for (i = 0; changed && s->nunfiled && i < s->conns_hwm; i++) {
        _ddp_store_conn_t *c = s->conns[i];
        if (c && c->waiting && c->filed < 0) _ddp_store_rerun_one(s, c);
    }
}

_DDP_PRIVATE void _ddp_store_pause_accept(ddp_store_t *s, int ms) {
    int i;
    if (s->accept_resume_us || s->epfd < 0) return;
    for (i = 0; i < s->nlisten; i++) epoll_ctl(s->epfd, EPOLL_CTL_DEL, s->listen_fds[i], NULL);
    s->accept_resume_us = _ddp_now_us() + (int64_t)ms * 1000;
}

/* Every listener joins the epoll set (again): 0, or -1 when one could not. */
_DDP_PRIVATE int _ddp_store_watch_listeners(ddp_store_t *s) {
    struct epoll_event ev;
    int i, rc = 0;
    for (i = 0; i < s->nlisten; i++) {
        memset(&ev, 0, sizeof ev);
        ev.events = EPOLLIN;
        ev.data.u64 = _DDP_STORE_TOKEN_LISTEN + (uint64_t)i;
        if (epoll_ctl(s->epfd, EPOLL_CTL_ADD, s->listen_fds[i], &ev) != 0 && errno != EEXIST) rc = -1;
    }
    return rc;
}

_DDP_PRIVATE void _ddp_store_resume_accept(ddp_store_t *s, int64_t now) {
    if (!s->accept_resume_us || now < s->accept_resume_us) return;
    if (_ddp_store_watch_listeners(s) == 0) s->accept_resume_us = 0;
    else s->accept_resume_us = now + 100000;
}

/* accept() failed for want of descriptors or memory: make room and go on serving. 1 = try
 * accept again. The oldest unauthenticated connection goes first (a rank authenticates in
 * milliseconds, so that is a stranger or a stalled peer; a rank that is cut off retries); with
 * none, the spare descriptor lets us accept and close the newcomer, so the listen queue drains. */
_DDP_PRIVATE int _ddp_store_out_of_fds(ddp_store_t *s, int lfd, int err) {
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
        fd = _ddp_accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
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

_DDP_PRIVATE void _ddp_store_accept(ddp_store_t *s, int lfd) {
    /* No more than the unauthenticated may still grow by: the hellos of those accepted are read
     * first, and the rest wait in the listen queues. Accepting on regardless made a burst of
     * 16,384 clients close thousands of the oldest (whose hellos were on the way) to make room,
     * and each came back. At least a few, so that strangers filling the quota do not stop accepts
     * (the oldest of them go, as below). */
    int i, room = s->max_pending - s->npending;
    if (room < _DDP_STORE_ACCEPT_MIN) room = _DDP_STORE_ACCEPT_MIN;
    if (room > _DDP_STORE_ACCEPT_BATCH) room = _DDP_STORE_ACCEPT_BATCH;
    for (i = 0; i < room; i++) {
        struct sockaddr_storage ss;
        socklen_t sl = sizeof ss;
        char addr[64];
        _ddp_store_conn_t *c;
        int fd = _ddp_accept4(lfd, (struct sockaddr *)&ss, &sl, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd < 0) {
            int e = errno;
            if (e == EAGAIN || e == EWOULDBLOCK) return;
            if (e == EINTR || e == ECONNABORTED || e == EPROTO || e == EPERM) continue;
            if (e == EMFILE || e == ENFILE || e == ENOBUFS || e == ENOMEM) {
                if (_ddp_store_out_of_fds(s, lfd, e)) continue;
                return;
            }
            _ddp_store_warn_rate(s, &s->rate_fds, "store: accept: %s; pausing accepts for 100 ms", strerror(e));
            _ddp_store_pause_accept(s, 100);
            return;
        }
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
            } else if (token >= _DDP_STORE_TOKEN_LISTEN && token < _DDP_STORE_TOKEN_LISTEN + (uint64_t)s->nlisten) {
                if (!s->accept_resume_us) _ddp_store_accept(s, s->listen_fds[token - _DDP_STORE_TOKEN_LISTEN]);
            } else {
                /* NULL: its connection was dropped earlier in this batch */
                _ddp_store_conn_t *c = _ddp_store_conn_of(s, token);
                if (c) _ddp_conn_event(s, c, ev[i].events);
            }
        }
        if (s->changed || s->woken_head) _ddp_store_rerun_waiting(s);
        now = _ddp_now_us();
        _ddp_store_release_held(s, now);
        _ddp_store_expire(s, now);
        _ddp_store_resume_accept(s, now);
        _ddp_store_reap(s);
    }
    return NULL;
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

/* Binds and (listen) listens: -errno or the fd. reuseport: one of the listeners that share the port. */
_DDP_PRIVATE int _ddp_store_bind(const struct sockaddr *sa, socklen_t len, int v6only, int reuseport, int listen_too) {
    int one = 1, fd = socket(sa->sa_family, SOCK_STREAM | SOCK_CLOEXEC, 0), e;
    if (fd < 0) return -errno;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);   /* Linux: accepted ones inherit it */
#ifdef SO_REUSEPORT
    if (reuseport && setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof one) != 0) {
        e = errno;
        close(fd);
        return -e;
    }
#else
    if (reuseport) { close(fd); return -ENOPROTOOPT; }
#endif
    if (sa->sa_family == AF_INET6) setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &v6only, sizeof v6only);
    if (bind(fd, sa, len) != 0 || (listen_too && listen(fd, _DDP_STORE_BACKLOG) != 0)) {
        e = errno;
        close(fd);
        return -e;
    }
    return fd;
}

/* The listeners: fd was bound alone (not listening); it is replaced by _DDP_STORE_LISTENERS sockets
 * on its address and port, sharing it (SO_REUSEPORT: the kernel spreads incoming connections
 * over them by their addresses), each with its own listen queue of somaxconn. One queue of
 * somaxconn (4,096 by default) overflowed when 16,384 clients connected at once: the kernel
 * dropped SYNs and final ACKs ("Possible SYN flooding", ListenOverflows), and each drop cost a
 * client a retransmission timeout. fd first binds alone, so a port in use (by anyone, another
 * libddp store included) is still an error; only then is it handed over. Where that fails,
 * fd serves alone. Only this user's processes may join a SO_REUSEPORT group (the kernel checks). */
_DDP_PRIVATE void _ddp_store_listeners(ddp_store_t *s, int fd, int v6only) {
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    int i, first;
    s->listen_fds[0] = fd;
    s->nlisten = 1;
    if (getsockname(fd, (struct sockaddr *)&ss, &sl) != 0) {   /* serves alone */
        if (listen(fd, _DDP_STORE_BACKLOG) != 0) { close(fd); s->nlisten = 0; }
        return;
    }
    close(fd);                                /* bound, never listening: the port is free again */
    first = _ddp_store_bind((struct sockaddr *)&ss, sl, v6only, 1, 1);
    if (first < 0) {                          /* taken in between, or no SO_REUSEPORT: alone again */
        s->listen_fds[0] = _ddp_store_bind((struct sockaddr *)&ss, sl, v6only, 0, 1);
        if (s->listen_fds[0] < 0) s->nlisten = 0;
        return;
    }
    s->listen_fds[0] = first;
    for (i = 1; i < _DDP_STORE_LISTENERS; i++) {
        int more = _ddp_store_bind((struct sockaddr *)&ss, sl, v6only, 1, 1);
        if (more < 0) break;
        s->listen_fds[s->nlisten++] = more;
    }
}

_DDP_PRIVATE ddp_result_t _ddp_store_listen(ddp_store_t *s, const char *host) {
    struct sockaddr_storage ss;
    socklen_t sl = 0;
    char where[96];
    int choice = _ddp_store_bind_choice(host, &ss, &sl), fd, v6only = 0, i;
    if (choice) {
        if (ss.ss_family == AF_INET) ((struct sockaddr_in *)(void *)&ss)->sin_port = htons((uint16_t)s->port);
        else ((struct sockaddr_in6 *)(void *)&ss)->sin6_port = htons((uint16_t)s->port);
        fd = _ddp_store_bind((struct sockaddr *)&ss, sl, 1, 0, 0);
        v6only = 1;
    } else {
        /* Every interface: IPv6 and IPv4 on one socket where the host has IPv6, else IPv4. */
        struct sockaddr_in6 a6;
        struct sockaddr_in a4;
        memset(&a6, 0, sizeof a6);
        a6.sin6_family = AF_INET6;
        a6.sin6_addr = in6addr_any;
        a6.sin6_port = htons((uint16_t)s->port);
        fd = _ddp_store_bind((struct sockaddr *)&a6, sizeof a6, 0, 0, 0);
        if (fd < 0 && fd != -EADDRINUSE) {
            memset(&a4, 0, sizeof a4);
            a4.sin_family = AF_INET;
            a4.sin_addr.s_addr = htonl(INADDR_ANY);
            a4.sin_port = htons((uint16_t)s->port);
            fd = _ddp_store_bind((struct sockaddr *)&a4, sizeof a4, 0, 0, 0);
        }
    }
    if (fd == -EADDRINUSE)
        return _ddp_store_err(s, DDP_ERR_SYSTEM, "rendezvous: master port %d is already in use on "
                              "this host (another job, or a previous run still exiting?): pick another "
                              "MASTER_PORT", s->port);
    if (fd < 0) return _ddp_store_err(s, DDP_ERR_SYSTEM, "listen on port %d: %s", s->port, strerror(-fd));
    _ddp_store_listeners(s, fd, v6only);
    if (!s->nlisten) return _ddp_store_err(s, DDP_ERR_SYSTEM, "listen on port %d: lost the port while "
                                           "adding listeners to it", s->port);
    fd = s->listen_fds[0];
    for (i = 0; i < s->nlisten; i++) _ddp_set_nonblock(s->listen_fds[i], 1);
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
    {   /* what the listen queues hold: a burst of connects beyond it costs retransmissions */
        FILE *f = fopen("/proc/sys/net/core/somaxconn", "r");
        int somax = 0;
        if (f) { if (fscanf(f, "%d", &somax) != 1) somax = 0; fclose(f); }
        if (somax > _DDP_STORE_BACKLOG || somax <= 0) somax = _DDP_STORE_BACKLOG;
        _ddp_store_log(s, DDP_LOG_INFO, "store: %d listen queue%s of %d connections (net.core.somaxconn "
                       "caps each)", s->nlisten, s->nlisten == 1 ? "" : "s", somax);
    }
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
    if (!(s->srv_rx = (unsigned char *)DDP_MALLOC(_DDP_STORE_SERVER_RX)))
        return _ddp_store_err(s, DDP_ERR_OUT_OF_MEMORY, "store server: read buffer");
    s->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    s->epfd = epoll_create1(EPOLL_CLOEXEC);
    if (s->epfd < 0 || _ddp_pipe2(s->wake, O_CLOEXEC | O_NONBLOCK) != 0)
        return _ddp_store_err(s, DDP_ERR_SYSTEM, "store server: %s", strerror(errno));
    memset(&ev, 0, sizeof ev);
    ev.events = EPOLLIN;
    ev.data.u64 = _DDP_STORE_TOKEN_WAKE;
    if (epoll_ctl(s->epfd, EPOLL_CTL_ADD, s->wake[0], &ev) != 0)
        return _ddp_store_err(s, DDP_ERR_SYSTEM, "store server: epoll_ctl: %s", strerror(errno));
    if (_ddp_store_watch_listeners(s) != 0)
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

/* ---------------------------------------------------------------- stopping the server
 * A server's close never waits on its clients for long: others may still read keys (a slower
 * rank reading why the job failed), so it serves on while clients are connected, for at most
 * grace_ms (see _ddp_store_close_within in ddp_store.h). A dead client's socket closes by
 * itself. Nothing to do for a handle that never started a server. */
_DDP_PRIVATE void _ddp_store_server_stop(ddp_store_t *s, int grace_ms) {
    int64_t deadline;
    if (!s->thread_started) return;
    deadline = _ddp_deadline(grace_ms < 0 ? 0 : grace_ms);
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

/* After the thread is stopped (or never ran): every connection, descriptor and key goes. */
_DDP_PRIVATE void _ddp_store_server_free(ddp_store_t *s) {
    size_t slot;
    int i;
    for (slot = 0; slot < s->conns_hwm; slot++) if (s->conns[slot]) _ddp_store_drop(s, s->conns[slot]);
    _ddp_store_reap(s);
    DDP_FREE(s->conns);
    DDP_FREE(s->free_slots);
    for (i = 0; i < s->nlisten; i++) _ddp_store_close_fd(s, s->listen_fds[i]);
    s->nlisten = 0;
    s->listen_fd = -1;
    _ddp_store_close_fd(s, s->wake[0]);
    if (s->epfd >= 0) close(s->epfd);
    if (s->spare_fd >= 0) close(s->spare_fd);   /* never watched */
    if (s->diag_fd >= 0) close(s->diag_fd);     /* never watched */
    DDP_FREE(s->throttle);
    DDP_FREE(s->srv_rx);
    s->srv_rx = NULL;
    if (s->wake[1] >= 0) close(s->wake[1]);     /* the write end: never watched */
    {
        size_t nb, b;
        _ddp_kv_t **table = _ddp_kv_table(s, &nb);
        for (b = 0; b < nb; b++) {
            _ddp_kv_t *e = table[b];
            while (e) { _ddp_kv_t *n = e->next; DDP_FREE(e->key); DDP_FREE(e->val); DDP_FREE(e); e = n; }
        }
        if (s->kv_big) DDP_FREE(s->kv_big);
        s->kv_big = NULL;
    }
    DDP_FREE(s->waiters);
    s->waiters = NULL;
    s->nwaiter_chains = s->nwaiter_nodes = 0;
}

#endif /* DDP_STORE_SERVER_IMPLEMENTATION */
