# SPDX-License-Identifier: MIT (see LICENSE)
# tests/powersgd_mutants.sh — shows that test_powersgd's scenarios guard what they claim: each
# mutant below breaks one step of ddp_powersgd.h (or the reducer's comm_hook_done rule) in a copy
# of the headers under $TMPDIR, and the scenario that guards it must then FAIL. Not part of make
# test (it compiles the library once per mutant); run from the repository root:
# bash tests/powersgd_mutants.sh
set -u
tmp=$(mktemp -d "${TMPDIR:-/tmp}/powersgd-mutants.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
status=0
n=0
echo "1..9"

# The device scenario finds the fake NCCL beside the binary (make build/fake_nccl/libnccl.so.2).
[ -d build/fake_nccl ] && ln -s "$PWD/build/fake_nccl" "$tmp/fake_nccl"

# mutant NAME FILE SCENARIO OLD NEW: the test, built against FILE with every OLD replaced by NEW
# (at least one), must print at least one "not ok" in SCENARIO (or not finish: the watchdog).
mutant() {
    name=$1 file=$2 scenario=$3 old=$4 new=$5
    n=$((n + 1))
    rm -rf "$tmp/h" && mkdir -p "$tmp/h/transports" "$tmp/h/tests"
    cp ./*.h "$tmp/h/" && cp transports/*.h "$tmp/h/transports/" && cp tests/*.h tests/libddp.c "$tmp/h/tests/"
    if ! python3 - "$tmp/h/$file" "$old" "$new" <<'EOF'
import sys
p, old, new = sys.argv[1:4]
s = open(p).read()
if old not in s:
    sys.exit("the mutated text is not in " + p + ": " + old)
open(p, "w").write(s.replace(old, new))
EOF
    then echo "not ok $n - $name: could not apply"; status=1; return; fi
    if ! ${CC:-cc} -std=c99 -O1 -I"$tmp/h" -DT_IMPL_SHM=1 -DT_IMPL_NCCL=1 -c "$tmp/h/tests/libddp.c" -o "$tmp/lib.o" ||
       ! ${CC:-cc} -std=c99 -O1 -I"$tmp/h" tests/test_powersgd.c "$tmp/lib.o" -o "$tmp/t" -pthread -lm; then
        echo "not ok $n - $name: does not compile"; status=1; return
    fi
    out=$(DDP_TEST_ONLY=$scenario timeout 600 "$tmp/t" 2>/dev/null)
    fails=$(printf '%s\n' "$out" | grep -c '^not ok')
    if [ "$fails" -gt 0 ]; then echo "ok $n - $name: scenario '$scenario' fails ($fails checks)"
    else echo "not ok $n - $name: scenario '$scenario' still passes"; status=1; fi
}

mutant "error feedback computed but never added" ddp_powersgd.h feedback \
    'double v = _ddp_psgd_get(x, f32, i) + _ddp_psgd_get(e, f32, i);' 'double v = _ddp_psgd_get(x, f32, i);'
mutant "fresh Q's every step despite warm start" ddp_powersgd.h warm \
    'if (!b->q_valid || ps->d.no_warm_start) _ddp_psgd_random_q(ps, b);' '_ddp_psgd_random_q(ps, b);'
mutant "P not orthogonalised" ddp_powersgd.h reference \
    '_ddp_psgd_ortho_d(p, m->rows, m->rank, eps);' '(void)eps;'
mutant "Q's sum not divided by the world size" ddp_powersgd.h reference \
    '_ddp_psgd_set(q, f32, i, _ddp_psgd_get(q, f32, i) / world);' '(void)world;'
mutant "uncompressed tensors' sum not divided by the world size" ddp_powersgd.h reference \
    '_ddp_psgd_get(b->send + sg->at * es, f32, i) / world);' '_ddp_psgd_get(b->send + sg->at * es, f32, i));'
mutant "min_compression_rate ignored" ddp_powersgd.h rate \
    '(double)(rows + cols) * (double)r * ps->d.min_compression_rate <' '(double)(rows + cols) * (double)r * 2.0 <'
mutant "comm_hook_done run from grad_ready's poll" ddp_reducer.h done \
    '    if (r->d.comm_hook_done) return;' ''
mutant "device buckets not refused" ddp_powersgd.h device \
    'if (ddp_comm_is_device(comm, buf))' 'if (0)'
mutant "no agreement on the step count on a new communicator" ddp_powersgd.h rejoin \
    'if (k == 0 && comm != ps->comm &&' 'if (0 && k == 0 && comm != ps->comm &&'
exit $status
