//! Property tests: budgets never go negative, verdicts are deterministic, memory is bounded, the
//! policy never picks what the ledger cannot pay for, and a run always stops within its budget.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use proptest::prelude::*;
use selfheal_core::{
    ActionKind, Amounts, BudgetLedger, BudgetLimits, Classification, ConstRng, Controller,
    ControllerConfig, Dimension, Directive, FailureClass, LadderState, Monitor, MonitorConfig,
    MonitorMode, Observation, Options, Policy, RecoveryAction, RepairTarget, RetryConfig, Signal,
    SplitMix64, ToolCall,
};
use serde_json::{Value, json};

// ── strategies ────────────────────────────────────────────────────────────────────────────────

/// Amounts from one value per dimension, in the order the fields are declared.
fn amounts(a: [u64; 7]) -> Amounts {
    Amounts {
        retries: a[0],
        replans: a[1],
        substitutions: a[2],
        escalations: a[3],
        recoveries: a[4],
        latency_ms: a[5],
        cost: a[6],
    }
}

fn small_amounts(max: u64) -> impl Strategy<Value = Amounts> {
    prop::array::uniform7(0..=max).prop_map(amounts)
}

/// Limits where each dimension is small or unlimited.
fn limits() -> impl Strategy<Value = BudgetLimits> {
    prop::array::uniform7(prop_oneof![3 => 0u64..=12, 1 => Just(u64::MAX)]).prop_map(amounts)
}

#[derive(Debug, Clone)]
enum LedgerOp {
    Charge(Amounts),
    Usage(Amounts),
}

fn ledger_op() -> impl Strategy<Value = LedgerOp> {
    prop_oneof![
        3 => small_amounts(4).prop_map(LedgerOp::Charge),
        1 => small_amounts(3).prop_map(LedgerOp::Usage),
    ]
}

fn class() -> impl Strategy<Value = FailureClass> {
    (0..FailureClass::ALL.len()).prop_map(|i| FailureClass::ALL[i])
}

fn action_kind() -> impl Strategy<Value = ActionKind> {
    (0..ActionKind::ALL.len()).prop_map(|i| ActionKind::ALL[i])
}

/// A valid ladder: non-terminal rungs, optionally ending in one terminal rung.
fn ladder() -> impl Strategy<Value = Vec<ActionKind>> {
    (
        prop::collection::vec(action_kind(), 0..8),
        prop::option::of(prop_oneof![
            Just(ActionKind::Degrade),
            Just(ActionKind::Terminate)
        ]),
    )
        .prop_map(|(rungs, end)| {
            let mut l: Vec<ActionKind> = rungs.into_iter().filter(|k| !k.is_terminal()).collect();
            l.extend(end);
            l
        })
}

