//! What each strategy can and cannot do against single faults of the default model, on the
//! first built-in task (capital → weather → convert). These pin properties of the world and of
//! the strategies' mechanics, never a headline score. The models' own errors are switched off
//! (`ModelRates::PERFECT`) so that each test meets its one fault and nothing else.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use selfheal_bench::Episode;
use selfheal_bench::Strategy;
use selfheal_bench::{BenchConfig, run};
use selfheal_bench::{FaultModel, Injected};
use selfheal_bench::{TaskSpec, builtin};
use selfheal_core::{Evidence, Policy, Source, Trust};

/// The default policy, but never taking such a value, whatever its source's trust.
fn refusing() -> Policy {
    Policy {
        accept_unverified_recovery: Some(false),
        ..Policy::default()
    }
}

/// The optimistic trust prior (mean 0.995, above the default risk's 0.99): a substitute with no
/// record is claimed. The default prior (0.96) claims nothing unchecked until evidence earns it.
fn optimistic() -> Policy {
    let d = Policy::default();
    Policy {
        trust: selfheal_core::TrustConfig {
            prior_right: 19.9,
            prior_wrong: 0.1,
            ..d.trust
        },
        ..d
    }
}

#[derive(Debug, PartialEq, Eq)]
enum Verdict {
    Correct,
    Wrong,
    NoAnswer,
}

fn perfect_model() -> FaultModel {
    let mut model = FaultModel::default_model().unwrap();
    model.model = selfheal_bench::ModelRates::PERFECT;
    model
}

fn one(name: &str, step: usize, permanent: bool, k: u32, skew: f64) -> (FaultModel, Injected) {
    let model = perfect_model();
    let spec = model.faults.iter().position(|f| f.name == name).unwrap();
    (
        model,
        Injected {
            step,
            spec,
            permanent,
            k,
            skew,
        },
    )
}

fn play(task: &TaskSpec, model: &FaultModel, f: Injected, s: Strategy, r: u32) -> (Verdict, u64) {
    play_with(task, model, f, s, r, None)
}

fn play_with(
    task: &TaskSpec,
    model: &FaultModel,
    f: Injected,
    s: Strategy,
    r: u32,
    policy: Option<&Policy>,
) -> (Verdict, u64) {
    let mut ep = Episode::new(task, &[f], model, 7);
    let ended = s.run(&mut ep, r, policy, 7, false);
    (
        verdict(task, ended.answer.as_ref()),
        ep.costs().verifier_calls,
    )
}

fn verdict(task: &TaskSpec, answer: Option<&serde_json::Value>) -> Verdict {
    match answer {
        None => Verdict::NoAnswer,
        Some(a) if selfheal_bench::ANSWER_TOLERANCE.agrees(a, &task.expected) => Verdict::Correct,
        Some(_) => Verdict::Wrong,
    }
}

#[test]
fn a_transient_timeout_fails_static_but_not_retry_only() {
    let task = &builtin(1)[0];
    let (m, f) = one("timeout", 1, false, 1, 0.0);
    assert_eq!(play(task, &m, f, Strategy::Static, 5).0, Verdict::NoAnswer);
    assert_eq!(
        play(task, &m, f, Strategy::RetryOnly, 5).0,
        Verdict::Correct
    );
}

#[test]
fn a_permanent_503_needs_a_substitute_not_a_retry() {
    let task = &builtin(1)[0];
    let (m, f) = one("unavailable_503", 1, true, 1, 0.0);
    assert_eq!(
        play(task, &m, f, Strategy::RetryOnly, 5).0,
        Verdict::NoAnswer
    );
    // react switches tools on a permanent-looking failure, as does self-healing.
    assert_eq!(play(task, &m, f, Strategy::React, 5).0, Verdict::Correct);
    // The substitute's answer cannot be checked against a primary that is down: a policy
    // that refuses unverified recoveries does not claim it, nor does the default (a substitute
    // with no record stands below the default risk); the optimistic prior claims it while
    // nothing speaks against the substitute (the primary's outage does not).
    assert_eq!(
        play_with(task, &m, f, Strategy::SelfHealing, 5, Some(&refusing())).0,
        Verdict::NoAnswer
    );
    assert_eq!(
        play(task, &m, f, Strategy::SelfHealing, 5).0,
        Verdict::NoAnswer
    );
    assert_eq!(
        play_with(task, &m, f, Strategy::SelfHealing, 5, Some(&optimistic())).0,
        Verdict::Correct
    );
}

