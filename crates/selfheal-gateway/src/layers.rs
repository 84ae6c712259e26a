//! The layers every API route runs through, so that a handler is only parse → `heal_turn` →
//! render and no route is admitted, bounded, redacted or logged differently from another:
//!
//! ```text
//!  request ─► log ─► admit ─► redact ─► body ─► handler
//!             │      │        │         └ the body read within max_body_bytes and the
//!             │      │        │           body-read timeout (413, 408), handed on as [`Received`]
//!             │      │        └ a refusal's message and reasons cleaned of every secret of
//!             │      │          the request (the operator's keys and the caller's)
//!             │      └ the caller identified ([`Caller`], handed on) or refused (401)
//!             └ counted, timed, its refusals counted by kind, one log line
//! ```
//!
//! A handler refuses with [`Refused`] (an [`ApiError`] marked as a refusal), which is how the
//! layers tell a refusal, counted and redacted, from an answer that happens to carry an error
//! status (a `partial` answered as an error, which the pipeline has already redacted). They sit
//! on the routes (`route_layer`), not on the router, so a 404 or 405 is answered before any of
//! them, as before.

use std::sync::Arc;
use std::time::Instant;

use axum::body::Body;
use axum::extract::{FromRequestParts, Request, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;

use crate::auth::Caller;
use crate::error::ApiError;
use crate::metrics::Metrics;
use crate::state::AppState;

/// A handler's refusal: answered in OpenAI's shape, and marked so that the layers count it and
/// redact it (see the module docs).
#[derive(Debug)]
pub(crate) struct Refused(pub(crate) ApiError);

impl From<ApiError> for Refused {
    fn from(e: ApiError) -> Refused {
        Refused(e)
    }
}

/// The marker a refusal's response carries: the error it said.
#[derive(Debug, Clone)]
pub(crate) struct Refusal(pub(crate) ApiError);

impl IntoResponse for Refused {
    fn into_response(self) -> Response {
        let mut resp = self.0.clone().into_response();
        resp.extensions_mut().insert(Refusal(self.0));
        resp
    }
}

/// The tenant a response was answered for, for the request log (`-` before admission).
#[derive(Debug, Clone)]
struct Tenant(String);

/// The request body, read whole within the gateway's bounds by [`bounded_body`].
#[derive(Debug, Clone)]
pub(crate) struct Received(pub(crate) Bytes);

/// What a handler gets when a route lacks the layer that hands it on: a 500, not a panic.
fn unwired(what: &str) -> Refused {
    Refused(ApiError::new(
        StatusCode::INTERNAL_SERVER_ERROR,
        "server_error",
        "internal_error",
        format!("the route has no {what} layer"),
    ))
}

impl<S: Send + Sync> FromRequestParts<S> for Caller {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Caller, Response> {
        parts
            .extensions
            .remove::<Caller>()
            .ok_or_else(|| unwired("admission").into_response())
    }
}

impl<S: Send + Sync> FromRequestParts<S> for Received {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Received, Response> {
        parts
            .extensions
            .remove::<Received>()
            .ok_or_else(|| unwired("body").into_response())
    }
}

/// The request log: every API request counted and timed, its refusals counted (an upstream's
/// as `upstream_errors_total`, the rest as `client_errors_total`), one structured line at `info`
/// (what a log pipeline needs to find a run).
pub(crate) async fn request_log(
    State(s): State<Arc<AppState>>,
    req: Request,
    next: Next,
) -> Response {
    let started = Instant::now();
    Metrics::inc(&s.metrics.requests_total);
    let resp = next.run(req).await;
    if let Some(Refusal(e)) = resp.extensions().get::<Refusal>() {
        if e.status == StatusCode::BAD_GATEWAY {
            Metrics::inc(&s.metrics.upstream_errors_total);
        } else {
            Metrics::inc(&s.metrics.client_errors_total);
        }
    }
    s.metrics.request_seconds.observe(started.elapsed());
    let tenant = resp.extensions().get::<Tenant>().map_or("-", |t| &t.0);
    let h = resp.headers();
    let get = |n: &str| h.get(n).and_then(|v| v.to_str().ok()).unwrap_or("-");
    tracing::info!(
        target: "selfheal::request",
        run = get("x-selfheal-run"),
        tenant,
        http_status = resp.status().as_u16(),
        heal_status = get("x-selfheal-status"),
        actions = get("x-selfheal-actions"),
        latency_us = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX),
        "request"
    );
    resp
}

/// Admission: the caller identified by its key ([`crate::auth::Gatekeeper::admit`]) and handed
/// on, or the request refused (401) before its body is read.
pub(crate) async fn admit(
    State(s): State<Arc<AppState>>,
    mut req: Request,
    next: Next,
) -> Response {
    let caller = match s.gate.admit(req.headers()) {
        Ok(c) => c,
        Err(e) => return Refused(e).into_response(),
    };
    let tenant = Tenant(caller.tenant.clone());
    req.extensions_mut().insert(caller);
    let mut resp = next.run(req).await;
    resp.extensions_mut().insert(tenant);
    resp
}

/// Error redaction: a refusal's message and reasons lose every secret of the request (the
/// operator's keys and the caller's own), whatever raised it.
pub(crate) async fn redact(req: Request, next: Next) -> Response {
    let redactor = req.extensions().get::<Caller>().map(|c| c.redactor.clone());
    let resp = next.run(req).await;
    let Some(redactor) = redactor else {
        return resp;
    };
    let Some(Refusal(e)) = resp.extensions().get::<Refusal>() else {
        return resp;
    };
    let clean = redactor.error(e.clone());
    if clean == *e {
        return resp;
    }
    // The body said the secret: it is said again without it, the rest of the answer (its
    // status, its `x-selfheal-*` headers) kept.
    let (mut parts, _) = resp.into_parts();
    parts.headers.remove(header::CONTENT_LENGTH);
    let body = Body::from(clean.body().to_string());
    parts.extensions.insert(Refusal(clean));
    Response::from_parts(parts, body)
}

/// The body limits: the body read whole within `max_body_bytes` (413 when larger, said by its
/// `Content-Length` before any of it is read) and the body-read timeout (408), and handed on as
/// [`Received`].
pub(crate) async fn bounded_body(
    State(s): State<Arc<AppState>>,
    req: Request,
    next: Next,
) -> Response {
    let (parts, body) = req.into_parts();
    match read_body(&s, &parts.headers, body).await {
        Ok(bytes) => {
            let mut req = Request::from_parts(parts, Body::empty());
            req.extensions_mut().insert(Received(bytes));
            next.run(req).await
        }
        Err(e) => Refused(e).into_response(),
    }
}

/// Reads the body within the body-read timeout: 413 when too large, 408 when too slow.
async fn read_body(s: &AppState, headers: &HeaderMap, body: Body) -> Result<Bytes, ApiError> {
    let limit = s.config.max_body_bytes;
    if headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok())
        .is_some_and(|n| n > limit)
    {
        return Err(ApiError::too_large(limit));
    }
    let timeout = std::time::Duration::from_millis(s.config.server.body_read_timeout_ms);
    match tokio::time::timeout(timeout, axum::body::to_bytes(body, limit)).await {
        Ok(Ok(b)) => Ok(b),
        Ok(Err(_)) => Err(ApiError::too_large(limit)),
        Err(_) => Err(ApiError::new(
            StatusCode::REQUEST_TIMEOUT,
            "invalid_request_error",
            "request_timeout",
            "the request body did not arrive in time",
        )),
    }
}
