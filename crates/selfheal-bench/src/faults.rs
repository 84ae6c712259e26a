//! The live bench's fault kinds and schedule, and the fault families every report uses.
//!
//! The simulated benchmark draws its faults from a data file ([`crate::faultmodel`]); this
//! module keeps the fixed fault kinds that the live-model bench (`selfheal bench --live`, in
//! `selfheal-runtime`) schedules through [`crate::env`], plus [`Family`] and [`Mix`], which both
//! use.
//!
//! A schedule is a pure function of `(task, seed, fault rate, mix)`: every strategy meets exactly
//! the same faults. Each step of a task is faulted with probability `fault_rate`; the family is
//! drawn by the mix weights, the kind uniformly among the family's kinds that apply to the step
//! (tool-side faults need an external tool; a missing step or a repetition needs a neighbour).
//! Each fault is **transient** (it clears after `k` ∈ {1, 2} further attempts) or **permanent**,
//! and **explicit** (the tool raises an error) or **implicit** (the tool returns normally).

use serde::{Deserialize, Serialize};

use selfheal_core::FailureClass;
use selfheal_core::rng::{Rng, SplitMix64};

use crate::catalogue::Task;

/// The four tool/data fault families of the issue, plus agent-side faults.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Family {
    /// Timeouts, exceptions, rate limits, unavailability.
    Runtime,
    /// Malformed, empty, truncated output; schema drift.
    Output,
    /// Stale or contradictory data.
    Context,
    /// Plausible but wrong, with no error signal.
    Semantic,
    /// The agent's own mistakes: malformed arguments, wrong tool, missing step, repetition.
    Agent,
}

impl Family {
    /// Every family.
    pub const ALL: [Family; 5] = [
        Family::Runtime,
        Family::Output,
        Family::Context,
        Family::Semantic,
        Family::Agent,
    ];

    /// The snake_case name.
    pub fn as_str(self) -> &'static str {
        match self {
            Family::Runtime => "runtime",
            Family::Output => "output",
            Family::Context => "context",
            Family::Semantic => "semantic",
            Family::Agent => "agent",
        }
    }

    fn kinds(self) -> &'static [FaultKind] {
        match self {
            Family::Runtime => &[
                FaultKind::Timeout,
                FaultKind::Exception,
                FaultKind::RateLimit,
                FaultKind::Unavailable,
            ],
            Family::Output => &[
                FaultKind::Malformed,
                FaultKind::Empty,
                FaultKind::Truncated,
                FaultKind::SchemaDrift,
            ],
            Family::Context => &[FaultKind::Stale, FaultKind::Contradictory],
            Family::Semantic => &[FaultKind::PlausibleWrong],
            Family::Agent => &[
                FaultKind::MalformedArgs,
                FaultKind::WrongTool,
                FaultKind::MissingStep,
                FaultKind::Repetition,
            ],
        }
    }
}

/// One kind of fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FaultKind {
    /// The call times out (costs the timeout).
    Timeout,
    /// The tool raises an exception.
    Exception,
    /// HTTP 429 with `Retry-After`; always transient.
    RateLimit,
    /// The service is down: 503 (explicit) or a 200 carrying `{"error": ...}` (implicit).
    Unavailable,
    /// The output is not valid JSON.
    Malformed,
    /// The output is empty: `{"results": []}` / `null` (implicit) or a "no results" error.
    Empty,
    /// The output is cut off mid-object.
    Truncated,
    /// The output's field was renamed.
    SchemaDrift,
    /// The data is outdated (old `as_of`, old value).
    Stale,
    /// The primary disagrees with the equivalent source (it is the one that is wrong).
    Contradictory,
    /// A wrong but plausible value, with no error anywhere.
    PlausibleWrong,
    /// The agent writes broken JSON arguments.
    MalformedArgs,
    /// The agent calls a tool that does not exist (explicit) or passes a wrong entity (implicit).
    WrongTool,
    /// The plan omits this step; the next step's input is missing.
    MissingStep,
    /// The agent repeats the previous call instead of making this one.
    Repetition,
}

