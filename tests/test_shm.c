/* SPDX-License-Identifier: MIT (see LICENSE) */
/* tests/test_shm.c — the shared-memory transport's own promises (issue 5). Prints TAP.
 *
 *   build/test_shm          (DDP_TEST_ONLY=<scenario name> runs one)
 *
 * The collective suite (test_collectives) already checks every result over shm, with tiny
 * chunks, as the ring's transport and mixed with TCP. This file checks the rest:
 *   selection   with transport auto, same-host peers use shm, a fake second host (DDP_HOST_ID)
 *               uses TCP, and DDP_TRANSPORT=shm refuses a peer it cannot reach, by name.
 *   killed      a rank SIGKILLed in the middle of a 64 MiB all-reduce loop (a middle rank, and
 *               rank 0): every survivor returns DDP_ERR_REMOTE naming it and the phase, well
 *               before the 20 s timeout; also in the point-to-point mode (DDP_SHM_COLL=0) and
 *               with 4 ranks on 2 CPUs (survivors asleep on the futex must still notice).
 *   silent      a rank alive but not calling: DDP_ERR_TIMEOUT naming it, at the timeout.
 *   mismatch    ranks calling different counts / collectives: DDP_ERR_MISMATCH naming both.
 *   leaks       after all of the above (SIGKILLs included): no new ddp file in /dev/shm or in
 *               $TMPDIR (where libddp writes files), no "ddp-shm" socket of this program's
 *               processes left in /proc/net/unix, no memfd left open. Each count takes only
 *               what this program made, so that tests running beside it cannot change it.
 *   oversub     8 ranks on this machine's CPUs run 2000 small all-reduces and barriers (the
 *               spin-then-sleep path; a rank that spun forever would make this crawl).
 *   threads     3 ranks as threads of one process over shm (the test ThreadSanitizer runs:
 *               `make test-tsan` builds this file with -fsanitize=thread; threads are the only
 *               way TSan sees both sides of the shared-memory protocol). */
#define _GNU_SOURCE
#include "ddp.h"
#include "transports/ddp_tcp.h"
#include "transports/ddp_shm.h"
#include "tests/ddp_test.h"

#include <dirent.h>
#include <pthread.h>

typedef struct {
    double t_kill, t_err[T_MAX_RANKS];
    int rc[T_MAX_RANKS];
    int returned;                   /* silent: ranks whose collective has returned */
    char msg[T_MAX_RANKS][1024];
} shm_shared_t;

static shm_shared_t *S;

static void clear_env(void) {
    static const char *const vars[] = {"DDP_TRANSPORT", "DDP_HOST_ID", "DDP_SHM_COLL", "DDP_SHM_CHUNK",
                                       "DDP_SHM_SMALL_MAX", "DDP_SHM_CELLS", "DDP_SHM_CELL_BYTES",
                                       "DDP_ALGO"};
    size_t i;
    for (i = 0; i < sizeof vars / sizeof vars[0]; i++) unsetenv(vars[i]);
}

static ddp_comm_t *init_comm(int rank, int p, int timeout_ms, int quiet) {
    ddp_comm_desc_t d;
    t_desc(&d, timeout_ms);
    d.log_level = quiet ? 1 : 0;
    return t_comm_init(rank, p, &d);
}

/* ----------------------------------------------------------------- selection */
static int selection(int rank, int p, void *arg) {
    ddp_comm_t *c;
    int k, good = 1;
    float x = 1;
    (void)arg;
    clear_env();
    setenv("DDP_HOST_ID", rank < 2 ? "fake-a" : "fake-b", 1);
    if (!(c = init_comm(rank, p, 20000, 0))) return 1;
    for (k = 0; k < p; k++) {
        const char *want = k == rank ? NULL : ((rank < 2) == (k < 2) ? "shm" : "tcp");
        if (want && strcmp(ddp_comm_transport_name(c, k), want)) good = 0;
    }
    ok(good, "rank %d: same-host peers over shm, the other host over tcp", rank);
    ok(ddp_comm_local_size(c) == 2, "rank %d: local size 2 (two fake hosts)", rank);
    ok(ddp_all_reduce(&x, &x, 1, DDP_FLOAT32, DDP_SUM, c) == DDP_SUCCESS && x == (float)p,
       "rank %d: a mixed all-reduce works", rank);
    ddp_comm_destroy(c);
    return 0;
}

