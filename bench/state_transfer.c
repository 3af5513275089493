/* SPDX-License-Identifier: MIT (see LICENSE) */
/* bench/state_transfer.c — ddp-state-transfer: how fast ddp_state_sync brings a joiner level
 * with the ranks that hold the state, against what this host's links can do, measured in the
 * same run.
 *
 *   make build/ddp-state-transfer
 *   build/ddp-state-transfer                    # 4 ranks, 256 MiB from 3 senders to 1 receiver
 *   build/ddp-state-transfer -p 5 -s 3 -b 64M -r 5 -t tcp
 *
 * For each transport (-t, default "tcp,shm": DDP_TRANSPORT for the ranks), p ranks are forked on
 * this host; ranks [0, s) hold a state of -b bytes in five buffers (two of 100 MiB at the
 * default size, the rest, and two 8-byte counters), the others receive it into buffers they
 * allocated and touched beforehand (as a joiner's model would be). Each repetition (-r, default
 * 3): a barrier, one ddp_state_sync (verified), its time = the slowest rank's
 * report.seconds; GB/s = the state's bytes / that time (GB = 1e9 B). The receivers' buffers are
 * compared with the senders' pattern after the last one.
 * References, in the same run and the same repetitions, median reported:
 *   tcp loopback   one sender process, one receiver process, one TCP connection over
 *                  127.0.0.1 (TCP_NODELAY, Linux autotuned buffers), -b bytes from one
 *                  memory-resident buffer into another, in 4 MiB send/recv calls, timed until
 *                  the receiver's 1-byte acknowledgement of the last byte (bench/tcp_stream.c's
 *                  method): what one stream can carry into one receiver
 *   memcpy         -b bytes copied by one thread between two buffers (what shm's copy into the
 *                  receiver costs at memory speed: the receiver's limit)
 *   digest         ddp_state_digest over -b bytes (the hashing each byte gets once per side)
 * Ratios: tcp state / tcp loopback, shm state / memcpy.
 */
#define _GNU_SOURCE
#define DDP_IMPLEMENTATION
#include "ddp.h"
#include "transports/ddp_tcp.h"
#include "transports/ddp_shm.h"
#include "bench/bench_fork.h"
#include "bench/bench_cli.h"

#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#define MAXREPS 21
#define NBUF 5

typedef struct {
    int nranks, senders, reps;
    size_t bytes, piece;
    char transports[64];
} opts_t;

typedef struct {                 /* MAP_SHARED: the ranks' results for the parent */
    double seconds[MAXREPS][16];
    int ok[16];
    char err[16][256];
} shared_t;
static shared_t *g_sh;

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* The state: two big buffers, the rest, two 8-byte counters (step, sampler position). */
static void layout(size_t total, size_t *sizes) {
    size_t big = total >= 64 ? (total - 16) * 100 / 256 : 0;
    sizes[0] = big;
    sizes[1] = big;
    sizes[2] = total >= 64 ? total - 16 - 2 * big : total;
    sizes[3] = sizes[4] = total >= 64 ? 8 : 0;
}

static unsigned char pat(int b, size_t j) { return (unsigned char)(j * 131 + (size_t)b * 17 + (j >> 12)); }

static int run_rank(void *arg, int n, int rank, int port) {
    const opts_t *o = (const opts_t *)arg;
    ddp_comm_desc_t d;
    ddp_comm_t *c;
    ddp_state_buf_t bufs[NBUF];
    ddp_state_report_t rep;
    ddp_state_opts_t so;
    size_t sizes[NBUF], j;
    int b, i, bad = 0;
    memset(&d, 0, sizeof d);
    if (!(c = bench_ddp_init(&d, n, rank, port, "ddp-state-transfer"))) return 1;
    layout(o->bytes, sizes);
    for (b = 0; b < NBUF; b++) {
        bufs[b].bytes = sizes[b];
        bufs[b].ptr = malloc(sizes[b] ? sizes[b] : 1);
        if (!bufs[b].ptr) { fprintf(stderr, "ddp-state-transfer: out of memory\n"); return 1; }
        for (j = 0; j < sizes[b]; j++) ((unsigned char *)bufs[b].ptr)[j] = rank < o->senders ? pat(b, j) : 0;
    }
    memset(&so, 0, sizeof so);
    so.piece_bytes = o->piece;
    for (i = 0; i < o->reps; i++) {
        ddp_result_t r = ddp_barrier(c);
        if (r == DDP_SUCCESS) r = ddp_state_sync(c, o->senders, bufs, NBUF, &so, &rep);
        if (r != DDP_SUCCESS) {
            snprintf(g_sh->err[rank], sizeof g_sh->err[rank], "%.250s", ddp_comm_last_error(c));
            return 1;
        }
        g_sh->seconds[i][rank] = rep.seconds;
    }
    for (b = 0; b < NBUF && !bad; b++)
        for (j = 0; j < sizes[b]; j++)
            if (((unsigned char *)bufs[b].ptr)[j] != pat(b, j)) { bad = 1; break; }
    g_sh->ok[rank] = !bad;
    for (b = 0; b < NBUF; b++) free(bufs[b].ptr);
    ddp_comm_destroy(c);
    return bad;
}

