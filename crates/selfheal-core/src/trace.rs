//! The observability layer: every signal, class, action, budget change and verdict, in order.
//!
//! A trace is what makes recovery auditable ("why did it retry three times?"), tunable (replay a
//! run against a new policy) and measurable (the healing rate). Events are typed; the ring has a
//! fixed capacity and counts what it drops, so a runaway run cannot exhaust memory.
//!
//! # JSON Lines schema, version 1
//! One JSON object per line. Every line has `v` (schema version, `1`), `seq` (0-based, gap-free
//! per run even when older events were dropped), `t_ms` (the run's clock), `step` (plan step or
//! `null`) and `event`, one of:
//!
//! | `event` | fields |
//! |---|---|
//! | `signal` | `tool`, `signal` (a [`Signal`], tagged by `signal`) |
//! | `classified` | `class`, `error_type`, `retry_after_ms` |
//! | `action` | `class`, `action` (a [`RecoveryAction`], tagged by `action`), `rung`, `budget_before`, `budget_after`, and `input` (a [`DecisionInput`]: what the decision was made from, so `selfheal trace replay` can make it again under another policy) |
//! | `budget_exhausted` | `dimension` |
//! | `verdict` | `verifier`, `judgement` (tagged by `verdict`: `accept`, `reject` + `reason`, `uncertain` + `reason`) |
//! | `monitor` | `tool`, `badge`, `signals` |
//! | `cost` | `model_calls`, `tool_calls`, `verifier_calls`, `tokens` |
//! | `ask_again` | `tool`, `reason`: the answer announced a call of `tool` instead of making it, and the model is asked again |
//! | `finished` | `status` (`complete`, `partial`, `failed`), `reason` |
//!
//! New fields and new events may be added within a version; removing or renaming one bumps `v`.

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

use crate::budget::{Amounts, Dimension};
use crate::classifier::{ErrorType, FailureClass, Signal};
use crate::monitor::Badge;
use crate::policy::{LadderState, Options, RecoveryAction};
use crate::verifier::Judgement;

/// The version of the trace's JSON Lines schema.
pub(crate) const TRACE_SCHEMA_VERSION: u32 = 1;

/// How a run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunStatus {
    /// The task was done and verified.
    Complete,
    /// Part of the task was done; the rest is reported as unresolved.
    Partial,
    /// Nothing usable was produced.
    Failed,
}

/// Which decision function made a decision, so a replay makes it the same way.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Surface {
    /// [`crate::policy::Policy::decide`] through the [`crate::controller::Controller`].
    Controller,
    /// The call plan (`CallPlan`): the policy plus the call rules (forced fall-backs).
    Call,
    /// [`crate::call::stream_broke`]: the policy plus the stream rule (a break before any
    /// content re-issued whatever the budget).
    Stream,
}

/// Everything a recovery decision was made from: replaying it under another policy needs
/// nothing else.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DecisionInput {
    /// The decision function.
    pub surface: Surface,
    /// What was observed.
    pub signal: Signal,
    /// Consecutive failures of the same tool or target, this one included (the classifier's
    /// context).
    pub consecutive: u32,
    /// The failure's place on its ladder before the decision.
    pub ladder: LadderState,
    /// What recovery was possible.
    pub options: Options,
    /// The run's budget limits.
    pub limits: Amounts,
    /// What the run had spent before the decision.
    pub spent: Amounts,
}

