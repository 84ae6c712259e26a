//! The upstream's non-streaming answer, read without building a `serde_json::Value` when
//! healing has nothing to change in it.
//!
//! Why: almost every answer is already usable — its tool calls name offered tools and their
//! arguments fit the schemas as written. Parsing such an answer into a `Value` tree and writing
//! it back only to add the `selfheal` report cost more instructions than the rest of healing put
//! together. So an answer is first read in one pass over its bytes that builds no tree: it
//! accepts exactly the documents a `Value` would (numbers in range, strings valid UTF-8 with
//! valid escapes, nesting within serde_json's limit; see `Checked`) and keeps only what
//! healing needs: how the first choice ended, whether it has content, its tool calls' names
//! and arguments ([`Plain`]). When every call is valid as written, the client gets the
//! upstream's bytes unchanged with the report spliced in before the closing brace
//! ([`with_report`]).
//!
//! Anything else — a call to repair or re-ask, an odd shape (a `choices` object, a `content`
//! that is not a string, a key given twice where healing reads), an empty answer, an upstream
//! `selfheal` key, text that needs redacting — goes the old way: [`Answer::Parsed`] or, after
//! [`Plain::calls_usable`] says no, a `Value` parsed from the same bytes. The fast path only
//! ever forwards what the slow path would have forwarded, minus the re-serialisation (key
//! order, white space and number spelling stay as the upstream wrote them).

use std::fmt;

use bytes::Bytes;
use selfheal_openai::{ClientError, Completion, parse_completion};
use selfheal_repair::Ending;
use serde::Deserialize;
use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};

use crate::auth::Redactor;
use crate::heal::{self, GuideCache, ToolIndex};

/// Whether an answer's bytes may hold a tool call written as text in its content (a quoted
/// `"name"` key, `<tool_call>`, `[TOOL_CALLS]`, `<|python_tag|>`): such an answer goes the
/// parsed path, where [`heal::salvage_text_calls`] reads it. A scan of the bytes, no parse.
pub(crate) fn may_write_calls(bytes: &[u8]) -> bool {
    const MARKS: [&[u8]; 5] = [
        b"\\\"name\\\"",
        b"'name'",
        b"<tool_call>",
        b"[TOOL_CALLS]",
        b"<|python_tag|>",
    ];
    MARKS
        .iter()
        .any(|m| memchr::memmem::find(bytes, m).is_some())
}

/// A successful upstream answer: its bytes and what healing reads of them when they parse as a
/// plain answer (see the module docs), else the parsed completion.
#[derive(Debug, Clone)]
pub(crate) enum Answer {
    /// A well-formed answer with content or tool calls, as the upstream sent it.
    Plain(Plain),
    /// Any other usable answer, parsed.
    Parsed(Completion),
}

impl Answer {
    /// Whether the answer calls a tool (else it is the model's final answer).
    pub(crate) fn calls_tools(&self) -> bool {
        match self {
            Answer::Plain(p) => p.calls.as_ref().is_some_and(|c| !c.is_empty()),
            Answer::Parsed(c) => c
                .body
                .pointer("/choices/0/message/tool_calls")
                .and_then(serde_json::Value::as_array)
                .is_some_and(|a| !a.is_empty()),
        }
    }

    /// The answer as a parsed completion (for the paths that edit it).
    ///
    /// # Errors
    ///
    /// The error [`parse_completion`] gives (never for [`Answer::Plain`], whose bytes passed the
    /// same checks).
    pub(crate) fn into_completion(self) -> Result<Completion, ClientError> {
        match self {
            Answer::Plain(p) => parse_completion(&p.bytes),
            Answer::Parsed(c) => Ok(c),
        }
    }
}

