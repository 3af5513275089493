/* SPDX-License-Identifier: MIT (see LICENSE) */
/* transports/ddp_shm_handshake.h — the shared-memory transport's handshake messages: one
 * fixed layout for HELLO, CHALLENGE, ANSWER and WELCOME, sent over a Unix socket with sealed
 * memfds attached (SCM_RIGHTS) to the last two, and the kernel's word on who is at the other
 * end (SO_PEERCRED). Two purposes: a rank JOINs its host's region (the leader's WELCOME brings
 * it), or a PAIR of ranks connects (the connector's ANSWER brings the pair's queues). Private: transports/ddp_shm.h, which users include, runs the
 * handshake itself (its top comment says what each message carries and why).
 * Depends on ddp_auth.h (the nonce and proof sizes). Built by DDP_IMPLEMENTATION (or
 * DDP_SHM_HANDSHAKE_IMPLEMENTATION).
 */
#if defined(DDP_IMPLEMENTATION) && !defined(DDP_SHM_HANDSHAKE_IMPLEMENTATION)
#define DDP_SHM_HANDSHAKE_IMPLEMENTATION
#endif
#if defined(DDP_SHM_HANDSHAKE_IMPLEMENTATION) && !defined(DDP_AUTH_IMPLEMENTATION)
#define DDP_AUTH_IMPLEMENTATION
#endif
#include "../ddp_auth.h"

#if defined(DDP_SHM_HANDSHAKE_IMPLEMENTATION) && !defined(DDP_SHM_HANDSHAKE_IMPL_INCLUDED)
#define DDP_SHM_HANDSHAKE_IMPL_INCLUDED
#ifndef DDP_AUTH_IMPL_INCLUDED
#error "libddp: transports/ddp_shm_handshake.h's implementation needs ddp_auth.h's (define DDP_IMPLEMENTATION)"
#endif

/* memfd seals (fcntl(2)), spelled out: glibc declares them only under _GNU_SOURCE. */
#ifndef F_ADD_SEALS
#define F_ADD_SEALS 1033
#define F_GET_SEALS 1034
#endif
#ifndef F_SEAL_SEAL
#define F_SEAL_SEAL 0x0001
#define F_SEAL_SHRINK 0x0002
#define F_SEAL_GROW 0x0004
#endif
#define _DDP_SHM_SEALS (F_SEAL_SEAL | F_SEAL_SHRINK | F_SEAL_GROW)

#define _DDP_SHM_MAGIC 0x44445348u      /* "DDSH": region header and handshake */
#define _DDP_SHM_VERSION 4u             /* 2: mutual challenge-response before any memfd;
                                         * 3: sealed memfds, no pid or address on the wire;
                                         * 4: one region per host (JOIN), a region per pair */

/* Every handshake message has this one layout (kind says which); `from` is the sender. */
enum { _DDP_SHM_HELLO = 1, _DDP_SHM_CHALLENGE, _DDP_SHM_ANSWER, _DDP_SHM_WELCOME };
enum { _DDP_SHM_PAIR = 0, _DDP_SHM_JOIN = 1 };         /* purpose: what the HELLO asks for */
typedef struct {
    uint32_t magic, version;
    uint64_t comm_id;
    int32_t from, to, unused0, kind;                   /* unused0, unused1: sent as 0, never read */
    int32_t status, purpose;
    uint64_t region_bytes, unused1;                    /* ANSWER and WELCOME (with the memfd) */
    unsigned char nonce[_DDP_AUTH_NONCE_BYTES];        /* HELLO: the connector's; CHALLENGE: ours */
    unsigned char proof[_DDP_AUTH_PROOF_BYTES];        /* CHALLENGE: proof_s; ANSWER: proof_c */
} _ddp_shm_hello_t;

/* The process at the other end of a unix socket (SO_PEERCRED: the kernel's word, not the
 * peer's): 1 with *pid when it runs as this one's effective user. The answer is Linux's struct
 * ucred (unix(7): pid, uid, gid, 32 bits each), spelled out here because glibc declares it
 * only under _GNU_SOURCE. */
_DDP_PRIVATE int _ddp_shm_peer_cred(int fd, int *pid) {
    struct { int32_t pid; uint32_t uid, gid; } cred;
    socklen_t cl = sizeof cred;
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &cl) != 0 || cl != sizeof cred) return 0;
    if (pid) *pid = cred.pid;
    return cred.uid == (uint32_t)geteuid();
}
_DDP_PRIVATE int _ddp_shm_same_user(int fd) { return _ddp_shm_peer_cred(fd, NULL); }

