//! The whole (not streamed) answer, written once for every API: ask → read before answering →
//! the plain answer → check and re-ask → judge → report → render ([`heal_whole`]). A dialect
//! ([`WholeDialect`]) only asks its upstream, checks its answer's calls, puts words in it and
//! renders it; every rule — when the run reads again before answering, how far the re-asks
//! climb and escalate, when an answer is `partial`, what a client gets for calls left out —
//! is the core's, carried out here the same on every API.

use axum::response::Response;
use selfheal_core::ReaskState;
use serde_json::{Value, json};

use crate::action::{Action, push_once};
use crate::config::{OnPartial, Target};
use crate::error::ApiError;
use crate::heal::{self, CallCheck};
use crate::metrics::Metrics;
use crate::pipeline::{
    Turn, log_calls, partial_error, reask_or_escalate, reask_turn, reread_due, reread_item, unread,
};
use crate::recover;
use crate::report::{Status, add_headers, selfheal_report};
use crate::state::lock;
use crate::store::Kind;
use crate::upstream::CallLog;

/// What a dialect makes of its first answer once it is read.
pub(crate) enum Plain {
    /// The common case, answered at once (chat's plain answer: the upstream's bytes with the
    /// report spliced in).
    Answered(Response),
    /// The answer parsed, to be checked.
    Parsed(Value),
}

/// One API's part of a whole answer: asking, checking, wording and rendering in its wire.
pub(crate) trait WholeDialect {
    /// The first answer as the upstream gave it (chat keeps a plain answer's bytes).
    type First;

    /// The turn.
    fn turn(&self) -> &Turn;
    /// The targets to ask, in order.
    fn chain(&self) -> &[Target];
    /// Asks the request, with `extra` appended (the read before answering), along the chain.
    async fn ask_first(
        &self,
        extra: Option<&Value>,
        log: &mut CallLog,
    ) -> Result<Self::First, ApiError>;
    /// Whether the first answer calls tools.
    fn first_calls_tools(first: &Self::First) -> bool;
    /// The first answer answered at once when it can be (`settled`: the run is), else parsed.
    fn plain(
        &self,
        first: Self::First,
        settled: bool,
        actions: &mut Vec<Action>,
        log: &CallLog,
    ) -> Result<Plain, ApiError>;
    /// Asks again along `chain` with `extra` appended (a re-ask of unusable calls, the read
    /// before answering; nothing for a stream's re-issue), without streaming: the answer parsed.
    async fn ask(
        &self,
        chain: &[Target],
        extra: Option<&Value>,
        log: &mut CallLog,
    ) -> Result<Value, ApiError>;
    /// What a final answer's numbers are grounded in (the core's grounding rule, issue 31): the
    /// request's user, system and developer texts and its tool results; `None` when the request
    /// offers no tools (nothing is judged then).
    fn evidence(&self) -> Option<Vec<Value>>;
    /// Whether the request lets the model call a tool (no `tool_choice: "none"`): only then is
    /// a final answer read for a call announced instead of made.
    fn may_call(&self) -> bool;
    /// The text of a first answer that calls no tools.
    fn first_text(first: &Self::First) -> Option<String>;
    /// The text of a parsed answer.
    fn text(answer: &Value) -> Option<String>;
    /// Checks the answer's calls in place: repaired, or taken out as unusable.
    fn check(&self, answer: &mut Value) -> CallCheck;
    /// Whether the answer calls tools.
    fn calls_tools(answer: &Value) -> bool;
    /// Puts `words` in the answer.
    fn say(answer: &mut Value, words: &str);
    /// Remembers what the answer names for the run (its first call, the response a client
    /// continues) and redacts it.
    fn seal(&self, answer: &mut Value);
    /// The answer as the client's response (a stream of events where one is due).
    fn render(&self, answer: Value) -> Response;
}

