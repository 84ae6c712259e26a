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
//! wait. A background thread encodes the records as OTLP protobuf ([`otlp_wire`]) and posts them
//! over OTLP/HTTP in batches. A full queue (a collector that is
//! down or slow, a gateway past what its exporter keeps up with) drops the record, counted in
//! `selfheal_otlp_spans_dropped_total`: a collector that is down loses spans, never requests.
//! Without an endpoint nothing is set up and every hook here is one atomic load.

use std::borrow::Cow;
use std::cell::{Cell, RefCell};
use std::sync::RwLock;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::time::{Duration, Instant, SystemTime};

use axum::extract::Request;
use axum::http::HeaderMap;
use axum::middleware::Next;
use axum::response::Response;
use opentelemetry::trace::{SpanContext, SpanId, TraceFlags, TraceId, TraceState};
use reqwest::header::{HeaderMap as Headers, HeaderName, HeaderValue};
use serde_json::Value;

use crate::config::Target;
use crate::otlp_wire;

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

/// Spans in one export: a batch is sent as soon as it holds this many.
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

/// Where batches go and what each one carries besides its spans.
struct Sink {
    client: reqwest::blocking::Client,
    url: String,
    headers: Headers,
    /// The encoded `Resource` (`service.name = selfheal`, the SDK's and the environment's
    /// attributes) and `InstrumentationScope`.
    resource: Vec<u8>,
    scope: Vec<u8>,
}

/// The traces endpoint, as the OTLP exporter resolves it: the configured base (`/v1/traces`
/// appended), else `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` as is, else
/// `OTEL_EXPORTER_OTLP_ENDPOINT` with `/v1/traces` appended; `None` without any.
fn endpoint(config: &TelemetryConfig, env: &impl Fn(&str) -> Option<String>) -> Option<String> {
    let set = |v: &str| env(v).filter(|s| !s.is_empty());
    let traces = |base: &str| {
        let base = base.trim_end_matches('/');
        if base.ends_with("/v1/traces") {
            base.to_owned()
        } else {
            format!("{base}/v1/traces")
        }
    };
    match &config.otlp_endpoint {
        Some(base) => Some(traces(base)),
        None => set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
            .or_else(|| set("OTEL_EXPORTER_OTLP_ENDPOINT").map(|b| traces(&b))),
    }
}

/// The export's extra headers, as the OTLP exporter reads them: `OTEL_EXPORTER_OTLP_TRACES_HEADERS`
/// else `OTEL_EXPORTER_OTLP_HEADERS`, `key=value` pairs separated by commas, values
/// percent-decoded; a pair that is not a valid header is left out.
fn headers(env: &impl Fn(&str) -> Option<String>) -> Headers {
    let mut out = Headers::new();
    out.insert(
        reqwest::header::CONTENT_TYPE,
        HeaderValue::from_static("application/x-protobuf"),
    );
    out.insert(
        reqwest::header::USER_AGENT,
        HeaderValue::from_static(concat!("selfheal/", env!("CARGO_PKG_VERSION"))),
    );
    let Some(spec) =
        env("OTEL_EXPORTER_OTLP_TRACES_HEADERS").or_else(|| env("OTEL_EXPORTER_OTLP_HEADERS"))
    else {
        return out;
    };
    for pair in spec.split_terminator(',').map(str::trim) {
        let Some((k, v)) = pair.split_once('=') else {
            continue;
        };
        let (k, v) = (k.trim(), v.trim());
        let v = percent_decode(v).unwrap_or_else(|| v.to_owned());
        if let (Ok(k), Ok(v)) = (HeaderName::try_from(k), HeaderValue::try_from(v))
            && !v.is_empty()
        {
            out.insert(k, v);
        }
    }
    out
}

/// `%XX` escapes decoded (`None` when one is broken or the result is not UTF-8).
fn percent_decode(s: &str) -> Option<String> {
    let mut out = Vec::with_capacity(s.len());
    let mut bytes = s.bytes();
    while let Some(b) = bytes.next() {
        if b == b'%' {
            let hex = [bytes.next()?, bytes.next()?];
            out.push(u8::from_str_radix(std::str::from_utf8(&hex).ok()?, 16).ok()?);
        } else {
            out.push(b);
        }
    }
    String::from_utf8(out).ok()
}

