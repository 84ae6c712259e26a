//! Healing decisions for one request, rebuilt from the conversation it carries.
//!
//! The gateway sees no tool being called: it sees each tool's *result* arrive as a `tool`
//! message in the next request. So the run's tool history is replayed from the messages —
//! assistant `tool_calls` matched to `tool` results by id, each result classified hard or soft
//! (SPEC §1) — into the run's controller ([`crate::recover`]), and only the results it has not
//! seen yet. The monitor's verdict and the controller's directives then edit the request: guidance as a system message, circuit-broken tools
//! removed from `tools`, `tool_choice` fixed if it named one. On the way back, tool-call
//! arguments are checked against the request's own tool schemas and repaired in place.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use serde_json::{Value, json};

use selfheal_core::Verdict;
use selfheal_openai::At;
use selfheal_repair::{Ending, SchemaGuide, repair_arguments};

use crate::recover::Ctx;
use crate::request::{ChatRequest, Edits, Message};
use crate::runs::{RunState, SeenResults};

pub(crate) use crate::wire::{Problem, ToolIndex, ToolSpec, Unusable, take_calls, tool_index};
pub(crate) use crate::wire::{ensure_id, fresh_call_id, item_type};

/// Tool indexes by the text of the request's `tools` array. Agents send the same tools with
/// every request; indexing them (parsing every schema) each time would cost more than the rest
/// of the request's healing. Bounded by count ([`ToolIndexCache::CAPACITY`]) and by the bytes of
/// its keys ([`CACHE_MAX_BYTES`]; a tool set larger than [`CACHE_MAX_ENTRY_BYTES`] is indexed
/// but not kept), it starts over when full.
#[derive(Debug, Default)]
pub(crate) struct ToolIndexCache {
    map: Mutex<Sized<Arc<ToolIndex>>>,
}

/// Most key bytes a cache holds (tool-set or schema text; the values are of the same order).
pub(crate) const CACHE_MAX_BYTES: usize = 16 * 1024 * 1024;

/// Largest key a cache keeps.
pub(crate) const CACHE_MAX_ENTRY_BYTES: usize = 1024 * 1024;

/// A map that knows the bytes of its keys.
#[derive(Debug)]
struct Sized<V> {
    map: HashMap<String, V>,
    bytes: usize,
}

impl<V> Default for Sized<V> {
    fn default() -> Self {
        Sized {
            map: HashMap::new(),
            bytes: 0,
        }
    }
}

impl<V: Clone> Sized<V> {
    fn get(&self, key: &str) -> Option<V> {
        self.map.get(key).cloned()
    }

    /// Keeps `value` under `key` unless the key is too large; starts over when full.
    fn insert(&mut self, key: &str, value: V, capacity: usize) {
        if key.len() > CACHE_MAX_ENTRY_BYTES {
            return;
        }
        if self.map.len() >= capacity || self.bytes + key.len() > CACHE_MAX_BYTES {
            self.map.clear();
            self.bytes = 0;
        }
        if self.map.insert(key.to_owned(), value).is_none() {
            self.bytes += key.len();
        }
    }
}

impl ToolIndexCache {
    /// Most tool sets held.
    pub(crate) const CAPACITY: usize = 1_024;

    /// The index of the request's tools.
    pub(crate) fn get(&self, req: &ChatRequest<'_>) -> Arc<ToolIndex> {
        let Some(raw) = req.tools_raw else {
            return Arc::new(ToolIndex::new());
        };
        let key = raw.get();
        if let Some(i) = self.map.lock().unwrap_or_else(|p| p.into_inner()).get(key) {
            return i;
        }
        let index = Arc::new(tool_index(req));
        self.map.lock().unwrap_or_else(|p| p.into_inner()).insert(
            key,
            index.clone(),
            Self::CAPACITY,
        );
        index
    }

    /// Key bytes held now.
    #[cfg(test)]
    pub(crate) fn bytes(&self) -> usize {
        self.map.lock().map_or(0, |m| m.bytes)
    }
}

/// What replaying one tool result concluded, for the trace.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Replayed {
    /// The tool's name.
    pub tool: String,
    /// What the result was to the run ([`crate::recover::observe`]).
    pub outcome: crate::recover::Outcome,
}

