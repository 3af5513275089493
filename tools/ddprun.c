/* SPDX-License-Identifier: MIT (see LICENSE) */
/* ddprun.c — launcher for libddp jobs: starts the ranks of one host, the way torchrun does.
 *
 *     cc -std=c99 -O2 -Wall -Wextra -Wpedantic -Werror tools/ddprun.c -o build/ddprun
 *     build/ddprun -n 4 ./prog args...
 *
 * The interface to the ranks is the environment (below); ddprun builds only libddp's store (to
 * serve it, see THE STORE), not ddp.h, so it launches torchrun-style programs (PyTorch's
 * init_process_group("env://")) just as well.
 * `ddprun --help` is the manual; this comment records why things are the way they are.
 *
 * ENVIRONMENT CONTRACT. What torchrun gives each worker, checked against PyTorch's source:
 * torch/distributed/elastic/agent/server/local_elastic_agent.py, LocalElasticAgent._start_workers
 * (worker_env: RANK GROUP_RANK ROLE_RANK ROLE_NAME LOCAL_WORLD_SIZE WORLD_SIZE GROUP_WORLD_SIZE
 * ROLE_WORLD_SIZE MASTER_ADDR MASTER_PORT TORCHELASTIC_RESTART_COUNT TORCHELASTIC_MAX_RESTARTS
 * TORCHELASTIC_RUN_ID TORCHELASTIC_USE_AGENT_STORE TORCH_NCCL_ASYNC_ERROR_HANDLING, LOCAL_RANK in
 * _set_local_rank_env, OMP_NUM_THREADS passed through), and torch/distributed/run.py (the
 * "environment variables" list of its docstring; config_from_args sets OMP_NUM_THREADS=1 when it is
 * unset and nproc_per_node > 1; --role defaults to "default", --rdzv-id to "none", --standalone
 * uses a fresh uuid4 as run id). Differences, on purpose:
 *   - TORCHELASTIC_USE_AGENT_STORE is "False": torchrun's static rendezvous hosts a c10d TCPStore
 *     in the agent at MASTER_PORT and says "True". ddprun's store speaks libddp's protocol, not
 *     c10d's, so it is not at MASTER_PORT: a torch program reads "False" and its rank 0 creates
 *     torch's store at MASTER_PORT as under mpirun, and libddp finds ddprun's store by
 *     DDP_LAUNCHER_STORE instead (THE STORE).
 *   - DDP_JOB_SECRET is added (libddp's rendezvous refuses ranks that do not present it), and
 *     DDP_LAUNCHER_STORE, and DDP_ELASTIC_MIN_RANKS under --elastic.
 *   - Not set: TORCHELASTIC_ERROR_FILE (torchrun's error-file protocol) and the file-timer
 *     watchdog variables; ddprun has neither feature.
 *
 * THE STORE. ddprun serves libddp's rendezvous store itself, in a thread of its own, and every
 * rank is a client of it (DDP_LAUNCHER_STORE=HOST:PORT): the store outlives any rank, rank 0
 * included, which a communicator that shrinks after a lost rank needs (torchrun's agent store is
 * there for the same reason). It is libddp's server (ddp_store_server.h): the job secret proven
 * by challenge-response before a connection may do anything, and bounded in what a connection
 * that has not proven it may cost. One host: on MASTER_ADDR (127.0.0.1 by default: loopback
 * only), on a port the kernel picks. Several hosts: node 0's ddprun serves it on MASTER_ADDR at
 * --store-port (default MASTER_PORT + 1), the other ddprun processes only pass the address on.
 * One store per attempt: opened before the ranks start, closed after the last has exited, so a
 * restart starts from an empty store (a new secret too, when ddprun made it); libddp's keys are
 * also under libddp/<run id>/attempt_<n>/, as under torchrun's agent store. The server thread
 * blocks every signal (ddprun's handlers run in the main thread), and since ddprun is no longer
 * single-threaded, a rank's environment is made before fork and the child calls only
 * async-signal-safe functions until exec. A program that does not use libddp ignores it all.
 *
 * ELASTIC. --elastic MIN: a rank that fails (non-zero exit or a signal) is "lost", logged at
 * once (rank, pid, how, UTC time and seconds into the attempt), and the others keep running,
 * while at least MIN of the NPROC ranks have not failed; the loss that leaves fewer than MIN is
 * the usual failure (the rest stopped, the FAILED summary, that rank's status; not restarted:
 * see REPLACEMENTS). A job whose remaining ranks all exit 0 ends with a DEGRADED summary naming the
 * lost ranks and status 0: the job did its work, with fewer ranks; the summary is how a script
 * tells (torchelastic's agent also reports success once its workers succeeded). One host only:
 * each ddprun sees only its own ranks, and ddprun processes do not talk to each other.
 *
 * REPLACEMENTS. --elastic with --max-restarts N: a lost rank's slot gets a new process, up to N
 * in all over the job (torchrun's name for its budget; torchrun spends it restarting everything,
 * which is what --elastic avoids). The replacement has its slot's environment, built as for the
 * attempt's ranks (same store, secret and TORCHELASTIC_RESTART_COUNT, so the store's keys are the
 * running attempt's), plus DDP_ELASTIC_JOIN=1 (libddp's ddp_comm_init_env then joins the running
 * job: the members admit it at a step boundary) and DDP_ELASTIC_REPLACEMENT=k. ddprun watches it
 * as that slot: its failure is one more loss, replaced again while the budget lasts. MIN is
 * checked before replacing: the members must go on without the lost rank (shrink) before a
 * replacement can join them, so a loss that leaves fewer than MIN ends the job even with budget
 * left. Under --elastic the group is never restarted as a whole: one budget, one meaning. The
 * lost process stays an unreaped zombie (its group id stays ours, see PROCESS GROUPS) and what
 * it left holding its output is still read (j->retired) while the slot's new process runs.
 *
 * PROCESS GROUPS. Every rank starts a new session (setsid), so it leads its own process group, and
 * every signal ddprun sends goes to the whole group (killpg): a rank that is a shell script, or
 * that forked workers, is stopped completely, and nothing is left holding the output pipes.
 * Current torchrun does the same (SubprocessHandler: Popen(start_new_session=True), os.killpg).
 * The cost: Ctrl-C in the terminal reaches only ddprun, which forwards it (below). A rank also gets
 * PR_SET_PDEATHSIG=SIGKILL, so a ddprun killed with SIGKILL does not leave ranks behind.
 * Exited ranks are not reaped (waitid with WNOWAIT) until the whole group is down: a zombie keeps
 * its pid, so its process-group id cannot be reused by an unrelated process while ddprun may
 * still signal that group.
 *
 * RESTARTS. Without --elastic, as torchrun (run.py, "Failure Modes"): when any rank fails, the
 * whole group is stopped and started again, up to --max-restarts times, with
 * TORCHELASTIC_RESTART_COUNT = restarts so far and the same TORCHELASTIC_RUN_ID. A port that
 * ddprun chose, and a secret it made, are new for every attempt: a straggler of the failed
 * attempt cannot join the new rendezvous, and the old port may still be in TIME_WAIT. A
 * --master-port given by the user stays (the other hosts know only that one), as with torchrun's
 * static rendezvous. A job stopped by a signal to ddprun is not restarted (in torchrun a
 * SignalException ends the run, too).
 *
 * OUTPUT AS IT IS PRINTED. A rank's stdout is a pseudo-terminal (raw mode: no echo, no CR added),
 * as Open MPI's mpirun gives its local processes, because C's stdio (and Python's) buffers a
 * pipe in blocks of 4-64 KiB but a terminal by lines: through a pipe a rank printing one line a
 * second showed nothing until it exited. stderr stays a pipe (it is unbuffered already). The
 * slave side is opened with O_NOCTTY before fork and never becomes the rank's controlling
 * terminal, so no SIGHUP or job control reaches a rank through it. --no-pty keeps a pipe (for
 * programs that change behaviour on a terminal); without a usable /dev/ptmx ddprun falls back to
 * a pipe and says so once.
 *
 * NEVER HANG. The only unbounded wait is for ranks that are running normally. Once ddprun stops a
 * group (a rank failed, or ddprun got a signal) it waits at most the grace period before SIGKILL,
 * then at most KILL_WAIT_MS for the kernel to deliver it, and after the last rank has exited it
 * reads the pipes for at most DRAIN_MS (an escaped grandchild may hold them open forever).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* pipe2, dprintf, NSIG, PR_SET_PDEATHSIG */
#endif
#include <arpa/inet.h>
#include <errno.h>
#include <getopt.h>
#include <fcntl.h>
#include <limits.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif
/* The library's store, server side: ddprun serves the rendezvous (THE STORE above); nothing else
 * of the library is built in. */
#define DDP_STATIC
#define DDP_STORE_IMPLEMENTATION
#include "../ddp_store.h"

enum {
    MAX_NPROC = 1024,
    TAIL_LINES = 10,      /* stderr lines kept per rank for the failure summary */
    TAIL_BYTES = 512,     /* longer lines are cut in the summary (not in the output) */
    LINE_CAP = 16384,     /* a line longer than this is passed on in pieces of this size */
    KILL_WAIT_MS = 5000,  /* after SIGKILL: how long to wait for the kernel to deliver it */
    DRAIN_MS = 1000,      /* after the last rank exited: how long to read pipes still open */
    DRAIN_READS = 64      /* a lost rank's pipes: reads at most before ddprun says it is lost */
};
#define DEFAULT_GRACE_S 5.0
#if defined(__GNUC__) || defined(__clang__)
#define PRINTF_LIKE(f, a) __attribute__((format(printf, f, a)))
#else
#define PRINTF_LIKE(f, a)
#endif
#define USAGE "usage: ddprun [options] [-n NPROC] prog [args...]   (ddprun --help for the manual)"

