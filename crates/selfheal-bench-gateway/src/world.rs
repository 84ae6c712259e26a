//! One episode's world on both sides of the gateway: the benchmark's [`Episode`] and the
//! scripted model that writes its calls.
//!
//! Why one owner: the model's writes and the tools' executions change the same fault state
//! (a transient fault clears after k attempts, whoever made them), so both go through one
//! `&mut` [`World`]. The driver owns it and lends it, one request at a time, to the model
//! endpoint ([`World::answer`]) and to the agent client's tools ([`World::execute`]); nothing
//! else reads the schedule or the truth, which stay private to `selfheal_bench::exec`.

use std::time::Instant;

use serde_json::Value;

use selfheal_bench::TaskSpec;
use selfheal_bench::{Episode, Purpose, Response};

use crate::agent::REFRESH_ARGUMENT;
use crate::model::{Reply, Script};

/// The text a tool's raise comes back as: `Error: ` and its message and, when the tool's
/// answer carried a `Retry-After`, that header in whole seconds (rounded up, as HTTP writes
/// it), as a tool wrapper that keeps it writes it — unless the message says it already. A
/// wrapper that drops the header leaves the gateway only its backoff.
pub(crate) fn error_text(message: &str, retry_after_ms: Option<u64>) -> String {
    match retry_after_ms {
        Some(ms) if !message.to_ascii_lowercase().contains("retry") => {
            format!("Error: {message} (Retry-After: {})", ms.div_ceil(1000))
        }
        Some(_) | None => format!("Error: {message}"),
    }
}

/// An episode and its scripted model.
#[derive(Debug)]
pub(crate) struct World<'t> {
    /// The benchmark's episode.
    pub ep: Episode<'t>,
    /// The scripted model.
    pub model: Script<'t>,
    /// When the model's provider last refused a request (a provider-wide outage): the wall
    /// time the gateway waits before it sends one again passes on the episode's clock too.
    refused_at: Option<Instant>,
}

impl<'t> World<'t> {
    /// A world for `task` around the episode `ep` (built from the same task). The model plans
    /// first, as the benchmark's model does for every strategy.
    pub(crate) fn new(task: &'t TaskSpec, mut ep: Episode<'t>) -> World<'t> {
        ep.plan_call();
        World {
            ep,
            model: Script::new(&task.plan),
            refused_at: None,
        }
    }

    /// The model answers one chat-completions request body. After a refusal (the provider's
    /// outage), the wall time since — the gateway's backoff or its honouring of `Retry-After`
    /// — is a wait on the episode's clock, so a gateway that waits out an outage window can
    /// see it end.
    pub(crate) fn answer(&mut self, request: &Value) -> Reply {
        if let Some(at) = self.refused_at.take() {
            self.ep
                .wait(u64::try_from(at.elapsed().as_millis()).unwrap_or(u64::MAX));
        }
        let reply = self.model.answer(&mut self.ep, request);
        if matches!(reply, Reply::Unavailable { .. }) {
            self.refused_at = Some(Instant::now());
        }
        reply
    }

    /// Executes one tool call as the agent client received it, at the step the model wrote it
    /// for, and returns the tool message's text: the body the tool returned, or `Error: ...`
    /// when it raised (what agent frameworks send back).
    pub(crate) fn execute(&mut self, id: &str, tool: &str, arguments: &str) -> String {
        let Some(step) = self.model.step_of(id) else {
            return format!("Error: no call `{id}` was made");
        };
        let mut args: Value =
            serde_json::from_str(arguments).unwrap_or_else(|_| Value::String(arguments.into()));
        // A cross-check the gateway asked for is a verifier's call, charged as one.
        let purpose = if self.model.is_check(id) {
            Purpose::Verify
        } else {
            Purpose::Step
        };
        // The tool's cache-bypass argument is the world's refresh, not an argument of the
        // question (a verifier's call reads as in-process: never fresh).
        let refresh = args
            .as_object_mut()
            .and_then(|o| o.remove(REFRESH_ARGUMENT))
            .is_some_and(|v| v == Value::Bool(true));
        let fresh = refresh && purpose == Purpose::Step;
        match self.ep.call(step, tool, &args, purpose, fresh).response {
            Response::Raised {
                message,
                retry_after_ms,
                ..
            } => error_text(&message, retry_after_ms),
            Response::Returned { body } => body,
        }
    }
}
