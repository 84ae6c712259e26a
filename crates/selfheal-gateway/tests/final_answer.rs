//! Issue 11, one control plane: the core's three decisions at a final answer (an answer that
//! calls no tools) — `partial` over an open failure, the read before answering, and the
//! policy's `claim_after_recovery` — reach streamed chat completions and the Responses API
//! (streamed or not) as they reach non-streamed chat completions (see `tests/app.rs`). The real
//! server (`serve` on port 0) and a real client, in front of a scripted upstream on 127.0.0.1.

// Test helpers outside `#[test]` functions may panic: a panic is a test failure here.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post as route_post;
use serde_json::{Value, json};
use tokio::net::TcpListener;

use selfheal_gateway::GatewayConfig;

mod common;
use common::{gateway, guidance_seen};

/// One scripted upstream answer: HTTP status, content type, body.
type Step = (u16, &'static str, String);

#[derive(Default)]
struct Script {
    steps: VecDeque<Step>,
    /// Every request: its path and JSON body.
    seen: Vec<(String, Value)>,
}

type Shared = Arc<Mutex<Script>>;

async fn scripted(State(s): State<Shared>, uri: Uri, body: axum::Json<Value>) -> Response {
    let mut s = s.lock().unwrap();
    s.seen.push((uri.path().to_owned(), body.0));
    let (status, ty, body) = s
        .steps
        .pop_front()
        .unwrap_or((500, "application/json", "{}".into()));
    let mut r = (StatusCode::from_u16(status).unwrap(), body).into_response();
    r.headers_mut()
        .insert(header::CONTENT_TYPE, ty.parse().unwrap());
    r
}

/// A scripted upstream serving chat completions and responses on 127.0.0.1, port 0.
async fn upstream(steps: Vec<Step>) -> (String, Shared) {
    let shared: Shared = Arc::new(Mutex::new(Script {
        steps: steps.into(),
        seen: Vec::new(),
    }));
    let app = Router::new()
        .route("/v1/chat/completions", route_post(scripted))
        .route("/v1/responses", route_post(scripted))
        .with_state(shared.clone());
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (format!("http://{addr}/v1"), shared)
}

/// A config for `url` with `fx` marked `reread` when `reread`, and `policy` (TOML) when given.
fn config(url: String, reread: bool, policy: Option<&str>) -> GatewayConfig {
    let mut c = GatewayConfig::for_upstream(url);
    if reread {
        c.tools
            .insert("fx".into(), toml::from_str("reread = true").unwrap());
    }
    if let Some(p) = policy {
        c.policy = selfheal_core::Policy::from_toml_str(p).unwrap();
    }
    c
}

/// The `x-selfheal-status` and `x-selfheal-actions` headers of an answer.
#[derive(Debug)]
struct Head {
    status: String,
    actions: String,
}

/// POSTs `body` to `path` of the gateway: the HTTP status, the `x-selfheal-*` headers and the
/// body as text.
async fn post(base: &str, path: &str, body: Value) -> (u16, Head, String) {
    let resp = reqwest::Client::new()
        .post(format!("{base}/{path}"))
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    let header = |name: &str| {
        resp.headers()
            .get(name)
            .map(|h| h.to_str().unwrap().to_owned())
            .unwrap_or_default()
    };
    let head = Head {
        status: header("x-selfheal-status"),
        actions: header("x-selfheal-actions"),
    };
    (status, head, resp.text().await.unwrap())
}

/// The JSON `data:` payloads of an SSE body (`[DONE]` left out).
fn events(body: &str) -> Vec<Value> {
    body.split("\n\n")
        .filter_map(|e| e.lines().find_map(|l| l.strip_prefix("data: ")))
        .filter_map(|d| serde_json::from_str(d).ok())
        .collect()
}

// ---- chat completions -------------------------------------------------------------------

fn sse(chunks: &[Value]) -> Step {
    let mut body: String = chunks.iter().map(|c| format!("data: {c}\n\n")).collect();
    body.push_str("data: [DONE]\n\n");
    (200, "text/event-stream", body)
}

fn delta(delta: Value, finish: Value) -> Value {
    json!({"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "m",
           "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
}

/// A streamed final answer: the role, `text` in two deltas, the finish.
fn streamed_text(text: &str) -> Step {
    let (a, b) = text.split_at(text.len() / 2);
    sse(&[
        delta(json!({"role": "assistant"}), Value::Null),
        delta(json!({"content": a}), Value::Null),
        delta(json!({"content": b}), Value::Null),
        delta(json!({}), json!("stop")),
    ])
}

fn json_step(v: Value) -> Step {
    (200, "application/json", v.to_string())
}

fn chat_text(t: &str) -> Step {
    json_step(
        json!({"id": "x", "object": "chat.completion", "created": 0, "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": t},
                     "finish_reason": "stop"}]}),
    )
}

