//! OpenTelemetry export: the gateway's requests and upstream attempts as OTLP spans.
//!
//! The SQLite trace stays the embedded record of every decision; this is for the
//! observability stack an operator already runs (Arize Phoenix, Jaeger, Tempo, ...). With
//! `[telemetry] otlp_endpoint` — or the standard `OTEL_EXPORTER_OTLP_ENDPOINT` /
//! `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` variables — every chat request is a server span named
//! `chat {model}` (the OpenTelemetry GenAI conventions), a child of the client's W3C
//! `traceparent` when it sent one, and every upstream attempt a client span under it with
//! `gen_ai.operation.name`, `gen_ai.request.model`, `gen_ai.usage.*` (non-streaming answers)
//! and `selfheal.*` attributes; the attempt's `traceparent` goes upstream. The plan's retries,
//! fall-backs and skips are span events of the request. Spans are exported over OTLP/HTTP in
//! batches by a background thread: a request never waits on the exporter, and a collector that
//! is down loses spans, never requests. Without an endpoint nothing is set up and every hook
//! here is one atomic load.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use axum::extract::Request;
use axum::http::HeaderMap;
use axum::middleware::Next;
use axum::response::Response;
use opentelemetry::context::FutureExt as _;
use opentelemetry::propagation::{Extractor, Injector};
use opentelemetry::trace::{
    SpanKind, Status, TraceContextExt as _, Tracer as _, TracerProvider as _,
};
use opentelemetry::{Context, KeyValue, global};
use opentelemetry_otlp::WithExportConfig as _;
use opentelemetry_sdk::trace::SdkTracerProvider;
use serde::Deserialize;
use serde_json::Value;

use crate::config::Target;

/// `[telemetry]`, kept with the rest of the configuration.
pub(crate) use crate::config::TelemetryConfig;

/// Whether spans are exported (set once, by [`init`]).
static ENABLED: AtomicBool = AtomicBool::new(false);

/// The tracer spans are started with, set by [`init`]: the SDK's own type, so that starting a
/// span neither looks the global provider up (a lock and a boxed tracer per call) nor boxes
/// the span.
static TRACER: std::sync::RwLock<Option<opentelemetry_sdk::trace::SdkTracer>> =
    std::sync::RwLock::new(None);

/// Runs `f` with the tracer, when there is one.
fn with_tracer<T>(f: impl FnOnce(&opentelemetry_sdk::trace::SdkTracer) -> T) -> Option<T> {
    let tracer = TRACER.read().unwrap_or_else(|p| p.into_inner());
    tracer.as_ref().map(f)
}

/// The instrumentation scope's name.
const SCOPE: &str = "selfheal-gateway";

/// Why export could not be set up.
#[derive(Debug, thiserror::Error)]
#[error("cannot set up OTLP export: {0}")]
pub struct TelemetryError(String);

impl TelemetryError {
    /// The set-up task itself failed.
    pub fn from_join(e: &tokio::task::JoinError) -> TelemetryError {
        TelemetryError(e.to_string())
    }
}

/// The exporter while it runs; [`Telemetry::shutdown`] flushes it.
#[derive(Debug, Default)]
pub(crate) struct Telemetry {
    provider: Option<SdkTracerProvider>,
}

/// Sets up export when an endpoint is configured (the config's, else the environment's).
/// Blocking (the exporter's HTTP client is built): call it off the async workers.
pub(crate) fn init(
    config: &TelemetryConfig,
    env: impl Fn(&str) -> Option<String>,
) -> Result<Telemetry, TelemetryError> {
    let from_env = [
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        "OTEL_EXPORTER_OTLP_ENDPOINT",
    ]
    .iter()
    .any(|v| env(v).is_some_and(|s| !s.is_empty()));
    let mut builder = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_timeout(Duration::from_secs(5));
    match &config.otlp_endpoint {
        Some(base) => {
            let base = base.trim_end_matches('/');
            let url = if base.ends_with("/v1/traces") {
                base.to_owned()
            } else {
                format!("{base}/v1/traces")
            };
            builder = builder.with_endpoint(url);
        }
        None if from_env => {}
        None => return Ok(Telemetry::default()),
    }
    let exporter = builder.build().map_err(|e| TelemetryError(e.to_string()))?;
    let resource = opentelemetry_sdk::Resource::builder()
        .with_service_name("selfheal")
        .build();
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(resource)
        .build();
    *TRACER.write().unwrap_or_else(|p| p.into_inner()) = Some(provider.tracer(SCOPE));
    global::set_tracer_provider(provider.clone());
    global::set_text_map_propagator(opentelemetry_sdk::propagation::TraceContextPropagator::new());
    ENABLED.store(true, Ordering::Relaxed);
    Ok(Telemetry {
        provider: Some(provider),
    })
}

