# Sourced by the gateway benchmarks (bench-gateway.sh, bench-otlp.sh, callgrind-gateway.sh,
# heap-gateway.sh): sets BIN (the selfheal binary) and STUB (the scripted upstream), building
# them in CARGO_TARGET_DIR's release profile unless given. BIN=path/to/selfheal measures another
# build (e.g. the gateway before a change) against the same stub; STUB=path/to/stub_upstream
# another stub.
if [[ -z ${BIN:-} ]]; then
  cargo build -q --release -p selfheal-cli
  BIN=$CARGO_TARGET_DIR/release/selfheal
fi
if [[ -z ${STUB:-} ]]; then
  cargo build -q --release -p selfheal-gateway --example stub_upstream
  STUB=$CARGO_TARGET_DIR/release/examples/stub_upstream
fi
