//! Issue 31 on streams, in both grammars through the one relay: a final answer whose first
//! content opens a fence, a `{` or a call tag is held to its end; a call of an offered tool
//! written in it goes out as a structured call (chat's `tool_calls`, a Responses
//! `function_call` item) with `salvage` recorded; anything else goes out as it was, byte for
//! byte in its text — an answer in words is never held, a call of a tool not on offer is
//! never taken, and the held text is bounded.

// Test helpers outside `#[test]` functions may panic: a panic is a test failure here.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;

use proptest::prelude::*;
use serde_json::{Value, json};
use tokio::sync::mpsc;

use selfheal_gateway::{GuideCache, ToolIndex, ToolSpec};
use selfheal_gateway::{TextCallOpening as Opening, opens_text_call};

const FENCED: &str = "```json\n{\"name\": \"search\", \"arguments\": {\"query\": \"rust\"}}\n```";

fn tools() -> ToolIndex {
    let parameters = json!({"type": "object", "properties": {"query": {"type": "string"}},
        "required": ["query"]});
    let mut t = ToolIndex::new();
    t.insert(
        "search".into(),
        ToolSpec {
            schema_key: parameters.to_string(),
            required: vec!["query".into()],
            parameters,
        },
    );
    t
}

/// `text` cut into pieces at `cuts` (char boundaries).
fn pieces(text: &str, cuts: &[usize]) -> Vec<String> {
    let mut at: Vec<usize> = cuts
        .iter()
        .map(|c| c % (text.len() + 1))
        .filter(|c| text.is_char_boundary(*c))
        .collect();
    at.sort_unstable();
    at.dedup();
    let mut out = Vec::new();
    let mut last = 0;
    for c in at {
        out.push(text[last..c].to_owned());
        last = c;
    }
    out.push(text[last..].to_owned());
    out
}

fn upstream(body: String) -> reqwest::Response {
    let http = axum::http::Response::builder()
        .header("content-type", "text/event-stream")
        .body(reqwest::Body::from(body))
        .unwrap();
    reqwest::Response::from(http)
}

fn block_on<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(f)
}

/// The client's data payloads, parsed (`[DONE]` as a string).
async fn collect(mut rx: mpsc::Receiver<selfheal_gateway::Frame>) -> Vec<Value> {
    let mut out = Vec::new();
    while let Some(f) = rx.recv().await {
        let text = String::from_utf8(f.unwrap().to_vec()).unwrap();
        let data = text.lines().find_map(|l| l.strip_prefix("data: ")).unwrap();
        out.push(serde_json::from_str(data).unwrap_or_else(|_| json!(data)));
    }
    out
}

