//! The chat request as the gateway reads it: borrowed views over the client's bytes.
//!
//! A proxy should not rebuild what it does not change. Parsing a 20-message conversation into a
//! `serde_json::Value` tree and encoding it again was the largest part of the gateway's CPU per
//! request, and it also rewrote what the client sent (key order, number formatting, integers past
//! 2^53). So the body is read once into [`ChatRequest`]: the top-level fields in their order as
//! raw JSON slices, and for each message and tool only the few fields healing reads (role,
//! content, tool-call ids, names and arguments, tool names and schemas), borrowed where the JSON
//! has no escapes. [`ChatRequest::encode`] writes the request back with exactly the requested
//! [`Edits`] applied and every other byte as the client sent it — or returns the client's own
//! buffer untouched when there is nothing to change.

use std::borrow::Cow;
use std::collections::HashMap;
use std::fmt;

use bytes::Bytes;
use selfheal_openai::At;
use serde::Deserialize;
use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde_json::Value;
use serde_json::value::RawValue;

/// A JSON string, borrowed from the body when it has no escapes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Str<'a>(pub Cow<'a, str>);

impl<'de: 'a, 'a> Deserialize<'de> for Str<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for V<'a> {
            type Value = Str<'a>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Str<'a>, E> {
                Ok(Str(Cow::Borrowed(v)))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Str<'a>, E> {
                Ok(Str(Cow::Owned(v.to_owned())))
            }
            fn visit_string<E: de::Error>(self, v: String) -> Result<Str<'a>, E> {
                Ok(Str(Cow::Owned(v)))
            }
        }
        d.deserialize_str(V(std::marker::PhantomData))
    }
}

impl Str<'_> {
    /// The text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Visitor methods that answer `$value` for booleans, numbers and `null`: the lenient readers
/// below skip such values instead of failing.
macro_rules! scalars_are {
    ($value:expr) => {
        fn visit_bool<E: de::Error>(self, _: bool) -> Result<Self::Value, E> {
            Ok($value)
        }
        fn visit_i64<E: de::Error>(self, _: i64) -> Result<Self::Value, E> {
            Ok($value)
        }
        fn visit_u64<E: de::Error>(self, _: u64) -> Result<Self::Value, E> {
            Ok($value)
        }
        fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self::Value, E> {
            Ok($value)
        }
        fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok($value)
        }
        fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok($value)
        }
    };
}

/// A string field read in one pass: `Some` for a string, `None` for any other JSON value (which
/// is skipped), so an odd field never makes its message unreadable.
#[derive(Debug, Default)]
struct LooseStr<'a>(Option<Str<'a>>);

impl<'de: 'a, 'a> Deserialize<'de> for LooseStr<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for V<'a> {
            type Value = LooseStr<'a>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<LooseStr<'a>, E> {
                Ok(LooseStr(Some(Str(Cow::Borrowed(v)))))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<LooseStr<'a>, E> {
                Ok(LooseStr(Some(Str(Cow::Owned(v.to_owned())))))
            }
            fn visit_string<E: de::Error>(self, v: String) -> Result<LooseStr<'a>, E> {
                Ok(LooseStr(Some(Str(Cow::Owned(v)))))
            }
            scalars_are!(LooseStr(None));
            fn visit_seq<A: de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<LooseStr<'a>, A::Error> {
                while seq.next_element::<de::IgnoredAny>()?.is_some() {}
                Ok(LooseStr(None))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<LooseStr<'a>, A::Error> {
                while map
                    .next_entry::<de::IgnoredAny, de::IgnoredAny>()?
                    .is_some()
                {}
                Ok(LooseStr(None))
            }
        }
        d.deserialize_any(V(std::marker::PhantomData))
    }
}

fn loose<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Str<'de>>, D::Error> {
    LooseStr::deserialize(d).map(|l| l.0)
}

/// A field that is read as `Some` only when it holds the expected type; anything else (wrong
/// type, `null`) is `None`, so one odd field never makes a whole message unreadable.
fn lenient<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    let raw = <&'de RawValue>::deserialize(d)?;
    Ok(serde_json::from_str(raw.get()).ok())
}

/// The function of a tool call, as far as healing reads it.
#[derive(Debug, Default, Deserialize)]
pub struct FunctionView<'a> {
    /// The tool's name.
    #[serde(borrow, default, deserialize_with = "loose")]
    pub name: Option<Str<'a>>,
    /// The arguments, a JSON text.
    #[serde(borrow, default, deserialize_with = "loose")]
    pub arguments: Option<Str<'a>>,
}

/// A [`FunctionView`] read for its name only: the arguments are skipped, not decoded, and
/// whatever makes a `FunctionView` unreadable (a repeated field) makes this one unreadable.
#[derive(Deserialize)]
struct FunctionName<'a> {
    #[serde(borrow, default, deserialize_with = "loose")]
    name: Option<Str<'a>>,
    /// Read only to be refused when repeated, as [`FunctionView::arguments`] is.
    #[serde(default)]
    #[allow(dead_code)]
    arguments: Option<de::IgnoredAny>,
}

