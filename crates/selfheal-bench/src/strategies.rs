//! The strategies, each as good as its name allows, and the client they share.
//!
//! A strategy holds a `&mut` [`Episode`] and sees what a client sees: the plan, the call the
//! model wrote, the response's status, bytes and latency. It cannot reach the fault schedule or
//! the world's truth — those are private to [`crate::exec`] — and a test scans this file for any
//! attempt to (`tests/oracle.rs`).
//!
//! | strategy | detects | recovers with |
//! |---|---|---|
//! | `static` | what a plain client sees: raised errors, unparseable bodies, missing or empty fields, inputs it cannot fill | nothing |
//! | `retry-only` | the same | resends the same call up to `R` times per failure, backoff honouring `Retry-After` |
//! | `react` | the same; the error text goes back to the model | waits and retries on timeouts and 429s, switches to the equivalent tool on 5xx/404/unavailable or when the same error comes twice, rewrites the call otherwise, replans on a missing input; `R` actions per failure |
//! | `full-replan` | the same | discards the plan and replans from scratch, avoiding tools that failed; each replan is one unit of `R` |
//! | `react+verify`, `full-replan+verify` | everything self-healing detects: the tool name against the tools on offer, argument schema and grounding checks (no plan values put into a call), repetition, soft failures, freshness (`as_of`), and the cross-check verifier | as `react` / `full-replan` (stale → refresh, rejected → the other source) |
//! | `class-agnostic` | as self-healing | the core controller with one ladder for every class (retry, repair, substitute, refresh, replan, escalate, degrade): the same actions without the classifier's choice |
//! | `self-healing` | as above; before a run that needed recovery answers, the values only a second read of their own source confirmed are read once more | the core's run ([`crate::healer::Healer`]) with the default policy; a step tool the run hides gives way to its equivalent source |
//!
//! The cross-check verifier is a real call of the substitute ([`Purpose::Verify`]): it costs
//! latency and `V`, meets the substitute's faults, and compares with the tool's documented
//! tolerance, so noise between equivalent sources can make it reject a right value or accept a
//! wrong one. An external tool with no substitute (every NESTFUL tool) is read a second time
//! instead, which catches a wrong value that does not last but never one the source repeats. Output repair runs `selfheal-repair` on the bytes the tool returned and refuses a
//! cut body. Escalation writes the call with the fallback model ([`Writer::Fallback`]), which has
//! its own error rate and price.

use serde_json::Value;

use selfheal_core::{
    ActionKind, Amounts, BudgetLimits, CallOutcome, ControllerConfig, FailureClass, Judgement,
    Observation, Options, Policy, RecoveryAction, RepairTarget, RetryConfig, RunStatus,
    SecondReading, SecondSource, Signal, SplitMix64, StepAction, THIRD_READ_VERIFIER, ToolCall,
    Trust, canonical_hash, contract, judge_second_reading, ungrounded_arguments,
};

use crate::exec::{AS_OF, Episode, MAX_AGE_MS, Purpose, Response, Writer, Written};
use crate::healer::{Healer, Proposal};
use crate::task::{Plan, ResolveError, ToolSpec, get_path, resolve_answer, resolve_args};

/// A strategy's name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub enum Strategy {
    /// No recovery.
    #[serde(rename = "static")]
    Static,
    /// Resend the same call.
    #[serde(rename = "retry-only")]
    RetryOnly,
    /// Feed the error text back to the model.
    #[serde(rename = "react")]
    React,
    /// `react` with self-healing's detectors and verifier.
    #[serde(rename = "react+verify")]
    ReactVerify,
    /// Replan from scratch on any failure.
    #[serde(rename = "full-replan")]
    FullReplan,
    /// `full-replan` with self-healing's detectors and verifier.
    #[serde(rename = "full-replan+verify")]
    FullReplanVerify,
    /// The core controller with one ladder for every class.
    #[serde(rename = "class-agnostic")]
    ClassAgnostic,
    /// The selfheal core.
    #[serde(rename = "self-healing")]
    SelfHealing,
}

impl Strategy {
    /// Every strategy, in report order.
    pub const ALL: [Strategy; 8] = [
        Strategy::Static,
        Strategy::RetryOnly,
        Strategy::React,
        Strategy::ReactVerify,
        Strategy::FullReplan,
        Strategy::FullReplanVerify,
        Strategy::ClassAgnostic,
        Strategy::SelfHealing,
    ];

    /// The name used in tables and JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            Strategy::Static => "static",
            Strategy::RetryOnly => "retry-only",
            Strategy::React => "react",
            Strategy::ReactVerify => "react+verify",
            Strategy::FullReplan => "full-replan",
            Strategy::FullReplanVerify => "full-replan+verify",
            Strategy::ClassAgnostic => "class-agnostic",
            Strategy::SelfHealing => "self-healing",
        }
    }

    /// Whether the strategy carries memory from one episode to the next (in a `--deployment`,
    /// a strategy that does learns which sources to trust). The strategies that run the core's
    /// controller do: its trust store ([`selfheal_core::Trust`]) is carried across a seed's
    /// episodes, as a deployed front-end keeps it per process. The baselines start each episode
    /// afresh.
    pub fn carries_memory(self) -> bool {
        match self {
            Strategy::Static
            | Strategy::RetryOnly
            | Strategy::React
            | Strategy::ReactVerify
            | Strategy::FullReplan
            | Strategy::FullReplanVerify => false,
            Strategy::ClassAgnostic | Strategy::SelfHealing => true,
        }
    }

    /// Parses a name.
    pub fn parse(s: &str) -> Option<Strategy> {
        Strategy::ALL.into_iter().find(|x| x.as_str() == s)
    }

    /// Runs one episode.
    pub fn run(
        self,
        ep: &mut Episode<'_>,
        r: u32,
        policy: Option<&Policy>,
        seed: u64,
        want_trace: bool,
    ) -> Ended {
        self.run_with_trust(ep, r, policy, seed, want_trace, &mut Trust::new())
    }

    /// Runs one episode with what earlier episodes taught of the tools (`trust`, the
    /// core's [`selfheal_core::Trust`] store), and adds what this one sees. Only the strategies
    /// that run the core's controller read and feed it ([`Strategy::carries_memory`]).
    pub fn run_with_trust(
        self,
        ep: &mut Episode<'_>,
        r: u32,
        policy: Option<&Policy>,
        seed: u64,
        want_trace: bool,
        trust: &mut Trust,
    ) -> Ended {
        let mut rng = SplitMix64::new(seed.wrapping_mul(31) ^ 0xBA5E);
        match self {
            Strategy::Static => run_static(ep),
            Strategy::RetryOnly => run_retry_only(ep, r, &mut rng),
            Strategy::React => run_react(ep, r, &mut rng, Detectors::PLAIN),
            Strategy::ReactVerify => run_react(ep, r, &mut rng, Detectors::ALL),
            Strategy::FullReplan => run_full_replan(ep, r, Detectors::PLAIN),
            Strategy::FullReplanVerify => run_full_replan(ep, r, Detectors::ALL),
            Strategy::ClassAgnostic => run_self_healing(
                ep,
                Some(&class_agnostic_policy()),
                r,
                seed,
                want_trace,
                trust,
            ),
            Strategy::SelfHealing => run_self_healing(ep, policy, r, seed, want_trace, trust),
        }
    }
}

