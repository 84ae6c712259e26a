"""Quickstart: a LangChain (`langchain-openai`) tool loop through `selfheal serve`.

    selfheal serve --upstream http://127.0.0.1:8080/v1 &       # any OpenAI-compatible server
    OPENAI_BASE_URL=http://127.0.0.1:7420/v1 MODEL=your-model python examples/langchain_tool_loop.py

`ChatOpenAI` with the gateway as its `base_url`; nothing else changes. Run by the e2e suite
(tests/e2e/test_quickstarts.py) in front of a fault-injecting upstream.
"""

import json
import os

from langchain_core.messages import HumanMessage, ToolMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI


@tool
def lookup(key: str) -> str:
    """Look a key up in the local index."""
    return f"ok: {42 if key == 'answer' else 'unknown'}"


# max_retries=0: the gateway retries as its policy says.
llm = ChatOpenAI(model=os.environ.get("MODEL", "gpt-4o-mini"),
                 base_url=os.environ.get("OPENAI_BASE_URL", "http://127.0.0.1:7420/v1"),
                 api_key=os.environ.get("OPENAI_API_KEY", "unused"), max_retries=0)
model = llm.bind_tools([lookup])

messages = [HumanMessage("What is the answer? Use the lookup tool.")]
for _ in range(8):
    reply = model.invoke(messages)
    messages.append(reply)
    if not reply.tool_calls:
        break
    for call in reply.tool_calls:
        messages.append(ToolMessage(lookup.invoke(call["args"]), tool_call_id=call["id"]))

print(json.dumps({"answer": reply.content}))
