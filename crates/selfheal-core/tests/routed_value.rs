//! Issue 30: a failure routed around at its ladder's end leaves its step open for the value a
//! later attempt brings. That value is a recovered one: a check that cannot judge it does not
//! let it be claimed as a first-try value would be, and the run reads it again before
//! answering as it reads any value after a recovery.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use selfheal_core::{
    ActionKind, Amounts, BudgetLimits, Controller, ControllerConfig, Directive, FailureClass,
    Judgement, Observation, Options, Policy, RunStatus, Signal, SplitMix64, StepsBy, ToolCall,
};
use serde_json::{Value, json};

/// A run offered `search` and `backup` whose ladders end after one action per failure.
fn controller() -> Controller {
    with_policy(Policy {
        max_actions_per_failure: Some(1),
        ..Policy::default()
    })
}

fn with_policy(policy: Policy) -> Controller {
    let mut c = Controller::new(ControllerConfig {
        budget: BudgetLimits::unlimited(),
        policy,
        ..ControllerConfig::default()
    })
    .unwrap();
    c.offer(["search", "backup"]);
    c
}

fn call<'a>(tool: &'a str, args: &'a Value, result: Option<&'a Value>) -> Observation<'a> {
    Observation::ToolFinished {
        step: Some(0),
        call: match result {
            Some(r) => ToolCall::returned(tool, args, r),
            None => ToolCall::failed(tool, args, "service unavailable"),
        },
        signal: result
            .is_none()
            .then_some(Signal::Unavailable { consecutive: 1 }),
        options: Options::all("backup", "big-model"),
        usage: Amounts::default(),
    }
}

fn cannot_judge() -> Observation<'static> {
    Observation::Verified {
        step: Some(0),
        verifier: "cross_check",
        judgement: Judgement::Uncertain {
            reason: "`backup` did not answer".into(),
        },
        options: Options::all("backup", "big-model"),
    }
}

/// `search` fails on step 0 until its ladder ends and the failure is routed around.
fn routed(rng: &mut SplitMix64) -> Controller {
    routed_under(controller(), rng)
}

fn routed_under(mut c: Controller, rng: &mut SplitMix64) -> Controller {
    let a = json!({"q": "x"});
    let mut t = 0;
    while c.routed().is_empty() {
        let d = c.observe(call("search", &a, None), t, rng);
        assert!(
            matches!(d, Directive::Recover { .. } | Directive::Continue { .. }),
            "the ladder, then the route around: {d:?}"
        );
        t += 1;
        assert!(t < 10, "the failure is routed around");
    }
    c
}

#[test]
fn a_value_after_routing_around_that_no_check_can_judge_is_not_claimed() {
    for (tool, seed) in [("search", 1), ("backup", 2)] {
        let mut rng = SplitMix64::new(seed);
        let mut c = routed(&mut rng);
        let a = json!({"q": "x"});
        let v = json!({"v": 7});
        let d = c.observe(call(tool, &a, Some(&v)), 100, &mut rng);
        assert!(matches!(d, Directive::Continue { .. }), "{d:?}");
        let d = c.observe(cannot_judge(), 110, &mut rng);
        assert!(
            !matches!(d, Directive::Continue { .. }),
            "`{tool}`'s value, recovered after routing around, is not taken unjudged: {d:?}"
        );
        assert_eq!(c.finish(120).status, RunStatus::Partial, "{tool}");
    }
}

#[test]
fn a_value_after_routing_around_is_read_again_before_answering() {
    // A ladder with no action before its end: the route around is the run's only recovery.
    let mut policy = Policy::default();
    policy
        .ladders
        .insert(FailureClass::ToolUnavailable, vec![ActionKind::Degrade]);
    let mut rng = SplitMix64::new(3);
    let mut c = routed_under(with_policy(policy), &mut rng);
    let a = json!({"q": "x"});
    let v = json!({"v": 7});
    let d = c.observe(call("search", &a, Some(&v)), 100, &mut rng);
    assert!(matches!(d, Directive::Continue { .. }), "{d:?}");
    assert!(
        c.reread_due(),
        "a run that routed a failure around recovered"
    );
}

#[test]
fn a_value_after_routing_around_that_a_check_accepts_is_claimed() {
    let mut rng = SplitMix64::new(4);
    let mut c = routed(&mut rng);
    let a = json!({"q": "x"});
    let v = json!({"v": 7});
    c.observe(call("backup", &a, Some(&v)), 100, &mut rng);
    let d = c.observe(
        Observation::Verified {
            step: Some(0),
            verifier: "cross_check",
            judgement: Judgement::Accept,
            options: Options::all("backup", "big-model"),
        },
        110,
        &mut rng,
    );
    assert!(matches!(d, Directive::Continue { .. }), "{d:?}");
    assert_eq!(c.unclaimable(StepsBy::Plan), None);
    assert_eq!(c.finish(120).status, RunStatus::Complete);
}
