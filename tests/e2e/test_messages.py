"""End-to-end: the Anthropic Messages dialect (`POST /v1/messages`) of the real binary, between
the official `anthropic` SDK and the scripted, fault-injecting OpenAI-compatible upstream. The
gateway translates each request to chat completions, heals it with the chat pipeline, and renders
the healed answer back as an Anthropic message or event stream."""

import hashlib
import importlib.util
import json
import subprocess
import sys
import threading
import time
import urllib.request
import uuid

import anthropic
import httpx
import pytest

from conftest import BIN, ROOT, read_address, start_gateway

spec = importlib.util.spec_from_file_location("chaos", ROOT / "scripts" / "chaos.py")
chaos = importlib.util.module_from_spec(spec)
spec.loader.exec_module(chaos)

LOOKUP = {"name": "lookup", "description": "Look a key up in the local index.",
          "input_schema": {"type": "object", "properties": {"key": {"type": "string"}},
                           "required": ["key"]}}
SEARCH = {"name": "search", "description": "Searches.",
          "input_schema": {"type": "object", "properties": {"query": {"type": "string"}},
                           "required": ["query"]}}


def client(gw, api_key="unused", **kw):
    # max_retries=0: whatever is healed is healed by the gateway, not by the SDK retrying.
    return anthropic.Anthropic(base_url=gw.url, api_key=api_key, max_retries=0, **kw)


def ask(text=None):
    return [{"role": "user", "content": text or f"What is the answer? {uuid.uuid4()}"}]


def tool_uses(message):
    return [b for b in message.content if b.type == "tool_use"]


def text_of(message):
    return "".join(b.text for b in message.content if b.type == "text")


def answer_turns(messages, message):
    """The conversation continued with the assistant's turn and the results of its calls."""
    results = [{"type": "tool_result", "tool_use_id": b.id,
                "content": f"ok: {42 if b.input.get('key', b.input.get('query')) == 'answer' else 0}"}
               for b in tool_uses(message)]
    return messages + [{"role": "assistant", "content": [b.model_dump(exclude_none=True)
                                                         for b in message.content]},
                       {"role": "user", "content": results}]


def streamed(c, **kw):
    """A streaming request read event by event as the SDK yields them: the message the events
    build, the event types in order, and the `selfheal` report of `message_delta`."""
    message, parts, types, report = None, {}, [], None
    for e in c.messages.create(stream=True, **kw):
        types.append(e.type)
        if e.type == "message_start":
            message = e.message.model_dump()
        elif e.type == "content_block_start":
            message["content"].append(e.content_block.model_dump(exclude_none=True))
            parts[e.index] = ""
        elif e.type == "content_block_delta" and e.delta.type == "text_delta":
            message["content"][e.index]["text"] += e.delta.text
        elif e.type == "content_block_delta" and e.delta.type == "input_json_delta":
            parts[e.index] += e.delta.partial_json
        elif e.type == "content_block_stop" and parts.get(e.index):
            message["content"][e.index]["input"] = json.loads(parts[e.index])
        elif e.type == "message_delta":
            message["stop_reason"] = e.delta.stop_reason
            report = (e.model_extra or {}).get("selfheal")
    return anthropic.types.Message.model_validate(message), types, report


