//! # selfheal-live — the simulated benchmark's tasks, driven by a real tool-calling model
//!
//! This is `selfheal bench --live`. It lives in its own crate, between the benchmark
//! (`selfheal-bench`: tasks, tools, fault schedules) and the runtime (`selfheal-runtime`: the model
//! client and the agent loop), so that neither depends on the other: the gateway, built on the
//! runtime, does not carry the benchmark, and the simulated benchmark builds without an HTTP stack.
//!
//!
//! Why: the simulated benchmark scripts the agent's mistakes; a live model makes its own. Here
//! the model chooses the tools, writes the arguments and composes the answer, while the tools
//! are the benchmark's built-in tasks executed through [`selfheal_bench::Episode`] with the
//! same seeded fault schedules drawn from the default fault model (its tool-side faults: the live
//! model makes its own mistakes). Up to three strategies are compared on the same episodes (by default
//! `static` and `self-healing`; [`LiveConfig::strategies`] chooses):
//!
//! - `static`: one naive tool loop — tool results (or error texts) go back to the model, but
//!   nothing is retried, repaired, substituted or re-routed, and the first failed model call
//!   ends the run;
//! - `retry-only`: the same loop, but a failed model call or a tool that raised or timed out is
//!   retried as is, up to R times per call with a fixed 250 ms pause — what most agent
//!   frameworks do;
//! - `self-healing`: the [`Agent`] loop under the core controller.
//!
//! An answer is correct when its last number is within 1 % of the oracle (or, for a string
//! oracle, when it contains it). A silent failure is a wrong answer returned as if correct: any
//! wrong answer of `static` or `retry-only`, and a wrong answer of `self-healing` that was not
//! marked partial.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::{Value, json};

use selfheal_bench::Group;
use selfheal_bench::{ArgSrc, Behaviour, TaskSpec, builtin};
use selfheal_bench::{CostWeights, ResultRow};
use selfheal_bench::{Episode as World, Response};
use selfheal_bench::{FaultModel, Injected, Target, draw};
use selfheal_core::{ActionKind, BudgetLimits, ControllerConfig, FailureClass, RunStatus};

use selfheal_runtime::{
    Agent, ClientConfig, Effect, FnTool, ModelClient, Tool, ToolError, ToolSpec,
};

/// A strategy the live benchmark can run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum LiveStrategy {
    /// The naive tool loop.
    Static,
    /// The naive loop with retries of failed calls.
    RetryOnly,
    /// The [`Agent`] under the core controller.
    SelfHealing,
}

impl LiveStrategy {
    /// Every live strategy.
    pub const ALL: [LiveStrategy; 3] = [
        LiveStrategy::Static,
        LiveStrategy::RetryOnly,
        LiveStrategy::SelfHealing,
    ];

    /// The name used in reports and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            LiveStrategy::Static => "static",
            LiveStrategy::RetryOnly => "retry-only",
            LiveStrategy::SelfHealing => "self-healing",
        }
    }

    /// The strategy called `name`.
    pub fn parse(name: &str) -> Option<LiveStrategy> {
        LiveStrategy::ALL.into_iter().find(|s| s.name() == name)
    }
}

/// Pause between retries of the `retry-only` strategy.
const RETRY_PAUSE: Duration = Duration::from_millis(250);

/// Settings of a live run.
#[derive(Debug, Clone, Serialize)]
pub struct LiveConfig {
    /// The strategies to run, in this order.
    pub strategies: Vec<LiveStrategy>,
    /// Base URL up to `/v1`.
    pub model_url: String,
    /// The model name sent upstream.
    pub model: String,
    /// The environment variable holding the API key, if any.
    pub api_key_env: Option<String>,
    /// Run the first N tasks.
    pub tasks: usize,
    /// The fault schedule's seed.
    pub seed: u64,
    /// Probability that a step is faulted.
    pub fault_rate: f64,
    /// Recovery actions allowed per failure (R), as in the simulated benchmark.
    pub budget: u32,
    /// `max_tokens` per model call.
    pub max_tokens: u32,
    /// Timeout of one model call.
    pub timeout_ms: u64,
    /// Model calls allowed per episode.
    pub max_model_calls: u32,
    /// Cost weights.
    pub weights: CostWeights,
}

