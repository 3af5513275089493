#!/usr/bin/env python3
# SPDX-License-Identifier: MIT (see LICENSE)
"""bench/compare_summary.py — the tables of `make compare` (bench/compare.sh), from its raw results.

Run by compare.sh (which sets the environment below); can be re-run by hand on an old run:
    RAW=build/compare_raw OUT=bench/results/compare.json python3 bench/compare_summary.py

One table per world size: rows = sizes; for each implementation busbw (GB/s) and latency (us:
the per-call p50 up to 64 KiB, the mean time per call above); then the ratios libddp/peer. Reads
the JSON of ddp-bench / allreduce_bench, mpi_allreduce_bench and gloo_bench (bench_common.h's
schema, old or new: only all_reduce, in-place rows are used). Writes OUT (JSON, every raw result
included) and the markdown table next to it (compare.md) for the README.

Then, where compare.sh measured the machine's limits beside every round (limit_mem_pP_rR.json
from bench/mem_limit.c: memcpy and a+b; limit_tcp_pP_rR.json from tcp_stream --bidir: both
directions at once), one more table per world size: the limits (medians over the rounds) and the
share of its limit each libddp configuration reached: shm busbw / memcpy, tcp busbw / the loopback
per direction, computed per round (a run over the limit measured beside it, the same size, the
same p) and then the median over the rounds, so that the placement of the moment cancels out. A
limit run that other load disturbed is replaced by the median of the undisturbed ones (of any p:
a limit does not depend on p) where there are any; '!' marks what rests on disturbed runs only.

A run during which other processes used more than CLEAN_CORES (default 0.25) cores is
"disturbed": the medians use only the undisturbed runs of each (configuration, p) when there are
any, and mark the cell with '!' when there are none.
"""
import datetime
import glob
import hashlib
import json
import os
import platform
import re
import statistics
import subprocess

env = os.environ.get
raw, out = env("RAW", "build/compare_raw"), env("OUT", "bench/results/compare.json")
md_path = os.path.join(os.path.dirname(out) or ".", "compare.md")
nps = [int(x) for x in env("NP", "2 4").split()]
clean_cores = float(env("CLEAN_CORES", "0.25"))
LAT_MAX = 64 << 10   # latency = p50 up to here (what the benches print p50 for), mean time above

IMPLS = [  # key, label, what the bench's own description leaves out
    ("ddp_tcp", "libddp tcp", ""),
    ("mpi_tcp", "Open MPI tcp", "pml ob1, btl self,tcp over lo"),
    ("gloo_tcp", "Gloo tcp", ""),
    ("ddp_shm", "libddp shm", ""),
    ("ddp_shm_reg", "libddp shm reg", "ddp-bench --transport shm --registered 1: buffers from ddp_comm_mem_alloc"),
    ("mpi_vader", "Open MPI vader", "pml ob1, btl self,vader (shared memory)"),
    ("ddp_x", "libddp x", "ddp-bench " + env("LIBDDP_X_ARGS", "")),
]
LABEL = {k: l for k, l, _ in IMPLS}
RATIOS = [  # (libddp, peer, short header)
    ("ddp_tcp", "mpi_tcp", "ddp/MPI tcp"),
    ("ddp_tcp", "gloo_tcp", "ddp/Gloo tcp"),
    ("ddp_shm", "mpi_vader", "ddp shm/vader"),
]


def load_json(path):
    with open(path) as f:
        return json.load(f)


runs, loads = {}, {}
for path in sorted(glob.glob(raw + "/*.json")):
    name = os.path.basename(path)[:-5]
    try:
        runs[name] = load_json(path)
    except (OSError, ValueError) as e:
        print("compare_summary: skipping %s: %s" % (path, e))
        continue
    lp = os.path.join(raw, name + ".load")
    if os.path.exists(lp):
        e, mine, other = (float(x) for x in open(lp).read().split())
        loads[name] = {"elapsed_s": e, "own_cores": mine, "other_cores": other}


