//! The plain agent client: it sends the conversation to the gateway, executes whatever tool
//! calls come back, and stops at the first answer without tool calls.
//!
//! It is what most agent loops are, and no more: no retries, no repair, no checks of its own.
//! Tool failures go back to the model as `Error: ...` text; the turn limit ([`MaxTurns`]) is the
//! only bound it keeps. Whatever healing happens is the gateway's.

use std::future::Future;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::sync::mpsc;

use selfheal_bench::TaskSpec;

use crate::endpoint::Msg;
use crate::world::World;

/// The agent's turn limit: requests it sends before it gives up on an episode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct MaxTurns(pub u32);

impl MaxTurns {
    /// `2·(R + 2)` requests per step of a plan of `steps` steps: room for the gateway's own
    /// recoveries at every step, each of which may be followed by a cross-check call — never
    /// the reason an episode that heals ends early.
    pub(crate) fn for_plan(steps: usize, budget: u32) -> MaxTurns {
        MaxTurns(
            u32::try_from(steps)
                .unwrap_or(u32::MAX)
                .saturating_mul(budget.saturating_add(2).saturating_mul(2)),
        )
    }
}

/// How one episode ended, as the client saw it.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Ended {
    /// The answer, when the last message was JSON and the gateway called the run complete.
    pub answer: Option<Value>,
    /// The last message's text.
    pub content: Option<String>,
    /// The gateway's `selfheal.status` on the last answer.
    pub status: Option<String>,
    /// Requests sent to the gateway.
    pub turns: u32,
    /// The turn limit ended the episode.
    pub capped: bool,
    /// The gateway answered an error (its message).
    pub error: Option<String>,
    /// Recovery actions the gateway charged to the run's ledger (`selfheal.budget.spent`).
    pub recoveries: u64,
    /// Every action the gateway reported, answer by answer (`selfheal.actions`).
    pub actions: Vec<String>,
    /// The conversation after the task prompt, the final message included.
    pub transcript: Vec<Value>,
}

/// Why a request did not come back.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The HTTP request failed (connection, timeout, body).
    #[error("request to the gateway failed: {0}")]
    Http(#[from] reqwest::Error),
    /// The model endpoint stopped while a request was waiting on it.
    #[error("the scripted model's endpoint stopped")]
    EndpointGone,
}

/// The client's HTTP side.
#[derive(Debug, Clone)]
pub(crate) struct Client {
    http: reqwest::Client,
    url: String,
}

/// The boolean argument with which a tool that stamps its data (`freshness` in the task file)
/// bypasses its cache: the world's refresh ([`crate::world::World::execute`]).
pub(crate) const REFRESH_ARGUMENT: &str = "refresh";

/// The model name the client asks for (the gateway routes it to the scripted model).
pub(crate) const MODEL: &str = "bench-model";

impl Client {
    /// A client of the gateway at `base_url` (up to `/v1`), each request bounded by `timeout`.
    pub(crate) fn new(base_url: &str, timeout: Duration) -> Result<Client, ClientError> {
        Ok(Client {
            http: reqwest::Client::builder().timeout(timeout).build()?,
            url: format!("{}/chat/completions", base_url.trim_end_matches('/')),
        })
    }