impl LiveConfig {
    /// Defaults for a model at `model_url`: `static` and `self-healing`, 20 tasks, seed 1, fault rate 0.25, R = 5, 200 tokens,
    /// 60 s per call, 8 model calls per episode.
    pub fn new(model_url: impl Into<String>, model: impl Into<String>) -> Self {
        LiveConfig {
            strategies: vec![LiveStrategy::Static, LiveStrategy::SelfHealing],
            model_url: model_url.into(),
            model: model.into(),
            api_key_env: None,
            tasks: 20,
            seed: 1,
            fault_rate: 0.25,
            budget: 5,
            max_tokens: 200,
            timeout_ms: 60_000,
            max_model_calls: 8,
            weights: CostWeights::default(),
        }
    }
}

/// Live-only measurements of one strategy.
#[derive(Debug, Clone, Default, Serialize)]
pub struct LiveExtra {
    /// Mean tokens per episode.
    pub tokens: f64,
    /// Total wall time of the strategy, in milliseconds.
    pub wall_ms: u64,
    /// Mean model calls per episode.
    pub model_calls: f64,
    /// Mean tool calls per episode.
    pub tool_calls: f64,
    /// How episodes ended, by kind (e.g. `correct`, `wrong_answer`, `no_answer`, `model_error`).
    pub outcomes: BTreeMap<String, u64>,
}

/// One result row: the simulated benchmark's row plus live measurements.
#[derive(Debug, Clone, Serialize)]
pub struct LiveRow {
    /// The same fields as the simulated benchmark.
    #[serde(flatten)]
    pub row: ResultRow,
    /// Tokens, wall time and outcome kinds.
    pub live: LiveExtra,
}

/// One episode's record.
#[derive(Debug, Clone, Serialize)]
pub struct Episode {
    /// Strategy.
    pub strategy: &'static str,
    /// Task id.
    pub task: usize,
    /// Scheduled faults, as `name@step` (names from the default fault model).
    pub faults: Vec<String>,
    /// The final answer text.
    pub answer: Option<String>,
    /// The oracle.
    pub oracle: Value,
    /// Correct or not.
    pub correct: bool,
    /// How it ended (see [`LiveExtra::outcomes`]).
    pub outcome: String,
    /// Run status (self-healing) or `complete`/`failed` (static).
    pub status: RunStatus,
    /// Why it stopped, if not complete.
    pub reason: Option<String>,
    /// Recovery actions in words.
    pub recoveries: Vec<String>,
    /// Model calls.
    pub model_calls: u64,
    /// Tool calls.
    pub tool_calls: u64,
    /// Tokens.
    pub tokens: u64,
    /// Wall time, ms.
    pub wall_ms: u64,
    /// The conversation after the task prompt (assistant and tool messages).
    pub transcript: Vec<Value>,
}

/// The live report: same `results` shape as the simulated benchmark, plus episodes.
#[derive(Debug, Clone, Serialize)]
pub struct LiveReport {
    /// The settings.
    pub config: LiveConfig,
    /// One row per strategy.
    pub results: Vec<LiveRow>,
    /// Every episode.
    pub episodes: Vec<Episode>,
}

/// The name a tool is offered under: OpenAI function names allow no dots.
pub fn wire_name(tool: &str) -> String {
    tool.replace('.', "_")
}

fn describe_group(g: Group) -> &'static str {
    match g {
        Group::Capital => "Capital city of a country.",
        Group::Currency => "Currency code (3 letters) of a country.",
        Group::Weather => "Current temperature in degrees Celsius in a city (temp_c).",
        Group::Fx => "Exchange rate between two currency codes: 1 `from` = rate `to`.",
        Group::Ticker => "Stock ticker symbol of a company.",
        Group::Price => "Share price in USD for a ticker.",
        Group::Search => "Search documents about a topic; returns document ids.",
        Group::Fetch => "Fetch the figure (in km) a document reports, by document id.",
        Group::Convert => "Convert a value; unit is c_to_f (Celsius to Fahrenheit) or km_to_mi.",
        Group::Multiply => "Multiply two numbers a and b.",
    }
}

fn lit(task: &TaskSpec, step: usize, arg: usize) -> String {
    match task.plan.steps.get(step).and_then(|s| s.args.get(arg)) {
        Some((_, ArgSrc::Lit(Value::String(s)))) => s.clone(),
        Some((_, ArgSrc::Lit(v))) => v.to_string(),
        _ => String::new(),
    }
}

