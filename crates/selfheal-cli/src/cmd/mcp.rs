//! `selfheal mcp -- COMMAND`: the self-healing MCP proxy. Argument parsing and glue only; the
//! proxy lives in `selfheal-mcp`.

use std::path::PathBuf;
use std::process::Stdio;

use anyhow::Context as _;
use clap::Args;
use serde_json::json;

use selfheal_core::{EventKind, MonitorConfig};
use selfheal_mcp::{McpConfig, Proxy};
use selfheal_trace::{RunSummary, TraceEvent};

/// Arguments of `selfheal mcp`.
#[derive(Args, Debug)]
#[command(after_help = "\
EXAMPLES
  selfheal mcp -- npx -y @modelcontextprotocol/server-filesystem /srv/data
  selfheal mcp --call-timeout 10 --retries 20 -- python my_server.py
  selfheal mcp --policy no-retry.toml -- python my_server.py
  selfheal mcp --config tools.toml -- python my_server.py

TOOL CONTRACTS (--config FILE): the gateway's `[tools.NAME]` tables, checked on every
tools/call result (the value is `structuredContent`, else the text read as JSON):

  [tools.fx_rate]
  output = [\"rate\", \"pair\"]   # declared fields: missing/renamed = schema drift, null/empty = empty
  as_of = \"as_of\"              # field stamping when the data was current (Unix ms)
  max_age_ms = 60000           # older is stale (default one hour)
  refresh = \"no_cache\"         # boolean argument that bypasses the tool's cache
  reread = true                # after a recovered call, ask the model to read it again

A breach is decided by the recovery policy: a renamed field is mapped back when exactly one key is
recognisably it; a read-only/idempotent tool is retried, or called again with `refresh` set for
stale data; what is left is flagged (isError for a drifted or empty answer, guidance for stale
data), never passed on as if fine. `substitute`, `cross_check`, `tolerance` and `grounded` need
the conversation and are refused here (use `selfheal serve`).

In an MCP client's configuration, put `selfheal` as the command and `mcp -- <the server's command>`
in front of the server's arguments. The proxy speaks MCP on its stdin/stdout; the server's stderr
passes through. Decisions go to the trace (`selfheal trace list`, run `mcp-<pid>`).")]
pub(crate) struct McpArgs {
    /// Seconds a tool call may take before it is cancelled and failed.
    #[arg(long, default_value_t = 60)]
    pub call_timeout: u64,
    /// Retries over the whole session, at most (default: no cap beyond the policy's ladders,
    /// which allow two retries of a timed-out call). Only tools the server marks read-only or
    /// idempotent are ever retried.
    #[arg(long, value_name = "N")]
    pub retries: Option<u64>,
    /// A recovery-policy file, the same format as `selfheal bench --policy` and `selfheal serve
    /// --policy`: its ladders decide whether a failed call is retried, `[retry]` the backoff.
    #[arg(long, value_name = "FILE")]
    pub policy: Option<PathBuf>,
    /// A TOML file with the monitor's thresholds (the keys of `[monitor]` in selfheal.toml,
    /// e.g. `circuit_after = 5`).
    #[arg(long, value_name = "FILE")]
    pub monitor_config: Option<PathBuf>,
    /// A TOML file of `[tools.NAME]` tables, the gateway's keys: the output contract
    /// (`output`), freshness (`as_of`, `max_age_ms`, `refresh`) and `reread` of the server's
    /// tools, carried out on every tools/call result (see below).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Where the trace is stored (default: `$XDG_DATA_HOME/selfheal/trace.db`).
    #[arg(long)]
    pub trace_db: Option<PathBuf>,
    /// Record no trace.
    #[arg(long)]
    pub no_trace: bool,
    /// Longest JSON-RPC message (one line) accepted from the client or the server, in bytes;
    /// a longer one is refused with a JSON-RPC error, never forwarded in part.
    #[arg(long, value_name = "BYTES", default_value_t = selfheal_mcp::DEFAULT_MAX_LINE_BYTES)]
    pub max_line_bytes: usize,
    /// The MCP server to start, and its arguments (after `--`).
    #[arg(last = true, required = true, value_name = "COMMAND")]
    pub command: Vec<String>,
}

/// Runs `selfheal mcp`; returns the process exit code.
pub(crate) fn run(args: McpArgs) -> anyhow::Result<u8> {
    let monitor = match &args.monitor_config {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("cannot read {}", path.display()))?;
            MonitorConfig::from_toml_str(&text)
                .map_err(|e| anyhow::anyhow!("--monitor-config {}: {e}", path.display()))?
        }
        None => MonitorConfig::default(),
    };
    let mut config = McpConfig {
        monitor,
        call_timeout_ms: args.call_timeout.saturating_mul(1000),
        ..McpConfig::default()
    };
    if let Some(n) = args.retries {
        config.budget.retries = n;
    }
    if let Some(path) = &args.policy {
        config.policy = super::read_policy(path)?;
    }
    if let Some(path) = &args.config {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read {}", path.display()))?;
        config.tools = selfheal_mcp::tools_from_toml_str(&text)
            .map_err(|e| anyhow::anyhow!("--config {}: {e}", path.display()))?;
    }
    let proxy = Proxy::new(config).map_err(|e| anyhow::anyhow!("invalid configuration: {e}"))?;
    let trace = super::open_trace(args.no_trace, args.trace_db.as_deref())?;
    let (program, rest) = args
        .command
        .split_first()
        .context("no MCP server command after `--`")?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let run_id: std::sync::Arc<str> = format!("mcp-{}", std::process::id()).into();
    let result = rt.block_on(async {
        let mut child = tokio::process::Command::new(program)
            .args(rest)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("cannot start the MCP server `{program}`"))?;
        let (Some(server_in), Some(server_out)) = (child.stdin.take(), child.stdout.take()) else {
            anyhow::bail!("the MCP server's stdio could not be piped");
        };
        let now = unix_ms;
        let mut on_decision = |d: selfheal_mcp::Decision| {
            trace.send(TraceEvent {
                run: run_id.clone(),
                t_ms: now(),
                kind: d.kind,
                detail: json!({"tool": d.tool, "detail": d.detail}).into(),
                summary: None,
            });
        };
        let stats = selfheal_mcp::run(
            proxy,
            tokio::io::stdin(),
            tokio::io::stdout(),
            server_out,
            server_in,
            selfheal_mcp::RunOptions {
                seed: now(),
                max_line_bytes: args.max_line_bytes,
            },
            &mut on_decision,
        )
        .await?;
        // The client is gone: give the server a moment to exit on its closed stdin.
        if tokio::time::timeout(std::time::Duration::from_secs(2), child.wait())
            .await
            .is_err()
        {
            let _ = child.kill().await;
        }
        Ok::<_, anyhow::Error>(stats)
    });
    // tokio reads stdin on a thread that cannot be interrupted: a client that keeps its end open
    // after the server died must not keep this process alive, so the runtime is not waited for.
    rt.shutdown_background();
    let (status, stats) = match &result {
        Ok(stats) => ("complete", *stats),
        Err(_) => ("failed", selfheal_mcp::Stats::default()),
    };
    trace.send(TraceEvent {
        run: run_id,
        t_ms: unix_ms(),
        kind: EventKind::Session,
        detail: serde_json::to_value(stats)?.into(),
        summary: Some(RunSummary {
            status: status.into(),
            failures: stats.failures,
            actions: stats.retries + stats.repaired + stats.answered,
        }),
    });
    // Every path ends here, so what was decided is on disk before the process exits.
    trace.flush_and_close();
    result.map(|_| 0)
}

fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}
