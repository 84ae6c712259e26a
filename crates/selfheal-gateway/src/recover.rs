//! Recovery through the wire: the run's controller decides, the gateway asks the agent.
//!
//! Why it exists: the gateway executes no tool, but every tool result comes back to it in the
//! next request. Each new result is an observation of the run's core
//! [`Controller`](selfheal_core::Controller) — the same
//! classifier, class ladders, per-failure cap, doubt rule and ledger the in-process runtime and
//! the benchmark use — and the directive it returns is carried out with what a proxy has: text
//! for the model, the model it sends the request to, and the answer it gives the client.
//!
//! ```text
//!  tool result in request N ──read_result──▶ Observation::ToolFinished ──▶ Controller
//!                                                                            │
//!   request N, edited ◀── guidance / fallback target / partial answer ◀── Directive
//! ```
//!
//! | directive | on the wire |
//! |---|---|
//! | `Continue` | nothing beyond the monitor's guidance |
//! | `Recover` retry of a tool's failure | guidance: call the tool again with the same arguments, sent once the retry's delay has passed (the request is held before its model call, up to `[limits] max_wait_ms`, which the core is told: a longer delay is routed around, never shortened) |
//! | `Recover` refresh (stale data, a contradicted value) of a tool that declares its cache-bypass argument ([`ToolConfig::refresh`]) | guidance: call the tool again with the same arguments and that one set to `true` |
//! | `Recover` repair of a tool's answer that does not parse, or whose declared field was renamed ([`ToolConfig::output`]) | the gateway's repair of the bytes (or the field mapped back) replaces the result in every request it forwards; the repaired value is then cross-checked like any other; a drift it cannot map is fetched again |
//! | `Recover` retry of the model's own mistake | guidance: write the call again |
//! | `Recover` substitute | guidance naming the failed tool and the equivalent one to call instead ([`ToolConfig::substitute`]) |
//! | `Recover` replan | guidance: rethink the plan from the results there are |
//! | `Recover` escalate | this request goes to the chain's next target (the fallback model); for a planning failure, with the replan's guidance |
//! | `Degrade` / `Abort` | the run ends here: an answer flagged `partial` (or `failed`) with the reason |
//!
//! **Cross-checks.** For a tool the operator marked [`ToolConfig::cross_check`], a value is not
//! observed when it arrives: the gateway asks the agent, through its own tool loop, to call the
//! equivalent tool with the same arguments (the tool itself again, when it has no equivalent:
//! a second read), and observes the value with the verdict of
//! [`selfheal_core::cross_check`] on the two answers when the second one arrives —
//! a disagreement as the call's contradiction signal, otherwise a [`Observation::Verified`]
//! after it, exactly the order the benchmark's in-process client reports them in. So the core's
//! doubt rule ([`selfheal_core::Policy::in_doubt`]) applies on the wire too: a
//! substitute's value that its primary cannot confirm ends the run `partial` instead of being
//! returned as correct. An agent that does not make the cross-check call gets the verdict
//! "uncertain" for it.
//!
//! **Contracts.** An answer is read against what the operator declared of its tool
//! ([`ToolConfig::output`], [`ToolConfig::as_of`]) by the core's rules
//! ([`selfheal_core::contract`]) before anything else: a declared field missing or renamed is
//! schema drift, one null or empty an empty output, an `as_of` older than allowed by the wall
//! clock stale context — the signals the in-process client reads off the task file's tool
//! definitions. Without a declaration nothing is judged.
//!
//! **Steps.** The controller tracks one open failure per plan step; the gateway has no plan, so
//! a tool and its configured substitute are one step (the question they both answer) and every
//! other tool is its own.

use std::collections::BTreeMap;

use serde_json::Value;

use selfheal_core::{
    Action, ActionKind, Amounts, Breakers, CallOutcome, EscalationTarget, FailureClass, Input,
    Judgement, Monitor, Observation, Options, RecoveryAction, RepairTarget, RunStatus,
    SecondReading, SecondSource, Signal, SplitMix64, StepAction, ToolCall, canonical_hash,
    contract, judge_second_reading,
};

use crate::config::ToolConfig;
use crate::runs::{Held, Pending, RunState};
use crate::wire::{self, ToolIndex};

pub(crate) use crate::runs::{MAX_HELD, MAX_REPAIRED, Next, Stop, Wire};

/// Most tools a run gives a step id of its own; later ones share the last id.
pub(crate) const MAX_STEPS: u32 = 256;

/// What a request's recovery knows beyond the run: the operator's tool descriptions, the tools
/// the request offers, and the fallback model the run can escalate to.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Ctx<'a> {
    /// `[tools]` of the gateway's config.
    pub tools: &'a BTreeMap<String, ToolConfig>,
    /// The tools the request offers.
    pub offered: &'a ToolIndex,
    /// The model of the chain's second target, if the chain has one (the escalation target).
    pub fallback: Option<&'a str>,
    /// A seed for the backoff jitter of the controller's decisions.
    pub seed: u64,
    /// The wall clock, Unix time in milliseconds (what `as_of` stamps are read against).
    pub wall_ms: u64,
    /// The longest the gateway holds a request to wait out a retry's delay (`[limits]
    /// max_wait_ms`): what the core is told it can wait ([`Options::max_delay_ms`]).
    pub max_wait_ms: u64,
}

/// The wall clock now, Unix time in milliseconds.
pub fn wall_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

impl Ctx<'_> {
    /// The cache-bypass argument of `tool`, if it declares one.
    fn refresh_of(&self, tool: &str) -> Option<&str> {
        self.tools.get(tool)?.refresh.as_deref()
    }

    /// How `value`, an answer of `tool`, breaks the tool's declared contract, if it does: a
    /// declared field drifted or empty ([`selfheal_core::contract::breach`]), or an `as_of`
    /// older than the tool allows by the wall clock. The signal, and whether an output repair
    /// applies.
    fn breach(&self, tool: &str, value: &Value) -> Option<(Signal, Option<RepairTarget>)> {
        let c = self.tools.get(tool)?;
        if let Some(b) = contract::breach(value, &c.output) {
            let repair =
                matches!(b, contract::Breach::Drifted { .. }).then_some(RepairTarget::Output);
            return Some((b.signal(value), repair));
        }
        let as_of = c.as_of.as_deref()?;
        contract::stale(value, as_of, self.wall_ms, c.max_age_ms).map(|s| (s, None))
    }

    /// `value` as two sources' answers are compared: without `tool`'s `as_of` stamp.
    fn comparable(&self, tool: &str, value: &Value) -> Value {
        match self.tools.get(tool).and_then(|c| c.as_of.as_deref()) {
            Some(field) => contract::without_stamp(value, field),
            None => value.clone(),
        }
    }

    /// The configured substitute of `tool`.
    fn substitute_of(&self, tool: &str) -> Option<&str> {
        self.tools.get(tool)?.substitute.as_deref()
    }

    /// The tool `tool` is the configured substitute of.
    fn primary_of(&self, tool: &str) -> Option<&str> {
        self.tools
            .iter()
            .find(|(_, c)| c.substitute.as_deref() == Some(tool))
            .map(|(name, _)| name.as_str())
    }

    /// The tool a value of `tool` is cross-checked against, with the tolerance, if it is: its
    /// substitute, or — for a tool with none — the tool itself, read a second time with the
    /// same arguments.
    fn check_against(&self, tool: &str) -> Option<(String, selfheal_core::Tolerance)> {
        if let Some(c) = self.tools.get(tool)
            && c.cross_check
        {
            let against = c.substitute.clone().unwrap_or_else(|| tool.to_owned());
            return Some((against, c.tolerance));
        }
        let primary = self.primary_of(tool)?;
        let c = self.tools.get(primary)?;
        c.cross_check.then(|| (primary.to_owned(), c.tolerance))
    }
}

/// What the cross-check found.
#[derive(Debug, Clone, PartialEq)]
enum Verdict {
    /// The verifier's judgement.
    Judged(Judgement),
    /// The other source's answer shows this one is empty or drifted (the signal).
    Hole(Signal),
}

impl Wire {
    /// The step id of `tool`: its substitute's or primary's if that has one, else a new one.
    fn step_of(&mut self, tool: &str, ctx: &Ctx<'_>) -> u32 {
        if let Some(&s) = self.steps.get(tool) {
            return s;
        }
        let shared = [ctx.substitute_of(tool), ctx.primary_of(tool)]
            .into_iter()
            .flatten()
            .find_map(|t| self.steps.get(t).copied());
        let id = shared.unwrap_or_else(|| {
            u32::try_from(self.steps.len())
                .unwrap_or(u32::MAX)
                .min(MAX_STEPS - 1)
        });
        if self.steps.len() < MAX_STEPS as usize {
            self.steps.insert(tool.to_owned(), id);
        }
        id
    }

    /// Remembers the repair of the result of call `id`.
    fn replace(&mut self, id: &str, value: &Value) {
        if self.repaired.len() == MAX_REPAIRED {
            self.repaired.pop_front();
        }
        self.repaired.push_back((id.to_owned(), value.to_string()));
    }

