//! The async driver: newline-delimited JSON-RPC between the client and the server (MCP's stdio
//! transport), through a [`Proxy`], with its deadlines turned into timers.
//!
//! Generic over the four byte streams, so the binary wires it to its own stdin/stdout and a child
//! process's pipes, and tests wire it to in-memory pipes. Lines are read as bytes: a line that is
//! not UTF-8 or not a JSON object (a batch, say) is passed on untouched, and a message the proxy
//! does not change is forwarded as the bytes it arrived as (key order, number spelling and all).
//! The proxy heals what it understands and never breaks what it does not. Lines are bounded
//! ([`RunOptions::max_line_bytes`], see [`crate::lines`]): a longer one is refused with a
//! JSON-RPC error, never forwarded in part.

use std::time::Instant;

use serde_json::Value;
use thiserror::Error;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};

use selfheal_core::{EventKind, SplitMix64};

use crate::lines::{DEFAULT_MAX_LINE_BYTES, Head, LineReader, Read, refusal};
use crate::proxy::{Decision, Out, Proxy, Stats};

/// How a session is driven.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunOptions {
    /// Seeds the retry backoff's jitter.
    pub seed: u64,
    /// Longest line (one JSON-RPC message) accepted from either side, in bytes without its
    /// newline; a longer one is refused with a JSON-RPC error (see [`crate::lines`]).
    pub max_line_bytes: usize,
}

impl RunOptions {
    /// Options with `seed` and the default line limit ([`DEFAULT_MAX_LINE_BYTES`]).
    pub fn new(seed: u64) -> Self {
        RunOptions {
            seed,
            max_line_bytes: DEFAULT_MAX_LINE_BYTES,
        }
    }
}

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
                text = original
                    .filter(|(from, _, _)| *from != to)
                    .and_then(|(_, _, bytes)| with_arguments_as_written(v, bytes))
                    .unwrap_or_else(|| v.to_string());
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

/// A call forwarded with its id rewritten: the message as `v` says, with the `arguments` of its
/// `params` written exactly as in `original` (the line it came from) when the proxy passed them
/// on unchanged — member order, spacing and numbers as the client wrote them, an integer past 64
/// bits included. `None` when `v` has no arguments or the proxy changed them (a repair).
fn with_arguments_as_written(v: &Value, original: &[u8]) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct Line<'a> {
        #[serde(borrow)]
        params: Params<'a>,
    }
    #[derive(serde::Deserialize)]
    struct Params<'a> {
        #[serde(borrow)]
        arguments: &'a serde_json::value::RawValue,
    }
    const MARK: &str = "\u{0}selfheal: arguments as written\u{0}";
    let args = v.pointer("/params/arguments")?;
    let line: Line<'_> = serde_json::from_slice(original).ok()?;
    let raw = line.params.arguments.get();
    if serde_json::from_str::<Value>(raw).ok().as_ref() != Some(args) {
        return None;
    }
    let mut marked = v.clone();
    *marked.pointer_mut("/params/arguments")? = Value::String(MARK.to_owned());
    let text = marked.to_string();
    let mark = Value::String(MARK.to_owned()).to_string();
    (text.matches(&mark).count() == 1).then(|| text.replacen(&mark, raw, 1))
}

/// What to do with a line longer than the limit, of `len` bytes, whose first bytes are `head`,
/// from `from`: a response the other side waits for is replaced by an error response to the
/// same id (for the server's, through the proxy, which maps the id back and settles the call);
/// anything else is answered to its sender with an error (`id: null` when its id is unknown).
/// The decision goes to the trace.
async fn refuse(
    from: Side,
    head: &[u8],
    len: usize,
    max: usize,
    ctx: &mut Ctx<'_>,
    client: &mut (impl AsyncWrite + Unpin),
    server: &mut (impl AsyncWrite + Unpin),
) -> std::io::Result<()> {
    let h = Head::read(head);
    let error = refusal(h.id.as_ref(), len, max);
    (ctx.on_decision)(Decision {
        kind: EventKind::LineTooLong,
        tool: String::new(),
        detail: serde_json::json!({
            "from": match from { Side::Client => "client", Side::Server => "server" },
            "bytes": len, "limit": max, "id": h.id,
        }),
    });
    let outs = match (from, h.answers()) {
        (Side::Server, true) => ctx.proxy.from_server(error, (ctx.now)(), ctx.rng),
        (Side::Client, true) => vec![Out::ToServer(error)],
        (Side::Server, false) => vec![Out::ToServer(error)],
        (Side::Client, false) => vec![Out::ToClient(error)],
    };
    deliver(outs, None, client, server).await
}

/// What [`refuse`] needs of the session.
struct Ctx<'a> {
    proxy: &'a mut Proxy,
    now: &'a dyn Fn() -> u64,
    rng: &'a mut SplitMix64,
    on_decision: &'a mut (dyn FnMut(Decision) + Send),
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
    options: RunOptions,
    on_decision: &mut (dyn FnMut(Decision) + Send),
) -> Result<Stats, RunError> {
    let started = Instant::now();
    let now = || u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
    // The session's clock starts at 0 now; `as_of` stamps are Unix time, read against this.
    proxy.set_wall_clock(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
    );
    let mut rng = SplitMix64::new(options.seed);
    let max = options.max_line_bytes;
    // The readers keep what they read if the other branch of the select wins, so a line is
    // never lost half-read.
    let mut from_client = LineReader::new(BufReader::new(client_in), max);
    let mut from_server = LineReader::new(BufReader::new(server_in), max);
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
            read = from_client.next() => {
                match read? {
                    Read::Eof => break,
                    Read::TooLong { len } => {
                        let mut ctx = Ctx { proxy: &mut proxy, now: &now, rng: &mut rng, on_decision: &mut *on_decision };
                        refuse(Side::Client, from_client.line(), len, max, &mut ctx, &mut client_out, &mut server_out).await?;
                    }
                    Read::Line => {
                        let line = from_client.line();
                        match serde_json::from_slice::<Value>(line) {
                            Ok(v) if v.is_object() => {
                                let outs = proxy.from_client(v.clone(), now());
                                deliver(outs, Some((Side::Client, &v, line)), &mut client_out, &mut server_out).await?;
                            }
                            _ => send(&mut server_out, line).await?,
                        }
                    }
                }
            },
            read = from_server.next() => {
                match read? {
                    Read::Eof => {
                        let outs = proxy.server_closed();
                        deliver(outs, None, &mut client_out, &mut server_out).await?;
                        for d in proxy.take_decisions() {
                            on_decision(d);
                        }
                        break;
                    }
                    Read::TooLong { len } => {
                        let mut ctx = Ctx { proxy: &mut proxy, now: &now, rng: &mut rng, on_decision: &mut *on_decision };
                        refuse(Side::Server, from_server.line(), len, max, &mut ctx, &mut client_out, &mut server_out).await?;
                    }
                    Read::Line => {
                        let line = from_server.line();
                        match serde_json::from_slice::<Value>(line) {
                            Ok(v) if v.is_object() => {
                                let outs = proxy.from_server(v.clone(), now(), &mut rng);
                                deliver(outs, Some((Side::Server, &v, line)), &mut client_out, &mut server_out).await?;
                            }
                            _ => send(&mut client_out, line).await?,
                        }
                    }
                }
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