fn chat_call(name: &str, args: &str) -> Step {
    json_step(
        json!({"id": "x", "object": "chat.completion", "created": 0, "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": null,
          "tool_calls": [{"id": "r1", "type": "function",
                          "function": {"name": name, "arguments": args}}]},
                     "finish_reason": "tool_calls"}]}),
    )
}

fn fx_and_search() -> Value {
    json!([
        {"type": "function", "function": {"name": "fx", "parameters": {"type": "object",
            "properties": {"pair": {"type": "string"}}, "required": ["pair"]}}},
        {"type": "function", "function": {"name": "search", "parameters": {"type": "object",
            "properties": {"query": {"type": "string"}}, "required": ["query"]}}}
    ])
}

/// `fx` answered `{"rate": 1.1}`; `search` then failed `failures` times with a 503 and, when
/// `answered`, answered after them.
fn messages(failures: usize, answered: bool) -> Value {
    let mut m = vec![
        json!({"role": "user", "content": "what is the EURUSD rate, and news on it?"}),
        json!({"role": "assistant", "content": null, "tool_calls": [{"id": "c1",
            "type": "function", "function": {"name": "fx", "arguments": "{\"pair\": \"EURUSD\"}"}}]}),
        json!({"role": "tool", "tool_call_id": "c1", "content": "{\"rate\": 1.1}"}),
    ];
    for i in 0..failures + usize::from(answered) {
        let id = format!("s{i}");
        m.push(json!({"role": "assistant", "content": null, "tool_calls": [{"id": id,
            "type": "function", "function": {"name": "search", "arguments": "{\"query\": \"EURUSD\"}"}}]}));
        let result = if i < failures {
            "Error: 503 Service Unavailable"
        } else {
            "{\"hits\": 3}"
        };
        m.push(json!({"role": "tool", "tool_call_id": id, "content": result}));
    }
    json!(m)
}

fn chat_request(failures: usize, answered: bool) -> Value {
    json!({"model": "m", "stream": true, "tools": fx_and_search(),
           "messages": messages(failures, answered)})
}

/// The text a client assembles from a chat stream, and its final chunk's `selfheal` object.
/// The core's judgement of a final answer as the client sees it: the report's status, the head
/// agreeing with it, and (`why`) the words its reason must contain.
fn assert_judged(report: &Value, head: &Head, status: &str, why: Option<&str>) {
    assert_eq!(report["status"], status, "{report}");
    assert_eq!(head.status, status, "the head agrees: {head:?}");
    if let Some(why) = why {
        let reason = report["reason"].as_str().unwrap_or_default();
        assert!(reason.contains(why), "{report}");
    }
}

fn chat_outcome(body: &str) -> (String, Value, Vec<Value>) {
    let events = events(body);
    let text: String = events
        .iter()
        .filter_map(|e| e["choices"][0]["delta"]["content"].as_str())
        .collect();
    let calls: Vec<Value> = events
        .iter()
        .filter_map(|e| e["choices"][0]["delta"]["tool_calls"].as_array())
        .flatten()
        .cloned()
        .collect();
    let report = events
        .iter()
        .rev()
        .find_map(|e| e.get("selfheal"))
        .cloned()
        .unwrap_or(Value::Null);
    (text, report, calls)
}

const READ_FX: &str =
    "Before you answer, read `fx` again: call it with the arguments {\"pair\":\"EURUSD\"}.";

