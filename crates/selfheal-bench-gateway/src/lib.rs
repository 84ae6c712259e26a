//! # selfheal-bench-gateway — the benchmark through the deployed stack
//!
//! The simulated benchmark measures the core's controller in-process. Users deploy
//! `selfheal serve`. This crate runs the benchmark's episodes through the gateway over real HTTP
//! and puts the two rows side by side on the same seeds, so the number users read is the number
//! of what they run — and where the two differ, the difference is either something the gateway
//! cannot do by construction or a bug in one of them.
//!
//! ```text
//!  agent client ──HTTP──► selfheal serve ──HTTP──► scripted model endpoint
//!  (agent.rs: plain loop,   (the real gateway,       (endpoint.rs → model.rs:
//!   executes tool calls)     127.0.0.1:0)             the benchmark's model)
//!        │                                                   │
//!        └──── world.rs: the episode's Episode, one owner ───┘
//!              (tools run through selfheal_bench::exec; only exec reads the schedule)
//! ```
//!
//! Per episode ([`run`]): the same task, seed and drawn fault schedule as
//! `selfheal_bench::run`; the in-process `self-healing` strategy runs it once, the gateway arm
//! once, each on a fresh [`Episode`]. The gateway decides with the same core controller: the
//! tool results it reads in the history are its observations, and it carries out the
//! directives on the wire — tool-call arguments repaired or re-asked, the class ladder's retry,
//! substitute and replan as guidance, escalation as a request to the fallback model, an output
//! repair in place of the tool result, cross-checks as calls the agent makes, degrade as a
//! `partial` answer, a call whose arguments appear nowhere in the conversation taken out and
//! re-asked before the agent runs it (`[tools.NAME] grounded`), an answer judged against its
//! tool's declared fields and `as_of` stamp (`output`, `as_of`) and a refresh as guidance to
//! set the tool's cache-bypass argument (`refresh`) — and the scripted model reacts to those
//! (the `model` module). It executes no tool and knows no plan: what it knows of the tools is what the
//! arm declares in `[tools]` from the task file, as an operator would. Each episode row keeps
//! both sides' costs and, where they differ, the transcript.
//!
//! ```no_run
//! # async fn demo() -> Result<(), selfheal_bench_gateway::ArmError> {
//! use selfheal_bench::BenchConfig;
//! let config = BenchConfig { seeds: 1, tasks: 10, ..BenchConfig::default() };
//! let report = selfheal_bench_gateway::run(&config, &mut |_, _| {}).await?;
//! print!("{}", selfheal_bench_gateway::table(&report));
//! # Ok(()) }
//! ```

mod agent;
mod endpoint;
mod model;
mod world;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde::Serialize;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, oneshot};

use selfheal_bench::ANSWER_TOLERANCE;
use selfheal_bench::Strategy;
use selfheal_bench::{AS_OF, Costs, Episode, MAX_AGE_MS};
use selfheal_bench::{BenchConfig, CostWeights, ResultRow, schedules, wilson};
use selfheal_core::Policy;
use selfheal_gateway::{GatewayConfig, TraceWriter};

use crate::agent::{Client, MaxTurns};
use crate::world::World;

/// The name of the in-process row.
pub const IN_PROCESS: &str = "self-healing";
/// The name of the gateway arm's row.
pub const GATEWAY: &str = "self-healing via gateway";

