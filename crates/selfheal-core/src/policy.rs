//! The recovery policy engine: `R = π(state, failure, budget)`.
//!
//! Policy is data, not code paths. A [`Policy`] is a table from [`FailureClass`] to an ordered
//! *ladder* of [`ActionKind`]s, cheapest first, plus the retry backoff parameters. [`Policy::decide`]
//! walks the ladder from where the previous attempt at the same failure left off, skips every rung
//! that is infeasible (no substitute exists, the budget dimension it needs is spent), and returns the
//! first feasible action together with the rung it came from. A failure that recurs therefore climbs
//! the ladder. When no rung is left, the policy degrades (if a partial result is possible) or
//! terminates — it never loops.
//!
//! # The default table (our answer to the paper's missing Table 3)
//!
//! | class | ladder | why |
//! |---|---|---|
//! | `tool_timeout` | retry, retry, substitute, replan, escalate, degrade | transient: waiting fixes it; if not, route around |
//! | `tool_unavailable` | retry, substitute, replan, escalate, degrade | persistent, or so it looks after one failure: one retry first, because a substitute's answer is in doubt until the primary confirms it (see *Values in doubt*), while a retry's can be cross-checked |
//! | `argument_invalid` | repair, retry, escalate, replan, degrade | repair is free; a re-ask with the precise error next |
//! | `malformed_output` | repair, retry, substitute, escalate, degrade | parse what came back before asking again |
//! | `empty_output` | retry, substitute, replan, degrade | an empty answer is often a blip; else another source |
//! | `wrong_tool` | repair, substitute, replan, escalate, degrade | re-map the call to the right tool, else replan |
//! | `stale_context` | refresh, substitute, degrade | re-fetch; fall back to another fresh source |
//! | `contradictory_evidence` | refresh, retry, degrade | two sources disagree and nothing says which is right: re-read, and if they still disagree degrade rather than guess (trusting the other source returned its wrong values as correct) |
//! | `planning_failure` | replan, escalate, degrade | the plan is the problem |
//! | `verification_failure` | substitute, retry, replan, escalate, degrade | a wrong-but-plausible result: get it from elsewhere |
//! | `control_loop` | replan, escalate, terminate | break the loop; never feed it |
//!
//! The table is loadable from TOML (see [`Policy::from_toml_str`]); classes a file leaves out keep
//! their default ladder.
//!
//! # Values in doubt
//!
//! A recovery can end in a value that is checked less than the plan's own tool would have been:
//! a substitute's answer cannot be cross-checked against the tool that just failed, and a re-read
//! after two sources disagreed settles nothing if the second source cannot answer. Nor is a value
//! the plan's tool gave after failing as trustworthy as one it gave at once: faults come together,
//! so a source that just timed out or sent broken bytes is likelier to be wrong in a second way on
//! the same answer, and a repair rebuilds the value from what it was given. Every recovered value
//! is therefore *in doubt* ([`Policy::in_doubt`]) until a verifier accepts it. When the verifier
//! runs and cannot tell, the policy's one [`Policy::risk`] setting decides
//! ([`Policy::claims_unverified`]): the value is claimed when the trust its source has earned
//! ([`crate::trust`]: cross-checks, verdicts, contract breaches and re-reads this process has
//! seen) puts its chance of being right at `1 − risk` or more; otherwise it is read and checked
//! again while the policy and the budget allow ([`Policy::check_again`]: a check that could not
//! answer now — a busy or briefly down second source — may answer later), and the run degrades
//! with the value flagged only when that cannot settle it. A fixed rule cannot tell a good substitute from a wrong one — claiming every
//! such value returns a wrong substitute, the other side of a disagreement, or a re-mapped body
//! whose other source cannot be read either, as if it were right; claiming none throws away every
//! recovery from an outage — evidence can. An outage of the primary is not evidence against the
//! substitute. [`Policy::accept_unverified_recovery`] overrides the rule either way. With no
//! verifier at all nothing is held back: a value nothing can check is claimed whether or not it
//! was recovered.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::budget::{Amounts, BudgetLedger, Dimension};
use crate::classifier::{Classification, FailureClass};
use crate::rng::Rng;
use crate::trust::TrustConfig;

/// The kind of a recovery action, without parameters: what a policy ladder is made of.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    Serialize,
    Deserialize,
    strum::EnumCount,
)]
#[serde(rename_all = "snake_case")]
pub enum ActionKind {
    /// Repeat the same call after a backoff.
    Retry,
    /// Fix the arguments or the output (JSON repair, schema coercion, re-ask with the error).
    Repair,
    /// Use an equivalent tool or source.
    Substitute,
    /// Rebuild the plan from the current state.
    Replan,
    /// Re-fetch stale context.
    Refresh,
    /// Hand over to a stronger or fallback model, or to a human.
    Escalate,
    /// Stop with a partial result and an error report.
    Degrade,
    /// Stop with no result.
    Terminate,
}

// A kind added to the enum and not to `ALL` fails to compile here.
const _: () = assert!(ActionKind::ALL.len() == <ActionKind as strum::EnumCount>::COUNT);

impl ActionKind {
    /// Every kind, in declaration order.
    pub const ALL: [ActionKind; 8] = [
        ActionKind::Retry,
        ActionKind::Repair,
        ActionKind::Substitute,
        ActionKind::Replan,
        ActionKind::Refresh,
        ActionKind::Escalate,
        ActionKind::Degrade,
        ActionKind::Terminate,
    ];

    /// The snake_case name.
    pub fn as_str(self) -> &'static str {
        match self {
            ActionKind::Retry => "retry",
            ActionKind::Repair => "repair",
            ActionKind::Substitute => "substitute",
            ActionKind::Replan => "replan",
            ActionKind::Refresh => "refresh",
            ActionKind::Escalate => "escalate",
            ActionKind::Degrade => "degrade",
            ActionKind::Terminate => "terminate",
        }
    }

    /// What taking this action charges to the budget ledger.
    pub fn charge(self) -> Amounts {
        let mut a = match self {
            ActionKind::Retry => Amounts::one(Dimension::Retries),
            ActionKind::Substitute => Amounts::one(Dimension::Substitutions),
            ActionKind::Replan => Amounts::one(Dimension::Replans),
            ActionKind::Escalate => Amounts::one(Dimension::Escalations),
            ActionKind::Repair | ActionKind::Refresh => Amounts::default(),
            ActionKind::Degrade | ActionKind::Terminate => return Amounts::default(),
        };
        a.recoveries = 1;
        a
    }

    /// Whether the action ends the run.
    pub fn is_terminal(self) -> bool {
        match self {
            ActionKind::Degrade | ActionKind::Terminate => true,
            ActionKind::Retry
            | ActionKind::Repair
            | ActionKind::Substitute
            | ActionKind::Replan
            | ActionKind::Refresh
            | ActionKind::Escalate => false,
        }
    }
}