/// The policy of `class-agnostic`: the same ladder for every class.
pub(crate) fn class_agnostic_policy() -> Policy {
    use ActionKind::*;
    let ladder = vec![
        Retry, Repair, Substitute, Refresh, Replan, Escalate, Degrade,
    ];
    Policy {
        ladders: FailureClass::ALL
            .into_iter()
            .map(|c| (c, ladder.clone()))
            .collect(),
        last_chance: Default::default(),
        ..Policy::default()
    }
}

/// How an episode ended.
#[derive(Debug, Clone, PartialEq)]
pub struct Ended {
    /// The answer, when the strategy returned one as complete.
    pub answer: Option<Value>,
    /// Control-plane trace (JSON Lines), for the controller strategies.
    pub trace: Option<String>,
}

impl Ended {
    fn none() -> Ended {
        Ended {
            answer: None,
            trace: None,
        }
    }
}

/// Which detectors a client runs beyond a plain client's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Detectors {
    /// Tool name checked against the plan, arguments against the schema, repetition.
    pub call_checks: bool,
    /// Soft failures and drift told apart from missing fields.
    pub soft: bool,
    /// `as_of` older than [`MAX_AGE_MS`] is a failure.
    pub freshness: bool,
    /// External values cross-checked with the equivalent source, or with a second read where
    /// there is none.
    pub verify: bool,
}

impl Detectors {
    /// A plain client.
    pub(crate) const PLAIN: Detectors = Detectors {
        call_checks: false,
        soft: false,
        freshness: false,
        verify: false,
    };
    /// Everything self-healing uses.
    pub(crate) const ALL: Detectors = Detectors {
        call_checks: true,
        soft: true,
        freshness: true,
        verify: true,
    };
}

/// How the next attempt at a step is made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct How {
    substitute: bool,
    /// The client switched to the substitute because the two sources disagreed: it has chosen
    /// to trust the other source, so checking it back against the one it distrusts is moot.
    trust_substitute: bool,
    fresh: bool,
    regenerate: bool,
    writer: Writer,
    fix_args: bool,
}

impl Default for How {
    fn default() -> Self {
        How {
            substitute: false,
            trust_substitute: false,
            fresh: false,
            regenerate: true,
            writer: Writer::Agent,
            fix_args: false,
        }
    }
}

/// A failed attempt, as the client understands it.
#[derive(Debug, Clone, PartialEq)]
struct Failure {
    signal: Signal,
    message: String,
    retry_after_ms: Option<u64>,
    repair: Option<RepairTarget>,
    /// The call reached the tool (so the monitor records it).
    called: Option<(String, Value, Option<Value>)>,
    /// The tool the model called (after any switch to its substitute): every decision about
    /// the failure is made by it, never by the step's tool.
    tool: Option<String>,
    /// The tool answered an error body: a soft failure the core's monitor reads itself, as on
    /// every other front-end, so the run is told the call and no signal of the client's.
    error_body: bool,
}

impl Failure {
    fn new(signal: Signal, message: String) -> Failure {
        Failure {
            signal,
            message,
            retry_after_ms: None,
            repair: None,
            called: None,
            tool: None,
            error_body: false,
        }
    }

    /// The signal the run is told with the call: none for an error body (the core reads it).
    fn core_signal(&self) -> Option<Signal> {
        (!self.error_body).then(|| self.signal.clone())
    }
}

/// The call a client actually sent: the tool and the arguments as they went out (the model's,
/// after any switch to the substitute and any JSON repair) — never the plan's.
#[derive(Debug, Clone, PartialEq)]
struct Sent {
    tool: String,
    args: Value,
}

impl Sent {
    fn written(&self) -> Written {
        Written::Call {
            tool: self.tool.clone(),
            args: self.args.clone(),
        }
    }
}

/// What one attempt at a step produced.
#[derive(Debug, Clone, PartialEq)]
enum Attempt {
    /// A usable body, and the call that fetched it.
    Ok(Value, Sent),
    /// The model wrote no call.
    Skipped,
    /// A failure.
    Failed(Failure),
}

fn backoff(rng: &mut SplitMix64, attempt: u32, retry_after_ms: Option<u64>) -> u64 {
    RetryConfig::default().delay_ms(attempt, retry_after_ms, rng)
}

/// Whether a body was cut off: more brackets opened than closed outside strings.
fn is_cut(text: &str) -> bool {
    let (mut depth, mut in_str, mut esc, mut quote) = (0i64, false, false, '"');
    for c in text.chars() {
        if in_str {
            if esc {
                esc = false;
            } else if c == '\\' {
                esc = true;
            } else if c == quote {
                in_str = false;
            }
            continue;
        }
        match c {
            '"' | '\'' => {
                in_str = true;
                quote = c;
            }
            '{' | '[' => depth += 1,
            '}' | ']' => depth -= 1,
            _ => {}
        }
    }
    depth > 0 || in_str
}

/// The spec of the tool a call went to: its own, or for a substitute's name, the spec of the
/// tool it substitutes for (same arguments, same output). `None`: not a tool on offer. Every
/// decision about a call is made with this — never with the step's tool, which is the plan's
/// answer to "which tool", not what the model called.
fn tool_spec<'p>(plan: &'p Plan, tool: &str) -> Option<&'p ToolSpec> {
    plan.tool(tool).or_else(|| {
        plan.tools
            .iter()
            .find(|t| t.substitute.as_deref() == Some(tool))
    })
}

/// The equivalent source of the tool called (`None` for a substitute itself, or a tool with none).
fn substitute_of(plan: &Plan, tool: &str) -> Option<String> {
    plan.tool(tool).and_then(|t| t.substitute.clone())
}

/// The fields the called tool declares it answers with (its output contract, from the task
/// file's tool definition): what a client checks an answer against. Not the plan's reads — which
/// fields the task goes on to use is the task's solution, not the tool's contract.
fn contract(plan: &Plan, tool: &str) -> Vec<String> {
    tool_spec(plan, tool)
        .map(|t| t.output.iter().map(|(p, _)| p.clone()).collect())
        .unwrap_or_default()
}

/// Output repair on the bytes a tool returned: `selfheal-repair`, then the core's mapping of
/// renamed fields back to the tool's declared ones ([`selfheal_core::contract::map_renamed`]).
/// A cut body is refused: closing it would invent data.
fn repair_output(plan: &Plan, tool: &str, body: &str) -> Result<Value, String> {
    let v: Value = match serde_json::from_str(body) {
        Ok(v) => v,
        Err(_) => {
            if is_cut(body) {
                return Err("the body was cut off: refusing to invent its end".into());
            }
            selfheal_repair::repair(body)
                .map_err(|e| format!("JSON repair refused: {e}"))?
                .value
        }
    };
    contract::map_renamed(&v, &contract(plan, tool))
}

