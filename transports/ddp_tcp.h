/* transports/ddp_tcp.h — libddp's TCP socket transport (the default; needs only libc + pthreads).
 *
 * In the file that defines DDP_IMPLEMENTATION this compiles the transport and registers it (a
 * constructor), so ddp_comm_init can use it:
 *
 *     #define _GNU_SOURCE
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
 * WIRE: a connection opens with {u32 magic, u32 version, u64 communicator id, i32 from rank,
 * i32 to rank}, answered by {u32 magic, u32 status}: anything else (a port scanner, a rank of
 * another job) is logged and dropped. Each message is {u32 magic, u32 0, u64 tag, u64 length}
 * then the payload; the receiver checks tag and length against what it posted.
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
#ifndef DDP_BASE_IMPLEMENTATION
#define DDP_BASE_IMPLEMENTATION
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
#define _DDP_TCP_VERSION 1u
#define _DDP_TCP_POOL 32                 /* requests per connection: 2 x DDP_RING_WINDOW + slack */
#define _DDP_TCP_HANDSHAKE_MS 10000

typedef struct { uint32_t magic, version; uint64_t comm_id; int32_t from, to; } _ddp_tcp_hello_t;
typedef struct { uint32_t magic, status; } _ddp_tcp_ack_t;
typedef struct { uint32_t magic, zero; uint64_t tag, len; } _ddp_tcp_hdr_t;

struct _ddp_tcp_conn;
typedef struct _ddp_tcp_req {
    struct _ddp_tcp_req *next;
    struct _ddp_tcp_conn *conn;
    unsigned char *buf;
    size_t len, done;        /* bytes of header + payload moved so far */
    _ddp_tcp_hdr_t hdr;      /* sent, or received and then checked */
    uint64_t tag;
    int complete, is_send;
} _ddp_tcp_req_t;

typedef struct _ddp_tcp_conn {
    int fd, peer;
    struct _ddp_tcp *tp;
    _ddp_tcp_req_t *sq, *sq_tail, *rq, *rq_tail;
    _ddp_transport_freelist_t free;
    ddp_result_t err;        /* sticky once the connection broke */
    _ddp_tcp_req_t pool[_DDP_TCP_POOL];
} _ddp_tcp_conn_t;

typedef struct {              /* an accepted socket whose hello has not fully arrived */
    int fd;
    int64_t deadline;
    size_t got;
    _ddp_tcp_hello_t hello;
    char addr[80];
} _ddp_tcp_pending_t;

typedef struct {              /* our side of a connect in progress */
    int fd, stage;            /* 0 none, 1 connecting, 2 hello sent: waiting for the ack */
    size_t got;
    _ddp_tcp_ack_t ack;
    int64_t deadline;
} _ddp_tcp_dial_t;

typedef struct _ddp_tcp {
    const ddp_transport_ctx_t *ctx;
    int listen_fd, bufsize;
    char addr_str[96];
    _ddp_tcp_pending_t pending[64];
    int npending;
    _ddp_tcp_conn_t **ready; /* accepted and identified, by peer rank, until accept() takes it */
    _ddp_tcp_dial_t *dial;   /* by peer rank */
} _ddp_tcp_t;

/* The address to listen on: an interface named by DDP_SOCKET_IFNAME, else the source address
 * the kernel would use to reach the master (a UDP connect sends nothing). */
static ddp_result_t _ddp_tcp_pick_addr(_ddp_tcp_t *tp, struct sockaddr_storage *ss, socklen_t *sl) {
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

static void _ddp_tcp_tune(_ddp_tcp_t *tp, int fd) {
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (tp->bufsize > 0) {
        setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &tp->bufsize, sizeof tp->bufsize);
        setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &tp->bufsize, sizeof tp->bufsize);
    }
    _ddp_set_nonblock(fd, 1);
}

static ddp_result_t _ddp_tcp_finalize(void *state);