def sweep_rows(d):
    """The in-place all_reduce rows of one bench JSON, old schema (no placement) or new."""
    if d.get("mode", "sweep") != "sweep" or d.get("collective", d.get("bench", "all_reduce")) != "all_reduce":
        return []
    return [r for r in d.get("results", []) if r.get("inplace", d.get("inplace", 1)) in (1, True)]


def latency(r):
    return r["p50_us"] if r["bytes"] <= LAT_MAX else r["time_us"]


def collect(impl, p):
    """bytes -> (rows of the undisturbed runs or, if none, of all runs; disturbed?)"""
    clean, every = {}, {}
    for name, d in runs.items():
        if not re.match(r"%s_p%d_r\d+$" % (impl, p), name):
            continue
        ok = loads.get(name, {}).get("other_cores", 0.0) <= clean_cores
        for r in sweep_rows(d):
            every.setdefault(r["bytes"], []).append(r)
            if ok:
                clean.setdefault(r["bytes"], []).append(r)
    return {b: (clean[b], False) if b in clean else (rs, True) for b, rs in every.items()}


present = [k for k, _, _ in IMPLS if any(re.match(r"%s_p\d+_r\d+$" % k, n) for n in runs)]
ratios = [(a, b, h) for a, b, h in RATIOS if a in present and b in present]
tables = {}   # p -> bytes -> impl -> cell
for p in nps:
    t = tables.setdefault(p, {})
    for impl in present:
        for b, (rs, disturbed) in collect(impl, p).items():
            t.setdefault(b, {})[impl] = {
                "busbw_GBs": statistics.median(r["busbw_GBs"] for r in rs),
                "lat_us": statistics.median(latency(r) for r in rs),
                "lat_is": "p50" if b <= LAT_MAX else "mean",
                "time_us": statistics.median(r["time_us"] for r in rs),
                "p50_us": statistics.median(r["p50_us"] for r in rs),
                "p99_us": statistics.median(r["p99_us"] for r in rs),
                "cpu_cores": statistics.median(r.get("cpu_cores", 0.0) for r in rs),
                "n": len(rs), "disturbed": disturbed,
                "wrong": max(r.get("wrong", 0) for r in rs),
                "all_busbw": [r["busbw_GBs"] for r in rs], "all_lat_us": [latency(r) for r in rs]}


# ---- the machine's limits, beside every round ----
LIMITS = [  # key, label, what
    ("memcpy", "memcpy", "memcpy, one thread (GB/s copied)"),
    ("add", "a+b", "c = a + b over float with libddp's kernel (ddp_reduce_local), one thread (GB/s of c)"),
    ("bidir", "tcp2way", "TCP loopback, both directions at once on one connection (GB/s per direction)"),
]
LIMIT_LABEL = {k: l for k, l, _ in LIMITS}
x_args = " %s " % env("LIBDDP_X_ARGS", "")
LIMIT_OF = {"ddp_shm": "memcpy", "ddp_shm_reg": "memcpy", "ddp_tcp": "bidir",  # config -> its limit
            "ddp_x": "bidir" if "tcp" in x_args else "memcpy"}
limit_runs = {}   # (p, round) -> "memcpy"/"add"/"bidir" -> {"GBs": {bytes: GB/s}, "other_cores": x}
for name, d in runs.items():
    m = re.match(r"limit_(mem|tcp)_p(\d+)_r(\d+)$", name)
    if not m:
        continue
    lr = limit_runs.setdefault((int(m.group(2)), int(m.group(3))), {})
    other = loads.get(name, {}).get("other_cores", 0.0)
    if m.group(1) == "mem":
        lr["memcpy"] = {"GBs": {r["bytes"]: r["memcpy_GBs"] for r in d.get("results", [])}, "other_cores": other}
        lr["add"] = {"GBs": {r["bytes"]: r["add_GBs"] for r in d.get("results", [])}, "other_cores": other}
    else:
        lr["bidir"] = {"GBs": {r["bytes"]: r["GBs_per_direction"] for r in d.get("bidir", [])}, "other_cores": other}


