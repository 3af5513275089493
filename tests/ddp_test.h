/* SPDX-License-Identifier: MIT (see LICENSE) */
/* tests/ddp_test.h — the harness of libddp's test suite: TAP output and real multi-process runs.
 *
 * Each test binary is one .c file that does
 *
 *     #define _GNU_SOURCE
 *     #define DDP_IMPLEMENTATION
 *     #include "ddp.h"
 *     #include "transports/ddp_tcp.h"
 *     #include "tests/ddp_test.h"
 *
 * and prints TAP (run it with `prove -v build/test_X`).
 *
 * TAP:   ok(cond, fmt, ...) returns cond; diag(fmt, ...) writes a "# " line; t_done() prints the
 *        plan ("1..N" at the end, so a test may decide at run time how many checks it makes) and
 *        returns the exit status for main. Only the parent process writes to stdout.
 *
 * RANKS: t_run_ranks(p, fn, arg, timeout_s) forks p real processes; child r runs fn(r, p, arg) and
 *        exits with its return value. The parent waits with a watchdog: after timeout_s every
 *        child still alive is killed (SIGKILL) and reported, so a hung library never hangs the
 *        suite. Each run gets its own free master port (t_master_port; t_desc() fills a
 *        ddp_comm_desc_t with it). Children may call ok() and diag(): their checks are recorded
 *        in shared memory and printed by the parent, in rank order, when the run is over.
 *        t_where(fmt, ...) tells the parent what a child is doing, shown if it hangs or dies.
 *        t_shm_user(n) is MAP_SHARED memory (its first n bytes zeroed; call it before the run)
 *        for children to report results, hashes and timestamps to the parent; t_last_run says
 *        how each child ended (exit code, signal, killed by the watchdog).
 *
 * HELPERS: t_mentions_rank(msg, r) / t_mentions_int(msg, v) check that an error message names a
 *        rank or a number as a whole token; t_hash() hashes results for cross-rank comparison;
 *        t_selected(name) honours DDP_TEST_ONLY=substring (run one scenario while debugging);
 *        t_store_process() serves a store in a process of its own (any rank may then die),
 *        t_store_client() connects to it.
 *
 * Children exit with exit(), not _exit(), so that LeakSanitizer checks them too; stdout is
 * flushed before every fork so nothing is printed twice. SIGPIPE is reset to its default action
 * (t_init), so a library that lets a send raise it is caught, whatever the shell inherited.
 */
#ifndef DDP_TEST_H
#define DDP_TEST_H

#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <arpa/inet.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/wait.h>

#if defined(__GNUC__) || defined(__clang__)
#define T_PRINTF(a, b) __attribute__((format(printf, a, b)))
#define T_UNUSED __attribute__((unused))
#else
#define T_PRINTF(a, b)
#define T_UNUSED
#endif

#define T_MAX_RANKS 16
#define T_MAX_RECORDS 8192
#define T_MSG 320
#define T_USER_BYTES ((size_t)64 << 20)   /* reserved, touched only as used */

typedef struct {
    int rank, seq, kind;                  /* kind: 1 pass, 0 fail, -1 diagnostic */
    char msg[T_MSG];
} t_record_t;

typedef struct {
    int nrecords;                         /* atomically incremented by children */
    int seq[T_MAX_RANKS];
    char where[T_MAX_RANKS][T_MSG];
    t_record_t records[T_MAX_RECORDS];
} t_shm_t;

typedef struct {
    int p;
    int status[T_MAX_RANKS];              /* waitpid status */
    int exited[T_MAX_RANKS];              /* 1: exited normally (see code) */
    int code[T_MAX_RANKS];                /* exit code, or the signal number if !exited */
    int killed_by_watchdog[T_MAX_RANKS];
    int timed_out;
    double seconds;
} t_run_t;

static int t_ntests, t_nfailed;
static int t_rank = -1;                   /* in a child: its index; -1 in the parent */
static int t_master_port;
static t_shm_t *t_shm;
static unsigned char *t_user;
static t_run_t t_last_run;
/* How the last run's ranks that did not exit cleanly ended: shown on stderr with the parent's
 * next failing check (often "every rank exited cleanly"), which it explains. */
