//! Tool calls written as text.
//!
//! Why: small and local models (Qwen, Llama, Mistral, Hermes fine-tunes behind Ollama,
//! llama.cpp or vLLM without a tool parser) often answer a request that offered tools with the
//! call written into the message text — a fenced JSON block, `<tool_call>` tags, Mistral's
//! `[TOOL_CALLS]`, Llama's `<|python_tag|>` — and no structured `tool_calls`. A client then
//! sees prose and the agent stalls. [`find_text_calls`] reads such text back into calls, under
//! the rule of this crate: **nothing the model did not write**. A call is taken only when it
//! names a tool on offer, its arguments read without a guess, and it stands where a call is
//! written (the whole answer, a fence, a tag), not quoted inside an explanation; anything else
//! that looks like a call is [`TextCalls::Doubt`], for the caller to re-ask.

use serde_json::Value;

use crate::{RepairOptions, repair_with};

/// A tool call read from an answer's text.
#[derive(Debug, Clone, PartialEq)]
pub struct TextCall {
    /// The tool's name, one of those on offer.
    pub name: String,
    /// The arguments as a JSON object's text: as the model wrote them when they were valid
    /// JSON, else the repaired object with every number as written.
    pub arguments: String,
}

/// What [`find_text_calls`] found.
#[derive(Debug, Clone, PartialEq)]
pub enum TextCalls {
    /// The text writes no call: an ordinary answer.
    None,
    /// Calls of offered tools, and the rest of the text (prose around them, trimmed; empty
    /// when there was none).
    Found {
        /// The calls, in the order written.
        calls: Vec<TextCall>,
        /// The text left once the calls are taken out.
        rest: String,
    },
    /// The text looks like a call but cannot be taken without a guess: re-ask.
    Doubt {
        /// Why, for the re-ask and the trace.
        reason: String,
    },
}

/// Where a call may be written, and how much text the region spans.
struct Region<'a> {
    /// Byte range of the whole region in the text (wrapper included).
    start: usize,
    end: usize,
    /// The JSON inside.
    body: std::borrow::Cow<'a, str>,
}

impl<'a> Region<'a> {
    /// The region `start..end` of `text` whose JSON is `text[body]`.
    fn slice(text: &'a str, start: usize, body: std::ops::Range<usize>, end: usize) -> Self {
        Region {
            start,
            end,
            body: text.get(body).unwrap_or_default().into(),
        }
    }
}

/// Reads the tool calls written in `text`, an answer to a request that offered the tools
/// named `offered`. See the module docs for the rule.
#[must_use]
pub fn find_text_calls(text: &str, offered: &[&str]) -> TextCalls {
    if offered.is_empty() || !mentions_a_call(text) {
        return TextCalls::None;
    }
    let regions = regions(text);
    if regions.is_empty() {
        // A call-shaped object quoted inside prose, without a fence or a tag around it.
        return if names_an_offered_tool(text, offered) {
            TextCalls::Doubt {
                reason: "the answer quotes what looks like a tool call inside its text".into(),
            }
        } else {
            TextCalls::None
        };
    }
    let mut calls = Vec::new();
    let mut doubt = None;
    let mut taken: Vec<(usize, usize)> = Vec::new();
    for r in &regions {
        match read_calls(&r.body, offered) {
            Read::Calls(c) => {
                calls.extend(c);
                taken.push((r.start, r.end));
            }
            Read::NotACall => {}
            Read::Doubt(reason) => {
                doubt.get_or_insert(reason);
            }
        }
    }
    if let Some(reason) = doubt {
        return TextCalls::Doubt { reason };
    }
    if calls.is_empty() {
        return TextCalls::None;
    }
    let mut rest = String::new();
    let mut at = 0;
    for (s, e) in taken {
        rest.push_str(text.get(at..s).unwrap_or_default());
        rest.push(' ');
        at = e;
    }
    rest.push_str(text.get(at..).unwrap_or_default());
    let rest = rest.split_whitespace().collect::<Vec<_>>().join(" ");
    TextCalls::Found { calls, rest }
}

/// A cheap first look: does the text hold any of the marks of a written call?
fn mentions_a_call(text: &str) -> bool {
    text.contains("name") || text.contains("[TOOL_CALLS]") || text.contains("<|python_tag|>")
}

/// Whether an offered tool's name appears in the text in quotes.
fn names_an_offered_tool(text: &str, offered: &[&str]) -> bool {
    offered
        .iter()
        .any(|n| text.contains(&format!("\"{n}\"")) || text.contains(&format!("'{n}'")))
}

