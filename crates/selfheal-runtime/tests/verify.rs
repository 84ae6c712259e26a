//! Verification in the agent loop, against a scripted OpenAI-compatible server on 127.0.0.1:0:
//! tool outputs checked against their output schema, final answers checked by the agent's answer
//! verifier, and a rejection recovered like any other failure instead of accepted as correct.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use serde_json::{Value, json};

use common::{Reply, Shared, answer, call, client, fast, last_message, ok, requests, server, took};
use selfheal_core::{
    ActionKind, BudgetLimits, EvidenceVerifier, FailureClass, Judgement, Policy, RunStatus,
    Subject, Verifier,
};
use selfheal_runtime::OutputSchema;
use selfheal_runtime::{Agent, Effect, FnTool, RunResult, Tool, ToolSpec};

fn user(text: &str) -> Vec<Value> {
    vec![json!({"role": "user", "content": text})]
}

/// The trace's verdict events as `(verifier, verdict)`, in order.
fn verdicts(r: &RunResult) -> Vec<(String, String)> {
    r.trace_jsonl
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|e| e["event"] == "verdict")
        .map(|e| {
            (
                e["verifier"].as_str().unwrap().to_owned(),
                e["judgement"]["verdict"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

/// The tool messages of a request (the monitor may add a system message after them).
fn tool_messages(req: &Value) -> Vec<Value> {
    req["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "tool")
        .cloned()
        .collect()
}

const TEMP_SCHEMA: &str = r#"{"type": "object", "properties": {"temp_c": {"type": "number"}},
    "required": ["temp_c"]}"#;

/// The spec of a weather tool whose output must have a numeric `temp_c`.
fn weather(name: &str) -> ToolSpec {
    ToolSpec::new(
        name,
        "Current weather in a city.",
        json!({"type": "object", "properties": {"city": {"type": "string"}},
               "required": ["city"]}),
    )
    .with_effect(Effect::ReadOnly)
    .with_output_schema(serde_json::from_str(TEMP_SCHEMA).unwrap())
    .unwrap()
}

/// A tool that returns `outputs` in turn (the last one forever), counting its calls.
fn scripted_tool(spec: ToolSpec, outputs: Vec<Value>, calls: &Arc<AtomicUsize>) -> Arc<dyn Tool> {
    let calls = calls.clone();
    FnTool::new(spec, move |_args| {
        let n = calls.fetch_add(1, Ordering::SeqCst);
        let out = outputs
            .get(n)
            .or(outputs.last())
            .cloned()
            .unwrap_or(Value::Null);
        async move { Ok(out) }
    })
    .shared()
}

fn weather_tool(outputs: Vec<Value>, calls: &Arc<AtomicUsize>) -> Arc<dyn Tool> {
    scripted_tool(weather("get_weather"), outputs, calls)
}

/// A `fast` agent with `tools`, against a server on which the model calls `get_weather` for
/// Paris and then answers `text`.
async fn weather_agent(tools: Vec<Arc<dyn Tool>>, text: &str) -> (Agent, Shared) {
    let (url, s) = server(
        vec![
            ok(call("get_weather", r#"{"city": "Paris"}"#)),
            ok(answer(text)),
        ],
        None,
    )
    .await;
    (fast(Agent::new(client(&url, 2000), "m", tools)), s)
}

/// The bad output carries this marker, so any request that shows it to the model is caught.
const BAD: &str = "warm-ish 999";

/// No message ever presents the bad output as a result: it may only be quoted in a verifier's
/// reason, in a tool message that says the output failed verification.
fn no_request_shows_the_bad_output(s: &Shared) {
    for req in requests(s) {
        for m in req["messages"].as_array().unwrap() {
            let text = m["content"].as_str().unwrap_or("");
            if text.contains(BAD) {
                assert_eq!(m["role"], "tool", "the bad output reached the model: {m}");
                assert!(
                    text.starts_with(
                        "Error: `get_weather` returned output that failed verification"
                    ),
                    "the bad output reached the model as a result: {m}"
                );
            }
        }
    }
}

#[tokio::test]
async fn an_output_that_fails_its_schema_is_retried_and_the_good_one_is_used() {
    let calls = Arc::new(AtomicUsize::new(0));
    let tool = weather_tool(vec![json!({"temp_c": BAD}), json!({"temp_c": 21})], &calls);
    let (agent, s) = weather_agent(vec![tool], "21 C").await;
    let r = agent.run(user("Weather in Paris?"), 1).await;

    assert_eq!(r.status, RunStatus::Complete, "{:?}", r.reason);
    assert_eq!(r.answer.as_deref(), Some("21 C"));
    assert_eq!(
        calls.load(Ordering::SeqCst),
        4,
        "the rejected call is retried, and its value read twice more before the answer"
    );
    // No substitute exists, so the verification_failure ladder's first feasible rung is a retry.
    assert_eq!(took(&r, ActionKind::Retry), 1);
    let reqs = requests(&s);
    assert_eq!(reqs.len(), 2, "the retry happens without asking the model");
    // One tool message for the one call: the good output.
    let shown = tool_messages(&reqs[1]);
    assert_eq!(shown.len(), 1);
    assert_eq!(shown[0]["content"], json!({"temp_c": 21}).to_string());
    no_request_shows_the_bad_output(&s);
    assert_eq!(
        verdicts(&r),
        vec![
            ("schema".to_owned(), "reject".to_owned()),
            ("schema".to_owned(), "accept".to_owned()),
            ("re_read".to_owned(), "accept".to_owned()),
            ("re_read".to_owned(), "accept".to_owned())
        ]
    );
    assert!(r.trace_jsonl.contains("verification_failure"));
    assert!(
        r.recovery_log
            .iter()
            .any(|l| l.contains("rejected the output of get_weather") && l.contains("/temp_c")),
        "{:?}",
        r.recovery_log
    );
}

#[tokio::test]
async fn a_rejected_output_goes_to_the_substitute_first() {
    let primary_calls = Arc::new(AtomicUsize::new(0));
    let backup_calls = Arc::new(AtomicUsize::new(0));
    let primary = scripted_tool(
        weather("get_weather").with_substitute("weather_backup"),
        vec![json!({"temp_c": BAD})],
        &primary_calls,
    );
    let backup = scripted_tool(
        weather("weather_backup"),
        vec![json!({"temp_c": 21})],
        &backup_calls,
    );
    let (agent, s) = weather_agent(vec![primary, backup], "21 C").await;
    let r = agent.run(user("Weather in Paris?"), 1).await;

    assert_eq!(r.status, RunStatus::Complete, "{:?}", r.reason);
    assert_eq!(primary_calls.load(Ordering::SeqCst), 1);
    assert_eq!(
        backup_calls.load(Ordering::SeqCst),
        3,
        "the substitute's value is read twice more before the answer"
    );
    assert_eq!(took(&r, ActionKind::Substitute), 1);
    assert_eq!(took(&r, ActionKind::Retry), 0);
    let shown = tool_messages(&requests(&s)[1]);
    assert_eq!(shown.len(), 1);
    assert_eq!(shown[0]["content"], json!({"temp_c": 21}).to_string());
    no_request_shows_the_bad_output(&s);
}

#[tokio::test]
async fn outputs_that_keep_failing_are_never_a_result_and_the_run_is_not_complete() {
    let calls = Arc::new(AtomicUsize::new(0));
    let tool = weather_tool(vec![json!({"temp_c": BAD})], &calls);
    let (agent, s) = weather_agent(vec![tool], "I could not get the weather.").await;
    let r = agent.run(user("Weather in Paris?"), 1).await;

    // One retry (no substitute exists); its output fails too, which reopens the same failure
    // and climbs its ladder to replan: the rejection goes back to the model.
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    assert_eq!(took(&r, ActionKind::Retry), 1);
    assert_eq!(took(&r, ActionKind::Replan), 1);
    let reqs = requests(&s);
    assert_eq!(reqs.len(), 2);
    let shown = tool_messages(&reqs[1]);
    assert_eq!(shown.len(), 1);
    let text = shown[0]["content"].as_str().unwrap();
    assert!(
        text.contains("failed verification") && text.contains("/temp_c"),
        "{text}"
    );
    no_request_shows_the_bad_output(&s);
    // The failure was never resolved: the answer is kept but the run is not complete.
    assert_eq!(r.status, RunStatus::Partial, "{:?}", r.reason);
    assert_eq!(r.answer.as_deref(), Some("I could not get the weather."));
}

#[tokio::test]
async fn an_unlimited_budget_still_stops_retrying_rejected_outputs() {
    let calls = Arc::new(AtomicUsize::new(0));
    let counter = calls.clone();
    // A different bad output every time, so the monitor's identical-result loop rule never fires.
    let tool = FnTool::new(weather("get_weather"), move |_args| {
        let n = counter.fetch_add(1, Ordering::SeqCst);
        async move { Ok(json!({"temp_c": format!("{BAD} #{n}")})) }
    })
    .shared();
    let (mut agent, s) = weather_agent(vec![tool], "I could not get the weather.").await;
    agent.config.budget = BudgetLimits::unlimited();
    // A policy that would retry a rejected output twelve times, with no per-failure cap: the
    // ladder alone would allow it, so the loop's guard of 8 rejected outputs per call must end
    // the retries. The eighth rejection is reported with retries off the table, so the
    // controller itself decides (and charges) what comes next: with a ladder of nothing but
    // retries and nothing produced yet, it terminates.
    agent.config.policy.ladders.insert(
        FailureClass::VerificationFailure,
        vec![ActionKind::Retry; 12],
    );
    agent.config.policy.max_actions_per_failure = None;
    let r = agent.run(user("Weather in Paris?"), 1).await;

    assert_eq!(calls.load(Ordering::SeqCst), 8);
    assert_eq!(
        took(&r, ActionKind::Retry),
        7,
        "seven retries happened, and seven are counted"
    );
    assert_eq!(requests(&s).len(), 1, "{:?}", r.recovery_log);
    no_request_shows_the_bad_output(&s);
    assert_eq!(r.status, RunStatus::Failed, "{:?}", r.reason);
    assert_eq!(
        r.reason.as_deref(),
        Some("terminated on verification_failure")
    );
}

fn capital_tool(calls: &Arc<AtomicUsize>) -> Arc<dyn Tool> {
    scripted_tool(
        ToolSpec::new(
            "get_capital",
            "The capital of a country.",
            json!({"type": "object", "properties": {"country": {"type": "string"}},
                   "required": ["country"]}),
        )
        .with_effect(Effect::ReadOnly),
        vec![json!({"country": "France", "capital": "Paris"})],
        calls,
    )
}

fn grounded() -> EvidenceVerifier {
    EvidenceVerifier {
        require_grounding: true,
    }
}

/// An agent with the capital tool, against a server on which the model calls `get_capital` for
/// France and then gives `replies` (and `forever` after them).
async fn capital_agent(replies: Vec<Reply>, forever: Option<Reply>) -> (Agent, Shared) {
    let mut script = vec![ok(call("get_capital", r#"{"country": "France"}"#))];
    script.extend(replies);
    let (url, s) = server(script, forever).await;
    let calls = Arc::new(AtomicUsize::new(0));
    (
        Agent::new(client(&url, 2000), "m", vec![capital_tool(&calls)]),
        s,
    )
}

#[tokio::test]
async fn a_rejected_answer_is_handed_back_with_the_reason_and_the_next_one_stands() {
    let (agent, s) = capital_agent(vec![ok(answer("Lyon")), ok(answer("Paris"))], None).await;
    let agent = fast(agent).with_answer_verifier(grounded());
    let r = agent.run(user("What is the capital of France?"), 1).await;

    assert_eq!(r.status, RunStatus::Complete, "{:?}", r.reason);
    assert_eq!(r.answer.as_deref(), Some("Paris"));
    let reqs = requests(&s);
    assert_eq!(reqs.len(), 3);
    let told = last_message(&reqs[2]);
    assert_eq!(told["role"], "user");
    let text = told["content"].as_str().unwrap();
    assert!(
        text.contains("not accepted") && text.contains("\"Lyon\" appear in no tool result"),
        "{text}"
    );
    // The rejected answer stays in the history, right before the reason.
    let msgs = reqs[2]["messages"].as_array().unwrap();
    assert_eq!(msgs[msgs.len() - 2]["content"], "Lyon");
    assert_eq!(
        verdicts(&r),
        vec![
            ("evidence".to_owned(), "reject".to_owned()),
            // After the rejection (a recovery), the tool's value is read twice more.
            ("re_read".to_owned(), "accept".to_owned()),
            ("re_read".to_owned(), "accept".to_owned()),
            ("evidence".to_owned(), "accept".to_owned())
        ]
    );
    assert_eq!(took(&r, ActionKind::Retry), 1);
    assert!(
        r.recovery_log
            .iter()
            .any(|l| l.contains("verifier `evidence` rejected the answer")),
        "{:?}",
        r.recovery_log
    );
    assert!(r.unresolved.is_empty(), "{:?}", r.unresolved);
}

#[tokio::test]
async fn an_answer_that_keeps_being_rejected_ends_partial_within_the_budget() {
    let (agent, s) = capital_agent(vec![], Some(ok(answer("Lyon")))).await;
    let agent = fast(agent).with_answer_verifier(grounded());
    let r = agent.run(user("What is the capital of France?"), 1).await;

    // The default verification_failure ladder is substitute, retry, replan, escalate, degrade.
    // For an answer there is no substitute and (one model) no fallback, so the three rejections
    // climb it as retry → replan → degrade. Degrade, not terminate, because the answer is a
    // partial result: the run ends `partial` with the answer kept and the reason, never
    // `complete`, and far inside `max_model_calls` (16).
    assert_eq!(r.status, RunStatus::Partial);
    assert_eq!(r.answer.as_deref(), Some("Lyon"));
    let reason = r.reason.clone().unwrap();
    assert!(reason.contains("verification_failure"), "{reason}");
    assert!(reason.contains("rejected by `evidence`"), "{reason}");
    assert_eq!(requests(&s).len(), 4, "one tool turn and three answers");
    assert_eq!(r.model_calls, 4);
    assert_eq!(took(&r, ActionKind::Retry), 1);
    assert_eq!(took(&r, ActionKind::Replan), 1);
    assert_eq!(took(&r, ActionKind::Degrade), 1);
    let answers: Vec<_> = verdicts(&r)
        .into_iter()
        .filter(|(name, _)| name == "evidence")
        .collect();
    assert_eq!(answers.len(), 3);
    assert!(answers.iter().all(|(_, v)| v == "reject"));
    // Once, after the first rejection, the tool's value was read again (twice) and held.
    assert_eq!(
        verdicts(&r)
            .iter()
            .filter(|(name, v)| name == "re_read" && v == "accept")
            .count(),
        2
    );
}

#[tokio::test]
async fn a_rejected_answer_under_a_terminating_policy_ends_failed_without_an_answer() {
    let (agent, s) = capital_agent(vec![ok(answer("Lyon")), ok(answer("never asked"))], None).await;
    let mut agent = agent.with_answer_verifier(grounded());
    agent.config.policy =
        Policy::from_toml_str("[ladders]\nverification_failure = [\"terminate\"]\n").unwrap();
    let r = agent.run(user("What is the capital of France?"), 1).await;

    assert_eq!(r.status, RunStatus::Failed);
    assert_eq!(r.answer, None);
    assert!(
        r.reason.unwrap().contains("rejected by `evidence`"),
        "the reason names the rejection"
    );
    assert_eq!(requests(&s).len(), 2, "no model call after the abort");
}

#[tokio::test]
async fn an_uncertain_verifier_lets_the_answer_stand() {
    let (url, _s) = server(vec![ok(answer("Paris"))], None).await;
    let agent = Agent::new(client(&url, 2000), "m", vec![]).with_answer_verifier(grounded());
    let r = agent.run(user("What is the capital of France?"), 1).await;

    // No tool ran, so there is no evidence to ground the answer in: uncertain, not rejected.
    assert_eq!(r.status, RunStatus::Complete, "{:?}", r.reason);
    assert_eq!(r.answer.as_deref(), Some("Paris"));
    assert_eq!(
        verdicts(&r),
        vec![("evidence".to_owned(), "uncertain".to_owned())]
    );
    assert!(r.recovery_log.iter().any(|l| l.contains("uncertain")));
}

#[tokio::test]
async fn without_verifiers_nothing_is_judged() {
    let (agent, _s) = capital_agent(vec![ok(answer("Lyon"))], None).await;
    assert!(agent.answer_verifier.is_none());
    let r = agent.run(user("What is the capital of France?"), 1).await;
    assert_eq!(r.status, RunStatus::Complete);
    assert_eq!(r.answer.as_deref(), Some("Lyon"));
    assert!(verdicts(&r).is_empty());
}

/// What the answer verifier saw: `(output, claims_success, unresolved, evidence)`.
type Seen = Arc<Mutex<Vec<(Value, bool, usize, Vec<Value>)>>>;

struct Recorder(Seen);

impl Verifier for Recorder {
    fn name(&self) -> &str {
        "recorder"
    }

    fn verify(&self, subject: &Subject<'_>) -> Judgement {
        self.0.lock().unwrap().push((
            subject.output.clone(),
            subject.claims_success,
            subject.unresolved_failures,
            subject.evidence.to_vec(),
        ));
        Judgement::Accept
    }
}

#[tokio::test]
async fn the_answer_verifier_sees_the_answer_and_only_verified_outputs_as_evidence() {
    let calls = Arc::new(AtomicUsize::new(0));
    let tool = weather_tool(vec![json!({"temp_c": BAD}), json!({"temp_c": 21})], &calls);
    let seen = Seen::default();
    let (mut agent, _s) = weather_agent(vec![tool], "21 C").await;
    agent.answer_verifier = Some(Arc::new(Recorder(seen.clone())));
    let r = agent.run(user("Weather in Paris?"), 1).await;

    assert_eq!(r.status, RunStatus::Complete, "{:?}", r.reason);
    let seen = seen.lock().unwrap().clone();
    assert_eq!(
        seen,
        vec![(json!("21 C"), true, 0, vec![json!({"temp_c": 21})])],
        "the rejected output is no evidence"
    );
}

#[test]
fn an_output_schema_that_does_not_compile_is_a_typed_error() {
    let spec = ToolSpec::new("get_weather", "Weather.", json!({"type": "object"}));
    let err = spec
        .clone()
        .with_output_schema(json!({"type": 12}))
        .unwrap_err();
    assert_eq!(err.tool, "get_weather");
    assert!(err.to_string().contains("`get_weather`"), "{err}");
    assert!(OutputSchema::new(json!({"type": "not-a-type"})).is_err());

    let ok = spec.with_output_schema(json!({"type": "number"})).unwrap();
    let schema = ok.output_schema.as_ref().unwrap();
    assert_eq!(schema.schema(), &json!({"type": "number"}));
    assert!(schema.verify(&json!(3)).is_accept());
    assert!(matches!(
        schema.verify(&json!("3")),
        Judgement::Reject { .. }
    ));
}

/// Issue 31: the core's grounding rule judges the final answer in `Agent::run` — with no answer
/// verifier configured. A number the run never saw (computed in the model's head) ends the run
/// `partial`, the answer kept and the reason naming the number; a number copied from a tool
/// result, rounded to the answer's precision, is claimed `complete`.
#[tokio::test]
async fn an_answer_with_a_made_up_number_ends_partial_without_any_verifier() {
    let calls = Arc::new(AtomicUsize::new(0));
    let tool = weather_tool(vec![json!({"temp_c": 21.37})], &calls);
    let (agent, _s) = weather_agent(vec![tool], "It is 70.5 F in Paris.").await;
    let r = agent.run(user("Weather in Paris, in Fahrenheit?"), 1).await;
    assert_eq!(r.status, RunStatus::Partial, "{:?}", r.reason);
    assert_eq!(r.answer.as_deref(), Some("It is 70.5 F in Paris."));
    assert!(
        r.reason.as_deref().is_some_and(|w| w.contains("70.5")),
        "{:?}",
        r.reason
    );
    assert!(
        r.recovery_log.iter().any(|l| l.starts_with("grounding:")),
        "{:?}",
        r.recovery_log
    );

    let calls = Arc::new(AtomicUsize::new(0));
    let tool = weather_tool(vec![json!({"temp_c": 21.37})], &calls);
    let (agent, _s) = weather_agent(vec![tool], "It is 21.4 C in Paris.").await;
    let r = agent.run(user("Weather in Paris?"), 1).await;
    assert_eq!(r.status, RunStatus::Complete, "{:?}", r.reason);
}

/// A `grounded` tool's call whose argument appears in no input or result (the real model's
/// `calc_multiply {"a": 669, "b": 0.28}` for a price it never read) is not run: it is re-asked
/// with the argument named, and the corrected call runs.
#[tokio::test]
async fn a_grounded_tools_invented_argument_is_reasked_before_it_runs() {
    let ran: Arc<Mutex<Vec<Value>>> = Arc::default();
    let spec = ToolSpec::new(
        "multiply",
        "a times b",
        json!({"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
               "required": ["a", "b"]}),
    )
    .with_effect(Effect::ReadOnly)
    .with_grounded();
    let seen = ran.clone();
    let tool = FnTool::new(spec, move |args: Value| {
        seen.lock().unwrap().push(args);
        async move { Ok(json!({"value": 42.5})) }
    })
    .shared();
    let (url, s) = server(
        vec![
            ok(call("multiply", r#"{"a": 669, "b": 0.28}"#)),
            ok(call("multiply", r#"{"a": 17, "b": 2.5}"#)),
            ok(answer("42.5")),
        ],
        None,
    )
    .await;
    let agent = fast(Agent::new(client(&url, 2000), "m", vec![tool]));
    let r = agent.run(user("Multiply 17 by 2.5."), 1).await;
    assert_eq!(r.status, RunStatus::Complete, "{:?}", r.reason);
    let ran = ran.lock().unwrap().clone();
    assert!(!ran.is_empty());
    assert!(
        ran.iter().all(|a| a == &json!({"a": 17, "b": 2.5})),
        "the invented call never ran: {ran:?}"
    );
    let reqs = requests(&s);
    assert_eq!(reqs.len(), 3);
    let told = tool_messages(&reqs[1]);
    assert!(
        told[0]["content"].as_str().unwrap().contains("`a` = 669"),
        "{told:?}"
    );
}

/// Issue 31: an answer that announces a call instead of making it (the real model's "To get
/// the capital of France, I need to call the `geo_capital` function.") is not the run's
/// answer: the model is asked again once with guidance naming the tool, and a call that then
/// comes runs and the answer it grounds is claimed; an announcement again ends the run
/// `partial` with the reason naming the tool, never `complete`.
#[tokio::test]
async fn an_answer_that_announces_a_call_is_asked_again_then_partial() {
    let said = "To get the weather in Paris, I need to call the `get_weather` function.";
    let calls = Arc::new(AtomicUsize::new(0));
    let tool = weather_tool(vec![json!({"temp_c": 21.37})], &calls);
    let (url, s) = server(
        vec![
            ok(answer(said)),
            ok(call("get_weather", r#"{"city": "Paris"}"#)),
            ok(answer("It is 21.4 C in Paris.")),
        ],
        None,
    )
    .await;
    let agent = fast(Agent::new(client(&url, 2000), "m", vec![tool]));
    let r = agent.run(user("Weather in Paris?"), 1).await;
    assert_eq!(r.status, RunStatus::Complete, "{:?}", r.reason);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    let reqs = requests(&s);
    assert_eq!(reqs.len(), 3);
    let told = last_message(&reqs[1]);
    assert!(
        told["content"].as_str().unwrap().contains("`get_weather`"),
        "{told}"
    );

    let calls = Arc::new(AtomicUsize::new(0));
    let tool = weather_tool(vec![json!({"temp_c": 21.37})], &calls);
    let (url, s) = server(vec![ok(answer(said)), ok(answer(said))], None).await;
    let agent = fast(Agent::new(client(&url, 2000), "m", vec![tool]));
    let r = agent.run(user("Weather in Paris?"), 1).await;
    assert_eq!(r.status, RunStatus::Partial, "{:?}", r.reason);
    assert_eq!(r.answer.as_deref(), Some(said));
    assert!(
        r.reason
            .as_deref()
            .is_some_and(|w| w.contains("`get_weather`")),
        "{:?}",
        r.reason
    );
    assert_eq!(requests(&s).len(), 2, "asked again once, not more");
    assert_eq!(calls.load(Ordering::SeqCst), 0);
}

/// Issue 31: a run offered tools that answers without any tool returning a result is `partial`
/// (it cannot tell a task that needs no tool from one whose tools were skipped), the answer
/// kept; the same answer after a tool returned is claimed.
#[tokio::test]
async fn an_answer_with_no_tool_result_behind_it_ends_partial() {
    let calls = Arc::new(AtomicUsize::new(0));
    let tool = weather_tool(vec![json!({"temp_c": 21.37})], &calls);
    let (url, _s) = server(vec![ok(answer("It is mild in Paris."))], None).await;
    let agent = fast(Agent::new(client(&url, 2000), "m", vec![tool]));
    let r = agent.run(user("Weather in Paris?"), 1).await;
    assert_eq!(r.status, RunStatus::Partial, "{:?}", r.reason);
    assert_eq!(r.answer.as_deref(), Some("It is mild in Paris."));
    assert_eq!(r.reason.as_deref(), Some(selfheal_core::NO_TOOL_RESULT));

    let calls = Arc::new(AtomicUsize::new(0));
    let tool = weather_tool(vec![json!({"temp_c": 21.37})], &calls);
    let (agent, _s) = weather_agent(vec![tool], "It is mild in Paris.").await;
    let r = agent.run(user("Weather in Paris?"), 1).await;
    assert_eq!(r.status, RunStatus::Complete, "{:?}", r.reason);
}
