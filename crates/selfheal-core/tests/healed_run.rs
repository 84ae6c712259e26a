//! A run whose every failure was healed is not stopped by the failure-rate rule: the rule
//! counts healed failures too, and a working run's next failure gets its own ladder.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use selfheal_core::{
    Amounts, BudgetLimits, Controller, ControllerConfig, Directive, MonitorConfig, Observation,
    Options, Signal, SplitMix64, ToolCall,
};
use serde_json::{Value, json};

fn controller() -> Controller {
    Controller::new(ControllerConfig {
        budget: BudgetLimits::unlimited(),
        monitor: MonitorConfig {
            abort_min_calls: 4,
            ..MonitorConfig::default()
        },
        ..ControllerConfig::default()
    })
    .unwrap()
}

fn call<'a>(
    step: u32,
    tool: &'a str,
    args: &'a Value,
    result: Option<&'a Value>,
) -> Observation<'a> {
    Observation::ToolFinished {
        step: Some(step),
        call: match result {
            Some(r) => ToolCall::returned(tool, args, r),
            None => ToolCall::failed(tool, args, "timed out"),
        },
        signal: result.is_none().then_some(Signal::Timeout),
        options: Options::all("backup", "big-model"),
        usage: Amounts::default(),
    }
}

#[test]
fn a_healed_run_gets_a_ladder_for_its_next_failure_not_an_abort() {
    let mut rng = SplitMix64::new(1);
    let mut c = controller();
    let a = json!({"q": "x"});
    let b = json!({"q": "y"});
    let r = json!({"v": 1});
    // Step 0 fails twice and is healed: 2 of 3 calls failed.
    for t in 0..2 {
        let d = c.observe(call(0, "search", &a, None), t, &mut rng);
        assert!(matches!(d, Directive::Recover { .. }), "{d:?}");
    }
    let d = c.observe(call(0, "search", &a, Some(&r)), 2, &mut rng);
    assert!(matches!(d, Directive::Continue { .. }), "{d:?}");
    assert!(
        matches!(c.guidance(3), Directive::Continue { .. }),
        "nothing is wrong now"
    );
    // Step 1 fails: 3 of 4 calls failed (75 %, above the 70 % rule), every earlier one healed.
    let d = c.observe(call(1, "fetch", &b, None), 4, &mut rng);
    assert!(
        matches!(d, Directive::Recover { step: Some(1), .. }),
        "the new failure is recovered, not aborted over healed ones: {d:?}"
    );
    assert!(
        matches!(c.guidance(5), Directive::Continue { .. }),
        "the run goes on"
    );
}
