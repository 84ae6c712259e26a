//! # selfheal-runtime — the core decides, this crate acts
//!
//! Real I/O for the control plane: an OpenAI-compatible model client ([`ModelClient`]) whose failures
//! map onto the core's signals (from `selfheal-openai`, the wire crate the gateway shares), async tools with declared effects ([`Tool`]), the agent loop
//! that obeys the controller's directives and verifies tool outputs and final answers
//! ([`Agent`]). The live-model benchmark that drives the simulated benchmark's tasks with a real
//! tool-calling model is built on this crate, in `selfheal-live`.

mod agent;
mod tool;

pub use agent::{Agent, MAX_EVIDENCE, RunResult};
/// The model client and the JSON-path reader, from the wire crate (`selfheal-openai`).
pub use selfheal_openai::{
    At, ClientConfig, ClientError, Completion, ModelClient, normalize_request,
};
pub use tool::{Effect, FnTool, OutputSchema, OutputSchemaError, Tool, ToolError, ToolSpec};
