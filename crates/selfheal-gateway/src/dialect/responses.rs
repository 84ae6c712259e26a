//! The Responses API (`POST /v1/responses`): the handler, and the Responses-specific parse
//! (input items, tools, the first call) and render around the shared [`crate::pipeline`] —
//! whole answers and streamed ones (relayed by [`crate::responses_stream`]).

use crate::auth::{Caller, Credentials};
use crate::config::OnPartial;
use crate::error::ApiError;
use crate::forward::{Forwarded, forward, responses_op};
use crate::heal::{self, ToolIndex};
use crate::http::{answered, read_body, sse_response};
use crate::metrics::Metrics;
use crate::pipeline::{
    Turn, calls_check, failed, grounding_check, log_calls, partial_error, reask_or_escalate,
    reask_turn, record_decisions, reissue_granted, relay_response, remember_response,
    repeatable_out, reread_due, reread_item, say_in_output, stop_run, stopping, stream_budget,
    stream_unsettled, unread,
};
use crate::recover;
use crate::report::{add_headers, selfheal_report, tool_result_detail};
use crate::responses_stream;
use crate::state::{AppState, lock, mark_no_stream, unix_ms};
use crate::store::Kind;
use crate::stream;
use crate::upstream::{CallLog, UpstreamClient};
use axum::body::Body;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures_util::future::BoxFuture;
use selfheal_core::call::ReaskState;
use selfheal_openai::client::ClientError;
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::Instant;

/// `POST /v1/responses` (OpenAI's Responses API), healed like chat completions where the wire
/// allows: the run's upstream attempts go through the core's call plan (retries, the fallback
/// chain, breakers, the run's ledger); a non-streaming answer's `function_call` items are checked
/// against the request's `tools` through the same non-corrupting repair path, an unusable call is
/// re-asked when the policy allows it and is never forwarded, and the answer carries the
/// `selfheal` report. A streamed answer is healed as a chat stream is
/// ([`responses_stream`]): re-issued invisibly when it breaks before any content, its function
/// calls held until the end and checked, an error event after content.
pub(crate) async fn responses(
    State(s): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    if s.config.passthrough {
        return forward(&s, &headers, body, Forwarded::Responses).await;
    }
    let started = Instant::now();
    // Counted as chat completions are (issue 30: they were missing from both metrics).
    Metrics::inc(&s.metrics.requests_total);
    let (result, tenant) = match s.gate.admit(&headers) {
        Ok(caller) => {
            let tenant = caller.tenant.clone();
            let redactor = caller.redactor.clone();
            let r = responses_inner(&s, caller, &headers, body).await;
            (r.map_err(|e| redactor.error(e)), tenant)
        }
        Err(e) => (Err(e), "-".to_owned()),
    };
    answered(&s, result, &tenant, started)
}

/// The first tool call of a Responses `input`, `(call_id, name)`: its first `function_call`
/// item, else (an input that continues an answer the gateway no longer knows) the call its
/// first `function_call_output` answers, with no name. What names the run when the client gave
/// no label ([`crate::runs::run_id_of`]).
pub(crate) fn responses_first_call(req: &serde_json::Map<String, Value>) -> Option<(&str, &str)> {
    let items = req.get("input").and_then(Value::as_array)?;
    let of = |kind: &str| {
        items
            .iter()
            .filter(|i| crate::heal::item_type(i) == Some(kind))
            .find_map(|i| i.get("call_id").and_then(Value::as_str))
            .map(|id| (id, i_name(items, id)))
    };
    of("function_call").or_else(|| of("function_call_output"))
}

/// The `name` of the `function_call` item of `call_id` in `items`, `""` if none.
pub(crate) fn i_name<'a>(items: &'a [Value], call_id: &str) -> &'a str {
    items
        .iter()
        .filter(|i| crate::heal::item_type(i) == Some("function_call"))
        .find(|i| i.get("call_id").and_then(Value::as_str) == Some(call_id))
        .and_then(|i| i.get("name").and_then(Value::as_str))
        .unwrap_or("")
}

