//! SSE streaming: text passes through at once, tool calls are held until complete and valid.
//!
//! A client acts on a tool call as soon as its stream says it is finished, so the gateway keeps
//! the tool-call deltas back, assembles each call, checks and repairs its arguments against the
//! request's schema, and sends it as one complete delta just before the chunk that carries the
//! `finish_reason`. The calls usable as written then go through [`Hooks::check`] (a call that
//! repeats the model's previous, answered one; the grounding check). When a call cannot be used
//! (unknown tool, arguments that cannot be repaired, refused by that check), the gateway asks
//! the upstream again without streaming while the ladder of its class and the run's budget
//! allow — the text already sent stays sent — and passes on the new answer's calls instead;
//! if no usable answer comes, the unusable calls are left out (never forwarded) and the stream
//! ends `partial` with why. Text deltas are forwarded the moment they arrive; a first delta
//! that carries only the role is held until something follows it.
//!
//! A stream that breaks (cut, stalled past the idle timeout, unreadable chunk, error event,
//! ended without a finish) is healed while nothing but the role has gone out: the request is
//! asked again without streaming, within the run's budget, and the answer re-emitted as SSE —
//! the client never sees the break. So is an empty 200 (llama-cpp-python's server sends one for
//! automatic tool choice). An upstream that answers a streaming request with plain JSON has its
//! answer checked as a streamed one's calls are — the same schema check, [`Hooks::check`], and
//! re-ask — and sent as SSE. Once
//! content went out, the break is never passed on as a clean finish: the client gets an
//! OpenAI-shaped error event and then a clean end of the body — so the event is flushed and the
//! SDK raises `APIError` with the upstream's message, not a connection error.
//!
//! A final answer is judged by the core as a non-streamed one is ([`Hooks::reread`],
//! [`Hooks::unsettled`]). When its first content arrives while nothing but the role has gone out
//! and no tool call is held, the core decides whether the run reads its values once more before
//! answering; if so the upstream stream is dropped, the request asked again without streaming
//! with the guidance appended, and the new answer re-emitted in its place (an answer that then
//! calls no tool, or none at all, leaves the value unread: `partial`). Deciding at the first
//! content means a model that writes text before its tool calls is asked for the read too.
//! An answer that ends without tool calls ends `partial` in its final chunk when the run has a
//! failure still open, or recovered under a policy that claims nothing after a recovery. Text
//! that went out is never taken back: the status says what it is worth.
//!
//! Upstream data is never indexed with `IndexMut` (`choices` as an object must not panic), one
//! event is at most [`MAX_EVENT_BYTES`], held tool-call arguments at most [`MAX_HELD_BYTES`], and
//! the event buffer is scanned once, from where the last scan stopped.

use std::collections::BTreeMap;

use bytes::Bytes;
use futures_util::StreamExt;
use selfheal_openai::At;
use serde_json::{Map, Value, json};
use tokio::sync::mpsc;

use std::sync::Arc;

use futures_util::future::BoxFuture;

use crate::config::OnPartial;
use crate::heal::{GuideCache, Problem, ToolIndex, check_call, problem_texts};
use selfheal_repair::Ending;

/// Largest SSE event accepted from an upstream (and largest non-SSE answer to a stream request).
pub const MAX_EVENT_BYTES: usize = 4 * 1024 * 1024;

/// Most bytes of tool-call arguments and names held back per stream.
pub const MAX_HELD_BYTES: usize = 4 * 1024 * 1024;

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

/// A hook that asks the upstream again with the problems of unusable calls (none for a
/// re-issue): the new answer, of either API, or `None`.
pub type AskAgain<R> = Box<dyn FnOnce(Vec<Problem>) -> BoxFuture<'static, Option<R>> + Send>;

/// A second answer that a re-ask brought, whichever API it answers: the calls in it whose
/// arguments were repaired go into the stream's report.
pub(crate) trait Reanswer {
    /// Takes the names of the repaired calls out of the answer.
    fn take_repaired(&mut self) -> Vec<String>;
}

impl Reanswer for Reasked {
    fn take_repaired(&mut self) -> Vec<String> {
        std::mem::take(&mut self.repaired)
    }
}

