//! One logical call across its attempts: the decision surface every front-end shares.
//!
//! A front-end sees a call go wrong on the wire — an upstream answers 503, a model's stream
//! breaks, an MCP server's tool times out, a model writes tool arguments that cannot be used.
//! What to do next (wait and send again, fall back to the next model, re-ask, give up and hand
//! the error back) is the same question whoever asks it, so it is answered here, once, by the
//! classifier and the policy ladders, and charged to the run's one [`BudgetLedger`]:
//!
//! ```text
//!   front-end (gateway, MCP proxy, runtime)        this module
//!   ───────────────────────────────────────        ───────────
//!   wire failure ──parse──▶ Signal ──▶ CallPlan::failed ─▶ classify ─▶ policy ladder ─▶ charge
//!        ▲                                                                               │
//!        └──────── Step: Send / Wait-then-send / Stop (rejected | exhausted) ◀───────────┘
//! ```
//!
//! A front-end keeps no retry cap, breaker, fallback rule or "is this retryable?" check of its
//! own: it turns what it read off the wire into a [`Signal`] (the one place per protocol where
//! error text is parsed), carries out the [`Step`] it gets back and records the [`CallEvent`]s.
//! A `--policy` file therefore changes the gateway, the MCP proxy and the benchmark alike.
//!
//! # The rules that are not the ladder's
//! - **A request the upstream refused as the caller's** (HTTP 4xx other than 404, 408, 409, 425
//!   and 429) goes back as it came: no action of any ladder changes the caller's request, so
//!   retrying or falling back would spend budget to get the same refusal. Context-length errors
//!   arrive as [`Signal::ContextLength`], not as a refusal: a larger model may take them.
//! - **Upstream health is not the agent's budget.** A fall-back the ladder wanted but the run's
//!   escalation budget refused is taken anyway (and recorded as usage, so it shows): the budget
//!   governs what the agent spends on its own failures, and a provider outage is not one. A
//!   target whose breaker is open is skipped without a charge, unless it is the last one left.
//!   Likewise a stream the upstream broke before any content is re-issued when the policy
//!   would retry it but the budget refused ([`decide_stream`]).
//! - **Each target gets its own ladder.** Falling back starts the new target's failure at the
//!   ladder's first rung; every attempt on every target is still charged to the one ledger.
//! - **An open circuit is not retried**: when a target's breaker is open, the ladder's retries
//!   are passed over; falling back is still possible.
//! - **Only health failures move a breaker**: transient and persistent unavailability
//!   ([`FailureClass::ToolTimeout`], [`FailureClass::ToolUnavailable`]). A malformed answer or
//!   the caller's own bad request says nothing about whether the upstream is up.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use crate::breaker::{Breaker, BreakerConfig, CircuitState};
use crate::budget::BudgetLedger;
use crate::classifier::{
    Classification, Classifier, ClassifierConfig, ClassifyContext, FailureClass, Signal,
};
use crate::policy::{
    ActionKind, EscalationTarget, LadderState, Options, Policy, PolicyError, RecoveryAction,
    RepairTarget, SkipReason,
};
use crate::rng::Rng;
use crate::trace::{DecisionInput, Event, Surface};

/// The read-only part of the control plane a front-end decides with: the recovery policy and
/// the classifier. Shared by every run of a front-end (an `Arc` in the gateway).
#[derive(Debug, Clone, Default)]
pub struct Plane {
    pub(crate) policy: Policy,
    pub(crate) classifier: Classifier,
}

impl Plane {
    /// A plane from a policy (validated) and the classifier's thresholds.
    pub fn new(policy: Policy, classifier: ClassifierConfig) -> Result<Plane, PolicyError> {
        policy.validate()?;
        Ok(Plane {
            policy,
            classifier: Classifier::new(classifier),
        })
    }

    /// The policy.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// The classifier.
    pub fn classifier(&self) -> &Classifier {
        &self.classifier
    }
}

/// The breakers of named targets (upstreams, tools), one [`Breaker`] each.
///
/// Only the names given at construction are tracked, so the map is bounded by configuration,
/// not by traffic; a name it does not know is always allowed and never recorded.
#[derive(Debug, Clone)]
pub struct Breakers {
    config: BreakerConfig,
    map: HashMap<String, Breaker>,
    /// Attempts recorded, the clock of cooldowns counted in calls.
    calls: u64,
}

impl Breakers {
    /// Breakers for `names`, all closed.
    pub fn new(config: BreakerConfig, names: impl IntoIterator<Item = String>) -> Breakers {
        Breakers {
            config,
            map: names.into_iter().map(|n| (n, Breaker::default())).collect(),
            calls: 0,
        }
    }

    /// Whether `name` may be called now (its circuit is not open after cooling to `now_ms`).
    pub fn allows(&mut self, name: &str, now_ms: u64) -> bool {
        let (config, calls) = (self.config, self.calls);
        match self.map.get_mut(name) {
            Some(b) => {
                b.cool(&config, calls, now_ms);
                !b.is_open()
            }
            None => true,
        }
    }

    /// The circuit of `name` (closed when unknown).
    pub fn state(&self, name: &str) -> CircuitState {
        self.map
            .get(name)
            .map_or(CircuitState::Closed, Breaker::circuit)
    }

    /// Consecutive health failures of `name`.
    pub fn streak(&self, name: &str) -> u32 {
        self.map.get(name).map_or(0, Breaker::streak)
    }

    /// An open circuit of `name` learned from elsewhere (another replica's, shared): a closed
    /// circuit here opens as if at `since_ms`, so that it cools when that one does (by time;
    /// cooldowns in calls count from now), and plans skip it as they skip their own — unless
    /// it is their last target. A circuit open or half-open here is left to its own evidence.
    /// Returns whether it opened.
    pub fn open_elsewhere(&mut self, name: &str, since_ms: u64) -> bool {
        let calls = self.calls;
        self.map
            .get_mut(name)
            .is_some_and(|b| b.open_at(calls, since_ms))
    }

    /// `name` answered elsewhere (another replica closed its circuit): an open or half-open
    /// circuit here closes, as a success of its own would close it.
    pub fn closed_elsewhere(&mut self, name: &str) {
        if let Some(b) = self.map.get_mut(name)
            && b.circuit() != CircuitState::Closed
        {
            b.success();
        }
    }

    fn success(&mut self, name: &str) {
        self.calls += 1;
        if let Some(b) = self.map.get_mut(name) {
            b.success();
        }
    }

    fn failure(&mut self, name: &str, now_ms: u64) {
        self.calls += 1;
        let (config, calls) = (self.config, self.calls);
        if let Some(b) = self.map.get_mut(name) {
            b.failure(&config, calls, now_ms);
        }
    }
}

/// Healing, or one attempt and nothing else (the gateway's `--passthrough`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Mode {
    /// Retries and fall-backs as the policy decides.
    Heal,
    /// One attempt on the first target; its failure is the answer.
    Passthrough,
}