/// Checks a parsed body the way a client does.
fn check_body(
    plan: &Plan,
    tool: &str,
    v: &Value,
    det: Detectors,
    now: u64,
) -> Result<(), Box<Failure>> {
    if let Some(breach) = contract::breach(v, &contract(plan, tool)) {
        let p = breach.field();
        let text = v.to_string();
        if !det.soft {
            return Err(Box::new(Failure::new(
                Signal::EmptyOutput,
                format!("KeyError: `{p}` missing or empty in {text}"),
            )));
        }
        if let Some(e) = v.get("error").and_then(Value::as_str) {
            let mut f = Failure::new(
                Signal::Exception {
                    message: e.to_owned(),
                },
                format!("the tool returned an error body: {e}"),
            );
            f.error_body = true;
            return Err(Box::new(f));
        }
        let signal = breach.signal(v);
        return Err(Box::new(match breach {
            contract::Breach::Drifted { .. } => {
                let mut f = Failure::new(signal, format!("schema drift: no `{p}` in {text}"));
                f.repair = Some(RepairTarget::Output);
                f
            }
            contract::Breach::Empty { .. } => {
                Failure::new(signal, format!("empty output: `{p}` is empty in {text}"))
            }
        }));
    }
    if det.freshness
        && let Some(signal @ Signal::Stale { age_ms, .. }) =
            contract::stale(v, AS_OF, now, MAX_AGE_MS)
    {
        return Err(Box::new(Failure::new(
            signal,
            format!("stale data: as_of is {age_ms} ms old"),
        )));
    }
    Ok(())
}

/// What a client can ground an argument in: the user's message(s) and the tool results it
/// holds. No value of the plan's calls is read.
fn grounding_evidence(plan: &Plan, outputs: &[Option<Value>]) -> Vec<Value> {
    let mut evidence = plan.prompt_evidence();
    evidence.extend(outputs.iter().flatten().cloned());
    evidence
}

/// One attempt at step `s`: the model writes, the client checks, the tool runs, the client reads.
/// A failure carries the tool the model called.
fn attempt(
    ep: &mut Episode<'_>,
    s: usize,
    how: How,
    outputs: &[Option<Value>],
    prev_call: Option<&Written>,
    det: Detectors,
) -> Attempt {
    let mut called = None;
    let mut a = attempt_inner(ep, s, how, outputs, prev_call, det, &mut called);
    if let Attempt::Failed(f) = &mut a {
        f.tool = called;
        if let Some(d) = detector_of(f) {
            ep.report_alarm(s, d);
        }
    }
    a
}

/// Which of the client's detectors a failure comes from (`None`: the tool or the model said so
/// itself — a raised error, an unreadable body, no input to fill).
fn detector_of(f: &Failure) -> Option<&'static str> {
    Some(match &f.signal {
        Signal::Repetition => "repetition",
        Signal::UnknownTool { .. } => "tool_on_offer",
        Signal::EmptyInput { .. } => "required_arguments",
        Signal::InvalidArguments { .. } if f.message.contains("appear nowhere") => "grounding",
        Signal::InvalidArguments { .. } => "arguments_json",
        Signal::Stale { .. } => "freshness",
        Signal::SchemaDrift { .. } | Signal::EmptyOutput if f.called.is_some() => "contract",
        _ => return None,
    })
}

fn attempt_inner(
    ep: &mut Episode<'_>,
    s: usize,
    how: How,
    outputs: &[Option<Value>],
    prev_call: Option<&Written>,
    det: Detectors,
    called_tool: &mut Option<String>,
) -> Attempt {
    // An input nobody produced: every client sees that it cannot fill the argument.
    if let Err(e @ ResolveError::Missing { .. }) = resolve_args(ep.plan(), s, outputs) {
        ep.write(s, how.writer, true, outputs);
        return Attempt::Failed(Failure::new(
            Signal::MissingStep {
                detail: e.to_string(),
            },
            e.to_string(),
        ));
    }
    let written = ep.write(s, how.writer, how.regenerate, outputs);
    let (tool, args) = match written {
        Written::Call { tool, args } => (tool, args),
        Written::Skipped => return Attempt::Skipped,
        // The model's provider is down: the model call raised, as a tool call can.
        Written::Unavailable {
            message,
            status,
            retry_after_ms,
        } => {
            let signal = match status {
                Some(code) => Signal::HttpStatus {
                    status: code,
                    retry_after_ms,
                    message: message.clone(),
                },
                None => Signal::Timeout,
            };
            let mut f = Failure::new(signal, message);
            f.retry_after_ms = retry_after_ms;
            return Attempt::Failed(f);
        }
    };
    let plan = ep.plan();
    if plan.steps.get(s).is_none() {
        return Attempt::Failed(Failure::new(Signal::EmptyResponse, "no such step".into()));
    }
    let mut tool = tool;
    let mut args = args;
    // The client's switch goes to the equivalent source of the tool the model called.
    if how.substitute
        && let Some(sub) = substitute_of(plan, &tool)
    {
        tool = sub;
    }
    *called_tool = Some(tool.clone());
    let required = tool_spec(plan, &tool)
        .map(ToolSpec::required)
        .unwrap_or_default();
    // A plan that makes the same call twice in a row (a status read twice) repeats on purpose:
    // only a repeat the plan does not have is a loop.
    let planned_twice = s
        .checked_sub(1)
        .is_some_and(|p| plan.steps.get(p) == plan.steps.get(s));
    if det.call_checks {
        if !planned_twice && prev_call.is_some_and(|p| {
            matches!(p, Written::Call { tool: t, args: a } if *t == tool && canonical_hash(a) == canonical_hash(&args))
        }) {
            return Attempt::Failed(Failure::new(
                Signal::Repetition,
                format!("the call repeats the previous step's `{tool}` call"),
            ));
        }
        // The tools on offer and their substitutes: a call of any other does not exist for this
        // client. (Which offered tool a step should call is the plan's answer, not something a
        // client checks a model against: a sibling on offer passes.)
        if tool_spec(plan, &tool).is_none() {
            let mut f = Failure::new(
                Signal::UnknownTool { name: tool.clone() },
                format!("`{tool}` is not a tool on offer"),
            );
            f.repair = Some(RepairTarget::ToolChoice);
            return Attempt::Failed(f);
        }
    }
    if how.fix_args {
        // Argument repair: JSON repair of the text the model wrote. A value that is wrong or
        // empty is the model's to write again (the call is regenerated); the plan's values are
        // never put in its place — that would be the answer, not a repair.
        if let Value::String(text) = &args
            && let Ok(r) = selfheal_repair::repair(text)
            && r.value.is_object()
        {
            args = r.value;
        }
    }
    if det.call_checks {
        let Some(obj) = args.as_object() else {
            let mut f = Failure::new(
                Signal::InvalidArguments {
                    errors: vec![format!("arguments of `{tool}` are not a JSON object")],
                },
                "the arguments are not valid JSON".into(),
            );
            f.repair = Some(RepairTarget::Arguments);
            return Attempt::Failed(f);
        };
        let empty: Vec<String> = required
            .iter()
            .filter(|r| match obj.get(*r) {
                None | Some(Value::Null) => true,
                Some(Value::String(x)) => x.trim().is_empty(),
                Some(_) => false,
            })
            .cloned()
            .collect();
        if !empty.is_empty() {
            let mut f = Failure::new(
                Signal::EmptyInput {
                    arguments: empty.clone(),
                },
                format!("required arguments are empty: {empty:?}"),
            );
            f.repair = Some(RepairTarget::Arguments);
            return Attempt::Failed(f);
        }
        // Grounding: every argument must appear in what the client holds — the user's
        // message(s) and the outputs so far (the core's rule, which the gateway applies to the
        // conversation). Never the plan's values: those are the answer.
        let ungrounded = ungrounded_arguments(&args, &grounding_evidence(plan, outputs));
        if !ungrounded.is_empty() {
            let mut f = Failure::new(
                Signal::InvalidArguments {
                    errors: ungrounded.clone(),
                },
                format!(
                    "arguments that appear nowhere in the task or the results so far: {}",
                    ungrounded.join("; ")
                ),
            );
            f.repair = Some(RepairTarget::Arguments);
            return Attempt::Failed(f);
        }
    }
    let resp = ep.call(s, &tool, &args, Purpose::Step, how.fresh);
    let now = ep.data_now();
    let result = read_response(ep.plan(), &tool, resp.response, det, now);
    let called = Some((
        tool.clone(),
        args.clone(),
        result.as_ref().err().and_then(|(_, v)| v.clone()),
    ));
    match result {
        Ok(v) => Attempt::Ok(v, Sent { tool, args }),
        Err((mut f, _)) => {
            f.called = called;
            Attempt::Failed(*f)
        }
    }
}

