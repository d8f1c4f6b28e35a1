#!/usr/bin/env bash
# The test command: installs what the build needs, starts a throwaway Redis
# on a spare loopback port (unless REDIS_URL answers), then runs the format
# check, clippy and every test. The Kafka tests embed librdkafka's mock
# cluster, so nothing else has to run. Extra arguments go to `cargo test`.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
exec scripts/with-redis.sh bash -c '
  set -euo pipefail
  printf "\n=== cargo fmt --check\n"
  cargo fmt --all -- --check
  printf "\n=== cargo clippy\n"
  cargo clippy --all-targets -- -D warnings
  printf "\n=== cargo test (REDIS_URL=%s)\n" "$REDIS_URL"
  cargo test "$@"
' test.sh "$@"
