//! The axum application: routes, and the per-request healing pipeline that ties the modules
//! together (replay → verdict → edit request → upstream → check tool calls → answer).

use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use bytes::Bytes;
use futures_util::future::BoxFuture;
use serde_json::{Value, json};
use tokio::sync::mpsc;

use selfheal_core::budget::{BudgetLimits, Dimension};
use selfheal_core::policy::ActionKind;
use selfheal_runtime::client::{ClientError, Completion, ModelClient};

use crate::config::GatewayConfig;
use crate::error::ApiError;
use crate::heal::{self, ToolIndex};
use crate::metrics::Metrics;
use crate::request::{ChatRequest, Edits};
use crate::runs::{RunState, RunStore, run_id};
use crate::store::{RunSummary, TraceEvent, TraceWriter};
use crate::stream;
use crate::upstream::{CallLog, Upstreams};

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
    guides: Arc<heal::GuideCache>,
    tool_indexes: heal::ToolIndexCache,
    started: Instant,
}

impl AppState {
    /// Builds the state from a validated config.
    pub fn new(config: GatewayConfig, trace: TraceWriter) -> Result<AppState, ClientError> {
        let upstreams = Upstreams::new(&config)?;
        let runs = RunStore::new(
            config.max_runs,
            std::time::Duration::from_secs(config.run_ttl_secs),
            config.monitor.clone(),
            config.budget,
        );
        Ok(AppState {
            config,
            upstreams,
            runs,
            metrics: Metrics::default(),
            trace,
            guides: Arc::new(heal::GuideCache::default()),
            tool_indexes: heal::ToolIndexCache::default(),
            started: Instant::now(),
        })
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    fn event(&self, run: &str, kind: &'static str, detail: Value, summary: Option<RunSummary>) {
        self.trace.send(TraceEvent {
            run: run.to_owned(),
            t_ms: unix_ms(),
            kind,
            detail,
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
        .route("/metrics", get(metrics))
        .route("/v1/models", get(models))
        .route("/v1/chat/completions", post(chat))
        .fallback(not_found)
        .with_state(state)
}

async fn healthz() -> impl IntoResponse {
    axum::Json(json!({"status": "ok"}))
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
        ),
    )
}

async fn models(State(s): State<Arc<AppState>>) -> Response {
    let mut data: Vec<Value> = Vec::new();
    if let Some(u) = s
        .config
        .default_upstream
        .as_ref()
        .and_then(|d| s.upstreams.get(d))
        && let Ok(v) = u.client.get_json("models").await
        && let Some(list) = v.get("data").and_then(Value::as_array)
    {
        data.extend(list.iter().cloned());
    }
    for alias in s.config.models.keys() {
        data.push(json!({"id": alias, "object": "model", "owned_by": "selfheal"}));
    }
    axum::Json(json!({"object": "list", "data": data})).into_response()
}

async fn chat(State(s): State<Arc<AppState>>, headers: HeaderMap, body: Body) -> Response {
    let started = Instant::now();
    Metrics::inc(&s.metrics.requests_total);
    let resp = match chat_inner(&s, &headers, body).await {
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
    resp
}

/// Reads the body: 413 when too large. [`ChatRequest::parse`] then checks it is a chat request.
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
    axum::body::to_bytes(body, limit)
        .await
        .map_err(|_| ApiError::too_large(limit))
}

fn chat_op(c: &ModelClient, b: Bytes) -> BoxFuture<'_, Result<Completion, ClientError>> {
    Box::pin(c.chat_raw(b))
}

fn send_op(c: &ModelClient, b: Bytes) -> BoxFuture<'_, Result<reqwest::Response, ClientError>> {
    Box::pin(c.send_raw("chat/completions", b))
}

fn lock(m: &Mutex<RunState>) -> std::sync::MutexGuard<'_, RunState> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

