/* SPDX-License-Identifier: MIT (see LICENSE) */
/* bench/bench_common.h — the sweep, timing, checking and output shared by ddp_bench.c (libddp)
 * and mpi_allreduce_bench.c (MPI), so both measure the same way and their rows and JSON files
 * can be put side by side.
 *
 * A benchmark fills a bench_backend_t (how to run one collective on the buffers being timed,
 * how to combine a few doubles across ranks) and calls bench_main_sweep (or bench_main_mem).
 *
 * WHAT IS MEASURED, as nccl-tests (github.com/NVIDIA/nccl-tests, src/common.cu and
 * doc/PERFORMANCE.md) so the numbers read the same:
 *   - size is the bytes of the biggest buffer of the call, the -b..-e sweep value rounded down to
 *     whole elements (and, for reduce_scatter/all_gather/gather/scatter/all_to_all, to a multiple
 *     of p elements: nccl-tests prints max(sendBytes, recvBytes)); count is the count argument of
 *     the call (per rank for reduce_scatter's recvcount, all_gather's and gather's sendcount,
 *     scatter's recvcount and all_to_all's count per peer).
 *   - time is the mean time per call on each rank, averaged over ranks (nccl-tests' default,
 *     "-a 1"; -a 0/2/3 take rank 0's, the smallest or the biggest instead); algbw = size / time; busbw = algbw * factor (see bench_colls below); GB = 1e9 B.
 *   - #wrong: elements that differ from the sequential reference (every element of every rank's
 *     result, -c times per size and placement), summed over ranks as nccl-tests does. reduce and
 *     gather have a result on the root only; the other ranks contribute 0.
 *   - Each row has the out-of-place and the in-place call (--inplace 0 / 1 keep only one), except for
 *     all_to_all and sendrecv, which have no in-place form in libddp (ddp_all_to_all refuses
 *     send == recv, as NCCL; a send and a receive of one buffer in one group race): only their
 *     out-of-place columns are printed. nccl-tests times those in-place calls anyway and prints
 *     N/A for their errors (alltoall.cu, sendrecv.cu: "We don't support in-place ...").
 * Per size and placement: -c checks (fill a known pattern, call once, compare every element),
 * zero the buffers (repeated in-place sums stay finite and no denormals slow anything), -w warmup
 * calls, --target-seconds decides the number of timed iterations (rank 0, from the warmup),
 * barrier, the timed iterations (-m calls each) back to back with a timestamp after each (per-call
 * p50/p99 for sizes <= 64 KiB, what Gloo's benchmark and the OSU micro-benchmarks report for
 * latency).
 *
 * TEST HOOK: DDP_BENCH_CORRUPT=1 in the environment flips the top bit of one element of rank 0's
 * result (the root's for reduce and gather) after every checked call, so a test can prove that
 * #wrong sees a corrupted result.
 *
 * Needs _GNU_SOURCE (or _POSIX_C_SOURCE >= 200809L) defined by the including file.
 */
#ifndef BENCH_COMMON_H
#define BENCH_COMMON_H

#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/resource.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>

#define BENCH_MAX_SIZES 128
#define BENCH_LAT_MAX_BYTES (64u << 10)   /* p50/p99 printed up to this size */

/* Values are NCCL's ncclDataType_t / ncclRedOp_t (and so libddp's). */
enum { BENCH_INT8 = 0, BENCH_UINT8, BENCH_INT32, BENCH_UINT32, BENCH_INT64, BENCH_UINT64,
       BENCH_FLOAT16, BENCH_FLOAT32, BENCH_FLOAT64, BENCH_BFLOAT16, BENCH_NUM_DTYPES };
enum { BENCH_SUM = 0, BENCH_PROD, BENCH_MAX, BENCH_MIN, BENCH_AVG, BENCH_NUM_OPS };

/* The collectives. To add one (as libddp gains them): a row here, its buffer geometry in
 * bench_geometry (and bench_pointers for its in-place rule), its reference in
 * bench_fill/bench_verify, and the call in each backend.
 *
 * busbw factors, nccl-tests' (github.com/NVIDIA/nccl-tests): doc/PERFORMANCE.md's summary gives
 * AllReduce 2(n-1)/n, ReduceScatter, AllGather and AlltoAll (n-1)/n, Broadcast and Reduce 1;
 * src/gather.cu and src/scatter.cu (GatherGetBw/ScatterGetBw: size = count * nranks, the big
 * buffer, times (n-1)/n) and src/sendrecv.cu (SendRecvGetBw: factor 1) give the others. */
enum { BENCH_ALL_REDUCE = 0, BENCH_REDUCE_SCATTER, BENCH_ALL_GATHER, BENCH_BROADCAST,
       BENCH_REDUCE, BENCH_GATHER, BENCH_SCATTER, BENCH_ALL_TO_ALL, BENCH_SENDRECV,
       BENCH_NUM_COLLS };
typedef struct {
    const char *name;          /* ours and NCCL's function name without the prefix */
    int has_op, has_root;
    double busbw_num;          /* busbw = algbw * (p - 1) * busbw_num / p, or algbw when 0 */
    int inplace_ok;            /* 0: no in-place form (only the out-of-place columns) */
    int result_at_root;        /* only the root has a result (reduce, gather) */
} bench_coll_t;
static const bench_coll_t bench_colls[BENCH_NUM_COLLS] = {
    {"all_reduce", 1, 0, 2.0, 1, 0}, {"reduce_scatter", 1, 0, 1.0, 1, 0},
    {"all_gather", 0, 0, 1.0, 1, 0}, {"broadcast", 0, 1, 0.0, 1, 0},
    {"reduce", 1, 1, 0.0, 1, 1}, {"gather", 0, 1, 1.0, 1, 1}, {"scatter", 0, 1, 1.0, 1, 0},
    {"all_to_all", 0, 0, 1.0, 0, 0}, {"sendrecv", 0, 0, 0.0, 0, 0}};

static double bench_busbw_factor(int coll, int p) {
    const bench_coll_t *c = &bench_colls[coll];
    return c->busbw_num > 0 ? c->busbw_num * (p - 1) / p : 1.0;
}

/* nccl-tests' names first; libddp's as aliases. */
static const struct { const char *name; int dtype; } bench_dtype_names[] = {
    {"int8", BENCH_INT8}, {"uint8", BENCH_UINT8}, {"int32", BENCH_INT32}, {"int", BENCH_INT32},
    {"uint32", BENCH_UINT32}, {"int64", BENCH_INT64}, {"uint64", BENCH_UINT64},
    {"half", BENCH_FLOAT16}, {"float16", BENCH_FLOAT16}, {"float", BENCH_FLOAT32},
    {"float32", BENCH_FLOAT32}, {"double", BENCH_FLOAT64}, {"float64", BENCH_FLOAT64},
    {"bfloat16", BENCH_BFLOAT16}, {"bf16", BENCH_BFLOAT16}};
static const char *const bench_dtype_short[BENCH_NUM_DTYPES] = {"int8", "uint8", "int32",
    "uint32", "int64", "uint64", "half", "float", "double", "bfloat16"};
static const size_t bench_dtype_bytes[BENCH_NUM_DTYPES] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2};
static const int bench_dtype_signed[BENCH_NUM_DTYPES] = {1, 0, 1, 0, 1, 0, 1, 1, 1, 1};
static const char *const bench_op_names[BENCH_NUM_OPS] = {"sum", "prod", "max", "min", "avg"};

typedef struct {
    size_t sizes[BENCH_MAX_SIZES];
    int nsizes;
    size_t minbytes, maxbytes;
    double factor;            /* -f */
    size_t stepbytes;         /* -i: linear steps instead of -f (0 = -f) */
    int iters, warmup;
    int agg_iters;            /* -m: calls per timed iteration */
    int average;              /* -a: time of rank 0 (0), mean (1), min (2), max (3) over ranks */
    double target_s;          /* --target-seconds: fewer iterations for slow sizes (0 = always -n) */
    int timeout_s;            /* -T: DDP_TIMEOUT_MS for the ranks (0 = the library's) */
    int coll, dtype, op, root;
    int nranks;               /* -N (fork mode of the libddp bench) */
    int check;                /* -c: check rounds per size and placement (0 = none) */
    int inplace;              /* --inplace: 0 out of place, 1 in place, -1 (default) both */
    int touch;                /* --touch: rewrite the input before each timed call (untimed) */
    int mem_mode;             /* --mem */
    int list_transports;      /* --list-transports */
    int corrupt;              /* DDP_BENCH_CORRUPT: the test hook */
    const char *transport;    /* --transport (ddp-bench: else DDP_TRANSPORT): NULL = auto */
    int transport_given;      /* --transport was on the command line */
    const char *json;         /* -J */
    const char *csv;          /* -F */
    const char *label;        /* -L: free text stored in the JSON ("O2", "seg=128K", ...) */
    int argc;
    char **argv;
} bench_opts_t;

