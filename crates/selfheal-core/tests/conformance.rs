//! The conformance table of the seeds' tool-health rules (SPEC §1) as an agent that picks its
//! own tools meets them: scripted tool results in, the run's decisions out.
//!
//! Every front-end (the gateway's wire run, the runtime's agent, the MCP proxy) feeds the
//! controller the same way: [`Controller::offer`] with the tools on offer, then one
//! [`Observation::ToolFinished`] per result, and reads the monitor's verdict before the next
//! model step. The table says what must come out: a warning naming the alternatives at 3
//! failures in a row, the tool hidden at 5 with guidance naming them, and a stop only on the
//! failure-rate rule (> 70 % of ≥ 6 calls) or when nothing else is on offer.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use selfheal_core::budget::{Amounts, BudgetLimits};
use selfheal_core::controller::{Controller, ControllerConfig, Directive, Observation};
use selfheal_core::monitor::{GuidanceKind, ToolCall};
use selfheal_core::policy::Options;
use selfheal_core::rng::SplitMix64;
use selfheal_core::trace::RunStatus;
use serde_json::{Value, json};

/// What a tool returned.
#[derive(Clone, Copy)]
enum Outcome {
    /// A useful answer.
    Answered,
    /// It raised: an error text (a hard failure).
    Raised,
    /// It answered `{"error": ...}` (a soft failure), as in the stuck agent.
    ErrorBody,
}

/// What the run decided after one result, as a front-end reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stop {
    /// The run goes on.
    No,
    /// The run stopped (`Abort` or `Degrade`).
    Yes,
}

/// One row's expectation after one result.
struct Expect {
    /// Whether the run stopped.
    stop: Stop,
    /// The tools with a warning (3 or 4 failures in a row) in the verdict.
    warned: &'static [&'static str],
    /// The tools hidden by the verdict.
    hidden: &'static [&'static str],
    /// Tool names every warning or circuit guidance must name as alternatives.
    names: &'static [&'static str],
}

struct Row {
    name: &'static str,
    offered: &'static [&'static str],
    script: Vec<(&'static str, Outcome, Expect)>,
    /// The run's status when it finishes (after the script).
    finished: RunStatus,
}

const fn go(
    warned: &'static [&'static str],
    hidden: &'static [&'static str],
    names: &'static [&'static str],
) -> Expect {
    Expect {
        stop: Stop::No,
        warned,
        hidden,
        names,
    }
}

const STOP: Expect = Expect {
    stop: Stop::Yes,
    warned: &[],
    hidden: &[],
    names: &[],
};

/// What a front-end on the wire can offer: no substitute or fallback configured, a re-plan is
/// a line of guidance, nothing useful produced yet.
fn wire_options() -> Options {
    Options {
        repair: None,
        substitute: None,
        refreshable: false,
        can_replan: true,
        fallback_model: None,
        human_available: false,
        retry_safe: true,
        partial_result: false,
    }
}

fn table() -> Vec<Row> {
    use Outcome::*;
    let none: &[&str] = &[];
    vec![
        Row {
            name: "issue 30: web_search answers an error body every time, fetch_url on offer",
            offered: &["web_search", "fetch_url"],
            script: vec![
                ("web_search", ErrorBody, go(none, none, none)),
                ("web_search", ErrorBody, go(none, none, none)),
                (
                    "web_search",
                    ErrorBody,
                    go(&["web_search"], none, &["fetch_url"]),
                ),
                (
                    "web_search",
                    ErrorBody,
                    go(&["web_search"], none, &["fetch_url"]),
                ),
                (
                    "web_search",
                    ErrorBody,
                    go(none, &["web_search"], &["fetch_url"]),
                ),
                (
                    "fetch_url",
                    Answered,
                    go(none, &["web_search"], &["fetch_url"]),
                ),
            ],
            finished: RunStatus::Complete,
        },
        Row {
            name: "the same with a tool that raises, and two alternatives",
            offered: &["web_search", "fetch_url", "read_file"],
            script: vec![
                ("web_search", Raised, go(none, none, none)),
                ("web_search", Raised, go(none, none, none)),
                (
                    "web_search",
                    Raised,
                    go(&["web_search"], none, &["fetch_url", "read_file"]),
                ),
                (
                    "web_search",
                    Raised,
                    go(&["web_search"], none, &["fetch_url", "read_file"]),
                ),
                (
                    "web_search",
                    Raised,
                    go(none, &["web_search"], &["fetch_url", "read_file"]),
                ),
                ("read_file", Answered, go(none, &["web_search"], none)),
            ],
            finished: RunStatus::Complete,
        },
        Row {
            name: "nothing else on offer: the ladder's end stands and the run stops",
            offered: &["web_search"],
            script: vec![
                ("web_search", ErrorBody, go(none, none, none)),
                ("web_search", ErrorBody, go(none, none, none)),
                ("web_search", ErrorBody, STOP),
            ],
            finished: RunStatus::Failed,
        },
        Row {
            name: "failure rate: six failures in six calls over two tools stop the run at the 6th",
            offered: &["a", "b", "c"],
            script: vec![
                ("a", Raised, go(none, none, none)),
                ("b", Raised, go(none, none, none)),
                ("a", Raised, go(none, none, none)),
                ("b", Raised, go(none, none, none)),
                ("a", Raised, go(&["a"], none, &["b", "c"])),
                ("b", Raised, STOP),
            ],
            finished: RunStatus::Failed,
        },
        Row {
            name: "failure rate: 4 of 6 (67 %) is not above 70 %, the run goes on",
            offered: &["a", "b", "c"],
            script: vec![
                ("a", Raised, go(none, none, none)),
                ("c", Answered, go(none, none, none)),
                ("b", Raised, go(none, none, none)),
                ("a", Raised, go(none, none, none)),
                ("c", Answered, go(none, none, none)),
                ("b", Raised, go(none, none, none)),
            ],
            finished: RunStatus::Partial,
        },
    ]
}