async fn chat_inner(
    s: &Arc<AppState>,
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
    let streaming = req.stream;
    if s.config.passthrough {
        return passthrough(s, &chain, &req, &bytes).await;
    }

    // 1. Rebuild the run from the conversation and ask the monitor.
    let run = run_id(
        headers.get("x-selfheal-run").and_then(|v| v.to_str().ok()),
        &req.messages,
    );
    let tools = s.tool_indexes.get(&req);
    let state = s.runs.get(&run, Instant::now());
    let now_ms = s.now_ms();
    let (verdict, replayed) = {
        let mut st = lock(&state);
        st.requests += 1;
        let fresh = || RunState::new(s.config.monitor.clone(), s.config.budget);
        let replayed = heal::replay(&mut st, &req.messages, &tools, fresh, now_ms);
        (st.monitor.check(now_ms), replayed)
    };
    s.event(
        &run,
        "request",
        json!({"model": model, "messages": req.messages.len(), "stream": streaming}),
        None,
    );
    for r in &replayed {
        s.event(
            &run,
            "tool_result",
            json!({"tool": r.tool, "outcome": r.outcome}),
            None,
        );
    }
    let mut actions: Vec<String> = Vec::new();

    // 2. Abort: the run ends here, with a final answer that says why.
    if let Some(reason) = verdict.abort.clone() {
        Metrics::inc(&s.metrics.aborts_total);
        let status = {
            let mut st = lock(&state);
            st.act("terminate");
            if st.successes > 0 {
                "partial"
            } else {
                "failed"
            }
        };
        actions.push("terminate".into());
        s.event(&run, "abort", json!({"reason": reason}), None);
        let report = selfheal_report(&state, status, Some(&reason), &actions);
        let content = format!(
            "I have to stop here: {reason}. The work so far is in the conversation above; \
             the remaining steps could not be completed."
        );
        let completion = json!({
            "id": format!("selfheal-{run}"),
            "object": "chat.completion",
            "created": unix_ms() / 1000,
            "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content},
                         "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
            "selfheal": report,
        });
        finish_trace(s, &run, &state, status);
        let mut resp = if streaming {
            let frames = stream::answer_frames(&completion);
            sse_response(Body::from_stream(futures_util::stream::iter(frames)))
        } else {
            axum::Json(completion).into_response()
        };
        add_headers(&mut resp, &run, status, &actions, Some(&reason));
        return Ok(resp);
    }

    // 3. Edit the request per the verdict.
    let applied = heal::apply_verdict(&req, &verdict);
    if !applied.guidance.is_empty() {
        Metrics::inc(&s.metrics.guidance_total);
        actions.push("guidance".into());
        s.event(&run, "guidance", json!({"text": applied.guidance}), None);
    }
    if !applied.hidden.is_empty() {
        Metrics::inc(&s.metrics.tools_hidden_total);
        actions.push("hide".into());
        s.event(&run, "hide", json!({"tools": applied.hidden}), None);
    }
    let edits = applied.edits();
    let encode = |m: &str| {
        req.encode(
            &Edits {
                model: Some(m),
                ..edits
            },
            &bytes,
        )
    };
    let tools_fwd = if applied.hidden.is_empty() {
        tools
    } else {
        let mut t = (*tools).clone();
        t.retain(|name, _| !applied.hidden.contains(name));
        Arc::new(t)
    };
    let charge = charger(state.clone());

    // 4. Upstream.
    let mut log = CallLog::default();
    if streaming {
        let result = s
            .upstreams
            .call(&chain, &encode, &send_op, &charge, false, &mut log)
            .await;
        log_calls(s, &run, &log, &mut actions);
        let upstream = match result {
            Ok(r) => r,
            Err(e) => {
                s.event(&run, "upstream_error", json!({"reasons": e.reasons}), None);
                finish_trace(s, &run, &state, "failed");
                return Err(e);
            }
        };
        let report = selfheal_report(&state, "complete", None, &actions);
        let reask = stream_reask(s, &run, &state, chain, bytes.clone(), &applied, &tools_fwd);
        let (tx, rx) = mpsc::channel(64);
        let s2 = s.clone();
        let run2 = run.clone();
        let state2 = state.clone();
        tokio::spawn(async move {
            let r = stream::relay(
                upstream,
                tools_fwd,
                s2.guides.clone(),
                Some(report),
                Some(reask),
                &tx,
            )
            .await;
            for t in &r.repaired {
                Metrics::inc(&s2.metrics.repairs_total);
                s2.event(&run2, "repair", json!({"tool": t}), None);
            }
            for t in &r.invalid {
                s2.event(&run2, "invalid_call", json!({"problems": [t]}), None);
            }
            let status = if let Some(b) = &r.broken {
                Metrics::inc(&s2.metrics.streams_broken_total);
                s2.event(&run2, "stream_broken", json!({"reason": b}), None);
                "failed"
            } else if r.invalid.is_empty() {
                "complete"
            } else {
                "partial"
            };
            finish_trace(&s2, &run2, &state2, status);
            drop(tx);
        });
        let body =
            futures_util::stream::unfold(
                rx,
                |mut rx| async move { rx.recv().await.map(|f| (f, rx)) },
            );
        let mut resp = sse_response(Body::from_stream(body));
        add_headers(&mut resp, &run, "complete", &actions, None);
        return Ok(resp);
    }

    let result = s
        .upstreams
        .call(&chain, &encode, &chat_op, &charge, false, &mut log)
        .await;
    let mut completion = match result {
        Ok(c) => c.body,
        Err(e) => {
            log_calls(s, &run, &log, &mut actions);
            s.event(&run, "upstream_error", json!({"reasons": e.reasons}), None);
            finish_trace(s, &run, &state, "failed");
            return Err(e);
        }
    };

    // 5. Tool calls: repair in place, or re-ask once within the budget.
    let mut check = check_completion(&mut completion, &tools_fwd, &s.guides);
    if !check.invalid.is_empty() && charge(ActionKind::Retry) {
        Metrics::inc(&s.metrics.reasks_total);
        actions.push("reask".into());
        s.event(&run, "reask", json!({"problems": check.invalid}), None);
        let extra = reask_turn(&check.invalid);
        let again = |m: &str| {
            req.encode(
                &Edits {
                    model: Some(m),
                    append: Some(&extra),
                    ..edits
                },
                &bytes,
            )
        };
        if let Ok(c) = s
            .upstreams
            .call(&chain, &again, &chat_op, &charge, false, &mut log)
            .await
        {
            completion = c.body;
            check = check_completion(&mut completion, &tools_fwd, &s.guides);
        }
    }
    log_calls(s, &run, &log, &mut actions);
    for t in &check.repaired {
        Metrics::inc(&s.metrics.repairs_total);
        s.event(&run, "repair", json!({"tool": t}), None);
    }
    if !check.repaired.is_empty() {
        actions.push("repair".into());
    }
    let (status, reason) = if check.invalid.is_empty() {
        ("complete", None)
    } else {
        s.event(
            &run,
            "invalid_call",
            json!({"problems": check.invalid}),
            None,
        );
        ("partial", Some(check.invalid.join(" ")))
    };
    if let Some(o) = completion.as_object_mut() {
        o.insert(
            "selfheal".into(),
            selfheal_report(&state, status, reason.as_deref(), &actions),
        );
    }
    finish_trace(s, &run, &state, status);
    let mut resp = axum::Json(completion).into_response();
    add_headers(&mut resp, &run, status, &actions, reason.as_deref());
    Ok(resp)
}