/* One string per line: ISO C99 only promises string literals of 4095 characters. */
static const char *const k_help[] = {
    "NAME\n",
    "    ddprun - start the ranks of a libddp (or torchrun-style) job on this host\n",
    "\n",
    "SYNOPSIS\n",
    "    ddprun [-n NPROC] [options] prog [args...]\n",
    "    ddprun -n NPROC --nnodes N --node-rank R --master-addr HOST --master-port PORT\n",
    "           [options] prog [args...]\n",
    "\n",
    "DESCRIPTION\n",
    "    Starts NPROC copies of prog on this host, one per rank, with the environment\n",
    "    torchrun gives its workers (see ENVIRONMENT), so programs that call\n",
    "    ddp_comm_init_env() and torchrun-style programs both find their rank, the world\n",
    "    size and the rendezvous address.\n",
    "\n",
    "    On one host (--nnodes 1, the default) ddprun picks a free TCP port for the\n",
    "    rendezvous itself unless --master-port is given, so concurrent jobs do not\n",
    "    collide. On several hosts, run one ddprun per host with the same -n, --nnodes,\n",
    "    --master-addr and --master-port, and each its own --node-rank; ranks are\n",
    "    numbered RANK = node_rank * NPROC + LOCAL_RANK.\n",
    "\n",
    "    Each line a rank writes to stdout or stderr goes to ddprun's stdout or stderr\n",
    "    with the prefix \"[rank N] \" (none where libddp's \"[ddp rank N] \" begins it),\n",
    "    written whole, so lines of different ranks never mix;\n",
    "    an unfinished last line is passed on when the rank exits. A rank's stdout is a\n",
    "    pseudo-terminal (as under mpirun), so its lines arrive as they are printed, not\n",
    "    when a pipe's buffer fills (see --no-pty).\n",
    "\n",
    "    ddprun serves the rendezvous store itself (libddp's, authenticated with the job\n",
    "    secret) and the ranks connect to it as clients (DDP_LAUNCHER_STORE), so the store\n",
    "    outlives any rank, rank 0 included. On several hosts node 0's ddprun serves it\n",
    "    (see --store-port).\n",
    "\n",
    "    Fail-fast: when a rank exits with a non-zero code or is killed by a signal, every\n",
    "    other rank gets SIGTERM, and SIGKILL if it is still running after the grace period.\n",
    "    ddprun then prints one summary to stderr naming the first rank that failed, its exit\n",
    "    code or signal, and its last stderr lines, and exits with that rank's status (see\n",
    "    EXIT STATUS). With --max-restarts N the whole group is started again instead, up to\n",
    "    N times, with TORCHELASTIC_RESTART_COUNT counting the restarts. With --elastic MIN\n",
    "    a failed rank is lost instead, and the others go on while MIN remain; with both,\n",
    "    a lost rank is replaced by a new process that joins the running job, up to N\n",
    "    times.\n",
    "\n",
    "    SIGINT, SIGTERM, SIGHUP and SIGQUIT sent to ddprun are forwarded to every rank,\n",
    "    then the same grace period and SIGKILL apply; a second such signal sends SIGKILL at\n",
    "    once. A job stopped by a signal is not restarted. SIGINT, SIGHUP or SIGQUIT that\n",
    "    were ignored when ddprun started (nohup; a script's background job) stay ignored,\n",
    "    by ddprun and by the ranks.\n",
    "\n",
    "    Each rank leads its own process group (a new session), and signals go to the whole\n",
    "    group, so processes a rank started are stopped with it. When the job ends, whatever\n",
    "    is left in those groups gets SIGTERM (SIGKILL if the job was being stopped). If\n",
    "    ddprun itself is killed by SIGKILL, the ranks get SIGKILL (Linux parent-death\n",
    "    signal). stdin is inherited.\n",
    "\n",
    "OPTIONS\n",
    "    Options end at the first argument that is not an option, or at \"--\". Each long\n",
    "    option also accepts torchrun's spelling with underscores (--nproc_per_node) and\n",
    "    the form --option=value.\n",
    "\n",
    "    -n NPROC, -np NPROC, --nproc-per-node NPROC\n",
    "        Ranks on this host, 1..1024, or \"cpu\"/\"auto\" for the number of online CPUs.\n",
    "        Default 1. (-np is mpirun's spelling.)\n",
    "    --nnodes N\n",
    "        Number of hosts (each runs its own ddprun). Default 1. Elastic ranges\n",
    "        (MIN:MAX) are not supported (for a minimum of ranks see --elastic).\n",
    "    --node-rank R\n",
    "        This host's index, 0..N-1. Default 0.\n",
    "    --master-addr HOST\n",
    "        Host of node 0, where node 0's ddprun serves the rendezvous store (and where a\n",
    "        torch program's rank 0 serves its own). Default 127.0.0.1.\n",
    "    --master-port PORT\n",
    "        Rendezvous port on the master. Required when --nnodes > 1. On one host the\n",
    "        default (or 0) is a free port that ddprun chooses, a new one for each restart.\n",
    "    --elastic MIN\n",
    "        A rank that fails no longer ends the job while at least MIN ranks (1..NPROC)\n",
    "        have not failed: ddprun prints \"ddprun: LOST: rank R ...\" to stderr (how it\n",
    "        ended, the UTC time, seconds into the attempt, how many remain) and the other\n",
    "        ranks keep running; the ranks see DDP_ELASTIC_MIN_RANKS=MIN. The failure that\n",
    "        leaves fewer than MIN ends the job as without --elastic, but the group is not\n",
    "        restarted (see --max-restarts); its summary also lists the ranks lost before.\n",
    "        One host only.\n",
    "    --store-port PORT\n",
    "        With --nnodes > 1: the port where node 0's ddprun serves the rendezvous store,\n",
    "        on --master-addr. Default --master-port + 1; give every host the same value. On\n",
    "        one host the default is a free port the kernel picks.\n",
    "    --max-restarts N\n",
    "        Restart the whole group up to N times after a failure. Default 0.\n",
    "        With --elastic it counts replacements instead: a lost rank's slot gets a new\n",
    "        process, up to N in all, with the lost rank's environment (RANK, LOCAL_RANK,\n",
    "        the attempt's store, secret and TORCHELASTIC_RESTART_COUNT) plus\n",
    "        DDP_ELASTIC_JOIN=1 and DDP_ELASTIC_REPLACEMENT=K (the K-th replacement):\n",
    "        it joins the running job (libddp's ddp_comm_init_env waits until the ranks\n",
    "        admit it) instead of starting a new one. ddprun prints \"ddprun: REPLACED\n",
    "        rank R ...\" and watches the replacement as rank R: if it fails, that is a\n",
    "        loss like any other (replaced again while the budget lasts). Once all N are\n",
    "        used a loss is not replaced (\"ddprun: NOT REPLACED ...\") and the job goes on\n",
    "        with fewer ranks. Under --elastic the group is never restarted as a whole:\n",
    "        the loss that leaves fewer than MIN ends the job. A program that cannot join\n",
    "        a running job fails (at once, or when its rendezvous times out), and each such\n",
    "        failure uses up one replacement.\n",
    "    --grace-period SECONDS\n",
    "        Time between SIGTERM and SIGKILL when stopping ranks (may be fractional).\n",
    "        Default 5.\n",
    "    --no-prefix\n",
    "        Pass output lines on without the \"[rank N] \" prefix (still whole lines).\n",
    "    --log-dir DIR\n",
    "        Write each rank's output, unprefixed, to DIR/rank_N.out and DIR/rank_N.err\n",
    "        (N: global rank; DIR is created; files are truncated when ddprun starts and\n",
    "        appended to by restarts and replacements) instead of the terminal.\n",
    "    --tee\n",
    "        With --log-dir: also pass the output on to ddprun's stdout and stderr.\n",
    "    --trace FILE\n",
    "        Record every rank's collectives as Chrome trace events (DDP_TRACE=FILE.%r.part for\n",
    "        the ranks) and merge this node's ranks into FILE when the job ends: open it in\n",
    "        Perfetto (ui.perfetto.dev) or chrome://tracing; one process per rank.\n",
    "    --role NAME\n",
    "        ROLE_NAME for the ranks. Default \"default\".\n",
    "    --rdzv-id ID\n",
    "        TORCHELASTIC_RUN_ID. Default: a random UUID on one host, \"none\" (torchrun's\n",
    "        default) on several.\n",
    "    --standalone\n",
    "        Accepted for torchrun compatibility: one host, free port (the default).\n",
    "    --no-pty\n",
    "        Give each rank's stdout a pipe instead of a pseudo-terminal. With a pipe, C and\n",
    "        Python buffer stdout in blocks, so lines arrive late (when the buffer fills or\n",
    "        the rank exits) unless the program flushes; use it for programs that behave\n",
    "        differently on a terminal.\n",
    "    -h, --help\n",
    "        Print this manual to stdout and exit 0.\n",
    "    -V, --version\n",
    "        Print ddprun's (libddp's) version and exit 0.\n",
    "\n",
    "ENVIRONMENT\n",
    "    Set for every rank (torchrun's names and values):\n",
    "      RANK, WORLD_SIZE            global rank, NPROC * N\n",
    "      LOCAL_RANK, LOCAL_WORLD_SIZE  rank on this host, NPROC\n",
    "      GROUP_RANK, GROUP_WORLD_SIZE  --node-rank, --nnodes\n",
    "      ROLE_RANK, ROLE_WORLD_SIZE  same as RANK, WORLD_SIZE (one role)\n",
    "      ROLE_NAME                   --role\n",
    "      MASTER_ADDR, MASTER_PORT    where a torch program's rank 0 serves its store\n",
    "      TORCHELASTIC_RESTART_COUNT  restarts so far (0 on the first attempt)\n",
    "      TORCHELASTIC_MAX_RESTARTS   --max-restarts\n",
    "      TORCHELASTIC_RUN_ID         --rdzv-id\n",
    "      TORCHELASTIC_USE_AGENT_STORE  \"False\": ddprun's store is not a c10d one\n",
    "      TORCH_NCCL_ASYNC_ERROR_HANDLING  kept if set, else \"1\" (as torchrun)\n",
    "      OMP_NUM_THREADS             kept if set, else \"1\" when NPROC > 1 (as torchrun)\n",
    "      DDP_JOB_SECRET              rendezvous secret. Kept if set in ddprun's\n",
    "                                  environment; else, on one host, 32 random hex\n",
    "                                  digits from /dev/urandom, new for each restart. On\n",
    "                                  several hosts export the same value on each (else\n",
    "                                  the rendezvous is not authenticated).\n",
    "      DDP_LAUNCHER_STORE          HOST:PORT of ddprun's store (libddp ranks connect\n",
    "                                  to it; none of them serves one)\n",
    "      DDP_ELASTIC_MIN_RANKS       MIN, under --elastic only\n",
    "      DDP_ELASTIC_JOIN            \"1\", for a replacement only (--elastic with\n",
    "                                  --max-restarts): join the running job\n",
    "      DDP_ELASTIC_REPLACEMENT     K, for the K-th replacement only (1, 2, ...)\n",
    "    Everything else in ddprun's environment is passed on unchanged.\n",
    "\n",
    "EXIT STATUS\n",
    "    0        every rank exited with code 0; with --elastic, every process not lost\n",
    "             did (the summary says DEGRADED and names the lost ranks, or RECOVERED\n",
    "             when replacements brought the job back to NPROC ranks)\n",
    "    1..255   the exit code of the first rank that failed (with --elastic: of the\n",
    "             rank whose loss left fewer than MIN)\n",
    "    128+S    the first rank that failed was killed by signal S, or ddprun got\n",
    "             signal S and forwarded it\n",
    "    1        ddprun could not start the job (the message says why)\n",
    "    2        bad command line\n",
    "\n",
    "EXAMPLES\n",
    "    ddprun -n 4 build/train_demo\n",
    "        Four ranks on this host, rendezvous on a free port.\n",
    "    ddprun -n 4 --log-dir logs --max-restarts 2 ./train --epochs 10\n",
    "        Output in logs/rank_0.out ...; restart the group up to twice.\n",
    "    ddprun -n 8 --nnodes 2 --node-rank 0 --master-addr node0 --master-port 29500 ./train\n",
    "    ddprun -n 8 --nnodes 2 --node-rank 1 --master-addr node0 --master-port 29500 ./train\n",
    "        Sixteen ranks on two hosts (run the first line on node0, the second on node1,\n",
    "        after exporting the same DDP_JOB_SECRET on both). node0's ddprun serves the\n",
    "        store on port 29501, which node1 must reach too.\n",
    "    ddprun -n 4 --elastic 3 ./train\n",
    "        Four ranks; the job goes on after losing one (any one, rank 0 included), and\n",
    "        ends after losing two.\n",
    "    ddprun -n 4 --elastic 3 --max-restarts 2 ./train\n",
    "        The same, and a lost rank is replaced by a process that joins the running\n",
    "        job, twice at most; the program must support joining (ddp_comm_init_env).\n",
};

typedef struct {
    int nproc, nnodes, node_rank;
    const char *master_addr;
    int master_port;          /* 0: choose a free one (one host only) */
    int max_restarts;
    double grace_s;
    int prefix, tee;
    int no_pty;               /* --no-pty: stdout through a pipe */
    const char *log_dir, *role, *run_id;
    const char *trace;        /* --trace FILE, or NULL */
    int elastic_min;          /* --elastic MIN: a lost rank is tolerated while MIN remain; 0: off */
    int store_port;           /* --store-port: where node 0's ddprun serves the store (0: default) */
    char **argv;              /* the program and its arguments */
} opts_t;