/// Re-asks once, through the relay's hook, for an answer whose calls can be used, when some of
/// the answer's calls could not be (`invalid`), and says so in `report`: the problems as
/// re-asked, with the new answer's repairs, or, when no usable answer could be had (no hook
/// left, the budget refused, the upstream failed), as left out. The new answer, if one came;
/// `None` when nothing was invalid too.
pub(crate) async fn reask_once<R: Reanswer>(
    reask: &mut Option<AskAgain<R>>,
    invalid: &[Problem],
    report: &mut StreamReport,
) -> Option<R> {
    if invalid.is_empty() {
        return None;
    }
    let again = match reask.take() {
        Some(f) => f(invalid.to_vec()).await,
        None => None,
    };
    match again {
        Some(mut r) => {
            report.reasked = problem_texts(invalid);
            report.repaired.extend(r.take_repaired());
            Some(r)
        }
        None => {
            report.invalid = problem_texts(invalid);
            None
        }
    }
}

/// A further check of the held calls once each is usable as written: takes out the calls it
/// refuses and returns their problems, which are re-asked like any unusable call (the
/// gateway's grounding check, [`crate::recover::take_ungrounded`]).
pub type Check = Box<dyn Fn(&mut Vec<Value>) -> Vec<Problem> + Send>;

/// What came of the read before answering (the core's
/// [`Controller::reread_due`](selfheal_core::controller::Controller::reread_due)), asked for
/// when a final answer (one that calls no tools) was about to go out and nothing but the role
/// had.
#[derive(Debug, Clone, PartialEq)]
pub struct Reread<A> {
    /// The answer to the request with the guidance appended, which the client gets in place of
    /// the held one; `None` when there is none (the upstream failed, or its calls could not be
    /// used): the held answer goes on.
    pub answer: Option<A>,
    /// Why the answer that goes out was not read again (the model answered without the call,
    /// or no answer came): it is flagged `partial` with this reason when it calls no tools.
    pub unread: Option<String>,
}

/// Decides, once, whether a final answer is held for the read before answering, and if so
/// asks the upstream again, without streaming, with the guidance appended. `None` when no read
/// is due.
pub type ReadAgain<A> = Box<dyn FnOnce() -> BoxFuture<'static, Option<Reread<A>>> + Send>;

/// Why a final answer cannot go out as complete, when it cannot: the core's judgement of the
/// run ([`crate::recover::unsettled`]: a failure still open, or a recovery under a policy that
/// claims nothing after one), asked when the answer ends without tool calls.
pub type Unsettled = Box<dyn Fn() -> Option<String> + Send>;

/// The run's budget as it stands (`{"spent", "limits"}`): the final report's, read when the
/// stream ends, since what the relay asked again (a re-issue, a re-ask, a read before
/// answering) was charged after the report was made.
pub type Budget = Box<dyn Fn() -> Value + Send>;

/// Receives, once, the `selfheal` report as it stands when the relay sends its first frame (see
/// `head_report`): what the response's head says, since it cannot wait for the end.
pub type Head = tokio::sync::oneshot::Sender<Value>;

/// What the relay may ask of the pipeline.
#[derive(Default)]
pub struct Hooks {
    /// Re-asks unusable tool calls.
    pub reask: Option<Reask>,
    /// Re-issues a request whose stream broke before any content.
    pub reissue: Option<Reask>,
    /// Checks the usable held calls further before they go out.
    pub check: Option<Check>,
    /// The read before answering of a final answer.
    pub reread: Option<ReadAgain<Reasked>>,
    /// The core's judgement of a final answer.
    pub unsettled: Option<Unsettled>,
    /// Where the report goes when the first frame goes out.
    pub head: Option<Head>,
    /// The run's budget for the final report.
    pub budget: Option<Budget>,
    /// What the client gets when every held call was left out ([`OnPartial`]): the words of
    /// [`crate::heal::left_out_text`] as content, or an `error` event.
    pub on_partial: OnPartial,
}

/// The report for a stream's head, sent before its first frame: `selfheal` with what the relay
/// did so far ([`note_outcome`]); `failed` with the reason when the first frame is the error
/// event of a broken stream; `partial` with `provisional`'s reason when the frame is the first
/// content of an answer that calls no tools so far and whose run the core judges unsettled (or
/// whose read before answering was not made) — the final chunk says `complete` if tool calls
/// follow after all. What happens after the first frame (a later break, calls left out) only
/// the final chunk can say.
pub(crate) fn head_report(
    selfheal: Option<&Value>,
    report: &StreamReport,
    provisional: Option<String>,
) -> Value {
    let mut head = selfheal.cloned().unwrap_or_else(|| json!({}));
    note_outcome(&mut head, report);
    let Some(o) = head.as_object_mut() else {
        return head;
    };
    if let Some(why) = &report.broken {
        o.insert("status".into(), json!("failed"));
        o.insert("reason".into(), json!(why));
    } else if o.get("status").and_then(Value::as_str) != Some("partial")
        && let Some(why) = provisional
    {
        o.insert("status".into(), json!("partial"));
        o.insert("reason".into(), json!(why));
    }
    head
}