/// The places a call is written: `<tool_call>` tags, `[TOOL_CALLS]` and `<|python_tag|>` up to
/// the end, fenced code blocks, or the whole text when it is one JSON value.
fn regions(text: &str) -> Vec<Region<'_>> {
    let mut out = Vec::new();
    // `<tool_call>{…}</tool_call>` (Qwen, Hermes), any number of them.
    let mut from = 0;
    while let Some(s) = text.get(from..).and_then(|t| t.find("<tool_call>")) {
        let open = from + s;
        let body_start = open + "<tool_call>".len();
        let (body_end, end) = match text.get(body_start..).and_then(|t| t.find("</tool_call>")) {
            Some(e) => (body_start + e, body_start + e + "</tool_call>".len()),
            None => (text.len(), text.len()),
        };
        out.push(Region::slice(text, open, body_start..body_end, end));
        from = end;
    }
    if !out.is_empty() {
        return out;
    }
    for mark in ["[TOOL_CALLS]", "<|python_tag|>"] {
        if let Some(s) = text.find(mark) {
            let body = text.get(s + mark.len()..).unwrap_or_default();
            // Llama writes several calls separated by `;` — between the values, never inside
            // a string (`{"q": "a;b"}` is one call whose argument holds a `;`).
            let parts = top_level_split(body, b';');
            let body = if mark == "<|python_tag|>" && parts.len() > 1 {
                format!(
                    "[{}]",
                    parts
                        .into_iter()
                        .filter(|p| !p.trim().is_empty())
                        .collect::<Vec<_>>()
                        .join(",")
                )
            } else {
                body.to_owned()
            };
            out.push(Region {
                start: s,
                end: text.len(),
                body: body.into(),
            });
            return out;
        }
    }
    // Fenced code blocks.
    let mut from = 0;
    while let Some(s) = text.get(from..).and_then(|t| t.find("```")) {
        let open = from + s;
        let after = open + 3;
        let line_end = text
            .get(after..)
            .and_then(|t| t.find('\n'))
            .map_or(text.len(), |e| after + e);
        let lang = text.get(after..line_end).unwrap_or_default().trim();
        // ```json {…}``` on one line: the body starts right after the language word.
        let body_start = if lang.starts_with('{') || lang.starts_with('[') {
            after
        } else if let Some(rest) = lang.strip_prefix("json")
            && (rest.trim_start().starts_with('{') || rest.trim_start().starts_with('['))
        {
            after + 4
        } else {
            line_end.saturating_add(1).min(text.len())
        };
        let Some(close) = text.get(body_start..).and_then(|t| t.find("```")) else {
            break;
        };
        let body_end = body_start + close;
        let end = body_end + 3;
        out.push(Region::slice(text, open, body_start..body_end, end));
        from = end;
    }
    if !out.is_empty() {
        return out;
    }
    // The whole answer, when it is JSON and nothing else.
    let t = text.trim();
    if t.starts_with('{') || t.starts_with('[') {
        out.push(Region {
            start: 0,
            end: text.len(),
            body: t.into(),
        });
    }
    out
}