def test_a_tool_loop_is_healed_and_translated_both_ways(gateway, upstream):
    upstream.script([{"kind": "status", "status": 500}])  # then the stub's own model
    c = client(gateway)
    messages = ask()
    raw = c.messages.with_raw_response.create(model="stub", max_tokens=256, messages=messages,
                                              tools=[LOOKUP], system="Be brief.")
    first = raw.parse()
    assert first.stop_reason == "tool_use", first
    (call,) = tool_uses(first)
    assert call.name == "lookup" and call.input == {"key": "answer"}
    assert first.model_extra["selfheal"]["status"] == "complete"
    assert "retry" in first.model_extra["selfheal"]["actions"]
    assert raw.headers["x-selfheal-status"] == "complete"
    assert "retry" in raw.headers["x-selfheal-actions"]
    second = c.messages.create(model="stub", max_tokens=256, tools=[LOOKUP],
                               messages=answer_turns(messages, first), system="Be brief.")
    assert second.stop_reason == "end_turn"
    assert text_of(second) == "The answer is 42."
    assert second.model_extra["selfheal"]["status"] == "complete"
    # What went upstream: chat completions, the call and its result in chat's words.
    log = upstream.log()
    assert len(log) == 3, log  # the 500, its retry, the turn with the result
    assert log[0]["messages"] == log[1]["messages"]
    last = log[2]
    assert last["max_tokens"] == 256
    assert last["messages"][0] == {"role": "system", "content": "Be brief."}
    assert last["tools"][0] == {"type": "function", "function": {
        "name": "lookup", "description": LOOKUP["description"],
        "parameters": LOOKUP["input_schema"]}}
    assistant, result = last["messages"][-2:]
    assert assistant["tool_calls"][0]["id"] == call.id
    assert json.loads(assistant["tool_calls"][0]["function"]["arguments"]) == {"key": "answer"}
    assert result == {"role": "tool", "tool_call_id": call.id, "content": "ok: 42"}


def test_a_streamed_tool_loop_is_healed_and_translated(gateway, upstream):
    # The first stream is cut before any content: re-issued invisibly.
    upstream.script([{"kind": "role_then_cut"}])
    c = client(gateway)
    messages = ask()
    first, types, report = streamed(c, model="stub", max_tokens=256, messages=messages,
                                    tools=[LOOKUP])
    assert types[0] == "message_start" and types[-2:] == ["message_delta", "message_stop"]
    assert "content_block_start" in types and "content_block_stop" in types
    assert first.stop_reason == "tool_use"
    (call,) = tool_uses(first)
    assert call.input == {"key": "answer"}
    assert report["status"] == "complete" and "reissue" in report["actions"], report
    # The result turn, through the SDK's own stream helper this time.
    with c.messages.stream(model="stub", max_tokens=256, tools=[LOOKUP],
                           messages=answer_turns(messages, first)) as s:
        second = s.get_final_message()
    assert second.stop_reason == "end_turn"
    assert text_of(second).strip() == "The answer is 42."
    assert upstream.log()[-1]["messages"][-1]["role"] == "tool"


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_broken_tool_call_json_is_repaired(gateway, upstream, stream):
    upstream.script([{"kind": "tool", "name": "lookup", "arguments": '{"key": "answer"'}])
    kw = dict(model="stub", max_tokens=64, messages=ask(), tools=[LOOKUP])
    if stream:
        message, _, report = streamed(client(gateway), **kw)
    else:
        message = client(gateway).messages.create(**kw)
        report = message.model_extra["selfheal"]
    (call,) = tool_uses(message)
    assert call.input == {"key": "answer"}
    assert "repair" in report["actions"], report


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_upstream_5xx_are_healed(gateway, upstream, stream):
    upstream.script([{"kind": "status", "status": 500}, {"kind": "status", "status": 503},
                     {"kind": "ok", "content": "hello there"}])
    kw = dict(model="stub", max_tokens=64, messages=ask())
    if stream:
        message, _, report = streamed(client(gateway), **kw)
    else:
        message = client(gateway).messages.create(**kw)
        report = message.model_extra["selfheal"]
    assert text_of(message).strip() == "hello there"
    assert message.stop_reason == "end_turn"
    assert report["budget"]["spent"]["retries"] == 2, report


