/* SPDX-License-Identifier: MIT (see LICENSE) */
/* transports/ddp_shm.h — libddp's shared-memory transport for ranks on the same host.
 *
 * In the file that defines DDP_IMPLEMENTATION this compiles the transport and registers it, so
 * ddp_comm_init uses it for every peer on this host (priority 20, above TCP's 10; peers on other
 * hosts still go over TCP or RDMA in the same communicator):
 *
 *     #define DDP_IMPLEMENTATION
 *     #include "ddp.h"
 *     #include "transports/ddp_tcp.h"
 *     #include "transports/ddp_shm.h"
 *
 * Needs Linux (memfd_create, futex, SCM_RIGHTS); nothing beyond libc + pthreads. It sees its
 * communicator only through the ddp_transport_ctx_t given to init (transports/ddp_transport.h).
 *
 * MEMORY. Anonymous memfds only, never a name in /dev/shm, so a crash leaves nothing behind: the
 * kernel frees one when its last mapping and descriptor go. When every rank of the communicator
 * is on this host (the collectives' case), the host's lowest rank (the leader) makes ONE host
 * region: a header page, then a slot per rank (its header: progress counter, signatures,
 * wake-up word, its socket name; and the two staging buffers of DDP_SHM_CHUNK bytes the
 * collectives use). Every other rank joins it with one handshake with the leader and maps it:
 * O(n) handshakes and O(n) memory per host. Point-to-point queues (DDP_SHM_CELLS x
 * DDP_SHM_CELL_BYTES each way) live in a region per pair, made by the lower rank when the pair
 * first connects: init connects the ring's and recursive doubling's partners, others connect on
 * first use, so their memory grows with the pairs that talk, not with n^2. Ranks on several
 * hosts (or DDP_SHM_COLL=0) join no region: each rank then gives its peers a header page of its
 * own with the pair's region. No region's size depends on message sizes.
 *
 * HANDSHAKE (version 4; the messages: transports/ddp_shm_handshake.h). Over a Unix socket in the
 * abstract namespace, four fixed-size messages (one layout, a `kind` field, a `purpose`: JOIN
 * or PAIR): HELLO {comm id, from, to, nonce_c} -> CHALLENGE {nonce_s, proof_s} -> ANSWER
 * {proof_c} -> WELCOME, with the proofs of ddp_auth.h over the communicator's key (label
 * "shm-host" or "shm", "<comm id hex> <from>-><to>"). A JOIN's WELCOME carries the host region;
 * a PAIR's ANSWER the pair's region (and outside a host region each side's header page rides
 * with the ANSWER and the WELCOME). A memfd goes only to a side that has proven the key: a
 * same-user process that knows the communicator id but not the key is closed after its ANSWER
 * and never sees a region; the leader takes JOINs only from ranks of this host not yet in, and
 * only during the join. Another user's process is refused at accept (SO_PEERCRED). Even a rank
 * that proved the key is not trusted with anything that could crash the others: pids come from
 * SO_PEERCRED, never from a message (the leader records each member's in its slot); no address
 * is sent (a rank of the same process is found by the memfd's inode); and a region is mapped
 * only if its memfd is sealed against shrinking and growing (and against removing the seals),
 * has the agreed size (fstat) and says it is this communicator's region of the expected kind,
 * so no peer can make another rank's access fault. The table of handshakes in progress holds
 * world size + 64 entries; when full, the oldest connection that has not sent its HELLO is
 * evicted for a newcomer (else the oldest), as in the TCP transport; a full listen backlog makes
 * a connect back off and retry.
 *
 * COLLECTIVES. When every rank of a communicator is on this host, the transport runs the
 * collectives itself (ddp_coll_provider_t) instead of the ring:
 *   all-reduce, small   each rank copies its data to its staging buffer and publishes it; every
 *                       rank reduces all p buffers in rank order (one synchronisation).
 *   all-reduce, large   per chunk: copy in and publish; rank r reduces slice r of the chunk
 *                       from every staging buffer, in rank order, and publishes the result in
 *                       place; every rank copies the p slices out (two synchronisations per
 *                       chunk). Each element is reduced by one rank only, so all ranks get the
 *                       same bits.
 *   reduce-scatter      per chunk: publish the blocks the others own; reduce your own block.
 *   all-gather          per chunk: publish your block; copy everyone's.
 *   broadcast           per chunk: the root publishes; everyone copies.
 * Registered buffers (ddp_comm_mem_alloc; transports/ddp_shm_window.h) are read where they are:
 * each call publishes where its buffers lie with its first step; when every rank's are
 * registered (above DDP_SHM_SMALL_MAX), rank r reduces slice r straight from every rank's input
 * and writes it into every rank's output (no staging, no step between: two steps per call); a
 * registered input is never copied in (the others read it in place), and a call that read a
 * peer's buffer ends with one more step, so nobody returns while its buffer is still read.
 * Staging buffers alternate by chunk, and every rank waits for every other at each step, so a
 * buffer is rewritten only after all readers of its previous contents have moved on. The
 * working set stays in cache: main-memory traffic is about one read of the input and one write
 * of the output, as for memcpy.
 *
 * WAITING. Spin (a pause loop, then sched_yield when there are more ranks than CPUs), then
 * sleep on a futex in the waiter's own header; a rank that publishes progress wakes peers
 * that said they sleep. A dead peer cannot ring: the leader keeps a socket and a pidfd of every
 * member, and its watcher thread (asleep in poll() from the join on) marks a member's slot gone
 * and rings every rank of the host when one goes; each member's watcher (started by its first
 * sleep) watches the leader and its pairs. So a killed rank is DDP_ERR_REMOTE naming it within
 * about a millisecond, as over TCP, with O(n) descriptors for the whole host. Sleeps are still
 * cut into 50 ms slices that check the peers (the fallback when a watcher cannot run: the
 * leader's socket, kill(pid, 0) between members); ddp_comm_abort wakes a sleeping rank at once
 * (the abort entry rings its doorbell). A rank that dies before joining is named by the leader
 * (its published pid is probed when the join stalls) and through it by every member; a leader
 * that dies is named by the members. A wait that lasts, in a collective or in the join, says at
 * WARN which ranks it waits for, after 10 s, 30 s, 60 s, then every 5 minutes, as the engine's
 * algorithms do.
 *
 * ENVIRONMENT
 *   DDP_SHM_COLL=0          point-to-point only (the communicator's ring/recursive doubling run
 *                           over shared memory), for testing and comparison.
 *   DDP_SHM_CHUNK           staging buffer bytes (default 512K; 4K..64M).
 *   DDP_SHM_SMALL_MAX       all-reduce up to this many bytes: every rank reduces everything
 *                           (default 512 at p = 2, 8192 above: measured crossovers).
 *   DDP_SHM_CELL_BYTES, DDP_SHM_CELLS   point-to-point queue geometry (default 64K x 8).
 *   DDP_SHM_SPIN_US         spin before sleeping (default: DDP_SPIN_US if set, else 2000 when
 *                           each rank has a CPU, 50 when oversubscribed). Measured: sleeping
 *                           at once costs 8 B p=2 13-36 us instead of 0.2, 1 MiB 165-200 us
 *                           instead of 100; 20..2000 us are alike; p=4 on 2 CPUs: 0 us 25 us,
 *                           50 or 500 us 4.6-4.8 us.
 *   DDP_SHM_STREAM_MIN      all-reduce outputs of at least this size use streaming stores
 *                           (default 8M; not the zero-copy all-reduce in place on every rank,
 *                           which writes only lines it has just read).
 *   DDP_SHM_ZC_MIN          zero-copy all-reduce from this size (default: every size above
 *                           DDP_SHM_SMALL_MAX); below, registered inputs are read in place
 *                           (out of place) and the output goes through staging.
 *   DDP_SHM_ZC_PIECE        zero-copy all-reduce: bytes reduced, then pushed to every output, at
 *                           a time (default 64K below DDP_SHM_STREAM_MIN and in place,
 *                           DDP_SHM_CHUNK from it; at most DDP_SHM_CHUNK).
 *   DDP_SHM_ZC_PUSH=0       zero-copy all-reduce by pulling (each rank reduces its slice into
 *                           its own output, one step, every rank copies the others' slices out
 *                           of their outputs; DDP_SHM_ZC_CHUNK bytes per step, default 4 x
 *                           DDP_SHM_CHUNK), for comparison: pushing measured faster.
 *   DDP_SHM_WINDOW=0        this rank maps no peer's registered memory: nobody reads it in place.
 */
#if defined(DDP_IMPLEMENTATION) && !defined(DDP_SHM_IMPLEMENTATION)
#define DDP_SHM_IMPLEMENTATION
#endif
#if defined(DDP_SHM_IMPLEMENTATION)
#ifndef DDP_TRANSPORT_IMPLEMENTATION
#define DDP_TRANSPORT_IMPLEMENTATION
#endif
#ifndef DDP_KERNELS_IMPLEMENTATION
#define DDP_KERNELS_IMPLEMENTATION
#endif
#ifndef DDP_SHM_HANDSHAKE_IMPLEMENTATION
#define DDP_SHM_HANDSHAKE_IMPLEMENTATION
#endif
#ifndef DDP_SHM_WINDOW_IMPLEMENTATION
#define DDP_SHM_WINDOW_IMPLEMENTATION
#endif
#endif
#include "ddp_transport.h"
#include "../ddp_kernels.h"
#include "ddp_shm_handshake.h"
#include "ddp_shm_window.h"

#ifndef DDP_SHM_H_INCLUDED
#define DDP_SHM_H_INCLUDED
#ifdef __cplusplus
extern "C" {
#endif
DDP_API const ddp_transport_t *ddp_transport_shm(void);
#ifdef __cplusplus
}
#endif
#endif /* DDP_SHM_H_INCLUDED */

#if defined(DDP_SHM_IMPLEMENTATION) && !defined(DDP_SHM_IMPL_INCLUDED)
#define DDP_SHM_IMPL_INCLUDED
#if !defined(DDP_TRANSPORT_IMPL_INCLUDED) || !defined(DDP_KERNELS_IMPL_INCLUDED) || \
    !defined(DDP_SHM_HANDSHAKE_IMPL_INCLUDED) || !defined(DDP_SHM_WINDOW_IMPL_INCLUDED)
#error "transports/ddp_shm.h's implementation needs ddp_transport.h's, ddp_kernels.h's, ddp_shm_handshake.h's and ddp_shm_window.h's (define DDP_IMPLEMENTATION)"
#endif

#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>

#define _DDP_SHM_HANDSHAKE_MS 10000
#define _DDP_SHM_CONNECT_TRIES 12       /* a full backlog or an eviction: back off 5 ms .. 1 s */
#define _DDP_SHM_POOL 32                /* requests per connection, as TCP */
#define _DDP_SHM_HDR_BYTES 4096         /* a header page: a region's, or one rank's slot's */
#define _DDP_SHM_SLICE_MS 50            /* longest sleep between liveness checks */
#define _DDP_SHM_JOIN_PROBE_MS 500      /* a join that stalls this long: are the missing alive? */

/* What a memfd of this transport holds (its first line says). */
enum { _DDP_SHM_REGION_HOST = 1, _DDP_SHM_REGION_PAIR, _DDP_SHM_REGION_HOME };

/* The first lines of every region: written by its maker before anyone else maps it. */
typedef struct {
    uint32_t magic, version;          /* line 0: set once */
    uint64_t comm_id;
    uint64_t bytes;
    uint32_t kind;                    /* _DDP_SHM_REGION_* */
    uint32_t users;                   /* threads of one process sharing this mapping */
    int32_t owner, slots;             /* the rank that made it; HOST: one slot per rank of the host */
    unsigned char pad0[64 - 40];
    uint32_t joined;                  /* line 1, HOST (the leader writes): ranks in, once all are */
    int32_t failed_rank;              /* the join failed waiting for this rank (-1: it did not) */
    unsigned char pad1[64 - 8];
} _ddp_shm_region_t;

/* One rank's header: its slot's first page in the host region (or, for ranks that only talk
 * point-to-point, a page of its own). Each line has one writer, except the wake-up line. */
typedef struct {
    uint32_t magic, version;          /* line 0: set once (in the host region by the leader) */
    uint64_t comm_id;
    int32_t rank, pid;                /* pid: the leader's SO_PEERCRED, never the rank's word */
    uint64_t region_bytes;
    unsigned char pad0[64 - 32];
    uint64_t phase;                   /* line 1: steps published (owner writes) */
    _ddp_transport_sig_t sig[2];      /* signature of step n in sig[n & 1] */
    unsigned char pad1[64 - 8 - 2 * sizeof(_ddp_transport_sig_t)];
    _ddp_transport_bell_t bell;       /* line 2: futex word (anyone rings it); owner sleeps */
    unsigned char pad2[64 - sizeof(_ddp_transport_bell_t)];
    uint32_t closed;                  /* line 3: the owner closed its connections */
    uint32_t gone;                    /* the host's leader saw the owner's process end */
    unsigned char pad3[64 - 8];
} _ddp_shm_hdr_t;

/* In a slot's header page, well after the header: the owner's socket name, so the pairs of the
 * host connect without asking the store (set: 1 once written). */
#define _DDP_SHM_ADDR_OFF 1024
typedef struct { char name[56]; uint32_t set, pad; } _ddp_shm_slot_addr_t;
typedef char _ddp_shm_slot_addr_fits[sizeof(_ddp_shm_hdr_t) <= _DDP_SHM_ADDR_OFF &&
                                     _DDP_SHM_ADDR_OFF + sizeof(_ddp_shm_slot_addr_t) <= _DDP_SHM_HDR_BYTES ? 1 : -1];
static inline _ddp_shm_slot_addr_t *_ddp_shm_slot_addr(_ddp_shm_hdr_t *h) {
    return (_ddp_shm_slot_addr_t *)(void *)((unsigned char *)h + _DDP_SHM_ADDR_OFF);
}

typedef struct { uint64_t head; unsigned char pad[56]; uint64_t tail; unsigned char pad2[56]; } _ddp_shm_qctl_t;
typedef struct { uint64_t tag, total, off; uint32_t len, pad; unsigned char pad2[32]; } _ddp_shm_cell_t;

/* The regions this process made (threads as ranks), by memfd inode: a rank in the same
 * process uses the maker's mapping, found from the descriptor it received, so both work on the
 * same addresses (ThreadSanitizer then sees the whole protocol) and no address travels. */
typedef struct _ddp_shm_mapped {
    struct _ddp_shm_mapped *next;
    dev_t dev;
    ino_t ino;
    unsigned char *base;
} _ddp_shm_mapped_t;

/* A rank of this host, as the collectives see it. */
typedef struct {
    _ddp_shm_hdr_t *hdr;              /* its slot's header: phase, signatures, doorbell */
    unsigned char *base;              /* its slot (= hdr; staging at stage_off) */
    int rank, pid;                    /* pid: SO_PEERCRED's where fd is ours, else the leader's record */
    int fd, pidfd;                    /* the leader's socket to it (the leader: to every member;
                                       * a member: to the leader only), its pidfd; else -1 */
    uint32_t dead;                    /* this rank's watcher saw it go (atomic) */
} _ddp_shm_member_t;

typedef struct _ddp_shm_conn {
    _ddp_transport_conn_t h;          /* peer, sticky failure, free list: the shared isend/irecv/test */
    struct _ddp_shm *sp;
    int fd, peer_pid;                 /* peer_pid: SO_PEERCRED's, never the peer's word */
    unsigned char *base;              /* the pair's region (both queues), mapped */
    size_t base_bytes;
    int shared_map;                   /* base is the maker's own mapping (same process): counted */
    _ddp_shm_mapped_t *mapped;        /* this rank made the pair's region: its list entry */
    unsigned char *home;              /* the peer's own header page (not in a host region) */
    int home_shared;
    _ddp_shm_hdr_t *hdr;              /* the peer's header: its slot, or in home */
    _ddp_shm_qctl_t *sq, *rq;         /* our queue to it, its queue to us (both in base) */
    unsigned char *scells, *rcells;
    uint64_t shead, rtail;            /* our copies of the counters we write */
    _ddp_transport_queue_t sends, recvs;   /* requests posted, not complete */
    int64_t next_check_us;
    int pidfd;                        /* the peer process (pidfd_open), or -1 */
    uint32_t dead;                    /* the watcher saw the peer go (atomic) */
    _ddp_transport_req_t pool[_DDP_SHM_POOL];
} _ddp_shm_conn_t;

typedef struct { char name[56]; int32_t pid; uint32_t pad; } _ddp_shm_addr_t;

typedef struct {                      /* an accepted socket in its handshake */
    _ddp_transport_pending_t h;       /* stage 0: awaiting the hello; 1: challenged */
    int from, purpose, ready;         /* ready: poll() saw it readable (the join's loop) */
    unsigned char nonce[_DDP_AUTH_NONCE_BYTES], nonce_c[_DDP_AUTH_NONCE_BYTES];
} _ddp_shm_pending_t;

typedef struct {                      /* our side of a connect in progress */
    int fd, stage;                    /* 0 idle (or backing off), 1 hello sent, 2 answer sent, 3 done */
    int tries, have_addr, purpose;    /* _DDP_SHM_PAIR or _DDP_SHM_JOIN */
    int64_t deadline, retry_at;
    _ddp_shm_addr_t addr;
    unsigned char nonce[_DDP_AUTH_NONCE_BYTES];
    int pair_fd;                      /* PAIR: the region we made for the pair, until handed on */
    unsigned char *pair;
    _ddp_shm_mapped_t *pair_mapped;
} _ddp_shm_dial_t;

