//! Streaming for OpenAI's Responses API (`POST /v1/responses` with `stream: true`): its event
//! grammar for the one relay, [`crate::relay`], which heals it as it heals a chat stream.
//!
//! A Responses stream is a sequence of typed events (`response.created`, `response.in_progress`,
//! `response.output_item.added`, `response.output_text.delta`, ...,
//! `response.function_call_arguments.delta`, `response.output_item.done`, and one terminal
//! event: `response.completed` or `response.incomplete`). The relay:
//!
//! - **holds the preamble** — `response.created`, `response.in_progress`, `response.queued`, and
//!   a message item or content part announced before any of its text — until the first event that
//!   carries content. While nothing else has gone out, a broken stream (cut, stalled past the idle
//!   timeout, unreadable event, `error` or `response.failed` event, ended without a terminal
//!   event, an empty 200) is re-issued without streaming, within the run's budget, through the
//!   core's [`stream_broke`](selfheal_core::stream_broke), and the new answer is re-emitted
//!   as a complete event stream: the client never sees the break.
//! - **holds every `function_call` item** until the terminal event, then checks and repairs its
//!   arguments against the request's tools (the same non-corrupting path as chat). An unusable
//!   call is never forwarded: it is re-asked while the ladder of its class allows,
//!   else left out and the answer flagged `partial`. A call of a response that ended
//!   `incomplete` (the output token limit) that is not JSON as written, or whose item never
//!   finished, is never repaired into a call.
//! - after content went out, ends a broken stream with an `error` event — the Responses shape
//!   (`type`, `code`, `message`, `param`, `sequence_number`) plus an `error` object, which makes
//!   the `openai` SDKs raise `APIError` with the message — and then a clean end of the body, so
//!   the event is flushed (an `Err` right after it would make hyper drop it).
//!
//! - judges a final answer (no `function_call` item) as a chat stream does (see
//!   [`crate::stream`]): at its first content, while nothing but the preamble went out, the
//!   read before answering may hold it and send the answer to the request with the guidance in
//!   its place; it ends `partial` over an open failure, under a policy that claims nothing after
//!   a recovery, or when the read was not made.
//!
//! Events are renumbered (`sequence_number`) and output items re-indexed (`output_index`) as
//! they go out, since held calls go out after the text and dropped calls leave no gap. The
//! terminal event's `response.output` lists exactly the items the client got, and carries the
//! `selfheal` report.
//!
//! Held bytes (preamble and calls) are bounded by [`MAX_HELD_BYTES`], one event by
//! [`MAX_EVENT_BYTES`]; the event buffer is scanned once.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use bytes::Bytes;
use serde_json::{Value, json};
use tokio::sync::mpsc;

use crate::heal::{CallCheck, GuideCache, Problem, ToolIndex, check_call};
use crate::relay::{AskAgain, Check, Frame, Grammar, MAX_HELD_BYTES, Read, Reanswer, StreamReport};
use selfheal_repair::{ArgumentsError, Ending};

/// A new, checked answer from a non-streaming call: a whole Responses object.
#[derive(Debug, Clone, PartialEq)]
pub struct Reanswered {
    /// The response object (its `function_call` items checked and repaired).
    pub response: Value,
    /// Calls of the new answer whose arguments were repaired.
    pub repaired: Vec<String>,
}

/// Asks the upstream again without streaming: with the problems of unusable calls appended (a
/// re-ask), or with none (a re-issue of a stream that broke before any content). `None` when the
/// policy or the budget refuses, the upstream fails, or the new answer's calls cannot be used.
pub type Reask = AskAgain<Reanswered>;

/// What the relay may ask of the pipeline for a Responses stream.
pub type Hooks = crate::relay::Hooks<Reanswered>;

impl Reanswer for Reanswered {
    fn take_repaired(&mut self) -> Vec<String> {
        std::mem::take(&mut self.repaired)
    }
}

/// Relays an upstream Responses stream to `tx`, healed by [`crate::relay`] (see the module
/// docs). `selfheal` is added to the terminal event's `response`, updated with what the relay
/// did.
pub async fn relay(
    upstream: reqwest::Response,
    tools: Arc<ToolIndex>,
    guides: Arc<GuideCache>,
    selfheal: Option<Value>,
    hooks: Hooks,
    tx: &mpsc::Sender<Frame>,
) -> StreamReport {
    let g = Responses::default();
    crate::relay::relay(g, upstream, tools, guides, selfheal, hooks, tx).await
}

/// The ending of a Responses answer: `incomplete` (the token limit) is a cut-off.
fn ending_of(response: &Value) -> Ending {
    if response.get("status").and_then(Value::as_str) == Some("incomplete") {
        Ending::CutOff
    } else {
        Ending::Finished
    }
}

/// Checks one `function_call` item in place (repaired arguments written back, its name added to
/// `repaired`). `finished`: whether the item was seen whole (its `output_item.done`, status not
/// `incomplete`); a call that is not is refused as cut off, whatever its arguments look like.
fn check_item(
    item: &mut Value,
    (finished, ending): (bool, Ending),
    tools: &ToolIndex,
    guides: &GuideCache,
    repaired: &mut Vec<String>,
) -> Result<(), Problem> {
    let name = item
        .get("name")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_owned();
    let cut = !finished || item.get("status").and_then(Value::as_str) == Some("incomplete");
    crate::heal::ensure_id(item, "call_id");
    if cut {
        return Err(Problem::arguments(
            ArgumentsError::CutOff.reask_message("", &name),
        ));
    }
    let mut call = json!({"function": {
        "name": name,
        "arguments": item.get("arguments").cloned().unwrap_or(Value::Null),
    }});
    let changed = check_call(&mut call, tools, guides, ending)?;
    if changed
        && let (Some(o), Some(a)) = (item.as_object_mut(), call.pointer("/function/arguments"))
    {
        o.insert("arguments".into(), a.clone());
    }
    if changed {
        repaired.push(name);
    }
    Ok(())
}

