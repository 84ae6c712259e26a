#!/usr/bin/env python3
"""Chaos at scale: the real `selfheal serve` between many clients and a fault-injecting upstream
(tests/e2e/upstream.py), with a healthy fallback. The CI-sized run of the same idea is
`test_chaos_small_no_failures_while_a_healthy_fallback_exists` in tests/e2e/test_deploy.py.

The scenarios, one after the other, each on a fresh gateway:

- faults:  20 % of the primary's answers are a fault (500, 503, 429 with Retry-After, an empty
           200, an empty stream, a stream cut after the role, a JSON answer to a stream request,
           a stall past the first-byte timeout, a connection reset, a 200 whose JSON is cut or
           is an error object, a stream that stalls past the idle timeout after the role, one
           with an event that is not JSON, one that opens with an error event, one that ends
           with [DONE] and no finish, a tool call cut inside its arguments or by `length`, a
           200 whose `choices` is an object (whole or streamed), an HTML page behind a 200, a
           stream that finishes with nothing but the role;
           seeded), half the requests streaming, every turn a new conversation; one
           conversation in four speaks the Responses API (`/v1/responses`) and one in four
           Anthropic's Messages API (`/v1/messages`), streaming or not, half of each agents
           with a tool, and one in eight is an agent on chat completions (an agent's turn is
           its call, judged whole and exact, then the answer to the call's result), the rest
           plain chat completions.
- outage:  the primary answers nothing but 503 (a full provider outage); the conversations
           (agents among them, as above) are TURNS turns each (one run per conversation),
           half streaming.
- long:    the faults of "faults" the upstream causes (all but a call cut by `length`), on
           conversations of --long-turns turns each (one run per conversation, so earlier
           turns' recoveries spend the run's budget): each is healed however little is left.
- replicas: (not in the default --only; needs redis-server and haproxy) the load of "faults"
           as conversations of --replica-turns turns through a real HAProxy in round robin to
           three gateways sharing one real redis-server (--state): an agent's run continues on
           whichever replica its next request reaches. Adds the replicas' shared-run counters
           and the Redis memory per stored run.
- kill9:   load as in "faults" (a new conversation per request, half streaming), then SIGKILL
           of the gateway after --kill-after seconds: counts the answers a client received
           whole whose run has no `response` event in the trace (docs/guides/deploying.md states the
           loss window), checks that no cut stream looked whole, and restarts the gateway on the
           same trace file (it must open and serve).
- slowloris: the gateway under a low file-descriptor limit (--nofile, `ulimit -n`) with
           --slow-connections connections that dribble a request head one header line at a
           time and reconnect when cut, while THREADS real clients (kept-alive, a 503 retried
           after 0.2 s up to 5 times, as SDKs do) send requests; then SIGTERM during the attack,
           which must end the process within the drain deadline.
- idlers:  as slowloris, but each attacking connection sends one whole request and then sits on
           its kept-alive connection (reconnecting when closed): at the connection cap the
           longest-idle one must give its slot to a real client.

Every answer is read as a client on a socket sees it (stdlib HTTP, no SDK retries) and sorted:
  ok               200, the expected answer (or call) whole: finish_reason "stop" ("tool_calls"),
                   Responses status "completed", Messages stop_reason "end_turn" ("tool_use");
                   selfheal status "complete"
  flagged          200 but the gateway says it is degraded (status partial/failed, or a stream
                   that ends in an error event): a failure, but a visible one
  failed           any other status (502, ...) or a broken connection: a client-visible failure
  silent_bad       200, unflagged, and not the expected answer whole (a chat stream without
                   [DONE], a Responses stream without response.completed, a Messages stream
                   without message_stop, with a second message_start or with events after
                   message_stop, or a body of the wrong shape)
  hung             no answer within --timeout seconds

Only loopback; the two upstreams are Python and share the machine with the gateway, so the
figures are about correctness, not speed.

  scripts/chaos.py                        # 10,000 + 2,000 requests, kill9, slowloris (release)
  scripts/chaos.py --requests 400 --outage-requests 100 --bin target/debug/selfheal
  scripts/chaos.py --only kill9,slowloris  # some scenarios only

The e2e suite (tests/e2e/test_chaos.py) runs kill9 and slowloris at a small size in CI.
"""

import argparse
import concurrent.futures
import http.client
import json
import os
import resource
import shutil
import signal
import sqlite3
import pathlib
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid

ROOT = pathlib.Path(__file__).resolve().parents[1]
UPSTREAM = ROOT / "tests" / "e2e" / "upstream.py"
EXPECTED = "The answer is 42."

