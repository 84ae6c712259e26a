//! # selfheal-bench — a seeded fault-injection benchmark for tool-using agents
//!
//! Tasks ([`TaskSpec`]: the built-in catalogue of 100, or a JSONL file such as the imported NESTFUL
//! set), a fault model read from TOML ([`FaultModel`], default `faults/default.toml`), one
//! simulated world per episode ([`Episode`], the only code that reads the truth and the schedule),
//! and eight strategies that see only what a client sees ([`Strategy`]). A result is a pure
//! function of `(config, seed)`: the same inputs give byte-identical JSON.
//!
//! The benchmark is built so that it can show the winner losing: the cross-check verifier is a
//! real, faultable, charged call that can be wrong both ways; repair runs on the bytes returned;
//! escalation is a fallible, priced model; some faults have no fix. The report leads with RSR,
//! pairs every baseline with self-healing on the same episodes, and reports the fault census, a
//! per-fault truth table, cost per success and the classifier's confusion matrix.
//!
//! ```
//! use selfheal_bench::{BenchConfig, run};
//! let config = BenchConfig { seeds: 1, tasks: 20, ..BenchConfig::default() };
//! let report = run(&config, &mut |_, _| {}, None);
//! assert_eq!(report.results.len(), 8);
//! assert!(report.results.iter().all(|r| (0.0..=1.0).contains(&r.tsr)));
//! ```

// The modules are private: what callers use is re-exported below.
mod catalogue;
mod exec;
mod faultmodel;
mod faults;
mod healer;
mod plot;
mod report;
mod stats;
mod strategies;
mod task;

/// The NESTFUL-style catalogue the built-in tasks are drawn from.
pub use catalogue::{Arg, Group, Step, Task, tasks};
/// The world of one episode: what a client can do, and what it costs.
pub use exec::{
    AS_OF, Costs, EPISODE_SPACING_MS, Episode, EpisodeRecord, MAX_AGE_MS, Purpose, Response, Tally,
    ToolResponse, Writer, Written, latency,
};
/// Fault models as data, and the schedule drawn from one.
pub use faultmodel::{
    ArgsOp, AsOf, At, AtName, DEFAULT_TOML, Effect, Escalation, FaultModel, FaultModelError,
    FaultSpec, Injected, MalformOp, ModelRates, Rates, RenameOp, Target, ToolOp, Window, draw,
};
/// Fault families and the mix of them a run draws.
pub use faults::{Family, Mix};
/// The episode's one core run.
pub use healer::{Healer, Proposal};
/// The report's charts.
pub use plot::{Chart, Rate, Series, grouped_bars, strategy_color};
/// The report: the terminal table, the Markdown report and its SVG charts.
pub use report::{
    markdown as report_markdown, svg_class_bars, svg_risk_coverage, svg_tsr_by_budget,
    table as report_table,
};
/// The strategies, and the client they share.
pub use strategies::{Ended, Strategy, read_for_run, self_healing_budget};
/// Tasks, plans and their tools.
pub use task::{
    ANSWER_TOLERANCE, AnswerSpec, ArgSrc, Behaviour, FieldType, Noise, Op, Param, Piece, Plan,
    PlanStep, ResolveError, TaskFileError, TaskSpec, Tolerance, ToolSpec, builtin, get_path,
    load_jsonl, resolve_answer, resolve_args,
};

use std::collections::BTreeMap;

use serde::Serialize;

use selfheal_core::{FailureClass, Policy};

/// The weights of the cost model `K = a·M + b·U + c·V + d·R + e·E`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct CostWeights {
    /// Per call of the agent's model (M).
    pub model: f64,
    /// Per tool call (U).
    pub tool: f64,
    /// Per verifier call (V).
    pub verifier: f64,
    /// Per recovery action (R).
    pub recovery: f64,
    /// Per call of the fallback model (E): a stronger model costs more.
    pub escalation: f64,
}

impl Default for CostWeights {
    fn default() -> Self {
        CostWeights {
            model: 1.0,
            tool: 1.0,
            verifier: 1.0,
            recovery: 1.0,
            escalation: 5.0,
        }
    }
}

impl CostWeights {
    /// Parses `a,b,c,d` or `a,b,c,d,e` (the escalation weight defaults to 5).
    pub fn parse(s: &str) -> Result<CostWeights, String> {
        let xs: Vec<f64> = s
            .split(',')
            .map(|x| {
                x.trim()
                    .parse::<f64>()
                    .map_err(|_| format!("not a number: {x:?}"))
            })
            .collect::<Result<_, _>>()?;
        if !xs.iter().all(|x| x.is_finite() && *x >= 0.0) {
            return Err("cost weights must be ≥ 0".into());
        }
        match xs.as_slice() {
            [a, b, c, d] => Ok(CostWeights {
                model: *a,
                tool: *b,
                verifier: *c,
                recovery: *d,
                escalation: 5.0,
            }),
            [a, b, c, d, e] => Ok(CostWeights {
                model: *a,
                tool: *b,
                verifier: *c,
                recovery: *d,
                escalation: *e,
            }),
            _ => Err(format!(
                "expected weights a,b,c,d[,e] (model, tool, verifier, recovery, escalation), got {}",
                xs.len()
            )),
        }
    }

