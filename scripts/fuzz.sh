#!/usr/bin/env bash
# Runs one libFuzzer target (cargo-fuzz, nightly) for a while; prints its final statistics.
#
#   scripts/fuzz.sh TARGET [SECONDS, default 300] [extra libFuzzer flags]
#   scripts/fuzz.sh sse 600 -jobs=2
#
# Targets (fuzz/fuzz_targets/, bodies shared with the stable replay tests):
#   request              the gateway's request view: read, write back with edits
#   sse                  the gateway's SSE relay on any upstream stream
#   repair               selfheal_repair::repair on any bytes: no panic, valid JSON out
#   repair_differential  repair(corrupt(v)) == v or a refusal; prefixes keep whole values only
#
# Needs the nightly toolchain and cargo-fuzz (`cargo install cargo-fuzz --locked`). The corpus
# grows in fuzz/corpus/TARGET (gitignored); fuzz/seeds/TARGET (committed) is read too, and is
# what `cargo test` replays on stable. A crash lands in fuzz/artifacts/TARGET: add it to
# fuzz/seeds/TARGET and fix it with a regression test in the crate's own suite.
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
TARGET=${1:?usage: scripts/fuzz.sh TARGET [SECONDS] [libFuzzer flags]}
SECS=${2:-300}
shift $(( $# < 2 ? $# : 2 ))
export CARGO_TARGET_DIR=${FUZZ_TARGET_DIR:-target}
dict=()
case $TARGET in request | sse) dict=(-dict=dicts/openai.dict) ;; esac
mkdir -p "corpus/$TARGET"
exec cargo +nightly fuzz run "$TARGET" "corpus/$TARGET" "seeds/$TARGET" -- \
  -max_total_time="$SECS" -print_final_stats=1 "${dict[@]}" "$@"