typedef struct _ddp_shm {
    const ddp_transport_ctx_t *ctx;
    int rank, nranks, nlocal, my_local, set_up;
    int *local_of;                    /* rank -> index among this host's ranks, or -1 */
    int *rank_of;                     /* index among this host's ranks -> rank */
    int leader;                       /* this host's lowest rank: makes the host region */
    int listen_fd;
    size_t chunk, cell_bytes, small_max, stream_min;
    size_t zc_chunk, zc_min;          /* zero-copy all-reduce chunk, and from which size */
    size_t zc_piece;                  /* pushing zero-copy all-reduce: bytes reduced, then pushed (0: by size) */
    int zc_push;                      /* zero-copy all-reduce: 1 push (default), 0 pull */
    int copyin_mode;                  /* -1: measure; 0 ordinary, 1 streaming stores */
    unsigned copyin_tries;
    double copyin_cost[2];            /* ns per byte of copy-in + reduce, by way */
    int ncells, spin_us, oversubscribed;
    size_t q_off, q_stride, pair_bytes;   /* a pair's region: header page, two queues */
    size_t stage_off, slot_stride, host_bytes;   /* the host region: header page, a slot per rank */
    /* The host region (once joined): every rank of the host maps the one region the leader
     * made; a slot per rank holds its header and staging buffers. */
    int joined, joining;              /* joining: the leader takes JOIN hellos */
    int host_fd, host_shared, njoined;
    unsigned char *host;
    _ddp_shm_mapped_t *host_mapped;
    _ddp_shm_member_t *member;        /* by local index */
    int *pub_pid;                     /* the leader, while a join stalls: published pids */
    _ddp_shm_dial_t join_dial;        /* a member: its handshake with the leader */
    /* A rank outside any host region (several hosts, DDP_SHM_COLL=0): its own header page. */
    int home_fd;
    unsigned char *home;
    _ddp_shm_mapped_t *home_mapped;
    unsigned char *mine;              /* this rank's slot (staging at stage_off) */
    _ddp_shm_hdr_t *me;               /* this rank's header (atomic: abort() reads it) */
    _ddp_shm_addr_t addr;
    _ddp_shm_conn_t **conns;          /* by rank: connected, and not yet closed */
    _ddp_shm_conn_t **ready;          /* accepted, until accept() hands it over */
    _ddp_shm_dial_t *dial;            /* by rank: our connect in progress */
    _ddp_shm_pending_t *pending;      /* room for every local peer plus a few strangers */
    int npending, pending_cap;
    uint64_t accepted;                /* connections accepted so far: the pending entries' age */
    int64_t last_pump;
    _ddp_transport_ratelimit_t warn;
    /* collectives */
    uint64_t phase;                   /* steps published by this rank */
    uint64_t nchunk;                  /* staging buffer uses (alternate buffers) */
    int coll_enabled;
    _ddp_shm_member_t **ring;         /* the other ranks of the host, in rank order */
    _ddp_shm_wins_t wins;             /* registered buffers (transports/ddp_shm_window.h) */
    /* The watcher: a thread asleep in poll() on the peers' sockets and pidfds that rings this
     * rank's doorbell when a peer goes; the leader's also tells every rank of the host. */
    pthread_t watch_thread;
    int watch_state;                  /* 0 not started, 1 running, 2 over (or could not start) */
    int watch_stop;                   /* eventfd: stop */
    struct pollfd *watch_fds;         /* stop, then each peer's socket and pidfd */
    uint32_t **watch_dead;            /* the flag each watch_fds entry sets */
    _ddp_shm_member_t **watch_relay;  /* the leader: the member it tells the host about */
    int nwatch;
    uint32_t gone_seen;               /* the watcher saw a peer go (atomic) */
} _ddp_shm_t;

/* ---------------------------------------------------------------- small helpers */
_DDP_PRIVATE size_t _ddp_shm_env_size(const char *name, size_t def, size_t lo, size_t hi) {
    const char *s = getenv(name);
    size_t v = s ? _ddp_parse_size(s) : 0;
    if (!v) return def;
    return v < lo ? lo : v > hi ? hi : v;
}

/* 1 when the socket's other end closed (it exited, crashed, or failed and closed). */
_DDP_PRIVATE int _ddp_shm_hung_up(int fd) {
    struct pollfd pfd;
    if (fd < 0) return 1;
    pfd.fd = fd;
    pfd.events = POLLIN;
    pfd.revents = 0;
    if (poll(&pfd, 1, 0) > 0) {
        char b;
        if (pfd.revents & (POLLHUP | POLLERR)) return 1;
        if (recv(fd, &b, 1, MSG_DONTWAIT | MSG_PEEK) == 0) return 1;
    }
    return 0;
}

/* 1 when a pidfd says its process has ended. */
_DDP_PRIVATE int _ddp_shm_pidfd_ended(int pidfd) {
    struct pollfd pfd;
    if (pidfd < 0) return 0;
    pfd.fd = pidfd;
    pfd.events = POLLIN;
    pfd.revents = 0;
    return poll(&pfd, 1, 0) > 0;
}

/* The process of pid (not ours), opened while it is surely alive (it just finished a handshake
 * with us), so a reused pid cannot be mistaken for it; -1 without pidfd_open (Linux < 5.3). */
_DDP_PRIVATE int _ddp_shm_pidfd_open(int pid) {
    return pid <= 0 || pid == (int)getpid() ? -1 : (int)syscall(434 /* SYS_pidfd_open; close-on-exec */,
                                                               (pid_t)pid, 0u);
}

/* 1 when process pid (another than ours) is no more: kill(pid, 0) says ESRCH (through syscall(),
 * which needs no <signal.h> POSIX declarations). */
_DDP_PRIVATE int _ddp_shm_pid_gone(int pid) {
    return pid > 0 && pid != (int)getpid() && syscall(SYS_kill, (long)pid, 0L) != 0 && errno == ESRCH;
}

/* 1 when the peer closed its end (it exited, crashed, or failed and closed its connections). */
_DDP_PRIVATE int _ddp_shm_peer_gone(_ddp_shm_conn_t *k) {
    if (__atomic_load_n(&k->hdr->closed, __ATOMIC_ACQUIRE)) return 1;
    if (__atomic_load_n(&k->hdr->gone, __ATOMIC_ACQUIRE)) return 1;
    if (__atomic_load_n(&k->dead, __ATOMIC_ACQUIRE)) return 1;
    return _ddp_shm_hung_up(k->fd);
}

/* 1 when a rank of the host region is gone: it closed, the leader saw its process end, our
 * watcher did, our socket to it hung up, or (the fallback, between members) its process is
 * no more. */
_DDP_PRIVATE int _ddp_shm_member_gone(_ddp_shm_member_t *m) {
    if (__atomic_load_n(&m->hdr->closed, __ATOMIC_ACQUIRE)) return 1;
    if (__atomic_load_n(&m->hdr->gone, __ATOMIC_ACQUIRE)) return 1;
    if (__atomic_load_n(&m->dead, __ATOMIC_ACQUIRE)) return 1;
    if (m->fd >= 0) return _ddp_shm_hung_up(m->fd) || _ddp_shm_pidfd_ended(m->pidfd);
    return _ddp_shm_pid_gone(m->pid);
}

/* Drops one user of a mapping. A region shared by ranks of one process (shared: threads as
 * ranks) is mapped once and counted; the last user unmaps it. Any other mapping is ours alone. */
_DDP_PRIVATE void _ddp_shm_unmap(unsigned char *base, size_t bytes, int shared) {
    _ddp_shm_region_t *h = (_ddp_shm_region_t *)(void *)base;
    if (!shared || __atomic_sub_fetch(&h->users, 1u, __ATOMIC_ACQ_REL) == 0) munmap(base, bytes);
}

static pthread_mutex_t _ddp_shm_mapped_mu = PTHREAD_MUTEX_INITIALIZER;
static _ddp_shm_mapped_t *_ddp_shm_mapped_list;

/* The maker's mapping of the region behind st, with one more user, or NULL. */
_DDP_PRIVATE unsigned char *_ddp_shm_mapped_use(const struct stat *st) {
    _ddp_shm_mapped_t *m;
    unsigned char *base = NULL;
    pthread_mutex_lock(&_ddp_shm_mapped_mu);
    for (m = _ddp_shm_mapped_list; m; m = m->next) {
        if (m->dev == st->st_dev && m->ino == st->st_ino) {
            base = m->base;
            __atomic_add_fetch(&((_ddp_shm_region_t *)(void *)base)->users, 1u, __ATOMIC_ACQ_REL);
            break;
        }
    }
    pthread_mutex_unlock(&_ddp_shm_mapped_mu);
    return base;
}

_DDP_PRIVATE void _ddp_shm_mapped_drop(_ddp_shm_mapped_t *e) {
    _ddp_shm_mapped_t **pp;
    pthread_mutex_lock(&_ddp_shm_mapped_mu);
    for (pp = &_ddp_shm_mapped_list; *pp; pp = &(*pp)->next)
        if (*pp == e) { *pp = e->next; break; }
    pthread_mutex_unlock(&_ddp_shm_mapped_mu);
}

/* A new region of `bytes`: a memfd sealed against resizing before any peer gets it (a peer
 * that could shrink it would make every other rank's next access SIGBUS), mapped, its first
 * line filled, and on the process's list for the ranks of this process to find. */
_DDP_PRIVATE ddp_result_t _ddp_shm_region_new(_ddp_shm_t *sp, int kind, size_t bytes, const char *what,
                                              int *memfd, unsigned char **base, _ddp_shm_mapped_t **mapped) {
    const ddp_transport_ctx_t *c = sp->ctx;
    _ddp_shm_region_t *rg;
    struct stat st;
    unsigned char *b;
    int e, fd = (int)syscall(SYS_memfd_create, "ddp-shm", 3u /* MFD_CLOEXEC | MFD_ALLOW_SEALING */);
    *memfd = -1;
    *base = NULL;
    *mapped = NULL;
    if (fd < 0) return ddp_transport_fail(c, DDP_ERR_SYSTEM, "shm: memfd_create (%s): %s", what, strerror(errno));
    if (ftruncate(fd, (off_t)bytes) != 0 || fcntl(fd, F_ADD_SEALS, _DDP_SHM_SEALS) != 0 || fstat(fd, &st) != 0) {
        e = errno;
        close(fd);
        return ddp_transport_fail(c, DDP_ERR_SYSTEM, "shm: sizing and sealing the %zu-byte %s: %s", bytes,
                                  what, strerror(e));
    }
    b = (unsigned char *)mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (b == MAP_FAILED) {
        e = errno;
        close(fd);
        return ddp_transport_fail(c, DDP_ERR_SYSTEM, "shm: mapping the %zu-byte %s: %s", bytes, what, strerror(e));
    }
    *mapped = (_ddp_shm_mapped_t *)ddp_transport_calloc(c, sizeof **mapped);
    if (!*mapped) {
        munmap(b, bytes);
        close(fd);
        return ddp_transport_fail(c, DDP_ERR_OUT_OF_MEMORY, "shm: %s", what);
    }
    rg = (_ddp_shm_region_t *)(void *)b;
    rg->magic = _DDP_SHM_MAGIC;
    rg->version = _DDP_SHM_VERSION;
    rg->comm_id = c->comm_id;
    rg->bytes = bytes;
    rg->kind = (uint32_t)kind;
    rg->users = 1;
    rg->owner = sp->rank;
    rg->failed_rank = -1;
    (*mapped)->dev = st.st_dev;
    (*mapped)->ino = st.st_ino;
    (*mapped)->base = b;
    pthread_mutex_lock(&_ddp_shm_mapped_mu);
    (*mapped)->next = _ddp_shm_mapped_list;
    _ddp_shm_mapped_list = *mapped;
    pthread_mutex_unlock(&_ddp_shm_mapped_mu);
    *memfd = fd;
    *base = b;
    return DDP_SUCCESS;
}

/* Drops this rank's use of a region: off the process's list if this rank made it (mapped), and
 * its mapping (counted where shared by ranks of this process). A fork child neither touches
 * the list (its lock may have been copied held) nor counts users in memory the parent shares. */
_DDP_PRIVATE void _ddp_shm_region_drop(_ddp_shm_t *sp, unsigned char *base, size_t bytes, int shared,
                                       _ddp_shm_mapped_t *mapped) {
    const int forked = ddp_transport_forked(sp->ctx);
    if (mapped && !forked) {
        _ddp_shm_mapped_drop(mapped);
        ddp_transport_free(sp->ctx, mapped);
    }
    if (base) _ddp_shm_unmap(base, bytes, (shared || mapped) && !forked);
}

/* Maps a region rank `peer` sent over socket `sock` (takes memfd). Whatever the peer says, only
 * what cannot change under us: a memfd of the agreed size, sealed against shrinking and growing
 * (and against unsealing), whose first line says it is this communicator's region of `kind`
 * made by `owner`. A rank of this same process: the maker's mapping, counted (*shared). */
_DDP_PRIVATE ddp_result_t _ddp_shm_region_map(_ddp_shm_t *sp, int peer, int sock, int memfd, size_t said,
                                              size_t bytes, int kind, int owner, const char *what,
                                              unsigned char **base, int *shared) {
    const ddp_transport_ctx_t *c = sp->ctx;
    const _ddp_shm_region_t *rg;
    unsigned char *b = NULL;
    int pid = 0, seals;
    struct stat st;
    *base = NULL;
    *shared = 0;
    if (said != bytes) {
        close(memfd);
        return ddp_transport_fail(c, DDP_ERR_MISMATCH, "shm: rank %d has a %zu-byte %s, this rank "
                                  "expects %zu: the ranks use different DDP_SHM_* settings", peer, said,
                                  what, bytes);
    }
    seals = fcntl(memfd, F_GET_SEALS);
    if (fstat(memfd, &st) != 0 || !S_ISREG(st.st_mode) || (uint64_t)st.st_size != (uint64_t)bytes ||
        seals < 0 || (seals & _DDP_SHM_SEALS) != _DDP_SHM_SEALS || !_ddp_shm_peer_cred(sock, &pid)) {
        ddp_result_t r = ddp_transport_fail(c, DDP_ERR_REMOTE, "shm: rank %d sent a %s that could "
            "change size under this rank (%s: %lld bytes, %zu expected; seals %#x, "
            "shrink|grow|seal %#x required): refused", peer, what,
            seals < 0 ? "not a sealable memfd" : "a memfd", (long long)st.st_size, bytes,
            (unsigned)(seals < 0 ? 0 : seals), (unsigned)_DDP_SHM_SEALS);
        close(memfd);
        return r;
    }
    if (pid == (int)getpid() && (b = _ddp_shm_mapped_use(&st)) != NULL) *shared = 1;
    else b = (unsigned char *)mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0);
    close(memfd);
    if (b == MAP_FAILED)
        return ddp_transport_fail(c, DDP_ERR_SYSTEM, "shm: mapping rank %d's %s: %s", peer, what, strerror(errno));
    rg = (const _ddp_shm_region_t *)(const void *)b;
    if (rg->magic != _DDP_SHM_MAGIC || rg->comm_id != c->comm_id || rg->kind != (uint32_t)kind ||
        rg->owner != owner || rg->bytes != (uint64_t)bytes) {
        _ddp_shm_unmap(b, bytes, *shared);
        *shared = 0;
        return ddp_transport_fail(c, DDP_ERR_MISMATCH, "shm: rank %d's %s does not belong to this "
                                  "communicator", peer, what);
    }
    *base = b;
    return DDP_SUCCESS;
}

/* ---------------------------------------------------------------- setup */
_DDP_PRIVATE ddp_result_t _ddp_shm_init(const ddp_transport_ctx_t *c, void **state) {
    _ddp_shm_t *sp;
    struct sockaddr_un sa;
    socklen_t sl;
    uint64_t rnd = _ddp_random64();
    *state = NULL;
    sp = (_ddp_shm_t *)ddp_transport_calloc(c, sizeof *sp);
    if (!sp) return ddp_transport_fail(c, DDP_ERR_OUT_OF_MEMORY, "shm: init");
    sp->ctx = c;
    sp->listen_fd = sp->watch_stop = sp->host_fd = sp->home_fd = sp->join_dial.fd = sp->join_dial.pair_fd = -1;
    sp->rank = c->rank;
    sp->nranks = c->nranks;
    /* An abstract-namespace name (leading NUL): nothing on disk to leave behind; only this
     * network namespace sees it, and the host identity includes the namespace. */
    sp->listen_fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    memset(&sa, 0, sizeof sa);
    sa.sun_family = AF_UNIX;
    snprintf(sp->addr.name, sizeof sp->addr.name, "ddp-shm.%d.%016llx", (int)getpid(),
             (unsigned long long)rnd);
    memcpy(sa.sun_path + 1, sp->addr.name, strlen(sp->addr.name));
    sl = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + strlen(sp->addr.name));
    if (sp->listen_fd < 0 || bind(sp->listen_fd, (struct sockaddr *)&sa, sl) != 0 ||
        listen(sp->listen_fd, _DDP_TRANSPORT_BACKLOG) != 0) {
        ddp_result_t r = ddp_transport_fail(c, DDP_ERR_SYSTEM, "shm: unix socket @%s: %s",
                                            sp->addr.name, strerror(errno));
        if (sp->listen_fd >= 0) close(sp->listen_fd);
        ddp_transport_free(c, sp);
        return r;
    }
    sp->addr.pid = (int32_t)getpid();
    {
        ddp_result_t r = c->publish(c->host, "shm", &sp->addr, sizeof sp->addr);
        if (r != DDP_SUCCESS) {
            close(sp->listen_fd);
            ddp_transport_free(c, sp);
            return r;
        }
    }
    _DDP_TLOG(c, DDP_LOG_INFO, "shm: listening on unix socket @%s", sp->addr.name);
    *state = sp;
    return DDP_SUCCESS;
}

/* After the rendezvous (host ids known): who is on this host, and the regions' geometry.
 * Called by the first reachable(); nothing is made yet: the host region at the join, a pair's
 * region when the pair first talks. */
_DDP_PRIVATE ddp_result_t _ddp_shm_setup(_ddp_shm_t *sp) {
    const ddp_transport_ctx_t *c = sp->ctx;
    const char *mine = c->host_id(c->host, sp->rank);
    int i, n = sp->nranks;
    size_t cells;
    const char *s;
    sp->local_of = (int *)ddp_transport_calloc(c, sizeof(int) * (size_t)n);
    sp->rank_of = (int *)ddp_transport_calloc(c, sizeof(int) * (size_t)n);
    sp->conns = (_ddp_shm_conn_t **)ddp_transport_calloc(c, sizeof(void *) * (size_t)n);
    sp->ready = (_ddp_shm_conn_t **)ddp_transport_calloc(c, sizeof(void *) * (size_t)n);
    sp->dial = (_ddp_shm_dial_t *)ddp_transport_calloc(c, sizeof *sp->dial * (size_t)n);
    sp->pending_cap = n + _DDP_TRANSPORT_STRANGER_SLOTS;
    sp->pending = (_ddp_shm_pending_t *)ddp_transport_calloc(c, sizeof *sp->pending * (size_t)sp->pending_cap);
    if (!sp->local_of || !sp->rank_of || !sp->conns || !sp->ready || !sp->dial || !sp->pending)
        return ddp_transport_fail(c, DDP_ERR_OUT_OF_MEMORY, "shm: setup");
    for (i = 0; i < n; i++) {
        sp->dial[i].fd = sp->dial[i].pair_fd = -1;
        sp->local_of[i] = -1;
        if (!strcmp(c->host_id(c->host, i), mine)) {
            sp->rank_of[sp->nlocal] = i;
            sp->local_of[i] = sp->nlocal++;
        }
    }
    sp->my_local = sp->local_of[sp->rank];
    sp->leader = sp->rank_of[0];
    sp->chunk = _ddp_shm_env_size("DDP_SHM_CHUNK", 512u << 10, 4096, 64u << 20) & ~(size_t)63;
    sp->cell_bytes = _ddp_shm_env_size("DDP_SHM_CELL_BYTES", 64u << 10, 256, 16u << 20) & ~(size_t)63;
    cells = _ddp_shm_env_size("DDP_SHM_CELLS", 8, 2, 1024);
    sp->ncells = (int)cells;
    /* Measured here (ddp-bench --transport shm, float sum): the two-step algorithm wins from 1 KiB at
     * p = 2 (4 KiB: 0.84 vs 1.24 us) and from 16 KiB at p = 4 (14 vs 27 us); below, one step
     * of p-way reduction beats a second synchronisation. */
    sp->small_max = _ddp_shm_env_size("DDP_SHM_SMALL_MAX", sp->nranks == 2 ? 512 : 8192, 1, 64u << 20);
    if (sp->small_max > sp->chunk) sp->small_max = sp->chunk;
    sp->stream_min = _ddp_shm_env_size("DDP_SHM_STREAM_MIN", 8u << 20, 1, (size_t)1 << 40);
    s = getenv("DDP_SHM_COPYIN");
    sp->copyin_mode = s && !strcmp(s, "0") ? 0 : s && !strcmp(s, "1") ? 1 : -1;
    /* With a CPU each, spinning costs nothing the peer needs, and a futex wake-up across CPUs
     * costs ~50 us here: spin long. Oversubscribed, spinning steals the peer's CPU. */
    sp->spin_us = _ddp_transport_spin_us(c, "DDP_SHM_SPIN_US", sp->nlocal, &sp->oversubscribed);
    sp->q_off = _DDP_SHM_HDR_BYTES;
    sp->q_stride = (sizeof(_ddp_shm_qctl_t) + cells * (sizeof(_ddp_shm_cell_t) + sp->cell_bytes) + 4095) & ~(size_t)4095;
    sp->pair_bytes = sp->q_off + 2 * sp->q_stride;
    sp->stage_off = _DDP_SHM_HDR_BYTES;
    sp->slot_stride = _DDP_SHM_HDR_BYTES + 2 * sp->chunk;
    sp->host_bytes = _DDP_SHM_HDR_BYTES + sp->slot_stride * (size_t)sp->nlocal;
    sp->set_up = 1;
    _DDP_TLOG(c, DDP_LOG_INFO, "shm: %d ranks on this host (rank %d leads; each rank a slot of staging "
              "2 x %zu KiB in one host region); a pair that talks: queues 2 x %d x %zu KiB; spin %d us%s",
              sp->nlocal, sp->leader, sp->chunk >> 10, sp->ncells, sp->cell_bytes >> 10, sp->spin_us,
              sp->oversubscribed ? " (more ranks than CPUs: yielding while spinning)" : "");
    return DDP_SUCCESS;
}

