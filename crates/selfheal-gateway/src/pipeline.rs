//! The protocol-neutral parts of a healed turn, shared by every API: the [`Turn`] (one
//! request's context once its run is known), rebuilding the run from the conversation, the
//! run's decisions, the stop/abort answer, editing the request, re-asking, re-issuing and reading
//! again, and the checks of an answer's tool calls. A dialect parses its wire request into these
//! steps and renders what they return; it holds no healing rule of its own.

use crate::action::Action;
use crate::answer;
use crate::auth::{Caller, Credentials};
use crate::config::OnPartial;
use crate::error::ApiError;
use crate::heal::{self, ToolIndex};
use crate::http::sse_response;
use crate::metrics::Metrics;
use crate::recover;
use crate::relay::{AskAgain, Grammar, Hooks, ReadAgain};
use crate::request::ChatRequest;
use crate::runs::RunState;
use crate::state::{AppState, lock};
use crate::store::{Detail, Kind, RunSummary};
use crate::stream;
use crate::upstream::{CallLog, UpstreamClient};
use axum::body::Body;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures_util::future::BoxFuture;
use selfheal_core::ReaskState;
use selfheal_openai::At;
use selfheal_openai::{ClientError, Completion};
use serde_json::{Value, json};
use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime, UNIX_EPOCH};
use tokio::sync::mpsc;

use crate::report::{
    RequestDetail, ResponseDetail, Status, add_headers, budget_json, call_actions, selfheal_report,
    tool_result_detail,
};

/// The grounding check of held calls ([`recover::take_ungrounded`]) against `evidence` read
/// while the request was at hand (the relay runs after it is gone).
pub(crate) fn grounding_check(t: &Turn, evidence: Arc<Vec<Value>>) -> stream::Check {
    let s = t.s.clone();
    Box::new(move |calls: &mut Vec<Value>| {
        recover::take_ungrounded(&s.config.tools, calls, &evidence)
    })
}

/// Records how a relayed stream ended (repairs, unusable calls, a re-issue, a break) and the
/// run's `response` event. A stream offering tools that broke and was healed by a
/// non-streaming re-issue teaches the gateway that its target (`learnable`) cannot stream tool
/// calls ([`NoStream`](crate::state::NoStream)).
pub(crate) fn finish_stream(
    t: &Turn,
    r: &stream::StreamReport,
    learnable: Option<&crate::config::Target>,
) {
    for name in &r.repaired {
        Metrics::inc(&t.s.metrics.repairs_total);
        t.event(Kind::Repair, json!({"tool": name}));
    }
    if r.salvaged > 0 {
        // Tool calls written as text, taken as calls (issue 31), as a whole answer records them.
        Metrics::inc(&t.s.metrics.repairs_total);
        t.event(Kind::Repair, json!({"salvaged": r.salvaged}));
    }
    for p in &r.invalid {
        t.event(Kind::InvalidCall, json!({"problems": [p]}));
    }
    if let Some(why) = &r.reissued {
        t.event(Kind::Reissue, json!({"reason": why}));
        if let Some(target) = learnable
            && t.s.no_stream.observe(target, Instant::now())
        {
            t.event(
                Kind::LearnNoStream,
                json!({"upstream": target.upstream, "model": target.model}),
            );
        }
    }
    if let Some(why) = &r.cut {
        Metrics::inc(&t.s.metrics.degenerate_cut_total);
        lock(&t.state).act(Action::Cut);
        t.event(Kind::StreamBroken, json!({"cut": why}));
    }
    let status = if r.cancelled {
        // The client went away: the upstream request was dropped with the relay.
        Metrics::inc(&t.s.metrics.upstream_cancelled_total);
        t.event(
            Kind::StreamBroken,
            json!({"reason": "the client went away; the upstream request was dropped"}),
        );
        Status::Failed
    } else if let Some(b) = &r.broken {
        Metrics::inc(&t.s.metrics.streams_broken_total);
        t.event(Kind::StreamBroken, json!({"reason": b}));
        Status::Failed
    } else if r.invalid.is_empty() && r.unsettled.is_none() {
        Status::Complete
    } else {
        Status::Partial
    };
    if r.broken.is_none() {
        adopt_first_call(
            t,
            r.first_call.as_ref().map(|(i, n)| (i.as_str(), n.as_str())),
        );
        remember_response(t, r.responded.clone());
    }
    t.finish(status);
}

pub(crate) fn chat_op<'c>(
    c: &'c UpstreamClient,
    b: Bytes,
    cr: &'c Credentials,
) -> BoxFuture<'c, Result<Completion, ClientError>> {
    Box::pin(c.chat(b, cr))
}

/// [`chat_op`] that keeps a plain answer as bytes ([`answer::read`]).
pub(crate) fn answer_op<'c>(
    c: &'c UpstreamClient,
    b: Bytes,
    cr: &'c Credentials,
) -> BoxFuture<'c, Result<answer::Answer, ClientError>> {
    Box::pin(async move {
        let resp = c.send("chat/completions", b, cr).await?;
        let bytes = crate::upstream::read_bounded(resp, c.max_body()).await?;
        let answer = answer::read(bytes)?;
        crate::telemetry::usage_of(&answer);
        Ok(answer)
    })
}

pub(crate) fn send_op<'c>(
    c: &'c UpstreamClient,
    b: Bytes,
    cr: &'c Credentials,
) -> BoxFuture<'c, Result<reqwest::Response, ClientError>> {
    Box::pin(c.send("chat/completions", b, cr))
}

/// One request's context once its run is known: the state, the caller, the run.
#[derive(Clone)]
pub(crate) struct Turn {
    pub(crate) s: Arc<AppState>,
    pub(crate) caller: Caller,
    pub(crate) run: Arc<str>,
    pub(crate) state: Arc<Mutex<RunState>>,
    /// The conversation's opening when the request did not name its run (no label, no tool
    /// call yet): the run then takes the name of the first call it answers with
    /// ([`adopt_first_call`]).
    pub(crate) unnamed: Option<Arc<Opening>>,
    /// The output limit the gateway set upstream because the client set none (`[limits]
    /// default_max_tokens`): the turn reports the `cap` action.
    pub(crate) capped: Option<u32>,
}

