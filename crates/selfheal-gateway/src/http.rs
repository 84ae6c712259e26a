//! The HTTP edge every route shares: the operational endpoints (`/healthz`, `/readyz`,
//! `/metrics`, `/v1/models`), the head guard, the 404/405 answers and the SSE response shape.
//! Kept apart from the dialects so that a new API reuses them instead of copying them; what every
//! API route runs through (admission, body limits, redaction, the request log) is in
//! [`crate::layers`].

use crate::auth::Caller;
use crate::error::ApiError;
use crate::state::AppState;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::Instant;

/// Most header lines a request may carry (more is a 431).
pub(crate) const MAX_HEADERS: usize = 100;

/// 431 in OpenAI's shape for a head with too many or too large headers (hyper's own limit,
/// set well above this one by `serve`, answers a bare 431 only past it).
pub(crate) async fn guard_head(
    State(s): State<Arc<AppState>>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let head_bytes: usize = req
        .headers()
        .iter()
        .map(|(k, v)| k.as_str().len() + v.len() + 4)
        .sum::<usize>()
        + display_len(req.uri());
    if req.headers().len() > MAX_HEADERS || head_bytes > s.config.server.max_header_bytes {
        return ApiError::new(
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            "invalid_request_error",
            "headers_too_large",
            format!(
                "the request head exceeds {} bytes or {MAX_HEADERS} headers",
                s.config.server.max_header_bytes
            ),
        )
        .into_response();
    }
    next.run(req).await
}

/// The length of `v` as displayed, counted without building the text (the head guard runs on
/// every request).
fn display_len(v: &impl std::fmt::Display) -> usize {
    struct Count(usize);
    impl std::fmt::Write for Count {
        fn write_str(&mut self, s: &str) -> std::fmt::Result {
            self.0 += s.len();
            Ok(())
        }
    }
    let mut n = Count(0);
    // Counting never fails; a Display that does leaves what it wrote counted.
    let _ = std::fmt::write(&mut n, format_args!("{v}"));
    n.0
}

pub(crate) async fn healthz() -> impl IntoResponse {
    axum::Json(json!({"status": "ok"}))
}

/// How long `/readyz` waits for an upstream (probes time out in seconds).
pub(crate) const READY_PROBE: std::time::Duration = std::time::Duration::from_secs(2);

/// Ready when at least one upstream answers within [`READY_PROBE`] (any HTTP status: it is
/// reachable). The upstreams are asked at once.
pub(crate) async fn readyz(State(s): State<Arc<AppState>>) -> Response {
    let checks = s
        .upstreams
        .iter()
        .map(|(name, u)| async move { (name.clone(), u.client.reachable(READY_PROBE).await) });
    let results = futures_util::future::join_all(checks).await;
    let up: Vec<&String> = results.iter().filter(|r| r.1).map(|r| &r.0).collect();
    // A state store that is down does not make the replica unready: it serves from local
    // state (see the deployment guide); it is reported.
    let store = crate::metrics::store_status(&s.shared);
    if up.is_empty() {
        return ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "upstream_error",
            "not_ready",
            "no upstream is reachable",
        )
        .into_response();
    }
    axum::Json(json!({"status": "ready", "reachable": up, "state_store": store})).into_response()
}

pub(crate) async fn method_not_allowed() -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "invalid_request_error",
        "method_not_allowed",
        "this endpoint does not accept that method",
    )
}

pub(crate) async fn not_found() -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "invalid_request_error",
        "not_found",
        "no such endpoint",
    )
}

pub(crate) async fn metrics(State(s): State<Arc<AppState>>) -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        s.metrics.render(
            s.runs.len(),
            s.runs.evicted(),
            s.trace.dropped(),
            &s.upstreams.attempt_seconds,
        ) + &s.no_stream.render(Instant::now())
            + &crate::metrics::render_state(&s.shared, s.upstreams.shared_skips())
            + &s.runs.shared.render()
            + &crate::telemetry::render_metrics(),
    )
}

/// `GET /v1/models`: the default upstream's models (asked with the caller's credentials) and
/// the gateway's aliases. Admitted and redacted by the route's layers ([`crate::layers`]).
pub(crate) async fn models(State(s): State<Arc<AppState>>, caller: Caller) -> Response {
    let mut data: Vec<Value> = Vec::new();
    if let Some(u) = s
        .config
        .default_upstream
        .as_ref()
        .and_then(|d| s.upstreams.get(d))
        && let Ok(v) = u.client.get_json("models", &caller.credentials).await
        && let Some(list) = v.get("data").and_then(Value::as_array)
    {
        data.extend(list.iter().cloned());
    }
    for alias in s.config.models.keys() {
        data.push(json!({"id": alias, "object": "model", "owned_by": "selfheal"}));
    }
    let mut list = json!({"object": "list", "data": data});
    caller.redactor.value(&mut list);
    axum::Json(list).into_response()
}

pub(crate) fn sse_response(body: Body) -> Response {
    let mut resp = Response::new(body);
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    resp
}

#[cfg(test)]
mod tests {
    use super::display_len;
    use axum::http::Uri;

    #[test]
    fn display_len_is_the_length_of_the_displayed_text() {
        for u in [
            "/v1/chat/completions",
            "/v1/models?limit=5&after=x%20y",
            "http://example.com:8080/v1/responses?a=b",
            "*",
        ] {
            let uri: Uri = u.parse().unwrap();
            assert_eq!(display_len(&uri), uri.to_string().len(), "{u}");
        }
    }
}
