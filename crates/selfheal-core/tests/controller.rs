//! Integration tests of the controller: hand-made observations in, directives out.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use selfheal_core::{
    ActionKind, Amounts, BudgetLimits, ConstRng, Controller, ControllerConfig, Directive,
    FailureClass, Judgement, MonitorConfig, MonitorMode, Observation, Options, Policy,
    RecoveryAction, RepairTarget, RunStatus, Signal, SplitMix64, StepsBy, ToolCall, TraceEvent,
    TraceRecord,
};
use serde_json::{Value, json};

fn controller(budget: BudgetLimits) -> Controller {
    Controller::new(ControllerConfig {
        budget,
        ..ControllerConfig::default()
    })
    .unwrap()
}

/// An unlimited budget: only the ladder and a per-failure cap of `cap` actions bound recovery.
fn capped(cap: u32) -> Controller {
    let mut cfg = ControllerConfig {
        budget: BudgetLimits::unlimited(),
        ..ControllerConfig::default()
    };
    cfg.policy.max_actions_per_failure = Some(cap);
    Controller::new(cfg).unwrap()
}

fn opts() -> Options {
    Options::all("backup_search", "big-model")
}

fn tool_failed<'a>(
    step: u32,
    tool: &'a str,
    args: &'a Value,
    error: &'a str,
    signal: Option<Signal>,
) -> Observation<'a> {
    Observation::ToolFinished {
        step: Some(step),
        call: ToolCall::failed(tool, args, error),
        signal,
        options: opts(),
        usage: Amounts::default(),
    }
}

fn tool_ok<'a>(step: u32, tool: &'a str, args: &'a Value, result: &'a Value) -> Observation<'a> {
    Observation::ToolFinished {
        step: Some(step),
        call: ToolCall::returned(tool, args, result),
        signal: None,
        options: opts(),
        usage: Amounts::default(),
    }
}

/// A call of `tool` that timed out.
fn timed_out<'a>(step: u32, tool: &'a str, args: &'a Value) -> Observation<'a> {
    tool_failed(step, tool, args, "timed out", Some(Signal::Timeout))
}

/// A verifier's judgement of the output of `step`.
fn verified(step: u32, verifier: &str, judgement: Judgement) -> Observation<'_> {
    Observation::Verified {
        step: Some(step),
        verifier,
        judgement,
        options: opts(),
    }
}

/// A rejection of the output of `step`, for `reason`.
fn rejected<'a>(step: u32, verifier: &'a str, reason: &str) -> Observation<'a> {
    verified(
        step,
        verifier,
        Judgement::Reject {
            reason: reason.into(),
        },
    )
}

/// A model call that finished, with `signal` if it failed.
fn model_finished(step: u32, signal: Option<Signal>) -> Observation<'static> {
    Observation::ModelFinished {
        step: Some(step),
        signal,
        options: opts(),
        usage: Amounts::default(),
    }
}

fn http(status: u16) -> Option<Signal> {
    Some(Signal::HttpStatus {
        status,
        retry_after_ms: None,
        message: String::new(),
    })
}

fn action(d: &Directive) -> Option<&RecoveryAction> {
    match d {
        Directive::Recover { action, .. } => Some(action),
        Directive::Continue { .. } | Directive::Degrade { .. } | Directive::Abort { .. } => None,
    }
}

#[test]
fn transient_timeout_is_recovered_by_a_retry() {
    let mut c = controller(BudgetLimits::defaults());
    let mut rng = ConstRng(0);
    let a = json!({"q": "rust"});
    let d = c.observe(timed_out(1, "search", &a), 0, &mut rng);
    assert_eq!(
        d,
        Directive::Recover {
            step: Some(1),
            class: FailureClass::ToolTimeout,
            action: RecoveryAction::Retry {
                delay_ms: 400,
                attempt: 1
            },
        },
        "500 ms base with 20 % jitter drawn at its minimum"
    );
    assert!(c.recovering());
    let result = json!({"hits": ["rust-lang.org"]});
    let d = c.observe(tool_ok(1, "search", &a, &result), 500, &mut rng);
    assert!(
        matches!(d, Directive::Continue { ref guidance, ref hidden_tools } if guidance.is_empty() && hidden_tools.is_empty()),
        "{d:?}"
    );
    assert!(!c.recovering());
    let out = c.finish(600);
    assert_eq!(out.status, RunStatus::Complete);
    assert_eq!(out.reason, None);
    assert!(out.unresolved.is_empty());
    assert_eq!(out.actions, vec![(ActionKind::Retry, 1)]);
    assert_eq!(out.spent.retries, 1);
    assert_eq!(out.spent.recoveries, 1);
}

#[test]
fn permanent_failure_climbs_retry_retry_substitute() {
    let mut c = controller(BudgetLimits::defaults());
    let mut rng = ConstRng(0);
    let a = json!({"q": "rust"});
    let mut kinds = Vec::new();
    let mut classes = Vec::new();
    for t in 0..3 {
        let d = c.observe(
            tool_failed(1, "search", &a, "HTTP 503", http(503)),
            t,
            &mut rng,
        );
        let Directive::Recover { class, action, .. } = d else {
            panic!("expected a recovery, got {d:?}");
        };
        classes.push(class);
        kinds.push(action);
    }
    assert!(matches!(kinds[0], RecoveryAction::Retry { attempt: 1, .. }));
    assert!(matches!(kinds[1], RecoveryAction::Retry { attempt: 2, .. }));
    assert_eq!(
        kinds[2],
        RecoveryAction::Substitute {
            alternative: "backup_search".into()
        }
    );
    // The third consecutive 503 is read as persistent unavailability.
    assert_eq!(
        classes,
        vec![
            FailureClass::ToolTimeout,
            FailureClass::ToolTimeout,
            FailureClass::ToolUnavailable
        ]
    );
    // The substitute works: the failure is resolved.
    let result = json!({"hits": [1]});
    let d = c.observe(tool_ok(1, "backup_search", &a, &result), 10, &mut rng);
    assert!(matches!(d, Directive::Continue { .. }), "{d:?}");
    let out = c.finish(11);
    assert_eq!(out.status, RunStatus::Complete);
    assert_eq!(
        out.actions,
        vec![(ActionKind::Retry, 2), (ActionKind::Substitute, 1)]
    );
}