/// A plain answer: the upstream's bytes and what healing reads of its first choice.
#[derive(Debug, Clone)]
pub(crate) struct Plain {
    /// The answer as the upstream sent it.
    pub bytes: Bytes,
    ending: Ending,
    /// `(name, arguments)` of each tool call; `None` when `tool_calls` is missing or `null`.
    calls: Option<Vec<(String, String)>>,
    /// The tokens and model it reports (for telemetry).
    pub usage: Usage,
}

impl Plain {
    /// The names of the tools the answer calls, in order.
    pub(crate) fn called(&self) -> impl Iterator<Item = &str> {
        self.calls.iter().flatten().map(|(name, _)| name.as_str())
    }

    /// Whether any tool call repeats, name and arguments, one of `answered`.
    pub(crate) fn repeats(&self, answered: &heal::Answered) -> bool {
        self.calls
            .iter()
            .flatten()
            .any(|(name, args)| answered.repeats(name, args))
    }

    /// Whether every tool call can go to the client as written: each names an offered tool
    /// and its arguments need no repair. `false` when any call needs repairing or re-asking,
    /// or when `tool_calls` is an empty list (the slow path takes it out of the message).
    pub(crate) fn calls_usable(&self, tools: &ToolIndex, guides: &GuideCache) -> bool {
        let Some(calls) = &self.calls else {
            return true;
        };
        !calls.is_empty()
            && calls.iter().all(|(name, args)| {
                matches!(
                    heal::check_arguments(name, args, tools, guides, self.ending),
                    Ok(None)
                )
            })
    }
}

/// Reads an upstream's answer body: [`Answer::Plain`] when it is a well-formed answer whose
/// first choice has content or tool calls, else what [`parse_completion`] makes of it (an
/// empty or unreadable answer is its error).
///
/// # Errors
///
/// [`ClientError::EmptyResponse`] or [`ClientError::Decode`], as [`parse_completion`].
pub(crate) fn read(bytes: Bytes) -> Result<Answer, ClientError> {
    if let Some(FirstScan { choice, usage }) = scan(&bytes)
        && (choice.message.has_content
            || choice.message.calls.as_ref().is_some_and(|c| !c.is_empty()))
    {
        return Ok(Answer::Plain(Plain {
            ending: Ending::from_finish_reason(choice.finish_reason.as_deref()),
            calls: choice.message.calls.map(|calls| {
                calls
                    .into_iter()
                    .map(|c| (c.function.name, c.function.arguments))
                    .collect()
            }),
            usage,
            bytes,
        }));
    }
    parse_completion(&bytes).map(Answer::Parsed)
}

/// The answer `bytes` (a JSON object) with `"selfheal": report` added as its last key: the
/// upstream's bytes unchanged around it. `None` when the bytes do not end in `}`, or when
/// `redactor` would change the result (the caller then redacts a parsed answer).
pub(crate) fn with_report(bytes: &[u8], report: &[u8], redactor: &Redactor) -> Option<Bytes> {
    let end = bytes.iter().rposition(|b| !b.is_ascii_whitespace())?;
    if bytes.get(end) != Some(&b'}') {
        return None;
    }
    let mut out = Vec::with_capacity(bytes.len() + report.len() + 16);
    out.extend_from_slice(bytes.get(..end)?);
    // `choices` is there, so the object is not empty: a comma always separates.
    out.extend_from_slice(b",\"selfheal\":");
    out.extend_from_slice(report);
    out.push(b'}');
    redactor.leaves_json_alone(&out).then(|| Bytes::from(out))
}

/// The first choice of `bytes` when they are a JSON document a `Value` would accept, of the
/// plain shape: an object with a `choices` array (no `selfheal` key) whose first element has a
/// `message` object; `content` a string or `null`; `tool_calls` `null` or an array of calls
/// with string `function.name` and `function.arguments`; `finish_reason` a string or `null`;
/// none of these keys twice.
fn scan(bytes: &[u8]) -> Option<FirstScan> {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let top = TopScan::deserialize(&mut de).ok()?;
    de.end().ok()?;
    let mut usage = top.usage;
    usage.model = top.model.and_then(|m| m.0);
    top.first.map(|c| FirstScan { choice: c, usage })
}