impl std::fmt::Display for ActionKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a repair fixes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RepairTarget {
    /// The call's arguments (JSON repair, coercion, or a re-ask with the validation error).
    Arguments,
    /// The tool's or model's output.
    Output,
    /// The request itself (trim context, fix a shape the server rejects).
    Request,
    /// The tool name (re-map a hallucinated or wrong tool to an offered one).
    ToolChoice,
}

/// Who an escalation goes to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "to", rename_all = "snake_case")]
pub enum EscalationTarget {
    /// The next model in the fallback chain.
    FallbackModel {
        /// The model's name.
        model: String,
    },
    /// A person.
    Human,
}

/// A recovery action with its parameters: what the executor is told to do.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "action", rename_all = "snake_case")]
pub enum RecoveryAction {
    /// Repeat the call after `delay_ms`.
    Retry {
        /// How long to wait first (backoff with jitter, at least any `Retry-After`).
        delay_ms: u64,
        /// Which retry of this failure this is (1-based).
        attempt: u32,
    },
    /// Repair the target.
    Repair {
        /// What to repair.
        target: RepairTarget,
    },
    /// Use `alternative` instead of the failed tool or source.
    Substitute {
        /// The equivalent tool or source.
        alternative: String,
    },
    /// Rebuild the plan.
    Replan,
    /// Re-fetch the stale data.
    Refresh,
    /// Escalate.
    Escalate {
        /// To whom.
        target: EscalationTarget,
    },
    /// Stop with a partial result and a report.
    Degrade,
    /// Stop.
    Terminate,
}

impl RecoveryAction {
    /// The action's kind.
    pub fn kind(&self) -> ActionKind {
        match self {
            RecoveryAction::Retry { .. } => ActionKind::Retry,
            RecoveryAction::Repair { .. } => ActionKind::Repair,
            RecoveryAction::Substitute { .. } => ActionKind::Substitute,
            RecoveryAction::Replan => ActionKind::Replan,
            RecoveryAction::Refresh => ActionKind::Refresh,
            RecoveryAction::Escalate { .. } => ActionKind::Escalate,
            RecoveryAction::Degrade => ActionKind::Degrade,
            RecoveryAction::Terminate => ActionKind::Terminate,
        }
    }
}

/// What is possible for this failure right now. The executor knows its world; the policy only
/// reads these facts.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Options {
    /// A repair of the given target is possible (a repairer exists for it).
    pub repair: Option<RepairTarget>,
    /// An equivalent tool or source that has not been tried yet.
    pub substitute: Option<String>,
    /// The data can be re-fetched.
    pub refreshable: bool,
    /// A planner is available to rebuild the plan.
    pub can_replan: bool,
    /// The next model of the fallback chain, if any is left.
    pub fallback_model: Option<String>,
    /// A person can be asked.
    pub human_available: bool,
    /// Retrying the call is safe (it is not destructive, or the caller allowed it).
    pub retry_safe: bool,
    /// Something useful has been produced already, so degrading yields a partial result.
    pub partial_result: bool,
    /// The longest the executor can wait before it sends a call again, in milliseconds (a
    /// proxy holds its client's request while it waits). A retry whose delay — the backoff,
    /// or a `Retry-After` — is longer does not apply here: the ladder moves on, and the wait is
    /// never shortened to fit. `None`: no limit (an executor on its own clock waits what it
    /// must).
    pub max_delay_ms: Option<u64>,
}

impl Options {
    /// Options where every action is possible: useful in tests and simulations.
    pub fn all(substitute: &str, fallback_model: &str) -> Options {
        Options {
            repair: Some(RepairTarget::Arguments),
            substitute: Some(substitute.to_owned()),
            refreshable: true,
            can_replan: true,
            fallback_model: Some(fallback_model.to_owned()),
            human_available: false,
            retry_safe: true,
            partial_result: true,
            max_delay_ms: None,
        }
    }

    /// Whether the executor can wait `delay_ms` before a retry ([`Options::max_delay_ms`]).
    pub fn can_wait(&self, delay_ms: u64) -> bool {
        self.max_delay_ms.is_none_or(|max| delay_ms <= max)
    }
}

/// Exponential backoff with jitter; honours `Retry-After` up to a cap.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RetryConfig {
    /// Delay before the first retry, in milliseconds.
    pub base_ms: u64,
    /// Multiplier per further retry (≥ 1).
    pub factor: f64,
    /// Cap on the computed delay.
    pub max_ms: u64,
    /// Relative jitter in `[0, 1]`: the delay is scaled by a factor drawn from `[1 - j, 1 + j]`.
    pub jitter: f64,
    /// A server's `Retry-After` is honoured up to this many milliseconds.
    pub max_retry_after_ms: u64,
}

impl Default for RetryConfig {
    fn default() -> Self {
        RetryConfig {
            base_ms: 500,
            factor: 2.0,
            max_ms: 30_000,
            jitter: 0.2,
            max_retry_after_ms: 60_000,
        }
    }
}

impl RetryConfig {
    /// The delay before retry number `attempt` (1-based), given an optional server `Retry-After`.
    pub fn delay_ms(&self, attempt: u32, retry_after_ms: Option<u64>, rng: &mut dyn Rng) -> u64 {
        // Any exponent is safe: `powi` saturates to infinity and the cap below applies. (A cap
        // of 62 here made slow factors stop growing after the 63rd attempt.)
        let exp = i32::try_from(attempt.saturating_sub(1)).unwrap_or(i32::MAX);
        let raw = (self.base_ms as f64) * self.factor.powi(exp);
        let capped = raw.min(self.max_ms as f64);
        let j = self.jitter.clamp(0.0, 1.0);
        let scale = 1.0 - j + 2.0 * j * rng.next_f64();
        let backoff = (capped * scale).round().max(0.0) as u64;
        match retry_after_ms {
            Some(ra) => backoff.max(ra.min(self.max_retry_after_ms)),
            None => backoff,
        }
    }