/// Feeds the tool results the run's monitor has not seen yet, by `tool_call_id` (and content):
/// the results after the last one the run has seen (see [`crate::runs::SeenResults`]). A
/// history trimmed from the front feeds only its new results; nothing is reset. Only the
/// arguments of calls whose results are new are parsed.
pub(crate) fn replay(
    state: &mut RunState,
    messages: &[Message<'_>],
    ctx: &Ctx<'_>,
    now_ms: u64,
) -> Vec<Replayed> {
    offer(state, ctx);
    // From the newest result back to the last one the run has seen: only new results (and
    // that one) are read and hashed, however long the history.
    let mut results: Vec<(usize, std::borrow::Cow<'_, str>, u64)> = Vec::new();
    // Where the run's last seen result is: a user turn after it is a new turn of the task.
    let mut last_result = None;
    for (i, m) in messages.iter().enumerate().rev() {
        if m.role() != "tool" {
            continue;
        }
        let text = m.content_text();
        let id = m.tool_call_id.as_ref().map_or("", |i| i.as_str());
        let fp = SeenResults::fingerprint(id, &text);
        if state.seen.contains(fp) {
            last_result = Some(i);
            break;
        }
        results.push((i, text, fp));
    }
    results.reverse();
    let Some(&(first_new, _, _)) = results.first() else {
        // Nothing new to read; a user message after the last result read still begins a new
        // turn (the monitor's standing loop guidance goes).
        if let Some(l) = last_result
            && messages[l + 1..].iter().any(|m| m.role() == "user")
        {
            state.tell(selfheal_core::Input::UserTurn);
        }
        return Vec::new();
    };
    // The call each new result answers: the last assistant call with its id before it. A few
    // new results (every request of a running conversation) look back from themselves, which
    // is one message away when the history is well formed; many (a run seen for the first
    // time) read the history once.
    let mut out = Vec::with_capacity(results.len());
    let mut calls: Option<HashMap<String, (String, Option<String>)>> = None;
    if results.len() > LOOK_BACK_RESULTS {
        calls = Some(HashMap::new());
    }
    let mut new_results = results.iter().peekable();
    let (mut turn, mut fed_turn) = (0, None);
    // A user message after a tool result begins a new turn of the task: repeats across it
    // were asked for, not a loop. The opening user message does not (a history trimmed of
    // the results the run read must not wipe out the repeats it still shows).
    let (mut after_result, mut user_spoke) = (false, false);
    for (i, m) in messages.iter().enumerate() {
        match m.role() {
            "assistant" => turn = i,
            "tool" => {
                after_result = true;
                // A result read before: a user message before it was a turn already counted.
                if i < first_new {
                    user_spoke = false;
                }
            }
            "user" => {
                user_spoke |= after_result;
                continue;
            }
            _ => {}
        }
        if let Some(calls) = calls.as_mut()
            && m.role() == "assistant"
            && m.tool_calls.is_some()
        {
            for c in m.calls() {
                let (Some(id), Some(f)) = (c.id, c.function) else {
                    continue;
                };
                let Some(name) = f.name else { continue };
                calls.insert(
                    id.0.into_owned(),
                    (name.0.into_owned(), f.arguments.map(|a| a.0.into_owned())),
                );
            }
            continue;
        }
        if i < first_new {
            continue;
        }
        let Some((_, text, fp)) = new_results.next_if(|(j, _, _)| *j == i) else {
            continue;
        };
        if std::mem::take(&mut user_spoke) {
            state.tell(selfheal_core::Input::UserTurn);
        }
        // The values taken are those of the last turn the run reads (a run read for the first
        // time reads its whole history at once).
        if fed_turn.is_some_and(|t| t != turn) {
            state.wire.forget_taken();
        }
        fed_turn = Some(turn);
        let id = m.tool_call_id.as_ref().map_or("", |i| i.as_str());
        let call = match &calls {
            Some(calls) => calls.get(id).cloned(),
            None => answered_call(&messages[..i], id),
        };
        let (name, args) = match &call {
            Some((n, a)) => {
                let raw = a.as_deref().unwrap_or("{}");
                let args = serde_json::from_str(raw).unwrap_or_else(|_| json!(raw));
                (n.as_str(), args)
            }
            None => ("unknown", Value::Null),
        };
        out.push(feed(state, (id, name, &args), text, *fp, ctx, now_ms));
    }
    if user_spoke {
        state.tell(selfheal_core::Input::UserTurn);
    }
    out
}

/// New results at most that look back for their calls one by one (see [`replay`]).
const LOOK_BACK_RESULTS: usize = 8;

/// The name and arguments of the last assistant call with this id in `before`.
fn answered_call(before: &[Message<'_>], id: &str) -> Option<(String, Option<String>)> {
    before
        .iter()
        .rev()
        .filter(|m| m.role() == "assistant" && m.tool_calls.is_some())
        .find_map(|m| {
            m.calls().into_iter().rev().find_map(|c| {
                let f = c.function?;
                (c.id?.as_str() == id).then_some(())?;
                Some((
                    f.name?.0.into_owned(),
                    f.arguments.map(|a| a.0.into_owned()),
                ))
            })
        })
}

/// Records one new tool result: the run's controller observes it (see [`crate::recover`]), and
/// it is remembered as seen.
fn feed(
    state: &mut RunState,
    call: (&str, &str, &Value),
    text: &str,
    fp: u64,
    ctx: &Ctx<'_>,
    now_ms: u64,
) -> Replayed {
    let (_, name, _) = call;
    let outcome = crate::recover::observe(state, ctx, call, text, now_ms);
    state.seen.insert(fp);
    Replayed {
        tool: name.to_owned(),
        outcome,
    }
}

/// Tells the run which tools the request offers (sorted by name, so guidance
/// names them in a stable order): a tool that keeps failing is routed around while another is
/// on offer, as the core decides ([`selfheal_core::Input::Offered`]).
fn offer(state: &mut RunState, ctx: &Ctx<'_>) {
    let mut names: Vec<&str> = ctx.offered.keys().map(String::as_str).collect();
    names.sort_unstable();
    state.tell(selfheal_core::Input::Offered(&names));
}

/// [`replay`] for a Responses API `input`: its `function_call_output` items (by `call_id`),
/// each matched to the `function_call` item that asked for it. `only_new`: the input continues
/// a stored answer and holds only what came since.
pub(crate) fn replay_items(
    state: &mut RunState,
    items: &[Value],
    only_new: bool,
    ctx: &Ctx<'_>,
    now_ms: u64,
) -> Vec<Replayed> {
    offer(state, ctx);
    let text_of = |v: Option<&Value>| match v {
        Some(Value::String(s)) => s.clone(),
        Some(other) => other.to_string(),
        None => String::new(),
    };
    let mut results: Vec<(usize, String, String, u64)> = Vec::new();
    // Where the run's last seen result is (see `replay`).
    let mut last_result = None;
    for (i, item) in items.iter().enumerate().rev() {
        if item_type(item) != Some("function_call_output") {
            continue;
        }
        let id = item.get("call_id").and_then(Value::as_str).unwrap_or("");
        let text = text_of(item.get("output"));
        let fp = SeenResults::fingerprint(id, &text);
        if state.seen.contains(fp) {
            last_result = Some(i);
            break;
        }
        results.push((i, id.to_owned(), text, fp));
    }
    results.reverse();
    let mut out = Vec::new();
    let mut fed_turn = None;
    // A user message after a result begins a new turn of the task, as in [`replay`]. An input
    // that continues a stored answer (`only_new`: `previous_response_id`, a `conversation`)
    // holds only what came since the run's last answer, so any user message in it does.
    let mut after_result = only_new || last_result.is_some();
    let mut user_spoke = false;
    let mut new_results = results.iter().peekable();
    for (i, item) in items
        .iter()
        .enumerate()
        .skip(last_result.map_or(0, |l| l + 1))
    {
        if item.get("role").and_then(Value::as_str) == Some("user") {
            user_spoke |= after_result;
            continue;
        }
        let Some((_, id, text, fp)) = new_results.next_if(|r| r.0 == i) else {
            continue;
        };
        after_result = true;
        if std::mem::take(&mut user_spoke) {
            state.tell(selfheal_core::Input::UserTurn);
        }
        let id = id.as_str();
        let at = items.iter().position(|i| {
            item_type(i) == Some("function_call")
                && i.get("call_id").and_then(Value::as_str) == Some(id)
        });
        // The values taken are those of the last turn the run reads, as for a chat history
        // ([`replay`]): a turn is a run of `function_call` items, named by where it starts.
        if let Some(at) = at {
            let turn = items[..at]
                .iter()
                .rposition(|i| item_type(i) != Some("function_call"))
                .map_or(0, |p| p + 1);
            if fed_turn.is_some_and(|t| t != turn) {
                state.wire.forget_taken();
            }
            fed_turn = Some(turn);
        }
        let call = at.and_then(|at| items.get(at));
        let (name, args) = match call {
            Some(c) => {
                let raw = c.get("arguments").and_then(Value::as_str).unwrap_or("{}");
                (
                    c.get("name").and_then(Value::as_str).unwrap_or("unknown"),
                    serde_json::from_str(raw).unwrap_or_else(|_| json!(raw)),
                )
            }
            None => ("unknown", Value::Null),
        };
        out.push(feed(state, (id, name, &args), text, *fp, ctx, now_ms));
    }
    if user_spoke {
        state.tell(selfheal_core::Input::UserTurn);
    }
    out
}

/// What a verdict changes in the request.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Applied {
    /// Guidance texts to add.
    pub guidance: Vec<String>,
    /// The system message that carries them (`[selfheal] ...`), when there is guidance.
    pub system: Option<String>,
    /// Tools of the request to remove from `tools`.
    pub hidden: Vec<String>,
    /// Tool results to replace with their repair, by `tool_call_id`.
    pub replaced: Vec<(String, String)>,
}

impl Applied {
    /// The request edits that carry this out (plus `content: ""` normalisation).
    pub(crate) fn edits(&self) -> Edits<'_> {
        Edits {
            normalize: true,
            system: self.system.as_deref(),
            hidden: &self.hidden,
            replaced: &self.replaced,
            ..Edits::default()
        }
    }
}

/// Decides the request edits of a verdict and the controller's recovery guidance
/// (`recovery`, see [`crate::recover`]): guidance as a system message after the leading
/// system messages; the hidden tools the request offers removed, `tool_choice` fixed if it named
/// one (see [`ChatRequest::encode`]).
pub(crate) fn apply_verdict(
    req: &ChatRequest<'_>,
    verdict: &Verdict,
    recovery: &[String],
) -> Applied {
    let hidden = if verdict.hidden_tools.is_empty() {
        Vec::new()
    } else {
        req.tools()
            .iter()
            .filter_map(|t| t.name.as_ref())
            .filter(|n| verdict.hidden_tools.iter().any(|h| h == n.as_str()))
            .map(|n| n.as_str().to_owned())
            .collect()
    };
    let guidance: Vec<String> = verdict
        .guidance
        .iter()
        .map(|g| g.text.clone())
        .chain(recovery.iter().cloned())
        .collect();
    let system = (!guidance.is_empty()).then(|| format!("[selfheal] {}", guidance.join("\n")));
    Applied {
        guidance,
        system,
        hidden,
        replaced: Vec::new(),
    }
}

/// What checking a response's tool calls found.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct CallCheck {
    /// Calls whose arguments were repaired in place (tool names).
    pub repaired: Vec<String>,
    /// Calls the model wrote as text in its content, taken as tool calls ([`salvage_text_calls`]).
    pub salvaged: usize,
    /// The calls that could not be used (unknown tool, invalid arguments, ...).
    pub invalid: Vec<Problem>,
}

/// The re-ask texts of `problems`, in order.
pub(crate) fn problem_texts(problems: &[Problem]) -> Vec<String> {
    problems.iter().map(|p| p.text.clone()).collect()
}

/// The re-ask texts of `problems` as one text.
pub(crate) fn problems_text(problems: &[Problem]) -> String {
    problem_texts(problems).join(" ")
}

/// The words of an answer whose tool calls were left out (`problems`: why each could not be
/// used, naming its tool): what the client gets in place of an empty assistant message, so
/// that no SDK or framework reads the answer as `''` (issue 30).
pub(crate) fn left_out_text(problems: &[String]) -> String {
    format!(
        "[selfheal] The tool calls of this answer could not be used, even after asking the \
         model again, so they were left out and nothing was called. {} You can send the \
         request again, or give the model more to go on.",
        problems.join(" ")
    )
}