/// What the front-end does next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Step {
    /// Send the call to target `target` (an index into the plan's targets) now.
    Send {
        /// The target.
        target: usize,
    },
    /// Wait `delay_ms`, then send the call to `target` again.
    Wait {
        /// The target (the same as the failed attempt's).
        target: usize,
        /// How long to wait first.
        delay_ms: u64,
    },
    /// Repair what the failed attempt returned (the policy's `repair`, offered by
    /// [`CallPlan::offer`]). A repair the caller cannot make after all (it would be a guess) is
    /// reported with [`CallPlan::failed`] again, without the offer: the ladder goes on from the
    /// next rung.
    Repair {
        /// What to repair.
        target: RepairTarget,
    },
    /// Send the call to `target` again now, with its data's cache bypassed (the policy's
    /// `refresh`, offered by [`CallPlan::offer`]).
    Refresh {
        /// The target (the same as the failed attempt's).
        target: usize,
    },
    /// Stop trying.
    Stop(Stop),
}

/// What the caller can do about a failure of what came back, beyond sending the call again:
/// offered to the policy with the next `CallPlan::failed` only, since each failure is offered
/// what is possible for it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Offer {
    /// The caller can repair what came back: for [`RepairTarget::Output`], an answer whose
    /// declared field was renamed ([`crate::contract::map_renamed`]).
    pub repair: Option<RepairTarget>,
    /// The call can be sent again with its data's cache bypassed (a tool that declares its
    /// cache-bypass argument). Like a retry, offered to the policy only for a call that is safe
    /// to send twice, to a target whose circuit is not open.
    pub refresh: bool,
    /// The attempt went out with the caller's own credentials (the gateway's `auth =
    /// "client"`): a rate limit (429) is then that caller's quota, not the target's health, and
    /// does not count against the target's breaker — which every caller shares, so one
    /// caller's spent quota must not send everyone else's calls elsewhere. The call's own
    /// ladder still handles it (wait, retry, fall back). (Absent from a snapshot written
    /// before it existed: `false`.)
    #[serde(default)]
    pub callers_credentials: bool,
}

/// Why a plan stopped.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "stop", rename_all = "snake_case")]
pub enum Stop {
    /// The upstream refused the caller's own request (see the module's rules): hand its answer
    /// back as it came.
    Rejected {
        /// The upstream's status.
        status: u16,
    },
    /// The policy gave up (its ladder ran out, or the budget did) or no target was left.
    Exhausted {
        /// The class of the last failure, when there was one.
        class: Option<FailureClass>,
        /// The ladder's last word: degrade or terminate.
        action: ActionKind,
    },
}

/// Something the plan did, for the front-end's trace and headers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum CallEvent {
    /// A failed attempt will be repeated on the same target.
    Retry {
        /// The target.
        target: usize,
        /// The failure's class.
        class: FailureClass,
        /// The retry's number on this target.
        attempt: u32,
        /// The wait before it.
        delay_ms: u64,
    },
    /// The call moves on to the next target.
    Fallback {
        /// The target given up.
        from: usize,
        /// The target tried next.
        to: usize,
        /// The failure's class.
        class: FailureClass,
        /// Taken although the run's escalation budget was spent (upstream health is not the
        /// agent's budget).
        forced: bool,
    },
    /// A target was passed over because its breaker is open.
    Skip {
        /// The target.
        target: usize,
    },
}

/// One logical call through a chain of targets, as decided by the policy.
///
/// A private part of [`crate::Run`]: front-ends start a call with `Input::CallStarted` and
/// hand in its attempts' outcomes; the run drives the call's plan and charges its own ledger.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct CallPlan {
    targets: Vec<String>,
    at: usize,
    ladder: LadderState,
    mode: Mode,
    retry_safe: bool,
    /// What the next failure may be offered beyond a resend.
    offer: Offer,
    /// A recovery action was taken for this call.
    recovered: bool,
    events: Vec<CallEvent>,
    records: Vec<Event>,
}

impl CallPlan {
    /// A plan over `targets` (breaker names, in the order to try them). `retry_safe` says
    /// whether sending the same call twice does no harm (a model request: yes; a tool that may
    /// have run: only if it says it is read-only or idempotent).
    pub(crate) fn new(targets: Vec<String>, mode: Mode, retry_safe: bool) -> CallPlan {
        CallPlan {
            targets,
            at: 0,
            ladder: LadderState::default(),
            mode,
            retry_safe,
            offer: Offer::default(),
            recovered: false,
            events: Vec::new(),
            records: Vec::new(),
        }
    }

    /// Offers the next [`CallPlan::failed`] what the caller can do beyond a resend: a repair of
    /// what came back, a refresh of the data. Cleared by that call.
    pub(crate) fn offer(&mut self, offer: Offer) {
        self.offer = offer;
    }

    /// Whether a recovery action (a retry, a fall-back, a repair, a refresh) was taken for this
    /// call: what it returns next is a recovered value (see
    /// [`Policy::reread_due`](crate::policy::Policy::reread_due)).
    pub(crate) fn recovered(&self) -> bool {
        self.recovered
    }

    /// The name of target `index`, if there is one.
    pub(crate) fn target_name(&self, index: usize) -> Option<&str> {
        self.targets.get(index).map(String::as_str)
    }

    /// What happened so far (retries, fall-backs, skips), oldest first; drains the list.
    pub(crate) fn take_events(&mut self) -> Vec<CallEvent> {
        std::mem::take(&mut self.events)
    }

    /// The first step: the first target whose breaker allows a call; the last target is tried
    /// whatever its breaker says, since there is nothing else.
    pub(crate) fn begin(&mut self, breakers: &mut Breakers, now_ms: u64) -> Step {
        if self.targets.is_empty() {
            return Step::Stop(Stop::Exhausted {
                class: None,
                action: ActionKind::Terminate,
            });
        }
        self.at = 0;
        self.at = self.next_allowed(0, breakers, now_ms);
        Step::Send { target: self.at }
    }

    /// The current attempt succeeded: its target's breaker closes.
    pub(crate) fn succeeded(&mut self, breakers: &mut Breakers) {
        if let Some(name) = self.targets.get(self.at) {
            breakers.success(name);
        }
    }

