//! The Responses API (`POST /v1/responses`): the handler, and the Responses-specific parse
//! (input items, tools, the first call) and render around the shared [`crate::pipeline`] —
//! whole answers and streamed ones (relayed by [`crate::responses_stream`]).

use crate::action::Action;
use crate::auth::{Caller, Credentials};
use crate::error::ApiError;
use crate::forward::{Forwarded, forward, responses_op};
use crate::heal::{self, ToolIndex};
use crate::http::sse_response;
use crate::layers::{Received, Refused};
use crate::metrics::Metrics;
use crate::pipeline::{
    AskStream, Turn, calls_check, grounding_check, record_decisions, relay_stream,
    remember_response, repeatable_out, say_in_output, stream_hooks,
};
use crate::pipeline::{Decided, Dialect, Naming, heal_turn, name_run};
use crate::recover;
use crate::report::tool_result_detail;
use crate::responses_stream;
use crate::state::{AppState, lock, unix_ms};
use crate::store::Kind;
use crate::upstream::{CallLog, UpstreamClient};
use crate::whole::{Plain, WholeDialect, ask_checked, heal_whole};
use axum::body::Body;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures_util::future::BoxFuture;
use selfheal_openai::ClientError;
use serde_json::{Value, json};
use std::sync::Arc;

/// `POST /v1/responses` (OpenAI's Responses API), healed like chat completions where the wire
/// allows: the run's upstream attempts go through the core's call plan (retries, the fallback
/// chain, breakers, the run's ledger); a non-streaming answer's `function_call` items are checked
/// against the request's `tools` through the same non-corrupting repair path, an unusable call is
/// re-asked when the policy allows it and is never forwarded, and the answer carries the
/// `selfheal` report. A streamed answer is healed as a chat stream is
/// ([`responses_stream`]): re-issued invisibly when it breaks before any content, its function
/// calls held until the end and checked, an error event after content.
///
/// Admitted, bounded and logged by the route's layers ([`crate::layers`]), as every API is
/// (issue 30: Responses requests were missing from the metrics).
pub(crate) async fn responses(
    State(s): State<Arc<AppState>>,
    caller: Caller,
    headers: HeaderMap,
    Received(bytes): Received,
) -> Result<Response, Refused> {
    if s.config.passthrough {
        return Ok(forward(&s, &caller, bytes, Forwarded::Responses).await?);
    }
    // Boxed, as the chat handler's turn ([`crate::dialect::chat::chat`]).
    Ok(Box::pin(responses_inner(&s, caller, &headers, bytes)).await?)
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
    /// The output limit set because the client set none (`[limits] default_max_tokens`).
    pub(crate) capped: Option<u32>,
}

/// Parse: the body read and checked to be a Responses request for a model the gateway routes.
pub(crate) fn parse_request(s: &Arc<AppState>, bytes: &[u8]) -> Result<Parsed, ApiError> {
    let mut req: serde_json::Map<String, Value> = serde_json::from_slice(bytes)
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
    // No output limit of the client's own: `[limits] default_max_tokens`, when set.
    let capped = s
        .config
        .limits
        .default_max_tokens
        .filter(|_| req.get("max_output_tokens").is_none_or(Value::is_null));
    if let Some(n) = capped {
        req.insert("max_output_tokens".into(), json!(n));
    }
    Ok(Parsed {
        req,
        model,
        chain,
        previous,
        conversation,
        capped,
    })
}