/// Puts `words` in an assistant message (chat) after whatever text it has: what an answer says
/// when the gateway left its calls out.
pub(crate) fn say(message: &mut Value, words: &str) {
    let Some(o) = message.as_object_mut() else {
        return;
    };
    let text = match o.get("content").and_then(Value::as_str) {
        Some(t) if !t.trim().is_empty() => format!("{t}\n\n{words}"),
        _ => words.to_owned(),
    };
    o.insert("content".into(), Value::String(text));
}

/// Compiled schema guides by schema text. Agents send the same tools with every request, and
/// compiling a JSON Schema costs far more than the rest of a request's healing; the cache holds
/// at most [`GuideCache::CAPACITY`] schemas and [`CACHE_MAX_BYTES`] of schema text, and starts
/// over when full.
#[derive(Debug, Default)]
pub struct GuideCache {
    map: Mutex<Sized<Arc<SchemaGuide>>>,
}

impl GuideCache {
    /// Most schemas held.
    pub const CAPACITY: usize = 1_024;

    /// The compiled guide of `schema`, whose text is `key` (`None` if it does not compile).
    pub fn get(&self, key: &str, schema: &Value) -> Option<Arc<SchemaGuide>> {
        if let Some(g) = self.map.lock().ok()?.get(key) {
            return Some(g);
        }
        let guide = Arc::new(SchemaGuide::new(schema).ok()?);
        self.map
            .lock()
            .ok()?
            .insert(key, guide.clone(), Self::CAPACITY);
        Some(guide)
    }
}

/// What [`salvage_text_calls`] did with an answer's content.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Salvage {
    /// Nothing: the answer has structured calls, no content, or content that writes no call.
    None,
    /// This many calls written as text were made structured calls.
    Taken(usize),
    /// The content looks like a call that cannot be taken without a guess: re-ask.
    Doubt(Problem),
}

/// Tool calls written as text (issue 31): when tools are on offer and the answer has no
/// structured call, a call of an offered tool written in its content — a fenced or bare JSON
/// `{"name", "arguments"}`, `<tool_call>` tags, `[TOOL_CALLS]`, `<|python_tag|>` — becomes a
/// structured call with a fresh id (through [`selfheal_repair::find_text_calls`], which takes
/// nothing the model did not write); the rest of the text stays as content. Such calls then
/// go through the same checks as any call. A call-shaped text that cannot be taken is a
/// problem to re-ask, never a final answer. The caller leaves `tools` empty when the client
/// asked for no tool call (`tool_choice: "none"`).
pub(crate) fn salvage_text_calls(message: &mut Value, tools: &ToolIndex) -> Salvage {
    if message
        .get("tool_calls")
        .and_then(Value::as_array)
        .is_some_and(|c| !c.is_empty())
    {
        return Salvage::None;
    }
    let Some(content) = message.get("content").and_then(Value::as_str) else {
        return Salvage::None;
    };
    let (calls, rest) = match text_calls(content, tools) {
        Ok(Some(found)) => found,
        Ok(None) => return Salvage::None,
        Err(problem) => return Salvage::Doubt(problem),
    };
    let n = calls.len();
    let calls: Vec<Value> = calls
        .into_iter()
        .map(|c| {
            let mut call = json!({
                "type": "function",
                "function": {"name": c.name, "arguments": c.arguments},
            });
            ensure_id(&mut call, "id");
            call
        })
        .collect();
    if let Some(m) = message.as_object_mut() {
        let content = if rest.is_empty() {
            Value::Null
        } else {
            Value::String(rest)
        };
        m.insert("content".into(), content);
        m.insert("tool_calls".into(), Value::Array(calls));
    }
    Salvage::Taken(n)
}

/// [`salvage_text_calls`] for a Responses answer (`{"output": [...]}`): when it has no
/// `function_call` item, the text of its `message` items is read for calls of offered tools;
/// each becomes a `function_call` item with a fresh `call_id`, after one message that keeps
/// the rest of the text (none when nothing is left). The same reading, the same refusals.
pub(crate) fn salvage_output_calls(response: &mut Value, tools: &ToolIndex) -> Salvage {
    let Some(output) = response.get_mut("output").and_then(Value::as_array_mut) else {
        return Salvage::None;
    };
    if output.iter().any(|i| item_type(i) == Some("function_call")) {
        return Salvage::None;
    }
    let is_message = |i: &Value| item_type(i) == Some("message");
    let text: String = output
        .iter()
        .filter(|i| is_message(i))
        .filter_map(|i| i.get("content").and_then(Value::as_array))
        .flatten()
        .filter(|p| item_type(p) == Some("output_text"))
        .filter_map(|p| p.get("text").and_then(Value::as_str))
        .collect();
    let (calls, rest) = match text_calls(&text, tools) {
        Ok(Some(found)) => found,
        Ok(None) => return Salvage::None,
        Err(problem) => return Salvage::Doubt(problem),
    };
    let n = calls.len();
    // The first message keeps the rest of the text; the others go.
    let mut kept = false;
    output.retain_mut(|item| {
        if !is_message(item) {
            return true;
        }
        if kept || rest.is_empty() {
            return false;
        }
        kept = true;
        item["content"] = json!([{"type": "output_text", "text": rest, "annotations": []}]);
        true
    });
    for c in calls {
        let call_id = fresh_call_id();
        output.push(json!({
            "type": "function_call",
            "id": format!("fc_{}", call_id.trim_start_matches("call_")),
            "call_id": call_id,
            "name": c.name,
            "arguments": c.arguments,
            "status": "completed",
        }));
    }
    Salvage::Taken(n)
}

/// The calls of offered `tools` written as text in `content` and the rest of the text
/// (`Ok(None)`: none written, or no tool on offer), or the problem to re-ask when the text
/// looks like a call that cannot be taken without a guess.
fn text_calls(
    content: &str,
    tools: &ToolIndex,
) -> Result<Option<(Vec<selfheal_repair::TextCall>, String)>, Problem> {
    if tools.is_empty() {
        return Ok(None);
    }
    let mut names: Vec<&str> = tools.keys().map(String::as_str).collect();
    names.sort_unstable();
    match selfheal_repair::find_text_calls(content, &names) {
        selfheal_repair::TextCalls::None => Ok(None),
        selfheal_repair::TextCalls::Doubt { reason } => Err(Problem {
            kind: Unusable::Arguments,
            text: format!(
                "Your answer wrote a tool call as text, which was not run: {reason}. Call one of \
                 the tools on offer ({}) with a structured tool call, or answer in words.",
                names.join(", ")
            ),
        }),
        selfheal_repair::TextCalls::Found { calls, rest } => Ok(Some((calls, rest))),
    }
}

/// Checks one tool call `{id, type, function: {name, arguments}}` and repairs its arguments in
/// place, through [`selfheal_repair::repair_arguments`] — the one non-corrupting path the MCP
/// proxy and the runtime use too: valid arguments are left byte for byte, a cut-off call is
/// refused, no default is written. `ending` is how the choice ended (its `finish_reason`):
/// after `length`, arguments that are not JSON as written are refused, never repaired into a
/// call. Returns `Ok(true)` when repaired, `Err(problem)` when it cannot be used.
pub(crate) fn check_call(
    call: &mut Value,
    tools: &ToolIndex,
    guides: &GuideCache,
    ending: Ending,
) -> Result<bool, Problem> {
    let name = call
        .at("/function/name")
        .and_then(Value::as_str)
        .unwrap_or("");
    let raw = call
        .at("/function/arguments")
        .and_then(Value::as_str)
        .unwrap_or("");
    let Some(repaired) = check_arguments(name, raw, tools, guides, ending)? else {
        return Ok(false);
    };
    if let Some(f) = call.get_mut("function") {
        f["arguments"] = Value::String(repaired);
    }
    Ok(true)
}