/// A streamed final answer given while a tool's failure is still open ends `partial` in its
/// final chunk, as the non-streamed answer does; one given after the failure was recovered
/// ends `complete`. The text passes through either way.
#[tokio::test]
async fn a_streamed_answer_over_an_open_failure_is_partial() {
    for (answered, status) in [(false, "partial"), (true, "complete")] {
        let (url, _) = upstream(vec![streamed_text("1.1")]).await;
        let gw = gateway(config(url, false, None)).await;
        let (code, head, body) = post(&gw, "chat/completions", chat_request(1, answered)).await;
        assert_eq!(code, 200, "{body}");
        let (text, report, _) = chat_outcome(&body);
        assert_eq!(text, "1.1", "{body}");
        assert_judged(
            &report,
            &head,
            status,
            (status == "partial").then_some("unresolved"),
        );
    }
}

/// Under `claim_after_recovery = false` a streamed final answer of a run that recovered ends
/// `partial` with the policy's reason; a run with no failure ends `complete`.
#[tokio::test]
async fn a_streamed_answer_after_a_recovery_under_no_claim_is_partial() {
    for (failures, status) in [(1, "partial"), (0, "complete")] {
        let (url, _) = upstream(vec![streamed_text("1.1")]).await;
        let gw = gateway(config(url, false, Some("claim_after_recovery = false"))).await;
        let (code, head, body) = post(&gw, "chat/completions", chat_request(failures, true)).await;
        assert_eq!(code, 200, "{body}");
        let (_, report, _) = chat_outcome(&body);
        let why = (failures > 0).then_some("claim_after_recovery");
        assert_judged(&report, &head, status, why);
    }
}

/// The read before answering on a stream: the final answer of a recovered run is held at its
/// first content, the request asked again (without streaming) with the guidance appended, and
/// the client gets only the new answer — here the read — never the held text. So is a final
/// answer the upstream sent as plain JSON to the streaming request.
#[tokio::test]
async fn a_streamed_answer_of_a_recovered_run_is_held_for_the_read() {
    for first in [streamed_text("1.1 it is"), chat_text("1.1 it is")] {
        let (url, shared) = upstream(vec![first, chat_call("fx", "{\"pair\":\"EURUSD\"}")]).await;
        let gw = gateway(config(url, true, None)).await;
        let (code, head, body) = post(&gw, "chat/completions", chat_request(1, true)).await;
        assert_eq!(code, 200, "{body}");
        let (text, report, calls) = chat_outcome(&body);
        assert_eq!(text, "", "the held answer never went out: {body}");
        assert_eq!(head.status, "complete", "{head:?}");
        assert!(head.actions.contains("reread"), "the head agrees: {head:?}");
        assert_eq!(calls.len(), 1, "{body}");
        assert_eq!(calls[0]["function"]["name"], "fx", "{body}");
        assert_eq!(report["status"], "complete", "{body}");
        assert!(
            report["actions"]
                .as_array()
                .unwrap()
                .iter()
                .any(|a| a == "reread"),
            "{report}"
        );
        let seen = shared.lock().unwrap().seen.clone();
        assert_eq!(seen.len(), 2, "{seen:?}");
        assert!(guidance_seen(&seen[1].1).contains(READ_FX), "{:?}", seen[1]);
        assert_eq!(seen[1].1["stream"], false, "asked again without streaming");
        assert!(!guidance_seen(&seen[0].1).contains(READ_FX));
    }
}

/// A model that answers again without the read, or a request for the read that fails, leaves
/// the value unread: the answer the client gets — the new one, or the held one when no new
/// one came — ends `partial`, never `complete`.
#[tokio::test]
async fn a_streamed_answer_whose_read_was_not_made_is_partial() {
    let failed = (
        400,
        "application/json",
        "{\"error\": {\"message\": \"no\"}}".into(),
    );
    for (second, client_text) in [(chat_text("1.2"), "1.2"), (failed, "1.1 it is")] {
        let (url, shared) = upstream(vec![streamed_text("1.1 it is"), second]).await;
        let gw = gateway(config(url, true, None)).await;
        let (code, head, body) = post(&gw, "chat/completions", chat_request(1, true)).await;
        assert_eq!(code, 200, "{body}");
        assert_eq!(
            shared.lock().unwrap().seen.len(),
            2,
            "the read was asked for"
        );
        let (text, report, _) = chat_outcome(&body);
        assert_eq!(text, client_text, "{body}");
        assert_eq!(report["status"], "partial", "{body}");
        let reason = report["reason"].as_str().unwrap_or_default();
        assert!(reason.contains("not read again"), "{report}");
        assert_eq!(head.status, "partial", "the head agrees: {head:?}");
    }
}

