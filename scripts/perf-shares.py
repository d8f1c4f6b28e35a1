#!/usr/bin/env python3
"""Where a worker process' CPU goes, from `perf record --call-graph dwarf`
files (`cargo bench --bench baseline -- --perf DIR REV` writes one per run).

    scripts/perf-shares.py [--jobs N] [--folded OUT] FILE.data [FILE.data ...]

The files given are one group (e.g. the rounds of one build, limiter on):
their samples are added up. Prints, as shares of the group's samples (every
thread of the worker process: its runtime, librdkafka's threads, the
kernel on its behalf):

- the candidates of issue 49 (BENCHMARKS.md, "Per-job costs since
  1b610e5"), each inclusive: a sample counts if any frame of its stack,
  inlined ones included, matches;
- the crate's own functions, each charged with the samples for which it is
  the innermost frame of the crate (its callees in libraries included);
- the leaf symbols (self time).

With --jobs, the CPU per job too (samples / the sampling rate / jobs).
With --folded, the stacks folded for inferno-flamegraph or flamegraph.pl.
"""

import argparse
import collections
import re
import subprocess
import sys

# Inclusive: a sample whose stack has a frame matching the pattern.
CANDIDATES = [
    ("wait board (worker::waits, limiter::waits)", r"::waits::"),
    ("learnt limits (limiter::learn)", r"limiter::learn::"),
    ("priority ranking (seller::ranked_heads)", r"seller::ranked_heads"),
    ("adaptive concurrency (worker::concurrency)", r"worker::concurrency::"),
    ("handoff ledger (worker::ledger)", r"worker::ledger::"),
    ("fair shares (worker::fair)", r"worker::fair::"),
    ("fair::Fair::allowance", r"fair::Fair::allowance"),
    ("fair::Fair::next", r"fair::Fair::next\b"),
    ("the engine (worker::engine)", r"worker::engine::"),
    ("limiter client (throttle_worker::limiter)", r"throttle_worker::limiter::"),
    ("limiter coalescer (limiter::coalesce)", r"limiter::coalesce::"),
    ("downstream client (throttle_worker::downstream)", r"throttle_worker::downstream::"),
    ("job decode (throttle_worker::job)", r"throttle_worker::job::"),
    ("Kafka (throttle_worker::kafka)", r"throttle_worker::kafka::"),
    ("telemetry (throttle_worker::telemetry)", r"throttle_worker::telemetry::"),
    ("librdkafka (rd_kafka_*, rdkafka::)", r"^rd_kafka_|^rdkafka::|^rd_"),
    ("redis-rs (redis::)", r"^redis::|<redis::"),
    ("HTTP client (hyper, reqwest)", r"hyper::|reqwest::|hyper_util::"),
    ("serde_json", r"serde_json::"),
    ("allocator (malloc, free)", r"^(__libc_)?(malloc|free|realloc|calloc|cfree)$|_int_malloc|_int_free"),
    ("kernel", r"\[kernel"),
]

OWN = re.compile(r"throttle_worker::")


def stacks(path):
    """Yields each sample's frames, leaf first."""
    out = subprocess.run(
        ["perf", "script", "-i", path, "-F", "tid,ip,sym,dso"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    frames = []
    for line in out.splitlines():
        if not line.strip():
            if frames:
                yield frames
            frames = []
            continue
        if not line[0].isspace():
            frames = []
            continue
        # "\t addr sym (inlined)? (dso)"
        parts = line.strip().split(" ", 1)
        text = parts[1] if len(parts) > 1 else "[unknown]"
        dso = ""
        m = re.search(r" \(([^()]*)\)$", text)
        if m:
            dso = m.group(1)
            text = text[: m.start()]
        text = text.replace(" (inlined)", "")
        if "kernel" in dso:
            text = "[kernel] " + text
        frames.append(text)
    if frames:
        yield frames


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=0, help="jobs in each file's run")
    ap.add_argument("--freq", type=int, default=999, help="perf record's -F")
    ap.add_argument("--folded", help="write the folded stacks here")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("files", nargs="+")
    a = ap.parse_args()

    total = 0
    inclusive = collections.Counter()
    own = collections.Counter()
    leaf = collections.Counter()
    folded = collections.Counter()
    pats = [(name, re.compile(p)) for name, p in CANDIDATES]
    for f in a.files:
        for frames in stacks(f):
            total += 1
            for name, p in pats:
                if any(p.search(fr) for fr in frames):
                    inclusive[name] += 1
            leaf[frames[0]] += 1
            first_own = next((fr for fr in frames if OWN.search(fr)), "(none of the crate's)")
            own[first_own] += 1
            folded[";".join(reversed(frames))] += 1
    if total == 0:
        sys.exit("no samples")
    pct = lambda n: f"{100.0 * n / total:.2f} %"
    print(f"samples: {total} in {len(a.files)} file(s)")
    if a.jobs:
        us = total / a.freq / (a.jobs * len(a.files)) * 1e6
        print(f"worker CPU per job: {us:.1f} µs ({total} samples at {a.freq} Hz, {a.jobs} jobs a file)")
    print("\n| candidate (inclusive) | share of the worker's samples |\n|---|---:|")
    for name, _ in CANDIDATES:
        print(f"| {name} | {pct(inclusive[name])} |")
    print("\n| the crate's innermost function (callees included) | share |\n|---|---:|")
    for sym, n in own.most_common(a.top):
        print(f"| `{sym[:140]}` | {pct(n)} |")
    print("\n| leaf symbol (self) | share |\n|---|---:|")
    for sym, n in leaf.most_common(a.top):
        print(f"| `{sym[:140]}` | {pct(n)} |")
    if a.folded:
        with open(a.folded, "w") as out:
            for stack, n in folded.items():
                out.write(f"{stack} {n}\n")


if __name__ == "__main__":
    main()
