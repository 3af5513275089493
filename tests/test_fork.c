/* SPDX-License-Identifier: MIT */
/* tests/test_fork.c — a communicator after fork: the child's copy is refused, the parent's keeps
 * working. Prints TAP.
 *
 *   build/test_fork          (DDP_TEST_ONLY=<scenario name> runs one; DDP_TEST_QUICK=1: fewer
 *                             configurations)
 *
 * Every rank forks a long-lived child after init, as a trainer forks its data-loader workers.
 * Before the fork each rank opens strangers' TCP connections to MASTER_PORT (the store accepts
 * and challenges them; the child inherits the descriptors on both sides) and starts an async
 * all-reduce; after the fork the parent closes the strangers. The child tries a blocking and
 * an async collective, ddp_wait on the parent's request, a split and an abort (each must be
 * DDP_ERR_INVALID_USAGE, saying "after fork"), gets no store from ddp_comm_store, destroys
 * the communicator, then lives on holding its descriptors until its parent is done. The parent runs many collectives, each result checked
 * exactly, destroys, and only then lets its child _exit(0). Scenarios: tcp and shm, p = 2 and
 * 3 or 4. Nothing depends on timing: the child outlives its parent's collectives by a pipe. */
#define _GNU_SOURCE
#include "ddp.h"
#include "transports/ddp_tcp.h"
#include "transports/ddp_shm.h"
#include "tests/ddp_test.h"

#define SECRET "fork-test-secret-51a9"
#ifndef STRANGERS
#define STRANGERS 4   /* -DSTRANGERS=0 leaves them out */
#endif
#define ITERS 300

typedef struct { const char *transport; int p; } fork_cfg_t;

/* What the child found, one bit per check that failed (0: all good). */
enum { CH_BLOCKING = 1, CH_ASYNC = 2, CH_WAIT = 4, CH_SPLIT = 8, CH_ABORT = 16, CH_MSG = 32,
       CH_DESTROY = 64, CH_AFTER = 128 };

static int stranger(void) {
    struct sockaddr_in sa;
    struct pollfd pfd;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_port = htons((uint16_t)t_master_port);
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) { close(fd); return -1; }
    /* With a job secret the store challenges at once: its nonce means it has accepted us, so
     * the server's descriptor exists before the fork. */
    pfd.fd = fd; pfd.events = POLLIN; pfd.revents = 0;
    poll(&pfd, 1, 5000);
    return fd;
}

/* Rank r's element i in iteration it: small integers, so int32 sums are exact. */
static int32_t val(int r, int it, size_t i) { return (int32_t)((r + 1) * 1000 + it * 7 + (int)(i % 97)); }

static int child_main(ddp_comm_t *c, ddp_request_t *parents_req, int go_fd, int res_fd) {
    int32_t x = 1;
    unsigned char bad = 0;
    ddp_request_t req;
    ddp_comm_t *sub = NULL;
    char b;
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (ddp_all_reduce(&x, &x, 1, DDP_INT32, DDP_SUM, c) != DDP_ERR_INVALID_USAGE) bad |= CH_BLOCKING;
    if (!strstr(ddp_comm_last_error(c), "after fork") || !strstr(ddp_comm_last_error(c), "destroy it"))
        bad |= CH_MSG;
    if (ddp_all_reduce_async(&x, &x, 1, DDP_INT32, DDP_SUM, c, &req) != DDP_ERR_INVALID_USAGE) bad |= CH_ASYNC;
    if (ddp_wait(parents_req) != DDP_ERR_INVALID_USAGE) bad |= CH_WAIT;
    if (ddp_comm_split(c, 0, 0, &sub) != DDP_ERR_INVALID_USAGE || sub) bad |= CH_SPLIT;
    if (ddp_comm_abort(c) != DDP_ERR_INVALID_USAGE) bad |= CH_ABORT;
    if (ddp_comm_store(c) != NULL) bad |= CH_ABORT;   /* the parent's store connection */
    if (ddp_barrier(c) != DDP_ERR_INVALID_USAGE) bad |= CH_BLOCKING;
    if (ddp_comm_destroy(c) != DDP_SUCCESS) bad |= CH_DESTROY;
    if (ddp_all_reduce(&x, &x, 1, DDP_INT32, DDP_SUM, c) != DDP_ERR_INVALID_USAGE) bad |= CH_AFTER;
    if (write(res_fd, &bad, 1) != 1) {}
    /* A data-loader worker lives on, holding every descriptor it inherited, until the parent
     * has finished with the communicator (EOF on go_fd), at most a minute. */
    {
        struct pollfd pfd;
        pfd.fd = go_fd; pfd.events = POLLIN; pfd.revents = 0;
        poll(&pfd, 1, 60000);
        if (read(go_fd, &b, 1) < 0) {}
    }
    _exit(0);
}