static int forced_shm(int rank, int p, void *arg) {
    ddp_comm_t *c = NULL;
    ddp_comm_desc_t d;
    ddp_result_t r;
    (void)arg;
    clear_env();
    setenv("DDP_TRANSPORT", "shm", 1);
    setenv("DDP_HOST_ID", rank == 0 ? "fake-a" : "fake-b", 1);
    t_desc(&d, 5000);
    d.log_level = 1;
    r = ddp_comm_init(&c, p, rank, &d);
    /* The first to see it says UNSUPPORTED; a rank that learns it from the store says REMOTE. */
    ok(r == DDP_ERR_UNSUPPORTED || r == DDP_ERR_REMOTE, "DDP_TRANSPORT=shm across fake hosts -> %s", ddp_strerror(r));
    ok(strstr(ddp_last_init_error(), "no transport reaches rank") != NULL,
       "... and says which rank it cannot reach: %s", ddp_last_init_error());
    if (c) ddp_comm_destroy(c);
    return 0;
}

/* ----------------------------------------------------------------- killed */
typedef struct { int victim, p2p; } kill_arg_t;
static volatile int started;
static void *killer(void *arg) {
    (void)arg;
    while (!__atomic_load_n(&started, __ATOMIC_SEQ_CST)) t_sleep_ms(1);
    t_sleep_ms(60);
    {
        double t = t_now();
        __atomic_store(&S->t_kill, &t, __ATOMIC_SEQ_CST);   /* before the signal, seen by the others */
    }
    raise(SIGKILL);
    return NULL;
}

static int killed(int rank, int p, void *arg) {
    const kill_arg_t *ka = (const kill_arg_t *)arg;
    const size_t n = (size_t)16 << 20;
    float *buf;
    ddp_comm_t *c;
    ddp_result_t r = DDP_SUCCESS;
    int it;
    clear_env();
    if (ka->p2p) setenv("DDP_SHM_COLL", "0", 1);
    if (!(c = init_comm(rank, p, 20000, rank != (ka->victim + 1) % p))) return 1;
    ok(!strcmp(ddp_comm_transport_name(c, (rank + 1) % p), "shm"), "rank %d talks to rank %d over shm",
       rank, (rank + 1) % p);
    buf = (float *)malloc(n * sizeof *buf);
    for (it = 0; it < (int)n; it++) buf[it] = 1.0f;
    if (rank == ka->victim) {
        pthread_t th;
        pthread_create(&th, NULL, killer, NULL);
    }
    t_where("all_reduce loop");
    for (it = 0; it < 1000; it++) {
        r = ddp_all_reduce(buf, buf, n, DDP_FLOAT32, DDP_MAX, c);
        if (it == 0) __atomic_store_n(&started, 1, __ATOMIC_SEQ_CST);
        if (r != DDP_SUCCESS) break;
    }
    S->rc[rank] = r;
    S->t_err[rank] = t_now();
    ok(r == DDP_ERR_REMOTE, "survivor rank %d: all_reduce #%d -> %s", rank, it + 1, ddp_strerror(r));
    ok(S->t_kill > 0 && S->t_err[rank] - S->t_kill < 5, "... %.3f s after rank %d was killed (timeout 20 s)",
       S->t_err[rank] - S->t_kill, ka->victim);
    ok(t_mentions_rank(ddp_comm_last_error(c), ka->victim) && strstr(ddp_comm_last_error(c), "phase"),
       "... naming rank %d and the phase: %s", ka->victim, ddp_comm_last_error(c));
    ok(ddp_all_reduce(buf, buf, 4, DDP_FLOAT32, DDP_SUM, c) != DDP_SUCCESS, "the communicator stays failed");
    ok(ddp_comm_destroy(c) == DDP_SUCCESS, "destroy after the failure");
    free(buf);
    return 0;
}

static void run_killed(int p, int victim, int p2p) {
    kill_arg_t ka;
    int r, bad = 0;
    ka.victim = victim;
    ka.p2p = p2p;
    S = (shm_shared_t *)t_shm_user(sizeof *S);
    diag("--- rank %d of %d SIGKILLed in a 64 MiB all-reduce loop over shm%s", victim, p,
         p2p ? " (point-to-point mode: ring over shm queues)" : "");
    t_run_ranks(p, killed, &ka, 120);
    ok(t_rank_signaled(victim, SIGKILL), "the victim died of SIGKILL mid-collective");
    for (r = 0; r < p; r++)
        if (r != victim && !(t_last_run.exited[r] && t_last_run.code[r] == 0)) bad++;
    ok(bad == 0, "every survivor returned (no hang, no crash)");
}