/// Opens the turn: the run named ([`name_run`], as on every API: the caller's label, else
/// the run that sent the answer continued, else the conversation and its first call, within the
/// caller's tenant) and loaded.
pub(crate) async fn open_turn(
    s: &Arc<AppState>,
    caller: Caller,
    headers: &HeaderMap,
    p: &Parsed,
) -> Turn {
    let req = &p.req;
    let naming = Naming {
        label: headers.get("x-selfheal-run").and_then(|v| v.to_str().ok()),
        conversation: p.conversation.as_deref(),
        previous: p.previous.as_deref(),
        first_call: responses_first_call(req),
    };
    let opening = || {
        let first_input = match req.get("input") {
            Some(Value::Array(items)) => items.first().map(Value::to_string),
            Some(v) => Some(v.to_string()),
            None => None,
        };
        let instructions = req.get("instructions").map(Value::to_string);
        [("instructions", instructions), ("input", first_input)]
            .into_iter()
            .filter_map(|(tag, v)| v.map(|v| (tag, v.into_bytes())))
            .collect()
    };
    let (run, unnamed) = name_run(s, &caller.tenant, &naming, opening).await;
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
    let (state, run) = crate::sharing::load(s, &run, &caller.tenant, unnamed.is_none(), redo).await;
    Turn {
        state,
        s: s.clone(),
        caller,
        run: run.into(),
        unnamed,
        capped: p.capped,
    }
}

/// What replaying the request's tool results into the run decided.
pub(crate) struct Replay {
    /// The monitor's verdict.
    pub(crate) verdict: selfheal_core::Verdict,
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
            max_wait_ms: s.config.limits.max_wait_ms,
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
    verdict: &selfheal_core::Verdict,
    directed: Vec<String>,
    mut tools: ToolIndex,
) -> (Vec<Action>, ToolIndex) {
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
        edited.push(Action::Guidance);
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
        edited.push(Action::Hide);
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
    bytes: Bytes,
) -> Result<Response, ApiError> {
    let parsed = parse_request(s, &bytes)?;
    let t = open_turn(s, caller, headers, &parsed).await;
    t.event(
        Kind::Request,
        json!({"model": parsed.model, "api": "responses", "tenant": t.caller.tenant}),
    );
    let d = ResponsesTurn {
        tools: responses_tools(&parsed.req),
        parsed,
        checks: Checks::default(),
    };
    heal_turn(&t, d).await
}

/// A Responses turn ([`Dialect`]): the parsed request, and what the pipeline makes of it.
struct ResponsesTurn {
    parsed: Parsed,
    tools: ToolIndex,
    /// What the answer's calls are checked against (after [`Dialect::edit`]).
    checks: Checks,
}

impl Dialect for ResponsesTurn {
    fn streaming(&self) -> bool {
        self.parsed.req.get("stream").and_then(Value::as_bool) == Some(true)
    }

    /// The tool results in `input` replayed ([`replay_input`]), and the controller's repaired
    /// results put in place of their `function_call_output`, as the chat path does.
    fn replay(&mut self, t: &Turn) -> Decided {
        let Replay {
            verdict,
            replayed,
            next,
            answered,
        } = replay_input(t, &self.parsed, &self.tools);
        replace_outputs(&mut self.parsed.req, &next.replaced);
        let newest_failed = replayed.last().is_some_and(|r| r.outcome.failed());
        Decided {
            verdict,
            newest_failed,
            next,
            answered,
        }
    }

    fn stopped(&self, t: &Turn, words: &str) -> Value {
        stopped_response(t, &self.parsed.model, words)
    }

    fn frames(answer: &Value) -> Vec<crate::stream::Frame> {
        responses_stream::answer_frames(answer)
    }

    /// The guidance joins `instructions`, hidden tools leave `tools` ([`edit_input`]); grounded
    /// tools' calls are judged against what the request holds.
    fn edit(&mut self, t: &Turn, decided: Decided, actions: &mut Vec<Action>) {
        let tools = std::mem::take(&mut self.tools);
        let req = &mut self.parsed.req;
        let guidance = decided.next.guidance;
        let (edited, tools) = edit_input(t, req, &decided.verdict, guidance, tools);
        actions.extend(edited);
        let evidence = recover::responses_evidence(&t.s.config.tools, req, &tools).map(Arc::new);
        self.checks = Checks {
            answered: Arc::new(decided.answered),
            evidence,
        };
        self.tools = tools;
    }

    fn chain(&self) -> &[crate::config::Target] {
        &self.parsed.chain
    }

