//! The agent loop against a scripted OpenAI-compatible server on 127.0.0.1:0 that injects
//! realistic faults: 429 with `Retry-After`, 500/503, hangs, malformed tool-call arguments,
//! unknown tools, empty 200s, the llama-cpp-python `content: null` 500.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use common::{
    Reply, Shared, answer, call, client, err, fast, last_message, ok, requests, server, took,
};
use selfheal_core::{ActionKind, BudgetLimits, Policy, RunStatus};
use selfheal_runtime::{Agent, Effect, FnTool, RunResult, Tool, ToolError, ToolSpec};

type Calls = Arc<Mutex<Vec<Value>>>;

fn weather(calls: &Calls) -> Arc<dyn Tool> {
    let calls = calls.clone();
    FnTool::new(
        ToolSpec::new(
            "get_weather",
            "Current weather in a city.",
            json!({"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"], "additionalProperties": false}),
        ),
        move |args| {
            calls.lock().unwrap().push(args.clone());
            async move { Ok(json!({"temp_c": 21})) }
        },
    )
    .shared()
}

fn failing(name: &str, effect: Effect, calls: &Calls) -> Arc<dyn Tool> {
    let calls = calls.clone();
    FnTool::new(
        ToolSpec::new(
            name,
            "Always fails.",
            json!({"type": "object", "properties": {}}),
        )
        .with_effect(effect),
        move |args| {
            calls.lock().unwrap().push(args);
            async move {
                Err(ToolError::Failed {
                    message: "503 Service Unavailable".into(),
                    status: Some(503),
                    retry_after_ms: None,
                })
            }
        },
    )
    .shared()
}

fn user() -> Vec<Value> {
    vec![json!({"role": "user", "content": "What is the weather in Paris?"})]
}

/// Runs an agent with only the weather tool against a server giving `replies`; returns the run,
/// the tool's calls and the server's script.
async fn run_with_weather(replies: Vec<Reply>) -> (RunResult, Calls, Shared) {
    let (url, s) = server(replies, None).await;
    let calls = Calls::default();
    let agent = Agent::new(client(&url, 2000), "m", vec![weather(&calls)]);
    let r = agent.run(user(), 1).await;
    (r, calls, s)
}

#[tokio::test]
async fn rate_limit_waits_for_retry_after_then_retries() {
    let (url, s) = server(
        vec![
            Reply::Json(
                429,
                json!({"error": {"message": "rate limited"}}),
                Some("1"),
            ),
            ok(answer("21 C")),
        ],
        None,
    )
    .await;
    let agent = Agent::new(client(&url, 2000), "m", vec![]);
    let t0 = Instant::now();
    let r = agent.run(user(), 1).await;
    assert!(
        t0.elapsed() >= Duration::from_millis(990),
        "{:?}",
        t0.elapsed()
    );
    assert_eq!(r.answer.as_deref(), Some("21 C"));
    assert_eq!(r.status, RunStatus::Complete);
    assert_eq!(requests(&s).len(), 2);
    assert_eq!(took(&r, ActionKind::Retry), 1);
}

#[tokio::test]
async fn server_errors_are_retried_with_backoff() {
    let (url, s) = server(
        vec![
            err(500, "internal error"),
            err(503, "overloaded"),
            ok(answer("ok")),
        ],
        None,
    )
    .await;
    let agent = fast(Agent::new(client(&url, 2000), "m", vec![]));
    let r = agent.run(user(), 1).await;
    assert_eq!(r.answer.as_deref(), Some("ok"));
    assert_eq!(requests(&s).len(), 3);
    assert_eq!(took(&r, ActionKind::Retry), 2);
    assert_eq!(r.model_calls, 3);
}

#[tokio::test]
async fn a_hang_past_the_timeout_is_a_timeout_and_retried() {
    let (url, s) = server(
        vec![Reply::Hang(Duration::from_secs(3)), ok(answer("ok"))],
        None,
    )
    .await;
    let agent = fast(Agent::new(client(&url, 300), "m", vec![]));
    let t0 = Instant::now();
    let r = agent.run(user(), 1).await;
    assert!(t0.elapsed() < Duration::from_secs(2));
    assert_eq!(r.answer.as_deref(), Some("ok"));
    assert_eq!(requests(&s).len(), 2);
    assert!(
        r.trace_jsonl.contains("\"signal\":\"timeout\""),
        "{}",
        r.trace_jsonl
    );
}