/// The tools of a Responses request (`[{"type": "function", "name", "parameters"}]`).
pub(crate) fn responses_tools(req: &serde_json::Map<String, Value>) -> ToolIndex {
    let mut out = ToolIndex::new();
    for t in req
        .get("tools")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        if crate::heal::item_type(t) != Some("function") {
            continue;
        }
        let Some(name) = t.get("name").and_then(Value::as_str) else {
            continue;
        };
        let parameters = t.get("parameters").cloned().unwrap_or_else(|| json!({}));
        out.insert(
            name.to_owned(),
            heal::ToolSpec {
                schema_key: parameters.to_string(),
                required: selfheal_repair::required_properties(&parameters),
                parameters,
            },
        );
    }
    out
}

/// A Responses request for model `m`, with `extra` appended to its `input` (a re-ask turn).
pub(crate) fn encode_responses(
    req: &serde_json::Map<String, Value>,
    m: &str,
    extra: Option<&Value>,
) -> Bytes {
    let mut r = req.clone();
    r.insert("model".into(), Value::from(m));
    if let Some(turn) = extra {
        let mut input = match r.remove("input") {
            Some(Value::Array(items)) => items,
            Some(Value::String(text)) => vec![json!({"role": "user", "content": text})],
            Some(other) => vec![other],
            None => Vec::new(),
        };
        input.push(turn.clone());
        r.insert("input".into(), Value::Array(input));
    }
    Bytes::from(serde_json::to_vec(&r).unwrap_or_default())
}

pub(crate) fn responses_json_op<'c>(
    c: &'c UpstreamClient,
    b: Bytes,
    cr: &'c Credentials,
) -> BoxFuture<'c, Result<Value, ClientError>> {
    Box::pin(async move {
        let resp = c.send("responses", b, cr).await?;
        let bytes = crate::upstream::read_bounded(resp, c.max_body()).await?;
        responses_stream::read_response(&bytes)
    })
}

/// A Responses request as the pipeline reads it: the body, the model and its chain, and what
/// names its conversation (`previous_response_id`, `conversation`).
pub(crate) struct Parsed {
    /// The request body.
    pub(crate) req: serde_json::Map<String, Value>,
    /// The model asked for.
    pub(crate) model: String,
    /// The model's chain of targets.
    pub(crate) chain: Vec<crate::config::Target>,
    /// The answer this request continues (`previous_response_id`).
    pub(crate) previous: Option<String>,
    /// The conversation kept upstream, as a run label (`conversation:<id>`).
    pub(crate) conversation: Option<String>,
}

/// Parse: the body read and checked to be a Responses request for a model the gateway routes.
pub(crate) async fn parse_request(
    s: &Arc<AppState>,
    headers: &HeaderMap,
    body: Body,
) -> Result<Parsed, ApiError> {
    let bytes = read_body(s, headers, body).await?;
    let req: serde_json::Map<String, Value> = serde_json::from_slice(&bytes)
        .map_err(|e| ApiError::bad_request(format!("the body is not a JSON object: {e}")))?;
    let model = req
        .get("model")
        .and_then(Value::as_str)
        .ok_or_else(|| ApiError::bad_request("`model` must be a string"))?
        .to_owned();
    let chain = s
        .config
        .route(&model)
        .ok_or_else(|| ApiError::unknown_model(&model))?;
    // A client that continues an answer (`previous_response_id`) sends only what is new: the
    // run is the one that sent that answer, if this tenant's, and the answer's calls are read
    // with the results that came back for them.
    let previous = req
        .get("previous_response_id")
        .and_then(Value::as_str)
        .map(str::to_owned);
    // A client that keeps its conversation upstream (`conversation`: an id, or an object with
    // one) sends only what is new too: the conversation names the run, as a label would.
    let conversation = match req.get("conversation") {
        Some(Value::String(id)) => Some(format!("conversation:{id}")),
        Some(Value::Object(o)) => o
            .get("id")
            .and_then(Value::as_str)
            .map(|id| format!("conversation:{id}")),
        _ => None,
    };
    Ok(Parsed {
        req,
        model,
        chain,
        previous,
        conversation,
    })
}

