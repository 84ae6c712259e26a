//! What the gateway's integration tests share: the real server on a loopback port, a scripted
//! upstream's socket and the reading of what it was sent. Each test file includes this module and uses
//! part of it.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::future::Future;
use std::sync::Arc;

use serde_json::Value;
use tokio::io::AsyncReadExt;
use tokio::net::{TcpListener, TcpStream};

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

/// A scripted upstream on 127.0.0.1, port 0, over raw TCP (so a test controls every byte and
/// sees its connection closed): each connection's request is read ([`read_request`]) and the
/// connection handed to `answer` with the request's body. Its base URL, `http://…/v1`.
pub(crate) async fn tcp_upstream<F, Fut>(answer: F) -> String
where
    F: Fn(TcpStream, Vec<u8>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let answer = Arc::new(answer);
    tokio::spawn(async move {
        loop {
            let Ok((mut tcp, _)) = listener.accept().await else {
                return;
            };
            let answer = answer.clone();
            tokio::spawn(async move {
                if let Some(body) = read_request(&mut tcp).await {
                    answer(tcp, body).await;
                }
            });
        }
    });
    format!("http://{addr}/v1")
}

/// Reads one HTTP request from `tcp`, its head and then its body by `content-length`: the body,
/// or `None` when the connection closed first.
pub(crate) async fn read_request(tcp: &mut TcpStream) -> Option<Vec<u8>> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    loop {
        let n = tcp.read(&mut chunk).await.unwrap_or(0);
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
        let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
            continue;
        };
        let len = String::from_utf8_lossy(&buf[..end])
            .lines()
            .find_map(|l| {
                l.to_ascii_lowercase()
                    .strip_prefix("content-length:")
                    .map(|v| v.trim().parse::<usize>().unwrap())
            })
            .unwrap_or(0);
        if buf.len() >= end + 4 + len {
            return Some(buf[end + 4..end + 4 + len].to_vec());
        }
    }
}
