#!/usr/bin/env python3
"""Chaos at scale: the real `selfheal serve` between many clients and a fault-injecting upstream
(tests/e2e/upstream.py), with a healthy fallback. The CI-sized run of the same idea is
`test_chaos_small_no_failures_while_a_healthy_fallback_exists` in tests/e2e/test_deploy.py.

Two scenarios, one after the other, each on a fresh gateway:

- faults:  20 % of the primary's answers are a fault (500, 503, 429 with Retry-After, an empty
           200, an empty stream, a stream cut after the role, a JSON answer to a stream request,
           a stall past the first-byte timeout; seeded), half the requests streaming, every
           request a new conversation.
- outage:  the primary answers nothing but 503 (a full provider outage); the agents are
           conversations of TURNS turns each (one run per conversation), half streaming.

Every answer is read as a client on a socket sees it (stdlib HTTP, no SDK retries) and sorted:
  ok               200, the expected answer, finish_reason "stop", selfheal status "complete"
  flagged          200 but the gateway says it is degraded (status partial/failed, or a stream
                   that ends in an error event): a failure, but a visible one
  failed           any other status (502, ...) or a broken connection: a client-visible failure
  silent_bad       200, unflagged, and not the expected answer (or a stream without [DONE])
  hung             no answer within --timeout seconds

Only loopback; the two upstreams are Python and share the machine with the gateway, so the
figures are about correctness, not speed.

  scripts/chaos.py                        # 10,000 + 2,000 requests (release binary)
  scripts/chaos.py --requests 400 --outage-requests 100 --bin target/debug/selfheal
"""

import argparse
import concurrent.futures
import http.client
import json
import os
import pathlib
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid

ROOT = pathlib.Path(__file__).resolve().parents[1]
UPSTREAM = ROOT / "tests" / "e2e" / "upstream.py"
EXPECTED = "The answer is 42."

FAULTS = [{"kind": "status", "status": 500}, {"kind": "status", "status": 503},
          {"kind": "status", "status": 429, "retry_after": "0"}, {"kind": "empty"},
          {"kind": "empty_stream"}, {"kind": "role_then_cut"},
          {"kind": "json", "content": EXPECTED}, {"kind": "hang", "seconds": 2.0}]


def start(cmd, env=None, quiet=False):
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env,
                            stderr=subprocess.DEVNULL if quiet else None)
    line = proc.stdout.readline()
    if not line.startswith("listening on "):
        proc.kill()
        raise SystemExit(f"{cmd[0]}: unexpected first line {line!r}")
    return proc, line.split("listening on ", 1)[1].strip()


def post(url, path, body):
    req = urllib.request.Request(url + path, data=json.dumps(body).encode(), method="POST",
                                 headers={"content-type": "application/json"})
    return json.loads(urllib.request.urlopen(req, timeout=10).read())


class Client:
    """One kept-alive connection per thread, reopened after an error."""

    def __init__(self, url, timeout):
        self.host, self.port = url.split("//", 1)[1].split(":")
        self.timeout = timeout
        self.conn = None

    def ask(self, messages, stream):
        if self.conn is None:
            self.conn = http.client.HTTPConnection(self.host, int(self.port), timeout=self.timeout)
        body = {"model": "chaos", "messages": messages}
        if stream:
            body["stream"] = True
        started = time.monotonic()
        try:
            self.conn.request("POST", "/v1/chat/completions", body=json.dumps(body),
                              headers={"content-type": "application/json"})
            resp = self.conn.getresponse()
            data = resp.read()
            status = resp.status
        except (socket.timeout, TimeoutError):
            self.conn.close()
            self.conn = None
            return "hung", None, time.monotonic() - started, "no answer in time"
        except (OSError, http.client.HTTPException) as e:
            self.conn.close()
            self.conn = None
            return "failed", None, time.monotonic() - started, f"connection: {e!r}"
        elapsed = time.monotonic() - started
        if resp.getheader("connection", "").lower() == "close":
            self.conn.close()
            self.conn = None
        if status != 200:
            return "failed", None, elapsed, f"HTTP {status}: {data[:200]!r}"
        return (*judge(data, stream), elapsed, data[:300])


def judge(data, stream):
    """Sorts a 200 answer; returns (verdict, answer text)."""
    if not stream:
        try:
            b = json.loads(data)
            choice = b["choices"][0]
            text, finish = choice["message"].get("content"), choice["finish_reason"]
            status = b["selfheal"]["status"]
        except (ValueError, KeyError, IndexError, TypeError):
            return "silent_bad", None
        if status != "complete":
            return "flagged", text
        return ("ok" if text == EXPECTED and finish == "stop" else "silent_bad"), text
    text, finish, status, done, error = "", None, None, False, None
    for line in data.decode("utf-8", "replace").splitlines():
        if not line.startswith("data:"):
            continue
        payload = line[5:].strip()
        if payload == "[DONE]":
            done = True
            continue
        try:
            c = json.loads(payload)
        except ValueError:
            return "silent_bad", text
        if "error" in c:
            error = c["error"]
            continue
        if c.get("selfheal"):
            status = c["selfheal"].get("status")
        for ch in c.get("choices") or []:
            text += (ch.get("delta") or {}).get("content") or ""
            finish = ch.get("finish_reason") or finish
    if error is not None or status not in (None, "complete"):
        return "flagged", text
    ok = done and finish == "stop" and status == "complete" and text.strip() == EXPECTED
    return ("ok" if ok else "silent_bad"), text