/// The check of [`check_call`] on a call's tool `name` and arguments text `raw`, without the
/// call: `Ok(None)` when the arguments are valid as written, `Ok(Some(text))` when they were
/// repaired into `text`, `Err(problem)` when the call cannot be used.
pub(crate) fn check_arguments(
    name: &str,
    raw: &str,
    tools: &ToolIndex,
    guides: &GuideCache,
    ending: Ending,
) -> Result<Option<String>, Problem> {
    let Some(spec) = tools.get(name) else {
        let mut names: Vec<&str> = tools.keys().map(String::as_str).collect();
        names.sort_unstable();
        return Err(Problem {
            kind: Unusable::UnknownTool(name.to_owned()),
            text: format!(
                "The tool `{name}` does not exist. Call one of: {}.",
                names.join(", ")
            ),
        });
    };
    let guide = if spec.parameters.as_object().is_some_and(|o| !o.is_empty()) {
        // A schema we cannot compile is the client's business: the value is passed on.
        guides.get(&spec.schema_key, &spec.parameters)
    } else {
        None
    };
    let repaired = repair_arguments(raw, guide.as_deref(), ending);
    // A required argument written empty (`""`, `null`) is an input the model does not have: a
    // step of its plan is missing. Said before any schema complaint (an empty string where a
    // number goes would otherwise read as a mistyped argument), so the call is classified the
    // same whatever the argument's type, and the same as the tool's refusal of it would be.
    // Read from what the model wrote: the repair's value when it changed nothing (the common
    // case, one parse), else the text read again.
    let empty_of = |args: &serde_json::Map<String, Value>| -> Vec<&str> {
        spec.required
            .iter()
            .filter(|r| match args.get(r.as_str()) {
                // Left out is the schema's complaint (a missing field); written empty is this.
                None => false,
                Some(Value::Null) => true,
                Some(Value::String(x)) => x.trim().is_empty(),
                Some(_) => false,
            })
            .map(String::as_str)
            .collect()
    };
    let empty = match &repaired {
        Ok(a) if !a.changed => a.value.as_object().map(empty_of).unwrap_or_default(),
        _ => match serde_json::from_str::<Value>(raw) {
            Ok(Value::Object(args)) => empty_of(&args),
            _ => Vec::new(),
        },
    };
    if !empty.is_empty() {
        return Err(Problem {
            kind: Unusable::EmptyInput,
            text: format!(
                "Required arguments of `{name}` left empty: {}. Work out the step that \
                 gives {} first.",
                empty.join(", "),
                if empty.len() == 1 { "it" } else { "them" }
            ),
        });
    }
    let args = match repaired {
        Ok(a) => a,
        Err(e) => return Err(Problem::arguments(e.reask_message(raw, name))),
    };
    if !args.changed {
        return Ok(None);
    }
    // Numbers go out as the model wrote them; one the schema changed past what a double
    // holds is refused, not sent with digits the model never wrote.
    args.to_json().map(Some).map_err(|e| {
        Problem::arguments(format!(
            "Your call to `{name}` was not run: {e} once its arguments were corrected. \
                 Call `{name}` again with every argument of the type its schema asks."
        ))
    })
}

/// The signal of a model answer whose tool calls could not be used, from why each could not
/// ([`check_arguments`]'s finding): a tool not on offer is the model's wrong tool choice, a
/// required argument left empty a missing step (the reading the gateway gives the tool's
/// refusal of such a call, and the in-process client the call before it makes it), anything
/// else invalid arguments — or, with none of those, a repeated call is the model's repetition.
/// The first of these that any problem shows, in that order.
pub(crate) fn unusable_signal(problems: &[Problem]) -> selfheal_core::Signal {
    use selfheal_core::Signal;
    if let Some(name) = problems.iter().find_map(|p| match &p.kind {
        Unusable::UnknownTool(name) => Some(name.clone()),
        Unusable::EmptyInput
        | Unusable::Arguments
        | Unusable::Repetition
        | Unusable::Degenerate(_) => None,
    }) {
        return Signal::UnknownTool { name };
    }
    if let Some(d) = problems.iter().find_map(|p| match &p.kind {
        Unusable::Degenerate(d) => Some(d),
        _ => None,
    }) {
        // The core's reading of degenerate output.
        return selfheal_core::degenerate::signal(d);
    }
    if let Some(p) = problems.iter().find(|p| p.kind == Unusable::EmptyInput) {
        return Signal::MissingStep {
            detail: p.text.clone(),
        };
    }
    if problems.iter().any(|p| p.kind == Unusable::Repetition) {
        return Signal::Repetition;
    }
    Signal::InvalidArguments {
        errors: problem_texts(problems),
    }
}

/// The calls of the model's previous step whose results it has: when nothing but `tool` results
/// follows the request's last assistant message (the model is going on with the same task), the
/// calls whose values the run's controller took as it read the results of that last turn
/// ([`crate::recover::Next::taken`]: the turn's own calls, or the call a cross-check in it
/// confirmed; a call whose result failed, or waits for its check, may be made again as it was),
/// less those of the tools the controller asks this request to call again with the same
/// arguments (a retry, a cross-check, a read before answering: [`crate::recover::Next::again`]).
/// A new call identical to one of these, in name and arguments, repeats it: its result is
/// already in the conversation (the in-process client's repetition, the previous step's call
/// again).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Answered {
    /// `(tool, canonical hash of the arguments)`.
    calls: Vec<(String, u64)>,
}

