//! # selfheal-core — the reliability control plane, sans I/O
//!
//! Tool-using agents get stuck: they call a failing tool ten times, send empty or duplicate calls,
//! accept wrong-but-plausible output and burn their budget. This crate *decides* what to do about
//! it; the runtime, the gateway and the benchmark *act*. It is synchronous, does no I/O and reads
//! no clock: time arrives as `now_ms` arguments and randomness through [`rng::Rng`], so every
//! decision is reproducible.
//!
//! ```text
//!  monitor ──▶ detect ──▶ classify ──▶ policy ──▶ budget ──▶ (act) ──▶ verify
//!     ▲                                                                   │
//!     └──────────────────────────── trace ◀───────────────────────────────┘
//! ```
//!
//! | module | component |
//! |---|---|
//! | [`monitor`] | tool-health monitor: streaks, circuits, duplicates, empty input, loops, abort |
//! | [`classifier`] | signals → one of eleven [`FailureClass`]es and four coarse error types |
//! | [`policy`] | class → ladder of [`RecoveryAction`]s, cheapest feasible first; TOML-loadable |
//! | [`budget`] | one ledger per run over every budget dimension |
//! | [`verifier`] | accept / reject / uncertain; rejection is a recoverable failure |
//! | [`announce`] | a final answer that announces or writes a tool call instead of making it |
//! | [`contract`] | a tool's output contract: declared fields (drift, empty) and `as_of` freshness |
//! | [`trace`] | typed, bounded, versioned JSON Lines trace; healing rate |
//! | [`controller`] | routes observations to directives; owns no policy |
//! | [`call`] | one call across retries and a fallback chain: the front-ends' decision surface |
//! | [`breaker`] | the one circuit breaker, per tool (monitor) and per upstream (gateway) |
//! | [`run`] | one run behind one interface: inputs in, actions out, state that serialises |
//! | [`trust`] | per-source trust learned from evidence, decaying; read by the policy's `risk` |
//! | [`replay`] | recorded decisions made again under another policy (`selfheal trace replay`) |
//! | `conformance` | (feature `conformance`, tests only) the table every front-end must reproduce |
//!
//! ```
//! use selfheal_core::monitor::{Monitor, ToolCall};
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

pub mod announce;
pub mod breaker;
pub mod budget;
pub mod call;
pub mod classifier;
#[cfg(feature = "conformance")]
pub mod conformance;
pub mod contract;
pub mod controller;
pub mod degenerate;
pub mod monitor;
pub mod policy;
pub mod replay;
pub mod rng;
pub mod run;
pub mod trace;
pub mod trust;
pub mod verifier;

pub use budget::{Amounts, BudgetLedger, BudgetLimits, Dimension};
pub use classifier::{Classification, Classifier, ErrorType, FailureClass, Signal};
pub use controller::{Controller, ControllerConfig, Directive, Observation, RunOutcome};
pub use monitor::{Badge, Monitor, MonitorConfig, ToolCall, Verdict};
pub use policy::{ActionKind, Decision, Options, Policy, RecoveryAction};
pub use run::{Action, Input, Run};
pub use trace::{RunStatus, Trace};
pub use verifier::{Judgement, Verifier};
