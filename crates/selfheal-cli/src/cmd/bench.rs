//! `selfheal bench`: the seeded fault-injection benchmark.

use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use selfheal_bench::FaultModel;
use selfheal_bench::Mix;
use selfheal_bench::Strategy;
use selfheal_bench::load_jsonl;
use selfheal_bench::{BenchConfig, CostWeights, TaskSet};

/// Arguments of `selfheal bench`.
#[derive(Args, Debug)]
#[command(after_help = "\
EXAMPLES
  selfheal bench                         the default run: 10 seeds x 100 tasks, R = 5
  selfheal bench --sweep --out report/   R = 1..5 and the risk curve, Markdown report and SVG plots
  selfheal bench --silent                only plausible-but-wrong faults (SFR)
  selfheal bench --seed 7 --fault-rate 0.3 --mix runtime=1,agent=1
  selfheal bench --json > results.json   machine output
  selfheal bench --policy mine.toml      self-healing under another policy, same episodes
  selfheal bench --faults my-faults.toml your own fault model (docs/bench/faults.md)
  selfheal bench --tasks data/nestful.jsonl
                                         tasks from a JSONL file (docs/bench/tasks.md)
  selfheal bench --live --model-url http://127.0.0.1:8089/v1 --model smollm2 --tasks 20
                                         the tasks driven by a live tool-calling model
  selfheal bench --live --model-url URL --model NAME --strategies static,retry-only,self-healing
  selfheal bench --gateway --seeds 2    the episodes through `selfheal serve` over HTTP, next to
                                         in-process self-healing on the same seeds

Every result is a pure function of the options: the same options give byte-identical JSON.")]
pub(crate) struct BenchArgs {
    /// First seed.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Number of consecutive seeds.
    #[arg(long, default_value_t = 10)]
    pub seeds: u32,
    /// A number N: run the first N tasks (default: all; 20 with --live). A path: read the tasks
    /// from that JSONL file (format in docs/bench/tasks.md) and run all of them.
    #[arg(long, value_name = "N|FILE")]
    pub tasks: Option<String>,
    /// Read the fault model from this TOML file (format in docs/bench/faults.md) instead of the
    /// built-in default (crates/selfheal-bench/faults/default.toml).
    #[arg(long, value_name = "FILE", conflicts_with = "live")]
    pub faults: Option<PathBuf>,
    /// Probability that a step is faulted, in [0, 1].
    #[arg(long, default_value_t = BenchConfig::default().fault_rate)]
    pub fault_rate: f64,
    /// Rescale the fault model's families to these totals, e.g.
    /// runtime=0.35,output=0.2,context=0.15,semantic=0.1,agent=0.2.
    #[arg(long)]
    pub mix: Option<String>,
    /// Recovery actions allowed per failure (R).
    #[arg(long, default_value_t = 5)]
    pub budget: u32,
    /// Run R = 1..5 for every strategy, and self-healing over its policy's `risk` setting
    /// (0, 0.001, 0.01, 0.05, 0.1, 0.3, 0.9) at the top budget on the same episodes: its
    /// risk/coverage curve (`risk_curve` in --json, squares on risk-coverage.svg).
    #[arg(long)]
    pub sweep: bool,
    /// The semantic silent-failure setting: only plausible-but-wrong faults.
    #[arg(long)]
    pub silent: bool,
    /// A deployment: each seed's episodes run in sequence against one world whose tools keep
    /// their state (a tool broken for good stays broken for every later episode that calls it);
    /// the report says which strategies carry memory across episodes. Simulated runs only.
    #[arg(long, conflicts_with = "live")]
    pub deployment: bool,
    /// Cost weights a,b,c,d[,e] of K = a·model + b·tool + c·verifier + d·recovery + e·fallback-model
    /// calls (e defaults to 5: escalation has its own price).
    #[arg(long, value_name = "A,B,C,D[,E]")]
    pub cost_weights: Option<String>,
    /// Only these strategies (comma-separated): static, retry-only, react, react+verify,
    /// full-replan, full-replan+verify, class-agnostic, self-healing. With --live: static,
    /// retry-only, self-healing (default static,self-healing).
    #[arg(long, value_delimiter = ',')]
    pub strategies: Vec<String>,
    /// Run `self-healing` with this policy (TOML: `[ladders]`, `[last_chance]`, `[retry]`,
    /// `max_actions_per_failure`; classes left out keep their default ladder) instead of the
    /// default one, on the same seeded episodes, to see what a policy change would have done.
    /// Actions per failure are capped at R, or at the file's cap if lower. Simulated runs only.
    #[arg(long, value_name = "FILE", conflicts_with = "live")]
    pub policy: Option<PathBuf>,
    /// Write machine-readable JSON to stdout instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Write a Markdown report and SVG plots into this directory.
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Write every episode's control-plane trace as JSON Lines to this file.
    #[arg(long, value_name = "FILE")]
    pub trace: Option<PathBuf>,
    /// Print how long the run took and how many episodes it ran (to stderr; with --sweep, the
    /// risk curve's episodes counted apart).
    #[arg(long)]
    pub timings: bool,
    /// Drive the tasks with a live OpenAI-compatible model: `static` against `self-healing`
    /// (and `retry-only` if asked for with --strategies).
    #[arg(long, requires_all = ["model_url", "model"])]
    pub live: bool,
    /// The live model server's base URL, up to and including `/v1`.
    #[arg(long, value_name = "URL")]
    pub model_url: Option<String>,
    /// The live model's name.
    #[arg(long, value_name = "NAME")]
    pub model: Option<String>,
    /// The environment variable that holds the live model's API key.
    #[arg(long, value_name = "VAR")]
    pub api_key_env: Option<String>,
    /// `max_tokens` per live model call.
    #[arg(long, default_value_t = 200)]
    pub max_tokens: u32,
    /// Timeout of one live model call, in seconds.
    #[arg(long, default_value_t = 60)]
    pub model_timeout: u64,
    /// Model calls allowed per live episode.
    #[arg(long, default_value_t = 8)]
    pub max_model_calls: u32,
    /// Run the episodes through `selfheal serve` over real HTTP on 127.0.0.1 — a scripted
    /// model endpoint (the benchmark's model) behind the gateway, a plain agent client in front
    /// — and print that row next to in-process self-healing on the same seeds. Takes the seed,
    /// task, fault and policy options; not --sweep, --out, --trace or --strategies.
    #[arg(long, conflicts_with_all = ["live", "sweep", "out", "trace", "strategies"])]
    pub gateway: bool,
}