#[test]
fn a_wrong_substitute_behind_a_dead_primary_is_not_claimed() {
    // The primary is down for good and the substitute is wrong: whoever takes the substitute's
    // answer unchecked returns a wrong one.
    let task = &builtin(2)[1];
    let model = perfect_model();
    let at = |name: &str| model.faults.iter().position(|f| f.name == name).unwrap();
    let faults = [
        Injected {
            step: 1,
            spec: at("unavailable_503"),
            permanent: true,
            k: 1,
            skew: 0.0,
        },
        Injected {
            step: 1,
            spec: at("substitute_wrong"),
            permanent: true,
            k: 1,
            skew: 0.08,
        },
    ];
    let run = |s: Strategy, policy: Option<&Policy>, trust: &mut Trust| {
        let mut ep = Episode::new(task, &faults, &model, 7);
        let ended = s.run_with_trust(&mut ep, 5, policy, 7, false, trust);
        verdict(task, ended.answer.as_ref())
    };
    assert_eq!(
        run(Strategy::React, None, &mut Trust::new()),
        Verdict::Wrong
    );
    assert_eq!(
        run(Strategy::SelfHealing, Some(&refusing()), &mut Trust::new()),
        Verdict::NoAnswer
    );
    // The default does not claim a substitute with no record.
    assert_eq!(
        run(Strategy::SelfHealing, None, &mut Trust::new()),
        Verdict::NoAnswer
    );
    // Under the optimistic prior nothing is known against the substitute: one run has no
    // evidence to tell it is wrong.
    let optimistic = optimistic();
    assert_eq!(
        run(Strategy::SelfHealing, Some(&optimistic), &mut Trust::new()),
        Verdict::Wrong
    );
    // A deployment that caught the substitute disagreeing with its primary before no longer
    // claims its unchecked value.
    let step_tool = &task.plan.steps[1].tool;
    let sub = task
        .plan
        .tools
        .iter()
        .find(|t| t.name == *step_tool)
        .and_then(|t| t.substitute.clone())
        .unwrap();
    let config = optimistic.trust;
    let mut caught = Trust::new();
    caught.observe(&Source::tool(&sub), Evidence::Disagreed, 0, &config);
    assert_eq!(
        run(Strategy::SelfHealing, Some(&optimistic), &mut caught),
        Verdict::NoAnswer
    );
}

#[test]
fn a_provider_outage_has_no_fix_and_self_healing_degrades_cleanly() {
    let task = &builtin(1)[0];
    let (m, f) = one("provider_outage", 1, true, 1, 0.0);
    for s in Strategy::ALL {
        assert_eq!(
            play(task, &m, f, s, 5).0,
            Verdict::NoAnswer,
            "{}",
            s.as_str()
        );
    }
}

#[test]
fn a_plausible_wrong_value_is_silent_without_the_cross_check_and_caught_with_it() {
    // Task 1: currency → FX rate → multiply. The rate off by 8 %: far outside the feeds'
    // tolerance. (Near 0 °C the same skew on a temperature hides inside the stations' noise.)
    let task = &builtin(2)[1];
    let (m, f) = one("plausible_wrong", 1, true, 1, 0.08);
    assert_eq!(play(task, &m, f, Strategy::React, 5).0, Verdict::Wrong);
    let (v, verifier_calls) = play(task, &m, f, Strategy::ReactVerify, 5);
    assert_ne!(v, Verdict::Wrong);
    assert!(verifier_calls > 0, "the cross-check is a charged call");
    assert_ne!(
        play(task, &m, f, Strategy::SelfHealing, 5).0,
        Verdict::Wrong
    );
}

