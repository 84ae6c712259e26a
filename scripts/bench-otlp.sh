#!/usr/bin/env bash
# What OTLP export costs the gateway at saturation: the healing gateway without export and with
# export (OTEL_EXPORTER_OTLP_ENDPOINT) to a local OTLP/HTTP sink that accepts every batch, side
# by side in interleaved pairs. CPU per request is read from /proc (every thread of the process,
# the exporter's batch thread included). The gateway is pinned to core 0 with one worker
# thread; wrk, the stub upstream and the sink share core 1. The request is bench-gateway.sh's
# "repeated" one (20 messages, 3 tools, answered with a tool call). The export thread sends
# batches of up to 2,048 spans at least every second; a request past a full queue (8,192
# requests) is dropped, not waited for — the sink's count and the gateway's
# selfheal_otlp_spans_dropped_total say how many arrived and how many were dropped.
#
#   scripts/bench-otlp.sh [seconds per run, default 10] [pairs, default 3]
set -euo pipefail
cd "$(dirname "$0")/.."
SECS=${1:-10}
PAIRS=${2:-3}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-target}
export RUST_LOG=${RUST_LOG:-warn}
command -v wrk >/dev/null || { echo "needs wrk (apt-get install wrk)" >&2; exit 1; }
# BIN= and STUB= measure other builds (see bench-builds.sh); unset, both are built here.
source scripts/bench-builds.sh
source scripts/bench-lib.sh
write_repeated_body "$WORK/body.json"
write_wrk_script "$WORK/post.lua"
export BODY_FILE=$WORK/body.json
write_otlp_sink "$WORK/sink.py"

start STUB 1 "$STUB" 127.0.0.1:0
start SINK 1 python3 "$WORK/sink.py"
start OFF 0 "$BIN" serve --upstream "$STUB_URL/v1" --listen 127.0.0.1:0 --no-trace --threads 1
start ON 0 env OTEL_EXPORTER_OTLP_ENDPOINT="$SINK_URL" "$BIN" serve --upstream "$STUB_URL/v1" \
  --listen 127.0.0.1:0 --no-trace --threads 1
TICK=$(getconf CLK_TCK)
echo "## saturation, gateway on one core (wrk -t1 -c32, ${SECS}s), ${PAIRS} interleaved pairs"
for pair in $(seq "$PAIRS"); do
  for name in OFF ON; do
    pid_var=${name}_PID url_var=${name}_URL
    before=$(cpu_ticks "${!pid_var}")
    line=$(taskset -c 1 wrk -t1 -c32 -d"${SECS}s" -s "$WORK/post.lua" "${!url_var}/v1/chat/completions" | grep RESULT)
    after=$(cpu_ticks "${!pid_var}")
    n=$(field requests "$line")
    us=$(( (after - before) * 1000000 / TICK / (n > 0 ? n : 1) ))
    echo "pair $pair export=$name $line cpu_us_per_request=$us"
  done
done
sleep 6  # one more scheduled export
echo "sink received (batches bytes): $(curl -s "$SINK_URL/")"
echo "gateway $(curl -s "$ON_URL/metrics" | grep '^selfheal_otlp_spans_dropped_total')"
