/* SPDX-License-Identifier: MIT (see LICENSE) */
/* tests/libddp.c — libddp's implementation compiled once, for the Makefile to link into the
 * tests, benches, examples and tools that use only the public API (each of them then just
 * includes the headers, as every file but one does in a user's program). The header-only
 * promise is unchanged: this is the "one .c file that defines DDP_IMPLEMENTATION" of ddp.h.
 *
 * Including a transport registers it (a constructor), and a program's behaviour depends on which
 * transports it has, so this file is compiled once per transport set a program includes, in
 * the order they include them (tcp, shm, threads, nccl; -D selects):
 *     build/libddp-tcp.o       tcp
 *     build/libddp.o           tcp, shm
 *     build/libddp-threads.o   tcp, shm, threads
 *     build/libddp-nccl.o      tcp, shm, nccl (the dlopen build: no NCCL needed to link)
 * and once per flavour (build/, build/san/ ASan+UBSan, build/tsan/ TSan). The sampler has no
 * constructor and is in every set. _GNU_SOURCE as in the programs that link it. */
#define _GNU_SOURCE
#define DDP_IMPLEMENTATION
#include "ddp.h"
#include "ddp_sampler.h"
#include "transports/ddp_tcp.h"
#if T_IMPL_SHM
#include "transports/ddp_shm.h"
#endif
#if T_IMPL_THREADS
#include "transports/ddp_threads.h"
#endif
#if T_IMPL_NCCL
#include "transports/ddp_nccl.h"
#endif
