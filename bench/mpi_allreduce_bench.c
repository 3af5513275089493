/* SPDX-License-Identifier: MIT (see LICENSE) */
/* bench/mpi_allreduce_bench.c — the same sweep, method, rows and JSON as ddp_bench.c (ddp-bench),
 * timing MPI's collectives instead of libddp's, so the two can be put side by side. (The name is
 * historical: it runs every collective ddp-bench does, -o all_reduce by default.)
 *
 *   mpicc -std=c99 -O2 -Wall -Wextra -Wpedantic bench/mpi_allreduce_bench.c \
 *         -o build/mpi_allreduce_bench -lm
 *   mpirun --allow-run-as-root --oversubscribe -np 2 --mca pml ob1 --mca btl self,tcp \
 *          --mca btl_tcp_if_include lo --mca mpi_yield_when_idle 1 \
 *          ./build/mpi_allreduce_bench -o all_reduce -b 8 -e 64M -f 2 -n 20 -w 5
 *
 *   all_reduce      MPI_Allreduce (in place: MPI_IN_PLACE)
 *   reduce_scatter  MPI_Reduce_scatter_block (in place: MPI_IN_PLACE; MPI leaves the result at the
 *                   start of the buffer, not at rank * recvcount as NCCL; the check knows)
 *   all_gather      MPI_Allgather (in place: MPI_IN_PLACE, data at rank * sendcount, as NCCL)
 *   broadcast       MPI_Bcast, which is in place by nature: out of place, the root first copies
 *                   send to recv (what ncclBroadcast and ddp_broadcast do for the root too)
 *   reduce          MPI_Reduce (in place: MPI_IN_PLACE on the root; the other ranks pass their
 *                   send buffer, MPI allows MPI_IN_PLACE only on the root)
 *   gather          MPI_Gather (in place: MPI_IN_PLACE on the root, its block at root * sendcount
 *                   of recv as NCCL)
 *   scatter         MPI_Scatter (in place: MPI_IN_PLACE as the root's recv, its block staying at
 *                   root * recvcount of send as NCCL)
 *   all_to_all      MPI_Alltoall (out of place only, as ddp-bench)
 *   sendrecv        MPI_Sendrecv to rank + 1, from rank - 1 (out of place only, as ddp-bench)
 *
 * Options: ddp-bench's (--help). The rank count comes from mpirun (-N and --transport are
 * ignored); -T has no MPI equivalent and is refused. half/bfloat16 and avg have no MPI equivalent
 * and are refused.
 */
#define _GNU_SOURCE
#include <mpi.h>

#include "bench_common.h"

static MPI_Datatype mpib_type(int dtype) {
    switch (dtype) {
    case BENCH_INT8: return MPI_INT8_T;
    case BENCH_UINT8: return MPI_UINT8_T;
    case BENCH_INT32: return MPI_INT32_T;
    case BENCH_UINT32: return MPI_UINT32_T;
    case BENCH_INT64: return MPI_INT64_T;
    case BENCH_UINT64: return MPI_UINT64_T;
    case BENCH_FLOAT32: return MPI_FLOAT;
    case BENCH_FLOAT64: return MPI_DOUBLE;
    default: return MPI_DATATYPE_NULL;
    }
}

static MPI_Op mpib_op(int op) {
    switch (op) {
    case BENCH_SUM: return MPI_SUM;
    case BENCH_PROD: return MPI_PROD;
    case BENCH_MAX: return MPI_MAX;
    case BENCH_MIN: return MPI_MIN;
    default: return MPI_OP_NULL;
    }
}

static int mpib_supports(int coll, int dtype, int op) {
    if (mpib_type(dtype) == MPI_DATATYPE_NULL) return 0;
    return !bench_colls[coll].has_op || mpib_op(op) != MPI_OP_NULL;
}

