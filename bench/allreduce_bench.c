/* bench/allreduce_bench.c — times ddp_all_reduce over a size sweep, nccl-tests style.
 *
 *   cc -std=c99 -O2 -Wall -Wextra -Wpedantic -Werror -I. -pthread bench/allreduce_bench.c \
 *      -o build/allreduce_bench -lm
 *   ./build/allreduce_bench -p 4 -b 8 -e 64M -f 2 -n 20 -w 5      # forks 4 ranks on this host
 *   RANK=0 WORLD_SIZE=2 MASTER_ADDR=... MASTER_PORT=... ./build/allreduce_bench ...  # one rank
 *   ./build/allreduce_bench -p 2 -m                              # peak RSS, 256 MiB all-reduce
 *
 * Without a launcher's variables in the environment the program forks -p ranks itself; each
 * calls ddp_comm_init with master 127.0.0.1 and a port that was free a moment before. With
 * RANK and WORLD_SIZE (torchrun, ddprun), OMPI_COMM_WORLD_RANK/SIZE (mpirun) or PMI_RANK/SIZE
 * it is one rank of the launcher's job and calls ddp_comm_init_env (MASTER_ADDR/MASTER_PORT,
 * default 127.0.0.1:29500). Slurm's variables are not taken as a sign: sbatch sets them for a
 * script that is not a rank.
 * Method and columns: bench/bench_common.h. All flags: -h.
 */
#define _GNU_SOURCE
#define DDP_IMPLEMENTATION
#include "ddp.h"
#include "transports/ddp_tcp.h"

#include "bench/bench_common.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>

static int ddpb_allreduce(void *ctx, const void *s, void *r, size_t count, int dtype, int op,
                          char *err, size_t errcap) {
    ddp_comm_t *c = (ddp_comm_t *)ctx;
    ddp_result_t rc = ddp_all_reduce(s, r, count, (ddp_dtype_t)dtype, (ddp_op_t)op, c);
    if (rc == DDP_SUCCESS) return 0;
    snprintf(err, errcap, "%s: %s", ddp_strerror(rc), ddp_comm_last_error(c));
    return 1;
}

static int ddpb_barrier(void *ctx) { return ddp_barrier((ddp_comm_t *)ctx) != DDP_SUCCESS; }

static int ddpb_reduce_doubles(void *ctx, double *v, int n, int op) {
    return ddp_all_reduce(v, v, (size_t)n, DDP_FLOAT64, op == BENCH_MAX ? DDP_MAX : DDP_SUM,
                          (ddp_comm_t *)ctx) != DDP_SUCCESS;
}

static int ddpb_bcast_int(void *ctx, int *v) {
    return ddp_broadcast(v, v, 1, DDP_INT32, 0, (ddp_comm_t *)ctx) != DDP_SUCCESS;
}

static int run_rank(const bench_opts_t *o, int nranks, int rank, int port) {
    ddp_comm_t *c = NULL;
    ddp_comm_desc_t desc;
    bench_backend_t b;
    char descr[256];
    ddp_result_t r;
    int rc;
    memset(&desc, 0, sizeof desc);
    if (port) {
        desc.master_addr = "127.0.0.1";
        desc.master_port = port;
        /* a crashed sibling should not keep the others waiting the default 10 minutes */
        if (!getenv("DDP_TIMEOUT_MS")) desc.timeout_ms = 120000;
        r = ddp_comm_init(&c, nranks, rank, &desc);
    } else {
        r = ddp_comm_init_env(&c, NULL);
    }
    if (r != DDP_SUCCESS) {
        fprintf(stderr, "rank %d: ddp_comm_init failed: %s: %s\n", rank, ddp_strerror(r),
                ddp_last_init_error());
        return 1;
    }
    memset(&b, 0, sizeof b);
    b.name = "libddp";
    b.ctx = c;
    b.rank = ddp_comm_rank(c);
    b.nranks = ddp_comm_size(c);
    b.allreduce = ddpb_allreduce;
    b.barrier = ddpb_barrier;
    b.reduce_doubles = ddpb_reduce_doubles;
    b.bcast_int = ddpb_bcast_int;
    snprintf(descr, sizeof descr, "libddp %d.%d, transport %s, %s", DDP_VERSION_MAJOR,
             DDP_VERSION_MINOR, b.nranks > 1 ? ddp_comm_transport_name(c, (b.rank + 1) % b.nranks) : "none",
             port ? "ranks forked by the bench (-p)" : "one rank per process (launcher environment)");
    b.description = descr;
    rc = o->mem_mode ? bench_main_mem(o, &b) : bench_main_sweep(o, &b);
    r = ddp_comm_destroy(c);
    if (r != DDP_SUCCESS) {
        fprintf(stderr, "rank %d: ddp_comm_destroy: %s\n", b.rank, ddp_strerror(r));
        rc = 1;
    }
    return rc;
}

/* A port on 127.0.0.1 that nobody listened on a moment ago (the kernel's pick for port 0). */
static int free_port(void) {
    struct sockaddr_in a;
    socklen_t len = sizeof a;
    int fd = socket(AF_INET, SOCK_STREAM, 0), port = 0;
    if (fd < 0) return 0;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
        getsockname(fd, (struct sockaddr *)&a, &len) == 0)
        port = ntohs(a.sin_port);
    close(fd);
    return port;
}

int main(int argc, char **argv) {
    bench_opts_t o;
    pid_t *pids;
    int rank, port, failed = 0, left;
    if (bench_parse_args(argc, argv, &o, 1)) return 2;
    if ((getenv("RANK") && getenv("WORLD_SIZE")) ||
        (getenv("OMPI_COMM_WORLD_RANK") && getenv("OMPI_COMM_WORLD_SIZE")) ||
        (getenv("PMI_RANK") && getenv("PMI_SIZE")))
        return run_rank(&o, 0, 0, 0);
    if (!(port = free_port())) { perror("allreduce_bench: no free port on 127.0.0.1"); return 1; }
    pids = (pid_t *)calloc((size_t)o.nranks, sizeof *pids);
    if (!pids) return 1;
    fflush(stdout);
    fflush(stderr);
    for (rank = 0; rank < o.nranks; rank++) {
        pid_t pid = fork();
        if (pid < 0) { perror("fork"); failed = 1; break; }
        if (pid == 0) {
            int rc = run_rank(&o, o.nranks, rank, port);
            fflush(stdout);
            fflush(stderr);
            _exit(rc);
        }
        pids[rank] = pid;
    }
    left = rank;
    while (left > 0) {
        int st, k;
        pid_t pid = wait(&st);
        if (pid < 0) { if (errno == EINTR) continue; break; }
        for (k = 0; k < o.nranks; k++) {
            if (pids[k] != pid) continue;
            pids[k] = 0;
            left--;
            if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
                if (WIFSIGNALED(st))
                    fprintf(stderr, "allreduce_bench: rank %d killed by signal %d\n", k, WTERMSIG(st));
                else
                    fprintf(stderr, "allreduce_bench: rank %d exited with status %d\n", k, WEXITSTATUS(st));
                if (!failed) {   /* the survivors would only wait for their timeout */
                    int j;
                    for (j = 0; j < o.nranks; j++) if (pids[j] > 0) kill(pids[j], SIGTERM);
                }
                failed = 1;
            }
        }
    }
    free(pids);
    return failed;
}
