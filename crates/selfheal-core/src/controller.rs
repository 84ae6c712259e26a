//! The sans-IO control loop: observations in, directives out.
//!
//! The controller routes between the components — monitor, classifier, policy, budget, verifier
//! results, trace — and owns no policy of its own. The data plane (an async runtime, the gateway,
//! the benchmark's simulator) performs every call and reports what happened as an
//! [`Observation`]; the controller answers with the next [`Directive`]: continue (with guidance and
//! tools to hide), recover (with this action), degrade, or abort. Time and randomness come in as
//! arguments, so a run is a pure function of its observations, clock and seed.
//!
//! ```text
//!   data plane                          control plane (this crate)
//!   ──────────                          ──────────────────────────
//!   tool/model call ──Observation──▶ monitor ─▶ classifier ─▶ policy ─▶ budget
//!        ▲                                │                              │
//!        └──────────── Directive ◀────────┴──────── trace ◀──────────────┘
//! ```

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::budget::{Amounts, BudgetLedger, BudgetLimits, Dimension};
use crate::call::Plane;
use crate::classifier::{
    Classification, Classifier, ClassifierConfig, ClassifyContext, FailureClass, Signal,
};
use crate::monitor::{
    CallOutcome, CallReport, ConfigError, FailureKind, Guidance, Monitor, MonitorConfig,
    MonitorSignal, ToolCall,
};
use crate::policy::{ActionKind, LadderState, Options, Policy, RecoveryAction};
use crate::rng::Rng;
use crate::trace::{DecisionInput, Event, RunStatus, Surface, Trace};
use crate::trust::{Evidence, MAX_PENDING, Report, Source, Trust};
use crate::verifier::Judgement;

/// Everything a controller is built from.
///
/// The default uses [`BudgetLimits::defaults`], not `Amounts::default()` (all zeros): a zero
/// latency budget would stop every run at its first observation.
#[derive(Debug, Clone)]
pub struct ControllerConfig {
    /// Monitor thresholds.
    pub monitor: MonitorConfig,
    /// Classifier thresholds.
    pub classifier: ClassifierConfig,
    /// Recovery policy.
    pub policy: Policy,
    /// Budget limits of the run.
    pub budget: BudgetLimits,
    /// Trace capacity in events (`0` means the default, 4096).
    pub trace_capacity: usize,
    /// What the front-end has learned of its sources so far ([`Trust`](crate::Trust)): the run
    /// starts from a copy, adds what it sees, and reports that evidence back
    /// ([`Controller::take_trust_reports`]). Empty: every source stands at the policy's prior.
    pub trust: Trust,
}

impl Default for ControllerConfig {
    fn default() -> Self {
        ControllerConfig {
            monitor: MonitorConfig::default(),
            classifier: ClassifierConfig::default(),
            policy: Policy::default(),
            budget: BudgetLimits::defaults(),
            trace_capacity: 0,
            trust: Trust::new(),
        }
    }
}

/// What the data plane reports.
#[derive(Debug, Clone)]
pub enum Observation<'a> {
    /// A tool call finished (successfully or not).
    ToolFinished {
        /// The plan step, if the caller has steps.
        step: Option<u32>,
        /// The call.
        call: ToolCall<'a>,
        /// A signal the data plane detected beyond what the monitor sees (timeout, stale data,
        /// contradiction, schema drift...). Takes precedence over the monitor's hard/soft reading.
        signal: Option<Signal>,
        /// What recovery is possible if this failed.
        options: Options,
        /// Usage the call incurred (latency, cost), charged whether it failed or not.
        usage: Amounts,
    },
    /// A model call finished; `signal` is set when it failed (429, refusal, malformed call...).
    ModelFinished {
        /// The plan step, if any.
        step: Option<u32>,
        /// The failure signal, if it failed.
        signal: Option<Signal>,
        /// What recovery is possible.
        options: Options,
        /// Usage (latency, tokens).
        usage: Amounts,
    },
    /// A verifier judged a result.
    Verified {
        /// The plan step, if any.
        step: Option<u32>,
        /// The verifier's name.
        verifier: &'a str,
        /// Its judgement.
        judgement: Judgement,
        /// What recovery is possible if it rejected.
        options: Options,
    },
}

/// What the data plane must do next.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "directive", rename_all = "snake_case")]
pub enum Directive {
    /// Go on: call the model with this guidance, offering every tool but the hidden ones.
    Continue {
        /// Guidance for the next prompt.
        guidance: Vec<Guidance>,
        /// Tools not to offer.
        hidden_tools: Vec<String>,
    },
    /// Recover from a failure with this action.
    Recover {
        /// The step concerned.
        step: Option<u32>,
        /// The inferred class.
        class: FailureClass,
        /// The action to perform.
        action: RecoveryAction,
    },
    /// Stop with a partial result and this report.
    Degrade {
        /// Why.
        reason: String,
    },
    /// Stop now.
    Abort {
        /// Why.
        reason: String,
    },
}

/// A failure that was never recovered.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Unresolved {
    /// The step.
    pub step: Option<u32>,
    /// Its class.
    pub class: FailureClass,
    /// The tool involved, if any.
    pub tool: Option<String>,
}

/// The typed result of a run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RunOutcome {
    /// Complete, partial or failed.
    pub status: RunStatus,
    /// Why, when not complete.
    pub reason: Option<String>,
    /// Failures left unresolved.
    pub unresolved: Vec<Unresolved>,
    /// Recovery actions taken, by kind.
    pub actions: Vec<(ActionKind, u64)>,
    /// What was spent.
    pub spent: Amounts,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct OpenFailure {
    step: Option<u32>,
    class: FailureClass,
    tool: Option<String>,
    ladder: LadderState,
    /// The last recovery action taken for it: the value it recovers is in doubt until verified
    /// ([`Policy::in_doubt`]).
    last_action: Option<ActionKind>,
    /// The tool the last action substituted for the failing one: its output is the recovery's.
    alternative: Option<String>,
    /// The signal that opened it and the streak it came with: a value rebuilt from the failed
    /// answer that no verifier confirms sends the failure up its ladder again as this signal.
    signal: Signal,
    consecutive: u32,
    /// How many times its recovered value was read and checked again because a check could
    /// not judge it ([`Policy::check_again`]).
    #[serde(default)]
    rechecks: u32,
    /// The wait the failure's source asked for (`Retry-After`), honoured before a recheck.
    #[serde(default)]
    retry_after_ms: Option<u64>,
}

const MAX_UNRESOLVED: usize = 64;

/// A cross-check on one step: the value's source, the second source it was checked against,
/// and a fingerprint of the value checked (see `Controller::disputes`, `Controller::agreements`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Pairing {
    step: Option<u32>,
    tool: String,
    other: String,
    value: u64,
}

/// A fingerprint of `v` (FNV-1a over its JSON text): equal values, equal fingerprints.
fn fingerprint(v: &Value) -> u64 {
    v.to_string().bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// Pushes `item` onto `list`, dropping the oldest past [`MAX_CONTESTED`].
fn push_bounded<T>(list: &mut Vec<T>, item: T) {
    if list.len() == MAX_CONTESTED {
        list.remove(0);
    }
    list.push(item);
}

/// How a front-end knows a run's steps, which decides which failures a later success can be
/// seen to settle ([`Controller::unclaimable`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StepsBy {
    /// By the plan (in-process): every failure counts; a model-side one is settled by its
    /// step's next good call.
    Plan,
    /// By tool (the gateway's wire, which sees calls, not the plan): a model-side failure (a
    /// repeated call, a wrong tool, bad arguments) does not count, because the model's next good
    /// call that settles it in-process — of whichever tool — is one such a front-end cannot tie
    /// to it.
    Tool,
}

