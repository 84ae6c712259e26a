"""A scripted, fault-injecting OpenAI-compatible upstream for the gateway's end-to-end tests.

Each chat request pops the next step of the script (POST /_script with a JSON list); when the
script is empty the server plays a simple "stuck agent" model (see `auto_reply`). Every request it
receives is logged (GET /_log) so tests can check what the gateway forwarded.

Steps: {"kind": "ok", "content": str} | {"kind": "tool", "name": str, "arguments": str}
| {"kind": "status", "status": int, "retry_after": str?, "message": str?}
| {"kind": "hang", "seconds": float} | {"kind": "empty"} | {"kind": "cut"}
| {"kind": "json", "content": str?} (JSON even when a stream was asked for; without "content",
  the answer the model would give)
| {"kind": "empty_stream"} (200 text/event-stream with no event)
| {"kind": "role_then_cut"} (only the role delta, then the connection closes)
| {"kind": "stream_error", "message": str} (some text, then an SSE error event)
| {"kind": "reset"} (the connection is reset before any byte of an answer)
| {"kind": "bad_json"} (200 application/json whose body is cut inside its JSON)
| {"kind": "error_body"} (200 application/json whose body is an OpenAI error object)
| {"kind": "stall_after_role", "seconds": float} (a stream: the role delta, then nothing for
  `seconds`, then the connection closes; without `stream`: as "hang")
| {"kind": "bad_chunk"} (a stream: the role delta, then an event that is not JSON, then [DONE];
  without `stream`: as "bad_json")
| {"kind": "error_first"} (a stream whose first event is an error event; without `stream`: as
  "error_body")
| {"kind": "done_no_finish"} (a stream: the role delta, then [DONE] with no finish_reason;
  without `stream`: as "empty")
| {"kind": "raw", "body": str, "content_type": str?} (200 with exactly this body; on
  `/v1/responses` too)
| {"kind": "tool_cut"} (when the model would call a tool: a stream cut inside the call's
  arguments, or without `stream` "bad_json"; otherwise as "role_then_cut" or "empty")
| {"kind": "tool_length"} (when the model would call a tool: the call with half its arguments
  and finish_reason "length", streaming or not; otherwise as "empty_stream" or "empty")
| {"kind": "degenerate", "content": str?, "padding": str?, "count": int?} (a runaway model: the
  content's words, then `padding` (default a newline) as one delta after another, `count` times
  (default 100,000, about a millisecond apart) or until the connection closes, then
  finish_reason "length"; without `stream`: the whole padded answer, "length". GET /_padding
  says how many padding deltas the latest such stream wrote and whether the client (the
  gateway) closed it first. On `/v1/responses` too, as Responses events.)
The credential headers of every request, and its W3C `traceparent`, are logged too (GET
/_headers). `/v1/responses` takes
the "status", "tool" (answered as a `function_call` item), "ok", "json", "empty", "hang",
"reset", "bad_json", "error_body" steps and, for `stream: true` (answered as Responses events), "empty_stream", "role_then_cut" (only the
preamble: created, in_progress, an empty message item), "cut", "stream_error" (some text, then an
`error` event), "failed" (a `response.failed` before any content) and "incomplete" (a
`function_call` cut inside its arguments by max_output_tokens: `response.incomplete`),
"stall_after_role", "bad_chunk", "error_first" and "done_no_finish" (as chat's, after the
preamble: created, in_progress); a step's
"id" names its response (default "resp_stub"). The "stuck" step plays `auto_reply`'s model on
`/v1/responses` (from the last result in `input` and the tools offered), each answer and call
with an id of its own, as a client that continues with `previous_response_id` needs. Without a
step it answers "hi from responses" (under /_chaos: "The answer is 42.", or a random fault).

Chaos: POST /_chaos {"rate": float, "seed": int, "kinds": [step, ...]} makes each request
without a scripted step a random fault from `kinds` with probability `rate` (seeded);
GET /_chaos says how many faults were injected.
"""

import itertools
import json
import random
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

# Numbers for the ids the stub makes up (calls, the stuck model's responses): unique however
# fast requests come, where a clock's microseconds are not.
IDS = itertools.count(1)