    /// Appends every problem with these parameters to `out`.
    fn problems(&self, out: &mut Vec<String>) {
        if !(self.factor.is_finite() && self.factor >= 1.0) {
            out.push(format!(
                "retry.factor must be a number ≥ 1, got {}",
                self.factor
            ));
        }
        if !(0.0..=1.0).contains(&self.jitter) {
            out.push(format!(
                "retry.jitter must be in [0, 1], got {}",
                self.jitter
            ));
        }
        if self.base_ms > self.max_ms {
            out.push(format!(
                "retry.base_ms ({}) must not exceed retry.max_ms ({})",
                self.base_ms, self.max_ms
            ));
        }
    }
}

/// Why a policy could not be loaded.
#[derive(Debug, Error)]
pub enum PolicyError {
    /// The TOML did not parse or named something unknown.
    #[error("invalid policy file: {0}")]
    Parse(String),
    /// The values parsed but make no sense.
    #[error("invalid policy: {0}")]
    Invalid(String),
}

/// Where a failure stands on its ladder. The caller keeps one per open failure and passes the
/// decision's [`Decision::next`] back in when the same failure recurs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LadderState {
    /// The next rung to consider.
    pub rung: usize,
    /// Retries taken for this failure so far.
    pub retries: u32,
    /// Recovery actions taken for this failure so far.
    #[serde(default)]
    pub actions: u32,
}

/// Why a rung was passed over.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SkipReason {
    /// The action does not apply here (no substitute, no planner, unsafe to retry, a retry's
    /// wait longer than the executor can make...).
    NotApplicable,
    /// The budget dimension it needs is spent.
    BudgetSpent,
    /// A retry rung, when the failure has already had as many retries as the ladder holds up to
    /// this rung: a failure whose class changed on the way (a timeout that turned out to be an
    /// outage) does not retry again what it already retried.
    AlreadyTaken,
}

/// The policy's decision for one failure.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Decision {
    /// The action to take.
    pub action: RecoveryAction,
    /// The rung it came from (`None` for the fallback after the ladder ran out).
    pub rung: Option<usize>,
    /// What the action costs; the caller charges it to the ledger.
    pub charge: Amounts,
    /// The state to pass back if the same failure recurs.
    pub next: LadderState,
    /// Rungs passed over on the way, with the reason.
    pub skipped: Vec<(ActionKind, SkipReason)>,
}

/// A recovery policy: ladders per class plus backoff parameters.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Policy {
    /// At most this many recovery actions on any one failure before degrading (`None`: only the
    /// ladder and the budget limit it). The benchmark's per-failure budget `R`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_actions_per_failure: Option<u32>,
    /// The share of answers claimed complete that the user accepts being wrong (in `[0, 1)`;
    /// default 0.01). A recovered value a verifier could not judge is claimed when its estimated
    /// chance of being right — the trust its source has earned ([`Trust`](crate::Trust)) — is at least
    /// `1 − risk`; otherwise it is read and checked again while the budget allows
    /// ([`Policy::check_again`]), and the run ends `partial` with the value flagged when that
    /// cannot settle it. `accept_unverified_recovery`, `claim_after_recovery`, `reread_after_recovery`
    /// and `reread_reads` are derived from it ([`Policy::claims_unverified`],
    /// [`Policy::claims_after_recovery`], [`Policy::rereads_after_recovery`],
    /// [`Policy::reread_count`]) unless set explicitly.
    #[serde(default = "default_risk")]
    pub risk: f64,
    /// How trust in a source is estimated: the prior, its decay and cap (`[trust]`).
    #[serde(default)]
    pub trust: TrustConfig,
    /// Override: whether a value is taken as correct when a verifier could not judge it although
    /// a recovery put it in doubt (see [`Policy::in_doubt`]). Unset, the default: derived from
    /// `risk` and the trust the value's source has earned ([`Policy::claims_unverified`]).
    /// `false`: such a value is never claimed as correct; the failure stays unresolved and the
    /// run degrades with a partial result. `true`: it always is. (With no verifier at all,
    /// nothing is held back.)
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accept_unverified_recovery: Option<bool>,
    /// The action to take when only one is left for a failure (see `max_actions_per_failure`):
    /// not the cheapest rung but the one that fixes the most causes of the class. A last retry of
    /// a tool that may be down is a coin toss; a substitute is not. Used only when feasible;
    /// otherwise the ladder applies.
    #[serde(default = "default_last_chance")]
    pub last_chance: BTreeMap<FailureClass, ActionKind>,
    /// Override: whether a run that needed a recovery reads once more, before it answers, each
    /// value no second source confirmed (see *Values in doubt*; asked through
    /// [`Controller::reread_due`](crate::controller::Controller::reread_due)). Unset: yes unless
    /// `risk` is 1 or more ([`Policy::rereads_after_recovery`]). Faults come together in time,
    /// so a source that failed openly in this run may, before that, have given a value that did
    /// not last; one more read of each such value, charged like any call, is the one check
    /// there is for a value nothing else can confirm. A run that went well is not read again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reread_after_recovery: Option<bool>,
    /// Override: how many times that read before answering reads each such value (at least 1;
    /// the first read that differs ends it). Unset: derived from `risk`
    /// ([`Policy::reread_count`]: 2 at the default 0.01). A source whose bad spell outlasts one
    /// read repeats its wrong value on the next, which then agrees with it; each further read
    /// reaches one call further past the value it checks. A wrong value that lasts for good
    /// agrees with every read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reread_reads: Option<u32>,
    /// Override: whether a run that carried out a recovery may end `complete`. Unset: yes unless
    /// `risk` is 0 ([`Policy::claims_after_recovery`]). `false`: such a run ends `partial` (its
    /// answer kept, with the reason), whatever its checks said, and makes no read before
    /// answering. Recovering gets a run further than giving up would, so it meets more values
    /// that no check can see (two sources agreeing on a wrong value, a calculator wrong for
    /// good); with this off, self-healing claims what a strategy that stops at the first fault
    /// claims and no more, and gives up every recovery's answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claim_after_recovery: Option<bool>,
    /// Backoff parameters for retries.
    pub retry: RetryConfig,
    /// One ladder per failure class, cheapest action first.
    pub ladders: BTreeMap<FailureClass, Vec<ActionKind>>,
}

