//! The five strategies, each as good as its name allows.
//!
//! | strategy | detects | recovers with |
//! |---|---|---|
//! | `static` | errors a plain client sees (raised errors, unparseable bodies, missing fields) | nothing: the first error fails the task |
//! | `retry-only` | the same | resends the same call up to `R` times per failure, with exponential backoff that honours `Retry-After` |
//! | `react` | the same; the error text (and any error body) goes back to the model | the model reads the text: waits and retries on timeouts and 429s, switches to the equivalent tool on 5xx/404/unavailable, rewrites the call on argument and parse errors, replans on a missing input; `R` actions per failure; no classes, no verifier |
//! | `full-replan` | the same | discards the rest of the plan and replans from scratch, avoiding tools that failed; each replan costs one unit of `R` |
//! | `self-healing` | the above plus the core's monitor (soft failures, duplicates), argument validation against the tool schema, a plan check on the tool name, freshness (`as_of`), and a verifier that cross-checks external values with the equivalent source | the core [`Controller`] with the default policy; `R` actions per failure and the full budget vector |
//!
//! All strategies pay the same prices (see [`crate::env`]) and meet the same schedule.

use serde_json::Value;

use selfheal_core::budget::BudgetLimits;
use selfheal_core::classifier::Signal;
use selfheal_core::controller::{Controller, ControllerConfig, Directive, Observation};
use selfheal_core::monitor::{CallOutcome, ToolCall, canonical_hash};
use selfheal_core::policy::{Options, Policy, RecoveryAction, RepairTarget, RetryConfig};
use selfheal_core::rng::SplitMix64;
use selfheal_core::trace::RunStatus;
use selfheal_core::verifier::Judgement;
use selfheal_core::{Amounts, FailureClass};

use crate::env::{Env, Got, How, Outcome, Via, Written, latency, values_equal};

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
    /// Replan from scratch on any failure.
    #[serde(rename = "full-replan")]
    FullReplan,
    /// The selfheal core.
    #[serde(rename = "self-healing")]
    SelfHealing,
}

impl Strategy {
    /// Every strategy, in report order.
    pub const ALL: [Strategy; 5] = [
        Strategy::Static,
        Strategy::RetryOnly,
        Strategy::React,
        Strategy::FullReplan,
        Strategy::SelfHealing,
    ];

    /// The name used in tables and JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            Strategy::Static => "static",
            Strategy::RetryOnly => "retry-only",
            Strategy::React => "react",
            Strategy::FullReplan => "full-replan",
            Strategy::SelfHealing => "self-healing",
        }
    }

    /// Parses a name.
    pub fn parse(s: &str) -> Option<Strategy> {
        Strategy::ALL.into_iter().find(|x| x.as_str() == s)
    }
}

/// How an episode ended.
#[derive(Debug, Clone, PartialEq)]
pub struct Ended {
    /// The answer, when the strategy returned one as complete.
    pub answer: Option<Value>,
    /// Control-plane trace (JSON Lines), for the self-healing strategy.
    pub trace: Option<String>,
}

fn backoff(rng: &mut SplitMix64, attempt: u32, retry_after_ms: Option<u64>) -> u64 {
    RetryConfig::default().delay_ms(attempt, retry_after_ms, rng)
}

fn retry_after(o: &Outcome) -> Option<u64> {
    match o {
        Outcome::Raised { retry_after_ms, .. } => *retry_after_ms,
        Outcome::Returned { .. } => None,
    }
}

/// Writes and executes one step as a plain client: `Ok(value)`, `Err((message, outcome))`.
fn attempt(
    env: &mut Env<'_>,
    s: usize,
    how: How,
) -> Result<Option<Got>, (String, Option<Outcome>)> {
    let w = env.write(s, how).map_err(|e| (e, None))?;
    if w == Written::Skipped {
        return Ok(None);
    }
    let out = env.execute(s, &w, how);
    env.client_parse(s, &out)
        .map(Some)
        .map_err(|e| (with_body(e, &out), Some(out)))
}

fn with_body(message: String, out: &Outcome) -> String {
    match out {
        Outcome::Returned { body } if message.starts_with("KeyError") => {
            format!("{message} in {body}")
        }
        Outcome::Returned { .. } | Outcome::Raised { .. } => message,
    }
}