_DDP_PRIVATE int _ddp_shm_reachable(void *state, int peer) {
    _ddp_shm_t *sp = (_ddp_shm_t *)state;
    if (!sp->set_up && _ddp_shm_setup(sp) != DDP_SUCCESS) return 0;
    return sp->local_of[peer] >= 0;
}

/* Fills the header of this rank's slot or page (line 0: who it is). */
_DDP_PRIVATE void _ddp_shm_hdr_fill(const _ddp_shm_t *sp, _ddp_shm_hdr_t *h, int rank, int pid, size_t bytes) {
    h->magic = _DDP_SHM_MAGIC;
    h->version = _DDP_SHM_VERSION;
    h->comm_id = sp->ctx->comm_id;
    h->rank = rank;
    h->pid = (int32_t)pid;
    h->region_bytes = bytes;
}

/* Outside a host region, this rank's doorbell and flags live in a page of its own, which it
 * gives each peer it talks to (made with the first connection). */
_DDP_PRIVATE ddp_result_t _ddp_shm_home(_ddp_shm_t *sp) {
    ddp_result_t r;
    if (sp->joined || sp->home) return DDP_SUCCESS;
    r = _ddp_shm_region_new(sp, _DDP_SHM_REGION_HOME, 2 * _DDP_SHM_HDR_BYTES, "header page", &sp->home_fd,
                            &sp->home, &sp->home_mapped);
    if (r != DDP_SUCCESS) return r;
    _ddp_shm_hdr_fill(sp, (_ddp_shm_hdr_t *)(void *)(sp->home + _DDP_SHM_HDR_BYTES), sp->rank, (int)getpid(),
                      2 * _DDP_SHM_HDR_BYTES);
    __atomic_store_n(&sp->me, (_ddp_shm_hdr_t *)(void *)(sp->home + _DDP_SHM_HDR_BYTES), __ATOMIC_RELEASE);
    return DDP_SUCCESS;
}

/* A handshake message from this rank to `to`. */
_DDP_PRIVATE void _ddp_shm_msg(const _ddp_shm_t *sp, _ddp_shm_hello_t *h, int to, int kind, int purpose) {
    memset(h, 0, sizeof *h);
    h->magic = _DDP_SHM_MAGIC;
    h->version = _DDP_SHM_VERSION;
    h->comm_id = sp->ctx->comm_id;
    h->from = sp->rank;
    h->to = to;
    h->kind = kind;
    h->purpose = purpose;
}

/* The proofs of a join are bound to it: a pair's proof between the same ranks is worthless here. */
static inline const char *_ddp_shm_label(int purpose) { return purpose == _DDP_SHM_JOIN ? "shm-host" : "shm"; }

_DDP_PRIVATE ddp_result_t _ddp_shm_progress(_ddp_transport_conn_t *h);
_DDP_PRIVATE ddp_result_t _ddp_shm_post(_ddp_transport_conn_t *h, int is_send, void *buf, size_t len,
                                        uint64_t tag, void *mr, void **req);

/* The connection to peer over a pair's region (taken: base, mapped; fd, the socket; home, the
 * peer's header page outside a host region). The rank that made the region sends on its first
 * queue. */
_DDP_PRIVATE ddp_result_t _ddp_shm_make_conn(_ddp_shm_t *sp, int peer, int fd, unsigned char *base, int shared,
                                             _ddp_shm_mapped_t *mapped, unsigned char *home, int home_shared,
                                             _ddp_shm_conn_t **out) {
    const ddp_transport_ctx_t *c = sp->ctx;
    _ddp_shm_conn_t *k = (_ddp_shm_conn_t *)ddp_transport_calloc(c, sizeof *k);
    unsigned char *q0 = base + sp->q_off, *q1 = q0 + sp->q_stride;
    int pid = 0, made = mapped != NULL;
    *out = NULL;
    if (!k) {
        _ddp_shm_region_drop(sp, base, sp->pair_bytes, shared, mapped);
        if (home) _ddp_shm_region_drop(sp, home, 2 * _DDP_SHM_HDR_BYTES, home_shared, NULL);
        close(fd);
        return ddp_transport_fail(c, DDP_ERR_OUT_OF_MEMORY, "shm: connection");
    }
    _ddp_shm_peer_cred(fd, &pid);
    k->sp = sp;
    k->fd = fd;
    k->peer_pid = pid;
    /* The process itself, not only its socket: a fork child of the peer holding a copy of the
     * socket keeps it open after the peer dies. Threads as ranks share our pid: the socket only. */
    k->pidfd = _ddp_shm_pidfd_open(pid);
    k->base = base;
    k->base_bytes = sp->pair_bytes;
    k->shared_map = shared;
    k->mapped = mapped;
    k->home = home;
    k->home_shared = home_shared;
    k->hdr = home ? (_ddp_shm_hdr_t *)(void *)(home + _DDP_SHM_HDR_BYTES) : sp->member[sp->local_of[peer]].hdr;
    k->sq = (_ddp_shm_qctl_t *)(void *)(made ? q0 : q1);
    k->rq = (_ddp_shm_qctl_t *)(void *)(made ? q1 : q0);
    k->scells = (unsigned char *)(k->sq + 1);
    k->rcells = (unsigned char *)(k->rq + 1);
    k->shead = __atomic_load_n(&k->sq->head, __ATOMIC_RELAXED);
    k->rtail = __atomic_load_n(&k->rq->tail, __ATOMIC_RELAXED);
    _ddp_transport_conn_init(&k->h, c, "shm", peer, k->pool, sizeof k->pool[0], _DDP_SHM_POOL);
    k->h.post = _ddp_shm_post;
    k->h.progress = _ddp_shm_progress;
    *out = k;
    return DDP_SUCCESS;
}

/* An attempt failed in a way a burst explains (the listener's backlog is full, or it evicted
 * us as idle before our hello was read): try again after a backoff, while attempts and time
 * are left (a join: while time is left; a whole host joins at once). */
_DDP_PRIVATE ddp_result_t _ddp_shm_dial_retry(_ddp_shm_t *sp, _ddp_shm_dial_t *d, int peer, const char *what) {
    const ddp_transport_ctx_t *c = sp->ctx;
    if (d->fd >= 0) close(d->fd);
    d->fd = -1;
    d->stage = 0;
    if ((++d->tries >= _DDP_SHM_CONNECT_TRIES && d->purpose != _DDP_SHM_JOIN) ||
        (d->deadline && _ddp_now_us() >= d->deadline))
        return ddp_transport_fail(c, DDP_ERR_REMOTE, "shm: connecting to rank %d at @%s: %s (%d "
                                  "attempts)", peer, d->addr.name, what, d->tries);
    d->retry_at = _ddp_now_us() + _ddp_transport_backoff_us(d->tries < _DDP_SHM_CONNECT_TRIES ? d->tries : _DDP_SHM_CONNECT_TRIES);
    return DDP_SUCCESS;
}

/* Stage 0 -> 1: connect and say hello (no memfd yet: the acceptor has proven nothing). */
_DDP_PRIVATE ddp_result_t _ddp_shm_dial_hello(_ddp_shm_t *sp, _ddp_shm_dial_t *d, int peer) {
    const ddp_transport_ctx_t *c = sp->ctx;
    struct sockaddr_un sa;
    _ddp_shm_hello_t h;
    int e;
    if (!_ddp_transport_auth_ready(c))
        return ddp_transport_fail(c, DDP_ERR_INTERNAL, "shm: no communicator key to prove to rank %d", peer);
    memset(&sa, 0, sizeof sa);
    sa.sun_family = AF_UNIX;
    memcpy(sa.sun_path + 1, d->addr.name, strlen(d->addr.name));
    d->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (d->fd < 0) return ddp_transport_fail(c, DDP_ERR_SYSTEM, "shm: socket: %s", strerror(errno));
    /* Non-blocking: a full backlog is EAGAIN (then we back off), never a wait in connect(). */
    if (connect(d->fd, (struct sockaddr *)&sa,
                (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + strlen(d->addr.name))) != 0) {
        e = errno;
        if (e == EAGAIN || e == ECONNREFUSED || e == EINTR) return _ddp_shm_dial_retry(sp, d, peer, strerror(e));
        close(d->fd);
        d->fd = -1;
        return ddp_transport_fail(c, DDP_ERR_REMOTE, "shm: connecting to rank %d at @%s: %s", peer,
                                  d->addr.name, strerror(e));
    }
    if (_ddp_auth_nonce(d->nonce) != 0)
        return ddp_transport_fail(c, DDP_ERR_SYSTEM, "shm: no random bytes for the handshake with rank %d", peer);
    _ddp_shm_msg(sp, &h, peer, _DDP_SHM_HELLO, d->purpose);
    memcpy(h.nonce, d->nonce, sizeof h.nonce);
    if ((e = _ddp_shm_send_hello(d->fd, &h, -1)) != 0) return _ddp_shm_dial_retry(sp, d, peer, strerror(e));
    d->stage = 1;
    _DDP_TLOG(c, DDP_LOG_TRACE, "shm: sent %s hello to rank %d (@%s)", d->purpose == _DDP_SHM_JOIN ? "join" : "pair",
              peer, d->addr.name);
    return DDP_SUCCESS;
}

/* A message that should have come from `peer` to us, of `kind`. */
_DDP_PRIVATE int _ddp_shm_msg_fits(const _ddp_shm_t *sp, const _ddp_shm_hello_t *h, int peer, int kind) {
    return h->kind == kind && h->from == peer && h->to == sp->rank && h->comm_id == sp->ctx->comm_id;
}

/* Stage 1 -> 2: the acceptor's challenge. It must prove the key before we send ours, and our
 * memfds go only to a rank that proved it: a pair's region we make now (and our header page,
 * outside a host region); a join sends none (it receives the host region). */
_DDP_PRIVATE ddp_result_t _ddp_shm_dial_answer(_ddp_shm_t *sp, _ddp_shm_dial_t *d, int peer) {
    const ddp_transport_ctx_t *c = sp->ctx;
    _ddp_shm_hello_t h, a;
    int fds[2], e, got = _ddp_shm_recv_fds(d->fd, &h, fds);
    const int join = d->purpose == _DDP_SHM_JOIN;
    ddp_result_t r;
    if (got == 0) {
        if (d->deadline && _ddp_now_us() >= d->deadline)
            return ddp_transport_fail(c, DDP_ERR_TIMEOUT, "shm: rank %d never answered our hello", peer);
        return DDP_SUCCESS;
    }
    if (fds[0] >= 0) close(fds[0]);   /* a challenge carries none */
    if (fds[1] >= 0) close(fds[1]);
    if (got == -2) return _ddp_shm_dial_retry(sp, d, peer, "closed before its challenge");
    if (got < 0 || fds[0] >= 0 || !_ddp_shm_msg_fits(sp, &h, peer, _DDP_SHM_CHALLENGE))
        return ddp_transport_fail(c, DDP_ERR_REMOTE, "shm: rank %d broke the handshake", peer);
    if (h.status != 0)
        return ddp_transport_fail(c, DDP_ERR_REMOTE, "shm: rank %d refused our %s (it is not on "
                                  "this host, belongs to another job, or %s)", peer, join ? "join" : "hello",
                                  join ? "does not lead this host's region now" : "was connected already");
    if (!_ddp_transport_auth_verify(c, _ddp_shm_label(d->purpose), sp->rank, peer, _DDP_AUTH_SERVER, h.nonce,
                                    d->nonce, h.proof))
        return ddp_transport_fail(c, DDP_ERR_AUTH, "shm: whoever listens at @%s, where rank %d "
                                  "published its address, does not know this communicator's key: "
                                  "it is not rank %d of this job; refused", d->addr.name, peer, peer);
    fds[0] = fds[1] = -1;
    if (!join) {
        if (!d->pair &&
            (r = _ddp_shm_region_new(sp, _DDP_SHM_REGION_PAIR, sp->pair_bytes, "pair's region", &d->pair_fd,
                                     &d->pair, &d->pair_mapped)) != DDP_SUCCESS)
            return r;
        if ((r = _ddp_shm_home(sp)) != DDP_SUCCESS) return r;
        fds[0] = d->pair_fd;
        fds[1] = sp->joined ? -1 : sp->home_fd;
    }
    _ddp_shm_msg(sp, &a, peer, _DDP_SHM_ANSWER, d->purpose);
    a.region_bytes = join ? 0 : sp->pair_bytes;
    _ddp_transport_auth_proof(c, _ddp_shm_label(d->purpose), sp->rank, peer, _DDP_AUTH_CLIENT, h.nonce, d->nonce,
                              a.proof);
    e = _ddp_shm_send_fds(d->fd, &a, fds, join ? 0 : sp->joined ? 1 : 2);
    _ddp_auth_wipe(&a, sizeof a);
    if (e) return ddp_transport_fail(c, DDP_ERR_REMOTE, "shm: rank %d went away during the handshake: %s",
                                     peer, strerror(e));
    d->stage = 2;
    return DDP_SUCCESS;
}

/* This rank's socket name in its slot: the pairs of the host connect without asking the store
 * (a rank that wrote a wrong one only fails its own handshakes: both sides prove the key). */
_DDP_PRIVATE void _ddp_shm_say_addr(_ddp_shm_t *sp) {
    _ddp_shm_slot_addr_t *a = _ddp_shm_slot_addr(sp->me);
    memcpy(a->name, sp->addr.name, sizeof a->name);
    __atomic_store_n(&a->set, 1u, __ATOMIC_RELEASE);
}

/* The member's half of a join: the leader's WELCOME brought the host region. */
_DDP_PRIVATE ddp_result_t _ddp_shm_joined(_ddp_shm_t *sp, int fd, int memfd, const _ddp_shm_hello_t *h) {
    ddp_result_t r = _ddp_shm_region_map(sp, sp->leader, fd, memfd, (size_t)h->region_bytes, sp->host_bytes,
                                         _DDP_SHM_REGION_HOST, sp->leader, "host region", &sp->host, &sp->host_shared);
    _ddp_shm_member_t *L = &sp->member[0];
    if (r != DDP_SUCCESS) {
        close(fd);
        return r;
    }
    L->fd = fd;
    _ddp_shm_peer_cred(fd, &L->pid);
    L->pidfd = _ddp_shm_pidfd_open(L->pid);
    sp->mine = sp->host + _DDP_SHM_HDR_BYTES + sp->slot_stride * (size_t)sp->my_local;
    __atomic_store_n(&sp->me, (_ddp_shm_hdr_t *)(void *)sp->mine, __ATOMIC_RELEASE);
    _ddp_shm_say_addr(sp);
    return DDP_SUCCESS;
}

/* Stage 2 -> 3: the acceptor verified us: a pair's acceptor answers (with its header page
 * outside a host region), the leader sends the host region. */
_DDP_PRIVATE ddp_result_t _ddp_shm_dial_welcome(_ddp_shm_t *sp, _ddp_shm_dial_t *d, int peer, void **conn) {
    const ddp_transport_ctx_t *c = sp->ctx;
    _ddp_shm_hello_t h;
    _ddp_shm_conn_t *k;
    unsigned char *home = NULL;
    int home_shared = 0;
    ddp_result_t r;
    int fds[2], fl, fd = d->fd, got = _ddp_shm_recv_fds(d->fd, &h, fds);
    const int join = d->purpose == _DDP_SHM_JOIN, want = join || !sp->joined;
    if (got == 0) {
        if (d->deadline && _ddp_now_us() >= d->deadline)
            return ddp_transport_fail(c, DDP_ERR_TIMEOUT, "shm: rank %d never finished our handshake", peer);
        return DDP_SUCCESS;
    }
    d->fd = -1;
    if (got < 0 || (fds[0] >= 0) != want || fds[1] >= 0 || h.status != 0 ||
        !_ddp_shm_msg_fits(sp, &h, peer, _DDP_SHM_WELCOME)) {
        if (fds[0] >= 0) close(fds[0]);
        if (fds[1] >= 0) close(fds[1]);
        close(fd);
        if (got > 0 && !join && (fds[0] >= 0) != want)
            return ddp_transport_fail(c, DDP_ERR_MISMATCH, "shm: rank %d %s a host region and this rank %s: "
                                      "the ranks use different DDP_SHM_COLL or DDP_ALGO settings", peer,
                                      want ? "is in" : "is not in", want ? "is not" : "is");
        return ddp_transport_fail(c, DDP_ERR_REMOTE, "shm: rank %d refused or broke the handshake "
                                  "after our proof", peer);
    }
    fl = fcntl(fd, F_GETFL);
    if (fl >= 0) fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
    d->stage = 3;
    if (join) return _ddp_shm_joined(sp, fd, fds[0], &h);
    if (fds[0] >= 0 && (r = _ddp_shm_region_map(sp, peer, fd, fds[0], (size_t)h.region_bytes,
                                                2 * _DDP_SHM_HDR_BYTES, _DDP_SHM_REGION_HOME, peer,
                                                "header page", &home, &home_shared)) != DDP_SUCCESS) {
        close(fd);
        return r;
    }
    /* The region is the connection's now (our list entry and mapping with it). */
    close(d->pair_fd);
    r = _ddp_shm_make_conn(sp, peer, fd, d->pair, 1, d->pair_mapped, home, home_shared, &k);
    d->pair_fd = -1;
    d->pair = NULL;
    d->pair_mapped = NULL;
    if (r != DDP_SUCCESS) return r;
    sp->conns[peer] = k;
    *conn = k;
    return DDP_SUCCESS;
}

