//! # selfheal-runtime — the core decides, this crate acts
//!
//! Real I/O for the control plane: an OpenAI-compatible model client ([`client`]) whose failures
//! map onto the core's signals (from `selfheal-openai`, the wire crate the gateway shares), async tools with declared effects ([`tool`]), the agent loop
//! that obeys the controller's directives and verifies tool outputs and final answers
//! ([`agent`]). The live-model benchmark that drives the simulated benchmark's tasks with a real
//! tool-calling model is built on this crate, in `selfheal-live`.

pub mod agent;
pub mod tool;

/// The JSON-path reader, from the wire crate ([`selfheal_openai::at`]).
pub use selfheal_openai::at;
/// The model client, from the wire crate ([`selfheal_openai::client`]).
pub use selfheal_openai::client;

pub use agent::{Agent, MAX_EVIDENCE, RunResult};
pub use client::{ClientConfig, ClientError, Completion, ModelClient, normalize_request};
pub use tool::{Effect, FnTool, OutputSchema, OutputSchemaError, Tool, ToolError, ToolSpec};