#[test]
fn budget_exhaustion_ends_in_degrade() {
    let mut c = controller(BudgetLimits::defaults().with_recoveries(3));
    let mut rng = ConstRng(0);
    let a = json!({"q": "rust"});
    let mut directives = Vec::new();
    for t in 0..4 {
        directives.push(c.observe(
            tool_failed(1, "search", &a, "HTTP 503", http(503)),
            t,
            &mut rng,
        ));
    }
    assert!(directives[..3].iter().all(|d| action(d).is_some()));
    assert!(
        matches!(directives[3], Directive::Degrade { ref reason } if reason.contains("exhausted")),
        "{:?}",
        directives[3]
    );
    let out = c.finish(10);
    assert_eq!(out.status, RunStatus::Partial);
    assert_eq!(out.unresolved.len(), 1);
    assert_eq!(out.unresolved[0].step, Some(1));
    assert_eq!(out.unresolved[0].tool.as_deref(), Some("search"));
    assert_eq!(out.spent.recoveries, 3);
}

/// Drives `n` failing observations and returns the directives.
fn drive_failures(c: &mut Controller, n: u32, same_step: bool) -> Vec<Directive> {
    let mut rng = SplitMix64::new(7);
    let a = json!({"q": "rust"});
    (0..n)
        .map(|i| {
            let step = if same_step { 1 } else { i };
            let tool = format!("tool{}", i % 16);
            let obs = Observation::ToolFinished {
                step: Some(step),
                call: ToolCall::failed(&tool, &a, "HTTP 503"),
                signal: http(503),
                options: opts(),
                usage: Amounts {
                    latency_ms: 10,
                    ..Amounts::default()
                },
            };
            c.observe(obs, u64::from(i) * 10, &mut rng)
        })
        .collect()
}

fn assert_stops_within_budget(c: &Controller, directives: &[Directive], limits: &BudgetLimits) {
    let recoveries = directives.iter().filter(|d| action(d).is_some()).count() as u64;
    assert!(recoveries <= limits.recoveries, "{recoveries} recoveries");
    let stop = directives
        .iter()
        .position(|d| matches!(d, Directive::Degrade { .. } | Directive::Abort { .. }))
        .expect("the controller must stop");
    assert!(
        stop as u64 <= limits.recoveries + 1,
        "stopped only at observation {stop}"
    );
    assert!(
        directives[stop + 1..]
            .iter()
            .all(|d| d == &directives[stop]),
        "a stopped run stays stopped, with the same answer: {:?}",
        &directives[stop..]
    );
    let spent = c.ledger().spent();
    assert!(spent.recoveries <= limits.recoveries);
    assert!(spent.retries <= limits.retries);
    assert!(spent.substitutions <= limits.substitutions);
    assert!(spent.replans <= limits.replans);
    assert!(spent.escalations <= limits.escalations);
}

#[test]
fn a_thousand_failures_on_one_step_stop_within_the_budget() {
    let limits = BudgetLimits::unlimited().with_recoveries(5);
    let mut c = controller(limits);
    let directives = drive_failures(&mut c, 1_000, true);
    assert_stops_within_budget(&c, &directives, &limits);
    assert_ne!(c.finish(1_000_000).status, RunStatus::Complete);
}

#[test]
fn a_thousand_failures_on_fresh_steps_stop_within_the_budget_even_without_monitor_abort() {
    // Interactive monitor: it never aborts, so only the budget can stop the run.
    let limits = BudgetLimits::defaults().with_recoveries(1_000);
    let mut c = Controller::new(ControllerConfig {
        monitor: MonitorConfig {
            mode: MonitorMode::Interactive,
            ..MonitorConfig::default()
        },
        budget: limits,
        ..ControllerConfig::default()
    })
    .unwrap();
    let directives = drive_failures(&mut c, 1_000, false);
    let recoveries = directives.iter().filter(|d| action(d).is_some()).count() as u64;
    let count_limits = limits.retries + limits.substitutions + limits.replans + limits.escalations;
    assert!(recoveries <= count_limits, "{recoveries} recoveries");
    let stop = directives
        .iter()
        .position(|d| !matches!(d, Directive::Recover { .. }))
        .expect("must stop");
    assert!(
        matches!(directives[stop], Directive::Degrade { .. }),
        "{:?}",
        directives[stop]
    );
    assert!(
        directives[stop + 1..]
            .iter()
            .all(|d| d == &directives[stop]),
        "a degraded run keeps answering Degrade"
    );
    let out = c.finish(1);
    assert_eq!(out.status, RunStatus::Partial);
    assert!(out.unresolved.len() <= 64, "unresolved list is bounded");
}

#[test]
fn spent_latency_ends_the_run_in_degrade() {
    let limits = BudgetLimits {
        latency_ms: 1_000,
        ..BudgetLimits::unlimited()
    };
    let mut c = controller(limits);
    let mut rng = ConstRng(0);
    let a = json!({});
    let result = json!({"ok": true});
    let obs = |latency_ms| Observation::ToolFinished {
        step: Some(1),
        call: ToolCall::returned("slow", &a, &result),
        signal: None,
        options: opts(),
        usage: Amounts {
            latency_ms,
            ..Amounts::default()
        },
    };
    assert!(matches!(
        c.observe(obs(999), 999, &mut rng),
        Directive::Continue { .. }
    ));
    let d = c.observe(obs(1), 1_000, &mut rng);
    assert!(
        matches!(d, Directive::Degrade { ref reason } if reason.contains("latency_ms")),
        "{d:?}"
    );
    assert_eq!(
        c.spent_dimensions(),
        vec![selfheal_core::Dimension::LatencyMs]
    );
    assert_eq!(c.finish(1_000).status, RunStatus::Partial);
}

#[test]
fn verifier_rejection_becomes_a_verification_failure_recovery() {
    let mut c = controller(BudgetLimits::defaults());
    let mut rng = ConstRng(0);
    let d = c.observe(
        rejected(2, "schema", "at /price: expected number"),
        0,
        &mut rng,
    );
    assert_eq!(
        d,
        Directive::Recover {
            step: Some(2),
            class: FailureClass::VerificationFailure,
            action: RecoveryAction::Substitute {
                alternative: "backup_search".into()
            },
        }
    );
    // An acceptance on the same step resolves it.
    let d = c.observe(verified(2, "schema", Judgement::Accept), 1, &mut rng);
    assert!(matches!(d, Directive::Continue { .. }));
    assert_eq!(c.finish(2).status, RunStatus::Complete);
    let verdicts = c
        .trace()
        .records()
        .filter(|r| matches!(r.event, TraceEvent::Verdict { .. }))
        .count();
    assert_eq!(verdicts, 2);
}

