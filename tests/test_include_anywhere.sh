#!/bin/sh
# SPDX-License-Identifier: MIT (see LICENSE)
# tests/test_include_anywhere.sh — issue 16, "include anywhere": a trainer's implementation file
# that includes <stdio.h> and <stdlib.h> first and defines no feature macro (no _GNU_SOURCE, no
# _POSIX_C_SOURCE) builds against every libddp header, -Wall -Wextra -Wpedantic -Werror, as C99
# (strict -std=c99: glibc then shows only ISO C unless asked) and as C++17, with gcc and clang,
# and runs: two forked ranks all-reduce over TCP and over shared memory, and the sampler splits
# a dataset between them. Run from the repository root (prove tests/test_include_anywhere.sh);
# prints TAP. ~1 minute on a busy 2-core machine (four builds of the whole library).
set -u

tmp=$(mktemp -d "${TMPDIR:-/tmp}/include_anywhere.XXXXXX") || { echo "Bail out! mktemp failed"; exit 1; }
trap 'rm -rf "$tmp"' EXIT
unset DDP_TRANSPORT DDP_JOB_SECRET DDP_DEBUG RANK WORLD_SIZE MASTER_ADDR MASTER_PORT
. "$(dirname "$0")/tap.sh"   # ok, notok, check, why

# Every transport header that builds here; ibverbs only with its headers (loaded at run time,
# DDP_IBV_DLOPEN, so nothing to link).
ib=""
[ -f /usr/include/infiniband/verbs.h ] && ib='#define DDP_IBV_DLOPEN
#include "transports/ddp_ibverbs.h"'

cat > "$tmp/trainer.c" <<EOF
#include <stdio.h>              /* the trainer's own includes first, and no feature macro */
#include <stdlib.h>
#define DDP_IMPLEMENTATION
#include "ddp.h"
#include "transports/ddp_tcp.h"
#include "transports/ddp_shm.h"
#include "transports/ddp_threads.h"
#include "transports/ddp_nccl.h"
$ib
#include "ddp_sampler.h"
/* POSIX for the test's own fork, wait and port, after libddp: its implementation selected POSIX
 * for the rest of this file (ddp_base.h, FEATURE MACROS). Not the W* macros of <sys/wait.h>,
 * which glibc leaves to <stdlib.h> once that exists, and ours came first, ISO C only. */
#include <string.h>
#include <unistd.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <arpa/inet.h>

/* A port for rank 0's store that nothing else on the host is handed meanwhile, made as ddprun and
 * tests/tap.sh's free_port make it: the kernel's pick, held in TIME_WAIT by a loopback connection
 * whose accepted end closes first. TIME_WAIT keeps it out of every bind(port 0) and connect()
 * on the host (other tests run beside this one), while the store (SO_REUSEADDR) can bind it. */
static int free_port(void) {
    struct sockaddr_in a;
    socklen_t len = sizeof a;
    int one = 1, port = 0, c = -1, s = -1, l = socket(AF_INET, SOCK_STREAM, 0);
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (l >= 0) setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (l >= 0 && bind(l, (struct sockaddr *)&a, sizeof a) == 0 && listen(l, 1) == 0 &&
        getsockname(l, (struct sockaddr *)&a, &len) == 0) {
        port = ntohs(a.sin_port);
        c = socket(AF_INET, SOCK_STREAM, 0);
        if (c >= 0 && connect(c, (struct sockaddr *)&a, sizeof a) == 0) s = accept(l, NULL, NULL);
        if (s >= 0) close(s);   /* the accepted end closes first: it is the one in TIME_WAIT */
        if (c >= 0) close(c);
    }
    if (l >= 0) close(l);
    return port;
}

