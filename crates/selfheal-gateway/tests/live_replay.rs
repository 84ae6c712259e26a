//! Real traffic as fixtures (issue 31, item 6): request/response pairs recorded from a real
//! local model (Qwen2.5-Coder-1.5B-Instruct Q4_K_M under llama-server, each fixture labelled
//! with the GGUF's sha256; `scripts/record-live-fixtures.py` records them), replayed through the
//! gateway by a replay upstream — a real HTTP server on 127.0.0.1, port 0 — so the healers are
//! tested on what a real model writes, without the model. A whole answer is served for a
//! request that does not stream, the raw SSE bytes of the same shape's stream for one that
//! does (a re-ask is asked without streaming, and gets the whole answer).

// Test helpers outside `#[test]` functions may panic: a panic is a test failure here.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post as route_post;
use serde_json::{Value, json};
use tokio::net::TcpListener;

use selfheal_gateway::GatewayConfig;

mod common;
use common::gateway;

const SHA256: &str = "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046";

/// One recorded pair.
#[derive(Clone)]
struct Fixture {
    request: Value,
    status: u16,
    content_type: String,
    body: String,
}

/// The fixtures of one shape: the whole answer and the stream.
#[derive(Clone, Default)]
struct Shape {
    whole: Option<Fixture>,
    stream: Option<Fixture>,
}

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/live")
}

/// Every shape recorded, by name; each fixture checked for its label.
fn shapes() -> BTreeMap<String, Shape> {
    let mut out: BTreeMap<String, Shape> = BTreeMap::new();
    for entry in std::fs::read_dir(dir()).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().and_then(|e| e.to_str()) != Some("json") {
            continue;
        }
        let v: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        assert_eq!(
            v["gguf_sha256"], SHA256,
            "{path:?} is labelled with its model"
        );
        assert!(
            v["model"]
                .as_str()
                .is_some_and(|m| m.contains("qwen2.5-coder-1.5b"))
        );
        let f = Fixture {
            request: v["request"].clone(),
            status: v["response"]["status"].as_u64().unwrap() as u16,
            content_type: v["response"]["content_type"].as_str().unwrap().to_owned(),
            body: v["response"]["body"].as_str().unwrap().to_owned(),
        };
        let shape = out
            .entry(v["shape"].as_str().unwrap().to_owned())
            .or_default();
        if f.request["stream"] == true {
            shape.stream = Some(f);
        } else {
            shape.whole = Some(f);
        }
    }
    out
}

#[derive(Default)]
struct Replay {
    shape: Shape,
    /// Every request the gateway sent upstream.
    seen: Vec<Value>,
}

async fn replay(State(s): State<Arc<Mutex<Replay>>>, body: axum::Json<Value>) -> Response {
    let mut s = s.lock().unwrap();
    let stream = body.0["stream"] == true;
    s.seen.push(body.0);
    let f = if stream {
        &s.shape.stream
    } else {
        &s.shape.whole
    };
    let Some(f) = f.clone().or_else(|| s.shape.whole.clone()) else {
        return (StatusCode::INTERNAL_SERVER_ERROR, "no fixture").into_response();
    };
    let mut r = (StatusCode::from_u16(f.status).unwrap(), f.body).into_response();
    r.headers_mut()
        .insert(header::CONTENT_TYPE, f.content_type.parse().unwrap());
    r
}

/// The replay upstream for `shape` on 127.0.0.1, port 0.
async fn upstream(shape: Shape) -> (String, Arc<Mutex<Replay>>) {
    let shared = Arc::new(Mutex::new(Replay {
        shape,
        seen: Vec::new(),
    }));
    let app = Router::new()
        .route("/v1/chat/completions", route_post(replay))
        .with_state(shared.clone());
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (format!("http://{addr}/v1"), shared)
}

/// What a client got: the assistant's text, its tool calls, and the `selfheal` report.
struct Got {
    text: String,
    calls: Vec<Value>,
    report: Value,
    finish: Value,
}

