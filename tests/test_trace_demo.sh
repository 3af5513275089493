#!/bin/sh
# SPDX-License-Identifier: MIT (see LICENSE)
# tests/test_trace_demo.sh — `make demo`'s program (build/train_mlp on 4 ranks) under
# `ddprun --trace`: the merged file is valid Chrome trace JSON (python3's json module), every
# event complete (name, ph "X", ts, dur >= 0, pid = a rank, tid), all four ranks present, the
# reducer's buckets on their own row. Run from the repository root; prints TAP.
set -u
tmp=$(mktemp -d "${TMPDIR:-/tmp}/trace_demo.XXXXXX") || { echo "Bail out! mktemp failed"; exit 1; }
trap 'rm -rf "$tmp"' EXIT
. "$(dirname "$0")/tap.sh"
echo "1..3"
unset DDP_TRACE DDP_TRANSPORT
if ! make -s --no-print-directory build/ddprun build/train_mlp > "$tmp/why" 2>&1; then
    notok "build ddprun and train_mlp"; sed 's/^/#   /' "$tmp/why"; exit 1
fi
demo() { timeout 300 build/ddprun --trace "$tmp/demo.json" -n 4 build/train_mlp > "$tmp/out" 2>&1 ||
         { why "$(tail -5 "$tmp/out")"; return 1; }; grep -q "train_mlp: PASS" "$tmp/out"; }
check "ddprun --trace FILE -n 4 build/train_mlp passes and merges the ranks' traces" demo
valid() {
    /usr/bin/python3 - "$tmp/demo.json" > "$tmp/why" 2>&1 <<'PY'
import json, sys, collections
d = json.load(open(sys.argv[1]))
assert isinstance(d, list) and d, "not a non-empty JSON array"
for e in d:
    for k in ("name", "ph", "ts", "dur", "pid", "tid", "args"):
        assert k in e, "event without %s: %r" % (k, e)
    assert e["ph"] == "X" and e["dur"] >= 0 and e["pid"] in (0, 1, 2, 3), e
rows = collections.Counter((e["pid"], e["tid"]) for e in d)
assert {p for p, _ in rows} == {0, 1, 2, 3}, rows
assert any(t == 2 for _, t in rows), "no reducer bucket row"
print("%d events, rows %s" % (len(d), sorted(rows.items())))
PY
}
if [ -x /usr/bin/python3 ]; then check "the merged trace is valid Chrome trace JSON: complete events from all 4 ranks, the buckets' row" valid
else ok "trace validity # SKIP no /usr/bin/python3"; fi
[ -s "$tmp/why" ] && sed 's/^/# /' "$tmp/why" | head -3
parts() { ! ls "$tmp"/demo.json.*.part > /dev/null 2>&1; }
check "the ranks' part files are gone after the merge" parts