/// The chat stream a client gets for content streamed in `parts`, then `stop`.
fn chat(parts: &[String], salvage: bool) -> Vec<Value> {
    let mut body = String::new();
    let chunk = |delta: Value, finish: Value| {
        json!({"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
    };
    body.push_str(&format!(
        "data: {}\n\n",
        chunk(json!({"role": "assistant"}), Value::Null)
    ));
    for p in parts {
        body.push_str(&format!(
            "data: {}\n\n",
            chunk(json!({"content": p}), Value::Null)
        ));
    }
    body.push_str(&format!("data: {}\n\n", chunk(json!({}), json!("stop"))));
    body.push_str("data: [DONE]\n\n");
    block_on(async move {
        let (tx, rx) = mpsc::channel(4096);
        let hooks = selfheal_gateway::ChatHooks {
            salvage,
            ..Default::default()
        };
        selfheal_gateway::relay_chat(
            upstream(body),
            Arc::new(tools()),
            Arc::new(GuideCache::default()),
            Some(json!({"status": "complete", "actions": []})),
            hooks,
            &tx,
        )
        .await;
        drop(tx);
        collect(rx).await
    })
}

/// The text content a chat client got.
fn chat_text(out: &[Value]) -> String {
    out.iter()
        .filter_map(|c| {
            c.pointer("/choices/0/delta/content")
                .and_then(Value::as_str)
        })
        .collect()
}

/// The tool calls a chat client got: (name, arguments parsed, id).
fn chat_calls(out: &[Value]) -> Vec<(String, Value, String)> {
    out.iter()
        .filter_map(|c| {
            c.pointer("/choices/0/delta/tool_calls")
                .and_then(Value::as_array)
        })
        .flatten()
        .map(|c| {
            let args = c["function"]["arguments"].as_str().unwrap_or("");
            (
                c["function"]["name"].as_str().unwrap_or("").to_owned(),
                serde_json::from_str(args).unwrap_or(Value::Null),
                c["id"].as_str().unwrap_or("").to_owned(),
            )
        })
        .collect()
}

fn finish_reason(out: &[Value]) -> Option<String> {
    out.iter()
        .filter_map(|c| {
            c.pointer("/choices/0/finish_reason")
                .and_then(Value::as_str)
        })
        .next_back()
        .map(str::to_owned)
}

fn says_salvage(out: &[Value]) -> bool {
    out.iter().any(|c| {
        c.pointer("/selfheal/actions")
            .and_then(Value::as_array)
            .is_some_and(|a| a.iter().any(|x| x == "salvage"))
    })
}

#[test]
fn how_an_answer_opens_decides_whether_it_is_held() {
    for t in ["", "  \n", "`", "``", "<tool", "[TOOL", "<|py"] {
        assert_eq!(opens_text_call(t), Opening::Undecided, "{t:?}");
    }
    for t in [
        "```json",
        " {\"name\"",
        "<tool_call>",
        "[TOOL_CALLS] [",
        "<|python_tag|>x",
    ] {
        assert_eq!(opens_text_call(t), Opening::Call, "{t:?}");
    }
    for t in ["Sure", "`x` is", "<b>", "[1, 2]", "The call {\"name\": 1}"] {
        assert_eq!(opens_text_call(t), Opening::Words, "{t:?}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// However a fenced call of an offered tool is cut into deltas (with or without leading
    /// space), the chat client gets one structured call with a fresh id, `finish_reason:
    /// "tool_calls"`, no fenced text, and `salvage` in the report.
    #[test]
    fn a_streamed_fenced_call_becomes_a_chat_tool_call(
        lead in "[ \n]{0,3}",
        cuts in proptest::collection::vec(any::<usize>(), 0..8),
    ) {
        let text = format!("{lead}{FENCED}");
        let out = chat(&pieces(&text, &cuts), true);
        let calls = chat_calls(&out);
        prop_assert_eq!(calls.len(), 1, "{:?}", out);
        prop_assert_eq!(&calls[0].0, "search");
        let args = json!({"query": "rust"});
        prop_assert_eq!(&calls[0].1, &args);
        prop_assert!(!calls[0].2.is_empty());
        prop_assert_eq!(finish_reason(&out), Some("tool_calls".to_owned()));
        prop_assert!(!chat_text(&out).contains("```"), "{:?}", out);
        prop_assert!(says_salvage(&out), "{:?}", out);
        let done = json!("[DONE]");
        prop_assert_eq!(out.last(), Some(&done));
    }

    /// Text that is not a call of an offered tool goes out as it was, however cut: words,
    /// JSON that is no call, a call of a tool not on offer (refused, never taken), and any
    /// fenced call when salvage is off (`tool_choice: "none"`).
    #[test]
    fn text_that_is_no_call_of_an_offered_tool_goes_out_as_it_was(
        which in 0usize..4,
        cuts in proptest::collection::vec(any::<usize>(), 0..8),
    ) {
        let (text, salvage) = match which {
            0 => ("Use ```json {\"name\": \"search\"}``` to search.", true),
            1 => ("{\"temperature\": 21, \"unit\": \"C\"}", true),
            2 => ("{\"name\": \"send_email\", \"arguments\": {\"to\": \"bob\"}}", true),
            _ => (FENCED, false),
        };
        let out = chat(&pieces(text, &cuts), salvage);
        prop_assert_eq!(chat_text(&out), text, "{:?}", out);
        prop_assert!(chat_calls(&out).is_empty(), "{:?}", out);
        prop_assert_eq!(finish_reason(&out), Some("stop".to_owned()));
        prop_assert!(!says_salvage(&out));
        let done = json!("[DONE]");
        prop_assert_eq!(out.last(), Some(&done));
    }
}

/// Text that opens like a call, followed by structured calls: the structured call is the
/// answer's call (never replaced by a salvaged one), and the text goes out as it was.
#[test]
fn structured_calls_after_held_text_are_kept() {
    let text = "{\"name\": \"search\", \"arguments\": {\"query\": \"text\"}}";
    let chunk = |delta: Value, finish: Value| {
        json!({"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
    };
    let events = [
        chunk(json!({"role": "assistant"}), Value::Null),
        chunk(json!({"content": text}), Value::Null),
        chunk(
            json!({"tool_calls": [{"index": 0, "id": "t1", "type": "function",
                "function": {"name": "search", "arguments": "{\"query\": \"real\"}"}}]}),
            Value::Null,
        ),
        chunk(json!({}), json!("tool_calls")),
    ];
    let mut body: String = events.iter().map(|e| format!("data: {e}\n\n")).collect();
    body.push_str("data: [DONE]\n\n");
    let out = block_on(async move {
        let (tx, rx) = mpsc::channel(4096);
        let hooks = selfheal_gateway::ChatHooks {
            salvage: true,
            ..Default::default()
        };
        selfheal_gateway::relay_chat(
            upstream(body),
            Arc::new(tools()),
            Arc::new(GuideCache::default()),
            Some(json!({"status": "complete", "actions": []})),
            hooks,
            &tx,
        )
        .await;
        drop(tx);
        collect(rx).await
    });
    let calls = chat_calls(&out);
    assert_eq!(calls.len(), 1, "{out:?}");
    assert_eq!(calls[0].1, json!({"query": "real"}));
    assert_eq!(calls[0].2, "t1");
    assert_eq!(chat_text(&out), text);
    assert!(!says_salvage(&out));
}

/// A whole JSON answer to a streaming request is salvaged as a streamed one: its fenced call
/// goes out as a structured call in the stream.
#[test]
fn a_json_answer_to_a_stream_request_is_salvaged_too() {
    let answer = json!({"id": "x", "object": "chat.completion", "created": 1, "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": FENCED},
        "finish_reason": "stop"}]});
    let out = block_on(async move {
        let http = axum::http::Response::builder()
            .header("content-type", "application/json")
            .body(reqwest::Body::from(answer.to_string()))
            .unwrap();
        let (tx, rx) = mpsc::channel(4096);
        let hooks = selfheal_gateway::ChatHooks {
            salvage: true,
            ..Default::default()
        };
        selfheal_gateway::relay_chat(
            reqwest::Response::from(http),
            Arc::new(tools()),
            Arc::new(GuideCache::default()),
            Some(json!({"status": "complete", "actions": []})),
            hooks,
            &tx,
        )
        .await;
        drop(tx);
        collect(rx).await
    });
    let calls = chat_calls(&out);
    assert_eq!(calls.len(), 1, "{out:?}");
    assert_eq!(calls[0].1, json!({"query": "rust"}));
    assert_eq!(finish_reason(&out), Some("tool_calls".to_owned()));
    assert!(says_salvage(&out));
}

/// Holding is bounded: content that opens like a call but grows past the relay's held-bytes
/// limit is released as it was and streams on.
#[test]
fn held_text_past_the_limit_is_released_as_it_was() {
    let piece = "x".repeat(512 * 1024);
    let mut parts = vec!["{\"name\": \"search\", \"arguments\": {\"query\": \"".to_owned()];
    parts.extend(std::iter::repeat_n(piece, 9));
    parts.push("\"}}".into());
    let text: String = parts.concat();
    assert!(text.len() > selfheal_gateway::MAX_HELD_BYTES);
    let out = chat(&parts, true);
    assert_eq!(chat_text(&out), text);
    assert!(chat_calls(&out).is_empty());
    assert!(!says_salvage(&out));
}

/// The Responses events a client gets for text streamed in `parts`.
fn responses(parts: &[String]) -> Vec<Value> {
    let text: String = parts.concat();
    let mut events = vec![
        json!({"type": "response.created", "response": {"id": "r", "status": "in_progress", "output": []}}),
        json!({"type": "response.output_item.added", "output_index": 0,
            "item": {"type": "message", "id": "m", "role": "assistant", "content": []}}),
        json!({"type": "response.content_part.added", "output_index": 0, "content_index": 0,
            "part": {"type": "output_text", "text": ""}}),
    ];
    for p in parts {
        events.push(
            json!({"type": "response.output_text.delta", "output_index": 0,
            "content_index": 0, "delta": p}),
        );
    }
    let message = json!({"type": "message", "id": "m", "role": "assistant",
        "status": "completed", "content": [{"type": "output_text", "text": text}]});
    events.push(
        json!({"type": "response.output_text.done", "output_index": 0,
        "content_index": 0, "text": text}),
    );
    events.push(json!({"type": "response.output_item.done", "output_index": 0, "item": message}));
    events.push(json!({"type": "response.completed", "response": {"id": "r",
        "status": "completed", "output": [message]}}));
    let body: String = events
        .iter()
        .map(|e| format!("event: {}\ndata: {e}\n\n", e["type"].as_str().unwrap()))
        .collect();
    block_on(async move {
        let (tx, rx) = mpsc::channel(4096);
        let hooks = selfheal_gateway::ResponsesHooks {
            salvage: true,
            ..Default::default()
        };
        selfheal_gateway::relay_responses(
            upstream(body),
            Arc::new(tools()),
            Arc::new(GuideCache::default()),
            Some(json!({"status": "complete", "actions": []})),
            hooks,
            &tx,
        )
        .await;
        drop(tx);
        collect(rx).await
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]

    /// On the Responses stream, the same: a fenced call of an offered tool becomes a
    /// `function_call` item (added and done, in the completed response), the prose before it
    /// stays as the message, and `salvage` is recorded; words go out as they were.
    #[test]
    fn a_streamed_fenced_call_becomes_a_function_call_item(
        cuts in proptest::collection::vec(any::<usize>(), 0..8),
    ) {
        let out = responses(&pieces(FENCED, &cuts));
        let completed = out.iter().find(|e| e["type"] == "response.completed").unwrap();
        let output = completed["response"]["output"].as_array().unwrap();
        let calls: Vec<&Value> = output.iter().filter(|i| i["type"] == "function_call").collect();
        prop_assert_eq!(calls.len(), 1, "{:?}", out);
        prop_assert_eq!(&calls[0]["name"], "search");
        let args: Value = serde_json::from_str(calls[0]["arguments"].as_str().unwrap()).unwrap();
        prop_assert_eq!(args, json!({"query": "rust"}));
        prop_assert!(calls[0]["call_id"].as_str().is_some_and(|c| !c.is_empty()));
        prop_assert!(out.iter().any(|e| e["type"] == "response.output_item.done"
            && e["item"]["type"] == "function_call"), "{:?}", out);
        prop_assert!(!out.iter().any(|e| e["type"] == "response.output_text.delta"
            && e["delta"].as_str().is_some_and(|d| d.contains("```"))), "{:?}", out);
        let actions = completed["response"]["selfheal"]["actions"].to_string();
        prop_assert!(actions.contains("salvage"), "{}", actions);
        let n_created = out.iter().filter(|e| e["type"] == "response.created").count();
        prop_assert_eq!(n_created, 1, "{:?}", out);

        let words = "The weather is fine {really}.";
        let out = responses(&pieces(words, &cuts));
        let said: String = out.iter()
            .filter(|e| e["type"] == "response.output_text.delta")
            .filter_map(|e| e["delta"].as_str()).collect();
        prop_assert_eq!(said, words);
        prop_assert!(!out.iter().any(|e| e["item"]["type"] == "function_call"));
    }
}