/// How long the agent waits for one answer of the gateway.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// Why the arm could not run.
#[derive(Debug, thiserror::Error)]
pub enum ArmError {
    /// The configuration is not runnable here.
    #[error("{0}")]
    Config(String),
    /// A socket could not be opened.
    #[error("cannot listen on 127.0.0.1: {0}")]
    Listen(#[from] std::io::Error),
    /// The gateway could not be built.
    #[error("the gateway did not start: {0}")]
    Gateway(#[from] selfheal_gateway::StateError),
    /// The agent client could not be built.
    #[error("the agent client did not start: {0}")]
    ClientSetup(agent::ClientError),
    /// A request of the agent client failed (a client-visible failure: a hang, a dropped
    /// connection, an unreadable answer).
    #[error("seed {seed}, task {task}: {source}")]
    Client {
        /// The seed.
        seed: u64,
        /// The task.
        task: usize,
        /// What failed.
        source: agent::ClientError,
    },
}

/// One side of one episode.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Side {
    /// A correct answer.
    pub success: bool,
    /// An answer was returned as complete.
    pub claimed: bool,
}

/// One episode on both sides.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EpisodeRow {
    /// The seed.
    pub seed: u64,
    /// The task.
    pub task: usize,
    /// The drawn faults, by name.
    pub faults: Vec<String>,
    /// Of those, the ones drawn permanent.
    pub permanent: Vec<String>,
    /// The in-process self-healing strategy.
    pub in_process: Side,
    /// The gateway arm.
    pub gateway: Side,
    /// What the in-process side spent (model, fallback-model, tool and verifier calls,
    /// recoveries).
    pub in_process_costs: Costs,
    /// What the gateway arm spent.
    pub gateway_costs: Costs,
    /// The gateway's `selfheal.status` on the last answer (none: an error or the turn limit).
    pub status: Option<String>,
    /// Requests the agent sent to the gateway.
    pub turns: u32,
    /// Requests the scripted model answered (re-asks included).
    pub model_requests: u64,
    /// The agent's turn limit ended it.
    pub capped: bool,
    /// The gateway answered an error.
    pub error: Option<String>,
    /// The gateway arm's conversation (as the agent client saw it, the final answer with its
    /// `selfheal` object included), kept where the two sides' success differs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub transcript: Option<Vec<serde_json::Value>>,
}

/// Success counts of the two sides on the same episodes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Agreement {
    /// Both succeeded.
    pub both: u64,
    /// Only in-process succeeded.
    pub only_in_process: u64,
    /// Only the gateway arm succeeded.
    pub only_gateway: u64,
    /// Neither.
    pub neither: u64,
}

/// One fault on both sides: episodes that drew it, and how each side did on them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct FaultRow {
    /// The fault's name, with ` (permanent)` for its permanent draws.
    pub fault: String,
    /// Episodes that drew it.
    pub met: u64,
    /// Of those, in-process successes.
    pub in_process: u64,
    /// Of those, gateway successes.
    pub gateway: u64,
    /// Of those, in-process wrong answers returned as correct.
    pub in_process_silent: u64,
    /// Of those, gateway wrong answers returned as correct.
    pub gateway_silent: u64,
}

/// What the gateway arm did, beyond its row.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct GatewayStats {
    /// Mean requests from the agent to the gateway per episode.
    pub turns: f64,
    /// Mean requests from the gateway to the scripted model per episode.
    pub model_requests: f64,
    /// Episodes by the gateway's final `selfheal.status`.
    pub statuses: BTreeMap<String, u64>,
    /// The gateway's actions over all answers (`selfheal.actions`).
    pub actions: BTreeMap<String, u64>,
    /// Episodes the agent's turn limit ended.
    pub capped: u64,
    /// Episodes the gateway answered with an error.
    pub errors: u64,
    /// Wall time of the arm, in milliseconds.
    pub wall_ms: u64,
}

/// The two rows and how they compare.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ArmReport {
    /// The first seed.
    pub seed: u64,
    /// Consecutive seeds.
    pub seeds: u32,
    /// Tasks per seed.
    pub tasks: usize,
    /// Fault rate.
    pub fault_rate: f64,
    /// Recovery actions per failure (R).
    pub budget: u32,
    /// The in-process row, then the gateway's.
    pub results: Vec<ResultRow>,
    /// Wilson 95 % intervals of RSR, in the same order.
    pub rsr_ci: Vec<[f64; 2]>,
    /// Success on the same episodes.
    pub agreement: Agreement,
    /// Per fault, both sides.
    pub by_fault: Vec<FaultRow>,
    /// The gateway arm's own counts.
    pub gateway: GatewayStats,
    /// Every episode.
    pub episodes: Vec<EpisodeRow>,
}

#[derive(Debug, Default)]
struct Acc {
    n: u64,
    successes: u64,
    faulted: u64,
    recovered: u64,
    silent: u64,
    k: f64,
    latency_ms: u64,
}

impl Acc {
    fn add(&mut self, side: Side, faulted: bool, costs: &Costs, w: &CostWeights, ms: u64) {
        self.n += 1;
        self.successes += u64::from(side.success);
        self.silent += u64::from(side.claimed && !side.success);
        if faulted {
            self.faulted += 1;
            self.recovered += u64::from(side.success);
        }
        self.k += k(w, costs);
        self.latency_ms += ms;
    }