    /// Takes what the next request has to carry out, adding the pending cross-check's request,
    /// the awaited read before answering and every repaired result the run keeps replacing.
    pub fn take_next(&mut self) -> Next {
        let mut next = std::mem::take(&mut self.next);
        next.replaced = self.repaired.iter().cloned().collect();
        if next.stop.is_none()
            && let Some(p) = &self.pending
        {
            next.guidance.push(cross_check_text(&p.tool, &p.against));
            next.again.push(p.against.clone());
        }
        if next.stop.is_none()
            && let Some(r) = &self.reread
        {
            next.guidance.push(reread_text(&r.tool, &r.args));
            next.again.push(r.tool.clone());
        }
        next
    }

    /// Notes that the run took `value`, the answer of `tool` to `args`, and goes on with it
    /// ([`Next::taken`]); keeps it for the read before answering when the operator marked the
    /// tool [`ToolConfig::reread`]. A later value of the same call replaces it.
    fn keep(&mut self, ctx: &Ctx<'_>, step: u32, call: (&str, &Value), value: &Value) {
        let (tool, args) = call;
        let key = canonical_hash(args);
        if self.next.taken.len() < MAX_HELD {
            self.next.taken.push((tool.to_owned(), key));
        }
        if !ctx.tools.get(tool).is_some_and(|c| c.reread) {
            return;
        }
        self.values
            .retain(|h| !(h.tool == tool && canonical_hash(&h.args) == key));
        if self.values.len() == MAX_HELD {
            self.values.pop_front();
        }
        self.values.push_back(Held {
            step,
            tool: tool.to_owned(),
            args: args.clone(),
            value: value.clone(),
        });
    }

    /// Forgets the values taken so far in this request ([`Next::taken`]): the results read
    /// next are of a later turn.
    pub fn forget_taken(&mut self) {
        self.next.taken.clear();
    }

    /// Whether a cross-check is awaited.
    pub fn awaiting_check(&self) -> bool {
        self.pending.is_some()
    }
}

/// Takes what the next request of the run has to carry out ([`Wire::take_next`]), for every
/// API alike. A run the core stopped stays stopped: a later request of it (the same
/// conversation sent again, a client that retries) is answered with the same stop, never
/// served as if nothing had happened. A new conversation is a new run.
pub(crate) fn take_next(st: &mut RunState) -> Next {
    let mut next = st.wire.take_next();
    if next.stop.is_none()
        && let Some((status, reason)) = st.run.stopped()
    {
        let reason = format!("this run was stopped earlier: {reason}");
        next.stop = Some(match status {
            RunStatus::Partial => Stop::Degrade(reason),
            RunStatus::Complete | RunStatus::Failed => Stop::Abort(reason),
        });
    }
    next
}

/// Why a final answer cannot go out as complete now, if it cannot: the core's
/// [`Controller::unclaimable`](selfheal_core::Controller::unclaimable) for a
/// front-end that knows its steps by tool ([`StepsBy::Tool`](selfheal_core::StepsBy)):
/// a tool's failure still unsettled, or a recovery under a policy that claims nothing after one.
/// A value held for its cross-check that the model answered without checking is unsettled too:
/// the core never saw it judged, so the answer built on it is not claimed.
pub(crate) fn unsettled(st: &RunState) -> Option<String> {
    if let Some(p) = &st.wire.pending {
        return Some(format!(
            "the value `{}` returned was not cross-checked against `{}` before the answer",
            p.tool, p.against
        ));
    }
    st.run.unclaimable(selfheal_core::StepsBy::Tool)
}

/// Why a final answer whose text is `text` cannot go out as complete: [`unsettled`], else the
/// core's answer rules over the text and the request's `evidence`
/// ([`selfheal_core::Run::unclaimable_answer`], in a run offered tools: a call of an
/// offered tool announced instead of made, when the request let the model call one
/// (`may_call`); a number found in no input or tool result of the run).
pub(crate) fn ungrounded_answer(
    st: &RunState,
    text: &str,
    evidence: &[Value],
    may_call: bool,
) -> Option<String> {
    st.run.unclaimable_answer(
        selfheal_core::StepsBy::Tool,
        Some(selfheal_core::Proposed {
            text,
            evidence,
            may_call,
        }),
    )
}

/// The guidance that asks, before the run answers, for one more read of a value.
pub(crate) fn reread_text(tool: &str, args: &Value) -> String {
    format!("Before you answer, read `{tool}` again: call it with the arguments {args}.")
}

/// Asked when the model answers without a tool call: whether the run reads its values once
/// more first — the core's [`Controller::reread_due`](selfheal_core::Controller::reread_due)
/// (once per run, after a recovery, when the policy's `reread_after_recovery` asks for it),
/// over the values of the tools the operator marked [`ToolConfig::reread`]. If so, the
/// guidance that asks for the first read; the gateway holds the answer and asks the model for
/// the call, and each read that arrives is the verifier `re_read` of its value
/// ([`observe`]), the next read asked for while the values hold.
pub(crate) fn reread_before_answer(st: &mut RunState) -> Option<String> {
    if st.wire.values.is_empty() || st.wire.reread.is_some() || st.wire.pending.is_some() {
        return None;
    }
    let mut breakers = Breakers::none();
    let mut rng = SplitMix64::new(0);
    let proposed = st.decide(
        Input::AnswerProposed {
            by: selfheal_core::StepsBy::Tool,
            answer: None,
        },
        0,
        &mut rng,
        &mut breakers,
    );
    if !proposed
        .iter()
        .any(|a| matches!(a, Action::ReadAgain { .. }))
    {
        return None;
    }
    st.wire.rereads = st.wire.values.clone();
    let first = st.wire.rereads.pop_front()?;
    let text = reread_text(&first.tool, &first.args);
    st.wire.reread = Some(Box::new(first));
    Some(text)
}

/// Observes the verdict of a read before answering on its value: a value that changed is the
/// verifier's rejection of its step, and the controller's directive is carried out (the reads
/// left are dropped: the run goes back to that step); otherwise the next read is asked for.
fn reread_verdict(st: &mut RunState, ctx: &Ctx<'_>, r: &Held, judgement: Judgement, now_ms: u64) {
    let rejected = matches!(judgement, Judgement::Reject { .. });
    let options = options(st, ctx, r.step, &r.tool, None);
    let mut rng = SplitMix64::new(ctx.seed ^ u64::from(r.step));
    let d = decide_on(
        st,
        Observation::Verified {
            step: Some(r.step),
            verifier: "re_read",
            judgement,
            options,
        },
        now_ms,
        &mut rng,
    );
    if rejected || !matches!(d, StepAction::Proceed { .. }) {
        st.wire.rereads.clear();
        carry(st, ctx, r.step, &r.tool, d);
    } else {
        st.wire.reread = st.wire.rereads.pop_front().map(Box::new);
    }
}

/// The guidance that asks for a cross-check.
pub fn cross_check_text(tool: &str, against: &str) -> String {
    format!(
        "Cross-check the last result of `{tool}`: call `{against}` with the same arguments \
         before you use it."
    )
}

/// Takes the calls of grounded tools whose arguments appear nowhere in `evidence` out of
/// `calls` — chat tool calls (`{"function": {"name", "arguments"}}`) or Responses
/// `function_call` items (`{"type": "function_call", "name", "arguments"}`; items of other
/// types stay) — and returns the problem of each, unusable arguments ([`Grounding`] says why).
pub(crate) fn take_ungrounded(
    tools: &BTreeMap<String, ToolConfig>,
    calls: &mut Vec<Value>,
    evidence: &[Value],
) -> Vec<wire::Problem> {
    let mut problems = Vec::new();
    calls.retain(|c| {
        let item = wire::item_type(c) == Some("function_call");
        let field = |f: &str| {
            if item {
                c.get(f)
            } else {
                c.get("function").and_then(|x| x.get(f))
            }
        };
        let Some(name) = field("name").and_then(Value::as_str) else {
            return true;
        };
        if !tools.get(name).is_some_and(|c| c.grounded) {
            return true;
        }
        let args: Value = field("arguments")
            .and_then(Value::as_str)
            .and_then(|a| serde_json::from_str(a).ok())
            .unwrap_or(Value::Null);
        let missing = selfheal_core::ungrounded_arguments(&args, evidence);
        if missing.is_empty() {
            return true;
        }
        problems.push(wire::Problem::arguments(format!(
            "The arguments of `{name}` must be copied from the task or an earlier tool \
             result, and these appear in neither: {}.",
            missing.join(", ")
        )));
        false
    });
    problems
}

/// The grounding check of a request's answer: the calls of tools the operator marked
/// [`ToolConfig::grounded`] whose arguments appear nowhere in the conversation the agent sent
/// are taken out of the answer before the agent runs them, and re-asked like any unusable call
/// (the core's [`selfheal_core::ungrounded_arguments`] is the rule; the ladder that
/// re-asks is the core's too). The evidence is the request's user and system texts and its tool
/// results; it is read only when the answer calls a grounded tool.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Grounding<'a> {
    /// `[tools]` of the gateway's config.
    pub tools: &'a BTreeMap<String, ToolConfig>,
    /// The request's messages.
    pub messages: &'a [crate::request::Message<'a>],
}

