/* ddp_socket.h — libddp's private socket helpers, shared by the rendezvous store and the TCP
 * transport: non-blocking mode, address formatting, whole-buffer send/recv with a deadline.
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