/// What [`scan`] reads: the first choice, and the answer's usage for telemetry.
struct FirstScan {
    choice: ChoiceScan,
    usage: Usage,
}

/// The token usage and model an answer reports, as telemetry reads them from a `Value`:
/// `usage.prompt_tokens` and `usage.completion_tokens` when they are integers, `model` when it
/// is a string (the last one, as for `Value`, when a key is given twice).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Usage {
    /// `usage.prompt_tokens`.
    pub input: Option<i64>,
    /// `usage.completion_tokens`.
    pub output: Option<i64>,
    /// `model`.
    pub model: Option<String>,
}

/// A key healing reads, or any other.
enum Field {
    Choices,
    Selfheal,
    Message,
    FinishReason,
    Content,
    ToolCalls,
    Function,
    Name,
    Arguments,
    Id,
    Usage,
    Model,
    PromptTokens,
    CompletionTokens,
    Other,
}

impl<'de> Deserialize<'de> for Field {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Field;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a key")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Field, E> {
                Ok(match v {
                    "choices" => Field::Choices,
                    "selfheal" => Field::Selfheal,
                    "message" => Field::Message,
                    "finish_reason" => Field::FinishReason,
                    "content" => Field::Content,
                    "tool_calls" => Field::ToolCalls,
                    "function" => Field::Function,
                    "name" => Field::Name,
                    "arguments" => Field::Arguments,
                    "id" => Field::Id,
                    "usage" => Field::Usage,
                    "model" => Field::Model,
                    "prompt_tokens" => Field::PromptTokens,
                    "completion_tokens" => Field::CompletionTokens,
                    _ => Field::Other,
                })
            }
        }
        d.deserialize_str(V)
    }
}

/// Sets `slot` once: a key given twice is an error (the slow path decides which one counts).
fn once<T, E: de::Error>(slot: &mut Option<T>, value: T) -> Result<(), E> {
    if slot.is_some() {
        return Err(E::custom("duplicate key"));
    }
    *slot = Some(value);
    Ok(())
}

/// The top level: `choices` read, `usage` and `model` too, every other value checked.
struct TopScan {
    first: Option<ChoiceScan>,
    usage: Usage,
    model: Option<StrScan>,
}

impl<'de> Deserialize<'de> for TopScan {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = TopScan;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an answer object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<TopScan, A::Error> {
                let mut choices: Option<ChoicesScan> = None;
                let mut usage = Usage::default();
                let mut model = None;
                while let Some(key) = map.next_key::<Field>()? {
                    match key {
                        Field::Choices => once(&mut choices, map.next_value()?)?,
                        Field::Selfheal => return Err(de::Error::custom("a selfheal key")),
                        Field::Usage => usage = map.next_value::<UsageScan>()?.0,
                        Field::Model => model = Some(map.next_value::<StrScan>()?),
                        _ => {
                            map.next_value::<Checked>()?;
                        }
                    }
                }
                let choices = choices.ok_or_else(|| de::Error::missing_field("choices"))?;
                Ok(TopScan {
                    first: choices.0,
                    usage,
                    model,
                })
            }
        }
        d.deserialize_map(V)
    }
}

/// `choices`: the first element read, the others checked.
struct ChoicesScan(Option<ChoiceScan>);

impl<'de> Deserialize<'de> for ChoicesScan {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = ChoicesScan;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a choices array")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<ChoicesScan, A::Error> {
                let first = seq.next_element::<ChoiceScan>()?;
                while seq.next_element::<Checked>()?.is_some() {}
                Ok(ChoicesScan(first))
            }
        }
        d.deserialize_seq(V)
    }
}

/// The first choice.
struct ChoiceScan {
    message: MessageScan,
    finish_reason: Option<String>,
}