impl Telemetry {
    /// Whether this set-up exports spans (an endpoint was configured): without it, the
    /// request-span layer is not put on the routes at all.
    pub(crate) fn exports(&self) -> bool {
        self.provider.is_some()
    }

    /// Exports what is queued and stops. Blocking: call it off the async workers.
    pub(crate) fn shutdown(self) {
        if let Some(p) = self.provider {
            ENABLED.store(false, Ordering::Relaxed);
            *TRACER.write().unwrap_or_else(|p| p.into_inner()) = None;
            if let Err(e) = p.shutdown() {
                tracing::warn!(error = %e, "OTLP export did not flush at shutdown");
            }
        }
    }
}

/// Whether spans are exported.
pub(crate) fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

struct Headers<'h>(&'h HeaderMap);

impl Extractor for Headers<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(|k| k.as_str()).collect()
    }
}

struct Outgoing(Vec<(String, String)>);

impl Injector for Outgoing {
    fn set(&mut self, key: &str, value: String) {
        self.0.push((key.to_owned(), value));
    }
}

/// Middleware: a server span per chat request (`/v1/chat/completions`, `/v1/responses`), child
/// of the client's `traceparent`; the handler runs in its context. Ends when the answer's head
/// is sent.
pub(crate) async fn request_span(req: Request, next: Next) -> Response {
    let endpoint = match req.uri().path() {
        "/v1/chat/completions" => "/v1/chat/completions",
        "/v1/responses" => "/v1/responses",
        _ => return next.run(req).await,
    };
    if !enabled() {
        return next.run(req).await;
    }
    let parent = global::get_text_map_propagator(|p| p.extract(&Headers(req.headers())));
    let started = with_tracer(|tracer| {
        tracer
            .span_builder("chat")
            .with_kind(SpanKind::Server)
            .with_attributes([
                KeyValue::new("gen_ai.operation.name", "chat"),
                KeyValue::new("selfheal.endpoint", endpoint),
            ])
            .start_with_context(tracer, &parent)
    });
    let Some(span) = started else {
        return next.run(req).await;
    };
    let cx = parent.with_span(span);
    let resp = next.run(req).with_context(cx.clone()).await;
    let span = cx.span();
    let status = resp.status().as_u16();
    span.set_attribute(KeyValue::new(
        "http.response.status_code",
        i64::from(status),
    ));
    if status >= 500 {
        span.set_status(Status::error(format!("HTTP {status}")));
    }
    span.end();
    resp
}

