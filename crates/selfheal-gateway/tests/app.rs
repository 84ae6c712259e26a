//! Gateway tests through `oneshot` (no socket on the gateway side) in front of a scripted
//! upstream on port 0.

// Test helpers outside `#[test]` functions may panic: a panic is a test failure here.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::{Request, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use http_body_util::BodyExt;
use serde_json::{Value, json};
use tower::ServiceExt;

use selfheal_gateway::{AppState, GatewayConfig, TraceWriter, router};
use selfheal_gateway::{Auth, ModelRoute, OnPartial, Target, UpstreamConfig};

mod common;
use common::guidance_seen;

#[derive(Default)]
struct Script {
    steps: Vec<(u16, Value)>,
    seen: Vec<Value>,
}

type Shared = Arc<Mutex<Script>>;

async fn upstream_chat(State(s): State<Shared>, body: axum::Json<Value>) -> Response {
    let mut s = s.lock().unwrap();
    s.seen.push(body.0);
    let (status, body) = if s.steps.is_empty() {
        (200, text("fine"))
    } else {
        s.steps.remove(0)
    };
    let mut r = (StatusCode::from_u16(status).unwrap(), axum::Json(body)).into_response();
    if status == 429 {
        r.headers_mut().insert("retry-after", "0".parse().unwrap());
    }
    r
}

fn text(t: &str) -> Value {
    json!({"id": "x", "object": "chat.completion", "created": 0, "model": "m",
           "choices": [{"index": 0, "message": {"role": "assistant", "content": t},
                        "finish_reason": "stop"}]})
}

fn tool_call(name: &str, args: &str) -> Value {
    json!({"id": "x", "object": "chat.completion", "created": 0, "model": "m",
           "choices": [{"index": 0, "message": {"role": "assistant", "content": null,
             "tool_calls": [{"id": "c1", "type": "function",
                             "function": {"name": name, "arguments": args}}]},
                        "finish_reason": "tool_calls"}]})
}

async fn start_upstream(steps: Vec<(u16, Value)>) -> (String, Shared) {
    serve_script(steps, |r| {
        r.route("/v1/chat/completions", post(upstream_chat))
    })
    .await
}

/// Serves `steps` on 127.0.0.1, port 0, with the route `route` adds; the base URL and the
/// script, which records every request seen.
async fn serve_script(
    steps: Vec<(u16, Value)>,
    route: impl FnOnce(Router<Shared>) -> Router<Shared>,
) -> (String, Shared) {
    let shared: Shared = Arc::new(Mutex::new(Script {
        steps,
        seen: Vec::new(),
    }));
    let app = route(Router::new()).with_state(shared.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (format!("http://{addr}/v1"), shared)
}

fn gateway(config: GatewayConfig) -> Router {
    router(Arc::new(
        AppState::new(config, TraceWriter::disabled()).unwrap(),
    ))
}

/// A config whose ladders keep retrying a failing tool (and an unlimited budget): for tests of
/// the monitor's breaker, which the default ladders would degrade the run before.
fn patient(url: String) -> GatewayConfig {
    let mut c = GatewayConfig::for_upstream(url);
    let retries = r#"["retry", "retry", "retry", "retry", "retry", "retry", "retry", "degrade"]"#;
    c.policy = selfheal_core::Policy::from_toml_str(&format!(
        "[ladders]\ntool_timeout = {retries}\ntool_unavailable = {retries}\n"
    ))
    .unwrap();
    c.budget = selfheal_core::BudgetLimits::unlimited();
    c
}

fn fast(mut c: GatewayConfig) -> GatewayConfig {
    c.policy.retry.base_ms = 1;
    c.policy.retry.max_ms = 5;
    c
}

/// `config` with one upstream per `(name, url)` and the model `model` routed through
/// `targets` (`(upstream, upstream model)`) in order.
fn chain(
    mut config: GatewayConfig,
    upstreams: &[(&str, &str)],
    model: &str,
    targets: &[(&str, &str)],
) -> GatewayConfig {
    for (name, url) in upstreams {
        config.upstreams.insert(
            (*name).into(),
            UpstreamConfig {
                first_byte_timeout_ms: 2000,
                ..UpstreamConfig::new((*url).to_owned())
            },
        );
    }
    let chain = targets
        .iter()
        .map(|(upstream, model)| Target {
            upstream: (*upstream).into(),
            model: (*model).into(),
        })
        .collect();
    config.models.insert(model.into(), ModelRoute { chain });
    config
}

async fn post_chat(app: &Router, body: Value) -> (StatusCode, Value, axum::http::HeaderMap) {
    let req = Request::post("/v1/chat/completions")
        .header("content-type", "application/json")
        .body(Body::from(body.to_string()))
        .unwrap();
    let resp = app.clone().oneshot(req).await.unwrap();
    let status = resp.status();
    let headers = resp.headers().clone();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        headers,
    )
}

