/* SPDX-License-Identifier: MIT (see LICENSE) */
/* bench/gloo_bench.cc — the Gloo peer of ddp-bench (bench/ddp_bench.c) and mpi_allreduce_bench:
 * the same sweep, method, rows and JSON (bench/bench_common.h, which compiles as C++ too), timing
 * Gloo's collectives over Gloo's TCP transport, so compare.sh can put the three side by side.
 *
 *   apt-get install -y libgloo-dev          # Debian 12: Gloo git 2022-05-18 (5b14351), "0.5.0"
 *   g++ -std=c++17 -O2 -Wall -Wextra bench/gloo_bench.cc -o build/gloo_bench -lgloo -pthread -lm
 *   ./build/gloo_bench -N 4 -b 8 -e 64M -f 2 -n 20 -w 5 --inplace 1   # forks 4 ranks on this host
 *   ./build/gloo_bench -N 2 -s 8,64K,1M,16M,64M -A AllreduceHalvingDoubling
 *   build/ddprun -n 2 ./build/gloo_bench -b 8 -e 64M               # one rank per process
 *
 * libgloo-dev ships no pkg-config file (only CMake's Gloo::gloo target, which adds nothing but
 * the include directory): link -lgloo, plus -pthread for the transport's event-loop thread.
 * Flags: ddp-bench's (--help), plus -A; --transport accepts only tcp (the one transport used
 * here); -T sets GLOO_BENCH_TIMEOUT_MS.
 *
 * WHAT IS TIMED: all_reduce (default), all_gather and broadcast with Gloo's collective API
 * (gloo/allreduce.h, allgather.h, broadcast.h: the API PyTorch's ProcessGroupGloo uses), options
 * built per call as a caller does (UnboundBuffers wrap the caller's memory: no registration, no
 * copy). reduce_scatter: this Gloo has only the ReduceScatterHalvingDoubling class, not offered.
 * For all_reduce, -A picks the algorithm:
 *   allreduce (default)  gloo::allreduce with the algorithm unspecified, which is the RING in this
 *                        Gloo (allreduce.cc: case UNSPECIFIED: case RING: ring(...)): a
 *                        reduce-scatter then an all-gather around the ring, each rank's chunk cut
 *                        into segments of at most 1 MiB (kMaxSegmentSize), two in flight.
 *   allreduce:ring       the same with AllreduceOptions::Algorithm::RING set explicitly
 *   allreduce:bcube      the same API with Algorithm::BCUBE
 *   AllreduceRing  AllreduceRingChunked  AllreduceHalvingDoubling  AllreduceBcube
 *                        the older class-per-algorithm API (gloo/allreduce_*.h templates): one
 *                        object per size, built at the first call (it registers send/recv buffers
 *                        with the pairs), run() timed. In place only (--inplace 1), int counts;
 *                        AllreduceBcube only for power-of-2 worlds (it returns wrong sums for 3).
 * Rendezvous: gloo::rendezvous::FileStore (this Gloo has no TCPStore; HashStore is in-process,
 * RedisStore needs a server) under a PrefixStore, then Context::connectFullMesh. Transport:
 * gloo::transport::tcp::CreateDevice on 127.0.0.1. Gloo reports failures by throwing.
 *
 * RANKS: without a launcher's variables the program forks -N ranks, each with a FileStore in a
 * fresh mkdtemp directory that the parent removes afterwards. With RANK+WORLD_SIZE (torchrun,
 * ddprun), OMPI_COMM_WORLD_RANK+SIZE (mpirun) or PMI_RANK+SIZE it is one rank: the store is the
 * directory $GLOO_STORE_DIR (default /tmp/gloo_bench_store; every rank must see it, so a
 * multi-host job needs a shared file system), keys prefixed by the job (DDP_JOB_SECRET,
 * TORCHELASTIC_RUN_ID or OMPI_MCA_ess_base_jobid, and MASTER_PORT); each rank deletes its keys at
 * the end. The device binds $GLOO_SOCKET_IFNAME if set, else 127.0.0.1 when every rank is on this
 * host (LOCAL_WORLD_SIZE or OMPI_COMM_WORLD_LOCAL_SIZE equals the world, or is unset), else this
 * host's name. GLOO_BENCH_TIMEOUT_MS: every Gloo wait (default 120000).
 * Gloo has no bfloat16 and no avg: those are refused.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/allreduce_bcube.h>
#include <gloo/allreduce_halving_doubling.h>
#include <gloo/allreduce_ring.h>
#include <gloo/allreduce_ring_chunked.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/config.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/types.h>

#include <chrono>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include <dirent.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include "bench_common.h"

namespace {

enum Algo { A_ALLREDUCE, A_ALLREDUCE_RING, A_ALLREDUCE_BCUBE, A_CLASS_RING, A_CLASS_RING_CHUNKED,
            A_CLASS_HALVING_DOUBLING, A_CLASS_BCUBE, NUM_ALGOS };
const char *const algo_names[NUM_ALGOS] = {"allreduce", "allreduce:ring", "allreduce:bcube",
    "AllreduceRing", "AllreduceRingChunked", "AllreduceHalvingDoubling", "AllreduceBcube"};
const char *const algo_descr[NUM_ALGOS] = {
    "gloo::allreduce (algorithm unspecified = ring)", "gloo::allreduce (algorithm RING)",
    "gloo::allreduce (algorithm BCUBE)", "gloo::AllreduceRing<T>", "gloo::AllreduceRingChunked<T>",
    "gloo::AllreduceHalvingDoubling<T>", "gloo::AllreduceBcube<T>"};

struct Rank {
    std::shared_ptr<gloo::rendezvous::Context> ctx;
    int rank = 0, nranks = 1, algo = A_ALLREDUCE;
    /* the class-API algorithm for the buffer last seen (rebuilt when any of these change) */
    std::unique_ptr<gloo::Algorithm> cls;
    void *cls_ptr = nullptr;
    size_t cls_count = 0;
    int cls_dtype = -1, cls_op = -1;
};