/// The user turn that asks the model to redo tool calls that could not be used.
fn reask_turn(problems: &[String]) -> Value {
    json!({"role": "user", "content": format!(
        "Your last answer's tool calls could not be used. {}",
        problems.join(" ")
    )})
}

/// Charges one recovery action to the run's ledger; says whether it was granted.
fn charger(state: Arc<Mutex<RunState>>) -> impl Fn(ActionKind) -> bool + Send + Sync {
    move |k: ActionKind| {
        let mut st = lock(&state);
        let ok = st.ledger.charge(&k.charge()).is_ok();
        if ok {
            st.act(k.as_str());
        }
        ok
    }
}

/// The streaming relay's re-ask: one non-streaming call with the problems appended, charged to
/// the run's budget like the non-streaming re-ask, its answer checked the same way.
fn stream_reask(
    s: &Arc<AppState>,
    run: &str,
    state: &Arc<Mutex<RunState>>,
    chain: Vec<crate::config::Target>,
    bytes: Bytes,
    applied: &heal::Applied,
    tools: &Arc<ToolIndex>,
) -> stream::Reask {
    let (s, run, state, applied, tools) = (
        s.clone(),
        run.to_owned(),
        state.clone(),
        applied.clone(),
        tools.clone(),
    );
    Box::new(move |problems: Vec<String>| {
        Box::pin(async move {
            let charge = charger(state);
            if !charge(ActionKind::Retry) {
                return None;
            }
            Metrics::inc(&s.metrics.reasks_total);
            s.event(&run, "reask", json!({"problems": problems}), None);
            let req = ChatRequest::parse(&bytes).ok()?;
            let extra = reask_turn(&problems);
            let encode = |m: &str| {
                req.encode(
                    &Edits {
                        model: Some(m),
                        append: Some(&extra),
                        stream: Some(false),
                        ..applied.edits()
                    },
                    &bytes,
                )
            };
            let mut log = CallLog::default();
            let result = s
                .upstreams
                .call(&chain, &encode, &chat_op, &charge, false, &mut log)
                .await;
            log_calls(&s, &run, &log, &mut Vec::new());
            let mut body = result.ok()?.body;
            let check = check_completion(&mut body, &tools, &s.guides);
            if !check.invalid.is_empty() {
                return None;
            }
            Some(stream::Reasked {
                message: body.pointer("/choices/0/message").cloned()?,
                finish_reason: body
                    .pointer("/choices/0/finish_reason")
                    .cloned()
                    .unwrap_or_else(|| json!("stop")),
                repaired: check.repaired,
            })
        })
    })
}