typedef struct bench_backend {
    const char *name;         /* "libddp" / "mpi" / "gloo" */
    int rank, nranks;
    void *ctx;
    /* The collective being timed, with NCCL's arguments and in-place rules: count is the
     * count argument (all_reduce/broadcast: elements; reduce_scatter: recvcount; all_gather:
     * sendcount). 0 on success; on failure fills err. */
    int (*coll)(void *ctx, int coll, const void *sendbuf, void *recvbuf, size_t count, int dtype,
                int op, int root, char *err, size_t errcap);
    /* Older backends that only all-reduce may set this instead of coll. */
    int (*allreduce)(void *ctx, const void *sendbuf, void *recvbuf, size_t count, int dtype,
                     int op, char *err, size_t errcap);
    int (*barrier)(void *ctx);
    /* In place, across ranks: op is BENCH_SUM or BENCH_MAX. */
    int (*reduce_doubles)(void *ctx, double *v, int n, int op);
    int (*bcast_int)(void *ctx, int *v);      /* from rank 0 */
    int (*supports)(int coll, int dtype, int op);   /* NULL: everything; 0: refuse */
    /* An in-place reduce_scatter leaves this rank's block at the start of the buffer (MPI's
     * MPI_IN_PLACE rule) instead of at rank * recvcount (NCCL's and libddp's). */
    int rs_inplace_result_at_start;
    const char *transport;    /* what carried the data ("tcp", "shm+tcp", "mpi", ...) */
    const char *description;  /* printed in the header and stored in the JSON */
    /* Device buffers (--transport nccl): told the sweep's host buffers once, the backend makes device
     * twins and calls on them; `checking` is 1 around the checked (-c) calls, whose data it
     * copies to the twins and back. The timed calls move no extra data. */
    void (*buffers)(void *ctx, unsigned char *sendbuf, unsigned char *recvbuf, size_t cap);
    int checking;
    /* The sweep's two buffers from the backend (libddp's --registered 1: ddp_comm_mem_alloc;
     * collective: every rank calls them alike) instead of posix_memalign; NULL: posix_memalign. */
    void *(*alloc)(void *ctx, size_t bytes);
    void (*release)(void *ctx, void *ptr);
} bench_backend_t;

static double bench_now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* "64K", "1M", "1G", "8" (binary multiples, as nccl-tests). 0 on a malformed string. */
static size_t bench_parse_size(const char *s) {
    char *end;
    double v;
    if (!s || !*s) return 0;
    errno = 0;
    v = strtod(s, &end);
    if (errno || v < 0) return 0;
    switch (*end) {
    case 'k': case 'K': v *= 1024.0; end++; break;
    case 'm': case 'M': v *= 1024.0 * 1024.0; end++; break;
    case 'g': case 'G': v *= 1024.0 * 1024.0 * 1024.0; end++; break;
    default: break;
    }
    if (*end == 'B' || *end == 'b') end++;
    return *end ? 0 : (size_t)v;
}

static long bench_peak_rss_kib(void) {
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) != 0) return -1;
    return ru.ru_maxrss;   /* KiB on Linux */
}

