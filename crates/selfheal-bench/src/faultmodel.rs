//! Fault models as data: a TOML file says which faults exist, where they strike, what they do,
//! how long they last and how often they are drawn (format in `docs/bench/faults.md`).
//!
//! Why data and not code: a benchmark whose faults are all chosen by the author of the winner
//! can only show what the author thought of. With the model in a file, anyone can bring faults
//! the policy never saw — including faults no action can fix, where the right outcome is a clean
//! degrade. The default model ships as `faults/default.toml` and is embedded in the binary.
//!
//! This module only *draws* a schedule; what a fault does to a call is the business of
//! [`crate::exec`], the only module that reads a schedule.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use selfheal_core::{FailureClass, Rng, SplitMix64};

use crate::faults::{Family, Mix};
use crate::task::TaskSpec;

/// The default fault model (`faults/default.toml`).
pub const DEFAULT_TOML: &str = include_str!("../faults/default.toml");

/// Where a fault strikes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Target {
    /// The plan's external tool.
    Primary,
    /// Only the equivalent substitute (met when substituting or cross-checking).
    Substitute,
    /// The primary and the substitute at once, with the same effect (and the same wrong value).
    Both,
    /// A local tool with no substitute (a calculator).
    Local,
    /// The model/agent side: the call the model writes, or the plan.
    Agent,
}

/// What a malformed body looks like.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MalformOp {
    /// Cut off at `keep` of its length.
    Cut,
    /// Single quotes and a lost colon (repairable).
    Garble,
    /// Wrapped in prose.
    Prose,
    /// Wrapped in a Markdown code fence.
    Fence,
    /// An HTML error page instead of JSON (no data in it).
    Html,
    /// `//` and `/* */` comments among the values (the repair suites' "comments").
    Comments,
    /// Python literals: `True`, `False`, `None` and single quotes ("python literals").
    Python,
    /// Keys without quotes (JavaScript object syntax).
    UnquotedKeys,
    /// A comma lost between two members ("missing values").
    MissingComma,
    /// The closing brace lost (a cut of one character: "truncation / missing brackets").
    MissingBrace,
}

/// How a drifted schema renames the fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RenameOp {
    /// `field` → `field_v2`: a schema-guided client can map it back.
    Suffix,
    /// `field` → an unrelated name: nobody can map it back without guessing.
    Opaque,
}

/// What `as_of` a stale body carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AsOf {
    /// The true, old timestamp: a freshness check sees it.
    Honest,
    /// A fresh timestamp on old data: only a second source can tell.
    Fresh,
}

/// How the agent gets the arguments wrong.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ArgsOp {
    /// Broken JSON text (a trailing comma, a lost brace).
    BrokenJson,
    /// A wrong value: strings altered, numbers off by a factor of ten.
    WrongValue,
    /// A required argument left empty.
    EmptyArg,
}

/// How the agent gets the tool wrong.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolOp {
    /// A tool name that does not exist.
    Unknown,
    /// A real tool of the wrong kind that takes the same arguments.
    Sibling,
}

/// What the fault does.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Effect {
    /// An HTTP error.
    Http {
        /// The status.
        status: u16,
        /// The message.
        message: String,
        /// A `Retry-After`, in ms.
        #[serde(default)]
        retry_after_ms: Option<u64>,
    },
    /// The call times out after `ms`.
    Timeout {
        /// How long the caller waits.
        #[serde(default = "default_timeout")]
        ms: u64,
    },
    /// The call is correct but takes `ms` longer.
    Slow {
        /// Extra latency.
        ms: u64,
    },
    /// No data: a 404 "no results" (explicit) or empty/null fields (implicit).
    Empty {
        /// Whether the tool says so with a 404.
        #[serde(default)]
        explicit: bool,
    },
    /// A 200 whose body is `{"error": message}`.
    ErrorBody {
        /// The message.
        message: String,
    },
    /// The body's bytes are damaged.
    Malformed {
        /// How.
        op: MalformOp,
        /// For `cut`: the share of the body kept.
        #[serde(default = "default_keep")]
        keep: f64,
    },
    /// The fields the plan reads are renamed.
    SchemaDrift {
        /// How.
        rename: RenameOp,
    },
    /// Old data.
    Stale {
        /// Which `as_of` it carries.
        as_of: AsOf,
        /// How old, in ms.
        #[serde(default = "default_age")]
        age_ms: u64,
        /// How far the old values are off, as a relative range `[min, max]`.
        skew: [f64; 2],
    },
    /// Numbers off by a relative amount drawn from `[min, max]` (either sign); strings altered.
    Skew {
        /// The range.
        range: [f64; 2],
    },
    /// The agent writes wrong arguments.
    WrongArgs {
        /// How.
        op: ArgsOp,
        /// For `broken_json`: which kind of broken JSON (default: `garble`, single quotes and a
        /// trailing comma).
        #[serde(default)]
        broken: Option<MalformOp>,
    },
    /// The agent calls the wrong tool.
    WrongTool {
        /// How.
        op: ToolOp,
    },
    /// The plan omits the step; a later step finds its input missing.
    MissingStep,
    /// The agent repeats the previous call instead of making this one.
    Repetition,
}

