/* SPDX-License-Identifier: MIT (see LICENSE) */
/* bench/calibrate.c — ddp-calibrate: measures the parameters of libddp's all-reduce cost model
 * (ddp_model.h) and writes them as a model file for DDP_MODEL.
 *
 *   make calibrate                          build/ddp_model.conf (MODEL_OUT=path to change)
 *   build/ddp-calibrate [-o FILE] [-m BASE] [--local-only | --net-only] [--loopback-net]
 *
 * WHAT IS MEASURED
 *   - alpha/beta of a link: a ping-pong between 2 ranks with ddp_send/ddp_recv at 8 B, 32 B, ...
 *     (x4) 8 MiB and 16 MiB; the one-way time of a size is half the round trip, the median of 5
 *     batches of back-to-back round trips (the batch's length scales down with the size, so
 *     every size gets a similar share of the run). Then t = alpha + beta * bytes in two stages:
 *     alpha = the median of the latency-bound sizes (8 .. 512 B), beta by least squares over
 *     the bandwidth-bound ones (2 .. 16 MiB) with alpha fixed, each residual taken relative to
 *     its measurement (see cal_fit: a joint fit fails on rate-limited links). The
 *     sizes in between (2 KiB .. 512 KiB) are left out: there the data stays in the cores'
 *     caches and moves up to twice as fast as from memory, which a large all-reduce's data does
 *     not. The table shows every size's residual, those too: where the fitted ones are large the
 *     link is not straight (16 MiB moves slower than 2 MiB, from memory rather than L3) and the
 *     line is a compromise.
 *   - LOCAL: the shm transport (DDP_TRANSPORT=shm, DDP_SHM_COLL=0) between 2 forked ranks.
 *   - NET: the tcp transport. Forked ranks can only reach each other over loopback, which is no
 *     network link (no wire, no NIC: the cost of two kernel stacks on one machine): it is
 *     measured and shown, but written as the net_* keys only with --loopback-net (for a model of
 *     "hosts" simulated by TCP on one machine). The other net_* keys come from BASE (-m) or the
 *     built-in 10 GbE defaults.
 *   - gamma: ddp_reduce_local, float sum in place, over 16 Mi floats (64 MiB, twice the L3 of
 *     the development machine and of most servers' per-socket share), the median of 7 calls
 *     after one to fault the pages in; per byte of one operand.
 * LAUNCHER MODE (RANK, WORLD_SIZE = 2, MASTER_ADDR/MASTER_PORT in the environment, as ddp-bench
 *   and torchrun): this process is one rank of a 2-rank job over tcp, e.g. one rank in each of
 *   two network namespaces joined by a veth pair with a `tc qdisc ... tbf` rate limit, or on two
 *   hosts. Only the network is measured; rank 0 writes alpha_net_us, beta_net_ns and nic_ns
 *   (and, with -m BASE, BASE's other keys; without it the file holds these three only, and
 *   the other keys keep the library's defaults when it is loaded). nic_ns = beta_net: the
 *   measured stream was alone on its host's link, so the link's limit and the stream's are the
 *   same number as far as one stream can tell. That is exact for a rate-limited link (tbf) and
 *   for a NIC that one TCP stream fills (10 GbE); where one stream cannot fill the link (a CPU-
 *   bound stream on 100 Gbit/s and up) the true nic_ns is lower and the model then overstates
 *   the cost of many streams per host: set nic_ns by hand to 8 / (Gbit/s of the link).
 */
#define _GNU_SOURCE
#define DDP_IMPLEMENTATION
#include "ddp.h"
#include "transports/ddp_tcp.h"
#include "transports/ddp_shm.h"
#include "ddp_model.h"
#include "bench/bench_fork.h"

#include <stdint.h>
#include <sys/mman.h>
#include <time.h>

#define CAL_NSIZES 12
#define CAL_BATCHES 5
static const size_t cal_sizes[CAL_NSIZES] = {
    8, 32, 128, 512, 2048, 8192, 32768, 131072, 524288, 2097152, 8388608, 16777216};