// ---- responses ----------------------------------------------------------------------------

fn message_item(text: &str) -> Value {
    json!({"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
           "content": [{"type": "output_text", "text": text, "annotations": []}]})
}

fn response(output: Vec<Value>) -> Value {
    json!({"id": "resp_1", "object": "response", "created_at": 0, "model": "m",
           "status": "completed", "output": output})
}

fn responses_text(text: &str) -> Step {
    json_step(response(vec![message_item(text)]))
}

fn responses_call(name: &str, args: &str) -> Step {
    json_step(response(vec![
        json!({"type": "function_call", "id": "fc_1", "call_id": "r1",
        "name": name, "arguments": args, "status": "completed"}),
    ]))
}

/// A streamed Responses answer of `text`: preamble, text deltas, the terminal event.
fn responses_streamed(text: &str) -> Step {
    let head = json!({"id": "resp_1", "object": "response", "created_at": 0, "model": "m",
                      "status": "in_progress", "output": []});
    let empty = json!({"type": "message", "id": "msg_1", "role": "assistant",
                       "status": "in_progress", "content": []});
    let (a, b) = text.split_at(text.len() / 2);
    let part = json!({"type": "output_text", "text": text, "annotations": []});
    let events = [
        json!({"type": "response.created", "response": head}),
        json!({"type": "response.in_progress", "response": head}),
        json!({"type": "response.output_item.added", "output_index": 0, "item": empty}),
        json!({"type": "response.content_part.added", "output_index": 0, "content_index": 0,
               "item_id": "msg_1", "part": {"type": "output_text", "text": "", "annotations": []}}),
        json!({"type": "response.output_text.delta", "output_index": 0, "content_index": 0,
               "item_id": "msg_1", "delta": a}),
        json!({"type": "response.output_text.delta", "output_index": 0, "content_index": 0,
               "item_id": "msg_1", "delta": b}),
        json!({"type": "response.output_text.done", "output_index": 0, "content_index": 0,
               "item_id": "msg_1", "text": text}),
        json!({"type": "response.content_part.done", "output_index": 0, "content_index": 0,
               "item_id": "msg_1", "part": part}),
        json!({"type": "response.output_item.done", "output_index": 0,
               "item": message_item(text)}),
        json!({"type": "response.completed", "response": response(vec![message_item(text)])}),
    ];
    let body: String = events
        .iter()
        .map(|e| format!("event: {}\ndata: {e}\n\n", e["type"].as_str().unwrap()))
        .collect();
    (200, "text/event-stream", body)
}

fn responses_tools() -> Value {
    json!([
        {"type": "function", "name": "fx", "parameters": {"type": "object",
            "properties": {"pair": {"type": "string"}}, "required": ["pair"]}},
        {"type": "function", "name": "search", "parameters": {"type": "object",
            "properties": {"query": {"type": "string"}}, "required": ["query"]}}
    ])
}

/// [`messages`] as Responses `input` items.
fn input(failures: usize, answered: bool) -> Value {
    let call = |id: &str, name: &str, args: &str| json!({"type": "function_call", "call_id": id, "name": name, "arguments": args});
    let output =
        |id: &str, out: &str| json!({"type": "function_call_output", "call_id": id, "output": out});
    let mut items = vec![
        json!({"role": "user", "content": "what is the EURUSD rate, and news on it?"}),
        call("c1", "fx", "{\"pair\": \"EURUSD\"}"),
        output("c1", "{\"rate\": 1.1}"),
    ];
    for i in 0..failures + usize::from(answered) {
        let id = format!("s{i}");
        items.push(call(&id, "search", "{\"query\": \"EURUSD\"}"));
        let result = if i < failures {
            "Error: 503 Service Unavailable"
        } else {
            "{\"hits\": 3}"
        };
        items.push(output(&id, result));
    }
    json!(items)
}