class State:
    def __init__(self):
        self.lock = threading.Lock()
        self.script = []
        self.log = []
        self.headers = []
        self.chaos = None  # (random.Random, rate, kinds) when faults are injected at random
        self.faults = 0
        self.padding = {"written": 0, "closed": False}  # the latest "degenerate" stream


STATE = State()


def completion(message, finish):
    return {
        "id": "chatcmpl-stub",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": "stub",
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
    }


def tool_message(name, arguments, call_id=None):
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": call_id or f"call_{next(IDS)}",
                "type": "function",
                "function": {"name": name, "arguments": arguments},
            }
        ],
    }




def stuck_responses_step(body):
    """`auto_reply`'s model as a `/v1/responses` step: it reads the last result of `input`."""
    tools = [t.get("name") for t in body.get("tools") or []]
    items = body.get("input") if isinstance(body.get("input"), list) else []
    last = items[-1] if items and isinstance(items[-1], dict) else {}
    result = str(last.get("output")) if last.get("type") == "function_call_output" else None
    n = next(IDS)
    step = {"id": f"resp_stuck_{n}", "call_id": f"call_stuck_{n}"}
    if result is not None and "ok:" in result:
        return dict(step, kind="ok", content="The answer is 42.")
    if "search" in tools:
        return dict(step, kind="tool", name="search", arguments=json.dumps({"query": "answer"}))
    if "lookup" in tools:
        return dict(step, kind="tool", name="lookup", arguments=json.dumps({"key": "answer"}))
    return dict(step, kind="ok", content="The answer is 42.")


