"""End-to-end: the real binary between the real `openai` SDK / openai-agents and a scripted,
fault-injecting upstream."""

import json
import subprocess
import statistics
import threading
import time
import uuid

import http.client
import urllib.parse
import agents
import openai
import pytest

from conftest import BIN, PATIENT, start_gateway

TOOLS = [
    {"type": "function", "function": {"name": "search", "parameters": {
        "type": "object", "properties": {"query": {"type": "string"}, "limit": {"type": "integer"}},
        "required": ["query"]}}},
    {"type": "function", "function": {"name": "lookup", "parameters": {
        "type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]}}},
]


def post(url, body, headers=None, conn=None, timeout=10):
    """POST raw bytes or JSON with the standard library; returns (status, parsed JSON)."""
    u = urllib.parse.urlsplit(url)
    c = conn or http.client.HTTPConnection(u.hostname, u.port, timeout=timeout)
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    c.request("POST", "/v1/chat/completions", body=data,
              headers={"content-type": "application/json", **(headers or {})})
    r = c.getresponse()
    raw = r.read()
    if conn is None:
        c.close()
    return r.status, json.loads(raw or b"null")


def client(gw, **kw):
    return openai.OpenAI(base_url=gw.url + "/v1", api_key="unused", max_retries=0, **kw)


def ask(text=None):
    return [{"role": "user", "content": text or f"task {uuid.uuid4()}"}]


def test_forwards_and_reports_selfheal(gateway, upstream):
    upstream.script([{"kind": "ok", "content": "hello there"}])
    raw = client(gateway).chat.completions.with_raw_response.create(model="stub", messages=ask())
    r = raw.parse()
    assert r.choices[0].message.content == "hello there"
    assert r.model_extra["selfheal"]["status"] == "complete"
    assert raw.headers["x-selfheal-status"] == "complete"


def test_429_with_retry_after_is_honoured(gateway, upstream):
    upstream.script([{"kind": "status", "status": 429, "retry_after": "1"}, {"kind": "ok"}])
    t = time.monotonic()
    r = client(gateway).chat.completions.create(model="stub", messages=ask())
    assert time.monotonic() - t >= 1.0
    assert r.model_extra["selfheal"]["budget"]["spent"]["retries"] == 1


@pytest.mark.parametrize("steps", [
    [{"kind": "status", "status": 500}, {"kind": "status", "status": 503}, {"kind": "ok"}],
    [{"kind": "hang", "seconds": 3}, {"kind": "ok"}],
    [{"kind": "empty"}, {"kind": "ok"}],
], ids=["500-503", "hang", "empty-200"])
def test_transient_faults_are_healed(gateway, upstream, steps):
    upstream.script(steps)
    r = client(gateway).chat.completions.create(model="stub", messages=ask())
    assert r.choices[0].message.content == "hello"
    assert "retry" in r.model_extra["selfheal"]["actions"]


def test_exhausted_upstream_is_a_502_with_reasons(gateway, upstream):
    upstream.script([{"kind": "status", "status": 503}] * 10)
    with pytest.raises(openai.APIStatusError) as e:
        client(gateway).chat.completions.create(model="stub", messages=ask())
    assert e.value.status_code == 502
    assert e.value.body["reasons"]



def test_bad_requests_get_openai_errors(gateway):
    status, body = post(gateway.url, b"{nope")
    assert status == 400 and body["error"]["type"] == "invalid_request_error"
    status, body = post(gateway.url, b"x" * (300 * 1024))
    assert status == 413 and body["error"]["code"] == "request_too_large"


def test_malformed_tool_arguments_are_repaired(gateway, upstream):
    upstream.script([{"kind": "tool", "name": "search", "arguments": "{'query': 'rust', limit: '3',}"}])
    r = client(gateway).chat.completions.create(model="stub", messages=ask(), tools=TOOLS)
    call = r.choices[0].message.tool_calls[0]
    assert json.loads(call.function.arguments) == {"query": "rust", "limit": 3}
    assert "repair" in r.model_extra["selfheal"]["actions"]


def test_unknown_tool_is_reasked(gateway, upstream):
    upstream.script([{"kind": "tool", "name": "delete_everything", "arguments": "{}"},
                     {"kind": "tool", "name": "lookup", "arguments": "{\"key\": \"k\"}"}])
    r = client(gateway).chat.completions.create(model="stub", messages=ask(), tools=TOOLS)
    assert r.choices[0].message.tool_calls[0].function.name == "lookup"
    assert "reask" in r.model_extra["selfheal"]["actions"]


def test_stream_text_and_tool_calls(gateway, upstream):
    upstream.script([{"kind": "ok", "content": "one two three"}])
    chunks = list(client(gateway).chat.completions.create(model="stub", messages=ask(), stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices).split() == ["one", "two", "three"]
    upstream.script([{"kind": "tool", "name": "search", "arguments": "{'query': 'x'}"}])
    chunks = list(client(gateway).chat.completions.create(
        model="stub", messages=ask(), tools=TOOLS, stream=True))
    calls = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
    assert len(calls) == 1, "a tool call arrives once, complete"
    assert json.loads(calls[0].function.arguments) == {"query": "x"}
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


FENCED_CALL = '```json\n{"name": "search", "arguments": {"query": "rust"}}\n```'


def test_issue_31_a_streamed_fenced_json_call_reaches_the_sdk_as_tool_calls(gateway, upstream):
    """Issue 31: a small model streams its call as a fenced JSON block in `content` (word by
    word); the real SDK gets a structured call with an id and `finish_reason: "tool_calls"`,
    never the fence, and the report says `salvage`. Words still stream as they were."""
    upstream.script([{"kind": "ok", "content": FENCED_CALL}])
    chunks = list(client(gateway).chat.completions.create(
        model="stub", messages=ask(), tools=TOOLS, stream=True))
    calls = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
    assert [c.function.name for c in calls] == ["search"], chunks
    assert json.loads(calls[0].function.arguments) == {"query": "rust"}
    assert calls[0].id
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    assert "```" not in "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert "salvage" in chunks[-1].model_extra["selfheal"]["actions"]
    upstream.script([{"kind": "ok", "content": "no call here"}])
    chunks = list(client(gateway).chat.completions.create(
        model="stub", messages=ask(), tools=TOOLS, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices).split() == \
        ["no", "call", "here"]
    assert not [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]


def stream_calls(chunks):
    return [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]


def test_stream_reasks_an_unusable_tool_call_before_the_client_sees_it(gateway, upstream):
    upstream.script([{"kind": "tool", "name": "delete_everything", "arguments": "{}"},
                     {"kind": "tool", "name": "lookup", "arguments": "{\"key\": \"k\"}"}])
    chunks = list(client(gateway).chat.completions.create(
        model="stub", messages=ask(), tools=TOOLS, stream=True))
    calls = stream_calls(chunks)
    assert [c.function.name for c in calls] == ["lookup"], "the unusable call never reaches the client"
    assert json.loads(calls[0].function.arguments) == {"key": "k"}
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    report = chunks[-1].model_extra["selfheal"]
    assert report["status"] == "complete" and "reask" in report["actions"]
    log = upstream.log()
    assert [bool(r.get("stream")) for r in log] == [True, False]
    assert "delete_everything" in log[1]["messages"][-1]["content"]


def test_stream_never_passes_an_unusable_call_on_when_the_reask_fails_too(gateway, upstream):
    # A tool not on offer climbs the default policy's wrong_tool ladder: it re-asks twice (repair,
    # replan; the substitute and escalation rungs are passed over: the tool has no substitute and
    # this chain no fallback model), then degrades.
    upstream.script([{"kind": "tool", "name": "delete_everything", "arguments": "{}"},
                     {"kind": "tool", "name": "drop_tables", "arguments": "{}"},
                     {"kind": "tool", "name": "drop_tables", "arguments": "{}"},
                     {"kind": "tool", "name": "drop_tables", "arguments": "{}"}])
    chunks = list(client(gateway).chat.completions.create(
        model="stub", messages=ask(), tools=TOOLS, stream=True))
    assert stream_calls(chunks) == [], "an unusable call is never forwarded"
    assert len(upstream.log()) == 3, "the ladder, not a cap of the gateway's, ends the re-asks"
    assert chunks[-1].choices[0].finish_reason == "stop"
    report = chunks[-1].model_extra["selfheal"]
    assert report["status"] == "partial"
    assert "delete_everything" in report["reason"]


@pytest.mark.parametrize("stream", [False, True])
def test_a_call_cut_by_the_length_limit_is_reasked_not_repaired(gateway, upstream, stream):
    upstream.script([
        {"kind": "tool", "name": "search", "arguments": "{\"query\": \"rust\", \"limit\": 3", "finish": "length"},
        {"kind": "tool", "name": "search", "arguments": "{\"query\": \"rust lang\"}"},
    ])
    r = client(gateway).chat.completions.create(
        model="stub", messages=ask(), tools=TOOLS, stream=stream)
    if stream:
        chunks = list(r)
        calls, report = stream_calls(chunks), chunks[-1].model_extra["selfheal"]
    else:
        calls, report = r.choices[0].message.tool_calls, r.model_extra["selfheal"]
    assert [json.loads(c.function.arguments) for c in calls] == [{"query": "rust lang"}]
    assert report["status"] == "complete" and "reask" in report["actions"]
    log = upstream.log()
    assert len(log) == 2 and "cut off" in log[1]["messages"][-1]["content"]


def test_a_cut_call_is_never_forwarded_when_the_reask_is_cut_too(gateway, upstream):
    cut = {"kind": "tool", "name": "search", "arguments": "{\"query\": \"ru", "finish": "length"}
    upstream.script([cut, cut, cut, cut])
    r = client(gateway).chat.completions.create(model="stub", messages=ask(), tools=TOOLS)
    assert len(upstream.log()) == 4
    assert not r.choices[0].message.tool_calls
    assert r.model_extra["selfheal"]["status"] == "partial"


def test_cut_stream_is_never_a_clean_finish(gateway, upstream):
    upstream.script([{"kind": "cut"}])
    finishes = []
    with pytest.raises(Exception):  # the SDK's APIError or a broken-connection error
        for c in client(gateway).chat.completions.create(model="stub", messages=ask(), stream=True):
            if c.choices and c.choices[0].finish_reason:
                finishes.append(c.choices[0].finish_reason)
    assert finishes == []


def conversation(successes, failures):
    msgs = ask()
    for i in range(successes + failures):
        ok = i < successes
        name = "lookup" if ok else f"tool{i % 4}"
        msgs.append({"role": "assistant", "content": None, "tool_calls": [{
            "id": f"c{i}", "type": "function",
            "function": {"name": name, "arguments": json.dumps({"key": f"k{i}"})}}]})
        msgs.append({"role": "tool", "tool_call_id": f"c{i}",
                     "content": "ok: 1" if ok else "Error: backend down"})
    return msgs


def test_partial_status_is_readable_by_the_client(gateway, upstream):
    upstream.script([])
    msgs = conversation(1, 8)
    raw = client(gateway).chat.completions.with_raw_response.create(
        model="stub", messages=msgs, tools=TOOLS)
    r = raw.parse()
    assert r.choices[0].finish_reason == "stop"
    assert r.model_extra["selfheal"]["status"] == "partial"
    assert "failed" in r.model_extra["selfheal"]["reason"]
    assert raw.headers["x-selfheal-status"] == "partial"
    assert upstream.log() == [], "an aborted run is answered by the gateway"
    # The same conversation sent again (a client that retries) is the same stopped run: it is
    # answered with the stop again, never served upstream as if nothing had happened.
    again = client(gateway).chat.completions.with_raw_response.create(
        model="stub", messages=msgs, tools=TOOLS)
    assert again.headers["x-selfheal-status"] != "complete"
    assert "stopped earlier" in again.parse().model_extra["selfheal"]["reason"]
    assert upstream.log() == []


def test_stuck_agent_gets_the_tool_hidden_and_finishes(upstream, tmp_path):
    gateway = start_gateway(upstream, tmp_path, top=PATIENT)
    try:
        stuck_agent_finishes(gateway, upstream)
    finally:
        gateway.stop()


def stuck_agent(model):
    """An agent whose `search` always fails and whose `lookup` answers, and the calls of each."""
    agents.set_tracing_disabled(True)
    calls = {"search": 0, "lookup": 0}

    @agents.function_tool
    def search(query: str) -> str:
        """Search the web."""
        calls["search"] += 1
        raise RuntimeError("search backend is down")

    @agents.function_tool
    def lookup(key: str) -> str:
        """Look a key up in the local index."""
        calls["lookup"] += 1
        return "ok: 42"

    agent = agents.Agent(name="stuck", instructions="Find the answer.", tools=[search, lookup],
                         model=model)
    return agent, calls


def stuck_agent_finishes(gateway, upstream):
    upstream.script([])
    agent, calls = stuck_agent(agents.OpenAIChatCompletionsModel(
        model="stub", openai_client=openai.AsyncOpenAI(base_url=gateway.url + "/v1", api_key="x")))
    result = agents.Runner.run_sync(agent, f"What is the answer? {uuid.uuid4()}", max_turns=12)
    assert result.final_output == "The answer is 42."
    assert calls == {"search": 5, "lookup": 1}
    offered = [[t["function"]["name"] for t in req.get("tools", [])] for req in upstream.log()]
    assert "search" in offered[4] and "search" not in offered[5]
    assert any("[selfheal]" in json.dumps(req["messages"]) for req in upstream.log())


def test_issue_30_a_stuck_agent_finishes_via_the_other_tool_under_the_default_policy(upstream,
                                                                                    tmp_path):
    """Issue 30: with the default policy the run was terminated at the ladder's end ("I have to
    stop here", `failed`) though another tool was on offer. Now the seeds' rule holds: warned at
    3 naming the other tool, `search` hidden at 5, and the agent finishes with `lookup`."""
    gateway = start_gateway(upstream, tmp_path)
    try:
        upstream.script([])
        agents.set_tracing_disabled(True)
        calls = {"search": 0, "lookup": 0}

        @agents.function_tool
        def search(query: str) -> str:
            """Search the web."""
            calls["search"] += 1
            return json.dumps({"error": "search backend down"})

        @agents.function_tool
        def lookup(key: str) -> str:
            """Look a key up in the local index."""
            calls["lookup"] += 1
            return "ok: 42"

        agent = agents.Agent(name="stuck", instructions="Find the answer.", tools=[search, lookup],
                             model=agents.OpenAIChatCompletionsModel(
                                 model="stub", openai_client=openai.AsyncOpenAI(
                                     base_url=gateway.url + "/v1", api_key="x")))
        result = agents.Runner.run_sync(agent, f"What is the answer? {uuid.uuid4()}",
                                        max_turns=12)
    finally:
        gateway.stop()
    assert result.final_output == "The answer is 42."
    assert calls == {"search": 5, "lookup": 1}
    log = upstream.log()
    offered = [[t["function"]["name"] for t in req.get("tools", [])] for req in log]
    assert "search" in offered[4] and "search" not in offered[5]
    guidance = [json.dumps(req["messages"]) for req in log]
    assert "`lookup`" in guidance[3], "warned at 3, naming the other tool"
    assert "`lookup`" in guidance[5], "hidden at 5, naming the other tool"
    # Issue 30: the decisions about the tool's failures are in the trace with their inputs, so
    # `selfheal trace replay` decides them again: the same policy routes around at the same
    # place (exit 0); one whose ladders keep retrying would not have (exit 3).
    def replay(*extra):
        outs = []
        for r in gateway.trace("list"):
            out = subprocess.run([BIN, "trace", "replay", r["run"], "--trace-db",
                                  str(gateway.trace_db), "--json", *extra],
                                 capture_output=True, text=True)
            if out.returncode != 1:
                outs.append((out.returncode, json.loads(out.stdout)))
        return outs
    same = replay()
    assert same and all(code == 0 for code, _ in same), same
    routed = [c for _, body in same for r in body["runs"] for c in r["decisions"]
              if c["routed_around"]]
    assert routed, same
    patient = tmp_path / "patient.toml"
    patient.write_text("[ladders]\n" + "".join(
        f'{c} = ["retry", "retry", "retry", "retry", "retry", "retry", "degrade"]\n'
        for c in ("tool_timeout", "tool_unavailable", "empty_output", "malformed_output")))
    other = replay("--policy", str(patient))
    assert any(code == 3 for code, _ in other), other


def test_a_stuck_agent_continuing_its_responses_gets_the_tool_hidden(upstream, tmp_path):
    """Issue 13: an openai-agents agent on the Responses API that continues each answer with
    `previous_response_id` (`auto_previous_response_id`) sends only its tools' results. The
    gateway reads them in the run that sent the answer, against the answer's calls, so the
    failing tool's breaker opens across turns as on chat. Before, each turn was a run of its
    own, `search` was never hidden, and the agent ran out of turns."""
    gateway = start_gateway(upstream, tmp_path, top=PATIENT)
    try:
        upstream.script([{"kind": "stuck"}] * 12)
        agent, calls = stuck_agent(agents.OpenAIResponsesModel(
            model="stub", openai_client=openai.AsyncOpenAI(base_url=gateway.url + "/v1", api_key="x")))
        result = agents.Runner.run_sync(agent, f"What is the answer? {uuid.uuid4()}", max_turns=12,
                                        auto_previous_response_id=True)
    finally:
        gateway.stop()
    assert result.final_output == "The answer is 42."
    assert calls == {"search": 5, "lookup": 1}
    log = upstream.log()
    assert all(req.get("previous_response_id") for req in log[1:]), "the client sent only news"
    offered = [[t["name"] for t in req.get("tools", [])] for req in log]
    assert "search" in offered[4] and "search" not in offered[5]


def test_sequential_keepalive_adds_little_latency(gateway, upstream):
    upstream.script([])
    body = {"model": "stub", "messages": ask("keepalive")}

    def median(url):
        u = urllib.parse.urlsplit(url)
        conn = http.client.HTTPConnection(u.hostname, u.port, timeout=10)
        times = []
        for _ in range(40):
            t = time.perf_counter()
            status, _ = post(url, body, conn=conn)
            assert status == 200
            times.append(time.perf_counter() - t)
        conn.close()
        return statistics.median(times[5:])

    direct = median(upstream.url)
    via = median(gateway.url)
    # Without TCP_NODELAY on either side, each request waits ~40 ms on delayed ACKs.
    assert via - direct < 0.015, f"direct {direct * 1e3:.2f} ms, via gateway {via * 1e3:.2f} ms"


def test_trace_is_complete_after_graceful_shutdown(gateway, upstream):
    upstream.script([{"kind": "hang", "seconds": 1.0}])
    run = f"trace-{uuid.uuid4()}"
    result = {}

    def slow():
        result["r"] = post(gateway.url, {"model": "stub", "messages": ask()},
                           headers={"x-selfheal-run": run})

    t = threading.Thread(target=slow)
    t.start()
    time.sleep(0.3)
    assert gateway.stop() == 0
    t.join()
    assert result["r"][0] == 200, "in-flight requests are drained"
    # The label is scoped to the caller's tenant: the run id is a keyed hash of both.
    [only] = gateway.trace("list")
    assert only["status"] == "complete"
    kinds = [e["kind"] for e in gateway.trace("show", only["run"])]
    assert kinds[0] == "request" and kinds[-1] == "response"


def fidelity_request():
    """A request with bytes a re-encoding proxy would change: an integer past u64, a float
    spelled with an exponent, non-ASCII text, and an assistant turn with `content: null`."""
    return ('{"model": "stub", "seed": 123456789012345678901234567890, "temperature": 7E-1, '
            '"messages": [{"role": "user", "content": "caf\\u00e9 ' + str(uuid.uuid4()) + '"}, '
            '{"role": "assistant", "content": null, "tool_calls": [{"id": "c0", "type": "function", '
            '"function": {"name": "lookup", "arguments": "{\\"key\\": \\"k\\"}"}}]}, '
            '{"role": "tool", "tool_call_id": "c0", "content": "ok: 1"}], '
            '"tools": ' + json.dumps(TOOLS) + ', "x_vendor_field": {"keep": [1, 2.50, null]}}').encode()


@pytest.mark.parametrize("mode", ["healing", "passthrough"])
def test_untouched_bytes_reach_the_upstream_as_sent(upstream, tmp_path, mode):
    gw = start_gateway(upstream, tmp_path, ["--passthrough"] if mode == "passthrough" else [])
    try:
        upstream.script([{"kind": "ok", "content": "fine"}])
        status, body = post(gw.url, fidelity_request())
        assert status == 200
        assert body["choices"][0]["message"]["content"] == "fine"
        assert ("selfheal" in body) == (mode == "healing"), "passthrough answers byte for byte"
        [sent] = upstream.log()
        assert sent["seed"] == 123456789012345678901234567890, "no float round trip"
        assert sent["x_vendor_field"] == {"keep": [1, 2.5, None]}
        assert sent["messages"][0]["content"].startswith("caf\u00e9 ")
        assert sent["messages"][1]["content"] == "", "content: null beside tool_calls is normalised"
        assert [t["function"]["name"] for t in sent["tools"]] == ["search", "lookup"]
    finally:
        gw.stop()


def test_passthrough_streams_as_is(upstream, tmp_path):
    gw = start_gateway(upstream, tmp_path, ["--passthrough"])
    try:
        upstream.script([{"kind": "ok", "content": "one two"}])
        chunks = list(client(gw).chat.completions.create(model="stub", messages=ask(), stream=True))
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices).split() == ["one", "two"]
        assert all("selfheal" not in (c.model_extra or {}) for c in chunks)
    finally:
        gw.stop()


def test_issue_30_calls_left_out_are_said_in_words_or_raised(upstream, tmp_path):
    """Issue 30: an answer whose tool calls were all left out after a failed re-ask was an empty
    message the `openai` SDK returned as `''`. It now says in words which call and why
    (streaming or not); with `[server] on_partial = "error"` the SDK raises instead."""
    nope = {"kind": "tool", "name": "nope", "arguments": "{}"}
    gw = start_gateway(upstream, tmp_path)
    try:
        upstream.script([nope] * 8)
        r = client(gw).chat.completions.create(model="stub", messages=ask(), tools=TOOLS)
        text = r.choices[0].message.content
        assert text and "`nope`" in text and "left out" in text, r
        assert r.choices[0].finish_reason == "stop"
        assert r.model_extra["selfheal"]["status"] == "partial"
        upstream.script([nope] * 8)
        chunks = list(client(gw).chat.completions.create(model="stub", messages=ask(),
                                                         tools=TOOLS, stream=True))
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert "`nope`" in text and "left out" in text, chunks
    finally:
        gw.stop()
    gw = start_gateway(upstream, tmp_path, top='[server]\non_partial = "error"')
    try:
        upstream.script([nope] * 8)
        with pytest.raises(openai.UnprocessableEntityError) as raised:
            client(gw).chat.completions.create(model="stub", messages=ask(), tools=TOOLS)
        assert raised.value.code == "calls_left_out"
        upstream.script([nope] * 8)
        with pytest.raises(openai.APIError) as raised:
            list(client(gw).chat.completions.create(model="stub", messages=ask(), tools=TOOLS,
                                                    stream=True))
        assert "`nope`" in str(raised.value)
    finally:
        gw.stop()
    upstream.log()
