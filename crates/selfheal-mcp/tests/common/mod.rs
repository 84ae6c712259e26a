//! What the MCP proxy's integration tests share: splitting what a session emits by direction.

use selfheal_mcp::Out;
use serde_json::Value;

/// The messages a session sent to the MCP server, in order.
pub(crate) fn to_server(outs: &[Out]) -> Vec<Value> {
    outs.iter()
        .filter_map(|o| match o {
            Out::ToServer(v) => Some(v.clone()),
            Out::ToClient(_) => None,
        })
        .collect()
}

/// The messages a session sent to the client, in order.
pub(crate) fn to_client(outs: &[Out]) -> Vec<Value> {
    outs.iter()
        .filter_map(|o| match o {
            Out::ToClient(v) => Some(v.clone()),
            Out::ToServer(_) => None,
        })
        .collect()
}