static char t_last_why[2048];
static int t_after_fail;                  /* the last check printed failed */
/* Every rank process this program forked (t_run_ranks), so that a leak check can tell what
 * this program's processes left behind from what programs beside it did. */
#define T_MAX_CHILD_PIDS 4096
static pid_t t_child_pids[T_MAX_CHILD_PIDS];
static int t_nchild_pids;

static T_UNUSED double t_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);  /* system-wide: comparable between processes */
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static T_UNUSED void t_sleep_ms(int ms) {
    struct timespec ts;
    ts.tv_sec = ms / 1000;
    ts.tv_nsec = (long)(ms % 1000) * 1000000L;
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {}
}

static T_UNUSED void t_record(int kind, const char *fmt, va_list ap) {
    int i = __atomic_fetch_add(&t_shm->nrecords, 1, __ATOMIC_SEQ_CST);
    t_record_t *r;
    if (i >= T_MAX_RECORDS) return;
    r = &t_shm->records[i];
    vsnprintf(r->msg, sizeof r->msg, fmt, ap);
    r->rank = t_rank;
    r->seq = t_shm->seq[(t_rank >= 0 && t_rank < T_MAX_RANKS) ? t_rank : 0]++;
    __atomic_store_n(&r->kind, kind, __ATOMIC_RELEASE);
}

static T_UNUSED void t_print_line(int pass, int rank, const char *msg_in) {
    char msg[1024], *q;
    snprintf(msg, sizeof msg, "%s", msg_in);
    for (q = msg; *q; q++) if (*q == '\n' || *q == '\r') *q = ' ';   /* one TAP line per check */
    t_ntests++;
    if (!pass) t_nfailed++;
    t_after_fail = !pass;
    if (!pass && rank < 0 && t_last_why[0]) {
        extern char *program_invocation_short_name;
        fprintf(stderr, "%s: # %s: %s\n", program_invocation_short_name, msg, t_last_why);
        t_last_why[0] = 0;
    }
    if (rank >= 0) printf("%s %d - [rank %d] %s\n", pass ? "ok" : "not ok", t_ntests, rank, msg);
    else printf("%s %d - %s\n", pass ? "ok" : "not ok", t_ntests, msg);
    fflush(stdout);
}

/* prove -f shows a program's "not ok" lines and its stderr, not its "#" lines. So the diagnostics
 * that explain a failure are written to stderr too, under the program's name, where prove shows
 * them: those right after a failing check, and every diagnostic of a run in which a rank's check
 * failed. */
static T_UNUSED void t_explain_if(int failed, const char *msg) {
    extern char *program_invocation_short_name;
    if (!failed) return;
    fprintf(stderr, "%s: # %s\n", program_invocation_short_name, msg);
    fflush(stderr);
}

static T_UNUSED int ok(int cond, const char *fmt, ...) T_PRINTF(2, 3);
static T_UNUSED int ok(int cond, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    if (t_rank >= 0) {
        t_record(cond ? 1 : 0, fmt, ap);
    } else {
        char msg[1024];
        vsnprintf(msg, sizeof msg, fmt, ap);
        t_print_line(cond, -1, msg);
    }
    va_end(ap);
    return cond;
}

static T_UNUSED void diag(const char *fmt, ...) T_PRINTF(1, 2);
static T_UNUSED void diag(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    if (t_rank >= 0) {
        t_record(-1, fmt, ap);
    } else {
        char msg[1024], *q;
        vsnprintf(msg, sizeof msg, fmt, ap);
        for (q = msg; *q; q++) if (*q == '\n' || *q == '\r') *q = ' ';
        printf("# %s\n", msg);
        fflush(stdout);
        t_explain_if(t_after_fail, msg);
    }
    va_end(ap);
}

static T_UNUSED void t_bail(const char *fmt, ...) T_PRINTF(1, 2);
static T_UNUSED void t_bail(const char *fmt, ...) {
    va_list ap;
    printf("Bail out! ");
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    printf("\n");
    fflush(stdout);
    exit(255);
}

