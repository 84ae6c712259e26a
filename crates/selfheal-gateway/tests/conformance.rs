//! The core's conformance table of the seeds' tool-health rules (`selfheal_core::conformance`)
//! run through the gateway's wire run: the same rows every front-end runs through its own
//! adapter, here as requests of one conversation through the whole router, on the chat API
//! and on `/v1/responses`.
//!
//! Each line of a row is one request: the conversation so far, with one more assistant call of
//! the line's tool and its result as the client's agent would send it (an answer, an
//! `{"error": ...}` body, or an error text for a tool that raised). What the line led to is
//! what the scripted upstream model was sent — the gateway's guidance (its `[selfheal]`
//! system message on chat, in `instructions` on Responses) and the tools still offered — or, when the upstream was not asked, the
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

use selfheal_core::{
    RunStatus,
    conformance::{self, Outcome, Row, Seen},
};
use selfheal_gateway::{AppState, GatewayConfig, TraceWriter, router};

mod common;

/// The requests the upstream model was sent; it answers each in words.
type Sent = Arc<Mutex<Vec<Value>>>;

async fn upstream_chat(State(s): State<Sent>, body: axum::Json<Value>) -> axum::Json<Value> {
    s.lock().unwrap().push(body.0);
    axum::Json(
        json!({"id": "x", "object": "chat.completion", "created": 0, "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "the page says hi"},
                     "finish_reason": "stop"}]}),
    )
}

async fn upstream_responses(State(s): State<Sent>, body: axum::Json<Value>) -> axum::Json<Value> {
    s.lock().unwrap().push(body.0);
    axum::Json(
        json!({"id": "resp_1", "object": "response", "created_at": 0, "model": "m",
        "status": "completed", "output": [{"type": "message", "id": "msg_1", "role": "assistant",
        "status": "completed", "content": [{"type": "output_text", "text": "the page says hi",
                                            "annotations": []}]}]}),
    )
}

/// The API the client's agent speaks.
#[derive(Debug, Clone, Copy)]
enum Api {
    Chat,
    Responses,
}

impl Api {
    fn path(self) -> &'static str {
        match self {
            Api::Chat => "/v1/chat/completions",
            Api::Responses => "/v1/responses",
        }
    }

    /// The row's tools as this API offers them.
    fn tools(self, row: &Row) -> Value {
        let params = json!({"type": "object", "properties": {"q": {"type": "string"}}});
        row.offered
            .iter()
            .map(|t| match self {
                Api::Chat => {
                    json!({"type": "function", "function": {"name": t, "parameters": params}})
                }
                Api::Responses => json!({"type": "function", "name": t, "parameters": params}),
            })
            .collect()
    }

    /// The conversation's opening.
    fn opening(self) -> Vec<Value> {
        vec![json!({"role": "user", "content": "What does the page say?"})]
    }

    /// One call of `tool` and its result, as the client's agent sends them.
    fn turn(self, id: &str, tool: &str, args: &Value, result: &str) -> [Value; 2] {
        match self {
            Api::Chat => [
                json!({"role": "assistant", "content": null, "tool_calls": [
                    {"id": id, "type": "function",
                     "function": {"name": tool, "arguments": args.to_string()}}]}),
                json!({"role": "tool", "tool_call_id": id, "content": result}),
            ],
            Api::Responses => [
                json!({"type": "function_call", "call_id": id, "name": tool,
                       "arguments": args.to_string()}),
                json!({"type": "function_call_output", "call_id": id, "output": result}),
            ],
        }
    }

    fn body(self, row: &Row, conversation: &[Value]) -> Value {
        match self {
            Api::Chat => json!({"model": "m", "messages": conversation, "tools": self.tools(row)}),
            Api::Responses => {
                json!({"model": "m", "input": conversation, "tools": self.tools(row)})
            }
        }
    }

    /// What the upstream model was told (the gateway's guidance) and offered.
    fn shown(self, request: &Value) -> (String, Vec<String>) {
        let told = match self {
            Api::Chat => common::guidance_seen(request),
            Api::Responses => request["instructions"].as_str().unwrap_or("").to_owned(),
        };
        let offered = request["tools"]
            .as_array()
            .map(|ts| {
                ts.iter()
                    .filter_map(|t| match self {
                        Api::Chat => t["function"]["name"].as_str(),
                        Api::Responses => t["name"].as_str(),
                    })
                    .map(str::to_owned)
                    .collect()
            })
            .unwrap_or_default();
        (told, offered)
    }
}

/// The result text a client sends for an outcome.
fn result_text(outcome: Outcome) -> String {
    match (outcome.value(), outcome.error()) {
        (_, Some(e)) => format!("Error: {e}"),
        (Some(v), None) => v.to_string(),
        (None, None) => unreachable!("every outcome answers or raises"),
    }
}

/// Sends the conversation; the run's status header.
async fn send(app: &Router, api: Api, row: &Row, conversation: &[Value]) -> String {
    let req = Request::post(api.path())
        .header("content-type", "application/json")
        .header("x-selfheal-run", "conformance")
        .body(Body::from(api.body(row, conversation).to_string()))
        .unwrap();
    let resp = app.clone().oneshot(req).await.unwrap();
    let status = resp
        .headers()
        .get("x-selfheal-status")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    let _ = resp.into_body().collect().await.unwrap();
    status
}

fn status_of(header: &str) -> RunStatus {
    match header {
        "complete" => RunStatus::Complete,
        "partial" => RunStatus::Partial,
        "failed" => RunStatus::Failed,
        other => panic!("x-selfheal-status {other:?}"),
    }
}

async fn play(api: Api, row: &Row) -> Result<(), String> {
    let sent: Sent = Arc::default();
    let model = Router::new()
        .route("/v1/chat/completions", post(upstream_chat))
        .route("/v1/responses", post(upstream_responses))
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
    let mut conversation = api.opening();
    let mut seen = Vec::new();
    let mut finished = None;
    for (i, line) in row.script.iter().enumerate() {
        let id = format!("call_{i}");
        conversation.extend(api.turn(
            &id,
            &line.tool,
            &conformance::args(i),
            &result_text(line.result),
        ));
        let before = sent.lock().unwrap().len();
        let status = send(&app, api, row, &conversation).await;
        let asked: Vec<Value> = sent.lock().unwrap()[before..].to_vec();
        let Some(request) = asked.last() else {
            seen.push(Seen::Stopped);
            finished = Some(status_of(&status));
            break;
        };
        let (told, offered) = api.shown(request);
        seen.push(Seen::Going {
            warned: conformance::warned_in(&told, &row.offered),
            hidden: row
                .offered
                .iter()
                .filter(|t| !offered.contains(t))
                .cloned()
                .collect(),
            told,
        });
        // The client's agent goes on with the row's next call, not with this answer.
    }
    let finished = match finished {
        Some(f) => f,
        None => status_of(&send(&app, api, row, &conversation).await),
    };
    conformance::judge(row, &seen, finished).map_err(|e| format!("{api:?}: {e}"))
}

#[tokio::test]
async fn the_seeds_monitor_rules_hold_through_the_gateways_wire_run() {
    let rows = conformance::table().unwrap();
    assert!(rows.len() >= 5);
    let mut failed = Vec::new();
    for api in [Api::Chat, Api::Responses] {
        for row in &rows {
            if let Err(e) = play(api, row).await {
                failed.push(e);
            }
        }
    }
    assert!(failed.is_empty(), "the gateway:\n{}", failed.join("\n"));
}