fn finish(env: &Env<'_>) -> Ended {
    let answer = env.values.last().cloned().flatten();
    Ended {
        answer,
        trace: None,
    }
}

/// `static`: run the plan; the first error ends the task.
pub fn run_static(env: &mut Env<'_>) -> Ended {
    env.plan();
    for s in 0..env.task.steps.len() {
        match attempt(env, s, How::default()) {
            Ok(v) => env.values[s] = v.map(|g| g.value),
            Err(_) => {
                return Ended {
                    answer: None,
                    trace: None,
                };
            }
        }
    }
    finish(env)
}

/// `retry-only`: resend the same call up to `r` times per failure.
pub fn run_retry_only(env: &mut Env<'_>, r: u32, rng: &mut SplitMix64) -> Ended {
    env.plan();
    for s in 0..env.task.steps.len() {
        let mut tries = 0;
        let mut how = How::default();
        loop {
            match attempt(env, s, how) {
                Ok(v) => {
                    env.values[s] = v.map(|g| g.value);
                    break;
                }
                Err((_, out)) => {
                    if tries >= r {
                        return Ended {
                            answer: None,
                            trace: None,
                        };
                    }
                    tries += 1;
                    env.costs.recoveries += 1;
                    let wait = backoff(rng, tries, out.as_ref().and_then(retry_after));
                    env.wait(wait);
                    how.regenerate = false;
                }
            }
        }
    }
    finish(env)
}

/// `react`: the model reads the error and picks the next action.
pub fn run_react(env: &mut Env<'_>, r: u32, rng: &mut SplitMix64) -> Ended {
    env.plan();
    let n = env.task.steps.len();
    let mut s = 0;
    let mut tries = vec![0u32; n];
    let mut how = vec![How::default(); n];
    while s < n {
        if env.values[s].is_some() {
            s += 1;
            continue;
        }
        match attempt(env, s, how[s]) {
            Ok(v) => {
                env.values[s] = v.map(|g| g.value);
                s += 1;
            }
            Err((message, out)) => {
                if tries[s] >= r {
                    return Ended {
                        answer: None,
                        trace: None,
                    };
                }
                tries[s] += 1;
                env.costs.recoveries += 1;
                let m = message.to_ascii_lowercase();
                let has = |xs: &[&str]| xs.iter().any(|x| m.contains(x));
                if has(&["missing input"]) {
                    env.replan(false);
                    s = env.first_missing().unwrap_or(s);
                    continue;
                }
                if has(&["timed out", "429", "rate limit", "connection reset"]) {
                    let wait = backoff(rng, tries[s], out.as_ref().and_then(retry_after));
                    env.wait(wait);
                } else if has(&["503", "unavailable", "404", "502", "500", "not found"])
                    && env.task.steps[s].group.substitute().is_some()
                {
                    how[s].via = Via::Substitute;
                }
                // The model writes the next call with the error in view.
                how[s].regenerate = true;
            }
        }
    }
    finish(env)
}

/// `full-replan`: on any failure, replan from scratch, avoiding tools that failed.
pub fn run_full_replan(env: &mut Env<'_>, r: u32) -> Ended {
    env.plan();
    let n = env.task.steps.len();
    let mut replans = vec![0u32; n];
    let mut avoid = vec![false; n];
    let mut s = 0;
    while s < n {
        let how = How {
            via: if avoid[s] && env.task.steps[s].group.substitute().is_some() {
                Via::Substitute
            } else {
                Via::Primary
            },
            ..How::default()
        };
        match attempt(env, s, how) {
            Ok(v) => {
                env.values[s] = v.map(|g| g.value);
                s += 1;
            }
            Err((_, out)) => {
                if replans[s] >= r {
                    return Ended {
                        answer: None,
                        trace: None,
                    };
                }
                replans[s] += 1;
                env.costs.recoveries += 1;
                if out.is_some() {
                    avoid[s] = true;
                }
                env.replan(false);
                for v in env.values.iter_mut() {
                    *v = None;
                }
                s = 0;
            }
        }
    }
    finish(env)
}

/// The budget vector the self-healing strategy runs under for a plan of `n` steps at per-failure
/// budget `r`.
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

struct Step<'e, 'a> {
    env: &'e mut Env<'a>,
    ctl: Controller,
    rng: SplitMix64,
}