fn default_timeout() -> u64 {
    10_000
}
fn default_keep() -> f64 {
    0.66
}
fn default_age() -> u64 {
    86_400_000
}
fn one() -> f64 {
    1.0
}
fn default_k() -> [u32; 2] {
    [1, 2]
}

impl Effect {
    /// Whether the tool (or the model's own output) raises visibly.
    pub fn explicit(&self) -> bool {
        match self {
            Effect::Http { .. } | Effect::Timeout { .. } => true,
            Effect::Empty { explicit } => *explicit,
            Effect::Malformed { .. }
            | Effect::WrongTool {
                op: ToolOp::Unknown,
            } => true,
            Effect::WrongArgs {
                op: ArgsOp::BrokenJson | ArgsOp::EmptyArg,
                ..
            } => true,
            Effect::MissingStep => true,
            Effect::Slow { .. }
            | Effect::ErrorBody { .. }
            | Effect::SchemaDrift { .. }
            | Effect::Stale { .. }
            | Effect::Skew { .. }
            | Effect::WrongArgs {
                op: ArgsOp::WrongValue,
                ..
            }
            | Effect::WrongTool {
                op: ToolOp::Sibling,
            }
            | Effect::Repetition => false,
        }
    }

    /// Whether the effect belongs to the agent side.
    pub fn is_agent(&self) -> bool {
        match self {
            Effect::WrongArgs { .. }
            | Effect::WrongTool { .. }
            | Effect::MissingStep
            | Effect::Repetition => true,
            Effect::Http { .. }
            | Effect::Timeout { .. }
            | Effect::Slow { .. }
            | Effect::Empty { .. }
            | Effect::ErrorBody { .. }
            | Effect::Malformed { .. }
            | Effect::SchemaDrift { .. }
            | Effect::Stale { .. }
            | Effect::Skew { .. } => false,
        }
    }
}

/// One kind of fault in the model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FaultSpec {
    /// A unique name (used in the census and the truth table).
    pub name: String,
    /// The family it is reported under.
    pub family: Family,
    /// Relative weight when a faulted step draws its fault.
    pub weight: f64,
    /// Where it strikes.
    pub target: Target,
    /// What it does.
    pub effect: Effect,
    /// Share of draws that are permanent (the rest are transient).
    #[serde(default)]
    pub permanent: f64,
    /// A transient fault lasts for `k` attempts, `k` drawn from this inclusive range.
    #[serde(default = "default_k")]
    pub transient_k: [u32; 2],
    /// The fault arms only after this many successful tool calls in the episode.
    #[serde(default)]
    pub onset: u32,
    /// While armed and active, each attempt fails with this probability (1: always).
    #[serde(default = "one")]
    pub probability: f64,
    /// The ground-truth failure class (default: derived from effect and persistence).
    #[serde(default)]
    pub class: Option<FailureClass>,
    /// A note for people (why the fault is in the model).
    #[serde(default)]
    pub note: Option<String>,
    /// Aim at one step position: `"first"`, `"last"` or a 0-based index (default: any step).
    #[serde(default)]
    pub at: Option<At>,
    /// A fault in time: not drawn per step but on for every call, of every episode, made while
    /// the benchmark's clock is inside the window (see `docs/bench/faults.md`, "Faults in time").
    #[serde(default)]
    pub window: Option<Window>,
    /// A transient draw clears after this long (ms, `[min, max]`) from the first call it hits,
    /// instead of after `k` attempts: waiting, not retrying, is what clears it.
    #[serde(default)]
    pub clears_after_ms: Option<[u64; 2]>,
    /// A provider-wide outage (needs a `window`, an `http` or `timeout` effect and target
    /// `primary` or `both`): it also takes the agent's own model — every call that model writes
    /// while the window is open raises the effect's error — and, with `both`, every external
    /// tool, those with no substitute included. The fallback model is another provider's and
    /// stays up. Default `false`: the model is not behind the window.
    #[serde(default)]
    pub provider_wide: bool,
}

