//! The data plane of the live-model bench (`selfheal bench --live`): the catalogue's tools
//! misbehaving as a [`crate::faults`] schedule says, a simulated clock and cost counters.
//!
//! The simulated benchmark no longer runs on this module: it runs on [`crate::exec`], whose
//! truth and schedule are private. This one stays for the live runner in `selfheal-runtime`,
//! where the model under test, not a simulated strategy, makes the calls.
//!
//! Every strategy talks to the world only through [`Env`], so they all meet the same faults and
//! pay the same prices. What a strategy can *see* is what a real client sees: an error raised by
//! the tool, or a body that its own code parses. Whether it looks further (freshness, a second
//! source) is the strategy's business.

use serde_json::{Value, json};

use crate::catalogue::{Group, Task, args_object, extract, resolve_present, truth};
use crate::faults::{Fault, FaultKind, Persistence, Signalling};

/// Simulated latencies, in milliseconds.
pub mod latency {
    /// An external tool call.
    pub const TOOL: u64 = 150;
    /// A local calculator call.
    pub const LOCAL: u64 = 2;
    /// A timed-out call.
    pub const TIMEOUT: u64 = 10_000;
    /// A model call that writes one tool call.
    pub const MODEL: u64 = 600;
    /// A planning model call.
    pub const PLAN: u64 = 900;
    /// A call to the stronger fallback model.
    pub const ESCALATE: u64 = 2_000;
    /// The `Retry-After` of a rate limit.
    pub const RETRY_AFTER: u64 = 2_000;
}

/// Data older than this is stale.
pub const MAX_AGE_MS: u64 = 3_600_000;

/// Counters for the cost model `K = a·M + b·U + c·V + d·R`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Costs {
    /// Model calls (M).
    pub model_calls: u64,
    /// Tool calls (U).
    pub tool_calls: u64,
    /// Verifier calls, including cross-checks (V).
    pub verifier_calls: u64,
    /// Recovery actions (R).
    pub recoveries: u64,
}

/// Which source a step is sent to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Via {
    /// The plan's tool.
    Primary,
    /// The equivalent substitute.
    Substitute,
}

/// How a call is made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct How {
    /// Which source.
    pub via: Via,
    /// Bypass caches.
    pub fresh: bool,
    /// The agent writes the call afresh (a model call), rather than resending the last one.
    pub regenerate: bool,
    /// Arguments go through JSON repair.
    pub repair_args: bool,
    /// The tool name is checked against the plan and re-mapped.
    pub repair_tool: bool,
    /// The call is written by the stronger fallback model.
    pub escalated: bool,
}

impl Default for How {
    fn default() -> Self {
        How {
            via: Via::Primary,
            fresh: false,
            regenerate: true,
            repair_args: false,
            repair_tool: false,
            escalated: false,
        }
    }
}

/// The call the agent wrote.
#[derive(Debug, Clone, PartialEq)]
pub enum Written {
    /// The plan omits this step: nothing is called.
    Skipped,
    /// A call.
    Call {
        /// The tool name.
        tool: String,
        /// The arguments (a string when the agent wrote broken JSON).
        args: Value,
    },
}

/// What a tool call produced, as a client sees it: the same response type as [`crate::exec`]'s.
pub use crate::exec::Response as Outcome;
use crate::exec::raised;

/// A parsed, usable step result.
#[derive(Debug, Clone, PartialEq)]
pub struct Got {
    /// The value passed on.
    pub value: Value,
    /// The parsed body.
    pub body: Value,
    /// The body's `as_of`, if it has one.
    pub as_of_ms: Option<u64>,
}

#[derive(Debug, Clone)]
struct FaultState {
    fault: Fault,
    primary_attempts: u32,
    substitute_attempts: u32,
    agent_attempts: u32,
    plan_escalated: bool,
    met: bool,
}

impl FaultState {
    fn active_after(&self, attempts: u32) -> bool {
        match self.fault.persistence {
            Persistence::Permanent => true,
            Persistence::Transient { k } => attempts <= k,
        }
    }
}

