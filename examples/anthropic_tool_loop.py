"""Quickstart: the `anthropic` SDK's tool loop through `selfheal serve` (the Messages API).

    selfheal serve --upstream http://127.0.0.1:8080/v1 &       # any OpenAI-compatible server
    ANTHROPIC_BASE_URL=http://127.0.0.1:7420 MODEL=your-model python examples/anthropic_tool_loop.py

The gateway answers `POST /v1/messages`: it translates the request to chat completions, heals it
with the same pipeline as chat (retries, fall-backs, repaired or re-asked tool calls) and sends
the answer back as an Anthropic message. Each message carries the gateway's `selfheal` report
(status, actions taken, budget), read here from `model_extra`. Run by the e2e suite
(tests/e2e/test_quickstarts.py) in front of a fault-injecting upstream.
"""

import json
import os

from anthropic import Anthropic

# max_retries=0: the gateway retries as its policy says; the SDK's own retries would only repeat
# what it already tried. The key is the gateway's inbound key, if it asks for one.
client = Anthropic(base_url=os.environ.get("ANTHROPIC_BASE_URL", "http://127.0.0.1:7420"),
                   api_key=os.environ.get("ANTHROPIC_API_KEY", "unused"), max_retries=0)
MODEL = os.environ.get("MODEL", "gpt-4o-mini")

TOOLS = [{"name": "lookup", "description": "Look a key up in the local index.",
          "input_schema": {"type": "object", "properties": {"key": {"type": "string"}},
                           "required": ["key"]}}]


def lookup(key):
    return f"ok: {42 if key == 'answer' else 'unknown'}"


messages = [{"role": "user", "content": "What is the answer? Use the lookup tool."}]
reports = []
for _ in range(8):
    r = client.messages.create(model=MODEL, max_tokens=1024, messages=messages, tools=TOOLS)
    reports.append(r.model_extra.get("selfheal"))
    if r.stop_reason != "tool_use":
        break
    messages.append({"role": "assistant",
                     "content": [b.model_dump(exclude_none=True) for b in r.content]})
    messages.append({"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": b.id, "content": lookup(**b.input)}
        for b in r.content if b.type == "tool_use"]})

answer = "".join(b.text for b in r.content if b.type == "text")
print(json.dumps({"answer": answer, "selfheal": reports}))
