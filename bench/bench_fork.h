/* SPDX-License-Identifier: MIT (see LICENSE) */
/* bench/bench_fork.h — how the libddp benchmarks start their ranks without a launcher: fork n
 * children on this host, each told the rank and a port on 127.0.0.1 for the rendezvous.
 *
 *   int port = bench_free_port();            (0: none)
 *   int failed = bench_fork_ranks(n, run_rank_fn, &opts, "ddp-bench", port);
 *
 * run_rank_fn(arg, n, rank, port) runs in the child; its return value is the child's exit
 * status. If one rank fails, the others normally notice within milliseconds (libddp fails every
 * survivor of a dead peer); one still running 10 s later gets SIGTERM, so a broken run never
 * hangs the caller. Returns 0 when every rank exited with status 0. */
#ifndef BENCH_FORK_H
#define BENCH_FORK_H

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* A port on 127.0.0.1 for rank 0's store, the kernel's pick for port 0, kept reserved as ddprun
 * keeps its own: a loopback connection to it whose accepted end closes first leaves the port in
 * TIME_WAIT, which keeps it out of every other bind(port 0) and connect() on the host meanwhile
 * (programs run side by side, as make test runs them), while the store (SO_REUSEADDR) binds it. */
static int bench_free_port(void) {
    struct sockaddr_in a;
    socklen_t len = sizeof a;
    int one = 1, port = 0, c = -1, s = -1, fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return 0;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd, (struct sockaddr *)&a, sizeof a) == 0 && listen(fd, 1) == 0 &&
        getsockname(fd, (struct sockaddr *)&a, &len) == 0) {
        port = ntohs(a.sin_port);
        c = socket(AF_INET, SOCK_STREAM, 0);
        if (c >= 0 && connect(c, (struct sockaddr *)&a, sizeof a) == 0) s = accept(fd, NULL, NULL);
        if (s >= 0) close(s);   /* the accepted end closes first: it is the one in TIME_WAIT */
        if (c >= 0) close(c);
    }
    close(fd);
    return port;
}

static double bench_fork_now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int bench_fork_ranks(int n, int (*run)(void *arg, int n, int rank, int port), void *arg,
                            const char *prog, int port) {
    pid_t *pids = (pid_t *)calloc((size_t)n, sizeof *pids);
    int rank, failed = 0, left;
    double deadline = 0;
    if (!pids) return 1;
    fflush(stdout);
    fflush(stderr);
    for (rank = 0; rank < n; rank++) {
        pid_t pid = fork();
        if (pid < 0) { perror("fork"); failed = 1; break; }
        if (pid == 0) {
            int rc = run(arg, n, rank, port);
            fflush(stdout);
            fflush(stderr);
            _exit(rc);
        }
        pids[rank] = pid;
    }
    left = rank;   /* after a failed fork, deadline 0 stops the ranks started at once */
    while (left > 0) {
        int st, j;
        pid_t pid = waitpid(-1, &st, failed ? WNOHANG : 0);
        if (pid < 0) { if (errno == EINTR) continue; break; }
        if (pid == 0) {
            if (bench_fork_now_s() > deadline) {
                for (j = 0; j < n; j++) if (pids[j] > 0) kill(pids[j], SIGTERM);
                deadline = 1e300;
            }
            usleep(10000);
            continue;
        }
        for (j = 0; j < n; j++) {
            if (pids[j] != pid) continue;
            pids[j] = 0;
            left--;
            if (WIFEXITED(st) && WEXITSTATUS(st) == 0) continue;
            /* status 1 is a failed check or call, already reported by the rank itself */
            if (WIFSIGNALED(st))
                fprintf(stderr, "%s: rank %d killed by signal %d\n", prog, j, WTERMSIG(st));
            else if (WEXITSTATUS(st) != 1)
                fprintf(stderr, "%s: rank %d exited with status %d\n", prog, j, WEXITSTATUS(st));
            if (!failed) deadline = bench_fork_now_s() + 10.0;
            failed = 1;
        }
    }
    free(pids);
    return failed;
}

#ifdef DDP_H_INCLUDED
/* A libddp rank: forked (port != 0: master 127.0.0.1:port, a 2-minute timeout unless
 * DDP_TIMEOUT_MS says otherwise, so a crashed sibling does not keep the others 10 minutes) or
 * under a launcher (ddp_comm_init_env). NULL after printing why. */
static ddp_comm_t *bench_ddp_init(ddp_comm_desc_t *d, int nranks, int rank, int port, const char *prog) {
    ddp_comm_t *c = NULL;
    ddp_result_t r;
    if (port) {
        d->master_addr = "127.0.0.1";
        d->master_port = port;
        if (!getenv("DDP_TIMEOUT_MS")) d->timeout_ms = 120000;
        r = ddp_comm_init(&c, nranks, rank, d);
    } else {
        r = ddp_comm_init_env(&c, d);
    }
    if (r != DDP_SUCCESS) {
        fprintf(stderr, "%s: rank %d: ddp_comm_init failed: %s: %s\n", prog, rank, ddp_strerror(r),
                ddp_last_init_error());
        return NULL;
    }
    return c;
}
#endif

#endif /* BENCH_FORK_H */