/// Checks the `function_call` items of a whole Responses answer in place: repaired arguments are
/// written back, unusable calls taken out (never forwarded). After `status: "incomplete"` only
/// arguments that are JSON as written are taken, and an item marked `incomplete` is refused.
pub(crate) fn check_response(
    answer: &mut Value,
    tools: &ToolIndex,
    guides: &GuideCache,
) -> CallCheck {
    let ending = ending_of(answer);
    let mut out = CallCheck::default();
    let Some(items) = answer.get_mut("output").and_then(Value::as_array_mut) else {
        return out;
    };
    items.retain_mut(|item| {
        if crate::heal::item_type(item) != Some("function_call") {
            return true;
        }
        let checked = check_item(item, (true, ending), tools, guides, &mut out.repaired);
        checked.map_err(|e| out.invalid.push(e)).is_ok()
    });
    out
}

/// A `function_call` item held until the response ends.
struct HeldCall {
    item: Value,
    /// Its arguments as streamed so far (the `done` events replace them).
    arguments: String,
    /// Whether its `response.output_item.done` arrived.
    done: bool,
}
/// The SSE frame of one event: `event: <type>` (when it is a plain name) and its data.
fn frame(v: &Value) -> Frame {
    let ty = v
        .get("type")
        .and_then(Value::as_str)
        .filter(|t| !t.is_empty() && !t.contains(['\r', '\n']));
    Ok(Bytes::from(match ty {
        Some(t) => format!("event: {t}\ndata: {v}\n\n"),
        None => format!("data: {v}\n\n"),
    }))
}

/// Whether an event carries no content: what may be held and dropped on a re-issue.
fn is_preamble(v: &Value) -> bool {
    let empty_message = |item: Option<&Value>| {
        item.is_some_and(|i| {
            crate::heal::item_type(i) == Some("message")
                && i.get("content")
                    .and_then(Value::as_array)
                    .is_none_or(Vec::is_empty)
        })
    };
    match crate::heal::item_type(v) {
        Some("response.created" | "response.in_progress" | "response.queued") => true,
        Some("response.output_item.added") => empty_message(v.get("item")),
        Some("response.content_part.added") => v
            .pointer("/part/text")
            .and_then(Value::as_str)
            .is_none_or(str::is_empty),
        _ => false,
    }
}

/// The Responses grammar's state: the held preamble and calls, and the numbering of what went
/// out.
#[derive(Default)]
pub(crate) struct Responses {
    /// Preamble events not sent yet (sent before the first content).
    held: Vec<Value>,
    held_bytes: usize,
    /// `function_call` items by their upstream `output_index`.
    calls: BTreeMap<u64, HeldCall>,
    /// Upstream `output_index` → the client's, for the items passed on.
    index: HashMap<u64, u64>,
    /// The output items the client got whole, by the client's `output_index`.
    items: BTreeMap<u64, Value>,
    next_index: u64,
    seq: u64,
    /// The response as `response.created` (or a later preamble event) described it: what an
    /// answer cut short ends with ([`Grammar::cut`]).
    skeleton: Option<Value>,
    /// Message items under way (by the client's `output_index`) and the text of theirs the
    /// client got — the deltas sent, not those read: closed as `incomplete` with it when the
    /// answer is cut short, so that the closing item says what the deltas said (the delta that
    /// showed a degenerate run is read and never sent).
    open: BTreeMap<u64, (Value, String)>,
}

impl Responses {
    /// The client's `output_index` for upstream index `i` (a new one on first sight).
    fn client_index(&mut self, i: u64) -> u64 {
        if let Some(c) = self.index.get(&i) {
            return *c;
        }
        let c = self.next_index;
        self.next_index += 1;
        self.index.insert(i, c);
        c
    }

    /// One event of a held `function_call` item.
    fn hold_call(&mut self, i: u64, ty: &str, v: Value) -> Read {
        let call = self.calls.entry(i).or_insert_with(|| HeldCall {
            item: json!({"type": "function_call"}),
            arguments: String::new(),
            done: false,
        });
        match ty {
            "response.output_item.added" => {
                if let Some(item) = v.get("item") {
                    call.item = item.clone();
                }
            }
            "response.function_call_arguments.delta" => {
                let d = v.get("delta").and_then(Value::as_str).unwrap_or("");
                call.arguments.push_str(d);
                self.held_bytes += d.len();
            }
            "response.function_call_arguments.done" => {
                if let Some(a) = v.get("arguments").and_then(Value::as_str) {
                    self.held_bytes += a.len();
                    call.arguments = a.to_owned();
                }
            }
            "response.output_item.done" => {
                if let Some(item) = v.get("item") {
                    call.item = item.clone();
                    if let Some(a) = item.get("arguments").and_then(Value::as_str) {
                        call.arguments = a.to_owned();
                    }
                    call.done = true;
                }
            }
            _ => {}
        }
        if self.held_bytes > MAX_HELD_BYTES {
            return Read::Broken(format!(
                "upstream function calls exceed {MAX_HELD_BYTES} bytes"
            ));
        }
        Read::Held
    }

    /// The events of a whole output item, numbered as the next one out (and remembered for the
    /// terminal event's `output`).
    fn item(&mut self, item: Value) -> Vec<Value> {
        let c = self.next_index;
        self.next_index += 1;
        let events = item_events(&item, c);
        self.items.insert(c, item);
        events
    }