/// A conversation's opening as run ids read it ([`crate::runs::run_id_of`]).
pub(crate) type Opening = Vec<(&'static str, Vec<u8>)>;

/// What names a run, as a dialect reads it from its request (issue 30, item 6).
pub(crate) struct Naming<'a> {
    /// The caller's label, `x-selfheal-run`.
    pub(crate) label: Option<&'a str>,
    /// The conversation kept upstream (a Responses `conversation`, as `conversation:<id>`): a
    /// label when the caller gave none.
    pub(crate) conversation: Option<&'a str>,
    /// The answer this request continues (a Responses `previous_response_id`).
    pub(crate) previous: Option<&'a str>,
    /// The first tool call the model issued in the conversation, `(id, tool name)`.
    pub(crate) first_call: Option<(&'a str, &'a str)>,
}

/// Names the run of a request, the same way for every API (chat, Responses, Messages), always
/// within the caller's `tenant`: the caller's label when it is an id this tenant was answered
/// with (sent back as is); else, without a label, the run that sent the answer the request
/// continues; else the run keyed by the label (or the conversation), or by the conversation's
/// first tool call together with its `opening` ([`crate::runs::run_id_of`]). Opening text alone
/// never names a run: a request that names none gets a fresh run, and its opening back
/// (`Some`), under which the run takes the name of the first call it answers with
/// ([`adopt_first_call`]).
pub(crate) async fn name_run(
    s: &AppState,
    tenant: &str,
    n: &Naming<'_>,
    opening: impl FnOnce() -> Opening,
) -> (String, Option<Arc<Opening>>) {
    let now = Instant::now();
    // Both lookups read this replica's store first and the shared one only on a miss
    // (another replica answered the id).
    if let Some(l) = n.label
        && let Some(run) = crate::sharing::owned_by(s, l, tenant, now).await
    {
        return (run, None);
    }
    if n.label.is_none()
        && let Some(prev) = n.previous
        && let Some(run) = crate::sharing::run_of_response(s, prev, tenant, now).await
    {
        return (run, None);
    }
    let label = n.label.or(n.conversation);
    let opening = opening();
    let refs: Vec<(&str, &[u8])> = opening.iter().map(|(k, v)| (*k, &v[..])).collect();
    let run = crate::runs::run_id_of(&s.run_key, tenant, label, &refs, n.first_call);
    let unnamed = (!crate::runs::names_its_run(label, n.first_call)).then(|| Arc::new(opening));
    (run, unnamed)
}

/// Stores the turn's detached run under the id it was answered with (`x-selfheal-run`, which a
/// streamed answer sends before it knows of any call, and under which the trace of its first
/// request is), keyed too by the name of `call`, `(id, tool name)`, the first tool call it
/// answers with, so that the conversation's next request — which carries that call —
/// continues it ([`crate::runs::RunStore::adopt`]): here, and as a link in the store. One run,
/// one id, whether the client sends it back or not, streamed or not.
pub(crate) fn adopt_first_call(t: &Turn, call: Option<(&str, &str)>) {
    let (Some(opening), Some(call)) = (&t.unnamed, call) else {
        return;
    };
    let opening: Vec<(&str, &[u8])> = opening.iter().map(|(k, v)| (*k, &v[..])).collect();
    let to = crate::runs::run_id_of(&t.s.run_key, &t.caller.tenant, None, &opening, Some(call));
    let now = Instant::now();
    t.s.runs.adopt(&t.state, &t.run, &t.caller.tenant, now);
    if t.s.runs.adopt(&t.state, &to, &t.caller.tenant, now) {
        let mut st = lock(&t.state);
        if st.share.key.as_ref().is_some_and(|(_, run)| *run == t.run) {
            st.share.alias = Some(to.into());
        }
    }
}

/// The first tool call of a chat completion, `(id, tool name)`.
pub(crate) fn completion_first_call(completion: &Value) -> Option<(&str, &str)> {
    let c = completion.pointer("/choices/0/message/tool_calls/0")?;
    Some((
        c.get("id").and_then(Value::as_str).unwrap_or(""),
        c.pointer("/function/name")
            .and_then(Value::as_str)
            .unwrap_or(""),
    ))
}

impl Turn {
    /// The run id the client is answered with (`x-selfheal-run`): the name the run is stored
    /// under, and its trace's. A request that named no run is served by a fresh run stored
    /// under this id once it answers with a call ([`adopt_first_call`]).
    pub(crate) fn id(&self) -> Arc<str> {
        self.run.clone()
    }

    /// Calls `op` along `chain` within this run (its ledger, the caller's credentials): the
    /// core's call plan decides the retries and fall-backs (see [`Upstreams::call`](crate::upstream::Upstreams::call)).
    pub(crate) async fn call<T>(
        &self,
        chain: &[crate::config::Target],
        encode: &(dyn Fn(&str) -> Bytes + Send + Sync),
        op: crate::upstream::Op<'_, T>,
        log: &mut CallLog,
    ) -> Result<T, ApiError> {
        self.s
            .upstreams
            .call(
                chain,
                encode,
                op,
                Some(&self.state),
                &self.caller.credentials,
                log,
            )
            .await
    }

    /// Records an event of this run, secrets redacted.
    pub(crate) fn event(&self, kind: Kind, detail: impl Into<Detail>) {
        self.s
            .event(&self.caller.redactor, &self.run, kind, detail, None);
    }

    /// Records the run's `response` event with its summary.
    pub(crate) fn finish(&self, status: Status) {
        finish_trace(self, status);
    }

    /// Ends the turn on an upstream failure: the `upstream_error` event with its reasons, the
    /// run's `failed` response, and the error to answer the client with.
    pub(crate) fn failed(&self, e: ApiError) -> ApiError {
        self.event(Kind::UpstreamError, json!({"reasons": e.reasons}));
        self.finish(Status::Failed);
        e
    }
}

