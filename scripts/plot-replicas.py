#!/usr/bin/env python3
"""Plots jobs/s against replicas from `cargo bench --bench end_to_end` output.

    cargo bench --bench end_to_end | tee e2e.txt
    python3 scripts/plot-replicas.py e2e.txt docs/src/images/replicas.png   # needs matplotlib

Reads the "Jobs/s against replicas" table (its markdown rows) and draws
jobs/s per replica count, with the single replica's rate times the count
(linear scaling) beside it for reference.
"""
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def rows(path):
    table = False
    for line in open(path, encoding="utf-8"):
        if line.startswith("## Jobs/s against replicas"):
            table = True
            continue
        if table and line.startswith("## "):
            break
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if table and len(cells) >= 2 and cells[0].isdigit():
            yield int(cells[0]), float(cells[1])


def main():
    if len(sys.argv) != 3:
        sys.exit(f"usage: {sys.argv[0]} BENCH_OUTPUT PNG")
    data = sorted(rows(sys.argv[1]))
    if not data:
        sys.exit(f"{sys.argv[1]}: no 'Jobs/s against replicas' table")
    n = [r for r, _ in data]
    rate = [j for _, j in data]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(n, rate, "o-", label="measured (all replicas on one 2-core machine)")
    ax.plot(n, [rate[0] * r for r in n], "--", color="grey", label="linear scaling")
    ax.set_xlabel("replicas")
    ax.set_ylabel("jobs/s")
    ax.set_xticks(n)
    ax.set_ylim(bottom=0)
    ax.set_title("End to end: jobs/s against replicas (never-refusing rule)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(sys.argv[2], dpi=100)


if __name__ == "__main__":
    main()
