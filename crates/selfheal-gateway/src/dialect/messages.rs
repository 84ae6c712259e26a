//! The Anthropic Messages dialect: `POST /v1/messages`, healed by the chat pipeline.
//!
//! Agents written against the `anthropic` SDK speak the Messages API; the gateway's upstreams
//! speak OpenAI's chat completions, and its healing (replay of tool results, verdicts, retries
//! and fall-backs, repair and re-ask of tool calls, the read before answering, the `selfheal`
//! report) is written once, for chat. So this module is a dialect at the edge and nothing more:
//!
//! ```text
//!  anthropic SDK ──/v1/messages──► to_chat ──chat request──► app::chat (the one pipeline)
//!        ◄── message / events ◄── to_message / StreamRender ◄── healed chat answer / SSE
//! ```
//!
//! Translation is lossless or it refuses: a content block, tool or field the chat API cannot
//! carry (images, documents, thinking, server tools, an assistant prefill, text after a
//! `tool_use` block) is an Anthropic-shaped 400 `invalid_request_error`, never dropped. Two
//! things are mapped on purpose and documented: `cache_control` (a caching hint with no effect
//! on the answer) is ignored, and a `tool_result` with `is_error: true` reaches the model as
//! text beginning `Error:`, the one way a chat tool message can say it failed. Errors of the
//! pipeline (401, 404, 413, 422 under `on_partial = "error"`, 502) keep their status and are
//! rewritten in Anthropic's shape, so the SDK raises the matching exception; a healed stream that
//! ends in an error, or is cut, ends in an Anthropic `error` event, never in `message_stop`.
//! The `x-selfheal-*` headers pass through, and the `selfheal` report rides on the message (and
//! on a stream's `message_delta`).

use std::collections::VecDeque;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures_util::StreamExt;
use serde_json::{Map, Value, json};

use crate::auth::Caller;
use crate::dialect::chat;
use crate::error::ApiError;
use crate::layers::{self, Received, Refused, RunLabel};
use crate::state::AppState;

/// Why an Anthropic request (or an answer for one) cannot be translated without loss.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub(crate) struct Refusal(pub String);

fn refuse<T>(message: impl Into<String>) -> Result<T, Refusal> {
    Err(Refusal(message.into()))
}

/// The top-level fields of a Messages request this dialect carries over the chat API.
const FIELDS: &[&str] = &[
    "model",
    "messages",
    "max_tokens",
    "system",
    "tools",
    "tool_choice",
    "stop_sequences",
    "temperature",
    "top_p",
    "top_k",
    "metadata",
    "stream",
    "thinking",
    // A caching hint, with no effect on the answer: read and left aside, as on blocks.
    "cache_control",
];

/// An Anthropic request translated for the chat pipeline.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Translated {
    /// The chat-completions request.
    pub chat: Value,
    /// The model asked for.
    pub model: String,
    /// The stop sequences asked for: an answer that stopped at one names it.
    pub stop_sequences: Vec<String>,
}

/// Translates a Messages request into the chat-completions request the pipeline heals.
pub(crate) fn to_chat(req: &Value) -> Result<Translated, Refusal> {
    let Some(o) = req.as_object() else {
        return refuse("the body must be a JSON object");
    };
    if let Some(k) = o.keys().find(|k| !FIELDS.contains(&k.as_str())) {
        return refuse(format!(
            "`{k}` is not supported: this gateway sends Messages requests upstream over the \
             chat-completions API, which cannot carry it"
        ));
    }
    let model = match o.get("model") {
        Some(Value::String(m)) => m.clone(),
        _ => return refuse("`model`: a string is required"),
    };
    let max_tokens = match o.get("max_tokens") {
        Some(Value::Number(n)) if n.as_u64().is_some_and(|n| n >= 1) => n.clone(),
        _ => return refuse("`max_tokens`: a positive integer is required"),
    };
    let stream = match o.get("stream") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        _ => return refuse("`stream` must be a boolean"),
    };
    match o.get("thinking") {
        None | Some(Value::Null) => {}
        Some(t) if t.get("type").and_then(Value::as_str) == Some("disabled") => {}
        Some(_) => {
            return refuse(
                "`thinking` is not supported: the chat-completions API cannot carry thinking \
                 blocks",
            );
        }
    }
    let mut messages = Vec::new();
    match o.get("system") {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) if s.is_empty() => {}
        Some(Value::String(s)) => messages.push(json!({"role": "system", "content": s})),
        Some(Value::Array(blocks)) => {
            let texts = blocks
                .iter()
                .enumerate()
                .map(|(i, b)| text_of(b, &format!("system[{i}]")))
                .collect::<Result<Vec<_>, _>>()?;
            if !texts.is_empty() {
                messages.push(json!({"role": "system", "content": text_content(texts)}));
            }
        }
        Some(_) => return refuse("`system` must be a string or a list of text blocks"),
    }
    let list = match o.get("messages") {
        Some(Value::Array(l)) if !l.is_empty() => l,
        _ => return refuse("`messages`: a non-empty list is required"),
    };
    for (i, m) in list.iter().enumerate() {
        if let Some(k) = m
            .as_object()
            .and_then(|o| o.keys().find(|k| *k != "role" && *k != "content"))
        {
            return refuse(format!("messages[{i}].{k} is not supported"));
        }
        match m.get("role").and_then(Value::as_str) {
            Some("user") => user_turn(m.get("content"), i, &mut messages)?,
            Some("assistant") if i + 1 == list.len() => {
                return refuse(format!(
                    "messages[{i}]: a final assistant turn (a prefill) cannot be sent over the \
                     chat-completions API"
                ));
            }
            Some("assistant") => messages.push(assistant_turn(m.get("content"), i)?),
            _ => return refuse(format!("messages[{i}].role must be `user` or `assistant`")),
        }
    }
    let mut chat = Map::new();
    chat.insert("model".into(), Value::String(model.clone()));
    chat.insert("messages".into(), Value::Array(messages));
    chat.insert("max_tokens".into(), Value::Number(max_tokens));
    if stream {
        chat.insert("stream".into(), Value::Bool(true));
    }
    match o.get("tools") {
        None | Some(Value::Null) => {}
        Some(Value::Array(tools)) => {
            let tools = tools
                .iter()
                .enumerate()
                .map(|(i, t)| tool(t, i))
                .collect::<Result<Vec<_>, _>>()?;
            chat.insert("tools".into(), Value::Array(tools));
        }
        Some(_) => return refuse("`tools` must be a list"),
    }
    if let Some(choice) = o.get("tool_choice").filter(|c| !c.is_null()) {
        tool_choice(choice, &mut chat)?;
    }
    let stop_sequences = match o.get("stop_sequences") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(s)) => s
            .iter()
            .map(|s| match s {
                Value::String(s) => Ok(s.clone()),
                _ => refuse("`stop_sequences` must be a list of strings"),
            })
            .collect::<Result<Vec<_>, _>>()?,
        Some(_) => return refuse("`stop_sequences` must be a list of strings"),
    };
    if !stop_sequences.is_empty() {
        chat.insert("stop".into(), json!(stop_sequences));
    }
    for k in ["temperature", "top_p", "top_k"] {
        match o.get(k) {
            None | Some(Value::Null) => {}
            Some(Value::Number(n)) => {
                chat.insert(k.into(), Value::Number(n.clone()));
            }
            Some(_) => return refuse(format!("`{k}` must be a number")),
        }
    }
    match o.get("metadata") {
        None | Some(Value::Null) => {}
        Some(Value::Object(m)) => {
            for (k, v) in m {
                match (k.as_str(), v) {
                    ("user_id", Value::String(u)) => {
                        chat.insert("user".into(), Value::String(u.clone()));
                    }
                    ("user_id", Value::Null) => {}
                    _ => return refuse(format!("`metadata.{k}` is not supported")),
                }
            }
        }
        Some(_) => return refuse("`metadata` must be an object"),
    }
    Ok(Translated {
        chat: Value::Object(chat),
        model,
        stop_sequences,
    })
}

