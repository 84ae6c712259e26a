//! `selfheal trace`: read back the decisions the gateway recorded in its SQLite trace.

use std::path::PathBuf;

use clap::{Args, Subcommand};

use selfheal_gateway::TraceReader;

/// Where the trace is.
#[derive(Args, Debug)]
pub struct TraceDb {
    /// The trace database (default: `$XDG_DATA_HOME/selfheal/trace.db`).
    #[arg(long)]
    pub trace_db: Option<PathBuf>,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// Subcommands of `selfheal trace`.
#[derive(Subcommand, Debug)]
pub enum TraceCommand {
    /// List recorded runs, most recent first.
    List {
        /// Where and how.
        #[command(flatten)]
        db: TraceDb,
        /// Most runs shown.
        #[arg(long, default_value_t = 50)]
        limit: usize,
    },
    /// Show every recorded event of one run.
    Show {
        /// The run id (from `trace list` or the `x-selfheal-run` header).
        run: String,
        /// Where and how.
        #[command(flatten)]
        db: TraceDb,
    },
}

fn open(db: &TraceDb) -> anyhow::Result<TraceReader> {
    let path = db
        .trace_db
        .clone()
        .unwrap_or_else(selfheal_gateway::store::default_path);
    Ok(TraceReader::open(&path)?)
}

/// Runs `selfheal trace`; returns the process exit code.
pub fn run(command: TraceCommand) -> anyhow::Result<u8> {
    match command {
        TraceCommand::List { db, limit } => {
            let runs = open(&db)?.runs(limit)?;
            if db.json {
                println!("{}", serde_json::to_string_pretty(&runs)?);
                return Ok(0);
            }
            println!(
                "{:<24} {:>8} {:>7} {:>9} {:>8}  {:<9} last seen (unix ms)",
                "run", "requests", "events", "failures", "actions", "status"
            );
            for r in runs {
                println!(
                    "{:<24} {:>8} {:>7} {:>9} {:>8}  {:<9} {}",
                    r.run,
                    r.requests,
                    r.events,
                    r.failures,
                    r.actions,
                    r.status.as_deref().unwrap_or("-"),
                    r.last_ms
                );
            }
            Ok(0)
        }
        TraceCommand::Show { run, db } => {
            let events = open(&db)?.events(&run)?;
            if events.is_empty() {
                eprintln!("no events for run `{run}`");
                return Ok(1);
            }
            if db.json {
                println!("{}", serde_json::to_string_pretty(&events)?);
                return Ok(0);
            }
            for e in events {
                println!("{:>14}  {:<14} {}", e.t_ms, e.kind, e.detail);
            }
            Ok(0)
        }
    }
}