impl Grounding<'_> {
    /// Takes the ungrounded calls out of an assistant `message`; returns the problem of each.
    pub(crate) fn check(&self, message: &mut Value) -> Vec<wire::Problem> {
        wire::take_calls(message, |calls| {
            let names = calls
                .iter()
                .filter_map(|c| c.pointer("/function/name").and_then(Value::as_str));
            if !self.any_grounded(names) {
                return Vec::new();
            }
            take_ungrounded(self.tools, calls, &self.evidence())
        })
    }

    /// Whether any of `offered` is a grounded tool (then a check is worth its evidence).
    pub(crate) fn any_grounded<'n>(&self, mut offered: impl Iterator<Item = &'n str>) -> bool {
        offered.any(|n| self.tools.get(n).is_some_and(|c| c.grounded))
    }

    /// The user and system texts and the tool results of the request, as values (a result that
    /// is JSON as its value, any other text as a string): owned, for a check made once the
    /// request is gone (a stream's held calls, [`take_ungrounded`]).
    pub(crate) fn evidence(&self) -> Vec<Value> {
        let mut out = Vec::new();
        for m in self.messages {
            let role = m.role.as_ref().map(|r| r.as_str());
            let Some(content) = m.content else { continue };
            let Ok(content) = serde_json::from_str::<Value>(content.get()) else {
                continue;
            };
            let texts: Vec<String> = match content {
                Value::String(t) => vec![t],
                // Content parts: their texts.
                Value::Array(parts) => parts
                    .iter()
                    .filter_map(|p| p.get("text").and_then(Value::as_str).map(str::to_owned))
                    .collect(),
                Value::Null | Value::Bool(_) | Value::Number(_) | Value::Object(_) => Vec::new(),
            };
            match role {
                // A result is read as the model reads it: the value, or the gateway's repair of
                // bytes that did not parse (which replaces the result in what it forwards).
                Some("tool") => {
                    for t in texts {
                        match read_result(&t) {
                            Read::Value(v) | Read::Repairable { value: v, .. } => out.push(v),
                            Read::Failed(_) => out.push(Value::String(t)),
                        }
                    }
                }
                Some("user" | "system" | "developer") => {
                    out.extend(texts.into_iter().map(Value::String));
                }
                Some(_) | None => {}
            }
        }
        out
    }
}

/// The grounding evidence of a `/v1/responses` request, when it offers a grounded tool (else
/// `None`: nothing to check): its `instructions`, the texts of its `input` (a string, or the
/// user, system and developer messages' texts) and its `function_call_output` items read as
/// [`Grounding::evidence`] reads chat tool results.
pub(crate) fn responses_evidence(
    tools: &BTreeMap<String, ToolConfig>,
    req: &serde_json::Map<String, Value>,
    offered: &ToolIndex,
) -> Option<Vec<Value>> {
    if !offered
        .keys()
        .any(|n| tools.get(n.as_str()).is_some_and(|c| c.grounded))
    {
        return None;
    }
    Some(responses_texts(req))
}

/// The evidence a `/v1/responses` request holds (see [`responses_evidence`]), whatever it
/// offers: what a final answer's numbers are grounded in.
pub(crate) fn responses_texts(req: &serde_json::Map<String, Value>) -> Vec<Value> {
    let mut out = Vec::new();
    if let Some(i) = req.get("instructions").and_then(Value::as_str) {
        out.push(Value::String(i.to_owned()));
    }
    match req.get("input") {
        Some(Value::String(t)) => out.push(Value::String(t.clone())),
        Some(Value::Array(items)) => {
            for item in items {
                if wire::item_type(item) == Some("function_call_output") {
                    let Some(t) = item.get("output").and_then(Value::as_str) else {
                        continue;
                    };
                    match read_result(t) {
                        Read::Value(v) | Read::Repairable { value: v, .. } => out.push(v),
                        Read::Failed(_) => out.push(Value::String(t.to_owned())),
                    }
                    continue;
                }
                let role = item.get("role").and_then(Value::as_str);
                if !matches!(role, Some("user" | "system" | "developer")) {
                    continue;
                }
                match item.get("content") {
                    Some(Value::String(t)) => out.push(Value::String(t.clone())),
                    Some(Value::Array(parts)) => out.extend(
                        parts
                            .iter()
                            .filter_map(|p| p.get("text").and_then(Value::as_str))
                            .map(|t| Value::String(t.to_owned())),
                    ),
                    _ => {}
                }
            }
        }
        _ => {}
    }
    out
}

/// How a tool result reads on the wire: what failed, or the value.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Read {
    /// The tool raised (the client sent back its error text), or returned an error body,
    /// JSON it could not finish, or an empty answer: the signal, if the monitor's hard/soft
    /// reading is not enough.
    Failed(Option<Signal>),
    /// The tool meant to answer JSON and the bytes do not parse, but `selfheal-repair` reads a
    /// value out of them (a code fence, prose around it, quotes, trailing commas).
    Repairable {
        /// Why the bytes did not parse.
        signal: Signal,
        /// The value repair read.
        value: Value,
    },
    /// A value.
    Value(Value),
}

/// Reads one tool result's text (the one place the gateway parses a tool's answer):
///
/// - an error text ([`wire::is_hard_failure_text`]) is a failure; a leading HTTP status
///   (`Error: 503 Service Unavailable`) becomes that status, a timeout a timeout, anything else
///   an exception with the text;
/// - JSON with a string `error` field is the tool's error (a soft failure);
/// - text that does not parse but from which `selfheal-repair` reads an object or an array is
///   malformed output that can be repaired — unless it was cut off (brackets or a string left
///   open: closing it would invent data) or what it reads has an empty field;
/// - text that opens like JSON (`{`, `[`) and cannot be read is malformed (cut, when brackets
///   or a string are left open);
/// - other JSON or text is a value (the monitor still judges empty and null answers soft).
pub(crate) fn read_result(text: &str) -> Read {
    if wire::is_hard_failure_text(text) {
        return Read::Failed(Some(error_signal(text)));
    }
    match serde_json::from_str::<Value>(text) {
        Ok(v) => {
            // An error body is a soft failure the monitor reads itself, as the MCP proxy, the
            // runtime and the core read one: one observation, one signal on every front-end
            // (the conformance table runs them all).
            if v.get("error").is_some_and(Value::is_string) {
                return Read::Failed(None);
            }
            if Monitor::is_soft_failure(&v) {
                return Read::Failed(None);
            }
            Read::Value(v)
        }
        Err(e) => {
            let t = text.trim();
            let json_like = t.starts_with('{') || t.starts_with('[');
            if json_like && is_cut(t) {
                return Read::Failed(Some(Signal::TruncatedOutput));
            }
            let signal = Signal::MalformedOutput {
                detail: e.to_string(),
            };
            // A repair is refused when it would invent data (the JSON inside was cut) or when
            // what it reads has holes (a null or empty field): fetching again is the better bet.
            match selfheal_repair::repair(t) {
                Ok(r) if r.value.is_object() || r.value.is_array() => {
                    if is_cut_inside(t) || has_hole(&r.value) {
                        Read::Failed(Some(signal))
                    } else {
                        Read::Repairable {
                            signal,
                            value: r.value,
                        }
                    }
                }
                Ok(_) | Err(_) if json_like => Read::Failed(Some(signal)),
                Ok(_) | Err(_) if t.is_empty() => Read::Failed(None),
                Ok(_) | Err(_) => Read::Value(Value::String(text.to_owned())),
            }
        }
    }
}

/// Whether a value is empty or has an empty field at the top (null, an empty array).
fn has_hole(v: &Value) -> bool {
    match v {
        Value::Object(o) => o.is_empty() || o.values().any(is_empty),
        other => is_empty(other),
    }
}

fn is_empty(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::Array(x) => x.is_empty(),
        Value::Object(_) | Value::Bool(_) | Value::Number(_) | Value::String(_) => false,
    }
}

/// Whether the JSON inside prose or a fence was cut off: from its first bracket on.
pub(crate) fn is_cut_inside(text: &str) -> bool {
    text.find(['{', '['])
        .and_then(|i| text.get(i..))
        .is_some_and(|inner| {
            let end = inner.rfind("```").unwrap_or(inner.len());
            inner.get(..end).is_some_and(is_cut)
        })
}

/// The signal of an error text: a leading HTTP status, a timeout, or the text itself.
fn error_signal(text: &str) -> Signal {
    let t = text.trim();
    let body = ["Error:", "error:", "Tool error:", "Exception:"]
        .iter()
        .find_map(|p| t.strip_prefix(p))
        .unwrap_or(t)
        .trim();
    let status: Option<u16> = body
        .get(..3)
        .filter(|d| d.bytes().all(|b| b.is_ascii_digit()))
        .and_then(|d| d.parse().ok())
        .filter(|s| (400..600).contains(s))
        .filter(|_| body.as_bytes().get(3).is_none_or(|b| !b.is_ascii_digit()));
    let lower = body.to_ascii_lowercase();
    match status {
        Some(status) => Signal::HttpStatus {
            status,
            retry_after_ms: retry_after_in(&lower),
            message: body.to_owned(),
        },
        None if lower.contains("timed out") || lower.starts_with("timeout") => Signal::Timeout,
        // The tool said it failed, with a text: read as the MCP proxy reads `isError` and the
        // runtime a tool's error (one observation, one signal on every front-end).
        None => Signal::ToolError {
            message: body.to_owned(),
        },
    }
}

