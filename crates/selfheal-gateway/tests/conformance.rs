//! The core's conformance table of the seeds' tool-health rules (`selfheal_core::conformance`)
//! run through the gateway's wire run: the same rows every front-end runs through its own
//! adapter, here as chat requests of one conversation through the whole router.
//!
//! Each line of a row is one request: the conversation so far, with one more assistant call of
//! the line's tool and its result as the client's agent would send it (an answer, an
//! `{"error": ...}` body, or an error text for a tool that raised). What the line led to is
//! what the scripted upstream model was sent — the gateway's guidance (its `[selfheal]`
//! system message) and the tools still offered — or, when the upstream was not asked, the
//! stop the gateway answered with. After the script, the model answers in words and the
//! answer's `x-selfheal-status` is the status the run finished with.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::Request;
use axum::routing::post;
use http_body_util::BodyExt;
use serde_json::{Value, json};
use tower::ServiceExt;

use selfheal_core::conformance::{self, Outcome, Row, Seen};
use selfheal_core::trace::RunStatus;
use selfheal_gateway::{AppState, GatewayConfig, TraceWriter, router};

mod common;

/// The requests the upstream model was sent; it answers each in words.
type Sent = Arc<Mutex<Vec<Value>>>;

async fn upstream(State(s): State<Sent>, body: axum::Json<Value>) -> axum::Json<Value> {
    s.lock().unwrap().push(body.0);
    axum::Json(
        json!({"id": "x", "object": "chat.completion", "created": 0, "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "the page says hi"},
                     "finish_reason": "stop"}]}),
    )
}

/// The result text a chat client sends for an outcome.
fn result_text(outcome: Outcome) -> String {
    match (outcome.value(), outcome.error()) {
        (_, Some(e)) => format!("Error: {e}"),
        (Some(v), None) => v.to_string(),
        (None, None) => unreachable!("every outcome answers or raises"),
    }
}

fn tools(row: &Row) -> Value {
    row.offered
        .iter()
        .map(|t| {
            json!({"type": "function", "function": {"name": t, "parameters": {
                "type": "object", "properties": {"q": {"type": "string"}}}}})
        })
        .collect()
}

async fn send(app: &Router, row: &Row, messages: &[Value]) -> (Value, String) {
    let body = json!({"model": "m", "messages": messages, "tools": tools(row)});
    let req = Request::post("/v1/chat/completions")
        .header("content-type", "application/json")
        .header("x-selfheal-run", "conformance")
        .body(Body::from(body.to_string()))
        .unwrap();
    let resp = app.clone().oneshot(req).await.unwrap();
    let status = resp
        .headers()
        .get("x-selfheal-status")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    (
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        status,
    )
}

fn status_of(header: &str) -> RunStatus {
    match header {
        "complete" => RunStatus::Complete,
        "partial" => RunStatus::Partial,
        "failed" => RunStatus::Failed,
        other => panic!("x-selfheal-status {other:?}"),
    }
}

async fn play(row: &Row) -> Result<(), String> {
    let sent: Sent = Arc::default();
    let model = Router::new()
        .route("/v1/chat/completions", post(upstream))
        .with_state(sent.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, model).await });
    let app = router(Arc::new(
        AppState::new(
            GatewayConfig::for_upstream(format!("http://{addr}/v1")),
            TraceWriter::disabled(),
        )
        .unwrap(),
    ));
    let mut messages = vec![json!({"role": "user", "content": "What does the page say?"})];
    let mut seen = Vec::new();
    let mut finished = None;
    for (i, line) in row.script.iter().enumerate() {
        let id = format!("call_{i}");
        messages.push(json!({"role": "assistant", "content": null, "tool_calls": [
            {"id": id, "type": "function",
             "function": {"name": line.tool, "arguments": conformance::args(i).to_string()}}]}));
        messages
            .push(json!({"role": "tool", "tool_call_id": id, "content": result_text(line.result)}));
        let before = sent.lock().unwrap().len();
        let (_, status) = send(&app, row, &messages).await;
        let asked: Vec<Value> = sent.lock().unwrap()[before..].to_vec();
        let Some(request) = asked.last() else {
            seen.push(Seen::Stopped);
            finished = Some(status_of(&status));
            break;
        };
        let told = common::guidance_seen(request);
        let offered: Vec<&str> = request["tools"]
            .as_array()
            .map(|ts| {
                ts.iter()
                    .filter_map(|t| t["function"]["name"].as_str())
                    .collect()
            })
            .unwrap_or_default();
        seen.push(Seen::Going {
            warned: conformance::warned_in(&told, &row.offered),
            hidden: row
                .offered
                .iter()
                .filter(|t| !offered.contains(&t.as_str()))
                .cloned()
                .collect(),
            told,
        });
        // The client's agent goes on with the row's next call, not with this answer.
    }
    let finished = match finished {
        Some(f) => f,
        None => {
            let (_, status) = send(&app, row, &messages).await;
            status_of(&status)
        }
    };
    conformance::judge(row, &seen, finished)
}

#[tokio::test]
async fn the_seeds_monitor_rules_hold_through_the_gateways_wire_run() {
    let rows = conformance::table().unwrap();
    assert!(rows.len() >= 5);
    let mut failed = Vec::new();
    for row in &rows {
        if let Err(e) = play(row).await {
            failed.push(e);
        }
    }
    assert!(failed.is_empty(), "the gateway:\n{}", failed.join("\n"));
}
