//! The chat completions API (`POST /v1/chat/completions`): the handler, and the chat-specific
//! parse and render around the shared [`crate::pipeline`] — the whole answer (with its checks,
//! re-asks and read before answering) and the streamed one (relayed by [`crate::stream`]).

use crate::action::Action;
use crate::answer;
use crate::auth::Caller;
use crate::error::ApiError;
use crate::forward::passthrough;
use crate::heal::{self};
use crate::http::sse_response;
use crate::layers::{Received, Refused, RunLabel};
use crate::pipeline::{
    AskStream, Call, Turn, adopt_first_call, answer_op, chat_op, check_completion,
    completion_first_call, edit_request, log_calls, rebuild_run, relay_stream, send_op,
    stream_check, stream_hooks,
};
use crate::pipeline::{Decided, Dialect, Naming, heal_turn, name_run};
use crate::recover;
use crate::report::{Status, add_headers, call_actions, selfheal_report_bytes};
use crate::request::{ChatRequest, Edits};
use crate::state::{AppState, unix_ms};
use crate::stream;
use crate::upstream::CallLog;
use crate::whole::{Plain, WholeDialect, ask_checked, heal_whole};
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use futures_util::future::BoxFuture;
use selfheal_openai::At;
use serde_json::{Value, json};
use std::sync::Arc;

/// `POST /v1/chat/completions`: the healing pipeline's one entry, which the Messages dialect
/// ([`crate::dialect::messages`]) enters too, with the chat request it translated.
/// Admitted, bounded and logged by the route's layers ([`crate::layers`]): parse → `heal_turn`
/// → render.
pub(crate) async fn chat(
    State(s): State<Arc<AppState>>,
    caller: Caller,
    label: RunLabel,
    Received(bytes): Received,
) -> Result<Response, Refused> {
    // Boxed: the turn's future is large (every stage of the pipeline, streamed and whole), and
    // the route's service wrappers move the handler's future by value, a copy of all of it
    // each; boxed here, they move a pointer.
    Ok(Box::pin(chat_inner(&s, caller, label.as_str(), bytes)).await?)
}

/// A chat completions request, `bytes`, of an admitted `caller` who labelled its run `label`
/// (`x-selfheal-run`): parsed, its run named, healed.
pub(crate) async fn chat_inner(
    s: &Arc<AppState>,
    caller: Caller,
    label: Option<&str>,
    bytes: bytes::Bytes,
) -> Result<Response, ApiError> {
    let (bytes, capped) = capped_body(s, bytes)?;
    let req = ChatRequest::parse(&bytes).map_err(|e| ApiError::bad_request(e.0))?;
    let model = req.model.as_str().to_owned();
    let chain = s
        .config
        .route(&model)
        .ok_or_else(|| ApiError::unknown_model(&model))?;
    if s.config.passthrough {
        return passthrough(s, &caller, &chain, &req, &bytes).await;
    }
    let first = crate::runs::chat_first_call(&req.messages);
    let naming = Naming {
        label,
        conversation: None,
        previous: None,
        first_call: first.as_ref().map(|(i, n)| (i.as_str(), n.as_str())),
    };
    let opening = || crate::runs::chat_opening(&req.messages);
    let (run, unnamed) = name_run(s, &caller.tenant, &naming, opening).await;
    let fallback = chain.get(1).map(|c| c.model.as_str());
    let redo = || crate::sharing::chat_redo(s, &bytes, fallback);
    let (state, run) = crate::sharing::load(s, &run, &caller.tenant, unnamed.is_none(), redo).await;
    let t = Turn {
        state,
        s: s.clone(),
        caller,
        run: run.into(),
        unnamed,
        capped,
    };
    let d = ChatTurn {
        req: &req,
        bytes: &bytes,
        model: &model,
        tools: s.tool_indexes.get(&req),
        chain,
        applied: heal::Applied::default(),
        answered: Arc::default(),
    };
    heal_turn(&t, d).await
}

/// The body with `[limits] default_max_tokens` set as its `max_tokens` when the client set no
/// output limit (neither `max_tokens` nor `max_completion_tokens`), and the limit set; the body
/// as it came otherwise (no limit configured, the client's own, or passthrough).
fn capped_body(s: &AppState, bytes: bytes::Bytes) -> Result<(bytes::Bytes, Option<u32>), ApiError> {
    let Some(n) = s
        .config
        .limits
        .default_max_tokens
        .filter(|_| !s.config.passthrough)
    else {
        return Ok((bytes, None));
    };
    let req = ChatRequest::parse(&bytes).map_err(|e| ApiError::bad_request(e.0))?;
    if req.sets_output_limit() {
        return Ok((bytes, None));
    }
    Ok((crate::request::with_max_tokens(&bytes, n), Some(n)))
}

/// A chat completions turn ([`Dialect`]): the parsed request, and what the pipeline makes of it.
struct ChatTurn<'a> {
    req: &'a ChatRequest<'a>,
    bytes: &'a bytes::Bytes,
    model: &'a str,
    chain: Vec<crate::config::Target>,
    tools: Arc<heal::ToolIndex>,
    /// What the edit changed in the request.
    applied: heal::Applied,
    /// The calls of the model's previous turn whose results it has: a new call identical to one
    /// of them is its repetition, re-asked by the core's ladder like any unusable call.
    answered: Arc<heal::Answered>,
}

