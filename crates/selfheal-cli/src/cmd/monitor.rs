//! `selfheal monitor`: the tool-health monitor as a JSON Lines sidecar any language can use.

use std::io::{BufRead, Write};
use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use selfheal_core::{CallOutcome, Monitor, MonitorConfig, ToolCall};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Arguments of `selfheal monitor`.
#[derive(Args, Debug)]
#[command(after_help = "\
PROTOCOL
  Input, one JSON object per line on stdin:
    {\"tool\": \"web_search\", \"args\": {...}, \"result\": <any JSON>}     a call that returned
    {\"tool\": \"web_search\", \"args\": {...}, \"error\": \"timeout\"}     a hard failure
    optional: \"required\": [\"query\"] names the required arguments (empty-input rule)
              \"t_ms\": 1234 the call's time in ms (for time-based circuit cooldown)
  Output, one JSON object per input line on stdout (flushed per line):
    {\"call\": 3, \"badge\": \"failed\", \"signals\": [\"consecutive_failures\"],
     \"guidance\": [\"...\"], \"hidden_tools\": [], \"abort\": false, \"reason\": null}
  badges:  ok failed empty empty_input duplicate circuit_broken repaired
  signals: consecutive_failures circuit_open duplicate_call empty_input loop abort
  A line that is not valid input gets {\"line\": N, \"error\": \"...\"} on stdout and the same
  message on stderr; processing continues.

EXAMPLE
  printf '%s\\n' '{\"tool\":\"search\",\"args\":{\"q\":\"\"},\"result\":[],\"required\":[\"q\"]}' \\
                 '{\"tool\":\"search\",\"args\":{\"q\":\"\"},\"result\":[],\"required\":[\"q\"]}' \\
    | selfheal monitor
")]
pub(crate) struct MonitorArgs {
    /// TOML file overriding thresholds (warn_after, circuit_after, abort_failure_rate, mode, ...).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Interactive mode: guidance only, never hide a tool or abort.
    #[arg(long)]
    pub interactive: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct InputLine {
    tool: String,
    #[serde(default)]
    args: Value,
    /// Any JSON, `null` included: `Some(Value::Null)` is a call that returned null, `None` a line
    /// without the key.
    #[serde(default, deserialize_with = "present")]
    result: Option<Value>,
    error: Option<String>,
    #[serde(default)]
    required: Vec<String>,
    t_ms: Option<u64>,
}

/// A key that is present, whatever its value: serde maps a `null` to `None` for an
/// `Option<Value>`, which would make `"result": null` look like a missing result.
fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Value>, D::Error> {
    Value::deserialize(d).map(Some)
}

#[derive(Serialize)]
struct OutputLine<'a> {
    call: u64,
    badge: selfheal_core::Badge,
    signals: selfheal_core::SignalSet,
    guidance: Vec<&'a str>,
    hidden_tools: &'a [String],
    abort: bool,
    reason: Option<&'a str>,
}

#[derive(Serialize)]
struct ErrorLine<'a> {
    line: usize,
    error: &'a str,
}

/// Runs `selfheal monitor`; returns the process exit code.
pub(crate) fn run(args: MonitorArgs) -> anyhow::Result<u8> {
    let mut config = match &args.config {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("cannot read config file {}", path.display()))?;
            MonitorConfig::from_toml_str(&text)
                .with_context(|| format!("in config file {}", path.display()))?
        }
        None => MonitorConfig::default(),
    };
    if args.interactive {
        config.mode = selfheal_core::MonitorMode::Interactive;
    }
    let mut monitor = Monitor::new(config)?;
    let stdin = std::io::stdin();
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let mut last_t = 0u64;
    for (i, line) in stdin.lock().lines().enumerate() {
        let n = i + 1;
        let line = line.with_context(|| format!("reading stdin at line {n}"))?;
        if line.trim().is_empty() {
            continue;
        }
        let parsed = serde_json::from_str::<InputLine>(&line)
            .map_err(|e| e.to_string())
            .and_then(|input| match (&input.result, &input.error) {
                (Some(_), Some(_)) => Err("give either \"result\" or \"error\", not both".into()),
                (None, None) => {
                    Err("missing \"result\" (the call returned) or \"error\" (it failed)".into())
                }
                _ => Ok(input),
            });
        let input = match parsed {
            Ok(input) => input,
            Err(msg) => {
                eprintln!("selfheal monitor: line {n}: {msg}");
                serde_json::to_writer(
                    &mut out,
                    &ErrorLine {
                        line: n,
                        error: &msg,
                    },
                )?;
                out.write_all(b"\n")?;
                out.flush()?;
                continue;
            }
        };
        let now = input.t_ms.unwrap_or(last_t).max(last_t);
        last_t = now;
        let outcome = match (&input.result, &input.error) {
            (_, Some(error)) => CallOutcome::Failed { error },
            (Some(result), None) => CallOutcome::Returned(result),
            (None, None) => continue,
        };
        let call = ToolCall {
            tool: &input.tool,
            args: &input.args,
            outcome,
            required: &input.required,
            repaired: false,
        };
        let report = monitor.record(&call, now);
        let verdict = monitor.check(now);
        let line = OutputLine {
            call: report.call,
            badge: report.badge,
            signals: report.signals,
            guidance: verdict.guidance.iter().map(|g| g.text.as_str()).collect(),
            hidden_tools: &verdict.hidden_tools,
            abort: verdict.abort.is_some(),
            reason: verdict.abort.as_deref(),
        };
        serde_json::to_writer(&mut out, &line)?;
        out.write_all(b"\n")?;
        out.flush()?;
    }
    Ok(0)
}
