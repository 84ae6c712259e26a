//! Integration tests of the recovery policy: TOML files and ladder climbing.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use selfheal_core::{
    ActionKind, BudgetLedger, BudgetLimits, Classification, ConstRng, FailureClass, LadderState,
    Options, Policy, PolicyError, RecoveryAction, SkipReason,
};

fn failure(class: FailureClass) -> Classification {
    Classification {
        class,
        error_type: class.default_error_type(),
        retry_after_ms: None,
    }
}

/// Climbs a class's ladder until it ends, returning the kinds taken.
fn climb(
    p: &Policy,
    class: FailureClass,
    opts: &Options,
    ledger: &mut BudgetLedger,
) -> Vec<ActionKind> {
    let mut state = LadderState::default();
    let mut taken = Vec::new();
    for _ in 0..100 {
        let d = p.decide(state, &failure(class), opts, ledger, &mut ConstRng(0));
        assert!(
            ledger.charge(&d.charge).is_ok(),
            "policy chose an unaffordable action"
        );
        let kind = d.action.kind();
        taken.push(kind);
        if kind.is_terminal() {
            return taken;
        }
        assert!(d.next.rung > state.rung, "the ladder must advance");
        state = d.next;
    }
    panic!("the ladder never ended: {taken:?}");
}

#[test]
fn default_policy_round_trips_through_toml() {
    let p = Policy::default();
    let s = p.to_toml_string().unwrap();
    for class in FailureClass::ALL {
        assert!(s.contains(class.as_str()), "{class} missing from\n{s}");
    }
    assert_eq!(Policy::from_toml_str(&s).unwrap(), p);
}

#[test]
fn customised_policy_round_trips_through_toml() {
    let mut p = Policy::default();
    p.retry.base_ms = 123;
    p.retry.jitter = 0.0;
    p.ladders.insert(
        FailureClass::EmptyOutput,
        vec![ActionKind::Substitute, ActionKind::Terminate],
    );
    p.ladders.insert(FailureClass::StaleContext, vec![]);
    let back = Policy::from_toml_str(&p.to_toml_string().unwrap()).unwrap();
    assert_eq!(back, p);
    assert!(back.ladder(FailureClass::StaleContext).is_empty());
}

#[test]
fn every_default_ladder_ends_in_a_terminal_action() {
    let p = Policy::default();
    for class in FailureClass::ALL {
        let ladder = p.ladder(class);
        assert!(
            ladder.last().is_some_and(|a| a.is_terminal()),
            "{class}: {ladder:?}"
        );
    }
}

#[test]
fn file_with_several_errors_is_rejected_naming_the_first() {
    // Unknown class, unknown action and an out-of-range factor: the parser stops at the first
    // problem and says where it is.
    let file =
        "[retry]\nfactor = 0.5\n\n[ladders]\nflaky = [\"retry\"]\ntool_timeout = [\"pray\"]\n";
    let err = Policy::from_toml_str(file).unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, PolicyError::Parse(_)), "{msg}");
    assert!(msg.starts_with("invalid policy file"), "{msg}");
    assert!(msg.contains("flaky"), "{msg}");
    assert!(msg.contains("line 5"), "points at the line: {msg}");
}

#[test]
fn file_with_several_invalid_values_reports_every_one() {
    let file = "[retry]\nfactor = 0.5\njitter = 2.0\nbase_ms = 90000\n\n[ladders]\ntool_timeout = [\"degrade\", \"retry\"]\n";
    let err = Policy::from_toml_str(file).unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, PolicyError::Invalid(_)), "{msg}");
    for needle in ["factor", "jitter", "base_ms", "tool_timeout"] {
        assert!(msg.contains(needle), "missing {needle}: {msg}");
    }
}

#[test]
fn unknown_top_level_table_and_wrong_types_are_rejected() {
    for (file, needle) in [
        ("[retries]\nbase_ms = 1\n", "retries"),
        ("[retry]\nbase_ms = \"fast\"\n", "base_ms"),
        ("[retry]\nbackoff = 2\n", "backoff"),
        ("[ladders]\ntool_timeout = \"retry\"\n", "tool_timeout"),
        ("this is not toml", "invalid policy file"),
    ] {
        let err = Policy::from_toml_str(file).expect_err(file);
        assert!(err.to_string().contains(needle), "{file}: {err}");
    }
}

