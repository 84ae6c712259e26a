//! # selfheal-gateway — an OpenAI-compatible proxy that heals any agent
//!
//! Most agents are not written in Rust. Pointing an agent's `base_url` at this gateway gives it
//! self-healing without a code change. Model gateways retry and fall back between *models*; this
//! one also sees the agent's *tool* loop, because every request carries the whole conversation:
//!
//! ```text
//!  agent ──POST /v1/chat/completions──► gateway ─────────────────────────────► upstream
//!            (whole conversation)        │ 1 replay new tool results → Monitor    (retries,
//!                                        │ 2 verdict: guidance / hide / abort      fallback
//!                                        │ 3 edit request (or answer: abort)       chain,
//!                                        │ 4 upstream call ───────────────────────► breaker)
//!        ◄──── answer + `selfheal` ──────│ 5 check tool calls: repair / re-ask
//!                                        └ every decision → SQLite trace
//! ```
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use selfheal_gateway::{GatewayConfig, TraceWriter, serve};
//! let config = GatewayConfig::for_upstream("http://127.0.0.1:8080/v1");
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:7420").await?;
//! serve(config, listener, TraceWriter::disabled(), std::future::pending()).await?;
//! # Ok(()) }
//! ```

pub mod app;
pub mod config;
pub mod error;
pub mod heal;
pub mod metrics;
pub mod request;
pub mod runs;
pub mod store;
pub mod stream;
pub mod upstream;

use std::future::Future;
use std::sync::Arc;

use axum::serve::ListenerExt;
use thiserror::Error;

pub use app::{AppState, router};
pub use config::GatewayConfig;
pub use error::ApiError;
pub use store::{TraceReader, TraceWriter};

/// Why the gateway could not run.
#[derive(Debug, Error)]
pub enum ServeError {
    /// An upstream client could not be built.
    #[error(transparent)]
    Client(#[from] selfheal_runtime::ClientError),
    /// The listener failed.
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

/// Serves the gateway on `listener` (with `TCP_NODELAY` on every accepted connection) until
/// `shutdown` resolves, then drains in-flight requests and flushes the trace.
pub async fn serve(
    config: GatewayConfig,
    listener: tokio::net::TcpListener,
    trace: TraceWriter,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServeError> {
    let state = Arc::new(AppState::new(config, trace)?);
    let app = router(state.clone());
    let listener = listener.tap_io(|tcp| {
        let _ = tcp.set_nodelay(true);
    });
    let result = axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await;
    state.trace.flush_and_close();
    Ok(result?)
}
