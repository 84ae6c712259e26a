//! Integration tests of the tool-health monitor (SPEC §1): every rule at its boundaries.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use selfheal_core::{
    Badge, CallReport, CircuitState, FailureKind, GuidanceKind, Monitor, MonitorConfig,
    MonitorMode, MonitorSignal, ToolCall, Verdict,
};
use serde_json::{Value, json};

fn ok(m: &mut Monitor, tool: &str, args: &Value) -> CallReport {
    ok_at(m, tool, args, 0)
}

fn ok_at(m: &mut Monitor, tool: &str, args: &Value, now_ms: u64) -> CallReport {
    let result = json!({"ok": m.calls()});
    m.record(&ToolCall::returned(tool, args, &result), now_ms)
}

fn fail(m: &mut Monitor, tool: &str, args: &Value, error: &str) -> CallReport {
    fail_at(m, tool, args, error, 0)
}

fn fail_at(m: &mut Monitor, tool: &str, args: &Value, error: &str, now_ms: u64) -> CallReport {
    m.record(&ToolCall::failed(tool, args, error), now_ms)
}

/// A fresh argument object per call, so the duplicate and loop rules stay quiet.
fn args(i: u64) -> Value {
    json!({"q": format!("query number {i}")})
}

fn kinds(v: &Verdict) -> Vec<GuidanceKind> {
    v.guidance.iter().map(|g| g.kind).collect()
}

fn has(v: &Verdict, kind: GuidanceKind) -> bool {
    v.guidance.iter().any(|g| g.kind == kind)
}

fn guidance_for<'a>(v: &'a Verdict, kind: GuidanceKind, tool: &str) -> Option<&'a str> {
    v.guidance
        .iter()
        .find(|g| g.kind == kind && g.tool.as_deref() == Some(tool))
        .map(|g| g.text.as_str())
}

/// `n` consecutive failures of `tool`, each with its own arguments and error ("error 0", …).
fn fail_streak(m: &mut Monitor, tool: &str, n: u64) {
    for i in 0..n {
        fail(m, tool, &args(i), &format!("error {i}"));
    }
}

fn interactive() -> Monitor {
    Monitor::new(MonitorConfig {
        mode: MonitorMode::Interactive,
        ..MonitorConfig::default()
    })
    .unwrap()
}

// ── consecutive failures: warning at 3 ────────────────────────────────────────────────────────

#[test]
fn two_consecutive_failures_do_not_warn() {
    let mut m = Monitor::default();
    for i in 0..2 {
        let r = fail(&mut m, "search", &args(i), &format!("error {i}"));
        assert!(!r.signals.contains(MonitorSignal::ConsecutiveFailures));
    }
    let v = m.check(0);
    assert!(!has(&v, GuidanceKind::Warning), "{v:?}");
    assert_eq!(m.streak("search"), 2);
}

#[test]
fn third_consecutive_failure_warns_naming_tool_and_last_two_errors() {
    let mut m = Monitor::default();
    fail_streak(&mut m, "search", 3);
    let v = m.check(0);
    let text = guidance_for(&v, GuidanceKind::Warning, "search").expect("a warning");
    assert!(text.contains("`search`"), "{text}");
    assert!(
        text.contains("error 1") && text.contains("error 2"),
        "{text}"
    );
    assert!(
        !text.contains("error 0"),
        "only the last two errors: {text}"
    );
    assert!(v.hidden_tools.is_empty());
    assert!(v.abort.is_none());
}

#[test]
fn fourth_failure_still_only_warns_and_fifth_opens_the_circuit() {
    let mut m = Monitor::default();
    for i in 0..4 {
        let r = fail(&mut m, "search", &args(i), "HTTP 503");
        assert!(!r.signals.contains(MonitorSignal::CircuitOpen));
    }
    let v = m.check(0);
    assert!(v.hidden_tools.is_empty(), "4 failures must not hide: {v:?}");
    assert!(has(&v, GuidanceKind::Warning));
    assert_eq!(m.circuit("search"), CircuitState::Closed);

    let r = fail(&mut m, "search", &args(4), "HTTP 503");
    assert!(r.signals.contains(MonitorSignal::CircuitOpen));
    assert_eq!(r.badge, Badge::CircuitBroken);
    assert_eq!(r.consecutive_failures, 5);
    let v = m.check(0);
    assert_eq!(v.hidden_tools, vec!["search".to_string()]);
    assert!(guidance_for(&v, GuidanceKind::CircuitOpen, "search").is_some());
    assert!(
        !has(&v, GuidanceKind::Warning),
        "an open circuit replaces the warning"
    );
    assert!(matches!(
        m.circuit("search"),
        CircuitState::Open { since_call: 5, .. }
    ));
}

