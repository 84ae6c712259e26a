//! The scripted model: the benchmark's model, answering chat completions.
//!
//! Why it exists: to run the benchmark through `selfheal serve`, something has to sit behind the
//! gateway as its upstream and write the episode's tool calls. That is the benchmark's model — the
//! same [`Episode::write`] the in-process strategies call, so the scheduled agent-side faults
//! (broken or wrong arguments, wrong tools, skipped steps, repetitions) come out the same way and
//! a transient one clears after the same number of writes.
//!
//! The model knows the plan (as the benchmark's model does) and reads only what is in the
//! request it is sent: the tool results in the conversation, the tools on offer, the gateway's
//! guidance (a `[selfheal] ...` system message) and its re-ask turns. It makes no recovery
//! decision of its own; what it does after a failure is what the gateway told it, as the
//! benchmark's model does what the controller tells it in-process:
//!
//! | the gateway, on the wire | the model | in-process equivalent |
//! |---|---|---|
//! | a re-ask turn (the call it wrote could not be used) | writes the step's call again | repair of arguments / tool choice |
//! | a re-ask of a call that left a required argument empty | replans and goes back to the first step it has no output for | replan on a missing input |
//! | the step's tool left out of `tools` (circuit open) | calls the step's substitute | substitute |
//! | guidance that the step's tool keeps failing | calls the step's substitute (a result of that tool it has just read is not used) | substitute |
//! | guidance that the last call repeated an earlier one, when it repeated an earlier step's call | drops that result, writes the step again | repetition detected |
//! | the same guidance when it repeated its own call of this step, or guidance about a loop | calls the step's substitute | substitute |
//! | guidance about empty inputs or a loop, when its last call had an empty required argument | replans and goes back to the first step it has no output for | replan on a missing input |
//! | the controller's retry (`` `tool` failed (class): call it again ``) | resends the step's call as it was written (no new model call); a step whose value two sources disagreed on is fetched again | retry |
//! | the controller's refresh (`` `tool` failed (class): call it again with the same arguments and `arg` set to true ``) | as the retry, with the tool's cache-bypass argument set on this step's calls from then on | refresh |
//! | the controller's replan | replans and goes back to the first step it has no output for | replan |
//! | the controller's cross-check | calls the named equivalent tool with the arguments of its last call of the checked one (a verifier's call, charged as one) | the cross-check verifier |
//! | a request for the fallback model (the gateway's escalation) | the fallback model writes: its own error rate, price and latency | escalate |
//! | nothing (a tool failed) | writes the step's call again | retry |
//! | any request to the agent's model during a provider-wide outage (`provider_wide`) | none: the provider answers HTTP 503 (or the fault's status) with `Retry-After` and OpenAI's error body, before the model reads the request; the gateway's upstream loop retries or falls back to the next model | the model call raises |
//!
//! However many lines of one request call for a rethink, it replans once: the in-process client
//! replans once per directive, and each rethink is a model call (and, for the fallback model, a
//! draw at fixing a permanent mistake).
//!
//! It reads a tool result the way a plain client does ([`usable`]): JSON, with every field the
//! plan reads from that step present and not empty. When no tool of a step is left on offer it
//! gives up in prose; when every step has an output it answers with the plan's answer as JSON.

use std::collections::HashMap;

use serde_json::{Value, json};

use selfheal_bench::{Episode, Writer, Written};
use selfheal_bench::{Plan, get_path, resolve_answer};
use selfheal_core::canonical_hash;

use crate::endpoint::Upstream;

/// The text the gateway opens a re-ask turn with (`selfheal_gateway::app`'s re-ask).
pub(crate) const REASK_PREFIX: &str = "Your last answer's tool calls could not be used.";

/// The model name the gateway's escalation asks for (the second target of the arm's chain).
pub(crate) const FALLBACK_MODEL: &str = "bench-fallback";

/// The prefix of the gateway's guidance system message.
pub(crate) const GUIDANCE_PREFIX: &str = "[selfheal] ";

/// What the model makes of one line of the gateway's guidance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Heard {
    /// The tool keeps failing or has been disabled.
    Failing(String),
    /// The last call repeated an earlier one of this tool.
    Duplicate(String),
    /// Recent calls had empty or placeholder inputs.
    EmptyInput,
    /// The run is looping.
    Loop,
    /// The controller's retry: call the tool again with the same arguments.
    Retry(String),
    /// The controller's refresh: call the tool again with the same arguments and its
    /// cache-bypass argument set.
    Refresh {
        /// The tool.
        tool: String,
        /// Its cache-bypass argument.
        arg: String,
    },
    /// The controller's replan.
    Replan,
    /// The controller's cross-check: call the second tool with the arguments of the last call
    /// of the first.
    CrossCheck {
        /// The tool whose result is checked.
        of: String,
        /// The tool to call.
        with: String,
    },
    /// The controller's read before answering: call the tool again with these arguments.
    Reread {
        /// The tool.
        tool: String,
        /// The arguments of the call whose value is read again.
        args: Value,
    },
}