fn options() -> impl Strategy<Value = Options> {
    (
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(|(r, s, f, p, m, h, safe, partial)| Options {
            repair: r.then_some(RepairTarget::Arguments),
            substitute: s.then(|| "alt".to_owned()),
            refreshable: f,
            can_replan: p,
            fallback_model: m.then(|| "big".to_owned()),
            human_available: h,
            retry_safe: safe,
            partial_result: partial,
            max_delay_ms: None,
        })
}

/// One monitor input: tool, argument variant, outcome, milliseconds elapsed.
#[derive(Debug, Clone)]
struct CallSpec {
    tool: u16,
    arg: u8,
    outcome: u8,
    dt: u16,
}

fn call_spec(tools: u16) -> impl Strategy<Value = CallSpec> {
    (0..tools, 0u8..6, 0u8..6, 0u16..3_000).prop_map(|(tool, arg, outcome, dt)| CallSpec {
        tool,
        arg,
        outcome,
        dt,
    })
}

const REQUIRED: &[&str] = &["q"];

fn arg_value(arg: u8) -> Value {
    match arg {
        0 => json!({"q": "rust"}),
        1 => json!({"q": "rust", "n": 1}),
        2 => json!({"n": 1.0, "q": "rust"}),
        3 => json!({"q": ""}),
        4 => json!({"q": "TODO"}),
        _ => json!({"q": {"nested": [1, 2, 3]}}),
    }
}

fn result_value(outcome: u8) -> Option<Value> {
    match outcome {
        0 => Some(json!({"hits": [1, 2]})),
        1 => Some(json!({"hits": [3]})),
        2 => Some(json!({"results": []})),
        3 => Some(Value::Null),
        _ => None, // hard failure
    }
}

fn feed(m: &mut Monitor, spec: &CallSpec, now_ms: u64, name: &str) -> String {
    let required: Vec<String> = REQUIRED.iter().map(|s| (*s).to_owned()).collect();
    let args = arg_value(spec.arg);
    let error = if spec.outcome == 4 {
        "HTTP 503"
    } else {
        "timed out"
    };
    let result = result_value(spec.outcome);
    let call = match &result {
        Some(r) => ToolCall::returned(name, &args, r),
        None => ToolCall::failed(name, &args, error),
    }
    .with_required(&required);
    let report = m.record(&call, now_ms);
    let verdict = m.check(now_ms);
    // Compare through the serialised form: reports and verdicts are plain data.
    format!(
        "{}|{}",
        serde_json::to_string(&report).unwrap(),
        serde_json::to_string(&verdict).unwrap()
    )
}

// ── budgets ───────────────────────────────────────────────────────────────────────────────────

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn budgets_never_go_negative_and_charges_are_all_or_nothing(
        limits in limits(),
        ops in prop::collection::vec(ledger_op(), 0..60),
    ) {
        let mut ledger = BudgetLedger::new(limits);
        for op in ops {
            let before = *ledger.spent();
            match op {
                LedgerOp::Charge(c) => {
                    let affordable = ledger.can_afford(&c);
                    let res = ledger.charge(&c);
                    prop_assert_eq!(res.is_ok(), affordable);
                    for d in Dimension::ALL {
                        let after = ledger.spent().get(d);
                        if res.is_ok() {
                            prop_assert_eq!(after, before.get(d).saturating_add(c.get(d)));
                            if c.get(d) > 0 {
                                prop_assert!(after <= limits.get(d), "charge overspent {}", d);
                            }
                        } else {
                            prop_assert_eq!(after, before.get(d), "refused charge spent {}", d);
                        }
                    }
                    if let Err(e) = res {
                        prop_assert!(e.spent.saturating_add(e.asked) > e.limit);
                    }
                }
                LedgerOp::Usage(u) => {
                    ledger.record_usage(&u);
                    for d in Dimension::ALL {
                        prop_assert_eq!(ledger.spent().get(d), before.get(d).saturating_add(u.get(d)));
                    }
                }
            }
            let remaining = ledger.remaining();
            for d in Dimension::ALL {
                prop_assert!(ledger.spent().get(d) >= before.get(d), "spent decreased in {}", d);
                prop_assert!(remaining.get(d) <= limits.get(d));
                prop_assert_eq!(remaining.get(d), limits.get(d).saturating_sub(ledger.spent().get(d)));
            }
        }
    }

    #[test]
    fn policy_never_returns_an_action_the_ledger_cannot_afford(
        limits in limits(),
        spent in prop::collection::vec(ledger_op(), 0..20),
        class in class(),
        custom in prop::option::of(ladder()),
        opts in options(),
        rung in 0usize..10,
        retries in 0u32..5,
        actions in 0u32..6,
        cap in prop::option::of(0u32..6),
        seed in any::<u64>(),
    ) {
        let mut ledger = BudgetLedger::new(limits);
        for op in spent {
            match op {
                LedgerOp::Charge(c) => { let _ = ledger.charge(&c); }
                LedgerOp::Usage(u) => { ledger.record_usage(&u); }
            }
        }
        let mut policy = Policy { max_actions_per_failure: cap, ..Policy::default() };
        if let Some(l) = custom {
            policy.ladders.insert(class, l);
        }
        prop_assert!(policy.validate().is_ok());
        let failure = Classification { class, error_type: class.default_error_type(), retry_after_ms: None };
        let d = policy.decide(LadderState { rung, retries, actions }, &failure, &opts, &ledger, &mut SplitMix64::new(seed));
        let kind = d.action.kind();
        if kind.is_terminal() {
            prop_assert_eq!(d.charge, Amounts::default());
            if kind == ActionKind::Degrade {
                prop_assert!(opts.partial_result, "degrade without a partial result");
            }
        } else {
            prop_assert!(ledger.can_afford(&d.charge), "{:?} is unaffordable", d.action);
            prop_assert_eq!(d.charge, kind.charge());
            prop_assert!(ledger.exhausted().is_none(), "acted on a run whose latency/cost is spent");
            match d.rung {
                // The last-chance action: only when exactly one action is left.
                None => {
                    prop_assert_eq!(policy.last_chance_kind(&failure, &opts, &ledger), Some(kind));
                    prop_assert_eq!(cap, Some(actions + 1));
                }
                Some(r) => {
                    prop_assert!(policy.ladder(class).contains(&kind), "{:?} is not on the ladder", kind);
                    prop_assert!(r >= rung);
                }
            }
            prop_assert!(cap.is_none_or(|c| actions < c), "acted past the per-failure cap");
            prop_assert!(ledger.charge(&d.charge).is_ok());
        }
        prop_assert!(d.next.rung > rung.min(policy.ladder(class).len()) || d.rung.is_none());
    }

    #[test]
    fn backoff_stays_within_jitter_and_honours_retry_after(
        base_ms in 1u64..5_000,
        factor in 1.0f64..4.0,
        jitter in 0.0f64..=1.0,
        attempt in 1u32..100,
        retry_after in prop::option::of(0u64..200_000),
        seed in any::<u64>(),
    ) {
        let cfg = RetryConfig { base_ms, factor, max_ms: 30_000, jitter, max_retry_after_ms: 60_000 };
        let delay = cfg.delay_ms(attempt, retry_after, &mut SplitMix64::new(seed));
        let nominal = (base_ms as f64 * factor.powi(attempt as i32 - 1)).min(30_000.0);
        let lo = (nominal * (1.0 - jitter)).floor() as u64;
        let hi = (nominal * (1.0 + jitter)).ceil() as u64;
        let floor = retry_after.map_or(0, |ra| ra.min(60_000));
        prop_assert!(delay >= lo.max(floor), "{delay} < {lo} / {floor}");
        prop_assert!(delay <= hi.max(floor), "{delay} > {hi} / {floor}");
    }
}

