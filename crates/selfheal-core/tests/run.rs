//! The one `Run`: a wire call's ladder and the run's ladders behind one interface, charged to one
//! ledger, and a state that survives being written to bytes and read back at any point.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use proptest::prelude::*;
use selfheal_core::{
    Action, Amounts, BreakerConfig, Breakers, BudgetLimits, CallMode, CallOffer, CallStop,
    ControllerConfig, Env, FailureClass, Input, Judgement, Observation, Options, Proposed,
    RecoveryAction, ResumeError, Run, RunStatus, STATE_VERSION, Signal, SplitMix64, StepsBy,
    ToolCall, TraceEvent,
};
use serde_json::{Value, json};

fn busy(retry_after_ms: Option<u64>) -> Signal {
    Signal::HttpStatus {
        status: 503,
        retry_after_ms,
        message: "upstream busy".into(),
    }
}

struct Driver {
    run: Run,
    rng: SplitMix64,
    breakers: Breakers,
    now: u64,
}

impl Driver {
    fn new(config: ControllerConfig, targets: &[&str]) -> Driver {
        Driver {
            run: Run::new(config).unwrap(),
            rng: SplitMix64::new(11),
            breakers: Breakers::new(
                BreakerConfig {
                    after: 3,
                    cooldown_calls: 0,
                    cooldown_ms: 30_000,
                },
                targets.iter().map(|t| (*t).to_owned()),
            ),
            now: 0,
        }
    }

    fn input(&mut self, input: Input<'_>) -> Vec<Action> {
        let mut env = Env {
            now_ms: self.now,
            rng: &mut self.rng,
            breakers: &mut self.breakers,
        };
        self.run.handle(input, &mut env);
        std::iter::from_fn(|| self.run.poll()).collect()
    }

    fn start(&mut self, targets: &[&str]) -> Vec<Action> {
        self.input(Input::CallStarted {
            call: 1,
            targets: targets.iter().map(|t| (*t).to_owned()).collect(),
            mode: CallMode::Heal,
            retry_safe: true,
        })
    }

    fn fail(&mut self, signal: &Signal) -> Vec<Action> {
        self.input(Input::AttemptFailed {
            call: 1,
            signal,
            offer: CallOffer::default(),
        })
    }
}

fn send(target: usize, name: &str) -> Action {
    Action::Send {
        call: 1,
        target,
        name: name.to_owned(),
        refresh: false,
    }
}

#[test]
fn a_retry_waits_for_its_deadline_and_is_charged_to_the_runs_ledger() {
    let mut d = Driver::new(ControllerConfig::default(), &["main"]);
    assert_eq!(d.start(&["main"]), vec![send(0, "main")]);
    assert_eq!(d.fail(&busy(Some(1_500))), vec![]);
    assert_eq!(d.run.next_deadline(), Some(1_500));
    assert_eq!(d.run.ledger().spent().retries, 1);
    // Early ticks do nothing.
    d.now = 1_499;
    assert_eq!(d.input(Input::Tick { call: None }), vec![]);
    d.now = 1_500;
    assert_eq!(d.input(Input::Tick { call: None }), vec![send(0, "main")]);
    assert_eq!(d.run.next_deadline(), None);
    assert!(d.run.call_recovered(1));
    assert_eq!(d.input(Input::AttemptSucceeded { call: 1 }), vec![]);
    // The decision is in the run's one trace, where replay finds it.
    let actions: Vec<&RecoveryAction> = d
        .run
        .trace()
        .records()
        .filter_map(|r| match &r.event {
            TraceEvent::Action { action, .. } => Some(action),
            _ => None,
        })
        .collect();
    assert!(
        matches!(actions.as_slice(), [RecoveryAction::Retry { .. }]),
        "{actions:?}"
    );
}

