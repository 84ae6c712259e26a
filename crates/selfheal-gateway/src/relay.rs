//! The one stream relay: how the gateway heals an upstream event stream, written once for every
//! API and generic over its event grammar ([`Grammar`]).
//!
//! The chat completions stream ([`crate::stream`]) and the Responses stream
//! ([`crate::responses_stream`]) differ only in how their events are spelled; what the gateway
//! does with them is the same, and lives here:
//!
//! - content passes through at once; whatever carries no content yet (chat's role-only first
//!   delta, the Responses preamble) and every tool call is held by the grammar;
//! - at the first content of an answer that has called no tools so far, and at a final answer's
//!   end, the core decides whether the run reads its values once more before answering
//!   ([`Hooks::reread`]); if so the upstream is dropped and the answer to the request with the
//!   guidance appended goes out in its place;
//! - at the end of the answer the held calls are assembled, checked and repaired against the
//!   request's tools, checked further ([`Hooks::check`]: a repetition, the grounding check),
//!   and the unusable ones re-asked without streaming ([`Hooks::reask`]) or left out, said in
//!   words (or an error event under `on_partial = "error"`); a final answer is judged by the
//!   core ([`Hooks::unsettled`]) and ends `partial` when the run is not settled;
//! - a stream that breaks (cut, stalled, unreadable, an error event, ended without a finish, an
//!   empty answer) is re-issued without streaming ([`Hooks::reissue`]) while nothing but held
//!   events went out — the client never sees the break — and after content ends in the
//!   grammar's error event, flushed, and a clean end of the body;
//! - an upstream that answers a streaming request with a whole answer has it checked as a
//!   streamed one is and sent as a stream;
//! - when the request allows it ([`Hooks::salvage`]), a final answer whose first non-space
//!   content opens a fence, a `{` or a call tag ([`opens_text_call`]) is held to its end
//!   (within [`MAX_HELD_BYTES`]) and the calls of offered tools it writes as text are taken as
//!   calls ([`Grammar::salvage`], issue 31) and sent as a whole answer; text that writes none
//!   goes out as it was;
//! - when the content degenerates ([`Hooks::degenerate`]: a run of whitespace, one piece
//!   repeated, judged by the core's [`selfheal_core::degenerate::judge`] on the stream's tail),
//!   the upstream is cut off (its request dropped, so it stops generating): while nothing went
//!   out, calls written as text before the run are taken, else the model is re-asked once with
//!   the problem named, else what it said before the run goes out `partial`; after content, the
//!   answer ends there, `partial` with the reason (never `complete`);
//! - when the client goes away, the relay stops at once, whatever it was waiting for, and the
//!   upstream request is dropped ([`StreamReport::cancelled`]);
//! - the response's head gets the report as it stood at the first frame ([`Hooks::head`]), the
//!   final event the whole one, and the pipeline a [`StreamReport`].
//!
//! The relay decides nothing itself: every decision is a hook the pipeline wires to the core's
//! run. One event is at most [`MAX_EVENT_BYTES`], held bytes at most [`MAX_HELD_BYTES`]; the
//! event buffer is scanned once.

use std::sync::Arc;

use bytes::Bytes;
use futures_util::StreamExt;
use futures_util::future::BoxFuture;
use serde_json::{Value, json};
use tokio::sync::mpsc;

use crate::action::Action;
use crate::config::OnPartial;
use crate::heal::{
    CallCheck, GuideCache, Problem, Salvage, ToolIndex, left_out_text, problem_texts,
};
use crate::report::Status;
use selfheal_core::degenerate::{self, Degenerate};

/// Largest SSE event accepted from an upstream (and largest non-SSE answer to a stream request).
pub(crate) const MAX_EVENT_BYTES: usize = 4 * 1024 * 1024;

/// Most bytes held back per stream (tool-call arguments and names, a held preamble).
pub const MAX_HELD_BYTES: usize = 4 * 1024 * 1024;

/// A frame for the client.
pub type Frame = Result<Bytes, std::io::Error>;

/// A hook that asks the upstream again with the problems of unusable calls (none for a
/// re-issue): the new answer, of either API, or `None`.
pub(crate) type AskAgain<R> = Box<dyn FnOnce(Vec<Problem>) -> BoxFuture<'static, Option<R>> + Send>;

/// A further check of the held calls once each is usable as written: takes out the calls it
/// refuses and returns their problems, which are re-asked like any unusable call (the
/// gateway's grounding check, [`crate::recover::take_ungrounded`]).
pub type Check = Box<dyn Fn(&mut Vec<Value>) -> Vec<Problem> + Send>;

/// What came of the read before answering (the core's
/// [`Controller::reread_due`](selfheal_core::Controller::reread_due)), asked for
/// when a final answer (one that calls no tools) was about to go out and nothing but held
/// events had.
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
pub(crate) type ReadAgain<A> = Box<dyn FnOnce() -> BoxFuture<'static, Option<Reread<A>>> + Send>;

