//! The core's conformance table of the seeds' tool-health rules (`selfheal_core::conformance`)
//! run through the benchmark's episode: the same rows every front-end runs through its own
//! adapter, here as the `self-healing` strategy meets them.
//!
//! The adapter builds the row's world as a task file (each tool on offer answers `{"text": …}`
//! as its declared output, so an error body breaches its contract), and plays each line as the
//! strategy plays one attempt: the tool's response read by the benchmark's client
//! ([`read_for_run`]), reported to the episode's run ([`Healer::decide`]) with the options
//! the strategy offers for a call of a tool with no equivalent source, and then the run asked
//! what the model writes next with ([`Healer::next_turn`]: the guidance, the tools no longer
//! offered, or the stop). A stop after either is the stop the strategy carries out.
//!
//! The rows need the tools on offer told to the run; the strategy itself does not tell them yet
//! (told them, routed failures raised its silent failures: the value a later attempt brings is
//! claimed without the verification a recovered value gets), so this checks the benchmark's
//! reading and its run, not yet the strategy's whole episode.
//!
//! The benchmark's agent has a fallback model, another rung of most ladders; the table's
//! ladders are those of a front-end with none, so the rows are played as the fallback model
//! writes (no further escalation), the way an episode's calls go once it escalated.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use serde_json::{Value, json};

use selfheal_bench::Healer;
use selfheal_bench::Response;
use selfheal_bench::{Plan, load_jsonl};
use selfheal_bench::{read_for_run, self_healing_budget};
use selfheal_core::{
    Amounts, CallOutcome, ControllerConfig, GuidanceKind, Observation, Options, Policy, StepAction,
    ToolCall,
    conformance::{self, Outcome, Row, Seen},
};

/// The row's world: every tool on offer takes `q` and answers `text`; the plan calls the first.
fn plan_of(row: &Row) -> Plan {
    let tools: Vec<Value> = row
        .offered
        .iter()
        .map(|t| {
            json!({"name": t, "output": {"text": "string"},
                   "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}})
        })
        .collect();
    let line = json!({"id": "conformance", "prompt": "query 0", "tools": tools,
        "plan": [{"tool": row.offered[0], "args": {"q": "query 0"}, "label": "var1"}],
        "answer": "$var1.text$"});
    load_jsonl(&line.to_string()).unwrap().remove(0).plan
}

/// What the tool sent back for an outcome, as the episode hands it to a client.
fn response(outcome: Outcome) -> Response {
    match (outcome.value(), outcome.error()) {
        (_, Some(error)) => Response::Raised {
            message: error.to_owned(),
            status: None,
            retry_after_ms: None,
            timeout: false,
        },
        (Some(v), None) => Response::Returned {
            body: v.to_string(),
        },
        (None, None) => unreachable!("every outcome answers or raises"),
    }
}

/// The options the strategy offers for a failed call of a tool with no equivalent source,
/// written by the fallback model, before any step has a value.
fn options() -> Options {
    Options {
        repair: None,
        substitute: None,
        refreshable: false,
        can_replan: true,
        fallback_model: None,
        human_available: false,
        retry_safe: true,
        partial_result: false,
        max_delay_ms: None,
    }
}

/// The run as `run_self_healing` builds it for a plan of `n` steps at budget 5.
fn healer(row: &Row, n: usize) -> Healer {
    let config = ControllerConfig {
        policy: Policy {
            max_actions_per_failure: Some(5),
            ..Policy::default()
        },
        budget: self_healing_budget(n, 5),
        ..ControllerConfig::default()
    };
    let offered: Vec<&str> = row.offered.iter().map(String::as_str).collect();
    Healer::new(config, &offered, 7).unwrap()
}

/// What the model is shown when it writes its next call.
fn shown(h: &Healer) -> Seen {
    let told: Vec<&str> = h
        .guidance()
        .iter()
        .filter(|g| matches!(g.kind, GuidanceKind::Warning | GuidanceKind::CircuitOpen))
        .map(|g| g.text.as_str())
        .collect();
    Seen::Going {
        warned: h
            .guidance()
            .iter()
            .filter(|g| g.kind == GuidanceKind::Warning)
            .filter_map(|g| g.tool.clone())
            .collect(),
        hidden: h.hidden_tools().to_vec(),
        told: told.join("\n"),
    }
}

fn play(row: &Row) -> Result<(), String> {
    let plan = plan_of(row);
    let mut h = healer(row, row.script.len());
    let mut seen = Vec::new();
    for (i, line) in row.script.iter().enumerate() {
        let now = i as u64 * 1_000;
        assert!(
            !h.hidden(&line.tool),
            "{}: the table calls a hidden tool",
            row.name
        );
        let args = conformance::args(i);
        let read = read_for_run(&plan, &line.tool, response(line.result), now);
        let value = line.result.value();
        let outcome = match (&value, line.result.error()) {
            (Some(v), _) => CallOutcome::Returned(v),
            (None, Some(error)) => CallOutcome::Failed { error },
            (None, None) => unreachable!("every outcome answers or raises"),
        };
        assert_eq!(
            read.is_ok(),
            line.result == Outcome::Answered,
            "{}: line {i} read as {read:?}",
            row.name
        );
        let signal = read.err().flatten();
        let step = row.offered.iter().position(|t| *t == line.tool).unwrap() as u32;
        let d = h.decide(
            Observation::ToolFinished {
                step: Some(step),
                call: ToolCall {
                    tool: &line.tool,
                    args: &args,
                    outcome,
                    required: &[],
                    repaired: false,
                },
                signal,
                options: options(),
                usage: Amounts::default(),
            },
            now,
        );
        if matches!(d, StepAction::Stop { .. }) {
            seen.push(Seen::Stopped);
            break;
        }
        // Whatever it carries out (a retry, a re-plan), the model writes the next call.
        match h.next_turn(now) {
            StepAction::Stop { .. } => {
                seen.push(Seen::Stopped);
                break;
            }
            StepAction::Proceed { .. } => seen.push(shown(&h)),
            StepAction::Recover { .. } => panic!("{}: a next turn asks for a recovery", row.name),
        }
    }
    let finished = h.finish(99_000).status;
    conformance::judge(row, &seen, finished)
}

#[test]
fn the_seeds_monitor_rules_hold_through_the_benchmarks_episode() {
    let rows = conformance::table().unwrap();
    assert!(rows.len() >= 5);
    let failed: Vec<String> = rows.iter().filter_map(|r| play(r).err()).collect();
    assert!(failed.is_empty(), "the benchmark:\n{}", failed.join("\n"));
}
