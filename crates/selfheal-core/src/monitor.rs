//! The tool-health monitor (SPEC §1): `record` after every tool call, `check` before every model
//! step.
//!
//! Agents get stuck in a handful of recognisable ways: the same tool failing again and again, the
//! same call made twice, calls with empty or placeholder arguments, loops between two calls, and
//! runs where most calls fail. The monitor watches for each of them with fixed-size windows and
//! per-tool counters and answers with a [`Verdict`]: guidance for the next prompt, tools to hide,
//! or abort. It is the anchor of seed 000 with its flaws fixed:
//!
//! - streaks are **per tool**, so `A✗ B✓ A✗ B✓ A✗` still warns about `A`;
//! - an open circuit has a way back: cooldown (in calls or milliseconds) → half-open probe →
//!   closed on success, re-opened on failure;
//! - duplicates compare **canonical** arguments (key order and `1` vs `1.0` do not matter), and
//!   repeating a call that failed hard is a retry, not a duplicate;
//! - placeholders (`""`, `null`, `"string"`, `"<value>"`, `"TODO"`, `"..."`, `{}`) in required
//!   arguments count as empty input;
//! - loops are detected beyond duplicates: A/B alternation, the same error text again and again,
//!   an identical call getting an identical result;
//! - a loop is the agent's own: repeats are compared within one turn of the task
//!   ([`Monitor::user_turn`]), so a user who asks for the same lookup again, or for one place
//!   and then the other and back, is not told "this will not give a different result" and does
//!   not end the run as `control_loop`. What counts against a tool's health (streaks, breakers,
//!   the failure rate) spans turns;
//! - abort actually stops the run (the controller obeys it) and says why; failures of a tool
//!   whose circuit is already open do not count towards it (the breaker handles them, and the
//!   run may have moved on to another tool);
//! - guidance is rebuilt at every `check` from current conditions and disappears with its cause;
//! - memory is bounded whatever the run's length: a fixed ring of recent calls, a capped table of
//!   tools, capped error texts. `record` + `check` are O(1) in the run's length.
//!
//! In [`Mode::Interactive`] a person is in the loop: the monitor gives guidance only and never
//! hides a tool or aborts on its own.

use std::collections::{HashMap, VecDeque};
use std::hash::{Hash, Hasher};

use serde::{Deserialize, Serialize};
use serde_json::Value;
use thiserror::Error;

/// Who is in the loop.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// No one is watching: every rule applies, circuits hide tools and abort stops the run.
    #[default]
    Autonomous,
    /// A person is in the loop: guidance only; never hides a tool or aborts on its own.
    Interactive,
}

/// Thresholds of the monitor. Every rule is configurable; the defaults are SPEC §1's.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MonitorConfig {
    /// Autonomous or interactive.
    pub mode: Mode,
    /// Consecutive failures of one tool before a warning.
    pub warn_after: u32,
    /// Consecutive failures of one tool before its circuit opens.
    pub circuit_after: u32,
    /// Calls (of any tool) after which an open circuit goes half-open. `0` disables.
    pub cooldown_calls: u32,
    /// Milliseconds after which an open circuit goes half-open. `0` disables.
    pub cooldown_ms: u64,
    /// Window, in calls, within which a canonically equal call is a duplicate.
    pub duplicate_window: usize,
    /// Window, in calls, for the empty-input rule.
    pub empty_input_window: usize,
    /// Calls with empty required input within that window that trigger the rule.
    pub empty_input_min: usize,
    /// Window, in calls, for A/B alternation (must be even, ≥ 4).
    pub alternation_window: usize,
    /// The same error text this many times within the duplicate window is a loop.
    pub same_error_repeats: usize,
    /// The same call getting the same result this many times within the duplicate window is a
    /// loop.
    pub identical_result_repeats: usize,
    /// Abort when the failure rate is strictly above this...
    pub abort_failure_rate: f64,
    /// ...over at least this many calls...
    pub abort_min_calls: usize,
    /// ...counted over at most this many recent calls.
    pub abort_window: usize,
    /// Whether soft failures (empty results, error objects) count towards streaks and circuits.
    pub soft_failures_count: bool,
    /// Most tools tracked at once; the least recently used healthy tool is forgotten beyond it.
    pub max_tools: usize,
    /// Extra strings that count as placeholders (case-insensitive), beside the built-in ones.
    pub placeholders: Vec<String>,
}

impl Default for MonitorConfig {
    fn default() -> Self {
        MonitorConfig {
            mode: Mode::Autonomous,
            warn_after: 3,
            circuit_after: 5,
            cooldown_calls: 10,
            cooldown_ms: 60_000,
            duplicate_window: 8,
            empty_input_window: 5,
            empty_input_min: 2,
            alternation_window: 6,
            same_error_repeats: 3,
            identical_result_repeats: 3,
            abort_failure_rate: 0.7,
            abort_min_calls: 6,
            abort_window: 20,
            soft_failures_count: true,
            max_tools: 64,
            placeholders: Vec::new(),
        }
    }
}

/// A monitor configuration that makes no sense.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("invalid monitor config: {0}")]
pub struct ConfigError(pub String);

impl MonitorConfig {
    /// Parses a TOML configuration; keys left out keep their defaults.
    pub fn from_toml_str(s: &str) -> Result<MonitorConfig, ConfigError> {
        let cfg: MonitorConfig = toml::from_str(s).map_err(|e| ConfigError(e.to_string()))?;
        cfg.validate()?;
        Ok(cfg)
    }