#[test]
fn a_success_resets_the_streak() {
    let mut m = Monitor::default();
    fail(&mut m, "search", &args(0), "e");
    fail(&mut m, "search", &args(1), "e2");
    ok(&mut m, "search", &args(2));
    fail(&mut m, "search", &args(3), "e3");
    fail(&mut m, "search", &args(4), "e4");
    assert_eq!(m.streak("search"), 2);
    assert!(!has(&m.check(0), GuidanceKind::Warning));
}

#[test]
fn streaks_are_per_tool_so_interleaved_successes_of_another_tool_do_not_reset_them() {
    // A✗ B✓ A✗ B✓ A✗: the original monitor's global streak never warned here.
    let mut m = Monitor::default();
    fail(&mut m, "a", &args(0), "a broke 0");
    ok(&mut m, "b", &args(1));
    fail(&mut m, "a", &args(2), "a broke 1");
    ok(&mut m, "b", &args(3));
    let r = fail(&mut m, "a", &args(4), "a broke 2");
    assert_eq!(r.consecutive_failures, 3);
    assert!(r.signals.contains(MonitorSignal::ConsecutiveFailures));
    let v = m.check(0);
    assert!(
        guidance_for(&v, GuidanceKind::Warning, "a").is_some(),
        "{v:?}"
    );
    assert!(guidance_for(&v, GuidanceKind::Warning, "b").is_none());
    assert_eq!(m.streak("b"), 0);
}

// ── abort: failure rate strictly above 70 % over at least 6 of the last 20 calls ──────────────

/// Records `failures` failing and `successes` succeeding calls, spreading the failures over
/// several tools so no circuit opens and no loop or duplicate forms.
fn mixed_run(m: &mut Monitor, failures: u64, successes: u64) {
    let mut i = 0;
    for f in 0..failures {
        fail(
            m,
            &format!("tool{}", f % 4),
            &args(i),
            &format!("error {i}"),
        );
        i += 1;
    }
    for _ in 0..successes {
        ok(m, "good", &args(i));
        i += 1;
    }
}

/// The verdict of a default monitor after a `mixed_run`.
fn mixed_verdict(failures: u64, successes: u64) -> Verdict {
    let mut m = Monitor::default();
    mixed_run(&mut m, failures, successes);
    m.check(0)
}

#[test]
fn seven_of_ten_failing_is_exactly_seventy_percent_and_does_not_abort() {
    let v = mixed_verdict(7, 3);
    assert!(v.abort.is_none(), "{v:?}");
}

#[test]
fn eight_of_ten_failing_aborts_with_a_reason() {
    let v = mixed_verdict(8, 2);
    let reason = v.abort.expect("8 of 10 must abort");
    assert!(reason.contains("8 of the last 10"), "{reason}");
}

#[test]
fn five_of_five_failing_is_too_few_calls_to_abort() {
    assert!(mixed_verdict(5, 0).abort.is_none());
}

#[test]
fn five_of_six_failing_aborts() {
    let v = mixed_verdict(5, 1);
    assert!(v.abort.is_some(), "{v:?}");
}

#[test]
fn abort_only_counts_the_last_twenty_calls() {
    let mut m = Monitor::default();
    // 14 failures, then 6 successes: exactly 70 % of 20, no abort.
    mixed_run(&mut m, 14, 6);
    assert!(m.check(0).abort.is_none());
    // One more failure pushes the oldest failure out of the window: still 14 of 20.
    fail(&mut m, "tool9", &args(100), "late");
    assert!(m.check(0).abort.is_none());
}

#[test]
fn exactly_the_threshold_never_aborts_even_where_float_multiplication_rounds_down() {
    // 63 of 90 is exactly 70 %, but 0.7 * 90.0 == 62.99999999999999 in f64: the comparison must
    // not be `failed > rate * n`.
    let cfg = MonitorConfig {
        abort_window: 90,
        ..MonitorConfig::default()
    };
    let mut m = Monitor::new(cfg.clone()).unwrap();
    mixed_run(&mut m, 63, 27);
    assert!(m.check(0).abort.is_none(), "63 of 90 is not above 70 %");

    let mut m = Monitor::new(cfg).unwrap();
    mixed_run(&mut m, 64, 26);
    assert!(m.check(0).abort.is_some(), "64 of 90 is above 70 %");
}