/// Reads the gateway's guidance out of a request's messages. The wire carries text only; these
/// are the sentences of the core monitor's guidance (`selfheal_core::Monitor`) a model acts on (a half-open tool and
/// the failure-rate note need no action).
pub(crate) fn heard(messages: &[Value]) -> Vec<Heard> {
    let mut out = Vec::new();
    for m in messages {
        if m.get("role").and_then(Value::as_str) != Some("system") {
            continue;
        }
        let Some(text) = m.get("content").and_then(Value::as_str) else {
            continue;
        };
        let Some(body) = text.strip_prefix(GUIDANCE_PREFIX) else {
            continue;
        };
        for line in body.lines() {
            let named = || {
                line.split('`')
                    .nth(1)
                    .map(str::to_owned)
                    .unwrap_or_default()
            };
            if line.starts_with("The tool `")
                && (line.contains("` has failed ") || line.contains("` failed "))
            {
                out.push(Heard::Failing(named()));
            } else if line.starts_with("You already called `") {
                out.push(Heard::Duplicate(named()));
            } else if line.starts_with("Several recent tool calls had empty") {
                out.push(Heard::EmptyInput);
            } else if line.starts_with("You appear to be in a loop") {
                out.push(Heard::Loop);
            } else if line.starts_with('`')
                && line.contains("): call it again")
                && line.contains("` set to true")
            {
                let mut ticks = line.split('`');
                let tool = ticks.nth(1).unwrap_or_default().to_owned();
                let arg = ticks.nth(1).unwrap_or_default().to_owned();
                out.push(Heard::Refresh { tool, arg });
            } else if line.starts_with('`') && line.contains("): call it again") {
                out.push(Heard::Retry(named()));
            } else if line.starts_with('`') && line.contains("): rethink your plan") {
                out.push(Heard::Replan);
            } else if let Some(rest) = line.strip_prefix("Before you answer, read `") {
                let (tool, rest) = rest.split_once('`').unwrap_or_default();
                let args = rest
                    .split_once("with the arguments ")
                    .and_then(|(_, a)| a.strip_suffix('.'))
                    .and_then(|a| serde_json::from_str(a).ok())
                    .unwrap_or(Value::Null);
                out.push(Heard::Reread {
                    tool: tool.to_owned(),
                    args,
                });
            } else if line.starts_with("Cross-check the last result of `") {
                let mut ticks = line.split('`');
                let of = ticks.nth(1).unwrap_or_default().to_owned();
                let with = ticks.nth(1).unwrap_or_default().to_owned();
                out.push(Heard::CrossCheck { of, with });
            }
        }
    }
    out
}

/// Whether a tool result is usable for step `s`: JSON, not an error body (`{"error": "..."}`,
/// which the in-process client reads as the tool's error whatever the plan reads of the step),
/// with every path the plan reads from the step present, not null and not an empty array (what
/// the benchmark's plain client checks).
pub(crate) fn usable(plan: &Plan, s: usize, text: &str) -> Option<Value> {
    let v: Value = serde_json::from_str(text).ok()?;
    if v.get("error").is_some_and(Value::is_string) {
        return None;
    }
    let ok = plan.read_paths(s).iter().all(|p| match get_path(&v, p) {
        None | Some(Value::Null) => false,
        Some(Value::Array(a)) => !a.is_empty(),
        Some(_) => true,
    });
    ok.then_some(v)
}

/// What the model answers.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Reply {
    /// One tool call.
    Call {
        /// The call's id.
        id: String,
        /// The tool's name.
        tool: String,
        /// The arguments as the model wrote them (broken JSON stays broken).
        arguments: String,
    },
    /// The final answer: the plan's answer as JSON text.
    Answer(String),
    /// No answer: why, in prose.
    GiveUp(String),
    /// The model's provider is down (a `provider_wide` outage): the request is answered with
    /// the provider's HTTP error, not a completion.
    Unavailable {
        /// The HTTP status (`None`: the call timed out; the endpoint answers 504).
        status: Option<u16>,
        /// `Retry-After`, in ms.
        retry_after_ms: Option<u64>,
        /// The error message.
        message: String,
    },
}

impl Reply {
    /// What the endpoint answers with: the chat completion that carries this reply, or the
    /// provider's HTTP error (a timeout as a 504 from the provider's edge: the arm does not
    /// hold the gateway's request until its own timeout fires).
    pub(crate) fn upstream(&self, n: u64) -> Upstream {
        let (message, finish) = match self {
            Reply::Unavailable {
                status,
                retry_after_ms,
                message,
            } => {
                return Upstream::Error {
                    status: status.unwrap_or(504),
                    retry_after_ms: *retry_after_ms,
                    message: message.clone(),
                };
            }
            Reply::Call {
                id,
                tool,
                arguments,
            } => (
                json!({"role": "assistant", "content": null, "tool_calls": [
                    {"id": id, "type": "function",
                     "function": {"name": tool, "arguments": arguments}}]}),
                "tool_calls",
            ),
            Reply::Answer(text) | Reply::GiveUp(text) => {
                (json!({"role": "assistant", "content": text}), "stop")
            }
        };
        Upstream::Completion(json!({
            "id": format!("chatcmpl-bench-{n}"),
            "object": "chat.completion",
            "created": 0,
            "model": "bench-model",
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
        }))
    }
}