/// The task in words, with the steps spelled out (the model is small).
pub fn prompt(task: &TaskSpec) -> String {
    let q = match task.name.as_str() {
        "capital-weather-f" => format!(
            "What is the current temperature, in degrees Fahrenheit, in the capital of {}? Steps: get the capital, get its weather in Celsius, convert with unit c_to_f.",
            lit(task, 0, 0)
        ),
        "currency-to-usd" => format!(
            "How many US dollars (USD) are {} units of the currency of {}? Steps: get the currency code, get the rate from it to USD, multiply the rate by {}.",
            lit(task, 2, 1),
            lit(task, 0, 0),
            lit(task, 2, 1)
        ),
        "share-price-local" => format!(
            "What is the share price of {} expressed in the currency of {}? Steps: get the currency code, get the company's ticker, get the price in USD, get the rate from USD to that currency, multiply price by rate.",
            lit(task, 1, 0),
            lit(task, 0, 0)
        ),
        "document-figure" => format!(
            "Search for \"{}\", fetch the figure of the first document (km), convert it with unit km_to_mi, and multiply the result by {}.",
            lit(task, 0, 0),
            lit(task, 3, 1)
        ),
        _ => format!(
            "Multiply the share price (USD) of {} by the current temperature in degrees Fahrenheit in the capital of {}. Steps: capital, weather in Celsius, ticker, price, convert the temperature with c_to_f, multiply.",
            lit(task, 2, 0),
            lit(task, 0, 0)
        ),
    };
    format!("{q} Use the tools. When done, reply with the final number only.")
}

/// The last number in `text`.
pub fn last_number(text: &str) -> Option<f64> {
    let mut best = None;
    let mut cur = String::new();
    for c in text.chars().chain(std::iter::once(' ')) {
        if c.is_ascii_digit() || (c == '.' && !cur.is_empty()) || (c == '-' && cur.is_empty()) {
            cur.push(c);
        } else if c == ',' && !cur.is_empty() {
            // A thousands separator: skip it.
        } else {
            let t = cur.trim_end_matches('.');
            if let Ok(x) = t.parse::<f64>() {
                best = Some(x);
            }
            cur.clear();
        }
    }
    best
}

/// Whether an answer text matches the oracle (number within 1 %, or the string contained).
pub fn answer_matches(answer: &str, oracle: &Value) -> bool {
    match oracle {
        Value::Number(n) => match (last_number(answer), n.as_f64()) {
            (Some(x), Some(y)) => (x - y).abs() <= 0.01 * y.abs().max(1e-9),
            _ => false,
        },
        Value::String(s) => answer.contains(s.as_str()),
        _ => false,
    }
}

/// The tools one task's plan uses (each step's tool and its substitute), executing against
/// `world`. With `repair_output`, a body that is not valid JSON goes through JSON repair and one
/// that cannot be repaired is an error (what a repairing client does); without it, the raw
/// text is handed to the model.
pub fn task_tools(
    task: &'static TaskSpec,
    world: &Arc<Mutex<World<'static>>>,
    repair_output: bool,
) -> Vec<Arc<dyn Tool>> {
    let mut out: Vec<Arc<dyn Tool>> = Vec::new();
    let mut seen: Vec<&str> = Vec::new();
    for step in 0..task.plan.steps.len() {
        let Some(t) = task.plan.step_tool(step) else {
            continue;
        };
        if seen.contains(&t.name.as_str()) {
            continue;
        }
        seen.push(&t.name);
        let describe = if let Behaviour::Builtin(g) = &t.behaviour {
            describe_group(*g).to_owned()
        } else {
            t.description.clone()
        };
        let names = std::iter::once(t.name.as_str()).chain(t.substitute.as_deref());
        for (i, name) in names.enumerate() {
            let mut spec = ToolSpec::new(
                wire_name(name),
                if i == 0 {
                    describe.clone()
                } else {
                    format!("Backup source. {describe}")
                },
                t.schema(),
            )
            .with_timeout(Duration::from_secs(10))
            // Lookups of the simulated world: reading twice is harmless.
            .with_effect(Effect::ReadOnly)
            // Every argument of a task is a literal of its prompt or a value an earlier step
            // returned: one found in neither was invented (`calc_multiply {"a": 669}` for a
            // price never read), and the self-healing loop re-asks it before it runs.
            .with_grounded();
            if i == 0
                && let Some(s) = &t.substitute
            {
                spec = spec.with_substitute(wire_name(s));
            }
            let world = world.clone();
            out.push(
                FnTool::new(spec, move |args: Value| {
                    let world = world.clone();
                    async move { call_world(&world, name, &args, repair_output) }
                })
                .shared(),
            );
        }
    }
    out
}

