#!/usr/bin/env python3
"""How much of the trace a kill -9 under load loses.

Starts the scripted upstream (tests/e2e/upstream.py) and `selfheal serve` with a trace, sends
requests from THREADS threads (each a new conversation), kills the gateway with SIGKILL after
SECONDS, and counts the answers a client received whole whose run has no `response` event in the
trace. Standard library only.

    scripts/trace-loss.py [--bin target/debug/selfheal] [--seconds 3] [--threads 16] [--rounds 5]
"""

import argparse
import http.client
import json
import os
import pathlib
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
import uuid

ROOT = pathlib.Path(__file__).resolve().parents[1]


def read_address(proc):
    line = proc.stdout.readline()
    return line.split("listening on ", 1)[1].strip()


def one_round(binary, seconds, threads):
    with tempfile.TemporaryDirectory() as tmp:
        up = subprocess.Popen([sys.executable, str(ROOT / "tests/e2e/upstream.py")],
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        up_url = read_address(up)
        db = pathlib.Path(tmp) / "trace.db"
        gw = subprocess.Popen([binary, "serve", "--upstream", up_url + "/v1", "--listen", "127.0.0.1:0",
                               "--trace-db", str(db)], stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, text=True, env={**os.environ, "RUST_LOG": "warn"})
        host, port = read_address(gw).split("//", 1)[1].split(":")
        done, lock, stop = [], threading.Lock(), threading.Event()

        def worker():
            conn = http.client.HTTPConnection(host, int(port), timeout=10)
            while not stop.is_set():
                body = json.dumps({"model": "stub", "messages": [
                    {"role": "user", "content": f"task {uuid.uuid4()}"}]})
                try:
                    conn.request("POST", "/v1/chat/completions", body=body,
                                 headers={"content-type": "application/json"})
                    r = conn.getresponse()
                    data = r.read()
                    json.loads(data)  # whole
                    with lock:
                        done.append(r.getheader("x-selfheal-run"))
                except Exception:
                    return

        ts = [threading.Thread(target=worker) for _ in range(threads)]
        for t in ts:
            t.start()
        time.sleep(seconds)
        gw.send_signal(signal.SIGKILL)
        gw.wait()
        stop.set()
        for t in ts:
            t.join()
        up.kill()
        up.wait()
        c = sqlite3.connect(db)
        logged = {r for (r,) in c.execute(
            "SELECT r.run FROM events e JOIN runs r ON r.id = e.run_id WHERE e.kind = 'response'")}
        c.close()
        missing = [r for r in done if r not in logged]
        return len(done), len(missing)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=str(ROOT / "target/debug/selfheal"))
    ap.add_argument("--seconds", type=float, default=3)
    ap.add_argument("--threads", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    total = lost = 0
    for i in range(a.rounds):
        n, m = one_round(a.bin, a.seconds, a.threads)
        total, lost = total + n, lost + m
        print(f"round {i + 1}: {n} answers delivered, {m} without a response event ({100 * m / max(n, 1):.2f} %)")
    print(f"total: {total} answers, {lost} without a response event ({100 * lost / max(total, 1):.2f} %)")


if __name__ == "__main__":
    main()
