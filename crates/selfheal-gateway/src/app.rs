//! The axum application: routes, and the per-request healing pipeline that ties the modules
//! together (admit → read → rebuild the run → verdict → edit request → upstream → check tool
//! calls → answer).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use bytes::Bytes;
use futures_util::StreamExt;
use futures_util::future::BoxFuture;
use serde_json::{Value, json};
use tokio::sync::mpsc;

use selfheal_core::budget::{BudgetLimits, Dimension};
use selfheal_core::call::ReaskState;
use selfheal_openai::at::At;
use selfheal_openai::client::{ClientError, Completion};

use crate::answer;
use crate::auth::{Caller, Credentials, Gatekeeper, Redactor};
use crate::config::GatewayConfig;
use crate::config::OnPartial;
use crate::error::ApiError;
use crate::heal::{self, ToolIndex};
use crate::metrics::Metrics;
use crate::recover;
use crate::request::{ChatRequest, Edits};
use crate::responses_stream;
use crate::runs::{RunKey, RunState, RunStore, run_id};
use crate::store::{Detail, Kind, RunSummary, TraceEvent, TraceWriter};
use crate::stream;
use crate::upstream::{CallLog, UpstreamClient, UpstreamError, Upstreams};

/// Why the gateway's state could not be built.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    /// An upstream could not be set up (bad URL, unset key variable).
    #[error(transparent)]
    Upstream(#[from] UpstreamError),
    /// `run_secret_env` names an unset or empty variable.
    #[error("the run secret variable `{0}` is unset or empty")]
    RunSecret(String),
    /// No randomness for the run-id secret.
    #[error("cannot draw a random run-id secret: {0}")]
    Random(String),
    /// The state store (`[state]`) cannot be set up.
    #[error(transparent)]
    Store(#[from] selfheal_state::StoreError),
}

/// Everything the handlers share.
#[derive(Debug)]
pub struct AppState {
    /// The configuration.
    pub config: GatewayConfig,
    /// The upstream clients and breakers.
    pub upstreams: Upstreams,
    /// Per-run state.
    pub runs: RunStore,
    /// Counters.
    pub metrics: Metrics,
    /// The trace writer.
    pub trace: TraceWriter,
    /// Inbound keys and the operator's secrets.
    pub gate: Gatekeeper,
    run_key: RunKey,
    guides: Arc<heal::GuideCache>,
    tool_indexes: heal::ToolIndexCache,
    /// Targets learned not to stream tool calls (see [`NoStream`]).
    pub no_stream: NoStream,
    /// What replicas share (`[state]`): the local tier, synced through the store when there is
    /// one.
    pub shared: selfheal_state::Shared,
    started: Instant,
}

/// What the gateway learns about upstream targets (upstream and model) that cannot stream tool
/// calls — llama-cpp-python's server cannot with an automatic tool choice: a streaming request
/// offering tools that came back empty or broken, and that a non-streaming re-issue healed, is
/// *evidence*. One fault is not enough to change how every tenant is served: a target is asked
/// without streaming (its answer still sent as SSE) only after [`NoStream::EVIDENCE`] such
/// healed faults within [`NoStream::WINDOW`], and only for [`NoStream::TTL`], after which it is
/// streamed again. The requests it changes say so in the `x-selfheal-stream` header, and
/// `/metrics` shows the targets learned now, how often one was learned, and the evidence seen.
/// At most [`NoStream::CAPACITY`] targets are tracked. A target learned here is published to
/// the other replicas through the shared tier (`[state]`), which ask it without streaming too
/// until the same expiry; the evidence itself is counted per replica.
#[derive(Debug, Default)]
pub struct NoStream {
    targets: Mutex<HashMap<(String, String), Learning>>,
    learned_total: std::sync::atomic::AtomicU64,
    evidence_total: std::sync::atomic::AtomicU64,
    shared: Option<selfheal_state::Shared>,
}

/// The evidence against one target and, once learned, until when it holds.
#[derive(Debug, Default)]
struct Learning {
    /// When the newest faults were seen, at most [`NoStream::EVIDENCE`].
    seen: std::collections::VecDeque<Instant>,
    /// Asked without streaming until then.
    until: Option<Instant>,
}

impl NoStream {
    /// Most targets tracked.
    pub const CAPACITY: usize = 256;
    /// Healed faults within [`NoStream::WINDOW`] before a target is asked without streaming.
    pub const EVIDENCE: usize = 3;
    /// The window the evidence must fall within.
    pub const WINDOW: Duration = Duration::from_secs(10 * 60);
    /// How long a target is asked without streaming once learned.
    pub const TTL: Duration = Duration::from_secs(30 * 60);

    /// Learned targets are shared through `shared` with the other replicas.
    pub fn shared(shared: selfheal_state::Shared) -> NoStream {
        NoStream {
            shared: Some(shared),
            ..NoStream::default()
        }
    }

    /// The shared record of `target`, learned not to stream tool calls.
    fn shared_key(target: &crate::config::Target) -> String {
        format!(
            "no_stream:{}",
            json!([target.upstream.as_str(), target.model.as_str()])
        )
    }

    /// Whether `target` is asked without streaming at `now` (learned here or by another
    /// replica, not expired).
    pub fn contains(&self, target: &crate::config::Target, now: Instant) -> bool {
        let Ok(mut m) = self.targets.lock() else {
            return false;
        };
        let key = (target.upstream.clone(), target.model.clone());
        match m.get(&key).and_then(|l| l.until) {
            Some(until) if now < until => return true,
            Some(_) => {
                m.remove(&key);
            }
            None => {}
        }
        drop(m);
        self.shared.as_ref().is_some_and(|s| {
            s.get(&Self::shared_key(target), unix_ms())
                .is_some_and(|r| r.origin != s.origin())
        })
    }

    /// Records one healed fault of `target` at `now`; whether it makes the target learned.
    pub fn observe(&self, target: &crate::config::Target, now: Instant) -> bool {
        use std::sync::atomic::Ordering::Relaxed;
        self.evidence_total.fetch_add(1, Relaxed);
        let Ok(mut m) = self.targets.lock() else {
            return false;
        };
        let key = (target.upstream.clone(), target.model.clone());
        if !m.contains_key(&key) && m.len() >= Self::CAPACITY {
            m.retain(|_, l| l.until.is_some_and(|u| now < u));
            if m.len() >= Self::CAPACITY {
                m.clear();
            }
        }
        let l = m.entry(key).or_default();
        if l.until.is_some_and(|u| now < u) {
            return false;
        }
        l.until = None;
        l.seen
            .retain(|t| now.saturating_duration_since(*t) < Self::WINDOW);
        if l.seen.len() == Self::EVIDENCE {
            l.seen.pop_front();
        }
        l.seen.push_back(now);
        if l.seen.len() < Self::EVIDENCE {
            return false;
        }
        l.seen.clear();
        l.until = Some(now + Self::TTL);
        self.learned_total.fetch_add(1, Relaxed);
        if let Some(s) = &self.shared {
            let ttl = u64::try_from(Self::TTL.as_millis()).unwrap_or(u64::MAX);
            s.publish(
                &Self::shared_key(target),
                "learned",
                unix_ms().saturating_add(ttl),
            );
        }
        true
    }

    /// `/metrics` lines: targets asked without streaming now, times one was learned, evidence.
    fn render(&self, now: Instant) -> String {
        use std::sync::atomic::Ordering::Relaxed;
        let active = self.targets.lock().map_or(0, |m| {
            m.values()
                .filter(|l| l.until.is_some_and(|u| now < u))
                .count()
        });
        format!(
            "# HELP selfheal_no_stream_targets Upstream targets asked without streaming now (learned not to stream tool calls).\n\
             # TYPE selfheal_no_stream_targets gauge\nselfheal_no_stream_targets {active}\n\
             # HELP selfheal_no_stream_learned_total Times a target was learned not to stream tool calls.\n\
             # TYPE selfheal_no_stream_learned_total counter\nselfheal_no_stream_learned_total {}\n\
             # HELP selfheal_no_stream_evidence_total Streams offering tools that broke and a non-streaming re-issue healed.\n\
             # TYPE selfheal_no_stream_evidence_total counter\nselfheal_no_stream_evidence_total {}\n",
            self.learned_total.load(Relaxed),
            self.evidence_total.load(Relaxed),
        )
    }
}

/// The header on a request a learned target changed ([`NoStream`]).
const NO_STREAM_HEADER: &str = "x-selfheal-stream";

/// Marks `resp` as asked without streaming because its target was learned not to stream tool
/// calls.
fn mark_no_stream(resp: &mut Response, target: Option<&crate::config::Target>) {
    let text = target.map_or_else(
        || "off (learned)".to_owned(),
        |t| {
            format!(
                "off (learned: {}/{} cannot stream tool calls)",
                t.upstream, t.model
            )
        },
    );
    if let Ok(v) = HeaderValue::from_str(&text) {
        resp.headers_mut().insert(NO_STREAM_HEADER, v);
    }
}

impl AppState {
    /// Builds the state from a validated config, reading key variables from the environment.
    pub fn new(config: GatewayConfig, trace: TraceWriter) -> Result<AppState, StateError> {
        AppState::with_env(config, trace, |v| std::env::var(v).ok())
    }

    /// Builds the state, reading key variables through `env`.
    pub fn with_env(
        config: GatewayConfig,
        trace: TraceWriter,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<AppState, StateError> {
        let mut upstreams = Upstreams::new(&config, &env)?;
        let shared = crate::shared_tier(&config.state)?;
        upstreams.share(shared.clone());
        let run_key = match &config.run_secret_env {
            Some(var) => RunKey::from_secret(
                &env(var)
                    .filter(|v| !v.is_empty())
                    .ok_or_else(|| StateError::RunSecret(var.clone()))?,
            ),
            None => RunKey::random().map_err(|e| StateError::Random(e.to_string()))?,
        };
        let secrets: Vec<String> = upstreams
            .iter()
            .filter_map(|(_, u)| u.client.operator_key())
            .chain(config.run_secret_env.as_deref().and_then(&env))
            .collect();
        let gate = Gatekeeper::new(&config.inbound_keys, secrets);
        let runs = RunStore::new(
            config.max_runs,
            std::time::Duration::from_secs(config.run_ttl_secs),
            config.monitor.clone(),
            config.budget,
            config.policy.clone(),
        );
        Ok(AppState {
            config,
            upstreams,
            runs,
            metrics: Metrics::default(),
            trace,
            gate,
            run_key,
            guides: Arc::new(heal::GuideCache::default()),
            tool_indexes: heal::ToolIndexCache::default(),
            no_stream: NoStream::shared(shared.clone()),
            shared,
            started: Instant::now(),
        })
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    fn event(
        &self,
        redact: &Redactor,
        run: &Arc<str>,
        kind: Kind,
        detail: impl Into<Detail>,
        summary: Option<RunSummary>,
    ) {
        self.event_at(redact, run, kind, detail, summary, unix_ms());
    }

    /// As [`AppState::event`], for something that happened at `t_ms`.
    fn event_at(
        &self,
        redact: &Redactor,
        run: &Arc<str>,
        kind: Kind,
        detail: impl Into<Detail>,
        summary: Option<RunSummary>,
        t_ms: u64,
    ) {
        self.trace.send(TraceEvent {
            run: Arc::clone(run),
            t_ms,
            kind,
            detail: redact.detail(detail.into()),
            summary,
        });
    }
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// The router.
pub fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .route("/v1/models", get(models))
        .route("/v1/chat/completions", post(chat))
        .route("/v1/embeddings", post(embeddings))
        .route("/v1/responses", post(responses))
        .route("/v1/messages", post(crate::messages::messages))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            guard_head,
        ))
        .with_state(state)
}

/// Most header lines a request may carry (more is a 431).
pub const MAX_HEADERS: usize = 100;

/// 431 in OpenAI's shape for a head with too many or too large headers (hyper's own limit,
/// set well above this one by `serve`, answers a bare 431 only past it).
async fn guard_head(
    State(s): State<Arc<AppState>>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let head_bytes: usize = req
        .headers()
        .iter()
        .map(|(k, v)| k.as_str().len() + v.len() + 4)
        .sum::<usize>()
        + req.uri().to_string().len();
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

async fn healthz() -> impl IntoResponse {
    axum::Json(json!({"status": "ok"}))
}

/// How long `/readyz` waits for an upstream (probes time out in seconds).
const READY_PROBE: std::time::Duration = std::time::Duration::from_secs(2);

/// Ready when at least one upstream answers within [`READY_PROBE`] (any HTTP status: it is
/// reachable). The upstreams are asked at once.
async fn readyz(State(s): State<Arc<AppState>>) -> Response {
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

async fn method_not_allowed() -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "invalid_request_error",
        "method_not_allowed",
        "this endpoint does not accept that method",
    )
}

async fn not_found() -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "invalid_request_error",
        "not_found",
        "no such endpoint",
    )
}