/// The wait an error text asks for, in milliseconds, as a tool wrapper that keeps the HTTP
/// header writes it: `Retry-After: 5` (seconds, as the header counts), `retry after 2 s`,
/// `retry after 1500 ms`, `retry-after: 0.5 seconds`. `lower`: the text in lowercase. An
/// HTTP date, or no number, is no wait.
pub(crate) fn retry_after_in(lower: &str) -> Option<u64> {
    let at = ["retry-after", "retry after", "retry_after"]
        .iter()
        .filter_map(|k| lower.find(k).map(|i| i + k.len()))
        .min()?;
    let rest = lower.get(at..)?;
    let rest = rest.trim_start_matches(|c: char| c == ':' || c == '=' || c.is_whitespace());
    let rest = rest.strip_prefix("in ").unwrap_or(rest);
    let len = rest
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(rest.len());
    let number: f64 = rest.get(..len)?.parse().ok()?;
    if !number.is_finite() || number < 0.0 {
        return None;
    }
    let unit = rest.get(len..)?.trim_start();
    let ms = if unit.starts_with("ms") || unit.starts_with("milli") {
        number
    } else {
        number * 1000.0
    };
    // Saturates at u64::MAX for absurd values (the core caps what it honours).
    Some(ms.ceil() as u64)
}

/// Whether JSON text was cut off: more brackets opened than closed outside strings, or a
/// string left open.
fn is_cut(text: &str) -> bool {
    let (mut depth, mut in_str, mut esc) = (0i64, false, false);
    for c in text.chars() {
        if in_str {
            match (esc, c) {
                (true, _) => esc = false,
                (false, '\\') => esc = true,
                (false, '"') => in_str = false,
                (false, _) => {}
            }
            continue;
        }
        match c {
            '"' => in_str = true,
            '{' | '[' => depth += 1,
            '}' | ']' => depth -= 1,
            _ => {}
        }
    }
    depth > 0 || in_str
}

/// The read again before answering, if one is awaited: judged by `text` when this result is
/// the read asked for (`true`: it was, and is no step's), else judged not made.
fn observe_reread(
    st: &mut RunState,
    ctx: &Ctx<'_>,
    (tool, args): (&str, &Value),
    text: &str,
    now_ms: u64,
) -> bool {
    let Some(r) = st.wire.reread.take() else {
        return false;
    };
    let made = r.tool == tool && canonical_hash(&r.args) == canonical_hash(args);
    // The second read is read as it came, as a cross-check's: one that does not parse or
    // did not answer cannot tell, and leaves the value as it was.
    let judgement = if !made {
        Judgement::Uncertain {
            reason: format!("the read again of `{}` was not made", r.tool),
        }
    } else {
        match read_result(text) {
            Read::Value(again) => match second_reading(
                ctx,
                (&r.tool, &r.value),
                (&r.tool, &again),
                ctx.tools
                    .get(&r.tool)
                    .map(|c| c.tolerance)
                    .unwrap_or_default(),
            ) {
                SecondReading::Judged(j) => j,
                SecondReading::Hole(_) => Judgement::Reject {
                    reason: format!(
                        "read again, `{}` fills a field its first answer left empty",
                        r.tool
                    ),
                },
            },
            Read::Repairable { .. } => Judgement::Uncertain {
                reason: format!("`{}` sent an unreadable body", r.tool),
            },
            Read::Failed(_) => Judgement::Uncertain {
                reason: format!("`{}` did not answer: {}", r.tool, clip(text)),
            },
        }
    };
    reread_verdict(st, ctx, &r, judgement, now_ms);
    if made {
        return true;
    }
    st.wire.reread = None;
    st.wire.rereads.clear();
    false
}

/// The value held for its cross-check, if one is: settled by `text` when this result is the
/// cross-check call asked for (`true`: it was, and is a verifier's call, not a step's), else
/// settled as uncertain.
fn observe_cross_check(
    st: &mut RunState,
    ctx: &Ctx<'_>,
    (tool, args): (&str, &Value),
    text: &str,
    now_ms: u64,
) -> bool {
    let Some(p) = st.wire.pending.take() else {
        return false;
    };
    if p.against == tool && canonical_hash(&p.args) == canonical_hash(args) {
        // The second source's answer is read as it came: one that does not parse is no
        // evidence (the verifier does not repair what it checks against).
        let verdict = match read_result(text) {
            Read::Value(other) => judge_other(ctx, &p, &other),
            Read::Repairable { .. } => Verdict::Judged(Judgement::Uncertain {
                reason: format!("`{}` sent an unreadable body", p.against),
            }),
            Read::Failed(_) => Verdict::Judged(Judgement::Uncertain {
                reason: format!("`{}` did not answer: {}", p.against, clip(text)),
            }),
        };
        settle(st, ctx, *p, verdict, now_ms);
        return true;
    }
    let judgement = Judgement::Uncertain {
        reason: format!("the cross-check call of `{}` was not made", p.against),
    };
    settle(st, ctx, *p, Verdict::Judged(judgement), now_ms);
    false
}

/// The other source's answer `other` judged against the held value `p`, by the core's one
/// rule ([`second_reading`]).
fn judge_other(ctx: &Ctx<'_>, p: &Pending, other: &Value) -> Verdict {
    match second_reading(ctx, (&p.tool, &p.value), (&p.against, other), p.tolerance) {
        SecondReading::Judged(j) => Verdict::Judged(j),
        SecondReading::Hole(signal) => Verdict::Hole(signal),
    }
}

/// `value` (`tool`'s) judged by `other` (`against`'s answer to the same arguments), within
/// `tolerance`, by the core's rule for a second reading ([`judge_second_reading`], as
/// in-process): the whole answers without their `as_of` stamps, or — when `other` lacks a field
/// the operator declared (`tool`'s, else `against`'s) — the declared fields, a renamed one read
/// through the drift.
fn second_reading(
    ctx: &Ctx<'_>,
    (tool, value): (&str, &Value),
    (against, other): (&str, &Value),
    tolerance: selfheal_core::Tolerance,
) -> SecondReading {
    let declared = [tool, against]
        .into_iter()
        .filter_map(|t| ctx.tools.get(t))
        .find(|c| !c.output.is_empty());
    let name = if tool == against {
        format!("a second read of `{against}`")
    } else {
        format!("`{against}`")
    };
    judge_second_reading(
        &ctx.comparable(tool, value),
        &ctx.comparable(against, other),
        &SecondSource {
            name: &name,
            fields: declared.map_or(&[][..], |c| &c.output[..]),
            stamp: declared.and_then(|c| c.as_of.as_deref()),
            tolerance,
        },
    )
}

/// What one tool result was to the run, as [`observe`] found it. Spelled (`ok`, `hard`, ...)
/// only where it is written out: the trace's `tool_result` event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Outcome {
    /// A usable value.
    Ok,
    /// A failure: an error the tool reported, or a result repaired in place.
    Hard,
    /// A soft failure: a value the run cannot use (an error body, an empty or breached answer).
    Soft,
    /// The cross-check call the gateway asked for (a verifier's call, not a step's), or the
    /// read again before answering.
    Check,
    /// A value waiting for its cross-check.
    Held,
}

impl Outcome {
    /// Whether the result is a failure (the abort rule's condition).
    pub(crate) fn failed(self) -> bool {
        matches!(self, Outcome::Hard | Outcome::Soft)
    }
}