    /// Whether a call went out.
    fn called(&self) -> bool {
        self.items.values().any(is_call)
    }

    /// Notes what an answer cut short must close: the response described so far, the message
    /// items under way (their text is noted as it is sent, [`Responses::note_said`]).
    fn note_open(&mut self, v: &Value, ty: &str, client: Option<u64>) {
        if let Some(r) = v.get("response").filter(|r| r.is_object()) {
            self.skeleton = Some(r.clone());
        }
        let Some(c) = client else { return };
        match ty {
            "response.output_item.added"
                if v.pointer("/item/type").and_then(Value::as_str) == Some("message") =>
            {
                let item = v.get("item").cloned().unwrap_or(Value::Null);
                self.open.insert(c, (item, String::new()));
            }
            "response.output_item.done" => {
                self.open.remove(&c);
            }
            _ => {}
        }
    }

    /// Adds the text of a delta going out to the message item under way it belongs to.
    fn note_said(&mut self, v: &Value) {
        if crate::heal::item_type(v) != Some("response.output_text.delta") {
            return;
        }
        let c = v.get("output_index").and_then(Value::as_u64);
        if let (Some((_, text)), Some(d)) = (
            c.and_then(|c| self.open.get_mut(&c)),
            v.get("delta").and_then(Value::as_str),
        ) && text.len() + d.len() <= MAX_HELD_BYTES
        {
            text.push_str(d);
        }
    }

    /// An event that is neither a call's nor the terminal one: held when it is preamble and
    /// nothing went out, else renumbered content.
    fn other(&mut self, mut v: Value, ty: &str, payload: &str, sent: bool) -> Read {
        let upstream_index = v.get("output_index").and_then(Value::as_u64);
        let client = upstream_index.map(|i| self.client_index(i));
        if let Some(c) = client {
            v["output_index"] = json!(c);
        }
        self.note_open(&v, ty, client);
        if is_preamble(&v) && !sent {
            self.held_bytes += payload.len();
            if self.held_bytes > MAX_HELD_BYTES {
                return Read::Broken(format!("upstream preamble exceeds {MAX_HELD_BYTES} bytes"));
            }
            self.held.push(v);
            return Read::Held;
        }
        if let Some(c) = client
            && ty == "response.output_item.done"
            && let Some(item) = v.get("item")
        {
            self.items.insert(c, item.clone());
        }
        Read::Content(v)
    }
}

impl Grammar for Responses {
    type Answer = Reanswered;
    const READS_PAST_FINISH: bool = false;
    const UNFINISHED: &'static str = "upstream stream ended before the response was finished";

    fn payloads(text: &str) -> Vec<String> {
        let data: Vec<&str> = text
            .lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .map(|d| d.strip_prefix(' ').unwrap_or(d))
            .collect();
        if data.is_empty() {
            return Vec::new();
        }
        vec![data.join("\n")]
    }

    fn read(&mut self, payload: &str, sent: bool) -> Read {
        if payload.trim() == "[DONE]" {
            return Read::Done;
        }
        let Ok(v) = serde_json::from_str::<Value>(payload) else {
            return Read::Broken("upstream sent an unreadable stream event".into());
        };
        // Every Responses event is an object with a `type`: anything else is not passed on.
        let Some(ty) = crate::heal::item_type(&v).map(str::to_owned) else {
            return Read::Broken("upstream sent a stream event without a `type`".into());
        };
        match ty.as_str() {
            "error" => return Read::Broken(format!("upstream stream error: {}", message_of(&v))),
            "response.failed" => {
                let m = v
                    .pointer("/response/error")
                    .map_or_else(|| "the response failed".to_owned(), message_of);
                return Read::Broken(format!("upstream stream error: {m}"));
            }
            "response.completed" | "response.incomplete" => return Read::Finish(v),
            _ => {}
        }
        if let Some(e) = v.get("error").filter(|e| !e.is_null()) {
            return Read::Broken(format!("upstream stream error: {}", message_of(e)));
        }
        // Function calls: held whole until the response ends — every event of one, whatever
        // order they come in; none is passed on as it came.
        let of_call = v.pointer("/item/type").and_then(Value::as_str) == Some("function_call")
            || ty.starts_with("response.function_call_arguments.");
        match v.get("output_index").and_then(Value::as_u64) {
            Some(i) if of_call || self.calls.contains_key(&i) => self.hold_call(i, &ty, v),
            None if of_call => {
                Read::Broken("upstream sent a function call event without `output_index`".into())
            }
            _ => self.other(v, &ty, payload, sent),
        }
    }

    fn says_nothing(&self, finish: &Value) -> Option<String> {
        let said = finish.get("response").is_some_and(has_answer);
        (!said).then(|| "upstream ended the response without an answer".into())
    }

    fn holds_calls(&self) -> bool {
        !self.calls.is_empty()
    }

    fn take_calls(
        &mut self,
        finish: &Value,
        tools: &ToolIndex,
        guides: &GuideCache,
        repaired: &mut Vec<String>,
    ) -> (Vec<Value>, Vec<Problem>) {
        let ending = if crate::heal::item_type(finish) == Some("response.incomplete") {
            Ending::CutOff
        } else {
            finish.get("response").map_or(Ending::Finished, ending_of)
        };
        let mut ready = Vec::new();
        let mut invalid = Vec::new();
        for (_, mut c) in std::mem::take(&mut self.calls) {
            if let Some(o) = c.item.as_object_mut() {
                o.insert("arguments".into(), Value::String(c.arguments.clone()));
            }
            match check_item(&mut c.item, (c.done, ending), tools, guides, repaired) {
                Ok(()) => ready.push(c.item),
                Err(e) => invalid.push(e),
            }
        }
        (ready, invalid)
    }