using ReduceFn = void (*)(void *, const void *, const void *, size_t);

template <typename T> ReduceFn reduce_fn(int op) {
    switch (op) {
    case BENCH_PROD: return &gloo::product<T>;
    case BENCH_MAX: return &gloo::max<T>;
    case BENCH_MIN: return &gloo::min<T>;
    default: return &gloo::sum<T>;
    }
}

template <typename T> const gloo::ReductionFunction<T> *class_fn(int op) {
    switch (op) {
    case BENCH_PROD: return gloo::ReductionFunction<T>::product;
    case BENCH_MAX: return gloo::ReductionFunction<T>::max;
    case BENCH_MIN: return gloo::ReductionFunction<T>::min;
    default: return gloo::ReductionFunction<T>::sum;
    }
}

template <typename T> T *mut(const void *p) { return const_cast<T *>(static_cast<const T *>(p)); }

template <typename T>
void allreduce_api(Rank &r, const void *send, void *recv, size_t count, int op, int algo) {
    gloo::AllreduceOptions opts(r.ctx);
    if (send != recv) opts.setInput(mut<T>(send), count);   /* else the output is the input */
    opts.setOutput(static_cast<T *>(recv), count);
    opts.setReduceFunction(reduce_fn<T>(op));
    if (algo == A_ALLREDUCE_RING) opts.setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);
    if (algo == A_ALLREDUCE_BCUBE) opts.setAlgorithm(gloo::AllreduceOptions::Algorithm::BCUBE);
    gloo::allreduce(opts);
}

