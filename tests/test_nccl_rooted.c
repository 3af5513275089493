/* SPDX-License-Identifier: MIT (see LICENSE) */
/* tests/test_nccl_rooted.c — reduce, gather, scatter and all-to-all on device buffers through the NCCL
 * transport, against the fake NCCL/CUDA runtime (tests/fake_nccl). Prints TAP.
 *
 * The case matrix of tests/test_rooted_collectives.c (included, unchanged): every dtype x op for
 * reduce (floating DDP_AVG within rounding: ncclAvg divides before summing), copies for
 * gather/scatter/all-to-all, roots 0 and p-1, in place (NCCL's layouts) and
 * out of place, counts {0, 1, 3, 1000} and 100003 for a subset, guard bytes, sendbuf unchanged,
 * non-roots' unused buffers NULL; each call made on device twins of its buffers
 * (tests/ddp_test_device.h) with DDP_NCCL=1, so NCCL (the fake) must run it. World sizes 1, 2, 3, 5 over
 * tcp, 4 over shm (the host transports only carry the rendezvous here). Its group, send/recv
 * and mismatch scenarios are host-only; test_nccl.c has the device ones. */
#define _GNU_SOURCE
#define DDP_IMPLEMENTATION
#include "ddp.h"
#include "transports/ddp_tcp.h"
#include "transports/ddp_shm.h"
#include "transports/ddp_nccl.h"
#include "tests/ddp_test.h"
#include "tests/ddp_test_device.h"

#define malloc t_dev_malloc
#define free t_dev_free
#define ddp_comm_init t_dev_comm_init
#define ddp_reduce t_dev_reduce
#define ddp_gather t_dev_gather
#define ddp_scatter t_dev_scatter
#define ddp_all_to_all t_dev_all_to_all
#define main test_rooted_collectives_main
#include "tests/test_rooted_collectives.c"
#undef main
#undef malloc
#undef free
#undef ddp_comm_init
#undef ddp_reduce
#undef ddp_gather
#undef ddp_scatter
#undef ddp_all_to_all

int main(void) {
    static const struct { const char *mode; int p; int big; } plan[] = {
        {"tcp", 1, 0}, {"tcp", 2, 1}, {"tcp", 3, 1}, {"tcp", 5, 0}, {"shm", 4, 0}};
    run_cfg_t runs[8];
    int nruns = 0, i;
    t_init();
    if (!t_dev_use_fakes()) {
        printf("1..0 # SKIP the fake NCCL is not built (make build/fake_nccl/libnccl.so.2)\n");
        return 0;
    }
    avg_divides_first = 1;   /* ncclAvg: see test_rooted_collectives.c */
    for (i = 0; i < (int)(sizeof plan / sizeof plan[0]); i++) {
        if (t_dev_real && plan[i].p > (getenv("T_DEVICE_RANKS") ? atoi(getenv("T_DEVICE_RANKS")) : 1)) continue;
        run_cfg_t *c = &runs[nruns++];
        memset(c, 0, sizeof *c);
        c->mode = plan[i].mode; c->p = plan[i].p; c->big = plan[i].big;
    }
    for (i = 0; i < nruns; i++) {
        char name[64];
        int nbad;
        snprintf(name, sizeof name, "device matrix %s p=%d", runs[i].mode, runs[i].p);
        if (!t_selected(name)) continue;
        S = (shm_t *)t_shm_user(sizeof(shm_t));
        S->ncases = build_cases(&runs[i]);
        nbad = t_run_ranks(runs[i].p, child, &runs[i], 180);
        report_run(&runs[i], nbad);
    }
    return t_done();
}
