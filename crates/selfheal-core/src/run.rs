//! One run, one brain: everything a front-end observes goes in, everything it must do comes out.
//!
//! A [`Run`] is the whole control plane of one agent run — its policy, its one budget ledger,
//! its monitor, its trace and the call it has in flight — behind one event-in, action-out
//! interface in the shape of `quinn-proto`'s `Connection`:
//!
//! - [`Run::handle`] takes an [`Input`]: the tools on offer, a call begun, an attempt that
//!   failed or succeeded, a tool or model call that finished, a verdict, an answer proposed,
//!   or time passing;
//! - [`Run::poll`] returns the next [`Action`] the front-end must carry out (send to a target,
//!   repair, recover a step, read again before answering, answer with a status, stop), until
//!   there is none;
//! - [`Run::next_deadline`] says when time next matters (a retry waiting out its backoff);
//!   the front-end sleeps until then and hands in [`Input::Tick`].
//!
//! The front-end never asks the run's parts for a decision, so no front-end can keep a retry
//! cap, a breaker rule or an "is this retryable?" test of its own: the wire call's ladder
//! ([`crate::call::CallPlan`]) and the run's ladders ([`crate::controller::Controller`]) are
//! private parts of one `Run` and charge one ledger.
//!
//! A run's state serialises ([`Run::snapshot`], [`Run::to_bytes`]) with a version, and comes
//! back with [`Run::resume`] under the process's configuration: this is what a shared store
//! keeps between two requests of one conversation served by two processes.
//!
//! ```
//! use selfheal_core::{
//!     Action, Breakers, CallMode, ControllerConfig, Env, Input, Run, Signal, SplitMix64,
//! };
//!
//! let mut run = Run::new(ControllerConfig::default()).unwrap();
//! let mut rng = SplitMix64::new(7);
//! let mut breakers = Breakers::none();
//! let mut env = Env { now_ms: 0, rng: &mut rng, breakers: &mut breakers };
//! let start = Input::CallStarted {
//!     call: 1,
//!     targets: vec!["main".into()],
//!     mode: CallMode::Heal,
//!     retry_safe: true,
//! };
//! run.handle(start, &mut env);
//! assert!(matches!(run.poll(), Some(Action::Send { call: 1, target: 0, .. })));
//! let busy = Signal::HttpStatus { status: 503, retry_after_ms: Some(200), message: String::new() };
//! run.handle(Input::AttemptFailed { call: 1, signal: &busy, offer: Default::default() }, &mut env);
//! // The retry waits (at least Retry-After): nothing to do before the deadline...
//! assert_eq!(run.poll(), None);
//! let at = run.next_deadline().unwrap();
//! assert!(at >= 200);
//! // ... and at it, the call is sent again.
//! env.now_ms = at;
//! run.handle(Input::Tick { call: None }, &mut env);
//! assert!(matches!(run.poll(), Some(Action::Send { call: 1, target: 0, .. })));
//! ```

use std::collections::{BTreeMap, VecDeque};

use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::breaker::BreakerConfig;
use crate::budget::{Amounts, BudgetLedger, Dimension};
use crate::call::{Breakers, CallEvent, CallPlan, Mode, Offer, Reask, ReaskState, Step, Stop};
use crate::classifier::{FailureClass, Signal};
use crate::controller::{
    Controller, ControllerConfig, Directive, Observation, RunOutcome, StepsBy, Unresolved,
};
use crate::monitor::{ConfigError, Guidance, Monitor, Verdict};
use crate::policy::{RecoveryAction, RepairTarget};
use crate::rng::Rng;
use crate::trace::{Event, RunStatus, Trace};

/// The version of [`RunSnapshot`]'s layout. A snapshot of another version is refused by
/// [`Run::resume`], never read as something it is not. 2: the run's own trust evidence
/// instead of a copy of the whole trust store. 3: the re-asks of an answer that announced a
/// call this user turn ([`Action::AskAgain`]), so that a run continued elsewhere does not ask
/// again.
pub const STATE_VERSION: u32 = 3;

/// What a run is given with each input: the time, the randomness, and the breakers of the
/// targets its calls go to (kept by the process, shared by its runs).
pub struct Env<'a> {
    /// Milliseconds on the front-end's clock.
    pub now_ms: u64,
    /// The randomness of backoff jitter.
    pub rng: &'a mut dyn Rng,
    /// The breakers of the call targets ([`Breakers::none`] for a front-end that keeps none).
    pub breakers: &'a mut Breakers,
}