    /// The current attempt failed with `signal`: classifies it, updates the target's breaker,
    /// asks the policy and charges the ledger for the action taken. Returns the next step.
    pub(crate) fn failed(
        &mut self,
        signal: &Signal,
        plane: &Plane,
        breakers: &mut Breakers,
        ledger: &mut BudgetLedger,
        now_ms: u64,
        rng: &mut dyn Rng,
    ) -> Step {
        let offer = std::mem::take(&mut self.offer);
        let Some(name) = self.targets.get(self.at).cloned() else {
            return Step::Stop(Stop::Exhausted {
                class: None,
                action: ActionKind::Terminate,
            });
        };
        if let Some(status) = caller_error(signal) {
            return Step::Stop(Stop::Rejected { status });
        }
        let consecutive = breakers.streak(&name).saturating_add(1);
        let failure = plane.classifier.classify(
            signal,
            ClassifyContext {
                consecutive_failures: consecutive,
            },
        );
        let callers_quota =
            offer.callers_credentials && matches!(signal, Signal::HttpStatus { status: 429, .. });
        if counts_against_health(failure.class) && !callers_quota {
            breakers.failure(&name, now_ms);
        }
        let exhausted = |action| {
            Step::Stop(Stop::Exhausted {
                class: Some(failure.class),
                action,
            })
        };
        if self.mode == Mode::Passthrough {
            return exhausted(ActionKind::Terminate);
        }
        let next = self.peek_next(breakers, now_ms);
        let open = matches!(breakers.state(&name), CircuitState::Open { .. });
        let mut options = self.options(&failure, signal, next);
        // A target whose circuit is open is never retried: that is what the circuit is for.
        options.retry_safe &= !open;
        // What the caller offered: a refresh is a resend too, so only when a retry would be.
        options.repair = offer.repair;
        options.refreshable = offer.refresh && options.retry_safe;
        let input = DecisionInput {
            surface: Surface::Call,
            signal: signal.clone(),
            consecutive,
            ladder: self.ladder,
            options: options.clone(),
            limits: *ledger.limits(),
            spent: *ledger.spent(),
        };
        let decision = decide_call(plane, &failure, &options, self.ladder, ledger, rng);
        let before = ledger.remaining();
        let charged = if decision.forced {
            ledger.record_usage(&decision.charge);
            true
        } else {
            ledger.charge(&decision.charge).is_ok()
        };
        self.records.push(Event::Signal {
            tool: Some(name),
            signal: signal.clone(),
        });
        self.records.push(Event::Classified {
            class: failure.class,
            error_type: failure.error_type,
            retry_after_ms: failure.retry_after_ms,
        });
        self.records.push(Event::Action {
            class: failure.class,
            action: decision.action.clone(),
            rung: decision.rung,
            budget_before: before,
            budget_after: ledger.remaining(),
            input: Some(Box::new(input)),
        });
        if !charged {
            return exhausted(ActionKind::Degrade);
        }
        match decision.action {
            RecoveryAction::Retry { delay_ms, attempt } => {
                self.ladder = decision.next;
                self.recovered = true;
                self.events.push(CallEvent::Retry {
                    target: self.at,
                    class: failure.class,
                    attempt,
                    delay_ms,
                });
                Step::Wait {
                    target: self.at,
                    delay_ms,
                }
            }
            RecoveryAction::Escalate {
                target: EscalationTarget::FallbackModel { .. },
            } => self.fall_back(failure.class, decision.forced, breakers, now_ms),
            RecoveryAction::Repair { target } if offer.repair == Some(target) => {
                self.ladder = decision.next;
                self.recovered = true;
                Step::Repair { target }
            }
            RecoveryAction::Refresh if options.refreshable => {
                self.ladder = decision.next;
                self.recovered = true;
                Step::Refresh { target: self.at }
            }
            RecoveryAction::Degrade | RecoveryAction::Terminate => {
                exhausted(decision.action.kind())
            }
            // The options offer none of these (nor a repair or refresh the caller did not
            // offer), so the policy cannot pick them; should a future policy do so, stopping is
            // the safe reading.
            RecoveryAction::Escalate {
                target: EscalationTarget::Human,
            }
            | RecoveryAction::Repair { .. }
            | RecoveryAction::Substitute { .. }
            | RecoveryAction::Replan
            | RecoveryAction::Refresh => exhausted(ActionKind::Degrade),
        }
    }

    /// The core's typed trace events of the decisions so far (signal, classified, action with
    /// its [`DecisionInput`]), oldest first; drains the list. Front-ends write them to their
    /// trace so `selfheal trace replay` can re-decide them.
    pub(crate) fn take_records(&mut self) -> Vec<Event> {
        std::mem::take(&mut self.records)
    }

    /// What recovery is possible for `failure` on the current target.
    fn options(&self, failure: &Classification, signal: &Signal, next: Option<usize>) -> Options {
        Options {
            fallback_model: next.and_then(|i| self.targets.get(i).cloned()),
            // The same bytes are refused again when the request itself is the problem.
            retry_safe: self.retry_safe
                && failure.class != FailureClass::ArgumentInvalid
                && !resend_futile(signal),
            ..Options::default()
        }
    }

    /// The index of the next target after the current one, without moving or skipping.
    fn peek_next(&self, breakers: &mut Breakers, now_ms: u64) -> Option<usize> {
        let from = self.at + 1;
        (from < self.targets.len()).then(|| self.first_allowed(from, breakers, now_ms))
    }

    fn first_allowed(&self, from: usize, breakers: &mut Breakers, now_ms: u64) -> usize {
        let last = self.targets.len().saturating_sub(1);
        (from..last)
            .find(|&i| breakers.allows(&self.targets[i], now_ms))
            .unwrap_or(last)
    }

    /// Moves to the first allowed target from `from`, recording the ones skipped.
    fn next_allowed(&mut self, from: usize, breakers: &mut Breakers, now_ms: u64) -> usize {
        let to = self.first_allowed(from, breakers, now_ms);
        for target in from..to {
            self.events.push(CallEvent::Skip { target });
        }
        to
    }

    fn fall_back(
        &mut self,
        class: FailureClass,
        forced: bool,
        breakers: &mut Breakers,
        now_ms: u64,
    ) -> Step {
        let from = self.at;
        let to = self.next_allowed(from + 1, breakers, now_ms);
        self.at = to;
        self.ladder = LadderState::default();
        self.recovered = true;
        self.events.push(CallEvent::Fallback {
            from,
            to,
            class,
            forced,
        });
        Step::Send { target: to }
    }
}

/// The call plan's decision for one classified failure: the policy's, plus the call rule that
/// upstream health is not the agent's budget (a fall-back the ladder wanted but the budget
/// refused is taken anyway, `forced`, and recorded as usage rather than charged).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct CallDecision {
    /// The action.
    pub action: RecoveryAction,
    /// Its ladder rung (`None` for a forced fall-back or the end of the ladder).
    pub rung: Option<usize>,
    /// What it costs.
    pub charge: crate::budget::Amounts,
    /// The failure's ladder state after it.
    pub next: LadderState,
    /// An action taken although the budget refused it: a fall-back on a call, a re-issue of
    /// a stream broken before any content ([`decide_stream`]).
    pub forced: bool,
}