/// Sets up export when an endpoint is configured (the config's, else the environment's).
/// Blocking (the exporter's HTTP client is built): call it off the async workers.
pub(crate) fn init(
    config: &TelemetryConfig,
    env: impl Fn(&str) -> Option<String>,
) -> Result<Telemetry, TelemetryError> {
    let Some(url) = endpoint(config, &env) else {
        return Ok(Telemetry::default());
    };
    reqwest::Url::parse(&url).map_err(|e| TelemetryError(format!("endpoint `{url}`: {e}")))?;
    let client = reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .map_err(|e| TelemetryError(e.to_string()))?;
    // The SDK's resource: `service.name`, the `telemetry.sdk.*` attributes and
    // `OTEL_RESOURCE_ATTRIBUTES`.
    let resource = opentelemetry_sdk::Resource::builder()
        .with_service_name("selfheal")
        .build();
    let resource = otlp_wire::resource(resource.iter().map(|(k, v)| {
        let v = match v {
            opentelemetry::Value::Bool(b) => otlp_wire::Any::Bool(*b),
            opentelemetry::Value::I64(i) => otlp_wire::Any::Int(*i),
            opentelemetry::Value::F64(f) => otlp_wire::Any::Double(*f),
            opentelemetry::Value::String(s) => otlp_wire::Any::Str(s.as_str()),
            // Arrays (none by default) as their text.
            other => otlp_wire::Any::Owned(other.to_string()),
        };
        (k.as_str(), v)
    }));
    let sink = Sink {
        client,
        url,
        headers: headers(&env),
        resource,
        scope: otlp_wire::scope(SCOPE),
    };
    let (tx, rx) = std::sync::mpsc::sync_channel(QUEUE_LEN);
    let worker = std::thread::Builder::new()
        .name("otlp-export".into())
        .spawn(move || export_loop(&rx, &sink))
        .map_err(|e| TelemetryError(e.to_string()))?;
    *QUEUE.write().unwrap_or_else(|p| p.into_inner()) = Some(tx);
    ENABLED.store(true, Ordering::Relaxed);
    Ok(Telemetry {
        worker: Some(worker),
    })
}

