//! # selfheal-gateway — an OpenAI-compatible proxy that heals any agent
//!
//! Most agents are not written in Rust. Pointing an agent's `base_url` at this gateway gives it
//! self-healing without a code change. Model gateways retry and fall back between *models*; this
//! one also sees the agent's *tool* loop, because every request carries the whole conversation:
//!
//! ```text
//!  agent ──POST /v1/chat/completions──► gateway ─────────────────────────────► upstream
//!            (whole conversation)        │ 0 admit: inbound key, tenant, creds    (its key or
//!                                        │ 1 replay new tool results → Monitor     the agent's;
//!                                        │ 2 verdict: guidance / hide / abort      retries,
//!                                        │ 3 edit request (or answer: abort)       fallback
//!                                        │ 4 upstream call ───────────────────────► chain,
//!        ◄──── answer + `selfheal` ──────│ 5 check tool calls: repair / re-ask      breaker)
//!                                        └ every decision → SQLite trace (keys redacted)
//! ```
//!
//! Runs are scoped to the caller's tenant (`auth`, `runs`); every API (chat completions,
//! Responses, Anthropic Messages) is one dialect over one healing pipeline (`pipeline`); streams
//! are relayed with tool calls held back and re-issued when they break before any content, by
//! one relay generic over each API's event grammar (`relay`); every upstream answer and every
//! client connection is bounded in time and size (`upstream`, [`serve`]). What every API route
//! runs through — the request log, admission, error redaction, the body limits — is a set of
//! route layers (`layers`).
//!
//! The modules are private: the crate root re-exports what the CLI, the benchmark and the tests
//! use (the server, its configuration and state, the stream relays and the texts of the
//! controller's guidance).
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use selfheal_gateway::{GatewayConfig, TraceWriter, serve};
//! let config = GatewayConfig::for_upstream("http://127.0.0.1:8080/v1");
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:7420").await?;
//! serve(config, listener, TraceWriter::disabled(), std::future::pending()).await?;
//! # Ok(()) }
//! ```

mod action;
mod answer;
mod app;
mod auth;
mod clock;
mod config;
mod conns;
mod dialect;
mod error;
mod forward;
mod heal;
mod http;
mod layers;
mod metrics;
mod otlp_wire;
mod pipeline;
mod recover;
mod relay;
mod report;
mod request;
mod responses_stream;
mod runs;
mod sharing;
mod state;
pub(crate) use selfheal_trace as store;
mod stream;
mod telemetry;
mod upstream;
mod whole;
mod wire;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use thiserror::Error;
use tokio::sync::{Semaphore, watch};

// The curated public API: what the CLI, the benchmark and the tests use. The modules are
// private; everything else is the gateway's own.

/// The application: its state and its routes.
pub use app::router;
/// Inbound keys are configured by their hash.
pub use auth::key_hash;
/// How a request is held while a retry's delay passes.
pub use clock::Wait;
/// The configuration (`selfheal serve --config`; see `docs/reference/config.md`).
pub use config::{
    Auth, GatewayConfig, LimitsConfig, ModelRoute, OnPartial, ServerConfig, StateConfig, Target,
    ToolConfig, UpstreamConfig,
};
/// Errors in OpenAI's shape.
pub use error::ApiError;
/// A request's tools as the gateway checks calls against them.
pub use heal::GuideCache;
/// The texts of the controller's guidance, as the gateway writes them (the benchmark's model
/// reads them), and the wall clock the gateway reads data ages against.
pub use recover::{
    cross_check_text, refresh_text, replan_text, retry_text, substitute_text, wait_text, wall_ms,
};
/// The stream relay's frames, checks and bounds, shared by both event grammars.
pub use relay::{Check, Frame, MAX_HELD_BYTES, Opening as TextCallOpening, opens_text_call};
/// A chat completions request, read once and re-encoded with the gateway's edits.
pub use request::{ChatRequest, Edits};
/// Responses streams relayed and healed.
pub use responses_stream::{
    Hooks as ResponsesHooks, Reanswered, Reask as ResponsesReask, relay as relay_responses,
};
/// The gateway's state, shared by every request.
pub use state::{AppState, StateError};
/// The trace every decision is written to.
pub use store::{TraceReader, TraceWriter};
/// Chat completions streams relayed and healed.
pub use stream::{Hooks as ChatHooks, Reask as ChatReask, Reasked, relay as relay_chat};
/// A request's tools and what is wrong with a call to one.
pub use wire::{Problem, ToolIndex, ToolSpec, tool_index};

