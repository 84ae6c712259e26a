//! Issue 11: the in-process client offers the recoveries the gateway can carry out for the same
//! call. (A test of its own: the oracle scan forbids naming the fault model in strategies.rs.)
#![allow(clippy::unwrap_used)]

mod common;

use selfheal_bench::exec::Episode;
use selfheal_bench::strategies::Strategy;
use serde_json::Value;

/// Issue 11: a call of a tool not on offer is re-asked, rethought and escalated, never
/// answered with the step's substitute — the called tool has none, and the step's tool is
/// the plan's answer (the gateway, which knows substitutes by the called tool, agrees).
#[test]
fn a_tool_not_on_offer_is_not_substituted() {
    let task = &selfheal_bench::task::builtin(1)[0];
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