/// What the upstream call of one request needs: the chain, the client's body, the edits and
/// the tools the request offers after hiding.
#[derive(Clone)]
pub(crate) struct Call {
    pub(crate) chain: Vec<crate::config::Target>,
    pub(crate) bytes: Bytes,
    pub(crate) applied: heal::Applied,
    pub(crate) tools: Arc<ToolIndex>,
    /// The calls of the model's previous turn whose results it has ([`heal::Answered`]).
    pub(crate) answered: Arc<heal::Answered>,
}

/// Stage 1: feeds the conversation's new tool results to the run's monitor; its verdict,
/// whether the newest of those results failed (the abort rule's condition), what the
/// controller has the request carry out, and the calls of the model's previous turn whose
/// values the controller took ([`heal::Answered`]: a new call identical to one of them is the
/// model's repetition, re-asked by the core's ladder like any unusable call).
pub(crate) fn rebuild_run(
    t: &Turn,
    req: &ChatRequest<'_>,
    tools: &ToolIndex,
    model: &str,
    chain: &[crate::config::Target],
) -> (selfheal_core::Verdict, bool, recover::Next, heal::Answered) {
    let now_ms = t.s.now_ms();
    let ctx = recover::Ctx {
        tools: &t.s.config.tools,
        offered: tools,
        fallback: chain.get(1).map(|c| c.model.as_str()),
        seed: now_ms,
        wall_ms: recover::wall_ms(),
        max_wait_ms: t.s.config.limits.max_wait_ms,
    };
    let (verdict, replayed, next, decisions) = {
        let mut st = lock(&t.state);
        st.requests += 1;
        let replayed = heal::replay(&mut st, &req.messages, &ctx, now_ms);
        let next = recover::take_next(&mut st);
        for a in &next.actions {
            st.act(Action::from(*a));
        }
        let decisions = st.run.take_records();
        (st.run.verdict(now_ms), replayed, next, decisions)
    };
    t.event(
        Kind::Request,
        Detail::of(&RequestDetail {
            messages: req.messages.len(),
            model,
            stream: req.stream,
            tenant: &t.caller.tenant,
        }),
    );
    for r in &replayed {
        t.event(Kind::ToolResult, tool_result_detail(r));
    }
    record_decisions(t, decisions);
    if !next.actions.is_empty() {
        t.event(Kind::Recover, json!({"actions": next.actions}));
    }
    let newest_failed = replayed.last().is_some_and(|r| r.outcome.failed());
    let answered = heal::Answered::of(&req.messages, &repeatable_out(t, &next.taken), &next.again);
    (verdict, newest_failed, next, answered)
}

/// The calls a new call could repeat (`taken`, `(tool, arguments hash)`), less those of tools
/// the operator marked `repeatable` (polled, a clock): those may be called again as they were.
/// Borrowed as it is in the common case, where none of them is.
pub(crate) fn repeatable_out<'a>(
    t: &Turn,
    taken: &'a [(String, u64)],
) -> std::borrow::Cow<'a, [(String, u64)]> {
    let repeatable = |tool: &str| t.s.config.tools.get(tool).is_some_and(|c| c.repeatable);
    if !taken.iter().any(|(tool, _)| repeatable(tool)) {
        return std::borrow::Cow::Borrowed(taken);
    }
    taken
        .iter()
        .filter(|(tool, _)| !repeatable(tool))
        .cloned()
        .collect::<Vec<_>>()
        .into()
}

/// What replaying a request's tool results decided: the monitor's verdict, whether the newest
/// result failed, the controller's directives, and the calls of the model's previous turn whose
/// values the run took.
pub(crate) struct Decided {
    /// The monitor's verdict.
    pub(crate) verdict: selfheal_core::Verdict,
    /// Whether the newest result failed (the abort rule's condition).
    pub(crate) newest_failed: bool,
    /// What this request carries out for the controller.
    pub(crate) next: recover::Next,
    /// The calls of the model's previous turn whose results it has.
    pub(crate) answered: heal::Answered,
}

/// One API's part of a turn ([`heal_turn`]): it parsed the request and named the run; it
/// replays the request's tool results, applies the run's edits, renders a stopped run's
/// answer, and answers — streamed or whole — through the shared paths.
pub(crate) trait Dialect: Sized {
    /// Whether the client asked for a stream.
    fn streaming(&self) -> bool;
    /// Rebuild the run: the request's tool results replayed, and what that decided.
    fn replay(&mut self, t: &Turn) -> Decided;
    /// A stopped run's answer in this API: `words` as the assistant's message.
    fn stopped(&self, t: &Turn, words: &str) -> Value;
    /// The frames of a whole answer as this API streams it.
    fn frames(answer: &Value) -> Vec<stream::Frame>;
    /// Edit: the verdict's guidance and hidden tools and the controller's directives applied to
    /// the request, the actions taken added to `actions`.
    fn edit(&mut self, t: &Turn, decided: Decided, actions: &mut Vec<Action>);
    /// The targets to ask, in order.
    fn chain(&self) -> &[crate::config::Target];
    /// Sets the targets to ask (the controller's escalation).
    fn set_chain(&mut self, chain: Vec<crate::config::Target>);
    /// The tools still on offer.
    fn tools(&self) -> &ToolIndex;
    /// Stage 4, streamed ([`relay_stream`]).
    async fn stream(self, t: &Turn, actions: Vec<Action>) -> Result<Response, ApiError>;
    /// Stages 4–6, whole ([`crate::whole::heal_whole`]); `learned`: asked without streaming
    /// for a client that asked for a stream.
    async fn whole(
        self,
        t: &Turn,
        actions: Vec<Action>,
        learned: bool,
    ) -> Result<Response, ApiError>;
}