async fn metrics(State(s): State<Arc<AppState>>) -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        s.metrics.render(
            s.runs.len(),
            s.runs.evicted(),
            s.trace.dropped(),
            &s.upstreams.attempt_seconds,
        ) + &s.no_stream.render(Instant::now())
            + &crate::metrics::render_state(&s.shared, s.upstreams.shared_skips()),
    )
}

async fn models(State(s): State<Arc<AppState>>, headers: HeaderMap) -> Response {
    let caller = match s.gate.admit(&headers) {
        Ok(c) => c,
        Err(e) => return e.into_response(),
    };
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

/// `POST /v1/chat/completions`: the healing pipeline's one entry, which the Messages dialect
/// ([`crate::messages`]) enters too, with the chat request it translated.
pub(crate) async fn chat(
    State(s): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let started = Instant::now();
    Metrics::inc(&s.metrics.requests_total);
    let (result, tenant) = match s.gate.admit(&headers) {
        Ok(caller) => {
            let tenant = caller.tenant.clone();
            let redactor = caller.redactor.clone();
            let r = chat_inner(&s, caller, &headers, body).await;
            (r.map_err(|e| redactor.error(e)), tenant)
        }
        Err(e) => (Err(e), "-".to_owned()),
    };
    answered(&s, result, &tenant, started)
}

/// The end of every API request (chat completions and responses alike): an error counted and
/// answered in OpenAI's shape, the request's duration observed, its log line written.
pub(crate) fn answered(
    s: &AppState,
    result: Result<Response, ApiError>,
    tenant: &str,
    started: Instant,
) -> Response {
    let resp = match result {
        Ok(r) => r,
        Err(e) => {
            if e.status == StatusCode::BAD_GATEWAY {
                Metrics::inc(&s.metrics.upstream_errors_total);
            } else {
                Metrics::inc(&s.metrics.client_errors_total);
            }
            e.into_response()
        }
    };
    s.metrics.request_seconds.observe(started.elapsed());
    log_request(&resp, tenant, started);
    resp
}

/// One structured line per request at `info` (what a log pipeline needs to find a run).
fn log_request(resp: &Response, tenant: &str, started: Instant) {
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
}

/// `POST /v1/embeddings`, passed through (see [`forward`]).
async fn embeddings(State(s): State<Arc<AppState>>, headers: HeaderMap, body: Body) -> Response {
    forward(&s, &headers, body, Forwarded::Embeddings).await
}

/// `POST /v1/responses` (OpenAI's Responses API), healed like chat completions where the wire
/// allows: the run's upstream attempts go through the core's call plan (retries, the fallback
/// chain, breakers, the run's ledger); a non-streaming answer's `function_call` items are checked
/// against the request's `tools` through the same non-corrupting repair path, an unusable call is
/// re-asked when the policy allows it and is never forwarded, and the answer carries the
/// `selfheal` report. A streamed answer is healed as a chat stream is
/// ([`responses_stream`]): re-issued invisibly when it breaks before any content, its function
/// calls held until the end and checked, an error event after content.
async fn responses(State(s): State<Arc<AppState>>, headers: HeaderMap, body: Body) -> Response {
    if s.config.passthrough {
        return forward(&s, &headers, body, Forwarded::Responses).await;
    }
    let started = Instant::now();
    // Counted as chat completions are (issue 30: they were missing from both metrics).
    Metrics::inc(&s.metrics.requests_total);
    let (result, tenant) = match s.gate.admit(&headers) {
        Ok(caller) => {
            let tenant = caller.tenant.clone();
            let redactor = caller.redactor.clone();
            let r = responses_inner(&s, caller, &headers, body).await;
            (r.map_err(|e| redactor.error(e)), tenant)
        }
        Err(e) => (Err(e), "-".to_owned()),
    };
    answered(&s, result, &tenant, started)
}

/// The first tool call of a Responses `input`, `(call_id, name)`: its first `function_call`
/// item, else (an input that continues an answer the gateway no longer knows) the call its
/// first `function_call_output` answers, with no name. What names the run when the client gave
/// no label ([`crate::runs::run_id_of`]).
fn responses_first_call(req: &serde_json::Map<String, Value>) -> Option<(&str, &str)> {
    let items = req.get("input").and_then(Value::as_array)?;
    let of = |kind: &str| {
        items
            .iter()
            .filter(|i| crate::heal::item_type(i) == Some(kind))
            .find_map(|i| i.get("call_id").and_then(Value::as_str))
            .map(|id| (id, i_name(items, id)))
    };
    of("function_call").or_else(|| of("function_call_output"))
}

/// The `name` of the `function_call` item of `call_id` in `items`, `""` if none.
fn i_name<'a>(items: &'a [Value], call_id: &str) -> &'a str {
    items
        .iter()
        .filter(|i| crate::heal::item_type(i) == Some("function_call"))
        .find(|i| i.get("call_id").and_then(Value::as_str) == Some(call_id))
        .and_then(|i| i.get("name").and_then(Value::as_str))
        .unwrap_or("")
}

/// The tools of a Responses request (`[{"type": "function", "name", "parameters"}]`).
fn responses_tools(req: &serde_json::Map<String, Value>) -> ToolIndex {
    let mut out = ToolIndex::new();
    for t in req
        .get("tools")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        if crate::heal::item_type(t) != Some("function") {
            continue;
        }
        let Some(name) = t.get("name").and_then(Value::as_str) else {
            continue;
        };
        let parameters = t.get("parameters").cloned().unwrap_or_else(|| json!({}));
        out.insert(
            name.to_owned(),
            heal::ToolSpec {
                schema_key: parameters.to_string(),
                required: selfheal_repair::required_properties(&parameters),
                parameters,
            },
        );
    }
    out
}

/// A Responses request for model `m`, with `extra` appended to its `input` (a re-ask turn).
fn encode_responses(req: &serde_json::Map<String, Value>, m: &str, extra: Option<&Value>) -> Bytes {
    let mut r = req.clone();
    r.insert("model".into(), Value::from(m));
    if let Some(turn) = extra {
        let mut input = match r.remove("input") {
            Some(Value::Array(items)) => items,
            Some(Value::String(text)) => vec![json!({"role": "user", "content": text})],
            Some(other) => vec![other],
            None => Vec::new(),
        };
        input.push(turn.clone());
        r.insert("input".into(), Value::Array(input));
    }
    Bytes::from(serde_json::to_vec(&r).unwrap_or_default())
}

fn responses_json_op<'c>(
    c: &'c UpstreamClient,
    b: Bytes,
    cr: &'c Credentials,
) -> BoxFuture<'c, Result<Value, ClientError>> {
    Box::pin(async move {
        let resp = c.send("responses", b, cr).await?;
        let bytes = crate::upstream::read_bounded(resp, c.max_body()).await?;
        responses_stream::read_response(&bytes)
    })
}