typedef struct {
    double us[CAL_NSIZES];   /* one-way time per size, written by rank 0 */
    int ok;
} cal_result_t;

typedef struct {
    const char *transport;
    cal_result_t *res;       /* MAP_SHARED: the forked rank 0 writes, the parent reads */
} cal_job_t;

static double cal_now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec * 1e-3;
}

static int cal_cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}
static double cal_median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cal_cmp);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* Round trips per batch: ~32 MiB moved per batch, at least 8 and at most 400. */
static int cal_iters(size_t bytes) {
    size_t it = ((size_t)32 << 20) / bytes;
    return it < 8 ? 8 : it > 400 ? 400 : (int)it;
}

static int cal_pingpong(ddp_comm_t *c, cal_result_t *res) {
    int rank = ddp_comm_rank(c), peer = 1 - rank, s, b, i;
    unsigned char *buf = (unsigned char *)malloc(cal_sizes[CAL_NSIZES - 1]);
    ddp_result_t r = DDP_SUCCESS;
    if (!buf) { fprintf(stderr, "ddp-calibrate: out of memory\n"); return 1; }
    memset(buf, rank + 1, cal_sizes[CAL_NSIZES - 1]);
    for (s = 0; s < CAL_NSIZES && r == DDP_SUCCESS; s++) {
        size_t n = cal_sizes[s];
        int iters = cal_iters(n);
        double batch[CAL_BATCHES];
        for (b = -1; b < CAL_BATCHES && r == DDP_SUCCESS; b++) {   /* batch -1: warm-up */
            double t0 = cal_now_us();
            for (i = 0; i < (b < 0 ? 2 : iters) && r == DDP_SUCCESS; i++) {
                if (rank == 0) {
                    if ((r = ddp_send(buf, n, DDP_UINT8, peer, c)) == DDP_SUCCESS)
                        r = ddp_recv(buf, n, DDP_UINT8, peer, c);
                } else {
                    if ((r = ddp_recv(buf, n, DDP_UINT8, peer, c)) == DDP_SUCCESS)
                        r = ddp_send(buf, n, DDP_UINT8, peer, c);
                }
            }
            if (b >= 0) batch[b] = (cal_now_us() - t0) / iters / 2;
        }
        if (r == DDP_SUCCESS && res) res->us[s] = cal_median(batch, CAL_BATCHES);
    }
    free(buf);
    if (r != DDP_SUCCESS) {
        fprintf(stderr, "ddp-calibrate: rank %d: ping-pong: %s: %s\n", rank, ddp_strerror(r),
                ddp_comm_last_error(c));
        return 1;
    }
    if (res) res->ok = 1;
    return 0;
}

static int cal_rank(void *arg, int n, int rank, int port) {
    const cal_job_t *job = (const cal_job_t *)arg;
    ddp_comm_desc_t d;
    ddp_comm_t *c;
    int rc;
    memset(&d, 0, sizeof d);
    d.transport = job->transport;
    d.log_level = 1;   /* silence: the table is the output */
    /* Point-to-point alone: the shm transport's own collectives play no part in a ping-pong,
     * but keep them out of init too. */
    setenv("DDP_SHM_COLL", "0", 1);
    if (!(c = bench_ddp_init(&d, n, rank, port, "ddp-calibrate"))) return 1;
    if (ddp_comm_size(c) != 2) {
        if (rank == 0) fprintf(stderr, "ddp-calibrate: needs exactly 2 ranks (WORLD_SIZE=2), got %d\n", ddp_comm_size(c));
        ddp_comm_destroy(c);
        return 1;
    }
    rc = cal_pingpong(c, ddp_comm_rank(c) == 0 ? job->res : NULL);
    if (ddp_comm_destroy(c) != DDP_SUCCESS) rc = 1;
    return rc;
}

/* The sizes the line is fitted to: latency-bound (<= 512 B) and bandwidth-bound (>= 2 MiB, past
 * the cores' L2, where the data of a large all-reduce comes from). */
static int cal_fitted(size_t bytes) { return bytes <= 512 || bytes >= ((size_t)2 << 20); }