impl Step<'_, '_> {
    fn now(&self) -> u64 {
        self.env.clock_ms
    }

    fn options(&self, s: usize, how: How, repair: Option<RepairTarget>) -> Options {
        let group = self.env.task.steps[s].group;
        Options {
            repair,
            substitute: match how.via {
                Via::Primary => group.substitute().map(str::to_owned),
                Via::Substitute => None,
            },
            refreshable: group.has_freshness(),
            can_replan: true,
            fallback_model: (!how.escalated).then(|| "fallback-model".to_owned()),
            human_available: false,
            retry_safe: true,
            partial_result: self.env.values.iter().any(Option::is_some),
        }
    }

    fn model_failed(
        &mut self,
        s: usize,
        signal: Signal,
        how: How,
        repair: Option<RepairTarget>,
        since: u64,
    ) -> Directive {
        let options = self.options(s, how, repair);
        let usage = Amounts {
            latency_ms: self.now() - since,
            ..Amounts::default()
        };
        let now = self.now();
        self.ctl.observe(
            Observation::ModelFinished {
                step: Some(s as u32),
                signal: Some(signal),
                options,
                usage,
            },
            now,
            &mut self.rng,
        )
    }
}

/// Reads what went wrong in a body a plain client could not use.
fn diagnose_body(field: &str, message: &str, body: &str) -> (Signal, Option<RepairTarget>) {
    if message.starts_with("JSONDecodeError") {
        let opens = body.matches(['{', '[']).count();
        let closes = body.matches(['}', ']']).count();
        if opens > closes {
            return (Signal::TruncatedOutput, Some(RepairTarget::Output));
        }
        return (
            Signal::MalformedOutput {
                detail: message.to_owned(),
            },
            Some(RepairTarget::Output),
        );
    }
    let parsed: Value = serde_json::from_str(body).unwrap_or(Value::Null);
    if let Some(err) = parsed.get("error").and_then(Value::as_str) {
        return (
            Signal::Exception {
                message: err.to_owned(),
            },
            None,
        );
    }
    if let Some(o) = parsed.as_object()
        && o.keys().any(|k| k != field && k.starts_with(field))
    {
        return (
            Signal::SchemaDrift {
                detail: format!(
                    "expected `{field}`, found {:?}",
                    o.keys().collect::<Vec<_>>()
                ),
            },
            Some(RepairTarget::Output),
        );
    }
    (Signal::EmptyOutput, None)
}