/// Stages 4–6 of a whole answer, for every API: the upstream call; the core's judgement of a
/// final answer and its read before answering; the common case answered at once; the tool
/// calls checked (repaired in place, or re-asked along the ladder within the budget); the
/// answer with its `selfheal` report, its repairs recorded, the calls left out said in words
/// (or an error the SDKs raise).
pub(crate) async fn heal_whole<D: WholeDialect>(
    d: &D,
    mut actions: Vec<Action>,
) -> Result<Response, ApiError> {
    let t = d.turn();
    let mut log = CallLog::default();
    let mut first = match d.ask_first(None, &mut log).await {
        Ok(a) => a,
        Err(e) => {
            log_calls(t, &log, &mut actions);
            return Err(t.failed(e));
        }
    };
    let unsettled = read_before_answering(d, &mut first, &mut actions, &mut log).await;
    // A final answer stating a number the run never saw leaves the plain path: it is judged,
    // and flagged, once parsed (`answer_checked`).
    // So does one that degenerated (a run of whitespace, one piece repeated): re-asked.
    let grounded = D::first_calls_tools(&first)
        || (ungrounded(d, || D::first_text(&first)).is_none()
            && degenerate(d, D::first_text(&first)).is_none());
    let answer = match d.plain(first, unsettled.is_none() && grounded, &mut actions, &log) {
        Ok(Plain::Answered(resp)) => return Ok(resp),
        Ok(Plain::Parsed(v)) => v,
        Err(e) => {
            log_calls(t, &log, &mut actions);
            return Err(t.failed(e));
        }
    };
    let (mut answer, mut check, reasked) = reask_calls(d, answer, &mut actions, &mut log).await;
    let reasked =
        ask_again_announced(d, &mut answer, &mut check, &mut actions, &mut log).await || reasked;
    // A re-ask answered with a final answer: judged by the core as the first answer would be.
    let unsettled =
        if unsettled.is_none() && check.invalid.is_empty() && reasked && !D::calls_tools(&answer) {
            recover::unsettled(&lock(&t.state))
        } else {
            unsettled
        };
    log_calls(t, &log, &mut actions);
    answer_checked(d, answer, &check, unsettled, actions)
}

/// Check: a final answer is judged by the core as its `finish` would judge the run: with a
/// failure open or unresolved it is `partial` (in-process such a run never reaches its answer;
/// the reason is returned). Otherwise the core's read before answering: the final answer of a
/// run that needed a recovery is held, and the model asked to read its unconfirmed values once
/// more first. The read is the model's to ask for: an upstream that fails, or a model that
/// answers again without the call, leaves the answer unread — it goes out `partial`, not
/// claimed as if the read had confirmed it.
async fn read_before_answering<D: WholeDialect>(
    d: &D,
    first: &mut D::First,
    actions: &mut Vec<Action>,
    log: &mut CallLog,
) -> Option<String> {
    let t = d.turn();
    if D::first_calls_tools(first) {
        return None;
    }
    let unsettled = recover::unsettled(&lock(&t.state));
    let Some(text) = unsettled.is_none().then(|| reread_due(t)).flatten() else {
        return unsettled;
    };
    push_once(actions, Action::Reread);
    let extra = reread_item(&text);
    let called = match d.ask_first(Some(&extra), log).await {
        Ok(a) => {
            *first = a;
            Some(D::first_calls_tools(first))
        }
        Err(_) => None,
    };
    unread(called, &text)
}

