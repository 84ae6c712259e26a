//! What the gateway passes through without healing: `/v1/embeddings`, a Responses request it
//! cannot heal, and a chat request that asks for nothing the gateway heals (passthrough). They
//! still go through the upstream chain (retries, fallback, breakers) and are counted and logged;
//! only the tool loop is left alone.

use crate::auth::{Caller, Credentials};
use crate::error::ApiError;
use crate::http::{log_request, read_body, sse_response};
use crate::request::{ChatRequest, Edits};
use crate::state::AppState;
use crate::upstream::{CallLog, UpstreamClient};
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures_util::StreamExt;
use futures_util::future::BoxFuture;
use selfheal_openai::ClientError;
use serde_json::Value;
use std::sync::Arc;
use std::time::Instant;

use crate::pipeline::send_op;

/// `POST /v1/embeddings`, passed through (see [`forward`]).
pub(crate) async fn embeddings(
    State(s): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    forward(&s, &headers, body, Forwarded::Embeddings).await
}

/// The endpoints the gateway forwards without healing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Forwarded {
    Embeddings,
    Responses,
}

pub(crate) fn embed_op<'c>(
    c: &'c UpstreamClient,
    b: Bytes,
    cr: &'c Credentials,
) -> BoxFuture<'c, Result<reqwest::Response, ClientError>> {
    Box::pin(c.send("embeddings", b, cr))
}

pub(crate) fn responses_op<'c>(
    c: &'c UpstreamClient,
    b: Bytes,
    cr: &'c Credentials,
) -> BoxFuture<'c, Result<reqwest::Response, ClientError>> {
    Box::pin(c.send("responses", b, cr))
}

/// Forwards a request as is: the caller admitted, the model routed (an alias's first target,
/// its model name written in), one attempt, the answer — a stream when `stream` is true — read
/// bounded and redacted.
pub(crate) async fn forward(
    s: &AppState,
    headers: &HeaderMap,
    body: Body,
    what: Forwarded,
) -> Response {
    let started = Instant::now();
    let (result, tenant) = match s.gate.admit(headers) {
        Ok(caller) => {
            let tenant = caller.tenant.clone();
            let r = forward_inner(s, &caller, headers, body, what).await;
            (r.map_err(|e| caller.redactor.error(e)), tenant)
        }
        Err(e) => (Err(e), "-".to_owned()),
    };
    let resp = result.unwrap_or_else(IntoResponse::into_response);
    log_request(&resp, &tenant, started);
    resp
}

pub(crate) async fn forward_inner(
    s: &AppState,
    caller: &Caller,
    headers: &HeaderMap,
    body: Body,
    what: Forwarded,
) -> Result<Response, ApiError> {
    let bytes = read_body(s, headers, body).await?;
    let mut req: serde_json::Map<String, Value> = serde_json::from_slice(&bytes)
        .map_err(|e| ApiError::bad_request(format!("the body is not a JSON object: {e}")))?;
    let model = req
        .get("model")
        .and_then(Value::as_str)
        .ok_or_else(|| ApiError::bad_request("`model` must be a string"))?
        .to_owned();
    let streaming = req.get("stream").and_then(Value::as_bool) == Some(true);
    let chain = s
        .config
        .route(&model)
        .ok_or_else(|| ApiError::unknown_model(&model))?;
    let first = &chain[..1.min(chain.len())];
    let body = match first.first() {
        Some(t) if t.model != model => {
            req.insert("model".into(), Value::from(t.model.as_str()));
            Bytes::from(serde_json::to_vec(&req).map_err(|e| ApiError::bad_request(e.to_string()))?)
        }
        _ => bytes,
    };
    let encode = |_m: &str| body.clone();
    let op = match what {
        Forwarded::Embeddings => &embed_op as crate::upstream::Op<'_, reqwest::Response>,
        Forwarded::Responses => &responses_op,
    };
    let mut log = CallLog::default();
    let upstream = s
        .upstreams
        .call(first, &encode, op, None, &caller.credentials, &mut log)
        .await?;
    let red = caller.redactor.clone();
    if streaming {
        let body = crate::upstream::body_stream(upstream)
            .map(move |b| b.map(|b| red.bytes(b)).map_err(std::io::Error::other));
        return Ok(sse_response(Body::from_stream(body)));
    }
    let out = crate::upstream::read_bounded(upstream, s.config.max_upstream_body_bytes)
        .await
        .map_err(|e| ApiError::exhausted(vec![format!("the upstream answer broke off: {e}")]))?;
    let mut resp = Response::new(Body::from(red.bytes(out)));
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    Ok(resp)
}

/// Forward only: one attempt, the first model of the chain, no run state. The request is
/// normalised (a shape fix, not healing); the answer goes back byte for byte.
pub(crate) async fn passthrough(
    s: &AppState,
    caller: &Caller,
    chain: &[crate::config::Target],
    req: &ChatRequest<'_>,
    bytes: &Bytes,
) -> Result<Response, ApiError> {
    let mut log = CallLog::default();
    let encode = |m: &str| {
        req.encode(
            &Edits {
                model: Some(m),
                normalize: true,
                ..Edits::default()
            },
            bytes,
        )
    };
    let upstream = s
        .upstreams
        .call(
            chain,
            &encode,
            &send_op,
            None,
            &caller.credentials,
            &mut log,
        )
        .await?;
    let red = caller.redactor.clone();
    if req.stream {
        let body = crate::upstream::body_stream(upstream)
            .map(move |b| b.map(|b| red.bytes(b)).map_err(std::io::Error::other));
        return Ok(sse_response(Body::from_stream(body)));
    }
    let content_type = upstream
        .headers()
        .get(header::CONTENT_TYPE)
        .cloned()
        .unwrap_or(HeaderValue::from_static("application/json"));
    let bytes = crate::upstream::read_bounded(upstream, s.config.max_upstream_body_bytes)
        .await
        .map_err(|e| ApiError::exhausted(vec![format!("the upstream answer broke off: {e}")]))?;
    let mut resp = Response::new(Body::from(red.bytes(bytes)));
    resp.headers_mut()
        .insert(header::CONTENT_TYPE, content_type);
    Ok(resp)
}
