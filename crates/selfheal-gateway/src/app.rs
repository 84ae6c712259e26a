//! The axum application: the routes, and where each leads. The work lives in the modules the
//! routes name: `http` (the operational endpoints and what every handler shares), `dialect`
//! (one module per API: chat completions, Responses, Anthropic Messages — each only parses,
//! replays, edits, asks, checks and renders in its wire), `pipeline` (the protocol-neutral
//! parts of a healed turn, and `heal_turn`, the one turn every dialect runs), `whole` (the
//! whole answer, healed once for every API), `relay` (the stream relay, healed once for every
//! API and generic over the event grammars of `stream` and `responses_stream`), `forward` (the
//! endpoints passed through unhealed) and `report` (the `selfheal` report, its typed `Status`,
//! headers and trace). They are private: this module re-exports what callers use ([`router`],
//! [`AppState`], [`StateError`], [`MAX_HEADERS`]).

use std::sync::Arc;

use axum::Router;
use axum::routing::{get, post};

use crate::dialect::{chat, messages, responses};
use crate::forward::embeddings;
use crate::http::{guard_head, healthz, method_not_allowed, metrics, models, not_found, readyz};

pub use crate::http::MAX_HEADERS;
pub use crate::state::{AppState, NoStream, StateError, TrustMemory};

/// The router.
pub fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .route("/v1/models", get(models))
        .route("/v1/chat/completions", post(chat::chat))
        .route("/v1/embeddings", post(embeddings))
        .route("/v1/responses", post(responses::responses))
        .route("/v1/messages", post(messages::messages))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            guard_head,
        ))
        .with_state(state)
}
