//! Issue 33: a value recovered by substituting for a tool whose fields drifted past recognition
//! is checked against that tool's drifted answer, read through the drift, not held in doubt
//! because the field is not there by name (the core's `cross_check_declared`).
#![allow(clippy::unwrap_used)]

mod common;

use selfheal_bench::Episode;
use selfheal_bench::Strategy;
use selfheal_bench::load_jsonl;

/// One external tool with an equivalent source (exact: no noise; not on offer itself), read by
/// the answer.
const TASK: &str = r#"{"id": "drift", "query": "What is the EUR rate?", "tools": [{"name": "get_rate", "description": "Exchange rate of a currency.", "parameters": {"type": "object", "properties": {"currency": {"type": "string"}}, "required": ["currency"]}, "output": {"rate": "number"}, "external": true, "substitute": "get_rate_alt"}], "plan": [{"tool": "get_rate", "args": {"currency": "EUR"}, "label": "var1"}], "answer": "$var1.rate$"}"#;

#[test]
fn a_substitutes_value_is_confirmed_by_the_drifted_primary_read_through_the_drift() {
    let task = &load_jsonl(TASK).unwrap()[0];
    // The primary renames `rate` past recognition (`f..`), for good: its answer cannot be
    // repaired, and the substitute's value can be checked only against it.
    let (model, fault) = common::permanent("schema_drift_opaque", 0);
    let faults = [fault];
    let mut ep = Episode::new(task, &faults, &model, 5);
    let ended = Strategy::SelfHealing.run(&mut ep, 5, None, 5, true);
    let trace = ended.trace.unwrap_or_default();
    assert!(
        trace.contains("\"alternative\":\"get_rate_alt\""),
        "the run substitutes: {trace}"
    );
    // Held in doubt before (the check found no `rate` in the primary's answer and the run
    // ended partial); now the two sources agree on the value under the renamed key.
    assert_eq!(
        ended.answer.as_ref(),
        Some(&task.expected),
        "the substitute's value, confirmed, is answered: {trace}"
    );
}