/* What this child is doing now: shown by the parent if the child hangs or dies. */
static T_UNUSED void t_where(const char *fmt, ...) T_PRINTF(1, 2);
static T_UNUSED void t_where(const char *fmt, ...) {
    va_list ap;
    if (t_rank < 0 || t_rank >= T_MAX_RANKS) return;
    va_start(ap, fmt);
    vsnprintf(t_shm->where[t_rank], T_MSG, fmt, ap);
    va_end(ap);
}

static T_UNUSED int t_done(void) {
    printf("1..%d\n", t_ntests);
    if (t_nfailed) printf("# %d of %d checks failed\n", t_nfailed, t_ntests);
    fflush(stdout);
    return t_nfailed ? 1 : 0;
}

static T_UNUSED void t_init(void) {
    void *m;
    setvbuf(stdout, NULL, _IOLBF, 0);
    signal(SIGPIPE, SIG_DFL);
    if (t_shm) return;
    m = mmap(NULL, sizeof(t_shm_t) + T_USER_BYTES, PROT_READ | PROT_WRITE,
             MAP_SHARED | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) t_bail("mmap of the shared region failed: %s", strerror(errno));
    t_shm = (t_shm_t *)m;
    t_user = (unsigned char *)m + ((sizeof(t_shm_t) + 4095) & ~(size_t)4095);
}

/* The user part of the shared region; the first `zero` bytes are zeroed (parent, before fork). */
static T_UNUSED void *t_shm_user(size_t zero) {
    t_init();
    if (zero > T_USER_BYTES - 4096) t_bail("t_shm_user: %zu bytes is too much", zero);
    if (zero) memset(t_user, 0, zero);
    return t_user;
}

/* Ports. Test programs run side by side (make test runs several at once), so a port that was
 * merely free a moment ago could be taken by a neighbour before our store binds it. t_free_port
 * therefore reserves the port it returns: the probe's own socket (the wildcard address, IPv4 and
 * IPv6) is bound WITHOUT SO_REUSEADDR, which fails on any port that
 * another socket holds in any state (listening, connected, TIME_WAIT, or another test's
 * reservation); once bound it gets SO_REUSEADDR and stays open, not listening. Linux lets a
 * socket with SO_REUSEADDR (libddp's store, PyTorch's TCPStore, test_store's listeners) bind
 * beside them, since neither listens, while every other probe keeps failing on that port. The
 * last T_PORT_KEEP reservations are kept (a run uses its port long after t_free_port returned). */
#define T_PORT_KEEP 32
static int t_port_fds[T_PORT_KEEP];
static int t_port_next;

/* Binds fd to the port on the wildcard address without SO_REUSEADDR: 1 when the port was free. */
static T_UNUSED int t_port_bind(int fd, int family, int port) {
    int zero = 0;
    if (family == AF_INET) {
        struct sockaddr_in a;
        memset(&a, 0, sizeof a);
        a.sin_family = AF_INET;
        a.sin_addr.s_addr = htonl(INADDR_ANY);
        a.sin_port = htons((uint16_t)port);
        return bind(fd, (struct sockaddr *)&a, sizeof a) == 0;
    } else {
        struct sockaddr_in6 a;
        memset(&a, 0, sizeof a);
        a.sin6_family = AF_INET6;
        a.sin6_addr = in6addr_any;
        a.sin6_port = htons((uint16_t)port);
        setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
        return bind(fd, (struct sockaddr *)&a, sizeof a) == 0;
    }
}

/* Reserves the port (see above): 1 when it was free and is now held by this process. One socket:
 * IPv6 dual-stack, which covers IPv4 too, where the host has IPv6; else IPv4. */
