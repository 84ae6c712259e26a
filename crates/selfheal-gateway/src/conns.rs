//! Which open client connection gives up its slot when the gateway is at its connection cap.
//!
//! A fixed cap alone lets a few clients lock everyone else out: slowloris dribbles request
//! heads, and a client that sends one request and then keeps its connection alive without using
//! it holds a slot until the header-read timeout. Both reconnect at once when cut, so the real
//! clients lose the race for the slots that come free. At the cap the gateway therefore takes
//! a slot back for the new connection, cheapest loss first:
//!
//! 1. the oldest connection still waiting for its first whole request head — it has sent no
//!    request, so nothing is lost; it is aborted;
//! 2. else the connection kept alive longest without a request in flight — it is closed
//!    gracefully, as nginx closes idle keep-alive connections when it runs out: a request that
//!    arrives on it at that moment is still answered before it closes, and an HTTP client
//!    opens a new connection for its next request;
//! 3. a connection with a request in flight (its head read, its answer not yet fully sent) is
//!    never touched: the new connection is answered 503.
//!
//! The registry lives in the accept loop; the connections' tasks report their phase through an
//! atomic, so nothing here locks.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Instant;

use axum::body::{Body, Bytes, HttpBody};
use tokio::sync::Notify;
use tokio::task::AbortHandle;

/// Has not sent a whole request head yet.
const WAITING: u8 = 0;
/// A request is in flight: its head was read and its answer is not yet fully sent.
const BUSY: u8 = 1;
/// Kept alive between requests.
const IDLE: u8 = 2;

/// What one connection's task and the accept loop share.
#[derive(Debug)]
pub(crate) struct Conn {
    phase: AtomicU8,
    /// Milliseconds since the registry's start when the last answer was sent.
    idle_since_ms: AtomicU64,
    /// When the connection should close gracefully (notified once).
    close: Notify,
    start: Instant,
}

impl Conn {
    fn new(start: Instant) -> Conn {
        Conn {
            phase: AtomicU8::new(WAITING),
            idle_since_ms: AtomicU64::new(0),
            close: Notify::new(),
            start,
        }
    }

    /// A request head was read: the connection is busy until its answer is sent.
    pub(crate) fn request_started(&self) {
        self.phase.store(BUSY, Ordering::Release);
    }

    /// The answer was sent (or dropped): the connection idles until its next request.
    fn answer_done(&self) {
        let now = u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.idle_since_ms.store(now, Ordering::Relaxed);
        self.phase.store(IDLE, Ordering::Release);
    }

    /// Resolves when the accept loop asks this connection to close gracefully.
    pub(crate) async fn closing(&self) {
        self.close.notified().await;
    }

    /// Wraps an answer's body so that the connection counts as idle once the body has been
    /// sent or dropped.
    pub(crate) fn track(self: &Arc<Self>, body: Body) -> Body {
        Body::new(Tracked {
            inner: body,
            conn: self.clone(),
        })
    }
}

/// An answer body that marks its connection idle when it is dropped; otherwise the body itself
/// (its frames, its end and its size hint, so a known length stays a `content-length`).
struct Tracked {
    inner: Body,
    conn: Arc<Conn>,
}

impl HttpBody for Tracked {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for Tracked {
    fn drop(&mut self) {
        self.conn.answer_done();
    }
}

/// How the registry took back a slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reclaimed {
    /// A connection that had sent no whole request head was aborted.
    Waiting,
    /// A kept-alive connection without a request in flight was asked to close.
    Idle,
}

/// The open connections, oldest first, with their tasks.
#[derive(Debug)]
pub(crate) struct Registry {
    queue: VecDeque<(Arc<Conn>, AbortHandle)>,
    start: Instant,
}

impl Default for Registry {
    fn default() -> Self {
        Registry {
            queue: VecDeque::new(),
            start: Instant::now(),
        }
    }
}

impl Registry {
    /// A new connection's shared state, to be [`Registry::push`]ed with its task.
    pub(crate) fn conn(&self) -> Arc<Conn> {
        Arc::new(Conn::new(self.start))
    }

    /// Registers an accepted connection's task. Ended connections are dropped as they reach
    /// the front, and all of them once the queue holds twice `cap`, so it stays bounded.
    pub(crate) fn push(&mut self, conn: Arc<Conn>, handle: AbortHandle, cap: usize) {
        while self.queue.front().is_some_and(|e| e.1.is_finished()) {
            self.queue.pop_front();
        }
        if self.queue.len() >= cap.saturating_mul(2) {
            self.queue.retain(|e| !e.1.is_finished());
        }
        self.queue.push_back((conn, handle));
    }