fn check_completion(
    completion: &mut Value,
    tools: &ToolIndex,
    guides: &heal::GuideCache,
) -> heal::CallCheck {
    match completion.pointer_mut("/choices/0/message") {
        Some(m) => heal::check_message(m, tools, guides),
        None => heal::CallCheck::default(),
    }
}

fn log_calls(s: &AppState, run: &str, log: &CallLog, actions: &mut Vec<String>) {
    for (kind, detail) in &log.events {
        match *kind {
            "retry" => Metrics::inc(&s.metrics.retries_total),
            "fallback" => Metrics::inc(&s.metrics.fallbacks_total),
            _ => {}
        }
        if !actions.iter().any(|a| a == kind) {
            actions.push((*kind).to_owned());
        }
        s.event(run, kind, json!({"detail": detail}), None);
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
        "budget": {"spent": st.ledger.spent(), "limits": limits_json(st.ledger.limits())},
    })
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

fn finish_trace(s: &AppState, run: &str, state: &Mutex<RunState>, status: &str) {
    let (failures, actions) = {
        let st = lock(state);
        (st.failures, st.ledger.spent().recoveries)
    };
    s.event(
        run,
        "response",
        json!({"status": status}),
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
    chain: &[crate::config::Target],
    req: &ChatRequest<'_>,
    bytes: &Bytes,
) -> Result<Response, ApiError> {
    let never = |_k: ActionKind| false;
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
        .call(chain, &encode, &send_op, &never, true, &mut log)
        .await?;
    if req.stream {
        return Ok(sse_response(Body::from_stream(upstream.bytes_stream())));
    }
    let content_type = upstream
        .headers()
        .get(header::CONTENT_TYPE)
        .cloned()
        .unwrap_or(HeaderValue::from_static("application/json"));
    let bytes = upstream
        .bytes()
        .await
        .map_err(|e| ApiError::exhausted(vec![format!("the upstream answer broke off: {e}")]))?;
    let mut resp = Response::new(Body::from(bytes));
    resp.headers_mut()
        .insert(header::CONTENT_TYPE, content_type);
    Ok(resp)
}