/* User and system CPU seconds of this process so far. */
static void bench_cpu_s(double *user, double *sys) {
    struct rusage ru;
    *user = *sys = 0;
    if (getrusage(RUSAGE_SELF, &ru) != 0) return;
    *user = (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec * 1e-6;
    *sys = (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec * 1e-6;
}

static long bench_cur_rss_kib(void) {
    long pages = -1, res = -1;
    FILE *f = fopen("/proc/self/statm", "r");
    if (!f) return -1;
    if (fscanf(f, "%ld %ld", &pages, &res) != 2) res = -1;
    fclose(f);
    return res < 0 ? -1 : res * (sysconf(_SC_PAGESIZE) / 1024);
}

/* The options, as nccl-tests' (src/common.cu): every letter it has means the same here, with its
 * long name; what only this bench has is a long option (a letter too where nccl-tests has none).
 * --help lists them; bench/README.md's table maps the old spellings. */
static void bench_usage(FILE *f, const char *prog, int libddp) {
    fprintf(f,
        "usage: %s [options]\n"
        "Sizes (K/M/G suffixes, binary):\n"
        "  -b, --minbytes N        smallest size (default 8)\n"
        "  -e, --maxbytes N        largest size (default 64M; with --mem: the buffer, default 256M)\n"
        "  -f, --stepfactor F      multiply the size by F between rows (default 2)\n"
        "  -i, --stepbytes N       add N bytes between rows instead (linear steps, as nccl-tests)\n"
        "  -s, --sizes LIST        explicit sizes instead of -b/-e/-f/-i, e.g. 8,64K,1M,16M,64M\n"
        "What is called:\n"
        "  -o, --op NAME           reduction op: sum (default) prod max min avg; a collective name\n"
        "                          is taken too (as --coll)\n"
        "      --coll NAME         collective: all_reduce (default) reduce_scatter all_gather\n"
        "                          broadcast reduce gather scatter all_to_all sendrecv\n"
        "  -d, --datatype T        int8 uint8 int32 uint32 int64 uint64 half float double bfloat16\n"
        "                          (default float)\n"
        "  -r, --root N            root of broadcast, reduce, gather, scatter (default 0)\n"
        "      --inplace 0|1       only out of place (0) or only in place (1); default both, as\n"
        "                          nccl-tests (all_to_all and sendrecv: out of place only)\n"
        "Timing and checking:\n"
        "  -n, --iters N           timed iterations per size and placement (default 20)\n"
        "  -w, --warmup_iters N    untimed calls per size and placement (default 5)\n"
        "  -m, --agg_iters N       calls per timed iteration, back to back (default 1); time is\n"
        "                          per call\n"
        "      --touch 0|1         1: before each timed iteration every rank rewrites its input\n"
        "                          (zeros), then a barrier, both untimed: the input starts in the\n"
        "                          caller's cache, as gradients a training step just wrote do,\n"
        "                          not where the previous call left it (default 0)\n"
        "  -c, --check N           check every element N times per size and placement (default 1;\n"
        "                          0 = off)\n"
        "  -a, --average 0|1|2|3   time reported: rank 0's (0), mean over ranks (1, default), min\n"
        "                          (2) or max (3) over ranks of each rank's mean per call\n"
        "      --target-seconds S  cap each size at about S seconds of timed work (fewer than -n\n"
        "                          iterations for big sizes, never fewer than 10; rank 0 decides\n"
        "                          from the warmup; default 0 = off)\n"
        "  -T, --timeout S         give up a call after S seconds (DDP_TIMEOUT_MS for the ranks;\n"
        "                          default: the library's)\n"
        "Output:\n"
        "  -J, --json FILE         write the results as JSON (rank 0)\n"
        "  -F, --output_file FILE  write the rows as CSV (rank 0)\n"
        "  -L, --label TEXT        free text stored in the JSON\n"
        "      --mem               memory mode: one all_reduce of -e bytes (default 256M) in place;\n"
        "                          report peak RSS minus the buffer\n"
        "%s"
        "nccl-tests options that change nothing here (each rank is a process with one device):\n"
        "  -t, --nthreads 1        threads per process: only 1 (more ranks: --nranks)\n"
        "  -g, --ngpus 1           devices per thread: only 1 (a rank drives one device)\n"
        "  -p, --parallel_init 0|1 ranks are processes that each initialise themselves already\n"
        "  -z, --blocking 1        every call is waited for before the next (0 is refused)\n"
        "  -y, --stream_null 0     libddp owns its streams (1 is refused)\n"
        "  -G, --cudagraph 0       no CUDA graph capture (other values are refused)\n"
        "  -C, --report_cputime 0  wall time (1 is refused; the JSON has CPU cores per row)\n"
        "  -h, --help              this text\n"
        "      --version           the version\n",
        prog,
        libddp ? "Ranks and transport:\n"
                 "  -N, --nranks N          fork N ranks on this host (default 2; ignored under a\n"
                 "                          launcher: RANK+WORLD_SIZE, OMPI_COMM_WORLD_RANK+SIZE or\n"
                 "                          PMI_RANK+SIZE set)\n"
                 "      --transport NAME    auto (the best compiled in that reaches each peer) or a\n"
                 "                          name from --list-transports (default: DDP_TRANSPORT, else\n"
                 "                          auto); sets ddp_comm_desc_t.transport\n"
                 "      --list-transports   the transports compiled into this program, one a line\n"
               : "Ranks and transport:\n"
                 "  -N, --nranks N, --transport NAME  accepted and ignored (the launcher and the MPI\n"
                 "                          library decide)\n");
}

static int bench_find_op(const char *v) {
    int k;
    for (k = 0; k < BENCH_NUM_OPS; k++) if (!strcasecmp(v, bench_op_names[k])) return k;
    return -1;
}

/* "all_reduce", "allreduce", "all-reduce", "AllReduce" all name the same collective. */
static int bench_find_coll(const char *v) {
    int k;
    for (k = 0; k < BENCH_NUM_COLLS; k++) {
        const char *a = v, *b = bench_colls[k].name;
        for (;;) {
            while (*a == '_' || *a == '-') a++;
            while (*b == '_') b++;
            if (!*a || !*b || (*a | 0x20) != (*b | 0x20)) break;
            a++;
            b++;
        }
        if (!*a && !*b) return k;
    }
    return -1;
}

/* A whole number in [lo, hi], or 0 with *ok cleared. */
static long bench_parse_int(const char *v, long lo, long hi, int *ok) {
    char *end;
    long x;
    errno = 0;
    x = strtol(v, &end, 10);
    if (errno || end == v || *end || x < lo || x > hi) { *ok = 0; return 0; }
    return x;
}

/* Long options without a letter. */
enum { BENCH_OPT_COLL = 256, BENCH_OPT_TRANSPORT, BENCH_OPT_INPLACE, BENCH_OPT_MEM,
       BENCH_OPT_TARGET, BENCH_OPT_LIST, BENCH_OPT_VERSION, BENCH_OPT_TOUCH };

/* Parses argv. Returns -1 to go on; otherwise the exit status: 0 after --help or --version
 * (printed to stdout), 2 after a bad option (why, then the usage, on stderr). version is the
 * line --version prints. */
static int bench_parse_args(int argc, char **argv, bench_opts_t *o, int libddp,
                            const char *version) {
    static const struct option longopts[] = {
        {"minbytes", required_argument, NULL, 'b'}, {"maxbytes", required_argument, NULL, 'e'},
        {"stepfactor", required_argument, NULL, 'f'}, {"stepbytes", required_argument, NULL, 'i'},
        {"sizes", required_argument, NULL, 's'}, {"iters", required_argument, NULL, 'n'},
        {"warmup_iters", required_argument, NULL, 'w'}, {"warmup-iters", required_argument, NULL, 'w'},
        {"agg_iters", required_argument, NULL, 'm'}, {"agg-iters", required_argument, NULL, 'm'},
        {"check", required_argument, NULL, 'c'}, {"op", required_argument, NULL, 'o'},
        {"datatype", required_argument, NULL, 'd'}, {"root", required_argument, NULL, 'r'},
        {"average", required_argument, NULL, 'a'}, {"timeout", required_argument, NULL, 'T'},
        {"json", required_argument, NULL, 'J'}, {"output_file", required_argument, NULL, 'F'},
        {"output-file", required_argument, NULL, 'F'}, {"label", required_argument, NULL, 'L'},
        {"nranks", required_argument, NULL, 'N'}, {"nthreads", required_argument, NULL, 't'},
        {"ngpus", required_argument, NULL, 'g'}, {"parallel_init", required_argument, NULL, 'p'},
        {"blocking", required_argument, NULL, 'z'}, {"stream_null", required_argument, NULL, 'y'},
        {"cudagraph", required_argument, NULL, 'G'}, {"report_cputime", required_argument, NULL, 'C'},
        {"help", no_argument, NULL, 'h'},
        {"coll", required_argument, NULL, BENCH_OPT_COLL},
        {"collective", required_argument, NULL, BENCH_OPT_COLL},
        {"transport", required_argument, NULL, BENCH_OPT_TRANSPORT},
        {"inplace", required_argument, NULL, BENCH_OPT_INPLACE},
        {"touch", required_argument, NULL, BENCH_OPT_TOUCH},
        {"mem", no_argument, NULL, BENCH_OPT_MEM},
        {"target-seconds", required_argument, NULL, BENCH_OPT_TARGET},
        {"target_seconds", required_argument, NULL, BENCH_OPT_TARGET},
        {"list-transports", no_argument, NULL, BENCH_OPT_LIST},
        {"version", no_argument, NULL, BENCH_OPT_VERSION},
        {NULL, 0, NULL, 0}};
    /* '+': stop at the first word that is not an option instead of reordering argv (the JSON
     * records the command as typed); ':' first: this function words the errors. */
    static const char shortopts[] = "+:b:e:f:i:s:n:w:m:c:o:d:r:a:T:J:F:L:N:t:g:p:z:y:G:C:h";
    const char *corrupt = getenv("DDP_BENCH_CORRUPT");
    const char *prog = argv[0];
    int opt, ok = 1, k, last_step = 'f';
    memset(o, 0, sizeof *o);
    o->argc = argc;
    o->argv = argv;
    o->minbytes = 8;
    o->maxbytes = 0;
    o->factor = 2.0;
    o->iters = 20;
    o->warmup = 5;
    o->agg_iters = 1;
    o->average = 1;
    o->coll = BENCH_ALL_REDUCE;
    o->dtype = BENCH_FLOAT32;
    o->op = BENCH_SUM;
    o->nranks = 2;
    o->check = 1;
    o->inplace = -1;
    o->corrupt = corrupt && *corrupt && strcmp(corrupt, "0");
    optind = 1;
    opterr = 0;
    while ((opt = getopt_long(argc, argv, shortopts, longopts, NULL)) != -1) {
        const char *v = optarg;
        switch (opt) {
        case 'b': if (!(o->minbytes = bench_parse_size(v)) && strcmp(v, "0")) goto badv; break;
        case 'e': if (!(o->maxbytes = bench_parse_size(v))) goto badv; break;
        case 'f': o->factor = atof(v); if (o->factor <= 1.0) goto badv; last_step = 'f'; break;
        case 'i': if (!(o->stepbytes = bench_parse_size(v))) goto badv; last_step = 'i'; break;
        case 'n': o->iters = (int)bench_parse_int(v, 1, 100000000, &ok); break;
        case 'w': o->warmup = (int)bench_parse_int(v, 0, 100000000, &ok); break;
        case 'm': o->agg_iters = (int)bench_parse_int(v, 1, 1000000, &ok); break;
        case 'c': o->check = (int)bench_parse_int(v, 0, 1000000, &ok); break;
        case 'r': o->root = (int)bench_parse_int(v, 0, 1 << 20, &ok); break;
        case 'a': o->average = (int)bench_parse_int(v, 0, 3, &ok); break;
        case 'T': o->timeout_s = (int)bench_parse_int(v, 1, 1000000, &ok); break;
        case 'N': o->nranks = (int)bench_parse_int(v, 1, 1024, &ok); break;
        case 'p': bench_parse_int(v, 0, 1, &ok); break;   /* every rank initialises itself */
        case BENCH_OPT_TARGET: o->target_s = atof(v); if (o->target_s < 0) goto badv; break;
        case BENCH_OPT_INPLACE: o->inplace = (int)bench_parse_int(v, 0, 1, &ok); break;
        case BENCH_OPT_TOUCH: o->touch = (int)bench_parse_int(v, 0, 1, &ok); break;
        case BENCH_OPT_MEM: o->mem_mode = 1; break;
        case BENCH_OPT_LIST: o->list_transports = 1; break;
        case BENCH_OPT_TRANSPORT: o->transport = strcmp(v, "auto") ? v : NULL; o->transport_given = 1; break;
        case 'J': o->json = v; break;
        case 'F': o->csv = v; break;
        case 'L': o->label = v; break;
        case 't':
            if (bench_parse_int(v, 1, 1, &ok) != 1 || !ok) {
                fprintf(stderr, "%s: -t/--nthreads %s: one thread per process only (nccl-tests' "
                        "-t runs several ranks as threads of one process). For more ranks use "
                        "-N/--nranks N (each rank a process), or --transport threads in a "
                        "program that runs ranks as threads. The transport is --transport NAME "
                        "(or DDP_TRANSPORT).\n", prog, v);
                return 2;
            }
            break;
        case 'g':
            if (bench_parse_int(v, 1, 1, &ok) != 1 || !ok) {
                fprintf(stderr, "%s: -g/--ngpus %s: one device per rank only (each rank drives one "
                        "GPU: start one rank per GPU, -N/--nranks N or a launcher).\n", prog, v);
                return 2;
            }
            break;
        case 'z':
            if (bench_parse_int(v, 1, 1, &ok) != 1 || !ok) {
                fprintf(stderr, "%s: -z/--blocking %s: every call here is waited for before the "
                        "next (nccl-tests' -z 1); there is no non-blocking mode.\n", prog, v);
                return 2;
            }
            break;
        case 'y': case 'G': case 'C':
            if (bench_parse_int(v, 0, 0, &ok) != 0 || !ok) {
                fprintf(stderr, "%s: -%c %s: not supported (%s).\n", prog, opt, v,
                        opt == 'y' ? "libddp owns its CUDA streams" :
                        opt == 'G' ? "no CUDA graph capture" :
                        "the time is wall time; the JSON has CPU cores per row");
                return 2;
            }
            break;
        case 'd': {
            size_t j;
            o->dtype = -1;
            for (j = 0; j < sizeof bench_dtype_names / sizeof bench_dtype_names[0]; j++)
                if (!strcasecmp(v, bench_dtype_names[j].name)) o->dtype = bench_dtype_names[j].dtype;
            if (o->dtype < 0) goto badv;
            break;
        }
        case 'o':
            /* nccl-tests' -o is the reduction op; ours takes a collective too (the names do not
             * overlap). */
            if ((k = bench_find_coll(v)) >= 0) o->coll = k;
            else if ((k = bench_find_op(v)) >= 0) o->op = k;
            else goto badv;
            break;
        case BENCH_OPT_COLL: if ((o->coll = bench_find_coll(v)) < 0) goto badv; break;
        case 's': {
            char buf[1024], *tok, *save = NULL;
            snprintf(buf, sizeof buf, "%s", v);
            o->nsizes = 0;
            for (tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
                size_t b = bench_parse_size(tok);
                if (!b && strcmp(tok, "0")) goto badv;
                if (o->nsizes == BENCH_MAX_SIZES) goto badv;
                o->sizes[o->nsizes++] = b;
            }
            if (!o->nsizes) goto badv;
            break;
        }
        case 'h': bench_usage(stdout, prog, libddp); return 0;
        case BENCH_OPT_VERSION: printf("%s\n", version); return 0;
        case ':':
            fprintf(stderr, "%s: %s needs a value\n", prog, argv[optind - 1]);
            goto usage;
        default:   /* '?' */
            if (optopt) fprintf(stderr, "%s: unknown option '-%c'\n", prog, optopt);
            else fprintf(stderr, "%s: unknown option '%s'\n", prog, argv[optind - 1]);
            goto usage;
        }
        if (!ok) goto badv;
        continue;
    badv:
        fprintf(stderr, "%s: bad value '%s' for %s\n", prog, v, argv[optind - 1]);
        return 2;
    }
    if (optind < argc) {
        fprintf(stderr, "%s: unexpected argument '%s'\n", prog, argv[optind]);
        goto usage;
    }
    if (last_step == 'f') o->stepbytes = 0;
    if (o->inplace == 1 && !bench_colls[o->coll].inplace_ok) {
        fprintf(stderr, "%s: %s has no in-place form (out of place only): drop --inplace 1\n", prog,
                bench_colls[o->coll].name);
        return 2;
    }
    if (o->mem_mode && o->coll != BENCH_ALL_REDUCE) {
        fprintf(stderr, "%s: --mem measures all_reduce only\n", prog);
        return 2;
    }
    if (o->mem_mode && o->csv) {
        fprintf(stderr, "%s: --mem has no rows for -F (use -J)\n", prog);
        return 2;
    }
    if (!o->maxbytes) o->maxbytes = o->mem_mode ? (256u << 20) : (64u << 20);
    if (!o->nsizes) {
        double b = (double)o->minbytes;
        if (o->minbytes > o->maxbytes) { fprintf(stderr, "%s: -b > -e\n", prog); return 2; }
        while (b <= (double)o->maxbytes) {
            if (o->nsizes == BENCH_MAX_SIZES) {
                fprintf(stderr, "%s: more than %d sizes from -b to -e: take a bigger step "
                        "(-f or -i)\n", prog, BENCH_MAX_SIZES);
                return 2;
            }
            o->sizes[o->nsizes++] = (size_t)b;
            if (o->stepbytes) b += (double)o->stepbytes;
            else b = b == 0 ? o->factor : b * o->factor;
        }
    } else {
        o->maxbytes = 0;
        for (k = 0; k < o->nsizes; k++) if (o->sizes[k] > o->maxbytes) o->maxbytes = o->sizes[k];
    }
    return -1;
usage:
    bench_usage(stderr, prog, libddp);
    return 2;
}

/* ---- reference data.
 * Rank r's element i is a small positive integer, so every dtype holds it exactly and the
 * sequential result is exact too: 1 + (17 i + r) mod m with m = 13 (fewer for p > 18, so that
 * a sum stays <= 256, which bfloat16 holds exactly). Element values vary with i and with r, so
 * a block landing at the wrong offset or coming from the wrong rank is caught, not only a
 * missing contribution. prod uses 1 or 2 instead (products are powers of two). Integer results
 * are compared modulo the type's width after the same wrap-around and truncating division the
 * libraries do. */
static int bench_modulus(int p) {
    int m = 240 / (p > 0 ? p : 1);
    return m > 13 ? 13 : m < 2 ? 2 : m;
}
static int bench_value(int op, int rank, size_t i, int p) {
    if (op == BENCH_PROD) return (i + (size_t)rank) % 3 == 0 ? 2 : 1;
    return 1 + (int)((17 * i + (size_t)rank) % (size_t)bench_modulus(p));
}
static size_t bench_period(int op, int p) { return op == BENCH_PROD ? 3 : (size_t)bench_modulus(p); }

static uint16_t bench_f2h(float f) {   /* small exact integers only: enough for the pattern */
    uint32_t x;
    int e;
    memcpy(&x, &f, 4);
    if ((x & 0x7fffffffu) == 0) return (uint16_t)(x >> 16);
    e = (int)((x >> 23) & 0xff) - 127 + 15;
    if (e >= 31) return (uint16_t)(((x >> 16) & 0x8000u) | 0x7c00u);
    if (e <= 0) return (uint16_t)((x >> 16) & 0x8000u);
    return (uint16_t)(((x >> 16) & 0x8000u) | ((uint32_t)e << 10) | ((x >> 13) & 0x3ffu));
}
static double bench_h2d(uint16_t h) {
    int e = (h >> 10) & 0x1f;
    double m = (double)(h & 0x3ff);
    double v = e == 0 ? ldexp(m, -24) : e == 31 ? INFINITY : ldexp(m + 1024.0, e - 25);
    return (h & 0x8000) ? -v : v;
}
static uint16_t bench_f2bf(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    return (uint16_t)(x >> 16);   /* exact for the pattern's values */
}
static double bench_bf2d(uint16_t b) {
    uint32_t x = (uint32_t)b << 16;
    float f;
    memcpy(&f, &x, 4);
    return (double)f;
}

static void bench_set(void *buf, size_t i, int dtype, int v) {
    switch (dtype) {
    case BENCH_INT8: case BENCH_UINT8: ((uint8_t *)buf)[i] = (uint8_t)v; break;
    case BENCH_INT32: case BENCH_UINT32: ((uint32_t *)buf)[i] = (uint32_t)v; break;
    case BENCH_INT64: case BENCH_UINT64: ((uint64_t *)buf)[i] = (uint64_t)v; break;
    case BENCH_FLOAT16: ((uint16_t *)buf)[i] = bench_f2h((float)v); break;
    case BENCH_FLOAT32: ((float *)buf)[i] = (float)v; break;
    case BENCH_FLOAT64: ((double *)buf)[i] = (double)v; break;
    case BENCH_BFLOAT16: ((uint16_t *)buf)[i] = bench_f2bf((float)v); break;
    }
}

/* What an element should hold: the raw integer (masked to the type's width) or the value. */
typedef struct { uint64_t u; double d; } bench_expect_t;

static uint64_t bench_mask(int dtype) {
    size_t es = bench_dtype_bytes[dtype];
    return es == 8 ? ~(uint64_t)0 : (((uint64_t)1 << (8 * es)) - 1);
}

/* The sequential result of op over every rank's element i (a copy's value when op < 0). */
static bench_expect_t bench_reference(int dtype, int op, size_t i, int p, int only_rank) {
    bench_expect_t e;
    uint64_t acc = 0, mask = bench_mask(dtype);
    double dacc = 0;
    int r;
    if (op < 0) {
        int v = bench_value(BENCH_SUM, only_rank, i, p);
        e.u = (uint64_t)v & mask;
        e.d = v;
        return e;
    }
    for (r = 0; r < p; r++) {
        int v = bench_value(op, r, i, p);
        if (r == 0) { acc = (uint64_t)v; dacc = v; continue; }
        switch (op) {
        case BENCH_SUM: case BENCH_AVG: acc += (uint64_t)v; dacc += v; break;
        case BENCH_PROD: acc *= (uint64_t)v; dacc *= v; break;
        case BENCH_MAX: if ((uint64_t)v > acc) acc = (uint64_t)v; if (v > dacc) dacc = v; break;
        case BENCH_MIN: if ((uint64_t)v < acc) acc = (uint64_t)v; if (v < dacc) dacc = v; break;
        }
    }
    acc &= mask;
    if (op == BENCH_AVG) {
        /* libddp and NCCL: the sum wraps in the type, then one truncating division */
        if (bench_dtype_signed[dtype] && mask != ~(uint64_t)0 && (acc >> (8 * bench_dtype_bytes[dtype] - 1)))
            acc = (uint64_t)((int64_t)(acc | ~mask) / p) & mask;
        else if (bench_dtype_signed[dtype])
            acc = (uint64_t)((int64_t)acc / p) & mask;
        else
            acc = acc / (uint64_t)p;
        dacc /= p;
    }
    e.u = acc;
    e.d = dacc;
    return e;
}

/* 1 if element i of buf holds what e says. */
static int bench_matches(const void *buf, size_t i, int dtype, const bench_expect_t *e) {
    double got, tol;
    switch (dtype) {
    case BENCH_INT8: case BENCH_UINT8: return ((const uint8_t *)buf)[i] == e->u;
    case BENCH_INT32: case BENCH_UINT32: return ((const uint32_t *)buf)[i] == e->u;
    case BENCH_INT64: case BENCH_UINT64: return ((const uint64_t *)buf)[i] == e->u;
    case BENCH_FLOAT16: got = bench_h2d(((const uint16_t *)buf)[i]); tol = 1e-2; break;
    case BENCH_BFLOAT16: got = bench_bf2d(((const uint16_t *)buf)[i]); tol = 1e-2; break;
    case BENCH_FLOAT32: got = ((const float *)buf)[i]; tol = 1e-6; break;
    default: got = ((const double *)buf)[i]; tol = 1e-12; break;
    }
    /* exact values except avg's division (rounded once by the library) */
    return fabs(got - e->d) <= tol * fabs(e->d);
}

/* Flips the top bit of element i: a different value in every dtype (sign of a float). */
static void bench_corrupt(void *buf, size_t i, int dtype) {
    size_t es = bench_dtype_bytes[dtype];
    unsigned char *b = (unsigned char *)buf + i * es;
    uint16_t one = 1;
    int little = *(unsigned char *)&one == 1;
    b[little ? es - 1 : 0] ^= 0x80;
}

/* ---- buffer geometry of one call (nccl-tests' getCollByteCount, in words) */
typedef struct {
    size_t count;         /* the call's count argument */
    size_t total;         /* elements of the biggest buffer: what size counts */
    size_t in_elems;      /* elements this rank provides (0: scatter off the root) */
    size_t out_elems;     /* elements of this rank's result (0: reduce/gather off the root) */
} bench_geom_t;

/* nccl-tests' *GetCollByteCount: reduce and sendrecv count = n; gather, scatter and all_to_all
 * count = n / p per rank (or per peer), the big buffer count * p. */
static bench_geom_t bench_geometry(int coll, size_t bytes, size_t es, int p, int me, int root) {
    bench_geom_t g;
    size_t n = bytes / es;
    switch (coll) {
    case BENCH_REDUCE_SCATTER:
        g.count = n / (size_t)p; g.total = g.count * (size_t)p;
        g.in_elems = g.total; g.out_elems = g.count; break;
    case BENCH_ALL_GATHER: case BENCH_GATHER:
        g.count = n / (size_t)p; g.total = g.count * (size_t)p;
        g.in_elems = g.count; g.out_elems = g.total; break;
    case BENCH_SCATTER:
        g.count = n / (size_t)p; g.total = g.count * (size_t)p;
        g.in_elems = g.total; g.out_elems = g.count; break;
    case BENCH_ALL_TO_ALL:
        g.count = n / (size_t)p; g.total = g.count * (size_t)p;
        g.in_elems = g.out_elems = g.total; break;
    default:
        g.count = g.total = g.in_elems = g.out_elems = n; break;
    }
    if (bench_colls[coll].result_at_root && me != root) g.out_elems = 0;
    if (coll == BENCH_SCATTER && me != root) g.in_elems = 0;
    return g;
}

/* The rank whose result DDP_BENCH_CORRUPT flips: 0, or the root where only it has a result. */
static int bench_corrupt_rank(const bench_opts_t *o) {
    return bench_colls[o->coll].result_at_root ? o->root : 0;
}

/* The pointers of one call: NCCL's in-place rules (README: "in place when"). */
static void bench_pointers(int coll, int inplace, unsigned char *sendbuf, unsigned char *recvbuf,
                           size_t count, size_t es, int me, unsigned char **sp, unsigned char **rp) {
    *sp = sendbuf;
    *rp = recvbuf;
    if (!inplace) return;
    switch (coll) {
    case BENCH_REDUCE_SCATTER: case BENCH_SCATTER:   /* recv == send + rank * recvcount */
        *sp = recvbuf; *rp = recvbuf + (size_t)me * count * es; break;
    case BENCH_ALL_GATHER: case BENCH_GATHER:        /* send == recv + rank * sendcount */
        *sp = recvbuf + (size_t)me * count * es; break;
    default: *sp = recvbuf; break;                   /* all_reduce, broadcast, reduce */
    }
}

/* Fills this rank's input of a checked call; the result area gets zeros, which the pattern never
 * holds, so an element the collective did not write is counted wrong. Rank r's input is the
 * pattern of rank r over the whole input (all_to_all: block j, bound for rank j, is elements
 * j*count.. of it; scatter: only the root has an input). */
static void bench_fill(const bench_opts_t *o, const bench_geom_t *g, int me, int p,
                       unsigned char *sp, unsigned char *rp, size_t es) {
    size_t i;
    int op = bench_colls[o->coll].has_op ? o->op : BENCH_SUM;
    memset(rp, 0, g->out_elems * es);
    if (o->coll == BENCH_BROADCAST && me != o->root) {
        if (sp != rp) memset(sp, 0, g->in_elems * es);
        return;
    }
    for (i = 0; i < g->in_elems; i++) bench_set(sp, i, o->dtype, bench_value(op, me, i, p));
}

/* Wrong elements of this rank's result. The reference depends on i only through i mod a small
 * period, so it is computed once per residue: checking 64 MiB costs about a memory pass. */
static long bench_verify(const bench_opts_t *o, const bench_geom_t *g, int me, int p,
                         const unsigned char *res) {
    bench_expect_t tab[16];
    size_t per, i, base = 0, k;
    long wrong = 0;
    int op = o->op;
    switch (o->coll) {
    case BENCH_ALL_REDUCE: case BENCH_REDUCE_SCATTER:
        if (o->coll == BENCH_REDUCE_SCATTER) base = (size_t)me * g->count;
        per = bench_period(op, p);
        for (k = 0; k < per; k++) tab[k] = bench_reference(o->dtype, op, k, p, 0);
        for (i = 0; i < g->out_elems; i++)
            wrong += !bench_matches(res, i, o->dtype, &tab[(base + i) % per]);
        break;
    case BENCH_REDUCE:   /* the root's result only (out_elems is 0 elsewhere) */
        per = bench_period(op, p);
        for (k = 0; k < per; k++) tab[k] = bench_reference(o->dtype, op, k, p, 0);
        for (i = 0; i < g->out_elems; i++) wrong += !bench_matches(res, i, o->dtype, &tab[i % per]);
        break;
    case BENCH_ALL_GATHER: case BENCH_GATHER: {   /* block r: rank r's input */
        int r;
        per = bench_period(BENCH_SUM, p);
        for (r = 0; r < (g->out_elems ? p : 0); r++) {
            const unsigned char *blk = res + (size_t)r * g->count * bench_dtype_bytes[o->dtype];
            for (k = 0; k < per; k++) tab[k] = bench_reference(o->dtype, -1, k, p, r);
            for (i = 0; i < g->count; i++) wrong += !bench_matches(blk, i, o->dtype, &tab[i % per]);
        }
        break;
    }
    case BENCH_BROADCAST:
        per = bench_period(BENCH_SUM, p);
        for (k = 0; k < per; k++) tab[k] = bench_reference(o->dtype, -1, k, p, o->root);
        for (i = 0; i < g->out_elems; i++) wrong += !bench_matches(res, i, o->dtype, &tab[i % per]);
        break;
    case BENCH_SCATTER:   /* block me of the root's input */
        base = (size_t)me * g->count;
        per = bench_period(BENCH_SUM, p);
        for (k = 0; k < per; k++) tab[k] = bench_reference(o->dtype, -1, k, p, o->root);
        for (i = 0; i < g->out_elems; i++)
            wrong += !bench_matches(res, i, o->dtype, &tab[(base + i) % per]);
        break;
    case BENCH_ALL_TO_ALL: {   /* block r: block me of rank r's input */
        int r;
        base = (size_t)me * g->count;
        per = bench_period(BENCH_SUM, p);
        for (r = 0; r < p; r++) {
            const unsigned char *blk = res + (size_t)r * g->count * bench_dtype_bytes[o->dtype];
            for (k = 0; k < per; k++) tab[k] = bench_reference(o->dtype, -1, k, p, r);
            for (i = 0; i < g->count; i++)
                wrong += !bench_matches(blk, i, o->dtype, &tab[(base + i) % per]);
        }
        break;
    }
    case BENCH_SENDRECV:   /* rank me - 1's input */
        per = bench_period(BENCH_SUM, p);
        for (k = 0; k < per; k++) tab[k] = bench_reference(o->dtype, -1, k, p, (me + p - 1) % p);
        for (i = 0; i < g->out_elems; i++) wrong += !bench_matches(res, i, o->dtype, &tab[i % per]);
        break;
    }
    return wrong;
}

static int bench_cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Nearest-rank percentile of sorted v[0..n). */
static double bench_pct(const double *v, int n, double q) {
    int k = (int)ceil(q * n) - 1;
    if (k < 0) k = 0;
    if (k >= n) k = n - 1;
    return v[k];
}

typedef struct {
    size_t bytes, count;
    int iters, inplace, done;
    double time_us, algbw, busbw, p50_us, p99_us, min_us, max_us;
    double cpu_cores, user_cores, sys_cores;   /* CPU of all ranks during the timed calls / wall */
    long wrong;                                /* -1: not checked */
} bench_row_t;

static void bench_json_escape(FILE *f, const char *s) {
    fputc('"', f);
    for (; s && *s; s++) {
        if (*s == '"' || *s == '\\') fprintf(f, "\\%c", *s);
        else if ((unsigned char)*s < 0x20) fprintf(f, "\\u%04x", *s);
        else fputc(*s, f);
    }
    fputc('"', f);
}

extern char **environ;

/* A secret's value never reaches benchmark output: it is shown as "(set)". */
static int bench_env_secret(const char *var) {
    return !strncmp(var, "DDP_JOB_SECRET=", 15) || strstr(var, "SECRET") || strstr(var, "TOKEN");
}

/* Every DDP_* variable of the environment (the library's knobs), as a JSON object. */
static void bench_json_env(FILE *f) {
    char **e;
    int first = 1;
    fprintf(f, "{");
    for (e = environ; e && *e; e++) {
        const char *eq = strchr(*e, '=');
        char name[128];
        if (strncmp(*e, "DDP_", 4) || !eq || (size_t)(eq - *e) >= sizeof name) continue;
        memcpy(name, *e, (size_t)(eq - *e));
        name[eq - *e] = 0;
        fprintf(f, "%s", first ? "" : ", ");
        bench_json_escape(f, name);
        fprintf(f, ": ");
        bench_json_escape(f, bench_env_secret(*e) ? "(set)" : eq + 1);
        first = 0;
    }
    fprintf(f, "}");
}

/* What the time column is (-a). */
static const char *bench_time_label(const bench_opts_t *o) {
    static const char *const what[4] = {"mean per call on rank 0",
        "mean per call on each rank, averaged over ranks", "mean per call on each rank, min over ranks",
        "mean per call on each rank, max over ranks"};
    return what[o->average];
}

static const char *bench_op_label(const bench_opts_t *o) {
    return bench_colls[o->coll].has_op ? bench_op_names[o->op] : "none";
}
static int bench_root_label(const bench_opts_t *o) {
    return bench_colls[o->coll].has_root ? o->root : -1;   /* nccl-tests prints -1: no root */
}

static void bench_json_head(FILE *f, const bench_opts_t *o, const bench_backend_t *b,
                            const char *mode) {
    struct utsname u;
    char date[32] = "", cmd[2048] = "";
    time_t now = time(NULL);
    struct tm tmv;
    size_t off = 0;
    int k;
    if (uname(&u) != 0) memset(&u, 0, sizeof u);
    if (gmtime_r(&now, &tmv)) strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", &tmv);
    for (k = 0; k < o->argc && off + 2 < sizeof cmd; k++)
        off += (size_t)snprintf(cmd + off, sizeof cmd - off, "%s%s", k ? " " : "", o->argv[k]);
    fprintf(f, "{\n  \"schema\": \"ddp-bench/1\",\n  \"bench\": \"%s\",\n  \"collective\": \"%s\","
               "\n  \"impl\": ", bench_colls[o->coll].name, bench_colls[o->coll].name);
    bench_json_escape(f, b->name);
    fprintf(f, ",\n  \"transport\": ");
    bench_json_escape(f, b->transport ? b->transport : "");
    fprintf(f, ",\n  \"transport_requested\": ");
    bench_json_escape(f, o->transport ? o->transport : "auto");
    fprintf(f, ",\n  \"description\": ");
    bench_json_escape(f, b->description);
    fprintf(f, ",\n  \"label\": ");
    bench_json_escape(f, o->label ? o->label : "");
    fprintf(f, ",\n  \"command\": ");
    bench_json_escape(f, cmd);
    fprintf(f, ",\n  \"date\": \"%s\",\n  \"mode\": \"%s\",\n  \"nranks\": %d,\n  \"dtype\": \"%s\","
               "\n  \"op\": \"%s\",\n  \"root\": %d,\n  \"iters\": %d,\n  \"warmup\": %d,"
               "\n  \"target_s\": %g,\n  \"check\": %d,\n  \"busbw_factor\": %.6f,"
               "\n  \"agg_iters\": %d,\n  \"time\": \"%s\",\n  \"GB\": 1e9,"
               "\n  \"host\": {\"name\": ",
            date, mode, b->nranks, bench_dtype_short[o->dtype], bench_op_label(o),
            bench_root_label(o), o->iters, o->warmup, o->target_s, o->check,
            bench_busbw_factor(o->coll, b->nranks), o->agg_iters,
            o->average == 1 ? "mean per call, averaged over ranks" : bench_time_label(o));
    bench_json_escape(f, u.nodename);
    fprintf(f, ", \"nproc\": %ld, \"kernel\": ", sysconf(_SC_NPROCESSORS_ONLN));
    bench_json_escape(f, u.release);
    fprintf(f, "},\n  \"env\": ");
    bench_json_env(f);
}

static void bench_print_env(const bench_backend_t *b) {
    char **e;
    int n = 0;
    if (strcmp(b->name, "libddp")) return;
    printf("# env:");
    for (e = environ; e && *e; e++)
        if (!strncmp(*e, "DDP_", 4)) {
            if (bench_env_secret(*e)) printf(" %.*s=(set)", (int)(strchr(*e, '=') - *e), *e);
            else printf(" %s", *e);
            n++;
        }
    printf("%s\n", n ? "" : " no DDP_* knobs set (library defaults)");
}

/* nccl-tests' header, row and footer layout (src/common.cu: the Reporter's formats), then our
 * latency columns. */
static void bench_header(const bench_opts_t *o, const bench_backend_t *b, const int *pl, int npl) {
    struct utsname u;
    int k;
    if (uname(&u) != 0) memset(&u, 0, sizeof u);
    printf("# %s %s: nranks %d, transport %s%s%s%s, host %s (%ld cores)\n", b->name,
           bench_colls[o->coll].name, b->nranks, b->transport ? b->transport : "?",
           o->transport ? " (requested " : "", o->transport ? o->transport : "",
           o->transport ? ")" : "", u.nodename, sysconf(_SC_NPROCESSORS_ONLN));
    printf("# %s\n", b->description);
    if (o->stepbytes)
        printf("# minBytes %zu maxBytes %zu step: %zu(bytes)", o->sizes[0], o->maxbytes, o->stepbytes);
    else
        printf("# minBytes %zu maxBytes %zu step: %g(factor)", o->sizes[0], o->maxbytes, o->factor);
    printf(" warmup iters: %d iters: %d%s agg iters: %d validation: %d\n", o->warmup, o->iters,
           o->target_s > 0 ? " (fewer when --target-seconds caps a size)" : "", o->agg_iters,
           o->check);
    bench_print_env(b);
    printf("# time = %s%s; algbw = size / time; busbw = algbw * %s; GB = 1e9 B\n",
           bench_time_label(o), o->average == 1 ? " (nccl-tests' default)" : " (-a)",
           bench_colls[o->coll].busbw_num == 2.0 ? "2(p-1)/p" :
           bench_colls[o->coll].busbw_num > 0 ? "(p-1)/p" : "1");
    if (!bench_colls[o->coll].inplace_ok)
        printf("# in-place: not run, %s has no in-place form (%s); out-of-place columns only "
               "(nccl-tests times it anyway and prints N/A for its errors)\n", bench_colls[o->coll].name,
               o->coll == BENCH_ALL_TO_ALL ? "ddp_all_to_all refuses send == recv, as NCCL"
                                           : "a send and a receive of one buffer in one group race");
    printf("# p50/p99 = per-call latency percentiles (sizes <= %u KiB), averaged over ranks\n",
           BENCH_LAT_MAX_BYTES >> 10);
    if (o->corrupt) printf("# DDP_BENCH_CORRUPT set: rank 0 flips one element of every checked result\n");
    printf("#\n# %10s  %12s  %8s  %6s  %6s", "", "", "", "", "");
    for (k = 0; k < npl; k++) printf("  %-30s", pl[k] ? "           in-place" : "         out-of-place");
    for (k = 0; k < npl; k++) printf("  %-16s", pl[k] ? "in-place lat" : "out-of-place lat");
    printf("\n# %10s  %12s  %8s  %6s  %6s", "size", "count", "type", "redop", "root");
    for (k = 0; k < npl; k++) printf("  %7s  %6s  %6s %6s", "time", "algbw", "busbw", "#wrong");
    for (k = 0; k < npl; k++) printf("  %7s  %7s", "p50", "p99");
    printf("\n# %10s  %12s  %8s  %6s  %6s", "(B)", "(elements)", "", "", "");
    for (k = 0; k < npl; k++) printf("  %7s  %6s  %6s  %5s", "(us)", "(GB/s)", "(GB/s)", "");
    for (k = 0; k < npl; k++) printf("  %7s  %7s", "(us)", "(us)");
    printf("\n");
    fflush(stdout);
}

/* nccl-tests' time format: fewer decimals as the number grows, 7 wide. */
static void bench_fmt_time(char *out, size_t cap, double us) {
    snprintf(out, cap, us >= 10000.0 ? "%7.0f" : us >= 100.0 ? "%7.1f" : "%7.2f", us);
}

static void bench_print_row(const bench_opts_t *o, const bench_row_t *rows, int npl) {
    char t[32], nw[24], a[32], b2[32];
    int k;
    printf("%12zu  %12zu  %8s  %6s  %6d", rows[0].bytes, rows[0].count,
           bench_dtype_short[o->dtype], bench_op_label(o), bench_root_label(o));
    for (k = 0; k < npl; k++) {
        bench_fmt_time(t, sizeof t, rows[k].time_us);
        if (rows[k].wrong >= 0) snprintf(nw, sizeof nw, "%5ld", rows[k].wrong);
        else snprintf(nw, sizeof nw, "%5s", "N/A");
        printf("  %7s  %6.2f  %6.2f  %5s", t, rows[k].algbw, rows[k].busbw, nw);
    }
    for (k = 0; k < npl; k++) {
        a[0] = b2[0] = 0;
        if (rows[k].bytes <= BENCH_LAT_MAX_BYTES) {
            bench_fmt_time(a, sizeof a, rows[k].p50_us);
            bench_fmt_time(b2, sizeof b2, rows[k].p99_us);
        }
        printf("  %7s  %7s", a, b2);
    }
    printf("\n");
    fflush(stdout);
}

static int bench_call(bench_backend_t *b, const bench_opts_t *o, const void *s, void *r,
                      size_t count, char *err, size_t errcap) {
    if (b->coll) return b->coll(b->ctx, o->coll, s, r, count, o->dtype, o->op, o->root, err, errcap);
    if (b->allreduce && o->coll == BENCH_ALL_REDUCE)
        return b->allreduce(b->ctx, s, r, count, o->dtype, o->op, err, errcap);
    snprintf(err, errcap, "%s does not implement %s", b->name, bench_colls[o->coll].name);
    return 1;
}

static void bench_write_json(const bench_opts_t *o, const bench_backend_t *b,
                             bench_row_t (*rows)[2], int npl, const int *pl, double rss,
                             long total_wrong, double avg_bus) {
    FILE *f = fopen(o->json, "w");
    int s, k, first = 1;
    if (!f) { fprintf(stderr, "cannot write %s: %s\n", o->json, strerror(errno)); return; }
    bench_json_head(f, o, b, "sweep");
    fprintf(f, ",\n  \"placements\": [");
    for (k = 0; k < npl; k++) fprintf(f, "%s\"%s\"", k ? ", " : "", pl[k] ? "in-place" : "out-of-place");
    fprintf(f, "],\n  \"peak_rss_kib\": %.0f,\n  \"wrong\": %ld,\n  \"avg_busbw_GBs\": %.6f,"
               "\n  \"results\": [\n", rss, total_wrong, avg_bus);
    for (s = 0; s < o->nsizes; s++) {
        for (k = 0; k < npl; k++) {
            const bench_row_t *r = &rows[s][k];
            if (!r->done) continue;
            fprintf(f, "%s    {\"placement\": \"%s\", \"inplace\": %d, \"bytes\": %zu, "
                       "\"count\": %zu, \"iters\": %d, \"time_us\": %.3f, \"algbw_GBs\": %.6f, "
                       "\"busbw_GBs\": %.6f, \"p50_us\": %.3f, \"p99_us\": %.3f, \"min_us\": %.3f, "
                       "\"max_us\": %.3f, \"cpu_cores\": %.3f, \"user_cores\": %.3f, "
                       "\"sys_cores\": %.3f, \"wrong\": %ld}",
                    first ? "" : ",\n", r->inplace ? "in-place" : "out-of-place", r->inplace,
                    r->bytes, r->count, r->iters, r->time_us, r->algbw, r->busbw, r->p50_us,
                    r->p99_us, r->min_us, r->max_us, r->cpu_cores, r->user_cores, r->sys_cores,
                    r->wrong);
            first = 0;
        }
    }
    fprintf(f, "\n  ]\n}\n");
    if (fclose(f) != 0) fprintf(stderr, "cannot write %s: %s\n", o->json, strerror(errno));
}

/* -F: the rows as CSV, one line per size and placement. */
static void bench_write_csv(const bench_opts_t *o, bench_row_t (*rows)[2], int npl) {
    FILE *f = fopen(o->csv, "w");
    int s, k;
    if (!f) { fprintf(stderr, "cannot write %s: %s\n", o->csv, strerror(errno)); return; }
    fprintf(f, "size,count,type,redop,root,placement,time_us,algbw_GBs,busbw_GBs,wrong,p50_us,p99_us\n");
    for (s = 0; s < o->nsizes; s++)
        for (k = 0; k < npl; k++) {
            const bench_row_t *r = &rows[s][k];
            if (!r->done) continue;
            fprintf(f, "%zu,%zu,%s,%s,%d,%s,%.3f,%.6f,%.6f,%ld,%.3f,%.3f\n", r->bytes, r->count,
                    bench_dtype_short[o->dtype], bench_op_label(o), bench_root_label(o),
                    r->inplace ? "in-place" : "out-of-place", r->time_us, r->algbw, r->busbw,
                    r->wrong, r->p50_us, r->p99_us);
        }
    if (fclose(f) != 0) fprintf(stderr, "cannot write %s: %s\n", o->csv, strerror(errno));
}

/* One size, one placement: check, warm up, time. 0 on success, else err is filled. */
static int bench_one(const bench_opts_t *o, bench_backend_t *b, size_t req_bytes, int inplace,
                     unsigned char *sendbuf, unsigned char *recvbuf, double *lat,
                     double *lat_sorted, bench_row_t *row, char *err, size_t errcap) {
    const size_t es = bench_dtype_bytes[o->dtype];
    const int p = b->nranks, me = b->rank;
    bench_geom_t g = bench_geometry(o->coll, req_bytes, es, p, me, o->root);
    unsigned char *sp, *rp;
    int it, c, a, iters = o->iters;
    double t0, tw, sum = 0, u0, s0, u1, s1, stat[7], w[4], mine;
    long wrong = 0;
    bench_pointers(o->coll, inplace, sendbuf, recvbuf, g.count, es, me, &sp, &rp);
    memset(row, 0, sizeof *row);
    row->bytes = g.total * es;
    row->count = g.count;
    row->inplace = inplace;
    for (c = 0; c < o->check; c++) {
        const unsigned char *res = rp;
        int failed;
        bench_fill(o, &g, me, p, sp, rp, es);
        b->checking = 1;
        failed = bench_call(b, o, sp, rp, g.count, err, errcap);
        b->checking = 0;
        if (failed) return 1;
        if (o->coll == BENCH_REDUCE_SCATTER && inplace && b->rs_inplace_result_at_start) res = sp;
        if (o->corrupt && me == bench_corrupt_rank(o) && g.out_elems)
            bench_corrupt((void *)res, g.out_elems / 2, o->dtype);
        wrong += bench_verify(o, &g, me, p, res);
    }
    /* zeros for the timed calls: repeated in-place sums and products stay finite */
    memset(sendbuf, 0, g.total * es);
    memset(recvbuf, 0, g.total * es);
    tw = bench_now_s();
    for (it = 0; it < o->warmup; it++)
        if (bench_call(b, o, sp, rp, g.count, err, errcap)) return 1;
    tw = bench_now_s() - tw;
    if (o->target_s > 0 && o->warmup > 0) {
        double per = tw / o->warmup * o->agg_iters;   /* one timed iteration */
        int want = per > 0 ? (int)ceil(o->target_s / per) : iters;
        if (want < 10) want = 10;
        if (want < iters) iters = want;
        /* every rank must make the same number of calls: rank 0's choice wins */
        if (b->bcast_int(b->ctx, &iters)) { snprintf(err, errcap, "bcast failed"); return 1; }
    }
    if (b->barrier(b->ctx)) { snprintf(err, errcap, "barrier failed"); return 1; }
    bench_cpu_s(&u0, &s0);
    t0 = bench_now_s();
    for (it = 0; it < iters; it++) {
        double t1;
        if (o->touch && g.in_elems) {
            memset(sp, 0, g.in_elems * es);
            if (b->barrier(b->ctx)) { snprintf(err, errcap, "barrier failed"); return 1; }
            t0 = bench_now_s();
        }
        for (a = 0; a < o->agg_iters; a++)
            if (bench_call(b, o, sp, rp, g.count, err, errcap)) return 1;
        t1 = bench_now_s();
        lat[it] = (t1 - t0) / o->agg_iters;   /* per call */
        sum += lat[it];
        t0 = t1;
    }
    bench_cpu_s(&u1, &s1);
    memcpy(lat_sorted, lat, (size_t)iters * sizeof *lat);
    qsort(lat_sorted, (size_t)iters, sizeof *lat_sorted, bench_cmp_double);
    mine = stat[0] = sum / iters;
    stat[1] = bench_pct(lat_sorted, iters, 0.50);
    stat[2] = bench_pct(lat_sorted, iters, 0.99);
    stat[3] = u1 - u0;
    stat[4] = s1 - s0;
    stat[5] = sum;
    stat[6] = (double)wrong;
    if (b->reduce_doubles(b->ctx, stat, 7, BENCH_SUM)) { snprintf(err, errcap, "stats reduce failed"); return 1; }
    w[0] = lat_sorted[iters - 1];
    w[1] = -lat_sorted[0];
    w[2] = mine;
    w[3] = -mine;
    if (b->reduce_doubles(b->ctx, w, 4, BENCH_MAX)) { snprintf(err, errcap, "stats reduce failed"); return 1; }
    row->wrong = o->check ? (long)stat[6] : -1;
    row->max_us = w[0] * 1e6;
    row->min_us = -w[1] * 1e6;
    row->iters = iters;
    /* -a, as nccl-tests: rank 0's own (the rank that prints), the mean, min or max over ranks */
    row->time_us = (o->average == 0 ? mine : o->average == 2 ? -w[3] : o->average == 3 ? w[2]
                                           : stat[0] / p) * 1e6;
    row->p50_us = stat[1] / p * 1e6;
    row->p99_us = stat[2] / p * 1e6;
    if (stat[5] > 0) {
        row->user_cores = stat[3] / (stat[5] / p);
        row->sys_cores = stat[4] / (stat[5] / p);
        row->cpu_cores = row->user_cores + row->sys_cores;
    }
    row->algbw = row->time_us > 0 ? (double)row->bytes / (row->time_us * 1e-6) / 1e9 : 0;
    row->busbw = row->algbw * bench_busbw_factor(o->coll, p);
    row->done = 1;
    return 0;
}

/* The size sweep. Returns 0 when every call succeeded and every check passed. */
static int bench_main_sweep(const bench_opts_t *o, bench_backend_t *b) {
    const int me = b->rank;
    unsigned char *sendbuf = NULL, *recvbuf = NULL;
    double *lat = NULL, *lat_sorted = NULL;
    bench_row_t (*rows)[2] = NULL;
    size_t cap = o->maxbytes ? o->maxbytes : 64;
    long total_wrong = 0;
    int s, k, rc = 0, pl[2], npl = 0, nbus = 0, nbig = 0;
    double bus_sum = 0, big_sum = 0;
    char err[1024];

    if (o->inplace != 1) pl[npl++] = 0;
    if (o->inplace != 0 && bench_colls[o->coll].inplace_ok) pl[npl++] = 1;
    if (b->supports && !b->supports(o->coll, o->dtype, o->op)) {
        if (me == 0) fprintf(stderr, "%s: %s with dtype %s / op %s is not supported\n", b->name,
                             bench_colls[o->coll].name, bench_dtype_short[o->dtype], bench_op_names[o->op]);
        return 1;
    }
    if (bench_colls[o->coll].has_root && o->root >= b->nranks) {
        if (me == 0) fprintf(stderr, "%s: root %d >= nranks %d\n", b->name, o->root, b->nranks);
        return 1;
    }
    if (b->alloc) {
        sendbuf = (unsigned char *)b->alloc(b->ctx, cap);
        recvbuf = (unsigned char *)b->alloc(b->ctx, cap);
    } else if (posix_memalign((void **)&sendbuf, 4096, cap) != 0 ||
               posix_memalign((void **)&recvbuf, 4096, cap) != 0) {
        sendbuf = recvbuf = NULL;
    }
    if (!sendbuf || !recvbuf ||
        !(lat = (double *)malloc((size_t)o->iters * sizeof *lat)) ||
        !(lat_sorted = (double *)malloc((size_t)o->iters * sizeof *lat)) ||
        !(rows = (bench_row_t (*)[2])calloc((size_t)o->nsizes, sizeof *rows))) {
        fprintf(stderr, "rank %d: out of memory for %zu-byte buffers\n", me, cap);
        rc = 1;
        goto out;
    }
    memset(sendbuf, 0, cap);   /* touch every page before timing */
    memset(recvbuf, 0, cap);
    if (b->buffers) b->buffers(b->ctx, sendbuf, recvbuf, cap);
    if (me == 0) bench_header(o, b, pl, npl);
    for (s = 0; s < o->nsizes; s++) {
        for (k = 0; k < npl; k++) {
            if (bench_one(o, b, o->sizes[s], pl[k], sendbuf, recvbuf, lat, lat_sorted, &rows[s][k],
                          err, sizeof err)) {
                fprintf(stderr, "rank %d: %s %s of %zu bytes (%s) failed: %s\n", me, b->name,
                        bench_colls[o->coll].name, o->sizes[s], pl[k] ? "in-place" : "out-of-place", err);
                rc = 1;
                goto out;
            }
            if (rows[s][k].wrong > 0) total_wrong += rows[s][k].wrong;
            bus_sum += rows[s][k].busbw;
            nbus++;
            if (rows[s][k].bytes >= (64u << 10)) { big_sum += rows[s][k].busbw; nbig++; }
        }
        if (me == 0) bench_print_row(o, rows[s], npl);
    }
    {
        double rss = (double)bench_peak_rss_kib();
        if (b->reduce_doubles(b->ctx, &rss, 1, BENCH_MAX)) { rc = 1; goto out; }
        if (me == 0) {
            /* nccl-tests counts failed checks here; we count wrong elements (both are 0 exactly
             * when every check passed). Its average is over every row and placement. */
            if (o->check)
                printf("# Out of bounds values : %ld %s\n", total_wrong, total_wrong ? "FAILED" : "OK");
            else
                printf("# Out of bounds values : N/A (not checked: -c 0)\n");
            printf("# Avg bus bandwidth    : %g\n", nbus ? bus_sum / nbus : 0.0);
            if (nbig) printf("# Avg bus bandwidth, sizes >= 64 KiB : %g\n", big_sum / nbig);
            printf("# Peak RSS (max over ranks) : %.1f MiB (buffers: %.1f MiB per rank)\n#\n",
                   rss / 1024.0, (double)cap * 2 / 1048576.0);
            fflush(stdout);
            if (o->json) bench_write_json(o, b, rows, npl, pl, rss, total_wrong, nbus ? bus_sum / nbus : 0.0);
            if (o->csv) bench_write_csv(o, rows, npl);
        }
        if (total_wrong) rc = 1;
    }
out:
    free(rows);
    free(lat);
    free(lat_sorted);
    if (b->alloc) {
        if (recvbuf) b->release(b->ctx, recvbuf);
        if (sendbuf) b->release(b->ctx, sendbuf);
    } else {
        free(sendbuf);
        free(recvbuf);
    }
    return rc;
}

/* --mem: one in-place all-reduce of o->maxbytes; peak RSS minus the buffer. */
static int bench_main_mem(const bench_opts_t *o, bench_backend_t *b) {
    const size_t es = bench_dtype_bytes[o->dtype];
    size_t count = o->maxbytes / es, bytes = count * es, i;
    unsigned char *buf = NULL;
    double v[4], t;
    long base_cur = bench_cur_rss_kib();
    char err[1024];
    int rc = 0;
    if (b->supports && !b->supports(o->coll, o->dtype, o->op)) return 1;
    if (posix_memalign((void **)&buf, 4096, bytes ? bytes : 64) != 0) {
        fprintf(stderr, "rank %d: cannot allocate %zu bytes\n", b->rank, bytes);
        return 1;
    }
    for (i = 0; i < count; i++) bench_set(buf, i, o->dtype, bench_value(o->op, b->rank, i, b->nranks));
    if (b->barrier(b->ctx)) { free(buf); return 1; }
    t = bench_now_s();
    if (bench_call(b, o, buf, buf, count, err, sizeof err)) {
        fprintf(stderr, "rank %d: %s all_reduce of %zu bytes failed: %s\n", b->rank, b->name, bytes, err);
        free(buf);
        return 1;
    }
    t = bench_now_s() - t;
    {
        bench_geom_t g = bench_geometry(BENCH_ALL_REDUCE, bytes, es, b->nranks, b->rank, 0);
        v[3] = (double)bench_verify(o, &g, b->rank, b->nranks, buf);
    }
    v[0] = (double)bench_peak_rss_kib();
    v[1] = (double)base_cur;
    v[2] = t;
    if (b->reduce_doubles(b->ctx, v, 4, BENCH_MAX)) rc = 1;
    if (b->rank == 0) {
        double buf_mib = (double)bytes / 1048576.0, peak = v[0] / 1024.0, extra = peak - buf_mib;
        printf("# %s all_reduce memory: nranks %d, %zu bytes (%.0f MiB) %s in place, one buffer\n",
               b->name, b->nranks, bytes, buf_mib, bench_dtype_short[o->dtype]);
        printf("# %s\n", b->description);
        printf("  time %.3f s (slowest rank), check of every element: %s\n", v[2], v[3] ? "FAILED" : "OK");
        printf("  RSS before the buffer  : %8.1f MiB (max over ranks)\n", v[1] / 1024.0);
        printf("  peak RSS               : %8.1f MiB (max over ranks, getrusage ru_maxrss)\n", peak);
        printf("  peak RSS - buffer      : %8.1f MiB  (target <= 32 MiB: %s)\n", extra,
               extra <= 32.0 ? "met" : "NOT met");
        printf("  peak - buffer - before : %8.1f MiB  (what the all-reduce itself added)\n",
               extra - v[1] / 1024.0);
        if (o->json) {
            FILE *f = fopen(o->json, "w");
            if (!f) { fprintf(stderr, "cannot write %s: %s\n", o->json, strerror(errno)); rc = 1; }
            else {
                bench_json_head(f, o, b, "memory");
                fprintf(f, ",\n  \"inplace\": 1,\n  \"bytes\": %zu,\n  \"time_s\": %.6f,"
                           "\n  \"rss_before_kib\": %.0f,\n  \"peak_rss_kib\": %.0f,"
                           "\n  \"peak_minus_buffer_mib\": %.3f,\n  \"target_met\": %s,"
                           "\n  \"wrong\": %.0f\n}\n",
                        bytes, v[2], v[1], v[0], extra, extra <= 32.0 ? "true" : "false", v[3]);
                fclose(f);
            }
        }
    }
    if (v[3]) rc = 1;
    free(buf);
    return rc;
}

#endif /* BENCH_COMMON_H */