def limit_at(lr, kind, b):
    """(GB/s, undisturbed?) of limit kind at b bytes in one round's limits, or None."""
    k = lr.get(kind)
    return (k["GBs"][b], k["other_cores"] <= clean_cores) if k and b in k["GBs"] else None


def limit_cell(kind, b, p=None):
    """The median of limit kind at b bytes over the undisturbed rounds (of world size p; None:
    all), or over every round, marked disturbed, when none was undisturbed."""
    every = [limit_at(lr, kind, b) for (q, _), lr in limit_runs.items() if p is None or q == p]
    every = [x for x in every if x]
    clean = [v for v, ok in every if ok]
    if not every:
        return None
    vals = clean or [v for v, _ in every]
    return {"GBs": statistics.median(vals), "n": len(vals), "disturbed": not clean, "all": [v for v, _ in every]}


def limit_shown(kind, b, p):
    """The limit of world size p's table: the median of its own rounds when one of them was
    undisturbed, else of every world size's (a limit does not depend on p)."""
    c = limit_cell(kind, b, p)
    if c is None or c["disturbed"]:
        c_all = limit_cell(kind, b)
        if c_all and (c is None or not c_all["disturbed"]):
            return c_all
    return c


def share_cell(impl, p, b):
    """Median over the runs of impl at p (the undisturbed ones if any) of busbw / the limit
    measured beside the same round at the same p and size; when that limit run was disturbed
    (other load ate into it, so it would flatter the share), the median of the undisturbed limit
    runs instead, if there are any."""
    kind = LIMIT_OF.get(impl)
    every = []   # (share, run undisturbed?, limit undisturbed?)
    for name, d in runs.items():
        m = re.match(r"%s_p%d_r(\d+)$" % (impl, p), name)
        lim = limit_at(limit_runs.get((p, int(m.group(1))), {}), kind, b) if m else None
        if m and (not lim or not lim[1]):
            c = limit_cell(kind, b)
            if c and not c["disturbed"]:
                lim = (c["GBs"], True)
        if not lim or lim[0] <= 0:
            continue
        ok = loads.get(name, {}).get("other_cores", 0.0) <= clean_cores
        every += [(r["busbw_GBs"] / lim[0], ok, lim[1]) for r in sweep_rows(d) if r["bytes"] == b]
    if not every:
        return None
    used = [x for x in every if x[1]] or every
    return {"limit": kind, "share": statistics.median(v for v, _, _ in used), "n": len(used),
            "all": [v for v, _, _ in every], "disturbed": not any(x[1] for x in every) or not all(x[2] for x in used)}


limit_kinds = [k for k, _, _ in LIMITS if any(k in lr for lr in limit_runs.values())]
share_impls = [k for k in present if LIMIT_OF.get(k) in limit_kinds]
shares = {}   # p -> bytes -> {"limits": {kind: cell}, impl: share cell}
for p in nps:
    sizes = sorted({b for (q, _), lr in limit_runs.items() if q == p for k in limit_kinds
                    for b in lr.get(k, {}).get("GBs", {})})
    for b in sizes:
        row = shares.setdefault(p, {}).setdefault(b, {"limits": {}})
        for k in limit_kinds:
            c = limit_shown(k, b, p)
            if c:
                row["limits"][k] = c
        for k in share_impls:
            c = share_cell(k, p, b)
            if c:
                row[k] = c


def ratio_of(cells, a, b):
    """busbw: a/b; latency: b's time / a's time: > 1 means a (libddp) is faster in both."""
    ca, cb = cells.get(a), cells.get(b)
    if not ca or not cb:
        return None
    return {"busbw": ca["busbw_GBs"] / cb["busbw_GBs"] if cb["busbw_GBs"] > 0 else None,
            "latency": cb["lat_us"] / ca["lat_us"] if ca["lat_us"] > 0 else None,
            "disturbed": ca["disturbed"] or cb["disturbed"]}