/// One episode's world.
#[derive(Debug, Clone)]
pub struct Env<'a> {
    /// The task.
    pub task: &'a Task,
    faults: Vec<Option<FaultState>>,
    /// Step values produced so far.
    pub values: Vec<Option<Value>>,
    /// The last call written for each step.
    pub written: Vec<Option<Written>>,
    /// Cost counters.
    pub costs: Costs,
    /// The simulated clock, in ms.
    pub clock_ms: u64,
    /// The time at which the world's data was last updated (for `as_of`).
    now_data_ms: u64,
}

impl<'a> Env<'a> {
    /// A fresh world for `task` with `faults` scheduled.
    pub fn new(task: &'a Task, faults: &[Fault]) -> Self {
        let mut fs: Vec<Option<FaultState>> = vec![None; task.steps.len()];
        for f in faults {
            if let Some(slot) = fs.get_mut(f.step) {
                *slot = Some(FaultState {
                    fault: *f,
                    primary_attempts: 0,
                    substitute_attempts: 0,
                    agent_attempts: 0,
                    plan_escalated: false,
                    met: false,
                });
            }
        }
        Env {
            task,
            faults: fs,
            values: vec![None; task.steps.len()],
            written: vec![None; task.steps.len()],
            costs: Costs::default(),
            clock_ms: 0,
            now_data_ms: 1_000_000_000,
        }
    }

    /// Faults that were met (their step was reached).
    pub fn met(&self) -> Vec<Fault> {
        self.faults
            .iter()
            .flatten()
            .filter(|f| f.met)
            .map(|f| f.fault)
            .collect()
    }

    /// Advances the clock.
    pub fn wait(&mut self, ms: u64) {
        self.clock_ms += ms;
    }

    /// Charges the initial planning model call.
    pub fn plan(&mut self) {
        self.costs.model_calls += 1;
        self.clock_ms += latency::PLAN;
    }

    /// Replans: the agent rewrites the plan, so agent-side plan faults count an attempt (and
    /// clear when transient). Charges one planning call.
    pub fn replan(&mut self, escalated: bool) {
        self.plan();
        for f in self.faults.iter_mut().flatten() {
            if f.fault.kind == FaultKind::MissingStep {
                f.agent_attempts = f.agent_attempts.saturating_add(1);
                f.plan_escalated |= escalated;
            }
        }
    }

    /// The first step whose value is missing.
    pub fn first_missing(&self) -> Option<usize> {
        self.values.iter().position(Option::is_none)
    }

    fn agent_fault_active(&mut self, step: usize, how: How, counts: bool) -> Option<Fault> {
        let st = self.faults.get_mut(step)?.as_mut()?;
        if !st.fault.kind.is_agent_side() {
            return None;
        }
        st.met = true;
        if counts && st.fault.kind != FaultKind::MissingStep {
            st.agent_attempts = st.agent_attempts.saturating_add(1);
        }
        if how.escalated || (st.fault.kind == FaultKind::MissingStep && st.plan_escalated) {
            return None;
        }
        let attempts = if st.fault.kind == FaultKind::MissingStep {
            st.agent_attempts.saturating_add(1)
        } else {
            st.agent_attempts
        };
        if !st.active_after(attempts) {
            return None;
        }
        let f = st.fault;
        match f.kind {
            FaultKind::MalformedArgs if how.repair_args && f.repairable => None,
            FaultKind::WrongTool if how.repair_tool => None,
            _ => Some(f),
        }
    }