#[test]
fn abort_reason_disappears_when_the_failure_rate_recovers() {
    let mut m = Monitor::default();
    mixed_run(&mut m, 5, 1);
    assert!(m.check(0).abort.is_some());
    for i in 0..10 {
        ok(&mut m, "good", &args(200 + i));
    }
    assert!(m.check(0).abort.is_none());
}

// ── circuit breaker: open → cooldown → half-open → closed / re-opened ─────────────────────────

/// A monitor whose open circuits go half-open after `cooldown_ms` only, whatever the calls.
fn timed_cooldown(cooldown_ms: u64) -> Monitor {
    Monitor::new(MonitorConfig {
        cooldown_calls: 0,
        cooldown_ms,
        ..MonitorConfig::default()
    })
    .unwrap()
}

fn open_circuit(m: &mut Monitor, tool: &str, now_ms: u64) {
    for i in 0..5 {
        fail_at(m, tool, &args(1000 + i), "HTTP 503", now_ms);
    }
    assert!(matches!(m.circuit(tool), CircuitState::Open { .. }));
}

#[test]
fn circuit_goes_half_open_after_more_than_cooldown_calls() {
    let mut m = Monitor::new(MonitorConfig {
        cooldown_ms: 0,
        ..MonitorConfig::default()
    })
    .unwrap();
    open_circuit(&mut m, "a", 0);
    // Calls of other tools, interleaved with enough successes that the abort rule stays quiet.
    for i in 0..10 {
        ok(&mut m, "b", &args(i));
    }
    let v = m.check(0);
    assert_eq!(
        v.hidden_tools,
        vec!["a".to_string()],
        "10 calls since opening is not more than 10"
    );
    ok(&mut m, "b", &args(10));
    let v = m.check(0);
    assert!(v.hidden_tools.is_empty(), "11 calls since opening: {v:?}");
    assert_eq!(m.circuit("a"), CircuitState::HalfOpen);
    let text = guidance_for(&v, GuidanceKind::HalfOpen, "a").expect("half-open guidance");
    assert!(text.contains("`a`"));
    assert!(!has(&v, GuidanceKind::CircuitOpen));
}

#[test]
fn circuit_goes_half_open_after_cooldown_ms() {
    let mut m = timed_cooldown(1_000);
    open_circuit(&mut m, "a", 5_000);
    assert_eq!(m.check(5_999).hidden_tools, vec!["a".to_string()]);
    let v = m.check(6_000);
    assert!(v.hidden_tools.is_empty());
    assert!(has(&v, GuidanceKind::HalfOpen));
}

#[test]
fn half_open_probe_success_closes_the_circuit() {
    let mut m = timed_cooldown(1_000);
    open_circuit(&mut m, "a", 0);
    assert_eq!(m.check(1_000).hidden_tools, Vec::<String>::new());
    let r = ok_at(&mut m, "a", &args(1), 1_000);
    assert_eq!(r.consecutive_failures, 0);
    assert_eq!(m.circuit("a"), CircuitState::Closed);
    let v = m.check(1_000);
    assert!(
        guidance_for(&v, GuidanceKind::HalfOpen, "a").is_none(),
        "{v:?}"
    );
    assert!(guidance_for(&v, GuidanceKind::Warning, "a").is_none());
    assert!(v.hidden_tools.is_empty());
}

#[test]
fn half_open_probe_failure_reopens_the_circuit_with_a_fresh_cooldown() {
    let mut m = timed_cooldown(1_000);
    open_circuit(&mut m, "a", 0);
    assert!(m.check(1_500).hidden_tools.is_empty());
    let r = fail_at(&mut m, "a", &args(1), "still down", 1_500);
    assert!(r.signals.contains(MonitorSignal::CircuitOpen));
    assert_eq!(
        m.circuit("a"),
        CircuitState::Open {
            since_call: 6,
            since_ms: 1_500
        }
    );
    assert_eq!(m.check(2_499).hidden_tools, vec!["a".to_string()]);
    assert!(m.check(2_500).hidden_tools.is_empty());
}

#[test]
fn circuit_with_both_cooldowns_disabled_stays_open() {
    let mut m = Monitor::new(MonitorConfig {
        cooldown_calls: 0,
        cooldown_ms: 0,
        ..MonitorConfig::default()
    })
    .unwrap();
    open_circuit(&mut m, "a", 0);
    for i in 0..50 {
        ok_at(&mut m, "b", &args(i), i * 10_000);
    }
    assert_eq!(m.check(10_000_000).hidden_tools, vec!["a".to_string()]);
}

// ── duplicates ────────────────────────────────────────────────────────────────────────────────

