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
//! fall-backs and skips are span events of the request.
//!
//! What a request pays is small and fixed: its spans are a plain [`Record`] (ids, timestamps,
//! the model and upstream names, a few numbers and static strings) kept in a task-local while
//! the request runs, and handed whole to a bounded queue when it ends — one `try_send`, never a
//! wait. A background thread turns the records into the SDK's `SpanData` and exports them over
//! OTLP/HTTP in batches with the `opentelemetry-otlp` exporter. A full queue (a collector that is
//! down or slow, a gateway past what its exporter keeps up with) drops the record, counted in
//! `selfheal_otlp_spans_dropped_total`: a collector that is down loses spans, never requests.
//! Without an endpoint nothing is set up and every hook here is one atomic load.

use std::borrow::Cow;
use std::cell::{Cell, RefCell};
use std::fmt::Write as _;
use std::sync::RwLock;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::time::{Duration, Instant, SystemTime};

use axum::extract::Request;
use axum::http::HeaderMap;
use axum::middleware::Next;
use axum::response::Response;
use opentelemetry::trace::{
    SpanContext, SpanId, SpanKind, Status, TraceFlags, TraceId, TraceState,
};
use opentelemetry::{InstrumentationScope, KeyValue};
use opentelemetry_otlp::WithExportConfig as _;
use opentelemetry_sdk::trace::{SpanData, SpanEvents, SpanExporter as _, SpanLinks};
use reqwest::header::HeaderValue;
use serde_json::Value;

use crate::config::Target;

/// `[telemetry]`, kept with the rest of the configuration.
pub(crate) use crate::config::TelemetryConfig;

/// Whether spans are exported (set by [`init`], cleared by [`Telemetry::shutdown`]).
static ENABLED: AtomicBool = AtomicBool::new(false);

/// Where finished requests go: the exporter thread's queue, while it runs.
static QUEUE: RwLock<Option<SyncSender<Record>>> = RwLock::new(None);

/// Spans dropped because the queue was full (or export had stopped).
static DROPPED: AtomicU64 = AtomicU64::new(0);

/// Finished requests the queue holds (each one request span and its attempts): at 13,000
/// requests a second, more than half a second of them.
const QUEUE_LEN: usize = 8_192;

/// Spans sent in one export at most; a batch this size is sent at once.
const BATCH: usize = 2_048;

/// A batch smaller than [`BATCH`] is sent this long after the previous export at the latest.
const EVERY: Duration = Duration::from_secs(1);

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
    worker: Option<std::thread::JoinHandle<()>>,
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
    let mut exporter = builder.build().map_err(|e| TelemetryError(e.to_string()))?;
    let resource = opentelemetry_sdk::Resource::builder()
        .with_service_name("selfheal")
        .build();
    exporter.set_resource(&resource);
    let (tx, rx) = std::sync::mpsc::sync_channel(QUEUE_LEN);
    let worker = std::thread::Builder::new()
        .name("otlp-export".into())
        .spawn(move || export_loop(&rx, &exporter))
        .map_err(|e| TelemetryError(e.to_string()))?;
    *QUEUE.write().unwrap_or_else(|p| p.into_inner()) = Some(tx);
    ENABLED.store(true, Ordering::Relaxed);
    Ok(Telemetry {
        worker: Some(worker),
    })
}

impl Telemetry {
    /// Exports what is queued and stops. Blocking: call it off the async workers.
    pub(crate) fn shutdown(self) {
        if let Some(worker) = self.worker {
            ENABLED.store(false, Ordering::Relaxed);
            // The queue's only sender: its end lets the thread export what is left and stop.
            drop(QUEUE.write().unwrap_or_else(|p| p.into_inner()).take());
            if worker.join().is_err() {
                tracing::warn!("the OTLP export thread panicked: spans were lost at shutdown");
            }
        }
    }
}

/// Whether spans are exported.
pub(crate) fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// Spans dropped at a full queue so far.
pub(crate) fn dropped() -> u64 {
    DROPPED.load(Ordering::Relaxed)
}