    /// The agent writes the call for `step` (a model call when `how.regenerate`).
    pub fn write(&mut self, step: usize, how: How) -> Result<Written, String> {
        let s = &self.task.steps[step];
        let regenerate = how.regenerate || self.written[step].is_none();
        if !regenerate && let Some(w) = self.written[step].clone() {
            // Resending the same call: agent faults stay as they were.
            return Ok(w);
        }
        if regenerate {
            self.costs.model_calls += 1;
            self.clock_ms += if how.escalated {
                latency::ESCALATE
            } else {
                latency::MODEL
            };
        }
        let fault = self.agent_fault_active(step, how, regenerate);
        if fault.is_some_and(|f| f.kind == FaultKind::MissingStep) {
            self.written[step] = Some(Written::Skipped);
            return Ok(Written::Skipped);
        }
        let args = resolve_present(s, &self.values)?;
        let tool = match via_name(s.group, how.via) {
            Some(t) => t.to_owned(),
            None => s.group.primary().to_owned(),
        };
        let mut written = Written::Call {
            tool,
            args: args_object(s.group, &args),
        };
        if let Some(f) = fault {
            written = match (f.kind, f.signalling) {
                (FaultKind::MalformedArgs, _) => {
                    let text = args_object(s.group, &args).to_string();
                    Written::Call {
                        tool: s.group.primary().to_owned(),
                        args: Value::String(format!("{},", &text[..text.len().saturating_sub(1)])),
                    }
                }
                (FaultKind::WrongTool, Signalling::Explicit) => Written::Call {
                    tool: format!("{}_v2", s.group.primary()),
                    args: args_object(s.group, &args),
                },
                (FaultKind::WrongTool, Signalling::Implicit) => Written::Call {
                    tool: sibling(s.group).to_owned(),
                    args: args_object(s.group, &args),
                },
                (FaultKind::Repetition, _) => match self.written[step - 1].clone() {
                    Some(w @ Written::Call { .. }) => w,
                    _ => written,
                },
                _ => written,
            };
        }
        self.written[step] = Some(written.clone());
        Ok(written)
    }

