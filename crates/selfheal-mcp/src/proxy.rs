//! The proxy's decisions, without I/O: JSON-RPC messages in, JSON-RPC messages out.
//!
//! [`Proxy`] sits between an MCP client and an MCP server and sees every message. It passes
//! everything through untouched — resources, prompts, sampling, progress, methods it does not
//! know, future protocol versions; the driver forwards such messages byte for byte — except the
//! few it heals:
//!
//! - `tools/list` answers: each tool's input schema and annotations are remembered, the tools are
//!   handed to the session's [`Run`] as the tools on offer, and the tools the run hides (their
//!   circuit is open) are left out of the list;
//! - `tools/call` requests: a call to a hidden tool, or any call once the run has stopped, is
//!   answered by the proxy (an `isError` result that says why and what to do) without reaching
//!   the server; arguments are checked against the
//!   tool's input schema, safe mismatches coerced, and arguments that cannot be used are answered
//!   with the precise schema errors, so the model can fix them;
//! - `tools/call` answers: every outcome goes to the session's one [`Run`] as an
//!   [`Observation::ToolFinished`] (one step per tool name) — the proxy keeps no retry cap,
//!   breaker or "is this retryable?" rule of its own. A failure is read off the wire into the
//!   core's [`Signal`] ([`rpc_signal`] is the one place JSON-RPC errors are parsed), and what
//!   the proxy can do is offered ([`Options`]): a resend only of a tool the server declares
//!   read-only or idempotent, a rewrite by the model, a mapped-back field, a refresh. The run's
//!   answer is carried out: proceed (its guidance added to the result the model reads, its
//!   hidden tools left out, the client told when they change with
//!   `notifications/tools/list_changed`), a retry after the run's delay or a refresh, the
//!   repaired output, guidance to try a different approach naming the other tools (a rewrite, a
//!   re-plan, a substitute, an escalation), or a stop (an error result that says to stop and
//!   report);
//! - `tools/call` answers of a tool the operator describes ([`McpConfig::tools`], the gateway's
//!   `[tools.NAME]` tables): the value (`structuredContent`, else the text read as JSON) is
//!   read against the declared contract by the core's rules ([`ToolConfig::judge`]) — a
//!   declared field missing or renamed is schema drift, one null or empty an empty output, an
//!   `as_of` stamp older than `max_age_ms` stale data — and the breach goes
//!   to the run like any failure, offered what the proxy can do: a repair of a drift (the one
//!   renamed key mapped back by [`selfheal_core::contract::map_renamed`], offered only when the
//!   mapping works) and, for a tool that declares `refresh`, the call again with that argument
//!   set to `true` (only for a read-only or idempotent tool, as a retry). What the run decides
//!   is carried out: retry, refresh, the mapped value in place of the
//!   answer (with a note that it was mapped), or — when the ladder or the budget leaves
//!   nothing — the answer flagged: a drifted or empty one becomes an `isError` result whose
//!   first text says which field broke the contract (the tool did not deliver what it
//!   declares), stale data stays a result with guidance saying how old it is. A breached
//!   answer never reaches the model as if it were fine;
//! - `reread` (the gateway's read before answering): the proxy never sees the model's answer,
//!   so it cannot hold it for a second read. After a call of a `reread` tool that needed a
//!   recovery (a retry, a refresh, a mapped field), when the core's rule says a read is due
//!   ([`Policy::reread_due`](selfheal_core::Policy::reread_due)), the result carries
//!   guidance to call the tool again with the same arguments and compare before relying on the
//!   value. Whether the model does is its own; nothing is claimed about it;
//! - `claim_after_recovery = false` (the policy claims no answer after a recovery, which the
//!   gateway carries out by flagging the run's answer `partial`): the proxy cannot flag the
//!   answer, so the value does it. The result of any call that needed a recovery (a retry, a
//!   refresh, a mapped field) carries guidance that the policy claims nothing after one
//!   ([`Policy::claim_refused`](selfheal_core::Policy::claim_refused), the rule behind
//!   `Controller::claim_refused`) and that an answer resting on the value is to be reported as
//!   unconfirmed; no read again is asked for (the policy makes none). The value itself is
//!   passed on: withholding it would give the model nothing to report;
//! - `notifications/progress` for a call pushes its deadline back (up to ten call timeouts), and
//!   when the server exits every call still waiting is answered with an error.
//!
//! One session is one run: when the run stops (the failure-rate rule, or a ladder's end with
//! nothing else on offer), the result says so and every later call is answered with the reason;
//! [`Proxy::finish`] gives the run's outcome. Request ids of the form
//! `selfheal-N` are the proxy's own; a client that used such string ids could see answers
//! dropped.
//!
//! Time comes in as `now_ms` (with [`Proxy::set_wall_clock`] giving the Unix time `as_of`
//! stamps are read against) and randomness through the core's [`Rng`], so every decision is
//! reproducible; the async driver in [`crate::run()`] does the reading, writing and waiting.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use serde_json::{Value, json};

use selfheal_core::{
    Amounts, Breakers, BudgetLimits, ControllerConfig, Env, EventKind, Guidance, Input,
    MonitorConfig, Observation, Options, Policy, RecoveryAction, RepairTarget, Rng, Run, RunStatus,
    Signal, StepAction, ToolCall,
    contract::{self, Breach, ToolConfig},
};
use selfheal_repair::{SchemaGuide, check_arguments};

/// How the proxy behaves.
#[derive(Debug, Clone, PartialEq)]
pub struct McpConfig {
    /// The tool-health monitor's thresholds.
    pub monitor: MonitorConfig,
    /// A `tools/call` the server has not answered after this long is cancelled and failed.
    pub call_timeout_ms: u64,
    /// The recovery policy (the same file as `selfheal bench --policy`): its ladders decide
    /// whether a failed call is retried, its `retry` section the backoff.
    pub policy: Policy,
    /// The session's budget. A proxy session has no natural end, so by default only the ladders
    /// bound retries (two for a timed-out call under the default policy); `retries` caps them
    /// over the whole session.
    pub budget: BudgetLimits,
    /// What the operator declares of the server's tools, by name: the gateway's `[tools.NAME]`
    /// tables (the core's [`ToolConfig`]), of which the proxy carries out the output contract
    /// (`output`), freshness (`as_of`, `max_age_ms`, `refresh`) and `reread`. The keys that
    /// need a second source or the conversation (`substitute`, `cross_check`, `tolerance`,
    /// `grounded`) are refused ([`check_tools`]): the proxy sees one call at a time.
    pub tools: BTreeMap<String, ToolConfig>,
}