/// The Prometheus exposition of [`dropped`].
pub(crate) fn render_metrics() -> String {
    format!(
        "# HELP selfheal_otlp_spans_dropped_total OTLP spans dropped on a full export queue.\n\
         # TYPE selfheal_otlp_spans_dropped_total counter\n\
         selfheal_otlp_spans_dropped_total {}\n",
        dropped()
    )
}

/// The exporter thread: records to `SpanData`, exported in batches of up to [`BATCH`] spans at
/// least every [`EVERY`]; when the queue closes, what is left, then the exporter's shutdown.
fn export_loop(rx: &Receiver<Record>, exporter: &opentelemetry_otlp::SpanExporter) {
    let scope = InstrumentationScope::builder(SCOPE).build();
    let mut batch = Vec::with_capacity(BATCH + 8);
    let mut due = Instant::now() + EVERY;
    let mut failing = false;
    loop {
        let wait = due.saturating_duration_since(Instant::now());
        let closed = match rx.recv_timeout(wait) {
            Ok(record) => {
                record.into_spans(&scope, &mut batch);
                if batch.len() < BATCH {
                    continue;
                }
                false
            }
            Err(RecvTimeoutError::Timeout) => false,
            Err(RecvTimeoutError::Disconnected) => true,
        };
        if !batch.is_empty() {
            let spans = std::mem::replace(&mut batch, Vec::with_capacity(BATCH + 8));
            let n = spans.len();
            match futures_executor::block_on(exporter.export(spans)) {
                Ok(()) => failing = false,
                Err(e) if !failing => {
                    failing = true;
                    tracing::warn!(error = %e, spans = n, "OTLP export failed: spans lost");
                }
                Err(e) => tracing::debug!(error = %e, spans = n, "OTLP export failed again"),
            }
        }
        if closed {
            break;
        }
        due = Instant::now() + EVERY;
    }
    if let Err(e) = exporter.shutdown() {
        tracing::warn!(error = %e, "OTLP export did not shut down cleanly");
    }
}

/// A request's spans as the request path records them: plain data, turned into `SpanData` on the
/// exporter thread ([`Record::into_spans`]).
#[derive(Debug)]
struct Record {
    /// The request span's own context (its trace and span ids, sampled or not, trace state).
    context: SpanContext,
    /// The client's span, when it sent a `traceparent`.
    parent: Option<SpanId>,
    start: SystemTime,
    end: Option<SystemTime>,
    /// The request's path (`/v1/chat/completions`, `/v1/responses`).
    endpoint: &'static str,
    /// The first model of the chain, once the first attempt starts.
    model: Option<String>,
    /// The answer's status.
    status: Option<u16>,
    attempts: Vec<Attempt>,
    events: Vec<Decision>,
}

/// One upstream attempt's span.
#[derive(Debug)]
struct Attempt {
    span_id: SpanId,
    start: SystemTime,
    end: Option<SystemTime>,
    model: String,
    upstream: String,
    number: usize,
    /// `ok`, `http_503`, ...: unset for an attempt that did not finish (cancelled).
    outcome: Option<Cow<'static, str>>,
    input_tokens: Option<i64>,
    output_tokens: Option<i64>,
    response_model: Option<String>,
}

/// A call-plan decision: an event of the request span.
#[derive(Debug)]
struct Decision {
    at: SystemTime,
    kind: &'static str,
    detail: String,
}

impl Record {
    /// A request span starting now, a child of `parent` (the client's span) when there is one.
    fn start(endpoint: &'static str, parent: Option<SpanContext>) -> Record {
        let span_id = new_span_id();
        let (context, parent) = match parent {
            Some(p) => (
                // The SDK's parent-based sampling: a client that does not sample is followed.
                SpanContext::new(
                    p.trace_id(),
                    span_id,
                    p.trace_flags(),
                    false,
                    p.trace_state().clone(),
                ),
                Some(p.span_id()),
            ),
            None => (
                SpanContext::new(
                    new_trace_id(),
                    span_id,
                    TraceFlags::SAMPLED,
                    false,
                    TraceState::NONE,
                ),
                None,
            ),
        };
        Record {
            context,
            parent,
            start: SystemTime::now(),
            end: None,
            endpoint,
            model: None,
            status: None,
            attempts: Vec::new(),
            events: Vec::new(),
        }
    }