/// Why a final answer cannot go out as complete, when it cannot: the core's judgement of the
/// run ([`crate::recover::unsettled`]: a failure still open, or a recovery under a policy that
/// claims nothing after one), asked when the answer ends without tool calls.
pub(crate) type Unsettled = Box<dyn Fn() -> Option<String> + Send>;

/// The core's grounding rule on a final answer's text (issue 31): why its numbers cannot be
/// claimed, if they cannot ([`crate::recover::ungrounded_answer`], the request's evidence
/// read while it was at hand).
pub(crate) type Grounding = Box<dyn Fn(&str) -> Option<String> + Send>;

/// Most bytes of a streamed final answer's text kept for the grounding rule; beyond, the rest
/// is not judged.
pub(crate) const MAX_SAID_BYTES: usize = 256 * 1024;

/// The run's budget as it stands (`{"spent", "limits"}`): the final report's, read when the
/// stream ends, since what the relay asked again (a re-issue, a re-ask, a read before
/// answering) was charged after the report was made.
pub(crate) type Budget = Box<dyn Fn() -> Value + Send>;

/// Receives, once, the `selfheal` report as it stands when the relay sends its first frame (see
/// `head_report`): what the response's head says, since it cannot wait for the end.
pub(crate) type Head = tokio::sync::oneshot::Sender<Value>;

/// A second answer that a re-ask brought, whichever API it answers: the calls in it whose
/// arguments were repaired go into the stream's report.
pub(crate) trait Reanswer {
    /// Takes the names of the repaired calls out of the answer.
    fn take_repaired(&mut self) -> Vec<String>;
}

/// What the relay may ask of the pipeline, for answers of type `A` (the grammar's
/// [`Grammar::Answer`]).
pub struct Hooks<A> {
    /// Re-asks unusable tool calls.
    pub reask: Option<AskAgain<A>>,
    /// Re-issues a request whose stream broke before any content.
    pub reissue: Option<AskAgain<A>>,
    /// Checks the usable held calls further before they go out.
    pub check: Option<Check>,
    /// The read before answering of a final answer.
    pub reread: Option<ReadAgain<A>>,
    /// The core's judgement of a final answer.
    pub unsettled: Option<Unsettled>,
    /// The core's grounding rule on a final answer's text (`None`: the request offers no tools).
    pub grounding: Option<Grounding>,
    /// Where the report goes when the first frame goes out.
    pub head: Option<Head>,
    /// The run's budget for the final report.
    pub budget: Option<Budget>,
    /// What the client gets when every held call was left out ([`OnPartial`]): the words of
    /// [`crate::heal::left_out_text`] as content, or an error event.
    pub on_partial: OnPartial,
    /// Whether calls written as text may be taken as calls (issue 31): the request offered
    /// tools and did not set `tool_choice: "none"`. A final answer whose first content opens
    /// a fence, a `{` or a call tag is then held to its end ([`opens_text_call`]).
    pub salvage: bool,
    /// When the content counts as degenerate and is cut (`[limits.degenerate]`); `None`: never.
    pub degenerate: Option<degenerate::Limits>,
}

impl<A> Default for Hooks<A> {
    fn default() -> Self {
        Hooks {
            reask: None,
            reissue: None,
            check: None,
            reread: None,
            unsettled: None,
            grounding: None,
            head: None,
            budget: None,
            on_partial: OnPartial::default(),
            salvage: false,
            degenerate: None,
        }
    }
}

/// What happened to a stream, reported when it ends.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StreamReport {
    /// The upstream finished cleanly.
    pub finished: bool,
    /// Tool calls repaired in place.
    pub repaired: Vec<String>,
    /// Tool calls the model wrote as text in its content, taken as calls (issue 31).
    pub salvaged: usize,
    /// Tool calls that could not be used (left out).
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
    /// Why the upstream's answer was cut, when it degenerated ([`Hooks::degenerate`]).
    pub cut: Option<String>,
    /// The client went away before the relay was done: the upstream request was dropped.
    pub cancelled: bool,
}

/// What one upstream event is, once a grammar has read it.
pub(crate) enum Read {
    /// Nothing to pass on now: held by the grammar (a tool call, a preamble), or empty.
    Held,
    /// Content for the client: the first of a final answer may be held for the read before
    /// answering.
    Content(Value),
    /// Something for the client that is not content (usage, a chunk without a choice).
    Pass(Value),
    /// The event that ends the answer (chat's `finish_reason` chunk, a terminal event).
    Finish(Value),
    /// The upstream said it is done.
    Done,
    /// The stream broke, with why.
    Broken(String),
}

/// One API's event grammar: what the relay needs to read upstream events into a neutral form
/// ([`Read`], held calls) and to render its decisions back into that API's events. A grammar
/// holds what is held (calls, a preamble) and the numbering of what went out; it decides
/// nothing.
pub(crate) trait Grammar: Send {
    /// A whole answer of this API (a second asking's, or one sent to a streaming request).
    type Answer: Reanswer + Send;
    /// Whether the relay reads on after the event that ends the answer (chat's `[DONE]`).
    const READS_PAST_FINISH: bool;
    /// Why a stream that ended without a finish broke.
    const UNFINISHED: &'static str;