async fn responses_inner(
    s: &Arc<AppState>,
    caller: Caller,
    headers: &HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let bytes = read_body(s, headers, body).await?;
    let req: serde_json::Map<String, Value> = serde_json::from_slice(&bytes)
        .map_err(|e| ApiError::bad_request(format!("the body is not a JSON object: {e}")))?;
    let model = req
        .get("model")
        .and_then(Value::as_str)
        .ok_or_else(|| ApiError::bad_request("`model` must be a string"))?
        .to_owned();
    let chain = s
        .config
        .route(&model)
        .ok_or_else(|| ApiError::unknown_model(&model))?;
    let label = headers.get("x-selfheal-run").and_then(|v| v.to_str().ok());
    // A client that continues an answer (`previous_response_id`) sends only what is new: the
    // run is the one that sent that answer, if this tenant's, and the answer's calls are read
    // with the results that came back for them.
    let previous = req
        .get("previous_response_id")
        .and_then(Value::as_str)
        .map(str::to_owned);
    let previous = previous.as_deref();
    // A client that keeps its conversation upstream (`conversation`: an id, or an object with
    // one) sends only what is new too: the conversation names the run, as a label would.
    let conversation = match req.get("conversation") {
        Some(Value::String(id)) => Some(format!("conversation:{id}")),
        Some(Value::Object(o)) => o
            .get("id")
            .and_then(Value::as_str)
            .map(|id| format!("conversation:{id}")),
        _ => None,
    };
    let now = Instant::now();
    let continued = match (label, previous) {
        (None, Some(p)) => s.runs.run_of_response(p, &caller.tenant, now),
        _ => None,
    };
    let mut unnamed = None;
    let run = match (label, continued) {
        (Some(l), _) if s.runs.owned_by(l, &caller.tenant, now) => l.to_owned(),
        (_, Some(run)) => run,
        _ => {
            let first_input = match req.get("input") {
                Some(Value::Array(items)) => items.first().map(Value::to_string),
                Some(v) => Some(v.to_string()),
                None => None,
            };
            let instructions = req.get("instructions").map(Value::to_string);
            let opening: Vec<(&str, &[u8])> = [
                ("instructions", instructions.as_deref()),
                ("input", first_input.as_deref()),
            ]
            .into_iter()
            .filter_map(|(tag, v)| v.map(|v| (tag, v.as_bytes())))
            .collect();
            let label = label.or(conversation.as_deref());
            let first = responses_first_call(&req);
            if !crate::runs::names_its_run(label, first) {
                unnamed = Some(Arc::new(
                    opening.iter().map(|(k, v)| (*k, v.to_vec())).collect(),
                ));
            }
            crate::runs::run_id_of(&s.run_key, &caller.tenant, label, &opening, first)
        }
    };
    let t = Turn {
        state: if unnamed.is_some() {
            s.runs.detached()
        } else {
            s.runs.get_for(&run, &caller.tenant, now)
        },
        s: s.clone(),
        caller,
        run: run.into(),
        unnamed,
    };
    t.event(
        Kind::Request,
        json!({"model": model, "api": "responses", "tenant": t.caller.tenant}),
    );
    // The tool results in `input` go to the run's monitor, as a chat history's do; its verdict
    // edits the request (guidance in `instructions`, hidden tools out of `tools`) or ends the run.
    let tools = responses_tools(&req);
    let mut req = req;
    let now_ms = s.now_ms();
    let decisions;
    let (verdict, replayed, stop, answered) = {
        let mut st = lock(&t.state);
        st.requests += 1;
        let input = req
            .get("input")
            .and_then(Value::as_array)
            .map_or(&[][..], Vec::as_slice);
        // The calls of the answer continued, ahead of their results, as a full input has them:
        // the answer named by `previous_response_id`, or in a conversation the run's last
        // answer when the input answers its calls and nothing else.
        let continues = |r: &crate::runs::Responded| match previous {
            Some(p) => p == r.id,
            None => conversation.is_some() && r.answered_by(input),
        };
        let with_calls: Vec<Value>;
        let items = match st.last_response.as_ref() {
            Some(r) if continues(r) && !r.calls.is_empty() => {
                with_calls = r.calls.iter().chain(input).cloned().collect();
                &with_calls[..]
            }
            _ => input,
        };
        let ctx = recover::Ctx {
            tools: &s.config.tools,
            offered: &tools,
            fallback: chain.get(1).map(|c| c.model.as_str()),
            seed: now_ms,
            wall_ms: recover::wall_ms(),
        };
        let only_new = previous.is_some() || conversation.is_some();
        let replayed = heal::replay_items(&mut st, items, only_new, &ctx, now_ms);
        let next = recover::take_next(&mut st);
        decisions = st.run.take_records();
        // The calls of the model's previous turn whose values the controller took: a new call
        // identical to one of them is its repetition, re-asked as on chat completions.
        let answered =
            heal::Answered::of_items(items, &repeatable_out(&t, &next.taken), &next.again);
        (st.run.verdict(now_ms), replayed, next, answered)
    };
    let answered = Arc::new(answered);
    // The controller's directives, carried out as the chat path does: guidance lines join the
    // monitor's in `instructions`, repaired tool results replace their `function_call_output`,
    // an escalation sends this request to the chain's next target; a stop ends the run below.
    let recover::Next {
        guidance: directed,
        escalate,
        stop,
        actions: directed_actions,
        replaced,
        again: _,
        taken: _,
    } = stop;
    replace_outputs(&mut req, &replaced);
    let chain = if escalate && stop.is_none() && chain.len() > 1 {
        t.event(Kind::Escalate, json!({"to": chain[1].model}));
        chain[1..].to_vec()
    } else {
        chain
    };
    for r in &replayed {
        t.event(Kind::ToolResult, tool_result_detail(r));
    }
    record_decisions(&t, decisions);
    let newest_failed = replayed.last().is_some_and(|r| failed(r.outcome));
    let stopped = stop.map(|s| match s {
        recover::Stop::Degrade(r) | recover::Stop::Abort(r) => r,
    });
    if let Some(reason) =
        stopped.or_else(|| selfheal_core::call::abort_now(verdict.abort.clone(), newest_failed))
    {
        Metrics::inc(&s.metrics.aborts_total);
        t.event(Kind::Abort, json!({"reason": reason}));
        let actions = vec!["abort".to_owned()];
        let text = format!("selfheal stopped this run: {reason}");
        if s.config.server.on_partial == OnPartial::Error {
            return Ok(partial_error(
                &t,
                "run_stopped",
                &text,
                &actions,
                ("failed", Some(&reason)),
            ));
        }
        t.finish("failed");
        let mut answer = json!({"id": format!("resp_selfheal_{}", t.run), "object": "response",
            "created_at": unix_ms() / 1000, "model": model, "status": "completed",
            "output": [{"type": "message", "id": "msg_selfheal", "role": "assistant",
                        "status": "completed",
                        "content": [{"type": "output_text", "text": text, "annotations": []}]}]});
        if let Some(o) = answer.as_object_mut() {
            o.insert(
                "selfheal".into(),
                selfheal_report(&t.state, "failed", Some(&reason), &actions),
            );
        }
        t.caller.redactor.value(&mut answer);
        let mut resp = if req.get("stream").and_then(Value::as_bool) == Some(true) {
            let frames = responses_stream::answer_frames(&answer);
            sse_response(Body::from_stream(futures_util::stream::iter(frames)))
        } else {
            axum::Json(answer).into_response()
        };
        let reason = t.caller.redactor.text(&reason).into_owned();
        add_headers(&mut resp, &t.run, "failed", &actions, Some(&reason));
        return Ok(resp);
    }
    let mut edited: Vec<String> = directed_actions
        .iter()
        .map(|a| a.as_str().to_owned())
        .collect();
    if !verdict.guidance.is_empty() || !directed.is_empty() {
        let text: Vec<String> = verdict
            .guidance
            .iter()
            .map(|g| g.text.clone())
            .chain(directed)
            .collect();
        let note = format!("[selfheal] {}", text.join("\n"));
        let instructions = match req.get("instructions").and_then(Value::as_str) {
            Some(i) if !i.is_empty() => format!("{i}\n\n{note}"),
            _ => note,
        };
        req.insert("instructions".into(), Value::String(instructions));
        Metrics::inc(&s.metrics.guidance_total);
        edited.push("guidance".to_owned());
        t.event(Kind::Guidance, json!({"text": text}));
    }
    let hidden: Vec<String> = verdict
        .hidden_tools
        .iter()
        .filter(|h| tools.contains_key(h.as_str()))
        .cloned()
        .collect();
    if !hidden.is_empty() {
        if let Some(list) = req.get_mut("tools").and_then(Value::as_array_mut) {
            list.retain(|t| {
                t.get("name")
                    .and_then(Value::as_str)
                    .is_none_or(|n| !hidden.iter().any(|h| h == n))
            });
        }
        let names_hidden = req
            .get("tool_choice")
            .and_then(|c| c.get("name"))
            .and_then(Value::as_str)
            .is_some_and(|n| hidden.iter().any(|h| h == n));
        if names_hidden {
            req.insert("tool_choice".into(), Value::from("auto"));
        }
        Metrics::inc(&s.metrics.tools_hidden_total);
        edited.push("hide".to_owned());
        t.event(Kind::Hide, json!({"tools": hidden}));
    }
    let mut tools = tools;
    tools.retain(|name, _| !hidden.contains(name));
    // Grounded tools' calls are judged against what the request holds.
    let evidence = recover::responses_evidence(&s.config.tools, &req, &tools).map(Arc::new);
    let mut actions = edited;
    let mut log = CallLog::default();
    let wants_stream = req.get("stream").and_then(Value::as_bool) == Some(true);
    // A target learned not to stream tool calls ([`NoStream`]) is asked without streaming and
    // its answer sent as the Responses events a stream would have carried.
    let now = Instant::now();
    let learned = wants_stream
        && !tools.is_empty()
        && chain.first().is_some_and(|c| s.no_stream.contains(c, now));
    if wants_stream && !learned {
        let checks = Checks { answered, evidence };
        return answer_responses_stream(&t, req, chain, tools, checks, actions).await;
    }
    if learned {
        req.insert("stream".into(), Value::Bool(false));
    }
    let encode = |m: &str| encode_responses(&req, m, None);
    let result = t.call(&chain, &encode, &responses_json_op, &mut log).await;
    let mut answer = match result {
        Ok(v) => v,
        Err(e) => {
            log_calls(&t, &log, &mut actions);
            return Err(t.failed(e));
        }
    };
    // A final answer is judged by the core as on chat completions (see `answer_complete`):
    // `partial` over an open failure, or held for the read before answering, which the model
    // is asked for with the guidance appended.
    let mut unsettled = None;
    if !responses_calls(&answer) {
        unsettled = recover::unsettled(&lock(&t.state));
        if let Some(text) = unsettled.is_none().then(|| reread_due(&t)).flatten() {
            if !actions.iter().any(|a| a == "reread") {
                actions.push("reread".into());
            }
            let extra = reread_item(&text);
            let again = |m: &str| encode_responses(&req, m, Some(&extra));
            let called = match t.call(&chain, &again, &responses_json_op, &mut log).await {
                Ok(a) => {
                    answer = a;
                    Some(responses_calls(&answer))
                }
                Err(_) => None,
            };
            unsettled = unread(called, &text);
        }
    }
    // Unusable calls: re-asked as long as the ladder of their class (`heal::unusable_signal`)
    // says so, within the budget; the last usable answer stands, an unusable call is never
    // forwarded.
    let check = check_responses_answer(
        s,
        &mut answer,
        &tools,
        &answered,
        evidence.as_deref().map(Vec::as_slice),
    );
    let (mut repaired, mut invalid) = (check.repaired, check.invalid);
    let mut ladder = ReaskState::default();
    let mut reasked = false;
    // The ladder's escalation moves the re-asks to the chain's next target, as on chat (issue
    // 30: a Responses re-ask never escalated).
    let mut reask_chain: &[crate::config::Target] = &chain;
    while !invalid.is_empty() {
        let Some((next, escalate)) = reask_or_escalate(&t, &invalid, ladder, &mut reask_chain)
        else {
            break;
        };
        ladder = next;
        reasked = true;
        if escalate && !actions.iter().any(|a| a == "escalate") {
            actions.push("escalate".into());
        }
        Metrics::inc(&s.metrics.reasks_total);
        if !actions.iter().any(|a| a == "reask") {
            actions.push("reask".into());
        }
        t.event(Kind::Reask, json!({"problems": invalid}));
        let turn = reask_turn(&invalid);
        let again = |m: &str| encode_responses(&req, m, Some(&turn));
        match t
            .call(reask_chain, &again, &responses_json_op, &mut log)
            .await
        {
            Ok(mut second) => {
                let check = check_responses_answer(
                    s,
                    &mut second,
                    &tools,
                    &answered,
                    evidence.as_deref().map(Vec::as_slice),
                );
                answer = second;
                repaired = check.repaired;
                invalid = check.invalid;
            }
            Err(_) => break,
        }
    }
    // A re-ask answered with a final answer: judged by the core as the first answer would be.
    if unsettled.is_none() && invalid.is_empty() && reasked && !responses_calls(&answer) {
        unsettled = recover::unsettled(&lock(&t.state));
    }
    log_calls(&t, &log, &mut actions);
    for name in &repaired {
        Metrics::inc(&s.metrics.repairs_total);
        t.event(Kind::Repair, json!({"tool": name}));
    }
    if !repaired.is_empty() {
        actions.push("repair".into());
    }
    let (status, reason) = if !invalid.is_empty() {
        t.event(Kind::InvalidCall, json!({"problems": invalid}));
        ("partial", Some(heal::problems_text(&invalid)))
    } else if let Some(why) = unsettled {
        ("partial", Some(why))
    } else {
        ("complete", None)
    };
    // Every call left out: the answer says so in words, or is an error the SDKs raise.
    if !invalid.is_empty() && !responses_calls(&answer) {
        let words = heal::left_out_text(&heal::problem_texts(&invalid));
        if s.config.server.on_partial == OnPartial::Error {
            return Ok(partial_error(
                &t,
                "calls_left_out",
                &words,
                &actions,
                (status, reason.as_deref()),
            ));
        }
        say_in_output(&mut answer, &words);
    }
    if let Some(o) = answer.as_object_mut() {
        o.insert(
            "selfheal".into(),
            selfheal_report(&t.state, status, reason.as_deref(), &actions),
        );
    }
    t.caller.redactor.value(&mut answer);
    remember_response(&t, crate::runs::Responded::of(&answer));
    t.finish(status);
    let mut resp = if learned {
        let frames = responses_stream::answer_frames(&answer);
        sse_response(Body::from_stream(futures_util::stream::iter(frames)))
    } else {
        axum::Json(answer).into_response()
    };
    let reason = reason.map(|r| t.caller.redactor.text(&r).into_owned());
    add_headers(&mut resp, &t.run, status, &actions, reason.as_deref());
    if learned {
        mark_no_stream(&mut resp, chain.first());
    }
    Ok(resp)
}

/// Remembers the Responses answer the run sent (its id and calls), for a client that continues
/// it with `previous_response_id` ([`crate::runs::Responded`]).
fn remember_response(t: &Turn, responded: Option<crate::runs::Responded>) {
    let Some(r) = responded else { return };
    adopt_first_call(
        t,
        r.calls.first().map(|c| {
            (
                c.get("call_id").and_then(Value::as_str).unwrap_or(""),
                c.get("name").and_then(Value::as_str).unwrap_or(""),
            )
        }),
    );
    t.s.runs.responded(&r.id, &t.run);
    lock(&t.state).last_response = Some(r);
}

