//! The chat completions stream (`POST /v1/chat/completions` with `stream: true`): its event
//! grammar for the one relay, [`crate::relay`], which heals it as it heals every API's stream.
//!
//! A chat stream is a sequence of `chat.completion.chunk` objects, each a `data:` line, ended by
//! `data: [DONE]`. The grammar holds a role-only first delta until something follows it, holds
//! every tool-call delta (assembling each call by its `index`), and sends the checked calls as
//! one complete delta just before the chunk that carries the `finish_reason`, which carries the
//! `selfheal` report. A chunk whose `choices` is not a list of objects breaks the stream (read as
//! a pointer would read it, `{"0": ...}` would pass for a list and go to the client as it came);
//! upstream data is never indexed with `IndexMut`. A stream that broke after content ends in an
//! OpenAI-shaped error event (`{"error": {...}}`) and a clean end of the body, so the SDK raises
//! `APIError` with the upstream's message.

use std::collections::BTreeMap;

use bytes::Bytes;
use selfheal_openai::At;
use serde_json::{Map, Value, json};
use tokio::sync::mpsc;

use std::sync::Arc;

use crate::heal::{CallCheck, GuideCache, Problem, ToolIndex, check_call};
pub(crate) use crate::relay::find_event_end;
pub(crate) use crate::relay::{
    AskAgain, Check, Frame, MAX_EVENT_BYTES, MAX_HELD_BYTES, Reanswer, StreamReport,
};
use crate::relay::{Grammar, Read};
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

/// Asks the upstream again, once, without streaming: with the problems of the held tool calls
/// appended (a re-ask), or with none (a re-issue of a stream that broke before any content).
/// `None` when the budget refuses, the upstream fails, or the new answer's calls cannot be used.
pub type Reask = AskAgain<Reasked>;

/// What the relay may ask of the pipeline for a chat stream.
pub type Hooks = crate::relay::Hooks<Reasked>;

impl Reanswer for Reasked {
    fn take_repaired(&mut self) -> Vec<String> {
        std::mem::take(&mut self.repaired)
    }
}

/// Relays an upstream chat completions response (SSE, or a whole answer) to `tx`, healed by
/// [`crate::relay`]. `selfheal` is added to the final chunk, updated with what the relay did.
pub async fn relay(
    upstream: reqwest::Response,
    tools: Arc<ToolIndex>,
    guides: Arc<GuideCache>,
    selfheal: Option<Value>,
    hooks: Hooks,
    tx: &mpsc::Sender<Frame>,
) -> StreamReport {
    crate::relay::relay(
        Chat::default(),
        upstream,
        tools,
        guides,
        selfheal,
        hooks,
        tx,
    )
    .await
}

#[derive(Default)]
struct PendingCall {
    id: String,
    name: String,
    arguments: String,
}

fn data(v: &Value) -> Frame {
    Ok(Bytes::from(format!("data: {v}\n\n")))
}

/// Sets `key` of the first choice, whether `choices` is an array or (from a broken upstream) an
/// object; does nothing when there is no first choice.
fn set_choice(v: &mut Value, key: &str, value: Value) {
    if let Some(c) = v.at_mut("/choices/0").and_then(Value::as_object_mut) {
        c.insert(key.to_owned(), value);
    }
}

/// A chunk like `base` (its id, created, model) with one choice.
fn chunk(base: Option<&Value>, delta: Value, finish: Value) -> Value {
    let field = |k: &str| base.and_then(|b| b.get(k)).cloned().unwrap_or(Value::Null);
    json!({
        "id": field("id"), "object": "chat.completion.chunk",
        "created": field("created"), "model": field("model"),
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    })
}

/// The chat grammar's state: the held tool calls and role, and the chunk whose `id`,
/// `created` and `model` the gateway's own chunks borrow.
#[derive(Default)]
pub(crate) struct Chat {
    pending: BTreeMap<u64, PendingCall>,
    held_bytes: usize,
    template: Option<Value>,
    /// A role-only first delta, sent just before whatever follows it.
    held_role: Option<Value>,
}

/// Whether a delta says anything beyond its role (an empty `content` says nothing).
fn says(delta: &Map<String, Value>) -> bool {
    delta
        .iter()
        .any(|(k, x)| k != "role" && !x.is_null() && (k != "content" || x != ""))
}