    /// The attempt in flight: the last one started, unless it ended.
    fn open_attempt(&mut self) -> Option<&mut Attempt> {
        self.attempts.last_mut().filter(|a| a.end.is_none())
    }

    /// Starts attempt `number` on `target`; the first one also names the request after the
    /// chain's first model. Returns the attempt's index.
    fn start_attempt(&mut self, target: &Target, first: Option<&Target>, number: usize) -> usize {
        if let Some(first) = first {
            self.model = Some(first.model.clone());
        }
        self.attempts.push(Attempt {
            span_id: new_span_id(),
            start: SystemTime::now(),
            end: None,
            model: target.model.clone(),
            upstream: target.upstream.clone(),
            number,
            outcome: None,
            input_tokens: None,
            output_tokens: None,
            response_model: None,
        });
        self.attempts.len() - 1
    }

    /// Ends attempt `index` now (with its outcome, when it finished), unless it ended already.
    fn end_attempt(&mut self, index: usize, outcome: Option<Cow<'static, str>>) {
        if let Some(a) = self.attempts.get_mut(index)
            && a.end.is_none()
        {
            a.end = Some(SystemTime::now());
            a.outcome = outcome;
        }
    }

    /// The span context requests sent now carry upstream: the attempt in flight's, else the
    /// request's.
    fn outgoing(&self) -> (TraceId, SpanId, TraceFlags) {
        let span = match self.attempts.last() {
            Some(a) if a.end.is_none() => a.span_id,
            _ => self.context.span_id(),
        };
        (self.context.trace_id(), span, self.context.trace_flags())
    }

    /// The request's spans as the SDK's `SpanData`, appended to `out`: the request span, then
    /// its attempts.
    fn into_spans(self, scope: &InstrumentationScope, out: &mut Vec<SpanData>) {
        let end = self.end.unwrap_or(self.start);
        let trace_id = self.context.trace_id();
        let flags = self.context.trace_flags();
        let state = self.context.trace_state().clone();
        let request_id = self.context.span_id();
        let name = match &self.model {
            Some(m) => Cow::Owned(format!("chat {m}")),
            None => Cow::Borrowed("chat"),
        };
        let mut attributes = Vec::with_capacity(4);
        attributes.push(KeyValue::new("gen_ai.operation.name", "chat"));
        attributes.push(KeyValue::new("selfheal.endpoint", self.endpoint));
        if let Some(m) = self.model {
            attributes.push(KeyValue::new("gen_ai.request.model", m));
        }
        let mut status = Status::Unset;
        if let Some(code) = self.status {
            attributes.push(KeyValue::new("http.response.status_code", i64::from(code)));
            if code >= 500 {
                status = Status::error(format!("HTTP {code}"));
            }
        }
        let mut events = SpanEvents::default();
        events.events = self
            .events
            .into_iter()
            .map(|d| {
                opentelemetry::trace::Event::new(
                    format!("selfheal.{}", d.kind),
                    d.at,
                    vec![KeyValue::new("selfheal.detail", d.detail)],
                    0,
                )
            })
            .collect();
        out.push(SpanData {
            span_context: self.context,
            parent_span_id: self.parent.unwrap_or(SpanId::INVALID),
            parent_span_is_remote: self.parent.is_some(),
            span_kind: SpanKind::Server,
            name,
            start_time: self.start,
            end_time: end,
            attributes,
            dropped_attributes_count: 0,
            events,
            links: SpanLinks::default(),
            status,
            instrumentation_scope: scope.clone(),
        });
        for a in self.attempts {
            let mut attributes = Vec::with_capacity(8);
            attributes.push(KeyValue::new("gen_ai.operation.name", "chat"));
            attributes.push(KeyValue::new("gen_ai.request.model", a.model.clone()));
            attributes.push(KeyValue::new("selfheal.upstream", a.upstream));
            attributes.push(KeyValue::new(
                "selfheal.attempt",
                i64::try_from(a.number).unwrap_or(i64::MAX),
            ));
            if let Some(n) = a.input_tokens {
                attributes.push(KeyValue::new("gen_ai.usage.input_tokens", n));
            }
            if let Some(n) = a.output_tokens {
                attributes.push(KeyValue::new("gen_ai.usage.output_tokens", n));
            }
            if let Some(m) = a.response_model {
                attributes.push(KeyValue::new("gen_ai.response.model", m));
            }
            let mut status = Status::Unset;
            if let Some(outcome) = a.outcome {
                if outcome != "ok" {
                    status = Status::error(outcome.clone());
                }
                attributes.push(KeyValue::new("selfheal.outcome", outcome));
            }
            out.push(SpanData {
                span_context: SpanContext::new(trace_id, a.span_id, flags, false, state.clone()),
                parent_span_id: request_id,
                parent_span_is_remote: false,
                span_kind: SpanKind::Client,
                name: Cow::Owned(format!("chat {}", a.model)),
                start_time: a.start,
                end_time: a.end.unwrap_or(end),
                attributes,
                dropped_attributes_count: 0,
                events: SpanEvents::default(),
                links: SpanLinks::default(),
                status,
                instrumentation_scope: scope.clone(),
            });
        }
    }
}