/// Everything a front-end can observe.
// An input is built, handed in and dropped: never stored, so its largest variant's size costs
// one move, not memory.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone)]
pub enum Input<'a> {
    /// The tools the agent is offered now, before anything is hidden (see
    /// [`Controller::offer`]).
    Offered(&'a [&'a str]),
    /// A call (a model request, a tool call) begins over `targets`, in the order to try them.
    /// `retry_safe`: sending it twice does no harm. A run may have several calls in flight
    /// (parallel tool calls, concurrent requests of one conversation), each named by the
    /// front-end's `call` id; starting an id again starts it afresh.
    CallStarted {
        /// The front-end's id of the call.
        call: CallId,
        /// Target names (breaker names).
        targets: Vec<String>,
        /// Healing or one attempt.
        mode: Mode,
        /// Whether a resend is harmless.
        retry_safe: bool,
    },
    /// The call's current attempt succeeded: it is over.
    AttemptSucceeded {
        /// The call.
        call: CallId,
    },
    /// The call's current attempt failed with `signal`; `offer` is what the front-end can do
    /// about what came back beyond a resend (a repair, a refresh).
    AttemptFailed {
        /// The call.
        call: CallId,
        /// What went wrong, as read off the wire.
        signal: &'a Signal,
        /// What else is possible.
        offer: Offer,
    },
    /// Time passed: a retry whose wait is over is sent — of call `call` only, or of every
    /// call when `None` (a front-end that serves several calls of one run from several tasks
    /// ticks its own, so that it never takes another task's send).
    Tick {
        /// The call whose wait to check, or all.
        call: Option<CallId>,
    },
    /// The user spoke: a new turn of the task begins (the monitor's loop rules look at one
    /// turn at a time).
    UserTurn,
    /// The model's stream broke, before any content reached the client or after: the run
    /// answers [`Action::Reissue`] (ask again, invisibly) or [`Action::EndStream`].
    StreamBroke {
        /// Content had already gone out.
        after_content: bool,
    },
    /// The model answered with tool calls that cannot be used, read as `signal` (a tool not on
    /// offer, a required argument missing, arguments that do not parse); `state` is where the
    /// re-asking of this answer stands (default for the first time) and `fallback` the model
    /// an escalation would ask. The run answers [`Action::Reask`] or, when its ladder says
    /// no, [`Action::Answer`] `partial`.
    CallsUnusable {
        /// What was wrong.
        signal: Signal,
        /// The fallback model, if the front-end has one.
        fallback: Option<&'a str>,
        /// The re-asking's place on its ladder.
        state: ReaskState,
    },
    /// A tool call or model call finished, or a verifier judged a result.
    Observed(Observation<'a>),
    /// The model is about to be asked for the next step: what guidance it gets and which tools
    /// it is not offered.
    NextTurn,
    /// The run has a final answer; `by` says how the front-end knows the run's steps. With
    /// `answer` (its text and the run's evidence), the grounding rule
    /// (`answer_grounding`) judges it too, when the run was offered tools
    /// ([`Input::Offered`]): an answer stating numbers found in no input or tool result of the
    /// run is answered `partial`, and [`Run::finish`] ends the run `partial` while that answer
    /// stands.
    AnswerProposed {
        /// By plan (in-process) or by tool (on the wire).
        by: StepsBy,
        /// The answer's text and the evidence it is judged against; `None` when the front-end
        /// has no text to judge (nothing is judged then).
        answer: Option<Proposed<'a>>,
    },
}

/// A final answer as proposed to the run ([`Input::AnswerProposed`]): its text, and what the
/// run holds to check it against — the task's own words (its user and system messages, never
/// the front-end's guidance nor the model's words) and the tool results the model was shown.
#[derive(Debug, Clone, Copy)]
pub struct Proposed<'a> {
    /// The answer's text.
    pub text: &'a str,
    /// The run's evidence: inputs and tool results, as values (a text as a string).
    pub evidence: &'a [serde_json::Value],
    /// Whether the model could call a tool when it wrote the answer: `false` when the request
    /// forbade calls (`tool_choice: "none"`), and then an answer that describes or writes a
    /// call is what was asked for, not an announcement ([`crate::announce`]).
    pub may_call: bool,
}