/// The default `risk`: one claimed answer in a hundred may be wrong.
pub(crate) const DEFAULT_RISK: f64 = 0.01;

fn default_risk() -> f64 {
    DEFAULT_RISK
}

impl Default for Policy {
    fn default() -> Self {
        use ActionKind::*;
        let ladders = FailureClass::ALL
            .into_iter()
            .map(|c| {
                let ladder = match c {
                    FailureClass::ToolTimeout => {
                        vec![Retry, Retry, Substitute, Replan, Escalate, Degrade]
                    }
                    // One retry before the substitute: a substitute's answer counts only once the
                    // tool that failed confirms it, a retry's answer can be cross-checked, and an
                    // "unavailable" on the first call is often transient. (Repeated 5xx reach this
                    // class after the timeout ladder's two retries, which count: no third.)
                    FailureClass::ToolUnavailable => {
                        vec![Retry, Substitute, Replan, Escalate, Degrade]
                    }
                    FailureClass::ArgumentInvalid => vec![Repair, Retry, Escalate, Replan, Degrade],
                    FailureClass::MalformedOutput => {
                        vec![Repair, Retry, Substitute, Escalate, Degrade]
                    }
                    FailureClass::EmptyOutput => vec![Retry, Substitute, Replan, Degrade],
                    FailureClass::WrongTool => vec![Repair, Substitute, Replan, Escalate, Degrade],
                    FailureClass::StaleContext => vec![Refresh, Substitute, Degrade],
                    // Two sources disagree. Taking the other one is a guess, and a guess returned
                    // as correct is a silent failure: re-read (a stale cache, a transient
                    // glitch), and if the disagreement stays, degrade.
                    FailureClass::ContradictoryEvidence => vec![Refresh, Retry, Degrade],
                    FailureClass::PlanningFailure => vec![Replan, Escalate, Degrade],
                    FailureClass::VerificationFailure => {
                        vec![Substitute, Retry, Replan, Escalate, Degrade]
                    }
                    FailureClass::ControlLoop => vec![Replan, Escalate, Terminate],
                };
                (c, ladder)
            })
            .collect();
        Policy {
            retry: RetryConfig::default(),
            ladders,
            max_actions_per_failure: None,
            last_chance: default_last_chance(),
            risk: DEFAULT_RISK,
            trust: TrustConfig::default(),
            accept_unverified_recovery: None,
            reread_after_recovery: None,
            reread_reads: None,
            claim_after_recovery: None,
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PolicyFile {
    #[serde(default)]
    retry: RetryConfig,
    #[serde(default)]
    ladders: BTreeMap<FailureClass, Vec<ActionKind>>,
    #[serde(default)]
    max_actions_per_failure: Option<u32>,
    #[serde(default)]
    last_chance: BTreeMap<FailureClass, ActionKind>,
    #[serde(default = "default_risk")]
    risk: f64,
    #[serde(default)]
    trust: TrustConfig,
    #[serde(default)]
    accept_unverified_recovery: Option<bool>,
    #[serde(default)]
    reread_after_recovery: Option<bool>,
    #[serde(default)]
    reread_reads: Option<u32>,
    #[serde(default)]
    claim_after_recovery: Option<bool>,
}

/// The default last-chance actions: substitute for tool and data failures, escalate for the
/// model's own mistakes, re-map the tool for a wrong tool choice.
pub(crate) fn default_last_chance() -> BTreeMap<FailureClass, ActionKind> {
    FailureClass::ALL
        .into_iter()
        .map(|c| {
            let a = match c {
                FailureClass::ToolTimeout
                | FailureClass::ToolUnavailable
                | FailureClass::MalformedOutput
                | FailureClass::EmptyOutput
                | FailureClass::StaleContext
                | FailureClass::VerificationFailure => ActionKind::Substitute,
                FailureClass::ContradictoryEvidence => ActionKind::Refresh,
                FailureClass::ArgumentInvalid
                | FailureClass::PlanningFailure
                | FailureClass::ControlLoop => ActionKind::Escalate,
                FailureClass::WrongTool => ActionKind::Repair,
            };
            (c, a)
        })
        .collect()
}

impl Policy {
    /// Loads a policy from TOML. Classes the file leaves out keep their default ladder; unknown
    /// classes, actions or keys are errors.
    ///
    /// ```toml
    /// [retry]
    /// base_ms = 250
    /// factor = 2.0
    ///
    /// [ladders]
    /// tool_timeout = ["retry", "substitute", "degrade"]
    /// ```
    pub fn from_toml_str(s: &str) -> Result<Policy, PolicyError> {
        let file: PolicyFile = toml::from_str(s).map_err(|e| PolicyError::Parse(e.to_string()))?;
        let mut policy = Policy {
            retry: file.retry,
            max_actions_per_failure: file.max_actions_per_failure,
            risk: file.risk,
            trust: file.trust,
            accept_unverified_recovery: file.accept_unverified_recovery,
            reread_after_recovery: file.reread_after_recovery,
            reread_reads: file.reread_reads,
            claim_after_recovery: file.claim_after_recovery,
            ..Policy::default()
        };
        for (class, action) in file.last_chance {
            policy.last_chance.insert(class, action);
        }
        for (class, ladder) in file.ladders {
            policy.ladders.insert(class, ladder);
        }
        policy.validate()?;
        Ok(policy)
    }

    /// Serialises the whole policy (every class) as TOML.
    pub fn to_toml_string(&self) -> Result<String, PolicyError> {
        toml::to_string(self).map_err(|e| PolicyError::Invalid(e.to_string()))
    }

    /// Checks the parameters and that every ladder's actions are reachable, reporting every
    /// problem at once (joined by `; `) so a file with several mistakes is fixed in one pass.
    pub fn validate(&self) -> Result<(), PolicyError> {
        let mut problems = Vec::new();
        self.retry.problems(&mut problems);
        if !(self.risk.is_finite() && (0.0..1.0).contains(&self.risk)) {
            problems.push(format!("risk must be in [0, 1), got {}", self.risk));
        }
        self.trust.problems(&mut problems);
        if self.reread_reads == Some(0) {
            problems.push(
                "reread_reads is 0: use reread_after_recovery = false to read nothing again"
                    .to_owned(),
            );
        }
        for (class, ladder) in &self.ladders {
            if let Some(pos) = ladder.iter().position(|a| a.is_terminal())
                && pos + 1 < ladder.len()
            {
                problems.push(format!(
                    "ladder for {class}: `{}` ends the run, so the {} rung(s) after it can never be reached",
                    ladder[pos],
                    ladder.len() - pos - 1
                ));
            }
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(PolicyError::Invalid(problems.join("; ")))
        }
    }

    /// Whether a value that recovering from a `class` failure by `last_action` produced is in
    /// doubt until a verifier accepts it. See [`Policy::accept_unverified_recovery`].
    ///
    /// Every recovered value is: one from another source than the plan's tool (a substitute), one
    /// answering a failure that was itself about the value (two sources disagreed, a verifier
    /// rejected it), and also one the plan's own tool gave on a later attempt (a retry, a repaired
    /// call or output, a re-fetch, a re-plan, an escalation). Faults come together: a source that
    /// just timed out, failed or sent broken bytes is likelier than one that answered cleanly to
    /// be wrong in a second way on the same answer, and a repair rebuilds the value from what it
    /// was given. So the check a first-try value would get must confirm a recovered one; a check
    /// that ran and could not tell does not. With no action taken (`None`) only a failure about
    /// the value puts it in doubt.
    pub fn in_doubt(class: FailureClass, last_action: Option<ActionKind>) -> bool {
        let about_the_value = match class {
            FailureClass::ContradictoryEvidence | FailureClass::VerificationFailure => true,
            FailureClass::ToolTimeout
            | FailureClass::ToolUnavailable
            | FailureClass::ArgumentInvalid
            | FailureClass::MalformedOutput
            | FailureClass::EmptyOutput
            | FailureClass::WrongTool
            | FailureClass::StaleContext
            | FailureClass::PlanningFailure
            | FailureClass::ControlLoop => false,
        };
        let recovered = match last_action {
            Some(
                ActionKind::Retry
                | ActionKind::Repair
                | ActionKind::Substitute
                | ActionKind::Replan
                | ActionKind::Refresh
                | ActionKind::Escalate,
            ) => true,
            Some(ActionKind::Degrade | ActionKind::Terminate) | None => false,
        };
        about_the_value || recovered
    }

    /// Whether values are read once more before they are relied on, given whether a recovery
    /// was carried out (`recovered`): when the policy asks for the read
    /// ([`Policy::reread_after_recovery`]), claims answers after a recovery at all
    /// ([`Policy::claim_after_recovery`]) and one was carried out. The rule behind
    /// [`Controller::reread_due`](crate::controller::Controller::reread_due), and the one a
    /// front-end that sees single calls but not the run's answer (the MCP proxy) applies to a
    /// recovered call.
    pub fn reread_due(&self, recovered: bool) -> bool {
        self.rereads_after_recovery() && self.claims_after_recovery() && recovered
    }

    /// Whether a run that carried out a recovery may end `complete`: the
    /// `claim_after_recovery` override, else yes unless `risk` is 0 (a user who accepts no
    /// wrong answer accepts no answer resting on a recovered value).
    pub fn claims_after_recovery(&self) -> bool {
        self.claim_after_recovery.unwrap_or(self.risk > 0.0)
    }

    /// Whether a recovered value that a check could not judge (its second source did not
    /// answer, or sent bytes nothing reads) is read and checked again, and how: a retry of the
    /// call that recovered it — after the backoff a retry would wait, so that a source busy or
    /// down for a moment can answer — whose value the same check then judges (issue 33: "it is
    /// cross-checked or read again while the budget allows"). `rechecks` is how many times this
    /// was done already for the failure; `retry_after_ms` is the wait the failure's source asked
    /// for, honoured as a retry honours it. Allowed while fewer than [`Policy::reread_count`]
    /// rechecks were made (the reads `risk` asks of a value nothing else confirms), the call is
    /// safe to send again, the per-failure cap leaves an action, the budget affords a retry and
    /// the executor can wait its delay ([`Options::max_delay_ms`]).
    /// `None`: the value stays unsettled, and the run ends `partial` with it flagged.
    pub fn check_again(
        &self,
        state: LadderState,
        rechecks: u32,
        retry_after_ms: Option<u64>,
        options: &Options,
        budget: &BudgetLedger,
        rng: &mut dyn Rng,
    ) -> Option<Decision> {
        let charge = ActionKind::Retry.charge();
        let allowed = rechecks < self.reread_count()
            && options.retry_safe
            && self
                .max_actions_per_failure
                .is_none_or(|cap| state.actions < cap)
            && budget.exhausted().is_none()
            && budget.can_afford(&charge);
        if !allowed {
            return None;
        }
        let attempt = state.retries + 1;
        let delay_ms = self.retry.delay_ms(attempt, retry_after_ms, rng);
        if !options.can_wait(delay_ms) {
            return None;
        }
        Some(Decision {
            action: RecoveryAction::Retry { delay_ms, attempt },
            rung: None,
            charge,
            next: LadderState {
                rung: state.rung,
                retries: attempt,
                actions: state.actions + 1,
            },
            skipped: Vec::new(),
        })
    }

    /// Whether a run that needed a recovery reads its unconfirmed values once more before
    /// answering: the `reread_after_recovery` override, else yes (any `risk` below 1 wants the
    /// one check there is for a value nothing else confirms).
    pub fn rereads_after_recovery(&self) -> bool {
        self.reread_after_recovery.unwrap_or(self.risk < 1.0)
    }

    /// How many times the read before answering reads each value: the `reread_reads`
    /// override, else one read per order of magnitude of `1 / risk`, from 1 to 4 (2 at the
    /// default 0.01). Each read that agrees reaches one call further past a bad spell the value
    /// may have come from; asking for ten times fewer wrong answers asks for one read more.
    pub fn reread_count(&self) -> u32 {
        self.reread_reads
            .unwrap_or_else(|| {
                let r = self.risk.clamp(1e-4, 0.5);
                (1.0 / r).log10().ceil().clamp(1.0, 4.0) as u32
            })
            .max(1)
    }

    /// Whether a recovered value no verifier could judge is claimed, given the estimated
    /// chance that it is right (`p_right`, from the trust its source earned; `None` when no
    /// source is known): the `accept_unverified_recovery` override, else `p_right ≥ 1 − risk`.
    /// A value whose source is unknown is not claimed.
    pub fn claims_unverified(&self, p_right: Option<f64>) -> bool {
        match self.accept_unverified_recovery {
            Some(b) => b,
            None => p_right.is_some_and(|p| p >= 1.0 - self.risk),
        }
    }

    /// Why no answer may be claimed, given whether a recovery was carried out (`recovered`):
    /// when the policy claims nothing after one ([`Policy::claim_after_recovery`] `false`) and
    /// one was. The rule behind
    /// [`Controller::claim_refused`](crate::controller::Controller::claim_refused), and the one
    /// a front-end that sees single calls but not the run's answer (the MCP proxy) applies to a
    /// recovered call's value.
    pub fn claim_refused(&self, recovered: bool) -> Option<String> {
        (!self.claims_after_recovery() && recovered).then(|| {
            "a recovery was carried out, and the policy claims no answer after one \
             (claim_after_recovery = false, or risk = 0)"
                .to_owned()
        })
    }

    /// The ladder for a class (empty if the class has none: it degrades at once).
    pub fn ladder(&self, class: FailureClass) -> &[ActionKind] {
        self.ladders.get(&class).map(Vec::as_slice).unwrap_or(&[])
    }

    /// The concrete action for `kind` if it applies here, with the failure's retry count after it.
    fn instantiate(
        &self,
        kind: ActionKind,
        state: LadderState,
        failure: &Classification,
        options: &Options,
        rng: &mut dyn Rng,
    ) -> Option<(RecoveryAction, u32)> {
        let action = match kind {
            ActionKind::Retry => {
                if !options.retry_safe {
                    return None;
                }
                let attempt = state.retries + 1;
                let delay_ms = self.retry.delay_ms(attempt, failure.retry_after_ms, rng);
                // A wait the executor cannot make is not shortened: the retry does not apply.
                if !options.can_wait(delay_ms) {
                    return None;
                }
                return Some((RecoveryAction::Retry { delay_ms, attempt }, attempt));
            }
            ActionKind::Repair => options
                .repair
                .map(|target| RecoveryAction::Repair { target }),
            ActionKind::Substitute => options
                .substitute
                .clone()
                .map(|alternative| RecoveryAction::Substitute { alternative }),
            ActionKind::Replan => options.can_replan.then_some(RecoveryAction::Replan),
            ActionKind::Refresh => options.refreshable.then_some(RecoveryAction::Refresh),
            ActionKind::Escalate => match (&options.fallback_model, options.human_available) {
                (Some(model), _) => Some(RecoveryAction::Escalate {
                    target: EscalationTarget::FallbackModel {
                        model: model.clone(),
                    },
                }),
                (None, true) => Some(RecoveryAction::Escalate {
                    target: EscalationTarget::Human,
                }),
                (None, false) => None,
            },
            ActionKind::Degrade | ActionKind::Terminate => None,
        };
        action.map(|a| (a, state.retries))
    }

    /// The action a failure gets when only one is left for it ([`Policy::last_chance`]), unless
    /// that action's result would be one the policy then refuses to claim (issue 33): a
    /// substitute's value is checked against the primary, and when the primary is the tool that
    /// cannot answer now (it timed out or is unavailable) and the policy would not claim an
    /// unchecked value of a source it knows nothing of (its trust prior against `risk`, or
    /// `accept_unverified_recovery = false`), the substitute's value is held in doubt and the
    /// run degrades. The last action
    /// is then a retry of the primary — when it is safe and affordable — whose value the
    /// substitute can check; a `Retry-After` within [`RetryConfig::max_retry_after_ms`] is waited
    /// out.
    pub fn last_chance_kind(
        &self,
        failure: &Classification,
        options: &Options,
        budget: &BudgetLedger,
    ) -> Option<ActionKind> {
        let kind = *self.last_chance.get(&failure.class)?;
        let primary_down = matches!(
            failure.class,
            FailureClass::ToolTimeout | FailureClass::ToolUnavailable
        );
        if kind == ActionKind::Substitute
            && primary_down
            && !self.claims_unverified(Some(self.trust.prior_mean()))
            && options.retry_safe
            && budget.can_afford(&ActionKind::Retry.charge())
        {
            return Some(ActionKind::Retry);
        }
        Some(kind)
    }

    /// Picks the cheapest feasible action for `failure`, starting at `state.rung`.
    ///
    /// Never returns an action whose budget is spent; when the ladder is used up it returns
    /// [`RecoveryAction::Degrade`] if `options.partial_result`, else [`RecoveryAction::Terminate`].
    pub fn decide(
        &self,
        state: LadderState,
        failure: &Classification,
        options: &Options,
        budget: &BudgetLedger,
        rng: &mut dyn Rng,
    ) -> Decision {
        let ladder = self.ladder(failure.class);
        let mut skipped = Vec::new();
        let ended = budget.exhausted().is_some()
            || self
                .max_actions_per_failure
                .is_some_and(|cap| state.actions >= cap);
        if !ended
            && let Some(cap) = self.max_actions_per_failure
            && state.actions + 1 == cap
            && let Some(kind) = self.last_chance_kind(failure, options, budget)
            && !kind.is_terminal()
            && budget.can_afford(&kind.charge())
            && let Some((action, retries)) = self.instantiate(kind, state, failure, options, rng)
        {
            return Decision {
                action,
                rung: None,
                charge: kind.charge(),
                next: LadderState {
                    rung: ladder.len(),
                    retries,
                    actions: state.actions + 1,
                },
                skipped,
            };
        }
        for (rung, &kind) in ladder.iter().enumerate().skip(state.rung) {
            let charge = kind.charge();
            if kind.is_terminal() {
                let action = match kind {
                    ActionKind::Degrade if !options.partial_result => RecoveryAction::Terminate,
                    ActionKind::Degrade => RecoveryAction::Degrade,
                    _ => RecoveryAction::Terminate,
                };
                return Decision {
                    action,
                    rung: Some(rung),
                    charge,
                    next: LadderState {
                        rung: rung + 1,
                        ..state
                    },
                    skipped,
                };
            }
            if ended || !budget.can_afford(&charge) {
                skipped.push((kind, SkipReason::BudgetSpent));
                continue;
            }
            if kind == ActionKind::Retry {
                let asked = ladder[..=rung]
                    .iter()
                    .filter(|&&k| k == ActionKind::Retry)
                    .count();
                if state.retries as usize >= asked {
                    skipped.push((kind, SkipReason::AlreadyTaken));
                    continue;
                }
            }
            let mut next = LadderState {
                rung: rung + 1,
                actions: state.actions + 1,
                ..state
            };
            let action =
                self.instantiate(kind, state, failure, options, rng)
                    .map(|(a, retries)| {
                        next.retries = retries;
                        a
                    });
            match action {
                Some(action) => {
                    return Decision {
                        action,
                        rung: Some(rung),
                        charge,
                        next,
                        skipped,
                    };
                }
                None => skipped.push((kind, SkipReason::NotApplicable)),
            }
        }
        let action = if options.partial_result {
            RecoveryAction::Degrade
        } else {
            RecoveryAction::Terminate
        };
        Decision {
            action,
            rung: None,
            charge: Amounts::default(),
            next: LadderState {
                rung: ladder.len(),
                ..state
            },
            skipped,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::budget::BudgetLimits;
    use crate::classifier::ErrorType;
    use crate::rng::ConstRng;

    fn failure(class: FailureClass) -> Classification {
        Classification {
            class,
            error_type: class.default_error_type(),
            retry_after_ms: None,
        }
    }

    /// A policy that claims nothing after a recovery refuses a claim exactly when one was
    /// carried out, and then asks for no read before answering: the two rules never both hold.
    #[test]
    fn a_claim_after_a_recovery_is_refused_only_when_the_policy_says_so() {
        let mut p = Policy::default();
        assert_eq!(p.claim_refused(true), None);
        assert!(p.reread_due(true));
        p.claim_after_recovery = Some(false);
        assert_eq!(p.claim_refused(false), None);
        let why = p.claim_refused(true).unwrap_or_default();
        assert!(why.contains("claim_after_recovery = false"), "{why}");
        assert!(!p.reread_due(true));
    }

    #[test]
    fn picks_cheapest_then_climbs() {
        let p = Policy::default();
        let ledger = BudgetLedger::new(BudgetLimits::unlimited());
        let opts = Options::all("alt", "big");
        let mut rng = ConstRng(u64::MAX / 2);
        let f = failure(FailureClass::ToolTimeout);
        let d1 = p.decide(LadderState::default(), &f, &opts, &ledger, &mut rng);
        assert!(matches!(
            d1.action,
            RecoveryAction::Retry { attempt: 1, .. }
        ));
        let d2 = p.decide(d1.next, &f, &opts, &ledger, &mut rng);
        assert!(matches!(
            d2.action,
            RecoveryAction::Retry { attempt: 2, .. }
        ));
        let d3 = p.decide(d2.next, &f, &opts, &ledger, &mut rng);
        assert_eq!(
            d3.action,
            RecoveryAction::Substitute {
                alternative: "alt".into()
            }
        );
    }

    /// A retry whose wait is longer than the executor can make (a proxy holding its client's
    /// request) is not shortened to fit: the ladder moves on to its next rung. One that fits is
    /// taken with its whole wait.
    #[test]
    fn a_retry_longer_than_the_executor_can_wait_moves_the_ladder_on() {
        let p = Policy::default();
        let ledger = BudgetLedger::new(BudgetLimits::unlimited());
        let mut f = failure(FailureClass::ToolUnavailable);
        f.retry_after_ms = Some(20_000);
        let mut opts = Options::all("alt", "big");
        opts.max_delay_ms = Some(30_000);
        let d = p.decide(LadderState::default(), &f, &opts, &ledger, &mut ConstRng(0));
        assert!(
            matches!(d.action, RecoveryAction::Retry { delay_ms, .. } if delay_ms >= 20_000),
            "{:?}",
            d.action
        );
        opts.max_delay_ms = Some(10_000);
        let d = p.decide(LadderState::default(), &f, &opts, &ledger, &mut ConstRng(0));
        assert_eq!(d.action.kind(), ActionKind::Substitute, "{d:?}");
        assert!(
            d.skipped
                .contains(&(ActionKind::Retry, SkipReason::NotApplicable))
        );
        // A recheck's retry is refused the same way.
        let recheck = p.check_again(
            LadderState::default(),
            0,
            Some(20_000),
            &opts,
            &ledger,
            &mut ConstRng(0),
        );
        assert_eq!(recheck, None);
        opts.max_delay_ms = None;
        let recheck = p.check_again(
            LadderState::default(),
            0,
            Some(20_000),
            &opts,
            &ledger,
            &mut ConstRng(0),
        );
        assert!(recheck.is_some());
    }

    #[test]
    fn the_last_action_for_a_primary_that_is_down_is_not_a_substitute_nothing_could_check() {
        // Issue 33, item 4: with one action left, a substitute's value would be checked against
        // the primary that just failed, held in doubt and not claimed; a retry's value is
        // checked by the substitute. A Retry-After that fits is waited out. That is so when the
        // policy would not claim an unchecked value of a source it knows nothing of: a risk
        // below what the trust prior gives such a source.
        let p = Policy {
            max_actions_per_failure: Some(1),
            risk: 0.001,
            ..Policy::default()
        };
        assert!(!p.claims_unverified(Some(p.trust.prior_mean())));
        let ledger = BudgetLedger::new(BudgetLimits::unlimited());
        let opts = Options::all("alt", "big");
        let mut f = failure(FailureClass::ToolTimeout);
        f.retry_after_ms = Some(3_000);
        let d = p.decide(LadderState::default(), &f, &opts, &ledger, &mut ConstRng(0));
        assert!(
            matches!(d.action, RecoveryAction::Retry { delay_ms, .. } if delay_ms >= 3_000),
            "{:?}",
            d.action
        );
        // Accepting unverified recoveries, or a call that is not safe to retry, keeps the
        // substitute.
        let accepting = Policy {
            accept_unverified_recovery: Some(true),
            ..p.clone()
        };
        let d = accepting.decide(LadderState::default(), &f, &opts, &ledger, &mut ConstRng(0));
        assert_eq!(d.action.kind(), ActionKind::Substitute);
        let mut unsafe_opts = opts.clone();
        unsafe_opts.retry_safe = false;
        let d = p.decide(
            LadderState::default(),
            &f,
            &unsafe_opts,
            &ledger,
            &mut ConstRng(0),
        );
        assert_eq!(d.action.kind(), ActionKind::Substitute);
        // A failure about the value keeps its own last chance.
        let stale = failure(FailureClass::StaleContext);
        let d = p.decide(
            LadderState::default(),
            &stale,
            &opts,
            &ledger,
            &mut ConstRng(0),
        );
        assert_eq!(d.action.kind(), ActionKind::Substitute);
    }

    #[test]
    fn a_contradiction_is_never_settled_by_trusting_the_other_source() {
        // Regression (issue 10): with two disagreeing sources, substituting adopted the
        // substitute's value even when it was the wrong one, returned as correct.
        let p = Policy::default();
        let ledger = BudgetLedger::new(BudgetLimits::unlimited());
        let mut opts = Options::all("alt", "big");
        opts.refreshable = false;
        let f = failure(FailureClass::ContradictoryEvidence);
        let mut state = LadderState::default();
        let mut actions = Vec::new();
        for _ in 0..3 {
            let d = p.decide(state, &f, &opts, &ledger, &mut ConstRng(0));
            actions.push(d.action.kind());
            state = d.next;
        }
        assert_eq!(
            actions,
            [ActionKind::Retry, ActionKind::Degrade, ActionKind::Degrade]
        );
        assert!(!p.ladder(f.class).contains(&ActionKind::Substitute));
        assert_ne!(p.last_chance.get(&f.class), Some(&ActionKind::Substitute));
    }

    #[test]
    fn skips_spent_dimensions_and_inapplicable_rungs() {
        let p = Policy::default();
        let mut ledger = BudgetLedger::new(BudgetLimits {
            retries: 0,
            ..BudgetLimits::unlimited()
        });
        let mut opts = Options::all("alt", "big");
        opts.substitute = None;
        let f = failure(FailureClass::ToolTimeout);
        let d = p.decide(LadderState::default(), &f, &opts, &ledger, &mut ConstRng(0));
        assert_eq!(d.action, RecoveryAction::Replan);
        assert_eq!(
            d.skipped,
            vec![
                (ActionKind::Retry, SkipReason::BudgetSpent),
                (ActionKind::Retry, SkipReason::BudgetSpent),
                (ActionKind::Substitute, SkipReason::NotApplicable)
            ]
        );
        // Spend every recovery: the ladder falls through to degrade.
        ledger = BudgetLedger::new(BudgetLimits::unlimited().with_recoveries(0));
        let d = p.decide(LadderState::default(), &f, &opts, &ledger, &mut ConstRng(0));
        assert_eq!(d.action, RecoveryAction::Degrade);
        opts.partial_result = false;
        let d = p.decide(LadderState::default(), &f, &opts, &ledger, &mut ConstRng(0));
        assert_eq!(d.action, RecoveryAction::Terminate);
    }

    #[test]
    fn retry_after_is_honoured_and_capped() {
        let cfg = RetryConfig {
            jitter: 0.0,
            ..RetryConfig::default()
        };
        let mut rng = ConstRng(0);
        assert_eq!(cfg.delay_ms(1, None, &mut rng), 500);
        assert_eq!(cfg.delay_ms(2, None, &mut rng), 1000);
        assert_eq!(cfg.delay_ms(20, None, &mut rng), 30_000);
        assert_eq!(cfg.delay_ms(1, Some(5_000), &mut rng), 5_000);
        assert_eq!(cfg.delay_ms(1, Some(600_000), &mut rng), 60_000);
    }

    #[test]
    fn toml_round_trip_and_partial_override() {
        let p = Policy::default();
        let s = p.to_toml_string().unwrap_or_default();
        assert!(s.contains("tool_timeout"));
        let back = Policy::from_toml_str(&s);
        assert_eq!(back.ok(), Some(p.clone()));

        let custom = Policy::from_toml_str(
            "[retry]\nbase_ms = 100\n[ladders]\nempty_output = [\"substitute\", \"degrade\"]\n",
        );
        let custom = custom.ok();
        assert_eq!(custom.as_ref().map(|c| c.retry.base_ms), Some(100));
        assert_eq!(
            custom
                .as_ref()
                .map(|c| c.ladder(FailureClass::EmptyOutput).to_vec()),
            Some(vec![ActionKind::Substitute, ActionKind::Degrade])
        );
        assert_eq!(
            custom.map(|c| c.ladder(FailureClass::ToolTimeout).to_vec()),
            Some(p.ladder(FailureClass::ToolTimeout).to_vec())
        );
    }

    #[test]
    fn invalid_policy_files_are_rejected_clearly() {
        let unknown_class = Policy::from_toml_str("[ladders]\nflaky = [\"retry\"]\n");
        assert!(matches!(unknown_class, Err(PolicyError::Parse(ref m)) if m.contains("flaky")));
        let unknown_action = Policy::from_toml_str("[ladders]\ntool_timeout = [\"pray\"]\n");
        assert!(matches!(unknown_action, Err(PolicyError::Parse(ref m)) if m.contains("pray")));
        let bad_factor = Policy::from_toml_str("[retry]\nfactor = 0.5\n");
        assert!(matches!(bad_factor, Err(PolicyError::Invalid(ref m)) if m.contains("factor")));
        let unreachable =
            Policy::from_toml_str("[ladders]\ntool_timeout = [\"degrade\", \"retry\"]\n");
        assert!(
            matches!(unreachable, Err(PolicyError::Invalid(ref m)) if m.contains("never be reached"))
        );
        let typo = Policy::from_toml_str("[retri]\nbase_ms = 1\n");
        assert!(typo.is_err());
    }

    #[test]
    fn error_type_is_carried_not_used() {
        // The policy keys on the class only; the error type is for reporting.
        let p = Policy::default();
        let ledger = BudgetLedger::default();
        let mut f = failure(FailureClass::StaleContext);
        f.error_type = ErrorType::Transient;
        let d = p.decide(
            LadderState::default(),
            &f,
            &Options::all("a", "b"),
            &ledger,
            &mut ConstRng(0),
        );
        assert_eq!(d.action, RecoveryAction::Refresh);
    }
}