static T_UNUSED int t_port_reserve(int port) {
    int one = 1, fd, slot, family = AF_INET6;
    fd = socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) { family = AF_INET; fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0); }
    if (fd < 0) return 0;
    if (!t_port_bind(fd, family, port)) { close(fd); return 0; }
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    slot = t_port_next++ % T_PORT_KEEP;
    if (t_port_next > T_PORT_KEEP) close(t_port_fds[slot]);   /* the oldest reservation goes */
    t_port_fds[slot] = fd;
    return 1;
}

/* In a forked rank: the parent keeps holding the reservations; the rank does not need copies
 * (a rank may run under a tight RLIMIT_NOFILE). */
static T_UNUSED void t_port_release_inherited(void) {
    int i, n = t_port_next < T_PORT_KEEP ? t_port_next : T_PORT_KEEP;
    for (i = 0; i < n; i++) close(t_port_fds[i]);
    t_port_next = 0;
}

/* A port nobody uses, reserved for this process (see above), chosen below the kernel's
 * ephemeral range (so that no socket bound to port 0, such as the TCP transport's listeners, and
 * no outgoing connection can be handed it), spread by pid. */
static T_UNUSED int t_free_port(void) {
    static unsigned counter;
    int lo = 32768, hi = 60999, base, span, i;
    FILE *f = fopen("/proc/sys/net/ipv4/ip_local_port_range", "r");
    if (f) {
        if (fscanf(f, "%d %d", &lo, &hi) != 2) { lo = 32768; hi = 60999; }
        fclose(f);
    }
    if (lo > 12000) { base = lo - 11000; span = 10000; }
    else if (hi < 54000) { base = hi + 1000; span = 10000; }
    else { base = 1024; span = lo > 2024 ? lo - 1024 : 0; }
    for (i = 0; span && i < 1000; i++) {
        int port = base + (int)(((unsigned)getpid() * 2654435761u + (counter++) * 40503u) % (unsigned)span);
        if (t_port_reserve(port)) return port;
    }
    t_bail("no free TCP port found below the ephemeral range (%d-%d)", lo, hi);
    return 0;
}

/* The scratch directory of this test program: $TMPDIR (tests/run_one.sh gives each program its
 * own and removes it afterwards), else /tmp. */
static T_UNUSED const char *t_tmpdir(void) {
    const char *d = getenv("TMPDIR");
    return d && *d ? d : "/tmp";
}

#ifdef DDP_H_INCLUDED
/* A desc for this run: loopback master on this run's port, a timeout far below the watchdog's. */
static T_UNUSED void t_desc(ddp_comm_desc_t *d, int timeout_ms) {
    memset(d, 0, sizeof *d);
    d->master_addr = "127.0.0.1";
    d->master_port = t_master_port;
    d->timeout_ms = timeout_ms;
}

/* ddp_comm_init as one check: the communicator, or NULL after a failed ok() that says why. */
/* A rendezvous store in a process of its own, as a launcher's (ddprun's): no rank serves it, so
 * any rank may die (a shrink needs it), and the test process stays single-threaded for the ranks'
 * forks (ThreadSanitizer). secret: the job's ("": none). It serves until the caller closes *stop
 * (then waitpid the pid returned); the port in *port (-1 on failure). Ranks pass a client handle
 * in desc.store (t_store_client_secret). */
static T_UNUSED pid_t t_store_process_secret(int *port, int *stop, const char *secret) {
    int up[2], down[2];
    pid_t pid;
    if (pipe(up) != 0 || pipe(down) != 0) return -1;
    fflush(stdout);
    pid = fork();
    if (pid == 0) {
        ddp_store_t *srv = NULL;
        ddp_store_desc_t sd;
        char b;
        int p = -1;
        close(up[0]);
        close(down[1]);
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        memset(&sd, 0, sizeof sd);
        sd.timeout_ms = 30000;
        sd.secret = secret;
        sd.log_level = 1;
        if (ddp_store_open(&srv, "127.0.0.1", 0, 1, &sd) == DDP_SUCCESS) p = ddp_store_port(srv);
        if (write(up[1], &p, sizeof p) != (ssize_t)sizeof p) _exit(1);
        while (read(down[0], &b, 1) > 0) {}
        if (srv) ddp_store_close(srv);
        _exit(0);
    }
    close(up[1]);
    close(down[0]);
    if (pid < 0 || read(up[0], port, sizeof *port) != (ssize_t)sizeof *port) *port = -1;
    close(up[0]);
    *stop = down[1];
    return pid;
}