/// The control loop of one run.
///
/// Serialises its state only (see [`crate::run::Run::snapshot`]): the classifier and the policy
/// are configuration and come back with `Controller::reattach`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Controller {
    monitor: Monitor,
    /// The policy and the classifier: configuration, not state.
    #[serde(skip)]
    plane: Plane,
    ledger: BudgetLedger,
    trace: Trace,
    open: Option<OpenFailure>,
    /// The failure the last observation resolved by a success, if it did: a verifier's rejection
    /// of that very output reopens it (see [`Controller::observe`]).
    just_resolved: Option<OpenFailure>,
    unresolved: Vec<Unresolved>,
    unresolved_dropped: u64,
    /// Recovery actions taken, by kind (a map, not an array indexed by `as usize`: a new kind
    /// needs no slot).
    actions: std::collections::BTreeMap<ActionKind, u64>,
    stopped: Option<(RunStatus, String)>,
    /// Whether [`Controller::reread_due`] has said yes.
    reread: bool,
    /// Steps whose value a verifier has accepted in this run (a cross-check that agreed, a
    /// second reading that matched), at most [`MAX_CONTESTED`]: confirmed values.
    #[serde(default)]
    confirmed: Vec<Option<u32>>,
    /// Confirmed steps whose value a verifier rejected during the read before answering
    /// (after [`Controller::reread_due`] said yes), at most [`MAX_CONTESTED`]: a confirmed value
    /// that changed when read again is not replaced by whatever the retry brings — that value
    /// has nothing that checks it — so the run claims nothing over it (see
    /// [`Controller::claim_refused`]) until a verifier other than the re-read accepts that step.
    #[serde(default)]
    contested: Vec<Option<u32>>,
    /// Of the `contested` steps, those whose value a verifier had confirmed before it changed.
    /// Any other contested step — a value nothing had confirmed, that read differently before
    /// answering — is settled by a third reading that agrees with either of the two
    /// ([`THIRD_READ_VERIFIER`]: two readings of three decide); a confirmed one only by a
    /// verifier other than reading its source again.
    #[serde(default)]
    contested_confirmed: Vec<Option<u32>>,
    /// Tools whose failures were routed around (see [`Controller::offer`]), at most
    /// [`MAX_ROUTED`]: their failures are the monitor's until one of their calls succeeds.
    routed: Vec<String>,
    /// Failures routed around whose step has not had a value since, at most [`MAX_ROUTED`]
    /// (issue 30): the value a later attempt brings on that step — the same tool again or
    /// another the agent chose — is a recovered value, held to the check a recovered value gets
    /// ([`Policy::in_doubt`], the read before answering), not claimed as a first-try one.
    #[serde(default)]
    routed_open: Vec<OpenFailure>,
    /// Whether a step whose failure was routed around had a value since: a recovery, for
    /// [`Controller::reread_due`] and [`Controller::claim_refused`], like one the ladder made.
    #[serde(default)]
    routed_recovered: bool,
    /// The run's copy of the front-end's trust store, with this run's evidence added. Not
    /// part of a snapshot: a resumed run reads the resuming process's store, covered by
    /// `own_trust` ([`Controller::reattach`]) — a store shared by replicas holds each
    /// replica's trust once, not a copy of up to [`crate::trust::MAX_SOURCES`] sources in every
    /// run.
    #[serde(skip)]
    trust: Trust,
    /// This run's own evidence only (the sources it saw): what its snapshot carries of trust.
    #[serde(default)]
    own_trust: Trust,
    /// Evidence this run saw, not yet taken by the front-end (at most [`MAX_PENDING`]).
    #[serde(default)]
    trust_reports: Vec<Report>,
    /// The tool of the last call on each step seen (at most [`MAX_CONTESTED`]): the source of
    /// the value a verdict on that step judges.
    #[serde(default)]
    step_tools: Vec<(Option<u32>, String)>,
    /// A fingerprint of the value last returned on each step seen (at most [`MAX_CONTESTED`]):
    /// which side of a disagreement changed its value, and whether a rejected value is the
    /// one two sources had agreed on.
    #[serde(default)]
    step_values: Vec<(Option<u32>, u64)>,
    /// Cross-checks that disagreed and are not settled yet (at most [`MAX_CONTESTED`]): each
    /// side took half the blame; a later agreement on the step says which side was wrong.
    #[serde(default)]
    disputes: Vec<Pairing>,
    /// Cross-checks that agreed (at most [`MAX_CONTESTED`]): a later rejection of the same
    /// value takes the agreement back from both sides.
    #[serde(default)]
    agreements: Vec<Pairing>,
    /// Tools whose last call failed for want of an answer (an outage), at most [`MAX_ROUTED`]:
    /// their next answer ends the outage.
    #[serde(default)]
    down: Vec<String>,
    /// Decision records not yet taken by the front-end ([`Controller::take_decisions`]); not
    /// state: a resumed run starts with none.
    #[serde(skip)]
    outbox: Vec<(u64, Event)>,
}

/// Most decision records the outbox holds; older ones are dropped (they are in the trace).
pub(crate) const MAX_OUTBOX: usize = 256;

/// Most tools a run keeps routed around at once (see [`Controller::offer`]).
const MAX_ROUTED: usize = 64;

/// Most steps a run keeps confirmed or contested (see `Controller::contested`); a run with
/// more contested ones claims nothing anyway.
const MAX_CONTESTED: usize = 64;

/// The verifier name of the read before answering ([`Controller::reread_due`]): its acceptance
/// of a value that already changed once is not an independent confirmation.
pub const REREAD_VERIFIER: &str = "re_read";

/// The verifier name a front-end gives a third reading of a value that changed when read
/// before answering, reporting that it agrees with one of the two earlier readings: the tie
/// between them is broken, two readings of three agreeing. It settles a value nothing had
/// confirmed; a confirmed value is never replaced so (see `Controller::contested`).
pub const THIRD_READ_VERIFIER: &str = "third_read";

/// The verifier name of a cross-check against a second source (the one named in the
/// observation's `options.substitute`): its verdict is evidence about both sources
/// ([`crate::Trust`]); another verifier's is about the value's own source only.
pub const CROSS_CHECK_VERIFIER: &str = "cross_check";

/// Whether a failure of `class` may be routed around: the tool produced nothing usable (it
/// timed out, was unavailable, answered empty or unreadable), so another tool of the agent's
/// choosing loses nothing. So may the model's own bad arguments (a path that does not exist):
/// its ladder (a rewrite, a re-plan) hands the model the precise error, and once that is used
/// up the run does not end over the model's mistakes while other tools are on offer — the
/// seeds' rules take over (warned at 3, the tool hidden at 5, a stop only on the failure rate),
/// as for a failing tool. With nothing else on offer the ladder's end stands. A failure about a
/// value the tool did give (stale, contradicted, rejected) is not routable: the policy's end of
/// the ladder degrades rather than guess; nor are the model's other mistakes (a wrong tool, a
/// loop, a plan), whose ladders end in a re-plan or a stop of their own.
fn routable(class: FailureClass) -> bool {
    match class {
        FailureClass::ToolTimeout
        | FailureClass::ToolUnavailable
        | FailureClass::EmptyOutput
        | FailureClass::MalformedOutput
        | FailureClass::ArgumentInvalid => true,
        FailureClass::WrongTool
        | FailureClass::StaleContext
        | FailureClass::ContradictoryEvidence
        | FailureClass::PlanningFailure
        | FailureClass::VerificationFailure
        | FailureClass::ControlLoop => false,
    }
}

