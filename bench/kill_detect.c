/* SPDX-License-Identifier: MIT */
/* bench/kill_detect.c — ddp-kill-detect: how soon the survivors of a SIGKILLed rank get their
 * error. Each trial forks p ranks on this host that all-reduce in a loop; once every rank has
 * done 200 calls, rank 1 is SIGKILLed, and each survivor's time from the kill to the error its
 * all-reduce returns is one sample. Prints every trial, then the median, p90 and max.
 *
 *   build/ddp-kill-detect -t shm -p 3 -n 30 [-s bytes]      (-t tcp for TCP)
 */
#define _GNU_SOURCE
#define DDP_IMPLEMENTATION
#include "ddp.h"
#include "transports/ddp_tcp.h"
#include "transports/ddp_shm.h"
#include "bench/bench_cli.h"

#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>

#define MAXP 16

typedef struct {
    double t_kill, t_err[MAXP];
    int calls[MAXP], rc[MAXP];
} shared_t;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int free_port(void) {
    struct sockaddr_in sa;
    socklen_t len = sizeof sa;
    int fd = socket(AF_INET, SOCK_STREAM, 0), port = 0;
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd >= 0 && bind(fd, (struct sockaddr *)&sa, sizeof sa) == 0 &&
        getsockname(fd, (struct sockaddr *)&sa, &len) == 0)
        port = ntohs(sa.sin_port);
    if (fd >= 0) close(fd);
    return port;
}

static void rank_main(shared_t *S, const char *transport, int p, int rank, int port, size_t bytes) {
    ddp_comm_desc_t d;
    ddp_comm_t *c = NULL;
    float *buf = (float *)calloc(bytes / sizeof(float) + 1, sizeof(float));
    ddp_result_t r;
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    memset(&d, 0, sizeof d);
    d.master_addr = "127.0.0.1";
    d.master_port = port;
    d.timeout_ms = 20000;
    d.transport = transport;
    d.log_level = 1;   /* errors only: the survivors' WARN lines would be the whole output */
    if (!buf || (r = ddp_comm_init(&c, p, rank, &d)) != DDP_SUCCESS) {
        S->rc[rank] = -1;
        _exit(1);
    }
    do {
        r = ddp_all_reduce(buf, buf, bytes / sizeof(float), DDP_FLOAT32, DDP_SUM, c);
        __atomic_add_fetch(&S->calls[rank], 1, __ATOMIC_SEQ_CST);
    } while (r == DDP_SUCCESS);
    S->t_err[rank] = now_s();
    S->rc[rank] = (int)r;
    ddp_comm_destroy(c);
    _exit(0);
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static const char usage[] =
    "usage: ddp-kill-detect [options]\n"
    "How soon the survivors of a SIGKILLed rank get their error: each trial forks the ranks,\n"
    "kills rank 1 in an all-reduce loop and times each survivor's error (see the comment at\n"
    "the top of bench/kill_detect.c).\n"
    "  -t, --transport NAME    shm (default) or tcp\n"
    "  -p, --nranks N          ranks per trial (default 3; 3..16)\n"
    "  -n, --trials N          trials (default 30)\n"
    "  -s, --bytes N           bytes per all-reduce (default 8; at least 4)\n"
    "  -h, --help              this text\n"
    "      --version           the version\n";

int main(int argc, char **argv) {
    static const struct option longopts[] = {
        {"transport", required_argument, NULL, 't'}, {"nranks", required_argument, NULL, 'p'},
        {"trials", required_argument, NULL, 'n'}, {"bytes", required_argument, NULL, 's'},
        BENCH_CLI_COMMON, {NULL, 0, NULL, 0}};
    bench_cli_t cli;
    const char *transport = "shm";
    int p = 3, trials = 30, t, i, n = 0, opt, ok = 1, nbytes = 8;
    size_t bytes = 8;
    double *samples;
    shared_t *S;
    bench_cli_init(&cli, "ddp-kill-detect", usage, argc, argv);
    while (ok && (opt = bench_cli_next(&cli, "+:t:p:n:s:h", longopts)) != -1) {
        if (opt == 't') transport = optarg;
        else if (opt == 'p') ok = bench_cli_int(&cli, 3, MAXP, &p);
        else if (opt == 'n') ok = bench_cli_int(&cli, 1, 1000000, &trials);
        else if (opt == 's') ok = bench_cli_int(&cli, (long)sizeof(float), 1 << 30, &nbytes);
    }
    if (!ok || !bench_cli_end(&cli)) return cli.rc;
    bytes = (size_t)nbytes;
    S = (shared_t *)mmap(NULL, sizeof *S, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    samples = (double *)calloc((size_t)(trials * p), sizeof(double));
    if (S == MAP_FAILED || !samples) return 1;
    srand((unsigned)getpid());
    for (t = 0; t < trials; t++) {
        pid_t pid[MAXP];
        int port = free_port(), ready = 0, victim = 1;
        double t0 = now_s();
        memset(S, 0, sizeof *S);
        for (i = 0; i < p; i++) {
            pid[i] = fork();
            if (pid[i] == 0) rank_main(S, transport, p, i, port, bytes);
        }
        while (!ready && now_s() - t0 < 60) {
            ready = 1;
            for (i = 0; i < p; i++) if (__atomic_load_n(&S->calls[i], __ATOMIC_SEQ_CST) < 200) ready = 0;
            if (!ready) usleep(1000);
        }
        usleep((useconds_t)(rand() % 5000));   /* kill at a random point of the loop */
        S->t_kill = now_s();
        kill(pid[victim], SIGKILL);
        for (i = 0; i < p; i++) waitpid(pid[i], NULL, 0);
        printf("trial %2d:", t + 1);
        for (i = 0; i < p; i++) {
            if (i == victim) continue;
            if (S->rc[i] <= 0) { printf(" rank %d: no error (rc %d)", i, S->rc[i]); continue; }
            samples[n] = (S->t_err[i] - S->t_kill) * 1e3;
            printf(" rank %d %.2f ms", i, samples[n]);
            n++;
        }
        printf("\n");
        fflush(stdout);
    }
    qsort(samples, (size_t)n, sizeof *samples, cmp_double);
    if (n)
        printf("%s, p=%d, %zu B all-reduce loop, %d trials, %d survivor errors: kill -> error median "
               "%.2f ms, p90 %.2f ms, max %.2f ms\n", transport, p, bytes, trials, n, samples[n / 2],
               samples[(n * 9) / 10 < n ? (n * 9) / 10 : n - 1], samples[n - 1]);
    return 0;
}
