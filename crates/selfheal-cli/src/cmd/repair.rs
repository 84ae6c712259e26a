//! `selfheal repair`: repair almost-JSON from stdin, optionally against a JSON Schema.
//!
//! A thin shell over `selfheal_repair` so the repair can be tried on real model output and
//! used in scripts: the exit code says whether the result can be trusted.
//!
//! Output: valid input is printed byte for byte as it was written (only the blanks around it
//! trimmed), unless `--canonical` asks for compact JSON with sorted keys; a repaired value is
//! printed compact, each number as the input wrote it.
//!
//! Exit codes:
//! - 0: a value was returned, and nothing in it was invented or lost (valid input comes back
//!   unchanged; `--report` lists every repair with its byte offset). With `--salvage` data may
//!   have been dropped, and the report says `"salvaged": true`.
//! - 1: refused — the input was cut off, a value is missing, several values follow each
//!   other, a number has leading zeros, or the value still violates the schema. The reason
//!   and byte offset go to stderr, followed by the re-ask text for the model.
//! - 2: usage errors (bad flags, unreadable or invalid schema file, input over `--max-bytes`).

use std::io::{Read, Write};
use std::path::PathBuf;

use clap::Args;
use selfheal_repair::{RepairKind, RepairOptions, SchemaGuide, repair_with};
use serde_json::json;

/// Exit code: the output is valid.
const EXIT_OK: u8 = 0;
/// Exit code: the input cannot be repaired or still violates the schema.
const EXIT_INVALID: u8 = 1;
/// Exit code: usage error.
const EXIT_USAGE: u8 = 2;

/// Arguments of `selfheal repair`.
#[derive(Args, Debug)]
#[command(after_help = "\
EXAMPLES
  echo '{\"a\": 1, \"b\": [1, 2,] // note' | selfheal repair --report
                                  repaired JSON on stdout, each repair on stderr
  selfheal repair --schema args.schema.json --tool get_weather < model-output.txt
                                  coerced and checked against the tool's schema
  selfheal repair --salvage < truncated.json
                                  keep what is complete of cut-off input (lossy)

Exit status: 0 a value nothing was invented in, 1 refused (reason and re-ask text on stderr),
2 usage error.")]
pub(crate) struct RepairArgs {
    /// JSON Schema (draft 2020-12 or 7) to coerce and validate the repaired value against.
    #[arg(long, value_name = "FILE")]
    pub schema: Option<PathBuf>,
    /// Write the repairs (and coercions) applied to stderr, as one line of JSON.
    #[arg(long)]
    pub report: bool,
    /// Tool name used in the re-ask message printed on a refusal.
    #[arg(long, value_name = "NAME", default_value = "the tool")]
    pub tool: String,
    /// With --schema: fill missing properties with their declared defaults (only defaults
    /// that fit their own schema). Off by default: the tool applies its own defaults.
    #[arg(long, requires = "schema")]
    pub fill_defaults: bool,
    /// With --schema: remove properties `additionalProperties: false` forbids instead of
    /// refusing them.
    #[arg(long, requires = "schema")]
    pub drop_unknown: bool,
    /// Lossy mode: close truncated input and drop its unfinished part instead of refusing
    /// (exit 0, reported as salvaged). Never use it for tool arguments.
    #[arg(long)]
    pub salvage: bool,
    /// Collect several top-level values (NDJSON, `{..}{..}`) into an array instead of
    /// refusing.
    #[arg(long)]
    pub multiple: bool,
    /// The input is the model's whole answer (it finished on its own, `finish_reason:
    /// "stop"`): a number where unclosed input ends is complete (`{"days": 3` lacks only its
    /// brace). Without it such a number is refused, unless a space or tab follows it:
    /// `{"year": 20` may have been 2018.
    #[arg(long)]
    pub complete: bool,
    /// Print valid input re-formatted as compact JSON with sorted keys, instead of byte for
    /// byte as it was written. Numbers keep their digits either way.
    #[arg(long)]
    pub canonical: bool,
    /// The largest input read, in bytes; larger input is refused with exit code 2 before it
    /// is parsed. Repair needs up to about 4 times the input in memory.
    #[arg(long, value_name = "BYTES", default_value_t = DEFAULT_MAX_BYTES)]
    pub max_bytes: u64,
}

