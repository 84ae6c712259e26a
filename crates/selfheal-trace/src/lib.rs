//! # selfheal-trace — where the front-ends' decisions are kept
//!
//! The gateway (`selfheal serve`) and the MCP proxy (`selfheal mcp`) record what they did into
//! one SQLite trace, which `selfheal trace list|show|replay` reads. The store lives here, not in
//! either front-end, so neither depends on the other to keep or read its trace.
//!
//! Every recovery decision is recorded as the core's typed event (`signal`, `classified`,
//! `action` with its `DecisionInput`: the schema of `selfheal_core::TraceEvent`, the same one the
//! controller writes as JSON Lines for `selfheal bench --trace`), so the SQLite rows and the
//! JSON Lines file are two sinks of one decision schema and `selfheal trace replay` reads both.
//! The front-ends' own bookkeeping (`request`, `response`, `guidance`, `hide`, ...) is recorded
//! beside it as kinds with a JSON detail.

mod store;

pub use store::{
    DEFAULT_RETENTION, Detail, EventRow, Kind, RawJson, RunRow, RunSummary, StoreError, TraceEvent,
    TraceReader, TraceWriter, default_path, is_action,
};
