//! Recorded decisions made again under another policy.
//!
//! A policy change should be checked against real traffic before it ships. Every recovery
//! decision the controller or a call plan makes is traced with its [`DecisionInput`] — the
//! signal, the failure streak, the ladder position, what was possible, the budget — so it can be
//! made again, deterministically, under any policy. [`replay`] does that for a run's events and
//! says, decision by decision, where the new policy would have acted differently.
//!
//! What a replay can and cannot say: each decision is replayed from the state the *recorded* run
//! was in. After the first difference the recorded run went on along its own path (a retry the
//! new policy would not take was still sent, and its outcome is what came next), so later
//! comparisons answer "what would the new policy do at this point of the real run", not "what
//! would the run have been". [`Comparison::after_difference`] marks them.

use serde::Serialize;

use crate::budget::BudgetLedger;
use crate::call::{Plane, decide_call, decide_stream};
use crate::classifier::{ClassifyContext, FailureClass};
use crate::policy::{EscalationTarget, RecoveryAction};
use crate::rng::ConstRng;
use crate::trace::{DecisionInput, Event, Surface};

/// One recorded decision and the one the replayed policy makes from the same input.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Comparison {
    /// The decision's position among the run's replayable decisions (0-based).
    pub index: usize,
    /// The signal's name (`http_status`, `timeout`, ...).
    pub signal: String,
    /// The class the recorded run inferred.
    pub recorded_class: FailureClass,
    /// The action it took.
    pub recorded: RecoveryAction,
    /// The class the replay infers.
    pub replayed_class: FailureClass,
    /// The action the replayed policy takes.
    pub replayed: RecoveryAction,
    /// Whether the two actions differ (a retry's wait does not count: it has jitter).
    pub differs: bool,
    /// The recorded run routed around the failing tool where its ladder ended (`recorded` is
    /// that end): a replayed policy whose ladder also ends there does not differ.
    pub routed_around: bool,
    /// An earlier decision of the run already differed, so the run went on along a path the
    /// replayed policy would not have taken.
    pub after_difference: bool,
}

/// The decision `plane` makes from `input` (jitter fixed, so the result is reproducible).
pub(crate) fn decide_again(input: &DecisionInput, plane: &Plane) -> (FailureClass, RecoveryAction) {
    let failure = plane.classifier().classify(
        &input.signal,
        ClassifyContext {
            consecutive_failures: input.consecutive,
        },
    );
    let mut ledger = BudgetLedger::new(input.limits);
    ledger.record_usage(&input.spent);
    let mut rng = ConstRng(u64::MAX / 2);
    let action = match input.surface {
        Surface::Controller => {
            plane
                .policy()
                .decide(input.ladder, &failure, &input.options, &ledger, &mut rng)
                .action
        }
        Surface::Call | Surface::Stream => {
            let decide = if input.surface == Surface::Call {
                decide_call
            } else {
                decide_stream
            };
            decide(
                plane,
                &failure,
                &input.options,
                input.ladder,
                &ledger,
                &mut rng,
            )
            .action
        }
    };
    (failure.class, action)
}

/// Whether two actions are the same decision (a retry's wait aside).
fn same(a: &RecoveryAction, b: &RecoveryAction) -> bool {
    match (a, b) {
        (RecoveryAction::Retry { .. }, RecoveryAction::Retry { .. }) => true,
        (
            RecoveryAction::Escalate {
                target: EscalationTarget::FallbackModel { model: x },
            },
            RecoveryAction::Escalate {
                target: EscalationTarget::FallbackModel { model: y },
            },
        ) => x == y,
        _ => a == b,
    }
}