def auto_reply(req):
    """A model that keeps calling `search` while it is offered, then uses `lookup`, then answers."""
    tools = [t["function"]["name"] for t in req.get("tools") or []]
    last = req["messages"][-1]
    if last.get("role") == "tool" and "lookup" not in tools and "search" not in tools:
        return {"role": "assistant", "content": "done"}
    if last.get("role") == "tool" and "ok:" in str(last.get("content")):
        return {"role": "assistant", "content": "The answer is 42."}
    if "search" in tools:
        return tool_message("search", json.dumps({"query": "answer"}))
    if "lookup" in tools:
        return tool_message("lookup", json.dumps({"key": "answer"}))
    return {"role": "assistant", "content": "The answer is 42."}


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True

    def log_message(self, *args):
        pass

    def send_json(self, status, body, headers=None):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)

    def reset(self):
        """Resets the connection (RST): no byte of an answer goes out."""
        import socket
        import struct
        self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.close_connection = True

    def bad_json(self):
        data = b'{"id": "chatcmpl-stub", "object": "chat.completion", "choices": [{"index": 0, "mess'
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def raw(self, step):
        """200 with exactly the step's body."""
        data = step["body"].encode()
        self.send_response(200)
        self.send_header("content-type", step.get("content_type", "application/json"))
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def common_fault(self, kind, stream):
        """Answers the faults chat and Responses share; False when `kind` is not one of them."""
        if kind == "reset":
            self.reset()
        elif kind == "bad_json" or (kind == "bad_chunk" and not stream):
            self.bad_json()
        elif kind == "error_body" or (kind == "error_first" and not stream):
            self.send_json(200, {"error": {"message": "The server had an error while processing your request.",
                                           "type": "server_error", "param": None, "code": None}})
        elif kind == "done_no_finish" and not stream:
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", "0")
            self.end_headers()
        else:
            return False
        return True

    def do_GET(self):
        if self.path == "/_log":
            with STATE.lock:
                self.send_json(200, STATE.log)
        elif self.path == "/_chaos":
            with STATE.lock:
                self.send_json(200, {"faults": STATE.faults})
        elif self.path == "/_padding":
            with STATE.lock:
                self.send_json(200, STATE.padding)
        elif self.path == "/_headers":
            with STATE.lock:
                self.send_json(200, STATE.headers)
        elif self.path == "/v1/models":
            self.send_json(200, {"object": "list", "data": [{"id": "stub", "object": "model"}]})
        else:
            self.send_json(404, {"error": {"message": "no"}})

    def do_POST(self):
        length = int(self.headers.get("content-length", 0))
        body = json.loads(self.rfile.read(length) or b"null")
        if self.path == "/_script":
            with STATE.lock:
                STATE.script = list(body)
                STATE.log = []
                STATE.headers = []
            self.send_json(200, {"ok": True})
            return
        if self.path == "/_chaos":
            with STATE.lock:
                STATE.chaos = (random.Random(body["seed"]), body["rate"], body["kinds"])
                STATE.faults = 0
                STATE.log = []
            self.send_json(200, {"ok": True})
            return
        if self.path == "/v1/responses":
            with STATE.lock:
                STATE.log.append(body)
                STATE.headers.append({"authorization": self.headers.get("authorization")})
                step = STATE.script.pop(0) if STATE.script else {"kind": "auto"}
                if step["kind"] == "auto":
                    step = {"kind": "ok"}
                    if STATE.chaos:
                        # Under chaos the answer is the chat auto model's (after a stall too):
                        # with tools offered, the stuck model's (a call, then the answer).
                        model = stuck_responses_step(body) if body.get("tools") else {}
                        rng, rate, kinds = STATE.chaos
                        if rng.random() < rate:
                            step = dict(rng.choice(kinds))
                            STATE.faults += 1
                        step = {**model, **step} if step["kind"] != "ok" else {**step, **model}
                        step.setdefault("content", "The answer is 42.")
            self.answer_responses(body, step)
            return
        if self.path == "/v1/embeddings":
            with STATE.lock:
                STATE.log.append(body)
                STATE.headers.append({"authorization": self.headers.get("authorization")})
            self.send_json(200, {"object": "list", "model": body.get("model"),
                                 "data": [{"object": "embedding", "index": 0, "embedding": [0.25, -0.5]}],
                                 "usage": {"prompt_tokens": 1, "total_tokens": 1}})
            return
        with STATE.lock:
            STATE.log.append(body)
            STATE.headers.append({k.lower(): v for k, v in self.headers.items()
                                  if k.lower() in ("authorization", "api-key", "openai-organization",
                                                   "openai-project", "x-selfheal-key",
                                                   "traceparent")})
            step = STATE.script.pop(0) if STATE.script else {"kind": "auto"}
            if step["kind"] == "auto" and STATE.chaos:
                rng, rate, kinds = STATE.chaos
                if rng.random() < rate:
                    step = dict(rng.choice(kinds))
                    STATE.faults += 1
        kind = step["kind"]
        if kind == "status":
            headers = {"retry-after": step["retry_after"]} if "retry_after" in step else {}
            self.send_json(step["status"], {"error": {"message": step.get("message", "injected")}}, headers)
            return
        if kind == "hang" or (kind == "stall_after_role" and not body.get("stream")):
            time.sleep(step["seconds"])
            self.send_json(200, completion({"role": "assistant", "content": "late"}, "stop"))
            return
        if self.common_fault(kind, body.get("stream")):
            return
        if kind == "raw":
            self.raw(step)
            return
        if kind in ("tool_cut", "tool_length"):
            message = auto_reply(body)
            stream = body.get("stream")
            if not message.get("tool_calls"):
                kind = "role_then_cut" if kind == "tool_cut" and stream else \
                    "empty_stream" if stream else "empty"
            elif kind == "tool_cut" and not stream:
                self.bad_json()
                return
            else:
                call = message["tool_calls"][0]
                args = call["function"]["arguments"]
                call["function"]["arguments"] = args[:len(args) // 2]
                if not stream:
                    self.send_json(200, completion(message, "length"))
                    return
                self.stream(message, "length", cut=False, tool_cut=(kind == "tool_cut"))
                return
        if kind in ("stall_after_role", "bad_chunk", "error_first", "done_no_finish"):
            self.send_response(200)
            self.send_header("content-type", "text/event-stream")
            self.send_header("connection", "close")
            self.end_headers()
            self.close_connection = True
            role = {"id": "chatcmpl-stub", "object": "chat.completion.chunk", "created": 0, "model": "stub",
                    "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]}
            if kind == "error_first":
                err = {"error": {"message": "overloaded", "type": "server_error", "param": None, "code": None}}
                self.wfile.write(f"data: {json.dumps(err)}\n\n".encode())
                self.wfile.flush()
                return
            self.wfile.write(f"data: {json.dumps(role)}\n\n".encode())
            self.wfile.flush()
            if kind == "stall_after_role":
                time.sleep(step["seconds"])
            elif kind == "bad_chunk":
                self.wfile.write(b'data: {"id": "chatcmpl-stub", "choices": [{"delta": {"content": "The\n\n')
                self.wfile.write(b"data: [DONE]\n\n")
            else:
                self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()
            return
        if kind == "empty":
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", "0")
            self.end_headers()
            return
        if kind == "json":
            # The model's own answer (a tool call when it would make one) unless scripted.
            message = {"role": "assistant", "content": step["content"]} if "content" in step \
                else auto_reply(body)
            self.send_json(200, completion(message, "tool_calls" if message.get("tool_calls") else "stop"))
            return
        if kind == "role_then_cut":
            self.send_response(200)
            self.send_header("content-type", "text/event-stream")
            self.send_header("connection", "close")
            self.end_headers()
            c = {"id": "chatcmpl-stub", "object": "chat.completion.chunk", "created": 0, "model": "stub",
                 "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]}
            self.wfile.write(f"data: {json.dumps(c)}\n\n".encode())
            self.wfile.flush()
            self.close_connection = True
            return
        if kind == "empty_stream":
            self.send_response(200)
            self.send_header("content-type", "text/event-stream")
            self.send_header("connection", "close")
            self.end_headers()
            self.close_connection = True
            return
        if kind == "stream_error":
            self.send_response(200)
            self.send_header("content-type", "text/event-stream")
            self.send_header("connection", "close")
            self.end_headers()
            c = {"id": "chatcmpl-stub", "object": "chat.completion.chunk", "created": 0, "model": "stub",
                 "choices": [{"index": 0, "delta": {"role": "assistant", "content": "Partial "}, "finish_reason": None}]}
            self.wfile.write(f"data: {json.dumps(c)}\n\n".encode())
            err = {"error": {"message": step.get("message", "overloaded"), "type": "server_error"}}
            self.wfile.write(f"data: {json.dumps(err)}\n\n".encode())
            self.wfile.flush()
            self.close_connection = True
            return
        if kind == "degenerate":
            self.degenerate(body, step, self.chat_delta)
            return
        if kind == "ok":
            message = {"role": "assistant", "content": step.get("content", "hello")}
        elif kind == "tool":
            message = tool_message(step["name"], step["arguments"])
        else:
            message = auto_reply(body)
        finish = step.get("finish") or ("tool_calls" if message.get("tool_calls") else "stop")
        if body.get("stream"):
            self.stream(message, finish, cut=(kind == "cut"))
        else:
            self.send_json(200, completion(message, finish))

    def degenerate(self, body, step, render):
        """A runaway model (the "degenerate" step): its words, then padding until `count` deltas
        went out or the connection closed. `render` writes the answer in one API's shape:
        `render(None, text)` the whole answer, `render("start", None)`, `render("delta", text)`,
        `render("end", None)` a stream's parts."""
        words = step.get("content", "")
        padding, count = step.get("padding", "\n"), step.get("count", 100_000)
        if not body.get("stream"):
            render(None, words + padding * count)
            return
        with STATE.lock:
            STATE.padding = {"written": 0, "closed": False}
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("connection", "close")
        self.end_headers()
        self.close_connection = True
        try:
            render("start", None)
            if words:
                render("delta", words)
            for _ in range(count):
                render("delta", padding)
                with STATE.lock:
                    STATE.padding["written"] += 1
                time.sleep(0.001)
            render("end", None)
        except OSError:  # the gateway cut the answer: its connection closed
            with STATE.lock:
                STATE.padding["closed"] = True

    def chat_delta(self, part, text):
        """One part of a chat answer for `degenerate`."""
        if part is None:
            self.send_json(200, completion({"role": "assistant", "content": text}, "length"))
            return
        delta, finish = {}, None
        if part == "start":
            delta = {"role": "assistant", "content": ""}
        elif part == "delta":
            delta = {"content": text}
        else:
            finish = "length"
        c = {"id": "chatcmpl-stub", "object": "chat.completion.chunk", "created": 0, "model": "stub",
             "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
        self.wfile.write(f"data: {json.dumps(c)}\n\n".encode())
        if part == "end":
            self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()

    def responses_delta(self, body, step):
        """A Responses answer's parts for `degenerate`: `render` as `degenerate` calls it."""
        rid = step.get("id", "resp_stub")
        said = []
        seq = [0]

        def whole(status, text):
            return {"id": rid, "object": "response", "created_at": 0, "model": body.get("model"),
                    "status": status,
                    "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
                    "output": [] if text is None else [
                        {"type": "message", "id": "msg_stub", "role": "assistant", "status": status,
                         "content": [{"type": "output_text", "text": text, "annotations": []}]}]}

        def event(e):
            e["sequence_number"] = seq[0]
            seq[0] += 1
            self.wfile.write(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n".encode())
            self.wfile.flush()

        def render(part, text):
            if part is None:
                self.send_json(200, whole("incomplete", text))
            elif part == "start":
                event({"type": "response.created", "response": whole("in_progress", None)})
                event({"type": "response.output_item.added", "output_index": 0, "item": {
                    "type": "message", "id": "msg_stub", "role": "assistant", "status": "in_progress",
                    "content": []}})
                event({"type": "response.content_part.added", "item_id": "msg_stub", "output_index": 0,
                       "content_index": 0, "part": {"type": "output_text", "text": "", "annotations": []}})
            elif part == "delta":
                said.append(text)
                event({"type": "response.output_text.delta", "item_id": "msg_stub", "output_index": 0,
                       "content_index": 0, "delta": text, "logprobs": []})
            else:
                event({"type": "response.incomplete", "response": whole("incomplete", "".join(said))})
        return render

    def answer_responses(self, body, step):
        """One `/v1/responses` answer: JSON, or (with `stream: true`) a Responses event stream."""
        if step["kind"] == "stuck":
            step = stuck_responses_step(body)
        kind = step["kind"]
        if kind == "degenerate":
            self.degenerate(body, step, self.responses_delta(body, step))
            return
        if kind == "status":
            self.send_json(step["status"], {"error": {"message": step.get("message", "boom")}})
            return
        if kind == "hang" or (kind == "stall_after_role" and not body.get("stream")):
            time.sleep(step["seconds"])
            kind = "tool" if "name" in step else "ok"
        if self.common_fault(kind, body.get("stream")):
            return
        if kind == "raw":
            self.raw(step)
            return
        if kind in ("empty_stream", "role_then_cut") and not body.get("stream"):
            kind = "empty"  # the stream faults, asked without streaming: an empty 200
        if kind in ("tool_cut", "tool_length") and "name" not in step:  # no call to cut
            kind = "role_then_cut" if body.get("stream") else "empty"
        elif kind == "tool_length":  # the call cut by max_output_tokens inside its arguments
            kind = "incomplete"
            step = dict(step, arguments=step["arguments"][:len(step["arguments"]) // 2])
        elif kind == "tool_cut" and not body.get("stream"):
            self.bad_json()
            return
        if kind == "empty":
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", "0")
            self.end_headers()
            return
        status, details = "completed", None
        text = step.get("content", "hi from responses")
        if kind in ("tool", "incomplete", "tool_cut") or (kind == "json" and "name" in step):
            item = {"type": "function_call", "id": "fc_stub", "call_id": step.get("call_id", "call_stub"),
                    "name": step["name"], "arguments": step["arguments"], "status": "completed"}
            if kind == "incomplete":
                item["status"] = "incomplete"
                status, details = "incomplete", {"reason": "max_output_tokens"}
        else:
            item = {"type": "message", "id": "msg_stub", "role": "assistant", "status": "completed",
                    "content": [{"type": "output_text", "text": text, "annotations": []}]}
        whole = {"id": step.get("id", "resp_stub"), "object": "response", "created_at": 0, "model": body.get("model"),
                 "status": status, "incomplete_details": details, "output": [item]}
        if not body.get("stream") or kind == "json":
            self.send_json(200, whole)
            return
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("connection", "close")
        self.end_headers()
        self.close_connection = True
        seq = [0]

        def event(e):
            e["sequence_number"] = seq[0]
            seq[0] += 1
            self.wfile.write(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n".encode())
            self.wfile.flush()

        if kind == "empty_stream":
            return
        if kind == "error_first":
            event({"type": "error", "code": "server_error", "message": "overloaded", "param": None})
            return
        head = dict(whole, status="in_progress", output=[], incomplete_details=None)
        event({"type": "response.created", "response": head})
        event({"type": "response.in_progress", "response": head})
        if kind == "stall_after_role":
            time.sleep(step["seconds"])
            return
        if kind == "bad_chunk":
            self.wfile.write(b'event: response.output_text.delta\ndata: {"type": "response.output_te\n\n')
            self.wfile.flush()
            return
        if kind == "done_no_finish":
            return
        if kind == "failed":
            event({"type": "response.failed", "response": dict(head, status="failed", error={
                "code": "server_error", "message": step.get("message", "the model failed")})})
            return
        if item["type"] == "function_call":
            event({"type": "response.output_item.added", "output_index": 0,
                   "item": dict(item, arguments="", status="in_progress")})
            args = item["arguments"]
            for part in (args[:len(args) // 2], args[len(args) // 2:]):
                event({"type": "response.function_call_arguments.delta", "item_id": "fc_stub",
                       "output_index": 0, "delta": part})
                if kind == "tool_cut":  # the connection closes inside the arguments
                    return
            if kind == "incomplete":  # cut by max_output_tokens inside the arguments
                event({"type": "response.incomplete", "response": whole})
                return
            event({"type": "response.function_call_arguments.done", "item_id": "fc_stub",
                   "output_index": 0, "arguments": args})
            event({"type": "response.output_item.done", "output_index": 0, "item": item})
            event({"type": "response.completed", "response": whole})
            return
        event({"type": "response.output_item.added", "output_index": 0,
               "item": dict(item, content=[], status="in_progress")})
        part = {"type": "output_text", "text": "", "annotations": []}
        event({"type": "response.content_part.added", "item_id": "msg_stub", "output_index": 0,
               "content_index": 0, "part": part})
        if kind == "role_then_cut":  # only the preamble, then the connection closes
            return
        words = ["This answer is cut ", "in the mid"] if kind == "cut" else [
            w + " " for w in text.split(" ")[:-1]] + [text.split(" ")[-1]]
        if kind == "stream_error":
            words = ["Partial "]
        for w in words:
            event({"type": "response.output_text.delta", "item_id": "msg_stub", "output_index": 0,
                   "content_index": 0, "delta": w, "logprobs": []})
        if kind == "cut":
            return
        if kind == "stream_error":
            event({"type": "error", "code": "server_error", "message": step.get("message", "overloaded"),
                   "param": None})
            return
        event({"type": "response.output_text.done", "item_id": "msg_stub", "output_index": 0,
               "content_index": 0, "text": text, "logprobs": []})
        event({"type": "response.content_part.done", "item_id": "msg_stub", "output_index": 0,
               "content_index": 0, "part": dict(part, text=text)})
        event({"type": "response.output_item.done", "output_index": 0, "item": item})
        event({"type": "response.completed", "response": whole})

    def stream(self, message, finish, cut, tool_cut=False):
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("connection", "close")
        self.end_headers()

        def chunk(delta, fin=None):
            c = {"id": "chatcmpl-stub", "object": "chat.completion.chunk", "created": 0,
                 "model": "stub", "choices": [{"index": 0, "delta": delta, "finish_reason": fin}]}
            self.wfile.write(f"data: {json.dumps(c)}\n\n".encode())
            self.wfile.flush()

        chunk({"role": "assistant", "content": ""})
        if cut:
            chunk({"content": "This answer is cut "})
            chunk({"content": "in the mid"})
            self.close_connection = True
            return
        if message.get("tool_calls"):
            call = message["tool_calls"][0]
            args = call["function"]["arguments"]
            chunk({"tool_calls": [{"index": 0, "id": call["id"], "type": "function",
                                   "function": {"name": call["function"]["name"], "arguments": ""}}]})
            half = len(args) // 2
            for part in (args[:half], args[half:]):
                chunk({"tool_calls": [{"index": 0, "function": {"arguments": part}}]})
                if tool_cut:  # the connection closes inside the arguments
                    self.close_connection = True
                    return
        else:
            for word in message["content"].split(" "):
                chunk({"content": word + " "})
        chunk({}, finish)
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()
        self.close_connection = True


def main():
    server = ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1]) if len(sys.argv) > 1 else 0), Handler)
    server.daemon_threads = True
    print(f"listening on http://127.0.0.1:{server.server_address[1]}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
