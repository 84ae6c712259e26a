#!/usr/bin/env bash
# Checks the minimum supported Rust version: `rust-version` in the root Cargo.toml's
# [workspace.package], which every crate inherits (`rust-version.workspace = true`).
#
#  1. every crate inherits it, and no dependency in Cargo.lock asks for a newer Rust;
#  2. the workspace compiles with exactly that toolchain: `cargo +MSRV check --workspace
#     --all-targets` (rustup installs the toolchain, minimal profile, on first use). Where rustup
#     cannot reach its download server this step says so and is skipped; clippy's
#     `incompatible_msrv` lint (on by default, run by .ci/run) still flags standard-library APIs
#     newer than the MSRV, but not language features, so then step 2 is worth running by hand.
set -euo pipefail
cd "$(dirname "$0")/.."
MSRV=$(sed -n 's/^rust-version = "\(.*\)"/\1/p' Cargo.toml)
[[ -n "$MSRV" ]] || { echo "msrv: no rust-version in [workspace.package]" >&2; exit 1; }
echo "msrv: $MSRV"

for manifest in crates/*/Cargo.toml; do
  grep -q '^rust-version.workspace = true' "$manifest" \
    || { echo "msrv: $manifest does not inherit rust-version (rust-version.workspace = true)" >&2; exit 1; }
done

cargo metadata --format-version 1 --locked --filter-platform "$(rustc -vV | sed -n 's/^host: //p')" \
  | python3 -c '
import json, sys
def version(text):
    parts = [int(x) for x in text.split(".")]
    return tuple(parts + [0] * (3 - len(parts)))
msrv = version(sys.argv[1])
m = json.load(sys.stdin)
used = {n["id"] for n in m["resolve"]["nodes"]}
bad = [(p["name"], p["version"], p["rust_version"]) for p in m["packages"]
       if p["id"] in used and p.get("rust_version") and version(p["rust_version"]) > msrv]
for name, version, rv in bad:
    print(f"msrv: {name} {version} needs Rust {rv}", file=sys.stderr)
sys.exit(1 if bad else 0)
' "$MSRV"
echo "msrv: no dependency needs a newer Rust"

if rustup toolchain install "$MSRV" --profile minimal --no-self-update >/dev/null 2>&1; then
  cargo "+$MSRV" check -q --workspace --all-targets --locked --target-dir target/msrv
  echo "msrv: the workspace compiles with Rust $MSRV"
else
  echo "msrv: SKIPPED compiling with Rust $MSRV: rustup could not install it here" >&2
fi
