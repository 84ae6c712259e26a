//! # selfheal-mcp — a self-healing proxy in front of any MCP server
//!
//! The gateway heals agents that talk to a model over HTTP; this crate heals the other half of
//! the loop, the tools, where they are served over the Model Context Protocol. `selfheal mcp --
//! COMMAND` starts the MCP server `COMMAND` and speaks MCP (stdio) to the client on its own
//! stdin/stdout, so a client configuration changes in one place: the command it launches.
//!
//! ```text
//!  MCP client ──stdio──► selfheal mcp ──stdio──► MCP server (child process)
//!                          │ tools/list: remember schemas and hints, leave paused tools out
//!                          │ tools/call: paused tool → answered here; arguments checked and
//!                          │            coerced to the input schema, or answered with the errors
//!                          │ results:   one core `Run` per session decides (streaks, circuit,
//!                          │            failure rate, ladders): retry read-only/idempotent
//!                          │            tools, declared output contracts and freshness
//!                          │            (`--config`), guidance added, hidden tools, stop
//!                          └ everything else passes through untouched
//! ```
//!
//! [`Proxy`] makes the decisions without I/O; [`run()`] drives it over any byte streams. The
//! modules are private: what is public is re-exported here.

mod lines;
mod proxy;
mod run;

pub use lines::DEFAULT_MAX_LINE_BYTES;
pub use proxy::{
    Decision, McpConfig, Out, Proxy, Stats, check_tools, rpc_signal, tools_from_toml_str,
};
pub use run::{RunError, RunOptions, run};