static T_UNUSED pid_t t_store_process(int *port, int *stop) { return t_store_process_secret(port, stop, ""); }

/* A client of t_store_process's store (secret: the store's; requests time out after 30 s). */
static T_UNUSED ddp_result_t t_store_client_secret(ddp_store_t **st, int port, const char *secret) {
    ddp_store_desc_t sd;
    memset(&sd, 0, sizeof sd);
    sd.timeout_ms = 30000;
    sd.secret = secret;
    sd.log_level = 1;
    return ddp_store_open(st, "127.0.0.1", port, 0, &sd);
}
static T_UNUSED ddp_result_t t_store_client(ddp_store_t **st, int port) { return t_store_client_secret(st, port, ""); }

static T_UNUSED ddp_comm_t *t_comm_init(int rank, int p, const ddp_comm_desc_t *d) {
    ddp_comm_t *c = NULL;
    ddp_result_t r;
    t_where("ddp_comm_init");
    r = ddp_comm_init(&c, p, rank, d);
    if (!ok(r == DDP_SUCCESS, "ddp_comm_init rank %d of %d -> %s %s", rank, p, ddp_strerror(r),
            r ? ddp_last_init_error() : ""))
        return NULL;
    return c;
}
#endif

static T_UNUSED int t_cmp_record(const void *a, const void *b) {
    const t_record_t *x = (const t_record_t *)a, *y = (const t_record_t *)b;
    if (x->rank != y->rank) return x->rank < y->rank ? -1 : 1;
    return x->seq < y->seq ? -1 : x->seq > y->seq;
}