/* One rank: init over the given transport, sum rank+1 times a pattern, check 3 times it. */
static int rank_main(int rank, int port, const char *transport) {
    enum { N = 4099 };   /* not a multiple of the world size */
    float *x = (float *)malloc(N * sizeof *x);
    ddp_comm_desc_t desc;
    ddp_comm_t *comm = NULL;
    ddp_result_t r;
    size_t i, bad = 0;
    if (!x) return 9;
    memset(&desc, 0, sizeof desc);
    desc.transport = transport;
    desc.master_addr = "127.0.0.1";
    desc.master_port = port;
    desc.timeout_ms = 30000;
    for (i = 0; i < N; i++) x[i] = (float)(rank + 1) * (float)(i % 101);
    if ((r = ddp_comm_init(&comm, 2, rank, &desc)) != DDP_SUCCESS) {
        fprintf(stderr, "rank %d: ddp_comm_init over %s: %s: %s\n", rank, transport, ddp_strerror(r),
                ddp_last_init_error());
        free(x);
        return 2;
    }
    if (strcmp(ddp_comm_transport_name(comm, 1 - rank), transport) != 0) {
        fprintf(stderr, "rank %d: peer reached over %s, not %s\n", rank, ddp_comm_transport_name(comm, 1 - rank),
                transport);
        r = DDP_ERR_INTERNAL;
    }
    if (r == DDP_SUCCESS && (r = ddp_all_reduce(x, x, N, DDP_FLOAT32, DDP_SUM, comm)) != DDP_SUCCESS)
        fprintf(stderr, "rank %d: ddp_all_reduce over %s: %s\n", rank, transport, ddp_comm_last_error(comm));
    for (i = 0; r == DDP_SUCCESS && i < N; i++)
        if (x[i] != 3.0f * (float)(i % 101)) bad++;
    if (bad) fprintf(stderr, "rank %d: %zu of %d sums wrong over %s\n", rank, bad, (int)N, transport);
    ddp_comm_destroy(comm);
    free(x);
    return r != DDP_SUCCESS ? 3 : bad ? 4 : 0;
}

/* Two forked ranks; 0 when both exited 0 (each has 60 s before SIGALRM ends it). */
static int two_ranks(const char *transport) {
    int port = free_port(), rank, failed = 0;
    pid_t pid[2];
    if (!port) { fprintf(stderr, "no free port\n"); return 1; }
    fflush(stdout);
    fflush(stderr);
    for (rank = 0; rank < 2; rank++) {
        pid[rank] = fork();
        if (pid[rank] == 0) {
            alarm(60);
            exit(rank_main(rank, port, transport));
        }
    }
    for (rank = 0; rank < 2; rank++) {
        int status = -1;
        if (pid[rank] < 0 || waitpid(pid[rank], &status, 0) != pid[rank] || status != 0) {
            fprintf(stderr, "rank %d over %s: %s 0x%x (exit code << 8 | signal)\n", rank, transport,
                    pid[rank] < 0 ? "fork failed" : "wait status", (unsigned)status);
            failed = 1;
        }
    }
    printf("2-rank all-reduce over %s: %s\n", transport, failed ? "FAILED" : "ok");
    return failed;
}

/* The sampler's two shards of a 10-sample dataset together are every index once. */
static int sampler_split(void) {
    uint64_t idx[2][5];
    int seen[10] = {0}, rank, i, bad = 0;
    for (rank = 0; rank < 2; rank++) {
        ddp_sampler_t s;
        if (ddp_sampler_init(&s, 10, 2, rank, 1, 7, 0) != DDP_SUCCESS || ddp_sampler_num_samples(&s) != 5 ||
            ddp_sampler_indices(&s, idx[rank]) != DDP_SUCCESS)
            bad = 1;
        for (i = 0; !bad && i < 5; i++)
            if (idx[rank][i] < 10) seen[idx[rank][i]]++;
    }
    for (i = 0; i < 10; i++)
        if (seen[i] != 1) bad = 1;
    printf("sampler: %s\n", bad ? "FAILED" : "ok");
    return bad;
}

int main(void) {
    int failed = sampler_split();
    failed |= two_ranks("tcp");
    failed |= two_ranks("shm");
    return failed;
}
EOF
cp "$tmp/trainer.c" "$tmp/trainer.cpp"

WARN="-Wall -Wextra -Wpedantic -Werror"
set -- "gcc -std=c99" "clang -std=c99" "g++ -std=c++17" "clang++ -std=c++17"
echo "1..$(($# * 2))"
for cc in "$@"; do
    exe=${cc%% *}
    case $exe in *++) src=$tmp/trainer.cpp;; *) src=$tmp/trainer.c;; esac
    bin=$tmp/trainer_$exe
    if ! command -v "$exe" > /dev/null 2>&1; then
        ok "# SKIP $cc: not installed"
        ok "# SKIP $cc: not installed"
        continue
    fi
    build() { $cc $WARN -O2 -I. -pthread "$src" -o "$bin" -lm > "$tmp/why" 2>&1; }
    check "$cc: <stdio.h> and <stdlib.h> first, no feature macro, every header (ddp.h, transports, sampler) builds" build
    if [ -x "$bin" ]; then
        run() { timeout -k 5 150 "$bin" > "$tmp/why" 2>&1; }
        check "$cc: it runs: sampler split, 2-rank all-reduce over tcp and over shm" run
    else
        notok "$cc: it runs (not built)"
    fi
done
