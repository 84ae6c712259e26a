//! Issue 33, item 1: trust learned from evidence — the posterior moves the right way, decays
//! toward the prior, is capped, survives a round trip, and a wrong substitute caught by
//! cross-checks loses trust and stops being claimed.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use proptest::prelude::*;
use selfheal_core::{
    Amounts, BudgetLimits, ConstRng, Controller, ControllerConfig, Directive, Evidence, Judgement,
    Observation, Options, RecoveryAction, RunStatus, Signal, Source, ToolCall, Trust, TrustConfig,
};
use serde_json::{Value, json};

const ALL: [Evidence; 11] = [
    Evidence::Agreed,
    Evidence::Disagreed,
    Evidence::Accepted,
    Evidence::Rejected,
    Evidence::ContractBreach,
    Evidence::ChangedOnReread,
    Evidence::Outage,
    Evidence::OutageEnded,
    Evidence::Vindicated,
    Evidence::Convicted,
    Evidence::AgreedWrongly,
];

fn history() -> impl Strategy<Value = Vec<(usize, u64)>> {
    prop::collection::vec((0..ALL.len(), 0u64..600_000), 0..80)
}

/// Applies `h` (evidence, gap before it) to a fresh store; returns the store and the last time.
fn replay(h: &[(usize, u64)], c: &TrustConfig) -> (Trust, u64) {
    let s = Source::tool("t");
    let mut t = Trust::new();
    let mut now = 0;
    for &(e, gap) in h {
        now += gap;
        t.observe(&s, ALL[e], now, c);
    }
    (t, now)
}

proptest! {
    #[test]
    fn evidence_moves_the_posterior_the_right_way(h in history(), e in 0..ALL.len()) {
        let c = TrustConfig::default();
        let s = Source::tool("t");
        let (mut t, now) = replay(&h, &c);
        let before = t.p_right(&s, now, &c);
        t.observe(&s, ALL[e], now, &c);
        let after = t.p_right(&s, now, &c);
        match ALL[e] {
            Evidence::Agreed | Evidence::Accepted => prop_assert!(after > before, "{before} → {after}"),
            Evidence::Disagreed | Evidence::Rejected | Evidence::ContractBreach
            | Evidence::ChangedOnReread | Evidence::Convicted | Evidence::AgreedWrongly => {
                prop_assert!(after < before, "{before} → {after}")
            }
            // Taking back blame raises trust, or leaves it when no blame is left to take back.
            Evidence::Vindicated => prop_assert!(after >= before, "{before} → {after}"),
            // Availability is not correctness: an outage, or its end, leaves it.
            Evidence::Outage | Evidence::OutageEnded => prop_assert!((after - before).abs() < 1e-12),
        }
        let p = t.posterior(&s, now, &c);
        prop_assert!(p.right + p.wrong <= c.cap + 1e-9, "capped: {p:?}");
    }

    #[test]
    fn evidence_decays_toward_the_prior(h in history(), later in 1u64..100_000_000) {
        let c = TrustConfig::default();
        let s = Source::tool("t");
        let (t, now) = replay(&h, &c);
        let prior = c.prior_mean();
        let p_now = t.p_right(&s, now, &c);
        let p_later = t.p_right(&s, now + later, &c);
        prop_assert!((p_later - prior).abs() <= (p_now - prior).abs() + 1e-12,
            "{p_now} → {p_later}, prior {prior}");
        // A day of silence leaves next to nothing of any record.
        let p_day = t.p_right(&s, now + 24 * 3_600_000, &c);
        prop_assert!((p_day - prior).abs() < 1e-4, "{p_day}");
    }

    #[test]
    fn a_store_round_trips_through_bytes(h in history()) {
        let c = TrustConfig::default();
        let (t, _) = replay(&h, &c);
        let back = Trust::from_bytes(&t.to_bytes().unwrap()).unwrap();
        prop_assert_eq!(back, t);
    }
}