/// The call the model is waiting on.
#[derive(Debug, Clone, PartialEq)]
struct Pending {
    id: String,
    step: usize,
    tool: String,
    args: Value,
    /// A cross-check call: its result is the gateway's to judge, not a step's output.
    verify: bool,
}

/// The scripted model of one episode.
#[derive(Debug, Clone)]
pub(crate) struct Script<'t> {
    plan: &'t Plan,
    /// The step it works on.
    s: usize,
    outputs: Vec<Option<Value>>,
    substitute: Vec<bool>,
    /// The tool whose result this request's conversation brought and became its step's output.
    just_read: Option<String>,
    /// Per step: told to refresh it, the model sets the tool's cache-bypass argument on every
    /// call of the step from then on (as the in-process client's refresh stays on).
    fresh: Vec<Option<String>>,
    /// The call whose result became each step's output: tool and canonical arguments.
    made: Vec<Option<(String, u64)>>,
    pending: Option<Pending>,
    /// The step each call id was written for.
    issued: HashMap<String, usize>,
    /// The cross-check calls among them.
    checks: std::collections::HashSet<String>,
    /// The last call of each tool: its step and arguments.
    last_call: HashMap<String, (usize, Value)>,
    /// Who writes this request's calls.
    writer: Writer,
    /// This request made the model replan already: one request is one rethink, however many
    /// of its lines call for one (the in-process client replans once per directive).
    replanned: bool,
    asks: u64,
}