/// One turn, for every API, once its request is parsed and its run named: replay → decide
/// (stop here, or the controller's actions) → edit → escalate → answer, streamed through the one
/// relay or whole through the one whole-answer path. A target learned not to stream tool calls
/// ([`NoStream`](crate::state::NoStream)) is asked without streaming and its answer sent as the
/// events a stream would have carried. The run is written back to the shared store when the
/// turn ends ([`crate::sharing::save`]; a streamed answer's relay holds it until the stream ends).
pub(crate) async fn heal_turn<D: Dialect>(t: &Turn, d: D) -> Result<Response, ApiError> {
    let answer = decide_and_answer(t, d).await;
    crate::sharing::save(&t.s, &t.state).await;
    answer
}

/// [`heal_turn`] before the run is written back.
async fn decide_and_answer<D: Dialect>(t: &Turn, mut d: D) -> Result<Response, ApiError> {
    let decided = d.replay(t);
    let (stop, abort) = (decided.next.stop.clone(), decided.verdict.abort.clone());
    if let Some((reason, action)) = stopping(stop, abort, decided.newest_failed) {
        let render = |words: &str| d.stopped(t, words);
        return Ok(stop_run(
            t,
            (&reason, action),
            d.streaming(),
            render,
            D::frames,
        ));
    }
    let mut actions: Vec<Action> = decided
        .next
        .actions
        .iter()
        .copied()
        .map(Action::from)
        .collect();
    if let Some(n) = t.capped {
        actions.push(Action::Cap);
        t.event(Kind::Guidance, json!({"max_tokens": n}));
    }
    let escalate = decided.next.escalate;
    let wait = TurnWait {
        ms: decided.next.wait_ms.min(t.s.config.limits.max_wait_ms),
        refused: decided.next.too_long.clone(),
    };
    d.edit(t, decided, &mut actions);
    d.set_chain(escalated(t, escalate, d.chain().to_vec()));
    wait.hold(t, &mut actions).await;
    let first = d.chain().first().cloned();
    let learned = d.streaming() && learned_no_stream(&t.s, d.tools(), d.chain());
    if d.streaming() && !learned {
        let mut resp = d.stream(t, actions).await?;
        wait.mark(&mut resp);
        return Ok(resp);
    }
    let mut resp = d.whole(t, actions, learned).await?;
    if learned {
        crate::state::mark_no_stream(&mut resp, first.as_ref());
    }
    wait.mark(&mut resp);
    Ok(resp)
}

/// The wait a turn makes before its model call: the delay of the retries the run decided for
/// tool failures (the agent calls the tool again only after this answer, so holding the model
/// call holds the tool's next call), and a wait a tool asked for that was longer than the
/// gateway holds a request (`[limits] max_wait_ms`), which the run routed around.
struct TurnWait {
    /// How long to hold, in ms. The core never decides a retry longer than the limit (it is
    /// told the limit), so the `min` that bounds it never shortens one.
    ms: u64,
    /// `(tool, the wait asked, in ms)`, when one was too long.
    refused: Option<(String, u64)>,
}

impl TurnWait {
    /// Holds the turn (on the state's [`Wait`](crate::clock::Wait)), recorded and reported as
    /// the `wait` action; records a wait refused.
    async fn hold(&self, t: &Turn, actions: &mut Vec<Action>) {
        if let Some((tool, asked)) = &self.refused {
            t.event(
                Kind::Recover,
                json!({"wait_refused": {"tool": tool, "asked_ms": asked,
                                        "max_wait_ms": t.s.config.limits.max_wait_ms}}),
            );
        }
        if self.ms == 0 {
            return;
        }
        crate::action::push_once(actions, Action::Wait);
        t.event(Kind::Recover, json!({"wait_ms": self.ms}));
        t.s.wait
            .hold(std::time::Duration::from_millis(self.ms))
            .await;
    }

    /// Reports the wait in the answer's headers (`x-selfheal-wait-ms`,
    /// `x-selfheal-wait-refused`).
    fn mark(&self, resp: &mut Response) {
        use axum::http::HeaderValue;
        let h = resp.headers_mut();
        if self.ms > 0 {
            h.insert("x-selfheal-wait-ms", HeaderValue::from(self.ms));
        }
        if let Some((tool, asked)) = &self.refused
            && let Ok(v) = HeaderValue::from_str(&format!("{tool}={asked}"))
        {
            h.insert("x-selfheal-wait-refused", v);
        }
    }
}

/// Why and how the run ends now, if it does: the controller's stop first, else the monitor's
/// abort rule when the newest result failed ([`selfheal_core::abort_now`]).
pub(crate) fn stopping(
    stop: Option<recover::Stop>,
    abort: Option<String>,
    newest_failed: bool,
) -> Option<(String, Action)> {
    match stop {
        Some(recover::Stop::Degrade(reason)) => Some((reason, Action::Degrade)),
        Some(recover::Stop::Abort(reason)) => Some((reason, Action::Terminate)),
        None => {
            selfheal_core::abort_now(abort, newest_failed).map(|reason| (reason, Action::Terminate))
        }
    }
}

/// Stage 2 (stop): the run ends here, with a final answer that says why — the same status,
/// action and words on every API. The dialect only shapes the answer: `render` wraps the words
/// in its answer object (the report is added here), `frames` cuts that into its stream events
/// when the client asked for a stream.
pub(crate) fn stop_run(
    t: &Turn,
    (reason, action): (&str, Action),
    streaming: bool,
    render: impl FnOnce(&str) -> Value,
    frames: fn(&Value) -> Vec<stream::Frame>,
) -> Response {
    let s = &t.s;
    Metrics::inc(&s.metrics.aborts_total);
    let status = {
        let mut st = lock(&t.state);
        st.act(action);
        if st.successes > 0 {
            Status::Partial
        } else {
            Status::Failed
        }
    };
    let actions = vec![action];
    t.event(Kind::Abort, json!({"reason": reason, "action": action}));
    let report = selfheal_report(&t.state, status, Some(reason), &actions);
    let content = format!(
        "I have to stop here: {reason}. The work so far is in the conversation above; \
         the remaining steps could not be completed."
    );
    if s.config.server.on_partial == OnPartial::Error {
        return partial_error(t, "run_stopped", &content, &actions, (status, Some(reason)));
    }
    let mut answer = render(&content);
    if let Some(o) = answer.as_object_mut() {
        o.insert("selfheal".into(), report);
    }
    t.caller.redactor.value(&mut answer);
    t.finish(status);
    let mut resp = if streaming {
        let frames = frames(&answer);
        sse_response(Body::from_stream(futures_util::stream::iter(frames)))
    } else {
        axum::Json(answer).into_response()
    };
    add_headers(
        &mut resp,
        &t.id(),
        status,
        &actions,
        Some(&t.caller.redactor.text(reason)),
    );
    resp
}

