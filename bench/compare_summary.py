#!/usr/bin/env python3
"""bench/compare_summary.py — the summary table of bench/compare.sh, from its raw results.

Run by compare.sh (which sets the environment below); can be re-run by hand on an old run:
    RAW=build/compare_raw OUT=bench/results.json python3 bench/compare_summary.py

A run during which other processes used more than CLEAN_CORES (default 0.25) cores is
"disturbed": the medians use only the undisturbed runs of each (impl, p) when there are any,
and mark the cell with '!' when there are none.
"""
import glob
import json
import os
import platform
import re
import statistics
import subprocess

env = os.environ.get
raw, out = env("RAW", "build/compare_raw"), env("OUT", "bench/results.json")
nps = [int(x) for x in env("NP", "2 4").split()]
clean_cores = float(env("CLEAN_CORES", "0.25"))


def load_json(path):
    with open(path) as f:
        return json.load(f)


runs, loads = {}, {}
for path in sorted(glob.glob(raw + "/*.json")):
    name = os.path.basename(path)[:-5]
    runs[name] = load_json(path)
    lp = os.path.join(raw, name + ".load")
    if os.path.exists(lp):
        e, mine, other = (float(x) for x in open(lp).read().split())
        loads[name] = {"elapsed_s": e, "own_cores": mine, "other_cores": other}

stream = runs["tcp_stream"]
stream_at = {r["bytes"]: r["GBs"] for r in stream["stream"]}
limit = max(stream_at.values())
limit_size = max(stream_at, key=stream_at.get)


def collect(impl, p):
    """bytes -> (rows of the undisturbed runs or, if none, of all runs; disturbed?)"""
    clean, every = {}, {}
    for name, d in runs.items():
        m = re.match(r"%s_p%d_r\d+$" % (impl, p), name)
        if not m:
            continue
        ok = loads.get(name, {}).get("other_cores", 0.0) <= clean_cores
        for r in d["results"]:
            every.setdefault(r["bytes"], []).append(r)
            if ok:
                clean.setdefault(r["bytes"], []).append(r)
    return {b: (clean[b], False) if b in clean else (rs, True) for b, rs in every.items()}


table = {}
for impl in ("ddp", "mpi", "ddpnative"):
    for p in nps:
        for b, (rs, disturbed) in collect(impl, p).items():
            t = table.setdefault(b, {})
            k = "%s_p%d" % (impl, p)
            for key in ("busbw_GBs", "time_us", "p50_us", "p99_us", "cpu_cores"):
                t["%s_%s" % (k, key)] = statistics.median(r[key] for r in rs)
            t[k + "_n"] = len(rs)
            t[k + "_disturbed"] = disturbed
            t[k + "_all_busbw"] = [r["busbw_GBs"] for r in rs]


LAT_BYTES = 4096   # rows below this show the time per call (us) instead of busbw


def val(t, k, b):
    return t.get(k + ("_time_us" if b < LAT_BYTES else "_busbw_GBs"))


def cell(t, k, b, w=9):
    v = val(t, k, b)
    if v is None:
        return "%*s" % (w, "-")
    s = ("%.1fus" % v) if b < LAT_BYTES else ("%.3f" % v)
    return "%*s%s" % (w - 1, s, "!" if t.get(k + "_disturbed") else " ")


def rfmt(v, t, k1, k2, w=6):
    """a ratio, '!' when either side was measured under other load"""
    if v is None:
        return "%*s" % (w, "-")
    bad = t.get(k1 + "_disturbed") or t.get(k2 + "_disturbed")
    return "%*.2f%s" % (w - 1 if bad else w, v, "!" if bad else "")


def fmt(v, w=7, d=3):
    return ("%*.*f" % (w, d, v)) if isinstance(v, (int, float)) else "%*s" % (w, "-")


def ratio(a, b):
    return a / b if a is not None and b else None


