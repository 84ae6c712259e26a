//! SSE streaming: text passes through at once, tool calls are held until complete and valid.
//!
//! A client acts on a tool call as soon as its stream says it is finished, so the gateway keeps
//! the tool-call deltas back, assembles each call, checks and repairs its arguments against the
//! request's schema, and sends it as one complete delta just before the chunk that carries the
//! `finish_reason`. When a call cannot be used (unknown tool, arguments that cannot be repaired)
//! and the run's budget allows, the gateway asks the upstream once more — the text already sent
//! stays sent — and passes on the new answer's calls instead; only if that fails too do the
//! original calls go out, with a `partial` status. Text deltas are forwarded the moment they
//! arrive. A stream that ends without
//! a finish (the upstream broke mid-answer) is never passed on as a clean finish: the client gets
//! an error event and the connection is cut, so its SDK raises instead of returning half an
//! answer as if it were whole.

use std::collections::BTreeMap;

use bytes::Bytes;
use futures_util::StreamExt;
use serde_json::{Value, json};
use tokio::sync::mpsc;

use std::sync::Arc;

use futures_util::future::BoxFuture;

use crate::heal::{GuideCache, ToolIndex, check_call};
use selfheal_repair::Ending;

/// A second answer to an assistant turn whose tool calls could not be used.
#[derive(Debug, Clone, PartialEq)]
pub struct Reasked {
    /// The new answer's (checked) assistant message.
    pub message: Value,
    /// Its `finish_reason`.
    pub finish_reason: Value,
    /// Calls of the new answer whose arguments were repaired.
    pub repaired: Vec<String>,
}

/// Asks the upstream again, once, given the problems with the held tool calls. `None` when the
/// budget refuses, the upstream fails, or the new answer's calls cannot be used either.
pub type Reask = Box<dyn FnOnce(Vec<String>) -> BoxFuture<'static, Option<Reasked>> + Send>;

/// What happened to a stream, reported when it ends.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StreamReport {
    /// The upstream finished cleanly.
    pub finished: bool,
    /// Tool calls repaired in place.
    pub repaired: Vec<String>,
    /// Tool calls that could not be repaired (passed on as they were).
    pub invalid: Vec<String>,
    /// The problems of the calls that were re-asked and replaced by a usable answer.
    pub reasked: Vec<String>,
    /// Why the stream broke, when it did.
    pub broken: Option<String>,
}

#[derive(Default)]
struct PendingCall {
    id: String,
    name: String,
    arguments: String,
}

/// A frame for the client.
pub type Frame = Result<Bytes, std::io::Error>;

fn data(v: &Value) -> Frame {
    Ok(Bytes::from(format!("data: {v}\n\n")))
}