    fn set_chain(&mut self, chain: Vec<crate::config::Target>) {
        self.parsed.chain = chain;
    }

    fn tools(&self) -> &ToolIndex {
        &self.tools
    }

    async fn stream(self, t: &Turn, actions: Vec<Action>) -> Result<Response, ApiError> {
        let Parsed { req, chain, .. } = self.parsed;
        answer_responses_stream(t, req, chain, self.tools, self.checks, actions).await
    }

    async fn whole(
        mut self,
        t: &Turn,
        actions: Vec<Action>,
        learned: bool,
    ) -> Result<Response, ApiError> {
        if learned {
            self.parsed.req.insert("stream".into(), Value::Bool(false));
        }
        let asked = Asked {
            t,
            req: &self.parsed.req,
            chain: &self.parsed.chain,
            tools: &self.tools,
            checks: &self.checks,
            learned,
        };
        heal_whole(&asked, actions).await
    }
}

/// What a whole (not streamed) Responses answer is asked with.
#[derive(Clone, Copy)]
pub(crate) struct Asked<'a> {
    /// The turn.
    pub(crate) t: &'a Turn,
    /// The edited request.
    pub(crate) req: &'a serde_json::Map<String, Value>,
    /// The targets to ask, in order.
    pub(crate) chain: &'a [crate::config::Target],
    /// The tools on offer.
    pub(crate) tools: &'a ToolIndex,
    /// What the answer's calls are checked against.
    pub(crate) checks: &'a Checks,
    /// The target was learned not to stream tool calls: the answer goes out as the events a
    /// stream would have carried.
    pub(crate) learned: bool,
}

impl Asked<'_> {
    /// Asks along `chain` without streaming, `extra` appended to the input.
    async fn call(
        &self,
        chain: &[crate::config::Target],
        extra: Option<&Value>,
        log: &mut CallLog,
    ) -> Result<Value, ApiError> {
        let encode = |m: &str| encode_responses(self.req, m, extra);
        self.t.call(chain, &encode, &responses_json_op, log).await
    }
}