/// A [`CallView`] read for its id and its function's name ([`Message::first_call`]).
#[derive(Deserialize)]
struct CallHead<'a> {
    #[serde(borrow, default, deserialize_with = "loose")]
    id: Option<Str<'a>>,
    #[serde(borrow, default, deserialize_with = "lenient")]
    function: Option<FunctionName<'a>>,
}

/// One tool call of an assistant message.
#[derive(Debug, Default, Deserialize)]
pub struct CallView<'a> {
    /// The call id that the tool result refers to.
    #[serde(borrow, default, deserialize_with = "loose")]
    pub id: Option<Str<'a>>,
    /// The function called.
    #[serde(borrow, default, deserialize_with = "lenient")]
    pub function: Option<FunctionView<'a>>,
}

/// The fields of a message healing reads. Read by hand rather than derived so that a repeated
/// key is taken the way upstream JSON parsers take it — the last one wins — instead of making
/// the whole message unreadable, and so that only objects are read (a derived reader would also
/// take an array by position).
#[derive(Debug, Default)]
struct MessageFields<'a> {
    role: Option<Str<'a>>,
    content: Option<&'a RawValue>,
    tool_calls: Option<&'a RawValue>,
    tool_call_id: Option<Str<'a>>,
}

impl<'de: 'a, 'a> Deserialize<'de> for MessageFields<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for V<'a> {
            type Value = MessageFields<'a>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a message object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut m = MessageFields::default();
                while let Some(k) = map.next_key::<Str<'de>>()? {
                    match k.as_str() {
                        "role" => m.role = map.next_value::<LooseStr<'de>>()?.0,
                        "content" => m.content = Some(map.next_value::<&'de RawValue>()?),
                        "tool_calls" => m.tool_calls = Some(map.next_value::<&'de RawValue>()?),
                        "tool_call_id" => m.tool_call_id = map.next_value::<LooseStr<'de>>()?.0,
                        _ => {
                            map.next_value::<de::IgnoredAny>()?;
                        }
                    }
                }
                Ok(m)
            }
        }
        d.deserialize_map(V(std::marker::PhantomData))
    }
}

/// One message: its raw JSON and the fields healing reads.
#[derive(Debug)]
pub struct Message<'a> {
    /// The message as the client sent it.
    pub raw: &'a RawValue,
    /// `system`, `user`, `assistant`, `tool`, ... (`None` when missing or not a string).
    pub role: Option<Str<'a>>,
    /// The raw `content`, `null` included (`None` when absent).
    pub content: Option<&'a RawValue>,
    /// The raw `tool_calls`, `null` included (`None` when absent).
    pub tool_calls: Option<&'a RawValue>,
    /// The call a `tool` message answers.
    pub tool_call_id: Option<Str<'a>>,
}

impl<'a> Message<'a> {
    fn read(raw: &'a RawValue) -> Message<'a> {
        let f: MessageFields<'a> = serde_json::from_str(raw.get()).unwrap_or_default();
        Message {
            raw,
            role: f.role,
            content: f.content,
            tool_calls: f.tool_calls,
            tool_call_id: f.tool_call_id,
        }
    }

    /// The role, `""` when missing.
    pub fn role(&self) -> &str {
        self.role.as_ref().map_or("", Str::as_str)
    }

    /// The text of `content`: a string, or the `text` parts of an array joined. Borrowed from
    /// the request when it is a string without escapes (the common case: no copy).
    pub fn content_text(&self) -> Cow<'a, str> {
        let Some(raw) = self.content else {
            return Cow::Borrowed("");
        };
        let text: &'a str = raw.get();
        // The common case, a string, decoded without a `Value` around it. The raw value is
        // valid JSON: a string without a backslash is its content between the quotes.
        if text.starts_with('"') {
            if !text.contains('\\')
                && let Some(inner) = text.get(1..text.len() - 1)
            {
                return Cow::Borrowed(inner);
            }
            if let Ok(s) = serde_json::from_str::<String>(text) {
                return Cow::Owned(s);
            }
        }
        match serde_json::from_str::<Value>(text) {
            Ok(Value::String(s)) => Cow::Owned(s),
            Ok(Value::Array(parts)) => Cow::Owned(
                parts
                    .iter()
                    .filter_map(|p| p.get("text").and_then(Value::as_str))
                    .collect::<Vec<_>>()
                    .join(""),
            ),
            _ => Cow::Borrowed(""),
        }
    }