/* Advances our side of a handshake with peer (its address looked up first). */
_DDP_PRIVATE ddp_result_t _ddp_shm_dial_step(_ddp_shm_t *sp, _ddp_shm_dial_t *d, int peer, void **conn) {
    const ddp_transport_ctx_t *c = sp->ctx;
    ddp_result_t r;
    /* Gone before our hello: it can never answer. Once the handshake is under way its socket
     * says (a peer that sent its WELCOME and then left still completes the connection, and the
     * next call, not init, learns why it left). */
    if (d->stage == 0 && sp->joined && d->purpose == _DDP_SHM_PAIR && sp->local_of[peer] >= 0 &&
        _ddp_shm_member_gone(&sp->member[sp->local_of[peer]])) {
        _ddp_transport_blame(c, peer);
        return ddp_transport_fail(c, DDP_ERR_REMOTE, "shm: rank %d (pid %d) is gone: it left this host's "
                                  "shared-memory region (it exited, crashed or failed) before this rank could "
                                  "connect to it (phase connect)", peer, sp->member[sp->local_of[peer]].pid);
    }
    if (!d->have_addr && sp->joined && d->purpose == _DDP_SHM_PAIR && sp->local_of[peer] >= 0) {
        const _ddp_shm_member_t *m = &sp->member[sp->local_of[peer]];
        _ddp_shm_slot_addr_t *a = _ddp_shm_slot_addr(m->hdr);
        if (__atomic_load_n(&a->set, __ATOMIC_ACQUIRE)) {   /* from its slot */
            memcpy(d->addr.name, a->name, sizeof d->addr.name);
            d->addr.pid = m->pid;
            d->addr.name[sizeof d->addr.name - 1] = 0;
            d->deadline = _ddp_deadline(c->timeout_ms);
            d->have_addr = 1;
        }
    }
    if (!d->have_addr) {
        size_t len = 0;
        r = c->lookup(c->host, "shm", peer, &d->addr, sizeof d->addr, &len);
        if (r != DDP_SUCCESS) return r;
        if (len != sizeof d->addr) return ddp_transport_fail(c, DDP_ERR_MISMATCH, "shm: rank %d published "
                                                             "a malformed address", peer);
        d->addr.name[sizeof d->addr.name - 1] = 0;
        d->deadline = _ddp_deadline(c->timeout_ms);
        d->have_addr = 1;
    }
    if (d->stage == 0) {
        if (d->retry_at && _ddp_now_us() < d->retry_at) return DDP_SUCCESS;
        if ((r = _ddp_shm_dial_hello(sp, d, peer)) != DDP_SUCCESS) return r;
    }
    if (d->stage == 1 && (r = _ddp_shm_dial_answer(sp, d, peer)) != DDP_SUCCESS) return r;
    if (d->stage == 2) return _ddp_shm_dial_welcome(sp, d, peer, conn);
    return DDP_SUCCESS;
}

_DDP_PRIVATE ddp_result_t _ddp_shm_connect(void *state, int peer, void **conn) {
    _ddp_shm_t *sp = (_ddp_shm_t *)state;
    *conn = NULL;
    return _ddp_shm_dial_step(sp, &sp->dial[peer], peer, conn);
}

/* The leader's half of a join: after the member's proof, the host region, and the member's
 * slot filled from what the kernel says (SO_PEERCRED), never from the member's word. */
_DDP_PRIVATE int _ddp_shm_admit(_ddp_shm_t *sp, _ddp_shm_pending_t *pd, const char **why) {
    _ddp_shm_hello_t out;
    _ddp_shm_member_t *m = &sp->member[sp->local_of[pd->from]];
    int fl, pid = 0;
    _ddp_shm_msg(sp, &out, pd->from, _DDP_SHM_WELCOME, _DDP_SHM_JOIN);
    out.region_bytes = sp->host_bytes;
    if (!_ddp_shm_peer_cred(pd->h.fd, &pid) || _ddp_shm_send_hello(pd->h.fd, &out, sp->host_fd) != 0) {
        *why = "went away during the handshake";
        return 1;
    }
    fl = fcntl(pd->h.fd, F_GETFL);
    if (fl >= 0) fcntl(pd->h.fd, F_SETFL, fl & ~O_NONBLOCK);
    m->fd = pd->h.fd;
    m->pid = pid;
    m->pidfd = _ddp_shm_pidfd_open(pid);
    _ddp_shm_hdr_fill(sp, m->hdr, pd->from, pid, sp->host_bytes);
    pd->h.fd = -1;
    sp->njoined++;
    return 1;
}

/* Advances one accepted connection's handshake: 0 to wait, 1 when it is over (its peer is in
 * ready[] or joined, or *why says why to drop it), or a failure to return (mapping the peer's
 * region). */
_DDP_PRIVATE int _ddp_shm_pending_step(_ddp_shm_t *sp, _ddp_shm_pending_t *pd, const char **why, ddp_result_t *err) {
    const ddp_transport_ctx_t *c = sp->ctx;
    _ddp_shm_hello_t h, out;
    _ddp_shm_conn_t *k;
    unsigned char *pair = NULL, *home = NULL;
    int fds[2], got, fl, e, pair_shared = 0, home_shared = 0;
    *why = NULL;
    *err = DDP_SUCCESS;
    got = _ddp_shm_recv_fds(pd->h.fd, &h, fds);
    if (got == 0) {
        if (_ddp_now_us() < pd->h.deadline) return 0;
        *why = pd->h.stage == 0 ? "sent no hello in time" : "never proved it knows the communicator's key";
        return 1;
    }
    if (got == -2) { *why = "closed during the handshake"; return 1; }
    if (got < 0) { *why = "is not a libddp shm peer (malformed message)"; return 1; }
    if (pd->h.stage == 0) {
        const int join = h.purpose == _DDP_SHM_JOIN;
        if (fds[0] >= 0) { close(fds[0]); if (fds[1] >= 0) close(fds[1]); *why = "sent a descriptor with its hello"; return 1; }
        if (h.kind != _DDP_SHM_HELLO) { *why = "is not a libddp shm peer (no hello)"; return 1; }
        /* A pair: the lower rank connects, once. A join: a rank of this host, to its leader
         * while the leader takes joins, once. */
        if (h.comm_id != c->comm_id || h.to != sp->rank || h.from < 0 || h.from >= sp->nranks ||
            sp->local_of[h.from] < 0 || (h.purpose != _DDP_SHM_PAIR && !join) ||
            (!join && (h.from >= sp->rank || sp->ready[h.from] || sp->conns[h.from])) ||
            (join && (!sp->joining || h.from == sp->rank || sp->member[sp->local_of[h.from]].fd >= 0))) {
            _ddp_shm_msg(sp, &out, h.from, _DDP_SHM_CHALLENGE, h.purpose);
            out.status = 1;   /* a rank of another job learns at once, nothing more */
            _ddp_shm_send_hello(pd->h.fd, &out, -1);
            *why = "names another communicator or ranks that do not fit this one";
            return 1;
        }
        if (!_ddp_shm_same_user(pd->h.fd)) {
            *why = "belongs to another user";
            return 1;
        }
        if (!_ddp_transport_auth_ready(c)) { *why = "came before this rank had the communicator's key"; return 1; }
        if (_ddp_auth_nonce(pd->nonce) != 0) { *why = "could not be challenged (no random bytes)"; return 1; }
        pd->from = h.from;
        pd->purpose = h.purpose;
        memcpy(pd->nonce_c, h.nonce, sizeof pd->nonce_c);
        _ddp_shm_msg(sp, &out, h.from, _DDP_SHM_CHALLENGE, h.purpose);
        memcpy(out.nonce, pd->nonce, sizeof out.nonce);
        _ddp_transport_auth_proof(c, _ddp_shm_label(pd->purpose), h.from, sp->rank, _DDP_AUTH_SERVER, pd->nonce,
                                  pd->nonce_c, out.proof);
        e = _ddp_shm_send_hello(pd->h.fd, &out, -1);
        _ddp_auth_wipe(&out, sizeof out);
        if (e) { *why = "went away before its challenge"; return 1; }
        pd->h.stage = 1;
        pd->h.deadline = _ddp_transport_proof_deadline(c, _DDP_SHM_HANDSHAKE_MS);
        return 0;
    }
    /* Stage 1: the answer must carry a proof of the key; a pair's, the region the connector
     * made for the pair (and its header page outside a host region). */
    if (h.kind != _DDP_SHM_ANSWER || h.from != pd->from || h.to != sp->rank || h.comm_id != c->comm_id ||
        !_ddp_transport_auth_verify(c, _ddp_shm_label(pd->purpose), pd->from, sp->rank, _DDP_AUTH_CLIENT,
                                    pd->nonce, pd->nonce_c, h.proof) ||
        (pd->purpose == _DDP_SHM_PAIR && (fds[0] < 0 || sp->ready[pd->from] || sp->conns[pd->from])) ||
        (pd->purpose == _DDP_SHM_JOIN && (!sp->joining || fds[0] >= 0))) {
        if (fds[0] >= 0) close(fds[0]);
        if (fds[1] >= 0) close(fds[1]);
        *why = "failed to prove it knows the communicator's key (not a rank of this job, or a "
               "replayed handshake)";
        return 1;
    }
    if (pd->purpose == _DDP_SHM_JOIN) return _ddp_shm_admit(sp, pd, why);
    if ((fds[1] >= 0) != !sp->joined) {
        if (fds[0] >= 0) close(fds[0]);
        if (fds[1] >= 0) close(fds[1]);
        *err = ddp_transport_fail(c, DDP_ERR_MISMATCH, "shm: rank %d %s a host region and this rank %s: the "
                                  "ranks use different DDP_SHM_COLL or DDP_ALGO settings", pd->from,
                                  sp->joined ? "is not in" : "is in", sp->joined ? "is" : "is not");
        return 1;
    }
    *err = _ddp_shm_region_map(sp, pd->from, pd->h.fd, fds[0], (size_t)h.region_bytes, sp->pair_bytes,
                               _DDP_SHM_REGION_PAIR, pd->from, "pair's region", &pair, &pair_shared);
    if (*err == DDP_SUCCESS && fds[1] >= 0)
        *err = _ddp_shm_region_map(sp, pd->from, pd->h.fd, fds[1], 2 * _DDP_SHM_HDR_BYTES, 2 * _DDP_SHM_HDR_BYTES,
                                   _DDP_SHM_REGION_HOME, pd->from, "header page", &home, &home_shared);
    else if (fds[1] >= 0)
        close(fds[1]);
    if (*err == DDP_SUCCESS) *err = _ddp_shm_home(sp);
    _ddp_shm_msg(sp, &out, pd->from, _DDP_SHM_WELCOME, _DDP_SHM_PAIR);
    out.region_bytes = 2 * _DDP_SHM_HDR_BYTES;
    if (*err != DDP_SUCCESS || _ddp_shm_send_hello(pd->h.fd, &out, sp->joined ? -1 : sp->home_fd) != 0) {
        if (pair) _ddp_shm_region_drop(sp, pair, sp->pair_bytes, pair_shared, NULL);
        if (home) _ddp_shm_region_drop(sp, home, 2 * _DDP_SHM_HDR_BYTES, home_shared, NULL);
        if (*err == DDP_SUCCESS) *why = "went away during the handshake";
        return 1;
    }
    fl = fcntl(pd->h.fd, F_GETFL);
    if (fl >= 0) fcntl(pd->h.fd, F_SETFL, fl & ~O_NONBLOCK);
    *err = _ddp_shm_make_conn(sp, pd->from, pd->h.fd, pair, pair_shared, NULL, home, home_shared, &k);
    pd->h.fd = -1;
    if (*err != DDP_SUCCESS) return 1;
    sp->ready[pd->from] = k;
    return 1;
}

/* Entry i is over: dropped (why) or handed on; its slot goes to the last entry. */
_DDP_PRIVATE void _ddp_shm_pending_end(_ddp_shm_t *sp, int i, const char *why) {
    _ddp_shm_pending_t *pd = &sp->pending[i];
    if (why)
        _ddp_transport_warn_limited(sp->ctx, &sp->warn, "shm: rank %d dropped a connection: it %s",
                                    sp->rank, why);
    if (pd->h.fd >= 0) close(pd->h.fd);
    sp->pending[i] = sp->pending[--sp->npending];
}

/* Makes room: evicts the oldest connection that has not sent its hello (after one last look),
 * else the oldest. */
_DDP_PRIVATE ddp_result_t _ddp_shm_evict(_ddp_shm_t *sp) {
    int tries;
    for (tries = 0; tries <= sp->pending_cap && sp->npending > 0; tries++) {
        int v = _ddp_transport_pending_victim(sp->pending, sizeof sp->pending[0], sp->npending);
        _ddp_shm_pending_t *pd = &sp->pending[v];
        if (pd->h.stage == 0) {
            const char *why;
            ddp_result_t err;
            int rc = _ddp_shm_pending_step(sp, pd, &why, &err);
            if (rc > 0) { _ddp_shm_pending_end(sp, v, why); return err; }
            if (pd->h.stage > 0) continue;   /* it spoke: look for another */
        }
        _ddp_transport_warn_limited(sp->ctx, &sp->warn, "shm: rank %d evicted a connection that %s "
                                    "(%d handshakes pending, the most it keeps)", sp->rank,
                                    pd->h.stage == 0 ? "sent no hello yet" : "was slow to prove its key",
                                    sp->npending);
        close(pd->h.fd);
        pd->h.fd = -1;
        sp->pending[v] = sp->pending[--sp->npending];
        return DDP_SUCCESS;
    }
    return DDP_SUCCESS;
}

/* Accepts everyone waiting on the listener and advances the handshakes: every one, or (only_ready)
 * those poll() saw readable, the new ones, and those past their deadline. */
_DDP_PRIVATE ddp_result_t _ddp_shm_pump(_ddp_shm_t *sp, int only_ready) {
    const ddp_transport_ctx_t *c = sp->ctx;
    int i, budget = sp->pending_cap + _DDP_TRANSPORT_BACKLOG;   /* a steady flood cannot pin us here */
    const int64_t now = _ddp_now_us();
    ddp_result_t r;
    if (!sp->pending) return DDP_SUCCESS;
    while (budget-- > 0) {
        _ddp_shm_pending_t *pd;
        int fd = _ddp_accept4(sp->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED) continue;
            if ((errno == EMFILE || errno == ENFILE) && sp->npending > 0) {
                if ((r = _ddp_shm_evict(sp)) != DDP_SUCCESS) return r;
                continue;
            }
            break;
        }
        /* Another user's process is refused before it can hold a slot. */
        if (!_ddp_shm_same_user(fd)) {
            _ddp_transport_warn_limited(c, &sp->warn, "shm: rank %d refused a connection from another "
                                        "user's process", sp->rank);
            close(fd);
            continue;
        }
        if (sp->npending == sp->pending_cap && (r = _ddp_shm_evict(sp)) != DDP_SUCCESS) {
            close(fd);
            return r;
        }
        pd = &sp->pending[sp->npending++];
        memset(pd, 0, sizeof *pd);
        pd->h.fd = fd;
        pd->h.seq = ++sp->accepted;
        pd->h.deadline = _ddp_now_us() + (int64_t)_DDP_SHM_HANDSHAKE_MS * 1000;
        pd->ready = 1;
    }
    for (i = 0; i < sp->npending; i++) {
        const char *why;
        ddp_result_t err;
        _ddp_shm_pending_t *pd = &sp->pending[i];
        int rc;
        if (only_ready && !pd->ready && now < pd->h.deadline) continue;
        pd->ready = 0;
        rc = _ddp_shm_pending_step(sp, pd, &why, &err);
        if (rc > 0) {
            _ddp_shm_pending_end(sp, i--, why);
            if (err != DDP_SUCCESS) return err;
        }
    }
    return DDP_SUCCESS;
}

_DDP_PRIVATE ddp_result_t _ddp_shm_accept(void *state, int peer, void **conn) {
    _ddp_shm_t *sp = (_ddp_shm_t *)state;
    ddp_result_t r;
    *conn = NULL;
    if (!sp->ready[peer] && _ddp_transport_pump_due(&sp->last_pump) &&
        (r = _ddp_shm_pump(sp, 0)) != DDP_SUCCESS) return r;
    if (sp->ready[peer]) {
        sp->conns[peer] = sp->ready[peer];
        sp->ready[peer] = NULL;
        *conn = sp->conns[peer];
    }
    return DDP_SUCCESS;
}

/* ---------------------------------------------------------------- the host region
 * One region per host: the host's lowest rank (the leader) makes it, every other rank of the
 * host joins it with one handshake with the leader (O(n) handshakes, O(n) memory); the pairs
 * connect when they first talk. */
_DDP_PRIVATE void _ddp_shm_watch_start(_ddp_shm_t *sp);

/* Every rank of the host as the collectives see it; pids: also the pids the leader recorded
 * (once it said the join is complete). */
_DDP_PRIVATE void _ddp_shm_members_fill(_ddp_shm_t *sp, int pids) {
    int l;
    for (l = 0; l < sp->nlocal; l++) {
        _ddp_shm_member_t *m = &sp->member[l];
        m->base = sp->host + _DDP_SHM_HDR_BYTES + sp->slot_stride * (size_t)l;
        m->hdr = (_ddp_shm_hdr_t *)(void *)m->base;
        m->rank = sp->rank_of[l];
        if (pids && m->fd < 0 && l != sp->my_local) m->pid = m->hdr->pid;
    }
}

/* The leader gives up the join (while waiting for `missing`): every member learns it at once
 * (the region says whom it waited for, and a byte on each socket wakes them). Returns r. */
_DDP_PRIVATE ddp_result_t _ddp_shm_join_abandon(_ddp_shm_t *sp, int missing, ddp_result_t r) {
    _ddp_shm_region_t *rg = (_ddp_shm_region_t *)(void *)sp->host;
    int l;
    sp->joining = 0;
    __atomic_store_n(&rg->failed_rank, missing, __ATOMIC_RELEASE);
    for (l = 0; l < sp->nlocal; l++)
        if (sp->member[l].fd >= 0 && send(sp->member[l].fd, "F", 1, MSG_NOSIGNAL | MSG_DONTWAIT) < 0) {}
    return r;
}

/* The leader, while the join stalls: a rank that published its address (its pid with it) and
 * whose process is no more will never join: say so now rather than at the timeout. */