/* Sends a handshake message with nfds (0..2) descriptors (SCM_RIGHTS). Returns 0 or an errno.
 * Only ANSWER and WELCOME carry memfds: both come after the other side's proof. */
_DDP_PRIVATE int _ddp_shm_send_fds(int fd, const _ddp_shm_hello_t *h, const int *fds, int nfds) {
    struct msghdr m;
    struct iovec iov;
    union { struct cmsghdr align; char buf[CMSG_SPACE(2 * sizeof(int))]; } u;
    struct cmsghdr *cm;
    memset(&m, 0, sizeof m);
    memset(&u, 0, sizeof u);
    iov.iov_base = (void *)(uintptr_t)h;
    iov.iov_len = sizeof *h;
    m.msg_iov = &iov;
    m.msg_iovlen = 1;
    if (nfds > 0) {
        m.msg_control = u.buf;
        m.msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)nfds);
        cm = CMSG_FIRSTHDR(&m);
        cm->cmsg_level = SOL_SOCKET;
        cm->cmsg_type = SCM_RIGHTS;
        cm->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)nfds);
        memcpy(CMSG_DATA(cm), fds, sizeof(int) * (size_t)nfds);
    }
    errno = 0;
    if (sendmsg(fd, &m, MSG_NOSIGNAL | MSG_DONTWAIT) != (ssize_t)sizeof *h) return errno ? errno : EIO;
    return 0;
}

/* A handshake message with memfd (SCM_RIGHTS) unless it is -1. */
_DDP_PRIVATE int _ddp_shm_send_hello(int fd, const _ddp_shm_hello_t *h, int memfd) {
    return _ddp_shm_send_fds(fd, h, &memfd, memfd >= 0 ? 1 : 0);
}

/* Receives a handshake message and up to two descriptors (fds[i] = -1 where none came; more are
 * closed). 1 = got it, 0 = not yet (EAGAIN), -1 = malformed, -2 = the other side closed. */
_DDP_PRIVATE int _ddp_shm_recv_fds(int fd, _ddp_shm_hello_t *h, int fds_out[2]) {
    struct msghdr m;
    struct iovec iov;
    union { struct cmsghdr align; char buf[CMSG_SPACE(sizeof(int) * 4)]; } u;
    struct cmsghdr *cm;
    ssize_t got;
    int j0;
    fds_out[0] = fds_out[1] = -1;
    memset(&m, 0, sizeof m);
    iov.iov_base = h;
    iov.iov_len = sizeof *h;
    m.msg_iov = &iov;
    m.msg_iovlen = 1;
    m.msg_control = u.buf;
    m.msg_controllen = sizeof u.buf;
    got = recvmsg(fd, &m, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    if (got < 0) return (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) ? 0
                        : errno == ECONNRESET ? -2 : -1;
    for (cm = CMSG_FIRSTHDR(&m); cm; cm = CMSG_NXTHDR(&m, cm)) {
        if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS) {
            size_t nfd = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int), j;
            int fds[4];
            memcpy(fds, CMSG_DATA(cm), nfd * sizeof(int) > sizeof fds ? sizeof fds : nfd * sizeof(int));
            for (j = 0; j < nfd && j < 4; j++) {
                for (j0 = 0; j0 < 2 && fds_out[j0] >= 0; j0++) {}
                if (j0 < 2) fds_out[j0] = fds[j];
                else close(fds[j]);        /* a stranger sending extra descriptors */
            }
        }
    }
    if (got == 0) return -2;
    /* Messages are small and sent with one sendmsg: a short read is a stranger, not a split. */
    if (got != (ssize_t)sizeof *h || h->magic != _DDP_SHM_MAGIC || h->version != _DDP_SHM_VERSION) {
        for (j0 = 0; j0 < 2; j0++) if (fds_out[j0] >= 0) close(fds_out[j0]);
        fds_out[0] = fds_out[1] = -1;
        return -1;
    }
    return 1;
}

/* One descriptor at most (any more are closed). */
_DDP_PRIVATE int _ddp_shm_recv_hello(int fd, _ddp_shm_hello_t *h, int *memfd) {
    int fds[2], r = _ddp_shm_recv_fds(fd, h, fds);
    if (fds[1] >= 0) close(fds[1]);
    *memfd = fds[0];
    return r;
}

#endif /* DDP_SHM_HANDSHAKE_IMPLEMENTATION */
