//! # selfheal-openai — the OpenAI-compatible wire
//!
//! What every front-end that speaks the OpenAI-compatible API shares, and nothing that decides:
//! the model client ([`client`]: one HTTP call, every provider failure typed and mapped onto the
//! core's [`selfheal_core::Signal`], request shapes some servers reject normalised) and the
//! allocation-free JSON-path reader ([`at`]). The runtime's agent and the gateway both sit on it,
//! so the gateway does not depend on the agent runtime, and a failure is read off the wire the
//! same way wherever it happens.

pub mod at;
pub mod client;

pub use client::{ClientConfig, ClientError, Completion, ModelClient, normalize_request};