#[test]
fn retries_whose_output_keeps_failing_verification_climb_one_ladder() {
    // Unlimited budget: only the ladder and the per-failure cap can end this. Each cycle is a
    // retried call that returns (a success to the monitor) and the schema rejecting its output.
    let mut c = capped(3);
    let mut rng = ConstRng(0);
    let args = json!({"q": "x"});
    // Different bad outputs each time, so the monitor's identical call→result rule stays out of it.
    let bad: Vec<Value> = (0..20)
        .map(|i| json!({"price": format!("cheap {i}")}))
        .collect();
    let reject = || rejected(4, "schema", "at /price: expected number");
    let mut recoveries = 0;
    let mut stop = None;
    for t in 0..20u64 {
        let d = c.observe(
            tool_ok(4, "quote", &args, &bad[t as usize]),
            2 * t,
            &mut rng,
        );
        assert!(matches!(d, Directive::Continue { .. }), "{d:?}");
        match c.observe(reject(), 2 * t + 1, &mut rng) {
            Directive::Recover { class, .. } => {
                assert_eq!(class, FailureClass::VerificationFailure);
                recoveries += 1;
            }
            d => {
                stop = Some(d);
                break;
            }
        }
    }
    assert!(
        matches!(
            stop,
            Some(Directive::Degrade { .. } | Directive::Abort { .. })
        ),
        "the cycle must end, got {stop:?} after {recoveries} recoveries"
    );
    assert!(recoveries <= 3, "{recoveries} recoveries past a cap of 3");
}

#[test]
fn an_accepted_output_after_a_success_reopens_nothing() {
    let mut c = controller(BudgetLimits::defaults());
    let mut rng = ConstRng(0);
    let args = json!({"q": "x"});
    let d = c.observe(timed_out(1, "search", &args), 0, &mut rng);
    assert!(action(&d).is_some());
    let ok = json!({"n": 1});
    c.observe(tool_ok(1, "search", &args, &ok), 1, &mut rng);
    let d = c.observe(verified(1, "schema", Judgement::Accept), 2, &mut rng);
    assert!(matches!(d, Directive::Continue { .. }));
    assert!(!c.recovering());
    assert_eq!(c.finish(3).status, RunStatus::Complete);
}

#[test]
fn uncertain_verdict_does_not_trigger_recovery() {
    let mut c = controller(BudgetLimits::defaults());
    let d = c.observe(
        verified(
            1,
            "grounding",
            Judgement::Uncertain {
                reason: "no evidence".into(),
            },
        ),
        0,
        &mut ConstRng(0),
    );
    assert!(matches!(d, Directive::Continue { .. }), "{d:?}");
}

#[test]
fn monitor_abort_beats_recovery() {
    let mut c = controller(BudgetLimits::unlimited());
    let mut rng = ConstRng(0);
    let mut directives = Vec::new();
    for i in 0..6u32 {
        let a = json!({"i": i});
        let tool = format!("tool{i}");
        let err = format!("error {i}");
        directives.push(c.observe(
            tool_failed(i, &tool, &a, &err, Some(Signal::Timeout)),
            u64::from(i),
            &mut rng,
        ));
    }
    assert!(
        directives[..5].iter().all(|d| action(d).is_some()),
        "{directives:?}"
    );
    let Directive::Abort { reason } = &directives[5] else {
        panic!("6 of 6 failing must abort, got {:?}", directives[5]);
    };
    assert!(reason.contains("6 of the last 6"), "{reason}");
    // Nothing was charged for the sixth failure.
    assert_eq!(c.ledger().spent().recoveries, 5);
    let out = c.finish(10);
    assert_eq!(out.status, RunStatus::Failed);
    assert_eq!(out.reason.as_deref(), Some(reason.as_str()));
    assert!(out.unresolved.iter().any(|u| u.step == Some(5)));
    // Once stopped, every observation answers abort.
    let a = json!({});
    let r = json!({"ok": 1});
    assert!(matches!(
        c.observe(tool_ok(7, "x", &a, &r), 11, &mut rng),
        Directive::Abort { .. }
    ));
}

#[test]
fn circuit_open_tool_is_hidden_in_continue_directives() {
    let mut c = controller(BudgetLimits::unlimited());
    let mut rng = ConstRng(0);
    let a = json!({"q": 1});
    // Interleave successes on other steps so the abort rule stays quiet.
    for i in 0..5u32 {
        c.observe(
            tool_failed(1, "flaky", &a, "HTTP 500", http(500)),
            0,
            &mut rng,
        );
        for j in 0..2u32 {
            let b = json!({"i": i, "j": j});
            let r = json!({"ok": [i, j]});
            c.observe(tool_ok(100 + i, "stable", &b, &r), 0, &mut rng);
        }
    }
    let Directive::Continue { hidden_tools, .. } = c.guidance(0) else {
        panic!("expected continue");
    };
    assert_eq!(hidden_tools, vec!["flaky".to_string()]);
}

#[test]
fn finish_is_complete_with_no_failures() {
    let mut c = controller(BudgetLimits::defaults());
    let a = json!({"q": 1});
    let r = json!({"ok": 1});
    c.observe(tool_ok(1, "t", &a, &r), 0, &mut ConstRng(0));
    let out = c.finish(1);
    assert_eq!(out.status, RunStatus::Complete);
    assert!(out.unresolved.is_empty());
    assert!(out.actions.is_empty());
}

#[test]
fn finish_is_partial_with_an_open_failure_listed_as_unresolved() {
    let mut c = controller(BudgetLimits::defaults());
    let a = json!({"q": 1});
    c.observe(timed_out(4, "search", &a), 0, &mut ConstRng(0));
    let out = c.finish(1);
    assert_eq!(out.status, RunStatus::Partial);
    assert_eq!(out.reason.as_deref(), Some("1 failure(s) unresolved"));
    assert_eq!(out.unresolved.len(), 1);
    assert_eq!(out.unresolved[0].step, Some(4));
    assert_eq!(out.unresolved[0].class, FailureClass::ToolTimeout);
    assert_eq!(out.unresolved[0].tool.as_deref(), Some("search"));
}

#[test]
fn finish_is_failed_after_terminate() {
    // control_loop's ladder ends in terminate; with no planner or fallback it terminates at once.
    let mut c = controller(BudgetLimits::defaults());
    let d = c.observe(
        Observation::ModelFinished {
            step: Some(3),
            signal: Some(Signal::Repetition),
            options: Options::default(),
            usage: Amounts::default(),
        },
        0,
        &mut ConstRng(0),
    );
    assert!(matches!(d, Directive::Abort { .. }), "{d:?}");
    let out = c.finish(1);
    assert_eq!(out.status, RunStatus::Failed);
    assert_eq!(out.unresolved.len(), 1);
    assert_eq!(out.unresolved[0].class, FailureClass::ControlLoop);
}