/// Everything a front-end must do.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "do", rename_all = "snake_case")]
pub enum Action {
    /// Ask the model for the next step with this guidance, offering every tool but these.
    Proceed {
        /// Guidance for the next prompt.
        guidance: Vec<Guidance>,
        /// Tools not to offer.
        hidden_tools: Vec<String>,
    },
    /// Send call `call` to target `target` now.
    Send {
        /// The call.
        call: CallId,
        /// Index into the call's targets.
        target: usize,
        /// Its name.
        name: String,
        /// Bypass the data's cache (the policy's `refresh`).
        refresh: bool,
    },
    /// Repair what the failed attempt returned, then report it as a success or a failure.
    Repair {
        /// The call.
        call: CallId,
        /// What to repair.
        target: RepairTarget,
    },
    /// The call in flight is over without an answer: hand the upstream's refusal back as it
    /// came, or give up on it.
    GiveUp {
        /// The call.
        call: CallId,
        /// Why.
        stop: Stop,
    },
    /// Recover a failed step with this action (retry, substitute, replan, escalate, repair...).
    Recover {
        /// The step concerned.
        step: Option<u32>,
        /// The inferred class.
        class: FailureClass,
        /// The action, with everything needed to carry it out.
        action: RecoveryAction,
    },
    /// Ask the model again for calls it can use (on the fallback model when `escalate`); pass
    /// `next` back with the next [`Input::CallsUnusable`] of the same answer.
    Reask {
        /// Where the re-asking stands now.
        next: ReaskState,
        /// Ask the fallback model.
        escalate: bool,
    },
    /// Ask the same request again: the stream broke before the client saw anything.
    Reissue,
    /// End the stream with an error event the client sees: content went out already, or the
    /// policy says no.
    EndStream,
    /// Before answering, read again each value no second source confirmed, `reads` times,
    /// reporting each read as [`Observation::Verified`]; then propose the answer again.
    ReadAgain {
        /// Reads per value; the first that differs ends them.
        reads: u32,
    },
    /// Do not answer yet: the proposed answer announces a call of an offered tool instead of
    /// making it ([`crate::announce::announced_call`]). Ask the model again with `guidance`
    /// appended; the answer that comes back is proposed again. Asked once per user turn: the
    /// same announcement again is answered `partial` with `reason`.
    AskAgain {
        /// What the model is told.
        guidance: String,
        /// Why the answer was not taken.
        reason: String,
    },
    /// Answer now, with this status; `reason` when it is not `complete`.
    Answer {
        /// The answer's status.
        status: RunStatus,
        /// Why, when not complete.
        reason: Option<String>,
    },
    /// The run is over: stop with this status and reason.
    Stop {
        /// `partial` (degraded) or `failed`.
        status: RunStatus,
        /// Why.
        reason: String,
    },
}

/// What the run says about a step — a tool or model call that finished, a verdict, the next
/// turn ([`Run::decide_step`]): the three of [`Action`]'s answers such an input can call for.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "do", rename_all = "snake_case")]
pub enum StepAction {
    /// See [`Action::Proceed`].
    Proceed {
        /// Guidance for the next prompt.
        guidance: Vec<Guidance>,
        /// Tools not to offer.
        hidden_tools: Vec<String>,
    },
    /// See [`Action::Recover`].
    Recover {
        /// The step concerned.
        step: Option<u32>,
        /// The inferred class.
        class: FailureClass,
        /// The action, with everything needed to carry it out.
        action: RecoveryAction,
    },
    /// See [`Action::Stop`].
    Stop {
        /// `partial` (degraded) or `failed`.
        status: RunStatus,
        /// Why.
        reason: String,
    },
}

/// Why the answer of a run that owns its task ([`StepsBy::Plan`]), was offered tools and saw
/// none return a result is not `complete`. The run cannot tell a task that needs no tool from
/// one whose tools were skipped, so it claims neither: the answer stands, flagged.
pub const NO_TOOL_RESULT: &str =
    "tools were offered and none returned a result: nothing in the run stands behind the answer";

/// A front-end's name for one call in flight (a JSON-RPC id, a request number).
pub type CallId = u64;

/// A retry waiting out its delay.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
struct Wait {
    target: usize,
    at_ms: u64,
}

/// A call in flight: its plan, and the retry it waits to send, if any.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct InFlight {
    plan: CallPlan,
    wait: Option<Wait>,
}

/// Most calls a run keeps in flight; starting one more gives up the oldest (a front-end that
/// forgets to end its calls cannot grow a run without bound).
pub(crate) const MAX_IN_FLIGHT: usize = 256;

/// A run's state as written to a store: everything but the configuration.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RunSnapshot {
    /// [`STATE_VERSION`] when written.
    pub version: u32,
    ctl: Controller,
    calls: BTreeMap<CallId, InFlight>,
    queue: VecDeque<Action>,
    call_events: Vec<(CallId, CallEvent)>,
    /// The run's re-asks of an answer that announced a call, this user turn (layout 3; read
    /// as none from an older layout's bytes, so that their version, not a missing field, is
    /// what refuses them).
    #[serde(default)]
    announce_reasks: u32,
}