/// A step position a fault is aimed at.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum At {
    /// A 0-based step index.
    Index(usize),
    /// The first or the last step.
    Named(AtName),
}

/// `"first"` or `"last"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AtName {
    /// Step 0.
    First,
    /// The plan's last step.
    Last,
}

impl At {
    /// Whether step `s` of a plan of `n` steps is this position.
    pub fn matches(self, s: usize, n: usize) -> bool {
        match self {
            At::Index(i) => i == s,
            At::Named(AtName::First) => s == 0,
            At::Named(AtName::Last) => s + 1 == n,
        }
    }
}

/// A stretch of the benchmark's clock (ms since a seed's first episode started).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Window {
    /// Start, inclusive.
    pub start_ms: u64,
    /// End, exclusive.
    pub end_ms: u64,
}

impl Window {
    /// Whether `t` is inside.
    pub fn contains(&self, t: u64) -> bool {
        self.start_ms <= t && t < self.end_ms
    }
}

impl FaultSpec {
    /// The ground-truth class of a draw of this fault (`None`: not a failure, e.g. slow).
    pub fn class_of(&self, permanent: bool) -> Option<FailureClass> {
        if let Some(c) = self.class {
            return Some(c);
        }
        let transient_or = |p: FailureClass| {
            if permanent {
                p
            } else {
                FailureClass::ToolTimeout
            }
        };
        Some(match &self.effect {
            Effect::Http { status, .. } => match status {
                429 => FailureClass::ToolTimeout,
                404 => FailureClass::EmptyOutput,
                400..=499 => FailureClass::ArgumentInvalid,
                _ => transient_or(FailureClass::ToolUnavailable),
            },
            Effect::Timeout { .. } => transient_or(FailureClass::ToolUnavailable),
            Effect::Slow { .. } => return None,
            Effect::Empty { .. } => FailureClass::EmptyOutput,
            Effect::ErrorBody { .. } => FailureClass::ToolUnavailable,
            Effect::Malformed { .. } | Effect::SchemaDrift { .. } => FailureClass::MalformedOutput,
            Effect::Stale { .. } => FailureClass::StaleContext,
            Effect::Skew { .. } => FailureClass::VerificationFailure,
            Effect::WrongArgs { .. } => FailureClass::ArgumentInvalid,
            Effect::WrongTool { .. } => FailureClass::WrongTool,
            Effect::MissingStep => FailureClass::PlanningFailure,
            Effect::Repetition => FailureClass::ControlLoop,
        })
    }

    /// How long a transient draw with `k` attempts lasts when it clears by time (`None`: it
    /// clears by attempts). The duration spans `clears_after_ms` as `k` spans `transient_k`.
    pub fn duration_ms(&self, k: u32) -> Option<u64> {
        let [lo, hi] = self.clears_after_ms?;
        let [klo, khi] = self.transient_k;
        let u = if khi > klo {
            f64::from(k.saturating_sub(klo)) / f64::from(khi - klo)
        } else {
            0.5
        };
        Some(lo + ((hi - lo) as f64 * u.clamp(0.0, 1.0)) as u64)
    }

