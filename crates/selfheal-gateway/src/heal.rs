//! Healing decisions for one request, rebuilt from the conversation it carries.
//!
//! The gateway sees no tool being called: it sees each tool's *result* arrive as a `tool`
//! message in the next request. So the run's tool history is replayed from the messages —
//! assistant `tool_calls` matched to `tool` results by id, each result classified hard or soft
//! (SPEC §1) — into the run's [`Monitor`], and only the results it has not seen yet. The
//! monitor's verdict then edits the request: guidance as a system message, circuit-broken tools
//! removed from `tools`, `tool_choice` fixed if it named one. On the way back, tool-call
//! arguments are checked against the request's own tool schemas and repaired in place.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use serde_json::{Value, json};

use selfheal_core::monitor::{Monitor, ToolCall, Verdict};
use selfheal_repair::{SchemaGuide, reask_message, repair};

use crate::runs::RunState;

/// One tool the request offers.
#[derive(Debug, Clone)]
pub struct ToolSpec {
    /// The JSON Schema of its arguments (`{}` when none).
    pub parameters: Value,
    /// The names of its required arguments.
    pub required: Vec<String>,
}

/// The tools of a request by name.
pub type ToolIndex = HashMap<String, ToolSpec>;

/// Indexes the `tools` of a request body.
pub fn tool_index(body: &Value) -> ToolIndex {
    let mut out = ToolIndex::new();
    let Some(tools) = body.get("tools").and_then(Value::as_array) else {
        return out;
    };
    for t in tools {
        let Some(f) = t.get("function") else { continue };
        let Some(name) = f.get("name").and_then(Value::as_str) else {
            continue;
        };
        let parameters = f.get("parameters").cloned().unwrap_or_else(|| json!({}));
        let required = parameters
            .get("required")
            .and_then(Value::as_array)
            .map(|r| {
                r.iter()
                    .filter_map(Value::as_str)
                    .map(str::to_owned)
                    .collect()
            })
            .unwrap_or_default();
        out.insert(
            name.to_owned(),
            ToolSpec {
                parameters,
                required,
            },
        );
    }
    out
}

/// The text of a message's `content` (a string, or the text parts of an array).
pub fn content_text(m: &Value) -> String {
    match m.get("content") {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => parts
            .iter()
            .filter_map(|p| p.get("text").and_then(Value::as_str))
            .collect::<Vec<_>>()
            .join(""),
        _ => String::new(),
    }
}

/// Whether a tool result's text reports that the tool raised or timed out (a hard failure).
/// Agent frameworks put the exception text in the tool message; these are the shapes they use.
pub fn is_hard_failure_text(text: &str) -> bool {
    let t = text.trim_start();
    let head: String = t.chars().take(24).collect::<String>().to_ascii_lowercase();
    head.starts_with("error")
        || head.starts_with("exception")
        || head.starts_with("traceback")
        || head.starts_with("an error occurred")
        || head.starts_with("tool error")
        || head.starts_with("timeout")
        || head.starts_with("timed out")
}

/// What replaying one tool result concluded, for the trace.
#[derive(Debug, Clone, PartialEq)]
pub struct Replayed {
    /// The tool's name.
    pub tool: String,
    /// `ok`, `hard` or `soft`.
    pub outcome: &'static str,
}

/// Feeds the tool results the run's monitor has not seen yet. A conversation with fewer tool
/// results than already seen is a new run under a reused id: the state is reset first.
pub fn replay(
    state: &mut RunState,
    messages: &[Value],
    tools: &ToolIndex,
    fresh: impl FnOnce() -> RunState,
    now_ms: u64,
) -> Vec<Replayed> {
    let total = messages
        .iter()
        .filter(|m| m.get("role").and_then(Value::as_str) == Some("tool"))
        .count();
    if total < state.tool_results_seen {
        *state = fresh();
    }
    let mut out = Vec::new();
    if total == state.tool_results_seen {
        return out;
    }
    let mut calls: HashMap<&str, (&str, Value)> = HashMap::new();
    let mut seen = 0usize;
    for m in messages {
        match m.get("role").and_then(Value::as_str) {
            Some("assistant") => {
                for c in m
                    .get("tool_calls")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                {
                    let (Some(id), Some(name)) = (
                        c.get("id").and_then(Value::as_str),
                        c.pointer("/function/name").and_then(Value::as_str),
                    ) else {
                        continue;
                    };
                    let raw = c
                        .pointer("/function/arguments")
                        .and_then(Value::as_str)
                        .unwrap_or("{}");
                    let args = serde_json::from_str(raw).unwrap_or_else(|_| json!(raw));
                    calls.insert(id, (name, args));
                }
            }
            Some("tool") => {
                seen += 1;
                if seen <= state.tool_results_seen {
                    continue;
                }
                let id = m.get("tool_call_id").and_then(Value::as_str).unwrap_or("");
                let (name, args) = calls
                    .get(id)
                    .map(|(n, a)| (*n, a.clone()))
                    .unwrap_or(("unknown", Value::Null));
                let required: &[String] = tools.get(name).map_or(&[], |t| &t.required);
                let text = content_text(m);
                let outcome = if is_hard_failure_text(&text) {
                    state.monitor.record(
                        &ToolCall::failed(name, &args, &text).with_required(required),
                        now_ms,
                    );
                    "hard"
                } else {
                    let value: Value = serde_json::from_str(&text).unwrap_or(Value::String(text));
                    let soft = Monitor::is_soft_failure(&value);
                    state.monitor.record(
                        &ToolCall::returned(name, &args, &value).with_required(required),
                        now_ms,
                    );
                    if soft { "soft" } else { "ok" }
                };
                if outcome == "ok" {
                    state.successes += 1;
                } else {
                    state.failures += 1;
                }
                out.push(Replayed {
                    tool: name.to_owned(),
                    outcome,
                });
            }
            _ => {}
        }
    }
    state.tool_results_seen = total;
    out
}