/// `POST /v1/responses` with `stream: true`: the upstream stream relayed and healed by
/// [`responses_stream::relay`] — preamble and function calls held, a stream broken before any
/// content re-issued, unusable calls re-asked along the ladder, an error event after content.
async fn answer_responses_stream(
    t: &Turn,
    req: serde_json::Map<String, Value>,
    chain: Vec<crate::config::Target>,
    tools: ToolIndex,
    checks: Checks,
    mut actions: Vec<String>,
) -> Result<Response, ApiError> {
    let encode = |m: &str| encode_responses(&req, m, None);
    let mut log = CallLog::default();
    let result = t.call(&chain, &encode, &responses_op, &mut log).await;
    log_calls(t, &log, &mut actions);
    let served = log.served.clone();
    let upstream = result.map_err(|e| t.failed(e))?;
    let report = selfheal_report(&t.state, "complete", None, &actions);
    let again = ResponsesAgain {
        t: t.clone(),
        req: Arc::new(req),
        chain: Arc::new(chain),
        tools: Arc::new(tools),
        checks: checks.clone(),
    };
    let grounded = checks.evidence.map(|evidence| grounding_check(t, evidence));
    let hooks = responses_stream::Hooks {
        reask: Some(again.hook()),
        reissue: Some(again.hook()),
        check: calls_check(checks.answered, grounded),
        reread: Some(again.reread()),
        unsettled: Some(stream_unsettled(t)),
        // Set in the relay's task: the head waits for its first frame.
        head: None,
        budget: Some(stream_budget(t)),
        on_partial: t.s.config.server.on_partial,
    };
    let learnable = served.filter(|_| !again.tools.is_empty());
    let guides = t.s.guides.clone();
    Ok(
        relay_response(t, &actions, learnable, move |tx, head| async move {
            let hooks = responses_stream::Hooks {
                head: Some(head),
                ..hooks
            };
            let r = responses_stream::relay(
                upstream,
                again.tools.clone(),
                guides,
                Some(report),
                hooks,
                &tx,
            )
            .await;
            (r, tx)
        })
        .await,
    )
}

/// Runs a relay in its own task and answers the client with the frames it sends (redacted,
/// as SSE). When the relay is done the run's end is recorded ([`finish_stream`]) before its
/// sender is dropped, so the trace has the `response` event before the client sees the end.
/// The response's head waits for the relay's first frame and carries the report as it stood
/// then ([`stream::head_report`]: the actions taken, a re-read, a `partial` or `failed` already
/// known), not a `complete` written before the upstream answered.
async fn relay_response<F>(
    t: &Turn,
    actions: &[String],
    learnable: Option<crate::config::Target>,
    relay: impl FnOnce(mpsc::Sender<stream::Frame>, stream::Head) -> F,
) -> Response
where
    F: Future<Output = (stream::StreamReport, mpsc::Sender<stream::Frame>)> + Send + 'static,
{
    let (tx, rx) = mpsc::channel(64);
    let (head_tx, head_rx) = tokio::sync::oneshot::channel();
    let run = relay(tx, head_tx);
    let t2 = t.clone();
    tokio::spawn(async move {
        let (r, tx) = run.await;
        finish_stream(&t2, &r, learnable.as_ref());
        drop(tx);
    });
    let head = head_rx.await.ok();
    let redactor = t.caller.redactor.clone();
    let body = futures_util::stream::unfold((rx, redactor), |(mut rx, red)| async move {
        let frame = rx.recv().await?;
        Some((frame.map(|b| red.bytes(b)), (rx, red)))
    });
    let mut resp = sse_response(Body::from_stream(body));
    let text = |k: &str| head.as_ref().and_then(|h| h.get(k)).and_then(Value::as_str);
    let status = text("status").unwrap_or("complete");
    let reason = text("reason").map(|r| t.caller.redactor.text(r).into_owned());
    let actions: Vec<String> = match head.as_ref().and_then(|h| h.get("actions")) {
        Some(Value::Array(a)) => a
            .iter()
            .filter_map(Value::as_str)
            .map(str::to_owned)
            .collect(),
        _ => actions.to_vec(),
    };
    add_headers(&mut resp, &t.run, status, &actions, reason.as_deref());
    resp
}

/// The grounding check of held calls ([`recover::take_ungrounded`]) against `evidence` read
/// while the request was at hand (the relay runs after it is gone).
fn grounding_check(t: &Turn, evidence: Arc<Vec<Value>>) -> stream::Check {
    let s = t.s.clone();
    Box::new(move |calls: &mut Vec<Value>| {
        recover::take_ungrounded(&s.config.tools, calls, &evidence)
    })
}

/// Records how a relayed stream ended (repairs, unusable calls, a re-issue, a break) and the
/// run's `response` event. A stream offering tools that broke and was healed by a
/// non-streaming re-issue teaches the gateway that its target (`learnable`) cannot stream tool
/// calls ([`NoStream`]).
fn finish_stream(t: &Turn, r: &stream::StreamReport, learnable: Option<&crate::config::Target>) {
    for name in &r.repaired {
        Metrics::inc(&t.s.metrics.repairs_total);
        t.event(Kind::Repair, json!({"tool": name}));
    }
    for p in &r.invalid {
        t.event(Kind::InvalidCall, json!({"problems": [p]}));
    }
    if let Some(why) = &r.reissued {
        t.event(Kind::Reissue, json!({"reason": why}));
        if let Some(target) = learnable
            && t.s.no_stream.observe(target, Instant::now())
        {
            t.event(
                Kind::LearnNoStream,
                json!({"upstream": target.upstream, "model": target.model}),
            );
        }
    }
    let status = if let Some(b) = &r.broken {
        Metrics::inc(&t.s.metrics.streams_broken_total);
        t.event(Kind::StreamBroken, json!({"reason": b}));
        "failed"
    } else if r.invalid.is_empty() && r.unsettled.is_none() {
        "complete"
    } else {
        "partial"
    };
    if r.broken.is_none() {
        adopt_first_call(
            t,
            r.first_call.as_ref().map(|(i, n)| (i.as_str(), n.as_str())),
        );
        remember_response(t, r.responded.clone());
    }
    t.finish(status);
}

/// What a Responses stream's second asking needs (owned: it runs in the relay's task).
#[derive(Clone)]
struct ResponsesAgain {
    t: Turn,
    req: Arc<serde_json::Map<String, Value>>,
    chain: Arc<Vec<crate::config::Target>>,
    tools: Arc<ToolIndex>,
    /// The further checks of its answers' calls.
    checks: Checks,
}

/// What a Responses request's answers are checked against beyond their tools' schemas, read
/// while the request was at hand.
#[derive(Clone)]
struct Checks {
    /// The calls of the model's previous turn whose results it has ([`heal::Answered`]).
    answered: Arc<heal::Answered>,
    /// The grounding evidence, when a grounded tool is offered.
    evidence: Option<Arc<Vec<Value>>>,
}

/// A Responses answer's `function_call` items checked ([`responses_stream::check_response`]:
/// repaired in place, or taken out as unusable), then those that repeat the model's previous
/// turn (`answered`) and, when a grounded tool is offered (`evidence`), the calls of grounded
/// tools the request does not support ([`recover::take_ungrounded`]) taken out — as a chat
/// answer's ([`check_completion`]).
fn check_responses_answer(
    s: &AppState,
    answer: &mut Value,
    tools: &ToolIndex,
    answered: &heal::Answered,
    evidence: Option<&[Value]>,
) -> heal::CallCheck {
    let mut check = responses_stream::check_response(answer, tools, &s.guides);
    if let Some(items) = answer.get_mut("output").and_then(Value::as_array_mut) {
        check.invalid.extend(answered.take_repeated(items));
        if let Some(evidence) = evidence {
            check
                .invalid
                .extend(recover::take_ungrounded(&s.config.tools, items, evidence));
        }
    }
    check
}

impl ResponsesAgain {
    /// Non-streaming calls through the chain, charged to the run like the chat stream's
    /// ([`stream_reask`]): with problems, a re-ask along the ladder of their class; without,
    /// a re-issue decided by the core's `stream_broke`; each answer checked, and unusable calls
    /// in it re-asked in turn.
    fn hook(&self) -> responses_stream::Reask {
        let me = self.clone();
        Box::new(move |problems: Vec<heal::Problem>| Box::pin(me.ask(problems, None)))
    }

    /// [`ResponsesAgain::hook`]'s calls. With `guidance` (the read before answering), the
    /// first call appends it as a system message and needs no decision of its own; unusable
    /// calls in its answer are re-asked in turn.
    async fn ask(
        self,
        problems: Vec<heal::Problem>,
        guidance: Option<Value>,
    ) -> Option<responses_stream::Reanswered> {
        let t = &self.t;
        let mut problems = problems;
        let mut guidance = guidance;
        let mut ladder = ReaskState::default();
        // The ladder's escalation moves the re-asks to the chain's next target, as on chat.
        let mut chain: &[crate::config::Target] = &self.chain;
        loop {
            let extra = match guidance.take() {
                Some(g) => Some(g),
                None if problems.is_empty() => {
                    if !reissue_granted(t) {
                        return None;
                    }
                    t.event(Kind::Reissue, json!({"stream": false}));
                    None
                }
                None => {
                    let (next, _) = reask_or_escalate(t, &problems, ladder, &mut chain)?;
                    ladder = next;
                    Metrics::inc(&t.s.metrics.reasks_total);
                    t.event(Kind::Reask, json!({"problems": problems}));
                    Some(reask_turn(&problems))
                }
            };
            let mut req = (*self.req).clone();
            req.insert("stream".into(), Value::Bool(false));
            let encode = |m: &str| encode_responses(&req, m, extra.as_ref());
            let mut log = CallLog::default();
            let result = t.call(chain, &encode, &responses_json_op, &mut log).await;
            log_calls(t, &log, &mut Vec::new());
            let mut response = result.ok()?;
            let check = check_responses_answer(
                &t.s,
                &mut response,
                &self.tools,
                &self.checks.answered,
                self.checks.evidence.as_deref().map(Vec::as_slice),
            );
            if !check.invalid.is_empty() {
                problems = check.invalid;
                continue;
            }
            return Some(responses_stream::Reanswered {
                response,
                repaired: check.repaired,
            });
        }
    }

    /// The read before answering of a streamed Responses answer, decided and asked as for a
    /// chat stream ([`stream_reread`]).
    fn reread(&self) -> stream::ReadAgain<responses_stream::Reanswered> {
        let me = self.clone();
        Box::new(move || {
            Box::pin(async move {
                let text = reread_due(&me.t)?;
                let extra = reread_item(&text);
                let answer = me.ask(Vec::new(), Some(extra)).await;
                let called = answer.as_ref().map(|a| responses_calls(&a.response));
                Some(stream::Reread {
                    answer,
                    unread: unread(called, &text),
                })
            })
        })
    }
}

/// The read before answering's guidance as a system message: appended to a chat request's
/// `messages`, or a Responses `input` item.
fn reread_item(text: &str) -> Value {
    json!({"role": "system", "content": format!("[selfheal] {text}")})
}

/// Whether a Responses answer calls tools (has a `function_call` item).
fn responses_calls(response: &Value) -> bool {
    response
        .get("output")
        .and_then(Value::as_array)
        .is_some_and(|o| {
            o.iter()
                .any(|i| crate::heal::item_type(i) == Some("function_call"))
        })
}

/// The endpoints the gateway forwards without healing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Forwarded {
    Embeddings,
    Responses,
}

fn embed_op<'c>(
    c: &'c UpstreamClient,
    b: Bytes,
    cr: &'c Credentials,
) -> BoxFuture<'c, Result<reqwest::Response, ClientError>> {
    Box::pin(c.send("embeddings", b, cr))
}

fn responses_op<'c>(
    c: &'c UpstreamClient,
    b: Bytes,
    cr: &'c Credentials,
) -> BoxFuture<'c, Result<reqwest::Response, ClientError>> {
    Box::pin(c.send("responses", b, cr))
}

/// Forwards a request as is: the caller admitted, the model routed (an alias's first target,
/// its model name written in), one attempt, the answer — a stream when `stream` is true — read
/// bounded and redacted.
async fn forward(s: &AppState, headers: &HeaderMap, body: Body, what: Forwarded) -> Response {
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

async fn forward_inner(
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

/// Reads the body within the body-read timeout: 413 when too large, 408 when too slow.
/// [`ChatRequest::parse`] then checks it is a chat request.
pub(crate) async fn read_body(
    s: &AppState,
    headers: &HeaderMap,
    body: Body,
) -> Result<Bytes, ApiError> {
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

fn chat_op<'c>(
    c: &'c UpstreamClient,
    b: Bytes,
    cr: &'c Credentials,
) -> BoxFuture<'c, Result<Completion, ClientError>> {
    Box::pin(c.chat(b, cr))
}

/// [`chat_op`] that keeps a plain answer as bytes ([`answer::read`]).
fn answer_op<'c>(
    c: &'c UpstreamClient,
    b: Bytes,
    cr: &'c Credentials,
) -> BoxFuture<'c, Result<answer::Answer, ClientError>> {
    Box::pin(async move {
        let resp = c.send("chat/completions", b, cr).await?;
        let bytes = crate::upstream::read_bounded(resp, c.max_body()).await?;
        crate::telemetry::usage_of(&bytes);
        answer::read(bytes)
    })
}