fn read_answer(stream: bool, body: &str) -> Got {
    if !stream {
        let v: Value = serde_json::from_str(body).unwrap();
        let m = &v["choices"][0]["message"];
        return Got {
            text: m["content"].as_str().unwrap_or_default().to_owned(),
            calls: m["tool_calls"].as_array().cloned().unwrap_or_default(),
            report: v["selfheal"].clone(),
            finish: v["choices"][0]["finish_reason"].clone(),
        };
    }
    let events: Vec<Value> = body
        .split("\n\n")
        .filter_map(|e| e.lines().find_map(|l| l.strip_prefix("data: ")))
        .filter_map(|d| serde_json::from_str(d).ok())
        .collect();
    let text = events
        .iter()
        .filter_map(|e| e["choices"][0]["delta"]["content"].as_str())
        .collect();
    // Streamed calls: fragments by index, the arguments concatenated.
    let mut calls: BTreeMap<u64, Value> = BTreeMap::new();
    for e in &events {
        for c in e["choices"][0]["delta"]["tool_calls"]
            .as_array()
            .into_iter()
            .flatten()
        {
            let i = c["index"].as_u64().unwrap_or(0);
            let slot = calls
                .entry(i)
                .or_insert_with(|| json!({"function": {"name": "", "arguments": ""}}));
            if let Some(n) = c["function"]["name"].as_str() {
                slot["function"]["name"] = json!(n);
            }
            if let Some(a) = c["function"]["arguments"].as_str() {
                let so_far = slot["function"]["arguments"].as_str().unwrap().to_owned();
                slot["function"]["arguments"] = json!(so_far + a);
            }
        }
    }
    Got {
        text,
        calls: calls.into_values().collect(),
        report: events
            .iter()
            .rev()
            .find_map(|e| e.get("selfheal"))
            .cloned()
            .unwrap_or(Value::Null),
        finish: events
            .iter()
            .rev()
            .find_map(|e| e["choices"][0]["finish_reason"].as_str().map(|f| json!(f)))
            .unwrap_or(Value::Null),
    }
}

