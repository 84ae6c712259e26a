//! The OpenAI-compatible model client: one HTTP call, typed errors, nothing hidden.
//!
//! The client sends one chat-completions request and reports exactly what happened. It does not
//! retry: retries are recovery actions, decided by the core's policy and charged to the run's one
//! budget ledger, so a client that retried on its own would spend budget behind the ledger's back.
//! What it does do:
//!
//! - map every provider failure to a typed [`ClientError`] and that to the core's
//!   [`Signal`] (429 with `Retry-After`, 5xx, timeouts, context length, empty responses), so the
//!   classifier never parses strings it could have been given as structure;
//! - normalise request shapes some servers reject: an assistant message with `tool_calls` and
//!   `"content": null` makes llama-cpp-python's server answer HTTP 500, so `content` becomes `""`;
//! - read the API key from a named environment variable, never log it.

use std::time::Duration;

use bytes::Bytes;
use serde_json::Value;

use crate::at::At;
use thiserror::Error;

use selfheal_core::Signal;

/// Where and how to reach one OpenAI-compatible upstream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientConfig {
    /// Base URL up to and including `/v1`, e.g. `http://127.0.0.1:8089/v1`.
    pub base_url: String,
    /// Name of the environment variable holding the API key (none sent when unset or empty).
    pub api_key_env: Option<String>,
    /// Timeout of one request, end to end.
    pub timeout: Duration,
    /// Timeout of establishing the connection.
    pub connect_timeout: Duration,
}

impl ClientConfig {
    /// A config for `base_url` with a 60 s request timeout and a 5 s connect timeout.
    pub fn new(base_url: impl Into<String>) -> Self {
        ClientConfig {
            base_url: base_url.into(),
            api_key_env: None,
            timeout: Duration::from_secs(60),
            connect_timeout: Duration::from_secs(5),
        }
    }
}

/// Why a model call failed.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ClientError {
    /// The server answered with a non-success status.
    #[error("upstream answered HTTP {status}: {message}")]
    Status {
        /// The HTTP status.
        status: u16,
        /// `Retry-After`, in milliseconds, when sent (seconds or HTTP date is not parsed: seconds only).
        retry_after_ms: Option<u64>,
        /// The error message from the body (OpenAI's `error.message` when present), truncated.
        message: String,
    },
    /// The request did not finish in time.
    #[error("upstream timed out")]
    Timeout,
    /// The connection failed or broke.
    #[error("cannot reach upstream: {0}")]
    Connect(String),
    /// The body was not the JSON we expected.
    #[error("upstream sent an unreadable body: {0}")]
    Decode(String),
    /// A 200 with no choice, or a choice with neither content nor tool calls.
    #[error("upstream answered with an empty response")]
    EmptyResponse,
    /// The request could not be built (bad URL, bad header).
    #[error("invalid request: {0}")]
    Invalid(String),
}

impl ClientError {
    /// The core signal this failure corresponds to.
    pub fn signal(&self) -> Signal {
        match self {
            ClientError::Status {
                status,
                retry_after_ms,
                message,
            } => {
                let m = message.to_ascii_lowercase();
                if self.is_rejected_shape() {
                    Signal::InvalidArguments {
                        errors: vec![message.clone()],
                    }
                } else if *status == 400
                    && (m.contains("context length")
                        || m.contains("context_length")
                        || m.contains("maximum context"))
                {
                    Signal::ContextLength
                } else {
                    Signal::HttpStatus {
                        status: *status,
                        retry_after_ms: *retry_after_ms,
                        message: message.clone(),
                    }
                }
            }
            ClientError::Timeout => Signal::Timeout,
            ClientError::Connect(m) => Signal::Exception {
                message: format!("connection reset: {m}"),
            },
            ClientError::Decode(m) => Signal::MalformedOutput { detail: m.clone() },
            ClientError::EmptyResponse => Signal::EmptyResponse,
            ClientError::Invalid(m) => Signal::InvalidArguments {
                errors: vec![m.clone()],
            },
        }
    }