/// Observes one new tool result of the run: its [`Outcome`].
pub(crate) fn observe(
    st: &mut RunState,
    ctx: &Ctx<'_>,
    call: (&str, &str, &Value),
    text: &str,
    now_ms: u64,
) -> Outcome {
    let (id, tool, args) = call;
    if observe_reread(st, ctx, (tool, args), text, now_ms)
        || observe_cross_check(st, ctx, (tool, args), text, now_ms)
    {
        return Outcome::Check;
    }
    let required: Vec<String> = ctx
        .offered
        .get(tool)
        .map(|t| t.required.clone())
        .unwrap_or_default();
    let step = st.wire.step_of(tool, ctx);
    match read_result(text) {
        Read::Value(value) => {
            if let Some((signal, repair)) = ctx.breach(tool, &value) {
                breached(
                    st,
                    ctx,
                    (id, tool, args),
                    value,
                    (signal, repair),
                    required,
                    now_ms,
                );
                return Outcome::Soft;
            }
            st.successes += 1;
            if let Some((against, tolerance)) = ctx.check_against(tool)
                && ctx.offered.contains_key(&against)
                && !trusted(st, ctx, step, tool)
            {
                st.wire.pending = Some(Box::new(Pending {
                    step,
                    tool: tool.to_owned(),
                    args: args.clone(),
                    value,
                    required,
                    against,
                    tolerance,
                    repaired: false,
                }));
                return Outcome::Held;
            }
            let call = ToolCall::returned(tool, args, &value).with_required(&required);
            let d = finished(st, ctx, step, call, None, None, now_ms);
            if matches!(d, StepAction::Proceed { .. }) {
                st.wire.keep(ctx, step, (tool, args), &value);
            }
            carry(st, ctx, step, tool, d);
            Outcome::Ok
        }
        Read::Repairable { signal, value } => {
            st.failures += 1;
            let parsed = Value::String(text.to_owned());
            let call = ToolCall::returned(tool, args, &parsed).with_required(&required);
            let d = finished(
                st,
                ctx,
                step,
                call,
                Some(signal),
                Some(RepairTarget::Output),
                now_ms,
            );
            match d {
                StepAction::Recover {
                    action:
                        RecoveryAction::Repair {
                            target: RepairTarget::Output,
                        },
                    ..
                } => {
                    st.wire.next.actions.push(ActionKind::Repair);
                    st.wire.replace(id, &value);
                    repaired(st, ctx, step, tool, args, value, required, now_ms);
                }
                d => carry(st, ctx, step, tool, d),
            }
            Outcome::Hard
        }
        Read::Failed(signal) => {
            st.failures += 1;
            // A call that failed with a required argument left empty failed for want of an
            // input the agent never had: a step of its plan is missing (the in-process client
            // sees the same before calling). The tool's error text says no more than that.
            let empty: Vec<String> = required
                .iter()
                .filter(|r| {
                    args.get(*r)
                        .is_none_or(|v| st.run.monitor().is_placeholder(v))
                })
                .cloned()
                .collect();
            let signal = if empty.is_empty() {
                signal
            } else {
                Some(Signal::MissingStep {
                    detail: format!("required arguments left empty: {empty:?}"),
                })
            };
            // The monitor records what it would have seen: an error text as a failed call,
            // anything the tool returned as returned (it judges error bodies and empty answers
            // soft itself); the signal says why it failed.
            let hard = wire::is_hard_failure_text(text);
            let parsed: Value =
                serde_json::from_str(text).unwrap_or_else(|_| Value::String(text.to_owned()));
            let call = if hard {
                ToolCall::failed(tool, args, text)
            } else {
                ToolCall::returned(tool, args, &parsed)
            }
            .with_required(&required);
            // The model can always rewrite a call that raised, given its error (as the MCP
            // proxy and the runtime offer).
            let repair = hard.then_some(RepairTarget::Arguments);
            let asked = match &signal {
                Some(Signal::HttpStatus { retry_after_ms, .. }) => *retry_after_ms,
                _ => None,
            };
            let d = finished(st, ctx, step, call, signal, repair, now_ms);
            if let Some(ms) = asked.filter(|ms| *ms > ctx.max_wait_ms)
                && !matches!(
                    d,
                    StepAction::Recover {
                        action: RecoveryAction::Retry { .. },
                        ..
                    }
                )
            {
                // The core routed around a retry the gateway could not wait for: said, to the
                // model and in the answer's headers, never shortened.
                st.wire
                    .next
                    .guidance
                    .push(wait_text(tool, ms, ctx.max_wait_ms));
                st.wire.next.too_long = Some((tool.to_owned(), ms));
            }
            carry(st, ctx, step, tool, d);
            if hard { Outcome::Hard } else { Outcome::Soft }
        }
    }
}

/// Whether `tool`'s answers at `step` are taken without a cross-check: it is the substitute the
/// controller moved to because the primary's data was stale.
fn trusted(st: &RunState, ctx: &Ctx<'_>, step: u32, tool: &str) -> bool {
    st.wire.trusted.contains(&step) && ctx.primary_of(tool).is_some()
}

/// Observes an answer that breaks its tool's declared contract (a drifted or empty field, a
/// stale `as_of`) as that failure. An output repair is carried out here: the renamed field
/// mapped back ([`contract::map_renamed`]) replaces the result the model reads and is used like
/// any repaired answer; when it cannot be mapped, the tool is called again (as in-process: a
/// refused repair fetches the body again).
fn breached(
    st: &mut RunState,
    ctx: &Ctx<'_>,
    call: (&str, &str, &Value),
    value: Value,
    why: (Signal, Option<RepairTarget>),
    required: Vec<String>,
    now_ms: u64,
) {
    let (id, tool, args) = call;
    let (signal, repair) = why;
    st.failures += 1;
    let step = st.wire.step_of(tool, ctx);
    let c = ToolCall::returned(tool, args, &value).with_required(&required);
    let d = finished(st, ctx, step, c, Some(signal), repair, now_ms);
    match d {
        StepAction::Recover {
            class,
            action:
                RecoveryAction::Repair {
                    target: RepairTarget::Output,
                },
            ..
        } => {
            st.wire.next.actions.push(ActionKind::Repair);
            let fields = ctx
                .tools
                .get(tool)
                .map(|c| c.output.as_slice())
                .unwrap_or_default();
            match contract::map_renamed(&value, fields)
                .ok()
                .filter(|v| ctx.breach(tool, v).is_none())
            {
                Some(v) => {
                    st.wire.replace(id, &v);
                    repaired(st, ctx, step, tool, args, v, required, now_ms);
                }
                None => st.wire.next.guidance.push(retry_text(tool, class)),
            }
        }
        d => carry(st, ctx, step, tool, d),
    }
}

/// Carries out an output repair: the repaired value is an output like any other, cross-checked
/// before it is used when its tool is; without a second source the repair's own reading is the
/// verdict (as in-process).
#[allow(clippy::too_many_arguments)]
fn repaired(
    st: &mut RunState,
    ctx: &Ctx<'_>,
    step: u32,
    tool: &str,
    args: &Value,
    value: Value,
    required: Vec<String>,
    now_ms: u64,
) {
    let p = Pending {
        step,
        tool: tool.to_owned(),
        args: args.clone(),
        value,
        required,
        against: String::new(),
        tolerance: selfheal_core::Tolerance::default(),
        repaired: true,
    };
    match ctx.check_against(tool) {
        Some((against, tolerance))
            if ctx.offered.contains_key(&against) && !trusted(st, ctx, step, tool) =>
        {
            st.wire.pending = Some(Box::new(Pending {
                against,
                tolerance,
                ..p
            }));
        }
        Some(_) | None => {
            let d = verified(st, ctx, &p, Judgement::Accept, now_ms);
            if matches!(d, StepAction::Proceed { .. }) {
                st.wire.keep(ctx, step, (tool, args), &p.value);
            }
            carry(st, ctx, step, tool, d);
        }
    }
}

fn clip(text: &str) -> String {
    text.chars().take(120).collect()
}

/// The options of a failure of `tool` at `step`, as far as the wire allows: `repair` when the
/// gateway could read a value out of bytes that did not parse (or map a drifted field back),
/// refresh when the tool declares its cache-bypass argument ([`ToolConfig::refresh`]), the
/// configured substitute if the request offers it, the fallback model once per step.
fn options(
    st: &RunState,
    ctx: &Ctx<'_>,
    step: u32,
    tool: &str,
    repair: Option<RepairTarget>,
) -> Options {
    Options {
        repair,
        substitute: ctx
            .substitute_of(tool)
            .filter(|s| ctx.offered.contains_key(*s))
            .map(str::to_owned),
        refreshable: ctx.refresh_of(tool).is_some(),
        can_replan: true,
        fallback_model: ctx
            .fallback
            .filter(|_| !st.wire.escalated.contains(&step))
            .map(str::to_owned),
        human_available: false,
        retry_safe: true,
        partial_result: st.successes > 0,
        // The gateway holds its client's request while it waits: a retry whose wait is longer
        // than `[limits] max_wait_ms` is the core's to route around, never shortened.
        max_delay_ms: Some(ctx.max_wait_ms),
    }
}

/// Hands the run one observation and returns its decision.
fn decide_on(
    st: &mut RunState,
    obs: Observation<'_>,
    now_ms: u64,
    rng: &mut SplitMix64,
) -> StepAction {
    let mut breakers = Breakers::none();
    let mut env = selfheal_core::Env {
        now_ms,
        rng,
        breakers: &mut breakers,
    };
    st.run.decide_step(Input::Observed(obs), &mut env)
}

fn finished(
    st: &mut RunState,
    ctx: &Ctx<'_>,
    step: u32,
    call: ToolCall<'_>,
    signal: Option<Signal>,
    repair: Option<RepairTarget>,
    now_ms: u64,
) -> StepAction {
    let options = options(st, ctx, step, call.tool, repair);
    let mut rng = SplitMix64::new(ctx.seed ^ u64::from(step));
    decide_on(
        st,
        Observation::ToolFinished {
            step: Some(step),
            call,
            signal,
            options,
            usage: Amounts::default(),
        },
        now_ms,
        &mut rng,
    )
}