typedef struct {
    int fd;                   /* read end of the rank's pipe; -1 after EOF */
    int console_fd;           /* 1 or 2; -1 when the console does not get it */
    int file_fd;              /* --log-dir file, or -1 */
    int is_stderr;
    size_t len;               /* bytes of an unfinished line in buf */
    char *buf;                /* LINE_CAP bytes */
} stream_t;

typedef struct {
    int rank, local_rank;
    pid_t pid;                /* 0: not started this attempt */
    int exited;               /* waitid saw it exit; still a zombie until the attempt ends */
    int code, signo, core;    /* exit code, or the signal that killed it */
    int exit_seq;             /* the order of its exit among the attempt's (1, 2, ...) */
    int lost;                 /* --elastic: its failure was tolerated and logged (and the slot
                               * not refilled: a replacement clears it) */
    double exit_s;            /* now_s() when ddprun saw it exit */
    char exit_wall[32];       /* the same moment, UTC wall clock, for the log and the summary */
    stream_t out, err;
    char tail[TAIL_LINES][TAIL_BYTES];
    int tail_n, tail_next;
} rank_t;

/* --elastic: one process lost while the job went on (the slot's rank_t is reused when a
 * replacement takes its place, so the loss is kept here). */
typedef struct {
    int slot;                 /* its index in ranks: the rank it was */
    pid_t pid;
    int code, signo, core;
    double exit_s;
    char exit_wall[32];
    int replacement;          /* the k-th replacement was started in its place (1, 2, ...); 0: none */
    int not_replaced;         /* 0 (--max-restarts 0), NR_BUDGET or NR_SPAWN */
    pid_t rpid;               /* the replacement's pid */
    double rstart_s;          /* now_s() when it was started */
} loss_t;
enum { NR_BUDGET = 1, NR_SPAWN = 2 };

typedef struct {
    opts_t o;
    rank_t *ranks;
    int world_size;
    char run_id[64];
    char *outbuf;             /* one prefixed line, assembled for one write(2) */
    int console_dead[3];      /* stdout/stderr gone (EPIPE...): output is dropped, ranks go on */
    int file_warned;
    int pty_warned;           /* said once that stdout goes through pipes */
    int exits_seen;           /* SIGCHLDs of the log (on_sigchld) that scan_exits has read */
    int exit_seq;             /* exits noted this attempt */
    int nlost;                /* --elastic: processes lost this attempt, the job going on */
    int ndown;                /* --elastic: of the NPROC slots, those lost and not refilled */
    loss_t *losses;           /* --elastic: the nlost losses, in order */
    int losses_cap;
    int nreplaced;            /* --elastic --max-restarts: replacements started this attempt */
    pid_t *zombies;           /* lost processes whose slot a replacement took: unreaped until */
    int nzombies, zombies_cap;/* the attempt ends, so that their group ids stay ours */
    rank_t *retired;          /* their output, while something they started still holds it */
    int nretired, retired_cap;
    int attempt, port;        /* the running attempt's, for a replacement's environment */
    const char *secret;
    double attempt_t0;        /* now_s() when the attempt started */
    ddp_store_t *store;       /* the store this ddprun serves (node 0), or NULL */
    char store_addr[300];     /* DDP_LAUNCHER_STORE for the ranks: HOST:PORT */
} job_t;

/* What ended an attempt. */
typedef struct {
    int failed;               /* index of the first failed rank, or -1 */
    int signo;                /* ddprun got this signal and forwarded it, or 0 */
    int spawn_error;          /* ddprun could not start every rank */
    int stopped;              /* ranks still running when the group was stopped */
    int killed;               /* of those, still running at the end of the grace period */
    int stuck;                /* still running even after SIGKILL (left behind) */
    int below_min;            /* --elastic: oc.failed's loss left fewer than MIN ranks */
} outcome_t;

/* The signal handlers' state: the only globals, since a handler has no other way to talk. */
static int g_wake_w = -1;                       /* self-pipe: a byte per signal wakes poll() */
static volatile sig_atomic_t g_sig_count[NSIG]; /* deliveries per signal number */
static int g_ignored[NSIG];                     /* ignored when ddprun started: left ignored */
/* RLIMIT_NOFILE as ddprun found it: the store's server raises the soft limit to the hard one
 * (a descriptor per rank), and the ranks get back the limit they would have had without it. */
static struct rlimit g_nofile;
static int g_nofile_ok;

static const int k_forwarded[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT};

static void on_signal(int s) {
    int saved = errno;
    char b = (char)s;
    if (s > 0 && s < NSIG) g_sig_count[s]++;
    if (g_wake_w >= 0 && write(g_wake_w, &b, 1) < 0) { /* pipe full: poll wakes anyway */ }
    errno = saved;
}

/* The order in which the ranks exited, as far as ddprun can know it: "the first rank that
 * failed" is the one that exited first, not the one with the lowest number among those that
 * one look found gone. The kernel says it in SIGCHLD: each delivery carries the pid of the
 * child whose exit raised it, in the order they exited. Not waitpid's order: that is the order
 * the children were created (Linux walks its list of children), whoever exited first. SIGCHLD
 * is not queued: a child that exits while one is pending raises none of its own. It exited
 * after the pending one's child, and scan_exits puts it after the children the log names (of
 * three exits between two looks it may misplace one: the best evidence ddprun has). */
#define EXIT_LOG 64
static volatile sig_atomic_t g_exit_pid[EXIT_LOG];   /* si_pid of each SIGCHLD, a ring */
static volatile sig_atomic_t g_exit_n;                /* SIGCHLDs logged so far */

