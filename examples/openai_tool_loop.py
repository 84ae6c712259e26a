"""Quickstart: the `openai` SDK's tool loop through `selfheal serve`.

    selfheal serve --upstream http://127.0.0.1:8080/v1 &       # any OpenAI-compatible server
    OPENAI_BASE_URL=http://127.0.0.1:7420/v1 MODEL=your-model python examples/openai_tool_loop.py

The only change an agent needs is the base URL. Each answer carries the gateway's `selfheal`
report (status, actions taken, budget), read here from `model_extra`. Run by the e2e suite
(tests/e2e/test_quickstarts.py) in front of a fault-injecting upstream.
"""

import json
import os

from openai import OpenAI

# max_retries=0: the gateway retries as its policy says; the SDK's own retries would only repeat
# what it already tried.
client = OpenAI(base_url=os.environ.get("OPENAI_BASE_URL", "http://127.0.0.1:7420/v1"),
                api_key=os.environ.get("OPENAI_API_KEY", "unused"), max_retries=0)
MODEL = os.environ.get("MODEL", "gpt-4o-mini")

TOOLS = [{"type": "function", "function": {
    "name": "lookup", "description": "Look a key up in the local index.",
    "parameters": {"type": "object", "properties": {"key": {"type": "string"}},
                   "required": ["key"]}}}]


def lookup(key):
    return f"ok: {42 if key == 'answer' else 'unknown'}"


messages = [{"role": "user", "content": "What is the answer? Use the lookup tool."}]
reports = []
for _ in range(8):
    r = client.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS)
    reports.append(r.model_extra.get("selfheal"))
    msg = r.choices[0].message
    if not msg.tool_calls:
        break
    messages.append(msg.model_dump(exclude_none=True))
    for call in msg.tool_calls:
        result = lookup(**json.loads(call.function.arguments))
        messages.append({"role": "tool", "tool_call_id": call.id, "content": result})

print(json.dumps({"answer": msg.content, "selfheal": reports}))