    fn row(&self, strategy: &'static str, budget: u32) -> ResultRow {
        // Rounded to four places, as the benchmark's own rows are.
        let ratio = |a: u64, b: u64| {
            if b == 0 {
                0.0
            } else {
                (a as f64 / b as f64 * 10_000.0).round() / 10_000.0
            }
        };
        let nf = self.n.max(1) as f64;
        ResultRow {
            strategy,
            budget,
            episodes: self.n,
            tsr: ratio(self.successes, self.n),
            rsr: ratio(self.recovered, self.faulted),
            sfr: ratio(self.silent, self.n),
            cost: (self.k / nf * 100.0).round() / 100.0,
            latency_ms: (self.latency_ms as f64 / nf).round(),
        }
    }
}

/// `K = a·M + b·U + c·V + d·R + e·E`, as the benchmark weighs it.
fn k(w: &CostWeights, c: &Costs) -> f64 {
    w.model * c.model_calls as f64
        + w.tool * c.tool_calls as f64
        + w.verifier * c.verifier_calls as f64
        + w.recovery * c.recoveries as f64
        + w.escalation * c.escalated_calls as f64
}

/// The policy both sides run: the configuration's (or the default), its actions per failure
/// capped at R as the benchmark caps them.
pub fn capped_policy(config: &BenchConfig) -> Policy {
    let base = config.policy.clone().unwrap_or_default();
    let r = config.budget;
    Policy {
        max_actions_per_failure: Some(base.max_actions_per_failure.map_or(r, |cap| cap.min(r))),
        ..base
    }
}

/// The gateway both sides are compared through: `selfheal serve` in front of the scripted
/// model at `model_url`, with the benchmark's policy, no trace, and what an operator would
/// configure for these tools and models:
///
/// - `[tools]`: each tool's equivalent source (the in-process client's substitute) and, for the
///   external ones, a cross-check against it with the tool's documented tolerance — what the
///   in-process client knows from the same task file; and every tool (and substitute) as
///   `grounded`: its arguments are copied from the task or an earlier result, the rule the
///   in-process client checks calls with; its declared output fields (`output`, the contract
///   the in-process client checks answers against) and, for a tool that stamps its data, the
///   stamp (`as_of`, with the in-process maximum age) and its cache-bypass argument
///   (`refresh`, `agent::REFRESH_ARGUMENT`);
/// - the model's chain: the scripted model, then the fallback model
///   (`model::FALLBACK_MODEL`) the ladder's escalation goes to;
/// - the in-process budget vector ([`selfheal_bench::self_healing_budget`]) for the
///   task set's longest plan (a deployment has one budget for every run).
pub fn gateway_config(config: &BenchConfig, model_url: &str) -> GatewayConfig {
    use selfheal_gateway::{ModelRoute, Target, ToolConfig};
    let mut g = GatewayConfig::for_upstream(model_url);
    g.policy = capped_policy(config);
    // The in-process run's budget vector; the gateway's is one per deployment, so it is sized
    // for the longest plan of the task set.
    let longest = config
        .task_set
        .tasks
        .iter()
        .map(|t| t.plan.steps.len())
        .max()
        .unwrap_or(1);
    g.budget = selfheal_bench::self_healing_budget(longest, config.budget);
    let target = |model: &str| Target {
        upstream: "default".into(),
        model: model.into(),
    };
    g.models.insert(
        agent::MODEL.into(),
        ModelRoute {
            chain: vec![target(agent::MODEL), target(model::FALLBACK_MODEL)],
        },
    );
    // A deployment declares one contract per tool: where the task file's tasks declare a
    // tool's output differently (NESTFUL does, for 11 of its tools), the fields every one of
    // them declares — what the tool always returns.
    let mut common: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for t in config
        .task_set
        .tasks
        .iter()
        .flat_map(|task| &task.plan.tools)
    {
        let fields: Vec<String> = t.output.iter().map(|(p, _)| p.clone()).collect();
        common
            .entry(t.name.as_str())
            .and_modify(|c| c.retain(|f| fields.contains(f)))
            .or_insert(fields);
    }
    for task in &config.task_set.tasks {
        for t in &task.plan.tools {
            // Every tool of the task file takes arguments copied from the task or an earlier
            // result (`grounded`); an external one is cross-checked: against its equivalent
            // source, or by a second read of itself where it has none (as in-process).
            // Its declared output fields are its contract; one that stamps its data declares
            // the stamp and its cache-bypass argument (the task file's `freshness`). The
            // substitute answers the same question with the same fields.
            let declared = ToolConfig {
                grounded: true,
                output: common.get(t.name.as_str()).cloned().unwrap_or_default(),
                as_of: t.freshness.then(|| AS_OF.to_owned()),
                max_age_ms: MAX_AGE_MS,
                refresh: t.freshness.then(|| agent::REFRESH_ARGUMENT.to_owned()),
                ..ToolConfig::default()
            };
            g.tools.entry(t.name.clone()).or_insert_with(|| ToolConfig {
                substitute: t.substitute.clone(),
                cross_check: t.external,
                // A tool with no equivalent is read once more before a recovered run answers
                // (the core's read before answering; in-process reads the same values).
                reread: t.substitute.is_none(),
                tolerance: selfheal_core::Tolerance {
                    rel: t.tolerance.rel,
                    abs: t.tolerance.abs,
                },
                ..declared.clone()
            });
            if let Some(sub) = &t.substitute {
                g.tools.entry(sub.clone()).or_insert(declared);
            }
        }
    }
    g
}