    fn calls_out(
        &mut self,
        finish: &mut Value,
        ready: Vec<Value>,
        again: Option<Reanswered>,
    ) -> (Vec<Value>, bool) {
        let mut replacement = Vec::new();
        if let Some(r) = again {
            replacement = new_items(&r.response);
            // The answer is now the new one's: its status, its reason if incomplete.
            if let Some(resp) = finish.get_mut("response").and_then(Value::as_object_mut) {
                for key in ["status", "incomplete_details"] {
                    if let Some(x) = r.response.get(key) {
                        resp.insert(key.into(), x.clone());
                    }
                }
            }
            if let Some(o) = finish.as_object_mut() {
                o.insert("type".into(), json!(terminal_type(&r.response)));
            }
        }
        let mut out = Vec::new();
        for item in ready.into_iter().chain(replacement) {
            out.extend(self.item(item));
        }
        (out, self.called())
    }

    fn say_left_out(&mut self, _: &mut Value, words: &str) -> Vec<Value> {
        let item = json!({"type": "message", "id": "msg_selfheal", "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": words, "annotations": []}]});
        self.item(item)
    }

    fn uncalled(&mut self, _: &mut Value) {}

    /// The terminal event's `response` lists exactly the items the client got and carries the
    /// `selfheal` report; the answer is what a client continuing it (`previous_response_id`)
    /// continues ([`StreamReport::responded`]).
    fn seal(&mut self, finish: &mut Value, selfheal: Option<&Value>, report: &mut StreamReport) {
        let output: Vec<Value> = self.items.values().cloned().collect();
        if let Some(resp) = finish.get_mut("response").and_then(Value::as_object_mut) {
            resp.insert("output".into(), Value::Array(output));
            if let Some(s) = selfheal {
                resp.insert("selfheal".into(), s.clone());
            }
        }
        report.responded = finish.get("response").and_then(crate::runs::Responded::of);
    }

    /// The messages under way closed as `incomplete` with the text the client got of them, and a
    /// `response.incomplete` (reason `max_output_tokens`, the API's word for an answer cut
    /// short), its `output` written when it is sealed.
    fn cut(&mut self) -> (Vec<Value>, Value) {
        let mut events = Vec::new();
        for (c, (mut item, text)) in std::mem::take(&mut self.open) {
            if let Some(o) = item.as_object_mut() {
                o.insert("status".into(), json!("incomplete"));
                o.insert(
                    "content".into(),
                    json!([{"type": "output_text", "text": text, "annotations": []}]),
                );
            }
            events.push(
                json!({"type": "response.output_item.done", "output_index": c,
                               "item": item.clone()}),
            );
            self.items.insert(c, item);
        }
        let mut response = self.skeleton.clone().unwrap_or_else(|| json!({}));
        if let Some(o) = response.as_object_mut() {
            o.insert("status".into(), json!("incomplete"));
            o.insert(
                "incomplete_details".into(),
                json!({"reason": "max_output_tokens"}),
            );
        }
        let finish = json!({"type": "response.incomplete", "response": response});
        (events, finish)
    }

    fn error_event(message: &str, kind: &str, code: &str) -> Value {
        // The SDKs raise `APIError` for an event with an `error` object.
        json!({
            "type": "error", "code": code, "message": message, "param": null,
            "error": {"message": message, "type": kind, "param": null, "code": code},
        })
    }

    fn done_marker() -> Option<Frame> {
        None
    }

    fn take_held(&mut self) -> Vec<Value> {
        self.held_bytes = 0;
        std::mem::take(&mut self.held)
    }

    fn frame(&mut self, mut v: Value) -> Frame {
        self.note_said(&v);
        if let Some(o) = v.as_object_mut() {
            o.insert("sequence_number".into(), json!(self.seq));
        }
        self.seq += 1;
        frame(&v)
    }

    fn reset(&mut self) {
        self.calls.clear();
        self.held.clear();
        self.held_bytes = 0;
        self.index.clear();
        self.items.clear();
        self.next_index = 0;
        self.open.clear();
    }

    fn parse_whole(&mut self, bytes: &[u8]) -> Result<Reanswered, String> {
        let response = read_response(bytes).map_err(crate::relay::unusable_stream)?;
        Ok(Reanswered {
            response,
            repaired: Vec::new(),
        })
    }

    fn check_whole(
        &self,
        answer: &mut Reanswered,
        tools: &ToolIndex,
        guides: &GuideCache,
        more: Option<&Check>,
    ) -> CallCheck {
        let response = &mut answer.response;
        let mut check = check_response(response, tools, guides);
        if let Some(more) = more
            && let Some(items) = response.get_mut("output").and_then(Value::as_array_mut)
        {
            check.invalid.extend(more(items));
        }
        check
    }

    fn calls_tools(answer: &Reanswered) -> bool {
        answer
            .response
            .get("output")
            .and_then(Value::as_array)
            .is_some_and(|o| o.iter().any(is_call))
    }

    fn say(answer: &mut Reanswered, words: &str) {
        crate::pipeline::say_in_output(&mut answer.response, words);
    }

    fn answer_text(answer: &Reanswered) -> Option<String> {
        output_text(&answer.response)
    }

    fn content_text(v: &Value) -> Option<&str> {
        if crate::heal::item_type(v) != Some("response.output_text.delta") {
            return None;
        }
        v.get("delta").and_then(Value::as_str)
    }

    fn held_answer(&self, text: String, finish: &Value) -> Reanswered {
        let mut response = finish.get("response").cloned().unwrap_or_else(|| json!({}));
        let message = json!({"type": "message", "id": "msg_selfheal", "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": text, "annotations": []}]});
        if let Some(o) = response.as_object_mut() {
            // The held text in one message, in place of the messages that carried it.
            let mut output: Vec<Value> = o
                .get("output")
                .and_then(Value::as_array)
                .map(|items| {
                    items
                        .iter()
                        .filter(|i| crate::heal::item_type(i) != Some("message"))
                        .cloned()
                        .collect()
                })
                .unwrap_or_default();
            output.insert(0, message);
            o.insert("output".into(), Value::Array(output));
        }
        Reanswered {
            response,
            repaired: Vec::new(),
        }
    }

    fn salvage(answer: &mut Reanswered, tools: &ToolIndex) -> crate::heal::Salvage {
        crate::heal::salvage_output_calls(&mut answer.response, tools)
    }

    fn whole_events(
        &mut self,
        answer: Reanswered,
        selfheal: Option<&Value>,
        report: &mut StreamReport,
    ) -> Vec<Value> {
        let response = answer.response;
        let mut head = response.clone();
        if let Some(o) = head.as_object_mut() {
            o.insert("status".into(), json!("in_progress"));
            o.insert("output".into(), json!([]));
            o.remove("usage");
            o.remove("selfheal");
        }
        let mut out = vec![
            json!({"type": "response.created", "response": head.clone()}),
            json!({"type": "response.in_progress", "response": head}),
        ];
        let items: Vec<Value> = response
            .get("output")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        for item in items {
            out.extend(self.item(item));
        }
        let mut terminal = json!({"type": terminal_type(&response), "response": response});
        self.seal(&mut terminal, selfheal, report);
        out.push(terminal);
        out
    }
}

