//! Hand-made episodes with one chosen fault: each strategy fixes exactly what its design allows.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use selfheal_bench::catalogue::{Group, Task, tasks};
use selfheal_bench::env::{Env, values_equal};
use selfheal_bench::faults::{Fault, FaultKind, Persistence, Signalling};
use selfheal_bench::strategies::{
    Ended, run_full_replan, run_react, run_retry_only, run_self_healing, run_static,
};
use selfheal_core::rng::SplitMix64;

/// Task 0: capital → weather → convert (two external steps with substitutes, one local).
fn task0() -> Task {
    let t = tasks().swap_remove(0);
    assert_eq!(
        t.steps.iter().map(|s| s.group).collect::<Vec<_>>(),
        [Group::Capital, Group::Weather, Group::Convert]
    );
    t
}

fn fault(step: usize, kind: FaultKind, persistence: Persistence, signalling: Signalling) -> Fault {
    Fault {
        step,
        kind,
        persistence,
        signalling,
        correlated: false,
        repairable: false,
    }
}

const ONCE: Persistence = Persistence::Transient { k: 1 };
const PERM: Persistence = Persistence::Permanent;

#[derive(Debug, PartialEq)]
enum Verdict {
    Correct,
    /// A wrong answer returned as complete.
    Silent,
    /// No answer.
    Failed,
}

fn verdict(task: &Task, env: &Env<'_>, ended: &Ended) -> Verdict {
    match &ended.answer {
        None => Verdict::Failed,
        Some(a) => {
            assert_eq!(env.answer_is_correct(a), values_equal(a, &task.oracle));
            if values_equal(a, &task.oracle) {
                Verdict::Correct
            } else {
                Verdict::Silent
            }
        }
    }
}

fn static_(task: &Task, f: Fault) -> Verdict {
    let mut env = Env::new(task, &[f]);
    let e = run_static(&mut env);
    verdict(task, &env, &e)
}

fn retry(task: &Task, f: Fault, r: u32) -> (Verdict, u64) {
    let mut env = Env::new(task, &[f]);
    let e = run_retry_only(&mut env, r, &mut SplitMix64::new(1));
    (verdict(task, &env, &e), env.costs.recoveries)
}

fn react(task: &Task, f: Fault, r: u32) -> Verdict {
    let mut env = Env::new(task, &[f]);
    let e = run_react(&mut env, r, &mut SplitMix64::new(1));
    verdict(task, &env, &e)
}

fn replan(task: &Task, f: Fault, r: u32) -> Verdict {
    let mut env = Env::new(task, &[f]);
    let e = run_full_replan(&mut env, r);
    verdict(task, &env, &e)
}

fn healing(task: &Task, f: Fault, r: u32) -> (Verdict, u64) {
    let mut env = Env::new(task, &[f]);
    let e = run_self_healing(&mut env, None, r, 7, false);
    (verdict(task, &env, &e), env.costs.recoveries)
}

#[test]
fn without_faults_every_strategy_answers_correctly() {
    let t = &task0();
    let mut env = Env::new(t, &[]);
    let e = run_static(&mut env);
    assert_eq!(verdict(t, &env, &e), Verdict::Correct);
    assert_eq!(env.costs.recoveries, 0);
    let mut env = Env::new(t, &[]);
    let e = run_self_healing(&mut env, None, 5, 1, false);
    assert_eq!(verdict(t, &env, &e), Verdict::Correct);
    assert_eq!(env.costs.recoveries, 0);
}

#[test]
fn a_transient_timeout_fails_static_but_not_retry_only() {
    let t = &task0();
    let f = fault(0, FaultKind::Timeout, ONCE, Signalling::Explicit);
    assert_eq!(static_(t, f), Verdict::Failed);
    let (v, recoveries) = retry(t, f, 2);
    assert_eq!(v, Verdict::Correct);
    assert_eq!(
        recoveries, 1,
        "one retry clears a fault that lasts one attempt"
    );
    // Two attempts' worth of fault needs two retries: R = 1 is not enough.
    let f2 = fault(
        0,
        FaultKind::Timeout,
        Persistence::Transient { k: 2 },
        Signalling::Explicit,
    );
    assert_eq!(retry(t, f2, 1).0, Verdict::Failed);
    assert_eq!(retry(t, f2, 2).0, Verdict::Correct);
}

#[test]
fn a_permanent_503_needs_a_substitute_not_a_retry() {
    let t = &task0();
    let f = fault(0, FaultKind::Unavailable, PERM, Signalling::Explicit);
    assert_eq!(static_(t, f), Verdict::Failed);
    assert_eq!(retry(t, f, 5).0, Verdict::Failed);
    assert_eq!(
        react(t, f, 2),
        Verdict::Correct,
        "react switches to the substitute"
    );
    assert_eq!(
        replan(t, f, 2),
        Verdict::Correct,
        "full-replan avoids the failed tool"
    );
    assert_eq!(healing(t, f, 2).0, Verdict::Correct);
}