/// Runs the in-process `self-healing` strategy and the gateway arm on every episode of
/// `config` (its seeds, tasks, fault rate, fault model and budget; `sweep` and the strategy list
/// are not used). `progress(done, total)` is called after each episode.
pub async fn run(
    config: &BenchConfig,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<ArmReport, ArmError> {
    config.validate().map_err(ArmError::Config)?;
    let started = Instant::now();
    let model = config.effective_model();
    let tasks = &config.task_set.tasks[..config.tasks.min(config.task_set.tasks.len())];
    let drawn = schedules(config);
    let budget = config.budget;

    // The scripted model's endpoint and the gateway in front of it, both on 127.0.0.1:0.
    let (ask_tx, mut asks) = mpsc::channel(16);
    let model_listener = TcpListener::bind("127.0.0.1:0").await?;
    let model_url = format!("http://{}/v1", model_listener.local_addr()?);
    // The gateway's waits (a tool retry's delay) pass on the episode's clock, in order with
    // the model's requests, not on the wall clock ([`selfheal_gateway::Wait`]).
    let waits = ask_tx.clone();
    let (stop_model, model_stopped) = oneshot::channel::<()>();
    let endpoint = tokio::spawn(async move {
        axum::serve(model_listener, endpoint::router(ask_tx))
            .with_graceful_shutdown(async move {
                let _ = model_stopped.await;
            })
            .await
    });
    let gw_listener = TcpListener::bind("127.0.0.1:0").await?;
    let gw_url = format!("http://{}/v1", gw_listener.local_addr()?);
    let gw_config = gateway_config(config, &model_url);
    // Build the state once here so a bad configuration is an error, not a dead task.
    selfheal_gateway::AppState::new(gw_config.clone(), TraceWriter::disabled())?;
    let (stop_gw, gw_stopped) = oneshot::channel::<()>();
    let wait = selfheal_gateway::Wait::simulated(move |delay| {
        let waits = waits.clone();
        let ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX);
        Box::pin(async move {
            let _ = waits.send(endpoint::Msg::Wait(ms)).await;
        })
    });
    let gateway = tokio::spawn(selfheal_gateway::serve_with(
        gw_config,
        gw_listener,
        TraceWriter::disabled(),
        async move {
            let _ = gw_stopped.await;
        },
        wait,
    ));
    let client = Client::new(&gw_url, REQUEST_TIMEOUT).map_err(ArmError::ClientSetup)?;

    let total = u64::from(config.seeds) * tasks.len() as u64;
    let (mut ip, mut gw) = (Acc::default(), Acc::default());
    let mut stats = GatewayStats::default();
    let mut by_fault: BTreeMap<String, FaultRow> = BTreeMap::new();
    let mut agreement = Agreement::default();
    let mut episodes = Vec::with_capacity(total as usize);
    let policy = config.policy.as_ref();
    for (si, per_seed) in drawn.iter().enumerate() {
        let seed = config.seed + si as u64;
        // In a deployment the in-process side carries its trust store across the seed's
        // episodes, as `selfheal_bench::run` does (the gateway keeps its own per process).
        let mut trust = selfheal_core::Trust::new();
        for (ti, (task, faults)) in tasks.iter().zip(per_seed).enumerate() {
            // Both sides place the episode on the benchmark's clock, as `selfheal_bench::run`
            // does: a seed's `ti`-th episode starts `ti` minutes in, which is what puts it
            // inside a fault's `window` (an outage) or not.
            let start = ti as u64 * selfheal_bench::EPISODE_SPACING_MS;
            let faulted = !faults.is_empty();
            let score = |answer: Option<&serde_json::Value>| Side {
                success: answer.is_some_and(|a| ANSWER_TOLERANCE.agrees(a, &task.expected)),
                claimed: answer.is_some(),
            };

            // In-process, exactly as `selfheal_bench::run` runs it.
            let mut ep = Episode::new(task, faults, &model, seed);
            ep.start_at(start);
            if !config.deployment {
                trust = selfheal_core::Trust::new();
            }
            let ended = Strategy::SelfHealing.run_with_trust(
                &mut ep,
                budget,
                policy,
                seed.wrapping_mul(1_000_003).wrapping_add(task.id as u64),
                false,
                &mut trust,
            );
            let in_process = score(ended.answer.as_ref());
            ip.add(in_process, faulted, &ep.costs(), &config.weights, ep.now());

            // Through the gateway.
            // The world's tools stamp `as_of` on the gateway's clock (the wall clock), as a
            // deployed tool does; the ages are the world's.
            let mut gateway_ep = Episode::new(task, faults, &model, seed);
            gateway_ep.start_at(start);
            gateway_ep.set_data_now(selfheal_gateway::wall_ms());
            let mut world = World::new(task, gateway_ep);
            let run_label = format!("bench-{seed}-{}", task.id);
            let max = MaxTurns::for_plan(task.plan.steps.len(), budget);
            let end = client
                .run(&mut world, &mut asks, task, &run_label, max)
                .await
                .map_err(|source| ArmError::Client {
                    seed,
                    task: task.id,
                    source,
                })?;
            for _ in 0..end.recoveries {
                world.ep.charge_recovery();
            }
            let gateway_side = score(end.answer.as_ref());
            gw.add(
                gateway_side,
                faulted,
                &world.ep.costs(),
                &config.weights,
                world.ep.now(),
            );

            match (in_process.success, gateway_side.success) {
                (true, true) => agreement.both += 1,
                (true, false) => agreement.only_in_process += 1,
                (false, true) => agreement.only_gateway += 1,
                (false, false) => agreement.neither += 1,
            }
            let mut names: Vec<String> = faults
                .iter()
                .filter_map(|f| Some(model.faults.get(f.spec)?.name.clone()))
                .collect();
            names.sort_unstable();
            names.dedup();
            // Per fault and persistence: a permanent agent fault is one only a plan lookup or
            // the (fallible) fallback model fixes.
            let mut kinds: Vec<String> = faults
                .iter()
                .filter_map(|f| {
                    let name = &model.faults.get(f.spec)?.name;
                    Some(if f.permanent {
                        format!("{name} (permanent)")
                    } else {
                        name.clone()
                    })
                })
                .collect();
            kinds.sort_unstable();
            kinds.dedup();
            for name in &kinds {
                let row = by_fault.entry(name.clone()).or_insert_with(|| FaultRow {
                    fault: name.clone(),
                    ..FaultRow::default()
                });
                row.met += 1;
                row.in_process += u64::from(in_process.success);
                row.gateway += u64::from(gateway_side.success);
                row.in_process_silent += u64::from(in_process.claimed && !in_process.success);
                row.gateway_silent += u64::from(gateway_side.claimed && !gateway_side.success);
            }
            let status_key = end.status.clone().unwrap_or_else(|| {
                if end.capped {
                    "turn limit".into()
                } else {
                    "error".into()
                }
            });
            *stats.statuses.entry(status_key).or_default() += 1;
            for a in &end.actions {
                *stats.actions.entry(a.clone()).or_default() += 1;
            }
            stats.capped += u64::from(end.capped);
            stats.errors += u64::from(end.error.is_some());
            stats.turns += f64::from(end.turns);
            stats.model_requests += world.model.asks() as f64;
            let mut permanent: Vec<String> = faults
                .iter()
                .filter(|f| f.permanent)
                .filter_map(|f| Some(model.faults.get(f.spec)?.name.clone()))
                .collect();
            permanent.sort_unstable();
            permanent.dedup();
            episodes.push(EpisodeRow {
                seed,
                task: task.id,
                faults: names,
                permanent,
                in_process,
                gateway: gateway_side,
                in_process_costs: ep.costs(),
                gateway_costs: world.ep.costs(),
                status: end.status,
                turns: end.turns,
                model_requests: world.model.asks(),
                capped: end.capped,
                error: end.error,
                transcript: (in_process.success != gateway_side.success).then_some(end.transcript),
            });
            progress(episodes.len() as u64, total);
        }
    }
    let _ = stop_gw.send(());
    let _ = stop_model.send(());
    let _ = gateway.await;
    let _ = endpoint.await;

    let n = episodes.len().max(1) as f64;
    stats.turns = (stats.turns / n * 100.0).round() / 100.0;
    stats.model_requests = (stats.model_requests / n * 100.0).round() / 100.0;
    stats.wall_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
    Ok(ArmReport {
        seed: config.seed,
        seeds: config.seeds,
        tasks: tasks.len(),
        fault_rate: config.fault_rate,
        budget,
        results: vec![ip.row(IN_PROCESS, budget), gw.row(GATEWAY, budget)],
        rsr_ci: vec![
            wilson(ip.recovered, ip.faulted),
            wilson(gw.recovered, gw.faulted),
        ],
        agreement,
        by_fault: by_fault.into_values().collect(),
        gateway: stats,
        episodes,
    })
}

