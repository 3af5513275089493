/* SPDX-License-Identifier: MIT */
/* bench/rendezvous_stopped.c — how long a rendezvous takes to fail when rank 0 is stopped
 * (SIGSTOP) while its store listens, measured for every other rank.
 *
 *   build/rendezvous-stopped -n 64 -t 2000 [-m 0|1]
 *
 * -m 0 (default): rank 0 starts, its store listens, it is stopped, then ranks 1..n-1 start.
 * -m 1: ranks 0..n-2 start and join, rank 0 is stopped while they wait for rank n-1, which
 * never comes. Prints each rank's time to its error, the slowest, and the slowest's message. */
#define _GNU_SOURCE
#define DDP_IMPLEMENTATION
#include "ddp.h"
#include "transports/ddp_tcp.h"

#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>

#define MAX_RANKS 1024
typedef struct {
    double seconds[MAX_RANKS];
    int rc[MAX_RANKS];
    char msg[1100];
    int port;
} shared_t;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int can_connect(int port) {
    struct sockaddr_in a;
    int fd = socket(AF_INET, SOCK_STREAM, 0), ok;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd < 0) return 0;
    ok = connect(fd, (struct sockaddr *)&a, sizeof a) == 0;
    close(fd);
    return ok;
}

static pid_t start_rank(shared_t *sh, int rank, int n, int timeout_ms) {
    pid_t pid = fork();
    if (pid == 0) {
        ddp_comm_desc_t d;
        ddp_comm_t *c = NULL;
        double t0;
        ddp_result_t r;
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        memset(&d, 0, sizeof d);
        d.master_addr = "127.0.0.1";
        d.master_port = sh->port;
        d.timeout_ms = timeout_ms;
        d.log_level = 1;
        t0 = now_s();
        r = ddp_comm_init(&c, n, rank, &d);
        sh->seconds[rank] = now_s() - t0;
        sh->rc[rank] = (int)r;
        if (r != DDP_SUCCESS && sh->seconds[rank] >= sh->seconds[MAX_RANKS - 1]) {
            sh->seconds[MAX_RANKS - 1] = sh->seconds[rank];
            snprintf(sh->msg, sizeof sh->msg, "%s", ddp_last_init_error());
        }
        if (c) ddp_comm_destroy(c);
        _exit(0);
    }
    return pid;
}

int main(int argc, char **argv) {
    int n = 8, timeout_ms = 2000, mode = 0, i, opt, started;
    pid_t pids[MAX_RANKS];
    shared_t *sh;
    double worst = 0, t0;
    while ((opt = getopt(argc, argv, "n:t:m:")) != -1) {
        if (opt == 'n') n = atoi(optarg);
        else if (opt == 't') timeout_ms = atoi(optarg);
        else if (opt == 'm') mode = atoi(optarg);
        else { fprintf(stderr, "usage: %s -n ranks -t timeout_ms [-m 0|1]\n", argv[0]); return 2; }
    }
    if (n < 2 || n > MAX_RANKS - 1) { fprintf(stderr, "-n: 2..%d\n", MAX_RANKS - 1); return 2; }
    sh = (shared_t *)mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (sh == MAP_FAILED) return 1;
    memset(sh, 0, sizeof *sh);
    sh->port = 20000 + (int)(getpid() % 20000);
    signal(SIGPIPE, SIG_IGN);
    pids[0] = start_rank(sh, 0, n, timeout_ms);
    t0 = now_s();
    if (mode == 0) {
        while (!can_connect(sh->port) && now_s() - t0 < 20) usleep(2000);
        kill(pids[0], SIGSTOP);
        for (i = 1; i < n; i++) pids[i] = start_rank(sh, i, n, timeout_ms);
        started = n;
    } else {
        ddp_store_t *st = NULL;
        ddp_store_desc_t sd;
        int64_t joined = 0;
        for (i = 1; i < n - 1; i++) pids[i] = start_rank(sh, i, n, timeout_ms);
        started = n - 1;
        memset(&sd, 0, sizeof sd);
        sd.timeout_ms = 10000;
        sd.log_level = 1;
        while (!can_connect(sh->port) && now_s() - t0 < 20) usleep(2000);
        if (ddp_store_open(&st, "127.0.0.1", sh->port, 0, &sd) == DDP_SUCCESS) {
            while (ddp_store_add(st, "ddp/joined", 0, &joined) == DDP_SUCCESS && joined < n - 1 && now_s() - t0 < 20)
                usleep(2000);
            ddp_store_close(st);
        }
        kill(pids[0], SIGSTOP);
        printf("rank 0 stopped after %lld ranks joined\n", (long long)joined);
    }
    for (i = 1; i < started; i++) waitpid(pids[i], NULL, 0);
    kill(pids[0], SIGKILL);
    waitpid(pids[0], NULL, 0);
    for (i = 1; i < started; i++) {
        if (sh->seconds[i] > worst) worst = sh->seconds[i];
        if (sh->rc[i] == DDP_SUCCESS) printf("rank %d: init succeeded?\n", i);
    }
    printf("%d ranks (mode %d), timeout %d ms: ranks 1..%d failed after %.2f s at the slowest\n", n, mode,
           timeout_ms, started - 1, worst);
    printf("slowest message: %s\n", sh->msg);
    return 0;
}
