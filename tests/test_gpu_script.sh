#!/bin/sh
# SPDX-License-Identifier: MIT (see LICENSE)
# tests/test_gpu_script.sh — tests/gpu/test_gpu.sh (make test-gpu) where there is no GPU: its dry
# run (the libraries it finds, in its documented order, and the commands it would run) and its
# clean skip. Run from the repository root (prove tests/test_gpu_script.sh); prints TAP. The
# library search reads fake sources (TEST_GPU_LDCONFIG, TEST_GPU_CUDA_DIRS, TEST_GPU_PYTHONS) and
# nvidia-smi is a stand-in (TEST_GPU_NVIDIA_SMI), so the result does not depend on this machine.
# Nothing here touches a GPU or compiles anything; the file takes about a second.
set -u

S=tests/gpu/test_gpu.sh
tmp=$(mktemp -d "${TMPDIR:-/tmp}/gpu_script_test.XXXXXX") || { echo "Bail out! mktemp failed"; exit 1; }
trap 'rm -rf "$tmp"' EXIT
tmp=$(cd "$tmp" && pwd -P)   # the script prints physical paths
unset DDP_CUDART_LIBRARY DDP_NCCL_LIBRARY DDP_TEST_ONLY TEST_GPU_RANKS CUDA_VISIBLE_DEVICES DRY OUT
T="timeout -k 2 30"

echo "1..14"
# shellcheck source=tests/tap.sh
. "$(dirname "$0")/tap.sh"   # ok, notok, check, why

# --- the stand-ins -------------------------------------------------------------------------
mkdir -p "$tmp/bin" "$tmp/cuda" "$tmp/site/nvidia/nccl/lib" "$tmp/site/nvidia/cu13/lib" "$tmp/sys"
: > "$tmp/site/nvidia/nccl/lib/libnccl.so.2"
: > "$tmp/site/nvidia/cu13/lib/libcudart.so.13"
# a Python whose nvidia.nccl and nvidia.cu13 live under $tmp/site (it ignores the program it is fed)
cat > "$tmp/bin/python3" << EOF
#!/bin/sh
cat > /dev/null
printf 'nvidia.nccl\t%s\n' "$tmp/site/nvidia/nccl/lib"
printf 'nvidia.cu13\t%s\n' "$tmp/site/nvidia/cu13/lib"
EOF
# nvidia-smi without a driver, and one with GPUs (FAKE_GPUS of them)
cat > "$tmp/bin/smi-nodriver" << 'EOF'
#!/bin/sh
echo "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."
exit 9
EOF
cat > "$tmp/bin/smi-gpus" << 'EOF'
#!/bin/sh
i=0
while [ "$i" -lt "${FAKE_GPUS:-1}" ]; do echo "GPU $i: Stand-in GPU (UUID: GPU-$i)"; i=$((i + 1)); done
EOF
chmod +x "$tmp/bin/python3" "$tmp/bin/smi-nodriver" "$tmp/bin/smi-gpus"
printf '#!/bin/sh\nexit 1\n' > "$tmp/bin/ldconfig-empty"
chmod +x "$tmp/bin/ldconfig-empty"

# dry OUT ENV...: the dry run with the fake sources (no cache, no CUDA folder, the fake Python)
# and ENV on top; its output in $tmp/OUT, exit status in $rc
dry() {
    name=$1; shift
    $T env TEST_GPU_LDCONFIG="$tmp/bin/ldconfig-empty" TEST_GPU_CUDA_DIRS="$tmp/cuda" \
        TEST_GPU_PYTHONS="$tmp/bin/python3" TEST_GPU_NVIDIA_SMI="$tmp/bin/smi-nodriver" "$@" \
        bash "$S" --dry-run > "$tmp/$name" 2>&1
    rc=$?
}
# the state of build/gpu: names, times, sizes (a dry run or a skip must leave it as it was)
state() { find build/gpu -maxdepth 1 -printf '%p %T@ %s\n' 2> /dev/null | sort | md5sum; }
has() { grep -qF -- "$2" "$tmp/$1" || { why "no '$2' in the output:"; sed 's/^/  /' "$tmp/$1" | head -n 40 >> "$tmp/why"; return 1; }; }
hasnt() { ! grep -qF -- "$2" "$tmp/$1" || { why "'$2' in the output:"; grep -F -- "$2" "$tmp/$1" | head -n 5 >> "$tmp/why"; return 1; }; }