/// The controller's escalation (`escalate`): the request goes to the chain's next target,
/// recorded; else the chain as it is.
pub(crate) fn escalated(
    t: &Turn,
    escalate: bool,
    chain: Vec<crate::config::Target>,
) -> Vec<crate::config::Target> {
    if escalate && chain.len() > 1 {
        t.event(Kind::Escalate, json!({"to": chain[1].model}));
        chain[1..].to_vec()
    } else {
        chain
    }
}

/// Whether a streaming request offering `tools` is asked without streaming: its first target
/// was learned not to stream tool calls ([`NoStream`](crate::state::NoStream)), and its answer
/// goes out as the events a stream would have carried.
pub(crate) fn learned_no_stream(
    s: &AppState,
    tools: &ToolIndex,
    chain: &[crate::config::Target],
) -> bool {
    !tools.is_empty()
        && chain
            .first()
            .is_some_and(|c| s.no_stream.contains(c, Instant::now()))
}

/// Stage 3: what the verdict changes in the request (guidance, hidden tools), recorded.
pub(crate) fn edit_request(
    t: &Turn,
    req: &ChatRequest<'_>,
    verdict: &selfheal_core::Verdict,
    recovery: &[String],
    actions: &mut Vec<Action>,
) -> heal::Applied {
    let s = &t.s;
    let applied = heal::apply_verdict(req, verdict, recovery);
    if !applied.guidance.is_empty() {
        Metrics::inc(&s.metrics.guidance_total);
        actions.push(Action::Guidance);
        t.event(Kind::Guidance, json!({"text": applied.guidance}));
    }
    if !applied.hidden.is_empty() {
        Metrics::inc(&s.metrics.tools_hidden_total);
        actions.push(Action::Hide);
        t.event(Kind::Hide, json!({"tools": applied.hidden}));
    }
    applied
}

/// The further check of a stream's held calls: the calls that repeat the model's previous turn
/// ([`heal::Answered`]) and, when the request offers a grounded tool, the grounding check, whose
/// evidence is read now, while the request is at hand (the relay runs after it is gone).
pub(crate) fn stream_check(t: &Turn, req: &ChatRequest<'_>, ctx: &Call) -> Option<stream::Check> {
    let grounding = recover::Grounding {
        tools: &t.s.config.tools,
        messages: &req.messages,
    };
    let grounded = grounding
        .any_grounded(ctx.tools.keys().map(String::as_str))
        .then(|| grounding_check(t, Arc::new(grounding.evidence())));
    calls_check(ctx.answered.clone(), grounded)
}

/// The further check of a streamed answer's usable calls, chat or Responses alike: those that
/// repeat the model's previous turn (`answered`) taken out, then those the grounding check
/// (`grounded`) refuses; `None` when neither can refuse a call.
pub(crate) fn calls_check(
    answered: Arc<heal::Answered>,
    grounded: Option<stream::Check>,
) -> Option<stream::Check> {
    match grounded {
        None if answered.is_empty() => None,
        None => Some(Box::new(move |calls: &mut Vec<Value>| {
            answered.take_repeated(calls)
        })),
        Some(grounded) => Some(Box::new(move |calls: &mut Vec<Value>| {
            let mut problems = answered.take_repeated(calls);
            problems.extend(grounded(calls));
            problems
        })),
    }
}

/// Puts `words` in a Responses answer: as an `output_text` part of its last `message` item,
/// or as a message item of its own when it has none.
pub(crate) fn say_in_output(answer: &mut Value, words: &str) {
    let part = json!({"type": "output_text", "text": words, "annotations": []});
    let Some(output) = answer.get_mut("output").and_then(Value::as_array_mut) else {
        if let Some(o) = answer.as_object_mut() {
            o.insert("output".into(), json!([]));
            say_in_output(answer, words);
        }
        return;
    };
    let message = output
        .iter_mut()
        .rev()
        .find(|i| crate::heal::item_type(i) == Some("message"))
        .and_then(|m| m.get_mut("content"))
        .and_then(Value::as_array_mut);
    match message {
        Some(content) => content.push(part),
        None => output.push(
            json!({"type": "message", "id": "msg_selfheal", "role": "assistant",
                                   "status": "completed", "content": [part]}),
        ),
    }
}

/// The error a client configured with `[server] on_partial = "error"` gets in place of an
/// answer the gateway had to write itself (`code`: `calls_left_out` or `run_stopped`), with the
/// run's headers and its `status` (`partial` or `failed`).
pub(crate) fn partial_error(
    t: &Turn,
    code: &'static str,
    words: &str,
    actions: &[Action],
    (status, reason): (Status, Option<&str>),
) -> Response {
    t.finish(status);
    let words = t.caller.redactor.text(words).into_owned();
    let mut resp = ApiError::partial(code, words).into_response();
    let reason = reason.map(|r| t.caller.redactor.text(r).into_owned());
    add_headers(&mut resp, &t.id(), status, actions, reason.as_deref());
    resp
}

/// The user turn that asks the model to redo tool calls that could not be used.
pub(crate) fn reask_turn(problems: &[heal::Problem]) -> Value {
    json!({"role": "user", "content": format!(
        "Your last answer's tool calls could not be used. {}",
        heal::problems_text(problems)
    )})
}