impl Default for Controller {
    /// A controller with [`ControllerConfig::default`] (valid by construction).
    fn default() -> Self {
        Controller::with_monitor(ControllerConfig::default(), Monitor::default())
    }
}

impl Controller {
    /// A controller for a new run.
    pub fn new(config: ControllerConfig) -> Result<Self, ConfigError> {
        config
            .policy
            .validate()
            .map_err(|e| ConfigError(e.to_string()))?;
        let monitor = Monitor::new(config.monitor.clone())?;
        Ok(Controller::with_monitor(config, monitor))
    }

    fn with_monitor(config: ControllerConfig, monitor: Monitor) -> Controller {
        Controller {
            monitor,
            plane: Plane {
                policy: config.policy,
                classifier: Classifier::new(config.classifier),
            },
            ledger: BudgetLedger::new(config.budget),
            trace: Trace::with_capacity(if config.trace_capacity == 0 {
                4096
            } else {
                config.trace_capacity
            }),
            open: None,
            just_resolved: None,
            unresolved: Vec::new(),
            unresolved_dropped: 0,
            actions: std::collections::BTreeMap::new(),
            stopped: None,
            reread: false,
            confirmed: Vec::new(),
            contested: Vec::new(),
            contested_confirmed: Vec::new(),
            routed: Vec::new(),
            routed_open: Vec::new(),
            routed_recovered: false,
            trust: config.trust,
            own_trust: Trust::new(),
            trust_reports: Vec::new(),
            step_tools: Vec::new(),
            step_values: Vec::new(),
            disputes: Vec::new(),
            agreements: Vec::new(),
            down: Vec::new(),
            outbox: Vec::new(),
        }
    }

    /// Gives a controller read back from a snapshot its configuration: the classifier, the
    /// policy (validated) and the monitor's thresholds. The budget limits and the trace's
    /// capacity stay the snapshot's: they are the run's, fixed when it began.
    pub(crate) fn reattach(&mut self, config: ControllerConfig) -> Result<(), ConfigError> {
        config
            .policy
            .validate()
            .map_err(|e| ConfigError(e.to_string()))?;
        Monitor::new(config.monitor.clone())?;
        self.monitor.reattach(config.monitor);
        // The resuming process's trust, each source at least where this run's own evidence
        // put it: that evidence is in the process's store already when this process (or, once
        // shared, another) saw it, and is then not counted twice.
        self.trust = config.trust;
        self.trust.cover(&self.own_trust, &config.policy.trust);
        self.plane = Plane {
            policy: config.policy,
            classifier: Classifier::new(config.classifier),
        };
        Ok(())
    }

    /// Writes `event` to the run's trace (a call plan's decision records).
    pub(crate) fn record(&mut self, now_ms: u64, event: Event) {
        self.log(now_ms, None, event);
    }

    /// Writes `event` to the trace and, when it is a decision (a signal, its class, an action,
    /// a tool routed around), to the outbox a front-end drains into its own trace
    /// ([`Controller::take_decisions`]).
    fn log(&mut self, now_ms: u64, step: Option<u32>, event: Event) {
        if matches!(
            event,
            Event::Signal { .. }
                | Event::Classified { .. }
                | Event::Action { .. }
                | Event::RoutedAround { .. }
                | Event::BudgetExhausted { .. }
                | Event::AskAgain { .. }
        ) {
            if self.outbox.len() == MAX_OUTBOX {
                self.outbox.remove(0);
            }
            self.outbox.push((now_ms, event.clone()));
        }
        self.trace.push(now_ms, step, event);
    }

    /// The decisions recorded since the last call, with their times, oldest first (at most
    /// [`MAX_OUTBOX`]): for a front-end whose own trace is where decisions are kept (the
    /// gateway's SQLite sink), so `selfheal trace replay` can decide them again.
    pub(crate) fn take_decisions(&mut self) -> Vec<(u64, Event)> {
        std::mem::take(&mut self.outbox)
    }

    /// A new turn of the task begins (see [`Monitor::user_turn`]).
    pub(crate) fn user_turn(&mut self) {
        self.monitor.user_turn();
    }

    /// The monitor's verdict now.
    pub(crate) fn verdict(&mut self, now_ms: u64) -> crate::monitor::Verdict {
        self.monitor.check(now_ms)
    }

    /// How the run was stopped, if it was.
    pub(crate) fn stopped(&self) -> Option<RunStatus> {
        self.stopped.as_ref().map(|(s, _)| *s)
    }

    /// How and why the run was stopped, if it was.
    pub(crate) fn stop_reason(&self) -> Option<(RunStatus, &str)> {
        self.stopped.as_ref().map(|(s, r)| (*s, r.as_str()))
    }

    /// The policy and classifier the run decides with, beside the ledger its decisions charge.
    /// Records spending that happened outside this copy of the run (another replica's copy,
    /// re-applied on a fresher state): always recorded, never refused, as usage already spent.
    pub(crate) fn add_spent(&mut self, spent: &Amounts) {
        let _ = self.ledger.record_usage(spent);
    }

    pub(crate) fn plane_and_ledger(&mut self) -> (&Plane, &mut BudgetLedger) {
        (&self.plane, &mut self.ledger)
    }

