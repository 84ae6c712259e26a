"""End-to-end: streaming `/v1/responses` is healed like streaming chat completions (issue 13).

The real binary on port 0, the real `openai` SDK's `client.responses.create(stream=True)` as the
client, the scripted upstream (tests/e2e/upstream.py) answering Responses event streams over a
real socket, with faults."""

import json
import uuid

import openai
import pytest

from conftest import PATIENT, start_gateway
from test_deploy import RESPONSES_TOOLS, client


def events(gw, **kw):
    kw.setdefault("input", f"find {uuid.uuid4()}")
    return list(client(gw).responses.create(model="stub", stream=True, **kw))


def text_of(evs):
    return "".join(e.delta for e in evs if e.type == "response.output_text.delta")


def calls_sent(evs):
    """Every function call the client was shown, from any event that can carry one."""
    out = []
    for e in evs:
        if e.type == "response.function_call_arguments.done":
            out.append(("done", e.arguments))
        elif e.type == "response.output_item.done" and e.item.type == "function_call":
            out.append(("item", e.item.arguments))
        elif e.type in ("response.completed", "response.incomplete"):
            out += [("final", o.arguments) for o in e.response.output if o.type == "function_call"]
    return out


def report(evs):
    return evs[-1].response.model_extra["selfheal"]


def test_a_text_stream_arrives_whole_and_ends_completed(gateway, upstream):
    upstream.script([{"kind": "ok", "content": "streamed through the gateway"}])
    evs = events(gateway)
    assert text_of(evs) == "streamed through the gateway"
    assert evs[0].type == "response.created" and evs[-1].type == "response.completed"
    assert [e.sequence_number for e in evs] == list(range(len(evs)))
    assert report(evs)["status"] == "complete"
    assert evs[-1].response.output_text == "streamed through the gateway"


@pytest.mark.parametrize("broken", [{"kind": "empty_stream"}, {"kind": "role_then_cut"},
                                    {"kind": "failed", "message": "model overloaded"},
                                    {"kind": "empty"}],
                         ids=["empty-200", "preamble-then-cut", "response-failed", "empty-json"])
def test_a_stream_broken_before_content_is_reissued_invisibly(gateway, upstream, broken):
    upstream.script([broken, {"kind": "ok", "content": "second time lucky"}])
    evs = events(gateway)
    assert text_of(evs) == "second time lucky"
    assert [e.type for e in evs].count("response.created") == 1, "the broken preamble is not sent"
    assert evs[-1].type == "response.completed"
    assert "reissue" in report(evs)["actions"] and report(evs)["status"] == "complete"
    assert [bool(r.get("stream")) for r in upstream.log()] == [True, False]


@pytest.mark.parametrize("broken,why", [({"kind": "stream_error", "message": "overloaded"}, "overloaded"),
                                        ({"kind": "cut"}, "ended before")],
                         ids=["error-event", "cut"])
def test_a_stream_broken_after_content_ends_in_an_api_error(gateway, upstream, broken, why):
    upstream.script([broken])
    got = []
    with pytest.raises(openai.APIError) as e:
        for ev in client(gateway).responses.create(model="stub", input=f"x {uuid.uuid4()}", stream=True):
            got.append(ev.type)
    assert not isinstance(e.value, openai.APIConnectionError), repr(e.value)
    assert why in str(e.value)
    assert "response.output_text.delta" in got and "response.completed" not in got, got
    assert len(upstream.log()) == 1, "content went out: never re-issued"


def test_streamed_call_arguments_are_repaired_before_the_client_sees_them(gateway, upstream):
    upstream.script([{"kind": "tool", "name": "search", "arguments": '{"query": "rust",}'}])
    evs = events(gateway, tools=RESPONSES_TOOLS)
    sent = calls_sent(evs)
    assert [k for k, _ in sent] == ["done", "item", "final"]
    assert all(json.loads(a) == {"query": "rust"} for _, a in sent), sent
    assert not [e for e in evs if e.type == "response.function_call_arguments.delta"
                and "," in e.delta and "}" not in e.delta], "no broken piece was streamed"
    assert {"repair"} <= set(report(evs)["actions"]) and report(evs)["status"] == "complete"


def test_streamed_unusable_calls_are_reasked_never_forwarded(gateway, upstream):
    upstream.script([{"kind": "tool", "name": "search", "arguments": '{"limit": 3}'},
                     {"kind": "tool", "name": "search", "arguments": '{"query": "fixed"}'}])
    evs = events(gateway, tools=RESPONSES_TOOLS)
    assert [json.loads(a) for _, a in calls_sent(evs)] == [{"query": "fixed"}] * 3
    pieces = [getattr(e, "delta", "") for e in evs if e.type.startswith("response.function_call")]
    assert not [p for p in pieces if "limit" in p], "the unusable call was never streamed"
    assert "reask" in report(evs)["actions"]
    second = upstream.log()[1]
    assert second.get("stream") is False
    assert "could not be used" in json.dumps(second["input"][-1]), second