/// Writes the run's decisions about the tool results of a request (signals, classes, actions
/// with their inputs, tools routed around) to its trace, where `selfheal trace replay` decides
/// them again under another policy.
pub(crate) fn record_decisions(t: &Turn, decisions: Vec<(u64, selfheal_core::TraceEvent)>) {
    for (_, event) in decisions {
        t.event(
            Kind::from(&event),
            serde_json::to_value(&event).unwrap_or(Value::Null),
        );
    }
}

/// Hands the run a decision about the model's answer (its calls unusable, its stream broken),
/// writes the run's decision records to this turn's trace and returns what the run decided.
pub(crate) fn run_decides(t: &Turn, input: selfheal_core::Input<'_>) -> Vec<selfheal_core::Action> {
    let (actions, records) = {
        let mut st = lock(&t.state);
        let mut rng = time_rng();
        let mut breakers = selfheal_core::Breakers::none();
        let actions = st.decide(input, t.s.now_ms(), &mut rng, &mut breakers);
        (actions, st.run.take_records())
    };
    for (_, event) in records {
        t.event(
            Kind::from(&event),
            serde_json::to_value(&event).unwrap_or(Value::Null),
        );
    }
    actions
}

/// Whether the run re-asks the model for tool calls that cannot be used (charged to the run's
/// ledger and counted as its recovery when it does): the core's decision on the problems'
/// signal ([`heal::unusable_signal`]) at `state`, the failure's place on its ladder, along
/// `chain`, whose second target is the fallback the ladder may escalate to. `Some((next state,
/// escalate))` when it does: the caller passes the state on if the new answer cannot be used
/// either, so the ladder, not the gateway, says when to stop; on an escalation `chain` is
/// advanced to the fallback (the re-ask and what follows go there) and the run records it.
/// Every API re-asks through it (chat and Responses, streaming or not).
pub(crate) fn reask_or_escalate(
    t: &Turn,
    problems: &[heal::Problem],
    state: ReaskState,
    chain: &mut &[crate::config::Target],
) -> Option<(ReaskState, bool)> {
    let fallback = chain.get(1).map(|c| c.model.clone());
    let actions = run_decides(
        t,
        selfheal_core::Input::CallsUnusable {
            signal: heal::unusable_signal(problems),
            fallback: fallback.as_deref(),
            state,
        },
    );
    let (next, escalate) = actions.into_iter().find_map(|a| match a {
        selfheal_core::Action::Reask { next, escalate } => Some((next, escalate)),
        _ => None,
    })?;
    lock(&t.state).act(Action::Reask);
    if escalate && chain.len() > 1 {
        // The ladder's escalation: the fallback model is asked from here on.
        *chain = &chain[1..];
        t.event(
            Kind::Escalate,
            json!({"to": chain.first().map(|c| &c.model)}),
        );
    }
    Some((next, escalate))
}

/// Whether the run re-issues a stream that broke before any content (charged when it does).
pub(crate) fn reissue_granted(t: &Turn) -> bool {
    let actions = run_decides(
        t,
        selfheal_core::Input::StreamBroke {
            after_content: false,
        },
    );
    let granted = actions
        .iter()
        .any(|a| matches!(a, selfheal_core::Action::Reissue));
    if granted {
        lock(&t.state).act(Action::Reissue);
    }
    granted
}

/// Jitter for backoffs, seeded from the clock (the core's decisions stay reproducible from
/// their inputs; the gateway's inputs include the time).
pub(crate) fn time_rng() -> selfheal_core::SplitMix64 {
    selfheal_core::SplitMix64::new(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64),
    )
}

/// One API's second asking of a streamed request, without streaming: the request with `extra`
/// appended (a re-ask's problems, the read before answering's guidance; nothing for a re-issue)
/// asked along `chain`, charged to the run's budget, and its answer's calls checked as a whole
/// answer's are — `Ok` when they can be used, else their problems. The decisions around it
/// (whether to ask at all, along which chain) are [`ask_again`]'s, the same for every API.
pub(crate) trait AskStream: Clone + Send + Sync + 'static {
    /// The API's whole, checked answer.
    type Answer: Send + 'static;
    /// The turn the stream belongs to.
    fn turn(&self) -> &Turn;
    /// The chain the stream was asked along.
    fn chain(&self) -> &[crate::config::Target];
    /// Asks once, as above.
    fn ask_once<'a>(
        &'a self,
        chain: &'a [crate::config::Target],
        extra: Option<Value>,
    ) -> BoxFuture<'a, Option<Result<Self::Answer, Vec<heal::Problem>>>>;
    /// Whether an answer calls tools.
    fn calls_tools(answer: &Self::Answer) -> bool;
}

/// The relay's hook that asks again ([`ask_again`] without guidance).
pub(crate) fn again_hook<A: AskStream>(a: &A) -> AskAgain<A::Answer> {
    let a = a.clone();
    Box::new(move |problems: Vec<heal::Problem>| {
        Box::pin(async move { ask_again(&a, problems, None).await })
    })
}

/// The streaming relay's second asking, for every API: non-streaming calls through the chain,
/// each answer checked ([`AskStream::ask_once`]). With `guidance` (the read before answering),
/// the first call appends it and needs no decision of its own (the core's `reread_due` made
/// it); with problems, they are appended as a user turn (a re-ask of unusable tool calls,
/// repeated while the policy's ladder allows, its escalation moving to the chain's next
/// target); with neither, the same request is asked again (a re-issue of a stream that broke
/// before any content, when the core grants it). Unusable calls in an answer are re-asked in
/// turn.
pub(crate) async fn ask_again<A: AskStream>(
    a: &A,
    problems: Vec<heal::Problem>,
    guidance: Option<Value>,
) -> Option<A::Answer> {
    let t = a.turn();
    let mut problems = problems;
    let mut guidance = guidance;
    let mut ladder = ReaskState::default();
    let mut chain = a.chain();
    loop {
        let extra = match guidance.take() {
            Some(g) => Some(g),
            None if problems.is_empty() => {
                if !reissue_granted(t) {
                    return None;
                }
                t.event(Kind::Reissue, json!({"stream": false}));
                None
            }
            None => {
                let (next, _) = reask_or_escalate(t, &problems, ladder, &mut chain)?;
                ladder = next;
                Metrics::inc(&t.s.metrics.reasks_total);
                t.event(Kind::Reask, json!({"problems": problems}));
                Some(reask_turn(&problems))
            }
        };
        match a.ask_once(chain, extra).await? {
            Ok(answer) => return Some(answer),
            Err(again) => problems = again,
        }
    }
}