/// How the benchmark's client reads what a call of `tool` came back with, as every strategy
/// with detectors `det` does: a usable value, or the failure with what the tool returned
/// (`None` when it raised).
fn read_response(
    plan: &Plan,
    tool: &str,
    response: Response,
    det: Detectors,
    now: u64,
) -> Result<Value, (Box<Failure>, Option<Value>)> {
    match response {
        Response::Raised {
            message,
            status,
            retry_after_ms,
            timeout,
        } => {
            let signal = if timeout {
                Signal::Timeout
            } else {
                match status {
                    Some(code) => Signal::HttpStatus {
                        status: code,
                        retry_after_ms,
                        message: message.clone(),
                    },
                    None => Signal::Exception {
                        message: message.clone(),
                    },
                }
            };
            let mut f = Failure::new(signal, message);
            f.retry_after_ms = retry_after_ms;
            Err((Box::new(f), None))
        }
        Response::Returned { body } => {
            let v: Value = match serde_json::from_str(&body) {
                Ok(v) => v,
                Err(e) => {
                    let (signal, repair) = if !det.soft {
                        (
                            Signal::MalformedOutput {
                                detail: e.to_string(),
                            },
                            None,
                        )
                    } else if is_cut(&body) {
                        (Signal::TruncatedOutput, Some(RepairTarget::Output))
                    } else {
                        (
                            Signal::MalformedOutput {
                                detail: e.to_string(),
                            },
                            Some(RepairTarget::Output),
                        )
                    };
                    let mut f = Failure::new(signal, format!("JSONDecodeError: {e}"));
                    f.repair = repair;
                    return Err((Box::new(f), Some(Value::String(body))));
                }
            };
            match check_body(plan, tool, &v, det, now) {
                Ok(()) => Ok(v),
                Err(f) => Err((f, Some(v))),
            }
        }
    }
}

/// How the `self-healing` client reads `response`, a call of `tool` (a tool of `plan`'s) at
/// `data_now` on the world's clock: the usable value, or a failure with the signal it tells
/// the run (`None`: one the core's monitor reads itself, an error body). For the conformance
/// test, which plays the core's table through the benchmark's own reading.
pub fn read_for_run(
    plan: &Plan,
    tool: &str,
    response: Response,
    data_now: u64,
) -> Result<Value, Option<Signal>> {
    read_response(plan, tool, response, Detectors::ALL, data_now).map_err(|(f, _)| f.core_signal())
}

/// The cross-check: calls the equivalent source with the arguments of the call that was made
/// (`sent`: the model's, as they went out — the plan's would be the task's solution, and would
/// check a wrong-argument call against the right answer) and compares the values
/// the tool declares within its tolerance — the substitute for the primary's values, the
/// primary for the substitute's (a substitute's value is otherwise unchecked). An external tool
/// with no equivalent source is read a second time instead: a source whose answer changes between
/// two reads of the same call did not give a settled one (a flaky upstream, a bad replica), and
/// the second read is a real call like any other — charged, slow, faultable. It cannot see a
/// value the source gets wrong every time; only a second source can. `None` for a local tool,
/// or when the client switched sources because they disagreed.
///
/// A local tool (a calculator) is not read twice on every run: the gateway, whose operator marks
/// the tools it cross-checks, has nothing to check one against, and a fault-free run costs the
/// same in both. [`audit`] reads it again once a run has needed a recovery.
fn cross_check(
    ep: &mut Episode<'_>,
    s: usize,
    how: How,
    body: &Value,
    sent: &Sent,
) -> Option<Judgement> {
    read_again(ep, s, how, body, sent, false).map(|(j, _)| j)
}

/// [`cross_check`]; with `local`, a local tool is read a second time too. With the verdict,
/// the value read (`None` when nothing readable came back).
fn read_again(
    ep: &mut Episode<'_>,
    s: usize,
    how: How,
    body: &Value,
    sent: &Sent,
    local: bool,
) -> Option<(Judgement, Option<Value>)> {
    let plan = ep.plan();
    // The source is known by the tool the call went to — its own spec, or for a call of a
    // tool's substitute, that tool's — never by the step's tool: which tool a step should call
    // is the plan's answer, and a client checking a sibling tool's answer against the step's
    // source would catch a wrong tool no client (nor the gateway) can see.
    let (spec, on_substitute) = if let Some(t) = plan.tool(&sent.tool) {
        (t, false)
    } else {
        let primary = plan
            .tools
            .iter()
            .find(|t| t.substitute.as_deref() == Some(sent.tool.as_str()))?;
        (primary, true)
    };
    if (!spec.external && !local) || how.trust_substitute {
        return None;
    }
    let sub = if on_substitute {
        spec.substitute.as_ref()?;
        spec.name.clone()
    } else {
        spec.substitute.clone().unwrap_or_else(|| spec.name.clone())
    };
    let other = if sub == spec.name && !on_substitute {
        format!("a second read of `{sub}`")
    } else {
        format!("`{sub}`")
    };
    let tol = spec.tolerance;
    let reads: Vec<String> = spec.output.iter().map(|(p, _)| p.clone()).collect();
    let resp = ep.call(s, &sub, &sent.args, Purpose::Verify, false);
    let mut read = None;
    let judgement = match resp.response {
        Response::Raised { message, .. } => Judgement::Uncertain {
            reason: format!("{other} did not answer: {message}"),
        },
        Response::Returned { body: other } => match serde_json::from_str::<Value>(&other) {
            Err(_) => Judgement::Uncertain {
                reason: format!("{other} sent an unreadable body"),
            },
            Ok(o) => {
                read = Some(o.clone());
                // The core's rule: field by field within the tool's tolerance, and a field the
                // other source renamed (its API drifted) read through the drift.
                // (The `as_of` stamp, when a source sends one, names no value.)
                let source = SecondSource {
                    name: &other,
                    fields: &reads,
                    stamp: Some(AS_OF),
                    tolerance: tol.into(),
                };
                match judge_second_reading(body, &o, &source) {
                    SecondReading::Judged(j) => j,
                    // A declared field this answer left empty and the other filled: the two
                    // disagree on it.
                    SecondReading::Hole(_) => Judgement::Reject {
                        reason: format!("{other} fills a field this answer left empty"),
                    },
                }
            }
        },
    };
    match &judgement {
        Judgement::Accept => ep.report_verdict(s, Some(true)),
        Judgement::Reject { .. } => {
            ep.report_verdict(s, Some(false));
            ep.report_alarm(s, if local { "re_read" } else { "cross_check" });
        }
        Judgement::Uncertain { .. } => ep.report_verdict(s, None),
    }
    Some((judgement, read))
}