#[test]
fn empty_file_is_the_default_policy() {
    assert_eq!(Policy::from_toml_str("").unwrap(), Policy::default());
}

#[test]
fn default_tool_timeout_ladder_is_climbed_to_degrade() {
    let p = Policy::default();
    let mut ledger = BudgetLedger::new(BudgetLimits::unlimited());
    let taken = climb(
        &p,
        FailureClass::ToolTimeout,
        &Options::all("alt", "big"),
        &mut ledger,
    );
    assert_eq!(
        taken,
        vec![
            ActionKind::Retry,
            ActionKind::Retry,
            ActionKind::Substitute,
            ActionKind::Replan,
            ActionKind::Escalate,
            ActionKind::Degrade
        ]
    );
}

#[test]
fn every_default_ladder_ends_within_its_length_under_any_budget() {
    let p = Policy::default();
    for limits in [
        BudgetLimits::unlimited(),
        BudgetLimits::defaults(),
        BudgetLimits::defaults().with_recoveries(0),
    ] {
        for class in FailureClass::ALL {
            let mut ledger = BudgetLedger::new(limits);
            let taken = climb(&p, class, &Options::all("alt", "big"), &mut ledger);
            assert!(
                taken.len() <= p.ladder(class).len() + 1,
                "{class}: {taken:?}"
            );
        }
    }
}

#[test]
fn without_partial_result_degrade_becomes_terminate() {
    let p = Policy::default();
    let mut opts = Options::all("alt", "big");
    opts.partial_result = false;
    let mut ledger = BudgetLedger::new(BudgetLimits::unlimited().with_recoveries(0));
    let taken = climb(&p, FailureClass::ToolTimeout, &opts, &mut ledger);
    assert_eq!(taken, vec![ActionKind::Terminate]);
}

#[test]
fn escalation_falls_back_to_a_human_and_is_skipped_without_one() {
    let p = Policy::from_toml_str("[ladders]\nplanning_failure = [\"escalate\", \"degrade\"]\n")
        .unwrap();
    let ledger = BudgetLedger::new(BudgetLimits::unlimited());
    let f = failure(FailureClass::PlanningFailure);
    let mut opts = Options {
        human_available: true,
        partial_result: true,
        ..Options::default()
    };
    let d = p.decide(LadderState::default(), &f, &opts, &ledger, &mut ConstRng(0));
    assert!(matches!(d.action, RecoveryAction::Escalate { .. }));
    opts.human_available = false;
    let d = p.decide(LadderState::default(), &f, &opts, &ledger, &mut ConstRng(0));
    assert_eq!(d.action, RecoveryAction::Degrade);
    assert_eq!(
        d.skipped,
        vec![(ActionKind::Escalate, SkipReason::NotApplicable)]
    );
}

#[test]
fn retry_is_skipped_when_unsafe() {
    let p = Policy::default();
    let ledger = BudgetLedger::new(BudgetLimits::unlimited());
    let mut opts = Options::all("alt", "big");
    opts.retry_safe = false;
    let d = p.decide(
        LadderState::default(),
        &failure(FailureClass::ToolTimeout),
        &opts,
        &ledger,
        &mut ConstRng(0),
    );
    assert_eq!(d.action.kind(), ActionKind::Substitute);
    assert_eq!(
        d.skipped,
        vec![
            (ActionKind::Retry, SkipReason::NotApplicable),
            (ActionKind::Retry, SkipReason::NotApplicable)
        ]
    );
}

#[test]
fn retry_delay_honours_retry_after() {
    let p = Policy::default();
    let ledger = BudgetLedger::new(BudgetLimits::unlimited());
    let f = Classification {
        retry_after_ms: Some(7_000),
        ..failure(FailureClass::ToolTimeout)
    };
    let d = p.decide(
        LadderState::default(),
        &f,
        &Options::all("a", "b"),
        &ledger,
        &mut ConstRng(u64::MAX),
    );
    assert_eq!(
        d.action,
        RecoveryAction::Retry {
            delay_ms: 7_000,
            attempt: 1
        }
    );
}

