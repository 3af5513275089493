/* SPDX-License-Identifier: MIT (see LICENSE) */
/* ddp_health.h — a communicator's health thread: heartbeats with its ring neighbours, its
 * position and its neighbours' in the store for `ddp-status`, the straggler report (rank 0),
 * and the metrics file. Private: ddp_comm_init.h starts it for every communicator made by
 * init, shrink, grow or join (not for splits, async lanes or threads as ranks: their processes
 * are watched through the communicator they came from), unless DDP_HEALTH=0; destroy ends it.
 *
 *   - Heartbeats. Each rank keeps one TCP link to each ring neighbour (it connects to rank+1,
 *     accepts rank-1), made by the thread after init (init waits for none of it) and proved
 *     both ways with the communicator's data key (ddp_auth.h: challenge-response, no secret on
 *     the wire). Every DDP_HEALTH_PERIOD_MS (500) a 16-byte heartbeat goes each way. The links
 *     carry TCP_USER_TIMEOUT = DDP_HEARTBEAT_TIMEOUT_MS (10 s): when a neighbour's host stops
 *     acknowledging anything for that long (the host is gone, or the link was cut without a
 *     reset), the kernel says ETIMEDOUT and the thread aborts the communicator naming that
 *     rank as unreachable: the waiting collective fails then, not at the collective timeout.
 *     A neighbour whose process stops (SIGSTOP, a debugger) or hangs keeps its kernel
 *     acknowledging: it is reported as silent (no heartbeat), and the timeout is not cut
 *     short; a process that is only busy (in user code, in a long call) still beats.
 *   - Status. Every period the thread writes a line to the store (health/s/<rank>): the
 *     position (in call kind #seq for how long, the peer it waits on; or in user code since
 *     when), its neighbours' heartbeat view, a summary of its recent calls, its error. Its
 *     tick says it ran. `ddp-status` reads these lines (docs/operations.md).
 *   - Traffic: 2 links x 2 heartbeats/s x 16 bytes each way (64 B/s sent per rank, plus TCP's
 *     headers and acknowledgements), one status line (~300 bytes) per period to the store, the
 *     last calls' timings (<= 4 KiB) every few periods.
 * Depends on ddp_comm_queue.h (abort), ddp_straggler.h and ddp_metrics.h. Built by DDP_IMPLEMENTATION (or DDP_HEALTH_IMPLEMENTATION).
 */
#if defined(DDP_IMPLEMENTATION) && !defined(DDP_HEALTH_IMPLEMENTATION)
#define DDP_HEALTH_IMPLEMENTATION
#endif
#if defined(DDP_HEALTH_IMPLEMENTATION)
#ifndef DDP_COMM_QUEUE_IMPLEMENTATION
#define DDP_COMM_QUEUE_IMPLEMENTATION
#endif
#ifndef DDP_STRAGGLER_IMPLEMENTATION
#define DDP_STRAGGLER_IMPLEMENTATION
#endif
#ifndef DDP_METRICS_IMPLEMENTATION
#define DDP_METRICS_IMPLEMENTATION
#endif
#endif
#include "ddp_comm_queue.h"
#include "ddp_straggler.h"
#include "ddp_metrics.h"

#if defined(DDP_HEALTH_IMPLEMENTATION) && !defined(DDP_HEALTH_IMPL_INCLUDED)
#define DDP_HEALTH_IMPL_INCLUDED
#if !defined(DDP_COMM_QUEUE_IMPL_INCLUDED) || !defined(DDP_STRAGGLER_IMPL_INCLUDED) || !defined(DDP_METRICS_IMPL_INCLUDED)
#error "libddp: ddp_health.h's implementation needs those of the headers below it (define DDP_IMPLEMENTATION)"
#endif
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>
#ifdef __linux__
#include <linux/sockios.h>
#endif