#[test]
fn duplicate_ignores_key_order_and_number_spelling() {
    let mut m = Monitor::default();
    ok(
        &mut m,
        "search",
        &json!({"q": "rust", "limit": 1, "opts": {"a": 1, "b": [1, 2]}}),
    );
    let r = ok(
        &mut m,
        "search",
        &json!({"opts": {"b": [1.0, 2], "a": 1.0}, "limit": 1.0, "q": "rust"}),
    );
    assert!(r.signals.contains(MonitorSignal::DuplicateCall));
    assert_eq!(r.badge, Badge::Duplicate);
    let v = m.check(0);
    let text = guidance_for(&v, GuidanceKind::Duplicate, "search").expect("duplicate guidance");
    assert!(text.contains("`search`"));
}

#[test]
fn different_values_array_order_or_tool_are_not_duplicates() {
    let mut m = Monitor::default();
    ok(&mut m, "search", &json!({"q": "rust", "ids": [1, 2]}));
    for (tool, a) in [
        ("search", json!({"q": "rust", "ids": [2, 1]})),
        ("search", json!({"q": "Rust", "ids": [1, 2]})),
        ("search", json!({"q": "rust", "ids": [1, 2], "x": null})),
        ("fetch", json!({"q": "rust", "ids": [1, 2]})),
    ] {
        let r = ok(&mut m, tool, &a);
        assert!(!r.signals.contains(MonitorSignal::DuplicateCall), "{a}");
    }
    assert!(!has(&m.check(0), GuidanceKind::Duplicate));
}

#[test]
fn duplicate_within_last_eight_calls_but_not_nine_calls_apart() {
    // Call 1 and call 8 are both inside a window of 8 calls.
    let mut m = Monitor::default();
    let same = json!({"q": "same"});
    ok(&mut m, "search", &same);
    for i in 0..6 {
        ok(&mut m, "other", &args(i));
    }
    let r = ok(&mut m, "search", &same);
    assert!(r.signals.contains(MonitorSignal::DuplicateCall), "8th call");

    // Call 1 and call 9 are not.
    let mut m = Monitor::default();
    ok(&mut m, "search", &same);
    for i in 0..7 {
        ok(&mut m, "other", &args(i));
    }
    let r = ok(&mut m, "search", &same);
    assert!(
        !r.signals.contains(MonitorSignal::DuplicateCall),
        "9th call"
    );
}

#[test]
fn duplicate_guidance_disappears_after_a_fresh_call() {
    let mut m = Monitor::default();
    let same = json!({"q": "same"});
    ok(&mut m, "search", &same);
    ok(&mut m, "search", &same);
    assert!(has(&m.check(0), GuidanceKind::Duplicate));
    ok(&mut m, "search", &json!({"q": "different"}));
    let v = m.check(0);
    assert!(!has(&v, GuidanceKind::Duplicate), "{v:?}");
}

// ── empty input ───────────────────────────────────────────────────────────────────────────────

fn required() -> Vec<String> {
    vec!["query".to_string()]
}

/// A `search` call with `args` that returned `result`; its `query` argument is required.
fn search(m: &mut Monitor, args: &Value, result: &Value) -> CallReport {
    let req = required();
    m.record(
        &ToolCall::returned("search", args, result).with_required(&req),
        0,
    )
}

fn call_with(m: &mut Monitor, i: u64, query: Value) -> CallReport {
    search(m, &json!({"query": query, "n": i}), &json!({"hits": [i]}))
}

#[test]
fn every_placeholder_in_a_required_argument_is_empty_input() {
    for p in [
        json!(""),
        json!("   "),
        Value::Null,
        json!("string"),
        json!("<value>"),
        json!("TODO"),
        json!("..."),
        json!({}),
        json!([]),
        json!("<city name>"),
        json!("{{query}}"),
    ] {
        let mut m = Monitor::default();
        let r = call_with(&mut m, 0, p.clone());
        assert_eq!(r.badge, Badge::EmptyInput, "{p}");
    }
}

#[test]
fn a_missing_required_argument_is_empty_input() {
    let mut m = Monitor::default();
    let r = search(&mut m, &json!({"other": 1}), &json!({"hits": [1]}));
    assert_eq!(r.badge, Badge::EmptyInput);
}

#[test]
fn real_values_and_placeholders_in_optional_arguments_are_not_empty_input() {
    let mut m = Monitor::default();
    for (i, q) in [
        json!("rust borrow checker"),
        json!(0),
        json!(false),
        json!("a"),
    ]
    .into_iter()
    .enumerate()
    {
        let r = call_with(&mut m, i as u64, q.clone());
        assert_ne!(r.badge, Badge::EmptyInput, "{q}");
    }
    // A placeholder in an argument that is not required does not count.
    let r = search(
        &mut m,
        &json!({"query": "rust", "lang": "TODO"}),
        &json!({"hits": [1]}),
    );
    assert_eq!(r.badge, Badge::Ok);
}