fn call_world(
    world: &Mutex<World<'static>>,
    name: &str,
    args: &Value,
    repair_output: bool,
) -> Result<Value, ToolError> {
    let out = world
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .execute_named(name, args)
        .response;
    match out {
        Response::Raised {
            message,
            status,
            retry_after_ms,
            timeout,
        } => Err(ToolError::Failed {
            message: if timeout {
                format!("timed out: {message}")
            } else {
                message
            },
            status,
            retry_after_ms,
        }),
        Response::Returned { body } => match serde_json::from_str::<Value>(&body) {
            Ok(v) => Ok(v),
            Err(_) if repair_output => selfheal_repair::repair(&body)
                .map(|r| r.value)
                .map_err(|e| ToolError::failed(format!("malformed body: {e}"))),
            Err(_) => Ok(Value::String(body)),
        },
    }
}

struct Ran {
    answer: Option<String>,
    status: RunStatus,
    reason: Option<String>,
    recoveries: Vec<String>,
    recovery_count: u64,
    model_calls: u64,
    tool_calls: u64,
    tokens: u64,
    model_error: bool,
    transcript: Vec<Value>,
}

/// The naive tool loop: `static` with `retries` 0, `retry-only` with R. A retry repeats the
/// failed model call or tool call as it was.
async fn run_static(
    cfg: &LiveConfig,
    client: &ModelClient,
    tools: &[Arc<dyn Tool>],
    task: &TaskSpec,
    retries: u32,
) -> Ran {
    let mut messages = vec![
        json!({"role": "system", "content": "You are a careful assistant. Use the tools to answer."}),
        json!({"role": "user", "content": prompt(task)}),
    ];
    let mut ran = Ran {
        answer: None,
        status: RunStatus::Failed,
        reason: None,
        recoveries: Vec::new(),
        recovery_count: 0,
        model_calls: 0,
        tool_calls: 0,
        tokens: 0,
        model_error: false,
        transcript: Vec::new(),
    };
    let offered: Vec<Value> = tools.iter().map(|t| t.spec().openai()).collect();
    while ran.model_calls < u64::from(cfg.max_model_calls) {
        ran.model_calls += 1;
        let body = json!({"model": cfg.model, "messages": messages, "tools": offered,
            "tool_choice": "auto", "max_tokens": cfg.max_tokens, "temperature": 0.0});
        let mut attempt = 0;
        let c = loop {
            match client.chat(&body).await {
                Ok(c) => break c,
                Err(e) if attempt < retries && ran.model_calls < u64::from(cfg.max_model_calls) => {
                    attempt += 1;
                    ran.model_calls += 1;
                    ran.recovery_count += 1;
                    ran.recoveries
                        .push(format!("retry model call {attempt} after: {e}"));
                    tokio::time::sleep(RETRY_PAUSE).await;
                }
                Err(e) => {
                    ran.reason = Some(e.to_string());
                    ran.model_error = true;
                    ran.transcript = messages.split_off(2);
                    return ran;
                }
            }
        };
        ran.tokens += c.tokens;
        let msg = c.message().cloned().unwrap_or(Value::Null);
        let content = msg
            .get("content")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned();
        let calls = msg
            .get("tool_calls")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        if calls.is_empty() {
            ran.answer = Some(content);
            ran.status = RunStatus::Complete;
            ran.transcript = messages.split_off(2);
            return ran;
        }
        messages.push(json!({"role": "assistant", "content": content, "tool_calls": calls}));
        for (i, call) in calls.iter().enumerate() {
            let id = call
                .get("id")
                .and_then(Value::as_str)
                .map_or_else(|| format!("call_{i}"), str::to_owned);
            let name = call
                .pointer("/function/name")
                .and_then(Value::as_str)
                .unwrap_or("");
            let raw = call
                .pointer("/function/arguments")
                .and_then(Value::as_str)
                .unwrap_or("{}");
            let result = match (
                tools.iter().find(|t| t.spec().name == name),
                serde_json::from_str::<Value>(raw),
            ) {
                (None, _) => format!("Error: unknown tool `{name}`"),
                (Some(_), Err(e)) => format!("Error: invalid arguments: {e}"),
                (Some(t), Ok(args)) => {
                    let mut attempt = 0;
                    loop {
                        ran.tool_calls += 1;
                        let r = match tokio::time::timeout(t.spec().timeout, t.call(args.clone()))
                            .await
                        {
                            Ok(Ok(v)) => Ok(v.to_string()),
                            Ok(Err(e)) => Err(format!("Error: {e}")),
                            Err(_) => Err("Error: timed out".to_owned()),
                        };
                        match r {
                            Ok(text) => break text,
                            Err(e)
                                if attempt < retries
                                    && ran.model_calls < u64::from(cfg.max_model_calls) =>
                            {
                                attempt += 1;
                                ran.recovery_count += 1;
                                ran.recoveries
                                    .push(format!("retry {name} {attempt} after: {e}"));
                                tokio::time::sleep(RETRY_PAUSE).await;
                            }
                            Err(e) => break e,
                        }
                    }
                }
            };
            messages.push(json!({"role": "tool", "tool_call_id": id, "content": result}));
        }
    }
    ran.status = RunStatus::Failed;
    ran.reason = Some("no answer within the model-call limit".into());
    ran.transcript = messages.split_off(2);
    ran
}

