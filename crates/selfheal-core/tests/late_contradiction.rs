//! Issue 33, item 3: a confirmed value is never replaced by an unverifiable one and claimed.
//!
//! After a recovery elsewhere, the run reads its values again before answering. When a value a
//! verifier had confirmed reads differently now (its source turned bad late), the retry the
//! contradiction ladder makes brings a value nothing can check: the run must not claim it.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use selfheal_core::{
    Amounts, BudgetLimits, Controller, ControllerConfig, Directive, Judgement, Observation,
    Options, REREAD_VERIFIER, RunStatus, Signal, SplitMix64, StepsBy, THIRD_READ_VERIFIER,
    ToolCall,
};
use serde_json::{Value, json};

fn controller() -> Controller {
    Controller::new(ControllerConfig {
        budget: BudgetLimits::unlimited(),
        ..ControllerConfig::default()
    })
    .unwrap()
}

fn opts() -> Options {
    Options::all("backup", "big-model")
}

fn ok<'a>(step: u32, tool: &'a str, args: &'a Value, result: &'a Value) -> Observation<'a> {
    Observation::ToolFinished {
        step: Some(step),
        call: ToolCall::returned(tool, args, result),
        signal: None,
        options: opts(),
        usage: Amounts::default(),
    }
}

fn verdict(step: u32, verifier: &str, judgement: Judgement) -> Observation<'_> {
    Observation::Verified {
        step: Some(step),
        verifier,
        judgement,
        options: opts(),
    }
}

fn reject(step: u32) -> Observation<'static> {
    verdict(
        step,
        REREAD_VERIFIER,
        Judgement::Reject {
            reason: "`value`: 100 here, 112 from a second read".into(),
        },
    )
}

/// A run whose step 0 needed a retry, and whose step 1 (a calculator) gave `100`, which the
/// first read before answering confirmed. Returns the controller with the re-read under way.
fn recovered_then_confirmed(rng: &mut SplitMix64) -> Controller {
    let mut c = controller();
    let a = json!({"q": "x"});
    let fetched = json!({"v": 5});
    let d = c.observe(
        Observation::ToolFinished {
            step: Some(0),
            call: ToolCall::failed("search", &a, "timed out"),
            signal: Some(Signal::Timeout),
            options: opts(),
            usage: Amounts::default(),
        },
        0,
        rng,
    );
    assert!(matches!(d, Directive::Recover { .. }), "{d:?}");
    let d = c.observe(ok(0, "search", &a, &fetched), 10, rng);
    assert!(matches!(d, Directive::Continue { .. }), "{d:?}");
    let product = json!({"value": 100});
    let b = json!({"x": 5, "y": 20});
    let d = c.observe(ok(1, "calc", &b, &product), 20, rng);
    assert!(matches!(d, Directive::Continue { .. }), "{d:?}");
    assert!(c.reread_due(), "a recovered run reads its values again");
    let d = c.observe(verdict(1, REREAD_VERIFIER, Judgement::Accept), 30, rng);
    assert!(matches!(d, Directive::Continue { .. }), "{d:?}");
    c
}

#[test]
fn a_confirmed_value_that_reads_differently_later_is_not_replaced_by_the_retry_and_claimed() {
    let mut rng = SplitMix64::new(3);
    let mut c = recovered_then_confirmed(&mut rng);
    // The second read differs: the calculator turned bad after the value was confirmed.
    let d = c.observe(reject(1), 40, &mut rng);
    assert!(
        matches!(d, Directive::Recover { step: Some(1), .. }),
        "the contradiction is recovered on its step: {d:?}"
    );
    assert_eq!(c.contested(), &[Some(1)]);
    // The retry brings the bad value back, and nothing checks it.
    let bad = json!({"value": 112});
    let b = json!({"x": 5, "y": 20});
    let d = c.observe(ok(1, "calc", &b, &bad), 50, &mut rng);
    assert!(matches!(d, Directive::Continue { .. }), "{d:?}");
    assert!(!c.reread_due(), "the re-read is made once");
    let why = c.unclaimable(StepsBy::Plan).expect("not claimable");
    assert!(why.contains("step 1"), "{why}");
    let outcome = c.finish(60);
    assert_eq!(outcome.status, RunStatus::Partial);
}

