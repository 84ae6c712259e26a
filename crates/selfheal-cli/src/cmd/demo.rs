//! `selfheal demo`: the three stuck agents of seed 000, replayed through the real monitor.
//!
//! Each scenario is a scripted agent with a ten-step budget. Without the monitor it does what
//! stuck agents do; with it, the agent reads the verdict before every step the way a real agent
//! loop would: it drops hidden tools, follows guidance, and stops on abort.

use clap::Args;
use selfheal_core::{Badge, GuidanceKind, Monitor, ToolCall, Verdict};
use serde::Serialize;
use serde_json::{Value, json};

/// Arguments of `selfheal demo`.
#[derive(Args, Debug)]
#[command(after_help = "\
EXAMPLES
  selfheal demo          the three stuck agents side by side, without and with the monitor
  selfheal demo --json   the same as JSON, one object per scenario")]
pub(crate) struct DemoArgs {
    /// Print machine-readable JSON instead of the side-by-side text.
    #[arg(long)]
    pub json: bool,
}

const STEPS: usize = 10;

#[derive(Clone, Copy)]
enum Scenario {
    BlankSearches,
    FailingSearch,
    MostCallsFail,
}

impl Scenario {
    fn title(self) -> &'static str {
        match self {
            Scenario::BlankSearches => "ten identical blank searches",
            Scenario::FailingSearch => "web_search keeps failing while fetch_url works",
            Scenario::MostCallsFail => "80 % of tool calls fail",
        }
    }

    /// The call the agent makes at `step`, given what it has learned from the monitor.
    fn next_call(self, step: usize, learned: &Learned) -> (String, Value) {
        match self {
            Scenario::BlankSearches if learned.think_about_inputs => (
                "web_search".into(),
                json!({"query": "tokio runtime shutdown"}),
            ),
            Scenario::BlankSearches => ("web_search".into(), json!({"query": ""})),
            Scenario::FailingSearch if learned.hidden.iter().any(|t| t == "web_search") => (
                "fetch_url".into(),
                json!({"url": "https://docs.rs/tokio/latest/tokio/runtime/"}),
            ),
            Scenario::FailingSearch => (
                "web_search".into(),
                json!({"query": format!("tokio runtime shutdown {}", step + 1)}),
            ),
            Scenario::MostCallsFail => {
                let tools = ["read_file", "list_dir", "grep", "read_file", "run_tests"];
                (
                    tools[step % tools.len()].into(),
                    json!({"path": format!("src/mod{step}.rs")}),
                )
            }
        }
    }

    /// What the world answers: `Ok(result)` or `Err(error)`.
    fn answer(self, step: usize, tool: &str, args: &Value) -> Result<Value, String> {
        match self {
            Scenario::BlankSearches => {
                if args
                    .get("query")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .is_empty()
                {
                    Ok(json!({"results": []}))
                } else {
                    Ok(
                        json!({"results": [{"title": "Runtime in tokio::runtime", "url": "https://docs.rs/tokio"}]}),
                    )
                }
            }
            Scenario::FailingSearch => match tool {
                "web_search" => Err("HTTP 503 Service Unavailable".into()),
                _ => Ok(json!({"status": 200, "body": "Runtime::shutdown_timeout ..."})),
            },
            Scenario::MostCallsFail => {
                if step % 5 == 4 {
                    Ok(json!({"ok": true}))
                } else {
                    Err(format!("{tool}: permission denied"))
                }
            }
        }
    }

    fn success(self, tool: &str, result: &Result<Value, String>) -> bool {
        match (self, result) {
            (_, Err(_)) => false,
            // One call working does not finish a task that needs the others.
            (Scenario::MostCallsFail, Ok(_)) => false,
            (_, Ok(v)) => {
                !Monitor::is_soft_failure(v)
                    && (tool != "web_search"
                        || v["results"].as_array().is_some_and(|a| !a.is_empty()))
            }
        }
    }
}

#[derive(Default)]
struct Learned {
    think_about_inputs: bool,
    hidden: Vec<String>,
}

#[derive(Serialize)]
struct Step {
    call: usize,
    tool: String,
    args: Value,
    outcome: String,
    badge: Option<Badge>,
    signals: Vec<String>,
    guidance: Vec<String>,
    hidden_tools: Vec<String>,
    abort: Option<String>,
}

#[derive(Serialize)]
struct Run {
    calls: usize,
    failed_calls: usize,
    solved: bool,
    steps: Vec<Step>,
}

#[derive(Serialize)]
struct ScenarioReport {
    scenario: &'static str,
    without: Run,
    with: Run,
    caught_at: Option<usize>,
    hidden_at: Option<usize>,
    aborted_at: Option<usize>,
}