#[test]
fn configured_placeholders_are_recognised_case_insensitively() {
    let mut m = Monitor::new(MonitorConfig {
        placeholders: vec!["FILL ME".into()],
        ..MonitorConfig::default()
    })
    .unwrap();
    assert!(m.is_placeholder(&json!("fill me")));
    assert_eq!(
        call_with(&mut m, 0, json!("Fill Me")).badge,
        Badge::EmptyInput
    );
}

#[test]
fn a_single_empty_input_raises_no_signal() {
    let mut m = Monitor::default();
    let r = call_with(&mut m, 0, json!(""));
    assert!(!r.signals.contains(MonitorSignal::EmptyInput));
    for i in 1..5 {
        call_with(&mut m, i, json!(format!("real query {i}")));
    }
    assert!(!has(&m.check(0), GuidanceKind::EmptyInput));
}

#[test]
fn two_empty_inputs_within_five_calls_raise_the_signal() {
    let mut m = Monitor::default();
    call_with(&mut m, 0, json!("TODO"));
    for i in 1..4 {
        call_with(&mut m, i, json!(format!("real query {i}")));
    }
    let r = call_with(&mut m, 4, Value::Null);
    assert!(r.signals.contains(MonitorSignal::EmptyInput));
    assert!(has(&m.check(0), GuidanceKind::EmptyInput));
}

#[test]
fn two_empty_inputs_six_calls_apart_raise_no_signal() {
    let mut m = Monitor::default();
    call_with(&mut m, 0, json!("TODO"));
    for i in 1..5 {
        call_with(&mut m, i, json!(format!("real query {i}")));
    }
    let r = call_with(&mut m, 5, Value::Null);
    assert!(!r.signals.contains(MonitorSignal::EmptyInput));
}

#[test]
fn empty_input_guidance_disappears_once_the_window_is_clean() {
    let mut m = Monitor::default();
    call_with(&mut m, 0, json!(""));
    call_with(&mut m, 1, json!(""));
    assert!(has(&m.check(0), GuidanceKind::EmptyInput));
    for i in 2..5 {
        call_with(&mut m, i, json!(format!("real query {i}")));
    }
    assert!(
        has(&m.check(0), GuidanceKind::EmptyInput),
        "both still in the last 5"
    );
    call_with(&mut m, 5, json!("real query 5"));
    assert!(
        !has(&m.check(0), GuidanceKind::EmptyInput),
        "one left in the last 5"
    );
}

// ── loops ─────────────────────────────────────────────────────────────────────────────────────

fn loop_text(v: &Verdict) -> Option<&str> {
    v.guidance
        .iter()
        .find(|g| g.kind == GuidanceKind::Loop)
        .map(|g| g.text.as_str())
}

#[test]
fn ab_alternation_over_six_calls_is_a_loop_but_five_is_not() {
    let mut m = Monitor::default();
    let (a, b) = (json!({"page": 1}), json!({"page": 2}));
    for i in 0..5u64 {
        // Different results each time, so only the alternation rule can fire.
        let result = json!({"n": i});
        let (tool, arg) = if i % 2 == 0 { ("a", &a) } else { ("b", &b) };
        let r = m.record(&ToolCall::returned(tool, arg, &result), 0);
        assert!(!r.signals.contains(MonitorSignal::Loop), "call {}", i + 1);
    }
    let result = json!({"n": 5});
    let r = m.record(&ToolCall::returned("b", &b, &result), 0);
    assert!(r.signals.contains(MonitorSignal::Loop));
    let v = m.check(0);
    assert!(
        loop_text(&v).is_some_and(|t| t.contains("alternating")),
        "{v:?}"
    );
}

#[test]
fn same_error_text_three_times_is_a_loop_but_twice_is_not() {
    let mut m = Monitor::default();
    // Three different tools, so no streak or circuit explains it.
    let r = fail(&mut m, "a", &args(0), "permission denied: /etc/shadow");
    assert!(!r.signals.contains(MonitorSignal::Loop));
    ok(&mut m, "ok", &args(1));
    let r = fail(&mut m, "b", &args(2), "permission denied: /etc/shadow");
    assert!(!r.signals.contains(MonitorSignal::Loop));
    ok(&mut m, "ok", &args(3));
    let r = fail(&mut m, "c", &args(4), "permission denied: /etc/shadow");
    assert!(r.signals.contains(MonitorSignal::Loop));
    let v = m.check(0);
    assert!(
        loop_text(&v).is_some_and(|t| t.contains("same error")),
        "{v:?}"
    );
}