    fn k(&self, c: &exec::Costs) -> f64 {
        self.model * c.model_calls as f64
            + self.tool * c.tool_calls as f64
            + self.verifier * c.verifier_calls as f64
            + self.recovery * c.recoveries as f64
            + self.escalation * c.escalated_calls as f64
    }
}

/// Which tasks to run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TaskSet {
    /// A name for the report (`builtin` or the file name).
    pub name: String,
    /// The tasks.
    #[serde(skip)]
    pub tasks: Vec<TaskSpec>,
}

impl TaskSet {
    /// The built-in catalogue.
    pub fn builtin() -> TaskSet {
        TaskSet {
            name: "builtin".into(),
            tasks: task::builtin(100),
        }
    }
}

/// What to run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BenchConfig {
    /// The first seed.
    pub seed: u64,
    /// How many consecutive seeds.
    pub seeds: u32,
    /// How many of the task set's tasks (the first N).
    pub tasks: usize,
    /// The task set.
    pub task_set: TaskSet,
    /// Probability that a step is faulted.
    pub fault_rate: f64,
    /// The fault model's name (`default` or the file name).
    pub fault_model_name: String,
    /// The fault model.
    #[serde(skip)]
    pub fault_model: FaultModel,
    /// Family weights that rescale the model (`None`: the model's own weights).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mix: Option<Mix>,
    /// Recovery actions allowed per failure (`R`), when not sweeping.
    pub budget: u32,
    /// Run `R = 1..=5`.
    pub sweep: bool,
    /// The semantic silent-failure setting (only the model's semantic faults).
    pub silent: bool,
    /// Cost weights.
    pub weights: CostWeights,
    /// Strategies to run.
    pub strategies: Vec<Strategy>,
    /// The policy `self-healing` runs with (`None`: the default policy).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub policy: Option<Policy>,
    /// A deployment: a seed's episodes run in sequence against one world whose tools keep their
    /// state — a tool that breaks for good stays broken for every later episode that calls it.
    pub deployment: bool,
}

impl Default for BenchConfig {
    fn default() -> Self {
        BenchConfig {
            seed: 1,
            seeds: 10,
            tasks: 100,
            task_set: TaskSet::builtin(),
            fault_rate: 0.1,
            fault_model_name: "default".into(),
            fault_model: FaultModel::default_model().unwrap_or_else(|_| FaultModel {
                extra_fault: 0.0,
                escalation: faultmodel::Escalation::default(),
                model: faultmodel::ModelRates::default(),
                faults: Vec::new(),
            }),
            mix: None,
            budget: 5,
            sweep: false,
            silent: false,
            weights: CostWeights::default(),
            strategies: Strategy::ALL.to_vec(),
            policy: None,
            deployment: false,
        }
    }
}

impl BenchConfig {
    /// Checks the values.
    pub fn validate(&self) -> Result<(), String> {
        if !(0.0..=1.0).contains(&self.fault_rate) {
            return Err(format!(
                "--fault-rate must be in [0, 1], got {}",
                self.fault_rate
            ));
        }
        if self.seeds == 0 {
            return Err("--seeds must be at least 1".into());
        }
        let n = self.task_set.tasks.len();
        if self.tasks == 0 || self.tasks > n {
            return Err(format!(
                "--tasks must be in 1..={n} for task set `{}`, got {}",
                self.task_set.name, self.tasks
            ));
        }
        if self.budget == 0 || self.budget > 20 {
            return Err(format!("--budget must be in 1..=20, got {}", self.budget));
        }
        if self.strategies.is_empty() {
            return Err("no strategy selected".into());
        }
        self.effective_model().validate().map_err(|e| e.to_string())
    }

    /// The budgets this configuration runs.
    pub fn budgets(&self) -> Vec<u32> {
        if self.sweep {
            (1..=5).collect()
        } else {
            vec![self.budget]
        }
    }

    /// The fault model in effect (`--silent` and `--mix` applied).
    pub fn effective_model(&self) -> FaultModel {
        let m = match &self.mix {
            Some(mix) => self.fault_model.with_mix(mix),
            None => self.fault_model.clone(),
        };
        if self.silent { m.silent() } else { m }
    }

    /// Episodes the configuration's strategies run (the rows of the report). A sweep's risk
    /// curve runs [`BenchConfig::curve_episodes`] more.
    pub fn episodes(&self) -> u64 {
        self.budgets().len() as u64
            * self.strategies.len() as u64
            * u64::from(self.seeds)
            * self.tasks as u64
    }

    /// The `risk` settings a sweep runs self-healing at for its curve: [`RISK_SETTINGS`] and the
    /// policy's own setting, in order. Empty when no curve is drawn (no `sweep`, or
    /// self-healing not among the strategies).
    pub fn risk_settings(&self) -> Vec<f64> {
        if !(self.sweep && self.strategies.contains(&Strategy::SelfHealing)) {
            return Vec::new();
        }
        let own = self
            .policy
            .as_ref()
            .map_or(Policy::default().risk, |p| p.risk);
        let mut settings = RISK_SETTINGS.to_vec();
        if !settings.contains(&own) {
            settings.push(own);
            settings.sort_by(f64::total_cmp);
        }
        settings
    }