    /// Checks the thresholds are coherent.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let err = |m: String| Err(ConfigError(m));
        if self.warn_after == 0 || self.circuit_after == 0 {
            return err("warn_after and circuit_after must be at least 1".into());
        }
        if !(0.0..=1.0).contains(&self.abort_failure_rate) {
            return err(format!(
                "abort_failure_rate must be in [0, 1], got {}",
                self.abort_failure_rate
            ));
        }
        if self.abort_min_calls == 0 || self.abort_window < self.abort_min_calls {
            return err(format!(
                "abort_window ({}) must be at least abort_min_calls ({}), which must be ≥ 1",
                self.abort_window, self.abort_min_calls
            ));
        }
        if self.alternation_window < 4 || !self.alternation_window.is_multiple_of(2) {
            return err(format!(
                "alternation_window must be even and ≥ 4, got {}",
                self.alternation_window
            ));
        }
        if self.duplicate_window < 2 || self.empty_input_window == 0 || self.empty_input_min == 0 {
            return err(
                "duplicate_window must be ≥ 2; empty_input_window and empty_input_min ≥ 1".into(),
            );
        }
        if self.max_tools == 0 {
            return err("max_tools must be at least 1".into());
        }
        if self.same_error_repeats < 2 || self.identical_result_repeats < 2 {
            return err("same_error_repeats and identical_result_repeats must be ≥ 2".into());
        }
        let longest = self
            .duplicate_window
            .max(self.empty_input_window)
            .max(self.alternation_window)
            .max(self.abort_window);
        if longest > 4096 {
            return err(format!("windows are capped at 4096 calls, got {longest}"));
        }
        Ok(())
    }
}

/// How a tool call ended.
#[derive(Debug, Clone, Copy)]
pub enum CallOutcome<'a> {
    /// The tool returned this value (which may still be a soft failure).
    Returned(&'a Value),
    /// The tool raised, timed out or failed in transport: a hard failure.
    Failed {
        /// The error text.
        error: &'a str,
    },
}

/// One finished tool call, as the monitor sees it.
#[derive(Debug, Clone, Copy)]
pub struct ToolCall<'a> {
    /// The tool's name.
    pub tool: &'a str,
    /// The arguments it was called with.
    pub args: &'a Value,
    /// How it ended.
    pub outcome: CallOutcome<'a>,
    /// The names of the tool's required arguments.
    pub required: &'a [String],
    /// Whether the arguments were repaired before the call.
    pub repaired: bool,
}

impl<'a> ToolCall<'a> {
    /// A call that returned `result`.
    pub fn returned(tool: &'a str, args: &'a Value, result: &'a Value) -> Self {
        ToolCall {
            tool,
            args,
            outcome: CallOutcome::Returned(result),
            required: &[],
            repaired: false,
        }
    }

    /// A call that failed hard with `error`.
    pub fn failed(tool: &'a str, args: &'a Value, error: &'a str) -> Self {
        ToolCall {
            tool,
            args,
            outcome: CallOutcome::Failed { error },
            required: &[],
            repaired: false,
        }
    }

    /// The same call with its required argument names.
    pub fn with_required(mut self, required: &'a [String]) -> Self {
        self.required = required;
        self
    }
}

/// Whether and how a call failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FailureKind {
    /// The tool raised, timed out or failed in transport.
    Hard,
    /// The tool returned normally but uselessly.
    Soft,
}

/// The per-call status shown in UIs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Badge {
    /// The call worked.
    Ok,
    /// The call failed hard.
    Failed,
    /// The call returned nothing useful (soft failure).
    Empty,
    /// A required argument was empty or a placeholder.
    EmptyInput,
    /// The same call was already made within the window.
    Duplicate,
    /// The tool's circuit is open.
    CircuitBroken,
    /// The call worked after its arguments were repaired.
    Repaired,
}

/// The monitor's signals, with the names the `selfheal monitor` protocol uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MonitorSignal {
    /// The tool has failed `warn_after` times in a row or more.
    ConsecutiveFailures,
    /// The tool's circuit is open.
    CircuitOpen,
    /// The call duplicates a recent one.
    DuplicateCall,
    /// Too many recent calls had empty required input.
    EmptyInput,
    /// A loop was detected.
    Loop,
    /// The run should stop.
    Abort,
}

impl MonitorSignal {
    /// The protocol name (`consecutive_failures`, `circuit_open`, `duplicate_call`,
    /// `empty_input`, `loop`, `abort`), the same as its serialised form.
    pub fn as_str(self) -> &'static str {
        match self {
            MonitorSignal::ConsecutiveFailures => "consecutive_failures",
            MonitorSignal::CircuitOpen => "circuit_open",
            MonitorSignal::DuplicateCall => "duplicate_call",
            MonitorSignal::EmptyInput => "empty_input",
            MonitorSignal::Loop => "loop",
            MonitorSignal::Abort => "abort",
        }
    }

    const ALL: [MonitorSignal; 6] = [
        MonitorSignal::ConsecutiveFailures,
        MonitorSignal::CircuitOpen,
        MonitorSignal::DuplicateCall,
        MonitorSignal::EmptyInput,
        MonitorSignal::Loop,
        MonitorSignal::Abort,
    ];

    fn bit(self) -> u8 {
        match self {
            MonitorSignal::ConsecutiveFailures => 1,
            MonitorSignal::CircuitOpen => 2,
            MonitorSignal::DuplicateCall => 4,
            MonitorSignal::EmptyInput => 8,
            MonitorSignal::Loop => 16,
            MonitorSignal::Abort => 32,
        }
    }
}

/// A small set of [`MonitorSignal`]s (no allocation). Serialises as a list of names.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SignalSet(u8);

impl SignalSet {
    /// Adds a signal.
    pub fn insert(&mut self, s: MonitorSignal) {
        self.0 |= s.bit();
    }
    /// Whether the set holds `s`.
    pub fn contains(self, s: MonitorSignal) -> bool {
        self.0 & s.bit() != 0
    }
    /// Whether the set is empty.
    pub fn is_empty(self) -> bool {
        self.0 == 0
    }
    /// The signals, in a fixed order.
    pub fn iter(self) -> impl Iterator<Item = MonitorSignal> {
        MonitorSignal::ALL
            .into_iter()
            .filter(move |s| self.contains(*s))
    }
}

impl Serialize for SignalSet {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(self.iter())
    }
}

/// What `record` concluded about one call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct CallReport {
    /// The call's 1-based index in the run.
    pub call: u64,
    /// Its badge.
    pub badge: Badge,
    /// The signals raised by this call.
    pub signals: SignalSet,
    /// Whether and how it failed.
    pub failure: Option<FailureKind>,
    /// The tool's consecutive failures after this call.
    pub consecutive_failures: u32,
}