/// Why the gateway could not run.
#[derive(Debug, Error)]
pub enum ServeError {
    /// The state could not be built (an upstream's URL or key, the run secret).
    #[error(transparent)]
    State(#[from] StateError),
    /// The listener failed.
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// OTLP export (`[telemetry]`) could not be set up.
    #[error(transparent)]
    Telemetry(#[from] telemetry::TelemetryError),
}

/// Serves the gateway on `listener` until `shutdown` resolves, then drains in-flight requests
/// (for at most `server.drain_timeout_ms`) and flushes the trace.
///
/// Inbound connections are bounded (see [`ServerConfig`]): a request head must arrive within
/// the header-read timeout — which also closes kept-alive connections left idle that long — a
/// body within the body-read timeout, and at `max_connections` a new connection takes the slot
/// of one that has no request in flight (`conns`) or, when every one has, is answered 503 in
/// OpenAI's shape and closed, so a slow or idle client cannot hold the process, its file
/// descriptors or the slots real clients need. Every accepted connection gets `TCP_NODELAY`.
pub async fn serve(
    config: GatewayConfig,
    listener: tokio::net::TcpListener,
    trace: TraceWriter,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServeError> {
    serve_with(config, listener, trace, shutdown, Wait::real()).await
}

/// [`serve`], holding requests with `wait` while a retry's delay passes (a simulation's own
/// clock; [`Wait`]).
pub async fn serve_with(
    config: GatewayConfig,
    listener: tokio::net::TcpListener,
    trace: TraceWriter,
    shutdown: impl Future<Output = ()> + Send + 'static,
    wait: Wait,
) -> Result<(), ServeError> {
    let server = config.server;
    let fds = raise_fd_limit();
    if let Some(warning) = fd_shortfall(server.max_connections, fds) {
        tracing::warn!("{warning}");
    }
    // The exporter's HTTP client blocks: built off the async workers.
    let otel = config.telemetry.clone();
    let telemetry =
        tokio::task::spawn_blocking(move || telemetry::init(&otel, |v| std::env::var(v).ok()))
            .await
            .map_err(|e| telemetry::TelemetryError::from_join(&e))??;
    let state = Arc::new(AppState::new(config, trace)?.with_wait(wait));
    if let Ok(addr) = listener.local_addr()
        && !addr.ip().is_loopback()
        && !state.gate.requires_key()
    {
        tracing::warn!(
            %addr,
            "listening on a non-loopback address without inbound_keys: anyone who reaches \
             this port can use the gateway (and, with auth = \"env\", the operator's key)"
        );
    }
    // The request span only where spans are exported: a layer that only looks and passes the
    // request on still costs each request a boxed future.
    let app = router(state.clone());
    let app = if telemetry.exports() {
        app.layer(axum::middleware::from_fn(telemetry::request_span))
    } else {
        app
    };
    let result = accept_loop(listener, app, server, shutdown).await;
    state.trace.flush_and_close();
    let _ = tokio::task::spawn_blocking(move || telemetry.shutdown()).await;
    result
}

/// The shared tier `[state]` asks for: synced through Redis when `url` is set (the connection is
/// made lazily, so a Redis that is down at startup is an outage like any other), else local.
/// With Redis, must be called within a tokio runtime.
pub fn shared_tier(
    config: &StateConfig,
) -> Result<selfheal_state::Shared, selfheal_state::StoreError> {
    let Some(url) = &config.url else {
        return Ok(selfheal_state::Shared::local());
    };
    let options = selfheal_state::RedisOptions {
        prefix: config.prefix.clone(),
        timeout: Duration::from_millis(config.timeout_ms),
        probe_every: Duration::from_millis(config.refresh_ms),
    };
    let store = selfheal_state::RedisStore::new(url, options)?;
    tracing::info!(
        target: "selfheal::state",
        url = store.url(),
        refresh_ms = config.refresh_ms,
        "sharing breakers and learned targets through Redis"
    );
    selfheal_state::Shared::with_store(Arc::new(store), Duration::from_millis(config.refresh_ms))
}

/// Descriptors the process needs besides its client connections: upstream connections, the
/// trace database, the listener, standard streams. What [`fd_shortfall`] keeps free.
pub const FD_RESERVE: u64 = 64;

/// Raises the soft limit on open file descriptors (`RLIMIT_NOFILE`) to the hard limit, and
/// returns the soft limit the process has then; `None` when it is unlimited or unknown (or not
/// on Linux). At the common default soft limit of 1,024 the connection cap (1,024 by default)
/// never engaged: idle connections exhausted descriptors first (`accept failed: Too many open
/// files`) and real clients waited seconds (issue 30).
pub fn raise_fd_limit() -> Option<u64> {
    #[cfg(target_os = "linux")]
    {
        use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
        let now = getrlimit(Resource::Nofile);
        if let (Some(current), Some(maximum)) = (now.current, now.maximum)
            && current < maximum
        {
            let raised = Rlimit {
                current: Some(maximum),
                maximum: Some(maximum),
            };
            if setrlimit(Resource::Nofile, raised).is_ok() {
                return Some(maximum);
            }
        }
        now.current
    }
    #[cfg(not(target_os = "linux"))]
    {
        None
    }
}

/// The warning to give when `max_connections` client connections, plus [`FD_RESERVE`], do not
/// fit in the descriptor limit `fds` the process got: the cap would never engage, and
/// descriptors would run out first.
pub fn fd_shortfall(max_connections: usize, fds: Option<u64>) -> Option<String> {
    let fds = fds?;
    let wanted = (max_connections as u64).saturating_add(FD_RESERVE);
    (wanted > fds).then(|| {
        format!(
            "server.max_connections ({max_connections}) plus {FD_RESERVE} descriptors for \
             upstreams and the trace exceeds the open-file limit ({fds}): descriptors run out \
             before the connection cap engages. Lower max_connections to {} or raise the hard \
             limit (ulimit -Hn, LimitNOFILE=).",
            fds.saturating_sub(FD_RESERVE)
        )
    })
}

/// The 503 a connection past the cap gets before it is closed.
const SHED: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n\
connection: close\r\ncontent-length: 127\r\n\r\n\
{\"error\":{\"message\":\"the gateway is at its connection limit\",\"type\":\"server_error\",\
\"param\":null,\"code\":\"too_many_connections\"}}";

/// Answers a connection past the cap with [`SHED`] and closes it at once, in the accept loop.
/// A task per shed connection let a flood of them hold file descriptors faster than the tasks
/// closed them: under slowloris at `ulimit -n 128` the process ran out of descriptors and its
/// own upstream connections failed (`scripts/chaos.py`, scenario slowloris). The write is one
/// non-blocking `write(2)` into a fresh socket's empty send buffer.
fn shed(tcp: tokio::net::TcpStream) {
    if let Ok(std) = tcp.into_std() {
        use std::io::Write as _;
        let _ = (&std).write(SHED);
    }
}

async fn accept_loop(
    listener: tokio::net::TcpListener,
    app: axum::Router,
    server: ServerConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServeError> {
    let permits = Arc::new(Semaphore::new(server.max_connections));
    let mut open = conns::Registry::default();
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut conns = tokio::task::JoinSet::new();
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(Duration::from_millis(server.header_read_timeout_ms))
        // hyper's own limits sit above the gateway's, which answer 431 in OpenAI's shape.
        .max_headers(http::MAX_HEADERS * 2)
        .max_buf_size((server.max_header_bytes * 2).max(8 * 1024));
    let shutdown = std::pin::pin!(shutdown);
    let mut shutdown = shutdown;
    loop {
        let tcp = tokio::select! {
            // Shutdown first: a flood of connections must not starve it.
            biased;
            () = &mut shutdown => break,
            r = listener.accept() => match r {
                Ok((tcp, _)) => tcp,
                Err(e) => {
                    // Out of file descriptors and the like: wait a moment, keep serving.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let _ = tcp.set_nodelay(true);
        while conns.try_join_next().is_some() {}
        let permit = match permits.clone().try_acquire_owned() {
            Ok(p) => Some(p),
            // At the cap: a connection that never sent a whole request head, or else one kept
            // alive without a request in flight, gives its slot to the new one (see [`conns`]).
            Err(_) if open.reclaim().is_some() => {
                tokio::time::timeout(Duration::from_millis(100), permits.clone().acquire_owned())
                    .await
                    .ok()
                    .and_then(Result::ok)
            }
            Err(_) => None,
        };
        let Some(permit) = permit else {
            shed(tcp);
            continue;
        };
        let state = open.conn();
        let (on_head, on_answer) = (state.clone(), state.clone());
        let svc =
            tower::ServiceExt::map_request(app.clone(), move |req: axum::extract::Request<_>| {
                on_head.request_started();
                req
            });
        let svc = tower::ServiceExt::map_response(svc, move |resp: axum::response::Response| {
            resp.map(|b| on_answer.track(b))
        });
        let conn = http.serve_connection(TokioIo::new(tcp), TowerToHyperService::new(svc));
        let mut stop = stop_rx.clone();
        let shared = state.clone();
        let handle = conns.spawn(async move {
            let _permit = permit;
            let mut conn = std::pin::pin!(conn);
            tokio::select! {
                _ = conn.as_mut() => {}
                () = shared.closing() => {
                    conn.as_mut().graceful_shutdown();
                    let _ = conn.await;
                }
                _ = stop.changed() => {
                    conn.as_mut().graceful_shutdown();
                    let _ = conn.await;
                }
            }
        });
        open.push(state, handle, server.max_connections);
    }
    drop(listener);
    let _ = stop_tx.send(true);
    // A connection that never sent a whole head has no request to finish: it does not hold the
    // drain up to its deadline.
    open.abort_waiting();
    let deadline = Duration::from_millis(server.drain_timeout_ms);
    let drained = tokio::time::timeout(deadline, async {
        while conns.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        tracing::warn!(
            open = conns.len(),
            "drain deadline passed: closing the connections still open"
        );
        conns.abort_all();
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 30: the soft descriptor limit is raised to the hard one, so the connection cap,
    /// not the descriptors, is what limits clients.
    #[cfg(target_os = "linux")]
    #[test]
    fn issue_30_the_soft_descriptor_limit_is_raised_to_the_hard_one() {
        use rustix::process::{Resource, getrlimit};
        let got = raise_fd_limit();
        let now = getrlimit(Resource::Nofile);
        assert_eq!(got, now.current);
        if let Some(max) = now.maximum {
            assert_eq!(now.current, Some(max));
        }
    }

    #[test]
    fn a_connection_cap_the_descriptors_cannot_hold_is_warned_about() {
        assert_eq!(fd_shortfall(1_024, None), None, "unlimited or unknown");
        assert_eq!(fd_shortfall(1_024, Some(1_024 + FD_RESERVE)), None);
        let warning = fd_shortfall(1_024, Some(1_024)).expect("a warning");
        assert!(
            warning.contains("1024") && warning.contains("960"),
            "{warning}"
        );
    }
}
