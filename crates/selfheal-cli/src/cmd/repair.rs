//! `selfheal repair` (to be written).

use clap::Args;

/// Arguments of `selfheal repair`.
#[derive(Args, Debug)]
pub struct RepairArgs {}

/// Runs `selfheal repair`; returns the process exit code.
pub fn run(_args: RepairArgs) -> anyhow::Result<u8> {
    anyhow::bail!("not yet implemented")
}
