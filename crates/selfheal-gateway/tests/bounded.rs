//! Bounded generation (issue 31, item 4), over real sockets: the gateway (`serve` on port 0)
//! in front of a scripted upstream on 127.0.0.1:0 that generates slowly, event by event, and
//! records what it was sent and when its connection was closed — counted in the events it
//! wrote, not in wall-clock time.
//!
//! - the client goes away mid-stream, or before any frame went out, or while a whole answer is
//!   generated: the upstream's connection is closed within a bounded number of events;
//! - a degenerate stream (a run of newlines) is cut: after content, ended `partial` with the
//!   reason; before any, re-asked, or its call written as text taken; a whole answer that
//!   degenerated is re-asked, or flagged;
//! - `[limits] default_max_tokens` is set upstream when the client set no limit, never lowers
//!   the client's own, and is reported as `cap`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use selfheal_gateway::GatewayConfig;

mod common;

/// What the scripted upstream answers one request with.
#[derive(Clone)]
enum Reply {
    /// An event stream: these events, one per tick, then `forever` one per tick until the
    /// connection closes (or 100,000 ticks), then the end.
    Sse {
        events: Vec<String>,
        forever: Option<String>,
    },
    /// A whole JSON answer, at once.
    Json(String),
    /// A whole answer that never comes: the upstream "generates" until its connection closes.
    Hang,
}

/// What the upstream saw: the requests' bodies, the events (or ticks) written to the latest
/// connection, and at how many the gateway closed it.
#[derive(Default)]
struct Seen {
    bodies: Mutex<Vec<Value>>,
    written: AtomicUsize,
    closed_at: Mutex<Option<usize>>,
}

/// Milliseconds between two events (or ticks) of the upstream.
const TICK_MS: u64 = 5;

async fn upstream(replies: Vec<Reply>) -> (String, Arc<Seen>) {
    let queue = Arc::new(Mutex::new(VecDeque::from(replies)));
    let seen = Arc::new(Seen::default());
    let seen2 = seen.clone();
    let url = common::tcp_upstream(move |tcp, body| {
        let (queue, seen) = (queue.clone(), seen2.clone());
        async move { serve_one(tcp, &body, &queue, &seen).await }
    })
    .await;
    (url, seen)
}

async fn serve_one(
    mut tcp: tokio::net::TcpStream,
    body: &[u8],
    queue: &Mutex<VecDeque<Reply>>,
    seen: &Seen,
) {
    let mut chunk = [0u8; 8192];
    seen.bodies
        .lock()
        .unwrap()
        .push(serde_json::from_slice(body).unwrap());
    let reply = queue.lock().unwrap().pop_front().unwrap_or(Reply::Hang);
    seen.written.store(0, Ordering::SeqCst);
    *seen.closed_at.lock().unwrap() = None;
    let (events, forever) = match reply {
        Reply::Json(body) => {
            let head = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
                body.len()
            );
            let _ = tcp.write_all(format!("{head}{body}").as_bytes()).await;
            return;
        }
        Reply::Hang => (Vec::new(), None),
        Reply::Sse { events, forever } => {
            let head =
                "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n";
            if tcp.write_all(head.as_bytes()).await.is_err() {
                return;
            }
            (events, forever.or(Some(String::new())))
        }
    };
    let streaming = forever.is_some();
    let mut events = VecDeque::from(events);
    for i in 0..100_000 {
        tokio::select! {
            // The gateway closed the connection (a read of 0, or of an error).
            r = tcp.read(&mut chunk) => if matches!(r, Ok(0) | Err(_)) {
                *seen.closed_at.lock().unwrap() = Some(i);
                return;
            },
            () = tokio::time::sleep(Duration::from_millis(TICK_MS)) => {
                if streaming {
                    let event = match events.pop_front() {
                        Some(e) => e,
                        None => match &forever {
                            Some(f) if !f.is_empty() => f.clone(),
                            _ => break,
                        },
                    };
                    if tcp.write_all(format!("data: {event}\n\n").as_bytes()).await.is_err() {
                        *seen.closed_at.lock().unwrap() = Some(i);
                        return;
                    }
                }
                seen.written.fetch_add(1, Ordering::SeqCst);
            }
        }
    }
    if streaming {
        let _ = tcp.write_all(b"data: [DONE]\n\n").await;
        let _ = tcp.shutdown().await;
    }
}

