//! The axum application: the routes, and where each leads. The work lives in the modules the
//! routes name: `layers` (what every API route runs through: the request log, admission, error
//! redaction, the body limits), `http` (the operational endpoints), `dialect`
//! (one module per API: chat completions, Responses, Anthropic Messages — each only parses,
//! replays, edits, asks, checks and renders in its wire), `pipeline` (the protocol-neutral
//! parts of a healed turn, and `heal_turn`, the one turn every dialect runs), `whole` (the
//! whole answer, healed once for every API), `relay` (the stream relay, healed once for every
//! API and generic over the event grammars of `stream` and `responses_stream`), `forward` (the
//! endpoints passed through unhealed) and `report` (the `selfheal` report, its typed `Status`,
//! headers and trace). They are private; the crate root re-exports what callers use.

use std::sync::Arc;

use axum::Router;
use axum::middleware::from_fn_with_state;
use axum::routing::{MethodRouter, get, post};

use crate::dialect::{chat, messages, responses};
use crate::forward::embeddings;
use crate::http::{guard_head, healthz, method_not_allowed, metrics, models, not_found, readyz};
use crate::layers;

use crate::state::AppState;

/// The router. Every API route runs through the same layers ([`crate::layers`]): the request
/// log, admission, error redaction and — for the routes with a body — the body limits; the
/// Messages route also through its edge (its key header, its error shape). The operational
/// endpoints and the 404/405 answers run through none of them.
pub fn router(state: Arc<AppState>) -> Router {
    let api = |route: MethodRouter<Arc<AppState>>| {
        route.route_layer(from_fn_with_state(state.clone(), layers::api_with_body))
    };
    let models =
        get(models).route_layer(from_fn_with_state(state.clone(), layers::api_without_body));
    let messages =
        api(post(messages::messages)).route_layer(axum::middleware::from_fn(messages::edge));
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .route("/v1/models", models)
        .route("/v1/chat/completions", api(post(chat::chat)))
        .route("/v1/embeddings", api(post(embeddings)))
        .route("/v1/responses", api(post(responses::responses)))
        .route("/v1/messages", messages)
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(from_fn_with_state(state.clone(), guard_head))
        .with_state(state)
}
