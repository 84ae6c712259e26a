#!/usr/bin/env bash
# `pip install selfheal` works: build the wheel of crates/selfheal-cli (maturin, `bindings =
# "bin"`, the full binary), install it into a fresh venv, and run `selfheal bench` and
# `selfheal serve` from that venv (scripts/wheel-smoke.py: the gateway in front of the e2e
# fault-injecting upstream, on port 0).
#
#   scripts/test-wheel.sh                       # dev profile: reuses `cargo test`'s build
#   WHEEL_PROFILE=release scripts/test-wheel.sh # the wheel you would publish
#
# maturin comes from PyPI into a throwaway venv (MATURIN_VERSION pins it); the wheel is built
# with the workspace's target directory (CARGO_TARGET_DIR or target/), so the dependencies
# compiled by the tests are reused — all but the ~30 crates whose features differ when
# `selfheal-cli` is built alone (107 s in all after `cargo test --workspace` on a busy 2-core
# machine; 54 s after `cargo build -p selfheal-cli`). The only downloads are maturin; nothing but loopback at
# run time. The wheel is left in target/wheels/ for `pip install target/wheels/selfheal-*.whl`.
set -euo pipefail
cd "$(dirname "$0")/.."
MATURIN_VERSION=${MATURIN_VERSION:-1.16.0}
PROFILE=${WHEEL_PROFILE:-dev}
TARGET_DIR=${CARGO_TARGET_DIR:-$PWD/target}
OUT=$TARGET_DIR/wheels
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
start=$(date +%s)

echo "wheel: [1/4] maturin $MATURIN_VERSION into a throwaway venv" >&2
python3 -m venv "$WORK/build"
"$WORK/build/bin/pip" install -q --disable-pip-version-check "maturin==$MATURIN_VERSION"

echo "wheel: [2/4] maturin build --profile $PROFILE (target dir $TARGET_DIR)" >&2
rm -f "$OUT"/selfheal-*.whl
CARGO_TARGET_DIR=$TARGET_DIR "$WORK/build/bin/maturin" build --locked --profile "$PROFILE" \
  --manifest-path crates/selfheal-cli/Cargo.toml --out "$OUT" >&2
wheel=$(ls "$OUT"/selfheal-*.whl)
echo "wheel: built $wheel ($(du -h "$wheel" | cut -f1))" >&2

echo "wheel: [3/4] pip install into a fresh venv" >&2
python3 -m venv "$WORK/user"
"$WORK/user/bin/pip" install -q --disable-pip-version-check --no-index "$wheel"
BIN=$WORK/user/bin/selfheal
[[ -x "$BIN" ]] || { echo "wheel: the wheel installed no $BIN" >&2; exit 1; }
"$BIN" --version

echo "wheel: [4/4] selfheal bench and selfheal serve from the venv" >&2
"$WORK/user/bin/python" scripts/wheel-smoke.py "$BIN"
echo "wheel: ok in $(( $(date +%s) - start )) s" >&2