    /// Executes a written call for `step`. Counts the tool call and its latency.
    pub fn execute(&mut self, step: usize, written: &Written, how: How) -> Outcome {
        let Written::Call { tool, args } = written else {
            return Outcome::Raised {
                message: "nothing was called".into(),
                status: None,
                retry_after_ms: None,
                timeout: false,
            };
        };
        let group = self.task.steps[step].group;
        self.costs.tool_calls += 1;
        self.clock_ms += if group.is_external() {
            latency::TOOL
        } else {
            latency::LOCAL
        };
        // Which group does the named tool belong to?
        let target = Group::ALL
            .into_iter()
            .find(|g| g.primary() == tool || g.substitute() == Some(tool.as_str()));
        let Some(target) = target.or_else(|| (tool == sibling(group)).then_some(group)) else {
            return raised(format!("unknown tool `{tool}`"), Some(404));
        };
        let Some(obj) = args.as_object() else {
            return raised(
                "invalid arguments: expected a JSON object (got a string that is not valid JSON)"
                    .into(),
                Some(400),
            );
        };
        let argv: Vec<Value> = target
            .params()
            .iter()
            .map(|p| obj.get(*p).cloned().unwrap_or(Value::Null))
            .collect();
        let truth_body = match truth(target, &argv) {
            Ok(b) => b,
            Err(e) => return raised(e, Some(400)),
        };
        let field = target.field();
        let via = if Some(tool.as_str()) == group.substitute() {
            Via::Substitute
        } else {
            Via::Primary
        };
        let mut body = truth_body.clone();
        let is_sibling = tool == sibling(group);
        if is_sibling {
            skew(&mut body, field, 1.07);
        }
        let mut as_of = self.now_data_ms - 60_000;
        // Tool-side faults.
        if target == group
            && let Some(st) = self.faults[step].as_mut()
            && !st.fault.kind.is_agent_side()
        {
            st.met = true;
            let f = st.fault;
            let active = match via {
                Via::Primary => {
                    st.primary_attempts += 1;
                    let a = st.primary_attempts;
                    match f.kind {
                        FaultKind::Stale if how.fresh => {
                            matches!(f.persistence, Persistence::Permanent)
                        }
                        _ => st.active_after(a),
                    }
                }
                Via::Substitute => {
                    st.substitute_attempts += 1;
                    f.correlated && st.active_after(st.substitute_attempts)
                }
            };
            if active {
                match f.kind {
                    FaultKind::Timeout => {
                        self.clock_ms += latency::TIMEOUT;
                        return Outcome::Raised {
                            message: format!("`{tool}` timed out after {} ms", latency::TIMEOUT),
                            status: None,
                            retry_after_ms: None,
                            timeout: true,
                        };
                    }
                    FaultKind::Exception => {
                        return raised(
                            "500 Internal Server Error: upstream connection reset".into(),
                            Some(500),
                        );
                    }
                    FaultKind::RateLimit => {
                        return Outcome::Raised {
                            message: "429 Too Many Requests: rate limit exceeded, retry after 2 s"
                                .into(),
                            status: Some(429),
                            retry_after_ms: Some(latency::RETRY_AFTER),
                            timeout: false,
                        };
                    }
                    FaultKind::Unavailable => match f.signalling {
                        Signalling::Explicit => {
                            return raised("503 Service Unavailable".into(), Some(503));
                        }
                        Signalling::Implicit => body = json!({"error": "service unavailable"}),
                    },
                    FaultKind::Malformed => match f.signalling {
                        Signalling::Explicit => {
                            return raised(
                                "502 Bad Gateway: upstream sent an invalid body".into(),
                                Some(502),
                            );
                        }
                        Signalling::Implicit => {
                            let text = body.to_string().replacen('"', "'", 2).replacen(':', "", 1);
                            return Outcome::Returned { body: text };
                        }
                    },
                    FaultKind::Empty => match f.signalling {
                        Signalling::Explicit => {
                            return raised("404 Not Found: no results".into(), Some(404));
                        }
                        Signalling::Implicit => {
                            body = if field == "results" {
                                json!({"results": []})
                            } else {
                                json!({ field: null })
                            };
                        }
                    },
                    FaultKind::Truncated => {
                        let text = with_as_of(&body, target, as_of).to_string();
                        let cut = text.len() * 2 / 3;
                        let mut end = cut;
                        while !text.is_char_boundary(end) {
                            end -= 1;
                        }
                        return Outcome::Returned {
                            body: text[..end].to_owned(),
                        };
                    }
                    FaultKind::SchemaDrift => {
                        if let Some(o) = body.as_object_mut()
                            && let Some(v) = o.remove(field)
                        {
                            o.insert(format!("{field}_v2"), v);
                        }
                    }
                    FaultKind::Stale => {
                        skew(&mut body, field, 0.9);
                        as_of = self.now_data_ms - 86_400_000;
                    }
                    FaultKind::Contradictory => skew(&mut body, field, 1.15),
                    FaultKind::PlausibleWrong => skew(&mut body, field, 1.04),
                    FaultKind::MalformedArgs
                    | FaultKind::WrongTool
                    | FaultKind::MissingStep
                    | FaultKind::Repetition => {}
                }
            }
        }
        Outcome::Returned {
            body: with_as_of(&body, target, as_of).to_string(),
        }
    }

    /// What a plain client does with an outcome: parse the body and read the step's field.
    pub fn client_parse(&self, step: usize, outcome: &Outcome) -> Result<Got, String> {
        match outcome {
            Outcome::Raised { message, .. } => Err(message.clone()),
            Outcome::Returned { body } => {
                let parsed: Value =
                    serde_json::from_str(body).map_err(|e| format!("JSONDecodeError: {e}"))?;
                let group = self.task.steps[step].group;
                let value = extract(group, &parsed)?;
                Ok(Got {
                    value,
                    as_of_ms: parsed.get("as_of").and_then(Value::as_u64),
                    body: parsed,
                })
            }
        }
    }

    /// Whether an `as_of` is too old.
    pub fn is_stale(&self, as_of_ms: Option<u64>) -> bool {
        as_of_ms.is_some_and(|t| self.now_data_ms.saturating_sub(t) > MAX_AGE_MS)
    }