/// One event of a trace.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum Event {
    /// The data plane observed a signal.
    Signal {
        /// The tool concerned, if any.
        tool: Option<String>,
        /// What was observed.
        signal: Signal,
    },
    /// The classifier inferred a class.
    Classified {
        /// The class.
        class: FailureClass,
        /// The coarse error type.
        error_type: ErrorType,
        /// `Retry-After`, if one was given.
        retry_after_ms: Option<u64>,
    },
    /// The policy chose a recovery action, and the ledger was charged.
    Action {
        /// The failure class it answers.
        class: FailureClass,
        /// The action.
        action: RecoveryAction,
        /// The ladder rung it came from.
        rung: Option<usize>,
        /// Budget remaining before the charge.
        budget_before: Amounts,
        /// Budget remaining after the charge.
        budget_after: Amounts,
        /// What the decision was made from (absent in traces written before it was recorded).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        input: Option<Box<DecisionInput>>,
    },
    /// A budget dimension ran out.
    BudgetExhausted {
        /// Which one.
        dimension: Dimension,
    },
    /// A verifier judged a result.
    Verdict {
        /// The verifier's name.
        verifier: String,
        /// Its judgement.
        judgement: Judgement,
    },
    /// The monitor badged a call.
    Monitor {
        /// The tool.
        tool: String,
        /// The badge.
        badge: Badge,
        /// The signals' names.
        signals: Vec<String>,
    },
    /// Costs incurred.
    Cost {
        /// Model calls.
        model_calls: u64,
        /// Tool calls.
        tool_calls: u64,
        /// Verifier calls.
        verifier_calls: u64,
        /// Tokens.
        tokens: u64,
    },
    /// A tool's failure was handed to the monitor instead of ending the run: its class's ladder
    /// was used up, and other tools are on offer ([`crate::controller::Controller::offer`]).
    /// From here the tool's failures are the monitor's (warning, breaker, failure-rate abort).
    RoutedAround {
        /// The failing tool.
        tool: String,
        /// The tools on offer the agent can use instead.
        alternatives: Vec<String>,
        /// The failure's class.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        class: Option<FailureClass>,
        /// The end of its ladder that routing around stood in for (degrade or terminate).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        ladder_end: Option<RecoveryAction>,
        /// What the policy decided from, so a replay can decide it again (see
        /// [`crate::replay`]): another policy that would still recover does not route around.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        input: Option<Box<DecisionInput>>,
    },
    /// The run asked the model again instead of taking its answer: the answer announces a
    /// call of an offered tool instead of making it ([`crate::announce::announced_call`]; the
    /// run's [`crate::Action::AskAgain`]).
    AskAgain {
        /// The tool the answer named.
        tool: String,
        /// Why the answer was not taken.
        reason: String,
    },
    /// The run ended.
    Finished {
        /// How.
        status: RunStatus,
        /// Why, when not complete.
        reason: Option<String>,
    },
}

impl Event {
    /// The event's name, as its `event` tag in JSON (`signal`, `action`, ...).
    pub fn kind(&self) -> &'static str {
        Kind::from(self).as_str()
    }
}