def test_a_stream_cut_after_content_is_an_error_never_a_finish(gateway, upstream):
    upstream.script([{"kind": "cut"}])
    types = []
    with pytest.raises(anthropic.APIStatusError) as raised:
        for e in client(gateway).messages.create(model="stub", max_tokens=64, messages=ask(),
                                                 stream=True):
            types.append(e.type)
    assert "content_block_delta" in types, "the text before the cut went out"
    assert "message_stop" not in types and "message_delta" not in types
    assert "ended before the answer was finished" in str(raised.value)


def test_errors_are_anthropic_shaped_with_their_status(gateway, upstream):
    c = client(gateway)
    upstream.script([])
    # A block the chat API cannot carry is refused, never dropped; nothing goes upstream.
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                         "data": "iVBORw0KGgo="}}
    with pytest.raises(anthropic.BadRequestError) as raised:
        c.messages.create(model="stub", max_tokens=8, messages=[
            {"role": "user", "content": [{"type": "text", "text": "what is this?"}, image]}])
    assert raised.value.body["type"] == "error"
    assert raised.value.body["error"]["type"] == "invalid_request_error"
    assert "`image`" in raised.value.body["error"]["message"]
    with pytest.raises(anthropic.BadRequestError) as raised:
        c.messages.create(model="stub", max_tokens=8, messages=ask(),
                          thinking={"type": "enabled", "budget_tokens": 1024})
    assert "thinking" in raised.value.body["error"]["message"]
    # Under max_body_bytes (262144) as sent, over it as chat completions (a `tool_use` input
    # becomes an escaped string): a 413 that says so.
    quotes = '"' * 100_000
    with pytest.raises(anthropic.ContentTooLargeError) as raised:
        c.messages.create(model="stub", max_tokens=8, messages=[
            *ask(), {"role": "assistant", "content": [
                {"type": "tool_use", "id": "toolu_q", "name": "lookup", "input": {"key": quotes}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_q",
                                          "content": "ok: 1"}]}])
    assert raised.value.body["error"]["type"] == "request_too_large"
    assert "translated to chat completions" in raised.value.body["error"]["message"]
    assert upstream.log() == []
    upstream.script([{"kind": "status", "status": 503}] * 10)
    with pytest.raises(anthropic.InternalServerError) as raised:
        c.messages.create(model="stub", max_tokens=8, messages=ask())
    assert raised.value.status_code == 502
    assert raised.value.body["error"]["code"] == "upstream_exhausted"
    assert raised.value.body["error"]["type"] == "api_error"


def test_tool_choice_stop_sequences_and_metadata_reach_the_upstream(gateway, upstream):
    upstream.script([{"kind": "ok", "content": "fine"}])
    client(gateway).messages.create(
        model="stub", max_tokens=32, messages=ask(), tools=[LOOKUP, SEARCH],
        tool_choice={"type": "tool", "name": "search", "disable_parallel_tool_use": True},
        # The SDK no longer has `temperature`; the API (and older clients) still send it.
        stop_sequences=["END"], extra_body={"temperature": 0.2}, metadata={"user_id": "user-7"},
        system=[{"type": "text", "text": "One."}, {"type": "text", "text": "Two."}])
    (sent,) = upstream.log()
    assert sent["tool_choice"] == {"type": "function", "function": {"name": "search"}}
    assert sent["parallel_tool_calls"] is False
    assert sent["stop"] == ["END"] and sent["temperature"] == 0.2 and sent["user"] == "user-7"
    assert sent["messages"][0] == {"role": "system", "content": [
        {"type": "text", "text": "One."}, {"type": "text", "text": "Two."}]}


