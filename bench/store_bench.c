/* SPDX-License-Identifier: MIT (see LICENSE) */
/* bench/store_bench.c — the rendezvous store under load: N clients do what every rank's init
 * does (agree on the world size, count in, publish a host and an address, wait for "ready",
 * read the communicator id and the host table), against one server, as processes x threads.
 *
 *   build/store-bench [-n CLIENTS] [-p PROCESSES] [-s SECRET] [-a SOURCES] [-t MS]
 *
 * Prints the time from the first client's start to the last client's "ready", and the slowest
 * client's own time. Each client has its own connection (its own ddp_store_t), as ranks do.
 * Above 4,096 clients they connect from several loopback addresses (-a; 127.R.x.y, R drawn per
 * run): from one address, N clients and the TIME_WAIT sockets of earlier runs share its ~28,000
 * ephemeral ports, and the kernel's search for a free one grows with them (the run would measure
 * that search, or hang on it, instead of the store). Every wait is bounded: a client gives up -t ms
 * after its start, all its requests together (each says why), and a run not done 10 s after that is a hang: the bench names the
 * clients still missing and the step each is in, kills them and exits 3 (1: some failed). */
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
#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Where each client is (shared by every process: the parent names the missing ones). */
enum { ST_IDLE = 0, ST_CONNECT, ST_WORLD, ST_PUBLISH, ST_JOIN, ST_READY, ST_DONE, ST_FAILED };
static const char *const stage_name[] = {"not started", "connecting", "agreeing on the world size",
                                         "publishing", "counting in", "waiting for ready", "done",
                                         "failed"};
#define ERR_KEEP 4            /* the first failures' messages, shown by the parent */
typedef struct {
    double slowest;
    int failed, nerr;
    char err[ERR_KEEP][640];
    unsigned char stage[];    /* one per client */
} shared_t;

typedef struct { int port, n, first, count, sources, source_net, timeout_ms; const char *secret; shared_t *sh; } job_t;
typedef struct { const job_t *j; int rank; double t; int ok; } client_t;

/* Client rank's local address: 127.R.x.y, the rank-th of `sources` (NULL: one source, the kernel's choice). */
static const char *source_of(const job_t *j, int rank, char *buf, size_t cap) {
    int i;
    if (j->sources <= 1) return NULL;
    i = rank % j->sources;
    snprintf(buf, cap, "127.%d.%d.%d", j->source_net, i / 250, i % 250 + 1);
    return buf;
}

static void client_failed(const job_t *j, int rank, int stage, ddp_store_t *s) {
    int k = __atomic_fetch_add(&j->sh->nerr, 1, __ATOMIC_SEQ_CST);
    if (k < ERR_KEEP)
        snprintf(j->sh->err[k], sizeof j->sh->err[k], "client %d, %s: %s", rank, stage_name[stage],
                 s ? ddp_store_last_error(s) : "ddp_store_open failed (see its WARN line)");
}