/// The `selfheal mcp --config FILE` file: `[tools.NAME]` tables, nothing else.
#[derive(Debug, Clone, Default, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct ConfigFile {
    #[serde(default)]
    tools: BTreeMap<String, ToolConfig>,
}

/// Reads the `[tools.NAME]` tables of a `selfheal mcp --config` file (the gateway's keys, see
/// [`McpConfig::tools`]) and checks them ([`check_tools`]). Anything else in the file is
/// refused: the policy has its own file (`--policy`), the monitor's thresholds too.
pub fn tools_from_toml_str(text: &str) -> Result<BTreeMap<String, ToolConfig>, String> {
    let file: ConfigFile = toml::from_str(text).map_err(|e| e.to_string())?;
    check_tools(&file.tools)?;
    Ok(file.tools)
}

/// Checks tool tables for the proxy: each is valid ([`ToolConfig::validate`]) and asks only for
/// what the proxy carries out. A substitute, a cross-check (and its tolerance) or grounded
/// arguments need a second tool's answer or the conversation, which a proxy of one call at a
/// time does not have: such a table is refused rather than silently half carried out.
pub fn check_tools(tools: &BTreeMap<String, ToolConfig>) -> Result<(), String> {
    for (name, t) in tools {
        t.validate(name)?;
        let unsupported = [
            ("substitute", t.substitute.is_some()),
            ("cross_check", t.cross_check),
            ("tolerance", t.tolerance != ToolConfig::default().tolerance),
            ("grounded", t.grounded),
        ];
        if let Some((key, _)) = unsupported.iter().find(|(_, set)| *set) {
            return Err(format!(
                "[tools.{name}]: `{key}` is carried out by the gateway (selfheal serve), not by \
                 the MCP proxy, which sees one call at a time; remove it here"
            ));
        }
    }
    Ok(())
}

impl Default for McpConfig {
    fn default() -> Self {
        McpConfig {
            monitor: MonitorConfig::default(),
            call_timeout_ms: 60_000,
            policy: Policy::default(),
            budget: BudgetLimits::unlimited(),
            tools: BTreeMap::new(),
        }
    }
}

/// Where a message goes.
#[derive(Debug, Clone, PartialEq)]
pub enum Out {
    /// To the MCP server.
    ToServer(Value),
    /// To the MCP client.
    ToClient(Value),
}

/// A decision, for the trace.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    /// What kind: `blocked`, `repair`, `invalid_arguments`, `retry`, `timeout`, `tool_result`,
    /// `guidance`, `paused`, `resumed`, `server_closed`, or one of the core's trace events
    /// (`signal`, `classified`, `action`: the detail is the event itself).
    pub kind: EventKind,
    /// The tool concerned.
    pub tool: String,
    /// Details.
    pub detail: Value,
}

/// Counters of what the proxy did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct Stats {
    /// `tools/call` requests from the client.
    pub calls: u64,
    /// Calls that failed at the server (errors, `isError` results, timeouts), retries included.
    pub failures: u64,
    /// Calls answered by the proxy without reaching the server (paused tool, unusable arguments).
    pub answered: u64,
    /// Calls whose arguments were coerced to the schema.
    pub repaired: u64,
    /// Retries sent (refreshes of stale data included).
    pub retries: u64,
    /// Answers that broke their tool's declared contract (a declared field missing, renamed or
    /// empty, data older than allowed), attempts included.
    pub breaches: u64,
}

#[derive(Debug)]
struct ToolInfo {
    guide: Option<Arc<SchemaGuide>>,
    required: Vec<String>,
    /// The server says calling it twice does no harm (`readOnlyHint` or `idempotentHint`).
    retry_safe: bool,
    /// The tool's `outputSchema`: a mapped-back `structuredContent` must still fit it (a client
    /// validates structured results against it).
    output: Option<Arc<SchemaGuide>>,
}

#[derive(Debug, Clone)]
struct Pending {
    client_id: Value,
    tool: String,
    args: Value,
    /// The request as sent to the server, with its internal id.
    request: Value,
    attempt: u32,
    /// The run took a recovery action for this call (a retry, a refresh, a mapped field): what
    /// it answers next is a recovered value.
    recovered: bool,
    deadline_ms: u64,
    /// When this attempt was sent: progress pushes the deadline back, up to
    /// [`MAX_PROGRESS_EXTENSION`] call timeouts after it.
    sent_ms: u64,
    /// The client's `_meta.progressToken`, if it asked for progress.
    progress_token: Option<Value>,
}

/// A call that keeps reporting progress may run this many call timeouts, at most.
const MAX_PROGRESS_EXTENSION: u64 = 10;

/// The outcome of one attempt of a `tools/call`.
enum Attempt {
    /// A result without `isError`.
    Ok(Value),
    /// A result with `isError: true`: the tool ran and failed.
    ToolError(Value),
    /// A JSON-RPC error.
    RpcError(Value),
    /// No answer in time.
    Timeout,
}

const INTERNAL_PREFIX: &str = "selfheal-";
/// How often a paused tool's cooldown is looked at when nothing else happens.
const PAUSED_POLL_MS: u64 = 1_000;

/// A JSON-RPC error read into the core's terms — the one place the proxy parses them. "Invalid
/// params" and malformed requests are the call's own fault (the model must rewrite it), an
/// unknown method is a wrong tool; "internal error", the implementation-defined server range and
/// anything else are the server failing, whose text the classifier reads.
pub fn rpc_signal(error: &Value) -> Signal {
    let message = error
        .get("message")
        .and_then(Value::as_str)
        .unwrap_or("server error")
        .to_owned();
    match error.get("code").and_then(Value::as_i64) {
        Some(-32602 | -32600 | -32700) => Signal::InvalidArguments {
            errors: vec![message],
        },
        Some(-32601) => Signal::UnknownTool { name: message },
        _ => Signal::Exception { message },
    }
}

/// The text of a tool result's `content` items, joined.
fn result_text(result: &Value) -> String {
    result
        .get("content")
        .and_then(Value::as_array)
        .map(|items| {
            items
                .iter()
                .filter_map(|i| i.get("text").and_then(Value::as_str))
                .collect::<Vec<_>>()
                .join("\n")
        })
        .unwrap_or_default()
}

/// What the contract check made of an answer the run left unrecovered.
enum Kept {
    /// Answer the client with the result (flagged), these guidance notes added, and the breach
    /// left (`drifted`, `empty`, `stale`).
    Answer {
        /// Guidance for the model.
        notes: Vec<String>,
        /// The breach the result was flagged for.
        breach: Option<&'static str>,
    },
}