/// `--gateway` in a binary built without the `gateway` feature.
#[cfg(not(feature = "gateway"))]
fn run_gateway(_args: &BenchArgs, _config: &BenchConfig) -> anyhow::Result<u8> {
    anyhow::bail!(
        "`selfheal bench --gateway` is not in this build: it was built without the `gateway` \
         feature (e.g. with --no-default-features). Build the full binary with \
         `cargo install --path crates/selfheal-cli --locked`."
    )
}

#[cfg(feature = "gateway")]
fn run_gateway(args: &BenchArgs, config: &BenchConfig) -> anyhow::Result<u8> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    let started = Instant::now();
    let bar = ProgressBar::hidden();
    bar.set_style(
        ProgressStyle::with_template("{spinner} [{bar:40}] {pos}/{len} episodes ({eta})")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    let mut progress = |done: u64, total: u64| {
        if bar.is_hidden() && started.elapsed().as_millis() > 1000 {
            bar.set_draw_target(indicatif::ProgressDrawTarget::stderr());
        }
        bar.set_length(total);
        bar.set_position(done);
    };
    let report = rt.block_on(selfheal_bench_gateway::run(config, &mut progress))?;
    bar.finish_and_clear();
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        print!("{}", selfheal_bench_gateway::table(&report));
    }
    if args.timings {
        eprintln!(
            "timings: {} episodes on each side in {:.3} s",
            report.episodes.len(),
            started.elapsed().as_secs_f64()
        );
    }
    Ok(0)
}

/// `--live` in a binary built without the `live` feature.
#[cfg(not(feature = "live"))]
fn run_live(_args: &BenchArgs) -> anyhow::Result<u8> {
    anyhow::bail!(
        "`selfheal bench --live` is not in this build: it was built without the `live` feature \
         (e.g. with --no-default-features). Build the full binary with \
         `cargo install --path crates/selfheal-cli --locked`."
    )
}