impl<'de> Deserialize<'de> for ChoiceScan {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = ChoiceScan;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a choice object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<ChoiceScan, A::Error> {
                let mut message: Option<MessageScan> = None;
                let mut finish: Option<Option<String>> = None;
                while let Some(key) = map.next_key::<Field>()? {
                    match key {
                        Field::Message => once(&mut message, map.next_value()?)?,
                        Field::FinishReason => once(&mut finish, map.next_value()?)?,
                        _ => {
                            map.next_value::<Checked>()?;
                        }
                    }
                }
                Ok(ChoiceScan {
                    message: message.ok_or_else(|| de::Error::missing_field("message"))?,
                    finish_reason: finish.flatten(),
                })
            }
        }
        d.deserialize_map(V)
    }
}

/// The first choice's message.
struct MessageScan {
    has_content: bool,
    calls: Option<Vec<CallScan>>,
}

impl<'de> Deserialize<'de> for MessageScan {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = MessageScan;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a message object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<MessageScan, A::Error> {
                let mut content: Option<ContentScan> = None;
                let mut calls: Option<Option<Vec<CallScan>>> = None;
                while let Some(key) = map.next_key::<Field>()? {
                    match key {
                        Field::Content => once(&mut content, map.next_value()?)?,
                        Field::ToolCalls => once(&mut calls, map.next_value()?)?,
                        _ => {
                            map.next_value::<Checked>()?;
                        }
                    }
                }
                Ok(MessageScan {
                    has_content: content.is_some_and(|c| c.0),
                    calls: calls.flatten(),
                })
            }
        }
        d.deserialize_map(V)
    }
}

/// `content`: a string (whether it has more than white space) or `null`.
struct ContentScan(bool);

impl<'de> Deserialize<'de> for ContentScan {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = ContentScan;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string or null")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<ContentScan, E> {
                Ok(ContentScan(!v.trim().is_empty()))
            }
            fn visit_unit<E: de::Error>(self) -> Result<ContentScan, E> {
                Ok(ContentScan(false))
            }
        }
        d.deserialize_any(V)
    }
}

/// One tool call: its `function`, every other value checked. A call without a non-empty string
/// `id` is not plain: the slow path gives it one ([`heal::ensure_id`]).
struct CallScan {
    function: FunctionScan,
}

impl<'de> Deserialize<'de> for CallScan {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = CallScan;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a tool call object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<CallScan, A::Error> {
                let mut function: Option<FunctionScan> = None;
                let mut id: Option<IdScan> = None;
                while let Some(key) = map.next_key::<Field>()? {
                    match key {
                        Field::Function => once(&mut function, map.next_value()?)?,
                        Field::Id => once(&mut id, map.next_value()?)?,
                        _ => {
                            map.next_value::<Checked>()?;
                        }
                    }
                }
                if id.is_none() {
                    return Err(de::Error::missing_field("id"));
                }
                Ok(CallScan {
                    function: function.ok_or_else(|| de::Error::missing_field("function"))?,
                })
            }
        }
        d.deserialize_map(V)
    }
}

/// A call's `id`: a string with something in it (anything else fails the scan).
struct IdScan;

impl<'de> Deserialize<'de> for IdScan {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = IdScan;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a non-empty string")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<IdScan, E> {
                if v.is_empty() {
                    Err(E::custom("empty id"))
                } else {
                    Ok(IdScan)
                }
            }
        }
        d.deserialize_str(V)
    }
}

/// A call's `function`: its string `name` and `arguments`.
struct FunctionScan {
    name: String,
    arguments: String,
}

impl<'de> Deserialize<'de> for FunctionScan {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = FunctionScan;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a function object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<FunctionScan, A::Error> {
                let mut name: Option<String> = None;
                let mut arguments: Option<String> = None;
                while let Some(key) = map.next_key::<Field>()? {
                    match key {
                        Field::Name => once(&mut name, map.next_value()?)?,
                        Field::Arguments => once(&mut arguments, map.next_value()?)?,
                        _ => {
                            map.next_value::<Checked>()?;
                        }
                    }
                }
                Ok(FunctionScan {
                    name: name.ok_or_else(|| de::Error::missing_field("name"))?,
                    arguments: arguments.ok_or_else(|| de::Error::missing_field("arguments"))?,
                })
            }
        }
        d.deserialize_map(V)
    }
}