async fn run_healing(
    cfg: &LiveConfig,
    client: &ModelClient,
    tools: Vec<Arc<dyn Tool>>,
    task: &TaskSpec,
) -> Ran {
    let mut config = ControllerConfig {
        budget: BudgetLimits {
            latency_ms: cfg
                .timeout_ms
                .saturating_mul(u64::from(cfg.max_model_calls) + 2),
            ..BudgetLimits::defaults().with_recoveries(u64::from(cfg.budget))
        },
        ..ControllerConfig::default()
    };
    config.policy.max_actions_per_failure = Some(cfg.budget);
    // With a model in the loop, a rejected argument is best fixed by re-asking with the precise
    // error, several times, before anything costlier: the model rewrites the call itself.
    config.policy.ladders.insert(
        FailureClass::ArgumentInvalid,
        vec![
            ActionKind::Repair,
            ActionKind::Repair,
            ActionKind::Repair,
            ActionKind::Escalate,
            ActionKind::Replan,
            ActionKind::Degrade,
        ],
    );
    let agent = Agent {
        max_model_calls: cfg.max_model_calls,
        max_tokens: Some(cfg.max_tokens),
        temperature: Some(0.0),
        config,
        ..Agent::new(client.clone(), cfg.model.clone(), tools)
    };
    let messages = vec![
        json!({"role": "system", "content": "You are a careful assistant. Use the tools to answer."}),
        json!({"role": "user", "content": prompt(task)}),
    ];
    let r = agent
        .run(
            messages,
            cfg.seed.wrapping_mul(31).wrapping_add(task.id as u64),
        )
        .await;
    let model_error = r.answer.is_none() && r.tool_calls == 0;
    let mut messages = r.messages;
    Ran {
        transcript: messages.split_off(2.min(messages.len())),
        answer: r.answer,
        status: r.status,
        reason: r.reason,
        recovery_count: r.actions.iter().map(|(_, n)| n).sum(),
        recoveries: r.recovery_log,
        model_calls: r.model_calls,
        tool_calls: r.tool_calls,
        tokens: r.tokens,
        model_error,
    }
}

/// The tool-side faults of `task`'s schedule under the default model: the same draw as the
/// simulated benchmark's, without the faults of the agent side (the live model makes its own).
pub fn tool_faults(
    task: &TaskSpec,
    seed: u64,
    fault_rate: f64,
    model: &FaultModel,
) -> Vec<Injected> {
    draw(task, seed, fault_rate, model)
        .into_iter()
        .filter(|f| {
            model
                .faults
                .get(f.spec)
                .is_some_and(|s| s.target != Target::Agent)
        })
        .collect()
}