def gateway(binary, faulty, healthy, tmp):
    config = pathlib.Path(tmp) / "selfheal.toml"
    config.write_text(f"""
default_upstream = "primary"
[upstreams.primary]
base_url = "{faulty}/v1"
first_byte_timeout_ms = 1000
[upstreams.healthy]
base_url = "{healthy}/v1"
[models.chaos]
chain = [{{upstream = "primary", model = "stub"}}, {{upstream = "healthy", model = "stub"}}]
[retry]
base_ms = 50
max_ms = 200
""")
    return start([binary, "serve", "--listen", "127.0.0.1:0", "--config", str(config),
                  "--trace-db", str(pathlib.Path(tmp) / f"trace-{uuid.uuid4()}.db")],
                 env={**os.environ, "RUST_LOG": os.environ.get("RUST_LOG", "warn")})


def run(name, url, requests, turns, threads, timeout):
    """`requests` requests as conversations of `turns` turns; odd conversations stream."""
    local = threading.local()
    conversations = (requests + turns - 1) // turns

    def conversation(i):
        c = getattr(local, "c", None) or Client(url, timeout)
        local.c = c
        stream = i % 2 == 1
        messages = [{"role": "user", "content": f"{name} {i} {uuid.uuid4()}"}]
        out = []
        for t in range(turns):
            verdict, text, elapsed, detail = c.ask(messages, stream)
            out.append((verdict, stream, elapsed, detail))
            messages = messages + [{"role": "assistant", "content": text or ""},
                                   {"role": "user", "content": f"and turn {t + 1}?"}]
        return out

    started = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        results = [r for conv in pool.map(conversation, range(conversations)) for r in conv]
    return results, time.monotonic() - started


def report(name, results, wall, faults):
    by = {}
    for verdict, stream, _, _ in results:
        by.setdefault(verdict, [0, 0])[int(stream)] += 1
    lat = sorted(e for _, _, e, _ in results)
    line = {"scenario": name, "requests": len(results),
            "streaming": sum(1 for r in results if r[1]), "faults_injected": faults,
            **{k: by.get(k, [0, 0])[0] + by.get(k, [0, 0])[1]
               for k in ("ok", "flagged", "failed", "silent_bad", "hung")},
            "failed_streaming": by.get("failed", [0, 0])[1],
            "flagged_streaming": by.get("flagged", [0, 0])[1],
            "p50_ms": round(statistics.median(lat) * 1000, 1),
            "p99_ms": round(lat[int(len(lat) * 0.99) - 1] * 1000, 1),
            "wall_s": round(wall, 1)}
    print(json.dumps(line), flush=True)
    bad = [r for r in results if r[0] != "ok"]
    for verdict, stream, _, detail in bad[:5]:
        print(f"  e.g. {verdict} ({'stream' if stream else 'plain'}): {detail!r}", flush=True)
    return line


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", default=str(ROOT / "target" / "release" / "selfheal"))
    ap.add_argument("--requests", type=int, default=10_000)
    ap.add_argument("--outage-requests", type=int, default=2_000)
    ap.add_argument("--turns", type=int, default=5, help="turns per conversation in the outage")
    ap.add_argument("--rate", type=float, default=0.2)
    ap.add_argument("--seed", type=int, default=13)
    ap.add_argument("--threads", type=int, default=16)
    ap.add_argument("--timeout", type=float, default=30.0)
    args = ap.parse_args()

    procs = []
    try:
        # The upstreams' stderr is dropped: a stalled answer the gateway gave up on ends in a
        # broken pipe there, by design.
        faulty_p, faulty = start([sys.executable, str(UPSTREAM)], quiet=True)
        healthy_p, healthy = start([sys.executable, str(UPSTREAM)], quiet=True)
        procs += [faulty_p, healthy_p]
        post(healthy, "/_script", [])
        lines = []
        with tempfile.TemporaryDirectory() as tmp:
            for name, count, turns, rate, kinds in (
                ("faults", args.requests, 1, args.rate, FAULTS),
                ("outage", args.outage_requests, args.turns, 1.0,
                 [{"kind": "status", "status": 503, "message": "provider down"}]),
            ):
                post(faulty, "/_chaos", {"rate": rate, "seed": args.seed, "kinds": kinds})
                gw_p, gw = gateway(args.bin, faulty, healthy, tmp)
                procs.append(gw_p)
                results, wall = run(name, gw, count, turns, args.threads, args.timeout)
                faults = json.loads(urllib.request.urlopen(faulty + "/_chaos", timeout=10).read())["faults"]
                lines.append(report(name, results, wall, faults))
                gw_p.terminate()
                gw_p.wait(timeout=30)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    bad = sum(l["failed"] + l["silent_bad"] + l["hung"] + l["flagged"] for l in lines)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
