"""The requests the gateway benchmarks send (bench-lib.sh's "repeated" body, bench-gateway.sh's
realistic turns, callgrind-gateway.sh and heap-gateway.sh's conversations), defined once so that
every script loads the gateway with the same tools and the same turns. Imported by the scripts'
inline Python (they run from the repository root): `sys.path.insert(0, "scripts")`."""
import json

# The tools every request offers: three alike, so the gateway checks calls against a schema.
TOOLS = [{"type": "function", "function": {"name": n, "description": f"{n} things",
          "parameters": {"type": "object", "properties": {"query": {"type": "string"},
          "limit": {"type": "integer", "default": 5}}, "required": ["query"]}}}
         for n in ("search", "lookup", "fetch")]

SYSTEM = {"role": "system", "content": "You are a research agent. Use the tools."}


def turn(i):
    """Turn `i` of a conversation: the assistant's call of `search`, then the tool's result."""
    return [{"role": "assistant", "content": None, "tool_calls": [{"id": f"call_{i}",
             "type": "function", "function": {"name": "search",
             "arguments": json.dumps({"query": f"city {i} population"})}}]},
            {"role": "tool", "tool_call_id": f"call_{i}",
             "content": json.dumps({"results": [{"city": f"c{i}", "population": 1000000 + i}]})}]


def history(upto):
    """Turns 0 to `upto` - 1, in order."""
    return [m for i in range(upto) for m in turn(i)]