/// What a piece of guidance is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GuidanceKind {
    /// A tool keeps failing.
    Warning,
    /// A tool's circuit is open.
    CircuitOpen,
    /// A tool is back on probation.
    HalfOpen,
    /// The last call repeated an earlier one.
    Duplicate,
    /// Calls are being made with empty inputs.
    EmptyInput,
    /// The agent is looping.
    Loop,
    /// Most calls are failing.
    FailureRate,
}

/// One piece of corrective guidance for the next prompt.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Guidance {
    /// What it is about.
    pub kind: GuidanceKind,
    /// The tool concerned, if one.
    pub tool: Option<String>,
    /// The text to put in the prompt.
    pub text: String,
}

/// What `check` tells the agent loop before the next model step.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Verdict {
    /// Guidance to add to the next prompt (rebuilt every step).
    pub guidance: Vec<Guidance>,
    /// Tools to remove from the tools offered (sorted).
    pub hidden_tools: Vec<String>,
    /// If set, the run must stop, for this reason.
    pub abort: Option<String>,
}

pub(crate) use crate::breaker::CircuitState;
use crate::breaker::{Breaker, BreakerConfig};

const MAX_NAME: usize = 128;
const MAX_ERROR: usize = 240;

#[derive(Debug, Clone, Serialize, Deserialize)]
struct ToolState {
    name: Box<str>,
    breaker: Breaker,
    last_errors: [Option<Box<str>>; 2],
    last_seen: u64,
}

impl ToolState {
    fn new(name: &str, now_call: u64) -> Self {
        ToolState {
            name: truncate(name, MAX_NAME).into(),
            breaker: Breaker::default(),
            last_errors: [None, None],
            last_seen: now_call,
        }
    }

    fn notable(&self, warn_after: u32) -> bool {
        self.breaker.streak() >= warn_after
            || !matches!(self.breaker.circuit(), CircuitState::Closed)
    }
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
struct Recent {
    /// The turn of the task ([`Monitor::user_turn`]) the call was made in.
    turn: u64,
    tool_hash: u64,
    call_hash: u64,
    result_hash: u64,
    error_hash: Option<u64>,
    failed: bool,
    empty_input: bool,
}

/// How much a [`Monitor`] holds, from [`Monitor::memory_footprint`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct MemoryFootprint {
    /// Tools tracked (at most `max_tools`).
    pub tools: usize,
    /// Recent calls kept in the ring (at most the longest configured window).
    pub recent: usize,
    /// Estimated bytes: `size_of::<Monitor>()` plus the heap it owns (tool table, name index,
    /// ring, stored error texts, configured placeholders). An estimate because the hash map's
    /// exact layout is private to the standard library.
    pub bytes_estimate: usize,
}

/// The tool-health monitor of one run.
///
/// Serialises its state only (a run's, see [`crate::run::Run::snapshot`]): the configuration and
/// the name index are not written and come back with `Monitor::reattach`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Monitor {
    #[serde(skip)]
    config: MonitorConfig,
    tools: Vec<ToolState>,
    #[serde(skip)]
    index: HashMap<Box<str>, usize, FoldBuildHasher>,
    recent: VecDeque<Recent>,
    #[serde(skip)]
    ring_cap: usize,
    calls: u64,
    /// Turns of the task begun ([`Monitor::user_turn`]).
    turn: u64,
    notable_tools: usize,
    last: Conditions,
    forgotten_tools: u64,
    /// The tools the agent is offered now ([`Monitor::offer`]), at most [`MAX_OFFERED`]: what
    /// guidance names as the alternatives to a failing tool.
    offered: Vec<Box<str>>,
}

/// Most tool names a monitor keeps of what the agent is offered ([`Monitor::offer`]).
pub(crate) const MAX_OFFERED: usize = 64;

#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize)]
struct Conditions {
    duplicate_of_tool: Option<usize>,
    empty_input: bool,
    looping: Option<LoopKind>,
    failure_rate: Option<(usize, usize)>,
}

/// What one pass over the ring found; see [`Monitor::scan`].
#[derive(Debug, Clone, Copy, Default)]
struct Scan {
    /// An equal earlier call (that did not fail hard) within the duplicate window.
    duplicate: bool,
    /// Calls within the duplicate window with this call's error text.
    same_error: usize,
    /// Successful calls within the duplicate window equal to this one with the same result.
    identical_results: usize,
    /// Calls with empty required input within the empty-input window.
    empty_inputs: usize,
    /// Calls within the abort window...
    calls: usize,
    /// ...and how many of them failed.
    failures: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
enum LoopKind {
    Alternation,
    SameError,
    IdenticalResult,
}

impl Default for Monitor {
    fn default() -> Self {
        Monitor::with_valid_config(MonitorConfig::default())
    }
}

impl Monitor {
    /// A monitor with the given configuration, after validating it.
    pub fn new(config: MonitorConfig) -> Result<Self, ConfigError> {
        config.validate()?;
        Ok(Monitor::with_valid_config(config))
    }

    fn with_valid_config(config: MonitorConfig) -> Self {
        let ring_cap = config
            .duplicate_window
            .max(config.empty_input_window)
            .max(config.alternation_window)
            .max(config.abort_window);
        // The tool table grows with the tools a run uses (most use a handful): the gateway keeps
        // one monitor per live run, and reserving room for 64 tools up front cost ~7 KB each.
        Monitor {
            tools: Vec::new(),
            index: HashMap::with_hasher(FoldBuildHasher::default()),
            // Its room is reserved at the first call (a run that calls no tool holds none).
            recent: VecDeque::new(),
            ring_cap,
            calls: 0,
            turn: 0,
            notable_tools: 0,
            last: Conditions::default(),
            forgotten_tools: 0,
            offered: Vec::new(),
            config,
        }
    }

