//! Property tests of the Responses stream relay on hostile upstream streams: any mix of
//! preamble, text deltas, function-call items (whole, cut, with garbage arguments), odd shapes,
//! `error` and `response.failed` events and terminal events, cut at any byte. The relay never
//! panics, and the client's stream always ends in exactly one way: one terminal event
//! (`response.completed`/`response.incomplete`, carrying the `selfheal` report) or one `error`
//! event — never a clean end without either, never both. Every function call the client is
//! shown has arguments that are a JSON object, and sequence numbers count up from 0.

// Test helpers outside `#[test]` functions may panic: a panic is a test failure here.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;

use bytes::Bytes;
use proptest::prelude::*;
use serde_json::{Value, json};
use tokio::sync::mpsc;

use selfheal_gateway::{GuideCache, ToolIndex, ToolSpec};
use selfheal_gateway::{ResponsesHooks as Hooks, relay_responses as relay};

fn event() -> impl Strategy<Value = String> {
    let item = |i: u64| {
        json!({"type": "function_call", "id": format!("fc{i}"), "call_id": format!("c{i}"),
               "name": "f", "arguments": "", "status": "in_progress"})
    };
    prop_oneof![
        Just(json!({"type": "response.created", "response": {"id": "r", "output": []}})),
        Just(json!({"type": "response.in_progress", "response": {"id": "r"}})),
        Just(
            json!({"type": "response.output_item.added", "output_index": 0,
                    "item": {"type": "message", "id": "m", "content": []}})
        ),
        "[a-z ]{0,12}".prop_map(|t| json!({"type": "response.output_text.delta",
                                           "output_index": 0, "delta": t})),
        (1u64..3).prop_map(move |i| json!({"type": "response.output_item.added",
                                           "output_index": i, "item": item(i)})),
        (1u64..3, "[a-z{}\":,0-9]{0,10}").prop_map(|(i, a)| json!({
            "type": "response.function_call_arguments.delta", "output_index": i, "delta": a})),
        (1u64..3, "[a-z{}\":,0-9]{0,10}").prop_map(move |(i, a)| {
            let mut done = item(i);
            done["arguments"] = json!(a);
            done["status"] = json!("completed");
            json!({"type": "response.output_item.done", "output_index": i, "item": done})
        }),
        Just(json!({"type": "response.completed",
                    "response": {"id": "r", "status": "completed", "output": []}})),
        Just(
            json!({"type": "response.incomplete", "response": {"id": "r",
                    "status": "incomplete", "incomplete_details": {"reason": "max_output_tokens"},
                    "output": []}})
        ),
        Just(json!({"type": "response.failed", "response": {"error": {"message": "down"}}})),
        Just(json!({"type": "error", "code": "server_error", "message": "overloaded"})),
        Just(json!({"type": "response.output_text.delta", "output_index": "x", "delta": 5})),
        Just(json!([1, 2])),
        Just(json!(5)),
    ]
    .prop_map(|v| v.to_string())
}

fn tools() -> ToolIndex {
    let parameters = json!({"type": "object"});
    let mut t = ToolIndex::new();
    t.insert(
        "f".into(),
        ToolSpec {
            schema_key: parameters.to_string(),
            required: Vec::new(),
            parameters,
        },
    );
    t
}

/// The events the client gets for an upstream body cut into pieces at `cuts`.
fn run(body: Vec<u8>, cuts: Vec<usize>) -> Vec<Value> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let mut pieces = Vec::new();
        let mut last = 0;
        let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c % (body.len() + 1)).collect();
        cuts.sort_unstable();
        for c in cuts {
            pieces.push(Ok::<_, std::io::Error>(Bytes::copy_from_slice(
                &body[last..c],
            )));
            last = c;
        }
        pieces.push(Ok(Bytes::copy_from_slice(&body[last..])));
        let http = axum::http::Response::builder()
            .header("content-type", "text/event-stream")
            .body(reqwest::Body::wrap_stream(futures_util::stream::iter(
                pieces,
            )))
            .unwrap();
        let (tx, mut rx) = mpsc::channel(1024);
        relay(
            reqwest::Response::from(http),
            Arc::new(tools()),
            Arc::new(GuideCache::default()),
            Some(json!({"status": "complete", "actions": []})),
            Hooks::default(),
            &tx,
        )
        .await;
        drop(tx);
        let mut events = Vec::new();
        while let Some(f) = rx.recv().await {
            let text = String::from_utf8(f.unwrap().to_vec()).unwrap();
            assert!(text.ends_with("\n\n"), "{text:?}");
            let data = text.lines().find_map(|l| l.strip_prefix("data: ")).unwrap();
            events.push(serde_json::from_str(data).unwrap());
        }
        events
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn any_responses_stream_ends_in_one_terminal_event_or_one_error_event(
        events in proptest::collection::vec(event(), 0..14),
        crlf in any::<bool>(),
        cuts in proptest::collection::vec(any::<usize>(), 0..6),
    ) {
        let sep = if crlf { "\r\n\r\n" } else { "\n\n" };
        let body: String = events.iter().map(|e| format!("event: x{sep}data: {e}{sep}")).collect();
        let out = run(body.into_bytes(), cuts);
        let ty = |e: &Value| e.get("type").and_then(Value::as_str).unwrap_or("").to_owned();
        let terminal = out.iter().filter(|e| {
            matches!(ty(e).as_str(), "response.completed" | "response.incomplete")
        }).count();
        let errors = out.iter().filter(|e| ty(e) == "error").count();
        let last = out.last().cloned().unwrap_or(Value::Null);
        prop_assert_eq!(terminal + errors, 1, "{:?}", out);
        if terminal == 1 {
            prop_assert!(last.pointer("/response/selfheal").is_some(), "{:?}", out);
        } else {
            prop_assert_eq!(ty(&last), "error");
            prop_assert_eq!(&last["error"]["code"], "stream_broken");
        }
        let seq: Vec<u64> = out.iter().filter_map(|e| e["sequence_number"].as_u64()).collect();
        prop_assert_eq!(seq, (0..out.len() as u64).collect::<Vec<_>>());
        for e in &out {
            let args = match ty(e).as_str() {
                "response.function_call_arguments.done" => e.get("arguments").cloned(),
                "response.output_item.done" if e["item"]["type"] == "function_call" => {
                    e["item"].get("arguments").cloned()
                }
                _ => None,
            };
            if let Some(a) = args {
                let parsed: Option<Value> = a.as_str().and_then(|s| serde_json::from_str(s).ok());
                prop_assert!(parsed.is_some_and(|v| v.is_object()), "{:?}", e);
            }
        }
    }
}
