//! The chat completions API (`POST /v1/chat/completions`): the handler, and the chat-specific
//! parse and render around the shared [`crate::pipeline`] — the whole answer (with its checks,
//! re-asks and read before answering) and the streamed one (relayed by [`crate::stream`]).

use crate::answer;
use crate::auth::Caller;
use crate::config::OnPartial;
use crate::error::ApiError;
use crate::forward::passthrough;
use crate::heal::{self};
use crate::http::{answered, read_body, sse_response};
use crate::metrics::Metrics;
use crate::pipeline::{
    Call, Turn, adopt_first_call, answer_op, chat_op, check_completion, completion_first_call,
    edit_request, log_calls, partial_error, reask_or_escalate, reask_turn, rebuild_run,
    relay_response, reread_due, reread_item, send_op, stop_run, stopping, stream_budget,
    stream_check, stream_reask, stream_reread, stream_unsettled,
};
use crate::recover;
use crate::report::{add_headers, call_actions, selfheal_report, selfheal_report_bytes};
use crate::request::{ChatRequest, Edits};
use crate::runs::run_id;
use crate::state::{AppState, lock, mark_no_stream, unix_ms};
use crate::store::Kind;
use crate::stream;
use crate::upstream::CallLog;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::{IntoResponse, Response};
use selfheal_core::call::ReaskState;
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::Instant;

/// `POST /v1/chat/completions`: the healing pipeline's one entry, which the Messages dialect
/// ([`crate::dialect::messages`]) enters too, with the chat request it translated.
pub(crate) async fn chat(
    State(s): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let started = Instant::now();
    Metrics::inc(&s.metrics.requests_total);
    let (result, tenant) = match s.gate.admit(&headers) {
        Ok(caller) => {
            let tenant = caller.tenant.clone();
            let redactor = caller.redactor.clone();
            let r = chat_inner(&s, caller, &headers, body).await;
            (r.map_err(|e| redactor.error(e)), tenant)
        }
        Err(e) => (Err(e), "-".to_owned()),
    };
    answered(&s, result, &tenant, started)
}

pub(crate) async fn chat_inner(
    s: &Arc<AppState>,
    caller: Caller,
    headers: &HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let bytes = read_body(s, headers, body).await?;
    let req = ChatRequest::parse(&bytes).map_err(|e| ApiError::bad_request(e.0))?;
    let model = req.model.as_str().to_owned();
    let chain = s
        .config
        .route(&model)
        .ok_or_else(|| ApiError::unknown_model(&model))?;
    if s.config.passthrough {
        return passthrough(s, &caller, &chain, &req, &bytes).await;
    }
    // A label names a run within the caller's tenant: the id this tenant was answered (sent
    // back as is), else a keyed hash of tenant and label (or opening).
    let label = headers.get("x-selfheal-run").and_then(|v| v.to_str().ok());
    let now = Instant::now();
    let (run, unnamed) = match label {
        Some(l) if s.runs.owned_by(l, &caller.tenant, now) => (l.to_owned(), None),
        _ => {
            let first = crate::runs::chat_first_call(&req.messages);
            let first = first.as_ref().map(|(i, n)| (i.as_str(), n.as_str()));
            let unnamed = (!crate::runs::names_its_run(label, first))
                .then(|| Arc::new(crate::runs::chat_opening(&req.messages)));
            (
                run_id(&s.run_key, &caller.tenant, label, &req.messages),
                unnamed,
            )
        }
    };
    let fallback = chain.get(1).map(|c| c.model.as_str());
    let redo = || crate::sharing::chat_redo(s, &bytes, fallback);
    let t = Turn {
        state: crate::sharing::load(s, &run, &caller.tenant, unnamed.is_none(), redo).await,
        s: s.clone(),
        caller,
        run: run.into(),
        unnamed,
    };
    let tools = s.tool_indexes.get(&req);
    let (verdict, newest_failed, next, answered) = rebuild_run(&t, &req, &tools, &model, &chain);
    if let Some((reason, action)) =
        stopping(next.stop.clone(), verdict.abort.clone(), newest_failed)
    {
        let render = |words: &str| stopped_completion(&t, &model, words);
        let frames = stream::answer_frames;
        let resp = stop_run(&t, (&reason, action), req.stream, render, frames);
        crate::sharing::save(s, &t.state).await;
        return Ok(resp);
    }
    let mut actions: Vec<String> = next.actions.iter().map(|a| a.as_str().to_owned()).collect();
    // The calls of the model's previous turn whose results it has: a new call identical to one
    // of them is its repetition, re-asked by the core's ladder like any unusable call.
    let mut applied = edit_request(&t, &req, &verdict, &next.guidance, &mut actions);
    applied.replaced = next.replaced;
    // The controller's escalation: this request goes to the chain's next target.
    let chain = if next.escalate && chain.len() > 1 {
        t.event(Kind::Escalate, json!({"to": chain[1].model}));
        chain[1..].to_vec()
    } else {
        chain
    };
    let tools_fwd = if applied.hidden.is_empty() {
        tools
    } else {
        let mut idx = (*tools).clone();
        idx.retain(|name, _| !applied.hidden.contains(name));
        Arc::new(idx)
    };
    let ctx = Call {
        chain,
        bytes: bytes.clone(),
        applied,
        tools: tools_fwd,
        answered: Arc::new(answered),
    };
    let learned = req.stream
        && !ctx.tools.is_empty()
        && ctx
            .chain
            .first()
            .is_some_and(|c| s.no_stream.contains(c, Instant::now()));
    let answer = if req.stream && !learned {
        answer_stream(&t, &req, ctx, actions).await
    } else {
        let answer = answer_complete(&t, &req, &ctx, actions).await;
        answer.map(|mut resp| {
            if learned {
                mark_no_stream(&mut resp, ctx.chain.first());
            }
            resp
        })
    };
    crate::sharing::save(s, &t.state).await;
    answer
}

