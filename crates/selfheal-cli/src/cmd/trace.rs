//! `selfheal trace`: read back the decisions the gateway recorded in its SQLite trace.

use std::path::PathBuf;

use clap::{Args, Subcommand};

use selfheal_gateway::TraceReader;
use selfheal_gateway::store::{StoreError, is_action};

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

/// Opens the trace: `None` when the default trace does not exist yet (nothing was recorded), an
/// error when a path given with `--trace-db` does not exist (never an empty new database).
fn open(db: &TraceDb) -> anyhow::Result<Option<TraceReader>> {
    let path = db
        .trace_db
        .clone()
        .unwrap_or_else(selfheal_gateway::store::default_path);
    match TraceReader::open(&path) {
        Err(StoreError::NotFound(p)) if db.trace_db.is_none() => {
            eprintln!(
                "no trace yet at {}: `selfheal serve` and `selfheal mcp` write it",
                p.display()
            );
            Ok(None)
        }
        r => Ok(Some(r?)),
    }
}

/// A Unix time in ms as a local ISO-8601 time with milliseconds and the UTC offset, e.g.
/// `2026-11-30T07:41:05.123+01:00` (the raw number if it is out of range).
pub fn local_time(unix_ms: i64) -> String {
    match jiff::Timestamp::from_millisecond(unix_ms) {
        Ok(t) => t
            .to_zoned_datetime(jiff::tz::TimeZone::system())
            .strftime("%Y-%m-%dT%H:%M:%S%.3f%:z")
            .to_string(),
        Err(_) => unix_ms.to_string(),
    }
}

/// Runs `selfheal trace`; returns the process exit code.
pub fn run(command: TraceCommand) -> anyhow::Result<u8> {
    match command {
        TraceCommand::List { db, limit } => {
            let runs = match open(&db)? {
                Some(reader) => reader.runs(limit)?,
                None if db.json => Vec::new(),
                None => return Ok(0),
            };
            if db.json {
                println!("{}", serde_json::to_string_pretty(&runs)?);
                return Ok(0);
            }
            println!(
                "{:<24} {:>8} {:>7} {:>9} {:>8}  {:<9} last seen",
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
                    local_time(r.last_ms)
                );
            }
            Ok(0)
        }
        TraceCommand::Show { run, db } => {
            let events = match open(&db)? {
                Some(reader) => reader.events(&run)?,
                None => Vec::new(),
            };
            if events.is_empty() {
                eprintln!("no events for run `{run}`");
                return Ok(1);
            }
            if db.json {
                println!("{}", serde_json::to_string_pretty(&events)?);
                return Ok(0);
            }
            // Healing actions (what `trace list` counts) are marked with `*`.
            for e in events {
                let mark = if is_action(&e.kind) { '*' } else { ' ' };
                println!("{}  {mark} {:<17} {}", local_time(e.t_ms), e.kind, e.detail);
            }
            Ok(0)
        }
    }
}