def test_a_call_cut_by_max_output_tokens_is_reasked_not_repaired(gateway, upstream):
    upstream.script([{"kind": "incomplete", "name": "search", "arguments": '{"query": "trunc'},
                     {"kind": "tool", "name": "search", "arguments": '{"query": "whole"}'}])
    evs = events(gateway, tools=RESPONSES_TOOLS)
    assert [json.loads(a) for _, a in calls_sent(evs)] == [{"query": "whole"}] * 3
    assert evs[-1].type == "response.completed", "the answer is now the re-asked one"
    assert "cut off" in json.dumps(upstream.log()[1]["input"][-1])


def test_a_call_cut_by_max_output_tokens_every_time_ends_partial_without_a_call(gateway, upstream):
    cut = {"kind": "incomplete", "name": "search", "arguments": '{"query": "trunc'}
    upstream.script([cut, cut, cut, cut])
    evs = events(gateway, tools=RESPONSES_TOOLS)
    assert calls_sent(evs) == [], "a cut call is never repaired into a call"
    assert evs[-1].type == "response.incomplete"
    assert report(evs)["status"] == "partial" and "cut off" in report(evs)["reason"]
    assert len(upstream.log()) == 4, "the default ladder re-asks three times (repair, retry, replan)"


def test_a_json_answer_to_a_stream_request_is_streamed(gateway, upstream):
    upstream.script([{"kind": "json", "content": "plain json answer"}])
    evs = events(gateway)
    assert text_of(evs) == "plain json answer" and evs[-1].type == "response.completed"


def test_streamed_requests_feed_the_monitor_with_their_tool_outputs(upstream, tmp_path):
    """Under ladders that keep retrying (the defaults end the run at the ladder's end, see
    conftest.PATIENT), five failures of `search` hide it and tell the model why."""
    gateway = start_gateway(upstream, tmp_path, top=PATIENT)
    try:
        streamed_requests_feed_the_monitor(gateway, upstream)
    finally:
        gateway.stop()