/// A chat chunk carrying `content`.
fn content(text: &str) -> String {
    json!({"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m",
           "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": null}]})
    .to_string()
}

fn role() -> String {
    json!({"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m",
           "choices": [{"index": 0, "delta": {"role": "assistant"}, "finish_reason": null}]})
    .to_string()
}

fn completion(message: Value, finish: &str) -> String {
    json!({"id": "c2", "object": "chat.completion", "created": 1, "model": "m",
           "choices": [{"index": 0, "message": message, "finish_reason": finish}]})
    .to_string()
}

fn weather_tool() -> Value {
    json!([{"type": "function", "function": {"name": "get_weather",
        "parameters": {"type": "object", "required": ["city"],
                       "properties": {"city": {"type": "string"}}}}}])
}

async fn gateway_for(up: &str, edit: impl FnOnce(&mut GatewayConfig)) -> String {
    let mut config = GatewayConfig::for_upstream(up);
    edit(&mut config);
    common::gateway(config).await
}

fn post(url: &str, path: &str, body: &Value) -> reqwest::RequestBuilder {
    reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .unwrap()
        .post(format!("{url}/{path}"))
        .header("authorization", "Bearer sk-test")
        .json(body)
}

/// Waits (within 60 s, a hang guard, not a measurement) until `ready` holds.
async fn until(what: &str, ready: impl Fn() -> bool) {
    for _ in 0..12_000 {
        if ready() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("timed out waiting until {what}");
}

/// The upstream saw its connection closed within `bound` events (or ticks) of `at`, the count
/// when the client went away.
async fn closed_within(seen: &Seen, at: usize, bound: usize) -> usize {
    until("the upstream sees its connection closed", || {
        seen.closed_at.lock().unwrap().is_some()
    })
    .await;
    let closed = seen.closed_at.lock().unwrap().unwrap();
    assert!(
        closed <= at + bound,
        "the upstream went on generating: closed after {closed} events, the client left at {at}"
    );
    closed
}

async fn cancelled_count(url: &str) -> u64 {
    let metrics = reqwest::get(url.replace("/v1", "/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    metrics
        .lines()
        .find_map(|l| l.strip_prefix("selfheal_upstream_cancelled_total "))
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

/// The client reads three events of an endless stream and goes away: the gateway drops the
/// upstream request, which sees its connection closed within 200 events (at 5 ms apart, about
/// a second of a loaded machine), not after the 100,000 it would write.
#[tokio::test]
async fn a_client_that_goes_away_mid_stream_stops_the_upstream() {
    let (up, seen) = upstream(vec![Reply::Sse {
        events: vec![role()],
        forever: Some(content("word ")),
    }])
    .await;
    let url = gateway_for(&up, |_| {}).await;
    let body = json!({"model": "m", "stream": true,
                      "messages": [{"role": "user", "content": "Tell me a long story."}]});
    let mut resp = post(&url, "chat/completions", &body).send().await.unwrap();
    let mut got = String::new();
    while got.matches("word").count() < 3 {
        let chunk = resp.chunk().await.unwrap().expect("the stream goes on");
        got.push_str(&String::from_utf8_lossy(&chunk));
    }
    let at = seen.written.load(Ordering::SeqCst);
    drop(resp);
    closed_within(&seen, at, 200).await;
    let mut counted = 0;
    for _ in 0..200 {
        counted = cancelled_count(&url).await;
        if counted == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(counted, 1, "selfheal_upstream_cancelled_total");
}

/// Nothing went out yet — the answer is held, as an answer opening a fence is while it may
/// write a tool call as text — when the client goes away: the relay, which had nothing to
/// send and so no failed send to notice, still drops the upstream request.
#[tokio::test]
async fn a_client_that_goes_away_before_any_frame_stops_the_upstream() {
    let (up, seen) = upstream(vec![Reply::Sse {
        events: vec![role(), content("```json\n{\"name\": \"get_weather\", ")],
        forever: Some(content("\"a\": 1, ")),
    }])
    .await;
    // Degeneration off: this is about the client, not the output.
    let url = gateway_for(&up, |c| {
        c.limits.degenerate.repeat_bytes = 0;
    })
    .await;
    let body = json!({"model": "m", "stream": true, "tools": weather_tool(),
                      "messages": [{"role": "user", "content": "Weather in Paris?"}]});
    let request = tokio::spawn(post(&url, "chat/completions", &body).send());
    until("the upstream generates", || {
        seen.written.load(Ordering::SeqCst) >= 5
    })
    .await;
    let at = seen.written.load(Ordering::SeqCst);
    request.abort();
    closed_within(&seen, at, 200).await;
}

/// A whole (not streamed) answer still being generated when the client goes away: the
/// upstream sees its connection closed within 200 ticks.
#[tokio::test]
async fn a_client_that_goes_away_from_a_whole_answer_stops_the_upstream() {
    let (up, seen) = upstream(vec![Reply::Hang]).await;
    let url = gateway_for(&up, |_| {}).await;
    let body = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]});
    let request = tokio::spawn(post(&url, "chat/completions", &body).send());
    until("the upstream generates", || {
        seen.written.load(Ordering::SeqCst) >= 5
    })
    .await;
    let at = seen.written.load(Ordering::SeqCst);
    request.abort();
    closed_within(&seen, at, 200).await;
}

/// The `data:` payloads of an SSE body, parsed (`[DONE]` left out).
fn events(body: &str) -> Vec<Value> {
    body.split("\n\n")
        .filter_map(|e| e.lines().find_map(|l| l.strip_prefix("data: ")))
        .filter(|p| *p != "[DONE]")
        .map(|p| serde_json::from_str(p).unwrap())
        .collect()
}

/// The tool calls the streamed chat answer's deltas carried, in order.
fn streamed_calls(events: &[Value]) -> Vec<&Value> {
    events
        .iter()
        .filter_map(|e| e["choices"][0]["delta"]["tool_calls"].as_array())
        .flatten()
        .collect()
}

/// The whole body of an answer streamed through the gateway at `url`, at `path`.
async fn stream_text(url: &str, path: &str, body: &Value) -> String {
    post(url, path, body)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

/// The gateway (its URL) in front of a chat upstream that says "Hello there." and then streams
/// newlines without end, and what that upstream saw.
async fn padded_chat() -> (String, Arc<Seen>) {
    let (up, seen) = upstream(vec![Reply::Sse {
        events: vec![role(), content("Hello there.")],
        forever: Some(content("\n")),
    }])
    .await;
    (gateway_for(&up, |_| {}).await, seen)
}

/// Words, then newlines without end: the newlines past the limit (256) are cut off with the
/// upstream, and the stream ends `partial` with the reason and the `cut` action — never
/// `complete` — with `finish_reason: "length"` and `[DONE]`.
#[tokio::test]
async fn a_stream_that_degenerates_after_content_ends_partial() {
    let (url, seen) = padded_chat().await;
    let body = json!({"model": "m", "stream": true,
                      "messages": [{"role": "user", "content": "Say hello."}]});
    let resp = post(&url, "chat/completions", &body).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    let text = resp.text().await.unwrap();
    assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");
    let events = events(&text);
    let last = events.last().unwrap();
    assert_eq!(last["choices"][0]["finish_reason"], "length", "{last}");
    // The ending chunk says nothing of its own: the answer is the deltas sent.
    assert!(last["choices"][0]["delta"]["content"].is_null(), "{last}");
    assert_eq!(last["selfheal"]["status"], "partial", "{last}");
    let reason = last["selfheal"]["reason"].as_str().unwrap();
    assert!(reason.contains("whitespace"), "{reason}");
    assert!(
        last["selfheal"]["actions"]
            .as_array()
            .unwrap()
            .contains(&json!("cut"))
    );
    let said: String = events
        .iter()
        .filter_map(|e| e["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert!(said.starts_with("Hello there."));
    assert!(said.len() <= "Hello there.".len() + 256, "{}", said.len());
    // Cut, not read to the end: the upstream saw its connection closed.
    closed_within(&seen, 260, 200).await;
}

/// Under `tool_choice: "required"` the model pads with newlines before saying anything: the
/// stream is cut, the model asked again once with the problem named, and its call goes out.
#[tokio::test]
async fn a_stream_that_degenerates_before_content_is_reasked() {
    let call = json!({"role": "assistant", "content": null, "tool_calls": [{"id": "call_1",
        "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}]});
    let (up, seen) = upstream(vec![
        Reply::Sse {
            events: vec![role()],
            forever: Some(content("\n")),
        },
        Reply::Json(completion(call, "tool_calls")),
    ])
    .await;
    let url = gateway_for(&up, |_| {}).await;
    let body = json!({"model": "m", "stream": true, "tools": weather_tool(),
                      "tool_choice": "required",
                      "messages": [{"role": "user", "content": "Weather in Paris?"}]});
    let resp = post(&url, "chat/completions", &body).send().await.unwrap();
    let text = resp.text().await.unwrap();
    let events = events(&text);
    let calls = streamed_calls(&events);
    assert_eq!(calls.len(), 1, "{text}");
    assert_eq!(calls[0]["function"]["name"], "get_weather");
    let last = events.last().unwrap();
    assert_eq!(last["selfheal"]["status"], "complete", "{last}");
    let actions = last["selfheal"]["actions"].as_array().unwrap();
    assert!(actions.contains(&json!("cut")) && actions.contains(&json!("reask")));
    let bodies = seen.bodies.lock().unwrap();
    assert_eq!(bodies.len(), 2);
    let reask = bodies[1]["messages"].as_array().unwrap().last().unwrap();
    assert!(
        reask["content"].as_str().unwrap().contains("was cut"),
        "{reask}"
    );
    // No newline padding reached the client.
    assert!(!text.contains("\\n\\n\\n"), "{text}");
}

/// The model writes its call as a fenced block and then pads with newlines (as the recorded
/// Qwen2.5-Coder did): the padding is cut, and the call written before it taken as a call
/// without asking again.
#[tokio::test]
async fn a_call_written_as_text_before_the_padding_is_taken() {
    let (up, seen) = upstream(vec![Reply::Sse {
        events: vec![
            role(),
            content(
                "```json\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n```",
            ),
        ],
        forever: Some(content("\n")),
    }])
    .await;
    let url = gateway_for(&up, |_| {}).await;
    let body = json!({"model": "m", "stream": true, "tools": weather_tool(),
                      "tool_choice": "required",
                      "messages": [{"role": "user", "content": "Weather in Paris?"}]});
    let text = stream_text(&url, "chat/completions", &body).await;
    let events = events(&text);
    let calls = streamed_calls(&events);
    assert_eq!(calls.len(), 1, "{text}");
    let args: Value =
        serde_json::from_str(calls[0]["function"]["arguments"].as_str().unwrap()).unwrap();
    assert_eq!(args, json!({"city": "Paris"}));
    let last = events.last().unwrap();
    assert_eq!(last["selfheal"]["status"], "complete", "{last}");
    let actions = last["selfheal"]["actions"].as_array().unwrap();
    assert!(actions.contains(&json!("cut")) && actions.contains(&json!("salvage")));
    assert_eq!(seen.bodies.lock().unwrap().len(), 1, "not asked again");
}

/// A call written as text whose arguments degenerate (one piece repeated) is cut inside its
/// arguments: it is never taken as a call — repair would complete it with a value the model
/// never wrote (`"days": 1` of `10000…`) — and the model is asked again instead.
#[tokio::test]
async fn a_call_cut_inside_its_arguments_is_not_taken() {
    let call = json!({"role": "assistant", "content": null, "tool_calls": [{"id": "call_1",
        "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}]});
    let (up, seen) = upstream(vec![
        Reply::Sse {
            events: vec![
                role(),
                content(
                    "<tool_call>{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 1",
                ),
            ],
            forever: Some(content("0")),
        },
        Reply::Json(completion(call, "tool_calls")),
    ])
    .await;
    let url = gateway_for(&up, |_| {}).await;
    let body = json!({"model": "m", "stream": true, "tools": weather_tool(),
                      "messages": [{"role": "user", "content": "Weather in Paris?"}]});
    let text = stream_text(&url, "chat/completions", &body).await;
    let events = events(&text);
    let calls: Vec<Value> = streamed_calls(&events)
        .into_iter()
        .map(|c| serde_json::from_str(c["function"]["arguments"].as_str().unwrap()).unwrap())
        .collect();
    assert_eq!(calls, vec![json!({"city": "Paris"})], "{text}");
    assert_eq!(seen.bodies.lock().unwrap().len(), 2, "asked again");
}

/// A whole answer that ran to its limit in newlines is asked again once; when the second
/// answer degenerates too, the answer is flagged `partial`, never claimed `complete`.
#[tokio::test]
async fn a_whole_answer_that_degenerated_is_reasked_then_flagged() {
    let padded = json!({"role": "assistant", "content": format!("Hi{}", "\n".repeat(1000))});
    let fine = json!({"role": "assistant", "content": "Hello!"});
    let (up, seen) = upstream(vec![
        Reply::Json(completion(padded.clone(), "length")),
        Reply::Json(completion(fine, "stop")),
    ])
    .await;
    let url = gateway_for(&up, |_| {}).await;
    let body = json!({"model": "m", "messages": [{"role": "user", "content": "Say hello."}]});
    let resp = post(&url, "chat/completions", &body).send().await.unwrap();
    assert_eq!(resp.headers()["x-selfheal-status"], "complete");
    let actions = resp.headers()["x-selfheal-actions"]
        .to_str()
        .unwrap()
        .to_owned();
    assert!(
        actions.contains("cut") && actions.contains("reask"),
        "{actions}"
    );
    let answer: Value = resp.json().await.unwrap();
    assert_eq!(answer["choices"][0]["message"]["content"], "Hello!");
    assert_eq!(seen.bodies.lock().unwrap().len(), 2);

    let replies = (0..8)
        .map(|_| Reply::Json(completion(padded.clone(), "length")))
        .collect();
    let (up, _) = upstream(replies).await;
    let url = gateway_for(&up, |_| {}).await;
    let resp = post(&url, "chat/completions", &body).send().await.unwrap();
    assert_eq!(resp.headers()["x-selfheal-status"], "partial");
    let answer: Value = resp.json().await.unwrap();
    assert_eq!(answer["selfheal"]["status"], "partial");
    assert!(
        answer["selfheal"]["reason"]
            .as_str()
            .unwrap()
            .contains("whitespace")
    );
}

/// `[limits] default_max_tokens`: set upstream when the client set no limit (chat's
/// `max_tokens`, the Responses API's `max_output_tokens`), reported as `cap`; a client's own
/// limit, higher or lower, or `max_completion_tokens`, goes as it was. Off by default.
#[tokio::test]
async fn the_default_output_limit_is_set_only_where_the_client_set_none() {
    let answer = || {
        Reply::Json(completion(
            json!({"role": "assistant", "content": "ok"}),
            "stop",
        ))
    };
    let (up, seen) = upstream((0..5).map(|_| answer()).collect()).await;
    let url = gateway_for(&up, |c| c.limits.default_max_tokens = Some(512)).await;
    let messages = json!([{"role": "user", "content": "hi"}]);
    let cases = [
        (json!({"model": "m", "messages": messages}), Some(512), true),
        (
            json!({"model": "m", "messages": messages, "max_tokens": 4096}),
            Some(4096),
            false,
        ),
        (
            json!({"model": "m", "messages": messages, "max_tokens": 16}),
            Some(16),
            false,
        ),
        (
            json!({"model": "m", "messages": messages, "max_completion_tokens": 9000}),
            None,
            false,
        ),
    ];
    for (i, (body, want, capped)) in cases.iter().enumerate() {
        let resp = post(&url, "chat/completions", body).send().await.unwrap();
        assert_eq!(resp.status(), 200);
        let actions = resp.headers()["x-selfheal-actions"]
            .to_str()
            .unwrap()
            .to_owned();
        assert_eq!(actions.contains("cap"), *capped, "{body}: {actions}");
        let sent = seen.bodies.lock().unwrap()[i].clone();
        assert_eq!(sent["max_tokens"].as_u64(), *want, "{body}: {sent}");
        if body.get("max_completion_tokens").is_some() {
            assert_eq!(sent["max_completion_tokens"], 9000);
        }
    }

    let response = json!({"id": "resp_1", "object": "response", "status": "completed",
        "output": [{"type": "message", "id": "m1", "role": "assistant", "status": "completed",
                    "content": [{"type": "output_text", "text": "ok", "annotations": []}]}]});
    let (up, seen) = upstream(vec![Reply::Json(response.to_string())]).await;
    let url = gateway_for(&up, |c| c.limits.default_max_tokens = Some(512)).await;
    let resp = post(&url, "responses", &json!({"model": "m", "input": "hi"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert!(
        resp.headers()["x-selfheal-actions"]
            .to_str()
            .unwrap()
            .contains("cap")
    );
    assert_eq!(seen.bodies.lock().unwrap()[0]["max_output_tokens"], 512);

    // Off by default: the request goes as written.
    let (up, seen) = upstream(vec![answer()]).await;
    let url = gateway_for(&up, |_| {}).await;
    let body = json!({"model": "m", "messages": messages});
    post(&url, "chat/completions", &body).send().await.unwrap();
    assert!(seen.bodies.lock().unwrap()[0].get("max_tokens").is_none());
}

/// The Responses API: words, then newlines without end. The stream ends with
/// `response.incomplete`, the message under way closed `incomplete` with the words said, and
/// the report `partial` with the `cut` action. The closing item's text is exactly what the
/// deltas sent: a client that rebuilds the text from the deltas and one that reads the final
/// item agree (the delta that showed the run is read, never sent, and was in the item's text).
#[tokio::test]
async fn a_responses_stream_that_degenerates_after_content_ends_incomplete_and_partial() {
    let delta = |text: &str| {
        json!({"type": "response.output_text.delta", "output_index": 0, "content_index": 0,
               "item_id": "m1", "delta": text})
        .to_string()
    };
    let (up, _) = upstream(vec![Reply::Sse {
        events: vec![
            json!({"type": "response.created", "response": {"id": "resp_1", "object": "response",
                   "status": "in_progress", "output": []}})
            .to_string(),
            json!({"type": "response.output_item.added", "output_index": 0,
                   "item": {"type": "message", "id": "m1", "role": "assistant",
                            "status": "in_progress", "content": []}})
            .to_string(),
            delta("Hello there."),
        ],
        forever: Some(delta("\n")),
    }])
    .await;
    let url = gateway_for(&up, |_| {}).await;
    let body = json!({"model": "m", "stream": true, "input": "Say hello."});
    let text = stream_text(&url, "responses", &body).await;
    let events = events(&text);
    let last = events.last().unwrap();
    assert_eq!(last["type"], "response.incomplete", "{text}");
    let response = &last["response"];
    assert_eq!(response["id"], "resp_1");
    assert_eq!(response["selfheal"]["status"], "partial", "{response}");
    assert!(
        response["selfheal"]["actions"]
            .as_array()
            .unwrap()
            .contains(&json!("cut"))
    );
    let message = &response["output"][0];
    assert_eq!(message["status"], "incomplete", "{response}");
    let said = message["content"][0]["text"]
        .as_str()
        .unwrap_or_else(|| panic!("{response}"));
    assert!(
        said.starts_with("Hello there.") && said.len() <= 12 + 257,
        "{said:?}"
    );
    let deltas: String = events
        .iter()
        .filter(|e| e["type"] == "response.output_text.delta")
        .filter_map(|e| e["delta"].as_str())
        .collect();
    assert_eq!(said, deltas, "the final item says what the deltas said");
    let closed: Vec<&Value> = events
        .iter()
        .filter(|e| e["type"] == "response.output_item.done")
        .collect();
    assert_eq!(closed.len(), 1, "{text}");
    assert_eq!(closed[0]["item"]["content"][0]["text"], deltas.as_str());
}

/// The Messages API over the same cut: the text the client gets is its `text_delta` events
/// alone (nothing closes with text of its own), and the message ends `max_tokens`, `partial`
/// with the `cut` action, never `end_turn` and `complete`.
#[tokio::test]
async fn a_messages_stream_that_degenerates_after_content_ends_max_tokens_and_partial() {
    let (url, _) = padded_chat().await;
    let body = json!({"model": "m", "stream": true, "max_tokens": 4096,
                      "messages": [{"role": "user", "content": "Say hello."}]});
    let text = stream_text(&url, "messages", &body).await;
    let events = events(&text);
    let types: Vec<&str> = events.iter().filter_map(|e| e["type"].as_str()).collect();
    assert_eq!(types.last(), Some(&"message_stop"), "{text}");
    let said: String = events
        .iter()
        .filter(|e| e["type"] == "content_block_delta")
        .filter_map(|e| e["delta"]["text"].as_str())
        .collect();
    assert!(
        said.starts_with("Hello there.") && said.len() <= 12 + 256,
        "{said:?}"
    );
    // No event but the deltas carries text: what the SDK accumulates is what was sent.
    let texts = events
        .iter()
        .filter(|e| e["type"] != "content_block_delta")
        .filter(|e| e.to_string().contains("Hello there."))
        .count();
    assert_eq!(texts, 0, "{text}");
    let end = events
        .iter()
        .find(|e| e["type"] == "message_delta")
        .unwrap_or_else(|| panic!("{text}"));
    assert_eq!(end["delta"]["stop_reason"], "max_tokens", "{end}");
    assert_eq!(end["selfheal"]["status"], "partial", "{end}");
    assert!(
        end["selfheal"]["actions"]
            .as_array()
            .unwrap()
            .contains(&json!("cut"))
    );
}
