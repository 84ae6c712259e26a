#!/usr/bin/env python3
"""Does a real model's answer to a single-tool prompt come back as a schema-valid `tool_calls`?

Asks 20 single-tool prompts (one tool on offer among four, the one the prompt needs) of a real
OpenAI-compatible model, directly and through `selfheal serve` in front of it, streamed and
not, and counts the answers whose first `tool_calls` entry names the right tool with arguments
that parse and fit its schema (required keys present, types right). Standard library only.

usage:
  scripts/local-model.sh serve 8091 &                 # the real model (see that script)
  selfheal serve --upstream http://127.0.0.1:8091/v1 --listen 127.0.0.1:8092 &
  scripts/live-tool-calls.py --direct http://127.0.0.1:8091/v1 --gateway http://127.0.0.1:8092/v1
"""
import argparse
import json
import time
import urllib.request

TOOLS = {
    "get_weather": ({"city": "string"}, ["city"]),
    "convert_currency": ({"amount": "number", "from": "string", "to": "string"}, ["amount", "from", "to"]),
    "search_web": ({"query": "string"}, ["query"]),
    "send_email": ({"to": "string", "subject": "string", "body": "string"}, ["to", "subject"]),
}

PROMPTS = [
    ("What is the weather in Paris?", "get_weather"),
    ("Is it raining in Tokyo right now?", "get_weather"),
    ("How warm is it in Cairo today?", "get_weather"),
    ("Tell me the current weather for Oslo.", "get_weather"),
    ("Weather in Buenos Aires, please.", "get_weather"),
    ("Convert 100 USD to EUR.", "convert_currency"),
    ("How many yen is 250 euros?", "convert_currency"),
    ("What is 80 GBP in US dollars?", "convert_currency"),
    ("Change 1500 SEK into NOK.", "convert_currency"),
    ("How much is 42 CHF in EUR?", "convert_currency"),
    ("Search the web for the latest Rust release notes.", "search_web"),
    ("Find news about the James Webb telescope.", "search_web"),
    ("Look up who won the 2022 World Cup.", "search_web"),
    ("Search for a recipe for vegan lasagna.", "search_web"),
    ("Find the population of Canada online.", "search_web"),
    ("Email bob@example.com with the subject 'Lunch' saying I will be late.", "send_email"),
    ("Send an email to alice@example.org titled 'Report' with body 'Attached.'", "send_email"),
    ("Write to carol@example.com, subject 'Hi', body 'How are you?'", "send_email"),
    ("Email dave@example.net the subject 'Invoice' and say it is paid.", "send_email"),
    ("Send eve@example.com a mail with subject 'Meeting' about tomorrow at 10.", "send_email"),
]

JSON_TYPES = {"string": str, "number": (int, float)}


def tools_param():
    out = []
    for name, (props, required) in TOOLS.items():
        out.append({"type": "function", "function": {
            "name": name, "description": name.replace("_", " "),
            "parameters": {"type": "object", "required": required,
                           "properties": {k: {"type": t} for k, t in props.items()}}}})
    return out


def post(base, body, stream):
    req = urllib.request.Request(base.rstrip("/") + "/chat/completions",
                                 data=json.dumps(body).encode(),
                                 headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        raw = r.read().decode()
    if not stream:
        return json.loads(raw)["choices"][0]["message"]
    # Assemble the streamed message: content and tool-call deltas.
    msg = {"content": "", "tool_calls": {}}
    for line in raw.splitlines():
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        ev = json.loads(line[6:])
        for ch in ev.get("choices") or []:
            d = ch.get("delta") or {}
            msg["content"] += d.get("content") or ""
            for tc in d.get("tool_calls") or []:
                slot = msg["tool_calls"].setdefault(tc.get("index", 0), {"name": "", "arguments": ""})
                f = tc.get("function") or {}
                slot["name"] += f.get("name") or ""
                slot["arguments"] += f.get("arguments") or ""
    calls = [{"function": v} for _, v in sorted(msg["tool_calls"].items())]
    return {"content": msg["content"], "tool_calls": calls}


def valid(message, want):
    calls = message.get("tool_calls") or []
    if not calls:
        return False
    f = calls[0].get("function") or {}
    if f.get("name") != want:
        return False
    try:
        args = json.loads(f.get("arguments") or "")
    except ValueError:
        return False
    props, required = TOOLS[want]
    return isinstance(args, dict) and all(k in args for k in required) and all(
        isinstance(args[k], JSON_TYPES[t]) for k, t in props.items() if k in args)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--direct", required=True, help="the model's base URL (…/v1)")
    ap.add_argument("--gateway", required=True, help="selfheal serve's base URL (…/v1)")
    ap.add_argument("--model", default="local")
    ap.add_argument("--max-tokens", type=int, default=200)
    ap.add_argument("--rows", default="direct,gateway",
                    help="which rows to measure: direct, gateway or both (comma-separated)")
    a = ap.parse_args()
    results = {}
    rows = [r for r in (("direct", a.direct), ("gateway", a.gateway)) if r[0] in a.rows.split(",")]
    for label, base in rows:
        for stream in (False, True):
            ok = 0
            t0 = time.time()
            for prompt, want in PROMPTS:
                body = {"model": a.model, "messages": [{"role": "user", "content": prompt}],
                        "tools": tools_param(), "max_tokens": a.max_tokens, "stream": stream}
                try:
                    ok += valid(post(base, body, stream), want)
                except Exception as e:  # a failed request counts as not valid
                    print(f"  {label} stream={stream}: {prompt!r}: {e}")
            key = f"{label} {'streamed' if stream else 'not streamed'}"
            results[key] = ok
            print(f"{key:24s} {ok:2d} of {len(PROMPTS)} schema-valid tool_calls ({time.time() - t0:.0f} s)",
                  flush=True)
    print(json.dumps(results))


if __name__ == "__main__":
    main()