/// The read before answering of a streamed final answer ([`stream::Hooks::reread`]), decided
/// as the non-streaming path decides it: nothing when the run is unsettled (the answer goes
/// out `partial` instead), else the core's `reread_due` ([`recover::reread_before_answer`]);
/// when due, the request asked again with the guidance appended ([`ask_again`]). An answer
/// without a tool call, or none, leaves the value unread.
pub(crate) fn reread_hook<A: AskStream>(a: &A) -> ReadAgain<A::Answer> {
    let a = a.clone();
    Box::new(move || {
        Box::pin(async move {
            let text = reread_due(a.turn())?;
            let answer = ask_again(&a, Vec::new(), Some(reread_item(&text))).await;
            let called = answer.as_ref().map(A::calls_tools);
            Some(crate::relay::Reread {
                answer,
                unread: unread(called, &text),
            })
        })
    })
}

/// Whether a final answer is held for the read before answering: its guidance, when the run is
/// settled and the core's `reread_due` says so (recorded as guidance).
pub(crate) fn reread_due(t: &Turn) -> Option<String> {
    let text = {
        let mut st = lock(&t.state);
        if recover::unsettled(&st).is_some() {
            return None;
        }
        recover::reread_before_answer(&mut st)?
    };
    t.event(Kind::Guidance, json!({"text": [text]}));
    Some(text)
}

/// Why an answer to the read before answering leaves the value unread: it called no tool
/// (`Some(false)`), or there was none (`None`).
pub(crate) fn unread(called: Option<bool>, text: &str) -> Option<String> {
    match called {
        Some(true) => None,
        Some(false) => Some(format!("not read again before answering: {text}")),
        None => Some(format!(
            "not read again before answering (no usable answer to the request for it): {text}"
        )),
    }
}

/// Records the call's decisions and events (trace, metrics) and adds their kinds to `actions`.
pub(crate) fn log_calls(t: &Turn, log: &CallLog, actions: &mut Vec<Action>) {
    call_actions(log, actions);
    let s = &t.s;
    // The core's typed decision events: the schema `selfheal trace replay` reads.
    for (t_ms, e) in &log.decisions {
        let detail = serde_json::to_value(e).unwrap_or(Value::Null);
        s.event_at(
            &t.caller.redactor,
            &t.run,
            Kind::from(e),
            detail,
            None,
            *t_ms,
        );
    }
    for e in &log.events {
        let (kind, detail) = (e.kind, &e.detail);
        if kind == Kind::Retry {
            Metrics::inc(&s.metrics.retries_total);
        } else if kind == Kind::Fallback {
            Metrics::inc(&s.metrics.fallbacks_total);
        }
        tracing::debug!(target: "selfheal::upstream", run = &*t.run, kind = kind.as_str(), detail = %t.caller.redactor.text(detail));
        s.event_at(
            &t.caller.redactor,
            &t.run,
            kind,
            json!({"detail": detail}),
            None,
            e.t_ms,
        );
    }
}

pub(crate) fn finish_trace(t: &Turn, status: Status) {
    let (failures, actions) = {
        let st = lock(&t.state);
        (st.failures, st.ledger().spent().recoveries)
    };
    t.s.event(
        &t.caller.redactor,
        &t.run,
        Kind::Response,
        Detail::of(&ResponseDetail { status }),
        Some(RunSummary {
            status: status.as_str().to_owned(),
            failures,
            actions,
        }),
    );
}

/// A chat answer's tool calls checked: repaired in place or taken out as unusable
/// ([`heal::check_message`]), then those that repeat the model's previous turn (`answered`) and
/// those the grounding check refuses taken out; the problems of those taken out.
pub(crate) fn check_completion(
    completion: &mut Value,
    tools: &ToolIndex,
    guides: &heal::GuideCache,
    answered: &heal::Answered,
    grounding: recover::Grounding<'_>,
    salvage: bool,
) -> heal::CallCheck {
    let ending = selfheal_repair::Ending::from_finish_reason(
        completion
            .at("/choices/0/finish_reason")
            .and_then(Value::as_str),
    );
    let check = match completion.at_mut("/choices/0/message") {
        Some(m) => {
            // Calls written as text become calls first, then face the same checks.
            let none = ToolIndex::new();
            let offered = if salvage { tools } else { &none };
            let salvaged = match heal::salvage_text_calls(m, offered) {
                heal::Salvage::None => 0,
                heal::Salvage::Taken(n) => n,
                heal::Salvage::Doubt(problem) => {
                    return heal::CallCheck {
                        invalid: vec![problem],
                        ..heal::CallCheck::default()
                    };
                }
            };
            let mut check = heal::check_message(m, tools, guides, ending);
            check.salvaged = salvaged;
            check.invalid.extend(answered.check(m));
            check.invalid.extend(grounding.check(m));
            check
        }
        None => heal::CallCheck::default(),
    };
    // Calls written as text were taken: the choice ends in tool calls.
    if check.salvaged > 0
        && completion.at("/choices/0/message/tool_calls").is_some()
        && let Some(f) = completion.at_mut("/choices/0/finish_reason")
    {
        *f = Value::String("tool_calls".into());
    }
    // Every call was taken out: the choice no longer ends in tool calls.
    let no_calls = completion.at("/choices/0/message/tool_calls").is_none();
    if !check.invalid.is_empty()
        && no_calls
        && let Some(f) = completion.at_mut("/choices/0/finish_reason")
        && f.as_str() == Some("tool_calls")
    {
        *f = Value::String("stop".into());
    }
    check
}