#[test]
fn identical_call_with_identical_result_three_times_is_a_loop() {
    let mut m = Monitor::default();
    let a = json!({"q": "weather"});
    let result = json!({"temp": 21});
    for n in 1..=3 {
        let r = m.record(&ToolCall::returned("w", &a, &result), 0);
        assert_eq!(r.signals.contains(MonitorSignal::Loop), n == 3, "call {n}");
    }
    let v = m.check(0);
    assert!(
        loop_text(&v).is_some_and(|t| t.contains("same result")),
        "{v:?}"
    );
}

#[test]
fn identical_call_with_changing_results_is_not_a_result_loop() {
    let mut m = Monitor::default();
    let a = json!({"q": "clock"});
    for n in 0..3u64 {
        let result = json!({"time": n});
        let r = m.record(&ToolCall::returned("clock", &a, &result), 0);
        assert!(!r.signals.contains(MonitorSignal::Loop));
    }
}

#[test]
fn loop_guidance_disappears_when_the_loop_is_broken() {
    let mut m = Monitor::default();
    let a = json!({"q": "weather"});
    let result = json!({"temp": 21});
    for _ in 0..3 {
        m.record(&ToolCall::returned("w", &a, &result), 0);
    }
    assert!(loop_text(&m.check(0)).is_some());
    ok(&mut m, "other", &args(1));
    assert!(loop_text(&m.check(0)).is_none());
}

// ── soft failures ─────────────────────────────────────────────────────────────────────────────

#[test]
fn soft_failures_are_recognised() {
    for result in [
        Value::Null,
        json!({"error": "x"}),
        json!({"isError": true}),
        json!({"results": []}),
        json!(""),
        json!([]),
        json!({}),
    ] {
        assert!(Monitor::is_soft_failure(&result), "{result}");
        let mut m = Monitor::default();
        let r = m.record(&ToolCall::returned("t", &args(0), &result), 0);
        assert_eq!(r.failure, Some(FailureKind::Soft), "{result}");
        assert_eq!(r.badge, Badge::Empty, "{result}");
        assert_eq!(r.consecutive_failures, 1);
    }
}

#[test]
fn useful_results_are_not_soft_failures() {
    for result in [
        json!({"error": null}),
        json!({"error": ""}),
        json!({"error": false}),
        json!({"isError": false, "content": "hi"}),
        json!({"results": [1]}),
        json!(0),
        json!(false),
        json!("text"),
        json!([0]),
    ] {
        assert!(!Monitor::is_soft_failure(&result), "{result}");
        let mut m = Monitor::default();
        let r = m.record(&ToolCall::returned("t", &args(0), &result), 0);
        assert_eq!(r.failure, None, "{result}");
        assert_eq!(r.badge, Badge::Ok);
    }
}

#[test]
fn soft_failures_build_streaks_and_open_circuits() {
    let mut m = Monitor::default();
    for i in 0..5 {
        m.record(
            &ToolCall::returned("t", &args(i), &json!({"results": []})),
            0,
        );
    }
    assert_eq!(m.check(0).hidden_tools, vec!["t".to_string()]);
}

#[test]
fn soft_failures_can_be_excluded_from_streaks() {
    let mut m = Monitor::new(MonitorConfig {
        soft_failures_count: false,
        ..MonitorConfig::default()
    })
    .unwrap();
    for i in 0..5 {
        let r = m.record(&ToolCall::returned("t", &args(i), &Value::Null), 0);
        assert_eq!(r.failure, Some(FailureKind::Soft));
    }
    assert_eq!(m.streak("t"), 0);
    assert!(m.check(0).hidden_tools.is_empty());
}

#[test]
fn a_repaired_successful_call_is_badged_repaired() {
    let mut m = Monitor::default();
    let a = args(0);
    let result = json!({"ok": 1});
    let mut call = ToolCall::returned("t", &a, &result);
    call.repaired = true;
    assert_eq!(m.record(&call, 0).badge, Badge::Repaired);
    assert_eq!(fail(&mut m, "u", &args(1), "boom").badge, Badge::Failed);
}

// ── interactive mode ──────────────────────────────────────────────────────────────────────────

#[test]
fn interactive_mode_never_hides_a_tool_but_explains_it() {
    let mut m = interactive();
    fail_streak(&mut m, "search", 8);
    let v = m.check(0);
    assert!(v.hidden_tools.is_empty(), "{v:?}");
    assert!(guidance_for(&v, GuidanceKind::CircuitOpen, "search").is_some());
}