/// Why a snapshot could not be resumed.
#[derive(Debug, Error)]
pub enum ResumeError {
    /// The snapshot was written by another layout.
    #[error("run state version {found} is not the version this build reads ({expected})")]
    Version {
        /// The snapshot's.
        found: u32,
        /// This build's ([`STATE_VERSION`]).
        expected: u32,
    },
    /// The bytes are not a snapshot.
    #[error("run state unreadable: {0}")]
    Unreadable(#[from] serde_json::Error),
    /// The configuration it is resumed under is invalid.
    #[error(transparent)]
    Config(#[from] ConfigError),
}

/// The control plane of one run (see the module documentation).
#[derive(Debug, Clone)]
pub struct Run {
    ctl: Controller,
    calls: BTreeMap<CallId, InFlight>,
    queue: VecDeque<Action>,
    call_events: Vec<(CallId, CallEvent)>,
    /// Why the last answer proposed with its text cannot be claimed (the grounding rule), if
    /// it cannot; [`Run::finish`] ends the run `partial` with it. Not part of a snapshot: it is
    /// judged again when an answer is proposed.
    ungrounded: Option<String>,
    /// The tools the last [`Input::Offered`] offered: only when there are some is an answer
    /// judged by the grounding rule and read for an announced call
    /// ([`crate::announce::announced_call`]). A run without tools answers from the model's own
    /// knowledge, which nothing in the run could ground; flagging every such answer would say
    /// nothing.
    offered: Vec<String>,
    /// Whether a tool call of the run returned a result with no failure signal
    /// ([`Observation::ToolFinished`]). A run that owns its task ([`StepsBy::Plan`]), was
    /// offered tools and saw none return answers from nothing the run holds: not `complete`.
    /// Not part of a snapshot (the front-ends that judge by plan keep their run in process).
    tool_returned: bool,
    /// Re-asks of an answer that announced a call, this user turn ([`Action::AskAgain`]): part
    /// of a snapshot, so a run continued elsewhere does not ask again.
    announce_reasks: u32,
}

/// Re-asks per user turn of an answer that announces a call instead of making it: the model is
/// told once; an announcement again is flagged `partial` (the same model with the same
/// conversation tends to say the same thing, and each re-ask is a model call).
pub(crate) const MAX_ANNOUNCE_REASKS: u32 = 1;

/// Most retry, fall-back and skip events a run holds for [`Run::take_call_events`].
pub(crate) const MAX_CALL_EVENTS: usize = 256;

impl Default for Run {
    /// A run with [`ControllerConfig::default`].
    fn default() -> Self {
        Run::from_controller(Controller::default())
    }
}

impl Breakers {
    /// No breakers: every target is always allowed (a front-end whose targets have no health
    /// of their own to track, such as an in-process tool).
    pub fn none() -> Breakers {
        Breakers::new(
            BreakerConfig {
                after: 1,
                cooldown_calls: 0,
                cooldown_ms: 0,
            },
            std::iter::empty(),
        )
    }
}

impl Run {
    /// A new run under `config` (validated).
    pub fn new(config: ControllerConfig) -> Result<Run, ConfigError> {
        Ok(Run::from_controller(Controller::new(config)?))
    }

    fn from_controller(ctl: Controller) -> Run {
        Run {
            ctl,
            calls: BTreeMap::new(),
            queue: VecDeque::new(),
            call_events: Vec::new(),
            ungrounded: None,
            offered: Vec::new(),
            tool_returned: false,
            announce_reasks: 0,
        }
    }

    /// Takes one input; what it calls for is queued for [`Run::poll`].
    pub fn handle(&mut self, input: Input<'_>, env: &mut Env<'_>) {
        let now = env.now_ms;
        match input {
            Input::Offered(tools) => {
                self.offered = tools.iter().map(|t| (*t).to_owned()).collect();
                self.ctl.offer(tools.iter().copied());
            }
            Input::CallStarted {
                call,
                targets,
                mode,
                retry_safe,
            } => {
                if !self.calls.contains_key(&call)
                    && self.calls.len() >= MAX_IN_FLIGHT
                    && let Some((&oldest, _)) = self.calls.iter().next()
                {
                    self.end_call(oldest);
                    self.give_up_unknown(oldest);
                }
                let mut plan = CallPlan::new(targets, mode, retry_safe);
                let step = plan.begin(env.breakers, now);
                self.drain_plan(call, &mut plan, now);
                self.calls.insert(call, InFlight { plan, wait: None });
                self.step(call, step, now);
            }
            Input::AttemptSucceeded { call } => {
                if let Some(mut f) = self.end_call(call) {
                    f.plan.succeeded(env.breakers);
                    self.drain_plan(call, &mut f.plan, now);
                }
            }
            Input::AttemptFailed {
                call,
                signal,
                offer,
            } => {
                let Some(f) = self.calls.get_mut(&call) else {
                    // No such call in flight: nothing to decide for it. Giving up is the safe
                    // reading of an input out of order.
                    self.give_up_unknown(call);
                    return;
                };
                f.wait = None;
                f.plan.offer(offer);
                let (plane, ledger) = self.ctl.plane_and_ledger();
                let step = f
                    .plan
                    .failed(signal, plane, env.breakers, ledger, now, env.rng);
                if let Some(mut f) = self.calls.remove(&call) {
                    self.drain_plan(call, &mut f.plan, now);
                    self.calls.insert(call, f);
                }
                self.step(call, step, now);
            }
            Input::Tick { call } => {
                let due: Vec<(CallId, usize)> = self
                    .calls
                    .iter_mut()
                    .filter(|(id, _)| call.is_none_or(|c| c == **id))
                    .filter_map(|(&id, f)| {
                        let w = f.wait.filter(|w| w.at_ms <= now)?;
                        f.wait = None;
                        Some((id, w.target))
                    })
                    .collect();
                for (id, target) in due {
                    self.send(id, target, false);
                }
            }
            Input::UserTurn => {
                self.announce_reasks = 0;
                self.ctl.user_turn();
            }
            Input::CallsUnusable {
                signal,
                fallback,
                state,
            } => {
                let (plane, ledger) = self.ctl.plane_and_ledger();
                let (decision, next, event) =
                    crate::call::reask_signal(signal, fallback, plane, ledger, state, env.rng);
                if let Event::Action { action, .. } = &event
                    && decision != Reask::Partial
                {
                    // The re-ask is a recovery of the run's, counted as its own: a recovered
                    // run is read again before it answers and claims nothing under
                    // `claim_after_recovery = false`.
                    self.ctl.carried_out(action);
                }
                self.note(now, event);
                self.queue.push_back(match decision {
                    Reask::Ask | Reask::Escalate => Action::Reask {
                        next,
                        escalate: decision == Reask::Escalate,
                    },
                    Reask::Partial => Action::Answer {
                        status: RunStatus::Partial,
                        reason: Some("the model's tool calls could not be used".to_owned()),
                    },
                });
            }
            Input::StreamBroke { after_content } => {
                let (plane, ledger) = self.ctl.plane_and_ledger();
                let (decision, event) =
                    crate::call::stream_broke(after_content, plane, ledger, env.rng);
                self.note(now, event);
                self.queue.push_back(match decision {
                    crate::call::StreamBreak::Reissue => Action::Reissue,
                    crate::call::StreamBreak::Fail => Action::EndStream,
                });
            }
            Input::Observed(obs) => {
                if let Observation::ToolFinished {
                    call, signal: None, ..
                } = &obs
                    && matches!(call.outcome, crate::monitor::CallOutcome::Returned(_))
                {
                    self.tool_returned = true;
                }
                let d = self.ctl.observe(obs, now, env.rng);
                self.directive(d);
            }
            Input::NextTurn => {
                let d = self.ctl.guidance(now);
                self.directive(d);
            }
            Input::AnswerProposed { by, answer } => {
                if let Some(a) = answer {
                    self.ungrounded = self.grounding(by, a);
                }
                if self.ctl.stopped().is_some() {
                    let d = self.ctl.guidance(now);
                    self.directive(d);
                } else if let Some(said) = answer
                    .filter(|a| a.may_call)
                    .and_then(|a| self.announced_reask(a.text, now))
                {
                    self.queue.push_back(Action::AskAgain {
                        guidance: said.guidance(),
                        reason: said.reason(),
                    });
                } else if self.ctl.reread_due() {
                    self.queue.push_back(Action::ReadAgain {
                        reads: self.ctl.reread_reads(),
                    });
                } else {
                    let reason = self.ctl.unclaimable(by).or_else(|| self.ungrounded.clone());
                    let status = if reason.is_some() {
                        RunStatus::Partial
                    } else {
                        RunStatus::Complete
                    };
                    self.queue.push_back(Action::Answer { status, reason });
                }
            }
        }
    }

    /// [`Run::handle`], then every action it calls for, oldest first.
    pub fn decide(&mut self, input: Input<'_>, env: &mut Env<'_>) -> Vec<Action> {
        self.handle(input, env);
        // The queue's buffer goes with its actions (in place): a run kept between requests
        // holds no allocation for an empty queue.
        std::mem::take(&mut self.queue).into()
    }

    /// [`Run::decide`] for an input about a step ([`Input::Observed`], [`Input::NextTurn`]),
    /// whose answer is one [`StepAction`]. Any other action (none is asked of such an input)
    /// stops the run as failed, naming it: the safe reading of a bug, decided here once for
    /// every front-end.
    pub fn decide_step(&mut self, input: Input<'_>, env: &mut Env<'_>) -> StepAction {
        let actions = self.decide(input, env);
        let mut step = None;
        for a in actions {
            step = Some(match a {
                Action::Proceed {
                    guidance,
                    hidden_tools,
                } => StepAction::Proceed {
                    guidance,
                    hidden_tools,
                },
                Action::Recover {
                    step,
                    class,
                    action,
                } => StepAction::Recover {
                    step,
                    class,
                    action,
                },
                Action::Stop { status, reason } => StepAction::Stop { status, reason },
                other @ (Action::Send { .. }
                | Action::Repair { .. }
                | Action::GiveUp { .. }
                | Action::Reask { .. }
                | Action::Reissue
                | Action::EndStream
                | Action::ReadAgain { .. }
                | Action::AskAgain { .. }
                | Action::Answer { .. }) => StepAction::Stop {
                    status: RunStatus::Failed,
                    reason: format!("the run asked for {other:?} on a step"),
                },
            });
        }
        step.unwrap_or_else(|| StepAction::Stop {
            status: RunStatus::Failed,
            reason: "the run decided nothing on a step".to_owned(),
        })
    }

    /// The decision records (signal, classification, action with its inputs, a tool routed
    /// around, an answer asked again for) of everything decided since the last time — tool
    /// failures, calls, re-asks, with their times, oldest first: what a front-end writes to its
    /// own trace so `selfheal trace replay` can decide them again.
    pub fn take_records(&mut self) -> Vec<(u64, Event)> {
        self.ctl.take_decisions()
    }

    /// The monitor's verdict now (warnings, hidden tools, the abort rule) without deciding
    /// anything: what the next model step is told.
    pub fn verdict(&mut self, now_ms: u64) -> Verdict {
        self.ctl.verdict(now_ms)
    }

    /// Why an answer given now could not be claimed complete (see
    /// [`Controller::unclaimable`]), without proposing it.
    pub fn unclaimable(&self, by: StepsBy) -> Option<String> {
        self.ctl.unclaimable(by)
    }

    /// Why `answer`, given now, could not be claimed complete: [`Run::unclaimable`], else the
    /// grounding rule over its text and evidence (`answer_grounding`) —
    /// what [`Input::AnswerProposed`] with that answer decides, without proposing it (a
    /// front-end that answers while the run goes on, the gateway, flags its answer so).
    pub fn unclaimable_answer(&self, by: StepsBy, answer: Option<Proposed<'_>>) -> Option<String> {
        self.ctl
            .unclaimable(by)
            .or_else(|| answer.and_then(|a| self.grounding(by, a)))
    }

    /// Whether the run asks the model again before taking `text` as its final answer: the
    /// answer announces a call of an offered tool instead of making it
    /// ([`crate::announce::announced_call`]) and this user turn has not been re-asked for one
    /// yet ([`MAX_ANNOUNCE_REASKS`]). If so, the guidance to append, and the re-ask is counted;
    /// an answer asked again for is judged as any other when it comes back
    /// ([`Run::unclaimable_answer`] flags one that announces a call again). What
    /// [`Input::AnswerProposed`] decides first, for a front-end that answers while the run goes
    /// on (the gateway). Recorded at `now_ms` ([`Event::AskAgain`], in [`Run::take_records`]).
    pub fn ask_again(&mut self, text: &str, now_ms: u64) -> Option<String> {
        self.announced_reask(text, now_ms).map(|a| a.guidance())
    }

    /// The announced call of `text`, when the run asks again for it (see [`Run::ask_again`]):
    /// counted, and recorded as the run's decision ([`Event::AskAgain`]).
    fn announced_reask(&mut self, text: &str, now: u64) -> Option<crate::announce::Announced> {
        if self.announce_reasks >= MAX_ANNOUNCE_REASKS {
            return None;
        }
        let said = self.announced(text)?;
        self.announce_reasks += 1;
        self.note(
            now,
            Event::AskAgain {
                tool: said.tool.clone(),
                reason: said.reason(),
            },
        );
        Some(said)
    }

    /// The call of an offered tool `text` announces instead of making it, if any.
    fn announced(&self, text: &str) -> Option<crate::announce::Announced> {
        let offered: Vec<&str> = self.offered.iter().map(String::as_str).collect();
        crate::announce::announced_call(text, &offered)
    }

    /// Why a proposed answer cannot be claimed, in a run that was offered tools: it announces a
    /// call instead of making it ([`crate::announce`]); in a run that owns its task
    /// ([`StepsBy::Plan`]), no tool of the run returned a result, so nothing stands behind it;
    /// or it states a number found in no input or tool result (the grounding rule).
    fn grounding(&self, by: StepsBy, a: Proposed<'_>) -> Option<String> {
        if self.offered.is_empty() {
            return None;
        }
        if let Some(said) = a.may_call.then(|| self.announced(a.text)).flatten() {
            return Some(said.reason());
        }
        if by == StepsBy::Plan && !self.tool_returned {
            return Some(NO_TOOL_RESULT.to_owned());
        }
        crate::verifier::answer_grounding(a.text, a.evidence)
    }

    /// Whether the run stopped, how and why.
    pub fn stopped(&self) -> Option<(RunStatus, &str)> {
        self.ctl.stop_reason()
    }

    /// The next thing to do, oldest first; `None` when there is nothing until the next input
    /// (or [`Run::next_deadline`]).
    pub fn poll(&mut self) -> Option<Action> {
        let action = self.queue.pop_front();
        if self.queue.is_empty() && self.queue.capacity() > 0 {
            // A front-end keeps thousands of runs between requests, each with its queue
            // drained: an empty queue holds no allocation.
            self.queue = VecDeque::new();
        }
        action
    }

    /// Removes call `call`'s plan. A map left empty lets go of its node: a B-tree keeps its
    /// emptied root leaf (~1.5 KB of plans), and a gateway holds tens of thousands of runs
    /// whose calls have all ended.
    fn end_call(&mut self, call: CallId) -> Option<InFlight> {
        let f = self.calls.remove(&call);
        if self.calls.is_empty() {
            self.calls = BTreeMap::new();
        }
        f
    }

    /// When the run next wants [`Input::Tick`]: the earliest end of a retry's wait.
    pub fn next_deadline(&self) -> Option<u64> {
        self.calls
            .values()
            .filter_map(|f| f.wait.map(|w| w.at_ms))
            .min()
    }

    /// What call `call`'s plan did (retries, fall-backs, skips), oldest first; drains them.
    pub fn take_call_events(&mut self, call: CallId) -> Vec<CallEvent> {
        let (mine, rest) = std::mem::take(&mut self.call_events)
            .into_iter()
            .partition(|(id, _)| *id == call);
        self.call_events = rest;
        mine.into_iter().map(|(_, e)| e).collect()
    }

    /// When call `call`'s retry is due, if it waits for one.
    pub fn deadline_of(&self, call: CallId) -> Option<u64> {
        self.calls.get(&call).and_then(|f| f.wait.map(|w| w.at_ms))
    }

    /// Whether call `call` has taken a recovery action (what it returns next is a recovered
    /// value).
    pub fn call_recovered(&self, call: CallId) -> bool {
        self.calls.get(&call).is_some_and(|f| f.plan.recovered())
    }

    /// Ends call `call` without a result (the client went away): its plan and its events are
    /// dropped.
    pub fn forget_call(&mut self, call: CallId) {
        self.end_call(call);
        self.call_events.retain(|(id, _)| *id != call);
    }

    /// Ends the run and returns its typed outcome: a run the controller ends `complete` whose
    /// last answer proposed with its text failed the grounding rule ends `partial`, with why.
    pub fn finish(&mut self, now_ms: u64) -> RunOutcome {
        self.calls.clear();
        let mut outcome = self.ctl.finish(now_ms);
        if outcome.status == RunStatus::Complete
            && let Some(why) = self.ungrounded.clone()
        {
            outcome.status = RunStatus::Partial;
            outcome.reason = Some(why);
        }
        outcome
    }

    /// The evidence about its sources this run saw since the last call, for the front-end's
    /// trust store ([`crate::trust::Trust::apply`]).
    pub fn take_trust_evidence(&mut self) -> Vec<crate::trust::Report> {
        self.ctl.take_trust_reports()
    }

    /// The run's trace.
    pub fn trace(&self) -> &Trace {
        self.ctl.trace()
    }

    /// The run's budget ledger.
    pub fn ledger(&self) -> &BudgetLedger {
        self.ctl.ledger()
    }

    /// Adds spending that happened in another copy of this run — a front-end that keeps the run
    /// in a shared store and lost a compare-and-set re-applies its own request's spending on the
    /// fresher state. Recorded like usage already spent: never refused, even past a limit (the
    /// next decision sees the budget as it is).
    pub fn add_spent(&mut self, spent: &Amounts) {
        self.ctl.add_spent(spent);
    }

    /// The run's monitor.
    pub fn monitor(&self) -> &Monitor {
        self.ctl.monitor()
    }

    /// Steps whose value changed when read again before answering (see
    /// [`Controller::contested`]): a front-end whose retry of such a step brings back the first
    /// reading, or agrees with the differing one, reports that as a verifier's acceptance.
    pub fn contested(&self) -> &[Option<u32>] {
        self.ctl.contested()
    }

    /// The tools whose failures are routed around now.
    pub fn routed(&self) -> &[String] {
        self.ctl.routed()
    }

    /// The failures left unresolved so far (not the one being recovered now).
    pub fn unresolved(&self) -> &[Unresolved] {
        self.ctl.unresolved()
    }

    /// The failures that would be reported unresolved if the run ended now.
    pub fn unsettled(&self) -> Vec<Unresolved> {
        self.ctl.unsettled()
    }

    /// Budget dimensions that are spent.
    pub fn spent_dimensions(&self) -> Vec<Dimension> {
        self.ctl.spent_dimensions()
    }

    /// The run's copy of the front-end's trust store, with this run's evidence in it.
    pub fn trust(&self) -> &crate::trust::Trust {
        self.ctl.trust()
    }

    /// The run's state, for a store.
    pub fn snapshot(&self) -> RunSnapshot {
        RunSnapshot {
            version: STATE_VERSION,
            ctl: self.ctl.clone(),
            calls: self.calls.clone(),
            queue: self.queue.clone(),
            call_events: self.call_events.clone(),
            announce_reasks: self.announce_reasks,
        }
    }

    /// The run's state as bytes (JSON), for a store.
    pub fn to_bytes(&self) -> Result<Vec<u8>, serde_json::Error> {
        serde_json::to_vec(&self.snapshot())
    }

    /// A run from a snapshot, under this process's `config` (the snapshot holds no
    /// configuration: the policy, the classifier and the monitor's thresholds are `config`'s;
    /// the budget limits and trace capacity stay the run's own). The run's trust is
    /// `config.trust` — the resuming process's store — with every source the run saw brought
    /// up to at least the run's own evidence ([`crate::trust::Trust::cover`]).
    pub fn resume(snapshot: RunSnapshot, config: ControllerConfig) -> Result<Run, ResumeError> {
        if snapshot.version != STATE_VERSION {
            return Err(ResumeError::Version {
                found: snapshot.version,
                expected: STATE_VERSION,
            });
        }
        let mut ctl = snapshot.ctl;
        ctl.reattach(config)?;
        Ok(Run {
            ctl,
            calls: snapshot.calls,
            queue: snapshot.queue,
            call_events: snapshot.call_events,
            ungrounded: None,
            offered: Vec::new(),
            tool_returned: false,
            announce_reasks: snapshot.announce_reasks,
        })
    }

    /// A run from [`Run::to_bytes`]'s bytes (see [`Run::resume`]).
    pub fn from_bytes(bytes: &[u8], config: ControllerConfig) -> Result<Run, ResumeError> {
        let snapshot: RunSnapshot = serde_json::from_slice(bytes)?;
        Run::resume(snapshot, config)
    }

    /// Writes a decision record to the trace (and so to the front-end's outbox).
    fn note(&mut self, now: u64, event: Event) {
        self.ctl.record(now, event);
    }

    fn drain_plan(&mut self, call: CallId, plan: &mut CallPlan, now: u64) {
        for e in plan.take_records() {
            self.note(now, e);
        }
        if self.call_events.len() < MAX_CALL_EVENTS {
            self.call_events
                .extend(plan.take_events().into_iter().map(|e| (call, e)));
        }
    }

    fn give_up_unknown(&mut self, call: CallId) {
        self.queue.push_back(Action::GiveUp {
            call,
            stop: Stop::Exhausted {
                class: None,
                action: crate::policy::ActionKind::Terminate,
            },
        });
    }

    fn send(&mut self, call: CallId, target: usize, refresh: bool) {
        let name = self
            .calls
            .get(&call)
            .and_then(|f| f.plan.target_name(target))
            .unwrap_or_default()
            .to_owned();
        self.queue.push_back(Action::Send {
            call,
            target,
            name,
            refresh,
        });
    }

    fn step(&mut self, call: CallId, step: Step, now: u64) {
        match step {
            Step::Send { target } => self.send(call, target, false),
            Step::Refresh { target } => self.send(call, target, true),
            Step::Wait {
                target,
                delay_ms: 0,
            } => self.send(call, target, false),
            Step::Wait { target, delay_ms } => {
                if let Some(f) = self.calls.get_mut(&call) {
                    f.wait = Some(Wait {
                        target,
                        at_ms: now.saturating_add(delay_ms),
                    });
                }
            }
            Step::Repair { target } => self.queue.push_back(Action::Repair { call, target }),
            Step::Stop(stop) => {
                self.end_call(call);
                self.queue.push_back(Action::GiveUp { call, stop });
            }
        }
    }

    fn directive(&mut self, d: Directive) {
        let action = match d {
            Directive::Continue {
                guidance,
                hidden_tools,
            } => Action::Proceed {
                guidance,
                hidden_tools,
            },
            Directive::Recover {
                step,
                class,
                action,
            } => Action::Recover {
                step,
                class,
                action,
            },
            Directive::Degrade { reason } => Action::Stop {
                status: RunStatus::Partial,
                reason,
            },
            Directive::Abort { reason } => Action::Stop {
                status: self.ctl.stopped().unwrap_or(RunStatus::Failed),
                reason,
            },
        };
        self.queue.push_back(action);
    }
}
