//! No strategy can reach the fault schedule or the world's truth.
//!
//! Module privacy does most of the work: the truth and the schedule live in private fields and
//! private functions of `exec`, and a strategy only ever holds a `&mut Episode`. What privacy
//! cannot stop is a strategy importing a public module that can rebuild the truth (the catalogue
//! computes expected answers; a `TaskSpec` carries one; the live bench's `env` executes against a
//! schedule). This test reads the strategies' source and fails on any such reach.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

const FORBIDDEN: &[&str] = &[
    "catalogue",
    "crate::env",
    "faults::",
    "faultmodel",
    "Injected",
    "TaskSpec",
    "expected",
    "oracle",
    "truth(",
    "clean_answer",
    "score(",
    "into_record",
    "run_clean",
    "draw(",
    "schedule(",
    "set_data_now",
    "start_at",
    // The plan's values are the answer: grounding reads the prompt (issue 32).
    "inputs()",
    "mentions",
];

fn code_lines(src: &str) -> impl Iterator<Item = (usize, &str)> {
    src.lines().enumerate().filter(|(_, l)| {
        let t = l.trim_start();
        !(t.starts_with("//") || t.starts_with("///") || t.starts_with("//!"))
    })
}

#[test]
fn strategies_never_name_the_schedule_or_the_truth() {
    let src = include_str!("../src/strategies.rs");
    let mut hits = Vec::new();
    for (i, line) in code_lines(src) {
        for f in FORBIDDEN {
            if line.contains(f) {
                hits.push(format!("strategies.rs:{}: `{f}` in {line:?}", i + 1));
            }
        }
    }
    assert!(
        hits.is_empty(),
        "strategies reach for the oracle:\n{}",
        hits.join("\n")
    );
}

/// The plan's arguments, resolved, are the task's solution: the calls a fault-free model would
/// make. A client holds the call its model made; whatever it does with a call — cross-check it,
/// read it again before answering, show it to the monitor, compare the next call with it — it
/// does with that one. The one use a client has for the resolution is to see that an input
/// names a step that produced nothing (`ResolveError::Missing`): which outputs it holds is its
/// own knowledge, and no value is read.
fn plan_argument_reads(src: &str) -> Vec<String> {
    code_lines(src)
        .filter(|(_, l)| l.contains("resolve_args(") && !l.contains("ResolveError::Missing"))
        .map(|(i, l)| format!("strategies.rs:{}: {l:?}", i + 1))
        .collect()
}

#[test]
fn strategies_never_use_the_plans_arguments_as_the_call_made() {
    let hits = plan_argument_reads(include_str!("../src/strategies.rs"));
    assert!(
        hits.is_empty(),
        "strategies read the plan's arguments where the call made belongs:\n{}",
        hits.join("\n")
    );
}

#[test]
fn the_argument_scan_would_catch_a_reach() {
    // The cross-check's old read, and the record of the call for the repetition check.
    assert!(
        !plan_argument_reads("    let args = resolve_args(plan, s, outputs).ok()?;").is_empty()
    );
    assert!(
        !plan_argument_reads("args: resolve_args(ep.plan(), s, &outputs).unwrap_or(Value::Null),")
            .is_empty()
    );
    // The missing-input check reads no value.
    assert!(
        plan_argument_reads(
            "if let Err(e @ ResolveError::Missing { .. }) = resolve_args(ep.plan(), s, outputs) {"
        )
        .is_empty()
    );
}

#[test]
fn the_scan_would_catch_a_reach() {
    // The scan is only worth something if it fires on the obvious cheat.
    let cheat = "let answer = crate::catalogue::tasks()[0].oracle.clone();";
    assert!(code_lines(cheat).any(|(_, l)| FORBIDDEN.iter().any(|f| l.contains(f))));
    // ...and not on comments.
    assert!(code_lines("// the truth( is out there").next().is_none());
}