/// Decides one failure of a call plan (see [`CallDecision`]); pure, so a replay makes the same
/// decision from the same [`DecisionInput`].
pub(crate) fn decide_call(
    plane: &Plane,
    failure: &Classification,
    options: &Options,
    ladder: LadderState,
    ledger: &BudgetLedger,
    rng: &mut dyn Rng,
) -> CallDecision {
    let decision = plane.policy.decide(ladder, failure, options, ledger, rng);
    let budget_refused_fallback = budget_refused(&decision, ActionKind::Escalate);
    match (&decision.action, &options.fallback_model) {
        (RecoveryAction::Degrade | RecoveryAction::Terminate, Some(model))
            if budget_refused_fallback =>
        {
            let to = EscalationTarget::FallbackModel {
                model: model.clone(),
            };
            CallDecision::forced(RecoveryAction::Escalate { target: to }, decision)
        }
        _ => CallDecision::of(decision),
    }
}

/// Whether the policy passed over a rung of `kind` because the budget was spent (the case the
/// call and stream rules take the action anyway).
fn budget_refused(d: &crate::policy::Decision, kind: ActionKind) -> bool {
    d.skipped.contains(&(kind, SkipReason::BudgetSpent))
}

impl CallDecision {
    /// The policy's decision as it stands.
    fn of(d: crate::policy::Decision) -> CallDecision {
        CallDecision {
            action: d.action,
            rung: d.rung,
            charge: d.charge,
            next: d.next,
            forced: false,
        }
    }

    /// `action` in place of the policy's decision `d`, which the budget alone refused.
    fn forced(action: RecoveryAction, d: crate::policy::Decision) -> CallDecision {
        CallDecision {
            charge: action.kind().charge(),
            action,
            rung: None,
            next: d.next,
            forced: true,
        }
    }
}

/// Whether sending the same request again is futile: the receiver refused the request itself
/// (HTTP 4xx other than 408 timeout, 409 conflict, 425 too early and 429 rate limit) or it
/// failed validation before it was sent. A retry of it can only get the same answer; the model
/// has to rewrite it, or another target has to take it.
pub(crate) fn resend_futile(signal: &Signal) -> bool {
    match signal {
        Signal::HttpStatus { status, .. } => {
            (400..500).contains(status) && !matches!(status, 408 | 409 | 425 | 429)
        }
        Signal::InvalidArguments { .. } | Signal::EmptyInput { .. } | Signal::ContextLength => true,
        Signal::ToolError { message } => !crate::classifier::transient_text(message),
        Signal::Timeout
        | Signal::Exception { .. }
        | Signal::Unavailable { .. }
        | Signal::UnknownTool { .. }
        | Signal::Refusal
        | Signal::EmptyResponse
        | Signal::MalformedOutput { .. }
        | Signal::TruncatedOutput
        | Signal::SchemaDrift { .. }
        | Signal::EmptyOutput
        | Signal::Stale { .. }
        | Signal::Contradiction { .. }
        | Signal::MissingStep { .. }
        | Signal::ToolMismatch { .. }
        | Signal::Repetition
        | Signal::VerifierRejected { .. } => false,
    }
}

/// The status of a refusal that is the caller's own request's fault, if `signal` is one: a
/// futile resend that another target would refuse too (a missing model, 404, is the target's).
fn caller_error(signal: &Signal) -> Option<u16> {
    match signal {
        Signal::HttpStatus { status, .. } if *status != 404 && resend_futile(signal) => {
            Some(*status)
        }
        _ => None,
    }
}

/// Whether a failure of this class says the target is unhealthy.
fn counts_against_health(class: FailureClass) -> bool {
    match class {
        FailureClass::ToolTimeout | FailureClass::ToolUnavailable => true,
        FailureClass::ArgumentInvalid
        | FailureClass::MalformedOutput
        | FailureClass::EmptyOutput
        | FailureClass::WrongTool
        | FailureClass::StaleContext
        | FailureClass::ContradictoryEvidence
        | FailureClass::PlanningFailure
        | FailureClass::VerificationFailure
        | FailureClass::ControlLoop => false,
    }
}

/// The monitor's failure-rate abort as every front-end applies it: only when the newest tool
/// result failed. A success is progress — a run that has just made some must not be stopped
/// for the failures before it — and the next failure is judged on its own. The controller
/// applies the same rule to the observations it routes.
pub fn abort_now(verdict_abort: Option<String>, newest_failed: bool) -> Option<String> {
    verdict_abort.filter(|_| newest_failed)
}

/// Decides `signal` with the plain policy (the controller's surface) and returns the decision
/// with its traced `action` event (input included, so a replay can make it again).
fn decide_traced(
    signal: Signal,
    options: Options,
    state: LadderState,
    plane: &Plane,
    ledger: &BudgetLedger,
    rng: &mut dyn Rng,
) -> (crate::policy::Decision, Event) {
    let failure = plane
        .classifier
        .classify(&signal, ClassifyContext::default());
    let input = DecisionInput {
        surface: Surface::Controller,
        signal,
        consecutive: 0,
        ladder: state,
        options,
        limits: *ledger.limits(),
        spent: *ledger.spent(),
    };
    let decision = plane
        .policy
        .decide(state, &failure, &input.options, ledger, rng);
    let mut after = ledger.remaining();
    after.saturating_sub_of(&decision.charge);
    let event = Event::Action {
        class: failure.class,
        action: decision.action.clone(),
        rung: decision.rung,
        budget_before: ledger.remaining(),
        budget_after: after,
        input: Some(Box::new(input)),
    };
    (decision, event)
}

/// What a front-end does about tool calls a model wrote that cannot be used (their problems
/// already turned into re-ask text by the repair layer).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reask {
    /// Ask the model again with the problems appended; charged.
    Ask,
    /// Ask the fallback model (the policy's escalation) with the problems appended; charged.
    Escalate,
    /// Do not ask again: answer with what there is, flagged `partial`.
    Partial,
}

/// Where the re-asking of one model answer stands: the class of its last unusable calls and
/// their place on that class's ladder. A new class starts its own ladder but keeps the retry and
/// action counts, as the controller does for a failure that changes its face on one step, so a
/// wrong tool followed by a skipped step is not judged on the wrong tool's rung, and the
/// per-failure cap still bounds them together.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReaskState {
    /// The class of the last re-asked calls (`None`: none yet).
    pub class: Option<FailureClass>,
    /// Its place on that class's ladder.
    pub ladder: LadderState,
}