    /// Episodes the sweep's risk curve runs on top of [`BenchConfig::episodes`]: one per
    /// setting of [`BenchConfig::risk_settings`], seed and task.
    pub fn curve_episodes(&self) -> u64 {
        self.risk_settings().len() as u64 * u64::from(self.seeds) * self.tasks as u64
    }
}

/// One row of the results.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ResultRow {
    /// Strategy name.
    pub strategy: &'static str,
    /// Recovery actions allowed per failure.
    pub budget: u32,
    /// Episodes run.
    pub episodes: u64,
    /// Task success rate.
    pub tsr: f64,
    /// Recovery success rate (faulted episodes that succeeded / faulted episodes).
    pub rsr: f64,
    /// Silent failure rate (wrong answers returned as correct / all episodes).
    pub sfr: f64,
    /// Mean cost K per episode.
    pub cost: f64,
    /// Mean simulated latency per episode.
    pub latency_ms: f64,
}

/// Recovery of one class or family.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Recovered {
    /// Episodes that met it.
    pub met: u64,
    /// Of those, episodes that succeeded.
    pub succeeded: u64,
}

/// Everything else about one row.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Detail {
    /// Strategy name.
    pub strategy: &'static str,
    /// Budget.
    pub budget: u32,
    /// Successful episodes.
    pub successes: u64,
    /// Episodes that met at least one fault.
    pub faulted: u64,
    /// Of those, successes.
    pub recovered: u64,
    /// Wrong answers returned as correct.
    pub silent_failures: u64,
    /// Of the faulted episodes: wrong answers returned as correct.
    pub silent_faulted: u64,
    /// Wilson 95 % interval of TSR.
    pub tsr_ci: [f64; 2],
    /// Wilson 95 % interval of RSR.
    pub rsr_ci: [f64; 2],
    /// Wilson 95 % interval of SFR.
    pub sfr_ci: [f64; 2],
    /// Mean model calls per episode.
    pub model_calls: f64,
    /// Mean fallback-model calls per episode.
    pub escalated_calls: f64,
    /// Mean tool calls per episode.
    pub tool_calls: f64,
    /// Mean verifier calls per episode.
    pub verifier_calls: f64,
    /// Mean recovery actions per episode.
    pub recovery_actions: f64,
    /// Total K over the number of successful episodes: what one success costs (`None`: no
    /// success to pay for).
    pub cost_per_success: Option<f64>,
    /// The verifier's record against the truth.
    pub verifier: VerifierRecord,
    /// Recovery by ground-truth failure class.
    pub by_class: BTreeMap<FailureClass, Recovered>,
    /// Recovery by fault family.
    pub by_family: BTreeMap<Family, Recovered>,
    /// Outcome by fault name: met, succeeded, silent.
    pub by_fault: BTreeMap<String, KindOutcome>,
    /// Episodes in which nothing went wrong: no fault scheduled, no mistake of the model's own.
    pub clean_episodes: u64,
    /// Detector → clean episodes in which it fired (false alarms; see `docs/bench/report.md`).
    pub false_alarms_clean: BTreeMap<&'static str, u64>,
}

/// How the cross-check verifier fared.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct VerifierRecord {
    /// Verdicts on faithful responses.
    pub on_faithful: u64,
    /// Of those, rejections.
    pub false_alarms: u64,
    /// Verdicts on wrong responses.
    pub on_wrong: u64,
    /// Of those, acceptances.
    pub misses: u64,
    /// Checks that could not tell (the other source failed); the value went on unverified.
    pub uncertain: u64,
}

impl VerifierRecord {
    /// False alarms / verdicts on faithful responses.
    pub fn false_alarm_rate(&self) -> f64 {
        ratio(self.false_alarms, self.on_faithful)
    }
    /// Misses / verdicts on wrong responses.
    pub fn miss_rate(&self) -> f64 {
        ratio(self.misses, self.on_wrong)
    }
}

/// Outcomes of episodes that drew one fault kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct KindOutcome {
    /// Episodes that drew it.
    pub met: u64,
    /// Of those, successes.
    pub succeeded: u64,
    /// Of those, wrong answers returned as correct.
    pub silent: u64,
}

/// The drawn schedule: what the workload really contained.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Census {
    /// Faults drawn by name.
    pub by_fault: BTreeMap<String, u64>,
    /// Faults drawn by family.
    pub by_family: BTreeMap<Family, u64>,
    /// Transient faults.
    pub transient: u64,
    /// Permanent faults.
    pub permanent: u64,
    /// Explicit faults.
    pub explicit: u64,
    /// Implicit faults.
    pub implicit: u64,
    /// Steps with more than one fault.
    pub multi_fault_steps: u64,
    /// Episodes (task × seed) with at least one fault.
    pub faulted_episodes: u64,
    /// Episodes (task × seed).
    pub episodes: u64,
}

