"""End-to-end: bounded generation (issue 31, item 4) through the real `openai` SDK.

The real binary on port 0, the scripted upstream (tests/e2e/upstream.py) playing a runaway model
(its "degenerate" step: words, then newlines without end, as the recorded Qwen2.5-Coder did under
`tool_choice: "required"`) over a real socket. The gateway cuts the stream: the client's answer
ends cut short (`finish_reason: "length"`, `response.incomplete`) and `partial`, never
`complete`; the upstream sees its connection closed long before the padding ran out; and what the
client rebuilds from the deltas is what the answer's final event says. The Rust version, with
the other cases (a cut before content, a call before the padding), is
crates/selfheal-gateway/tests/bounded.rs."""

import json
import time
import urllib.request
import uuid

from test_deploy import client

# Padding deltas the upstream would write if nobody cut it (about 100 s at its pace).
COUNT = 100_000
# The gateway's whitespace run limit ([limits.degenerate] whitespace_run, default 256).
RUN = 256


def padding(upstream):
    """How many padding deltas the upstream wrote, and whether the gateway closed the stream
    first, once the upstream noticed (within 60 s: a hang guard, not a measurement)."""
    for _ in range(600):
        state = json.loads(urllib.request.urlopen(upstream.url + "/_padding", timeout=5).read())
        if state["closed"]:
            return state
        time.sleep(0.1)
    return state


def test_a_chat_stream_that_degenerates_is_cut_and_ends_partial(gateway, upstream):
    upstream.script([{"kind": "degenerate", "content": "Hello there.", "count": COUNT}])
    chunks = list(client(gateway).chat.completions.create(
        model="stub", stream=True, messages=[{"role": "user", "content": f"hi {uuid.uuid4()}"}]))
    said = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert said.startswith("Hello there.") and len(said) <= len("Hello there.") + RUN, len(said)
    last = chunks[-1]
    assert last.choices[0].finish_reason == "length", last
    report = last.model_extra["selfheal"]
    assert report["status"] == "partial", report
    assert "whitespace" in report["reason"] and "cut" in report["actions"], report
    state = padding(upstream)
    assert state["closed"] and state["written"] < COUNT, state


def test_a_responses_stream_that_degenerates_ends_incomplete_with_what_was_sent(gateway, upstream):
    upstream.script([{"kind": "degenerate", "content": "Hello there.", "count": COUNT}])
    evs = list(client(gateway).responses.create(
        model="stub", stream=True, input=f"hi {uuid.uuid4()}"))
    types = [e.type for e in evs]
    assert types[-1] == "response.incomplete" and "response.completed" not in types, types
    deltas = "".join(e.delta for e in evs if e.type == "response.output_text.delta")
    assert deltas.startswith("Hello there.") and len(deltas) <= len("Hello there.") + RUN
    final = evs[-1].response
    assert final.incomplete_details.reason == "max_output_tokens"
    assert final.model_extra["selfheal"]["status"] == "partial"
    assert "cut" in final.model_extra["selfheal"]["actions"]
    # A client that reads the final item and one that rebuilt the text from deltas agree.
    [message] = final.output
    assert message.status == "incomplete"
    assert message.content[0].text == deltas
    [closed] = [e.item for e in evs if e.type == "response.output_item.done"]
    assert closed.content[0].text == deltas
    state = padding(upstream)
    assert state["closed"] and state["written"] < COUNT, state
