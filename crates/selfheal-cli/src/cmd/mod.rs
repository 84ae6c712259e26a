//! One module per subcommand.

pub(crate) mod bench;
pub(crate) mod demo;
#[cfg(feature = "mcp")]
pub(crate) mod mcp;
pub(crate) mod monitor;
pub(crate) mod repair;
#[cfg(feature = "gateway")]
pub(crate) mod serve;
#[cfg(any(feature = "gateway", feature = "mcp"))]
pub(crate) mod trace;

/// Reads a recovery-policy file (`[ladders]`, `[last_chance]`, `[retry]`,
/// `max_actions_per_failure`; classes left out keep the default ladders): the one format
/// `bench`, `serve` and `mcp` take with `--policy`.
pub(crate) fn read_policy(path: &std::path::Path) -> anyhow::Result<selfheal_core::Policy> {
    use anyhow::Context as _;
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("--policy: cannot read {}", path.display()))?;
    selfheal_core::Policy::from_toml_str(&text)
        .map_err(|e| anyhow::anyhow!("--policy {}: {e}", path.display()))
}

/// The trace writer `serve` and `mcp` record into: none with `--no-trace`, else the SQLite file
/// at `path` (default: `$XDG_DATA_HOME/selfheal/trace.db`).
#[cfg(feature = "mcp")]
pub(crate) fn open_trace(
    no_trace: bool,
    path: Option<&std::path::Path>,
) -> anyhow::Result<selfheal_trace::TraceWriter> {
    open_trace_kept(no_trace, path, Some(selfheal_trace::DEFAULT_RETENTION))
}

/// [`open_trace`] keeping events for `retention` (`None`: for ever).
#[cfg(any(feature = "gateway", feature = "mcp"))]
pub(crate) fn open_trace_kept(
    no_trace: bool,
    path: Option<&std::path::Path>,
    retention: Option<std::time::Duration>,
) -> anyhow::Result<selfheal_trace::TraceWriter> {
    use anyhow::Context as _;
    if no_trace {
        return Ok(selfheal_trace::TraceWriter::disabled());
    }
    let path = path.map_or_else(selfheal_trace::default_path, std::path::Path::to_path_buf);
    selfheal_trace::TraceWriter::open_with_retention(&path, retention)
        .with_context(|| format!("cannot open the trace at {}", path.display()))
}