/// Name the run: the caller's label, else the run that sent the answer continued, else one
/// named by the conversation, its opening and its first call, within the caller's tenant.
pub(crate) async fn name_run(
    s: &Arc<AppState>,
    caller: Caller,
    headers: &HeaderMap,
    p: &Parsed,
) -> Turn {
    let req = &p.req;
    let label = headers.get("x-selfheal-run").and_then(|v| v.to_str().ok());
    let now = Instant::now();
    let continued = match (label, p.previous.as_deref()) {
        (None, Some(prev)) => s.runs.run_of_response(prev, &caller.tenant, now),
        _ => None,
    };
    let mut unnamed = None;
    let run = match (label, continued) {
        (Some(l), _) if s.runs.owned_by(l, &caller.tenant, now) => l.to_owned(),
        (_, Some(run)) => run,
        _ => {
            let first_input = match req.get("input") {
                Some(Value::Array(items)) => items.first().map(Value::to_string),
                Some(v) => Some(v.to_string()),
                None => None,
            };
            let instructions = req.get("instructions").map(Value::to_string);
            let opening: Vec<(&str, &[u8])> = [
                ("instructions", instructions.as_deref()),
                ("input", first_input.as_deref()),
            ]
            .into_iter()
            .filter_map(|(tag, v)| v.map(|v| (tag, v.as_bytes())))
            .collect();
            let label = label.or(p.conversation.as_deref());
            let first = responses_first_call(req);
            if !crate::runs::names_its_run(label, first) {
                unnamed = Some(Arc::new(
                    opening.iter().map(|(k, v)| (*k, v.to_vec())).collect(),
                ));
            }
            crate::runs::run_id_of(&s.run_key, &caller.tenant, label, &opening, first)
        }
    };
    let redo = || {
        let input = match req.get("input") {
            Some(Value::Array(items)) => items.clone(),
            _ => Vec::new(),
        };
        let fallback = p.chain.get(1).map(|c| c.model.as_str());
        let (previous, conversation) = (p.previous.clone(), p.conversation.is_some());
        let tools = responses_tools(req);
        crate::sharing::responses_redo(s, input, tools, previous, conversation, fallback)
    };
    Turn {
        state: crate::sharing::load(s, &run, &caller.tenant, unnamed.is_none(), redo).await,
        s: s.clone(),
        caller,
        run: run.into(),
        unnamed,
    }
}

/// What replaying the request's tool results into the run decided.
pub(crate) struct Replay {
    /// The monitor's verdict.
    pub(crate) verdict: selfheal_core::monitor::Verdict,
    /// The results read, in order.
    pub(crate) replayed: Vec<heal::Replayed>,
    /// What this request carries out for the controller.
    pub(crate) next: recover::Next,
    /// The calls of the model's previous turn whose values the run took.
    pub(crate) answered: heal::Answered,
}

/// Rebuild the run: the tool results in `input` go to the run's monitor, as a chat history's
/// do, and the decisions they led to are recorded.
pub(crate) fn replay_input(t: &Turn, p: &Parsed, tools: &ToolIndex) -> Replay {
    let s = &t.s;
    let req = &p.req;
    let now_ms = s.now_ms();
    let decisions;
    let replay = {
        let mut st = lock(&t.state);
        st.requests += 1;
        let input = req
            .get("input")
            .and_then(Value::as_array)
            .map_or(&[][..], Vec::as_slice);
        // The calls of the answer continued, ahead of their results, as a full input has them:
        // the answer named by `previous_response_id`, or in a conversation the run's last
        // answer when the input answers its calls and nothing else.
        let continues = |r: &crate::runs::Responded| match p.previous.as_deref() {
            Some(prev) => prev == r.id,
            None => p.conversation.is_some() && r.answered_by(input),
        };
        let with_calls: Vec<Value>;
        let items = match st.last_response.as_ref() {
            Some(r) if continues(r) && !r.calls.is_empty() => {
                with_calls = r.calls.iter().chain(input).cloned().collect();
                &with_calls[..]
            }
            _ => input,
        };
        let ctx = recover::Ctx {
            tools: &s.config.tools,
            offered: tools,
            fallback: p.chain.get(1).map(|c| c.model.as_str()),
            seed: now_ms,
            wall_ms: recover::wall_ms(),
        };
        let only_new = p.previous.is_some() || p.conversation.is_some();
        let replayed = heal::replay_items(&mut st, items, only_new, &ctx, now_ms);
        let next = recover::take_next(&mut st);
        decisions = st.run.take_records();
        // The calls of the model's previous turn whose values the controller took: a new call
        // identical to one of them is its repetition, re-asked as on chat completions.
        let answered =
            heal::Answered::of_items(items, &repeatable_out(t, &next.taken), &next.again);
        Replay {
            verdict: st.run.verdict(now_ms),
            replayed,
            next,
            answered,
        }
    };
    for r in &replay.replayed {
        t.event(Kind::ToolResult, tool_result_detail(r));
    }
    record_decisions(t, decisions);
    replay
}