/// Whether an output item is a `function_call`.
fn is_call(item: &Value) -> bool {
    crate::heal::item_type(item) == Some("function_call")
}

/// Reads a whole Responses answer (a non-streaming one, or one sent to a streaming request): an
/// object with an `output` list that holds an answer ([`has_answer`]). A `failed` response is
/// the upstream's server error (its message kept); an empty one is empty; any other shape
/// cannot be decoded. The one check for both, so the call plan retries or falls back alike.
///
/// # Errors
///
/// As above.
pub(crate) fn read_response(bytes: &[u8]) -> Result<Value, selfheal_openai::ClientError> {
    use selfheal_openai::ClientError;
    let v: Value = serde_json::from_slice(bytes).map_err(|e| ClientError::Decode(e.to_string()))?;
    if v.get("status").and_then(Value::as_str) == Some("failed") {
        let message = v
            .get("error")
            .filter(|e| !e.is_null())
            .map_or_else(|| "the response failed".to_owned(), message_of);
        return Err(ClientError::Status {
            status: 500,
            retry_after_ms: None,
            message,
        });
    }
    if !v.get("output").is_some_and(Value::is_array) {
        return Err(ClientError::Decode("a response without `output`".into()));
    }
    if !has_answer(&v) {
        return Err(ClientError::EmptyResponse);
    }
    Ok(v)
}

/// Whether a response's `output` holds an answer: an item other than a message or reasoning
/// (a function call, a built-in tool's call), or a message with text or a refusal in it. An
/// empty list, or only empty messages and reasoning, is no answer.
pub(crate) fn has_answer(response: &Value) -> bool {
    let said = |part: &Value| {
        ["text", "refusal"].iter().any(|k| {
            part.get(*k)
                .and_then(Value::as_str)
                .is_some_and(|t| !t.trim().is_empty())
        })
    };
    response
        .get("output")
        .and_then(Value::as_array)
        .is_some_and(|items| {
            items.iter().any(|i| match crate::heal::item_type(i) {
                Some("message") => i
                    .get("content")
                    .and_then(Value::as_array)
                    .is_some_and(|parts| parts.iter().any(said)),
                Some("reasoning") => false,
                _ => true,
            })
        })
}

/// The message text of an error object (or its JSON).
fn message_of(e: &Value) -> String {
    e.get("message")
        .and_then(Value::as_str)
        .map_or_else(|| e.to_string(), str::to_owned)
}

/// The items of a new answer that replace unusable calls: its `function_call` items, or, when it
/// has none, its messages.
fn new_items(response: &Value) -> Vec<Value> {
    let items = response
        .get("output")
        .and_then(Value::as_array)
        .map_or(&[][..], Vec::as_slice);
    let of = |kind: &str| -> Vec<Value> {
        items
            .iter()
            .filter(|i| crate::heal::item_type(i) == Some(kind))
            .cloned()
            .collect()
    };
    let calls = of("function_call");
    if calls.is_empty() {
        of("message")
    } else {
        calls
    }
}