impl Telemetry {
    /// Whether this set-up exports spans (an endpoint was configured): without it, the
    /// request-span layer is not put on the routes at all.
    pub(crate) fn exports(&self) -> bool {
        self.worker.is_some()
    }

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

/// The exporter thread: records encoded as they arrive, sent in batches of up to [`BATCH`]
/// spans at least every [`EVERY`]; when the queue closes, what is left.
fn export_loop(rx: &Receiver<Record>, sink: &Sink) {
    let mut spans = Vec::with_capacity(1 << 20);
    let mut count = 0;
    let mut due = Instant::now() + EVERY;
    let mut failing = false;
    loop {
        let wait = due.saturating_duration_since(Instant::now());
        let closed = match rx.recv_timeout(wait) {
            Ok(record) => {
                count += record.encode(&mut spans);
                if count < BATCH {
                    continue;
                }
                false
            }
            Err(RecvTimeoutError::Timeout) => false,
            Err(RecvTimeoutError::Disconnected) => true,
        };
        if count > 0 {
            let body = otlp_wire::request(&sink.resource, &sink.scope, &spans);
            spans.clear();
            let sent = sink
                .client
                .post(&sink.url)
                .headers(sink.headers.clone())
                .body(body)
                .send()
                .map_err(|e| e.to_string())
                .and_then(|r| {
                    if r.status().is_success() {
                        Ok(())
                    } else {
                        Err(format!("HTTP {}", r.status()))
                    }
                });
            match sent {
                Ok(()) => failing = false,
                Err(e) if !failing => {
                    failing = true;
                    tracing::warn!(error = %e, spans = count, "OTLP export failed: spans lost");
                }
                Err(e) => tracing::debug!(error = %e, spans = count, "OTLP export failed again"),
            }
            count = 0;
        }
        if closed {
            break;
        }
        due = Instant::now() + EVERY;
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

    /// The request's spans encoded as OTLP `Span`s, appended to `out` (the request span, then
    /// its attempts); returns how many.
    fn encode(self, out: &mut Vec<u8>) -> usize {
        use otlp_wire::{Any, Kind, SpanHead, attribute, event, span};
        let end = self.end.unwrap_or(self.start);
        let state = self.context.trace_state();
        let state = if *state == TraceState::NONE {
            String::new()
        } else {
            state.header()
        };
        let trace_id = self.context.trace_id().to_bytes();
        let request_id = self.context.span_id().to_bytes();
        let trace_flags = self.context.trace_flags().to_u8();
        let name = match &self.model {
            Some(m) => format!("chat {m}"),
            None => "chat".to_owned(),
        };
        let error = self
            .status
            .filter(|&c| c >= 500)
            .map(|c| format!("HTTP {c}"));
        let head = SpanHead {
            trace_id,
            span_id: request_id,
            trace_state: &state,
            parent: self.parent.map(SpanId::to_bytes),
            parent_is_remote: self.parent.is_some(),
            name: &name,
            kind: Kind::Server,
            start: self.start,
            end,
            trace_flags,
            error: error.as_deref(),
        };
        span(out, &head, |b| {
            attribute(b, 9, "gen_ai.operation.name", Any::Str("chat"));
            attribute(b, 9, "selfheal.endpoint", Any::Str(self.endpoint));
            if let Some(m) = &self.model {
                attribute(b, 9, "gen_ai.request.model", Any::Str(m));
            }
            if let Some(code) = self.status {
                attribute(b, 9, "http.response.status_code", Any::Int(i64::from(code)));
            }
            for d in &self.events {
                let name = format!("selfheal.{}", d.kind);
                event(b, d.at, &name, "selfheal.detail", &d.detail);
            }
        });
        for a in &self.attempts {
            let name = format!("chat {}", a.model);
            let error = a.outcome.as_deref().filter(|&o| o != "ok");
            let head = SpanHead {
                trace_id,
                span_id: a.span_id.to_bytes(),
                trace_state: &state,
                parent: Some(request_id),
                parent_is_remote: false,
                name: &name,
                kind: Kind::Client,
                start: a.start,
                end: a.end.unwrap_or(end),
                trace_flags,
                error,
            };
            span(out, &head, |b| {
                attribute(b, 9, "gen_ai.operation.name", Any::Str("chat"));
                attribute(b, 9, "gen_ai.request.model", Any::Str(&a.model));
                attribute(b, 9, "selfheal.upstream", Any::Str(&a.upstream));
                let number = i64::try_from(a.number).unwrap_or(i64::MAX);
                attribute(b, 9, "selfheal.attempt", Any::Int(number));
                if let Some(n) = a.input_tokens {
                    attribute(b, 9, "gen_ai.usage.input_tokens", Any::Int(n));
                }
                if let Some(n) = a.output_tokens {
                    attribute(b, 9, "gen_ai.usage.output_tokens", Any::Int(n));
                }
                if let Some(m) = &a.response_model {
                    attribute(b, 9, "gen_ai.response.model", Any::Str(m));
                }
                if let Some(o) = &a.outcome {
                    attribute(b, 9, "selfheal.outcome", Any::Str(o));
                }
            });
        }
        1 + self.attempts.len()
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

/// `traceparent` of a span context, as the W3C propagator writes it
/// (`00-{trace id}-{span id}-{flags}`, lowercase hex).
fn traceparent(trace: TraceId, span: SpanId, flags: TraceFlags) -> [u8; 55] {
    fn hex(out: &mut [u8], bytes: &[u8]) {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        for (pair, b) in out.chunks_exact_mut(2).zip(bytes) {
            pair[0] = HEX[usize::from(b >> 4)];
            pair[1] = HEX[usize::from(b & 0xf)];
        }
    }
    let mut out = *b"00-00000000000000000000000000000000-0000000000000000-00";
    hex(&mut out[3..35], &trace.to_bytes());
    hex(&mut out[36..52], &span.to_bytes());
    hex(&mut out[53..55], &[(flags & TraceFlags::SAMPLED).to_u8()]);
    out
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
    let mut req = match HeaderValue::from_bytes(&traceparent(trace, span, flags)) {
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

    use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
    use opentelemetry_proto::tonic::common::v1::any_value::Value as Any;
    use opentelemetry_proto::tonic::trace::v1::{Span, span::SpanKind, status::StatusCode};
    use prost::Message as _;

    /// The record as a collector reads it: encoded, put in a request, decoded with
    /// `opentelemetry-proto`'s own types.
    fn exported(r: Record) -> (ExportTraceServiceRequest, Vec<Span>) {
        let mut spans = Vec::new();
        let n = r.encode(&mut spans);
        let resource = otlp_wire::resource([("service.name", otlp_wire::Any::Str("selfheal"))]);
        let body = otlp_wire::request(&resource, &otlp_wire::scope(SCOPE), &spans);
        let req = ExportTraceServiceRequest::decode(&body[..]).unwrap();
        let got = req.resource_spans[0].scope_spans[0].spans.clone();
        assert_eq!(got.len(), n);
        (req, got)
    }

    fn value<'a>(span: &'a Span, key: &str) -> Option<&'a Any> {
        span.attributes
            .iter()
            .find(|kv| kv.key == key)
            .and_then(|kv| kv.value.as_ref()?.value.as_ref())
    }

    fn text(s: &str) -> Option<&'static Any> {
        Some(Box::leak(Box::new(Any::StringValue(s.to_owned()))))
    }

    fn int(i: i64) -> Option<&'static Any> {
        Some(Box::leak(Box::new(Any::IntValue(i))))
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
        let parent = parent_of(&headers(&format!("00-{TRACE}-{CLIENT}-01"), Some("k=v")));
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
        let (req, spans) = exported(r);
        let resource = req.resource_spans[0].resource.as_ref().unwrap();
        assert_eq!(resource.attributes[0].key, "service.name");
        assert_eq!(
            req.resource_spans[0].scope_spans[0]
                .scope
                .as_ref()
                .unwrap()
                .name,
            SCOPE
        );
        let request = &spans[0];
        assert_eq!(request.name, "chat m1");
        assert_eq!(request.kind, SpanKind::Server as i32);
        assert_eq!(
            request.trace_id,
            TraceId::from_hex(TRACE).unwrap().to_bytes()
        );
        assert_eq!(request.span_id, request_id.to_bytes());
        assert_eq!(
            request.parent_span_id,
            SpanId::from_hex(CLIENT).unwrap().to_bytes()
        );
        assert_eq!(request.trace_state, "k=v");
        assert_eq!(request.flags, 0x301, "sampled, with a remote parent");
        assert!(request.start_time_unix_nano > 0);
        assert!(request.end_time_unix_nano >= request.start_time_unix_nano);
        assert_eq!(value(request, "gen_ai.request.model"), text("m1"));
        assert_eq!(
            value(request, "selfheal.endpoint"),
            text("/v1/chat/completions")
        );
        assert_eq!(value(request, "http.response.status_code"), int(200));
        assert_eq!(request.status, None);
        let events: Vec<_> = request.events.iter().map(|e| e.name.as_str()).collect();
        assert_eq!(events, ["selfheal.retry"]);
        assert_eq!(
            request.events[0].attributes[0]
                .value
                .as_ref()
                .unwrap()
                .value,
            Some(Any::StringValue(
                "default/m1: HTTP 503 (waiting 10 ms)".into()
            ))
        );
        for (span, id, number) in [(&spans[1], ids[0], 0), (&spans[2], ids[1], 1)] {
            assert_eq!(span.name, "chat m1");
            assert_eq!(span.kind, SpanKind::Client as i32);
            assert_eq!(span.span_id, id.to_bytes());
            assert_eq!(span.parent_span_id, request_id.to_bytes());
            assert_eq!(span.flags, 0x101);
            assert_eq!(value(span, "selfheal.attempt"), int(number));
            assert_eq!(value(span, "selfheal.upstream"), text("default"));
            assert_eq!(value(span, "gen_ai.operation.name"), text("chat"));
            assert_eq!(value(span, "gen_ai.request.model"), text("m1"));
        }
        let status = spans[1].status.as_ref().unwrap();
        assert_eq!(
            (status.code, status.message.as_str()),
            (StatusCode::Error as i32, "http_503")
        );
        assert_eq!(value(&spans[1], "selfheal.outcome"), text("http_503"));
        assert_eq!(
            value(&spans[2], "selfheal.outcome"),
            text("ok"),
            "ended once"
        );
        assert_eq!(spans[2].status, None);
        assert_eq!(value(&spans[2], "gen_ai.usage.input_tokens"), int(10));
        assert_eq!(value(&spans[1], "gen_ai.usage.input_tokens"), None);
    }

    #[test]
    fn a_request_without_an_attempt_is_named_chat_and_a_5xx_is_an_error() {
        let mut r = Record::start("/v1/responses", None);
        r.status = Some(502);
        let (_, spans) = exported(r);
        assert_eq!(spans[0].name, "chat");
        assert!(spans[0].parent_span_id.is_empty());
        assert_eq!(spans[0].flags, 0x101);
        assert_ne!(spans[0].trace_id, [0; 16]);
        let status = spans[0].status.as_ref().unwrap();
        assert_eq!(
            (status.code, status.message.as_str()),
            (StatusCode::Error as i32, "HTTP 502")
        );
        assert_eq!(value(&spans[0], "gen_ai.request.model"), None);
    }

    #[test]
    fn upstream_gets_the_attempt_in_flights_traceparent_else_the_requests() {
        let header = |(t, s, f): (TraceId, SpanId, TraceFlags)| {
            String::from_utf8(traceparent(t, s, f).to_vec()).unwrap()
        };
        let parent = parent_of(&headers(&format!("00-{TRACE}-{CLIENT}-00"), None));
        let mut r = Record::start("/v1/chat/completions", parent);
        assert!(
            !r.context.is_sampled(),
            "a client that does not sample is followed"
        );
        let request = r.context.span_id();
        assert_eq!(
            header(r.outgoing()),
            format!("00-{TRACE}-{request:016x}-00")
        );
        let i = r.start_attempt(&target("a", "m"), None, 0);
        let attempt = r.attempts[0].span_id;
        assert_ne!(attempt, request);
        assert_eq!(
            header(r.outgoing()),
            format!("00-{TRACE}-{attempt:016x}-00")
        );
        r.end_attempt(i, Some("ok".into()));
        assert_eq!(r.outgoing().1, request);
        let ids = (
            TraceId::from(u128::MAX - 1),
            SpanId::from(0xab),
            TraceFlags::SAMPLED,
        );
        assert_eq!(
            header(ids),
            format!("00-{:032x}-{:016x}-01", u128::MAX - 1, 0xab)
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

    #[test]
    fn the_endpoint_and_headers_are_read_as_the_otlp_exporter_reads_them() {
        let none = TelemetryConfig::default();
        let env = |vars: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                vars.iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| (*v).to_owned())
            }
        };
        assert_eq!(endpoint(&none, &env(&[])), None);
        let base = env(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318/")]);
        assert_eq!(
            endpoint(&none, &base).as_deref(),
            Some("http://c:4318/v1/traces")
        );
        let both = env(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"),
            ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://t:1/x"),
        ]);
        assert_eq!(
            endpoint(&none, &both).as_deref(),
            Some("http://t:1/x"),
            "as is"
        );
        let configured = TelemetryConfig {
            otlp_endpoint: Some("http://cfg:4318/v1/traces".into()),
        };
        assert_eq!(
            endpoint(&configured, &both).as_deref(),
            Some("http://cfg:4318/v1/traces")
        );
        let h = super::headers(&env(&[
            ("OTEL_EXPORTER_OTLP_HEADERS", "ignored=1"),
            (
                "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
                "authorization=Basic%20abc, x-a = b ,bad,=v",
            ),
        ]));
        assert_eq!(h["authorization"], "Basic abc");
        assert_eq!(h["x-a"], "b");
        assert!(h.get("ignored").is_none(), "the traces variable wins");
        assert_eq!(h["content-type"], "application/x-protobuf");
        assert_eq!(percent_decode("a%2"), None);
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