    /// Whether this is a 500 that some servers send for a request shape they reject (a
    /// structural error: retrying the same request cannot help). Part of reading the wire:
    /// [`ClientError::signal`] turns it into [`Signal::InvalidArguments`].
    fn is_rejected_shape(&self) -> bool {
        match self {
            ClientError::Status {
                status: 500,
                message,
                ..
            } => {
                let m = message.to_ascii_lowercase();
                m.contains("content")
                    && (m.contains("null") || m.contains("none") || m.contains("must be"))
            }
            _ => false,
        }
    }
}

/// A successful chat completion.
#[derive(Debug, Clone, PartialEq)]
pub struct Completion {
    /// The full response body.
    pub body: Value,
    /// Prompt + completion tokens, when the server reports usage.
    pub tokens: u64,
}

impl Completion {
    /// The first choice's message.
    pub fn message(&self) -> Option<&Value> {
        self.body.at("/choices/0/message")
    }

    /// The first choice's `finish_reason`.
    pub fn finish_reason(&self) -> Option<&str> {
        self.body
            .at("/choices/0/finish_reason")
            .and_then(Value::as_str)
    }
}

/// Rewrites request shapes that some OpenAI-compatible servers reject. Returns how many messages
/// were changed. Today: assistant messages with `tool_calls` and `content: null` (or no content)
/// get `content: ""`.
pub fn normalize_request(body: &mut Value) -> usize {
    let Some(messages) = body.get_mut("messages").and_then(Value::as_array_mut) else {
        return 0;
    };
    let mut changed = 0;
    for m in messages {
        let Some(obj) = m.as_object_mut() else {
            continue;
        };
        let is_assistant = obj.get("role").and_then(Value::as_str) == Some("assistant");
        if is_assistant
            && obj.contains_key("tool_calls")
            && obj.get("content").is_none_or(Value::is_null)
        {
            obj.insert("content".into(), Value::String(String::new()));
            changed += 1;
        }
    }
    changed
}

/// The OpenAI-compatible chat-completions client.
#[derive(Debug, Clone)]
pub struct ModelClient {
    http: reqwest::Client,
    config: ClientConfig,
    /// `base_url` + `/chat/completions`, parsed once (URL parsing showed in profiles).
    chat_url: Option<reqwest::Url>,
}

impl ModelClient {
    /// Builds a client (with `TCP_NODELAY`, so sequential requests on one kept-alive connection do
    /// not wait on Nagle's algorithm).
    pub fn new(config: ClientConfig) -> Result<Self, ClientError> {
        let http = reqwest::Client::builder()
            .tcp_nodelay(true)
            .connect_timeout(config.connect_timeout)
            .timeout(config.timeout)
            .pool_idle_timeout(Duration::from_secs(90))
            .build()
            .map_err(|e| ClientError::Invalid(e.to_string()))?;
        let mut client = ModelClient {
            http,
            config,
            chat_url: None,
        };
        client.chat_url = reqwest::Url::parse(&client.url("chat/completions")).ok();
        Ok(client)
    }

    /// The configuration.
    pub fn config(&self) -> &ClientConfig {
        &self.config
    }

    fn url(&self, path: &str) -> String {
        format!(
            "{}/{}",
            self.config.base_url.trim_end_matches('/'),
            path.trim_start_matches('/')
        )
    }

    fn api_key(&self) -> Option<String> {
        self.config
            .api_key_env
            .as_ref()
            .and_then(|var| std::env::var(var).ok())
            .filter(|k| !k.is_empty())
    }

    /// Sends a request body to `path` (e.g. `chat/completions`) and returns the raw response,
    /// with non-success statuses already turned into [`ClientError::Status`]. For streaming.
    pub async fn send(&self, path: &str, body: &Value) -> Result<reqwest::Response, ClientError> {
        let bytes = serde_json::to_vec(body).map_err(|e| ClientError::Invalid(e.to_string()))?;
        self.send_raw(path, Bytes::from(bytes)).await
    }