FAULTS = [{"kind": "status", "status": 500}, {"kind": "status", "status": 503},
          {"kind": "status", "status": 429, "retry_after": "0"}, {"kind": "empty"},
          {"kind": "empty_stream"}, {"kind": "role_then_cut"},
          {"kind": "json"}, {"kind": "hang", "seconds": 2.0},
          {"kind": "reset"}, {"kind": "bad_json"}, {"kind": "error_body"},
          {"kind": "stall_after_role", "seconds": 2.0}, {"kind": "bad_chunk"},
          {"kind": "error_first"}, {"kind": "done_no_finish"}, {"kind": "tool_cut"},
          {"kind": "tool_length"},
          # A 200 whose JSON has the wrong shape (a pointer would read it as a list), and an
          # HTML error page behind a 200.
          {"kind": "raw", "body": json.dumps({"object": "chat.completion", "choices": {"0": {
              "index": 0, "message": {"role": "assistant", "content": "shape"},
              "finish_reason": "stop"}}})},
          {"kind": "raw", "body": "<html><body>502 Bad Gateway</body></html>",
           "content_type": "text/html"},
          # A stream that finishes with nothing in it but the role, and one whose `choices` is
          # an object (sent whatever was asked: to a non-streaming request it is a fault too).
          {"kind": "raw", "content_type": "text/event-stream", "body":
              'data: {"id": "x", "object": "chat.completion.chunk", "choices": [{"index": 0, '
              '"delta": {"role": "assistant", "content": ""}, "finish_reason": null}]}\n\n'
              'data: {"id": "x", "object": "chat.completion.chunk", "choices": [{"index": 0, '
              '"delta": {}, "finish_reason": "stop"}]}\n\ndata: [DONE]\n\n'},
          {"kind": "raw", "content_type": "text/event-stream", "body":
              'data: {"id": "x", "object": "chat.completion.chunk", "choices": {"0": {"index": 0, '
              '"delta": {"content": "shape"}, "finish_reason": "stop"}}}\n\ndata: [DONE]\n\n'}]
# The tool the agent conversations offer; the stub's model calls it with {"query": "answer"}
# and answers once it has a result that starts with "ok:".
TOOLS = [{"type": "function", "function": {"name": "search", "description": "Searches.",
          "parameters": {"type": "object", "properties": {"query": {"type": "string"}},
                         "required": ["query"]}}}]
RESPONSES_TOOLS = [{"type": "function", "name": "search", "description": "Searches.",
                    "parameters": TOOLS[0]["function"]["parameters"]}]
MESSAGES_TOOLS = [{"name": "search", "description": "Searches.",
                   "input_schema": TOOLS[0]["function"]["parameters"]}]


def start(cmd, env=None, quiet=False, preexec=None):
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env, preexec_fn=preexec,
                            stderr=subprocess.DEVNULL if quiet else None)
    line = proc.stdout.readline()
    if not line.startswith("listening on "):
        proc.kill()
        raise SystemExit(f"{cmd[0]}: unexpected first line {line!r}")
    return proc, line.split("listening on ", 1)[1].strip()


def post(url, path, body):
    req = urllib.request.Request(url + path, data=json.dumps(body).encode(), method="POST",
                                 headers={"content-type": "application/json"})
    return json.loads(urllib.request.urlopen(req, timeout=10).read())


class Client:
    """One kept-alive connection per thread, reopened after an error."""

    def __init__(self, url, timeout):
        self.host, self.port = url.split("//", 1)[1].split(":")
        self.timeout = timeout
        self.conn = None
        self.last_run = None

    def ask(self, messages, stream, api="chat"):
        """One request; `api` is "chat", "responses", "messages" (Anthropic's `/v1/messages`)
        or an agent on one of them ("agent" on chat, "responses_agent", "messages_agent": the
        tool offered, and the answer to a user turn must be the call of `search`; the verdict's
        text is then the call)."""
        if self.conn is None:
            self.conn = http.client.HTTPConnection(self.host, int(self.port), timeout=self.timeout)
        if api in ("responses", "responses_agent"):
            path, body = "/v1/responses", {"model": "chaos", "input": messages}
        elif api in ("messages", "messages_agent"):
            path, body = "/v1/messages", {"model": "chaos", "max_tokens": 128, "messages": messages}
        else:
            path, body = "/v1/chat/completions", {"model": "chaos", "messages": messages}
        if api == "agent":
            body["tools"] = TOOLS
        if api == "responses_agent":
            body["tools"] = RESPONSES_TOOLS
        if api == "messages_agent":
            body["tools"] = MESSAGES_TOOLS
        if stream:
            body["stream"] = True
        started = time.monotonic()
        try:
            self.conn.request("POST", path, body=json.dumps(body),
                              headers={"content-type": "application/json"})
            resp = self.conn.getresponse()
            data = resp.read()
            status = resp.status
            self.last_run = resp.getheader("x-selfheal-run")
        except (socket.timeout, TimeoutError):
            self.conn.close()
            self.conn = None
            return "hung", None, time.monotonic() - started, "no answer in time"
        except (OSError, http.client.HTTPException) as e:
            self.conn.close()
            self.conn = None
            return "failed", None, time.monotonic() - started, f"connection: {e!r}"
        elapsed = time.monotonic() - started
        if resp.getheader("connection", "").lower() == "close":
            self.conn.close()
            self.conn = None
        if status != 200:
            return "failed", None, elapsed, f"HTTP {status}: {data[:200]!r}"
        if api == "responses_agent" and messages[-1].get("type") != "function_call_output":
            return (*judge_responses_call(data, stream), elapsed, data[:300])
        if api in ("responses", "responses_agent"):
            return (*judge_responses(data, stream), elapsed, data[:300])
        if api == "messages_agent" and isinstance(messages[-1]["content"], str):
            return (*judge_messages(data, stream, call=True), elapsed, data[:300])
        if api in ("messages", "messages_agent"):
            return (*judge_messages(data, stream), elapsed, data[:300])
        if api == "agent" and messages[-1]["role"] != "tool":
            return (*judge_call(data, stream), elapsed, data[:300])
        return (*judge(data, stream), elapsed, data[:300])


