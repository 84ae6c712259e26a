//! `selfheal serve`: the OpenAI-compatible gateway. Argument parsing and glue only; the gateway
//! lives in `selfheal-gateway`.

use std::io::Write as _;
use std::path::PathBuf;

use anyhow::Context as _;
use clap::Args;

use selfheal_gateway::GatewayConfig;

/// Arguments of `selfheal serve`.
#[derive(Args, Debug)]
#[command(after_help = "\
EXAMPLES
  selfheal serve --upstream http://127.0.0.1:8080/v1
                                  heal every agent pointed at http://127.0.0.1:7420/v1
  selfheal serve --upstream http://127.0.0.1:8080/v1 --listen 127.0.0.1:0
                                  on a free port (the first line says which)
  selfheal serve --config selfheal.toml
                                  upstreams, model chains, keys, tenants and bounds from a file
  selfheal serve --upstream http://127.0.0.1:8080/v1 --policy fallback-first.toml
                                  another recovery policy
  selfheal serve --config selfheal.toml --state redis://10.0.0.5:6379/0
                                  one of several replicas sharing breakers through Redis

Then point the agent's OpenAI client at it, e.g. OpenAI(base_url=\"http://127.0.0.1:7420/v1\"),
and read what it decided with `selfheal trace list`. Health: GET /healthz, GET /readyz.")]
pub(crate) struct ServeArgs {
    /// Base URL of the upstream that serves every model name (up to and including `/v1`).
    #[arg(long)]
    pub upstream: Option<String>,
    /// Address to listen on (port 0 picks a free port; the bound address is printed).
    #[arg(long, default_value = "127.0.0.1:7420")]
    pub listen: String,
    /// A `selfheal.toml` with upstreams, model aliases, monitor thresholds and budgets.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Forward only: no healing, no run state (the floor of the load benchmark).
    #[arg(long)]
    pub passthrough: bool,
    /// A recovery-policy file, the same format as `selfheal bench --policy` (`[ladders]`,
    /// `[last_chance]`, `[retry]`): which action each failure class gets, e.g.
    /// `tool_timeout = ["escalate", "retry", "degrade"]` falls back to the next model of a chain
    /// at the first 5xx instead of retrying. Replaces the config's `[policy]`.
    #[arg(long, value_name = "FILE")]
    pub policy: Option<PathBuf>,
    /// Where the trace is stored (default: `$XDG_DATA_HOME/selfheal/trace.db`).
    #[arg(long)]
    pub trace_db: Option<PathBuf>,
    /// Record no trace.
    #[arg(long)]
    pub no_trace: bool,
    /// Days the trace keeps events and runs (0: for ever); older ones are deleted at start and
    /// every hour.
    #[arg(long, default_value_t = 30)]
    pub trace_retention_days: u64,
    /// Where replicas share state: `redis://[user:password@]host:port[/db]` — every replica
    /// pointed at the same Redis shares its upstreams' open circuits and the targets it learned
    /// not to stream tool calls — or `memory` (the default: this process only). Overrides the
    /// config's `[state] url`.
    #[arg(long, value_name = "URL")]
    pub state: Option<String>,
    /// Worker threads (default: one per core).
    #[arg(long)]
    pub threads: Option<usize>,
}

/// Logs go to stderr, one line per request at `info` (`RUST_LOG` overrides: `warn` for none,
/// `selfheal::upstream=debug` for every upstream attempt).
fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .try_init();
}

/// Runs `selfheal serve`; returns the process exit code.
pub(crate) fn run(args: ServeArgs) -> anyhow::Result<u8> {
    init_logging();
    let mut config = match &args.config {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("cannot read {}", path.display()))?;
            GatewayConfig::from_toml_str(&text)
                .map_err(|e| anyhow::anyhow!("--config {}: {e}", path.display()))?
        }
        None => GatewayConfig::default(),
    };
    if let Some(url) = &args.upstream {
        let base = GatewayConfig::for_upstream(url.clone());
        config.upstreams.extend(base.upstreams);
        config.default_upstream = base.default_upstream;
    }
    if config.upstreams.is_empty() {
        anyhow::bail!("no upstream: pass --upstream URL or --config FILE");
    }
    config.passthrough |= args.passthrough;
    if let Some(url) = &args.state {
        config.state.url = (url != "memory").then(|| url.clone());
    }
    if let Some(path) = &args.policy {
        config.policy = super::read_policy(path)?;
    }
    config.validate()?;
    let missing = config.missing_env(|v| std::env::var(v).ok());
    if !missing.is_empty() {
        anyhow::bail!(
            "the config names environment variables that are unset or empty: {}",
            missing.join(", ")
        );
    }
    let retention = (args.trace_retention_days > 0)
        .then(|| std::time::Duration::from_secs(args.trace_retention_days.saturating_mul(86_400)));
    let trace = super::open_trace_kept(args.no_trace, args.trace_db.as_deref(), retention)?;
    let mut rt = tokio::runtime::Builder::new_multi_thread();
    rt.enable_all();
    if let Some(n) = args.threads {
        rt.worker_threads(n.max(1));
    }
    let rt = rt.build()?;
    rt.block_on(async move {
        let shutdown = shutdown_signal()?;
        let listener = tokio::net::TcpListener::bind(&args.listen)
            .await
            .with_context(|| format!("cannot listen on {}", args.listen))?;
        let addr = listener.local_addr()?;
        println!("listening on http://{addr}");
        std::io::stdout().flush()?;
        selfheal_gateway::serve(config, listener, trace, shutdown).await?;
        eprintln!("selfheal: drained and stopped");
        Ok::<_, anyhow::Error>(())
    })?;
    Ok(0)
}

/// Registers the SIGINT and SIGTERM handlers now — before the address is printed, so a signal
/// sent as soon as the gateway is up is never the default kill — and returns the future that
/// resolves on the first of them.
fn shutdown_signal() -> anyhow::Result<impl std::future::Future<Output = ()> + Send + 'static> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let mut int = signal(SignalKind::interrupt())?;
        let mut term = signal(SignalKind::terminate())?;
        Ok(async move {
            tokio::select! {
                _ = int.recv() => {},
                _ = term.recv() => {},
            }
        })
    }
    #[cfg(not(unix))]
    {
        Ok(async {
            let _ = tokio::signal::ctrl_c().await;
        })
    }
}