    /// Whether the fault can strike step `s` of `task`.
    pub fn applies(&self, task: &TaskSpec, s: usize) -> bool {
        let plan = &task.plan;
        if self.at.is_some_and(|at| !at.matches(s, plan.steps.len())) {
            return false;
        }
        let Some(tool) = plan.step_tool(s) else {
            return false;
        };
        let reads = !plan.read_paths(s).is_empty();
        let side = match self.target {
            Target::Primary => tool.external,
            // A provider-wide outage takes every tool behind the provider, with a substitute
            // or not.
            Target::Both if self.provider_wide => tool.external,
            Target::Substitute | Target::Both => tool.external && tool.substitute.is_some(),
            Target::Local => !tool.external,
            Target::Agent => true,
        };
        if !side {
            return false;
        }
        match &self.effect {
            Effect::Stale { .. } => tool.freshness,
            Effect::Empty { .. } | Effect::SchemaDrift { .. } | Effect::Skew { .. } => reads,
            Effect::MissingStep => s + 1 < plan.steps.len() && reads && s + 1 < plan.steps.len(),
            Effect::Repetition => s > 0,
            Effect::WrongTool {
                op: ToolOp::Sibling,
            } => tool.sibling.is_some(),
            Effect::WrongArgs { .. } => !plan.steps[s].args.is_empty(),
            Effect::Http { .. }
            | Effect::Timeout { .. }
            | Effect::Slow { .. }
            | Effect::ErrorBody { .. }
            | Effect::Malformed { .. }
            | Effect::WrongTool {
                op: ToolOp::Unknown,
            } => true,
        }
    }
}

/// The fallback model that escalation hands over to.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Escalation {
    /// Share of its calls on which it makes a mistake of its own (broken arguments).
    pub error_rate: f64,
    /// Share of *permanent* agent faults it can fix (transient ones it fixes unless it errs).
    pub fixes_permanent: f64,
}

impl Default for Escalation {
    fn default() -> Self {
        Escalation {
            error_rate: 0.15,
            fixes_permanent: 0.5,
        }
    }
}

/// How often a model errs on its own, per call it writes, with no fault injected (issue 32).
/// The rates are estimates; their grounds are in `docs/bench/faults.md` ("The model errs").
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Rates {
    /// Calls another tool on offer (the step tool's sibling half the time when there is one).
    pub wrong_tool: f64,
    /// Writes one argument wrong.
    pub wrong_arg: f64,
    /// Share of wrong arguments taken from the context (another value the prompt names, or a
    /// value of an earlier result) rather than made up.
    pub from_context: f64,
    /// Leaves one argument out.
    pub missing_arg: f64,
    /// Writes no call for a step that is not the last.
    pub skip_step: f64,
    /// Repeats the previous step's call.
    pub repeat_step: f64,
    /// Answers before the last call: writes no call for the last step.
    pub premature_answer: f64,
    /// A replan that still leaves out the step it was asked to restore.
    pub replan_failure: f64,
}

impl Rates {
    /// A model that never errs.
    pub const PERFECT: Rates = Rates {
        wrong_tool: 0.0,
        wrong_arg: 0.0,
        from_context: 0.0,
        missing_arg: 0.0,
        skip_step: 0.0,
        repeat_step: 0.0,
        premature_answer: 0.0,
        replan_failure: 0.0,
    };

    /// The agent's model by default: a small open model (estimates, `docs/bench/faults.md`).
    pub const SMALL: Rates = Rates {
        wrong_tool: 0.02,
        wrong_arg: 0.03,
        from_context: 0.5,
        missing_arg: 0.01,
        skip_step: 0.005,
        repeat_step: 0.005,
        premature_answer: 0.005,
        replan_failure: 0.2,
    };

    /// The fallback model by default: a frontier model, better, not perfect.
    pub const FRONTIER: Rates = Rates {
        wrong_tool: 0.005,
        wrong_arg: 0.01,
        from_context: 0.5,
        missing_arg: 0.003,
        skip_step: 0.002,
        repeat_step: 0.002,
        premature_answer: 0.002,
        replan_failure: 0.05,
    };

    fn valid(&self) -> bool {
        let xs = [
            self.wrong_tool,
            self.wrong_arg,
            self.from_context,
            self.missing_arg,
            self.skip_step,
            self.repeat_step,
            self.premature_answer,
            self.replan_failure,
        ];
        xs.iter().all(|x| prob(*x))
            && self.wrong_tool
                + self.wrong_arg
                + self.missing_arg
                + self.skip_step.max(self.premature_answer)
                + self.repeat_step
                <= 1.0
    }
}

impl Default for Rates {
    fn default() -> Self {
        Rates::SMALL
    }
}