#[test]
fn a_request_the_upstream_refused_as_the_callers_goes_back_as_it_came() {
    let mut d = Driver::new(ControllerConfig::default(), &["main", "backup"]);
    d.start(&["main", "backup"]);
    let refused = Signal::HttpStatus {
        status: 400,
        retry_after_ms: None,
        message: "bad request".into(),
    };
    assert_eq!(
        d.fail(&refused),
        vec![Action::GiveUp {
            call: 1,
            stop: CallStop::Rejected { status: 400 }
        }]
    );
    assert_eq!(d.run.ledger().spent().retries, 0);
    // The call is over: a stray failure report has nothing to decide and gives up.
    assert!(matches!(
        d.fail(&busy(None)).as_slice(),
        [Action::GiveUp {
            stop: CallStop::Exhausted { .. },
            ..
        }]
    ));
}

#[test]
fn an_outage_falls_back_to_the_next_target_and_skips_an_open_circuit_next_time() {
    let mut d = Driver::new(ControllerConfig::default(), &["main", "backup"]);
    d.start(&["main", "backup"]);
    let mut sends = 0;
    let mut fell_back = false;
    for _ in 0..10 {
        let actions = d.fail(&busy(None));
        if let Some(w) = d.run.next_deadline() {
            d.now = w;
            let tick = d.input(Input::Tick { call: None });
            assert_eq!(tick, vec![send(0, "main")]);
            sends += 1;
            continue;
        }
        if actions == vec![send(1, "backup")] {
            fell_back = true;
            break;
        }
        panic!("unexpected {actions:?}");
    }
    assert!(fell_back, "fell back after {sends} resends");
    assert_eq!(d.input(Input::AttemptSucceeded { call: 1 }), vec![]);
    // The next call starts on the backup: main's circuit is open.
    assert_eq!(d.start(&["main", "backup"]), vec![send(1, "backup")]);
}

#[test]
fn an_answer_after_a_recovery_is_read_again_first_then_answered() {
    let mut d = Driver::new(
        ControllerConfig {
            budget: BudgetLimits::unlimited(),
            ..ControllerConfig::default()
        },
        &[],
    );
    let args = json!({"city": "Paris"});
    let options = Options {
        retry_safe: true,
        ..Options::default()
    };
    let actions = d.input(Input::Observed(Observation::ToolFinished {
        step: Some(0),
        call: ToolCall::failed("weather", &args, "timed out"),
        signal: Some(Signal::Timeout),
        options: options.clone(),
        usage: Amounts::default(),
    }));
    assert!(
        matches!(
            actions.as_slice(),
            [Action::Recover {
                class: FailureClass::ToolTimeout,
                action: RecoveryAction::Retry { .. },
                ..
            }]
        ),
        "{actions:?}"
    );
    let result = json!({"temp": 11});
    let ok = d.input(Input::Observed(Observation::ToolFinished {
        step: Some(0),
        call: ToolCall::returned("weather", &args, &result),
        signal: None,
        options,
        usage: Amounts::default(),
    }));
    assert!(matches!(ok.as_slice(), [Action::Proceed { .. }]), "{ok:?}");
    let first = d.input(Input::AnswerProposed {
        by: StepsBy::Tool,
        answer: None,
    });
    assert!(
        matches!(first.as_slice(), [Action::ReadAgain { reads }] if *reads >= 1),
        "{first:?}"
    );
    let read = d.input(Input::Observed(Observation::Verified {
        step: Some(0),
        verifier: "reread",
        judgement: Judgement::Accept,
        options: Options::default(),
    }));
    assert!(
        matches!(read.as_slice(), [Action::Proceed { .. }]),
        "{read:?}"
    );
    // Read once per run: the second proposal is answered.
    let answer = d.input(Input::AnswerProposed {
        by: StepsBy::Tool,
        answer: None,
    });
    assert_eq!(
        answer,
        vec![Action::Answer {
            status: RunStatus::Complete,
            reason: None
        }]
    );
}