static ddp_result_t _ddp_tcp_init(const ddp_transport_ctx_t *c, void **state) {
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
    if (!tp->ready || !tp->dial) { _ddp_tcp_finalize(tp); return ddp_transport_fail(c, DDP_ERR_OUT_OF_MEMORY, "tcp: init"); }
    for (i = 0; i < n; i++) tp->dial[i].fd = -1;
    if ((r = _ddp_tcp_pick_addr(tp, &ss, &sl)) != DDP_SUCCESS) { _ddp_tcp_finalize(tp); return r; }
    if (ss.ss_family == AF_INET) ((struct sockaddr_in *)&ss)->sin_port = 0;
    else ((struct sockaddr_in6 *)&ss)->sin6_port = 0;
    tp->listen_fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (tp->listen_fd < 0 || bind(tp->listen_fd, (struct sockaddr *)&ss, sl) != 0 ||
        listen(tp->listen_fd, 256) != 0) {
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
    _DDP_TLOG(c, DDP_LOG_INFO, "tcp: listening on %s%s", tp->addr_str,
              tp->bufsize > 0 ? " (fixed socket buffers)" : " (autotuned socket buffers)");
    *state = tp;
    return DDP_SUCCESS;
}

static int _ddp_tcp_reachable(void *state, int peer) { (void)state; (void)peer; return 1; }

static _ddp_tcp_conn_t *_ddp_tcp_new_conn(_ddp_tcp_t *tp, int fd, int peer) {
    _ddp_tcp_conn_t *k = (_ddp_tcp_conn_t *)ddp_transport_calloc(tp->ctx, sizeof *k);
    if (!k) return NULL;
    k->fd = fd;
    k->peer = peer;
    k->tp = tp;
    _ddp_transport_freelist_init(&k->free, k->pool, sizeof k->pool[0], _DDP_TCP_POOL);
    _ddp_tcp_tune(tp, fd);
    return k;
}

static ddp_result_t _ddp_tcp_connect(void *state, int peer, void **conn) {
    _ddp_tcp_t *tp = (_ddp_tcp_t *)state;
    const ddp_transport_ctx_t *c = tp->ctx;
    _ddp_tcp_dial_t *d = &tp->dial[peer];
    *conn = NULL;
    if (d->stage == 0) {
        struct sockaddr_storage ss;
        size_t len = 0;
        _ddp_tcp_hello_t h;
        char a[96];
        ddp_result_t r = c->lookup(c->host, "tcp", peer, &ss, sizeof ss, &len);
        if (r != DDP_SUCCESS) return r;
        _ddp_sockaddr_str((struct sockaddr *)&ss, a, sizeof a);
        d->fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (d->fd < 0) return ddp_transport_fail(c, DDP_ERR_SYSTEM, "tcp: socket: %s", strerror(errno));
        _ddp_tcp_tune(tp, d->fd);
        _DDP_TLOG(c, DDP_LOG_TRACE, "tcp: connecting to rank %d at %s", peer, a);
        if (connect(d->fd, (struct sockaddr *)&ss, (socklen_t)len) != 0 && errno != EINPROGRESS)
            return ddp_transport_fail(c, DDP_ERR_SYSTEM, "tcp: connect to rank %d at %s: %s", peer, a, strerror(errno));
        /* The hello fits in an empty socket buffer: queue it now, it leaves on connect. */
        h.magic = _DDP_TCP_HELLO_MAGIC; h.version = _DDP_TCP_VERSION; h.comm_id = c->comm_id;
        h.from = c->rank; h.to = peer;
        d->deadline = _ddp_deadline(c->timeout_ms);
        {
            struct pollfd pfd;
            int rc;
            pfd.fd = d->fd; pfd.events = POLLOUT; pfd.revents = 0;
            rc = poll(&pfd, 1, _ddp_ms_left(d->deadline));
            if (rc == 1) {
                int err = 0;
                socklen_t el = sizeof err;
                getsockopt(d->fd, SOL_SOCKET, SO_ERROR, &err, &el);
                if (err) return ddp_transport_fail(c, DDP_ERR_SYSTEM, "tcp: connect to rank %d at %s: %s", peer, a, strerror(err));
            } else {
                return ddp_transport_fail(c, DDP_ERR_TIMEOUT, "tcp: connect to rank %d at %s timed out", peer, a);
            }
            if (_ddp_send_all(d->fd, &h, sizeof h, d->deadline) != 0)
                return ddp_transport_fail(c, DDP_ERR_REMOTE, "tcp: rank %d at %s closed during handshake", peer, a);
        }
        d->stage = 2;
        d->got = 0;
    }
    if (d->stage == 2) {
        ssize_t n = recv(d->fd, (char *)&d->ack + d->got, sizeof d->ack - d->got, MSG_DONTWAIT);
        if (n > 0) d->got += (size_t)n;
        else if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR))
            return ddp_transport_fail(c, DDP_ERR_REMOTE, "tcp: rank %d refused our connection "
                                      "(handshake closed: %s)", peer, n == 0 ? "EOF" : strerror(errno));
        if (d->got < sizeof d->ack) {
            if (_ddp_ms_left(d->deadline) == 0)
                return ddp_transport_fail(c, DDP_ERR_TIMEOUT, "tcp: rank %d never answered our handshake", peer);
            return DDP_SUCCESS;
        }
        if (d->ack.magic != _DDP_TCP_HELLO_MAGIC || d->ack.status != DDP_SUCCESS)
            return ddp_transport_fail(c, DDP_ERR_MISMATCH, "tcp: rank %d rejected our handshake (status %u)",
                                      peer, d->ack.status);
        *conn = _ddp_tcp_new_conn(tp, d->fd, peer);
        if (!*conn) return ddp_transport_fail(c, DDP_ERR_OUT_OF_MEMORY, "tcp: connection");
        d->fd = -1;
        d->stage = 3;
    }
    return DDP_SUCCESS;
}