/// The texts of the run's guidance.
fn texts_of(guidance: Vec<Guidance>) -> impl Iterator<Item = String> {
    guidance.into_iter().map(|g| g.text)
}

/// The value of a tool result, as its contract is read: its `structuredContent` (`true`), else
/// its text read as JSON, else the text itself (`false`).
fn answer_value(result: &Value) -> (Value, bool) {
    if let Some(v) = result.get("structuredContent") {
        return (v.clone(), true);
    }
    let text = result_text(result);
    let value = serde_json::from_str(&text).unwrap_or(Value::String(text));
    (value, false)
}

/// Puts a repaired value in a result: as its `structuredContent` when that is where it was
/// read, and as its text (the text items replaced by the value's JSON, other items kept).
fn put_value(result: &mut Value, v: &Value, structured: bool) {
    let Some(o) = result.as_object_mut() else {
        return;
    };
    if structured {
        o.insert("structuredContent".into(), v.clone());
    }
    let item = json!({"type": "text", "text": v.to_string()});
    match o.get_mut("content").and_then(Value::as_array_mut) {
        Some(items) => {
            items.retain(|i| i.get("type").and_then(Value::as_str) != Some("text"));
            items.insert(0, item);
        }
        None => {
            o.insert("content".into(), json!([item]));
        }
    }
}

/// A tool result the proxy gives itself: one text item, `isError: true`.
fn error_result(text: String) -> Value {
    json!({"content": [{"type": "text", "text": text}], "isError": true})
}

/// The proxy's state for one client-server session.
#[derive(Debug)]
pub struct Proxy {
    config: McpConfig,
    /// The session's one decision surface: every tool result goes in, what to do comes out.
    run: Run,
    /// No target breakers: the run's monitor is the tools' breaker.
    breakers: Breakers,
    /// The run's step id of each tool (one step per tool name, in the order first listed).
    steps: HashMap<String, u32>,
    tools: HashMap<String, ToolInfo>,
    /// Forwarded `tools/call` requests by internal id.
    pending: BTreeMap<String, Pending>,
    /// Retries waiting for their backoff: (due, call).
    retries: Vec<(u64, Pending)>,
    /// Client ids (as JSON text) of `tools/list` and `initialize` requests in flight.
    lists: HashSet<String>,
    inits: HashSet<String>,
    paused: Vec<String>,
    next_id: u64,
    /// The latest `now_ms` seen.
    last_now: u64,
    /// Unix time in milliseconds at `now_ms == 0` (what `as_of` stamps are read against).
    epoch_ms: u64,
    /// A call was answered well in this session: stopping now leaves a partial result.
    had_result: bool,
    stats: Stats,
    decisions: Vec<Decision>,
    /// What the process has learned of the server's tools ([`selfheal_core::Trust`]): the
    /// session's run started from it, and its evidence is reported back as it comes.
    trust: selfheal_core::SharedTrust,
}

impl Proxy {
    /// A proxy for a new session, with a trust store of its own.
    pub fn new(config: McpConfig) -> Result<Proxy, selfheal_core::ConfigError> {
        Proxy::with_trust(config, selfheal_core::SharedTrust::new())
    }

    /// A proxy for a new session whose run starts from, and reports to, the process's trust
    /// store `trust` (on the session's clock: the proxy's `now_ms`).
    pub fn with_trust(
        config: McpConfig,
        trust: selfheal_core::SharedTrust,
    ) -> Result<Proxy, selfheal_core::ConfigError> {
        check_tools(&config.tools).map_err(selfheal_core::ConfigError)?;
        let run = Run::new(ControllerConfig {
            trust: trust.snapshot(),
            monitor: config.monitor.clone(),
            policy: config.policy.clone(),
            budget: config.budget,
            ..ControllerConfig::default()
        })?;
        Ok(Proxy {
            run,
            breakers: Breakers::none(),
            steps: HashMap::new(),
            config,
            tools: HashMap::new(),
            pending: BTreeMap::new(),
            retries: Vec::new(),
            lists: HashSet::new(),
            inits: HashSet::new(),
            paused: Vec::new(),
            next_id: 0,
            last_now: 0,
            epoch_ms: 0,
            had_result: false,
            stats: Stats::default(),
            decisions: Vec::new(),
            trust,
        })
    }

    /// The process's trust store this session reports to.
    pub fn trust(&self) -> &selfheal_core::SharedTrust {
        &self.trust
    }

    /// Hands the evidence the run saw since the last call to the process's trust store.
    fn report_trust(&mut self) {
        let reports = self.run.take_trust_evidence();
        if !reports.is_empty() {
            self.trust.report(&reports, 0, &self.config.policy.trust);
        }
    }

    /// Sets the wall clock: `unix_ms` is Unix time in milliseconds at `now_ms == 0` (the
    /// driver's clock starts at 0 with the session). `as_of` stamps are read against
    /// `unix_ms + now_ms`; without this call `now_ms` itself is taken as Unix time.
    pub fn set_wall_clock(&mut self, unix_ms: u64) {
        self.epoch_ms = unix_ms;
    }

    /// What the proxy did so far.
    pub fn stats(&self) -> Stats {
        self.stats
    }

    /// The decisions taken since the last call (for the trace).
    pub fn take_decisions(&mut self) -> Vec<Decision> {
        std::mem::take(&mut self.decisions)
    }

    /// Tools paused now (the session's run hides them: their circuit is open).
    pub fn paused(&self) -> &[String] {
        &self.paused
    }

    /// Ends the session's run and returns its outcome (status, reason, what was left
    /// unresolved), as any front-end's run ends: what the session amounted to.
    pub fn finish(&mut self, now_ms: u64) -> selfheal_core::RunOutcome {
        let outcome = self.run.finish(now_ms);
        self.report_trust();
        outcome
    }

    /// Whether the session's run has stopped, how and why: from then on every call is
    /// answered by the proxy with the reason.
    pub fn stopped(&self) -> Option<(RunStatus, &str)> {
        self.run.stopped()
    }

    /// When [`Proxy::tick`] next has something to do: the earliest call deadline or retry.
    ///
    /// While a tool is paused the proxy also looks once a second whether its cooldown is over, so
    /// an idle client hears that the tool is back (`notifications/tools/list_changed`) without
    /// having to send anything first.
    pub fn next_deadline(&self) -> Option<u64> {
        let calls = self.pending.values().map(|p| p.deadline_ms);
        let retries = self.retries.iter().map(|(due, _)| *due);
        let resume =
            (!self.paused.is_empty()).then(|| self.last_now.saturating_add(PAUSED_POLL_MS));
        calls.chain(retries).chain(resume).min()
    }