/// What applying a verdict changed in the request.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Applied {
    /// Guidance texts added.
    pub guidance: Vec<String>,
    /// Tools removed from `tools`.
    pub hidden: Vec<String>,
}

/// Edits the request body per the verdict: guidance as a system message after the leading system
/// messages, hidden tools removed, `tool_choice` fixed.
pub fn apply_verdict(body: &mut Value, verdict: &Verdict) -> Applied {
    let mut applied = Applied::default();
    if !verdict.hidden_tools.is_empty()
        && let Some(tools) = body.get_mut("tools").and_then(Value::as_array_mut)
    {
        tools.retain(|t| {
            let name = t.pointer("/function/name").and_then(Value::as_str);
            let hide = name.is_some_and(|n| verdict.hidden_tools.iter().any(|h| h == n));
            if hide && let Some(n) = name {
                applied.hidden.push(n.to_owned());
            }
            !hide
        });
        let now_empty = tools.is_empty();
        if let Some(obj) = body.as_object_mut() {
            if now_empty {
                obj.remove("tools");
                obj.remove("tool_choice");
                obj.remove("parallel_tool_calls");
            } else if let Some(named) = obj
                .get("tool_choice")
                .and_then(|c| c.pointer("/function/name"))
                .and_then(Value::as_str)
                && verdict.hidden_tools.iter().any(|h| h == named)
            {
                obj.insert("tool_choice".into(), json!("auto"));
            }
        }
    }
    if !verdict.guidance.is_empty() {
        let text = verdict
            .guidance
            .iter()
            .map(|g| g.text.as_str())
            .collect::<Vec<_>>()
            .join("\n");
        if let Some(messages) = body.get_mut("messages").and_then(Value::as_array_mut) {
            let at = messages
                .iter()
                .take_while(|m| {
                    matches!(
                        m.get("role").and_then(Value::as_str),
                        Some("system" | "developer")
                    )
                })
                .count();
            messages.insert(
                at,
                json!({"role": "system", "content": format!("[selfheal] {text}")}),
            );
        }
        applied.guidance = verdict.guidance.iter().map(|g| g.text.clone()).collect();
    }
    applied
}

/// What checking a response's tool calls found.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CallCheck {
    /// Calls whose arguments were repaired in place (tool names).
    pub repaired: Vec<String>,
    /// Re-ask texts for calls that could not be repaired (unknown tool, invalid arguments).
    pub invalid: Vec<String>,
}

/// Compiled schema guides by schema text. Agents send the same tools with every request, and
/// compiling a JSON Schema costs far more than the rest of a request's healing; the cache holds
/// at most [`GuideCache::CAPACITY`] schemas and starts over when full.
#[derive(Debug, Default)]
pub struct GuideCache {
    map: Mutex<HashMap<String, Arc<SchemaGuide>>>,
}

impl GuideCache {
    /// Most schemas held.
    pub const CAPACITY: usize = 1_024;

    /// The compiled guide of `schema` (`None` if it does not compile).
    pub fn get(&self, schema: &Value) -> Option<Arc<SchemaGuide>> {
        let key = schema.to_string();
        if let Some(g) = self.map.lock().ok()?.get(&key) {
            return Some(g.clone());
        }
        let guide = Arc::new(SchemaGuide::new(schema).ok()?);
        let mut map = self.map.lock().ok()?;
        if map.len() >= Self::CAPACITY {
            map.clear();
        }
        map.insert(key, guide.clone());
        Some(guide)
    }
}

