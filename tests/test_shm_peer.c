/* SPDX-License-Identifier: MIT */
/* tests/test_shm_peer.c — a shared-memory peer that proved the key but lies or cheats cannot
 * crash the other ranks. Prints TAP.
 *
 *   build/test_shm_peer       (DDP_TEST_ONLY=<scenario name> runs one)
 *
 * Rank 0 of 3 is a real rank whose handshake messages pass through a tampering sendmsg (this
 * file defines sendmsg before it compiles libddp): it knows the communicator's key, so what it
 * sends is taken as a rank's word. Ranks 1 and 2 are the victims: rank 0, the host's lowest
 * rank, sends each of them the host region with its WELCOME to their join, and, as the lower
 * rank of each pair, the pair's region with its ANSWER.
 *   lie        the WELCOME and ANSWER carry the victim's own pid and address 0x1000 where
 *              earlier versions put the sender's pid and region address: the victims never read
 *              those bytes (identity from SO_PEERCRED, addresses never on the wire); all-reduces
 *              exact.
 *   unsealed   a copy of the region in a memfd without seals: refused at the handshake, saying
 *              why; no crash.
 *   small      a sealed memfd of 4096 bytes instead of the region's size: refused (no SIGBUS
 *              on the first access beyond it).
 *   truncate   after init, rank 0 tries to shrink the host region it made to 0 bytes: the
 *              seals refuse (EPERM), and the victims' all-reduces stay exact (no SIGBUS). */
#define _GNU_SOURCE
#include <sys/socket.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <string.h>
#include <unistd.h>

enum { TAMPER_NONE, TAMPER_LIE, TAMPER_UNSEALED, TAMPER_SMALL, TAMPER_TRUNCATE };
static int tamper_mode;
static int tamper_memfd = -1;   /* the first memfd this rank sent (the host region, kept open) */
static ssize_t tamper_sendmsg(int fd, const struct msghdr *m, int flags);
#define sendmsg tamper_sendmsg
#define DDP_IMPLEMENTATION
#include "ddp.h"
#include "transports/ddp_tcp.h"
#include "transports/ddp_shm.h"
#include "tests/ddp_test.h"
#undef sendmsg

#define P 3
#define FAKE 0

static int copy_memfd(int src, size_t bytes, size_t copy, int seal) {
    int fd = (int)syscall(SYS_memfd_create, "fake", seal ? 3u : 1u);
    void *from, *to;
    if (fd < 0 || ftruncate(fd, (off_t)bytes) != 0) return -1;
    from = mmap(NULL, copy, PROT_READ, MAP_SHARED, src, 0);
    to = mmap(NULL, copy, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (from == MAP_FAILED || to == MAP_FAILED) return -1;
    memcpy(to, from, copy);
    munmap(from, copy);
    munmap(to, copy);
    if (seal && fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) return -1;
    return fd;
}

/* A handshake message that carries a memfd (ANSWER or WELCOME), rewritten by tamper_mode. The
 * fields are reached by offset: the layout is the same in every version that had a pid and an
 * address there. */
static ssize_t tamper_sendmsg(int fd, const struct msghdr *m, int flags) {
    _ddp_shm_hello_t h;
    struct msghdr m2;
    struct iovec iov;
    union { struct cmsghdr align; char buf[CMSG_SPACE(sizeof(int))]; } u;
    struct cmsghdr *cm;
    int memfd, fake = -1;
    ssize_t r;
    if (!tamper_mode || m->msg_iovlen != 1 || m->msg_iov[0].iov_len != sizeof h || !m->msg_control)
        return sendmsg(fd, m, flags);
    memcpy(&h, m->msg_iov[0].iov_base, sizeof h);
    cm = CMSG_FIRSTHDR(m);
    if (h.magic != _DDP_SHM_MAGIC || !cm || cm->cmsg_type != SCM_RIGHTS) return sendmsg(fd, m, flags);
    memcpy(&memfd, CMSG_DATA(cm), sizeof memfd);
    if (tamper_memfd < 0) tamper_memfd = memfd;
    if (tamper_mode == TAMPER_LIE) {
        struct { int32_t pid; uint32_t uid, gid; } cred;
        socklen_t cl = sizeof cred;
        uint64_t addr = 0x1000;
        int32_t pid = 0;
        if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &cl) == 0) pid = cred.pid;   /* the victim */
        memcpy((char *)&h + offsetof(_ddp_shm_hello_t, kind) - sizeof(int32_t), &pid, sizeof pid);
        memcpy((char *)&h + offsetof(_ddp_shm_hello_t, region_bytes) + sizeof(uint64_t), &addr, sizeof addr);
    } else if (tamper_mode == TAMPER_UNSEALED) {
        fake = copy_memfd(memfd, (size_t)h.region_bytes, (size_t)h.region_bytes, 0);
    } else if (tamper_mode == TAMPER_SMALL) {
        fake = copy_memfd(memfd, 4096, 4096, 1);
    }
    memset(&m2, 0, sizeof m2);
    memset(&u, 0, sizeof u);
    iov.iov_base = &h;
    iov.iov_len = sizeof h;
    m2.msg_iov = &iov;
    m2.msg_iovlen = 1;
    m2.msg_control = u.buf;
    m2.msg_controllen = sizeof u.buf;
    cm = CMSG_FIRSTHDR(&m2);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(cm), fake >= 0 ? &fake : &memfd, sizeof(int));
    r = sendmsg(fd, &m2, flags);
    if (fake >= 0) close(fake);
    return r;
}