fn send_op<'c>(
    c: &'c UpstreamClient,
    b: Bytes,
    cr: &'c Credentials,
) -> BoxFuture<'c, Result<reqwest::Response, ClientError>> {
    Box::pin(c.send("chat/completions", b, cr))
}

fn lock(m: &Mutex<RunState>) -> std::sync::MutexGuard<'_, RunState> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// One request's context once its run is known: the state, the caller, the run.
#[derive(Clone)]
struct Turn {
    s: Arc<AppState>,
    caller: Caller,
    run: Arc<str>,
    state: Arc<Mutex<RunState>>,
    /// The conversation's opening when the request did not name its run (no label, no tool
    /// call yet): the run then takes the name of the first call it answers with
    /// ([`adopt_first_call`]).
    unnamed: Option<Arc<Opening>>,
}

/// A conversation's opening as run ids read it ([`crate::runs::run_id_of`]).
type Opening = Vec<(&'static str, Vec<u8>)>;

/// Stores the turn's detached run under the name of `call`, `(id, tool name)`, the first tool
/// call it answers with, so that the conversation's next request — which carries that call —
/// continues it ([`crate::runs::RunStore::adopt`]), and under the id it was answered with.
fn adopt_first_call(t: &Turn, call: Option<(&str, &str)>) {
    let (Some(opening), Some(call)) = (&t.unnamed, call) else {
        return;
    };
    let opening: Vec<(&str, &[u8])> = opening.iter().map(|(k, v)| (*k, &v[..])).collect();
    let to = crate::runs::run_id_of(&t.s.run_key, &t.caller.tenant, None, &opening, Some(call));
    let now = Instant::now();
    t.s.runs.adopt(&t.state, &to, &t.caller.tenant, now);
    // Under the id it was answered with too (`x-selfheal-run`, which a client may send back).
    t.s.runs.adopt(&t.state, &t.run, &t.caller.tenant, now);
}

/// The first tool call of a chat completion, `(id, tool name)`.
fn completion_first_call(completion: &Value) -> Option<(&str, &str)> {
    let c = completion.pointer("/choices/0/message/tool_calls/0")?;
    Some((
        c.get("id").and_then(Value::as_str).unwrap_or(""),
        c.pointer("/function/name")
            .and_then(Value::as_str)
            .unwrap_or(""),
    ))
}

impl Turn {
    /// Calls `op` along `chain` within this run (its ledger, the caller's credentials): the
    /// core's call plan decides the retries and fall-backs (see [`Upstreams::call`]).
    async fn call<T>(
        &self,
        chain: &[crate::config::Target],
        encode: &(dyn Fn(&str) -> Bytes + Send + Sync),
        op: crate::upstream::Op<'_, T>,
        log: &mut CallLog,
    ) -> Result<T, ApiError> {
        self.s
            .upstreams
            .call(
                chain,
                encode,
                op,
                Some(&self.state),
                &self.caller.credentials,
                log,
            )
            .await
    }

    /// Records an event of this run, secrets redacted.
    fn event(&self, kind: Kind, detail: impl Into<Detail>) {
        self.s
            .event(&self.caller.redactor, &self.run, kind, detail, None);
    }

    /// Records the run's `response` event with its summary.
    fn finish(&self, status: &str) {
        finish_trace(self, status);
    }

    /// Ends the turn on an upstream failure: the `upstream_error` event with its reasons, the
    /// run's `failed` response, and the error to answer the client with.
    fn failed(&self, e: ApiError) -> ApiError {
        self.event(Kind::UpstreamError, json!({"reasons": e.reasons}));
        self.finish("failed");
        e
    }
}

async fn chat_inner(
    s: &Arc<AppState>,
    caller: Caller,
    headers: &HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let bytes = read_body(s, headers, body).await?;
    let req = ChatRequest::parse(&bytes).map_err(|e| ApiError::bad_request(e.0))?;
    let model = req.model.as_str().to_owned();
    let chain = s
        .config
        .route(&model)
        .ok_or_else(|| ApiError::unknown_model(&model))?;
    if s.config.passthrough {
        return passthrough(s, &caller, &chain, &req, &bytes).await;
    }
    // A label names a run within the caller's tenant: the id this tenant was answered (sent
    // back as is), else a keyed hash of tenant and label (or opening).
    let label = headers.get("x-selfheal-run").and_then(|v| v.to_str().ok());
    let now = Instant::now();
    let (run, unnamed) = match label {
        Some(l) if s.runs.owned_by(l, &caller.tenant, now) => (l.to_owned(), None),
        _ => {
            let first = crate::runs::chat_first_call(&req.messages);
            let first = first.as_ref().map(|(i, n)| (i.as_str(), n.as_str()));
            let unnamed = (!crate::runs::names_its_run(label, first))
                .then(|| Arc::new(crate::runs::chat_opening(&req.messages)));
            (
                run_id(&s.run_key, &caller.tenant, label, &req.messages),
                unnamed,
            )
        }
    };
    let t = Turn {
        state: if unnamed.is_some() {
            s.runs.detached()
        } else {
            s.runs.get_for(&run, &caller.tenant, now)
        },
        s: s.clone(),
        caller,
        run: run.into(),
        unnamed,
    };
    let tools = s.tool_indexes.get(&req);
    let (verdict, newest_failed, next, answered) = rebuild_run(&t, &req, &tools, &model, &chain);
    match next.stop {
        Some(recover::Stop::Degrade(reason)) => {
            return Ok(answer_abort(&t, &model, req.stream, &reason, "degrade"));
        }
        Some(recover::Stop::Abort(reason)) => {
            return Ok(answer_abort(&t, &model, req.stream, &reason, "terminate"));
        }
        None => {}
    }
    if let Some(reason) = selfheal_core::call::abort_now(verdict.abort.clone(), newest_failed) {
        return Ok(answer_abort(&t, &model, req.stream, &reason, "terminate"));
    }
    let mut actions: Vec<String> = next.actions.iter().map(|a| a.as_str().to_owned()).collect();
    // The calls of the model's previous turn whose results it has: a new call identical to one
    // of them is its repetition, re-asked by the core's ladder like any unusable call.
    let mut applied = edit_request(&t, &req, &verdict, &next.guidance, &mut actions);
    applied.replaced = next.replaced;
    // The controller's escalation: this request goes to the chain's next target.
    let chain = if next.escalate && chain.len() > 1 {
        t.event(Kind::Escalate, json!({"to": chain[1].model}));
        chain[1..].to_vec()
    } else {
        chain
    };
    let tools_fwd = if applied.hidden.is_empty() {
        tools
    } else {
        let mut idx = (*tools).clone();
        idx.retain(|name, _| !applied.hidden.contains(name));
        Arc::new(idx)
    };
    let ctx = Call {
        chain,
        bytes: bytes.clone(),
        applied,
        tools: tools_fwd,
        answered: Arc::new(answered),
    };
    let learned = req.stream
        && !ctx.tools.is_empty()
        && ctx
            .chain
            .first()
            .is_some_and(|c| s.no_stream.contains(c, Instant::now()));
    if req.stream && !learned {
        answer_stream(&t, &req, ctx, actions).await
    } else {
        let mut resp = answer_complete(&t, &req, &ctx, actions).await?;
        if learned {
            mark_no_stream(&mut resp, ctx.chain.first());
        }
        Ok(resp)
    }
}

/// What the upstream call of one request needs: the chain, the client's body, the edits and
/// the tools the request offers after hiding.
#[derive(Clone)]
struct Call {
    chain: Vec<crate::config::Target>,
    bytes: Bytes,
    applied: heal::Applied,
    tools: Arc<ToolIndex>,
    /// The calls of the model's previous turn whose results it has ([`heal::Answered`]).
    answered: Arc<heal::Answered>,
}

/// Stage 1: feeds the conversation's new tool results to the run's monitor; its verdict,
/// whether the newest of those results failed (the abort rule's condition), what the
/// controller has the request carry out, and the calls of the model's previous turn whose
/// values the controller took ([`heal::Answered`]: a new call identical to one of them is the
/// model's repetition, re-asked by the core's ladder like any unusable call).
fn rebuild_run(
    t: &Turn,
    req: &ChatRequest<'_>,
    tools: &ToolIndex,
    model: &str,
    chain: &[crate::config::Target],
) -> (
    selfheal_core::monitor::Verdict,
    bool,
    recover::Next,
    heal::Answered,
) {
    let now_ms = t.s.now_ms();
    let ctx = recover::Ctx {
        tools: &t.s.config.tools,
        offered: tools,
        fallback: chain.get(1).map(|c| c.model.as_str()),
        seed: now_ms,
        wall_ms: recover::wall_ms(),
    };
    let (verdict, replayed, next, decisions) = {
        let mut st = lock(&t.state);
        st.requests += 1;
        let replayed = heal::replay(&mut st, &req.messages, &ctx, now_ms);
        let next = recover::take_next(&mut st);
        for a in &next.actions {
            st.act(a.as_str());
        }
        let decisions = st.run.take_records();
        (st.run.verdict(now_ms), replayed, next, decisions)
    };
    t.event(
        Kind::Request,
        Detail::of(&RequestDetail {
            messages: req.messages.len(),
            model,
            stream: req.stream,
            tenant: &t.caller.tenant,
        }),
    );
    for r in &replayed {
        t.event(Kind::ToolResult, tool_result_detail(r));
    }
    record_decisions(t, decisions);
    if !next.actions.is_empty() {
        t.event(Kind::Recover, json!({"actions": next.actions}));
    }
    let newest_failed = replayed.last().is_some_and(|r| failed(r.outcome));
    let answered = heal::Answered::of(&req.messages, &repeatable_out(t, &next.taken), &next.again);
    (verdict, newest_failed, next, answered)
}

/// The calls a new call could repeat (`taken`, `(tool, arguments hash)`), less those of tools
/// the operator marked `repeatable` (polled, a clock): those may be called again as they were.
/// Borrowed as it is in the common case, where none of them is.
fn repeatable_out<'a>(
    t: &Turn,
    taken: &'a [(String, u64)],
) -> std::borrow::Cow<'a, [(String, u64)]> {
    let repeatable = |tool: &str| t.s.config.tools.get(tool).is_some_and(|c| c.repeatable);
    if !taken.iter().any(|(tool, _)| repeatable(tool)) {
        return std::borrow::Cow::Borrowed(taken);
    }
    taken
        .iter()
        .filter(|(tool, _)| !repeatable(tool))
        .cloned()
        .collect::<Vec<_>>()
        .into()
}

/// Whether a replayed result's outcome is a failure (the abort rule's condition).
fn failed(outcome: &str) -> bool {
    matches!(outcome, "hard" | "soft")
}