/// Relays an upstream SSE response to `tx`. `selfheal` is added to the final chunk, updated with
/// what the relay did (`repair`, `reask`, a `partial` status for calls passed on unusable).
pub async fn relay(
    upstream: reqwest::Response,
    tools: Arc<ToolIndex>,
    guides: Arc<GuideCache>,
    mut selfheal: Option<Value>,
    mut reask: Option<Reask>,
    tx: &mpsc::Sender<Frame>,
) -> StreamReport {
    let mut report = StreamReport::default();
    let mut pending: BTreeMap<u64, PendingCall> = BTreeMap::new();
    let mut buf: Vec<u8> = Vec::new();
    let mut body = upstream.bytes_stream();
    let mut template: Option<Value> = None;
    let mut done = false;
    'outer: while let Some(chunk) = body.next().await {
        let chunk = match chunk {
            Ok(c) => c,
            Err(e) => {
                report.broken = Some(format!("upstream stream failed: {e}"));
                break;
            }
        };
        buf.extend_from_slice(&chunk);
        while let Some(pos) = find_event_end(&buf) {
            let event: Vec<u8> = buf.drain(..pos.0 + pos.1).collect();
            let text = String::from_utf8_lossy(&event[..pos.0]);
            for line in text.lines() {
                let Some(payload) = line.strip_prefix("data:") else {
                    continue;
                };
                let payload = payload.trim();
                if payload == "[DONE]" {
                    done = true;
                    break 'outer;
                }
                let Ok(mut v) = serde_json::from_str::<Value>(payload) else {
                    report.broken = Some("upstream sent an unreadable stream chunk".into());
                    break 'outer;
                };
                if v.get("error").is_some() {
                    report.broken = Some(format!("upstream stream error: {}", v["error"]));
                    break 'outer;
                }
                if template.is_none() {
                    template = Some(v.clone());
                }
                let finish = v
                    .pointer("/choices/0/finish_reason")
                    .filter(|f| !f.is_null())
                    .cloned();
                if let Some(delta) = v.pointer_mut("/choices/0/delta")
                    && let Some(obj) = delta.as_object_mut()
                    && let Some(calls) = obj.remove("tool_calls")
                {
                    for c in calls.as_array().into_iter().flatten() {
                        let idx = c.get("index").and_then(Value::as_u64).unwrap_or(0);
                        let p = pending.entry(idx).or_default();
                        if let Some(id) = c.get("id").and_then(Value::as_str) {
                            p.id = id.to_owned();
                        }
                        if let Some(n) = c.pointer("/function/name").and_then(Value::as_str) {
                            p.name.push_str(n);
                        }
                        if let Some(a) = c.pointer("/function/arguments").and_then(Value::as_str) {
                            p.arguments.push_str(a);
                        }
                    }
                }
                if let Some(mut finish) = finish {
                    if !pending.is_empty() {
                        let ending = Ending::from_finish_reason(finish.as_str());
                        let (mut calls, invalid) =
                            complete_calls(&mut pending, &tools, &guides, ending, &mut report);
                        if !invalid.is_empty() {
                            let again = match reask.take() {
                                Some(f) => f(invalid.clone()).await,
                                None => None,
                            };
                            match again {
                                Some(r) => {
                                    report.reasked = invalid;
                                    report.repaired.extend(r.repaired);
                                    finish = r.finish_reason;
                                    calls = indexed_calls(&r.message);
                                    let text = r
                                        .message
                                        .get("content")
                                        .filter(|c| c.as_str().is_some_and(|t| !t.is_empty()));
                                    if calls.is_empty()
                                        && let Some(text) = text
                                    {
                                        let mut c = v.clone();
                                        c["choices"][0]["delta"] = json!({"content": text});
                                        c["choices"][0]["finish_reason"] = Value::Null;
                                        if tx.send(data(&c)).await.is_err() {
                                            return report;
                                        }
                                    }
                                }
                                None => report.invalid = invalid,
                            }
                        }
                        if !calls.is_empty() {
                            let mut c = v.clone();
                            c["choices"][0]["delta"] = json!({"tool_calls": calls});
                            c["choices"][0]["finish_reason"] = Value::Null;
                            if tx.send(data(&c)).await.is_err() {
                                return report;
                            }
                        } else if finish.as_str() == Some("tool_calls") {
                            // Every call was left out: the answer no longer ends in calls.
                            finish = json!("stop");
                        }
                    }
                    v["choices"][0]["finish_reason"] = finish;
                    if let Some(s) = &mut selfheal {
                        note_outcome(s, &report);
                        v["selfheal"] = s.clone();
                    }
                    report.finished = true;
                    if tx.send(data(&v)).await.is_err() {
                        return report;
                    }
                    continue;
                }
                let has_payload = v
                    .pointer("/choices/0/delta")
                    .and_then(Value::as_object)
                    .is_some_and(|d| {
                        d.iter()
                            .any(|(k, x)| !x.is_null() && (k != "content" || x != ""))
                    })
                    || v.get("usage").is_some_and(|u| !u.is_null());
                if (has_payload || v.pointer("/choices/0").is_none())
                    && tx.send(data(&v)).await.is_err()
                {
                    return report;
                }
            }
        }
    }
    if report.finished && (done || report.broken.is_none()) {
        report.broken = None;
        let _ = tx.send(Ok(Bytes::from_static(b"data: [DONE]\n\n"))).await;
        return report;
    }
    let why = report
        .broken
        .clone()
        .unwrap_or_else(|| "upstream stream ended before the answer was finished".into());
    report.broken = Some(why.clone());
    let _ = tx
        .send(data(&json!({"error": {
            "message": why, "type": "upstream_error", "param": null, "code": "stream_broken"
        }})))
        .await;
    let _ = tx
        .send(Err(std::io::Error::other("upstream stream broke")))
        .await;
    report
}