/// The `[model]` table: the agent's model's own error rates and the fallback model's.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelRates {
    /// The agent's own model (`[model.agent]`; default [`Rates::SMALL`]).
    #[serde(default)]
    pub agent: Rates,
    /// The fallback model escalation hands over to (`[model.fallback]`; default
    /// [`Rates::FRONTIER`]).
    #[serde(default = "frontier", deserialize_with = "fallback_rates")]
    pub fallback: Rates,
}

fn frontier() -> Rates {
    Rates::FRONTIER
}

/// `[model.fallback]`: a rate left out keeps the frontier model's default ([`Rates::FRONTIER`]),
/// not the small model's that [`Rates`]'s own default fills in.
fn fallback_rates<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Rates, D::Error> {
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Given {
        wrong_tool: Option<f64>,
        wrong_arg: Option<f64>,
        from_context: Option<f64>,
        missing_arg: Option<f64>,
        skip_step: Option<f64>,
        repeat_step: Option<f64>,
        premature_answer: Option<f64>,
        replan_failure: Option<f64>,
    }
    let g = Given::deserialize(d)?;
    let f = Rates::FRONTIER;
    Ok(Rates {
        wrong_tool: g.wrong_tool.unwrap_or(f.wrong_tool),
        wrong_arg: g.wrong_arg.unwrap_or(f.wrong_arg),
        from_context: g.from_context.unwrap_or(f.from_context),
        missing_arg: g.missing_arg.unwrap_or(f.missing_arg),
        skip_step: g.skip_step.unwrap_or(f.skip_step),
        repeat_step: g.repeat_step.unwrap_or(f.repeat_step),
        premature_answer: g.premature_answer.unwrap_or(f.premature_answer),
        replan_failure: g.replan_failure.unwrap_or(f.replan_failure),
    })
}

impl ModelRates {
    /// Models that never err on their own (only injected faults).
    pub const PERFECT: ModelRates = ModelRates {
        agent: Rates::PERFECT,
        fallback: Rates::PERFECT,
    };
}

impl Default for ModelRates {
    fn default() -> Self {
        ModelRates {
            agent: Rates::SMALL,
            fallback: Rates::FRONTIER,
        }
    }
}

/// A whole fault model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FaultModel {
    /// Probability that a faulted step draws a second fault (several faults on one step).
    #[serde(default)]
    pub extra_fault: f64,
    /// The fallback model.
    #[serde(default)]
    pub escalation: Escalation,
    /// The models' own error rates (`[model]`; default: a small agent model and a frontier
    /// fallback, see [`ModelRates`]).
    #[serde(default)]
    pub model: ModelRates,
    /// The faults.
    #[serde(rename = "fault")]
    pub faults: Vec<FaultSpec>,
}

/// Why a fault model was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FaultModelError {
    /// The TOML does not parse or does not fit the format.
    #[error("not a valid fault model: {0}")]
    Parse(String),
    /// A value is out of range or a combination makes no sense.
    #[error("fault `{name}`: {message}")]
    Invalid {
        /// The fault's name.
        name: String,
        /// What is wrong.
        message: String,
    },
    /// The model as a whole is unusable.
    #[error("{0}")]
    Model(String),
}

fn prob(x: f64) -> bool {
    x.is_finite() && (0.0..=1.0).contains(&x)
}

impl FaultModel {
    /// Parses and validates a TOML fault model.
    pub fn from_toml_str(s: &str) -> Result<FaultModel, FaultModelError> {
        let m: FaultModel = toml::from_str(s).map_err(|e| FaultModelError::Parse(e.to_string()))?;
        m.validate()?;
        Ok(m)
    }

    /// The default model.
    pub fn default_model() -> Result<FaultModel, FaultModelError> {
        FaultModel::from_toml_str(DEFAULT_TOML)
    }