    fn decide(&mut self, kind: EventKind, tool: &str, detail: Value) {
        self.decisions.push(Decision {
            kind,
            tool: tool.to_owned(),
            detail,
        });
    }

    /// A message from the client.
    pub fn from_client(&mut self, msg: Value, now_ms: u64) -> Vec<Out> {
        self.last_now = now_ms;
        let method = msg.get("method").and_then(Value::as_str);
        let id = msg.get("id").filter(|i| !i.is_null()).cloned();
        match (method, id) {
            (Some("tools/call"), Some(id)) => self.call(msg, id, now_ms),
            (Some("tools/list"), Some(id)) => {
                self.lists.insert(id.to_string());
                vec![Out::ToServer(msg)]
            }
            (Some("initialize"), Some(id)) => {
                self.inits.insert(id.to_string());
                vec![Out::ToServer(msg)]
            }
            (Some("notifications/cancelled"), None) => self.cancelled(msg),
            _ => vec![Out::ToServer(msg)],
        }
    }

    /// The client cancelled a request: a forwarded call is cancelled under its internal id, and
    /// a retry waiting for its backoff is dropped.
    fn cancelled(&mut self, mut msg: Value) -> Vec<Out> {
        let Some(target) = msg.pointer("/params/requestId").cloned() else {
            return vec![Out::ToServer(msg)];
        };
        self.retries.retain(|(_, p)| p.client_id != target);
        let internal = self
            .pending
            .iter()
            .find(|(_, p)| p.client_id == target)
            .map(|(k, _)| k.clone());
        match internal {
            Some(k) => {
                self.pending.remove(&k);
                msg["params"]["requestId"] = Value::String(k);
                vec![Out::ToServer(msg)]
            }
            None => vec![Out::ToServer(msg)],
        }
    }

    fn call(&mut self, mut msg: Value, client_id: Value, now_ms: u64) -> Vec<Out> {
        self.stats.calls += 1;
        let tool = msg
            .pointer("/params/name")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        let mut args = msg
            .pointer("/params/arguments")
            .cloned()
            .unwrap_or_else(|| json!({}));
        // A cooldown may have ended since the last message: say so first.
        let mut out = self.announce(now_ms);
        // A tool the run hides is answered here: calling it again would fail again and cost
        // the wait. Once the run has stopped, every call is: the run is over.
        if let Some(text) = self.refusal(&tool) {
            self.stats.answered += 1;
            self.decide(EventKind::Blocked, &tool, json!({}));
            out.push(Out::ToClient(reply(&client_id, error_result(text))));
            return out;
        }
        if let Some(info) = self.tools.get(&tool)
            && let Some(guide) = info.guide.clone()
        {
            // The one non-corrupting path the gateway and the runtime use too: valid
            // arguments untouched, no default written, nothing dropped.
            let outcome = match check_arguments(args, Some(&guide)) {
                Ok(a) => a,
                Err(e) => {
                    self.stats.answered += 1;
                    let text = e.reask_message("", &tool);
                    self.decide(EventKind::InvalidArguments, &tool, json!({"reask": text}));
                    out.push(Out::ToClient(reply(&client_id, error_result(text))));
                    return out;
                }
            };
            if outcome.changed {
                self.stats.repaired += 1;
                self.decide(
                    EventKind::Repair,
                    &tool,
                    json!({"coercions": outcome.coercions.len()}),
                );
            }
            args = outcome.value;
        }
        if let Some(p) = msg.get_mut("params").and_then(Value::as_object_mut) {
            p.insert("arguments".into(), args.clone());
        }
        self.next_id += 1;
        let internal = format!("{INTERNAL_PREFIX}{}", self.next_id);
        msg["id"] = Value::String(internal.clone());
        let progress_token = msg.pointer("/params/_meta/progressToken").cloned();
        let pending = Pending {
            client_id,
            tool,
            args,
            request: msg.clone(),
            attempt: 0,
            recovered: false,
            deadline_ms: now_ms.saturating_add(self.config.call_timeout_ms),
            sent_ms: now_ms,
            progress_token,
        };
        self.pending.insert(internal, pending);
        out.push(Out::ToServer(msg));
        out
    }

    /// A message from the server.
    ///
    /// Time is caught up first ([`Proxy::tick`]): whether a call missed its deadline must not
    /// depend on whether the timer or the answer was handled first, so an answer that arrives
    /// when its call is already past its deadline is the late answer of a call that timed out,
    /// as it would have been a moment later.
    pub fn from_server(&mut self, msg: Value, now_ms: u64, rng: &mut dyn Rng) -> Vec<Out> {
        let is_response = msg.get("method").is_none()
            && (msg.get("result").is_some() || msg.get("error").is_some());
        let mut out = if is_response {
            self.tick(now_ms, rng)
        } else {
            Vec::new()
        };
        out.extend(self.answer(msg, is_response, now_ms, rng));
        self.report_trust();
        out
    }

    /// [`Proxy::from_server`], once time has been caught up.
    fn answer(
        &mut self,
        mut msg: Value,
        is_response: bool,
        now_ms: u64,
        rng: &mut dyn Rng,
    ) -> Vec<Out> {
        self.last_now = now_ms;
        let Some(id) = msg.get("id").filter(|_| is_response).cloned() else {
            // A call that reports progress is alive: its deadline moves with it (MCP allows
            // resetting the timeout on progress), within a hard limit.
            if msg.get("method").and_then(Value::as_str) == Some("notifications/progress")
                && let Some(token) = msg.pointer("/params/progressToken")
            {
                let timeout = self.config.call_timeout_ms;
                for p in self
                    .pending
                    .values_mut()
                    .filter(|p| p.progress_token.as_ref() == Some(token))
                {
                    let limit = p
                        .sent_ms
                        .saturating_add(timeout.saturating_mul(MAX_PROGRESS_EXTENSION));
                    p.deadline_ms = now_ms.saturating_add(timeout).min(limit).max(p.deadline_ms);
                }
            }
            return vec![Out::ToClient(msg)];
        };
        if let Some(internal) = id.as_str()
            && let Some(p) = self.pending.remove(internal)
        {
            let attempt = match (msg.get("result"), msg.get("error")) {
                (_, Some(e)) => Attempt::RpcError(e.clone()),
                (Some(r), None) if r.get("isError") == Some(&Value::Bool(true)) => {
                    Attempt::ToolError(r.clone())
                }
                (Some(r), None) => Attempt::Ok(r.clone()),
                (None, None) => {
                    Attempt::RpcError(json!({"code": -32603, "message": "empty answer"}))
                }
            };
            return self.settle(p, attempt, now_ms, rng);
        }
        let key = id.to_string();
        // An answer under an id the proxy issued but no longer waits for (the call was
        // cancelled, timed out or retried): the client has had its answer or asked for none,
        // and the internal id means nothing to it.
        if !self.lists.contains(&key) && !self.inits.contains(&key) && self.issued(&id) {
            return Vec::new();
        }
        if self.lists.remove(&key) {
            self.learn_tools(&msg);
            self.update_paused(now_ms);
            if let Some(tools) = msg
                .pointer_mut("/result/tools")
                .and_then(Value::as_array_mut)
            {
                let paused = &self.paused;
                tools.retain(|t| {
                    !t.get("name")
                        .and_then(Value::as_str)
                        .is_some_and(|n| paused.iter().any(|p| p == n))
                });
            }
        } else if self.inits.remove(&key) {
            // The proxy tells the client when it pauses or resumes a tool (of a server that
            // offers tools: one that does not must not seem to).
            if let Some(t) = msg
                .pointer_mut("/result/capabilities/tools")
                .and_then(Value::as_object_mut)
            {
                t.insert("listChanged".into(), Value::Bool(true));
            }
        }
        vec![Out::ToClient(msg)]
    }