/// Self-healing against one other strategy on the same episodes.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Paired {
    /// The other strategy.
    pub against: &'static str,
    /// Budget.
    pub budget: u32,
    /// RSR(self-healing) − RSR(other), on the faulted episodes.
    pub rsr_diff: f64,
    /// Its 95 % interval (paired bootstrap, clustered by task).
    pub rsr_ci: [f64; 2],
    /// TSR difference.
    pub tsr_diff: f64,
    /// Its 95 % interval.
    pub tsr_ci: [f64; 2],
    /// SFR difference (negative: self-healing has fewer silent failures).
    pub sfr_diff: f64,
    /// Its 95 % interval.
    pub sfr_ci: [f64; 2],
    /// Episodes only self-healing solved.
    pub only_self_healing: u64,
    /// Episodes only the other solved.
    pub only_other: u64,
    /// Exact McNemar two-sided p-value on success.
    pub mcnemar_p: f64,
    /// Episodes where self-healing returned a wrong answer as correct and the other the right
    /// answer: a value self-healing accepted that the other did not.
    pub self_wrong_other_right: u64,
    /// Episodes where self-healing returned a wrong answer as correct and the other returned no
    /// answer (it gave up or degraded before it could meet the wrong value, or instead of it).
    pub self_wrong_other_none: u64,
    /// Episodes where the other returned a wrong answer as correct and self-healing the right one.
    pub other_wrong_self_right: u64,
    /// Episodes where the other returned a wrong answer as correct and self-healing no answer.
    pub other_wrong_self_none: u64,
}

/// The classifier's record: injected class (or none) against inferred class.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Confusion {
    /// Strategy.
    pub strategy: &'static str,
    /// Rows: injected class (`"none"`: no fault at that step); columns: inferred class.
    pub matrix: BTreeMap<String, BTreeMap<FailureClass, u64>>,
    /// Inferences whose class equals the injected one.
    pub correct: u64,
    /// Inferences at a step with an injected class.
    pub total: u64,
}

/// The whole report.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Report {
    /// The configuration.
    pub config: BenchConfig,
    /// One row per (strategy, budget).
    pub results: Vec<ResultRow>,
    /// Intervals and breakdowns per row.
    pub details: Vec<Detail>,
    /// Self-healing against each other strategy, per budget.
    pub paired: Vec<Paired>,
    /// The classifier's confusion matrix at the largest budget (controller strategies).
    pub confusion: Vec<Confusion>,
    /// What the schedule contained.
    pub census: Census,
    /// Risk and coverage at the largest budget: each strategy's (recovered, silent) point on
    /// the faulted episodes, and whether it is on the frontier.
    pub frontier: Vec<RiskPoint>,
    /// Self-healing's curve over its policy's `risk` setting ([`RISK_SETTINGS`] and the
    /// policy's own) at the largest budget, on the same episodes: filled by a `--sweep` that runs self-healing, empty
    /// otherwise (it costs one more self-healing run per setting).
    pub risk_curve: Vec<RiskSetting>,
}

/// The `risk` settings self-healing's curve is drawn over: from claiming nothing after a
/// recovery (0) to claiming an unchecked value whose source is right nine times in ten (0.1) and
/// beyond; the default (0.01) among them. `risk` must be in `[0, 1)`.
pub const RISK_SETTINGS: [f64; 7] = [0.0, 0.001, 0.01, 0.05, 0.1, 0.3, 0.9];

/// Self-healing at one `risk` setting: its (recovered, silent) point on the faulted episodes,
/// everything else in its policy as configured.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RiskSetting {
    /// The policy's `risk`.
    pub risk: f64,
    /// Whether it is the setting the policy has (the self-healing row of the report).
    pub configured: bool,
    /// Budget.
    pub budget: u32,
    /// Recovered share of the faulted episodes (RSR).
    pub recovered: f64,
    /// Its 95 % interval.
    pub recovered_ci: [f64; 2],
    /// Silent share of the faulted episodes.
    pub silent: f64,
    /// Its 95 % interval.
    pub silent_ci: [f64; 2],
    /// Silent failures over all episodes (SFR).
    pub sfr: f64,
    /// No strategy's point in [`Report::frontier`] recovers at least as much with at most as
    /// many silent failures (and strictly better on one).
    pub on_frontier: bool,
}

/// One strategy's risk/coverage point: of the faulted episodes, the share recovered (RSR) and
/// the share answered wrongly as if correct.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RiskPoint {
    /// Strategy.
    pub strategy: &'static str,
    /// Budget.
    pub budget: u32,
    /// Recovered share of the faulted episodes (RSR), with its Wilson interval.
    pub recovered: f64,
    /// Its 95 % interval.
    pub recovered_ci: [f64; 2],
    /// Silent share of the faulted episodes, with its Wilson interval.
    pub silent: f64,
    /// Its 95 % interval.
    pub silent_ci: [f64; 2],
    /// No other strategy recovers at least as much with at most as many silent failures (and
    /// strictly better on one).
    pub on_frontier: bool,
}

/// The risk/coverage points of the strategies at budget `budget`, frontier marked.
pub fn risk_points(details: &[Detail], budget: u32) -> Vec<RiskPoint> {
    let mut pts: Vec<RiskPoint> = details
        .iter()
        .filter(|d| d.budget == budget)
        .map(|d| RiskPoint {
            strategy: d.strategy,
            budget,
            recovered: ratio(d.recovered, d.faulted),
            recovered_ci: d.rsr_ci,
            silent: ratio(d.silent_faulted, d.faulted),
            silent_ci: wilson(d.silent_faulted, d.faulted),
            on_frontier: false,
        })
        .collect();
    let dominated: Vec<bool> = pts
        .iter()
        .map(|p| {
            pts.iter().any(|q| {
                q.recovered >= p.recovered
                    && q.silent <= p.silent
                    && (q.recovered > p.recovered || q.silent < p.silent)
            })
        })
        .collect();
    for (p, d) in pts.iter_mut().zip(dominated) {
        p.on_frontier = !d;
    }
    pts
}