template <typename T> std::unique_ptr<gloo::Algorithm> make_class(Rank &r, void *buf, size_t count, int op) {
    std::vector<T *> ptrs(1, static_cast<T *>(buf));
    const int n = (int)count;
    switch (r.algo) {
    case A_CLASS_RING: return std::make_unique<gloo::AllreduceRing<T>>(r.ctx, ptrs, n, class_fn<T>(op));
    case A_CLASS_RING_CHUNKED:
        return std::make_unique<gloo::AllreduceRingChunked<T>>(r.ctx, ptrs, n, class_fn<T>(op));
    case A_CLASS_HALVING_DOUBLING:
        return std::make_unique<gloo::AllreduceHalvingDoubling<T>>(r.ctx, ptrs, n, class_fn<T>(op));
    default: return std::make_unique<gloo::AllreduceBcube<T>>(r.ctx, ptrs, n, class_fn<T>(op));
    }
}

template <typename T>
void coll_typed(Rank &r, int coll, const void *send, void *recv, size_t count, int dtype, int op, int root) {
    switch (coll) {
    case BENCH_ALL_REDUCE:
        if (r.algo < A_CLASS_RING) { allreduce_api<T>(r, send, recv, count, op, r.algo); return; }
        if (!r.cls || r.cls_ptr != recv || r.cls_count != count || r.cls_dtype != dtype || r.cls_op != op) {
            r.cls.reset();
            r.cls = make_class<T>(r, recv, count, op);
            r.cls_ptr = recv;
            r.cls_count = count;
            r.cls_dtype = dtype;
            r.cls_op = op;
        }
        r.cls->run();
        return;
    case BENCH_ALL_GATHER: {
        gloo::AllgatherOptions opts(r.ctx);
        /* in place (send is this rank's block of recv): Gloo takes the output's block as input */
        if (send != static_cast<unsigned char *>(recv) + (size_t)r.rank * count * sizeof(T))
            opts.setInput(mut<T>(send), count);
        opts.setOutput(static_cast<T *>(recv), count * (size_t)r.nranks);
        gloo::allgather(opts);
        return;
    }
    case BENCH_BROADCAST: {
        gloo::BroadcastOptions opts(r.ctx);
        if (r.rank == root && send != recv) opts.setInput(mut<T>(send), count);
        opts.setOutput(static_cast<T *>(recv), count);
        opts.setRoot(root);
        gloo::broadcast(opts);
        return;
    }
    }
}

int gb_supports(int coll, int dtype, int op) {
    if (dtype == BENCH_BFLOAT16) return 0;
    if (coll == BENCH_ALL_REDUCE) return op != BENCH_AVG;
    return coll == BENCH_ALL_GATHER || coll == BENCH_BROADCAST;
}

int gb_coll(void *ctx, int coll, const void *send, void *recv, size_t count, int dtype, int op,
            int root, char *err, size_t errcap) {
    Rank &r = *static_cast<Rank *>(ctx);
    if (count == 0) return 0;   /* Gloo refuses 0 elements; there is nothing to do */
    if (coll == BENCH_ALL_REDUCE && r.algo >= A_CLASS_RING && count > 0x7fffffff) {
        snprintf(err, errcap, "count %zu > INT_MAX (the class API takes int)", count);
        return 1;
    }
    try {
        switch (dtype) {
        case BENCH_INT8: coll_typed<int8_t>(r, coll, send, recv, count, dtype, op, root); break;
        case BENCH_UINT8: coll_typed<uint8_t>(r, coll, send, recv, count, dtype, op, root); break;
        case BENCH_INT32: coll_typed<int32_t>(r, coll, send, recv, count, dtype, op, root); break;
        case BENCH_UINT32: coll_typed<uint32_t>(r, coll, send, recv, count, dtype, op, root); break;
        case BENCH_INT64: coll_typed<int64_t>(r, coll, send, recv, count, dtype, op, root); break;
        case BENCH_UINT64: coll_typed<uint64_t>(r, coll, send, recv, count, dtype, op, root); break;
        case BENCH_FLOAT16: coll_typed<gloo::float16>(r, coll, send, recv, count, dtype, op, root); break;
        case BENCH_FLOAT32: coll_typed<float>(r, coll, send, recv, count, dtype, op, root); break;
        case BENCH_FLOAT64: coll_typed<double>(r, coll, send, recv, count, dtype, op, root); break;
        default: snprintf(err, errcap, "dtype not supported by Gloo"); return 1;
        }
    } catch (const std::exception &e) {
        snprintf(err, errcap, "%s", e.what());
        return 1;
    }
    return 0;
}

