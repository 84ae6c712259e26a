//! Tool and model execution: the only code that reads the world's truth and the fault schedule.
//!
//! Why one module: a benchmark whose verifier or repair can see the answer measures nothing.
//! [`Episode`] owns the truth, the drawn faults and their state in private fields; a strategy
//! holds a `&mut Episode` and can only do what a client can — read the plan, have the model write
//! a call, execute a call and look at the [`ToolResponse`] (status, bytes, latency), wait, and pay.
//! A cross-check is an ordinary call of the substitute through [`Episode::call`]; output repair
//! works on the bytes [`Episode::call`] returned; escalation is a call of a separate fallible
//! model in [`Episode::write`].
//!
//! Two calls let the episode keep score of the detectors without showing them anything:
//! [`Episode::report_verdict`] (a verifier accepted or rejected a response) and
//! [`Episode::report_class`] (the classifier inferred a class). The episode compares them with
//! what it knows and counts false alarms, misses and the confusion matrix.

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::{Map, Value, json};

use selfheal_core::{FailureClass, Rng, SplitMix64, canonical_hash};

use crate::catalogue;
use crate::faultmodel::{
    ArgsOp, AsOf, Effect, FaultModel, Injected, MalformOp, Rates, RenameOp, Target, ToolOp,
};
use crate::task::{
    ANSWER_TOLERANCE, Behaviour, FieldType, Plan, TaskSpec, ToolSpec, get_path, resolve_answer,
    resolve_args,
};

/// Simulated latencies, in milliseconds.
pub mod latency {
    /// An external tool call.
    pub const TOOL: u64 = 150;
    /// A local calculator call.
    pub const LOCAL: u64 = 2;
    /// A model call that writes one tool call.
    pub const MODEL: u64 = 600;
    /// A planning model call.
    pub const PLAN: u64 = 900;
    /// A call to the stronger fallback model.
    pub const ESCALATE: u64 = 2_000;
}

/// How far apart a seed's episodes start on the benchmark's clock (a seed's tasks run one after
/// another, a minute apart): what places an episode in a fault's `window`.
pub const EPISODE_SPACING_MS: u64 = 60_000;

/// Data older than this is stale.
pub const MAX_AGE_MS: u64 = 3_600_000;

/// The world's "now" for `as_of` stamps, unless an episode is set to another
/// ([`Episode::set_data_now`]).
const NOW_DATA_MS: u64 = 1_000_000_000;

/// The field in which a tool with `freshness` stamps when its data was current (milliseconds on
/// the world's clock, [`Episode::data_now`]).
pub const AS_OF: &str = "as_of";

/// Counters for the cost model `K = a·M + b·U + c·V + d·R + e·E`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Costs {
    /// Calls of the agent's own model (M).
    pub model_calls: u64,
    /// Calls of the fallback model (E), priced on their own.
    pub escalated_calls: u64,
    /// Tool calls (U).
    pub tool_calls: u64,
    /// Verifier calls: cross-checks through the substitute (V).
    pub verifier_calls: u64,
    /// Recovery actions (R).
    pub recoveries: u64,
}

/// What a client sees of a tool call.
#[derive(Debug, Clone, PartialEq)]
pub enum Response {
    /// The call raised.
    Raised {
        /// The error message.
        message: String,
        /// The HTTP status, if any.
        status: Option<u16>,
        /// `Retry-After` in ms, if any.
        retry_after_ms: Option<u64>,
        /// Whether it timed out.
        timeout: bool,
    },
    /// The tool returned these bytes.
    Returned {
        /// The body text.
        body: String,
    },
}

/// A tool call's response and what it cost in time.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolResponse {
    /// The response.
    pub response: Response,
    /// Simulated latency, in ms.
    pub latency_ms: u64,
}

/// Why a call is made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Purpose {
    /// To do the step (charged as a tool call).
    Step,
    /// To cross-check a result (charged as a verifier call).
    Verify,
}

/// The call the model wrote.
#[derive(Debug, Clone, PartialEq)]
pub enum Written {
    /// The plan, as the model holds it, has no such step: nothing is called.
    Skipped,
    /// A call.
    Call {
        /// The tool name.
        tool: String,
        /// The arguments (a string when the model wrote broken JSON).
        args: Value,
    },
    /// The model's provider is down (a `provider_wide` outage): the model call itself raised
    /// and nothing was written. Charged as a model call.
    Unavailable {
        /// The error message.
        message: String,
        /// The HTTP status, if any (none: the call timed out).
        status: Option<u16>,
        /// `Retry-After` in ms, if any.
        retry_after_ms: Option<u64>,
    },
}

/// Which model writes a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Writer {
    /// The agent's own model.
    Agent,
    /// The fallback model (escalation).
    Fallback,
}

#[derive(Debug, Clone)]
struct Armed {
    inj: Injected,
    primary_attempts: u32,
    substitute_attempts: u32,
    agent_attempts: u32,
    fixed: bool,
    /// When it first hit (benchmark clock), for faults that clear by time.
    first_hit_ms: Option<u64>,
}

impl Armed {
    /// Whether a fault that clears by time or lives in a window is on at `t` (`None`: it
    /// clears by attempts).
    fn on_in_time(&mut self, spec: &crate::faultmodel::FaultSpec, t: u64) -> Option<bool> {
        if let Some(w) = spec.window {
            return Some(w.contains(t));
        }
        if self.inj.permanent {
            return None;
        }
        let d = spec.duration_ms(self.inj.k)?;
        let first = *self.first_hit_ms.get_or_insert(t);
        Some(t < first.saturating_add(d))
    }
}

/// How the detectors fared against the truth (counted by the episode, never shown).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Tally {
    /// Verdicts on responses that were faithful.
    pub verdicts_on_faithful: u64,
    /// Of those, rejected (false alarms).
    pub false_alarms: u64,
    /// Verdicts on responses that were wrong.
    pub verdicts_on_wrong: u64,
    /// Of those, accepted (misses).
    pub misses: u64,
    /// Cross-checks that could not tell (the other source failed): the value went on unverified.
    pub uncertain: u64,
    /// Injected class (`None`: no fault) → inferred class → count.
    pub confusion: BTreeMap<Option<FailureClass>, BTreeMap<FailureClass, u64>>,
}

/// What the runner keeps of a finished episode.
#[derive(Debug, Clone, PartialEq)]
pub struct EpisodeRecord {
    /// Costs.
    pub costs: Costs,
    /// Simulated latency.
    pub clock_ms: u64,
    /// Detector tallies.
    pub tally: Tally,
    /// Whether nothing went wrong: no fault scheduled and no mistake of the model's own.
    pub clean: bool,
    /// Detector → how many times it fired ([`Episode::report_alarm`]).
    pub alarms: BTreeMap<&'static str, u64>,
}