    /// The payloads of one SSE event's text, each read by [`Grammar::read`].
    fn payloads(text: &str) -> Vec<String>;
    /// Reads one payload; `sent`: whether anything went to the client yet.
    fn read(&mut self, payload: &str, sent: bool) -> Read;
    /// Why the event that ends the answer ends it without one, when it does (an empty answer,
    /// re-issued while nothing went out).
    fn says_nothing(&self, finish: &Value) -> Option<String>;
    /// Whether a tool call is held.
    fn holds_calls(&self) -> bool;
    /// The held calls assembled and checked against `tools`: those usable as written
    /// (repaired ones named in `repaired`), and the problems of the others.
    fn take_calls(
        &mut self,
        finish: &Value,
        tools: &ToolIndex,
        guides: &GuideCache,
        repaired: &mut Vec<String>,
    ) -> (Vec<Value>, Vec<Problem>);
    /// The events that send the usable calls (`ready`), or in their place a re-ask's answer
    /// (`again`), whose end is written into `finish`; and whether a call is among them.
    fn calls_out(
        &mut self,
        finish: &mut Value,
        ready: Vec<Value>,
        again: Option<Self::Answer>,
    ) -> (Vec<Value>, bool);
    /// The events that say, in words, that every call was left out; `finish` no longer ends in
    /// calls.
    fn say_left_out(&mut self, finish: &mut Value, words: &str) -> Vec<Value>;
    /// No call went out, none was left out: `finish` no longer ends in calls.
    fn uncalled(&mut self, finish: &mut Value);
    /// Puts the `selfheal` report (and the output the client got) into the ending event.
    fn seal(&mut self, finish: &mut Value, selfheal: Option<&Value>, report: &mut StreamReport);
    /// An error event the SDKs raise (`APIError`, with `message`): of a stream that broke after
    /// content went out (`upstream_error`, `stream_broken`), or of an answer whose calls were all
    /// left out under `on_partial = "error"` (`selfheal_error`, `calls_left_out`).
    fn error_event(message: &str, kind: &str, code: &str) -> Value;
    /// What the relay sends after the answer ended (chat's `[DONE]`).
    fn done_marker() -> Option<Frame>;
    /// The held events to send before the next event (their bytes no longer held).
    fn take_held(&mut self) -> Vec<Value>;
    /// One event as the client's frame (numbered, where the API numbers them).
    fn frame(&mut self, v: Value) -> Frame;
    /// Notes in `report` what the relay must know of an event going out (the first call).
    fn note_sent(&self, _v: &Value, _report: &mut StreamReport) {}
    /// Forgets what is held and numbered while nothing went out: another answer follows.
    fn reset(&mut self);

    /// The events that close what is open when the answer is cut short (the grammar's open
    /// items, with exactly the content that went out: never the event that showed the cut,
    /// which is read and not sent), and the event that ends it, cut short (chat's
    /// `finish_reason: "length"`, the Responses API's `response.incomplete`).
    fn cut(&mut self) -> (Vec<Value>, Value);
    /// Reads a whole answer to a streaming request; `Err` with why the stream is broken.
    fn parse_whole(&mut self, bytes: &[u8]) -> Result<Self::Answer, String>;
    /// Checks a whole answer's calls in place (unusable ones taken out), then `more`.
    fn check_whole(
        &self,
        answer: &mut Self::Answer,
        tools: &ToolIndex,
        guides: &GuideCache,
        more: Option<&Check>,
    ) -> CallCheck;
    /// Whether a whole answer calls tools.
    fn calls_tools(answer: &Self::Answer) -> bool;
    /// Puts `words` into a whole answer that calls no tools (and no longer ends in calls).
    fn say(answer: &mut Self::Answer, words: &str);
    /// The text of a whole answer's content (`None` for one without text).
    fn answer_text(answer: &Self::Answer) -> Option<String>;
    /// The text a content event carries (`None` for one without text).
    fn content_text(v: &Value) -> Option<&str>;
    /// A whole answer made of `text` — the content held while it might write a tool call as
    /// text — ended as `finish` ends it.
    fn held_answer(&self, text: String, finish: &Value) -> Self::Answer;
    /// Takes the calls of offered `tools` written as text in a whole answer as calls
    /// ([`crate::heal::salvage_text_calls`], [`crate::heal::salvage_output_calls`]); an answer
    /// whose calls were taken ends in calls.
    fn salvage(answer: &mut Self::Answer, tools: &ToolIndex) -> Salvage;
    /// The events of a whole answer, its last carrying `selfheal`.
    fn whole_events(
        &mut self,
        answer: Self::Answer,
        selfheal: Option<&Value>,
        report: &mut StreamReport,
    ) -> Vec<Value>;
}

/// Why a whole answer to a streaming request breaks the stream: `e`, said so.
pub(crate) fn unusable_stream(e: impl std::fmt::Display) -> String {
    format!("upstream answered a streaming request without a usable stream: {e}")
}