/// The kind of every event a front-end records: the core's own events (their detail is the
/// [`Event`] itself) and the front-ends' observations and the actions they carried out.
///
/// One closed set, so a front-end cannot write a kind nobody reads, and [`Kind::is_action`]
/// (what `selfheal trace list` counts) is decided by a `match` that a new kind must pass.
/// Written as the snake-case name (`tool_result`, `invalid_arguments`, ...).
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    strum::IntoStaticStr,
    strum::Display,
    strum::EnumString,
    strum::EnumIter,
    strum::EnumCount,
)]
#[strum(serialize_all = "snake_case")]
pub enum Kind {
    /// The core's [`Event::Signal`].
    Signal,
    /// The core's [`Event::Classified`].
    Classified,
    /// The core's [`Event::Action`]: a decision with its input.
    Action,
    /// The core's [`Event::BudgetExhausted`].
    BudgetExhausted,
    /// The core's [`Event::Verdict`].
    Verdict,
    /// The core's [`Event::Monitor`].
    Monitor,
    /// The core's [`Event::Cost`].
    Cost,
    /// The core's [`Event::RoutedAround`].
    RoutedAround,
    /// The core's [`Event::AskAgain`].
    AskAgain,
    /// The core's [`Event::Finished`].
    Finished,
    /// A model request reached the gateway.
    Request,
    /// A tool's result was read (from the history, or from an MCP server).
    ToolResult,
    /// The gateway answered a request (with the run's summary).
    Response,
    /// An MCP proxy session started or ended.
    Session,
    /// An upstream attempt failed.
    UpstreamError,
    /// An upstream stream broke.
    StreamBroken,
    /// A model's tool call could not be used.
    InvalidCall,
    /// An MCP line was longer than the proxy reads.
    LineTooLong,
    /// The MCP server exited.
    ServerClosed,
    /// A paused MCP tool was offered again.
    Resumed,
    /// An MCP call ran past its deadline.
    Timeout,
    /// An upstream was skipped while its circuit is open.
    CooldownSkip,
    /// The gateway learned that an upstream model cannot stream tool calls.
    LearnNoStream,
    /// The run's controller directed recoveries for the tool results it observed (the list;
    /// each is recorded again as the action carried out).
    Recover,
    /// Guidance was added to the conversation.
    Guidance,
    /// Tools were hidden from the model.
    Hide,
    /// The run was stopped.
    Abort,
    /// A tool call's arguments were repaired.
    Repair,
    /// The model was asked again.
    Reask,
    /// A call was sent again.
    Retry,
    /// A call moved to the next target.
    Fallback,
    /// A broken stream was asked again.
    Reissue,
    /// A request went to the fallback model at the ladder's escalation.
    Escalate,
    /// An MCP call was refused before it reached the server.
    Blocked,
    /// An MCP call's arguments were refused with a re-ask.
    InvalidArguments,
    /// An MCP tool was paused.
    Paused,
}

impl Kind {
    /// The name it is written as.
    pub fn as_str(self) -> &'static str {
        self.into()
    }

    /// Whether this is a healing action a front-end carried out (what `selfheal trace list`
    /// counts): the decisions' effects, not the observations or the core's decision records.
    pub fn is_action(self) -> bool {
        match self {
            Kind::Guidance
            | Kind::Hide
            | Kind::Abort
            | Kind::Repair
            | Kind::Reask
            | Kind::Retry
            | Kind::Fallback
            | Kind::Blocked
            | Kind::InvalidArguments
            | Kind::Paused
            | Kind::Escalate => true,
            Kind::Signal
            | Kind::Classified
            | Kind::Action
            | Kind::BudgetExhausted
            | Kind::Verdict
            | Kind::Monitor
            | Kind::Cost
            | Kind::RoutedAround
            | Kind::AskAgain
            | Kind::Finished
            | Kind::Request
            | Kind::ToolResult
            | Kind::Response
            | Kind::Session
            | Kind::UpstreamError
            | Kind::StreamBroken
            | Kind::InvalidCall
            | Kind::LineTooLong
            | Kind::ServerClosed
            | Kind::Resumed
            | Kind::Timeout
            | Kind::CooldownSkip
            | Kind::LearnNoStream
            | Kind::Recover
            | Kind::Reissue => false,
        }
    }
}

impl From<&Event> for Kind {
    fn from(e: &Event) -> Kind {
        match e {
            Event::Signal { .. } => Kind::Signal,
            Event::Classified { .. } => Kind::Classified,
            Event::Action { .. } => Kind::Action,
            Event::BudgetExhausted { .. } => Kind::BudgetExhausted,
            Event::Verdict { .. } => Kind::Verdict,
            Event::Monitor { .. } => Kind::Monitor,
            Event::Cost { .. } => Kind::Cost,
            Event::RoutedAround { .. } => Kind::RoutedAround,
            Event::AskAgain { .. } => Kind::AskAgain,
            Event::Finished { .. } => Kind::Finished,
        }
    }
}