static void on_sigchld(int s, siginfo_t *si, void *uc) {
    (void)uc;
    if (si && si->si_pid > 0) {
        g_exit_pid[g_exit_n % EXIT_LOG] = (sig_atomic_t)si->si_pid;
        g_exit_n = g_exit_n + 1;
    }
    on_signal(s);
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

PRINTF_LIKE(2, 3) static void die(int code, const char *fmt, ...) {
    va_list ap;
    char msg[1024];
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(stderr, "ddprun: %s\n", msg);
    exit(code);
}

PRINTF_LIKE(1, 2) static void usage_error(const char *fmt, ...) {
    va_list ap;
    char msg[1024];
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(stderr, "ddprun: %s\n%s\n", msg, USAGE);
    exit(2);
}

static const char *signal_name(int s) {
    switch (s) {
    case SIGHUP: return "SIGHUP";     case SIGINT: return "SIGINT";
    case SIGQUIT: return "SIGQUIT";   case SIGILL: return "SIGILL";
    case SIGTRAP: return "SIGTRAP";   case SIGABRT: return "SIGABRT";
    case SIGBUS: return "SIGBUS";     case SIGFPE: return "SIGFPE";
    case SIGKILL: return "SIGKILL";   case SIGUSR1: return "SIGUSR1";
    case SIGSEGV: return "SIGSEGV";   case SIGUSR2: return "SIGUSR2";
    case SIGPIPE: return "SIGPIPE";   case SIGALRM: return "SIGALRM";
    case SIGTERM: return "SIGTERM";   case SIGCHLD: return "SIGCHLD";
    case SIGCONT: return "SIGCONT";   case SIGSTOP: return "SIGSTOP";
    case SIGTSTP: return "SIGTSTP";   case SIGTTIN: return "SIGTTIN";
    case SIGTTOU: return "SIGTTOU";   case SIGURG: return "SIGURG";
    case SIGXCPU: return "SIGXCPU";   case SIGXFSZ: return "SIGXFSZ";
    case SIGVTALRM: return "SIGVTALRM"; case SIGPROF: return "SIGPROF";
    case SIGSYS: return "SIGSYS";
    default: return "a real-time or unknown signal";
    }
}

/* ---- command line -------------------------------------------------------------------------- */

static int parse_long(const char *s, long lo, long hi, long *out) {
    char *end;
    long v;
    if (!s || !*s) return -1;
    errno = 0;
    v = strtol(s, &end, 10);
    if (errno || *end || v < lo || v > hi) return -1;
    *out = v;
    return 0;
}

static int int_arg(const char *opt, const char *v, long lo, long hi) {
    long x;
    if (parse_long(v, lo, hi, &x) != 0)
        usage_error("%s: '%s' is not a whole number from %ld to %ld", opt, v, lo, hi);
    return (int)x;
}

enum { O_NPROC = 'n', O_HELP = 'h', O_VERSION = 'V', O_NNODES = 256, O_NODE_RANK, O_MASTER_ADDR,
       O_MASTER_PORT, O_MAX_RESTARTS, O_GRACE, O_LOG_DIR, O_TEE, O_NO_PREFIX, O_ROLE, O_RDZV_ID,
       O_STANDALONE, O_TRACE, O_NO_PTY, O_ELASTIC, O_STORE_PORT };

/* Each long option in both spellings: ours and torchrun's with underscores (--nproc_per_node). */
static const struct option k_long[] = {
    {"nproc-per-node", required_argument, NULL, O_NPROC}, {"nproc_per_node", required_argument, NULL, O_NPROC},
    {"nnodes", required_argument, NULL, O_NNODES},
    {"node-rank", required_argument, NULL, O_NODE_RANK},  {"node_rank", required_argument, NULL, O_NODE_RANK},
    {"master-addr", required_argument, NULL, O_MASTER_ADDR}, {"master_addr", required_argument, NULL, O_MASTER_ADDR},
    {"master-port", required_argument, NULL, O_MASTER_PORT}, {"master_port", required_argument, NULL, O_MASTER_PORT},
    {"max-restarts", required_argument, NULL, O_MAX_RESTARTS}, {"max_restarts", required_argument, NULL, O_MAX_RESTARTS},
    {"grace-period", required_argument, NULL, O_GRACE},   {"grace_period", required_argument, NULL, O_GRACE},
    {"log-dir", required_argument, NULL, O_LOG_DIR},      {"log_dir", required_argument, NULL, O_LOG_DIR},
    {"tee", no_argument, NULL, O_TEE},
    {"no-prefix", no_argument, NULL, O_NO_PREFIX},        {"no_prefix", no_argument, NULL, O_NO_PREFIX},
    {"no-pty", no_argument, NULL, O_NO_PTY},              {"no_pty", no_argument, NULL, O_NO_PTY},
    {"role", required_argument, NULL, O_ROLE},
    {"rdzv-id", required_argument, NULL, O_RDZV_ID},      {"rdzv_id", required_argument, NULL, O_RDZV_ID},
    {"standalone", no_argument, NULL, O_STANDALONE},
    {"trace", required_argument, NULL, O_TRACE},
    {"elastic", required_argument, NULL, O_ELASTIC},
    {"store-port", required_argument, NULL, O_STORE_PORT}, {"store_port", required_argument, NULL, O_STORE_PORT},
    {"help", no_argument, NULL, O_HELP},
    {"version", no_argument, NULL, O_VERSION},
    {NULL, 0, NULL, 0}
};

/* The option as the user wrote it, for messages: "-n", "--nproc_per_node". */
static const char *opt_name(int c, int long_index, char *buf, size_t cap) {
    if (long_index >= 0) snprintf(buf, cap, "--%s", k_long[long_index].name);
    else snprintf(buf, cap, "-%c", c);
    return buf;
}

static void parse_args(int argc, char **argv, opts_t *o) {
    int c, long_index, standalone = 0;
    size_t k;
    memset(o, 0, sizeof *o);
    o->nproc = 1;
    o->nnodes = 1;
    o->master_addr = "127.0.0.1";
    o->grace_s = DEFAULT_GRACE_S;
    o->prefix = 1;
    o->role = "default";
    opterr = 0;   /* our own messages, with the usage line */
    /* "+": options end at the program's name, so its own options are left alone. */
    for (;;) {
        char name[64];
        const char *val;
        long_index = -1;
        c = getopt_long(argc, argv, "+:n:hV", k_long, &long_index);
        if (c == -1) break;
        if (c == '?') {
            const char *arg = argv[optind - 1];
            if (arg[0] == '-' && arg[1] == '-')
                usage_error(optopt ? "option '%s' takes no value" : "unknown option '%s'", arg);
            usage_error("unknown option '-%c'", optopt);
        }
        if (c == ':') usage_error("option '%s' needs a value", argv[optind - 1]);
        opt_name(c, long_index, name, sizeof name);
        val = optarg;
        if (c == O_NPROC && long_index < 0 && val && val[0] == 'p') {   /* -np N, -npN: mpirun's */
            snprintf(name, sizeof name, "-np");
            if (val[1]) val++;
            else if (optind < argc) val = argv[optind++];
            else usage_error("option '-np' needs a value");
        }
        switch (c) {
        case O_NPROC:
            if (strcmp(val, "cpu") == 0 || strcmp(val, "auto") == 0) {
                long n = sysconf(_SC_NPROCESSORS_ONLN);
                o->nproc = n < 1 ? 1 : n > MAX_NPROC ? MAX_NPROC : (int)n;
            } else {
                o->nproc = int_arg(name, val, 1, MAX_NPROC);
            }
            break;
        case O_NNODES:
            if (strchr(val, ':')) usage_error("%s: elastic ranges ('%s') are not supported; give one number (for a "
                                                "minimum of ranks on one host: --elastic MIN)", name, val);
            o->nnodes = int_arg(name, val, 1, 1 << 20);
            break;
        case O_NODE_RANK: o->node_rank = int_arg(name, val, 0, (1 << 20) - 1); break;
        case O_MASTER_ADDR:
            if (!*val) usage_error("%s: empty host", name);
            o->master_addr = val;
            break;
        case O_MASTER_PORT: o->master_port = int_arg(name, val, 0, 65535); break;
        case O_MAX_RESTARTS: o->max_restarts = int_arg(name, val, 0, 1000000); break;
        case O_GRACE: {
            char *end;
            errno = 0;
            o->grace_s = strtod(val, &end);
            if (errno || end == val || *end || !(o->grace_s >= 0 && o->grace_s <= 86400))
                usage_error("%s: '%s' is not a number of seconds from 0 to 86400", name, val);
            break;
        }
        case O_LOG_DIR:
            if (!*val) usage_error("%s: empty directory name", name);
            o->log_dir = val;
            break;
        case O_TEE: o->tee = 1; break;
        case O_NO_PREFIX: o->prefix = 0; break;
        case O_NO_PTY: o->no_pty = 1; break;
        case O_ROLE: o->role = val; break;
        case O_RDZV_ID: o->run_id = val; break;
        case O_STANDALONE: standalone = 1; break;
        case O_TRACE:
            if (!*val) usage_error("%s: empty file name", name);
            o->trace = val;
            break;
        case O_ELASTIC: o->elastic_min = int_arg(name, val, 1, MAX_NPROC); break;
        case O_STORE_PORT: o->store_port = int_arg(name, val, 1, 65535); break;
        case O_HELP:
            for (k = 0; k < sizeof k_help / sizeof k_help[0]; k++) fputs(k_help[k], stdout);
            exit(0);
        case O_VERSION:
#ifdef DDP_VERSION_PATCH
            printf("ddprun (libddp) %d.%d.%d\n", DDP_VERSION_MAJOR, DDP_VERSION_MINOR, DDP_VERSION_PATCH);
#else
            printf("ddprun (libddp) %d.%d\n", DDP_VERSION_MAJOR, DDP_VERSION_MINOR);
#endif
            exit(0);
        default: usage_error("unknown option '%s'", argv[optind - 1]);
        }
    }
    if (optind >= argc) usage_error("no program to run");
    o->argv = argv + optind;
    if (o->node_rank >= o->nnodes)
        usage_error("--node-rank %d is not below --nnodes %d", o->node_rank, o->nnodes);
    if (standalone && o->nnodes > 1) usage_error("--standalone means one host, but --nnodes is %d", o->nnodes);
    if (o->nnodes > 1 && o->master_port == 0)
        usage_error("--nnodes %d needs --master-port (every host must name the same port)", o->nnodes);
    if ((long)o->nnodes * o->nproc > INT_MAX) usage_error("--nnodes x --nproc-per-node is too large");
    if (o->tee && !o->log_dir) usage_error("--tee needs --log-dir");
    if (o->elastic_min && o->nnodes > 1)
        usage_error("--elastic works on one host only (each ddprun sees only its own ranks)");
    if (o->elastic_min > o->nproc)
        usage_error("--elastic %d: the minimum is more than the %d ranks started", o->elastic_min, o->nproc);
    if (o->nnodes > 1 && !o->store_port && o->master_port == 65535)
        usage_error("--master-port 65535 leaves no port for the store: give --store-port");
}

/* ---- randomness, port ---------------------------------------------------------------------- */

static void random_bytes(unsigned char *b, size_t n) {
    size_t got = 0;
    int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    if (fd < 0) die(1, "cannot open /dev/urandom for the job secret: %s", strerror(errno));
    while (got < n) {
        ssize_t r = read(fd, b + got, n - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) die(1, "cannot read /dev/urandom for the job secret: %s", r < 0 ? strerror(errno) : "end of file");
        got += (size_t)r;
    }
    close(fd);
}

static void random_hex(char *out, size_t nbytes) {
    unsigned char b[64];
    size_t i;
    random_bytes(b, nbytes);
    for (i = 0; i < nbytes; i++) sprintf(out + 2 * i, "%02x", b[i]);
}

/* A port that is free on every address of this host, for rank 0's rendezvous.
 *
 * The classic way (bind port 0, read the port, close) leaves a race: between the close and rank
 * 0's bind, anything else on the host may be handed the same port. So the port is kept reserved:
 * we bind it on the wildcard address with SO_REUSEADDR, connect to it once over loopback and close
 * the accepted end first. That end then sits in TIME_WAIT (60 s on Linux), which keeps the port out
 * of the kernel's choice for every bind(port 0) and every connect() on the host, while a
 * server that sets SO_REUSEADDR (libddp's store, torch's TCPStore, most servers) can still bind
 * it. What remains is another program binding this very port number explicitly within that
 * minute: the same exposure as any fixed --master-port, which is acceptable.
 * If the loopback handshake fails we fall back to the plain bind-and-close. */
static int reserve_free_port(void) {
    struct sockaddr_in a;
    socklen_t al = sizeof a;
    int one = 1, port, l, c = -1, s = -1;
    l = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (l < 0) return -1;
    setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_ANY);
    if (bind(l, (struct sockaddr *)&a, sizeof a) != 0 || listen(l, 1) != 0 ||
        getsockname(l, (struct sockaddr *)&a, &al) != 0) {
        close(l);
        return -1;
    }
    port = ntohs(a.sin_port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    c = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (c >= 0 && connect(c, (struct sockaddr *)&a, sizeof a) == 0)
        s = accept(l, NULL, NULL);
    if (s >= 0) close(s); /* the server side closes first: it is the one left in TIME_WAIT */
    if (c >= 0) close(c);
    close(l);
    return port;
}

/* ---- output -------------------------------------------------------------------------------- */

/* One write(2) per line when it can; the loop only finishes a partial write (a signal or a full
 * pipe), and ddprun is the only writer, so a line is still never split by another's. */
static void write_all(job_t *j, int fd, const char *p, size_t n) {
    while (n > 0 && !j->console_dead[fd]) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w < 0) { j->console_dead[fd] = 1; return; }
        p += w;
        n -= (size_t)w;
    }
}

static void tail_push(rank_t *r, const char *line, size_t n) {
    char *t = r->tail[r->tail_next];
    if (n >= TAIL_BYTES) {
        memcpy(t, line, TAIL_BYTES - 4);
        memcpy(t + TAIL_BYTES - 4, "...", 4);
    } else {
        memcpy(t, line, n);
        t[n] = 0;
    }
    r->tail_next = (r->tail_next + 1) % TAIL_LINES;
    if (r->tail_n < TAIL_LINES) r->tail_n++;
}

/* A line that names its rank already ("[ddp rank 3] WARN ...", libddp's own prefix) gets no
 * second one: one prefix per line. */
static int names_its_rank(const rank_t *r, const char *line, size_t n) {
    char own[40];
    int k = snprintf(own, sizeof own, "[ddp rank %d] ", r->rank);
    return k > 0 && (size_t)k <= n && memcmp(line, own, (size_t)k) == 0;
}

static void emit_line(job_t *j, rank_t *r, stream_t *s, const char *line, size_t n) {
    if (s->is_stderr) tail_push(r, line, n);
    if (s->console_fd >= 0 && !j->console_dead[s->console_fd]) {
        int k = j->o.prefix && !names_its_rank(r, line, n) ? sprintf(j->outbuf, "[rank %d] ", r->rank) : 0;
        memcpy(j->outbuf + k, line, n);
        j->outbuf[k + (int)n] = '\n';
        write_all(j, s->console_fd, j->outbuf, (size_t)k + n + 1);
    }
}

static void file_write(job_t *j, stream_t *s, const char *p, size_t n) {
    while (n > 0 && s->file_fd >= 0) {
        ssize_t w = write(s->file_fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w < 0) {
            if (!j->file_warned++) fprintf(stderr, "ddprun: writing to --log-dir failed: %s (log files stop here)\n", strerror(errno));
            close(s->file_fd);
            s->file_fd = -1;
            return;
        }
        p += w;
        n -= (size_t)w;
    }
}

/* Reads what the pipe has; passes complete lines on. Returns 0 at end of file. */
static int stream_read(job_t *j, rank_t *r, stream_t *s) {
    ssize_t got;
    size_t start = 0, i;
    for (;;) {
        got = read(s->fd, s->buf + s->len, LINE_CAP - s->len);
        if (got >= 0 || errno != EINTR) break;
    }
    if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return 1;
    if (got <= 0) {   /* a pipe's end, or EIO: a pseudo-terminal whose every slave is closed */
        if (s->len) emit_line(j, r, s, s->buf, s->len); /* the unfinished last line */
        s->len = 0;
        return 0;
    }
    file_write(j, s, s->buf + s->len, (size_t)got);
    for (i = s->len; i < s->len + (size_t)got; i++) {
        if (s->buf[i] == '\n') {
            emit_line(j, r, s, s->buf + start, i - start);
            start = i + 1;
        }
    }
    s->len += (size_t)got;
    if (start == 0 && s->len == LINE_CAP) { /* a line longer than the buffer: pass on a piece */
        emit_line(j, r, s, s->buf, s->len);
        start = s->len;
    }
    memmove(s->buf, s->buf + start, s->len - start);
    s->len -= start;
    return 1;
}

static void stream_close(stream_t *s) {
    if (s->fd >= 0) close(s->fd);
    s->fd = -1;
    s->len = 0;
}

/* ---- ranks --------------------------------------------------------------------------------- */

/* A rank's environment, made in ddprun before fork: the store's server thread runs in ddprun, so
 * the child may call only async-signal-safe functions until exec (no setenv, no malloc). */
typedef struct {
    char **v;                 /* NULL-terminated, for environ */
    size_t n, cap;
    char **own;               /* the "NAME=value" strings made here, freed after fork */
    size_t nown;
} envv_t;

