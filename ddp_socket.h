/* SPDX-License-Identifier: MIT (see LICENSE) */
/* ddp_socket.h — libddp's private socket helpers, shared by the rendezvous store and the TCP
 * transport: non-blocking mode, address formatting, whole-buffer send/recv with a deadline,
 * and who owns the other end of a TCP connection made from this host (_ddp_tcp_peer_uid).
 * Nothing public: users never include it.
 * Depends on ddp_base.h. Built by DDP_IMPLEMENTATION (or DDP_SOCKET_IMPLEMENTATION).
 */
#if defined(DDP_IMPLEMENTATION) && !defined(DDP_SOCKET_IMPLEMENTATION)
#define DDP_SOCKET_IMPLEMENTATION
#endif
#if defined(DDP_SOCKET_IMPLEMENTATION)
#ifndef DDP_BASE_IMPLEMENTATION
#define DDP_BASE_IMPLEMENTATION
#endif
#endif
#include "ddp_base.h"

#if defined(DDP_SOCKET_IMPLEMENTATION) && !defined(DDP_SOCKET_IMPL_INCLUDED)
#define DDP_SOCKET_IMPL_INCLUDED
#ifndef DDP_BASE_IMPL_INCLUDED
#error "libddp: ddp_socket.h's implementation needs ddp_base.h's (define DDP_IMPLEMENTATION)"
#endif

_DDP_PRIVATE int _ddp_set_nonblock(int fd, int on) {
    int fl = fcntl(fd, F_GETFL, 0);
    if (fl < 0) return -1;
    return fcntl(fd, F_SETFL, on ? (fl | O_NONBLOCK) : (fl & ~O_NONBLOCK));
}

_DDP_PRIVATE void _ddp_sockaddr_str(const struct sockaddr *sa, char *out, size_t cap) {
    char host[INET6_ADDRSTRLEN] = "?";
    int port = 0;
    if (sa->sa_family == AF_INET) {
        const struct sockaddr_in *in = (const struct sockaddr_in *)(const void *)sa;
        inet_ntop(AF_INET, &in->sin_addr, host, sizeof host);
        port = ntohs(in->sin_port);
        snprintf(out, cap, "%s:%d", host, port);
    } else if (sa->sa_family == AF_INET6) {
        const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)(const void *)sa;
        inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof host);
        port = ntohs(in6->sin6_port);
        snprintf(out, cap, "[%s]:%d", host, port);
    } else {
        snprintf(out, cap, "(family %d)", sa->sa_family);
    }
}

/* A loopback address (127/8, ::1, or 127/8 mapped into IPv6): nothing off this host reaches it. */
_DDP_PRIVATE int _ddp_sockaddr_is_loopback(const struct sockaddr *sa) {
    if (sa->sa_family == AF_INET)
        return (ntohl(((const struct sockaddr_in *)(const void *)sa)->sin_addr.s_addr) >> 24) == 127;
    if (sa->sa_family == AF_INET6) {
        const struct in6_addr *a = &((const struct sockaddr_in6 *)(const void *)sa)->sin6_addr;
        return IN6_IS_ADDR_LOOPBACK(a) || (IN6_IS_ADDR_V4MAPPED(a) && a->s6_addr[12] == 127);
    }
    return 0;
}

/* Who owns the socket at the other end of the connected TCP socket fd, when that end is on
 * this host: NETLINK_SOCK_DIAG's exact lookup (one request for the one 4-tuple, the peer's
 * local address being our remote one; a hash lookup in the kernel, not a scan of every socket
 * the way /proc/net/tcp would be) of the socket with local = our peer and remote = us.
 * diag_fd: a NETLINK_SOCK_DIAG socket the caller keeps (see _ddp_sock_diag_open).
 * 0 and *uid (the uid that created the peer's socket, mapped into our user namespace);
 * -ENOENT: no such socket is open in a process here (the peer is on another host or in
 * another network namespace, or it closed: an orphaned or TIME_WAIT socket reports no owner,
 * so it counts as none); else -errno (no sock_diag: an old kernel, a sandbox). */
#if defined(__linux__)
#include <linux/netlink.h>
#include <linux/sock_diag.h>
#include <linux/inet_diag.h>

_DDP_PRIVATE int _ddp_sock_diag_open(void) {
    int fd = socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG);
    return fd < 0 ? -errno : fd;
}

/* An IPv4-mapped IPv6 address (a dual-stack socket's view of an IPv4 peer) as IPv4. */
_DDP_PRIVATE void _ddp_sa_unmap(struct sockaddr_storage *ss) {
    struct sockaddr_in6 a6;
    struct sockaddr_in *a4 = (struct sockaddr_in *)(void *)ss;
    if (ss->ss_family != AF_INET6) return;
    memcpy(&a6, ss, sizeof a6);
    if (!IN6_IS_ADDR_V4MAPPED(&a6.sin6_addr)) return;
    memset(ss, 0, sizeof *ss);
    a4->sin_family = AF_INET;
    a4->sin_port = a6.sin6_port;
    memcpy(&a4->sin_addr, a6.sin6_addr.s6_addr + 12, 4);
}

