# SPDX-License-Identifier: MIT (see LICENSE)
# libddp — header-only; this Makefile builds the tests, examples and benchmarks.
#   make demo    data-parallel MLP training: 4 ranks on this host, checked against one process
#   make elastic-demo   the same surviving a killed rank and growing back (ELASTIC_RUNS=N runs)
#   make test    every test (plain, ASan+UBSan, TSan, side by side), header checks (C99/C11, C++11/17/20, gcc and clang)
#   make bench   ddp-bench sweep (all_reduce, reduce_scatter, all_gather, broadcast; p = 2 and 4; every transport) -> bench/results/*.json, busbw.svg
#   make install PREFIX=/usr/local [DESTDIR=]   headers, ddprun, ddp-status, ddp-bench, ddp.pc; make uninstall removes them
CC      ?= cc
CXX     ?= g++
WARN    := -Wall -Wextra -Wpedantic -Wshadow -Werror
CFLAGS  ?= -O2 -g
STD     := -std=c99
INC     := -I.
LDLIBS  := -pthread -lm
SAN     := -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
B       := build
# Every header, bottom layer first (README "Layout"); the ibverbs transport is checked by rdma-headers.
HEADERS := ddp_base.h ddp_kernels.h ddp_socket.h ddp_auth.h ddp_store_core.h ddp_store_server.h ddp_store_client.h \
           ddp_store_c10d.h ddp_store.h transports/ddp_transport.h ddp_engine.h \
           ddp_algorithm.h ddp_ring.h ddp_recursive_doubling.h ddp_agree.h ddp_rabenseifner.h \
           ddp_hierarchical.h ddp_tree.h ddp_chain.h ddp_linear.h ddp_pairwise.h ddp_deterministic.h ddp_algorithms.h \
           ddp_trace.h ddp_stats.h ddp_straggler.h ddp_metrics.h ddp_model.h ddp_comm_types.h ddp_comm_core.h ddp_rendezvous.h ddp_comm_dispatch.h \
           ddp_comm_device.h ddp_comm_queue.h ddp_health.h ddp_comm_init.h ddp_comm_shrink.h ddp_comm_grow.h ddp_comm.h ddp_window.h ddp_reducer.h ddp_powersgd.h ddp_state.h ddp.h ddp_sampler.h \
           transports/ddp_tcp.h transports/ddp_shm_handshake.h transports/ddp_shm_window.h transports/ddp_shm.h transports/ddp_threads.h \
           transports/ddp_nccl_api.h transports/ddp_nccl.h
# What users and transport authors include; the rest of HEADERS is private (each says so in its
# first line) and is checked alone in fewer compiler pairs (tests/check_headers.sh says why).
PUBLIC_HEADERS := ddp_base.h ddp_kernels.h ddp_store.h transports/ddp_transport.h ddp_engine.h ddp_trace.h \
                  ddp_model.h ddp_comm_types.h ddp_comm_shrink.h ddp_comm_grow.h ddp_comm.h ddp_window.h ddp_reducer.h ddp_powersgd.h ddp_state.h ddp.h ddp_sampler.h transports/ddp_tcp.h \
                  transports/ddp_shm_handshake.h transports/ddp_shm.h transports/ddp_threads.h \
                  transports/ddp_nccl_api.h transports/ddp_nccl.h
# The store alone (tools built on it without the communicator).
STORE_HEADERS := ddp_base.h ddp_socket.h ddp_auth.h ddp_store_core.h ddp_store_server.h ddp_store_client.h \
                 ddp_store_c10d.h ddp_store.h
NP      ?= 4