    /// Gives a monitor read back from a snapshot its configuration and rebuilds its name index.
    /// The ring keeps what it holds; a smaller window than the snapshot's sees only its newest
    /// calls, as it would have had it been configured so all along.
    pub(crate) fn reattach(&mut self, config: MonitorConfig) {
        self.ring_cap = config
            .duplicate_window
            .max(config.empty_input_window)
            .max(config.alternation_window)
            .max(config.abort_window);
        while self.recent.len() > self.ring_cap {
            self.recent.pop_front();
        }
        self.index = self
            .tools
            .iter()
            .enumerate()
            .map(|(i, t)| (t.name.clone(), i))
            .collect();
        self.config = config;
    }

    /// Tells the monitor which tools the agent is offered now (the request's or the agent's
    /// tool list, before anything is hidden), so that guidance about a failing tool names what
    /// else the agent can use, and [`Monitor::alternatives`] can say whether anything is left.
    /// Replaces the previous offer; at most `MAX_OFFERED` (64) names are kept (the first ones).
    pub fn offer<'a>(&mut self, tools: impl IntoIterator<Item = &'a str>) {
        self.offered.clear();
        for t in tools.into_iter().take(MAX_OFFERED) {
            let t = truncate(t, MAX_NAME);
            if !self.offered.iter().any(|o| &**o == t) {
                self.offered.push(t.into());
            }
        }
    }

    /// The tools on offer ([`Monitor::offer`]) the agent can use instead of `tool`: every other
    /// one whose circuit is not open (in [`Mode::Autonomous`], where an open circuit hides its
    /// tool). Empty when nothing was offered or nothing else is left.
    pub fn alternatives(&self, tool: &str) -> Vec<String> {
        let tool = truncate(tool, MAX_NAME);
        let autonomous = self.config.mode == Mode::Autonomous;
        self.offered
            .iter()
            .filter(|o| &***o != tool)
            .filter(|o| {
                !(autonomous
                    && self
                        .index
                        .get(&***o)
                        .is_some_and(|&i| self.tools[i].breaker.is_open()))
            })
            .map(|o| o.to_string())
            .collect()
    }

    /// The configuration in use.
    pub fn config(&self) -> &MonitorConfig {
        &self.config
    }

    /// Calls recorded so far.
    pub fn calls(&self) -> u64 {
        self.calls
    }

    /// What the monitor holds in memory right now: tools tracked, recent calls in the ring and
    /// an estimate of the bytes used (the struct itself plus its heap allocations). Every part
    /// is bounded by the configuration (`max_tools`, the longest window, the caps on names and
    /// error texts), never by the run's length.
    pub fn memory_footprint(&self) -> MemoryFootprint {
        let tool_heap: usize = self
            .tools
            .iter()
            .map(|t| {
                // The name is stored twice: in the table and as the index's key.
                2 * t.name.len()
                    + t.last_errors
                        .iter()
                        .flatten()
                        .map(|e| e.len())
                        .sum::<usize>()
            })
            .sum();
        let index_heap = self.index.capacity()
            * (std::mem::size_of::<(Box<str>, usize)>() + std::mem::size_of::<u8>());
        let config_heap = self.config.placeholders.capacity() * std::mem::size_of::<String>()
            + self
                .config
                .placeholders
                .iter()
                .map(String::capacity)
                .sum::<usize>();
        MemoryFootprint {
            tools: self.tools.len(),
            recent: self.recent.len(),
            bytes_estimate: std::mem::size_of::<Monitor>()
                + self.tools.capacity() * std::mem::size_of::<ToolState>()
                + tool_heap
                + index_heap
                + self.recent.capacity() * std::mem::size_of::<Recent>()
                + config_heap
                + self.offered.capacity() * std::mem::size_of::<Box<str>>()
                + self.offered.iter().map(|o| o.len()).sum::<usize>(),
        }
    }

    /// Healthy tools forgotten because more than `max_tools` were seen.
    pub fn forgotten_tools(&self) -> u64 {
        self.forgotten_tools
    }

    /// The circuit state of a tool (closed for tools never seen).
    pub fn circuit(&self, tool: &str) -> CircuitState {
        self.index
            .get(truncate(tool, MAX_NAME))
            .map(|&i| self.tools[i].breaker.circuit())
            .unwrap_or(CircuitState::Closed)
    }

    /// Consecutive failures of a tool.
    pub fn streak(&self, tool: &str) -> u32 {
        self.index
            .get(truncate(tool, MAX_NAME))
            .map(|&i| self.tools[i].breaker.streak())
            .unwrap_or(0)
    }

    /// Whether `result` is a soft failure: `null`, an empty string/array/object, an object with a
    /// truthy `error`, `isError: true`, or an empty `results` array.
    pub fn is_soft_failure(result: &Value) -> bool {
        match result {
            Value::Null => true,
            Value::String(s) => s.trim().is_empty(),
            Value::Array(a) => a.is_empty(),
            // One pass over the entries rather than three map lookups: results are small
            // objects, and a key comparison that fails on length costs next to nothing.
            Value::Object(o) => {
                o.is_empty()
                    || o.iter().any(|(k, v)| match k.as_str() {
                        "error" => truthy(v),
                        "isError" => v == &Value::Bool(true),
                        "results" => matches!(v, Value::Array(a) if a.is_empty()),
                        _ => false,
                    })
            }
            Value::Bool(_) | Value::Number(_) => false,
        }
    }

    /// The error text a soft failure's body carries, when it carries one: `{"error": "…"}`,
    /// `{"error": {"message": "…"}}`, `{"isError": true, "content": [{"text": "…"}]}` or
    /// `{"error": true, "message": "…"}`. A tool that says why it failed is read by that text
    /// (an invalid argument is not an empty search), on every front-end alike; `None` for a body
    /// that is only empty (`null`, `[]`, `{"results": []}`), which is an empty output.
    pub fn soft_error_text(result: &Value) -> Option<&str> {
        let o = result.as_object()?;
        fn text(v: &Value) -> Option<&str> {
            v.as_str().map(str::trim).filter(|t| !t.is_empty())
        }
        let from_content = || {
            o.get("content")?
                .as_array()?
                .iter()
                .find_map(|c| c.get("text").and_then(text))
        };
        match o.get("error") {
            Some(Value::String(_)) => o.get("error").and_then(text),
            Some(Value::Object(e)) => ["message", "detail", "error", "description"]
                .iter()
                .find_map(|k| e.get(*k).and_then(text)),
            Some(e) if truthy(e) => ["message", "detail", "error_message", "description"]
                .iter()
                .find_map(|k| o.get(*k).and_then(text))
                .or_else(from_content),
            _ if o.get("isError") == Some(&Value::Bool(true)) => {
                o.get("message").and_then(text).or_else(from_content)
            }
            _ => None,
        }
    }