check "the script parses (bash -n)" bash -n "$S"

# --- 2-4: the dry run on a machine without a GPU ---------------------------------------------
dry py
dry_py() {
    [ "$rc" = 0 ] || { why "exit $rc"; return 1; }
    has py "no GPU here" && has py "plan below is for one GPU" &&
    has py "CUDA runtime: $tmp/site/nvidia/cu13/lib/libcudart.so.13 [Python environment of $tmp/bin/python3 (package nvidia.cu13)]" &&
    has py "NCCL:         $tmp/site/nvidia/nccl/lib/libnccl.so.2 [Python environment of $tmp/bin/python3 (package nvidia.nccl)]" &&
    has py "export DDP_CUDART_LIBRARY=$tmp/site/nvidia/cu13/lib/libcudart.so.13 DDP_NCCL_LIBRARY=$tmp/site/nvidia/nccl/lib/libnccl.so.2"
}
check "dry run, no GPU, NCCL and the runtime only in a Python environment: exit 0, both found there and exported as absolute paths" dry_py
dry_cmds() {
    has py "cc -std=c99" && has py "tests/test_nccl.c -o build/gpu/test_nccl" && has py "bench/nccl_raw.c -o build/gpu/nccl-raw" &&
    has py "env T_DEVICE_REAL=1 T_DEVICE_RANKS=1 'DDP_TEST_ONLY=device matrix tcp p=1' build/gpu/test_nccl" &&
    has py "env T_DEVICE_REAL=1 T_DEVICE_RANKS=3 T_DEVICE_HOSTID=gpu-m3 NCCL_SOCKET_IFNAME=lo 'DDP_TEST_ONLY=device matrix tcp p=3' build/gpu/test_nccl_rooted" &&
    has py "T_NCCL_SCENARIOS_ONLY=1" &&
    has py "build/gpu/ddprun -n 2 sh -c 'NCCL_HOSTID=gpu-b-h\$RANK exec \"\$0\" \"\$@\"' build/gpu/nccl-raw" &&
    has py "build/gpu/ddp-bench --transport nccl -o all_reduce" && has py "-J build/gpu/bench_ddp_p3.json" &&
    hasnt py "-Werror"
}
check "dry run lists the build (no -Werror), the matrices at p = 1, 2, 3 (ranks > 1 as NCCL hosts of one GPU), the scenarios and both benchmarks under ddprun" dry_cmds
mkdir -p "$tmp/wd"
nothing_written() {
    # the script works from the repository root; a dry run must not create or change build/gpu
    before=$(state)
    dry again
    after=$(state)
    [ "$rc" = 0 ] || { why "exit $rc"; return 1; }
    [ "$before" = "$after" ] || { why "build/gpu changed"; return 1; }
}
check "the dry run writes nothing (build/gpu untouched)" nothing_written

# --- 5-9: the search order ---------------------------------------------------------------------
mkdir -p "$tmp/cuda/targets/x86_64-linux/lib" "$tmp/cuda/lib64"
: > "$tmp/cuda/lib64/libcudart.so"   # the development link: never taken
dry unversioned
check "an unversioned libcudart.so in a CUDA folder is not taken (the Python one is)" \
    has unversioned "CUDA runtime: $tmp/site/nvidia/cu13/lib/libcudart.so.13 [Python"
: > "$tmp/cuda/targets/x86_64-linux/lib/libcudart.so.12"
dry cudahome
check "a CUDA folder (targets/*/lib) comes before the Python environments; NCCL still from Python" sh -c "
    grep -qF 'CUDA runtime: $tmp/cuda/targets/x86_64-linux/lib/libcudart.so.12 [CUDA install $tmp/cuda]' '$tmp/cudahome' &&
    grep -qF 'NCCL:         $tmp/site/nvidia/nccl/lib/libnccl.so.2 [Python' '$tmp/cudahome'"