/// An event with its envelope.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Record {
    /// Schema version.
    pub v: u32,
    /// Sequence number within the run.
    pub seq: u64,
    /// The run's clock, in milliseconds.
    pub t_ms: u64,
    /// The plan step, if any.
    pub step: Option<u32>,
    /// The event.
    #[serde(flatten)]
    pub event: Event,
}

/// The share of calls that needed healing, with an alert threshold. A high rate means an
/// upstream problem to fix at the source, not something to keep healing.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct HealingRate {
    /// Calls observed.
    pub calls: u64,
    /// Calls that needed a recovery action.
    pub healed: u64,
    /// Alert when the rate exceeds this fraction (default 0.10).
    pub alert_threshold: f64,
}

impl Default for HealingRate {
    fn default() -> Self {
        HealingRate {
            calls: 0,
            healed: 0,
            alert_threshold: 0.10,
        }
    }
}

impl HealingRate {
    /// The rate, in `[0, 1]` (0 with no calls). Capped at 1: verifier rejections are healed
    /// without being calls, so `healed` may exceed `calls`.
    pub fn rate(&self) -> f64 {
        if self.calls == 0 {
            0.0
        } else {
            (self.healed as f64 / self.calls as f64).min(1.0)
        }
    }

    /// Whether the rate is above the alert threshold.
    pub fn alert(&self) -> bool {
        self.rate() > self.alert_threshold
    }
}

/// A bounded, ordered trace of one run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Trace {
    ring: VecDeque<Record>,
    capacity: usize,
    next_seq: u64,
    dropped: u64,
    /// The run's healing rate.
    pub healing: HealingRate,
}

impl Default for Trace {
    fn default() -> Self {
        Trace::with_capacity(4096)
    }
}

impl Trace {
    /// A trace that keeps at most `capacity` events (at least 1).
    pub fn with_capacity(capacity: usize) -> Self {
        let capacity = capacity.max(1);
        Trace {
            // Grown as events come: a run that records few (most of a gateway's) holds little.
            ring: VecDeque::new(),
            capacity,
            next_seq: 0,
            dropped: 0,
            healing: HealingRate::default(),
        }
    }

    /// Appends an event, dropping the oldest when full.
    pub fn push(&mut self, t_ms: u64, step: Option<u32>, event: Event) {
        if self.ring.len() == self.capacity {
            self.ring.pop_front();
            self.dropped += 1;
        } else if self.ring.capacity() == 0 {
            // A small ring (a gateway's runs keep one event, ~200 bytes) gets exactly its room,
            // not the four a first push reserves; a large one grows as events come.
            self.ring.reserve_exact(self.capacity.min(16));
        }
        self.ring.push_back(Record {
            v: TRACE_SCHEMA_VERSION,
            seq: self.next_seq,
            t_ms,
            step,
            event,
        });
        self.next_seq += 1;
    }

    /// The events kept, oldest first.
    pub fn records(&self) -> impl ExactSizeIterator<Item = &Record> {
        self.ring.iter()
    }

    /// Events dropped because the ring was full.
    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    /// Events ever pushed.
    pub fn total(&self) -> u64 {
        self.next_seq
    }

    /// The kept events as JSON Lines (one object per line, each line ending in `\n`).
    pub fn to_jsonl(&self) -> String {
        let mut out = String::new();
        for r in &self.ring {
            // Serialising these plain data types cannot fail; skip rather than panic if it did.
            if let Ok(line) = serde_json::to_string(r) {
                out.push_str(&line);
                out.push('\n');
            }
        }
        out
    }

