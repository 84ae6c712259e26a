//! Issue 11: the in-process client offers the recoveries the gateway can carry out for the same
//! call. (A test of its own: the oracle scan forbids naming the fault model in strategies.rs.)
#![allow(clippy::unwrap_used)]

mod common;

use selfheal_bench::Episode;
use selfheal_bench::Strategy;
use serde_json::Value;

/// Issue 11: a call of a tool not on offer is re-asked, rethought and escalated, never
/// answered with the step's substitute — the called tool has none, and the step's tool is
/// the plan's answer (the gateway, which knows substitutes by the called tool, agrees).
#[test]
fn a_tool_not_on_offer_is_not_substituted() {
    let task = &selfheal_bench::builtin(1)[0];
    assert!(task.plan.step_tool(0).unwrap().substitute.is_some());
    let (model, fault) = common::permanent("wrong_tool_unknown", 0);
    let faults = [fault];
    let mut ep = Episode::new(task, &faults, &model, 7);
    let ended = Strategy::SelfHealing.run(&mut ep, 5, None, 7, true);
    let trace = ended.trace.unwrap();
    let actions: Vec<String> = trace
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|e| e["event"] == "action" && e["class"] == "wrong_tool")
        .map(|e| e["action"]["action"].as_str().unwrap_or("").to_owned())
        .collect();
    assert!(actions.contains(&"escalate".to_owned()), "{actions:?}");
    assert!(!actions.contains(&"substitute".to_owned()), "{actions:?}");
}

/// Issue 32: a call of a sibling tool on offer is decided by the tool called. Here the sibling
/// answers with its own field (`w`) and has no equivalent source, while the step's tool answers
/// with `v` and has one. Judged by the step's tool, the sibling's body would breach the contract
/// (no `v`) and be "recovered" with the step tool's substitute; judged by the tool called, the
/// body is whole, nothing is substituted, and the one check there is — a second read of the
/// sibling — is what runs.
#[test]
fn a_sibling_call_is_decided_by_the_tool_called() {
    let line = r#"{"id": "s", "prompt": "look up x1", "tools": [
        {"name": "a", "parameters": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}, "output": {"v": "number"}, "substitute": "a_alt", "sibling": "b"},
        {"name": "b", "parameters": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}, "output": {"w": "number"}}],
        "plan": [{"tool": "a", "args": {"q": "x1"}, "label": "var1"}], "answer": "$var1.v$"}"#
        .replace('\n', " ");
    let task = &selfheal_bench::load_jsonl(&line).unwrap()[0];
    let (mut model, fault) = common::permanent("wrong_tool_sibling", 0);
    model.model = selfheal_bench::ModelRates::PERFECT;
    let faults = [fault];
    let mut ep = Episode::new(task, &faults, &model, 3);
    let ended = Strategy::SelfHealing.run(&mut ep, 5, None, 3, true);
    let trace = ended.trace.unwrap();
    let events: Vec<Value> = trace
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .collect();
    assert!(
        !events
            .iter()
            .any(|e| e["event"] == "action" && e["action"]["action"] == "substitute"),
        "the step tool's substitute was used for a sibling call: {trace}"
    );
    assert!(
        !events.iter().any(|e| e["event"] == "action"),
        "the sibling's own body was judged against the step tool's contract: {trace}"
    );
    // The sibling's value was read twice (its own second read), never checked against `a_alt`.
    assert_eq!(ep.costs().verifier_calls, 1);
    assert_eq!(ep.costs().tool_calls, 1);
    // The answer reads `v`, which the sibling does not have: no answer, not a wrong one.
    assert_eq!(ended.answer, None);
}