/// Runs the live benchmark; `progress(line)` is called after every episode.
pub async fn run(cfg: &LiveConfig, progress: &mut dyn FnMut(&str)) -> Result<LiveReport, String> {
    let mut cc = ClientConfig::new(cfg.model_url.clone());
    cc.api_key_env = cfg.api_key_env.clone();
    cc.timeout = Duration::from_millis(cfg.timeout_ms);
    let client = ModelClient::new(cc).map_err(|e| e.to_string())?;
    // The tools borrow their task and the fault model for the lifetime of their 'static futures:
    // leak both once per run (100 small tasks).
    let all: &'static [TaskSpec] = Box::leak(builtin(100).into_boxed_slice());
    let chosen = &all[..cfg.tasks.min(all.len())];
    let model: &'static FaultModel = Box::leak(Box::new(
        FaultModel::default_model().map_err(|e| e.to_string())?,
    ));
    let mut results = Vec::new();
    let mut episodes = Vec::new();
    for &which in &cfg.strategies {
        let strategy = which.name();
        let started = Instant::now();
        let (mut ok, mut silent, mut faulted, mut recovered) = (0u64, 0u64, 0u64, 0u64);
        let (mut m, mut u, mut r, mut tok) = (0u64, 0u64, 0u64, 0u64);
        let mut outcomes: BTreeMap<String, u64> = BTreeMap::new();
        for (i, task) in chosen.iter().enumerate() {
            let faults = tool_faults(task, cfg.seed, cfg.fault_rate, model);
            let env = Arc::new(Mutex::new(World::new(task, &faults, model, cfg.seed)));
            let t0 = Instant::now();
            let ran = match which {
                LiveStrategy::Static => {
                    run_static(cfg, &client, &task_tools(task, &env, false), task, 0).await
                }
                LiveStrategy::RetryOnly => {
                    let tools = task_tools(task, &env, false);
                    run_static(cfg, &client, &tools, task, cfg.budget).await
                }
                LiveStrategy::SelfHealing => {
                    run_healing(cfg, &client, task_tools(task, &env, true), task).await
                }
            };
            let wall_ms = u64::try_from(t0.elapsed().as_millis()).unwrap_or(u64::MAX);
            let correct = ran
                .answer
                .as_deref()
                .is_some_and(|a| answer_matches(a, &task.expected));
            let claimed = ran.answer.is_some() && ran.status == RunStatus::Complete;
            let outcome = if correct {
                "correct"
            } else if claimed {
                "wrong_answer"
            } else if ran.answer.is_some() {
                "wrong_answer_flagged_partial"
            } else if ran.model_error {
                "model_error"
            } else {
                "no_answer"
            };
            *outcomes.entry(outcome.to_owned()).or_default() += 1;
            ok += u64::from(correct);
            silent += u64::from(claimed && !correct);
            if !faults.is_empty() {
                faulted += 1;
                recovered += u64::from(correct);
            }
            m += ran.model_calls;
            u += ran.tool_calls;
            r += ran.recovery_count;
            tok += ran.tokens;
            progress(&format!(
                "[{strategy} {}/{}] task {} ({}): {outcome} in {:.1} s, {} model / {} tool calls{}",
                i + 1,
                chosen.len(),
                task.id,
                task.name,
                wall_ms as f64 / 1000.0,
                ran.model_calls,
                ran.tool_calls,
                ran.reason
                    .as_deref()
                    .map(|r| format!(" — {r}"))
                    .unwrap_or_default()
            ));
            episodes.push(Episode {
                strategy,
                task: task.id,
                faults: faults
                    .iter()
                    .map(|f| {
                        let name = model.faults.get(f.spec).map_or("?", |s| s.name.as_str());
                        format!("{name}@{}", f.step)
                    })
                    .collect(),
                answer: ran.answer,
                oracle: task.expected.clone(),
                correct,
                outcome: outcome.to_owned(),
                status: ran.status,
                reason: ran.reason,
                recoveries: ran.recoveries,
                model_calls: ran.model_calls,
                tool_calls: ran.tool_calls,
                tokens: ran.tokens,
                wall_ms,
                transcript: ran.transcript,
            });
        }
        let n = chosen.len().max(1) as f64;
        let w = &cfg.weights;
        let wall_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        results.push(LiveRow {
            row: ResultRow {
                strategy,
                budget: cfg.budget,
                episodes: chosen.len() as u64,
                tsr: ok as f64 / n,
                rsr: if faulted == 0 {
                    0.0
                } else {
                    recovered as f64 / faulted as f64
                },
                sfr: silent as f64 / n,
                cost: (w.model * m as f64 + w.tool * u as f64 + w.recovery * r as f64) / n,
                latency_ms: wall_ms as f64 / n,
            },
            live: LiveExtra {
                tokens: tok as f64 / n,
                wall_ms,
                model_calls: m as f64 / n,
                tool_calls: u as f64 / n,
                outcomes,
            },
        });
    }
    Ok(LiveReport {
        config: cfg.clone(),
        results,
        episodes,
    })
}