/// Decides whether tool calls a model wrote that cannot be used are re-asked, through the ladder
/// of the class the classifier gives `signal` — the one an in-process client observes for the
/// same call: [`Signal::UnknownTool`] (a tool not on offer: `wrong_tool`),
/// [`Signal::MissingStep`] (a required argument left empty, an input the model never had:
/// `planning_failure`), [`Signal::InvalidArguments`] (`argument_invalid`) — and charges the
/// ledger when they are. `state` is the failure's place on its ladder (pass
/// [`LadderState::default`] for a first failure and the returned state on the next).
///
/// Repair by re-asking (of the arguments or the tool choice), a plain retry of the model call,
/// and a replan (the re-ask asks the model to write its calls anew from the conversation) become
/// [`Reask::Ask`]; an escalation becomes [`Reask::Escalate`] when the front-end has a `fallback`
/// model to ask (without one that rung is passed over); no substitute is offered (the call named
/// no tool that has one), and anything else the ladder offers that a front-end cannot do for a
/// model answer ends the re-asking.
pub(crate) fn reask_signal(
    signal: Signal,
    fallback: Option<&str>,
    plane: &Plane,
    ledger: &mut BudgetLedger,
    state: ReaskState,
    rng: &mut dyn Rng,
) -> (Reask, ReaskState, Event) {
    let class = plane
        .classifier
        .classify(&signal, ClassifyContext::default())
        .class;
    let ladder = if state.class.is_none_or(|c| c == class) {
        state.ladder
    } else {
        LadderState {
            rung: 0,
            ..state.ladder
        }
    };
    let repair = match &signal {
        Signal::UnknownTool { .. } | Signal::ToolMismatch { .. } => Some(RepairTarget::ToolChoice),
        Signal::MissingStep { .. } => None,
        _ => Some(RepairTarget::Arguments),
    };
    let options = Options {
        repair,
        retry_safe: true,
        can_replan: true,
        fallback_model: fallback.map(str::to_owned),
        ..Options::default()
    };
    let (decision, event) = decide_traced(signal, options, ladder, plane, ledger, rng);
    let outcome = match decision.action {
        RecoveryAction::Repair { .. } | RecoveryAction::Retry { .. } | RecoveryAction::Replan
            if ledger.charge(&decision.charge).is_ok() =>
        {
            Reask::Ask
        }
        RecoveryAction::Escalate {
            target: EscalationTarget::FallbackModel { .. },
        } if ledger.charge(&decision.charge).is_ok() => Reask::Escalate,
        RecoveryAction::Repair { .. }
        | RecoveryAction::Retry { .. }
        | RecoveryAction::Substitute { .. }
        | RecoveryAction::Replan
        | RecoveryAction::Refresh
        | RecoveryAction::Escalate { .. }
        | RecoveryAction::Degrade
        | RecoveryAction::Terminate => Reask::Partial,
    };
    let next = ReaskState {
        class: Some(class),
        ladder: decision.next,
    };
    (outcome, next, event)
}

/// What a front-end does when a model's stream broke.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamBreak {
    /// Nothing but the role went out: ask again (without streaming), invisibly; charged.
    Reissue,
    /// Content already reached the client (or the policy says no): end the stream with an
    /// error event the client can see.
    Fail,
}

/// Decides, through the ladder of [`FailureClass::MalformedOutput`] (a cut answer), whether a
/// broken stream is re-issued. Once content went out a re-issue is not safe — the client would
/// see the answer twice — so only a stream broken before any content can be healed. That one
/// is healed whatever the run's budget (`decide_stream`): the upstream broke it, and upstream
/// health is not the agent's budget.
pub fn stream_broke(
    content_sent: bool,
    plane: &Plane,
    ledger: &mut BudgetLedger,
    rng: &mut dyn Rng,
) -> (StreamBreak, Event) {
    let options = Options {
        retry_safe: !content_sent,
        ..Options::default()
    };
    let signal = Signal::TruncatedOutput;
    let failure = plane
        .classifier
        .classify(&signal, ClassifyContext::default());
    let input = DecisionInput {
        surface: Surface::Stream,
        signal,
        consecutive: 0,
        ladder: LadderState::default(),
        options: options.clone(),
        limits: *ledger.limits(),
        spent: *ledger.spent(),
    };
    let decision = decide_stream(
        plane,
        &failure,
        &options,
        LadderState::default(),
        ledger,
        rng,
    );
    let before = ledger.remaining();
    let outcome = match decision.action {
        RecoveryAction::Retry { .. } if !content_sent => {
            // A retry the budget cannot pay for is still made (`decide_stream`): recorded as
            // usage, so it shows.
            if decision.forced || ledger.charge(&decision.charge).is_err() {
                ledger.record_usage(&decision.charge);
            }
            StreamBreak::Reissue
        }
        RecoveryAction::Retry { .. }
        | RecoveryAction::Repair { .. }
        | RecoveryAction::Substitute { .. }
        | RecoveryAction::Replan
        | RecoveryAction::Refresh
        | RecoveryAction::Escalate { .. }
        | RecoveryAction::Degrade
        | RecoveryAction::Terminate => StreamBreak::Fail,
    };
    let event = Event::Action {
        class: failure.class,
        action: decision.action,
        rung: decision.rung,
        budget_before: before,
        budget_after: ledger.remaining(),
        input: Some(Box::new(input)),
    };
    (outcome, event)
}