static int fork_rank(int rank, int p, void *arg) {
    const fork_cfg_t *cfg = (const fork_cfg_t *)arg;
    ddp_comm_desc_t d;
    ddp_comm_t *c;
    ddp_request_t req;
    int32_t *buf, *async_buf;
    int s[STRANGERS + 1], go[2], res[2], i, it, wrong = 0, st = -1;
    unsigned char bad = 0xff;
    ddp_result_t r = DDP_SUCCESS;
    pid_t kid;
    const size_t counts[] = {1, 7, 1000, 70000};
    t_desc(&d, 20000);
    d.log_level = 1;
    d.transport = cfg->transport;
    d.job_secret = SECRET;
    if (!(c = t_comm_init(rank, p, &d))) return 1;
    buf = (int32_t *)malloc(70000 * sizeof *buf);
    async_buf = (int32_t *)malloc(1000 * sizeof *async_buf);
    if (!buf || !async_buf || pipe(go) != 0 || pipe(res) != 0) return 1;
    for (i = 0; i < STRANGERS; i++) s[i] = stranger();
    for (i = 0; i < 1000; i++) async_buf[i] = rank + 1;
    t_where("async all-reduce before the fork");
    ok(ddp_all_reduce_async(async_buf, async_buf, 1000, DDP_INT32, DDP_SUM, c, &req) == DDP_SUCCESS,
       "%s p=%d rank %d: async all-reduce issued before the fork", cfg->transport, p, rank);
    fflush(stdout);
    kid = fork();
    if (kid == 0) {
        close(go[1]);
        close(res[0]);
        child_main(c, &req, go[0], res[1]);
    }
    close(go[0]);
    close(res[1]);
    if (!ok(kid > 0, "rank %d: fork", rank)) return 1;
    for (i = 0; i < STRANGERS; i++) if (s[i] >= 0) close(s[i]);
    t_where("waiting for the async all-reduce");
    r = ddp_wait(&req);
    for (i = 0; i < 1000 && r == DDP_SUCCESS; i++) if (async_buf[i] != p * (p + 1) / 2) wrong++;
    ok(r == DDP_SUCCESS && !wrong, "%s p=%d rank %d: the async all-reduce issued before the fork "
       "completes in the parent, exactly (%s)", cfg->transport, p, rank, ddp_strerror(r));
    t_where("collectives after the fork");
    for (it = 0; it < ITERS && r == DDP_SUCCESS; it++) {
        size_t n = counts[it % 4], k;
        int q;
        for (k = 0; k < n; k++) buf[k] = val(rank, it, k);
        if (it % 10 == 9) r = ddp_barrier(c);
        if (r == DDP_SUCCESS) r = ddp_all_reduce(buf, buf, n, DDP_INT32, DDP_SUM, c);
        for (k = 0; k < n && r == DDP_SUCCESS; k++) {
            int32_t want = 0;
            for (q = 0; q < p; q++) want += val(q, it, k);
            if (buf[k] != want) { wrong++; break; }
        }
    }
    ok(r == DDP_SUCCESS && wrong == 0, "%s p=%d rank %d: %d collectives after the fork, every result "
       "exact (%d wrong): %s %s", cfg->transport, p, rank, it, wrong, ddp_strerror(r),
       r ? ddp_comm_last_error(c) : "");
    t_where("reading the child's report");
    {
        struct pollfd pfd;
        pfd.fd = res[0]; pfd.events = POLLIN; pfd.revents = 0;
        if (poll(&pfd, 1, 30000) > 0 && read(res[0], &bad, 1) != 1) bad = 0xff;
    }
    ok(bad == 0, "%s p=%d rank %d: the child's copy refuses every call with DDP_ERR_INVALID_USAGE "
       "(\"after fork\"), and its destroy succeeds (failed checks: %#x)", cfg->transport, p, rank, bad);
    t_where("destroy");
    r = ddp_comm_destroy(c);
    ok(r == DDP_SUCCESS, "%s p=%d rank %d: the parent destroys its communicator", cfg->transport, p, rank);
    close(go[1]);   /* the child may go now */
    t_where("waiting for the child");
    waitpid(kid, &st, 0);
    ok(WIFEXITED(st) && WEXITSTATUS(st) == 0, "%s p=%d rank %d: the child exited 0 (status %#x)",
       cfg->transport, p, rank, st);
    close(res[0]);
    free(buf);
    free(async_buf);
    return 0;
}

int main(void) {
    static const fork_cfg_t all[] = {{"tcp", 2}, {"shm", 2}, {"tcp", 3}, {"shm", 4}};
    static const fork_cfg_t quick[] = {{"tcp", 2}, {"shm", 3}};
    const int is_quick = getenv("DDP_TEST_QUICK") && atoi(getenv("DDP_TEST_QUICK"));
    const fork_cfg_t *cfgs = is_quick ? quick : all;
    size_t n = is_quick ? sizeof quick / sizeof quick[0] : sizeof all / sizeof all[0], i;
    t_init();
    unsetenv("DDP_TRANSPORT");
    for (i = 0; i < n; i++) {
        char name[32];
        snprintf(name, sizeof name, "%s-%d", cfgs[i].transport, cfgs[i].p);
        if (!t_selected(name)) continue;
        ok(t_run_ranks(cfgs[i].p, fork_rank, (void *)(uintptr_t)&cfgs[i], 120) == 0,
           "%s: every rank (each with a forked child) exited 0", name);
    }
    return t_done();
}
