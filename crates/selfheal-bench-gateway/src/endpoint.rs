//! The scripted model's OpenAI-compatible endpoint: a real HTTP server the gateway calls.
//!
//! Why a channel: the world an answer is written from belongs to the episode the driver is
//! running (it borrows the task and the fault model), so the handler does not hold it. It hands
//! each request body to the driver ([`Ask`]) and waits for the completion; the driver answers
//! from its [`crate::world::World`] while it waits for the gateway's own answer.

use axum::Json;
use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde_json::{Value, json};
use tokio::sync::{mpsc, oneshot};

/// One chat-completions request the endpoint received, and where its answer goes.
#[derive(Debug)]
pub(crate) struct Ask {
    /// The request body.
    pub body: Value,
    /// The completion to answer with.
    pub reply: oneshot::Sender<Value>,
}

/// The endpoint's routes: `POST /v1/chat/completions`, every request handed to `asks`.
pub(crate) fn router(asks: mpsc::Sender<Ask>) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(chat))
        .with_state(asks)
}

async fn chat(State(asks): State<mpsc::Sender<Ask>>, Json(body): Json<Value>) -> Response {
    let (tx, rx) = oneshot::channel();
    if asks.send(Ask { body, reply: tx }).await.is_err() {
        return unavailable("no episode is running");
    }
    match rx.await {
        Ok(completion) => Json(completion).into_response(),
        Err(_) => unavailable("the episode ended before the model answered"),
    }
}

fn unavailable(message: &str) -> Response {
    (
        StatusCode::SERVICE_UNAVAILABLE,
        Json(
            json!({"error": {"message": message, "type": "server_error", "param": null,
                              "code": null}}),
        ),
    )
        .into_response()
}
