//! The scripted model's OpenAI-compatible endpoint: a real HTTP server the gateway calls.
//!
//! Why a channel: the world an answer is written from belongs to the episode the driver is
//! running (it borrows the task and the fault model), so the handler does not hold it. It hands
//! each request body to the driver ([`Ask`]) and waits for the completion; the driver answers
//! from its [`crate::world::World`] while it waits for the gateway's own answer.
//!
//! An answer is a completion or, while the benchmark's model provider is down (a
//! `provider_wide` outage), the HTTP error a provider answers with: the status, its
//! `Retry-After`, and OpenAI's error body. What the gateway does with it (wait and retry, fall
//! back to the next model of its chain) is the gateway's own healing.

use axum::Json;
use axum::Router;
use axum::extract::State;
use axum::http::header::RETRY_AFTER;
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde_json::{Value, json};
use tokio::sync::{mpsc, oneshot};

/// What the driver is handed while a request of the agent is out, in the order it happened: a
/// request of the model, or a wait the gateway made before one.
#[derive(Debug)]
pub(crate) enum Msg {
    /// The endpoint received a request.
    Ask(Ask),
    /// The gateway held the agent's request this many milliseconds before its model call
    /// (the delay of a tool's retry): a wait on the episode's clock.
    Wait(u64),
}

/// One chat-completions request the endpoint received, and where its answer goes.
#[derive(Debug)]
pub(crate) struct Ask {
    /// The request body.
    pub body: Value,
    /// The answer.
    pub reply: oneshot::Sender<Upstream>,
}

/// What the endpoint answers one request with.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Upstream {
    /// A chat completion (HTTP 200).
    Completion(Value),
    /// The provider's error: an HTTP status, its `Retry-After` (ms; sent in whole seconds,
    /// rounded up) and the message of OpenAI's error body.
    Error {
        /// The HTTP status.
        status: u16,
        /// `Retry-After`, in ms.
        retry_after_ms: Option<u64>,
        /// The error message.
        message: String,
    },
}

/// The endpoint's routes: `POST /v1/chat/completions`, every request handed to `asks`.
pub(crate) fn router(asks: mpsc::Sender<Msg>) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(chat))
        .with_state(asks)
}

async fn chat(State(asks): State<mpsc::Sender<Msg>>, Json(body): Json<Value>) -> Response {
    let (tx, rx) = oneshot::channel();
    if asks.send(Msg::Ask(Ask { body, reply: tx })).await.is_err() {
        return unavailable("no episode is running");
    }
    match rx.await {
        Ok(Upstream::Completion(completion)) => Json(completion).into_response(),
        Ok(Upstream::Error {
            status,
            retry_after_ms,
            message,
        }) => {
            let code = StatusCode::from_u16(status).unwrap_or(StatusCode::SERVICE_UNAVAILABLE);
            let mut response = error(code, &message);
            if let Some(ms) = retry_after_ms
                && let Ok(v) = HeaderValue::from_str(&ms.div_ceil(1000).to_string())
            {
                response.headers_mut().insert(RETRY_AFTER, v);
            }
            response
        }
        Err(_) => unavailable("the episode ended before the model answered"),
    }
}

fn unavailable(message: &str) -> Response {
    error(StatusCode::SERVICE_UNAVAILABLE, message)
}

/// An error answer with OpenAI's error body and the `type` OpenAI gives the status.
fn error(status: StatusCode, message: &str) -> Response {
    let kind = if status.is_server_error() {
        "server_error"
    } else if status == StatusCode::TOO_MANY_REQUESTS {
        "requests"
    } else {
        "invalid_request_error"
    };
    (
        status,
        Json(
            json!({"error": {"message": message, "type": kind, "param": null,
                              "code": null}}),
        ),
    )
        .into_response()
}