/// Re-ask: unusable calls are re-asked as long as the ladder of their class says so, within
/// the budget (each re-ask climbs the ladder of the one failure: unusable calls), the ladder's
/// escalation moving them to the chain's next target; the last usable answer stands, an
/// unusable call is never forwarded. The last answer, its check, and whether it was re-asked.
async fn reask_calls<D: WholeDialect>(
    d: &D,
    mut answer: Value,
    actions: &mut Vec<Action>,
    log: &mut CallLog,
) -> (Value, CallCheck, bool) {
    let t = d.turn();
    let mut check = check_answer(d, &mut answer, actions);
    let mut ladder = ReaskState::default();
    let mut reasked = false;
    let mut chain = d.chain();
    while !check.invalid.is_empty() {
        let Some((next, escalate)) = reask_or_escalate(t, &check.invalid, ladder, &mut chain)
        else {
            break;
        };
        ladder = next;
        reasked = true;
        if escalate {
            push_once(actions, Action::Escalate);
        }
        Metrics::inc(&t.s.metrics.reasks_total);
        push_once(actions, Action::Reask);
        t.event(Kind::Reask, json!({"problems": check.invalid}));
        let extra = reask_turn(&check.invalid);
        match d.ask(chain, Some(&extra), log).await {
            Ok(v) => {
                answer = v;
                check = check_answer(d, &mut answer, actions);
            }
            Err(_) => break,
        }
    }
    (answer, check, reasked)
}

/// Ask again: a final answer that announces a call of an offered tool instead of making it
/// ("I need to call `geo_capital`") is asked again once per user turn with the core's guidance
/// ([`selfheal_core::Run::ask_again`]); the answer that comes back is checked as the first
/// was, and judged at the end like any other (an announcement again goes out `partial`).
/// Whether it was asked again.
async fn ask_again_announced<D: WholeDialect>(
    d: &D,
    answer: &mut Value,
    check: &mut CallCheck,
    actions: &mut Vec<Action>,
    log: &mut CallLog,
) -> bool {
    let t = d.turn();
    if D::calls_tools(answer)
        || !check.invalid.is_empty()
        || !d.may_call()
        || d.evidence().is_none()
    {
        return false;
    }
    let now_ms = t.s.now_ms();
    let Some((guidance, decided)) = D::text(answer).and_then(|text| {
        let mut st = lock(&t.state);
        let guidance = st.run.ask_again(&text, now_ms)?;
        Some((guidance, st.run.take_records()))
    }) else {
        return false;
    };
    // The run's decision (`ask_again`), then what the gateway did with it (`reask`).
    crate::pipeline::record_decisions(t, decided);
    Metrics::inc(&t.s.metrics.reasks_total);
    push_once(actions, Action::Reask);
    t.event(Kind::Reask, json!({"announced": guidance}));
    let extra = json!({"role": "user", "content": guidance});
    match d.ask(d.chain(), Some(&extra), log).await {
        Ok(v) => {
            *answer = v;
            // The answer asked again is judged as every answer is, degeneration included.
            *check = check_answer(d, answer, actions);
            true
        }
        Err(_) => false,
    }
}

/// Answer: the checked answer with its `selfheal` report, its repairs recorded, and the calls
/// left out said in words (or an error the SDKs raise).
fn answer_checked<D: WholeDialect>(
    d: &D,
    mut answer: Value,
    check: &CallCheck,
    unsettled: Option<String>,
    mut actions: Vec<Action>,
) -> Result<Response, ApiError> {
    let t = d.turn();
    let s = &t.s;
    for name in &check.repaired {
        Metrics::inc(&s.metrics.repairs_total);
        t.event(Kind::Repair, json!({"tool": name}));
    }
    if !check.repaired.is_empty() {
        actions.push(Action::Repair);
    }
    if check.salvaged > 0 {
        // Tool calls written as text, taken as calls (issue 31).
        Metrics::inc(&s.metrics.repairs_total);
        t.event(Kind::Repair, json!({"salvaged": check.salvaged}));
        actions.push(Action::Salvage);
    }
    let (status, reason) = if !check.invalid.is_empty() {
        t.event(Kind::InvalidCall, json!({"problems": check.invalid}));
        (Status::Partial, Some(heal::problems_text(&check.invalid)))
    } else if let Some(why) = unsettled {
        (Status::Partial, Some(why))
    } else if let Some(why) = (!D::calls_tools(&answer))
        .then(|| ungrounded(d, || D::text(&answer)))
        .flatten()
    {
        // The core's grounding rule: a number found in no input or tool result is not claimed.
        t.event(Kind::Guidance, json!({"ungrounded": why}));
        (Status::Partial, Some(why))
    } else {
        (Status::Complete, None)
    };
    // Every call left out: the answer says so in words, or is an error the SDKs raise. (A
    // degenerate answer is left as it came, flagged.)
    let left_out = check
        .invalid
        .iter()
        .any(|p| !matches!(p.kind, heal::Unusable::Degenerate(_)));
    if left_out && !D::calls_tools(&answer) {
        let words = heal::left_out_text(&heal::problem_texts(&check.invalid));
        if s.config.server.on_partial == OnPartial::Error {
            let why = (status, reason.as_deref());
            return Ok(partial_error(t, "calls_left_out", &words, &actions, why));
        }
        D::say(&mut answer, &words);
    }
    if let Some(o) = answer.as_object_mut() {
        let report = selfheal_report(&t.state, status, reason.as_deref(), &actions);
        o.insert("selfheal".into(), report);
    }
    d.seal(&mut answer);
    t.finish(status);
    let mut resp = d.render(answer);
    let reason = reason.map(|r| t.caller.redactor.text(&r).into_owned());
    add_headers(&mut resp, &t.id(), status, &actions, reason.as_deref());
    Ok(resp)
}

