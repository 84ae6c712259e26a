"""Quickstart: an openai-agents agent through `selfheal serve`.

    selfheal serve --upstream http://127.0.0.1:8080/v1 &       # any OpenAI-compatible server
    OPENAI_BASE_URL=http://127.0.0.1:7420/v1 MODEL=your-model python examples/openai_agents_tool_loop.py

The agent's model is an `OpenAIChatCompletionsModel` on a client whose base URL is the gateway;
nothing else changes. Run by the e2e suite (tests/e2e/test_quickstarts.py) in front of a
fault-injecting upstream.
"""

import json
import os

import agents
from openai import AsyncOpenAI

agents.set_tracing_disabled(True)  # no network but the gateway

# max_retries=0: the gateway retries as its policy says.
client = AsyncOpenAI(base_url=os.environ.get("OPENAI_BASE_URL", "http://127.0.0.1:7420/v1"),
                     api_key=os.environ.get("OPENAI_API_KEY", "unused"), max_retries=0)


@agents.function_tool
def lookup(key: str) -> str:
    """Look a key up in the local index."""
    return f"ok: {42 if key == 'answer' else 'unknown'}"


agent = agents.Agent(
    name="quickstart", instructions="Answer with the lookup tool.", tools=[lookup],
    model=agents.OpenAIChatCompletionsModel(model=os.environ.get("MODEL", "gpt-4o-mini"),
                                            openai_client=client))
result = agents.Runner.run_sync(agent, "What is the answer?", max_turns=8)
print(json.dumps({"answer": result.final_output}))
