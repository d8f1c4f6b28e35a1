#!/usr/bin/env bash
# Builds the book (docs/ -> docs/book/) with mdbook, installing a pinned
# mdbook from crates.io when missing (about 5 minutes on 2 cores, once;
# with its search, without its `serve` and `watch` features, which need a server and a file
# watcher the build does not). Fails on any error or warning mdbook prints:
# an {{#include}} of a file that moved, a page SUMMARY.md names that does
# not exist (book.toml sets create-missing = false). The links inside the
# pages are checked by `cargo test --test deploy docs::links`.
# `scripts/book.sh serve` serves it on 127.0.0.1:3000 instead (needs an
# mdbook with its default features: `cargo install mdbook`).
set -euo pipefail
cd "$(dirname "$0")/.."
MDBOOK_VERSION=0.5.4
export PATH="$HOME/.cargo/bin:$PATH"
if ! command -v mdbook >/dev/null || [ "$(mdbook --version)" != "mdbook v$MDBOOK_VERSION" ]; then
  printf "\n=== cargo install mdbook %s\n" "$MDBOOK_VERSION"
  cargo install --locked mdbook --version "$MDBOOK_VERSION" --no-default-features --features search
fi
if [ "${1:-}" = serve ]; then
  exec mdbook serve docs --hostname 127.0.0.1
fi
printf "\n=== mdbook build docs\n"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
mdbook build docs 2>&1 | tee "$log"
if grep -Eq '\b(ERROR|WARN)\b' "$log"; then
  echo "book.sh: mdbook reported errors or warnings (above)" >&2
  exit 1
fi
echo "book.sh: docs/book/index.html"