/* ----------------------------------------------------------------- silent */
static int silent(int rank, int p, void *arg) {
    ddp_comm_t *c;
    float x[8] = {0};
    ddp_result_t r;
    double t0;
    (void)arg;
    clear_env();
    if (!(c = init_comm(rank, p, 1500, 1))) return 1;
    if (rank == p - 1) {       /* alive, never calls; stays until the others are done (60 s at most) */
        double tw = t_now();
        while (__atomic_load_n(&S->returned, __ATOMIC_SEQ_CST) < p - 1 && t_now() - tw < 60) t_sleep_ms(5);
        ddp_comm_destroy(c);
        return 0;
    }
    t0 = t_now();
    r = ddp_all_reduce(x, x, 8, DDP_FLOAT32, DDP_SUM, c);
    __atomic_add_fetch(&S->returned, 1, __ATOMIC_SEQ_CST);
    ok(r == DDP_ERR_TIMEOUT, "rank %d: all_reduce with rank %d silent -> %s after %.2f s (timeout 1.5 s)",
       rank, p - 1, ddp_strerror(r), t_now() - t0);
    ok(t_now() - t0 < 7.5, "... not much later than the timeout (%.2f s; at most 5x it, on a busy machine)", t_now() - t0);
    ok(t_mentions_rank(ddp_comm_last_error(c), p - 1), "... naming rank %d: %s", p - 1, ddp_comm_last_error(c));
    ddp_comm_destroy(c);
    return 0;
}

/* ----------------------------------------------------------------- mismatch */
static int mismatch(int rank, int p, void *arg) {
    ddp_comm_t *c;
    float x[64] = {0};
    ddp_result_t r;
    int what = *(int *)arg;
    clear_env();
    if (!(c = init_comm(rank, p, 10000, 1))) return 1;
    if (what == 0) r = ddp_all_reduce(x, x, rank == 1 ? 11 : 10, DDP_FLOAT32, DDP_SUM, c);
    else if (rank == 0) r = ddp_broadcast(x, x, 10, DDP_FLOAT32, 0, c);
    else r = ddp_all_reduce(x, x, 10, DDP_FLOAT32, DDP_SUM, c);
    snprintf(S->msg[rank], sizeof S->msg[rank], "%s", ddp_comm_last_error(c));
    S->rc[rank] = r;
    ok(r == DDP_ERR_MISMATCH || r == DDP_ERR_REMOTE, "rank %d: %s -> %s: %s", rank,
       what == 0 ? "all_reduce of 10 vs 11 elements" : "broadcast vs all_reduce", ddp_strerror(r),
       ddp_comm_last_error(c));
    ddp_comm_destroy(c);
    return 0;
}

/* ----------------------------------------------------------------- oversubscribed */
static int oversub(int rank, int p, void *arg) {
    ddp_comm_t *c;
    int i, good = 1;
    (void)arg;
    clear_env();
    if (!(c = init_comm(rank, p, 30000, 0))) return 1;
    for (i = 0; i < 2000 && good; i++) {
        int64_t v = rank + i;
        if (ddp_all_reduce(&v, &v, 1, DDP_INT64, DDP_SUM, c) != DDP_SUCCESS) good = 0;
        else if (v != (int64_t)p * i + (int64_t)p * (p - 1) / 2) good = 0;
        if (i % 100 == 0 && ddp_barrier(c) != DDP_SUCCESS) good = 0;
    }
    ok(good, "rank %d: 2000 all-reduces + 20 barriers, all right: %s", rank, good ? "" : ddp_comm_last_error(c));
    ddp_comm_destroy(c);
    return 0;
}

