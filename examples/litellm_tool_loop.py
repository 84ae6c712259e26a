"""Quickstart: LiteLLM as the client, through `selfheal serve`.

    selfheal serve --upstream http://127.0.0.1:8080/v1 &       # any OpenAI-compatible server
    OPENAI_BASE_URL=http://127.0.0.1:7420/v1 MODEL=your-model python examples/litellm_tool_loop.py

`litellm.completion` with the `openai/` prefix and the gateway as `api_base`: LiteLLM speaks
chat completions to it. LITELLM_LOCAL_MODEL_COST_MAP keeps LiteLLM from fetching its price list
at import. Run by the e2e suite (tests/e2e/test_quickstarts.py) in front of a fault-injecting
upstream.
"""

import json
import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import litellm  # noqa: E402 (after the variable it reads at import)

BASE = os.environ.get("OPENAI_BASE_URL", "http://127.0.0.1:7420/v1")
KEY = os.environ.get("OPENAI_API_KEY", "unused")
MODEL = "openai/" + os.environ.get("MODEL", "gpt-4o-mini")

TOOLS = [{"type": "function", "function": {
    "name": "lookup", "description": "Look a key up in the local index.",
    "parameters": {"type": "object", "properties": {"key": {"type": "string"}},
                   "required": ["key"]}}}]


def lookup(key):
    return f"ok: {42 if key == 'answer' else 'unknown'}"


messages = [{"role": "user", "content": "What is the answer? Use the lookup tool."}]
for _ in range(8):
    # num_retries=0, max_retries=0: the gateway retries as its policy says.
    r = litellm.completion(model=MODEL, api_base=BASE, api_key=KEY, messages=messages,
                           tools=TOOLS, num_retries=0, max_retries=0)
    msg = r.choices[0].message
    if not msg.tool_calls:
        break
    messages.append(msg.model_dump(exclude_none=True))
    for call in msg.tool_calls:
        result = lookup(**json.loads(call.function.arguments))
        messages.append({"role": "tool", "tool_call_id": call.id, "content": result})

print(json.dumps({"answer": msg.content}))