    /// Checks ranges and combinations.
    pub fn validate(&self) -> Result<(), FaultModelError> {
        if self.faults.is_empty() {
            return Err(FaultModelError::Model("the model has no [[fault]]".into()));
        }
        if !prob(self.extra_fault) {
            return Err(FaultModelError::Model(
                "extra_fault must be in [0, 1]".into(),
            ));
        }
        if !prob(self.escalation.error_rate) || !prob(self.escalation.fixes_permanent) {
            return Err(FaultModelError::Model(
                "escalation.error_rate and escalation.fixes_permanent must be in [0, 1]".into(),
            ));
        }
        if !self.model.agent.valid() || !self.model.fallback.valid() {
            return Err(FaultModelError::Model(
                "[model] rates must be in [0, 1], and a model's error rates may not sum past 1"
                    .into(),
            ));
        }
        let mut names = std::collections::BTreeSet::new();
        for f in &self.faults {
            let bad = |message: &str| FaultModelError::Invalid {
                name: f.name.clone(),
                message: message.to_owned(),
            };
            if f.name.is_empty() || !names.insert(f.name.clone()) {
                return Err(bad("names must be non-empty and unique"));
            }
            if !(f.weight.is_finite() && f.weight >= 0.0) {
                return Err(bad("weight must be ≥ 0"));
            }
            if !prob(f.permanent) || !prob(f.probability) || f.probability == 0.0 {
                return Err(bad("permanent must be in [0, 1] and probability in (0, 1]"));
            }
            if f.transient_k[0] == 0 || f.transient_k[0] > f.transient_k[1] || f.transient_k[1] > 20
            {
                return Err(bad(
                    "transient_k must be [min, max] with 1 ≤ min ≤ max ≤ 20",
                ));
            }
            if f.effect.is_agent() != (f.target == Target::Agent) {
                return Err(bad(
                    "agent effects (wrong_args, wrong_tool, missing_step, repetition) need target = \"agent\", and target = \"agent\" needs one of them",
                ));
            }
            match &f.effect {
                Effect::Malformed { keep, .. } if !(0.05..=0.95).contains(keep) => {
                    return Err(bad("malformed.keep must be in [0.05, 0.95]"));
                }
                Effect::Stale { skew, .. } | Effect::Skew { range: skew }
                    if !(skew[0].is_finite()
                        && skew[1].is_finite()
                        && 0.0 <= skew[0]
                        && skew[0] <= skew[1]
                        && skew[1] < 1.0) =>
                {
                    return Err(bad(
                        "a skew range must be [min, max] with 0 ≤ min ≤ max < 1",
                    ));
                }
                _ if f.window.is_some_and(|w| w.start_ms >= w.end_ms) => {
                    return Err(bad("window needs start_ms < end_ms"));
                }
                _ if f.clears_after_ms.is_some_and(|[a, b]| a > b || b == 0) => {
                    return Err(bad(
                        "clears_after_ms must be [min, max] with min ≤ max, max > 0",
                    ));
                }
                _ if f.provider_wide
                    && !(f.window.is_some()
                        && matches!(f.effect, Effect::Http { .. } | Effect::Timeout { .. })
                        && matches!(f.target, Target::Primary | Target::Both)) =>
                {
                    return Err(bad(
                        "provider_wide needs a window, an http or timeout effect and target = \"primary\" or \"both\"",
                    ));
                }
                Effect::Http { status, .. } if !(400..=599).contains(status) => {
                    return Err(bad("http.status must be an error status (400–599)"));
                }
                Effect::Stale { .. } if f.target == Target::Local => {
                    return Err(bad(
                        "a local tool carries no as_of: stale needs an external target",
                    ));
                }
                _ => {}
            }
        }
        if self.faults.iter().all(|f| f.weight <= 0.0) {
            return Err(FaultModelError::Model("every weight is 0".into()));
        }
        Ok(())
    }

    /// The model with family totals rescaled to `mix` (each family's weights keep their ratios).
    pub fn with_mix(&self, mix: &Mix) -> FaultModel {
        let mut totals: BTreeMap<Family, f64> = BTreeMap::new();
        for f in &self.faults {
            *totals.entry(f.family).or_default() += f.weight;
        }
        let mut m = self.clone();
        for f in &mut m.faults {
            let t = totals.get(&f.family).copied().unwrap_or(0.0);
            f.weight = if t > 0.0 {
                f.weight / t * mix.weight(f.family)
            } else {
                0.0
            };
        }
        m
    }

    /// Only the semantic family (the silent-failure setting).
    pub fn silent(&self) -> FaultModel {
        let mut m = self.clone();
        m.faults.retain(|f| f.family == Family::Semantic);
        m
    }
}

