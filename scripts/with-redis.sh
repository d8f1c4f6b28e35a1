#!/usr/bin/env bash
# Runs a command with a Redis at $REDIS_URL, e.g.
#
#   scripts/with-redis.sh cargo run -- demo
#   scripts/with-redis.sh cargo test
#
# If REDIS_URL is set and a server answers there, the command runs against
# it. Otherwise a throwaway redis-server (Debian's package, installed with
# apt-get if missing, as root or through sudo) is started on a spare
# loopback port with no persistence, REDIS_URL points at it for the
# command, and it is stopped when the command ends. The command's exit
# status is the script's.
set -euo pipefail

if [ $# -eq 0 ]; then
  echo "usage: $0 COMMAND [ARG...]   (runs COMMAND with a Redis at \$REDIS_URL)" >&2
  exit 2
fi

say() { printf 'with-redis: %s\n' "$*" >&2; }

# Does a server answer a PING at redis://[user[:password]@]host[:port][/db]?
# Any reply counts (a server that wants AUTH answers -NOAUTH): the command
# brings the credentials. Only bash's /dev/tcp is used, so no redis-cli is
# needed for a Redis that is already there.
answers() {
  local url=$1 rest host port reply
  case "$url" in
    redis://*) rest=${url#redis://} ;;
    # TLS cannot be spoken through /dev/tcp: trust the caller.
    rediss://*) return 0 ;;
    *) return 1 ;;
  esac
  rest=${rest##*@}      # drop credentials
  rest=${rest%%/*}      # drop the database
  host=${rest%:*}
  port=${rest##*:}
  [ "$host" = "$rest" ] && port=6379
  host=${host#[}; host=${host%]}
  [ -n "$host" ] || host=127.0.0.1
  reply=$(
    exec 2>/dev/null
    exec 3<>"/dev/tcp/$host/$port" || exit 1
    printf 'PING\r\n' >&3
    IFS= read -r -t 2 line <&3 || exit 1
    printf '%s' "$line"
  ) || return 1
  case "$reply" in
    +* | -*) return 0 ;;
    *) return 1 ;;
  esac
}

if [ -n "${REDIS_URL:-}" ]; then
  if answers "$REDIS_URL"; then
    exec "$@"
  fi
  # The URL is not printed: it may carry a password.
  say "nothing answers at \$REDIS_URL; starting a throwaway redis-server instead"
fi

if ! command -v redis-server >/dev/null 2>&1; then
  as_root=()
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null || { say "redis-server is not installed and this is not root (no sudo): install it (apt-get install redis-server) or set REDIS_URL"; exit 1; }
    as_root=(sudo -E)
  fi
  say "installing redis-server (apt-get)"
  export DEBIAN_FRONTEND=noninteractive
  "${as_root[@]}" apt-get update -qq
  "${as_root[@]}" apt-get install -y -qq redis-server >/dev/null
fi

port=""
for p in $(shuf -i 20000-29999 -n 20); do
  if ! (exec 3<>/dev/tcp/127.0.0.1/"$p") 2>/dev/null; then port=$p; break; fi
done
[ -n "$port" ] || { say "no free loopback port for Redis"; exit 1; }

dir=$(mktemp -d)
pid=""
stop() {
  if [ -n "$pid" ]; then
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  fi
  rm -rf "$dir"
}
trap stop EXIT
# INT/TERM: stop Redis, then end with the signal's usual status.
trap 'exit 130' INT
trap 'exit 143' TERM

say "starting redis-server on 127.0.0.1:$port (no persistence; stopped at the end)"
redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no \
  --dir "$dir" --logfile "$dir/redis.log" &
pid=$!
export REDIS_URL="redis://127.0.0.1:$port"
for _ in $(seq 1 100); do
  answers "$REDIS_URL" && break
  kill -0 "$pid" 2>/dev/null || break
  sleep 0.1
done
if ! answers "$REDIS_URL"; then
  say "redis-server did not start:"
  cat "$dir/redis.log" >&2 || true
  exit 1
fi

# Not exec: the trap must stop Redis when the command ends.
status=0
"$@" || status=$?
exit "$status"