/// Refuses a block with keys other than `allowed` (`type` and `cache_control` are always
/// allowed: `cache_control` is a caching hint, with no effect on the answer).
fn only_keys(block: &Value, allowed: &[&str], at: &str) -> Result<(), Refusal> {
    let Some(o) = block.as_object() else {
        return refuse(format!("{at} must be a content block (an object)"));
    };
    match o
        .keys()
        .find(|k| !allowed.contains(&k.as_str()) && *k != "type" && *k != "cache_control")
    {
        Some(k) => refuse(format!("{at}.{k} is not supported")),
        None => Ok(()),
    }
}

/// The type of a content block.
fn block_type(block: &Value) -> Option<&str> {
    block.get("type").and_then(Value::as_str)
}

/// The refusal of a block type this dialect does not carry.
fn unsupported<T>(block: &Value, at: &str) -> Result<T, Refusal> {
    let kind = block_type(block).unwrap_or("(none)");
    refuse(format!(
        "{at}: content blocks of type `{kind}` are not supported: this gateway sends Messages \
         requests upstream over the chat-completions API, which cannot carry them"
    ))
}

/// The text of a `text` block (refusing any other block, and citations).
fn text_of(block: &Value, at: &str) -> Result<String, Refusal> {
    if block_type(block) != Some("text") {
        return unsupported(block, at);
    }
    only_keys(block, &["text", "citations"], at)?;
    match block.get("citations") {
        None | Some(Value::Null) => {}
        Some(Value::Array(c)) if c.is_empty() => {}
        Some(_) => return refuse(format!("{at}.citations are not supported")),
    }
    match block.get("text") {
        Some(Value::String(t)) => Ok(t.clone()),
        _ => refuse(format!("{at}.text must be a string")),
    }
}

/// Chat `content` for text blocks: one block is a string, more are text parts (no text is
/// joined or lost).
fn text_content(mut texts: Vec<String>) -> Value {
    if texts.len() == 1 {
        return Value::String(texts.remove(0));
    }
    Value::Array(
        texts
            .into_iter()
            .map(|t| json!({"type": "text", "text": t}))
            .collect(),
    )
}

/// A user turn: its text blocks as user messages and its `tool_result` blocks as `tool`
/// messages, in the order they came.
fn user_turn(content: Option<&Value>, i: usize, out: &mut Vec<Value>) -> Result<(), Refusal> {
    let blocks = match content {
        Some(Value::String(s)) => {
            out.push(json!({"role": "user", "content": s}));
            return Ok(());
        }
        Some(Value::Array(b)) if !b.is_empty() => b,
        _ => {
            return refuse(format!(
                "messages[{i}].content must be a string or a non-empty list of blocks"
            ));
        }
    };
    let mut texts = Vec::new();
    for (j, b) in blocks.iter().enumerate() {
        let at = format!("messages[{i}].content[{j}]");
        match block_type(b) {
            Some("text") => texts.push(text_of(b, &at)?),
            Some("tool_result") => {
                if !texts.is_empty() {
                    out.push(json!({"role": "user", "content": text_content(std::mem::take(&mut texts))}));
                }
                out.push(tool_message(b, &at)?);
            }
            _ => return unsupported(b, &at),
        }
    }
    if !texts.is_empty() {
        out.push(json!({"role": "user", "content": text_content(texts)}));
    }
    Ok(())
}

/// A `tool_result` block as a chat `tool` message. `is_error: true` is said as text beginning
/// `Error:` (a chat tool message has no error flag; the model and the gateway's monitor read it).
fn tool_message(block: &Value, at: &str) -> Result<Value, Refusal> {
    only_keys(block, &["tool_use_id", "content", "is_error"], at)?;
    let Some(id) = block.get("tool_use_id").and_then(Value::as_str) else {
        return refuse(format!("{at}.tool_use_id must be a string"));
    };
    let texts = match block.get("content") {
        None | Some(Value::Null) => vec![String::new()],
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(parts)) if parts.is_empty() => vec![String::new()],
        Some(Value::Array(parts)) => parts
            .iter()
            .enumerate()
            .map(|(k, p)| text_of(p, &format!("{at}.content[{k}]")))
            .collect::<Result<Vec<_>, _>>()?,
        Some(_) => return refuse(format!("{at}.content must be a string or a list of blocks")),
    };
    let is_error = match block.get("is_error") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => return refuse(format!("{at}.is_error must be a boolean")),
    };
    let content = if is_error {
        let text = texts.join("\n");
        if text.trim_start().to_ascii_lowercase().starts_with("error") {
            Value::String(text)
        } else {
            Value::String(format!("Error: {text}"))
        }
    } else {
        text_content(texts)
    };
    Ok(json!({"role": "tool", "tool_call_id": id, "content": content}))
}

/// An assistant turn (not the last): its text, then its `tool_use` blocks as tool calls. Text
/// after a `tool_use` block is refused: a chat message cannot say it came after the calls.
fn assistant_turn(content: Option<&Value>, i: usize) -> Result<Value, Refusal> {
    let blocks = match content {
        Some(Value::String(s)) => return Ok(json!({"role": "assistant", "content": s})),
        Some(Value::Array(b)) if !b.is_empty() => b,
        _ => {
            return refuse(format!(
                "messages[{i}].content must be a string or a non-empty list of blocks"
            ));
        }
    };
    let mut texts = Vec::new();
    let mut calls = Vec::new();
    for (j, b) in blocks.iter().enumerate() {
        let at = format!("messages[{i}].content[{j}]");
        match block_type(b) {
            Some("text") if calls.is_empty() => texts.push(text_of(b, &at)?),
            Some("text") => {
                return refuse(format!(
                    "{at}: text after a `tool_use` block cannot be sent over the \
                     chat-completions API in its place"
                ));
            }
            Some("tool_use") => {
                only_keys(b, &["id", "name", "input"], &at)?;
                let (Some(id), Some(name)) = (
                    b.get("id").and_then(Value::as_str),
                    b.get("name").and_then(Value::as_str),
                ) else {
                    return refuse(format!("{at}: `id` and `name` must be strings"));
                };
                let Some(input) = b.get("input").filter(|v| v.is_object()) else {
                    return refuse(format!("{at}.input must be an object"));
                };
                calls.push(json!({"id": id, "type": "function",
                    "function": {"name": name, "arguments": input.to_string()}}));
            }
            _ => return unsupported(b, &at),
        }
    }
    let mut m = Map::new();
    m.insert("role".into(), json!("assistant"));
    m.insert(
        "content".into(),
        if texts.is_empty() {
            Value::Null
        } else {
            text_content(texts)
        },
    );
    if !calls.is_empty() {
        m.insert("tool_calls".into(), Value::Array(calls));
    }
    Ok(Value::Object(m))
}