    /// Whether `value` is empty or a placeholder where real input was needed.
    pub fn is_placeholder(&self, value: &Value) -> bool {
        match value {
            Value::Null => true,
            Value::Object(o) => o.is_empty(),
            Value::Array(a) => a.is_empty(),
            Value::String(s) => {
                let t = s.trim();
                if t.is_empty() {
                    return true;
                }
                if t.len() > 40 {
                    return false;
                }
                let lower = t.to_ascii_lowercase();
                const BUILT_IN: [&str; 17] = [
                    "string",
                    "<value>",
                    "todo",
                    "...",
                    "…",
                    "null",
                    "none",
                    "undefined",
                    "n/a",
                    "placeholder",
                    "example",
                    "value",
                    "tbd",
                    "xxx",
                    "<string>",
                    "query",
                    "nil",
                ];
                BUILT_IN.contains(&lower.as_str())
                    || (t.starts_with('<') && t.ends_with('>'))
                    || (t.starts_with("{{") && t.ends_with("}}"))
                    || (lower.starts_with("your ") && lower.ends_with(" here"))
                    || self
                        .config
                        .placeholders
                        .iter()
                        .any(|p| p.eq_ignore_ascii_case(t))
            }
            Value::Bool(_) | Value::Number(_) => false,
        }
    }

    fn has_empty_input(&self, call: &ToolCall<'_>) -> bool {
        call.required.iter().any(|name| match call.args.get(name) {
            None => true,
            Some(v) => self.is_placeholder(v),
        })
    }

    fn tool_index(&mut self, name: &str) -> usize {
        let key = truncate(name, MAX_NAME);
        if let Some(&i) = self.index.get(key) {
            return i;
        }
        if self.tools.len() < self.config.max_tools {
            self.tools.push(ToolState::new(key, self.calls));
            self.index.insert(key.into(), self.tools.len() - 1);
            return self.tools.len() - 1;
        }
        // Full: forget the least recently seen healthy tool; if none is healthy, the least
        // recently seen tool of all. Bounded by max_tools, independent of the run's length.
        let warn = self.config.warn_after;
        let victim = self
            .tools
            .iter()
            .enumerate()
            .filter(|(_, t)| !t.notable(warn))
            .min_by_key(|(_, t)| t.last_seen)
            .or_else(|| {
                self.tools
                    .iter()
                    .enumerate()
                    .min_by_key(|(_, t)| t.last_seen)
            })
            .map(|(i, _)| i)
            .unwrap_or(0);
        if self.tools[victim].notable(warn) {
            self.notable_tools = self.notable_tools.saturating_sub(1);
        }
        self.index.remove(&self.tools[victim].name);
        self.tools[victim] = ToolState::new(key, self.calls);
        self.index.insert(key.into(), victim);
        self.forgotten_tools += 1;
        victim
    }

    /// A new turn of the task begins: the user (or whoever sets the agent's task) spoke since
    /// the last call. Calls before it no longer count as repeats of the next ones (duplicates,
    /// identical results, the same error, alternation): the agent was asked again, which is not
    /// a loop. Streaks, breakers and the failure rate are about the tools and carry on. O(1).
    pub fn user_turn(&mut self) {
        if self.recent.back().is_some_and(|r| r.turn == self.turn) {
            self.turn += 1;
        }
        self.last.duplicate_of_tool = None;
        self.last.looping = None;
    }