#[test]
fn a_stopped_run_answers_every_proposal_with_its_stop() {
    let mut d = Driver::new(ControllerConfig::default(), &[]);
    let args = json!({});
    let body = json!({"error": "down"});
    let mut last = Vec::new();
    for _ in 0..3 {
        last = d.input(Input::Observed(Observation::ToolFinished {
            step: Some(0),
            call: ToolCall::returned("only", &args, &body),
            signal: None,
            options: Options::default(),
            usage: Amounts::default(),
        }));
    }
    assert!(matches!(last.as_slice(), [Action::Stop { .. }]), "{last:?}");
    let answer = d.input(Input::AnswerProposed {
        by: StepsBy::Tool,
        answer: None,
    });
    assert!(
        matches!(answer.as_slice(), [Action::Stop { .. }]),
        "{answer:?}"
    );
}

#[test]
fn a_snapshot_of_another_version_or_not_a_snapshot_is_refused() {
    let run = Run::default();
    let mut v: Value = serde_json::from_slice(&run.to_bytes().unwrap()).unwrap();
    assert_eq!(v["version"], json!(STATE_VERSION));
    v["version"] = json!(STATE_VERSION + 1);
    let bytes = serde_json::to_vec(&v).unwrap();
    assert!(matches!(
        Run::from_bytes(&bytes, ControllerConfig::default()),
        Err(ResumeError::Version { found, .. }) if found == STATE_VERSION + 1
    ));
    assert!(matches!(
        Run::from_bytes(b"{\"version\": 1}", ControllerConfig::default()),
        Err(ResumeError::Unreadable(_))
    ));
}

/// One input of a generated run.
#[derive(Debug, Clone)]
enum Step {
    Start(u8),
    Fail(u8),
    Succeed,
    Tick(u16),
    Tool { tool: u8, failed: bool },
    Verdict(u8),
    Next,
    Propose,
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        (1u8..=3).prop_map(Step::Start),
        (0u8..6).prop_map(Step::Fail),
        Just(Step::Succeed),
        (0u16..5_000).prop_map(Step::Tick),
        (0u8..3, any::<bool>()).prop_map(|(tool, failed)| Step::Tool { tool, failed }),
        (0u8..3).prop_map(Step::Verdict),
        Just(Step::Next),
        Just(Step::Propose),
    ]
}

const TARGETS: [&str; 3] = ["main", "second", "third"];
const TOOLS: [&str; 3] = ["search", "fetch", "calc"];

