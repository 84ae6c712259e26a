//! The scripted OpenAI-compatible server on 127.0.0.1:0 that the runtime's integration tests talk
//! to, and the helpers they share to script it and read what the agent did.
// Each test crate compiles this module and uses a subset of it.
#![allow(dead_code)]

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde_json::{Value, json};

use selfheal_core::ActionKind;
use selfheal_runtime::{Agent, ClientConfig, ModelClient, RunResult};

/// One scripted reply of the server.
#[derive(Clone)]
pub(crate) enum Reply {
    /// A JSON body with this status and, if given, a `Retry-After` header.
    Json(u16, Value, Option<&'static str>),
    /// A raw text body with this status.
    Raw(u16, &'static str),
    /// Sleeps this long, then answers "too late".
    Hang(Duration),
}

/// The replies still to give, the one given once they run out, and every request received.
#[derive(Default)]
pub(crate) struct Script {
    queue: VecDeque<Reply>,
    forever: Option<Reply>,
    requests: Vec<Value>,
}

pub(crate) type Shared = Arc<Mutex<Script>>;

async fn handler(State(s): State<Shared>, body: axum::body::Bytes) -> Response {
    let reply = {
        let mut s = s.lock().unwrap();
        s.requests
            .push(serde_json::from_slice(&body).unwrap_or(Value::Null));
        s.queue
            .pop_front()
            .or_else(|| s.forever.clone())
            .unwrap_or_else(|| {
                Reply::Json(500, json!({"error": {"message": "script empty"}}), None)
            })
    };
    match reply {
        Reply::Json(status, body, retry_after) => {
            let mut r = (StatusCode::from_u16(status).unwrap(), axum::Json(body)).into_response();
            if let Some(ra) = retry_after {
                r.headers_mut()
                    .insert("retry-after", HeaderValue::from_static(ra));
            }
            r
        }
        Reply::Raw(status, text) => (StatusCode::from_u16(status).unwrap(), text).into_response(),
        Reply::Hang(d) => {
            tokio::time::sleep(d).await;
            (StatusCode::OK, axum::Json(answer("too late"))).into_response()
        }
    }
}

/// Serves `app` on 127.0.0.1:0 in the background; returns its base URL (`http://…/v1`).
pub(crate) async fn serve(app: Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    format!("http://{addr}/v1")
}

/// A server that gives `replies` in turn, then `forever` to every request (or a 500 "script
/// empty" if there is none).
pub(crate) async fn server(replies: Vec<Reply>, forever: Option<Reply>) -> (String, Shared) {
    let shared: Shared = Arc::new(Mutex::new(Script {
        queue: replies.into(),
        forever,
        requests: Vec::new(),
    }));
    let app = Router::new()
        .route("/v1/chat/completions", post(handler))
        .with_state(shared.clone());
    (serve(app).await, shared)
}

/// A completion whose message is the final answer `text`.
pub(crate) fn answer(text: &str) -> Value {
    json!({"choices": [{"index": 0, "finish_reason": "stop",
        "message": {"role": "assistant", "content": text}}],
        "usage": {"total_tokens": 10}})
}

/// A completion whose message calls the tool `name` with the raw `args`.
pub(crate) fn call(name: &str, args: &str) -> Value {
    json!({"choices": [{"index": 0, "finish_reason": "tool_calls",
        "message": {"role": "assistant", "content": null, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": name, "arguments": args}}]}}],
        "usage": {"total_tokens": 20}})
}

/// A 200 with the body `v`.
pub(crate) fn ok(v: Value) -> Reply {
    Reply::Json(200, v, None)
}

/// An OpenAI-style error with this status and message.
pub(crate) fn err(status: u16, msg: &str) -> Reply {
    Reply::Json(status, json!({"error": {"message": msg}}), None)
}

/// A client of the server at `url` with this request timeout.
pub(crate) fn client(url: &str, timeout_ms: u64) -> ModelClient {
    let mut c = ClientConfig::new(url);
    c.timeout = Duration::from_millis(timeout_ms);
    ModelClient::new(c).unwrap()
}

/// `agent` with a 10 ms retry backoff and no jitter, so retries do not slow the tests.
pub(crate) fn fast(mut agent: Agent) -> Agent {
    agent.config.policy.retry.base_ms = 10;
    agent.config.policy.retry.jitter = 0.0;
    agent
}

/// The requests the server has received, in order.
pub(crate) fn requests(s: &Shared) -> Vec<Value> {
    s.lock().unwrap().requests.clone()
}

/// The last message of a request.
pub(crate) fn last_message(req: &Value) -> Value {
    req["messages"].as_array().unwrap().last().unwrap().clone()
}

/// How many times the run took an action of this kind.
pub(crate) fn took(r: &RunResult, kind: ActionKind) -> u64 {
    r.actions
        .iter()
        .find(|(k, _)| *k == kind)
        .map_or(0, |(_, n)| *n)
}