fn responses_request(stream: bool, failures: usize, answered: bool) -> Value {
    json!({"model": "m", "stream": stream, "instructions": "be brief",
           "tools": responses_tools(), "input": input(failures, answered)})
}

/// What a client of `/v1/responses` gets: the answer's text, its function calls' names, and the
/// `selfheal` report — from the terminal event of a stream, or the JSON answer.
fn responses_outcome(stream: bool, body: &str) -> (String, Vec<String>, Value) {
    let answer = if stream {
        let events = events(body);
        let text: String = events
            .iter()
            .filter(|e| e["type"] == "response.output_text.delta")
            .filter_map(|e| e["delta"].as_str())
            .collect();
        let last = events
            .iter()
            .rev()
            .find(|e| e["type"] == "response.completed" || e["type"] == "response.incomplete")
            .cloned()
            .unwrap_or(Value::Null);
        let mut answer = last["response"].clone();
        // The text the client got, whatever the terminal event lists.
        answer["streamed_text"] = json!(text);
        answer
    } else {
        let mut answer: Value = serde_json::from_str(body).unwrap();
        let text: String = answer["output"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|i| i["type"] == "message")
            .flat_map(|i| i["content"].as_array().cloned().unwrap_or_default())
            .filter_map(|c| c["text"].as_str().map(str::to_owned))
            .collect();
        answer["streamed_text"] = json!(text);
        answer
    };
    let calls = answer["output"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|i| i["type"] == "function_call")
        .filter_map(|i| i["name"].as_str().map(str::to_owned))
        .collect();
    (
        answer["streamed_text"]
            .as_str()
            .unwrap_or_default()
            .to_owned(),
        calls,
        answer["selfheal"].clone(),
    )
}

/// The text of the `system` items a Responses request the upstream saw appended to `input`.
fn responses_guidance(seen: &Value) -> String {
    seen["input"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|i| i["role"] == "system")
        .filter_map(|i| i["content"].as_str())
        .collect::<Vec<_>>()
        .join("\n")
}

/// The first answer of a Responses test: streamed when the client streams.
fn first_answer(stream: bool, text: &str) -> Step {
    if stream {
        responses_streamed(text)
    } else {
        responses_text(text)
    }
}

/// `/v1/responses`, streamed and not: an answer over an open failure is `partial`, one after
/// the failure was recovered `complete`; the status header agrees.
#[tokio::test]
async fn a_responses_answer_over_an_open_failure_is_partial() {
    for stream in [false, true] {
        for (answered, status) in [(false, "partial"), (true, "complete")] {
            let (url, _) = upstream(vec![first_answer(stream, "1.1")]).await;
            let gw = gateway(config(url, false, None)).await;
            let (code, head, body) =
                post(&gw, "responses", responses_request(stream, 1, answered)).await;
            assert_eq!(code, 200, "{body}");
            let (text, _, report) = responses_outcome(stream, &body);
            assert_eq!(text, "1.1", "{body}");
            assert_judged(&report, &head, status, None);
        }
    }
}

/// `/v1/responses`, streamed and not, under `claim_after_recovery = false`: the final answer of
/// a recovered run is `partial` with the policy's reason.
#[tokio::test]
async fn a_responses_answer_after_a_recovery_under_no_claim_is_partial() {
    for stream in [false, true] {
        for (failures, status) in [(1, "partial"), (0, "complete")] {
            let (url, _) = upstream(vec![first_answer(stream, "1.1")]).await;
            let gw = gateway(config(url, false, Some("claim_after_recovery = false"))).await;
            let (code, head, body) =
                post(&gw, "responses", responses_request(stream, failures, true)).await;
            assert_eq!(code, 200, "{body}");
            let (_, _, report) = responses_outcome(stream, &body);
            let why = (failures > 0).then_some("claim_after_recovery");
            assert_judged(&report, &head, status, why);
        }
    }
}

