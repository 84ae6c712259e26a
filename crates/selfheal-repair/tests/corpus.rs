//! Issue 14's regression corpus: our own cases, one JSON object a line in
//! `tests/corpus/cases.jsonl` — `input`, then either `expected` (the value `repair` must
//! return) or `"refuse": true` (it must return an error), optionally `options` (the
//! [`RepairOptions`] switched on, e.g. `{"bare_text": true}` as `selfheal repair` sets it),
//! and a `note` saying why.
//!
//! The corpus holds the readings the issue settled (a stray quote proven to be text, a
//! missing brace before an array's next object, escaped JSON) beside the refusals that
//! must hold next to them (cuts, a line break before a closing quote, conventions the
//! reference libraries disagree on), so a change to one shows up against the other.

#![allow(clippy::panic)]

use selfheal_repair::{RepairOptions, repair_with};
use serde_json::Value;

const CASES: &str = include_str!("corpus/cases.jsonl");

#[test]
fn issue_14_corpus_holds() {
    let mut failures = Vec::new();
    let mut n = 0;
    for (line_no, line) in CASES.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        n += 1;
        let case: Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("cases.jsonl line {}: {e}", line_no + 1));
        let input = case["input"].as_str().unwrap_or_default();
        let note = case["note"].as_str().unwrap_or_default();
        let options = RepairOptions::default()
            .with_bare_text(case["options"]["bare_text"].as_bool().unwrap_or(false));
        let got = repair_with(input, &options);
        let refuse = case["refuse"].as_bool().unwrap_or(false);
        match (refuse, got) {
            (true, Err(_)) => {}
            (true, Ok(r)) => failures.push(format!(
                "line {}: {input:?} should be refused ({note}), got {}",
                line_no + 1,
                r.value
            )),
            (false, Ok(r)) if r.value == case["expected"] => {}
            (false, Ok(r)) => failures.push(format!(
                "line {}: {input:?} ({note}): expected {}, got {}",
                line_no + 1,
                case["expected"],
                r.value
            )),
            (false, Err(e)) => failures.push(format!(
                "line {}: {input:?} ({note}) was refused: {e}",
                line_no + 1
            )),
        }
    }
    assert!(n >= 30, "the corpus lost cases: {n}");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