_DDP_PRIVATE int _ddp_shm_join_dead(_ddp_shm_t *sp, int *pid_out) {
    const ddp_transport_ctx_t *c = sp->ctx;
    int l;
    if (!sp->pub_pid && !(sp->pub_pid = (int *)ddp_transport_calloc(c, sizeof(int) * (size_t)sp->nlocal))) return -1;
    for (l = 0; l < sp->nlocal; l++) {
        int r = sp->rank_of[l];
        if (l == sp->my_local || sp->member[l].fd >= 0) continue;
        if (!sp->pub_pid[l] && c->published(c->host, "shm", r)) {
            _ddp_shm_addr_t a;
            size_t len = 0;
            if (c->lookup(c->host, "shm", r, &a, sizeof a, &len) == DDP_SUCCESS && len == sizeof a)
                sp->pub_pid[l] = a.pid > 0 ? (int)a.pid : -1;
        }
        if (_ddp_shm_pid_gone(sp->pub_pid[l])) {
            *pid_out = sp->pub_pid[l];
            return r;
        }
    }
    return -1;
}

/* The first rank of the host not joined yet. */
_DDP_PRIVATE int _ddp_shm_join_missing(const _ddp_shm_t *sp) {
    int l;
    for (l = 0; l < sp->nlocal; l++)
        if (l != sp->my_local && sp->member[l].fd < 0) return sp->rank_of[l];
    return -1;
}

/* A rank that failed its init elsewhere posted why on the communicator's failure board: a join
 * that waits for it stops now, saying so, rather than at the timeout. DDP_SUCCESS: none yet. */
_DDP_PRIVATE ddp_result_t _ddp_shm_join_board(_ddp_shm_t *sp) {
    const ddp_transport_ctx_t *c = sp->ctx;
    char msg[400];
    if (!c->posted || !c->posted(c->host, "abort", msg, sizeof msg)) return DDP_SUCCESS;
    return ddp_transport_fail(c, DDP_ERR_REMOTE, "shm: init (phase join): stopped waiting for the ranks of "
                              "this host: another rank failed: %s", msg);
}

/* The leader: make the region, admit every rank of the host (bounded by the timeout), then
 * tell them all it is complete. */
/* A join that lasts says what it waits for, at WARN, after 10 s, 30 s, 60 s, then every 5
 * minutes without progress (as the collectives' waits do): `who` is what is missing. */
_DDP_PRIVATE void _ddp_shm_join_note(_ddp_shm_t *sp, int64_t since_us, int64_t *note_at_ms, const char *who) {
    const int64_t ms = (_ddp_now_us() - since_us) / 1000;
    if (ms < *note_at_ms) return;
    *note_at_ms = _ddp_next_wait_note_ms(ms);
    ddp_transport_log(sp->ctx, DDP_LOG_WARN, "shm: init (phase join): no progress for %lld s, waiting for %s "
                      "(timeout %d ms)", (long long)(ms / 1000), who, sp->ctx->timeout_ms);
}

_DDP_PRIVATE ddp_result_t _ddp_shm_lead(_ddp_shm_t *sp) {
    const ddp_transport_ctx_t *c = sp->ctx;
    const int64_t deadline = _ddp_deadline(c->timeout_ms);
    _ddp_shm_region_t *rg;
    struct pollfd *pf;
    int64_t progress_at = _ddp_now_us(), probe_at = 0, note_at_ms = _ddp_next_wait_note_ms(0);
    ddp_result_t r;
    int l, before;
    r = _ddp_shm_region_new(sp, _DDP_SHM_REGION_HOST, sp->host_bytes, "host region", &sp->host_fd, &sp->host,
                            &sp->host_mapped);
    if (r != DDP_SUCCESS) return r;
    rg = (_ddp_shm_region_t *)(void *)sp->host;
    rg->slots = sp->nlocal;
    _ddp_shm_members_fill(sp, 0);
    _ddp_shm_hdr_fill(sp, sp->member[0].hdr, sp->rank, (int)getpid(), sp->host_bytes);
    sp->member[0].pid = (int)getpid();
    sp->mine = sp->member[0].base;
    __atomic_store_n(&sp->me, sp->member[0].hdr, __ATOMIC_RELEASE);
    _ddp_shm_say_addr(sp);
    pf = (struct pollfd *)ddp_transport_calloc(c, sizeof *pf * (size_t)(1 + sp->pending_cap));
    if (!pf) return ddp_transport_fail(c, DDP_ERR_OUT_OF_MEMORY, "shm: join");
    sp->joining = 1;
    sp->njoined = 1;
    while (sp->njoined < sp->nlocal) {
        int i, m = 0, dead_pid = 0, dead;
        pf[m].fd = sp->listen_fd;
        pf[m].events = POLLIN;
        pf[m++].revents = 0;
        for (i = 0; i < sp->npending; i++, m++) {
            pf[m].fd = sp->pending[i].h.fd;
            pf[m].events = POLLIN;
            pf[m].revents = 0;
        }
        if (poll(pf, (nfds_t)m, 100) > 0)
            for (i = 1; i < m; i++) if (pf[i].revents) sp->pending[i - 1].ready = 1;
        before = sp->njoined;
        if ((r = _ddp_shm_pump(sp, 1)) != DDP_SUCCESS) break;
        if (sp->njoined != before) {
            progress_at = _ddp_now_us();
            note_at_ms = _ddp_next_wait_note_ms(0);
        }
        if (sp->njoined == sp->nlocal) break;
        if ((_ddp_now_us() - progress_at) / 1000 >= note_at_ms) {
            char who[96];
            snprintf(who, sizeof who, "rank %d to join this host's shared-memory region (%d of %d ranks joined)",
                     _ddp_shm_join_missing(sp), sp->njoined, sp->nlocal);
            _ddp_shm_join_note(sp, progress_at, &note_at_ms, who);
        }
        if (ddp_transport_aborted(c)) {
            r = _ddp_shm_join_abandon(sp, _ddp_shm_join_missing(sp), ddp_transport_fail(c, DDP_ERR_ABORTED,
                                      "shm: init (phase join): ddp_comm_abort was called on this rank"));
            break;
        }
        if (_ddp_now_us() - progress_at >= (int64_t)_DDP_SHM_JOIN_PROBE_MS * 1000 && _ddp_now_us() >= probe_at) {
            probe_at = _ddp_now_us() + (int64_t)_DDP_SHM_JOIN_PROBE_MS * 1000;
            if ((r = _ddp_shm_join_board(sp)) != DDP_SUCCESS) {
                r = _ddp_shm_join_abandon(sp, _ddp_shm_join_missing(sp), r);
                break;
            }
            if ((dead = _ddp_shm_join_dead(sp, &dead_pid)) >= 0) {
                _ddp_transport_blame(c, dead);
                r = _ddp_shm_join_abandon(sp, dead, ddp_transport_fail(c, DDP_ERR_REMOTE, "shm: rank %d (pid %d) "
                                          "is gone: it exited or crashed before joining this host's shared-memory "
                                          "region (phase join; %d of %d ranks joined)", dead, dead_pid, sp->njoined,
                                          sp->nlocal));
                break;
            }
        }
        if (_ddp_ms_left(deadline) == 0) {
            const int missing = _ddp_shm_join_missing(sp);
            if (c->waiting_on) *c->waiting_on = missing;
            r = _ddp_shm_join_abandon(sp, missing, ddp_transport_fail(c, DDP_ERR_TIMEOUT, "shm: init (phase join): "
                                      "rank %d did not join this host's shared-memory region within %d ms (%d of %d "
                                      "ranks joined)", missing, c->timeout_ms, sp->njoined, sp->nlocal));
            break;
        }
    }
    ddp_transport_free(c, pf);
    sp->joining = 0;
    if (r != DDP_SUCCESS) return r;
    /* Complete: the slots are filled; each member learns it from a byte on its socket (which
     * then stays silent: a hang-up on it means the leader is gone). */
    __atomic_store_n(&rg->joined, (uint32_t)sp->nlocal, __ATOMIC_RELEASE);
    for (l = 1; l < sp->nlocal; l++)
        if (send(sp->member[l].fd, "J", 1, MSG_NOSIGNAL | MSG_DONTWAIT) < 0) {}
    return DDP_SUCCESS;
}

/* What a member's two waits check each turn: an abort, the store's failure board (every 2 s), the
 * note of a wait that lasts, and the deadline (`late`: what the leader did not do in time). */
_DDP_PRIVATE ddp_result_t _ddp_shm_follow_tick(_ddp_shm_t *sp, int64_t deadline, int64_t since, int64_t *note_at_ms,
                                               int64_t *board_at, const char *waits_for, const char *late) {
    const ddp_transport_ctx_t *c = sp->ctx;
    ddp_result_t r;
    if (ddp_transport_aborted(c))
        return ddp_transport_fail(c, DDP_ERR_ABORTED, "shm: init (phase join): ddp_comm_abort was called on this rank");
    if (_ddp_now_us() >= *board_at) {
        *board_at = _ddp_now_us() + 2000000;
        if ((r = _ddp_shm_join_board(sp)) != DDP_SUCCESS) return r;
    }
    _ddp_shm_join_note(sp, since, note_at_ms, waits_for);
    if (_ddp_ms_left(deadline) == 0) {
        if (c->waiting_on) *c->waiting_on = sp->leader;
        return ddp_transport_fail(c, DDP_ERR_TIMEOUT, "shm: init (phase join): rank %d, this host's leader, did not "
                                  "%s within %d ms", sp->leader, late, c->timeout_ms);
    }
    return DDP_SUCCESS;
}

/* A member: one handshake with the leader (its proof and ours, then the host region), then
 * the leader's word that every rank of the host is in. */
_DDP_PRIVATE ddp_result_t _ddp_shm_follow(_ddp_shm_t *sp) {
    const ddp_transport_ctx_t *c = sp->ctx;
    const int64_t deadline = _ddp_deadline(c->timeout_ms);
    const int L = sp->leader;
    _ddp_shm_dial_t *d = &sp->join_dial;
    _ddp_shm_region_t *rg;
    ddp_result_t r;
    void *unused = NULL;
    int64_t board_at = _ddp_now_us() + 2000000;   /* then every 2 s: a store request each */
    int64_t since = _ddp_now_us(), note_at_ms = _ddp_next_wait_note_ms(0);
    char waits_for[96];
    snprintf(waits_for, sizeof waits_for, "rank %d, this host's leader, to let this rank join its region", L);
    d->purpose = _DDP_SHM_JOIN;
    while (!sp->host) {
        struct pollfd pfd;
        int64_t wait_us;
        if ((r = _ddp_shm_dial_step(sp, d, L, &unused)) != DDP_SUCCESS) return r;
        if (sp->host) break;
        /* Refused or cut off: is the leader still there (its published pid)? */
        if (d->stage == 0 && d->have_addr && _ddp_shm_pid_gone((int)d->addr.pid)) {
            _ddp_transport_blame(c, L);
            return ddp_transport_fail(c, DDP_ERR_REMOTE, "shm: rank %d (pid %d), this host's leader, is gone: "
                                      "it exited or crashed before this rank could join its shared-memory region "
                                      "(phase join)", L, (int)d->addr.pid);
        }
        if ((r = _ddp_shm_follow_tick(sp, deadline, since, &note_at_ms, &board_at, waits_for,
                                      "let this rank join its shared-memory region")) != DDP_SUCCESS)
            return r;
        wait_us = d->stage == 0 && d->retry_at ? d->retry_at - _ddp_now_us() : 100000;
        pfd.fd = d->stage == 0 ? -1 : d->fd;
        pfd.events = POLLIN;
        pfd.revents = 0;
        if (wait_us > 0) poll(&pfd, 1, (int)(wait_us > 100000 ? 100 : (wait_us + 999) / 1000));
    }
    _ddp_shm_members_fill(sp, 0);
    rg = (_ddp_shm_region_t *)(void *)sp->host;
    since = _ddp_now_us();
    note_at_ms = _ddp_next_wait_note_ms(0);
    snprintf(waits_for, sizeof waits_for, "rank %d, this host's leader, to say that every rank of the host joined", L);
    for (;;) {
        struct pollfd pfd;
        char b = 0;
        ssize_t got;
        pfd.fd = sp->member[0].fd;
        pfd.events = POLLIN;
        pfd.revents = 0;
        if (poll(&pfd, 1, 100) > 0) {
            got = recv(pfd.fd, &b, 1, MSG_DONTWAIT);
            if (got == 1 && b == 'J' && __atomic_load_n(&rg->joined, __ATOMIC_ACQUIRE) == (uint32_t)sp->nlocal) break;
            if (got == 1 && b == 'F') {
                int who = __atomic_load_n(&rg->failed_rank, __ATOMIC_ACQUIRE);
                if (who < 0 || who >= sp->nranks || sp->local_of[who] < 0) who = L;
                _ddp_transport_blame(c, who);
                return ddp_transport_fail(c, DDP_ERR_REMOTE, "shm: init (phase join): rank %d did not join this "
                                          "host's shared-memory region (gone or late: rank %d, the host's leader, "
                                          "gave up waiting for it)", who, L);
            }
            if (got == 0 || (got < 0 && errno != EAGAIN && errno != EINTR) || (got == 1 && b != 'J')) {
                _ddp_transport_blame(c, L);
                return ddp_transport_fail(c, DDP_ERR_REMOTE, "shm: rank %d (pid %d), this host's leader, is gone: "
                                          "it exited, crashed or failed during init (phase join)", L, sp->member[0].pid);
            }
        }
        if ((r = _ddp_shm_follow_tick(sp, deadline, since, &note_at_ms, &board_at, waits_for,
                                      "say that every rank joined")) != DDP_SUCCESS)
            return r;
    }
    _ddp_shm_members_fill(sp, 1);   /* the pids the leader recorded before it said so */
    return DDP_SUCCESS;
}

/* The communicator's step 5 (every rank at once): join this host's region. */
_DDP_PRIVATE ddp_result_t _ddp_shm_join(void *state) {
    _ddp_shm_t *sp = (_ddp_shm_t *)state;
    const ddp_transport_ctx_t *c = sp->ctx;
    const char *s = getenv("DDP_SHM_COLL");
    const int64_t t0 = _ddp_now_us();
    ddp_result_t r;
    int l;
    if (s && !strcmp(s, "0")) {
        _DDP_TLOG(c, DDP_LOG_INFO, "shm: collectives over point-to-point (DDP_SHM_COLL=0)");
        return DDP_ERR_UNSUPPORTED;
    }
    if (!sp->set_up && (r = _ddp_shm_setup(sp)) != DDP_SUCCESS) return r;
    if (sp->nlocal != sp->nranks || sp->joined) return DDP_ERR_UNSUPPORTED;
    sp->member = (_ddp_shm_member_t *)ddp_transport_calloc(c, sizeof *sp->member * (size_t)sp->nlocal);
    sp->ring = (_ddp_shm_member_t **)ddp_transport_calloc(c, sizeof(void *) * (size_t)sp->nlocal);
    if (!sp->member || !sp->ring) return ddp_transport_fail(c, DDP_ERR_OUT_OF_MEMORY, "shm: join");
    for (l = 0; l < sp->nlocal; l++) sp->member[l].fd = sp->member[l].pidfd = -1;
    r = sp->rank == sp->leader ? _ddp_shm_lead(sp) : _ddp_shm_follow(sp);
    if (r != DDP_SUCCESS) return r;
    sp->joined = 1;
    if (sp->rank == sp->leader) {
        /* The leader watches every member from now on, and tells the host when one goes. */
        _ddp_shm_watch_start(sp);
        _DDP_TLOG(c, DDP_LOG_INFO, "shm: host region: %d members joined in %.3f s (one handshake each with "
                  "rank %d, the leader); %zu KiB: %d slots of header + staging 2 x %zu KiB", sp->nlocal,
                  (double)(_ddp_now_us() - t0) / 1e6, sp->rank, sp->host_bytes >> 10, sp->nlocal, sp->chunk >> 10);
    } else {
        _DDP_TLOG(c, DDP_LOG_INFO, "shm: joined the host region of rank %d in %.3f s (slot %d of %d)", sp->leader,
                  (double)(_ddp_now_us() - t0) / 1e6, sp->my_local, sp->nlocal);
    }
    return DDP_SUCCESS;
}

/* ---------------------------------------------------------------- point-to-point */
_DDP_PRIVATE ddp_result_t _ddp_shm_broken(_ddp_shm_conn_t *k, ddp_result_t r, const char *what) {
    if (r == DDP_ERR_REMOTE) _ddp_transport_blame(k->sp->ctx, k->h.peer);
    return _ddp_transport_conn_fail(k->sp->ctx, &k->h.err, r, "shm: %s rank %d (pid %d)", what,
                                    k->h.peer, k->peer_pid);
}

/* Send: fill free cells from the queued sends. 1 if a cell was filled. */
_DDP_PRIVATE int _ddp_shm_send_some(_ddp_shm_conn_t *k, size_t cstride, uint64_t nc) {
    _ddp_shm_t *sp = k->sp;
    uint64_t tail = __atomic_load_n(&k->sq->tail, __ATOMIC_ACQUIRE);
    int moved = 0;
    while (k->sends.head && k->shead - tail < nc) {
        _ddp_transport_req_t *q = k->sends.head;
        _ddp_shm_cell_t *cell = (_ddp_shm_cell_t *)(void *)(k->scells + (k->shead % nc) * cstride);
        size_t n = q->len - q->done;
        if (n > sp->cell_bytes) n = sp->cell_bytes;
        cell->tag = q->tag;
        cell->total = q->len;
        cell->off = q->done;
        cell->len = (uint32_t)n;
        if (n) memcpy(cell + 1, q->buf + q->done, n);
        q->done += n;
        k->shead++;
        __atomic_store_n(&k->sq->head, k->shead, __ATOMIC_SEQ_CST);
        moved = 1;
        if (q->done == q->len) {
            q->complete = 1;
            _ddp_transport_queue_pop(&k->sends);
        }
    }
    return moved;
}

/* Receive: drain filled cells into the posted receives, in order. *freed = 1 if a cell was
 * drained. */
_DDP_PRIVATE ddp_result_t _ddp_shm_recv_some(_ddp_shm_conn_t *k, size_t cstride, uint64_t nc,
                                             int *freed) {
    _ddp_shm_t *sp = k->sp;
    uint64_t head = __atomic_load_n(&k->rq->head, __ATOMIC_ACQUIRE);
    while (k->recvs.head && k->rtail < head) {
        _ddp_transport_req_t *q = k->recvs.head;
        const _ddp_shm_cell_t *cell =
            (const _ddp_shm_cell_t *)(const void *)(k->rcells + (k->rtail % nc) * cstride);
        if (cell->tag != q->tag || cell->total != q->len || cell->off != q->done ||
            cell->len > q->len - q->done || cell->len > sp->cell_bytes) {
            if (cell->off != q->done || cell->len > sp->cell_bytes)
                return _ddp_shm_broken(k, DDP_ERR_MISMATCH, "malformed queue contents from");
            return _ddp_transport_conn_mismatch(&k->h, cell->tag, cell->total, q);
        }
        if (cell->len) memcpy(q->buf + q->done, cell + 1, cell->len);
        q->done += cell->len;
        k->rtail++;
        __atomic_store_n(&k->rq->tail, k->rtail, __ATOMIC_SEQ_CST);
        *freed = 1;
        if (q->done == q->len) {
            q->complete = 1;
            _ddp_transport_queue_pop(&k->recvs);
        }
    }
    return DDP_SUCCESS;
}