/// A tool (`name`, `description`, `input_schema`) as a chat function tool; server tools
/// (`type` other than `custom`) are refused.
fn tool(t: &Value, i: usize) -> Result<Value, Refusal> {
    let at = format!("tools[{i}]");
    match t.get("type") {
        None | Some(Value::Null) => {}
        Some(Value::String(k)) if k == "custom" => {}
        Some(k) => {
            return refuse(format!(
                "{at}: tools of type {k} (server tools) are not supported over the \
                 chat-completions API"
            ));
        }
    }
    only_keys(t, &["name", "description", "input_schema"], &at)?;
    let Some(name) = t.get("name").and_then(Value::as_str) else {
        return refuse(format!("{at}.name must be a string"));
    };
    let Some(schema) = t.get("input_schema").filter(|s| s.is_object()) else {
        return refuse(format!("{at}.input_schema must be an object"));
    };
    let mut function = Map::new();
    function.insert("name".into(), json!(name));
    match t.get("description") {
        None | Some(Value::Null) => {}
        Some(Value::String(d)) => {
            function.insert("description".into(), json!(d));
        }
        Some(_) => return refuse(format!("{at}.description must be a string")),
    }
    function.insert("parameters".into(), schema.clone());
    Ok(json!({"type": "function", "function": function}))
}

/// `tool_choice` (`auto`, `any`, `tool`, `none`, and `disable_parallel_tool_use`) in chat's
/// words (`auto`, `required`, a named function, `none`; `parallel_tool_calls`).
fn tool_choice(choice: &Value, chat: &mut Map<String, Value>) -> Result<(), Refusal> {
    let kind = choice.get("type").and_then(Value::as_str);
    let allowed: &[&str] = match kind {
        Some("tool") => &["name", "disable_parallel_tool_use"],
        Some("none") => &[],
        _ => &["disable_parallel_tool_use"],
    };
    only_keys(choice, allowed, "tool_choice")?;
    let value = match kind {
        Some("auto") => json!("auto"),
        Some("any") => json!("required"),
        Some("none") => json!("none"),
        Some("tool") => match choice.get("name").and_then(Value::as_str) {
            Some(name) => json!({"type": "function", "function": {"name": name}}),
            None => return refuse("tool_choice.name must be a string"),
        },
        _ => return refuse("tool_choice.type must be `auto`, `any`, `tool` or `none`"),
    };
    chat.insert("tool_choice".into(), value);
    match choice.get("disable_parallel_tool_use") {
        None | Some(Value::Null) => {}
        Some(Value::Bool(b)) => {
            chat.insert("parallel_tool_calls".into(), Value::Bool(!b));
        }
        Some(_) => return refuse("tool_choice.disable_parallel_tool_use must be a boolean"),
    }
    Ok(())
}

/// Anthropic's `stop_reason` (and `stop_sequence`) for a chat answer's finish: `length` is
/// `max_tokens`, calls or not (an answer cut by the limit is never reported whole: whole calls
/// before the cut still go out, as chat's `length` says, and as Anthropic's own API answers a
/// turn cut inside its tool use); otherwise a tool call that went out is `tool_use`;
/// `content_filter` is `refusal`; a `stop` is `stop_sequence` when the upstream named the
/// sequence it stopped at (vLLM's `stop_reason`) and it is one asked for, else `end_turn`.
fn stop_reason(
    finish: Option<&str>,
    matched: Option<&Value>,
    called: bool,
    stops: &[String],
) -> (&'static str, Option<String>) {
    match finish {
        Some("length") => ("max_tokens", None),
        _ if called => ("tool_use", None),
        Some("tool_calls" | "function_call") => ("tool_use", None),
        Some("content_filter") => ("refusal", None),
        _ => match matched.and_then(Value::as_str) {
            Some(s) if stops.iter().any(|x| x == s) => ("stop_sequence", Some(s.to_owned())),
            _ => ("end_turn", None),
        },
    }
}

/// A message id in Anthropic's form.
fn message_id(id: Option<&str>) -> String {
    match id {
        Some(id) if id.starts_with("msg_") => id.to_owned(),
        Some(id) if !id.is_empty() => format!("msg_{id}"),
        _ => "msg_selfheal".to_owned(),
    }
}

/// A chat `usage` as Anthropic's (`input_tokens`, `output_tokens`), zero when absent.
fn usage_of(usage: Option<&Value>) -> (u64, u64) {
    let n = |k: &str| {
        usage
            .and_then(|u| u.get(k))
            .and_then(Value::as_u64)
            .unwrap_or(0)
    };
    (n("prompt_tokens"), n("completion_tokens"))
}

/// A tool call's arguments as a `tool_use` block's `input`: a JSON object (an empty string is
/// `{}`), or a refusal.
fn input_of(arguments: Option<&Value>) -> Result<Value, Refusal> {
    match arguments {
        None | Some(Value::Null) => Ok(json!({})),
        Some(Value::String(s)) if s.trim().is_empty() => Ok(json!({})),
        Some(Value::String(s)) => match serde_json::from_str::<Value>(s) {
            Ok(v @ Value::Object(_)) => Ok(v),
            _ => refuse("the model's tool call arguments are not a JSON object"),
        },
        Some(v @ Value::Object(_)) => Ok(v.clone()),
        Some(_) => refuse("the model's tool call arguments are not a JSON object"),
    }
}

/// The text of a chat message's `content` (a string, or text parts) and `refusal`.
fn message_text(message: &Value) -> String {
    let mut text = match message.get("content") {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => parts
            .iter()
            .filter_map(|p| p.get("text").and_then(Value::as_str))
            .collect(),
        _ => String::new(),
    };
    if let Some(r) = message.get("refusal").and_then(Value::as_str)
        && !r.is_empty()
    {
        if !text.is_empty() {
            text.push_str("\n\n");
        }
        text.push_str(r);
    }
    text
}