#[cfg(feature = "live")]
fn run_live(args: &BenchArgs) -> anyhow::Result<u8> {
    let (Some(url), Some(model)) = (&args.model_url, &args.model) else {
        anyhow::bail!("--live needs --model-url and --model");
    };
    let mut cfg = selfheal_live::LiveConfig::new(url.clone(), model.clone());
    cfg.api_key_env = args.api_key_env.clone();
    cfg.tasks = match &args.tasks {
        None => 20,
        Some(t) => t.parse().map_err(|_| {
            anyhow::anyhow!("--tasks with --live takes a number of built-in tasks, got {t:?}")
        })?,
    };
    cfg.seed = args.seed;
    cfg.fault_rate = args.fault_rate;
    cfg.budget = args.budget;
    cfg.max_tokens = args.max_tokens;
    cfg.timeout_ms = args.model_timeout.saturating_mul(1000);
    cfg.max_model_calls = args.max_model_calls;
    if !args.strategies.is_empty() {
        cfg.strategies = args
            .strategies
            .iter()
            .map(|s| {
                selfheal_live::LiveStrategy::parse(s.trim()).ok_or_else(|| {
                    anyhow::anyhow!(
                        "--strategies with --live: {s:?} is not a live strategy (static, retry-only, self-healing)"
                    )
                })
            })
            .collect::<anyhow::Result<_>>()?;
    }
    if let Some(w) = &args.cost_weights {
        cfg.weights = CostWeights::parse(w).map_err(|e| anyhow::anyhow!("--cost-weights: {e}"))?;
    }
    if !(0.0..=1.0).contains(&cfg.fault_rate) {
        anyhow::bail!("--fault-rate must be in [0, 1]");
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    let mut progress = |line: &str| eprintln!("{line}");
    let report = rt
        .block_on(selfheal_live::run(&cfg, &mut progress))
        .map_err(anyhow::Error::msg)?;
    if let Some(dir) = &args.out {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("cannot create directory {}", dir.display()))?;
        let write = |name: &str, body: String| {
            std::fs::write(dir.join(name), body)
                .with_context(|| format!("cannot write {}", dir.join(name).display()))
        };
        write("tsr-by-budget.svg", selfheal_live::svg_tsr(&report))?;
        write(
            "report.md",
            selfheal_live::markdown(&report, &["tsr-by-budget.svg"]),
        )?;
        write("live-results.json", serde_json::to_string_pretty(&report)?)?;
    }
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        print!("{}", selfheal_live::table(&report));
        if let Some(dir) = &args.out {
            println!("report written to {}", dir.join("report.md").display());
        }
    }
    Ok(0)
}