/* The bookkeeping collectives (untimed): gloo::allreduce, broadcast, barrier. */
int gb_reduce_doubles(void *ctx, double *v, int n, int op) {
    Rank &r = *static_cast<Rank *>(ctx);
    try {
        allreduce_api<double>(r, v, v, (size_t)n, op, A_ALLREDUCE);
    } catch (const std::exception &e) {
        fprintf(stderr, "rank %d: gloo allreduce of statistics: %s\n", r.rank, e.what());
        return 1;
    }
    return 0;
}

int gb_bcast_int(void *ctx, int *v) {
    Rank &r = *static_cast<Rank *>(ctx);
    try {
        gloo::BroadcastOptions opts(r.ctx);
        opts.setOutput(v, 1);
        opts.setRoot(0);
        gloo::broadcast(opts);
    } catch (const std::exception &e) {
        fprintf(stderr, "rank %d: gloo broadcast: %s\n", r.rank, e.what());
        return 1;
    }
    return 0;
}

int gb_barrier(void *ctx) {
    Rank &r = *static_cast<Rank *>(ctx);
    try {
        gloo::BarrierOptions opts(r.ctx);
        gloo::barrier(opts);
    } catch (const std::exception &e) {
        fprintf(stderr, "rank %d: gloo barrier: %s\n", r.rank, e.what());
        return 1;
    }
    return 0;
}

const char *env_or(const char *name, const char *dflt) {
    const char *v = getenv(name);
    return v && *v ? v : dflt;
}

/* AllreduceBcube's steps assume nodes = base^k (base 2 here): with 3 ranks it returns wrong sums. */
bool world_ok(int algo, int nranks) {
    if (algo != A_CLASS_BCUBE || !(nranks & (nranks - 1))) return true;
    fprintf(stderr, "gloo_bench: AllreduceBcube needs a power-of-2 world, not %d ranks\n", nranks);
    return false;
}

/* store_dir: the FileStore directory; prefix: this job's keys; hostname: what the device binds. */
int run_rank(const bench_opts_t &o, int algo, int nranks, int rank, const std::string &store_dir,
             const std::string &prefix, const std::string &hostname, bool forked) {
    Rank r;
    r.rank = rank;
    r.nranks = nranks;
    r.algo = algo;
    gloo::rendezvous::FileStore file_store(store_dir);
    const char *ifname = forked ? nullptr : getenv("GLOO_SOCKET_IFNAME");
    try {
        gloo::transport::tcp::attr attr;
        if (ifname && *ifname) attr.iface = ifname;
        else attr.hostname = hostname;
        auto dev = gloo::transport::tcp::CreateDevice(attr);
        gloo::rendezvous::PrefixStore store(prefix, file_store);
        r.ctx = std::make_shared<gloo::rendezvous::Context>(rank, nranks);
        /* a crashed sibling should not keep the others waiting long, nor a slow size on a busy
         * 2-core machine be cut short: 120 s, as the libddp bench */
        r.ctx->setTimeout(std::chrono::milliseconds(atol(env_or("GLOO_BENCH_TIMEOUT_MS", "120000"))));
        r.ctx->connectFullMesh(store, dev);
    } catch (const std::exception &e) {
        fprintf(stderr, "rank %d: gloo rendezvous/connect failed: %s\n", rank, e.what());
        return 1;
    }
    char descr[512];
    snprintf(descr, sizeof descr, "Gloo %d.%d.%d, %s, tcp transport on %s, FileStore rendezvous, %s",
             GLOO_VERSION_MAJOR, GLOO_VERSION_MINOR, GLOO_VERSION_PATCH,
             o.coll == BENCH_ALL_REDUCE ? algo_descr[algo] : "gloo::allgather/broadcast",
             ifname && *ifname ? ifname : hostname.c_str(),
             forked ? "ranks forked by the bench (-p)" : "one rank per process (launcher environment)");
    bench_backend_t b;
    memset(&b, 0, sizeof b);
    b.name = "gloo";
    b.rank = rank;
    b.nranks = nranks;
    b.ctx = &r;
    b.coll = gb_coll;
    b.barrier = gb_barrier;
    b.reduce_doubles = gb_reduce_doubles;
    b.bcast_int = gb_bcast_int;
    b.supports = gb_supports;
    b.transport = "tcp";
    b.description = descr;
    int rc = o.mem_mode ? bench_main_mem(&o, &b) : bench_main_sweep(&o, &b);
    r.cls.reset();
    /* everyone is done with the store before anyone deletes its keys */
    if (gb_barrier(&r)) rc = 1;
    if (!forked)
        for (const std::string &path : file_store.getAllKeyFilePaths()) unlink(path.c_str());
    return rc;
}

