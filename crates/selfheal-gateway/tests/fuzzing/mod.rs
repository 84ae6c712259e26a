//! The bodies of the gateway's fuzz targets, shared by `fuzz/fuzz_targets/` (libFuzzer, nightly)
//! and `tests/fuzz_replay.rs` (the committed seeds and a seeded sweep, on stable), so the
//! property a fuzzer checks is the property CI checks. A panic is a finding.
//!
//! - [`request`]: the first byte picks edits, the rest is a client's body. Reading never
//!   panics; a body that reads is written back as a body that reads again, with the edits
//!   visible; no edits send the client's own buffer; and when the body is JSON without
//!   duplicate keys, the edits give what the same edits made to a `serde_json::Value` give
//!   ([`reference`], also used by `tests/request_props.rs`).
//! - [`sse`]: the first bytes pick the content type, the hooks and where the body is cut into
//!   pieces; the rest is an upstream's stream. The relay never panics, every frame it sends is
//!   an SSE `data:` frame with JSON in it, and the client's stream ends in exactly one way:
//!   `[DONE]` after a finish, or one `stream_broken` error event.

// Each user of this module (two fuzz targets, two tests) takes what it needs.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::{Arc, LazyLock};

use bytes::Bytes;
use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value, json};
use tokio::sync::mpsc;

use selfheal_gateway::{
    ChatHooks as Hooks, ChatReask as Reask, Frame, Reasked, relay_chat as relay,
};
use selfheal_gateway::{ChatRequest, Edits};
use selfheal_gateway::{GuideCache, ToolIndex, tool_index};

/// The request view on a client's body, with the edits the first byte picks.
pub(crate) fn request(data: &[u8]) {
    let (flags, body) = data.split_first().map_or((0, data), |(f, b)| (*f, b));
    let b = Bytes::copy_from_slice(body);
    let Ok(view) = ChatRequest::parse(&b) else {
        return;
    };
    // Every accessor healing uses, on whatever was sent.
    let _ = view.tool_choice_name();
    let tools = view.tools();
    for m in &view.messages {
        let _ = (m.role(), m.content_text(), m.calls(), m.needs_content());
    }
    let _ = tool_index(&view);

    let same = view.encode(&Edits::default(), &b);
    assert_eq!(
        same.as_ptr(),
        b.as_ptr(),
        "no edits send the client's buffer"
    );

    let bit = |i: u8| flags & (1 << i) != 0;
    let mut hidden: Vec<String> = tools
        .iter()
        .filter_map(|t| t.name.as_ref().map(|n| n.as_str().to_owned()))
        .collect();
    if !bit(4) {
        hidden.truncate(1);
    }
    if !bit(3) {
        hidden.clear();
    }
    let extra = json!({"role": "user", "content": "again \"q\" \u{e9}"});
    let edits = Edits {
        model: bit(0).then_some("upstream-model"),
        normalize: bit(1),
        system: bit(2).then_some("guidance \"q\" \\ \u{1F600}"),
        hidden: &hidden,
        append: bit(5).then_some(&extra),
        stream: bit(6).then_some(bit(7)),
        replaced: &[],
    };
    let out = view.encode(&edits, &b);
    let again = ChatRequest::parse(&out).unwrap_or_else(|e| {
        panic!(
            "the written request does not read again: {e:?}: {}",
            String::from_utf8_lossy(&out)
        )
    });
    if let Some(m) = edits.model {
        assert_eq!(again.model.as_str(), m);
    } else {
        assert_eq!(again.model.as_str(), view.model.as_str());
    }
    match edits.stream {
        Some(s) => assert_eq!(again.stream, s),
        None => assert_eq!(again.stream, view.stream),
    }
    let added = usize::from(edits.system.is_some()) + usize::from(edits.append.is_some());
    assert_eq!(again.messages.len(), view.messages.len() + added);
    if edits.normalize {
        assert!(!again.messages.iter().any(|m| m.needs_content()));
    }
    let offered = again.tools();
    assert!(
        !offered
            .iter()
            .filter_map(|t| t.name.as_ref())
            .any(|n| hidden.iter().any(|h| h == n.as_str())),
        "a hidden tool is still offered"
    );

    // Against the `Value` reference, where `Value` reads the same thing the view does.
    let Ok(Strict(v)) = serde_json::from_slice::<Strict>(body) else {
        return;
    };
    let got: Value = serde_json::from_slice(&out).unwrap_or_else(|e| {
        panic!(
            "the written request is not JSON: {e}: {}",
            String::from_utf8_lossy(&out)
        )
    });
    assert_eq!(
        got,
        reference(v, &edits),
        "from {}",
        String::from_utf8_lossy(body)
    );
}