fn play(s: Scenario, with_monitor: bool) -> Run {
    let mut monitor = Monitor::default();
    let mut learned = Learned::default();
    let mut steps = Vec::new();
    let mut failed = 0;
    let mut solved = false;
    let required = vec!["query".to_string()];
    for step in 0..STEPS {
        let (tool, args) = s.next_call(step, &learned);
        let result = s.answer(step, &tool, &args);
        let ok = s.success(&tool, &result);
        let call_failed = match &result {
            Ok(v) => Monitor::is_soft_failure(v),
            Err(_) => true,
        };
        failed += usize::from(call_failed);
        let outcome = match &result {
            Ok(v) => format!("returned {}", short(v)),
            Err(e) => format!("error: {e}"),
        };
        let mut record = Step {
            call: step + 1,
            tool: tool.clone(),
            args: args.clone(),
            outcome,
            badge: None,
            signals: Vec::new(),
            guidance: Vec::new(),
            hidden_tools: Vec::new(),
            abort: None,
        };
        if with_monitor {
            let req: &[String] = if tool == "web_search" { &required } else { &[] };
            let call = match &result {
                Ok(v) => ToolCall::returned(&tool, &args, v).with_required(req),
                Err(e) => ToolCall::failed(&tool, &args, e).with_required(req),
            };
            let report = monitor.record(&call, step as u64 * 1000);
            let verdict: Verdict = monitor.check(step as u64 * 1000);
            record.badge = Some(report.badge);
            record.signals = report
                .signals
                .iter()
                .map(|x| x.as_str().to_owned())
                .collect();
            record.guidance = verdict.guidance.iter().map(|g| g.text.clone()).collect();
            record.hidden_tools = verdict.hidden_tools.clone();
            record.abort = verdict.abort.clone();
            learned.think_about_inputs |= verdict
                .guidance
                .iter()
                .any(|g| g.kind == GuidanceKind::EmptyInput);
            learned.hidden = verdict.hidden_tools;
        }
        let abort = record.abort.is_some();
        steps.push(record);
        if ok && !matches!(s, Scenario::MostCallsFail) {
            solved = true;
            break;
        }
        if abort {
            break;
        }
    }
    Run {
        calls: steps.len(),
        failed_calls: failed,
        solved,
        steps,
    }
}

fn short(v: &Value) -> String {
    let s = v.to_string();
    if s.len() > 60 {
        let mut end = 57;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        format!("{}...", &s[..end])
    } else {
        s
    }
}

fn report(s: Scenario) -> ScenarioReport {
    let without = play(s, false);
    let with = play(s, true);
    let first = |f: &dyn Fn(&Step) -> bool| with.steps.iter().find(|x| f(x)).map(|x| x.call);
    let caught_at = first(&|x| !x.guidance.is_empty() || !x.signals.is_empty());
    let hidden_at = first(&|x| !x.hidden_tools.is_empty());
    let aborted_at = first(&|x| x.abort.is_some());
    ScenarioReport {
        scenario: s.title(),
        without,
        with,
        caught_at,
        hidden_at,
        aborted_at,
    }
}

/// Runs `selfheal demo`; returns the process exit code.
pub(crate) fn run(args: DemoArgs) -> anyhow::Result<u8> {
    let reports: Vec<ScenarioReport> = [
        Scenario::BlankSearches,
        Scenario::FailingSearch,
        Scenario::MostCallsFail,
    ]
    .into_iter()
    .map(report)
    .collect();
    if args.json {
        println!("{}", serde_json::to_string_pretty(&reports)?);
        return Ok(0);
    }
    for (i, r) in reports.iter().enumerate() {
        println!("━━ Scenario {}: {} ━━", i + 1, r.scenario);
        println!(
            "{:<4} {:<44} │ WITH the monitor",
            "call", "WITHOUT the monitor"
        );
        let n = r.without.steps.len().max(r.with.steps.len());
        for k in 0..n {
            let left = r
                .without
                .steps
                .get(k)
                .map(|s| format!("{} {}", s.tool, clip(&s.outcome, 30)))
                .unwrap_or_default();
            let right = r
                .with
                .steps
                .get(k)
                .map(|s| {
                    let mut t = format!(
                        "{} [{}]",
                        s.tool,
                        s.badge
                            .and_then(|b| serde_json::to_value(b).ok())
                            .and_then(|v| v.as_str().map(str::to_owned))
                            .unwrap_or_default()
                    );
                    if !s.signals.is_empty() {
                        t.push_str(&format!(" signals: {}", s.signals.join(", ")));
                    }
                    t
                })
                .unwrap_or_else(|| "—".into());
            println!("{:<4} {:<44} │ {}", k + 1, clip(&left, 44), right);
            if let Some(s) = r.with.steps.get(k) {
                for g in &s.guidance {
                    println!("{:<4} {:<44} │   ↳ guidance: {}", "", "", clip(g, 90));
                }
                if !s.hidden_tools.is_empty() {
                    println!(
                        "{:<4} {:<44} │   ↳ hidden: {}",
                        "",
                        "",
                        s.hidden_tools.join(", ")
                    );
                }
                if let Some(a) = &s.abort {
                    println!("{:<4} {:<44} │   ↳ ABORT: {}", "", "", a);
                }
            }
        }
        let verdict = |run: &Run| {
            format!(
                "{} calls, {} failed, {}",
                run.calls,
                run.failed_calls,
                if run.solved {
                    "solved"
                } else {
                    "nothing to show"
                }
            )
        };
        println!("     {:<44} │ {}", verdict(&r.without), verdict(&r.with));
        let mut facts = Vec::new();
        if let Some(c) = r.caught_at {
            facts.push(format!("caught at call {c}"));
        }
        if let Some(c) = r.hidden_at {
            facts.push(format!("tool hidden at call {c}"));
        }
        if let Some(c) = r.aborted_at {
            facts.push(format!("run stopped at call {c}"));
        }
        println!("     → with the monitor: {}\n", facts.join("; "));
    }
    Ok(0)
}

fn clip(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_owned()
    } else {
        let t: String = s.chars().take(n.saturating_sub(1)).collect();
        format!("{t}…")
    }
}