/* In two stages: alpha (us) is the median one-way time of the smallest sizes (8 .. 512 B), then
 * beta (ns/B) minimises sum(((alpha + beta n_i - t_i) / t_i)^2) over the bandwidth-bound sizes
 * (2 .. 16 MiB) with alpha fixed. One line through both ends at once fails on a rate-limited link:
 * under tc tbf each direction's token bucket refills while the other direction sends, so mid
 * sizes cross at up to twice the rate and drag a joint fit's beta 40% low (measured across two
 * namespaces at 1 Gbit/s: bench/results/model_validation.md). */
static void cal_fit(const double *t, double *alpha, double *beta) {
    double small[CAL_NSIZES], swnn = 0, swnt = 0;
    int i, ns = 0, j;
    for (i = 0; i < CAL_NSIZES; i++)
        if (cal_sizes[i] <= 512) small[ns++] = t[i];
    for (i = 1; i < ns; i++)   /* insertion sort: a handful of values */
        for (j = i; j > 0 && small[j - 1] > small[j]; j--) { double v = small[j]; small[j] = small[j - 1]; small[j - 1] = v; }
    *alpha = ns ? (ns % 2 ? small[ns / 2] : 0.5 * (small[ns / 2 - 1] + small[ns / 2])) : 0;
    for (i = 0; i < CAL_NSIZES; i++) {
        double w = 1.0 / (t[i] * t[i]), n = (double)cal_sizes[i];
        if (cal_sizes[i] < ((size_t)2 << 20)) continue;
        swnn += w * n * n;
        swnt += w * n * (t[i] - *alpha);
    }
    *beta = swnn > 0 && swnt > 0 ? swnt / swnn * 1e3 : 0;   /* us/B -> ns/B */
}

static void cal_print(const char *name, const double *t, double alpha, double beta) {
    int i;
    double worst = 0;
    printf("\n%s: alpha = %.3f us, beta = %.4f ns/B (%.2f GB/s)\n", name, alpha, beta,
           beta > 0 ? 1.0 / beta : 0.0);
    printf("  %10s %12s %12s %9s %10s\n", "bytes", "measured_us", "model_us", "resid_%", "GB/s");
    for (i = 0; i < CAL_NSIZES; i++) {
        double f = alpha + beta * 1e-3 * (double)cal_sizes[i], r = 100 * (f - t[i]) / t[i];
        if (cal_fitted(cal_sizes[i]) && r * r > worst * worst) worst = r;
        printf("  %10zu %12.3f %12.3f %+9.1f %10.3f%s\n", cal_sizes[i], t[i], f, r,
               (double)cal_sizes[i] / t[i] * 1e-3, cal_fitted(cal_sizes[i]) ? "" : "  (not fitted)");
    }
    printf("  largest residual of the fitted sizes %+.1f %%\n", worst);
}

static double cal_gamma(void) {
    const size_t count = (size_t)16 << 20;
    float *a = (float *)malloc(count * sizeof *a), *b = (float *)malloc(count * sizeof *b);
    double v[7];
    size_t i;
    int k;
    if (!a || !b) { free(a); free(b); return -1; }
    for (i = 0; i < count; i++) { a[i] = 0.0f; b[i] = 1e-3f; }
    ddp_reduce_local(a, a, b, count, DDP_FLOAT32, DDP_SUM);
    for (k = 0; k < 7; k++) {
        double t0 = cal_now_us();
        ddp_reduce_local(a, a, b, count, DDP_FLOAT32, DDP_SUM);
        v[k] = (cal_now_us() - t0) * 1e3 / (double)(count * sizeof *a);
    }
    free(a);
    free(b);
    return cal_median(v, 7);
}