/// Why a final answer would not be claimed complete if it ended now (the chat and Responses
/// relays): a read before answering that was not made (`unread`), else the core's judgement
/// of the run (`unsettled`).
pub(crate) fn unsettled_now(
    unread: &Option<String>,
    unsettled: Option<&Unsettled>,
) -> Option<String> {
    unread.clone().or_else(|| unsettled.and_then(|f| f()))
}

/// A final answer is ending (the chat and Responses relays): why it is not claimed complete,
/// once — a read before answering that was not made (`unread`), else the core's judgement of
/// the run (`unsettled`).
pub(crate) fn settle(
    report: &mut StreamReport,
    unread: &mut Option<String>,
    unsettled: Option<&Unsettled>,
) {
    if report.unsettled.is_some() {
        return;
    }
    report.unsettled = unread.take().or_else(|| unsettled.and_then(|f| f()));
}

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
    /// Why the stream broke, when it did and could not be healed.
    pub broken: Option<String>,
    /// Why the stream was re-issued without streaming and re-emitted, when it was.
    pub reissued: Option<String>,
    /// Whether the final answer was held for the read before answering (and the upstream asked
    /// again with its guidance).
    pub reread: bool,
    /// Why the final answer that went out is not claimed complete ([`Hooks::unsettled`], or a
    /// read before answering that was not made): the stream ends `partial` with it.
    pub unsettled: Option<String>,
    /// The Responses answer that went out whole (its id and calls), for a client that continues
    /// it with `previous_response_id`; `None` on chat completions.
    pub responded: Option<crate::runs::Responded>,
    /// The first tool call sent to the client, `(id, tool name)`: what a fresh run is named
    /// after (see `runs::RunStore::adopt`).
    pub first_call: Option<(String, String)>,
    /// The run's budget when the stream ended ([`Hooks::budget`]), which the final report
    /// shows in place of the one it was made with.
    pub budget: Option<Value>,
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

/// The client went away: stop relaying.
struct Gone;

/// What one upstream event meant.
enum Flow {
    Continue,
    Done,
    Broken(String),
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

struct Relay<'t> {
    tools: Arc<ToolIndex>,
    guides: Arc<GuideCache>,
    selfheal: Option<Value>,
    hooks: Hooks,
    tx: &'t mpsc::Sender<Frame>,
    report: StreamReport,
    pending: BTreeMap<u64, PendingCall>,
    held_bytes: usize,
    template: Option<Value>,
    /// A role-only first delta, sent just before whatever follows it.
    held_role: Option<Value>,
    /// Whether anything went to the client.
    sent: bool,
    /// Why the answer was not read again before answering, when a read was asked for and not
    /// made: the reason of a final answer's `partial`.
    unread: Option<String>,
    /// The upstream's answer was replaced by the one to the read before answering: the rest of
    /// the upstream stream is not read.
    replaced: bool,
}

/// Relays an upstream SSE response to `tx`. `selfheal` is added to the final chunk, updated with
/// what the relay did (`repair`, `reask`, `reissue`, a `partial` status for calls passed on
/// unusable).
pub async fn relay(
    upstream: reqwest::Response,
    tools: Arc<ToolIndex>,
    guides: Arc<GuideCache>,
    selfheal: Option<Value>,
    hooks: Hooks,
    tx: &mpsc::Sender<Frame>,
) -> StreamReport {
    let mut r = Relay {
        tools,
        guides,
        selfheal,
        hooks,
        tx,
        report: StreamReport::default(),
        pending: BTreeMap::new(),
        held_bytes: 0,
        template: None,
        held_role: None,
        sent: false,
        unread: None,
        replaced: false,
    };
    let outcome = if is_event_stream(&upstream) {
        r.pump(upstream).await
    } else {
        r.convert(upstream).await
    };
    if outcome.is_ok() {
        r.end().await;
    }
    r.report
}