/// Renders a healed chat completion as an Anthropic `message`, its `selfheal` report kept.
pub(crate) fn to_message(
    completion: &Value,
    model: &str,
    stops: &[String],
) -> Result<Value, Refusal> {
    let Some(choice) = completion.pointer("/choices/0") else {
        return refuse("the answer has no choice");
    };
    let message = choice.get("message").cloned().unwrap_or_else(|| json!({}));
    let mut content = Vec::new();
    let text = message_text(&message);
    if !text.is_empty() {
        content.push(json!({"type": "text", "text": text}));
    }
    for c in message
        .get("tool_calls")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let Some(name) = c.pointer("/function/name").and_then(Value::as_str) else {
            return refuse("the model's tool call has no name");
        };
        let id = c.get("id").and_then(Value::as_str).unwrap_or_default();
        content.push(json!({"type": "tool_use", "id": id, "name": name,
            "input": input_of(c.pointer("/function/arguments"))?}));
    }
    let called = content.iter().any(|b| block_type(b) == Some("tool_use"));
    let (reason, sequence) = stop_reason(
        choice.get("finish_reason").and_then(Value::as_str),
        choice.get("stop_reason"),
        called,
        stops,
    );
    let (input, output) = usage_of(completion.get("usage"));
    let mut out = json!({
        "id": message_id(completion.get("id").and_then(Value::as_str)),
        "type": "message",
        "role": "assistant",
        "model": completion.get("model").and_then(Value::as_str).unwrap_or(model),
        "content": content,
        "stop_reason": reason,
        "stop_sequence": sequence,
        "usage": {"input_tokens": input, "output_tokens": output},
    });
    if let (Some(report), Some(o)) = (completion.get("selfheal"), out.as_object_mut()) {
        o.insert("selfheal".into(), report.clone());
    }
    Ok(out)
}

/// An Anthropic error body: `{"type": "error", "error": {"type", "message"}}`, with the
/// gateway's own `code` (`calls_left_out`, `upstream_exhausted`, ...) when there is one.
pub(crate) fn error_body(status: StatusCode, message: &str, code: Option<&str>) -> Value {
    let kind = match status.as_u16() {
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        503 | 529 => "overloaded_error",
        // 422: the gateway could not give the model's answer (`on_partial = "error"`).
        422 => "api_error",
        400..=499 => "invalid_request_error",
        _ => "api_error",
    };
    let mut error = json!({"type": kind, "message": message});
    if let (Some(c), Some(o)) = (code, error.as_object_mut()) {
        o.insert("code".into(), json!(c));
    }
    json!({"type": "error", "error": error})
}

/// One Anthropic stream event: its name and data.
pub(crate) type Event = (&'static str, Value);

/// The open content block of a stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Open {
    Text,
    /// A `tool_use` block, for the chat call of this index.
    Tool(u64),
}

/// Translates the healed chat SSE stream into Anthropic stream events: `message_start`,
/// `content_block_start`/`delta`/`stop` (`text_delta`, `input_json_delta`), `message_delta`
/// (`stop_reason`, usage, the `selfheal` report) and `message_stop` on `[DONE]` after a
/// finish; an `error` event for an error chunk, an unreadable chunk, or a stream that ended
/// (or broke) before it finished — never a `message_stop` for an answer that did not finish.
#[derive(Debug, Clone)]
pub(crate) struct StreamRender {
    model: String,
    stops: Vec<String>,
    started: bool,
    open: Option<Open>,
    /// The next block's index.
    next: usize,
    called: bool,
    finish: Option<String>,
    matched: Option<Value>,
    usage: (u64, u64),
    selfheal: Option<Value>,
    ended: bool,
    calls_seen: u64,
}

impl StreamRender {
    /// A renderer for an answer to `model`, asked with `stops`.
    pub(crate) fn new(model: &str, stops: &[String]) -> StreamRender {
        StreamRender {
            model: model.to_owned(),
            stops: stops.to_vec(),
            started: false,
            open: None,
            next: 0,
            called: false,
            finish: None,
            matched: None,
            usage: (0, 0),
            selfheal: None,
            ended: false,
            calls_seen: 0,
        }
    }

    /// Whether the stream is over (`message_stop` or `error` sent): nothing more is read.
    pub(crate) fn ended(&self) -> bool {
        self.ended
    }

    /// Handles one `data:` payload of the chat stream.
    pub(crate) fn payload(&mut self, payload: &str, out: &mut Vec<Event>) {
        if self.ended {
            return;
        }
        if payload == "[DONE]" {
            if self.finish.is_none() {
                self.broke("the stream ended before the answer was finished", out);
            } else {
                self.close(out);
            }
            return;
        }
        let Ok(v) = serde_json::from_str::<Value>(payload) else {
            self.broke("the stream sent an unreadable chunk", out);
            return;
        };
        if let Some(e) = v.get("error") {
            let message = e
                .get("message")
                .and_then(Value::as_str)
                .map_or_else(|| e.to_string(), str::to_owned);
            let code = e.get("code").and_then(Value::as_str);
            out.push((
                "error",
                error_body(StatusCode::INTERNAL_SERVER_ERROR, &message, code),
            ));
            self.ended = true;
            return;
        }
        if !self.started {
            self.started = true;
            out.push((
                "message_start",
                json!({"type": "message_start", "message": {
                "id": message_id(v.get("id").and_then(Value::as_str)),
                "type": "message", "role": "assistant",
                "model": v.get("model").and_then(Value::as_str).unwrap_or(&self.model),
                "content": [], "stop_reason": null, "stop_sequence": null,
                "usage": {"input_tokens": 0, "output_tokens": 0}}}),
            ));
        }
        if let Some(s) = v.get("selfheal").filter(|s| !s.is_null()) {
            self.selfheal = Some(s.clone());
        }
        if let Some(u) = v.get("usage").filter(|u| !u.is_null()) {
            self.usage = usage_of(Some(u));
        }
        let Some(choice) = v.pointer("/choices/0") else {
            return;
        };
        if let Some(delta) = choice.get("delta") {
            let text = message_text(delta);
            if !text.is_empty() {
                self.text(&text, out);
            }
            for c in delta
                .get("tool_calls")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                self.call(c, out);
            }
        }
        if let Some(f) = choice.get("finish_reason").and_then(Value::as_str) {
            self.finish = Some(f.to_owned());
            self.matched = choice.get("stop_reason").cloned();
        }
    }

    /// The chat stream's body ended: an answer not closed by then was cut.
    pub(crate) fn end(&mut self, out: &mut Vec<Event>) {
        if !self.ended {
            self.broke("the stream ended before the answer was finished", out);
        }
    }

    /// The stream broke (`why`): an `error` event, and nothing after it.
    pub(crate) fn broke(&mut self, why: &str, out: &mut Vec<Event>) {
        if self.ended {
            return;
        }
        out.push((
            "error",
            error_body(
                StatusCode::INTERNAL_SERVER_ERROR,
                why,
                Some("stream_broken"),
            ),
        ));
        self.ended = true;
    }

    fn open_block(&mut self, open: Open, block: Value, out: &mut Vec<Event>) {
        self.stop_block(out);
        out.push((
            "content_block_start",
            json!({"type": "content_block_start", "index": self.next, "content_block": block}),
        ));
        self.open = Some(open);
        self.next += 1;
    }

    fn stop_block(&mut self, out: &mut Vec<Event>) {
        if self.open.take().is_some() {
            out.push((
                "content_block_stop",
                json!({"type": "content_block_stop", "index": self.next - 1}),
            ));
        }
    }

    fn text(&mut self, text: &str, out: &mut Vec<Event>) {
        if self.open != Some(Open::Text) {
            self.open_block(Open::Text, json!({"type": "text", "text": ""}), out);
        }
        out.push((
            "content_block_delta",
            json!({"type": "content_block_delta",
            "index": self.next - 1, "delta": {"type": "text_delta", "text": text}}),
        ));
    }

    fn call(&mut self, c: &Value, out: &mut Vec<Event>) {
        let index = c.get("index").and_then(Value::as_u64).unwrap_or(0);
        let id = c
            .get("id")
            .and_then(Value::as_str)
            .filter(|i| !i.is_empty());
        if id.is_some() || self.open != Some(Open::Tool(index)) {
            self.calls_seen += 1;
            let id = id.map_or_else(
                || format!("toolu_selfheal_{}", self.calls_seen),
                str::to_owned,
            );
            let name = c
                .pointer("/function/name")
                .and_then(Value::as_str)
                .unwrap_or_default();
            self.called = true;
            self.open_block(
                Open::Tool(index),
                json!({"type": "tool_use", "id": id, "name": name, "input": {}}),
                out,
            );
        }
        if let Some(a) = c
            .pointer("/function/arguments")
            .and_then(Value::as_str)
            .filter(|a| !a.is_empty())
        {
            out.push((
                "content_block_delta",
                json!({"type": "content_block_delta",
                "index": self.next - 1,
                "delta": {"type": "input_json_delta", "partial_json": a}}),
            ));
        }
    }

    fn close(&mut self, out: &mut Vec<Event>) {
        self.stop_block(out);
        let (reason, sequence) = stop_reason(
            self.finish.as_deref(),
            self.matched.as_ref(),
            self.called,
            &self.stops,
        );
        let mut delta = json!({"type": "message_delta",
            "delta": {"stop_reason": reason, "stop_sequence": sequence},
            "usage": {"input_tokens": self.usage.0, "output_tokens": self.usage.1}});
        if let (Some(s), Some(o)) = (self.selfheal.take(), delta.as_object_mut()) {
            o.insert("selfheal".into(), s);
        }
        out.push(("message_delta", delta));
        out.push(("message_stop", json!({"type": "message_stop"})));
        self.ended = true;
    }
}

