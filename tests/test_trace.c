/* SPDX-License-Identifier: MIT (see LICENSE) */
/* tests/test_trace.c — the timeline (DDP_TRACE) and the flight recorder (ddp_trace.h). Prints TAP.
 *
 *   - timeline: 3 ranks over TCP make all-reduces of three sizes, a broadcast, async requests and
 *     a barrier with DDP_TRACE set; each rank's file is valid JSON (python3's json module when
 *     present, else a structural check), an array of complete events ("ph":"X") with name, ts,
 *     dur, pid = rank and the args (count, bytes, algorithm, transport, wait_us), one per call
 *     the rank made, in order of their numbers; async requests on the progress thread's row.
 *   - flight recorder: rank 2 exits after 4 all-reduces; ranks 0 and 1 fail in the 5th and log
 *     the recorder with the error: the last calls, oldest first, naming each call's number,
 *     kind, size, algorithm and result, the failed one last.
 *   - `ddprun --trace` merging ranks' files is checked by tests/test_trace_demo.sh on make demo's
 *     program. */
#define _GNU_SOURCE
#include "ddp.h"
#include "transports/ddp_tcp.h"
#include "tests/ddp_test.h"

#include <signal.h>
#include <unistd.h>

typedef struct {
    int r[T_MAX_RANKS];
    int calls[T_MAX_RANKS];
    char dir[256];
} tr_shm_t;
static tr_shm_t *X;

static int timeline_child(int rank, int p, void *arg) {
    ddp_comm_desc_t d;
    ddp_comm_t *c;
    static float buf[1 << 18];
    ddp_request_t req[2];
    size_t sizes[3] = {1, 1000, 1 << 18};
    int k, calls = 0;
    char path[300];
    (void)arg;
    snprintf(path, sizeof path, "%s/trace.%%r.json", X->dir);
    setenv("DDP_TRACE", path, 1);
    setenv("DDP_TRANSPORT", "tcp", 1);
    t_desc(&d, 60000);
    if (!(c = t_comm_init(rank, p, &d))) return 1;
    for (k = 0; k < 3; k++, calls++) X->r[rank] |= ddp_all_reduce(buf, buf, sizes[k], DDP_FLOAT32, DDP_SUM, c);
    X->r[rank] |= ddp_broadcast(buf, buf, 1000, DDP_FLOAT32, 0, c); calls++;
    X->r[rank] |= ddp_all_reduce_async(buf, buf, 1000, DDP_FLOAT32, DDP_SUM, c, &req[0]); calls++;
    X->r[rank] |= ddp_all_reduce_async(buf + 1000, buf + 1000, 10, DDP_FLOAT32, DDP_MAX, c, &req[1]); calls++;
    X->r[rank] |= ddp_wait(&req[0]) | ddp_wait(&req[1]);
    X->r[rank] |= ddp_barrier(c); calls++;
    X->calls[rank] = calls;
    ddp_comm_destroy(c);
    return 0;
}

static int recorder_child(int rank, int p, void *arg) {
    ddp_comm_desc_t d;
    ddp_comm_t *c;
    float x[1000] = {0};
    char path[300];
    int k;
    const int sigkill = arg != NULL;   /* rank 2 is killed (SIGKILL) instead of exiting */
    snprintf(path, sizeof path, "%s/stderr.%d", X->dir, rank);
    if (!freopen(path, "w", stderr)) return 1;
    setenv("DDP_TRANSPORT", "tcp", 1);
    setenv("DDP_DEBUG", "WARN", 1);
    t_desc(&d, 10000);
    if (!(c = t_comm_init(rank, p, &d))) return 1;
    for (k = 0; k < 4; k++) X->r[rank] |= ddp_all_reduce(x, x, 1000, DDP_FLOAT32, DDP_SUM, c);
    if (rank == 2) { fflush(stderr); if (sigkill) raise(SIGKILL); _exit(0); }   /* gone without a word */
    X->r[rank] = ddp_all_reduce(x, x, 1000, DDP_FLOAT32, DDP_SUM, c);
    ddp_comm_destroy(c);
    fflush(stderr);
    return 0;
}

static char *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "r");
    char *b;
    long n;
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    n = ftell(f);
    fseek(f, 0, SEEK_SET);
    b = (char *)malloc((size_t)n + 1);
    if (b && fread(b, 1, (size_t)n, f) != (size_t)n) { free(b); b = NULL; }
    if (b) b[n] = 0;
    fclose(f);
    if (len) *len = (size_t)n;
    return b;
}

static int count(const char *s, const char *needle) {
    int n = 0;
    while ((s = strstr(s, needle)) != NULL) { n++; s++; }
    return n;
}