/// Default for `--max-bytes`: 256 MiB.
pub(crate) const DEFAULT_MAX_BYTES: u64 = 256 * 1024 * 1024;

/// Runs `selfheal repair`; returns the process exit code.
pub(crate) fn run(args: RepairArgs) -> anyhow::Result<u8> {
    let guide = match &args.schema {
        None => None,
        Some(path) => match load_schema(path) {
            Ok(g) => Some(
                g.with_fill_defaults(args.fill_defaults)
                    .with_drop_unknown(args.drop_unknown),
            ),
            Err(msg) => {
                eprintln!("error: {msg}");
                return Ok(EXIT_USAGE);
            }
        },
    };
    let mut bytes = Vec::new();
    std::io::stdin()
        .lock()
        .take(args.max_bytes.saturating_add(1))
        .read_to_end(&mut bytes)?;
    if bytes.len() as u64 > args.max_bytes {
        eprintln!(
            "error: the input is larger than --max-bytes {} (raise it to repair larger input)",
            args.max_bytes
        );
        return Ok(EXIT_USAGE);
    }
    let Ok(input) = String::from_utf8(bytes) else {
        eprintln!("error: input is not valid UTF-8");
        return Ok(EXIT_INVALID);
    };
    // A line of bare text (`hello world`) is the string it spells here, where a person or a
    // script asked for a repair; the gateway and the runtime, which expect JSON, refuse it.
    // With a schema, the schema decides whether `0789` may be the string it spells and
    // whether a string holding an object is that object.
    let options = RepairOptions::default()
        .with_salvage(args.salvage)
        .with_multiple(args.multiple)
        .with_input_complete(args.complete)
        .with_bare_text(true)
        .with_leading_zero_strings(guide.is_some())
        .with_decode_strings(guide.as_ref().is_some_and(SchemaGuide::wants_container));
    let repaired = match repair_with(&input, &options) {
        Ok(r) => r,
        Err(e) => {
            if args.report {
                eprintln!(
                    "{}",
                    json!({"repairs": [], "error": e.to_string(), "offset": e.offset(), "truncated": e.is_truncation()})
                );
            }
            eprintln!("error: {e}");
            eprintln!("{}", e.reask_message(&input, &args.tool));
            return Ok(EXIT_INVALID);
        }
    };
    let salvaged = repaired.repairs.iter().any(|r| {
        r.kind == RepairKind::DroppedIncomplete
            || (args.salvage && r.kind == RepairKind::ClosedTruncated)
    });
    let was_repaired = repaired.was_repaired();
    let literals = repaired.literals;
    let unlisted = repaired.unlisted;
    let (value, coercions, violations) = match &guide {
        Some(g) => {
            let o = g.apply(repaired.value);
            (o.value, o.coercions, o.violations)
        }
        None => (repaired.value, Vec::new(), Vec::new()),
    };
    // Buffered: stdout's own line buffering looks for a newline in every small write the
    // serialiser makes, which costs more than the repair on a large document.
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    if !was_repaired && coercions.is_empty() && !args.canonical {
        // Valid input, unchanged by the schema, is the answer as written: byte for byte.
        out.write_all(input.trim_ascii().as_bytes())?;
    } else if literals.is_empty() {
        // Written as it is serialised: no second copy of a large document in memory.
        serde_json::to_writer(&mut out, &value)?;
    } else {
        match literals.render(&value) {
            Ok(text) => out.write_all(text.as_bytes())?,
            Err(e) => {
                eprintln!("error: {e}");
                return Ok(EXIT_INVALID);
            }
        }
    }
    writeln!(out)?;
    out.flush()?;
    if args.report {
        eprintln!(
            "{}",
            json!({"repairs": repaired.repairs, "unlisted": unlisted, "coercions": coercions, "violations": violations, "salvaged": salvaged})
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
