//! The state store as `/readyz` and `/metrics` report it (the in-memory default here; Redis,
//! up and down, in tests/e2e/test_replicas.py).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::routing::get;
use http_body_util::BodyExt;
use serde_json::Value;
use tower::ServiceExt;

use selfheal_gateway::{AppState, GatewayConfig, TraceWriter, router};

async fn get_text(app: &axum::Router, path: &str) -> (StatusCode, String) {
    let resp = app
        .clone()
        .oneshot(Request::get(path).body(Body::empty()).unwrap())
        .await
        .unwrap();
    let status = resp.status();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8(bytes.to_vec()).unwrap())
}

#[tokio::test]
async fn the_in_memory_store_is_reported_up_by_readyz_and_metrics() {
    // An upstream that answers `GET /models`, so the gateway is ready.
    let upstream = axum::Router::new().route("/v1/models", get(|| async { "{}" }));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, upstream).await });
    let config = GatewayConfig::for_upstream(format!("http://{addr}/v1"));
    let app = router(Arc::new(
        AppState::new(config, TraceWriter::disabled()).unwrap(),
    ));
    let (status, body) = get_text(&app, "/readyz").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let ready: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        ready["state_store"],
        serde_json::json!({"backend": "memory", "up": true})
    );
    let (_, metrics) = get_text(&app, "/metrics").await;
    for line in [
        "selfheal_state_store_up 1\n",
        "selfheal_state_store_errors_total 0\n",
        "selfheal_state_store_outages_total 0\n",
        "selfheal_state_shared_records 0\n",
        "selfheal_upstream_shared_skips_total 0\n",
    ] {
        assert!(metrics.contains(line), "no {line:?} in\n{metrics}");
    }
}

#[tokio::test]
async fn a_redis_store_that_is_down_at_startup_does_not_stop_the_gateway() {
    // Nothing listens on port 1: the store is an outage from the start, not a startup failure.
    let mut config = GatewayConfig::for_upstream("http://127.0.0.1:1/v1");
    config.state.url = Some("redis://127.0.0.1:1".into());
    config.state.refresh_ms = 20;
    let app = router(Arc::new(
        AppState::new(config, TraceWriter::disabled()).unwrap(),
    ));
    let mut down = false;
    for _ in 0..250 {
        let (_, metrics) = get_text(&app, "/metrics").await;
        if metrics.contains("selfheal_state_store_up 0\n")
            && metrics.contains("selfheal_state_store_outages_total 1\n")
        {
            down = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert!(down, "the unreachable store shows as down, one outage");
}