def judge(data, stream):
    """Sorts a 200 answer; returns (verdict, answer text)."""
    if not stream:
        try:
            b = json.loads(data)
            choice = b["choices"][0]
            text, finish = choice["message"].get("content"), choice["finish_reason"]
            status = b["selfheal"]["status"]
        except (ValueError, KeyError, IndexError, TypeError):
            return "silent_bad", None
        if status != "complete":
            return "flagged", text
        return ("ok" if text == EXPECTED and finish == "stop" else "silent_bad"), text
    read = chat_stream(data)
    if read is None:
        return "silent_bad", None
    text, finish, status, done, error = "", None, None, read[1], read[2]
    for c in read[0]:
        if c.get("selfheal"):
            status = c["selfheal"].get("status")
        for ch in choices_of(c):
            text += (ch.get("delta") or {}).get("content") or ""
            finish = ch.get("finish_reason") or finish
    if error is not None or status not in (None, "complete"):
        return "flagged", text
    ok = done and finish == "stop" and status == "complete" and text.strip() == EXPECTED
    return ("ok" if ok else "silent_bad"), text


def chat_stream(data):
    """A chat stream's chunks as a client reads them: (chunks, whether [DONE] came, the error
    event's error or None); None when an event is not JSON."""
    chunks, done, error = [], False, None
    for line in data.decode("utf-8", "replace").splitlines():
        if not line.startswith("data:"):
            continue
        payload = line[5:].strip()
        if payload == "[DONE]":
            done = True
            continue
        try:
            c = json.loads(payload)
        except ValueError:
            return None
        if "error" in c:
            error = c["error"]
        else:
            chunks.append(c)
    return chunks, done, error


def choices_of(chunk):
    """A chunk's choices; a `choices` that is not a list of objects is none (the answer then
    reads as wrong, never as right)."""
    choices = chunk.get("choices")
    return [c for c in choices if isinstance(c, dict)] if isinstance(choices, list) else []


def judge_call(data, stream):
    """Sorts a 200 answer that must call `search` with {"query": "answer"}; returns (verdict,
    the call as a chat `tool_calls` entry)."""
    calls, finish, status, done, error = {}, None, None, not stream, None
    if not stream:
        try:
            b = json.loads(data)
            choice = b["choices"][0]
            for i, c in enumerate(choice["message"].get("tool_calls") or []):
                calls[i] = {"id": c["id"], "name": c["function"]["name"],
                            "arguments": c["function"]["arguments"]}
            finish, status = choice["finish_reason"], b["selfheal"]["status"]
        except (ValueError, KeyError, IndexError, TypeError):
            return "silent_bad", None
    else:
        read = chat_stream(data)
        if read is None:
            return "silent_bad", None
        done, error = read[1], read[2]
        for c in read[0]:
            if c.get("selfheal"):
                status = c["selfheal"].get("status")
            for ch in choices_of(c):
                for d in (ch.get("delta") or {}).get("tool_calls") or []:
                    call = calls.setdefault(d.get("index", 0), {"id": None, "name": "", "arguments": ""})
                    call["id"] = d.get("id") or call["id"]
                    f = d.get("function") or {}
                    call["name"] += f.get("name") or ""
                    call["arguments"] += f.get("arguments") or ""
                finish = ch.get("finish_reason") or finish
    if error is not None or status not in (None, "complete"):
        return "flagged", None
    try:
        args = [json.loads(c["arguments"]) for c in calls.values()]
    except ValueError:
        return "silent_bad", None
    ok = done and status == "complete" and finish == "tool_calls" and len(calls) == 1 \
        and calls[0]["name"] == "search" and args == [{"query": "answer"}] and calls[0]["id"]
    if not ok:
        return "silent_bad", None
    c = calls[0]
    return "ok", {"id": c["id"], "type": "function",
                  "function": {"name": c["name"], "arguments": c["arguments"]}}


def sse_events(data):
    """An event stream's events (each `data:` line: Responses, Messages); None when one is not
    JSON."""
    events = []
    for line in data.decode("utf-8", "replace").splitlines():
        if not line.startswith("data:"):
            continue
        try:
            events.append(json.loads(line[5:].strip()))
        except ValueError:
            return None
    return events


def judge_responses_call(data, stream):
    """Sorts a 200 answer of `/v1/responses` that must call `search` with {"query": "answer"}
    (as [`judge_call`] does chat's); returns (verdict, the `function_call` item)."""
    last, error = None, None
    if not stream:
        try:
            last = {"type": "response.completed", "response": json.loads(data)}
        except ValueError:
            return "silent_bad", None
    else:
        events = sse_events(data)
        if events is None:
            return "silent_bad", None
        for e in events:
            if e.get("type") == "error" or "error" in e:
                error = e
            elif e.get("type") in ("response.completed", "response.incomplete", "response.failed"):
                last = e
    response = (last or {}).get("response") or {}
    status = (response.get("selfheal") or {}).get("status")
    if error is not None or status not in (None, "complete"):
        return "flagged", None
    calls = [o for o in response.get("output") or [] if o.get("type") == "function_call"]
    try:
        args = [json.loads(c.get("arguments") or "") for c in calls]
    except ValueError:
        return "silent_bad", None
    ok = last is not None and last["type"] == "response.completed" \
        and response.get("status") == "completed" and status == "complete" and len(calls) == 1 \
        and calls[0].get("name") == "search" and args == [{"query": "answer"}] \
        and calls[0].get("call_id")
    if not ok:
        return "silent_bad", None
    c = calls[0]
    return "ok", {"type": "function_call", "call_id": c["call_id"], "name": c["name"],
                  "arguments": c["arguments"]}


