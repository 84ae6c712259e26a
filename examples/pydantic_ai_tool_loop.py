"""Quickstart: a pydantic-ai agent through `selfheal serve`.

    selfheal serve --upstream http://127.0.0.1:8080/v1 &       # any OpenAI-compatible server
    OPENAI_BASE_URL=http://127.0.0.1:7420/v1 MODEL=your-model python examples/pydantic_ai_tool_loop.py

An `OpenAIChatModel` whose provider points at the gateway; nothing else changes. Run by the e2e
suite (tests/e2e/test_quickstarts.py) in front of a fault-injecting upstream.
"""

import json
import os

from openai import AsyncOpenAI
from pydantic_ai import Agent
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider

# max_retries=0: the gateway retries as its policy says.
client = AsyncOpenAI(base_url=os.environ.get("OPENAI_BASE_URL", "http://127.0.0.1:7420/v1"),
                     api_key=os.environ.get("OPENAI_API_KEY", "unused"), max_retries=0)
model = OpenAIChatModel(os.environ.get("MODEL", "gpt-4o-mini"),
                        provider=OpenAIProvider(openai_client=client))
agent = Agent(model, instructions="Answer with the lookup tool.")


@agent.tool_plain
def lookup(key: str) -> str:
    """Look a key up in the local index."""
    return f"ok: {42 if key == 'answer' else 'unknown'}"


result = agent.run_sync("What is the answer?")
print(json.dumps({"answer": result.output}))