#[test]
fn a_contested_value_that_an_independent_check_accepts_again_is_claimed() {
    let mut rng = SplitMix64::new(3);
    let mut c = recovered_then_confirmed(&mut rng);
    c.observe(reject(1), 40, &mut rng);
    let same = json!({"value": 100});
    let b = json!({"x": 5, "y": 20});
    c.observe(ok(1, "calc", &b, &same), 50, &mut rng);
    // Reading the same source again once more is not independent: still contested.
    c.observe(verdict(1, REREAD_VERIFIER, Judgement::Accept), 55, &mut rng);
    assert_eq!(c.contested(), &[Some(1)]);
    // The retry brought back the confirmed value (the front-end's comparison): settled.
    c.observe(
        verdict(1, "confirmed_value", Judgement::Accept),
        60,
        &mut rng,
    );
    assert!(c.contested().is_empty());
    assert_eq!(c.unclaimable(StepsBy::Plan), None);
    assert_eq!(c.finish(70).status, RunStatus::Complete);
}

/// A run whose step 0 needed a retry, whose step 1 (a calculator) gave `100` that nothing
/// confirmed, and whose read before answering found `112`: the tie is open, and the retry of
/// step 1 (the third reading) is under way.
fn unconfirmed_then_changed(rng: &mut SplitMix64) -> Controller {
    let mut c = controller();
    let a = json!({"q": "x"});
    let fetched = json!({"v": 5});
    c.observe(
        Observation::ToolFinished {
            step: Some(0),
            call: ToolCall::failed("search", &a, "timed out"),
            signal: Some(Signal::Timeout),
            options: opts(),
            usage: Amounts::default(),
        },
        0,
        rng,
    );
    c.observe(ok(0, "search", &a, &fetched), 10, rng);
    let b = json!({"x": 5, "y": 20});
    let product = json!({"value": 100});
    c.observe(ok(1, "calc", &b, &product), 20, rng);
    assert!(c.reread_due());
    let d = c.observe(reject(1), 30, rng);
    assert!(matches!(d, Directive::Recover { .. }), "{d:?}");
    assert_eq!(c.contested(), &[Some(1)], "two readings, one source: a tie");
    c
}

#[test]
fn a_changed_value_nothing_had_confirmed_is_claimed_when_a_third_reading_breaks_the_tie() {
    let mut rng = SplitMix64::new(3);
    let mut c = unconfirmed_then_changed(&mut rng);
    let b = json!({"x": 5, "y": 20});
    let third = json!({"value": 112});
    c.observe(ok(1, "calc", &b, &third), 40, &mut rng);
    // The front-end found the third reading equal to the second: two of three agree.
    c.observe(
        verdict(1, THIRD_READ_VERIFIER, Judgement::Accept),
        45,
        &mut rng,
    );
    assert!(c.contested().is_empty());
    assert_eq!(c.finish(50).status, RunStatus::Complete);
}

#[test]
fn a_changed_value_whose_third_reading_agrees_with_neither_is_not_claimed() {
    let mut rng = SplitMix64::new(3);
    let mut c = unconfirmed_then_changed(&mut rng);
    let b = json!({"x": 5, "y": 20});
    let third = json!({"value": 97});
    c.observe(ok(1, "calc", &b, &third), 40, &mut rng);
    let why = c.unclaimable(StepsBy::Plan).expect("not claimable");
    assert!(why.contains("step 1"), "{why}");
    assert_eq!(c.finish(50).status, RunStatus::Partial);
}

#[test]
fn a_third_reading_does_not_replace_a_confirmed_value() {
    let mut rng = SplitMix64::new(3);
    let mut c = recovered_then_confirmed(&mut rng);
    c.observe(reject(1), 40, &mut rng);
    let bad = json!({"value": 112});
    let b = json!({"x": 5, "y": 20});
    c.observe(ok(1, "calc", &b, &bad), 50, &mut rng);
    c.observe(
        verdict(1, THIRD_READ_VERIFIER, Judgement::Accept),
        55,
        &mut rng,
    );
    assert_eq!(c.contested(), &[Some(1)], "a confirmed value stands");
    assert_eq!(c.finish(60).status, RunStatus::Partial);
}

#[test]
fn contested_steps_survive_a_snapshot() {
    let mut rng = SplitMix64::new(3);
    let mut c = recovered_then_confirmed(&mut rng);
    c.observe(reject(1), 40, &mut rng);
    let bytes = serde_json::to_vec(&c).unwrap();
    let back: Controller = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(back.contested(), &[Some(1)]);
}
