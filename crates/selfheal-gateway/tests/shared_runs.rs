//! Runs shared by replicas through one state store (the in-memory store stands in for Redis
//! here; the real Redis, HAProxy and three processes are in tests/e2e/test_replicas.py).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::{Request, StatusCode};
use axum::response::IntoResponse;
use axum::routing::post;
use http_body_util::BodyExt;
use serde_json::{Value, json};
use tower::ServiceExt;

use selfheal_gateway::{AppState, GatewayConfig, TraceWriter, router};
use selfheal_state::{MemoryStore, Shared, StateStore};

type Seen = Arc<Mutex<Vec<Value>>>;

/// An upstream that answers every chat request with text, and records what it was sent.
async fn upstream() -> (String, Seen) {
    async fn chat(State(seen): State<Seen>, body: axum::Json<Value>) -> impl IntoResponse {
        seen.lock().unwrap().push(body.0);
        axum::Json(
            json!({"id": "x", "object": "chat.completion", "created": 0, "model": "m",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "fine"},
                         "finish_reason": "stop"}]}),
        )
    }
    let seen: Seen = Arc::default();
    let app = Router::new()
        .route("/v1/chat/completions", post(chat))
        .with_state(seen.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (format!("http://{addr}/v1"), seen)
}

/// A replica: the gateway with the deployment's run secret, sharing through `store` (none: a
/// process on its own).
fn replica(url: &str, store: Option<Arc<dyn StateStore>>) -> Router {
    let mut config = GatewayConfig::for_upstream(url);
    config.run_secret_env = Some("RUN_SECRET".into());
    config.budget = selfheal_core::BudgetLimits::unlimited();
    let env = |v: &str| (v == "RUN_SECRET").then(|| "one deployment".to_owned());
    let mut state = AppState::with_env(config, TraceWriter::disabled(), env).unwrap();
    if let Some(store) = store {
        state.shared = Shared::with_store(store, Duration::from_millis(50)).unwrap();
    }
    router(Arc::new(state))
}

/// The `i`th request of an agent that keeps only its newest tool result in the history (as
/// agents with a context budget do) and names its run with a label: one failing search.
fn trimmed_request(i: usize) -> Request<Body> {
    let body = json!({"model": "m", "tools": [
        {"type": "function", "function": {"name": "web_search", "parameters": {"type": "object",
            "properties": {"query": {"type": "string"}}, "required": ["query"]}}},
        {"type": "function", "function": {"name": "fetch_url", "parameters": {"type": "object",
            "properties": {"url": {"type": "string"}}, "required": ["url"]}}}],
        "messages": [
            {"role": "user", "content": "What does the page say?"},
            {"role": "assistant", "content": null, "tool_calls": [{"id": format!("ws{i}"),
                "type": "function", "function": {"name": "web_search",
                "arguments": format!("{{\"query\": \"page {i}\"}}")}}]},
            {"role": "tool", "tool_call_id": format!("ws{i}"),
             "content": "{\"error\": \"search backend down\"}"}]});
    Request::post("/v1/chat/completions")
        .header("content-type", "application/json")
        .header("x-selfheal-run", "conversation-1")
        .body(Body::from(body.to_string()))
        .unwrap()
}

fn offered(seen: &Value) -> Vec<String> {
    let tools = seen["tools"].as_array().unwrap();
    tools
        .iter()
        .map(|t| t["function"]["name"].as_str().unwrap().to_owned())
        .collect()
}

fn system_text(seen: &Value) -> String {
    let messages = seen["messages"].as_array().unwrap();
    messages
        .iter()
        .filter(|m| m["role"] == "system")
        .filter_map(|m| m["content"].as_str())
        .collect::<Vec<_>>()
        .join("\n")
}

/// Five requests of one conversation alternating two replicas: what the upstream was sent for
/// each, and the `selfheal` report's `requests` of the last answer.
async fn alternate(a: &Router, b: &Router, seen: &Seen) -> (Vec<Value>, Value) {
    let mut last = Value::Null;
    for i in 0..5 {
        let replica = if i % 2 == 0 { a } else { b };
        let resp = replica.clone().oneshot(trimmed_request(i)).await.unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        let bytes = resp.into_body().collect().await.unwrap().to_bytes();
        last = serde_json::from_slice(&bytes).unwrap();
    }
    let sent = seen.lock().unwrap().clone();
    assert_eq!(sent.len(), 5, "the model is asked every time");
    (sent, last)
}