/// Checks one tool call `{id, type, function: {name, arguments}}` and repairs its arguments in
/// place. Returns `Ok(true)` when repaired, `Err(reask text)` when it cannot be used.
pub fn check_call(
    call: &mut Value,
    tools: &ToolIndex,
    guides: &GuideCache,
) -> Result<bool, String> {
    let name = call
        .pointer("/function/name")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_owned();
    let Some(spec) = tools.get(&name) else {
        let mut names: Vec<&str> = tools.keys().map(String::as_str).collect();
        names.sort_unstable();
        return Err(format!(
            "The tool `{name}` does not exist. Call one of: {}.",
            names.join(", ")
        ));
    };
    let raw = call
        .pointer("/function/arguments")
        .and_then(Value::as_str)
        .unwrap_or("");
    let (value, mut changed) = match serde_json::from_str::<Value>(raw) {
        Ok(v) => (v, false),
        Err(_) if raw.trim().is_empty() => (json!({}), true),
        Err(_) => match repair(raw) {
            Ok(r) => (r.value, true),
            Err(e) => {
                return Err(format!(
                    "The arguments of your call to `{name}` are not JSON ({e}). Call it again with a JSON object."
                ));
            }
        },
    };
    let value = if spec.parameters.as_object().is_some_and(|o| !o.is_empty()) {
        match guides.get(&spec.parameters) {
            Some(guide) => {
                let outcome = guide.apply(value);
                if !outcome.violations.is_empty() {
                    return Err(reask_message(&outcome.violations, &name));
                }
                changed |= !outcome.coercions.is_empty();
                outcome.value
            }
            // A schema we cannot compile is the client's business: pass the value on.
            None => value,
        }
    } else {
        value
    };
    if changed && let Some(f) = call.get_mut("function") {
        f["arguments"] = Value::String(value.to_string());
    }
    Ok(changed)
}

/// Checks every tool call of an assistant message.
pub fn check_message(message: &mut Value, tools: &ToolIndex, guides: &GuideCache) -> CallCheck {
    let mut out = CallCheck::default();
    let Some(calls) = message.get_mut("tool_calls").and_then(Value::as_array_mut) else {
        return out;
    };
    for c in calls {
        let name = c
            .pointer("/function/name")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned();
        match check_call(c, tools, guides) {
            Ok(true) => out.repaired.push(name),
            Ok(false) => {}
            Err(reask) => out.invalid.push(reask),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use selfheal_core::budget::BudgetLimits;
    use selfheal_core::monitor::MonitorConfig;

    fn tools() -> Value {
        json!({"tools": [
            {"type": "function", "function": {"name": "search", "parameters": {
                "type": "object", "properties": {"q": {"type": "string"}, "n": {"type": "integer"}},
                "required": ["q"]}}},
            {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}
        ]})
    }

    fn failing_conversation(n: usize) -> Vec<Value> {
        let mut m = vec![json!({"role": "user", "content": "find it"})];
        for i in 0..n {
            m.push(json!({"role": "assistant", "content": null, "tool_calls": [
                {"id": format!("c{i}"), "type": "function",
                 "function": {"name": "search", "arguments": format!("{{\"q\": \"x{i}\"}}")}}]}));
            m.push(json!({"role": "tool", "tool_call_id": format!("c{i}"),
                          "content": "Error: service unavailable"}));
        }
        m
    }

    #[test]
    fn five_failures_hide_the_tool_and_fix_tool_choice() {
        let idx = tool_index(&tools());
        let fresh = || RunState::new(MonitorConfig::default(), BudgetLimits::defaults());
        let mut state = fresh();
        let msgs = failing_conversation(5);
        let replayed = replay(&mut state, &msgs, &idx, fresh, 0);
        assert_eq!(replayed.len(), 5);
        assert!(replayed.iter().all(|r| r.outcome == "hard"));
        // Replaying the same conversation again feeds nothing new.
        assert!(replay(&mut state, &msgs, &idx, fresh, 0).is_empty());
        let verdict = state.monitor.check(0);
        assert_eq!(verdict.hidden_tools, vec!["search".to_string()]);
        let mut body = tools();
        body["messages"] = json!(msgs);
        body["tool_choice"] = json!({"type": "function", "function": {"name": "search"}});
        let applied = apply_verdict(&mut body, &verdict);
        assert_eq!(applied.hidden, vec!["search".to_string()]);
        assert_eq!(body["tools"].as_array().unwrap().len(), 1);
        assert_eq!(body["tool_choice"], json!("auto"));
    }

    #[test]
    fn arguments_are_repaired_or_reasked() {
        let idx = tool_index(&tools());
        let mut call = json!({"id": "1", "type": "function",
            "function": {"name": "search", "arguments": "{'q': 'rust', n: \"3\",}"}});
        assert_eq!(
            check_call(&mut call, &idx, &GuideCache::default()),
            Ok(true)
        );
        let args: Value =
            serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
        assert_eq!(args, json!({"q": "rust", "n": 3}));
        let mut missing = json!({"function": {"name": "search", "arguments": "{}"}});
        assert!(check_call(&mut missing, &idx, &GuideCache::default()).is_err());
        let mut unknown = json!({"function": {"name": "nope", "arguments": "{}"}});
        assert!(
            check_call(&mut unknown, &idx, &GuideCache::default())
                .unwrap_err()
                .contains("does not exist")
        );
    }
}