    /// The tool calls of an assistant message (calls that are not objects are skipped).
    pub fn calls(&self) -> Vec<CallView<'a>> {
        self.tool_calls
            .and_then(|raw| serde_json::from_str::<Vec<&'a RawValue>>(raw.get()).ok())
            .unwrap_or_default()
            .into_iter()
            .filter(|c| c.get().starts_with('{'))
            .filter_map(|c| serde_json::from_str::<CallView<'a>>(c.get()).ok())
            .collect()
    }

    /// The first of [`Message::calls`] as `(id, tool name)` (`""` for either it lacks), read
    /// without decoding any call's arguments.
    pub fn first_call(&self) -> Option<(String, String)> {
        let calls: Vec<&RawValue> = serde_json::from_str(self.tool_calls?.get()).ok()?;
        let c = calls
            .into_iter()
            .filter(|c| c.get().starts_with('{'))
            .find_map(|c| serde_json::from_str::<CallHead<'_>>(c.get()).ok())?;
        let name = c.function.and_then(|f| f.name);
        Some((
            c.id.map_or_else(String::new, |i| i.as_str().to_owned()),
            name.map_or_else(String::new, |n| n.as_str().to_owned()),
        ))
    }

    /// Whether some servers would reject this message: an assistant message with `tool_calls`
    /// and a `null` or missing `content`.
    pub fn needs_content(&self) -> bool {
        self.role() == "assistant"
            && self.tool_calls.is_some_and(|t| t.get() != "null")
            && self.content.is_none_or(|c| c.get() == "null")
    }

    /// Writes the message with `content: ""` in place of a `null` or missing content, every
    /// other byte unchanged.
    fn write_with_content(&self, out: &mut Vec<u8>) {
        let text = self.raw.get();
        match self.content {
            Some(c) => {
                // `c` is a slice of `text`: find where, and splice.
                let at = (c.get().as_ptr() as usize).wrapping_sub(text.as_ptr() as usize);
                let end = at.saturating_add(c.get().len());
                match text.get(..at).zip(text.get(end..)) {
                    Some((head, tail)) => {
                        out.extend_from_slice(head.as_bytes());
                        out.extend_from_slice(b"\"\"");
                        out.extend_from_slice(tail.as_bytes());
                    }
                    None => out.extend_from_slice(text.as_bytes()),
                }
            }
            None => {
                // A message with tool calls is a non-empty object: `{` then at least one member.
                out.extend_from_slice(b"{\"content\":\"\",");
                out.extend_from_slice(text.get(1..).unwrap_or_default().as_bytes());
            }
        }
    }
}

#[derive(Debug, Default, Deserialize)]
struct ToolFunction<'a> {
    #[serde(borrow, default, deserialize_with = "loose")]
    name: Option<Str<'a>>,
    #[serde(borrow, default)]
    parameters: Option<&'a RawValue>,
}

#[derive(Debug, Default, Deserialize)]
struct ToolFields<'a> {
    #[serde(borrow, default, deserialize_with = "lenient")]
    function: Option<ToolFunction<'a>>,
}

/// One tool the request offers.
#[derive(Debug)]
pub struct Tool<'a> {
    /// The tool as the client sent it.
    pub raw: &'a RawValue,
    /// `function.name`.
    pub name: Option<Str<'a>>,
    /// `function.parameters`, raw.
    pub parameters: Option<&'a RawValue>,
}

/// A top-level value: raw, or the `messages` array (kept as its elements).
#[derive(Debug, Clone, Copy)]
enum Slot<'a> {
    Raw(&'a RawValue),
    Messages,
}

/// The raw value of the top-level field `name` (the last, if written twice).
fn raw_field<'a>(fields: &[(Str<'a>, Slot<'a>)], name: &str) -> Option<&'a RawValue> {
    fields.iter().rev().find_map(|(k, v)| match v {
        Slot::Raw(v) if k.as_str() == name => Some(*v),
        _ => None,
    })
}

/// The `messages` value: its elements, raw, when it is an array.
struct MessagesValue<'a>(Option<Vec<&'a RawValue>>);

impl<'de: 'a, 'a> Deserialize<'de> for MessagesValue<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for V<'a> {
            type Value = MessagesValue<'a>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an array of messages")
            }
            fn visit_seq<A: de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<MessagesValue<'a>, A::Error> {
                let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(16));
                while let Some(m) = seq.next_element::<&'de RawValue>()? {
                    out.push(m);
                }
                Ok(MessagesValue(Some(out)))
            }
            fn visit_map<A: MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<MessagesValue<'a>, A::Error> {
                while map
                    .next_entry::<de::IgnoredAny, de::IgnoredAny>()?
                    .is_some()
                {}
                Ok(MessagesValue(None))
            }
            fn visit_str<E: de::Error>(self, _: &str) -> Result<MessagesValue<'a>, E> {
                Ok(MessagesValue(None))
            }
            scalars_are!(MessagesValue(None));
        }
        d.deserialize_any(V(std::marker::PhantomData))
    }
}

/// The top level in one pass: fields in their order, `messages` split into raw elements.
struct TopLevel<'a> {
    fields: Vec<(Str<'a>, Slot<'a>)>,
    messages: Option<Vec<&'a RawValue>>,
}