static int cal_measure_forked(const char *transport, cal_result_t *out) {
    cal_job_t job;
    int port = bench_free_port();
    cal_result_t *res = (cal_result_t *)mmap(NULL, sizeof *res, PROT_READ | PROT_WRITE,
                                             MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (res == MAP_FAILED) { perror("ddp-calibrate: mmap"); return 1; }
    memset(res, 0, sizeof *res);
    if (!port) { perror("ddp-calibrate: no free port on 127.0.0.1"); munmap(res, sizeof *res); return 1; }
    job.transport = transport;
    job.res = res;
    if (bench_fork_ranks(2, cal_rank, &job, "ddp-calibrate", port) || !res->ok) {
        fprintf(stderr, "ddp-calibrate: the %s ping-pong failed\n", transport);
        munmap(res, sizeof *res);
        return 1;
    }
    *out = *res;
    munmap(res, sizeof *res);
    return 0;
}

static void cal_usage(FILE *f) {
    fprintf(f, "usage: ddp-calibrate [-o FILE] [-m BASE] [--local-only | --net-only] [--loopback-net]\n"
               "  -o FILE          model file to write (default build/ddp_model.conf)\n"
               "  -m BASE          start from this model file instead of the built-in defaults\n"
               "  --local-only     shm ping-pong and gamma only\n"
               "  --net-only       tcp ping-pong only\n"
               "  --loopback-net   forked ranks: write the loopback tcp numbers as the net link\n"
               "With RANK/WORLD_SIZE=2/MASTER_ADDR set: one rank of a 2-rank tcp job; rank 0 writes\n"
               "alpha_net_us, beta_net_ns and nic_ns (see bench/calibrate.c).\n");
}

/* Launcher mode's file: the net keys only, unless a base model was given. */
static int cal_save_net(const _ddp_model_t *m, const char *path, const char *comment) {
    char num[40];
    FILE *f = fopen(path, "w");
    if (!f) { fprintf(stderr, "ddp-calibrate: %s: %s\n", path, strerror(errno)); return 1; }
    fprintf(f, "# libddp all-reduce cost model (ddp_model.h): the network link only\n# %s\n", comment);
    _ddp_model_fmt(num, sizeof num, m->alpha_us[_DDP_LINK_NET]);
    fprintf(f, "alpha_net_us = %s\n", num);
    _ddp_model_fmt(num, sizeof num, m->beta_ns[_DDP_LINK_NET]);
    fprintf(f, "beta_net_ns = %s\n", num);
    _ddp_model_fmt(num, sizeof num, m->nic_ns);
    fprintf(f, "nic_ns = %s\n", num);
    if (fclose(f) != 0) { fprintf(stderr, "ddp-calibrate: %s: %s\n", path, strerror(errno)); return 1; }
    return 0;
}

static int cal_launched(const char *out, const char *base, _ddp_model_t *m) {
    cal_result_t res;
    cal_job_t job;
    char comment[512], err[512];
    double a, b;
    int rc;
    memset(&res, 0, sizeof res);
    job.transport = "tcp";
    job.res = &res;
    if ((rc = cal_rank(&job, 0, 0, 0)) != 0) return rc;
    if (!res.ok) return 0;   /* rank 1: rank 0 reports */
    cal_fit(res.us, &a, &b);
    cal_print("net (tcp between the launcher's 2 ranks)", res.us, a, b);
    m->alpha_us[_DDP_LINK_NET] = a;
    m->beta_ns[_DDP_LINK_NET] = b;
    m->nic_ns = b;
    snprintf(comment, sizeof comment, "net: tcp ping-pong between 2 ranks of a launched job (MASTER_ADDR=%s), "
             "nic_ns = beta_net_ns (one stream alone on the link)", getenv("MASTER_ADDR"));
    if (base) {
        if (_ddp_model_save(m, out, comment, err, sizeof err)) { fprintf(stderr, "ddp-calibrate: %s\n", err); return 1; }
    } else if (cal_save_net(m, out, comment)) {
        return 1;
    }
    printf("\nwrote %s%s\n", out, base ? "" : " (net keys only; -m BASE for a whole model)");
    return 0;
}

int main(int argc, char **argv) {
    const char *out = "build/ddp_model.conf", *base = NULL;
    int local = 1, net = 1, loopback_net = 0, i;
    _ddp_model_t m;
    cal_result_t shm, tcp;
    double la = 0, lb = 0, na = 0, nb = 0, gamma = -1;
    char err[512], comment[1024];
    size_t off = 0;
    for (i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-o") && i + 1 < argc) out = argv[++i];
        else if (!strcmp(argv[i], "-m") && i + 1 < argc) base = argv[++i];
        else if (!strcmp(argv[i], "--local-only")) net = 0;
        else if (!strcmp(argv[i], "--net-only")) local = 0;
        else if (!strcmp(argv[i], "--loopback-net")) loopback_net = 1;
        else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) { cal_usage(stdout); return 0; }
        else { cal_usage(stderr); return 2; }
    }
    if (!local && !net) { fprintf(stderr, "ddp-calibrate: --local-only and --net-only exclude each other\n"); return 2; }
    _ddp_model_defaults(&m);
    if (base && _ddp_model_load(&m, base, err, sizeof err)) { fprintf(stderr, "ddp-calibrate: %s\n", err); return 1; }
    if (getenv("RANK") && getenv("WORLD_SIZE")) return cal_launched(out, base, &m);

    comment[0] = 0;
    if (local) {
        if ((gamma = cal_gamma()) < 0) { fprintf(stderr, "ddp-calibrate: out of memory\n"); return 1; }
        printf("gamma (ddp_reduce_local, float sum in place, 64 MiB operands): %.4f ns/B (%.2f GB/s of operand)\n",
               gamma, 1.0 / gamma);
        if (cal_measure_forked("shm", &shm)) return 1;
        cal_fit(shm.us, &la, &lb);
        cal_print("local (shm ping-pong, 2 forked ranks)", shm.us, la, lb);
        m.alpha_us[_DDP_LINK_LOCAL] = la;
        m.beta_ns[_DDP_LINK_LOCAL] = lb;
        m.gamma_ns = gamma;
        off += (size_t)snprintf(comment + off, sizeof comment - off,
                                "local: shm ping-pong between 2 forked ranks (fitted: 8 B .. 2 KiB and 2 .. 16 MiB, relative least squares); "
                                "gamma: ddp_reduce_local float sum over 64 MiB\n");
    }
    if (net) {
        if (cal_measure_forked("tcp", &tcp)) return 1;
        cal_fit(tcp.us, &na, &nb);
        cal_print("tcp over loopback (2 forked ranks)", tcp.us, na, nb);
        if (loopback_net) {
            m.alpha_us[_DDP_LINK_NET] = na;
            m.beta_ns[_DDP_LINK_NET] = nb;
            m.nic_ns = nb;
            off += (size_t)snprintf(comment + off, sizeof comment - off,
                                    "net: tcp over loopback (--loopback-net), nic_ns = beta_net_ns\n");
        } else {
            off += (size_t)snprintf(comment + off, sizeof comment - off,
                                    "tcp over loopback measured, not used (no wire): alpha %.3f us, beta %.4f ns/B\n",
                                    na, nb);
        }
    }
    if (!loopback_net && off < sizeof comment)
        snprintf(comment + off, sizeof comment - off, "net: from %s (launcher mode measures a real link)",
                 base ? base : "the built-in defaults (10 GbE assumed)");
    if (_ddp_model_save(&m, out, comment, err, sizeof err)) { fprintf(stderr, "ddp-calibrate: %s\n", err); return 1; }
    printf("\n%-15s %10s %10s\n", "key", "value", "measured");
    printf("%-15s %10.4g %10s\n", "alpha_local_us", m.alpha_us[0], local ? "yes" : "no");
    printf("%-15s %10.4g %10s\n", "beta_local_ns", m.beta_ns[0], local ? "yes" : "no");
    printf("%-15s %10.4g %10s\n", "alpha_net_us", m.alpha_us[1], loopback_net && net ? "loopback" : "no");
    printf("%-15s %10.4g %10s\n", "beta_net_ns", m.beta_ns[1], loopback_net && net ? "loopback" : "no");
    printf("%-15s %10.4g %10s\n", "nic_ns", m.nic_ns, loopback_net && net ? "loopback" : "no");
    printf("%-15s %10.4g %10s\n", "gamma_ns", m.gamma_ns, local ? "yes" : "no");
    printf("wrote %s (DDP_MODEL=%s)\n", out, out);
    return 0;
}