/// Runs `selfheal bench`; returns the process exit code.
pub(crate) fn run(args: BenchArgs) -> anyhow::Result<u8> {
    if args.live {
        return run_live(&args);
    }
    let mut config = BenchConfig {
        seed: args.seed,
        seeds: args.seeds,
        fault_rate: args.fault_rate,
        budget: args.budget,
        sweep: args.sweep,
        silent: args.silent,
        deployment: args.deployment,
        ..BenchConfig::default()
    };
    config.fault_model =
        FaultModel::default_model().map_err(|e| anyhow::anyhow!("built-in fault model: {e}"))?;
    if let Some(path) = &args.faults {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("--faults: cannot read {}", path.display()))?;
        config.fault_model = FaultModel::from_toml_str(&text)
            .map_err(|e| anyhow::anyhow!("--faults {}: {e}", path.display()))?;
        config.fault_model_name = file_name(path);
    }
    config.tasks = config.task_set.tasks.len();
    match &args.tasks {
        None => {}
        Some(t) => match t.parse::<usize>() {
            Ok(n) => config.tasks = n,
            Err(_) => {
                let path = PathBuf::from(t);
                let text = std::fs::read_to_string(&path)
                    .with_context(|| format!("--tasks: cannot read {}", path.display()))?;
                let tasks = load_jsonl(&text)
                    .map_err(|e| anyhow::anyhow!("--tasks {}: {e}", path.display()))?;
                config.tasks = tasks.len();
                config.task_set = TaskSet {
                    name: file_name(&path),
                    tasks,
                };
            }
        },
    }
    if let Some(m) = &args.mix {
        config.mix = Some(Mix::parse(m).map_err(|e| anyhow::anyhow!("--mix: {e}"))?);
    }
    if let Some(w) = &args.cost_weights {
        config.weights =
            CostWeights::parse(w).map_err(|e| anyhow::anyhow!("--cost-weights: {e}"))?;
    }
    if !args.strategies.is_empty() {
        config.strategies = args
            .strategies
            .iter()
            .map(|s| {
                Strategy::parse(s.trim()).ok_or_else(|| {
                    anyhow::anyhow!(
                        "--strategies: unknown strategy {s:?} (static, retry-only, react, react+verify, full-replan, full-replan+verify, class-agnostic, self-healing)"
                    )
                })
            })
            .collect::<anyhow::Result<_>>()?;
    }
    if let Some(path) = &args.policy {
        config.policy = Some(super::read_policy(path)?);
    }
    config.validate().map_err(anyhow::Error::msg)?;
    if args.gateway {
        return run_gateway(&args, &config);
    }

    let mut trace_file = match &args.trace {
        Some(path) => Some(std::io::BufWriter::new(
            std::fs::File::create(path)
                .with_context(|| format!("cannot create trace file {}", path.display()))?,
        )),
        None => None,
    };
    let mut trace_error: Option<std::io::Error> = None;
    let started = Instant::now();
    let bar = ProgressBar::hidden();
    bar.set_length(config.episodes());
    bar.set_style(
        ProgressStyle::with_template("{spinner} [{bar:40}] {pos}/{len} episodes ({eta})")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    let mut progress = |done: u64, _total: u64| {
        // Only show a bar on runs that last: the default run finishes well under a second.
        if bar.is_hidden() && started.elapsed().as_millis() > 1000 {
            bar.set_draw_target(indicatif::ProgressDrawTarget::stderr());
        }
        bar.set_position(done);
    };
    let mut sink = |line: &str| {
        if let Some(f) = trace_file.as_mut()
            && trace_error.is_none()
            && let Err(e) = writeln!(f, "{line}")
        {
            trace_error = Some(e);
        }
    };
    let report = if args.trace.is_some() {
        selfheal_bench::run(&config, &mut progress, Some(&mut sink))
    } else {
        selfheal_bench::run(&config, &mut progress, None)
    };
    bar.finish_and_clear();
    let elapsed = started.elapsed();
    if let Some(e) = trace_error {
        return Err(e).context("writing the trace file");
    }
    if let Some(mut f) = trace_file {
        f.flush().context("writing the trace file")?;
    }

    if let Some(dir) = &args.out {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("cannot create directory {}", dir.display()))?;
        let write = |name: &str, body: String| {
            std::fs::write(dir.join(name), body)
                .with_context(|| format!("cannot write {}", dir.join(name).display()))
        };
        write(
            "tsr-by-budget.svg",
            selfheal_bench::svg_tsr_by_budget(&report),
        )?;
        write(
            "recovery-by-class.svg",
            selfheal_bench::svg_class_bars(&report),
        )?;
        write(
            "risk-coverage.svg",
            selfheal_bench::svg_risk_coverage(&report),
        )?;
        write(
            "report.md",
            selfheal_bench::report_markdown(
                &report,
                &[
                    "tsr-by-budget.svg",
                    "recovery-by-class.svg",
                    "risk-coverage.svg",
                ],
            ),
        )?;
        write("results.json", serde_json::to_string_pretty(&report)?)?;
    }

    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        print!("{}", selfheal_bench::report_table(&report));
        if let Some(dir) = &args.out {
            println!("report written to {}", dir.join("report.md").display());
        }
    }
    if args.timings {
        // Every episode the elapsed time holds: the strategies' and the risk curve's.
        let (rows, curve) = (config.episodes(), config.curve_episodes());
        let total = rows + curve;
        let of = if curve > 0 {
            format!(" ({rows} by the strategies, {curve} on self-healing's risk curve)")
        } else {
            String::new()
        };
        eprintln!(
            "timings: {total} episodes{of} in {:.3} s ({:.1} µs per episode)",
            elapsed.as_secs_f64(),
            elapsed.as_secs_f64() * 1e6 / total.max(1) as f64
        );
    }
    Ok(0)
}

fn file_name(path: &std::path::Path) -> String {
    path.file_name().map_or_else(
        || path.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    )
}
