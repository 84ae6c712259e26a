//! The conformance table of the seeds' tool-health rules (SPEC §1) as an agent that picks its
//! own tools meets them: scripted tool results in, the run's decisions out.
//!
//! The table is data, `tests/conformance/tool_health.json`, so that every front-end runs the
//! same rows through its own adapter: here the core's [`Run`] (as the runtime, the gateway and
//! the MCP proxy drive it), the same run written to bytes and resumed after every input (as a
//! shared store keeps it between two requests), and the bare [`Controller`] it is built on. The
//! rows say what must come out: a warning naming the alternatives at 3 failures in a row, the
//! tool hidden at 5 with guidance naming them, and a stop only on the failure-rate rule
//! (> 70 % of ≥ 6 calls) or when nothing else is on offer.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use selfheal_core::budget::{Amounts, BudgetLimits};
use selfheal_core::call::Breakers;
use selfheal_core::controller::{Controller, ControllerConfig, Directive, Observation};
use selfheal_core::monitor::{Guidance, GuidanceKind, ToolCall};
use selfheal_core::policy::Options;
use selfheal_core::rng::SplitMix64;
use selfheal_core::run::{Action, Env, Input, Run};
use selfheal_core::trace::RunStatus;
use serde::Deserialize;
use serde_json::{Value, json};

/// What a tool returned.
#[derive(Clone, Copy, Deserialize)]
#[serde(rename_all = "snake_case")]
enum Outcome {
    /// A useful answer.
    Answered,
    /// It raised: an error text (a hard failure).
    Raised,
    /// It answered `{"error": ...}` (a soft failure), as in the stuck agent.
    ErrorBody,
}

/// One result and what the run must decide after it.
#[derive(Deserialize)]
struct Line {
    tool: String,
    result: Outcome,
    /// Whether the run stopped (`Abort` or `Degrade`).
    #[serde(default)]
    stop: bool,
    /// The tools with a warning (3 or 4 failures in a row).
    #[serde(default)]
    warned: Vec<String>,
    /// The tools hidden.
    #[serde(default)]
    hidden: Vec<String>,
    /// Tool names every warning or circuit guidance must name as alternatives.
    #[serde(default)]
    names: Vec<String>,
}

#[derive(Deserialize)]
struct Row {
    name: String,
    offered: Vec<String>,
    script: Vec<Line>,
    /// The run's status when it finishes (after the script).
    finished: RunStatus,
}

#[derive(Deserialize)]
struct Table {
    rows: Vec<Row>,
}

fn table() -> Vec<Row> {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/conformance/tool_health.json"
    );
    let text = std::fs::read_to_string(path).unwrap();
    serde_json::from_str::<Table>(&text).unwrap().rows
}

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

fn config() -> ControllerConfig {
    ControllerConfig {
        budget: BudgetLimits::unlimited(),
        ..ControllerConfig::default()
    }
}

/// What the run decided after one result, as a front-end reads it before the next model step.
#[derive(Debug)]
enum Seen {
    Stopped,
    Going {
        guidance: Vec<Guidance>,
        hidden: Vec<String>,
    },
}