/* ----------------------------------------------------------------- threads as ranks */
typedef struct { int rank, p, port, good; char err[1100]; } th_arg_t;
static void *th_rank(void *arg) {
    th_arg_t *a = (th_arg_t *)arg;
    ddp_comm_desc_t d;
    ddp_comm_t *c = NULL;
    static float big[3][300000];
    float *x = big[a->rank];
    int i, it;
    memset(&d, 0, sizeof d);
    d.master_addr = "127.0.0.1";
    d.master_port = a->port;
    d.timeout_ms = 60000;
    d.transport = "shm";
    if (ddp_comm_init(&c, a->p, a->rank, &d) != DDP_SUCCESS) {
        snprintf(a->err, sizeof a->err, "init: %s", ddp_last_init_error());
        return NULL;
    }
    a->good = 1;
    for (it = 0; it < 20 && a->good; it++) {
        size_t n = it % 2 ? 300000 : 7;          /* both all-reduce algorithms */
        for (i = 0; i < (int)n; i++) x[i] = (float)(a->rank + i % 5);
        if (ddp_all_reduce(x, x, n, DDP_FLOAT32, DDP_SUM, c) != DDP_SUCCESS) {
            snprintf(a->err, sizeof a->err, "%s", ddp_comm_last_error(c));
            a->good = 0;
        }
        for (i = 0; i < (int)n && a->good; i++)
            if (x[i] != (float)(a->p * (a->p - 1) / 2 + a->p * (i % 5))) {
                snprintf(a->err, sizeof a->err, "iteration %d element %d: %g", it, i, (double)x[i]);
                a->good = 0;
            }
        if (a->good && ddp_broadcast(x, x, 1000, DDP_FLOAT32, it % a->p, c) != DDP_SUCCESS) a->good = 0;
    }
    ddp_comm_destroy(c);
    return NULL;
}

static void run_threads(int p2p) {
    pthread_t th[3];
    th_arg_t a[3];
    int i, port = t_free_port();
    setenv("DDP_DEBUG", "NONE", 1);
    clear_env();
    if (p2p) setenv("DDP_SHM_COLL", "0", 1);
    for (i = 0; i < 3; i++) {
        memset(&a[i], 0, sizeof a[i]);
        a[i].rank = i; a[i].p = 3; a[i].port = port;
        pthread_create(&th[i], NULL, th_rank, &a[i]);
    }
    for (i = 0; i < 3; i++) pthread_join(th[i], NULL);
    for (i = 0; i < 3; i++)
        ok(a[i].good, "thread rank %d of 3 over shm (%s): 20 all-reduces + broadcasts %s", i,
           p2p ? "ring over the queues" : "shm collectives", a[i].err);
    unsetenv("DDP_DEBUG");
    unsetenv("DDP_SHM_COLL");
}

/* ----------------------------------------------------------------- leaks */
/* Entries of path whose name starts with prefix (NULL: every entry). */
static int count_dir(const char *path, const char *prefix) {
    DIR *d = opendir(path);
    struct dirent *e;
    int n = 0;
    if (!d) return 0;
    while ((e = readdir(d)) != NULL) if (!prefix || !strncmp(e->d_name, prefix, strlen(prefix))) n++;
    closedir(d);
    return n;
}

/* /dev/shm is shared by every program on the host (make test runs several at once, and PyTorch
 * in the shell tests makes names there): the names in it when this program started, and the
 * ones that appeared since and carry "ddp" (every name libddp makes does: memfd "ddp-shm",
 * sockets "@ddp-shm.", files "libddp-flight-"). */
#define SHM_NAMES_MAX 4096
static char *shm_names0[SHM_NAMES_MAX];
static int shm_nnames0;

static void shm_snapshot(void) {
    DIR *d = opendir("/dev/shm");
    struct dirent *e;
    if (!d) return;
    while ((e = readdir(d)) != NULL && shm_nnames0 < SHM_NAMES_MAX) shm_names0[shm_nnames0++] = strdup(e->d_name);
    closedir(d);
}

static int shm_new_ddp_names(char *list, size_t cap) {
    DIR *d = opendir("/dev/shm");
    struct dirent *e;
    int n = 0, i, old;
    if (cap) list[0] = 0;
    if (!d) return 0;
    while ((e = readdir(d)) != NULL) {
        if (!strcasestr(e->d_name, "ddp")) continue;
        for (old = 0, i = 0; i < shm_nnames0 && !old; i++) old = shm_names0[i] && !strcmp(shm_names0[i], e->d_name);
        if (old) continue;
        n++;
        if (strlen(list) + strlen(e->d_name) + 2 < cap) { strcat(list, " "); strcat(list, e->d_name); }
    }
    closedir(d);
    return n;
}

/* "@ddp-shm.<pid>.<hex>" sockets (transports/ddp_shm.h names each after the rank's pid) of this
 * process or of the ranks it forked. An abstract socket lives while some process holds it; the
 * ranks are all reaped by now, so a pid among them that is alive again belongs to another
 * program that was given the same pid, and its socket is not ours. */