/// Hands a finished request to the exporter thread without waiting: a full queue (or none)
/// drops it, counted.
fn offer(queue: Option<&SyncSender<Record>>, record: Record) {
    let spans = 1 + record.attempts.len() as u64;
    let sent = match queue {
        Some(tx) => match tx.try_send(record) {
            Ok(()) => true,
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => false,
        },
        None => false,
    };
    if !sent {
        DROPPED.fetch_add(spans, Ordering::Relaxed);
    }
}

/// The request in flight's record, in the task that serves it.
struct Live(RefCell<Option<Record>>);

impl Drop for Live {
    /// The request is over (answered, or its task dropped): the record goes to the exporter,
    /// with what did not end (a cancelled request or attempt) ended now.
    fn drop(&mut self) {
        let Some(mut record) = self.0.get_mut().take() else {
            return;
        };
        if !record.context.is_sampled() {
            return;
        }
        let now = SystemTime::now();
        record.end.get_or_insert(now);
        for a in &mut record.attempts {
            a.end.get_or_insert(now);
        }
        let queue = QUEUE.read().unwrap_or_else(|p| p.into_inner());
        offer(queue.as_ref(), record);
    }
}

tokio::task_local! {
    static CURRENT: Live;
}

/// Runs `f` on the record of the request this task serves, if it is a chat request with
/// export on.
fn with_record<T>(f: impl FnOnce(&mut Record) -> T) -> Option<T> {
    CURRENT
        .try_with(|live| live.0.borrow_mut().as_mut().map(f))
        .ok()
        .flatten()
}