/// Stage 2 (abort): the run ends here, with a final answer that says why.
fn answer_abort(
    t: &Turn,
    model: &str,
    streaming: bool,
    reason: &str,
    action: &'static str,
) -> Response {
    let s = &t.s;
    Metrics::inc(&s.metrics.aborts_total);
    let status = {
        let mut st = lock(&t.state);
        st.act(action);
        if st.successes > 0 {
            "partial"
        } else {
            "failed"
        }
    };
    let actions = vec![action.to_owned()];
    t.event(Kind::Abort, json!({"reason": reason, "action": action}));
    let report = selfheal_report(&t.state, status, Some(reason), &actions);
    let content = format!(
        "I have to stop here: {reason}. The work so far is in the conversation above; \
         the remaining steps could not be completed."
    );
    if s.config.server.on_partial == OnPartial::Error {
        return partial_error(t, "run_stopped", &content, &actions, (status, Some(reason)));
    }
    let mut completion = json!({
        "id": format!("selfheal-{}", t.run),
        "object": "chat.completion",
        "created": unix_ms() / 1000,
        "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": content},
                     "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
        "selfheal": report,
    });
    t.caller.redactor.value(&mut completion);
    t.finish(status);
    let mut resp = if streaming {
        let frames = stream::answer_frames(&completion);
        sse_response(Body::from_stream(futures_util::stream::iter(frames)))
    } else {
        axum::Json(completion).into_response()
    };
    add_headers(
        &mut resp,
        &t.run,
        status,
        &actions,
        Some(&t.caller.redactor.text(reason)),
    );
    resp
}

/// Stage 3: what the verdict changes in the request (guidance, hidden tools), recorded.
fn edit_request(
    t: &Turn,
    req: &ChatRequest<'_>,
    verdict: &selfheal_core::monitor::Verdict,
    recovery: &[String],
    actions: &mut Vec<String>,
) -> heal::Applied {
    let s = &t.s;
    let applied = heal::apply_verdict(req, verdict, recovery);
    if !applied.guidance.is_empty() {
        Metrics::inc(&s.metrics.guidance_total);
        actions.push("guidance".into());
        t.event(Kind::Guidance, json!({"text": applied.guidance}));
    }
    if !applied.hidden.is_empty() {
        Metrics::inc(&s.metrics.tools_hidden_total);
        actions.push("hide".into());
        t.event(Kind::Hide, json!({"tools": applied.hidden}));
    }
    applied
}

/// Stage 4 (streaming): the upstream stream relayed, tool calls held and checked.
async fn answer_stream(
    t: &Turn,
    req: &ChatRequest<'_>,
    ctx: Call,
    mut actions: Vec<String>,
) -> Result<Response, ApiError> {
    let edits = ctx.applied.edits();
    let encode = |m: &str| {
        req.encode(
            &Edits {
                model: Some(m),
                ..edits
            },
            &ctx.bytes,
        )
    };
    let mut log = CallLog::default();
    let result = t.call(&ctx.chain, &encode, &send_op, &mut log).await;
    log_calls(t, &log, &mut actions);
    let upstream = result.map_err(|e| t.failed(e))?;
    let served = log.served.clone();
    let report = selfheal_report(&t.state, "complete", None, &actions);
    let hooks = stream::Hooks {
        reask: Some(stream_reask(t, &ctx)),
        reissue: Some(stream_reask(t, &ctx)),
        check: stream_check(t, req, &ctx),
        reread: Some(stream_reread(t, &ctx)),
        unsettled: Some(stream_unsettled(t)),
        // Set in the relay's task: the head waits for its first frame.
        head: None,
        budget: Some(stream_budget(t)),
        on_partial: t.s.config.server.on_partial,
    };
    let learnable = served.filter(|_| !ctx.tools.is_empty());
    let guides = t.s.guides.clone();
    Ok(
        relay_response(t, &actions, learnable, move |tx, head| async move {
            let hooks = stream::Hooks {
                head: Some(head),
                ..hooks
            };
            let r = stream::relay(
                upstream,
                ctx.tools.clone(),
                guides,
                Some(report),
                hooks,
                &tx,
            )
            .await;
            (r, tx)
        })
        .await,
    )
}

/// The further check of a stream's held calls: the calls that repeat the model's previous turn
/// ([`heal::Answered`]) and, when the request offers a grounded tool, the grounding check, whose
/// evidence is read now, while the request is at hand (the relay runs after it is gone).
fn stream_check(t: &Turn, req: &ChatRequest<'_>, ctx: &Call) -> Option<stream::Check> {
    let grounding = recover::Grounding {
        tools: &t.s.config.tools,
        messages: &req.messages,
    };
    let grounded = grounding
        .any_grounded(ctx.tools.keys().map(String::as_str))
        .then(|| grounding_check(t, Arc::new(grounding.evidence())));
    calls_check(ctx.answered.clone(), grounded)
}

/// The further check of a streamed answer's usable calls, chat or Responses alike: those that
/// repeat the model's previous turn (`answered`) taken out, then those the grounding check
/// (`grounded`) refuses; `None` when neither can refuse a call.
fn calls_check(
    answered: Arc<heal::Answered>,
    grounded: Option<stream::Check>,
) -> Option<stream::Check> {
    match grounded {
        None if answered.is_empty() => None,
        None => Some(Box::new(move |calls: &mut Vec<Value>| {
            answered.take_repeated(calls)
        })),
        Some(grounded) => Some(Box::new(move |calls: &mut Vec<Value>| {
            let mut problems = answered.take_repeated(calls);
            problems.extend(grounded(calls));
            problems
        })),
    }
}

/// Stages 4–6 (non-streaming): the upstream call, its tool calls checked (repaired in place or
/// re-asked once within the budget), the answer with its `selfheal` report — as SSE when the
/// client asked for a stream from a target learned not to stream tool calls ([`NoStream`]).
async fn answer_complete(
    t: &Turn,
    req: &ChatRequest<'_>,
    ctx: &Call,
    mut actions: Vec<String>,
) -> Result<Response, ApiError> {
    let s = &t.s;
    let edits = Edits {
        stream: req.stream.then_some(false),
        ..ctx.applied.edits()
    };
    let bytes = &ctx.bytes;
    let encode = |m: &str| {
        req.encode(
            &Edits {
                model: Some(m),
                ..edits
            },
            bytes,
        )
    };
    let mut log = CallLog::default();
    let result = t.call(&ctx.chain, &encode, &answer_op, &mut log).await;
    let mut answer = match result {
        Ok(a) => a,
        Err(e) => {
            log_calls(t, &log, &mut actions);
            return Err(t.failed(e));
        }
    };
    // A final answer is judged by the core as its `finish` would judge the run: with a failure
    // open or unresolved it is `partial` (in-process such a run never reaches its answer).
    // Otherwise the core's read before answering: the final answer of a run that needed a
    // recovery is held, and the model asked to read its unconfirmed values once more first.
    let mut unsettled = None;
    if !answer.calls_tools() {
        unsettled = recover::unsettled(&lock(&t.state));
        if let Some(text) = unsettled.is_none().then(|| reread_due(t)).flatten() {
            if !actions.iter().any(|a| a == "reread") {
                actions.push("reread".into());
            }
            let extra = reread_item(&text);
            let again = |m: &str| {
                req.encode(
                    &Edits {
                        model: Some(m),
                        append: Some(&extra),
                        ..edits
                    },
                    bytes,
                )
            };
            // The read is the model's to ask for. An upstream that fails, or a model that answers
            // again without the call, leaves the answer unread: it goes out `partial`, not
            // claimed as if the read had confirmed it.
            match t.call(&ctx.chain, &again, &answer_op, &mut log).await {
                Ok(a) if a.calls_tools() => answer = a,
                Ok(a) => {
                    answer = a;
                    unsettled = Some(format!("not read again before answering: {text}"));
                }
                Err(_) => {
                    unsettled = Some(format!(
                        "not read again before answering (the upstream failed): {text}"
                    ));
                }
            }
        }
    }
    // The common case: every tool call usable as written; the upstream's bytes go back with
    // the report spliced in (see `answer`). A call of a `grounded` tool is judged against the
    // conversation first, on the parsed path below.
    if let answer::Answer::Plain(plain) = &answer
        && !req.stream
        && unsettled.is_none()
        && !(plain.called().next().is_none()
            && !ctx.tools.is_empty()
            && answer::may_write_calls(&plain.bytes))
        && plain.calls_usable(&ctx.tools, &s.guides)
        && !plain.repeats(&ctx.answered)
        && !plain
            .called()
            .any(|n| s.config.tools.get(n).is_some_and(|c| c.grounded))
    {
        let bytes = &plain.bytes;
        let mut plain_actions = actions.clone();
        call_actions(&log, &mut plain_actions);
        let report = selfheal_report_bytes(&t.state, "complete", None, &plain_actions);
        if let Some(body) = answer::with_report(bytes, &report, &t.caller.redactor) {
            log_calls(t, &log, &mut actions);
            // Parsed only for a fresh run's first answer with calls (rare): its name.
            if t.unnamed.is_some()
                && plain.called().next().is_some()
                && let Ok(v) = serde_json::from_slice::<Value>(bytes)
            {
                adopt_first_call(t, completion_first_call(&v));
            }
            t.finish("complete");
            let mut resp = Response::new(Body::from(body));
            resp.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
            add_headers(&mut resp, &t.run, "complete", &actions, None);
            return Ok(resp);
        }
    }
    let mut completion = match answer.into_completion() {
        Ok(c) => c.body,
        Err(e) => {
            // Not reached: a plain answer passed the checks `parse_completion` makes.
            let e = ApiError::exhausted(vec![e.to_string()]);
            log_calls(t, &log, &mut actions);
            return Err(t.failed(e));
        }
    };

    // Tool calls: repair in place, or re-ask as long as the policy's ladder says so, within
    // the budget (each re-ask climbs the ladder of the one failure: unusable calls).
    let tools_fwd = &ctx.tools;
    let grounding = recover::Grounding {
        tools: &s.config.tools,
        messages: &req.messages,
    };
    let salvage = !req.tool_choice_none();
    let mut check = check_completion(
        &mut completion,
        tools_fwd,
        &s.guides,
        &ctx.answered,
        grounding,
        salvage,
    );
    let mut ladder = ReaskState::default();
    let mut reasked = false;
    let mut chain: &[crate::config::Target] = &ctx.chain;
    while !check.invalid.is_empty() {
        let Some((next, escalate)) = reask_or_escalate(t, &check.invalid, ladder, &mut chain)
        else {
            break;
        };
        ladder = next;
        reasked = true;
        if escalate && !actions.iter().any(|a| a == "escalate") {
            actions.push("escalate".into());
        }
        Metrics::inc(&s.metrics.reasks_total);
        if !actions.iter().any(|a| a == "reask") {
            actions.push("reask".into());
        }
        t.event(Kind::Reask, json!({"problems": check.invalid}));
        let extra = reask_turn(&check.invalid);
        let again = |m: &str| {
            req.encode(
                &Edits {
                    model: Some(m),
                    append: Some(&extra),
                    ..edits
                },
                bytes,
            )
        };
        match t.call(chain, &again, &chat_op, &mut log).await {
            Ok(c) => {
                completion = c.body;
                check = check_completion(
                    &mut completion,
                    tools_fwd,
                    &s.guides,
                    &ctx.answered,
                    grounding,
                    salvage,
                );
            }
            Err(_) => break,
        }
    }
    // A re-ask answered with a final answer: judged by the core as the first answer would be.
    if unsettled.is_none()
        && check.invalid.is_empty()
        && reasked
        && completion
            .pointer("/choices/0/message/tool_calls")
            .and_then(Value::as_array)
            .is_none_or(Vec::is_empty)
    {
        unsettled = recover::unsettled(&lock(&t.state));
    }
    log_calls(t, &log, &mut actions);
    for name in &check.repaired {
        Metrics::inc(&s.metrics.repairs_total);
        t.event(Kind::Repair, json!({"tool": name}));
    }
    if !check.repaired.is_empty() {
        actions.push("repair".into());
    }
    if check.salvaged > 0 {
        // Tool calls written as text, taken as calls (issue 31).
        Metrics::inc(&s.metrics.repairs_total);
        t.event(Kind::Repair, json!({"salvaged": check.salvaged}));
        actions.push("salvage".into());
    }
    let (status, reason) = if !check.invalid.is_empty() {
        t.event(Kind::InvalidCall, json!({"problems": check.invalid}));
        ("partial", Some(heal::problems_text(&check.invalid)))
    } else if let Some(why) = unsettled {
        ("partial", Some(why))
    } else {
        ("complete", None)
    };
    // Every call left out: the answer says so in words, or is an error the SDKs raise.
    let calls_left = completion
        .pointer("/choices/0/message/tool_calls")
        .and_then(Value::as_array)
        .is_some_and(|c| !c.is_empty());
    if !check.invalid.is_empty() && !calls_left {
        let words = heal::left_out_text(&heal::problem_texts(&check.invalid));
        if s.config.server.on_partial == OnPartial::Error {
            return Ok(partial_error(
                t,
                "calls_left_out",
                &words,
                &actions,
                (status, reason.as_deref()),
            ));
        }
        if let Some(m) = completion.pointer_mut("/choices/0/message") {
            heal::say(m, &words);
        }
    }
    if let Some(o) = completion.as_object_mut() {
        o.insert(
            "selfheal".into(),
            selfheal_report(&t.state, status, reason.as_deref(), &actions),
        );
    }
    adopt_first_call(t, completion_first_call(&completion));
    t.caller.redactor.value(&mut completion);
    t.finish(status);
    let mut resp = if req.stream {
        sse_response(Body::from_stream(futures_util::stream::iter(
            stream::answer_frames(&completion),
        )))
    } else {
        axum::Json(completion).into_response()
    };
    let reason = reason.map(|r| t.caller.redactor.text(&r).into_owned());
    add_headers(&mut resp, &t.run, status, &actions, reason.as_deref());
    Ok(resp)
}

