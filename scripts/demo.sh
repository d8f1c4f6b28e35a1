#!/usr/bin/env bash
# The demo command: installs what the build needs, makes sure a Redis runs
# (a throwaway one unless REDIS_URL answers), then runs `throttle-worker
# demo` with any arguments given (e.g. --duration 20s --replicas 4).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
exec scripts/with-redis.sh cargo run -- demo "$@"