#[test]
fn old_evidence_cannot_outweigh_new() {
    // A long good record, then a source that turns: the cap keeps the record from hiding it.
    let c = TrustConfig::default();
    let s = Source::tool("t");
    let mut t = Trust::new();
    for i in 0..10_000 {
        t.observe(&s, Evidence::Agreed, i, &c);
    }
    let good = t.p_right(&s, 10_000, &c);
    for i in 0..5 {
        t.observe(&s, Evidence::Rejected, 10_000 + i, &c);
    }
    let turned = t.p_right(&s, 10_005, &c);
    assert!(
        good - turned > 0.05,
        "five rejections after 10,000 agreements: {good} → {turned}"
    );
}

#[test]
fn another_version_is_refused() {
    let bytes = br#"{"version": 999, "sources": {}}"#;
    assert!(Trust::from_bytes(bytes).is_err());
}

fn opts(substitute: Option<&str>) -> Options {
    let mut o = Options::all("backup_search", "big-model");
    o.substitute = substitute.map(str::to_owned);
    o
}

/// The optimistic prior (mean 0.995, above the default risk's 0.99): a source with no record
/// is claimed, so these tests see what evidence against it changes. The default prior (0.96)
/// claims nothing unchecked until evidence earns it.
fn optimistic() -> TrustConfig {
    TrustConfig {
        prior_right: 19.9,
        prior_wrong: 0.1,
        ..TrustConfig::default()
    }
}

fn controller(trust: Trust) -> Controller {
    Controller::new(ControllerConfig {
        budget: BudgetLimits::defaults(),
        policy: selfheal_core::Policy {
            trust: optimistic(),
            ..selfheal_core::Policy::default()
        },
        trust,
        ..ControllerConfig::default()
    })
    .unwrap()
}

/// One run: the primary `search` is down on step 1, the run substitutes `backup_search`,
/// whose answer the cross-check cannot judge (the primary is down). Returns the directive after
/// that verdict and the run's status.
fn outage_run(trust: Trust) -> (Directive, RunStatus, Controller) {
    let mut c = controller(trust);
    let mut rng = ConstRng(0);
    let a = json!({"q": "rust"});
    let result = json!({"hits": [1]});
    for t in 0..4 {
        let d = c.observe(
            Observation::ToolFinished {
                step: Some(1),
                call: ToolCall::failed("search", &a, "HTTP 503"),
                signal: Some(Signal::HttpStatus {
                    status: 503,
                    retry_after_ms: None,
                    message: String::new(),
                }),
                options: opts(Some("backup_search")),
                usage: Amounts::default(),
            },
            t,
            &mut rng,
        );
        let Directive::Recover { action, .. } = d else {
            panic!("expected a recovery, got {d:?}");
        };
        if matches!(action, RecoveryAction::Substitute { .. }) {
            break;
        }
    }
    let d = c.observe(
        Observation::ToolFinished {
            step: Some(1),
            call: ToolCall::returned("backup_search", &a, &result),
            signal: None,
            options: opts(None),
            usage: Amounts::default(),
        },
        10,
        &mut rng,
    );
    assert!(matches!(d, Directive::Continue { .. }), "{d:?}");
    let d = c.observe(
        Observation::Verified {
            step: Some(1),
            verifier: "cross_check",
            judgement: Judgement::Uncertain {
                reason: "`search` did not answer".into(),
            },
            options: opts(None),
        },
        11,
        &mut rng,
    );
    let status = c.finish(12).status;
    (d, status, c)
}

/// One run in which both sources answer and the cross-check of the primary's value against
/// `backup_search` disagrees; then the primary's value is confirmed by another verifier.
fn caught_run(trust: Trust, at: u64) -> Controller {
    let mut c = controller(trust);
    let mut rng = ConstRng(0);
    let a = json!({"q": "rust"});
    let result: Value = json!({"hits": [1]});
    c.observe(
        Observation::ToolFinished {
            step: Some(1),
            call: ToolCall::returned("search", &a, &result),
            signal: Some(Signal::Contradiction {
                detail: "`hits`: 1 here, 2 from `backup_search`".into(),
            }),
            options: opts(Some("backup_search")),
            usage: Amounts::default(),
        },
        at,
        &mut rng,
    );
    c.observe(
        Observation::Verified {
            step: Some(1),
            verifier: "grounding",
            judgement: Judgement::Accept,
            options: opts(Some("backup_search")),
        },
        at + 1,
        &mut rng,
    );
    c.finish(at + 2);
    c
}