/// The report for a stream's head, sent before its first frame: `selfheal` with what the relay
/// did so far ([`note_outcome`]); `failed` with the reason when the first frame is the error
/// event of a broken stream; `partial` with `provisional`'s reason when the frame is the first
/// content of an answer that calls no tools so far and whose run the core judges unsettled (or
/// whose read before answering was not made) — the final event says `complete` if tool calls
/// follow after all. What happens after the first frame (a later break, calls left out) only
/// the final event can say.
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
        o.insert("status".into(), json!(Status::Failed));
        o.insert("reason".into(), json!(why));
    } else if o.get("status").and_then(Value::as_str) != Some(Status::Partial.as_str())
        && let Some(why) = provisional
    {
        o.insert("status".into(), json!(Status::Partial));
        o.insert("reason".into(), json!(why));
    }
    head
}

/// Records in the `selfheal` object what the relay did.
pub(crate) fn note_outcome(selfheal: &mut Value, report: &StreamReport) {
    let Some(o) = selfheal.as_object_mut() else {
        return;
    };
    if let Some(actions) = o.get_mut("actions").and_then(Value::as_array_mut) {
        for (did, name) in [
            (!report.repaired.is_empty(), Action::Repair),
            (report.salvaged > 0, Action::Salvage),
            (!report.reasked.is_empty(), Action::Reask),
            (report.reissued.is_some(), Action::Reissue),
            (report.reread, Action::Reread),
            (report.cut.is_some(), Action::Cut),
        ] {
            let name = name.as_str();
            if did && !actions.iter().any(|a| a == name) {
                actions.push(json!(name));
            }
        }
    }
    if let Some(b) = &report.budget {
        o.insert("budget".into(), b.clone());
    }
    if !report.invalid.is_empty() {
        o.insert("status".into(), json!(Status::Partial));
        o.insert("reason".into(), json!(report.invalid.join(" ")));
    } else if let Some(why) = &report.unsettled {
        o.insert("status".into(), json!(Status::Partial));
        o.insert("reason".into(), json!(why));
    }
}

/// Re-asks once, through the relay's hook, for an answer whose calls can be used, when some of
/// the answer's calls could not be (`invalid`), and says so in `report`: the problems as
/// re-asked, with the new answer's repairs, or, when no usable answer could be had (no hook
/// left, the budget refused, the upstream failed), as left out. The new answer, if one came;
/// `None` when nothing was invalid too.
async fn reask_once<R: Reanswer>(
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

/// The client went away: stop relaying.
struct Gone;

/// How the model's text opens, for the salvage of calls written as text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Opening {
    /// Only space so far, or the start of an opener: read on.
    Undecided,
    /// A fence, a `{` or a call tag: the answer may write a tool call as text.
    Call,
    /// Anything else: an answer in words.
    Words,
}

/// What a tool call written as text opens with.
const OPENERS: [&str; 5] = ["```", "{", "<tool_call>", "[TOOL_CALLS]", "<|python_tag|>"];

/// How `text`, the start of an answer's content, opens: whether the relay holds it to the end
/// to read calls written as text out of it (issue 31).
pub fn opens_text_call(text: &str) -> Opening {
    let t = text.trim_start();
    if t.is_empty() {
        Opening::Undecided
    } else if OPENERS.iter().any(|o| t.starts_with(o)) {
        Opening::Call
    } else if OPENERS.iter().any(|o| o.starts_with(t)) {
        Opening::Undecided
    } else {
        Opening::Words
    }
}

/// Content held while it may write a tool call as text.
struct HeldText {
    /// The text so far.
    text: String,
    /// The events that carried it (and any that came between), as they were.
    events: Vec<Value>,
    /// Whether it opened like a call: held to the end, whatever follows.
    call: bool,
}

/// What became of a content event offered to the held text.
enum Hold {
    /// Held.
    Held,
    /// To send now, in order: the text is an answer in words (or too long to hold).
    Release(Vec<Value>),
}

/// What one upstream event meant for the relay.
enum Flow {
    Continue,
    Done,
    Broken(String),
    /// The content degenerated: the upstream is cut off; the event that showed it is not sent.
    Cut(Degenerate, Value),
}

struct Relay<'t, G: Grammar> {
    g: G,
    tools: Arc<ToolIndex>,
    guides: Arc<GuideCache>,
    selfheal: Option<Value>,
    hooks: Hooks<G::Answer>,
    tx: &'t mpsc::Sender<Frame>,
    report: StreamReport,
    /// Whether anything but held events went to the client.
    sent: bool,
    /// Why the answer was not read again before answering, when a read was asked for and not
    /// made: the reason of a final answer's `partial`.
    unread: Option<String>,
    /// The upstream's answer was replaced by the one to the read before answering (or by a
    /// salvaged one): the rest of the upstream stream is not read.
    replaced: bool,
    /// Content held while it may write a tool call as text.
    held: Option<HeldText>,
    /// The text of the content sent so far (up to [`MAX_SAID_BYTES`]): what the grounding rule
    /// judges when a final answer ends.
    said: String,
    /// The last of the content read (at least [`degenerate::Limits::tail_bytes`]): what is
    /// judged for degeneration.
    tail: String,
}

