//! `selfheal` — the command-line face of the selfheal control plane.
//!
//! The binary is argument parsing plus glue; the work lives in the library crates.

mod cmd;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

/// Self-healing for tool-using LLM agents.
#[derive(Parser, Debug)]
#[command(name = "selfheal", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Repair almost-JSON from stdin (prose, code fences, trailing commas, truncation...) and
    /// optionally check it against a JSON Schema.
    Repair(cmd::repair::RepairArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Repair(args) => cmd::repair::run(args),
    };
    match result {
        Ok(code) => ExitCode::from(code),
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::from(2)
        }
    }
}