impl Chat {
    /// Holds the tool-call deltas of a chunk (taken out of it); `Err` past [`MAX_HELD_BYTES`].
    fn hold_calls(&mut self, v: &mut Value) -> Result<(), String> {
        let Some(calls) = v
            .at_mut("/choices/0/delta")
            .and_then(Value::as_object_mut)
            .and_then(|d| d.remove("tool_calls"))
        else {
            return Ok(());
        };
        for c in calls.as_array().into_iter().flatten() {
            let idx = c.get("index").and_then(Value::as_u64).unwrap_or(0);
            let p = self.pending.entry(idx).or_default();
            if let Some(id) = c.get("id").and_then(Value::as_str) {
                p.id = id.to_owned();
            }
            if let Some(n) = c.at("/function/name").and_then(Value::as_str) {
                p.name.push_str(n);
                self.held_bytes += n.len();
            }
            if let Some(a) = c.at("/function/arguments").and_then(Value::as_str) {
                p.arguments.push_str(a);
                self.held_bytes += a.len();
            }
        }
        if self.held_bytes > MAX_HELD_BYTES {
            return Err(format!("upstream tool calls exceed {MAX_HELD_BYTES} bytes"));
        }
        Ok(())
    }
}

impl Grammar for Chat {
    type Answer = Reasked;
    const READS_PAST_FINISH: bool = true;
    const UNFINISHED: &'static str = "upstream stream ended before the answer was finished";

    fn payloads(text: &str) -> Vec<String> {
        text.lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .map(|p| p.trim().to_owned())
            .collect()
    }

    fn read(&mut self, payload: &str, sent: bool) -> Read {
        if payload == "[DONE]" {
            return Read::Done;
        }
        let Ok(mut v) = serde_json::from_str::<Value>(payload) else {
            return Read::Broken("upstream sent an unreadable stream chunk".into());
        };
        if let Some(e) = v.get("error") {
            let message = e
                .get("message")
                .and_then(Value::as_str)
                .map_or_else(|| e.to_string(), str::to_owned);
            return Read::Broken(format!("upstream stream error: {message}"));
        }
        match v.get("choices") {
            None | Some(Value::Null) => {}
            Some(Value::Array(c)) if c.iter().all(Value::is_object) => {}
            Some(_) => {
                return Read::Broken(
                    "upstream sent a stream chunk whose `choices` is not a list of choices".into(),
                );
            }
        }
        if self.template.is_none() {
            self.template = Some(v.clone());
        }
        if let Err(why) = self.hold_calls(&mut v) {
            return Read::Broken(why);
        }
        if v.at("/choices/0/finish_reason")
            .is_some_and(|f| !f.is_null())
        {
            return Read::Finish(v);
        }
        let usage = v.get("usage").is_some_and(|u| !u.is_null());
        let delta = v.at("/choices/0/delta").and_then(Value::as_object);
        let has_payload = delta.is_some_and(|d| {
            d.iter()
                .any(|(k, x)| !x.is_null() && (k != "content" || x != ""))
        }) || usage;
        let content = delta.is_some_and(says);
        if has_payload && delta.is_some() && !content && !usage && !sent {
            self.held_role = Some(v);
            Read::Held
        } else if has_payload || v.at("/choices/0").is_none() {
            if content {
                Read::Content(v)
            } else {
                Read::Pass(v)
            }
        } else {
            Read::Held
        }
    }

    fn says_nothing(&self, finish: &Value) -> Option<String> {
        let said = finish
            .at("/choices/0/delta")
            .and_then(Value::as_object)
            .is_some_and(says);
        (!said).then(|| "upstream finished the answer without content or a tool call".into())
    }

    fn holds_calls(&self) -> bool {
        !self.pending.is_empty()
    }

    fn take_calls(
        &mut self,
        finish: &Value,
        tools: &ToolIndex,
        guides: &GuideCache,
        repaired: &mut Vec<String>,
    ) -> (Vec<Value>, Vec<Problem>) {
        let reason = finish.at("/choices/0/finish_reason");
        let ending = Ending::from_finish_reason(reason.and_then(Value::as_str));
        complete_calls(&mut self.pending, tools, guides, ending, repaired)
    }