    /// Sends an already-encoded JSON body to `path` as is (no normalisation, no copy) and returns
    /// the raw response, with non-success statuses turned into [`ClientError::Status`]. Retries of
    /// the same body share one buffer: cloning [`Bytes`] does not copy.
    pub async fn send_raw(
        &self,
        path: &str,
        body: Bytes,
    ) -> Result<reqwest::Response, ClientError> {
        let url = match &self.chat_url {
            Some(u) if path == "chat/completions" => u.clone(),
            _ => reqwest::Url::parse(&self.url(path))
                .map_err(|e| ClientError::Invalid(format!("bad upstream URL: {e}")))?,
        };
        let mut req = self
            .http
            .post(url)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(body);
        if let Some(key) = self.api_key() {
            req = req.bearer_auth(key);
        }
        let resp = req.send().await.map_err(map_reqwest)?;
        check_status(resp).await
    }

    /// `GET path` (e.g. `models`), decoded as JSON.
    pub async fn get_json(&self, path: &str) -> Result<Value, ClientError> {
        let mut req = self.http.get(self.url(path));
        if let Some(key) = self.api_key() {
            req = req.bearer_auth(key);
        }
        let resp = check_status(req.send().await.map_err(map_reqwest)?).await?;
        resp.json()
            .await
            .map_err(|e| ClientError::Decode(e.to_string()))
    }

    /// One non-streaming chat completion. The body is normalised first (see
    /// [`normalize_request`]) and sent with `"stream": false`.
    pub async fn chat(&self, body: &Value) -> Result<Completion, ClientError> {
        let mut body = body.clone();
        normalize_request(&mut body);
        if let Some(o) = body.as_object_mut() {
            o.insert("stream".into(), Value::Bool(false));
        }
        let bytes = serde_json::to_vec(&body).map_err(|e| ClientError::Invalid(e.to_string()))?;
        self.chat_raw(Bytes::from(bytes)).await
    }

    /// One non-streaming chat completion of an already-encoded body, sent as is: the caller has
    /// normalised it and made sure it does not ask for a stream. The answer is checked like
    /// [`ModelClient::chat`]'s: an empty or unreadable 200 is an error.
    pub async fn chat_raw(&self, body: Bytes) -> Result<Completion, ClientError> {
        let resp = self.send_raw("chat/completions", body).await?;
        let bytes = resp.bytes().await.map_err(map_reqwest)?;
        parse_completion(&bytes)
    }
}

/// Decodes and checks a chat-completion body: whitespace only, no choice, or a choice with
/// neither content nor tool calls is [`ClientError::EmptyResponse`]; `choices` that is not a
/// list, or a first choice whose `message` is not an object, is [`ClientError::Decode`] (a
/// JSON pointer would read `{"choices": {"0": ...}}` as if it were a list: a guess, refused).
pub fn parse_completion(bytes: &[u8]) -> Result<Completion, ClientError> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Err(ClientError::EmptyResponse);
    }
    let body: Value =
        serde_json::from_slice(bytes).map_err(|e| ClientError::Decode(e.to_string()))?;
    let choice = match body.get("choices") {
        Some(Value::Array(choices)) => choices.first(),
        None | Some(Value::Null) => None,
        Some(_) => return Err(ClientError::Decode("`choices` is not a list".into())),
    };
    let message = match choice.and_then(|c| c.get("message")) {
        Some(m @ Value::Object(_)) => Some(m),
        None | Some(Value::Null) => None,
        Some(_) => return Err(ClientError::Decode("`message` is not an object".into())),
    };
    let has_content = message
        .and_then(|m| m.get("content"))
        .and_then(Value::as_str)
        .is_some_and(|c| !c.trim().is_empty());
    let has_calls = message
        .and_then(|m| m.get("tool_calls"))
        .and_then(Value::as_array)
        .is_some_and(|a| !a.is_empty());
    if !has_content && !has_calls {
        return Err(ClientError::EmptyResponse);
    }
    let tokens = body
        .at("/usage/total_tokens")
        .and_then(Value::as_u64)
        .unwrap_or(0);
    Ok(Completion { body, tokens })
}

/// A transport error of reqwest as a [`ClientError`]. Public so the gateway reads the wire
/// the same way: this module is the one place an OpenAI-compatible answer is parsed.
pub fn map_reqwest(e: reqwest::Error) -> ClientError {
    if e.is_timeout() {
        ClientError::Timeout
    } else if e.is_builder() {
        ClientError::Invalid(e.to_string())
    } else if e.is_decode() {
        ClientError::Decode(e.to_string())
    } else {
        ClientError::Connect(e.to_string())
    }
}