def judge_responses(data, stream):
    """Sorts a 200 answer of `/v1/responses`, as [`judge`] does chat's."""
    if not stream:
        try:
            b = json.loads(data)
            text = "".join(p.get("text", "") for o in b["output"] if o.get("type") == "message"
                           for p in o.get("content") or [])
            status, state = b["selfheal"]["status"], b["status"]
        except (ValueError, KeyError, TypeError, AttributeError):
            return "silent_bad", None
        if status != "complete":
            return "flagged", text
        return ("ok" if text == EXPECTED and state == "completed" else "silent_bad"), text
    text, last, error = "", None, None
    events = sse_events(data)
    if events is None:
        return "silent_bad", text
    for e in events:
        if e.get("type") == "error" or "error" in e:
            error = e
        elif e.get("type") == "response.output_text.delta":
            text += e.get("delta") or ""
        elif e.get("type") in ("response.completed", "response.incomplete", "response.failed"):
            last = e
    status = ((last or {}).get("response") or {}).get("selfheal", {}).get("status")
    if error is not None or status not in (None, "complete"):
        return "flagged", text
    ok = last is not None and last["type"] == "response.completed" and status == "complete" \
        and text == EXPECTED
    return ("ok" if ok else "silent_bad"), text


def read_message(data, stream):
    """The message an Anthropic answer builds, whole or from its events, as a client reads it:
    (message or None, the error event or None, whether `message_stop` came). A stream's
    `selfheal` report (on `message_delta`) is put on the message."""
    if not stream:
        try:
            m = json.loads(data)
        except ValueError:
            return None, None, False
        return (m if isinstance(m, dict) else None), None, True
    events = sse_events(data)
    if events is None:
        return None, None, False
    message, error, stopped, inputs = None, None, False, {}
    try:
        for e in events:
            t = e.get("type")
            if stopped:
                # Nothing may follow `message_stop`: a client has taken the message as whole.
                return None, error, False
            if t == "error":
                error = e
            elif t == "message_start":
                if message is not None:
                    # A second message: a client (the SDK) refuses it, never reads it as one.
                    return None, error, False
                message = dict(e["message"])
                message["content"] = []
            elif t == "content_block_start":
                message["content"].append(dict(e["content_block"]))
            elif t == "content_block_delta":
                block, d = message["content"][e["index"]], e["delta"]
                if d["type"] == "text_delta":
                    block["text"] = block.get("text", "") + d["text"]
                elif d["type"] == "input_json_delta":
                    inputs[e["index"]] = inputs.get(e["index"], "") + d["partial_json"]
            elif t == "content_block_stop" and inputs.get(e["index"]):
                message["content"][e["index"]]["input"] = json.loads(inputs[e["index"]])
            elif t == "message_delta":
                message["stop_reason"] = e["delta"].get("stop_reason")
                if "selfheal" in e:
                    message["selfheal"] = e["selfheal"]
            elif t == "message_stop":
                stopped = True
    except (KeyError, IndexError, TypeError, ValueError, AttributeError):
        return None, error, False
    return message, error, stopped


def judge_messages(data, stream, call=False):
    """Sorts a 200 answer of `/v1/messages` as [`judge`] does chat's, or, with `call`, one that
    must call `search` with {"query": "answer"} as [`judge_call`] does; returns (verdict, the
    answer's text, or with `call` the assistant's content blocks). A body of the wrong shape is
    silent-bad."""
    try:
        m, error, stopped = read_message(data, stream)
        if error is not None:
            return "flagged", None
        if m is None:
            return "silent_bad", None
        status = (m.get("selfheal") or {}).get("status")
        blocks = [b for b in m.get("content") or [] if isinstance(b, dict)]
        whole = stopped and status == "complete"
        if call:
            calls = [b for b in blocks if b.get("type") == "tool_use"]
            ok = whole and m.get("stop_reason") == "tool_use" and len(calls) == 1 \
                and calls[0].get("name") == "search" \
                and calls[0].get("input") == {"query": "answer"} and calls[0].get("id")
            out = blocks if ok else None
        else:
            out = "".join(b.get("text", "") for b in blocks if b.get("type") == "text")
            # As chat's: a whole answer exactly, a streamed one up to surrounding whitespace.
            ok = whole and m.get("stop_reason") == "end_turn" \
                and (out.strip() if stream else out) == EXPECTED
        if status not in (None, "complete"):
            return "flagged", None if call else out
        return ("ok" if ok else "silent_bad"), out
    except (AttributeError, TypeError, KeyError, IndexError):
        return "silent_bad", None