TEST_SRCS := $(wildcard tests/test_*.c)
TESTS     := $(patsubst tests/%.c,$(B)/%,$(TEST_SRCS))
TESTS_SAN := $(patsubst tests/%.c,$(B)/san/%,$(TEST_SRCS))
TEST_SH   := $(wildcard tests/test_*.sh)
EXAMPLES  := $(patsubst examples/%.c,$(B)/%,$(wildcard examples/*.c))

.PHONY: all test test-plain test-san test-tsan test-fuzz-short headers demo bench clean
all: $(B)/ddprun $(B)/ddp-status $(TESTS) $(EXAMPLES) $(B)/ddp-bench $(B)/svg_chart $(B)/ddp-overlap $(B)/ddp-async $(B)/ddp-scale $(B)/store-bench $(B)/guess-bench $(B)/grow-bench $(B)/straggler-bench \
     $(B)/nccl-raw $(B)/ddp-state-transfer

# ddprun serves the rendezvous store itself: it builds libddp's store (and what it rests on).
DDPRUN_DEPS := ddp_base.h ddp_socket.h ddp_auth.h ddp_store.h ddp_store_core.h ddp_store_server.h \
               ddp_store_client.h ddp_store_c10d.h
$(B)/ddprun: tools/ddprun.c $(DDPRUN_DEPS) | $(B)
	$(CC) $(STD) $(CFLAGS) $(WARN) $< -o $@ -pthread

# ddp-status asks a running job how each rank is, through its store: it builds the store alone too.
$(B)/ddp-status: tools/ddp_status.c $(DDPRUN_DEPS) | $(B)
	$(CC) $(STD) $(CFLAGS) $(WARN) $< -o $@ -pthread
$(B)/san/ddp-status: tools/ddp_status.c $(DDPRUN_DEPS) | $(B)/san
	$(CC) $(STD) -O1 -g $(SAN) $(WARN) $< -o $@ -pthread
# tests/test_ddp_status.c runs the ddp-status beside it (build/san's under the sanitizers).
$(B)/test_ddp_status: $(B)/ddp-status
$(B)/san/test_ddp_status: $(B)/san/ddp-status

$(B) $(B)/san $(B)/tsan $(B)/hdr:
	mkdir -p $@

# The implementation is compiled once per transport set and flavour (tests/libddp.c) and linked
# into each program below that uses only the public API; IMPL_* say which set a program includes
# (including a transport registers it, so the set is part of the program's behaviour). IMPL_SELF
# compile the implementation themselves: they call private _ddp_ functions (static), or, for
# test_shm_peer, rename sendmsg before the implementation to tamper with what it sends, and
# test_shm_host connect and syscall, to die or wait at a step of the shm join (and
# test_state_sync defines ddp_state.h's test hooks: a share corrupted in transit, a rank killed
# mid-transfer); the two sampler tests are also compiled alone (test_sampler_torch.sh,
# sampler_reshard_mutants.py).
IMPL_TCP     := test_failures test_kernels test_trace
IMPL_THREADS := test_deterministic test_mismatch test_shrink test_threads test_wait_notes
IMPL_NCCL    := test_flat_reducer test_nccl test_powersgd
IMPL_SELF    := test_auth test_c10d_store test_store_scale test_model test_sampler test_sampler_reshard test_shm_peer test_shm_host test_store \
                test_store_guard test_strangers test_rdma test_rooted_collectives test_nccl_rooted \
                test_reducer_elastic test_reducer_grow test_state_sync test_straggler test_metrics
# $(call impl,DIR,PROGRAM): the object PROGRAM links (nothing for IMPL_SELF).
impl = $(if $(filter $(2),$(IMPL_SELF)),,$(1)/libddp$(if $(filter $(2),$(IMPL_TCP)),-tcp,$(if \
       $(filter $(2),$(IMPL_THREADS)),-threads,$(if $(filter $(2),$(IMPL_NCCL)),-nccl))).o)
IMPL_OBJS          := libddp-tcp.o libddp.o libddp-threads.o libddp-nccl.o
IMPL_DEFS_libddp-tcp.o     :=
IMPL_DEFS_libddp.o         := -DT_IMPL_SHM=1
IMPL_DEFS_libddp-threads.o := -DT_IMPL_SHM=1 -DT_IMPL_THREADS=1
IMPL_DEFS_libddp-nccl.o    := -DT_IMPL_SHM=1 -DT_IMPL_NCCL=1
IMPL_DEPS    := tests/libddp.c $(HEADERS) ddp_sampler.h
TEST_HDRS    := $(wildcard tests/*.h)
TSAN         := -fsanitize=thread

$(addprefix $(B)/,$(IMPL_OBJS)): $(IMPL_DEPS) | $(B)
	$(CC) $(STD) $(CFLAGS) $(WARN) $(INC) $(IMPL_DEFS_$(notdir $@)) -c $< -o $@
$(addprefix $(B)/san/,$(IMPL_OBJS)): $(IMPL_DEPS) | $(B)/san
	$(CC) $(STD) -O1 -g $(SAN) $(WARN) $(INC) $(IMPL_DEFS_$(notdir $@)) -c $< -o $@
$(addprefix $(B)/tsan/,$(IMPL_OBJS)): $(IMPL_DEPS) | $(B)/tsan
	$(CC) $(STD) -O1 -g $(TSAN) $(WARN) $(INC) $(IMPL_DEFS_$(notdir $@)) -c $< -o $@

.SECONDEXPANSION:
$(B)/%: tests/%.c $$(call impl,$(B),$$*) $(HEADERS) $(TEST_HDRS) | $(B)
	$(CC) $(STD) $(CFLAGS) $(WARN) $(INC) $< $(call impl,$(B),$*) -o $@ $(LDLIBS)

$(B)/san/%: tests/%.c $$(call impl,$(B)/san,$$*) $(HEADERS) $(TEST_HDRS) | $(B)/san
	$(CC) $(STD) -O1 -g $(SAN) $(WARN) $(INC) $< $(call impl,$(B)/san,$*) -o $@ $(LDLIBS)

$(B)/%: examples/%.c $(HEADERS) | $(B)
	$(CC) $(STD) $(CFLAGS) $(WARN) $(INC) $< -o $@ $(LDLIBS)
$(B)/train_mlp_elastic: examples/train_mlp.c   # it includes the MLP demo's model

# Each header alone (declarations and implementation, with and without DDP_STATIC, C99/C11 and
# C++11/17/20, gcc and clang) and each header first and last among the others:
# tests/check_headers.sh. The parts below are separate targets so that make -j runs them at once.
HDR_OLEVELS := -O0 -O1 -O2 -O3 -Os
headers: nccl-headers hdr-matrix hdr-link $(foreach o,$(HDR_OLEVELS),$(B)/hdr/impl$(o).o)
	@echo "ok: implementation + C++ user link; DDP_STATIC builds; -O0..-O3 and -Os warning-free"
.PHONY: hdr-matrix hdr-link $(B)/hdr/impl.c
hdr-matrix: | $(B)/hdr
	CHECK_HEADERS_PRIVATE="$(filter-out $(PUBLIC_HEADERS),$(HEADERS))" bash tests/check_headers.sh $(B)/hdr/matrix $(HEADERS)
$(B)/hdr/impl.c: | $(B)/hdr
	@printf '#define DDP_IMPLEMENTATION\n#include "ddp.h"\n#include "transports/ddp_tcp.h"\n#include "ddp_sampler.h"\n' > $@
# One implementation file plus a C++ file that only includes the headers link together;
# DDP_STATIC makes a private copy.
hdr-link: $(B)/hdr/impl.c
	@printf '#include "ddp.h"\n#include "ddp_sampler.h"\n#include <cstdio>\nint main(){ std::puts(ddp_strerror(DDP_ERR_TIMEOUT)); return ddp_dtype_size(DDP_BFLOAT16) == 2 ? 0 : 1; }\n' > $(B)/hdr/user.cpp
	$(CC) -std=c99 $(WARN) $(INC) -c $(B)/hdr/impl.c -o $(B)/hdr/impl.o
	$(CXX) -std=c++17 $(WARN) $(INC) -c $(B)/hdr/user.cpp -o $(B)/hdr/user.o
	$(CXX) $(B)/hdr/impl.o $(B)/hdr/user.o -o $(B)/hdr/linked -pthread && $(B)/hdr/linked >/dev/null
	$(CC) -std=c99 $(WARN) $(INC) -DDDP_STATIC -c $(B)/hdr/impl.c -o $(B)/hdr/static.o
	@# DDP_STATIC with the sampler first (the two headers used to define DDP_API differently).
	@printf '#define DDP_STATIC\n#define DDP_IMPLEMENTATION\n#include "ddp_sampler.h"\n#include "ddp.h"\n#include "transports/ddp_tcp.h"\nint main(void){return 0;}\n' > $(B)/hdr/static2.c
	$(CC) -std=c99 $(WARN) $(INC) -c $(B)/hdr/static2.c -o $(B)/hdr/static2.o
# -Wformat-truncation and friends depend on inlining: every optimisation level (always rebuilt,
# like the rest of make headers).
.PHONY: $(foreach o,$(HDR_OLEVELS),$(B)/hdr/impl$(o).o)
$(foreach o,$(HDR_OLEVELS),$(B)/hdr/impl$(o).o): $(B)/hdr/impl.c
	$(CC) -std=c99 $(patsubst $(B)/hdr/impl%.o,%,$@) $(WARN) $(INC) -c $< -o $@

# Every test program runs through tests/run_one.sh: its own scratch TMPDIR, removed afterwards,
# and its flavour's settings (sanitizer options, DDP_TEST_QUICK) taken from its path.
RUN_ONE := --exec 'sh tests/run_one.sh'

test-plain: $(TESTS) $(B)/ddprun
	prove -f $(RUN_ONE) $(TESTS) $(TEST_SH)

# Under ASan+UBSan every path runs, at fewer world sizes (DDP_TEST_QUICK, set by run_one.sh): the
# plain run above already covers 1..8, and the sanitizers look for memory errors, not for
# world-size cases.
test-san: $(TESTS_SAN)
	prove -f $(RUN_ONE) $(TESTS_SAN)

# ThreadSanitizer where libddp runs threads: the store server thread, with clients in threads.
TSAN_TESTS := $(B)/tsan/test_grow $(B)/tsan/test_store $(B)/tsan/test_shm $(B)/tsan/test_async $(B)/tsan/test_reducer $(B)/tsan/test_threads \
              $(B)/tsan/test_nccl $(B)/tsan/test_flat_reducer $(B)/tsan/test_reducer_elastic $(B)/tsan/test_reducer_grow \
              $(B)/tsan/test_shrink $(B)/tsan/test_state_sync
$(B)/tsan/%: tests/%.c $$(call impl,$(B)/tsan,$$*) $(HEADERS) $(TEST_HDRS) | $(B)/tsan
	$(CC) $(STD) -O1 -g $(TSAN) $(WARN) $(INC) $< $(call impl,$(B)/tsan,$*) -o $@ $(LDLIBS)

test-tsan: $(TSAN_TESTS)
	prove -f $(RUN_ONE) $(TSAN_TESTS)

# test-together: every test program of test-fake-nccl, test-plain, test-san and test-tsan in one
# prove run, TEST_PROVE_JOBS at a time. Most of them mostly wait (timeouts, peers that die,
# sleeps), so side by side that waiting overlaps the CPU-bound ones; no check depends on how soon
# something happens beyond a bound derived from its timeout, and each program has its own ports
# (tests/ddp_test.h t_free_port) and scratch directory. Longest first (the CI run's times), so
# that the longest does not start last. On the 2-core VM -j6 kept both cores 99% busy and ran in
# 510 s what takes 1,003 CPU-seconds (the floor is CPU, not waiting, from there on).
TEST_PROVE_JOBS ?= 6
TEST_FAKE_NCCL  := $(B)/fake_nccl/selftest $(B)/fake_nccl_san/selftest $(B)/fake_nccl_tsan/selftest
TEST_LONGEST    := $(B)/test_collectives $(B)/san/test_collectives tests/test_netns.sh \
                   tests/test_include_anywhere.sh $(B)/test_failures $(B)/san/test_failures \
                   $(B)/test_threads $(B)/test_nccl $(B)/san/test_nccl $(B)/tsan/test_threads \
                   $(B)/tsan/test_nccl $(B)/test_strangers $(B)/san/test_strangers tests/test_launchers.sh \
                   tests/test_bench.sh tests/test_sampler_torch.sh $(B)/test_stuck $(B)/san/test_stuck \
                   $(B)/test_c10d_store $(B)/san/test_threads
TEST_ALL        := $(TESTS) $(TEST_SH) $(TESTS_SAN) $(TSAN_TESTS) $(TEST_FAKE_NCCL)
TEST_ORDER      := $(filter $(TEST_ALL),$(TEST_LONGEST)) $(filter-out $(TEST_LONGEST),$(TEST_ALL))
.PHONY: test-together
test-together: $(TEST_ALL) $(B)/ddprun
	prove -f -j$(TEST_PROVE_JOBS) $(RUN_ONE) $(TEST_ORDER)

# make test: first everything its phases run is built, with TEST_JOBS jobs (every dependency is
# declared, so make -j is correct); then the tests (test-together) run while the other phases
# run beside them, each phase into its own log under $(B)/test-logs, printed whole when that phase
# fails: the header matrix then the short fuzz run (CPU-bound compiles and fuzzers, which fill
# the time the tests spend waiting), and the RDMA VM. Each phase says how long it took.
TEST_JOBS   ?= $(shell nproc 2>/dev/null || echo 2)
TEST_BESIDE := headers test-fuzz-short test-rdma-vm
# -j unless the caller gave one (a sub-make with its own -j would leave the caller's jobserver).
TEST_J       = $(if $(filter -j%,$(MAKEFLAGS)),,-j$(TEST_JOBS))
TEST_BUILD  := $(TESTS) $(TESTS_SAN) $(TSAN_TESTS) $(B)/ddprun $(TEST_FAKE_NCCL) \
               $(B)/ddp-bench $(B)/svg_chart $(B)/train_mlp $(B)/netns_rank $(B)/health_rank $(B)/ddp-status
.PHONY: test-build
test-build: $(TEST_BUILD)
test:
	@s=$$(date +%s); $(MAKE) --no-print-directory $(TEST_J) test-build || exit 1; \
	echo "make test: building took $$(( $$(date +%s) - s )) s"; \
	L=$(B)/test-logs; rm -rf $$L; mkdir -p $$L; \
	phase() { s=$$(date +%s); $(MAKE) --no-print-directory "$$@" > $$L/$$1.log 2>&1; rc=$$?; \
	  echo "make test: $$1 took $$(( $$(date +%s) - s )) s$$([ $$rc = 0 ] || echo ", FAILED (its log follows)")"; \
	  [ $$rc = 0 ] || cat $$L/$$1.log; echo $$rc > $$L/$$1.rc; }; \
	{ phase headers $(TEST_J); phase test-fuzz-short $(TEST_J); } & p1=$$!; \
	phase test-rdma-vm $(TEST_J) & p2=$$!; \
	s=$$(date +%s); $(MAKE) --no-print-directory test-together; rc=$$?; \
	echo "make test: test-together (fake NCCL, plain, san, tsan) took $$(( $$(date +%s) - s )) s"; \
	wait $$p1 $$p2; \
	for p in $(TEST_BESIDE); do [ "$$(cat $$L/$$p.rc 2>/dev/null)" = 0 ] || rc=1; done; \
	for p in $(TEST_BESIDE); do tail -n 3 $$L/$$p.log | sed "s|^|make test: $$p: |"; done; \
	exit $$rc

# NCCL (transports/ddp_nccl.h, issue 15). No GPU here: tests/fake_nccl builds a fake NCCL and CUDA
# runtime that test_nccl/test_nccl_rooted load instead of the real ones (DDP_NCCL_LIBRARY,
# DDP_CUDART_LIBRARY); test_nccl also checks the real library's decline path. On a machine with
# a GPU, `make test-gpu` (below) runs the same collectives on real device buffers.
FAKE_NCCL_CFLAGS := -std=c11 -O2 -g -Wall -Wextra -Werror -fPIC -shared -pthread
FAKE_NCCL := $(B)/fake_nccl/libcudart.so.13 $(B)/fake_nccl/libnccl.so.2
$(B)/fake_nccl/libcudart.so.13: tests/fake_nccl/fake_cudart.c tests/fake_nccl/fake_cuda.h
	@mkdir -p $(B)/fake_nccl
	$(CC) $(FAKE_NCCL_CFLAGS) -Wl,-soname,libcudart.so.13 $< -o $@
$(B)/fake_nccl/libnccl.so.2: tests/fake_nccl/fake_nccl.c tests/fake_nccl/fake_cuda.h $(B)/fake_nccl/libcudart.so.13
	$(CC) $(FAKE_NCCL_CFLAGS) -Wl,-soname,libnccl.so.2 $< -o $@ -L$(B)/fake_nccl -l:libcudart.so.13 -Wl,--disable-new-dtags,-rpath,'$$ORIGIN'
$(B)/test_nccl $(B)/san/test_nccl $(B)/tsan/test_nccl: tests/test_collectives.c $(FAKE_NCCL)
$(B)/san/test_rdma: tests/test_collectives.c
$(B)/test_nccl_rooted $(B)/san/test_nccl_rooted: tests/test_rooted_collectives.c $(FAKE_NCCL)
$(B)/test_flat_reducer $(B)/san/test_flat_reducer $(B)/tsan/test_flat_reducer: $(FAKE_NCCL)
$(B)/test_powersgd $(B)/san/test_powersgd: $(FAKE_NCCL)

# ZeRO-1 against replicated AdamW (examples/zero1_demo.c, issue 17).
.PHONY: zero1-demo
zero1-demo: $(B)/zero1_demo $(B)/ddprun
	$(B)/ddprun -n $(NP) $(B)/zero1_demo

# The fakes' own selftest (tests/fake_nccl/selftest.c), plain and with each sanitizer (the
# sanitized fakes are built together into their own directories by tests/fake_nccl/build.sh).
.PHONY: test-fake-nccl
$(B)/fake_nccl/selftest: tests/fake_nccl/selftest.c $(FAKE_NCCL)
	$(CC) -std=c11 -O2 -g -Wall -Wextra -Werror -pthread $< -o $@ -ldl
FAKE_NCCL_SRCS := tests/fake_nccl/fake_cudart.c tests/fake_nccl/fake_nccl.c tests/fake_nccl/fake_cuda.h \
                  tests/fake_nccl/selftest.c tests/fake_nccl/build.sh
$(B)/fake_nccl_san/selftest: $(FAKE_NCCL_SRCS)
	CC="$(CC)" CFLAGS="-O1 -g" sh tests/fake_nccl/build.sh $(B)/fake_nccl_san $(SAN)
$(B)/fake_nccl_tsan/selftest: $(FAKE_NCCL_SRCS)
	CC="$(CC)" CFLAGS="-O1 -g" sh tests/fake_nccl/build.sh $(B)/fake_nccl_tsan -fsanitize=thread
test-fake-nccl: $(B)/fake_nccl/selftest $(B)/fake_nccl_san/selftest $(B)/fake_nccl_tsan/selftest
	prove -f $(RUN_ONE) $(B)/fake_nccl/selftest $(B)/fake_nccl_san/selftest $(B)/fake_nccl_tsan/selftest

# On a machine with a GPU: tests/gpu/test_gpu.sh finds the real NCCL and CUDA runtime, builds
# what it runs into build/gpu/ itself (no fake NCCL: the real libraries are loaded at run time),
# runs the device matrices at p = 1, 2, 3 (several ranks sharing one GPU), test_nccl's scenarios,
# and nccl-raw against ddp-bench --transport nccl, all within about 5 minutes; build/gpu/summary.txt says
# what happened. Where nvidia-smi lists no GPU it says so and succeeds. DRY=1 prints the libraries
# it found and the commands, and runs nothing (tests/test_gpu_script.sh checks that in make test).
.PHONY: test-gpu nccl-headers
test-gpu:
	@CC="$(CC)" DRY="$(DRY)" bash tests/gpu/test_gpu.sh

# nccl-raw (bench/nccl_raw.c): ncclAllReduce alone, the baseline test-gpu sets ddp-bench --transport nccl
# against; loads NCCL and the CUDA runtime at run time, so it builds without either.
$(B)/nccl-raw: bench/nccl_raw.c $(STORE_HEADERS) | $(B)
	$(CC) $(STD) $(CFLAGS) $(WARN) $(INC) $< -o $@ $(LDLIBS) -ldl

# transports/ddp_nccl.h with DDP_NCCL_LINK: compiled against CUDA's headers and linked with its
# libraries (the dlopen build is in HEADERS' matrix), where /usr/local/cuda has them.
CUDA_HOME ?= /usr/local/cuda
nccl-headers: | $(B)/hdr
	@if [ ! -f $(CUDA_HOME)/include/nccl.h ]; then echo "skipping the DDP_NCCL_LINK check: no $(CUDA_HOME)/include/nccl.h"; exit 0; fi; \
	set -e; printf '#define DDP_IMPLEMENTATION\n#define DDP_NCCL_LINK\n#include "ddp.h"\n#include "transports/ddp_tcp.h"\n#include "transports/ddp_nccl.h"\nint main(void){ return ddp_transport_nccl() == 0; }\n' > $(B)/hdr/nccl_link.c; \
	cp $(B)/hdr/nccl_link.c $(B)/hdr/nccl_link.cpp; \
	for cc in "$(CC) -std=c99" "$(CC) -std=c11" "clang -std=c99" "$(CXX) -std=c++17" "clang++ -std=c++17"; do \
	  command -v $${cc%% *} >/dev/null || continue; \
	  case $$cc in *++*) f=$(B)/hdr/nccl_link.cpp;; *) f=$(B)/hdr/nccl_link.c;; esac; \
	  $$cc $(WARN) $(INC) -I$(CUDA_HOME)/include $$f -o $(B)/hdr/nccl_link -L$(CUDA_HOME)/lib64 -lnccl -lcudart -pthread -lm; \
	done; echo "ok: transports/ddp_nccl.h with DDP_NCCL_LINK compiles (C99, C11, C++17; gcc and clang) and links against $(CUDA_HOME)'s NCCL and CUDA runtime"

# A short fuzzing run of every harness (make fuzz is the long one) where clang's libFuzzer works;
# .ci/run installs it.
test-fuzz-short: | $(B)
	@if printf 'int LLVMFuzzerTestOneInput(const unsigned char *d, unsigned long n){(void)d;(void)n;return 0;}\n' > $(B)/fz.c 2>/dev/null && \
	   $(FUZZ_CC) -fsanitize=fuzzer $(B)/fz.c -o $(B)/fz 2>/dev/null; then \
	  $(MAKE) --no-print-directory fuzz FUZZ_SECONDS=$(FUZZ_SHORT_SECONDS); \
	else echo "skipping the short fuzz run: no clang with libFuzzer (apt-get install -y clang libclang-rt-14-dev)"; fi

# RDMA (transports/ddp_ibverbs.h, issue 6). Its tests need an RDMA device: `make test` runs them in
# ../shared/rdma-vm's soft-RoCE VM when that is set up and says so when it is not; CI (.ci/run) sets
# it up. build/test_rdma links without -libverbs (DDP_IBV_DLOPEN) and skips where there is no
# device, so the plain and sanitizer runs build and pass it anywhere. The header is not in HEADERS
# (it needs <infiniband/verbs.h>): rdma-headers checks it where libibverbs-dev is installed.
RDMA_VM       ?= ../shared/rdma-vm
RDMA_VM_CACHE ?= /var/tmp/rdma-vm
IB_HEADERS    := transports/ddp_ibverbs.h
.PHONY: test-rdma test-rdma-vm rdma-headers

$(B)/test_rdma: tests/test_rdma.c tests/test_collectives.c $(IB_HEADERS) $(HEADERS) $(wildcard tests/*.h) | $(B)
	$(CC) $(STD) $(CFLAGS) $(WARN) $(INC) $< -o $@ $(LDLIBS)

$(B)/ddp-bench-ibverbs: bench/ddp_bench.c bench/bench_common.h bench/bench_fork.h $(IB_HEADERS) $(HEADERS) $(wildcard transports/*.h) | $(B)
	$(CC) $(STD) $(CFLAGS) $(WARN) $(INC) -DDDP_BENCH_IBVERBS $< -o $@ $(LDLIBS) -libverbs

# The header alone, declarations / implementation linked (-libverbs) / implementation with
# DDP_IBV_DLOPEN, as C99, C11 and C++17 (host only: the VM has no g++).
rdma-headers: | $(B)/hdr
	@set -e; for mode in decl impl dlopen; do \
	  def='#include "ddp.h"\n'; \
	  [ $$mode = impl ] && def='#define DDP_IMPLEMENTATION\n#include "ddp.h"\n'; \
	  [ $$mode = dlopen ] && def='#define DDP_IMPLEMENTATION\n#define DDP_IBV_DLOPEN\n#include "ddp.h"\n'; \
	  printf "$$def#include \"transports/ddp_ibverbs.h\"\nint main(void){ return ddp_transport_ibverbs() == 0; }\n" > $(B)/hdr/ib.c; \
	  [ $$mode = decl ] && printf '#include "ddp.h"\n#include "transports/ddp_ibverbs.h"\nint main(void){ return 0; }\n' > $(B)/hdr/ib.c; \
	  cp $(B)/hdr/ib.c $(B)/hdr/ib.cpp; \
	  $(CC) -std=c99 $(WARN) $(INC) -c $(B)/hdr/ib.c -o $(B)/hdr/ib.o; \
	  $(CC) -std=c11 $(WARN) $(INC) -c $(B)/hdr/ib.c -o $(B)/hdr/ib.o; \
	  $(CXX) -std=c++17 $(WARN) $(INC) -c $(B)/hdr/ib.cpp -o $(B)/hdr/ib.o; \
	  [ $$mode = decl ] || $(CC) $(B)/hdr/ib.o -o $(B)/hdr/ib -pthread -lm $$([ $$mode = impl ] && echo -libverbs); \
	  echo "ok: $(IB_HEADERS) ($$mode) compiles as C99, C11, C++17$$([ $$mode = decl ] || echo ' and links')"; \
	done

# In the VM (or on any host with an RDMA device): the tests, then ddp-bench over ibverbs.
test-rdma: $(B)/test_rdma $(B)/ddp-bench-ibverbs
	if command -v prove >/dev/null; then prove -f $(B)/test_rdma; else $(B)/test_rdma; fi
	$(B)/ddp-bench-ibverbs -N 2 --transport ibverbs -s 8,64K,1M -n 5 -w 1 -c 1

# The hook in `make test`: build here, run in the VM (~5 minutes; it keeps both cores busy). A
# guest that never reached the command (run.sh's 125 without the marker: on a loaded host the
# emulated guest kernel can panic in its boot-time timer check) is booted once more; a failure
# after the command started is the tests' and is never retried.
test-rdma-vm:
	@if [ ! -x $(RDMA_VM)/run.sh ] || [ ! -s $(RDMA_VM_CACHE)/rootfs.img ] || ! command -v qemu-system-x86_64 >/dev/null; then \
	  echo "skipping rdma tests: VM not set up (sudo bash ../shared/rdma-vm/setup.sh)"; \
	elif [ ! -f /usr/include/infiniband/verbs.h ]; then \
	  echo "skipping rdma tests: libibverbs-dev not installed (apt-get install -y libibverbs-dev)"; \
	else \
	  $(MAKE) --no-print-directory rdma-headers $(B)/test_rdma $(B)/ddp-bench-ibverbs || exit 1; \
	  for try in 1 2; do \
	    rm -f $(B)/rdma-vm.started; \
	    $(RDMA_VM)/run.sh 'touch $(B)/rdma-vm.started && make --no-print-directory test-rdma'; rc=$$?; \
	    [ $$rc = 125 ] && [ ! -f $(B)/rdma-vm.started ] && [ $$try = 1 ] || exit $$rc; \
	    echo "test-rdma-vm: the VM did not boot (above: its console); booting it once more"; \
	  done; \
	fi

# The MLP demo (examples/train_mlp.c); build/train_demo, the linear-model example, is built by `all`.
demo: $(B)/train_mlp $(B)/ddprun
	$(B)/ddprun -n $(NP) $(B)/train_mlp

# The elastic MLP demo (examples/train_mlp_elastic.c): ELASTIC_RUNS runs of 4 ranks under
# ddprun --elastic 3 --max-restarts 1, each killing a random rank at a random step, tcp and shm
# in turn (the replacement joins, the job grows back to 4); a summary of the kill -> first step
# and replacement -> first step at full size times; fails if any run does.
ELASTIC_RUNS ?= 1
.PHONY: elastic-demo
elastic-demo: $(B)/train_mlp_elastic $(B)/ddprun
	sh examples/elastic_demo.sh $(ELASTIC_RUNS)

# ddp-bench (bench/ddp_bench.c) has every transport but ibverbs: it links build/libddp-nccl.o, the
# implementation with tcp, shm and nccl (DDP_BENCH_LINKED: the file does not define
# DDP_IMPLEMENTATION itself); svg_chart draws its JSON.
$(B)/ddp-bench: bench/ddp_bench.c bench/bench_common.h bench/bench_fork.h $(B)/libddp-nccl.o $(HEADERS) $(wildcard transports/*.h) | $(B)
	$(CC) $(STD) $(CFLAGS) $(WARN) $(INC) -DDDP_BENCH_LINKED $< $(B)/libddp-nccl.o -o $@ $(LDLIBS)

$(B)/svg_chart: bench/svg_chart.c | $(B)
	$(CC) $(STD) $(CFLAGS) $(WARN) $< -o $@ -lm

# ddp-overlap (bench/ddp_overlap.c): how much of the all-reduce the gradient bucket reducer hides
# behind a simulated ResNet-50 backward, and the bucket-size sweep (run: build/ddp-overlap -p 2).
$(B)/ddp-overlap: bench/ddp_overlap.c bench/bench_fork.h bench/bench_cli.h $(HEADERS) | $(B)
	$(CC) $(STD) $(CFLAGS) $(WARN) $(INC) $< -o $@ $(LDLIBS)

# ddp-scale (bench/ddp_scale.c): init + first all-reduce under ddprun; make scale runs the curve.
$(B)/ddp-scale: bench/ddp_scale.c bench/bench_cli.h $(HEADERS) | $(B)
	$(CC) $(STD) $(CFLAGS) $(WARN) $(INC) $< -o $@ $(LDLIBS)

# store-bench (bench/store_bench.c): 4,096 clients doing the init key pattern against one store.
$(B)/store-bench: bench/store_bench.c bench/bench_cli.h $(STORE_HEADERS) | $(B)
	$(CC) $(STD) $(CFLAGS) $(WARN) $(INC) $< -o $@ $(LDLIBS)

# rendezvous-stopped (bench/rendezvous_stopped.c): how soon every rank's init fails when rank 0
# is stopped under its listening store (run: build/rendezvous-stopped -n 64 -t 2000).
$(B)/rendezvous-stopped: bench/rendezvous_stopped.c $(HEADERS) | $(B)
	$(CC) $(STD) $(CFLAGS) $(WARN) $(INC) $< -o $@ $(LDLIBS)

# grow-bench (bench/grow_bench.c): the per-step "anyone waiting?" check and a grow's time.
$(B)/grow-bench: bench/grow_bench.c bench/bench_fork.h $(HEADERS) | $(B)
	$(CC) $(STD) $(CFLAGS) $(WARN) $(INC) $< -o $@ $(LDLIBS)

# straggler-bench (bench/straggler_bench.c): is a rank given 5 ms more per step named by the
# straggler WARN, and how often is one named when all are equal (bench/results/straggler.md).
$(B)/straggler-bench: bench/straggler_bench.c bench/bench_fork.h ddp_straggler.h $(HEADERS) | $(B)
	$(CC) $(STD) $(CFLAGS) $(WARN) $(INC) $< -o $@ $(LDLIBS)

# guess-bench (bench/guess_bench.c): wrong job secrets per second from one thread against a store.
$(B)/guess-bench: bench/guess_bench.c bench/bench_cli.h $(STORE_HEADERS) | $(B)
	$(CC) $(STD) $(CFLAGS) $(WARN) $(INC) $< -o $@ $(LDLIBS)

# store-soak: 16,384 store clients, 20 runs in a row; counts hangs (0 expected) and failures.
.PHONY: store-soak
store-soak: $(B)/store-bench
	bash bench/store_soak.sh 20 16384 32

.PHONY: scale
scale: $(B)/ddp-scale $(B)/ddprun $(B)/store-bench $(B)/ddp-status $(B)/health_rank
	bash bench/scale.sh $(SCALE_N)
	bash bench/status_scale.sh 1024
	$(B)/store-bench -n 4096 -p 16
	$(B)/store-bench -n 4096 -p 16 -s scale-bench-secret

# ddp-kill-detect (bench/kill_detect.c): time from a rank's SIGKILL to each survivor's error.
$(B)/ddp-kill-detect: bench/kill_detect.c bench/bench_cli.h $(HEADERS) | $(B)
	$(CC) $(STD) $(CFLAGS) $(WARN) $(INC) $< -o $@ $(LDLIBS)

# ddp-state-transfer (bench/state_transfer.c): ddp_state_sync of 256 MiB from 3 ranks to 1 against
# the TCP loopback stream and memcpy of the same run (bench/results/state_transfer.md).
$(B)/ddp-state-transfer: bench/state_transfer.c bench/bench_fork.h bench/bench_cli.h $(HEADERS) | $(B)
	$(CC) $(STD) $(CFLAGS) $(WARN) $(INC) $< -o $@ $(LDLIBS)

# ddp-async (bench/ddp_async.c): k all-reduces blocking, async and in a group (run: build/ddp-async -p 2).
$(B)/ddp-async: bench/ddp_async.c bench/bench_fork.h bench/bench_cli.h $(HEADERS) | $(B)
	$(CC) $(STD) $(CFLAGS) $(WARN) $(INC) $< -o $@ $(LDLIBS)

# The all-reduce cost model (ddp_model.h, issue 18). ddp-calibrate measures its parameters here and
# writes them for DDP_MODEL (make calibrate MODEL_OUT=path); ddp-simulate prints its predictions
# and make simulate regenerates bench/results/projection.md and .svg (model output, not measurements).
MODEL_OUT ?= $(B)/ddp_model.conf
$(B)/ddp-calibrate: bench/calibrate.c bench/bench_fork.h ddp_model.h $(HEADERS) | $(B)
	$(CC) $(STD) $(CFLAGS) $(WARN) $(INC) $< -o $@ $(LDLIBS)

$(B)/ddp-simulate: bench/simulate.c ddp_model.h ddp_base.h | $(B)
	$(CC) $(STD) $(CFLAGS) $(WARN) $(INC) $< -o $@ $(LDLIBS)

.PHONY: calibrate simulate
calibrate: $(B)/ddp-calibrate
	$(B)/ddp-calibrate -o $(MODEL_OUT)

simulate: $(B)/ddp-simulate
	$(B)/ddp-simulate --project -o bench/results/projection.md --svg bench/results/projection.svg

# 8 B .. 64 MiB, p = 2 and 4, the four ring collectives, every transport (2-4 minutes on 2 cores; knobs in
# bench/sweep.sh): bench/results/<collective>_<transport>_p<N>.json and busbw.svg.
bench: $(B)/ddp-bench $(B)/svg_chart
	bash bench/sweep.sh

# libddp vs Open MPI vs Gloo all-reduce, side by side in one run, and libddp's share of this
# machine's limits (memcpy, a+b, TCP loopback both ways) measured beside every round (~10 minutes
# on 2 cores; knobs in bench/compare.sh, e.g. IMPLS="ddp_shm" SIZES=1M,16M,256M REPEATS=5 for the
# shared-memory share alone); needs libopenmpi-dev openmpi-bin libgloo-dev (a missing peer is
# skipped): bench/results/compare.json and compare.md.
.PHONY: compare
compare:
	bash bench/compare.sh

clean:
	rm -rf $(B)

# What a user vendors, flat: dist/ddp.h (the whole core in one header) beside ddp_sampler.h and
# the transports, which then include nothing but "ddp.h" (tools/amalgamate.py).
.PHONY: dist
dist:
	python3 tools/amalgamate.py dist

# libFuzzer harnesses (tests/fuzz/fuzz_*.c, clang): the store server's request parser and
# handlers, and both ends of its authentication handshake. `make fuzz FUZZ_SECONDS=60` runs each
# for that long, starting from its committed seeds (tests/fuzz/corpus_<name>/); what it finds
# goes to build/fuzz/corpus_<name>/ and crashes to build/fuzz/. Needs clang's libFuzzer runtime
# (Debian: apt-get install -y clang libclang-rt-14-dev).
FUZZ_SECONDS ?= 60
FUZZ_SHORT_SECONDS ?= 20
FUZZ_CC      ?= clang
FUZZERS      := $(patsubst tests/fuzz/%.c,$(B)/fuzz/%,$(wildcard tests/fuzz/fuzz_*.c))
.PHONY: fuzz
$(B)/fuzz/%: tests/fuzz/%.c $(STORE_HEADERS)
	@mkdir -p $(B)/fuzz
	$(FUZZ_CC) -std=c99 -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined $(WARN) $(INC) $< -o $@ -pthread

fuzz: $(FUZZERS)
	@# The harnesses run at once, at most one per core (each is single-threaded, so each still
	@# gets a core for FUZZ_SECONDS); their summaries are printed one after another.
	@for f in $(FUZZERS); do n=$$(basename $$f); mkdir -p $(B)/fuzz/corpus_$${n#fuzz_}; echo "$$n"; done | \
	  xargs -P "$$(nproc)" -I{} sh -c 'n={}; c=corpus_$${n#fuzz_}; echo "fuzz: $$n for $(FUZZ_SECONDS) s"; \
	    cd $(B)/fuzz && ./$$n -max_total_time=$(FUZZ_SECONDS) -print_final_stats=1 -artifact_prefix=./$$n- \
	      ../../$(B)/fuzz/$$c ../../tests/fuzz/$$c > $$n.log 2>&1; true'
	@set -e; for f in $(FUZZERS); do n=$$(basename $$f); echo "fuzz: $$n:"; \
	  grep -E '^(#[0-9]+ +DONE|stat::number_of_executed_units|stat::peak_rss|Done|==|SUMMARY|.*ERROR)' $(B)/fuzz/$$n.log || true; \
	  ls $(B)/fuzz/$$n-* >/dev/null 2>&1 && { echo "fuzz: $$n found a crash: $$(ls $(B)/fuzz/$$n-*)"; exit 1; }; \
	done; echo "fuzz: no crashes"

# Install (issue 16). make install [PREFIX=/usr/local] [DESTDIR=staging dir, for packagers]:
#   $(INCLUDEDIR)/ddp/      every public header (HEADERS, IB_HEADERS), transports/ kept, so the
#                           headers' relative includes ("ddp_base.h", "../ddp_socket.h") resolve
#   $(BINDIR)/              ddprun, ddp-status and ddp-bench, built by the rules above (usual flags)
#   $(PKGCONFIGDIR)/ddp.pc  from ddp.pc.in: Cflags -I$${includedir}/ddp, Libs -pthread -lm -ldl,
#                           Version from DDP_VERSION_MAJOR/MINOR(/PATCH); no warning flags
# The .pc goes to share/pkgconfig: the library is headers only, so the file is the same on every
# architecture (where pkg-config looks for arch-independent .pc files; PKGCONFIGDIR overrides).
# make uninstall removes those files, include/ddp, and the directories install created: install
# records them in $(INCLUDEDIR)/ddp/.install-dirs (not under DESTDIR, whose staging trees
# packagers ship: there uninstall removes the files and include/ddp only).
# Our builds use -Werror; to build the tools with a compiler that warns more:
# make install WARN='-Wall -Wextra'.
PREFIX       = /usr/local
BINDIR       = $(PREFIX)/bin
INCLUDEDIR   = $(PREFIX)/include
PKGCONFIGDIR = $(PREFIX)/share/pkgconfig
INSTALL      = install
INSTALL_HEADERS = $(sort $(HEADERS) $(IB_HEADERS))
INSTALL_TOOLS   = ddprun ddp-status ddp-bench
# include/ddp and its subdirectories (transports), as installed; the headers in each.
INSTALL_HDR_SUBDIRS = $(patsubst %/,%,$(filter-out ./,$(sort $(dir $(INSTALL_HEADERS)))))
INSTALL_HDR_DIRS    = $(DESTDIR)$(INCLUDEDIR)/ddp $(addprefix $(DESTDIR)$(INCLUDEDIR)/ddp/,$(INSTALL_HDR_SUBDIRS))
install_headers_in  = $(strip $(foreach h,$(INSTALL_HEADERS),$(if $(filter $(1)/,$(dir $(h))),$(h))))
# MAJOR.MINOR[.PATCH] from the headers (ddp_base.h today; ddp.h if the macros move there).
DDP_VERSION = $(shell for k in MAJOR MINOR PATCH; do \
                sed -n "s/^[ \t]*.[ \t]*define[ \t][ \t]*DDP_VERSION_$$k[ \t][ \t]*\([0-9][0-9]*\).*/\1/p" ddp_base.h ddp.h | head -n 1; \
              done | paste -s -d . -)
# In the .pc, includedir relative to prefix when it is under it (pkg-config --define-prefix works).
PC_INCLUDEDIR = $(patsubst $(PREFIX)/%,$${prefix}/%,$(INCLUDEDIR))
.PHONY: install uninstall

install: $(addprefix $(B)/,$(INSTALL_TOOLS)) ddp.pc.in | $(B)
	@v='$(DDP_VERSION)'; case $$v in [0-9]*.[0-9]*) ;; \
	  *) echo "install: no DDP_VERSION_MAJOR/MINOR in ddp_base.h or ddp.h (got '$$v')" >&2; exit 1;; esac
	sed -e 's|@prefix@|$(PREFIX)|g' -e 's|@includedir@|$(PC_INCLUDEDIR)|g' -e 's|@version@|$(DDP_VERSION)|g' \
	  ddp.pc.in > $(B)/ddp.pc
	@set -e; made=''; \
	for d in $(DESTDIR)$(BINDIR) $(DESTDIR)$(PKGCONFIGDIR) $(INSTALL_HDR_DIRS); do \
	  p=$$d; while [ ! -d "$$p" ]; do made="$$made $$p"; p=$$(dirname "$$p"); done; \
	  $(INSTALL) -d "$$d"; \
	done; \
	if [ -z '$(DESTDIR)' ] && [ -n "$$made" ]; then \
	  for p in $$made; do echo "$$p"; done >> $(INCLUDEDIR)/ddp/.install-dirs; \
	fi
	$(INSTALL) -m 755 $(addprefix $(B)/,$(INSTALL_TOOLS)) $(DESTDIR)$(BINDIR)/
	$(INSTALL) -m 644 $(call install_headers_in,.) $(DESTDIR)$(INCLUDEDIR)/ddp/
	$(foreach d,$(INSTALL_HDR_SUBDIRS),$(INSTALL) -m 644 $(call install_headers_in,$(d)) $(DESTDIR)$(INCLUDEDIR)/ddp/$(d)/ &&) true
	$(INSTALL) -m 644 $(B)/ddp.pc $(DESTDIR)$(PKGCONFIGDIR)/ddp.pc

uninstall:
	rm -f $(addprefix $(DESTDIR)$(BINDIR)/,$(INSTALL_TOOLS)) $(DESTDIR)$(PKGCONFIGDIR)/ddp.pc
	rm -f $(addprefix $(DESTDIR)$(INCLUDEDIR)/ddp/,$(INSTALL_HEADERS))
	@m=$(DESTDIR)$(INCLUDEDIR)/ddp/.install-dirs; made=''; \
	if [ -z '$(DESTDIR)' ] && [ -f "$$m" ]; then made=$$(cat "$$m"); rm -f "$$m"; fi; \
	for d in $$(printf '%s\n' $(INSTALL_HDR_DIRS) $$made | LC_ALL=C sort -r -u); do \
	  [ -d "$$d" ] && ! rmdir "$$d" 2>/dev/null && case $$d in $(DESTDIR)$(INCLUDEDIR)/ddp*) \
	    echo "uninstall: kept $$d (not empty)" >&2;; esac; \
	done; true