#[test]
fn a_wrong_substitute_caught_by_cross_checks_loses_trust_and_stops_being_claimed() {
    let config = optimistic();
    let backup = Source::tool("backup_search");
    // With nothing known against it, the substitute's unchecked value is claimed: an outage of
    // the primary is no evidence against the substitute.
    let (d, status, mut first) = outage_run(Trust::new());
    assert!(matches!(d, Directive::Continue { .. }), "{d:?}");
    assert_eq!(status, RunStatus::Complete);
    let mut store = Trust::new();
    store.apply(&first.take_trust_reports(), &config);
    assert!(
        store.p_right(&backup, 12, &config) >= store.p_right(&Source::tool("nobody"), 12, &config),
        "the primary's outage did not count against the substitute"
    );
    // A later run catches the substitute disagreeing with the primary, whose value holds.
    let mut caught = caught_run(store.clone(), 100);
    store.apply(&caught.take_trust_reports(), &config);
    let p = store.p_right(&backup, 103, &config);
    assert!(
        p < 0.99,
        "the disagreement costs the substitute its standing: {p}"
    );
    assert!(
        store.p_right(&Source::tool("search"), 103, &config) > p,
        "the source whose value was confirmed keeps more"
    );
    // The next outage: the substitute's unchecked value is no longer claimed. It is read and
    // checked again (a retry) or, when that cannot be, flagged — never taken as it is.
    let (d, status, _) = outage_run(store);
    assert!(
        matches!(d, Directive::Degrade { ref reason } if reason.contains("could not be verified"))
            || matches!(
                d,
                Directive::Recover {
                    action: RecoveryAction::Retry { .. },
                    ..
                }
            ),
        "{d:?}"
    );
    assert_eq!(status, RunStatus::Partial);
}

#[test]
fn trust_within_one_run_counts_at_once() {
    // The run's own copy is updated as evidence arrives: a disagreement earlier in the run
    // already withholds the substitute's value later in the same run.
    let config = optimistic();
    let mut c = controller(Trust::new());
    let mut rng = ConstRng(0);
    let a = json!({"q": "rust"});
    let result = json!({"hits": [1]});
    c.observe(
        Observation::ToolFinished {
            step: Some(0),
            call: ToolCall::returned("search", &a, &result),
            signal: Some(Signal::Contradiction {
                detail: "disagree".into(),
            }),
            options: opts(Some("backup_search")),
            usage: Amounts::default(),
        },
        0,
        &mut rng,
    );
    assert!(
        c.trust()
            .p_right(&Source::tool("backup_search"), 0, &config)
            < 0.99
    );
}

fn call_on<'a>(
    tool: &'a str,
    args: &'a Value,
    result: &'a Value,
    signal: Option<Signal>,
) -> Observation<'a> {
    Observation::ToolFinished {
        step: Some(1),
        call: ToolCall::returned(tool, args, result),
        signal,
        options: opts(Some("backup_search")),
        usage: Amounts::default(),
    }
}

fn verdict_on(verifier: &str, judgement: Judgement) -> Observation<'_> {
    Observation::Verified {
        step: Some(1),
        verifier,
        judgement,
        options: opts(Some("backup_search")),
    }
}