impl Answered {
    /// The calls of `taken` (`(tool, canonical hash of the arguments)`), less those of the tools
    /// in `again`, when `messages` end in a turn of tool calls and their results.
    pub(crate) fn of(
        messages: &[Message<'_>],
        taken: &[(String, u64)],
        again: &[String],
    ) -> Answered {
        if taken.is_empty() {
            return Answered::default();
        }
        let mut turn = None;
        for m in messages.iter().rev() {
            match m.role() {
                "tool" => {}
                "assistant" if m.tool_calls.is_some() => {
                    turn = Some(m);
                    break;
                }
                _ => break,
            }
        }
        Answered::after(turn.is_some(), taken, again)
    }

    /// [`Answered::of`] for a Responses API `input`: its `items` end in a turn when nothing but
    /// `function_call_output` items follows its last `function_call` item (the model's calls
    /// and their results, nothing asked since).
    pub(crate) fn of_items(items: &[Value], taken: &[(String, u64)], again: &[String]) -> Answered {
        let turn = items
            .iter()
            .rev()
            .map(item_type)
            .find(|t| *t != Some("function_call_output"))
            .is_some_and(|t| t == Some("function_call"));
        Answered::after(turn, taken, again)
    }

    /// The calls of `taken` less those of the tools in `again` when the request ends in a turn
    /// of calls and their results (`turn`); none otherwise.
    fn after(turn: bool, taken: &[(String, u64)], again: &[String]) -> Answered {
        if !turn {
            return Answered::default();
        }
        let calls = taken
            .iter()
            .filter(|(t, _)| !again.iter().any(|a| a == t))
            .cloned()
            .collect();
        Answered { calls }
    }

    /// Whether no call is answered (nothing can repeat one).
    pub(crate) fn is_empty(&self) -> bool {
        self.calls.is_empty()
    }

    /// Whether a call of `name` with arguments text `raw` repeats an answered call.
    pub(crate) fn repeats(&self, name: &str, raw: &str) -> bool {
        !self.calls.is_empty()
            && args_hash(raw).is_some_and(|h| self.calls.iter().any(|(n, c)| n == name && *c == h))
    }

    /// Takes the calls that repeat an answered call out of `calls` — chat tool calls
    /// (`{"function": {"name", "arguments"}}`) or Responses `function_call` items
    /// (`{"type": "function_call", "name", "arguments"}`; items of other types stay); returns
    /// the problem of each.
    pub(crate) fn take_repeated(&self, calls: &mut Vec<Value>) -> Vec<Problem> {
        let mut problems = Vec::new();
        if self.calls.is_empty() {
            return problems;
        }
        calls.retain(|c| {
            let field = |f: &str| {
                if item_type(c) == Some("function_call") {
                    c.get(f)
                } else {
                    c.get("function").and_then(|x| x.get(f))
                }
            };
            let Some(name) = field("name").and_then(Value::as_str) else {
                return true;
            };
            let raw = field("arguments").and_then(Value::as_str).unwrap_or("");
            if !self.repeats(name, raw) {
                return true;
            }
            problems.push(Problem {
                kind: Unusable::Repetition,
                text: format!(
                    "You already called `{name}` with these exact arguments and its result is \
                     in the conversation: use that result. Answer the user if it is enough, or \
                     make a different call your task still needs."
                ),
            });
            false
        });
        problems
    }

    /// [`Answered::take_repeated`] on an assistant `message` (its `tool_calls` removed when
    /// none is left, as [`check_message`] does).
    pub(crate) fn check(&self, message: &mut Value) -> Vec<Problem> {
        take_calls(message, |calls| self.take_repeated(calls))
    }
}

/// The canonical hash of arguments text that is JSON (`None` when it is not).
fn args_hash(raw: &str) -> Option<u64> {
    serde_json::from_str::<Value>(raw)
        .ok()
        .map(|v| selfheal_core::canonical_hash(&v))
}

/// Checks every tool call of an assistant message.
pub(crate) fn check_message(
    message: &mut Value,
    tools: &ToolIndex,
    guides: &GuideCache,
    ending: Ending,
) -> CallCheck {
    let mut out = CallCheck::default();
    let Some(calls) = message.get_mut("tool_calls").and_then(Value::as_array_mut) else {
        return out;
    };
    // A call that cannot be used is never forwarded: it is taken out of the message (the
    // caller re-asks, or answers `partial` with the reasons).
    calls.retain_mut(|c| {
        ensure_id(c, "id");
        let name = c
            .at("/function/name")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned();
        match check_call(c, tools, guides, ending) {
            Ok(true) => {
                out.repaired.push(name);
                true
            }
            Ok(false) => true,
            Err(reask) => {
                out.invalid.push(reask);
                false
            }
        }
    });
    if calls.is_empty()
        && let Some(m) = message.as_object_mut()
    {
        m.remove("tool_calls");
        if m.get("content").is_none_or(Value::is_null) {
            m.insert("content".into(), Value::String(String::new()));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{HARD_PHRASES, HARD_PREFIXES, is_hard_failure_text};

    /// The allocating form `is_hard_failure_text` replaced: lowercase a `String`, search it.
    fn hard_failure_reference(text: &str) -> bool {
        let t = text.trim();
        let first_line = t.lines().next().unwrap_or("");
        let head = first_line
            .chars()
            .take(200)
            .collect::<String>()
            .to_ascii_lowercase();
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
        let prompt = "fix the errors and try again.";
        if t.to_ascii_lowercase().ends_with(prompt) {
            return true;
        }
        first_line.len() <= 200 && HARD_PHRASES.iter().any(|p| head.contains(p))
    }

    use proptest::strategy::Strategy as _;

    proptest::proptest! {
        /// The stack-buffer form decides every text as the allocating one did: pieces of the
        /// phrases and prefixes in any case, around multi-byte characters, long first lines.
        #[test]
        fn hard_failure_text_matches_its_reference(
            parts in proptest::collection::vec(proptest::prop_oneof![
                proptest::sample::select(vec![
                    "Error", "EXCEPTION", "Traceback (most recent call last)", "ValueError:",
                    "Connection REFUSED", "timed out", "Bad Gateway", "fatal:", "an error occurred",
                    "Fix the errors and try again.", ":", " ", "\n", "é", "日本", "\u{2003}",
                    "{\"results\": [1]}", "x", "Tool Error",
                ]).prop_map(str::to_owned),
                "[a-zA-Z :é]{0,80}",
            ], 0..12)
        ) {
            let text: String = parts.concat();
            proptest::prop_assert_eq!(
                is_hard_failure_text(&text),
                hard_failure_reference(&text),
                "{:?}", text
            );
        }
    }
    use selfheal_core::{BudgetLimits, MonitorConfig};

    fn tools() -> Value {
        json!({"tools": [
            {"type": "function", "function": {"name": "search", "parameters": {
                "type": "object", "properties": {"q": {"type": "string"}, "n": {"type": "integer"}},
                "required": ["q"]}}},
            {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}
        ]})
    }

    /// A request body offering [`tools`] with these messages.
    fn request(messages: Value) -> bytes::Bytes {
        let mut body = tools();
        body["model"] = json!("m");
        body["messages"] = messages;
        bytes::Bytes::from(serde_json::to_vec(&body).unwrap())
    }

    const NO_TOOLS: &std::collections::BTreeMap<String, crate::config::ToolConfig> =
        &std::collections::BTreeMap::new();

    fn ctx(idx: &ToolIndex) -> Ctx<'_> {
        Ctx {
            tools: NO_TOOLS,
            offered: idx,
            fallback: None,
            seed: 0,
            wall_ms: 0,
            max_wait_ms: crate::config::DEFAULT_MAX_WAIT_MS,
        }
    }

    /// A run whose ladders retry a failing tool five times (the monitor's breaker is what the
    /// tests below look at, not the default ladder's end).
    fn patient_run() -> RunState {
        let policy = selfheal_core::Policy::from_toml_str(
            "[ladders]\ntool_timeout = [\"retry\", \"retry\", \"retry\", \"retry\", \"retry\", \"retry\", \"degrade\"]\n\
             tool_unavailable = [\"retry\", \"retry\", \"retry\", \"retry\", \"retry\", \"retry\", \"degrade\"]\n",
        )
        .unwrap_or_default();
        RunState::with_policy(MonitorConfig::default(), BudgetLimits::unlimited(), policy)
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
        let mut body: Value =
            serde_json::from_slice(&request(json!(failing_conversation(5)))).unwrap();
        body["tool_choice"] = json!({"type": "function", "function": {"name": "search"}});
        let bytes = bytes::Bytes::from(serde_json::to_vec(&body).unwrap());
        let req = ChatRequest::parse(&bytes).unwrap();
        let idx = tool_index(&req);
        let mut state = patient_run();
        let replayed = replay(&mut state, &req.messages, &ctx(&idx), 0);
        assert_eq!(replayed.len(), 5);
        assert!(
            replayed
                .iter()
                .all(|r| r.outcome == crate::recover::Outcome::Hard)
        );
        // Replaying the same conversation again feeds nothing new.
        assert!(replay(&mut state, &req.messages, &ctx(&idx), 0).is_empty());
        let verdict = state.run.verdict(0);
        assert_eq!(verdict.hidden_tools, vec!["search".to_string()]);
        let applied = apply_verdict(&req, &verdict, &[]);
        assert_eq!(applied.hidden, vec!["search".to_string()]);
        let out: Value = serde_json::from_slice(&req.encode(&applied.edits(), &bytes)).unwrap();
        assert_eq!(out["tools"].as_array().unwrap().len(), 1);
        assert_eq!(out["tool_choice"], json!("auto"));
    }

    /// Each new result is credited to the last call with its id before it, whether the results
    /// look back one by one (a few new ones) or the history is indexed once (many): ids that a
    /// client reuses, calls without a name and results nobody asked for included.
    #[test]
    fn a_result_answers_the_last_call_with_its_id_before_it() {
        let idx = tool_index(
            &ChatRequest::parse(&request(json!([{"role": "user", "content": "x"}]))).unwrap(),
        );
        for pairs in [1usize, 2, LOOK_BACK_RESULTS + 2] {
            let mut m = vec![json!({"role": "user", "content": "go"})];
            let mut expected = Vec::new();
            for i in 0..pairs {
                let name = ["search", "lookup"][i % 2];
                m.push(json!({"role": "assistant", "content": null, "tool_calls": [
                    {"id": "dup", "type": "function", "function": {"name": name, "arguments": "{}"}},
                    {"id": "dup", "type": "function", "function": {"arguments": "{}"}}]}));
                m.push(json!({"role": "tool", "tool_call_id": "dup", "content": format!("r{i}")}));
                expected.push(name);
            }
            m.push(json!({"role": "tool", "tool_call_id": "nobody", "content": "late"}));
            expected.push("unknown");
            let bytes = request(json!(m));
            let req = ChatRequest::parse(&bytes).unwrap();
            let mut state = RunState::new(MonitorConfig::default(), BudgetLimits::defaults());
            let tools: Vec<String> = replay(&mut state, &req.messages, &ctx(&idx), 0)
                .into_iter()
                .map(|r| r.tool)
                .collect();
            assert_eq!(tools, expected, "{pairs} pairs");
        }
    }

    /// A conversation trimmed from the front, with one new result: only that result is fed,
    /// and the run keeps what it had (issue 13: counting results reset or skipped them).
    #[test]
    fn issue_13_a_trimmed_history_neither_resets_nor_skips() {
        let idx = tool_index(
            &ChatRequest::parse(&request(json!([{"role": "user", "content": "x"}]))).unwrap(),
        );
        let mut state = patient_run();
        let full = failing_conversation(4);
        let bytes = request(json!(full));
        let req = ChatRequest::parse(&bytes).unwrap();
        assert_eq!(replay(&mut state, &req.messages, &ctx(&idx), 0).len(), 4);
        // The agent keeps the user turn and the last two exchanges, then adds a fifth.
        let mut trimmed = vec![full[0].clone()];
        trimmed.extend_from_slice(&full[5..]);
        let five = failing_conversation(5);
        trimmed.extend_from_slice(&five[9..]);
        assert_eq!(trimmed.len(), 7);
        let bytes = request(json!(trimmed));
        let req = ChatRequest::parse(&bytes).unwrap();
        let fed = replay(&mut state, &req.messages, &ctx(&idx), 0);
        assert_eq!(fed.len(), 1, "only the new result is fed: {fed:?}");
        assert_eq!(state.failures, 5, "nothing was reset");
        assert_eq!(
            state.run.verdict(0).hidden_tools,
            vec!["search".to_string()]
        );
    }

    /// A run longer than the seen-set: the oldest results are forgotten, yet a request that
    /// still carries them feeds only its new result.
    #[test]
    fn a_run_longer_than_the_seen_set_feeds_only_new_results() {
        let n = crate::runs::SEEN_CAPACITY + 20;
        let mut messages = vec![json!({"role": "user", "content": "go"})];
        for i in 0..n {
            messages.push(json!({"role": "assistant", "content": null, "tool_calls": [
                {"id": format!("c{i}"), "type": "function",
                 "function": {"name": "lookup", "arguments": "{}"}}]}));
            messages.push(json!({"role": "tool", "tool_call_id": format!("c{i}"),
                                 "content": format!("ok {i}")}));
        }
        let bytes = request(json!(messages));
        let req = ChatRequest::parse(&bytes).unwrap();
        let idx = tool_index(&req);
        let mut state = RunState::new(MonitorConfig::default(), BudgetLimits::defaults());
        assert_eq!(replay(&mut state, &req.messages, &ctx(&idx), 0).len(), n);
        assert_eq!(state.seen.forgotten(), 20);
        messages.push(json!({"role": "assistant", "content": null, "tool_calls": [
            {"id": "last", "type": "function", "function": {"name": "lookup", "arguments": "{}"}}]}));
        messages.push(json!({"role": "tool", "tool_call_id": "last", "content": "ok last"}));
        let bytes = request(json!(messages));
        let req = ChatRequest::parse(&bytes).unwrap();
        assert_eq!(replay(&mut state, &req.messages, &ctx(&idx), 0).len(), 1);
        assert_eq!(state.successes as usize, n + 1);
    }

    #[test]
    fn the_tool_index_is_cached_by_the_tools_text() {
        let bytes = request(json!([{"role": "user", "content": "hi"}]));
        let req = ChatRequest::parse(&bytes).unwrap();
        let cache = ToolIndexCache::default();
        let a = cache.get(&req);
        assert_eq!(a["search"].required, vec!["q".to_string()]);
        assert!(Arc::ptr_eq(&a, &cache.get(&req)));
        let mut fewer: Value = serde_json::from_slice(&bytes).unwrap();
        fewer["tools"].as_array_mut().unwrap().pop();
        let bytes2 = bytes::Bytes::from(serde_json::to_vec(&fewer).unwrap());
        let other = cache.get(&ChatRequest::parse(&bytes2).unwrap());
        assert_eq!(other.len(), 1);
        assert_eq!(cache.bytes(), a_len(&bytes) + a_len(&bytes2));
    }

    fn a_len(body: &[u8]) -> usize {
        ChatRequest::parse(body)
            .unwrap()
            .tools_raw
            .unwrap()
            .get()
            .len()
    }

    /// Issue 13: the caches were bounded by count only, keyed by up to 8 MiB of text each.
    #[test]
    fn issue_13_caches_are_bounded_by_bytes() {
        let mut m: Sized<u8> = Sized::default();
        let big = "x".repeat(CACHE_MAX_ENTRY_BYTES + 1);
        m.insert(&big, 1, 10);
        assert!(m.map.is_empty(), "an oversize key is not kept");
        let key = |i: usize| format!("{}{i:08}", "y".repeat(CACHE_MAX_ENTRY_BYTES - 8));
        for i in 0..40 {
            m.insert(&key(i), 1, 1_000);
            assert!(m.bytes <= CACHE_MAX_BYTES);
        }
        assert!(m.map.len() <= CACHE_MAX_BYTES / CACHE_MAX_ENTRY_BYTES);
    }

    #[test]
    fn hard_failures_are_read_from_the_shapes_frameworks_use() {
        for hard in [
            "Error: service unavailable",
            "An error occurred while running the tool. Please try again. Error: boom",
            "ValueError: city must not be empty",
            "requests.exceptions.ConnectionError: HTTPSConnectionPool(host='x')",
            "Traceback (most recent call last):\n  File \"t.py\", line 1",
            "  timed out after 30 s",
            "HTTP 503 Service Unavailable",
            "upstream said: 429 Too Many Requests",
            "connect ECONNREFUSED 127.0.0.1:80",
            "city is required\n\nFix the errors and try again.",
        ] {
            assert!(is_hard_failure_text(hard), "{hard:?} is a hard failure");
        }
        for result in [
            "{\"results\": [{\"city\": \"Paris\"}]}",
            "Paris is the capital of France.",
            "Rust error handling: a guide (search result)\nmore text",
            "Note: the error rate fell by 3 %",
            "",
            &format!(
                "A long article that mentions an internal server error in passing {}",
                "x".repeat(300)
            ),
        ] {
            assert!(!is_hard_failure_text(result), "{result:?} is a result");
        }
    }

    #[test]
    fn arguments_are_repaired_or_reasked() {
        let bytes = request(json!([{"role": "user", "content": "hi"}]));
        let idx = tool_index(&ChatRequest::parse(&bytes).unwrap());
        let mut call = json!({"id": "1", "type": "function",
            "function": {"name": "search", "arguments": "{'q': 'rust', n: \"3\",}"}});
        assert_eq!(
            check_call(&mut call, &idx, &GuideCache::default(), Ending::Unknown),
            Ok(true)
        );
        let args: Value =
            serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
        assert_eq!(args, json!({"q": "rust", "n": 3}));
        let mut missing = json!({"function": {"name": "search", "arguments": "{}"}});
        assert!(check_call(&mut missing, &idx, &GuideCache::default(), Ending::Unknown).is_err());
        let mut unknown = json!({"function": {"name": "nope", "arguments": "{}"}});
        assert!(
            check_call(&mut unknown, &idx, &GuideCache::default(), Ending::Unknown)
                .unwrap_err()
                .text
                .contains("does not exist")
        );
    }

    /// Issue 11: a call is re-asked with the signal its problem is — a tool not on offer, a
    /// required argument written empty (whatever its type: an empty string where a number goes
    /// is not a mistyped number), or arguments the schema refuses — so the core climbs the
    /// ladder of the class an in-process client gives the same call.
    #[test]
    fn unusable_calls_carry_their_signal() {
        use selfheal_core::Signal;
        let bytes = request(json!([{"role": "user", "content": "hi"}]));
        let idx = tool_index(&ChatRequest::parse(&bytes).unwrap());
        let g = GuideCache::default();
        let check = |name: &str, args: &str| {
            let mut call = json!({"function": {"name": name, "arguments": args}});
            check_call(&mut call, &idx, &g, Ending::Unknown).unwrap_err()
        };
        let unknown = check("nope", "{}");
        assert_eq!(
            unusable_signal(std::slice::from_ref(&unknown)),
            Signal::UnknownTool {
                name: "nope".into()
            }
        );
        for empty in [r#"{"q": ""}"#, r#"{"q": "  ", "n": 2}"#, r#"{"q": null}"#] {
            let e = check("search", empty);
            assert_eq!(e.kind, Unusable::EmptyInput, "{e:?}");
            assert!(
                e.text.starts_with("Required arguments of `search`"),
                "{e:?}"
            );
            assert!(matches!(unusable_signal(&[e]), Signal::MissingStep { .. }));
        }
        // An empty string for an integer is a missing input too, not a type error.
        let mut body = tools();
        body["tools"][0]["function"]["parameters"]["required"] = json!(["q", "n"]);
        body["model"] = json!("m");
        body["messages"] = json!([{"role": "user", "content": "hi"}]);
        let bytes = bytes::Bytes::from(body.to_string());
        let both = tool_index(&ChatRequest::parse(&bytes).unwrap());
        let mut call =
            json!({"function": {"name": "search", "arguments": r#"{"q": "a", "n": ""}"#}});
        let e = check_call(&mut call, &both, &g, Ending::Unknown).unwrap_err();
        assert!(
            e.kind == Unusable::EmptyInput && e.text.contains(": n."),
            "{e:?}"
        );
        // Left out, or of the wrong type: the schema's complaint, invalid arguments.
        for bad in ["{}", r#"{"q": "a", "n": "lots"}"#] {
            let e = check("search", bad);
            assert_eq!(e.kind, Unusable::Arguments, "{e:?}");
            assert!(matches!(
                unusable_signal(&[e]),
                Signal::InvalidArguments { .. }
            ));
        }
        // A wrong tool comes first, then a missing input.
        assert!(matches!(
            unusable_signal(&[check("search", r#"{"q": ""}"#), unknown]),
            Signal::UnknownTool { .. }
        ));
    }

    /// Issue 11: the calls a new call can repeat are those of the model's last turn whose values
    /// the run took, less the tools the controller asks to be called again; a repetition is
    /// re-asked with the core's repetition signal.
    #[test]
    fn a_repetition_is_of_a_taken_call_of_the_last_turn() {
        use selfheal_core::Signal;
        let turn = |after: Vec<Value>| {
            let mut m = vec![
                json!({"role": "user", "content": "find x"}),
                json!({"role": "assistant", "content": null, "tool_calls": [{"id": "c1",
                    "type": "function", "function": {"name": "search",
                    "arguments": "{\"q\": \"x\", \"n\": 2}"}}]}),
                json!({"role": "tool", "tool_call_id": "c1", "content": "{\"hits\": 3}"}),
            ];
            m.extend(after);
            request(json!(m))
        };
        let taken = vec![(
            "search".to_owned(),
            selfheal_core::canonical_hash(&json!({"q": "x", "n": 2})),
        )];
        let bytes = turn(Vec::new());
        let req = ChatRequest::parse(&bytes).unwrap();
        let answered = Answered::of(&req.messages, &taken, &[]);
        assert!(answered.repeats("search", "{\"n\":2,\"q\":\"x\"}"));
        assert!(!answered.repeats("search", "{\"q\": \"y\", \"n\": 2}"));
        assert!(!answered.repeats("lookup", "{\"q\": \"x\", \"n\": 2}"));
        let mut message = json!({"role": "assistant", "content": null, "tool_calls": [
            {"id": "c2", "type": "function",
             "function": {"name": "search", "arguments": "{\"q\": \"x\", \"n\": 2}"}}]});
        let problems = answered.check(&mut message);
        assert_eq!(problems.len(), 1);
        assert_eq!(problems[0].kind, Unusable::Repetition);
        assert!(message.get("tool_calls").is_none());
        assert_eq!(unusable_signal(&problems), Signal::Repetition);
        // A wrong tool or a missing input says more than the repetition beside it.
        let unknown = Problem {
            kind: Unusable::UnknownTool("nope".into()),
            text: String::new(),
        };
        assert!(matches!(
            unusable_signal(&[problems[0].clone(), unknown]),
            Signal::UnknownTool { .. }
        ));
        // Not taken (failed, or waiting for its check), asked again, or not the last turn.
        assert!(Answered::of(&req.messages, &[], &[]).is_empty());
        assert!(Answered::of(&req.messages, &taken, &["search".to_owned()]).is_empty());
        let bytes = turn(vec![
            json!({"role": "assistant", "content": "3 hits"}),
            json!({"role": "user", "content": "again"}),
        ]);
        let req = ChatRequest::parse(&bytes).unwrap();
        assert!(Answered::of(&req.messages, &taken, &[]).is_empty());
    }

    /// Issue 11: the values a run takes while reading a request are those of the last turn it
    /// reads: a history read at once (a run the gateway sees for the first time) leaves only
    /// the last turn's calls for a new call to repeat, whichever reading (few results looked
    /// back from, or many read with the history) it takes.
    #[test]
    fn only_the_last_turn_read_is_taken() {
        for n in [2, LOOK_BACK_RESULTS + 2] {
            let mut messages = vec![json!({"role": "user", "content": "go"})];
            for i in 0..n {
                messages.push(json!({"role": "assistant", "content": null, "tool_calls": [
                    {"id": format!("c{i}"), "type": "function",
                     "function": {"name": "search", "arguments": format!("{{\"q\": \"x{i}\"}}")}}]}));
                messages.push(json!({"role": "tool", "tool_call_id": format!("c{i}"),
                                     "content": format!("{{\"hits\": {i}}}")}));
            }
            let bytes = request(json!(messages));
            let req = ChatRequest::parse(&bytes).unwrap();
            let idx = tool_index(&req);
            let mut state = RunState::new(MonitorConfig::default(), BudgetLimits::unlimited());
            assert_eq!(replay(&mut state, &req.messages, &ctx(&idx), 0).len(), n);
            let last = json!({"q": format!("x{}", n - 1)});
            assert_eq!(
                state.wire.take_next().taken,
                vec![("search".to_owned(), selfheal_core::canonical_hash(&last))],
                "{n} turns"
            );
        }
    }

    /// A call its model sent without an id (or with an empty one) gets one, unique per call; a
    /// number becomes its digits; an id it has is kept.
    #[test]
    fn a_call_without_an_id_gets_one() {
        let bytes = request(json!([{"role": "user", "content": "x"}]));
        let req = ChatRequest::parse(&bytes).unwrap();
        let idx = tool_index(&req);
        let call = |id: Option<Value>| {
            let mut c = json!({"type": "function",
                               "function": {"name": "search", "arguments": "{\"q\": \"x\"}"}});
            if let Some(id) = id {
                c["id"] = id;
            }
            c
        };
        let mut message = json!({"role": "assistant", "content": null, "tool_calls": [
            call(None), call(Some(json!(""))), call(Some(json!(7))), call(Some(json!("c1")))]});
        let check = check_message(&mut message, &idx, &GuideCache::default(), Ending::Finished);
        assert!(check.invalid.is_empty(), "{check:?}");
        let ids: Vec<&str> = message["tool_calls"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["id"].as_str().unwrap())
            .collect();
        assert!(ids[0].starts_with("call_selfheal_") && ids[1].starts_with("call_selfheal_"));
        assert_ne!(ids[0], ids[1]);
        assert_eq!(&ids[2..], ["7", "c1"]);
    }

    /// A conversation of `turns` turns, each the same call with the same result: between the
    /// turns a user message when `users`, else nothing (the agent repeating itself). Replayed
    /// one request at a time, as a client sends it; the run's verdicts, newest last.
    fn repeated_lookups(turns: usize, users: bool) -> Vec<selfheal_core::Verdict> {
        let mut messages = vec![json!({"role": "user", "content": "weather?"})];
        let mut state = RunState::new(MonitorConfig::default(), BudgetLimits::unlimited());
        let mut verdicts = Vec::new();
        for i in 0..turns {
            if i > 0 && users {
                messages.push(json!({"role": "assistant", "content": "21 degrees."}));
                messages.push(json!({"role": "user", "content": "and now?"}));
            }
            messages.push(json!({"role": "assistant", "content": null, "tool_calls": [
                {"id": format!("c{i}"), "type": "function",
                 "function": {"name": "search", "arguments": "{\"q\": \"weather\"}"}}]}));
            messages.push(json!({"role": "tool", "tool_call_id": format!("c{i}"),
                                 "content": "{\"temp\": 21}"}));
            let bytes = request(json!(messages));
            let req = ChatRequest::parse(&bytes).unwrap();
            let idx = tool_index(&req);
            assert_eq!(replay(&mut state, &req.messages, &ctx(&idx), 0).len(), 1);
            verdicts.push(state.run.verdict(0));
        }
        verdicts
    }

    /// A user who asks for the same lookup turn after turn is not an agent in a loop: no loop
    /// or duplicate guidance, no abort. The same calls with no user in between are one.
    #[test]
    fn a_user_turn_between_identical_lookups_is_not_a_loop() {
        use selfheal_core::GuidanceKind;
        let kinds =
            |v: &selfheal_core::Verdict| v.guidance.iter().map(|g| g.kind).collect::<Vec<_>>();
        for v in repeated_lookups(5, true) {
            assert!(
                v.guidance.is_empty() && v.abort.is_none(),
                "{:?}",
                kinds(&v)
            );
        }
        let looping = repeated_lookups(3, false);
        assert!(
            kinds(&looping[1]).contains(&GuidanceKind::Duplicate),
            "{looping:?}"
        );
        assert!(
            kinds(&looping[2]).contains(&GuidanceKind::Loop),
            "{looping:?}"
        );
    }

    /// A history trimmed of the results the run read still shows the agent's repeats: its
    /// opening user message is not a new turn.
    #[test]
    fn a_trimmed_history_keeps_its_repeats() {
        let mut state = RunState::new(MonitorConfig::default(), BudgetLimits::unlimited());
        let mut last = None;
        for i in 0..3 {
            let messages = json!([
                {"role": "user", "content": "weather?"},
                {"role": "assistant", "content": null, "tool_calls": [
                    {"id": format!("c{i}"), "type": "function",
                     "function": {"name": "search", "arguments": "{\"q\": \"weather\"}"}}]},
                {"role": "tool", "tool_call_id": format!("c{i}"), "content": "{\"temp\": 21}"},
            ]);
            let bytes = request(messages);
            let req = ChatRequest::parse(&bytes).unwrap();
            let idx = tool_index(&req);
            assert_eq!(replay(&mut state, &req.messages, &ctx(&idx), 0).len(), 1);
            last = Some(state.run.verdict(0));
        }
        let v = last.unwrap();
        assert!(
            v.guidance
                .iter()
                .any(|g| g.kind == selfheal_core::GuidanceKind::Loop),
            "{v:?}"
        );
    }

    /// A Responses input that continues a stored answer holds only what is new: a user
    /// message in it is a new turn though no result precedes it there.
    #[test]
    fn a_continued_responses_input_with_a_user_message_is_a_new_turn() {
        let bytes = request(json!([{"role": "user", "content": "go"}]));
        let req = ChatRequest::parse(&bytes).unwrap();
        let idx = tool_index(&req);
        for only_new in [true, false] {
            let mut state = RunState::new(MonitorConfig::default(), BudgetLimits::unlimited());
            for i in 0..3 {
                let call = json!({"type": "function_call", "call_id": format!("c{i}"),
                                  "name": "search", "arguments": "{\"q\": \"weather\"}"});
                let output = json!({"type": "function_call_output", "call_id": format!("c{i}"),
                                    "output": "{\"temp\": 21}"});
                // The input after `previous_response_id`: the user's new question (none
                // before the first answer), then, with the next request, the call's result.
                if i > 0 {
                    let ask = [json!({"role": "user", "content": "and now?"})];
                    assert!(replay_items(&mut state, &ask, only_new, &ctx(&idx), 0).is_empty());
                }
                assert_eq!(
                    replay_items(&mut state, &[call, output], only_new, &ctx(&idx), 0).len(),
                    1
                );
            }
            let looping = state
                .run
                .verdict(0)
                .guidance
                .iter()
                .any(|g| g.kind == selfheal_core::GuidanceKind::Loop);
            assert_eq!(looping, !only_new, "only_new: {only_new}");
        }
    }

    /// Issue 11: on a Responses `input` too, the values taken are those of the last turn read
    /// (a turn is a run of `function_call` items), and a call repeats one of them only while
    /// the input ends in that turn: its calls and their results, nothing asked since. Its
    /// `function_call` items are checked, other items left.
    #[test]
    fn a_responses_input_leaves_its_last_turns_calls_answered() {
        let mut items = vec![json!({"role": "user", "content": "go"})];
        for i in 0..3 {
            items.push(json!({"type": "function_call", "call_id": format!("c{i}"),
                              "name": "search", "arguments": format!("{{\"q\": \"x{i}\"}}")}));
            items.push(
                json!({"type": "function_call_output", "call_id": format!("c{i}"),
                              "output": format!("{{\"hits\": {i}}}")}),
            );
        }
        let bytes = request(json!([{"role": "user", "content": "go"}]));
        let req = ChatRequest::parse(&bytes).unwrap();
        let idx = tool_index(&req);
        let mut state = RunState::new(MonitorConfig::default(), BudgetLimits::unlimited());
        assert_eq!(
            replay_items(&mut state, &items, false, &ctx(&idx), 0).len(),
            3
        );
        let taken = state.wire.take_next().taken;
        let last = json!({"q": "x2"});
        assert_eq!(
            taken,
            vec![("search".to_owned(), selfheal_core::canonical_hash(&last))]
        );
        let answered = Answered::of_items(&items, &taken, &[]);
        let mut output = vec![
            json!({"type": "message", "role": "assistant", "content": []}),
            json!({"type": "function_call", "call_id": "c3", "name": "search",
                   "arguments": "{ \"q\" : \"x2\" }"}),
            json!({"type": "function_call", "call_id": "c4", "name": "search",
                   "arguments": "{\"q\": \"x3\"}"}),
        ];
        let problems = answered.take_repeated(&mut output);
        assert_eq!(problems.len(), 1);
        assert_eq!(problems[0].kind, Unusable::Repetition);
        assert_eq!(output.len(), 2);
        assert_eq!(output[0]["type"], "message");
        assert_eq!(output[1]["call_id"], "c4");
        // Asked again by the controller, or something asked since: nothing is answered.
        assert!(Answered::of_items(&items, &taken, &["search".to_owned()]).is_empty());
        items.push(json!({"role": "user", "content": "once more"}));
        assert!(Answered::of_items(&items, &taken, &[]).is_empty());
    }

    /// Issue 14: a call cut off by the length limit is re-asked, never repaired into a call;
    /// a call cut inside a string is refused even without the finish reason.
    #[test]
    fn truncated_calls_are_never_repaired() {
        let bytes = request(json!([{"role": "user", "content": "hi"}]));
        let idx = tool_index(&ChatRequest::parse(&bytes).unwrap());
        let cut = r#"{"q": "rust", "n": 3"#;
        let mut call = json!({"function": {"name": "search", "arguments": cut}});
        let err = check_call(&mut call, &idx, &GuideCache::default(), Ending::CutOff).unwrap_err();
        assert!(err.text.contains("cut off"), "{err:?}");
        assert_eq!(
            call["function"]["arguments"], cut,
            "left as the model wrote it"
        );
        let mut call = json!({"function": {"name": "search", "arguments": r#"{"q": "ru"#}});
        let err = check_call(&mut call, &idx, &GuideCache::default(), Ending::Unknown).unwrap_err();
        assert!(err.text.contains("cut off inside a string"), "{err:?}");
        // A model that finished on its own and left off the brace after a number: repaired.
        let mut call = json!({"function": {"name": "search", "arguments": cut}});
        assert_eq!(
            check_call(&mut call, &idx, &GuideCache::default(), Ending::Finished),
            Ok(true)
        );
        assert_eq!(call["function"]["arguments"], r#"{"n":3,"q":"rust"}"#);
        // Without the finish reason, the same text may be a cut number: refused.
        let mut call = json!({"function": {"name": "search", "arguments": cut}});
        let err = check_call(&mut call, &idx, &GuideCache::default(), Ending::Unknown).unwrap_err();
        assert!(err.text.contains("cut off inside a number"), "{err:?}");
    }

    /// Issue 14: a valid call is forwarded byte for byte, with no default added.
    #[test]
    fn valid_calls_are_left_as_written() {
        let mut body = tools();
        body["tools"][0]["function"]["parameters"]["properties"]["n"]["default"] =
            json!("dontcare");
        body["model"] = json!("m");
        body["messages"] = json!([{"role": "user", "content": "hi"}]);
        let bytes = bytes::Bytes::from(serde_json::to_vec(&body).unwrap());
        let idx = tool_index(&ChatRequest::parse(&bytes).unwrap());
        let raw = "{\"q\":   \"0789\"}";
        let mut call = json!({"function": {"name": "search", "arguments": raw}});
        assert_eq!(
            check_call(&mut call, &idx, &GuideCache::default(), Ending::Unknown),
            Ok(false)
        );
        assert_eq!(call["function"]["arguments"], raw);
    }

    /// Issue 14: a call that cannot be used is taken out of the message, never forwarded.
    #[test]
    fn unusable_calls_are_taken_out_of_the_message() {
        let bytes = request(json!([{"role": "user", "content": "hi"}]));
        let idx = tool_index(&ChatRequest::parse(&bytes).unwrap());
        let mut message = json!({"role": "assistant", "content": null, "tool_calls": [
            {"id": "a", "type": "function", "function": {"name": "search", "arguments": "{\"q\": \"x\"}"}},
            {"id": "b", "type": "function", "function": {"name": "search", "arguments": "{\"q\": \"y"}}
        ]});
        let check = check_message(&mut message, &idx, &GuideCache::default(), Ending::Unknown);
        assert_eq!(check.invalid.len(), 1);
        assert_eq!(message["tool_calls"].as_array().map(Vec::len), Some(1));
        assert_eq!(message["tool_calls"][0]["id"], "a");
        let mut only_bad = json!({"role": "assistant", "content": null, "tool_calls": [
            {"id": "b", "type": "function", "function": {"name": "search", "arguments": "{\"q\": \"y"}}
        ]});
        check_message(&mut only_bad, &idx, &GuideCache::default(), Ending::Unknown);
        assert!(only_bad.get("tool_calls").is_none());
        assert_eq!(only_bad["content"], "");
    }
}
