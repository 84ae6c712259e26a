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
cargo build -q --release -p selfheal-cli
cargo build -q --release -p selfheal-gateway --example stub_upstream
BIN=$CARGO_TARGET_DIR/release/selfheal
STUB=$CARGO_TARGET_DIR/release/examples/stub_upstream
WORK=$(mktemp -d)
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$WORK"; }
trap cleanup EXIT

python3 - "$WORK/body.json" <<'PY'
import json, sys
tools = [{"type": "function", "function": {"name": n, "description": f"{n} things",
          "parameters": {"type": "object", "properties": {"query": {"type": "string"},
          "limit": {"type": "integer", "default": 5}}, "required": ["query"]}}}
         for n in ("search", "lookup", "fetch")]
m = [{"role": "system", "content": "You are a research agent. Use the tools."},
     {"role": "user", "content": "Find the population of the ten largest cities and sum it."}]
for i in range(9):
    m.append({"role": "assistant", "content": None, "tool_calls": [{"id": f"call_{i}",
              "type": "function", "function": {"name": "search",
              "arguments": json.dumps({"query": f"city {i} population"})}}]})
    m.append({"role": "tool", "tool_call_id": f"call_{i}",
              "content": json.dumps({"results": [{"city": f"c{i}", "population": 1000000 + i}]})})
json.dump({"model": "stub", "messages": m, "tools": tools}, open(sys.argv[1], "w"))
PY
cat > "$WORK/post.lua" <<'LUA'
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
local f = io.open(os.getenv("BODY_FILE"), "r"); wrk.body = f:read("*a"); f:close()
done = function(summary, latency, requests)
  io.write(string.format("RESULT requests=%d rps=%.0f p50_us=%d p99_us=%d errors=%d\n",
    summary.requests, summary.requests / (summary.duration / 1e6), latency:percentile(50),
    latency:percentile(99),
    summary.errors.status + summary.errors.connect + summary.errors.read + summary.errors.timeout))
end
LUA
export BODY_FILE=$WORK/body.json
cat > "$WORK/sink.py" <<'PY'
# An OTLP/HTTP sink: 200 and an empty ExportTraceServiceResponse for every batch; GET says how
# many batches and bytes arrived.
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
got = {"batches": 0, "bytes": 0}
class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *a): pass
    def do_POST(self):
        n = int(self.headers.get("content-length", 0)); self.rfile.read(n)
        got["batches"] += 1; got["bytes"] += n
        self.send_response(200); self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", "0"); self.end_headers()
    def do_GET(self):
        b = f'{got["batches"]} {got["bytes"]}'.encode()
        self.send_response(200); self.send_header("content-length", str(len(b))); self.end_headers()
        self.wfile.write(b)
s = ThreadingHTTPServer(("127.0.0.1", 0), H)
print(f"listening on http://127.0.0.1:{s.server_address[1]}", flush=True)
s.serve_forever()
PY

start() { # NAME core command... ; sets NAME_PID and NAME_URL
  local name=$1 core=$2; shift 2
  local f="$WORK/out.$name"
  taskset -c "$core" "$@" > "$f" &
  local pid=$!
  PIDS+=("$pid")
  for _ in $(seq 100); do grep -q listening "$f" && break; sleep 0.1; done
  printf -v "${name}_PID" '%s' "$pid"
  printf -v "${name}_URL" '%s' "$(grep -o 'http://[0-9.:]*' "$f")"
}
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
field() { sed -E "s/.*[ ]$1=([0-9]+).*/\\1/" <<<"$2"; }

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