/// Feeds a held value with its cross-check's verdict: a disagreement is the call's
/// contradiction signal; otherwise the call, then the verdict (so a value a recovery put in
/// doubt that the verdict cannot confirm degrades the run).
fn settle(st: &mut RunState, ctx: &Ctx<'_>, p: Pending, verdict: Verdict, now_ms: u64) {
    let judgement = match verdict {
        Verdict::Judged(j) => j,
        // The other source fills a field this answer left empty: an empty output, not a
        // disagreement.
        Verdict::Hole(signal) if !p.repaired => {
            let call = ToolCall::returned(&p.tool, &p.args, &p.value).with_required(&p.required);
            let d = finished(st, ctx, p.step, call, Some(signal), None, now_ms);
            carry(st, ctx, p.step, &p.tool, d);
            return;
        }
        Verdict::Hole(signal) => Judgement::Reject {
            reason: format!("the repaired answer is incomplete ({})", signal.name()),
        },
    };
    if p.repaired {
        // A repaired answer was observed as its failure already; only the verdict is new.
        let d = verified(st, ctx, &p, judgement, now_ms);
        if matches!(d, StepAction::Proceed { .. }) {
            st.wire.keep(ctx, p.step, (&p.tool, &p.args), &p.value);
        }
        carry(st, ctx, p.step, &p.tool, d);
        return;
    }
    let signal = match &judgement {
        Judgement::Reject { reason } => Some(Signal::Contradiction {
            detail: reason.clone(),
        }),
        Judgement::Accept | Judgement::Uncertain { .. } => None,
    };
    let call = ToolCall {
        tool: &p.tool,
        args: &p.args,
        outcome: CallOutcome::Returned(&p.value),
        required: &p.required,
        repaired: false,
    };
    let d = finished(st, ctx, p.step, call, signal.clone(), None, now_ms);
    let d = match (d, signal) {
        (StepAction::Proceed { .. }, None) => verified(st, ctx, &p, judgement, now_ms),
        (d, _) => d,
    };
    if matches!(d, StepAction::Proceed { .. }) {
        st.wire.keep(ctx, p.step, (&p.tool, &p.args), &p.value);
    }
    carry(st, ctx, p.step, &p.tool, d);
}

/// Observes a cross-check's verdict on `p`.
fn verified(
    st: &mut RunState,
    ctx: &Ctx<'_>,
    p: &Pending,
    judgement: Judgement,
    now_ms: u64,
) -> StepAction {
    let options = options(st, ctx, p.step, &p.tool, None);
    let mut rng = SplitMix64::new(ctx.seed ^ u64::from(p.step));
    decide_on(
        st,
        Observation::Verified {
            step: Some(p.step),
            verifier: "cross_check",
            judgement,
            options,
        },
        now_ms,
        &mut rng,
    )
}

/// Turns a directive into what the next request carries out.
fn carry(st: &mut RunState, ctx: &Ctx<'_>, step: u32, tool: &str, d: StepAction) {
    let next = &mut st.wire.next;
    match d {
        StepAction::Proceed { .. } => {}
        StepAction::Recover { class, action, .. } => {
            next.actions.push(action.kind());
            match action {
                // A retry of the model's own mistake is a new call, as in-process; of a tool's
                // failure, the same call again.
                RecoveryAction::Retry { .. } if class.is_model_side() => {
                    next.guidance.push(rewrite_text(tool, class));
                }
                RecoveryAction::Repair { .. } => next.guidance.push(rewrite_text(tool, class)),
                RecoveryAction::Refresh => match ctx.refresh_of(tool) {
                    Some(arg) => next.guidance.push(refresh_text(tool, class, arg)),
                    None => {
                        next.guidance.push(retry_text(tool, class));
                        next.again.push(tool.to_owned());
                    }
                },
                RecoveryAction::Retry { delay_ms, .. } => {
                    next.guidance.push(retry_text(tool, class));
                    next.again.push(tool.to_owned());
                    // The client calls the tool again only once the model has answered: the
                    // next model call is held until the core's delay has passed.
                    next.wait_ms = next.wait_ms.max(delay_ms);
                }
                RecoveryAction::Substitute { alternative } => {
                    // The primary's data is known to be old: its answers say nothing about
                    // the substitute's (as in-process).
                    if class == FailureClass::StaleContext {
                        st.wire.trusted.insert(step);
                    }
                    next.guidance
                        .push(substitute_text(tool, class, &alternative));
                }
                RecoveryAction::Replan => next.guidance.push(replan_text(tool, class)),
                RecoveryAction::Escalate {
                    target: EscalationTarget::FallbackModel { .. },
                } => {
                    next.escalate = true;
                    st.wire.escalated.insert(step);
                    // A plan that is the problem is the fallback model's to rethink.
                    if class == FailureClass::PlanningFailure {
                        next.guidance.push(replan_text(tool, class));
                    }
                }
                RecoveryAction::Escalate {
                    target: EscalationTarget::Human,
                }
                | RecoveryAction::Degrade
                | RecoveryAction::Terminate => {
                    // Not offered on the wire (no human), and the controller ends runs with
                    // its own directives: nothing to carry out.
                }
            }
        }
        StepAction::Stop {
            status: RunStatus::Partial,
            reason,
        } => next.stop = Some(Stop::Degrade(reason)),
        StepAction::Stop { reason, .. } => next.stop = Some(Stop::Abort(reason)),
    }
}

/// The retry's guidance: the same call, except where the class says the same arguments would
/// find the same nothing.
pub fn retry_text(tool: &str, class: FailureClass) -> String {
    match class {
        FailureClass::EmptyOutput => format!(
            "`{tool}` failed ({class}): call it again; if it found nothing, with other \
             arguments (a different query)."
        ),
        _ => format!("`{tool}` failed ({class}): call it again with the same arguments."),
    }
}

/// Said when a tool asked for a wait (its `Retry-After`) longer than the gateway holds a
/// request, `max_ms`: the tool is not called again before then.
pub fn wait_text(tool: &str, asked_ms: u64, max_ms: u64) -> String {
    format!(
        "`{tool}` asked not to be called again for {} s, longer than this gateway waits ({} s): \
         do not call it again now.",
        asked_ms.div_ceil(1000),
        max_ms.div_ceil(1000)
    )
}

/// The refresh's guidance: the same call with the tool's cache-bypass argument set.
pub fn refresh_text(tool: &str, class: FailureClass, arg: &str) -> String {
    format!(
        "`{tool}` failed ({class}): call it again with the same arguments and `{arg}` set to \
         true, to bypass its cache."
    )
}

/// The guidance of a repair or a model-side retry: the model writes the call again — with
/// other arguments, or, when the tool does not do this, another tool. Never "the same
/// arguments": the same call would fail the same way.
pub(crate) fn rewrite_text(tool: &str, class: FailureClass) -> String {
    match class {
        FailureClass::WrongTool => format!(
            "`{tool}` failed ({class}): it does not do this; call another tool on offer that \
             does, or answer without it."
        ),
        _ => format!(
            "`{tool}` failed ({class}): change its arguments as the error says and write the \
             call again."
        ),
    }
}

/// The substitute's guidance.
pub fn substitute_text(tool: &str, class: FailureClass, alternative: &str) -> String {
    format!(
        "The tool `{tool}` failed ({class}): call `{alternative}` instead, with the same \
         arguments."
    )
}

/// The replan's guidance.
pub fn replan_text(tool: &str, class: FailureClass) -> String {
    format!("`{tool}` failed ({class}): rethink your plan from the results you have.")
}

#[cfg(test)]
mod tests {
    use super::*;
    use selfheal_core::{BudgetLimits, MonitorConfig, Policy};
    use serde_json::json;

    fn offered(names: &[&str]) -> ToolIndex {
        names
            .iter()
            .map(|n| {
                (
                    (*n).to_owned(),
                    crate::heal::ToolSpec {
                        parameters: json!({}),
                        schema_key: "{}".into(),
                        required: vec![],
                    },
                )
            })
            .collect()
    }

    fn tools(cross_check: bool) -> BTreeMap<String, ToolConfig> {
        BTreeMap::from([(
            "weather".to_owned(),
            ToolConfig {
                grounded: false,
                substitute: Some("weather_backup".into()),
                cross_check,
                ..ToolConfig::default()
            },
        )])
    }