impl ChatTurn<'_> {
    /// The call's context: what the answer is asked with.
    fn call(self) -> Call {
        Call {
            chain: self.chain,
            bytes: self.bytes.clone(),
            applied: self.applied,
            tools: self.tools,
            answered: self.answered,
        }
    }
}

impl Dialect for ChatTurn<'_> {
    fn streaming(&self) -> bool {
        self.req.stream
    }

    fn replay(&mut self, t: &Turn) -> Decided {
        let (verdict, newest_failed, next, answered) =
            rebuild_run(t, self.req, &self.tools, self.model, &self.chain);
        Decided {
            verdict,
            newest_failed,
            next,
            answered,
        }
    }

    fn stopped(&self, t: &Turn, words: &str) -> Value {
        stopped_completion(t, self.model, words)
    }

    fn frames(answer: &Value) -> Vec<stream::Frame> {
        stream::answer_frames(answer)
    }

    fn edit(&mut self, t: &Turn, decided: Decided, actions: &mut Vec<Action>) {
        let guidance = &decided.next.guidance;
        let mut applied = edit_request(t, self.req, &decided.verdict, guidance, actions);
        applied.replaced = decided.next.replaced;
        if !applied.hidden.is_empty() {
            let mut idx = (*self.tools).clone();
            idx.retain(|name, _| !applied.hidden.contains(name));
            self.tools = Arc::new(idx);
        }
        self.applied = applied;
        self.answered = Arc::new(decided.answered);
    }

    fn chain(&self) -> &[crate::config::Target] {
        &self.chain
    }

    fn set_chain(&mut self, chain: Vec<crate::config::Target>) {
        self.chain = chain;
    }

    fn tools(&self) -> &heal::ToolIndex {
        &self.tools
    }

    async fn stream(self, t: &Turn, actions: Vec<Action>) -> Result<Response, ApiError> {
        let req = self.req;
        answer_stream(t, req, self.call(), actions).await
    }

    async fn whole(self, t: &Turn, actions: Vec<Action>, _: bool) -> Result<Response, ApiError> {
        let req = self.req;
        answer_complete(t, req, &self.call(), actions).await
    }
}

/// Stage 4 (streaming): the upstream stream relayed in the chat grammar, tool calls held and
/// checked ([`relay_stream`]).
pub(crate) async fn answer_stream(
    t: &Turn,
    req: &ChatRequest<'_>,
    ctx: Call,
    actions: Vec<Action>,
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
    let check = stream_check(t, req, &ctx);
    let again = ChatAgain {
        t: t.clone(),
        ctx: ctx.clone(),
    };
    let mut hooks = stream_hooks(t, &again, check);
    hooks.salvage = !req.tool_choice_none();
    let grounding = recover::Grounding {
        tools: &t.s.config.tools,
        messages: &req.messages,
    };
    hooks.grounding = (!ctx.tools.is_empty())
        .then(|| crate::pipeline::grounding_hook(t, grounding.evidence(), !req.tool_choice_none()));
    let (chain, tools) = (&ctx.chain, ctx.tools.clone());
    relay_stream::<stream::Chat>(t, (chain, &encode), &send_op, tools, hooks, actions).await
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

/// Stages 4–6 (non-streaming): the whole answer ([`heal_whole`]) — as SSE when the client asked
/// for a stream from a target learned not to stream tool calls
/// ([`NoStream`](crate::state::NoStream)).
pub(crate) async fn answer_complete(
    t: &Turn,
    req: &ChatRequest<'_>,
    ctx: &Call,
    actions: Vec<Action>,
) -> Result<Response, ApiError> {
    let edits = Edits {
        stream: req.stream.then_some(false),
        ..ctx.applied.edits()
    };
    heal_whole(&Asked { t, req, ctx, edits }, actions).await
}

impl WholeDialect for Asked<'_> {
    type First = answer::Answer;

    fn turn(&self) -> &Turn {
        self.t
    }

    fn chain(&self) -> &[crate::config::Target] {
        &self.ctx.chain
    }

    async fn ask_first(
        &self,
        extra: Option<&Value>,
        log: &mut CallLog,
    ) -> Result<answer::Answer, ApiError> {
        let encode = |m: &str| self.encode(m, extra);
        self.t.call(&self.ctx.chain, &encode, &answer_op, log).await
    }

    fn first_calls_tools(first: &answer::Answer) -> bool {
        first.calls_tools()
    }

    fn plain(
        &self,
        first: answer::Answer,
        settled: bool,
        actions: &mut Vec<Action>,
        log: &CallLog,
    ) -> Result<Plain, ApiError> {
        if let Some(resp) = answer_plain(*self, &first, settled, actions, log) {
            return Ok(Plain::Answered(resp));
        }
        // Not failing: a plain answer passed the checks `parse_completion` makes.
        let c = first.into_completion();
        c.map(|c| Plain::Parsed(c.body))
            .map_err(|e| ApiError::exhausted(vec![e.to_string()]))
    }

    async fn ask(
        &self,
        chain: &[crate::config::Target],
        extra: Option<&Value>,
        log: &mut CallLog,
    ) -> Result<Value, ApiError> {
        let again = |m: &str| self.encode(m, extra);
        Ok(self.t.call(chain, &again, &chat_op, log).await?.body)
    }

    fn evidence(&self) -> Option<Vec<Value>> {
        let grounding = recover::Grounding {
            tools: &self.t.s.config.tools,
            messages: &self.req.messages,
        };
        (!self.ctx.tools.is_empty()).then(|| grounding.evidence())
    }

    fn may_call(&self) -> bool {
        !self.req.tool_choice_none()
    }

    fn first_text(first: &answer::Answer) -> Option<String> {
        match first {
            answer::Answer::Plain(p) => serde_json::from_slice::<Value>(&p.bytes)
                .ok()
                .as_ref()
                .and_then(Self::text),
            answer::Answer::Parsed(c) => Self::text(&c.body),
        }
    }

    fn text(completion: &Value) -> Option<String> {
        completion
            .pointer("/choices/0/message/content")
            .and_then(Value::as_str)
            .map(str::to_owned)
    }

    fn check(&self, completion: &mut Value) -> heal::CallCheck {
        let (s, req, ctx) = (&self.t.s, self.req, self.ctx);
        let grounding = recover::Grounding {
            tools: &s.config.tools,
            messages: &req.messages,
        };
        let salvage = !req.tool_choice_none();
        let (tools, answered) = (&ctx.tools, &ctx.answered);
        check_completion(completion, tools, &s.guides, answered, grounding, salvage)
    }

    fn calls_tools(completion: &Value) -> bool {
        completion
            .pointer("/choices/0/message/tool_calls")
            .and_then(Value::as_array)
            .is_some_and(|c| !c.is_empty())
    }

    fn say(completion: &mut Value, words: &str) {
        if let Some(m) = completion.pointer_mut("/choices/0/message") {
            heal::say(m, words);
        }
    }

    fn seal(&self, completion: &mut Value) {
        adopt_first_call(self.t, completion_first_call(completion));
        self.t.caller.redactor.value(completion);
    }

    fn render(&self, completion: Value) -> Response {
        if self.req.stream {
            let frames = stream::answer_frames(&completion);
            sse_response(Body::from_stream(futures_util::stream::iter(frames)))
        } else {
            axum::Json(completion).into_response()
        }
    }
}