/// `self-healing`: the core controller with `policy` (the default policy when `None`), its
/// actions per failure capped at `r` — or at the policy's own cap, if that is lower.
pub fn run_self_healing(
    env: &mut Env<'_>,
    policy: Option<&Policy>,
    r: u32,
    seed: u64,
    want_trace: bool,
) -> Ended {
    let n = env.task.steps.len();
    let base = policy.cloned().unwrap_or_default();
    let policy = Policy {
        max_actions_per_failure: Some(base.max_actions_per_failure.map_or(r, |cap| cap.min(r))),
        ..base
    };
    let config = ControllerConfig {
        policy,
        budget: self_healing_budget(n, r),
        ..ControllerConfig::default()
    };
    let Ok(ctl) = Controller::new(config) else {
        return Ended {
            answer: None,
            trace: None,
        };
    };
    env.plan();
    let task_id = env.task.id as u64;
    let mut st = Step {
        env,
        ctl,
        rng: SplitMix64::new(seed ^ task_id.rotate_left(17)),
    };
    let mut how = vec![How::default(); n];
    let mut s = 0;
    let mut last_out: Option<Outcome> = None;
    'steps: while s < n {
        if st.env.values[s].is_some() {
            // Already produced before a replan sent us back: keep it.
            s += 1;
            continue;
        }
        let since = st.now();
        let directive = match st.env.write(s, how[s]) {
            Err(message) => st.model_failed(
                s,
                Signal::MissingStep { detail: message },
                how[s],
                None,
                since,
            ),
            Ok(Written::Skipped) => {
                st.env.values[s] = None;
                s += 1;
                continue;
            }
            Ok(Written::Call { tool, args }) => {
                let group = st.env.task.steps[s].group;
                let schema_ok = args
                    .as_object()
                    .is_some_and(|o| group.params().iter().all(|p| o.contains_key(*p)));
                let repeated = s > 0
                    && matches!(&st.env.written[s - 1], Some(Written::Call { tool: t, args: a })
                        if *t == tool && canonical_hash(a) == canonical_hash(&args));
                if repeated {
                    st.model_failed(s, Signal::Repetition, how[s], None, since)
                } else if tool != group.primary() && Some(tool.as_str()) != group.substitute() {
                    let signal = if tool == crate::env::sibling(group) {
                        Signal::ToolMismatch { tool }
                    } else {
                        Signal::UnknownTool { name: tool }
                    };
                    st.model_failed(s, signal, how[s], Some(RepairTarget::ToolChoice), since)
                } else if !schema_ok {
                    let signal = Signal::InvalidArguments {
                        errors: vec![format!(
                            "arguments of `{tool}` are not a JSON object with {:?}",
                            group.params()
                        )],
                    };
                    st.model_failed(s, signal, how[s], Some(RepairTarget::Arguments), since)
                } else {
                    let w = Written::Call {
                        tool: tool.clone(),
                        args: args.clone(),
                    };
                    let out = st.env.execute(s, &w, how[s]);
                    let parsed = st.env.client_parse(s, &out);
                    let (signal, repair) = match (&out, &parsed) {
                        (Outcome::Raised { timeout: true, .. }, _) => (Some(Signal::Timeout), None),
                        (
                            Outcome::Raised {
                                message,
                                status,
                                retry_after_ms,
                                ..
                            },
                            _,
                        ) => (
                            Some(match status {
                                Some(code) => Signal::HttpStatus {
                                    status: *code,
                                    retry_after_ms: *retry_after_ms,
                                    message: message.clone(),
                                },
                                None => Signal::Exception {
                                    message: message.clone(),
                                },
                            }),
                            None,
                        ),
                        (Outcome::Returned { body }, Err(message)) => {
                            let (sig, rep) = diagnose_body(group.field(), message, body);
                            (Some(sig), rep)
                        }
                        (Outcome::Returned { .. }, Ok(got)) if st.env.is_stale(got.as_of_ms) => (
                            Some(Signal::Stale {
                                age_ms: st.env.clock_ms,
                                max_age_ms: crate::env::MAX_AGE_MS,
                            }),
                            None,
                        ),
                        (Outcome::Returned { .. }, Ok(_)) => (None, None),
                    };
                    let result_value = match (&out, &parsed) {
                        (_, Ok(g)) => g.body.clone(),
                        (Outcome::Returned { body }, Err(_)) => {
                            serde_json::from_str(body).unwrap_or(Value::String(body.clone()))
                        }
                        (Outcome::Raised { .. }, Err(_)) => Value::Null,
                    };
                    let error_text = match &out {
                        Outcome::Raised { message, .. } => Some(message.clone()),
                        Outcome::Returned { .. } => None,
                    };
                    let call = ToolCall {
                        tool: &tool,
                        args: &args,
                        outcome: match &error_text {
                            Some(e) => CallOutcome::Failed { error: e },
                            None => CallOutcome::Returned(&result_value),
                        },
                        required: &[],
                        repaired: how[s].repair_args,
                    };
                    let options = st.options(s, how[s], repair);
                    let usage = Amounts {
                        latency_ms: st.now() - since,
                        ..Amounts::default()
                    };
                    let now = st.now();
                    last_out = Some(out.clone());
                    let d = st.ctl.observe(
                        Observation::ToolFinished {
                            step: Some(s as u32),
                            call,
                            signal,
                            options,
                            usage,
                        },
                        now,
                        &mut st.rng,
                    );
                    match (d, parsed) {
                        (Directive::Continue { .. }, Ok(got)) => {
                            // Verify external values against the equivalent source.
                            match verify(&mut st, s, how[s], &got) {
                                Some(d @ Directive::Recover { .. })
                                | Some(d @ Directive::Degrade { .. })
                                | Some(d @ Directive::Abort { .. }) => d,
                                Some(Directive::Continue { .. }) | None => {
                                    st.env.values[s] = Some(got.value);
                                    s += 1;
                                    continue 'steps;
                                }
                            }
                        }
                        (d, _) => d,
                    }
                }
            }
        };
        match directive {
            Directive::Continue { .. } => {
                // A success observation without a usable value cannot happen; treat as retry.
                how[s].regenerate = true;
            }
            Directive::Recover { class, action, .. } => {
                st.env.costs.recoveries += 1;
                let model_side = matches!(
                    class,
                    FailureClass::ArgumentInvalid
                        | FailureClass::WrongTool
                        | FailureClass::PlanningFailure
                        | FailureClass::ControlLoop
                );
                match action {
                    RecoveryAction::Retry { delay_ms, .. } => {
                        st.env.wait(delay_ms);
                        how[s].regenerate = model_side;
                    }
                    RecoveryAction::Repair { target } => match target {
                        RepairTarget::Arguments => {
                            how[s].repair_args = true;
                            how[s].regenerate = true;
                        }
                        RepairTarget::ToolChoice => {
                            how[s].repair_tool = true;
                            how[s].regenerate = true;
                        }
                        RepairTarget::Output => {
                            let repaired = last_out.as_ref().map(|o| st.env.repair_parse(s, o));
                            let now = st.now();
                            match repaired {
                                Some(Ok(got)) => {
                                    let d = st.ctl.observe(
                                        Observation::Verified {
                                            step: Some(s as u32),
                                            verifier: "repair",
                                            judgement: Judgement::Accept,
                                            options: Options::default(),
                                        },
                                        now,
                                        &mut st.rng,
                                    );
                                    if matches!(d, Directive::Continue { .. }) {
                                        st.env.values[s] = Some(got.value);
                                        s += 1;
                                        continue 'steps;
                                    }
                                    return end(&mut st, want_trace);
                                }
                                Some(Err(_)) | None => {
                                    // The body was beyond repair: fetch it again next time.
                                    how[s].regenerate = false;
                                }
                            }
                        }
                        RepairTarget::Request => how[s].regenerate = true,
                    },
                    RecoveryAction::Substitute { .. } => {
                        how[s].via = Via::Substitute;
                        how[s].regenerate = true;
                    }
                    RecoveryAction::Replan => {
                        st.env.replan(how[s].escalated);
                        how[s].regenerate = true;
                        if let Some(m) = st.env.first_missing()
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
                        how[s].escalated = true;
                        how[s].regenerate = true;
                        if class == FailureClass::PlanningFailure {
                            st.env.replan(true);
                            if let Some(m) = st.env.first_missing()
                                && m < s
                            {
                                s = m;
                                how[s].escalated = true;
                            }
                        }
                    }
                    RecoveryAction::Degrade | RecoveryAction::Terminate => {
                        return end(&mut st, want_trace);
                    }
                }
            }
            Directive::Degrade { .. } | Directive::Abort { .. } => return end(&mut st, want_trace),
        }
    }
    let now = st.now();
    let outcome = st.ctl.finish(now);
    let answer = if outcome.status == RunStatus::Complete {
        st.env.values.last().cloned().flatten()
    } else {
        None
    };
    Ended {
        answer,
        trace: want_trace.then(|| st.ctl.trace().to_jsonl()),
    }
}

