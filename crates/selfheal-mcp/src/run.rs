//! The async driver: newline-delimited JSON-RPC between the client and the server (MCP's stdio
//! transport), through a [`Proxy`], with its deadlines turned into timers.
//!
//! Generic over the four byte streams, so the binary wires it to its own stdin/stdout and a child
//! process's pipes, and tests wire it to in-memory pipes. A line that is not JSON, or a batch
//! (a JSON array), is passed on untouched: the proxy heals what it understands and never breaks
//! what it does not.

use std::time::Instant;

use serde_json::Value;
use thiserror::Error;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};

use selfheal_core::rng::SplitMix64;

use crate::proxy::{Decision, Out, Proxy, Stats};

/// Why a session ended badly.
#[derive(Debug, Error)]
pub enum RunError {
    /// Reading or writing a stream failed.
    #[error("mcp proxy i/o: {0}")]
    Io(#[from] std::io::Error),
}

async fn send(w: &mut (impl AsyncWrite + Unpin), line: &[u8]) -> std::io::Result<()> {
    w.write_all(line).await?;
    w.write_all(b"\n").await?;
    w.flush().await
}

async fn deliver(
    outs: Vec<Out>,
    client: &mut (impl AsyncWrite + Unpin),
    server: &mut (impl AsyncWrite + Unpin),
) -> std::io::Result<()> {
    for o in outs {
        match o {
            Out::ToClient(v) => send(client, v.to_string().as_bytes()).await?,
            Out::ToServer(v) => send(server, v.to_string().as_bytes()).await?,
        }
    }
    Ok(())
}

/// Relays one session until the client or the server closes its side; returns what the proxy
/// did. `on_decision` sees every decision (for the trace).
pub async fn run(
    mut proxy: Proxy,
    client_in: impl AsyncRead + Unpin,
    mut client_out: impl AsyncWrite + Unpin,
    server_in: impl AsyncRead + Unpin,
    mut server_out: impl AsyncWrite + Unpin,
    seed: u64,
    on_decision: &mut (dyn FnMut(Decision) + Send),
) -> Result<Stats, RunError> {
    let started = Instant::now();
    let now = || u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
    let mut rng = SplitMix64::new(seed);
    let mut from_client = BufReader::new(client_in).lines();
    let mut from_server = BufReader::new(server_in).lines();
    loop {
        let wait = proxy
            .next_deadline()
            .map(|d| std::time::Duration::from_millis(d.saturating_sub(now())));
        let sleep = async {
            match wait {
                Some(d) => tokio::time::sleep(d).await,
                None => std::future::pending().await,
            }
        };
        let outs = tokio::select! {
            line = from_client.next_line() => match line? {
                None => break,
                Some(line) => match serde_json::from_str::<Value>(&line) {
                    Ok(v) if v.is_object() => proxy.from_client(v, now()),
                    _ => {
                        send(&mut server_out, line.as_bytes()).await?;
                        Vec::new()
                    }
                },
            },
            line = from_server.next_line() => match line? {
                None => break,
                Some(line) => match serde_json::from_str::<Value>(&line) {
                    Ok(v) if v.is_object() => proxy.from_server(v, now(), &mut rng),
                    _ => {
                        send(&mut client_out, line.as_bytes()).await?;
                        Vec::new()
                    }
                },
            },
            () = sleep => proxy.tick(now(), &mut rng),
        };
        deliver(outs, &mut client_out, &mut server_out).await?;
        for d in proxy.take_decisions() {
            on_decision(d);
        }
    }
    // Closing our end of the server's input tells a stdio server to exit.
    let _ = server_out.shutdown().await;
    Ok(proxy.stats())
}
