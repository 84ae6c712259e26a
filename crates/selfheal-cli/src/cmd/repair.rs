//! `selfheal repair`: repair almost-JSON from stdin, optionally against a JSON Schema.
//!
//! A thin shell over `selfheal_repair` so the repair can be tried on real model output and
//! used in scripts: the exit code says whether the result can be trusted.
//!
//! Exit codes: 0 valid (and schema-valid when `--schema` is given); 1 unrepairable or still
//! violating the schema, with the reason on stderr; 2 usage errors (bad flags, unreadable
//! or invalid schema file).

use std::io::{Read, Write};
use std::path::PathBuf;

use clap::Args;
use selfheal_repair::{SchemaGuide, repair};
use serde_json::json;

/// Exit code: the output is valid.
const EXIT_OK: u8 = 0;
/// Exit code: the input cannot be repaired or still violates the schema.
const EXIT_INVALID: u8 = 1;
/// Exit code: usage error.
const EXIT_USAGE: u8 = 2;

/// Arguments of `selfheal repair`.
#[derive(Args, Debug)]
pub struct RepairArgs {
    /// JSON Schema (draft 2020-12 or 7) to coerce and validate the repaired value against.
    #[arg(long, value_name = "FILE")]
    pub schema: Option<PathBuf>,
    /// Write the repairs (and coercions) applied to stderr, as one line of JSON.
    #[arg(long)]
    pub report: bool,
    /// Tool name used in the re-ask message printed when the schema is violated.
    #[arg(long, value_name = "NAME", default_value = "the tool")]
    pub tool: String,
}

/// Runs `selfheal repair`; returns the process exit code.
pub fn run(args: RepairArgs) -> anyhow::Result<u8> {
    let guide = match &args.schema {
        None => None,
        Some(path) => match load_schema(path) {
            Ok(g) => Some(g),
            Err(msg) => {
                eprintln!("error: {msg}");
                return Ok(EXIT_USAGE);
            }
        },
    };
    let mut bytes = Vec::new();
    std::io::stdin().read_to_end(&mut bytes)?;
    let Ok(input) = String::from_utf8(bytes) else {
        eprintln!("error: input is not valid UTF-8");
        return Ok(EXIT_INVALID);
    };
    let repaired = match repair(&input) {
        Ok(r) => r,
        Err(e) => {
            if args.report {
                eprintln!("{}", json!({"repairs": [], "error": e.to_string()}));
            }
            eprintln!("error: {e}");
            return Ok(EXIT_INVALID);
        }
    };
    let (value, coercions, violations) = match &guide {
        Some(g) => {
            let o = g.apply(repaired.value);
            (o.value, o.coercions, o.violations)
        }
        None => (repaired.value, Vec::new(), Vec::new()),
    };
    let mut out = std::io::stdout().lock();
    serde_json::to_writer(&mut out, &value)?;
    writeln!(out)?;
    out.flush()?;
    if args.report {
        eprintln!(
            "{}",
            json!({"repairs": repaired.repairs, "coercions": coercions, "violations": violations})
        );
    }
    if violations.is_empty() {
        return Ok(EXIT_OK);
    }
    eprintln!("error: {} schema violation(s)", violations.len());
    eprintln!(
        "{}",
        selfheal_repair::reask_message(&violations, &args.tool)
    );
    Ok(EXIT_INVALID)
}

fn load_schema(path: &PathBuf) -> Result<SchemaGuide, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read schema {}: {e}", path.display()))?;
    let schema: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| format!("schema {} is not JSON: {e}", path.display()))?;
    SchemaGuide::new(&schema).map_err(|e| format!("schema {}: {e}", path.display()))
}
