//! # selfheal-runtime — the core decides, this crate acts
//!
//! Real I/O for the control plane: an OpenAI-compatible model client ([`client`]) whose failures
//! map onto the core's signals, async tools with declared effects ([`tool`]), the agent loop
//! that obeys the controller's directives and verifies tool outputs and final answers
//! ([`agent`]). The live-model benchmark that drives the simulated benchmark's tasks with a real
//! tool-calling model is built on this crate, in `selfheal-live`.

pub mod agent;
pub mod at;
pub mod client;
pub mod tool;

pub use agent::{Agent, MAX_EVIDENCE, RunResult};
pub use client::{ClientConfig, ClientError, Completion, ModelClient, normalize_request};
pub use tool::{Effect, FnTool, OutputSchema, OutputSchemaError, Tool, ToolError, ToolSpec};
