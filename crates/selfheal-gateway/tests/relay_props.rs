//! Property tests of the SSE relay on hostile upstream streams: any mix of valid chunks,
//! garbage, odd shapes (`choices` as an object or a number), tool-call deltas, error events and
//! `[DONE]`, cut at any byte. The relay never panics, and the client's stream always ends in
//! exactly one way: `[DONE]` after a finish, or an error event — never a clean end without a
//! finish, never both.

// Test helpers outside `#[test]` functions may panic: a panic is a test failure here.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;

use bytes::Bytes;
use proptest::prelude::*;
use serde_json::json;
use tokio::sync::mpsc;

use selfheal_gateway::{ChatHooks as Hooks, relay_chat as relay};
use selfheal_gateway::{GuideCache, ToolIndex};

fn event() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-z ]{0,12}".prop_map(|t| json!({"id": "c", "choices": [{"index": 0,
            "delta": {"content": t}, "finish_reason": null}]})
        .to_string()),
        Just(
            json!({"id": "c", "choices": [{"index": 0, "delta": {"role": "assistant"},
            "finish_reason": null}]})
            .to_string()
        ),
        (0u64..3, "[a-z{}\":,]{0,10}").prop_map(|(i, a)| {
            json!({"id": "c", "choices": [{"index": 0,
            "delta": {"tool_calls": [{"index": i, "id": format!("t{i}"),
                "function": {"name": "f", "arguments": a}}]}, "finish_reason": null}]})
            .to_string()
        }),
        prop_oneof![Just("stop"), Just("tool_calls"), Just("length")].prop_map(|f| json!({
            "id": "c", "choices": [{"index": 0, "delta": {}, "finish_reason": f}]})
        .to_string()),
        Just(
            json!({"choices": {"0": {"delta": {"content": "x"}, "finish_reason": "stop"}}})
                .to_string()
        ),
        Just(json!({"choices": 7}).to_string()),
        Just(json!([1, 2]).to_string()),
        Just("5".to_string()),
        Just(json!({"error": {"message": "overloaded"}}).to_string()),
        Just("{not json".to_string()),
        Just("[DONE]".to_string()),
    ]
}

fn run(body: Vec<u8>, cuts: Vec<usize>) -> (Vec<String>, bool) {
    run_as("text/event-stream", body, cuts)
}

/// The frames the client gets for an upstream answer of `content_type` whose body is `body`,
/// cut into pieces at `cuts`; and whether the relay saw a finish.
fn run_as(content_type: &str, body: Vec<u8>, cuts: Vec<usize>) -> (Vec<String>, bool) {
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
            .header("content-type", content_type)
            .body(reqwest::Body::wrap_stream(futures_util::stream::iter(
                pieces,
            )))
            .unwrap();
        let upstream = reqwest::Response::from(http);
        let (tx, mut rx) = mpsc::channel(1024);
        let report = relay(
            upstream,
            Arc::new(ToolIndex::new()),
            Arc::new(GuideCache::default()),
            Some(json!({"status": "complete", "actions": []})),
            Hooks::default(),
            &tx,
        )
        .await;
        drop(tx);
        let mut frames = Vec::new();
        while let Some(f) = rx.recv().await {
            frames.push(String::from_utf8(f.unwrap().to_vec()).unwrap());
        }
        (frames, report.finished)
    })
}

/// Issue 13, found by the `sse` fuzz target: a plain-JSON answer to a streaming request was
/// re-emitted as SSE ending in `[DONE]` twice.
#[test]
fn issue13_a_json_answer_to_a_stream_request_ends_in_one_done() {
    let answer = json!({"id": "x", "object": "chat.completion", "choices": [{"index": 0,
        "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}]});
    let (frames, finished) = run_as("application/json", answer.to_string().into_bytes(), vec![]);
    assert!(finished);
    let done = frames
        .iter()
        .filter(|f| f.as_str() == "data: [DONE]\n\n")
        .count();
    assert_eq!(done, 1, "{frames:?}");
    assert_eq!(frames.last().map(String::as_str), Some("data: [DONE]\n\n"));
    assert!(frames[0].contains("\"hi\""), "{frames:?}");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn any_upstream_stream_ends_in_done_after_a_finish_or_in_one_error_event(
        events in proptest::collection::vec(event(), 0..12),
        crlf in any::<bool>(),
        cuts in proptest::collection::vec(any::<usize>(), 0..6),
    ) {
        let sep = if crlf { "\r\n\r\n" } else { "\n\n" };
        let body: String = events.iter().map(|e| format!("data: {e}{sep}")).collect();
        let (frames, finished) = run(body.into_bytes(), cuts);
        let last = frames.last().cloned().unwrap_or_default();
        let errors = frames.iter().filter(|f| f.contains("\"stream_broken\"")).count();
        let done = frames.iter().filter(|f| f.as_str() == "data: [DONE]\n\n").count();
        if finished {
            prop_assert_eq!(last.as_str(), "data: [DONE]\n\n");
            prop_assert_eq!((errors, done), (0, 1));
            prop_assert!(frames.iter().any(|f| f.contains("\"selfheal\"")), "{:?}", frames);
        } else {
            prop_assert!(last.contains("\"stream_broken\""), "{:?}", frames);
            prop_assert_eq!((errors, done), (1, 0));
        }
    }
}