#[test]
fn resending_the_same_broken_arguments_does_not_fix_them() {
    let t = &task0();
    let f = fault(0, FaultKind::MalformedArgs, ONCE, Signalling::Explicit);
    assert_eq!(static_(t, f), Verdict::Failed);
    assert_eq!(
        retry(t, f, 2).0,
        Verdict::Failed,
        "retry-only resends the same call"
    );
    assert_eq!(react(t, f, 2), Verdict::Correct, "react rewrites the call");
    assert_eq!(healing(t, f, 2).0, Verdict::Correct);
}

#[test]
fn plausible_wrong_is_silent_for_the_baselines_and_caught_by_the_cross_check() {
    let ts = tasks();
    // A wrong number (temperature, exchange rate, document figure) flows through the
    // calculators unnoticed.
    for (t, step) in [(&ts[0], 1), (&ts[1], 1), (&ts[3], 1)] {
        assert!(t.steps[step].group.is_external());
        let f = fault(step, FaultKind::PlausibleWrong, PERM, Signalling::Implicit);
        assert_eq!(static_(t, f), Verdict::Silent, "static, step {step}");
        assert_eq!(retry(t, f, 5).0, Verdict::Silent, "retry-only, step {step}");
        assert_eq!(react(t, f, 5), Verdict::Silent, "react, step {step}");
        assert_eq!(replan(t, f, 5), Verdict::Silent, "full-replan, step {step}");
        let mut env = Env::new(t, &[f]);
        let e = run_self_healing(&mut env, None, 2, 7, false);
        assert_eq!(
            verdict(t, &env, &e),
            Verdict::Correct,
            "self-healing, step {step}"
        );
        assert!(env.costs.verifier_calls >= 1);
        assert!(
            env.costs.recoveries >= 1,
            "the rejection must trigger a recovery"
        );
    }
    // Step 0 (the city): a wrong name breaks the next lookup, so static fails loudly; the
    // cross-check still catches it before it is used.
    let t = &task0();
    let f = fault(0, FaultKind::PlausibleWrong, PERM, Signalling::Implicit);
    assert_eq!(static_(t, f), Verdict::Failed);
    assert_eq!(healing(t, f, 2).0, Verdict::Correct);
}

#[test]
fn a_permanent_missing_step_is_fixed_by_self_healing_within_r_2() {
    let t = &task0();
    let f = fault(0, FaultKind::MissingStep, PERM, Signalling::Explicit);
    assert_eq!(static_(t, f), Verdict::Failed);
    assert_eq!(retry(t, f, 5).0, Verdict::Failed);
    let (v, recoveries) = healing(t, f, 2);
    assert_eq!(v, Verdict::Correct);
    assert!(
        recoveries <= 2,
        "replan then escalate: {recoveries} actions"
    );
}

#[test]
fn stale_values_are_refreshed_or_substituted_by_self_healing() {
    let t = &task0();
    for p in [ONCE, PERM] {
        let f = fault(1, FaultKind::Stale, p, Signalling::Implicit);
        assert_eq!(static_(t, f), Verdict::Silent, "{p:?}");
        assert_eq!(retry(t, f, 5).0, Verdict::Silent, "{p:?}");
        let (v, recoveries) = healing(t, f, 2);
        assert_eq!(v, Verdict::Correct, "{p:?}");
        assert!(recoveries >= 1, "{p:?}");
    }
}

#[test]
fn retry_only_spends_at_most_r_recoveries_per_failure() {
    let t = &task0();
    let f = fault(0, FaultKind::Unavailable, PERM, Signalling::Explicit);
    for r in 1..=5 {
        assert_eq!(retry(t, f, r), (Verdict::Failed, u64::from(r)));
    }
    let f = fault(0, FaultKind::Timeout, ONCE, Signalling::Explicit);
    assert_eq!(retry(t, f, 5), (Verdict::Correct, 1));

    // Over a real schedule: a step is retried at most R times; a step fails only when it is
    // faulted or follows a missing step.
    let ts = tasks();
    let mix = selfheal_bench::faults::Mix::default();
    let mut spent = 0;
    for seed in 1..=3 {
        for task in &ts {
            let faults = selfheal_bench::faults::schedule(task, seed, 0.4, &mix);
            for r in [1, 3] {
                let mut env = Env::new(task, &faults);
                run_retry_only(&mut env, r, &mut SplitMix64::new(seed));
                let met = env.met();
                let failing = met.len()
                    + met
                        .iter()
                        .filter(|f| f.kind == FaultKind::MissingStep)
                        .count();
                assert!(
                    env.costs.recoveries <= u64::from(r) * failing as u64,
                    "task {} seed {seed} R={r}: {} recoveries for {met:?}",
                    task.id,
                    env.costs.recoveries
                );
                spent += env.costs.recoveries;
            }
        }
    }
    assert!(spent > 0);
}
