//! `selfheal trace`: read back the decisions the gateway and the MCP proxy recorded in their
//! SQLite trace, and replay them (or a `bench --trace` file) under another policy.

use std::path::PathBuf;

use clap::{Args, Subcommand};

use selfheal_trace::TraceReader;
use selfheal_trace::{StoreError, is_action};

/// Where the trace is.
#[derive(Args, Debug)]
pub(crate) struct TraceDb {
    /// The trace database (default: `$XDG_DATA_HOME/selfheal/trace.db`).
    #[arg(long)]
    pub trace_db: Option<PathBuf>,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// Subcommands of `selfheal trace`.
#[derive(Subcommand, Debug)]
pub(crate) enum TraceCommand {
    /// List recorded runs, most recent first.
    #[command(after_help = "\
EXAMPLES
  selfheal trace list                          runs of the gateway and the MCP proxy
  selfheal trace list --limit 10 --json        the ten newest, as JSON
  selfheal trace list --trace-db /var/lib/selfheal/trace.db")]
    List {
        /// Where and how.
        #[command(flatten)]
        db: TraceDb,
        /// Most runs shown.
        #[arg(long, default_value_t = 50)]
        limit: usize,
    },
    /// Show every recorded event of one run.
    #[command(after_help = "\
EXAMPLES
  selfheal trace show RUN            RUN from `trace list` or the x-selfheal-run header
  selfheal trace show RUN --json     every event with its full detail")]
    Show {
        /// The run id (from `trace list` or the `x-selfheal-run` header).
        run: String,
        /// Where and how.
        #[command(flatten)]
        db: TraceDb,
    },
    /// Make a run's recorded recovery decisions again under a policy and show where they
    /// differ: check a policy change against real traffic before shipping it.
    ///
    /// Each decision is made again from what it was made from (the signal, the failure streak,
    /// the ladder position, what was possible, the budget). After the first difference the
    /// recorded run went on its own way, so later rows say what the policy would do at that
    /// point of the real run (marked `~`), not what the run would have become.
    #[command(after_help = "\
EXAMPLES
  selfheal trace replay RUN --policy fallback-first.toml     a gateway or MCP run
  selfheal trace replay --jsonl bench.jsonl --policy my.toml every episode of `bench --trace`

Exit status: 0 when no decision differs, 3 when some do, 1 when there is nothing to replay.")]
    Replay {
        /// The run id (from `trace list`); with `--jsonl`, only episodes whose
        /// `strategy:budget:seed:task` equals it (default: every episode in the file).
        run: Option<String>,
        /// The policy to replay under (default: the built-in default policy).
        #[arg(long, value_name = "FILE")]
        policy: Option<PathBuf>,
        /// Read a JSON Lines trace (`selfheal bench --trace FILE`) instead of the database.
        #[arg(long, value_name = "FILE")]
        jsonl: Option<PathBuf>,
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
        .unwrap_or_else(selfheal_trace::default_path);
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
pub(crate) fn local_time(unix_ms: i64) -> String {
    match jiff::Timestamp::from_millisecond(unix_ms) {
        Ok(t) => t
            .to_zoned_datetime(jiff::tz::TimeZone::system())
            .strftime("%Y-%m-%dT%H:%M:%S%.3f%:z")
            .to_string(),
        Err(_) => unix_ms.to_string(),
    }
}

/// The decisions of `bench --trace` lines: `(episode, events)` per episode, in file order.
fn jsonl_episodes(
    path: &std::path::Path,
) -> anyhow::Result<Vec<(String, Vec<selfheal_core::TraceEvent>)>> {
    use anyhow::Context as _;
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("--jsonl: cannot read {}", path.display()))?;
    let mut out: Vec<(String, Vec<selfheal_core::TraceEvent>)> = Vec::new();
    for (n, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let v: serde_json::Value = serde_json::from_str(line)
            .with_context(|| format!("{}:{}: not JSON", path.display(), n + 1))?;
        // Summary lines and events of other kinds are not decisions.
        if v.get("event").and_then(serde_json::Value::as_str) != Some("action") {
            continue;
        }
        let episode = format!(
            "{}:{}:{}:{}",
            v["strategy"].as_str().unwrap_or("-"),
            v["budget"],
            v["seed"],
            v["task"]
        );
        let event: selfheal_core::TraceEvent = serde_json::from_value(v)
            .with_context(|| format!("{}:{}: not a trace event", path.display(), n + 1))?;
        match out.last_mut() {
            Some((e, events)) if *e == episode => events.push(event),
            _ => out.push((episode, vec![event])),
        }
    }
    Ok(out)
}

/// Runs `selfheal trace replay`.
fn replay(
    run: Option<String>,
    policy: Option<PathBuf>,
    jsonl: Option<PathBuf>,
    db: TraceDb,
) -> anyhow::Result<u8> {
    let policy = match &policy {
        Some(path) => super::read_policy(path)?,
        None => selfheal_core::Policy::default(),
    };
    let plane = selfheal_core::Plane::new(policy, Default::default())
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let runs: Vec<(String, Vec<selfheal_core::TraceEvent>)> = match (&jsonl, &run) {
        (Some(path), filter) => jsonl_episodes(path)?
            .into_iter()
            .filter(|(e, _)| filter.as_ref().is_none_or(|f| f == e))
            .collect(),
        (None, Some(run)) => {
            let rows = match open(&db)? {
                Some(reader) => reader.events(run)?,
                None => Vec::new(),
            };
            // The gateway stores the core's event as the row's detail; the MCP proxy wraps
            // every decision as `{"tool", "detail"}`.
            let events = rows
                .into_iter()
                .filter(|r| r.kind == "action" || r.kind == "routed_around")
                .filter_map(|r| {
                    let detail = match r.detail.get("detail") {
                        Some(inner) if inner.get("event").is_some() => inner.clone(),
                        _ => r.detail,
                    };
                    serde_json::from_value(detail).ok()
                })
                .collect();
            vec![(run.clone(), events)]
        }
        (None, None) => {
            anyhow::bail!("name a RUN (see `selfheal trace list`) or pass --jsonl FILE")
        }
    };
    let results: Vec<(String, Vec<selfheal_core::Comparison>)> = runs
        .iter()
        .map(|(name, events)| (name.clone(), selfheal_core::replay(events, &plane)))
        .filter(|(_, c)| !c.is_empty())
        .collect();
    let decisions: usize = results.iter().map(|(_, c)| c.len()).sum();
    let differing: usize = results
        .iter()
        .map(|(_, c)| c.iter().filter(|x| x.differs).count())
        .sum();
    if db.json {
        let body: Vec<serde_json::Value> = results
            .iter()
            .map(|(run, c)| serde_json::json!({"run": run, "decisions": c}))
            .collect();
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({
                "decisions": decisions, "differing": differing, "runs": body
            }))?
        );
    } else {
        for (run, comparisons) in &results {
            println!("run {run}");
            println!(
                "  {:>3}  {:<17} {:<24} {:<24}",
                "#", "signal", "recorded", "replayed"
            );
            for c in comparisons {
                let mark = match (c.differs, c.after_difference) {
                    (true, false) => "<- differs",
                    (true, true) => "<- differs ~",
                    (false, true) => "~",
                    (false, false) => "",
                };
                println!(
                    "  {:>3}  {:<17} {:<24} {:<24} {mark}",
                    c.index,
                    c.signal,
                    if c.routed_around {
                        format!("routed around ({})", c.recorded_class)
                    } else {
                        format!("{} ({})", c.recorded.kind(), c.recorded_class)
                    },
                    format!("{} ({})", c.replayed.kind(), c.replayed_class),
                );
            }
        }
        println!(
            "{decisions} decision(s) in {} run(s) replayed; {differing} differ.",
            results.len()
        );
    }
    if decisions == 0 {
        eprintln!(
            "nothing to replay: no recorded decision carries its input (traces written before \
             replay existed, or a run that never had to recover)"
        );
        return Ok(1);
    }
    Ok(if differing > 0 { 3 } else { 0 })
}

/// Runs `selfheal trace`; returns the process exit code.
pub(crate) fn run(command: TraceCommand) -> anyhow::Result<u8> {
    match command {
        TraceCommand::Replay {
            run,
            policy,
            jsonl,
            db,
        } => replay(run, policy, jsonl, db),
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