/* Accepts whatever has arrived and identifies it; strangers are logged and dropped. */
static ddp_result_t _ddp_tcp_pump_accept(_ddp_tcp_t *tp) {
    const ddp_transport_ctx_t *c = tp->ctx;
    int i;
    while (tp->npending < (int)(sizeof tp->pending / sizeof tp->pending[0])) {
        struct sockaddr_storage ss;
        socklen_t sl = sizeof ss;
        int fd = accept4(tp->listen_fd, (struct sockaddr *)&ss, &sl, SOCK_CLOEXEC | SOCK_NONBLOCK);
        _ddp_tcp_pending_t *p;
        if (fd < 0) break;
        p = &tp->pending[tp->npending++];
        memset(p, 0, sizeof *p);
        p->fd = fd;
        p->deadline = _ddp_deadline(_DDP_TCP_HANDSHAKE_MS);
        _ddp_sockaddr_str((struct sockaddr *)&ss, p->addr, sizeof p->addr);
    }
    for (i = 0; i < tp->npending; i++) {
        _ddp_tcp_pending_t *p = &tp->pending[i];
        ssize_t n = recv(p->fd, (char *)&p->hello + p->got, sizeof p->hello - p->got, MSG_DONTWAIT);
        const char *why = NULL;
        if (n > 0) p->got += (size_t)n;
        else if (n == 0) why = "closed before its handshake";
        else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) why = strerror(errno);
        if (!why && p->got < sizeof p->hello) {
            if (_ddp_ms_left(p->deadline) == 0) why = "sent no handshake in time";
            else continue;
        }
        if (!why) {
            _ddp_tcp_hello_t *h = &p->hello;
            if (h->magic != _DDP_TCP_HELLO_MAGIC) why = "is not a libddp rank (bad magic)";
            else if (h->version != _DDP_TCP_VERSION) why = "speaks another libddp wire version";
            else if (h->comm_id != c->comm_id) why = "belongs to another communicator or job";
            else if (h->to != c->rank || h->from < 0 || h->from >= c->nranks ||
                     h->from == c->rank) why = "names ranks that do not fit this communicator";
            else if (tp->ready[h->from]) why = "is a second connection from the same rank";
        }
        if (why) {
            _DDP_TLOG(c, DDP_LOG_WARN, "tcp: dropped a connection from %s: it %s", p->addr, why);
            close(p->fd);
        } else {
            _ddp_tcp_ack_t ack;
            ack.magic = _DDP_TCP_HELLO_MAGIC;
            ack.status = DDP_SUCCESS;
            if (_ddp_send_all(p->fd, &ack, sizeof ack, _ddp_deadline(_DDP_TCP_HANDSHAKE_MS)) != 0) {
                close(p->fd);
            } else {
                tp->ready[p->hello.from] = _ddp_tcp_new_conn(tp, p->fd, p->hello.from);
                if (!tp->ready[p->hello.from]) { close(p->fd); return ddp_transport_fail(c, DDP_ERR_OUT_OF_MEMORY, "tcp: connection"); }
                _DDP_TLOG(c, DDP_LOG_TRACE, "tcp: accepted rank %d from %s", p->hello.from, p->addr);
            }
        }
        tp->pending[i--] = tp->pending[--tp->npending];
    }
    return DDP_SUCCESS;
}

static ddp_result_t _ddp_tcp_accept(void *state, int peer, void **conn) {
    _ddp_tcp_t *tp = (_ddp_tcp_t *)state;
    ddp_result_t r;
    *conn = NULL;
    if (!tp->ready[peer] && (r = _ddp_tcp_pump_accept(tp)) != DDP_SUCCESS) return r;
    if (tp->ready[peer]) { *conn = tp->ready[peer]; tp->ready[peer] = NULL; }
    return DDP_SUCCESS;
}