/// Edit: the monitor's guidance and the controller's directed lines join `instructions`, and
/// hidden tools leave `tools` (and `tool_choice`, if it named one). The actions taken, and the
/// tools still on offer.
pub(crate) fn edit_input(
    t: &Turn,
    req: &mut serde_json::Map<String, Value>,
    verdict: &selfheal_core::monitor::Verdict,
    directed: Vec<String>,
    mut tools: ToolIndex,
) -> (Vec<String>, ToolIndex) {
    let s = &t.s;
    let mut edited = Vec::new();
    if !verdict.guidance.is_empty() || !directed.is_empty() {
        let text: Vec<String> = verdict
            .guidance
            .iter()
            .map(|g| g.text.clone())
            .chain(directed)
            .collect();
        let note = format!("[selfheal] {}", text.join("\n"));
        let instructions = match req.get("instructions").and_then(Value::as_str) {
            Some(i) if !i.is_empty() => format!("{i}\n\n{note}"),
            _ => note,
        };
        req.insert("instructions".into(), Value::String(instructions));
        Metrics::inc(&s.metrics.guidance_total);
        edited.push("guidance".to_owned());
        t.event(Kind::Guidance, json!({"text": text}));
    }
    let hidden: Vec<String> = verdict
        .hidden_tools
        .iter()
        .filter(|h| tools.contains_key(h.as_str()))
        .cloned()
        .collect();
    if !hidden.is_empty() {
        if let Some(list) = req.get_mut("tools").and_then(Value::as_array_mut) {
            list.retain(|t| {
                t.get("name")
                    .and_then(Value::as_str)
                    .is_none_or(|n| !hidden.iter().any(|h| h == n))
            });
        }
        let names_hidden = req
            .get("tool_choice")
            .and_then(|c| c.get("name"))
            .and_then(Value::as_str)
            .is_some_and(|n| hidden.iter().any(|h| h == n));
        if names_hidden {
            req.insert("tool_choice".into(), Value::from("auto"));
        }
        Metrics::inc(&s.metrics.tools_hidden_total);
        edited.push("hide".to_owned());
        t.event(Kind::Hide, json!({"tools": hidden}));
    }
    tools.retain(|name, _| !hidden.contains(name));
    (edited, tools)
}

/// A stopped run's answer as a Responses object: `words` as the assistant's message.
fn stopped_response(t: &Turn, model: &str, words: &str) -> Value {
    json!({"id": format!("resp_selfheal_{}", t.run), "object": "response",
        "created_at": unix_ms() / 1000, "model": model, "status": "completed",
        "output": [{"type": "message", "id": "msg_selfheal", "role": "assistant",
                    "status": "completed",
                    "content": [{"type": "output_text", "text": words, "annotations": []}]}]})
}