impl FaultKind {
    /// Every kind.
    pub const ALL: [FaultKind; 15] = [
        FaultKind::Timeout,
        FaultKind::Exception,
        FaultKind::RateLimit,
        FaultKind::Unavailable,
        FaultKind::Malformed,
        FaultKind::Empty,
        FaultKind::Truncated,
        FaultKind::SchemaDrift,
        FaultKind::Stale,
        FaultKind::Contradictory,
        FaultKind::PlausibleWrong,
        FaultKind::MalformedArgs,
        FaultKind::WrongTool,
        FaultKind::MissingStep,
        FaultKind::Repetition,
    ];

    /// The family it belongs to.
    pub fn family(self) -> Family {
        match self {
            FaultKind::Timeout
            | FaultKind::Exception
            | FaultKind::RateLimit
            | FaultKind::Unavailable => Family::Runtime,
            FaultKind::Malformed
            | FaultKind::Empty
            | FaultKind::Truncated
            | FaultKind::SchemaDrift => Family::Output,
            FaultKind::Stale | FaultKind::Contradictory => Family::Context,
            FaultKind::PlausibleWrong => Family::Semantic,
            FaultKind::MalformedArgs
            | FaultKind::WrongTool
            | FaultKind::MissingStep
            | FaultKind::Repetition => Family::Agent,
        }
    }

    /// Whether the fault is the agent's (cleared by regenerating the call, not by the tool).
    pub fn is_agent_side(self) -> bool {
        self.family() == Family::Agent
    }

    /// The ground-truth failure class, for the per-class breakdown.
    pub fn class(self, persistence: Persistence) -> FailureClass {
        match self {
            FaultKind::Timeout | FaultKind::Exception | FaultKind::RateLimit => match persistence {
                Persistence::Permanent => FailureClass::ToolUnavailable,
                Persistence::Transient { .. } => FailureClass::ToolTimeout,
            },
            FaultKind::Unavailable => FailureClass::ToolUnavailable,
            FaultKind::Malformed | FaultKind::Truncated | FaultKind::SchemaDrift => {
                FailureClass::MalformedOutput
            }
            FaultKind::Empty => FailureClass::EmptyOutput,
            FaultKind::Stale => FailureClass::StaleContext,
            FaultKind::Contradictory => FailureClass::ContradictoryEvidence,
            FaultKind::PlausibleWrong => FailureClass::VerificationFailure,
            FaultKind::MalformedArgs => FailureClass::ArgumentInvalid,
            FaultKind::WrongTool => FailureClass::WrongTool,
            FaultKind::MissingStep => FailureClass::PlanningFailure,
            FaultKind::Repetition => FailureClass::ControlLoop,
        }
    }

    /// Which signalling variants the kind has.
    fn signalling(self) -> &'static [Signalling] {
        match self {
            FaultKind::Timeout
            | FaultKind::Exception
            | FaultKind::RateLimit
            | FaultKind::MalformedArgs
            | FaultKind::MissingStep => &[Signalling::Explicit],
            FaultKind::Unavailable
            | FaultKind::Empty
            | FaultKind::WrongTool
            | FaultKind::Malformed => &[Signalling::Explicit, Signalling::Implicit],
            FaultKind::Truncated
            | FaultKind::SchemaDrift
            | FaultKind::Stale
            | FaultKind::Contradictory
            | FaultKind::PlausibleWrong
            | FaultKind::Repetition => &[Signalling::Implicit],
        }
    }
}

/// How long a fault lasts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "persistence", rename_all = "snake_case")]
pub enum Persistence {
    /// Clears after `k` further attempts.
    Transient {
        /// Attempts after the first before it clears.
        k: u32,
    },
    /// Never clears on the faulted tool (or for the same model).
    Permanent,
}