    /// Whether `id` is one of the internal ids given to forwarded calls.
    fn issued(&self, id: &Value) -> bool {
        id.as_str()
            .and_then(|s| s.strip_prefix(INTERNAL_PREFIX))
            .and_then(|n| n.parse::<u64>().ok())
            .is_some_and(|n| (1..=self.next_id).contains(&n))
    }

    fn learn_tools(&mut self, msg: &Value) {
        let Some(tools) = msg.pointer("/result/tools").and_then(Value::as_array) else {
            return;
        };
        for t in tools {
            let Some(name) = t.get("name").and_then(Value::as_str) else {
                continue;
            };
            let schema = t.get("inputSchema");
            let guide = schema
                .filter(|s| s.as_object().is_some_and(|o| !o.is_empty()))
                .and_then(|s| SchemaGuide::new(s).ok())
                .map(Arc::new);
            let required = schema
                .map(selfheal_repair::required_properties)
                .unwrap_or_default();
            let output = t
                .get("outputSchema")
                .filter(|s| s.as_object().is_some_and(|o| !o.is_empty()))
                .and_then(|s| SchemaGuide::new(s).ok())
                .map(Arc::new);
            let hint =
                |h: &str| t.pointer(&format!("/annotations/{h}")) == Some(&Value::Bool(true));
            self.tools.insert(
                name.to_owned(),
                ToolInfo {
                    guide,
                    required,
                    retry_safe: hint("readOnlyHint") || hint("idempotentHint"),
                    output,
                },
            );
        }
        // The monitor names the other tools the server lists when one keeps failing (the
        // seeds' warning and breaker guidance, decided in the core).
        let mut names: Vec<&str> = self.tools.keys().map(String::as_str).collect();
        names.sort_unstable();
        for n in &names {
            let next = u32::try_from(self.steps.len()).unwrap_or(u32::MAX);
            self.steps.entry((*n).to_owned()).or_insert(next);
        }
        // Nothing random is drawn for an offer.
        let mut rng = selfheal_core::SplitMix64::new(0);
        let mut env = Env {
            now_ms: self.last_now,
            rng: &mut rng,
            breakers: &mut self.breakers,
        };
        self.run.handle(Input::Offered(&names), &mut env);
    }

    /// The server is gone: every call still waiting for it, or for a retry, is answered with a
    /// JSON-RPC error, so no client waits for an answer that cannot come.
    pub fn server_closed(&mut self) -> Vec<Out> {
        let waiting: Vec<Pending> = std::mem::take(&mut self.pending)
            .into_values()
            .chain(
                std::mem::take(&mut self.retries)
                    .into_iter()
                    .map(|(_, p)| p),
            )
            .collect();
        waiting
            .into_iter()
            .map(|p| {
                self.decisions.push(Decision {
                    kind: EventKind::ServerClosed,
                    tool: p.tool.clone(),
                    detail: json!({}),
                });
                Out::ToClient(json!({"jsonrpc": "2.0", "id": p.client_id, "error": {
                    "code": -32603,
                    "message": "selfheal: the MCP server exited before answering this call"
                }}))
            })
            .collect()
    }

    /// Time passes: calls past their deadline fail (and the server is told to stop), retries
    /// whose backoff is over are sent.
    pub fn tick(&mut self, now_ms: u64, rng: &mut dyn Rng) -> Vec<Out> {
        self.last_now = now_ms;
        let mut out = self.announce(now_ms);
        let late: Vec<String> = self
            .pending
            .iter()
            .filter(|(_, p)| p.deadline_ms <= now_ms)
            .map(|(k, _)| k.clone())
            .collect();
        for k in late {
            if let Some(p) = self.pending.remove(&k) {
                self.decide(
                    EventKind::Timeout,
                    &p.tool,
                    json!({"after_ms": self.config.call_timeout_ms, "attempt": p.attempt + 1}),
                );
                out.push(Out::ToServer(json!({
                    "jsonrpc": "2.0", "method": "notifications/cancelled",
                    "params": {"requestId": k, "reason": "selfheal: timed out"}
                })));
                out.extend(self.settle(p, Attempt::Timeout, now_ms, rng));
            }
        }
        let (due, wait): (Vec<_>, Vec<_>) = std::mem::take(&mut self.retries)
            .into_iter()
            .partition(|(d, _)| *d <= now_ms);
        self.retries = wait;
        for (_, mut p) in due {
            self.next_id += 1;
            let internal = format!("{INTERNAL_PREFIX}{}", self.next_id);
            p.request["id"] = Value::String(internal.clone());
            p.deadline_ms = now_ms.saturating_add(self.config.call_timeout_ms);
            p.sent_ms = now_ms;
            out.push(Out::ToServer(p.request.clone()));
            self.pending.insert(internal, p);
        }
        out
    }