/// One way of driving a run.
trait Adapter {
    fn offer(&mut self, tools: &[&str]);
    fn result(&mut self, step: u32, call: ToolCall<'_>, now: u64) -> Seen;
    fn finish(&mut self, now: u64) -> RunStatus;
}

/// The controller the run is built on, read as the front-ends read it before the `Run`.
struct Bare {
    ctl: Controller,
    rng: SplitMix64,
}

impl Adapter for Bare {
    fn offer(&mut self, tools: &[&str]) {
        self.ctl.offer(tools.iter().copied());
    }
    fn result(&mut self, step: u32, call: ToolCall<'_>, now: u64) -> Seen {
        let d = self
            .ctl
            .observe(tool_finished(step, call), now, &mut self.rng);
        match d {
            Directive::Abort { .. } | Directive::Degrade { .. } => Seen::Stopped,
            Directive::Continue { .. } | Directive::Recover { .. } => {
                let v = self.ctl.monitor_mut().check(now);
                Seen::Going {
                    guidance: v.guidance,
                    hidden: v.hidden_tools,
                }
            }
        }
    }
    fn finish(&mut self, now: u64) -> RunStatus {
        self.ctl.finish(now).status
    }
}

fn tool_finished(step: u32, call: ToolCall<'_>) -> Observation<'_> {
    Observation::ToolFinished {
        step: Some(step),
        call,
        signal: None,
        options: wire_options(),
        usage: Amounts::default(),
    }
}

/// The core's one interface: the result in, then the actions out until the next model step.
struct ViaRun {
    run: Run,
    rng: SplitMix64,
    breakers: Breakers,
    /// Written to bytes and resumed after every input, as a shared store would.
    resume: bool,
}

impl ViaRun {
    fn new(resume: bool) -> ViaRun {
        ViaRun {
            run: Run::new(config()).unwrap(),
            rng: SplitMix64::new(7),
            breakers: Breakers::none(),
            resume,
        }
    }
    fn input(&mut self, input: Input<'_>, now: u64) -> Vec<Action> {
        let mut env = Env {
            now_ms: now,
            rng: &mut self.rng,
            breakers: &mut self.breakers,
        };
        self.run.handle(input, &mut env);
        if self.resume {
            let bytes = self.run.to_bytes().unwrap();
            self.run = Run::from_bytes(&bytes, config()).unwrap();
        }
        std::iter::from_fn(|| self.run.poll()).collect()
    }
}

impl Adapter for ViaRun {
    fn offer(&mut self, tools: &[&str]) {
        assert!(self.input(Input::Offered(tools), 0).is_empty());
    }
    fn result(&mut self, step: u32, call: ToolCall<'_>, now: u64) -> Seen {
        let mut actions = self.input(Input::Observed(tool_finished(step, call)), now);
        // A step being recovered (the ladder's retry) is followed by the next model step.
        if actions.iter().all(|a| matches!(a, Action::Recover { .. })) {
            actions = self.input(Input::NextTurn, now);
        }
        assert_eq!(actions.len(), 1, "one decision per input: {actions:?}");
        match actions.remove(0) {
            Action::Stop { .. } => Seen::Stopped,
            Action::Proceed {
                guidance,
                hidden_tools,
            } => Seen::Going {
                guidance,
                hidden: hidden_tools,
            },
            other => panic!("a tool result asks for no {other:?}"),
        }
    }
    fn finish(&mut self, now: u64) -> RunStatus {
        self.run.finish(now).status
    }
}

fn conforms(adapter: &mut dyn Adapter, row: &Row, how: &str) {
    let error_body = json!({"error": "search backend down"});
    let answer = json!({"text": "the page"});
    let offered: Vec<&str> = row.offered.iter().map(String::as_str).collect();
    adapter.offer(&offered);
    for (i, line) in row.script.iter().enumerate() {
        let tool = line.tool.as_str();
        let args: Value = json!({"q": format!("query {i}")});
        let step = offered.iter().position(|t| *t == tool).unwrap() as u32;
        let call = match line.result {
            Outcome::Answered => ToolCall::returned(tool, &args, &answer),
            Outcome::Raised => ToolCall::failed(tool, &args, "search backend down"),
            Outcome::ErrorBody => ToolCall::returned(tool, &args, &error_body),
        };
        let now = i as u64 * 1_000;
        let seen = adapter.result(step, call, now);
        let at = format!("{how}: {} — result {}: {seen:?}", row.name, i + 1);
        let (guidance, hidden) = match seen {
            Seen::Stopped => {
                assert!(line.stop, "stopped: {at}");
                continue;
            }
            Seen::Going { guidance, hidden } => (guidance, hidden),
        };
        assert!(!line.stop, "did not stop: {at}");
        let warned: Vec<&str> = guidance
            .iter()
            .filter(|g| g.kind == GuidanceKind::Warning)
            .filter_map(|g| g.tool.as_deref())
            .collect();
        assert_eq!(warned, line.warned, "warnings: {at}");
        assert_eq!(hidden, line.hidden, "hidden: {at}");
        for g in guidance
            .iter()
            .filter(|g| matches!(g.kind, GuidanceKind::Warning | GuidanceKind::CircuitOpen))
        {
            for name in &line.names {
                assert!(
                    g.text.contains(&format!("`{name}`")),
                    "guidance names `{name}`: {at} {}",
                    g.text
                );
            }
            // A hidden tool is never offered as an alternative.
            for h in &hidden {
                if g.tool.as_deref() != Some(h) {
                    assert!(!g.text.contains(&format!("`{h}`")), "{at} {}", g.text);
                }
            }
        }
    }
    assert_eq!(adapter.finish(99_000), row.finished, "{how}: {}", row.name);
}

#[test]
fn the_seeds_monitor_rules_hold_for_an_agent_that_picks_its_tools() {
    let rows = table();
    assert!(rows.len() >= 5);
    for row in &rows {
        let mut bare = Bare {
            ctl: Controller::new(config()).unwrap(),
            rng: SplitMix64::new(7),
        };
        conforms(&mut bare, row, "controller");
        conforms(&mut ViaRun::new(false), row, "run");
        conforms(
            &mut ViaRun::new(true),
            row,
            "run resumed from bytes after every input",
        );
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