/// Whether `args` fit the offered tool `name`'s schema: an object, every required key present,
/// each property of the JSON type declared.
fn fits(request: &Value, name: &str, args: &Value) -> bool {
    let Some(tool) = request["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["function"]["name"] == name)
    else {
        return false;
    };
    let schema = &tool["function"]["parameters"];
    let Some(obj) = args.as_object() else {
        return false;
    };
    let required = schema["required"].as_array().cloned().unwrap_or_default();
    required
        .iter()
        .all(|k| obj.contains_key(k.as_str().unwrap_or_default()))
        && obj
            .iter()
            .all(|(k, v)| match schema["properties"][k]["type"].as_str() {
                Some("string") => v.is_string(),
                Some("number") => v.is_number(),
                _ => true,
            })
}

/// Replays `shape`'s request (streamed or not) through the gateway.
async fn through_gateway(shape: &Shape, stream: bool) -> (Got, Value, Vec<Value>) {
    let f = if stream { &shape.stream } else { &shape.whole };
    let request = f.as_ref().unwrap().request.clone();
    let (url, shared) = upstream(shape.clone()).await;
    let gw = gateway(GatewayConfig::for_upstream(url)).await;
    let resp = reqwest::Client::new()
        .post(format!("{gw}/chat/completions"))
        .json(&request)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let body = resp.text().await.unwrap();
    let got = read_answer(stream, &body);
    let seen = shared.lock().unwrap().seen.clone();
    (got, request, seen)
}

/// Every recorded shape, streamed and not, through the gateway: whatever the model wrote, what
/// the client gets holds — every tool call names an offered tool with arguments that parse and
/// fit its schema, a call is never left in the text (a text that still writes a call of an
/// offered tool is `partial`), and an answer that is not a call carries a status.
#[tokio::test]
async fn every_recorded_answer_comes_out_usable_or_flagged() {
    let shapes = shapes();
    assert!(
        shapes.len() >= 6,
        "the fixtures are recorded: {}",
        shapes.len()
    );
    for (name, shape) in &shapes {
        for stream in [false, true] {
            let (got, request, _) = through_gateway(shape, stream).await;
            let status = got.report["status"].as_str().unwrap_or_default().to_owned();
            assert!(
                ["complete", "partial"].contains(&status.as_str()),
                "{name} stream {stream}: {:?}",
                got.report
            );
            for c in &got.calls {
                let tool = c["function"]["name"].as_str().unwrap();
                let args: Value =
                    serde_json::from_str(c["function"]["arguments"].as_str().unwrap()).unwrap();
                assert!(fits(&request, tool, &args), "{name} stream {stream}: {c}");
            }
            if !got.calls.is_empty() {
                assert_eq!(got.finish, "tool_calls", "{name} stream {stream}");
            }
            let offered: Vec<&str> = request["tools"]
                .as_array()
                .unwrap()
                .iter()
                .filter_map(|t| t["function"]["name"].as_str())
                .collect();
            if got.calls.is_empty()
                && !matches!(
                    selfheal_repair::find_text_calls(&got.text, &offered),
                    selfheal_repair::TextCalls::None
                )
            {
                assert_eq!(
                    status, "partial",
                    "{name} stream {stream}: a call left as text"
                );
            }
        }
    }
}

/// What each recorded shape must come out as, streamed and not: the tool the salvaged call
/// names (the model wrote it fenced, bare, with doubled braces — `{{…}}` and even `{{…}` — or
/// followed by newlines padding to `max_tokens`), or, for a final answer, its status.
#[tokio::test]
async fn each_recorded_shape_is_healed_as_it_must_be() {
    let shapes = shapes();
    // The call the model wrote as text, taken as a structured call, `salvage` recorded.
    let calls = [
        ("fenced_call", "get_weather"),
        ("fenced_call_required", "convert_currency"),
        ("after_result", "calc_multiply"),
        ("soft_error", "calculate"),
    ];
    for (shape, tool) in calls {
        let Some(s) = shapes.get(shape) else {
            panic!("{shape} is recorded")
        };
        for stream in [false, true] {
            let (got, _, _) = through_gateway(s, stream).await;
            assert_eq!(
                got.calls.len(),
                1,
                "{shape} stream {stream}: {:?}",
                got.report
            );
            assert_eq!(
                got.calls[0]["function"]["name"], tool,
                "{shape} stream {stream}"
            );
            let actions = got.report["actions"].to_string();
            assert!(
                actions.contains("salvage"),
                "{shape} stream {stream}: {actions}"
            );
            // The padding after the call is not handed on as content.
            assert!(
                got.text.trim().is_empty() || got.text.len() < 40,
                "{shape} stream {stream}: {:?}",
                got.text
            );
        }
    }
    // A final answer whose number is a tool's result is claimed.
    for stream in [false, true] {
        let (got, _, _) = through_gateway(&shapes["final_answer"], stream).await;
        assert!(got.calls.is_empty());
        assert_eq!(got.text.trim(), "271.075");
        assert_eq!(
            got.report["status"], "complete",
            "stream {stream}: {}",
            got.report
        );
    }
    // The same call again, arguments and all, right after its result (`{{…}` on one side, a
    // fence on the other): the repeat is not forwarded as a call of the model's next step.
    for shape in ["repeated_call", "repeat_after_result"] {
        for stream in [false, true] {
            let (got, _, seen) = through_gateway(&shapes[shape], stream).await;
            assert!(
                got.calls.is_empty() || got.report["status"] == "partial",
                "{shape} stream {stream}: {:?} {}",
                got.calls,
                got.report
            );
            assert!(
                seen.len() >= 2,
                "{shape} stream {stream}: the repeat is re-asked"
            );
        }
    }
    // `tool_choice: "required"` on a prompt that needs no tool: the model calls a tool that is
    // not on offer (`say_hello`) and pads with newlines to `max_tokens`. A name not on offer is
    // never salvaged, and what goes out is not claimed complete.
    for stream in [false, true] {
        let (got, _, _) = through_gateway(&shapes["padding_required"], stream).await;
        assert!(
            got.calls
                .iter()
                .all(|c| c["function"]["name"] != "say_hello"),
            "stream {stream}: {:?}",
            got.calls
        );
        assert_eq!(
            got.report["status"], "partial",
            "stream {stream}: {}",
            got.report
        );
    }
}