/// Whether the faulted tool raises an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Signalling {
    /// The tool raises (an error status, an exception).
    Explicit,
    /// The tool returns normally.
    Implicit,
}

/// One injected fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Fault {
    /// The step it hits.
    pub step: usize,
    /// What kind.
    pub kind: FaultKind,
    /// How long it lasts.
    pub persistence: Persistence,
    /// Whether it is signalled.
    pub signalling: Signalling,
    /// For runtime faults: the substitute is down too, for the same number of attempts (a
    /// provider-wide blip). Always transient.
    pub correlated: bool,
    /// Whether a repair can fix it (malformed or truncated output, malformed arguments): some
    /// damage destroys the data.
    pub repairable: bool,
}

/// The weights of the fault families.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Mix {
    /// Runtime faults.
    pub runtime: f64,
    /// Tool-output faults.
    pub output: f64,
    /// Context faults.
    pub context: f64,
    /// Semantic faults.
    pub semantic: f64,
    /// Agent-side faults.
    pub agent: f64,
}

impl Default for Mix {
    fn default() -> Self {
        Mix {
            runtime: 0.35,
            output: 0.2,
            context: 0.15,
            semantic: 0.1,
            agent: 0.2,
        }
    }
}

impl Mix {
    /// Only semantic faults: the silent-failure setting.
    pub fn silent() -> Mix {
        Mix {
            runtime: 0.0,
            output: 0.0,
            context: 0.0,
            semantic: 1.0,
            agent: 0.0,
        }
    }

    /// Parses `runtime=0.4,output=0.2,...`; families left out get weight 0.
    pub fn parse(s: &str) -> Result<Mix, String> {
        let mut m = Mix {
            runtime: 0.0,
            output: 0.0,
            context: 0.0,
            semantic: 0.0,
            agent: 0.0,
        };
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (k, v) = part
                .split_once('=')
                .ok_or_else(|| format!("expected family=weight, got {part:?}"))?;
            let w: f64 = v
                .trim()
                .parse()
                .map_err(|_| format!("weight of {k:?} is not a number: {v:?}"))?;
            if !(w.is_finite() && w >= 0.0) {
                return Err(format!("weight of {k:?} must be ≥ 0, got {w}"));
            }
            match k.trim() {
                "runtime" => m.runtime = w,
                "output" => m.output = w,
                "context" => m.context = w,
                "semantic" => m.semantic = w,
                "agent" => m.agent = w,
                other => {
                    return Err(format!(
                        "unknown family {other:?} (runtime, output, context, semantic, agent)"
                    ));
                }
            }
        }
        if m.total() <= 0.0 {
            return Err("at least one family needs a weight above 0".into());
        }
        Ok(m)
    }

    /// The weight of family `f`.
    pub fn weight(&self, f: Family) -> f64 {
        match f {
            Family::Runtime => self.runtime,
            Family::Output => self.output,
            Family::Context => self.context,
            Family::Semantic => self.semantic,
            Family::Agent => self.agent,
        }
    }

    fn total(&self) -> f64 {
        Family::ALL.iter().map(|f| self.weight(*f)).sum()
    }
}

fn applies(kind: FaultKind, task: &Task, step: usize) -> bool {
    let group = task.steps[step].group;
    let last = task.steps.len() - 1;
    match kind.family() {
        Family::Runtime | Family::Output => group.is_external(),
        Family::Context => group.has_freshness(),
        Family::Semantic => group.is_external(),
        Family::Agent => match kind {
            // A missing step shows at the step that needs its output.
            FaultKind::MissingStep => {
                step < last
                    && task.steps[step + 1..]
                        .iter()
                        .any(|s| s.args.contains(&crate::catalogue::Arg::Ref(step)))
            }
            FaultKind::Repetition => step > 0,
            // A wrong entity needs a literal-or-ref argument of an external tool.
            FaultKind::WrongTool | FaultKind::MalformedArgs => true,
            _ => true,
        },
    }
}