: > "$tmp/sys/libnccl.so.2"
: > "$tmp/sys/libcudart.so.13"
cat > "$tmp/bin/ldconfig-fake" << EOF
#!/bin/sh
printf '3 libs found in cache\n'
printf '\tlibnccl.so.2 (libc6) => /nonexistent/i386/libnccl.so.2\n'
printf '\tlibnccl.so.2 (libc6,x86-64) => $tmp/sys/libnccl.so.2\n'
printf '\tlibcudart.so (libc6,x86-64) => /nonexistent/libcudart.so\n'
printf '\tlibcudart.so.13 (libc6,x86-64) => $tmp/sys/libcudart.so.13\n'
EOF
chmod +x "$tmp/bin/ldconfig-fake"
dry cache TEST_GPU_LDCONFIG="$tmp/bin/ldconfig-fake"
cache_ok() {
    has cache "CUDA runtime: $tmp/sys/libcudart.so.13 [the loader's cache (ldconfig -p: libcudart.so.13)]" || return 1
    [ "$(uname -m)" = x86_64 ] || return 0   # the entry for this architecture: checked where it is x86-64
    has cache "NCCL:         $tmp/sys/libnccl.so.2 [the loader's cache"
}
check "the loader's cache comes before CUDA folders, this architecture's entry, the versioned soname" cache_ok
mkdir -p "$tmp/ld"
: > "$tmp/ld/libnccl.so.2"
dry ldpath TEST_GPU_LDCONFIG="$tmp/bin/ldconfig-fake" LD_LIBRARY_PATH="/nonexistent:$tmp/ld"
check "LD_LIBRARY_PATH comes before the cache" has ldpath "NCCL:         $tmp/ld/libnccl.so.2 [LD_LIBRARY_PATH ($tmp/ld)]"
: > "$tmp/mine.so"
dry user TEST_GPU_LDCONFIG="$tmp/bin/ldconfig-fake" DDP_NCCL_LIBRARY="$tmp/wd/../mine.so"
check "DDP_NCCL_LIBRARY wins, made absolute" has user "NCCL:         $tmp/mine.so [DDP_NCCL_LIBRARY is set]"

# --- 10: nothing found -----------------------------------------------------------------------
dry none TEST_GPU_PYTHONS="" TEST_GPU_CUDA_DIRS=""
none_ok() {
    [ "$rc" = 0 ] && has none "build/gpu/test_nccl" &&
    { grep -qE '^test-gpu: NCCL: +\[not found \(looked in:' "$tmp/none" || { why "no 'not found' for NCCL"; return 1; }; }
}
check "dry run with no library anywhere: exit 0, says what it searched, still lists the commands" none_ok

# --- 11-12: GPUs present (stand-in nvidia-smi), dry run ------------------------------------------
dry one TEST_GPU_NVIDIA_SMI="$tmp/bin/smi-gpus" FAKE_GPUS=1
check "one GPU listed: dry run plans world sizes 1 2 3 on it" sh -c "
    grep -qF 'dry run: 1 GPU, world sizes 1 2 3' '$tmp/one' && ! grep -qF 'no GPU here' '$tmp/one'"
dry four TEST_GPU_NVIDIA_SMI="$tmp/bin/smi-gpus" FAKE_GPUS=4
check "four GPUs: world sizes 1 2 4, one rank per GPU (no NCCL_HOSTID, no T_DEVICE_HOSTID)" sh -c "
    grep -qF 'dry run: 4 GPUs, world sizes 1 2 4' '$tmp/four' && grep -qF 'build/gpu/ddprun -n 4 build/gpu/nccl-raw' '$tmp/four' &&
    ! grep -qF 'HOSTID' '$tmp/four'"

# --- 13-14: the real run without a GPU: one line, exit 0, nothing built ---------------------------
skip_ok() {
    smi=$1
    before=$(state)
    $T env TEST_GPU_NVIDIA_SMI="$smi" bash "$S" > "$tmp/skip" 2>&1
    rc=$?
    after=$(state)
    [ "$rc" = 0 ] || { why "exit $rc"; cat "$tmp/skip" >> "$tmp/why"; return 1; }
    if [ "$(wc -l < "$tmp/skip")" -ne 1 ] || ! grep -q '^test-gpu: skipped: no GPU here (.*)$' "$tmp/skip"; then
        why "not one 'skipped' line:"; cat "$tmp/skip" >> "$tmp/why"; return 1
    fi
    [ "$before" = "$after" ] || { why "build/gpu changed"; return 1; }
    grep -qF -- "$2" "$tmp/skip" || { why "no '$2' in: $(cat "$tmp/skip")"; return 1; }
}
check "no nvidia-smi: the real run prints one 'skipped' line and exits 0" skip_ok "$tmp/bin/no-such-smi" "not found"
check "nvidia-smi without a driver: skipped, saying what nvidia-smi answered, exit 0" skip_ok "$tmp/bin/smi-nodriver" "couldn't communicate"
