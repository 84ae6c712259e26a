//! # selfheal-core — the reliability control plane, sans I/O
//!
//! Tool-using agents get stuck: they call a failing tool ten times, send empty or duplicate calls,
//! accept wrong-but-plausible output and burn their budget. This crate *decides* what to do about
//! it; the runtime, the gateway and the benchmark *act*. It is synchronous, does no I/O and reads
//! no clock: time arrives as `now_ms` arguments and randomness through [`Rng`], so every
//! decision is reproducible.
//!
//! ```text
//!  monitor ──▶ detect ──▶ classify ──▶ policy ──▶ budget ──▶ (act) ──▶ verify
//!     ▲                                                                   │
//!     └──────────────────────────── trace ◀───────────────────────────────┘
//! ```
//!
//! # The public API
//!
//! The modules are private; what front-ends use is re-exported here at the root, so a
//! front-end writes `use selfheal_core::{Run, Input, Action}` and the crate can move code
//! between modules without breaking anyone. Two names that would clash are renamed: the call's
//! [`CallMode`] (heal or pass through) and the monitor's [`MonitorMode`] (autonomous or interactive);
//! the call's [`CallStop`] and [`CallOffer`], the trace's [`TraceEvent`],
//! [`TraceRecord`] and [`EventKind`], and the trust store's [`TrustReport`] and
//! [`SharedTrust`] carry their component in their name, since on their own they would say too
//! little. Three modules stay public because a namespace reads better there:
//!
//! - [`contract`]: free functions over a value and the fields its tool declares
//!   (`contract::breach`, `contract::stale`, `contract::map_renamed`) and the `[tools.NAME]`
//!   table ([`contract::ToolConfig`]);
//! - [`degenerate`]: the judge of a model's runaway output (`degenerate::judge`,
//!   `degenerate::signal`) and its `degenerate::Limits`;
//! - `conformance` (feature `conformance`, enabled only from `[dev-dependencies]`): the table
//!   every front-end's tests must reproduce, and its judge.
//!
//! | group | items | source |
//! |---|---|---|
//! | answers | [`announced_call`], [`Announced`], [`AnnounceForm`] | `announce.rs`: a final answer that announces or writes a tool call instead of making it |
//! | one run | [`Run`], [`Input`], [`Action`], [`StepAction`], [`Env`], [`Proposed`], [`CallId`], [`RunSnapshot`], [`ResumeError`], [`STATE_VERSION`] | `run.rs`: inputs in, actions out, state that serialises |
//! | one call | [`Breakers`], [`Plane`], [`CallMode`], [`CallOffer`], [`CallStop`], [`CallEvent`], [`ReaskState`], [`stream_broke`], [`abort_now`] | `call.rs`: one call across retries and a fallback chain |
//! | controller | [`Controller`], [`ControllerConfig`], [`Observation`], [`Directive`], [`RunOutcome`], [`StepsBy`], [`Unresolved`] | `controller.rs`: routes observations to directives; owns no policy |
//! | monitor | [`Monitor`], [`MonitorConfig`], [`MonitorMode`], [`ToolCall`], [`CallOutcome`], [`Verdict`], [`Guidance`], [`GuidanceKind`], [`Badge`], [`ConfigError`], [`canonical_hash`] | `monitor.rs`: streaks, circuits, duplicates, empty input, loops, abort |
//! | breaker | [`Breaker`], [`BreakerConfig`], [`CircuitState`] | `breaker.rs`: the one circuit breaker, per tool and per upstream |
//! | classifier | [`Signal`], [`FailureClass`], [`ErrorType`], [`Classifier`], [`ClassifierConfig`], [`ClassifyContext`], [`Classification`] | `classifier.rs`: signals → one of eleven classes |
//! | policy | [`Policy`], [`RecoveryAction`], [`ActionKind`], [`Options`], [`Decision`], [`RepairTarget`], [`EscalationTarget`], [`RetryConfig`], [`PolicyError`] | `policy.rs`: class → ladder of actions, cheapest feasible first; TOML-loadable |
//! | budget | [`BudgetLedger`], [`BudgetLimits`], [`Amounts`], [`Dimension`] | `budget.rs`: one ledger per run over every budget dimension |
//! | verifier | [`Verifier`], [`Judgement`], [`Subject`], [`SchemaVerifier`], [`EvidenceVerifier`], [`Tolerance`], [`cross_check`], [`ungrounded_arguments`], [`ungrounded_numbers`] | `verifier.rs`: accept / reject / uncertain; rejection is a recoverable failure |
//! | trust | [`Trust`], [`TrustConfig`], [`SharedTrust`], [`Source`], [`Evidence`], [`Posterior`], [`TrustReport`], [`TRUST_VERSION`] | `trust.rs`: per-source trust learned from evidence, decaying |
//! | trace | [`Trace`], [`TraceEvent`], [`TraceRecord`], [`EventKind`], [`RunStatus`] | `trace.rs`: typed, bounded, versioned JSON Lines trace |
//! | replay | [`replay()`], [`Comparison`] | `replay.rs`: recorded decisions made again under another policy |
//! | randomness | [`Rng`], [`SplitMix64`], [`ConstRng`] | `rng.rs`: injected, seeded |
//!
//! ```
//! use selfheal_core::{Monitor, ToolCall};
//! use serde_json::json;
//!
//! let mut monitor = Monitor::default();
//! let args = json!({"query": "rust"});
//! for _ in 0..5 {
//!     monitor.record(&ToolCall::failed("web_search", &args, "HTTP 503"), 0);
//! }
//! let verdict = monitor.check(0);
//! assert_eq!(verdict.hidden_tools, vec!["web_search".to_string()]);
//! assert!(verdict.abort.is_none());
//! ```