/// `n` runs in which `search`'s value and `backup_search`'s agree at once; with `dispute`,
/// the first run's first reading of `search` disagreed, and `search` read again (a refresh)
/// brought `backup_search`'s value.
fn agreeing_runs(n: u64, dispute: bool) -> Trust {
    let mut trust = Trust::new();
    let a = json!({"q": "rust"});
    let wrong = json!({"hits": [9]});
    let right = json!({"hits": [1]});
    for i in 0..n {
        let mut c = controller(trust.clone());
        let mut rng = ConstRng(0);
        let t = i * 1_000;
        if dispute && i == 0 {
            let contradiction = Signal::Contradiction {
                detail: "`hits`: 9 here, 1 from `backup_search`".into(),
            };
            let d = c.observe(
                call_on("search", &a, &wrong, Some(contradiction)),
                t,
                &mut rng,
            );
            assert!(matches!(d, Directive::Recover { .. }), "{d:?}");
        }
        c.observe(call_on("search", &a, &right, None), t + 1, &mut rng);
        c.observe(
            verdict_on("cross_check", Judgement::Accept),
            t + 2,
            &mut rng,
        );
        c.finish(t + 3);
        trust.apply(&c.take_trust_reports(), &optimistic());
    }
    trust
}

#[test]
fn a_disagreement_settled_by_a_later_read_is_blamed_on_the_side_that_changed() {
    let c = optimistic();
    let backup = Source::tool("backup_search");
    let search = Source::tool("search");
    let now = 20_000;
    let disputed = agreeing_runs(20, true);
    let clean = agreeing_runs(20, false);
    // `search` changed its value to agree: the disagreement was its wrong value, wholly.
    let p = disputed.posterior(&search, now, &c);
    assert!((p.wrong - 1.0).abs() < 0.01, "{p:?}");
    // `backup_search` was right all along: its record is that of a source never disputed.
    let (p_disputed, p_clean) = (
        disputed.p_right(&backup, now, &c),
        clean.p_right(&backup, now, &c),
    );
    assert!(
        (p_disputed - p_clean).abs() < 1e-3,
        "{p_disputed} vs {p_clean}"
    );
}

#[test]
fn a_disagreement_the_other_side_gives_way_on_is_blamed_on_it() {
    // `search` read again gives the same value, and `backup_search` now agrees with it: the
    // second source changed, and carries the blame.
    let c = optimistic();
    let mut ctl = controller(Trust::new());
    let mut rng = ConstRng(0);
    let a = json!({"q": "rust"});
    let v = json!({"hits": [1]});
    let contradiction = Signal::Contradiction {
        detail: "`hits`: 1 here, 9 from `backup_search`".into(),
    };
    ctl.observe(call_on("search", &a, &v, Some(contradiction)), 0, &mut rng);
    ctl.observe(call_on("search", &a, &v, None), 1, &mut rng);
    ctl.observe(verdict_on("cross_check", Judgement::Accept), 2, &mut rng);
    let t = ctl.trust();
    assert!(t.posterior(&Source::tool("search"), 3, &c).wrong < 0.01);
    let p = t.posterior(&Source::tool("backup_search"), 3, &c);
    assert!((p.wrong - 1.0).abs() < 0.01, "{p:?}");
}

#[test]
fn two_sources_agreeing_on_a_value_a_verifier_rejects_gain_no_trust() {
    let c = optimistic();
    let mut ctl = controller(Trust::new());
    let mut rng = ConstRng(0);
    let a = json!({"q": "rust"});
    let v = json!({"hits": [9]});
    ctl.observe(call_on("search", &a, &v, None), 0, &mut rng);
    ctl.observe(verdict_on("cross_check", Judgement::Accept), 1, &mut rng);
    ctl.observe(
        verdict_on(
            "grounding",
            Judgement::Reject {
                reason: "9 is not what the task's data says".into(),
            },
        ),
        2,
        &mut rng,
    );
    for name in ["search", "backup_search"] {
        let p = ctl.trust().posterior(&Source::tool(name), 3, &c);
        assert!(p.right < 0.01, "{name}: the agreement is taken back: {p:?}");
        assert!(p.wrong > 0.99, "{name}: the value was wrong: {p:?}");
        assert!(ctl.trust().p_right(&Source::tool(name), 3, &c) < c.prior_mean());
    }
}