#ifdef __cplusplus
extern "C" {
#endif

#define _DDP_HEALTH_PENDING 4            /* unproven connections the listener holds at once */
#define _DDP_HEALTH_SILENT_PERIODS 3     /* no heartbeat for this many periods: silent */
#define _DDP_HEALTH_MAX_OUTQ 1024        /* bytes queued to a neighbour past which no more
                                          * heartbeats are queued (a stopped one's window fills) */

enum { _DDP_LINK_NONE, _DDP_LINK_CONNECTING, _DDP_LINK_CHALLENGE, _DDP_LINK_UP, _DDP_LINK_CLOSED,
       _DDP_LINK_UNREACHABLE };
enum { _DDP_HS_HELLO = 24 + _DDP_AUTH_NONCE_BYTES, _DDP_HS_CHALLENGE = 4 + _DDP_AUTH_NONCE_BYTES + _DDP_AUTH_PROOF_BYTES,
       _DDP_HS_PROOF = 4 + _DDP_AUTH_PROOF_BYTES, _DDP_HB_BYTES = 16 };

/* One end of a link, or a connection the listener has not admitted yet. */
typedef struct {
    int fd;                          /* -1: none */
    int peer;                        /* the neighbour (links); the claimed rank (pending) */
    int state;                       /* _DDP_LINK_* */
    int want;                        /* bytes the next message has */
    size_t have;
    unsigned char in[_DDP_HS_CHALLENGE];
    unsigned char nonce_c[_DDP_AUTH_NONCE_BYTES], nonce_s[_DDP_AUTH_NONCE_BYTES];
    int64_t last_beat_us;            /* the last heartbeat from it (0: never) */
    int64_t deadline_us;             /* a pending connection's handshake ends by then */
    int64_t retry_us;                /* an outgoing link's next connect attempt */
    int bye;                         /* it said goodbye before closing */
    char why[160];                   /* how it ended */
} _ddp_health_end_t;

typedef struct {
    ddp_comm_t *c;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int stop, started;
    int period_ms, hb_timeout_ms;
    int listen_fd;
    int wake[2];                     /* a pipe: stop writes a byte, the poll returns at once */
    ddp_store_t *st;                 /* its own client of the store */
    _ddp_health_end_t right, left;   /* rank+1 (we connect), rank-1 (we accept) */
    _ddp_health_end_t pending[_DDP_HEALTH_PENDING];
    unsigned tick;
    int64_t start_us;
    int aborted;                     /* it aborted the communicator (once) */
    uint64_t hb_sent, hb_recv;       /* heartbeat bytes, for the metrics */
    char host[64];
    /* the last calls' timings: published every timing_every periods (more ranks, less often) */
    int timing_every;
    uint64_t timing_calls;           /* timed calls at the last publication */
    unsigned char *blob;             /* _DDP_STRAGGLER_BLOB_MAX bytes; rank 0: one per rank */
    /* rank 0: the straggler analysis */
    _ddp_straggler_t *an;
    const unsigned char **blob_at;
    size_t *blob_len;
    char *line;                      /* _DDP_STRAGGLER_LINE_MAX(n) */
    /* DDP_METRICS */
    char metrics_path[_DDP_METRICS_PATH];
    int metrics_ms;
    int64_t metrics_next_us;
    _ddp_metrics_in_t *min;
} _ddp_health_t;

/* ---------------------------------------------------------------- wire */
_DDP_PRIVATE void _ddp_health_put32(unsigned char *p, uint32_t v) {
    p[0] = (unsigned char)v; p[1] = (unsigned char)(v >> 8); p[2] = (unsigned char)(v >> 16); p[3] = (unsigned char)(v >> 24);
}
_DDP_PRIVATE uint32_t _ddp_health_get32(const unsigned char *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

_DDP_PRIVATE void _ddp_health_end_init(_ddp_health_end_t *e, int peer) {
    memset(e, 0, sizeof *e);
    e->fd = -1;
    e->peer = peer;
}

_DDP_PRIVATE void _ddp_health_end_reset(_ddp_health_end_t *e, int peer) {
    if (e->fd >= 0) close(e->fd);
    _ddp_health_end_init(e, peer);
}

/* Sends all of a small message or fails (a link's buffer never holds less than 16 bytes free
 * unless the peer stopped reading, which _DDP_HEALTH_MAX_OUTQ keeps us from reaching). */
_DDP_PRIVATE int _ddp_health_send(_ddp_health_t *h, _ddp_health_end_t *e, const void *buf, size_t len) {
    ssize_t w = send(e->fd, buf, len, MSG_NOSIGNAL | MSG_DONTWAIT);
    int en = errno;
    if (w == (ssize_t)len) { h->hb_sent += len; return 0; }
    snprintf(e->why, sizeof e->why, "send: %s", w < 0 ? strerror(en) : "short write");
    errno = w < 0 ? en : EAGAIN;
    return -1;
}

_DDP_PRIVATE void _ddp_health_tune(const _ddp_health_t *h, int fd) {
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
#ifdef TCP_USER_TIMEOUT
    {
        unsigned int ms = (unsigned int)h->hb_timeout_ms;
        setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &ms, sizeof ms);
    }
#else
    (void)h;
#endif
    _ddp_set_nonblock(fd, 1);
}

/* ---------------------------------------------------------------- links: the connecting side */
_DDP_PRIVATE void _ddp_health_dial(_ddp_health_t *h, int64_t now) {
    ddp_comm_t *c = h->c;
    _ddp_health_end_t *e = &h->right;
    char key[256], addr[300], *colon;
    size_t len = 0;
    int exists = 0, fd = -1, rc;
    struct addrinfo hints, *res = NULL;
    if (e->state != _DDP_LINK_NONE || now < e->retry_us) return;
    e->retry_us = now + (int64_t)h->period_ms * 1000;
    _ddp_key(c, key, sizeof key, "health/addr/%d", e->peer);
    if (ddp_store_check(h->st, key, &exists) != DDP_SUCCESS || !exists ||
        ddp_store_get(h->st, key, addr, sizeof addr - 1, &len) != DDP_SUCCESS)
        return;   /* not listening yet: next period */
    addr[len] = 0;
    if (!(colon = strrchr(addr, ' '))) return;
    *colon = 0;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV;
    if (getaddrinfo(addr, colon + 1, &hints, &res) != 0 || !res) return;
    fd = socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) { freeaddrinfo(res); return; }
    _ddp_health_tune(h, fd);
    rc = connect(fd, res->ai_addr, res->ai_addrlen);
    freeaddrinfo(res);
    if (rc != 0 && errno != EINPROGRESS) { close(fd); return; }
    e->fd = fd;
    e->state = _DDP_LINK_CONNECTING;
}

/* The connect finished (POLLOUT): say hello with our nonce. */
_DDP_PRIVATE void _ddp_health_hello(_ddp_health_t *h, _ddp_health_end_t *e) {
    unsigned char m[_DDP_HS_HELLO];
    int err = 0;
    socklen_t sl = sizeof err;
    if (getsockopt(e->fd, SOL_SOCKET, SO_ERROR, &err, &sl) != 0 || err != 0 ||
        _ddp_auth_nonce(e->nonce_c) != 0) {
        _ddp_health_end_reset(e, e->peer);   /* not listening (yet): try again next period */
        e->retry_us = _ddp_now_us() + (int64_t)h->period_ms * 1000;
        return;
    }
    memcpy(m, "DDPH", 4);
    _ddp_health_put32(m + 4, 1);
    _ddp_health_put32(m + 8, (uint32_t)h->c->eng.rank);
    _ddp_health_put32(m + 12, (uint32_t)e->peer);
    memcpy(m + 16, &h->c->tctx.comm_id, 8);
    memcpy(m + 24, e->nonce_c, _DDP_AUTH_NONCE_BYTES);
    if (_ddp_health_send(h, e, m, sizeof m) != 0) { _ddp_health_end_reset(e, e->peer); return; }
    e->state = _DDP_LINK_CHALLENGE;
    e->want = _DDP_HS_CHALLENGE;
    e->have = 0;
}

/* ---------------------------------------------------------------- links: both sides */
_DDP_PRIVATE void _ddp_health_up(_ddp_health_t *h, _ddp_health_end_t *e) {
    e->state = _DDP_LINK_UP;
    e->want = _DDP_HB_BYTES;
    e->have = 0;
    e->last_beat_us = _ddp_now_us();
    _DDP_LOG(h->c, DDP_LOG_INFO, "health: heartbeat link with rank %d up (every %d ms; unreachable "
             "after %d ms without an acknowledgement)", e->peer, h->period_ms, h->hb_timeout_ms);
}

/* A whole message arrived on e. */
_DDP_PRIVATE void _ddp_health_message(_ddp_health_t *h, _ddp_health_end_t *e) {
    const unsigned char *key = h->c->boot.data_key;
    const size_t kl = sizeof h->c->boot.data_key;
    const unsigned char *nc = e->nonce_c;
    if (e->state == _DDP_LINK_CHALLENGE && e == &h->right) {   /* the acceptor proved itself */
        unsigned char m[_DDP_HS_PROOF];
        if (memcmp(e->in, "DDPC", 4) ||
            !_ddp_auth_verify(key, kl, _DDP_AUTH_SERVER, "ddp-health", e->in + 4, nc, e->in + 4 + _DDP_AUTH_NONCE_BYTES)) {
            snprintf(e->why, sizeof e->why, "its listener failed the proof (not rank %d of this communicator)", e->peer);
            _DDP_LOG(h->c, DDP_LOG_WARN, "health: the heartbeat link to rank %d: %s", e->peer, e->why);
            _ddp_health_end_reset(e, e->peer);
            e->retry_us = _ddp_now_us() + (int64_t)h->period_ms * 4000;
            return;
        }
        memcpy(m, "DDPP", 4);
        _ddp_auth_proof(key, kl, _DDP_AUTH_CLIENT, "ddp-health", e->in + 4, nc, m + 4);
        if (_ddp_health_send(h, e, m, sizeof m) != 0) { _ddp_health_end_reset(e, e->peer); return; }
        _ddp_health_up(h, e);
        return;
    }
    if (e->state == _DDP_LINK_UP) {
        if (!memcmp(e->in, "DDPB", 4)) { e->last_beat_us = _ddp_now_us(); h->hb_recv += _DDP_HB_BYTES; }
        else if (!memcmp(e->in, "DDPQ", 4)) e->bye = 1;
        e->have = 0;
        return;
    }
}

/* The listener's side: a pending connection's hello, then its proof. 1: admitted as the left
 * link; 0: still pending; -1: refused (closed, a stranger never gets more than a challenge). */
_DDP_PRIVATE int _ddp_health_pending_message(_ddp_health_t *h, _ddp_health_end_t *p) {
    ddp_comm_t *c = h->c;
    const unsigned char *key = c->boot.data_key;
    const size_t kl = sizeof c->boot.data_key;
    if (p->want == _DDP_HS_HELLO) {
        unsigned char m[_DDP_HS_CHALLENGE];
        uint64_t id;
        memcpy(&id, p->in + 16, 8);
        if (memcmp(p->in, "DDPH", 4) || _ddp_health_get32(p->in + 4) != 1 ||
            (int)_ddp_health_get32(p->in + 12) != c->eng.rank || id != c->tctx.comm_id ||
            (int)_ddp_health_get32(p->in + 8) != h->left.peer || _ddp_auth_nonce(p->nonce_s) != 0)
            return -1;
        memcpy(p->nonce_c, p->in + 24, _DDP_AUTH_NONCE_BYTES);
        memcpy(m, "DDPC", 4);
        memcpy(m + 4, p->nonce_s, _DDP_AUTH_NONCE_BYTES);
        _ddp_auth_proof(key, kl, _DDP_AUTH_SERVER, "ddp-health", p->nonce_s, p->nonce_c, m + 4 + _DDP_AUTH_NONCE_BYTES);
        if (_ddp_health_send(h, p, m, sizeof m) != 0) return -1;
        p->want = _DDP_HS_PROOF;
        p->have = 0;
        return 0;
    }
    if (memcmp(p->in, "DDPP", 4) || !_ddp_auth_verify(key, kl, _DDP_AUTH_CLIENT, "ddp-health", p->nonce_s, p->nonce_c, p->in + 4))
        return -1;
    _ddp_health_end_reset(&h->left, h->left.peer);   /* a reconnect replaces the old link */
    h->left.fd = p->fd;
    p->fd = -1;
    _ddp_health_up(h, &h->left);
    return 1;
}

/* The errors that say the host is gone or cut off (nothing acknowledged for the link's user
 * timeout, or the network says there is no way to it), as opposed to a process that ended. */
_DDP_PRIVATE int _ddp_health_lost(int e) {
    return e == ETIMEDOUT || e == EHOSTUNREACH || e == ENETUNREACH || e == EHOSTDOWN || e == ENETDOWN;
}

/* Reads what is there into e->in; 1 when a whole message is in, 0 not yet, -1 closed/failed. */
_DDP_PRIVATE int _ddp_health_read(_ddp_health_end_t *e) {
    for (;;) {
        ssize_t n = recv(e->fd, e->in + e->have, (size_t)e->want - e->have, MSG_DONTWAIT);
        if (n > 0) {
            e->have += (size_t)n;
            if (e->have == (size_t)e->want) return 1;
            continue;
        }
        if (n == 0) { snprintf(e->why, sizeof e->why, "%s", e->bye ? "it closed the link (it ended)" : "it closed the link"); return -1; }
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return 0;
        snprintf(e->why, sizeof e->why, "%s", strerror(errno));
        return _ddp_health_lost(errno) ? -2 : -1;
    }
}

/* A neighbour's host stopped acknowledging: the communicator fails now, naming it. */
_DDP_PRIVATE void _ddp_health_unreachable(_ddp_health_t *h, _ddp_health_end_t *e) {
    ddp_comm_t *c = h->c;
    char why[600];
    int64_t quiet = e->last_beat_us ? (_ddp_now_us() - e->last_beat_us) / 1000 : -1;
    e->state = _DDP_LINK_UNREACHABLE;
    if (e->fd >= 0) { close(e->fd); e->fd = -1; }
    if (h->aborted) return;
    h->aborted = 1;
    snprintf(why, sizeof why, "rank %d is unreachable: its heartbeat link failed (%s; nothing "
             "acknowledged within DDP_HEARTBEAT_TIMEOUT_MS=%d ms, last heartbeat %lld ms ago): the host "
             "is down or cut off; this rank gives up on it now instead of at the collective timeout",
             e->peer, e->why[0] ? e->why : "no acknowledgement", h->hb_timeout_ms, (long long)quiet);
    _DDP_LOG(c, DDP_LOG_WARN, "health: %s", why);
    _ddp_abort_blaming(c, DDP_ERR_REMOTE, why, e->peer);
    if (h->st) {   /* the ranks that do not beat with it learn it from the store */
        char key[256], val[64];
        int exists = 0;
        _ddp_key(c, key, sizeof key, "health/down");
        snprintf(val, sizeof val, "%d %d %d", e->peer, c->eng.rank, h->hb_timeout_ms);
        if (ddp_store_check(h->st, key, &exists) == DDP_SUCCESS && !exists) ddp_store_set(h->st, key, val, strlen(val));
    }
}

/* Every period: has another rank given one up as unreachable? Then this rank gives up too,
 * now: it may be waiting on that rank without beating with it. */
_DDP_PRIVATE void _ddp_health_check_down(_ddp_health_t *h) {
    ddp_comm_t *c = h->c;
    char key[256], val[64], why[600];
    size_t len = 0;
    int exists = 0, down = -1, by = -1, ms = 0;
    if (h->aborted || !h->st || c->eng.nranks < 2) return;
    _ddp_key(c, key, sizeof key, "health/down");
    if (ddp_store_check(h->st, key, &exists) != DDP_SUCCESS || !exists ||
        ddp_store_get(h->st, key, val, sizeof val - 1, &len) != DDP_SUCCESS)
        return;
    val[len] = 0;
    if (sscanf(val, "%d %d %d", &down, &by, &ms) != 3 || down < 0 || down >= c->eng.nranks) return;
    h->aborted = 1;
    if (down == c->eng.rank)
        snprintf(why, sizeof why, "rank %d's heartbeats gave this rank up as unreachable (nothing "
                 "acknowledged for %d ms): this rank is cut off from it", by, ms);
    else
        snprintf(why, sizeof why, "rank %d is unreachable: rank %d's heartbeat link to it had nothing "
                 "acknowledged for %d ms (DDP_HEARTBEAT_TIMEOUT_MS): its host is down or cut off; "
                 "this rank gives up on it now instead of at the collective timeout", down, by, ms);
    _DDP_LOG(c, DDP_LOG_WARN, "health: %s", why);
    _ddp_abort_blaming(c, DDP_ERR_REMOTE, why, down == c->eng.rank ? by : down);
}

_DDP_PRIVATE void _ddp_health_end_event(_ddp_health_t *h, _ddp_health_end_t *e, short re) {
    int r;
    if (e->fd < 0) return;
    if (e->state == _DDP_LINK_CONNECTING) {
        if (re & (POLLOUT | POLLERR | POLLHUP)) _ddp_health_hello(h, e);
        return;
    }
    if (!(re & (POLLIN | POLLERR | POLLHUP))) return;
    while ((r = _ddp_health_read(e)) == 1) {
        _ddp_health_message(h, e);
        if (e->fd < 0) return;
    }
    if (r == -2) { _ddp_health_unreachable(h, e); return; }
    if (r < 0) {
        if (e->state == _DDP_LINK_UP) {
            _DDP_LOG(h->c, DDP_LOG_INFO, "health: the heartbeat link with rank %d closed (%s)", e->peer, e->why);
            close(e->fd);
            e->fd = -1;
            e->state = _DDP_LINK_CLOSED;
        } else {   /* a handshake cut short: try again */
            _ddp_health_end_reset(e, e->peer);
            e->retry_us = _ddp_now_us() + (int64_t)h->period_ms * 1000;
        }
    }
}

_DDP_PRIVATE void _ddp_health_accept(_ddp_health_t *h, int64_t now) {
    for (;;) {
        int fd = accept(h->listen_fd, NULL, NULL), i, slot = -1;
        if (fd < 0) return;
        for (i = 0; i < _DDP_HEALTH_PENDING; i++)
            if (h->pending[i].fd < 0) { slot = i; break; }
        if (slot < 0) { close(fd); continue; }   /* bounded: the oldest finish first */
        _ddp_health_end_reset(&h->pending[slot], -1);
        _ddp_health_tune(h, fd);
        h->pending[slot].fd = fd;
        h->pending[slot].want = _DDP_HS_HELLO;
        h->pending[slot].deadline_us = now + 2000000;
    }
}

_DDP_PRIVATE void _ddp_health_pending_event(_ddp_health_t *h, _ddp_health_end_t *p, short re) {
    int r;
    if (!(re & (POLLIN | POLLERR | POLLHUP))) return;
    while ((r = _ddp_health_read(p)) == 1) {
        int k = _ddp_health_pending_message(h, p);
        if (k != 0) {
            if (k < 0) _ddp_health_end_reset(p, -1);
            else p->fd = -1;
            return;
        }
    }
    if (r < 0) _ddp_health_end_reset(p, -1);
}

/* Heartbeats out; a neighbour silent past the period is only noted (status). */
_DDP_PRIVATE void _ddp_health_beat(_ddp_health_t *h, _ddp_health_end_t *e) {
    unsigned char m[_DDP_HB_BYTES];
    int outq = 0;
    if (e->state != _DDP_LINK_UP || e->fd < 0) return;
#ifdef SIOCOUTQ
    if (ioctl(e->fd, SIOCOUTQ, &outq) == 0 && outq > _DDP_HEALTH_MAX_OUTQ) return;
#endif
    memset(m, 0, sizeof m);
    memcpy(m, "DDPB", 4);
    _ddp_health_put32(m + 4, h->tick);
    if (_ddp_health_send(h, e, m, sizeof m) != 0) {
        if (_ddp_health_lost(errno)) _ddp_health_unreachable(h, e);
        else if (errno != EAGAIN && errno != EWOULDBLOCK) {
            close(e->fd);
            e->fd = -1;
            e->state = _DDP_LINK_CLOSED;
        }
    }
}

/* ---------------------------------------------------------------- status */
_DDP_PRIVATE const char *_ddp_health_end_state(const _ddp_health_t *h, const _ddp_health_end_t *e, int64_t now) {
    switch (e->state) {
    case _DDP_LINK_UP:
        return now - e->last_beat_us > (int64_t)h->period_ms * 1000 * _DDP_HEALTH_SILENT_PERIODS ? "silent" : "ok";
    case _DDP_LINK_CLOSED: return "closed";
    case _DDP_LINK_UNREACHABLE: return "unreachable";
    default: return "connecting";
    }
}

/* The last error's text. The operations' thread writes it only while it fails a call, and the
 * error word is set after: read once the word says failed, a torn read is at worst a garbled
 * status line, never a fault (the buffer is fixed and NUL-terminated here). */
#if defined(__has_feature)
#if __has_feature(thread_sanitizer)
__attribute__((no_sanitize("thread")))
#endif
#elif defined(__SANITIZE_THREAD__)
__attribute__((no_sanitize("thread")))
#endif
_DDP_PRIVATE void _ddp_health_error_text(const ddp_comm_t *c, char *out, size_t cap) {
    size_t i;
    for (i = 0; i + 1 < cap && i + 1 < sizeof c->last_error && c->last_error[i]; i++)
        out[i] = c->last_error[i] == '\n' ? ' ' : c->last_error[i];
    out[i] = 0;
}

_DDP_PRIVATE int _ddp_health_cmp_u32(const void *a, const void *b) {
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

_DDP_PRIVATE void _ddp_health_status(_ddp_health_t *h, int64_t now) {
    ddp_comm_t *c = h->c;
    char line[2048], key[256];
    size_t off = 0;
    uint32_t durs[_DDP_TIMINGS];
    int nd = 0, k, kind;
    uint64_t calls = 0, errors = 0;
    const int pk = __atomic_load_n(&c->pos.kind, __ATOMIC_ACQUIRE);
    const int64_t since = __atomic_load_n(&c->pos.since_us, __ATOMIC_RELAXED);
    const ddp_result_t err = (ddp_result_t)__atomic_load_n(&c->error, __ATOMIC_SEQ_CST);
#define _DDP_HPUT(...) do { if (off < sizeof line) off += (size_t)snprintf(line + off, sizeof line - off, __VA_ARGS__); } while (0)
    _DDP_HPUT("v=1 rank=%d size=%d pid=%d host=%s tick=%u period_ms=%d hb_timeout_ms=%d", c->eng.rank,
              c->eng.nranks, (int)getpid(), h->host, h->tick, h->period_ms, h->hb_timeout_ms);
    if (err != DDP_SUCCESS)
        _DDP_HPUT(" state=failed seq=%u", __atomic_load_n(&c->pos.seq, __ATOMIC_RELAXED));
    else if (pk)
        _DDP_HPUT(" state=call kind=%s seq=%u bytes=%llu for_ms=%lld peer=%d", _ddp_kind_name(pk),
                  __atomic_load_n(&c->pos.seq, __ATOMIC_RELAXED),
                  (unsigned long long)__atomic_load_n(&c->pos.bytes, __ATOMIC_RELAXED),
                  (long long)(since ? (now - since) / 1000 : 0), __atomic_load_n(&c->pos.peer, __ATOMIC_RELAXED));
    else if (since)
        _DDP_HPUT(" state=user seq=%u for_ms=%lld", __atomic_load_n(&c->pos.seq, __ATOMIC_RELAXED),
                  (long long)((now - since) / 1000));
    else
        _DDP_HPUT(" state=idle for_ms=%lld", (long long)((now - h->start_us) / 1000));
    if (c->eng.nranks > 1) {
        const _ddp_health_end_t *l = &h->left, *r = &h->right;
        _DDP_HPUT(" left=%d left_state=%s left_ms=%lld right=%d right_state=%s right_ms=%lld", l->peer,
                  _ddp_health_end_state(h, l, now), (long long)(l->last_beat_us ? (now - l->last_beat_us) / 1000 : -1),
                  r->peer, _ddp_health_end_state(h, r, now),
                  (long long)(r->last_beat_us ? (now - r->last_beat_us) / 1000 : -1));
    }
    for (kind = 1; kind < _DDP_NUM_KINDS; kind++) {
        calls += __atomic_load_n(&c->stats.kind[kind].calls, __ATOMIC_RELAXED);
        errors += __atomic_load_n(&c->stats.kind[kind].errors, __ATOMIC_RELAXED);
    }
    for (k = 0; k < _DDP_TIMINGS; k++) {
        uint32_t seq, dur, gap;
        int kd;
        if (_ddp_stats_timing(&c->stats, k, &seq, &kd, &dur, &gap)) durs[nd++] = dur;
    }
    _DDP_HPUT(" calls=%llu errors=%llu recent=%d", (unsigned long long)calls, (unsigned long long)errors, nd);
    if (nd) {
        qsort(durs, (size_t)nd, sizeof durs[0], _ddp_health_cmp_u32);
        _DDP_HPUT(" recent_p50_us=%u recent_max_us=%u", durs[nd / 2], durs[nd - 1]);
    }
    if (err != DDP_SUCCESS) {
        char text[700];
        _ddp_health_error_text(c, text, sizeof text);
        _DDP_HPUT(" error=%s", text[0] ? text : ddp_strerror(err));
    }
#undef _DDP_HPUT
    if (off >= sizeof line) off = sizeof line - 1;
    _ddp_key(c, key, sizeof key, "health/s/%d", c->eng.rank);
    ddp_store_set(h->st, key, line, off);
}

/* ---------------------------------------------------------------- every period, after the status */
_DDP_PRIVATE uint64_t _ddp_health_timed_calls(const ddp_comm_t *c) {
    uint64_t n = 0;
    int k;
    for (k = 1; k < _DDP_NUM_KINDS; k++) n += __atomic_load_n(&c->stats.kind[k].timed, __ATOMIC_RELAXED);
    return n;
}

/* This rank's last calls' timings, when it made new ones. */
_DDP_PRIVATE void _ddp_health_publish_timings(_ddp_health_t *h) {
    ddp_comm_t *c = h->c;
    char key[256];
    size_t len = 0;
    const uint64_t calls = _ddp_health_timed_calls(c);
    if (calls == h->timing_calls || _ddp_straggler_encode(&c->stats, h->blob, _DDP_STRAGGLER_BLOB_MAX, &len) != 0)
        return;
    _ddp_key(c, key, sizeof key, "health/t/%d", c->eng.rank);
    if (ddp_store_set(h->st, key, h->blob, len) == DDP_SUCCESS) h->timing_calls = calls;
}

/* Rank 0: every rank's timings into the analysis; its line into the store, its report into the
 * log. */
_DDP_PRIVATE void _ddp_health_stragglers(_ddp_health_t *h) {
    ddp_comm_t *c = h->c;
    const int n = c->eng.nranks;
    char key[256], err[512], info[512], warn[512];
    int r, m;
    for (r = 0; r < n; r++) {
        unsigned char *b = h->blob + (size_t)r * _DDP_STRAGGLER_BLOB_MAX;
        size_t len = 0;
        int exists = 0;
        h->blob_at[r] = NULL;
        h->blob_len[r] = 0;
        _ddp_key(c, key, sizeof key, "health/t/%d", r);
        if (ddp_store_check(h->st, key, &exists) != DDP_SUCCESS || !exists ||
            ddp_store_get(h->st, key, b, _DDP_STRAGGLER_BLOB_MAX, &len) != DDP_SUCCESS || len > _DDP_STRAGGLER_BLOB_MAX)
            return;   /* not every rank has published yet: next time */
        h->blob_at[r] = b;
        h->blob_len[r] = len;
    }
    if (_ddp_straggler_ingest(h->an, h->blob_at, h->blob_len, err, sizeof err) < 0) {
        _DDP_LOG(c, DDP_LOG_WARN, "straggler: %s", err);
        return;
    }
    if (_ddp_straggler_line(h->an, h->line, _DDP_STRAGGLER_LINE_MAX(n)) > 0) {
        _ddp_key(c, key, sizeof key, "health/straggler");
        ddp_store_set(h->st, key, h->line, strlen(h->line));
    }
    m = _ddp_straggler_report(h->an, info, sizeof info, warn, sizeof warn);
    if (m & 1) _DDP_LOG(c, DDP_LOG_INFO, "%s", info);
    if (m & 2) _DDP_LOG(c, DDP_LOG_WARN, "%s", warn);
}

_DDP_PRIVATE void _ddp_health_metrics(_ddp_health_t *h, int64_t now) {
    ddp_comm_t *c = h->c;
    _ddp_metrics_in_t *in = h->min;
    char path[_DDP_METRICS_PATH + 32], err[512], version[32];
    _ddp_straggler_figures_t f;
    int side;
    if (now < h->metrics_next_us) return;
    h->metrics_next_us = now + (int64_t)h->metrics_ms * 1000;
    snprintf(version, sizeof version, "%d.%d", DDP_VERSION_MAJOR, DDP_VERSION_MINOR);
    in->rank = c->eng.rank;
    in->size = c->eng.nranks;
    in->job = c->boot.job;
    in->transport = c->trace.transport;
    in->version = version;
    _ddp_metrics_read(&c->stats, in->now);
    memset(&in->straggler, 0, sizeof in->straggler);
    if (h->an) {
        _ddp_straggler_figures(h->an, &f);
        in->straggler.valid = 1;
        in->straggler.kind = f.kind;
        in->straggler.window = (uint64_t)f.window;
        in->straggler.analysed = f.analysed;
        in->straggler.last_rank = f.last_rank;
        in->straggler.last_count = f.last_count;
        in->straggler.median_lag_us = f.median_lag_us;
        in->straggler.median_interval_us = f.median_interval_us;
        in->straggler.share = f.share;
        in->straggler.warn = f.warn;
        in->straggler.last_counts = h->an->last_counts;
        in->straggler.n = c->eng.nranks;
    }
    for (side = 0; side < 2; side++) {
        const _ddp_health_end_t *e = side ? &h->right : &h->left;
        in->peer[side].rank = c->eng.nranks > 1 ? e->peer : -1;
        in->peer[side].state = _ddp_health_end_state(h, e, now);
        in->peer[side].ms = e->last_beat_us ? (now - e->last_beat_us) / 1000 : -1;
    }
    in->hb_sent_bytes = h->hb_sent;
    in->hb_recv_bytes = h->hb_recv;
    in->failed = __atomic_load_n(&c->error, __ATOMIC_SEQ_CST) != DDP_SUCCESS;
    if (_ddp_metrics_path(h->metrics_path, c->eng.rank, path, sizeof path) != 0 ||
        _ddp_metrics_write_file(path, in, err, sizeof err) != 0) {
        _DDP_LOG(c, DDP_LOG_WARN, "metrics: %s; trying again in %d ms", err, h->metrics_ms);
        return;
    }
    memcpy(in->prev, in->now, sizeof in->now);
}

/* After the status, each period: the timings (every timing_every periods; rank 0 reads them
 * the period after), the metrics file when due. */
_DDP_PRIVATE void _ddp_health_periodic(_ddp_health_t *h, int64_t now) {
    if (h->blob && h->tick % (unsigned)h->timing_every == 0) _ddp_health_publish_timings(h);
    if (h->an && h->tick % (unsigned)h->timing_every == 1 % (unsigned)h->timing_every) _ddp_health_stragglers(h);
    if (h->min) _ddp_health_metrics(h, now);
}

/* The straggler analysis (rank 0) and the metrics: what they need, allocated once. */
_DDP_PRIVATE void _ddp_health_setup_reports(_ddp_health_t *h) {
    ddp_comm_t *c = h->c;
    const int n = c->eng.nranks;
    char err[512];
    int k;
    h->timing_every = n / 32 > 1 ? n / 32 : 1;   /* rank 0 reads n blobs of <= 4 KiB per round */
    if (n > 1) {
        h->blob = (unsigned char *)_ddp_alloc(&c->alloc, (size_t)(c->eng.rank == 0 ? n : 1) * _DDP_STRAGGLER_BLOB_MAX);
        if (h->blob && c->eng.rank == 0) {
            _ddp_straggler_opts_t o;
            if (_ddp_straggler_opts_env(&o, err, sizeof err) < 0) _DDP_LOG(c, DDP_LOG_WARN, "straggler: %s", err);
            h->an = (_ddp_straggler_t *)_ddp_calloc(&c->alloc, sizeof *h->an);
            h->blob_at = (const unsigned char **)_ddp_calloc(&c->alloc, sizeof *h->blob_at * (size_t)n);
            h->blob_len = (size_t *)_ddp_calloc(&c->alloc, sizeof *h->blob_len * (size_t)n);
            h->line = (char *)_ddp_alloc(&c->alloc, _DDP_STRAGGLER_LINE_MAX(n));
            if (!h->an || !h->blob_at || !h->blob_len || !h->line ||
                _ddp_straggler_init(h->an, n, &o, c->alloc.alloc ? &c->alloc : NULL) != 0) {
                _DDP_LOG(c, DDP_LOG_WARN, "straggler: no memory for the analysis: no straggler report");
                if (h->an) _ddp_free(&c->alloc, h->an);
                h->an = NULL;
            }
        }
    }
    k = _ddp_metrics_env(h->metrics_path, sizeof h->metrics_path, &h->metrics_ms, err, sizeof err);
    if (k < 0) _DDP_LOG(c, DDP_LOG_WARN, "metrics: %s: no metrics file", err);
    if (k > 0 && !(h->min = (_ddp_metrics_in_t *)_ddp_calloc(&c->alloc, sizeof *h->min)))
        _DDP_LOG(c, DDP_LOG_WARN, "metrics: no memory: no metrics file");
    if (h->min) {
        char path[_DDP_METRICS_PATH + 32];
        if (_ddp_metrics_path(h->metrics_path, c->eng.rank, path, sizeof path) == 0)
            _DDP_LOG(c, DDP_LOG_INFO, "metrics: this rank's in %s, rewritten every %d ms (DDP_METRICS, "
                     "DDP_METRICS_PERIOD_MS)", path, h->metrics_ms);
    }
}

/* ---------------------------------------------------------------- the thread */
/* Listens where the store client's connection leaves this host (the interface that reaches the
 * master) and says where in the store. */
_DDP_PRIVATE int _ddp_health_listen(_ddp_health_t *h) {
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    char addr[96], val[160], key[256], port[16];
    if (getsockname(h->st->fd, (struct sockaddr *)&ss, &sl) != 0) return -1;
    if (ss.ss_family == AF_INET) ((struct sockaddr_in *)&ss)->sin_port = 0;
    else if (ss.ss_family == AF_INET6) ((struct sockaddr_in6 *)&ss)->sin6_port = 0;
    else return -1;
    h->listen_fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (h->listen_fd < 0 || bind(h->listen_fd, (struct sockaddr *)&ss, sl) != 0 || listen(h->listen_fd, 8) != 0)
        return -1;
    _ddp_set_nonblock(h->listen_fd, 1);
    sl = sizeof ss;
    if (getsockname(h->listen_fd, (struct sockaddr *)&ss, &sl) != 0 ||
        getnameinfo((struct sockaddr *)&ss, sl, addr, sizeof addr, port, sizeof port, NI_NUMERICHOST | NI_NUMERICSERV) != 0)
        return -1;
    snprintf(val, sizeof val, "%s %s", addr, port);
    _ddp_key(h->c, key, sizeof key, "health/addr/%d", h->c->eng.rank);
    return ddp_store_set(h->st, key, val, strlen(val)) == DDP_SUCCESS ? 0 : -1;
}

_DDP_PRIVATE int _ddp_health_setup(_ddp_health_t *h) {
    ddp_comm_t *c = h->c;
    ddp_store_desc_t sd;
    char err[512] = "";
    memset(&sd, 0, sizeof sd);
    sd.timeout_ms = h->period_ms * 4 < 2000 ? 2000 : h->period_ms * 4;
    sd.log_level = DDP_LOG_WARN + 1;
    sd.log_rank = c->eng.rank + 1;
    sd.secret = "";   /* takes the communicator's client's stretched key */
    if (_ddp_store_client_like(&h->st, c->boot.store, &sd, err, sizeof err) != DDP_SUCCESS) {
        _DDP_LOG(c, DDP_LOG_WARN, "health: no store client (%s): no status for ddp-status, no "
                 "heartbeats", err);
        if (h->st) { ddp_store_close(h->st); h->st = NULL; }
        return -1;
    }
    if (c->eng.rank == 0) {
        char val[200];
        snprintf(val, sizeof val, "%s %d", c->boot.prefix, c->eng.nranks);
        ddp_store_set(h->st, "ddp-status/current", val, strlen(val));
    }
    if (c->eng.nranks > 1 && _ddp_health_listen(h) != 0) {
        _DDP_LOG(c, DDP_LOG_WARN, "health: cannot listen for heartbeats (%s): status only",
                 strerror(errno));
        if (h->listen_fd >= 0) close(h->listen_fd);
        h->listen_fd = -1;
    }
    return 0;
}

_DDP_PRIVATE void _ddp_health_poll(_ddp_health_t *h, int64_t until) {
    struct pollfd pf[4 + _DDP_HEALTH_PENDING];
    _ddp_health_end_t *who[4 + _DDP_HEALTH_PENDING];
    int n = 0, i, ms;
    const int64_t now = _ddp_now_us();
    pf[n].fd = h->wake[0]; pf[n].events = POLLIN; who[n++] = NULL;   /* only ends the poll */
    if (h->listen_fd >= 0) { pf[n].fd = h->listen_fd; pf[n].events = POLLIN; who[n++] = NULL; }
    if (h->right.fd >= 0) {
        pf[n].fd = h->right.fd;
        pf[n].events = (short)(h->right.state == _DDP_LINK_CONNECTING ? POLLOUT : POLLIN);
        who[n++] = &h->right;
    }
    if (h->left.fd >= 0) { pf[n].fd = h->left.fd; pf[n].events = POLLIN; who[n++] = &h->left; }
    for (i = 0; i < _DDP_HEALTH_PENDING; i++) {
        _ddp_health_end_t *p = &h->pending[i];
        if (p->fd < 0) continue;
        if (now > p->deadline_us) { _ddp_health_end_reset(p, -1); continue; }
        pf[n].fd = p->fd; pf[n].events = POLLIN; who[n++] = p;
    }
    ms = until > now ? (int)((until - now + 999) / 1000) : 0;
    if (poll(pf, (nfds_t)n, ms) <= 0) return;
    for (i = 1; i < n; i++) {   /* pf[0]: the wake-up, which only ends the poll */
        if (!pf[i].revents) continue;
        if (!who[i]) _ddp_health_accept(h, now);
        else if (who[i] == &h->right || who[i] == &h->left) _ddp_health_end_event(h, who[i], pf[i].revents);
        else _ddp_health_pending_event(h, who[i], pf[i].revents);
    }
}

_DDP_PRIVATE int _ddp_health_stopping(_ddp_health_t *h) {
    int s;
    pthread_mutex_lock(&h->mu);
    s = h->stop;
    pthread_mutex_unlock(&h->mu);
    return s;
}

static void *_ddp_health_main(void *arg) {
    _ddp_health_t *h = (_ddp_health_t *)arg;
    ddp_comm_t *c = h->c;
    int64_t next;
    if (_ddp_health_setup(h) != 0) return NULL;
    next = _ddp_now_us();
    while (!_ddp_health_stopping(h)) {
        int64_t now = _ddp_now_us();
        if (c->eng.nranks > 1) _ddp_health_dial(h, now);
        if (now >= next) {
            h->tick++;
            _ddp_health_beat(h, &h->right);
            _ddp_health_beat(h, &h->left);
            _ddp_health_status(h, now);
            _ddp_health_check_down(h);
            _ddp_health_periodic(h, now);
            next += (int64_t)h->period_ms * 1000;
            if (next < now) next = now + (int64_t)h->period_ms * 1000;   /* fell behind: no burst */
        }
        _ddp_health_poll(h, next);
    }
    return NULL;
}

/* ---------------------------------------------------------------- start and stop */
_DDP_PRIVATE void _ddp_health_stop(ddp_comm_t *c) {
    _ddp_health_t *h = (_ddp_health_t *)c->health;
    int i;
    c->health = NULL;
    c->health_stop = NULL;
    if (!h) return;
    if (h->started && !c->forked) {
        unsigned char m[_DDP_HB_BYTES];
        pthread_mutex_lock(&h->mu);
        h->stop = 1;
        pthread_mutex_unlock(&h->mu);
        (void)!write(h->wake[1], "x", 1);
        pthread_join(h->thread, NULL);
        memset(m, 0, sizeof m);   /* goodbye: the neighbours see "closed", not a failure */
        memcpy(m, "DDPQ", 4);
        if (h->right.state == _DDP_LINK_UP) (void)!send(h->right.fd, m, sizeof m, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (h->left.state == _DDP_LINK_UP) (void)!send(h->left.fd, m, sizeof m, MSG_NOSIGNAL | MSG_DONTWAIT);
    }
    if (h->right.fd >= 0) close(h->right.fd);
    if (h->left.fd >= 0) close(h->left.fd);
    for (i = 0; i < _DDP_HEALTH_PENDING; i++)
        if (h->pending[i].fd >= 0) close(h->pending[i].fd);
    if (h->listen_fd >= 0) close(h->listen_fd);
    if (h->wake[0] >= 0) close(h->wake[0]);
    if (h->wake[1] >= 0) close(h->wake[1]);
    if (h->an) { _ddp_straggler_free(h->an); _ddp_free(&c->alloc, h->an); }
    if (h->blob_at) _ddp_free(&c->alloc, (void *)h->blob_at);
    if (h->blob_len) _ddp_free(&c->alloc, h->blob_len);
    if (h->line) _ddp_free(&c->alloc, h->line);
    if (h->blob) _ddp_free(&c->alloc, h->blob);
    if (h->min) _ddp_free(&c->alloc, h->min);
    if (h->st) {
        if (c->forked) _ddp_store_forget(h->st);
        else ddp_store_close(h->st);
    }
    if (!c->forked) {
        pthread_mutex_destroy(&h->mu);
        pthread_cond_destroy(&h->cv);
    }
    _ddp_free(&c->alloc, h);
}

/* After init: on unless DDP_HEALTH=0 (or the communicator has no store of its own job). */
_DDP_PRIVATE void _ddp_health_start(ddp_comm_t *c) {
    _ddp_health_t *h;
    long v;
    int left_peer, right_peer;
    int on = _ddp_env_int("DDP_HEALTH", 0, 1, &v) == 1 ? (int)v : 1;
    if (c->health || !on || !c->boot.store || c->boot.foreign) return;
    if (!(h = (_ddp_health_t *)_ddp_alloc(&c->alloc, sizeof *h))) return;
    memset(h, 0, sizeof *h);
    h->c = c;
    h->listen_fd = -1;
    if (pipe(h->wake) != 0) { _ddp_free(&c->alloc, h); return; }
    fcntl(h->wake[0], F_SETFD, FD_CLOEXEC);
    fcntl(h->wake[1], F_SETFD, FD_CLOEXEC);
    h->period_ms = _ddp_env_int("DDP_HEALTH_PERIOD_MS", 50, 60000, &v) == 1 ? (int)v : 500;
    h->hb_timeout_ms = _ddp_env_int("DDP_HEARTBEAT_TIMEOUT_MS", 1000, 3600000, &v) == 1 ? (int)v : 10000;
    _ddp_health_end_init(&h->right, (c->eng.rank + 1) % c->eng.nranks);
    _ddp_health_end_init(&h->left, (c->eng.rank + c->eng.nranks - 1) % c->eng.nranks);
    for (v = 0; v < _DDP_HEALTH_PENDING; v++) _ddp_health_end_init(&h->pending[v], -1);
    h->start_us = _ddp_now_us();
    if (gethostname(h->host, sizeof h->host - 1) != 0) snprintf(h->host, sizeof h->host, "?");
    for (v = 0; h->host[v]; v++) if (h->host[v] == ' ' || h->host[v] == '=') h->host[v] = '_';
    _ddp_health_setup_reports(h);
    pthread_mutex_init(&h->mu, NULL);
    pthread_cond_init(&h->cv, NULL);
    c->health = h;
    c->health_stop = _ddp_health_stop;
    __atomic_store_n(&c->stats.timed, 1, __ATOMIC_RELAXED);
    /* What the log below names, read before the thread runs: it may reset an end at once. */
    left_peer = h->left.peer;
    right_peer = h->right.peer;
    if (pthread_create(&h->thread, NULL, _ddp_health_main, h) != 0) {
        _DDP_LOG(c, DDP_LOG_WARN, "health: cannot start the health thread (%s): no heartbeats, no "
                 "status for ddp-status", strerror(errno));
        __atomic_store_n(&c->stats.timed, 0, __ATOMIC_RELAXED);
        return;
    }
    h->started = 1;
    _DDP_LOG(c, DDP_LOG_INFO, "health: a thread beats with ranks %d and %d every %d ms "
             "(DDP_HEALTH_PERIOD_MS), gives a neighbour up as unreachable after %d ms without an "
             "acknowledgement (DDP_HEARTBEAT_TIMEOUT_MS), and writes this rank's status for "
             "ddp-status under %s/health/ (DDP_HEALTH=0: off)", left_peer, right_peer,
             h->period_ms, h->hb_timeout_ms, c->boot.prefix);
}

#ifdef __cplusplus
}
#endif

#endif /* DDP_HEALTH_IMPLEMENTATION */
