#!/usr/bin/env python3
"""Smoke test of an installed `selfheal` (scripts/test-wheel.sh): `bench` prints its table, and
`serve`, in front of the e2e fault-injecting upstream (tests/e2e/upstream.py) on port 0, answers
/healthz and /readyz, serves on /metrics exactly the metrics docs/reference/metrics.md lists, and
heals a 500 into an answer. Standard library only; loopback only.

    python3 scripts/wheel-smoke.py PATH/TO/selfheal
"""

import json
import pathlib
import subprocess
import sys
import tempfile
import urllib.request

ROOT = pathlib.Path(__file__).resolve().parents[1]


PASSED = []


def check(cond, what):
    if not cond:
        print(f"wheel: {len(PASSED)} passed, 1 failed")
        sys.exit(f"wheel-smoke: FAILED: {what}")
    PASSED.append(what)
    print(f"wheel-smoke: ok: {what}")


def address(proc, what):
    line = proc.stdout.readline()
    check(line.startswith("listening on "), f"{what} prints its address (got {line!r})")
    return line.split("listening on ", 1)[1].strip()


def metric_types(text):
    """{name: type} from the `# TYPE` lines of a Prometheus text exposition."""
    return {line.split()[2]: line.split()[3] for line in text.splitlines()
            if line.startswith("# TYPE ")}


def documented_metrics():
    """{name: type} from the table of docs/reference/metrics.md."""
    out = {}
    for line in (ROOT / "docs/reference/metrics.md").read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 2 and cells[0].startswith("`selfheal_"):
            out[cells[0].strip("`")] = cells[1]
    return out


def get(url):
    with urllib.request.urlopen(url, timeout=10) as r:
        return r.status, r.read()


def post(url, body):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return r.status, dict(r.headers), json.loads(r.read())


def main():
    binary = sys.argv[1]
    bench = subprocess.run([binary, "bench", "--seeds", "2", "--json"], capture_output=True,
                           text=True, timeout=300)
    check(bench.returncode == 0, f"selfheal bench exits 0 ({bench.stderr.strip()[-300:]})")
    strategies = [row.get("strategy") for row in json.loads(bench.stdout).get("results", [])]
    check("self-healing" in strategies, f"selfheal bench reports self-healing ({strategies})")

    upstream = subprocess.Popen([sys.executable, str(ROOT / "tests/e2e/upstream.py")],
                                stdout=subprocess.PIPE, text=True)
    gateway = None
    try:
        up = address(upstream, "the upstream")
        with tempfile.TemporaryDirectory() as tmp:
            gateway = subprocess.Popen(
                [binary, "serve", "--upstream", f"{up}/v1", "--listen", "127.0.0.1:0",
                 "--trace-db", str(pathlib.Path(tmp) / "trace.db")],
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            gw = address(gateway, "selfheal serve")
            check(get(gw + "/healthz")[0] == 200, "GET /healthz is 200")
            check(get(gw + "/readyz")[0] == 200, "GET /readyz is 200 (the upstream is up)")
            served = metric_types(get(gw + "/metrics")[1].decode())
            documented = documented_metrics()
            check(served == documented,
                  "GET /metrics serves exactly the metrics docs/reference/metrics.md lists "
                  f"(only served: {sorted(set(served.items()) - set(documented.items()))}; "
                  f"only documented: {sorted(set(documented.items()) - set(served.items()))})")
            post(up + "/_script", [{"kind": "status", "status": 500}, {"kind": "ok",
                                                                       "content": "healed"}])
            status, headers, body = post(gw + "/v1/chat/completions", {
                "model": "stub", "messages": [{"role": "user", "content": "wheel smoke"}]})
            check(status == 200, "a chat completion through the gateway is 200")
            check(body["choices"][0]["message"]["content"] == "healed",
                  "the answer is the upstream's after the 500")
            check("retry" in body["selfheal"]["actions"],
                  f"the gateway retried the 500 ({body['selfheal']})")
            check(headers.get("x-selfheal-status") == "complete", "x-selfheal-status: complete")
            gateway.terminate()
            check(gateway.wait(timeout=20) == 0, "selfheal serve exits 0 on SIGTERM")
    finally:
        for proc in (gateway, upstream):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()


if __name__ == "__main__":
    main()
    print(f"wheel: {len(PASSED)} passed, 0 failed")
