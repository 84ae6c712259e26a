//! # selfheal-bench — a seeded fault-injection benchmark for tool-using agents
//!
//! The paper behind selfheal (SPEC §3) reports 98.8 % task success for self-healing against
//! 94.5 % for retry-only and 93.8 % for full replanning, but its benchmark is not public. This one
//! is: 100 tasks over a catalogue of deterministic local tools ([`catalogue`]), a fault model with
//! five families, transient/permanent and explicit/implicit variants ([`faults`]), a simulated data
//! plane that every strategy talks to ([`env`]), and five honestly implemented strategies
//! ([`strategies`]). A result is a pure function of `(config, seed)`: the same inputs give
//! byte-identical JSON.
//!
//! ```
//! use selfheal_bench::{BenchConfig, run};
//! let config = BenchConfig { seeds: 1, tasks: 20, ..BenchConfig::default() };
//! let report = run(&config, &mut |_, _| {}, None);
//! let sh = report.results.iter().find(|r| r.strategy == "self-healing");
//! assert!(sh.is_some_and(|r| r.tsr >= 0.9));
//! ```

pub mod catalogue;
pub mod env;
pub mod faults;
pub mod plot;
pub mod report;
pub mod strategies;

use std::collections::BTreeMap;

use serde::Serialize;

use selfheal_core::FailureClass;
use selfheal_core::policy::Policy;
use selfheal_core::rng::SplitMix64;

use crate::catalogue::tasks;
use crate::env::Env;
use crate::faults::{Family, Mix, Persistence, Signalling, schedule};
use crate::strategies::Strategy;

/// The weights of the cost model `K = a·M + b·U + c·V + d·R`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct CostWeights {
    /// Per model call.
    pub model: f64,
    /// Per tool call.
    pub tool: f64,
    /// Per verifier call.
    pub verifier: f64,
    /// Per recovery action.
    pub recovery: f64,
}

impl Default for CostWeights {
    fn default() -> Self {
        CostWeights {
            model: 1.0,
            tool: 1.0,
            verifier: 1.0,
            recovery: 1.0,
        }
    }
}

