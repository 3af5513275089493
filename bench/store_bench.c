/* SPDX-License-Identifier: MIT (see LICENSE) */
/* bench/store_bench.c — the rendezvous store under load: N clients do what every rank's init
 * does (agree on the world size, count in, publish a host and an address, wait for "ready",
 * read the communicator id and the host table), against one server, as processes x threads.
 *
 *   build/store-bench [-n CLIENTS] [-p PROCESSES] [-s SECRET]     (default 4096 clients, 16 procs)
 *
 * Prints the time from the first client's start to the last client's "ready", and the slowest
 * client's own time. Each client has its own connection (its own ddp_store_t), as ranks do. */
#define _GNU_SOURCE
#define DDP_IMPLEMENTATION
#include "ddp_store.h"
#include "bench/bench_cli.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

typedef struct { int port, n, first, count; const char *secret; double *slowest; int *failed; } job_t;
typedef struct { const job_t *j; int rank; double t; int ok; } client_t;

static void *client_main(void *arg) {
    client_t *cl = (client_t *)arg;
    const job_t *j = cl->j;
    ddp_store_t *s = NULL;
    ddp_store_desc_t d;
    char key[64], val[64], host[160];
    const char *ready = "bench/ready";
    size_t len;
    int64_t joined = 0, n;
    double t0 = now_s();
    memset(&d, 0, sizeof d);
    d.timeout_ms = 300000;
    d.secret = j->secret;
    d.log_level = 2;
    if (ddp_store_open(&s, "127.0.0.1", j->port, 0, &d) != DDP_SUCCESS) return NULL;
    snprintf(val, sizeof val, "%d", j->n);
    if (ddp_store_compare_set(s, "bench/world_size", NULL, 0, val, strlen(val), key, sizeof key, &len) != DDP_SUCCESS) goto out;
    snprintf(key, sizeof key, "bench/rank/%d", cl->rank);
    if (ddp_store_add(s, key, 1, &n) != DDP_SUCCESS) goto out;
    snprintf(key, sizeof key, "bench/host/%d", cl->rank);
    memset(host, 'h', sizeof host);
    if (ddp_store_set(s, key, host, sizeof host) != DDP_SUCCESS) goto out;
    snprintf(key, sizeof key, "bench/addr/tcp/%d", cl->rank);
    if (ddp_store_set(s, key, host, 28) != DDP_SUCCESS) goto out;
    if (ddp_store_add(s, "bench/joined", 1, &joined) != DDP_SUCCESS) goto out;
    if (joined == j->n && ddp_store_set(s, ready, "1", 1) != DDP_SUCCESS) goto out;
    if (ddp_store_wait(s, &ready, 1, 0) != DDP_SUCCESS) goto out;
    if (ddp_store_get(s, "bench/comm_id", val, sizeof val, &len) != DDP_SUCCESS) goto out;
    cl->ok = 1;
out:
    cl->t = now_s() - t0;
    ddp_store_close(s);
    return NULL;
}

static int run_process(const job_t *j) {
    client_t *cl = (client_t *)calloc((size_t)j->count, sizeof *cl);
    pthread_t *th = (pthread_t *)calloc((size_t)j->count, sizeof *th);
    pthread_attr_t at;
    int i, bad = 0;
    double worst = 0;
    pthread_attr_init(&at);
    pthread_attr_setstacksize(&at, 256 << 10);
    for (i = 0; i < j->count; i++) {
        cl[i].j = j;
        cl[i].rank = j->first + i;
        if (pthread_create(&th[i], &at, client_main, &cl[i]) != 0) { bad++; th[i] = 0; }
    }
    for (i = 0; i < j->count; i++) {
        if (th[i]) pthread_join(th[i], NULL);
        if (!cl[i].ok) bad++;
        if (cl[i].t > worst) worst = cl[i].t;
    }
    __atomic_add_fetch(j->failed, bad, __ATOMIC_SEQ_CST);
    {   /* the slowest client over every process */
        double cur;
        __atomic_load(j->slowest, &cur, __ATOMIC_SEQ_CST);
        while (worst > cur && !__atomic_compare_exchange(j->slowest, &cur, &worst, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {}
    }
    free(cl);
    free(th);
    return bad != 0;
}

static const char usage[] =
    "usage: store-bench [options]\n"
    "The rendezvous store under load: N clients, each with its own connection, do what every\n"
    "rank's init does against one server, as processes x threads (see the comment at the top\n"
    "of bench/store_bench.c).\n"
    "  -n, --clients N         clients (default 4096)\n"
    "  -p, --processes N       processes they are spread over (default 16; at most N)\n"
    "  -s, --secret TEXT       a job secret for the store (default none)\n"
    "  -h, --help              this text\n"
    "      --version           the version\n";

int main(int argc, char **argv) {
    static const struct option longopts[] = {
        {"clients", required_argument, NULL, 'n'}, {"processes", required_argument, NULL, 'p'},
        {"secret", required_argument, NULL, 's'}, BENCH_CLI_COMMON, {NULL, 0, NULL, 0}};
    bench_cli_t cli;
    int n = 4096, procs = 16, i, opt, ok = 1;
    const char *secret = "";
    ddp_store_t *server;
    ddp_store_desc_t d;
    job_t j;
    double t0, *slowest;
    int *failed;
    struct rlimit rl;
    bench_cli_init(&cli, "store-bench", usage, argc, argv);
    while (ok && (opt = bench_cli_next(&cli, "+:n:p:s:h", longopts)) != -1) {
        if (opt == 'n') ok = bench_cli_int(&cli, 1, 1 << 24, &n);
        else if (opt == 'p') ok = bench_cli_int(&cli, 1, 1 << 16, &procs);
        else if (opt == 's') secret = optarg;
    }
    if (!ok || !bench_cli_end(&cli)) return cli.rc;
    if (procs > n) {
        fprintf(stderr, "store-bench: -p %d processes for -n %d clients: at most one process per client\n",
                procs, n);
        return 2;
    }
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0) { rl.rlim_cur = rl.rlim_max; setrlimit(RLIMIT_NOFILE, &rl); }
    memset(&d, 0, sizeof d);
    d.timeout_ms = 300000;
    d.secret = secret;
    d.log_level = 2;
    if (ddp_store_open(&server, "127.0.0.1", 0, 1, &d) != DDP_SUCCESS) {
        fprintf(stderr, "store-bench: %s\n", ddp_store_last_error(server));
        return 1;
    }
    ddp_store_set(server, "bench/comm_id", "0123456789abcdef", 16);
    slowest = (double *)mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    failed = (int *)(slowest + 1);
    *slowest = 0;
    *failed = 0;
    memset(&j, 0, sizeof j);
    j.port = ddp_store_port(server);
    j.n = n;
    j.secret = secret;
    j.slowest = slowest;
    j.failed = failed;
    t0 = now_s();
    for (i = 0; i < procs; i++) {
        pid_t pid = fork();
        if (pid == 0) {
            j.first = (int)((long)n * i / procs);
            j.count = (int)((long)n * (i + 1) / procs) - j.first;
            _exit(run_process(&j));
        }
    }
    for (i = 0; i < procs; i++) wait(NULL);
    printf("store-bench: %d clients in %d processes%s: all ready after %.3f s (slowest client %.3f s), "
           "%d failed\n", n, procs, secret[0] ? ", with a job secret" : "", now_s() - t0, *slowest, *failed);
    ddp_store_close(server);
    return *failed != 0;
}
