//! The task's own words in a conversation: what a value can be grounded in.
//!
//! Why this module exists: the grounding rules (the core's `ungrounded_arguments` and
//! `ungrounded_numbers`) judge a value by whether it appears in the evidence, and the evidence
//! of a conversation starts with what its system, developer and user messages say. The runtime's
//! agent, the gateway's chat dialect and its Responses dialect read those texts out of
//! OpenAI-shaped messages; this is the one reading they share.

use serde_json::Value;

/// Whether a message of `role` speaks for the task (`system`, `developer`, `user`): its words
/// are evidence. A tool's result is evidence too, but read as the model reads it (its value),
/// which is the caller's to decide; the model's own words are not evidence of anything.
pub fn is_task_role(role: &str) -> bool {
    matches!(role, "system" | "developer" | "user")
}

/// The texts of a message's `content`: the string itself, or the `text` of each content part
/// (parts without one, such as images, have none). Any other content has no text.
pub fn content_texts(content: &Value) -> Vec<&str> {
    match content {
        Value::String(t) => vec![t.as_str()],
        Value::Array(parts) => parts
            .iter()
            .filter_map(|p| p.get("text").and_then(Value::as_str))
            .collect(),
        Value::Null | Value::Bool(_) | Value::Number(_) | Value::Object(_) => Vec::new(),
    }
}

/// The texts of the task's own messages among `messages` (chat messages or Responses input
/// items with a `role` and a `content`), in order, as evidence values.
pub fn task_texts<'a>(messages: impl IntoIterator<Item = &'a Value>) -> Vec<Value> {
    let mut out = Vec::new();
    for m in messages {
        if !m
            .get("role")
            .and_then(Value::as_str)
            .is_some_and(is_task_role)
        {
            continue;
        }
        if let Some(content) = m.get("content") {
            out.extend(
                content_texts(content)
                    .into_iter()
                    .map(|t| Value::String(t.to_owned())),
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_task_speaks_in_system_developer_and_user_messages_only() {
        let messages = [
            json!({"role": "system", "content": "Answer in kelvin."}),
            json!({"role": "developer", "content": [{"type": "input_text", "text": "id 42"}]}),
            json!({"role": "user", "content": [
                {"type": "text", "text": "Paris"},
                {"type": "image_url", "image_url": {"url": "data:,"}},
            ]}),
            json!({"role": "assistant", "content": "It is 7."}),
            json!({"role": "tool", "content": "{\"t\": 280}"}),
            json!({"type": "function_call_output", "output": "9"}),
            json!({"role": "user", "content": null}),
        ];
        assert_eq!(
            task_texts(&messages),
            vec![json!("Answer in kelvin."), json!("id 42"), json!("Paris")]
        );
    }

    #[test]
    fn content_is_a_string_or_parts_with_text() {
        assert_eq!(content_texts(&json!("a")), vec!["a"]);
        assert_eq!(
            content_texts(&json!([{"text": "a"}, {"image": 1}, {"text": "b"}])),
            vec!["a", "b"]
        );
        assert!(content_texts(&json!({"text": "not a part list"})).is_empty());
    }
}