    /// Records one finished call and reports its badge and signals. O(window), independent of
    /// the run's length.
    pub fn record(&mut self, call: &ToolCall<'_>, now_ms: u64) -> CallReport {
        self.calls += 1;
        let call_no = self.calls;
        self.advance_cooldowns(now_ms);
        let empty_input = self.has_empty_input(call);
        // Only successful results are ever compared (identical-result loops), so failed calls
        // skip the canonical hash of their result.
        let (failure, error_text, result_hash) = match call.outcome {
            CallOutcome::Failed { error } => (Some(FailureKind::Hard), Some(error), 0),
            CallOutcome::Returned(v) => {
                if Self::is_soft_failure(v) {
                    (Some(FailureKind::Soft), None, 0)
                } else {
                    (None, None, canonical_hash(v))
                }
            }
        };
        let counts = match failure {
            Some(FailureKind::Hard) => true,
            Some(FailureKind::Soft) => self.config.soft_failures_count,
            None => false,
        };
        let tool_hash = hash_str(truncate(call.tool, MAX_NAME));
        let call_hash = {
            let mut h = hasher();
            h.write_u64(tool_hash);
            h.write_u64(canonical_hash(call.args));
            h.finish()
        };

        let warn = self.config.warn_after;
        let breaker = self.breaker_config();
        let idx = self.tool_index(call.tool);
        let t = &mut self.tools[idx];
        let was_notable = t.notable(warn);
        let was_open = t.breaker.is_open();
        t.last_seen = call_no;
        if counts {
            t.breaker.failure(&breaker, call_no, now_ms);
            let text = error_text.map_or_else(
                || "returned an empty or error result".to_owned(),
                |e| truncate(e, MAX_ERROR).to_owned(),
            );
            t.last_errors = [t.last_errors[1].take(), Some(text.into())];
        } else if failure.is_none() {
            t.breaker.success();
            t.last_errors = [None, None];
        }
        let streak = t.breaker.streak();
        let open_now = t.breaker.is_open();
        let is_notable = t.notable(warn);
        match (was_notable, is_notable) {
            (false, true) => self.notable_tools += 1,
            (true, false) => self.notable_tools = self.notable_tools.saturating_sub(1),
            (true, true) | (false, false) => {}
        }

        // Windows over recent calls: push this call, then one scan serves every window rule.
        let error_hash = error_text.map(hash_str);
        if self.recent.capacity() == 0 {
            self.recent.reserve_exact(self.ring_cap);
        }
        if self.recent.len() == self.ring_cap {
            self.recent.pop_front();
        }
        self.recent.push_back(Recent {
            turn: self.turn,
            tool_hash,
            call_hash,
            result_hash,
            error_hash,
            failed: failure.is_some(),
            empty_input,
        });

        let scan = self.scan(call_hash, result_hash, error_hash);
        let duplicate = scan.duplicate;
        let empty_rule = scan.empty_inputs >= self.config.empty_input_min;
        let looping = self.detect_loop(&scan, failure.is_some());
        let (mut n, mut failed) = (scan.calls, scan.failures);
        let mut rate_high = self.rate_too_high(failed, n);
        if rate_high && self.notable_tools > 0 {
            // Failures of a tool whose circuit is open are already handled by the breaker; they
            // must not also abort a run that has moved on to other tools. Recount without them
            // (rare path: only when the plain rate is already too high).
            (n, failed) = self.failure_rate(true);
            rate_high = self.rate_too_high(failed, n);
        }

        self.last = Conditions {
            duplicate_of_tool: duplicate.then_some(idx),
            empty_input: empty_rule,
            looping,
            failure_rate: rate_high.then_some((failed, n)),
        };

        let mut signals = SignalSet::default();
        if streak >= warn {
            signals.insert(MonitorSignal::ConsecutiveFailures);
        }
        if open_now {
            signals.insert(MonitorSignal::CircuitOpen);
        }
        if duplicate {
            signals.insert(MonitorSignal::DuplicateCall);
        }
        if empty_rule {
            signals.insert(MonitorSignal::EmptyInput);
        }
        if looping.is_some() {
            signals.insert(MonitorSignal::Loop);
        }
        if rate_high && self.config.mode == Mode::Autonomous {
            signals.insert(MonitorSignal::Abort);
        }

        let badge = if open_now || was_open {
            Badge::CircuitBroken
        } else if empty_input {
            Badge::EmptyInput
        } else if duplicate {
            Badge::Duplicate
        } else {
            match failure {
                Some(FailureKind::Hard) => Badge::Failed,
                Some(FailureKind::Soft) => Badge::Empty,
                None if call.repaired => Badge::Repaired,
                None => Badge::Ok,
            }
        };
        CallReport {
            call: call_no,
            badge,
            signals,
            failure,
            consecutive_failures: streak,
        }
    }

    /// Whether `failed` of `n` calls is strictly above the abort rate, over enough calls.
    ///
    /// Compares the quotient, not `failed > rate * n`: division is correctly rounded, so a rate
    /// that is exactly the threshold (63 of 90 at 0.7) compares equal, whereas `0.7 * 90.0` is
    /// `62.99999999999999` in `f64` and would abort at exactly 70 %.
    fn rate_too_high(&self, failed: usize, n: usize) -> bool {
        n >= self.config.abort_min_calls
            && n > 0
            && (failed as f64) / (n as f64) > self.config.abort_failure_rate
    }

    /// (calls, failures) over the abort window; with `skip_open`, calls of tools whose circuit is
    /// open are left out.
    fn failure_rate(&self, skip_open: bool) -> (usize, usize) {
        let open: Vec<u64> = if skip_open {
            self.tools
                .iter()
                .filter(|t| t.breaker.is_open())
                .map(|t| hash_str(&t.name))
                .collect()
        } else {
            Vec::new()
        };
        self.recent
            .iter()
            .rev()
            .take(self.config.abort_window)
            .filter(|r| !open.contains(&r.tool_hash))
            .fold((0usize, 0usize), |(n, f), r| {
                (n + 1, f + usize::from(r.failed))
            })
    }

    /// One pass over the ring (newest first, the current call included) that gathers what every
    /// window rule needs, instead of one pass per rule.
    fn scan(&self, call_hash: u64, result_hash: u64, error_hash: Option<u64>) -> Scan {
        let dup = self.config.duplicate_window;
        let empty = self.config.empty_input_window;
        let abort = self.config.abort_window;
        let mut s = Scan::default();
        for (i, r) in self.recent.iter().rev().enumerate() {
            // Repeats count within the current turn only (see `user_turn`).
            if i < dup && r.turn == self.turn {
                let same_call = r.call_hash == call_hash;
                // An earlier call that failed hard (raised, timed out) does not make this one a
                // duplicate: repeating it is a retry, often directed by the controller itself,
                // and telling the model "this will not give a different result" after the retry
                // worked would be wrong. Repeats of failing calls are the streak and loop rules'
                // business.
                s.duplicate |= i > 0 && same_call && r.error_hash.is_none();
                s.same_error += usize::from(error_hash.is_some() && r.error_hash == error_hash);
                s.identical_results +=
                    usize::from(same_call && !r.failed && r.result_hash == result_hash);
            }
            if i < empty {
                s.empty_inputs += usize::from(r.empty_input);
            }
            if i < abort {
                s.calls += 1;
                s.failures += usize::from(r.failed);
            }
        }
        s
    }

    fn detect_loop(&self, scan: &Scan, failed: bool) -> Option<LoopKind> {
        let w = self.config.alternation_window;
        if self.recent.len() >= w {
            let mut it = self.recent.iter().rev().take(w);
            let (a, b) = match (it.next(), it.next()) {
                (Some(a), Some(b)) => (a.call_hash, b.call_hash),
                _ => (0, 0),
            };
            if a != b
                && self.recent.iter().rev().take(w).enumerate().all(|(i, r)| {
                    r.turn == self.turn && r.call_hash == if i % 2 == 0 { a } else { b }
                })
            {
                return Some(LoopKind::Alternation);
            }
        }
        if scan.same_error >= self.config.same_error_repeats {
            return Some(LoopKind::SameError);
        }
        if !failed && scan.identical_results >= self.config.identical_result_repeats {
            return Some(LoopKind::IdenticalResult);
        }
        None
    }

