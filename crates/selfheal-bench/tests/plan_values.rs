//! Issue 11: the in-process client never corrects the model with the task's plan.
//!
//! A value the model copies wrong for good cannot be repaired by a client that holds no answer:
//! the repair may re-parse what the model wrote, never put the plan's value in its place. With
//! a ladder of repair then degrade, the episode must end without an answer (the old client
//! returned the right one, read off the plan).

#![allow(clippy::unwrap_used)]

mod common;

use selfheal_bench::Episode;
use selfheal_bench::Strategy;
use selfheal_core::{ActionKind, FailureClass, Policy};

#[test]
fn issue_11_a_wrong_argument_is_not_replaced_by_the_plans_value() {
    let task = &selfheal_bench::builtin(1)[0];
    let (model, fault) = common::permanent("wrong_value_args", 0);
    let faults = [fault];
    let policy = Policy {
        ladders: FailureClass::ALL
            .into_iter()
            .map(|c| (c, vec![ActionKind::Repair, ActionKind::Degrade]))
            .collect(),
        last_chance: Default::default(),
        ..Policy::default()
    };
    let mut ep = Episode::new(task, &faults, &model, 1);
    let ended = Strategy::SelfHealing.run(&mut ep, 5, Some(&policy), 1, false);
    assert_eq!(
        ended.answer, None,
        "the wrong value was corrected from the plan"
    );
    // The call with the wrong value never ran: the client refused it before the tool.
    assert_eq!(ep.costs().tool_calls, 0);
}