/// One episode's world.
#[derive(Debug, Clone)]
pub struct Episode<'t> {
    task: &'t TaskSpec,
    model: &'t FaultModel,
    faults: Vec<Armed>,
    rng: SplitMix64,
    costs: Costs,
    clock_ms: u64,
    successes: u32,
    written: Vec<Option<Written>>,
    /// Per step: the injected class of the last fault met there (for the confusion matrix).
    last_fault: Vec<Option<Option<FailureClass>>>,
    /// Steps the model skipped because of a fault, with its class: a later step finds its
    /// input missing, and the cause is here, not at that step.
    skipped: Vec<Option<FailureClass>>,
    /// Per step: whether the last body the step returned was unfaithful to the call.
    last_wrong: Vec<bool>,
    /// Per step: whether a call by name ([`Episode::execute_named`]) has answered it readably.
    answered: Vec<bool>,
    /// The time of day on the world's clock, for `as_of` stamps.
    data_now: u64,
    tally: Tally,
    /// Mistakes the model made on its own (no fault injected).
    mistakes: u32,
    /// When the episode started on the benchmark's clock.
    start_ms: u64,
    alarms: BTreeMap<&'static str, u64>,
}

impl<'t> Episode<'t> {
    /// A fresh world for `task` with `faults` (drawn from `model`) scheduled.
    pub fn new(task: &'t TaskSpec, faults: &[Injected], model: &'t FaultModel, seed: u64) -> Self {
        let n = task.plan.steps.len();
        Episode {
            task,
            model,
            faults: faults
                .iter()
                .filter(|f| f.spec < model.faults.len() && f.step < n)
                .map(|&inj| Armed {
                    inj,
                    primary_attempts: 0,
                    substitute_attempts: 0,
                    agent_attempts: 0,
                    fixed: false,
                    first_hit_ms: None,
                })
                .collect(),
            rng: SplitMix64::new(seed ^ (task.id as u64).rotate_left(29) ^ 0xE1E1_0DE5),
            costs: Costs::default(),
            clock_ms: 0,
            successes: 0,
            written: vec![None; n],
            last_fault: vec![None; n],
            skipped: vec![None; n],
            last_wrong: vec![false; n],
            answered: vec![false; n],
            data_now: NOW_DATA_MS,
            tally: Tally::default(),
            mistakes: 0,
            alarms: BTreeMap::new(),
            start_ms: 0,
        }
    }

    /// Places the episode on the benchmark's clock (ms; the runner sets a seed's `i`-th episode
    /// to `i ×` [`EPISODE_SPACING_MS`]): faults with a `window` are on while the clock is
    /// inside it. A windowed fault in `faults` is armed on every step it applies to. World setup,
    /// like [`Episode::set_data_now`]; a strategy never calls it.
    pub fn start_at(&mut self, ms: u64) {
        self.start_ms = ms;
        let task = self.task;
        let model = self.model;
        let mut extra = Vec::new();
        for f in &self.faults {
            let spec = &model.faults[f.inj.spec];
            if spec.window.is_some() {
                for s in (0..task.plan.steps.len()).filter(|&s| s != f.inj.step) {
                    if spec.applies(task, s) {
                        let mut g = f.clone();
                        g.inj.step = s;
                        extra.push(g);
                    }
                }
            }
        }
        self.faults.extend(extra);
    }

    /// Executes a call of `tool` made by a client that has no plan of its own (a live model that
    /// picks tools by name): the call is taken for the first step whose tool, or its substitute,
    /// is `tool` and that has not been answered readably yet (the last such step once all are).
    /// That step's tool-side faults apply exactly as for [`Episode::call`]; a tool of the task
    /// that no step uses answers faithfully, and an unknown one with a 404.
    pub fn execute_named(&mut self, tool: &str, args: &Value) -> ToolResponse {
        let plan = &self.task.plan;
        let steps: Vec<usize> = (0..plan.steps.len())
            .filter(|&i| {
                plan.step_tool(i)
                    .is_some_and(|t| t.name == tool || t.substitute.as_deref() == Some(tool))
            })
            .collect();
        let step = steps
            .iter()
            .copied()
            .find(|&i| !self.answered[i])
            .or_else(|| steps.last().copied());
        let Some(step) = step else {
            // No step uses it: step 0 only anchors the call (its faults strike its own tools).
            return self.call(0, tool, args, Purpose::Step, false);
        };
        let out = self.call(step, tool, args, Purpose::Step, false);
        if let Response::Returned { body } = &out.response
            && let Ok(v) = serde_json::from_str::<Value>(body)
            && plan
                .read_paths(step)
                .iter()
                .all(|p| get_path(&v, p).is_some_and(|x| !x.is_null()))
        {
            self.answered[step] = true;
        }
        out
    }

    /// The plan: tools on offer and the calls to make. All a client knows about the task.
    pub fn plan(&self) -> &Plan {
        &self.task.plan
    }

    /// The costs so far.
    pub fn costs(&self) -> Costs {
        self.costs
    }

    /// The simulated clock, in ms.
    pub fn now(&self) -> u64 {
        self.clock_ms
    }

    /// The world's clock for `as_of` comparisons (a client knows the time of day).
    pub fn data_now(&self) -> u64 {
        self.data_now
    }

    /// Sets the world's time of day (milliseconds): its tools stamp `as_of` against it. A client
    /// on another clock — a gateway reading the wall clock — sets it to that clock's time, so
    /// that an age on the wire is the age the world meant. Stamps only; no fault changes.
    pub fn set_data_now(&mut self, ms: u64) {
        self.data_now = ms;
    }

    /// Waits.
    pub fn wait(&mut self, ms: u64) {
        self.clock_ms += ms;
    }

    /// Counts one recovery action.
    pub fn charge_recovery(&mut self) {
        self.costs.recoveries += 1;
    }

    /// The initial planning call.
    pub fn plan_call(&mut self) {
        self.costs.model_calls += 1;
        self.clock_ms += latency::PLAN;
    }

    /// The model (or the fallback model) rewrites the plan. A missing step counts an attempt;
    /// the fallback model may fix a permanent one. A replan can fail: with the writer's
    /// `replan_failure` rate the new plan leaves the step out again (no attempt is counted), and
    /// a replan by a model whose provider is down changes nothing.
    pub fn replan(&mut self, writer: Writer) {
        self.charge_model(writer, latency::PLAN);
        if self.model_down(writer).is_some() {
            return;
        }
        let fix = self.fallback_fixes(writer);
        let model = self.model;
        let rates = self.rates(writer);
        if self.rng.next_f64() < rates.replan_failure {
            return;
        }
        for f in &mut self.faults {
            if matches!(model.faults[f.inj.spec].effect, Effect::MissingStep) {
                f.agent_attempts = f.agent_attempts.saturating_add(1);
                f.fixed |= fix(f.inj.permanent);
            }
        }
    }

    /// What a call of `writer`'s model meets now if a provider-wide outage (`provider_wide`)
    /// is on — the error, the time it takes to raise it, its class — only the agent's model is
    /// behind it.
    fn model_down(&self, writer: Writer) -> Option<(Written, u64, Option<FailureClass>)> {
        if writer != Writer::Agent {
            return None;
        }
        let t = self.start_ms + self.clock_ms;
        self.faults.iter().find_map(|f| {
            let spec = self.model.faults.get(f.inj.spec)?;
            if !spec.provider_wide || !spec.window.is_some_and(|w| w.contains(t)) {
                return None;
            }
            let (down, ms) = match &spec.effect {
                Effect::Http {
                    status,
                    message,
                    retry_after_ms,
                } => (
                    Written::Unavailable {
                        message: message.clone(),
                        status: Some(*status),
                        retry_after_ms: *retry_after_ms,
                    },
                    0,
                ),
                Effect::Timeout { ms } => (
                    Written::Unavailable {
                        message: format!("the model call timed out after {ms} ms"),
                        status: None,
                        retry_after_ms: None,
                    },
                    *ms,
                ),
                _ => return None,
            };
            Some((down, ms, spec.class_of(true)))
        })
    }