impl<'de: 'a, 'a> Deserialize<'de> for TopLevel<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for V<'a> {
            type Value = TopLevel<'a>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<TopLevel<'a>, A::Error> {
                let mut fields = Vec::with_capacity(map.size_hint().unwrap_or(8));
                let mut messages = None;
                while let Some(k) = map.next_key::<Str<'de>>()? {
                    if k.as_str() == "messages" {
                        messages = map.next_value::<MessagesValue<'de>>()?.0;
                        fields.push((k, Slot::Messages));
                    } else {
                        fields.push((k, Slot::Raw(map.next_value::<&'de RawValue>()?)));
                    }
                }
                Ok(TopLevel { fields, messages })
            }
        }
        d.deserialize_map(V(std::marker::PhantomData))
    }
}

/// Why a body is not a chat request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadRequest(pub String);

/// A chat-completions request, read without copying.
#[derive(Debug)]
pub struct ChatRequest<'a> {
    body: &'a str,
    fields: Vec<(Str<'a>, Slot<'a>)>,
    /// `model`.
    pub model: Str<'a>,
    /// `stream: true`.
    pub stream: bool,
    /// `messages`, in order.
    pub messages: Vec<Message<'a>>,
    /// The raw `tools` array, when present (read on demand by [`ChatRequest::tools`]; the key
    /// of the tool-index cache).
    pub tools_raw: Option<&'a RawValue>,
}

/// A JSON object's text, `body`, with `"max_tokens": n` written as its last key (the rest byte
/// for byte as it was): for a request that has no limit of its own.
pub(crate) fn with_max_tokens(body: &Bytes, n: u32) -> Bytes {
    let text = &body[..];
    let (Some(open), Some(close)) = (
        text.iter().position(|b| !b.is_ascii_whitespace()),
        text.iter().rposition(|b| !b.is_ascii_whitespace()),
    ) else {
        return body.clone();
    };
    if text[open] != b'{' || text[close] != b'}' || close <= open {
        return body.clone();
    }
    // Written last, so that a client's own `"max_tokens": null` (which sets no limit) is
    // overridden by the limit the answer reports, for every parser that keeps the last key.
    let empty = text[open + 1..close].iter().all(u8::is_ascii_whitespace);
    let mut out = Vec::with_capacity(text.len() + 24);
    out.extend_from_slice(&text[..close]);
    if !empty {
        out.push(b',');
    }
    out.extend_from_slice(format!("\"max_tokens\":{n}").as_bytes());
    out.extend_from_slice(&text[close..]);
    Bytes::from(out)
}

impl<'a> ChatRequest<'a> {
    /// Reads a body. Errors say what is wrong in words a client can act on.
    pub fn parse(body: &'a [u8]) -> Result<ChatRequest<'a>, BadRequest> {
        let body = std::str::from_utf8(body)
            .map_err(|e| BadRequest(format!("the body is not valid JSON: not UTF-8 ({e})")))?;
        let top: TopLevel<'a> = match serde_json::from_str(body) {
            Ok(f) => f,
            Err(e) if e.is_data() => {
                return Err(BadRequest("the body must be a JSON object".into()));
            }
            Err(e) => return Err(BadRequest(format!("the body is not valid JSON: {e}"))),
        };
        let raw = |name: &str| raw_field(&top.fields, name);
        let messages = top
            .messages
            .filter(|m| !m.is_empty())
            .ok_or_else(|| BadRequest("`messages` must be a non-empty array".into()))?;
        let model: Str<'a> = raw("model")
            .and_then(|m| serde_json::from_str(m.get()).ok())
            .ok_or_else(|| BadRequest("`model` must be a string".into()))?;
        let stream = raw("stream").is_some_and(|s| s.get() == "true");
        let tools_raw = raw("tools").filter(|t| t.get().starts_with('['));
        Ok(ChatRequest {
            body,
            messages: messages.into_iter().map(Message::read).collect(),
            model,
            stream,
            tools_raw,
            fields: top.fields,
        })
    }

    /// The tools the request offers, in order (empty when none).
    pub fn tools(&self) -> Vec<Tool<'a>> {
        self.tools_raw
            .and_then(|t| serde_json::from_str::<Vec<&'a RawValue>>(t.get()).ok())
            .unwrap_or_default()
            .into_iter()
            .map(|raw| {
                let f: ToolFields<'a> = if raw.get().starts_with('{') {
                    serde_json::from_str(raw.get()).unwrap_or_default()
                } else {
                    ToolFields::default()
                };
                let (name, parameters) =
                    f.function.map_or((None, None), |f| (f.name, f.parameters));
                Tool {
                    raw,
                    name,
                    parameters,
                }
            })
            .collect()
    }