#[test]
fn a_new_failing_step_leaves_the_previous_one_unresolved() {
    let mut c = controller(BudgetLimits::defaults());
    let mut rng = ConstRng(0);
    let a = json!({"q": 1});
    c.observe(timed_out(1, "a", &a), 0, &mut rng);
    let b = json!({"q": 2});
    c.observe(timed_out(2, "b", &b), 0, &mut rng);
    assert_eq!(c.unresolved().len(), 1);
    assert_eq!(c.unresolved()[0].step, Some(1));
    let r = json!({"ok": 1});
    c.observe(tool_ok(2, "b", &b, &r), 0, &mut rng);
    let out = c.finish(1);
    assert_eq!(out.status, RunStatus::Partial);
    assert_eq!(out.unresolved.len(), 1);
}

/// Issue 11: a step whose failure another step's failure pushed aside (a replan went back to
/// a skipped step, which failed in its turn) is settled when it succeeds: every step succeeded,
/// the run is complete. A step that never succeeds stays unresolved.
#[test]
fn a_pushed_aside_failure_is_settled_by_its_steps_success() {
    let mut c = controller(BudgetLimits::defaults());
    let mut rng = ConstRng(0);
    let missing = Some(Signal::MissingStep {
        detail: "no input".into(),
    });
    let d = c.observe(model_finished(2, missing), 0, &mut rng);
    assert!(matches!(action(&d), Some(RecoveryAction::Replan)), "{d:?}");
    let a = json!({"q": 1});
    c.observe(timed_out(1, "a", &a), 0, &mut rng);
    assert_eq!(c.unresolved().len(), 1);
    let r = json!({"ok": 1});
    c.observe(tool_ok(1, "a", &a, &r), 0, &mut rng);
    assert_eq!(c.unresolved().len(), 1, "step 2 has not succeeded yet");
    let b = json!({"q": 2});
    c.observe(tool_ok(2, "b", &b, &r), 0, &mut rng);
    assert!(c.unresolved().is_empty());
    assert_eq!(c.finish(1).status, RunStatus::Complete);
}

#[test]
fn trace_jsonl_reads_back_line_by_line_with_gap_free_seq() {
    let mut c = controller(BudgetLimits::defaults());
    let mut rng = SplitMix64::new(1);
    let a = json!({"q": "rust"});
    let r = json!({"hits": [1]});
    c.observe(timed_out(1, "search", &a), 1, &mut rng);
    c.observe(tool_ok(1, "search", &a, &r), 2, &mut rng);
    c.observe(rejected(1, "schema", "wrong"), 3, &mut rng);
    c.observe(model_finished(2, http(429)), 4, &mut rng);
    c.finish(5);
    let jsonl = c.trace().to_jsonl();
    assert!(jsonl.ends_with('\n'));
    let records: Vec<TraceRecord> = jsonl
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}")))
        .collect();
    assert_eq!(records.len() as u64, c.trace().total());
    for (i, r) in records.iter().enumerate() {
        assert_eq!(r.seq, i as u64, "seq must be gap-free");
        assert_eq!(r.v, 1);
    }
    let kept: Vec<&TraceRecord> = c.trace().records().collect();
    assert_eq!(
        records.iter().collect::<Vec<_>>(),
        kept,
        "lossless round trip"
    );
    assert!(records.windows(2).all(|w| w[0].t_ms <= w[1].t_ms));
    for tag in [
        "monitor",
        "signal",
        "classified",
        "action",
        "verdict",
        "finished",
    ] {
        assert!(
            jsonl.contains(&format!("\"event\":\"{tag}\"")),
            "missing {tag}"
        );
    }
    assert!(matches!(
        records.last().map(|r| &r.event),
        Some(TraceEvent::Finished {
            status: RunStatus::Partial,
            ..
        })
    ));
}

#[test]
fn trace_seq_stays_gap_free_when_the_ring_drops_events() {
    let mut c = Controller::new(ControllerConfig {
        trace_capacity: 8,
        ..ControllerConfig::default()
    })
    .unwrap();
    let mut rng = ConstRng(0);
    for i in 0..50u32 {
        let a = json!({"i": i});
        let r = json!({"ok": i});
        c.observe(tool_ok(i, "t", &a, &r), u64::from(i), &mut rng);
    }
    let records: Vec<TraceRecord> = c
        .trace()
        .to_jsonl()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(records.len(), 8);
    assert_eq!(c.trace().dropped(), 42);
    assert_eq!(records[0].seq, 42);
    assert!(records.windows(2).all(|w| w[1].seq == w[0].seq + 1));
}

#[test]
fn action_events_record_the_budget_before_and_after() {
    let mut c = controller(BudgetLimits::defaults());
    let a = json!({"q": 1});
    c.observe(timed_out(1, "s", &a), 0, &mut ConstRng(0));
    let (before, after) = c
        .trace()
        .records()
        .find_map(|r| match &r.event {
            TraceEvent::Action {
                budget_before,
                budget_after,
                ..
            } => Some((*budget_before, *budget_after)),
            _ => None,
        })
        .expect("an action event");
    assert_eq!(before.retries, 3);
    assert_eq!(after.retries, 2);
    assert_eq!(before.recoveries - after.recoveries, 1);
}

#[test]
fn custom_policy_ladder_is_climbed_through_the_controller() {
    let policy = Policy::from_toml_str(
        "[ladders]\ntool_timeout = [\"retry\", \"substitute\", \"degrade\"]\n",
    )
    .unwrap();
    let mut c = Controller::new(ControllerConfig {
        policy,
        budget: BudgetLimits::unlimited(),
        ..ControllerConfig::default()
    })
    .unwrap();
    let mut rng = ConstRng(0);
    let a = json!({"q": 1});
    let mut got = Vec::new();
    for t in 0..3 {
        // 429 stays a transient tool_timeout however often it repeats.
        let d = c.observe(tool_failed(1, "api", &a, "429", http(429)), t, &mut rng);
        got.push(match d {
            Directive::Recover { action, .. } => action.kind(),
            Directive::Degrade { .. } => ActionKind::Degrade,
            other => panic!("{other:?}"),
        });
    }
    assert_eq!(
        got,
        vec![
            ActionKind::Retry,
            ActionKind::Substitute,
            ActionKind::Degrade
        ]
    );
}

#[test]
fn invalid_policy_is_rejected_by_the_controller() {
    let mut policy = Policy::default();
    policy.retry.factor = 0.0;
    let err = Controller::new(ControllerConfig {
        policy,
        ..ControllerConfig::default()
    })
    .unwrap_err();
    assert!(err.to_string().contains("factor"), "{err}");
}