/// The context of one upstream attempt: a client span `chat {model}` under the request's span.
/// The first attempt also names the request's span after the model asked for. `None` without
/// export, or outside a chat request.
pub(crate) fn attempt(target: &Target, first: Option<&Target>, number: usize) -> Option<Context> {
    if !enabled() {
        return None;
    }
    let parent = Context::current();
    // Only under a chat request's span (not the forwarded endpoints').
    if !parent.has_active_span() {
        return None;
    }
    let name = format!("chat {}", target.model);
    let model =
        opentelemetry::StringValue::from(std::sync::Arc::<str>::from(target.model.as_str()));
    if let Some(first) = first {
        let request = parent.span();
        // The first attempt's target is the chain's first: its name and model serve both.
        if first == target {
            request.update_name(name.clone());
            request.set_attribute(KeyValue::new("gen_ai.request.model", model.clone()));
        } else {
            request.update_name(format!("chat {}", first.model));
            request.set_attribute(KeyValue::new("gen_ai.request.model", first.model.clone()));
        }
    }
    let span = with_tracer(|tracer| {
        tracer
            .span_builder(name)
            .with_kind(SpanKind::Client)
            .with_attributes([
                KeyValue::new("gen_ai.operation.name", "chat"),
                KeyValue::new("gen_ai.request.model", model),
                KeyValue::new("selfheal.upstream", target.upstream.clone()),
                KeyValue::new(
                    "selfheal.attempt",
                    i64::try_from(number).unwrap_or(i64::MAX),
                ),
            ])
            .start_with_context(tracer, &parent)
    })?;
    Some(parent.with_span(span))
}

/// Ends an attempt's span with its outcome (`ok`, `http_503`, `timeout`, ...).
pub(crate) fn attempt_done(cx: Option<Context>, outcome: &str) {
    let Some(cx) = cx else { return };
    let span = cx.span();
    span.set_attribute(KeyValue::new("selfheal.outcome", outcome.to_owned()));
    if outcome != "ok" {
        span.set_status(Status::error(outcome.to_owned()));
    }
    span.end();
}

/// A decision of the call plan (retry, fallback, skip) as an event of the request's span.
pub(crate) fn decision(kind: &str, detail: &str) {
    if !enabled() {
        return;
    }
    Context::current().span().add_event(
        format!("selfheal.{kind}"),
        vec![KeyValue::new("selfheal.detail", detail.to_owned())],
    );
}

/// The current attempt's `traceparent` (and `tracestate`), as headers for the upstream.
pub(crate) fn inject(mut req: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
    if !enabled() {
        return req;
    }
    let mut out = Outgoing(Vec::new());
    global::get_text_map_propagator(|p| p.inject_context(&Context::current(), &mut out));
    for (k, v) in out.0 {
        req = req.header(k, v);
    }
    req
}

/// [`usage`] of an answer still in bytes (read only when spans are exported).
pub(crate) fn usage_of(bytes: &[u8]) {
    #[derive(Deserialize)]
    struct Head {
        usage: Option<Value>,
        model: Option<Value>,
    }
    if !enabled() {
        return;
    }
    if let Ok(h) = serde_json::from_slice::<Head>(bytes) {
        let mut body = serde_json::Map::new();
        body.extend(h.usage.map(|u| ("usage".to_owned(), u)));
        body.extend(h.model.map(|m| ("model".to_owned(), m)));
        usage(&Value::Object(body));
    }
}

/// The token usage of a non-streaming answer, on the current attempt's span.
pub(crate) fn usage(body: &Value) {
    if !enabled() {
        return;
    }
    let cx = Context::current();
    let span = cx.span();
    for (attr, ptr) in [
        ("gen_ai.usage.input_tokens", "/usage/prompt_tokens"),
        ("gen_ai.usage.output_tokens", "/usage/completion_tokens"),
    ] {
        if let Some(n) = body.pointer(ptr).and_then(Value::as_i64) {
            span.set_attribute(KeyValue::new(attr, n));
        }
    }
    if let Some(m) = body.get("model").and_then(Value::as_str) {
        span.set_attribute(KeyValue::new("gen_ai.response.model", m.to_owned()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_an_endpoint_nothing_is_set_up() {
        let t = init(&TelemetryConfig::default(), |_| None).unwrap();
        assert!(t.provider.is_none());
        let empty = init(&TelemetryConfig::default(), |_| Some(String::new())).unwrap();
        assert!(empty.provider.is_none(), "an empty variable is unset");
        assert!(!enabled());
        let c = crate::GatewayConfig::from_toml_str(
            "[telemetry]\notlp_endpoint = \"http://127.0.0.1:4318\"\n",
        )
        .unwrap();
        assert_eq!(
            c.telemetry.otlp_endpoint.as_deref(),
            Some("http://127.0.0.1:4318")
        );
    }
}