_DDP_PRIVATE ddp_result_t _ddp_shm_progress(_ddp_transport_conn_t *h) {
    _ddp_shm_conn_t *k = (_ddp_shm_conn_t *)(void *)h;
    const size_t cstride = sizeof(_ddp_shm_cell_t) + k->sp->cell_bytes;
    const uint64_t nc = (uint64_t)k->sp->ncells;
    int moved = 0, freed = 0;
    if (k->h.err != DDP_SUCCESS) return k->h.err;
    if (k->sends.head) moved = _ddp_shm_send_some(k, cstride, nc);
    if (k->recvs.head) {
        ddp_result_t r = _ddp_shm_recv_some(k, cstride, nc, &freed);
        if (r != DDP_SUCCESS) return r;
    }
    if (moved || freed) {
        _ddp_transport_bell_ring(&k->hdr->bell, 1);
    } else if (k->sends.head || k->recvs.head) {
        /* Nothing moved: now and then, make sure the peer is still there. */
        int64_t now = _ddp_now_us();
        if (now >= k->next_check_us) {
            k->next_check_us = now + 1000;
            if (_ddp_shm_peer_gone(k)) {
                /* It may have published its last words just before going. */
                uint64_t head = __atomic_load_n(&k->rq->head, __ATOMIC_ACQUIRE);
                if (!(k->recvs.head && k->rtail < head))
                    return _ddp_shm_broken(k, DDP_ERR_REMOTE, "lost");
            }
        }
    }
    return DDP_SUCCESS;
}

_DDP_PRIVATE ddp_result_t _ddp_shm_post(_ddp_transport_conn_t *h, int is_send, void *buf, size_t len,
                                        uint64_t tag, void *mr, void **req) {
    _ddp_shm_conn_t *k = (_ddp_shm_conn_t *)(void *)h;
    _ddp_transport_req_t *q;
    ddp_result_t r = _ddp_transport_req_take(h, is_send, buf, len, tag, &q);
    (void)mr;
    if (r != DDP_SUCCESS) return r;
    _ddp_transport_queue_push(is_send ? &k->sends : &k->recvs, q);
    *req = q;
    /* Start at once: a send copies what fits, so the peer can begin. */
    return _ddp_shm_progress(h);
}

/* 1 if a connection can move something now. */
_DDP_PRIVATE int _ddp_shm_can_progress(_ddp_shm_conn_t *k) {
    if (k->h.err != DDP_SUCCESS) return 1;
    if (k->sends.head && k->shead - __atomic_load_n(&k->sq->tail, __ATOMIC_SEQ_CST) < (uint64_t)k->sp->ncells)
        return 1;
    if (k->recvs.head && k->rtail < __atomic_load_n(&k->rq->head, __ATOMIC_SEQ_CST)) return 1;
    return 0;
}

/* ---------------------------------------------------------------- the watcher
 * A sleeping rank sleeps on a futex, which a dead peer never rings: without help it would
 * notice only at the end of its 50 ms slice. The watcher sleeps in poll() on peers' sockets (a
 * hang-up when the peer's last copy closes) and pidfds (readable when the process exits, even
 * while a fork child of it still holds the socket), marks the peer dead and rings this rank's
 * doorbell: the sleeper wakes within microseconds and returns the error. In a host region only
 * the leader watches every rank (its socket and pidfd of each), and when one goes it marks the
 * rank's slot and rings every rank of the host: O(n) descriptors for the host, not O(n^2).
 * The members watch the leader. The leader's watcher starts with the join; a member's with its
 * first wait that sleeps (a pair connected later is checked at the slices as before). It is
 * stopped before any connection closes. */
_DDP_PRIVATE void *_ddp_shm_watch_main(void *arg) {
    _ddp_shm_t *sp = (_ddp_shm_t *)arg;
    struct pollfd *pf = sp->watch_fds;
    int i, l, m = sp->nwatch, live;
    for (live = m - 1; live > 0;) {
        /* Bounded like every wait: a lost stop is seen within a second. */
        int n = poll(pf, (nfds_t)m, 1000);
        if (__atomic_load_n(&sp->watch_state, __ATOMIC_ACQUIRE) != 1) break;
        if (n <= 0) continue;
        if (pf[0].revents) break;
        for (i = 1; i < m; i++) {
            _ddp_shm_member_t *relay = sp->watch_relay[i];
            if (pf[i].fd < 0 || !pf[i].revents) continue;
            pf[i].fd = -1;   /* poll ignores it from now on */
            live--;
            __atomic_store_n(sp->watch_dead[i], 1u, __ATOMIC_RELEASE);
            if (relay && !__atomic_exchange_n(&relay->hdr->gone, 1u, __ATOMIC_SEQ_CST))
                for (l = 0; l < sp->nlocal; l++)
                    if (&sp->member[l] != relay) _ddp_transport_bell_ring(&sp->member[l].hdr->bell, 1);
            __atomic_store_n(&sp->gone_seen, 1u, __ATOMIC_RELEASE);
            _ddp_transport_bell_ring(&sp->me->bell, 1);
        }
    }
    return NULL;
}

/* Once, from the join (the leader) or a wait about to sleep. A failure to start is no error:
 * the slices still check. */
_DDP_PRIVATE void _ddp_shm_watch_start(_ddp_shm_t *sp) {
    const size_t cap = 1 + 2 * (size_t)sp->nranks + 2 * (size_t)(sp->joined || sp->joining ? sp->nlocal : 0);
    const int lead = sp->rank == sp->leader;
    int i, m = 1;
    sp->watch_state = 2;
    sp->watch_fds = (struct pollfd *)ddp_transport_calloc(sp->ctx, cap * sizeof *sp->watch_fds);
    sp->watch_dead = (uint32_t **)ddp_transport_calloc(sp->ctx, cap * sizeof *sp->watch_dead);
    sp->watch_relay = (_ddp_shm_member_t **)ddp_transport_calloc(sp->ctx, cap * sizeof *sp->watch_relay);
    if (!sp->watch_fds || !sp->watch_dead || !sp->watch_relay) return;
    sp->watch_stop = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (sp->watch_stop < 0) return;
    sp->watch_fds[0].fd = sp->watch_stop;
    sp->watch_fds[0].events = POLLIN;
    for (i = 0; sp->member && sp->joined && i < sp->nlocal; i++) {
        _ddp_shm_member_t *w = &sp->member[i];
        if (w->fd < 0) continue;              /* ourselves; a member: every rank but the leader */
        sp->watch_fds[m].fd = w->fd;          /* events 0: POLLHUP is always reported */
        sp->watch_dead[m] = &w->dead;
        sp->watch_relay[m++] = lead ? w : NULL;
        if (w->pidfd >= 0) {
            sp->watch_fds[m].fd = w->pidfd;   /* readable once the process has exited */
            sp->watch_fds[m].events = POLLIN;
            sp->watch_dead[m] = &w->dead;
            sp->watch_relay[m++] = lead ? w : NULL;
        }
    }
    for (i = 0; sp->conns && i < sp->nranks; i++) {
        _ddp_shm_conn_t *k = sp->conns[i];
        if (!k) continue;
        sp->watch_fds[m].fd = k->fd;
        sp->watch_dead[m++] = &k->dead;
        if (k->pidfd >= 0) {
            sp->watch_fds[m].fd = k->pidfd;
            sp->watch_fds[m].events = POLLIN;
            sp->watch_dead[m++] = &k->dead;
        }
    }
    sp->nwatch = m;
    __atomic_store_n(&sp->watch_state, 1, __ATOMIC_RELEASE);
    if (pthread_create(&sp->watch_thread, NULL, _ddp_shm_watch_main, sp) != 0) {
        __atomic_store_n(&sp->watch_state, 2, __ATOMIC_RELEASE);
        close(sp->watch_stop);
        sp->watch_stop = -1;
    }
}

/* Before any connection closes (the watcher reads them). A fork child has no watcher thread:
 * it only closes its copy of the eventfd. */
_DDP_PRIVATE void _ddp_shm_watch_end(_ddp_shm_t *sp) {
    if (sp->watch_state == 1) {
        __atomic_store_n(&sp->watch_state, 2, __ATOMIC_RELEASE);
        if (!ddp_transport_forked(sp->ctx)) {
            uint64_t one = 1;
            if (write(sp->watch_stop, &one, sizeof one) < 0) {}
            pthread_join(sp->watch_thread, NULL);
        }
    }
    if (sp->watch_stop >= 0) close(sp->watch_stop);
    sp->watch_stop = -1;
    ddp_transport_free(sp->ctx, sp->watch_fds);
    ddp_transport_free(sp->ctx, sp->watch_dead);
    ddp_transport_free(sp->ctx, sp->watch_relay);
    sp->watch_fds = NULL;
    sp->watch_dead = NULL;
    sp->watch_relay = NULL;
}

_DDP_PRIVATE ddp_result_t _ddp_shm_wait(void *state, void *const *conns, int n, int timeout_ms) {
    _ddp_shm_t *sp = (_ddp_shm_t *)state;
    int i, ms = timeout_ms < 0 || timeout_ms > _DDP_SHM_SLICE_MS ? _DDP_SHM_SLICE_MS : timeout_ms;
    uint32_t seen;
    if (!sp->watch_state && ms > 0) _ddp_shm_watch_start(sp);
    seen = _ddp_transport_bell_arm(&sp->me->bell);
    if (ddp_transport_aborted(sp->ctx)) ms = 0;
    for (i = 0; i < n && ms > 0; i++) {
        _ddp_shm_conn_t *k = (_ddp_shm_conn_t *)conns[i];
        if (_ddp_shm_can_progress(k) || _ddp_shm_peer_gone(k)) ms = 0;
    }
    _ddp_transport_bell_sleep(&sp->me->bell, seen, ms, 1);
    return DDP_SUCCESS;
}

/* Any thread, after the abort flag was set: wake this rank if it sleeps on its doorbell (every
 * wait re-checks the flag after arming the bell, so the ring is never lost). */
_DDP_PRIVATE void _ddp_shm_abort(void *state) {
    _ddp_shm_t *sp = (_ddp_shm_t *)state;
    _ddp_shm_hdr_t *me = sp ? __atomic_load_n(&sp->me, __ATOMIC_ACQUIRE) : NULL;
    if (me) _ddp_transport_bell_ring(&me->bell, 1);
}

/* Tells every peer at once that this rank closed (the flag is ours, in our header). Not from a
 * fork child, whose parent still uses the regions. */
_DDP_PRIVATE void _ddp_shm_say_closed(_ddp_shm_t *sp) {
    if (sp->me && !ddp_transport_forked(sp->ctx)) __atomic_store_n(&sp->me->closed, 1u, __ATOMIC_SEQ_CST);
}

_DDP_PRIVATE ddp_result_t _ddp_shm_close(void *conn) {
    _ddp_shm_conn_t *k = (_ddp_shm_conn_t *)conn;
    _ddp_shm_t *sp;
    if (!k) return DDP_SUCCESS;
    sp = k->sp;
    _ddp_shm_watch_end(sp);
    if (k->pidfd >= 0) close(k->pidfd);
    _ddp_shm_say_closed(sp);
    if (!ddp_transport_forked(sp->ctx)) _ddp_transport_bell_ring(&k->hdr->bell, 1);
    if (k->fd >= 0) close(k->fd);
    _ddp_shm_region_drop(sp, k->base, k->base_bytes, k->shared_map, k->mapped);
    if (k->home) _ddp_shm_region_drop(sp, k->home, 2 * _DDP_SHM_HDR_BYTES, k->home_shared, NULL);
    if (sp->conns[k->h.peer] == k) sp->conns[k->h.peer] = NULL;
    sp->coll_enabled = 0;
    ddp_transport_free(sp->ctx, k);
    return DDP_SUCCESS;
}

_DDP_PRIVATE void _ddp_shm_dial_drop(_ddp_shm_t *sp, _ddp_shm_dial_t *d) {
    if (d->fd >= 0) close(d->fd);
    if (d->pair_fd >= 0) close(d->pair_fd);
    if (d->pair) _ddp_shm_region_drop(sp, d->pair, sp->pair_bytes, 1, d->pair_mapped);
    d->fd = d->pair_fd = -1;
    d->pair = NULL;
}

_DDP_PRIVATE ddp_result_t _ddp_shm_finalize(void *state) {
    _ddp_shm_t *sp = (_ddp_shm_t *)state;
    int i;
    if (!sp) return DDP_SUCCESS;
    _ddp_shm_watch_end(sp);
    if (sp->listen_fd >= 0) close(sp->listen_fd);
    for (i = 0; sp->pending && i < sp->npending; i++) if (sp->pending[i].h.fd >= 0) close(sp->pending[i].h.fd);
    ddp_transport_free(sp->ctx, sp->pending);
    for (i = 0; sp->ready && i < sp->nranks; i++) if (sp->ready[i]) _ddp_shm_close(sp->ready[i]);
    for (i = 0; sp->conns && i < sp->nranks; i++) if (sp->conns[i]) _ddp_shm_close(sp->conns[i]);
    _ddp_shm_wins_release(sp->ctx, &sp->wins);
    for (i = 0; sp->dial && i < sp->nranks; i++) _ddp_shm_dial_drop(sp, &sp->dial[i]);
    _ddp_shm_dial_drop(sp, &sp->join_dial);
    _ddp_shm_say_closed(sp);
    for (i = 0; sp->member && i < sp->nlocal; i++) {
        _ddp_shm_member_t *m = &sp->member[i];
        if (m->fd >= 0) close(m->fd);
        if (m->pidfd >= 0) close(m->pidfd);
        /* Wake whoever waits for us: it finds us closed. */
        if (m->hdr && i != sp->my_local && !ddp_transport_forked(sp->ctx)) _ddp_transport_bell_ring(&m->hdr->bell, 1);
    }
    if (sp->host) _ddp_shm_region_drop(sp, sp->host, sp->host_bytes, sp->host_shared, sp->host_mapped);
    if (sp->home) _ddp_shm_region_drop(sp, sp->home, 2 * _DDP_SHM_HDR_BYTES, 0, sp->home_mapped);
    if (sp->host_fd >= 0) close(sp->host_fd);
    if (sp->home_fd >= 0) close(sp->home_fd);
    ddp_transport_free(sp->ctx, sp->member);
    ddp_transport_free(sp->ctx, sp->pub_pid);
    ddp_transport_free(sp->ctx, sp->local_of);
    ddp_transport_free(sp->ctx, sp->rank_of);
    ddp_transport_free(sp->ctx, sp->conns);
    ddp_transport_free(sp->ctx, sp->ready);
    ddp_transport_free(sp->ctx, sp->ring);
    ddp_transport_free(sp->ctx, sp->dial);
    ddp_transport_free(sp->ctx, sp);
    return DDP_SUCCESS;
}

/* ---------------------------------------------------------------- collectives */
/* Publishes this rank's next step. */
static inline void _ddp_shm_signal(_ddp_shm_t *sp, const _ddp_transport_sig_t *sig) {
    int i, n = sp->nranks - 1;
    uint64_t next = sp->phase + 1;
    sp->me->sig[next & 1] = *sig;
    __atomic_store_n(&sp->me->phase, next, __ATOMIC_SEQ_CST);
    sp->phase = next;
    for (i = 0; i < n; i++) _ddp_transport_bell_ring(&sp->ring[i]->hdr->bell, 1);
}

/* A wait that lasts says so (transports/ddp_transport.h), naming every rank from the i-th peer
 * on that has not published step sp->phase yet (those before it have). */
_DDP_PRIVATE void _ddp_shm_note_wait(_ddp_shm_t *sp, _ddp_transport_spin_t *s, const _ddp_transport_sig_t *sig,
                                     const char *step, size_t chunk, size_t nchunks, int i) {
    _ddp_transport_ranks_t missing;
    char detail[96];
    _ddp_transport_ranks_init(&missing);
    for (; i < sp->nranks - 1; i++)
        if (__atomic_load_n(&sp->ring[i]->hdr->phase, __ATOMIC_ACQUIRE) < sp->phase)
            _ddp_transport_ranks_add(&missing, sp->ring[i]->rank);
    if (!missing.n) return;   /* they all came meanwhile */
    snprintf(detail, sizeof detail, "shm, phase %s, chunk %zu of %zu", step, chunk + 1, nchunks);
    _ddp_transport_note_wait(sp->ctx, s, sig->kind, detail, _ddp_transport_ranks_str(&missing));
}

/* Waits until every other rank has published step sp->phase, and checks it is the same step. */
_DDP_PRIVATE ddp_result_t _ddp_shm_wait_all(_ddp_shm_t *sp, const _ddp_transport_sig_t *sig,
                                            const char *step, size_t chunk, size_t nchunks) {
    const uint64_t target = sp->phase;
    const int n = sp->nranks - 1;
    _ddp_transport_spin_t s;
    int i = 0;
    _ddp_transport_spin_start(&s, sp->spin_us, sp->oversubscribed, sp->ctx->timeout_ms);
    while (i < n) {
        _ddp_shm_member_t *k = sp->ring[i];
        if (__atomic_load_n(&k->hdr->phase, __ATOMIC_ACQUIRE) >= target) {
            const _ddp_transport_sig_t *g = &k->hdr->sig[target & 1];
            if (_ddp_transport_sig_differs(g, sig)) {
                char theirs[160], ours[160];
                _ddp_transport_sig_t copy = *g;
                _ddp_transport_sig_str(&copy, theirs, sizeof theirs);
                _ddp_transport_sig_str(sig, ours, sizeof ours);
                return ddp_transport_fail(sp->ctx, DDP_ERR_MISMATCH, "shm: rank %d called %s, this "
                                          "rank %s: the ranks called different collectives, "
                                          "dtypes, ops, roots or counts", k->rank, theirs, ours);
            }
            i++;
            continue;
        }
        if (_ddp_transport_spin_fast(&s)) continue;
        if (_ddp_transport_spin_tick(&s)) {
            if (ddp_transport_aborted(sp->ctx))
                return ddp_transport_fail(sp->ctx, DDP_ERR_ABORTED, "shm: %s (phase %s, chunk %zu "
                                          "of %zu): ddp_comm_abort was called on this rank",
                                          _ddp_kind_name(sig->kind), step, chunk + 1,
                                          nchunks);
            if (_ddp_shm_member_gone(k) &&
                __atomic_load_n(&k->hdr->phase, __ATOMIC_ACQUIRE) < target) {
                _ddp_transport_blame(sp->ctx, k->rank);
                return ddp_transport_fail(sp->ctx, DDP_ERR_REMOTE, "shm: rank %d (pid %d) is gone: "
                                          "it exited, crashed or failed during %s (phase %s, chunk "
                                          "%zu of %zu)", k->rank, k->pid,
                                          _ddp_kind_name(sig->kind), step, chunk + 1,
                                          nchunks);
            }
            if (_ddp_transport_spin_expired(&s)) {
                if (sp->ctx->waiting_on) *sp->ctx->waiting_on = k->rank;
                return ddp_transport_fail(sp->ctx, DDP_ERR_TIMEOUT, "shm: %s (phase %s, chunk %zu "
                                          "of %zu): rank %d did not arrive within %d ms",
                                          _ddp_kind_name(sig->kind), step, chunk + 1,
                                          nchunks, k->rank, s.timeout_ms);
            }
            _ddp_transport_waits_on(sp->ctx, k->rank);
            if (_ddp_transport_note_due(sp->ctx, &s)) _ddp_shm_note_wait(sp, &s, sig, step, chunk, nchunks, i);
        }
        if (_ddp_transport_spin_slow(&s)) continue;
        {
            uint32_t seen;
            int wait;
            if (!sp->watch_state) _ddp_shm_watch_start(sp);
            seen = _ddp_transport_bell_arm(&sp->me->bell);
            wait = __atomic_load_n(&k->hdr->phase, __ATOMIC_SEQ_CST) < target &&
                   !ddp_transport_aborted(sp->ctx) && !__atomic_load_n(&sp->gone_seen, __ATOMIC_ACQUIRE);
            _ddp_transport_bell_sleep(&sp->me->bell, seen, wait ? _DDP_SHM_SLICE_MS : 0, 1);
            /* The watcher saw a peer go: look now, not at the next millisecond's checks. */
            if (__atomic_load_n(&sp->gone_seen, __ATOMIC_ACQUIRE)) s.next_check = 0;
        }
    }
    return DDP_SUCCESS;
}