    /// Empties the trace, keeping its capacity and sequence numbers.
    pub fn clear(&mut self) {
        self.ring.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ring_drops_oldest_and_counts() {
        let mut t = Trace::with_capacity(2);
        for i in 0..5 {
            t.push(
                i,
                None,
                Event::BudgetExhausted {
                    dimension: Dimension::Retries,
                },
            );
        }
        assert_eq!(t.records().len(), 2);
        assert_eq!(t.dropped(), 3);
        assert_eq!(t.records().next().map(|r| r.seq), Some(3));
    }

    #[test]
    fn jsonl_snapshot_of_each_shape() {
        let mut t = Trace::default();
        t.push(
            5,
            Some(1),
            Event::Classified {
                class: FailureClass::ToolTimeout,
                error_type: ErrorType::Transient,
                retry_after_ms: Some(1000),
            },
        );
        t.push(
            6,
            Some(1),
            Event::Verdict {
                verifier: "schema".into(),
                judgement: Judgement::Reject {
                    reason: "at /a: x".into(),
                },
            },
        );
        t.push(
            7,
            None,
            Event::Finished {
                status: RunStatus::Partial,
                reason: Some("budget".into()),
            },
        );
        let expected = concat!(
            r#"{"v":1,"seq":0,"t_ms":5,"step":1,"event":"classified","class":"tool_timeout","error_type":"transient","retry_after_ms":1000}"#,
            "\n",
            r#"{"v":1,"seq":1,"t_ms":6,"step":1,"event":"verdict","verifier":"schema","judgement":{"verdict":"reject","reason":"at /a: x"}}"#,
            "\n",
            r#"{"v":1,"seq":2,"t_ms":7,"step":null,"event":"finished","status":"partial","reason":"budget"}"#,
            "\n"
        );
        assert_eq!(t.to_jsonl(), expected);
        // And it reads back.
        for line in expected.lines() {
            let r: Result<Record, _> = serde_json::from_str(line);
            assert!(r.is_ok(), "{line}");
        }
    }

    /// Each event's JSON tag is its [`Kind`]'s name, and every kind reads back from its name.
    #[test]
    fn an_events_kind_is_its_json_tag() {
        use strum::IntoEnumIterator;
        let events = [
            Event::Signal {
                tool: None,
                signal: Signal::Timeout,
            },
            Event::Classified {
                class: FailureClass::ToolTimeout,
                error_type: ErrorType::Transient,
                retry_after_ms: None,
            },
            Event::Action {
                class: FailureClass::ToolTimeout,
                action: RecoveryAction::Retry {
                    delay_ms: 1,
                    attempt: 1,
                },
                rung: Some(0),
                budget_before: Amounts::default(),
                budget_after: Amounts::default(),
                input: None,
            },
            Event::BudgetExhausted {
                dimension: Dimension::Retries,
            },
            Event::Verdict {
                verifier: "schema".into(),
                judgement: Judgement::Accept,
            },
            Event::Monitor {
                tool: "t".into(),
                badge: Badge::Ok,
                signals: vec![],
            },
            Event::Cost {
                model_calls: 1,
                tool_calls: 0,
                verifier_calls: 0,
                tokens: 0,
            },
            Event::RoutedAround {
                tool: "t".into(),
                alternatives: vec!["u".into()],
                class: Some(FailureClass::ToolUnavailable),
                ladder_end: Some(RecoveryAction::Degrade),
                input: None,
            },
            Event::Finished {
                status: RunStatus::Complete,
                reason: None,
            },
        ];
        for e in &events {
            let json = serde_json::to_value(e).unwrap();
            assert_eq!(json["event"], e.kind());
            assert_eq!(Kind::from(e).as_str(), e.kind());
        }
        for k in Kind::iter() {
            assert_eq!(k.as_str().parse::<Kind>().ok(), Some(k));
            assert_eq!(k.to_string(), k.as_str());
        }
        assert!(Kind::Retry.is_action() && !Kind::Action.is_action());
    }

    #[test]
    fn healing_rate_alerts_above_threshold() {
        let mut h = HealingRate {
            calls: 10,
            healed: 1,
            ..HealingRate::default()
        };
        assert!(!h.alert(), "exactly 10 % is not above 10 %");
        h.healed = 2;
        assert!(h.alert());
        assert_eq!(HealingRate::default().rate(), 0.0);
    }
}