#[test]
fn identical_observations_and_seed_give_identical_runs() {
    let run = || {
        let mut c = controller(BudgetLimits::defaults());
        let mut rng = SplitMix64::new(42);
        let a = json!({"q": 1});
        let mut ds = Vec::new();
        for t in 0..5 {
            ds.push(c.observe(tool_failed(1, "s", &a, "HTTP 503", http(503)), t, &mut rng));
        }
        (ds, c.trace().to_jsonl())
    };
    assert_eq!(run(), run());
}

#[test]
fn healing_rate_counts_model_calls_and_never_exceeds_one() {
    let mut c = controller(BudgetLimits::unlimited());
    let mut rng = ConstRng(0);
    let a = json!({"q": 1});
    let r = json!({"ok": 1});
    c.observe(tool_ok(1, "t", &a, &r), 0, &mut rng);
    for t in 0..2 {
        let d = c.observe(model_finished(2, http(429)), t, &mut rng);
        assert!(action(&d).is_some(), "{d:?}");
    }
    let h = c.trace().healing;
    assert_eq!(h.calls, 3, "one tool call and two model calls");
    assert_eq!(h.healed, 2);
    assert!(h.rate() <= 1.0);
    // Verifier rejections are not calls, yet they are healed: the rate is still a share.
    for t in 0..4 {
        c.observe(rejected(3, "v", "wrong"), 10 + t, &mut rng);
    }
    assert!(c.trace().healing.rate() <= 1.0, "{:?}", c.trace().healing);
}

#[test]
fn an_accepted_answer_settles_its_rejection_even_after_another_failure() {
    let mut c = controller(BudgetLimits::defaults());
    let mut rng = ConstRng(0);
    // The answer is rejected (a failure open on step 9)...
    let d = c.observe(
        rejected(9, "grounding", "Lyon is not in the evidence"),
        0,
        &mut rng,
    );
    assert!(action(&d).is_some(), "{d:?}");
    // ...a model call on another step fails, which pushes the open failure aside...
    let d = c.observe(model_finished(10, http(500)), 1, &mut rng);
    assert!(action(&d).is_some(), "{d:?}");
    c.observe(model_finished(10, None), 2, &mut rng);
    // ...and the next answer is accepted: nothing is left unresolved.
    let d = c.observe(verified(9, "grounding", Judgement::Accept), 3, &mut rng);
    assert!(matches!(d, Directive::Continue { .. }), "{d:?}");
    let out = c.finish(4);
    assert_eq!(out.status, RunStatus::Complete, "{:?}", out.unresolved);
}

#[test]
fn another_tools_rejected_output_on_a_reused_step_starts_its_own_ladder() {
    let mut c = capped(3);
    let mut rng = ConstRng(0);
    let args = json!({"q": 1});
    // `slow` times out on step 3 until its actions are almost spent.
    for t in 0..2 {
        let d = c.observe(timed_out(3, "slow", &args), t, &mut rng);
        assert!(action(&d).is_some(), "{d:?}");
    }
    // The model moves on and calls `weather` on the same step; its output is then rejected.
    let ok = json!({"temp": "warm"});
    c.observe(tool_ok(3, "weather", &args, &ok), 5, &mut rng);
    let d = c.observe(
        rejected(3, "schema", "at /temp: expected number"),
        6,
        &mut rng,
    );
    // A fresh ladder for `weather`'s failure, not the last action `slow` had left.
    let Directive::Recover { class, .. } = &d else {
        panic!("weather's first rejection must be recovered, got {d:?}")
    };
    assert_eq!(*class, FailureClass::VerificationFailure);
    let d = c.observe(
        tool_ok(3, "weather", &args, &json!({"temp": "hot"})),
        7,
        &mut rng,
    );
    assert!(matches!(d, Directive::Continue { .. }), "{d:?}");
    let d = c.observe(
        rejected(3, "schema", "at /temp: expected number"),
        8,
        &mut rng,
    );
    assert!(
        action(&d).is_some(),
        "weather's own ladder has rungs left: {d:?}"
    );
}

fn uncertain(step: u32) -> Observation<'static> {
    verified(
        step,
        "cross_check",
        Judgement::Uncertain {
            reason: "the other source did not answer".into(),
        },
    )
}

/// Drives a 503 on step 1 until the controller substitutes, then reports the substitute's answer.
fn substituted(c: &mut Controller, rng: &mut ConstRng) {
    let a = json!({"q": "rust"});
    let result = json!({"hits": [1]});
    for t in 0..4 {
        let d = c.observe(tool_failed(1, "search", &a, "HTTP 503", http(503)), t, rng);
        let Directive::Recover { action, .. } = d else {
            panic!("expected a recovery, got {d:?}");
        };
        if matches!(action, RecoveryAction::Substitute { .. }) {
            let d = c.observe(tool_ok(1, "backup_search", &a, &result), 10, rng);
            assert!(matches!(d, Directive::Continue { .. }), "{d:?}");
            return;
        }
    }
    panic!("no substitution within four failures");
}

/// A controller whose risk is below what a source with no record is trusted for (the prior's
/// mean): a recovered value nothing could check is not claimed.
fn cautious() -> Controller {
    let mut cfg = ControllerConfig {
        budget: BudgetLimits::defaults(),
        ..ControllerConfig::default()
    };
    cfg.policy.risk = 0.001;
    Controller::new(cfg).unwrap()
}

/// Issue 33: a recovered value whose check could not judge it is read and checked again
/// (a retry of the call that recovered it) while the policy allows; each re-read of `tool`
/// comes back and its check still cannot judge it. Returns the directive that ended it and
/// how many re-reads were asked for.
fn never_settled(
    c: &mut Controller,
    rng: &mut ConstRng,
    step: u32,
    tool: &str,
    at: u64,
) -> (Directive, u32) {
    let a = json!({"q": "rust"});
    let result = json!({"hits": [1]});
    let mut rechecks = 0;
    for t in 0..10 {
        let now = at + 2 * t;
        let d = c.observe(uncertain(step), now, rng);
        match &d {
            Directive::Recover {
                action: RecoveryAction::Retry { .. },
                ..
            } => {
                rechecks += 1;
                let d = c.observe(tool_ok(step, tool, &a, &result), now + 1, rng);
                assert!(
                    matches!(d, Directive::Continue { .. }),
                    "the re-read the run asked for is not a loop: {d:?}"
                );
            }
            _ => return (d, rechecks),
        }
    }
    panic!("the value was read again without end");
}