/// Relays an upstream response (an event stream, or a whole answer) to `tx` in grammar `g`
/// (see the module docs). `selfheal` is added to the final event, updated with what the relay
/// did (`repair`, `reask`, `reissue`, `reread`, a `partial` status).
pub(crate) async fn relay<G: Grammar>(
    g: G,
    upstream: reqwest::Response,
    tools: Arc<ToolIndex>,
    guides: Arc<GuideCache>,
    selfheal: Option<Value>,
    hooks: Hooks<G::Answer>,
    tx: &mpsc::Sender<Frame>,
) -> StreamReport {
    let mut r = Relay {
        g,
        tools,
        guides,
        selfheal,
        hooks,
        tx,
        report: StreamReport::default(),
        sent: false,
        unread: None,
        replaced: false,
        held: None,
        said: String::new(),
        tail: String::new(),
    };
    // The client gone, the relay stops whatever it waits for (the upstream's next event, a
    // re-ask): dropping it drops the upstream request, and the upstream stops generating.
    let work = async {
        let outcome = if is_event_stream(&upstream) {
            r.pump(upstream).await
        } else {
            r.convert(upstream).await
        };
        if outcome.is_ok() {
            r.end().await;
        }
        outcome
    };
    let outcome = tokio::select! {
        biased;
        o = work => o,
        () = tx.closed() => Err(Gone),
    };
    if outcome.is_err() {
        r.report.cancelled = true;
    }
    r.report
}