#[test]
fn interactive_mode_never_aborts_but_reports_the_failure_rate() {
    let mut m = interactive();
    mixed_run(&mut m, 10, 0);
    let v = m.check(0);
    assert!(v.abort.is_none());
    assert!(has(&v, GuidanceKind::FailureRate), "{:?}", kinds(&v));
    let r = fail(&mut m, "tool0", &args(99), "again");
    assert!(!r.signals.contains(MonitorSignal::Abort));
}

#[test]
fn interactive_mode_still_warns() {
    let mut m = interactive();
    fail_streak(&mut m, "search", 3);
    assert!(has(&m.check(0), GuidanceKind::Warning));
}

// ── guidance follows its cause ────────────────────────────────────────────────────────────────

#[test]
fn warning_disappears_when_the_tool_recovers() {
    let mut m = Monitor::default();
    fail_streak(&mut m, "search", 3);
    assert!(has(&m.check(0), GuidanceKind::Warning));
    ok(&mut m, "search", &args(10));
    let v = m.check(0);
    assert!(v.guidance.is_empty(), "{v:?}");
    assert!(v.hidden_tools.is_empty());
}

#[test]
fn a_healthy_run_gets_an_empty_verdict() {
    let mut m = Monitor::default();
    for i in 0..100 {
        ok(&mut m, &format!("tool{}", i % 5), &args(i));
        assert_eq!(m.check(i), Verdict::default());
    }
}

// ── bounded memory ────────────────────────────────────────────────────────────────────────────

#[test]
fn tool_table_is_capped_at_max_tools() {
    let mut m = Monitor::new(MonitorConfig {
        max_tools: 4,
        ..MonitorConfig::default()
    })
    .unwrap();
    for i in 0..100 {
        ok(&mut m, &format!("tool{i}"), &args(i));
    }
    assert_eq!(m.memory_footprint().tools, 4);
    assert_eq!(m.forgotten_tools(), 96);
    assert!(m.memory_footprint().recent <= 20);
}

#[test]
fn failing_tools_are_kept_over_healthy_ones_when_the_table_is_full() {
    let mut m = Monitor::new(MonitorConfig {
        max_tools: 3,
        cooldown_calls: 0,
        cooldown_ms: 0,
        ..MonitorConfig::default()
    })
    .unwrap();
    open_circuit(&mut m, "broken", 0);
    for i in 0..30 {
        ok(&mut m, &format!("healthy{i}"), &args(i));
    }
    assert_eq!(m.check(0).hidden_tools, vec!["broken".to_string()]);
    assert_eq!(m.memory_footprint().tools, 3);
}

#[test]
fn very_long_tool_names_and_errors_are_truncated() {
    let mut m = Monitor::default();
    let name = "t".repeat(10_000);
    let error = "e".repeat(100_000);
    for i in 0..3 {
        fail(&mut m, &name, &args(i), &error);
    }
    let before = m.memory_footprint().bytes_estimate;
    assert!(before < 16 * 1024, "{before} bytes");
    let v = m.check(0);
    assert!(v.guidance.iter().all(|g| g.text.len() < 2_000));
}

// ── configuration ─────────────────────────────────────────────────────────────────────────────

#[test]
fn toml_config_overrides_only_what_it_names() {
    let cfg = MonitorConfig::from_toml_str(
        "mode = \"interactive\"\nwarn_after = 2\nabort_failure_rate = 0.5\nplaceholders = [\"tbd later\"]\n",
    )
    .unwrap();
    assert_eq!(cfg.mode, MonitorMode::Interactive);
    assert_eq!(cfg.warn_after, 2);
    assert_eq!(cfg.abort_failure_rate, 0.5);
    assert_eq!(cfg.placeholders, vec!["tbd later".to_string()]);
    assert_eq!(cfg.circuit_after, MonitorConfig::default().circuit_after);
    assert_eq!(
        MonitorConfig::from_toml_str("").unwrap(),
        MonitorConfig::default()
    );
}

#[test]
fn toml_config_rejects_unknown_keys_by_name() {
    let err = MonitorConfig::from_toml_str("warn_aftr = 3\n").unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("warn_aftr"), "{msg}");
    assert!(msg.starts_with("invalid monitor config"), "{msg}");
}