static void *client_main(void *arg) {
    client_t *cl = (client_t *)arg;
    const job_t *j = cl->j;
    ddp_store_t *s = NULL;
    ddp_store_desc_t d;
    char key[64], hkey[64], val[64], got[64], host[160];
    ddp_store_op_t ops[3];
    const char *ready = "bench/ready", *waitfor[2] = {"bench/ready", "bench/abort"};
    char src[32];
    unsigned char *stage = &j->sh->stage[cl->rank];
    int64_t joined = 0;
    double t0 = now_s();
    memset(&d, 0, sizeof d);
    d.timeout_ms = j->timeout_ms;
    d.secret = j->secret;
    d.log_level = 2;
    d.local_addr = source_of(j, cl->rank, src, sizeof src);
    *stage = ST_CONNECT;         /* the first request connects */
    if (ddp_store_open(&s, "127.0.0.1", j->port, 0, &d) != DDP_SUCCESS) goto out;
    _ddp_store_bound(s, _ddp_now_us() + (int64_t)j->timeout_ms * 1000 - (int64_t)((now_s() - t0) * 1e6));
    /* What init's registration sends in one batch (ddp_rendezvous.h: agree on the world size,
     * count this rank once, publish its host), then checks */
    snprintf(val, sizeof val, "%d", j->n);
    snprintf(key, sizeof key, "bench/rank/%d", cl->rank);
    snprintf(hkey, sizeof hkey, "bench/host/%d", cl->rank);
    memset(host, 'h', sizeof host);
    memset(ops, 0, sizeof ops);
    ops[0].kind = DDP_STORE_OP_COMPARE_SET; ops[0].key = "bench/world_size";
    ops[0].value = val; ops[0].len = strlen(val); ops[0].out = got; ops[0].cap = sizeof got;
    ops[1].kind = DDP_STORE_OP_ADD; ops[1].key = key; ops[1].delta = 1;
    ops[2].kind = DDP_STORE_OP_SET; ops[2].key = hkey; ops[2].value = host; ops[2].len = sizeof host;
    if (ddp_store_batch(s, ops, 3) != DDP_SUCCESS) goto out;
    *stage = ST_PUBLISH;
    /* The transport's address, the join-mask bit and the count, one batch as init sends them
     * (ddp_rendezvous.h: the addresses the transports publish go with the join) */
    snprintf(key, sizeof key, "bench/addr/tcp/%d", cl->rank);
    snprintf(hkey, sizeof hkey, "bench/joinmask/%d", cl->rank / 62);
    memset(ops, 0, sizeof ops);
    ops[0].kind = DDP_STORE_OP_SET; ops[0].key = key; ops[0].value = host; ops[0].len = 28;
    ops[1].kind = DDP_STORE_OP_ADD; ops[1].key = hkey; ops[1].delta = (int64_t)1 << (cl->rank % 62);
    ops[2].kind = DDP_STORE_OP_ADD; ops[2].key = "bench/joined"; ops[2].delta = 1;
    *stage = ST_JOIN;
    if (ddp_store_batch(s, ops, 3) != DDP_SUCCESS) goto out;
    joined = ops[2].num;
    if (joined == j->n && ddp_store_set(s, ready, "1", 1) != DDP_SUCCESS) goto out;
    *stage = ST_READY;
    /* init's wait, one batch (ddp_rendezvous.h): ready or an abort, whether it was an abort,
     * and the communicator's identity, there once ready */
    memset(ops, 0, sizeof ops);
    ops[0].kind = DDP_STORE_OP_WAIT; ops[0].keys = waitfor; ops[0].nkeys = 2; ops[0].any = 1;
    ops[1].kind = DDP_STORE_OP_CHECK; ops[1].key = "bench/abort";
    ops[2].kind = DDP_STORE_OP_GET_IF_SET; ops[2].key = "bench/comm_id"; ops[2].out = val; ops[2].cap = sizeof val;
    if (ddp_store_batch(s, ops, 3) != DDP_SUCCESS || ops[1].num || !ops[2].num) goto out;
    cl->ok = 1;
out:
    cl->t = now_s() - t0;
    if (!cl->ok) client_failed(j, cl->rank, *stage, s);
    *stage = cl->ok ? ST_DONE : ST_FAILED;
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
    __atomic_add_fetch(&j->sh->failed, bad, __ATOMIC_SEQ_CST);
    {   /* the slowest client over every process */
        double cur;
        __atomic_load(&j->sh->slowest, &cur, __ATOMIC_SEQ_CST);
        while (worst > cur && !__atomic_compare_exchange(&j->sh->slowest, &cur, &worst, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {}
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
    "  -a, --sources K         connect from K loopback addresses, 127.R.0.1 .. (R drawn per\n"
    "                          run); 1: from 127.0.0.1, the kernel's choice (default: 1 up to\n"
    "                          4096 clients, else one per 1024 clients)\n"
    "  -t, --timeout MS        each client's time for all its requests (default 60000); the run\n"
    "                          is a hang, exit status 3, when not done 10 s after it\n"
    "  -h, --help              this text\n"
    "      --version           the version\n";

int main(int argc, char **argv) {
    static const struct option longopts[] = {
        {"clients", required_argument, NULL, 'n'}, {"processes", required_argument, NULL, 'p'},
        {"secret", required_argument, NULL, 's'}, {"sources", required_argument, NULL, 'a'},
        {"timeout", required_argument, NULL, 't'}, BENCH_CLI_COMMON, {NULL, 0, NULL, 0}};
    bench_cli_t cli;
    int n = 4096, procs = 16, sources = 0, timeout_ms = 60000, i, opt, ok = 1, left, rc;
    const char *secret = "";
    ddp_store_t *server;
    ddp_store_desc_t d;
    job_t j;
    double t0, t_end, hang_at;
    shared_t *sh;
    pid_t *pids;
    struct rlimit rl;
    bench_cli_init(&cli, "store-bench", usage, argc, argv);
    while (ok && (opt = bench_cli_next(&cli, "+:n:p:s:a:t:h", longopts)) != -1) {
        if (opt == 'n') ok = bench_cli_int(&cli, 1, 1 << 24, &n);
        else if (opt == 'p') ok = bench_cli_int(&cli, 1, 1 << 16, &procs);
        else if (opt == 's') secret = optarg;
        else if (opt == 'a') ok = bench_cli_int(&cli, 1, 250 * 250, &sources);
        else if (opt == 't') ok = bench_cli_int(&cli, 1, 3600000, &timeout_ms);
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
    sh = (shared_t *)mmap(NULL, sizeof *sh + (size_t)n, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    pids = (pid_t *)calloc((size_t)procs, sizeof *pids);
    if (sh == MAP_FAILED || !pids) { fprintf(stderr, "store-bench: no memory\n"); return 1; }
    memset(sh, 0, sizeof *sh + (size_t)n);
    memset(&j, 0, sizeof j);
    j.port = ddp_store_port(server);
    j.n = n;
    j.secret = secret;
    j.sh = sh;
    j.timeout_ms = timeout_ms;
    j.sources = sources ? sources : n <= 4096 ? 1 : (n + 1023) / 1024;
    j.source_net = 1 + (int)(getpid() % 254);   /* a fresh range per run: no TIME_WAIT of earlier runs */
    t0 = now_s();
    for (i = 0; i < procs; i++) {
        pid_t pid = fork();
        if (pid == 0) {
            j.first = (int)((long)n * i / procs);
            j.count = (int)((long)n * (i + 1) / procs) - j.first;
            _exit(run_process(&j));
        }
        pids[i] = pid;
    }
    /* Every wait bounded: the clients' own timeout, then 10 s more before the run is a hang. */
    hang_at = t0 + timeout_ms / 1000.0 + 10;
    for (left = procs; left > 0 && now_s() < hang_at;) {
        pid_t w = waitpid(-1, NULL, WNOHANG);
        if (w > 0) left--;
        else if (w < 0) break;
        else usleep(20000);
    }
    t_end = now_s();
    rc = left > 0 ? 3 : sh->failed ? 1 : 0;
    if (left > 0) {
        int k, shown = 0, first = -1;
        long missing = 0;
        for (k = 0; k <= n; k++) {             /* runs of missing clients in the same step */
            int st = k < n ? sh->stage[k] : ST_DONE, open = first >= 0;
            int same = open && k < n && st == sh->stage[first] && st != ST_DONE && st != ST_FAILED;
            if (open && !same) {
                if (shown++ < 20) fprintf(stderr, "store-bench: clients %d-%d: %s\n", first, k - 1, stage_name[sh->stage[first]]);
                first = -1;
            }
            if (k < n && st != ST_DONE && st != ST_FAILED) { missing++; if (first < 0) first = k; }
        }
        fprintf(stderr, "store-bench: HANG: %ld of %d clients not done %.0f s after the start (their "
                "timeout %d ms); killing them\n", missing, n, t_end - t0, timeout_ms);
        for (i = 0; i < procs; i++) if (pids[i] > 0) kill(pids[i], SIGKILL);
        while (wait(NULL) > 0) {}
    }
    for (i = 0; i < sh->nerr && i < ERR_KEEP; i++) fprintf(stderr, "store-bench: %s\n", sh->err[i]);
    printf("store-bench: %d clients in %d processes%s, %d source address%s: %s after %.3f s (slowest "
           "client %.3f s), %d failed\n", n, procs, secret[0] ? ", with a job secret" : "", j.sources,
           j.sources == 1 ? "" : "es", rc == 3 ? "HUNG, gave up" : "all ready", t_end - t0, sh->slowest,
           sh->failed);
    ddp_store_close(server);
    free(pids);
    return rc;
}