    fn rates(&self, writer: Writer) -> Rates {
        match writer {
            Writer::Agent => self.model.model.agent,
            Writer::Fallback => self.model.model.fallback,
        }
    }

    /// The model's own mistake on a call it writes with no fault active (issue 32): a draw
    /// from the writer's [`Rates`] — another tool on offer, a wrong or missing argument, a
    /// skipped or repeated step, an answer before the last call. `None`: the call as meant.
    fn own_mistake(
        &mut self,
        s: usize,
        writer: Writer,
        call: &Written,
        outputs: &[Option<Value>],
    ) -> Option<(Written, Option<FailureClass>)> {
        let r = self.rates(writer);
        let (u, pick, ctx) = (
            self.rng.next_f64(),
            self.rng.next_u64(),
            self.rng.next_f64(),
        );
        let Written::Call { tool, args } = call else {
            return None;
        };
        let plan = &self.task.plan;
        let last = s + 1 == plan.steps.len();
        let mut x = u;
        let mut hit = |p: f64| {
            let h = x < p;
            x -= p;
            h
        };
        if hit(if last {
            r.premature_answer
        } else {
            r.skip_step
        }) {
            return Some((Written::Skipped, Some(FailureClass::PlanningFailure)));
        }
        if hit(r.repeat_step) {
            return match s.checked_sub(1).and_then(|p| self.written[p].clone()) {
                Some(w @ Written::Call { .. }) => Some((w, Some(FailureClass::ControlLoop))),
                Some(Written::Skipped | Written::Unavailable { .. }) | None => None,
            };
        }
        if hit(r.wrong_tool) {
            let sibling = plan.step_tool(s).and_then(|t| t.sibling.clone());
            let others: Vec<&str> = plan
                .tools
                .iter()
                .map(|t| t.name.as_str())
                .filter(|n| n != tool)
                .collect();
            let chosen = match sibling.filter(|sb| others.contains(&sb.as_str())) {
                Some(sb) if pick % 2 == 0 || others.len() == 1 => sb,
                _ if !others.is_empty() => others[(pick >> 1) as usize % others.len()].to_owned(),
                _ => return None,
            };
            return Some((
                Written::Call {
                    tool: chosen,
                    args: args.clone(),
                },
                Some(FailureClass::WrongTool),
            ));
        }
        let obj = args.as_object()?;
        if obj.is_empty() {
            return None;
        }
        let key = obj.keys().nth((pick >> 8) as usize % obj.len())?.clone();
        if hit(r.wrong_arg) {
            let current = obj.get(&key).cloned().unwrap_or(Value::Null);
            // From the context: a value of the same kind that the prompt names or an earlier
            // result holds — a grounding check finds it there.
            let mut pool: Vec<Value> = Vec::new();
            for v in self.task.mentions.iter().chain(outputs.iter().flatten()) {
                leaves(v, &mut pool);
            }
            pool.retain(|v| {
                *v != current
                    && matches!(
                        (v, &current),
                        (Value::String(_), Value::String(_)) | (Value::Number(_), Value::Number(_))
                    )
            });
            pool.dedup();
            let wrong = if ctx < r.from_context && !pool.is_empty() {
                pool[(pick >> 20) as usize % pool.len()].clone()
            } else {
                made_up(&current, pick >> 40)
            };
            let mut a = obj.clone();
            a.insert(key, wrong);
            return Some((
                Written::Call {
                    tool: tool.clone(),
                    args: Value::Object(a),
                },
                Some(FailureClass::ArgumentInvalid),
            ));
        }
        if hit(r.missing_arg) {
            let mut a = obj.clone();
            a.remove(&key);
            return Some((
                Written::Call {
                    tool: tool.clone(),
                    args: Value::Object(a),
                },
                Some(FailureClass::ArgumentInvalid),
            ));
        }
        None
    }

    fn charge_model(&mut self, writer: Writer, base: u64) {
        match writer {
            Writer::Agent => {
                self.costs.model_calls += 1;
                self.clock_ms += base;
            }
            Writer::Fallback => {
                self.costs.escalated_calls += 1;
                self.clock_ms += latency::ESCALATE;
            }
        }
    }

    /// Draws whether the fallback model fixes a fault now (`Agent`: never).
    fn fallback_fixes(&mut self, writer: Writer) -> impl Fn(bool) -> bool + use<> {
        let (u_err, u_perm) = (self.rng.next_f64(), self.rng.next_f64());
        let esc = self.model.escalation;
        let on = writer == Writer::Fallback && u_err >= esc.error_rate;
        move |permanent| on && (!permanent || u_perm < esc.fixes_permanent)
    }

    /// A call of `writer`'s model for step `s` that its provider refuses: during a
    /// provider-wide outage (`provider_wide`) the error it raises ([`Written::Unavailable`]),
    /// charged as a model call whose latency (and, for a timeout, its wait) passes, exactly as
    /// [`Episode::write`] meets it. `None`, and nothing charged, when the provider is up. For a
    /// client whose model request is refused before the model reads it (the gateway arm's
    /// upstream answers the outage as an HTTP error).
    pub fn model_unavailable(&mut self, s: usize, writer: Writer) -> Option<Written> {
        let (costs, clock) = (self.costs, self.clock_ms);
        self.charge_model(writer, latency::MODEL);
        let Some((down, ms, class)) = self.model_down(writer) else {
            (self.costs, self.clock_ms) = (costs, clock);
            return None;
        };
        self.clock_ms += ms;
        if let Some(slot) = self.last_fault.get_mut(s) {
            *slot = Some(class);
        }
        Some(down)
    }