fn tools() -> Value {
    json!([
        {"type": "function", "function": {"name": "search", "parameters": {
            "type": "object", "properties": {"query": {"type": "string"}, "limit": {"type": "integer"}},
            "required": ["query"]}}},
        {"type": "function", "function": {"name": "lookup", "parameters": {
            "type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]}}}
    ])
}

fn conversation(failures: usize, successes: usize) -> Value {
    let mut m = vec![json!({"role": "user", "content": format!("task {failures}/{successes}")})];
    for i in 0..(failures + successes) {
        let (tool, result) = if i < successes {
            ("lookup", "ok: 1".to_string())
        } else {
            ("search", "Error: search backend is down".to_string())
        };
        m.push(json!({"role": "assistant", "content": null, "tool_calls": [{"id": format!("c{i}"),
            "type": "function", "function": {"name": tool, "arguments": format!("{{\"query\": \"q{i}\", \"key\": \"k{i}\"}}")}}]}));
        m.push(json!({"role": "tool", "tool_call_id": format!("c{i}"), "content": result}));
    }
    json!(m)
}

#[tokio::test]
async fn malformed_json_is_a_400_in_openai_shape() {
    let app = gateway(GatewayConfig::for_upstream("http://127.0.0.1:9/v1"));
    let req = Request::post("/v1/chat/completions")
        .body(Body::from("{not json"))
        .unwrap();
    let resp = app.oneshot(req).await.unwrap();
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
    let body: Value =
        serde_json::from_slice(&resp.into_body().collect().await.unwrap().to_bytes()).unwrap();
    assert_eq!(body["error"]["type"], "invalid_request_error");
}

#[tokio::test]
async fn oversize_body_is_a_413() {
    let mut c = GatewayConfig::for_upstream("http://127.0.0.1:9/v1");
    c.max_body_bytes = 100;
    let (status, body, _) = post_chat(
        &gateway(c),
        json!({"model": "m", "messages": [{"role": "user", "content": "x".repeat(200)}]}),
    )
    .await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(body["error"]["code"], "request_too_large");
}

#[tokio::test]
async fn unknown_model_is_a_404() {
    let c = chain(
        GatewayConfig::default(),
        &[("a", "http://127.0.0.1:9/v1")],
        "known",
        &[("a", "m")],
    );
    let (status, body, _) = post_chat(
        &gateway(c),
        json!({"model": "other", "messages": [{"role": "user", "content": "hi"}]}),
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(body["error"]["code"], "model_not_found");
}

#[tokio::test]
async fn transient_errors_are_retried_then_exhaustion_is_a_502_with_reasons() {
    let (url, shared) = start_upstream(vec![
        (429, json!({"error": {"message": "slow down"}})),
        (503, json!({"error": {"message": "busy"}})),
    ])
    .await;
    let app = gateway(fast(GatewayConfig::for_upstream(url)));
    let (status, body, headers) = post_chat(
        &app,
        json!({"model": "m", "messages": [{"role": "user", "content": "retry me"}]}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["choices"][0]["message"]["content"], "fine");
    assert_eq!(shared.lock().unwrap().seen.len(), 3);
    assert_eq!(body["selfheal"]["budget"]["spent"]["retries"], 2);
    assert!(
        headers["x-selfheal-actions"]
            .to_str()
            .unwrap()
            .contains("retry")
    );

    shared.lock().unwrap().steps = (0..10)
        .map(|_| (500, json!({"error": {"message": "boom"}})))
        .collect();
    let (status, body, _) = post_chat(
        &app,
        json!({"model": "m", "messages": [{"role": "user", "content": "another run"}]}),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_GATEWAY);
    assert!(!body["error"]["reasons"].as_array().unwrap().is_empty());
}

/// Issue 11: the run's controller decides what a failing tool gets. With the default ladders
/// and no substitute or fallback configured, a tool that keeps failing climbs its ladder to
/// the end, and the run ends `partial` there — answered by the gateway, not the model.
#[tokio::test]
async fn issue_11_a_tool_failing_past_its_ladder_ends_the_run_partial() {
    let (url, shared) = start_upstream(vec![]).await;
    let app = gateway(GatewayConfig::for_upstream(url));
    // Only the failing tool is on offer: with another one the failure is routed around
    // instead (issue 30, `issue_30_a_stuck_tool_is_warned_at_3_hidden_at_5_and_the_run_goes_on`).
    let only_search = json!([tools()[0].clone()]);
    let (status, body, headers) = post_chat(
        &app,
        json!({"model": "m", "messages": conversation(5, 1), "tools": only_search}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["selfheal"]["status"], "partial", "{body}");
    assert!(
        headers["x-selfheal-actions"]
            .to_str()
            .unwrap()
            .contains("degrade")
    );
    assert!(
        shared.lock().unwrap().seen.is_empty(),
        "the model is not asked"
    );
    // Each rung the run climbed on the way was charged to its one ledger.
    assert!(body["selfheal"]["budget"]["spent"]["recoveries"].as_u64() >= Some(1));
}

#[tokio::test]
async fn a_tool_failing_five_times_is_hidden_and_tool_choice_fixed() {
    let (url, shared) = start_upstream(vec![]).await;
    let app = gateway(patient(url));
    let (status, body, headers) = post_chat(
        &app,
        json!({"model": "m", "messages": conversation(5, 0), "tools": tools(),
               "tool_choice": {"type": "function", "function": {"name": "search"}}}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let seen = shared.lock().unwrap().seen[0].clone();
    let names: Vec<&str> = seen["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["function"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, vec!["lookup"]);
    assert_eq!(seen["tool_choice"], "auto");
    assert!(seen["messages"].to_string().contains("[selfheal]"));
    // content: null beside tool_calls is normalised before it leaves.
    assert_eq!(seen["messages"][2]["content"], "");
    assert!(
        headers["x-selfheal-actions"]
            .to_str()
            .unwrap()
            .contains("hide")
    );
}

#[tokio::test]
async fn a_run_that_keeps_failing_ends_partial_with_a_final_message() {
    let (url, shared) = start_upstream(vec![]).await;
    let app = gateway(GatewayConfig::for_upstream(url));
    let mut msgs = conversation(0, 1);
    // Several different tools, each failing below its breaker threshold: the failure rate aborts.
    for i in 0..8 {
        let tool = format!("t{}", i % 4);
        msgs.as_array_mut().unwrap().push(json!({"role": "assistant", "content": "", "tool_calls": [
            {"id": format!("f{i}"), "type": "function", "function": {"name": tool, "arguments": format!("{{\"x\": {i}}}")}}]}));
        msgs.as_array_mut().unwrap().push(
            json!({"role": "tool", "tool_call_id": format!("f{i}"), "content": "Error: failed"}),
        );
    }
    let (status, body, headers) = post_chat(
        &app,
        json!({"model": "m", "messages": msgs, "tools": tools()}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["selfheal"]["status"], "partial");
    assert_eq!(body["choices"][0]["finish_reason"], "stop");
    assert_eq!(headers["x-selfheal-status"], "partial");
    assert!(
        shared.lock().unwrap().seen.is_empty(),
        "an aborted run is not sent upstream"
    );
}

#[tokio::test]
async fn broken_tool_arguments_are_repaired_and_unknown_tools_reasked() {
    let (url, shared) = start_upstream(vec![
        (200, tool_call("search", "{'query': 'rust', limit: \"3\",}")),
        (200, tool_call("no_such_tool", "{}")),
        (200, tool_call("lookup", "{\"key\": \"k\"}")),
    ])
    .await;
    let app = gateway(GatewayConfig::for_upstream(url));
    let (_, body, _) = post_chat(
        &app,
        json!({"model": "m", "messages": [{"role": "user", "content": "repair"}], "tools": tools()}),
    )
    .await;
    let args = body["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"]
        .as_str()
        .unwrap();
    assert_eq!(
        serde_json::from_str::<Value>(args).unwrap(),
        json!({"query": "rust", "limit": 3})
    );
    let (_, body, _) = post_chat(
        &app,
        json!({"model": "m", "messages": [{"role": "user", "content": "reask"}], "tools": tools()}),
    )
    .await;
    assert_eq!(
        body["choices"][0]["message"]["tool_calls"][0]["function"]["name"],
        "lookup"
    );
    assert_eq!(shared.lock().unwrap().seen.len(), 3);
    assert!(body["selfheal"]["actions"].to_string().contains("reask"));
}

/// Issue 11: the gateway re-asked once per request whatever the policy said — a cap of its own
/// beside the ladder. A tool not on offer is the model's wrong tool choice: under the default
/// `wrong_tool` ladder (repair, substitute — none for a tool that does not exist —, replan, ...)
/// a model that writes an unknown tool twice is asked twice more and its third answer goes
/// through; a ladder of one re-ask stops after one.
#[tokio::test]
async fn issue_11_reasks_climb_the_policys_ladder() {
    let answers = || {
        vec![
            (200, tool_call("no_such_tool", "{}")),
            (200, tool_call("still_no_tool", "{}")),
            (200, tool_call("lookup", "{\"key\": \"k\"}")),
        ]
    };
    let ask =
        json!({"model": "m", "messages": [{"role": "user", "content": "go"}], "tools": tools()});
    let (url, shared) = start_upstream(answers()).await;
    let app = gateway(GatewayConfig::for_upstream(url));
    let (_, body, _) = post_chat(&app, ask.clone()).await;
    assert_eq!(
        body["choices"][0]["message"]["tool_calls"][0]["function"]["name"],
        "lookup"
    );
    assert_eq!(body["selfheal"]["status"], "complete");
    assert_eq!(shared.lock().unwrap().seen.len(), 3);

    let (url, shared) = start_upstream(answers()).await;
    let mut one = GatewayConfig::for_upstream(url);
    one.policy =
        selfheal_core::Policy::from_toml_str("[ladders]\nwrong_tool = [\"repair\", \"degrade\"]")
            .unwrap();
    let (_, body, _) = post_chat(&gateway(one), ask).await;
    assert_eq!(body["selfheal"]["status"], "partial");
    assert_eq!(
        shared.lock().unwrap().seen.len(),
        2,
        "one re-ask, then partial"
    );
}

#[tokio::test]
async fn fallback_chain_moves_to_the_next_model() {
    // 404 from the first model: the chain moves on.
    let (bad, _) =
        start_upstream(vec![(404, json!({"error": {"message": "no such model"}}))]).await;
    let (good, _) = start_upstream(vec![]).await;
    let c = chain(
        GatewayConfig::default(),
        &[("bad", &bad), ("good", &good)],
        "smart",
        &[("bad", "m404"), ("good", "m2")],
    );
    let (status, body, _) = post_chat(
        &gateway(c),
        json!({"model": "smart", "messages": [{"role": "user", "content": "fb"}]}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(body["selfheal"]["actions"].to_string().contains("fallback"));
}

#[tokio::test]
async fn metrics_show_request_and_upstream_latency_histograms() {
    let (url, _) = start_upstream(vec![(503, json!({"error": {"message": "busy"}}))]).await;
    let app = gateway(fast(GatewayConfig::for_upstream(url)));
    let (status, _, _) = post_chat(
        &app,
        json!({"model": "m", "messages": [{"role": "user", "content": "hist"}]}),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let resp = app
        .clone()
        .oneshot(Request::get("/metrics").body(Body::empty()).unwrap())
        .await
        .unwrap();
    let text = String::from_utf8(
        resp.into_body()
            .collect()
            .await
            .unwrap()
            .to_bytes()
            .to_vec(),
    )
    .unwrap();
    let value = |line: &str| -> f64 {
        text.lines()
            .find_map(|l| l.strip_prefix(line).map(str::trim))
            .unwrap_or_else(|| panic!("no `{line}` in\n{text}"))
            .parse()
            .unwrap()
    };
    assert!(text.contains("# TYPE selfheal_request_duration_seconds histogram"));
    assert_eq!(value("selfheal_request_duration_seconds_count"), 1.0);
    assert_eq!(
        value("selfheal_request_duration_seconds_bucket{le=\"+Inf\"}"),
        1.0
    );
    // One 503 and its retry: two upstream attempts, each timed.
    assert_eq!(value("selfheal_upstream_duration_seconds_count"), 2.0);
    let request_sum = value("selfheal_request_duration_seconds_sum");
    let upstream_sum = value("selfheal_upstream_duration_seconds_sum");
    assert!(
        request_sum >= upstream_sum && upstream_sum > 0.0,
        "{request_sum} {upstream_sum}"
    );
    // Buckets are cumulative.
    let buckets: Vec<f64> = text
        .lines()
        .filter(|l| l.starts_with("selfheal_upstream_duration_seconds_bucket"))
        .map(|l| l.rsplit(' ').next().unwrap().parse().unwrap())
        .collect();
    assert_eq!(buckets.len(), 19);
    assert!(buckets.windows(2).all(|w| w[0] <= w[1]), "{buckets:?}");
}

async fn post_as(
    app: &Router,
    key: &str,
    body: Value,
) -> (StatusCode, Value, axum::http::HeaderMap) {
    post_to_as(app, "/v1/chat/completions", key, &body).await
}

/// POSTs `body` to `path` with the client key `key`: the status, the answer (`null` if not
/// JSON) and the headers.
async fn post_to_as(
    app: &Router,
    path: &str,
    key: &str,
    body: &Value,
) -> (StatusCode, Value, axum::http::HeaderMap) {
    let req = Request::post(path)
        .header("content-type", "application/json")
        .header("authorization", format!("Bearer {key}"))
        .body(Body::from(body.to_string()))
        .unwrap();
    let resp = app.clone().oneshot(req).await.unwrap();
    let status = resp.status();
    let headers = resp.headers().clone();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        headers,
    )
}

fn offered(seen: &Value) -> Vec<String> {
    seen["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["function"]["name"].as_str().unwrap().to_owned())
        .collect()
}

/// Issue 13: runs were keyed by the conversation's opening alone, so another user whose
/// conversation opened alike inherited the first one's open breaker (and guidance text).
#[tokio::test]
async fn issue_13_tenants_with_the_same_opening_do_not_share_a_run() {
    let (url, shared) = start_upstream(vec![]).await;
    let app = gateway(patient(url));
    let failing = conversation(5, 0);
    let mut fine = conversation(0, 6);
    fine[0] = failing[0].clone();
    let body = |m: &Value| json!({"model": "m", "messages": m, "tools": tools()});
    let (_, _, a) = post_as(&app, "sk-tenant-aaaa", body(&failing)).await;
    let (_, _, b) = post_as(&app, "sk-tenant-bbbb", body(&fine)).await;
    let (_, _, a2) = post_as(&app, "sk-tenant-aaaa", body(&failing)).await;
    let seen = shared.lock().unwrap().seen.clone();
    assert!(!offered(&seen[0]).contains(&"search".to_string()));
    assert!(
        offered(&seen[1]).contains(&"search".to_string()),
        "B's run is its own"
    );
    assert!(!seen[1]["messages"].to_string().contains("[selfheal]"));
    assert!(
        !offered(&seen[2]).contains(&"search".to_string()),
        "A's conversation carries on in its run"
    );
    assert_ne!(a["x-selfheal-run"], b["x-selfheal-run"]);
    assert_eq!(a["x-selfheal-run"], a2["x-selfheal-run"]);
    // Sending back the run id it was answered continues the run, for that tenant only.
    let id = a["x-selfheal-run"].to_str().unwrap().to_owned();
    let other = json!({"model": "m", "tools": tools(),
        "messages": [{"role": "user", "content": "an unrelated opening"}]});
    let echo = |key: &'static str| {
        let app = app.clone();
        let (id, other) = (id.clone(), other.clone());
        async move {
            let req = Request::post("/v1/chat/completions")
                .header("content-type", "application/json")
                .header("authorization", format!("Bearer {key}"))
                .header("x-selfheal-run", id)
                .body(Body::from(other.to_string()))
                .unwrap();
            app.oneshot(req).await.unwrap().headers()["x-selfheal-run"]
                .to_str()
                .unwrap()
                .to_owned()
        }
    };
    assert_eq!(echo("sk-tenant-aaaa").await, id);
    assert_ne!(echo("sk-tenant-bbbb").await, id, "B cannot join A's run");
}

#[tokio::test]
async fn a_required_inbound_key_is_a_401_in_openai_shape() {
    let (url, shared) = start_upstream(vec![]).await;
    let mut c = GatewayConfig::for_upstream(url);
    c.inbound_keys.insert(
        "alice".into(),
        selfheal_gateway::key_hash("sk-gateway-alice"),
    );
    let app = gateway(c);
    let body = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]});
    let (status, err, _) = post_as(&app, "sk-gateway-mallory", body.clone()).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(err["error"]["code"], "invalid_api_key");
    assert!(shared.lock().unwrap().seen.is_empty());
    let (status, _, _) = post_as(&app, "sk-gateway-alice", body).await;
    assert_eq!(status, StatusCode::OK);
}

/// Issue 30: admission, the body limits and the request log are layers on every API route, so
/// the endpoints passed through (`/v1/embeddings`) and `/v1/models` are admitted, bounded and
/// counted as the healed ones are; a 404 or 405 is answered before any of them.
#[tokio::test]
async fn issue_30_every_api_route_is_admitted_bounded_and_counted_alike() {
    let (url, shared) = start_upstream(vec![]).await;
    let mut c = GatewayConfig::for_upstream(url);
    c.inbound_keys.insert(
        "alice".into(),
        selfheal_gateway::key_hash("sk-gateway-alice"),
    );
    c.max_body_bytes = 64;
    let app = gateway(c);
    let send = |req: Request<Body>| {
        let app = app.clone();
        async move {
            let resp = app.oneshot(req).await.unwrap();
            let status = resp.status();
            let bytes = resp.into_body().collect().await.unwrap().to_bytes();
            (status, serde_json::from_slice::<Value>(&bytes).ok())
        }
    };
    let small = json!({"model": "m", "input": "hi"}).to_string();
    let large = json!({"model": "m", "input": "x".repeat(100)}).to_string();
    for path in ["/v1/embeddings", "/v1/chat/completions", "/v1/responses"] {
        // No key: refused before the body is read, even an oversize one.
        let req = Request::post(path).body(Body::from(large.clone())).unwrap();
        let (status, err) = send(req).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{path}");
        assert_eq!(err.unwrap()["error"]["code"], "invalid_api_key", "{path}");
        // A key, and a body past the limit: 413 in OpenAI's shape.
        let req = Request::post(path)
            .header("authorization", "Bearer sk-gateway-alice")
            .body(Body::from(large.clone()))
            .unwrap();
        let (status, err) = send(req).await;
        assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{path}");
        assert_eq!(err.unwrap()["error"]["code"], "request_too_large", "{path}");
    }
    let req = Request::get("/v1/models").body(Body::empty()).unwrap();
    assert_eq!(send(req).await.0, StatusCode::UNAUTHORIZED);
    // The wrong method and no such path are answered as before, unadmitted and uncounted.
    let req = Request::get("/v1/embeddings").body(Body::empty()).unwrap();
    assert_eq!(send(req).await.0, StatusCode::METHOD_NOT_ALLOWED);
    let req = Request::post("/v1/nothing")
        .body(Body::from(small))
        .unwrap();
    assert_eq!(send(req).await.0, StatusCode::NOT_FOUND);
    assert!(shared.lock().unwrap().seen.is_empty());
    let text = metrics_text(&app).await;
    let value = |name: &str| -> f64 {
        text.lines()
            .find_map(|l| l.strip_prefix(name).map(str::trim))
            .unwrap_or_else(|| panic!("no `{name}` in\n{text}"))
            .parse()
            .unwrap()
    };
    assert_eq!(value("selfheal_requests_total "), 7.0);
    assert_eq!(value("selfheal_client_errors_total "), 7.0);
    assert_eq!(value("selfheal_request_duration_seconds_count"), 7.0);
}

async fn metrics_text(app: &Router) -> String {
    let resp = app
        .clone()
        .oneshot(Request::get("/metrics").body(Body::empty()).unwrap())
        .await
        .unwrap();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    String::from_utf8(bytes.to_vec()).unwrap()
}

/// Issue 12: `selfheal_healed_total` stayed 0 after a repair and a re-ask.
#[tokio::test]
async fn issue12_healed_total_counts_every_healing_action() {
    let (url, _) = start_upstream(vec![
        (200, tool_call("search", "{'query': 'rust', limit: \"3\",}")),
        (200, tool_call("no_such_tool", "{}")),
        (200, tool_call("lookup", "{\"key\": \"k\"}")),
    ])
    .await;
    let app = gateway(GatewayConfig::for_upstream(url));
    for content in ["repair", "reask"] {
        let (status, _, _) = post_chat(
            &app,
            json!({"model": "m", "messages": [{"role": "user", "content": content}], "tools": tools()}),
        )
        .await;
        assert_eq!(status, StatusCode::OK);
    }
    let text = metrics_text(&app).await;
    for line in [
        "selfheal_repairs_total 1",
        "selfheal_reasks_total 1",
        "selfheal_healed_total 2",
    ] {
        assert!(text.lines().any(|l| l == line), "no `{line}` in\n{text}");
    }
}

/// Issue 12: every answer carried `"cost": 18446744073709551615` (u64::MAX, which JavaScript
/// cannot read exactly) for the unlimited cost budget.
#[tokio::test]
async fn issue12_unlimited_budgets_are_null_not_u64_max() {
    let (url, _) = start_upstream(vec![]).await;
    let app = gateway(GatewayConfig::for_upstream(url));
    let req = Request::post("/v1/chat/completions")
        .header("content-type", "application/json")
        .body(Body::from(
            json!({"model": "m", "messages": [{"role": "user", "content": "cost"}]}).to_string(),
        ))
        .unwrap();
    let resp = app.clone().oneshot(req).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let raw = resp.into_body().collect().await.unwrap().to_bytes();
    let raw = String::from_utf8(raw.to_vec()).unwrap();
    assert!(!raw.contains(&u64::MAX.to_string()), "{raw}");
    let body: Value = serde_json::from_str(&raw).unwrap();
    let limits = &body["selfheal"]["budget"]["limits"];
    assert_eq!(limits["cost"], Value::Null, "{limits}");
    assert_eq!(limits["retries"], 3, "{limits}");
}

/// Issue 13 item 3 (decided in the core, issue 11): during a provider outage every request of
/// one run is served by the healthy fallback — the run's escalation budget (1 by default) does
/// not ration fall-backs forced by upstream health — and once the primary's breaker is open it
/// is skipped without being tried.
#[tokio::test]
async fn an_outage_never_spends_the_runs_budget_into_502s() {
    let down = vec![(503, json!({"error": {"message": "overloaded"}})); 64];
    let (bad, bad_seen) = start_upstream(down).await;
    let (good, _) = start_upstream(vec![]).await;
    let mut c = fast(GatewayConfig::default());
    c.breaker_failures = 3;
    let c = chain(
        c,
        &[("bad", &bad), ("good", &good)],
        "smart",
        &[("bad", "m1"), ("good", "m2")],
    );
    let app = gateway(c);
    let mut actions = Vec::new();
    for _ in 0..6 {
        // The same opening: one run.
        let (status, body, _) = post_chat(
            &app,
            json!({"model": "smart", "messages": [{"role": "user", "content": "outage"}]}),
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{body}");
        assert_eq!(body["choices"][0]["message"]["content"], "fine");
        actions.push(body["selfheal"]["actions"].to_string());
    }
    // The first requests try the primary (and retry it); once its breaker opened it is skipped.
    assert!(actions[0].contains("fallback"), "{actions:?}");
    assert!(actions[5].contains("cooldown_skip"), "{actions:?}");
    let tried = bad_seen.lock().unwrap().seen.len();
    assert!(
        tried <= 4,
        "the open breaker spares the primary: {tried} attempts"
    );
}

/// A rate limit on a client's own key (the default `auth = "client"`: each client's key goes
/// upstream) is that client's quota, not the upstream's health: alice's limited key never opens
/// the breaker every tenant shares, so bob's request is still sent to the primary. With no
/// client credentials upstream (`auth = "none"`, one quota for all) the same 429s open it and
/// bob's request skips the primary.
#[tokio::test]
async fn one_clients_rate_limit_never_sends_another_clients_calls_elsewhere() {
    for (auth, skipped) in [(None, false), (Some(Auth::None), true)] {
        let limited = vec![
            (
                429,
                json!({"error": {"message": "rate limit reached for your key"}})
            );
            64
        ];
        let (bad, bad_seen) = start_upstream(limited).await;
        let (good, _) = start_upstream(vec![]).await;
        let mut c = fast(GatewayConfig::default());
        c.breaker_failures = 3;
        let mut c = chain(
            c,
            &[("bad", &bad), ("good", &good)],
            "smart",
            &[("bad", "m1"), ("good", "m2")],
        );
        c.upstreams.get_mut("bad").unwrap().auth = auth;
        let app = gateway(c);
        let send = |key: &'static str, i: usize| {
            let app = app.clone();
            async move {
                let req = Request::post("/v1/chat/completions")
                    .header("content-type", "application/json")
                    .header("authorization", format!("Bearer {key}"))
                    .body(Body::from(
                        json!({"model": "smart", "messages": [
                            {"role": "user", "content": format!("{key} asks {i}")}]})
                        .to_string(),
                    ))
                    .unwrap();
                let resp = app.oneshot(req).await.unwrap();
                assert_eq!(resp.status(), StatusCode::OK);
                let bytes = resp.into_body().collect().await.unwrap().to_bytes();
                serde_json::from_slice::<Value>(&bytes).unwrap()
            }
        };
        for i in 0..3 {
            let body = send("sk-alice", i).await;
            assert_eq!(body["choices"][0]["message"]["content"], "fine", "{body}");
        }
        let before = bad_seen.lock().unwrap().seen.len();
        let bob = send("sk-bob", 0).await;
        let tried = bad_seen.lock().unwrap().seen.len() - before;
        let actions = bob["selfheal"]["actions"].to_string();
        assert_eq!(
            actions.contains("cooldown_skip"),
            skipped,
            "auth {auth:?}: bob's actions {actions}"
        );
        assert_eq!(
            tried > 0,
            !skipped,
            "auth {auth:?}: bob's attempts on the primary {tried}"
        );
    }
}

async fn upstream_responses(State(s): State<Shared>, body: axum::Json<Value>) -> Response {
    s.lock().unwrap().seen.push(body.0);
    axum::Json(json!({"id": "resp_1", "object": "response", "created_at": 0, "model": "m",
        "status": "completed", "output": [{"type": "message", "id": "msg_1", "role": "assistant",
        "status": "completed", "content": [{"type": "output_text", "text": "fine", "annotations": []}]}]}))
    .into_response()
}

/// Issue 11: on the Responses API the controller's directives are carried out as on chat — its
/// retry as guidance in `instructions`, its output repair in place of the tool's
/// `function_call_output` — not only its stop.
#[tokio::test]
async fn issue_11_responses_carry_out_the_controllers_directives() {
    let shared: Shared = Arc::new(Mutex::new(Script::default()));
    let upstream = Router::new()
        .route("/v1/responses", post(upstream_responses))
        .with_state(shared.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, upstream).await });
    let app = gateway(GatewayConfig::for_upstream(format!("http://{addr}/v1")));
    let tools = json!([{"type": "function", "name": "search", "parameters": {"type": "object",
        "properties": {"query": {"type": "string"}}, "required": ["query"]}}]);
    let post = |input: Value| {
        let body =
            json!({"model": "m", "instructions": "be brief", "input": input, "tools": tools});
        let app = app.clone();
        async move {
            let req = Request::post("/v1/responses")
                .header("content-type", "application/json")
                .body(Body::from(body.to_string()))
                .unwrap();
            let resp = app.oneshot(req).await.unwrap();
            assert_eq!(resp.status(), StatusCode::OK);
            let bytes = resp.into_body().collect().await.unwrap().to_bytes();
            serde_json::from_slice::<Value>(&bytes).unwrap()
        }
    };
    let call = |id: &str| {
        json!({"type": "function_call", "call_id": id, "name": "search",
               "arguments": "{\"query\": \"q\"}"})
    };
    // A tool that is down: the ladder's first rung is a retry, which the model reads.
    let answer = post(json!([
        {"role": "user", "content": "find q"},
        call("c1"),
        {"type": "function_call_output", "call_id": "c1", "output": "Error: 503 Service Unavailable"},
    ]))
    .await;
    let seen = shared.lock().unwrap().seen.pop().unwrap();
    let instructions = seen["instructions"].as_str().unwrap();
    assert!(instructions.starts_with("be brief"), "{instructions}");
    assert!(instructions.contains("call it again"), "{instructions}");
    assert!(
        answer["selfheal"]["actions"]
            .as_array()
            .unwrap()
            .iter()
            .any(|a| a == "retry"),
        "{answer}"
    );
    // A result in a code fence: the model reads the repaired value in its place.
    post(json!([
        {"role": "user", "content": "find r"},
        call("c2"),
        {"type": "function_call_output", "call_id": "c2", "output": "```json\n{\"hits\": 3}\n```"},
    ]))
    .await;
    let seen = shared.lock().unwrap().seen.pop().unwrap();
    let output = seen["input"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["type"] == "function_call_output")
        .map(|i| i["output"].clone())
        .unwrap();
    assert_eq!(output, json!("{\"hits\":3}"), "{seen}");
}

/// Issue 13 (the gateway's cost): an answer whose tool calls are usable as written goes back
/// as the upstream wrote it, the `selfheal` report added; the report is the one an answer that
/// had to be repaired (parsed, edited, written again) gets, same keys and budget.
#[tokio::test]
async fn issue_13_a_usable_answer_is_forwarded_as_written_with_the_same_report() {
    let usable = tool_call("search", "{\"query\": \"rust\"}");
    let (url, _) = start_upstream(vec![
        (200, usable.clone()),
        (200, tool_call("search", "{'query': 'rust'}")),
    ])
    .await;
    let app = gateway(GatewayConfig::for_upstream(url));
    let ask = |text: &str| json!({"model": "m", "messages": [{"role": "user", "content": text}], "tools": tools()});
    let (status, plain, headers) = post_chat(&app, ask("plain")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(headers["content-type"], "application/json");
    assert_eq!(headers["x-selfheal-status"], "complete");
    let mut rest = plain.clone();
    let report = rest
        .as_object_mut()
        .and_then(|o| o.remove("selfheal"))
        .unwrap_or(Value::Null);
    assert_eq!(rest, usable);
    assert_eq!(report["status"], "complete");
    assert_eq!(report["reason"], Value::Null);
    let (_, repaired, _) = post_chat(&app, ask("repaired")).await;
    let other = &repaired["selfheal"];
    assert_eq!(other["status"], "complete");
    let keys = |v: &Value| {
        v.as_object()
            .map(|o| o.keys().cloned().collect::<Vec<_>>())
            .unwrap_or_default()
    };
    assert_eq!(keys(&report), keys(other));
    assert_eq!(report["budget"], other["budget"]);
    assert_eq!(keys(&report["budget"]["limits"]).len(), 7);
}

/// A usable call of a `grounded` tool is still judged against the conversation: one whose
/// argument appears nowhere in it is never forwarded as written (the fast path of a usable
/// answer must not skip the check), and the model is asked again.
#[tokio::test]
async fn a_usable_but_ungrounded_call_of_a_grounded_tool_is_reasked_not_forwarded() {
    let (url, shared) = start_upstream(vec![
        (200, tool_call("search", "{\"query\": \"invented\"}")),
        (200, tool_call("search", "{\"query\": \"rust\"}")),
    ])
    .await;
    let mut config = GatewayConfig::for_upstream(url);
    config
        .tools
        .insert("search".into(), toml::from_str("grounded = true").unwrap());
    let app = gateway(config);
    let (status, answer, _) = post_chat(
        &app,
        json!({"model": "m", "tools": tools(),
               "messages": [{"role": "user", "content": "search for rust"}]}),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let args = answer["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"].clone();
    assert_eq!(args, json!("{\"query\": \"rust\"}"), "{answer}");
    assert_eq!(shared.lock().unwrap().seen.len(), 2, "asked again");
}

/// One call of `tool` with `args` and its result `result`, after the user's request.
fn one_result(tool: &str, args: &str, result: &str) -> Value {
    json!([
        {"role": "user", "content": "what is the EURUSD rate?"},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
            "function": {"name": tool, "arguments": args}}]},
        {"role": "tool", "tool_call_id": "c1", "content": result}
    ])
}

fn fx_tools() -> Value {
    json!([{"type": "function", "function": {"name": "fx", "parameters": {
        "type": "object", "properties": {"pair": {"type": "string"},
                                          "no_cache": {"type": "boolean"}},
        "required": ["pair"]}}}])
}

/// Issue 11: a tool that declares its `as_of` stamp and its cache-bypass argument gets its
/// stale answers refreshed on the wire — the model is told to call it again with that argument
/// set — and an answer that is current, or a tool that declares neither, gets nothing.
#[tokio::test]
async fn issue_11_a_stale_answer_is_refreshed_through_the_declared_argument() {
    let declared = "output = [\"rate\"]\nas_of = \"as_of\"\nrefresh = \"no_cache\"\n";
    let now = selfheal_gateway::wall_ms();
    let cases = [
        (declared, now - 86_400_000, true),
        (declared, now - 1_000, false),
        ("output = [\"rate\"]\n", now - 86_400_000, false),
    ];
    for (tool, as_of, refreshed) in cases {
        let (url, shared) = start_upstream(vec![]).await;
        let mut config = GatewayConfig::for_upstream(url);
        config
            .tools
            .insert("fx".into(), toml::from_str(tool).unwrap());
        let app = gateway(config);
        let result = json!({"rate": 1.1, "as_of": as_of}).to_string();
        let (status, body, headers) = post_chat(
            &app,
            json!({"model": "m", "tools": fx_tools(),
                   "messages": one_result("fx", "{\"pair\": \"EURUSD\"}", &result)}),
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{body}");
        let seen = shared.lock().unwrap().seen.clone();
        let guidance = guidance_seen(&seen[0]);
        let actions = headers
            .get("x-selfheal-actions")
            .map(|h| h.to_str().unwrap().to_owned())
            .unwrap_or_default();
        assert_eq!(
            guidance.contains("`no_cache` set to true"),
            refreshed,
            "{tool} {as_of}: {guidance}"
        );
        assert_eq!(actions.contains("refresh"), refreshed, "{actions}");
    }
}

/// Issue 11: an answer without a field its tool declares is schema drift on the wire, as
/// in-process: a recognisable rename is mapped back in what the model reads; a field renamed
/// past recognition is fetched again, never forwarded as if it were the answer.
#[tokio::test]
async fn issue_11_a_drifted_answer_is_repaired_or_fetched_again() {
    for (result, mapped) in [(r#"{"rate_v2": 1.1}"#, true), (r#"{"f12": 1.1}"#, false)] {
        let (url, shared) = start_upstream(vec![]).await;
        let mut config = GatewayConfig::for_upstream(url);
        config
            .tools
            .insert("fx".into(), toml::from_str("output = [\"rate\"]").unwrap());
        let app = gateway(config);
        let (status, body, headers) = post_chat(
            &app,
            json!({"model": "m", "tools": fx_tools(),
                   "messages": one_result("fx", "{\"pair\": \"EURUSD\"}", result)}),
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{body}");
        let seen = shared.lock().unwrap().seen.clone();
        let forwarded = seen[0]["messages"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["role"] == "tool")
            .unwrap()["content"]
            .clone();
        let actions = headers["x-selfheal-actions"].to_str().unwrap().to_owned();
        assert!(actions.contains("repair"), "{result}: {actions}");
        let guidance = guidance_seen(&seen[0]);
        if mapped {
            let v: Value = serde_json::from_str(forwarded.as_str().unwrap()).unwrap();
            assert_eq!(v, json!({"rate": 1.1}));
            assert!(!guidance.contains("call it again"), "{guidance}");
        } else {
            assert_eq!(forwarded, json!(result), "the bytes are not invented");
            assert!(
                guidance.contains("`fx` failed (malformed_output): call it again"),
                "{guidance}"
            );
        }
    }
}

/// A conversation in which `fx` answered `{"rate": 1.1}` and `search` then failed `failures`
/// times before it answered; `extra` messages follow.
fn recovered(failures: usize, extra: &[Value]) -> Value {
    let mut m = vec![
        json!({"role": "user", "content": "what is the EURUSD rate, and news on it?"}),
        json!({"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
            "function": {"name": "fx", "arguments": "{\"pair\": \"EURUSD\"}"}}]}),
        json!({"role": "tool", "tool_call_id": "c1", "content": "{\"rate\": 1.1}"}),
    ];
    for i in 0..=failures {
        let id = format!("s{i}");
        m.push(json!({"role": "assistant", "content": null, "tool_calls": [{"id": id,
            "type": "function", "function": {"name": "search", "arguments": "{\"query\": \"EURUSD\"}"}}]}));
        let result = if i < failures {
            "Error: 503 Service Unavailable"
        } else {
            "{\"hits\": 3}"
        };
        m.push(json!({"role": "tool", "tool_call_id": id, "content": result}));
    }
    m.extend(extra.iter().cloned());
    json!(m)
}

fn fx_and_search() -> Value {
    let mut t = fx_tools();
    t.as_array_mut()
        .unwrap()
        .push(json!({"type": "function", "function": {"name": "search",
        "parameters": {"type": "object", "properties": {"query": {"type": "string"}},
                       "required": ["query"]}}}));
    t
}

/// Issue 11: the core's read before answering on the wire. A run that needed a recovery has
/// its final answer held and the model asked to read the values of a tool the operator marked
/// `reread` once more; a value that held lets the answer through, one that changed is the
/// verifier's rejection, recovered along its ladder. A run that went well is not read again.
#[tokio::test]
async fn issue_11_a_recovered_run_reads_its_unconfirmed_values_again_before_answering() {
    let config = |url: String| {
        let mut c = fast(GatewayConfig::for_upstream(url));
        c.tools
            .insert("fx".into(), toml::from_str("reread = true").unwrap());
        c
    };
    let reread = |args: &str| {
        format!("Before you answer, read `fx` again: call it with the arguments {args}.")
    };
    // A run that went well answers at once.
    let (url, shared) = start_upstream(vec![(200, text("1.1"))]).await;
    let app = gateway(config(url));
    let (_, body, _) = post_chat(
        &app,
        json!({"model": "m", "tools": fx_and_search(), "messages": recovered(0, &[])}),
    )
    .await;
    assert_eq!(body["choices"][0]["message"]["content"], "1.1", "{body}");
    assert_eq!(shared.lock().unwrap().seen.len(), 1, "nothing read again");

    for (again, holds) in [("{\"rate\": 1.1}", true), ("{\"rate\": 9.9}", false)] {
        let (url, shared) = start_upstream(vec![
            (200, text("1.1")),
            (200, tool_call("fx", "{\"pair\":\"EURUSD\"}")),
            (200, text("1.1")),
        ])
        .await;
        let app = gateway(config(url));
        let (status, body, headers) = post_chat(
            &app,
            json!({"model": "m", "tools": fx_and_search(), "messages": recovered(1, &[])}),
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{body}");
        let call = &body["choices"][0]["message"]["tool_calls"][0]["function"];
        assert_eq!(call["name"], "fx", "the answer is held: {body}");
        let actions = headers["x-selfheal-actions"].to_str().unwrap().to_owned();
        assert!(actions.contains("reread"), "{actions}");
        let seen = shared.lock().unwrap().seen.clone();
        assert_eq!(seen.len(), 2);
        assert!(
            guidance_seen(&seen[1]).contains(&reread("{\"pair\":\"EURUSD\"}")),
            "{}",
            guidance_seen(&seen[1])
        );
        // The client runs the read and sends its result.
        let extra = [
            json!({"role": "assistant", "content": null, "tool_calls": [{"id": "r1",
                "type": "function", "function": {"name": "fx", "arguments": "{\"pair\":\"EURUSD\"}"}}]}),
            json!({"role": "tool", "tool_call_id": "r1", "content": again}),
        ];
        let (status, body, _) = post_chat(
            &app,
            json!({"model": "m", "tools": fx_and_search(), "messages": recovered(1, &extra)}),
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{body}");
        let seen = shared.lock().unwrap().seen.clone();
        assert_eq!(seen.len(), 3, "read once per run");
        let guidance = guidance_seen(&seen[2]);
        assert_eq!(
            guidance.contains("`fx` failed ("),
            !holds,
            "{again}: {guidance}"
        );
        if holds {
            assert_eq!(body["choices"][0]["message"]["content"], "1.1", "{body}");
            assert_eq!(body["selfheal"]["status"], "complete", "{body}");
        }
    }
}

/// Issue 11: a re-ask of a model answer whose calls could not be used is a recovery of the run,
/// counted by its controller as in-process: under a policy that claims nothing after a
/// recovery, the answer the re-ask brings — and a later final answer of the same run — goes out
/// `partial`; under the default policy both are `complete`.
#[tokio::test]
async fn a_reask_counts_as_a_recovery_of_the_run() {
    for (policy, status) in [
        ("claim_after_recovery = false", "partial"),
        ("", "complete"),
    ] {
        let (url, shared) = start_upstream(vec![
            (200, tool_call("nope", "{}")),
            (200, text("done")),
            (200, tool_call("nope", "{}")),
            (200, tool_call("search", "{\"query\": \"k\"}")),
            (200, text("k has 3 hits")),
        ])
        .await;
        let mut config = fast(GatewayConfig::for_upstream(url));
        config.policy = selfheal_core::Policy::from_toml_str(policy).unwrap();
        let app = gateway(config);
        // One request: the unknown tool re-asked, the re-ask answered with a final answer.
        let (_, body, headers) = post_chat(
            &app,
            json!({"model": "m", "tools": tools(), "messages": [
                {"role": "user", "content": "first task"}]}),
        )
        .await;
        assert_eq!(shared.lock().unwrap().seen.len(), 2, "one re-ask");
        assert_eq!(body["choices"][0]["message"]["content"], "done", "{body}");
        assert_eq!(body["selfheal"]["status"], status, "{policy}: {body}");
        assert_eq!(headers["x-selfheal-status"], status);
        // Another run: the re-ask brings a usable call; the run's final answer comes later.
        let first = json!({"role": "user", "content": "second task"});
        let (_, body, _) = post_chat(
            &app,
            json!({"model": "m", "tools": tools(), "messages": [first.clone()]}),
        )
        .await;
        assert_eq!(
            body["choices"][0]["message"]["tool_calls"][0]["function"]["name"], "search",
            "{body}"
        );
        let call = body["choices"][0]["message"].clone();
        let id = call["tool_calls"][0]["id"].clone();
        let (_, body, _) = post_chat(
            &app,
            json!({"model": "m", "tools": tools(), "messages": [first, call,
                {"role": "tool", "tool_call_id": id, "content": "{\"hits\": 3}"}]}),
        )
        .await;
        assert_eq!(body["choices"][0]["message"]["content"], "k has 3 hits");
        assert_eq!(body["selfheal"]["status"], status, "{policy}: {body}");
    }
}

/// [`a_reask_counts_as_a_recovery_of_the_run`] on `/v1/responses`: the final answer a re-ask
/// brings is judged by the run's core.
#[tokio::test]
async fn a_responses_reask_counts_as_a_recovery_of_the_run() {
    for (policy, status) in [
        ("claim_after_recovery = false", "partial"),
        ("", "complete"),
    ] {
        let (url, shared) = start_responses_upstream(vec![responses_call("nope", "{}")]).await;
        let mut config = fast(GatewayConfig::for_upstream(url));
        config.policy = selfheal_core::Policy::from_toml_str(policy).unwrap();
        let app = gateway(config);
        let body = json!({"model": "m", "input": "a task", "tools": responses_tools()});
        let (_, answer) = post_json(&app, "/v1/responses", &body).await;
        assert_eq!(shared.lock().unwrap().seen.len(), 2, "one re-ask");
        assert!(answer["output"].to_string().contains("fine"), "{answer}");
        assert_eq!(answer["selfheal"]["status"], status, "{policy}: {answer}");
    }
}

/// Issue 11: an answer given while a tool's failure is still open is not returned as complete —
/// the core's `finish` would call that run partial — and one given after the failure was
/// recovered is.
#[tokio::test]
async fn issue_11_an_answer_over_an_open_failure_is_partial() {
    for (recovered, status) in [(false, "partial"), (true, "complete")] {
        // The answer's one number is the tool's (the grounding rule claims nothing else).
        let (url, _shared) = start_upstream(vec![(200, text("EURUSD: 3 hits"))]).await;
        let app = gateway(fast(GatewayConfig::for_upstream(url)));
        let mut m = vec![
            json!({"role": "user", "content": "news on EURUSD?"}),
            json!({"role": "assistant", "content": null, "tool_calls": [{"id": "s0",
                "type": "function", "function": {"name": "search", "arguments": "{\"query\": \"EURUSD\"}"}}]}),
            json!({"role": "tool", "tool_call_id": "s0", "content": "{\"error\": \"service unavailable\"}"}),
        ];
        if recovered {
            m.push(json!({"role": "assistant", "content": null, "tool_calls": [{"id": "s1",
                "type": "function", "function": {"name": "search", "arguments": "{\"query\": \"EURUSD\"}"}}]}));
            m.push(json!({"role": "tool", "tool_call_id": "s1", "content": "{\"hits\": 3}"}));
        }
        let (code, body, headers) = post_chat(
            &app,
            json!({"model": "m", "tools": fx_and_search(), "messages": m}),
        )
        .await;
        assert_eq!(code, StatusCode::OK, "{body}");
        assert_eq!(body["selfheal"]["status"], status, "{body}");
        assert_eq!(headers["x-selfheal-status"], status);
    }
}

/// Issue 10's `claim_after_recovery` reaches the gateway through the core: under a policy that
/// claims nothing after a recovery, the final answer of a run whose tool failed and was called
/// again goes out `partial` with the policy's reason; a run with no failure stays `complete`.
#[tokio::test]
async fn a_policy_that_claims_nothing_after_a_recovery_flags_the_answer_partial() {
    for (failures, status) in [(1, "partial"), (0, "complete")] {
        let (url, _shared) = start_upstream(vec![(200, text("1.1, and 3 hits"))]).await;
        let mut config = fast(GatewayConfig::for_upstream(url));
        config.policy =
            selfheal_core::Policy::from_toml_str("claim_after_recovery = false").unwrap();
        let app = gateway(config);
        let (code, body, headers) = post_chat(
            &app,
            json!({"model": "m", "tools": fx_and_search(), "messages": recovered(failures, &[])}),
        )
        .await;
        assert_eq!(code, StatusCode::OK, "{body}");
        assert_eq!(body["selfheal"]["status"], status, "{body}");
        assert_eq!(headers["x-selfheal-status"], status);
        if failures > 0 {
            let reason = body["selfheal"]["reason"].as_str().unwrap_or_default();
            assert!(reason.contains("claim_after_recovery"), "{body}");
        }
    }
}

/// Issue 11: the read before answering is the model's to make. A model that answers again
/// without the call leaves the value unread, and the answer goes out `partial`, not as if the
/// read had confirmed it.
#[tokio::test]
async fn an_answer_whose_read_before_answering_was_not_made_is_partial() {
    let (url, shared) = start_upstream(vec![(200, text("1.1")), (200, text("1.1"))]).await;
    let mut c = fast(GatewayConfig::for_upstream(url));
    c.tools
        .insert("fx".into(), toml::from_str("reread = true").unwrap());
    let app = gateway(c);
    let (status, body, headers) = post_chat(
        &app,
        json!({"model": "m", "tools": fx_and_search(), "messages": recovered(1, &[])}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        shared.lock().unwrap().seen.len(),
        2,
        "the read was asked for"
    );
    assert_eq!(body["selfheal"]["status"], "partial", "{body}");
    assert_eq!(headers["x-selfheal-status"], "partial");
    let reason = body["selfheal"]["reason"].as_str().unwrap_or_default();
    assert!(reason.contains("not read again"), "{body}");
}

/// The user's task, a call of `lookup` with `{"key": "k"}`, and its `result`.
fn looked_up(result: &str) -> Vec<Value> {
    vec![
        json!({"role": "user", "content": "look k up, then search for it"}),
        json!({"role": "assistant", "content": null, "tool_calls": [{"id": "c1",
            "type": "function", "function": {"name": "lookup", "arguments": "{\"key\": \"k\"}"}}]}),
        json!({"role": "tool", "tool_call_id": "c1", "content": result}),
    ]
}

/// Issue 11: a model that calls again, name and arguments, the call whose result it was just
/// given has repeated itself (the in-process client's repetition: the previous step's call
/// again). The wire shows it — the request carries the call and its result — so the repeated
/// call is not forwarded: it is re-asked along the core's `control_loop` ladder like any call
/// that cannot be used, and the model's next call goes out.
#[tokio::test]
async fn issue_11_a_call_repeating_the_answered_one_is_reasked() {
    let (url, shared) = start_upstream(vec![
        // The same call, written differently (spacing): the same arguments.
        (200, tool_call("lookup", "{ \"key\" : \"k\" }")),
        (200, tool_call("search", "{\"query\": \"k\"}")),
    ])
    .await;
    let app = gateway(GatewayConfig::for_upstream(url));
    let (_, body, _) = post_chat(
        &app,
        json!({"model": "m", "messages": looked_up("{\"value\": 42}"), "tools": tools()}),
    )
    .await;
    assert_eq!(
        body["choices"][0]["message"]["tool_calls"][0]["function"]["name"], "search",
        "{body}"
    );
    assert_eq!(body["selfheal"]["status"], "complete");
    assert!(body["selfheal"]["actions"].to_string().contains("reask"));
    let seen = shared.lock().unwrap().seen.clone();
    assert_eq!(seen.len(), 2, "one re-ask");
    let reask = seen[1]["messages"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .clone();
    assert_eq!(reask["role"], "user");
    assert!(
        reask["content"]
            .as_str()
            .unwrap()
            .contains("You already called `lookup` with these exact arguments"),
        "{reask}"
    );

    // A model that keeps repeating itself is not forwarded either: the ladder ends it partial.
    let (url, shared) = start_upstream(vec![
        (200, tool_call("lookup", "{\"key\": \"k\"}")),
        (200, tool_call("lookup", "{\"key\": \"k\"}")),
        (200, tool_call("lookup", "{\"key\": \"k\"}")),
        (200, tool_call("lookup", "{\"key\": \"k\"}")),
    ])
    .await;
    let app = gateway(GatewayConfig::for_upstream(url));
    let (_, body, _) = post_chat(
        &app,
        json!({"model": "m", "messages": looked_up("{\"value\": 42}"), "tools": tools()}),
    )
    .await;
    assert_eq!(body["selfheal"]["status"], "partial", "{body}");
    assert!(body["choices"][0]["message"].get("tool_calls").is_none());
    assert!(shared.lock().unwrap().seen.len() >= 2);
}

/// A tool the operator marks `repeatable` (polled until a job is done, a clock) is called again
/// with the same arguments as it is meant to be: the call goes out as written, not re-asked.
#[tokio::test]
async fn a_repeatable_tool_called_again_as_it_was_is_forwarded() {
    let (url, shared) = start_upstream(vec![(200, tool_call("lookup", "{\"key\": \"k\"}"))]).await;
    let mut c = GatewayConfig::for_upstream(url);
    c.tools.insert(
        "lookup".into(),
        toml::from_str("repeatable = true").unwrap(),
    );
    let app = gateway(c);
    let (_, body, _) = post_chat(
        &app,
        json!({"model": "m", "messages": looked_up("{\"status\": \"pending\"}"), "tools": tools()}),
    )
    .await;
    assert_eq!(
        body["choices"][0]["message"]["tool_calls"][0]["function"]["name"], "lookup",
        "{body}"
    );
    assert_eq!(body["selfheal"]["status"], "complete", "{body}");
    assert!(!body["selfheal"]["actions"].to_string().contains("reask"));
    assert_eq!(shared.lock().unwrap().seen.len(), 1);

    // The same on `/v1/responses`.
    let (url, shared) =
        start_responses_upstream(vec![responses_call("lookup", "{\"key\": \"k\"}")]).await;
    let mut c = GatewayConfig::for_upstream(url);
    c.tools.insert(
        "lookup".into(),
        toml::from_str("repeatable = true").unwrap(),
    );
    let app = gateway(c);
    let body = json!({"model": "m", "input": looked_up_items("{\"status\": \"pending\"}"),
                      "tools": responses_tools()});
    let (_, answer) = post_json(&app, "/v1/responses", &body).await;
    assert_eq!(answer["output"][0]["name"], "lookup", "{answer}");
    assert!(!answer["selfheal"]["actions"].to_string().contains("reask"));
    assert_eq!(shared.lock().unwrap().seen.len(), 1);
}

/// A scripted Responses upstream: each request gets the next of `steps` (a response object),
/// then a text answer.
async fn start_responses_upstream(steps: Vec<Value>) -> (String, Shared) {
    async fn answer(State(s): State<Shared>, body: axum::Json<Value>) -> Response {
        let mut s = s.lock().unwrap();
        s.seen.push(body.0);
        let next = if s.steps.is_empty() {
            responses_answer(
                json!([{"type": "message", "id": "msg_1", "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": "fine", "annotations": []}]}]),
            )
        } else {
            s.steps.remove(0).1
        };
        axum::Json(next).into_response()
    }
    serve_script(steps.into_iter().map(|s| (200, s)).collect(), |r| {
        r.route("/v1/responses", post(answer))
    })
    .await
}

/// A completed Responses object with `output`.
fn responses_answer(output: Value) -> Value {
    json!({"id": "resp_1", "object": "response", "created_at": 0, "model": "m",
           "status": "completed", "output": output})
}

/// A Responses answer that calls `name` with `args`.
fn responses_call(name: &str, args: &str) -> Value {
    responses_answer(
        json!([{"type": "function_call", "id": "fc_2", "call_id": "c2",
        "name": name, "arguments": args, "status": "completed"}]),
    )
}

/// The Responses shape of [`tools`].
fn responses_tools() -> Value {
    json!([
        {"type": "function", "name": "search", "parameters": {"type": "object",
            "properties": {"query": {"type": "string"}}, "required": ["query"]}},
        {"type": "function", "name": "lookup", "parameters": {"type": "object",
            "properties": {"key": {"type": "string"}}, "required": ["key"]}}
    ])
}

/// [`looked_up`] as a Responses `input`.
fn looked_up_items(result: &str) -> Value {
    json!([
        {"role": "user", "content": "look k up, then search for it"},
        {"type": "function_call", "id": "fc_1", "call_id": "c1", "name": "lookup",
         "arguments": "{\"key\": \"k\"}"},
        {"type": "function_call_output", "call_id": "c1", "output": result},
    ])
}

/// Issue 11: on `/v1/responses` too, a call that repeats the model's previous, answered call
/// (the `function_call` item whose `function_call_output` the input carries) is not forwarded:
/// it is re-asked along the core's ladder, through the same check as on chat completions, and
/// the model's next call goes out; a model that keeps repeating itself ends `partial`, with
/// no call.
#[tokio::test]
async fn issue_11_a_responses_call_repeating_the_answered_one_is_reasked() {
    let (url, shared) = start_responses_upstream(vec![
        responses_call("lookup", "{ \"key\" : \"k\" }"),
        responses_call("search", "{\"query\": \"k\"}"),
    ])
    .await;
    let app = gateway(GatewayConfig::for_upstream(url));
    let body = json!({"model": "m", "input": looked_up_items("{\"value\": 42}"),
                      "tools": responses_tools()});
    let (status, answer) = post_json(&app, "/v1/responses", &body).await;
    assert_eq!(status, StatusCode::OK);
    let output = answer["output"].as_array().unwrap();
    assert_eq!(output.len(), 1, "{answer}");
    assert_eq!(output[0]["name"], "search", "{answer}");
    assert_eq!(answer["selfheal"]["status"], "complete", "{answer}");
    assert!(answer["selfheal"]["actions"].to_string().contains("reask"));
    let seen = shared.lock().unwrap().seen.clone();
    assert_eq!(seen.len(), 2, "one re-ask");
    let reask = seen[1]["input"].as_array().unwrap().last().unwrap().clone();
    assert!(
        reask["content"]
            .as_str()
            .unwrap()
            .contains("You already called `lookup` with these exact arguments"),
        "{reask}"
    );

    let repeat = responses_call("lookup", "{\"key\": \"k\"}");
    let (url, _) = start_responses_upstream(vec![repeat; 4]).await;
    let app = gateway(GatewayConfig::for_upstream(url));
    let (_, answer) = post_json(&app, "/v1/responses", &body).await;
    assert_eq!(answer["selfheal"]["status"], "partial", "{answer}");
    assert!(
        !answer["output"].to_string().contains("function_call"),
        "the repeated call went out: {answer}"
    );

    // The same call after a failed result is the retry, not a repetition: it goes out.
    let (url, shared) =
        start_responses_upstream(vec![responses_call("lookup", "{\"key\": \"k\"}")]).await;
    let app = gateway(GatewayConfig::for_upstream(url));
    let failed = json!({"model": "m", "input": looked_up_items("Error: 503 Service Unavailable"),
                        "tools": responses_tools()});
    let (_, answer) = post_json(&app, "/v1/responses", &failed).await;
    assert_eq!(answer["output"][0]["name"], "lookup", "{answer}");
    assert_eq!(shared.lock().unwrap().seen.len(), 1);
}

/// POSTs `body` to `path` and reads the JSON answer.
async fn post_json(app: &Router, path: &str, body: &Value) -> (StatusCode, Value) {
    let req = Request::post(path)
        .header("content-type", "application/json")
        .body(Body::from(body.to_string()))
        .unwrap();
    let resp = app.clone().oneshot(req).await.unwrap();
    let status = resp.status();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    (status, serde_json::from_slice(&bytes).unwrap())
}

/// Issue 11: the same call again is not a repetition when its result failed (calling it again
/// is the retry), when the user asked something new since, or when its arguments differ: it
/// goes out as the model wrote it, with no re-ask.
#[tokio::test]
async fn issue_11_the_same_call_is_forwarded_when_it_is_not_a_repetition() {
    let repeat = || vec![(200, tool_call("lookup", "{\"key\": \"k\"}"))];
    let failed = looked_up("Error: 503 Service Unavailable");
    let mut asked_again = looked_up("{\"value\": 42}");
    asked_again.push(json!({"role": "assistant", "content": "k is 42."}));
    asked_again.push(json!({"role": "user", "content": "look it up once more"}));
    for (what, messages) in [
        ("a failed result", failed),
        ("a new user turn", asked_again),
    ] {
        let (url, shared) = start_upstream(repeat()).await;
        let app = gateway(GatewayConfig::for_upstream(url));
        let (_, body, _) = post_chat(
            &app,
            json!({"model": "m", "messages": messages, "tools": tools()}),
        )
        .await;
        assert_eq!(
            body["choices"][0]["message"]["tool_calls"][0]["function"]["name"], "lookup",
            "after {what}: {body}"
        );
        assert!(
            !body["selfheal"]["actions"].to_string().contains("reask"),
            "after {what}: {body}"
        );
        assert_eq!(shared.lock().unwrap().seen.len(), 1, "after {what}");
    }
    let (url, shared) = start_upstream(vec![(200, tool_call("lookup", "{\"key\": \"j\"}"))]).await;
    let app = gateway(GatewayConfig::for_upstream(url));
    let (_, body, _) = post_chat(
        &app,
        json!({"model": "m", "messages": looked_up("{\"value\": 42}"), "tools": tools()}),
    )
    .await;
    assert_eq!(body["selfheal"]["status"], "complete", "{body}");
    assert_eq!(shared.lock().unwrap().seen.len(), 1);
}

/// POSTs `body` to `/v1/responses` with the client key `key`: the answer and its headers.
async fn post_responses_as(
    app: &Router,
    key: &str,
    body: &Value,
) -> (Value, axum::http::HeaderMap) {
    let (status, answer, headers) = post_to_as(app, "/v1/responses", key, body).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    (answer, headers)
}

/// Issue 13: a Responses client that continues an answer with `previous_response_id` sends
/// only the results of its calls. Each such request was a run of its own (named by its first
/// input item, a result), and each result was read as a call of no known tool: no breaker, no
/// budget and no repetition check carried from one turn to the next. The run that sent the
/// answer now continues, for the tenant it belongs to, and the results are read against the
/// answer's calls: a call repeating the one just answered is re-asked as with a full `input`.
#[tokio::test]
async fn issue_13_a_responses_client_continuing_an_answer_continues_its_run() {
    let first = json!({"model": "m", "input": "look k up", "tools": responses_tools()});
    let next = json!({"model": "m", "previous_response_id": "resp_1", "tools": responses_tools(),
        "input": [{"type": "function_call_output", "call_id": "c1", "output": "{\"value\": 42}"}]});
    continued_turns(first, next).await;
}

/// [`issue_13_a_responses_client_continuing_an_answer_continues_its_run`] for a client that
/// keeps its conversation upstream (`conversation`): the conversation names the run, and its
/// results are read against the run's last answer, whose calls they answer.
#[tokio::test]
async fn issue_13_a_responses_conversation_is_one_run() {
    let first = json!({"model": "m", "input": "look k up", "tools": responses_tools(),
                       "conversation": "conv_1"});
    let next = json!({"model": "m", "conversation": {"id": "conv_1"}, "tools": responses_tools(),
        "input": [{"type": "function_call_output", "call_id": "c1", "output": "{\"value\": 42}"}]});
    continued_turns(first, next).await;
}

/// Two turns of a Responses client that sends only what is new (`first`, then `next` with the
/// result of the answer's call): the run goes on, the model's call repeating the answered one
/// is re-asked, and another tenant sending `next` gets a run of its own.
async fn continued_turns(first: Value, next: Value) {
    let call = |id: &str| {
        json!({"id": id, "object": "response", "created_at": 0, "model": "m",
               "status": "completed", "output": [{"type": "function_call", "id": "fc_1",
               "call_id": "c1", "name": "lookup", "arguments": "{\"key\": \"k\"}",
               "status": "completed"}]})
    };
    let (url, shared) = start_responses_upstream(vec![call("resp_1"), call("resp_2")]).await;
    let app = gateway(GatewayConfig::for_upstream(url));
    let (answer, head) = post_responses_as(&app, "sk-tenant-aaaa", &first).await;
    assert_eq!(answer["output"][0]["name"], "lookup", "{answer}");
    let (answer, again) = post_responses_as(&app, "sk-tenant-aaaa", &next).await;
    assert_eq!(
        again["x-selfheal-run"], head["x-selfheal-run"],
        "the run goes on"
    );
    // The model called `lookup` with the same arguments again: its repetition, re-asked.
    assert!(
        answer["selfheal"]["actions"].to_string().contains("reask"),
        "{answer}"
    );
    assert_eq!(answer["output"][0]["type"], "message", "{answer}");
    let seen = shared.lock().unwrap().seen.clone();
    assert_eq!(
        seen.len(),
        3,
        "the answer, the repeated call and the re-ask"
    );
    // The client's request went upstream as it was sent: the calls are the gateway's reading.
    assert_eq!(seen[1]["input"], next["input"]);

    // Another tenant naming the same answer does not join the run.
    let (_, other) = post_responses_as(&app, "sk-tenant-bbbb", &next).await;
    assert_ne!(other["x-selfheal-run"], head["x-selfheal-run"]);
}

/// The stuck agent of issue 30: `web_search` answers `{"error": "search backend down"}` every
/// time and `fetch_url` is on offer. `n` failed searches so far.
fn stuck_agent(n: usize) -> Value {
    let mut m = vec![json!({"role": "user", "content": "What does the page say?"})];
    for i in 0..n {
        m.push(
            json!({"role": "assistant", "content": null, "tool_calls": [{"id": format!("ws{i}"),
            "type": "function", "function": {"name": "web_search",
            "arguments": format!("{{\"query\": \"page {i}\"}}")}}]}),
        );
        m.push(json!({"role": "tool", "tool_call_id": format!("ws{i}"),
                      "content": "{\"error\": \"search backend down\"}"}));
    }
    json!(m)
}

fn search_and_fetch() -> Value {
    json!([
        {"type": "function", "function": {"name": "web_search", "parameters": {
            "type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}}},
        {"type": "function", "function": {"name": "fetch_url", "parameters": {
            "type": "object", "properties": {"url": {"type": "string"}}, "required": ["url"]}}}
    ])
}

/// Issue 30: the seeds' monitor rule where users meet it. The run is not ended at the 4th
/// failure (the ladder's end): it warns at 3 naming `fetch_url`, hides `web_search` at 5 with
/// guidance naming `fetch_url`, and the model is asked every time.
#[tokio::test]
async fn issue_30_a_stuck_tool_is_warned_at_3_hidden_at_5_and_the_run_goes_on() {
    for n in 1..=5 {
        let (url, shared) = start_upstream(vec![]).await;
        let app = gateway(GatewayConfig::for_upstream(url));
        let (status, body, headers) = post_chat(
            &app,
            json!({"model": "m", "messages": stuck_agent(n), "tools": search_and_fetch()}),
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{n}: {body}");
        assert_ne!(headers["x-selfheal-status"], "failed", "{n}: {body}");
        let seen = shared.lock().unwrap().seen.clone();
        assert_eq!(seen.len(), 1, "{n}: the model is asked: {body}");
        let guidance = guidance_seen(&seen[0]);
        let names = offered(&seen[0]);
        if n >= 5 {
            assert_eq!(names, vec!["fetch_url"], "{n}");
            assert!(guidance.contains("disabled"), "{n}: {guidance}");
        } else {
            assert_eq!(names, vec!["web_search", "fetch_url"], "{n}");
        }
        if n >= 3 {
            assert!(guidance.contains("`fetch_url`"), "{n}: {guidance}");
        }
        if n == 3 || n == 4 {
            assert!(guidance.contains("failed"), "{n}: {guidance}");
        }
    }
}

/// With nothing else on offer, the ladder's end stands: the run stops.
#[tokio::test]
async fn issue_30_with_nothing_else_on_offer_a_stuck_tool_still_ends_the_run() {
    let (url, shared) = start_upstream(vec![]).await;
    let app = gateway(GatewayConfig::for_upstream(url));
    let only_search = json!([search_and_fetch()[0].clone()]);
    let (status, body, headers) = post_chat(
        &app,
        json!({"model": "m", "messages": stuck_agent(5), "tools": only_search}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_ne!(headers["x-selfheal-status"], "complete", "{body}");
    assert!(shared.lock().unwrap().seen.is_empty(), "{body}");
}

/// Issue 30: `/v1/responses` requests were missing from `selfheal_requests_total` and the
/// request-duration histogram (1,334 counted of 2,000 in a mixed run).
#[tokio::test]
async fn issue_30_metrics_count_responses_requests_as_chat_ones() {
    let shared: Shared = Arc::new(Mutex::new(Script::default()));
    let upstream = Router::new()
        .route("/v1/responses", post(upstream_responses))
        .route("/v1/chat/completions", post(upstream_chat))
        .with_state(shared.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, upstream).await });
    let app = gateway(GatewayConfig::for_upstream(format!("http://{addr}/v1")));
    for i in 0..2 {
        let body = json!({"model": "m", "input": format!("hello {i}")});
        let req = Request::post("/v1/responses")
            .header("content-type", "application/json")
            .body(Body::from(body.to_string()))
            .unwrap();
        let resp = app.clone().oneshot(req).await.unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
    }
    // One that fails to parse is counted too, as a client error.
    let req = Request::post("/v1/responses")
        .header("content-type", "application/json")
        .body(Body::from("{not json"))
        .unwrap();
    let resp = app.clone().oneshot(req).await.unwrap();
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
    let (status, _, _) = post_chat(
        &app,
        json!({"model": "m", "messages": [{"role": "user", "content": "and chat"}]}),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let text = metrics_text(&app).await;
    let value = |name: &str| -> f64 {
        text.lines()
            .find_map(|l| l.strip_prefix(name).map(str::trim))
            .unwrap_or_else(|| panic!("no `{name}` in\n{text}"))
            .parse()
            .unwrap()
    };
    assert_eq!(value("selfheal_requests_total "), 4.0);
    assert_eq!(value("selfheal_request_duration_seconds_count"), 4.0);
    assert_eq!(value("selfheal_client_errors_total "), 1.0);
}

/// Issue 30: two conversations of one tenant (one application key, many end users) whose
/// system and first user messages are the same shared one run, so one user's failing tool
/// ended the other's healthy conversation ("I have to stop here", upstream never asked). A run
/// is now named by a label or by the conversation's first tool call, never by its opening.
#[tokio::test]
async fn issue_30_conversations_of_one_tenant_with_the_same_opening_never_share_a_run() {
    let (url, shared) = start_upstream(vec![]).await;
    let app = gateway(GatewayConfig::for_upstream(url));
    let opening = [
        json!({"role": "system", "content": "You are a research agent."}),
        json!({"role": "user", "content": "hi"}),
    ];
    let only_search = json!([tools()[0].clone()]);
    // Alice's search keeps failing: with nothing else on offer her run stops.
    let mut failing: Vec<Value> = opening.to_vec();
    for i in 0..5 {
        failing.push(json!({"role": "assistant", "content": null, "tool_calls": [{"id": format!("call_alice_{i}"),
            "type": "function", "function": {"name": "search", "arguments": format!("{{\"query\": \"q{i}\"}}")}}]}));
        failing.push(
            json!({"role": "tool", "tool_call_id": format!("call_alice_{i}"),
            "content": "Error: search backend is down"}),
        );
    }
    let (_, _, alice) = post_as(
        &app,
        "sk-app",
        json!({"model": "m", "messages": failing, "tools": only_search}),
    )
    .await;
    assert_ne!(alice["x-selfheal-status"], "complete");
    assert!(
        shared.lock().unwrap().seen.is_empty(),
        "Alice's run stopped"
    );
    // Bob opens alike, before any call and after a healthy one: his own run each time.
    let (_, body, bob) = post_as(
        &app,
        "sk-app",
        json!({"model": "m", "messages": opening, "tools": only_search}),
    )
    .await;
    assert_eq!(bob["x-selfheal-status"], "complete", "{body}");
    assert_ne!(alice["x-selfheal-run"], bob["x-selfheal-run"]);
    let mut healthy: Vec<Value> = opening.to_vec();
    healthy.push(
        json!({"role": "assistant", "content": null, "tool_calls": [{"id": "call_bob_0",
        "type": "function", "function": {"name": "search", "arguments": "{\"query\": \"b\"}"}}]}),
    );
    healthy.push(json!({"role": "tool", "tool_call_id": "call_bob_0", "content": "ok: 3 results"}));
    let (_, body, bob2) = post_as(
        &app,
        "sk-app",
        json!({"model": "m", "messages": healthy, "tools": only_search}),
    )
    .await;
    assert_eq!(bob2["x-selfheal-status"], "complete", "{body}");
    assert_ne!(alice["x-selfheal-run"], bob2["x-selfheal-run"]);
    let seen = shared.lock().unwrap().seen.clone();
    assert_eq!(seen.len(), 2, "the upstream answered Bob twice");
    assert!(
        !guidance_seen(&seen[1]).contains("[selfheal]"),
        "no guidance from Alice's failures"
    );
}

/// Reads an SSE body into its `data:` payloads (JSON; `[DONE]` left out).
fn sse_events(body: &[u8]) -> Vec<Value> {
    String::from_utf8_lossy(body)
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .map(|d| serde_json::from_str(d).unwrap())
        .collect()
}

/// POSTs `body` to `path`: the status, the headers and the raw body.
async fn post_raw(
    app: &Router,
    path: &str,
    body: &Value,
) -> (StatusCode, axum::http::HeaderMap, Vec<u8>) {
    let req = Request::post(path)
        .header("content-type", "application/json")
        .body(Body::from(body.to_string()))
        .unwrap();
    let resp = app.clone().oneshot(req).await.unwrap();
    let (status, headers) = (resp.status(), resp.headers().clone());
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    (status, headers, bytes.to_vec())
}

/// Issue 30: when a call is left out after a failed re-ask, the answer was an empty assistant
/// message with `finish_reason: "stop"` (`partial` only in the headers and the `selfheal`
/// field), which the `openai` SDK returns as `''`. It now says in words which call and why, on
/// chat streaming or not; `on_partial = "error"` makes it an OpenAI-shaped error instead.
#[tokio::test]
async fn issue_30_an_answer_whose_calls_were_left_out_is_never_empty() {
    for stream in [false, true] {
        for on_partial in [OnPartial::Message, OnPartial::Error] {
            // The model keeps calling a tool that does not exist, whatever it is asked.
            let (url, _) = start_upstream(vec![(200, tool_call("nope", "{}")); 8]).await;
            let mut config = fast(GatewayConfig::for_upstream(url));
            config.server.on_partial = on_partial;
            let app = gateway(config);
            let body = json!({"model": "m", "tools": tools(), "stream": stream,
                              "messages": [{"role": "user", "content": "call it"}]});
            let (status, headers, raw) = post_raw(&app, "/v1/chat/completions", &body).await;
            let at = format!("stream {stream}, {on_partial:?}");
            assert_eq!(headers["x-selfheal-status"], "partial", "{at}");
            match (on_partial, stream) {
                (OnPartial::Message, false) => {
                    assert_eq!(status, StatusCode::OK, "{at}");
                    let v: Value = serde_json::from_slice(&raw).unwrap();
                    let content = v["choices"][0]["message"]["content"].as_str().unwrap();
                    assert!(
                        content.contains("`nope`") && content.contains("left out"),
                        "{at}: {content}"
                    );
                    assert_eq!(v["choices"][0]["finish_reason"], "stop", "{at}");
                }
                (OnPartial::Message, true) => {
                    assert_eq!(status, StatusCode::OK, "{at}");
                    let events = sse_events(&raw);
                    let text: String = events
                        .iter()
                        .filter_map(|e| e["choices"][0]["delta"]["content"].as_str())
                        .collect();
                    assert!(
                        text.contains("`nope`") && text.contains("left out"),
                        "{at}: {events:?}"
                    );
                    let last = events.last().unwrap();
                    assert_eq!(last["choices"][0]["finish_reason"], "stop", "{at}");
                }
                (OnPartial::Error, false) => {
                    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{at}");
                    let v: Value = serde_json::from_slice(&raw).unwrap();
                    assert_eq!(v["error"]["code"], "calls_left_out", "{at}");
                    assert!(
                        v["error"]["message"].as_str().unwrap().contains("`nope`"),
                        "{at}"
                    );
                }
                (OnPartial::Error, true) => {
                    let events = sse_events(&raw);
                    let last = events.last().unwrap();
                    assert_eq!(last["error"]["code"], "calls_left_out", "{at}: {events:?}");
                    assert!(
                        !events
                            .iter()
                            .any(|e| e["choices"][0]["finish_reason"] == "stop"),
                        "{at}: no answer after all"
                    );
                }
            }
        }
    }
}

async fn upstream_responses_script(State(s): State<Shared>, body: axum::Json<Value>) -> Response {
    let mut s = s.lock().unwrap();
    s.seen.push(body.0);
    let call = |name: &str| {
        json!({"id": "resp_c", "object": "response", "created_at": 0, "model": "m",
               "status": "completed", "output": [{"type": "function_call", "id": "fc_1",
               "call_id": "call_1", "name": name, "arguments": "{}", "status": "completed"}]})
    };
    let next = if s.steps.is_empty() {
        call("nope")
    } else {
        s.steps.remove(0).1
    };
    axum::Json(next).into_response()
}

/// Issue 30, on `/v1/responses`: the same, an answer in words or an error, never empty.
#[tokio::test]
async fn issue_30_a_responses_answer_whose_calls_were_left_out_is_never_empty() {
    for on_partial in [OnPartial::Message, OnPartial::Error] {
        let (url, _) = serve_script(vec![], |r| {
            r.route("/v1/responses", post(upstream_responses_script))
        })
        .await;
        let mut config = fast(GatewayConfig::for_upstream(url));
        config.server.on_partial = on_partial;
        let app = gateway(config);
        let tools = json!([{"type": "function", "name": "search", "parameters": {"type": "object",
            "properties": {"query": {"type": "string"}}, "required": ["query"]}}]);
        let body = json!({"model": "m", "input": "call it", "tools": tools});
        let (status, headers, raw) = post_raw(&app, "/v1/responses", &body).await;
        assert_eq!(headers["x-selfheal-status"], "partial", "{on_partial:?}");
        let v: Value = serde_json::from_slice(&raw).unwrap();
        match on_partial {
            OnPartial::Message => {
                assert_eq!(status, StatusCode::OK);
                let text: String = v["output"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .filter(|i| i["type"] == "message")
                    .flat_map(|m| m["content"].as_array().unwrap().clone())
                    .filter_map(|p| p["text"].as_str().map(str::to_owned))
                    .collect();
                assert!(text.contains("`nope`") && text.contains("left out"), "{v}");
                assert!(!v["output"].to_string().contains("function_call\""), "{v}");
            }
            OnPartial::Error => {
                assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{v}");
                assert_eq!(v["error"]["code"], "calls_left_out", "{v}");
            }
        }
    }
}

/// Issue 30: with `on_partial = "error"`, a stopped run is an error the SDKs raise, not an
/// answer.
#[tokio::test]
async fn issue_30_a_stopped_run_is_an_error_when_so_configured() {
    let (url, shared) = start_upstream(vec![]).await;
    let mut config = GatewayConfig::for_upstream(url);
    config.server.on_partial = OnPartial::Error;
    let app = gateway(config);
    let only_search = json!([search_and_fetch()[0].clone()]);
    let body = json!({"model": "m", "messages": stuck_agent(5), "tools": only_search});
    let (status, headers, raw) = post_raw(&app, "/v1/chat/completions", &body).await;
    let v: Value = serde_json::from_slice(&raw).unwrap();
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{v}");
    assert_eq!(v["error"]["code"], "run_stopped", "{v}");
    assert_ne!(headers["x-selfheal-status"], "complete");
    assert!(shared.lock().unwrap().seen.is_empty());
}

/// Issue 30: a Responses re-ask never escalated to the fallback model (chat's does): a primary
/// that keeps calling a tool that does not exist is now left, as on chat, for the chain's next
/// model, whose usable answer goes out.
#[tokio::test]
async fn issue_30_a_responses_reask_escalates_to_the_fallback_model() {
    let good = json!({"id": "resp_good", "object": "response", "created_at": 0, "model": "m2",
        "status": "completed", "output": [{"type": "function_call", "id": "fc_2",
        "call_id": "call_2", "name": "search", "arguments": "{\"query\": \"q\"}",
        "status": "completed"}]});
    let route = |r: Router<Shared>| r.route("/v1/responses", post(upstream_responses_script));
    let (primary, primary_seen) = serve_script(vec![], route).await;
    let (fallback, fallback_seen) = serve_script(vec![(200, good); 4], route).await;
    let config = chain(
        fast(GatewayConfig::for_upstream(primary.clone())),
        &[
            ("primary", primary.as_str()),
            ("fallback", fallback.as_str()),
        ],
        "agent",
        &[("primary", "m1"), ("fallback", "m2")],
    );
    let app = gateway(config);
    let tools = json!([{"type": "function", "name": "search", "parameters": {"type": "object",
        "properties": {"query": {"type": "string"}}, "required": ["query"]}}]);
    let body = json!({"model": "agent", "input": "find q", "tools": tools});
    let (status, headers, raw) = post_raw(&app, "/v1/responses", &body).await;
    let v: Value = serde_json::from_slice(&raw).unwrap();
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["output"][0]["name"], "search", "{v}");
    assert_eq!(v["selfheal"]["status"], "complete", "{v}");
    assert!(
        headers["x-selfheal-actions"]
            .to_str()
            .unwrap()
            .contains("escalate"),
        "{headers:?}"
    );
    assert!(!primary_seen.lock().unwrap().seen.is_empty());
    assert!(
        !fallback_seen.lock().unwrap().seen.is_empty(),
        "the fallback model was asked"
    );
}

/// Issue 31: a small local model writes its call as a fenced JSON block in `content` and no
/// `tool_calls` (Qwen2.5-Coder behind llama-server does so for every call). The gateway hands
/// the client a structured call of the offered tool, with an id and `finish_reason:
/// "tool_calls"`, and says it salvaged it; with `tool_choice: "none"` the text stays text.
#[tokio::test]
async fn issue_31_a_tool_call_written_as_text_becomes_a_tool_call() {
    let fenced =
        "```json\n{\"name\": \"search\", \"arguments\": {\"query\": \"rust\", \"limit\": 3}}\n```";
    let (url, _) = start_upstream(vec![(200, text(fenced)), (200, text(fenced))]).await;
    let app = gateway(GatewayConfig::for_upstream(url));
    let (status, body, _) = post_chat(
        &app,
        json!({"model": "m", "messages": [{"role": "user", "content": "find rust"}], "tools": tools()}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let choice = &body["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls", "{body}");
    let call = &choice["message"]["tool_calls"][0];
    assert_eq!(call["function"]["name"], "search");
    assert!(call["id"].as_str().is_some_and(|id| !id.is_empty()));
    assert_eq!(
        serde_json::from_str::<Value>(call["function"]["arguments"].as_str().unwrap()).unwrap(),
        json!({"query": "rust", "limit": 3})
    );
    assert!(choice["message"]["content"].is_null(), "{body}");
    assert!(
        body["selfheal"]["actions"].to_string().contains("salvage"),
        "{body}"
    );
    assert_eq!(body["selfheal"]["status"], "complete");
    // The client asked for no tool call: the text is the answer.
    let (_, body, _) = post_chat(
        &app,
        json!({"model": "m", "messages": [{"role": "user", "content": "show me"}],
               "tools": tools(), "tool_choice": "none"}),
    )
    .await;
    assert_eq!(body["choices"][0]["message"]["content"], fenced, "{body}");
    assert!(
        body["choices"][0]["message"]["tool_calls"].is_null(),
        "{body}"
    );
}

/// Issue 31 on `/v1/responses`, through the one whole-answer path: a message whose text writes
/// a call of an offered tool (prose, then a fenced JSON block) becomes a `function_call` item
/// with a fresh call id, the prose stays as the message, and `salvage` is recorded in the
/// report and the headers; with `tool_choice: "none"` the text stays text; a call of a tool not
/// on offer is never taken: the model is asked again.
#[tokio::test]
async fn issue_31_a_responses_text_call_becomes_a_function_call_item() {
    let said =
        "Let me look.\n```json\n{\"name\": \"search\", \"arguments\": {\"query\": \"rust\"}}\n```";
    let message = |text: &str| {
        responses_answer(
            json!([{"type": "message", "id": "msg_1", "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": text, "annotations": []}]}]),
        )
    };
    let unknown = "{\"name\": \"send_email\", \"arguments\": {\"to\": \"bob\"}}";
    let (url, shared) = start_responses_upstream(vec![
        message(said),
        message(said),
        message(unknown),
        responses_call("lookup", "{\"key\": \"k\"}"),
    ])
    .await;
    let app = gateway(GatewayConfig::for_upstream(url));
    let body = json!({"model": "m", "input": "find rust", "tools": responses_tools()});
    let (status, headers, raw) = post_raw(&app, "/v1/responses", &body).await;
    let v: Value = serde_json::from_slice(&raw).unwrap();
    assert_eq!(status, StatusCode::OK, "{v}");
    let output = v["output"].as_array().unwrap();
    assert_eq!(output.len(), 2, "{v}");
    assert_eq!(output[0]["type"], "message");
    assert_eq!(output[0]["content"][0]["text"], "Let me look.", "{v}");
    let call = &output[1];
    assert_eq!(call["type"], "function_call", "{v}");
    assert_eq!(call["name"], "search");
    assert!(call["call_id"].as_str().is_some_and(|id| !id.is_empty()));
    let args: Value = serde_json::from_str(call["arguments"].as_str().unwrap()).unwrap();
    assert_eq!(args, json!({"query": "rust"}));
    assert!(
        v["selfheal"]["actions"].to_string().contains("salvage"),
        "{v}"
    );
    let actions = headers["x-selfheal-actions"].to_str().unwrap();
    assert!(actions.contains("salvage"), "{actions}");
    assert_eq!(v["selfheal"]["status"], "complete", "{v}");
    // The client asked for no tool call: the text is the answer.
    let none = json!({"model": "m", "input": "show me", "tools": responses_tools(),
        "tool_choice": "none"});
    let (_, v) = post_json(&app, "/v1/responses", &none).await;
    assert_eq!(v["output"][0]["content"][0]["text"], said, "{v}");
    assert!(!v["output"].to_string().contains("function_call"), "{v}");
    // A tool not on offer: asked again, the structured call goes out.
    let (_, v) = post_json(&app, "/v1/responses", &body).await;
    assert_eq!(v["output"][0]["name"], "lookup", "{v}");
    assert!(
        v["selfheal"]["actions"].to_string().contains("reask"),
        "{v}"
    );
    assert_eq!(shared.lock().unwrap().seen.len(), 4);
}

/// Issue 31: a call written as text that cannot be taken without a guess (a tool not on offer)
/// is never the final answer: the model is asked again, and its structured call goes out.
#[tokio::test]
async fn issue_31_a_text_call_that_cannot_be_taken_is_asked_again() {
    let (url, shared) = start_upstream(vec![
        (
            200,
            text("{\"name\": \"send_email\", \"arguments\": {\"to\": \"bob@example.com\"}}"),
        ),
        (200, tool_call("lookup", "{\"key\": \"k\"}")),
    ])
    .await;
    let app = gateway(GatewayConfig::for_upstream(url));
    let (_, body, _) = post_chat(
        &app,
        json!({"model": "m", "messages": [{"role": "user", "content": "mail bob"}], "tools": tools()}),
    )
    .await;
    assert_eq!(
        body["choices"][0]["message"]["tool_calls"][0]["function"]["name"], "lookup",
        "{body}"
    );
    let seen = shared.lock().unwrap().seen.clone();
    assert_eq!(seen.len(), 2);
    assert!(
        seen[1]["messages"].to_string().contains("send_email"),
        "the re-ask says why: {}",
        seen[1]["messages"]
    );
}

/// Posts `body` to `path`; the status, the `x-selfheal-*` status and actions headers, and the
/// body.
async fn post_with_headers(
    app: &Router,
    path: &str,
    body: &Value,
) -> (StatusCode, String, String, Value) {
    let req = Request::post(path)
        .header("content-type", "application/json")
        .body(Body::from(body.to_string()))
        .unwrap();
    let resp = app.clone().oneshot(req).await.unwrap();
    let status = resp.status();
    let header = |name: &str| {
        resp.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned()
    };
    let (run_status, actions) = (header("x-selfheal-status"), header("x-selfheal-actions"));
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    (
        status,
        run_status,
        actions,
        serde_json::from_slice(&bytes).unwrap(),
    )
}

/// Issue 30: a run the core stops is answered alike on chat completions and on
/// `/v1/responses` — the same status, the same action, the same words — where the Responses
/// path used to answer `failed` with an `abort` action and words of its own.
#[tokio::test]
async fn issue_30_a_stopped_run_answers_alike_on_chat_and_responses() {
    let (url, shared) = start_upstream(vec![]).await;
    let config = GatewayConfig::for_upstream(url);
    // Several different tools, each failing below its breaker threshold: the failure rate
    // stops the run, on either API.
    let mut messages = vec![json!({"role": "user", "content": "find it"})];
    let mut items = vec![json!({"role": "user", "content": "find it"})];
    for i in 0..8 {
        let (tool, id, args) = (
            format!("t{}", i % 4),
            format!("f{i}"),
            format!("{{\"x\": {i}}}"),
        );
        messages.push(json!({"role": "assistant", "content": null, "tool_calls": [
            {"id": id, "type": "function", "function": {"name": tool, "arguments": args}}]}));
        messages.push(json!({"role": "tool", "tool_call_id": id, "content": "Error: failed"}));
        items
            .push(json!({"type": "function_call", "call_id": id, "name": tool, "arguments": args}));
        items.push(
            json!({"type": "function_call_output", "call_id": id, "output": "Error: failed"}),
        );
    }
    let chat = post_with_headers(
        &gateway(config.clone()),
        "/v1/chat/completions",
        &json!({"model": "m", "messages": messages, "tools": tools()}),
    )
    .await;
    let responses = post_with_headers(
        &gateway(config),
        "/v1/responses",
        &json!({"model": "m", "input": items, "tools": [
            {"type": "function", "name": "search", "parameters": {"type": "object"}}]}),
    )
    .await;
    assert!(
        shared.lock().unwrap().seen.is_empty(),
        "a stopped run is not sent upstream"
    );
    let (chat_http, chat_status, chat_actions, chat_body) = chat;
    let (resp_http, resp_status, resp_actions, resp_body) = responses;
    assert_eq!((chat_http, resp_http), (StatusCode::OK, StatusCode::OK));
    assert_eq!(chat_status, "failed", "{chat_body}");
    assert_eq!(resp_status, chat_status, "{resp_body}");
    assert_eq!(chat_actions, "terminate", "{chat_body}");
    assert_eq!(resp_actions, chat_actions, "{resp_body}");
    assert_eq!(
        resp_body["selfheal"]["status"],
        chat_body["selfheal"]["status"]
    );
    assert_eq!(
        resp_body["selfheal"]["actions"],
        chat_body["selfheal"]["actions"]
    );
    let chat_words = chat_body["choices"][0]["message"]["content"]
        .as_str()
        .unwrap();
    let resp_words = resp_body["output"][0]["content"][0]["text"]
        .as_str()
        .unwrap();
    assert!(
        chat_words.starts_with("I have to stop here: "),
        "{chat_words}"
    );
    assert_eq!(resp_words, chat_words);
}