/// Stage 4 (streaming): the upstream stream relayed, tool calls held and checked.
pub(crate) async fn answer_stream(
    t: &Turn,
    req: &ChatRequest<'_>,
    ctx: Call,
    mut actions: Vec<String>,
) -> Result<Response, ApiError> {
    let edits = ctx.applied.edits();
    let encode = |m: &str| {
        req.encode(
            &Edits {
                model: Some(m),
                ..edits
            },
            &ctx.bytes,
        )
    };
    let mut log = CallLog::default();
    let result = t.call(&ctx.chain, &encode, &send_op, &mut log).await;
    log_calls(t, &log, &mut actions);
    let upstream = result.map_err(|e| t.failed(e))?;
    let served = log.served.clone();
    let report = selfheal_report(&t.state, "complete", None, &actions);
    let hooks = stream::Hooks {
        reask: Some(stream_reask(t, &ctx)),
        reissue: Some(stream_reask(t, &ctx)),
        check: stream_check(t, req, &ctx),
        reread: Some(stream_reread(t, &ctx)),
        unsettled: Some(stream_unsettled(t)),
        // Set in the relay's task: the head waits for its first frame.
        head: None,
        budget: Some(stream_budget(t)),
        on_partial: t.s.config.server.on_partial,
    };
    let learnable = served.filter(|_| !ctx.tools.is_empty());
    let guides = t.s.guides.clone();
    Ok(
        relay_response(t, &actions, learnable, move |tx, head| async move {
            let hooks = stream::Hooks {
                head: Some(head),
                ..hooks
            };
            let r = stream::relay(
                upstream,
                ctx.tools.clone(),
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

/// What a whole chat answer is asked with: the turn, the client's request, what the pipeline
/// made of it, and the edits every request to the upstream carries.
#[derive(Clone, Copy)]
pub(crate) struct Asked<'a> {
    /// The turn.
    pub(crate) t: &'a Turn,
    /// The client's request.
    pub(crate) req: &'a ChatRequest<'a>,
    /// The call's context (chain, bytes, edits, tools, answered calls).
    pub(crate) ctx: &'a Call,
    /// The edits of every request sent upstream for this answer.
    pub(crate) edits: Edits<'a>,
}

impl Asked<'_> {
    /// The request for target model `m`, with `append` added as a last turn.
    fn encode(&self, m: &str, append: Option<&Value>) -> bytes::Bytes {
        self.req.encode(
            &Edits {
                model: Some(m),
                append,
                ..self.edits
            },
            &self.ctx.bytes,
        )
    }
}

/// Stages 4–6 (non-streaming): the upstream call, its tool calls checked (repaired in place or
/// re-asked once within the budget), the answer with its `selfheal` report — as SSE when the
/// client asked for a stream from a target learned not to stream tool calls ([`NoStream`](crate::state::NoStream)).
pub(crate) async fn answer_complete(
    t: &Turn,
    req: &ChatRequest<'_>,
    ctx: &Call,
    mut actions: Vec<String>,
) -> Result<Response, ApiError> {
    let edits = Edits {
        stream: req.stream.then_some(false),
        ..ctx.applied.edits()
    };
    let asked = Asked { t, req, ctx, edits };
    let encode = |m: &str| asked.encode(m, None);
    let mut log = CallLog::default();
    let result = t.call(&ctx.chain, &encode, &answer_op, &mut log).await;
    let mut answer = match result {
        Ok(a) => a,
        Err(e) => {
            log_calls(t, &log, &mut actions);
            return Err(t.failed(e));
        }
    };
    let unsettled = read_before_answering(asked, &mut answer, &mut actions, &mut log).await;
    if let Some(resp) = answer_plain(asked, &answer, unsettled.is_none(), &mut actions, &log) {
        return Ok(resp);
    }
    let completion = match answer.into_completion() {
        Ok(c) => c.body,
        Err(e) => {
            // Not reached: a plain answer passed the checks `parse_completion` makes.
            let e = ApiError::exhausted(vec![e.to_string()]);
            log_calls(t, &log, &mut actions);
            return Err(t.failed(e));
        }
    };
    let (completion, check, reasked) = reask_calls(asked, completion, &mut actions, &mut log).await;
    // A re-ask answered with a final answer: judged by the core as the first answer would be.
    let unsettled = if unsettled.is_none()
        && check.invalid.is_empty()
        && reasked
        && completion
            .pointer("/choices/0/message/tool_calls")
            .and_then(Value::as_array)
            .is_none_or(Vec::is_empty)
    {
        recover::unsettled(&lock(&t.state))
    } else {
        unsettled
    };
    log_calls(t, &log, &mut actions);
    answer_checked(asked, completion, &check, unsettled, actions)
}

/// Check: a final answer is judged by the core as its `finish` would judge the run: with a
/// failure open or unresolved it is `partial` (in-process such a run never reaches its answer;
/// the reason is returned). Otherwise the core's read before answering: the final answer of a
/// run that needed a recovery is held, and the model asked to read its unconfirmed values once
/// more first.
async fn read_before_answering(
    asked: Asked<'_>,
    answer: &mut answer::Answer,
    actions: &mut Vec<String>,
    log: &mut CallLog,
) -> Option<String> {
    let t = asked.t;
    if answer.calls_tools() {
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
    let again = |m: &str| asked.encode(m, Some(&extra));
    // The read is the model's to ask for. An upstream that fails, or a model that answers
    // again without the call, leaves the answer unread: it goes out `partial`, not claimed as
    // if the read had confirmed it.
    match t.call(&asked.ctx.chain, &again, &answer_op, log).await {
        Ok(a) if a.calls_tools() => {
            *answer = a;
            None
        }
        Ok(a) => {
            *answer = a;
            Some(format!("not read again before answering: {text}"))
        }
        Err(_) => Some(format!(
            "not read again before answering (the upstream failed): {text}"
        )),
    }
}

/// The common case: every tool call usable as written, the answer `settled`; the upstream's
/// bytes go back with the report spliced in (see `answer`). A call of a `grounded` tool is
/// judged against the conversation first, on the parsed path. `None` when the answer needs
/// that path (`actions` then untouched).
fn answer_plain(
    asked: Asked<'_>,
    answer: &answer::Answer,
    settled: bool,
    actions: &mut Vec<String>,
    log: &CallLog,
) -> Option<Response> {
    let (t, req, ctx) = (asked.t, asked.req, asked.ctx);
    let s = &t.s;
    let answer::Answer::Plain(plain) = answer else {
        return None;
    };
    let usable = !req.stream
        && settled
        && !(plain.called().next().is_none()
            && !ctx.tools.is_empty()
            && answer::may_write_calls(&plain.bytes))
        && plain.calls_usable(&ctx.tools, &s.guides)
        && !plain.repeats(&ctx.answered)
        && !plain
            .called()
            .any(|n| s.config.tools.get(n).is_some_and(|c| c.grounded));
    if !usable {
        return None;
    }
    let bytes = &plain.bytes;
    let mut plain_actions = actions.clone();
    call_actions(log, &mut plain_actions);
    let report = selfheal_report_bytes(&t.state, "complete", None, &plain_actions);
    let body = answer::with_report(bytes, &report, &t.caller.redactor)?;
    log_calls(t, log, actions);
    // Parsed only for a fresh run's first answer with calls (rare): its name.
    if t.unnamed.is_some()
        && plain.called().next().is_some()
        && let Ok(v) = serde_json::from_slice::<Value>(bytes)
    {
        adopt_first_call(t, completion_first_call(&v));
    }
    t.finish("complete");
    let mut resp = Response::new(Body::from(body));
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    add_headers(&mut resp, &t.run, "complete", actions, None);
    Some(resp)
}

/// Tool calls: repair in place, or re-ask as long as the policy's ladder says so, within the
/// budget (each re-ask climbs the ladder of the one failure: unusable calls). The last answer,
/// its check, and whether it was re-asked.
async fn reask_calls(
    asked: Asked<'_>,
    mut completion: Value,
    actions: &mut Vec<String>,
    log: &mut CallLog,
) -> (Value, heal::CallCheck, bool) {
    let (t, req, ctx) = (asked.t, asked.req, asked.ctx);
    let s = &t.s;
    let grounding = recover::Grounding {
        tools: &s.config.tools,
        messages: &req.messages,
    };
    let salvage = !req.tool_choice_none();
    let check_of = |completion: &mut Value| {
        check_completion(
            completion,
            &ctx.tools,
            &s.guides,
            &ctx.answered,
            grounding,
            salvage,
        )
    };
    let mut check = check_of(&mut completion);
    let mut ladder = ReaskState::default();
    let mut reasked = false;
    let mut chain: &[crate::config::Target] = &ctx.chain;
    while !check.invalid.is_empty() {
        let Some((next, escalate)) = reask_or_escalate(t, &check.invalid, ladder, &mut chain)
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
        t.event(Kind::Reask, json!({"problems": check.invalid}));
        let extra = reask_turn(&check.invalid);
        let again = |m: &str| asked.encode(m, Some(&extra));
        match t.call(chain, &again, &chat_op, log).await {
            Ok(c) => {
                completion = c.body;
                check = check_of(&mut completion);
            }
            Err(_) => break,
        }
    }
    (completion, check, reasked)
}

/// Answer: the checked completion with its `selfheal` report, its repairs recorded, and the
/// calls left out said in words (or an error the SDKs raise).
fn answer_checked(
    asked: Asked<'_>,
    mut completion: Value,
    check: &heal::CallCheck,
    unsettled: Option<String>,
    mut actions: Vec<String>,
) -> Result<Response, ApiError> {
    let t = asked.t;
    let s = &t.s;
    for name in &check.repaired {
        Metrics::inc(&s.metrics.repairs_total);
        t.event(Kind::Repair, json!({"tool": name}));
    }
    if !check.repaired.is_empty() {
        actions.push("repair".into());
    }
    if check.salvaged > 0 {
        // Tool calls written as text, taken as calls (issue 31).
        Metrics::inc(&s.metrics.repairs_total);
        t.event(Kind::Repair, json!({"salvaged": check.salvaged}));
        actions.push("salvage".into());
    }
    let (status, reason) = if !check.invalid.is_empty() {
        t.event(Kind::InvalidCall, json!({"problems": check.invalid}));
        ("partial", Some(heal::problems_text(&check.invalid)))
    } else if let Some(why) = unsettled {
        ("partial", Some(why))
    } else {
        ("complete", None)
    };
    // Every call left out: the answer says so in words, or is an error the SDKs raise.
    let calls_left = completion
        .pointer("/choices/0/message/tool_calls")
        .and_then(Value::as_array)
        .is_some_and(|c| !c.is_empty());
    if !check.invalid.is_empty() && !calls_left {
        let words = heal::left_out_text(&heal::problem_texts(&check.invalid));
        if s.config.server.on_partial == OnPartial::Error {
            return Ok(partial_error(
                t,
                "calls_left_out",
                &words,
                &actions,
                (status, reason.as_deref()),
            ));
        }
        if let Some(m) = completion.pointer_mut("/choices/0/message") {
            heal::say(m, &words);
        }
    }
    if let Some(o) = completion.as_object_mut() {
        o.insert(
            "selfheal".into(),
            selfheal_report(&t.state, status, reason.as_deref(), &actions),
        );
    }
    adopt_first_call(t, completion_first_call(&completion));
    t.caller.redactor.value(&mut completion);
    t.finish(status);
    let mut resp = if asked.req.stream {
        sse_response(Body::from_stream(futures_util::stream::iter(
            stream::answer_frames(&completion),
        )))
    } else {
        axum::Json(completion).into_response()
    };
    let reason = reason.map(|r| t.caller.redactor.text(&r).into_owned());
    add_headers(&mut resp, &t.run, status, &actions, reason.as_deref());
    Ok(resp)
}

/// A stopped run's answer as a chat completion: `words` as the assistant's message.
fn stopped_completion(t: &Turn, model: &str, words: &str) -> Value {
    json!({
        "id": format!("selfheal-{}", t.run),
        "object": "chat.completion",
        "created": unix_ms() / 1000,
        "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": words},
                     "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
    })
}