static int mpib_coll(void *ctx, int coll, const void *s, void *r, size_t count, int dtype, int op,
                     int root, char *err, size_t errcap) {
    int rc = MPI_SUCCESS, len = 0, me = 0, n = (int)count;
    char msg[MPI_MAX_ERROR_STRING];
    MPI_Datatype t = mpib_type(dtype);
    (void)ctx;
    if (count > 0x7fffffff) { snprintf(err, errcap, "count %zu > INT_MAX", count); return 1; }
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    switch (coll) {
    case BENCH_ALL_REDUCE:
        rc = MPI_Allreduce(s == r ? MPI_IN_PLACE : s, r, n, t, mpib_op(op), MPI_COMM_WORLD);
        break;
    case BENCH_REDUCE_SCATTER: {
        /* NCCL's in place: recv == send + rank * recvcount; MPI's: the whole input in recv */
        size_t es = bench_dtype_bytes[dtype];
        if ((const unsigned char *)s + (size_t)me * count * es == (unsigned char *)r)
            rc = MPI_Reduce_scatter_block(MPI_IN_PLACE, (void *)s, n, t, mpib_op(op), MPI_COMM_WORLD);
        else
            rc = MPI_Reduce_scatter_block(s, r, n, t, mpib_op(op), MPI_COMM_WORLD);
        break;
    }
    case BENCH_ALL_GATHER: {
        size_t es = bench_dtype_bytes[dtype];
        if ((const unsigned char *)r + (size_t)me * count * es == (const unsigned char *)s)
            rc = MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, r, n, t, MPI_COMM_WORLD);
        else
            rc = MPI_Allgather(s, n, t, r, n, t, MPI_COMM_WORLD);
        break;
    }
    case BENCH_BROADCAST:
        if (me == root && s != r) memcpy(r, s, count * bench_dtype_bytes[dtype]);
        rc = MPI_Bcast(r, n, t, root, MPI_COMM_WORLD);
        break;
    case BENCH_REDUCE:
        rc = MPI_Reduce(me == root && s == r ? MPI_IN_PLACE : s, r, n, t, mpib_op(op), root,
                        MPI_COMM_WORLD);
        break;
    case BENCH_GATHER: {
        size_t es = bench_dtype_bytes[dtype];
        if (me == root && (const unsigned char *)r + (size_t)me * count * es == (const unsigned char *)s)
            rc = MPI_Gather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, r, n, t, root, MPI_COMM_WORLD);
        else
            rc = MPI_Gather(s, n, t, r, n, t, root, MPI_COMM_WORLD);
        break;
    }
    case BENCH_SCATTER: {
        size_t es = bench_dtype_bytes[dtype];
        if (me == root && (const unsigned char *)s + (size_t)me * count * es == (unsigned char *)r)
            rc = MPI_Scatter(s, n, t, MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, root, MPI_COMM_WORLD);
        else
            rc = MPI_Scatter(s, n, t, r, n, t, root, MPI_COMM_WORLD);
        break;
    }
    case BENCH_ALL_TO_ALL:
        rc = MPI_Alltoall(s, n, t, r, n, t, MPI_COMM_WORLD);
        break;
    case BENCH_SENDRECV: {
        int p = 1;
        MPI_Comm_size(MPI_COMM_WORLD, &p);
        rc = MPI_Sendrecv(s, n, t, (me + 1) % p, 0, r, n, t, (me + p - 1) % p, 0, MPI_COMM_WORLD,
                          MPI_STATUS_IGNORE);
        break;
    }
    default:
        snprintf(err, errcap, "collective %d not implemented", coll);
        return 1;
    }
    if (rc == MPI_SUCCESS) return 0;
    MPI_Error_string(rc, msg, &len);
    snprintf(err, errcap, "MPI %s: %s", bench_colls[coll].name, msg);
    return 1;
}

static int mpib_barrier(void *ctx) { (void)ctx; return MPI_Barrier(MPI_COMM_WORLD) != MPI_SUCCESS; }

static int mpib_reduce_doubles(void *ctx, double *v, int n, int op) {
    (void)ctx;
    return MPI_Allreduce(MPI_IN_PLACE, v, n, MPI_DOUBLE, op == BENCH_MAX ? MPI_MAX : MPI_SUM,
                         MPI_COMM_WORLD) != MPI_SUCCESS;
}

static int mpib_bcast_int(void *ctx, int *v) {
    (void)ctx;
    return MPI_Bcast(v, 1, MPI_INT, 0, MPI_COMM_WORLD) != MPI_SUCCESS;
}

int main(int argc, char **argv) {
    bench_opts_t o;
    bench_backend_t b;
    char descr[MPI_MAX_LIBRARY_VERSION_STRING + 64], ver[MPI_MAX_LIBRARY_VERSION_STRING];
    int rc, len = 0;
    const char *version = "mpi_allreduce_bench (the MPI peer of libddp's ddp-bench)";
    char *nl;
    MPI_Init(&argc, &argv);
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    memset(&b, 0, sizeof b);
    MPI_Comm_rank(MPI_COMM_WORLD, &b.rank);
    MPI_Comm_size(MPI_COMM_WORLD, &b.nranks);
    if ((rc = bench_parse_args(argc, argv, &o, 0, version)) >= 0) { MPI_Finalize(); return rc; }
    if (o.timeout_s) {
        if (b.rank == 0) fprintf(stderr, "%s: -T: MPI has no timeout for a collective\n", argv[0]);
        MPI_Finalize();
        return 2;
    }
    MPI_Get_library_version(ver, &len);
    if ((nl = strchr(ver, '\n'))) *nl = 0;
    if ((nl = strchr(ver, ','))) *nl = 0;
    snprintf(descr, sizeof descr, "MPI, %s", ver);
    b.name = "mpi";
    b.transport = "mpi";
    b.description = descr;
    b.coll = mpib_coll;
    b.rs_inplace_result_at_start = 1;
    b.barrier = mpib_barrier;
    b.reduce_doubles = mpib_reduce_doubles;
    b.bcast_int = mpib_bcast_int;
    b.supports = mpib_supports;
    rc = o.mem_mode ? bench_main_mem(&o, &b) : bench_main_sweep(&o, &b);
    MPI_Finalize();
    return rc;
}