void remove_dir(const std::string &dir) {   /* the fork mode's mkdtemp store: flat, ours */
    if (DIR *d = opendir(dir.c_str())) {
        while (struct dirent *e = readdir(d))
            if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
                unlink((dir + "/" + e->d_name).c_str());
        closedir(d);
    }
    rmdir(dir.c_str());
}

int env_int(const char *name, int *v) {
    const char *x = getenv(name);
    if (!x || !*x) return 0;
    *v = atoi(x);
    return 1;
}

}  // namespace

int main(int argc, char **argv) {
    bench_opts_t o;
    int algo = A_ALLREDUCE, algo_given = 0;
    /* -A is ours; everything else is bench_common.h's */
    std::vector<char *> args;
    for (int i = 0; i < argc; i++) {
        if (i > 0 && !strcmp(argv[i], "-A")) {
            if (i + 1 >= argc) { fprintf(stderr, "%s: -A needs a value\n", argv[0]); return 2; }
            algo = -1;
            for (int k = 0; k < NUM_ALGOS; k++) if (!strcasecmp(argv[i + 1], algo_names[k])) algo = k;
            if (algo < 0) { fprintf(stderr, "%s: bad value '%s' for -A\n", argv[0], argv[i + 1]); return 2; }
            algo_given = 1;
            i++;
            continue;
        }
        if (i > 0 && (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help"))) {
            bench_usage(stdout, argv[0], 1);
            printf(
                "  -A algorithm  all_reduce: allreduce (default: gloo::allreduce, which is a ring),\n"
                "                allreduce:ring, allreduce:bcube, or a class: AllreduceRing,\n"
                "                AllreduceRingChunked, AllreduceHalvingDoubling, AllreduceBcube (in place)\n"
                "  Gloo: --transport tcp only; no bfloat16, no avg, no reduce_scatter\n");
            return 0;
        }
        args.push_back(argv[i]);
    }
    args.push_back(nullptr);
    int prc = bench_parse_args((int)args.size() - 1, args.data(), &o, 1,
                               "gloo_bench (the Gloo peer of libddp's ddp-bench)");
    if (prc >= 0) return prc;
    o.argc = argc;   /* the JSON's "command": as typed, -A included */
    o.argv = argv;
    if (o.list_transports) { printf("tcp\n"); return 0; }
    if (o.timeout_s) setenv("GLOO_BENCH_TIMEOUT_MS", std::to_string(o.timeout_s * 1000L).c_str(), 1);
    if (o.transport && strcmp(o.transport, "tcp")) {
        fprintf(stderr, "gloo_bench: transport '%s': only tcp here (Gloo's tcp transport)\n", o.transport);
        return 2;
    }
    if (algo >= A_CLASS_RING) {
        if (o.inplace == 0) {
            fprintf(stderr, "gloo_bench: %s works in place only (--inplace 1)\n", algo_names[algo]);
            return 2;
        }
        o.inplace = 1;
    }
    if (algo_given && o.coll != BENCH_ALL_REDUCE) {
        fprintf(stderr, "gloo_bench: -A is for all_reduce\n");
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);   /* a dead peer shows up as an exception, not a signal */

    const char *launch[][2] = {{"RANK", "WORLD_SIZE"}, {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"},
                               {"PMI_RANK", "PMI_SIZE"}};
    for (const auto &k : launch) {
        int rank, size, local = -1;
        if (!env_int(k[0], &rank) || !env_int(k[1], &size)) continue;
        if (size < 1 || rank < 0 || rank >= size) {
            fprintf(stderr, "gloo_bench: %s=%d, %s=%d make no sense\n", k[0], rank, k[1], size);
            return 2;
        }
        if (!world_ok(algo, size)) return 2;
        std::string dir = env_or("GLOO_STORE_DIR", "/tmp/gloo_bench_store");
        if (mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
            fprintf(stderr, "gloo_bench: cannot create %s: %s\n", dir.c_str(), strerror(errno));
            return 1;
        }
        std::string prefix = std::string("gloo_bench/") +
            env_or("DDP_JOB_SECRET", env_or("TORCHELASTIC_RUN_ID", env_or("OMPI_MCA_ess_base_jobid", "job"))) +
            "/" + env_or("MASTER_PORT", "0");
        std::string host = "127.0.0.1";
        if ((env_int("LOCAL_WORLD_SIZE", &local) || env_int("OMPI_COMM_WORLD_LOCAL_SIZE", &local)) &&
            local != size) {
            char name[256] = "";
            gethostname(name, sizeof name - 1);
            host = name;
        }
        return run_rank(o, algo, size, rank, dir, prefix, host, false);
    }

    if (!world_ok(algo, o.nranks)) return 2;
    char tmpl[] = "/tmp/gloo_bench.XXXXXX";
    if (!mkdtemp(tmpl)) { perror("gloo_bench: mkdtemp"); return 1; }
    const std::string dir = tmpl;
    std::vector<pid_t> pids((size_t)o.nranks, 0);
    int failed = 0, started = 0;
    fflush(stdout);
    fflush(stderr);
    for (; started < o.nranks; started++) {
        pid_t pid = fork();
        if (pid < 0) { perror("fork"); failed = 1; break; }
        if (pid == 0) {
            int rc = run_rank(o, algo, o.nranks, started, dir, "gloo_bench", "127.0.0.1", true);
            fflush(stdout);
            fflush(stderr);
            _exit(rc);
        }
        pids[(size_t)started] = pid;
    }
    if (failed)   /* the ones started would only wait for ranks that never come */
        for (int j = 0; j < started; j++) kill(pids[(size_t)j], SIGTERM);
    for (int left = started; left > 0;) {
        int st;
        pid_t pid = wait(&st);
        if (pid < 0) { if (errno == EINTR) continue; break; }
        for (int k = 0; k < o.nranks; k++) {
            if (pids[(size_t)k] != pid) continue;
            pids[(size_t)k] = 0;
            left--;
            if (WIFEXITED(st) && WEXITSTATUS(st) == 0) continue;
            if (WIFSIGNALED(st)) fprintf(stderr, "gloo_bench: rank %d killed by signal %d\n", k, WTERMSIG(st));
            else fprintf(stderr, "gloo_bench: rank %d exited with status %d\n", k, WEXITSTATUS(st));
            if (!failed)   /* the survivors would only wait for their timeout */
                for (int j = 0; j < o.nranks; j++) if (pids[(size_t)j] > 0) kill(pids[(size_t)j], SIGTERM);
            failed = 1;
        }
    }
    remove_dir(dir);
    return failed;
}