impl Relay<'_> {
    /// Sends the head's report ([`head_report`]) before the first frame, once; `provisional`
    /// when the frame is the first content of an answer that calls no tools so far.
    fn head(&mut self, provisional: bool) {
        let Some(tx) = self.hooks.head.take() else {
            return;
        };
        let why = provisional
            .then(|| unsettled_now(&self.unread, self.hooks.unsettled.as_ref()))
            .flatten();
        let _ = tx.send(head_report(self.selfheal.as_ref(), &self.report, why));
    }

    async fn send(&mut self, v: &Value) -> Result<(), Gone> {
        if self.report.first_call.is_none()
            && let Some(c) = v.pointer("/choices/0/delta/tool_calls/0")
            && let Some(id) = c.get("id").and_then(Value::as_str)
        {
            let name = c.pointer("/function/name").and_then(Value::as_str);
            self.report.first_call = Some((id.to_owned(), name.unwrap_or("").to_owned()));
        }
        self.head(false);
        if let Some(role) = self.held_role.take() {
            self.tx.send(data(&role)).await.map_err(|_| Gone)?;
        }
        self.sent = true;
        self.tx.send(data(v)).await.map_err(|_| Gone)
    }

    /// Reads the upstream's SSE events and handles each.
    async fn pump(&mut self, upstream: reqwest::Response) -> Result<(), Gone> {
        let mut events = Events::new(upstream);
        while let Some(text) = events.next_or_break(&mut self.report.broken).await {
            if self.data_lines(&text).await? {
                break;
            }
        }
        Ok(())
    }

    /// A non-SSE answer to a streaming request: checked and sent as a stream, or broken.
    /// Feeds the `data:` lines of one event's text to [`Relay::event`]; `true` once the
    /// stream is over (done, or broken: recorded in the report).
    async fn data_lines(&mut self, text: &str) -> Result<bool, Gone> {
        for line in text.lines() {
            let Some(payload) = line.strip_prefix("data:") else {
                continue;
            };
            match self.event(payload.trim()).await? {
                Flow::Continue => {}
                Flow::Done => return Ok(true),
                Flow::Broken(why) => {
                    self.report.broken = Some(why);
                    return Ok(true);
                }
            }
        }
        Ok(false)
    }

    /// A non-SSE answer to a streaming request: its calls checked as a streamed answer's are
    /// ([`crate::heal::check_message`], then [`Hooks::check`]), unusable ones re-asked (or left
    /// out, `partial`), and the answer sent as a stream; an answer that does not parse breaks
    /// the stream (re-issued by [`Relay::end`] while nothing went out).
    async fn convert(&mut self, upstream: reqwest::Response) -> Result<(), Gone> {
        let parsed = crate::upstream::read_bounded(upstream, MAX_EVENT_BYTES)
            .await
            .and_then(|b| selfheal_openai::parse_completion(&b));
        let mut body = match parsed {
            Ok(c) => c.body,
            Err(e) => {
                self.report.broken = Some(format!(
                    "upstream answered a streaming request without a usable stream: {e}"
                ));
                return Ok(());
            }
        };
        self.template = Some(body.clone());
        let finish = body
            .at("/choices/0/finish_reason")
            .cloned()
            .unwrap_or_else(|| json!("stop"));
        let Some(message) = body.at_mut("/choices/0/message") else {
            self.report.broken = Some("upstream answered without a message".into());
            return Ok(());
        };
        let ending = Ending::from_finish_reason(finish.as_str());
        let mut check = crate::heal::check_message(message, &self.tools, &self.guides, ending);
        // The further check of the usable calls (a repetition, the grounding check), as for
        // the calls of a streamed answer ([`Relay::finish`]).
        if let Some(more) = &self.hooks.check {
            check.invalid.extend(crate::heal::take_calls(message, more));
        }
        self.report.repaired.extend(check.repaired);
        let mut message = message.clone();
        let mut finish = finish;
        // Unusable calls in a converted answer: re-asked as for a held stream; an answer that
        // cannot be had goes out without them, `partial`.
        match reask_once(&mut self.hooks.reask, &check.invalid, &mut self.report).await {
            Some(r) => {
                message = r.message;
                finish = r.finish_reason;
            }
            None if !check.invalid.is_empty()
                && !calls_tools(&message)
                && finish.as_str() == Some("tool_calls") =>
            {
                finish = json!("stop");
            }
            None => {}
        }
        self.emit_message(&message, finish).await
    }

    /// Sends a complete assistant message as stream chunks, up to the finish; `[DONE]` is
    /// [`Relay::end`]'s to send, once.
    async fn emit_message(&mut self, message: &Value, finish: Value) -> Result<(), Gone> {
        let mut message = message.clone();
        let mut finish = finish;
        if !calls_tools(&message)
            && let Some(r) = self.reread().await
        {
            message = r.message;
            finish = r.finish_reason;
        }
        if !calls_tools(&message) {
            self.settle();
            if !self.report.invalid.is_empty() {
                // Every call was left out: said in words, or an error event (see `finish`).
                let words = crate::heal::left_out_text(&self.report.invalid);
                if self.hooks.on_partial == OnPartial::Error {
                    self.report.finished = true;
                    return self.send(&left_out_error(&words)).await;
                }
                crate::heal::say(&mut message, &words);
            }
        }
        let message = &message;
        let base = self.template.clone();
        self.report.finished = true;
        self.report.budget = self.hooks.budget.as_ref().map(|b| b());
        let selfheal = self.selfheal.as_mut().map(|s| {
            note_outcome(s, &self.report);
            s.clone()
        });
        for c in message_chunks(base.as_ref(), message, finish, selfheal.as_ref()) {
            self.send(&c).await?;
        }
        self.report.broken = None;
        Ok(())
    }

    /// The read before answering of a final answer about to go out, while nothing but the
    /// role has ([`Hooks::reread`], decided once): the answer to ask for in its place, if
    /// one came. A read that was not made is remembered for [`Relay::settle`].
    async fn reread(&mut self) -> Option<Reasked> {
        if self.sent {
            return None;
        }
        let ask = self.hooks.reread.take()?;
        let outcome = ask().await?;
        self.report.reread = true;
        self.unread = outcome.unread;
        let answer = outcome.answer?;
        // The held answer is dropped: the client gets the new one from its first chunk.
        self.held_role = None;
        self.pending.clear();
        self.held_bytes = 0;
        self.replaced = true;
        self.report.repaired.extend(answer.repaired.iter().cloned());
        Some(answer)
    }

    /// A final answer (no tool calls) is ending: the core's judgement of the run, or a read
    /// before answering that was not made, flags it `partial`.
    fn settle(&mut self) {
        settle(
            &mut self.report,
            &mut self.unread,
            self.hooks.unsettled.as_ref(),
        );
    }

    fn attach_selfheal(&mut self, v: &mut Value) {
        self.report.budget = self.hooks.budget.as_ref().map(|b| b());
        if let Some(s) = &mut self.selfheal {
            note_outcome(s, &self.report);
            if let Some(o) = v.as_object_mut() {
                o.insert("selfheal".into(), s.clone());
            }
        }
    }

    /// Handles one `data:` payload.
    async fn event(&mut self, payload: &str) -> Result<Flow, Gone> {
        if payload == "[DONE]" || self.replaced {
            return Ok(Flow::Done);
        }
        let Ok(mut v) = serde_json::from_str::<Value>(payload) else {
            return Ok(Flow::Broken(
                "upstream sent an unreadable stream chunk".into(),
            ));
        };
        if let Some(e) = v.get("error") {
            let message = e
                .get("message")
                .and_then(Value::as_str)
                .map_or_else(|| e.to_string(), str::to_owned);
            return Ok(Flow::Broken(format!("upstream stream error: {message}")));
        }
        // `choices` must be a list of objects: read as a pointer would read it, `{"0": ...}`
        // would pass for a list and go to the client as it came.
        match v.get("choices") {
            None | Some(Value::Null) => {}
            Some(Value::Array(c)) if c.iter().all(Value::is_object) => {}
            Some(_) => {
                return Ok(Flow::Broken(
                    "upstream sent a stream chunk whose `choices` is not a list of choices".into(),
                ));
            }
        }
        if self.template.is_none() {
            self.template = Some(v.clone());
        }
        let finish = v
            .at("/choices/0/finish_reason")
            .filter(|f| !f.is_null())
            .cloned();
        if let Some(calls) = v
            .at_mut("/choices/0/delta")
            .and_then(Value::as_object_mut)
            .and_then(|d| d.remove("tool_calls"))
        {
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
                return Ok(Flow::Broken(format!(
                    "upstream tool calls exceed {MAX_HELD_BYTES} bytes"
                )));
            }
        }
        if let Some(finish) = finish {
            // Nothing but the role went out, no call is held and this chunk says nothing: the
            // answer is empty, as a whole answer with no content is, and is re-issued.
            let says = v
                .at("/choices/0/delta")
                .and_then(Value::as_object)
                .is_some_and(|d| {
                    d.iter()
                        .any(|(k, x)| k != "role" && !x.is_null() && (k != "content" || x != ""))
                });
            if !self.sent && self.pending.is_empty() && !says {
                return Ok(Flow::Broken(
                    "upstream finished the answer without content or a tool call".into(),
                ));
            }
            self.finish(v, finish).await?;
            return Ok(Flow::Continue);
        }
        let delta = v.at("/choices/0/delta").and_then(Value::as_object);
        let has_payload = delta.is_some_and(|d| {
            d.iter()
                .any(|(k, x)| !x.is_null() && (k != "content" || x != ""))
        }) || v.get("usage").is_some_and(|u| !u.is_null());
        let role_only = delta.is_some_and(|d| {
            d.iter()
                .all(|(k, x)| k == "role" || x.is_null() || (k == "content" && x == ""))
        }) && v.get("usage").is_none_or(Value::is_null);
        let content = delta.is_some_and(|d| {
            d.iter()
                .any(|(k, x)| k != "role" && !x.is_null() && (k != "content" || x != ""))
        });
        if has_payload && role_only && !self.sent {
            self.held_role = Some(v);
        } else if has_payload || v.at("/choices/0").is_none() {
            // The first content of an answer that has called no tools so far: the last moment
            // the read before answering can hold it.
            if content
                && self.pending.is_empty()
                && let Some(r) = self.reread().await
            {
                self.emit_message(&r.message, r.finish_reason).await?;
                return Ok(Flow::Done);
            }
            if content && self.pending.is_empty() {
                self.head(true);
            }
            self.send(&v).await?;
        }
        Ok(Flow::Continue)
    }

    /// The chunk with the `finish_reason`: the held calls go out first, checked (re-asked once
    /// if unusable), then the chunk with the `selfheal` report.
    async fn finish(&mut self, mut v: Value, mut finish: Value) -> Result<(), Gone> {
        if self.pending.is_empty()
            && let Some(r) = self.reread().await
        {
            return self.emit_message(&r.message, r.finish_reason).await;
        }
        if !self.pending.is_empty() {
            let ending = Ending::from_finish_reason(finish.as_str());
            let (mut calls, mut invalid) = complete_calls(
                &mut self.pending,
                &self.tools,
                &self.guides,
                ending,
                &mut self.report,
            );
            if let Some(check) = &self.hooks.check {
                invalid.extend(check(&mut calls));
            }
            if let Some(r) = reask_once(&mut self.hooks.reask, &invalid, &mut self.report).await {
                finish = r.finish_reason;
                calls = indexed_calls(&r.message);
                let text = r
                    .message
                    .get("content")
                    .filter(|c| c.as_str().is_some_and(|t| !t.is_empty()));
                if calls.is_empty()
                    && let Some(text) = text
                {
                    let c = chunk(Some(&v), json!({"content": text}), Value::Null);
                    self.send(&c).await?;
                }
            }
            if !calls.is_empty() {
                let c = chunk(Some(&v), json!({"tool_calls": calls}), Value::Null);
                self.send(&c).await?;
            } else if !self.report.invalid.is_empty() {
                // Every call was left out: the answer no longer ends in calls, and says so in
                // words (never an empty message), or is an error event the SDKs raise.
                let words = crate::heal::left_out_text(&self.report.invalid);
                if self.hooks.on_partial == OnPartial::Error {
                    self.report.finished = true;
                    return self.send(&left_out_error(&words)).await;
                }
                let c = chunk(
                    Some(&v),
                    json!({"content": format!("\n\n{words}")}),
                    Value::Null,
                );
                self.send(&c).await?;
                finish = json!("stop");
            } else if finish.as_str() == Some("tool_calls") {
                // Every call was left out: the answer no longer ends in calls.
                finish = json!("stop");
            }
            if calls.is_empty() {
                self.settle();
            }
        } else {
            self.settle();
        }
        set_choice(&mut v, "finish_reason", finish);
        self.attach_selfheal(&mut v);
        self.report.finished = true;
        self.send(&v).await
    }

    /// After the upstream ended: `[DONE]` after a clean finish; a re-issue when nothing but
    /// the role went out; else an error event, flushed, then a clean end.
    async fn end(&mut self) {
        if self.report.finished && self.report.broken.is_none() {
            let _ = self
                .tx
                .send(Ok(Bytes::from_static(b"data: [DONE]\n\n")))
                .await;
            return;
        }
        if self.report.finished {
            // A finish went out and the stream broke after it: the answer is whole.
            self.report.broken = None;
            let _ = self
                .tx
                .send(Ok(Bytes::from_static(b"data: [DONE]\n\n")))
                .await;
            return;
        }
        let why = self
            .report
            .broken
            .clone()
            .unwrap_or_else(|| "upstream stream ended before the answer was finished".into());
        if !self.sent
            && let Some(f) = self.hooks.reissue.take()
        {
            self.pending.clear();
            if let Some(again) = f(Vec::new()).await {
                self.report.reissued = Some(why);
                self.report.broken = None;
                self.report.repaired.extend(again.repaired);
                if self
                    .emit_message(&again.message, again.finish_reason)
                    .await
                    .is_ok()
                {
                    let _ = self
                        .tx
                        .send(Ok(Bytes::from_static(b"data: [DONE]\n\n")))
                        .await;
                }
                return;
            }
        }
        self.report.broken = Some(why.clone());
        self.head(false);
        // The error event, then a clean end of the body: an `Err` right after it would make
        // hyper abort the connection before the event is flushed.
        let _ = self
            .tx
            .send(data(&json!({"error": {
                "message": why, "type": "upstream_error", "param": null, "code": "stream_broken"
            }})))
            .await;
    }
}

