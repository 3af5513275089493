# SPDX-License-Identifier: MIT (see LICENSE)
# tests/state_sync_mutants.sh — shows that test_state_sync's detection scenarios guard what they
# claim: each mutant below disables one check of ddp_state.h (in a copy of the headers under
# $TMPDIR) and the scenario that guards it must then FAIL. Not part of make test (it compiles the
# test four times); run from the repository root: bash tests/state_sync_mutants.sh
set -u
tmp=$(mktemp -d "${TMPDIR:-/tmp}/state-mutants.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
status=0
n=0
echo "1..4"

# mutant NAME SCENARIO OLD NEW: the test, built against ddp_state.h with OLD replaced by NEW
# (exactly once), must print at least one "not ok" in SCENARIO.
mutant() {
    name=$1 scenario=$2 old=$3 new=$4
    n=$((n + 1))
    rm -rf "$tmp/h" && mkdir -p "$tmp/h/transports" "$tmp/h/tests"
    cp ./*.h "$tmp/h/" && cp transports/*.h "$tmp/h/transports/" && cp tests/*.h "$tmp/h/tests/"
    if ! python3 - "$tmp/h/ddp_state.h" "$old" "$new" <<'EOF'
import sys
p, old, new = sys.argv[1:4]
s = open(p).read()
if s.count(old) != 1:
    sys.exit("the mutated line is not in ddp_state.h exactly once: " + old)
open(p, "w").write(s.replace(old, new))
EOF
    then echo "not ok $n - $name: could not apply"; status=1; return; fi
    if ! ${CC:-cc} -std=c99 -O1 -I"$tmp/h" tests/test_state_sync.c -o "$tmp/t" -pthread -lm; then
        echo "not ok $n - $name: does not compile"; status=1; return
    fi
    fails=$(DDP_TEST_ONLY=$scenario timeout 600 "$tmp/t" 2>/dev/null | grep -c '^not ok')
    if [ "$fails" -gt 0 ]; then echo "ok $n - $name: scenario '$scenario' fails ($fails checks)"
    else echo "not ok $n - $name: scenario '$scenario' still passes"; status=1; fi
}

mutant "share digests not compared" corrupt \
    'if (k[i].sum != rec[i])' 'if (0 && k[i].sum != rec[i])'
mutant "what arrived not hashed" corrupt \
    '        if (hash) _ddp_state_hash(k, p, n, total);' \
    '        if (hash == 1) _ddp_state_hash(k, p, n, total); else if (hash == 2) k->off += n;'
mutant "senders' digests not compared (check_senders)" senders \
    '    if (r0[_DDP_SR_CHECK])' '    if (0 && r0[_DDP_SR_CHECK])'
mutant "buffer sizes not compared" refuse \
    '        if (x[_DDP_SR_SIZES] != r0[_DDP_SR_SIZES] || x[_DDP_SR_TOTAL] != r0[_DDP_SR_TOTAL]) {' \
    '        if (0) {'
exit $status
