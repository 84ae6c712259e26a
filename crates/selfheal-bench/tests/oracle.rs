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
            "write",
            "call",
            "report_verdict",
            "report_class",
        ]
    );
}