    /// One attempt is over: the run decides what comes of it (see [`Proxy::carry_out`]).
    ///
    /// The attempt goes to the session's [`Run`] as one [`Observation::ToolFinished`] (step:
    /// the tool's), with the failure read off the wire as the core's [`Signal`] and, for an
    /// answer of a tool the operator describes, the breach of its declared contract
    /// ([`ToolConfig::judge`]) as the signal: a declared field missing, renamed or empty is a
    /// failed call, stale data is data with a signal. What the proxy can do beyond answering is
    /// offered ([`Options`]): a resend of a tool the server marks read-only or idempotent, a
    /// repair of a drifted answer, a refresh of a tool that declares its cache-bypass argument.
    fn settle(
        &mut self,
        mut p: Pending,
        attempt: Attempt,
        now_ms: u64,
        rng: &mut dyn Rng,
    ) -> Vec<Out> {
        let required = self
            .tools
            .get(&p.tool)
            .map(|t| t.required.clone())
            .unwrap_or_default();
        let failure = match &attempt {
            Attempt::Ok(_) => None,
            Attempt::ToolError(result) => Some(result_text(result)),
            Attempt::RpcError(e) => Some(
                e.get("message")
                    .and_then(Value::as_str)
                    .unwrap_or("server error")
                    .to_owned(),
            ),
            Attempt::Timeout => Some(format!(
                "timed out after {} ms",
                self.config.call_timeout_ms
            )),
        };
        if failure.is_some() {
            self.stats.failures += 1;
        }
        let wall_ms = self.epoch_ms.saturating_add(now_ms);
        let declared = self.config.tools.get(&p.tool).cloned();
        // An answer is read against its tool's declared contract before it counts as one.
        let judged = match (&attempt, &declared) {
            (Attempt::Ok(result), Some(c)) => {
                let (value, structured) = answer_value(result);
                c.judge(&value, wall_ms)
                    .map(|(signal, breach)| (signal, breach, value, structured))
            }
            _ => None,
        };
        if judged.is_some() {
            self.stats.breaches += 1;
        }
        let signal = match (&attempt, &failure, &judged) {
            (_, _, Some((s, ..))) => Some(s.clone()),
            (Attempt::Timeout, ..) => Some(Signal::Timeout),
            (Attempt::RpcError(e), ..) => Some(rpc_signal(e)),
            (Attempt::ToolError(_), Some(text), _) => Some(Signal::ToolError {
                message: text.clone(),
            }),
            _ => None,
        };
        let breach = judged.as_ref().and_then(|(_, b, ..)| b.clone());
        // A resend only of a tool the server says can take one; whether a resend can help at
        // all (a request the tool refused cannot) is the run's decision.
        let retry_safe = self.tools.get(&p.tool).is_some_and(|t| t.retry_safe);
        let refresh_arg = declared
            .as_ref()
            .and_then(|c| c.refresh.clone())
            .filter(|_| p.args.is_object());
        // A repair is offered only when the proxy can carry it out: the renamed field mapped
        // back, keeping the contract and the tool's outputSchema. Otherwise why not is told.
        let mapped = match (&judged, &declared) {
            (Some((_, Some(Breach::Drifted { .. }), value, structured)), Some(c)) => {
                Some(self.map_back(&p.tool, c, value, *structured, wall_ms))
            }
            _ => None,
        };
        let options = Options {
            // The model can always rewrite a call given its error (as in-process).
            repair: match (&mapped, &failure) {
                (Some(Ok(_)), _) => Some(RepairTarget::Output),
                (_, Some(_)) => Some(RepairTarget::Arguments),
                _ => None,
            },
            substitute: None,
            refreshable: refresh_arg.is_some() && retry_safe,
            can_replan: true,
            fallback_model: None,
            human_available: false,
            retry_safe,
            // Something to report exists: an earlier good answer, or this one's data (stale
            // data is data).
            partial_result: self.had_result || matches!(signal, Some(Signal::Stale { .. })),
            max_delay_ms: None,
        };
        // What the monitor reads: the structured value, else the text read as JSON (a tool
        // that answers `{"error": ...}` as text has failed softly), else the text.
        let returned = match &attempt {
            Attempt::Ok(result) => answer_value(result).0,
            _ => Value::Null,
        };
        let breach_text = match (&judged, &breach) {
            (Some((s, ..)), Some(b)) => Some(format!("{}: {}", s.name(), b.field())),
            _ => None,
        };
        let step = self.step_of(&p.tool);
        let outcome_text = failure.clone().or(breach_text);
        let call = match &outcome_text {
            Some(text) => ToolCall::failed(&p.tool, &p.args, text),
            None => ToolCall::returned(&p.tool, &p.args, &returned),
        }
        .with_required(&required);
        let mut env = Env {
            now_ms,
            rng,
            breakers: &mut self.breakers,
        };
        let decided = self.run.decide_step(
            Input::Observed(Observation::ToolFinished {
                step: Some(step),
                call,
                signal,
                options,
                usage: Amounts::default(),
            }),
            &mut env,
        );
        self.record_run(&p.tool);
        let changed = self.update_paused(now_ms);
        let after = outcome_text.clone().unwrap_or_else(|| {
            judged
                .as_ref()
                .map(|(s, ..)| s.name().to_owned())
                .unwrap_or_default()
        });
        let mut attempt = attempt;
        let mut notes: Vec<String> = Vec::new();
        let mut stop: Option<(RunStatus, String)> = None;
        let refused = match &mapped {
            Some(Err(why)) => {
                self.decide(
                    EventKind::Repair,
                    &p.tool,
                    json!({"target": "output", "refused": why}),
                );
                Some(why.clone())
            }
            Some(Ok(_)) | None => None,
        };
        let mut repaired = false;
        let recovering = matches!(decided, StepAction::Recover { .. });
        match decided {
            StepAction::Proceed { guidance, .. } => notes.extend(texts_of(guidance)),
            StepAction::Stop { status, reason } => stop = Some((status, reason)),
            StepAction::Recover { class, action, .. } => match action {
                RecoveryAction::Retry { delay_ms, .. } => {
                    p.recovered = true;
                    let detail = json!({"after": after, "wait_ms": delay_ms, "class": class});
                    return self.again(p, delay_ms, detail, now_ms, changed);
                }
                RecoveryAction::Refresh => {
                    p.recovered = true;
                    if let Some(arg) = &refresh_arg
                        && let Some(args) = p.args.as_object_mut()
                    {
                        args.insert(arg.clone(), Value::Bool(true));
                        if let Some(params) =
                            p.request.get_mut("params").and_then(Value::as_object_mut)
                        {
                            params.insert("arguments".into(), p.args.clone());
                        }
                    }
                    let detail = json!({"after": after, "wait_ms": 0, "refresh": refresh_arg});
                    return self.again(p, 0, detail, now_ms, changed);
                }
                RecoveryAction::Repair {
                    target: RepairTarget::Output,
                } if matches!(mapped, Some(Ok(_))) => {
                    if let (Attempt::Ok(result), Some((_, _, _, structured)), Some(Ok(v))) =
                        (&mut attempt, &judged, &mapped)
                    {
                        put_value(result, v, *structured);
                        let field = breach.as_ref().map(Breach::field).unwrap_or_default();
                        self.decide(
                            EventKind::Repair,
                            &p.tool,
                            json!({"target": "output", "field": field}),
                        );
                        notes.push(format!(
                            "`{}` answered with its declared field `{field}` under another \
                             name (schema drift); selfheal mapped it back.",
                            p.tool
                        ));
                        p.recovered = true;
                        repaired = true;
                    }
                }
                RecoveryAction::Repair { .. } => notes.push(format!(
                    "The call of `{}` failed ({class}); rewrite its arguments from the \
                     error before calling it again.",
                    p.tool
                )),
                RecoveryAction::Substitute { alternative } => notes.push(format!(
                    "`{}` failed ({class}); try a different approach: use \
                     `{alternative}` instead.",
                    p.tool
                )),
                RecoveryAction::Replan
                | RecoveryAction::Escalate { .. }
                | RecoveryAction::Degrade
                | RecoveryAction::Terminate => {
                    let alternatives = self.run.monitor().alternatives(&p.tool);
                    let instead = if alternatives.is_empty() {
                        String::new()
                    } else {
                        let names: Vec<String> =
                            alternatives.iter().map(|a| format!("`{a}`")).collect();
                        format!(" (other tools on offer: {})", names.join(", "))
                    };
                    notes.push(format!(
                        "`{}` failed ({class}); try a different approach{instead}.",
                        p.tool
                    ));
                }
            },
        }
        // A recovery the model carries out (another approach, other arguments) goes with
        // what the run tells the model's next step, as on every front-end: the monitor's
        // warnings, or the stop.
        if recovering {
            let mut env = Env {
                now_ms,
                rng,
                breakers: &mut self.breakers,
            };
            match self.run.decide_step(Input::NextTurn, &mut env) {
                StepAction::Proceed { guidance, .. } => notes.extend(texts_of(guidance)),
                StepAction::Stop { status, reason } => stop = Some((status, reason)),
                StepAction::Recover { .. } => {}
            }
            self.record_run(&p.tool);
        }
        // A breach the run left unrecovered reaches the model flagged.
        let mut breached = None;
        if !repaired
            && let (Attempt::Ok(result), Some((s, ..)), Some(c)) =
                (&mut attempt, &judged, &declared)
        {
            let Kept::Answer { notes: n, breach } =
                self.flag(&p, c, result, s, breach.as_ref(), refused);
            notes.extend(n);
            breached = breach;
        }
        if matches!(attempt, Attempt::Ok(_)) && breached.is_none() {
            // A value a recovery produced, of a tool the operator wants read again: the proxy
            // does not see the answer the value goes into, so it says so with the value.
            if p.recovered
                && declared.as_ref().is_some_and(|c| c.reread)
                && self.config.policy.reread_due(true)
            {
                self.decide(EventKind::Guidance, &p.tool, json!({"reread": p.args}));
                notes.push(format!(
                    "`{}` needed a recovery before this answer: call it again with the same \
                     arguments ({}) and compare, before you rely on its value.",
                    p.tool, p.args
                ));
            }
            // A value a recovery produced, under a policy that claims nothing after one: the
            // proxy cannot flag the run's answer `partial`, so the value says it is not to be
            // claimed.
            if let Some(why) = self.config.policy.claim_refused(p.recovered) {
                self.decide(EventKind::Guidance, &p.tool, json!({"unconfirmed": why}));
                notes.push(format!(
                    "`{}` answered only after a recovery: {why}. Report any answer that rests \
                     on this value as unconfirmed, not as a result.",
                    p.tool
                ));
            }
        }
        // An answer the run's monitor read as a failure (an error body, an empty one) is no
        // result either.
        let ok = failure.is_none() && breached.is_none() && self.run.monitor().streak(&p.tool) == 0;
        self.had_result |= ok;
        let mut detail = json!({
            "ok": ok,
            "attempts": p.attempt + 1,
        });
        if let Some(b) = breached {
            detail["breach"] = Value::String(b.to_owned());
        }
        self.decide(EventKind::ToolResult, &p.tool, detail);
        let mut result = match attempt {
            Attempt::Ok(r) | Attempt::ToolError(r) => r,
            Attempt::RpcError(e) => {
                let mut out = vec![Out::ToClient(
                    json!({"jsonrpc": "2.0", "id": p.client_id, "error": e}),
                )];
                if changed {
                    out.push(list_changed());
                }
                return out;
            }
            Attempt::Timeout => error_result(format!(
                "selfheal: `{}` did not answer within {} ms; the call was cancelled.",
                p.tool, self.config.call_timeout_ms
            )),
        };
        if let Some((status, reason)) = &stop {
            // The run is over. Failed: the result is an error the model cannot take for an
            // answer. Degraded (`partial`): what came back is what there is, and says so.
            if *status == RunStatus::Failed
                && let Some(o) = result.as_object_mut()
            {
                o.insert("isError".into(), Value::Bool(true));
            }
            notes.push(format!(
                "This run is stopped ({reason}): stop calling tools and report what \
                 you have{}.",
                if *status == RunStatus::Failed {
                    ""
                } else {
                    " as partial"
                }
            ));
        }
        if !notes.is_empty() {
            self.decide(EventKind::Guidance, &p.tool, json!({"text": notes}));
            if let Some(content) = result.get_mut("content").and_then(Value::as_array_mut) {
                content.push(
                    json!({"type": "text", "text": format!("[selfheal] {}", notes.join(" "))}),
                );
            }
        }
        let mut out = vec![Out::ToClient(reply(&p.client_id, result))];
        if changed {
            out.push(list_changed());
        }
        out
    }