/// Whether two readings of `tool` agree on every value the tool declares, within its tolerance.
fn same_reading(plan: &Plan, tool: &str, a: &Value, b: &Value) -> bool {
    let Some(spec) = tool_spec(plan, tool) else {
        return false;
    };
    spec.output
        .iter()
        .all(|(p, _)| match (get_path(a, p), get_path(b, p)) {
            (Some(x), Some(y)) => spec.tolerance.agrees(x, y),
            _ => false,
        })
}

/// Whether the tool called has an equivalent source.
fn has_substitute(ep: &Episode<'_>, tool: Option<&str>) -> bool {
    tool.is_some_and(|t| substitute_of(ep.plan(), t).is_some())
}

fn finish(ep: &Episode<'_>, outputs: &[Option<Value>]) -> Ended {
    Ended {
        answer: resolve_answer(ep.plan(), outputs).ok(),
        trace: None,
    }
}

/// `static`: run the plan; the first error ends the task.
pub(crate) fn run_static(ep: &mut Episode<'_>) -> Ended {
    ep.plan_call();
    let n = ep.plan().steps.len();
    let mut outputs: Vec<Option<Value>> = vec![None; n];
    for s in 0..n {
        match attempt(ep, s, How::default(), &outputs, None, Detectors::PLAIN) {
            Attempt::Ok(v, _) => outputs[s] = Some(v),
            Attempt::Skipped => outputs[s] = None,
            Attempt::Failed(_) => return Ended::none(),
        }
    }
    finish(ep, &outputs)
}

/// `retry-only`: resend the same call up to `r` times per failure.
pub(crate) fn run_retry_only(ep: &mut Episode<'_>, r: u32, rng: &mut SplitMix64) -> Ended {
    ep.plan_call();
    let n = ep.plan().steps.len();
    let mut outputs: Vec<Option<Value>> = vec![None; n];
    for s in 0..n {
        let mut tries = 0;
        let mut how = How::default();
        loop {
            match attempt(ep, s, how, &outputs, None, Detectors::PLAIN) {
                Attempt::Ok(v, _) => {
                    outputs[s] = Some(v);
                    break;
                }
                Attempt::Skipped => break,
                Attempt::Failed(f) => {
                    if tries >= r {
                        return Ended::none();
                    }
                    tries += 1;
                    ep.charge_recovery();
                    ep.wait(backoff(rng, tries, f.retry_after_ms));
                    how.regenerate = false;
                }
            }
        }
    }
    finish(ep, &outputs)
}

/// `react` (and `react+verify`): the model reads the error and picks the next action.
pub(crate) fn run_react(
    ep: &mut Episode<'_>,
    r: u32,
    rng: &mut SplitMix64,
    det: Detectors,
) -> Ended {
    ep.plan_call();
    let n = ep.plan().steps.len();
    let mut outputs: Vec<Option<Value>> = vec![None; n];
    let mut written: Vec<Option<Written>> = vec![None; n];
    let mut tries = vec![0u32; n];
    let mut how = vec![How::default(); n];
    let mut last_error: Vec<Option<String>> = vec![None; n];
    let mut s = 0;
    while s < n {
        if outputs[s].is_some() {
            s += 1;
            continue;
        }
        let prev = s.checked_sub(1).and_then(|p| written[p].as_ref());
        let result = attempt(ep, s, how[s], &outputs, prev, det);
        let failure = match result {
            Attempt::Ok(v, sent) => match det
                .verify
                .then(|| cross_check(ep, s, how[s], &v, &sent))
                .flatten()
            {
                Some(Judgement::Reject { reason }) => {
                    let mut f = Failure::new(
                        Signal::VerifierRejected {
                            reason: reason.clone(),
                        },
                        format!("the other source disagrees: {reason}"),
                    );
                    f.tool = Some(sent.tool.clone());
                    f
                }
                Some(Judgement::Accept | Judgement::Uncertain { .. }) | None => {
                    // The call that was made, for the repetition check of the next step.
                    written[s] = Some(sent.written());
                    outputs[s] = Some(v);
                    s += 1;
                    continue;
                }
            },
            Attempt::Skipped => {
                s += 1;
                continue;
            }
            Attempt::Failed(f) => f,
        };
        if tries[s] >= r {
            return Ended::none();
        }
        tries[s] += 1;
        ep.charge_recovery();
        let m = failure.message.to_ascii_lowercase();
        let has = |xs: &[&str]| xs.iter().any(|x| m.contains(x));
        let repeated = last_error[s].as_deref() == Some(m.as_str());
        last_error[s] = Some(m.clone());
        let can_switch = has_substitute(ep, failure.tool.as_deref()) && !how[s].substitute;
        if has(&["missing input"]) {
            ep.replan(Writer::Agent);
            s = outputs.iter().position(Option::is_none).unwrap_or(s).min(s);
            continue;
        }
        if has(&["disagrees"]) && can_switch {
            how[s].substitute = true;
            how[s].trust_substitute = true;
        } else if has(&["stale"]) {
            how[s].fresh = true;
        } else if (has(&[
            "503",
            "unavailable",
            "404",
            "502",
            "not found",
            "bad gateway",
        ]) || (repeated && has(&["timed out", "500", "reset"])))
            && can_switch
        {
            // A permanent-looking failure: use the other tool.
            how[s].substitute = true;
        } else if has(&["timed out", "429", "rate limit", "reset", "500"]) {
            ep.wait(backoff(rng, tries[s], failure.retry_after_ms));
        }
        // The model writes the next call with the error in view.
        how[s].regenerate = true;
    }
    finish(ep, &outputs)
}

/// `full-replan` (and `full-replan+verify`): on any failure, replan from scratch, avoiding
/// tools that failed.
pub(crate) fn run_full_replan(ep: &mut Episode<'_>, r: u32, det: Detectors) -> Ended {
    ep.plan_call();
    let n = ep.plan().steps.len();
    let mut outputs: Vec<Option<Value>> = vec![None; n];
    let mut replans = vec![0u32; n];
    let mut avoid = vec![false; n];
    let mut trusted = vec![false; n];
    let mut fresh = vec![false; n];
    let mut s = 0;
    while s < n {
        let how = How {
            substitute: avoid[s],
            trust_substitute: trusted[s],
            fresh: fresh[s],
            ..How::default()
        };
        let result = attempt(ep, s, how, &outputs, None, det);
        let last_tool: Option<String>;
        let failed = match result {
            Attempt::Ok(v, sent) => match det
                .verify
                .then(|| cross_check(ep, s, how, &v, &sent))
                .flatten()
            {
                Some(Judgement::Reject { .. }) => {
                    // Replanning away from a source that disagreed: the new plan trusts the
                    // other one. A tool whose two reads disagreed has no other one: the new
                    // plan reads it again and checks it again.
                    trusted[s] = !avoid[s] && has_substitute(ep, Some(&sent.tool));
                    last_tool = Some(sent.tool);
                    true
                }
                Some(Judgement::Accept | Judgement::Uncertain { .. }) | None => {
                    outputs[s] = Some(v);
                    s += 1;
                    continue;
                }
            },
            Attempt::Skipped => {
                s += 1;
                continue;
            }
            Attempt::Failed(f) => {
                if matches!(f.signal, Signal::Stale { .. }) {
                    // The primary's data is old: a new plan that avoids it trusts the other
                    // source rather than checking it back against the old data.
                    fresh[s] = true;
                    trusted[s] = true;
                }
                if f.called.is_some() && has_substitute(ep, f.tool.as_deref()) {
                    avoid[s] = true;
                }
                last_tool = f.tool;
                true
            }
        };
        if failed {
            if replans[s] >= r {
                return Ended::none();
            }
            replans[s] += 1;
            ep.charge_recovery();
            if det.verify && has_substitute(ep, last_tool.as_deref()) {
                avoid[s] = true;
            }
            ep.replan(Writer::Agent);
            outputs.iter_mut().for_each(|v| *v = None);
            s = 0;
        }
    }
    finish(ep, &outputs)
}