/* Ranks 0, 1 (and 3) fail in call 5 when rank 2 is gone: at the default level each says so in
 * at most 3 lines, one of which names the file holding its last calls (the flight recorder). */
static void recorder_checks(int p, void *arg, const char *how) {
    int q;
    memset(X->r, 0, sizeof X->r);
    t_run_ranks(p, recorder_child, arg, 120);
    for (q = 0; q < p; q++) {
        char path[320], dump[512] = "", *s, *f = NULL;
        const char *at, *end;
        if (q == 2) {
            snprintf(path, sizeof path, "%s/stderr.2", X->dir);
            unlink(path);
            continue;
        }
        snprintf(path, sizeof path, "%s/stderr.%d", X->dir, q);
        s = slurp(path, NULL);
        at = s ? strstr(s, "flight recorder: the last 5 of this rank's 5 calls are in ") : NULL;
        if (at) {
            at += strlen("flight recorder: the last 5 of this rank's 5 calls are in ");
            end = strstr(at, " (DDP_DEBUG=INFO");
            if (end && (size_t)(end - at) < sizeof dump) memcpy(dump, at, (size_t)(end - at));
            f = dump[0] ? slurp(dump, NULL) : NULL;
        }
        ok(X->r[q] != DDP_SUCCESS && s && count(s, "\n") <= 3,
           "%s: rank %d says it in at most 3 lines at the default level (%d): %.300s", how, q,
           s ? count(s, "\n") : -1, s ? s : "");
        ok(f && strstr(f, "flight recorder: the last 5 of this rank's 5 calls") &&
           strstr(f, "#1 all_reduce 1000 x float32") && strstr(f, "#5 all_reduce 1000 x float32") &&
           strstr(strstr(f, "#5 all_reduce"), "remote rank failed") != NULL,
           "%s: flight recorder: rank %d's last calls, the failed #5 last, are in the file its message "
           "names (%s)", how, q, dump[0] ? dump : "no file named");
        if (f && q == 0) diag("%.600s", f);
        free(s);
        free(f);
        if (dump[0]) unlink(dump);
        unlink(path);
    }
}

int main(void) {
    char tmpl[256];
    int p = 3, q;
    t_init();
    snprintf(tmpl, sizeof tmpl, "%s/ddp_trace_test.XXXXXX", t_tmpdir());
    X = (tr_shm_t *)t_shm_user(sizeof(tr_shm_t));
    if (!mkdtemp(tmpl)) t_bail("mkdtemp");
    snprintf(X->dir, sizeof X->dir, "%s", tmpl);

    t_run_ranks(p, timeline_child, NULL, 120);
    for (q = 0; q < p; q++) {
        char path[320], cmd[700], *s;
        snprintf(path, sizeof path, "%s/trace.%d.json", X->dir, q);
        s = slurp(path, NULL);
        ok(X->r[q] == 0 && s != NULL, "timeline: rank %d's calls succeeded and it wrote %s", q, path);
        if (!s) continue;
        ok(s[0] == '[' && strstr(s, "\n]\n") && count(s, "\"ph\":\"X\"") == X->calls[q],
           "timeline: rank %d: a JSON array of %d complete events, one per call (found %d)", q,
           X->calls[q], count(s, "\"ph\":\"X\""));
        ok(count(s, "\"pid\":") == X->calls[q] && strstr(s, "\"name\":\"all_reduce\"") &&
           strstr(s, "\"name\":\"broadcast\"") && strstr(s, "\"algorithm\":\"ring\"") &&
           strstr(s, "\"algorithm\":\"recursive doubling\"") && strstr(s, "\"transport\":\"tcp\"") &&
           strstr(s, "\"wait_us\":{") && strstr(s, "\"tid\":1,") && strstr(s, "\"bytes\":1048576"),
           "timeline: rank %d: names, algorithms (ring and recursive doubling), transport, bytes, "
           "waits, the progress thread's row", q);
        snprintf(cmd, sizeof cmd, "/usr/bin/python3 -c 'import json,sys; d=json.load(open(\"%s\")); "
                 "assert all(e[\"ph\"]==\"X\" and e[\"pid\"]==%d and e[\"dur\"]>=0 and \"ts\" in e for e in d); "
                 "s=[e[\"args\"][\"seq\"] for e in d if e[\"tid\"]!=3]; assert s==sorted(s), s' 2>/dev/null", path, q);
        if (access("/usr/bin/python3", X_OK) == 0)
            ok(system(cmd) == 0, "timeline: rank %d's file loads with python's json: every event complete, "
               "pid = rank, calls in number order", q);
        free(s);
        unlink(path);
    }

    recorder_checks(3, NULL, "rank 2 exits");
    recorder_checks(4, X, "rank 2 of 4 killed (SIGKILL)");
    rmdir(X->dir);
    return t_done();
}
