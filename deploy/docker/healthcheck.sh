#!/bin/bash
# The image's HEALTHCHECK: GET /healthz on the worker's own http.listen port
# and succeed on a 200 only.
#
# Why bash and /dev/tcp rather than curl: the run stage stays at its
# runtime libraries (curl would add itself, libcurl and a dozen libraries to
# every image, and a tool an intruder can use), and a healthcheck
# subcommand of the worker is not wanted. bash is in debian:bookworm-slim.
#
# The port follows THROTTLE__HTTP__LISTEN (the image sets 0.0.0.0:9898), so
# a deployment that moves the listener does not need a new healthcheck.
# Usage: healthcheck.sh [HOST:PORT]   (default 127.0.0.1 and that port)
set -u
listen=${THROTTLE__HTTP__LISTEN:-127.0.0.1:9898}
port=${listen##*:}
host=127.0.0.1
if [ $# -gt 0 ]; then
  host=${1%:*}
  port=${1##*:}
fi
# Docker's --timeout also kills a hung check; this one bounds the read.
{ exec 3<>"/dev/tcp/$host/$port"; } 2>/dev/null || { echo "healthcheck: nothing listens on $host:$port" >&2; exit 1; }
# One write of the whole request; a peer that hangs up is an error to
# report, not a SIGPIPE that kills the check without a word.
trap '' PIPE
request=$'GET /healthz HTTP/1.1\r\nHost: '"$host"$'\r\nConnection: close\r\n\r\n'
printf '%s' "$request" >&3 2>/dev/null || { echo "healthcheck: $host:$port closed the connection" >&2; exit 1; }
IFS= read -r -t 5 status <&3 || { echo "healthcheck: no answer from $host:$port" >&2; exit 1; }
status=${status%$'\r'}
case $status in
  "HTTP/1."?" 200"*) exit 0 ;;
  *) echo "healthcheck: $status" >&2; exit 1 ;;
esac
