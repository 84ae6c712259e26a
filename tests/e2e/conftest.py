"""Fixtures: the scripted upstream and the real `selfheal` binary, both on port 0."""

import json
import os
import pathlib
import signal
import subprocess
import sys
import urllib.request

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
BIN = os.environ.get("SELFHEAL_BIN", str(ROOT / "target" / "debug" / "selfheal"))


def read_address(proc):
    line = proc.stdout.readline()
    assert line.startswith("listening on "), f"unexpected first line: {line!r}"
    return line.split("listening on ", 1)[1].strip()


class Upstream:
    def __init__(self, url):
        self.url = url

    def script(self, steps):
        req = urllib.request.Request(
            self.url + "/_script", data=json.dumps(steps).encode(), method="POST",
            headers={"content-type": "application/json"})
        urllib.request.urlopen(req, timeout=5).read()

    def log(self):
        return json.loads(urllib.request.urlopen(self.url + "/_log", timeout=5).read())

    def headers(self):
        return json.loads(urllib.request.urlopen(self.url + "/_headers", timeout=5).read())


@pytest.fixture(scope="session")
def upstream():
    proc = subprocess.Popen([sys.executable, str(pathlib.Path(__file__).with_name("upstream.py"))],
                            stdout=subprocess.PIPE, text=True)
    try:
        yield Upstream(read_address(proc))
    finally:
        proc.kill()
        proc.wait()


class Gateway:
    def __init__(self, proc, url, trace_db):
        self.proc = proc
        self.url = url
        self.trace_db = trace_db

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=20)

    def trace(self, *args):
        out = subprocess.run([BIN, "trace", *args, "--trace-db", str(self.trace_db), "--json"],
                             check=True, capture_output=True, text=True)
        return json.loads(out.stdout)


# The gateway's run decides with the core's ladders: with the defaults a tool that keeps failing
# ends the run `partial` at the end of its ladder. Tests of the monitor's breaker (hidden at five
# failures) run under ladders that keep retrying.
PATIENT = """
[policy.ladders]
tool_timeout = ["retry", "retry", "retry", "retry", "retry", "retry", "retry", "degrade"]
tool_unavailable = ["retry", "retry", "retry", "retry", "retry", "retry", "retry", "degrade"]
[budget]
retries = 1000
recoveries = 1000
"""


def start_gateway(upstream, tmp_path, extra=(), top="", upstream_extra="", env=None,
                  listen="127.0.0.1:0", stderr=None, timeout_ms=1500):
    """The real binary on port 0; `top` adds top-level config keys, `upstream_extra` keys of the
    default upstream (`auth`, `api_key_env`, ...)."""
    config = tmp_path / "selfheal.toml"
    config.write_text(f"""
default_upstream = "default"
max_body_bytes = 262144
{top}
[upstreams.default]
base_url = "{upstream.url}/v1"
timeout_ms = {timeout_ms}
{upstream_extra}
[retry]
base_ms = 50
max_ms = 200
""")
    trace_db = tmp_path / "trace.db"
    proc = subprocess.Popen([BIN, "serve", "--listen", listen, "--config", str(config),
                             "--trace-db", str(trace_db), *extra],
                            stdout=subprocess.PIPE, stderr=stderr, text=True,
                            env={**os.environ, **(env or {})})
    return Gateway(proc, read_address(proc), trace_db)


@pytest.fixture
def gateway(upstream, tmp_path):
    gw = start_gateway(upstream, tmp_path)
    try:
        yield gw
    finally:
        if gw.proc.poll() is None:
            gw.stop()