    /// The model writes the call for step `s` from the outputs it holds. With `regenerate` false
    /// the last call is resent as it was (no model call).
    pub fn write(
        &mut self,
        s: usize,
        writer: Writer,
        regenerate: bool,
        outputs: &[Option<Value>],
    ) -> Written {
        if !regenerate && let Some(w) = self.written.get(s).cloned().flatten() {
            return w;
        }
        if let Some(down) = self.model_unavailable(s, writer) {
            return down;
        }
        self.charge_model(writer, latency::MODEL);
        let task = self.task;
        let plan = &task.plan;
        let model = self.model;
        // The fallback model's own mistake.
        let own_error =
            writer == Writer::Fallback && self.rng.next_f64() < model.escalation.error_rate;
        let fix = self.fallback_fixes(writer);
        let mut active: Option<(Effect, Option<FailureClass>)> = None;
        let t = self.start_ms + self.clock_ms;
        let armed_now = self.successes;
        for f in self.faults.iter_mut().filter(|f| f.inj.step == s) {
            let spec = &model.faults[f.inj.spec];
            // `onset` holds for model-side faults as for tool-side ones.
            if spec.target != Target::Agent || spec.onset > armed_now {
                continue;
            }
            let missing = matches!(spec.effect, Effect::MissingStep);
            if !missing {
                f.agent_attempts = f.agent_attempts.saturating_add(1);
                f.fixed |= fix(f.inj.permanent);
            }
            let attempts = if missing {
                f.agent_attempts.saturating_add(1)
            } else {
                f.agent_attempts
            };
            let on = !f.fixed
                && f.on_in_time(spec, t)
                    .unwrap_or(f.inj.permanent || attempts <= f.inj.k);
            if on && active.is_none() {
                active = Some((spec.effect.clone(), spec.class_of(f.inj.permanent)));
            }
        }
        let Some(step) = plan.steps.get(s) else {
            return Written::Skipped;
        };
        let args = resolve_args(plan, s, outputs).unwrap_or_else(|e| {
            // The model cannot fill an input it does not have: it writes a placeholder.
            let mut obj = Map::new();
            for (name, src) in &step.args {
                let v = crate::task::resolve_src(name, src, outputs)
                    .unwrap_or_else(|_| Value::String(String::new()));
                obj.insert(name.clone(), v);
            }
            let _ = e;
            Value::Object(obj)
        });
        let mut written = Written::Call {
            tool: step.tool.clone(),
            args: args.clone(),
        };
        let active_class = active.as_ref().and_then(|(_, c)| *c);
        let had_fault = active.is_some();
        if let Some((effect, class)) = active {
            self.last_fault[s] = Some(class);
            written = match effect {
                Effect::MissingStep => Written::Skipped,
                Effect::WrongArgs { op, broken } => Written::Call {
                    tool: step.tool.clone(),
                    args: match (op, broken) {
                        (ArgsOp::BrokenJson, Some(kind)) => {
                            Value::String(malform(&args.to_string(), kind, 0.66))
                        }
                        _ => wrong_args(&args, op),
                    },
                },
                Effect::WrongTool { op } => {
                    let tool = match op {
                        ToolOp::Unknown => format!("{}_v2", step.tool),
                        ToolOp::Sibling => plan
                            .step_tool(s)
                            .and_then(|t| t.sibling.clone())
                            .unwrap_or_else(|| format!("{}_v2", step.tool)),
                    };
                    Written::Call { tool, args }
                }
                Effect::Repetition => {
                    match s.checked_sub(1).and_then(|p| self.written[p].clone()) {
                        Some(w @ Written::Call { .. }) => w,
                        Some(Written::Skipped | Written::Unavailable { .. }) | None => written,
                    }
                }
                Effect::Http { .. }
                | Effect::Timeout { .. }
                | Effect::Slow { .. }
                | Effect::Empty { .. }
                | Effect::ErrorBody { .. }
                | Effect::Malformed { .. }
                | Effect::SchemaDrift { .. }
                | Effect::Stale { .. }
                | Effect::Skew { .. } => written,
            };
        }
        if !had_fault && let Some((w, class)) = self.own_mistake(s, writer, &written, outputs) {
            self.mistakes = self.mistakes.saturating_add(1);
            self.last_fault[s] = Some(class);
            written = w;
            if written == Written::Skipped {
                self.skipped[s] = class;
            }
        }
        if own_error && let Written::Call { tool, args } = &written {
            written = Written::Call {
                tool: tool.clone(),
                args: wrong_args(args, ArgsOp::BrokenJson),
            };
        }
        self.skipped[s] = match written {
            Written::Skipped => active_class.or(self.skipped[s]),
            Written::Call { .. } | Written::Unavailable { .. } => None,
        };
        self.written[s] = Some(written.clone());
        written
    }

    /// Executes a call made for step `s` (the plan's tool, its substitute, or whatever the model
    /// wrote). `fresh` bypasses caches (a refresh). Charges the call and its latency.
    pub fn call(
        &mut self,
        s: usize,
        tool: &str,
        args: &Value,
        purpose: Purpose,
        fresh: bool,
    ) -> ToolResponse {
        let start = self.clock_ms;
        let response = self.call_inner(s, tool, args, purpose, fresh);
        if matches!(response, Response::Returned { .. }) {
            self.successes = self.successes.saturating_add(1);
        }
        ToolResponse {
            response,
            latency_ms: self.clock_ms - start,
        }
    }