/// The Wilson score interval at 95 %.
pub fn wilson(successes: u64, n: u64) -> [f64; 2] {
    if n == 0 {
        return [0.0, 0.0];
    }
    let z = 1.959_963_984_540_054_f64;
    let n_f = n as f64;
    let p = successes as f64 / n_f;
    let denom = 1.0 + z * z / n_f;
    let center = (p + z * z / (2.0 * n_f)) / denom;
    let half = z * ((p * (1.0 - p) / n_f) + z * z / (4.0 * n_f * n_f)).sqrt() / denom;
    [
        round4((center - half).max(0.0)),
        round4((center + half).min(1.0)),
    ]
}

fn round4(x: f64) -> f64 {
    (x * 10_000.0).round() / 10_000.0
}

fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 {
        0.0
    } else {
        round4(a as f64 / b as f64)
    }
}

fn trace_lines(
    strategy: Strategy,
    budget: u32,
    seed: u64,
    task: usize,
    jsonl: &str,
    out: &mut dyn FnMut(&str),
) {
    let prefix = format!(
        "{{\"strategy\":\"{}\",\"budget\":{budget},\"seed\":{seed},\"task\":{task},",
        strategy.as_str()
    );
    for line in jsonl.lines() {
        let rest = line.strip_prefix('{').unwrap_or(line);
        out(&format!("{prefix}{rest}"));
    }
}

/// One episode's outcome, kept for the paired comparisons.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Outcome {
    task: usize,
    faulted: bool,
    success: bool,
    silent: bool,
}

/// Draws every schedule of the run: per seed, per task. Identical for every strategy and budget.
pub fn schedules(config: &BenchConfig) -> Vec<Vec<Vec<Injected>>> {
    let model = config.effective_model();
    let tasks = &config.task_set.tasks[..config.tasks.min(config.task_set.tasks.len())];
    (0..u64::from(config.seeds))
        .map(|i| {
            // In a deployment, the tools broken for good so far: (tool, fault, skew).
            let mut broken: Vec<(String, usize, f64)> = Vec::new();
            tasks
                .iter()
                .enumerate()
                .map(|(ti, t)| {
                    let mut fs = draw(t, config.seed + i, config.fault_rate, &model);
                    let start = ti as u64 * exec::EPISODE_SPACING_MS;
                    fs.extend(faultmodel::windowed(t, start, &model));
                    if config.deployment {
                        inherit(t, &model, &mut fs, &mut broken);
                    }
                    fs
                })
                .collect()
        })
        .collect()
}

/// A deployment's memory of the world: the task meets every permanent tool-side fault an earlier
/// episode of the seed drew on a tool it calls (at each step calling that tool), and adds its own
/// to what later episodes meet.
fn inherit(
    task: &TaskSpec,
    model: &FaultModel,
    faults: &mut Vec<Injected>,
    broken: &mut Vec<(String, usize, f64)>,
) {
    let plan = &task.plan;
    for s in 0..plan.steps.len() {
        let tool = &plan.steps[s].tool;
        for (t, spec, skew) in broken.iter() {
            let applies = model.faults.get(*spec).is_some_and(|f| f.applies(task, s));
            if t == tool && applies && !faults.iter().any(|f| f.step == s && f.spec == *spec) {
                faults.push(Injected {
                    step: s,
                    spec: *spec,
                    permanent: true,
                    k: 1,
                    skew: *skew,
                });
            }
        }
    }
    for f in faults.iter() {
        let Some(spec) = model.faults.get(f.spec) else {
            continue;
        };
        let tool_side = spec.target != faultmodel::Target::Agent && spec.window.is_none();
        if f.permanent && tool_side {
            let tool = plan.steps[f.step].tool.clone();
            if !broken.iter().any(|(t, s, _)| *t == tool && *s == f.spec) {
                broken.push((tool, f.spec, f.skew));
            }
        }
    }
}

fn census_of(model: &FaultModel, schedules: &[Vec<Vec<Injected>>]) -> Census {
    let mut census = Census::default();
    for per_seed in schedules {
        for fs in per_seed {
            census.episodes += 1;
            census.faulted_episodes += u64::from(!fs.is_empty());
            let mut steps: Vec<usize> = fs.iter().map(|f| f.step).collect();
            let before = steps.len();
            steps.dedup();
            census.multi_fault_steps += (before - steps.len()) as u64;
            for f in fs {
                let Some(spec) = model.faults.get(f.spec) else {
                    continue;
                };
                *census.by_fault.entry(spec.name.clone()).or_default() += 1;
                *census.by_family.entry(spec.family).or_default() += 1;
                if f.permanent {
                    census.permanent += 1;
                } else {
                    census.transient += 1;
                }
                if spec.effect.explicit() {
                    census.explicit += 1;
                } else {
                    census.implicit += 1;
                }
            }
        }
    }
    census
}

