//! The OpenAI wire as the healing modules read it: the tools a request offers ([`ToolIndex`]),
//! a tool call that cannot be used ([`Problem`]), whether a tool result reads as a hard failure,
//! and the small reads of calls and items every API shares. It sits below `heal`, `recover` and
//! `runs`, which all read these, so none of them has to import another for them.

use std::collections::HashMap;

use serde_json::{Value, json};

use crate::request::ChatRequest;

/// One tool the request offers.
#[derive(Debug, Clone)]
pub struct ToolSpec {
    /// The JSON Schema of its arguments (`{}` when none).
    pub parameters: Value,
    /// The schema's text as the client sent it: the key of the [`GuideCache`](crate::heal::GuideCache).
    pub schema_key: String,
    /// The names of its required arguments.
    pub required: Vec<String>,
}

/// The tools of a request by name.
pub type ToolIndex = HashMap<String, ToolSpec>;

/// Indexes the `tools` of a request.
pub fn tool_index(req: &ChatRequest<'_>) -> ToolIndex {
    let mut out = ToolIndex::new();
    for t in &req.tools() {
        let Some(name) = &t.name else { continue };
        let parameters = t
            .parameters
            .and_then(|p| serde_json::from_str::<Value>(p.get()).ok())
            .unwrap_or_else(|| json!({}));
        let required = selfheal_repair::required_properties(&parameters);
        out.insert(
            name.as_str().to_owned(),
            ToolSpec {
                schema_key: t
                    .parameters
                    .map_or_else(|| "{}".to_owned(), |p| p.get().to_owned()),
                parameters,
                required,
            },
        );
    }
    out
}

/// Whether a tool result's text reports that the tool raised, timed out or could not reach its
/// service (a hard failure, SPEC §1). On the wire a tool result is only text, so this reads the
/// shapes agent frameworks and tools give an exception:
///
/// - prefixes: `Error`, `Exception`, `Traceback`, `Tool error`, `Timeout`, `Timed out`, and
///   openai-agents' `An error occurred while running the tool`;
/// - an exception class as the first word: `ValueError: ...`,
///   `requests.exceptions.ConnectionError: ...`, `TimeoutException: ...`;
/// - pydantic-ai's retry prompt, which ends `Fix the errors and try again.`;
/// - in a short first line (errors are short, results are not): a traceback header, a refused,
///   reset or timed-out connection, an HTTP 5xx or 429 phrase.
///
/// Anything else is a result, which the monitor may still judge a *soft* failure (`{"error": …}`,
/// empty or null).
pub(crate) fn is_hard_failure_text(text: &str) -> bool {
    let t = text.trim();
    let first_line = t.lines().next().unwrap_or("");
    // The first 200 characters of the first line, ASCII-lowercased on the stack: this runs on
    // every tool result of every request, so it neither allocates nor builds a searcher.
    let head_len = first_line
        .char_indices()
        .nth(200)
        .map_or(first_line.len(), |(i, _)| i);
    let mut buf = [0u8; 200 * 4];
    let head = &mut buf[..head_len];
    head.copy_from_slice(&first_line.as_bytes()[..head_len]);
    head.make_ascii_lowercase();
    // A prefix of `first_line` that ends on a character boundary, with only ASCII letters
    // changed: still UTF-8.
    let Ok(head) = std::str::from_utf8(head) else {
        return false;
    };
    if HARD_PREFIXES.iter().any(|p| head.starts_with(p)) {
        return true;
    }
    if let Some((word, _)) = head.split_once(':')
        && !word.is_empty()
        && !word.contains(char::is_whitespace)
        && (word.ends_with("error") || word.ends_with("exception"))
    {
        return true;
    }
    const RETRY_PROMPT: &str = "fix the errors and try again.";
    // The last bytes compared without lowering the whole text.
    if t.as_bytes()
        .get(t.len().wrapping_sub(RETRY_PROMPT.len())..)
        .is_some_and(|tail| tail.eq_ignore_ascii_case(RETRY_PROMPT.as_bytes()))
    {
        return true;
    }
    first_line.len() <= 200 && PHRASES.iter().any(|f| f.find(head.as_bytes()).is_some())
}

/// How an error's lowercased first line may begin.
pub(crate) const HARD_PREFIXES: [&str; 8] = [
    "error",
    "exception",
    "traceback",
    "an error occurred",
    "tool error",
    "timeout",
    "timed out",
    "fatal:",
];

/// Phrases of an error's short first line (matched in its lowercased head).
pub(crate) const HARD_PHRASES: [&str; 11] = [
    "traceback (most recent call last)",
    "connection refused",
    "connection reset",
    "econnrefused",
    "etimedout",
    "timed out",
    "internal server error",
    "service unavailable",
    "bad gateway",
    "gateway timeout",
    "too many requests",
];