/// An event as SSE bytes.
fn frame((name, data): &Event) -> Bytes {
    Bytes::from(format!("event: {name}\ndata: {data}\n\n"))
}

/// `POST /v1/messages`: admitted, bounded and logged by the route's layers ([`crate::layers`],
/// with the Messages [`edge`]), translated, healed by the chat pipeline
/// ([`chat::chat_inner`]), and its answer rendered back in Anthropic's shape.
pub(crate) async fn messages(
    State(s): State<Arc<AppState>>,
    caller: Caller,
    label: RunLabel,
    Received(bytes): Received,
) -> Result<Response, Refused> {
    let req: Value = serde_json::from_slice(&bytes)
        .map_err(|e| ApiError::bad_request(format!("the body is not JSON: {e}")))?;
    let translated = to_chat(&req).map_err(|r| ApiError::bad_request(r.0))?;
    let Ok(chat) = serde_json::to_vec(&translated.chat) else {
        return Ok(error_response(
            StatusCode::INTERNAL_SERVER_ERROR,
            "could not encode the request",
            None,
        ));
    };
    // The chat form can be longer than the client's body (a `tool_use` input becomes an escaped
    // string): said as such, not as a body the client did not send.
    let limit = s.config.max_body_bytes;
    if chat.len() > limit {
        return Err(Refused(ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "invalid_request_error",
            "request_too_large",
            format!(
                "the request, translated to chat completions, is {} bytes: more than the \
                 gateway's max_body_bytes ({limit})",
                chat.len()
            ),
        )));
    }
    // Boxed, as the chat handler's turn ([`chat::chat`]).
    let resp = Box::pin(chat::chat_inner(
        &s,
        caller,
        label.as_str(),
        Bytes::from(chat),
    ))
    .await?;
    Ok(render(resp, Some(&translated)).await)
}

/// The Messages API's edge, around the layers every API shares: the `anthropic` SDK sends its
/// key as `x-api-key`, read here as a bearer key (tenant, redaction, and the client's
/// credentials upstream), as `Authorization` is; and every refusal — admission's, the body
/// limits', the pipeline's — is said in Anthropic's shape.
pub(crate) async fn edge(mut req: Request, next: Next) -> Response {
    let headers = req.headers_mut();
    if !headers.contains_key(header::AUTHORIZATION)
        && let Some(key) = headers.get("x-api-key").and_then(|v| v.to_str().ok())
        && let Ok(v) = HeaderValue::from_str(&format!("Bearer {}", key.trim()))
    {
        headers.insert(header::AUTHORIZATION, v);
    }
    let resp = next.run(req).await;
    if resp.extensions().get::<layers::Refusal>().is_some() {
        return render(resp, None).await;
    }
    resp
}

/// An Anthropic error response.
fn error_response(status: StatusCode, message: &str, code: Option<&str>) -> Response {
    (status, axum::Json(error_body(status, message, code))).into_response()
}

/// The most bytes of a whole answer (or error) of the chat pipeline read back for rendering.
const MAX_RENDERED_BYTES: usize = 64 * 1024 * 1024;

/// The chat pipeline's response in Anthropic's shape: an error with its status, a message, or
/// a stream of events; the `x-selfheal-*` headers (and any other but the body's) kept.
async fn render(resp: Response, t: Option<&Translated>) -> Response {
    let (parts, body) = resp.into_parts();
    let keep = |out: &mut Response| {
        for (k, v) in &parts.headers {
            if k != header::CONTENT_TYPE && k != header::CONTENT_LENGTH {
                out.headers_mut().insert(k.clone(), v.clone());
            }
        }
    };
    let event_stream = parts
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|c| c.starts_with("text/event-stream"));
    let mut out = match t {
        Some(t) if parts.status.is_success() && event_stream => stream_response(body, t),
        _ => {
            let bytes = axum::body::to_bytes(body, MAX_RENDERED_BYTES)
                .await
                .unwrap_or_default();
            let v: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
            match t {
                Some(t) if parts.status.is_success() => {
                    match to_message(&v, &t.model, &t.stop_sequences) {
                        Ok(m) => axum::Json(m).into_response(),
                        Err(r) => error_response(
                            StatusCode::BAD_GATEWAY,
                            &format!("the answer cannot be given as a message: {r}"),
                            None,
                        ),
                    }
                }
                _ => {
                    let message = v
                        .pointer("/error/message")
                        .and_then(Value::as_str)
                        .unwrap_or("the request failed");
                    let code = v.pointer("/error/code").and_then(Value::as_str);
                    error_response(parts.status, message, code)
                }
            }
        }
    };
    keep(&mut out);
    out
}