def human(b):
    for s, n in (("M", 1 << 20), ("K", 1 << 10)):
        if b >= n and b % n == 0:
            return "%d%s" % (b // n, s)
    return "%dB" % b


p2, p4 = (nps + [nps[-1], nps[-1]])[:2]
lines = ["busbw (GB/s), median of the undisturbed runs ('!': every run was disturbed by other load;",
         "a ratio with '!' compares numbers of which one or both were disturbed: do not trust it);",
         "rows under %d B show the time per call in us instead; ratio = libddp/MPI busbw (for those rows"
         " MPI time/libddp time): > 1 means libddp is faster;" % LAT_BYTES,
         "loopback = single-connection TCP stream with messages of that size; ddp/loop = libddp p=%d / "
         "loopback;" % p2,
         "ddp O3n = libddp built with -O3 -march=native (one run)", ""]
hdr = ("%6s | %9s %9s %6s | %9s %9s %6s | %8s %8s | %9s %9s"
       % ("size", "ddp p=%d" % p2, "MPI p=%d" % p2, "ratio", "ddp p=%d" % p4, "MPI p=%d" % p4,
          "ratio", "loopback", "ddp/loop", "O3n p=%d" % p2, "O3n p=%d" % p4))
lines += [hdr, "-" * len(hdr)]
summary = []
for b in sorted(table):
    t = table[b]
    g = lambda k: t.get(k + "_busbw_GBs")
    lb = stream_at.get(b)

    def speedup(k1, k2):
        if b < LAT_BYTES:
            return ratio(t.get(k2 + "_time_us"), t.get(k1 + "_time_us"))
        return ratio(g(k1), g(k2))

    row = {"bytes": b,
           "ddp_p%d_busbw" % p2: g("ddp_p%d" % p2), "mpi_p%d_busbw" % p2: g("mpi_p%d" % p2),
           "ddp_p%d_time_us" % p2: t.get("ddp_p%d_time_us" % p2),
           "mpi_p%d_time_us" % p2: t.get("mpi_p%d_time_us" % p2),
           "ratio_p%d" % p2: speedup("ddp_p%d" % p2, "mpi_p%d" % p2),
           "ddp_p%d_busbw" % p4: g("ddp_p%d" % p4), "mpi_p%d_busbw" % p4: g("mpi_p%d" % p4),
           "ddp_p%d_time_us" % p4: t.get("ddp_p%d_time_us" % p4),
           "mpi_p%d_time_us" % p4: t.get("mpi_p%d_time_us" % p4),
           "ratio_p%d" % p4: speedup("ddp_p%d" % p4, "mpi_p%d" % p4),
           "loopback_GBs": lb, "ddp_p%d_over_loopback" % p2: ratio(g("ddp_p%d" % p2), lb),
           "ddp_p%d_over_loopback_limit" % p2: ratio(g("ddp_p%d" % p2), limit),
           "ddp_native_p%d_busbw" % p2: g("ddpnative_p%d" % p2),
           "ddp_native_p%d_busbw" % p4: g("ddpnative_p%d" % p4),
           "runs": {k: t[k + "_all_busbw"] for k in ("%s_p%d" % (i, p) for i in ("ddp", "mpi", "ddpnative")
                                                     for p in nps) if k + "_all_busbw" in t}}
    summary.append(row)
    lines.append("%6s | %s %s %6s | %s %s %6s | %8s %8s | %s %s" % (
        human(b), cell(t, "ddp_p%d" % p2, b), cell(t, "mpi_p%d" % p2, b),
        rfmt(row["ratio_p%d" % p2], t, "ddp_p%d" % p2, "mpi_p%d" % p2),
        cell(t, "ddp_p%d" % p4, b), cell(t, "mpi_p%d" % p4, b),
        rfmt(row["ratio_p%d" % p4], t, "ddp_p%d" % p4, "mpi_p%d" % p4),
        fmt(lb, 8), fmt(row["ddp_p%d_over_loopback" % p2], 8, 2),
        cell(t, "ddpnative_p%d" % p2, b), cell(t, "ddpnative_p%d" % p4, b)))

lines.append("")
lines.append("TCP loopback stream limit: %.3f GB/s (best message size, %s); with 64 MiB messages: %s GB/s"
             % (limit, human(limit_size), fmt(stream_at.get(64 << 20), 5)))
for bd in stream.get("bidir", []):
    lines.append("  both directions at once (the 2-rank ring's traffic), %s messages: %.3f GB/s per direction"
                 % (human(bd["bytes"]), bd["GBs_per_direction"]))
lines.append("memcpy 64 MiB: %.2f GB/s; memcpy 512 KiB: %.2f GB/s; c = a + b, float, 64 MiB: %.2f GB/s"
             % (stream["memcpy_64MiB_GBs"], stream["memcpy_512KiB_GBs"], stream["add_float_64MiB_GBs"]))

kernels = {}
for build in ("O2", "native"):
    path = os.path.join(raw, "reduce_%s.txt" % build)
    if not os.path.exists(path):
        continue
    for l in open(path):
        f = l.split()
        if len(f) >= 3 and not l.startswith("#") and f[1].endswith("K"):
            kernels.setdefault(build, {})["%s %s" % (f[0], f[1])] = {
                "ddp_GBs": float(f[2]), "plain_GBs": float(f[3]) if len(f) > 3 and f[3] != "-" else None}
if kernels:
    lines.append("reduction kernel ddp_reduce_local(dst == a, sum), GB/s of result (plain restrict loop in"
                 " parentheses):")
    for build, label in (("O2", "-O2"), ("native", "-O3 -march=native")):
        ks = kernels.get(build, {})
        lines.append("  %-18s " % label + "  ".join(
            "%s %.1f%s" % (k.replace("65536K", "64M"), v["ddp_GBs"],
                           " (%.1f)" % v["plain_GBs"] if v["plain_GBs"] else "")
            for k, v in ks.items() if k.split()[0] in ("float32", "bfloat16", "float16")))

small = min(table)
lat = {}
lines.append("")
lines.append("%s all-reduce latency, us (median of runs): time = mean per call; p50 / p99 per call; cpu"
             " = cores busy during the calls" % human(small))
for impl, label in (("ddp", "libddp"), ("mpi", "Open MPI"), ("ddpnative", "libddp -O3 -march=native")):
    for p in nps:
        t, k = table[small], "%s_p%d" % (impl, p)
        if t.get(k + "_time_us") is None:
            continue
        lat[k] = {key: t[k + "_" + key] for key in ("time_us", "p50_us", "p99_us", "cpu_cores")}
        lines.append("  %-25s p=%d: time %8.2f  p50 %8.2f  p99 %8.2f  cpu %.2f%s"
                     % (label, p, lat[k]["time_us"], lat[k]["p50_us"], lat[k]["p99_us"],
                        lat[k]["cpu_cores"], "  (disturbed)" if t[k + "_disturbed"] else ""))

lines.append("")
lines.append("CPU during the timed calls (cores busy, all ranks together; the machine has %d):"
             % os.cpu_count())
for b in sorted(table):
    t = table[b]
    lines.append("  %6s  " % human(b) + "  ".join(
        "%s p=%d %s" % (impl, p, fmt(t.get("%s_p%d_cpu_cores" % (impl, p)), 4, 2))
        for impl in ("ddp", "mpi") for p in nps))

mem = {}
lines.append("")
for name in sorted(runs):
    if "_mem_" not in name:
        continue
    d = runs[name]
    mem[name] = {k: d[k] for k in ("bytes", "nranks", "peak_rss_kib", "rss_before_kib",
                                   "peak_minus_buffer_mib", "time_s", "target_met")}
    lines.append("%-11s %d MiB in-place all-reduce, p=%d: peak RSS %.1f MiB = buffer + %.1f MiB "
                 "(target: buffer + 32 MiB, %s), %.2f s"
                 % (name, d["bytes"] >> 20, d["nranks"], d["peak_rss_kib"] / 1024.0,
                    d["peak_minus_buffer_mib"], "met" if d["target_met"] else "NOT met", d["time_s"]))

lines.append("")
lines.append("other load (cores used by other processes during each run; > %.2f = disturbed):" % clean_cores)
lines.append("  " + "  ".join("%s %.2f" % (n, l["other_cores"]) for n, l in sorted(loads.items())))
if env("BUSY_BEFORE"):
    lines.append("before the run: %s cores busy, loadavg %s; after: %s cores, loadavg %s; run took %s s"
                 % (env("BUSY_BEFORE"), env("LOAD_BEFORE"), env("BUSY_AFTER"), env("LOAD_AFTER"),
                    int(env("T_END", "0")) - int(env("T_START", "0"))))
if env("FAILED", "").split():
    lines.append("FAILED runs: " + env("FAILED"))
text = "\n".join(lines)
print("\n== summary\n" + text)


def first_line(cmd):
    try:
        return subprocess.run(cmd, capture_output=True, text=True).stdout.splitlines()[0]
    except Exception:
        return ""


cpu = ""
try:
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "")
except OSError:
    pass
