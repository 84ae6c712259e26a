//! What the gateway passes through without healing: `/v1/embeddings`, a Responses request it
//! cannot heal, and a chat request that asks for nothing the gateway heals (passthrough). They
//! still go through the upstream chain (retries, fallback, breakers) and are counted and logged;
//! only the tool loop is left alone.

use crate::auth::{Caller, Credentials};
use crate::error::ApiError;
use crate::http::sse_response;
use crate::layers::{Received, Refused};
use crate::request::{ChatRequest, Edits};
use crate::state::AppState;
use crate::upstream::{CallLog, UpstreamClient};
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderValue, header};
use axum::response::Response;
use bytes::Bytes;
use futures_util::StreamExt;
use futures_util::future::BoxFuture;
use selfheal_openai::ClientError;
use serde_json::Value;
use std::sync::Arc;

use crate::pipeline::send_op;

/// `POST /v1/embeddings`, passed through (see [`forward`]).
pub(crate) async fn embeddings(
    State(s): State<Arc<AppState>>,
    caller: Caller,
    Received(bytes): Received,
) -> Result<Response, Refused> {
    Ok(forward(&s, &caller, bytes, Forwarded::Embeddings).await?)
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

/// Forwards a request of an admitted caller as is: the model routed (an alias's first target,
/// its model name written in), one attempt, the answer — a stream when `stream` is true — read
/// bounded and redacted. Admitted, bounded and logged by the route's layers, as every API is.
pub(crate) async fn forward(
    s: &AppState,
    caller: &Caller,
    bytes: Bytes,
    what: Forwarded,
) -> Result<Response, ApiError> {
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