/// The results as a terminal table, shaped like the simulated benchmark's.
pub fn table(report: &LiveReport) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let c = &report.config;
    let _ = writeln!(
        out,
        "selfheal bench --live — model {} at {}, {} tasks, seed {}, fault rate {}",
        c.model, c.model_url, c.tasks, c.seed, c.fault_rate
    );
    let _ = writeln!(
        out,
        "{:<13} {:>3} {:>8} {:>8} {:>8} {:>8} {:>8} {:>11} {:>9} {:>9}",
        "strategy",
        "R",
        "episodes",
        "TSR",
        "RSR",
        "SFR",
        "cost K",
        "latency ms",
        "tokens",
        "wall s"
    );
    for r in &report.results {
        let _ = writeln!(
            out,
            "{:<13} {:>3} {:>8} {:>7.1}% {:>7.1}% {:>7.1}% {:>8.2} {:>11.0} {:>9.0} {:>9.1}",
            r.row.strategy,
            r.row.budget,
            r.row.episodes,
            r.row.tsr * 100.0,
            r.row.rsr * 100.0,
            r.row.sfr * 100.0,
            r.row.cost,
            r.row.latency_ms,
            r.live.tokens,
            r.live.wall_ms as f64 / 1000.0
        );
    }
    for r in &report.results {
        let kinds: Vec<String> = r
            .live
            .outcomes
            .iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect();
        let _ = writeln!(out, "{}: {}", r.row.strategy, kinds.join(", "));
    }
    out
}

/// Correct answers, faulted episodes, faulted episodes answered correctly and silent failures
/// of one strategy, counted from its episodes.
fn counts(report: &LiveReport, strategy: &str) -> (u64, u64, u64, u64) {
    let mut c = (0, 0, 0, 0);
    for e in report.episodes.iter().filter(|e| e.strategy == strategy) {
        c.0 += u64::from(e.correct);
        c.1 += u64::from(!e.faults.is_empty());
        c.2 += u64::from(e.correct && !e.faults.is_empty());
    }
    if let Some(r) = report.results.iter().find(|r| r.row.strategy == strategy) {
        c.3 = (r.row.sfr * r.row.episodes as f64).round() as u64;
    }
    c
}

/// The live run's main figure, drawn like the simulated benchmark's at one budget: TSR, RSR and
/// SFR of every strategy as grouped bars with Wilson 95 % whiskers.
pub fn svg_tsr(report: &LiveReport) -> String {
    use selfheal_bench::{Chart, Rate, Series, grouped_bars, strategy_color};
    let c = &report.config;
    let series = report
        .results
        .iter()
        .map(|r| {
            let n = r.row.episodes;
            let (ok, faulted, recovered, silent) = counts(report, r.row.strategy);
            Series {
                name: r.row.strategy.to_owned(),
                color: strategy_color(r.row.strategy),
                rates: vec![
                    Some(Rate::of(ok, n)),
                    Some(Rate::of(recovered, faulted)),
                    Some(Rate::of(silent, n)),
                ],
            }
        })
        .collect();
    grouped_bars(&Chart {
        title: format!(
            "Live model {}: outcomes by strategy at R = {}",
            c.model, c.budget
        ),
        subtitle: format!(
            "{} tasks, seed {}, fault rate {}; n = {} episodes per strategy (RSR: the faulted ones); whiskers: Wilson 95 % intervals",
            c.tasks,
            c.seed,
            c.fault_rate,
            report.results.first().map_or(0, |r| r.row.episodes)
        ),
        axis: "share of episodes".into(),
        category_axis: String::new(),
        categories: vec![
            "TSR: task success".into(),
            "RSR: recovered when faulted".into(),
            "SFR: silent failure".into(),
        ],
        series,
    })
}