/// Runs the benchmark. `progress(done, total)` is called after each batch of episodes;
/// `trace`, when given, receives the controller strategies' control-plane events plus one summary
/// line per episode of every strategy.
pub fn run(
    config: &BenchConfig,
    progress: &mut dyn FnMut(u64, u64),
    trace: Option<&mut dyn FnMut(&str)>,
) -> Report {
    let model = config.effective_model();
    let tasks = &config.task_set.tasks[..config.tasks.min(config.task_set.tasks.len())];
    let total = config.episodes();
    let want_trace = trace.is_some();
    let mut trace = trace;
    let mut done = 0u64;
    let seeds: Vec<u64> = (0..u64::from(config.seeds))
        .map(|i| config.seed + i)
        .collect();
    let schedules = schedules(config);
    let census = census_of(&model, &schedules);

    let mut results = Vec::new();
    let mut details = Vec::new();
    let mut outcomes: BTreeMap<(u32, Strategy), Vec<Outcome>> = BTreeMap::new();
    let mut tallies: BTreeMap<(u32, Strategy), Tally> = BTreeMap::new();
    for budget in config.budgets() {
        for &strategy in &config.strategies {
            let (mut n, mut successes, mut faulted, mut recovered, mut silent, mut silent_f) =
                (0u64, 0u64, 0u64, 0u64, 0u64, 0u64);
            let mut costs = exec::Costs::default();
            let mut k_total = 0.0;
            let mut lat = 0u64;
            let mut by_class: BTreeMap<FailureClass, Recovered> = BTreeMap::new();
            let mut by_family: BTreeMap<Family, Recovered> = BTreeMap::new();
            let mut by_fault: BTreeMap<String, KindOutcome> = BTreeMap::new();
            let mut tally = Tally::default();
            let mut clean_episodes = 0u64;
            let mut false_alarms_clean: BTreeMap<&'static str, u64> = BTreeMap::new();
            let mut eps = Vec::with_capacity(seeds.len() * tasks.len());
            for (si, &seed) in seeds.iter().enumerate() {
                // In a deployment, what a strategy that carries memory learned of the tools is
                // carried from one of the seed's episodes to the next; otherwise each episode
                // starts with none.
                let mut trust = selfheal_core::Trust::new();
                for (ti, task) in tasks.iter().enumerate() {
                    let faults = &schedules[si][ti];
                    let mut ep = Episode::new(task, faults, &model, seed);
                    ep.start_at(ti as u64 * exec::EPISODE_SPACING_MS);
                    if !(config.deployment && strategy.carries_memory()) {
                        trust = selfheal_core::Trust::new();
                    }
                    let ended = strategy.run_with_trust(
                        &mut ep,
                        budget,
                        config.policy.as_ref(),
                        seed.wrapping_mul(1_000_003).wrapping_add(task.id as u64),
                        want_trace,
                        &mut trust,
                    );
                    let rec = ep.into_record();
                    if rec.clean {
                        clean_episodes += 1;
                        for d in rec.alarms.keys() {
                            *false_alarms_clean.entry(d).or_default() += 1;
                        }
                    }
                    let correct = ended.answer.as_ref().is_some_and(|a| exec::score(task, a));
                    let claimed = ended.answer.is_some();
                    let is_faulted = !faults.is_empty();
                    n += 1;
                    successes += u64::from(correct);
                    silent += u64::from(claimed && !correct);
                    if is_faulted {
                        faulted += 1;
                        recovered += u64::from(correct);
                        silent_f += u64::from(claimed && !correct);
                    }
                    eps.push(Outcome {
                        task: ti,
                        faulted: is_faulted,
                        success: correct,
                        silent: claimed && !correct,
                    });
                    let mut classes: Vec<FailureClass> = faults
                        .iter()
                        .filter_map(|f| model.faults.get(f.spec)?.class_of(f.permanent))
                        .collect();
                    classes.sort_unstable();
                    classes.dedup();
                    for c in classes {
                        let e = by_class.entry(c).or_default();
                        e.met += 1;
                        e.succeeded += u64::from(correct);
                    }
                    let mut fams: Vec<Family> = faults
                        .iter()
                        .filter_map(|f| Some(model.faults.get(f.spec)?.family))
                        .collect();
                    fams.sort_unstable();
                    fams.dedup();
                    for f in fams {
                        let e = by_family.entry(f).or_default();
                        e.met += 1;
                        e.succeeded += u64::from(correct);
                    }
                    let mut names: Vec<&str> = faults
                        .iter()
                        .filter_map(|f| Some(model.faults.get(f.spec)?.name.as_str()))
                        .collect();
                    names.sort_unstable();
                    names.dedup();
                    for name in names {
                        let e = by_fault.entry(name.to_owned()).or_default();
                        e.met += 1;
                        e.succeeded += u64::from(correct);
                        e.silent += u64::from(claimed && !correct);
                    }
                    costs.model_calls += rec.costs.model_calls;
                    costs.escalated_calls += rec.costs.escalated_calls;
                    costs.tool_calls += rec.costs.tool_calls;
                    costs.verifier_calls += rec.costs.verifier_calls;
                    costs.recoveries += rec.costs.recoveries;
                    k_total += config.weights.k(&rec.costs);
                    lat += rec.clock_ms;
                    tally.verdicts_on_faithful += rec.tally.verdicts_on_faithful;
                    tally.false_alarms += rec.tally.false_alarms;
                    tally.verdicts_on_wrong += rec.tally.verdicts_on_wrong;
                    tally.misses += rec.tally.misses;
                    tally.uncertain += rec.tally.uncertain;
                    for (inj, row) in rec.tally.confusion {
                        let r = tally.confusion.entry(inj).or_default();
                        for (c, k) in row {
                            *r.entry(c).or_default() += k;
                        }
                    }
                    if let Some(out) = trace.as_mut() {
                        if let Some(t) = &ended.trace {
                            trace_lines(strategy, budget, seed, task.id, t, *out);
                        }
                        let names: Vec<&str> = faults
                            .iter()
                            .filter_map(|f| Some(model.faults.get(f.spec)?.name.as_str()))
                            .collect();
                        let steps: Vec<usize> = faults.iter().map(|f| f.step).collect();
                        out(&format!(
                            "{{\"strategy\":\"{}\",\"budget\":{budget},\"seed\":{seed},\"task\":{},\"event\":\"episode\",\"faults\":{},\"fault_steps\":{},\"success\":{correct},\"claimed\":{claimed},\"latency_ms\":{}}}",
                            strategy.as_str(),
                            task.id,
                            serde_json::to_string(&names).unwrap_or_else(|_| "[]".into()),
                            serde_json::to_string(&steps).unwrap_or_else(|_| "[]".into()),
                            rec.clock_ms
                        ));
                    }
                }
                done += tasks.len() as u64;
                progress(done, total);
            }
            let nf = n.max(1) as f64;
            results.push(ResultRow {
                strategy: strategy.as_str(),
                budget,
                episodes: n,
                tsr: ratio(successes, n),
                rsr: ratio(recovered, faulted),
                sfr: ratio(silent, n),
                cost: (k_total / nf * 100.0).round() / 100.0,
                latency_ms: (lat as f64 / nf).round(),
            });
            details.push(Detail {
                strategy: strategy.as_str(),
                budget,
                successes,
                faulted,
                recovered,
                silent_failures: silent,
                silent_faulted: silent_f,
                tsr_ci: wilson(successes, n),
                rsr_ci: wilson(recovered, faulted),
                sfr_ci: wilson(silent, n),
                model_calls: round4(costs.model_calls as f64 / nf),
                escalated_calls: round4(costs.escalated_calls as f64 / nf),
                tool_calls: round4(costs.tool_calls as f64 / nf),
                verifier_calls: round4(costs.verifier_calls as f64 / nf),
                recovery_actions: round4(costs.recoveries as f64 / nf),
                cost_per_success: (successes > 0)
                    .then(|| (k_total / successes as f64 * 100.0).round() / 100.0),
                verifier: VerifierRecord {
                    on_faithful: tally.verdicts_on_faithful,
                    false_alarms: tally.false_alarms,
                    on_wrong: tally.verdicts_on_wrong,
                    misses: tally.misses,
                    uncertain: tally.uncertain,
                },
                by_class,
                by_family,
                by_fault,
                clean_episodes,
                false_alarms_clean,
            });
            outcomes.insert((budget, strategy), eps);
            tallies.insert((budget, strategy), tally);
        }
    }
    let paired = paired_comparisons(config, &outcomes, tasks.len());
    let top = config.budgets().into_iter().max().unwrap_or(config.budget);
    let confusion = [Strategy::SelfHealing, Strategy::ClassAgnostic]
        .into_iter()
        .filter_map(|s| {
            let t = tallies.get(&(top, s))?;
            let mut c = Confusion {
                strategy: s.as_str(),
                ..Confusion::default()
            };
            for (inj, row) in &t.confusion {
                let key = inj.map_or_else(|| "none".to_owned(), |c| c.to_string());
                for (inf, k) in row {
                    *c.matrix
                        .entry(key.clone())
                        .or_default()
                        .entry(*inf)
                        .or_default() += k;
                    if inj.is_some() {
                        c.total += k;
                        c.correct += if *inj == Some(*inf) { *k } else { 0 };
                    }
                }
            }
            Some(c)
        })
        .collect();
    let frontier = risk_points(&details, top);
    let risk_curve = risk_curve(config, &schedules, top, &frontier);
    Report {
        config: config.clone(),
        results,
        details,
        paired,
        confusion,
        census,
        frontier,
        risk_curve,
    }
}

