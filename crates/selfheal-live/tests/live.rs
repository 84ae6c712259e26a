//! The live benchmark's harness against a scripted OpenAI-compatible model on 127.0.0.1:0: the
//! strategies chosen run in order, answers are scored against the oracle, and `retry-only`
//! retries a failing model call R times where `static` gives up at once.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::{Arc, Mutex};

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde_json::{Value, json};

use selfheal_live::{LiveConfig, LiveStrategy, run};

#[derive(Clone)]
enum Model {
    /// Answers every request with this text.
    Answer(String),
    /// Answers every request with HTTP 503.
    Down,
}

struct Server {
    model: Model,
    requests: usize,
}

type Shared = Arc<Mutex<Server>>;

async fn handler(State(s): State<Shared>) -> Response {
    let model = {
        let mut s = s.lock().unwrap();
        s.requests += 1;
        s.model.clone()
    };
    match model {
        Model::Answer(text) => axum::Json(json!({"choices": [{"index": 0,
            "finish_reason": "stop", "message": {"role": "assistant", "content": text}}],
            "usage": {"total_tokens": 7}}))
        .into_response(),
        Model::Down => (
            StatusCode::SERVICE_UNAVAILABLE,
            axum::Json(json!({"error": {"message": "overloaded"}})),
        )
            .into_response(),
    }
}

/// Serves `app` on 127.0.0.1:0 and returns its base URL (up to `/v1`).
async fn serve(app: Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    format!("http://{addr}/v1")
}

async fn server(model: Model) -> (String, Shared) {
    let shared = Arc::new(Mutex::new(Server { model, requests: 0 }));
    let app = Router::new()
        .route("/v1/chat/completions", post(handler))
        .with_state(shared.clone());
    (serve(app).await, shared)
}

fn config(url: String) -> LiveConfig {
    let mut cfg = LiveConfig::new(url, "scripted");
    cfg.tasks = 1;
    cfg.fault_rate = 0.0;
    cfg.budget = 2;
    cfg.timeout_ms = 5_000;
    cfg.strategies = LiveStrategy::ALL.to_vec();
    cfg
}

#[tokio::test]
async fn every_chosen_strategy_scores_a_correct_answer() {
    let oracle = selfheal_bench::tasks()[0].oracle.clone();
    let text = match &oracle {
        Value::String(s) => format!("The answer is {s}."),
        v => format!("The answer is {v}."),
    };
    let (url, shared) = server(Model::Answer(text)).await;
    let mut lines = Vec::new();
    let report = run(&config(url), &mut |l| lines.push(l.to_owned()))
        .await
        .unwrap();
    let names: Vec<&str> = report.results.iter().map(|r| r.row.strategy).collect();
    assert_eq!(names, ["static", "retry-only", "self-healing"]);
    for r in &report.results {
        assert_eq!(r.row.tsr, 1.0, "{} should be correct", r.row.strategy);
        assert_eq!(r.row.sfr, 0.0);
        assert_eq!(r.live.outcomes.get("correct"), Some(&1));
    }
    assert_eq!(report.episodes.len(), 3);
    assert_eq!(lines.len(), 3, "one progress line per episode");
    assert_eq!(shared.lock().unwrap().requests, 3, "one model call each");
}

#[tokio::test]
async fn retry_only_retries_a_failing_model_r_times_and_static_does_not() {
    let (url, shared) = server(Model::Down).await;
    let mut cfg = config(url);
    cfg.strategies = vec![LiveStrategy::Static, LiveStrategy::RetryOnly];
    let report = run(&cfg, &mut |_| {}).await.unwrap();
    let by_name = |n: &str| {
        report
            .episodes
            .iter()
            .find(|e| e.strategy == n)
            .unwrap()
            .clone()
    };
    let st = by_name("static");
    let retry = by_name("retry-only");
    assert_eq!(st.model_calls, 1);
    assert_eq!(st.outcome, "model_error");
    assert_eq!(retry.model_calls, 3, "one call and R = 2 retries");
    assert_eq!(retry.recoveries.len(), 2, "{:?}", retry.recoveries);
    assert_eq!(retry.outcome, "model_error");
    assert!(retry.reason.as_deref().unwrap_or("").contains("503"));
    assert_eq!(shared.lock().unwrap().requests, 4);
    for r in &report.results {
        assert_eq!(r.row.tsr, 0.0);
    }
}

#[test]
fn live_strategies_have_names() {
    for s in LiveStrategy::ALL {
        assert_eq!(LiveStrategy::parse(s.name()), Some(s));
    }
    assert_eq!(LiveStrategy::parse("react"), None);
}

#[tokio::test]
async fn retry_only_stays_within_the_model_call_limit() {
    let (url, shared) = server(Model::Down).await;
    let mut cfg = config(url);
    cfg.strategies = vec![LiveStrategy::RetryOnly];
    cfg.budget = 5;
    cfg.max_model_calls = 3;
    let report = run(&cfg, &mut |_| {}).await.unwrap();
    let e = &report.episodes[0];
    assert_eq!(e.model_calls, 3, "R = 5 retries, but only 3 calls allowed");
    assert_eq!(shared.lock().unwrap().requests, 3);
    assert_eq!(e.outcome, "model_error");
}

/// Issue 12: `bench --live --out` wrote only JSON; it now writes the simulated benchmark's
/// Markdown report and chart, built from the live rows.
#[tokio::test]
async fn issue12_the_live_report_has_the_results_table_and_the_chart() {
    let oracle = selfheal_bench::tasks()[0].oracle.clone();
    let (url, _) = server(Model::Answer(format!("The answer is {oracle}."))).await;
    let report = run(&config(url), &mut |_| {}).await.unwrap();
    let md = selfheal_live::markdown(&report, &["tsr-by-budget.svg"]);
    for strategy in ["static", "retry-only", "self-healing"] {
        let row = md
            .lines()
            .find(|l| l.starts_with(&format!("| {strategy} | 2 | 1 |")))
            .unwrap_or_else(|| panic!("no row for {strategy} in\n{md}"));
        assert!(row.contains("| 100.0 % |"), "{row}");
    }
    assert!(
        md.contains("![tsr-by-budget.svg](tsr-by-budget.svg)"),
        "{md}"
    );
    let svg = selfheal_live::svg_tsr(&report);
    assert!(svg.starts_with("<svg"), "{svg}");
    // TSR, RSR and SFR for each of the three strategies; RSR has no faulted episode here.
    assert_eq!(svg.matches("class=\"bar\"").count(), 9, "{svg}");
    assert!(svg.contains("self-healing: 100.0 % (n = 1)"), "{svg}");
}