/// The client's span from its `traceparent` (and `tracestate`), by the rules of the SDK's W3C
/// propagator: version 00 with exactly four fields (later versions with at least four),
/// lowercase hex, ids not zero; flags other than `sampled` are dropped.
fn parent_of(headers: &HeaderMap) -> Option<SpanContext> {
    let header = headers.get("traceparent")?.to_str().ok()?.trim();
    let mut parts = header.split_terminator('-');
    let (version, trace, span, flags) =
        (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    let more = parts.next().is_some();
    let version = u8::from_str_radix(version, 16).ok()?;
    if version == 255 || (version == 0 && more) {
        return None;
    }
    let lower = |s: &str| !s.bytes().any(|c| c.is_ascii_uppercase());
    if !(lower(trace) && lower(span) && lower(flags)) {
        return None;
    }
    let trace = TraceId::from_hex(trace).ok()?;
    let span = SpanId::from_hex(span).ok()?;
    let flags = TraceFlags::new(u8::from_str_radix(flags, 16).ok()?) & TraceFlags::SAMPLED;
    let state = match headers.get("tracestate").and_then(|v| v.to_str().ok()) {
        Some(s) => s.parse().unwrap_or_default(),
        None => TraceState::NONE,
    };
    let cx = SpanContext::new(trace, span, flags, true, state);
    cx.is_valid().then_some(cx)
}

thread_local! {
    /// Each thread's id generator (wyrand), seeded from the OS once.
    static RNG: Cell<u64> = Cell::new(getrandom::u64().unwrap_or_else(|_| {
        // No OS randomness: the clock and the thread's stack address still differ.
        let t = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
        let here = 0u8;
        (t.as_nanos() as u64) ^ (std::ptr::from_ref(&here) as usize as u64).rotate_left(32)
    }));
}

/// 64 random bits, never 0.
fn random_u64() -> u64 {
    RNG.with(|s| {
        loop {
            let x = s.get().wrapping_add(0xa076_1d64_78bd_642f);
            s.set(x);
            let t = u128::from(x) * u128::from(x ^ 0xe703_7ed1_a0b4_28db);
            let r = ((t >> 64) as u64) ^ (t as u64);
            if r != 0 {
                return r;
            }
        }
    })
}

fn new_span_id() -> SpanId {
    SpanId::from(random_u64())
}

fn new_trace_id() -> TraceId {
    TraceId::from((u128::from(random_u64()) << 64) | u128::from(random_u64()))
}

/// Middleware: a server span per chat request (`/v1/chat/completions`, `/v1/responses`), child
/// of the client's `traceparent`; the handler runs with its record. Ends when the answer's head
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
    let record = Record::start(endpoint, parent_of(req.headers()));
    let live = Live(RefCell::new(Some(record)));
    CURRENT
        .scope(live, async move {
            let resp = next.run(req).await;
            with_record(|r| {
                r.status = Some(resp.status().as_u16());
                r.end = Some(SystemTime::now());
            });
            resp
        })
        .await
}

/// An upstream attempt's span while it runs: [`attempt_done`] ends it with its outcome;
/// dropped unfinished (the attempt cancelled), it ends without one.
#[derive(Debug)]
pub(crate) struct AttemptSpan(usize);

impl Drop for AttemptSpan {
    fn drop(&mut self) {
        with_record(|r| r.end_attempt(self.0, None));
    }
}

/// Starts the span of one upstream attempt: a client span `chat {model}` under the request's
/// span. The first attempt also names the request's span after the chain's first model. `None`
/// without export, or outside a chat request.
pub(crate) fn attempt(
    target: &Target,
    first: Option<&Target>,
    number: usize,
) -> Option<AttemptSpan> {
    if !enabled() {
        return None;
    }
    with_record(|r| r.start_attempt(target, first, number)).map(AttemptSpan)
}

/// Ends an attempt's span with its outcome (`ok`, `http_503`, `timeout`, ...).
pub(crate) fn attempt_done(span: Option<AttemptSpan>, outcome: Cow<'static, str>) {
    let Some(span) = span else { return };
    with_record(|r| r.end_attempt(span.0, Some(outcome)));
}

/// A decision of the call plan (retry, fallback, skip) as an event of the request's span.
pub(crate) fn decision(kind: &'static str, detail: &str) {
    if !enabled() {
        return;
    }
    with_record(|r| {
        r.events.push(Decision {
            at: SystemTime::now(),
            kind,
            detail: detail.to_owned(),
        });
    });
}

/// `traceparent` of a span context, as the W3C propagator writes it.
fn traceparent(trace: TraceId, span: SpanId, flags: TraceFlags) -> String {
    let mut s = String::with_capacity(55);
    let sampled = (flags & TraceFlags::SAMPLED).to_u8();
    let _ = write!(s, "00-{trace:032x}-{span:016x}-{sampled:02x}");
    s
}