#[test]
fn a_substitute_the_verifier_could_not_judge_degrades() {
    let mut c = cautious();
    let mut rng = ConstRng(0);
    substituted(&mut c, &mut rng);
    let (d, rechecks) = never_settled(&mut c, &mut rng, 1, "backup_search", 11);
    assert!(
        matches!(d, Directive::Degrade { ref reason } if reason.contains("could not be verified")),
        "{d:?}"
    );
    // Read again as many times as the risk asks of a value nothing else confirms, no more.
    assert!(rechecks >= 1, "checked again before giving up");
    assert!(
        rechecks <= Policy::default().reread_count() + 1,
        "{rechecks}"
    );
    let out = c.finish(12);
    assert_eq!(out.status, RunStatus::Partial);
    assert!(
        out.unresolved
            .iter()
            .any(|u| u.step == Some(1) && u.class == FailureClass::VerificationFailure)
    );
}

#[test]
fn a_substitute_the_verifier_accepts_completes() {
    let mut c = controller(BudgetLimits::defaults());
    let mut rng = ConstRng(0);
    substituted(&mut c, &mut rng);
    let d = c.observe(verified(1, "cross_check", Judgement::Accept), 11, &mut rng);
    assert!(matches!(d, Directive::Continue { .. }), "{d:?}");
    assert_eq!(c.finish(12).status, RunStatus::Complete);
}

#[test]
fn a_substitute_with_no_verifier_completes() {
    // Nothing to check it against: nothing is held back.
    let mut c = controller(BudgetLimits::defaults());
    let mut rng = ConstRng(0);
    substituted(&mut c, &mut rng);
    assert_eq!(c.finish(12).status, RunStatus::Complete);
}

#[test]
fn a_policy_may_accept_unverified_recoveries() {
    let mut cfg = ControllerConfig {
        budget: BudgetLimits::defaults(),
        ..ControllerConfig::default()
    };
    cfg.policy.accept_unverified_recovery = Some(true);
    let mut c = Controller::new(cfg).unwrap();
    let mut rng = ConstRng(0);
    substituted(&mut c, &mut rng);
    let d = c.observe(uncertain(1), 11, &mut rng);
    assert!(matches!(d, Directive::Continue { .. }), "{d:?}");
    assert_eq!(c.finish(12).status, RunStatus::Complete);
}

#[test]
fn a_retried_value_the_verifier_could_not_judge_degrades() {
    // Issue 10: a step that just failed is likelier than a healthy one to be wrong in a second
    // way on the same answer, so a retried value is in doubt like a substitute's: when its check
    // runs and cannot tell, it is not claimed unless its source is trusted within the risk.
    let mut c = cautious();
    let mut rng = ConstRng(0);
    let a = json!({"q": "rust"});
    let d = c.observe(timed_out(1, "search", &a), 0, &mut rng);
    assert!(
        matches!(
            d,
            Directive::Recover {
                action: RecoveryAction::Retry { .. },
                ..
            }
        ),
        "{d:?}"
    );
    let result = json!({"hits": [1]});
    let d = c.observe(tool_ok(1, "search", &a, &result), 1, &mut rng);
    assert!(matches!(d, Directive::Continue { .. }), "{d:?}");
    let (d, rechecks) = never_settled(&mut c, &mut rng, 1, "search", 2);
    assert!(matches!(d, Directive::Degrade { .. }), "{d:?}");
    assert!(rechecks >= 1);
    let out = c.finish(40);
    assert_eq!(out.status, RunStatus::Partial);
    assert_eq!(out.unresolved[0].class, FailureClass::VerificationFailure);
}

#[test]
fn an_unjudged_substitute_is_checked_again_and_claimed_once_the_check_agrees() {
    // Issue 33, item 2: "otherwise it is cross-checked or read again while the budget allows".
    // The other source was busy when the substitute's value was first checked; on the re-read
    // it answers and agrees, and the value is claimed.
    let mut c = cautious();
    let mut rng = ConstRng(0);
    substituted(&mut c, &mut rng);
    let d = c.observe(uncertain(1), 11, &mut rng);
    let Directive::Recover {
        action: RecoveryAction::Retry { delay_ms, .. },
        ..
    } = d
    else {
        panic!("expected a re-read, got {d:?}");
    };
    assert!(delay_ms > 0, "it waits before reading again");
    let a = json!({"q": "rust"});
    let result = json!({"hits": [1]});
    let d = c.observe(tool_ok(1, "backup_search", &a, &result), 12, &mut rng);
    assert!(matches!(d, Directive::Continue { .. }), "{d:?}");
    let d = c.observe(verified(1, "cross_check", Judgement::Accept), 13, &mut rng);
    assert!(matches!(d, Directive::Continue { .. }), "{d:?}");
    assert_eq!(c.finish(14).status, RunStatus::Complete);
}

#[test]
fn a_recheck_honours_the_wait_the_failure_asked_for() {
    let mut c = cautious();
    let mut rng = ConstRng(0);
    let a = json!({"q": "rust"});
    let limited = Some(Signal::HttpStatus {
        status: 429,
        retry_after_ms: Some(7_000),
        message: "429 Too Many Requests".into(),
    });
    let d = c.observe(
        tool_failed(1, "search", &a, "HTTP 429", limited),
        0,
        &mut rng,
    );
    assert!(action(&d).is_some(), "{d:?}");
    let result = json!({"hits": [1]});
    let d = c.observe(tool_ok(1, "search", &a, &result), 8_000, &mut rng);
    assert!(matches!(d, Directive::Continue { .. }), "{d:?}");
    let d = c.observe(uncertain(1), 8_001, &mut rng);
    assert!(
        matches!(
            d,
            Directive::Recover {
                action: RecoveryAction::Retry { delay_ms, .. },
                ..
            } if delay_ms >= 7_000
        ),
        "{d:?}"
    );
}

#[test]
fn no_recheck_when_no_action_is_left_for_the_failure() {
    // Item 4's rule for every check: at the per-failure cap, an unjudged value is not read again
    // (the cap is the user's), and the run degrades with the value flagged.
    let mut cfg = ControllerConfig {
        budget: BudgetLimits::unlimited(),
        ..ControllerConfig::default()
    };
    cfg.policy.max_actions_per_failure = Some(1);
    cfg.policy.risk = 0.001;
    let mut c = Controller::new(cfg).unwrap();
    let mut rng = ConstRng(0);
    let a = json!({"q": "rust"});
    let d = c.observe(timed_out(1, "search", &a), 0, &mut rng);
    assert!(action(&d).is_some(), "{d:?}");
    let result = json!({"hits": [1]});
    let d = c.observe(tool_ok(1, "search", &a, &result), 1, &mut rng);
    assert!(matches!(d, Directive::Continue { .. }), "{d:?}");
    let d = c.observe(uncertain(1), 2, &mut rng);
    assert!(
        matches!(d, Directive::Degrade { ref reason } if reason.contains("could not be verified")),
        "{d:?}"
    );
}