    /// Runs one episode: the conversation goes through the gateway until an answer without tool
    /// calls, an error, or the turn limit. While a request is out, the model's requests that
    /// arrive on `asks` are answered from `world`.
    pub(crate) async fn run(
        &self,
        world: &mut World<'_>,
        asks: &mut mpsc::Receiver<Msg>,
        task: &TaskSpec,
        run: &str,
        max: MaxTurns,
    ) -> Result<Ended, ClientError> {
        let tools = offered_tools(task);
        let mut messages = vec![
            json!({"role": "system", "content": "You are an agent. Use the tools to complete the task, then reply with the answer only."}),
            json!({"role": "user", "content": task_prompt(task)}),
        ];
        let mut ended = Ended::default();
        loop {
            if ended.turns >= max.0 {
                ended.capped = true;
                ended.transcript = messages.split_off(2);
                return Ok(ended);
            }
            ended.turns += 1;
            let body = json!({"model": MODEL, "messages": messages, "tools": tools});
            let send = self
                .http
                .post(&self.url)
                .header("x-selfheal-run", run)
                .json(&body)
                .send();
            let answer = serve_while(world, asks, async {
                let resp = send.await?;
                resp.json::<Value>().await
            })
            .await?;
            if let Some(e) = answer.get("error") {
                ended.transcript = messages.split_off(2);
                ended.transcript.push(answer.clone());
                ended.error = Some(
                    e.get("message")
                        .and_then(Value::as_str)
                        .unwrap_or("error")
                        .to_owned(),
                );
                return Ok(ended);
            }
            let report = answer.get("selfheal");
            ended.status = report
                .and_then(|r| r.get("status"))
                .and_then(Value::as_str)
                .map(str::to_owned);
            ended.recoveries = report
                .and_then(|r| r.pointer("/budget/spent/recoveries"))
                .and_then(Value::as_u64)
                .unwrap_or(ended.recoveries);
            ended.actions.extend(
                report
                    .and_then(|r| r.get("actions"))
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                    .filter_map(Value::as_str)
                    .map(str::to_owned),
            );
            let message = answer
                .pointer("/choices/0/message")
                .cloned()
                .unwrap_or(Value::Null);
            let calls: Vec<Value> = message
                .get("tool_calls")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            if calls.is_empty() {
                let content = message
                    .get("content")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_owned();
                if ended.status.as_deref() == Some("complete") {
                    ended.answer = serde_json::from_str(&content).ok();
                }
                ended.content = Some(content);
                ended.transcript = messages.split_off(2);
                ended.transcript.push(answer);
                return Ok(ended);
            }
            messages.push(message);
            for c in &calls {
                let id = c.get("id").and_then(Value::as_str).unwrap_or("");
                let name = c.pointer("/function/name").and_then(Value::as_str);
                let args = c.pointer("/function/arguments").and_then(Value::as_str);
                let out = world.execute(id, name.unwrap_or(""), args.unwrap_or(""));
                messages.push(json!({"role": "tool", "tool_call_id": id, "content": out}));
            }
        }
    }
}

/// The task as the user states it: the task's user message(s) (`Plan::prompt`), what the
/// in-process client holds as well; the calls that use its values are the model's to write.
pub(crate) fn task_prompt(task: &TaskSpec) -> String {
    // The user's own words, as in-process: never the plan's values, which a real client
    // does not have.
    if task.plan.prompt.is_empty() {
        format!("Task {}: {}", task.id, task.name)
    } else {
        task.plan.prompt.join("\n")
    }
}

/// The tools the agent offers: every tool of the plan and its substitute, with their schemas
/// (a tool that stamps its data takes the optional [`REFRESH_ARGUMENT`] too).
pub(crate) fn offered_tools(task: &TaskSpec) -> Vec<Value> {
    let mut out = Vec::new();
    for t in &task.plan.tools {
        let mut schema = t.schema();
        if t.freshness
            && let Some(props) = schema.get_mut("properties").and_then(Value::as_object_mut)
        {
            props.insert(
                REFRESH_ARGUMENT.into(),
                json!({"type": "boolean", "description": "bypass the cache"}),
            );
        }
        out.push(json!({"type": "function", "function": {
            "name": t.name, "description": t.description, "parameters": schema}}));
        if let Some(sub) = &t.substitute {
            out.push(json!({"type": "function", "function": {
                "name": sub, "description": format!("Backup source. {}", t.description),
                "parameters": schema}}));
        }
    }
    out
}

/// Awaits `request` while answering the model's requests from `world`.
async fn serve_while<T>(
    world: &mut World<'_>,
    asks: &mut mpsc::Receiver<Msg>,
    request: impl Future<Output = Result<T, reqwest::Error>>,
) -> Result<T, ClientError> {
    let mut request = std::pin::pin!(request);
    loop {
        tokio::select! {
            r = &mut request => return Ok(r?),
            msg = asks.recv() => match msg {
                Some(Msg::Ask(ask)) => {
                    let n = world.model.asks() + 1;
                    let answer = world.answer(&ask.body).upstream(n);
                    // The gateway may have given up on this request; nothing to do then.
                    let _ = ask.reply.send(answer);
                }
                // The gateway held the request: the wait passes on the episode's clock, before
                // the model call it preceded (the same channel keeps the order).
                Some(Msg::Wait(ms)) => world.ep.wait(ms),
                None => return Err(ClientError::EndpointGone),
            },
        }
    }
}