    /// The raw `tool_choice`, when the request has one (the last, if written twice).
    fn tool_choice_raw(&self) -> Option<&'a RawValue> {
        raw_field(&self.fields, "tool_choice")
    }

    /// Whether the client set an output limit (`max_tokens` or `max_completion_tokens`, not
    /// `null`).
    pub fn sets_output_limit(&self) -> bool {
        ["max_tokens", "max_completion_tokens"]
            .iter()
            .any(|k| raw_field(&self.fields, k).is_some_and(|v| v.get().trim() != "null"))
    }

    /// Whether `tool_choice` is `"none"`: the client asked for no tool call.
    pub fn tool_choice_none(&self) -> bool {
        self.tool_choice_raw()
            .is_some_and(|c| c.get().trim() == "\"none\"")
    }

    /// The tool `tool_choice` names, when it names one.
    pub fn tool_choice_name(&self) -> Option<Str<'a>> {
        #[derive(Deserialize)]
        struct Choice<'a> {
            #[serde(borrow)]
            function: Named<'a>,
        }
        #[derive(Deserialize)]
        struct Named<'a> {
            #[serde(borrow)]
            name: Str<'a>,
        }
        self.tool_choice_raw()
            .and_then(|c| serde_json::from_str::<Choice<'a>>(c.get()).ok())
            .map(|c| c.function.name)
    }

    /// Writes the request back with `edits` applied; every byte the edits do not touch is the
    /// client's. `original` is the client's buffer, returned as is when nothing changes.
    pub fn encode(&self, edits: &Edits<'_>, original: &Bytes) -> Bytes {
        let model_changes = edits.model.is_some_and(|m| m != self.model.as_str());
        let normalize = edits.normalize && self.messages.iter().any(Message::needs_content);
        let tools = if edits.hidden.is_empty() {
            Vec::new()
        } else {
            self.tools()
        };
        let hides = tools.iter().any(|t| edits.hides(t));
        if !model_changes
            && !normalize
            && !hides
            && edits.system.is_none()
            && edits.append.is_none()
            && edits.stream.is_none()
            && edits.replaced.is_empty()
        {
            return original.clone();
        }
        let mut out = Vec::with_capacity(self.body.len() + 256);
        let remaining_tools = tools.iter().filter(|t| !edits.hides(t)).count();

        let drop_tools = hides && remaining_tools == 0;
        let mut first = true;
        let mut key = |out: &mut Vec<u8>, k: &str| {
            if !first {
                out.push(b',');
            }
            first = false;
            write_json(out, &Value::from(k));
            out.push(b':');
        };
        out.push(b'{');
        let mut stream_written = false;
        // A repeated key: JSON parsers keep the last one, and so does this view — written at
        // the place of the first. One pass to find each key's last value, one to write: linear
        // in the number of keys, however many a client repeats.
        let mut last: HashMap<&str, Slot<'_>> = HashMap::with_capacity(self.fields.len());
        for (k, v) in &self.fields {
            last.insert(k.as_str(), *v);
        }
        for (k, _) in &self.fields {
            let k = k.as_str();
            let Some(v) = last.remove(k) else {
                continue;
            };
            let v = match v {
                Slot::Raw(v) => v,
                Slot::Messages => {
                    key(&mut out, k);
                    self.write_messages(&mut out, edits, normalize);
                    continue;
                }
            };
            match k {
                "model" if model_changes => {
                    key(&mut out, k);
                    write_json(&mut out, &Value::from(edits.model.unwrap_or_default()));
                }
                "tools" | "tool_choice" | "parallel_tool_calls" if drop_tools => {}
                "tools" if hides => {
                    key(&mut out, k);
                    out.push(b'[');
                    for (i, t) in tools.iter().filter(|t| !edits.hides(t)).enumerate() {
                        if i > 0 {
                            out.push(b',');
                        }
                        out.extend_from_slice(t.raw.get().as_bytes());
                    }
                    out.push(b']');
                }
                "tool_choice" if hides => {
                    key(&mut out, k);
                    match serde_json::from_str::<Value>(v.get()) {
                        Ok(choice) => write_json(&mut out, &without_hidden(choice, edits.hidden)),
                        Err(_) => out.extend_from_slice(v.get().as_bytes()),
                    }
                }
                // `stream_options` is only allowed with `stream: true`.
                "stream_options" if edits.stream == Some(false) => {}
                "stream" if edits.stream.is_some() => {
                    key(&mut out, k);
                    let s = edits.stream.unwrap_or_default();
                    out.extend_from_slice(if s { b"true" } else { b"false" });
                    stream_written = true;
                }
                _ => {
                    key(&mut out, k);
                    out.extend_from_slice(v.get().as_bytes());
                }
            }
        }
        if let Some(s) = edits.stream
            && !stream_written
        {
            key(&mut out, "stream");
            out.extend_from_slice(if s { b"true" } else { b"false" });
        }
        out.push(b'}');
        Bytes::from(out)
    }

    fn write_messages(&self, out: &mut Vec<u8>, edits: &Edits<'_>, normalize: bool) {
        let at = self
            .messages
            .iter()
            .take_while(|m| matches!(m.role(), "system" | "developer"))
            .count();
        out.push(b'[');
        let mut first = true;
        let mut sep = |out: &mut Vec<u8>| {
            if !first {
                out.push(b',');
            }
            first = false;
        };
        for (i, m) in self.messages.iter().enumerate() {
            if i == at
                && let Some(text) = edits.system
            {
                sep(out);
                write_json(out, &serde_json::json!({"role": "system", "content": text}));
            }
            sep(out);
            let replacement = (m.role() == "tool")
                .then_some(m.tool_call_id.as_ref())
                .flatten()
                .and_then(|id| {
                    edits
                        .replaced
                        .iter()
                        .find(|(r, _)| r == id.as_str())
                        .map(|(_, text)| (id.as_str(), text))
                });
            if let Some((id, text)) = replacement {
                write_json(
                    out,
                    &serde_json::json!({"role": "tool", "tool_call_id": id, "content": text}),
                );
            } else if normalize && m.needs_content() {
                m.write_with_content(out);
            } else {
                out.extend_from_slice(m.raw.get().as_bytes());
            }
        }
        if at == self.messages.len()
            && let Some(text) = edits.system
        {
            sep(out);
            write_json(out, &serde_json::json!({"role": "system", "content": text}));
        }
        if let Some(extra) = edits.append {
            sep(out);
            write_json(out, extra);
        }
        out.push(b']');
    }
}