/// `/v1/responses`, streamed and not: the final answer of a recovered run is held for the read
/// before answering; the upstream sees the guidance, the client gets only the read.
#[tokio::test]
async fn a_responses_answer_of_a_recovered_run_is_held_for_the_read() {
    for stream in [false, true] {
        let (url, shared) = upstream(vec![
            first_answer(stream, "1.1 it is"),
            responses_call("fx", "{\"pair\":\"EURUSD\"}"),
        ])
        .await;
        let gw = gateway(config(url, true, None)).await;
        let (code, head, body) = post(&gw, "responses", responses_request(stream, 1, true)).await;
        assert_eq!(code, 200, "{body}");
        let (text, calls, report) = responses_outcome(stream, &body);
        assert_eq!(text, "", "the held answer never went out: {body}");
        assert_eq!(head.status, "complete", "{head:?}");
        assert!(head.actions.contains("reread"), "the head agrees: {head:?}");
        assert_eq!(calls, ["fx"], "stream {stream}: {body}");
        assert_eq!(report["status"], "complete", "{body}");
        assert!(
            report["actions"]
                .as_array()
                .unwrap()
                .iter()
                .any(|a| a == "reread"),
            "{report}"
        );
        let seen = shared.lock().unwrap().seen.clone();
        assert_eq!(seen.len(), 2, "{seen:?}");
        assert_eq!(seen[1].0, "/v1/responses");
        assert!(
            responses_guidance(&seen[1].1).contains(READ_FX),
            "{:?}",
            seen[1]
        );
        assert_eq!(seen[1].1["stream"], false);
        assert!(!responses_guidance(&seen[0].1).contains(READ_FX));
    }
}

/// `/v1/responses`, streamed and not: a model that answers again without the read leaves the
/// value unread, and the answer goes out `partial`.
#[tokio::test]
async fn a_responses_answer_whose_read_was_not_made_is_partial() {
    for stream in [false, true] {
        let (url, shared) = upstream(vec![
            first_answer(stream, "1.1 it is"),
            responses_text("1.2"),
        ])
        .await;
        let gw = gateway(config(url, true, None)).await;
        let (code, head, body) = post(&gw, "responses", responses_request(stream, 1, true)).await;
        assert_eq!(code, 200, "{body}");
        assert_eq!(
            shared.lock().unwrap().seen.len(),
            2,
            "the read was asked for"
        );
        let (text, _, report) = responses_outcome(stream, &body);
        assert_eq!(text, "1.2", "stream {stream}: {body}");
        assert_eq!(report["status"], "partial", "{body}");
        let reason = report["reason"].as_str().unwrap_or_default();
        assert!(reason.contains("not read again"), "{report}");
        assert_eq!(head.status, "partial", "the head agrees: {head:?}");
    }
}

/// The head of a stream waits for its first frame and says what was known then: a stream that
/// broke before any content and was re-issued names the re-issue; one that could not be
/// re-issued (the upstream refused the second asking) is `failed`, as its error event and the
/// trace say — never a `complete` written before the upstream answered.
#[tokio::test]
async fn a_streams_head_says_what_happened_before_its_first_frame() {
    let empty = (200, "text/event-stream", String::new());
    let refused = (
        400,
        "application/json",
        "{\"error\": {\"message\": \"no\"}}".into(),
    );
    for (second, status, action) in [
        (chat_text("fine"), "complete", "reissue"),
        (refused, "failed", ""),
    ] {
        let (url, _) = upstream(vec![empty.clone(), second]).await;
        let gw = gateway(config(url, false, None)).await;
        let request = json!({"model": "m", "stream": true,
                             "messages": [{"role": "user", "content": "hi"}]});
        let (code, head, body) = post(&gw, "chat/completions", request).await;
        assert_eq!(code, 200, "{body}");
        assert_eq!(head.status, status, "{head:?}: {body}");
        assert!(head.actions.contains(action), "{head:?}");
        let (text, report, _) = chat_outcome(&body);
        if status == "complete" {
            assert_eq!(text, "fine", "{body}");
            assert_eq!(report["status"], "complete", "{body}");
        } else {
            assert!(body.contains("stream_broken"), "{body}");
        }
    }
}

// ---- issue 31: the grounding rule on final answers ----------------------------------------