/* ---- the references ---- */
static void die(const char *what) {
    perror(what);
    exit(1);
}

static void send_all(int fd, const unsigned char *p, size_t len) {
    while (len) {
        ssize_t k = send(fd, p, len < ((size_t)4 << 20) ? len : (size_t)4 << 20, MSG_NOSIGNAL);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) die("send");
        p += k;
        len -= (size_t)k;
    }
}

static void recv_all(int fd, unsigned char *p, size_t len) {
    while (len) {
        ssize_t k = recv(fd, p, len < ((size_t)4 << 20) ? len : (size_t)4 << 20, 0);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) die("recv");
        p += k;
        len -= (size_t)k;
    }
}

/* One stream of `bytes`, reps times: the seconds of each into secs. */
static void tcp_loopback(size_t bytes, int reps, double *secs) {
    struct sockaddr_in a;
    socklen_t len = sizeof a;
    int one = 1, lfd = socket(AF_INET, SOCK_STREAM, 0), fd, i;
    unsigned char *buf = (unsigned char *)malloc(bytes), ack = 0;
    pid_t pid;
    if (lfd < 0 || !buf) die("tcp_loopback");
    memset(buf, 1, bytes);
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(lfd, (struct sockaddr *)&a, sizeof a) != 0 || listen(lfd, 1) != 0 ||
        getsockname(lfd, (struct sockaddr *)&a, &len) != 0)
        die("bind");
    fflush(stdout);
    if ((pid = fork()) == 0) {   /* the receiver, into its own buffer */
        unsigned char *rb = (unsigned char *)malloc(bytes);
        int s = accept(lfd, NULL, NULL);
        if (s < 0 || !rb) _exit(1);
        memset(rb, 0, bytes);
        setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        for (i = 0; i < reps; i++) {
            if (send(s, &ack, 1, MSG_NOSIGNAL) != 1) _exit(1);   /* ready */
            recv_all(s, rb, bytes);
            if (send(s, &ack, 1, MSG_NOSIGNAL) != 1) _exit(1);   /* all of it arrived */
        }
        _exit(0);
    }
    close(lfd);
    fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a) != 0) die("connect");
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    for (i = 0; i < reps; i++) {
        double t;
        recv_all(fd, &ack, 1);
        t = bench_fork_now_s();
        send_all(fd, buf, bytes);
        recv_all(fd, &ack, 1);
        secs[i] = bench_fork_now_s() - t;
    }
    close(fd);
    waitpid(pid, NULL, 0);
    free(buf);
}

static void copy_and_hash(size_t bytes, int reps, double *copy, double *hash) {
    unsigned char *src = (unsigned char *)malloc(bytes), *dst = (unsigned char *)malloc(bytes);
    ddp_state_buf_t one;
    volatile uint64_t sink = 0;
    int i;
    if (!src || !dst) die("malloc");
    memset(src, 3, bytes);
    memset(dst, 0, bytes);
    one.ptr = src, one.bytes = bytes;
    for (i = 0; i < reps; i++) {
        double t = bench_fork_now_s();
        memcpy(dst, src, bytes);
        __asm__ __volatile__("" : : "r"(dst) : "memory");
        copy[i] = bench_fork_now_s() - t;
        t = bench_fork_now_s();
        sink += ddp_state_digest(&one, 1);
        hash[i] = bench_fork_now_s() - t;
    }
    (void)sink;
    free(src);
    free(dst);
}

static size_t parse_size(const char *s) {
    char *end;
    double v = strtod(s, &end);
    switch (*end) {
    case 'k': case 'K': v *= 1024.0; end++; break;
    case 'm': case 'M': v *= 1048576.0; end++; break;
    case 'g': case 'G': v *= 1073741824.0; end++; break;
    default: break;
    }
    return (*end || v < 1 || v > 1e12) ? 0 : (size_t)v;
}

static const char usage[] =
    "usage: ddp-state-transfer [options]\n"
    "  ddp_state_sync of a state from s ranks to the others, forked on this host, against the TCP\n"
    "  loopback stream and memcpy measured in the same run (medians over the repetitions)\n"
    "  -p, --nranks N      ranks (default 4)\n"
    "  -s, --senders N     ranks that hold the state (default 3: 1 receiver)\n"
    "  -b, --bytes SIZE    the state (default 256M; K/M/G suffixes)\n"
    "  -r, --reps N        repetitions (default 3)\n"
    "  -P, --piece SIZE    ddp_state_opts_t.piece_bytes (default 0: the library's, 4M)\n"
    "  -t, --transport L   comma-separated DDP_TRANSPORT names (default tcp,shm)\n"
    "  -h, --help          this text\n"
    "      --version       the version\n";