/// A `tool_choice` with the hidden tools taken out: one that names a hidden function becomes
/// `"auto"`; an `allowed_tools` choice keeps the others, or becomes `"auto"` when none is left.
fn without_hidden(mut choice: Value, hidden: &[String]) -> Value {
    let is_hidden = |t: &Value| {
        t.at("/function/name")
            .or_else(|| t.get("name"))
            .and_then(Value::as_str)
            .is_some_and(|n| hidden.iter().any(|h| h == n))
    };
    if is_hidden(&choice) {
        return Value::String("auto".into());
    }
    if let Some(tools) = choice
        .at_mut("/allowed_tools/tools")
        .and_then(Value::as_array_mut)
    {
        tools.retain(|t| !is_hidden(t));
        if tools.is_empty() {
            return Value::String("auto".into());
        }
    }
    choice
}

fn write_json(out: &mut Vec<u8>, v: &Value) {
    // Writing a Value into a Vec cannot fail.
    let _ = serde_json::to_writer(out, v);
}

/// What to change when writing a request back. The default changes nothing.
#[derive(Debug, Default, Clone, Copy)]
pub struct Edits<'e> {
    /// Send this model instead of the client's.
    pub model: Option<&'e str>,
    /// Give assistant messages with tool calls and no content `content: ""`.
    pub normalize: bool,
    /// A system message to insert after the leading system and developer messages.
    pub system: Option<&'e str>,
    /// Tools to remove from `tools` (and from `tool_choice`, which then becomes `auto`; when no
    /// tool is left, `tools`, `tool_choice` and `parallel_tool_calls` go).
    pub hidden: &'e [String],
    /// A message to append at the end of the conversation.
    pub append: Option<&'e Value>,
    /// Set `stream`.
    pub stream: Option<bool>,
    /// Tool results whose content is replaced, by `tool_call_id` (the gateway's repair of a
    /// tool's answer the model could not read, see `recover`).
    pub replaced: &'e [(String, String)],
}