def test_partial_answers_say_so_in_words_or_raise(upstream, tmp_path):
    """Calls left out after failed re-asks: the message says so in a text block (whole or
    streamed), never an empty answer; with `on_partial = "error"` the SDK raises."""
    nope = {"kind": "tool", "name": "nope", "arguments": "{}"}
    gw = start_gateway(upstream, tmp_path)
    try:
        upstream.script([nope] * 8)
        raw = client(gw).messages.with_raw_response.create(model="stub", max_tokens=64,
                                                           messages=ask(), tools=[LOOKUP])
        m = raw.parse()
        assert not tool_uses(m) and m.stop_reason == "end_turn"
        assert "`nope`" in text_of(m) and "left out" in text_of(m), m
        assert m.model_extra["selfheal"]["status"] == "partial"
        assert raw.headers["x-selfheal-status"] == "partial"
        upstream.script([nope] * 8)
        m, types, report = streamed(client(gw), model="stub", max_tokens=64, messages=ask(),
                                    tools=[LOOKUP])
        assert "`nope`" in text_of(m) and "left out" in text_of(m), m
        assert report["status"] == "partial" and types[-1] == "message_stop"
    finally:
        gw.stop()
    gw = start_gateway(upstream, tmp_path, top='[server]\non_partial = "error"')
    try:
        upstream.script([nope] * 8)
        with pytest.raises(anthropic.UnprocessableEntityError) as raised:
            client(gw).messages.create(model="stub", max_tokens=64, messages=ask(),
                                       tools=[LOOKUP])
        assert raised.value.body["error"]["code"] == "calls_left_out"
        upstream.script([nope] * 8)
        with pytest.raises(anthropic.APIStatusError) as raised:
            streamed(client(gw), model="stub", max_tokens=64, messages=ask(), tools=[LOOKUP])
        assert "`nope`" in str(raised.value)
    finally:
        gw.stop()


def test_a_stopped_run_says_so_in_words(gateway, upstream):
    """A conversation whose tool results keep failing: the gateway stops the run and answers
    itself, in a text block that says why — the upstream is never asked."""
    upstream.script([])
    for stream in (False, True):
        # A conversation of its own per request (its own run, its own call ids).
        messages, run = ask(), uuid.uuid4().hex[:8]
        for i in range(9):
            ok = i < 1
            messages.append({"role": "assistant", "content": [{
                "type": "tool_use", "id": f"toolu_{run}_{i}",
                "name": "lookup" if ok else f"tool{i % 4}", "input": {"key": f"k{i}"}}]})
            messages.append({"role": "user", "content": [{
                "type": "tool_result", "tool_use_id": f"toolu_{run}_{i}",
                "content": "ok: 1" if ok else "backend down", "is_error": not ok}]})
        if stream:
            m, types, report = streamed(client(gateway), model="stub", max_tokens=64,
                                        messages=messages, tools=[LOOKUP])
            assert types[-1] == "message_stop"
        else:
            raw = client(gateway).messages.with_raw_response.create(
                model="stub", max_tokens=64, messages=messages, tools=[LOOKUP])
            m, report = raw.parse(), raw.parse().model_extra["selfheal"]
            assert raw.headers["x-selfheal-status"] == "partial"
        assert "I have to stop here" in text_of(m), m
        assert m.stop_reason == "end_turn" and not tool_uses(m)
        assert report["status"] == "partial" and "failed" in report["reason"], report
    assert upstream.log() == [], "a stopped run is answered by the gateway"


def test_x_api_key_is_an_inbound_key(upstream, tmp_path):
    digest = hashlib.sha256(b"sk-alice").hexdigest()
    gw = start_gateway(upstream, tmp_path, top=f'[inbound_keys]\nalice = "{digest}"')
    try:
        upstream.script([{"kind": "ok", "content": "hi alice"}])
        m = client(gw, api_key="sk-alice").messages.create(model="stub", max_tokens=8,
                                                           messages=ask())
        assert text_of(m).strip() == "hi alice"
        with pytest.raises(anthropic.AuthenticationError) as raised:
            client(gw, api_key="sk-mallory").messages.create(model="stub", max_tokens=8,
                                                             messages=ask())
        assert raised.value.body["error"]["type"] == "authentication_error"
        # An unknown caller is refused before its body is read: a 401, not a 400.
        with pytest.raises(anthropic.AuthenticationError):
            client(gw, api_key="sk-mallory").messages.create(
                model="stub", max_tokens=8, messages=ask(), thinking={"type": "enabled",
                                                                       "budget_tokens": 1})
        # The inbound key is the gateway's, never forwarded.
        assert all("sk-alice" not in json.dumps(h) for h in upstream.headers())
    finally:
        gw.stop()