/// One drawn fault.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Injected {
    /// The step it hits.
    pub step: usize,
    /// Index into [`FaultModel::faults`].
    pub spec: usize,
    /// Whether it never clears.
    pub permanent: bool,
    /// For transient faults: how many attempts it lasts.
    pub k: u32,
    /// The signed relative skew, for skew and stale effects.
    pub skew: f64,
}

/// The faults of one task under one seed: a pure function of `(task, seed, fault_rate, model)`.
pub fn draw(task: &TaskSpec, seed: u64, fault_rate: f64, model: &FaultModel) -> Vec<Injected> {
    let mut rng = SplitMix64::new(
        seed.wrapping_mul(0x9E37_79B9_7F4A_7C15)
            ^ (task.id as u64).wrapping_mul(0xD1B5_4A32_D192_ED03),
    );
    let mut out = Vec::new();
    for s in 0..task.plan.steps.len() {
        // Every number is drawn whether used or not, so schedules stay aligned across settings.
        let hit = rng.next_f64();
        let draws: [[f64; 5]; 2] = [
            [
                rng.next_f64(),
                rng.next_f64(),
                rng.next_f64(),
                rng.next_f64(),
                rng.next_f64(),
            ],
            [
                rng.next_f64(),
                rng.next_f64(),
                rng.next_f64(),
                rng.next_f64(),
                rng.next_f64(),
            ],
        ];
        if hit >= fault_rate {
            continue;
        }
        let applicable: Vec<usize> = (0..model.faults.len())
            .filter(|&i| {
                let f = &model.faults[i];
                f.weight > 0.0 && f.window.is_none() && f.applies(task, s)
            })
            .collect();
        let total: f64 = applicable.iter().map(|&i| model.faults[i].weight).sum();
        if total <= 0.0 {
            continue;
        }
        for (n, d) in draws.iter().enumerate() {
            if n == 1 && d[4] >= model.extra_fault {
                break;
            }
            let mut x = d[0] * total;
            let mut pick = applicable.last().copied();
            for &i in &applicable {
                let w = model.faults[i].weight;
                if x < w {
                    pick = Some(i);
                    break;
                }
                x -= w;
            }
            let Some(i) = pick else { continue };
            if out.iter().any(|f: &Injected| f.step == s && f.spec == i) {
                continue;
            }
            let f = &model.faults[i];
            let permanent = d[1] < f.permanent;
            let [lo, hi] = f.transient_k;
            let k = lo + ((d[2] * f64::from(hi - lo + 1)) as u32).min(hi - lo);
            let range = match &f.effect {
                Effect::Stale { skew, .. } => Some((*skew, -1.0)),
                Effect::Skew { range } => Some((*range, if d[3] < 0.5 { -1.0 } else { 1.0 })),
                Effect::Http { .. }
                | Effect::Timeout { .. }
                | Effect::Slow { .. }
                | Effect::Empty { .. }
                | Effect::ErrorBody { .. }
                | Effect::Malformed { .. }
                | Effect::SchemaDrift { .. }
                | Effect::WrongArgs { .. }
                | Effect::WrongTool { .. }
                | Effect::MissingStep
                | Effect::Repetition => None,
            };
            let skew = range.map_or(0.0, |([a, b], sign)| {
                sign * (a + (b - a) * ((d[3] * 2.0).fract()))
            });
            out.push(Injected {
                step: s,
                spec: i,
                permanent,
                k,
                skew,
            });
        }
    }
    out
}

