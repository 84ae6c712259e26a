#!/usr/bin/env bash
# Build the documentation site (mdBook, sources in docs/, output in target/book/) and check
# every relative link and #anchor in it (scripts/check-links.py). Installs the pinned mdBook
# from crates.io when it is not on PATH (`cargo install`, search only: no watch/serve
# dependencies). No network but crates.io for that install.
#
#   scripts/build-docs.sh            # then open target/book/index.html
set -euo pipefail
cd "$(dirname "$0")/.."
MDBOOK_VERSION=0.5.4
if [[ "$(mdbook --version 2>/dev/null)" != "mdbook v$MDBOOK_VERSION" ]]; then
  echo "docs: cargo install mdbook $MDBOOK_VERSION (once)" >&2
  start=$(date +%s)
  cargo install mdbook --locked --version "$MDBOOK_VERSION" --no-default-features --features search
  echo "docs: mdbook installed in $(( $(date +%s) - start )) s" >&2
fi
start=$(date +%s)
mdbook build docs
echo "docs: built target/book in $(( $(date +%s) - start )) s" >&2
python3 scripts/check-links.py target/book