/// A chat stream's second asking ([`AskStream`]): the turn and the call's context, owned (it
/// runs in the relay's task).
#[derive(Clone)]
pub(crate) struct ChatAgain {
    /// The turn.
    pub(crate) t: Turn,
    /// The call's context (chain, bytes, edits, tools, answered calls).
    pub(crate) ctx: Call,
}

impl AskStream for ChatAgain {
    type Answer = stream::Reasked;

    fn turn(&self) -> &Turn {
        &self.t
    }

    fn chain(&self) -> &[crate::config::Target] {
        &self.ctx.chain
    }

    /// Asked as a whole answer is ([`Asked`]), without streaming: its answer is whole, so
    /// calls written as text are taken here as on the non-streaming path.
    fn ask_once<'a>(
        &'a self,
        chain: &'a [crate::config::Target],
        extra: Option<Value>,
    ) -> BoxFuture<'a, Option<Result<stream::Reasked, Vec<heal::Problem>>>> {
        Box::pin(async move {
            let (t, ctx) = (&self.t, &self.ctx);
            let req = ChatRequest::parse(&ctx.bytes).ok()?;
            let edits = Edits {
                stream: Some(false),
                ..ctx.applied.edits()
            };
            let asked = Asked {
                t,
                req: &req,
                ctx,
                edits,
            };
            let (body, repaired) = match ask_checked(&asked, chain, extra.as_ref()).await? {
                Ok(a) => a,
                Err(problems) => return Some(Err(problems)),
            };
            Some(Ok(stream::Reasked {
                message: body.at("/choices/0/message").cloned()?,
                finish_reason: body
                    .at("/choices/0/finish_reason")
                    .cloned()
                    .unwrap_or_else(|| json!("stop")),
                repaired,
            }))
        })
    }

    fn calls_tools(answer: &stream::Reasked) -> bool {
        stream::calls_tools(&answer.message)
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
    actions: &mut Vec<Action>,
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
    let report = selfheal_report_bytes(&t.state, Status::Complete, None, &plain_actions);
    let body = answer::with_report(bytes, &report, &t.caller.redactor)?;
    log_calls(t, log, actions);
    // Parsed only for a fresh run's first answer with calls (rare): its name.
    if t.unnamed.is_some()
        && plain.called().next().is_some()
        && let Ok(v) = serde_json::from_slice::<Value>(bytes)
    {
        adopt_first_call(t, completion_first_call(&v));
    }
    t.finish(Status::Complete);
    let mut resp = Response::new(Body::from(body));
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    add_headers(&mut resp, &t.id(), Status::Complete, actions, None);
    Some(resp)
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