// ── monitor ───────────────────────────────────────────────────────────────────────────────────

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn monitor_verdicts_are_deterministic(
        calls in prop::collection::vec(call_spec(6), 0..200),
        interactive in any::<bool>(),
    ) {
        let cfg = MonitorConfig {
            mode: if interactive { MonitorMode::Interactive } else { MonitorMode::Autonomous },
            ..MonitorConfig::default()
        };
        let mut a = Monitor::new(cfg.clone()).unwrap();
        let mut b = Monitor::new(cfg).unwrap();
        let mut now = 0u64;
        for (i, spec) in calls.iter().enumerate() {
            now += u64::from(spec.dt);
            let name = format!("tool{}", spec.tool);
            let ra = feed(&mut a, spec, now, &name);
            let rb = feed(&mut b, spec, now, &name);
            prop_assert_eq!(ra, rb, "diverged at call {}", i);
            if i == calls.len() / 2 {
                // A clone taken mid-run continues identically.
                b = a.clone();
            }
        }
        // Capacities differ after a clone, so compare what is held, not the bytes reserved.
        let (fa, fb) = (a.memory_footprint(), b.memory_footprint());
        prop_assert_eq!((fa.tools, fa.recent), (fb.tools, fb.recent));
        prop_assert_eq!(a.calls(), b.calls());
    }

    #[test]
    fn monitor_memory_stays_bounded_with_many_distinct_tools(
        calls in prop::collection::vec((call_spec(10_000), 1usize..300), 1..600),
        max_tools in 1usize..40,
    ) {
        let cfg = MonitorConfig { max_tools, ..MonitorConfig::default() };
        let ring = cfg.duplicate_window.max(cfg.empty_input_window).max(cfg.alternation_window).max(cfg.abort_window);
        let mut m = Monitor::new(cfg).unwrap();
        // Per tool: its state, a name of at most 128 bytes stored twice, two errors of at most
        // 240 bytes, and a hash-map slot; the map may hold up to twice its entries in capacity.
        let per_tool = std::mem::size_of::<usize>() * 16 + 2 * 128 + 2 * 240 + 64;
        let bound = std::mem::size_of::<Monitor>() + 2 * max_tools.max(64) * per_tool + ring * 64;
        let mut now = 0u64;
        for (spec, name_len) in &calls {
            now += u64::from(spec.dt);
            let mut name = format!("tool{}-", spec.tool);
            while name.len() < *name_len {
                name.push('x');
            }
            feed(&mut m, spec, now, &name);
            let f = m.memory_footprint();
            prop_assert!(f.tools <= max_tools, "{} tools > {}", f.tools, max_tools);
            prop_assert!(f.recent <= ring);
            prop_assert!(f.bytes_estimate <= bound, "{} bytes > {}", f.bytes_estimate, bound);
            let v = m.check(now);
            prop_assert!(v.guidance.len() <= max_tools + 4);
            prop_assert!(v.hidden_tools.len() <= max_tools);
        }
        prop_assert_eq!(m.calls(), calls.len() as u64);
    }

    #[test]
    fn abort_fires_exactly_when_failures_exceed_seventy_percent_of_at_least_six_calls(
        outcomes in prop::collection::vec(any::<bool>(), 1..=20),
    ) {
        let mut m = Monitor::default();
        for (i, &failed) in outcomes.iter().enumerate() {
            // A fresh tool and fresh arguments per call: only the failure-rate rule is in play.
            let tool = format!("t{i}");
            let args = json!({"i": i});
            let result = json!({"ok": i});
            let error = format!("error {i}");
            let call = if failed {
                ToolCall::failed(&tool, &args, &error)
            } else {
                ToolCall::returned(&tool, &args, &result)
            };
            m.record(&call, 0);
        }
        let n = outcomes.len();
        let k = outcomes.iter().filter(|&&f| f).count();
        let expected = n >= 6 && k * 10 > 7 * n;
        prop_assert_eq!(m.check(0).abort.is_some(), expected, "{} of {}", k, n);
    }
}

