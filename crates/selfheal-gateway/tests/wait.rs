//! A tool's retry delay is carried out on the wire (issue 33, item 2: waiting out a
//! `Retry-After` that fits is a recovery the ladder can choose). The gateway executes no tool:
//! the agent calls the tool again only after the model's next answer, so the gateway holds
//! that model call until the delay the core decided has passed — and a wait longer than it
//! may hold a request (`[limits] max_wait_ms`) is not shortened but routed around by the
//! core's ladder, and reported. The real server (`serve` on port 0) in front of a scripted
//! upstream on 127.0.0.1 that records when each request arrived.

// Test helpers outside `#[test]` functions may panic: a panic is a test failure here.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::State;
use axum::routing::post;
use serde_json::{Value, json};
use tokio::net::TcpListener;

use selfheal_gateway::GatewayConfig;

mod common;
use common::{gateway, guidance_seen};

/// Every request the upstream received: when it arrived, and its body.
type Seen = Arc<Mutex<Vec<(Instant, Value)>>>;

/// The model's answer: the same search again.
fn search_again() -> Value {
    json!({"id": "c", "object": "chat.completion", "created": 0, "model": "m",
           "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
               "role": "assistant", "content": null, "tool_calls": [{
                   "id": "call_2", "type": "function",
                   "function": {"name": "search", "arguments": "{\"q\":\"x\"}"}}]}}],
           "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}})
}

async fn record(State(seen): State<Seen>, body: axum::Json<Value>) -> axum::Json<Value> {
    seen.lock().unwrap().push((Instant::now(), body.0));
    axum::Json(search_again())
}

/// The recording upstream: its base URL and what it saw.
async fn upstream() -> (String, Seen) {
    let seen: Seen = Arc::default();
    let app = Router::new()
        .route("/v1/chat/completions", post(record))
        .with_state(seen.clone());
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (format!("http://{addr}/v1"), seen)
}

/// A conversation whose `search` call came back with `result`.
fn conversation(result: &str, stream: bool) -> Value {
    json!({
        "model": "m",
        "stream": stream,
        "messages": [
            {"role": "user", "content": "Find x."},
            {"role": "assistant", "content": null, "tool_calls": [{
                "id": "call_1", "type": "function",
                "function": {"name": "search", "arguments": "{\"q\":\"x\"}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": result}
        ],
        "tools": [{"type": "function", "function": {"name": "search",
            "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}}]
    })
}

/// What came back: the `x-selfheal-*` headers named, and the body.
struct Answer {
    actions: String,
    wait_ms: Option<String>,
    refused: Option<String>,
    body: String,
}

/// Sends `body` to the gateway at `base`: when it was sent, and the answer.
async fn send(base: &str, body: &Value) -> (Instant, Answer) {
    let sent = Instant::now();
    let resp = reqwest::Client::new()
        .post(format!("{base}/chat/completions"))
        .json(body)
        .send()
        .await
        .unwrap();
    let header = |name: &str| {
        resp.headers()
            .get(name)
            .map(|h| h.to_str().unwrap().to_owned())
    };
    let (actions, wait_ms, refused) = (
        header("x-selfheal-actions").unwrap_or_default(),
        header("x-selfheal-wait-ms"),
        header("x-selfheal-wait-refused"),
    );
    let body = resp.text().await.unwrap();
    (
        sent,
        Answer {
            actions,
            wait_ms,
            refused,
            body,
        },
    )
}

/// A tool result that says it is rate limited with a `Retry-After` of one second: the core
/// retries after at least that wait, and the model call — after which the agent calls the
/// tool again — reaches the upstream no earlier than one second after the result was sent,
/// whole or streamed. Before, it was sent at once, and the agent called the tool again into
/// the same rate limit.
#[tokio::test]
async fn a_rate_limited_tools_retry_waits_out_its_retry_after() {
    for stream in [false, true] {
        let (url, seen) = upstream().await;
        let base = gateway(GatewayConfig::for_upstream(url)).await;
        let limited = "Error: 429 Too Many Requests (Retry-After: 1)";
        let (sent, answer) = send(&base, &conversation(limited, stream)).await;
        let seen = seen.lock().unwrap();
        let (arrived, request) = seen.first().expect("the model was called");
        let held = arrived.duration_since(sent);
        assert!(
            held >= Duration::from_millis(1_000),
            "stream {stream}: the model call came {held:?} after the rate-limited result"
        );
        assert!(
            guidance_seen(request).contains("call it again with the same arguments"),
            "{request}"
        );
        assert!(
            answer.actions.split(',').any(|a| a == "wait"),
            "{}",
            answer.actions
        );
        let wait: u64 = answer.wait_ms.as_deref().unwrap_or("0").parse().unwrap();
        assert!(wait >= 1_000, "x-selfheal-wait-ms: {wait}");
        assert_eq!(answer.refused, None);
        assert!(answer.body.contains("\"wait\""), "{}", answer.body);
    }
}

/// A `Retry-After` longer than the gateway holds a request (`[limits] max_wait_ms`) is not
/// shortened to fit: the request is not held, the core's ladder moves past the retry (here to
/// a replan: `search` has no configured substitute), the model is told not to call the tool
/// again now, and the answer says which wait was refused.
#[tokio::test]
async fn a_wait_longer_than_the_gateway_may_hold_is_reported_not_shortened() {
    let (url, seen) = upstream().await;
    let mut config = GatewayConfig::for_upstream(url);
    config.limits.max_wait_ms = 2_000;
    let base = gateway(config).await;
    let limited = "Error: 429 Too Many Requests (Retry-After: 60)";
    let (_, answer) = send(&base, &conversation(limited, false)).await;
    let seen = seen.lock().unwrap();
    let guidance = guidance_seen(&seen.first().expect("the model was called").1);
    assert!(
        !guidance.contains("call it again with the same arguments"),
        "no retry: {guidance}"
    );
    assert!(guidance.contains("rethink your plan"), "{guidance}");
    assert!(
        guidance.contains("asked not to be called again for 60 s"),
        "{guidance}"
    );
    assert_eq!(answer.wait_ms, None, "not held");
    assert!(
        !answer.actions.split(',').any(|a| a == "wait"),
        "{}",
        answer.actions
    );
    assert_eq!(answer.refused.as_deref(), Some("search=60000"));
}
