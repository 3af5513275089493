/* SPDX-License-Identifier: MIT (see LICENSE) */
/* bench/tcp_stream.c — what this machine's TCP loopback and memory can do, as references for
 * the all-reduce numbers.
 *
 *   cc -std=c99 -O2 -Wall -Wextra -Wpedantic -Werror bench/tcp_stream.c -o build/tcp_stream -lm
 *   ./build/tcp_stream [-b 64K] [-e 64M] [-f 4] [-t total_bytes] [-B sockbuf] [-J out.json]
 *   ./build/tcp_stream --bidir [-s 64K,1M,16M,64M] [-T 0.2] [-B sockbuf] [-J out.json]
 *
 * 1. stream: one sender process, one receiver process, one TCP connection over 127.0.0.1
 *    (TCP_NODELAY, blocking send/recv of whole messages). For each message size the sender
 *    writes about -t bytes (default 2G) and stops the clock when the receiver's 1-byte
 *    acknowledgement of the last byte arrives. GB/s = bytes / time, GB = 1e9 B.
 * 2. bidir: both processes send and receive at once on the same connection, each one thread
 *    with non-blocking sockets and poll (the shape of a 2-rank ring: every rank sends to and
 *    receives from its neighbour at the same time), with 512 KiB messages cycling through a
 *    512 KiB buffer (cache-resident, like a ring segment) and with 64 MiB messages (-e) through
 *    64 MiB buffers (memory-resident, like a big all-reduce). Reported per direction.
 * 3. memcpy of 64 MiB (single thread; GB/s counts the bytes copied once: the memory traffic is
 *    twice that), memcpy of 512 KiB (cache-resident), and c = a + b over 64 MiB of floats (what
 *    a reduction step costs at memory speed).
 * --bidir measures only 2., quickly, at the sizes of -s (or -b/-e/-f): per size, messages of that
 * size through buffers of that size, both directions at once, for about -T seconds (default 0.2;
 * a short untimed probe first sets how many bytes that is, at least 2 messages each way). It is
 * the limit a TCP ring all-reduce meets (`make compare` runs it beside every round).
 * Socket buffers: Linux autotuning unless -B sets SO_SNDBUF/SO_RCVBUF (as DDP_SOCKET_BUFSIZE).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_SIZES 32

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
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
    return (*end || v < 1) ? 0 : (size_t)v;
}

/* "64K,1M": the sizes into out; how many, or -1 when the list is malformed. */
static int parse_sizes(const char *s, size_t *out) {
    int n = 0;
    while (*s) {
        char one[64];
        size_t len = strcspn(s, ","), v;
        if (!len || len >= sizeof one || n == MAX_SIZES) return -1;
        memcpy(one, s, len);
        one[len] = 0;
        if (!(v = parse_size(one))) return -1;
        out[n++] = v;
        s += len;
        if (*s) s++;
    }
    return n;
}

static void die(const char *what) {
    perror(what);
    exit(1);
}

static void tune(int fd, int bufsize) {
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (bufsize > 0) {
        setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &bufsize, sizeof bufsize);
        setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &bufsize, sizeof bufsize);
    }
}

static void send_all(int fd, const void *buf, size_t len) {
    const char *p = (const char *)buf;
    while (len) {
        ssize_t n = send(fd, p, len, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) die("send");
        p += n;
        len -= (size_t)n;
    }
}

static void recv_all(int fd, void *buf, size_t len) {
    char *p = (char *)buf;
    while (len) {
        ssize_t n = recv(fd, p, len, 0);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) die("recv");
        p += n;
        len -= (size_t)n;
    }
}

static size_t msgs_for(size_t size, size_t total) {
    size_t k = (total + size - 1) / size;
    return k < 4 ? 4 : k;
}

/* Both directions at once, one thread, non-blocking: sends and receives len bytes (in msg-sized
 * recv calls, as a ring would post them). */