/* Forks p ranks running fn; returns how many did not exit with status 0 (in time). */
static T_UNUSED int t_run_ranks(int p, int (*fn)(int rank, int p, void *arg), void *arg,
                              int timeout_s) {
    pid_t pids[T_MAX_RANKS];
    int alive = 0, r, bad = 0, n;
    double t0, deadline;
    t_run_t *res = &t_last_run;
    t_init();
    if (p < 1 || p > T_MAX_RANKS) t_bail("t_run_ranks: p = %d", p);
    memset(res, 0, sizeof *res);
    res->p = p;
    /* A child killed while writing a record must not leave a stale one behind. */
    for (r = 0; r < T_MAX_RECORDS && r < t_shm->nrecords; r++) t_shm->records[r].kind = -2;
    t_shm->nrecords = 0;
    memset(t_shm->seq, 0, sizeof t_shm->seq);
    memset(t_shm->where, 0, sizeof t_shm->where);
    t_master_port = t_free_port();
    fflush(stdout);
    fflush(stderr);
    t0 = t_now();
    for (r = 0; r < p; r++) {
        pid_t pid = fork();
        if (pid < 0) {
            int k;
            for (k = 0; k < r; k++) kill(pids[k], SIGKILL);
            for (k = 0; k < r; k++) waitpid(pids[k], NULL, 0);
            t_bail("fork: %s", strerror(errno));
        }
        if (pid == 0) {
            int rc;
            prctl(PR_SET_PDEATHSIG, SIGKILL);   /* never outlive the test binary */
            t_port_release_inherited();
            t_rank = r;
            rc = fn(r, p, arg);
            fflush(stdout);
            fflush(stderr);
            exit(rc & 0xff);
        }
        pids[r] = pid;
        if (t_nchild_pids < T_MAX_CHILD_PIDS) t_child_pids[t_nchild_pids++] = pid;
        alive++;
    }
    deadline = t0 + timeout_s;
    while (alive > 0) {
        int progressed = 0;
        for (r = 0; r < p; r++) {
            int st;
            pid_t w;
            if (!pids[r]) continue;
            w = waitpid(pids[r], &st, WNOHANG);
            if (w == pids[r]) {
                res->status[r] = st;
                res->exited[r] = WIFEXITED(st);
                res->code[r] = WIFEXITED(st) ? WEXITSTATUS(st) : WIFSIGNALED(st) ? WTERMSIG(st) : -1;
                pids[r] = 0;
                alive--;
                progressed = 1;
            }
        }
        if (alive && t_now() > deadline) {
            res->timed_out = 1;
            for (r = 0; r < p; r++) {
                if (!pids[r]) continue;
                kill(pids[r], SIGKILL);
                waitpid(pids[r], &res->status[r], 0);
                res->exited[r] = 0;
                res->code[r] = SIGKILL;
                res->killed_by_watchdog[r] = 1;
                pids[r] = 0;
                alive--;
            }
        }
        if (alive && !progressed) t_sleep_ms(2);
    }
    res->seconds = t_now() - t0;
    /* The children's checks, in rank order. */
    n = t_shm->nrecords < T_MAX_RECORDS ? t_shm->nrecords : T_MAX_RECORDS;
    qsort(t_shm->records, (size_t)n, sizeof t_shm->records[0], t_cmp_record);
    for (r = 0, bad = 0; r < n; r++) bad += t_shm->records[r].kind == 0;   /* a check failed */
    for (r = 0; r < n; r++) {
        t_record_t *rec = &t_shm->records[r];
        if (rec->kind == -2) continue;
        if (rec->kind < 0) {
            char *q, line[T_MSG + 32];
            for (q = rec->msg; *q; q++) if (*q == '\n' || *q == '\r') *q = ' ';
            printf("# [rank %d] %s\n", rec->rank, rec->msg);
            snprintf(line, sizeof line, "[rank %d] %s", rec->rank, rec->msg);
            t_explain_if(bad, line);
            continue;
        }
        t_print_line(rec->kind == 1, rec->rank, rec->msg);
    }
    bad = 0;
    t_last_why[0] = 0;
    if (t_shm->nrecords > T_MAX_RECORDS)
        ok(0, "harness: %d child records, only %d kept", t_shm->nrecords, T_MAX_RECORDS);
    for (r = 0; r < p; r++) {
        if (res->exited[r] && res->code[r] == 0) continue;
        bad++;
        {
            char line[T_MSG + 128];
            size_t k = strlen(t_last_why);
            if (res->killed_by_watchdog[r])
                snprintf(line, sizeof line, "rank %d still running after %d s: killed by the watchdog (it was: %s)", r,
                         timeout_s, t_shm->where[r][0] ? t_shm->where[r] : "?");
            else if (res->exited[r])
                snprintf(line, sizeof line, "rank %d exited with status %d (last: %s)", r, res->code[r],
                         t_shm->where[r][0] ? t_shm->where[r] : "?");
            else
                snprintf(line, sizeof line, "rank %d died of signal %d (%s) (last: %s)", r, res->code[r],
                         strsignal(res->code[r]), t_shm->where[r][0] ? t_shm->where[r] : "?");
            diag("%s", line);
            snprintf(t_last_why + k, sizeof t_last_why - k, "%s%s", k ? "; " : "", line);
        }
    }
    fflush(stdout);
    return bad;
}

/* Was pid forked by this program (t_run_ranks)? */
static T_UNUSED int t_is_our_child(pid_t pid) {
    int i;
    for (i = 0; i < t_nchild_pids; i++) if (t_child_pids[i] == pid) return 1;
    return 0;
}

/* DDP_TEST_ONLY=substring runs only the scenarios whose name contains it (for debugging). */
static T_UNUSED int t_selected(const char *name) {
    const char *only = getenv("DDP_TEST_ONLY");
    return !only || !*only || strstr(name, only) != NULL;
}

/* Did rank r end by this signal? */
static T_UNUSED int t_rank_signaled(int r, int sig) {
    return !t_last_run.exited[r] && !t_last_run.killed_by_watchdog[r] && t_last_run.code[r] == sig;
}

