//! `selfheal serve` (being built: issue 6).

use clap::Args;

/// Arguments of `selfheal serve`.
#[derive(Args, Debug)]
pub struct ServeArgs {}

/// Runs `selfheal serve`; returns the process exit code.
pub fn run(_args: ServeArgs) -> anyhow::Result<u8> {
    anyhow::bail!("the gateway is not built yet")
}