#[test]
fn toml_config_rejects_bad_values_clearly() {
    for (toml, needle) in [
        ("warn_after = 0", "warn_after"),
        ("abort_failure_rate = 1.5", "abort_failure_rate"),
        ("abort_failure_rate = nan", "abort_failure_rate"),
        ("alternation_window = 5", "alternation_window"),
        ("abort_window = 3", "abort_window"),
        ("max_tools = 0", "max_tools"),
        ("duplicate_window = 1", "duplicate_window"),
        ("same_error_repeats = 1", "same_error_repeats"),
        ("abort_window = 100000", "4096"),
        ("warn_after = -1", "warn_after"),
        ("mode = \"sometimes\"", "sometimes"),
        ("warn_after = \"three\"", "warn_after"),
    ] {
        let err = MonitorConfig::from_toml_str(toml).expect_err(toml);
        assert!(err.to_string().contains(needle), "{toml}: {err}");
    }
}

#[test]
fn new_validates_the_config() {
    assert!(
        Monitor::new(MonitorConfig {
            max_tools: 0,
            ..MonitorConfig::default()
        })
        .is_err()
    );
}

#[test]
fn retrying_a_call_that_failed_hard_is_not_a_duplicate() {
    let mut m = Monitor::default();
    let a = json!({"q": "rust"});
    fail(&mut m, "search", &a, "timed out");
    let result = json!({"hits": [1]});
    let r = m.record(&ToolCall::returned("search", &a, &result), 0);
    assert_eq!(r.badge, Badge::Ok);
    assert!(!r.signals.contains(MonitorSignal::DuplicateCall));
    assert!(m.check(0).guidance.is_empty());
    // Repeating the call that worked is a duplicate again.
    let r = m.record(&ToolCall::returned("search", &a, &result), 0);
    assert!(r.signals.contains(MonitorSignal::DuplicateCall));
}

#[test]
fn repeating_a_call_that_came_back_empty_is_a_duplicate() {
    let mut m = Monitor::default();
    let a = json!({"q": "nothing matches this"});
    let empty = json!({"results": []});
    m.record(&ToolCall::returned("search", &a, &empty), 0);
    let r = m.record(&ToolCall::returned("search", &a, &empty), 0);
    assert!(r.signals.contains(MonitorSignal::DuplicateCall));
}

#[test]
fn repeats_asked_for_by_a_new_user_turn_are_not_a_loop_or_a_duplicate() {
    let mut m = Monitor::default();
    let a = json!({"q": "weather"});
    let result = json!({"temp": 21});
    for n in 1..=4 {
        // The user asks again each time: the same lookup, the same answer.
        m.user_turn();
        let r = m.record(&ToolCall::returned("w", &a, &result), 0);
        assert!(!r.signals.contains(MonitorSignal::Loop), "turn {n}");
        assert!(
            !r.signals.contains(MonitorSignal::DuplicateCall),
            "turn {n}"
        );
        assert_eq!(r.badge, Badge::Ok, "turn {n}");
    }
    assert!(m.check(0).guidance.is_empty());
    // Within one turn the rules hold as before: two more identical calls make three.
    m.record(&ToolCall::returned("w", &a, &result), 0);
    let r = m.record(&ToolCall::returned("w", &a, &result), 0);
    assert!(r.signals.contains(MonitorSignal::Loop));
    assert!(r.signals.contains(MonitorSignal::DuplicateCall));
}

#[test]
fn a_user_turn_clears_standing_loop_guidance_but_not_a_tools_failures() {
    let mut m = Monitor::default();
    let a = json!({"q": "weather"});
    let result = json!({"temp": 21});
    for _ in 0..3 {
        m.record(&ToolCall::returned("w", &a, &result), 0);
    }
    assert!(has(&m.check(0), GuidanceKind::Loop));
    m.user_turn();
    assert!(!has(&m.check(0), GuidanceKind::Loop));
    // A streak spans turns: it is the tool's health, not the agent's loop.
    let mut m = Monitor::default();
    for i in 0..3 {
        m.user_turn();
        fail(&mut m, "flaky", &args(i), &format!("error {i}"));
    }
    let r = fail(&mut m, "flaky", &args(3), "error 3");
    assert!(r.consecutive_failures >= 4, "{r:?}");
    assert!(!kinds(&m.check(0)).is_empty());
}

#[test]
fn alternation_across_user_turns_is_not_a_loop() {
    let mut m = Monitor::default();
    let (a, b) = (json!({"city": "Oslo"}), json!({"city": "Rome"}));
    for i in 0..8u64 {
        m.user_turn();
        let result = json!({"n": i});
        let (tool, arg) = if i % 2 == 0 { ("a", &a) } else { ("b", &b) };
        let r = m.record(&ToolCall::returned(tool, arg, &result), 0);
        assert!(!r.signals.contains(MonitorSignal::Loop), "call {}", i + 1);
    }
}