/// The answer's calls checked ([`WholeDialect::check`]), and the text of a final answer judged
/// by the core's degenerate rule ([`degenerate`]): degenerate output is a problem of its own,
/// re-asked along the ladder as unusable calls are, else flagged `partial`; the `cut` action
/// is added to `actions`.
fn check_answer<D: WholeDialect>(
    d: &D,
    answer: &mut Value,
    actions: &mut Vec<Action>,
) -> CallCheck {
    let mut check = d.check(answer);
    if D::calls_tools(answer) {
        return check;
    }
    if let Some(dg) = degenerate(d, D::text(answer)) {
        let t = d.turn();
        Metrics::inc(&t.s.metrics.degenerate_cut_total);
        push_once(actions, Action::Cut);
        lock(&t.state).act(Action::Cut);
        check.invalid.push(heal::Problem::degenerate(&dg, &[]));
    }
    check
}

/// Whether a final answer's `text` degenerated (the core's
/// [`selfheal_core::degenerate::judge`] under `[limits.degenerate]`).
fn degenerate<D: WholeDialect>(
    d: &D,
    text: Option<String>,
) -> Option<selfheal_core::degenerate::Degenerate> {
    let limits = &d.turn().s.config.limits.degenerate;
    selfheal_core::degenerate::judge(&text?, limits)
}

/// Why a final answer's `text` is not claimed complete by the core's grounding rule
/// ([`recover::ungrounded_answer`]), if it is not; nothing is read when the request offers no
/// tools.
fn ungrounded<D: WholeDialect>(d: &D, text: impl FnOnce() -> Option<String>) -> Option<String> {
    let evidence = d.evidence()?;
    let text = text()?;
    recover::ungrounded_answer(&lock(&d.turn().state), &text, &evidence, d.may_call())
}

/// A stream's second asking through a dialect ([`crate::pipeline::AskStream::ask_once`]): asked
/// along `chain` with `extra` appended, its decisions recorded, its calls checked — the answer
/// with the names of its repaired calls, or the problems of the calls that cannot be used.
/// `None` when the upstream failed.
pub(crate) async fn ask_checked<D: WholeDialect>(
    d: &D,
    chain: &[Target],
    extra: Option<&Value>,
) -> Option<Result<(Value, Vec<String>), Vec<heal::Problem>>> {
    let mut log = CallLog::default();
    let result = d.ask(chain, extra, &mut log).await;
    log_calls(d.turn(), &log, &mut Vec::new());
    let mut answer = result.ok()?;
    let check = check_answer(d, &mut answer, &mut Vec::new());
    if !check.invalid.is_empty() {
        return Some(Err(check.invalid));
    }
    Some(Ok((answer, check.repaired)))
}