def gateway(binary, faulty, healthy, tmp, trace=None, server="", nofile=None, top="", extra=()):
    """The gateway between `faulty` (primary) and `healthy` (fallback); `server` adds keys of
    `[server]`, `nofile` lowers its file-descriptor limit, `top` adds top-level keys and
    `extra` command-line arguments. Returns (process, url)."""
    config = pathlib.Path(tmp) / f"selfheal-{uuid.uuid4()}.toml"
    config.write_text(f"""
default_upstream = "primary"
{top}
[upstreams.primary]
base_url = "{faulty}/v1"
first_byte_timeout_ms = 1000
idle_timeout_ms = 1000
[upstreams.healthy]
base_url = "{healthy}/v1"
[models.chaos]
chain = [{{upstream = "primary", model = "stub"}}, {{upstream = "healthy", model = "stub"}}]
[retry]
base_ms = 50
max_ms = 200
[server]
{server}
""")
    trace = trace or pathlib.Path(tmp) / f"trace-{uuid.uuid4()}.db"

    def limit():
        if nofile:
            resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

    return start([binary, "serve", "--listen", "127.0.0.1:0", "--config", str(config),
                  "--trace-db", str(trace), *extra],
                 env={**os.environ, "RUST_LOG": os.environ.get("RUST_LOG", "warn"),
                      "SELFHEAL_RUN_SECRET": "chaos"},
                 preexec=limit)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port, within=10.0):
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.02)
    raise SystemExit(f"nothing listens on {port}")


def program(name):
    path = shutil.which(name) or next(
        (p for p in (f"/usr/sbin/{name}", f"/usr/bin/{name}") if os.access(p, os.X_OK)), None)
    if path is None:
        raise SystemExit(f"{name} is not installed (scripts/install-system-deps.sh)")
    return path


