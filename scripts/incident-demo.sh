#!/usr/bin/env bash
# An incident on one machine, with the book's runbook commands (docs/src/operate/incidents.md):
# the mock Kafka broker, a downstream stub, two worker replicas and a load.
#
#  1. The downstream fails one seller's registrations (stub --fail): its
#     jobs end in the dead-letter topic as attempts_exhausted.
#  2. An operator pauses another seller: no call of it reaches the
#     downstream from a second after `limits pause` until `limits resume`,
#     while the other sellers go on; then it resumes.
#  3. The downstream is fixed (the stub restarts without --fail): the
#     operator looks at the dead letters (`dlq stats`), replays that seller's
#     (`dlq replay`), and runs the same replay again, which writes nothing.
#
# Exits non-zero if a paused seller was called during its pause, or if a
# replayed job did not reach the downstream exactly once. Needs only Redis
# (a throwaway one unless REDIS_URL answers). About a minute.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${INCIDENT_DEMO_INNER:-}" ]; then
  scripts/install-deps.sh
  cargo build --quiet
  INCIDENT_DEMO_INNER=1 exec scripts/with-redis.sh "$0" "$@"
fi

bin=target/debug/throttle-worker
tmp=$(mktemp -d)
pids=()
workers=()
cleanup() {
  # The workers first, while their broker still answers their final
  # commits; then the rest.
  for p in "${workers[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${workers[@]}"; do
    for _ in $(seq 300); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$p" 2>/dev/null || true
  done
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT INT TERM

say() { printf '\n=== %s\n' "$*"; }
# The first line a background command prints (its address), within 30 s.
first_line() {
  local file=$1 what=$2
  for _ in $(seq 300); do
    if [ -s "$file" ] && head -n1 "$file" | grep -q .; then
      head -n1 "$file"
      return
    fi
    sleep 0.1
  done
  echo "incident-demo: $what printed nothing in 30 s:" >&2
  cat "$file" >&2
  exit 1
}
# One seller's counter from the stub's GET /stats (calls, accepted, failed).
stub_count() {
  python3 - "$stub_url" "$1" "$2" <<'EOF'
import json, sys, urllib.request
base, seller, field = sys.argv[1], sys.argv[2], sys.argv[3]
stats = json.load(urllib.request.urlopen(base.rsplit("/", 1)[0] + "/stats"))
print(stats["sellers"].get(seller, {}).get(field, 0))
EOF
}
json_field() { python3 -c 'import json,sys; d=json.load(sys.stdin); print(eval("d"+sys.argv[1]))' "$1"; }

cfg=$tmp/worker.toml
cat >"$cfg" <<EOF
[kafka]
topic = "jobs"
retry_topic_prefix = "jobs.retry"
dlq_topic = "jobs.dlq"
commit_interval = "500ms"

# The mock holds every rebalance for session.timeout.ms - 1 s.
[kafka.consumer_properties]
"session.timeout.ms" = "3000"
"heartbeat.interval.ms" = "300"

[redis]
url = "$REDIS_URL"
key_prefix = "incident-demo-$$"

[downstream]
max_attempts = 3
backoff_base = "50ms"
max_backoff = "200ms"

[http]
listen = "127.0.0.1:0"

[limits]
default = [{ algorithm = "fixed_window", limit = 20, period = "1s" }]
EOF

say "mock Kafka broker, a stub that fails seller-3, two replicas"
"$bin" dev-broker --worker-topics 4 --config "$cfg" >"$tmp/broker.out" 2>"$tmp/broker.log" &
pids+=($!)
bootstrap=$(first_line "$tmp/broker.out" "dev-broker")
export THROTTLE__KAFKA__BROKERS=${bootstrap#bootstrap.servers=}
"$bin" stub --listen 127.0.0.1:0 --fail seller-3 >"$tmp/stub.out" 2>"$tmp/stub.log" &
stub_pid=$!
pids+=($stub_pid)
stub_url=$(first_line "$tmp/stub.out" "stub" | grep -o 'http://[^ ]*')
export THROTTLE__DOWNSTREAM__URL=$stub_url
echo "broker $THROTTLE__KAFKA__BROKERS, downstream $stub_url"
for r in 1 2; do
  "$bin" run --config "$cfg" >"$tmp/worker-$r.log" 2>&1 &
  workers+=($!)
done
sleep 6

say "load: 300 jobs over 5 sellers at 30/s"
"$bin" produce --config "$cfg" --jobs 300 --sellers 5 --skew 0 --rate 30 | tail -n1
sleep 2

say "seller-1 paused: limits pause seller-1 --reason 'INC-1 bad feed'"
"$bin" limits pause seller-1 --reason "INC-1 bad feed" --config "$cfg"
sleep 1
before=$(stub_count seller-1 calls)
"$bin" produce --config "$cfg" --jobs 100 --sellers 5 --skew 0 --rate 50 | tail -n1
"$bin" limits list --config "$cfg"
sleep 4
during=$(stub_count seller-1 calls)
echo "seller-1's calls at the downstream: $before one second after the pause, $during five seconds later"
if [ "$during" != "$before" ]; then
  echo "incident-demo: seller-1 was called $((during - before)) times while paused" >&2
  exit 1
fi
"$bin" limits resume seller-1 --config "$cfg"
sleep 3
echo "seller-1's calls 3 s after the resume: $(stub_count seller-1 calls)"

say "the downstream is fixed for seller-3: the stub restarts without --fail"
# Every seller-3 job has spent its attempts once the count has not moved
# for three seconds.
last=-1
still=0
for _ in $(seq 60); do
  n=$("$bin" dlq stats --json --config "$cfg" | json_field '["by_seller"].get("seller-3", 0)')
  if [ "$n" = "$last" ] && [ "$n" != 0 ]; then still=$((still + 1)); else still=0; fi
  [ "$still" -ge 3 ] && break
  last=$n
  sleep 1
done
port=${stub_url#http://127.0.0.1:}
port=${port%%/*}
kill "$stub_pid"
wait "$stub_pid" 2>/dev/null || true
"$bin" stub --listen "127.0.0.1:$port" >"$tmp/stub2.out" 2>"$tmp/stub2.log" &
pids+=($!)
first_line "$tmp/stub2.out" "stub" >/dev/null

say "dlq stats"
"$bin" dlq stats --config "$cfg"
say "dlq replay --kind attempts_exhausted --seller seller-3 --dry-run --limit 3"
"$bin" dlq replay --kind attempts_exhausted --seller seller-3 --dry-run --limit 3 --config "$cfg"
say "dlq replay --kind attempts_exhausted --seller seller-3"
first=$("$bin" dlq replay --kind attempts_exhausted --seller seller-3 --json --config "$cfg")
echo "$first"
say "the same replay again"
again=$("$bin" dlq replay --kind attempts_exhausted --seller seller-3 --json --config "$cfg")
echo "$again"
replayed=$(json_field '["replayed"]' <<<"$first")
if [ "$(json_field '["replayed"]' <<<"$again")" != 0 ]; then
  echo "incident-demo: the second replay wrote records again" >&2
  exit 1
fi
for _ in $(seq 30); do
  [ "$(stub_count seller-3 accepted)" -ge "$replayed" ] && break
  sleep 1
done
accepted=$(stub_count seller-3 accepted)
echo "seller-3: $replayed dead letters replayed, $accepted registrations accepted by the fixed downstream"
if [ "$accepted" != "$replayed" ]; then
  echo "incident-demo: $accepted of $replayed replayed jobs reached the downstream" >&2
  exit 1
fi
say "incident-demo: ok"