pub(crate) async fn responses_inner(
    s: &Arc<AppState>,
    caller: Caller,
    headers: &HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let parsed = parse_request(s, headers, body).await?;
    let t = name_run(s, caller, headers, &parsed).await;
    t.event(
        Kind::Request,
        json!({"model": parsed.model, "api": "responses", "tenant": t.caller.tenant}),
    );
    let tools = responses_tools(&parsed.req);
    let Replay {
        verdict,
        replayed,
        next,
        answered,
    } = replay_input(&t, &parsed, &tools);
    let Parsed {
        mut req,
        model,
        chain,
        ..
    } = parsed;
    // The controller's directives, carried out as the chat path does: guidance lines join the
    // monitor's in `instructions`, repaired tool results replace their `function_call_output`,
    // an escalation sends this request to the chain's next target; a stop ends the run here.
    replace_outputs(&mut req, &next.replaced);
    let newest_failed = replayed.last().is_some_and(|r| failed(r.outcome));
    if let Some((reason, action)) = stopping(next.stop, verdict.abort.clone(), newest_failed) {
        let streaming = req.get("stream").and_then(Value::as_bool) == Some(true);
        let render = |words: &str| stopped_response(&t, &model, words);
        let frames = responses_stream::answer_frames;
        let resp = stop_run(&t, (&reason, action), streaming, render, frames);
        crate::sharing::save(s, &t.state).await;
        return Ok(resp);
    }
    let chain = if next.escalate && chain.len() > 1 {
        t.event(Kind::Escalate, json!({"to": chain[1].model}));
        chain[1..].to_vec()
    } else {
        chain
    };
    let mut actions: Vec<String> = next.actions.iter().map(|a| a.as_str().to_owned()).collect();
    let (edited, tools) = edit_input(&t, &mut req, &verdict, next.guidance, tools);
    actions.extend(edited);
    // Grounded tools' calls are judged against what the request holds.
    let evidence = recover::responses_evidence(&s.config.tools, &req, &tools).map(Arc::new);
    let checks = Checks {
        answered: Arc::new(answered),
        evidence,
    };
    let wants_stream = req.get("stream").and_then(Value::as_bool) == Some(true);
    // A target learned not to stream tool calls ([`NoStream`](crate::state::NoStream)) is asked
    // without streaming and its answer sent as the Responses events a stream would have carried.
    let learned = wants_stream
        && !tools.is_empty()
        && chain
            .first()
            .is_some_and(|c| s.no_stream.contains(c, Instant::now()));
    if wants_stream && !learned {
        let answer = answer_responses_stream(&t, req, chain, tools, checks, actions).await;
        crate::sharing::save(s, &t.state).await;
        return answer;
    }
    if learned {
        req.insert("stream".into(), Value::Bool(false));
    }
    let asked = Asked {
        req: &req,
        chain: &chain,
        tools: &tools,
        checks: &checks,
    };
    let answer = answer_whole(&t, asked, actions, learned).await;
    crate::sharing::save(s, &t.state).await;
    answer
}

/// What a whole (not streamed) Responses answer is asked with.
#[derive(Clone, Copy)]
pub(crate) struct Asked<'a> {
    /// The edited request.
    pub(crate) req: &'a serde_json::Map<String, Value>,
    /// The targets to ask, in order.
    pub(crate) chain: &'a [crate::config::Target],
    /// The tools on offer.
    pub(crate) tools: &'a ToolIndex,
    /// What the answer's calls are checked against.
    pub(crate) checks: &'a Checks,
}

/// Call, check, re-ask and answer: a whole Responses answer, judged by the core as on chat
/// completions, its unusable calls re-asked, rendered with its report (as Responses events when
/// the target was `learned` not to stream).
pub(crate) async fn answer_whole(
    t: &Turn,
    asked: Asked<'_>,
    mut actions: Vec<String>,
    learned: bool,
) -> Result<Response, ApiError> {
    let s = &t.s;
    let mut log = CallLog::default();
    let encode = |m: &str| encode_responses(asked.req, m, None);
    let result = t
        .call(asked.chain, &encode, &responses_json_op, &mut log)
        .await;
    let mut answer = match result {
        Ok(v) => v,
        Err(e) => {
            log_calls(t, &log, &mut actions);
            return Err(t.failed(e));
        }
    };
    let unsettled = read_before_answering(t, asked, &mut answer, &mut actions, &mut log).await;
    let checked = reask_calls(t, asked, answer, &mut actions, &mut log).await;
    let Checked {
        mut answer,
        repaired,
        invalid,
        reasked,
    } = checked;
    // A re-ask answered with a final answer: judged by the core as the first answer would be.
    let unsettled =
        if unsettled.is_none() && invalid.is_empty() && reasked && !responses_calls(&answer) {
            recover::unsettled(&lock(&t.state))
        } else {
            unsettled
        };
    log_calls(t, &log, &mut actions);
    for name in &repaired {
        Metrics::inc(&s.metrics.repairs_total);
        t.event(Kind::Repair, json!({"tool": name}));
    }
    if !repaired.is_empty() {
        actions.push("repair".into());
    }
    let (status, reason) = if !invalid.is_empty() {
        t.event(Kind::InvalidCall, json!({"problems": invalid}));
        ("partial", Some(heal::problems_text(&invalid)))
    } else if let Some(why) = unsettled {
        ("partial", Some(why))
    } else {
        ("complete", None)
    };
    // Every call left out: the answer says so in words, or is an error the SDKs raise.
    if !invalid.is_empty() && !responses_calls(&answer) {
        let words = heal::left_out_text(&heal::problem_texts(&invalid));
        if s.config.server.on_partial == OnPartial::Error {
            return Ok(partial_error(
                t,
                "calls_left_out",
                &words,
                &actions,
                (status, reason.as_deref()),
            ));
        }
        say_in_output(&mut answer, &words);
    }
    if let Some(o) = answer.as_object_mut() {
        o.insert(
            "selfheal".into(),
            selfheal_report(&t.state, status, reason.as_deref(), &actions),
        );
    }
    t.caller.redactor.value(&mut answer);
    remember_response(t, crate::runs::Responded::of(&answer));
    t.finish(status);
    let mut resp = if learned {
        let frames = responses_stream::answer_frames(&answer);
        sse_response(Body::from_stream(futures_util::stream::iter(frames)))
    } else {
        axum::Json(answer).into_response()
    };
    let reason = reason.map(|r| t.caller.redactor.text(&r).into_owned());
    add_headers(&mut resp, &t.run, status, &actions, reason.as_deref());
    if learned {
        mark_no_stream(&mut resp, asked.chain.first());
    }
    Ok(resp)
}