/// Remembers the Responses answer the run sent (its id and calls), for a client that continues
/// it with `previous_response_id` ([`crate::runs::Responded`]).
pub(crate) fn remember_response(t: &Turn, responded: Option<crate::runs::Responded>) {
    let Some(r) = responded else { return };
    adopt_first_call(
        t,
        r.calls.first().map(|c| {
            (
                c.get("call_id").and_then(Value::as_str).unwrap_or(""),
                c.get("name").and_then(Value::as_str).unwrap_or(""),
            )
        }),
    );
    t.s.runs.responded(&r.id, &t.id());
    lock(&t.state).last_response = Some(r);
}

/// The read before answering's guidance as a system message: appended to a chat request's
/// `messages`, or a Responses `input` item.
pub(crate) fn reread_item(text: &str) -> Value {
    json!({"role": "system", "content": format!("[selfheal] {text}")})
}

/// The hooks of a stream's relay, for any API: `again` asks again (a re-ask, a re-issue, the
/// read before answering: [`ask_again`]), `check` checks the held calls further; the core's
/// judgement of a final answer ([`recover::unsettled`] when it ends), the run's budget as the
/// final report shows it and what a client gets for calls left out are the same on every API. The head is set in the relay's task
/// ([`relay_stream`]).
pub(crate) fn stream_hooks<A: AskStream>(
    t: &Turn,
    again: &A,
    check: Option<stream::Check>,
) -> Hooks<A::Answer> {
    let (state, budget) = (t.state.clone(), t.state.clone());
    Hooks {
        reask: Some(again_hook(again)),
        reissue: Some(again_hook(again)),
        check,
        reread: Some(reread_hook(again)),
        unsettled: Some(Box::new(move || recover::unsettled(&lock(&state)))),
        // The dialect sets it: the evidence is its request's.
        grounding: None,
        head: None,
        budget: Some(Box::new(move || budget_json(&lock(&budget)))),
        on_partial: t.s.config.server.on_partial,
        // The dialect says whether its request allows it (`tool_choice`).
        salvage: false,
        degenerate: Some(t.s.config.limits.degenerate),
    }
}

/// The grounding rule of a streamed final answer ([`crate::relay::Hooks::grounding`]): the
/// core's judgement of its text against `evidence`, the request's, read while it was at hand.
/// `may_call`: the request let the model call a tool (no `tool_choice: "none"`).
pub(crate) fn grounding_hook(
    t: &Turn,
    evidence: Vec<Value>,
    may_call: bool,
) -> crate::relay::Grounding {
    let state = t.state.clone();
    Box::new(move |text: &str| recover::ungrounded_answer(&lock(&state), text, &evidence, may_call))
}

/// How a request is written for a target model.
pub(crate) type Encode<'a> = &'a (dyn Fn(&str) -> Bytes + Send + Sync);

/// Stage 4 (streaming), for every API: the request asked along `chain` for a stream (`op`), and
/// the stream relayed in grammar `G` ([`crate::relay`]) with `hooks`, in its own task; the
/// client is answered with the frames it sends (redacted, as SSE). When the relay is done the
/// run's end is recorded ([`finish_stream`]) before its sender is dropped, so the trace has the
/// `response` event before the client sees the end. The response's head waits for the relay's
/// first frame and carries the report as it stood then ([`crate::relay`]'s head report: the
/// actions taken, a re-read, a `partial` or `failed` already known), not a `complete` written
/// before the upstream answered.
pub(crate) async fn relay_stream<G: Grammar + Default + 'static>(
    t: &Turn,
    (chain, encode): (&[crate::config::Target], Encode<'_>),
    op: crate::upstream::Op<'_, reqwest::Response>,
    tools: Arc<ToolIndex>,
    hooks: Hooks<G::Answer>,
    mut actions: Vec<Action>,
) -> Result<Response, ApiError> {
    let mut log = CallLog::default();
    let result = t.call(chain, encode, op, &mut log).await;
    log_calls(t, &log, &mut actions);
    let upstream = result.map_err(|e| t.failed(e))?;
    let report = selfheal_report(&t.state, Status::Complete, None, &actions);
    let learnable = log.served.clone().filter(|_| !tools.is_empty());
    let guides = t.s.guides.clone();
    let (tx, rx) = mpsc::channel(64);
    let (head_tx, head_rx) = tokio::sync::oneshot::channel();
    let hooks = Hooks {
        head: Some(head_tx),
        ..hooks
    };
    let t2 = t.clone();
    crate::sharing::hold(&t.s, &t.state);
    tokio::spawn(async move {
        let g = G::default();
        let r = crate::relay::relay(g, upstream, tools, guides, Some(report), hooks, &tx).await;
        finish_stream(&t2, &r, learnable.as_ref());
        crate::sharing::save(&t2.s, &t2.state).await;
        drop(tx);
    });
    let head = head_rx.await.ok();
    let redactor = t.caller.redactor.clone();
    let body = futures_util::stream::unfold((rx, redactor), |(mut rx, red)| async move {
        let frame = rx.recv().await?;
        Some((frame.map(|b| red.bytes(b)), (rx, red)))
    });
    let mut resp = sse_response(Body::from_stream(body));
    let text = |k: &str| head.as_ref().and_then(|h| h.get(k)).and_then(Value::as_str);
    let status = text("status").and_then(|s| s.parse().ok());
    let status = status.unwrap_or(Status::Complete);
    let reason = text("reason").map(|r| t.caller.redactor.text(r).into_owned());
    let actions: Vec<Action> = match head.as_ref().and_then(|h| h.get("actions")) {
        Some(Value::Array(a)) => a
            .iter()
            .filter_map(|a| serde::Deserialize::deserialize(a).ok())
            .collect(),
        _ => actions,
    };
    add_headers(&mut resp, &t.run, status, &actions, reason.as_deref());
    Ok(resp)
}