/// The events of one whole output item at client index `index` (sequence numbers are stamped
/// when sent): `output_item.added`, its content or arguments, `output_item.done`.
pub(crate) fn item_events(item: &Value, index: u64) -> Vec<Value> {
    let id = item.get("id").cloned().unwrap_or(Value::Null);
    let mut added = item.clone();
    let mut out = Vec::new();
    match crate::heal::item_type(item) {
        Some("function_call") => {
            let args = item.get("arguments").and_then(Value::as_str).unwrap_or("");
            if let Some(o) = added.as_object_mut() {
                o.insert("arguments".into(), json!(""));
                o.insert("status".into(), json!("in_progress"));
            }
            out.push(
                json!({"type": "response.output_item.added", "output_index": index,
                            "item": added}),
            );
            out.push(
                json!({"type": "response.function_call_arguments.delta", "item_id": id,
                            "output_index": index, "delta": args}),
            );
            out.push(
                json!({"type": "response.function_call_arguments.done", "item_id": id,
                            "output_index": index, "arguments": args}),
            );
        }
        Some("message") => {
            if let Some(o) = added.as_object_mut() {
                o.insert("content".into(), json!([]));
                o.insert("status".into(), json!("in_progress"));
            }
            out.push(
                json!({"type": "response.output_item.added", "output_index": index,
                            "item": added}),
            );
            let parts = item
                .get("content")
                .and_then(Value::as_array)
                .map_or(&[][..], Vec::as_slice);
            for (ci, part) in parts.iter().enumerate() {
                let text = part.get("text").and_then(Value::as_str);
                let mut empty = part.clone();
                if text.is_some() {
                    empty["text"] = json!("");
                }
                out.push(json!({"type": "response.content_part.added", "item_id": id,
                                "output_index": index, "content_index": ci, "part": empty}));
                if let (Some(text), Some("output_text")) = (text, crate::heal::item_type(part)) {
                    out.push(json!({"type": "response.output_text.delta", "item_id": id,
                                    "output_index": index, "content_index": ci,
                                    "delta": text, "logprobs": []}));
                    out.push(json!({"type": "response.output_text.done", "item_id": id,
                                    "output_index": index, "content_index": ci,
                                    "text": text, "logprobs": []}));
                }
                out.push(json!({"type": "response.content_part.done", "item_id": id,
                                "output_index": index, "content_index": ci, "part": part}));
            }
        }
        _ => out.push(
            json!({"type": "response.output_item.added", "output_index": index,
                             "item": item}),
        ),
    }
    out.push(json!({"type": "response.output_item.done", "output_index": index, "item": item}));
    out
}

/// Frames of a whole Responses answer sent as a stream (the gateway answering by itself): the
/// events the relay sends for a whole answer, its `selfheal` report in the terminal one.
pub(crate) fn answer_frames(response: &Value) -> Vec<Frame> {
    let mut g = Responses::default();
    let selfheal = response.get("selfheal").cloned();
    let answer = Reanswered {
        response: response.clone(),
        repaired: Vec::new(),
    };
    let events = g.whole_events(answer, selfheal.as_ref(), &mut StreamReport::default());
    events.into_iter().map(|e| g.frame(e)).collect()
}

/// The terminal event of a whole response: `response.incomplete` when its status says so (cut
/// by `max_output_tokens`), else `response.completed`.
fn terminal_type(response: &Value) -> &'static str {
    match response.get("status").and_then(Value::as_str) {
        Some("incomplete") => "response.incomplete",
        _ => "response.completed",
    }
}