static void bidir(int fd, unsigned char *sbuf, unsigned char *rbuf, size_t msg, size_t len) {
    size_t sent = 0, got = 0;
    int fl = fcntl(fd, F_GETFL, 0);
    fcntl(fd, F_SETFL, fl | O_NONBLOCK);
    while (sent < len || got < len) {
        struct pollfd pfd;
        int progressed = 0;
        if (sent < len) {
            size_t off = sent % msg, want = msg - off;
            ssize_t n;
            if (want > len - sent) want = len - sent;
            n = send(fd, sbuf + off, want, MSG_NOSIGNAL | MSG_DONTWAIT);
            if (n > 0) { sent += (size_t)n; progressed = 1; }
            else if (n < 0 && errno != EAGAIN && errno != EINTR) die("send");
        }
        if (got < len) {
            size_t off = got % msg, want = msg - off;
            ssize_t n;
            if (want > len - got) want = len - got;
            n = recv(fd, rbuf + off, want, MSG_DONTWAIT);
            if (n > 0) { got += (size_t)n; progressed = 1; }
            else if (n == 0) { fprintf(stderr, "bidir: peer closed\n"); exit(1); }
            else if (errno != EAGAIN && errno != EINTR) die("recv");
        }
        if (progressed) continue;
        pfd.fd = fd;
        pfd.events = (short)((sent < len ? POLLOUT : 0) | (got < len ? POLLIN : 0));
        pfd.revents = 0;
        poll(&pfd, 1, 1000);
    }
    fcntl(fd, F_SETFL, fl);
}

/* One timed bidirectional transfer, len bytes each way in msg-sized messages: tells the receiver
 * process (len, msg), runs, waits for its acknowledgement. Returns the seconds it took. */
static double bidir_timed(int fd, unsigned char *sbuf, unsigned char *rbuf, size_t msg, size_t len) {
    uint64_t hdr[2];
    char ack;
    double t;
    hdr[0] = len;
    hdr[1] = msg;
    send_all(fd, hdr, sizeof hdr);
    t = now_s();
    bidir(fd, sbuf, rbuf, msg, len);
    recv_all(fd, &ack, 1);
    return now_s() - t;
}

/* The receiver process's side of --bidir: (len, msg) pairs until len 0. */
static void bidir_serve(int fd, unsigned char *sbuf, unsigned char *rbuf) {
    for (;;) {
        uint64_t hdr[2];
        char ack = 'k';
        recv_all(fd, hdr, sizeof hdr);
        if (!hdr[0]) return;
        bidir(fd, sbuf, rbuf, (size_t)hdr[1], (size_t)hdr[0]);
        send_all(fd, &ack, 1);
    }
}

/* --bidir: per size, a probe of at least 4 MiB (not reported; it sets the length), then about
 * secs seconds. Fills gbs (per direction), lens (bytes each way) and secs_out. */
static void bidir_sizes(int fd, unsigned char *sbuf, unsigned char *rbuf, const size_t *sizes, int nsizes,
                        double secs, double *gbs, size_t *lens, double *secs_out) {
    int i;
    for (i = 0; i < nsizes; i++) {
        size_t m = sizes[i], len = m * ((((size_t)4 << 20) + m - 1) / m), k;
        double t = bidir_timed(fd, sbuf, rbuf, m, len), want;
        int tries;
        /* The probe runs colder (slow start, page faults) than what follows: a timed run that
         * took under half the time asked for is rerun, longer, up to 3 times. Each run is at most
         * 8 times the one before: a probe that ran from cache on an idle core must not make a
         * run that takes seconds on a busy machine. */
        for (tries = 0; tries < 4; tries++) {
            size_t cap = (8 * len + m - 1) / m;
            if (t < 1e-6) t = 1e-6;
            want = (double)len / t * secs / (double)m + 0.5;
            k = want < 2 ? 2 : want > (double)cap ? cap : (size_t)want;
            if (k < 2) k = 2;
            len = k * m;
            t = bidir_timed(fd, sbuf, rbuf, m, len);
            if (t >= secs / 2 || k == 2) break;
        }
        lens[i] = len;
        secs_out[i] = t;
        gbs[i] = (double)len / t / 1e9;
        printf("  %10zu %12zu %10.3f %10.3f\n", m, lens[i], secs_out[i], gbs[i]);
        fflush(stdout);
    }
}