    /// The step id of `tool` in the run: one per tool name, given in the order first seen.
    fn step_of(&mut self, tool: &str) -> u32 {
        let next = u32::try_from(self.steps.len()).unwrap_or(u32::MAX);
        *self.steps.entry(tool.to_owned()).or_insert(next)
    }

    /// The run's decision records since the last time (signal, class, action with its
    /// inputs, a tool routed around), for the trace and `selfheal trace replay`.
    fn record_run(&mut self, tool: &str) {
        for (_, e) in self.run.take_records() {
            let detail = serde_json::to_value(&e).unwrap_or(Value::Null);
            self.decide(EventKind::from(&e), tool, detail);
        }
    }

    /// Why a call of `tool` is answered here rather than sent: the run hides the tool (its
    /// circuit is open), or the run has stopped.
    fn refusal(&mut self, tool: &str) -> Option<String> {
        if let Some((_, reason)) = self.run.stopped() {
            return Some(format!(
                "selfheal: this session's run is stopped ({reason}), so this call was not \
                 sent. Stop calling tools and report what you have."
            ));
        }
        if !self.paused.iter().any(|t| t == tool) {
            return None;
        }
        let alternatives = self.run.monitor().alternatives(tool);
        let instead = if alternatives.is_empty() {
            "Continue without it.".to_owned()
        } else {
            let names: Vec<String> = alternatives.iter().map(|a| format!("`{a}`")).collect();
            format!(
                "Use another tool on offer instead ({}), or continue without it.",
                names.join(", ")
            )
        };
        Some(format!(
            "selfheal: the tool `{tool}` failed {} times in a row and is paused for a cooldown, \
             so this call was not sent. {instead}",
            self.config.monitor.circuit_after
        ))
    }

