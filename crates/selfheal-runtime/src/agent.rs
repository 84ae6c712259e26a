//! The agent loop: the core's controller decides, this loop performs the calls.
//!
//! Why a loop of its own rather than a callback into someone else's agent: the loop must do what
//! the controller says — sleep the backoff it computed, switch to the fallback model it chose,
//! stop offering the tools it hid, and stop when it aborts — and the only way to guarantee that
//! is to own the loop. Every model call and every tool call, failed or not, is reported to the
//! controller, so the run's one budget ledger sees every attempt.
//!
//! One turn: ask the current model (tools minus hidden ones, the monitor's guidance as a system
//! message) → check each tool call against its tool's schema (JSON repair and safe coercion
//! first, a re-ask with the precise error otherwise) → run the valid calls under their timeouts
//! → check each successful output against its tool's output schema, if it has one → act on each
//! directive (retry after the backoff, substitute, hand the error back to the model to replan,
//! fall back, degrade, abort). A model reply without tool calls is the answer, once the answer
//! verifier, if the agent has one, accepts it.
//!
//! Why verify at all: the failures that announce themselves (timeouts, 5xx, bad JSON) are the easy
//! ones. A tool that returns a plausible but wrong shape, or a model that answers with a value no
//! tool ever produced, would otherwise be accepted as correct — a silent failure. Both checks
//! report to the controller as [`Observation::Verified`], so a rejection is a recoverable
//! `verification_failure` that climbs the policy's ladder and spends the same budget as every
//! other recovery, and every judgement lands in the trace. A rejected tool output is never shown
//! to the model as a result: the model is told that the tool's output failed verification, and
//! why. A rejected answer is handed back to the model with the reason; when recovery is over the
//! run ends `partial` with the answer kept and the reason, or `failed` if the policy terminates.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use serde_json::{Value, json};
use tokio::time::Instant;

use selfheal_core::{
    Action, ActionKind, Amounts, Breakers, CallOutcome, ControllerConfig, Env, EscalationTarget,
    FailureClass, Input, Judgement, Observation, Options, Proposed, REREAD_VERIFIER,
    RecoveryAction, RepairTarget, Run, RunStatus, Signal, SplitMix64, StepAction, StepsBy, Subject,
    ToolCall, Unresolved, Verifier, ungrounded_arguments,
};
use selfheal_repair::{ArgumentsError, Ending, SchemaGuide, TextCalls, find_text_calls};

use crate::tool::{Effect, Tool, ToolError};
use selfheal_openai::{ClientError, ModelClient};

/// An agent: a fallback chain of models, its tools and its control-plane configuration.
#[derive(Clone)]
pub struct Agent {
    /// The fallback chain: `(client, model name)`, first is used first.
    pub models: Vec<(ModelClient, String)>,
    /// The tools offered to the model.
    pub tools: Vec<Arc<dyn Tool>>,
    /// Monitor, classifier, policy and budget of each run.
    pub config: ControllerConfig,
    /// Whether a destructive tool may be retried after it may have run.
    pub allow_destructive_retry: bool,
    /// At most this many model calls per run (a guard; the budget is the real bound).
    pub max_model_calls: u32,
    /// `max_tokens` sent with every model call, if any.
    pub max_tokens: Option<u32>,
    /// `tool_choice` sent when tools are offered (`"auto"` by default).
    pub tool_choice: Value,
    /// `temperature` sent with every model call, if any.
    pub temperature: Option<f64>,
    /// Checks the model's final answer before it is accepted (`None`: every answer stands).
    ///
    /// The verifier sees the answer as a JSON string, `claims_success: true`, the failures the
    /// controller left unresolved (earlier rejections of the answer itself not counted), and as
    /// evidence the outputs of the run's successful tool calls — never one that failed its output
    /// schema — the most recent [`MAX_EVIDENCE`] of them. A rejection is recovered like any
    /// failure; acceptance or uncertainty lets the answer stand.
    pub answer_verifier: Option<Arc<dyn Verifier + Send + Sync>>,
    /// What this agent's runs have learned of their tools ([`selfheal_core::Trust`]): each run
    /// starts from it and reports its evidence back; a clone of it shares the store.
    pub trust: ProcessTrust,
}

/// The trust a process keeps across its runs: the core's shared store and the process clock
/// the runs' own clocks (each starting at 0) are placed on, so evidence decays across runs.
#[derive(Debug, Clone)]
pub struct ProcessTrust {
    /// The store.
    pub store: selfheal_core::SharedTrust,
    epoch: Instant,
}

impl Default for ProcessTrust {
    fn default() -> Self {
        ProcessTrust {
            store: selfheal_core::SharedTrust::new(),
            epoch: Instant::now(),
        }
    }
}

impl ProcessTrust {
    /// Milliseconds since the store was made: where a run starting now sits on its clock.
    pub fn now_ms(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
    }
}

/// At most this many tool outputs are kept as evidence for the answer verifier (the most recent).
pub const MAX_EVIDENCE: usize = 64;

/// At most this many rejected outputs of one call are retried or substituted: the last one is
/// reported to the controller with retries and substitutes off the table, so it picks (and
/// charges) another action, and the loop hands the call back to the model should one still come. A guard, like `max_model_calls`: the ladder, the per-failure cap
/// and the budget are the real bounds (the controller reopens the failure a retried call's
/// rejected output belongs to, so the rejections climb one ladder), but a policy may configure
/// a long ladder of retries with no cap and no budget.
const MAX_REJECTED_OUTPUTS_PER_CALL: u32 = 8;

impl std::fmt::Debug for Agent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Agent")
            .field(
                "models",
                &self.models.iter().map(|(_, m)| m).collect::<Vec<_>>(),
            )
            .field(
                "tools",
                &self
                    .tools
                    .iter()
                    .map(|t| &t.spec().name)
                    .collect::<Vec<_>>(),
            )
            .field("allow_destructive_retry", &self.allow_destructive_retry)
            .field(
                "answer_verifier",
                &self.answer_verifier.as_ref().map(|v| v.name()),
            )
            .finish_non_exhaustive()
    }
}