    /// Executes a call a live model wrote, by tool name, against the fault schedule.
    ///
    /// The model chooses its own calls, in its own order, so the step a call serves is inferred:
    /// the first step of the named tool's group that has no value yet (or the group's last
    /// step once all are done). Tool-side faults of that step apply exactly as in the simulated
    /// benchmark; agent-side faults do not (the live model makes its own mistakes). A call whose
    /// body a plain client can read records the step's value. A tool of a group the task does
    /// not use answers from the world's ground truth.
    pub fn execute_named(&mut self, tool: &str, args: &Value) -> Outcome {
        let Some(target) = Group::ALL
            .into_iter()
            .find(|g| g.primary() == tool || g.substitute() == Some(tool))
        else {
            self.costs.tool_calls += 1;
            return raised(format!("unknown tool `{tool}`"), Some(404));
        };
        let steps: Vec<usize> = (0..self.task.steps.len())
            .filter(|&i| self.task.steps[i].group == target)
            .collect();
        let step = steps
            .iter()
            .copied()
            .find(|&i| self.values[i].is_none())
            .or_else(|| steps.last().copied());
        let Some(step) = step else {
            self.costs.tool_calls += 1;
            self.clock_ms += latency::TOOL;
            let Some(obj) = args.as_object() else {
                return raised(
                    "invalid arguments: expected a JSON object".into(),
                    Some(400),
                );
            };
            let argv: Vec<Value> = target
                .params()
                .iter()
                .map(|p| obj.get(*p).cloned().unwrap_or(Value::Null))
                .collect();
            return match truth(target, &argv) {
                Ok(b) => Outcome::Returned {
                    body: with_as_of(&b, target, self.now_data_ms - 60_000).to_string(),
                },
                Err(e) => raised(e, Some(400)),
            };
        };
        let written = Written::Call {
            tool: tool.to_owned(),
            args: args.clone(),
        };
        let out = self.execute(step, &written, How::default());
        if let Ok(got) = self.client_parse(step, &out) {
            self.values[step] = Some(got.value);
        }
        out
    }
}

/// Numeric values compare with a relative tolerance; others exactly.
pub fn values_equal(a: &Value, b: &Value) -> bool {
    match (a.as_f64(), b.as_f64()) {
        (Some(x), Some(y)) => (x - y).abs() <= 1e-6 * x.abs().max(y.abs()).max(1.0),
        _ => a == b,
    }
}

fn via_name(group: Group, via: Via) -> Option<&'static str> {
    match via {
        Via::Primary => Some(group.primary()),
        Via::Substitute => group.substitute(),
    }
}

/// A real tool of the wrong kind that accepts the same arguments (the implicit wrong tool).
pub fn sibling(group: Group) -> &'static str {
    match group {
        Group::Capital => "geo.largest_city",
        Group::Currency => "geo.old_currency",
        Group::Weather => "weather.forecast",
        Group::Fx => "fx.rate_yesterday",
        Group::Ticker => "company.parent_ticker",
        Group::Price => "stock.open_price",
        Group::Search => "search.news",
        Group::Fetch => "docs.summary",
        Group::Convert => "calc.convert_approx",
        Group::Multiply => "calc.multiply_rounded",
    }
}

fn skew(body: &mut Value, field: &str, factor: f64) {
    if let Some(o) = body.as_object_mut()
        && let Some(v) = o.get_mut(field)
    {
        *v = match v.clone() {
            Value::Number(n) => {
                let x = n.as_f64().unwrap_or(0.0) * factor;
                json!(((x * 1000.0).round() / 1000.0) + if x == 0.0 { 1.0 } else { 0.0 })
            }
            Value::String(s) => Value::String(format!(
                "{s}{}",
                if factor > 1.0 { " North" } else { " Old" }
            )),
            Value::Array(a) => Value::Array(
                a.into_iter()
                    .map(|x| match x {
                        Value::String(s) => Value::String(format!("{s}-x")),
                        other => other,
                    })
                    .collect(),
            ),
            other => other,
        };
    }
}

fn with_as_of(body: &Value, group: Group, as_of: u64) -> Value {
    let mut b = body.clone();
    if group.has_freshness()
        && let Some(o) = b.as_object_mut()
    {
        o.insert("as_of".into(), json!(as_of));
    }
    b
}