/// Replays every decision of a run's events that carries its input; decisions traced without
/// one (older traces) are skipped.
pub fn replay<'a>(events: impl IntoIterator<Item = &'a Event>, plane: &Plane) -> Vec<Comparison> {
    let mut out = Vec::new();
    let mut diverged = false;
    for event in events {
        let (class, action, input, routed) = match event {
            Event::Action {
                class,
                action,
                input: Some(input),
                ..
            } => (class, action, input, false),
            Event::RoutedAround {
                class: Some(class),
                ladder_end: Some(action),
                input: Some(input),
                ..
            } => (class, action, input, true),
            _ => continue,
        };
        let (replayed_class, replayed) = decide_again(input, plane);
        // A tool routed around stood for its ladder's end: another policy whose ladder also
        // ends there routes around too, whichever end it is.
        let differs = if routed {
            !replayed.kind().is_terminal()
        } else {
            !same(action, &replayed)
        };
        out.push(Comparison {
            index: out.len(),
            signal: input.signal.name().to_owned(),
            recorded_class: *class,
            recorded: action.clone(),
            replayed_class,
            replayed,
            differs,
            routed_around: routed,
            after_difference: diverged,
        });
        diverged |= differs;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::budget::BudgetLimits;
    use crate::call::{Breakers, CallPlan, Mode};
    use crate::classifier::{ClassifierConfig, Signal};
    use crate::controller::{Controller, ControllerConfig, Observation};
    use crate::monitor::ToolCall;
    use crate::policy::{Options, Policy};

    /// A started plan over `names`, their breakers and a default ledger.
    fn plan_over(names: &[&str]) -> (CallPlan, Breakers, BudgetLedger) {
        let names: Vec<String> = names.iter().map(|n| (*n).to_owned()).collect();
        let config = crate::breaker::BreakerConfig {
            after: 5,
            cooldown_calls: 0,
            cooldown_ms: 1000,
        };
        let mut br = Breakers::new(config, names.clone());
        let mut plan = CallPlan::new(names, Mode::Heal, true);
        plan.begin(&mut br, 0);
        (plan, br, BudgetLedger::new(BudgetLimits::defaults()))
    }

    fn plane(toml: &str) -> Plane {
        Plane::new(
            Policy::from_toml_str(toml).expect("policy"),
            ClassifierConfig::default(),
        )
        .expect("plane")
    }

    #[test]
    fn the_same_policy_replays_every_call_decision_identically() {
        let p = Plane::default();
        let (mut plan, mut br, mut ledger) = plan_over(&["a", "b"]);
        let mut rng = ConstRng(7);
        for _ in 0..6 {
            let step = plan.failed(&Signal::Timeout, &p, &mut br, &mut ledger, 0, &mut rng);
            if matches!(step, crate::call::Step::Stop(_)) {
                break;
            }
        }
        let events = plan.take_records();
        let same = replay(&events, &p);
        assert!(same.len() >= 3, "{same:?}");
        assert!(same.iter().all(|c| !c.differs), "{same:?}");
        // A policy that falls back first differs at the very first decision.
        let other = replay(
            &events,
            &plane("[ladders]\ntool_timeout = [\"escalate\"]\n"),
        );
        assert!(other[0].differs, "{other:?}");
        assert!(matches!(other[0].recorded, RecoveryAction::Retry { .. }));
        assert!(matches!(other[0].replayed, RecoveryAction::Escalate { .. }));
        assert!(other[1].after_difference);
    }

    #[test]
    fn controller_decisions_replay_too() {
        let mut c = Controller::new(ControllerConfig::default()).expect("controller");
        let args = serde_json::json!({"q": 1});
        c.observe(
            Observation::ToolFinished {
                step: Some(1),
                call: ToolCall::failed("search", &args, "timed out"),
                signal: Some(Signal::Timeout),
                options: Options::all("alt", "big"),
                usage: Default::default(),
            },
            0,
            &mut ConstRng(0),
        );
        let events: Vec<Event> = c.trace().records().map(|r| r.event.clone()).collect();
        let same = replay(&events, &Plane::default());
        assert_eq!(same.len(), 1);
        assert!(!same[0].differs);
        let sub = replay(
            &events,
            &plane("[ladders]\ntool_timeout = [\"substitute\"]\n"),
        );
        assert_eq!(
            sub[0].replayed,
            RecoveryAction::Substitute {
                alternative: "alt".into()
            }
        );
    }

    #[test]
    fn events_round_trip_through_json_with_their_input() {
        let p = Plane::default();
        let (mut plan, mut br, mut ledger) = plan_over(&["a"]);
        plan.failed(
            &Signal::Timeout,
            &p,
            &mut br,
            &mut ledger,
            0,
            &mut ConstRng(0),
        );
        let events = plan.take_records();
        let text = serde_json::to_string(&events).expect("serialise");
        let back: Vec<Event> = serde_json::from_str(&text).expect("parse");
        assert_eq!(back, events);
        assert_eq!(replay(&back, &p).len(), 1);
    }
}