/// A final answer stating a number found in no input or tool result of the run is `partial`
/// with the number named — chat completions, streamed and not, and `/v1/responses`, streamed
/// and not; an answer whose numbers are the tool's (1.1 and 3) is `complete`. The text passes
/// through unchanged either way.
#[tokio::test]
async fn a_final_answer_with_a_made_up_number_is_partial_on_every_api() {
    for stream in [false, true] {
        for (text, status) in [
            ("EURUSD is 1.1; 3 hits.", "complete"),
            ("EURUSD is 1.25; 3 hits.", "partial"),
        ] {
            let step = if stream {
                streamed_text(text)
            } else {
                chat_text(text)
            };
            let (url, _) = upstream(vec![step]).await;
            let gw = gateway(config(url, false, None)).await;
            let mut req = chat_request(0, true);
            req["stream"] = json!(stream);
            let (code, head, body) = post(&gw, "chat/completions", req).await;
            assert_eq!(code, 200, "{body}");
            let (said, report) = if stream {
                let (said, report, _) = chat_outcome(&body);
                (said, report)
            } else {
                let v: Value = serde_json::from_str(&body).unwrap();
                (
                    v["choices"][0]["message"]["content"]
                        .as_str()
                        .unwrap()
                        .to_owned(),
                    v["selfheal"].clone(),
                )
            };
            assert_eq!(said, text, "{body}");
            assert_eq!(report["status"], status, "chat, stream {stream}: {report}");
            if status == "partial" {
                let reason = report["reason"].as_str().unwrap_or_default();
                assert!(reason.contains("1.25"), "{report}");
            }
            if !stream {
                assert_eq!(head.status, status);
            }

            let step = first_answer(stream, text);
            let (url, _) = upstream(vec![step]).await;
            let gw = gateway(config(url, false, None)).await;
            let (code, head, body) =
                post(&gw, "responses", responses_request(stream, 0, true)).await;
            assert_eq!(code, 200, "{body}");
            let (said, _, report) = responses_outcome(stream, &body);
            assert_eq!(said, text, "{body}");
            assert_eq!(
                report["status"], status,
                "responses, stream {stream}: {report}"
            );
            if !stream {
                assert_eq!(head.status, status);
            }
        }
    }
}

/// `/v1/messages` goes through the chat pipeline: its answer is judged by the same rule.
#[tokio::test]
async fn a_messages_answer_with_a_made_up_number_is_partial() {
    for (text, status) in [
        ("The rate is 1.1.", "complete"),
        ("The rate is 0.93.", "partial"),
    ] {
        let (url, _) = upstream(vec![chat_text(text)]).await;
        let gw = gateway(config(url, false, None)).await;
        let req = json!({"model": "m", "max_tokens": 100,
        "tools": [{"name": "fx", "input_schema": {"type": "object",
            "properties": {"pair": {"type": "string"}}, "required": ["pair"]}}],
        "messages": [
            {"role": "user", "content": "what is the EURUSD rate?"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "c1", "name": "fx",
                "input": {"pair": "EURUSD"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "c1",
                "content": "{\"rate\": 1.1}"}]}
        ]});
        let (code, head, body) = post(&gw, "messages", req).await;
        assert_eq!(code, 200, "{body}");
        assert!(body.contains(text), "{body}");
        assert_eq!(head.status, status, "{body}");
    }
}