static double copy_bw(void *dst, const void *src, size_t n, int reps) {
    double t;
    int i;
    memcpy(dst, src, n);
    t = now_s();
    for (i = 0; i < reps; i++) {
        memcpy(dst, src, n);
        __asm__ __volatile__("" : : "r"(dst) : "memory");   /* keep every copy */
    }
    t = now_s() - t;
    return (double)n * reps / t / 1e9;
}

static double add_bw(float *c, const float *a, const float *b, size_t n, int reps) {
    double t;
    size_t i;
    int r;
    t = now_s();
    for (r = 0; r < reps; r++) {
        for (i = 0; i < n; i++) c[i] = a[i] + b[i];
        __asm__ __volatile__("" : : "r"(c) : "memory");
    }
    t = now_s() - t;
    return (double)n * sizeof(float) * reps / t / 1e9;   /* bytes of the result per second */
}

int main(int argc, char **argv) {
    size_t minb = 64u << 10, maxb = 64u << 20, total = (size_t)2 << 30, sizes[MAX_SIZES];
    double factor = 4, gbs[MAX_SIZES], bidir_gbs[2] = {0, 0}, t, bidir_secs = 0.2, times[MAX_SIZES];
    size_t bidir_msg[2], lens[MAX_SIZES];
    const char *json = NULL;
    int bufsize = 0, nsizes = 0, i, lfd, fd, one = 1, bidir_only = 0, listed = 0;
    struct sockaddr_in a;
    socklen_t al = sizeof a;
    unsigned char *buf, *rbuf;
    pid_t pid;
    double s;
    for (i = 1; i < argc; i++) {
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(argv[i], "--bidir")) { bidir_only = 1; continue; }
        if (!strcmp(argv[i], "-h") || !v) {
            fprintf(stderr, "usage: %s [-b 64K] [-e 64M] [-f 4] [-t 2G] [-B sockbuf] [-J out.json]\n"
                            "       %s --bidir [-s 64K,1M,16M,64M | -b -e -f] [-T 0.2] [-B sockbuf] [-J out.json]\n",
                    argv[0], argv[0]);
            return 2;
        }
        if (!strcmp(argv[i], "-s")) {
            listed = parse_sizes(v, sizes);
            if (listed <= 0) { fprintf(stderr, "%s: bad size list '%s' (e.g. 64K,1M,16M)\n", argv[0], v); return 2; }
        } else if (!strcmp(argv[i], "-T")) {
            bidir_secs = atof(v);
            if (!(bidir_secs > 0)) { fprintf(stderr, "%s: -T wants seconds > 0, not '%s'\n", argv[0], v); return 2; }
        } else if (!strcmp(argv[i], "-b")) minb = parse_size(v);
        else if (!strcmp(argv[i], "-e")) maxb = parse_size(v);
        else if (!strcmp(argv[i], "-f")) factor = atof(v);
        else if (!strcmp(argv[i], "-t")) total = parse_size(v);
        else if (!strcmp(argv[i], "-B")) bufsize = (int)parse_size(v);
        else if (!strcmp(argv[i], "-J")) json = v;
        else { fprintf(stderr, "%s: unknown option %s\n", argv[0], argv[i]); return 2; }
        i++;
    }
    if (!minb || !maxb || minb > maxb || factor <= 1 || !total) { fprintf(stderr, "bad arguments\n"); return 2; }
    if (listed && !bidir_only) { fprintf(stderr, "%s: -s goes with --bidir (the stream takes -b/-e/-f)\n", argv[0]); return 2; }
    if (listed) {
        nsizes = listed;
        for (maxb = 0, i = 0; i < nsizes; i++) maxb = sizes[i] > maxb ? sizes[i] : maxb;
    } else {
        for (s = (double)minb; s <= (double)maxb && nsizes < MAX_SIZES; s *= factor) sizes[nsizes++] = (size_t)s;
    }

    if (posix_memalign((void **)&buf, 4096, maxb) || posix_memalign((void **)&rbuf, 4096, maxb)) die("malloc");
    memset(buf, 1, maxb);
    memset(rbuf, 2, maxb);

    lfd = socket(AF_INET, SOCK_STREAM, 0);
    if (lfd < 0) die("socket");
    setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bufsize > 0) tune(lfd, bufsize);   /* so the accepted socket's window starts right */
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(lfd, (struct sockaddr *)&a, sizeof a) || listen(lfd, 1) ||
        getsockname(lfd, (struct sockaddr *)&a, &al)) die("listen");
    fflush(stdout);
    pid = fork();
    if (pid < 0) die("fork");
    if (pid == 0) {   /* the receiver */
        char ack = 'k';
        close(lfd);
        fd = socket(AF_INET, SOCK_STREAM, 0);
        if (fd < 0) die("socket");
        tune(fd, bufsize);
        if (connect(fd, (struct sockaddr *)&a, sizeof a)) die("connect");
        if (bidir_only) {
            bidir_serve(fd, buf, rbuf);
            close(fd);
            _exit(0);
        }
        for (i = 0; i < nsizes; i++) {
            size_t k, n = msgs_for(sizes[i], total);
            for (k = 0; k < n; k++) recv_all(fd, rbuf, sizes[i]);
            send_all(fd, &ack, 1);
        }
        for (i = 0; i < 2; i++) {
            size_t m = i == 0 ? (maxb < (512u << 10) ? maxb : (512u << 10)) : maxb;
            recv_all(fd, &ack, 1);              /* go */
            bidir(fd, buf, rbuf, m, msgs_for(m, total / 2) * m);
            send_all(fd, &ack, 1);
        }
        close(fd);
        _exit(0);
    }
    fd = accept(lfd, NULL, NULL);
    if (fd < 0) die("accept");
    close(lfd);
    tune(fd, bufsize);
    if (bidir_only) {
        uint64_t stop[2] = {0, 0};
        printf("# TCP loopback, one connection over 127.0.0.1, TCP_NODELAY, socket buffers %s: both directions "
               "at once, one thread per side, about %.2f s per size\n", bufsize > 0 ? "fixed (-B)" : "autotuned",
               bidir_secs);
        printf("# %10s %12s %10s %10s\n", "msg_bytes", "bytes_each", "time(s)", "GB/s/dir");
        bidir_sizes(fd, buf, rbuf, sizes, nsizes, bidir_secs, gbs, lens, times);
        send_all(fd, stop, sizeof stop);
        close(fd);
        waitpid(pid, NULL, 0);
        if (json) {
            FILE *f = fopen(json, "w");
            if (!f) die(json);
            fprintf(f, "{\n  \"bench\": \"tcp_stream\",\n  \"mode\": \"bidir\",\n  \"sockbuf\": %d,\n"
                       "  \"seconds_per_size\": %.3f,\n  \"bidir\": [\n", bufsize, bidir_secs);
            for (i = 0; i < nsizes; i++)
                fprintf(f, "    {\"bytes\": %zu, \"GBs_per_direction\": %.6f, \"bytes_per_direction\": %zu, "
                           "\"time_s\": %.6f}%s\n", sizes[i], gbs[i], lens[i], times[i], i + 1 < nsizes ? "," : "");
            fprintf(f, "  ]\n}\n");
            fclose(f);
        }
        free(buf);
        free(rbuf);
        return 0;
    }
    printf("# TCP loopback stream, one connection over 127.0.0.1, TCP_NODELAY, socket buffers %s\n",
           bufsize > 0 ? "fixed (-B)" : "autotuned");
    printf("# %10s %8s %10s %10s\n", "msg_bytes", "msgs", "time(s)", "GB/s");
    for (i = 0; i < nsizes; i++) {
        size_t k, n = msgs_for(sizes[i], total);
        char ack;
        t = now_s();
        for (k = 0; k < n; k++) send_all(fd, buf, sizes[i]);
        recv_all(fd, &ack, 1);
        t = now_s() - t;
        gbs[i] = (double)n * sizes[i] / t / 1e9;
        printf("  %10zu %8zu %10.3f %10.3f\n", sizes[i], n, t, gbs[i]);
        fflush(stdout);
    }
    for (i = 0; i < 2; i++) {
        char go = 'g';
        size_t m = i == 0 ? (maxb < (512u << 10) ? maxb : (512u << 10)) : maxb;
        size_t n = msgs_for(m, total / 2) * m;
        send_all(fd, &go, 1);
        t = now_s();
        bidir(fd, buf, rbuf, m, n);
        recv_all(fd, &go, 1);
        t = now_s() - t;
        bidir_msg[i] = m;
        bidir_gbs[i] = (double)n / t / 1e9;
        printf("# bidirectional, one thread per side, %zu-byte messages: %.3f GB/s per direction, "
               "%.3f GB/s total\n", m, bidir_gbs[i], 2 * bidir_gbs[i]);
    }
    close(fd);
    waitpid(pid, NULL, 0);

    {
        size_t big = 64u << 20, small = 512u << 10;
        unsigned char *x, *y;
        float *fa, *fb, *fc;
        double mbig, msmall, add;
        if (posix_memalign((void **)&x, 4096, big) || posix_memalign((void **)&y, 4096, big)) die("malloc");
        memset(x, 3, big);
        memset(y, 4, big);
        mbig = copy_bw(y, x, big, 10);
        msmall = copy_bw(y, x, small, 2000);
        fa = (float *)(void *)x;
        fb = (float *)(void *)y;
        if (posix_memalign((void **)&fc, 4096, big)) die("malloc");
        memset(fc, 0, big);
        add = add_bw(fc, fa, fb, big / sizeof(float), 10);
        printf("# memcpy 64 MiB, one thread: %.3f GB/s (bytes copied; memory traffic is 2x)\n", mbig);
        printf("# memcpy 512 KiB (cache-resident), one thread: %.3f GB/s\n", msmall);
        printf("# c = a + b, 64 MiB of float, one thread: %.3f GB/s of result\n", add);
        if (json) {
            FILE *f = fopen(json, "w");
            if (!f) die(json);
            fprintf(f, "{\n  \"bench\": \"tcp_stream\",\n  \"sockbuf\": %d,\n  \"stream\": [\n", bufsize);
            for (i = 0; i < nsizes; i++)
                fprintf(f, "    {\"bytes\": %zu, \"GBs\": %.6f}%s\n", sizes[i], gbs[i], i + 1 < nsizes ? "," : "");
            fprintf(f, "  ],\n  \"bidir\": [{\"bytes\": %zu, \"GBs_per_direction\": %.6f}, "
                       "{\"bytes\": %zu, \"GBs_per_direction\": %.6f}],\n"
                       "  \"memcpy_64MiB_GBs\": %.6f,\n  \"memcpy_512KiB_GBs\": %.6f,\n"
                       "  \"add_float_64MiB_GBs\": %.6f\n}\n", bidir_msg[0], bidir_gbs[0],
                    bidir_msg[1], bidir_gbs[1], mbig, msmall, add);
            fclose(f);
        }
        free(x);
        free(y);
        free(fc);
    }
    free(buf);
    free(rbuf);
    return 0;
}