def human(b):
    for s, n in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= n and b % n == 0:
            return "%d %s" % (b // n, s)
    return "%d B" % b


def fbw(v):
    return "%.3f" % v if v < 10 else "%.2f" % v


def flat(v):
    return "%.2f" % v if v < 100 else "%.1f" % v if v < 10000 else "%.0f" % v


def fr(v):
    return "-" if v is None else "%.2f" % v if v < 10 else "%.1f" % v if v < 100 else "%.0f" % v


def description(k):
    return next((runs[n].get("description") for n in sorted(runs) if re.match(r"%s_p\d+_r\d+$" % k, n)), None)


# ---- terminal tables ----
W_BW, W_LAT, W_R = 7, 8, 6
lines = []
nrounds = env("ROUNDS", "?")
for p in nps:
    t = tables[p]
    if not t:
        continue
    head1 = "%8s |" % ("p = %d" % p)
    head2 = "%8s |" % "size"
    for k in present:
        head1 += " %-*s |" % (W_BW + W_LAT + 1, LABEL[k])
        head2 += " %*s %*s |" % (W_BW, "GB/s", W_LAT, "us")
    for a, b, h in ratios:
        head1 += " %-*s |" % (2 * W_R + 2, h)
        head2 += " %*s %*s |" % (W_R, "bw", W_R + 1, "lat")
    lines += [head1, head2, "-" * len(head2)]
    for b in sorted(t):
        row = "%8s |" % human(b).replace(" ", "")
        for k in present:
            c = t[b].get(k)
            if not c:
                row += " %*s %*s |" % (W_BW, "-", W_LAT, "-")
                continue
            mark = "!" if c["disturbed"] else " "
            row += " %*s %*s%s|" % (W_BW, fbw(c["busbw_GBs"]), W_LAT, flat(c["lat_us"]), mark)
        for a, bb, h in ratios:
            r = ratio_of(t[b], a, bb)
            if not r:
                row += " %*s %*s |" % (W_R, "-", W_R + 1, "-")
                continue
            mark = "!" if r["disturbed"] else " "
            row += " %*s %*s%s|" % (W_R, fr(r["busbw"]), W_R + 1, fr(r["latency"]), mark)
        lines.append(row)
    lines.append("")

legend = [
    "all_reduce, float sum, in place, -O2; median over the undisturbed runs of %s round(s)" % nrounds,
    "  ('!': every run of that cell was disturbed by other load, or a ratio uses such a cell: do not trust it).",
    "GB/s = busbw = algbw * 2(p-1)/p, GB = 1e9 B. us = latency per call: p50 for sizes <= 64 KiB,",
    "  mean time per call above. Ratios, both oriented so that > 1 means libddp is faster:",
    "  bw = libddp busbw / peer busbw;  lat = peer latency / libddp latency.",
]
for k, l, what in IMPLS:
    if k in present:
        legend.append("  %-15s %s" % (l + ":", "; ".join(x for x in (description(k), what) if x)))
missing = env("MISSING", "").split()
build_failed = env("BUILD_FAILED", "").split()
for peer, name in (("mpi", "Open MPI"), ("gloo", "Gloo")):
    if peer in missing:
        legend.append("  %s: not installed, not measured (%s)" % (name, env("NEEDS", "")))
    if peer in build_failed:
        legend.append("  %s: its peer program did not build, not measured (build/compare_raw/build_%s.log)"
                      % (name, peer))
if "ddp_shm" not in present:
    legend.append("  libddp shm: not measured (no shared-memory transport in the libddp bench)")
lines = legend + [""] + lines

# ---- the shares of the machine's limits ----
W_SH = 8
for p in nps:
    t = shares.get(p)
    if not t:
        continue
    head1 = "%8s |" % ("p = %d" % p)
    head2 = "%8s |" % "size"
    head1 += " %-*s |" % ((W_BW + 1) * len(limit_kinds) - 1, "limits, GB/s")
    head2 += "".join(" %*s" % (W_BW, LIMIT_LABEL[k]) for k in limit_kinds) + " |"
    for k in share_impls:
        head1 += " %-*s |" % (W_BW + W_SH + 1, LABEL[k])
        head2 += " %*s %*s |" % (W_BW, "GB/s", W_SH, "/" + LIMIT_LABEL[LIMIT_OF[k]])
    lines += ["Share of the machine's limit, p = %d: busbw / the limit measured beside the same round "
              "(median over rounds; a disturbed limit run replaced by the undisturbed ones' median)" % p,
              head1, head2, "-" * len(head2)]
    for b in sorted(t):
        row = "%8s |" % human(b).replace(" ", "")
        for k in limit_kinds:
            c = t[b]["limits"].get(k)
            row += " %*s" % (W_BW, fbw(c["GBs"]) + ("!" if c["disturbed"] else "") if c else "-")
        row += " |"
        for k in share_impls:
            bw = tables[p].get(b, {}).get(k)
            c = t[b].get(k)
            row += " %*s %*s%s|" % (W_BW, fbw(bw["busbw_GBs"]) if bw else "-", W_SH,
                                    "%.2f" % c["share"] if c else "-", "!" if c and c["disturbed"] else " ")
        lines.append(row)
    lines.append("")
if shares:
    lines += ["limits, per round at each p, one thread: " + "; ".join(
              "%s = %s" % (LIMIT_LABEL[k], w) for k, _, w in LIMITS if k in limit_kinds) +
              ". Each share is busbw over its limit: " + ", ".join(
              "%s / %s" % (LABEL[k], LIMIT_LABEL[LIMIT_OF[k]]) for k in share_impls) + ".", ""]

# loopback, memory, load
extra = []
stream = runs.get("tcp_stream")
loop = {}
if stream:
    stream_at = {r["bytes"]: r["GBs"] for r in stream.get("stream", [])}
    if stream_at:
        best = max(stream_at, key=stream_at.get)
        loop = {"best_GBs": stream_at[best], "best_bytes": best, "at_64MiB_GBs": stream_at.get(64 << 20),
                "bidir": stream.get("bidir", [])}
        extra.append("For scale: one TCP loopback stream %.2f GB/s at its best message size (%s), %s GB/s "
                     "with 64 MiB messages" % (stream_at[best], human(best),
                                               fr(stream_at.get(64 << 20))))
        for bd in stream.get("bidir", []):
            extra.append("  both directions at once, %s messages: %.2f GB/s per direction"
                         % (human(bd["bytes"]), bd["GBs_per_direction"]))
limits_out = {}
for k, label, what in LIMITS:
    if k not in limit_kinds:
        continue
    sizes = sorted({b for lr in limit_runs.values() for b in lr.get(k, {}).get("GBs", {})})
    cells = [(b, limit_cell(k, b)) for b in sizes]
    limits_out[k] = {"what": what, "median_GBs": {str(b): c["GBs"] for b, c in cells},
                     "disturbed": {str(b): c["disturbed"] for b, c in cells}}
    n_all = max(len(c["all"]) for _, c in cells)
    n_med = max(c["n"] for _, c in cells)
    extra.append("For scale, beside every round (median of %s): %s: %s"
                 % ("%d runs, all disturbed" % n_all if all(c["disturbed"] for _, c in cells)
                    else "%d runs" % n_all if n_med == n_all else "the %d undisturbed of %d runs" % (n_med, n_all),
                    what,
                    ", ".join("%s %s%s" % (human(b), fbw(c["GBs"]), "!" if c["disturbed"] else "")
                              for b, c in cells)))
mem = {}
order = {k: i for i, (k, _, _) in enumerate(IMPLS)}
for name in sorted(runs, key=lambda n: (order.get(n.split("_mem_")[0], 99), n)):
    m = re.match(r"(\w+)_mem_p(\d+)$", name)
    if not m:
        continue
    d = runs[name]
    mem[name] = {k: d.get(k) for k in ("bytes", "nranks", "peak_rss_kib", "rss_before_kib",
                                       "peak_minus_buffer_mib", "time_s", "wrong")}
    extra.append("Peak RSS, %d MiB in-place all-reduce, p=%d, %-14s buffer + %.1f MiB"
                 % (d["bytes"] >> 20, d["nranks"], LABEL.get(m.group(1), m.group(1)) + ":",
                    d["peak_minus_buffer_mib"]))
extra.append("Other load (cores used by other processes during each run; > %.2f = disturbed):" % clean_cores)
extra.append("  " + "  ".join("%s %.2f" % (n, l["other_cores"]) for n, l in sorted(loads.items())))
if env("BUSY_BEFORE"):
    extra.append("Before the run: %s cores busy, loadavg %s; after: %s cores, loadavg %s; the run took %s s"
                 % (env("BUSY_BEFORE"), env("LOAD_BEFORE"), env("BUSY_AFTER"), env("LOAD_AFTER"),
                    int(env("T_END", "0")) - int(env("T_START", "0"))))
if env("FAILED", "").split():
    extra.append("FAILED runs: " + env("FAILED") + " (their output: build/compare_raw/NAME.txt)")
wrong = sorted({n for n, d in runs.items() for r in sweep_rows(d) if r.get("wrong", 0) > 0})
if wrong:
    extra.append("WRONG RESULTS (#wrong > 0) in: " + " ".join(wrong))


def first_line(cmd):
    try:
        return subprocess.run(cmd, capture_output=True, text=True).stdout.splitlines()[0]
    except Exception:
        return ""


def library_version():
    """The libddp that was measured: a commit (LIBDDP_REF), or HEAD plus whether the working
    tree's headers differed from it."""
    ref = env("LIBDDP_REF", "")
    root = "build/libddp_ref" if ref else "."
    files = sorted(os.path.relpath(f, root) for f in glob.glob(root + "/ddp*.h") + glob.glob(root + "/transports/*.h"))
    v = {"commit": ref or first_line(["git", "rev-parse", "HEAD"]),
         "subject": first_line(["git", "log", "-1", "--format=%s", ref or "HEAD"]),
         "source": "git archive of that commit" if ref else "working tree",
         "modified_headers": [] if ref else [f for f in files if subprocess.run(
             ["git", "ls-files", "--error-unmatch", f], capture_output=True).returncode != 0 or subprocess.run(
             ["git", "diff", "--quiet", "HEAD", "--", f]).returncode != 0],
         "sha256": {}}
    for f in files:
        try:
            v["sha256"][f] = hashlib.sha256(open(os.path.join(root, f), "rb").read()).hexdigest()[:16]
        except OSError:
            pass
    return v


def deb_version(pkg):
    return first_line(["dpkg-query", "-W", "-f", "${Version}", pkg])


cpu = ""
try:
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "")
except OSError:
    pass