_DDP_PRIVATE int _ddp_tcp_peer_uid(int diag_fd, int fd, uid_t *uid) {
    struct { struct nlmsghdr nlh; struct inet_diag_req_v2 req; } rq;
    struct sockaddr_storage me, peer;
    struct sockaddr_nl kernel;
    socklen_t ml = sizeof me, pl = sizeof peer;
    union { struct nlmsghdr h; unsigned char b[1024]; } rb;
    ssize_t n;
    if (diag_fd < 0) return -EBADF;
    if (getsockname(fd, (struct sockaddr *)&me, &ml) != 0 || getpeername(fd, (struct sockaddr *)&peer, &pl) != 0)
        return -errno;
    _ddp_sa_unmap(&me);
    _ddp_sa_unmap(&peer);
    if (me.ss_family != peer.ss_family || (me.ss_family != AF_INET && me.ss_family != AF_INET6)) return -EAFNOSUPPORT;
    memset(&rq, 0, sizeof rq);
    rq.nlh.nlmsg_len = sizeof rq;
    rq.nlh.nlmsg_type = SOCK_DIAG_BY_FAMILY;
    rq.nlh.nlmsg_flags = NLM_F_REQUEST;          /* no NLM_F_DUMP: the one socket, exactly */
    rq.nlh.nlmsg_seq = 1;
    rq.req.sdiag_family = (unsigned char)me.ss_family;
    rq.req.sdiag_protocol = IPPROTO_TCP;
    rq.req.idiag_states = ~0u;
    rq.req.id.idiag_cookie[0] = rq.req.id.idiag_cookie[1] = INET_DIAG_NOCOOKIE;
    if (me.ss_family == AF_INET) {
        const struct sockaddr_in *m = (const struct sockaddr_in *)(const void *)&me;
        const struct sockaddr_in *p = (const struct sockaddr_in *)(const void *)&peer;
        rq.req.id.idiag_sport = p->sin_port;     /* the peer's socket: local = the peer */
        rq.req.id.idiag_dport = m->sin_port;
        memcpy(rq.req.id.idiag_src, &p->sin_addr, 4);
        memcpy(rq.req.id.idiag_dst, &m->sin_addr, 4);
    } else {
        const struct sockaddr_in6 *m = (const struct sockaddr_in6 *)(const void *)&me;
        const struct sockaddr_in6 *p = (const struct sockaddr_in6 *)(const void *)&peer;
        rq.req.id.idiag_sport = p->sin6_port;
        rq.req.id.idiag_dport = m->sin6_port;
        memcpy(rq.req.id.idiag_src, &p->sin6_addr, 16);
        memcpy(rq.req.id.idiag_dst, &m->sin6_addr, 16);
        rq.req.id.idiag_if = p->sin6_scope_id;
    }
    memset(&kernel, 0, sizeof kernel);
    kernel.nl_family = AF_NETLINK;
    do n = sendto(diag_fd, &rq, sizeof rq, 0, (struct sockaddr *)&kernel, sizeof kernel);
    while (n < 0 && errno == EINTR);
    if (n < 0) return -errno;
    /* The kernel answers while handling the request: the reply is queued when sendto returns. */
    for (;;) {
        do n = recv(diag_fd, &rb, sizeof rb, MSG_DONTWAIT);
        while (n < 0 && errno == EINTR);
        if (n < 0) return errno == EAGAIN || errno == EWOULDBLOCK ? -ETIMEDOUT : -errno;
        if ((size_t)n < sizeof(struct nlmsghdr) || rb.h.nlmsg_len > (size_t)n) return -EPROTO;
        if (rb.h.nlmsg_seq != 1) continue;       /* a stale answer to an earlier request */
        if (rb.h.nlmsg_type == NLMSG_ERROR) {
            const struct nlmsgerr *e = (const struct nlmsgerr *)NLMSG_DATA(&rb.h);
            if (rb.h.nlmsg_len < NLMSG_LENGTH(sizeof *e)) return -EPROTO;
            return e->error ? e->error : -ENOENT;
        }
        if (rb.h.nlmsg_type != SOCK_DIAG_BY_FAMILY || rb.h.nlmsg_len < NLMSG_LENGTH(sizeof(struct inet_diag_msg)))
            return -EPROTO;
        {
            const struct inet_diag_msg *m = (const struct inet_diag_msg *)NLMSG_DATA(&rb.h);
            if (m->idiag_inode == 0) return -ENOENT;   /* closed: no process owns it any more */
            *uid = (uid_t)m->idiag_uid;
            return 0;
        }
    }
}
#endif

/* Sends all of buf before the deadline; 0 on success, else -errno (-ETIMEDOUT, -EPIPE...). */
_DDP_PRIVATE int _ddp_send_all(int fd, const void *buf, size_t len, int64_t deadline_us) {
    const char *p = (const char *)buf;
    while (len) {
        ssize_t n = send(fd, p, len, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n > 0) { p += n; len -= (size_t)n; continue; }
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            struct pollfd pfd;
            int ms = _ddp_ms_left(deadline_us), r;
            if (ms == 0) return -ETIMEDOUT;
            pfd.fd = fd; pfd.events = POLLOUT; pfd.revents = 0;
            r = poll(&pfd, 1, ms);
            if (r < 0 && errno != EINTR) return -errno;
            continue;
        }
        return n == 0 ? -EPIPE : -errno;
    }
    return 0;
}

/* Receives exactly len bytes before the deadline; 0, -ECONNRESET on EOF, or -errno. */
_DDP_PRIVATE int _ddp_recv_all(int fd, void *buf, size_t len, int64_t deadline_us) {
    char *p = (char *)buf;
    while (len) {
        ssize_t n = recv(fd, p, len, MSG_DONTWAIT);
        if (n > 0) { p += n; len -= (size_t)n; continue; }
        if (n == 0) return -ECONNRESET;
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
            struct pollfd pfd;
            int ms = _ddp_ms_left(deadline_us), r;
            if (ms == 0) return -ETIMEDOUT;
            pfd.fd = fd; pfd.events = POLLIN; pfd.revents = 0;
            r = poll(&pfd, 1, ms);
            if (r < 0 && errno != EINTR) return -errno;
            continue;
        }
        return -errno;
    }
    return 0;
}

#endif /* DDP_SOCKET_IMPLEMENTATION */