/// The live run as a Markdown report, shaped like the simulated benchmark's: the settings, the
/// results table with Wilson intervals, the live measurements, how episodes ended, and `plots`.
pub fn markdown(report: &LiveReport, plots: &[&str]) -> String {
    use std::fmt::Write as _;
    let c = &report.config;
    let mut out = String::from("# selfheal bench --live report\n\n");
    let _ = writeln!(
        out,
        "Model `{}` at `{}`: {} tasks, seed {}, fault rate {}, R = {}, `max_tokens` {}, {} s per call, {} model calls per episode.\n",
        c.model,
        c.model_url,
        c.tasks,
        c.seed,
        c.fault_rate,
        c.budget,
        c.max_tokens,
        c.timeout_ms / 1000,
        c.max_model_calls
    );
    out.push_str("| strategy | R | episodes | TSR | 95 % CI | RSR | SFR | cost K | latency ms |\n");
    out.push_str("|---|---:|---:|---:|---|---:|---:|---:|---:|\n");
    for r in &report.results {
        let (ok, _, _, _) = counts(report, r.row.strategy);
        let ci = selfheal_bench::wilson(ok, r.row.episodes);
        let _ = writeln!(
            out,
            "| {} | {} | {} | {:.1} % | {:.1}–{:.1} | {:.1} % | {:.1} % | {:.2} | {:.0} |",
            r.row.strategy,
            r.row.budget,
            r.row.episodes,
            r.row.tsr * 100.0,
            ci[0] * 100.0,
            ci[1] * 100.0,
            r.row.rsr * 100.0,
            r.row.sfr * 100.0,
            r.row.cost,
            r.row.latency_ms
        );
    }
    out.push_str("\n## Live measurements\n\n| strategy | tokens / episode | model calls / episode | tool calls / episode | wall time | how episodes ended |\n|---|---:|---:|---:|---:|---|\n");
    for r in &report.results {
        let ended: Vec<String> = r
            .live
            .outcomes
            .iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect();
        let _ = writeln!(
            out,
            "| {} | {:.0} | {:.2} | {:.2} | {:.1} s | {} |",
            r.row.strategy,
            r.live.tokens,
            r.live.model_calls,
            r.live.tool_calls,
            r.live.wall_ms as f64 / 1000.0,
            ended.join(", ")
        );
    }
    for p in plots {
        let _ = writeln!(out, "\n![{p}]({p})");
    }
    out.push_str("\nEvery episode, with its transcript: `live-results.json`.\n");
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn answers_are_scored_by_their_last_number() {
        assert!(answer_matches("The answer is 1,234.5", &json!(1234.0)));
        assert!(!answer_matches("42", &json!(50.0)));
        assert!(answer_matches("-3.2 F", &json!(-3.2)));
        assert_eq!(last_number("none"), None);
    }

    #[test]
    fn every_task_has_a_prompt_and_tools() {
        let all: &'static [TaskSpec] = Box::leak(builtin(100).into_boxed_slice());
        let model: &'static FaultModel = Box::leak(Box::new(FaultModel::default_model().unwrap()));
        for t in &all[..5] {
            assert!(prompt(t).contains("Use the tools"));
            assert!(
                !prompt(t).contains("  "),
                "every literal is filled in: {}",
                prompt(t)
            );
            let world = Arc::new(Mutex::new(World::new(t, &[], model, 1)));
            let tools = task_tools(t, &world, true);
            assert!(tools.iter().all(|x| !x.spec().name.contains('.')));
            // Primary and substitute of every external step.
            assert!(tools.len() > t.plan.steps.len());
        }
    }

    #[test]
    fn a_tool_called_by_name_answers_its_step_then_the_next_one() {
        let all: &'static [TaskSpec] = Box::leak(builtin(100).into_boxed_slice());
        let model: &'static FaultModel = Box::leak(Box::new(FaultModel::default_model().unwrap()));
        let t = &all[0];
        let world = Arc::new(Mutex::new(World::new(t, &[], model, 1)));
        let first = t.plan.step_tool(0).unwrap();
        let args = selfheal_bench::resolve_args(&t.plan, 0, &[]).unwrap();
        let got = call_world(&world, &first.name, &args, true).unwrap();
        assert!(got.is_object(), "{got}");
        let nope = call_world(&world, "no.such_tool", &json!({}), true);
        assert!(nope.is_err());
        // Only tool-side faults are kept for a live run.
        let faults = tool_faults(t, 3, 1.0, model);
        assert!(
            faults
                .iter()
                .all(|f| model.faults[f.spec].target != Target::Agent)
        );
    }
}