#[test]
fn no_recheck_of_a_call_that_is_not_safe_to_send_again() {
    let mut c = cautious();
    let mut rng = ConstRng(0);
    substituted(&mut c, &mut rng);
    let d = c.observe(
        Observation::Verified {
            step: Some(1),
            verifier: "cross_check",
            judgement: Judgement::Uncertain {
                reason: "the other source did not answer".into(),
            },
            options: Options {
                retry_safe: false,
                ..opts()
            },
        },
        11,
        &mut rng,
    );
    assert!(matches!(d, Directive::Degrade { .. }), "{d:?}");
}

#[test]
fn a_value_that_never_failed_stands_when_the_verifier_cannot_judge_it() {
    // The doubt rule is about recovered values only: a first-try answer whose check could not
    // answer is claimed as before.
    let mut c = controller(BudgetLimits::defaults());
    let mut rng = ConstRng(0);
    let a = json!({"q": "rust"});
    let result = json!({"hits": [1]});
    let d = c.observe(tool_ok(1, "search", &a, &result), 0, &mut rng);
    assert!(matches!(d, Directive::Continue { .. }), "{d:?}");
    let d = c.observe(uncertain(1), 1, &mut rng);
    assert!(matches!(d, Directive::Continue { .. }), "{d:?}");
    assert_eq!(c.finish(2).status, RunStatus::Complete);
}

/// A schema-drift failure on step 1 whose output the controller repairs.
fn drifted_and_repaired(c: &mut Controller, rng: &mut ConstRng) {
    let a = json!({"q": "rust"});
    let body = json!({"hits_v2": [1]});
    let d = c.observe(
        Observation::ToolFinished {
            step: Some(1),
            call: ToolCall::returned("search", &a, &body),
            signal: Some(Signal::SchemaDrift {
                detail: "no `hits`".into(),
            }),
            options: Options {
                repair: Some(RepairTarget::Output),
                ..opts()
            },
            usage: Amounts::default(),
        },
        0,
        rng,
    );
    assert!(
        matches!(
            d,
            Directive::Recover {
                action: RecoveryAction::Repair {
                    target: RepairTarget::Output
                },
                ..
            }
        ),
        "{d:?}"
    );
}

#[test]
fn a_repaired_output_the_verifier_could_not_judge_is_set_aside() {
    // Regression (issue 10): a repaired output is verified while its failure is still open (no
    // call came between). An uncertain verdict used to resolve that failure as if it were an
    // acceptance, so a re-mapped drifted body whose other source had drifted too was claimed.
    // Now the rebuilt value is set aside and the failure climbs its ladder: the next rung asks
    // for a fresh answer, which counts once it passes on its own.
    let mut c = controller(BudgetLimits::defaults());
    let mut rng = ConstRng(0);
    drifted_and_repaired(&mut c, &mut rng);
    let d = c.observe(uncertain(1), 1, &mut rng);
    assert!(
        matches!(
            d,
            Directive::Recover {
                class: FailureClass::MalformedOutput,
                action: RecoveryAction::Retry { .. },
                ..
            }
        ),
        "{d:?}"
    );
    let a = json!({"q": "rust"});
    let clean = json!({"hits": [1]});
    let d = c.observe(tool_ok(1, "search", &a, &clean), 2, &mut rng);
    assert!(matches!(d, Directive::Continue { .. }), "{d:?}");
    let d = c.observe(verified(1, "cross_check", Judgement::Accept), 3, &mut rng);
    assert!(matches!(d, Directive::Continue { .. }), "{d:?}");
    assert_eq!(c.finish(4).status, RunStatus::Complete);
}

#[test]
fn a_repaired_output_the_verifier_could_not_judge_degrades_at_the_ladders_end() {
    // Nothing else can be tried (no retry, substitute, fallback model or planner): the rebuilt
    // value is not claimed, the run degrades.
    let mut c = controller(BudgetLimits::defaults());
    let mut rng = ConstRng(0);
    drifted_and_repaired(&mut c, &mut rng);
    let d = c.observe(
        Observation::Verified {
            step: Some(1),
            verifier: "repair",
            judgement: Judgement::Uncertain {
                reason: "no second source".into(),
            },
            options: Options {
                partial_result: true,
                ..Options::default()
            },
        },
        1,
        &mut rng,
    );
    assert!(matches!(d, Directive::Degrade { .. }), "{d:?}");
    let out = c.finish(2);
    assert_eq!(out.status, RunStatus::Partial);
    assert_eq!(out.unresolved[0].class, FailureClass::MalformedOutput);
}

#[test]
fn a_repaired_output_its_verifier_accepts_completes() {
    let mut c = controller(BudgetLimits::defaults());
    let mut rng = ConstRng(0);
    drifted_and_repaired(&mut c, &mut rng);
    let d = c.observe(verified(1, "cross_check", Judgement::Accept), 1, &mut rng);
    assert!(matches!(d, Directive::Continue { .. }), "{d:?}");
    assert_eq!(c.finish(2).status, RunStatus::Complete);
}

#[test]
fn a_disagreement_left_unsettled_degrades() {
    // Two sources disagreed; the re-read comes back, but the other source cannot answer now.
    let mut c = controller(BudgetLimits::defaults());
    let mut rng = ConstRng(0);
    let a = json!({"city": "Oslo"});
    let result = json!({"temp_c": 4.0});
    let d = c.observe(
        Observation::ToolFinished {
            step: Some(2),
            call: ToolCall::returned("weather", &a, &result),
            signal: Some(Signal::Contradiction {
                detail: "4.0 here, 9.0 there".into(),
            }),
            options: opts(),
            usage: Amounts::default(),
        },
        0,
        &mut rng,
    );
    assert!(
        matches!(
            d,
            Directive::Recover {
                class: FailureClass::ContradictoryEvidence,
                ..
            }
        ),
        "{d:?}"
    );
    let d = c.observe(tool_ok(2, "weather", &a, &result), 1, &mut rng);
    assert!(matches!(d, Directive::Continue { .. }), "{d:?}");
    let (d, _) = never_settled(&mut c, &mut rng, 2, "weather", 2);
    assert!(matches!(d, Directive::Degrade { .. }), "{d:?}");
    assert_eq!(c.finish(40).status, RunStatus::Partial);
}