/// The error event of an answer whose calls were all left out, under
/// `[server] on_partial = "error"`: the SDKs raise it.
fn left_out_error(words: &str) -> Value {
    json!({"error": {"message": words, "type": "selfheal_error", "param": null,
                     "code": "calls_left_out"}})
}

/// Assembles the held calls, checks and repairs them. Returns the calls and the problems of
/// those that cannot be used.
fn complete_calls(
    pending: &mut BTreeMap<u64, PendingCall>,
    tools: &ToolIndex,
    guides: &GuideCache,
    ending: Ending,
    report: &mut StreamReport,
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
pub(crate) fn note_outcome(selfheal: &mut Value, report: &StreamReport) {
    let Some(o) = selfheal.as_object_mut() else {
        return;
    };
    if let Some(actions) = o.get_mut("actions").and_then(Value::as_array_mut) {
        for (did, name) in [
            (!report.repaired.is_empty(), "repair"),
            (!report.reasked.is_empty(), "reask"),
            (report.reissued.is_some(), "reissue"),
            (report.reread, "reread"),
        ] {
            if did && !actions.iter().any(|a| a == name) {
                actions.push(json!(name));
            }
        }
    }
    if let Some(b) = &report.budget {
        o.insert("budget".into(), b.clone());
    }
    if !report.invalid.is_empty() {
        o.insert("status".into(), json!("partial"));
        o.insert("reason".into(), json!(report.invalid.join(" ")));
    } else if let Some(why) = &report.unsettled {
        o.insert("status".into(), json!("partial"));
        o.insert("reason".into(), json!(why));
    }
}

/// Whether a complete assistant message calls tools.
fn calls_tools(message: &Value) -> bool {
    message
        .get("tool_calls")
        .and_then(Value::as_array)
        .is_some_and(|c| !c.is_empty())
}

/// Whether an upstream answered with an event stream (`text/event-stream`), not a whole answer.
pub(crate) fn is_event_stream(upstream: &reqwest::Response) -> bool {
    upstream
        .headers()
        .get(reqwest::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.trim_start().starts_with("text/event-stream"))
}

/// An upstream's SSE body read one event at a time, for both relays: each event's text (its
/// lines, without the blank line that ends it), a last event without its blank line (some
/// servers omit it) included. Linear in the body: a partial event's bytes are scanned once, not
/// from its start again on each chunk; an event larger than [`MAX_EVENT_BYTES`] breaks the
/// stream rather than growing the buffer without bound.
pub(crate) struct Events {
    body: futures_util::stream::BoxStream<'static, Result<Bytes, crate::upstream::BodyError>>,
    buf: Vec<u8>,
    /// Where in `buf` the next event starts.
    start: usize,
    /// How far past `start` a scan has found no end of event yet.
    scanned: usize,
    ended: bool,
}

impl Events {
    /// The events of `upstream`'s body.
    pub(crate) fn new(upstream: reqwest::Response) -> Events {
        Events {
            body: crate::upstream::body_stream(upstream),
            buf: Vec::new(),
            start: 0,
            scanned: 0,
            ended: false,
        }
    }

    /// The next event's text; `None` once the body has ended, or once it broke, with why in
    /// `broken` (a relay's [`StreamReport::broken`]).
    pub(crate) async fn next_or_break(&mut self, broken: &mut Option<String>) -> Option<String> {
        match self.next().await {
            Ok(text) => text,
            Err(why) => {
                *broken = Some(why);
                None
            }
        }
    }

    /// The next event's text; `Ok(None)` once the body has ended; `Err` with why when it
    /// broke (a read error, an idle timeout, an event too large). Not to be called again after
    /// `Ok(None)` or `Err`.
    pub(crate) async fn next(&mut self) -> Result<Option<String>, String> {
        loop {
            if let Some((end, sep)) = find_event_end(&self.buf[self.start..], self.scanned) {
                let event = &self.buf[self.start..self.start + end];
                let text = String::from_utf8_lossy(event).into_owned();
                self.start += end + sep;
                self.scanned = 0;
                return Ok(Some(text));
            }
            self.buf.drain(..self.start);
            self.start = 0;
            self.scanned = self.buf.len().saturating_sub(3);
            if self.buf.len() > MAX_EVENT_BYTES {
                return Err(format!(
                    "upstream sent a stream event larger than {MAX_EVENT_BYTES} bytes"
                ));
            }
            if self.ended {
                return Ok(None);
            }
            match self.body.next().await {
                Some(Ok(piece)) => self.buf.extend_from_slice(&piece),
                Some(Err(e)) => return Err(e.to_string()),
                None => {
                    // The body ended: what is left is its last event.
                    self.ended = true;
                    let rest = String::from_utf8_lossy(&self.buf).into_owned();
                    self.buf.clear();
                    return Ok(Some(rest));
                }
            }
        }
    }
}

/// Finds the end of the first SSE event, scanning from `from` (where an earlier scan of the
/// same bytes stopped): (position of the blank line, its length).
pub(crate) fn find_event_end(buf: &[u8], from: usize) -> Option<(usize, usize)> {
    let mut i = from;
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

/// The chunks of a complete assistant message as a stream, `[DONE]` excluded: the role with the
/// text, the tool calls (each with its `index`), then the finish with `selfheal` when given.
/// `base` lends its `id`, `created` and `model`.
pub fn message_chunks(
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
pub fn answer_frames(completion: &Value) -> Vec<Frame> {
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

#[cfg(test)]
mod tests {
    use super::*;

    /// An upstream response whose body arrives in these chunks (an `Err` chunk breaks it).
    fn chunked(chunks: Vec<Result<Vec<u8>, std::io::Error>>) -> reqwest::Response {
        let http = axum::http::Response::builder()
            .header("content-type", "text/event-stream")
            .body(reqwest::Body::wrap_stream(futures_util::stream::iter(
                chunks,
            )))
            .unwrap();
        reqwest::Response::from(http)
    }

    async fn all(mut events: Events) -> (Vec<String>, Option<String>) {
        let mut out = Vec::new();
        loop {
            match events.next().await {
                Ok(Some(t)) => out.push(t),
                Ok(None) => return (out, None),
                Err(why) => return (out, Some(why)),
            }
        }
    }

    /// However the body is cut into chunks, the same events come out, in order: both blank-line
    /// forms end an event, and a last event without its blank line is still read.
    #[tokio::test]
    async fn events_are_read_whole_across_any_chunking() {
        let body = b"data: 1\n\ndata: 2\r\n\r\nevent: x\ndata: 3\n\ndata: 4";
        for size in 1..body.len() {
            let chunks = body.chunks(size).map(|c| Ok(c.to_vec())).collect();
            let (events, broken) = all(Events::new(chunked(chunks))).await;
            assert_eq!(broken, None, "chunks of {size}");
            assert_eq!(
                events,
                ["data: 1", "data: 2", "event: x\ndata: 3", "data: 4"],
                "chunks of {size}"
            );
        }
    }

    /// An event that grows past [`MAX_EVENT_BYTES`] without ending breaks the stream after the
    /// events before it; a read error breaks it too, with its reason.
    #[tokio::test]
    async fn an_oversized_event_or_a_read_error_breaks_the_stream() {
        let big = vec![b'x'; 64 * 1024];
        let mut chunks = vec![Ok(b"data: 1\n\ndata: ".to_vec())];
        chunks.extend((0..=MAX_EVENT_BYTES / big.len()).map(|_| Ok(big.clone())));
        let (events, broken) = all(Events::new(chunked(chunks))).await;
        assert_eq!(events, ["data: 1"]);
        assert!(broken.is_some_and(|w| w.contains("larger than")));

        let chunks = vec![
            Ok(b"data: 1\n\n".to_vec()),
            Err(std::io::Error::other("reset by peer")),
        ];
        let (events, broken) = all(Events::new(chunked(chunks))).await;
        assert_eq!(events, ["data: 1"]);
        assert!(broken.is_some(), "a read error is a break");
    }
}
