//! The cross-check reads the second source with the call the model made, never the plan's.
//!
//! The plan's arguments are the task's solution. A client that cross-checked with them would
//! check a wrong-argument call against the right answer: it would reject every wrong argument the
//! tool accepted — a catch no client can make, since a second read of the same (wrong) call
//! agrees with the first. (A test of its own: the oracle scan forbids naming the fault model in
//! strategies.rs.)
#![allow(clippy::unwrap_used)]

mod common;

use selfheal_bench::Episode;
use selfheal_bench::Strategy;
use selfheal_bench::load_jsonl;
use serde_json::Value;

/// One external tool with no equivalent source (as every NESTFUL tool), whose argument is free
/// text: a wrong copy of it ("J.K. Rowlings") is not judged by the grounding check, so the call
/// with the wrong value reaches the tool and its result is cross-checked by a second read.
const TASK: &str = r#"{"id": "xcheck", "query": "Find quotes by J.K. Rowling.", "tools": [{"name": "search_quotes", "description": "Searches quotes by keyword.", "parameters": {"type": "object", "properties": {"keyword": {"type": "string"}}, "required": ["keyword"]}, "output": {"quoteText": "string"}, "external": true}], "plan": [{"tool": "search_quotes", "args": {"keyword": "J.K. Rowling"}, "label": "var1"}], "answer": "$var1.quoteText$"}"#;

fn episode_with_wrong_value(strategy: Strategy) -> (Option<Value>, u64, u64, Option<String>) {
    let task = &load_jsonl(TASK).unwrap()[0];
    // The model copies the argument wrong, for good.
    let (model, fault) = common::permanent("wrong_value_args", 0);
    let faults = [fault];
    let mut ep = Episode::new(task, &faults, &model, 3);
    let ended = strategy.run(&mut ep, 3, None, 3, true);
    let costs = ep.costs();
    (
        ended.answer,
        costs.tool_calls,
        costs.verifier_calls,
        ended.trace,
    )
}

#[test]
fn a_cross_check_after_a_wrong_argument_reads_with_the_models_arguments() {
    let task = &load_jsonl(TASK).unwrap()[0];
    // The answer of the right call, which a client reading with the plan's arguments would get.
    let right = task.expected.clone();
    for strategy in [Strategy::ReactVerify, Strategy::FullReplanVerify] {
        let (answer, tool_calls, verifier_calls, _) = episode_with_wrong_value(strategy);
        // One call, one second read of the same call: the two agree, and the (wrong) value is
        // answered. Read with the plan's arguments, the second read disagreed with the first on
        // every attempt and the episode ended without an answer.
        assert_eq!(
            (tool_calls, verifier_calls),
            (1, 1),
            "{}: the second read disagreed with the call it re-read",
            strategy.as_str()
        );
        let answer = answer.unwrap_or_else(|| panic!("{}: no answer", strategy.as_str()));
        assert_ne!(
            answer,
            right,
            "{}: the wrong argument's answer is the right one",
            strategy.as_str()
        );
    }
}

#[test]
fn self_healing_re_reads_with_the_models_arguments() {
    let (answer, _, verifier_calls, trace) = episode_with_wrong_value(Strategy::SelfHealing);
    let trace = trace.unwrap();
    let events: Vec<Value> = trace
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .collect();
    // No verifier rejected the value: a second read of the model's own call agrees with it.
    let rejected: Vec<&Value> = events
        .iter()
        .filter(|e| e.to_string().contains("reject") || e.to_string().contains("contradiction"))
        .collect();
    assert!(rejected.is_empty(), "{rejected:?}\n{trace}");
    assert!(verifier_calls >= 1);
    assert!(answer.is_some());
}