/* memcpy, or with non-temporal (streaming) stores on x86-64 (SSE2 is part of the ABI). */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <emmintrin.h>
_DDP_PRIVATE void _ddp_shm_copy_out(unsigned char *dst, const unsigned char *src, size_t n, int stream) {
    size_t head, i;
    if (!stream || n < 256) { memcpy(dst, src, n); return; }
    head = (16 - ((uintptr_t)dst & 15)) & 15;
    memcpy(dst, src, head);
    dst += head; src += head; n -= head;
    for (i = 0; i + 64 <= n; i += 64) {
        __m128i a = _mm_loadu_si128((const __m128i *)(const void *)(src + i));
        __m128i b = _mm_loadu_si128((const __m128i *)(const void *)(src + i + 16));
        __m128i c = _mm_loadu_si128((const __m128i *)(const void *)(src + i + 32));
        __m128i d = _mm_loadu_si128((const __m128i *)(const void *)(src + i + 48));
        _mm_stream_si128((__m128i *)(void *)(dst + i), a);
        _mm_stream_si128((__m128i *)(void *)(dst + i + 16), b);
        _mm_stream_si128((__m128i *)(void *)(dst + i + 32), c);
        _mm_stream_si128((__m128i *)(void *)(dst + i + 48), d);
    }
    memcpy(dst + i, src + i, n - i);
}
_DDP_PRIVATE void _ddp_shm_stream_fence(void) { _mm_sfence(); }
#else
_DDP_PRIVATE void _ddp_shm_copy_out(unsigned char *dst, const unsigned char *src, size_t n, int stream) {
    (void)stream;
    memcpy(dst, src, n);
}
_DDP_PRIVATE void _ddp_shm_stream_fence(void) {}
#endif

/* Copy-in with ordinary or streaming stores? Between cores that share a cache, ordinary stores
 * win (the peer reads our lines from that cache: 256 KiB all-reduce, p=2, 12 vs 8 GB/s here).
 * Between cores that do not (other CCX/CCD/socket, and on this VM whenever the host puts the
 * two vCPUs apart), rewriting lines the peer still caches costs an invalidation each, and
 * streaming stores win by 1.5-2x. The topology is not ours to see, so measure: keep the cost per
 * byte of copy-in + reduce for both ways (exponential average), use the cheaper one, and try
 * the other every 32nd chunk. A local choice: it never changes results. */
_DDP_PRIVATE int64_t _ddp_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}
_DDP_PRIVATE int _ddp_shm_copyin_pick(_ddp_shm_t *sp) {
    int best;
    if (sp->copyin_mode >= 0) return sp->copyin_mode;       /* DDP_SHM_COPYIN=0|1 */
    if (sp->copyin_cost[0] == 0) return 0;                  /* not measured yet */
    if (sp->copyin_cost[1] == 0) return 1;
    best = sp->copyin_cost[1] < sp->copyin_cost[0];
    return (++sp->copyin_tries & 31) == 0 ? !best : best;
}
_DDP_PRIVATE void _ddp_shm_copyin_learn(_ddp_shm_t *sp, int way, int64_t ns, size_t bytes) {
    double c = (double)ns / (double)bytes, *e = &sp->copyin_cost[way];
    int before = sp->copyin_cost[1] != 0 && sp->copyin_cost[1] < sp->copyin_cost[0];
    if (sp->copyin_mode >= 0 || ns <= 0) return;
    *e = *e == 0 ? c : 0.75 * *e + 0.25 * c;
    if (sp->copyin_cost[0] != 0 && sp->copyin_cost[1] != 0 &&
        before != (sp->copyin_cost[1] < sp->copyin_cost[0]))
        _DDP_TLOG(sp->ctx, DDP_LOG_TRACE, "shm: copy-in now with %s stores (%.3f vs %.3f ns/byte)",
                  before ? "ordinary" : "streaming", sp->copyin_cost[0], sp->copyin_cost[1]);
}

static inline unsigned char *_ddp_shm_stage(_ddp_shm_t *sp, unsigned char *base, uint64_t which) {
    return base + sp->stage_off + (which & 1) * sp->chunk;
}

/* Staging buffer `which` of rank q (this rank included). */
static inline const unsigned char *_ddp_shm_peer_stage(_ddp_shm_t *sp, int q, uint64_t which) {
    return q == sp->rank ? _ddp_shm_stage(sp, sp->mine, which)
                         : _ddp_shm_stage(sp, sp->member[sp->local_of[q]].base, which);
}

/* Rank q's header in the host region (this rank's included; once joined), and its process:
 * SO_PEERCRED's where this rank holds a socket to it (the leader: every rank; a member: the
 * leader), else as the leader recorded it, from SO_PEERCRED, in q's slot. */
static inline _ddp_shm_hdr_t *_ddp_shm_hdr_of(_ddp_shm_t *sp, int q) {
    return q == sp->rank ? sp->me : sp->member[sp->local_of[q]].hdr;
}
static inline int _ddp_shm_pid_of(_ddp_shm_t *sp, int q) {
    return q == sp->rank ? (int)getpid() : sp->member[sp->local_of[q]].pid;
}

/* ---- registered buffers (transports/ddp_shm_window.h): what the collectives need of a rank */
/* The window slot lives in the header page, after the header's lines. */
typedef char _ddp_shm_win_slot_fits[sizeof(_ddp_shm_hdr_t) <= _DDP_SHM_WIN_SLOT_OFF &&
                                    _DDP_SHM_WIN_SLOT_OFF + sizeof(_ddp_shm_win_slot_t) <= _DDP_SHM_HDR_BYTES ? 1 : -1];

/* Publishes where this call's buffers lie, for the step about to be signalled (the call's
 * first); 1 when this rank's input is in a window: it is read there, never copied in. */
static inline int _ddp_shm_win_publish(_ddp_shm_t *sp, const void *send, size_t slen, const void *recv,
                                       size_t rlen) {
    _ddp_shm_win_call_t *e;
    if (!sp->wins.nusable) return 0;
    e = &_ddp_shm_win_slot(sp->me)->call[(sp->phase + 1) & 1];
    _ddp_shm_win_find(&sp->wins, sp->rank, send, slen, &e->send_serial, &e->send_off);
    _ddp_shm_win_find(&sp->wins, sp->rank, recv, rlen, &e->recv_serial, &e->recv_off);
    return e->send_serial != 0;
}

/* After the call's first step (sp->phase): where each rank's input (wins.src) and output
 * (wins.dst) lie as mapped here, NULL where staged. Every rank reads the same entries, so all
 * decide alike. Bit 0: some rank's input is read in its window (it must not return before
 * its readers are done: one more step); bit 1: every rank's input and output are in windows. */
_DDP_PRIVATE int _ddp_shm_win_resolve(_ddp_shm_t *sp, size_t slen, size_t rlen) {
    int q, any = 0, all = 1;
    if (!sp->wins.nusable) return 0;
    for (q = 0; q < sp->nranks; q++) {
        _ddp_shm_win_call_t e = _ddp_shm_win_slot(_ddp_shm_hdr_of(sp, q))->call[sp->phase & 1];
        sp->wins.src[q] = _ddp_shm_win_at(&sp->wins, q, e.send_serial, e.send_off, slen);
        sp->wins.dst[q] = _ddp_shm_win_at(&sp->wins, q, e.recv_serial, e.recv_off, rlen);
        any |= sp->wins.src[q] != NULL;
        all &= sp->wins.src[q] != NULL && sp->wins.dst[q] != NULL;
    }
    return any | (all << 1);
}

/* The last step of a call that read some rank's window: nobody returns (and lets its user
 * write the buffer) while a peer may still read it. */
_DDP_PRIVATE ddp_result_t _ddp_shm_win_done(_ddp_shm_t *sp, const _ddp_transport_sig_t *sig) {
    _ddp_shm_signal(sp, sig);
    return _ddp_shm_wait_all(sp, sig, "done", 0, 1);
}

/* acc = every rank's window at byte `at`, n elements, summed in rank order (the bits of the
 * staged path). In place from rank 2 on, the sum would overwrite our input before adding it:
 * our input waits in our staging buffer (acc is never that buffer then). */
_DDP_PRIVATE void _ddp_shm_win_fold(_ddp_shm_t *sp, unsigned char *acc, size_t at, size_t n, ddp_dtype_t dtype,
                                    ddp_op_t op) {
    const unsigned char *const *src = sp->wins.src;
    const unsigned char *own = src[sp->rank] + at;
    const int p = sp->nranks, me = sp->rank;
    int q;
    if (me >= 2 && own == acc) {
        unsigned char *keep = _ddp_shm_stage(sp, sp->mine, sp->nchunk);
        memcpy(keep, own, n * ddp_dtype_size(dtype));
        own = keep;
    }
    ddp_reduce_local(acc, me == 0 ? own : src[0] + at, me == 1 ? own : src[1] + at, n, dtype, op);
    for (q = 2; q < p; q++) ddp_reduce_local(acc, acc, q == me ? own : src[q] + at, n, dtype, op);
    if (op == DDP_AVG) ddp_divide_local(acc, n, dtype, p);
}

/* Zero-copy all-reduce, every rank's buffers in windows (after the call's first step). Per
 * chunk: rank r reduces slice r straight from every rank's input, in rank order (the bits of
 * the staged path), into its own output; one step; every rank copies the other slices from
 * their owners' outputs. One step per chunk instead of two, no copy-in, no copy-out of our
 * own slice. In place, the lines the other slices overwrite were just read by their owners and
 * sit in their caches: ordinary stores pay an invalidation for each where the cores share no
 * cache, streaming stores lose where they do (this VM: either, run to run), so the copy uses the
 * way measured cheaper (wins.way_cost). A rank's input slice s is rewritten (in place) only by rank s's copy of chunk c,
 * after the step that follows everyone's reduction of c; rank r writes its slice r of chunk
 * c+1 while peers copy chunk c. */
_DDP_PRIVATE ddp_result_t _ddp_shm_all_reduce_direct(_ddp_shm_t *sp, unsigned char *dst, size_t count,
                                                     ddp_dtype_t dtype, ddp_op_t op,
                                                     const _ddp_transport_sig_t *sig) {
    const size_t es = ddp_dtype_size(dtype);
    const int p = sp->nranks, me = sp->rank;
    const size_t zc = sp->zc_chunk < sp->chunk * (size_t)p ? sp->zc_chunk : sp->chunk * (size_t)p;
    const size_t per = zc / es, nchunks = (count + per - 1) / per;
    unsigned char *const *out = sp->wins.dst;
    ddp_result_t r;
    size_t ci;
    int q, streamed = 0;
    for (ci = 0; ci < nchunks; ci++) {
        const size_t off = ci * per, n = count - off < per ? count - off : per;
        const size_t lo = n * (size_t)me / (size_t)p, hi = n * (size_t)(me + 1) / (size_t)p;
        const int way = _ddp_shm_win_way(&sp->wins);
        int64_t t0;
        if (hi > lo) {
            const size_t at = (off + lo) * es;
            _ddp_shm_win_fold(sp, dst + at, at, hi - lo, dtype, op);
        }
        _ddp_shm_signal(sp, sig);
        if ((r = _ddp_shm_wait_all(sp, sig, "reduce", ci, nchunks)) != DDP_SUCCESS) return r;
        t0 = _ddp_now_ns();
        for (q = 0; q < p; q++) {
            const size_t ql = n * (size_t)q / (size_t)p, qh = n * (size_t)(q + 1) / (size_t)p;
            if (q == me || qh == ql) continue;
            _ddp_shm_copy_out(dst + (off + ql) * es, out[q] + (off + ql) * es, (qh - ql) * es, way);
        }
        _ddp_shm_win_way_learn(&sp->wins, way, _ddp_now_ns() - t0, (n - (hi - lo)) * es);
        streamed |= way;
    }
    if (streamed) _ddp_shm_stream_fence();
    return _ddp_shm_win_done(sp, sig);
}

/* Zero-copy all-reduce by pushing, every rank's buffers in windows (after the call's first
 * step, which says every rank is in the call: inputs final, outputs free). Rank r alone reads
 * slice r of every rank's input and alone writes slice r of every rank's output: it reduces the
 * slice, in rank order (the bits of the staged path), a piece at a time into its own output
 * (the piece stays in its cache), then copies the piece into every other rank's output. No
 * line is read by one rank and then written by another within the call, and no step is needed
 * between pieces: two steps per call (the first and _ddp_shm_win_done), whatever the size. In
 * place, from rank 2 on the sum would overwrite our input before adding it: it waits in our
 * staging buffer. Stores into the peers' outputs stream from DDP_SHM_STREAM_MIN (they will be
 * read by their owners, not by us); pieces are 64 KiB below it (the piece stays in L2 for its
 * p - 1 copies: 1.01-1.11x 512 KiB pieces at 256 KiB-4 MiB), DDP_SHM_CHUNK from it (1.06-1.28x
 * 64 KiB ones at 8-32 MiB; p = 2 and 4, this 2-vCPU VM). Out of place from DDP_SHM_STREAM_MIN,
 * the sum goes to our staging buffer first and streams into every output, ours included: an
 * ordinary store into our output (not in any cache) reads each line first, a quarter more memory
 * traffic at p = 2 (1.05-1.38x faster at 8-256 MiB, p = 2, bench/shm_zero_copy.sh ZC_B_BIN).
 * In place on every rank nothing streams, whatever the size: every line we write is one we
 * have just read (slice r of every buffer), still in our cache, where an ordinary store costs
 * no read and a streaming one would evict it (p = 2, 8-32 MiB: 1.20-1.37x; p = 4: 0.92-1.10). */
_DDP_PRIVATE ddp_result_t _ddp_shm_all_reduce_push(_ddp_shm_t *sp, unsigned char *dst, size_t count,
                                                   ddp_dtype_t dtype, ddp_op_t op, int stream,
                                                   const _ddp_transport_sig_t *sig) {
    const size_t es = ddp_dtype_size(dtype);
    const int p = sp->nranks, me = sp->rank;
    const size_t lo = count * (size_t)me / (size_t)p, hi = count * (size_t)(me + 1) / (size_t)p;
    const unsigned char *const *src = sp->wins.src;
    unsigned char *const *out = sp->wins.dst;
    size_t a, want, piece;
    int q, in_place = 1, via_stage;
    for (q = 0; q < p; q++) in_place &= src[q] == out[q];
    stream = stream && !in_place;
    want = sp->zc_piece ? sp->zc_piece : stream ? sp->chunk : 64u << 10;
    piece = (want < sp->chunk ? want : sp->chunk) / es;
    via_stage = stream && src[me] != dst;
    for (a = lo; a < hi; a += piece) {
        const size_t n = hi - a < piece ? hi - a : piece, at = a * es;
        unsigned char *acc = via_stage ? _ddp_shm_stage(sp, sp->mine, sp->nchunk) : dst + at;
        _ddp_shm_win_fold(sp, acc, at, n, dtype, op);
        for (q = 0; q < p; q++)
            if (q != me || via_stage) _ddp_shm_copy_out(q == me ? dst + at : out[q] + at, acc, n * es, stream);
    }
    if (stream) _ddp_shm_stream_fence();   /* before the signal: the owners read it next */
    return _ddp_shm_win_done(sp, sig);
}

/* All-reduce up to DDP_SHM_SMALL_MAX: one step, everyone reduces everything, in rank order (the
 * same bits everywhere). */
_DDP_PRIVATE ddp_result_t _ddp_shm_all_reduce_small(_ddp_shm_t *sp, const unsigned char *src, unsigned char *dst,
                                                    size_t count, ddp_dtype_t dtype, ddp_op_t op,
                                                    const _ddp_transport_sig_t *sig) {
    const size_t bytes = count * ddp_dtype_size(dtype);
    unsigned char *mine = _ddp_shm_stage(sp, sp->mine, sp->nchunk);
    ddp_result_t r;
    int q;
    if (bytes) memcpy(mine, src, bytes);
    _ddp_shm_signal(sp, sig);
    if ((r = _ddp_shm_wait_all(sp, sig, "exchange", 0, 1)) != DDP_SUCCESS) return r;
    if (bytes) {
        ddp_reduce_local(dst, _ddp_shm_peer_stage(sp, 0, sp->nchunk), _ddp_shm_peer_stage(sp, 1, sp->nchunk),
                         count, dtype, op);
        for (q = 2; q < sp->nranks; q++)
            ddp_reduce_local(dst, dst, _ddp_shm_peer_stage(sp, q, sp->nchunk), count, dtype, op);
        if (op == DDP_AVG) ddp_divide_local(dst, count, dtype, sp->nranks);
    }
    sp->nchunk++;
    return DDP_SUCCESS;
}

/* The staged all-reduce's last part of a chunk: the other slices out of their owners' staging
 * (streaming stores for big outputs; in place with our input read by the others, the way
 * measured cheaper); 1 when streaming stores were used. */
_DDP_PRIVATE int _ddp_shm_ar_copy_out(_ddp_shm_t *sp, unsigned char *dst, size_t off, size_t n, size_t es,
                                      int stream, int overwrite_read) {
    const int p = sp->nranks, out_way = stream ? 1 : overwrite_read ? _ddp_shm_win_way(&sp->wins) : 0;
    const int64_t c0 = overwrite_read && !stream ? _ddp_now_ns() : 0;
    size_t mine = 0;
    int q;
    for (q = 0; q < p; q++) {
        size_t ql = n * (size_t)q / (size_t)p, qh = n * (size_t)(q + 1) / (size_t)p;
        if (q == sp->rank) mine = qh - ql;
        if (q == sp->rank || qh == ql) continue;
        _ddp_shm_copy_out(dst + (off + ql) * es, _ddp_shm_peer_stage(sp, q, sp->nchunk) + ql * es,
                          (qh - ql) * es, out_way);
    }
    if (c0) _ddp_shm_win_way_learn(&sp->wins, out_way, _ddp_now_ns() - c0, (n - mine) * es);
    return out_way;
}