    fn advance_cooldowns(&mut self, now_ms: u64) {
        if self.notable_tools == 0 {
            return;
        }
        let config = self.breaker_config();
        for t in &mut self.tools {
            t.breaker.cool(&config, self.calls, now_ms);
        }
    }

    /// The per-tool breaker's thresholds, from the monitor's.
    fn breaker_config(&self) -> BreakerConfig {
        BreakerConfig {
            after: self.config.circuit_after,
            cooldown_calls: self.config.cooldown_calls,
            cooldown_ms: self.config.cooldown_ms,
        }
    }

    /// The verdict before the next model step: guidance, hidden tools, abort. Rebuilt from current
    /// conditions every time, so guidance disappears when its cause does.
    pub fn check(&mut self, now_ms: u64) -> Verdict {
        self.advance_cooldowns(now_ms);
        let autonomous = self.config.mode == Mode::Autonomous;
        let mut v = Verdict::default();
        if self.notable_tools > 0 {
            for t in &self.tools {
                // Healthy tools produce nothing: skip them before allocating their name.
                if !t.notable(self.config.warn_after) {
                    continue;
                }
                let name = t.name.to_string();
                let streak = t.breaker.streak();
                match t.breaker.circuit() {
                    CircuitState::Open { .. } => {
                        if autonomous {
                            v.hidden_tools.push(name.clone());
                            v.guidance.push(Guidance {
                                kind: GuidanceKind::CircuitOpen,
                                text: format!(
                                    "The tool `{name}` failed {} times in a row and has been disabled for now. {}",
                                    streak,
                                    instead(&self.alternatives(&name), "Use a different tool or approach.")
                                ),
                                tool: Some(name),
                            });
                        } else {
                            v.guidance.push(Guidance {
                                kind: GuidanceKind::CircuitOpen,
                                text: format!(
                                    "The tool `{name}` failed {} times in a row and looks broken. Avoid it; use a different tool or ask the user.",
                                    streak
                                ),
                                tool: Some(name),
                            });
                        }
                    }
                    CircuitState::HalfOpen => v.guidance.push(Guidance {
                        kind: GuidanceKind::HalfOpen,
                        text: format!(
                            "The tool `{name}` was disabled after repeated failures and is available again on trial: one more failure disables it again."
                        ),
                        tool: Some(name),
                    }),
                    CircuitState::Closed if streak >= self.config.warn_after => {
                        let errors: Vec<&str> =
                            t.last_errors.iter().flatten().map(|e| &**e).collect();
                        v.guidance.push(Guidance {
                            kind: GuidanceKind::Warning,
                            text: format!(
                                "The tool `{name}` has failed {} times in a row (last errors: {}). {}",
                                streak,
                                errors.join("; "),
                                instead(&self.alternatives(&name), "Try a different approach.")
                            ),
                            tool: Some(name),
                        });
                    }
                    CircuitState::Closed => {}
                }
            }
        }
        if let Some(i) = self.last.duplicate_of_tool
            && let Some(t) = self.tools.get(i)
        {
            v.guidance.push(Guidance {
                kind: GuidanceKind::Duplicate,
                text: format!(
                    "You already called `{}` with these exact arguments. Repeating it will not give a different result: use the result you have, or change the arguments or your approach.",
                    t.name
                ),
                tool: Some(t.name.to_string()),
            });
        }
        if self.last.empty_input {
            v.guidance.push(Guidance {
                kind: GuidanceKind::EmptyInput,
                tool: None,
                text: "Several recent tool calls had empty or placeholder values in required arguments. Stop and think about what inputs you actually need before calling a tool again.".into(),
            });
        }
        let tool_guidance = v
            .guidance
            .iter()
            .any(|g| matches!(g.kind, GuidanceKind::Warning | GuidanceKind::CircuitOpen));
        if let Some(kind) = self.last.looping
            && !(kind == LoopKind::SameError && tool_guidance)
        {
            let what = match kind {
                LoopKind::Alternation => "alternating between the same two calls",
                LoopKind::SameError => "getting the same error again and again",
                LoopKind::IdenticalResult => {
                    "repeating a call that keeps returning the same result"
                }
            };
            v.guidance.push(Guidance {
                kind: GuidanceKind::Loop,
                tool: None,
                text: format!(
                    "You appear to be in a loop ({what}). Step back and choose a different strategy."
                ),
            });
        }
        if let Some((failed, n)) = self.last.failure_rate {
            let reason = format!(
                "{failed} of the last {n} tool calls failed ({:.0} %): this approach isn't working.",
                100.0 * failed as f64 / n as f64
            );
            if autonomous {
                v.abort = Some(reason);
            } else {
                v.guidance.push(Guidance {
                    kind: GuidanceKind::FailureRate,
                    tool: None,
                    text: format!("{reason} Consider asking the user how to proceed."),
                });
            }
        }
        v.hidden_tools.sort_unstable();
        v
    }
}

/// What to do instead of a failing tool: use one of `alternatives` (the other tools on offer,
/// named), or `otherwise` when none is known.
fn instead(alternatives: &[String], otherwise: &str) -> String {
    if alternatives.is_empty() {
        return otherwise.to_owned();
    }
    let names: Vec<String> = alternatives.iter().map(|a| format!("`{a}`")).collect();
    format!(
        "Use another tool on offer instead ({}), or a different approach.",
        names.join(", ")
    )
}

fn truthy(v: &Value) -> bool {
    match v {
        Value::Null => false,
        Value::Bool(b) => *b,
        Value::Number(n) => n.as_f64().is_some_and(|f| f != 0.0),
        Value::String(s) => !s.is_empty(),
        Value::Array(a) => !a.is_empty(),
        Value::Object(o) => !o.is_empty(),
    }
}