#[tokio::test]
async fn malformed_arguments_are_repaired_locally() {
    let (r, calls, s) = run_with_weather(vec![
        ok(call("get_weather", r#"{"city": "Paris",}"#)),
        ok(answer("21")),
    ])
    .await;
    assert_eq!(r.answer.as_deref(), Some("21"));
    assert_eq!(*calls.lock().unwrap(), vec![json!({"city": "Paris"})]);
    // No re-ask: the second request carries the tool's result.
    let reqs = requests(&s);
    assert_eq!(reqs.len(), 2);
    let last = last_message(&reqs[1]);
    assert_eq!(last["role"], "tool");
    assert!(last["content"].as_str().unwrap().contains("temp_c"));
}

#[tokio::test]
async fn unrepairable_arguments_are_reasked_with_the_precise_error() {
    let (r, calls, s) = run_with_weather(vec![
        ok(call("get_weather", r#"{"town": "Paris"}"#)),
        ok(call("get_weather", r#"{"city": "Paris"}"#)),
        ok(answer("21")),
    ])
    .await;
    assert_eq!(r.answer.as_deref(), Some("21"));
    assert_eq!(calls.lock().unwrap().len(), 1, "the invalid call never ran");
    let reqs = requests(&s);
    let reask = last_message(&reqs[1]);
    assert_eq!(reask["role"], "tool");
    let text = reask["content"].as_str().unwrap();
    assert!(text.contains("missing required property"), "{text}");
    assert!(text.contains("get_weather"), "{text}");
    assert_eq!(took(&r, ActionKind::Repair), 1);
}

#[tokio::test]
async fn an_unknown_tool_is_reasked_with_the_valid_names() {
    let (r, calls, s) = run_with_weather(vec![
        ok(call("get_wether", r#"{"city": "Paris"}"#)),
        ok(call("Get.Weather", r#"{"city": "Paris"}"#)),
        ok(answer("21")),
    ])
    .await;
    assert_eq!(r.answer.as_deref(), Some("21"));
    let reqs = requests(&s);
    let text = last_message(&reqs[1])["content"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        text.contains("no tool named `get_wether`") && text.contains("get_weather"),
        "{text}"
    );
    // A name that differs only in case and punctuation is re-mapped without a re-ask.
    assert_eq!(calls.lock().unwrap().len(), 1);
}

#[tokio::test]
async fn an_empty_200_is_an_empty_response() {
    let empty = json!({"choices": [{"index": 0, "message": {"role": "assistant", "content": ""}}]});
    let (url, s) = server(vec![ok(empty), Reply::Raw(200, ""), ok(answer("7"))], None).await;
    let agent = fast(Agent::new(client(&url, 2000), "m", vec![]));
    let r = agent.run(user(), 1).await;
    assert_eq!(r.answer.as_deref(), Some("7"));
    assert_eq!(requests(&s).len(), 3);
    assert!(r.trace_jsonl.contains("empty_response"));
    let second = requests(&s)[1]["messages"].to_string();
    assert!(second.contains("Your last reply was empty"), "{second}");
}

#[tokio::test]
async fn the_content_null_500_is_repaired_never_resent_as_is() {
    let (r, _calls, s) = run_with_weather(vec![
        ok(call("get_weather", r#"{"city": "Paris"}"#)),
        err(500, "'content' must be a string, got None"),
        ok(answer("21")),
    ])
    .await;
    assert_eq!(r.answer.as_deref(), Some("21"));
    for req in &requests(&s)[1..] {
        for m in req["messages"].as_array().unwrap() {
            assert!(m["content"].is_string(), "null content sent: {m}");
        }
    }
    assert_eq!(took(&r, ActionKind::Retry), 0);
    assert_eq!(took(&r, ActionKind::Repair), 1);
    assert!(
        r.recovery_log
            .iter()
            .any(|l| l.contains("repair request shape"))
    );
}

#[tokio::test]
async fn the_fallback_chain_takes_over_from_a_dead_model() {
    let (url_a, a) = server(vec![], Some(err(503, "down"))).await;
    let (url_b, b) = server(vec![ok(answer("from b"))], None).await;
    let agent = fast(
        Agent::new(client(&url_a, 2000), "model-a", vec![])
            .with_fallback(client(&url_b, 2000), "model-b"),
    );
    let r = agent.run(user(), 1).await;
    assert_eq!(r.answer.as_deref(), Some("from b"));
    assert_eq!(r.model, "model-b");
    assert!(!requests(&a).is_empty());
    assert_eq!(requests(&b).len(), 1);
    assert_eq!(requests(&b)[0]["model"], "model-b");
    assert_eq!(took(&r, ActionKind::Escalate), 1);
}

fn replan_only() -> Policy {
    let replans = r#"["replan","replan","replan","replan","replan","replan","replan","replan"]"#;
    Policy::from_toml_str(&format!(
        "[ladders]\ntool_timeout = {replans}\ntool_unavailable = {replans}\n"
    ))
    .unwrap()
}

#[tokio::test]
async fn a_circuit_broken_tool_is_never_offered_again() {
    let mut replies: Vec<Reply> = (0..6).map(|_| ok(call("flaky", "{}"))).collect();
    replies.push(ok(answer("gave up on flaky")));
    let (url, s) = server(replies, None).await;
    let calls = Calls::default();
    let ok_calls = Calls::default();
    let mut agent = Agent::new(
        client(&url, 2000),
        "m",
        vec![
            failing("flaky", Effect::ReadOnly, &calls),
            weather(&ok_calls),
        ],
    );
    agent.config.policy = replan_only();
    agent.config.budget = BudgetLimits::unlimited();
    let r = agent.run(user(), 1).await;
    assert_eq!(
        calls.lock().unwrap().len(),
        5,
        "the circuit opens after 5 failures"
    );
    let offered = |req: &Value| -> Vec<String> {
        req["tools"]
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|t| t["function"]["name"].as_str().unwrap().to_owned())
                    .collect()
            })
            .unwrap_or_default()
    };
    let reqs = requests(&s);
    assert_eq!(reqs.len(), 7);
    for req in &reqs[..5] {
        assert!(offered(req).contains(&"flaky".to_owned()));
    }
    for req in &reqs[5..] {
        assert_eq!(offered(req), vec!["get_weather".to_owned()]);
    }
    // The model's sixth call to the hidden tool is an unknown tool, not a call.
    let reask = reqs[6]["messages"].to_string();
    assert!(reask.contains("no tool named `flaky`"), "{reask}");
    assert_eq!(r.answer.as_deref(), Some("gave up on flaky"));
}

#[tokio::test]
async fn abort_ends_the_loop() {
    let (url, s) = server(vec![ok(call("flaky", "{}")), ok(answer("never"))], None).await;
    let calls = Calls::default();
    let mut agent = Agent::new(
        client(&url, 2000),
        "m",
        vec![failing("flaky", Effect::ReadOnly, &calls)],
    );
    agent.config.policy =
        Policy::from_toml_str("[ladders]\ntool_timeout = [\"terminate\"]\n").unwrap();
    let r = agent.run(user(), 1).await;
    assert_eq!(r.status, RunStatus::Failed);
    assert_eq!(r.answer, None);
    assert_eq!(requests(&s).len(), 1, "no model call after the abort");
    assert_eq!(calls.lock().unwrap().len(), 1);
    assert!(r.reason.unwrap().contains("terminated"));
}

#[tokio::test]
async fn a_destructive_tool_is_not_retried_unless_allowed() {
    for allow in [false, true] {
        let (url, _s) = server(
            vec![ok(call("pay", "{}")), ok(answer("payment failed"))],
            None,
        )
        .await;
        let calls = Calls::default();
        let mut agent = fast(Agent::new(
            client(&url, 2000),
            "m",
            vec![failing("pay", Effect::Destructive, &calls)],
        ));
        agent.allow_destructive_retry = allow;
        let r = agent.run(user(), 1).await;
        let n = calls.lock().unwrap().len();
        if allow {
            assert!(n > 1, "allowed retries: {n}");
        } else {
            assert_eq!(
                n, 1,
                "a destructive call that may have run is never repeated"
            );
            assert_eq!(took(&r, ActionKind::Retry), 0);
        }
    }
}

fn one_retry() -> BudgetLimits {
    BudgetLimits {
        retries: 1,
        replans: 0,
        substitutions: 0,
        escalations: 0,
        ..BudgetLimits::unlimited()
    }
}

#[tokio::test]
async fn a_spent_ledger_stops_the_model_retry_path() {
    let (url, s) = server(vec![], Some(err(503, "down"))).await;
    let (url_b, b) = server(vec![ok(answer("b"))], None).await;
    let mut agent =
        fast(Agent::new(client(&url, 2000), "m", vec![]).with_fallback(client(&url_b, 2000), "b"));
    agent.config.budget = one_retry();
    let r = agent.run(user(), 1).await;
    assert_eq!(requests(&s).len(), 2, "one call and exactly one retry");
    assert!(requests(&b).is_empty(), "no escalation budget, no fallback");
    assert_eq!(r.status, RunStatus::Failed);
    assert_eq!(r.spent.retries, 1);
}

#[tokio::test]
async fn a_spent_ledger_stops_the_tool_retry_path() {
    let (url, s) = server(vec![ok(call("flaky", "{}")), ok(answer("x"))], None).await;
    let calls = Calls::default();
    let mut agent = fast(Agent::new(
        client(&url, 2000),
        "m",
        vec![failing("flaky", Effect::Idempotent, &calls)],
    ));
    agent.config.budget = one_retry();
    let r = agent.run(user(), 1).await;
    assert_eq!(
        calls.lock().unwrap().len(),
        2,
        "one call and exactly one retry"
    );
    assert_eq!(
        requests(&s).len(),
        1,
        "no replan budget: the model is not asked again"
    );
    assert_ne!(r.status, RunStatus::Complete);
    assert_eq!(r.spent.retries, 1);
}

/// A read-only price tool answering from `script` in turn (`None`: a 503), recording its calls.
fn price(script: Vec<Option<u64>>, calls: &Calls) -> Arc<dyn Tool> {
    let calls = calls.clone();
    let script = Arc::new(Mutex::new(std::collections::VecDeque::from(script)));
    FnTool::new(
        ToolSpec::new(
            "get_price",
            "The price of an item.",
            json!({"type": "object", "properties": {"item": {"type": "string"}},
                   "required": ["item"]}),
        )
        .with_effect(Effect::ReadOnly),
        move |args| {
            calls.lock().unwrap().push(args);
            let next = script.lock().unwrap().pop_front().flatten();
            async move {
                match next {
                    Some(p) => Ok(json!({"price": p})),
                    None => Err(ToolError::Failed {
                        message: "503 Service Unavailable".into(),
                        status: Some(503),
                        retry_after_ms: None,
                    }),
                }
            }
        },
    )
    .shared()
}

#[tokio::test]
async fn a_recovered_run_reads_its_read_only_values_again_and_a_changed_one_is_answered_anew() {
    let (url, s) = server(
        vec![
            ok(call("get_price", r#"{"item": "tea"}"#)),
            ok(answer("tea costs 100")),
            ok(answer("tea costs 105")),
        ],
        None,
    )
    .await;
    let calls = Calls::default();
    // A 503, then 100 (the retry), then 105 when read again before the answer.
    let tool = price(vec![None, Some(100), Some(105)], &calls);
    let agent = fast(Agent::new(client(&url, 2000), "m", vec![tool]));
    let r = agent.run(user(), 1).await;
    assert_eq!(
        calls.lock().unwrap().len(),
        3,
        "the call, its retry, the re-read"
    );
    assert_eq!(r.answer.as_deref(), Some("tea costs 105"));
    let asked = requests(&s);
    assert_eq!(
        asked.len(),
        3,
        "the model was asked again after the value changed"
    );
    let told = last_message(&asked[2]).to_string();
    assert!(
        told.contains("read once more") && told.contains("105"),
        "{told}"
    );
    assert!(
        r.trace_jsonl.contains("re_read"),
        "the judgement is the controller's"
    );
}

#[tokio::test]
async fn a_run_that_went_well_or_whose_value_held_is_not_asked_again() {
    // A run that went well is read once; a recovered one, the call, its retry and the two reads
    // before answering (the policy's `reread_reads`).
    for script in [vec![Some(100)], vec![None, Some(100), Some(100), Some(100)]] {
        let reads = script.len();
        let (url, s) = server(
            vec![
                ok(call("get_price", r#"{"item": "tea"}"#)),
                ok(answer("tea costs 100")),
            ],
            None,
        )
        .await;
        let calls = Calls::default();
        let agent = fast(Agent::new(
            client(&url, 2000),
            "m",
            vec![price(script, &calls)],
        ));
        let r = agent.run(user(), 1).await;
        assert_eq!(r.answer.as_deref(), Some("tea costs 100"));
        assert_eq!(calls.lock().unwrap().len(), reads);
        assert_eq!(requests(&s).len(), 2);
    }
}

/// Issue 31: a small local model writes its call as a fenced JSON block in `content`, never as
/// `tool_calls`. The call is read back and run; the answer is not the fenced text.
#[tokio::test]
async fn a_tool_call_written_as_text_is_run_not_answered() {
    let (r, calls, s) = run_with_weather(vec![
        ok(answer(
            "Let me check.\n```json\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n```",
        )),
        ok(answer("It is 21 degrees in Paris.")),
    ])
    .await;
    assert_eq!(r.answer.as_deref(), Some("It is 21 degrees in Paris."));
    assert_eq!(*calls.lock().unwrap(), vec![json!({"city": "Paris"})]);
    let reqs = requests(&s);
    assert_eq!(reqs.len(), 2);
    let last = last_message(&reqs[1]);
    assert_eq!(last["role"], "tool");
    assert!(last["content"].as_str().unwrap().contains("temp_c"));
    assert!(
        r.recovery_log.iter().any(|l| l.contains("salvage")),
        "{:?}",
        r.recovery_log
    );
}

/// Issue 31: a call written as text that cannot be taken without a guess (a tool not on offer)
/// is never the final answer: the model is asked again.
#[tokio::test]
async fn a_tool_call_written_as_text_that_cannot_be_taken_is_asked_again() {
    let (r, calls, s) = run_with_weather(vec![
        ok(answer(
            "{\"name\": \"send_email\", \"arguments\": {\"to\": \"bob@example.com\"}}",
        )),
        ok(call("get_weather", r#"{"city": "Paris"}"#)),
        ok(answer("21")),
    ])
    .await;
    assert_eq!(r.answer.as_deref(), Some("21"));
    assert_eq!(calls.lock().unwrap().len(), 1);
    let reqs = requests(&s);
    let reask = last_message(&reqs[1]);
    assert_eq!(reask["role"], "user");
    let text = reask["content"].as_str().unwrap();
    assert!(
        text.contains("send_email") && text.contains("not run"),
        "{text}"
    );
}

/// Issue 30, in the runtime: under the default policy an agent whose `flaky` tool keeps failing,
/// with `get_weather` on offer, is not stopped at the ladder's end. The core routes around the
/// tool (the same decision the gateway and the MCP proxy get): warned at 3 naming
/// `get_weather`, hidden at 5, and the agent finishes with `get_weather`.
#[tokio::test]
async fn issue_30_a_stuck_tool_is_routed_around_to_the_other_one() {
    let mut replies: Vec<Reply> = (0..4).map(|_| ok(call("flaky", "{}"))).collect();
    replies.push(ok(call("get_weather", r#"{"city": "Paris"}"#)));
    replies.push(ok(answer("21 C in Paris")));
    let (url, s) = server(replies, None).await;
    let (calls, ok_calls) = (Calls::default(), Calls::default());
    let agent = Agent::new(
        client(&url, 2000),
        "m",
        vec![
            failing("flaky", Effect::ReadOnly, &calls),
            weather(&ok_calls),
        ],
    );
    let r = agent.run(user(), 1).await;
    assert_eq!(r.answer.as_deref(), Some("21 C in Paris"), "{:?}", r.reason);
    assert_ne!(r.status, RunStatus::Failed, "{:?}", r.reason);
    assert_eq!(calls.lock().unwrap().len(), 5, "the circuit opens at 5");
    assert_eq!(ok_calls.lock().unwrap().len(), 1);
    let reqs = requests(&s);
    let last = reqs.last().unwrap();
    let offered: Vec<&str> = last["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["function"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(offered, vec!["get_weather"], "flaky is hidden");
    assert!(
        reqs.iter()
            .any(|q| q["messages"].to_string().contains("`get_weather`")),
        "guidance names the alternative"
    );
}

/// Issue 33: the agent keeps what its runs learn of their tools across runs (one store per
/// agent). An outage is availability, never evidence that the tool's values are wrong.
#[tokio::test]
async fn the_agent_keeps_what_its_runs_learn_of_a_tool() {
    let calls = Calls::default();
    let (url, _s) = server(
        vec![ok(call("flaky", "{}")), ok(answer("done"))],
        Some(ok(answer("done"))),
    )
    .await;
    let agent = fast(Agent::new(
        client(&url, 2000),
        "m",
        vec![failing("flaky", Effect::ReadOnly, &calls)],
    ));
    let source = selfheal_core::Source::tool("flaky");
    let config = agent.config.policy.trust;
    assert_eq!(
        agent
            .trust
            .store
            .snapshot()
            .posterior(&source, 0, &config)
            .down,
        0.0
    );
    let _ = agent.run(user(), 1).await;
    let p = agent
        .trust
        .store
        .snapshot()
        .posterior(&source, agent.trust.now_ms(), &config);
    assert!(p.down > 0.0, "the run's outage is kept: {p:?}");
    assert_eq!(p.wrong, 0.0, "an outage says nothing of the values: {p:?}");
}