/// `usage`: its integer `prompt_tokens` and `completion_tokens`; any other value checked.
struct UsageScan(Usage);

impl<'de> Deserialize<'de> for UsageScan {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = UsageScan;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<UsageScan, A::Error> {
                let mut u = Usage::default();
                while let Some(key) = map.next_key::<Field>()? {
                    match key {
                        Field::PromptTokens => u.input = map.next_value::<IntScan>()?.0,
                        Field::CompletionTokens => u.output = map.next_value::<IntScan>()?.0,
                        _ => {
                            map.next_value::<Checked>()?;
                        }
                    }
                }
                Ok(UsageScan(u))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<UsageScan, A::Error> {
                CheckedVisitor
                    .visit_seq(seq)
                    .map(|_| UsageScan(Usage::default()))
            }
            fn visit_bool<E: de::Error>(self, _: bool) -> Result<UsageScan, E> {
                Ok(UsageScan(Usage::default()))
            }
            fn visit_i64<E: de::Error>(self, _: i64) -> Result<UsageScan, E> {
                Ok(UsageScan(Usage::default()))
            }
            fn visit_u64<E: de::Error>(self, _: u64) -> Result<UsageScan, E> {
                Ok(UsageScan(Usage::default()))
            }
            fn visit_f64<E: de::Error>(self, _: f64) -> Result<UsageScan, E> {
                Ok(UsageScan(Usage::default()))
            }
            fn visit_str<E: de::Error>(self, _: &str) -> Result<UsageScan, E> {
                Ok(UsageScan(Usage::default()))
            }
            fn visit_unit<E: de::Error>(self) -> Result<UsageScan, E> {
                Ok(UsageScan(Usage::default()))
            }
        }
        d.deserialize_any(V)
    }
}

/// A scalar a [`Scan`] reads out of one JSON value, as `Value::as_i64` or `Value::as_str`
/// reads it; any other kind of value is `None`.
trait Scalar: Sized {
    /// From an integer that fits an `i64`.
    fn of_i64(_: i64) -> Option<Self> {
        None
    }
    /// From a non-negative integer.
    fn of_u64(_: u64) -> Option<Self> {
        None
    }
    /// From a string.
    fn of_str(_: &str) -> Option<Self> {
        None
    }
}

impl Scalar for i64 {
    fn of_i64(v: i64) -> Option<i64> {
        Some(v)
    }
    fn of_u64(v: u64) -> Option<i64> {
        i64::try_from(v).ok()
    }
}

impl Scalar for String {
    fn of_str(v: &str) -> Option<String> {
        Some(v.to_owned())
    }
}

/// One value read as the scalar `T` ([`Scalar`]), else `None`; a value of another kind is
/// still checked, as `serde_json::Value` would read it.
struct Scan<T>(Option<T>);

/// An integer in range, else `None` (checked).
type IntScan = Scan<i64>;

/// A string, else `None` (checked).
type StrScan = Scan<String>;