_DDP_PRIVATE ddp_result_t _ddp_shm_all_reduce(void *state, const void *sendbuf, void *recvbuf,
                                              size_t count, ddp_dtype_t dtype, ddp_op_t op) {
    _ddp_shm_t *sp = (_ddp_shm_t *)state;
    const size_t es = ddp_dtype_size(dtype), bytes = count * es;
    const int p = sp->nranks, me = sp->rank;
    const unsigned char *src = (const unsigned char *)sendbuf;
    unsigned char *dst = (unsigned char *)recvbuf;
    _ddp_transport_sig_t sig;
    ddp_result_t r;
    int q;
    _ddp_transport_sig_set(&sig, DDP_CALL_ALL_REDUCE, dtype, op, count, 0);
    if (bytes <= sp->small_max) return _ddp_shm_all_reduce_small(sp, src, dst, count, dtype, op, &sig);
    {
        /* Chunks of whole elements; slice q of a chunk = elements [q*n/p, (q+1)*n/p). Our own
         * slice is never copied in: we reduce it straight from sendbuf (read before recvbuf is
         * written, so in place works). Outputs of big messages go out with streaming stores:
         * they will not be read back soon, and skipping the read-for-ownership saves a third
         * of the memory traffic of the copy-out. A rank whose sendbuf is in a window copies
         * nothing in: the others read its slices there (they are rewritten, in place, only
         * after the step that follows everyone's reduction of the chunk). */
        const size_t per = sp->chunk / es, nchunks = (count + per - 1) / per;
        const int stream = bytes >= sp->stream_min;
        /* In place below DDP_SHM_ZC_MIN (when set) the input is published as ordinary memory
         * (staged): its slices would be overwritten right after their owners read them, which
         * measured slower than staging them (0.72-0.91 of it at 256 KiB..4 MiB). */
        const int reg = sendbuf == recvbuf && bytes < sp->zc_min ? _ddp_shm_win_publish(sp, NULL, 0, NULL, 0)
                                                                 : _ddp_shm_win_publish(sp, sendbuf, bytes, recvbuf, bytes);
        /* In place with our input read by the others, slice q of our output overwrites lines
         * rank q just read (and caches): ordinary or streaming stores, as measured cheaper. */
        const int overwrite_read = reg && sendbuf == recvbuf;
        int direct = 0, streamed = 0;
        size_t ci;
        for (ci = 0; ci < nchunks; ci++) {
            const size_t off = ci * per, n = count - off < per ? count - off : per;
            const size_t lo = n * (size_t)me / (size_t)p, hi = n * (size_t)(me + 1) / (size_t)p;
            unsigned char *mine = _ddp_shm_stage(sp, sp->mine, sp->nchunk);
            const int way = !reg && n * es >= (64u << 10) ? _ddp_shm_copyin_pick(sp) : -1;
            int64_t t0 = way >= 0 ? _ddp_now_ns() : 0, t1;
            if (!reg && lo) _ddp_shm_copy_out(mine, src + off * es, lo * es, way == 1);
            if (!reg && hi < n) _ddp_shm_copy_out(mine + hi * es, src + (off + hi) * es, (n - hi) * es, way == 1);
            if (way == 1) _ddp_shm_stream_fence();   /* before the signal: peers read it next */
            t1 = way >= 0 ? _ddp_now_ns() : 0;
            _ddp_shm_signal(sp, &sig);
            if ((r = _ddp_shm_wait_all(sp, &sig, "copy-in", ci, nchunks)) != DDP_SUCCESS) return r;
            if (ci == 0 && (direct = _ddp_shm_win_resolve(sp, bytes, bytes)) & 2 && bytes >= sp->zc_min)
                return sp->zc_push ? _ddp_shm_all_reduce_push(sp, dst, count, dtype, op, stream, &sig)
                                   : _ddp_shm_all_reduce_direct(sp, dst, count, dtype, op, &sig);
            t0 -= _ddp_now_ns() - t1;                /* the wait does not count */
            if (hi > lo) {
                /* In rank order (our own slice straight from sendbuf), as the small path: every
                 * element gets the same additions wherever the chunks and slices fall, so a
                 * bucket of a flat buffer gets the bits of an all-reduce of the whole. */
                unsigned char *acc = mine + lo * es;
                const unsigned char *own = src + (off + lo) * es;
#define _DDP_SHM_AR_IN(q) ((q) == me ? own : direct && sp->wins.src[q] ? sp->wins.src[q] + (off + lo) * es \
                                             : _ddp_shm_peer_stage(sp, (q), sp->nchunk) + lo * es)
                ddp_reduce_local(acc, _DDP_SHM_AR_IN(0), _DDP_SHM_AR_IN(1), hi - lo, dtype, op);
                for (q = 2; q < p; q++) ddp_reduce_local(acc, acc, _DDP_SHM_AR_IN(q), hi - lo, dtype, op);
#undef _DDP_SHM_AR_IN
                if (op == DDP_AVG) ddp_divide_local(acc, hi - lo, dtype, p);
            }
            if (way >= 0) _ddp_shm_copyin_learn(sp, way, _ddp_now_ns() - t0, n * es);
            _ddp_shm_signal(sp, &sig);
            if (hi > lo) _ddp_shm_copy_out(dst + (off + lo) * es, mine + lo * es, (hi - lo) * es, stream);
            if ((r = _ddp_shm_wait_all(sp, &sig, "reduce", ci, nchunks)) != DDP_SUCCESS) return r;
            streamed |= _ddp_shm_ar_copy_out(sp, dst, off, n, es, stream, overwrite_read);
            sp->nchunk++;
        }
        if (streamed) _ddp_shm_stream_fence();
        /* Windows were read only before each chunk's second step: after the last one, nobody
         * reads ours any more. */
    }
    return DDP_SUCCESS;
}

_DDP_PRIVATE ddp_result_t _ddp_shm_reduce_scatter(void *state, const void *sendbuf, void *recvbuf,
                                                  size_t rc, ddp_dtype_t dtype, ddp_op_t op) {
    _ddp_shm_t *sp = (_ddp_shm_t *)state;
    const size_t es = ddp_dtype_size(dtype);
    const int p = sp->nranks, me = sp->rank;
    const size_t per = sp->chunk / es / (size_t)p, nchunks = rc ? (rc + per - 1) / per : 1;
    const unsigned char *src = (const unsigned char *)sendbuf;
    unsigned char *dst = (unsigned char *)recvbuf;
    _ddp_transport_sig_t sig;
    ddp_result_t r;
    size_t ci;
    int q, reg, direct = 0;
    _ddp_transport_sig_set(&sig, DDP_CALL_REDUCE_SCATTER, dtype, op, rc, 0);
    /* A rank whose sendbuf is in a window copies nothing in: the others read their blocks there. */
    reg = _ddp_shm_win_publish(sp, sendbuf, rc * (size_t)p * es, recvbuf, rc * es);
    for (ci = 0; ci < nchunks; ci++) {
        const size_t off = ci * per, n = rc - off < per ? rc - off : per;
        unsigned char *mine = _ddp_shm_stage(sp, sp->mine, sp->nchunk);
        /* Staging holds [block q][n]: publish the parts the others own. */
        for (q = 0; q < p && !reg; q++)
            if (q != me && n) memcpy(mine + (size_t)q * n * es, src + ((size_t)q * rc + off) * es, n * es);
        _ddp_shm_signal(sp, &sig);
        if ((r = _ddp_shm_wait_all(sp, &sig, "exchange", ci, nchunks)) != DDP_SUCCESS) return r;
        if (ci == 0) direct = _ddp_shm_win_resolve(sp, rc * (size_t)p * es, rc * es);
        if (n) {
            /* In rank order, as the all-reduce (the same bits as any rank-order reduction: ZeRO-1
             * equals replicated training). Our own part comes straight from sendbuf; in place,
             * recvbuf is our block of sendbuf (NCCL's layout), and from rank 2 on the sum
             * would overwrite it before adding it: it waits in our unused staging block. */
            const unsigned char *own = src + ((size_t)me * rc + off) * es;
            unsigned char *out = dst + off * es;
            if (me >= 2 && own == out) {
                memcpy(mine + (size_t)me * n * es, own, n * es);
                own = mine + (size_t)me * n * es;
            }
#define _DDP_SHM_RS_IN(q) ((q) == me ? own : direct && sp->wins.src[q] ? sp->wins.src[q] + ((size_t)me * rc + off) * es \
                                     : _ddp_shm_peer_stage(sp, (q), sp->nchunk) + (size_t)me * n * es)
            ddp_reduce_local(out, _DDP_SHM_RS_IN(0), _DDP_SHM_RS_IN(1), n, dtype, op);
            for (q = 2; q < p; q++) ddp_reduce_local(out, out, _DDP_SHM_RS_IN(q), n, dtype, op);
#undef _DDP_SHM_RS_IN
            if (op == DDP_AVG) ddp_divide_local(out, n, dtype, p);
        }
        sp->nchunk++;
    }
    return direct ? _ddp_shm_win_done(sp, &sig) : DDP_SUCCESS;
}

_DDP_PRIVATE ddp_result_t _ddp_shm_all_gather(void *state, const void *sendbuf, void *recvbuf,
                                              size_t sc, ddp_dtype_t dtype) {
    _ddp_shm_t *sp = (_ddp_shm_t *)state;
    const size_t es = ddp_dtype_size(dtype);
    const int p = sp->nranks, me = sp->rank;
    const size_t per = sp->chunk / es, nchunks = sc ? (sc + per - 1) / per : 1;
    const unsigned char *src = (const unsigned char *)sendbuf;
    unsigned char *dst = (unsigned char *)recvbuf;
    _ddp_transport_sig_t sig;
    ddp_result_t r;
    size_t ci;
    int q, reg, direct = 0;
    _ddp_transport_sig_set(&sig, DDP_CALL_ALL_GATHER, dtype, DDP_SUM, sc, 0);
    /* A rank whose sendbuf is in a window copies nothing in: the others copy from there. */
    reg = _ddp_shm_win_publish(sp, sendbuf, sc * es, recvbuf, sc * (size_t)p * es);
    for (ci = 0; ci < nchunks; ci++) {
        const size_t off = ci * per, n = sc - off < per ? sc - off : per;
        unsigned char *mine = _ddp_shm_stage(sp, sp->mine, sp->nchunk);
        if (n && !reg) memcpy(mine, src + off * es, n * es);
        _ddp_shm_signal(sp, &sig);
        if ((r = _ddp_shm_wait_all(sp, &sig, "exchange", ci, nchunks)) != DDP_SUCCESS) return r;
        if (ci == 0) direct = _ddp_shm_win_resolve(sp, sc * es, sc * (size_t)p * es);
        for (q = 0; q < p && n; q++) {
            unsigned char *out = dst + ((size_t)q * sc + off) * es;
            const unsigned char *from = q == me ? src + off * es
                                        : direct && sp->wins.src[q] ? sp->wins.src[q] + off * es
                                        : _ddp_shm_peer_stage(sp, q, sp->nchunk);
            if (out != from) memmove(out, from, n * es);   /* in place: NCCL's recvbuf + rank*sc */
        }
        sp->nchunk++;
    }
    return direct ? _ddp_shm_win_done(sp, &sig) : DDP_SUCCESS;
}

_DDP_PRIVATE ddp_result_t _ddp_shm_broadcast(void *state, const void *sendbuf, void *recvbuf,
                                             size_t count, ddp_dtype_t dtype, int root) {
    _ddp_shm_t *sp = (_ddp_shm_t *)state;
    const size_t es = ddp_dtype_size(dtype);
    const size_t per = sp->chunk / es, nchunks = count ? (count + per - 1) / per : 1;
    const int isroot = sp->rank == root;
    _ddp_transport_sig_t sig;
    ddp_result_t r;
    size_t ci;
    int reg, direct = 0;
    _ddp_transport_sig_set(&sig, DDP_CALL_BROADCAST, dtype, DDP_SUM, count, root);
    /* A root whose sendbuf is in a window copies nothing in: the others copy from there. */
    reg = _ddp_shm_win_publish(sp, isroot ? sendbuf : NULL, isroot ? count * es : 0, recvbuf, count * es);
    for (ci = 0; ci < nchunks; ci++) {
        const size_t off = ci * per, n = count - off < per ? count - off : per;
        if (isroot && n) {
            if (!reg) memcpy(_ddp_shm_stage(sp, sp->mine, sp->nchunk), (const unsigned char *)sendbuf + off * es, n * es);
            if (recvbuf != sendbuf)
                memcpy((unsigned char *)recvbuf + off * es, (const unsigned char *)sendbuf + off * es, n * es);
        }
        _ddp_shm_signal(sp, &sig);
        if ((r = _ddp_shm_wait_all(sp, &sig, "exchange", ci, nchunks)) != DDP_SUCCESS) return r;
        if (ci == 0) direct = _ddp_shm_win_resolve(sp, count * es, count * es);
        if (!isroot && n)
            memcpy((unsigned char *)recvbuf + off * es,
                   direct && sp->wins.src[root] ? sp->wins.src[root] + off * es
                                                : _ddp_shm_peer_stage(sp, root, sp->nchunk), n * es);
        sp->nchunk++;
    }
    return direct ? _ddp_shm_win_done(sp, &sig) : DDP_SUCCESS;
}

/* ---- registered buffers: the provider's calls (ddp_window.h runs the agreements between) */
_DDP_PRIVATE ddp_result_t _ddp_shm_win_create_cb(void *state, size_t bytes, void **ptr, void **win) {
    _ddp_shm_t *sp = (_ddp_shm_t *)state;
    _ddp_shm_win_t *w;
    ddp_result_t r;
    *ptr = *win = NULL;
    if (!sp->coll_enabled) return DDP_ERR_UNSUPPORTED;
    if ((r = _ddp_shm_win_create(sp->ctx, &sp->wins, _ddp_shm_win_slot(sp->me), bytes, &w)) != DDP_SUCCESS)
        return r;
    *ptr = w->base[sp->rank];
    *win = w;
    return DDP_SUCCESS;
}

_DDP_PRIVATE ddp_result_t _ddp_shm_win_map_cb(void *state, void *win, char *why, size_t cap) {
    _ddp_shm_t *sp = (_ddp_shm_t *)state;
    _ddp_shm_win_t *w = (_ddp_shm_win_t *)win;
    const char *s = getenv("DDP_SHM_WINDOW");
    int q;
    if (s && !strcmp(s, "0")) {
        snprintf(why, cap, "DDP_SHM_WINDOW=0 on rank %d", sp->rank);
        return DDP_ERR_UNSUPPORTED;
    }
    for (q = 0; q < sp->nranks; q++) {
        if (q == sp->rank) continue;
        if (!_ddp_shm_win_map_peer(sp->ctx, w, q, _ddp_shm_pid_of(sp, q),
                                   _ddp_shm_win_slot(_ddp_shm_hdr_of(sp, q)), why, cap)) {
            _ddp_shm_win_unmap_peers(sp->ctx, w);
            return DDP_ERR_UNSUPPORTED;
        }
    }
    return DDP_SUCCESS;
}

_DDP_PRIVATE void _ddp_shm_win_use_cb(void *state, void *win, int every) {
    _ddp_shm_t *sp = (_ddp_shm_t *)state;
    _ddp_shm_win_t *w = (_ddp_shm_win_t *)win;
    if (!every) { _ddp_shm_win_unmap_peers(sp->ctx, w); return; }
    w->usable = 1;
    sp->wins.nusable++;
}

_DDP_PRIVATE void _ddp_shm_win_destroy_cb(void *state, void *win) {
    _ddp_shm_t *sp = (_ddp_shm_t *)state;
    _ddp_shm_win_destroy(sp->ctx, &sp->wins, (_ddp_shm_win_t *)win);
}

_DDP_PRIVATE ddp_result_t _ddp_shm_barrier(void *state) {
    _ddp_shm_t *sp = (_ddp_shm_t *)state;
    _ddp_transport_sig_t sig;
    memset(&sig, 0, sizeof sig);
    sig.kind = DDP_CALL_BARRIER;
    _ddp_shm_signal(sp, &sig);
    return _ddp_shm_wait_all(sp, &sig, "arrive", 0, 1);
}

/* The communicator asks once this rank joined the host region (_ddp_shm_join). */
_DDP_PRIVATE ddp_result_t _ddp_shm_enable(void *state) {
    _ddp_shm_t *sp = (_ddp_shm_t *)state;
    int i, n = 0;
    if (!sp->joined || sp->nlocal != sp->nranks) return DDP_ERR_UNSUPPORTED;
    for (i = 0; i < sp->nranks; i++)
        if (i != sp->rank) sp->ring[n++] = &sp->member[sp->local_of[i]];
    sp->coll_enabled = 1;
    sp->zc_chunk = _ddp_shm_env_size("DDP_SHM_ZC_CHUNK", 4 * sp->chunk, 4096, (size_t)1 << 40) & ~(size_t)63;
    sp->zc_min = _ddp_shm_env_size("DDP_SHM_ZC_MIN", 0, 1, (size_t)1 << 62);
    sp->zc_piece = _ddp_shm_env_size("DDP_SHM_ZC_PIECE", 0, 256, 64u << 20) & ~(size_t)63;
    sp->zc_push = !getenv("DDP_SHM_ZC_PUSH") || strcmp(getenv("DDP_SHM_ZC_PUSH"), "0") != 0;
    _DDP_TLOG(sp->ctx, DDP_LOG_INFO, "shm: collectives in shared memory: all-reduce up to %zu "
              "bytes: every rank reduces all (1 step); above: reduce-scatter + all-gather through "
              "%zu-byte staging chunks (2 steps per chunk); DDP_SHM_COLL=0 for the ring",
              sp->small_max, sp->chunk);
    return DDP_SUCCESS;
}

static const ddp_coll_provider_t _ddp_shm_coll = {
    _ddp_shm_all_reduce, _ddp_shm_reduce_scatter, _ddp_shm_all_gather, _ddp_shm_broadcast,
    _ddp_shm_barrier, _ddp_shm_enable, _ddp_shm_join,
    _ddp_shm_win_create_cb, _ddp_shm_win_map_cb, _ddp_shm_win_use_cb, _ddp_shm_win_destroy_cb,
};

static const ddp_transport_t _ddp_shm_transport = {
    DDP_TRANSPORT_VERSION, "shm", 20,
    _ddp_shm_init, _ddp_shm_reachable, _ddp_shm_connect, _ddp_shm_accept,
    NULL, NULL, _ddp_transport_isend, _ddp_transport_irecv, _ddp_transport_test, _ddp_shm_wait,
    _ddp_shm_close, _ddp_shm_finalize, _ddp_shm_abort, &_ddp_shm_coll, NULL,
};

DDP_API const ddp_transport_t *ddp_transport_shm(void) { return &_ddp_shm_transport; }

_DDP_TRANSPORT_CONSTRUCTOR(_ddp_shm_register) { ddp_transport_register(&_ddp_shm_transport); }

#endif /* DDP_SHM implementation */