    fn call_inner(
        &mut self,
        s: usize,
        tool: &str,
        args: &Value,
        purpose: Purpose,
        fresh: bool,
    ) -> Response {
        match purpose {
            Purpose::Step => self.costs.tool_calls += 1,
            Purpose::Verify => self.costs.verifier_calls += 1,
        }
        let plan = &self.task.plan;
        let step_tool = plan.step_tool(s);
        #[derive(PartialEq, Clone, Copy)]
        enum Via {
            Primary,
            Substitute,
            Sibling,
            Other,
        }
        let (spec, via): (&ToolSpec, Via) = match step_tool {
            Some(t) if t.name == tool => (t, Via::Primary),
            Some(t) if t.substitute.as_deref() == Some(tool) => (t, Via::Substitute),
            // A sibling on offer answers as itself; one not on offer (an old task file's
            // `sibling` name) as the step's tool, skewed.
            Some(t) if t.sibling.as_deref() == Some(tool) && plan.tool(tool).is_none() => {
                (t, Via::Sibling)
            }
            _ => match plan.tool(tool) {
                Some(t) => (t, Via::Other),
                None => {
                    self.clock_ms += latency::LOCAL;
                    return raised(format!("404 Not Found: unknown tool `{tool}`"), Some(404));
                }
            },
        };
        self.clock_ms += if spec.external {
            latency::TOOL
        } else {
            latency::LOCAL
        };
        let Some(obj) = args.as_object() else {
            return raised(
                "400 Bad Request: arguments are not a JSON object".into(),
                Some(400),
            );
        };
        let clean = match truth(spec, obj) {
            Ok(b) => b,
            Err(e) => return raised(format!("400 Bad Request: {e}"), Some(400)),
        };
        let mut body = clean.clone();
        let reads = plan.read_paths(s);
        let reads: Vec<String> = if via == Via::Other {
            spec.output.iter().map(|(p, _)| p.clone()).collect()
        } else {
            reads
        };
        match via {
            Via::Substitute => add_noise(&mut body, spec, obj),
            Via::Sibling => skew_paths(&mut body, &reads, 0.07),
            Via::Primary | Via::Other => {}
        }
        let mut as_of = self.data_now.saturating_sub(60_000);
        // Tool-side faults of this step.
        let model = self.model;
        let armed = self.successes;
        let mut raised_now: Option<Response> = None;
        let mut bytes_op: Option<(MalformOp, f64)> = None;
        let mut met_class: Option<Option<FailureClass>> = None;
        if via == Via::Primary || via == Via::Substitute {
            for i in 0..self.faults.len() {
                let f = &self.faults[i];
                let spec_f = &model.faults[f.inj.spec];
                if f.inj.step != s || spec_f.onset > armed {
                    continue;
                }
                // A provider-wide outage anchored at a step it strikes no tool of (a task whose
                // steps are all local meets it through its model only).
                if spec_f.provider_wide && !spec_f.applies(self.task, s) {
                    continue;
                }
                let hits = matches!(
                    (spec_f.target, via),
                    (Target::Primary | Target::Local | Target::Both, Via::Primary)
                        | (Target::Substitute | Target::Both, Via::Substitute)
                );
                if !hits {
                    continue;
                }
                let f = &mut self.faults[i];
                let attempts = if via == Via::Primary {
                    f.primary_attempts += 1;
                    f.primary_attempts
                } else {
                    f.substitute_attempts += 1;
                    f.substitute_attempts
                };
                let (permanent, k, skew) = (f.inj.permanent, f.inj.k, f.inj.skew);
                let t = self.start_ms + self.clock_ms;
                let mut on = f
                    .on_in_time(spec_f, t)
                    .unwrap_or(permanent || attempts <= k);
                if matches!(spec_f.effect, Effect::Stale { .. }) && fresh && !permanent {
                    on = false;
                }
                if on && spec_f.probability < 1.0 {
                    on = self.rng.next_f64() < spec_f.probability;
                }
                if !on {
                    continue;
                }
                met_class = Some(spec_f.class_of(permanent));
                match &spec_f.effect {
                    Effect::Http {
                        status,
                        message,
                        retry_after_ms,
                    } => {
                        raised_now.get_or_insert(Response::Raised {
                            message: message.clone(),
                            status: Some(*status),
                            retry_after_ms: *retry_after_ms,
                            timeout: false,
                        });
                    }
                    Effect::Timeout { ms } => {
                        if raised_now.is_none() {
                            self.clock_ms += ms;
                            raised_now = Some(Response::Raised {
                                message: format!("`{tool}` timed out after {ms} ms"),
                                status: None,
                                retry_after_ms: None,
                                timeout: true,
                            });
                        }
                    }
                    Effect::Slow { ms } => self.clock_ms += ms,
                    Effect::Empty { explicit: true } => {
                        raised_now
                            .get_or_insert(raised("404 Not Found: no results".into(), Some(404)));
                    }
                    Effect::Empty { explicit: false } => empty_paths(&mut body, &reads),
                    Effect::ErrorBody { message } => body = json!({ "error": message }),
                    Effect::Malformed { op, keep } => bytes_op = Some((*op, *keep)),
                    Effect::SchemaDrift { rename } => drift(&mut body, &reads, *rename),
                    Effect::Stale {
                        as_of: stamp,
                        age_ms,
                        ..
                    } => {
                        skew_paths(&mut body, &reads, skew);
                        if *stamp == AsOf::Honest {
                            as_of = self.data_now.saturating_sub(*age_ms);
                        }
                    }
                    Effect::Skew { .. } => skew_paths(&mut body, &reads, skew),
                    Effect::WrongArgs { .. }
                    | Effect::WrongTool { .. }
                    | Effect::MissingStep
                    | Effect::Repetition => {}
                }
            }
        }
        if via != Via::Substitute {
            self.last_fault[s] = Some(met_class.flatten());
            if via == Via::Sibling || via == Via::Other {
                self.last_fault[s] = Some(Some(FailureClass::WrongTool));
            }
        }
        if let Some(r) = raised_now {
            return r;
        }
        if spec.freshness
            && body.is_object()
            && let Some(o) = body.as_object_mut()
        {
            o.insert(AS_OF.into(), json!(as_of));
        }
        let wrong = reads
            .iter()
            .any(|p| match (get_path(&body, p), get_path(&clean, p)) {
                (Some(a), Some(b)) => !ANSWER_TOLERANCE.agrees(a, b),
                _ => false,
            })
            || via == Via::Sibling
            || via == Via::Other;
        if purpose == Purpose::Step {
            self.last_wrong[s] = wrong;
        }
        let text = body.to_string();
        let text = match bytes_op {
            None => text,
            Some((op, keep)) => malform(&text, op, keep),
        };
        Response::Returned { body: text }
    }

    /// A verifier accepted (`Some(true)`), rejected (`Some(false)`) or could not judge (`None`)
    /// the last response of step `s`. Counted against the truth for the false-alarm and miss
    /// rates; changes nothing in the world.
    pub fn report_verdict(&mut self, s: usize, verdict: Option<bool>) {
        let Some(accepted) = verdict else {
            self.tally.uncertain += 1;
            return;
        };
        let wrong = self.last_wrong.get(s).copied().unwrap_or(false);
        if wrong {
            self.tally.verdicts_on_wrong += 1;
            self.tally.misses += u64::from(accepted);
        } else {
            self.tally.verdicts_on_faithful += 1;
            self.tally.false_alarms += u64::from(!accepted);
        }
    }

    /// The classifier inferred `class` for a failure at step `s`. Counted against the class of
    /// the fault last met there (none: a false detection).
    pub fn report_class(&mut self, s: usize, class: FailureClass) {
        let here = self.last_fault.get(s).copied().flatten().flatten();
        // A failure at a step with no fault of its own, while an earlier step was skipped by a
        // fault: that skip is the cause.
        let injected = here.or_else(|| self.skipped.iter().take(s).rev().find_map(|c| *c));
        *self
            .tally
            .confusion
            .entry(injected)
            .or_default()
            .entry(class)
            .or_default() += 1;
    }

    /// A detector of the client fired at step `s` (`detector`: its name, e.g. `grounding`).
    /// Counted per episode; the runner reports how often each fires on episodes where nothing
    /// went wrong (false alarms). Changes nothing in the world.
    pub fn report_alarm(&mut self, s: usize, detector: &'static str) {
        let _ = s;
        *self.alarms.entry(detector).or_default() += 1;
    }

    /// What the runner keeps.
    pub(crate) fn into_record(self) -> EpisodeRecord {
        EpisodeRecord {
            costs: self.costs,
            clock_ms: self.clock_ms,
            tally: self.tally,
            clean: self.faults.is_empty() && self.mistakes == 0,
            alarms: self.alarms,
        }
    }
}

/// Whether a final answer is correct (scoring; the runner calls it after the episode).
pub(crate) fn score(task: &TaskSpec, answer: &Value) -> bool {
    ANSWER_TOLERANCE.agrees(answer, &task.expected)
}

/// The answer of a fault-free run of `plan` in the simulated world.
pub(crate) fn clean_answer(plan: &Plan) -> Result<Value, String> {
    let mut outputs: Vec<Option<Value>> = Vec::with_capacity(plan.steps.len());
    for (s, st) in plan.steps.iter().enumerate() {
        let args = resolve_args(plan, s, &outputs).map_err(|e| e.to_string())?;
        let spec = plan
            .tool(&st.tool)
            .ok_or_else(|| format!("unknown tool `{}`", st.tool))?;
        let obj = args.as_object().cloned().unwrap_or_default();
        outputs.push(Some(truth(spec, &obj)?));
    }
    resolve_answer(plan, &outputs).map_err(|e| e.to_string())
}

fn fnv(parts: &[&str]) -> u64 {
    let mut x: u64 = 0xcbf2_9ce4_8422_2325;
    for p in parts {
        for b in p.bytes().chain(std::iter::once(0xff)) {
            x ^= u64::from(b);
            x = x.wrapping_mul(0x0100_0000_01b3);
        }
    }
    x
}