/// The typed result of a run: what was done, what was not, and what it cost.
#[derive(Debug, Clone, Serialize)]
pub struct RunResult {
    /// `complete`, `partial` or `failed`.
    pub status: RunStatus,
    /// Why, when not complete.
    pub reason: Option<String>,
    /// The model's final answer, if it gave one.
    pub answer: Option<String>,
    /// Failures never recovered.
    pub unresolved: Vec<Unresolved>,
    /// Recovery actions taken, by kind.
    pub actions: Vec<(ActionKind, u64)>,
    /// Each recovery action and each verifier rejection, in order, in words.
    pub recovery_log: Vec<String>,
    /// What the run spent from its budget.
    pub spent: Amounts,
    /// Tokens reported by the model server(s).
    pub tokens: u64,
    /// Model calls made, failed ones included.
    pub model_calls: u64,
    /// Tool calls made, failed ones included.
    pub tool_calls: u64,
    /// The model that was current when the run ended.
    pub model: String,
    /// The conversation, as last sent plus the final answer.
    pub messages: Vec<Value>,
    /// The control plane's trace as JSON Lines.
    pub trace_jsonl: String,
}

enum Stop {
    Partial(String),
    Failed(String),
}

struct Loop<'a> {
    agent: &'a Agent,
    run: Run,
    /// Reads per value of the re-read before answering the run asked for.
    reread_times: u32,
    rng: SplitMix64,
    start: Instant,
    messages: Vec<Value>,
    model_idx: usize,
    progress: u32,
    tool_results: u64,
    tokens: u64,
    model_calls: u64,
    tool_calls: u64,
    log: Vec<String>,
    guides: BTreeMap<String, Option<SchemaGuide>>,
    /// Outputs of successful tool calls that passed their output schema, the most recent
    /// [`MAX_EVIDENCE`]: the answer verifier's evidence.
    evidence: VecDeque<Value>,
    /// The last answer the verifier rejected and why, kept for a run that ends partial.
    rejected: Option<(String, String)>,
    /// The run's successful calls of read-only tools, the most recent [`MAX_EVIDENCE`]: what a
    /// re-read before answering ([`Controller::reread_due`]) reads again.
    reads: VecDeque<Read>,
    /// Where this run's clock starts on the agent's trust clock ([`ProcessTrust::now_ms`]).
    trust_offset: u64,
    /// The task's own words: the texts of the system, developer and user messages the run was
    /// given. With [`Loop::evidence`], what the final answer's numbers are grounded in (the
    /// core's grounding rule); the loop's own messages to the model are not evidence.
    task: Vec<Value>,
}

/// A successful call of a read-only tool, kept to be read again before the answer.
struct Read {
    step: Option<u32>,
    tool: Arc<dyn Tool>,
    args: Value,
    value: Value,
}

/// What the run said of a proposed answer ([`Loop::propose`]).
enum Proposal {
    /// Ask the model again with this guidance: the answer announced a call.
    AskAgain(String),
    /// Read the values again first.
    ReadAgain,
    /// Go on to the answer's verifier.
    Answer,
}

/// What to do with an answer after its verification.
enum AnswerVerdict {
    /// It stands: the run ends with it.
    Stands,
    /// It was rejected and the model has been told why: ask again.
    AskAgain,
}

struct CheckedCall {
    id: String,
    tool: Arc<dyn Tool>,
    args: Value,
    repaired: bool,
}

fn canon(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '_'
            }
        })
        .collect()
}

impl Agent {
    /// An agent over one model with the default control-plane configuration.
    pub fn new(client: ModelClient, model: impl Into<String>, tools: Vec<Arc<dyn Tool>>) -> Self {
        Agent {
            models: vec![(client, model.into())],
            tools,
            config: ControllerConfig::default(),
            allow_destructive_retry: false,
            max_model_calls: 16,
            max_tokens: None,
            tool_choice: json!("auto"),
            temperature: None,
            answer_verifier: None,
            trust: ProcessTrust::default(),
        }
    }

    /// The same agent with an answer verifier (see [`Agent::answer_verifier`]).
    pub fn with_answer_verifier(mut self, verifier: impl Verifier + Send + Sync + 'static) -> Self {
        self.answer_verifier = Some(Arc::new(verifier));
        self
    }

    /// Adds a fallback model at the end of the chain.
    pub fn with_fallback(mut self, client: ModelClient, model: impl Into<String>) -> Self {
        self.models.push((client, model.into()));
        self
    }

    /// Runs the loop on `messages` (OpenAI chat messages) until the model answers, the budget
    /// is spent, or the controller degrades or aborts. `seed` seeds the backoff jitter.
    pub async fn run(&self, messages: Vec<Value>, seed: u64) -> RunResult {
        let trust_offset = self.trust.now_ms();
        let config = ControllerConfig {
            trust: self.trust.store.snapshot(),
            ..self.config.clone()
        };
        let run = match Run::new(config) {
            // The run knows what the agent is offered, so a tool that keeps failing is routed
            // around while another is left (the seeds' monitor rule, decided in the core).
            Ok(mut r) => {
                let names: Vec<&str> = self.tools.iter().map(|t| t.spec().name.as_str()).collect();
                let mut env = Env {
                    now_ms: 0,
                    rng: &mut SplitMix64::new(seed),
                    breakers: &mut Breakers::none(),
                };
                r.handle(Input::Offered(&names), &mut env);
                r
            }
            Err(e) => {
                return RunResult {
                    status: RunStatus::Failed,
                    reason: Some(format!("invalid configuration: {e}")),
                    answer: None,
                    unresolved: Vec::new(),
                    actions: Vec::new(),
                    recovery_log: Vec::new(),
                    spent: Amounts::default(),
                    tokens: 0,
                    model_calls: 0,
                    tool_calls: 0,
                    model: String::new(),
                    messages,
                    trace_jsonl: String::new(),
                };
            }
        };
        let guides = self
            .tools
            .iter()
            .map(|t| {
                let spec = t.spec();
                (spec.name.clone(), SchemaGuide::new(&spec.parameters).ok())
            })
            .collect();
        let task = selfheal_openai::task_texts(&messages);
        let mut l = Loop {
            agent: self,
            run,
            reread_times: 1,
            rng: SplitMix64::new(seed),
            start: Instant::now(),
            messages,
            model_idx: 0,
            progress: 0,
            tool_results: 0,
            tokens: 0,
            model_calls: 0,
            tool_calls: 0,
            log: Vec::new(),
            guides,
            evidence: VecDeque::new(),
            rejected: None,
            reads: VecDeque::new(),
            trust_offset,
            task,
        };
        let ended = l.drive().await;
        l.finish(ended)
    }
}

impl Stop {
    /// The stop of a run that ended with `status`.
    fn of(status: RunStatus, reason: String) -> Stop {
        match status {
            RunStatus::Partial => Stop::Partial(reason),
            RunStatus::Complete | RunStatus::Failed => Stop::Failed(reason),
        }
    }
}