libv = library_version()
libv_line = "libddp measured: %s %s%s" % (libv["commit"][:10], libv["subject"],
    " (+ uncommitted changes to %s)" % ", ".join(libv["modified_headers"]) if libv["modified_headers"] else "")
date = env("DATE") or datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
command = env("COMMAND", "bench/compare.sh")
host = {"nproc": os.cpu_count(), "cpu": cpu, "kernel": platform.release(),
        "os": first_line(["sh", "-c", ". /etc/os-release && echo \"$PRETTY_NAME\""])}
versions = {"cc": first_line([env("CC", "cc"), "--version"]), "cxx": first_line([env("CXX", "g++"), "--version"]),
            "mpicc": first_line([env("MPICC", "mpicc"), "--version"]) if "mpi" not in missing else "",
            "mpirun": first_line(["mpirun", "--version"]) if "mpi" not in missing else "",
            "libopenmpi-dev": deb_version("libopenmpi-dev"), "libgloo-dev": deb_version("libgloo-dev")}

text = "\n".join(lines + extra + [libv_line,
                                  "%s; host: %d cores, %s; command: %s" % (date, os.cpu_count(), cpu, command)])
print("\n== summary\n" + text)

# ---- markdown (for the README) ----
md = ["## all_reduce: libddp vs Open MPI vs Gloo", "",
      "Measured %s on %s (%d cores, %s), libddp commit %s%s, with `%s`."
      % (date[:10], host["os"] or "Linux", os.cpu_count(), cpu, libv["commit"][:10],
         " + uncommitted changes to " + ", ".join(libv["modified_headers"]) if libv["modified_headers"] else "",
         command),
      "Open MPI %s (`%s`; `btl self,vader` for shared memory), Gloo %s (Debian libgloo-dev; gloo::allreduce, "
      "a ring, over its TCP transport), libddp built with `-O2`; float sum, in place; every run in the same "
      "session, interleaved; medians of the undisturbed runs of %s round(s)."
      % (deb_version("libopenmpi-dev") or "?",
         env("MPIRUN_TCP", "--mca pml ob1 --mca btl self,tcp --mca btl_tcp_if_include lo --mca mpi_yield_when_idle 1")
         .replace("--allow-run-as-root --oversubscribe ", ""),
         deb_version("libgloo-dev") or "?", nrounds), "",
      "Each cell: busbw in GB/s (algbw x 2(p-1)/p, GB = 1e9 B), then the latency per call in us (p50 up to "
      "64 KiB, the mean time above). Ratios, bw then lat, are oriented so that **> 1 means libddp is "
      "faster**: bw = libddp busbw / peer busbw, lat = peer latency / libddp latency. `!` marks a cell for "
      "which every run was disturbed by other load.", ""]