    fn calls_out(
        &mut self,
        finish: &mut Value,
        ready: Vec<Value>,
        again: Option<Reasked>,
    ) -> (Vec<Value>, bool) {
        let mut out = Vec::new();
        let mut calls = ready;
        if let Some(r) = again {
            set_choice(finish, "finish_reason", r.finish_reason);
            calls = indexed_calls(&r.message);
            let text = r
                .message
                .get("content")
                .filter(|c| c.as_str().is_some_and(|t| !t.is_empty()));
            if calls.is_empty()
                && let Some(text) = text
            {
                out.push(chunk(Some(finish), json!({"content": text}), Value::Null));
            }
        }
        let called = !calls.is_empty();
        if called {
            out.push(chunk(
                Some(finish),
                json!({"tool_calls": calls}),
                Value::Null,
            ));
        }
        (out, called)
    }

    fn say_left_out(&mut self, finish: &mut Value, words: &str) -> Vec<Value> {
        set_choice(finish, "finish_reason", json!("stop"));
        let content = json!({"content": format!("\n\n{words}")});
        vec![chunk(Some(finish), content, Value::Null)]
    }

    fn uncalled(&mut self, finish: &mut Value) {
        if finish
            .at("/choices/0/finish_reason")
            .and_then(Value::as_str)
            == Some("tool_calls")
        {
            set_choice(finish, "finish_reason", json!("stop"));
        }
    }

    fn seal(&mut self, finish: &mut Value, selfheal: Option<&Value>, _: &mut StreamReport) {
        if let (Some(s), Some(o)) = (selfheal, finish.as_object_mut()) {
            o.insert("selfheal".into(), s.clone());
        }
    }

    fn error_event(message: &str, kind: &str, code: &str) -> Value {
        json!({"error": {"message": message, "type": kind, "param": null, "code": code}})
    }

    fn cut(&mut self) -> (Vec<Value>, Value) {
        (
            Vec::new(),
            chunk(self.template.as_ref(), json!({}), json!("length")),
        )
    }

    fn done_marker() -> Option<Frame> {
        Some(Ok(Bytes::from_static(b"data: [DONE]\n\n")))
    }

    fn take_held(&mut self) -> Vec<Value> {
        self.held_role.take().into_iter().collect()
    }

    fn frame(&mut self, v: Value) -> Frame {
        data(&v)
    }

    fn note_sent(&self, v: &Value, report: &mut StreamReport) {
        if report.first_call.is_none()
            && let Some(c) = v.pointer("/choices/0/delta/tool_calls/0")
            && let Some(id) = c.get("id").and_then(Value::as_str)
        {
            let name = c.pointer("/function/name").and_then(Value::as_str);
            report.first_call = Some((id.to_owned(), name.unwrap_or("").to_owned()));
        }
    }

    fn reset(&mut self) {
        self.pending.clear();
        self.held_bytes = 0;
        self.held_role = None;
    }

    fn parse_whole(&mut self, bytes: &[u8]) -> Result<Reasked, String> {
        let body = selfheal_openai::parse_completion(bytes)
            .map_err(crate::relay::unusable_stream)?
            .body;
        self.template = Some(body.clone());
        let message = body
            .at("/choices/0/message")
            .cloned()
            .ok_or("upstream answered without a message")?;
        let finish_reason = body
            .at("/choices/0/finish_reason")
            .cloned()
            .unwrap_or_else(|| json!("stop"));
        Ok(Reasked {
            message,
            finish_reason,
            repaired: Vec::new(),
        })
    }

    fn check_whole(
        &self,
        answer: &mut Reasked,
        tools: &ToolIndex,
        guides: &GuideCache,
        more: Option<&Check>,
    ) -> CallCheck {
        let ending = Ending::from_finish_reason(answer.finish_reason.as_str());
        let message = &mut answer.message;
        let mut check = crate::heal::check_message(message, tools, guides, ending);
        if let Some(more) = more {
            check.invalid.extend(crate::heal::take_calls(message, more));
        }
        check
    }

    fn calls_tools(answer: &Reasked) -> bool {
        calls_tools(&answer.message)
    }

    fn say(answer: &mut Reasked, words: &str) {
        crate::heal::say(&mut answer.message, words);
        if answer.finish_reason.as_str() == Some("tool_calls") {
            answer.finish_reason = json!("stop");
        }
    }

    fn answer_text(answer: &Reasked) -> Option<String> {
        answer
            .message
            .get("content")
            .and_then(Value::as_str)
            .map(str::to_owned)
    }