static void env_init(envv_t *e, size_t extra) {
    size_t n = 0;
    while (environ && environ[n]) n++;
    e->cap = n + extra + 1;
    e->v = (char **)calloc(e->cap, sizeof *e->v);
    e->own = (char **)calloc(extra, sizeof *e->own);
    if (!e->v || !e->own) die(1, "out of memory");
    if (n) memcpy(e->v, environ, n * sizeof *e->v);
    e->n = n;
    e->nown = 0;
}

/* NAME=value, replacing NAME (unless keep: then an existing NAME stays). Each call makes at most
 * one string, and env_init was told how many calls there are. */
static void env_put(envv_t *e, const char *name, const char *value, int keep) {
    const size_t nl = strlen(name);
    size_t i;
    char *kv;
    for (i = 0; i < e->n; i++)
        if (!strncmp(e->v[i], name, nl) && e->v[i][nl] == '=') break;
    if (i < e->n && keep) return;
    kv = (char *)malloc(nl + strlen(value) + 2);
    if (!kv) die(1, "out of memory");
    sprintf(kv, "%s=%s", name, value);
    e->own[e->nown++] = kv;
    if (i == e->n) e->n++;
    e->v[i] = kv;
}

static void env_put_int(envv_t *e, const char *name, long v) {
    char b[32];
    snprintf(b, sizeof b, "%ld", v);
    env_put(e, name, b, 0);
}

static void env_free(envv_t *e) {
    size_t i;
    for (i = 0; i < e->nown; i++) free(e->own[i]);
    free(e->own);
    free(e->v);
}

enum { ENV_PUTS = 24 };   /* env_put calls in rank_env, at most */
/* replacement: 0 for the ranks started with the attempt; k for the k-th replacement (--elastic
 * --max-restarts), which gets its slot's environment (the attempt's store, secret and restart
 * count: the store's keys stay the running attempt's) and is told to join the running job. */
static void rank_env(const job_t *j, const rank_t *r, int attempt, int port, const char *secret, int replacement,
                     envv_t *e) {
    const opts_t *o = &j->o;
    env_init(e, ENV_PUTS);
    env_put_int(e, "RANK", r->rank);
    env_put_int(e, "LOCAL_RANK", r->local_rank);
    env_put_int(e, "WORLD_SIZE", j->world_size);
    env_put_int(e, "LOCAL_WORLD_SIZE", o->nproc);
    env_put_int(e, "GROUP_RANK", o->node_rank);
    env_put_int(e, "GROUP_WORLD_SIZE", o->nnodes);
    env_put_int(e, "ROLE_RANK", r->rank);
    env_put_int(e, "ROLE_WORLD_SIZE", j->world_size);
    env_put(e, "ROLE_NAME", o->role, 0);
    env_put(e, "MASTER_ADDR", o->master_addr, 0);
    env_put_int(e, "MASTER_PORT", port);
    env_put_int(e, "TORCHELASTIC_RESTART_COUNT", attempt);
    env_put_int(e, "TORCHELASTIC_MAX_RESTARTS", o->max_restarts);
    env_put(e, "TORCHELASTIC_RUN_ID", j->run_id, 0);
    env_put(e, "TORCHELASTIC_USE_AGENT_STORE", "False", 0);
    env_put(e, "TORCH_NCCL_ASYNC_ERROR_HANDLING", "1", 1);
    if (o->nproc > 1) env_put(e, "OMP_NUM_THREADS", "1", 1);
    if (secret) env_put(e, "DDP_JOB_SECRET", secret, 0);
    env_put(e, "DDP_LAUNCHER_STORE", j->store_addr, 0);
    if (o->elastic_min) env_put_int(e, "DDP_ELASTIC_MIN_RANKS", o->elastic_min);
    if (replacement) {
        env_put(e, "DDP_ELASTIC_JOIN", "1", 0);
        env_put_int(e, "DDP_ELASTIC_REPLACEMENT", replacement);
    }
}

/* In the child, between fork and exec: async-signal-safe calls only (see envv_t). */
static void child_exec(const job_t *j, char **env, int outw, int errw, const sigset_t *mask, pid_t parent) {
    const opts_t *o = &j->o;
    size_t k;
    for (k = 0; k < sizeof k_forwarded / sizeof k_forwarded[0]; k++)
        if (!g_ignored[k_forwarded[k]]) signal(k_forwarded[k], SIG_DFL);
    signal(SIGCHLD, SIG_DFL);
    signal(SIGPIPE, SIG_DFL); /* ddprun ignores it; an ignored signal would stay ignored past exec */
    setsid();
#ifdef __linux__
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127); /* ddprun died before the line above */
#else
    (void)parent;
#endif
    if (dup2(outw, 1) < 0 || dup2(errw, 2) < 0) _exit(127);
    if (g_nofile_ok) setrlimit(RLIMIT_NOFILE, &g_nofile);
    environ = env;
    sigprocmask(SIG_SETMASK, mask, NULL);
    execvp(o->argv[0], o->argv);
    dprintf(2, "ddprun: cannot run '%s': %s\n", o->argv[0], strerror(errno));
    _exit(errno == ENOENT ? 127 : 126); /* the shell's codes for "not found", "not runnable" */
}

/* A pseudo-terminal for a rank's stdout (see OUTPUT AS IT IS PRINTED): p[0] the master, read by
 * ddprun, p[1] the slave, the rank's stdout; both close-on-exec. Returns -1 with errno. */
static int open_pty(int p[2]) {
    struct termios t;
    const char *name;
    int m = posix_openpt(O_RDWR | O_NOCTTY), sl = -1;
    if (m < 0) return -1;
    if (fcntl(m, F_SETFD, FD_CLOEXEC) != 0 || grantpt(m) != 0 || unlockpt(m) != 0 || !(name = ptsname(m)))
        goto fail;
    sl = open(name, O_RDWR | O_NOCTTY | O_CLOEXEC);
    if (sl < 0 || tcgetattr(sl, &t) != 0) goto fail;
    cfmakeraw(&t);   /* bytes as written: no "\r\n" for "\n", no echo, no line editing */
    if (tcsetattr(sl, TCSANOW, &t) != 0) goto fail;
    p[0] = m;
    p[1] = sl;
    return 0;
fail:
    {
        int e = errno;
        if (sl >= 0) close(sl);
        close(m);
        errno = e;
    }
    return -1;
}

static int spawn_rank(job_t *j, rank_t *r, int attempt, int port, const char *secret, int replacement, char *err,
                      size_t errcap) {
    int outp[2], errp[2];
    sigset_t all, old;
    pid_t pid, self = getpid();
    envv_t env;
    if (j->o.no_pty || open_pty(outp) != 0) {
        if (!j->o.no_pty && !j->pty_warned++)
            fprintf(stderr, "ddprun: no pseudo-terminal for the ranks' stdout (%s); using pipes, so "
                            "their stdout arrives in blocks unless they flush\n", strerror(errno));
        if (pipe2(outp, O_CLOEXEC) != 0) { snprintf(err, errcap, "pipe: %s", strerror(errno)); return -1; }
    }
    if (pipe2(errp, O_CLOEXEC) != 0) {
        snprintf(err, errcap, "pipe: %s", strerror(errno));
        close(outp[0]); close(outp[1]);
        return -1;
    }
    /* Signals stay blocked across fork until the child has reset ddprun's handlers; otherwise a
     * SIGTERM landing in between would run ddprun's handler in the child. */
    rank_env(j, r, attempt, port, secret, replacement, &env);
    sigfillset(&all);
    sigprocmask(SIG_SETMASK, &all, &old);
    pid = fork();
    if (pid == 0) child_exec(j, env.v, outp[1], errp[1], &old, self);
    sigprocmask(SIG_SETMASK, &old, NULL);
    env_free(&env);
    close(outp[1]);
    close(errp[1]);
    if (pid < 0) {
        snprintf(err, errcap, "fork: %s", strerror(errno));
        close(outp[0]); close(errp[0]);
        return -1;
    }
    fcntl(outp[0], F_SETFL, O_NONBLOCK);
    fcntl(errp[0], F_SETFL, O_NONBLOCK);
    r->pid = pid;
    r->exited = r->code = r->signo = r->core = 0;
    r->tail_n = r->tail_next = 0;
    r->out.fd = outp[0];
    r->err.fd = errp[0];
    r->out.len = r->err.len = 0;
    return 0;
}

/* To the rank's whole process group. Until the child has called setsid() the group does not
 * exist yet (ESRCH); then the signal goes to the child itself. */
static void signal_rank(const rank_t *r, int sig) {
    if (r->pid <= 0) return;
    if (kill(-r->pid, sig) != 0 && errno == ESRCH) kill(r->pid, sig);
}

/* Every rank's group, and the groups of lost processes whose slot a replacement took (what they
 * started may still run there; their zombie leaders keep the group ids ours). Returns how many
 * ranks were still running. */
static int signal_all(job_t *j, int sig) {
    int i, running = 0;
    for (i = 0; i < j->o.nproc; i++) {
        signal_rank(&j->ranks[i], sig);
        running += j->ranks[i].pid > 0 && !j->ranks[i].exited;
    }
    for (i = 0; i < j->nzombies; i++)
        if (kill(-j->zombies[i], sig) != 0 && errno == ESRCH) kill(j->zombies[i], sig);
    return running;
}

/* "07:12:03.123 UTC": now, for the log of a lost rank. */
static void wall_now(char *out, size_t cap) {
    struct timespec t;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &t);
    gmtime_r(&t.tv_sec, &tm);
    snprintf(out, cap, "%02d:%02d:%02d.%03d UTC", tm.tm_hour, tm.tm_min, tm.tm_sec, (int)(t.tv_nsec / 1000000));
}

/* Notes that rank r has exited if it has, without reaping it: 1 if it exited and failed. */
static int note_exit(job_t *j, rank_t *r, int *alive) {
    siginfo_t si;
    if (r->pid <= 0 || r->exited) return 0;
    memset(&si, 0, sizeof si);
    if (waitid(P_PID, (id_t)r->pid, &si, WEXITED | WNOHANG | WNOWAIT) != 0 || si.si_pid != r->pid) return 0;
    r->exited = 1;
    r->exit_seq = ++j->exit_seq;
    r->exit_s = now_s();
    wall_now(r->exit_wall, sizeof r->exit_wall);
    (*alive)--;
    if (si.si_code == CLD_EXITED) r->code = si.si_status;
    else { r->signo = si.si_status; r->core = si.si_code == CLD_DUMPED; }
    return r->code || r->signo;
}

/* Notes ranks that have exited, without reaping them: first those SIGCHLD named, in the order
 * they exited (on_sigchld), then any other (its SIGCHLD merged into a pending one: it exited
 * after that one's child). Returns the first of them that failed, or -1. */
static int scan_exits(job_t *j, int *alive) {
    int i, first = -1, n = g_exit_n;
    if (n - j->exits_seen > EXIT_LOG) j->exits_seen = n - EXIT_LOG;   /* the oldest were overwritten */
    for (; j->exits_seen < n; j->exits_seen++) {
        pid_t pid = (pid_t)g_exit_pid[j->exits_seen % EXIT_LOG];
        for (i = 0; i < j->o.nproc; i++)
            if (j->ranks[i].pid == pid) {
                if (note_exit(j, &j->ranks[i], alive) && first < 0) first = i;
                break;
            }
    }
    for (i = 0; i < j->o.nproc; i++)
        if (note_exit(j, &j->ranks[i], alive) && first < 0) first = i;
    return first;
}

/* ---- the store ----------------------------------------------------------------------------- */

/* The store's log lines (DDP_DEBUG sets the level) as ddprun's own: "ddprun: store: ...". Called
 * from the server thread too: one write per line. */