    /// Tells the run which tools the agent is offered now (before anything is hidden).
    ///
    /// This is what makes the seeds' monitor rule hold for an agent that picks its own tools
    /// (SPEC §1): when a tool's failure has used up its class's ladder and another tool on
    /// offer is still usable, the run does not end. The failure is *routed around* — the
    /// directive is `Continue` with the monitor's verdict — and from then on that tool's
    /// failures are the monitor's: a warning naming the alternatives at 3 in a row, the
    /// circuit opened and the tool hidden at 5, and the run stopped only by the failure-rate
    /// rule or when nothing is left (no alternative on offer, so the ladder's end stands).
    /// A front-end that never offers tools (a plan with fixed steps) keeps the ladder's end.
    pub fn offer<'a>(&mut self, tools: impl IntoIterator<Item = &'a str>) {
        self.monitor.offer(tools);
    }

    /// The tools whose failures are routed around now (see [`Controller::offer`]).
    pub fn routed(&self) -> &[String] {
        &self.routed
    }

    /// The run's trace.
    pub fn trace(&self) -> &Trace {
        &self.trace
    }

    /// The run's budget ledger.
    pub fn ledger(&self) -> &BudgetLedger {
        &self.ledger
    }

    /// The run's budget ledger, for a front-end that also charges attempts the controller does
    /// not route (the gateway's upstream call plans): one ledger per run, whoever spends it.
    pub fn ledger_mut(&mut self) -> &mut BudgetLedger {
        &mut self.ledger
    }

    /// The run's monitor.
    pub fn monitor(&self) -> &Monitor {
        &self.monitor
    }

    /// The run's monitor, for a front-end that reads its verdict (guidance, hidden tools, the
    /// abort rule of [`crate::call::abort_now`]) without stopping the run.
    pub fn monitor_mut(&mut self) -> &mut Monitor {
        &mut self.monitor
    }

    /// Steps whose value changed when read again before answering, and that nothing has
    /// settled since (see [`Controller::claim_refused`]). A front-end that retries such a step
    /// may report, as a verifier's acceptance, that the retry brought back the value first
    /// read (the change did not last), or — [`THIRD_READ_VERIFIER`] — that it agrees with the
    /// differing reading; the second settles only a value no verifier had confirmed.
    pub fn contested(&self) -> &[Option<u32>] {
        &self.contested
    }

    /// Failures still unresolved.
    pub fn unresolved(&self) -> &[Unresolved] {
        &self.unresolved
    }

    /// Whether a failure is currently being recovered.
    pub fn recovering(&self) -> bool {
        self.open.is_some()
    }

    /// The failures [`Controller::finish`] would report unresolved if the run ended now — the
    /// unresolved ones and the one open — without ending it: for a front-end that holds an
    /// answer while the run may go on (the gateway, which never sees the end of a
    /// conversation). Empty when `finish` would find nothing unresolved.
    pub fn unsettled(&self) -> Vec<Unresolved> {
        let mut out = self.unresolved.clone();
        if let Some(o) = &self.open {
            out.push(Unresolved {
                step: o.step,
                class: o.class,
                tool: o.tool.clone(),
            });
        }
        out
    }

    /// Why a final answer given now may not be claimed complete, if it may not: a failure still
    /// unsettled ([`Controller::unsettled`]) that a front-end knowing its steps `by` could see
    /// settled — [`Controller::finish`] would report the run `partial` over it — or a recovery
    /// under a policy that claims nothing after one ([`Controller::claim_refused`]). For a
    /// front-end that answers while the run goes on (the gateway): it flags such an answer
    /// `partial` with this reason.
    pub fn unclaimable(&self, by: StepsBy) -> Option<String> {
        let open: Vec<String> = self
            .unsettled()
            .into_iter()
            .filter(|u| by == StepsBy::Plan || !u.class.is_model_side())
            .map(|u| match u.tool {
                Some(t) => format!("`{t}` ({})", u.class),
                None => u.class.to_string(),
            })
            .collect();
        if !open.is_empty() {
            return Some(format!("unresolved: {}", open.join(", ")));
        }
        self.claim_refused()
    }

    /// Whether a recovery action (one that is not terminal) was carried out in this run.
    fn recovered(&self) -> bool {
        self.routed_recovered || self.actions.keys().any(|k| !k.is_terminal())
    }

    /// Records a recovery a front-end decided for this run outside [`Controller::observe`] —
    /// a re-ask of a model answer whose tool calls could not be used
    /// (`reask_signal`, decided and charged against this run's ledger) — so that
    /// what the run's judgements ask of a recovered run ([`Controller::claim_refused`],
    /// [`Controller::reread_due`]) and its report count it as they count the controller's own.
    /// Charges nothing: the decision was charged when it was made.
    pub fn carried_out(&mut self, action: &RecoveryAction) {
        *self.actions.entry(action.kind()).or_insert(0) += 1;
    }

    /// Why the run's answer may not be claimed complete, when the policy says so: a recovery
    /// was carried out and the policy claims nothing after one (`claim_after_recovery = false`).
    /// [`Controller::finish`] ends such a run `partial`; a front-end that answers while the run
    /// goes on (the gateway) flags its answer the same way. The rule is
    /// [`Policy::claim_refused`].
    ///
    /// It is also refused when a confirmed value (one a verifier had accepted) changed as it was
    /// read before answering (issue 33): the source turned bad after it was confirmed, and the
    /// value a retry brings has nothing that checks it. A confirmed value is never replaced by
    /// an unverifiable one and claimed; the run ends `partial` with the step named, unless a
    /// verifier other than the re-read accepted it since.
    pub fn claim_refused(&self) -> Option<String> {
        if let Some(step) = self.contested.first() {
            let why = if self.contested_confirmed.contains(step) {
                "nothing independent confirms either reading"
            } else {
                "no third reading agrees with either"
            };
            return Some(format!(
                "the value at step {} changed when read again before answering, and {why}",
                step.map_or_else(|| "-".to_owned(), |s| s.to_string())
            ));
        }
        self.plane.policy.claim_refused(self.recovered())
    }

    /// Asked once the run has its answer: whether to read once more, before answering, each
    /// value no second source confirmed ([`Policy::reread_after_recovery`]). Yes at most once
    /// per run, only when the policy asks for it, the run carried out a recovery and nothing
    /// stopped it. The front-end makes the reads (real, charged calls) and reports each as an
    /// [`Observation::Verified`]; a value that changed is a rejection of its step, whose
    /// directive the front-end carries out as any other.
    pub fn reread_due(&mut self) -> bool {
        let due = self.plane.policy.reread_due(self.recovered())
            && !self.reread
            && self.stopped.is_none();
        self.reread |= due;
        due
    }

    /// How many times the re-read before answering reads each value
    /// ([`Policy::reread_reads`]); the first read that differs ends it.
    pub fn reread_reads(&self) -> u32 {
        self.plane.policy.reread_count()
    }

    /// The run's copy of the trust store, with this run's evidence in it.
    pub fn trust(&self) -> &Trust {
        &self.trust
    }

    /// The evidence this run saw since the last call, oldest first, for the front-end to apply
    /// to the store it keeps across runs ([`Trust::apply`]).
    pub fn take_trust_reports(&mut self) -> Vec<Report> {
        std::mem::take(&mut self.trust_reports)
    }

    /// Records evidence about the tool `name` at `now_ms`: in the run's copy at once (later
    /// decisions of this run read it) and for the front-end's store.
    fn evidence(&mut self, name: &str, evidence: Evidence, now_ms: u64) {
        let source = Source::tool(name);
        self.trust
            .observe(&source, evidence, now_ms, &self.plane.policy.trust);
        self.own_trust
            .observe(&source, evidence, now_ms, &self.plane.policy.trust);
        if self.trust_reports.len() == MAX_PENDING {
            self.trust_reports.remove(0);
        }
        self.trust_reports.push(Report {
            source,
            evidence,
            at_ms: now_ms,
        });
    }

    /// The evidence a finished call of `tool` gives, given the signal it raised (`None`: it
    /// answered well) and the second source a cross-check read (`other`). An outage is evidence
    /// about the tool's availability only, never about another source.
    fn call_evidence(
        &mut self,
        step: Option<u32>,
        tool: &str,
        signal: Option<&Signal>,
        other: Option<&str>,
        now_ms: u64,
    ) {
        match signal {
            None => {
                if let Some(i) = self.down.iter().position(|t| t == tool) {
                    self.down.remove(i);
                    self.evidence(tool, Evidence::OutageEnded, now_ms);
                }
            }
            Some(Signal::Contradiction { .. }) => {
                self.evidence(tool, Evidence::Disagreed, now_ms);
                if let Some(o) = other.filter(|o| *o != tool) {
                    self.evidence(o, Evidence::Disagreed, now_ms);
                    self.dispute(step, tool, o);
                }
            }
            Some(
                Signal::MalformedOutput { .. }
                | Signal::TruncatedOutput
                | Signal::SchemaDrift { .. }
                | Signal::EmptyOutput
                | Signal::Stale { .. },
            ) => self.evidence(tool, Evidence::ContractBreach, now_ms),
            Some(Signal::HttpStatus { status, .. })
                if !(*status >= 500 || matches!(*status, 408 | 429)) => {}
            Some(
                Signal::Timeout
                | Signal::Exception { .. }
                | Signal::HttpStatus { .. }
                | Signal::Unavailable { .. }
                | Signal::ToolError { .. },
            ) => {
                if !self.down.iter().any(|t| t == tool) && self.down.len() < MAX_ROUTED {
                    self.down.push(tool.to_owned());
                }
                self.evidence(tool, Evidence::Outage, now_ms);
            }
            Some(_) => {}
        }
    }

    /// The tool whose value a verdict on `step` judges: the last one called on that step.
    fn step_tool(&self, step: Option<u32>) -> Option<&str> {
        self.step_tools
            .iter()
            .find(|(s, _)| *s == step)
            .map(|(_, t)| t.as_str())
    }

    /// The evidence a verifier's judgement of the value at `step` gives. A cross-check
    /// ([`CROSS_CHECK_VERIFIER`], reading the second source `other`) that agreed speaks for both sources; one
    /// that disagreed blames each by half. A re-read that differed says the value did not
    /// last; one that agreed says nothing of its being right.
    fn verdict_evidence(
        &mut self,
        step: Option<u32>,
        verifier: &str,
        judgement: &Judgement,
        other: Option<&str>,
        now_ms: u64,
    ) {
        let Some(tool) = self.step_tool(step).map(str::to_owned) else {
            return;
        };
        let other = other
            .filter(|o| *o != tool && verifier == CROSS_CHECK_VERIFIER)
            .map(str::to_owned);
        // A read of the same source again (the read before answering, or the third reading
        // that breaks a tie) that agrees says nothing of the value's being right.
        let reread = verifier == REREAD_VERIFIER || verifier == THIRD_READ_VERIFIER;
        match judgement {
            Judgement::Accept if reread => {}
            Judgement::Accept => {
                self.evidence(&tool, Evidence::Accepted, now_ms);
                if let Some(o) = other {
                    self.evidence(&o, Evidence::Agreed, now_ms);
                    self.settle_dispute(step, &tool, &o, now_ms);
                    if let Some(value) = self.step_value(step) {
                        self.agreements.retain(|a| a.step != step);
                        push_bounded(
                            &mut self.agreements,
                            Pairing {
                                step,
                                tool: tool.clone(),
                                other: o,
                                value,
                            },
                        );
                    }
                }
            }
            Judgement::Reject { .. } if reread => {
                self.evidence(&tool, Evidence::ChangedOnReread, now_ms);
            }
            Judgement::Reject { .. } => match other {
                Some(o) => {
                    self.evidence(&tool, Evidence::Disagreed, now_ms);
                    self.evidence(&o, Evidence::Disagreed, now_ms);
                    self.dispute(step, &tool, &o);
                }
                None => {
                    // A value two sources had agreed on, rejected now: both gave it, neither
                    // keeps the trust the agreement earned.
                    let value = self.step_value(step);
                    let agreed = self
                        .agreements
                        .iter()
                        .position(|a| a.step == step && a.tool == tool && Some(a.value) == value)
                        .map(|i| self.agreements.remove(i));
                    match agreed {
                        Some(a) => {
                            self.evidence(&a.tool, Evidence::AgreedWrongly, now_ms);
                            self.evidence(&a.other, Evidence::AgreedWrongly, now_ms);
                        }
                        None => self.evidence(&tool, Evidence::Rejected, now_ms),
                    }
                }
            },
            Judgement::Uncertain { .. } => {}
        }
    }

    /// The fingerprint of the value last returned on `step`.
    fn step_value(&self, step: Option<u32>) -> Option<u64> {
        self.step_values
            .iter()
            .find(|(s, _)| *s == step)
            .map(|(_, v)| *v)
    }

    /// Remembers `value` (a fingerprint) as the value last returned on `step`.
    fn note_step_value(&mut self, step: Option<u32>, value: u64) {
        if let Some(e) = self.step_values.iter_mut().find(|(s, _)| *s == step) {
            e.1 = value;
        } else {
            push_bounded(&mut self.step_values, (step, value));
        }
    }

    /// Records a disagreement between `tool`'s value on `step` and `other`'s, each side having
    /// taken half the blame ([`Evidence::Disagreed`]).
    fn dispute(&mut self, step: Option<u32>, tool: &str, other: &str) {
        let Some(value) = self.step_value(step) else {
            return;
        };
        self.disputes
            .retain(|d| !(d.step == step && d.tool == tool && d.other == other));
        push_bounded(
            &mut self.disputes,
            Pairing {
                step,
                tool: tool.to_owned(),
                other: other.to_owned(),
                value,
            },
        );
    }

    /// A cross-check of `tool`'s value on `step` against `other` agreed: a disagreement of the
    /// two on that step is settled. The side whose value changed to agree was the wrong one —
    /// `tool`, when the value it gives now is not the one it gave then; else `other` — and
    /// the half-blame moves to it ([`Evidence::Convicted`], [`Evidence::Vindicated`]): a
    /// source that was right is not marked by a disagreement the evidence has since settled.
    fn settle_dispute(&mut self, step: Option<u32>, tool: &str, other: &str, now_ms: u64) {
        let Some(i) = self
            .disputes
            .iter()
            .position(|d| d.step == step && d.tool == tool && d.other == other)
        else {
            return;
        };
        let d = self.disputes.remove(i);
        let (wrong, right) = if self.step_value(step) == Some(d.value) {
            (other, tool)
        } else {
            (tool, other)
        };
        self.evidence(wrong, Evidence::Convicted, now_ms);
        self.evidence(right, Evidence::Vindicated, now_ms);
    }

    /// Whether a recovered value no verifier could judge is claimed: the policy's override, or
    /// its risk against the trust the value's source has earned
    /// ([`Policy::claims_unverified`]). The source is the substitute a substitution went to,
    /// else the tool last called on the step, else the failed tool.
    fn claims_unverified(&self, o: &OpenFailure, now_ms: u64) -> bool {
        let source = match (o.last_action, &o.alternative) {
            (Some(ActionKind::Substitute), Some(alt)) => Some(alt.as_str()),
            _ => self.step_tool(o.step).or(o.tool.as_deref()),
        };
        let policy = &self.plane.policy;
        let p = source.map(|s| self.trust.p_right(&Source::tool(s), now_ms, &policy.trust));
        policy.claims_unverified(p)
    }

    /// Whether the failure open on `step` is having its recovered value read again
    /// ([`Controller::check_again`]).
    fn rechecking(&self, step: Option<u32>) -> bool {
        self.open
            .as_ref()
            .is_some_and(|o| o.step == step && o.rechecks > 0)
    }

    /// Reads a recovered value again and checks it again ([`Policy::check_again`]) after a
    /// check could not judge it: the failure `o` that recovered it is opened again with the
    /// re-read as its next action, charged like any retry. `None` when the policy or the
    /// budget allows no more.
    fn check_again(
        &mut self,
        now_ms: u64,
        step: Option<u32>,
        o: OpenFailure,
        options: &Options,
        rng: &mut dyn Rng,
    ) -> Option<Directive> {
        let decision = self.plane.policy.check_again(
            o.ladder,
            o.rechecks,
            o.retry_after_ms,
            options,
            &self.ledger,
            rng,
        )?;
        let before = self.ledger.remaining();
        self.ledger.charge(&decision.charge).ok()?;
        let after = self.ledger.remaining();
        let kind = decision.action.kind();
        *self.actions.entry(kind).or_insert(0) += 1;
        self.trace.healing.healed += 1;
        self.log(
            now_ms,
            step,
            Event::Action {
                class: o.class,
                action: decision.action.clone(),
                rung: None,
                budget_before: before,
                budget_after: after,
                input: None,
            },
        );
        let class = o.class;
        self.open = Some(OpenFailure {
            ladder: decision.next,
            rechecks: o.rechecks + 1,
            ..o
        });
        Some(Directive::Recover {
            step,
            class,
            action: decision.action,
        })
    }

    /// Remembers `tool` as the source of the value at `step`.
    fn note_step_tool(&mut self, step: Option<u32>, tool: &str) {
        if let Some(e) = self.step_tools.iter_mut().find(|(s, _)| *s == step) {
            tool.clone_into(&mut e.1);
        } else {
            if self.step_tools.len() == MAX_CONTESTED {
                self.step_tools.remove(0);
            }
            self.step_tools.push((step, tool.to_owned()));
        }
    }

    /// Takes one observation and returns the next directive.
    ///
    /// A success resolves the failure open on its step. When the very next observation is a
    /// verifier rejecting that step's output, the success was not one: the failure is reopened and
    /// the rejection climbs its ladder (keeping its retry and action counts), so a call whose
    /// retries keep returning output that fails verification stays bounded by the per-failure cap
    /// instead of starting a fresh ladder with every retry. When it is a verifier that could not
    /// judge a recovered output ([`Policy::in_doubt`]) — the recovered call's, or one the recovery
    /// produced with no call while its failure is still open (a repaired body) — the run degrades
    /// unless the policy [accepts unverified recoveries](Policy::accept_unverified_recovery).
    pub fn observe(&mut self, obs: Observation<'_>, now_ms: u64, rng: &mut dyn Rng) -> Directive {
        if let Some(d) = self.stopped_directive() {
            return d;
        }
        let just_resolved = self.just_resolved.take();
        match obs {
            Observation::ToolFinished {
                step,
                call,
                signal,
                options,
                usage,
            } => {
                self.trace.healing.calls += 1;
                let report = self.monitor.record(&call, now_ms);
                self.trace_monitor(now_ms, step, call.tool, &report);
                let signal = signal.or_else(|| match (report.failure, call.outcome) {
                    (Some(FailureKind::Hard), CallOutcome::Failed { error }) => {
                        Some(Signal::Exception {
                            message: error.to_owned(),
                        })
                    }
                    (Some(FailureKind::Hard), CallOutcome::Returned(_)) => {
                        Some(Signal::Exception {
                            message: String::new(),
                        })
                    }
                    // A body that says why it failed (an invalid argument, a rate limit, the
                    // wrong tool) is read by its text, as a raised error is; an empty body, or
                    // one whose text tells nothing more, is an empty output.
                    (Some(FailureKind::Soft), CallOutcome::Returned(v)) => Some(
                        Monitor::soft_error_text(v)
                            .filter(|m| crate::classifier::message_is_telling(m))
                            .map_or(Signal::EmptyOutput, |m| Signal::ToolError {
                                message: m.to_owned(),
                            }),
                    ),
                    (Some(FailureKind::Soft), CallOutcome::Failed { .. }) => {
                        Some(Signal::EmptyOutput)
                    }
                    // A read the run itself asked for to check a value again
                    // ([`Policy::check_again`]) repeats the call on purpose: not a loop.
                    (None, _)
                        if report.signals.contains(MonitorSignal::Loop)
                            && !self.rechecking(step) =>
                    {
                        Some(Signal::Repetition)
                    }
                    (None, _) => None,
                });
                self.note_step_tool(step, call.tool);
                if let CallOutcome::Returned(v) = call.outcome {
                    self.note_step_value(step, fingerprint(v));
                }
                self.call_evidence(
                    step,
                    call.tool,
                    signal.as_ref(),
                    options.substitute.as_deref(),
                    now_ms,
                );
                self.after(
                    now_ms,
                    step,
                    Some(call.tool),
                    signal,
                    report.consecutive_failures,
                    options,
                    usage,
                    rng,
                )
            }
            Observation::ModelFinished {
                step,
                signal,
                options,
                usage,
            } => {
                // A model call is a call: without it the healing rate's denominator misses every
                // model failure that was healed, and the rate can exceed 1.
                self.trace.healing.calls += 1;
                let consecutive = match &self.open {
                    Some(o) if o.step == step => o.ladder.rung as u32 + 1,
                    _ => 1,
                };
                self.after(now_ms, step, None, signal, consecutive, options, usage, rng)
            }
            Observation::Verified {
                step,
                verifier,
                judgement,
                options,
            } => {
                self.log(
                    now_ms,
                    step,
                    Event::Verdict {
                        verifier: verifier.to_owned(),
                        judgement: judgement.clone(),
                    },
                );
                self.verdict_evidence(
                    step,
                    verifier,
                    &judgement,
                    options.substitute.as_deref(),
                    now_ms,
                );
                if judgement.is_accept() {
                    // An accepted result settles the verification failures of its step, also one
                    // that another failure had pushed aside into the unresolved list.
                    self.unresolved.retain(|u| {
                        !(u.step == step && u.class == FailureClass::VerificationFailure)
                    });
                    // A contested value is settled only by a check other than reading the same
                    // source again; a confirmed one not by a third reading either.
                    if verifier != REREAD_VERIFIER
                        && !(verifier == THIRD_READ_VERIFIER
                            && self.contested_confirmed.contains(&step))
                    {
                        self.contested.retain(|c| *c != step);
                        self.contested_confirmed.retain(|c| *c != step);
                    }
                    if !self.confirmed.contains(&step) && self.confirmed.len() < MAX_CONTESTED {
                        self.confirmed.push(step);
                    }
                } else if matches!(judgement, Judgement::Reject { .. })
                    && self.reread
                    && (self.confirmed.contains(&step) || verifier == REREAD_VERIFIER)
                    && !self.contested.contains(&step)
                    && self.contested.len() < MAX_CONTESTED
                {
                    // A value rejected while the run reads its values again before answering:
                    // one confirmed before turned bad since, and whatever replaces it is
                    // contested. One nothing had confirmed that read differently is a tie
                    // between two readings of one source: the retry's reading must break it
                    // (agree with one of them, [`THIRD_READ_VERIFIER`]) or be checked, else
                    // nothing is claimed over it.
                    self.contested.push(step);
                    if self.confirmed.contains(&step) {
                        self.contested_confirmed.push(step);
                    }
                }
                // A verifier that could not judge a recovered value has not settled it: unless the
                // policy accepts unverified recoveries, the failure stays unresolved and the run
                // degrades instead of returning a guess as correct.
                // The value judged is the recovery's either when the recovered call succeeded just
                // before (`just_resolved`) or when the recovery produced it with no call at all (a
                // repaired output is verified while its failure is still open).
                let recovered = match &self.open {
                    Some(o) if o.step == step => Some(o),
                    Some(_) => None,
                    None => just_resolved.as_ref().filter(|o| o.step == step),
                };
                if let Judgement::Uncertain { reason } = &judgement
                    && let Some(o) = recovered.filter(|o| {
                        Policy::in_doubt(o.class, o.last_action)
                            && !self.claims_unverified(o, now_ms)
                    })
                {
                    let why = format!(
                        "the value recovered from {} at step {} could not be verified ({verifier}: {reason})",
                        o.class,
                        step.map_or_else(|| "-".to_owned(), |s| s.to_string())
                    );
                    let tool = o.tool.clone();
                    // A value rebuilt from the very answer that failed (its failure still open: a
                    // repaired body) carries whatever else was wrong with that answer. It is set
                    // aside and the failure climbs its ladder, where a retry may bring an answer
                    // that passes on its own; the ladder's end degrades.
                    let reopened = self
                        .open
                        .as_ref()
                        .filter(|o| o.step == step)
                        .map(|o| (o.signal.clone(), o.consecutive));
                    if let Some((signal, consecutive)) = reopened {
                        return self.after(
                            now_ms,
                            step,
                            tool.as_deref(),
                            Some(signal),
                            consecutive,
                            options,
                            Amounts::default(),
                            rng,
                        );
                    }
                    // A check that could not judge the value this time (its source did not
                    // answer, sent bytes nothing reads) may judge it on a later read: the value
                    // is read and checked again while the policy and the budget allow, and the
                    // run ends `partial` with the value flagged only when that cannot settle it.
                    let again = o.clone();
                    if let Some(d) = self.check_again(now_ms, step, again, &options, rng) {
                        return d;
                    }
                    self.push_unresolved(step, FailureClass::VerificationFailure, tool);
                    return self.stop(now_ms, RunStatus::Partial, why, true);
                }
                let signal = match judgement {
                    Judgement::Reject { reason } => Some(Signal::VerifierRejected { reason }),
                    Judgement::Accept | Judgement::Uncertain { .. } => None,
                };
                if signal.is_some()
                    && self.open.is_none()
                    && let Some(o) = just_resolved.filter(|o| o.step == step)
                {
                    self.open = Some(o);
                }
                self.after(
                    now_ms,
                    step,
                    None,
                    signal,
                    1,
                    options,
                    Amounts::default(),
                    rng,
                )
            }
        }
    }

    fn trace_monitor(&mut self, now_ms: u64, step: Option<u32>, tool: &str, report: &CallReport) {
        let signals = report
            .signals
            .iter()
            .map(|s| s.as_str().to_owned())
            .collect();
        self.log(
            now_ms,
            step,
            Event::Monitor {
                tool: tool.to_owned(),
                badge: report.badge,
                signals,
            },
        );
    }

    #[allow(clippy::too_many_arguments)]
    fn after(
        &mut self,
        now_ms: u64,
        step: Option<u32>,
        tool: Option<&str>,
        signal: Option<Signal>,
        consecutive: u32,
        options: Options,
        usage: Amounts,
        rng: &mut dyn Rng,
    ) -> Directive {
        if let Some(d) = self.ledger.record_usage(&usage) {
            self.log(now_ms, step, Event::BudgetExhausted { dimension: d });
            if let Some(o) = self.open.take() {
                self.push_unresolved(o.step, o.class, o.tool);
            }
            return self.stop(
                now_ms,
                RunStatus::Partial,
                format!("the {d} budget is spent"),
                true,
            );
        }
        let Some(signal) = signal else {
            if let Some(t) = tool {
                self.routed.retain(|r| r != t);
            }
            // Success: whatever was open on this step is resolved. A success is progress, so the
            // failure-rate abort is not applied here; the next failure is judged on its own.
            if self.open.as_ref().is_some_and(|o| o.step == step) {
                // Only a success of the failing tool itself, or of the substitute the recovery
                // chose, may be taken back by a verifier: another tool's output on the same step
                // is a new attempt with its own ladder.
                self.just_resolved = self.open.take().filter(|o| {
                    o.tool.is_none()
                        || o.tool.as_deref() == tool
                        || (tool.is_some() && o.alternative.as_deref() == tool)
                });
            }
            // A step whose failure was routed around gets its value: whichever tool brought it
            // (the same one again, or another the agent chose), it is the value recovered from
            // that failure, judged as one.
            if let Some(i) = self.routed_open.iter().position(|o| o.step == step) {
                let o = self.routed_open.remove(i);
                self.routed_recovered = true;
                if self.just_resolved.is_none() {
                    let again = tool.is_none() || o.tool.as_deref() == tool;
                    self.just_resolved = Some(OpenFailure {
                        last_action: Some(if again {
                            ActionKind::Retry
                        } else {
                            ActionKind::Substitute
                        }),
                        alternative: if again { None } else { tool.map(str::to_owned) },
                        ..o
                    });
                }
            }
            // A failure of this step that another step's failure pushed aside is settled by
            // the step's success: a replan went back to an earlier step (a skipped one), failed
            // there, recovered, and came back here. Unsettled, it would end a run whose every
            // step succeeded `partial`.
            if step.is_some() {
                self.unresolved.retain(|u| u.step != step);
            }
            let verdict = self.monitor.check(now_ms);
            return Directive::Continue {
                guidance: verdict.guidance,
                hidden_tools: verdict.hidden_tools,
            };
        };
        // A request the receiver refused as such (a 4xx, arguments that failed validation, a
        // tool's error that says nothing transient) gets the same answer if it is sent again
        // unchanged: no resend is offered, whatever the front-end could do. Decided here once,
        // so a front-end only reports what it observed ([`crate::call::resend_futile`]).
        let options = if crate::call::resend_futile(&signal) {
            Options {
                retry_safe: false,
                ..options
            }
        } else {
            options
        };
        self.log(
            now_ms,
            step,
            Event::Signal {
                tool: tool.map(str::to_owned),
                signal: signal.clone(),
            },
        );
        let classification: Classification = self.plane.classifier.classify(
            &signal,
            ClassifyContext {
                consecutive_failures: consecutive,
            },
        );
        self.log(
            now_ms,
            step,
            Event::Classified {
                class: classification.class,
                error_type: classification.error_type,
                retry_after_ms: classification.retry_after_ms,
            },
        );
        // Monitor abort beats recovery of a *new* failure: the run as a whole is not working.
        // While a failure is being recovered, its ladder and the budget bound the attempts, and
        // the failed attempts must not abort the recovery that is about to fix them.
        let recovering_this_step = self.open.as_ref().is_some_and(|o| o.step == step);
        let verdict = self.monitor.check(now_ms);
        if let Some(reason) = verdict
            .abort
            .filter(|_| !(recovering_this_step || self.open.is_none() && self.healed()))
        {
            if let Some(o) = self.open.take() {
                self.push_unresolved(o.step, o.class, o.tool);
            }
            self.push_unresolved(step, classification.class, tool.map(str::to_owned));
            return self.stop(now_ms, RunStatus::Failed, reason, false);
        }
        // A tool already routed around stays the monitor's: its failures climb no ladder.
        if let Some(t) = tool
            && routable(classification.class)
            && self.routed.iter().any(|r| r == t)
        {
            if self.open.as_ref().is_some_and(|o| o.step == step) {
                self.open = None;
            }
            return Directive::Continue {
                guidance: verdict.guidance,
                hidden_tools: verdict.hidden_tools,
            };
        }
        // The same step failing again with the same class climbs its ladder. With a new class it
        // starts the new class's ladder but keeps its retry and action counts, so a failure that
        // changes its face stays bounded by the per-failure cap and the budget.
        let ladder = match &self.open {
            Some(o) if o.step == step && o.class == classification.class => o.ladder,
            Some(o) if o.step == step => LadderState {
                rung: 0,
                retries: o.ladder.retries,
                actions: o.ladder.actions,
            },
            Some(_) | None => LadderState::default(),
        };
        if let Some(o) = self.open.take()
            && o.step != step
        {
            self.push_unresolved(o.step, o.class, o.tool);
        }
        let input = DecisionInput {
            surface: Surface::Controller,
            signal: signal.clone(),
            consecutive,
            ladder,
            options: options.clone(),
            limits: *self.ledger.limits(),
            spent: *self.ledger.spent(),
        };
        let decision =
            self.plane
                .policy
                .decide(ladder, &classification, &options, &self.ledger, rng);
        if decision.action.kind().is_terminal()
            && let Some(t) = tool
            && routable(classification.class)
        {
            let alternatives = self.monitor.alternatives(t);
            if !alternatives.is_empty() {
                // The step stays open for the value a later attempt brings (see
                // `routed_open`); the monitor, not the ladder, bounds the attempts.
                if self.routed_open.len() == MAX_ROUTED {
                    self.routed_open.remove(0);
                }
                self.routed_open.retain(|o| o.step != step);
                self.routed_open.push(OpenFailure {
                    step,
                    class: classification.class,
                    tool: Some(t.to_owned()),
                    ladder,
                    last_action: None,
                    alternative: None,
                    signal: signal.clone(),
                    consecutive,
                    rechecks: 0,
                    retry_after_ms: classification.retry_after_ms,
                });
                let decided = (classification.class, decision.action.clone(), input);
                return self.route_around(now_ms, step, t, alternatives, Some(decided));
            }
        }
        let before = self.ledger.remaining();
        // The policy only picks affordable actions, so this charge cannot fail; if a caller
        // shares the ledger in ways we cannot see, a refused charge degrades.
        if let Err(e) = self.ledger.charge(&decision.charge) {
            self.log(
                now_ms,
                step,
                Event::BudgetExhausted {
                    dimension: e.dimension,
                },
            );
            self.push_unresolved(step, classification.class, tool.map(str::to_owned));
            return self.stop(now_ms, RunStatus::Partial, e.to_string(), true);
        }
        let after = self.ledger.remaining();
        let kind = decision.action.kind();
        *self.actions.entry(kind).or_insert(0) += 1;
        self.log(
            now_ms,
            step,
            Event::Action {
                class: classification.class,
                action: decision.action.clone(),
                rung: decision.rung,
                budget_before: before,
                budget_after: after,
                input: Some(Box::new(input)),
            },
        );
        match decision.action {
            RecoveryAction::Degrade => {
                self.push_unresolved(step, classification.class, tool.map(str::to_owned));
                let reason = format!(
                    "could not recover from {} at step {}: recovery options exhausted",
                    classification.class,
                    step.map_or_else(|| "-".to_owned(), |s| s.to_string())
                );
                self.stop(now_ms, RunStatus::Partial, reason, true)
            }
            RecoveryAction::Terminate => {
                self.push_unresolved(step, classification.class, tool.map(str::to_owned));
                let reason = format!("terminated on {}", classification.class);
                self.stop(now_ms, RunStatus::Failed, reason, false)
            }
            action => {
                self.trace.healing.healed += 1;
                let alternative = if let RecoveryAction::Substitute { alternative } = &action {
                    Some(alternative.clone())
                } else {
                    None
                };
                self.open = Some(OpenFailure {
                    step,
                    class: classification.class,
                    tool: tool.map(str::to_owned),
                    ladder: decision.next,
                    last_action: Some(kind),
                    alternative,
                    signal,
                    consecutive,
                    rechecks: 0,
                    retry_after_ms: classification.retry_after_ms,
                });
                Directive::Recover {
                    step,
                    class: classification.class,
                    action,
                }
            }
        }
    }

    /// Hands `tool`'s failure to the monitor (see [`Controller::offer`]): no ladder stays open
    /// and nothing is unresolved for it, since the agent goes on with `alternatives`, and the
    /// directive is the monitor's verdict. Its step's next value is still a recovered one
    /// (`routed_open`, kept by the caller).
    fn route_around(
        &mut self,
        now_ms: u64,
        step: Option<u32>,
        tool: &str,
        alternatives: Vec<String>,
        decided: Option<(FailureClass, RecoveryAction, DecisionInput)>,
    ) -> Directive {
        let (class, ladder_end, input) = match decided {
            Some((c, a, i)) => (Some(c), Some(a), Some(Box::new(i))),
            None => (None, None, None),
        };
        self.log(
            now_ms,
            step,
            Event::RoutedAround {
                tool: tool.to_owned(),
                alternatives,
                class,
                ladder_end,
                input,
            },
        );
        if !self.routed.iter().any(|r| r == tool) {
            if self.routed.len() == MAX_ROUTED {
                self.routed.remove(0);
            }
            self.routed.push(tool.to_owned());
        }
        let verdict = self.monitor.check(now_ms);
        Directive::Continue {
            guidance: verdict.guidance,
            hidden_tools: verdict.hidden_tools,
        }
    }

    /// Whether every failure the run met so far was healed or is being recovered: none was left
    /// unresolved. The failure-rate rule counts calls, healed failures included; a run whose
    /// every failure was healed is working, and a new failure gets its own ladder (bounded by
    /// the budget) instead of an abort over failures already fixed — as a failure being
    /// recovered is not aborted over its own failed attempts.
    fn healed(&self) -> bool {
        self.unresolved.is_empty() && self.unresolved_dropped == 0
    }

    fn continue_or_abort(&mut self, now_ms: u64) -> Directive {
        let verdict = self.monitor.check(now_ms);
        if let Some(reason) = verdict.abort.filter(|_| !self.healed()) {
            return self.stop(now_ms, RunStatus::Failed, reason, false);
        }
        Directive::Continue {
            guidance: verdict.guidance,
            hidden_tools: verdict.hidden_tools,
        }
    }

    /// The monitor's current guidance and hidden tools, for the next model call.
    pub fn guidance(&mut self, now_ms: u64) -> Directive {
        if let Some(d) = self.stopped_directive() {
            return d;
        }
        self.continue_or_abort(now_ms)
    }

    fn push_unresolved(&mut self, step: Option<u32>, class: FailureClass, tool: Option<String>) {
        if self.unresolved.len() < MAX_UNRESOLVED {
            self.unresolved.push(Unresolved { step, class, tool });
        } else {
            self.unresolved_dropped += 1;
        }
    }

    /// Once stopped, every later question gets the same answer as the stop: a run that ended
    /// partial (it degraded, or [`Controller::finish`] found failures unresolved) keeps saying
    /// `Degrade`; one that failed, or finished complete, says `Abort`.
    fn stopped_directive(&self) -> Option<Directive> {
        self.stopped.as_ref().map(|(status, reason)| {
            let reason = reason.clone();
            if *status == RunStatus::Partial {
                Directive::Degrade { reason }
            } else {
                Directive::Abort { reason }
            }
        })
    }

    fn stop(&mut self, now_ms: u64, status: RunStatus, reason: String, degrade: bool) -> Directive {
        self.log(
            now_ms,
            None,
            Event::Finished {
                status,
                reason: Some(reason.clone()),
            },
        );
        self.stopped = Some((status, reason.clone()));
        if degrade {
            Directive::Degrade { reason }
        } else {
            Directive::Abort { reason }
        }
    }

    /// Ends the run and returns its typed outcome. A run that was not stopped is `complete` when
    /// nothing is unresolved, else `partial`.
    pub fn finish(&mut self, now_ms: u64) -> RunOutcome {
        if let Some(o) = self.open.take() {
            self.push_unresolved(o.step, o.class, o.tool);
        }
        let (status, reason) = match &self.stopped {
            Some((status, reason)) => (*status, Some(reason.clone())),
            None => {
                let (status, reason) = if !self.unresolved.is_empty() {
                    (
                        RunStatus::Partial,
                        Some(format!("{} failure(s) unresolved", self.unresolved.len())),
                    )
                } else if let Some(why) = self.claim_refused() {
                    (RunStatus::Partial, Some(why))
                } else {
                    (RunStatus::Complete, None)
                };
                self.log(
                    now_ms,
                    None,
                    Event::Finished {
                        status,
                        reason: reason.clone(),
                    },
                );
                (status, reason)
            }
        };
        self.stopped = Some((status, reason.clone().unwrap_or_default()));
        RunOutcome {
            status,
            reason,
            unresolved: self.unresolved.clone(),
            actions: self
                .actions
                .iter()
                .filter(|(_, n)| **n > 0)
                .map(|(k, n)| (*k, *n))
                .collect(),
            spent: *self.ledger.spent(),
        }
    }

    /// Budget dimensions that are spent (for reporting).
    pub fn spent_dimensions(&self) -> Vec<Dimension> {
        let rem = self.ledger.remaining();
        Dimension::ALL
            .into_iter()
            .filter(|&d| self.ledger.limits().get(d) != u64::MAX && rem.get(d) == 0)
            .collect()
    }
}