/// A conversation whose requests alternate two replicas sharing a store is one run: its
/// failing tool is warned at the 3rd failure and hidden at the 5th counting both replicas'
/// observations, though each request carries only its newest result. Apart, each replica
/// counts only its own (3 of 5 at most) and never hides the tool.
#[tokio::test]
async fn a_conversation_alternating_replicas_is_one_run() {
    let (url, seen) = upstream().await;
    let store: Arc<dyn StateStore> = Arc::new(MemoryStore::default());
    let (a, b) = (
        replica(&url, Some(store.clone())),
        replica(&url, Some(store.clone())),
    );
    let (sent, _) = alternate(&a, &b, &seen).await;
    assert_eq!(offered(&sent[1]), vec!["web_search", "fetch_url"]);
    let third = system_text(&sent[2]);
    assert!(
        third.contains("failed") && third.contains("`fetch_url`"),
        "warned at 3: {third}"
    );
    assert_eq!(offered(&sent[3]), vec!["web_search", "fetch_url"]);
    assert_eq!(offered(&sent[4]), vec!["fetch_url"], "hidden at 5");

    // The control: the same replicas without a shared store never get there.
    let (url, seen) = upstream().await;
    let (a, b) = (replica(&url, None), replica(&url, None));
    let (sent, _) = alternate(&a, &b, &seen).await;
    assert_eq!(offered(&sent[4]), vec!["web_search", "fetch_url"]);
}

/// The run's state survives the replica that served it: the other continues it as it was
/// (its request count, its failures), read from the store.
#[tokio::test]
async fn a_run_continues_on_another_replica_with_its_state() {
    let (url, seen) = upstream().await;
    let store: Arc<dyn StateStore> = Arc::new(MemoryStore::default());
    let a = replica(&url, Some(store.clone()));
    for i in 0..3 {
        let resp = a.clone().oneshot(trimmed_request(i)).await.unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
    }
    drop(a);
    let b = replica(&url, Some(store.clone()));
    let resp = b.clone().oneshot(trimmed_request(3)).await.unwrap();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    let answer: Value = serde_json::from_slice(&bytes).unwrap();
    let report = &answer["selfheal"];
    assert_eq!(report["failures"], json!(4), "{report}");
    let sent = seen.lock().unwrap().clone();
    let fourth = system_text(&sent[3]);
    assert!(fourth.contains("`fetch_url`"), "{fourth}");
}

/// An upstream that answers every chat request with one call of `web_search` (`call_A`).
async fn calling_upstream() -> String {
    async fn chat() -> impl IntoResponse {
        axum::Json(
            json!({"id": "x", "object": "chat.completion", "created": 0, "model": "m",
            "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
                "role": "assistant", "content": null, "tool_calls": [{"id": "call_A",
                "type": "function", "function": {"name": "web_search",
                "arguments": "{\"query\": \"page\"}"}}]}}]}),
        )
    }
    let app = Router::new().route("/v1/chat/completions", post(chat));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    format!("http://{addr}/v1")
}

/// A request of the conversation that opens "What does the page say?": its first turn, or
/// the turn after `call_A` failed; with `label` as `x-selfheal-run`.
fn page_request(answered: bool, label: Option<&str>) -> Request<Body> {
    page_request_as(answered, label, false)
}

/// [`page_request`], streamed or not.
fn page_request_as(answered: bool, label: Option<&str>, stream: bool) -> Request<Body> {
    let mut messages = vec![json!({"role": "user", "content": "What does the page say?"})];
    if answered {
        messages.push(json!({"role": "assistant", "content": null, "tool_calls": [
            {"id": "call_A", "type": "function", "function": {"name": "web_search",
             "arguments": "{\"query\": \"page\"}"}}]}));
        messages.push(json!({"role": "tool", "tool_call_id": "call_A",
                             "content": "{\"error\": \"search backend down\"}"}));
    }
    let body = json!({"model": "m", "messages": messages, "stream": stream, "tools": [
        {"type": "function", "function": {"name": "web_search", "parameters": {"type": "object",
            "properties": {"query": {"type": "string"}}, "required": ["query"]}}}]});
    let mut req = Request::post("/v1/chat/completions").header("content-type", "application/json");
    if let Some(l) = label {
        req = req.header("x-selfheal-run", l);
    }
    req.body(Body::from(body.to_string())).unwrap()
}