/// Puts `words` in a Responses answer: as an `output_text` part of its last `message` item,
/// or as a message item of its own when it has none.
fn say_in_output(answer: &mut Value, words: &str) {
    let part = json!({"type": "output_text", "text": words, "annotations": []});
    let Some(output) = answer.get_mut("output").and_then(Value::as_array_mut) else {
        if let Some(o) = answer.as_object_mut() {
            o.insert("output".into(), json!([]));
            say_in_output(answer, words);
        }
        return;
    };
    let message = output
        .iter_mut()
        .rev()
        .find(|i| crate::heal::item_type(i) == Some("message"))
        .and_then(|m| m.get_mut("content"))
        .and_then(Value::as_array_mut);
    match message {
        Some(content) => content.push(part),
        None => output.push(
            json!({"type": "message", "id": "msg_selfheal", "role": "assistant",
                                   "status": "completed", "content": [part]}),
        ),
    }
}

/// The error a client configured with `[server] on_partial = "error"` gets in place of an
/// answer the gateway had to write itself (`code`: `calls_left_out` or `run_stopped`), with the
/// run's headers and its `status` (`partial` or `failed`).
fn partial_error(
    t: &Turn,
    code: &'static str,
    words: &str,
    actions: &[String],
    (status, reason): (&str, Option<&str>),
) -> Response {
    t.finish(status);
    let words = t.caller.redactor.text(words).into_owned();
    let mut resp = ApiError::partial(code, words).into_response();
    let reason = reason.map(|r| t.caller.redactor.text(r).into_owned());
    add_headers(&mut resp, &t.run, status, actions, reason.as_deref());
    resp
}

/// The user turn that asks the model to redo tool calls that could not be used.
fn reask_turn(problems: &[heal::Problem]) -> Value {
    json!({"role": "user", "content": format!(
        "Your last answer's tool calls could not be used. {}",
        heal::problems_text(problems)
    )})
}

/// Writes the run's decisions about the tool results of a request (signals, classes, actions
/// with their inputs, tools routed around) to its trace, where `selfheal trace replay` decides
/// them again under another policy.
fn record_decisions(t: &Turn, decisions: Vec<(u64, selfheal_core::trace::Event)>) {
    for (_, event) in decisions {
        t.event(
            Kind::from(&event),
            serde_json::to_value(&event).unwrap_or(Value::Null),
        );
    }
}

/// Hands the run a decision about the model's answer (its calls unusable, its stream broken),
/// writes the run's decision records to this turn's trace and returns what the run decided.
fn run_decides(t: &Turn, input: selfheal_core::run::Input<'_>) -> Vec<selfheal_core::run::Action> {
    let (actions, records) = {
        let mut st = lock(&t.state);
        let mut rng = time_rng();
        let mut breakers = selfheal_core::call::Breakers::none();
        let actions = st.decide(input, t.s.now_ms(), &mut rng, &mut breakers);
        (actions, st.run.take_records())
    };
    for (_, event) in records {
        t.event(
            Kind::from(&event),
            serde_json::to_value(&event).unwrap_or(Value::Null),
        );
    }
    actions
}

/// Whether the run re-asks the model for tool calls that cannot be used (charged to the run's
/// ledger and counted as its recovery when it does): the core's decision on the problems'
/// signal ([`heal::unusable_signal`]) at `state`, the failure's place on its ladder, along
/// `chain`, whose second target is the fallback the ladder may escalate to. `Some((next state,
/// escalate))` when it does: the caller passes the state on if the new answer cannot be used
/// either, so the ladder, not the gateway, says when to stop; on an escalation `chain` is
/// advanced to the fallback (the re-ask and what follows go there) and the run records it.
/// Every API re-asks through it (chat and Responses, streaming or not).
fn reask_or_escalate(
    t: &Turn,
    problems: &[heal::Problem],
    state: ReaskState,
    chain: &mut &[crate::config::Target],
) -> Option<(ReaskState, bool)> {
    let fallback = chain.get(1).map(|c| c.model.clone());
    let actions = run_decides(
        t,
        selfheal_core::run::Input::CallsUnusable {
            signal: heal::unusable_signal(problems),
            fallback: fallback.as_deref(),
            state,
        },
    );
    let (next, escalate) = actions.into_iter().find_map(|a| match a {
        selfheal_core::run::Action::Reask { next, escalate } => Some((next, escalate)),
        _ => None,
    })?;
    lock(&t.state).act("reask");
    if escalate && chain.len() > 1 {
        // The ladder's escalation: the fallback model is asked from here on.
        *chain = &chain[1..];
        t.event(
            Kind::Escalate,
            json!({"to": chain.first().map(|c| &c.model)}),
        );
    }
    Some((next, escalate))
}

/// Whether the run re-issues a stream that broke before any content (charged when it does).
fn reissue_granted(t: &Turn) -> bool {
    let actions = run_decides(
        t,
        selfheal_core::run::Input::StreamBroke {
            after_content: false,
        },
    );
    let granted = actions
        .iter()
        .any(|a| matches!(a, selfheal_core::run::Action::Reissue));
    if granted {
        lock(&t.state).act("reissue");
    }
    granted
}

/// Jitter for backoffs, seeded from the clock (the core's decisions stay reproducible from
/// their inputs; the gateway's inputs include the time).
fn time_rng() -> selfheal_core::rng::SplitMix64 {
    selfheal_core::rng::SplitMix64::new(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64),
    )
}

/// The streaming relay's second asking: non-streaming calls through the chain, charged to the
/// run's budget like the non-streaming re-ask, each answer checked the same way. With problems,
/// they are appended as a user turn (a re-ask of unusable tool calls, repeated while the
/// policy's ladder allows); without, the same request is asked again (a re-issue of a stream
/// that broke before any content), and unusable calls in that answer are re-asked in turn.
fn stream_reask(t: &Turn, ctx: &Call) -> stream::Reask {
    let (t, ctx) = (t.clone(), ctx.clone());
    Box::new(move |problems: Vec<heal::Problem>| Box::pin(ask_again(t, ctx, problems, None)))
}

/// [`stream_reask`]'s calls. With `guidance` (the read before answering), the first call
/// appends it as a system message, as the non-streaming path does, and needs no decision of
/// its own (the core's `reread_due` made it); unusable calls in its answer are re-asked in turn.
async fn ask_again(
    t: Turn,
    ctx: Call,
    problems: Vec<heal::Problem>,
    guidance: Option<Value>,
) -> Option<stream::Reasked> {
    let s = &t.s;
    let req = ChatRequest::parse(&ctx.bytes).ok()?;
    let mut problems = problems;
    let mut guidance = guidance;
    let mut ladder = ReaskState::default();
    // The ladder's escalation moves the re-asks to the chain's next target, as the
    // non-streaming re-ask does.
    let mut chain: &[crate::config::Target] = &ctx.chain;
    loop {
        let extra = match guidance.take() {
            Some(g) => Some(g),
            None if problems.is_empty() => {
                if !reissue_granted(&t) {
                    return None;
                }
                t.event(Kind::Reissue, json!({"stream": false}));
                None
            }
            None => {
                let (next, _) = reask_or_escalate(&t, &problems, ladder, &mut chain)?;
                ladder = next;
                Metrics::inc(&s.metrics.reasks_total);
                t.event(Kind::Reask, json!({"problems": problems}));
                Some(reask_turn(&problems))
            }
        };
        let encode = |m: &str| {
            req.encode(
                &Edits {
                    model: Some(m),
                    append: extra.as_ref(),
                    stream: Some(false),
                    ..ctx.applied.edits()
                },
                &ctx.bytes,
            )
        };
        let mut log = CallLog::default();
        let result = t.call(chain, &encode, &chat_op, &mut log).await;
        log_calls(&t, &log, &mut Vec::new());
        let mut body = result.ok()?.body;
        let grounding = recover::Grounding {
            tools: &s.config.tools,
            messages: &req.messages,
        };
        // A stream's re-ask is asked without streaming: its answer is whole, so calls written
        // as text are taken here as on the non-streaming path.
        let check = check_completion(
            &mut body,
            &ctx.tools,
            &s.guides,
            &ctx.answered,
            grounding,
            !req.tool_choice_none(),
        );
        if !check.invalid.is_empty() {
            problems = check.invalid;
            continue;
        }
        return Some(stream::Reasked {
            message: body.at("/choices/0/message").cloned()?,
            finish_reason: body
                .at("/choices/0/finish_reason")
                .cloned()
                .unwrap_or_else(|| json!("stop")),
            repaired: check.repaired,
        });
    }
}

/// The read before answering of a streamed final answer ([`stream::Hooks::reread`]), decided
/// as the non-streaming path decides it: nothing when the run is unsettled (the answer goes
/// out `partial` instead), else the core's `reread_due` ([`recover::reread_before_answer`]);
/// when due, the request asked again with the guidance appended ([`ask_again`]). An answer
/// without a tool call, or none, leaves the value unread.
fn stream_reread(t: &Turn, ctx: &Call) -> stream::ReadAgain<stream::Reasked> {
    let (t, ctx) = (t.clone(), ctx.clone());
    Box::new(move || {
        Box::pin(async move {
            let text = reread_due(&t)?;
            let extra = reread_item(&text);
            let answer = ask_again(t, ctx, Vec::new(), Some(extra)).await;
            let called = answer.as_ref().map(|a| {
                a.message
                    .get("tool_calls")
                    .and_then(Value::as_array)
                    .is_some_and(|c| !c.is_empty())
            });
            Some(stream::Reread {
                answer,
                unread: unread(called, &text),
            })
        })
    })
}

/// Whether a final answer is held for the read before answering: its guidance, when the run is
/// settled and the core's `reread_due` says so (recorded as guidance).
fn reread_due(t: &Turn) -> Option<String> {
    let text = {
        let mut st = lock(&t.state);
        if recover::unsettled(&st).is_some() {
            return None;
        }
        recover::reread_before_answer(&mut st)?
    };
    t.event(Kind::Guidance, json!({"text": [text]}));
    Some(text)
}

/// Why an answer to the read before answering leaves the value unread: it called no tool
/// (`Some(false)`), or there was none (`None`).
fn unread(called: Option<bool>, text: &str) -> Option<String> {
    match called {
        Some(true) => None,
        Some(false) => Some(format!("not read again before answering: {text}")),
        None => Some(format!(
            "not read again before answering (no usable answer to the request for it): {text}"
        )),
    }
}

/// The run's budget as the final report of a stream shows it ([`stream::Hooks::budget`]).
fn stream_budget(t: &Turn) -> stream::Budget {
    let state = t.state.clone();
    Box::new(move || budget_json(&lock(&state)))
}

/// The report's `budget`: what the run spent and its limits.
fn budget_json(st: &RunState) -> Value {
    json!({"spent": st.ledger().spent(), "limits": limits_json(st.ledger().limits())})
}