static int count_sockets(void) {
    FILE *f = fopen("/proc/net/unix", "r");
    char line[512];
    int n = 0;
    if (!f) return 0;
    while (fgets(line, sizeof line, f)) {
        const char *at = strstr(line, "@ddp-shm.");
        long pid;
        if (!at) continue;
        pid = strtol(at + strlen("@ddp-shm."), NULL, 10);
        if (pid == (long)getpid() ||
            (t_is_our_child((pid_t)pid) && kill((pid_t)pid, 0) != 0 && errno == ESRCH)) n++;
    }
    fclose(f);
    return n;
}

static int count_memfds(void) {
    DIR *d = opendir("/proc/self/fd");
    struct dirent *e;
    int n = 0;
    char path[300], target[256];
    if (!d) return 0;
    while ((e = readdir(d)) != NULL) {
        ssize_t k;
        snprintf(path, sizeof path, "/proc/self/fd/%s", e->d_name);
        k = readlink(path, target, sizeof target - 1);
        if (k > 0) { target[k] = 0; if (strstr(target, "memfd:ddp-shm")) n++; }
    }
    closedir(d);
    return n;
}

int main(void) {
    int tmp0, sock0, p;
#if defined(__SANITIZE_THREAD__)
    /* Under ThreadSanitizer only the threads scenario says anything (TSan sees one process). */
    if (!getenv("DDP_TEST_ONLY")) setenv("DDP_TEST_ONLY", "threads", 1);
#endif
    t_init();
    S = (shm_shared_t *)t_shm_user(sizeof *S);
    shm_snapshot();
    tmp0 = count_dir(t_tmpdir(), "ddp");
    sock0 = count_sockets();
    if (t_selected("selection")) {
        diag("--- selection: two fake hosts of 2 ranks; DDP_TRANSPORT=shm across hosts");
        ok(t_run_ranks(4, selection, NULL, 60) == 0, "4 ranks on 2 fake hosts exit cleanly");
        t_run_ranks(2, forced_shm, NULL, 60);
    }
    if (t_selected("killed")) {
        run_killed(3, 1, 0);
        run_killed(2, 0, 0);
        run_killed(3, 2, 1);
        run_killed(4, 2, 0);
    }
    if (t_selected("silent")) {
        diag("--- the last rank stays alive but never calls all_reduce");
        S->returned = 0;
        ok(t_run_ranks(3, silent, NULL, 120) == 0, "every rank returned");
    }
    if (t_selected("mismatch")) {
        int what;
        for (what = 0; what < 2; what++) {
            S = (shm_shared_t *)t_shm_user(sizeof *S);
            diag("--- %s", what == 0 ? "rank 1 all-reduces 11 elements, the others 10" : "rank 0 broadcasts, the others all-reduce");
            ok(t_run_ranks(3, mismatch, &what, 60) == 0, "every rank returned");
            ok(S->rc[0] == DDP_ERR_MISMATCH || S->rc[1] == DDP_ERR_MISMATCH || S->rc[2] == DDP_ERR_MISMATCH,
               "someone says DDP_ERR_MISMATCH");
            ok(strstr(S->msg[0], "different") || strstr(S->msg[1], "different") || strstr(S->msg[2], "different"),
               "... and explains: %s", S->msg[S->rc[0] == DDP_ERR_MISMATCH ? 0 : S->rc[1] == DDP_ERR_MISMATCH ? 1 : 2]);
        }
    }
    if (t_selected("oversub")) {
        p = 8;
        diag("--- %d ranks on %ld CPUs: small all-reduces and barriers", p, sysconf(_SC_NPROCESSORS_ONLN));
        {
            double t0 = t_now();
            ok(t_run_ranks(p, oversub, NULL, 120) == 0, "every rank finished (%.1f s)", t_now() - t0);
        }
    }
    if (t_selected("threads")) {
        diag("--- 3 ranks as threads of this process over shm");
        run_threads(0);
        run_threads(1);
    }
    if (t_selected("leaks")) {
        diag("--- leaks, after every scenario above (SIGKILLs included)");
        char names[512];
        int nshm = shm_new_ddp_names(names, sizeof names);
        ok(nshm == 0, "no new ddp entry in /dev/shm (%d new:%s)", nshm, names);
        ok(count_dir(t_tmpdir(), "ddp") == tmp0, "no new %s/ddp* file (%d before, %d after)", t_tmpdir(), tmp0,
           count_dir(t_tmpdir(), "ddp"));
        ok(count_sockets() <= sock0, "no ddp-shm unix socket left (%d before, %d now)", sock0, count_sockets());
        ok(count_memfds() == 0, "no memfd left open in this process");
    }
    return t_done();
}