/// The stream plan's decision for a stream that broke: the policy's, plus the stream rule that
/// a break before any content (`options.retry_safe`) is re-issued when the policy would have
/// retried it but the budget refused (`forced`: a retry, recorded as usage rather than
/// charged). A policy without a retry for a cut answer is obeyed. Pure, so a replay makes the
/// same decision from the same [`DecisionInput`].
pub(crate) fn decide_stream(
    plane: &Plane,
    failure: &Classification,
    options: &Options,
    ladder: LadderState,
    ledger: &BudgetLedger,
    rng: &mut dyn Rng,
) -> CallDecision {
    let decision = plane.policy.decide(ladder, failure, options, ledger, rng);
    let budget_refused_retry = budget_refused(&decision, ActionKind::Retry);
    if options.retry_safe
        && budget_refused_retry
        && !matches!(decision.action, RecoveryAction::Retry { .. })
    {
        let retry = RecoveryAction::Retry {
            delay_ms: 0,
            attempt: 1,
        };
        return CallDecision::forced(retry, decision);
    }
    CallDecision::of(decision)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::budget::BudgetLimits;
    use crate::rng::ConstRng;

    const CFG: BreakerConfig = BreakerConfig {
        after: 2,
        cooldown_calls: 0,
        cooldown_ms: 1000,
    };

    fn status(s: u16) -> Signal {
        Signal::HttpStatus {
            status: s,
            retry_after_ms: None,
            message: String::new(),
        }
    }

    fn setup(n: usize) -> (CallPlan, Breakers, BudgetLedger) {
        let names: Vec<String> = (0..n).map(|i| format!("t{i}")).collect();
        (
            CallPlan::new(names.clone(), Mode::Heal, true),
            Breakers::new(CFG, names),
            BudgetLedger::new(BudgetLimits::defaults()),
        )
    }

    /// Decides, through the policy's ladder for [`FailureClass::ArgumentInvalid`], whether unusable
    /// tool calls are re-asked: [`reask_signal`] with [`Signal::InvalidArguments`] of `problems`.
    fn reask(
        problems: &[String],
        fallback: Option<&str>,
        plane: &Plane,
        ledger: &mut BudgetLedger,
        state: LadderState,
        rng: &mut dyn Rng,
    ) -> (Reask, LadderState, Event) {
        let signal = Signal::InvalidArguments {
            errors: problems.to_vec(),
        };
        let state = ReaskState {
            class: Some(FailureClass::ArgumentInvalid),
            ladder: state,
        };
        let (r, next, event) = reask_signal(signal, fallback, plane, ledger, state, rng);
        (r, next.ladder, event)
    }

    fn policy(toml: &str) -> Plane {
        Plane::new(
            Policy::from_toml_str(toml).expect("policy"),
            ClassifierConfig::default(),
        )
        .expect("plane")
    }

    #[test]
    fn default_ladder_retries_twice_then_falls_back_then_gives_up() {
        let plane = Plane::default();
        let (mut plan, mut br, mut ledger) = setup(2);
        let mut rng = ConstRng(0);
        assert_eq!(plan.begin(&mut br, 0), Step::Send { target: 0 });
        let mut steps = Vec::new();
        for _ in 0..8 {
            let s = plan.failed(&Signal::Timeout, &plane, &mut br, &mut ledger, 0, &mut rng);
            let stop = matches!(s, Step::Stop(_));
            steps.push(s);
            if stop {
                break;
            }
        }
        let kinds: Vec<&str> = steps
            .iter()
            .map(|s| match s {
                Step::Send { .. } | Step::Refresh { .. } => "send",
                Step::Wait { .. } => "wait",
                Step::Repair { .. } => "repair",
                Step::Stop(_) => "stop",
            })
            .collect();
        // One retry on t0 (tool_timeout: retry, retry); the second failure opens its breaker
        // (after = 2), and an open circuit is not retried: the plan falls back to t1, which goes
        // the same way, and with no target left the plan stops.
        assert_eq!(kinds, ["wait", "send", "wait", "stop"]);
        let events = plan.take_events();
        assert!(
            events
                .iter()
                .any(|e| matches!(e, CallEvent::Fallback { from: 0, to: 1, .. })),
            "{events:?}"
        );
        assert_eq!(ledger.spent().retries, 2);
        assert_eq!(ledger.spent().escalations, 1);
    }

    #[test]
    fn an_answer_is_repaired_or_refreshed_only_as_offered_and_safe() {
        let plane = Plane::default();
        let mut rng = ConstRng(0);
        let drift = Signal::SchemaDrift {
            detail: "no `city`".into(),
        };
        let stale = Signal::Stale {
            age_ms: 10,
            max_age_ms: 1,
        };
        // malformed_output: repair first, when the caller can repair the answer...
        let (mut plan, mut br, mut ledger) = setup(1);
        plan.begin(&mut br, 0);
        plan.offer(Offer {
            repair: Some(RepairTarget::Output),
            refresh: false,
            callers_credentials: false,
        });
        assert_eq!(
            plan.failed(&drift, &plane, &mut br, &mut ledger, 0, &mut rng),
            Step::Repair {
                target: RepairTarget::Output
            }
        );
        assert!(plan.recovered());
        // ...and a repair refused after all goes on to the next rung (a retry), not the first.
        assert!(matches!(
            plan.failed(&drift, &plane, &mut br, &mut ledger, 0, &mut rng),
            Step::Wait { .. }
        ));
        // Without the offer the first rung is passed over.
        let (mut plan, mut br, mut ledger) = setup(1);
        plan.begin(&mut br, 0);
        assert!(!plan.recovered());
        assert!(matches!(
            plan.failed(&drift, &plane, &mut br, &mut ledger, 0, &mut rng),
            Step::Wait { .. }
        ));
        // stale_context: refresh when offered and safe to send twice, else the ladder's end.
        let (mut plan, mut br, mut ledger) = setup(1);
        plan.begin(&mut br, 0);
        plan.offer(Offer {
            repair: None,
            refresh: true,
            callers_credentials: false,
        });
        assert_eq!(
            plan.failed(&stale, &plane, &mut br, &mut ledger, 0, &mut rng),
            Step::Refresh { target: 0 }
        );
        assert!(matches!(
            plan.failed(&stale, &plane, &mut br, &mut ledger, 0, &mut rng),
            Step::Stop(Stop::Exhausted { .. })
        ));
        let mut unsafe_plan = CallPlan::new(vec!["t0".into()], Mode::Heal, false);
        unsafe_plan.begin(&mut br, 0);
        unsafe_plan.offer(Offer {
            repair: None,
            refresh: true,
            callers_credentials: false,
        });
        assert!(matches!(
            unsafe_plan.failed(&stale, &plane, &mut br, &mut ledger, 0, &mut rng),
            Step::Stop(Stop::Exhausted {
                class: Some(FailureClass::StaleContext),
                ..
            })
        ));
    }

    #[test]
    fn a_policy_that_falls_back_first_never_retries() {
        let plane = policy("[ladders]\ntool_timeout = [\"escalate\", \"retry\", \"degrade\"]\n");
        let (mut plan, mut br, mut ledger) = setup(2);
        let mut rng = ConstRng(0);
        plan.begin(&mut br, 0);
        let s = plan.failed(&status(503), &plane, &mut br, &mut ledger, 0, &mut rng);
        assert_eq!(s, Step::Send { target: 1 });
        assert_eq!(ledger.spent().retries, 0);
    }

    #[test]
    fn the_callers_own_bad_request_goes_back_uncharged() {
        let plane = Plane::default();
        let (mut plan, mut br, mut ledger) = setup(2);
        let mut rng = ConstRng(0);
        plan.begin(&mut br, 0);
        for s in [400, 401, 403, 413, 422] {
            assert_eq!(
                plan.failed(&status(s), &plane, &mut br, &mut ledger, 0, &mut rng),
                Step::Stop(Stop::Rejected { status: s })
            );
        }
        assert_eq!(ledger.spent().recoveries, 0);
        assert_eq!(br.streak("t0"), 0, "a refusal says nothing about health");
        // A missing model, a context too long for this model: the next target may serve them.
        assert_eq!(
            plan.failed(&status(404), &plane, &mut br, &mut ledger, 0, &mut rng),
            Step::Send { target: 1 }
        );
    }

    #[test]
    fn a_circuit_opened_elsewhere_is_skipped_unless_last_and_cools_when_the_other_does() {
        let config = BreakerConfig {
            after: 3,
            cooldown_calls: 0,
            cooldown_ms: 1_000,
        };
        let mut br = Breakers::new(config, ["a".to_string(), "b".to_string()]);
        assert!(br.open_elsewhere("a", 400), "opened at 400 elsewhere");
        assert!(!br.open_elsewhere("a", 900), "open already: left as it is");
        assert!(!br.open_elsewhere("zzz", 0), "not tracked");
        assert!(!br.allows("a", 1_399));
        assert!(br.allows("a", 1_400), "cools when the other's does");
        br.closed_elsewhere("a");
        assert!(br.open_elsewhere("b", 0));
        assert!(br.open_elsewhere("a", 0));
        let mut plan = CallPlan::new(vec!["a".into(), "b".into()], Mode::Heal, true);
        let step = plan.begin(&mut br, 10);
        assert_eq!(
            step,
            Step::Send { target: 1 },
            "a skipped; b is the last: tried"
        );
        br.closed_elsewhere("a");
        assert!(br.allows("a", 10), "closed elsewhere: called again");
    }

    #[test]
    fn an_open_breaker_is_skipped_unless_last_and_health_is_not_the_budget() {
        let plane = Plane::default();
        let (mut plan, mut br, _) = setup(3);
        let mut rng = ConstRng(0);
        let mut ledger = BudgetLedger::new(Amounts {
            escalations: 0,
            ..BudgetLimits::defaults()
        });
        // Open t0's breaker.
        plan.begin(&mut br, 0);
        for _ in 0..2 {
            plan.failed(&Signal::Timeout, &plane, &mut br, &mut ledger, 0, &mut rng);
        }
        assert!(matches!(br.state("t0"), CircuitState::Open { .. }));
        let mut p2 = CallPlan::new(
            vec!["t0".into(), "t1".into(), "t2".into()],
            Mode::Heal,
            true,
        );
        assert_eq!(p2.begin(&mut br, 10), Step::Send { target: 1 });
        assert_eq!(p2.take_events(), vec![CallEvent::Skip { target: 0 }]);
        // t1 fails for good: with no escalation budget the fall-back is still taken.
        let mut last = Step::Send { target: 1 };
        for _ in 0..6 {
            last = p2.failed(&Signal::Timeout, &plane, &mut br, &mut ledger, 10, &mut rng);
            if last == (Step::Send { target: 2 }) {
                break;
            }
        }
        assert_eq!(last, Step::Send { target: 2 });
        assert!(
            p2.take_events()
                .iter()
                .any(|e| matches!(e, CallEvent::Fallback { forced: true, .. }))
        );
        assert!(ledger.spent().escalations >= 1, "recorded as usage");
        // After the cooldown t0 is allowed again (half-open).
        assert!(br.allows("t0", 2000));
    }

    /// A 429 sent to a caller's own credentials is that caller's quota: it never opens the
    /// breaker every caller shares. The same 429 under shared credentials does, and the
    /// caller's own call still retries it either way.
    #[test]
    fn a_callers_own_rate_limit_leaves_the_shared_breaker_closed() {
        let plane = Plane::default();
        let limited = Signal::HttpStatus {
            status: 429,
            retry_after_ms: Some(100),
            message: "rate limit reached for your key".into(),
        };
        for (own, opens) in [(true, false), (false, true)] {
            let (mut plan, mut br, mut ledger) = setup(2);
            let mut rng = ConstRng(0);
            plan.begin(&mut br, 0);
            let mut steps = Vec::new();
            for _ in 0..CFG.after {
                plan.offer(Offer {
                    callers_credentials: own,
                    ..Offer::default()
                });
                steps.push(plan.failed(&limited, &plane, &mut br, &mut ledger, 0, &mut rng));
            }
            assert_eq!(
                matches!(br.state("t0"), CircuitState::Open { .. }),
                opens,
                "callers_credentials = {own}: {:?}",
                br.state("t0")
            );
            assert!(
                matches!(steps[0], Step::Wait { target: 0, .. }),
                "the caller's call waits and retries: {steps:?}"
            );
        }
        // A plan stored before the field existed reads it as `false`.
        let old: Offer = serde_json::from_str(r#"{"repair":null,"refresh":true}"#).unwrap();
        assert_eq!(
            old,
            Offer {
                refresh: true,
                ..Offer::default()
            }
        );
    }

    #[test]
    fn an_open_circuit_is_not_retried() {
        let plane = Plane::default();
        let names = vec!["tool".to_string()];
        let mut br = Breakers::new(CFG, Vec::<String>::new());
        let mut ledger = BudgetLedger::new(BudgetLimits::defaults());
        let mut rng = ConstRng(0);
        // A retryable failure is retried...
        let mut plan = CallPlan::new(names.clone(), Mode::Heal, true);
        plan.begin(&mut br, 0);
        assert!(matches!(
            plan.failed(&Signal::Timeout, &plane, &mut br, &mut ledger, 0, &mut rng),
            Step::Wait { .. }
        ));
        // ...but not once the target's breaker opened its circuit.
        let mut br = Breakers::new(CFG, names.clone());
        for _ in 0..CFG.after {
            br.failure("tool", 0);
        }
        let mut plan = CallPlan::new(names, Mode::Heal, true);
        plan.begin(&mut br, 0);
        let unavailable = Signal::Unavailable { consecutive: 5 };
        assert!(matches!(
            plan.failed(&unavailable, &plane, &mut br, &mut ledger, 0, &mut rng),
            Step::Stop(_)
        ));
    }

    #[test]
    fn passthrough_makes_one_attempt() {
        let plane = Plane::default();
        let names = vec!["a".to_string(), "b".to_string()];
        let mut plan = CallPlan::new(names.clone(), Mode::Passthrough, true);
        let mut br = Breakers::new(CFG, names);
        let mut ledger = BudgetLedger::new(BudgetLimits::defaults());
        plan.begin(&mut br, 0);
        assert!(matches!(
            plan.failed(
                &status(503),
                &plane,
                &mut br,
                &mut ledger,
                0,
                &mut ConstRng(0)
            ),
            Step::Stop(Stop::Exhausted { .. })
        ));
    }

    #[test]
    fn not_retry_safe_means_no_retry() {
        let plane = Plane::default();
        let names = vec!["tool".to_string()];
        let mut plan = CallPlan::new(names.clone(), Mode::Heal, false);
        let mut br = Breakers::new(CFG, names);
        let mut ledger = BudgetLedger::new(BudgetLimits::defaults());
        plan.begin(&mut br, 0);
        assert!(matches!(
            plan.failed(
                &Signal::Timeout,
                &plane,
                &mut br,
                &mut ledger,
                0,
                &mut ConstRng(0)
            ),
            Step::Stop(_)
        ));
        assert_eq!(ledger.spent().retries, 0);
    }

    #[test]
    fn reask_follows_the_ladder_and_the_budget() {
        let plane = Plane::default();
        let mut ledger = BudgetLedger::new(BudgetLimits::defaults().with_recoveries(1));
        let mut rng = ConstRng(0);
        let p = vec!["bad".to_string()];
        let (r, next, event) = reask(
            &p,
            None,
            &plane,
            &mut ledger,
            LadderState::default(),
            &mut rng,
        );
        assert_eq!(r, Reask::Ask);
        assert_eq!(ledger.spent().recoveries, 1);
        // The decision is traced with its input: a replay under the same policy agrees.
        let again = crate::replay::replay([&event], &plane);
        assert_eq!((again.len(), again[0].differs), (1, false));
        let (r, _, _) = reask(&p, None, &plane, &mut ledger, next, &mut rng);
        assert_eq!(r, Reask::Partial, "the budget is spent");
        let no_repair = policy("[ladders]\nargument_invalid = [\"degrade\"]\n");
        let mut fresh = BudgetLedger::new(BudgetLimits::defaults());
        let (r, _, _) = reask(
            &p,
            None,
            &no_repair,
            &mut fresh,
            LadderState::default(),
            &mut rng,
        );
        assert_eq!(r, Reask::Partial);
    }

    /// The ladder's escalation rung is a re-ask of the fallback model when the front-end has
    /// one, and passed over when it has none.
    #[test]
    fn reask_escalates_only_to_a_fallback_there_is() {
        let plane = policy("[ladders]\nargument_invalid = [\"escalate\", \"degrade\"]\n");
        let mut rng = ConstRng(0);
        let p = vec!["bad".to_string()];
        let mut ledger = BudgetLedger::new(BudgetLimits::defaults());
        let (r, _, _) = reask(
            &p,
            Some("big"),
            &plane,
            &mut ledger,
            LadderState::default(),
            &mut rng,
        );
        assert_eq!(r, Reask::Escalate);
        assert_eq!(ledger.spent().escalations, 1);
        let mut ledger = BudgetLedger::new(BudgetLimits::defaults());
        let (r, _, _) = reask(
            &p,
            None,
            &plane,
            &mut ledger,
            LadderState::default(),
            &mut rng,
        );
        assert_eq!(r, Reask::Partial);
        assert_eq!(ledger.spent().escalations, 0);
    }

    /// The actions `reask_signal` takes for `signal` until it stops asking, with a fallback.
    fn reask_walk(signal: &Signal) -> Vec<Reask> {
        let plane = Plane::default();
        let mut ledger = BudgetLedger::new(BudgetLimits::defaults());
        let mut rng = ConstRng(0);
        let mut state = ReaskState::default();
        let mut out = Vec::new();
        loop {
            let (r, next, _) = reask_signal(
                signal.clone(),
                Some("big"),
                &plane,
                &mut ledger,
                state,
                &mut rng,
            );
            out.push(r);
            if r == Reask::Partial || out.len() > 10 {
                return out;
            }
            state = next;
        }
    }

    /// A call the model wrote climbs the ladder of the class the classifier gives its signal,
    /// as the same call does in-process: a tool not on offer the wrong-tool ladder (re-map,
    /// rethink, escalate: no substitute for a tool that has none), a required argument left
    /// empty the planning-failure ladder (rethink, escalate), anything else the
    /// argument-invalid one (repair, retry, escalate, replan).
    #[test]
    fn reask_climbs_the_ladder_of_the_calls_class() {
        use Reask::{Ask, Escalate, Partial};
        assert_eq!(
            reask_walk(&Signal::UnknownTool { name: "x".into() }),
            [Ask, Ask, Escalate, Partial]
        );
        assert_eq!(
            reask_walk(&Signal::MissingStep {
                detail: "b is empty".into()
            }),
            [Ask, Escalate, Partial]
        );
        assert_eq!(
            reask_walk(&Signal::InvalidArguments {
                errors: vec!["bad".into()]
            }),
            [Ask, Ask, Escalate, Ask, Partial]
        );
    }

    /// A wrong tool re-asked twice, then a skipped step in the same answer's re-asking: the
    /// skipped step starts the planning-failure ladder (replan), not the wrong tool's third rung,
    /// and the per-failure cap still counts both.
    #[test]
    fn reask_starts_a_new_class_on_its_own_ladder() {
        let plane = Plane::default();
        let mut ledger = BudgetLedger::new(BudgetLimits::defaults());
        let mut rng = ConstRng(0);
        let wrong = Signal::UnknownTool { name: "x".into() };
        let mut state = ReaskState::default();
        for _ in 0..2 {
            let (r, next, _) =
                reask_signal(wrong.clone(), None, &plane, &mut ledger, state, &mut rng);
            assert_eq!(r, Reask::Ask);
            state = next;
        }
        let skipped = Signal::MissingStep { detail: "b".into() };
        let (r, next, event) = reask_signal(skipped, None, &plane, &mut ledger, state, &mut rng);
        assert_eq!(r, Reask::Ask);
        assert!(
            matches!(
                event,
                Event::Action {
                    action: RecoveryAction::Replan,
                    ..
                }
            ),
            "{event:?}"
        );
        assert_eq!(next.class, Some(FailureClass::PlanningFailure));
        assert_eq!(next.ladder.actions, 3);
    }

    #[test]
    fn abort_follows_a_failure_never_a_success() {
        let why = Some("80 % of the last calls failed".to_string());
        assert_eq!(abort_now(why.clone(), true), why);
        assert_eq!(abort_now(why, false), None);
        assert_eq!(abort_now(None, true), None);
    }

    #[test]
    fn a_stream_is_reissued_only_before_content() {
        let plane = Plane::default();
        let mut ledger = BudgetLedger::new(BudgetLimits::defaults());
        let mut rng = ConstRng(0);
        assert_eq!(
            stream_broke(false, &plane, &mut ledger, &mut rng).0,
            StreamBreak::Reissue
        );
        assert_eq!(ledger.spent().retries, 1);
        assert_eq!(
            stream_broke(true, &plane, &mut ledger, &mut rng).0,
            StreamBreak::Fail
        );
    }

    /// A stream the upstream broke before any content is re-issued however much of the run's
    /// budget is spent (recorded as usage, so it shows), and the traced decision replays as
    /// made; once content went out it fails whatever the budget.
    #[test]
    fn a_stream_broken_before_content_is_reissued_whatever_the_budget() {
        let plane = Plane::default();
        let mut rng = ConstRng(0);
        for spent in [
            Amounts {
                retries: 3,
                ..Amounts::default()
            },
            Amounts {
                recoveries: 5,
                ..Amounts::default()
            },
        ] {
            let mut ledger = BudgetLedger::new(BudgetLimits::defaults());
            ledger.record_usage(&spent);
            let (outcome, event) = stream_broke(false, &plane, &mut ledger, &mut rng);
            assert_eq!(outcome, StreamBreak::Reissue, "{spent:?}");
            assert_eq!(
                ledger.spent().retries,
                spent.retries + 1,
                "the re-issue shows as usage"
            );
            let Event::Action {
                action,
                input: Some(input),
                ..
            } = &event
            else {
                panic!("{event:?}")
            };
            assert!(matches!(action, RecoveryAction::Retry { .. }), "{action:?}");
            assert_eq!(input.surface, Surface::Stream);
            let comparisons = crate::replay::replay([&event], &plane);
            assert_eq!(comparisons.len(), 1);
            assert!(!comparisons[0].differs, "{comparisons:?}");
            assert_eq!(
                stream_broke(true, &plane, &mut ledger, &mut rng).0,
                StreamBreak::Fail
            );
        }
    }

    use crate::budget::Amounts;
}