/// Check: a final answer is judged by the core as on chat completions (see `answer_complete`):
/// `partial` over an open failure (its reason returned), or held for the read before
/// answering, which the model is asked for with the guidance appended.
async fn read_before_answering(
    t: &Turn,
    asked: Asked<'_>,
    answer: &mut Value,
    actions: &mut Vec<String>,
    log: &mut CallLog,
) -> Option<String> {
    if responses_calls(answer) {
        return None;
    }
    let unsettled = recover::unsettled(&lock(&t.state));
    let Some(text) = unsettled.is_none().then(|| reread_due(t)).flatten() else {
        return unsettled;
    };
    if !actions.iter().any(|a| a == "reread") {
        actions.push("reread".into());
    }
    let extra = reread_item(&text);
    let again = |m: &str| encode_responses(asked.req, m, Some(&extra));
    let called = match t.call(asked.chain, &again, &responses_json_op, log).await {
        Ok(a) => {
            *answer = a;
            Some(responses_calls(answer))
        }
        Err(_) => None,
    };
    unread(called, &text)
}

/// A Responses answer once its calls are checked and, where unusable, re-asked.
struct Checked {
    answer: Value,
    repaired: Vec<String>,
    invalid: Vec<heal::Problem>,
    reasked: bool,
}

/// Re-ask: unusable calls are re-asked as long as the ladder of their class
/// (`heal::unusable_signal`) says so, within the budget; the last usable answer stands, an
/// unusable call is never forwarded.
async fn reask_calls(
    t: &Turn,
    asked: Asked<'_>,
    mut answer: Value,
    actions: &mut Vec<String>,
    log: &mut CallLog,
) -> Checked {
    let s = &t.s;
    let evidence = asked.checks.evidence.as_deref().map(Vec::as_slice);
    let answered = &asked.checks.answered;
    let check = check_responses_answer(s, &mut answer, asked.tools, answered, evidence);
    let (mut repaired, mut invalid) = (check.repaired, check.invalid);
    let mut ladder = ReaskState::default();
    let mut reasked = false;
    // The ladder's escalation moves the re-asks to the chain's next target, as on chat (issue
    // 30: a Responses re-ask never escalated).
    let mut reask_chain: &[crate::config::Target] = asked.chain;
    while !invalid.is_empty() {
        let Some((next, escalate)) = reask_or_escalate(t, &invalid, ladder, &mut reask_chain)
        else {
            break;
        };
        ladder = next;
        reasked = true;
        if escalate && !actions.iter().any(|a| a == "escalate") {
            actions.push("escalate".into());
        }
        Metrics::inc(&s.metrics.reasks_total);
        if !actions.iter().any(|a| a == "reask") {
            actions.push("reask".into());
        }
        t.event(Kind::Reask, json!({"problems": invalid}));
        let turn = reask_turn(&invalid);
        let again = |m: &str| encode_responses(asked.req, m, Some(&turn));
        match t.call(reask_chain, &again, &responses_json_op, log).await {
            Ok(mut second) => {
                let check = check_responses_answer(s, &mut second, asked.tools, answered, evidence);
                answer = second;
                repaired = check.repaired;
                invalid = check.invalid;
            }
            Err(_) => break,
        }
    }
    Checked {
        answer,
        repaired,
        invalid,
        reasked,
    }
}