static void store_log(void *user, ddp_log_level_t level, int rank, const char *msg) {
    (void)user;
    (void)rank;
    dprintf(2, "ddprun: %s%s\n", level == DDP_LOG_WARN ? "WARN " : "", msg);
}

/* Node 0's ddprun serves the rendezvous store for the attempt (THE STORE above); every ddprun
 * tells its ranks where it is. The server is libddp's own: it authenticates with the job secret
 * and bounds what a connection that has not proven it may cost (ddp_store.h). Its thread takes
 * no signals: ddprun's handlers run in the main thread. */
static void store_start(job_t *j, const char *secret) {
    const opts_t *o = &j->o;
    int port = o->store_port ? o->store_port : o->nnodes > 1 ? o->master_port + 1 : 0;
    if (!g_nofile_ok) g_nofile_ok = getrlimit(RLIMIT_NOFILE, &g_nofile) == 0;
    if (o->node_rank == 0) {
        ddp_store_desc_t d;
        sigset_t all, old;
        char err[512] = "";
        ddp_result_t r;
        memset(&d, 0, sizeof d);
        d.secret = secret ? secret : "";   /* "": none (NULL would read DDP_JOB_SECRET again) */
        d.log_fn = store_log;
        sigfillset(&all);
        pthread_sigmask(SIG_SETMASK, &all, &old);
        r = _ddp_store_open(&j->store, o->master_addr, port, 1, &d, err, sizeof err);
        pthread_sigmask(SIG_SETMASK, &old, NULL);
        if (r != DDP_SUCCESS)
            die(1, "cannot serve the rendezvous store on %s port %d: %s%s", o->master_addr, port, err,
                port ? " (give another --store-port)" : "");
        port = ddp_store_port(j->store);
    }
    snprintf(j->store_addr, sizeof j->store_addr, strchr(o->master_addr, ':') ? "[%s]:%d" : "%s:%d",
             o->master_addr, port);
}

static void store_stop(job_t *j) {
    if (!j->store) return;
    _ddp_store_close_within(j->store, 0);   /* the ranks are gone: nobody to wait for */
    j->store = NULL;
}

/* ---- --elastic ----------------------------------------------------------------------------- */

static void describe_exit(const rank_t *r, char *out, size_t cap);