fn unit(h: u64) -> f64 {
    (h >> 11) as f64 / (1u64 << 53) as f64
}

/// What the tool returns when nothing is wrong.
fn truth(spec: &ToolSpec, args: &Map<String, Value>) -> Result<Value, String> {
    for p in &spec.params {
        match args.get(&p.name) {
            None | Some(Value::Null) if p.required => {
                return Err(format!("missing required argument `{}`", p.name));
            }
            Some(Value::String(x)) if p.required && x.trim().is_empty() => {
                return Err(format!("argument `{}` is empty", p.name));
            }
            // Synthesised tools (imported specs) are lenient about types, as most real APIs
            // that take query strings are.
            Some(v)
                if matches!(
                    spec.behaviour,
                    Behaviour::Builtin(_) | Behaviour::Sibling(_)
                ) && !(v.is_null() || p.ty.accepts(v)) =>
            {
                return Err(format!("argument `{}` must be a {}", p.name, p.ty.as_str()));
            }
            _ => {}
        }
    }
    match spec.behaviour {
        Behaviour::Builtin(group) | Behaviour::Sibling(group) => {
            let argv: Vec<Value> = group
                .params()
                .iter()
                .map(|p| args.get(*p).cloned().unwrap_or(Value::Null))
                .collect();
            if matches!(spec.behaviour, Behaviour::Sibling(_)) {
                catalogue::sibling_truth(group, &argv)
            } else {
                catalogue::truth(group, &argv)
            }
        }
        Behaviour::Semantic(op) => semantic(spec, op, args),
        Behaviour::Synth => {
            // Lenient about types means one value, however it is typed: the tool reads each
            // argument as its declared type (`"4"` and `4` for a string parameter are the same
            // query), so a client that coerces arguments to the schema asks the same question.
            let key = canonical_hash(&Value::Object(as_declared(spec, args))).to_string();
            let mut out = Value::Object(Map::new());
            for (path, ty) in &spec.output {
                let h = fnv(&[&spec.name, path, &key]);
                let leaf = path.rsplit('.').next().unwrap_or(path);
                let leaf = leaf.split('[').next().unwrap_or(leaf);
                let v = match ty {
                    FieldType::String => json!(format!("{leaf}-{}", h % 100_000)),
                    FieldType::Number => json!((h % 1_000_000) as f64 / 100.0),
                    FieldType::Integer => json!(h % 1000),
                    FieldType::Boolean => json!(h.is_multiple_of(2)),
                    FieldType::Array => json!([
                        format!("{leaf}-{}", h % 1000),
                        format!("{leaf}-{}", (h >> 20) % 1000)
                    ]),
                    FieldType::Object => json!({"id": format!("{leaf}-{}", h % 1000)}),
                };
                set_path(&mut out, path, v);
            }
            Ok(out)
        }
    }
}

/// A tool with real semantics: its value, in its first output field.
fn semantic(
    spec: &ToolSpec,
    op: crate::task::Op,
    args: &Map<String, Value>,
) -> Result<Value, String> {
    use crate::task::Op;
    let (path, _) = spec
        .output
        .first()
        .ok_or_else(|| format!("`{}` declares no output", spec.name))?;
    let v = if op == Op::Lookup {
        let key = spec
            .params
            .first()
            .and_then(|p| args.get(&p.name))
            .map(|v| match v {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            })
            .ok_or("lookup needs a key")?;
        json!((fnv(&[&spec.name, "table", &key]) % 1_000_000) as f64 / 100.0)
    } else {
        let nums: Vec<f64> = spec
            .params
            .iter()
            .filter_map(|p| args.get(&p.name))
            .map(|v| match v {
                Value::Number(n) => n.as_f64(),
                Value::String(s) => s.trim().parse::<f64>().ok(),
                _ => None,
            })
            .collect::<Option<Vec<f64>>>()
            .ok_or("arguments must be numbers")?;
        let [a, b] = nums[..] else {
            return Err(format!("`{}` takes two numbers", spec.name));
        };
        let r = |x: f64| json!((x * 10_000.0).round() / 10_000.0);
        match op {
            Op::Add => r(a + b),
            Op::Subtract => r(a - b),
            Op::Multiply => r(a * b),
            Op::Divide if b == 0.0 => return Err("division by zero".into()),
            Op::Divide => r(a / b),
            Op::Greater => json!(a > b),
            Op::Less => json!(a < b),
            Op::Max => r(a.max(b)),
            Op::Min => r(a.min(b)),
            Op::Lookup => Value::Null,
        }
    };
    let mut out = Value::Object(Map::new());
    set_path(&mut out, path, v);
    Ok(out)
}

/// `args` with each scalar read as its parameter's declared type where it reads as one (a
/// number or boolean for a string parameter as its text, a numeric or boolean text for a number,
/// integer or boolean parameter as that value); anything else as it came.
fn as_declared(spec: &ToolSpec, args: &Map<String, Value>) -> Map<String, Value> {
    let mut out = args.clone();
    for p in &spec.params {
        let Some(v) = out.get_mut(&p.name) else {
            continue;
        };
        let read = match (p.ty, &*v) {
            (FieldType::String, Value::Number(_) | Value::Bool(_)) => {
                Some(Value::String(v.to_string()))
            }
            (FieldType::Number | FieldType::Integer | FieldType::Boolean, Value::String(t)) => {
                serde_json::from_str::<Value>(t.trim())
                    .ok()
                    .filter(|x| p.ty.accepts(x))
            }
            _ => None,
        };
        if let Some(x) = read {
            *v = x;
        }
    }
    out
}

/// Writes `v` at `path`, creating objects and arrays on the way.
fn set_path(root: &mut Value, path: &str, v: Value) {
    let mut cur = root;
    let parts: Vec<&str> = path.split('.').collect();
    for (i, part) in parts.iter().enumerate() {
        let last = i + 1 == parts.len();
        let (name, idx) = match part.split_once('[') {
            Some((n, rest)) => (n, rest.trim_end_matches(']').parse::<usize>().ok()),
            None => (*part, None),
        };
        if !cur.is_object() {
            *cur = Value::Object(Map::new());
        }
        let Some(obj) = cur.as_object_mut() else {
            return;
        };
        let slot = obj.entry(name.to_owned()).or_insert(Value::Null);
        cur = match idx {
            None => slot,
            Some(n) => {
                if !slot.is_array() {
                    *slot = Value::Array(Vec::new());
                }
                let Some(arr) = slot.as_array_mut() else {
                    return;
                };
                while arr.len() <= n {
                    arr.push(Value::Null);
                }
                &mut arr[n]
            }
        };
        if last {
            if cur.is_null() || !(cur.is_object() && v.is_object()) {
                *cur = v;
            }
            return;
        }
    }
}

fn map_leaves(v: &mut Value, f: &mut dyn FnMut(&mut Value)) {
    match v {
        Value::Array(a) => a.iter_mut().for_each(|x| map_leaves(x, f)),
        Value::Object(o) => o.values_mut().for_each(|x| map_leaves(x, f)),
        other => f(other),
    }
}