/// The run id of an unnamed conversation's first answer is the one its run is stored under:
/// sent back to another replica, it names that run there, and the conversation's next turn
/// without the id is the same run. It was a throwaway id: the other
/// replica knew no run by it and began a new one, keyed by it as a label.
#[tokio::test]
async fn the_first_answers_run_id_names_the_stored_run() {
    let url = calling_upstream().await;
    let store: Arc<dyn StateStore> = Arc::new(MemoryStore::default());
    let (a, b) = (
        replica(&url, Some(store.clone())),
        replica(&url, Some(store.clone())),
    );
    let first = a.clone().oneshot(page_request(false, None)).await.unwrap();
    assert_eq!(first.status(), StatusCode::OK);
    let id = first.headers()["x-selfheal-run"]
        .to_str()
        .unwrap()
        .to_owned();
    let on_b = b
        .clone()
        .oneshot(page_request(true, Some(&id)))
        .await
        .unwrap();
    assert_eq!(on_b.headers()["x-selfheal-run"], id.as_str());
    let unlabelled = a.clone().oneshot(page_request(true, None)).await.unwrap();
    assert_eq!(unlabelled.headers()["x-selfheal-run"], id.as_str());
}

/// The run id a request was answered with, once its body has been read to the end (a stream's
/// run is stored when its relay ends).
async fn answered_id(router: &Router, req: Request<Body>) -> String {
    let resp = router.clone().oneshot(req).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let id = resp.headers()["x-selfheal-run"]
        .to_str()
        .unwrap()
        .to_owned();
    let _ = resp.into_body().collect().await.unwrap();
    id
}

/// A streamed first answer sends its run id before it knows of any call (the head goes out
/// with the first frame): that id is the one the run is stored under, as for a whole answer.
/// The conversation's next request, which carries the call and not the id, is answered with
/// it on the replica that streamed and on another one (through the link in the store). It
/// was not: the stream showed one id, the next request the call's name.
#[tokio::test]
async fn a_streamed_first_answers_run_id_names_the_stored_run() {
    let url = calling_upstream().await;
    let store: Arc<dyn StateStore> = Arc::new(MemoryStore::default());
    let (a, b) = (
        replica(&url, Some(store.clone())),
        replica(&url, Some(store.clone())),
    );
    let id = answered_id(&a, page_request_as(false, None, true)).await;
    assert_eq!(
        answered_id(&b, page_request(true, None)).await,
        id,
        "on another replica"
    );
    assert_eq!(
        answered_id(&a, page_request(true, None)).await,
        id,
        "on the same replica"
    );
    // Sent back, the id names the run too.
    let again = page_request(true, Some(&id));
    assert_eq!(answered_id(&b, again).await, id);
}

/// The trace of an unnamed conversation's first request is under the id its run is stored
/// under: `selfheal trace show` of the run lists both of its requests, the streamed first one
/// included (it was under a throwaway id, and the run's trace began at its second request).
#[tokio::test]
async fn the_trace_of_a_streamed_first_request_is_under_its_run() {
    let url = calling_upstream().await;
    let path = std::env::temp_dir().join(format!(
        "selfheal-first-trace-{}-{:?}.db",
        std::process::id(),
        std::time::SystemTime::now()
    ));
    let mut config = GatewayConfig::for_upstream(&url);
    config.budget = selfheal_core::BudgetLimits::unlimited();
    let state = Arc::new(AppState::new(config, TraceWriter::open(&path).unwrap()).unwrap());
    let app = router(state.clone());
    let id = answered_id(&app, page_request_as(false, None, true)).await;
    assert_eq!(answered_id(&app, page_request(true, None)).await, id);
    state.trace.flush_and_close();
    let events = selfheal_gateway::TraceReader::open(&path)
        .unwrap()
        .events(&id)
        .unwrap();
    for end in ["", "-wal", "-shm"] {
        let mut file = path.clone().into_os_string();
        file.push(end);
        let _ = std::fs::remove_file(file);
    }
    let requests: Vec<bool> = events
        .iter()
        .filter(|e| e.kind == "request")
        .map(|e| e.detail["stream"] == json!(true))
        .collect();
    assert_eq!(requests, vec![true, false], "{events:?}");
}