/// The current attempt's `traceparent` (and `tracestate`, when the client sent one), as headers
/// for the upstream.
pub(crate) fn inject(req: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
    if !enabled() {
        return req;
    }
    let Some(((trace, span, flags), state)) = with_record(|r| {
        // The client's `tracestate`, passed on (none: no header, and no string built).
        let state = r.context.trace_state();
        let state = (*state != TraceState::NONE).then(|| state.header());
        (r.outgoing(), state)
    }) else {
        return req;
    };
    let mut req = match HeaderValue::from_str(&traceparent(trace, span, flags)) {
        Ok(v) => req.header("traceparent", v),
        Err(_) => return req,
    };
    if let Some(state) = state.filter(|s| !s.is_empty())
        && let Ok(v) = HeaderValue::from_str(&state)
    {
        req = req.header("tracestate", v);
    }
    req
}

/// [`usage`] of an answer as the gateway read it: a plain answer's scan read the usage
/// already ([`crate::answer::Usage`]); a parsed one has its `Value`.
pub(crate) fn usage_of(answer: &crate::answer::Answer) {
    if !enabled() {
        return;
    }
    match answer {
        crate::answer::Answer::Plain(p) => {
            set_usage(p.usage.input, p.usage.output, p.usage.model.as_deref());
        }
        crate::answer::Answer::Parsed(c) => usage(&c.body),
    }
}

/// The token usage of a non-streaming answer, on the current attempt's span.
pub(crate) fn usage(body: &Value) {
    if !enabled() {
        return;
    }
    let tokens = |ptr| body.pointer(ptr).and_then(Value::as_i64);
    set_usage(
        tokens("/usage/prompt_tokens"),
        tokens("/usage/completion_tokens"),
        body.get("model").and_then(Value::as_str),
    );
}

