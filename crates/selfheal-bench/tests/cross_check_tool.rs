//! The cross-check knows its second source by the tool the call went to, never by the step's
//! tool: which tool a step should call is the plan's answer. A client that checked a sibling
//! tool's answer against the step's own source would catch a wrong tool that no client can see
//! (the gateway, which knows only the tools on offer, cannot either). (A test of its own: the
//! oracle scan forbids naming the fault model in strategies.rs.)
#![allow(clippy::unwrap_used)]

mod common;

use selfheal_bench::Episode;
use selfheal_bench::Strategy;
use selfheal_bench::load_jsonl;

/// Two external tools on offer, neither with an equivalent source: the step's `get_rate`, and
/// its sibling `get_rate_v2`, whose values are a little off. A model that calls the sibling
/// gets a plausible, wrong rate; a second read of the sibling agrees with it.
const TASK: &str = r#"{"id": "xtool", "query": "What is the EUR rate?", "tools": [{"name": "get_rate", "description": "Exchange rate of a currency.", "parameters": {"type": "object", "properties": {"currency": {"type": "string"}}, "required": ["currency"]}, "output": {"rate": "number"}, "external": true, "sibling": "get_rate_v2"}, {"name": "get_rate_v2", "description": "Exchange rate of a currency (v2).", "parameters": {"type": "object", "properties": {"currency": {"type": "string"}}, "required": ["currency"]}, "output": {"rate": "number"}, "external": true}], "plan": [{"tool": "get_rate", "args": {"currency": "EUR"}, "label": "var1"}], "answer": "$var1.rate$"}"#;

#[test]
fn a_sibling_tools_answer_is_cross_checked_against_the_sibling_not_the_steps_tool() {
    let task = &load_jsonl(TASK).unwrap()[0];
    let right = task.expected.clone();
    for strategy in [
        Strategy::ReactVerify,
        Strategy::FullReplanVerify,
        Strategy::SelfHealing,
    ] {
        // The model calls the sibling, for good.
        let (model, fault) = common::permanent("wrong_tool_sibling", 0);
        let faults = [fault];
        let mut ep = Episode::new(task, &faults, &model, 5);
        let ended = strategy.run(&mut ep, 3, None, 5, true);
        let costs = ep.costs();
        // One call of the sibling and one second read of it: they agree, and the sibling's
        // value is answered — wrong, and nothing a client can tell. Checked against the step's
        // tool (the plan's answer), the second read disagreed and the episode climbed its
        // ladder instead.
        assert_eq!(
            (costs.tool_calls, costs.verifier_calls),
            (1, 1),
            "{}: the second read was not of the tool called",
            strategy.as_str()
        );
        let answer = ended
            .answer
            .unwrap_or_else(|| panic!("{}: no answer", strategy.as_str()));
        assert_ne!(answer, right, "{}", strategy.as_str());
    }
}