fn end(st: &mut Step<'_, '_>, want_trace: bool) -> Ended {
    let now = st.now();
    st.ctl.finish(now);
    Ended {
        answer: None,
        trace: want_trace.then(|| st.ctl.trace().to_jsonl()),
    }
}

/// Cross-checks an external value against the equivalent source (a verifier call).
fn verify(st: &mut Step<'_, '_>, s: usize, how: How, got: &Got) -> Option<Directive> {
    let group = st.env.task.steps[s].group;
    if !group.is_external() || how.via == Via::Substitute {
        return None;
    }
    st.env.costs.verifier_calls += 1;
    st.env.clock_ms += latency::TOOL;
    let other = st.env.cross_check(s);
    let judgement = match other {
        Some(v) if values_equal(&v, &got.value) => Judgement::Accept,
        Some(v) => Judgement::Reject {
            reason: format!(
                "`{}` says {} but `{}` says {}",
                group.primary(),
                got.value,
                group.substitute().unwrap_or("?"),
                v
            ),
        },
        None => Judgement::Uncertain {
            reason: "the equivalent source did not answer".into(),
        },
    };
    let options = st.options(s, how, None);
    let now = st.now();
    let d = st.ctl.observe(
        Observation::Verified {
            step: Some(s as u32),
            verifier: "cross_check",
            judgement,
            options,
        },
        now,
        &mut st.rng,
    );
    Some(d)
}
