//! The conformance table of the seeds' tool-health rules (SPEC §1) as an agent that picks its
//! own tools meets them: scripted tool results in, the run's decisions out.
//!
//! The table is data, `tests/conformance/tool_health.json`, read and judged by
//! `selfheal_core::conformance` (feature `conformance`), so that every front-end runs the
//! same rows through its own adapter: here the core's [`Run`] (as the runtime, the gateway and
//! the MCP proxy drive it), the same run written to bytes and resumed after every input (as a
//! shared store keeps it between two requests), and the bare [`Controller`] it is built on. The
//! rows say what must come out: a warning naming the alternatives at 3 failures in a row, the
//! tool hidden at 5 with guidance naming them, and a stop only on the failure-rate rule
//! (> 70 % of ≥ 6 calls) or when nothing else is on offer.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use selfheal_core::{
    Action, Amounts, Breakers, BudgetLimits, Controller, ControllerConfig, Directive, Env,
    Guidance, GuidanceKind, Input, Observation, Options, Run, RunStatus, SplitMix64, ToolCall,
    conformance::{self, Line, Row, Seen},
};
use serde_json::{Value, json};

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
        max_delay_ms: None,
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
enum Decided {
    Stopped,
    Going {
        guidance: Vec<Guidance>,
        hidden: Vec<String>,
    },
}

/// One way of driving a run.
trait Adapter {
    fn offer(&mut self, tools: &[&str]);
    fn result(&mut self, step: u32, call: ToolCall<'_>, now: u64) -> Decided;
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
    fn result(&mut self, step: u32, call: ToolCall<'_>, now: u64) -> Decided {
        let d = self
            .ctl
            .observe(tool_finished(step, call), now, &mut self.rng);
        match d {
            Directive::Abort { .. } | Directive::Degrade { .. } => Decided::Stopped,
            Directive::Continue { .. } | Directive::Recover { .. } => {
                let v = self.ctl.monitor_mut().check(now);
                Decided::Going {
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
    fn result(&mut self, step: u32, call: ToolCall<'_>, now: u64) -> Decided {
        let mut actions = self.input(Input::Observed(tool_finished(step, call)), now);
        // A step being recovered (the ladder's retry) is followed by the next model step.
        if actions.iter().all(|a| matches!(a, Action::Recover { .. })) {
            actions = self.input(Input::NextTurn, now);
        }
        assert_eq!(actions.len(), 1, "one decision per input: {actions:?}");
        match actions.remove(0) {
            Action::Stop { .. } => Decided::Stopped,
            Action::Proceed {
                guidance,
                hidden_tools,
            } => Decided::Going {
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

/// Plays `row` through `adapter` and judges what it decided against the table. Beyond the
/// table: a hidden tool is never offered as an alternative.
fn conforms(adapter: &mut dyn Adapter, row: &Row, how: &str) {
    let offered: Vec<&str> = row.offered.iter().map(String::as_str).collect();
    adapter.offer(&offered);
    let mut seen = Vec::new();
    for (i, line) in row.script.iter().enumerate() {
        let Line { tool, result, .. } = line;
        let args: Value = conformance::args(i);
        let value = result.value();
        let step = offered.iter().position(|t| t == tool).unwrap() as u32;
        let call = match (&value, result.error()) {
            (_, Some(error)) => ToolCall::failed(tool, &args, error),
            (Some(v), None) => ToolCall::returned(tool, &args, v),
            (None, None) => unreachable!("every outcome answers or raises"),
        };
        let decided = adapter.result(step, call, i as u64 * 1_000);
        let Decided::Going { guidance, hidden } = decided else {
            seen.push(Seen::Stopped);
            break;
        };
        let shown: Vec<&Guidance> = guidance
            .iter()
            .filter(|g| matches!(g.kind, GuidanceKind::Warning | GuidanceKind::CircuitOpen))
            .collect();
        for g in &shown {
            for h in &hidden {
                if g.tool.as_deref() != Some(h) {
                    assert!(
                        !g.text.contains(&format!("`{h}`")),
                        "{how}: {} {}",
                        row.name,
                        g.text
                    );
                }
            }
        }
        seen.push(Seen::Going {
            warned: guidance
                .iter()
                .filter(|g| g.kind == GuidanceKind::Warning)
                .filter_map(|g| g.tool.clone())
                .collect(),
            hidden,
            told: shown
                .iter()
                .map(|g| g.text.as_str())
                .collect::<Vec<_>>()
                .join("\n"),
        });
    }
    let finished = adapter.finish(99_000);
    if let Err(e) = conformance::judge(row, &seen, finished) {
        panic!("{how}: {e}");
    }
}

#[test]
fn the_seeds_monitor_rules_hold_for_an_agent_that_picks_its_tools() {
    let rows = conformance::table().unwrap();
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

/// Issue 30 item 9: every decision a run makes about the table's tool failures is recorded
/// with its input, so `selfheal trace replay` decides it again — a ladder's rung or a tool
/// routed around at its end. Under the same policy nothing differs; under one whose ladders
/// keep retrying, the routing around does.
#[test]
fn every_decision_about_the_tables_tool_failures_replays() {
    use selfheal_core::{ClassifierConfig, Plane, Policy, TraceEvent, replay};
    let patient = Plane::new(
        Policy::from_toml_str(
            "[ladders]\nempty_output = [\"retry\", \"retry\", \"retry\", \"retry\", \"retry\", \"retry\", \"degrade\"]\n\
             tool_timeout = [\"retry\", \"retry\", \"retry\", \"retry\", \"retry\", \"retry\", \"degrade\"]\n\
             tool_unavailable = [\"retry\", \"retry\", \"retry\", \"retry\", \"retry\", \"retry\", \"degrade\"]\n\
             argument_invalid = [\"retry\", \"retry\", \"retry\", \"retry\", \"retry\", \"retry\", \"degrade\"]\n",
        )
        .unwrap(),
        ClassifierConfig::default(),
    )
    .unwrap();
    let mut routed_rows = 0;
    for row in &conformance::table().unwrap() {
        let mut via = ViaRun::new(false);
        conforms(&mut via, row, "run");
        let events: Vec<TraceEvent> = via.run.take_records().into_iter().map(|(_, e)| e).collect();
        let failures = events
            .iter()
            .filter(|e| matches!(e, TraceEvent::Signal { tool: Some(_), .. }))
            .count();
        let decided = events
            .iter()
            .filter(|e| {
                matches!(e, TraceEvent::Action { input: Some(_), .. })
                    || matches!(e, TraceEvent::RoutedAround { input: Some(_), .. })
            })
            .count();
        let untraced = events
            .iter()
            .filter(|e| {
                matches!(e, TraceEvent::Action { input: None, .. })
                    || matches!(e, TraceEvent::RoutedAround { input: None, .. })
            })
            .count();
        assert!(failures > 0, "{}: {events:?}", row.name);
        assert_eq!(untraced, 0, "{}: a decision without its input", row.name);
        let same = replay(&events, &Plane::default());
        assert_eq!(same.len(), decided, "{}: every decision replays", row.name);
        assert!(same.iter().all(|c| !c.differs), "{}: {same:?}", row.name);
        if same.iter().any(|c| c.routed_around) {
            routed_rows += 1;
            let other = replay(&events, &patient);
            assert!(
                other.iter().any(|c| c.routed_around && c.differs),
                "{}: {other:?}",
                row.name
            );
        }
    }
    assert!(routed_rows >= 3, "the rows that route around are replayed");
}