impl<'de, T: Scalar> Deserialize<'de> for Scan<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<T>(std::marker::PhantomData<T>);
        impl<'de, T: Scalar> Visitor<'de> for V<T> {
            type Value = Scan<T>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Scan<T>, E> {
                Ok(Scan(T::of_i64(v)))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Scan<T>, E> {
                Ok(Scan(T::of_u64(v)))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Scan<T>, E> {
                Ok(Scan(T::of_str(v)))
            }
            fn visit_f64<E: de::Error>(self, _: f64) -> Result<Scan<T>, E> {
                Ok(Scan(None))
            }
            fn visit_bool<E: de::Error>(self, _: bool) -> Result<Scan<T>, E> {
                Ok(Scan(None))
            }
            fn visit_unit<E: de::Error>(self) -> Result<Scan<T>, E> {
                Ok(Scan(None))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Scan<T>, A::Error> {
                CheckedVisitor.visit_seq(seq).map(|_| Scan(None))
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Scan<T>, A::Error> {
                CheckedVisitor.visit_map(map).map(|_| Scan(None))
            }
        }
        d.deserialize_any(V(std::marker::PhantomData))
    }
}

/// Any JSON value a `serde_json::Value` would accept, read without building it: numbers are
/// parsed (a float out of range is an error, as for `Value`), strings decoded (invalid UTF-8,
/// escapes or lone surrogates are errors), keys too.
struct Checked;

impl<'de> Deserialize<'de> for Checked {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(CheckedVisitor)
    }
}

struct CheckedVisitor;

impl<'de> Visitor<'de> for CheckedVisitor {
    type Value = Checked;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Checked, E> {
        Ok(Checked)
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Checked, E> {
        Ok(Checked)
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Checked, E> {
        Ok(Checked)
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Checked, E> {
        Ok(Checked)
    }
    fn visit_str<E: de::Error>(self, _: &str) -> Result<Checked, E> {
        Ok(Checked)
    }
    fn visit_unit<E: de::Error>(self) -> Result<Checked, E> {
        Ok(Checked)
    }
    fn visit_none<E: de::Error>(self) -> Result<Checked, E> {
        Ok(Checked)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Checked, A::Error> {
        while seq.next_element::<Checked>()?.is_some() {}
        Ok(Checked)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Checked, A::Error> {
        while map.next_key::<Checked>()?.is_some() {
            map.next_value::<Checked>()?;
        }
        Ok(Checked)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    fn answer(message: Value, finish: &str) -> Bytes {
        Bytes::from(
            json!({"id": "x", "object": "chat.completion",
                   "choices": [{"index": 0, "message": message, "finish_reason": finish}],
                   "usage": {"total_tokens": 3}})
            .to_string(),
        )
    }

    #[test]
    fn plain_answers_are_kept_as_bytes_with_what_healing_reads() {
        let a = answer(json!({"role": "assistant", "content": "hi"}), "stop");
        assert!(matches!(read(a), Ok(Answer::Plain(_))));
        let calls = json!({"role": "assistant", "content": null, "tool_calls": [
            {"id": "c", "type": "function", "function": {"name": "t", "arguments": "{}"}}]});
        let Ok(Answer::Plain(p)) = read(answer(calls, "length")) else {
            panic!("not plain");
        };
        assert_eq!(p.calls, Some(vec![("t".to_owned(), "{}".to_owned())]));
        assert_eq!(p.ending, Ending::CutOff);
    }

    #[test]
    fn the_scan_reads_usage_and_model_as_a_value_would() {
        let usage = |body: &str| match read(Bytes::from(body.to_owned())) {
            Ok(Answer::Plain(p)) => p.usage,
            other => panic!("not plain: {other:?}"),
        };
        let choices = r#""choices":[{"message":{"content":"hi"},"finish_reason":"stop"}]"#;
        assert_eq!(
            usage(&format!(
                r#"{{"model":"m1",{choices},"usage":{{"prompt_tokens":10,"completion_tokens":5,"total_tokens":15}}}}"#
            )),
            Usage {
                input: Some(10),
                output: Some(5),
                model: Some("m1".into())
            }
        );
        assert_eq!(
            usage(&format!(
                r#"{{"model":7,{choices},"usage":{{"prompt_tokens":"10","completion_tokens":2.5}}}}"#
            )),
            Usage::default(),
            "only integers and a string model are read"
        );
        assert_eq!(
            usage(&format!(
                r#"{{"model":"a","model":"b",{choices},"usage":[1]}}"#
            )),
            Usage {
                model: Some("b".into()),
                ..Usage::default()
            },
            "the last key, as for a Value"
        );
        let big = format!(r#"{{{choices},"usage":{{"prompt_tokens":18446744073709551615}}}}"#);
        assert_eq!(usage(&big).input, None, "out of i64's range");
        // Still checked as a Value would: a bad escape in `usage` is not plain.
        let bad = format!(r#"{{{choices},"usage":{{"x":"\q"}}}}"#);
        assert!(matches!(
            read(Bytes::from(bad)),
            Err(_) | Ok(Answer::Parsed(_))
        ));
    }

    #[test]
    fn anything_a_value_would_not_accept_or_odd_shapes_are_parsed() {
        let odd = [
            // A float out of range: `Value` refuses it.
            r#"{"choices":[{"message":{"content":"hi"}}],"usage":{"x":1e400}}"#,
            // A lone surrogate in a string healing does not read: `Value` refuses it.
            r#"{"choices":[{"message":{"content":"hi"}}],"x":"\ud800"}"#,
            // `choices` as an object.
            r#"{"choices":{"0":{"message":{"content":"hi"}}}}"#,
            // A key given twice where healing reads.
            r#"{"choices":[{"message":{"content":"hi","content":""}}]}"#,
            r#"{"choices":[{"message":{"tool_calls":[],"tool_calls":[{"function":{"name":"t","arguments":"{}"}}]}}]}"#,
            // content not a string; a call without arguments.
            r#"{"choices":[{"message":{"content":["hi"]}}]}"#,
            r#"{"choices":[{"message":{"tool_calls":[{"function":{"name":"t"}}]}}]}"#,
            // An upstream `selfheal` key, even null.
            r#"{"choices":[{"message":{"content":"hi"}}],"selfheal":null}"#,
            // Trailing garbage.
            r#"{"choices":[{"message":{"content":"hi"}}]} x"#,
        ];
        for body in odd {
            assert!(
                !matches!(read(Bytes::from(body)), Ok(Answer::Plain(_))),
                "{body}"
            );
        }
        // Invalid UTF-8 in a string healing does not read.
        let mut bad = br#"{"choices":[{"message":{"content":"hi"}}],"x":""#.to_vec();
        bad.extend_from_slice(&[0xff, b'"', b'}']);
        assert!(matches!(
            read(Bytes::from(bad)),
            Err(ClientError::Decode(_))
        ));
    }

    #[test]
    fn empty_answers_are_still_errors() {
        let a = answer(json!({"role": "assistant", "content": "  "}), "stop");
        assert!(matches!(read(a), Err(ClientError::EmptyResponse)));
        assert!(matches!(
            read(Bytes::from(" \n")),
            Err(ClientError::EmptyResponse)
        ));
    }

    #[test]
    fn the_report_is_spliced_in_and_the_rest_left_as_sent() {
        let none = Redactor::default();
        let body = br#"{"b":1,  "a":{"k":"v"} }
"#;
        let out = with_report(body, br#"{"status":"complete"}"#, &none).unwrap_or_default();
        assert_eq!(
            &out[..],
            br#"{"b":1,  "a":{"k":"v"} ,"selfheal":{"status":"complete"}}"#
        );
        let v: Value = serde_json::from_slice(&out).unwrap_or(Value::Null);
        assert_eq!(v["selfheal"]["status"], "complete");
        assert!(with_report(b"[1]", b"{}", &none).is_none());
        // Text the redactor would change goes the slow way, escaped or not.
        let secret = Redactor::new(["sk-secret-123".to_owned()]);
        assert!(with_report(br#"{"a":"sk-secret-123"}"#, b"{}", &secret).is_none());
        assert!(with_report(br#"{"a":"sk-secret\u002d123"}"#, b"{}", &secret).is_none());
        assert!(with_report(br#"{"a":"fine"}"#, b"{}", &secret).is_some());
    }
}