/// `POST /v1/responses` with `stream: true`: the upstream stream relayed and healed by
/// [`responses_stream::relay`] — preamble and function calls held, a stream broken before any
/// content re-issued, unusable calls re-asked along the ladder, an error event after content.
pub(crate) async fn answer_responses_stream(
    t: &Turn,
    req: serde_json::Map<String, Value>,
    chain: Vec<crate::config::Target>,
    tools: ToolIndex,
    checks: Checks,
    mut actions: Vec<String>,
) -> Result<Response, ApiError> {
    let encode = |m: &str| encode_responses(&req, m, None);
    let mut log = CallLog::default();
    let result = t.call(&chain, &encode, &responses_op, &mut log).await;
    log_calls(t, &log, &mut actions);
    let served = log.served.clone();
    let upstream = result.map_err(|e| t.failed(e))?;
    let report = selfheal_report(&t.state, "complete", None, &actions);
    let again = ResponsesAgain {
        t: t.clone(),
        req: Arc::new(req),
        chain: Arc::new(chain),
        tools: Arc::new(tools),
        checks: checks.clone(),
    };
    let grounded = checks.evidence.map(|evidence| grounding_check(t, evidence));
    let hooks = responses_stream::Hooks {
        reask: Some(again.hook()),
        reissue: Some(again.hook()),
        check: calls_check(checks.answered, grounded),
        reread: Some(again.reread()),
        unsettled: Some(stream_unsettled(t)),
        // Set in the relay's task: the head waits for its first frame.
        head: None,
        budget: Some(stream_budget(t)),
        on_partial: t.s.config.server.on_partial,
    };
    let learnable = served.filter(|_| !again.tools.is_empty());
    let guides = t.s.guides.clone();
    Ok(
        relay_response(t, &actions, learnable, move |tx, head| async move {
            let hooks = responses_stream::Hooks {
                head: Some(head),
                ..hooks
            };
            let r = responses_stream::relay(
                upstream,
                again.tools.clone(),
                guides,
                Some(report),
                hooks,
                &tx,
            )
            .await;
            (r, tx)
        })
        .await,
    )
}

/// What a Responses stream's second asking needs (owned: it runs in the relay's task).
#[derive(Clone)]
pub(crate) struct ResponsesAgain {
    pub(crate) t: Turn,
    pub(crate) req: Arc<serde_json::Map<String, Value>>,
    pub(crate) chain: Arc<Vec<crate::config::Target>>,
    pub(crate) tools: Arc<ToolIndex>,
    /// The further checks of its answers' calls.
    pub(crate) checks: Checks,
}

/// What a Responses request's answers are checked against beyond their tools' schemas, read
/// while the request was at hand.
#[derive(Clone)]
pub(crate) struct Checks {
    /// The calls of the model's previous turn whose results it has ([`heal::Answered`]).
    pub(crate) answered: Arc<heal::Answered>,
    /// The grounding evidence, when a grounded tool is offered.
    pub(crate) evidence: Option<Arc<Vec<Value>>>,
}

/// A Responses answer's `function_call` items checked ([`responses_stream::check_response`]:
/// repaired in place, or taken out as unusable), then those that repeat the model's previous
/// turn (`answered`) and, when a grounded tool is offered (`evidence`), the calls of grounded
/// tools the request does not support ([`recover::take_ungrounded`]) taken out — as a chat
/// answer's ([`check_completion`](crate::pipeline::check_completion)).
pub(crate) fn check_responses_answer(
    s: &AppState,
    answer: &mut Value,
    tools: &ToolIndex,
    answered: &heal::Answered,
    evidence: Option<&[Value]>,
) -> heal::CallCheck {
    let mut check = responses_stream::check_response(answer, tools, &s.guides);
    if let Some(items) = answer.get_mut("output").and_then(Value::as_array_mut) {
        check.invalid.extend(answered.take_repeated(items));
        if let Some(evidence) = evidence {
            check
                .invalid
                .extend(recover::take_ungrounded(&s.config.tools, items, evidence));
        }
    }
    check
}