/// The budget vector the controller strategies run under for a plan of `n` steps at
/// per-failure budget `r`.
pub fn self_healing_budget(n: usize, r: u32) -> BudgetLimits {
    let n = n as u64;
    let r = u64::from(r);
    BudgetLimits {
        retries: 2 * r * n,
        replans: r + 1,
        substitutions: n,
        escalations: r.max(1),
        recoveries: r * n,
        latency_ms: 180_000,
        cost: u64::MAX,
    }
}

struct Run<'e, 'a> {
    ep: &'e mut Episode<'a>,
    heal: Healer,
}

impl Run<'_, '_> {
    /// The recoveries on offer for a failure of a call of `tool` (the tool called, `None` when
    /// the model called none).
    fn options(
        &self,
        tool: Option<&str>,
        how: How,
        repair: Option<RepairTarget>,
        outputs: &[Option<Value>],
    ) -> Options {
        let plan = self.ep.plan();
        Options {
            repair,
            substitute: if how.substitute {
                None
            } else {
                tool.and_then(|t| substitute_of(plan, t))
            },
            refreshable: tool
                .and_then(|t| tool_spec(plan, t))
                .is_some_and(|t| t.freshness),
            can_replan: true,
            fallback_model: (how.writer == Writer::Agent).then(|| "fallback-model".to_owned()),
            human_available: false,
            retry_safe: true,
            partial_result: outputs.iter().any(Option::is_some),
            // The benchmark waits on its own clock: any delay.
            max_delay_ms: None,
        }
    }
}

/// Carries out the core's re-read ([`Proposal::ReadAgain`]): before a run that needed
/// recovery answers, reads again (`reads` times) each value that only a
/// second read of its own source
/// confirmed (an external tool with no equivalent source), or nothing did
/// (a local tool: a calculator here fails, garbles and errs like any service, and reading it
/// again is the one check there is). Faults come
/// together in time: a source that failed openly in this run may, before that, have given a value
/// that did not last, and two reads in a row can both fall inside the same bad spell. The first
/// value that changes is the verifier's rejection of its step, and the controller's directive for
/// it is returned; `None` when every value held. Each read is a real call (latency, `V`, faults),
/// the audit is made once per run, and a read that cannot tell leaves the value as it was.
fn audit(
    st: &mut Run<'_, '_>,
    how: &[How],
    outputs: &[Option<Value>],
    sent: &[Option<Sent>],
    reads: u32,
) -> Option<(usize, StepAction, Option<Value>)> {
    for (m, value) in outputs.iter().enumerate() {
        let Some(v) = value else { continue };
        // The value is read again with the call that fetched it.
        let Some(call) = sent.get(m).and_then(Option::as_ref) else {
            continue;
        };
        let single = tool_spec(st.ep.plan(), &call.tool).is_some_and(|t| t.substitute.is_none())
            && substitute_of(st.ep.plan(), &call.tool).is_none();
        if !single {
            continue;
        }
        for _ in 0..reads {
            let Some((judgement, read)) = read_again(st.ep, m, how[m], v, call, true) else {
                break;
            };
            let rejected = matches!(judgement, Judgement::Reject { .. });
            let options = st.options(Some(&call.tool), how[m], None, outputs);
            let now = st.ep.now();
            let d = st.heal.decide(
                Observation::Verified {
                    step: Some(m as u32),
                    verifier: "re_read",
                    judgement,
                    options,
                },
                now,
            );
            if rejected || !matches!(d, StepAction::Proceed { .. }) {
                return Some((m, d, read.filter(|_| rejected)));
            }
        }
    }
    None
}

/// Whether step `s` can still be written with a tool on offer. The run hides a tool whose
/// circuit opened (5 failures in a row) and names what else is on offer; the model, which
/// follows the plan, then writes the step with the equivalent source of its tool when that is
/// offered (`how` switches to it) — the plan's other tools do other things. `false`: no tool on
/// offer does the step, and the episode ends without an answer.
fn offered_way(heal: &Healer, plan: &Plan, s: usize, how: &mut How) -> bool {
    let Some(spec) = plan.step_tool(s) else {
        return true;
    };
    let current = match (&spec.substitute, how.substitute) {
        (Some(sub), true) => sub.as_str(),
        _ => spec.name.as_str(),
    };
    if !heal.hidden(current) {
        return true;
    }
    match &spec.substitute {
        Some(sub) if !how.substitute && !heal.hidden(sub) => {
            how.substitute = true;
            how.regenerate = true;
            true
        }
        _ => false,
    }
}