// ── controller ────────────────────────────────────────────────────────────────────────────────

#[derive(Debug, Clone)]
enum Obs {
    ToolFail { step: u32, tool: u8, status: u16 },
    ToolOk { step: u32, tool: u8, n: u8 },
    Model { step: u32, signal: u8 },
    Reject { step: u32 },
}

fn obs() -> impl Strategy<Value = Obs> {
    prop_oneof![
        4 => (0u32..4, 0u8..4, prop::sample::select(vec![429u16, 500, 503, 404, 400])).prop_map(|(step, tool, status)| Obs::ToolFail { step, tool, status }),
        3 => (0u32..4, 0u8..4, any::<u8>()).prop_map(|(step, tool, n)| Obs::ToolOk { step, tool, n }),
        1 => (0u32..4, 0u8..5).prop_map(|(step, signal)| Obs::Model { step, signal }),
        1 => (0u32..4).prop_map(|step| Obs::Reject { step }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn controller_stops_within_budget_and_stays_stopped(
        limits in limits(),
        seq in prop::collection::vec(obs(), 0..150),
        interactive in any::<bool>(),
        seed in any::<u64>(),
    ) {
        let mut c = Controller::new(ControllerConfig {
            budget: limits,
            monitor: MonitorConfig {
                mode: if interactive { MonitorMode::Interactive } else { MonitorMode::Autonomous },
                ..MonitorConfig::default()
            },
            ..ControllerConfig::default()
        }).unwrap();
        let mut rng = SplitMix64::new(seed);
        let mut stopped: Option<Directive> = None;
        let mut recoveries = 0u64;
        for (t, o) in seq.iter().enumerate() {
            let opts = Options::all("alt", "big");
            let args = json!({"x": t % 3});
            let results = [json!({"n": t % 5}), json!({"results": []})];
            let tool_names = ["a", "b", "c", "d"];
            let observation = match *o {
                Obs::ToolFail { step, tool, status } => Observation::ToolFinished {
                    step: Some(step),
                    call: ToolCall::failed(tool_names[tool as usize], &args, "failed"),
                    signal: Some(Signal::HttpStatus { status, retry_after_ms: None, message: String::new() }),
                    options: opts,
                    usage: Amounts { latency_ms: 1, ..Amounts::default() },
                },
                Obs::ToolOk { step, tool, n } => Observation::ToolFinished {
                    step: Some(step),
                    call: ToolCall::returned(tool_names[tool as usize], &args, &results[usize::from(n % 2)]),
                    signal: None,
                    options: opts,
                    usage: Amounts::default(),
                },
                Obs::Model { step, signal } => Observation::ModelFinished {
                    step: Some(step),
                    signal: match signal {
                        0 => None,
                        1 => Some(Signal::Refusal),
                        2 => Some(Signal::ContextLength),
                        3 => Some(Signal::Repetition),
                        _ => Some(Signal::Timeout),
                    },
                    options: opts,
                    usage: Amounts { cost: 1, ..Amounts::default() },
                },
                Obs::Reject { step } => Observation::Verified {
                    step: Some(step),
                    verifier: "v",
                    judgement: selfheal_core::Judgement::Reject { reason: "no".into() },
                    options: opts,
                },
            };
            let d = c.observe(observation, t as u64, &mut rng);
            if let Some(first) = &stopped {
                prop_assert_eq!(&d, first, "a stopped run answers as it stopped");
            }
            match d {
                Directive::Recover { ref action, .. } => {
                    recoveries += 1;
                    prop_assert!(!matches!(action, RecoveryAction::Degrade | RecoveryAction::Terminate));
                }
                Directive::Degrade { .. } | Directive::Abort { .. } => {
                    stopped.get_or_insert(d);
                }
                Directive::Continue { .. } => {}
            }
        }
        prop_assert!(recoveries <= limits.recoveries);
        let spent = c.ledger().spent();
        for d in [Dimension::Retries, Dimension::Replans, Dimension::Substitutions, Dimension::Escalations, Dimension::Recoveries] {
            prop_assert!(spent.get(d) <= limits.get(d), "{} overspent", d);
        }
        let outcome = c.finish(seq.len() as u64);
        prop_assert!(outcome.unresolved.len() <= 64);
        let seqs: Vec<u64> = c.trace().records().map(|r| r.seq).collect();
        prop_assert!(seqs.windows(2).all(|w| w[1] == w[0] + 1));
    }
}

#[test]
fn policy_decisions_are_deterministic_for_a_seed() {
    let p = Policy::default();
    let ledger = BudgetLedger::new(BudgetLimits::defaults());
    let f = Classification {
        class: FailureClass::ToolTimeout,
        error_type: FailureClass::ToolTimeout.default_error_type(),
        retry_after_ms: None,
    };
    let opts = Options::all("a", "b");
    let one = p.decide(
        LadderState::default(),
        &f,
        &opts,
        &ledger,
        &mut SplitMix64::new(9),
    );
    let two = p.decide(
        LadderState::default(),
        &f,
        &opts,
        &ledger,
        &mut SplitMix64::new(9),
    );
    assert_eq!(one, two);
    let other = p.decide(LadderState::default(), &f, &opts, &ledger, &mut ConstRng(0));
    assert_ne!(one.action, other.action, "jitter comes from the rng");
}

// ── canonical hashing ─────────────────────────────────────────────────────────────────────────

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        (-3i64..3).prop_map(|i| json!(i)),
        prop::sample::select(vec![0.5f64, -0.0, 2.0, 1e300]).prop_map(|f| json!(f)),
        "[ab]{0,3}".prop_map(Value::String),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map("[kq]{1,2}", inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// Numbers as floats: the canonical form the monitor compares (`1` == `1.0`, `0` == `-0.0`).
fn canonical(v: &Value) -> Value {
    match v {
        Value::Number(n) => {
            let f = n.as_f64().unwrap();
            json!(if f == 0.0 { 0.0 } else { f })
        }
        Value::Array(a) => Value::Array(a.iter().map(canonical).collect()),
        Value::Object(o) => {
            Value::Object(o.iter().map(|(k, x)| (k.clone(), canonical(x))).collect())
        }
        Value::Null | Value::Bool(_) | Value::String(_) => v.clone(),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2048))]

    #[test]
    fn canonical_hash_equal_exactly_when_canonically_equal(a in json_value(), b in json_value()) {
        use selfheal_core::canonical_hash;
        prop_assert_eq!(canonical_hash(&a), canonical_hash(&canonical(&a)));
        prop_assert_eq!(
            canonical_hash(&a) == canonical_hash(&b),
            canonical(&a) == canonical(&b),
            "{} vs {}", a, b
        );
    }
}