def agent_turns(c, stream, timeout):
    """An agent's two turns (its call, then the answer to the call's result): the verdict of
    each request — ok, flagged (partial), failed (raised), hung, or silent_bad (an answer that
    is neither right nor flagged)."""
    verdicts = []
    messages = ask()
    for turn in range(2):
        kw = dict(model="chaos", max_tokens=128, messages=messages, tools=[SEARCH])
        try:
            if stream:
                m, types, report = streamed(c, **kw)
                if types[-1] != "message_stop":
                    verdicts.append("silent_bad")
                    return verdicts
            else:
                m = c.messages.create(**kw)
                report = m.model_extra.get("selfheal")
        except anthropic.APITimeoutError:
            verdicts.append("hung")
            return verdicts
        except (anthropic.APIError, httpx.HTTPError):
            verdicts.append("failed")
            return verdicts
        status = (report or {}).get("status")
        if status != "complete":
            verdicts.append("flagged" if status in ("partial", "failed") else "silent_bad")
            return verdicts
        if turn == 0:
            ok = m.stop_reason == "tool_use" and [(b.name, b.input) for b in tool_uses(m)] == [
                ("search", {"query": "answer"})]
            messages = answer_turns(messages, m)
        else:
            ok = m.stop_reason == "end_turn" and text_of(m).strip() == chaos.EXPECTED
        verdicts.append("ok" if ok else "silent_bad")
        if not ok:
            return verdicts
    return verdicts


def test_chaos_messages_agents_all_healed(tmp_path):
    """scripts/chaos.py's faults (the chat chaos run's) at 25 % on the primary, a healthy
    fallback: 100 agent conversations of two turns through /v1/messages (200 requests), half
    streaming, from 8 threads — 0 failed, 0 silent bad answers, 0 hung."""
    procs = [subprocess.Popen([sys.executable, str(chaos.UPSTREAM)], stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, text=True) for _ in range(2)]
    gw_p = None
    try:
        faulty, healthy = (read_address(p) for p in procs)
        chaos.post(healthy, "/_script", [])
        chaos.post(healthy, "/_chaos", {"rate": 0, "seed": 0, "kinds": []})
        chaos.post(faulty, "/_chaos", {"rate": 0.25, "seed": 30, "kinds": chaos.FAULTS})
        gw_p, url = chaos.gateway(BIN, faulty, healthy, tmp_path)
        tally, lock = {}, threading.Lock()
        todo = list(range(100))

        def worker():
            c = anthropic.Anthropic(base_url=url, api_key="unused", max_retries=0, timeout=15)
            while True:
                with lock:
                    if not todo:
                        return
                    i = todo.pop()
                for v in agent_turns(c, stream=i % 2 == 1, timeout=15):
                    with lock:
                        tally[v] = tally.get(v, 0) + 1

        started = time.monotonic()
        threads = [threading.Thread(target=worker) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        faults = json.loads(urllib.request.urlopen(faulty + "/_chaos", timeout=5).read())["faults"]
        line = {"tally": tally, "faults": faults, "wall_s": round(time.monotonic() - started, 1)}
        print("messages chaos:", line)
    finally:
        if gw_p is not None:
            gw_p.terminate()
            gw_p.wait(timeout=30)
        for p in procs:
            p.kill()
            p.wait()
    assert faults >= 30, line
    assert tally.get("failed", 0) == 0 and tally.get("hung", 0) == 0, line
    assert tally.get("silent_bad", 0) == 0, line
    assert tally.get("ok", 0) == 200, line