for p in nps:
    t = tables[p]
    if not t:
        continue
    md.append("**p = %d**" % p)
    md.append("")
    hdr = ["size"] + [LABEL[k] + "<br>GB/s, us" for k in present] + \
          [h.replace("ddp", "libddp", 1) + "<br>bw, lat" for _, _, h in ratios]
    md.append("| " + " | ".join(hdr) + " |")
    md.append("|---|" + "---:|" * (len(hdr) - 1))
    for b in sorted(t):
        cells = [human(b)]
        for k in present:
            c = t[b].get(k)
            m = "!" if c and c["disturbed"] else ""
            cells.append("%s, %s%s" % (fbw(c["busbw_GBs"]), flat(c["lat_us"]), m) if c else "-")
        for a, bb, h in ratios:
            r = ratio_of(t[b], a, bb)
            m = "!" if r and r["disturbed"] else ""
            cells.append("%s, %s%s" % (fr(r["busbw"]), fr(r["latency"]), m) if r else "-")
        md.append("| " + " | ".join(cells) + " |")
    md.append("")
for p in nps:
    t = shares.get(p)
    if not t:
        continue
    md.append("**Share of the machine's limit, p = %d** (busbw / the limit measured beside the same round, "
              "median over rounds; limits in GB/s, medians)" % p)
    md.append("")
    hdr = ["size"] + [LIMIT_LABEL[k] for k in limit_kinds] + \
          ["%s<br>GB/s, / %s" % (LABEL[k], LIMIT_LABEL[LIMIT_OF[k]]) for k in share_impls]
    md.append("| " + " | ".join(hdr) + " |")
    md.append("|---|" + "---:|" * (len(hdr) - 1))
    for b in sorted(t):
        cells = [human(b)]
        for k in limit_kinds:
            c = t[b]["limits"].get(k)
            cells.append(fbw(c["GBs"]) + ("!" if c["disturbed"] else "") if c else "-")
        for k in share_impls:
            bw = tables[p].get(b, {}).get(k)
            c = t[b].get(k)
            cells.append("%s, **%s**%s" % (fbw(bw["busbw_GBs"]) if bw else "-", "%.2f" % c["share"],
                                           "!" if c["disturbed"] else "") if c else "-")
        md.append("| " + " | ".join(cells) + " |")
    md.append("")