/// A text call the gateway salvages is never judged as a final answer: its arguments' numbers
/// (made up or not) are the call's, and the answer that calls a tool is not `partial` for them.
#[tokio::test]
async fn a_salvaged_text_call_is_not_judged_as_an_answer() {
    let text = "```json\n{\"name\": \"search\", \"arguments\": {\"query\": \"EURUSD 2031\"}}\n```";
    let (url, _) = upstream(vec![chat_text(text)]).await;
    let gw = gateway(config(url, false, None)).await;
    let mut req = chat_request(0, false);
    req["stream"] = json!(false);
    let (code, _, body) = post(&gw, "chat/completions", req).await;
    assert_eq!(code, 200, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    let calls = &v["choices"][0]["message"]["tool_calls"];
    assert_eq!(calls[0]["function"]["name"], "search", "{body}");
    assert_eq!(v["selfheal"]["status"], "complete", "{body}");
}

/// Issue 31: a final answer that announces a call of an offered tool instead of making it (the
/// real model's "To get the capital of France, I need to call the `geo_capital` function.") is
/// never `complete`. Whole answers, chat and `/v1/responses`: asked again once with the core's
/// guidance naming the tool; an announcement again goes out `partial` with the reason naming
/// it, and a call that comes instead goes out as the call. Streamed answers (whose text has gone
/// out): `partial` in the final chunk or event, the text passed through.
#[tokio::test]
async fn a_final_answer_that_announces_a_call_is_never_complete_on_every_api() {
    let said = "To get the news, I need to call the `search` function.";
    let guided = |seen: &Value, key: &str| {
        seen[key]
            .as_array()
            .unwrap()
            .last()
            .unwrap()
            .to_string()
            .contains("call of `search`")
    };
    // Chat, whole: asked again once, then partial.
    let (url, up) = upstream(vec![chat_text(said), chat_text(said)]).await;
    let gw = gateway(config(url, false, None)).await;
    let mut req = chat_request(0, true);
    req["stream"] = json!(false);
    let (code, head, body) = post(&gw, "chat/completions", req.clone()).await;
    assert_eq!(code, 200, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["choices"][0]["message"]["content"], said, "{body}");
    assert_judged(&v["selfheal"], &head, "partial", Some("`search`"));
    let seen = up.lock().unwrap().seen.clone();
    assert_eq!(seen.len(), 2, "asked again once");
    assert!(guided(&seen[1].1, "messages"), "{:?}", seen[1].1);
    // Chat, whole: asked again, the model calls the tool: the call goes out.
    let (url, _) = upstream(vec![
        chat_text(said),
        chat_call("search", "{\"query\": \"EURUSD news\"}"),
    ])
    .await;
    let gw = gateway(config(url, false, None)).await;
    let (code, _, body) = post(&gw, "chat/completions", req).await;
    assert_eq!(code, 200, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    let calls = &v["choices"][0]["message"]["tool_calls"];
    assert_eq!(calls[0]["function"]["name"], "search", "{body}");
    assert_ne!(v["selfheal"]["status"], "partial", "{body}");
    // Chat, streamed: the text went out; the final chunk says partial.
    let (url, _) = upstream(vec![streamed_text(said)]).await;
    let gw = gateway(config(url, false, None)).await;
    let (code, _, body) = post(&gw, "chat/completions", chat_request(0, true)).await;
    assert_eq!(code, 200, "{body}");
    let (text, report, _) = chat_outcome(&body);
    assert_eq!(text, said, "{body}");
    assert_eq!(report["status"], "partial", "{report}");
    assert!(
        report["reason"]
            .as_str()
            .unwrap_or_default()
            .contains("`search`"),
        "{report}"
    );
    // Responses, whole and streamed.
    for stream in [false, true] {
        let steps = if stream {
            vec![first_answer(true, said)]
        } else {
            vec![first_answer(false, said), first_answer(false, said)]
        };
        let (url, up) = upstream(steps).await;
        let gw = gateway(config(url, false, None)).await;
        let (code, _, body) = post(&gw, "responses", responses_request(stream, 0, true)).await;
        assert_eq!(code, 200, "{body}");
        let (text, _, report) = responses_outcome(stream, &body);
        assert_eq!(text, said, "{body}");
        assert_eq!(report["status"], "partial", "stream {stream}: {report}");
        let seen = up.lock().unwrap().seen.clone();
        if !stream {
            assert_eq!(seen.len(), 2, "asked again once");
            assert!(guided(&seen[1].1, "input"), "{:?}", seen[1].1);
        }
    }
}

/// An answer that names a tool only to report what it gave is claimed.
#[tokio::test]
async fn a_final_answer_that_reports_a_tools_value_is_complete() {
    let text = "According to fx, EURUSD is 1.1; search found 3 hits.";
    let (url, up) = upstream(vec![chat_text(text)]).await;
    let gw = gateway(config(url, false, None)).await;
    let mut req = chat_request(0, true);
    req["stream"] = json!(false);
    let (code, head, body) = post(&gw, "chat/completions", req).await;
    assert_eq!(code, 200, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_judged(&v["selfheal"], &head, "complete", None);
    assert_eq!(up.lock().unwrap().seen.len(), 1);
}