/* One line of ddprun's own to stderr, in one write (a live line never mixes with a rank's). */
PRINTF_LIKE(1, 2) static void say(const char *fmt, ...) {
    char b[1024];
    va_list ap;
    int n;
    va_start(ap, fmt);
    n = vsnprintf(b, sizeof b, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if ((size_t)n >= sizeof b) { n = (int)sizeof b - 1; b[n - 1] = '\n'; }
    if (write(2, b, (size_t)n) < 0) { /* nowhere left to report to */ }
}

/* Reads what the exited rank r left in its pipes, up to their end: its last lines come before
 * ddprun's news of its loss, and its streams are closed. A stream that something it started
 * still holds open stays open (poll finds it empty, not at its end); so does one that such a
 * process keeps filling (DRAIN_READS reads at most: the poll loop reads the rest). */
static void drain_streams(job_t *j, rank_t *r) {
    stream_t *ss[2];
    int m, n;
    ss[0] = &r->out;
    ss[1] = &r->err;
    for (m = 0; m < 2; m++)
        for (n = 0; n < DRAIN_READS && ss[m]->fd >= 0; n++) {
            struct pollfd p;
            p.fd = ss[m]->fd;
            p.events = POLLIN;
            p.revents = 0;
            if (poll(&p, 1, 0) <= 0) break;             /* nothing now: held open by another */
            if (!stream_read(j, r, ss[m])) stream_close(ss[m]);
        }
}

/* Before a replacement takes slot r: streams of the lost process still open (something it
 * started holds them) move to j->retired, read as before until they close; the slot gets new
 * buffers. */
static void retire_streams(job_t *j, rank_t *r) {
    rank_t *t;
    if (r->out.fd < 0 && r->err.fd < 0) return;
    if (j->nretired == j->retired_cap) {
        int cap = j->retired_cap ? 2 * j->retired_cap : 4;
        rank_t *n = (rank_t *)realloc(j->retired, (size_t)cap * sizeof *n);
        if (!n) die(1, "out of memory");
        j->retired = n;
        j->retired_cap = cap;
    }
    t = &j->retired[j->nretired++];
    *t = *r;                                            /* its rank (the prefix), streams, tail */
    if (r->out.file_fd >= 0) t->out.file_fd = fcntl(r->out.file_fd, F_DUPFD_CLOEXEC, 3);
    if (r->err.file_fd >= 0) t->err.file_fd = fcntl(r->err.file_fd, F_DUPFD_CLOEXEC, 3);
    r->out.buf = (char *)malloc(LINE_CAP);
    r->err.buf = (char *)malloc(LINE_CAP);
    if (!r->out.buf || !r->err.buf) die(1, "out of memory");
    r->out.fd = r->err.fd = -1;
    r->out.len = r->err.len = 0;
}

static void retired_free(job_t *j) {
    int i;
    for (i = 0; i < j->nretired; i++) {
        rank_t *t = &j->retired[i];
        stream_close(&t->out);
        stream_close(&t->err);
        if (t->out.file_fd >= 0) close(t->out.file_fd);
        if (t->err.file_fd >= 0) close(t->err.file_fd);
        free(t->out.buf);
        free(t->err.buf);
    }
    j->nretired = 0;
}

/* --max-restarts under --elastic: a replacement for the process of slot r, lost as l, if the
 * budget allows; said at once either way. */
static void replace_rank(job_t *j, rank_t *r, loss_t *l, int *alive) {
    const opts_t *o = &j->o;
    char err[256] = "";
    pid_t old = r->pid;
    int k = j->nreplaced + 1;
    if (j->nreplaced >= o->max_restarts) {
        l->not_replaced = NR_BUDGET;
        say("ddprun: NOT REPLACED rank %d (pid %ld, lost at %s): the %d replacement%s of --max-restarts %d "
            "%s used up; the job goes on with %d of %d ranks\n", r->rank, (long)old, l->exit_wall, o->max_restarts,
            o->max_restarts == 1 ? "" : "s", o->max_restarts, o->max_restarts == 1 ? "is" : "are",
            o->nproc - j->ndown, o->nproc);
        return;
    }
    if (j->nzombies == j->zombies_cap) {
        int cap = j->zombies_cap ? 2 * j->zombies_cap : 4;
        pid_t *n = (pid_t *)realloc(j->zombies, (size_t)cap * sizeof *n);
        if (!n) die(1, "out of memory");
        j->zombies = n;
        j->zombies_cap = cap;
    }
    retire_streams(j, r);
    if (spawn_rank(j, r, j->attempt, j->port, j->secret, k, err, sizeof err) != 0) {
        l->not_replaced = NR_SPAWN;          /* the slot keeps the lost pid: still reaped at the end */
        say("ddprun: NOT REPLACED rank %d (pid %ld, lost at %s): cannot start a replacement: %s; the job goes on "
            "with %d of %d ranks\n", r->rank, (long)old, l->exit_wall, err, o->nproc - j->ndown, o->nproc);
        return;
    }
    j->zombies[j->nzombies++] = old;
    j->nreplaced = k;
    j->ndown--;
    r->lost = 0;
    r->exit_seq = 0;
    (*alive)++;
    l->replacement = k;
    l->rpid = r->pid;
    l->rstart_s = now_s();
    say("ddprun: REPLACED rank %d (pid %ld, lost at %s): replacement pid %ld started (%d of %d), joining the "
        "running job (DDP_ELASTIC_JOIN=1); %d of %d ranks\n", r->rank, (long)old, l->exit_wall, (long)r->pid, k,
        o->max_restarts, o->nproc - j->ndown, o->nproc);
}

/* Failed ranks not yet noted, in the order they exited: each is lost, said at once, and with
 * --max-restarts replaced while the budget lasts. Returns the one whose loss leaves fewer than
 * MIN ranks (the job ends then), or -1. */
static int note_lost(job_t *j, int *alive) {
    for (;;) {
        int i, next = -1, left;
        rank_t *r;
        loss_t *l;
        char how[128];
        for (i = 0; i < j->o.nproc; i++) {
            const rank_t *q = &j->ranks[i];
            if (q->exited && (q->code || q->signo) && !q->lost && (next < 0 || q->exit_seq < j->ranks[next].exit_seq))
                next = i;
        }
        if (next < 0) return -1;
        r = &j->ranks[next];
        left = j->o.nproc - j->ndown - 1;
        if (left < j->o.elastic_min) return next;   /* the usual failure: print_failure says it */
        if (j->nlost == j->losses_cap) {
            int cap = j->losses_cap ? 2 * j->losses_cap : 8;
            loss_t *n = (loss_t *)realloc(j->losses, (size_t)cap * sizeof *n);
            if (!n) die(1, "out of memory");
            j->losses = n;
            j->losses_cap = cap;
        }
        l = &j->losses[j->nlost++];
        memset(l, 0, sizeof *l);
        l->slot = next;
        l->pid = r->pid;
        l->code = r->code;
        l->signo = r->signo;
        l->core = r->core;
        l->exit_s = r->exit_s;
        memcpy(l->exit_wall, r->exit_wall, sizeof l->exit_wall);
        r->lost = 1;
        j->ndown++;
        drain_streams(j, r);
        describe_exit(r, how, sizeof how);
        say("ddprun: LOST: rank %d (local rank %d, pid %ld) %s at %s, %.3f s into the attempt; --elastic %d: "
            "%d of %d ranks remain, the job goes on\n", r->rank, r->local_rank, (long)r->pid, how, r->exit_wall,
            r->exit_s - j->attempt_t0, j->o.elastic_min, left, j->o.nproc);
        if (j->o.max_restarts) replace_rank(j, r, l, alive);
    }
}

/* ---- one attempt --------------------------------------------------------------------------- */

static outcome_t run_attempt(job_t *j, int attempt, int wake_r, sig_atomic_t *seen) {
    const opts_t *o = &j->o;
    outcome_t oc;
    int i, alive = 0, started = 0, port = o->master_port, phase = 0; /* 0 running, 1 TERM sent, 2 KILL sent */
    int leftovers_killed = 0, pcap = o->nproc * 2 + 1;
    double kill_at = 0, giveup_at = 0, drain_until = 0;
    char secret_buf[65], err[256] = "";
    const char *secret = getenv("DDP_JOB_SECRET");
    struct pollfd *pfd;
    rank_t **owner;
    stream_t **which;

    memset(&oc, 0, sizeof oc);
    oc.failed = -1;
    if (port == 0) {
        port = reserve_free_port();
        if (port <= 0) die(1, "cannot find a free port for the rendezvous: %s (give --master-port)", strerror(errno));
    }
    if (secret && !*secret) secret = NULL; /* set but empty: as if unset */
    if (!secret && o->nnodes == 1) { /* several hosts: only the user can give them one secret */
        random_hex(secret_buf, 16);
        secret = secret_buf;
    }
    for (i = 0; i < o->nproc; i++) j->ranks[i].pid = 0; /* none of the last attempt's pids is ours */
    j->exits_seen = g_exit_n;                                /* nor the exits logged so far */
    j->exit_seq = j->nlost = j->ndown = j->nreplaced = j->nzombies = 0;
    j->attempt = attempt;
    j->port = port;
    j->secret = secret;
    for (i = 0; i < o->nproc; i++) j->ranks[i].lost = j->ranks[i].exit_seq = 0;
    store_start(j, secret);
    j->attempt_t0 = now_s();
    pfd = (struct pollfd *)calloc((size_t)pcap, sizeof *pfd);
    owner = (rank_t **)calloc((size_t)pcap, sizeof *owner);
    which = (stream_t **)calloc((size_t)pcap, sizeof *which);
    if (!pfd || !owner || !which) die(1, "out of memory");

    for (i = 0; i < o->nproc; i++) {
        if (spawn_rank(j, &j->ranks[i], attempt, port, secret, 0, err, sizeof err) != 0) break;
        started++;
        alive++;
    }
    if (started < o->nproc) { /* stop what did start, by the usual policy */
        oc.spawn_error = 1;
        fprintf(stderr, "ddprun: cannot start rank %d: %s; stopping the %d started\n", j->ranks[started].rank, err, started);
        oc.stopped = signal_all(j, SIGTERM);
        phase = 1;
        kill_at = now_s() + o->grace_s;
    }

    for (;;) {
        double now = now_s(), next = -1;
        int n = 0, timeout, open_streams = 0, failed;
        size_t k;
        char drain[64];

        for (i = 0; i < started; i++) open_streams += (j->ranks[i].out.fd >= 0) + (j->ranks[i].err.fd >= 0);
        for (i = 0; i < j->nretired; i++) open_streams += (j->retired[i].out.fd >= 0) + (j->retired[i].err.fd >= 0);
        if ((started + j->nretired) * 2 + 1 > pcap) {   /* streams of lost processes, replaced */
            pcap = (started + j->nretired) * 2 + 1;
            pfd = (struct pollfd *)realloc(pfd, (size_t)pcap * sizeof *pfd);
            owner = (rank_t **)realloc(owner, (size_t)pcap * sizeof *owner);
            which = (stream_t **)realloc(which, (size_t)pcap * sizeof *which);
            if (!pfd || !owner || !which) die(1, "out of memory");
        }
        if (alive == 0) {
            if (open_streams == 0) break;
            if (phase > 0 && !leftovers_killed) {
                /* Every rank has exited, but something in their process groups still holds the
                 * pipes: a child that ignored the signal (a shell's background job ignores
                 * SIGINT). The job is being stopped, so it goes now. */
                signal_all(j, SIGKILL);
                leftovers_killed = 1;
            }
            if (drain_until == 0) drain_until = now + DRAIN_MS / 1000.0;
            else if (now >= drain_until) break;
            next = drain_until;
        }
        if (phase == 1 && now >= kill_at) {
            oc.killed = signal_all(j, SIGKILL);
            phase = 2;
            giveup_at = now + KILL_WAIT_MS / 1000.0;
        }
        if (phase == 2 && alive > 0 && now >= giveup_at) {
            oc.stuck = alive;
            break;
        }
        if (phase == 1 && (next < 0 || kill_at < next)) next = kill_at;
        if (phase == 2 && alive > 0 && (next < 0 || giveup_at < next)) next = giveup_at;
        timeout = next < 0 ? -1 : next <= now ? 0 : (int)((next - now) * 1000.0) + 1;

        pfd[n].fd = wake_r;
        pfd[n].events = POLLIN;
        n++;
        for (i = 0; i < started + j->nretired; i++) {
            rank_t *r = i < started ? &j->ranks[i] : &j->retired[i - started];
            stream_t *ss[2];
            int m;
            ss[0] = &r->out;
            ss[1] = &r->err;
            for (m = 0; m < 2; m++) {
                if (ss[m]->fd < 0) continue;
                pfd[n].fd = ss[m]->fd;
                pfd[n].events = POLLIN;
                owner[n] = r;
                which[n] = ss[m];
                n++;
            }
        }
        if (poll(pfd, (nfds_t)n, timeout) < 0 && errno != EINTR) die(1, "poll: %s", strerror(errno));

        for (k = 1; k < (size_t)n; k++)
            if (pfd[k].revents && !stream_read(j, owner[k], which[k])) stream_close(which[k]);
        while (read(wake_r, drain, sizeof drain) > 0) { }

        for (k = 0; k < sizeof k_forwarded / sizeof k_forwarded[0]; k++) {
            int s = k_forwarded[k];
            if (g_sig_count[s] == seen[s]) continue;
            seen[s] = g_sig_count[s];
            if (phase == 0) {
                oc.signo = s;
                oc.stopped = signal_all(j, s);
                phase = 1;
                kill_at = now_s() + o->grace_s;
            } else if (phase == 1) { /* asked twice: no more waiting */
                oc.killed = signal_all(j, SIGKILL);
                phase = 2;
                giveup_at = now_s() + KILL_WAIT_MS / 1000.0;
            }
        }
        failed = -1;
        if (g_sig_count[SIGCHLD] != seen[SIGCHLD]) { /* read the count first: a later SIGCHLD wakes us again */
            seen[SIGCHLD] = g_sig_count[SIGCHLD];
            failed = scan_exits(j, &alive);
            /* --elastic: a failed rank is lost, not the end, while MIN ranks remain */
            if (failed >= 0 && phase == 0 && o->elastic_min) {
                failed = note_lost(j, &alive);
                oc.below_min = failed >= 0;
            }
        }
        if (failed >= 0 && phase == 0) {
            oc.failed = failed;
            oc.stopped = signal_all(j, SIGTERM);
            phase = 1;
            kill_at = now_s() + o->grace_s;
        }
    }

    /* The end of a rank is the end of its process group: SIGTERM to whatever is left, as torchrun
     * does at the end of every run (PContext.close). The zombie leaders keep the group ids ours
     * until the waitpid below. */
    signal_all(j, SIGTERM);
    for (i = 0; i < started; i++) {
        rank_t *r = &j->ranks[i];
        if (r->exited) waitpid(r->pid, NULL, 0); /* a zombie already: returns at once */
        else waitpid(r->pid, NULL, WNOHANG);
        stream_close(&r->out);
        stream_close(&r->err);
    }
    for (i = 0; i < j->nzombies; i++) waitpid(j->zombies[i], NULL, 0);   /* zombies already */
    j->nzombies = 0;
    retired_free(j);
    store_stop(j);
    free(pfd);
    free(owner);
    free(which);
    return oc;
}

/* ---- reporting ----------------------------------------------------------------------------- */

/* snprintf at b[*k], never past cap (a cut message rather than an overflow). */
PRINTF_LIKE(4, 5) static void appendf(char *b, size_t cap, size_t *k, const char *fmt, ...) {
    va_list ap;
    int n;
    if (*k + 1 >= cap) return;
    va_start(ap, fmt);
    n = vsnprintf(b + *k, cap - *k, fmt, ap);
    va_end(ap);
    if (n > 0) *k = *k + (size_t)n < cap ? *k + (size_t)n : cap - 1;
}

static void describe_how(int code, int signo, int core, char *out, size_t cap) {
    if (signo)
        snprintf(out, cap, "was killed by %s (signal %d%s)", signal_name(signo), signo, core ? ", core dumped" : "");
    else
        snprintf(out, cap, "exited with code %d", code);
}

static void describe_exit(const rank_t *r, char *out, size_t cap) { describe_how(r->code, r->signo, r->core, out, cap); }

static int exit_status(const rank_t *r) { return r->signo ? 128 + r->signo : r->code; }

/* How the other ranks were stopped, as the end of a sentence. */
static void describe_stop(const job_t *j, const outcome_t *oc, const char *sig, char *out, size_t cap) {
    size_t k = 0;
    out[0] = 0;
    if (oc->stopped == 0) { appendf(out, cap, &k, "no other rank was still running"); return; }
    appendf(out, cap, &k, "%s sent to the %d rank%s still running", sig, oc->stopped, oc->stopped == 1 ? "" : "s");
    if (oc->killed)
        appendf(out, cap, &k, "; %d did not exit within the %g s grace period and got SIGKILL", oc->killed, j->o.grace_s);
    if (oc->stuck)
        appendf(out, cap, &k, "; %d still had not exited %d s after SIGKILL and were left behind", oc->stuck, KILL_WAIT_MS / 1000);
}

/* --elastic: one line per process lost while the job went on, in the order they were lost. */
static void append_lost(const job_t *j, char *b, size_t cap, size_t *k) {
    int i;
    if (!j->nlost) return;
    if (j->o.max_restarts)
        appendf(b, cap, k, "ddprun: lost earlier, the job going on (--elastic %d): %d loss%s\n", j->o.elastic_min,
                j->nlost, j->nlost == 1 ? "" : "es");
    else
        appendf(b, cap, k, "ddprun: lost earlier, the job going on (--elastic %d): %d rank%s\n", j->o.elastic_min,
                j->nlost, j->nlost == 1 ? "" : "s");
    for (i = 0; i < j->nlost; i++) {
        const loss_t *l = &j->losses[i];
        const rank_t *r = &j->ranks[l->slot];
        char how[128], what[128] = "";
        describe_how(l->code, l->signo, l->core, how, sizeof how);
        if (l->replacement)
            snprintf(what, sizeof what, "; replaced by pid %ld (replacement %d)", (long)l->rpid, l->replacement);
        else if (l->not_replaced == NR_BUDGET)
            snprintf(what, sizeof what, "; not replaced: no replacement was left");
        else if (l->not_replaced == NR_SPAWN)
            snprintf(what, sizeof what, "; not replaced: its replacement could not be started");
        appendf(b, cap, k, "ddprun:   rank %d (local rank %d, pid %ld) %s at %s, %.3f s into the attempt%s\n",
                r->rank, r->local_rank, (long)l->pid, how, l->exit_wall, l->exit_s - j->attempt_t0, what);
    }
}

/* --elastic --max-restarts: one line per replacement started (and what became of it), and
 * whether the budget ran out. */
static void append_replacements(const job_t *j, char *b, size_t cap, size_t *k) {
    int i, out = 0;
    if (!j->o.max_restarts || !j->nlost) return;
    for (i = 0; i < j->nlost; i++) out += j->losses[i].not_replaced == NR_BUDGET;
    appendf(b, cap, k, "ddprun: replacements (--max-restarts %d): %d of %d used%s", j->o.max_restarts, j->nreplaced,
            j->o.max_restarts, out ? "; the budget ran out, " : "\n");
    if (out) appendf(b, cap, k, "%d later loss%s not replaced\n", out, out == 1 ? " was" : "es were");
    for (i = 0; i < j->nlost; i++) {
        const loss_t *l = &j->losses[i], *again = NULL;
        const rank_t *r = &j->ranks[l->slot];
        char fate[192];
        int m;
        if (!l->replacement) continue;
        for (m = i + 1; m < j->nlost && !again; m++)
            if (j->losses[m].pid == l->rpid) again = &j->losses[m];
        if (again) {
            snprintf(fate, sizeof fate, "lost in turn at %s", again->exit_wall);
        } else if (r->pid == l->rpid && r->exited) {
            describe_exit(r, fate, sizeof fate);
        } else {
            snprintf(fate, sizeof fate, "still running");
        }
        appendf(b, cap, k, "ddprun:   replacement %d: rank %d (local rank %d), pid %ld, started %.3f s into the "
                "attempt in place of pid %ld; %s\n", l->replacement, r->rank, r->local_rank, (long)l->rpid,
                l->rstart_s - j->attempt_t0, (long)l->pid, fate);
    }
}

/* --elastic, every rank left exited 0: the job finished, at full size again after replacements
 * (RECOVERED), or with fewer ranks (DEGRADED). One write. */
static void print_degraded(const job_t *j) {
    size_t cap = (size_t)(2 * j->nlost + 4) * 384, k = 0;
    char *b = (char *)malloc(cap);
    if (!b) return;
    if (j->ndown == 0)
        appendf(b, cap, &k, "ddprun: RECOVERED: the job finished at full size, %d of %d ranks (each exited 0), "
                "after %d replacement%s; exit status 0\n", j->o.nproc, j->o.nproc, j->nreplaced,
                j->nreplaced == 1 ? "" : "s");
    else
        appendf(b, cap, &k, "ddprun: DEGRADED: the job finished with %d of %d ranks (each exited 0); "
                "exit status 0\n", j->o.nproc - j->ndown, j->o.nproc);
    append_lost(j, b, cap, &k);
    append_replacements(j, b, cap, &k);
    if (write(2, b, k) < 0) { /* nowhere left to report to */ }
    free(b);
}

/* The one summary of a failed job: a single write, so it is never interleaved. */
static void print_failure(const job_t *j, const outcome_t *oc, int attempt) {
    const rank_t *r = &j->ranks[oc->failed];
    size_t cap = (size_t)(TAIL_LINES + 7) * (TAIL_BYTES + 64) + (size_t)j->nlost * 2 * 384, k = 0;
    char *b = (char *)malloc(cap), how[128], stop[512], att[64] = "";
    int i;
    if (!b) return;
    describe_exit(r, how, sizeof how);
    describe_stop(j, oc, "SIGTERM", stop, sizeof stop);
    if (j->o.max_restarts && !j->o.elastic_min)
        snprintf(att, sizeof att, " (attempt %d of %d)", attempt + 1, j->o.max_restarts + 1);
    appendf(b, cap, &k, "ddprun: FAILED: rank %d (local rank %d, pid %ld) %s%s; %s\n",
            r->rank, r->local_rank, (long)r->pid, how, att, stop);
    if (oc->below_min)
        appendf(b, cap, &k, "ddprun: --elastic %d: after losing rank %d only %d of %d ranks were left, "
                "below the minimum%s\n", j->o.elastic_min, r->rank, j->o.nproc - j->ndown - 1, j->o.nproc,
                j->o.max_restarts ? " (under --elastic the group is not restarted: --max-restarts counts replacements)"
                                  : "");
    append_lost(j, b, cap, &k);
    append_replacements(j, b, cap, &k);
    if (r->tail_n == 0) {
        appendf(b, cap, &k, "ddprun: rank %d wrote nothing to stderr\n", r->rank);
    } else {
        appendf(b, cap, &k, "ddprun: last %d stderr line%s of rank %d:\n", r->tail_n, r->tail_n == 1 ? "" : "s", r->rank);
        for (i = 0; i < r->tail_n; i++) {
            const char *t = r->tail[(r->tail_next - r->tail_n + i + TAIL_LINES) % TAIL_LINES];
            if (names_its_rank(r, t, strlen(t))) appendf(b, cap, &k, "%s\n", t);   /* one prefix */
            else appendf(b, cap, &k, "[rank %d] %s\n", r->rank, t);
        }
    }
    if (write(2, b, k) < 0) { /* nowhere left to report to */ }
    free(b);
}

/* A forwarded signal that arrived after the last attempt looked: no restart then. */
static int pending_signal(const sig_atomic_t *seen) {
    size_t k;
    for (k = 0; k < sizeof k_forwarded / sizeof k_forwarded[0]; k++)
        if (g_sig_count[k_forwarded[k]] != seen[k_forwarded[k]]) return 1;
    return 0;
}

/* ---- main ---------------------------------------------------------------------------------- */

/* --trace: the ranks wrote FILE.<rank>.part (JSON arrays of trace events, DDP_TRACE); this
 * node's are joined into one array in FILE and removed. A rank that died mid-write leaves an
 * unterminated array: its events up to the last complete one are kept. */
static void merge_traces(const job_t *j) {
    FILE *out = fopen(j->o.trace, "w");
    int i, n = 0;
    if (!out) { fprintf(stderr, "ddprun: --trace: cannot write %s: %s\n", j->o.trace, strerror(errno)); return; }
    fputs("[\n", out);
    for (i = 0; i < j->o.nproc; i++) {
        char path[4096], *buf = NULL, *a, *z;
        long len;
        FILE *in;
        snprintf(path, sizeof path, "%s.%d.part", j->o.trace, j->ranks[i].rank);
        if (!(in = fopen(path, "r"))) continue;
        if (fseek(in, 0, SEEK_END) == 0 && (len = ftell(in)) > 0 && fseek(in, 0, SEEK_SET) == 0 &&
            (buf = (char *)malloc((size_t)len + 1)) && fread(buf, 1, (size_t)len, in) == (size_t)len) {
            buf[len] = 0;
            a = strchr(buf, '{');                  /* the first event */
            z = strrchr(buf, '}');                 /* the end of the last complete one */
            if (a && z && z > a) {
                fprintf(out, "%s%.*s", n++ ? ",\n" : "", (int)(z - a + 1), a);
            }
        }
        free(buf);
        fclose(in);
        unlink(path);
    }
    fputs("\n]\n", out);
    fclose(out);
    fprintf(stderr, "ddprun: --trace: %d ranks' events in %s\n", n, j->o.trace);
}

int main(int argc, char **argv) {
    job_t j;
    int i, attempt, wake[2], fd;
    sig_atomic_t seen[NSIG];
    struct sigaction sa;
    size_t k;

    /* With fd 0, 1 or 2 closed, a pipe could land there and be mistaken for the console. */
    for (fd = open("/dev/null", O_RDWR); fd >= 0 && fd <= 2; fd = open("/dev/null", O_RDWR)) { }
    if (fd > 2) close(fd);

    memset(&j, 0, sizeof j);
    parse_args(argc, argv, &j.o);
    j.world_size = j.o.nnodes * j.o.nproc;
    if (j.o.run_id) snprintf(j.run_id, sizeof j.run_id, "%.63s", j.o.run_id);
    else if (j.o.nnodes > 1) snprintf(j.run_id, sizeof j.run_id, "none");
    else { /* a random UUID, version 4, like torchrun --standalone */
        unsigned char u[16];
        random_bytes(u, sizeof u);
        u[6] = (unsigned char)((u[6] & 0x0f) | 0x40);
        u[8] = (unsigned char)((u[8] & 0x3f) | 0x80);
        snprintf(j.run_id, sizeof j.run_id, "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
                 u[0], u[1], u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13], u[14], u[15]);
    }

    j.ranks = (rank_t *)calloc((size_t)j.o.nproc, sizeof *j.ranks);
    j.outbuf = (char *)malloc(LINE_CAP + 64);
    if (!j.ranks || !j.outbuf) die(1, "out of memory");
    if (j.o.log_dir) { /* mkdir -p */
        char path[4096];
        size_t len = (size_t)snprintf(path, sizeof path, "%s", j.o.log_dir);
        if (len >= sizeof path) die(1, "--log-dir: path too long");
        for (k = 1; k <= len; k++) {
            if (path[k] != '/' && path[k] != 0) continue;
            path[k] = 0;
            if (mkdir(path, 0777) != 0 && errno != EEXIST)
                die(1, "--log-dir: cannot create %s: %s", path, strerror(errno));
            if (k < len) path[k] = '/';
        }
    }
    for (i = 0; i < j.o.nproc; i++) {
        rank_t *r = &j.ranks[i];
        r->local_rank = i;
        r->rank = j.o.node_rank * j.o.nproc + i;
        r->out.fd = r->err.fd = r->out.file_fd = r->err.file_fd = -1;
        r->err.is_stderr = 1;
        r->out.console_fd = j.o.log_dir && !j.o.tee ? -1 : 1;
        r->err.console_fd = j.o.log_dir && !j.o.tee ? -1 : 2;
        r->out.buf = (char *)malloc(LINE_CAP);
        r->err.buf = (char *)malloc(LINE_CAP);
        if (!r->out.buf || !r->err.buf) die(1, "out of memory");
        if (j.o.log_dir) {
            char path[4096];
            snprintf(path, sizeof path, "%s/rank_%d.out", j.o.log_dir, r->rank);
            r->out.file_fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
            if (r->out.file_fd < 0) die(1, "--log-dir: cannot create %s: %s", path, strerror(errno));
            snprintf(path, sizeof path, "%s/rank_%d.err", j.o.log_dir, r->rank);
            r->err.file_fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
            if (r->err.file_fd < 0) die(1, "--log-dir: cannot create %s: %s", path, strerror(errno));
        }
    }

    if (j.o.nnodes > 1 && !(getenv("DDP_JOB_SECRET") && *getenv("DDP_JOB_SECRET")))
        fprintf(stderr, "ddprun: note: DDP_JOB_SECRET is not set, so the rendezvous is not authenticated "
                        "(export the same value on every host)\n");
    if (pipe2(wake, O_CLOEXEC | O_NONBLOCK) != 0) die(1, "pipe: %s", strerror(errno));
    g_wake_w = wake[1];
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sa.sa_flags = SA_RESTART | SA_NOCLDSTOP;
    sigemptyset(&sa.sa_mask);
    /* A signal ignored when ddprun started stays ignored, for ddprun and the ranks, as for any
     * program: nohup ignores SIGHUP, a script's background job SIGINT and SIGQUIT. SIGTERM is
     * always handled: it is how a supervisor stops the job. */
    for (k = 0; k < sizeof k_forwarded / sizeof k_forwarded[0]; k++) {
        struct sigaction cur;
        int s = k_forwarded[k];
        if (s != SIGTERM && sigaction(s, NULL, &cur) == 0 && cur.sa_handler == SIG_IGN) g_ignored[s] = 1;
        else sigaction(s, &sa, NULL);
    }
    sa.sa_sigaction = on_sigchld;
    sa.sa_flags |= SA_SIGINFO;
    sigaction(SIGCHLD, &sa, NULL);
    { /* an inherited mask that blocks these would hide exits and stop requests */
        sigset_t m;
        sigemptyset(&m);
        for (k = 0; k < sizeof k_forwarded / sizeof k_forwarded[0]; k++) sigaddset(&m, k_forwarded[k]);
        sigaddset(&m, SIGCHLD);
        sigprocmask(SIG_UNBLOCK, &m, NULL);
    }
    signal(SIGPIPE, SIG_IGN); /* a closed stdout must not kill ddprun while ranks run */
    for (i = 0; i < NSIG; i++) seen[i] = 0;

    if (j.o.trace) {
        char v[4200];
        snprintf(v, sizeof v, "%s.%%r.part", j.o.trace);
        setenv("DDP_TRACE", v, 1);
    }
    for (attempt = 0;; attempt++) {
        outcome_t oc = run_attempt(&j, attempt, wake[0], seen);
        char stop[512];
        if (j.o.trace) merge_traces(&j);
        if (oc.spawn_error) return 1;
        if (oc.signo) {
            describe_stop(&j, &oc, signal_name(oc.signo), stop, sizeof stop);
            fprintf(stderr, "ddprun: got %s: %s\n", signal_name(oc.signo), stop);
            return 128 + oc.signo;
        }
        if (oc.failed < 0) {
            if (oc.stuck) fprintf(stderr, "ddprun: %d ranks did not exit after SIGKILL\n", oc.stuck);
            if (!oc.stuck && j.nlost) print_degraded(&j);
            return oc.stuck ? 1 : 0;
        }
        /* Under --elastic, --max-restarts is the budget of replacements (note_lost): the loss
         * that leaves fewer than MIN ends the job. */
        if (attempt < j.o.max_restarts && !j.o.elastic_min && !pending_signal(seen)) {
            char how[128];
            describe_exit(&j.ranks[oc.failed], how, sizeof how);
            fprintf(stderr, "ddprun: rank %d %s; restarting all %d ranks (restart %d of %d)\n",
                    j.ranks[oc.failed].rank, how, j.o.nproc, attempt + 1, j.o.max_restarts);
            continue;
        }
        print_failure(&j, &oc, attempt);
        return exit_status(&j.ranks[oc.failed]);
    }
}