#[test]
fn an_outage_on_the_first_call_is_retried_once_before_the_substitute() {
    let p = Policy::default();
    let ledger = BudgetLedger::new(BudgetLimits::unlimited());
    let opts = Options::all("alt", "big");
    let mut rng = ConstRng(0);
    let f = Classification {
        class: FailureClass::ToolUnavailable,
        error_type: FailureClass::ToolUnavailable.default_error_type(),
        retry_after_ms: None,
    };
    let d1 = p.decide(LadderState::default(), &f, &opts, &ledger, &mut rng);
    assert!(
        matches!(d1.action, RecoveryAction::Retry { attempt: 1, .. }),
        "{d1:?}"
    );
    let d2 = p.decide(d1.next, &f, &opts, &ledger, &mut rng);
    assert!(
        matches!(d2.action, RecoveryAction::Substitute { .. }),
        "{d2:?}"
    );
    // A failure that was retried twice as a timeout before it looked like an outage is not
    // retried a third time.
    let retried = LadderState {
        rung: 0,
        retries: 2,
        actions: 2,
    };
    let d = p.decide(retried, &f, &opts, &ledger, &mut rng);
    assert!(
        matches!(d.action, RecoveryAction::Substitute { .. }),
        "{d:?}"
    );
    assert_eq!(
        d.skipped,
        vec![(ActionKind::Retry, SkipReason::AlreadyTaken)]
    );
}

#[test]
fn every_recovered_value_is_in_doubt() {
    for class in FailureClass::ALL {
        let about_the_value = matches!(
            class,
            FailureClass::ContradictoryEvidence | FailureClass::VerificationFailure
        );
        assert_eq!(Policy::in_doubt(class, None), about_the_value, "{class}");
        for action in ActionKind::ALL {
            assert_eq!(
                Policy::in_doubt(class, Some(action)),
                about_the_value || !action.is_terminal(),
                "{class} {action}"
            );
        }
    }
    assert_eq!(Policy::default().accept_unverified_recovery, None);
    let p = Policy::from_toml_str("accept_unverified_recovery = true").unwrap();
    assert_eq!(p.accept_unverified_recovery, Some(true));
    assert!(
        p.claims_unverified(Some(0.0)),
        "the override wins over any trust"
    );
    let p = Policy::from_toml_str("accept_unverified_recovery = false").unwrap();
    assert!(!p.claims_unverified(Some(1.0)));
}

#[test]
fn the_reads_before_answering_are_set_in_the_file_and_never_zero() {
    assert_eq!(Policy::default().reread_count(), 2);
    assert_eq!(
        Policy::from_toml_str("reread_reads = 3")
            .unwrap()
            .reread_count(),
        3
    );
    let err = Policy::from_toml_str("reread_reads = 0").unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, PolicyError::Invalid(_)), "{msg}");
    assert!(msg.contains("reread_reads"), "{msg}");
}

#[test]
fn risk_and_trust_are_read_from_the_file_and_checked() {
    let p = Policy::from_toml_str("risk = 0.05\n[trust]\nprior_right = 9.0\nprior_wrong = 1.0\n")
        .unwrap();
    assert_eq!(p.risk, 0.05);
    assert_eq!(p.trust.prior_right, 9.0);
    // A source at 0.9 is below 1 − 0.05; at 0.96 above.
    assert!(!p.claims_unverified(Some(0.9)));
    assert!(p.claims_unverified(Some(0.96)));
    assert!(
        !p.claims_unverified(None),
        "a value of no known source is not claimed"
    );
    // A smaller risk asks for more reads before answering; risk 0 claims nothing after a recovery.
    let strict = Policy::from_toml_str("risk = 0.001").unwrap();
    assert!(strict.reread_count() > Policy::default().reread_count());
    let zero = Policy::from_toml_str("risk = 0.0").unwrap();
    assert!(!zero.claims_after_recovery());
    assert!(Policy::default().claims_after_recovery());
    for bad in [
        "risk = 1.5",
        "risk = -0.1",
        "[trust]\nprior_wrong = 0.0",
        "[trust]\ncap = 0.5",
    ] {
        let err = Policy::from_toml_str(bad).unwrap_err();
        assert!(matches!(err, PolicyError::Invalid(_)), "{bad}: {err}");
    }
}