#[test]
fn a_run_that_needed_a_recovery_rereads_once_and_a_run_that_went_well_never() {
    let args = json!({"q": "x"});
    let result = json!({"v": 1});
    let mut rng = SplitMix64::new(7);

    let mut calm = controller(BudgetLimits::unlimited());
    calm.observe(tool_ok(0, "search", &args, &result), 0, &mut rng);
    assert!(
        !calm.reread_due(),
        "nothing went wrong: nothing to read again"
    );

    let mut troubled = controller(BudgetLimits::unlimited());
    let d = troubled.observe(timed_out(0, "search", &args), 0, &mut rng);
    assert!(matches!(d, Directive::Recover { .. }), "{d:?}");
    troubled.observe(tool_ok(0, "search", &args, &result), 10, &mut rng);
    assert!(
        troubled.reread_due(),
        "a recovered run reads its values once more"
    );
    assert!(!troubled.reread_due(), "once per run");

    let mut off = ControllerConfig {
        budget: BudgetLimits::unlimited(),
        ..ControllerConfig::default()
    };
    off.policy = Policy::from_toml_str("reread_after_recovery = false").unwrap();
    let mut off = Controller::new(off).unwrap();
    off.observe(timed_out(0, "search", &args), 0, &mut rng);
    off.observe(tool_ok(0, "search", &args, &result), 10, &mut rng);
    assert!(!off.reread_due(), "the policy file turns it off");
}

#[test]
fn with_claim_after_recovery_off_a_recovered_run_ends_partial_and_a_calm_one_complete() {
    let args = json!({"q": "x"});
    let result = json!({"v": 1});
    let mut rng = SplitMix64::new(7);
    let config = || {
        let mut c = ControllerConfig {
            budget: BudgetLimits::unlimited(),
            ..ControllerConfig::default()
        };
        c.policy = Policy::from_toml_str("claim_after_recovery = false").unwrap();
        c
    };
    let mut calm = Controller::new(config()).unwrap();
    calm.observe(tool_ok(0, "search", &args, &result), 0, &mut rng);
    assert_eq!(calm.finish(1).status, RunStatus::Complete);

    let mut troubled = Controller::new(config()).unwrap();
    troubled.observe(timed_out(0, "search", &args), 0, &mut rng);
    troubled.observe(tool_ok(0, "search", &args, &result), 10, &mut rng);
    assert!(
        !troubled.reread_due(),
        "nothing will be claimed: nothing to read"
    );
    let outcome = troubled.finish(11);
    assert_eq!(outcome.status, RunStatus::Partial);
    assert!(
        outcome
            .reason
            .unwrap_or_default()
            .contains("claim_after_recovery"),
    );

    // The default claims a recovered run whose failures were resolved.
    let mut default = controller(BudgetLimits::unlimited());
    default.observe(timed_out(0, "search", &args), 0, &mut rng);
    default.observe(tool_ok(0, "search", &args, &result), 10, &mut rng);
    assert_eq!(default.finish(11).status, RunStatus::Complete);
}

/// A front-end that knows steps by tool does not hold its answer over the model's own failure
/// (it cannot see which later call settles it); one that knows the plan does, as `finish` would;
/// a tool's failure holds both.
#[test]
fn unclaimable_counts_model_side_failures_only_for_the_plan() {
    let mut c = controller(BudgetLimits::defaults());
    let mut rng = ConstRng(0);
    assert_eq!(c.unclaimable(StepsBy::Plan), None);
    let missing = Some(Signal::MissingStep {
        detail: "no input".into(),
    });
    c.observe(model_finished(2, missing), 0, &mut rng);
    let plan = c.unclaimable(StepsBy::Plan).unwrap_or_default();
    assert!(plan.contains("planning"), "{plan}");
    assert_eq!(c.unclaimable(StepsBy::Tool), None);
    let a = json!({"q": 1});
    c.observe(timed_out(1, "lookup", &a), 0, &mut rng);
    for by in [StepsBy::Plan, StepsBy::Tool] {
        let why = c.unclaimable(by).unwrap_or_default();
        assert!(why.contains("`lookup`"), "{by:?}: {why}");
    }
}

#[test]
fn unsettled_lists_what_finish_would_leave_unresolved_without_ending_the_run() {
    let args = json!({"q": "x"});
    let result = json!({"v": 1});
    let mut rng = SplitMix64::new(7);
    let mut c = controller(BudgetLimits::unlimited());
    c.observe(tool_ok(0, "search", &args, &result), 0, &mut rng);
    assert_eq!(c.unsettled(), vec![], "nothing open");
    c.observe(timed_out(1, "lookup", &args), 1, &mut rng);
    let open = c.unsettled();
    assert_eq!(open.len(), 1, "{open:?}");
    assert_eq!(open[0].tool.as_deref(), Some("lookup"));
    assert_eq!(open[0].step, Some(1));
    // Asking did not end the run: the failure can still be recovered.
    let d = c.observe(tool_ok(1, "lookup", &args, &result), 2, &mut rng);
    assert!(matches!(d, Directive::Continue { .. }), "{d:?}");
    assert_eq!(c.unsettled(), vec![], "recovered");
    assert_eq!(c.finish(3).status, RunStatus::Complete);
}

/// Issue 31: a tool that returns normally with an error body is read by its text, as a tool
/// that raised the same text is — `{"error": "Invalid expression."}` is the model's bad
/// argument, not an empty search — on every front-end, since they all hand the body to the
/// core. A body whose text tells nothing more, or that is only empty, stays an empty output.
#[test]
fn an_error_body_is_classified_by_its_text() {
    let class_of = |body: Value| {
        let mut c = controller(BudgetLimits::defaults());
        let args = json!({"expression": "15% * 200"});
        c.observe(tool_ok(0, "calculator", &args, &body), 0, &mut ConstRng(0));
        c.trace()
            .records()
            .find_map(|r| match &r.event {
                TraceEvent::Classified { class, .. } => Some(*class),
                _ => None,
            })
            .unwrap()
    };
    let cases = [
        (
            json!({"error": "Invalid expression."}),
            FailureClass::ArgumentInvalid,
        ),
        (
            json!({"error": {"message": "Unsupported target language en."}}),
            FailureClass::ArgumentInvalid,
        ),
        (
            json!({"error": "Tool send_email is not relevant for this scenario."}),
            FailureClass::WrongTool,
        ),
        (
            json!({"isError": true, "content": [{"type": "text", "text": "Unknown tool: frobnicate"}]}),
            FailureClass::WrongTool,
        ),
        (
            json!({"error": "search backend down"}),
            FailureClass::EmptyOutput,
        ),
        (json!({"results": []}), FailureClass::EmptyOutput),
        (json!(null), FailureClass::EmptyOutput),
    ];
    for (body, want) in cases {
        assert_eq!(class_of(body.clone()), want, "{body}");
    }
}