/* The connection's first failure is recorded and sticks: every later call on it returns it. */
#define _DDP_TCP_BROKEN(k, ...) _ddp_transport_conn_fail((k)->tp->ctx, &(k)->err, __VA_ARGS__)

/* Moves as many bytes as the socket takes, both directions. Never blocks. */
static ddp_result_t _ddp_tcp_progress(_ddp_tcp_conn_t *k) {
    if (k->err != DDP_SUCCESS) return k->err;
    /* Sends: header + payload of several queued messages in one writev. */
    while (k->sq) {
        struct iovec iov[16];
        int n = 0;
        ssize_t w;
        _ddp_tcp_req_t *q;
        for (q = k->sq; q && n + 2 <= 16; q = q->next) {
            const size_t hs = sizeof q->hdr, pd = q->done > hs ? q->done - hs : 0;
            if (q->done < hs) {
                iov[n].iov_base = (char *)&q->hdr + q->done;
                iov[n++].iov_len = hs - q->done;
            }
            if (pd < q->len) {
                iov[n].iov_base = q->buf + pd;
                iov[n++].iov_len = q->len - pd;
            }
        }
        {
            struct msghdr mh;
            memset(&mh, 0, sizeof mh);
            mh.msg_iov = iov;
            mh.msg_iovlen = (size_t)n;
            w = sendmsg(k->fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
        }
        if (w < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) break;
            return _DDP_TCP_BROKEN(k, DDP_ERR_REMOTE, "tcp: sending to rank %d failed: %s (rank %d "
                                   "exited or closed the connection)", k->peer, strerror(errno), k->peer);
        }
        while (w > 0 && k->sq) {
            size_t left = sizeof k->sq->hdr + k->sq->len - k->sq->done;
            size_t take = (size_t)w < left ? (size_t)w : left;
            k->sq->done += take;
            w -= (ssize_t)take;
            if (k->sq->done == sizeof k->sq->hdr + k->sq->len) {
                k->sq->complete = 1;
                k->sq = k->sq->next;
                if (!k->sq) k->sq_tail = NULL;
            }
        }
        if (k->sq) break; /* the socket buffer is full */
    }
    /* Receives: header and payload of the head request in one readv; the payload lands in the
     * user's buffer directly. The header is checked as soon as it is complete. */
    while (k->rq) {
        _ddp_tcp_req_t *q = k->rq;
        struct iovec iov[2];
        int n = 0;
        ssize_t got;
        if (q->done < sizeof q->hdr) {
            iov[n].iov_base = (char *)&q->hdr + q->done;
            iov[n++].iov_len = sizeof q->hdr - q->done;
            if (q->len) { iov[n].iov_base = q->buf; iov[n++].iov_len = q->len; }
        } else {
            iov[n].iov_base = q->buf + (q->done - sizeof q->hdr);
            iov[n++].iov_len = q->len - (q->done - sizeof q->hdr);
        }
        got = readv(k->fd, iov, n);
        if (got == 0)
            return _DDP_TCP_BROKEN(k, DDP_ERR_REMOTE, "tcp: rank %d closed the connection (it "
                                   "exited, crashed or failed)", k->peer);
        if (got < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) break;
            return _DDP_TCP_BROKEN(k, DDP_ERR_REMOTE, "tcp: receiving from rank %d failed: %s",
                                   k->peer, strerror(errno));
        }
        {
            int had_hdr = q->done >= sizeof q->hdr;
            q->done += (size_t)got;
            if (!had_hdr && q->done >= sizeof q->hdr) {
                if (q->hdr.magic != _DDP_TCP_MSG_MAGIC)
                    return _DDP_TCP_BROKEN(k, DDP_ERR_MISMATCH, "tcp: malformed message from rank "
                                           "%d (bad magic %08x)", k->peer, q->hdr.magic);
                if (q->hdr.tag != q->tag || q->hdr.len != q->len)
                    return _DDP_TCP_BROKEN(k, DDP_ERR_MISMATCH, "tcp: rank %d sent collective #%u "
                        "(signature %08x) of %llu bytes, this rank expected #%u (signature %08x) of "
                        "%zu bytes: the ranks called different collectives, dtypes, ops, roots or "
                        "counts", k->peer, (unsigned)(q->hdr.tag & 0xffffffffu),
                        (unsigned)(q->hdr.tag >> 32), (unsigned long long)q->hdr.len,
                        (unsigned)(q->tag & 0xffffffffu), (unsigned)(q->tag >> 32), q->len);
            }
        }
        if (q->done < sizeof q->hdr + q->len) break;
        q->complete = 1;
        k->rq = q->next;
        if (!k->rq) k->rq_tail = NULL;
    }
    return DDP_SUCCESS;
}