static int all_reduce_exact(ddp_comm_t *c, int rank, const char *what) {
    float v[1000];
    int i, good = 1;
    ddp_result_t r;
    for (i = 0; i < 1000; i++) v[i] = (float)(rank + 1);
    r = ddp_all_reduce(v, v, 1000, DDP_FLOAT32, DDP_SUM, c);
    for (i = 0; i < 1000 && r == DDP_SUCCESS; i++) if (v[i] != (float)(P * (P + 1) / 2)) good = 0;
    return ok(r == DDP_SUCCESS && good, "%s: rank %d's all-reduce is exact (%s %s)", what, rank,
              ddp_strerror(r), r ? ddp_comm_last_error(c) : "");
}

static ddp_result_t init(int rank, ddp_comm_t **c) {
    ddp_comm_desc_t d;
    t_desc(&d, 5000);
    d.log_level = 0;
    d.transport = "shm";
    return ddp_comm_init(c, P, rank, &d);
}

/* lie and truncate: the job works; the cheat changes nothing. */
static int works(int rank, int p, void *arg) {
    const int mode = *(const int *)arg;
    const char *what = mode == TAMPER_LIE ? "lie" : "truncate";
    ddp_comm_t *c = NULL;
    ddp_result_t r;
    (void)p;
    if (rank == FAKE) tamper_mode = mode;
    t_where("init");
    r = init(rank, &c);
    if (!ok(r == DDP_SUCCESS, "%s: rank %d initialises (%s %s)", what, rank, ddp_strerror(r),
            r ? ddp_last_init_error() : ""))
        return 0;
    t_where("all_reduce");
    all_reduce_exact(c, rank, what);
    if (mode == TAMPER_TRUNCATE) {
        if (rank == FAKE) {
            int e = ftruncate(tamper_memfd, 0) == 0 ? 0 : errno;
            ok(tamper_memfd >= 0 && e == EPERM, "truncate: rank %d cannot shrink its own region (%s)",
               rank, e ? strerror(e) : "it could");
        }
        t_where("barrier after the truncation");
        ok(ddp_barrier(c) == DDP_SUCCESS, "truncate: rank %d: barrier", rank);
        t_where("all_reduce after the truncation");
        all_reduce_exact(c, rank, "truncate, after");
    }
    ddp_comm_destroy(c);
    return 0;
}

/* unsealed and small: the victims refuse the region at the handshake. */
static int refused(int rank, int p, void *arg) {
    const int mode = *(const int *)arg;
    const char *what = mode == TAMPER_UNSEALED ? "unsealed" : "small";
    ddp_comm_t *c = NULL;
    ddp_result_t r;
    (void)p;
    if (rank == FAKE) tamper_mode = mode;
    t_where("init");
    r = init(rank, &c);
    if (rank != FAKE)
        ok(r != DDP_SUCCESS && strstr(ddp_last_init_error(), "refused") &&
           strstr(ddp_last_init_error(), mode == TAMPER_UNSEALED ? "seals" : "4096 bytes"),
           "%s: rank %d refuses rank %d's region: %s (%s)", what, rank, FAKE, ddp_strerror(r),
           r ? ddp_last_init_error() : "accepted");
    if (r == DDP_SUCCESS) ddp_comm_destroy(c);
    return 0;
}

int main(void) {
    static const struct { const char *name; int mode; int (*fn)(int, int, void *); } sc[] = {
        {"lie", TAMPER_LIE, works}, {"unsealed", TAMPER_UNSEALED, refused},
        {"small", TAMPER_SMALL, refused}, {"truncate", TAMPER_TRUNCATE, works}};
    size_t i;
    t_init();
    unsetenv("DDP_TRANSPORT");
    for (i = 0; i < sizeof sc / sizeof sc[0]; i++) {
        if (!t_selected(sc[i].name)) continue;
        printf("# --- %s\n", sc[i].name);
        ok(t_run_ranks(P, sc[i].fn, (void *)(uintptr_t)&sc[i].mode, 60) == 0,
           "%s: every rank exited 0 (no crash)", sc[i].name);
    }
    return t_done();
}