/// Self-healing over [`BenchConfig::risk_settings`] at budget `budget`, on the episodes of
/// `schedules`, each point marked against the strategies' points in `frontier` (none without a
/// sweep).
fn risk_curve(
    config: &BenchConfig,
    schedules: &[Vec<Vec<Injected>>],
    budget: u32,
    frontier: &[RiskPoint],
) -> Vec<RiskSetting> {
    let model = config.effective_model();
    let tasks = &config.task_set.tasks[..config.tasks.min(config.task_set.tasks.len())];
    let base = config.policy.clone().unwrap_or_default();
    let strategy = Strategy::SelfHealing;
    // The policy's own setting is on the curve whatever it is.
    config
        .risk_settings()
        .into_iter()
        .map(|risk| {
            let policy = Policy {
                risk,
                ..base.clone()
            };
            let (mut n, mut faulted, mut recovered, mut silent, mut silent_f) =
                (0u64, 0u64, 0u64, 0u64, 0u64);
            for (si, per_seed) in schedules.iter().enumerate() {
                let seed = config.seed + si as u64;
                let mut trust = selfheal_core::Trust::new();
                for (ti, task) in tasks.iter().enumerate() {
                    let Some(faults) = per_seed.get(ti) else {
                        continue;
                    };
                    let mut ep = Episode::new(task, faults, &model, seed);
                    ep.start_at(ti as u64 * exec::EPISODE_SPACING_MS);
                    if !config.deployment {
                        trust = selfheal_core::Trust::new();
                    }
                    let ended = strategy.run_with_trust(
                        &mut ep,
                        budget,
                        Some(&policy),
                        seed.wrapping_mul(1_000_003).wrapping_add(task.id as u64),
                        false,
                        &mut trust,
                    );
                    let correct = ended.answer.as_ref().is_some_and(|a| exec::score(task, a));
                    let wrong = ended.answer.is_some() && !correct;
                    n += 1;
                    silent += u64::from(wrong);
                    if !faults.is_empty() {
                        faulted += 1;
                        recovered += u64::from(correct);
                        silent_f += u64::from(wrong);
                    }
                }
            }
            let (rec, sil) = (ratio(recovered, faulted), ratio(silent_f, faulted));
            RiskSetting {
                risk,
                configured: risk == base.risk,
                budget,
                recovered: rec,
                recovered_ci: wilson(recovered, faulted),
                silent: sil,
                silent_ci: wilson(silent_f, faulted),
                sfr: ratio(silent, n),
                on_frontier: !frontier.iter().any(|q| {
                    q.recovered >= rec && q.silent <= sil && (q.recovered > rec || q.silent < sil)
                }),
            }
        })
        .collect()
}