    /// Takes back one slot for a new connection (see the module's order); `None` when every
    /// open connection has a request in flight.
    pub(crate) fn reclaim(&mut self) -> Option<Reclaimed> {
        self.queue.retain(|e| !e.1.is_finished());
        if let Some(i) = self
            .queue
            .iter()
            .position(|e| e.0.phase.load(Ordering::Acquire) == WAITING)
            && let Some((_, handle)) = self.queue.remove(i)
        {
            handle.abort();
            return Some(Reclaimed::Waiting);
        }
        let i = self
            .queue
            .iter()
            .enumerate()
            .filter(|(_, e)| e.0.phase.load(Ordering::Acquire) == IDLE)
            .min_by_key(|(_, e)| e.0.idle_since_ms.load(Ordering::Relaxed))
            .map(|(i, _)| i)?;
        let (conn, _) = self.queue.remove(i)?;
        conn.close.notify_one();
        Some(Reclaimed::Idle)
    }

    /// Aborts every connection still waiting for its first whole request head (at shutdown: it
    /// has no request to finish, so it must not hold the drain up).
    pub(crate) fn abort_waiting(&mut self) {
        for (conn, handle) in self.queue.drain(..) {
            if conn.phase.load(Ordering::Acquire) == WAITING {
                handle.abort();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A registry with `phases.len()` connections whose tasks wait until aborted or told to
    /// close; what each task saw comes back on its channel.
    async fn open(
        phases: &[u8],
    ) -> (
        Registry,
        Vec<Arc<Conn>>,
        Vec<tokio::sync::oneshot::Receiver<&'static str>>,
    ) {
        let mut reg = Registry::default();
        let (mut conns, mut seen) = (Vec::new(), Vec::new());
        for (i, &p) in phases.iter().enumerate() {
            let c = reg.conn();
            if p != WAITING {
                c.request_started();
            }
            if p == IDLE {
                c.idle_since_ms.store(100 - i as u64, Ordering::Relaxed);
                c.phase.store(IDLE, Ordering::Release);
            }
            let (tx, rx) = tokio::sync::oneshot::channel();
            let c2 = c.clone();
            let task = tokio::spawn(async move {
                c2.closing().await;
                let _ = tx.send("closed");
            });
            reg.push(c.clone(), task.abort_handle(), 8);
            conns.push(c);
            seen.push(rx);
        }
        tokio::task::yield_now().await;
        (reg, conns, seen)
    }

    #[tokio::test]
    async fn a_waiting_connection_goes_before_an_idle_one() {
        let (mut reg, _, mut seen) = open(&[IDLE, WAITING, WAITING]).await;
        assert_eq!(reg.reclaim(), Some(Reclaimed::Waiting));
        tokio::task::yield_now().await;
        // The oldest waiting one was aborted: its sender dropped without a word.
        assert!(matches!(
            seen[1].try_recv(),
            Err(tokio::sync::oneshot::error::TryRecvError::Closed)
        ));
        assert!(matches!(
            seen[2].try_recv(),
            Err(tokio::sync::oneshot::error::TryRecvError::Empty)
        ));
        assert!(matches!(
            seen[0].try_recv(),
            Err(tokio::sync::oneshot::error::TryRecvError::Empty)
        ));
    }

    #[tokio::test]
    async fn the_longest_idle_connection_is_closed_gracefully() {
        // Idle since 100 - i: the last one has idled longest.
        let (mut reg, _, mut seen) = open(&[IDLE, BUSY, IDLE]).await;
        assert_eq!(reg.reclaim(), Some(Reclaimed::Idle));
        let last = seen
            .pop()
            .map(|rx| tokio::time::timeout(std::time::Duration::from_secs(5), rx));
        let told = match last {
            Some(wait) => wait.await.ok().and_then(Result::ok),
            None => None,
        };
        assert_eq!(told, Some("closed"), "told to close, not aborted");
        tokio::task::yield_now().await;
        for rx in &mut seen {
            assert!(matches!(
                rx.try_recv(),
                Err(tokio::sync::oneshot::error::TryRecvError::Empty)
            ));
        }
    }

    #[tokio::test]
    async fn a_connection_with_a_request_in_flight_is_never_reclaimed() {
        let (mut reg, conns, _seen) = open(&[BUSY, BUSY]).await;
        assert_eq!(reg.reclaim(), None);
        // Once an answer is done, that connection is idle and can give its slot.
        conns[1].answer_done();
        assert_eq!(reg.reclaim(), Some(Reclaimed::Idle));
        assert_eq!(reg.reclaim(), None);
    }

    #[tokio::test]
    async fn a_tracked_body_keeps_its_length_and_marks_the_connection_idle_when_dropped() {
        let reg = Registry::default();
        let c = reg.conn();
        c.request_started();
        let body = c.track(Body::from("hello"));
        assert_eq!(body.size_hint().exact(), Some(5));
        assert_eq!(c.phase.load(Ordering::Acquire), BUSY);
        let bytes = axum::body::to_bytes(body, 1024).await.ok();
        assert_eq!(bytes.as_deref(), Some(&b"hello"[..]));
        assert_eq!(c.phase.load(Ordering::Acquire), IDLE);
    }
}