/// Assembles the held calls, checks and repairs them. Returns the calls and the problems of
/// those that cannot be used.
fn complete_calls(
    pending: &mut BTreeMap<u64, PendingCall>,
    tools: &ToolIndex,
    guides: &GuideCache,
    ending: Ending,
    report: &mut StreamReport,
) -> (Vec<Value>, Vec<String>) {
    let mut out = Vec::new();
    let mut invalid = Vec::new();
    for (idx, p) in std::mem::take(pending) {
        let mut call = json!({
            "index": idx, "id": p.id, "type": "function",
            "function": {"name": p.name, "arguments": p.arguments}
        });
        match check_call(&mut call, tools, guides, ending) {
            Ok(true) => report.repaired.push(p.name),
            Ok(false) => {}
            // Never forwarded: re-asked, or left out with the stream marked `partial`.
            Err(e) => {
                invalid.push(e);
                continue;
            }
        }
        out.push(call);
    }
    (out, invalid)
}

/// The tool calls of a complete message as stream deltas (each with its `index`).
fn indexed_calls(message: &Value) -> Vec<Value> {
    message
        .get("tool_calls")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .enumerate()
        .map(|(i, c)| {
            let mut c = c.clone();
            if let Some(o) = c.as_object_mut() {
                o.insert("index".into(), json!(i));
            }
            c
        })
        .collect()
}

/// Records in the `selfheal` object what the relay did.
fn note_outcome(selfheal: &mut Value, report: &StreamReport) {
    let Some(o) = selfheal.as_object_mut() else {
        return;
    };
    if let Some(actions) = o.get_mut("actions").and_then(Value::as_array_mut) {
        for (did, name) in [
            (!report.repaired.is_empty(), "repair"),
            (!report.reasked.is_empty(), "reask"),
        ] {
            if did && !actions.iter().any(|a| a == name) {
                actions.push(json!(name));
            }
        }
    }
    if !report.invalid.is_empty() {
        o.insert("status".into(), json!("partial"));
        o.insert("reason".into(), json!(report.invalid.join(" ")));
    }
}

/// Finds the end of the first SSE event: (position of the blank line, its length).
fn find_event_end(buf: &[u8]) -> Option<(usize, usize)> {
    let mut i = 0;
    while i + 1 < buf.len() {
        if buf[i] == b'\n' && buf[i + 1] == b'\n' {
            return Some((i, 2));
        }
        if i + 3 < buf.len() && &buf[i..i + 4] == b"\r\n\r\n" {
            return Some((i, 4));
        }
        i += 1;
    }
    None
}

/// Frames of a complete answer sent as a stream (used when the gateway answers by itself).
pub fn answer_frames(completion: &Value) -> Vec<Frame> {
    let base = json!({
        "id": completion["id"], "object": "chat.completion.chunk",
        "created": completion["created"], "model": completion["model"],
    });
    let mut first = base.clone();
    first["choices"] = json!([{"index": 0, "delta": {
        "role": "assistant",
        "content": completion.pointer("/choices/0/message/content").cloned().unwrap_or(Value::Null)
    }, "finish_reason": null}]);
    let mut last = base;
    last["choices"] = json!([{"index": 0, "delta": {}, "finish_reason": "stop"}]);
    if let Some(s) = completion.get("selfheal") {
        last["selfheal"] = s.clone();
    }
    vec![
        data(&first),
        data(&last),
        Ok(Bytes::from_static(b"data: [DONE]\n\n")),
    ]
}
