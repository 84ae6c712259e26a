//! The async driver: newline-delimited JSON-RPC between the client and the server (MCP's stdio
//! transport), through a [`Proxy`], with its deadlines turned into timers.
//!
//! Generic over the four byte streams, so the binary wires it to its own stdin/stdout and a child
//! process's pipes, and tests wire it to in-memory pipes. Lines are read as bytes: a line that is
//! not UTF-8 or not a JSON object (a batch, say) is passed on untouched, and a message the proxy
//! does not change is forwarded as the bytes it arrived as (key order, number spelling and all).
//! The proxy heals what it understands and never breaks what it does not.

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

/// Where a line came from.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Side {
    Client,
    Server,
}

/// Writes the proxy's messages. A message equal to the one that came in (`original`, from
/// `from`) is written as the original bytes.
async fn deliver(
    outs: Vec<Out>,
    original: Option<(Side, &Value, &[u8])>,
    client: &mut (impl AsyncWrite + Unpin),
    server: &mut (impl AsyncWrite + Unpin),
) -> std::io::Result<()> {
    for o in outs {
        let (to, v) = match &o {
            Out::ToClient(v) => (Side::Client, v),
            Out::ToServer(v) => (Side::Server, v),
        };
        let verbatim = original
            .filter(|(from, msg, _)| *from != to && *msg == v)
            .map(|(_, _, bytes)| bytes);
        let text;
        let bytes = match verbatim {
            Some(b) => b,
            None => {
                text = v.to_string();
                text.as_bytes()
            }
        };
        match to {
            Side::Client => send(client, bytes).await?,
            Side::Server => send(server, bytes).await?,
        }
    }
    Ok(())
}

/// A line without its end (`\n` or `\r\n`).
fn trim_line(buf: &[u8]) -> &[u8] {
    let b = buf.strip_suffix(b"\n").unwrap_or(buf);
    b.strip_suffix(b"\r").unwrap_or(b)
}

/// Relays one session until the client or the server closes its side; returns what the proxy
/// did. `on_decision` sees every decision (for the trace). When the server goes first, every
/// call still waiting for it is answered with an error before the session ends.
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
    let mut from_client = BufReader::new(client_in);
    let mut from_server = BufReader::new(server_in);
    // `read_until` keeps what it read in these buffers if the other branch of the select wins,
    // so a line is never lost half-read; each is cleared only once its line is handled.
    let (mut cbuf, mut sbuf) = (Vec::new(), Vec::new());
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
        tokio::select! {
            n = from_client.read_until(b'\n', &mut cbuf) => {
                if n? == 0 {
                    break;
                }
                let line = trim_line(&cbuf);
                match serde_json::from_slice::<Value>(line) {
                    Ok(v) if v.is_object() => {
                        let outs = proxy.from_client(v.clone(), now());
                        deliver(outs, Some((Side::Client, &v, line)), &mut client_out, &mut server_out).await?;
                    }
                    _ => send(&mut server_out, line).await?,
                }
                cbuf.clear();
            },
            n = from_server.read_until(b'\n', &mut sbuf) => {
                if n? == 0 {
                    let outs = proxy.server_closed();
                    deliver(outs, None, &mut client_out, &mut server_out).await?;
                    for d in proxy.take_decisions() {
                        on_decision(d);
                    }
                    break;
                }
                let line = trim_line(&sbuf);
                match serde_json::from_slice::<Value>(line) {
                    Ok(v) if v.is_object() => {
                        let outs = proxy.from_server(v.clone(), now(), &mut rng);
                        deliver(outs, Some((Side::Server, &v, line)), &mut client_out, &mut server_out).await?;
                    }
                    _ => send(&mut client_out, line).await?,
                }
                sbuf.clear();
            },
            () = sleep => {
                let outs = proxy.tick(now(), &mut rng);
                deliver(outs, None, &mut client_out, &mut server_out).await?;
            },
        };
        for d in proxy.take_decisions() {
            on_decision(d);
        }
    }
    // Closing our end of the server's input tells a stdio server to exit; closing the client's
    // output tells the client the session is over.
    let _ = server_out.shutdown().await;
    let _ = client_out.shutdown().await;
    Ok(proxy.stats())
}