impl Edits<'_> {
    fn hides(&self, t: &Tool<'_>) -> bool {
        t.name
            .as_ref()
            .is_some_and(|n| self.hidden.iter().any(|h| h == n.as_str()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// `first_call` reads what the first of `calls` reads, however odd the calls: a name or
    /// id of another type, a call or function that is not an object, a repeated field (which
    /// makes the whole call unreadable), arguments that are not text.
    #[test]
    fn first_call_is_the_first_of_calls() {
        let cases = [
            r#"[{"id":"c1","type":"function","function":{"name":"search","arguments":"{\"q\":\"a\"}"}}]"#,
            r#"[7, "x", {"id":"c2","function":{"name":"f","arguments":{"q":1}}}]"#,
            r#"[{"id":3,"function":{"name":["n"]}}, {"id":"c4"}]"#,
            r#"[{"id":"c5","function":"f"}]"#,
            r#"[{"id":"c6","function":["f","{}"]}]"#,
            r#"[{"id":"c7","function":["f","{}","x"]}]"#,
            r#"[{"id":"a","id":"b","function":{"name":"f"}}, {"id":"c8","function":{"name":"g"}}]"#,
            r#"[{"id":"c9","function":{"name":"f","arguments":"1","arguments":"2"}}]"#,
            r#"[{"id":"c10","function":{"name":"f","name":"g"}}]"#,
            r#"[{"id":null,"function":{"name":null,"arguments":null}}]"#,
            r#"[]"#,
            r#"{"id":"c11"}"#,
            r#""none""#,
        ];
        for calls in cases {
            let body = format!(
                r#"{{"model":"m","messages":[{{"role":"assistant","content":null,"tool_calls":{calls}}}]}}"#
            );
            let r = ChatRequest::parse(body.as_bytes()).unwrap();
            let m = &r.messages[0];
            let want = m.calls().into_iter().next().map(|c| {
                (
                    c.id.as_ref().map_or("", |i| i.as_str()).to_owned(),
                    c.function
                        .as_ref()
                        .and_then(|f| f.name.as_ref())
                        .map_or("", |n| n.as_str())
                        .to_owned(),
                )
            });
            assert_eq!(m.first_call(), want, "{calls}");
        }
    }

    #[test]
    fn a_replaced_tool_result_is_written_with_its_new_content() {
        let b = body(&sample());
        let r = ChatRequest::parse(&b).unwrap();
        let replaced = vec![("c1".to_owned(), "{\"temp\":21}".to_owned())];
        let out: Value = serde_json::from_slice(&r.encode(
            &Edits {
                replaced: &replaced,
                ..Edits::default()
            },
            &b,
        ))
        .unwrap();
        let tool = out["messages"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["role"] == "tool")
            .unwrap();
        assert_eq!(tool["content"], "{\"temp\":21}");
        assert_eq!(tool["tool_call_id"], "c1");
        // Nothing else changed.
        let mut want = sample();
        for m in want["messages"].as_array_mut().unwrap() {
            if m["role"] == "tool" {
                m["content"] = json!("{\"temp\":21}");
            }
        }
        assert_eq!(out, want);
    }

    fn body(v: &Value) -> Bytes {
        Bytes::from(serde_json::to_vec(v).unwrap())
    }

    fn sample() -> Value {
        json!({
            "model": "m",
            "messages": [
                {"role": "system", "content": "s"},
                {"role": "user", "content": "caf\u{e9} \"quoted\""},
                {"role": "assistant", "content": null, "tool_calls": [
                    {"id": "c1", "type": "function",
                     "function": {"name": "search", "arguments": "{\"q\":\"x\"}"}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "Error: down"},
                {"role": "assistant", "tool_calls": [
                    {"id": "c2", "type": "function", "function": {"name": "lookup", "arguments": "{}"}}]}
            ],
            "tools": [
                {"type": "function", "function": {"name": "search", "parameters": {"type": "object"}}},
                {"type": "function", "function": {"name": "lookup"}}
            ],
            "tool_choice": {"type": "function", "function": {"name": "search"}},
            "temperature": 0.1,
            "seed": 12345678901234567890u64
        })
    }

    #[test]
    fn reads_the_fields_healing_needs() {
        let b = body(&sample());
        let r = ChatRequest::parse(&b).unwrap();
        assert_eq!(r.model.as_str(), "m");
        assert!(!r.stream);
        assert_eq!(r.messages.len(), 5);
        assert_eq!(r.messages[1].content_text(), "café \"quoted\"");
        // Text without escapes is read in place; with them (the quotes above), decoded.
        assert!(matches!(
            r.messages[3].content_text(),
            Cow::Borrowed("Error: down")
        ));
        assert!(matches!(r.messages[1].content_text(), Cow::Owned(_)));
        assert!(matches!(r.messages[2].content_text(), Cow::Borrowed("")));
        let calls = r.messages[2].calls();
        assert_eq!(calls[0].id.as_ref().unwrap().as_str(), "c1");
        let f = calls[0].function.as_ref().unwrap();
        assert_eq!(f.name.as_ref().unwrap().as_str(), "search");
        assert_eq!(f.arguments.as_ref().unwrap().as_str(), "{\"q\":\"x\"}");
        assert_eq!(r.messages[3].tool_call_id.as_ref().unwrap().as_str(), "c1");
        assert_eq!(r.tools().len(), 2);
        assert_eq!(r.tool_choice_name().unwrap().as_str(), "search");
        assert!(r.messages[2].needs_content() && r.messages[4].needs_content());
        assert!(!r.messages[3].needs_content());
    }

    /// Issue 13: repeated top-level keys were deduplicated in O(k²); now one pass. The last
    /// value wins, written where the key first appeared, however many repeats a client sends.
    #[test]
    fn issue_13_repeated_top_level_keys_keep_the_last_value_in_first_place() {
        let mut body = String::from(r#"{"temperature": 0, "model": "m""#);
        for i in 0..20_000 {
            body.push_str(&format!(r#", "x": {i}"#));
        }
        body.push_str(r#", "messages": [{"role": "user", "content": "hi"}], "temperature": 1}"#);
        let bytes = Bytes::from(body);
        let r = ChatRequest::parse(&bytes).unwrap();
        let out = r.encode(
            &Edits {
                model: Some("other"),
                ..Edits::default()
            },
            &bytes,
        );
        let text = std::str::from_utf8(&out).unwrap();
        assert!(
            text.starts_with(r#"{"temperature":1,"model":"other","x":19999,"messages""#),
            "{text}"
        );
    }

    #[test]
    fn no_edits_returns_the_client_buffer() {
        let b = body(&sample());
        let r = ChatRequest::parse(&b).unwrap();
        let out = r.encode(&Edits::default(), &b);
        assert_eq!(out.as_ptr(), b.as_ptr());
        let same_model = Edits {
            model: Some("m"),
            ..Edits::default()
        };
        assert_eq!(r.encode(&same_model, &b).as_ptr(), b.as_ptr());
    }

    #[test]
    fn edits_change_only_what_they_name() {
        let b = body(&sample());
        let r = ChatRequest::parse(&b).unwrap();
        let hidden = vec!["search".to_string()];
        let extra = json!({"role": "user", "content": "again"});
        let out = r.encode(
            &Edits {
                model: Some("other"),
                normalize: true,
                system: Some("[selfheal] use lookup"),
                hidden: &hidden,
                append: Some(&extra),
                stream: Some(false),
                replaced: &[],
            },
            &b,
        );
        let v: Value = serde_json::from_slice(&out).unwrap();
        let mut want = sample();
        want["model"] = json!("other");
        want["messages"][2]["content"] = json!("");
        want["messages"][4]["content"] = json!("");
        want["messages"].as_array_mut().unwrap().insert(
            1,
            json!({"role": "system", "content": "[selfheal] use lookup"}),
        );
        want["messages"].as_array_mut().unwrap().push(extra.clone());
        want["tools"].as_array_mut().unwrap().remove(0);
        want["tool_choice"] = json!("auto");
        want["stream"] = json!(false);
        assert_eq!(v, want);
        // Untouched numbers keep the client's spelling, even past f64's precision.
        assert!(
            std::str::from_utf8(&out)
                .unwrap()
                .contains("12345678901234567890")
        );
    }

    #[test]
    fn hiding_every_tool_drops_tools_and_choice() {
        let b = body(&sample());
        let r = ChatRequest::parse(&b).unwrap();
        let hidden = vec!["search".to_string(), "lookup".to_string()];
        let out = r.encode(
            &Edits {
                hidden: &hidden,
                ..Edits::default()
            },
            &b,
        );
        let v: Value = serde_json::from_slice(&out).unwrap();
        assert!(v.get("tools").is_none() && v.get("tool_choice").is_none());
        assert_eq!(v["messages"], sample()["messages"]);
    }

    #[test]
    fn bad_bodies_are_named() {
        for (b, want) in [
            (&b"{"[..], "not valid JSON"),
            (b"[1]", "JSON object"),
            (b"{\"model\": \"m\"}", "messages"),
            (b"{\"model\": \"m\", \"messages\": []}", "messages"),
            (b"{\"model\": \"m\", \"messages\": \"hi\"}", "messages"),
            (b"{\"model\": \"m\", \"messages\": null}", "messages"),
            (b"{\"model\": \"m\", \"messages\": 3.5}", "messages"),
            (
                b"{\"model\": \"m\", \"messages\": {\"role\": \"user\"}}",
                "messages",
            ),
            (b"{\"model\": 3, \"messages\": [{}]}", "model"),
            (b"\xff", "UTF-8"),
        ] {
            let e = ChatRequest::parse(b).unwrap_err();
            assert!(e.0.contains(want), "{e:?} should mention {want}");
        }
    }

    #[test]
    fn a_repeated_key_in_a_message_is_read_like_upstream_parsers_do() {
        // The last `content` wins, so this message needs `content: ""` like any other.
        let b = Bytes::from_static(
            br#"{"model":"m","messages":[{"role":"assistant","content":"x","tool_calls":[{"id":"a","function":{"name":"t"}}],"content":null},["assistant",null,[{"id":"b"}]]]}"#,
        );
        let r = ChatRequest::parse(&b).unwrap();
        assert!(r.messages[0].needs_content());
        assert_eq!(r.messages[0].calls().len(), 1);
        // An array is not a message, whatever its elements look like.
        assert_eq!(r.messages[1].role(), "");
        assert!(r.messages[1].calls().is_empty());
    }

    #[test]
    fn odd_messages_are_kept_opaque() {
        let v = json!({"model": "m", "messages": [
            "not an object",
            {"role": 3, "content": {"x": 1}, "tool_calls": "nope"},
            {"role": "assistant", "tool_calls": [1, {"id": "a", "function": {"name": "t"}}]}
        ]});
        let b = body(&v);
        let r = ChatRequest::parse(&b).unwrap();
        assert_eq!(r.messages[0].role(), "");
        assert_eq!(r.messages[1].role(), "");
        assert!(r.messages[1].calls().is_empty());
        assert_eq!(r.messages[2].calls().len(), 1);
        let out = r.encode(
            &Edits {
                normalize: true,
                ..Edits::default()
            },
            &b,
        );
        let got: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(got["messages"][0], v["messages"][0]);
        assert_eq!(got["messages"][2]["content"], json!(""));
    }
}
