#!/usr/bin/env bash
# Where the gateway's memory goes, per stored run: the gateway built without mimalloc (heaptrack
# sees the system allocator alone) runs under heaptrack with one worker thread and the trace on,
# while CONVERSATIONS (1,500) conversations of scripts/bench-gateway.sh's realistic pattern, TURNS
# (20) turns each, are sent one after another (one run each, none evicted). Prints RSS before and
# after, the runs live, the peak heap, and the allocation sites holding the most at the peak, by
# their two innermost selfheal frames. About 10 MB of the peak is the trace writer's fixed
# buffers; the rest divided by the runs is what a stored run holds.
# Needs heaptrack (Debian: apt-get install heaptrack).
#
#   scripts/heap-gateway.sh
#   BIN=/path/to/selfheal scripts/heap-gateway.sh   # another build (it must be built without
#       mimalloc: cargo build --release -p selfheal-cli --no-default-features --features gateway)
set -euo pipefail
cd "$(dirname "$0")/.."
CONVERSATIONS=${CONVERSATIONS:-1500}
TURNS=${TURNS:-20}
command -v heaptrack >/dev/null || { echo "heap-gateway: needs heaptrack (apt-get install heaptrack)" >&2; exit 1; }
if [[ -z ${BIN:-} ]]; then
  # Its own target directory: another feature set would rebuild the default release binary.
  CARGO_TARGET_DIR=target/heap cargo build -q --release -p selfheal-cli --no-default-features --features gateway
  BIN=target/heap/release/selfheal
fi
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-target}
source scripts/bench-builds.sh
source scripts/bench-lib.sh
start STUB - "$STUB" 127.0.0.1:0
printf 'max_runs = %s\n' "$((CONVERSATIONS + 1000))" > "$WORK/gateway.toml"
RUST_LOG=warn heaptrack -o "$WORK/heap" "$BIN" serve --config "$WORK/gateway.toml" \
  --upstream "$STUB_URL/v1" --listen 127.0.0.1:0 --trace-db "$WORK/trace.db" --threads 1 > "$WORK/gw.out" 2>&1 &
HT=$!
PIDS+=($HT)
for _ in $(seq 100); do grep -aq listening "$WORK/gw.out" && break; sleep 0.2; done
URL=$(grep -ao 'http://[0-9.:]*' "$WORK/gw.out" | head -1)
PID=$(pgrep -f "^$BIN serve --config $WORK/gateway.toml" | head -1)
python3 - "$URL" "$CONVERSATIONS" "$TURNS" "$PID" <<'PY'
import http.client, json, sys, urllib.parse
url, n, turns, pid = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
sys.path.insert(0, "scripts")
from bench_load import SYSTEM, TOOLS as tools, turn
u = urllib.parse.urlsplit(url)
c = http.client.HTTPConnection(u.hostname, u.port)
rss = lambda: next(l.split()[1] for l in open(f"/proc/{pid}/status") if l.startswith("VmRSS"))
print(f"rss_kib_before={rss()}")
for k in range(n):
    m = [SYSTEM, {"role": "user", "content": f"Task {k}: find the ten largest cities and sum."}]
    for i in range(turns):
        m += turn(i)
        c.request("POST", "/v1/chat/completions", headers={"content-type": "application/json"},
                  body=json.dumps({"model": "stub", "tools": tools, "messages": m}))
        r = c.getresponse(); r.read()
        if r.status != 200:
            sys.exit(f"heap-gateway: the gateway answered {r.status}")
print(f"rss_kib_after={rss()} conversations={n} turns={turns}")
PY
python3 -c "import urllib.request,sys; print([l for l in urllib.request.urlopen(sys.argv[1] + '/metrics').read().decode().splitlines() if l.startswith('selfheal_runs_live ')][0])" "$URL"
kill "$PID"
wait "$HT" || true
heaptrack_print -f "$WORK/heap.zst" --print-peaks 0 --print-allocators 0 --print-temporary 0 \
  --print-leaks 0 -F "$WORK/flame.txt" --flamegraph-cost-type peak > /dev/null 2>&1
python3 - "$WORK/flame.txt" "$CONVERSATIONS" <<'PY'
import collections, re, sys
by, total = collections.Counter(), 0
for line in open(sys.argv[1]):
    stack, _, n = line.rstrip().rpartition(" ")
    n = int(n); total += n
    frames = [re.sub(r"::h[0-9a-f]{16}", "", f) for f in stack.split(";") if "selfheal" in f]
    by[" <- ".join(f[-60:] for f in frames[-2:][::-1]) or "(no selfheal frame)"] += n
print(f"peak_heap_bytes={total} per_conversation_bytes={total / int(sys.argv[2]):.0f} (with ~10 MB of fixed buffers)")
for site, n in by.most_common(15):
    print(f"{n / 1e6:8.2f} MB  {site}")
PY