fn pct(x: f64) -> String {
    format!("{:.1} %", 100.0 * x)
}

/// The report as text: the two rows, their agreement, and the faults where they differ.
pub fn table(r: &ArmReport) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let faulted = r.episodes.iter().filter(|e| !e.faults.is_empty()).count();
    let _ = writeln!(
        out,
        "{} seeds from {} x {} tasks, fault rate {}, R = {}: {} episodes, {faulted} with a fault",
        r.seeds,
        r.seed,
        r.tasks,
        r.fault_rate,
        r.budget,
        r.episodes.len()
    );
    let _ = writeln!(
        out,
        "\n| strategy | RSR | 95 % CI | TSR | SFR | K | latency (simulated) |"
    );
    let _ = writeln!(out, "|---|---:|---|---:|---:|---:|---:|");
    for (row, ci) in r.results.iter().zip(&r.rsr_ci) {
        let _ = writeln!(
            out,
            "| {} | {} | {:.1}–{:.1} | {} | {} | {:.2} | {:.1} s |",
            row.strategy,
            pct(row.rsr),
            100.0 * ci[0],
            100.0 * ci[1],
            pct(row.tsr),
            pct(row.sfr),
            row.cost,
            row.latency_ms / 1000.0
        );
    }
    let a = r.agreement;
    let _ = writeln!(
        out,
        "\nsame episodes: both solved {}, only in-process {}, only via gateway {}, neither {}",
        a.both, a.only_in_process, a.only_gateway, a.neither
    );
    let g = &r.gateway;
    let statuses: Vec<String> = g.statuses.iter().map(|(k, v)| format!("{k} {v}")).collect();
    let actions: Vec<String> = g.actions.iter().map(|(k, v)| format!("{k} {v}")).collect();
    let _ = writeln!(
        out,
        "gateway arm: {:.2} agent requests and {:.2} model requests per episode; final status: {}; \
         actions: {}; {} hit the turn limit, {} gateway errors; {:.1} s wall",
        g.turns,
        g.model_requests,
        statuses.join(", "),
        if actions.is_empty() {
            "none".to_owned()
        } else {
            actions.join(", ")
        },
        g.capped,
        g.errors,
        g.wall_ms as f64 / 1000.0
    );
    let differ: Vec<&FaultRow> = r
        .by_fault
        .iter()
        .filter(|f| f.in_process != f.gateway || f.in_process_silent != f.gateway_silent)
        .collect();
    if !differ.is_empty() {
        let _ = writeln!(
            out,
            "\n| fault | met | solved in-process | solved via gateway | silent in-process | silent via gateway |"
        );
        let _ = writeln!(out, "|---|---:|---:|---:|---:|---:|");
        for f in differ {
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {} | {} |",
                f.fault, f.met, f.in_process, f.gateway, f.in_process_silent, f.gateway_silent
            );
        }
    }
    out
}
