//! # selfheal-runtime — the core decides, this crate acts
//!
//! Real I/O for the control plane: an OpenAI-compatible model client ([`client`]) whose failures
//! map onto the core's signals. The agent loop and the live-model benchmark build on it.

pub mod client;

pub use client::{ClientConfig, ClientError, Completion, ModelClient, normalize_request};
