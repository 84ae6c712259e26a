//! `selfheal trace` (being built: issue 6).

use clap::Subcommand;

/// Subcommands of `selfheal trace`.
#[derive(Subcommand, Debug)]
pub enum TraceCommand {
    /// List recorded runs.
    List,
}

/// Runs `selfheal trace`; returns the process exit code.
pub fn run(_command: TraceCommand) -> anyhow::Result<u8> {
    anyhow::bail!("the trace store is not built yet")
}
