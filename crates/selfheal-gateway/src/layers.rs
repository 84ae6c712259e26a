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
//! The four are one route layer ([`api_with_body`], [`api_without_body`] for a route without a
//! body): one future a request instead of one per stage, and the caller handed from admission to
//! redaction without a round trip through the request's and the response's extensions.
//!
//! A handler refuses with [`Refused`] (an [`ApiError`] marked as a refusal), which is how the
//! layers tell a refusal, counted and redacted, from an answer that happens to carry an error
//! status (a `partial` answered as an error, which the pipeline has already redacted). The layer
//! sits on the routes (`route_layer`), not on the router, so a 404 or 405 is answered before
//! it, as before.

use std::sync::Arc;
use std::time::Instant;

use axum::body::Body;
use axum::extract::{FromRequestParts, Request, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;

use crate::auth::{Caller, Redactor};
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

/// The request body, read whole within the gateway's bounds by the body limits.
#[derive(Debug, Clone)]
pub(crate) struct Received(pub(crate) Bytes);

/// The run label the client sent (`x-selfheal-run`), read from the request's head alone: a
/// `HeaderMap` extractor would copy every header of every request for it.
#[derive(Debug, Clone, Default)]
pub(crate) struct RunLabel(pub(crate) Option<axum::http::HeaderValue>);

impl RunLabel {
    /// The label, when it is text.
    pub(crate) fn as_str(&self) -> Option<&str> {
        self.0.as_ref().and_then(|v| v.to_str().ok())
    }
}

impl<S: Send + Sync> FromRequestParts<S> for RunLabel {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<RunLabel, Self::Rejection> {
        Ok(RunLabel(parts.headers.get("x-selfheal-run").cloned()))
    }
}

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

/// What every API route runs through, in one layer (one boxed future, the head read once):
/// the request log around admission, around error redaction, around the body limits — the
/// order of the module docs' picture. [`api_with_body`] for the routes with a body,
/// [`api_without_body`] for the others (`/v1/models`).
pub(crate) async fn api_with_body(
    State(s): State<Arc<AppState>>,
    req: Request,
    next: Next,
) -> Response {
    request_log(&s, req, next, true).await
}

/// [`api_with_body`] without the body limits (a route whose request has no body).
pub(crate) async fn api_without_body(
    State(s): State<Arc<AppState>>,
    req: Request,
    next: Next,
) -> Response {
    request_log(&s, req, next, false).await
}

/// The request log: every API request counted and timed, its refusals counted (an upstream's
/// as `upstream_errors_total`, the rest as `client_errors_total`), one structured line at `info`
/// (what a log pipeline needs to find a run).
async fn request_log(s: &AppState, req: Request, next: Next, with_body: bool) -> Response {
    let started = Instant::now();
    Metrics::inc(&s.metrics.requests_total);
    let (resp, tenant) = admit(s, req, next, with_body).await;
    if let Some(Refusal(e)) = resp.extensions().get::<Refusal>() {
        if e.status == StatusCode::BAD_GATEWAY {
            Metrics::inc(&s.metrics.upstream_errors_total);
        } else {
            Metrics::inc(&s.metrics.client_errors_total);
        }
    }
    s.metrics.request_seconds.observe(started.elapsed());
    let tenant = tenant.as_deref().unwrap_or("-");
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
/// on, or the request refused (401) before its body is read. Also the tenant answered for, for
/// the request log — only when that line is logged (`None` otherwise, and before admission).
async fn admit(
    s: &AppState,
    mut req: Request,
    next: Next,
    with_body: bool,
) -> (Response, Option<String>) {
    let caller = match s.gate.admit(req.headers()) {
        Ok(c) => c,
        Err(e) => return (Refused(e).into_response(), None),
    };
    let tenant = tracing::enabled!(target: "selfheal::request", tracing::Level::INFO)
        .then(|| caller.tenant.clone());
    let redactor = caller.redactor.clone();
    req.extensions_mut().insert(caller);
    let resp = if with_body {
        bounded_body(s, req, next).await
    } else {
        next.run(req).await
    };
    (redact(&redactor, resp), tenant)
}

/// Error redaction: a refusal's message and reasons lose every secret of the request (the
/// operator's keys and the caller's own), whatever raised it.
fn redact(redactor: &Redactor, resp: Response) -> Response {
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
async fn bounded_body(s: &AppState, req: Request, next: Next) -> Response {
    let (parts, body) = req.into_parts();
    match read_body(s, &parts.headers, body).await {
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