/// [`HARD_PHRASES`], each with its searcher built once.
static PHRASES: std::sync::LazyLock<Vec<memchr::memmem::Finder<'static>>> =
    std::sync::LazyLock::new(|| {
        HARD_PHRASES
            .iter()
            .map(|p| memchr::memmem::Finder::new(p.as_bytes()))
            .collect()
    });

/// Why a tool call of a model's answer cannot be used, as found: what the core's ladder
/// re-asks it by ([`unusable_signal`](crate::heal::unusable_signal)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unusable {
    /// A call of a tool not on offer (its name): the model's wrong tool choice.
    UnknownTool(String),
    /// A required argument written empty: an input the model does not have, a step of its plan
    /// missing.
    EmptyInput,
    /// Arguments that cannot be used as written (or, for the grounding check, that nothing in
    /// the conversation supports).
    Arguments,
    /// The call repeats, name and arguments, one the model made in its previous turn and whose
    /// result it has ([`Answered`](crate::heal::Answered)): the model's control loop, as the in-process client reads
    /// a call that repeats the previous step's.
    Repetition,
    /// The answer degenerated (a run of whitespace, one piece repeated) and was cut
    /// ([`selfheal_core::degenerate`]), which the run reads as malformed output.
    Degenerate(selfheal_core::degenerate::Degenerate),
}

/// One tool call that cannot be used: why, and the re-ask text that tells the model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// Why.
    pub kind: Unusable,
    /// The re-ask text.
    pub text: String,
}

impl Problem {
    /// The problem of an answer that degenerated (`d`), with the re-ask text that tells the
    /// model what happened and what to do instead: the tools on offer (`tools`, sorted), if any.
    pub(crate) fn degenerate(d: &selfheal_core::degenerate::Degenerate, tools: &[&str]) -> Problem {
        let reason = d.reason();
        let next = if tools.is_empty() {
            "Answer again: if a tool is needed, call it with a structured tool call; otherwise \
             answer briefly in words."
                .to_owned()
        } else {
            format!(
                "Answer again: call one of the tools on offer ({}) with a structured tool call, \
                 or answer briefly in words.",
                tools.join(", ")
            )
        };
        Problem {
            kind: Unusable::Degenerate(d.clone()),
            text: format!("Your last answer was cut: {reason}. {next}"),
        }
    }
}

/// Runs `take` on the tool calls of an assistant `message` (it takes out the calls it refuses
/// and returns their problems); `tool_calls` is removed, and `content` made a string, when no
/// call is left, as [`check_message`](crate::heal::check_message) does.
pub(crate) fn take_calls(
    message: &mut Value,
    take: impl FnOnce(&mut Vec<Value>) -> Vec<Problem>,
) -> Vec<Problem> {
    let Some(calls) = message.get_mut("tool_calls").and_then(Value::as_array_mut) else {
        return Vec::new();
    };
    let problems = take(calls);
    if calls.is_empty()
        && let Some(m) = message.as_object_mut()
    {
        m.remove("tool_calls");
        if m.get("content").is_none_or(Value::is_null) {
            m.insert("content".into(), Value::String(String::new()));
        }
    }
    problems
}

/// Gives a tool call (`key`: chat's `id`, a Responses item's `call_id`) an id when its model
/// sent none, or an empty or non-string one, as some OpenAI-compatible servers do: without one
/// the client cannot send the call's result back (a number becomes its digits as a string). The id names the call and says nothing the
/// model wrote; it is unique in this process and, through its start time, across restarts.
/// Whether one was given.
pub(crate) fn ensure_id(call: &mut Value, key: &str) -> bool {
    let id = match call.get(key) {
        Some(Value::String(id)) if !id.is_empty() => return false,
        // A number names the call as well as its digits do.
        Some(Value::Number(n)) => n.to_string(),
        _ => fresh_call_id(),
    };
    let Some(o) = call.as_object_mut() else {
        return false;
    };
    o.insert(key.into(), Value::String(id));
    true
}

/// A new tool call id (see [`ensure_id`]).
pub(crate) fn fresh_call_id() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    static START: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    let start = *START.get_or_init(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
    });
    format!(
        "call_selfheal_{start:x}_{}",
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// The `type` of a JSON object (a Responses item or event, a tool definition, a content part):
/// the one spelling of that read.
pub(crate) fn item_type(item: &Value) -> Option<&str> {
    item.get("type").and_then(Value::as_str)
}

/// A problem is written (in the trace's events) as its re-ask text.
impl serde::Serialize for Problem {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.text)
    }
}

impl Problem {
    /// A problem of unusable arguments with re-ask `text`.
    pub fn arguments(text: String) -> Problem {
        Problem {
            kind: Unusable::Arguments,
            text,
        }
    }
}
