# Sourced by the gateway benchmarks (bench-gateway.sh, bench-otlp.sh, callgrind-gateway.sh,
# heap-gateway.sh): what each of them needs to start processes on loopback, stop them, and load
# the gateway with the same requests, so that the four measure the same thing the same way.
#
# Sets WORK (a temporary directory, removed at exit) and PIDS (every process `start` began,
# killed at exit; a server's stderr is kept in WORK/err.NAME, and its panics, warnings and
# errors are printed at exit), and defines:
#   start NAME CORE command...   start a server, pinned to CORE with taskset ("-": not pinned),
#                                wait for "listening" on its stdout (START_WAIT tenths of a
#                                second, default 100), set NAME_PID and NAME_URL
#   write_repeated_body FILE     the "repeated" request: 20 messages, 3 tools, 9 tool calls
#   write_wrk_script FILE        a wrk script that POSTs $BODY_FILE and prints one RESULT line
#                                (requests, rps, p50_us, p99_us, errors)
#   write_otlp_sink FILE         an OTLP/HTTP sink (python3 FILE): 200 and an empty answer for
#                                every batch; GET answers "batches bytes" received so far
#   cpu_ticks PID                user + system clock ticks of a process (every thread)
#   field NAME LINE              the number after NAME= in a RESULT line
WORK=$(mktemp -d)
PIDS=()
# At exit: stop every server, show what a server said on stderr that a person must see (a
# panic, a warning, an error: the gateways log at RUST_LOG=warn; valgrind's own banner is not
# shown), then remove WORK.
cleanup() {
  local p f
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  for f in "$WORK"/err.*; do
    [[ -f $f ]] && grep -aqE 'panicked|WARN|ERROR' "$f" && { echo "--- ${f##*/err.} (stderr):" >&2; grep -aE 'panicked|WARN|ERROR' "$f" | head -20 >&2; }
  done
  rm -rf "$WORK"
}
trap cleanup EXIT

start() {
  local name=$1 core=$2; shift 2
  local f="$WORK/out.$name"
  if [[ $core == - ]]; then "$@" > "$f" 2> "$WORK/err.$name" &
  else taskset -c "$core" "$@" > "$f" 2> "$WORK/err.$name" &
  fi
  local pid=$!
  PIDS+=("$pid")
  for _ in $(seq "${START_WAIT:-100}"); do grep -aq listening "$f" && break; sleep 0.1; done
  grep -aq listening "$f" || { echo "$name did not start:" >&2; cat "$WORK/err.$name" >&2; exit 1; }
  printf -v "${name}_PID" '%s' "$pid"
  printf -v "${name}_URL" '%s' "$(grep -ao 'http://[0-9.:]*' "$f" | head -1)"
}

cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
field() { sed -E "s/.*[ ]$1=([0-9]+).*/\\1/" <<<"$2"; }

write_repeated_body() {
  python3 - "$1" <<'PY'
import json, sys
sys.path.insert(0, "scripts")
from bench_load import SYSTEM, TOOLS, history
m = [SYSTEM, {"role": "user", "content": "Find the population of the ten largest cities and sum it."}]
m += history(9)
assert len(m) == 20
json.dump({"model": "stub", "messages": m, "tools": TOOLS}, open(sys.argv[1], "w"))
PY
}

write_wrk_script() {
  cat > "$1" <<'LUA'
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
}

write_otlp_sink() {
  cat > "$1" <<'PY'
# An OTLP/HTTP sink: 200 and an empty ExportTraceServiceResponse for every batch; GET says how
# many batches and bytes arrived.
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
}