static ddp_result_t _ddp_tcp_post(_ddp_tcp_conn_t *k, int is_send, void *buf, size_t len,
                                  uint64_t tag, void **req) {
    _ddp_tcp_req_t *q;
    if (k->err != DDP_SUCCESS) return k->err;
    q = (_ddp_tcp_req_t *)_ddp_transport_req_get(k->tp->ctx, &k->free, "tcp", k->peer);
    if (!q) return DDP_ERR_INTERNAL;
    q->next = NULL;
    q->conn = k;
    q->buf = (unsigned char *)buf;
    q->len = len;
    q->done = 0;
    q->tag = tag;
    q->complete = 0;
    q->is_send = is_send;
    q->hdr.magic = _DDP_TCP_MSG_MAGIC;
    q->hdr.zero = 0;
    q->hdr.tag = tag;
    q->hdr.len = len;
    if (is_send) {
        if (k->sq_tail) k->sq_tail->next = q; else k->sq = q;
        k->sq_tail = q;
    } else {
        memset(&q->hdr, 0, sizeof q->hdr);
        if (k->rq_tail) k->rq_tail->next = q; else k->rq = q;
        k->rq_tail = q;
    }
    *req = q;
    return DDP_SUCCESS;
}

static ddp_result_t _ddp_tcp_isend(void *conn, const void *buf, size_t len, uint64_t tag, void *mr,
                                   void **req) {
    (void)mr;
    return _ddp_tcp_post((_ddp_tcp_conn_t *)conn, 1, (void *)(uintptr_t)buf, len, tag, req);
}

static ddp_result_t _ddp_tcp_irecv(void *conn, void *buf, size_t len, uint64_t tag, void *mr, void **req) {
    (void)mr;
    return _ddp_tcp_post((_ddp_tcp_conn_t *)conn, 0, buf, len, tag, req);
}

static ddp_result_t _ddp_tcp_test(void *req, int *done) {
    _ddp_tcp_req_t *q = (_ddp_tcp_req_t *)req;
    _ddp_tcp_conn_t *k = q->conn;
    *done = 0;
    if (!q->complete) {
        ddp_result_t r = _ddp_tcp_progress(k);
        if (r != DDP_SUCCESS) return r;
    }
    if (q->complete) {
        _ddp_transport_req_put(&k->free, q);
        *done = 1;
    }
    return DDP_SUCCESS;
}

static ddp_result_t _ddp_tcp_wait(void *state, void *const *conns, int n, int timeout_ms) {
    struct pollfd pfd[8];
    int i, m = 0;
    (void)state;
    for (i = 0; i < n && m < 8; i++) {
        _ddp_tcp_conn_t *k = (_ddp_tcp_conn_t *)conns[i];
        short ev = (short)((k->rq ? POLLIN : 0) | (k->sq ? POLLOUT : 0));
        int j, dup = 0;
        if (!ev || k->err != DDP_SUCCESS) continue;
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

static ddp_result_t _ddp_tcp_close(void *conn) {
    _ddp_tcp_conn_t *k = (_ddp_tcp_conn_t *)conn;
    if (!k) return DDP_SUCCESS;
    if (k->fd >= 0) close(k->fd);
    ddp_transport_free(k->tp->ctx, k);
    return DDP_SUCCESS;
}

static ddp_result_t _ddp_tcp_finalize(void *state) {
    _ddp_tcp_t *tp = (_ddp_tcp_t *)state;
    int i, n;
    if (!tp) return DDP_SUCCESS;
    n = tp->ctx->nranks;
    if (tp->listen_fd >= 0) close(tp->listen_fd);
    for (i = 0; i < tp->npending; i++) close(tp->pending[i].fd);
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
    NULL, NULL, _ddp_tcp_isend, _ddp_tcp_irecv, _ddp_tcp_test, _ddp_tcp_wait,
    _ddp_tcp_close, _ddp_tcp_finalize, NULL, NULL,
};

DDP_API const ddp_transport_t *ddp_transport_tcp(void) { return &_ddp_tcp_transport; }

_DDP_TRANSPORT_CONSTRUCTOR(_ddp_tcp_register) { ddp_transport_register(&_ddp_tcp_transport); }

#endif /* DDP_TCP implementation */
