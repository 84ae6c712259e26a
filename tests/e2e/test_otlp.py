"""OTLP export read back from a real Arize Phoenix (PyPI `arize-phoenix`, in its own venv set up by
scripts/test-e2e.sh; SELFHEAL_PHOENIX names its `phoenix` program): the gateway's request span
`chat {model}` is a child of the client's W3C traceparent, each upstream attempt a child span
with the GenAI and selfheal attributes, the plan's retry an event, the attempt's traceparent
goes upstream; and a collector that is down costs no request."""

import json
import os
import socket
import subprocess
import time
import urllib.request

import pytest
from openai import OpenAI

from conftest import start_gateway

TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
CLIENT_SPAN = "b7ad6b7169203331"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get_json(url):
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read())


@pytest.fixture(scope="module")
def phoenix(tmp_path_factory):
    program = os.environ.get("SELFHEAL_PHOENIX")
    if not program or not os.access(program, os.X_OK):
        pytest.fail("SELFHEAL_PHOENIX does not name Arize Phoenix's `phoenix` program: run the "
                    "e2e tests through scripts/test-e2e.sh, which installs it")
    port, grpc = free_port(), free_port()
    work = tmp_path_factory.mktemp("phoenix")
    env = {**os.environ, "PHOENIX_PORT": str(port), "PHOENIX_GRPC_PORT": str(grpc),
           "PHOENIX_HOST": "127.0.0.1", "PHOENIX_WORKING_DIR": str(work),
           "PHOENIX_TELEMETRY_ENABLED": "false"}
    log = open(work / "phoenix.log", "w")
    proc = subprocess.Popen([program, "serve"], env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                urllib.request.urlopen(url + "/healthz", timeout=2).read()
                break
            except OSError:
                assert proc.poll() is None, (work / "phoenix.log").read_text()[-2000:]
                assert time.monotonic() < deadline, "Phoenix did not start"
                time.sleep(0.5)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def spans_of(phoenix, trace_id, want, within=30):
    deadline = time.monotonic() + within
    while True:
        data = get_json(f"{phoenix}/v1/projects/default/spans?trace_id={trace_id}&limit=100")["data"]
        if len(data) >= want or time.monotonic() > deadline:
            return data
        time.sleep(0.5)


def test_spans_reach_phoenix_with_genai_attributes_and_the_clients_parent(phoenix, upstream, tmp_path):
    gw = start_gateway(upstream, tmp_path, env={"OTEL_EXPORTER_OTLP_ENDPOINT": phoenix})
    try:
        # A 503, then the answer: one request span, two attempts, one retry.
        upstream.script([{"kind": "status", "status": 503}, {"kind": "ok", "content": "hello"}])
        client = OpenAI(base_url=gw.url + "/v1", api_key="sk-test", max_retries=0)
        r = client.chat.completions.create(
            model="m1", messages=[{"role": "user", "content": "hi"}],
            extra_headers={"traceparent": f"00-{TRACE_ID}-{CLIENT_SPAN}-01"})
        assert r.choices[0].message.content == "hello"
        sent = [h.get("traceparent") for h in upstream.headers()]
    finally:
        gw.stop()  # flushes the exporter's last batch
    spans = spans_of(phoenix, TRACE_ID, 3)
    assert len(spans) == 3, json.dumps(spans, indent=1)
    request = next(s for s in spans if s["parent_id"] == CLIENT_SPAN)
    assert request["name"] == "chat m1"
    assert request["attributes"]["gen_ai.operation.name"] == "chat"
    assert request["attributes"]["gen_ai.request.model"] == "m1"
    assert request["attributes"]["http.response.status_code"] == 200
    assert [e["name"] for e in request["events"]] == ["selfheal.retry"]
    attempts = sorted((s for s in spans if s is not request), key=lambda s: s["start_time"])
    rid = request["context"]["span_id"]
    assert [s["parent_id"] for s in attempts] == [rid, rid], "attempts are children of the request"
    first, second = attempts
    assert (first["name"], first["status_code"]) == ("chat m1", "ERROR")
    assert first["attributes"]["selfheal.outcome"] == "http_503"
    assert first["attributes"]["selfheal.upstream"] == "default"
    assert second["attributes"]["selfheal.outcome"] == "ok"
    assert second["attributes"]["gen_ai.usage.input_tokens"] == 10
    assert second["attributes"]["gen_ai.usage.output_tokens"] == 5
    assert second["attributes"]["gen_ai.operation.name"] == "chat"
    # Each attempt's own traceparent went upstream.
    assert sent == [f"00-{TRACE_ID}-{s['context']['span_id']}-01" for s in attempts], sent


def test_a_collector_that_is_down_costs_no_request(upstream, tmp_path):
    dead = f"http://127.0.0.1:{free_port()}"
    gw = start_gateway(upstream, tmp_path, env={"OTEL_EXPORTER_OTLP_ENDPOINT": dead})
    try:
        upstream.script([])
        client = OpenAI(base_url=gw.url + "/v1", api_key="sk-test", max_retries=0)
        for i in range(5):
            r = client.chat.completions.create(
                model="m1", messages=[{"role": "user", "content": f"hi {i}"}])
            assert r.choices[0].message.content == "The answer is 42."
    finally:
        assert gw.stop() == 0, "it stops cleanly with spans it could not deliver"
