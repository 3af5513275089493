# SPDX-License-Identifier: MIT (see LICENSE)
# tests/metrics_check.py — reads a metrics file (ddp_metrics.h) with the Prometheus Python
# client's text parser (prometheus_client.parser.text_string_to_metric_families, Debian's
# python3-prometheus-client) and checks what that lax parser does not, as Prometheus and
# node-exporter's textfile collector would refuse it:
#   - every family has HELP and TYPE, every name starts with ddp_, a counter's ends in _total;
#   - every sample has the rank label (and --rank's value; --job: the job_id label), no series twice, one set of label
#     names per family;
#   - a histogram's buckets per series: le ascending, ending at +Inf, counts never falling,
#     the +Inf bucket equal to _count, a _sum;
#   - each EXPECT "name{label=value,...}=number": a sample of that name with those labels (and
#     maybe others) has that value (relative 1e-12; +Inf, NaN spelled so), or "name{...}=absent":
#     none has.
# Usage: python3 tests/metrics_check.py FILE [--rank R] [--job J] [EXPECT...]. Exit 0 and "ok" when every
# check holds, else 1 with one line per failure. Run by tests/test_metrics.c.
import math
import re
import sys

from prometheus_client.parser import text_string_to_metric_families


def fail(why):
    print(why)
    return 1


def parse_expect(e):
    m = re.match(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?=(.*)$', e)
    if not m:
        raise SystemExit("bad EXPECT: " + e)
    labels = {}
    if m.group(2):
        for kv in m.group(2).split(','):
            k, v = kv.split('=', 1)
            labels[k] = v
    return m.group(1), labels, m.group(3)


def main(argv):
    path, rank, job, expects = argv[1], None, None, []
    rest = argv[2:]
    while rest:
        if rest[0] == '--rank':
            rank, rest = rest[1], rest[2:]
        elif rest[0] == '--job':
            job, rest = rest[1], rest[2:]
        else:
            expects.append(parse_expect(rest[0]))
            rest = rest[1:]
    text = open(path, encoding='utf-8').read()
    errors = []
    if not text.endswith('\n'):
        errors.append("the file does not end with a newline (cut short?)")
    typed = {}
    for line in text.splitlines():
        m = re.match(r'^# TYPE (\S+) (\S+)$', line)
        if m:
            typed[m.group(1)] = m.group(2)
            if m.group(2) == 'counter' and not m.group(1).endswith('_total'):
                errors.append("counter %s does not end in _total" % m.group(1))
    try:
        families = list(text_string_to_metric_families(text))
    except Exception as ex:   # the parser's refusal is the check
        return fail("the parser refused the file: %r" % (ex,))
    seen = set()
    samples = []
    for f in families:
        if f.type not in ('counter', 'gauge', 'histogram'):
            errors.append("%s: type %s (no TYPE line?)" % (f.name, f.type))
        if not f.documentation:
            errors.append("%s: no HELP" % f.name)
        if not f.name.startswith('ddp_'):
            errors.append("%s: not a ddp_ name" % f.name)
        dims = None
        series = {}
        for s in f.samples:
            samples.append(s)
            key = (s.name, tuple(sorted(s.labels.items())))
            if key in seen:
                errors.append("%s%s twice" % (s.name, s.labels))
            seen.add(key)
            if 'rank' not in s.labels:
                errors.append("%s%s: no rank label" % (s.name, s.labels))
            elif rank is not None and s.labels['rank'] != rank:
                errors.append("%s%s: rank is not %s" % (s.name, s.labels, rank))
            if job is not None and s.labels.get('job_id') != job:
                errors.append("%s%s: job_id is not %r" % (s.name, s.labels, job))
            names = tuple(sorted(k for k in s.labels if k != 'le'))
            if dims is None:
                dims = names
            elif names != dims:
                errors.append("%s: label names %s and %s in one family" % (f.name, dims, names))
            if f.type == 'histogram':
                series.setdefault(tuple(sorted((k, v) for k, v in s.labels.items() if k != 'le')), []).append(s)
        for lab, ss in series.items():
            buckets = [(float(s.labels['le']), s.value) for s in ss if s.name.endswith('_bucket')]
            counts = [s.value for s in ss if s.name.endswith('_count')]
            sums = [s for s in ss if s.name.endswith('_sum')]
            where = "%s%s" % (f.name, dict(lab))
            if not buckets or buckets[-1][0] != math.inf:
                errors.append("%s: no +Inf bucket last" % where)
                continue
            if any(b[0] >= c[0] for b, c in zip(buckets, buckets[1:])):
                errors.append("%s: le not ascending" % where)
            if any(b[1] > c[1] for b, c in zip(buckets, buckets[1:])):
                errors.append("%s: buckets not cumulative: %s" % (where, [b[1] for b in buckets]))
            if len(counts) != 1 or counts[0] != buckets[-1][1]:
                errors.append("%s: _count %s is not the +Inf bucket %s" % (where, counts, buckets[-1][1]))
            if len(sums) != 1:
                errors.append("%s: no _sum" % where)
    for name, labels, want in expects:
        got = [s for s in samples if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())]
        if want == 'absent':
            if got:
                errors.append("%s%s: expected absent, found %s" % (name, labels, [s.value for s in got]))
            continue
        if len(got) != 1:
            errors.append("%s%s: expected one sample, found %d" % (name, labels, len(got)))
            continue
        v, w = got[0].value, float(want)
        same = (math.isnan(v) and math.isnan(w)) or v == w or (
            math.isfinite(w) and abs(v - w) <= 1e-12 * max(abs(v), abs(w)))
        if not same:
            errors.append("%s%s = %r, expected %r" % (name, labels, v, w))
    for e in errors:
        print(e)
    if errors:
        return 1
    print("ok: %d families, %d samples" % (len(families), len(samples)))
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv))
