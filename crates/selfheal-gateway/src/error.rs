//! Errors in OpenAI's shape, whatever went wrong.
//!
//! Clients are OpenAI SDKs: they read `{"error": {"message", "type", "param", "code"}}` and map the
//! status to an exception class. Every failure of the gateway — a body that is not JSON, an
//! oversize body, an unknown model, an exhausted upstream chain — answers in that shape, so the
//! agent sees a normal API error and never a bare text body or a hung connection.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

/// An error answered to the client.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    /// The HTTP status.
    pub status: StatusCode,
    /// OpenAI's `error.type`.
    pub kind: &'static str,
    /// OpenAI's `error.code`.
    pub code: &'static str,
    /// What happened, for the client.
    pub message: String,
    /// Why every upstream attempt failed (502 only).
    pub reasons: Vec<String>,
}

impl ApiError {
    /// 400: the body is not a chat-completions request.
    pub fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            "invalid_request",
            message,
        )
    }

    /// 413: the body is larger than the gateway accepts.
    pub fn too_large(limit: usize) -> ApiError {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "invalid_request_error",
            "request_too_large",
            format!("request body exceeds {limit} bytes"),
        )
    }

    /// 404: no route for this model name.
    pub fn unknown_model(model: &str) -> ApiError {
        ApiError::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            "model_not_found",
            format!("the model `{model}` does not exist on this gateway"),
        )
    }

    /// 502: every upstream attempt failed.
    pub fn exhausted(reasons: Vec<String>) -> ApiError {
        let mut e = ApiError::new(
            StatusCode::BAD_GATEWAY,
            "upstream_error",
            "upstream_exhausted",
            format!("every upstream attempt failed: {}", reasons.join("; ")),
        );
        e.reasons = reasons;
        e
    }

    /// 422: the gateway could not give the model's answer and was configured to say so as an
    /// error (`[server] on_partial = "error"`): `code` is `calls_left_out` or `run_stopped`.
    pub fn partial(code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "selfheal_error",
            code,
            message,
        )
    }

    /// Any status, type, code and message.
    pub fn new(
        status: StatusCode,
        kind: &'static str,
        code: &'static str,
        message: impl Into<String>,
    ) -> ApiError {
        ApiError {
            status,
            kind,
            code,
            message: message.into(),
            reasons: Vec::new(),
        }
    }

    /// The JSON body.
    pub fn body(&self) -> Value {
        let mut error = json!({
            "message": self.message,
            "type": self.kind,
            "param": null,
            "code": self.code,
        });
        if !self.reasons.is_empty() {
            error["reasons"] = json!(self.reasons);
        }
        json!({ "error": error })
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, axum::Json(self.body())).into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exhausted_body_snapshot() {
        let e = ApiError::exhausted(vec!["a: HTTP 503".into(), "b: timed out".into()]);
        assert_eq!(
            e.body().to_string(),
            r#"{"error":{"code":"upstream_exhausted","message":"every upstream attempt failed: a: HTTP 503; b: timed out","param":null,"reasons":["a: HTTP 503","b: timed out"],"type":"upstream_error"}}"#
        );
    }
}