fn paired_comparisons(
    config: &BenchConfig,
    outcomes: &BTreeMap<(u32, Strategy), Vec<Outcome>>,
    n_tasks: usize,
) -> Vec<Paired> {
    let mut out = Vec::new();
    for budget in config.budgets() {
        let Some(sh) = outcomes.get(&(budget, Strategy::SelfHealing)) else {
            continue;
        };
        for &other in &config.strategies {
            if other == Strategy::SelfHealing {
                continue;
            }
            let Some(ot) = outcomes.get(&(budget, other)) else {
                continue;
            };
            let pairs: Vec<stats::Pair> = sh
                .iter()
                .zip(ot)
                .map(|(a, b)| stats::Pair {
                    cluster: a.task,
                    faulted: a.faulted,
                    a_success: a.success,
                    b_success: b.success,
                    a_silent: a.silent,
                    b_silent: b.silent,
                })
                .collect();
            let seed = config.seed ^ u64::from(budget) ^ (other as u64).rotate_left(7);
            let cmp = stats::compare(&pairs, n_tasks, seed);
            let count = |f: &dyn Fn(&stats::Pair) -> bool| pairs.iter().filter(|p| f(p)).count();
            let none = |success: bool, silent: bool| !success && !silent;
            out.push(Paired {
                against: other.as_str(),
                budget,
                rsr_diff: round4(cmp.rsr.diff),
                rsr_ci: [round4(cmp.rsr.lo), round4(cmp.rsr.hi)],
                tsr_diff: round4(cmp.tsr.diff),
                tsr_ci: [round4(cmp.tsr.lo), round4(cmp.tsr.hi)],
                sfr_diff: round4(cmp.sfr.diff),
                sfr_ci: [round4(cmp.sfr.lo), round4(cmp.sfr.hi)],
                only_self_healing: cmp.only_a,
                only_other: cmp.only_b,
                mcnemar_p: round4(cmp.mcnemar_p),
                self_wrong_other_right: count(&|p| p.a_silent && p.b_success) as u64,
                self_wrong_other_none: count(&|p| p.a_silent && none(p.b_success, p.b_silent))
                    as u64,
                other_wrong_self_right: count(&|p| p.b_silent && p.a_success) as u64,
                other_wrong_self_none: count(&|p| p.b_silent && none(p.a_success, p.a_silent))
                    as u64,
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wilson_matches_known_values() {
        // 95 of 100: the textbook interval is about [0.888, 0.978].
        let [lo, hi] = wilson(95, 100);
        assert!((lo - 0.8882).abs() < 0.001, "{lo}");
        assert!((hi - 0.9785).abs() < 0.001, "{hi}");
        assert_eq!(wilson(0, 0), [0.0, 0.0]);
    }

    #[test]
    fn config_validation_is_clear() {
        let bad = BenchConfig {
            fault_rate: 1.5,
            ..BenchConfig::default()
        };
        assert!(bad.validate().is_err_and(|e| e.contains("fault-rate")));
        let too_many = BenchConfig {
            tasks: 101,
            ..BenchConfig::default()
        };
        assert!(too_many.validate().is_err_and(|e| e.contains("1..=100")));
        assert!(BenchConfig::default().validate().is_ok());
    }

    #[test]
    fn cost_weights_take_an_escalation_price() {
        assert_eq!(CostWeights::parse("1,1,1,1").map(|w| w.escalation), Ok(5.0));
        assert_eq!(
            CostWeights::parse("1,1,1,1,9").map(|w| w.escalation),
            Ok(9.0)
        );
        assert!(CostWeights::parse("1,1").is_err());
        assert!(CostWeights::parse("1,1,1,-1").is_err());
    }
}