impl<G: Grammar> Relay<'_, G> {
    /// Sends the head's report ([`head_report`]) before the first frame, once; `provisional`
    /// when the frame is the first content of an answer that calls no tools so far.
    fn head(&mut self, provisional: bool) {
        let Some(tx) = self.hooks.head.take() else {
            return;
        };
        let why = provisional
            .then(|| self.unread.clone().or_else(|| self.unsettled()))
            .flatten();
        let _ = tx.send(head_report(self.selfheal.as_ref(), &self.report, why));
    }

    fn unsettled(&self) -> Option<String> {
        self.hooks.unsettled.as_ref().and_then(|f| f())
    }

    /// Sends one event, after the held ones.
    async fn send(&mut self, v: Value) -> Result<(), Gone> {
        self.g.note_sent(&v, &mut self.report);
        if let Some(t) = G::content_text(&v)
            && self.said.len() + t.len() <= MAX_SAID_BYTES
        {
            self.said.push_str(t);
        }
        self.head(false);
        for h in self.g.take_held() {
            let f = self.g.frame(h);
            self.tx.send(f).await.map_err(|_| Gone)?;
        }
        self.sent = true;
        let f = self.g.frame(v);
        self.tx.send(f).await.map_err(|_| Gone)
    }

    async fn send_all(&mut self, events: Vec<Value>) -> Result<(), Gone> {
        for e in events {
            self.send(e).await?;
        }
        Ok(())
    }

    /// Reads the upstream's SSE events and handles each.
    async fn pump(&mut self, upstream: reqwest::Response) -> Result<(), Gone> {
        let mut events = Events::new(upstream);
        while let Some(text) = events.next_or_break(&mut self.report.broken).await {
            for payload in G::payloads(&text) {
                match self.event(&payload).await? {
                    Flow::Continue => {}
                    Flow::Done => return Ok(()),
                    Flow::Broken(why) => {
                        self.report.broken = Some(why);
                        return Ok(());
                    }
                    // Returning drops `events`, and with it the upstream request.
                    Flow::Cut(d, v) => return self.cut(d, v).await,
                }
            }
        }
        Ok(())
    }

    /// Handles one payload.
    async fn event(&mut self, payload: &str) -> Result<Flow, Gone> {
        match self.g.read(payload, self.sent) {
            Read::Held => {}
            Read::Done => return Ok(Flow::Done),
            Read::Broken(why) => return Ok(Flow::Broken(why)),
            Read::Pass(v) => match &mut self.held {
                Some(h) => h.events.push(v),
                None => self.send(v).await?,
            },
            Read::Content(v) => {
                if let Some(d) = self.degenerated(&v) {
                    return Ok(Flow::Cut(d, v));
                }
                match self.hold(v) {
                    Hold::Held => {}
                    Hold::Release(events) => {
                        if self.first_content().await? {
                            return Ok(Flow::Done);
                        }
                        self.send_all(events).await?;
                    }
                }
            }
            Read::Finish(v) => {
                // Nothing went out, no call is held and the answer holds nothing: an empty
                // answer, broken like a stream that ended early (re-issued).
                if !self.sent
                    && self.held.is_none()
                    && !self.g.holds_calls()
                    && let Some(why) = self.g.says_nothing(&v)
                {
                    return Ok(Flow::Broken(why));
                }
                self.finish(v).await?;
                if !G::READS_PAST_FINISH || self.replaced {
                    return Ok(Flow::Done);
                }
            }
        }
        Ok(Flow::Continue)
    }

    /// Adds a content event's text to the tail and judges it ([`degenerate::judge`]).
    fn degenerated(&mut self, v: &Value) -> Option<Degenerate> {
        let limits = self.hooks.degenerate?;
        self.tail.push_str(G::content_text(v)?);
        let keep = limits.tail_bytes();
        if self.tail.len() > 2 * keep {
            let from = self.tail.len() - keep;
            let from = (from..self.tail.len())
                .find(|&i| self.tail.is_char_boundary(i))
                .unwrap_or(self.tail.len());
            self.tail.drain(..from);
        }
        degenerate::judge(&self.tail, &limits)
    }

    /// The content degenerated (`d`, shown by event `v`) and the upstream was cut off. After
    /// content went out the answer ends here, `partial` with the reason. While nothing did:
    /// calls of offered tools written as text before the run are taken as calls (as at the
    /// end of an answer, [`Relay::salvage_held`]); else the model is asked again once with the
    /// problem named ([`Hooks::reask`], the run's ladder deciding); else what it said before
    /// the run goes out whole, `partial` with the reason.
    async fn cut(&mut self, d: Degenerate, v: Value) -> Result<(), Gone> {
        let reason = d.reason();
        let run = self.tail.len().saturating_sub(d.start);
        self.report.cut = Some(reason.clone());
        let (closing, finish) = self.g.cut();
        if self.sent {
            self.report.unsettled = Some(reason);
            self.send_all(closing).await?;
            return self.finish(finish).await;
        }
        let mut text = self.held.take().map(|h| h.text).unwrap_or_default();
        text.push_str(G::content_text(&v).unwrap_or_default());
        // Where the run starts, judged on the whole text: the tail the stream was judged on
        // may hold only the end of a run that began in an earlier, larger event.
        let mut keep = self
            .hooks
            .degenerate
            .and_then(|l| degenerate::judge(&text, &l))
            .map_or(text.len().saturating_sub(run), |whole| whole.start);
        while !text.is_char_boundary(keep) {
            keep -= 1;
        }
        text.truncate(keep);
        // A call is taken from the text before the run only when the model closed it itself
        // (a closing fence or tag, or balanced JSON ending the text): a call cut inside its
        // arguments would be completed by repair with values the model never wrote.
        let closed = {
            let t = text.trim_end();
            (t.ends_with("```") || t.ends_with("</tool_call>") || t.ends_with('}'))
                && !crate::recover::is_cut_inside(t)
        };
        if closed && self.hooks.salvage && !self.tools.is_empty() && !self.g.holds_calls() {
            let mut answer = self.g.held_answer(text.clone(), &finish);
            if let Salvage::Taken(n) = G::salvage(&mut answer, &self.tools) {
                return self.salvaged(answer, n).await;
            }
        }
        let mut names: Vec<&str> = self.tools.keys().map(String::as_str).collect();
        names.sort_unstable();
        let problem = crate::wire::Problem::degenerate(&d, &names);
        let again = match self.hooks.reask.take() {
            Some(f) => f(vec![problem.clone()]).await,
            None => None,
        };
        self.g.reset();
        self.replaced = true;
        if let Some(mut r) = again {
            self.report.reasked = vec![problem.text];
            self.report.repaired.extend(r.take_repaired());
            return self.emit_whole(r).await;
        }
        self.report.unsettled = Some(reason.clone());
        let said = !text.trim().is_empty();
        let mut answer = self.g.held_answer(text, &finish);
        if !said {
            G::say(&mut answer, &format!("[selfheal] {reason}."));
        }
        self.emit_whole(answer).await
    }

    /// Before the first content of an answer goes out, if it calls no tools so far: the last
    /// moment the read before answering can hold it. Whether the answer was replaced (and sent).
    async fn first_content(&mut self) -> Result<bool, Gone> {
        if self.sent || self.g.holds_calls() {
            return Ok(false);
        }
        if let Some(r) = self.reread().await {
            self.emit_whole(r).await?;
            return Ok(true);
        }
        self.head(true);
        Ok(false)
    }

    /// Offers a content event to the held text: the first content of a final answer is held
    /// when it may open a tool call written as text, and then everything up to the end of the
    /// answer, as long as it opened like a call and [`MAX_HELD_BYTES`] are not passed.
    fn hold(&mut self, v: Value) -> Hold {
        let text = G::content_text(&v).unwrap_or_default().to_owned();
        let Some(h) = &mut self.held else {
            let may =
                self.hooks.salvage && !self.tools.is_empty() && !self.sent && !self.g.holds_calls();
            return match (may, opens_text_call(&text)) {
                (false, _) | (_, Opening::Words) => Hold::Release(vec![v]),
                (true, opening) => {
                    let call = opening == Opening::Call;
                    self.held = Some(HeldText {
                        text,
                        events: vec![v],
                        call,
                    });
                    Hold::Held
                }
            };
        };
        h.text.push_str(&text);
        h.events.push(v);
        if !h.call {
            h.call = match opens_text_call(&h.text) {
                Opening::Call => true,
                Opening::Undecided => false,
                Opening::Words => return self.release(),
            };
        }
        if h.text.len() > MAX_HELD_BYTES {
            return self.release();
        }
        Hold::Held
    }

    /// The held text's events, to send as they were.
    fn release(&mut self) -> Hold {
        Hold::Release(self.held.take().map(|h| h.events).unwrap_or_default())
    }

    /// The end of an answer whose content was held: the calls of offered tools it writes as
    /// text taken as calls ([`Grammar::salvage`]), checked as any call (re-asked once if
    /// unusable), and the answer sent whole — or, when it writes none, the held content sent
    /// as it was. A text that looks like a call but cannot be taken without a guess is
    /// re-asked; when no usable answer comes, the text goes out as it was and the answer is
    /// `partial`. An answer that went on to stream structured calls is not read: its text goes
    /// out as it was, its calls as any. Whether the answer was sent whole.
    async fn salvage_held(&mut self, held: HeldText, finish: &Value) -> Result<bool, Gone> {
        let mut answer = self.g.held_answer(held.text, finish);
        // Structured calls followed the text: they are the answer's calls, the text its words.
        let salvage = if self.g.holds_calls() {
            Salvage::None
        } else {
            G::salvage(&mut answer, &self.tools)
        };
        match salvage {
            Salvage::Taken(n) => {
                self.salvaged(answer, n).await?;
                return Ok(true);
            }
            Salvage::Doubt(problem) => {
                let reask = &mut self.hooks.reask;
                if let Some(r) = reask_once(reask, &[problem], &mut self.report).await {
                    self.g.reset();
                    self.replaced = true;
                    self.emit_whole(r).await?;
                    return Ok(true);
                }
            }
            Salvage::None => {}
        }
        if self.first_content().await? {
            self.replaced = true;
            return Ok(true);
        }
        self.send_all(held.events).await?;
        Ok(false)
    }

    /// A whole answer whose `n` calls written as text were taken as calls: checked as any call
    /// (re-asked once if unusable) and sent whole in place of the upstream's answer.
    async fn salvaged(&mut self, mut answer: G::Answer, n: usize) -> Result<(), Gone> {
        self.report.salvaged += n;
        let (tools, guides) = (&self.tools, &self.guides);
        let more = self.hooks.check.as_ref();
        let check = self.g.check_whole(&mut answer, tools, guides, more);
        self.report.repaired.extend(check.repaired);
        let reask = &mut self.hooks.reask;
        if let Some(r) = reask_once(reask, &check.invalid, &mut self.report).await {
            answer = r;
        }
        self.g.reset();
        self.replaced = true;
        self.emit_whole(answer).await
    }

    /// The event that ends the answer: the held calls go out first, checked (re-asked once if
    /// unusable, else left out and said so), then the ending event with the `selfheal` report.
    async fn finish(&mut self, mut v: Value) -> Result<(), Gone> {
        if let Some(held) = self.held.take()
            && self.salvage_held(held, &v).await?
        {
            return Ok(());
        }
        if !self.g.holds_calls()
            && let Some(r) = self.reread().await
        {
            return self.emit_whole(r).await;
        }
        let mut called = false;
        if self.g.holds_calls() {
            let (mut ready, mut invalid) =
                self.g
                    .take_calls(&v, &self.tools, &self.guides, &mut self.report.repaired);
            if let Some(check) = &self.hooks.check {
                invalid.extend(check(&mut ready));
            }
            let again = reask_once(&mut self.hooks.reask, &invalid, &mut self.report).await;
            let (events, any) = self.g.calls_out(&mut v, ready, again);
            called = any;
            self.send_all(events).await?;
            if !called && !self.report.invalid.is_empty() {
                let Some(words) = self.left_out().await? else {
                    return Ok(());
                };
                let events = self.g.say_left_out(&mut v, &words);
                self.send_all(events).await?;
            } else if !called {
                self.g.uncalled(&mut v);
            }
        }
        if !called {
            self.settle(None);
        }
        let selfheal = self.selfheal_now();
        self.g.seal(&mut v, selfheal.as_ref(), &mut self.report);
        self.report.finished = true;
        self.send(v).await
    }

    /// Every call was left out: the words that say so (never an empty answer), or, under
    /// `on_partial = "error"`, `None` once the error event the SDKs raise went out in the
    /// answer's place.
    async fn left_out(&mut self) -> Result<Option<String>, Gone> {
        let words = left_out_text(&self.report.invalid);
        if self.hooks.on_partial != OnPartial::Error {
            return Ok(Some(words));
        }
        self.report.finished = true;
        let e = G::error_event(&words, "selfheal_error", "calls_left_out");
        self.send(e).await?;
        Ok(None)
    }

    /// The `selfheal` report as it stands now, with the run's budget.
    fn selfheal_now(&mut self) -> Option<Value> {
        self.report.budget = self.hooks.budget.as_ref().map(|b| b());
        let s = self.selfheal.as_mut()?;
        note_outcome(s, &self.report);
        Some(s.clone())
    }

    /// The read before answering of a final answer about to go out, while nothing but held
    /// events has ([`Hooks::reread`], decided once): the answer to send in its place, if one
    /// came; what was held is dropped then. A read that was not made is remembered for
    /// [`Relay::settle`].
    async fn reread(&mut self) -> Option<G::Answer> {
        if self.sent {
            return None;
        }
        let ask = self.hooks.reread.take()?;
        let outcome = ask().await?;
        self.report.reread = true;
        self.unread = outcome.unread;
        let mut answer = outcome.answer?;
        self.g.reset();
        self.replaced = true;
        self.report.repaired.extend(answer.take_repaired());
        Some(answer)
    }

    /// A final answer (no tool calls) is ending: why it is not claimed complete, once — a read
    /// before answering that was not made, else the core's judgement of the run, else the
    /// core's grounding rule on its text (`whole`'s, or the content sent).
    fn settle(&mut self, whole: Option<String>) {
        if self.report.unsettled.is_some() {
            return;
        }
        self.report.unsettled = self.unread.take().or_else(|| self.unsettled()).or_else(|| {
            let ground = self.hooks.grounding.as_ref()?;
            ground(whole.as_deref().unwrap_or(&self.said))
        });
    }

    /// A non-SSE answer to a streaming request: its calls checked as a streamed answer's are
    /// (then [`Hooks::check`]), unusable ones re-asked (or left out, `partial`), and the answer
    /// sent as a stream; an answer that cannot be read breaks the stream (re-issued by
    /// [`Relay::end`] while nothing went out).
    async fn convert(&mut self, upstream: reqwest::Response) -> Result<(), Gone> {
        let parsed = crate::upstream::read_bounded(upstream, MAX_EVENT_BYTES)
            .await
            .map_err(unusable_stream)
            .and_then(|b| self.g.parse_whole(&b));
        let mut answer = match parsed {
            Ok(a) => a,
            Err(why) => {
                self.report.broken = Some(why);
                return Ok(());
            }
        };
        // Calls written as text, taken as a streamed answer's are (issue 31).
        let mut doubt = Vec::new();
        if self.hooks.salvage {
            match G::salvage(&mut answer, &self.tools) {
                Salvage::Taken(n) => self.report.salvaged += n,
                Salvage::Doubt(problem) => doubt.push(problem),
                Salvage::None => {}
            }
        }
        let more = self.hooks.check.as_ref();
        let check = self
            .g
            .check_whole(&mut answer, &self.tools, &self.guides, more);
        self.report.repaired.extend(check.repaired);
        doubt.extend(check.invalid);
        if let Some(r) = reask_once(&mut self.hooks.reask, &doubt, &mut self.report).await {
            answer = r;
        }
        self.emit_whole(answer).await
    }

    /// Sends a whole answer as a complete event stream (the ending event included; the done
    /// marker is [`Relay::end`]'s to send, once). A final one may be held for the read before
    /// answering, is judged by the core, and says in words that its calls were left out.
    async fn emit_whole(&mut self, answer: G::Answer) -> Result<(), Gone> {
        let mut answer = answer;
        if !G::calls_tools(&answer)
            && let Some(r) = self.reread().await
        {
            answer = r;
        }
        if !G::calls_tools(&answer) {
            self.settle(G::answer_text(&answer));
            if !self.report.invalid.is_empty() {
                let Some(words) = self.left_out().await? else {
                    return Ok(());
                };
                G::say(&mut answer, &words);
            }
        }
        let selfheal = self.selfheal_now();
        let events = self
            .g
            .whole_events(answer, selfheal.as_ref(), &mut self.report);
        self.report.finished = true;
        self.report.broken = None;
        self.send_all(events).await
    }

    /// After the upstream ended: the done marker after a finish (a break after it cannot change
    /// the answer); a re-issue when nothing but held events went out; else the error event,
    /// flushed, then a clean end — an `Err` right after it would make hyper abort the
    /// connection before the event is flushed.
    async fn end(&mut self) {
        if self.report.finished {
            self.report.broken = None;
            self.done().await;
            return;
        }
        let why = self
            .report
            .broken
            .clone()
            .unwrap_or_else(|| G::UNFINISHED.into());
        if !self.sent
            && let Some(f) = self.hooks.reissue.take()
        {
            self.g.reset();
            if let Some(mut again) = f(Vec::new()).await {
                self.report.reissued = Some(why);
                self.report.broken = None;
                self.report.repaired.extend(again.take_repaired());
                if self.emit_whole(again).await.is_ok() {
                    self.done().await;
                }
                return;
            }
        }
        self.report.broken = Some(why.clone());
        // Nothing held goes out after a break.
        self.g.reset();
        self.head(false);
        let f = self
            .g
            .frame(G::error_event(&why, "upstream_error", "stream_broken"));
        let _ = self.tx.send(f).await;
    }

    async fn done(&mut self) {
        if let Some(f) = G::done_marker() {
            let _ = self.tx.send(f).await;
        }
    }
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
