# SPDX-License-Identifier: MIT (see LICENSE)
# tests/sampler_reshard_mutants.py — shows that tests/test_sampler_reshard.c catches wrong re-shards.
#
# Each mutant is ddp_sampler.h with one deliberate bug in the re-shard (an off-by-one in consumed,
# a share one too big, the rest padded again for the new world, ...). Every mutant is compiled
# against the test in a scratch directory under $TMPDIR; the test must fail on each one. Prints
# TAP; exits 1 if a mutant survives. Not part of make test (seven compiles): run it by hand from
# the repository root after changing the re-shard:  python3 tests/sampler_reshard_mutants.py
import os
import shutil
import subprocess
import sys
import tempfile

MUTANTS = {
    "consumed one too far": (
        "*consumed = s->start + (done < left ? done : left);",
        "*consumed = s->start + (done < left ? done : left) + (done < left);"),
    "consumed one short": (
        "*consumed = s->start + (done < left ? done : left);",
        "*consumed = s->start + (done < left ? done : left) - (done > 0 && done < left);"),
    "re-shard starts one position late": (
        "    s->start = consumed;\n",
        "    s->start = consumed + (consumed < s->total_size);\n"),
    "one rank too many gets the extra sample": (
        "s->num_samples = left / w + ((uint64_t)rank < left % w);",
        "s->num_samples = left / w + ((uint64_t)rank <= left % w);"),
    "the rest padded again for the new world": (
        "s->num_samples = left / w + ((uint64_t)rank < left % w);",
        "s->num_samples = left / w + (left % w != 0);"),
    "set_epoch keeps the re-shard's start": (
        "    s->epoch_replicas = s->num_replicas;\n    s->start = 0;\n",
        "    s->epoch_replicas = s->num_replicas;\n"),
    "the rest without the old world's padding": (
        "    left = s->total_size - consumed;\n",
        "    left = (s->dataset_len < s->total_size ? s->dataset_len : s->total_size) - consumed;\n"
        "    if (consumed > s->dataset_len) left = 0;\n"),
    "a joiner's resume lays the epoch out for the new world": (
        "ddp_sampler_init(&t, s->dataset_len, (int)pos->epoch_replicas, 0,",
        "ddp_sampler_init(&t, s->dataset_len, num_replicas, 0,"),
}


def main():
    src = open("ddp_sampler.h").read()
    cc = os.environ.get("CC", "cc")
    survived = 0
    print("1..%d" % len(MUTANTS))
    with tempfile.TemporaryDirectory(prefix="reshard_mutants.") as tmp:
        for k, (name, (good, bad)) in enumerate(MUTANTS.items(), 1):
            if src.count(good) != 1:
                print("not ok %d - %s: the line to mutate is gone; update this script" % (k, name))
                survived += 1
                continue
            d = os.path.join(tmp, str(k))
            os.mkdir(d)
            with open(os.path.join(d, "ddp_sampler.h"), "w") as f:
                f.write(src.replace(good, bad))
            shutil.copy("ddp_base.h", d)
            exe = os.path.join(d, "t")
            b = subprocess.run([cc, "-std=c99", "-O2", "-I" + d, "-I.",
                                "tests/test_sampler_reshard.c", "-o", exe, "-lm"],
                               capture_output=True, text=True)
            if b.returncode != 0:
                print("not ok %d - %s: does not compile\n# %s" % (k, name, b.stderr[:300]))
                survived += 1
                continue
            r = subprocess.run([exe], capture_output=True, text=True)
            failed = [l for l in r.stdout.splitlines() if l.startswith("not ok")]
            caught = r.returncode != 0 and failed
            print("%s %d - mutant '%s' fails the test (%d checks fail)"
                  % ("ok" if caught else "not ok", k, name, len(failed)))
            for line in failed[:3]:
                print("#   " + line)
            survived += not caught
    return 1 if survived else 0


if __name__ == "__main__":
    sys.exit(main())