impl<'t> Script<'t> {
    /// The model at the start of an episode of `plan`.
    pub(crate) fn new(plan: &'t Plan) -> Script<'t> {
        let n = plan.steps.len();
        Script {
            plan,
            s: 0,
            outputs: vec![None; n],
            substitute: vec![false; n],
            fresh: vec![None; n],
            just_read: None,
            made: vec![None; n],
            pending: None,
            issued: HashMap::new(),
            checks: std::collections::HashSet::new(),
            last_call: HashMap::new(),
            writer: Writer::Agent,
            replanned: false,
            asks: 0,
        }
    }

    /// Whether the call `id` was a cross-check (the world charges it as a verifier's call).
    pub(crate) fn is_check(&self, id: &str) -> bool {
        self.checks.contains(id)
    }

    /// The step the call `id` was written for (the world executes it there).
    pub(crate) fn step_of(&self, id: &str) -> Option<usize> {
        self.issued.get(id).copied()
    }

    /// Requests answered so far.
    pub(crate) fn asks(&self) -> u64 {
        self.asks
    }

    /// Answers one chat-completions request body.
    pub(crate) fn answer(&mut self, ep: &mut Episode<'_>, request: &Value) -> Reply {
        self.asks += 1;
        self.replanned = false;
        self.just_read = None;
        let empty = Vec::new();
        let messages = request
            .get("messages")
            .and_then(Value::as_array)
            .unwrap_or(&empty);
        let offered: Vec<&str> = request
            .get("tools")
            .and_then(Value::as_array)
            .map(|ts| {
                ts.iter()
                    .filter_map(|t| t.pointer("/function/name").and_then(Value::as_str))
                    .collect()
            })
            .unwrap_or_default();
        let heard = heard(messages);
        // The gateway's escalation asks the fallback model by name.
        self.writer = match request.get("model").and_then(Value::as_str) {
            Some(FALLBACK_MODEL) => Writer::Fallback,
            Some(_) | None => Writer::Agent,
        };
        // A provider-wide outage (`provider_wide`): the provider refuses the request before
        // the model reads it, with its HTTP error, and it is charged as a model call (as
        // in-process). The request comes again as the gateway decides (after a wait, or to the
        // fallback model) and is read then.
        let step = self.s.min(self.plan.steps.len().saturating_sub(1));
        if let Some(Written::Unavailable {
            message,
            status,
            retry_after_ms,
        }) = ep.model_unavailable(step, self.writer)
        {
            return Reply::Unavailable {
                status,
                retry_after_ms,
                message,
            };
        }
        let reasked = messages.last().is_some_and(|m| {
            m.get("role").and_then(Value::as_str) == Some("user")
                && m.get("content")
                    .and_then(Value::as_str)
                    .is_some_and(|c| c.starts_with(REASK_PREFIX))
        });
        if reasked {
            // The call was not forwarded. If it had to leave an input empty, the model has
            // skipped a step: it replans, as after the gateway's empty-input guidance.
            if let Some(p) = self.pending.take()
                && self.empty_input(p.step, &p.args)
            {
                self.replan(ep);
            }
        } else {
            self.read_result(ep, messages, &heard);
        }
        for h in &heard {
            match h {
                Heard::CrossCheck { of, with } if offered.contains(&with.as_str()) => {
                    if let Some(call) = self.cross_check(of, with) {
                        return call;
                    }
                }
                Heard::Reread { tool, args } if offered.contains(&tool.as_str()) => {
                    if let Some(call) = self.reread(tool, args) {
                        return call;
                    }
                }
                Heard::Retry(tool) => self.refetch(tool),
                // Told that the tool whose result it just read failed (the gateway judged that
                // answer: stale, say), the model does not use that result.
                Heard::Failing(tool) if self.just_read.as_ref() == Some(tool) => {
                    self.refetch(tool);
                }
                Heard::Refresh { tool, arg } => {
                    if let Some(&(step, _)) = self.last_call.get(tool)
                        && let Some(slot) = self.fresh.get_mut(step)
                    {
                        *slot = Some(arg.clone());
                    }
                    self.refetch(tool);
                }
                Heard::Replan => self.replan(ep),
                Heard::CrossCheck { .. }
                | Heard::Reread { .. }
                | Heard::Failing(_)
                | Heard::Duplicate(_)
                | Heard::EmptyInput
                | Heard::Loop => {}
            }
        }
        let resend = heard
            .iter()
            .any(|h| matches!(h, Heard::Retry(_) | Heard::Refresh { .. }));
        self.next_call(ep, &offered, &heard, resend)
    }

    /// The cross-check call: `with`, with the arguments of the last call of `of`.
    fn cross_check(&mut self, of: &str, with: &str) -> Option<Reply> {
        let (step, args) = self.last_call.get(of)?.clone();
        let id = format!("call_{}", self.issued.len() + 1);
        self.issued.insert(id.clone(), step);
        self.checks.insert(id.clone());
        let arguments = args.to_string();
        self.pending = Some(Pending {
            id: id.clone(),
            step,
            tool: with.to_owned(),
            args,
            verify: true,
        });
        Some(Reply::Call {
            id,
            tool: with.to_owned(),
            arguments,
        })
    }

    /// The read before answering: `tool` with `args`, at the step whose output that call gave
    /// (else the tool's last step), charged as a verifier's call.
    fn reread(&mut self, tool: &str, args: &Value) -> Option<Reply> {
        let key = (tool.to_owned(), canonical_hash(args));
        let step = match self.made.iter().position(|m| m.as_ref() == Some(&key)) {
            Some(s) => s,
            None => self.last_call.get(tool)?.0,
        };
        let id = format!("call_{}", self.issued.len() + 1);
        self.issued.insert(id.clone(), step);
        self.checks.insert(id.clone());
        self.pending = Some(Pending {
            id: id.clone(),
            step,
            tool: tool.to_owned(),
            args: args.clone(),
            verify: true,
        });
        Some(Reply::Call {
            id,
            tool: tool.to_owned(),
            arguments: args.to_string(),
        })
    }

    /// Told to call `tool` again: a step whose output came from it is fetched again (the
    /// two sources disagreed on it), and the steps after it, which may have used it, are made
    /// again from the new value (as the in-process client rebuilds its answer from the step
    /// whose value changed).
    fn refetch(&mut self, tool: &str) {
        let Some(&(step, _)) = self.last_call.get(tool) else {
            return;
        };
        if self.outputs.get(step).is_some_and(Option::is_some) {
            for slot in self.outputs.iter_mut().skip(step) {
                *slot = None;
            }
            for made in self.made.iter_mut().skip(step) {
                *made = None;
            }
            self.s = self.s.min(step);
        }
    }

    /// Whether `args` leave a required argument of step `s`'s tool empty.
    fn empty_input(&self, s: usize, args: &Value) -> bool {
        self.plan.step_tool(s).is_some_and(|t| {
            t.required().iter().any(|r| match args.get(r) {
                None | Some(Value::Null) => true,
                Some(Value::String(x)) => x.trim().is_empty(),
                Some(_) => false,
            })
        })
    }

    /// Rethinks the plan and goes back to the first step without an output.
    fn replan(&mut self, ep: &mut Episode<'_>) {
        if std::mem::replace(&mut self.replanned, true) {
            return;
        }
        ep.replan(self.writer);
        if let Some(m) = self.outputs.iter().position(Option::is_none) {
            self.s = self.s.min(m);
        }
    }

    /// Takes in the result of the pending call, if the conversation carries it.
    fn read_result(&mut self, ep: &mut Episode<'_>, messages: &[Value], heard: &[Heard]) {
        let Some(p) = &self.pending else { return };
        let Some(text) = messages.iter().rev().find_map(|m| {
            (m.get("role").and_then(Value::as_str) == Some("tool")
                && m.get("tool_call_id").and_then(Value::as_str) == Some(p.id.as_str()))
            .then(|| m.get("content").and_then(Value::as_str).unwrap_or(""))
        }) else {
            return;
        };
        let Some(p) = self.pending.take() else { return };
        if p.verify {
            // The gateway judges a cross-check; the model goes on with what it has.
            return;
        }
        let key = (p.tool.clone(), canonical_hash(&p.args));
        // Told it repeated a call, it checks its own calls: an earlier step's call (whose result
        // this is, not this step's), or its own retry of this step (a change of approach).
        let duplicate = heard.contains(&Heard::Duplicate(p.tool.clone()));
        let other_step = duplicate
            && self
                .made
                .iter()
                .enumerate()
                .any(|(i, m)| i != p.step && m.as_ref() == Some(&key));
        if let Some(v) = usable(self.plan, p.step, text)
            && !other_step
            && let Some(slot) = self.outputs.get_mut(p.step)
        {
            *slot = Some(v);
            self.made[p.step] = Some(key);
            self.just_read = Some(p.tool.clone());
        }
        let empty_input = self.empty_input(p.step, &p.args);
        let looping = heard.contains(&Heard::Loop);
        // The controller's own order to call this tool again (a retry, a refresh) is the more
        // specific word: the monitor's note that the call repeats is then no reason to change
        // source (in-process, the controller's retry is carried out as it says).
        let told_again = heard.iter().any(|h| match h {
            Heard::Retry(t) | Heard::Refresh { tool: t, .. } => *t == p.tool,
            Heard::Failing(_)
            | Heard::Duplicate(_)
            | Heard::EmptyInput
            | Heard::Loop
            | Heard::Replan
            | Heard::CrossCheck { .. }
            | Heard::Reread { .. } => false,
        });
        let duplicate = duplicate && !told_again;
        if empty_input && (looping || heard.contains(&Heard::EmptyInput)) {
            // Its input is missing: it rethinks the plan from the first step without an output.
            self.replan(ep);
        } else if (looping || (duplicate && !other_step))
            && let Some(slot) = self.substitute.get_mut(p.step)
        {
            // Going round in circles on this step: another source.
            *slot = true;
        }
    }

    /// Writes the next call, the answer, or gives up.
    fn next_call(
        &mut self,
        ep: &mut Episode<'_>,
        offered: &[&str],
        heard: &[Heard],
        resend: bool,
    ) -> Reply {
        let n = self.plan.steps.len();
        loop {
            while self.s < n && self.outputs[self.s].is_some() {
                self.s += 1;
            }
            let s = self.s;
            let Some(step) = self.plan.steps.get(s) else {
                return match resolve_answer(self.plan, &self.outputs) {
                    Ok(v) => Reply::Answer(v.to_string()),
                    Err(e) => Reply::GiveUp(format!("I could not work out the answer: {e}.")),
                };
            };
            let primary = step.tool.as_str();
            let sub = self
                .plan
                .step_tool(s)
                .and_then(|t| t.substitute.as_deref())
                .filter(|x| offered.contains(x));
            if heard.contains(&Heard::Failing(primary.to_owned())) || !offered.contains(&primary) {
                self.substitute[s] = true;
            }
            let use_sub = match sub {
                Some(x) if self.substitute[s] => Some(x.to_owned()),
                Some(_) | None => None,
            };
            if use_sub.is_none() && !offered.contains(&primary) {
                return Reply::GiveUp(format!(
                    "I cannot complete the task: no tool for step {} (`{primary}`) is available.",
                    s + 1
                ));
            }
            match ep.write(s, self.writer, !resend, &self.outputs) {
                Written::Skipped => {
                    self.s += 1;
                }
                // The outage began while this request was read (a replan's latency moved the
                // clock into it): the provider's error, as at the start of a request.
                Written::Unavailable {
                    message,
                    status,
                    retry_after_ms,
                } => {
                    return Reply::Unavailable {
                        status,
                        retry_after_ms,
                        message,
                    };
                }
                Written::Call { tool, mut args } => {
                    let tool = match use_sub {
                        Some(x) if tool == primary => x,
                        Some(_) | None => tool,
                    };
                    if let Some(arg) = &self.fresh[s]
                        && let Some(o) = args.as_object_mut()
                    {
                        o.insert(arg.clone(), Value::Bool(true));
                    }
                    let arguments = match &args {
                        Value::String(text) => text.clone(),
                        other => other.to_string(),
                    };
                    let id = format!("call_{}", self.issued.len() + 1);
                    self.issued.insert(id.clone(), s);
                    self.last_call.insert(tool.clone(), (s, args.clone()));
                    self.pending = Some(Pending {
                        id: id.clone(),
                        step: s,
                        tool: tool.clone(),
                        args,
                        verify: false,
                    });
                    return Reply::Call {
                        id,
                        tool,
                        arguments,
                    };
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn the_gateways_guidance_is_heard() {
        let messages = vec![
            json!({"role": "system", "content": "be brief"}),
            json!({"role": "system", "content": "[selfheal] The tool `fx.rate` has failed 3 times in a row (last errors: 503). Try a different approach.\nYou already called `geo.capital` with these exact arguments. Repeating it will not give a different result: change the arguments or your approach.\nThe tool `stock.quote` was disabled after repeated failures and is available again on trial: one more failure disables it again."}),
            json!({"role": "user", "content": "The tool `x` has failed 9 times"}),
        ];
        assert_eq!(
            heard(&messages),
            vec![
                Heard::Failing("fx.rate".into()),
                Heard::Duplicate("geo.capital".into())
            ]
        );
    }

    /// The controller's guidance, as the gateway writes it, is heard.
    #[test]
    fn the_controllers_guidance_is_heard() {
        use selfheal_core::FailureClass;
        use selfheal_gateway::{
            cross_check_text, refresh_text, replan_text, retry_text, substitute_text,
        };
        let lines = [
            retry_text("fx.rate", FailureClass::ToolTimeout),
            refresh_text("fx.rate", FailureClass::StaleContext, "refresh"),
            replan_text("fx.rate", FailureClass::PlanningFailure),
            cross_check_text("fx.rate", "fx.mirror"),
            substitute_text("fx.rate", FailureClass::ToolUnavailable, "fx.mirror"),
        ];
        let messages = vec![json!({"role": "system",
            "content": format!("[selfheal] {}", lines.join("\n"))})];
        assert_eq!(
            heard(&messages),
            vec![
                Heard::Retry("fx.rate".into()),
                Heard::Refresh {
                    tool: "fx.rate".into(),
                    arg: "refresh".into()
                },
                Heard::Replan,
                Heard::CrossCheck {
                    of: "fx.rate".into(),
                    with: "fx.mirror".into()
                },
                Heard::Failing("fx.rate".into()),
            ]
        );
    }

    /// Asked for a cross-check, the model calls the other tool with the arguments of its last
    /// call of the checked one, and the world charges that call as a verifier's.
    #[test]
    fn a_cross_check_is_the_same_arguments_charged_as_a_verifier_call() {
        let task = &selfheal_bench::builtin(1)[0];
        let model = FaultModel::default_model().unwrap();
        let primary = task.plan.steps[0].tool.clone();
        let sub = task.plan.step_tool(0).unwrap().substitute.clone().unwrap();
        let mut world = crate::world::World::new(task, Episode::new(task, &[], &model, 1));
        let first = world.answer(&request(
            task,
            vec![json!({"role": "user", "content": "go"})],
        ));
        let Reply::Call { id, arguments, .. } = first.clone() else {
            panic!("{first:?}")
        };
        let out = world.execute(&id, &primary, &arguments);
        let check = json!({"role": "system", "content": format!(
            "[selfheal] {}", selfheal_gateway::cross_check_text(&primary, &sub))});
        let req = request(
            task,
            vec![
                json!({"role": "user", "content": "go"}),
                json!({"role": "assistant", "content": null, "tool_calls": [{"id": id, "type": "function",
                "function": {"name": primary, "arguments": arguments}}]}),
                json!({"role": "tool", "tool_call_id": id, "content": out}),
                check,
            ],
        );
        let Reply::Call {
            id: cid,
            tool,
            arguments: cargs,
        } = world.answer(&req)
        else {
            panic!("a call")
        };
        assert_eq!(
            (tool.as_str(), cargs.as_str()),
            (sub.as_str(), arguments.as_str())
        );
        let before = world.ep.costs();
        world.execute(&cid, &tool, &cargs);
        let after = world.ep.costs();
        assert_eq!(after.verifier_calls, before.verifier_calls + 1);
        assert_eq!(after.tool_calls, before.tool_calls);
    }

    /// During a provider-wide outage the agent's model is not asked: the endpoint answers the
    /// provider's HTTP error (status, `Retry-After`, a charged model call) and the request, sent
    /// again to the fallback model, is read and answered with a call; after the window the
    /// model writes again. Without the key the model is not behind the window.
    #[test]
    fn a_provider_outage_is_an_http_error_and_the_fallback_model_answers() {
        let outage = |wide: &str| {
            let mut m = FaultModel::from_toml_str(&format!(
                "[[fault]]\nname = \"outage\"\nfamily = \"runtime\"\nweight = 1\n\
                 target = \"primary\"\nwindow = {{ start_ms = 0, end_ms = 100000 }}\n{wide}\n\
                 effect = {{ kind = \"http\", status = 503, message = \"503 Service Unavailable\", retry_after_ms = 1500 }}"
            ))
            .unwrap();
            m.model = selfheal_bench::ModelRates::PERFECT;
            m
        };
        let task = &selfheal_bench::builtin(1)[0];
        let go = vec![json!({"role": "user", "content": "go"})];
        let inj = Injected {
            step: 0,
            spec: 0,
            permanent: false,
            k: 1,
            skew: 0.0,
        };
        let wide = outage("provider_wide = true");
        let mut world = crate::world::World::new(task, Episode::new(task, &[inj], &wide, 1));
        let calls = world.ep.costs().model_calls;
        let refused = world.answer(&request(task, go.clone()));
        assert_eq!(
            refused.upstream(1),
            Upstream::Error {
                status: 503,
                retry_after_ms: Some(1500),
                message: "503 Service Unavailable".into()
            }
        );
        assert_eq!(
            world.ep.costs().model_calls,
            calls + 1,
            "charged as a model call"
        );
        let mut to_fallback = request(task, go.clone());
        to_fallback["model"] = json!(FALLBACK_MODEL);
        assert_eq!(
            tool_of(&world.answer(&to_fallback)),
            task.plan.steps[0].tool
        );
        world.ep.wait(100_000);
        assert!(matches!(
            world.answer(&request(task, go.clone())).upstream(2),
            Upstream::Completion(_)
        ));

        let narrow = outage("");
        let mut world = crate::world::World::new(task, Episode::new(task, &[inj], &narrow, 1));
        assert_eq!(
            tool_of(&world.answer(&request(task, go))),
            task.plan.steps[0].tool
        );
    }

    use selfheal_bench::{FaultModel, Injected};

    fn fault(model: &FaultModel, name: &str, k: u32) -> Injected {
        Injected {
            step: 0,
            spec: model.faults.iter().position(|f| f.name == name).unwrap(),
            permanent: false,
            k,
            skew: 0.0,
        }
    }

    fn request(task: &selfheal_bench::TaskSpec, messages: Vec<Value>) -> Value {
        json!({"messages": messages, "tools": crate::agent::offered_tools(task)})
    }

    /// One turn of a conversation with the scripted model: its reply to `msgs` and, for a tool
    /// call, the call executed and both appended (the call, and the tool's answer); the tool,
    /// the arguments and the answer. A reply that is not a call comes back as it is.
    fn exchange(
        task: &selfheal_bench::TaskSpec,
        world: &mut crate::world::World<'_>,
        msgs: &mut Vec<Value>,
    ) -> Result<(String, String, String), Reply> {
        let reply = world.answer(&request(task, msgs.clone()));
        let Reply::Call {
            id,
            tool,
            arguments,
        } = reply
        else {
            return Err(reply);
        };
        let out = world.execute(&id, &tool, &arguments);
        msgs.push(
            json!({"role": "assistant", "content": null, "tool_calls": [{"id": id,
            "type": "function", "function": {"name": tool, "arguments": arguments}}]}),
        );
        msgs.push(json!({"role": "tool", "tool_call_id": id, "content": out}));
        Ok((tool, arguments, out))
    }

    fn tool_of(r: &Reply) -> &str {
        match r {
            Reply::Call { tool, .. } => tool,
            Reply::Answer(_) | Reply::GiveUp(_) | Reply::Unavailable { .. } => "",
        }
    }

    #[test]
    fn a_transient_wrong_tool_is_written_again_after_a_reask() {
        let task = &selfheal_bench::builtin(1)[0];
        let model = FaultModel::default_model().unwrap();
        let faults = [fault(&model, "wrong_tool_unknown", 1)];
        let mut ep = Episode::new(task, &faults, &model, 1);
        let mut script = Script::new(&task.plan);
        let first = script.answer(
            &mut ep,
            &request(task, vec![json!({"role": "user", "content": "go"})]),
        );
        let primary = task.plan.steps[0].tool.clone();
        assert_eq!(
            tool_of(&first),
            format!("{primary}_v2"),
            "the fault writes a wrong tool"
        );
        let reask =
            json!({"role": "user", "content": format!("{REASK_PREFIX} The tool does not exist.")});
        let again = script.answer(
            &mut ep,
            &request(task, vec![json!({"role": "user", "content": "go"}), reask]),
        );
        assert_eq!(
            tool_of(&again),
            primary,
            "after one write the transient fault is gone"
        );
        assert_eq!(ep.costs().model_calls, 2, "each write is a model call");
    }

    #[test]
    fn a_hidden_or_failing_tool_sends_the_model_to_the_substitute() {
        let task = &selfheal_bench::builtin(1)[0];
        let model = FaultModel::default_model().unwrap();
        let primary = task.plan.steps[0].tool.clone();
        let sub = task.plan.step_tool(0).unwrap().substitute.clone().unwrap();
        let mut ep = Episode::new(task, &[], &model, 1);
        let mut script = Script::new(&task.plan);
        let mut req = request(task, vec![json!({"role": "user", "content": "go"})]);
        req["tools"]
            .as_array_mut()
            .unwrap()
            .retain(|t| t["function"]["name"] != primary.as_str());
        assert_eq!(tool_of(&script.answer(&mut ep, &req)), sub);

        let mut ep = Episode::new(task, &[], &model, 1);
        let mut script = Script::new(&task.plan);
        let warned = json!({"role": "system", "content": format!(
            "[selfheal] The tool `{primary}` has failed 3 times in a row (last errors: x). Try a different approach.")});
        let req = request(task, vec![warned, json!({"role": "user", "content": "go"})]);
        assert_eq!(tool_of(&script.answer(&mut ep, &req)), sub);
        // With neither on offer, it gives up rather than call a tool it was not given.
        let mut ep = Episode::new(task, &[], &model, 1);
        let mut script = Script::new(&task.plan);
        let bare = json!({"messages": [{"role": "user", "content": "go"}], "tools": []});
        assert!(matches!(script.answer(&mut ep, &bare), Reply::GiveUp(_)));
    }

    /// Told to refresh a tool, the model sends the step's call again with the tool's
    /// cache-bypass argument, and the world reads it as a fresh read: a stale answer (old
    /// `as_of`) comes back current.
    #[test]
    fn a_refresh_is_the_same_call_with_the_cache_bypass_argument() {
        let model = FaultModel::default_model().unwrap();
        let tasks = selfheal_bench::builtin(100);
        let (task, s) = tasks
            .iter()
            .find_map(|t| {
                (0..t.plan.steps.len())
                    .find(|&s| t.plan.step_tool(s).is_some_and(|x| x.freshness))
                    .map(|s| (t, s))
            })
            .unwrap();
        let stale_tool = task.plan.steps[s].tool.clone();
        let mut inj = fault(&model, "stale", 5);
        inj.step = s;
        let mut world = crate::world::World::new(task, Episode::new(task, &[inj], &model, 1));
        let now = world.ep.data_now();
        let as_of = |out: &str| {
            serde_json::from_str::<Value>(out).unwrap()["as_of"]
                .as_u64()
                .unwrap()
        };
        let mut msgs = vec![json!({"role": "user", "content": "go"})];
        let exchange = |world: &mut crate::world::World<'_>, msgs: &mut Vec<Value>| {
            exchange(task, world, msgs).unwrap_or_else(|reply| panic!("{reply:?}"))
        };
        let first = loop {
            let (tool, _, out) = exchange(&mut world, &mut msgs);
            if tool == stale_tool {
                break out;
            }
        };
        assert!(
            now - as_of(&first) > 3_600_000,
            "the fault serves old data: {first}"
        );
        msgs.push(json!({"role": "system", "content": format!("[selfheal] {}",
            selfheal_gateway::refresh_text(&stale_tool,
                selfheal_core::FailureClass::StaleContext, crate::agent::REFRESH_ARGUMENT))}));
        let (tool, arguments, out) = exchange(&mut world, &mut msgs);
        assert_eq!(tool, stale_tool);
        let args: Value = serde_json::from_str(&arguments).unwrap();
        assert_eq!(
            args[crate::agent::REFRESH_ARGUMENT],
            json!(true),
            "{arguments}"
        );
        assert!(
            now - as_of(&out) <= 3_600_000,
            "a fresh read is current: {out}"
        );
    }

    /// Told to call a tool again after later steps went on with its value (the read before
    /// answering found the value changed), the model makes those steps again from the new
    /// value, as the in-process client rebuilds its answer from the step whose value changed.
    #[test]
    fn a_step_called_again_makes_the_steps_after_it_again() {
        let model = FaultModel::default_model().unwrap();
        let tasks = selfheal_bench::builtin(100);
        let task = tasks
            .iter()
            .find(|t| t.plan.steps.len() >= 2 && t.plan.steps[0].tool != t.plan.steps[1].tool)
            .unwrap();
        let mut world = crate::world::World::new(task, Episode::new(task, &[], &model, 1));
        let mut msgs = vec![json!({"role": "user", "content": "go"})];
        // The tool called, or "" for a reply that is not a call.
        let exchange = |world: &mut crate::world::World<'_>, msgs: &mut Vec<Value>| {
            exchange(task, world, msgs).map_or(String::new(), |(tool, _, _)| tool)
        };
        let (first, second) = (&task.plan.steps[0].tool, &task.plan.steps[1].tool);
        assert_eq!(&exchange(&mut world, &mut msgs), first);
        assert_eq!(&exchange(&mut world, &mut msgs), second);
        msgs.push(json!({"role": "system", "content": format!("[selfheal] {}",
            selfheal_gateway::retry_text(first,
                selfheal_core::FailureClass::VerificationFailure))}));
        assert_eq!(&exchange(&mut world, &mut msgs), first);
        // The guidance was that request's.
        msgs.retain(|m| m["role"] != "system");
        assert_eq!(
            &exchange(&mut world, &mut msgs),
            second,
            "the step after it is made again"
        );
    }

    #[test]
    fn a_result_is_usable_only_with_the_fields_the_plan_reads() {
        let task = &selfheal_bench::builtin(1)[0];
        let plan = &task.plan;
        let path = plan.read_paths(0)[0].clone();
        let good = json!({ path.clone(): "France City" }).to_string();
        assert!(usable(plan, 0, &good).is_some());
        assert!(usable(plan, 0, &json!({ path: null }).to_string()).is_none());
        assert!(usable(plan, 0, "Error: 503 Service Unavailable").is_none());
        assert!(usable(plan, 0, "{\"other\": 1}").is_none());
    }

    /// An error body is the tool's error, not its answer, even for a step the plan reads as a
    /// whole (no path of it is read, so nothing would be found missing).
    #[test]
    fn an_error_body_is_never_a_usable_result() {
        let task = &selfheal_bench::builtin(1)[0];
        let plan = &task.plan;
        let path = plan.read_paths(0)[0].clone();
        let body = json!({ path: "France City", "error": "service unavailable" }).to_string();
        assert!(usable(plan, 0, &body).is_none());
        let last = plan.steps.len();
        assert!(usable(plan, last, r#"{"error": "service unavailable"}"#).is_none());
        assert!(usable(plan, last, r#"{"error": {"code": 0}, "x": 1}"#).is_some());
    }
}
