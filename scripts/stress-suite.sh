#!/usr/bin/env bash
# The flake hunt (issue 12): runs the whole test suite ROUNDS times in a row
# while `stress --cpu N` keeps every core busy, and counts the rounds and the
# tests that failed. A test that passes idle and fails here depends on
# scheduling luck.
#
#   scripts/stress-suite.sh            # 20 rounds under stress --cpu 2
#   ROUNDS=3 STRESS_CPU=4 scripts/stress-suite.sh -- -E 'test(worker::flow::)'
#
# STRESS_CPU=0 starts no load of its own: a second loop beside one that
# does. Arguments after `--` go to `cargo nextest run` (pick tests with -E). The
# tests are built once before the load starts; one throwaway Redis serves
# every round (scripts/with-redis.sh). Each round's output is kept in
# target/stress-suite/round-N.log (STRESS_OUT names another directory, for
# two loops side by side); the summary lists every failed test with the
# rounds it failed in. Property tests draw fresh random cases every round
# (scripts/test.sh pins them). Exit status: 0 when no round failed.
set -euo pipefail
cd "$(dirname "$0")/.."

rounds=${ROUNDS:-20}
cpus=${STRESS_CPU:-2}
if [ "${1:-}" = "--" ]; then shift; fi

scripts/install-deps.sh stress

out=${STRESS_OUT:-target/stress-suite}
rm -rf "$out"
mkdir -p "$out"
printf '=== building the tests (no load yet)\n'
cargo nextest run --no-run 2>&1 | tail -n 3

exec scripts/with-redis.sh bash -c '
  set -uo pipefail
  rounds=$1; cpus=$2; out=$3; shift 3
  load=
  if [ "$cpus" -gt 0 ]; then
    stress --cpu "$cpus" >/dev/null 2>&1 &
    load=$!
    trap "kill $load 2>/dev/null; wait $load 2>/dev/null" EXIT
  fi
  printf "=== %s rounds of cargo nextest run under stress --cpu %s (pid %s)\n" "$rounds" "$cpus" "$load"
  failed_rounds=0
  for i in $(seq 1 "$rounds"); do
    start=$(date +%s)
    cargo nextest run --no-fail-fast "$@" >"$out/round-$i.log" 2>&1
    rc=$?
    secs=$(( $(date +%s) - start ))
    passed=$(grep -Eo "[0-9]+ passed" "$out/round-$i.log" | tail -n 1 | awk "{print \$1+0}")
    # nextest: "        FAIL [   1.234s] throttle-worker::worker worker::flow::x" (once
    # where it happens, again in the summary).
    fails=$(grep -E "^ +(FAIL|TIMEOUT|SIGSEGV|SIGABRT) \[" "$out/round-$i.log" | awk "{print \$NF}" | sort -u || true)
    if [ "$rc" -ne 0 ]; then
      failed_rounds=$((failed_rounds + 1))
      # A binary that failed to run at all names no test: keep its line.
      [ -n "$fails" ] || fails="(exit $rc, see round-$i.log)"
      printf "%s\n" "$fails" | sed "s/^/$i\t/" >>"$out/failures.tsv"
      printf "round %2d/%s: FAILED in %4ss, %s tests passed; failed: %s\n" "$i" "$rounds" "$secs" "$passed" "$(printf "%s" "$fails" | tr "\n" " ")"
    else
      printf "round %2d/%s: ok in %4ss, %s tests passed\n" "$i" "$rounds" "$secs" "$passed"
    fi
  done
  printf "\n=== %s of %s rounds had a failure under stress --cpu %s\n" "$failed_rounds" "$rounds" "$cpus"
  if [ -s "$out/failures.tsv" ]; then
    printf "test\trounds\n"
    awk -F "\t" "{r[\$2] = r[\$2] (r[\$2] ? \",\" : \"\") \$1} END {for (t in r) print t \"\t\" r[t]}" "$out/failures.tsv" | sort
  fi
  [ "$failed_rounds" -eq 0 ]
' stress-suite "$rounds" "$cpus" "$out" "$@"
