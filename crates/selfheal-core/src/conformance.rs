//! The conformance table of the seeds' tool-health rules, for the tests of every front-end.
//!
//! Why this module exists: parity between the front-ends (the core's [`crate::run::Run`], the
//! runtime's agent, the gateway's wire run, the MCP proxy, the benchmark's episode) is a test,
//! not a comment, and the test must be one table read one way. The table is data
//! (`tests/conformance/tool_health.json`, compiled in); this module reads it and judges what a
//! front-end's adapter saw against it. Each adapter only translates: it plays the row's tool
//! results through its front-end and reports, for each result, what the model or client could
//! see next ([`Seen`]), then the status the run finished with.
//!
//! It is behind the `conformance` feature, which only test builds enable (as a
//! dev-dependency), so the core's public API and its sans-IO build are unchanged.
//!
//! ```
//! use selfheal_core::conformance::{self, Seen};
//! let rows = conformance::table().unwrap();
//! let row = &rows[0];
//! // An adapter that saw nothing at all fails every row with a line of what it missed.
//! let seen: Vec<Seen> = row.script.iter().map(|_| Seen::Unseen).collect();
//! assert!(conformance::judge(row, &seen, row.finished).is_err());
//! ```

use serde::Deserialize;
use serde_json::{Value, json};

use crate::trace::RunStatus;

/// The table, as written in `tests/conformance/tool_health.json`.
pub const TABLE_JSON: &str = include_str!("../tests/conformance/tool_health.json");

/// The error text of a tool that fails (raised or in an error body).
pub const ERROR_TEXT: &str = "search backend down";

/// The error text of a tool called with a path that does not exist: the model's own mistake.
pub const MISSING_FILE_TEXT: &str = "ENOENT: no such file or directory, open '/data/missing.txt'";

/// What a tool returned for one line of a row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// A useful answer ([`Outcome::value`]).
    Answered,
    /// It raised with [`ERROR_TEXT`] (a hard failure of the tool).
    Raised,
    /// It answered `{"error": ERROR_TEXT}` (a soft failure), as the issue's stuck agent.
    ErrorBody,
    /// It raised with [`MISSING_FILE_TEXT`]: the arguments name a file that does not exist
    /// (the model's mistake, not the tool's).
    MissingFile,
}

impl Outcome {
    /// The value the tool answered, when it answered (an error body is an answer).
    pub fn value(self) -> Option<Value> {
        match self {
            Outcome::Answered => Some(json!({"text": "the page"})),
            Outcome::ErrorBody => Some(json!({"error": ERROR_TEXT})),
            Outcome::Raised | Outcome::MissingFile => None,
        }
    }

    /// The error the tool raised, when it raised.
    pub fn error(self) -> Option<&'static str> {
        match self {
            Outcome::Raised => Some(ERROR_TEXT),
            Outcome::MissingFile => Some(MISSING_FILE_TEXT),
            Outcome::Answered | Outcome::ErrorBody => None,
        }
    }
}

/// The arguments of the `i`-th call of a row: a different query each time (no call repeats
/// another, so the monitor's duplicate rule never fires).
pub fn args(i: usize) -> Value {
    json!({"q": format!("query {i}")})
}

/// One tool result and what the run must decide after it.
#[derive(Debug, Clone, Deserialize)]
pub struct Line {
    /// The tool called.
    pub tool: String,
    /// What it returned.
    pub result: Outcome,
    /// Whether the run stops here.
    #[serde(default)]
    pub stop: bool,
    /// The tools with a warning (3 or 4 failures in a row), in the order offered.
    #[serde(default)]
    pub warned: Vec<String>,
    /// The tools hidden (the circuit opened at 5).
    #[serde(default)]
    pub hidden: Vec<String>,
    /// Tool names the guidance must give as alternatives.
    #[serde(default)]
    pub names: Vec<String>,
}

/// One scenario: the tools on offer, the results one by one, the status at the end.
#[derive(Debug, Clone, Deserialize)]
pub struct Row {
    /// What the row shows.
    pub name: String,
    /// The tools on offer, in order.
    pub offered: Vec<String>,
    /// The results, one by one.
    pub script: Vec<Line>,
    /// The run's status when it finishes after the script (or where it stopped).
    pub finished: RunStatus,
}

#[derive(Deserialize)]
struct Table {
    rows: Vec<Row>,
}

/// The rows of the table.
pub fn table() -> Result<Vec<Row>, serde_json::Error> {
    serde_json::from_str::<Table>(TABLE_JSON).map(|t| t.rows)
}

/// What a front-end showed after one result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Seen {
    /// The result never reached the model or client: the front-end sent the call again (a
    /// retry the run asked for), and the next line, of the same tool, is its answer.
    Unseen,
    /// The run stopped.
    Stopped,
    /// The model or client goes on.
    Going {
        /// The tools it was warned about ([`warned_in`]).
        warned: Vec<String>,
        /// The tools it is no longer offered.
        hidden: Vec<String>,
        /// Everything it was told (guidance and result texts), where alternatives are named.
        told: String,
    },
}

/// The tools of `offered` that `text` carries the monitor's warning for ("The tool `x` has
/// failed N times in a row"), in the order offered.
pub fn warned_in(text: &str, offered: &[String]) -> Vec<String> {
    offered
        .iter()
        .filter(|t| text.contains(&format!("The tool `{t}` has failed")))
        .cloned()
        .collect()
}

/// Judges what an adapter saw over `row` — one [`Seen`] per line (fewer only when it stopped
/// at the last one seen) — and the status its run finished with. `Err` says the first
/// disagreement.
pub fn judge(row: &Row, seen: &[Seen], finished: RunStatus) -> Result<(), String> {
    let stops_at = row.script.iter().position(|l| l.stop);
    let expected = stops_at.map_or(row.script.len(), |i| i + 1);
    if seen.len() != expected {
        return Err(format!(
            "{}: {} result(s) seen, the table has {expected}: {seen:?}",
            row.name,
            seen.len()
        ));
    }
    for (i, (line, s)) in row.script.iter().zip(seen).enumerate() {
        let at = |what: &str| format!("{} — result {}: {what}: {s:?}", row.name, i + 1);
        match s {
            Seen::Unseen if line.stop => return Err(at("the stop never reached the client")),
            // Only a resend is unseen: the next line answers the same call.
            Seen::Unseen if row.script.get(i + 1).is_none_or(|n| n.tool != line.tool) => {
                return Err(at(
                    "unseen, and the next result is not a resend of this call",
                ));
            }
            Seen::Unseen => {}
            Seen::Stopped if !line.stop => return Err(at("stopped")),
            Seen::Stopped => {}
            Seen::Going { .. } if line.stop => return Err(at("did not stop")),
            Seen::Going {
                warned,
                hidden,
                told,
            } => {
                if *warned != line.warned {
                    return Err(at(&format!("warned {:?}, table {:?}", warned, line.warned)));
                }
                if *hidden != line.hidden {
                    return Err(at(&format!("hidden {:?}, table {:?}", hidden, line.hidden)));
                }
                if !line.warned.is_empty() || !line.hidden.is_empty() {
                    for name in &line.names {
                        if !told.contains(&format!("`{name}`")) {
                            return Err(at(&format!("`{name}` not named")));
                        }
                    }
                }
            }
        }
    }
    if finished != row.finished {
        return Err(format!(
            "{}: finished {finished:?}, table {:?}",
            row.name, row.finished
        ));
    }
    Ok(())
}