fn apply(d: &mut Driver, s: &Step) -> Vec<Action> {
    let signals = [
        busy(None),
        busy(Some(700)),
        Signal::Timeout,
        Signal::HttpStatus {
            status: 429,
            retry_after_ms: Some(2_000),
            message: String::new(),
        },
        Signal::MalformedOutput {
            detail: "cut".into(),
        },
        Signal::HttpStatus {
            status: 404,
            retry_after_ms: None,
            message: String::new(),
        },
    ];
    let args = json!({"q": 1});
    let good = json!({"ok": true});
    match s {
        Step::Start(n) => d.start(&TARGETS[..usize::from(*n)]),
        Step::Fail(i) => d.fail(&signals[usize::from(*i)]),
        Step::Succeed => d.input(Input::AttemptSucceeded { call: 1 }),
        Step::Tick(ms) => {
            d.now += u64::from(*ms);
            d.input(Input::Tick { call: None })
        }
        Step::Tool { tool, failed } => {
            let tool = TOOLS[usize::from(*tool)];
            let call = if *failed {
                ToolCall::failed(tool, &args, "HTTP 503 from the backend")
            } else {
                ToolCall::returned(tool, &args, &good)
            };
            d.input(Input::Observed(Observation::ToolFinished {
                step: Some(0),
                call,
                signal: None,
                options: Options::all("fetch", "second"),
                usage: Amounts::default(),
            }))
        }
        Step::Verdict(j) => {
            let judgement = match j {
                0 => Judgement::Accept,
                1 => Judgement::Reject {
                    reason: "differs".into(),
                },
                _ => Judgement::Uncertain {
                    reason: "no second source".into(),
                },
            };
            d.input(Input::Observed(Observation::Verified {
                step: Some(0),
                verifier: "check",
                judgement,
                options: Options::default(),
            }))
        }
        Step::Next => d.input(Input::NextTurn),
        Step::Propose => d.input(Input::AnswerProposed {
            by: StepsBy::Tool,
            answer: None,
        }),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    /// A run written to bytes and read back after any input decides everything after exactly
    /// as the run that never left memory: what a shared store keeps is the whole run.
    #[test]
    fn a_resumed_run_decides_as_the_run_it_was(steps in prop::collection::vec(step(), 1..40)) {
        let config = ControllerConfig::default();
        let mut kept = Driver::new(config.clone(), &TARGETS);
        let mut moved = Driver::new(config.clone(), &TARGETS);
        for s in &steps {
            let a = apply(&mut kept, s);
            let b = apply(&mut moved, s);
            prop_assert_eq!(&a, &b, "{:?}", s);
            prop_assert_eq!(kept.run.next_deadline(), moved.run.next_deadline());
            let bytes = moved.run.to_bytes().unwrap();
            moved.run = Run::from_bytes(&bytes, config.clone()).unwrap();
        }
        prop_assert_eq!(kept.run.ledger().spent(), moved.run.ledger().spent());
        prop_assert_eq!(kept.run.trace(), moved.run.trace());
        let (x, y) = (kept.run.finish(1 << 40), moved.run.finish(1 << 40));
        prop_assert_eq!(x, y);
    }
}

/// Issue 31: an answer whose numbers appear in no input or tool result of the run is answered
/// `partial`, and the run ends `partial` while it stands; a grounded answer proposed after it
/// is claimed again.
#[test]
fn an_answer_with_a_number_the_run_never_saw_is_not_complete() {
    let mut d = Driver::new(ControllerConfig::default(), &[]);
    d.input(Input::Offered(&["price", "calc"]));
    let evidence = [
        json!("Multiply the price of ACME by 3.5."),
        json!({"price": 120.25}),
    ];
    returned(&mut d, "price", &evidence[1]);
    let made_up = d.input(Input::AnswerProposed {
        by: StepsBy::Plan,
        answer: Some(Proposed {
            text: "The result is 420.9.",
            evidence: &evidence,
            may_call: true,
        }),
    });
    match made_up.as_slice() {
        [
            Action::Answer {
                status: RunStatus::Partial,
                reason: Some(why),
            },
        ] => assert!(why.contains("420.9"), "{why}"),
        other => panic!("{other:?}"),
    }
    let flagged = d.run.unclaimable_answer(
        StepsBy::Plan,
        Some(Proposed {
            text: "420.9",
            evidence: &evidence,
            may_call: true,
        }),
    );
    assert!(flagged.is_some());
    // A copied (and rounded) number is claimed; without a text nothing is judged.
    let copied = d.input(Input::AnswerProposed {
        by: StepsBy::Plan,
        answer: Some(Proposed {
            text: "The price is 120.3 and the factor 3.5.",
            evidence: &evidence,
            may_call: true,
        }),
    });
    assert_eq!(
        copied,
        vec![Action::Answer {
            status: RunStatus::Complete,
            reason: None
        }]
    );
    assert_eq!(d.run.finish(0).status, RunStatus::Complete);
    // A run offered no tools answers from the model's knowledge: nothing to ground it in.
    let mut d = Driver::new(ControllerConfig::default(), &[]);
    let knowledge = d.input(Input::AnswerProposed {
        by: StepsBy::Plan,
        answer: Some(Proposed {
            text: "420.9",
            evidence: &evidence,
            may_call: true,
        }),
    });
    assert!(
        matches!(
            knowledge.as_slice(),
            [Action::Answer {
                status: RunStatus::Complete,
                ..
            }]
        ),
        "{knowledge:?}"
    );
    let mut d = Driver::new(ControllerConfig::default(), &[]);
    d.input(Input::Offered(&["calc"]));
    returned(&mut d, "calc", &evidence[1]);
    d.input(Input::AnswerProposed {
        by: StepsBy::Plan,
        answer: Some(Proposed {
            text: "420.9",
            evidence: &evidence,
            may_call: true,
        }),
    });
    let out = d.run.finish(0);
    assert_eq!(out.status, RunStatus::Partial);
    assert!(out.reason.is_some_and(|r| r.contains("420.9")));
}

/// A tool call of the run that returned `value`.
fn returned(d: &mut Driver, tool: &str, value: &Value) {
    let args = json!({});
    d.input(Input::Observed(Observation::ToolFinished {
        step: Some(1),
        call: ToolCall::returned(tool, &args, value),
        signal: None,
        options: Options::default(),
        usage: Amounts::default(),
    }));
}

fn propose(d: &mut Driver, by: StepsBy, text: &str, evidence: &[Value]) -> Vec<Action> {
    d.input(Input::AnswerProposed {
        by,
        answer: Some(Proposed {
            text,
            evidence,
            may_call: true,
        }),
    })
}

/// Issue 31: an answer that announces a call of an offered tool instead of making it is asked
/// again once per user turn, with guidance naming the tool; the same announcement again is
/// answered `partial`, and the run ends `partial` while it stands. An answer that names the
/// tool only to report its value is claimed.
#[test]
fn an_answer_that_announces_a_call_is_asked_again_once_then_partial() {
    let evidence = [json!("What is the capital of France?"), json!("Paris")];
    let said = "To get the capital of France, I need to call the `geo_capital` function.";
    for by in [StepsBy::Plan, StepsBy::Tool] {
        let mut d = Driver::new(ControllerConfig::default(), &[]);
        d.input(Input::Offered(&["geo_capital", "get_weather"]));
        match propose(&mut d, by, said, &evidence).as_slice() {
            [Action::AskAgain { guidance, reason }] => {
                assert!(guidance.contains("`geo_capital`"), "{guidance}");
                assert!(reason.contains("announces a call"), "{reason}");
            }
            other => panic!("{other:?}"),
        }
        match propose(&mut d, by, said, &evidence).as_slice() {
            [
                Action::Answer {
                    status: RunStatus::Partial,
                    reason: Some(why),
                },
            ] => assert!(why.contains("`geo_capital`"), "{why}"),
            other => panic!("{other:?}"),
        }
        let out = d.run.finish(0);
        assert_eq!(out.status, RunStatus::Partial, "{by:?}");
        // A new user turn is asked again once more.
        let mut d = Driver::new(ControllerConfig::default(), &[]);
        d.input(Input::Offered(&["geo_capital"]));
        assert!(d.run.ask_again(said, 0).is_some());
        assert!(d.run.ask_again(said, 0).is_none());
        d.input(Input::UserTurn);
        assert!(d.run.ask_again(said, 0).is_some());
        // Reporting the tool's value is an answer.
        let mut d = Driver::new(ControllerConfig::default(), &[]);
        d.input(Input::Offered(&["geo_capital"]));
        returned(&mut d, "geo_capital", &evidence[1]);
        let report = "According to geo_capital, the capital of France is Paris.";
        assert_eq!(
            propose(&mut d, by, report, &evidence),
            vec![Action::Answer {
                status: RunStatus::Complete,
                reason: None
            }]
        );
        assert!(d.run.ask_again(report, 0).is_none());
        // A tool that is not on offer is not announced.
        let mut d = Driver::new(ControllerConfig::default(), &[]);
        d.input(Input::Offered(&["get_weather"]));
        returned(&mut d, "get_weather", &evidence[1]);
        assert!(d.run.ask_again(said, 0).is_none());
    }
}

/// Issue 31: the run's re-ask of an answer that announced a call is its decision: recorded
/// (`ask_again`, with the tool and why, in the records a front-end writes to its trace) and
/// kept in its snapshot, so a run continued from its bytes (another replica) does not ask
/// again this user turn; a new user turn may. A layout-2 snapshot (before the count was in
/// it) is refused, not read as a run that never asked.
#[test]
fn an_ask_again_is_recorded_and_survives_a_snapshot() {
    let evidence = [json!("What is the capital of France?")];
    let said = "To get the capital of France, I need to call the `geo_capital` function.";
    let mut d = Driver::new(ControllerConfig::default(), &[]);
    d.now = 7;
    d.input(Input::Offered(&["geo_capital"]));
    assert!(matches!(
        propose(&mut d, StepsBy::Tool, said, &evidence).as_slice(),
        [Action::AskAgain { .. }]
    ));
    let records = d.run.take_records();
    assert_eq!(
        records,
        vec![(
            7,
            TraceEvent::AskAgain {
                tool: "geo_capital".into(),
                reason: "the answer announces a call of `geo_capital` instead of making it".into(),
            }
        )]
    );
    assert_eq!(records[0].1.kind(), "ask_again");

    let bytes = d.run.to_bytes().unwrap();
    let mut resumed = Driver::new(ControllerConfig::default(), &[]);
    resumed.run = Run::from_bytes(&bytes, ControllerConfig::default()).unwrap();
    resumed.input(Input::Offered(&["geo_capital"]));
    match propose(&mut resumed, StepsBy::Tool, said, &evidence).as_slice() {
        [
            Action::Answer {
                status: RunStatus::Partial,
                reason: Some(why),
            },
        ] => assert!(why.contains("`geo_capital`"), "{why}"),
        other => panic!("asked again after a resume: {other:?}"),
    }
    assert!(
        resumed.run.take_records().is_empty(),
        "nothing asked, nothing recorded"
    );
    resumed.input(Input::UserTurn);
    assert!(resumed.run.ask_again(said, 9).is_some(), "a new user turn");

    let mut v: Value = serde_json::from_slice(&bytes).unwrap();
    v["version"] = json!(2);
    v.as_object_mut().unwrap().remove("announce_reasks");
    assert!(matches!(
        Run::from_bytes(
            &serde_json::to_vec(&v).unwrap(),
            ControllerConfig::default()
        ),
        Err(ResumeError::Version { found: 2, .. })
    ));
}

/// Issue 31: a run that owns its task (steps by plan), was offered tools and saw none return a
/// result answers from nothing it holds: `partial`, whatever the answer says. A front-end that
/// answers a conversation's turn (steps by tool) is not judged so: a turn may need no tool.
#[test]
fn an_answer_with_no_tool_result_behind_it_is_not_complete_for_a_plan() {
    let evidence = [json!(
        "How many USD are 439 units of the currency of Japan?"
    )];
    let mut d = Driver::new(ControllerConfig::default(), &[]);
    d.input(Input::Offered(&["geo_currency", "fx_rate"]));
    match propose(&mut d, StepsBy::Plan, "439.0", &evidence).as_slice() {
        [
            Action::Answer {
                status: RunStatus::Partial,
                reason: Some(why),
            },
        ] => assert_eq!(why, selfheal_core::NO_TOOL_RESULT),
        other => panic!("{other:?}"),
    }
    assert_eq!(d.run.finish(0).status, RunStatus::Partial);
    let mut d = Driver::new(ControllerConfig::default(), &[]);
    d.input(Input::Offered(&["geo_currency", "fx_rate"]));
    assert!(matches!(
        propose(&mut d, StepsBy::Tool, "439.0", &evidence).as_slice(),
        [Action::Answer {
            status: RunStatus::Complete,
            ..
        }]
    ));
    // A failed call is no result; one that returned is.
    let mut d = Driver::new(ControllerConfig::default(), &[]);
    d.input(Input::Offered(&["geo_currency", "fx_rate"]));
    let args = json!({});
    d.input(Input::Observed(Observation::ToolFinished {
        step: Some(1),
        call: ToolCall::failed("fx_rate", &args, "HTTP 503"),
        signal: None,
        options: Options::default(),
        usage: Amounts::default(),
    }));
    assert!(
        d.run
            .unclaimable_answer(
                StepsBy::Plan,
                Some(Proposed {
                    text: "439.0",
                    evidence: &evidence,
                    may_call: true,
                })
            )
            .is_some()
    );
    returned(&mut d, "geo_currency", &json!("JPY"));
    assert_eq!(
        d.run.unclaimable_answer(
            StepsBy::Plan,
            Some(Proposed {
                text: "439.0",
                evidence: &evidence,
                may_call: true,
            })
        ),
        None
    );
}