/// The text of a response's `message` output items (`output_text` parts), joined; `None`
/// when it has none.
pub(crate) fn output_text(response: &Value) -> Option<String> {
    let mut out = String::new();
    for item in response.get("output").and_then(Value::as_array)? {
        if crate::heal::item_type(item) != Some("message") {
            continue;
        }
        for part in item
            .get("content")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            if let Some(t) = part.get("text").and_then(Value::as_str) {
                out.push_str(t);
                out.push('\n');
            }
        }
    }
    (!out.is_empty()).then_some(out)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;

    fn tools() -> ToolIndex {
        let parameters = json!({"type": "object", "properties": {"query": {"type": "string"}},
                                "required": ["query"]});
        let mut t = ToolIndex::new();
        t.insert(
            "search".into(),
            crate::heal::ToolSpec {
                schema_key: parameters.to_string(),
                required: selfheal_repair::required_properties(&parameters),
                parameters,
            },
        );
        t
    }

    fn sse(events: &[Value]) -> reqwest::Response {
        let body: String = events
            .iter()
            .map(|e| format!("event: x\ndata: {e}\n\n"))
            .collect();
        let http = axum::http::Response::builder()
            .header("content-type", "text/event-stream")
            .body(body)
            .unwrap();
        reqwest::Response::from(http)
    }

    /// A whole answer the gateway streams by itself ends the way its status says: a response
    /// cut by `max_output_tokens` in `response.incomplete`, never `response.completed`.
    #[test]
    fn a_whole_answer_sent_as_a_stream_ends_as_its_status_says() {
        let last = |status: &str| {
            let frames = answer_frames(&json!({"id": "resp_1", "status": status, "output": []}));
            let text = String::from_utf8(frames.last().unwrap().as_ref().unwrap().to_vec());
            text.unwrap().lines().next().unwrap().to_owned()
        };
        assert_eq!(last("incomplete"), "event: response.incomplete");
        assert_eq!(last("completed"), "event: response.completed");
    }

    fn created() -> Value {
        json!({"type": "response.created", "response": {"id": "resp_1", "object": "response",
               "status": "in_progress", "output": []}})
    }

    fn call_events(args: &str, done: bool) -> Vec<Value> {
        let item = json!({"type": "function_call", "id": "fc_1", "call_id": "call_1",
                          "name": "search", "arguments": "", "status": "in_progress"});
        let mut out = vec![
            json!({"type": "response.output_item.added", "output_index": 0, "item": item}),
            json!({"type": "response.function_call_arguments.delta", "output_index": 0,
                   "item_id": "fc_1", "delta": args}),
        ];
        if done {
            let mut whole = item;
            whole["arguments"] = json!(args);
            whole["status"] = json!("completed");
            out.push(
                json!({"type": "response.output_item.done", "output_index": 0,
                            "item": whole}),
            );
        }
        out
    }

    async fn run(upstream: reqwest::Response, hooks: Hooks) -> (Vec<Value>, StreamReport) {
        let (tx, mut rx) = mpsc::channel(256);
        let report = relay(
            upstream,
            Arc::new(tools()),
            Arc::new(GuideCache::default()),
            Some(json!({"status": "complete", "actions": []})),
            hooks,
            &tx,
        )
        .await;
        drop(tx);
        let mut events = Vec::new();
        while let Some(f) = rx.recv().await {
            let text = String::from_utf8(f.unwrap().to_vec()).unwrap();
            let data = text.lines().find_map(|l| l.strip_prefix("data: ")).unwrap();
            events.push(serde_json::from_str(data).unwrap());
        }
        (events, report)
    }

    fn types(events: &[Value]) -> Vec<&str> {
        events.iter().map(|e| e["type"].as_str().unwrap()).collect()
    }

    #[tokio::test]
    async fn a_call_is_held_repaired_and_sent_whole_before_the_end() {
        let mut events = vec![created()];
        events.extend(call_events(r#"{"query": "rust",}"#, true));
        events.push(
            json!({"type": "response.completed", "response": {"id": "resp_1",
                          "status": "completed", "output": []}}),
        );
        let (out, report) = run(sse(&events), Hooks::default()).await;
        assert_eq!(report.repaired, vec!["search".to_owned()]);
        let done = out
            .iter()
            .find(|e| e["type"] == "response.output_item.done")
            .unwrap();
        assert_eq!(done["item"]["arguments"], json!(r#"{"query":"rust"}"#));
        let last = out.last().unwrap();
        assert_eq!(last["type"], "response.completed");
        assert_eq!(
            last["response"]["output"][0]["arguments"],
            done["item"]["arguments"]
        );
        assert_eq!(last["response"]["selfheal"]["actions"], json!(["repair"]));
        let seq: Vec<u64> = out
            .iter()
            .map(|e| e["sequence_number"].as_u64().unwrap())
            .collect();
        assert_eq!(seq, (0..out.len() as u64).collect::<Vec<_>>());
    }

    #[tokio::test]
    async fn a_call_cut_by_the_token_limit_is_never_sent() {
        let mut events = vec![created()];
        events.extend(call_events(r#"{"query": "ru"#, false));
        events.push(
            json!({"type": "response.incomplete", "response": {"id": "resp_1",
                          "status": "incomplete",
                          "incomplete_details": {"reason": "max_output_tokens"}, "output": []}}),
        );
        let (out, report) = run(sse(&events), Hooks::default()).await;
        assert!(!sent_a_call(&out), "{out:?}");
        assert_eq!(report.invalid.len(), 1);
        assert!(report.invalid[0].contains("cut off"), "{report:?}");
        let last = out.last().unwrap();
        assert_eq!(last["type"], "response.incomplete");
        assert_eq!(last["response"]["selfheal"]["status"], "partial");
        // Issue 30: not an empty answer; one that says the call was left out, and why.
        let output = last["response"]["output"].as_array().unwrap();
        assert_eq!(output.len(), 1, "{output:?}");
        assert_eq!(output[0]["type"], "message");
        let text = output[0]["content"][0]["text"].as_str().unwrap();
        assert!(
            text.contains("left out") && text.contains("cut off"),
            "{text}"
        );
    }

    /// Whether a `function_call` item went out.
    fn sent_a_call(out: &[Value]) -> bool {
        out.iter().any(|e| {
            e["type"] == "response.output_item.added" && e["item"]["type"] == "function_call"
        })
    }

    #[tokio::test]
    async fn a_complete_json_call_in_an_item_left_unfinished_is_refused() {
        // The arguments happen to parse, but the item never finished: not a call.
        let mut events = vec![created()];
        events.extend(call_events(r#"{"query": "ru"}"#, false));
        events.push(
            json!({"type": "response.incomplete", "response": {"status": "incomplete",
                          "output": []}}),
        );
        let (out, report) = run(sse(&events), Hooks::default()).await;
        assert_eq!(report.invalid.len(), 1);
        assert!(!sent_a_call(&out), "{out:?}");
    }

    #[tokio::test]
    async fn a_break_after_the_preamble_only_is_reissued() {
        let events = vec![
            created(),
            json!({"type": "response.output_item.added", "output_index": 0,
                   "item": {"type": "message", "id": "m", "role": "assistant", "content": []}}),
        ];
        let hooks = Hooks {
            reask: None,
            reissue: Some(Box::new(|problems: Vec<Problem>| {
                assert!(problems.is_empty());
                Box::pin(async {
                    Some(Reanswered {
                        response: json!({"id": "resp_2", "status": "completed", "output": [
                            {"type": "message", "id": "m2", "role": "assistant",
                             "status": "completed",
                             "content": [{"type": "output_text", "text": "again",
                                          "annotations": []}]}]}),
                        repaired: Vec::new(),
                    })
                })
            })),
            check: None,
            ..Hooks::default()
        };
        let (out, report) = run(sse(&events), hooks).await;
        assert!(
            report.reissued.is_some() && report.broken.is_none(),
            "{report:?}"
        );
        assert_eq!(
            types(&out)
                .iter()
                .filter(|t| **t == "response.created")
                .count(),
            1,
            "the broken preamble is not sent: {out:?}"
        );
        let text: String = out
            .iter()
            .filter(|e| e["type"] == "response.output_text.delta")
            .map(|e| e["delta"].as_str().unwrap())
            .collect();
        assert_eq!(text, "again");
        assert_eq!(
            out.last().unwrap()["response"]["selfheal"]["actions"],
            json!(["reissue"])
        );
    }

    #[tokio::test]
    async fn a_break_after_content_ends_in_one_error_event() {
        let events = vec![
            created(),
            json!({"type": "response.output_text.delta", "output_index": 0, "delta": "Half"}),
        ];
        let hooks = Hooks {
            reask: None,
            reissue: Some(Box::new(|_| panic!("content went out: no re-issue"))),
            check: None,
            ..Hooks::default()
        };
        let (out, report) = run(sse(&events), hooks).await;
        assert_eq!(
            types(&out),
            vec!["response.created", "response.output_text.delta", "error"]
        );
        assert!(report.broken.is_some());
        assert_eq!(out[2]["error"]["code"], "stream_broken");
    }

    /// Found by `responses_relay_props`: a `function_call` item's `done` (or an arguments
    /// delta) without its `added` event was passed on unchecked.
    #[tokio::test]
    async fn issue13_call_events_without_their_added_event_are_held_and_checked() {
        let events = vec![
            created(),
            json!({"type": "response.function_call_arguments.delta", "output_index": 3,
                   "delta": "{\"query\": "}),
            json!({"type": "response.output_item.done", "output_index": 4,
                   "item": {"type": "function_call", "id": "fc", "name": "nope",
                            "arguments": "{}", "status": "completed"}}),
            json!({"type": "response.completed", "response": {"status": "completed",
                   "output": []}}),
        ];
        let (out, report) = run(sse(&events), Hooks::default()).await;
        assert!(!sent_a_call(&out), "{out:?}");
        let ty = types(&out);
        assert_eq!(ty.first(), Some(&"response.created"), "{out:?}");
        assert_eq!(ty.last(), Some(&"response.completed"), "{out:?}");
        assert_eq!(report.invalid.len(), 2, "{report:?}");
        let last = out.last().unwrap();
        assert_eq!(last["response"]["selfheal"]["status"], "partial");
        // Issue 30: the answer says in words that the calls were left out.
        assert!(last["response"]["output"].to_string().contains("left out"));
    }

    /// Issue 30: under `on_partial = "error"` an answer whose calls were all left out is an
    /// `error` event with an `error` object, which the SDKs raise.
    #[tokio::test]
    async fn calls_left_out_are_an_error_event_when_so_configured() {
        let mut events = vec![created()];
        events.extend(call_events(r#"{"query": "ru"#, false));
        events.push(
            json!({"type": "response.incomplete", "response": {"status": "incomplete",
                          "output": []}}),
        );
        let hooks = Hooks {
            on_partial: crate::config::OnPartial::Error,
            ..Hooks::default()
        };
        let (out, report) = run(sse(&events), hooks).await;
        assert_eq!(report.invalid.len(), 1);
        assert!(!sent_a_call(&out), "{out:?}");
        let last = out.last().unwrap();
        assert_eq!(last["type"], "error", "{out:?}");
        assert_eq!(last["error"]["code"], "calls_left_out");
    }

    /// Issue 30: a whole answer to a streaming request whose calls cannot be used and are not
    /// re-asked says so in words, as a streamed one does (and chat's did): never an empty
    /// answer.
    #[tokio::test]
    async fn a_whole_answer_whose_calls_are_left_out_says_so() {
        let body = json!({"id": "resp_1", "status": "completed", "output": [
            {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "nope",
             "arguments": "{}", "status": "completed"}]});
        let http = axum::http::Response::builder()
            .header("content-type", "application/json")
            .body(body.to_string())
            .unwrap();
        let (out, report) = run(reqwest::Response::from(http), Hooks::default()).await;
        assert_eq!(report.invalid.len(), 1, "{report:?}");
        assert!(!sent_a_call(&out), "{out:?}");
        let last = out.last().unwrap();
        assert_eq!(last["type"], "response.completed", "{out:?}");
        assert_eq!(last["response"]["selfheal"]["status"], "partial");
        assert!(last["response"]["output"].to_string().contains("left out"));
    }

    /// Found by `responses_relay_props`: an event that is not an object with a `type` was
    /// passed on to the client.
    #[tokio::test]
    async fn issue13_an_event_without_a_type_breaks_the_stream() {
        let events = vec![created(), json!([1, 2])];
        let (out, report) = run(sse(&events), Hooks::default()).await;
        assert_eq!(types(&out), vec!["error"], "{out:?}");
        assert!(
            report
                .broken
                .is_some_and(|b| b.contains("without a `type`"))
        );
    }

    #[tokio::test]
    async fn an_unusable_call_is_reasked_and_replaced() {
        let mut events = vec![created()];
        events.extend(call_events(r#"{"limit": 3}"#, true));
        events.push(
            json!({"type": "response.completed", "response": {"status": "completed",
                          "output": []}}),
        );
        let hooks = Hooks {
            reask: Some(Box::new(|problems: Vec<Problem>| {
                assert_eq!(problems.len(), 1);
                Box::pin(async {
                    Some(Reanswered {
                        response: json!({"status": "completed", "output": [
                            {"type": "function_call", "id": "fc_2", "call_id": "call_2",
                             "name": "search", "arguments": "{\"query\":\"x\"}",
                             "status": "completed"}]}),
                        repaired: Vec::new(),
                    })
                })
            })),
            reissue: None,
            check: None,
            ..Hooks::default()
        };
        let (out, report) = run(sse(&events), hooks).await;
        assert_eq!(report.reasked.len(), 1);
        let args: Vec<&Value> = out
            .iter()
            .filter(|e| e["type"] == "response.function_call_arguments.done")
            .map(|e| &e["arguments"])
            .collect();
        assert_eq!(args, vec![&json!("{\"query\":\"x\"}")]);
        assert!(
            !out.iter().any(|e| e.to_string().contains("limit")),
            "{out:?}"
        );
    }
}