    /// The wire's context for `cfg` and `idx`, at seed 1 and wall clock 0.
    fn ctx<'a>(
        cfg: &'a BTreeMap<String, ToolConfig>,
        idx: &'a ToolIndex,
        fallback: Option<&'a str>,
    ) -> Ctx<'a> {
        Ctx {
            tools: cfg,
            offered: idx,
            fallback,
            seed: 1,
            wall_ms: 0,
            max_wait_ms: crate::config::DEFAULT_MAX_WAIT_MS,
        }
    }

    /// A run whose policy's risk (0.001) is below what a source with no record is trusted for.
    fn cautious_run() -> RunState {
        RunState::with_policy(
            MonitorConfig::default(),
            BudgetLimits::defaults(),
            Policy {
                risk: 0.001,
                ..Policy::default()
            },
        )
    }

    fn run() -> RunState {
        RunState::with_policy(
            MonitorConfig::default(),
            BudgetLimits::defaults(),
            Policy::default(),
        )
    }

    #[test]
    fn error_texts_become_typed_signals() {
        assert!(matches!(
            read_result("Error: 503 Service Unavailable"),
            Read::Failed(Some(Signal::HttpStatus { status: 503, .. }))
        ));
        assert_eq!(
            read_result("Error: `weather` timed out after 8000 ms"),
            Read::Failed(Some(Signal::Timeout))
        );
        assert_eq!(
            read_result(r#"{"temp": 2"#),
            Read::Failed(Some(Signal::TruncatedOutput))
        );
        // An error body is a soft failure, read as every front-end reads one (the monitor's).
        assert_eq!(
            read_result(r#"{"error": "quota exceeded"}"#),
            Read::Failed(None)
        );
        assert_eq!(read_result("null"), Read::Failed(None));
        assert!(matches!(
            read_result("```json\n{\"temp\": 21}\n```"),
            Read::Repairable { value, .. } if value == json!({"temp": 21})
        ));
        assert!(matches!(
            read_result("```json\n{\"temp\": null}\n```"),
            Read::Failed(Some(Signal::MalformedOutput { .. }))
        ));
        assert_eq!(
            read_result(r#"{"temp": 2}"#),
            Read::Value(json!({"temp": 2}))
        );
        assert_eq!(
            read_result("Paris is sunny"),
            Read::Value(json!("Paris is sunny"))
        );
    }

    /// A rate limit's `Retry-After`, as tool wrappers write it in the error text, reaches the
    /// core as the signal's wait; a date or no number is none.
    #[test]
    fn a_retry_after_in_an_error_text_is_read() {
        let wait = |text: &str| match read_result(text) {
            Read::Failed(Some(Signal::HttpStatus { retry_after_ms, .. })) => retry_after_ms,
            other => panic!("{other:?}"),
        };
        assert_eq!(
            wait("Error: 429 Too Many Requests (Retry-After: 5)"),
            Some(5_000)
        );
        assert_eq!(
            wait("Error: 429 Too Many Requests: retry after 2 s"),
            Some(2_000)
        );
        assert_eq!(wait("Error: 503 busy, retry after 1500 ms"), Some(1_500));
        assert_eq!(
            wait("Error: 429 slow down; retry-after: 0.5 seconds"),
            Some(500)
        );
        assert_eq!(
            wait("Error: 429 Too Many Requests (Retry-After: Wed, 21 Oct 2015 07:28:00 GMT)"),
            None
        );
        assert_eq!(wait("Error: 429 Too Many Requests"), None);
    }

    const DOWN: &str = "Error: 503 Service Unavailable";

    /// The class ladder, not a fixed text, says what a failing tool gets: the default
    /// `tool_timeout` ladder (a 503) retries twice, then names the configured substitute.
    #[test]
    fn the_ladder_drives_the_guidance() {
        let cfg = tools(false);
        let idx = offered(&["weather", "weather_backup"]);
        let ctx = ctx(&cfg, &idx, None);
        let mut st = run();
        let a = json!({"city": "Paris"});
        for t in 0..2 {
            assert_eq!(
                observe(&mut st, &ctx, ("c", "weather", &a), DOWN, t),
                Outcome::Hard
            );
            let next = st.wire.take_next();
            assert_eq!(next.actions, vec![ActionKind::Retry], "{next:?}");
            assert!(next.guidance[0].contains("call it again"), "{next:?}");
        }
        observe(&mut st, &ctx, ("c", "weather", &a), DOWN, 2);
        let third = st.wire.take_next();
        assert_eq!(third.actions, vec![ActionKind::Substitute], "{third:?}");
        assert!(third.guidance[0].contains("`weather_backup`"));
        assert_eq!(st.ledger().spent().substitutions, 1);
        assert_eq!(st.ledger().spent().retries, 2);
    }

    /// A substitute's value that its primary cannot confirm is not returned as correct when
    /// the policy's risk is below what a source with no record is trusted for: the run degrades
    /// (the core's doubt rule), as in-process.
    #[test]
    fn an_unconfirmed_substitute_degrades_the_run() {
        let cfg = tools(true);
        let idx = offered(&["weather", "weather_backup"]);
        let ctx = ctx(&cfg, &idx, None);
        let mut st = cautious_run();
        let a = json!({"city": "Paris"});
        for t in 0..3 {
            observe(&mut st, &ctx, ("c", "weather", &a), DOWN, t);
        }
        assert_eq!(
            st.wire.take_next().actions,
            vec![ActionKind::Retry, ActionKind::Retry, ActionKind::Substitute]
        );
        let value = r#"{"temp": 21.0}"#;
        assert_eq!(
            observe(&mut st, &ctx, ("c", "weather_backup", &a), value, 2),
            Outcome::Held
        );
        let ask = st.wire.take_next();
        assert!(ask.guidance[0].starts_with("Cross-check"), "{ask:?}");
        assert_eq!(
            observe(&mut st, &ctx, ("c", "weather", &a), DOWN, 3),
            Outcome::Check
        );
        // The core reads the value again and checks it again while its policy allows (issue
        // 33); the primary stays down, so the run ends degraded with the value flagged.
        // `t`: the re-reads asked for so far.
        for t in 0..10u64 {
            let next = st.wire.take_next();
            if let Some(stop) = next.stop {
                assert!(
                    matches!(stop, Stop::Degrade(ref reason) if reason.contains("could not be verified")),
                    "{stop:?}"
                );
                assert!(t >= 1, "checked again before giving up");
                return;
            }
            assert_eq!(next.actions, vec![ActionKind::Retry], "{next:?}");
            assert_eq!(
                observe(&mut st, &ctx, ("c", "weather_backup", &a), value, 4 + 2 * t),
                Outcome::Held
            );
            let ask = st.wire.take_next();
            assert!(ask.guidance[0].starts_with("Cross-check"), "{ask:?}");
            assert_eq!(
                observe(&mut st, &ctx, ("c", "weather", &a), DOWN, 5 + 2 * t),
                Outcome::Check
            );
        }
        panic!("read again without end");
    }

    /// A value the other source confirms goes on; one it contradicts climbs the
    /// contradiction ladder.
    #[test]
    fn a_cross_check_confirms_or_contradicts() {
        let cfg = tools(true);
        let idx = offered(&["weather", "weather_backup"]);
        let ctx = ctx(&cfg, &idx, None);
        let a = json!({"city": "Paris"});
        let mut st = run();
        observe(&mut st, &ctx, ("c", "weather", &a), r#"{"temp": 21.0}"#, 0);
        observe(
            &mut st,
            &ctx,
            ("c", "weather_backup", &a),
            r#"{"temp": 21.1}"#,
            1,
        );
        let next = st.wire.take_next();
        let taken = Next {
            taken: vec![("weather".to_owned(), canonical_hash(&a))],
            ..Next::default()
        };
        assert_eq!(next, taken, "confirmed: nothing to do, the value taken");

        let mut st = run();
        observe(&mut st, &ctx, ("c", "weather", &a), r#"{"temp": 21.0}"#, 0);
        observe(
            &mut st,
            &ctx,
            ("c", "weather_backup", &a),
            r#"{"temp": 35.0}"#,
            1,
        );
        let next = st.wire.take_next();
        assert_eq!(next.actions, vec![ActionKind::Retry], "{next:?}");
        assert!(next.guidance[0].contains("contradictory_evidence"));
    }

    /// [`tools`] with a cross-check, `weather` declaring its `temp` field.
    fn temp_declared() -> BTreeMap<String, ToolConfig> {
        let mut cfg = tools(true);
        if let Some(w) = cfg.get_mut("weather") {
            w.output = vec!["temp".into()];
        }
        cfg
    }

    /// An answer with every declared field is compared whole, as in-process
    /// ([`judge_second_reading`]): two sources that agree on `temp` and on the undeclared
    /// `station` confirm the value; a differing `station` — a value the agent may read too —
    /// contradicts it, as a differing `temp` does.
    #[test]
    fn a_cross_check_compares_the_whole_answer_when_every_declared_field_is_there() {
        let cfg = temp_declared();
        let idx = offered(&["weather", "weather_backup"]);
        let ctx = ctx(&cfg, &idx, None);
        let a = json!({"city": "Paris"});
        let checked = |other: &str| {
            let mut st = run();
            let first = r#"{"temp": 21.0, "station": "LFPG"}"#;
            assert_eq!(
                observe(&mut st, &ctx, ("c", "weather", &a), first, 0),
                Outcome::Held
            );
            st.wire.take_next();
            observe(&mut st, &ctx, ("c", "weather_backup", &a), other, 1);
            st.wire.take_next()
        };
        let next = checked(r#"{"temp": 21.1, "station": "LFPG"}"#);
        assert_eq!(
            next.taken,
            vec![("weather".to_owned(), canonical_hash(&a))],
            "{next:?}"
        );
        assert!(next.actions.is_empty(), "{next:?}");
        for other in [
            r#"{"temp": 21.1, "station": "LFPB"}"#,
            r#"{"temp": 35.0, "station": "LFPG"}"#,
        ] {
            let next = checked(other);
            assert_eq!(next.actions, vec![ActionKind::Retry], "{next:?}");
            assert!(
                next.guidance[0].contains("contradictory_evidence"),
                "{next:?}"
            );
        }
    }

    /// A substitute's value checked against its primary whose declared field was renamed (its
    /// API drifted) is read through the drift, as in-process: a reading that agrees confirms
    /// the recovered value (before, the check was uncertain and the value held in doubt); one
    /// that disagrees is no evidence, and the value stays unconfirmed.
    #[test]
    fn a_drifted_primary_confirms_its_substitute_through_the_rename() {
        let cfg = temp_declared();
        let idx = offered(&["weather", "weather_backup"]);
        let ctx = ctx(&cfg, &idx, None);
        let a = json!({"city": "Paris"});
        let substituted = || {
            let mut st = cautious_run();
            for t in 0..3 {
                observe(&mut st, &ctx, ("c", "weather", &a), DOWN, t);
            }
            assert_eq!(
                st.wire.take_next().actions,
                vec![ActionKind::Retry, ActionKind::Retry, ActionKind::Substitute]
            );
            let held = observe(
                &mut st,
                &ctx,
                ("c", "weather_backup", &a),
                r#"{"temp": 21.0}"#,
                3,
            );
            assert_eq!(held, Outcome::Held);
            st.wire.take_next();
            st
        };

        let mut st = substituted();
        let drifted = r#"{"temperature": 21.1}"#;
        assert_eq!(
            observe(&mut st, &ctx, ("c", "weather", &a), drifted, 4),
            Outcome::Check
        );
        let next = st.wire.take_next();
        assert_eq!(
            next.taken,
            vec![("weather_backup".to_owned(), canonical_hash(&a))],
            "agreement read through the rename confirms: {next:?}"
        );
        assert!(next.stop.is_none() && next.actions.is_empty(), "{next:?}");
        assert_eq!(unsettled(&st), None);

        let mut st = substituted();
        let far = r#"{"temperature": 35.0}"#;
        observe(&mut st, &ctx, ("c", "weather", &a), far, 4);
        let next = st.wire.take_next();
        assert!(
            next.taken.is_empty() && !next.guidance.iter().any(|g| g.contains("contradictory")),
            "a disagreement through an inferred key is no evidence either way: {next:?}"
        );
    }

    /// An answer that comes while a value awaits its cross-check is not claimed: the held value
    /// was never judged (before, the run could end `complete` on it).
    #[test]
    fn an_answer_before_the_cross_check_is_unsettled() {
        let cfg = tools(true);
        let idx = offered(&["weather", "weather_backup"]);
        let ctx = ctx(&cfg, &idx, None);
        let a = json!({"city": "Paris"});
        let mut st = run();
        assert_eq!(unsettled(&st), None);
        let held = observe(&mut st, &ctx, ("c", "weather", &a), r#"{"temp": 21.0}"#, 0);
        assert_eq!(held, Outcome::Held);
        let why = unsettled(&st).unwrap_or_default();
        assert!(why.contains("`weather_backup`"), "{why}");
        observe(
            &mut st,
            &ctx,
            ("c", "weather_backup", &a),
            r#"{"temp": 21.1}"#,
            1,
        );
        assert_eq!(unsettled(&st), None, "checked and confirmed: claimable");
    }

    /// A tool with no equivalent that the operator marks `cross_check` is checked by a second
    /// read of itself: the value is held, the same call is asked for, and a second answer that
    /// differs is the call's contradiction.
    #[test]
    fn a_lone_tool_is_cross_checked_by_a_second_read() {
        let cfg = BTreeMap::from([(
            "rate".to_owned(),
            ToolConfig {
                cross_check: true,
                ..ToolConfig::default()
            },
        )]);
        let idx = offered(&["rate"]);
        let ctx = ctx(&cfg, &idx, None);
        let a = json!({"pair": "EURUSD"});
        let mut st = run();
        let held = observe(&mut st, &ctx, ("c1", "rate", &a), r#"{"rate": 1.08}"#, 0);
        assert_eq!(held, Outcome::Held);
        let next = st.wire.take_next();
        assert_eq!(next.guidance, vec![cross_check_text("rate", "rate")]);
        assert_eq!(next.again, vec!["rate"], "the same call again is asked for");
        let same = observe(&mut st, &ctx, ("c2", "rate", &a), r#"{"rate": 1.08}"#, 1);
        assert_eq!(same, Outcome::Check);
        assert_eq!(
            st.wire.take_next(),
            Next {
                taken: vec![("rate".to_owned(), canonical_hash(&a))],
                ..Next::default()
            },
            "confirmed: nothing to do, the value taken"
        );

        let mut st = run();
        observe(&mut st, &ctx, ("c1", "rate", &a), r#"{"rate": 1.08}"#, 0);
        observe(&mut st, &ctx, ("c2", "rate", &a), r#"{"rate": 10.8}"#, 1);
        let next = st.wire.take_next();
        assert!(!next.actions.is_empty(), "{next:?}");
        assert!(
            next.guidance
                .iter()
                .any(|g| g.contains("contradictory_evidence")),
            "{next:?}"
        );
    }

    /// The escalation rung sends the next request to the fallback model, once per step.
    #[test]
    fn escalation_goes_to_the_fallback_once() {
        let policy =
            Policy::from_toml_str("[ladders]\ntool_timeout = [\"escalate\", \"degrade\"]\n")
                .unwrap_or_default();
        let cfg = BTreeMap::new();
        let idx = offered(&["search"]);
        let ctx = ctx(&cfg, &idx, Some("big"));
        let mut st =
            RunState::with_policy(MonitorConfig::default(), BudgetLimits::defaults(), policy);
        let a = json!({"q": "x"});
        observe(&mut st, &ctx, ("c", "search", &a), "Error: timed out", 0);
        let next = st.wire.take_next();
        assert!(next.escalate, "{next:?}");
        observe(&mut st, &ctx, ("c", "search", &a), "Error: timed out", 1);
        let next = st.wire.take_next();
        assert!(!next.escalate);
        // Nothing was produced yet, so the ladder's degrade is a terminate.
        assert!(matches!(next.stop, Some(Stop::Abort(_))), "{next:?}");
    }
    /// A grounded tool's call whose argument appears nowhere in the conversation is taken out
    /// and re-asked; one copied from a tool result (also a repaired one) or the task passes;
    /// a tool not marked grounded is never judged.
    #[test]
    fn ungrounded_calls_of_grounded_tools_are_taken_out() {
        let body = json!({"model": "m", "messages": [
            {"role": "user", "content": "Task 3: weather in the capital of Mexico."},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
                "function": {"name": "capital", "arguments": "{\"country\": \"Mexico\"}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "```json\n{\"city\": \"Mexico City\", \"code\": \"MXC\"}\n```"}
        ]})
        .to_string();
        let req = crate::request::ChatRequest::parse(body.as_bytes()).unwrap();
        let mut tools = tools(false);
        tools.insert(
            "lookup".into(),
            ToolConfig {
                grounded: true,
                ..ToolConfig::default()
            },
        );
        let g = Grounding {
            tools: &tools,
            messages: &req.messages,
        };
        let call = |name: &str, args: &str| {
            json!({"role": "assistant", "content": null, "tool_calls": [{"id": "c2",
                "type": "function", "function": {"name": name, "arguments": args}}]})
        };
        // Copied from the repaired result: kept.
        let mut ok = call("lookup", "{\"code\": \"MXC\", \"country\": \"Mexico\"}");
        assert!(g.check(&mut ok).is_empty());
        assert!(ok.get("tool_calls").is_some());
        // Copied wrong: taken out, with the argument named.
        let mut bad = call("lookup", "{\"code\": \"MXCs\"}");
        let problems = g.check(&mut bad);
        assert_eq!(problems.len(), 1);
        assert!(
            problems[0].text.contains("`code` = \"MXCs\""),
            "{problems:?}"
        );
        assert!(bad.get("tool_calls").is_none());
        assert_eq!(bad["content"], "");
        // Not grounded: the same wrong value is left to the tool.
        let mut free = call("weather", "{\"code\": \"MXCs\"}");
        assert!(g.check(&mut free).is_empty());
        assert!(free.get("tool_calls").is_some());
    }
}

#[cfg(test)]
mod guidance_tests {
    use super::*;

    /// Issue 31: the guidance fits the class. A validation error or the wrong tool is never
    /// told "the same arguments"; nothing found is told to change the query.
    #[test]
    fn guidance_fits_the_class() {
        for class in FailureClass::ALL {
            let text = if class.is_model_side() {
                rewrite_text("t", class)
            } else {
                retry_text("t", class)
            };
            if matches!(
                class,
                FailureClass::ArgumentInvalid | FailureClass::WrongTool | FailureClass::EmptyOutput
            ) {
                assert!(!text.contains("the same arguments"), "{class}: {text}");
            }
        }
        assert!(rewrite_text("t", FailureClass::WrongTool).contains("another tool"));
        assert!(retry_text("t", FailureClass::EmptyOutput).contains("different query"));
        assert!(rewrite_text("t", FailureClass::ArgumentInvalid).contains("change its arguments"));
        assert!(retry_text("t", FailureClass::ToolTimeout).contains("the same arguments"));
    }
}
