//! # selfheal-openai — the OpenAI-compatible wire
//!
//! What every front-end that speaks the OpenAI-compatible API shares, and nothing that decides:
//! the model client (`ModelClient`: one HTTP call, every provider failure typed and mapped onto the
//! core's [`selfheal_core::Signal`], request shapes some servers reject normalised), the
//! allocation-free JSON-path reader ([`At`]) and the reading of a conversation's own words, the
//! evidence grounding rules judge values by ([`task_texts`]). The runtime's agent and the gateway both sit on it,
//! so the gateway does not depend on the agent runtime, and a failure is read off the wire the
//! same way wherever it happens.

mod at;
mod client;
mod messages;

pub use at::At;
pub use client::{
    ClientConfig, ClientError, Completion, ModelClient, map_reqwest, normalize_request,
    parse_completion, retry_after_ms, status_error,
};
pub use messages::{content_texts, is_task_role, task_texts};
