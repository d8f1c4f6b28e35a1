#!/bin/bash
# BENCHMARKS.md 2e: what a seller's call records cost a charged v2 jobs call,
# libraries side by side in one run against one private redis-server.
#
#   redis-server --port 6412 --save '' --appendonly no --daemonize yes
#   P=6412 ROUNDS=8 N=60000 LIBS="before now key nr" benches/prototype/calls_cost.sh
#
# Libraries (FUNCTION LOAD of the lua/ files at a commit, build_lib.py):
#   before  33de777, before the records
#   now     01c517b, the records in the field `calls` of the seller's hash
#   key     the work tree (KEY_REF, default HEAD), the records in `{seller}:calls`
#   nr      `key` with calls_write returning at once (today's code, no records)
# One row per (round, case, library), the libraries' order rotating each
# round, a fresh seller per row; usec_per_call of FCALL from INFO
# commandstats after CONFIG RESETSTAT. One v2 seller, gcra never refusing.
# Cases: busy (life 5 s, the default: main's field stays full at 2 KiB, the
# key at 64-79 records); few (life 1 µs: every record is stale at the next
# call, so main's field holds one record, the key 1 to 16 until its trim).
set -eu
P=${P:-6412}; ROUNDS=${ROUNDS:-8}; N=${N:-60000}; KEY_REF=${KEY_REF:-HEAD}
here=$(cd "$(dirname "$0")" && pwd); repo=$(git -C "$here" rev-parse --show-toplevel)
work=$(mktemp -d)
"$here/build_lib.py" wtb_before "$repo" 33de777 "$work/before.lua" >/dev/null
"$here/build_lib.py" wtb_now "$repo" 01c517b "$work/now.lua" >/dev/null
"$here/build_lib.py" wtb_key "$repo" "$KEY_REF" "$work/key.lua" >/dev/null
sed 's/name=wtb_key/name=wtb_nr/; s/wtb_key_l/wtb_nr_l/; /^local function calls_write(/a\  if true then return end' \
  "$work/key.lua" > "$work/nr.lua"
read -ra libs <<< "${LIBS:-before now key nr}"
for lib in "${libs[@]}"; do
  redis-cli -p "$P" FUNCTION DELETE "wtb_$lib" >/dev/null 2>&1 || true
  redis-cli -p "$P" -x FUNCTION LOAD < "$work/$lib.lua" >/dev/null
done
uptime
for r in $(seq 1 "$ROUNDS"); do
  for case in busy few; do
    life=''; [ "$case" = few ] && life=1
    for i in $(seq 0 $(( ${#libs[@]} - 1 ))); do
      lib=${libs[$(( (i + r) % ${#libs[@]} ))]}
      s="hot-$case-$lib-$r-$$"
      redis-cli -p "$P" CONFIG RESETSTAT >/dev/null
      redis-benchmark -p "$P" -n "$N" -c 4 -r 100000000 FCALL "wtb_${lib}_l" 3 \
        "tw:{$s}:v2" "tw:{$s}:v2" "tw:{$s}:calls" jobs '' 1 id__rand_int__ 1 f 1 \
        gcra 1000000 1000000 1000000 r0 '' '' "$life" >/dev/null 2>&1
      us=$(redis-cli -p "$P" INFO commandstats | grep '^cmdstat_fcall:' | sed 's/.*usec_per_call=\([0-9.]*\).*/\1/')
      echo "row round=$r case=$case lib=$lib usec_per_call=$us" \
        "field_bytes=$(redis-cli -p "$P" HSTRLEN "tw:{$s}:v2" calls)" \
        "zcard=$(redis-cli -p "$P" ZCARD "tw:{$s}:calls")"
    done
  done
done
uptime
rm -r "$work"