/// `self-healing` (and `class-agnostic`, with its policy): the core controller with `policy`
/// (the default when `None`), its actions per failure capped at `r` or the policy's own cap.
pub(crate) fn run_self_healing(
    ep: &mut Episode<'_>,
    policy: Option<&Policy>,
    r: u32,
    seed: u64,
    want_trace: bool,
    trust: &mut Trust,
) -> Ended {
    let n = ep.plan().steps.len();
    let base = policy.cloned().unwrap_or_default();
    let trust_config = base.trust;
    let policy = Policy {
        max_actions_per_failure: Some(base.max_actions_per_failure.map_or(r, |cap| cap.min(r))),
        ..base
    };
    let config = ControllerConfig {
        policy,
        budget: self_healing_budget(n, r),
        trust: trust.clone(),
        ..ControllerConfig::default()
    };
    // The episode's plan has fixed steps, and the run is not told the tools on offer. Told
    // them, it routes a failure at its ladder's end around to the monitor (warned at 3, hidden
    // at 5), and the step's later attempts — the same tool again until it is hidden — are the
    // monitor's, charged to no per-failure cap: the run gets more attempts than `R` allows the
    // baselines, and the episodes it reaches so carry more silent failures (measured with the
    // core holding a routed step's value as a recovered one, issue 30: recovered and silent
    // both rose on every set). Without an offer the ladder's end stands, as the core documents
    // for a front-end with fixed steps.
    let offered: [&str; 0] = [];
    let Ok(heal) = Healer::new(config, &offered, seed ^ 0x5E1F) else {
        return Ended::none();
    };
    ep.plan_call();
    let mut st = Run { ep, heal };
    let mut outputs: Vec<Option<Value>> = vec![None; n];
    let mut written: Vec<Option<Written>> = vec![None; n];
    // The last call sent for each step (the one whose body `outputs` or `last_body` holds).
    let mut sent: Vec<Option<Sent>> = vec![None; n];
    let mut how = vec![How::default(); n];
    let mut last_body: Vec<Option<String>> = vec![None; n];
    let mut s = 0;
    let end = |st: &mut Run<'_, '_>, trust: &mut Trust| {
        let now = st.ep.now();
        st.heal.finish(now);
        trust.apply(&st.heal.take_trust_evidence(), &trust_config);
        Ended {
            answer: None,
            trace: want_trace.then(|| st.heal.trace().to_jsonl()),
        }
    };
    // Past the last step, the core says whether the run reads its unconfirmed values once more
    // before answering (the policy's `reread_after_recovery`, once, after a recovery).
    // The value the re-read before answering found changed, and its step: a confirmed value
    // (the core's `contested`) is kept when the retry brings it back.
    // With it, the differing reading, when one was read.
    let mut audited: Option<(usize, Value, Option<Value>)> = None;
    'steps: loop {
        let directive = if s >= n {
            // The episode has its answer: the run says whether its values are read again first.
            let now = st.ep.now();
            let Proposal::ReadAgain { reads } = st.heal.propose_answer(now) else {
                break;
            };
            let Some((m, d, differing)) = audit(&mut st, &how, &outputs, &sent, reads) else {
                // Every value held: propose the answer again.
                continue;
            };
            audited = outputs[m].clone().map(|v| (m, v, differing));
            // The answer is rebuilt from the step whose value changed.
            outputs[m..].iter_mut().for_each(|o| *o = None);
            written[m..].iter_mut().for_each(|w| *w = None);
            s = m;
            d
        } else {
            if outputs[s].is_some() {
                s += 1;
                continue;
            }
            // The model is about to write the step: the run says what it is offered (or
            // stops the run, on the failure rate), as before every model step of the runtime.
            let now = st.ep.now();
            if matches!(st.heal.next_turn(now), StepAction::Stop { .. })
                || !offered_way(&st.heal, st.ep.plan(), s, &mut how[s])
            {
                return end(&mut st, trust);
            }
            let since = st.ep.now();
            let prev = s.checked_sub(1).and_then(|p| written[p].as_ref());
            let result = attempt(st.ep, s, how[s], &outputs, prev, Detectors::ALL);
            match result {
                Attempt::Skipped => {
                    s += 1;
                    continue;
                }
                Attempt::Ok(v, call) => {
                    // The monitor sees the call that was made, not the plan's.
                    let Sent { tool, args } = call.clone();
                    let required = tool_spec(st.ep.plan(), &tool)
                        .map(ToolSpec::required)
                        .unwrap_or_default();
                    sent[s] = Some(call);
                    let options = st.options(Some(&tool), how[s], None, &outputs);
                    let usage = Amounts {
                        latency_ms: st.ep.now() - since,
                        ..Amounts::default()
                    };
                    // The cross-check runs before the call is reported: two sources that disagree
                    // are the monitor's contradiction signal on this call, not a later verdict.
                    let mut verifier = "cross_check";
                    let mut judgement = sent[s]
                        .clone()
                        .and_then(|c| cross_check(st.ep, s, how[s], &v, &c));
                    // A contested step's retry is a third reading: one that brings back the
                    // value first read says the change did not last; one that agrees with the
                    // differing reading says it did (the core decides whether that settles the
                    // step: not over a confirmed value). A retry that agrees with neither
                    // leaves the step contested (the run claims nothing over it).
                    if judgement.is_none()
                        && let Some((m, old, differing)) = &audited
                        && *m == s
                        && st.heal.contested().contains(&Some(s as u32))
                    {
                        if same_reading(st.ep.plan(), &tool, old, &v) {
                            verifier = "confirmed_value";
                            judgement = Some(Judgement::Accept);
                        } else if differing
                            .as_ref()
                            .is_some_and(|y| same_reading(st.ep.plan(), &tool, y, &v))
                        {
                            verifier = THIRD_READ_VERIFIER;
                            judgement = Some(Judgement::Accept);
                        }
                    }
                    let signal = match &judgement {
                        Some(Judgement::Reject { reason }) => Some(Signal::Contradiction {
                            detail: reason.clone(),
                        }),
                        Some(Judgement::Accept | Judgement::Uncertain { .. }) | None => None,
                    };
                    let now = st.ep.now();
                    let d = st.heal.decide(
                        Observation::ToolFinished {
                            step: Some(s as u32),
                            call: ToolCall {
                                tool: &tool,
                                args: &args,
                                outcome: CallOutcome::Returned(&v),
                                required: &required,
                                repaired: how[s].fix_args,
                            },
                            signal,
                            options,
                            usage,
                        },
                        now,
                    );
                    match (d, judgement) {
                        (StepAction::Proceed { .. }, None) => {
                            written[s] = Some(Written::Call { tool, args });
                            outputs[s] = Some(v);
                            s += 1;
                            continue;
                        }
                        (StepAction::Proceed { .. }, Some(judgement)) => {
                            // Recorded in the trace; an acceptance settles the step's failures.
                            let options = st.options(Some(&tool), how[s], None, &outputs);
                            let now = st.ep.now();
                            let d = st.heal.decide(
                                Observation::Verified {
                                    step: Some(s as u32),
                                    verifier,
                                    judgement,
                                    options,
                                },
                                now,
                            );
                            if matches!(d, StepAction::Proceed { .. }) {
                                written[s] = Some(Written::Call { tool, args });
                                outputs[s] = Some(v);
                                s += 1;
                                continue;
                            }
                            d
                        }
                        (other, _) => other,
                    }
                }
                Attempt::Failed(f) => {
                    let mut options = st.options(f.tool.as_deref(), how[s], f.repair, &outputs);
                    if matches!(f.signal, Signal::UnknownTool { .. }) {
                        // The tool the model called is not on offer: nothing is its equivalent
                        // source. (The step's own tool's substitute would be a correction from
                        // the plan; the gateway, which knows substitutes by the called tool's
                        // name, has none to offer either.)
                        options.substitute = None;
                    }
                    let usage = Amounts {
                        latency_ms: st.ep.now() - since,
                        ..Amounts::default()
                    };
                    let now = st.ep.now();
                    match &f.called {
                        Some((tool, args, result)) => {
                            if let Some(Value::String(b)) = result {
                                last_body[s] = Some(b.clone());
                            } else if let Some(v) = result {
                                last_body[s] = Some(v.to_string());
                            }
                            if result.is_some() {
                                // The call whose body an output repair would work on.
                                sent[s] = Some(Sent {
                                    tool: tool.clone(),
                                    args: args.clone(),
                                });
                            }
                            let required = tool_spec(st.ep.plan(), tool)
                                .map(ToolSpec::required)
                                .unwrap_or_default();
                            let outcome = match result {
                                Some(v) => CallOutcome::Returned(v),
                                None => CallOutcome::Failed { error: &f.message },
                            };
                            st.heal.decide(
                                Observation::ToolFinished {
                                    step: Some(s as u32),
                                    call: ToolCall {
                                        tool,
                                        args,
                                        outcome,
                                        required: &required,
                                        repaired: how[s].fix_args,
                                    },
                                    signal: f.core_signal(),
                                    options,
                                    usage,
                                },
                                now,
                            )
                        }
                        None => st.heal.decide(
                            Observation::ModelFinished {
                                step: Some(s as u32),
                                signal: f.core_signal(),
                                options,
                                usage,
                            },
                            now,
                        ),
                    }
                }
            }
        };
        // A directive may bring another (a repaired body the cross-check rejects): each is
        // carried out in turn.
        let mut next = Some(directive);
        while let Some(directive) = next.take() {
            match directive {
                StepAction::Proceed { .. } => how[s].regenerate = true,
                StepAction::Recover { class, action, .. } => {
                    st.ep.report_class(s, class);
                    st.ep.charge_recovery();
                    let model_side = class.is_model_side();
                    match action {
                        RecoveryAction::Retry { delay_ms, .. } => {
                            st.ep.wait(delay_ms);
                            how[s].regenerate = model_side;
                        }
                        RecoveryAction::Repair { target } => match target {
                            RepairTarget::Arguments => {
                                how[s].fix_args = true;
                                how[s].regenerate = true;
                            }
                            RepairTarget::ToolChoice => {
                                // The model writes the call again, told the tool it chose is
                                // not on offer (a re-ask).
                                how[s].regenerate = true;
                            }
                            RepairTarget::Output => {
                                let body_tool =
                                    sent[s].as_ref().map(|c| c.tool.clone()).unwrap_or_default();
                                let repaired = last_body[s]
                                    .as_deref()
                                    .map(|b| repair_output(st.ep.plan(), &body_tool, b));
                                let checked = repaired.map(|r| {
                                    r.and_then(|v| {
                                        check_body(
                                            st.ep.plan(),
                                            &body_tool,
                                            &v,
                                            Detectors::ALL,
                                            st.ep.data_now(),
                                        )
                                        .map(|()| v)
                                        .map_err(|f| f.message)
                                    })
                                });
                                match checked {
                                    Some(Ok(v)) => {
                                        // A repaired body is an output like any other: its values
                                        // are cross-checked before they are used. Without a second
                                        // source or read (a local tool) the repair's own check (it parsed, the declared
                                        // fields are there) reads the shape, not the values: it
                                        // cannot tell whether they are right.
                                        // With the call whose body was repaired.
                                        let (verifier, judgement) = match sent[s]
                                            .clone()
                                            .and_then(|c| cross_check(st.ep, s, how[s], &v, &c))
                                        {
                                            Some(j) => ("cross_check", j),
                                            None => (
                                                "repair",
                                                Judgement::Uncertain {
                                                    reason:
                                                        "no second source or read: the repair's \
                                                                 check reads the shape, not the \
                                                                 values"
                                                            .into(),
                                                },
                                            ),
                                        };
                                        let options =
                                            st.options(Some(&body_tool), how[s], None, &outputs);
                                        let now = st.ep.now();
                                        let d = st.heal.decide(
                                            Observation::Verified {
                                                step: Some(s as u32),
                                                verifier,
                                                judgement,
                                                options,
                                            },
                                            now,
                                        );
                                        match d {
                                            StepAction::Proceed { .. } => {
                                                outputs[s] = Some(v);
                                                s += 1;
                                                continue 'steps;
                                            }
                                            StepAction::Recover { .. } => next = Some(d),
                                            StepAction::Stop { .. } => {
                                                return end(&mut st, trust);
                                            }
                                        }
                                    }
                                    Some(Err(_)) | None => {
                                        // Refused: fetch the body again next time.
                                        how[s].regenerate = false;
                                    }
                                }
                            }
                            RepairTarget::Request => how[s].regenerate = true,
                        },
                        RecoveryAction::Substitute { .. } => {
                            how[s].substitute = true;
                            how[s].regenerate = true;
                            // The primary's data is known to be old: checking the substitute
                            // back against it says nothing. Every other cause leaves the primary
                            // as the one source to check the substitute against.
                            how[s].trust_substitute = class == FailureClass::StaleContext;
                        }
                        RecoveryAction::Replan => {
                            st.ep.replan(how[s].writer);
                            how[s].regenerate = true;
                            if let Some(m) = outputs.iter().position(Option::is_none)
                                && m < s
                            {
                                s = m;
                            }
                        }
                        RecoveryAction::Refresh => {
                            how[s].fresh = true;
                            how[s].regenerate = false;
                        }
                        RecoveryAction::Escalate { .. } => {
                            how[s].writer = Writer::Fallback;
                            how[s].regenerate = true;
                            if class == FailureClass::PlanningFailure {
                                st.ep.replan(Writer::Fallback);
                                if let Some(m) = outputs.iter().position(Option::is_none)
                                    && m < s
                                {
                                    s = m;
                                    how[s].writer = Writer::Fallback;
                                }
                            }
                        }
                        RecoveryAction::Degrade | RecoveryAction::Terminate => {
                            return end(&mut st, trust);
                        }
                    }
                }
                StepAction::Stop { .. } => return end(&mut st, trust),
            }
        }
    }
    let now = st.ep.now();
    let outcome = st.heal.finish(now);
    trust.apply(&st.heal.take_trust_evidence(), &trust_config);
    let answer = if outcome.status == RunStatus::Complete {
        resolve_answer(st.ep.plan(), &outputs).ok()
    } else {
        None
    };
    Ended {
        answer,
        trace: want_trace.then(|| st.heal.trace().to_jsonl()),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// Issue 32: the grounding check's evidence is the user's message(s) and the results so
    /// far. Changing every value of the plan's calls changes nothing in it, and a value only
    /// the plan holds is ungrounded.
    #[test]
    fn grounding_reads_no_plan_value() {
        use crate::task::ArgSrc;
        let task = &crate::task::builtin(1)[0];
        let outputs = vec![Some(serde_json::json!({"city": "Kenya City"})), None, None];
        let before = grounding_evidence(&task.plan, &outputs);
        let mut changed = task.plan.clone();
        for st in &mut changed.steps {
            for (_, src) in &mut st.args {
                if let ArgSrc::Lit(v) = src {
                    *v = Value::String("Atlantis".into());
                }
            }
        }
        assert_eq!(before, grounding_evidence(&changed, &outputs));
        // A value in the plan (here: put there) but in no message nor result is ungrounded...
        let call = serde_json::json!({"country": "Atlantis"});
        assert!(!ungrounded_arguments(&call, &grounding_evidence(&changed, &outputs)).is_empty());
        // ...and the prompt's own values, and earlier results, ground a call.
        let country = task.plan.steps[0].args[0].1.clone();
        let ArgSrc::Lit(country) = country else {
            panic!("the built-in task starts from a literal")
        };
        assert!(task.plan.prompt[0].contains(country.as_str().unwrap()));
        let ok = serde_json::json!({"country": country, "unit": "c_to_f"});
        assert!(ungrounded_arguments(&ok, &before).is_empty());
    }

    #[test]
    fn cut_bodies_are_seen_and_refused() {
        assert!(is_cut(r#"{"a": [1, 2"#));
        assert!(is_cut(r#"{"a": "x}"#));
        assert!(!is_cut(r#"{'a': '}'}"#));
        let plan = &crate::task::builtin(1)[0].plan;
        let t = "geo.capital";
        assert!(repair_output(plan, t, r#"{"city": "Fra"#).is_err());
        let fixed = repair_output(plan, t, "Sure! ```json\n{'city': 'France City'}\n```").unwrap();
        assert_eq!(fixed["city"], "France City");
        let mapped = repair_output(plan, t, r#"{"city_v2": "Paris"}"#).unwrap();
        assert_eq!(mapped["city"], "Paris");
        assert!(repair_output(plan, t, r#"{"f12": "Paris"}"#).is_err());
    }
}
