#!/usr/bin/env bash
# Instructions per request of the gateway (callgrind), passthrough and healing, on the patterns
# of scripts/bench-gateway.sh: `repeated` (one identical body) and `realistic` (CONVERSATIONS
# conversations in flight, each TURNS turns, one new tool result per request; 16 rather than the
# load benchmark's 256, so that a few thousand requests cover whole conversations, 22 messages
# on average, and not only their first turns). The gateway runs
# under valgrind with one worker thread and no trace; the stub upstream runs natively. After
# WARM requests the counters are zeroed, N requests are sent one after another on one kept-alive
# connection, and the total instructions of every gateway thread are divided by N. With
# MAX_RUNS below the number of conversations sent, the healing gateway's run store is full and
# every new run evicts one (the pattern's "full" phase).
#
#   scripts/callgrind-gateway.sh                 # both patterns
#   PATTERNS=realistic MAX_RUNS=20 scripts/callgrind-gateway.sh   # the store full, evicting
#   KEEP=/tmp/cg scripts/callgrind-gateway.sh    # keep the profiles for callgrind_annotate
#   TRACE=1 scripts/callgrind-gateway.sh         # the trace on (its writer thread counted too)
#   CG_ARGS=--cache-sim=yes KEEP=/tmp/cg scripts/callgrind-gateway.sh   # cache misses too
#   OTLP=1 PATTERNS=repeated scripts/callgrind-gateway.sh   # + the healing gateway with OTLP
#       export on (OTEL_EXPORTER_OTLP_ENDPOINT) to a local sink that accepts every batch; the
#       exporter's batch thread is counted with the others. In this mode every arm waits
#       SETTLE seconds (default 6, past the export thread's 1 s schedule) before the dump, so
#       that the spans of the measured requests are exported inside the window, and prints
#       the ratio of the two healing arms.
set -euo pipefail
cd "$(dirname "$0")/.."
PATTERNS=${PATTERNS:-repeated realistic}
N=${N:-1000}
WARM=${WARM:-400}
CONVERSATIONS=${CONVERSATIONS:-16}
TURNS=${TURNS:-20}
MAX_RUNS=${MAX_RUNS:-10000}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-target}
export RUST_LOG=${RUST_LOG:-warn}
# BIN= and STUB= measure other builds (see bench-builds.sh); unset, both are built here.
source scripts/bench-builds.sh
# valgrind starts slowly: a minute for the gateway to say it is listening.
START_WAIT=600
source scripts/bench-lib.sh
printf 'max_runs = %s\n' "$MAX_RUNS" > "$WORK/gateway.toml"
start STUB - "$STUB" 127.0.0.1:0
settle_default=0
if [[ -n ${OTLP:-} ]]; then settle_default=6; fi
SETTLE=${SETTLE:-$settle_default}
if [[ -n ${OTLP:-} ]]; then
  write_otlp_sink "$WORK/sink.py"
  start SINK - python3 "$WORK/sink.py"
fi
if [[ -n ${TRACE:-} ]]; then trace="--trace-db $WORK/trace.db"; else trace=--no-trace; fi
grind() { # NAME extra serve args...
  local name=$1; shift
  start "$name" - valgrind --tool=callgrind ${CG_ARGS:-} --callgrind-out-file="$WORK/cg.$name.%p" \
    "$BIN" serve --config "$WORK/gateway.toml" --upstream "$STUB_URL/v1" --listen 127.0.0.1:0 \
    $trace --threads 1 "$@"
}
drive() { # NAME PATTERN: prints instructions per request
  local name=$1 pattern=$2 url pid
  url=${name}_URL; url=${!url}; pid=${name}_PID; pid=${!pid}
  python3 - "$url" "$pattern" "$WARM" "$N" "$pid" "$CONVERSATIONS" "$TURNS" "$name" "$SETTLE" <<'PY'
import http.client, json, subprocess, sys, time, urllib.parse
url, pattern, warm, n, pid, k, turns, tag = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5], int(sys.argv[6]), int(sys.argv[7]), sys.argv[8]
settle = float(sys.argv[9])
sys.path.insert(0, "scripts")
from bench_load import SYSTEM, TOOLS as tools, history
def opening(task):
    return [SYSTEM, {"role": "user", "content": f"Task {task}: find the ten largest cities and sum."}]
repeated = json.dumps({"model": "stub", "messages": opening("r") + history(9), "tools": tools})
slots, count, convs = {}, 0, 0
def body():
    global count, convs
    if pattern == "repeated":
        return repeated
    count += 1
    s = count % k
    c = slots.get(s)
    if c is None or c[1] >= turns:
        convs += 1
        c = [convs, 0]
        slots[s] = c
    c[1] += 1
    return json.dumps({"model": "stub", "tools": tools,
                       "messages": opening(f"{tag}-{c[0]}") + history(c[1])})
u = urllib.parse.urlsplit(url)
conn = http.client.HTTPConnection(u.hostname, u.port, timeout=120)
def send(m):
    for _ in range(m):
        conn.request("POST", "/v1/chat/completions", body=body(), headers={"content-type": "application/json"})
        r = conn.getresponse(); r.read()
        if r.status != 200:
            sys.exit(f"status {r.status}")
send(warm)
time.sleep(settle)
subprocess.run(["callgrind_control", "-z", pid], check=True, capture_output=True)
send(n)
time.sleep(settle)
subprocess.run(["callgrind_control", "-d", pid], check=True, capture_output=True)
PY
  local f=$WORK/cg.$name.$pid.1 total
  total=$(awk '/^summary:/ {print $2}' "$f")
  echo "$name $pattern instructions_per_request=$((total / N)) (N=$N, max_runs=$MAX_RUNS)"
  printf -v "${name}_IPR" '%s' "$((total / N))"
  if [[ -n ${KEEP:-} ]]; then cp "$f" "$KEEP/cg.$name.$pattern"; fi
  rm -f "$f"
}
for pattern in $PATTERNS; do
  grind PASS --passthrough
  drive PASS "$pattern"
  kill "$PASS_PID"; wait "$PASS_PID" 2>/dev/null || true
  grind HEAL
  drive HEAL "$pattern"
  kill "$HEAL_PID"; wait "$HEAL_PID" 2>/dev/null || true
  if [[ -n ${OTLP:-} ]]; then
    OTEL_EXPORTER_OTLP_ENDPOINT=$SINK_URL grind OTLP
    drive OTLP "$pattern"
    kill "$OTLP_PID"; wait "$OTLP_PID" 2>/dev/null || true
    python3 -c "import sys; p, h, o = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]); print(f'OTLP/HEAL {p} {o / h:.3f} (+{o - h} instructions per request)')" \
      "$pattern" "$HEAL_IPR" "$OTLP_IPR"
  fi
done
