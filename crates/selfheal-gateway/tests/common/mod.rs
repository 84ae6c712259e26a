//! What the gateway's integration tests share: the real server on a loopback port and the
//! reading of what a scripted upstream was sent. Each test file includes this module and uses
//! part of it.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use serde_json::Value;
use tokio::net::TcpListener;

use selfheal_gateway::{GatewayConfig, TraceWriter, serve};

/// The gateway (`serve`) on 127.0.0.1, port 0, with retries a millisecond apart and no trace:
/// its base URL, `http://…/v1`.
pub(crate) async fn gateway(mut config: GatewayConfig) -> String {
    config.policy.retry.base_ms = 1;
    config.policy.retry.max_ms = 2;
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(serve(
        config,
        listener,
        TraceWriter::disabled(),
        std::future::pending(),
    ));
    format!("http://{addr}/v1")
}

/// The system texts of a chat request the upstream saw (where the gateway's guidance goes).
pub(crate) fn guidance_seen(seen: &Value) -> String {
    seen["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "system")
        .filter_map(|m| m["content"].as_str())
        .collect::<Vec<_>>()
        .join("\n")
}