#[test]
fn the_episode_exposes_no_truth_or_schedule() {
    // The only public items of `exec` a strategy can use are client operations. This list is
    // the whole public surface of `Episode`; a new public method must be added here on purpose.
    let src = include_str!("../src/exec.rs");
    let public: Vec<&str> = src
        .lines()
        .filter_map(|l| l.trim_start().strip_prefix("pub fn "))
        .map(|l| l.split('(').next().unwrap_or(l))
        .collect();
    assert_eq!(
        public,
        [
            "new",
            // Where the episode sits on the benchmark's clock (for faults in a window): world
            // setup by the runner; a strategy never calls it (scanned for above).
            "start_at",
            // A call by tool name, for a live model that has no plan: a client operation.
            "execute_named",
            "plan",
            "costs",
            "now",
            "data_now",
            // The world's time of day, set by whoever builds the episode (the gateway arm sets
            // the wall clock its gateway reads `as_of` against): stamps only, no truth, no
            // schedule; a strategy never calls it (scanned for below).
            "set_data_now",
            "wait",
            "charge_recovery",
            "plan_call",
            "replan",
            // A model call the provider refuses during an outage (the error, charged): what a
            // client sees of a model call, as `write` returns it; the gateway arm asks it
            // before its model reads a request.
            "model_unavailable",
            "write",
            "call",
            "report_verdict",
            "report_class",
            // A detector fired: counted for the false-alarm rate, nothing shown back.
            "report_alarm",
        ]
    );
}

/// Issue 32: the call the simulated model writes is a draw from its error rates, not the
/// plan's call. With no fault injected, some first calls of the built-in tasks differ from the
/// plan's (another tool on offer, a wrong or missing argument, no call); a perfect model writes
/// the plan's call every time; and a rewrite is a fresh draw, not the plan's call restored.
#[test]
fn the_models_call_is_a_draw_not_the_plan() {
    use selfheal_bench::{Episode, Writer, Written};
    use selfheal_bench::{FaultModel, ModelRates, Rates};
    use selfheal_bench::{builtin, resolve_args};

    let tasks = builtin(100);
    let plan_call = |t: &selfheal_bench::TaskSpec| Written::Call {
        tool: t.plan.steps[0].tool.clone(),
        args: resolve_args(&t.plan, 0, &[]).unwrap(),
    };
    let count_differing = |model: &FaultModel| {
        let mut differ = 0;
        for seed in 0..20 {
            for t in &tasks {
                let mut ep = Episode::new(t, &[], model, seed);
                differ += usize::from(ep.write(0, Writer::Agent, true, &[]) != plan_call(t));
            }
        }
        differ
    };
    let default = FaultModel::default_model().unwrap();
    let differ = count_differing(&default);
    // 2,000 draws at the default small model's ~7 % per call.
    assert!((40..=400).contains(&differ), "{differ} of 2000 differ");
    let mut perfect = default.clone();
    perfect.model = ModelRates::PERFECT;
    assert_eq!(count_differing(&perfect), 0);

    let mut always_wrong_tool = default.clone();
    always_wrong_tool.model.agent = Rates {
        wrong_tool: 1.0,
        ..Rates::PERFECT
    };
    let t = &tasks[0];
    let mut ep = Episode::new(t, &[], &always_wrong_tool, 5);
    let mut tools = std::collections::BTreeSet::new();
    for _ in 0..20 {
        match ep.write(0, Writer::Agent, true, &[]) {
            Written::Call { tool, .. } => {
                assert_ne!(
                    tool, t.plan.steps[0].tool,
                    "a rewrite restored the plan's tool"
                );
                assert!(t.plan.tool(&tool).is_some(), "{tool} is not on offer");
                tools.insert(tool);
            }
            w @ (Written::Skipped | Written::Unavailable { .. }) => {
                panic!("no call written: {w:?}")
            }
        }
    }
    assert!(
        tools.len() >= 2,
        "every rewrite chose the same tool: {tools:?}"
    );
}