/// The faults of one task under one seed.
pub fn schedule(task: &Task, seed: u64, fault_rate: f64, mix: &Mix) -> Vec<Fault> {
    let mut rng = SplitMix64::new(
        seed.wrapping_mul(0x9E37_79B9_7F4A_7C15)
            ^ (task.id as u64).wrapping_mul(0xD1B5_4A32_D192_ED03),
    );
    let mut faults = Vec::new();
    for step in 0..task.steps.len() {
        // Draw every random number unconditionally so schedules stay aligned across settings.
        let hit = rng.next_f64();
        let fam_draw = rng.next_f64() * mix.total();
        let kind_draw = rng.next_u64();
        let pers_draw = rng.next_f64();
        let k_draw = rng.below(2);
        let sig_draw = rng.below(2);
        let corr_draw = rng.next_f64();
        let rep_draw = rng.next_f64();
        if hit >= fault_rate {
            continue;
        }
        // Family by weight, among families with an applicable kind.
        let applicable = |f: Family| f.kinds().iter().any(|k| applies(*k, task, step));
        let total: f64 = Family::ALL
            .iter()
            .filter(|f| applicable(**f))
            .map(|f| mix.weight(*f))
            .sum();
        if total <= 0.0 {
            continue;
        }
        let mut x = fam_draw / mix.total() * total;
        let mut family = None;
        for f in Family::ALL.into_iter().filter(|f| applicable(*f)) {
            let w = mix.weight(f);
            if w <= 0.0 {
                continue;
            }
            if x < w {
                family = Some(f);
                break;
            }
            x -= w;
        }
        let Some(family) = family.or_else(|| {
            Family::ALL
                .into_iter()
                .rev()
                .find(|f| applicable(*f) && mix.weight(*f) > 0.0)
        }) else {
            continue;
        };
        let kinds: Vec<FaultKind> = family
            .kinds()
            .iter()
            .copied()
            .filter(|k| applies(*k, task, step))
            .collect();
        let kind = kinds[(kind_draw % kinds.len() as u64) as usize];
        let persistence = if kind == FaultKind::RateLimit || pers_draw < 0.6 {
            Persistence::Transient {
                k: 1 + k_draw as u32,
            }
        } else {
            Persistence::Permanent
        };
        let sig = kind.signalling();
        let signalling = sig[(sig_draw as usize) % sig.len()];
        let correlated = kind.family() == Family::Runtime
            && matches!(persistence, Persistence::Transient { .. })
            && corr_draw < 0.15;
        let repairable = match kind {
            FaultKind::Malformed | FaultKind::MalformedArgs => rep_draw < 0.85,
            FaultKind::Truncated => rep_draw < 0.5,
            FaultKind::SchemaDrift | FaultKind::WrongTool => true,
            _ => false,
        };
        faults.push(Fault {
            step,
            kind,
            persistence,
            signalling,
            correlated,
            repairable,
        });
    }
    faults
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalogue::tasks;

    #[test]
    fn schedules_are_pure_functions_of_task_and_seed() {
        let ts = tasks();
        let mix = Mix::default();
        for t in &ts {
            assert_eq!(schedule(t, 3, 0.3, &mix), schedule(t, 3, 0.3, &mix));
        }
        let a: Vec<_> = ts.iter().map(|t| schedule(t, 1, 0.3, &mix)).collect();
        let b: Vec<_> = ts.iter().map(|t| schedule(t, 2, 0.3, &mix)).collect();
        assert_ne!(a, b, "different seeds must give different schedules");
    }

    #[test]
    fn mix_parsing_rejects_bad_input() {
        assert!(Mix::parse("runtime=1,agent=0.5").is_ok());
        assert!(Mix::parse("runtime").is_err());
        assert!(Mix::parse("cosmic=1").is_err());
        assert!(Mix::parse("runtime=-1").is_err());
        assert!(Mix::parse("runtime=0").is_err());
    }
}