impl ResponsesAgain {
    /// Non-streaming calls through the chain, charged to the run like the chat stream's
    /// ([`stream_reask`](crate::pipeline::stream_reask)): with problems, a re-ask along the ladder of their class; without,
    /// a re-issue decided by the core's `stream_broke`; each answer checked, and unusable calls
    /// in it re-asked in turn.
    pub(crate) fn hook(&self) -> responses_stream::Reask {
        let me = self.clone();
        Box::new(move |problems: Vec<heal::Problem>| Box::pin(me.ask(problems, None)))
    }

    /// [`ResponsesAgain::hook`]'s calls. With `guidance` (the read before answering), the
    /// first call appends it as a system message and needs no decision of its own; unusable
    /// calls in its answer are re-asked in turn.
    pub(crate) async fn ask(
        self,
        problems: Vec<heal::Problem>,
        guidance: Option<Value>,
    ) -> Option<responses_stream::Reanswered> {
        let t = &self.t;
        let mut problems = problems;
        let mut guidance = guidance;
        let mut ladder = ReaskState::default();
        // The ladder's escalation moves the re-asks to the chain's next target, as on chat.
        let mut chain: &[crate::config::Target] = &self.chain;
        loop {
            let extra = match guidance.take() {
                Some(g) => Some(g),
                None if problems.is_empty() => {
                    if !reissue_granted(t) {
                        return None;
                    }
                    t.event(Kind::Reissue, json!({"stream": false}));
                    None
                }
                None => {
                    let (next, _) = reask_or_escalate(t, &problems, ladder, &mut chain)?;
                    ladder = next;
                    Metrics::inc(&t.s.metrics.reasks_total);
                    t.event(Kind::Reask, json!({"problems": problems}));
                    Some(reask_turn(&problems))
                }
            };
            let mut req = (*self.req).clone();
            req.insert("stream".into(), Value::Bool(false));
            let encode = |m: &str| encode_responses(&req, m, extra.as_ref());
            let mut log = CallLog::default();
            let result = t.call(chain, &encode, &responses_json_op, &mut log).await;
            log_calls(t, &log, &mut Vec::new());
            let mut response = result.ok()?;
            let check = check_responses_answer(
                &t.s,
                &mut response,
                &self.tools,
                &self.checks.answered,
                self.checks.evidence.as_deref().map(Vec::as_slice),
            );
            if !check.invalid.is_empty() {
                problems = check.invalid;
                continue;
            }
            return Some(responses_stream::Reanswered {
                response,
                repaired: check.repaired,
            });
        }
    }

    /// The read before answering of a streamed Responses answer, decided and asked as for a
    /// chat stream ([`stream_reread`](crate::pipeline::stream_reread)).
    pub(crate) fn reread(&self) -> stream::ReadAgain<responses_stream::Reanswered> {
        let me = self.clone();
        Box::new(move || {
            Box::pin(async move {
                let text = reread_due(&me.t)?;
                let extra = reread_item(&text);
                let answer = me.ask(Vec::new(), Some(extra)).await;
                let called = answer.as_ref().map(|a| responses_calls(&a.response));
                Some(stream::Reread {
                    answer,
                    unread: unread(called, &text),
                })
            })
        })
    }
}

/// Whether a Responses answer calls tools (has a `function_call` item).
pub(crate) fn responses_calls(response: &Value) -> bool {
    response
        .get("output")
        .and_then(Value::as_array)
        .is_some_and(|o| {
            o.iter()
                .any(|i| crate::heal::item_type(i) == Some("function_call"))
        })
}

/// Puts the gateway's repair of a tool result in place of the `output` of its
/// `function_call_output` item (by `call_id`), as the chat path replaces a `tool` message.
pub(crate) fn replace_outputs(
    req: &mut serde_json::Map<String, Value>,
    replaced: &[(String, String)],
) {
    if replaced.is_empty() {
        return;
    }
    let Some(items) = req.get_mut("input").and_then(Value::as_array_mut) else {
        return;
    };
    for item in items {
        if crate::heal::item_type(item) != Some("function_call_output") {
            continue;
        }
        let Some(id) = item.get("call_id").and_then(Value::as_str) else {
            continue;
        };
        if let Some((_, text)) = replaced.iter().find(|(r, _)| r == id)
            && let Some(o) = item.as_object_mut()
        {
            o.insert("output".into(), Value::String(text.clone()));
        }
    }
}