fn skew_value(v: &mut Value, factor: f64) {
    map_leaves(v, &mut |x| match x {
        Value::Number(n) => {
            let y = n.as_f64().unwrap_or(0.0);
            let z = if y == 0.0 { 1.0 } else { y * (1.0 + factor) };
            *x = json!((z * 1000.0).round() / 1000.0);
        }
        Value::String(s) => s.push_str(if factor >= 0.0 { " North" } else { " Old" }),
        _ => {}
    });
}

fn paths_mut<'v>(body: &'v mut Value, path: &str) -> Option<&'v mut Value> {
    let mut cur = body;
    for (name, idx) in crate::task::path_parts(path) {
        if !name.is_empty() {
            cur = cur.get_mut(name)?;
        }
        if let Some(i) = idx {
            cur = cur.get_mut(i)?;
        }
    }
    Some(cur)
}

fn skew_paths(body: &mut Value, reads: &[String], factor: f64) {
    for p in reads {
        if let Some(v) = paths_mut(body, p) {
            skew_value(v, factor);
        }
    }
}

fn empty_paths(body: &mut Value, reads: &[String]) {
    for p in reads {
        // Empty the top-level field the path starts in.
        let top = p.split(['.', '[']).next().unwrap_or(p);
        if let Some(o) = body.as_object_mut()
            && let Some(v) = o.get_mut(top)
        {
            *v = if v.is_array() { json!([]) } else { Value::Null };
        } else if top.is_empty() {
            *body = Value::Null;
        }
    }
}

fn drift(body: &mut Value, reads: &[String], rename: RenameOp) {
    let Some(o) = body.as_object_mut() else {
        return;
    };
    for p in reads {
        let top = p.split(['.', '[']).next().unwrap_or(p).to_owned();
        if let Some(v) = o.remove(&top) {
            let new = match rename {
                RenameOp::Suffix => format!("{top}_v2"),
                RenameOp::Opaque => format!("f{}", fnv(&[&top]) % 97),
            };
            o.insert(new, v);
        }
    }
}

fn add_noise(body: &mut Value, spec: &ToolSpec, args: &Map<String, Value>) {
    let n = spec.noise;
    if n.rel == 0.0 && n.abs == 0.0 {
        return;
    }
    let key = canonical_hash(&Value::Object(args.clone())).to_string();
    let h = fnv(&[&spec.name, "noise", &key]);
    let outlier = unit(fnv(&[&spec.name, "outlier", &key])) < n.outlier_share;
    let scale = if outlier { n.outlier.max(1.0) } else { 1.0 };
    let (u1, u2) = (unit(h) * 2.0 - 1.0, unit(h.rotate_left(23)) * 2.0 - 1.0);
    for (path, ty) in &spec.output {
        if !matches!(ty, FieldType::Number) {
            continue;
        }
        if let Some(Value::Number(x)) = paths_mut(body, path) {
            let y = x.as_f64().unwrap_or(0.0);
            let mut z = y * (1.0 + u1 * n.rel * scale) + u2 * n.abs * scale;
            if outlier {
                // An outlier is off in one direction by at least the spread times `outlier`.
                z = y + (z - y).signum() * ((y.abs() * n.rel + n.abs) * scale);
            }
            if let Some(v) = paths_mut(body, path) {
                *v = json!((z * 10_000.0).round() / 10_000.0);
            }
        }
    }
}

/// The scalar leaves of `v`, in order.
fn leaves(v: &Value, out: &mut Vec<Value>) {
    match v {
        Value::Array(a) => a.iter().for_each(|x| leaves(x, out)),
        Value::Object(o) => o.values().for_each(|x| leaves(x, out)),
        Value::Null => {}
        other => out.push(other.clone()),
    }
}

/// A value the model makes up in place of `v`: a number off by a factor, a string misspelt or
/// truncated, in one of several ways (`pick` chooses).
fn made_up(v: &Value, pick: u64) -> Value {
    match v {
        Value::Number(n) => {
            let x = n.as_f64().unwrap_or(0.0);
            let y = match pick % 4 {
                0 => x * 10.0,
                1 => x / 10.0,
                2 => x + 1.0,
                _ => (x * 0.5).round(),
            };
            json!(y)
        }
        Value::String(t) => {
            let w: String = match pick % 3 {
                0 => format!("{t}s"),
                1 => t.to_lowercase().replace(' ', "_"),
                _ => t
                    .chars()
                    .take(t.chars().count().saturating_sub(1))
                    .collect(),
            };
            Value::String(if w == *t || w.is_empty() {
                format!("{t}s")
            } else {
                w
            })
        }
        other => other.clone(),
    }
}

fn wrong_args(args: &Value, op: ArgsOp) -> Value {
    match op {
        ArgsOp::BrokenJson => Value::String(garble(&args.to_string())),
        ArgsOp::WrongValue => {
            let mut a = args.clone();
            if let Some(o) = a.as_object_mut()
                && let Some((_, v)) = o.iter_mut().next()
            {
                *v = match v.take() {
                    Value::Number(n) => json!(n.as_f64().unwrap_or(0.0) * 10.0),
                    Value::String(s) => Value::String(format!("{s}s")),
                    other => other,
                };
            }
            a
        }
        ArgsOp::EmptyArg => {
            let mut a = args.clone();
            if let Some(o) = a.as_object_mut()
                && let Some((_, v)) = o.iter_mut().next()
            {
                *v = Value::String(String::new());
            }
            a
        }
    }
}

fn malform(text: &str, op: MalformOp, keep: f64) -> String {
    match op {
        MalformOp::Cut => {
            let mut end = ((text.len() as f64) * keep) as usize;
            while end > 0 && !text.is_char_boundary(end) {
                end -= 1;
            }
            text[..end].to_owned()
        }
        MalformOp::Garble => garble(text),
        MalformOp::Prose => format!("Sure! Here is the result you asked for: {text} Let me know if you need anything else."),
        MalformOp::Fence => format!("```json\n{text}\n```"),
        MalformOp::Html => "<html><head><title>502 Bad Gateway</title></head><body><h1>502 Bad Gateway</h1></body></html>".to_owned(),
        MalformOp::Comments => {
            let t = text.replacen('{', "{ /* result */ ", 1);
            match t.rfind('}') {
                Some(i) => format!("{} // end\n}}", &t[..i]),
                None => t,
            }
        }
        MalformOp::Python => text
            .replace("true", "True")
            .replace("false", "False")
            .replace("null", "None")
            .replace('"', "'"),
        MalformOp::UnquotedKeys => unquote_keys(text),
        MalformOp::MissingComma => text.replacen(",\"", " \"", 1),
        MalformOp::MissingBrace => text.strip_suffix('}').unwrap_or(text).to_owned(),
    }
}

/// `{"a": 1}` → `{a: 1}`: every key that is a plain identifier loses its quotes.
fn unquote_keys(text: &str) -> String {
    let Ok(v) = serde_json::from_str::<Value>(text) else {
        return text.to_owned();
    };
    fn write(v: &Value, out: &mut String) {
        match v {
            Value::Object(o) => {
                out.push('{');
                for (i, (k, x)) in o.iter().enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    if k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') && !k.is_empty() {
                        out.push_str(k);
                    } else {
                        out.push_str(&Value::String(k.clone()).to_string());
                    }
                    out.push_str(": ");
                    write(x, out);
                }
                out.push('}');
            }
            Value::Array(a) => {
                out.push('[');
                for (i, x) in a.iter().enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    write(x, out);
                }
                out.push(']');
            }
            other => out.push_str(&other.to_string()),
        }
    }
    let mut out = String::new();
    write(&v, &mut out);
    out
}