/// The chat pipeline's SSE body, read event by event and rendered as Anthropic events.
fn stream_response(body: Body, t: &Translated) -> Response {
    struct Pump {
        body: axum::body::BodyDataStream,
        buf: Vec<u8>,
        render: StreamRender,
        out: VecDeque<Bytes>,
        done: bool,
    }
    impl Pump {
        /// Renders the events complete in the buffer (all of it when `last`).
        fn drain(&mut self, last: bool) {
            let mut events = Vec::new();
            let mut start = 0;
            while let Some((end, sep)) = crate::stream::find_event_end(&self.buf[start..], 0) {
                payloads(&self.buf[start..start + end], &mut self.render, &mut events);
                start += end + sep;
            }
            self.buf.drain(..start);
            if last && !self.buf.is_empty() {
                let rest = std::mem::take(&mut self.buf);
                payloads(&rest, &mut self.render, &mut events);
            }
            if self.buf.len() > crate::stream::MAX_EVENT_BYTES {
                self.render
                    .broke("the stream sent an event larger than allowed", &mut events);
            }
            self.out.extend(events.iter().map(frame));
            if self.render.ended() {
                self.done = true;
            }
        }
    }
    let pump = Pump {
        body: body.into_data_stream(),
        buf: Vec::new(),
        render: StreamRender::new(&t.model, &t.stop_sequences),
        out: VecDeque::new(),
        done: false,
    };
    let events = futures_util::stream::unfold(pump, |mut p| async move {
        loop {
            if let Some(b) = p.out.pop_front() {
                return Some((Ok::<_, std::io::Error>(b), p));
            }
            if p.done {
                return None;
            }
            match p.body.next().await {
                Some(Ok(chunk)) => {
                    p.buf.extend_from_slice(&chunk);
                    p.drain(false);
                }
                Some(Err(e)) => {
                    let mut events = Vec::new();
                    p.render
                        .broke(&format!("the stream broke: {e}"), &mut events);
                    p.out.extend(events.iter().map(frame));
                    p.done = true;
                }
                None => {
                    p.drain(true);
                    let mut events = Vec::new();
                    p.render.end(&mut events);
                    p.out.extend(events.iter().map(frame));
                    p.done = true;
                }
            }
        }
    });
    let mut resp = Response::new(Body::from_stream(events));
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    resp
}

