#!/usr/bin/env bash
# Installs the Debian packages the build and the tests need, if missing:
# librdkafka builds from source with its own configure and make (C
# toolchain, pkg-config, OpenSSL headers for the ssl feature, zlib, and
# python3 for the linker script its Makefile generates; no cmake: the
# cmake-build feature is off, nor SASL headers: gssapi is off),
# ca-certificates for cargo and rustup to fetch over HTTPS, Redis for the
# integration tests and the demo (redis-tools: redis-cli), procps for the
# process tests (kill), openssl for the TLS test's certificates. As root,
# or through sudo. Extra package names as arguments are installed too
# (scripts/stress-suite.sh asks for stress).
set -euo pipefail

pkgs=(build-essential pkg-config libssl-dev zlib1g-dev python3 ca-certificates redis-server redis-tools procps openssl)
pkgs+=("$@")
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