/// A raised response with this message and status.
pub(crate) fn raised(message: String, status: Option<u16>) -> Response {
    Response::Raised {
        message,
        status,
        retry_after_ms: None,
        timeout: false,
    }
}

/// Python-style quotes and a trailing comma: broken JSON that still holds all its data.
fn garble(text: &str) -> String {
    let t = text.replace('"', "'");
    match t.strip_suffix('}') {
        Some(head) => format!("{head},}}"),
        None => t,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::task::builtin;

    /// A synthesised tool, lenient about types, answers `"4"` and `4` for a string parameter
    /// (and `"3"` and `3` for a number) alike — a client that coerces arguments to the schema
    /// asks the same question — and a different value differently.
    #[test]
    fn a_synthesised_tool_reads_arguments_as_their_declared_types() {
        let line = r#"{"id": "t", "query": "q", "tools": [{"name": "search", "parameters": {"type": "object", "properties": {"q": {"type": "string"}, "min_rating": {"type": "string"}, "days": {"type": "number"}}, "required": ["q"]}, "output": {"id": "string", "score": "number"}, "external": true}], "plan": [{"tool": "search", "args": {"q": "shoes", "min_rating": 4, "days": 3}, "label": "var1"}], "answer": "$var1$"}"#;
        let tasks = crate::task::load_jsonl(line).unwrap();
        let spec = &tasks[0].plan.tools[0];
        let ask = |args: Value| truth(spec, args.as_object().unwrap()).unwrap();
        let plan = ask(json!({"q": "shoes", "min_rating": 4, "days": 3}));
        assert_eq!(
            plan,
            ask(json!({"q": "shoes", "min_rating": "4", "days": "3"}))
        );
        assert_ne!(
            plan,
            ask(json!({"q": "shoes", "min_rating": "5", "days": 3}))
        );
    }

    #[test]
    fn malformed_operators_produce_what_their_names_say() {
        let body = r#"{"rate":1.2345,"as_of":5}"#;
        let cut = malform(body, MalformOp::Cut, 0.5);
        assert!(body.starts_with(&cut) && cut.len() < body.len());
        let garbled = malform(body, MalformOp::Garble, 0.0);
        assert!(serde_json::from_str::<Value>(&garbled).is_err());
        assert_eq!(
            selfheal_repair::repair(&garbled).unwrap().value,
            serde_json::from_str::<Value>(body).unwrap()
        );
        assert!(malform(body, MalformOp::Fence, 0.0).starts_with("```json"));
        assert!(malform(body, MalformOp::Prose, 0.0).contains(body));
        assert!(selfheal_repair::repair(&malform(body, MalformOp::Html, 0.0)).is_err());
        // The kinds of broken JSON the repair suites name: each breaks the parse, and each but
        // the lost brace (a cut, which a client refuses to close) still holds all its data.
        let body = r#"{"rate":1.2345,"ok":true,"note":null}"#;
        let want: Value = serde_json::from_str(body).unwrap();
        for op in [
            MalformOp::Comments,
            MalformOp::Python,
            MalformOp::UnquotedKeys,
            MalformOp::MissingComma,
            MalformOp::MissingBrace,
        ] {
            let broken = malform(body, op, 0.0);
            assert!(
                serde_json::from_str::<Value>(&broken).is_err(),
                "{op:?}: {broken}"
            );
            if op != MalformOp::MissingBrace {
                assert_eq!(
                    selfheal_repair::repair(&broken).map(|r| r.value).ok(),
                    Some(want.clone()),
                    "{op:?}: {broken}"
                );
            }
        }
    }

    #[test]
    fn substitute_noise_is_deterministic_and_within_the_documented_spread() {
        let fx = crate::task::builtin_tool(crate::catalogue::Group::Fx);
        let (mut outliers, mut n) = (0, 0);
        for a in [
            "EUR", "GBP", "JPY", "CHF", "AUD", "CAD", "NOK", "SEK", "PLN", "INR",
        ] {
            for b in [
                "USD", "MXN", "BRL", "ZAR", "KRW", "TRY", "NZD", "SGD", "HKD", "CNY",
            ] {
                let args = json!({"from": a, "to": b});
                let obj = args.as_object().unwrap();
                let clean = truth(&fx, obj).unwrap();
                let mut one = clean.clone();
                let mut two = clean.clone();
                add_noise(&mut one, &fx, obj);
                add_noise(&mut two, &fx, obj);
                assert_eq!(one, two, "same call, same reading");
                let (x, y) = (
                    clean["rate"].as_f64().unwrap(),
                    one["rate"].as_f64().unwrap(),
                );
                let rel = ((y - x) / x).abs();
                n += 1;
                if rel > fx.noise.rel + 1e-4 {
                    outliers += 1;
                    assert!(
                        rel <= fx.noise.rel * fx.noise.outlier + 1e-4,
                        "{a}/{b}: {rel}"
                    );
                }
            }
        }
        // About 3.3 % of pairs are outliers; 100 pairs should show a handful, not dozens.
        assert!(outliers <= 10, "{outliers} of {n}");
    }

    #[test]
    fn only_the_faulted_attempts_fail_and_permanent_faults_stay() {
        let task = &builtin(1)[0];
        let model = FaultModel::default_model().unwrap();
        let spec = model
            .faults
            .iter()
            .position(|f| f.name == "http_500")
            .unwrap();
        let transient = Injected {
            step: 1,
            spec,
            permanent: false,
            k: 2,
            skew: 0.0,
        };
        let outputs = vec![Some(json!({"city": format!("{} City", "x")}))];
        let mut ep = Episode::new(task, &[transient], &model, 1);
        let args = resolve_args(ep.plan(), 1, &outputs).unwrap();
        let tool = ep.plan().steps[1].tool.clone();
        let raised = |r: &ToolResponse| matches!(r.response, Response::Raised { .. });
        let r: Vec<bool> = (0..3)
            .map(|_| raised(&ep.call(1, &tool, &args, Purpose::Step, false)))
            .collect();
        assert_eq!(r, [true, true, false]);
        let permanent = Injected {
            permanent: true,
            ..transient
        };
        let mut ep = Episode::new(task, &[permanent], &model, 1);
        assert!((0..5).all(|_| raised(&ep.call(1, &tool, &args, Purpose::Step, false))));
        // The substitute is not hit by a primary fault, and a verifier call is charged as V.
        let sub = ep.plan().steps[1].tool.clone();
        let sub = ep.plan().tool(&sub).unwrap().substitute.clone().unwrap();
        assert!(!raised(&ep.call(1, &sub, &args, Purpose::Verify, false)));
        assert_eq!(ep.costs().verifier_calls, 1);
        assert_eq!(ep.costs().tool_calls, 5);
    }
}