int main(int argc, char **argv) {
    static const struct option longopts[] = {{"nranks", required_argument, NULL, 'p'},
                                             {"senders", required_argument, NULL, 's'},
                                             {"bytes", required_argument, NULL, 'b'},
                                             {"reps", required_argument, NULL, 'r'},
                                             {"transport", required_argument, NULL, 't'},
                                             {"piece", required_argument, NULL, 'P'},
                                             BENCH_CLI_COMMON,
                                             {NULL, 0, NULL, 0}};
    opts_t o;
    bench_cli_t cli;
    double lo[MAXREPS], cp[MAXREPS], hs[MAXREPS], tcp_gbs = 0, copy_gbs, hash_gbs;
    char *tok, *save = NULL, list[64];
    int opt, i, r;
    memset(&o, 0, sizeof o);
    o.nranks = 4, o.senders = 3, o.reps = 3, o.bytes = (size_t)256 << 20;
    snprintf(o.transports, sizeof o.transports, "tcp,shm");
    bench_cli_init(&cli, "ddp-state-transfer", usage, argc, argv);
    while ((opt = bench_cli_next(&cli, "+:p:s:b:r:t:P:h", longopts)) != -1) {
        if (opt == 'p' && !bench_cli_int(&cli, 2, 16, &o.nranks)) return 2;
        if (opt == 's' && !bench_cli_int(&cli, 1, 15, &o.senders)) return 2;
        if (opt == 'r' && !bench_cli_int(&cli, 1, MAXREPS, &o.reps)) return 2;
        if (opt == 'b' && !(o.bytes = parse_size(optarg))) {
            fprintf(stderr, "ddp-state-transfer: -b %s: a size from 1 byte (K/M/G suffixes)\n", optarg);
            return 2;
        }
        if (opt == 'P' && !(o.piece = parse_size(optarg))) {
            fprintf(stderr, "ddp-state-transfer: -P %s: a size from 1 byte (K/M/G suffixes)\n", optarg);
            return 2;
        }
        if (opt == 't') snprintf(o.transports, sizeof o.transports, "%s", optarg);
    }
    if (!bench_cli_end(&cli)) return cli.rc;
    if (o.senders >= o.nranks) {
        fprintf(stderr, "ddp-state-transfer: -s %d leaves no receiver among -p %d ranks\n", o.senders, o.nranks);
        return 2;
    }
    g_sh = (shared_t *)mmap(NULL, sizeof *g_sh, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (g_sh == MAP_FAILED) die("mmap");

    printf("# ddp-state-transfer: %zu bytes (%.0f MiB) from %d senders to %d receivers, %d ranks on this host, "
           "%d repetitions (medians)\n", o.bytes, (double)o.bytes / 1048576, o.senders, o.nranks - o.senders, o.nranks,
           o.reps);
    tcp_loopback(o.bytes, o.reps, lo);
    copy_and_hash(o.bytes, o.reps, cp, hs);
    tcp_gbs = (double)o.bytes / median(lo, o.reps) * 1e-9;
    copy_gbs = (double)o.bytes / median(cp, o.reps) * 1e-9;
    hash_gbs = (double)o.bytes / median(hs, o.reps) * 1e-9;
    printf("%-28s %8.2f GB/s\n", "tcp loopback (1 stream)", tcp_gbs);
    printf("%-28s %8.2f GB/s\n", "memcpy (1 thread)", copy_gbs);
    printf("%-28s %8.2f GB/s\n", "ddp_state_digest (1 thread)", hash_gbs);

    snprintf(list, sizeof list, "%s", o.transports);
    for (tok = strtok_r(list, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        double t[MAXREPS], gbs, ref;
        int port = bench_free_port(), failed;
        memset(g_sh, 0, sizeof *g_sh);
        setenv("DDP_TRANSPORT", tok, 1);
        failed = bench_fork_ranks(o.nranks, run_rank, &o, "ddp-state-transfer", port);
        for (r = 0; r < o.nranks; r++)
            if (g_sh->err[r][0]) fprintf(stderr, "ddp-state-transfer: [%s] rank %d: %s\n", tok, r, g_sh->err[r]);
        if (failed) {
            printf("%-28s failed\n", tok);
            continue;
        }
        for (i = 0; i < o.reps; i++) {
            t[i] = 0;
            for (r = 0; r < o.nranks; r++) if (g_sh->seconds[i][r] > t[i]) t[i] = g_sh->seconds[i][r];
        }
        printf("# [%s] each repetition (the slowest rank's seconds):", tok);
        for (i = 0; i < o.reps; i++) printf(" %.3f", t[i]);
        printf("; the receivers hold the senders' bytes: %s\n", g_sh->ok[o.nranks - 1] ? "yes" : "NO");
        gbs = (double)o.bytes / median(t, o.reps) * 1e-9;
        ref = !strcmp(tok, "tcp") ? tcp_gbs : copy_gbs;
        printf("%-28s %8.2f GB/s  = %.2f x %s\n", tok, gbs, gbs / ref,
               !strcmp(tok, "tcp") ? "tcp loopback" : "memcpy");
    }
    return 0;
}