impl WholeDialect for Asked<'_> {
    type First = Value;

    fn turn(&self) -> &Turn {
        self.t
    }

    fn chain(&self) -> &[crate::config::Target] {
        self.chain
    }

    async fn ask_first(&self, extra: Option<&Value>, log: &mut CallLog) -> Result<Value, ApiError> {
        self.call(self.chain, extra, log).await
    }

    fn first_calls_tools(first: &Value) -> bool {
        responses_calls(first)
    }

    fn plain(
        &self,
        first: Value,
        _: bool,
        _: &mut Vec<Action>,
        _: &CallLog,
    ) -> Result<Plain, ApiError> {
        Ok(Plain::Parsed(first))
    }

    async fn ask(
        &self,
        chain: &[crate::config::Target],
        extra: Option<&Value>,
        log: &mut CallLog,
    ) -> Result<Value, ApiError> {
        self.call(chain, extra, log).await
    }

    fn evidence(&self) -> Option<Vec<Value>> {
        (!self.tools.is_empty()).then(|| recover::responses_texts(self.req))
    }

    fn may_call(&self) -> bool {
        salvage_on(self.req)
    }

    fn first_text(first: &Value) -> Option<String> {
        Self::text(first)
    }

    fn text(answer: &Value) -> Option<String> {
        responses_stream::output_text(answer)
    }

    fn check(&self, answer: &mut Value) -> heal::CallCheck {
        let evidence = self.checks.evidence.as_deref().map(Vec::as_slice);
        let answered = &self.checks.answered;
        let salvage = salvage_on(self.req);
        check_responses_answer(&self.t.s, answer, (self.tools, salvage), answered, evidence)
    }

    fn calls_tools(answer: &Value) -> bool {
        responses_calls(answer)
    }

    fn say(answer: &mut Value, words: &str) {
        say_in_output(answer, words);
    }

    fn seal(&self, answer: &mut Value) {
        self.t.caller.redactor.value(answer);
        remember_response(self.t, crate::runs::Responded::of(answer));
    }

    fn render(&self, answer: Value) -> Response {
        if self.learned {
            let frames = responses_stream::answer_frames(&answer);
            sse_response(Body::from_stream(futures_util::stream::iter(frames)))
        } else {
            axum::Json(answer).into_response()
        }
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
    actions: Vec<Action>,
) -> Result<Response, ApiError> {
    let again = ResponsesAgain {
        t: t.clone(),
        req: Arc::new(req),
        chain: Arc::new(chain),
        tools: Arc::new(tools),
        checks,
    };
    let encode = |m: &str| encode_responses(&again.req, m, None);
    let grounded = again.checks.evidence.clone().map(|e| grounding_check(t, e));
    let check = calls_check(again.checks.answered.clone(), grounded);
    let mut hooks = stream_hooks(t, &again, check);
    hooks.salvage = salvage_on(&again.req);
    let may_call = salvage_on(&again.req);
    hooks.grounding = (!again.tools.is_empty()).then(|| {
        crate::pipeline::grounding_hook(t, recover::responses_texts(&again.req), may_call)
    });
    let on = (&again.chain[..], &encode as crate::pipeline::Encode<'_>);
    let op = &responses_op;
    relay_stream::<responses_stream::Responses>(t, on, op, again.tools.clone(), hooks, actions)
        .await
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
#[derive(Clone, Default)]
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
/// answer's ([`check_completion`](crate::pipeline::check_completion)). First, when `salvage`
/// (the request did not set `tool_choice: "none"`), calls of offered tools written as text in
/// its message become `function_call` items ([`heal::salvage_output_calls`]); a text that looks
/// like a call but cannot be taken is re-asked.
pub(crate) fn check_responses_answer(
    s: &AppState,
    answer: &mut Value,
    (tools, salvage): (&ToolIndex, bool),
    answered: &heal::Answered,
    evidence: Option<&[Value]>,
) -> heal::CallCheck {
    let none = ToolIndex::new();
    let salvaged = match heal::salvage_output_calls(answer, if salvage { tools } else { &none }) {
        heal::Salvage::None => 0,
        heal::Salvage::Taken(n) => n,
        heal::Salvage::Doubt(problem) => {
            return heal::CallCheck {
                invalid: vec![problem],
                ..heal::CallCheck::default()
            };
        }
    };
    let mut check = responses_stream::check_response(answer, tools, &s.guides);
    check.salvaged = salvaged;
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

impl AskStream for ResponsesAgain {
    type Answer = responses_stream::Reanswered;

    fn turn(&self) -> &Turn {
        &self.t
    }

    fn chain(&self) -> &[crate::config::Target] {
        &self.chain
    }

    /// Asked as a whole answer is ([`Asked`]), without streaming.
    fn ask_once<'a>(
        &'a self,
        chain: &'a [crate::config::Target],
        extra: Option<Value>,
    ) -> BoxFuture<'a, Option<Result<Self::Answer, Vec<heal::Problem>>>> {
        Box::pin(async move {
            let mut req = (*self.req).clone();
            req.insert("stream".into(), Value::Bool(false));
            let asked = Asked {
                t: &self.t,
                req: &req,
                chain: &self.chain,
                tools: &self.tools,
                checks: &self.checks,
                learned: false,
            };
            let again = ask_checked(&asked, chain, extra.as_ref()).await?;
            Some(
                again.map(|(response, repaired)| responses_stream::Reanswered {
                    response,
                    repaired,
                }),
            )
        })
    }

    fn calls_tools(answer: &Self::Answer) -> bool {
        responses_calls(&answer.response)
    }
}

/// Whether calls written as text may be taken as calls for this request: it did not set
/// `tool_choice: "none"`.
pub(crate) fn salvage_on(req: &serde_json::Map<String, Value>) -> bool {
    req.get("tool_choice").and_then(Value::as_str) != Some("none")
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