fn set_usage(input: Option<i64>, output: Option<i64>, model: Option<&str>) {
    with_record(|r| {
        if let Some(a) = r.open_attempt() {
            a.input_tokens = input.or(a.input_tokens);
            a.output_tokens = output.or(a.output_tokens);
            if let Some(m) = model {
                a.response_model = Some(m.to_owned());
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_an_endpoint_nothing_is_set_up() {
        let t = init(&TelemetryConfig::default(), |_| None).unwrap();
        assert!(t.worker.is_none());
        let empty = init(&TelemetryConfig::default(), |_| Some(String::new())).unwrap();
        assert!(empty.worker.is_none(), "an empty variable is unset");
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

    const TRACE: &str = "0af7651916cd43dd8448eb211c80319c";
    const CLIENT: &str = "b7ad6b7169203331";

    fn headers(traceparent: &str, tracestate: Option<&str>) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert("traceparent", traceparent.parse().unwrap());
        if let Some(s) = tracestate {
            h.insert("tracestate", s.parse().unwrap());
        }
        h
    }

    fn target(upstream: &str, model: &str) -> Target {
        Target {
            upstream: upstream.into(),
            model: model.into(),
        }
    }

    fn value<'a>(span: &'a SpanData, key: &str) -> Option<&'a opentelemetry::Value> {
        span.attributes
            .iter()
            .find(|kv| kv.key.as_str() == key)
            .map(|kv| &kv.value)
    }

    #[test]
    fn a_clients_traceparent_is_read_as_the_w3c_propagator_reads_it() {
        let p = parent_of(&headers(&format!("00-{TRACE}-{CLIENT}-01"), Some("k=v"))).unwrap();
        assert_eq!(p.trace_id(), TraceId::from_hex(TRACE).unwrap());
        assert_eq!(p.span_id(), SpanId::from_hex(CLIENT).unwrap());
        assert!(p.is_sampled() && p.is_remote());
        assert_eq!(p.trace_state().header(), "k=v");
        let flags = parent_of(&headers(&format!("00-{TRACE}-{CLIENT}-03"), None)).unwrap();
        assert_eq!(
            flags.trace_flags(),
            TraceFlags::SAMPLED,
            "only `sampled` is kept"
        );
        let later = parent_of(&headers(&format!("01-{TRACE}-{CLIENT}-00-more"), None)).unwrap();
        assert!(!later.is_sampled(), "a later version may add fields");
        for bad in [
            format!("00-{TRACE}-{CLIENT}-01-more"),
            format!("ff-{TRACE}-{CLIENT}-01"),
            format!("00-{}-{CLIENT}-01", TRACE.to_uppercase()),
            format!("00-{}-{CLIENT}-01", "0".repeat(32)),
            format!("00-{TRACE}-{}-01", "0".repeat(16)),
            format!("00-{TRACE}-{CLIENT}"),
            "garbage".to_owned(),
        ] {
            assert!(parent_of(&headers(&bad, None)).is_none(), "{bad}");
        }
        assert!(parent_of(&HeaderMap::new()).is_none());
    }

    #[test]
    fn a_request_with_a_retry_becomes_a_server_span_and_two_client_spans() {
        let parent = parent_of(&headers(&format!("00-{TRACE}-{CLIENT}-01"), None));
        let mut r = Record::start("/v1/chat/completions", parent);
        let m1 = target("default", "m1");
        let first = r.start_attempt(&m1, Some(&m1), 0);
        r.end_attempt(first, Some("http_503".into()));
        r.events.push(Decision {
            at: SystemTime::now(),
            kind: "retry",
            detail: "default/m1: HTTP 503 (waiting 10 ms)".into(),
        });
        let second = r.start_attempt(&m1, None, 1);
        r.open_attempt().unwrap().input_tokens = Some(10);
        r.end_attempt(second, Some("ok".into()));
        r.end_attempt(second, Some("timeout".into()));
        r.status = Some(200);
        r.end = Some(SystemTime::now());
        let (request_id, ids) = (
            r.context.span_id(),
            [r.attempts[0].span_id, r.attempts[1].span_id],
        );
        let scope = InstrumentationScope::builder(SCOPE).build();
        let mut spans = Vec::new();
        r.into_spans(&scope, &mut spans);
        assert_eq!(spans.len(), 3);
        let request = &spans[0];
        assert_eq!(request.name, "chat m1");
        assert_eq!(request.span_kind, SpanKind::Server);
        assert_eq!(
            request.span_context.trace_id(),
            TraceId::from_hex(TRACE).unwrap()
        );
        assert_eq!(request.parent_span_id, SpanId::from_hex(CLIENT).unwrap());
        assert!(request.parent_span_is_remote);
        assert_eq!(value(request, "gen_ai.request.model"), Some(&"m1".into()));
        assert_eq!(
            value(request, "selfheal.endpoint"),
            Some(&"/v1/chat/completions".into())
        );
        assert_eq!(
            value(request, "http.response.status_code"),
            Some(&200i64.into())
        );
        assert_eq!(request.status, Status::Unset);
        let events: Vec<_> = request.events.iter().map(|e| e.name.as_ref()).collect();
        assert_eq!(events, ["selfheal.retry"]);
        for (span, id, number) in [(&spans[1], ids[0], 0i64), (&spans[2], ids[1], 1)] {
            assert_eq!(span.name, "chat m1");
            assert_eq!(span.span_kind, SpanKind::Client);
            assert_eq!(span.span_context.span_id(), id);
            assert_eq!(span.parent_span_id, request_id);
            assert!(!span.parent_span_is_remote);
            assert_eq!(value(span, "selfheal.attempt"), Some(&number.into()));
            assert_eq!(value(span, "selfheal.upstream"), Some(&"default".into()));
            assert_eq!(value(span, "gen_ai.operation.name"), Some(&"chat".into()));
        }
        assert_eq!(spans[1].status, Status::error("http_503"));
        assert_eq!(
            value(&spans[1], "selfheal.outcome"),
            Some(&"http_503".into())
        );
        assert_eq!(
            value(&spans[2], "selfheal.outcome"),
            Some(&"ok".into()),
            "ended once"
        );
        assert_eq!(spans[2].status, Status::Unset);
        assert_eq!(
            value(&spans[2], "gen_ai.usage.input_tokens"),
            Some(&10i64.into())
        );
        assert_eq!(value(&spans[1], "gen_ai.usage.input_tokens"), None);
    }

    #[test]
    fn a_request_without_an_attempt_is_named_chat_and_a_5xx_is_an_error() {
        let mut r = Record::start("/v1/responses", None);
        r.status = Some(502);
        let mut spans = Vec::new();
        r.into_spans(&InstrumentationScope::builder(SCOPE).build(), &mut spans);
        assert_eq!(spans.len(), 1);
        assert_eq!(spans[0].name, "chat");
        assert_eq!(spans[0].parent_span_id, SpanId::INVALID);
        assert!(spans[0].span_context.is_sampled() && spans[0].span_context.is_valid());
        assert_eq!(spans[0].status, Status::error("HTTP 502"));
        assert_eq!(value(&spans[0], "gen_ai.request.model"), None);
    }

    #[test]
    fn upstream_gets_the_attempt_in_flights_traceparent_else_the_requests() {
        let parent = parent_of(&headers(&format!("00-{TRACE}-{CLIENT}-00"), None));
        let mut r = Record::start("/v1/chat/completions", parent);
        assert!(
            !r.context.is_sampled(),
            "a client that does not sample is followed"
        );
        let request = r.context.span_id();
        let (t, s, f) = r.outgoing();
        assert_eq!(
            traceparent(t, s, f),
            format!("00-{TRACE}-{request:016x}-00")
        );
        let i = r.start_attempt(&target("a", "m"), None, 0);
        let attempt = r.attempts[0].span_id;
        assert_ne!(attempt, request);
        let (t, s, f) = r.outgoing();
        assert_eq!(
            traceparent(t, s, f),
            format!("00-{TRACE}-{attempt:016x}-00")
        );
        r.end_attempt(i, Some("ok".into()));
        assert_eq!(r.outgoing().1, request);
        assert_eq!(
            traceparent(TraceId::from(1), SpanId::from(2), TraceFlags::SAMPLED),
            format!("00-{:032x}-{:016x}-01", 1, 2)
        );
    }

    #[test]
    fn a_full_queue_drops_the_record_and_counts_its_spans() {
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        let mut with_attempt = Record::start("/v1/chat/completions", None);
        with_attempt.start_attempt(&target("a", "m"), None, 0);
        let before = dropped();
        offer(Some(&tx), Record::start("/v1/chat/completions", None));
        assert_eq!(dropped(), before, "room for one");
        offer(Some(&tx), with_attempt);
        assert_eq!(dropped(), before + 2, "a request span and its attempt");
        assert_eq!(rx.try_iter().count(), 1);
        assert!(render_metrics().contains("selfheal_otlp_spans_dropped_total "));
    }

    #[tokio::test]
    async fn the_hooks_record_into_the_request_the_task_serves() {
        assert!(with_record(|_| ()).is_none(), "outside a request: nothing");
        let live = Live(RefCell::new(Some(Record::start(
            "/v1/chat/completions",
            None,
        ))));
        let record = CURRENT
            .scope(live, async {
                let m = target("default", "m1");
                let span = with_record(|r| r.start_attempt(&m, Some(&m), 0)).map(AttemptSpan);
                set_usage(Some(10), Some(5), Some("m1-2026"));
                attempt_done(span, "ok".into());
                set_usage(Some(99), None, None);
                let cancelled = with_record(|r| r.start_attempt(&m, None, 1)).map(AttemptSpan);
                drop(cancelled);
                CURRENT.with(|l| l.0.borrow_mut().take())
            })
            .await
            .unwrap();
        let [done, cancelled] = &record.attempts[..] else {
            panic!("{:?}", record.attempts)
        };
        assert_eq!(record.model.as_deref(), Some("m1"));
        assert_eq!(done.outcome.as_deref(), Some("ok"));
        assert_eq!((done.input_tokens, done.output_tokens), (Some(10), Some(5)));
        assert_eq!(done.response_model.as_deref(), Some("m1-2026"));
        assert!(cancelled.end.is_some() && cancelled.outcome.is_none());
    }
}