// A type a public item hands out but the root does not re-export is a hole in the curated API.
#![warn(unnameable_types)]

mod announce;
mod breaker;
mod budget;
mod call;
mod classifier;
#[cfg(feature = "conformance")]
pub mod conformance;
pub mod contract;
mod controller;
pub mod degenerate;
mod monitor;
mod policy;
mod replay;
mod rng;
mod run;
mod trace;
mod trust;
mod verifier;

pub use announce::{Announced, Form as AnnounceForm, announced_call};
pub use breaker::{Breaker, BreakerConfig, CircuitState};
pub use budget::{Amounts, BudgetLedger, BudgetLimits, Dimension, Exhausted as BudgetExhausted};
pub use call::{
    Breakers, CallEvent, Mode as CallMode, Offer as CallOffer, Plane, ReaskState, Stop as CallStop,
    StreamBreak, abort_now, stream_broke,
};
pub use classifier::{
    Classification, Classifier, ClassifierConfig, ClassifyContext, ErrorType, FailureClass, Signal,
};
pub use controller::{
    CROSS_CHECK_VERIFIER, Controller, ControllerConfig, Directive, Observation, REREAD_VERIFIER,
    RunOutcome, StepsBy, THIRD_READ_VERIFIER, Unresolved,
};
pub use monitor::{
    Badge, CallOutcome, CallReport, ConfigError, FailureKind, Guidance, GuidanceKind,
    MemoryFootprint, Mode as MonitorMode, Monitor, MonitorConfig, MonitorSignal, SignalSet,
    ToolCall, Verdict, canonical_hash,
};
pub use policy::{
    ActionKind, Decision, EscalationTarget, LadderState, Options, Policy, PolicyError,
    RecoveryAction, RepairTarget, RetryConfig, SkipReason,
};
pub use replay::{Comparison, replay};
pub use rng::{ConstRng, Rng, SplitMix64};
pub use run::{
    Action, CallId, Env, Input, NO_TOOL_RESULT, Proposed, ResumeError, Run, RunSnapshot,
    STATE_VERSION, StepAction,
};
pub use trace::{
    DecisionInput, Event as TraceEvent, HealingRate, Kind as EventKind, Record as TraceRecord,
    RunStatus, Surface, Trace,
};
pub use trust::{
    Evidence, MAX_SOURCES as MAX_TRUST_SOURCES, Posterior, Report as TrustReport,
    Shared as SharedTrust, Source, SourceKind, TRUST_VERSION, Trust, TrustConfig, TrustError,
};
pub use verifier::{
    EvidenceVerifier, Judgement, SchemaError, SchemaVerifier, SecondReading, SecondSource, Subject,
    Tolerance, Verifier, cross_check, cross_check_declared, judge_second_reading,
    ungrounded_arguments, ungrounded_numbers,
};