impl CostWeights {
    /// Parses `a,b,c,d`.
    pub fn parse(s: &str) -> Result<CostWeights, String> {
        let xs: Vec<f64> = s
            .split(',')
            .map(|x| {
                x.trim()
                    .parse::<f64>()
                    .map_err(|_| format!("not a number: {x:?}"))
            })
            .collect::<Result<_, _>>()?;
        match xs.as_slice() {
            [a, b, c, d] if xs.iter().all(|x| x.is_finite() && *x >= 0.0) => Ok(CostWeights {
                model: *a,
                tool: *b,
                verifier: *c,
                recovery: *d,
            }),
            [_, _, _, _] => Err("cost weights must be ≥ 0".into()),
            _ => Err(format!(
                "expected four weights a,b,c,d (model, tool, verifier, recovery), got {}",
                xs.len()
            )),
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
    /// How many of the 100 tasks (the first N).
    pub tasks: usize,
    /// Probability that a step is faulted.
    pub fault_rate: f64,
    /// Weights of the fault families.
    pub mix: Mix,
    /// Recovery actions allowed per failure (`R`), when not sweeping.
    pub budget: u32,
    /// Run `R = 1..=5`.
    pub sweep: bool,
    /// The semantic silent-failure setting (only plausible-but-wrong faults).
    pub silent: bool,
    /// Cost weights.
    pub weights: CostWeights,
    /// Strategies to run.
    pub strategies: Vec<Strategy>,
    /// The policy `self-healing` runs with (`None`: the default policy). `R` still caps the
    /// actions per failure. Left out of the JSON when `None`, so default runs are unchanged.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub policy: Option<Policy>,
}

impl Default for BenchConfig {
    fn default() -> Self {
        BenchConfig {
            seed: 1,
            seeds: 10,
            tasks: 100,
            fault_rate: 0.1,
            mix: Mix::default(),
            budget: 5,
            sweep: false,
            silent: false,
            weights: CostWeights::default(),
            strategies: Strategy::ALL.to_vec(),
            policy: None,
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
        if self.tasks == 0 || self.tasks > 100 {
            return Err(format!("--tasks must be in 1..=100, got {}", self.tasks));
        }
        if self.budget == 0 || self.budget > 20 {
            return Err(format!("--budget must be in 1..=20, got {}", self.budget));
        }
        if self.strategies.is_empty() {
            return Err("no strategy selected".into());
        }
        Ok(())
    }

    /// The budgets this configuration runs.
    pub fn budgets(&self) -> Vec<u32> {
        if self.sweep {
            (1..=5).collect()
        } else {
            vec![self.budget]
        }
    }

    /// The fault mix in effect (the silent setting overrides `mix`).
    pub fn effective_mix(&self) -> Mix {
        if self.silent { Mix::silent() } else { self.mix }
    }

    /// Episodes the configuration will run.
    pub fn episodes(&self) -> u64 {
        self.budgets().len() as u64
            * self.strategies.len() as u64
            * u64::from(self.seeds)
            * self.tasks as u64
    }
}

/// One row of the results, exactly the documented JSON shape.
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
    /// Recovery success rate.
    pub rsr: f64,
    /// Silent failure rate.
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

/// Everything else about one row: intervals, counts, breakdowns.
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
    /// Wilson 95 % interval of TSR.
    pub tsr_ci: [f64; 2],
    /// Wilson 95 % interval of RSR.
    pub rsr_ci: [f64; 2],
    /// Wilson 95 % interval of SFR.
    pub sfr_ci: [f64; 2],
    /// Mean model calls per episode.
    pub model_calls: f64,
    /// Mean tool calls per episode.
    pub tool_calls: f64,
    /// Mean verifier calls per episode.
    pub verifier_calls: f64,
    /// Mean recovery actions per episode.
    pub recovery_actions: f64,
    /// Recovery by ground-truth failure class.
    pub by_class: BTreeMap<FailureClass, Recovered>,
    /// Recovery by fault family.
    pub by_family: BTreeMap<Family, Recovered>,
}

/// A fault-schedule census, to show what the workload contains.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Census {
    /// Faults by family.
    pub by_family: BTreeMap<Family, u64>,
    /// Transient faults.
    pub transient: u64,
    /// Permanent faults.
    pub permanent: u64,
    /// Explicit faults.
    pub explicit: u64,
    /// Implicit faults.
    pub implicit: u64,
    /// Episodes (task × seed) with at least one fault.
    pub faulted_episodes: u64,
    /// Episodes (task × seed).
    pub episodes: u64,
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
    /// What the schedule contained.
    pub census: Census,
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

/// One trace line for `--trace`: which episode, then the control-plane record.
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

/// Runs the benchmark. `progress(done, total)` is called after each batch of episodes;
/// `trace`, when given, receives one JSON line per control-plane event (self-healing episodes) plus one
/// summary line per episode of every strategy.
pub fn run(
    config: &BenchConfig,
    progress: &mut dyn FnMut(u64, u64),
    trace: Option<&mut dyn FnMut(&str)>,
) -> Report {
    let all = tasks();
    let tasks = &all[..config.tasks.min(all.len())];
    let mix = config.effective_mix();
    let total = config.episodes();
    let want_trace = trace.is_some();
    let mut trace = trace;
    let mut done = 0u64;
    // Schedules once per (seed, task): identical for every strategy and budget.
    let seeds: Vec<u64> = (0..u64::from(config.seeds))
        .map(|i| config.seed + i)
        .collect();
    let schedules: Vec<Vec<Vec<faults::Fault>>> = seeds
        .iter()
        .map(|&seed| {
            tasks
                .iter()
                .map(|t| schedule(t, seed, config.fault_rate, &mix))
                .collect()
        })
        .collect();
    let mut census = Census::default();
    for per_seed in &schedules {
        for fs in per_seed {
            census.episodes += 1;
            census.faulted_episodes += u64::from(!fs.is_empty());
            for f in fs {
                *census.by_family.entry(f.kind.family()).or_default() += 1;
                match f.persistence {
                    Persistence::Transient { .. } => census.transient += 1,
                    Persistence::Permanent => census.permanent += 1,
                }
                match f.signalling {
                    Signalling::Explicit => census.explicit += 1,
                    Signalling::Implicit => census.implicit += 1,
                }
            }
        }
    }

    let mut results = Vec::new();
    let mut details = Vec::new();
    for budget in config.budgets() {
        for &strategy in &config.strategies {
            let mut n = 0u64;
            let mut successes = 0u64;
            let mut faulted = 0u64;
            let mut recovered = 0u64;
            let mut silent = 0u64;
            let (mut m, mut u, mut v, mut r, mut lat) = (0u64, 0u64, 0u64, 0u64, 0u64);
            let mut by_class: BTreeMap<FailureClass, Recovered> = BTreeMap::new();
            let mut by_family: BTreeMap<Family, Recovered> = BTreeMap::new();
            for (si, &seed) in seeds.iter().enumerate() {
                for (ti, task) in tasks.iter().enumerate() {
                    let faults = &schedules[si][ti];
                    let mut env = Env::new(task, faults);
                    let mut rng =
                        SplitMix64::new(seed.wrapping_mul(31).wrapping_add(task.id as u64));
                    let ended = match strategy {
                        Strategy::Static => strategies::run_static(&mut env),
                        Strategy::RetryOnly => {
                            strategies::run_retry_only(&mut env, budget, &mut rng)
                        }
                        Strategy::React => strategies::run_react(&mut env, budget, &mut rng),
                        Strategy::FullReplan => strategies::run_full_replan(&mut env, budget),
                        Strategy::SelfHealing => strategies::run_self_healing(
                            &mut env,
                            config.policy.as_ref(),
                            budget,
                            seed,
                            want_trace,
                        ),
                    };
                    let correct = ended
                        .answer
                        .as_ref()
                        .is_some_and(|a| env.answer_is_correct(a));
                    let claimed = ended.answer.is_some();
                    n += 1;
                    successes += u64::from(correct);
                    silent += u64::from(claimed && !correct);
                    // Faults are counted as scheduled, not as reached: a strategy that stops at
                    // the first fault must not shrink its own denominators.
                    let met: &[faults::Fault] = faults;
                    if !met.is_empty() {
                        faulted += 1;
                        recovered += u64::from(correct);
                    }
                    let mut classes: Vec<FailureClass> =
                        met.iter().map(|f| f.kind.class(f.persistence)).collect();
                    classes.sort_unstable();
                    classes.dedup();
                    for c in classes {
                        let e = by_class.entry(c).or_default();
                        e.met += 1;
                        e.succeeded += u64::from(correct);
                    }
                    let mut fams: Vec<Family> = met.iter().map(|f| f.kind.family()).collect();
                    fams.sort_unstable();
                    fams.dedup();
                    for f in fams {
                        let e = by_family.entry(f).or_default();
                        e.met += 1;
                        e.succeeded += u64::from(correct);
                    }
                    m += env.costs.model_calls;
                    u += env.costs.tool_calls;
                    v += env.costs.verifier_calls;
                    r += env.costs.recoveries;
                    lat += env.clock_ms;
                    if let Some(out) = trace.as_mut() {
                        if let Some(t) = &ended.trace {
                            trace_lines(strategy, budget, seed, task.id, t, *out);
                        }
                        out(&format!(
                            "{{\"strategy\":\"{}\",\"budget\":{budget},\"seed\":{seed},\"task\":{},\"event\":\"episode\",\"faults\":{},\"success\":{correct},\"claimed\":{claimed},\"latency_ms\":{}}}",
                            strategy.as_str(),
                            task.id,
                            serde_json::to_string(met).unwrap_or_else(|_| "[]".into()),
                            env.clock_ms
                        ));
                    }
                }
                done += tasks.len() as u64;
                progress(done, total);
            }
            let w = config.weights;
            let nf = n.max(1) as f64;
            let cost = (w.model * m as f64
                + w.tool * u as f64
                + w.verifier * v as f64
                + w.recovery * r as f64)
                / nf;
            results.push(ResultRow {
                strategy: strategy.as_str(),
                budget,
                episodes: n,
                tsr: ratio(successes, n),
                rsr: ratio(recovered, faulted),
                sfr: ratio(silent, n),
                cost: (cost * 100.0).round() / 100.0,
                latency_ms: (lat as f64 / nf).round(),
            });
            details.push(Detail {
                strategy: strategy.as_str(),
                budget,
                successes,
                faulted,
                recovered,
                silent_failures: silent,
                tsr_ci: wilson(successes, n),
                rsr_ci: wilson(recovered, faulted),
                sfr_ci: wilson(silent, n),
                model_calls: round4(m as f64 / nf),
                tool_calls: round4(u as f64 / nf),
                verifier_calls: round4(v as f64 / nf),
                recovery_actions: round4(r as f64 / nf),
                by_class,
                by_family,
            });
        }
    }
    Report {
        config: config.clone(),
        results,
        details,
        census,
    }
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
        assert!(BenchConfig::default().validate().is_ok());
    }
}