#[test]
fn both_sources_wrong_fools_every_cross_check() {
    let task = &builtin(2)[1];
    let (m, f) = one("both_wrong", 1, true, 1, 0.08);
    for s in [Strategy::ReactVerify, Strategy::SelfHealing] {
        assert_eq!(play(task, &m, f, s, 5).0, Verdict::Wrong, "{}", s.as_str());
    }
}

#[test]
fn a_cut_body_is_not_repaired_into_an_answer() {
    let task = &builtin(1)[0];
    // Permanently cut on the primary: repair must refuse; the substitute has the data, but the
    // cut primary cannot confirm it, so a policy that refuses unverified recoveries does not
    // take it, nor does the default; the optimistic prior takes it while nothing speaks against
    // the substitute.
    let (m, f) = one("truncated", 1, true, 1, 0.0);
    assert_eq!(
        play_with(task, &m, f, Strategy::SelfHealing, 5, Some(&refusing())).0,
        Verdict::NoAnswer
    );
    assert_eq!(
        play(task, &m, f, Strategy::SelfHealing, 5).0,
        Verdict::NoAnswer
    );
    let optimistic = optimistic();
    assert_eq!(
        play_with(task, &m, f, Strategy::SelfHealing, 5, Some(&optimistic)).0,
        Verdict::Correct
    );
    let mut ep = Episode::new(task, &[f], &m, 7);
    Strategy::SelfHealing.run(&mut ep, 5, Some(&optimistic), 7, false);
    assert!(
        ep.costs().tool_calls >= 3,
        "the step was fetched again, not invented"
    );
}

#[test]
fn the_detectors_are_fallible_and_escalation_is_priced() {
    let config = BenchConfig {
        fault_rate: 0.3,
        seeds: 4,
        strategies: vec![Strategy::SelfHealing],
        ..BenchConfig::default()
    };
    let report = run(&config, &mut |_, _| {}, None);
    let d = &report.details[0];
    assert!(d.verifier.false_alarms > 0, "{:?}", d.verifier);
    assert!(d.verifier.misses > 0, "{:?}", d.verifier);
    assert!(d.escalated_calls > 0.0);
    let c = &report.confusion[0];
    assert!(
        c.correct < c.total,
        "the classifier is never perfect here: {c:?}"
    );
    // Escalation has its own price: with a fallback weight of 0 K falls.
    let cheap = BenchConfig {
        weights: selfheal_bench::CostWeights::parse("1,1,1,1,0").unwrap(),
        ..config
    };
    let cheaper = run(&cheap, &mut |_, _| {}, None);
    assert!(cheaper.results[0].cost < report.results[0].cost);
}

/// A calculator has no second source: a run that went well takes its number as it comes, and a
/// run that needed a recovery reads it again before answering, which catches a wrong number that
/// has cleared by then. Mechanics, not a score.
#[test]
fn a_recovered_run_reads_the_calculator_again_before_answering() {
    let task = &builtin(1)[0];
    let (model, timeout) = one("timeout", 1, false, 1, 0.0);
    let (_, glitch) = one("wrong_calculator", 2, false, 1, 0.05);
    let answer = |faults: &[Injected], s: Strategy| {
        let mut ep = Episode::new(task, faults, &model, 7);
        let ended = s.run(&mut ep, 5, None, 7, false);
        verdict(task, ended.answer.as_ref())
    };
    assert_eq!(
        answer(&[timeout, glitch], Strategy::SelfHealing),
        Verdict::Correct
    );
    assert_eq!(answer(&[glitch], Strategy::SelfHealing), Verdict::Wrong);
    assert_eq!(
        answer(&[timeout, glitch], Strategy::ReactVerify),
        Verdict::Wrong
    );
}
