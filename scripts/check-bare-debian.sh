#!/usr/bin/env bash
# Does the README's test command find everything it needs on a bare
# Debian 12? Builds a minimal bookworm (debootstrap --variant=minbase) in
# DIR, lists which of the tools the build and the tests call it lacks, runs
# scripts/install-deps.sh in it, builds the C parts (librdkafka, OpenSSL,
# zlib bindings) from an empty cargo home, and runs three test binaries
# (TLS certificates with openssl, worker processes, Redis faults with
# kill(1)) built beforehand in this checkout's target/ against the
# packages install-deps installed. As root; needs debootstrap and the
# Debian mirror. The Rust toolchain is the host's rust-toolchain.toml one,
# copied in (a bare machine gets it from rustup).
#
#   cargo test --no-run   # the test binaries it runs
#   sudo scripts/check-bare-debian.sh /srv/bare
set -euo pipefail
root=${1:?usage: $0 DIR (a new or earlier debootstrap of bookworm)}
repo=$(cd "$(dirname "$0")/.." && pwd)
channel=$(sed -n 's/^channel = "\(.*\)"/\1/p' "$repo/rust-toolchain.toml")
toolchain=$(rustup toolchain list -v | awk -v c="$channel" 'index($1, c) == 1 { print $NF; exit }')

[ -x "$root/bin/bash" ] || debootstrap --variant=minbase bookworm "$root" http://deb.debian.org/debian
mountpoint -q "$root/proc" || mount -t proc proc "$root/proc"
mountpoint -q "$root/dev" || mount --bind /dev "$root/dev"
mkdir -p "$root$repo" "$root/opt"
mountpoint -q "$root$repo" || mount --bind "$repo" "$root$repo"
cleanup() { umount "$root$repo" "$root/dev" "$root/proc" 2>/dev/null || true; }
trap cleanup EXIT
cp /etc/resolv.conf "$root/etc/resolv.conf"
# Behind a TLS-intercepting proxy, crates.io is reached through the host's
# own certificate authorities.
if compgen -G "/usr/local/share/ca-certificates/*.crt" >/dev/null; then
  mkdir -p "$root/usr/local/share/ca-certificates"
  cp /usr/local/share/ca-certificates/*.crt "$root/usr/local/share/ca-certificates/"
fi
[ -d "$root/opt/rust" ] || cp -aL "$toolchain" "$root/opt/rust"

in_root() {
  chroot "$root" env -i HOME=/root PATH=/opt/rust/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    CARGO_HOME=/root/.cargo-empty CARGO_TARGET_DIR=/root/target bash -c "$1"
}
echo "=== what a bare bookworm lacks"
for c in cc make pkg-config python3 perl redis-server redis-cli kill openssl promtool prometheus kubectl; do
  in_root "type -P $c >/dev/null" && echo "  has $c" || echo "  lacks $c"
done
echo "=== scripts/install-deps.sh"
in_root "cd $repo && scripts/install-deps.sh && (update-ca-certificates >/dev/null 2>&1 || true)"
# scripts/check-deploy.sh's tools: promtool comes with install-deps;
# kubectl does not (bookworm's kubernetes-client is too old for the
# overlays), so a bare bookworm needs it from pkgs.k8s.io.
in_root "type -P promtool >/dev/null && python3 -m venv --help >/dev/null" && echo "  promtool and python3-venv installed"
in_root "type -P kubectl >/dev/null" || echo "  still lacks kubectl: scripts/check-deploy.sh fails until it is installed"
echo "=== the C parts, from an empty cargo home"
in_root "cd $repo && cargo build -q -p rdkafka-sys -p openssl-sys -p libz-sys"
echo "=== test binaries against the installed packages"
in_root "cd $repo && scripts/with-redis.sh bash -c '
  for t in redis_tls worker_startup redis_faults; do
    f=\$(ls target/debug/deps/\$t-* | grep -v \"\\.d\$\" | head -1)
    \$f -q
  done'"
echo "=== a bare bookworm runs the build and these tests after install-deps"