/* Does msg mention the number v as a whole token (not inside "127" or "29500")? */
static T_UNUSED int t_mentions_int(const char *msg, int v) {
    char num[16];
    const char *s = msg;
    size_t n;
    snprintf(num, sizeof num, "%d", v);
    n = strlen(num);
    while ((s = strstr(s, num)) != NULL) {
        int before = s > msg && ((s[-1] >= '0' && s[-1] <= '9') || s[-1] == '.');
        int after = (s[n] >= '0' && s[n] <= '9') || (s[n] == '.' && s[n + 1] >= '0' && s[n + 1] <= '9');
        if (!before && !after) return 1;
        s += n;
    }
    return 0;
}

/* One line of a DDP_TRACE file: 1 and the algorithm's name in name (cut to cap - 1) when it is
 * an all-reduce event, else 0. The tests that force DDP_ALGO read back what ran with it. */
static T_UNUSED int t_trace_all_reduce_algo(const char *line, char *name, size_t cap) {
    const char *a;
    size_t len;
    if (!strstr(line, "\"name\":\"all_reduce\"") || !(a = strstr(line, "\"algorithm\":\""))) return 0;
    a += strlen("\"algorithm\":\"");
    len = strcspn(a, "\"");
    if (len > cap - 1) len = cap - 1;
    memcpy(name, a, len);
    name[len] = 0;
    return 1;
}

/* Does msg say "rank v" (also "rank(s) 1,v", "ranks v")? */
static T_UNUSED int t_mentions_rank(const char *msg, int v) {
    const char *s = msg;
    while ((s = strstr(s, "rank")) != NULL) {
        const char *q = s + 4;
        while (*q && (*q == 's' || *q == '(' || *q == ')' || *q == ' ' || *q == ':')) q++;
        for (;;) {
            char *end;
            long x;
            if (*q < '0' || *q > '9') break;
            x = strtol(q, &end, 10);
            if (x == v) return 1;
            q = end;
            if (*q == ',' || *q == ' ') { while (*q == ',' || *q == ' ') q++; continue; }
            break;
        }
        s += 4;
    }
    return 0;
}

/* A fast 64-bit hash of a buffer (results compared between ranks). */
static T_UNUSED uint64_t t_hash(const void *buf, size_t n) {
    const unsigned char *p = (const unsigned char *)buf;
    uint64_t h = 0x9e3779b97f4a7c15ull ^ (uint64_t)n;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, p + i, 8);
        h = (h ^ w) * 0xff51afd7ed558ccdull;
        h ^= h >> 29;
    }
    for (; i < n; i++) { h = (h ^ p[i]) * 0xc4ceb9fe1a85ec53ull; h ^= h >> 31; }
    return h ^ (h >> 33);
}

static T_UNUSED uint64_t t_mix64(uint64_t x) {   /* splitmix64's finaliser */
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* 1 if the peer closes fd (EOF or error) within ms: how tests see a stranger being dropped. */
static T_UNUSED int t_closed_within(int fd, int ms) {
    double t0 = t_now();
    char b[256];
    for (;;) {
        struct pollfd pfd;
        int left = ms - (int)((t_now() - t0) * 1000);
        ssize_t n;
        if (left <= 0) return 0;
        pfd.fd = fd; pfd.events = POLLIN; pfd.revents = 0;
        if (poll(&pfd, 1, left) <= 0) continue;
        n = recv(fd, b, sizeof b, MSG_DONTWAIT);
        if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) return 1;
    }
}

/* Sign- or zero-extends the low bits of an integer element (ddp.h's dtype values). */
static T_UNUSED uint64_t t_ext_int(int dt, uint64_t b) {
    switch (dt) {
    case 0 /* DDP_INT8 */: return (uint64_t)(int64_t)(int8_t)(uint8_t)b;
    case 1 /* DDP_UINT8 */: return (uint8_t)b;
    case 2 /* DDP_INT32 */: return (uint64_t)(int64_t)(int32_t)(uint32_t)b;
    case 3 /* DDP_UINT32 */: return (uint32_t)b;
    default: return b;
    }
}

#endif /* DDP_TEST_H */