/// The faults in time an episode starting at `start_ms` meets: one entry per windowed fault
/// whose window holds the start and that applies to some step, or is provider-wide (the episode
/// arms it on every step it applies to, and it is on while the clock is inside the window).
pub(crate) fn windowed(task: &TaskSpec, start_ms: u64, model: &FaultModel) -> Vec<Injected> {
    model
        .faults
        .iter()
        .enumerate()
        .filter(|(_, f)| f.window.is_some_and(|w| w.contains(start_ms)))
        .filter_map(|(i, f)| {
            // A provider-wide outage meets every episode through its model, even one whose
            // steps are all local: it is anchored at step 0 then, and strikes no tool there.
            let step = (0..task.plan.steps.len())
                .find(|&s| f.applies(task, s))
                .or_else(|| (f.provider_wide && !task.plan.steps.is_empty()).then_some(0))?;
            Some(Injected {
                step,
                spec: i,
                permanent: true,
                k: 1,
                skew: 0.0,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn the_default_model_parses_and_every_fault_applies_somewhere() {
        let m = FaultModel::default_model().unwrap();
        let tasks = crate::task::builtin(100);
        for (i, f) in m.faults.iter().enumerate() {
            let somewhere = tasks
                .iter()
                .any(|t| (0..t.plan.steps.len()).any(|s| f.applies(t, s)));
            assert!(somewhere, "fault {i} `{}` applies nowhere", f.name);
        }
    }

    #[test]
    fn bad_models_are_refused_with_a_reason() {
        let cases = [
            ("", "fault"),
            ("[[fault]]\nname = \"x\"", "not a valid fault model"),
            (
                "[[fault]]\nname=\"x\"\nfamily=\"runtime\"\nweight=1\ntarget=\"primary\"\neffect={kind=\"repetition\"}",
                "agent effects",
            ),
            (
                "[[fault]]\nname=\"x\"\nfamily=\"runtime\"\nweight=1\ntarget=\"primary\"\npermanent=2\neffect={kind=\"timeout\"}",
                "permanent",
            ),
            (
                "[[fault]]\nname=\"x\"\nfamily=\"runtime\"\nweight=1\ntarget=\"primary\"\neffect={kind=\"explode\"}",
                "not a valid",
            ),
        ];
        for (text, needle) in cases {
            let e = FaultModel::from_toml_str(text).unwrap_err().to_string();
            assert!(e.contains(needle), "{text:?} gave {e:?}");
        }
    }

    /// Issue 32: the `[model]` table sets the models' own error rates; a key left out keeps its
    /// default (`[model.fallback]` left out: the frontier model), and rates a model cannot have
    /// are refused.
    #[test]
    fn the_model_table_sets_the_models_own_error_rates() {
        let fault = "[[fault]]\nname=\"x\"\nfamily=\"runtime\"\nweight=1\ntarget=\"primary\"\neffect={kind=\"timeout\"}";
        let none = FaultModel::from_toml_str(fault).unwrap();
        assert_eq!(none.model, ModelRates::default());
        let m = FaultModel::from_toml_str(&format!(
            "[model.agent]\nwrong_tool = 0.4\nreplan_failure = 0.9\n{fault}"
        ))
        .unwrap();
        assert_eq!(m.model.agent.wrong_tool, 0.4);
        assert_eq!(m.model.agent.replan_failure, 0.9);
        assert_eq!(m.model.agent.wrong_arg, Rates::SMALL.wrong_arg);
        assert_eq!(m.model.fallback, Rates::FRONTIER);
        // A fallback rate left out is the frontier model's, not the small model's.
        let f =
            FaultModel::from_toml_str(&format!("[model.fallback]\nwrong_tool = 0.001\n{fault}"))
                .unwrap();
        assert_eq!(f.model.fallback.wrong_tool, 0.001);
        assert_eq!(f.model.fallback.wrong_arg, Rates::FRONTIER.wrong_arg);
        assert_eq!(
            f.model.fallback.replan_failure,
            Rates::FRONTIER.replan_failure
        );
        assert_eq!(f.model.agent, Rates::SMALL);
        for bad in [
            "[model.agent]\nwrong_tool = 1.5",
            "[model.agent]\nwrong_tool = 0.6\nwrong_arg = 0.6",
            "[model.fallback]\nmistakes = 0.1",
        ] {
            assert!(
                FaultModel::from_toml_str(&format!("{bad}\n{fault}")).is_err(),
                "{bad}"
            );
        }
    }

    #[test]
    fn draws_are_pure_and_seed_dependent() {
        let m = FaultModel::default_model().unwrap();
        let ts = crate::task::builtin(100);
        let a: Vec<_> = ts.iter().map(|t| draw(t, 1, 0.3, &m)).collect();
        let b: Vec<_> = ts.iter().map(|t| draw(t, 1, 0.3, &m)).collect();
        let c: Vec<_> = ts.iter().map(|t| draw(t, 2, 0.3, &m)).collect();
        assert_eq!(a, b);
        assert_ne!(a, c);
    }
}