/// The edits applied to a `Value`, as the gateway did before it had views.
pub(crate) fn reference(mut v: Value, e: &Edits<'_>) -> Value {
    let o = v.as_object_mut().expect("a request is an object");
    if let Some(m) = e.model {
        o.insert("model".into(), json!(m));
    }
    if let Some(s) = e.stream {
        o.insert("stream".into(), json!(s));
        if !s {
            o.remove("stream_options");
        }
    }
    let offered: Vec<String> = o
        .get("tools")
        .and_then(Value::as_array)
        .map(|t| {
            t.iter()
                .filter_map(|t| t.pointer("/function/name").and_then(Value::as_str))
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default();
    let hides = offered.iter().any(|n| e.hidden.contains(n));
    if hides {
        let tools = o
            .get_mut("tools")
            .and_then(Value::as_array_mut)
            .expect("tools were offered");
        tools.retain(|t| {
            !t.pointer("/function/name")
                .and_then(Value::as_str)
                .is_some_and(|n| e.hidden.iter().any(|h| h == n))
        });
        let hidden = |t: &Value| {
            t.pointer("/function/name")
                .and_then(Value::as_str)
                .is_some_and(|n| e.hidden.iter().any(|h| h == n))
        };
        if tools.is_empty() {
            o.remove("tools");
            o.remove("tool_choice");
            o.remove("parallel_tool_calls");
        } else if let Some(choice) = o.get_mut("tool_choice") {
            if hidden(choice) {
                *choice = json!("auto");
            } else if let Some(allowed) = choice
                .pointer_mut("/allowed_tools/tools")
                .and_then(Value::as_array_mut)
            {
                allowed.retain(|t| !hidden(t));
                if allowed.is_empty() {
                    *choice = json!("auto");
                }
            }
        }
    }
    let messages = o
        .get_mut("messages")
        .and_then(Value::as_array_mut)
        .expect("a request has messages");
    if e.normalize {
        for m in messages.iter_mut() {
            let Some(m) = m.as_object_mut() else { continue };
            if m.get("role").and_then(Value::as_str) == Some("assistant")
                && m.get("tool_calls").is_some_and(|c| !c.is_null())
                && m.get("content").is_none_or(Value::is_null)
            {
                m.insert("content".into(), json!(""));
            }
        }
    }
    if let Some(text) = e.system {
        let at = messages
            .iter()
            .take_while(|m| {
                matches!(
                    m.get("role").and_then(Value::as_str),
                    Some("system" | "developer")
                )
            })
            .count();
        messages.insert(at, json!({"role": "system", "content": text}));
    }
    if let Some(extra) = e.append {
        messages.push(extra.clone());
    }
    v
}

/// A JSON value read like `serde_json::Value`, except that a duplicate key anywhere is an
/// error: `Value` keeps the last of two equal keys, the view keeps both, so the two are only
/// compared where they read the same thing.
struct Strict(Value);

impl<'de> Deserialize<'de> for Strict {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(StrictVisitor).map(Strict)
    }
}

struct StrictVisitor;

impl<'de> Visitor<'de> for StrictVisitor {
    type Value = Value;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("JSON without duplicate keys")
    }
    fn visit_bool<E>(self, b: bool) -> Result<Value, E> {
        Ok(Value::Bool(b))
    }
    fn visit_i64<E>(self, n: i64) -> Result<Value, E> {
        Ok(Value::from(n))
    }
    fn visit_u64<E>(self, n: u64) -> Result<Value, E> {
        Ok(Value::from(n))
    }
    fn visit_f64<E>(self, n: f64) -> Result<Value, E> {
        Ok(Value::from(n))
    }
    fn visit_str<E>(self, s: &str) -> Result<Value, E> {
        Ok(Value::String(s.to_owned()))
    }
    fn visit_string<E>(self, s: String) -> Result<Value, E> {
        Ok(Value::String(s))
    }
    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut out = Vec::new();
        while let Some(Strict(v)) = seq.next_element()? {
            out.push(v);
        }
        Ok(Value::Array(out))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut out = Map::new();
        while let Some(k) = map.next_key::<String>()? {
            let Strict(v) = map.next_value()?;
            if out.insert(k, v).is_some() {
                return Err(de::Error::custom("duplicate key"));
            }
        }
        Ok(Value::Object(out))
    }
}

/// The tools the relay checks streamed calls against.
const TOOLS_REQUEST: &str = r#"{"model": "m", "messages": [{"role": "user", "content": "hi"}],
  "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object",
    "properties": {"q": {"type": "string"}, "n": {"type": "integer"}}, "required": ["q"]}}},
  {"type": "function", "function": {"name": "g"}}]}"#;

/// The index of [`TOOLS_REQUEST`]'s tools, and a schema cache shared by every input (warm, as
/// in the gateway); one runtime per thread, built once.
static TOOLS: LazyLock<Arc<ToolIndex>> = LazyLock::new(|| {
    let request = ChatRequest::parse(TOOLS_REQUEST.as_bytes()).expect("the tools request reads");
    Arc::new(tool_index(&request))
});
static GUIDES: LazyLock<Arc<GuideCache>> = LazyLock::new(Arc::default);
thread_local! {
    static RUNTIME: tokio::runtime::Runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
}