#[test]
fn the_seeds_monitor_rules_hold_for_an_agent_that_picks_its_tools() {
    let error_body = json!({"error": "search backend down"});
    let answer = json!({"text": "the page"});
    for row in table() {
        let mut ctl = Controller::new(ControllerConfig {
            budget: BudgetLimits::unlimited(),
            ..ControllerConfig::default()
        })
        .unwrap();
        ctl.offer(row.offered.iter().copied());
        let mut rng = SplitMix64::new(7);
        for (i, (tool, result, expect)) in row.script.iter().enumerate() {
            let args: Value = json!({"q": format!("query {i}")});
            let step = row.offered.iter().position(|t| t == tool).unwrap() as u32;
            let call = match result {
                Outcome::Answered => ToolCall::returned(tool, &args, &answer),
                Outcome::Raised => ToolCall::failed(tool, &args, "search backend down"),
                Outcome::ErrorBody => ToolCall::returned(tool, &args, &error_body),
            };
            let now = i as u64 * 1_000;
            let d = ctl.observe(
                Observation::ToolFinished {
                    step: Some(step),
                    call,
                    signal: None,
                    options: wire_options(),
                    usage: Amounts::default(),
                },
                now,
                &mut rng,
            );
            let at = format!("{} — result {}: {d:?}", row.name, i + 1);
            let stopped = match d {
                Directive::Abort { .. } | Directive::Degrade { .. } => Stop::Yes,
                Directive::Continue { .. } | Directive::Recover { .. } => Stop::No,
            };
            assert_eq!(stopped, expect.stop, "{at}");
            if stopped == Stop::Yes {
                continue;
            }
            let v = ctl.monitor_mut().check(now);
            let warned: Vec<&str> = v
                .guidance
                .iter()
                .filter(|g| g.kind == GuidanceKind::Warning)
                .filter_map(|g| g.tool.as_deref())
                .collect();
            assert_eq!(warned, expect.warned, "warnings: {at} {v:?}");
            assert_eq!(v.hidden_tools, expect.hidden, "hidden: {at}");
            for g in v
                .guidance
                .iter()
                .filter(|g| matches!(g.kind, GuidanceKind::Warning | GuidanceKind::CircuitOpen))
            {
                for name in expect.names {
                    assert!(
                        g.text.contains(&format!("`{name}`")),
                        "guidance names `{name}`: {at} {}",
                        g.text
                    );
                }
                // A hidden tool is never offered as an alternative.
                for h in &v.hidden_tools {
                    if g.tool.as_deref() != Some(h) {
                        assert!(!g.text.contains(&format!("`{h}`")), "{at} {}", g.text);
                    }
                }
            }
        }
        assert_eq!(ctl.finish(99_000).status, row.finished, "{}", row.name);
    }
}

/// Without an offer (a plan with fixed steps, as the benchmark's episodes run) nothing changes:
/// the ladder's end degrades or terminates as the policy says.
#[test]
fn without_an_offer_the_ladders_end_stands() {
    let mut ctl = Controller::new(ControllerConfig {
        budget: BudgetLimits::unlimited(),
        ..ControllerConfig::default()
    })
    .unwrap();
    let mut rng = SplitMix64::new(7);
    let error_body = json!({"error": "search backend down"});
    let mut stopped_at = None;
    for i in 0..6u64 {
        let args = json!({"q": i});
        let d = ctl.observe(
            Observation::ToolFinished {
                step: Some(0),
                call: ToolCall::returned("web_search", &args, &error_body),
                signal: None,
                options: wire_options(),
                usage: Amounts::default(),
            },
            i,
            &mut rng,
        );
        if matches!(d, Directive::Abort { .. } | Directive::Degrade { .. }) {
            stopped_at = Some(i + 1);
            break;
        }
    }
    assert_eq!(stopped_at, Some(3));
    assert!(ctl.routed().is_empty());
}