def replicas(binary, faulty, healthy, tmp, requests, turns, threads, timeout, count=3):
    """`count` gateways sharing one real redis-server (runs, open circuits, learned targets),
    behind a real HAProxy in round robin, under the load of "faults" as conversations of
    `turns` turns (an agent's run continues on whichever replica its next request reaches).
    The report adds what the replicas did with the shared runs (their /metrics) and the runs
    Redis holds with their memory."""
    redis_port, lb_port = free_port(), free_port()
    procs = [subprocess.Popen(
        [program("redis-server"), "--port", str(redis_port), "--bind", "127.0.0.1", "--save", "",
         "--appendonly", "no"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
    try:
        wait_port(redis_port)
        gws = []
        for _ in range(count):
            p, url = gateway(binary, faulty, healthy, tmp, top='run_secret_env = "SELFHEAL_RUN_SECRET"',
                             extra=("--state", f"redis://127.0.0.1:{redis_port}"))
            procs.append(p)
            gws.append(url)
        cfg = pathlib.Path(tmp) / f"haproxy-{uuid.uuid4()}.cfg"
        servers = "\n".join(f"  server r{i} {u.removeprefix('http://')}" for i, u in enumerate(gws))
        cfg.write_text(f"""
global
  maxconn 1024
defaults
  mode http
  option http-server-close
  timeout connect 2s
  timeout client 60s
  timeout server 60s
frontend gateways
  bind 127.0.0.1:{lb_port}
  default_backend replicas
backend replicas
  balance roundrobin
{servers}
""")
        procs.append(subprocess.Popen([program("haproxy"), "-db", "-f", str(cfg)],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        wait_port(lb_port)
        results, wall = run("replicas", f"http://127.0.0.1:{lb_port}", requests, turns, threads,
                            timeout)
        faults = json.loads(urllib.request.urlopen(faulty + "/_chaos", timeout=10).read())["faults"]
        line = report("replicas", results, wall, faults)
        shared = {}
        for url in gws:
            text = urllib.request.urlopen(url + "/metrics", timeout=10).read().decode()
            for l in text.splitlines():
                if l.startswith("selfheal_state_run") or l.startswith("selfheal_requests_total"):
                    name, value = l.split()
                    shared.setdefault(name, []).append(int(float(value)))
        keys = redis_command(redis_port, "KEYS", "*:run:*")
        runs = [k for k in keys.split("\r\n") if ":run:" in k]
        sample = [int(redis_command(redis_port, "MEMORY", "USAGE", k).strip(":\r\n") or 0)
                  for k in runs[:50]]
        extra = {"per_replica": shared, "runs_in_redis": len(runs),
                 "redis_bytes_per_run_p50": statistics.median(sample) if sample else None}
        print(json.dumps(extra), flush=True)
        return {**line, **extra}
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def redis_command(port, *args):
    """One command over RESP (redis-cli is another package): the raw answer."""
    req = f"*{len(args)}\r\n" + "".join(f"${len(a)}\r\n{a}\r\n" for a in args)
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(req.encode())
        time.sleep(0.05)
        return s.recv(1 << 20).decode()


def run(name, url, requests, turns, threads, timeout):
    """`requests` turns as conversations of `turns` turns; odd conversations stream. An
    agent's turn is two requests (its call, then the answer to the call's result)."""
    local = threading.local()
    conversations = (requests + turns - 1) // turns

    def conversation(i):
        c = getattr(local, "c", None) or Client(url, timeout)
        local.c = c
        stream = i % 2 == 1
        # One conversation in four speaks the Responses API and one in four Anthropic's
        # Messages API, half of each agents with a tool (each of its turns a call, then the
        # answer to its result); one in eight is an agent on chat completions, the rest plain
        # chat; streaming or not, as the others.
        api = {3: "responses", 7: "responses_agent", 6: "messages", 5: "messages_agent",
               1: "agent"}.get((i // 2) % 8, "chat")
        messages = [{"role": "user", "content": f"{name} {i} {uuid.uuid4()}"}]
        out = []
        for t in range(turns):
            if api == "agent":
                verdict, call, elapsed, detail = c.ask(messages, stream, api)
                out.append((verdict, stream, elapsed, detail, api))
                if call is None:
                    break
                messages = messages + [
                    {"role": "assistant", "content": None, "tool_calls": [call]},
                    {"role": "tool", "tool_call_id": call["id"], "content": "ok: 42"}]
            if api == "responses_agent":
                verdict, call, elapsed, detail = c.ask(messages, stream, api)
                out.append((verdict, stream, elapsed, detail, api))
                if call is None:
                    break
                messages = messages + [call, {"type": "function_call_output",
                                              "call_id": call["call_id"], "output": "ok: 42"}]
            if api == "messages_agent":
                verdict, blocks, elapsed, detail = c.ask(messages, stream, api)
                out.append((verdict, stream, elapsed, detail, api))
                if blocks is None:
                    break
                results = [{"type": "tool_result", "tool_use_id": b["id"], "content": "ok: 42"}
                           for b in blocks if b.get("type") == "tool_use"]
                messages = messages + [{"role": "assistant", "content": blocks},
                                       {"role": "user", "content": results}]
            verdict, text, elapsed, detail = c.ask(messages, stream, api)
            out.append((verdict, stream, elapsed, detail, api))
            # (Messages wants a non-empty assistant turn: an unanswered one is written "…".)
            said = text or ("…" if api in ("messages", "messages_agent") else "")
            messages = messages + [{"role": "assistant", "content": said},
                                   {"role": "user", "content": f"and turn {t + 1}?"}]
        return out

    started = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        results = [r for conv in pool.map(conversation, range(conversations)) for r in conv]
    return results, time.monotonic() - started


def report(name, results, wall, faults):
    by = {}
    for verdict, stream, _, _, _ in results:
        by.setdefault(verdict, [0, 0])[int(stream)] += 1
    lat = sorted(r[2] for r in results)
    responses = [r for r in results if r[4] in ("responses", "responses_agent")]
    anthropic = [r for r in results if r[4] in ("messages", "messages_agent")]
    agents = ("agent", "responses_agent", "messages_agent")
    line = {"scenario": name, "requests": len(results),
            "streaming": sum(1 for r in results if r[1]), "faults_injected": faults,
            **{k: by.get(k, [0, 0])[0] + by.get(k, [0, 0])[1]
               for k in ("ok", "flagged", "failed", "silent_bad", "hung")},
            "failed_streaming": by.get("failed", [0, 0])[1],
            "flagged_streaming": by.get("flagged", [0, 0])[1],
            "responses_api": len(responses),
            "responses_streaming": sum(1 for r in responses if r[1]),
            "responses_ok": sum(1 for r in responses if r[0] == "ok"),
            "messages_api": len(anthropic),
            "messages_streaming": sum(1 for r in anthropic if r[1]),
            "messages_ok": sum(1 for r in anthropic if r[0] == "ok"),
            "agent_requests": sum(1 for r in results if r[4] in agents),
            "agent_ok": sum(1 for r in results if r[4] in agents and r[0] == "ok"),
            "p50_ms": round(statistics.median(lat) * 1000, 1),
            "p99_ms": round(lat[int(len(lat) * 0.99) - 1] * 1000, 1),
            "wall_s": round(wall, 1)}
    print(json.dumps(line), flush=True)
    bad = [r for r in results if r[0] != "ok"]
    for verdict, stream, _, detail, api in bad[:5]:
        print(f"  e.g. {verdict} ({api}, {'stream' if stream else 'plain'}): {detail!r}", flush=True)
    return line


def kill9(binary, faulty, healthy, tmp, seconds, threads, timeout):
    """Load, then SIGKILL: (report line). See the module docs."""
    trace = pathlib.Path(tmp) / f"kill9-{uuid.uuid4()}.db"
    gw_p, url = gateway(binary, faulty, healthy, tmp, trace=trace)
    stop, killed = threading.Event(), threading.Event()
    lock = threading.Lock()
    delivered, verdicts = [], {}

    def worker(w):
        c = Client(url, timeout)
        i = 0
        while not stop.is_set():
            stream = (w + i) % 2 == 1
            i += 1
            verdict, _, _, _ = c.ask([{"role": "user", "content": f"kill9 {w} {i} {uuid.uuid4()}"}],
                                     stream)
            after = killed.is_set() and verdict in ("failed", "hung")
            with lock:
                key = "cut_by_kill" if after else verdict
                verdicts[key] = verdicts.get(key, 0) + 1
                if verdict == "ok":
                    delivered.append((c.last_run, time.monotonic()))
            if after:
                return

    ts = [threading.Thread(target=worker, args=(w,)) for w in range(threads)]
    for t in ts:
        t.start()
    time.sleep(seconds)
    killed.set()
    kill_t = time.monotonic()
    gw_p.send_signal(signal.SIGKILL)
    gw_p.wait()
    stop.set()
    for t in ts:
        t.join()
    con = sqlite3.connect(trace)
    logged = {r for (r,) in con.execute(
        "SELECT r.run FROM events e JOIN runs r ON r.id = e.run_id WHERE e.kind = 'response'")}
    con.close()
    lost = [kill_t - t for r, t in delivered if r not in logged]
    missing = len(lost)
    # The trace file must survive the kill: a new gateway opens it and serves.
    gw2_p, url2 = gateway(binary, faulty, healthy, tmp, trace=trace)
    try:
        verdict, _, _, detail = Client(url2, timeout).ask(
            [{"role": "user", "content": f"after the kill {uuid.uuid4()}"}], False)
    finally:
        gw2_p.terminate()
        gw2_p.wait(timeout=30)
    line = {"scenario": "kill9", "seconds_before_kill": seconds, "delivered_whole": len(delivered),
            "without_response_event": missing,
            "loss_pct": round(100 * missing / max(len(delivered), 1), 2),
            # How long before the kill the oldest answer without its event was delivered: the
            # loss window, which (unlike the share) does not depend on the request rate.
            "loss_window_ms": round(1000 * max(lost, default=0.0), 1),
            "silent_bad": verdicts.get("silent_bad", 0),
            "failed_before_kill": verdicts.get("failed", 0) + verdicts.get("hung", 0)
            + verdicts.get("flagged", 0),
            "cut_by_kill": verdicts.get("cut_by_kill", 0),
            "restart_ok": verdict == "ok"}
    print(json.dumps(line), flush=True)
    if verdict != "ok":
        print(f"  restart: {verdict} {detail!r}", flush=True)
    return line


def slowloris(binary, faulty, healthy, tmp, attackers, seconds, threads, nofile, timeout,
              drain_ms=2000, max_connections=None, idle=False):
    """Slow heads under a low fd limit while real clients are served; then SIGTERM. With
    `idle`, the attackers send one whole request each and then sit on their kept-alive
    connections instead (reconnecting when closed)."""
    cap = max_connections or nofile // 2
    gw_p, url = gateway(binary, faulty, healthy, tmp, nofile=nofile,
                        server=f"max_connections = {cap}\nheader_read_timeout_ms = 2000\n"
                               f"drain_timeout_ms = {drain_ms}", )
    host, port = url.split("//", 1)[1].split(":")
    stop = threading.Event()
    attack = {"opened": 0, "cut": 0}

    def attacker():
        socks = []
        while not stop.is_set():
            while len(socks) < attackers and not stop.is_set():
                try:
                    s = socket.create_connection((host, int(port)), timeout=1)
                    if idle:
                        s.sendall(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n")
                        s.recv(4096)
                        s.setblocking(False)
                    else:
                        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n")
                    socks.append(s)
                    attack["opened"] += 1
                except OSError:
                    break
            for s in list(socks):
                try:
                    if idle:
                        try:
                            if s.recv(4096) == b"":
                                raise ConnectionResetError
                        except BlockingIOError:
                            pass  # still open, still idle
                    else:
                        s.sendall(b"x-dribble: 1\r\n")
                except OSError:
                    attack["cut"] += 1
                    s.close()
                    socks.remove(s)
            stop.wait(0.25)
        for s in socks:
            s.close()

    at = threading.Thread(target=attacker)
    at.start()
    time.sleep(1.0)  # the attack is on before the clients come
    lock = threading.Lock()
    tally = {"ok": 0, "shed_503": 0, "shed_reset": 0, "failed": 0, "silent_bad": 0, "hung": 0, "flagged": 0}
    lat, examples = [], []
    deadline = time.monotonic() + seconds

    def client(w):
        c = Client(url, timeout)
        i = 0
        while time.monotonic() < deadline:
            i += 1
            stream = (w + i) % 2 == 1
            msgs = [{"role": "user", "content": f"slow {w} {i} {uuid.uuid4()}"}]
            started = time.monotonic()
            for attempt in range(6):
                verdict, _, _, detail = c.ask(msgs, stream)
                # Shed at the connection cap: a 503, or (the gateway closes a shed connection at
                # once) a reset before the request went out. Retried on a new connection after
                # 0.2 s, as the SDKs retry both (5 retries: the SDKs' default is 2, with longer
                # backoff).
                shed = "HTTP 503" in str(detail) or (
                    verdict == "failed" and any(w in str(detail) for w in
                                                ("BrokenPipe", "ConnectionReset", "RemoteDisconnected")))
                if shed and attempt < 5:
                    with lock:
                        tally["shed_503" if "503" in str(detail) else "shed_reset"] += 1
                    time.sleep(0.2)
                    continue
                break
            with lock:
                tally[verdict] = tally.get(verdict, 0) + 1
                lat.append(time.monotonic() - started)
                if verdict != "ok" and len(examples) < 5:
                    examples.append((verdict, detail))

    ts = [threading.Thread(target=client, args=(w,)) for w in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    # SIGTERM while the slow connections are still open.
    t0 = time.monotonic()
    gw_p.send_signal(signal.SIGTERM)
    try:
        gw_p.wait(timeout=drain_ms / 1000 + 20)
        exit_s = time.monotonic() - t0
    except subprocess.TimeoutExpired:
        exit_s = None
        gw_p.kill()
        gw_p.wait()
    stop.set()
    at.join()
    lat.sort()
    line = {"scenario": "idlers" if idle else "slowloris", "nofile": nofile, "max_connections": cap,
            "slow_connections": attackers, "slow_heads_opened": attack["opened"],
            "slow_heads_cut": attack["cut"], "requests": sum(tally[k] for k in tally if not k.startswith("shed")),
            **tally,
            "p50_ms": round(statistics.median(lat) * 1000, 1) if lat else None,
            "p99_ms": round(lat[max(int(len(lat) * 0.99) - 1, 0)] * 1000, 1) if lat else None,
            "sigterm_exit_s": None if exit_s is None else round(exit_s, 2),
            "drain_deadline_s": drain_ms / 1000}
    print(json.dumps(line), flush=True)
    for verdict, detail in examples:
        print(f"  e.g. {verdict}: {detail!r}", flush=True)
    return line


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", default=str(ROOT / "target" / "release" / "selfheal"))
    ap.add_argument("--requests", type=int, default=10_000)
    ap.add_argument("--outage-requests", type=int, default=2_000)
    ap.add_argument("--turns", type=int, default=5, help="turns per conversation in the outage")
    ap.add_argument("--long-requests", type=int, default=1_500)
    ap.add_argument("--long-turns", type=int, default=30, help="turns per conversation in long")
    ap.add_argument("--rate", type=float, default=0.2)
    ap.add_argument("--seed", type=int, default=13)
    ap.add_argument("--threads", type=int, default=16)
    ap.add_argument("--timeout", type=float, default=30.0)
    ap.add_argument("--replica-requests", type=int, default=2_000)
    ap.add_argument("--replica-turns", type=int, default=3, help="turns per conversation")
    ap.add_argument("--only", default="faults,outage,long,kill9,slowloris,idlers",
                    help="comma-separated scenarios to run")
    ap.add_argument("--kill-after", type=float, default=5.0, help="seconds of load before SIGKILL")
    ap.add_argument("--slow-connections", type=int, default=1000)
    ap.add_argument("--slow-seconds", type=float, default=10.0)
    ap.add_argument("--nofile", type=int, default=256, help="the gateway's `ulimit -n`")
    args = ap.parse_args()
    only = set(args.only.split(","))

    procs = []
    bad_extra = []
    try:
        # The upstreams' stderr is dropped: a stalled answer the gateway gave up on ends in a
        # broken pipe there, by design.
        faulty_p, faulty = start([sys.executable, str(UPSTREAM)], quiet=True)
        healthy_p, healthy = start([sys.executable, str(UPSTREAM)], quiet=True)
        procs += [faulty_p, healthy_p]
        post(healthy, "/_script", [])
        post(healthy, "/_chaos", {"rate": 0, "seed": 0, "kinds": []})  # healthy: the chaos answers
        lines = []
        with tempfile.TemporaryDirectory() as tmp:
            for name, count, turns, rate, kinds in (
                ("faults", args.requests, 1, args.rate, FAULTS),
                ("outage", args.outage_requests, args.turns, 1.0,
                 [{"kind": "status", "status": 503, "message": "provider down"}]),
                # A call cut by `length` is the model's, not the upstream's: re-asked within
                # the run's budget, `partial` once it is spent (tested in "faults").
                ("long", args.long_requests, args.long_turns, args.rate,
                 [k for k in FAULTS if k["kind"] != "tool_length"]),
            ):
                if name not in only:
                    continue
                post(faulty, "/_chaos", {"rate": rate, "seed": args.seed, "kinds": kinds})
                gw_p, gw = gateway(args.bin, faulty, healthy, tmp)
                procs.append(gw_p)
                results, wall = run(name, gw, count, turns, args.threads, args.timeout)
                faults = json.loads(urllib.request.urlopen(faulty + "/_chaos", timeout=10).read())["faults"]
                lines.append(report(name, results, wall, faults))
                gw_p.terminate()
                gw_p.wait(timeout=30)
            post(faulty, "/_chaos", {"rate": args.rate, "seed": args.seed, "kinds": FAULTS})
            if "replicas" in only:
                lines.append(replicas(args.bin, faulty, healthy, tmp, args.replica_requests,
                                      args.replica_turns, args.threads, args.timeout))
                post(faulty, "/_chaos", {"rate": args.rate, "seed": args.seed, "kinds": FAULTS})
            if "kill9" in only:
                k = kill9(args.bin, faulty, healthy, tmp, args.kill_after, args.threads, args.timeout)
                bad_extra.append(k["silent_bad"] + k["failed_before_kill"] + (not k["restart_ok"]))
            if "slowloris" in only:
                sl = slowloris(args.bin, faulty, healthy, tmp, args.slow_connections,
                               args.slow_seconds, args.threads, args.nofile, args.timeout)
                stuck = sl["sigterm_exit_s"] is None or sl["sigterm_exit_s"] > sl["drain_deadline_s"] + 1
                bad_extra.append(sl["failed"] + sl["silent_bad"] + sl["hung"] + stuck + (sl["ok"] == 0))
            if "idlers" in only:
                sl = slowloris(args.bin, faulty, healthy, tmp, args.slow_connections,
                               args.slow_seconds, args.threads, args.nofile, args.timeout, idle=True)
                stuck = sl["sigterm_exit_s"] is None or sl["sigterm_exit_s"] > sl["drain_deadline_s"] + 1
                bad_extra.append(sl["failed"] + sl["silent_bad"] + sl["hung"] + stuck + (sl["ok"] == 0))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    bad = sum(l["failed"] + l["silent_bad"] + l["hung"] + l["flagged"] for l in lines) + sum(bad_extra)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