impl Loop<'_> {
    /// Runs `f` on the run with this loop's clock and randomness (an in-process agent keeps
    /// no breakers of its own: its tools' health is the monitor's).
    fn with_env<R>(&mut self, f: impl FnOnce(&mut Run, &mut Env<'_>) -> R) -> R {
        let now_ms = self.now();
        let mut breakers = Breakers::none();
        let mut env = Env {
            now_ms,
            rng: &mut self.rng,
            breakers: &mut breakers,
        };
        f(&mut self.run, &mut env)
    }

    /// Hands the run one input about a step and returns its decision.
    fn decide(&mut self, input: Input<'_>) -> StepAction {
        self.with_env(|run, env| run.decide_step(input, env))
    }

    /// Proposes the answer to the run, with its text and the run's evidence (the task's words
    /// and the tool results): whether it asks the model again first (the answer announces a
    /// call instead of making it: the guidance to append), or asks for the values to be read
    /// again first (with how many reads each). The run also judges the answer (the core's
    /// answer rules: a call announced, no tool result at all, a number found nowhere in the
    /// run): such an answer ends the run `partial` ([`Run::finish`]), which the log says.
    fn propose(&mut self, answer: &str) -> Proposal {
        let mut evidence = self.task.clone();
        evidence.extend(self.evidence.iter().cloned());
        let proposed = Input::AnswerProposed {
            by: StepsBy::Plan,
            answer: Some(Proposed {
                text: answer,
                evidence: &evidence,
                may_call: true,
            }),
        };
        let actions = self.with_env(|run, env| run.decide(proposed, env));
        if let Some(why) = self
            .run
            .unclaimable_answer(
                StepsBy::Plan,
                Some(Proposed {
                    text: answer,
                    evidence: &evidence,
                    may_call: true,
                }),
            )
            .filter(|_| self.run.unclaimable(StepsBy::Plan).is_none())
        {
            self.log.push(format!("grounding: {why}"));
        }
        for a in actions {
            match a {
                Action::AskAgain { guidance, reason } => {
                    self.log.push(format!("ask again: {reason}"));
                    return Proposal::AskAgain(guidance);
                }
                Action::ReadAgain { reads } => {
                    self.reread_times = reads;
                    return Proposal::ReadAgain;
                }
                _ => {}
            }
        }
        Proposal::Answer
    }

    /// Moves to the next model of the fallback chain (staying on the last one), and says so.
    fn fall_back(&mut self, model: &str, class: FailureClass, what: &str) {
        self.log
            .push(format!("fall back to model {model} ({class}: {what})"));
        if self.model_idx + 1 < self.agent.models.len() {
            self.model_idx += 1;
        }
    }

    fn now(&self) -> u64 {
        u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    fn fallback(&self) -> Option<String> {
        self.agent
            .models
            .get(self.model_idx + 1)
            .map(|(_, m)| m.clone())
    }

    /// The step id of a call of `tool` now: one per tool and per point of progress (odd; the
    /// model's steps are even). A failure is the failing tool's, as on the gateway and the MCP
    /// proxy: another tool's success does not settle it, and another tool's failure is not
    /// the recovery of it (the failure-rate rule applies across tools).
    fn tool_step(&self, tool: &str) -> u32 {
        let n = u32::try_from(self.agent.tools.len())
            .unwrap_or(u32::MAX)
            .max(1);
        let idx = self
            .agent
            .tools
            .iter()
            .position(|t| t.spec().name == tool)
            .and_then(|i| u32::try_from(i).ok())
            .unwrap_or(0);
        self.progress
            .saturating_mul(n)
            .saturating_add(idx)
            .saturating_mul(2)
            .saturating_add(1)
    }

    fn find_tool(&self, name: &str) -> Option<Arc<dyn Tool>> {
        self.agent
            .tools
            .iter()
            .find(|t| t.spec().name == name)
            .cloned()
    }

    /// Runs turns until an answer (`Ok(Some)`), or a stop.
    async fn drive(&mut self) -> Result<String, Stop> {
        if self.agent.models.is_empty() {
            return Err(Stop::Failed("no model configured".into()));
        }
        loop {
            if self.model_calls >= u64::from(self.agent.max_model_calls) {
                return Err(Stop::Partial(format!(
                    "stopped after {} model calls without an answer",
                    self.model_calls
                )));
            }
            let (guidance, hidden) = match self.decide(Input::NextTurn) {
                StepAction::Proceed {
                    guidance,
                    hidden_tools,
                } => (guidance, hidden_tools),
                StepAction::Stop { status, reason } => return Err(Stop::of(status, reason)),
                StepAction::Recover { .. } => (Vec::new(), Vec::new()),
            };
            let offered: Vec<Arc<dyn Tool>> = self
                .agent
                .tools
                .iter()
                .filter(|t| !hidden.contains(&t.spec().name))
                .cloned()
                .collect();
            let mut msgs = self.messages.clone();
            if !guidance.is_empty() {
                let text = guidance
                    .iter()
                    .map(|g| format!("- {}", g.text))
                    .collect::<Vec<_>>()
                    .join("\n");
                msgs.push(json!({"role": "system", "content": format!("Guidance from the run monitor:\n{text}")}));
            }
            let (client, model) = &self.agent.models[self.model_idx];
            let mut body = json!({"model": model, "messages": msgs});
            if !offered.is_empty() {
                body["tools"] = Value::Array(offered.iter().map(|t| t.spec().openai()).collect());
                body["tool_choice"] = self.agent.tool_choice.clone();
            }
            if let Some(m) = self.agent.max_tokens {
                body["max_tokens"] = json!(m);
            }
            if let Some(t) = self.agent.temperature {
                body["temperature"] = json!(t);
            }
            let t0 = Instant::now();
            self.model_calls += 1;
            let res = client.chat(&body).await;
            let latency_ms = u64::try_from(t0.elapsed().as_millis()).unwrap_or(u64::MAX);
            let step = Some(2 * self.progress);
            match res {
                Err(e) => self.model_failed(e, step, latency_ms).await?,
                Ok(c) => {
                    self.tokens += c.tokens;
                    let usage = Amounts {
                        latency_ms,
                        cost: c.tokens,
                        ..Amounts::default()
                    };
                    let msg = c.message().cloned().unwrap_or(Value::Null);
                    let mut content = msg
                        .get("content")
                        .and_then(Value::as_str)
                        .unwrap_or("")
                        .to_owned();
                    let mut calls: Vec<Value> = msg
                        .get("tool_calls")
                        .and_then(Value::as_array)
                        .cloned()
                        .unwrap_or_default();
                    let refused = c.finish_reason() == Some("content_filter")
                        || msg.get("refusal").is_some_and(|r| !r.is_null());
                    // A call written as text (a fence, `<tool_call>` tags, …) is a call, not
                    // an answer: taken when it reads without a guess, re-asked when not.
                    let mut written_as_text = None;
                    if calls.is_empty() && !refused && !offered.is_empty() {
                        let names: Vec<&str> =
                            offered.iter().map(|t| t.spec().name.as_str()).collect();
                        match find_text_calls(&content, &names) {
                            TextCalls::None => {}
                            TextCalls::Found { calls: found, rest } => {
                                self.log.push(format!(
                                    "salvage: {} tool call(s) written as text taken as calls",
                                    found.len()
                                ));
                                calls = found
                                    .into_iter()
                                    .enumerate()
                                    .map(|(i, c)| {
                                        json!({
                                            "id": format!("call_text_{}_{i}", self.model_calls),
                                            "type": "function",
                                            "function": {"name": c.name, "arguments": c.arguments},
                                        })
                                    })
                                    .collect();
                                content = rest;
                            }
                            TextCalls::Doubt { reason } => written_as_text = Some(reason),
                        }
                    }
                    if calls.is_empty() {
                        let signal = if refused {
                            Some(Signal::Refusal)
                        } else {
                            written_as_text
                                .as_ref()
                                .map(|reason| Signal::InvalidArguments {
                                    errors: vec![format!("at (root): {reason}")],
                                })
                        };
                        let options = Options {
                            can_replan: true,
                            fallback_model: self.fallback(),
                            retry_safe: true,
                            partial_result: self.tool_results > 0,
                            ..Options::default()
                        };
                        let failed = signal.is_some();
                        let d = self.decide(Input::Observed(Observation::ModelFinished {
                            step,
                            signal,
                            options,
                            usage,
                        }));
                        if !failed {
                            // An answer that arrives as the budget runs out is kept; the
                            // controller has marked the run partial.
                            self.messages
                                .push(json!({"role": "assistant", "content": content}));
                            match self.propose(&content) {
                                Proposal::AskAgain(guidance) => {
                                    self.messages
                                        .push(json!({"role": "user", "content": guidance}));
                                    continue;
                                }
                                Proposal::ReadAgain if !self.reread().await? => continue,
                                Proposal::ReadAgain | Proposal::Answer => {}
                            }
                            match self.verify_answer(&content).await? {
                                AnswerVerdict::Stands => return Ok(content),
                                AnswerVerdict::AskAgain => continue,
                            }
                        }
                        if let Some(reason) = written_as_text {
                            self.model_directive(d, "a tool call written as text")
                                .await?;
                            self.messages
                                .push(json!({"role": "assistant", "content": content}));
                            self.messages.push(json!({"role": "user", "content": format!(
                                "Your answer wrote a tool call as text, which was not run: {reason}. \
                                 Call a tool on offer with a structured tool call, or answer in words."
                            )}));
                            continue;
                        }
                        self.model_directive(d, "the model refused").await?;
                        self.messages.push(json!({"role": "user", "content": "Please do the task with the tools offered."}));
                        continue;
                    }
                    let ending = Ending::from_finish_reason(c.finish_reason());
                    self.tool_turn(&offered, &content, &calls, ending, step, usage)
                        .await?;
                }
            }
        }
    }

    /// What the controller may do about a judgement of the answer (its own, or the re-read of a
    /// value it rests on): ask the model again, fall back, replan or degrade.
    fn answer_options(&self) -> Options {
        Options {
            can_replan: true,
            fallback_model: self.fallback(),
            // Asking the model again has no side effect.
            retry_safe: true,
            // The answer itself: degrading keeps it, flagged with the reason.
            partial_result: true,
            ..Options::default()
        }
    }

    /// The core's re-read before answering a run that needed a recovery
    /// ([`Controller::reread_due`]): each kept call of a read-only tool is made again with the
    /// same arguments, [`Controller::reread_reads`] times (each a real call, counted and timed
    /// out like any other), and each read is judged — the
    /// same value accepts it, another rejects it, a failed read cannot tell — and the judgement
    /// is reported to the controller as the `re_read` verifier's. Whether every value held
    /// (`true`: the answer goes on to its own verifier); on the first that changed, the model is
    /// shown both values and asked for a corrected answer (`false`), unless the controller
    /// stops the run.
    async fn reread(&mut self) -> Result<bool, Stop> {
        let reads: Vec<Read> = self.reads.drain(..).collect();
        let times = self.reread_times;
        for read in reads
            .iter()
            .flat_map(|r| std::iter::repeat_n(r, times as usize))
        {
            let spec = read.tool.spec().clone();
            self.tool_calls += 1;
            let again = tokio::time::timeout(spec.timeout, read.tool.call(read.args.clone())).await;
            let judgement = match again {
                Ok(Ok(v)) if v == read.value => Judgement::Accept,
                Ok(Ok(v)) => Judgement::Reject {
                    reason: format!(
                        "`{}` gave {} and then {} for the same call",
                        spec.name, read.value, v
                    ),
                },
                Ok(Err(e)) => Judgement::Uncertain {
                    reason: format!("`{}` could not be read again: {e}", spec.name),
                },
                Err(_) => Judgement::Uncertain {
                    reason: format!("`{}` timed out when read again", spec.name),
                },
            };
            let why = match &judgement {
                Judgement::Reject { reason } => Some(reason.clone()),
                Judgement::Accept | Judgement::Uncertain { .. } => None,
            };
            let d = self.decide(Input::Observed(Observation::Verified {
                step: read.step,
                verifier: REREAD_VERIFIER,
                judgement,
                options: self.answer_options(),
            }));
            let Some(why) = why else { continue };
            self.log.push(format!("re-read before answering: {why}"));
            match d {
                StepAction::Stop { status, reason } => return Err(Stop::of(status, reason)),
                StepAction::Proceed { .. } | StepAction::Recover { .. } => {}
            }
            self.messages.push(json!({"role": "user", "content": format!(
                "Before your answer was accepted, the tools were read once more, and one changed: {why}. The earlier value is in doubt. Check your answer against the new value (call the tool again if you need to) and give a corrected final answer."
            )}));
            return Ok(false);
        }
        Ok(true)
    }

    /// Runs the answer verifier, if any, on `answer` (already in the history) and acts on the
    /// controller's directive.
    ///
    /// The verdict is reported at step `None`, the answer's own. A successful model call resolves
    /// the failure open on its step, so were the answer judged on the model's step, every new
    /// answer would restart the ladder; at `None`, answers that keep being rejected climb one
    /// ladder to its end, and an accepted answer resolves the failure.
    async fn verify_answer(&mut self, answer: &str) -> Result<AnswerVerdict, Stop> {
        let Some(verifier) = self.agent.answer_verifier.clone() else {
            return Ok(AnswerVerdict::Stands);
        };
        let name = verifier.name().to_owned();
        let output = Value::String(answer.to_owned());
        // Earlier rejections of the answer itself are not failures of the work it reports on.
        let unresolved = self
            .run
            .unresolved()
            .iter()
            .filter(|u| !(u.step.is_none() && u.class == FailureClass::VerificationFailure))
            .count();
        let judgement = verifier.verify(&Subject {
            output: &output,
            claims_success: true,
            unresolved_failures: unresolved,
            evidence: self.evidence.make_contiguous(),
        });
        let why = match &judgement {
            Judgement::Reject { reason } => Some(reason.clone()),
            Judgement::Uncertain { reason } => {
                self.log.push(format!(
                    "verifier `{name}` is uncertain about the answer ({reason}); it stands"
                ));
                None
            }
            Judgement::Accept => None,
        };
        let d = self.decide(Input::Observed(Observation::Verified {
            step: None,
            verifier: &name,
            judgement,
            options: self.answer_options(),
        }));
        let Some(why) = why else {
            self.rejected = None;
            return Ok(AnswerVerdict::Stands);
        };
        self.log
            .push(format!("verifier `{name}` rejected the answer: {why}"));
        self.rejected = Some((answer.to_owned(), format!("`{name}`: {why}")));
        match d {
            // A rejection never stands: had the controller nothing to say, the model is still
            // asked again, within `max_model_calls`.
            StepAction::Proceed { .. } => {}
            StepAction::Stop { status, reason } => return Err(Stop::of(status, reason)),
            StepAction::Recover { action, class, .. } => match action {
                RecoveryAction::Retry { delay_ms, attempt } => {
                    self.log.push(format!(
                        "ask for the answer again #{attempt} after {delay_ms} ms ({class})"
                    ));
                    tokio::time::sleep(Duration::from_millis(delay_ms)).await;
                }
                RecoveryAction::Escalate {
                    target: EscalationTarget::FallbackModel { model },
                } => {
                    self.log.push(format!(
                        "fall back to model {model} for the answer ({class})"
                    ));
                    if self.model_idx + 1 < self.agent.models.len() {
                        self.model_idx += 1;
                    }
                }
                RecoveryAction::Escalate {
                    target: EscalationTarget::Human,
                } => {
                    return Err(Stop::Partial(format!(
                        "needs a person ({class}: the answer was rejected)"
                    )));
                }
                other @ (RecoveryAction::Repair { .. }
                | RecoveryAction::Substitute { .. }
                | RecoveryAction::Replan
                | RecoveryAction::Refresh
                | RecoveryAction::Degrade
                | RecoveryAction::Terminate) => self.log.push(format!(
                    "{}: hand the rejection of the answer back to the model ({class})",
                    other.kind().as_str()
                )),
            },
        }
        self.messages.push(json!({"role": "user", "content": format!(
            "Your answer was not accepted. The `{name}` check says: {why}\nCheck your answer against the tool results, call a tool if you need more information, and give a corrected final answer."
        )}));
        Ok(AnswerVerdict::AskAgain)
    }

    /// Acts on the directive after a failed model call.
    async fn model_directive(&mut self, d: StepAction, what: &str) -> Result<(), Stop> {
        match d {
            StepAction::Proceed { .. } => Ok(()),
            StepAction::Stop { status, reason } => Err(Stop::of(status, reason)),
            StepAction::Recover { action, class, .. } => {
                match &action {
                    RecoveryAction::Retry { delay_ms, attempt } => {
                        self.log.push(format!(
                            "retry model call #{attempt} after {delay_ms} ms ({class}: {what})"
                        ));
                        tokio::time::sleep(Duration::from_millis(*delay_ms)).await;
                    }
                    RecoveryAction::Escalate {
                        target: EscalationTarget::FallbackModel { model },
                    } => {
                        self.fall_back(model, class, what);
                    }
                    RecoveryAction::Escalate {
                        target: EscalationTarget::Human,
                    } => {
                        return Err(Stop::Partial(format!("needs a person ({class}: {what})")));
                    }
                    RecoveryAction::Repair {
                        target: RepairTarget::Request,
                    } => {
                        let n = repair_request(&mut self.messages);
                        self.log.push(format!(
                            "repair request shape ({n} message(s) changed; {class}: {what})"
                        ));
                    }
                    other @ (RecoveryAction::Repair { .. }
                    | RecoveryAction::Substitute { .. }
                    | RecoveryAction::Replan
                    | RecoveryAction::Refresh
                    | RecoveryAction::Degrade
                    | RecoveryAction::Terminate) => {
                        self.log.push(format!(
                            "{} on model call ({class}: {what})",
                            other.kind().as_str()
                        ));
                    }
                }
                Ok(())
            }
        }
    }

    async fn model_failed(
        &mut self,
        e: ClientError,
        step: Option<u32>,
        latency_ms: u64,
    ) -> Result<(), Stop> {
        let signal = e.signal();
        // What the runtime can do about it: reshape the request, or re-ask for a reply it can
        // read. Whether a resend can help is the run's decision (a request the server refused
        // as such is never resent unchanged), as is which of these the failure's ladder takes.
        let repair = if matches!(e, ClientError::EmptyResponse | ClientError::Decode(_)) {
            Some(RepairTarget::Output)
        } else {
            Some(RepairTarget::Request)
        };
        let options = Options {
            repair,
            fallback_model: self.fallback(),
            retry_safe: true,
            partial_result: self.tool_results > 0,
            ..Options::default()
        };
        let d = self.decide(Input::Observed(Observation::ModelFinished {
            step,
            signal: Some(signal.clone()),
            options,
            usage: Amounts {
                latency_ms,
                ..Amounts::default()
            },
        }));
        if matches!(
            &d,
            StepAction::Recover {
                action: RecoveryAction::Repair {
                    target: RepairTarget::Output
                },
                ..
            }
        ) {
            self.messages.push(json!({"role": "user", "content": "Your last reply was empty. Call one of the tools, or give the final answer."}));
        }
        if signal == Signal::ContextLength {
            trim_context(&mut self.messages);
        }
        self.model_directive(d, &e.to_string()).await
    }

    /// Checks one reply's tool calls, reports the model call, and runs the valid calls.
    async fn tool_turn(
        &mut self,
        offered: &[Arc<dyn Tool>],
        content: &str,
        calls: &[Value],
        ending: Ending,
        step: Option<u32>,
        usage: Amounts,
    ) -> Result<(), Stop> {
        let mut checked: Vec<CheckedCall> = Vec::new();
        let mut problems: Vec<(String, String, Signal)> = Vec::new();
        let mut history_calls = Vec::new();
        for (i, call) in calls.iter().enumerate() {
            let id = call
                .get("id")
                .and_then(Value::as_str)
                .map_or_else(|| format!("call_{}_{i}", self.model_calls), str::to_owned);
            let name = call
                .pointer("/function/name")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_owned();
            let raw = call
                .pointer("/function/arguments")
                .cloned()
                .unwrap_or(Value::Null);
            let raw_text = match &raw {
                Value::String(s) => s.clone(),
                Value::Null => "{}".to_owned(),
                other => other.to_string(),
            };
            let exact = offered.iter().find(|t| t.spec().name == name).cloned();
            let (tool, renamed) = match exact {
                Some(t) => (Some(t), false),
                None => {
                    let c = canon(&name);
                    let mut m = offered.iter().filter(|t| canon(&t.spec().name) == c);
                    match (m.next(), m.next()) {
                        (Some(t), None) => (Some(t.clone()), true),
                        _ => (None, false),
                    }
                }
            };
            let Some(tool) = tool else {
                let names: Vec<&str> = offered.iter().map(|t| t.spec().name.as_str()).collect();
                let text = format!(
                    "Error: there is no tool named `{name}`. The tools you can call are: {}. Call one of them.",
                    names.join(", ")
                );
                history_calls.push(json!({"id": id, "type": "function", "function": {"name": name, "arguments": raw_text}}));
                problems.push((id, text, Signal::UnknownTool { name }));
                continue;
            };
            let tname = tool.spec().name.clone();
            // The one non-corrupting path the gateway and the MCP proxy use too: valid
            // arguments untouched, a cut-off call refused, no default written.
            let guide = match self.guides.get(&tname) {
                Some(Some(g)) => Some(g),
                _ => None,
            };
            let checked_args =
                selfheal_repair::repair_arguments(&raw_text, guide, ending).map_err(|e| {
                    let errors = match &e {
                        ArgumentsError::Invalid(v) => v.iter().map(ToString::to_string).collect(),
                        ArgumentsError::Unreadable(r) => {
                            vec![format!("at (root): arguments are not valid JSON: {r}")]
                        }
                        ArgumentsError::CutOff => {
                            vec!["at (root): the arguments were cut off".to_owned()]
                        }
                    };
                    (e.reask_message(&raw_text, &tname), errors)
                });
            let args = match checked_args {
                Ok(a) => a,
                Err((text, errors)) => {
                    history_calls.push(json!({"id": id, "type": "function", "function": {"name": tname, "arguments": raw_text}}));
                    problems.push((id, text, Signal::InvalidArguments { errors }));
                    continue;
                }
            };
            // Arguments valid as written are recorded as written; changed ones with every
            // number as the model wrote it, or refused if a coercion would change its digits.
            let args_text = if args.changed {
                match args.to_json() {
                    Ok(t) => t,
                    Err(e) => {
                        history_calls.push(json!({"id": id, "type": "function", "function": {"name": tname, "arguments": raw_text}}));
                        let text = format!(
                            "Your call to `{tname}` was not run: {e} once its arguments were \
                             corrected. Call `{tname}` again with every argument of the type \
                             its schema asks."
                        );
                        problems.push((
                            id,
                            text,
                            Signal::InvalidArguments {
                                errors: vec![format!("at (root): {e}")],
                            },
                        ));
                        continue;
                    }
                }
            } else {
                raw_text.clone()
            };
            if tool.spec().grounded {
                let mut evidence = self.task.clone();
                evidence.extend(self.evidence.iter().cloned());
                let missing = ungrounded_arguments(&args.value, &evidence);
                if !missing.is_empty() {
                    history_calls.push(json!({"id": id, "type": "function", "function": {"name": tname, "arguments": args_text}}));
                    self.log.push(format!(
                        "grounding: the call to {tname} invents {}",
                        missing.join(", ")
                    ));
                    let text = format!(
                        "Your call to `{tname}` was not run: its arguments must be copied from the \
                         task or an earlier tool result, and these appear in neither: {}. Call the \
                         tool that gives that value first, or copy the value exactly.",
                        missing.join(", ")
                    );
                    let errors = missing
                        .iter()
                        .map(|m| format!("at (root): {m} is ungrounded"))
                        .collect();
                    problems.push((id, text, Signal::InvalidArguments { errors }));
                    continue;
                }
            }
            history_calls.push(json!({"id": id, "type": "function", "function": {"name": tname, "arguments": args_text}}));
            let repaired = renamed || !args.repairs.is_empty() || !args.coercions.is_empty();
            if repaired {
                self.log.push(format!(
                    "repaired call to {tname} locally (no model call): {name} {raw_text} -> {args_text}"
                ));
            }
            checked.push(CheckedCall {
                id,
                tool,
                args: args.value,
                repaired,
            });
        }
        self.messages
            .push(json!({"role": "assistant", "content": content, "tool_calls": history_calls}));
        let signal = problems.first().map(|p| p.2.clone());
        let repair = match &signal {
            Some(Signal::UnknownTool { .. }) => Some(RepairTarget::ToolChoice),
            Some(_) => Some(RepairTarget::Arguments),
            None => None,
        };
        let d = self.decide(Input::Observed(Observation::ModelFinished {
            step,
            signal: signal.clone(),
            options: Options {
                repair,
                fallback_model: self.fallback(),
                retry_safe: true,
                partial_result: self.tool_results > 0,
                ..Options::default()
            },
            usage,
        }));
        let mut stop = None;
        match d {
            StepAction::Proceed { .. } => {}
            StepAction::Stop { status, reason } => stop = Some(Stop::of(status, reason)),
            StepAction::Recover { action, class, .. } => {
                let what = signal.as_ref().map_or("", Signal::name);
                match action {
                    RecoveryAction::Escalate {
                        target: EscalationTarget::FallbackModel { model },
                    } => {
                        self.fall_back(&model, class, what);
                    }
                    RecoveryAction::Retry { delay_ms, .. } => {
                        self.log
                            .push(format!("re-ask after {delay_ms} ms ({class}: {what})"));
                        tokio::time::sleep(Duration::from_millis(delay_ms)).await;
                    }
                    other @ (RecoveryAction::Repair { .. }
                    | RecoveryAction::Escalate {
                        target: EscalationTarget::Human,
                    }
                    | RecoveryAction::Substitute { .. }
                    | RecoveryAction::Replan
                    | RecoveryAction::Refresh
                    | RecoveryAction::Degrade
                    | RecoveryAction::Terminate) => self.log.push(format!(
                        "{}: re-ask with the precise error ({class}: {what})",
                        other.kind().as_str()
                    )),
                }
            }
        }
        for (id, text, _) in problems {
            self.messages
                .push(json!({"role": "tool", "tool_call_id": id, "content": text}));
        }
        if let Some(s) = stop {
            return Err(s);
        }
        for c in checked {
            let text = self.run_tool(c.tool, &c.args, c.repaired).await?;
            self.messages
                .push(json!({"role": "tool", "tool_call_id": c.id, "content": text}));
        }
        Ok(())
    }

    /// Runs one valid call with its retries and substitutes; returns the tool message text.
    async fn run_tool(
        &mut self,
        mut tool: Arc<dyn Tool>,
        args: &Value,
        repaired: bool,
    ) -> Result<String, Stop> {
        let step = Some(self.tool_step(&tool.spec().name));
        let mut tried = vec![tool.spec().name.clone()];
        let mut rejections = 0u32;
        loop {
            let spec = tool.spec().clone();
            self.tool_calls += 1;
            let t0 = Instant::now();
            let res = tokio::time::timeout(spec.timeout, tool.call(args.clone())).await;
            let latency_ms = u64::try_from(t0.elapsed().as_millis()).unwrap_or(u64::MAX);
            let (result, signal, may_have_run) = match res {
                Ok(Ok(v)) => (Ok(v), None, true),
                Ok(Err(ToolError::Rejected(m))) => (
                    Err(m.clone()),
                    Some(Signal::Exception { message: m }),
                    false,
                ),
                Ok(Err(ToolError::Failed {
                    message,
                    status,
                    retry_after_ms,
                })) => {
                    // A tool that says it failed, with a text and no status, is read as the
                    // MCP proxy reads a result with `isError: true`: one observation, one
                    // signal on every front-end (the conformance table runs both).
                    let sig = match status {
                        Some(status) => Signal::HttpStatus {
                            status,
                            retry_after_ms,
                            message: message.clone(),
                        },
                        None => Signal::ToolError {
                            message: message.clone(),
                        },
                    };
                    (Err(message), Some(sig), true)
                }
                Err(_) => (
                    Err(format!(
                        "`{}` timed out after {} ms",
                        spec.name,
                        spec.timeout.as_millis()
                    )),
                    Some(Signal::Timeout),
                    true,
                ),
            };
            // Whether the call may be sent twice as far as its effect goes; whether a resend
            // can help at all (a refused request cannot) is the run's decision.
            let retry_safe = !may_have_run
                || spec.effect != Effect::Destructive
                || self.agent.allow_destructive_retry;
            let hidden = match self.decide(Input::NextTurn) {
                StepAction::Proceed { hidden_tools, .. } => hidden_tools,
                _ => Vec::new(),
            };
            let substitute = spec
                .substitute
                .clone()
                .filter(|s| !tried.contains(s) && !hidden.contains(s))
                .filter(|s| self.find_tool(s).is_some());
            let required = spec.required();
            // The output is judged before anyone sees it; the judgement is reported after the
            // call itself, which must be charged and recorded whatever its output is worth.
            let judgement = match (&result, &spec.output_schema) {
                (Ok(v), Some(schema)) => Some(schema.verify(v)),
                (Ok(_), None) | (Err(_), _) => None,
            };
            let options = Options {
                // The model can always rewrite the call given the error.
                repair: result.is_err().then_some(RepairTarget::Arguments),
                substitute,
                refreshable: false,
                can_replan: true,
                fallback_model: self.fallback(),
                human_available: false,
                retry_safe,
                partial_result: self.tool_results > 0,
                max_delay_ms: None,
            };
            let error_text = result.as_ref().err().cloned().unwrap_or_default();
            let outcome = match &result {
                Ok(v) => CallOutcome::Returned(v),
                Err(_) => CallOutcome::Failed { error: &error_text },
            };
            let d = self.decide(Input::Observed(Observation::ToolFinished {
                step,
                call: ToolCall {
                    tool: &spec.name,
                    args,
                    outcome,
                    required: &required,
                    repaired,
                },
                signal,
                options: options.clone(),
                usage: Amounts {
                    latency_ms,
                    ..Amounts::default()
                },
            }));
            let (d, shown, good) = match (result, judgement) {
                (Err(e), _) => (d, format!("Error: {e}"), None),
                (Ok(v), None) => (d, v.to_string(), Some(v)),
                (Ok(v), Some(judgement)) => {
                    let verifier = spec
                        .output_schema
                        .as_ref()
                        .map_or("schema", |s| s.verifier().name())
                        .to_owned();
                    let rejected = match &judgement {
                        Judgement::Reject { reason } => Some(reason.clone()),
                        Judgement::Accept | Judgement::Uncertain { .. } => None,
                    };
                    // Once the call's own report asks for more than `Continue` (a loop, a spent
                    // budget), that directive stands; the verdict is still never shown as a result.
                    // The last rejection the guard allows may not be retried or substituted
                    // again: the controller is told so, and picks (and charges) what it can do
                    // instead — usually handing the failure back to the model.
                    let exhausted =
                        rejected.is_some() && rejections + 1 >= MAX_REJECTED_OUTPUTS_PER_CALL;
                    let d = if matches!(d, StepAction::Proceed { .. }) {
                        self.decide(Input::Observed(Observation::Verified {
                            step,
                            verifier: &verifier,
                            judgement,
                            options: Options {
                                repair: None,
                                retry_safe: options.retry_safe && !exhausted,
                                substitute: options.substitute.clone().filter(|_| !exhausted),
                                ..options
                            },
                        }))
                    } else {
                        d
                    };
                    match rejected {
                        None => (d, v.to_string(), Some(v)),
                        Some(reason) => {
                            rejections += 1;
                            self.log.push(format!(
                                "verifier `{verifier}` rejected the output of {}: {reason}",
                                spec.name
                            ));
                            let text = format!(
                                "Error: `{}` returned output that failed verification, so it is not a result. The `{verifier}` check says: {reason}",
                                spec.name
                            );
                            (d, text, None)
                        }
                    }
                }
            };
            // A call whose outputs keep failing verification is handed back to the model rather
            // than retried again (see `MAX_REJECTED_OUTPUTS_PER_CALL`).
            if rejections >= MAX_REJECTED_OUTPUTS_PER_CALL
                && let StepAction::Recover {
                    action: RecoveryAction::Retry { .. } | RecoveryAction::Substitute { .. },
                    class,
                    ..
                } = &d
            {
                self.log.push(format!(
                    "stop calling {}: {rejections} outputs failed verification; hand it back to the model ({class})",
                    spec.name
                ));
                return Ok(format!("{shown}\nTry a different approach."));
            }
            match d {
                StepAction::Proceed { .. } => {
                    if let Some(v) = good {
                        self.progress += 1;
                        self.tool_results += 1;
                        if spec.effect == Effect::ReadOnly {
                            if self.reads.len() == MAX_EVIDENCE {
                                self.reads.pop_front();
                            }
                            self.reads.push_back(Read {
                                step,
                                tool: tool.clone(),
                                args: args.clone(),
                                value: v.clone(),
                            });
                        }
                        if self.evidence.len() == MAX_EVIDENCE {
                            self.evidence.pop_front();
                        }
                        self.evidence.push_back(v);
                    }
                    return Ok(shown);
                }
                StepAction::Stop { status, reason } => return Err(Stop::of(status, reason)),
                StepAction::Recover { action, class, .. } => match action {
                    RecoveryAction::Retry { delay_ms, attempt } => {
                        self.log.push(format!(
                            "retry {} #{attempt} after {delay_ms} ms ({class})",
                            spec.name
                        ));
                        tokio::time::sleep(Duration::from_millis(delay_ms)).await;
                    }
                    RecoveryAction::Substitute { alternative } => {
                        match self.find_tool(&alternative) {
                            Some(t) => {
                                self.log.push(format!(
                                    "substitute {} for {} ({class})",
                                    alternative, spec.name
                                ));
                                tried.push(alternative);
                                tool = t;
                            }
                            None => return Ok(shown),
                        }
                    }
                    RecoveryAction::Escalate {
                        target: EscalationTarget::FallbackModel { model },
                    } => {
                        self.log.push(format!(
                            "fall back to model {model} after {} failed ({class})",
                            spec.name
                        ));
                        if self.model_idx + 1 < self.agent.models.len() {
                            self.model_idx += 1;
                        }
                        return Ok(format!("{shown}\nTry a different approach."));
                    }
                    other @ (RecoveryAction::Repair { .. }
                    | RecoveryAction::Escalate {
                        target: EscalationTarget::Human,
                    }
                    | RecoveryAction::Replan
                    | RecoveryAction::Refresh
                    | RecoveryAction::Degrade
                    | RecoveryAction::Terminate) => {
                        self.log.push(format!(
                            "{}: hand the error of {} back to the model ({class})",
                            other.kind().as_str(),
                            spec.name
                        ));
                        return Ok(format!("{shown}\nTry a different approach."));
                    }
                },
            }
        }
    }

    fn finish(mut self, ended: Result<String, Stop>) -> RunResult {
        let now = self.now();
        let outcome = self.run.finish(now);
        self.agent.trust.store.report(
            &self.run.take_trust_evidence(),
            self.trust_offset,
            &self.agent.config.policy.trust,
        );
        let (status, reason, answer) = match ended {
            Ok(answer) => (outcome.status, outcome.reason, Some(answer)),
            Err(stop) => {
                let (status, reason) = match stop {
                    Stop::Partial(r) => (RunStatus::Partial, r),
                    Stop::Failed(r) => (RunStatus::Failed, r),
                };
                match self.rejected.take() {
                    // A run that stops partial after its answer was rejected keeps that answer,
                    // flagged: the status and the reason say it was not accepted.
                    Some((answer, why)) if status == RunStatus::Partial => (
                        status,
                        Some(format!("{reason}; the answer was rejected by {why}")),
                        Some(answer),
                    ),
                    Some((_, why)) => (
                        status,
                        Some(format!("{reason}; the answer was rejected by {why}")),
                        None,
                    ),
                    // Nothing usable was produced: that is a failure, however it stopped.
                    None if self.tool_results == 0 => (RunStatus::Failed, Some(reason), None),
                    None => (status, Some(reason), None),
                }
            }
        };
        let model = self
            .agent
            .models
            .get(self.model_idx)
            .map(|(_, m)| m.clone())
            .unwrap_or_default();
        RunResult {
            status,
            reason,
            answer,
            unresolved: outcome.unresolved,
            actions: outcome.actions,
            recovery_log: self.log,
            spent: outcome.spent,
            tokens: self.tokens,
            model_calls: self.model_calls,
            tool_calls: self.tool_calls,
            model,
            messages: self.messages,
            trace_jsonl: self.run.trace().to_jsonl(),
        }
    }
}

/// Rewrites every message into the plainest shape servers accept: `content` always a string,
/// no `function_call`, `refusal` or `audio` fields. Returns how many messages changed.
pub(crate) fn repair_request(messages: &mut [Value]) -> usize {
    let mut changed = 0;
    for m in messages.iter_mut() {
        let Some(o) = m.as_object_mut() else {
            continue;
        };
        let mut c = false;
        if o.get("content").is_none_or(Value::is_null) {
            o.insert("content".into(), Value::String(String::new()));
            c = true;
        }
        for k in ["function_call", "refusal", "audio", "annotations"] {
            c |= o.remove(k).is_some();
        }
        changed += usize::from(c);
    }
    changed
}

/// Drops the oldest turns after the first user message, keeping system messages and the last
/// six messages (never starting on a tool message, which needs its assistant call before it).
fn trim_context(messages: &mut Vec<Value>) {
    let role = |m: &Value| {
        m.get("role")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned()
    };
    let Some(first_user) = messages.iter().position(|m| role(m) == "user") else {
        return;
    };
    if messages.len() <= first_user + 7 {
        return;
    }
    let mut keep_from = messages.len() - 6;
    while keep_from < messages.len() && role(&messages[keep_from]) == "tool" {
        keep_from += 1;
    }
    messages.drain(first_user + 1..keep_from);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_repair_makes_content_a_string() {
        let mut m = vec![
            json!({"role": "assistant", "content": null, "tool_calls": [], "function_call": {}}),
            json!({"role": "user", "content": "x"}),
        ];
        assert_eq!(repair_request(&mut m), 1);
        assert_eq!(m[0]["content"], json!(""));
        assert!(m[0].get("function_call").is_none());
    }

    #[test]
    fn canonical_names_ignore_case_and_punctuation() {
        assert_eq!(canon("Geo.Capital"), canon("geo_capital"));
    }

    #[test]
    fn trimming_keeps_the_task_and_the_tail() {
        let mut m: Vec<Value> = vec![json!({"role": "system", "content": "s"})];
        m.push(json!({"role": "user", "content": "task"}));
        for i in 0..10 {
            m.push(json!({"role": "assistant", "content": i.to_string()}));
        }
        trim_context(&mut m);
        assert_eq!(m.len(), 8);
        assert_eq!(m[1]["content"], json!("task"));
    }
}