for l in extra:
    if l.startswith(("For scale", "  both", "Peak RSS")):
        md.append(l.strip() + "  ")
md = "\n".join(md) + "\n"

summary = {}
for p in nps:
    rows = []
    for b in sorted(tables[p]):
        sh = shares.get(p, {}).get(b, {})
        rows.append({"bytes": b, **{k: tables[p][b][k] for k in present if k in tables[p][b]},
                     "ratios": {"%s/%s" % (a, bb): ratio_of(tables[p][b], a, bb) for a, bb, _ in ratios},
                     "limits": sh.get("limits", {}),
                     "shares": {"%s/%s" % (k, LIMIT_OF[k]): sh[k] for k in share_impls if k in sh}})
    summary[str(p)] = rows
result = {
    "what": "all_reduce: libddp (tcp%s) vs Open MPI (tcp, vader) vs Gloo (tcp), measured side by side in one "
            "run by bench/compare.sh" % (", shm" if "ddp_shm" in present else ""),
    "date": date,
    "command": command,
    "libddp": libv,
    "libddp_bench": {"source": env("DDPB_SRC"), "transport_flag": env("DDP_T_TCP", "")},
    "host": host,
    "versions": versions,
    "flags": {"cc": env("CFLAGS_USER"), "gloo_cxx": env("CXXFLAGS_GLOO"),
              "mpirun_tcp": env("MPIRUN_TCP", "").split(), "mpirun_vader": env("MPIRUN_VADER", "").split()},
    "method": {"sizes": env("SIZES"), "iters": env("ITERS"), "warmup": env("WARMUP"), "target_s": env("TARGET_S"),
               "repeats": env("REPEATS"), "rounds": nrounds, "nranks": nps, "dtype": "float", "op": "sum",
               "inplace": True, "latency": "p50 per call for sizes <= 64 KiB, mean time per call above",
               "summary": "median over the undisturbed runs (other processes <= %.2f cores)" % clean_cores,
               "ratios": "busbw: libddp/peer; latency: peer/libddp; > 1 means libddp is faster"},
    "configurations": {k: {"label": LABEL[k], "description": description(k)} for k in present},
    "missing_peers": missing, "build_failed": build_failed,
    "env": {k: v for k, v in os.environ.items() if k.startswith(("DDP_", "GLOO_")) and k != "DDP_JOB_SECRET"},
    "tables": summary,
    "loopback": loop,
    "limits": {"seconds_per_kernel": env("LIMIT_S"), "sizes": env("LIMIT_SIZES"), "kinds": limits_out,
               "share": "per round: busbw / the limit measured beside it (same p, same size; when that limit "
                        "run was disturbed, the median of the undisturbed limit runs of any p, if any); then the "
                        "median over the rounds (the undisturbed runs when there are any)",
               "per_round": [{"nranks": q, "round": r,
                              **{k: {"GBs": {str(b): v for b, v in sorted(lr[k]["GBs"].items())},
                                     "other_cores": lr[k]["other_cores"],
                                     "disturbed": lr[k]["other_cores"] > clean_cores}
                                 for k in limit_kinds if k in lr}}
                             for (q, r), lr in sorted(limit_runs.items())]},
    "memory": mem,
    "load": {"per_run": loads, "busy_cores_before": env("BUSY_BEFORE"), "busy_cores_after": env("BUSY_AFTER"),
             "loadavg_before": env("LOAD_BEFORE"), "loadavg_after": env("LOAD_AFTER")},
    "failed_runs": env("FAILED", "").split(),
    "summary_text": text,
    "markdown": md,
    "raw": runs,
}
os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
with open(out, "w") as f:
    json.dump(result, f, indent=1)
with open(md_path, "w") as f:
    f.write(md)
print("\nwrote %s and %s" % (out, md_path))