    /// The one renamed declared field of a drifted answer mapped back
    /// ([`contract::map_renamed`]), if the result then keeps its contract and fits the tool's
    /// `outputSchema`; otherwise why not.
    fn map_back(
        &self,
        tool: &str,
        c: &ToolConfig,
        value: &Value,
        structured: bool,
        wall_ms: u64,
    ) -> Result<Value, String> {
        let schema = self.tools.get(tool).and_then(|t| t.output.clone());
        contract::map_renamed(value, &c.output).and_then(|v| {
            if let Some((s, _)) = c.judge(&v, wall_ms) {
                return Err(format!(
                    "mapped, the answer still breaks the contract ({})",
                    s.name()
                ));
            }
            // Structured content a client would refuse is no repair.
            let fits =
                |g: &SchemaGuide| check_arguments(v.clone(), Some(g)).is_ok_and(|a| !a.changed);
            match schema.as_deref() {
                Some(g) if structured && !fits(g) => {
                    Err("mapped, the answer would not fit the tool's outputSchema".into())
                }
                Some(_) | None => Ok(v),
            }
        })
    }

    /// Sends the call again after `delay_ms` (a retry or a refresh the run decided).
    fn again(
        &mut self,
        mut p: Pending,
        delay_ms: u64,
        mut detail: Value,
        now_ms: u64,
        changed: bool,
    ) -> Vec<Out> {
        p.attempt += 1;
        self.stats.retries += 1;
        detail["attempt"] = json!(p.attempt);
        self.decide(EventKind::Retry, &p.tool, detail);
        self.retries.push((now_ms.saturating_add(delay_ms), p));
        if changed {
            vec![list_changed()]
        } else {
            Vec::new()
        }
    }

    /// An answer whose breach the core left unrecovered reaches the model flagged: one without
    /// a declared field (missing, renamed or empty) did not deliver what its tool declares, so
    /// it becomes an error result with the reason first; stale data is data with a known age,
    /// so it stays a result and the model is told how old it is.
    fn flag(
        &mut self,
        p: &Pending,
        c: &ToolConfig,
        result: &mut Value,
        signal: &Signal,
        breach: Option<&Breach>,
        refused: Option<String>,
    ) -> Kept {
        let tool = &p.tool;
        let retry_safe = self.tools.get(tool).is_some_and(|t| t.retry_safe);
        let tried = if p.attempt > 0 {
            format!(" after {} attempts", p.attempt + 1)
        } else if !retry_safe {
            format!(
                " (it was not called again: the server does not mark `{tool}` read-only or \
                 idempotent)"
            )
        } else {
            String::new()
        };
        let Some(b) = breach else {
            let (age, max) = match signal {
                Signal::Stale {
                    age_ms, max_age_ms, ..
                } => (*age_ms, *max_age_ms),
                _ => (0, c.max_age_ms),
            };
            let refresh = match &c.refresh {
                None => " and the tool declares no `refresh` argument to bypass its cache",
                Some(_) => "",
            };
            self.decide(EventKind::Guidance, tool, json!({"stale_ms": age}));
            return Kept::Answer {
                notes: vec![format!(
                    "The data of `{tool}` is stale: stamped {age} ms ago, older than the \
                     {max} ms allowed{refresh}{tried}. Do not present it as current: say how \
                     old it is, or get it elsewhere."
                )],
                breach: Some("stale"),
            };
        };
        let (what, name) = match b {
            Breach::Drifted { field } => (
                format!(
                    "its declared field `{field}` is missing (renamed or dropped: schema drift)"
                ),
                "drifted",
            ),
            Breach::Empty { field } => (
                format!("its declared field `{field}` is null or empty"),
                "empty",
            ),
        };
        let mapped = refused
            .map(|why| format!(" It cannot be mapped back: {why}."))
            .unwrap_or_default();
        let text = format!(
            "selfheal: the answer of `{tool}` breaks its declared output contract: \
             {what}{tried}.{mapped} Treat this call as failed: do not use its answer as if it \
             were complete."
        );
        self.decide(EventKind::Guidance, tool, json!({"flagged": name}));
        match result.as_object_mut() {
            Some(o) => {
                o.insert("isError".into(), Value::Bool(true));
                let item = json!({"type": "text", "text": text});
                match o.get_mut("content").and_then(Value::as_array_mut) {
                    Some(items) => items.insert(0, item),
                    None => {
                        o.insert("content".into(), json!([item]));
                    }
                }
            }
            None => *result = error_result(text),
        }
        Kept::Answer {
            notes: Vec::new(),
            breach: Some(name),
        }
    }

    fn update_paused(&mut self, now_ms: u64) -> bool {
        let mut now = self.run.verdict(now_ms).hidden_tools;
        now.sort();
        if now == self.paused {
            return false;
        }
        for t in now.iter().filter(|t| !self.paused.contains(t)) {
            self.decisions.push(Decision {
                kind: EventKind::Paused,
                tool: t.clone(),
                detail: json!({}),
            });
        }
        for t in self.paused.iter().filter(|t| !now.contains(t)) {
            self.decisions.push(Decision {
                kind: EventKind::Resumed,
                tool: t.clone(),
                detail: json!({}),
            });
        }
        self.paused = now;
        true
    }

    /// Tells the client the tool list changed when a tool was paused or resumed.
    fn announce(&mut self, now_ms: u64) -> Vec<Out> {
        if self.update_paused(now_ms) {
            vec![list_changed()]
        } else {
            Vec::new()
        }
    }
}

fn list_changed() -> Out {
    Out::ToClient(json!({"jsonrpc": "2.0", "method": "notifications/tools/list_changed"}))
}

fn reply(id: &Value, result: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "result": result})
}