/// The core's judgement of a streamed final answer ([`stream::Hooks::unsettled`]):
/// [`recover::unsettled`] on the run's state when the answer ends.
fn stream_unsettled(t: &Turn) -> stream::Unsettled {
    let state = t.state.clone();
    Box::new(move || recover::unsettled(&lock(&state)))
}

/// Puts the gateway's repair of a tool result in place of the `output` of its
/// `function_call_output` item (by `call_id`), as the chat path replaces a `tool` message.
fn replace_outputs(req: &mut serde_json::Map<String, Value>, replaced: &[(String, String)]) {
    if replaced.is_empty() {
        return;
    }
    let Some(items) = req.get_mut("input").and_then(Value::as_array_mut) else {
        return;
    };
    for item in items {
        if crate::heal::item_type(item) != Some("function_call_output") {
            continue;
        }
        let Some(id) = item.get("call_id").and_then(Value::as_str) else {
            continue;
        };
        if let Some((_, text)) = replaced.iter().find(|(r, _)| r == id)
            && let Some(o) = item.as_object_mut()
        {
            o.insert("output".into(), Value::String(text.clone()));
        }
    }
}

/// A chat answer's tool calls checked: repaired in place or taken out as unusable
/// ([`heal::check_message`]), then those that repeat the model's previous turn (`answered`) and
/// those the grounding check refuses taken out; the problems of those taken out.
fn check_completion(
    completion: &mut Value,
    tools: &ToolIndex,
    guides: &heal::GuideCache,
    answered: &heal::Answered,
    grounding: recover::Grounding<'_>,
    salvage: bool,
) -> heal::CallCheck {
    let ending = selfheal_repair::Ending::from_finish_reason(
        completion
            .at("/choices/0/finish_reason")
            .and_then(Value::as_str),
    );
    let check = match completion.at_mut("/choices/0/message") {
        Some(m) => {
            // Calls written as text become calls first, then face the same checks.
            let none = ToolIndex::new();
            let offered = if salvage { tools } else { &none };
            let salvaged = match heal::salvage_text_calls(m, offered) {
                heal::Salvage::None => 0,
                heal::Salvage::Taken(n) => n,
                heal::Salvage::Doubt(problem) => {
                    return heal::CallCheck {
                        invalid: vec![problem],
                        ..heal::CallCheck::default()
                    };
                }
            };
            let mut check = heal::check_message(m, tools, guides, ending);
            check.salvaged = salvaged;
            check.invalid.extend(answered.check(m));
            check.invalid.extend(grounding.check(m));
            check
        }
        None => heal::CallCheck::default(),
    };
    // Calls written as text were taken: the choice ends in tool calls.
    if check.salvaged > 0
        && completion.at("/choices/0/message/tool_calls").is_some()
        && let Some(f) = completion.at_mut("/choices/0/finish_reason")
    {
        *f = Value::String("tool_calls".into());
    }
    // Every call was taken out: the choice no longer ends in tool calls.
    let no_calls = completion.at("/choices/0/message/tool_calls").is_none();
    if !check.invalid.is_empty()
        && no_calls
        && let Some(f) = completion.at_mut("/choices/0/finish_reason")
        && f.as_str() == Some("tool_calls")
    {
        *f = Value::String("stop".into());
    }
    check
}

/// Adds the kinds of the call's events (retry, fallback, ...) to `actions`, each once.
fn call_actions(log: &CallLog, actions: &mut Vec<String>) {
    for e in &log.events {
        if !actions.iter().any(|a| a == e.kind.as_str()) {
            actions.push(e.kind.as_str().to_owned());
        }
    }
}

/// Records the call's decisions and events (trace, metrics) and adds their kinds to `actions`.
fn log_calls(t: &Turn, log: &CallLog, actions: &mut Vec<String>) {
    call_actions(log, actions);
    let s = &t.s;
    // The core's typed decision events: the schema `selfheal trace replay` reads.
    for (t_ms, e) in &log.decisions {
        let detail = serde_json::to_value(e).unwrap_or(Value::Null);
        s.event_at(
            &t.caller.redactor,
            &t.run,
            Kind::from(e),
            detail,
            None,
            *t_ms,
        );
    }
    for e in &log.events {
        let (kind, detail) = (e.kind, &e.detail);
        if kind == Kind::Retry {
            Metrics::inc(&s.metrics.retries_total);
        } else if kind == Kind::Fallback {
            Metrics::inc(&s.metrics.fallbacks_total);
        }
        tracing::debug!(target: "selfheal::upstream", run = &*t.run, kind = kind.as_str(), detail = %t.caller.redactor.text(detail));
        s.event_at(
            &t.caller.redactor,
            &t.run,
            kind,
            json!({"detail": detail}),
            None,
            e.t_ms,
        );
    }
}

fn selfheal_report(
    state: &Mutex<RunState>,
    status: &str,
    reason: Option<&str>,
    actions: &[String],
) -> Value {
    let st = lock(state);
    json!({
        "status": status,
        "reason": reason,
        "failures": st.failures,
        "actions": actions,
        "budget": budget_json(&st),
    })
}

/// [`selfheal_report`] written as JSON text, without building a `Value`: the same keys and
/// values.
fn selfheal_report_bytes(
    state: &Mutex<RunState>,
    status: &str,
    reason: Option<&str>,
    actions: &[String],
) -> Vec<u8> {
    let st = lock(state);
    let report = Report {
        actions,
        budget: BudgetReport {
            limits: LimitsReport(st.ledger().limits()),
            spent: st.ledger().spent(),
        },
        failures: st.failures,
        reason,
        status,
    };
    // About 330 bytes: one allocation, not a buffer grown from empty a field at a time.
    let mut out = Vec::with_capacity(512);
    match serde_json::to_writer(&mut out, &report) {
        Ok(()) => out,
        Err(_) => Vec::new(),
    }
}

/// The `selfheal` report as [`selfheal_report`] builds it, for writing straight to text.
#[derive(serde::Serialize)]
struct Report<'a> {
    actions: &'a [String],
    budget: BudgetReport<'a>,
    failures: u64,
    reason: Option<&'a str>,
    status: &'a str,
}

#[derive(serde::Serialize)]
struct BudgetReport<'a> {
    limits: LimitsReport<'a>,
    spent: &'a selfheal_core::budget::Amounts,
}

/// [`limits_json`] as a serializer: an unlimited dimension is `null`.
struct LimitsReport<'a>(&'a BudgetLimits);

impl serde::Serialize for LimitsReport<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = s.serialize_map(Some(Dimension::ALL.len()))?;
        for d in Dimension::ALL {
            let v = self.0.get(d);
            map.serialize_entry(&d, &(v != u64::MAX).then_some(v))?;
        }
        map.end()
    }
}

/// Budget limits for clients: an unlimited dimension is `null`, not `u64::MAX`, which
/// JavaScript cannot even read exactly.
fn limits_json(limits: &BudgetLimits) -> Value {
    Value::Object(
        Dimension::ALL
            .into_iter()
            .map(|d| {
                let v = limits.get(d);
                (d.to_string(), (v != u64::MAX).then_some(v).into())
            })
            .collect(),
    )
}

/// A chat request's `request` event (fields in the order `json!` would sort them, so the
/// trace reads as it did when these were maps).
#[derive(serde::Serialize)]
struct RequestDetail<'a> {
    messages: usize,
    model: &'a str,
    stream: bool,
    tenant: &'a str,
}

/// A `tool_result` event.
#[derive(serde::Serialize)]
struct ToolResultDetail<'a> {
    outcome: &'a str,
    tool: &'a str,
}

fn tool_result_detail(r: &heal::Replayed) -> Detail {
    Detail::of(&ToolResultDetail {
        outcome: r.outcome,
        tool: &r.tool,
    })
}

/// A `response` event.
#[derive(serde::Serialize)]
struct ResponseDetail<'a> {
    status: &'a str,
}

fn finish_trace(t: &Turn, status: &str) {
    let (failures, actions) = {
        let st = lock(&t.state);
        (st.failures, st.ledger().spent().recoveries)
    };
    t.s.event(
        &t.caller.redactor,
        &t.run,
        Kind::Response,
        Detail::of(&ResponseDetail { status }),
        Some(RunSummary {
            status: status.to_owned(),
            failures,
            actions,
        }),
    );
}

fn add_headers(
    resp: &mut Response,
    run: &str,
    status: &str,
    actions: &[String],
    reason: Option<&str>,
) {
    let h = resp.headers_mut();
    let mut put = |name: &'static str, value: String| {
        // The common case, a value that is already clean, goes in as it is.
        if value.len() <= 512 && value.bytes().all(|b| b.is_ascii() && !b.is_ascii_control()) {
            if let Ok(v) = HeaderValue::try_from(value) {
                h.insert(HeaderName::from_static(name), v);
            }
            return;
        }
        let clean: String = value
            .chars()
            .map(|c| {
                if c.is_ascii() && !c.is_ascii_control() {
                    c
                } else {
                    '?'
                }
            })
            .take(512)
            .collect();
        if let Ok(v) = HeaderValue::from_str(&clean) {
            h.insert(HeaderName::from_static(name), v);
        }
    };
    put("x-selfheal-run", run.to_owned());
    put("x-selfheal-status", status.to_owned());
    put("x-selfheal-actions", actions.join(","));
    if let Some(r) = reason {
        put("x-selfheal-reason", r.to_owned());
    }
}

fn sse_response(body: Body) -> Response {
    let mut resp = Response::new(body);
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    resp
}

/// Forward only: one attempt, the first model of the chain, no run state. The request is
/// normalised (a shape fix, not healing); the answer goes back byte for byte.
async fn passthrough(
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

#[cfg(test)]
mod tests {
    use super::*;

    fn target(model: &str) -> crate::config::Target {
        crate::config::Target {
            upstream: "local".into(),
            model: model.into(),
        }
    }

    /// Issue 30: one healed fault switched a target to non-streaming for every tenant for the
    /// life of the process. Learning now needs repeated evidence within a window and expires.
    #[test]
    fn issue_30_learning_not_to_stream_needs_repeated_evidence_and_expires() {
        let ns = NoStream::default();
        let (m, t0) = (target("m"), Instant::now());
        let at = |s: u64| t0 + Duration::from_secs(s);
        assert!(!ns.observe(&m, at(0)), "one fault teaches nothing");
        assert!(!ns.contains(&m, at(1)));
        assert!(!ns.observe(&m, at(10)));
        assert!(!ns.contains(&m, at(11)));
        // Evidence older than the window does not count: the first fault has aged out.
        let late = NoStream::WINDOW.as_secs() + 5;
        assert!(!ns.observe(&m, at(late)), "two faults in the window");
        assert!(
            ns.observe(&m, at(late + 1)),
            "the third within the window teaches it"
        );
        assert!(ns.contains(&m, at(late + 2)));
        assert!(
            !ns.contains(&target("other"), at(late + 2)),
            "only that target"
        );
        let text = ns.render(at(late + 2));
        assert!(text.contains("selfheal_no_stream_targets 1\n"), "{text}");
        assert!(
            text.contains("selfheal_no_stream_learned_total 1\n"),
            "{text}"
        );
        assert!(
            text.contains("selfheal_no_stream_evidence_total 4\n"),
            "{text}"
        );
        // It expires: streamed again, and learnt again only on new evidence.
        let expired = at(late + 1) + NoStream::TTL;
        assert!(!ns.contains(&m, expired));
        assert!(
            ns.render(expired)
                .contains("selfheal_no_stream_targets 0\n")
        );
        assert!(!ns.observe(&m, expired));
        assert!(!ns.contains(&m, expired));
    }

    #[test]
    fn no_stream_tracks_a_bounded_number_of_targets() {
        let ns = NoStream::default();
        let t0 = Instant::now();
        for i in 0..(NoStream::CAPACITY * 2) {
            ns.observe(&target(&format!("m{i}")), t0);
        }
        assert!(ns.targets.lock().unwrap().len() <= NoStream::CAPACITY);
    }
}