/// A hook that answers with a fixed, usable message.
fn answering(message: Value, finish: &'static str) -> Reask {
    Box::new(move |_problems| {
        Box::pin(async move {
            Some(Reasked {
                message,
                finish_reason: json!(finish),
                repaired: Vec::new(),
            })
        })
    })
}

/// A hook that fails (budget refused, upstream down).
fn failing() -> Reask {
    Box::new(|_problems| Box::pin(async { None }))
}

/// The SSE relay on an upstream's stream.
pub(crate) fn sse(data: &[u8]) {
    let (head, body) = data.split_at(data.len().min(4));
    let byte = |i: usize| head.get(i).copied().unwrap_or(0);
    let flags = byte(0);
    let bit = |i: u8| flags & (1 << i) != 0;
    // Up to three cuts, anywhere in the body: the upstream's pieces.
    let mut cuts: Vec<usize> = (1..4)
        .map(|i| usize::from(byte(i)) * 16 % (body.len() + 1))
        .collect();
    cuts.sort_unstable();
    let mut pieces = Vec::new();
    let mut last = 0;
    for c in cuts {
        pieces.push(Ok::<_, std::io::Error>(Bytes::copy_from_slice(
            &body[last..c],
        )));
        last = c;
    }
    pieces.push(Ok(Bytes::copy_from_slice(&body[last..])));
    if bit(0) {
        // The connection fails after the last piece.
        pieces.push(Err(std::io::Error::other("connection reset")));
    }
    let content_type = if bit(1) {
        "application/json"
    } else {
        "text/event-stream"
    };
    let call = json!({"role": "assistant", "content": null, "tool_calls": [{"id": "r1",
        "type": "function", "function": {"name": "f", "arguments": "{\"q\": \"x\"}"}}]});
    let hooks = Hooks {
        reask: match (bit(2), bit(3)) {
            (false, _) => None,
            (true, false) => Some(failing()),
            (true, true) => Some(answering(call.clone(), "tool_calls")),
        },
        reissue: match (bit(4), bit(5)) {
            (false, _) => None,
            (true, false) => Some(failing()),
            (true, true) => Some(answering(
                json!({"role": "assistant", "content": "again"}),
                "stop",
            )),
        },
        // A further check that refuses every call (as grounding refuses an invented one).
        check: bit(6).then(|| -> selfheal_gateway::Check {
            Box::new(|calls: &mut Vec<serde_json::Value>| {
                let n = calls.len();
                calls.clear();
                vec![selfheal_gateway::Problem::arguments("refused".to_owned()); n]
            })
        }),
        ..Hooks::default()
    };
    let tools = TOOLS.clone();
    let guides = GUIDES.clone();
    let (frames, finished) = RUNTIME.with(|rt| {
        rt.block_on(async move {
            let http = axum::http::Response::builder()
                .header("content-type", content_type)
                .body(reqwest::Body::wrap_stream(futures_util::stream::iter(
                    pieces,
                )))
                .expect("a response");
            let upstream = reqwest::Response::from(http);
            let (tx, mut rx) = mpsc::channel::<Frame>(16);
            let relayed = async move {
                let report = relay(
                    upstream,
                    tools,
                    guides,
                    Some(json!({"status": "complete", "actions": []})),
                    hooks,
                    &tx,
                )
                .await;
                drop(tx);
                report
            };
            let received = async {
                let mut frames = Vec::new();
                while let Some(f) = rx.recv().await {
                    frames.push(f.expect("the relay never sends an error frame"));
                }
                frames
            };
            let (report, frames) = tokio::join!(relayed, received);
            (frames, report.finished)
        })
    });

    let mut done = 0;
    let mut errors = 0;
    let mut last_was_done = false;
    let mut last_was_error = false;
    for f in &frames {
        let text = std::str::from_utf8(f).expect("frames are UTF-8");
        let payload = text
            .strip_prefix("data: ")
            .and_then(|t| t.strip_suffix("\n\n"))
            .unwrap_or_else(|| panic!("not an SSE data frame: {text:?}"));
        assert!(!payload.contains("\n\n"), "one frame, one event: {text:?}");
        last_was_done = payload == "[DONE]";
        last_was_error = false;
        if last_was_done {
            done += 1;
            continue;
        }
        let v: Value = serde_json::from_str(payload)
            .unwrap_or_else(|e| panic!("a frame is not JSON: {e}: {payload:?}"));
        if v.pointer("/error/code").and_then(Value::as_str) == Some("stream_broken") {
            errors += 1;
            last_was_error = true;
        }
    }
    if finished {
        assert!(
            last_was_done,
            "a finished stream ends in [DONE]: {frames:?}"
        );
        assert_eq!((errors, done), (0, 1), "{frames:?}");
    } else {
        assert!(
            last_was_error,
            "a broken stream ends in its error: {frames:?}"
        );
        assert_eq!((errors, done), (1, 0), "{frames:?}");
    }
}
