#!/usr/bin/env bash
# Installs the Debian packages the build and the tests need, if missing:
# librdkafka builds from source (C toolchain, cmake, openssl for the ssl
# feature, sasl headers, zlib), Redis for the integration tests and the demo,
# procps for the process tests (kill), openssl for the TLS test's
# certificates. As root, or through sudo.
set -euo pipefail

pkgs=(build-essential cmake pkg-config libssl-dev libsasl2-dev zlib1g-dev python3 redis-server redis-tools procps openssl)
missing=()
for p in "${pkgs[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "install-deps: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
as_root=()
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "install-deps: missing ${missing[*]} and not root (no sudo)" >&2; exit 1; }
  as_root=(sudo -E)
fi
"${as_root[@]}" apt-get update -qq
"${as_root[@]}" apt-get install -y -qq "${missing[@]}"