/// Feeds the `data:` of one SSE event's text (its lines joined, as SSE says) to `render`.
fn payloads(event: &[u8], render: &mut StreamRender, out: &mut Vec<Event>) {
    let text = String::from_utf8_lossy(event);
    let data: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .map(|d| d.strip_prefix(' ').unwrap_or(d))
        .collect();
    if !data.is_empty() {
        render.payload(data.join("\n").trim(), out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tools() -> Value {
        json!([{"name": "lookup", "description": "Look a key up.",
                "input_schema": {"type": "object", "properties": {"key": {"type": "string"}},
                                 "required": ["key"]}}])
    }

    fn request(messages: Value) -> Value {
        json!({"model": "stub", "max_tokens": 256, "messages": messages, "tools": tools()})
    }

    #[test]
    fn a_tool_loop_translates_to_chat() {
        let req = json!({
            "model": "stub", "max_tokens": 100,
            "system": [{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
            "messages": [
                {"role": "user", "content": "What is the answer?"},
                {"role": "assistant", "content": [
                    {"type": "text", "text": "Let me look."},
                    {"type": "tool_use", "id": "toolu_1", "name": "lookup", "input": {"key": "answer"}}]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": "ok: 42"},
                    {"type": "text", "text": "Thanks."}]}],
            "tools": tools(),
            "tool_choice": {"type": "any", "disable_parallel_tool_use": true},
            "stop_sequences": ["END"], "temperature": 0.5,
            "metadata": {"user_id": "u-1"}, "stream": true,
        });
        let t = to_chat(&req).unwrap();
        assert_eq!(
            t.chat,
            json!({
                "model": "stub", "max_tokens": 100, "stream": true,
                "messages": [
                    {"role": "system", "content": "Be brief."},
                    {"role": "user", "content": "What is the answer?"},
                    {"role": "assistant", "content": "Let me look.", "tool_calls": [{"id": "toolu_1",
                        "type": "function", "function": {"name": "lookup", "arguments": "{\"key\":\"answer\"}"}}]},
                    {"role": "tool", "tool_call_id": "toolu_1", "content": "ok: 42"},
                    {"role": "user", "content": "Thanks."}],
                "tools": [{"type": "function", "function": {"name": "lookup",
                    "description": "Look a key up.", "parameters": tools()[0]["input_schema"]}}],
                "tool_choice": "required", "parallel_tool_calls": false,
                "stop": ["END"], "temperature": 0.5, "user": "u-1",
            })
        );
        assert_eq!(t.stop_sequences, ["END"]);
    }

    #[test]
    fn tool_choice_and_results_map_each_way() {
        let choice = |c: Value| {
            let mut r = request(json!([{"role": "user", "content": "hi"}]));
            r["tool_choice"] = c;
            to_chat(&r).map(|t| t.chat["tool_choice"].clone())
        };
        assert_eq!(choice(json!({"type": "auto"})).unwrap(), json!("auto"));
        assert_eq!(choice(json!({"type": "none"})).unwrap(), json!("none"));
        assert_eq!(
            choice(json!({"type": "tool", "name": "lookup"})).unwrap(),
            json!({"type": "function", "function": {"name": "lookup"}})
        );
        assert!(choice(json!({"type": "sometimes"})).is_err());
        // An error result is said in words; several text blocks stay several parts.
        let r = request(json!([{"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "a", "is_error": true, "content": "backend down"},
            {"type": "tool_result", "tool_use_id": "b",
             "content": [{"type": "text", "text": "one"}, {"type": "text", "text": "two"}]}]}]));
        let m = &to_chat(&r).unwrap().chat["messages"];
        assert_eq!(m[0]["content"], json!("Error: backend down"));
        assert_eq!(
            m[1]["content"],
            json!([{"type": "text", "text": "one"}, {"type": "text", "text": "two"}])
        );
    }

    /// What the chat API cannot carry is refused with a message naming it, never dropped.
    #[test]
    fn what_cannot_be_carried_is_refused() {
        let image = json!({"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}});
        let cases = [
            (
                request(json!([{"role": "user", "content": [image]}])),
                "`image`",
            ),
            (
                request(json!([{"role": "user", "content": [{"type": "document", "source": {}}]}])),
                "`document`",
            ),
            (
                request(json!([
                    {"role": "user", "content": "hi"},
                    {"role": "assistant", "content": [{"type": "thinking", "thinking": "hm", "signature": "s"}]},
                    {"role": "user", "content": "go on"}])),
                "`thinking`",
            ),
            (
                request(json!([{"role": "user", "content": [{"type": "tool_result",
                    "tool_use_id": "a", "content": [image]}]}])),
                "`image`",
            ),
            (
                request(json!([
                    {"role": "user", "content": "hi"},
                    {"role": "assistant", "content": [
                        {"type": "tool_use", "id": "a", "name": "lookup", "input": {}},
                        {"type": "text", "text": "after"}]},
                    {"role": "user", "content": "go on"}])),
                "after a `tool_use`",
            ),
            (
                request(json!([{"role": "user", "content": "hi"},
                               {"role": "assistant", "content": "The answer is"}])),
                "prefill",
            ),
            (
                json!({"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}],
                       "tools": [{"type": "web_search_20250305", "name": "web_search"}]}),
                "server tools",
            ),
            (
                json!({"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}],
                       "thinking": {"type": "enabled", "budget_tokens": 1024}}),
                "`thinking`",
            ),
            (
                json!({"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}],
                       "service_tier": "auto"}),
                "`service_tier`",
            ),
            (
                json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]}),
                "max_tokens",
            ),
            (
                json!({"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}],
                       "metadata": {"session": "x"}}),
                "metadata.session",
            ),
            (
                request(
                    json!([{"role": "user", "content": [{"type": "text", "text": "x",
                    "citations": [{"type": "char_location"}]}]}]),
                ),
                "citations",
            ),
        ];
        for (req, says) in cases {
            let err = to_chat(&req).expect_err(says);
            assert!(err.0.contains(says), "{says}: {err}");
        }
    }

    /// An assistant turn sent as a request and the same turn answered by the chat API render
    /// the same blocks: the translation loses nothing either way.
    #[test]
    fn assistant_turns_round_trip() {
        let turns = [
            json!([{"type": "text", "text": "Let me look."},
                   {"type": "tool_use", "id": "toolu_1", "name": "lookup", "input": {"key": "answer"}}]),
            json!([{"type": "tool_use", "id": "toolu_1", "name": "lookup", "input": {"key": "a"}},
                   {"type": "tool_use", "id": "toolu_2", "name": "lookup", "input": {"key": "b", "n": [1, 2]}}]),
            json!([{"type": "text", "text": "The answer is 42."}]),
        ];
        for blocks in turns {
            let req = request(json!([{"role": "user", "content": "hi"},
                                     {"role": "assistant", "content": blocks.clone()},
                                     {"role": "user", "content": "again"}]));
            let chat = to_chat(&req).unwrap().chat;
            let message = chat["messages"][1].clone();
            let finish = if message.get("tool_calls").is_some() {
                "tool_calls"
            } else {
                "stop"
            };
            let completion = json!({"id": "chatcmpl-1", "model": "stub",
                "choices": [{"index": 0, "message": message, "finish_reason": finish}],
                "usage": {"prompt_tokens": 7, "completion_tokens": 3}});
            let back = to_message(&completion, "stub", &[]).unwrap();
            assert_eq!(back["content"], blocks);
            let want = if finish == "tool_calls" {
                "tool_use"
            } else {
                "end_turn"
            };
            assert_eq!(back["stop_reason"], json!(want));
            assert_eq!(
                back["usage"],
                json!({"input_tokens": 7, "output_tokens": 3})
            );
            // The same answer streamed renders the same message.
            assert_eq!(streamed(&completion, &[]), back);
        }
    }

    /// Plays the events of a stream into a message, as the SDK's accumulator does.
    fn accumulate<N: AsRef<str>>(events: &[(N, Value)]) -> Result<Value, String> {
        let mut message = Value::Null;
        let mut json_parts: Vec<String> = Vec::new();
        for (name, data) in events {
            let name = name.as_ref();
            assert_eq!(data["type"], json!(name), "{data}");
            match name {
                "message_start" => message = data["message"].clone(),
                "content_block_start" => {
                    message["content"]
                        .as_array_mut()
                        .unwrap()
                        .push(data["content_block"].clone());
                    json_parts.push(String::new());
                }
                "content_block_delta" => {
                    let i = data["index"].as_u64().unwrap() as usize;
                    let d = &data["delta"];
                    match d["type"].as_str().unwrap() {
                        "text_delta" => {
                            let b = &mut message["content"][i]["text"];
                            *b = json!(format!(
                                "{}{}",
                                b.as_str().unwrap(),
                                d["text"].as_str().unwrap()
                            ));
                        }
                        "input_json_delta" => {
                            json_parts[i].push_str(d["partial_json"].as_str().unwrap())
                        }
                        other => panic!("{other}"),
                    }
                }
                "content_block_stop" => {
                    let i = data["index"].as_u64().unwrap() as usize;
                    if message["content"][i]["type"] == "tool_use" && !json_parts[i].is_empty() {
                        message["content"][i]["input"] =
                            serde_json::from_str(&json_parts[i]).unwrap();
                    }
                }
                "message_delta" => {
                    message["stop_reason"] = data["delta"]["stop_reason"].clone();
                    message["stop_sequence"] = data["delta"]["stop_sequence"].clone();
                    message["usage"] = data["usage"].clone();
                    if let Some(s) = data.get("selfheal") {
                        message["selfheal"] = s.clone();
                    }
                }
                "message_stop" => return Ok(message),
                "error" => return Err(data["error"]["message"].as_str().unwrap().to_owned()),
                other => panic!("{other}"),
            }
        }
        Err("no message_stop".into())
    }

    /// The message a stream of `completion`'s chunks (as the relay sends a whole answer)
    /// renders to.
    fn streamed(completion: &Value, stops: &[String]) -> Value {
        let mut r = StreamRender::new("stub", stops);
        let mut events = Vec::new();
        for f in crate::stream::answer_frames(completion) {
            let bytes = f.unwrap();
            payloads(&bytes, &mut r, &mut events);
        }
        r.end(&mut events);
        let mut message = accumulate(&events).unwrap();
        message["usage"] = json!({"input_tokens": 7, "output_tokens": 3});
        message
    }

    fn chunk(delta: Value, finish: Value) -> String {
        json!({"id": "chatcmpl-1", "model": "stub",
               "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
        .to_string()
    }

    /// A stream whose tool call arrives in pieces (as passed through from an upstream) renders
    /// as a `tool_use` block with its JSON in `input_json_delta`s; the report and the usage
    /// ride on `message_delta`.
    #[test]
    fn a_streamed_answer_renders_as_anthropic_events() {
        let mut r = StreamRender::new("stub", &[]);
        let mut ev = Vec::new();
        for p in [
            chunk(json!({"role": "assistant", "content": "Let me "}), Value::Null),
            chunk(json!({"content": "look."}), Value::Null),
            chunk(
                json!({"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                "function": {"name": "lookup", "arguments": "{\"key\""}}]}),
                Value::Null,
            ),
            chunk(
                json!({"tool_calls": [{"index": 0, "function": {"arguments": ": \"answer\"}"}}]}),
                Value::Null,
            ),
            json!({"id": "chatcmpl-1", "choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}],
                   "selfheal": {"status": "complete"}})
            .to_string(),
            json!({"id": "chatcmpl-1", "choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 4}})
                .to_string(),
            "[DONE]".to_owned(),
        ] {
            r.payload(&p, &mut ev);
        }
        let names: Vec<&str> = ev.iter().map(|e| e.0).collect();
        assert_eq!(
            names,
            [
                "message_start",
                "content_block_start",
                "content_block_delta",
                "content_block_delta",
                "content_block_stop",
                "content_block_start",
                "content_block_delta",
                "content_block_delta",
                "content_block_stop",
                "message_delta",
                "message_stop"
            ]
        );
        let m = accumulate(&ev).unwrap();
        assert_eq!(
            m["content"],
            json!([{"type": "text", "text": "Let me look."},
                   {"type": "tool_use", "id": "call_1", "name": "lookup", "input": {"key": "answer"}}])
        );
        assert_eq!(m["stop_reason"], json!("tool_use"));
        assert_eq!(m["usage"], json!({"input_tokens": 9, "output_tokens": 4}));
        assert_eq!(m["selfheal"], json!({"status": "complete"}));
    }

    /// A cut stream, an error chunk or `[DONE]` without a finish never ends in `message_stop`.
    #[test]
    fn a_cut_or_failed_stream_ends_in_an_error_event() {
        let text = chunk(
            json!({"role": "assistant", "content": "Partial "}),
            Value::Null,
        );
        let error = json!({"error": {"message": "upstream stream error: overloaded",
                                     "type": "upstream_error", "code": "stream_broken"}})
        .to_string();
        let cases: [(&[&str], bool, &str); 4] = [
            (&[&text], true, "ended before the answer was finished"),
            (&[&text, &error], false, "overloaded"),
            (
                &[&text, "[DONE]"],
                false,
                "ended before the answer was finished",
            ),
            (&[&text, "{\"choices\": [{\"del"], false, "unreadable"),
        ];
        for (payloads, then_end, says) in cases {
            let mut r = StreamRender::new("stub", &[]);
            let mut ev = Vec::new();
            for p in payloads {
                r.payload(p, &mut ev);
            }
            if then_end {
                r.end(&mut ev);
            }
            assert!(r.ended());
            let names: Vec<&str> = ev.iter().map(|e| e.0).collect();
            assert!(!names.contains(&"message_stop"), "{names:?}");
            assert_eq!(names.last(), Some(&"error"));
            let err = accumulate(&ev).unwrap_err();
            assert!(err.contains(says), "{err}");
            assert_eq!(ev.last().unwrap().1["type"], json!("error"));
        }
    }

    /// The events of a rendered SSE body, read back.
    async fn read_events(resp: Response) -> Vec<(String, Value)> {
        let bytes = axum::body::to_bytes(resp.into_body(), usize::MAX)
            .await
            .unwrap();
        String::from_utf8(bytes.to_vec())
            .unwrap()
            .split("\n\n")
            .filter(|e| !e.is_empty())
            .map(|e| {
                let (name, data) = e.split_once('\n').unwrap();
                (
                    name.strip_prefix("event: ").unwrap().to_owned(),
                    serde_json::from_str(data.strip_prefix("data: ").unwrap()).unwrap(),
                )
            })
            .collect()
    }

    /// However the chat stream's bytes are cut into chunks, the same Anthropic events come
    /// out; a body that ends without `[DONE]` ends in an `error` event.
    #[tokio::test]
    async fn the_rendered_stream_does_not_depend_on_chunking() {
        let completion = json!({"id": "chatcmpl-1", "model": "stub",
            "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
                "role": "assistant", "content": "Let me look.",
                "tool_calls": [{"id": "call_1", "type": "function",
                    "function": {"name": "lookup", "arguments": "{\"key\": \"answer\"}"}}]}}],
            "selfheal": {"status": "complete"}});
        let body: Vec<u8> = crate::stream::answer_frames(&completion)
            .into_iter()
            .flat_map(|f| f.unwrap().to_vec())
            .collect();
        let t = Translated {
            chat: Value::Null,
            model: "stub".into(),
            stop_sequences: Vec::new(),
        };
        let render = |chunks: Vec<Vec<u8>>| {
            let stream =
                futures_util::stream::iter(chunks.into_iter().map(Ok::<_, std::io::Error>));
            stream_response(Body::from_stream(stream), &t)
        };
        let whole = read_events(render(vec![body.clone()])).await;
        assert_eq!(whole.last().unwrap().0, "message_stop");
        let message = accumulate(&whole).unwrap();
        assert_eq!(
            message,
            to_message(&completion, "stub", &[])
                .map(|mut m| {
                    m["usage"] = json!({"input_tokens": 0, "output_tokens": 0});
                    m
                })
                .unwrap()
        );
        for size in [1, 2, 3, 7, 64] {
            let chunks = body.chunks(size).map(<[u8]>::to_vec).collect();
            assert_eq!(read_events(render(chunks)).await, whole, "chunks of {size}");
        }
        // Cut before `[DONE]`: the text that went out, then an error, no `message_stop`.
        let cut = body[..body.len() / 2].to_vec();
        let events = read_events(render(vec![cut])).await;
        assert_eq!(events.first().unwrap().0, "message_start");
        assert_eq!(events.last().unwrap().0, "error");
        assert!(events.iter().all(|(n, _)| n != "message_stop"));
    }

    #[test]
    fn stop_reasons_map() {
        let stops = ["END".to_owned()];
        assert_eq!(
            stop_reason(Some("length"), None, false, &stops).0,
            "max_tokens"
        );
        assert_eq!(stop_reason(Some("stop"), None, false, &stops).0, "end_turn");
        assert_eq!(
            stop_reason(Some("stop"), Some(&json!("END")), false, &stops),
            ("stop_sequence", Some("END".to_owned()))
        );
        // A sequence not asked for is not claimed.
        assert_eq!(
            stop_reason(Some("stop"), Some(&json!("</s>")), false, &stops).0,
            "end_turn"
        );
        assert_eq!(stop_reason(Some("stop"), None, true, &stops).0, "tool_use");
        // Calls in an answer the limit cut: the cut is said, never a whole tool turn.
        assert_eq!(
            stop_reason(Some("length"), None, true, &stops).0,
            "max_tokens"
        );
        assert_eq!(
            stop_reason(Some("content_filter"), None, false, &stops).0,
            "refusal"
        );
    }

    /// Arguments that are not a JSON object are refused, not passed on as a guess.
    #[test]
    fn unusable_arguments_are_refused_in_a_message() {
        let completion = json!({"choices": [{"message": {"role": "assistant", "content": null,
            "tool_calls": [{"id": "c", "type": "function",
                            "function": {"name": "lookup", "arguments": "{\"key\": "}}]},
            "finish_reason": "tool_calls"}]});
        assert!(to_message(&completion, "stub", &[]).is_err());
    }

    #[test]
    fn error_bodies_are_anthropic_shaped() {
        assert_eq!(
            error_body(
                StatusCode::NOT_FOUND,
                "no such model",
                Some("model_not_found")
            ),
            json!({"type": "error", "error": {"type": "not_found_error",
                   "message": "no such model", "code": "model_not_found"}})
        );
        assert_eq!(
            error_body(StatusCode::BAD_REQUEST, "x", None)["error"]["type"],
            json!("invalid_request_error")
        );
        assert_eq!(
            error_body(StatusCode::UNAUTHORIZED, "x", None)["error"]["type"],
            json!("authentication_error")
        );
        assert_eq!(
            error_body(StatusCode::BAD_GATEWAY, "x", None)["error"]["type"],
            json!("api_error")
        );
    }
}