def streamed_requests_feed_the_monitor(gateway, upstream):
    tools = RESPONSES_TOOLS + [{"type": "function", "name": "lookup", "parameters": {
        "type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]}}]
    items = [{"role": "user", "content": f"find {uuid.uuid4()}"}]
    for i in range(5):
        items.append({"type": "function_call", "call_id": f"c{i}", "name": "search",
                      "arguments": json.dumps({"query": f"q{i}"})})
        items.append({"type": "function_call_output", "call_id": f"c{i}",
                      "output": "Error: search backend is down"})
    upstream.script([{"kind": "ok", "content": "trying lookup"}])
    evs = events(gateway, input=items, tools=tools)
    sent = upstream.log()[0]
    assert sent["stream"] is True
    assert [t["name"] for t in sent["tools"]] == ["lookup"], sent["tools"]
    assert "[selfheal]" in sent["instructions"] and "search" in sent["instructions"]
    assert {"guidance", "hide"} <= set(report(evs)["actions"])
    assert text_of(evs) == "trying lookup"


@pytest.mark.parametrize("script", [
    [{"kind": "tool", "name": "search", "arguments": '{"query": "rust",}'}],
    [{"kind": "role_then_cut"}, {"kind": "tool", "name": "search", "arguments": '{"query": "rust"}'}],
    [{"kind": "tool", "name": "search", "arguments": '{"limit": 3}'},
     {"kind": "tool", "name": "search", "arguments": '{"query": "rust"}'}],
], ids=["repaired", "reissued", "reasked"])
def test_the_sdks_stream_helper_accumulates_the_healed_events(gateway, upstream, script):
    """`responses.stream()` rebuilds the response from the events (items by `output_index`,
    arguments from their deltas): what the gateway re-indexes and re-emits must add up."""
    upstream.script(script)
    with client(gateway).responses.stream(model="stub", input=f"find {uuid.uuid4()}",
                                          tools=RESPONSES_TOOLS) as s:
        for _ in s:
            pass
        final = s.get_final_response()
    [call] = [o for o in final.output if o.type == "function_call"]
    assert json.loads(call.arguments) == {"query": "rust"}
    assert final.model_extra["selfheal"]["status"] == "complete"


def test_a_target_that_broke_a_stream_offering_tools_is_asked_without_streaming_next_time(
        gateway, upstream):
    """llama-cpp-python's server cannot stream an automatic tool choice: once Responses streams
    offering tools broke and a non-streaming re-issue healed them, the gateway asks that target
    without streaming and sends its answer as the events a stream would have carried."""
    # Three healed faults teach it (issue 30: one was enough, for every tenant, for good).
    for _ in range(3):
        upstream.script([{"kind": "empty_stream"}, {"kind": "tool", "name": "search",
                                                    "arguments": '{"query": "first"}'}])
        first = events(gateway, tools=RESPONSES_TOOLS)
        assert calls_sent(first)[-1] == ("final", '{"query": "first"}')
        assert [bool(r.get("stream")) for r in upstream.log()] == [True, False]
    upstream.script([{"kind": "tool", "name": "search", "arguments": '{"query": "second"}'}])
    second = events(gateway, tools=RESPONSES_TOOLS)
    assert [bool(r.get("stream")) for r in upstream.log()] == [False], "learned: asked whole"
    assert ("item", '{"query": "second"}') in calls_sent(second)
    assert second[0].type == "response.created" and second[-1].type == "response.completed"
    assert [e.sequence_number for e in second] == list(range(len(second)))
    # Without tools, the same target still streams.
    upstream.script([{"kind": "ok", "content": "plain"}])
    assert text_of(events(gateway)) == "plain"
    assert [bool(r.get("stream")) for r in upstream.log()] == [True]


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_an_invented_argument_of_a_grounded_tool_is_reasked_on_responses(upstream, tmp_path,
                                                                         stream):
    """`[tools.search] grounded = true`: a `function_call` whose argument appears nowhere in the
    request (its instructions, input texts, function outputs) never reaches the client, streamed
    or not; the model is asked again and its grounded call goes out."""
    gw = start_gateway(upstream, tmp_path, top="[tools.search]\ngrounded = true\n")
    try:
        upstream.script([{"kind": "tool", "name": "search", "arguments": '{"query": "invented"}'},
                         {"kind": "tool", "name": "search", "arguments": '{"query": "tea prices"}'}])
        c = client(gw)
        if stream:
            evs = list(c.responses.create(model="stub", stream=True, input="look up tea prices",
                                          tools=RESPONSES_TOOLS))
            shown = [a for _, a in calls_sent(evs)]
        else:
            r = c.responses.create(model="stub", input="look up tea prices", tools=RESPONSES_TOOLS)
            shown = [o.arguments for o in r.output if o.type == "function_call"]
        assert shown and all("invented" not in a for a in shown), shown
        assert any("tea prices" in a for a in shown), shown
        assert len(upstream.log()) == 2, "asked again once"
    finally:
        gw.stop()


def test_a_client_continuing_an_answer_continues_its_run(gateway, upstream):
    """Issue 13: a client that continues a streamed answer with `previous_response_id` sends only
    its calls' results. The gateway reads them against the answer's calls in the same run, so
    the model calling the same tool with the same arguments again is its repetition: re-asked,
    never forwarded. Before, each such turn was a run of its own and the call went out."""
    call = {"kind": "tool", "name": "search", "arguments": '{"query": "tea"}'}
    upstream.script([dict(call, id="resp_a"), dict(call, id="resp_b"),
                     {"kind": "ok", "content": "tea costs 3"}])
    first = events(gateway, input=f"price of tea {uuid.uuid4()}", tools=RESPONSES_TOOLS)
    assert first[-1].response.id == "resp_a"
    assert [c for c in calls_sent(first) if c[0] == "final"] == [("final", '{"query": "tea"}')]
    again = events(gateway, previous_response_id="resp_a", tools=RESPONSES_TOOLS,
                   input=[{"type": "function_call_output", "call_id": "call_stub",
                           "output": '{"price": 3}'}])
    assert calls_sent(again) == [], "the repeated call went out"
    assert text_of(again) == "tea costs 3"
    assert "reask" in report(again)["actions"] and report(again)["status"] == "complete"
    log = upstream.log()
    assert len(log) == 3
    assert log[1]["previous_response_id"] == "resp_a" and len(log[1]["input"]) == 1


def test_issue_31_a_streamed_fenced_json_call_reaches_the_sdk_as_a_function_call(gateway, upstream):
    """Issue 31 on the Responses stream: the model streams its call as a fenced JSON block in
    its message text; the real SDK gets a `function_call` item with a call id (in its
    `output_item.done` and the completed response), never the fence, and `salvage` reported."""
    fenced = '```json\n{"name": "search", "arguments": {"query": "rust"}}\n```'
    upstream.script([{"kind": "ok", "content": fenced}])
    evs = events(gateway, tools=RESPONSES_TOOLS)
    assert evs[-1].type == "response.completed"
    calls = [o for o in evs[-1].response.output if o.type == "function_call"]
    assert [c.name for c in calls] == ["search"], evs
    assert json.loads(calls[0].arguments) == {"query": "rust"} and calls[0].call_id
    assert ("item", calls[0].arguments) in calls_sent(evs)
    assert "```" not in text_of(evs)
    assert [e.sequence_number for e in evs] == list(range(len(evs)))
    assert "salvage" in report(evs)["actions"]