def library_version():
    """The libddp that was measured: a commit (LIBDDP_REF), or HEAD plus whether the working
    tree's headers differed from it."""
    import hashlib
    ref = env("LIBDDP_REF", "")
    root = "build/libddp_ref" if ref else "."
    files = ["ddp.h", "ddp_ring.h"] + sorted(os.path.relpath(f, root) for f in glob.glob(root + "/transports/*.h"))
    v = {"commit": ref or first_line(["git", "rev-parse", "HEAD"]),
         "subject": first_line(["git", "log", "-1", "--format=%s", ref or "HEAD"]),
         "source": "git archive of that commit" if ref else "working tree",
         "modified_headers": [] if ref else [f for f in files if subprocess.run(
             ["git", "diff", "--quiet", "HEAD", "--", f]).returncode != 0],
         "sha256": {}}
    for f in files:
        try:
            v["sha256"][f] = hashlib.sha256(open(os.path.join(root, f), "rb").read()).hexdigest()[:16]
        except OSError:
            pass
    return v


libv = library_version()
libv_line = "libddp measured: %s %s%s" % (libv["commit"][:10], libv["subject"],
    " (+ uncommitted changes to %s)" % ", ".join(libv["modified_headers"]) if libv["modified_headers"] else "")
print(libv_line)
text += "\n" + libv_line
result = {
    "libddp": libv,
    "what": "libddp ring all-reduce over TCP vs Open MPI MPI_Allreduce (ob1, tcp btl over lo) vs the "
            "TCP loopback stream, measured side by side in one run",
    "command": "bench/compare.sh " + out,
    "host": {"nproc": os.cpu_count(), "kernel": platform.release(), "cpu": cpu},
    "compilers": {"cc": first_line([env("CC", "cc"), "--version"]),
                  "mpicc": first_line([env("MPICC", "mpicc"), "--version"]),
                  "mpirun": first_line(["mpirun", "--version"])},
    "flags": {"libddp": "%s -I. -pthread bench/allreduce_bench.c -lm" % env("CFLAGS_USER", ""),
              "libddp_native": "%s -I. -pthread bench/allreduce_bench.c -lm" % env("CFLAGS_NATIVE", ""),
              "mpi": "mpicc %s bench/mpi_allreduce_bench.c -lm" % env("CFLAGS_USER", ""),
              "mpirun": env("MPIRUN_FLAGS", "").split()},
    "method": {"sizes": env("SIZES"), "iters": env("ITERS"), "warmup": env("WARMUP"),
               "target_s": env("TARGET_S"), "repeats": env("REPEATS"), "rounds": env("ROUNDS"), "nranks": nps,
               "dtype": "float", "op": "sum", "inplace": True,
               "summary": "median over the undisturbed repeats (other processes <= %.2f cores)" % clean_cores},
    "env": {k: v for k, v in os.environ.items() if k.startswith("DDP_")},
    "loopback_limit_GBs": limit,
    "summary": summary,
    "latency": lat,
    "memory": mem,
    "reduce_kernels": kernels,
    "load": {"per_run": loads, "busy_cores_before": env("BUSY_BEFORE"), "busy_cores_after": env("BUSY_AFTER"),
             "loadavg_before": env("LOAD_BEFORE"), "loadavg_after": env("LOAD_AFTER")},
    "failed_runs": env("FAILED", "").split(),
    "summary_text": text,
    "raw": runs,
}
with open(out, "w") as f:
    json.dump(result, f, indent=1)
print("\nwrote " + out)