fn truncate(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// A small, fast, non-cryptographic 64-bit hasher: the folded multiply of foldhash and wyhash
/// (multiply to 128 bits, xor the halves) over 8-byte words, with a fixed seed.
///
/// Why not the standard `DefaultHasher`: SipHash costs more to set up and finish than a whole
/// `record` may take here, and `canonical_hash` needs one hash per JSON node. Its resistance to
/// hash flooding buys nothing in the monitor: the tool table holds at most `max_tools` entries,
/// and a collision in the ring can at worst raise one spurious piece of guidance. The fixed seed
/// keeps every verdict reproducible from run to run.
#[derive(Debug, Clone, Copy)]
struct FoldHasher {
    acc: u64,
}

const FOLD_SEED: u64 = 0x243f_6a88_85a3_08d3;
const FOLD_K1: u64 = 0x1319_8a2e_0370_7344;
const FOLD_K2: u64 = 0xa409_3822_299f_31d0;

#[inline]
fn folded_multiply(a: u64, b: u64) -> u64 {
    let p = u128::from(a) * u128::from(b);
    (p as u64) ^ ((p >> 64) as u64)
}

impl Default for FoldHasher {
    fn default() -> Self {
        FoldHasher { acc: FOLD_SEED }
    }
}

impl Hasher for FoldHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            let mut w = [0u8; 8];
            w.copy_from_slice(c);
            self.acc = folded_multiply(self.acc ^ u64::from_le_bytes(w), FOLD_K1);
        }
        let rest = chunks.remainder();
        let n = rest.len();
        if n > 0 {
            // Read the 1..=7 tail bytes without copying them to the stack (a variable-length
            // copy followed by a wide load stalls store forwarding): two overlapping 4-byte
            // reads, or three single bytes. Given the length, which goes into the top byte, both
            // are one-to-one, so "a" and "a\0" still differ.
            let w = if n >= 4 {
                let lo = u32::from_le_bytes([rest[0], rest[1], rest[2], rest[3]]);
                let hi = u32::from_le_bytes([rest[n - 4], rest[n - 3], rest[n - 2], rest[n - 1]]);
                u64::from(lo) | (u64::from(hi) << 32)
            } else {
                u64::from(rest[0]) | (u64::from(rest[n / 2]) << 8) | (u64::from(rest[n - 1]) << 16)
            };
            let tail = w ^ ((n as u64) << 56);
            self.acc = folded_multiply(self.acc ^ tail, FOLD_K2);
        }
    }

    #[inline]
    fn write_u8(&mut self, i: u8) {
        self.write_u64(u64::from(i));
    }

    #[inline]
    fn write_u64(&mut self, i: u64) {
        self.acc = folded_multiply(self.acc ^ i, FOLD_K1);
    }

    #[inline]
    fn write_usize(&mut self, i: usize) {
        self.write_u64(i as u64);
    }

    #[inline]
    fn finish(&self) -> u64 {
        folded_multiply(self.acc ^ FOLD_K2, FOLD_K1 ^ FOLD_SEED)
    }
}

type FoldBuildHasher = std::hash::BuildHasherDefault<FoldHasher>;

fn hasher() -> FoldHasher {
    FoldHasher::default()
}

fn hash_str(s: &str) -> u64 {
    let mut h = hasher();
    s.hash(&mut h);
    h.finish()
}

/// A hash of a JSON value that ignores object key order and the spelling of numbers (`1` and
/// `1.0` are equal). Objects combine their entries with a commutative sum, so order never matters
/// and no keys need sorting. Below 256 levels only the shape is hashed, so values built deeper
/// than any parser allows cannot overflow the stack.
///
/// Each node is mixed directly with the folded multiply (one or two multiplications per leaf,
/// one per 8 bytes of string) rather than through a fresh `Hasher` per node: this is the hottest
/// function of `record`.
pub fn canonical_hash(v: &Value) -> u64 {
    // Distinct tags per JSON type, so `"1"`, `1` and `[1]` differ.
    const NULL: u64 = 0x9e37_79b9_7f4a_7c15;
    const TRUE: u64 = 0xbf58_476d_1ce4_e5b9;
    const FALSE: u64 = 0x94d0_49bb_1331_11eb;
    const NUMBER: u64 = 0x2545_f491_4f6c_dd1d;
    const STRING: u64 = 0x6c62_272e_07bb_0142;
    const ARRAY: u64 = 0x8422_2325_cbf2_9ce4;
    const OBJECT: u64 = 0x1000_0000_01b3_0000;
    const KEY: u64 = 0x3c6e_f372_fe94_f82b;
    const DEEP: u64 = 0xa54f_f53a_5f1d_36f1;
    #[inline]
    fn mix(a: u64, b: u64) -> u64 {
        folded_multiply(a ^ FOLD_SEED, b ^ FOLD_K1)
    }
    #[inline]
    fn bytes(tag: u64, s: &str) -> u64 {
        let mut h = FoldHasher {
            acc: tag ^ (s.len() as u64),
        };
        h.write(s.as_bytes());
        h.finish()
    }
    fn go(v: &Value, depth: usize) -> u64 {
        match v {
            Value::Null => NULL,
            Value::Bool(true) => TRUE,
            Value::Bool(false) => FALSE,
            Value::Number(n) => match n.as_f64() {
                // 0.0 and -0.0 are the same number.
                Some(0.0) => mix(NUMBER, 0),
                Some(f) => mix(NUMBER, f.to_bits()),
                None => bytes(NUMBER, &n.to_string()),
            },
            Value::String(s) => bytes(STRING, s),
            Value::Array(_) | Value::Object(_) if depth > 256 => DEEP,
            Value::Array(a) => {
                let mut acc = mix(ARRAY, a.len() as u64);
                for x in a {
                    acc = mix(acc, go(x, depth + 1));
                }
                acc
            }
            Value::Object(o) => {
                let mut sum = 0u64;
                for (k, x) in o {
                    sum = sum.wrapping_add(mix(bytes(KEY, k), go(x, depth + 1)));
                }
                mix(OBJECT ^ (o.len() as u64), sum)
            }
        }
    }
    go(v, 0)
}