/// `Retry-After` in milliseconds, when the header holds a number of seconds.
pub fn retry_after_ms(headers: &reqwest::header::HeaderMap) -> Option<u64> {
    headers
        .get(reqwest::header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s >= 0.0)
        .map(|s| (s * 1000.0) as u64)
}

/// The error of a non-success answer: the provider's message (OpenAI's `error.message`, else
/// `detail` or `error`, else the body), cut to 500 bytes.
pub fn status_error(status: u16, retry_after_ms: Option<u64>, body: &str) -> ClientError {
    let mut message = serde_json::from_str::<Value>(body)
        .ok()
        .and_then(|v| {
            v.at("/error/message")
                .or_else(|| v.get("detail"))
                .or_else(|| v.get("error"))
                .map(|m| m.as_str().map_or_else(|| m.to_string(), str::to_owned))
        })
        .unwrap_or_else(|| body.to_owned());
    if message.len() > 500 {
        let mut end = 500;
        while !message.is_char_boundary(end) {
            end -= 1;
        }
        message.truncate(end);
    }
    ClientError::Status {
        status,
        retry_after_ms,
        message,
    }
}

async fn check_status(resp: reqwest::Response) -> Result<reqwest::Response, ClientError> {
    let status = resp.status();
    if status.is_success() {
        return Ok(resp);
    }
    let retry_after = retry_after_ms(resp.headers());
    let text = resp.text().await.unwrap_or_default();
    Err(status_error(status.as_u16(), retry_after, &text))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// An answer whose shape a JSON pointer would read past (`choices` an object keyed "0", a
    /// `message` that is a string) is a decode error, not an answer; an answer with no choice
    /// or an empty message is empty; a well-formed one parses.
    #[test]
    fn only_a_list_of_choices_with_an_object_message_is_an_answer() {
        let msg = json!({"role": "assistant", "content": "x"});
        for odd in [
            json!({"choices": {"0": {"message": msg}}}),
            json!({"choices": "none"}),
            json!({"choices": [{"message": "x"}]}),
        ] {
            let r = parse_completion(odd.to_string().as_bytes());
            assert!(matches!(r, Err(ClientError::Decode(_))), "{odd}: {r:?}");
        }
        for empty in [
            json!({"choices": []}),
            json!({"choices": null}),
            json!({"choices": [{"message": null}]}),
        ] {
            let r = parse_completion(empty.to_string().as_bytes());
            assert!(
                matches!(r, Err(ClientError::EmptyResponse)),
                "{empty}: {r:?}"
            );
        }
        let ok = json!({"choices": [{"message": msg}], "usage": {"total_tokens": 7}});
        let c = parse_completion(ok.to_string().as_bytes()).unwrap();
        assert_eq!(c.tokens, 7);
    }

    #[test]
    fn content_null_beside_tool_calls_is_normalised() {
        let mut body = json!({"messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "1"}]},
            {"role": "assistant", "tool_calls": [{"id": "2"}]},
            {"role": "assistant", "content": "ok", "tool_calls": [{"id": "3"}]}
        ]});
        assert_eq!(normalize_request(&mut body), 2);
        assert_eq!(body["messages"][1]["content"], json!(""));
        assert_eq!(body["messages"][2]["content"], json!(""));
        assert_eq!(body["messages"][3]["content"], json!("ok"));
    }

    #[test]
    fn errors_map_to_signals() {
        let rate = ClientError::Status {
            status: 429,
            retry_after_ms: Some(2000),
            message: "slow down".into(),
        };
        assert!(matches!(
            rate.signal(),
            Signal::HttpStatus {
                status: 429,
                retry_after_ms: Some(2000),
                ..
            }
        ));
        let shape = ClientError::Status {
            status: 500,
            retry_after_ms: None,
            message: "'content' must be a string, got None".into(),
        };
        assert!(matches!(shape.signal(), Signal::InvalidArguments { .. }));
        let ctx = ClientError::Status {
            status: 400,
            retry_after_ms: None,
            message: "This model's maximum context length is 4096 tokens".into(),
        };
        assert_eq!(ctx.signal(), Signal::ContextLength);
        assert_eq!(ClientError::EmptyResponse.signal(), Signal::EmptyResponse);
    }
}
