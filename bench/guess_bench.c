/* SPDX-License-Identifier: MIT */
/* bench/guess_bench.c — how fast can one thread try job secrets against the rendezvous store?
 *
 *   build/guess-bench [-t SECONDS] [-p PORT]
 *
 * Without -p it starts a store server with a job secret in this process (127.0.0.1, a free
 * port); with -p it attacks a store already listening on 127.0.0.1:PORT. One thread then, for
 * SECONDS (default 10), connects, reads the challenge, answers with a wrong proof (random
 * bytes: the cheapest guess there is, so this measures the server, not the guesser's PBKDF2)
 * and reads the verdict, as fast as the server lets it. Prints the failed proofs per second and
 * the slowest verdict. Uses only what every store protocol version has (the challenge's size
 * comes from the header it is built with). */
#define _GNU_SOURCE
#define DDP_IMPLEMENTATION
#include "ddp_store.h"
#include "bench/bench_cli.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* One wrong guess: 1 refused, 0 connection lost or closed without a verdict, -1 not a store. */
static int one_guess(int port, double *verdict_s) {
    struct sockaddr_in a;
    unsigned char chal[sizeof(_ddp_store_chal_t)], msg[_DDP_STORE_HELLO_BYTES];
    _ddp_store_req_t rq;
    _ddp_store_resp_t resp;
    int64_t deadline = _ddp_deadline(30000);
    double t0;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), one = 1, r = 0;
    if (fd < 0) return 0;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons((uint16_t)port);
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0 ||
        _ddp_recv_all(fd, chal, sizeof chal, deadline) != 0) { close(fd); return 0; }
    memcpy(&rq, chal, 8);                         /* magic, proto */
    if (rq.magic != _DDP_STORE_MAGIC) { close(fd); return -1; }
    memset(&rq, 0, sizeof rq);
    rq.magic = _DDP_STORE_MAGIC;
    rq.op = _DDP_ST_HELLO;
    rq.v1len = _DDP_AUTH_NONCE_BYTES + _DDP_AUTH_PROOF_BYTES;
    rq.flags = _DDP_ST_HELLO_PROOF;
    rq.arg = _DDP_STORE_PROTO;
    memcpy(msg, &rq, sizeof rq);
    if (_ddp_auth_random(msg + sizeof rq, 2 * _DDP_AUTH_NONCE_BYTES) != 0) { close(fd); return 0; }
    t0 = now_s();
    if (_ddp_send_all(fd, msg, sizeof rq + rq.v1len, deadline) == 0 &&
        _ddp_recv_all(fd, &resp, sizeof resp, deadline) == 0 && resp.status == DDP_ERR_AUTH)
        r = 1;
    *verdict_s = now_s() - t0;
    close(fd);
    return r;
}

static const char usage[] =
    "usage: guess-bench [options]\n"
    "How fast one thread can try wrong job secrets against a rendezvous store (see the comment\n"
    "at the top of bench/guess_bench.c).\n"
    "  -t, --seconds S         how long to try (default 10)\n"
    "  -p, --port N            attack the store on 127.0.0.1:N (default: start one in this\n"
    "                          process, with a job secret)\n"
    "  -h, --help              this text\n"
    "      --version           the version\n";

int main(int argc, char **argv) {
    static const struct option longopts[] = {
        {"seconds", required_argument, NULL, 't'}, {"port", required_argument, NULL, 'p'},
        BENCH_CLI_COMMON, {NULL, 0, NULL, 0}};
    bench_cli_t cli;
    double seconds = 10, t0, slowest = 0, first = 0;
    int port = 0, opt, ok = 1;
    long failed = 0, lost = 0;
    ddp_store_t *srv = NULL;
    bench_cli_init(&cli, "guess-bench", usage, argc, argv);
    while (ok && (opt = bench_cli_next(&cli, "+:t:p:h", longopts)) != -1) {
        if (opt == 't') ok = bench_cli_double(&cli, 0, &seconds);
        else if (opt == 'p') ok = bench_cli_int(&cli, 1, 65535, &port);
    }
    if (!ok || !bench_cli_end(&cli)) return cli.rc;
    if (!port) {
        ddp_store_desc_t d;
        memset(&d, 0, sizeof d);
        d.secret = "guess-bench-secret";
        d.log_level = 1;                          /* quiet: the refusals would be logged */
        if (ddp_store_open(&srv, "127.0.0.1", 0, 1, &d) != DDP_SUCCESS) {
            fprintf(stderr, "guess-bench: cannot start a store server\n");
            return 1;
        }
        port = ddp_store_port(srv);
    }
    t0 = now_s();
    while (now_s() - t0 < seconds) {
        double v = 0;
        int r = one_guess(port, &v);
        if (r < 0) { fprintf(stderr, "guess-bench: 127.0.0.1:%d is not a libddp store\n", port); return 1; }
        if (r) failed++; else lost++;
        if (failed + lost == 1) first = v;
        if (v > slowest) slowest = v;
    }
    t0 = now_s() - t0;
    printf("guess-bench: %ld wrong proofs refused in %.1f s from one thread: %.1f per second "
           "(%ld connections closed without a verdict; first verdict %.1f ms, slowest %.1f ms)\n",
           failed, t0, (double)failed / t0, lost, first * 1e3, slowest * 1e3);
    if (srv) ddp_store_close(srv);
    return 0;
}