    fn content_text(v: &Value) -> Option<&str> {
        v.at("/choices/0/delta/content").and_then(Value::as_str)
    }

    fn held_answer(&self, text: String, finish: &Value) -> Reasked {
        let finish_reason = finish
            .at("/choices/0/finish_reason")
            .cloned()
            .unwrap_or(Value::Null);
        Reasked {
            message: json!({"role": "assistant", "content": text}),
            finish_reason,
            repaired: Vec::new(),
        }
    }

    fn salvage(answer: &mut Reasked, tools: &ToolIndex) -> crate::heal::Salvage {
        let salvage = crate::heal::salvage_text_calls(&mut answer.message, tools);
        if matches!(salvage, crate::heal::Salvage::Taken(_)) {
            answer.finish_reason = json!("tool_calls");
        }
        salvage
    }

    fn whole_events(
        &mut self,
        answer: Reasked,
        selfheal: Option<&Value>,
        _: &mut StreamReport,
    ) -> Vec<Value> {
        let base = self.template.as_ref();
        message_chunks(base, &answer.message, answer.finish_reason, selfheal)
    }
}

/// Assembles the held calls, checks and repairs them (naming the repaired in `repaired`).
/// Returns the calls and the problems of those that cannot be used.
fn complete_calls(
    pending: &mut BTreeMap<u64, PendingCall>,
    tools: &ToolIndex,
    guides: &GuideCache,
    ending: Ending,
    repaired: &mut Vec<String>,
) -> (Vec<Value>, Vec<Problem>) {
    let mut out = Vec::new();
    let mut invalid = Vec::new();
    for (idx, mut p) in std::mem::take(pending) {
        if p.id.is_empty() {
            // The model sent no id: the client needs one to send the result back.
            p.id = crate::heal::fresh_call_id();
        }
        let mut call = json!({
            "index": idx, "id": p.id, "type": "function",
            "function": {"name": p.name, "arguments": p.arguments}
        });
        match check_call(&mut call, tools, guides, ending) {
            Ok(true) => repaired.push(p.name),
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

/// Whether a complete assistant message calls tools.
pub(crate) fn calls_tools(message: &Value) -> bool {
    message
        .get("tool_calls")
        .and_then(Value::as_array)
        .is_some_and(|c| !c.is_empty())
}

/// The chunks of a complete assistant message as a stream, `[DONE]` excluded: the role with the
/// text, the tool calls (each with its `index`), then the finish with `selfheal` when given.
/// `base` lends its `id`, `created` and `model`.
pub(crate) fn message_chunks(
    base: Option<&Value>,
    message: &Value,
    finish: Value,
    selfheal: Option<&Value>,
) -> Vec<Value> {
    let text = message
        .get("content")
        .filter(|c| c.as_str().is_some_and(|t| !t.is_empty()))
        .cloned();
    let mut first = Map::new();
    first.insert("role".into(), json!("assistant"));
    if let Some(text) = text {
        first.insert("content".into(), text);
    }
    let mut out = vec![chunk(base, Value::Object(first), Value::Null)];
    let calls = indexed_calls(message);
    if !calls.is_empty() {
        out.push(chunk(base, json!({"tool_calls": calls}), Value::Null));
    }
    let mut last = chunk(base, json!({}), finish);
    if let (Some(s), Some(o)) = (selfheal, last.as_object_mut()) {
        o.insert("selfheal".into(), s.clone());
    }
    out.push(last);
    out
}

/// Frames of a complete answer sent as a stream: when the gateway answers by itself, or asked
/// the upstream without streaming (see [`message_chunks`]).
pub(crate) fn answer_frames(completion: &Value) -> Vec<Frame> {
    let message = completion
        .at("/choices/0/message")
        .cloned()
        .unwrap_or_else(|| json!({}));
    let finish = completion
        .at("/choices/0/finish_reason")
        .cloned()
        .filter(|f| !f.is_null())
        .unwrap_or_else(|| json!("stop"));
    let mut frames: Vec<Frame> = message_chunks(
        Some(completion),
        &message,
        finish,
        completion.get("selfheal"),
    )
    .iter()
    .map(data)
    .collect();
    frames.push(Ok(Bytes::from_static(b"data: [DONE]\n\n")));
    frames
}