/// `text` cut at each `sep` that stands outside strings and brackets.
fn top_level_split(text: &str, sep: u8) -> Vec<&str> {
    let mut out = Vec::new();
    let (mut depth, mut in_string, mut escaped, mut start) = (0usize, false, false, 0);
    for (i, &b) in text.as_bytes().iter().enumerate() {
        if in_string {
            match (escaped, b) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'{' | b'[' => depth += 1,
            b'}' | b']' => depth = depth.saturating_sub(1),
            _ if b == sep && depth == 0 => {
                out.push(text.get(start..i).unwrap_or_default());
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(text.get(start..).unwrap_or_default());
    out
}

/// What one region holds.
enum Read {
    Calls(Vec<TextCall>),
    NotACall,
    Doubt(String),
}

/// Reads the calls of one region's JSON.
fn read_calls(body: &str, offered: &[&str]) -> Read {
    let body = body.trim();
    // `{{"name": …}}`: doubled braces, as a model that saw a template writes them.
    let undoubled;
    let body = if body.starts_with("{{") && body.ends_with("}}") {
        undoubled = body.get(1..body.len() - 1).unwrap_or_default().to_owned();
        undoubled.as_str()
    } else {
        body
    };
    let repaired = match repair_with(body, &RepairOptions::default().with_input_complete(true)) {
        Ok(r) => r,
        Err(e) => {
            return if names_an_offered_tool(body, offered) {
                Read::Doubt(format!("a tool call written as text cannot be read: {e}"))
            } else {
                Read::NotACall
            };
        }
    };
    let items: Vec<(String, &Value)> = match &repaired.value {
        Value::Array(items) => items
            .iter()
            .enumerate()
            .map(|(i, v)| (format!("/{i}"), v))
            .collect(),
        v @ Value::Object(_) => vec![(String::new(), v)],
        _ => return Read::NotACall,
    };
    // Arguments that were valid JSON as written are passed on byte for byte.
    let raw = raw_arguments(body);
    let mut calls = Vec::new();
    for (i, (pointer, item)) in items.into_iter().enumerate() {
        let Some(obj) = item.as_object() else {
            return Read::NotACall;
        };
        // `{"name", "arguments" | "parameters"}`, or OpenAI's `{"function": {…}}` shape.
        let (inner, base) = match obj.get("function").and_then(Value::as_object) {
            Some(f) => (f, format!("{pointer}/function")),
            None => (obj, pointer),
        };
        let Some(name) = inner.get("name").and_then(Value::as_str) else {
            return Read::NotACall;
        };
        let (key, args) = match (inner.get("arguments"), inner.get("parameters")) {
            (Some(a), None) => ("arguments", a),
            (None, Some(p)) => ("parameters", p),
            (None, None) => return Read::NotACall,
            (Some(_), Some(_)) => {
                return Read::Doubt(format!(
                    "the call of `{name}` written as text has both arguments and parameters"
                ));
            }
        };
        if !offered.contains(&name) {
            return Read::Doubt(format!(
                "the answer writes a call of `{name}`, which is not a tool on offer"
            ));
        }
        let as_written = raw
            .as_ref()
            .and_then(|r| r.get(i))
            .and_then(|r| r.as_deref())
            .filter(|r| r.trim_start().starts_with('{'));
        let arguments = match args {
            Value::Object(_) if as_written.is_some() => as_written.unwrap_or_default().to_owned(),
            Value::Object(_) => {
                match repaired
                    .literals
                    .under(&format!("{base}/{key}"))
                    .render(args)
                {
                    Ok(t) => t,
                    Err(e) => return Read::Doubt(e.to_string()),
                }
            }
            // Arguments as a JSON string (OpenAI's wire form): its text must be an object.
            Value::String(s) => match serde_json::from_str::<Value>(s) {
                Ok(Value::Object(_)) => s.clone(),
                _ => {
                    return Read::Doubt(format!(
                        "the arguments of `{name}` written as text are not a JSON object"
                    ));
                }
            },
            Value::Null => "{}".to_owned(),
            _ => {
                return Read::Doubt(format!(
                    "the arguments of `{name}` written as text are not a JSON object"
                ));
            }
        };
        calls.push(TextCall {
            name: name.to_owned(),
            arguments,
        });
    }
    if calls.is_empty() {
        Read::NotACall
    } else {
        Read::Calls(calls)
    }
}

/// One call as written, for the text of its arguments.
#[derive(serde::Deserialize)]
struct RawCall<'a> {
    #[serde(borrow, default)]
    arguments: Option<&'a serde_json::value::RawValue>,
    #[serde(borrow, default)]
    parameters: Option<&'a serde_json::value::RawValue>,
    #[serde(borrow, default)]
    function: Option<Box<RawCall<'a>>>,
}

impl RawCall<'_> {
    fn arguments(&self) -> Option<String> {
        match &self.function {
            Some(f) => f.arguments(),
            None => self
                .arguments
                .or(self.parameters)
                .map(|r| r.get().to_owned()),
        }
    }
}

/// The arguments text of each call in `body`, when `body` is valid JSON (one call or a list).
fn raw_arguments(body: &str) -> Option<Vec<Option<String>>> {
    // A struct reads from a JSON array too (its fields in order): the shape decides.
    if body.trim_start().starts_with('{') {
        let one = serde_json::from_str::<RawCall<'_>>(body).ok()?;
        return Some(vec![one.arguments()]);
    }
    serde_json::from_str::<Vec<RawCall<'_>>>(body)
        .ok()
        .map(|list| list.iter().map(RawCall::arguments).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    const OFFERED: &[&str] = &["get_weather", "search"];

    fn found(text: &str) -> (Vec<(String, Value)>, String) {
        match find_text_calls(text, OFFERED) {
            TextCalls::Found { calls, rest } => (
                calls
                    .into_iter()
                    .map(|c| (c.name, serde_json::from_str(&c.arguments).unwrap()))
                    .collect(),
                rest,
            ),
            other => panic!("{text:?}: {other:?}"),
        }
    }

    fn paris() -> Vec<(String, Value)> {
        vec![("get_weather".into(), serde_json::json!({"city": "Paris"}))]
    }

    #[test]
    fn the_shapes_real_models_write() {
        for text in [
            "```json\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n```",
            "```json {\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}} ```",
            "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}",
            "{{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}}",
            "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
            "[TOOL_CALLS] [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}]",
            "<|python_tag|>{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}",
            "```json\n{\n  // the city\n  \"name\": \"get_weather\",\n  \"arguments\": {\"city\": \"Paris\"}\n}\n```",
            "{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"arguments\": \"{\\\"city\\\": \\\"Paris\\\"}\"}}",
        ] {
            let (calls, rest) = found(text);
            assert_eq!(calls, paris(), "{text}");
            assert_eq!(rest, "", "{text}");
        }
    }

    #[test]
    fn llama_calls_are_split_between_values_not_inside_strings() {
        match find_text_calls(
            "<|python_tag|>{\"name\": \"search\", \"parameters\": {\"q\": \"a;b\"}}; {\"name\": \"search\", \"parameters\": {\"q\": \"c\"}}",
            OFFERED,
        ) {
            TextCalls::Found { calls, .. } => {
                assert_eq!(calls.len(), 2);
                assert_eq!(calls[0].arguments, "{\"q\": \"a;b\"}");
                assert_eq!(calls[1].arguments, "{\"q\": \"c\"}");
            }
            other => panic!("{other:?}"),
        }
        let (calls, _) =
            found("<|python_tag|>{\"name\": \"search\", \"parameters\": {\"q\": \"x; y\"}}");
        assert_eq!(calls[0].1, serde_json::json!({"q": "x; y"}));
    }

    #[test]
    fn prose_around_a_fence_is_kept_as_the_rest() {
        let (calls, rest) = found(
            "I'll check the weather.\n```json\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n```\nOne moment.",
        );
        assert_eq!(calls, paris());
        assert_eq!(rest, "I'll check the weather. One moment.");
    }

    #[test]
    fn several_calls_in_tags_or_a_list() {
        let (calls, _) = found(
            "<tool_call>{\"name\": \"search\", \"arguments\": {\"q\": \"a\"}}</tool_call>\n<tool_call>{\"name\": \"search\", \"arguments\": {\"q\": \"b\"}}</tool_call>",
        );
        assert_eq!(calls.len(), 2);
        assert_eq!(calls[1].1, serde_json::json!({"q": "b"}));
    }

    #[test]
    fn arguments_valid_as_written_keep_their_bytes() {
        match find_text_calls(
            "{\"name\": \"search\", \"arguments\": {\"z\": 1, \"id\": 1180591620717411303424}}",
            OFFERED,
        ) {
            TextCalls::Found { calls, .. } => {
                assert_eq!(
                    calls[0].arguments,
                    "{\"z\": 1, \"id\": 1180591620717411303424}"
                );
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn ordinary_answers_are_not_calls() {
        for text in [
            "The weather in Paris is sunny.",
            "Here is the JSON you asked for: ```json\n{\"city\": \"Paris\", \"temp\": 21}\n```",
            "{\"answer\": 42}",
            "My name is Qwen.",
        ] {
            assert_eq!(find_text_calls(text, OFFERED), TextCalls::None, "{text}");
        }
        // No tools offered: nothing is a call.
        assert_eq!(
            find_text_calls(
                "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}",
                &[]
            ),
            TextCalls::None
        );
    }

    #[test]
    fn what_cannot_be_taken_without_a_guess_is_doubt() {
        for text in [
            // A tool not on offer.
            "{\"name\": \"send_email\", \"arguments\": {\"to\": \"a\"}}",
            // Arguments cut off.
            "```json\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Par\n```",
            // A call quoted in an explanation, no fence or tag.
            "To get the weather you would send {\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}} to the API.",
            // Arguments that are not an object.
            "{\"name\": \"get_weather\", \"arguments\": \"Paris\"}",
        ] {
            assert!(
                matches!(find_text_calls(text, OFFERED), TextCalls::Doubt { .. }),
                "{text}: {:?}",
                find_text_calls(text, OFFERED)
            );
        }
    }
}
