//! # selfheal-state — what replicas of the gateway share, and where
//!
//! One gateway process keeps everything in its memory. Two replicas behind a load balancer then
//! learn every provider outage twice and split one conversation's run in two. This crate is the
//! one place where state leaves the process, behind one trait, [`StateStore`], with two
//! implementations:
//!
//! - [`MemoryStore`]: the embedded default, nothing to install, one process;
//! - [`RedisStore`]: a Redis server shared by every replica (the `redis` crate's multiplexed
//!   connection manager on tokio).
//!
//! Two kinds of state go through it, with different guarantees:
//!
//! 1. **Per-run blobs**, keyed by tenant and run id ([`RunId`]): read with their version
//!    ([`StateStore::get_run`]) and written back with a compare-and-set on that version
//!    ([`StateStore::put_run`]). A conflicting write is refused with the fresh state in the same
//!    answer, so the caller re-applies its change to it ([`update_run`]) — never lost, never
//!    merged blindly. The blob's time to live is the run's idle expiry. On Redis each is one
//!    round trip: `HMGET` to read, one Lua script (`EVALSHA`) to compare, write and expire.
//! 2. **Shared records** ([`Shared`]): small, eventually consistent facts with an expiry — an
//!    upstream's open circuit, a target learned not to stream tool calls. Reads and writes hit a
//!    local map only; a background task pushes local writes and pulls everyone else's in one
//!    round trip per refresh interval, so the hot path never waits on the store and a fact
//!    learned on one replica reaches the others within one refresh interval (plus a round trip).
//!
//! Faults of the store itself are not the caller's: when Redis is down or slow every operation
//! is bounded by a timeout, callers keep working on their local state, one warning is logged per
//! outage (not per request), [`Health`] says so (for `/readyz` and `/metrics`), and sharing
//! resumes — with what was learned meanwhile — when it returns.
//!
//! Nothing secret goes in: the records hold names, versions, expiries and whatever blob the
//! caller writes (a run's state, never keys or credentials).

mod health;
mod memory;
mod redis_store;
mod shared;

use std::time::Duration;

use bytes::Bytes;
use futures_util::future::BoxFuture;

pub use health::Health;
pub use memory::MemoryStore;
pub use redis_store::{RedisOptions, RedisStore, redact_url};
pub use shared::{Shared, SharedRecord};

/// Why a store operation did not happen. The callers' answer to all of them is the same: keep
/// working on local state.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The store did not answer within its timeout.
    #[error("the state store did not answer within {} ms", .0.as_millis())]
    Timeout(Duration),
    /// The store is known to be down and is not asked again before its next probe.
    #[error("the state store is unavailable (retried at the next probe)")]
    Unavailable,
    /// Redis answered with an error, or the connection failed.
    #[error("redis: {0}")]
    Redis(String),
    /// The store's answer was not what this crate writes.
    #[error("unexpected answer from the state store: {0}")]
    Protocol(String),
    /// A compare-and-set kept conflicting.
    #[error("the run's state kept changing under us ({0} attempts)")]
    Contended(u32),
    /// The configuration cannot be used (a URL that does not parse, no async runtime).
    #[error("invalid state store setup: {0}")]
    Setup(String),
}

/// Which run: the tenant it belongs to and its id. Both are opaque to the store.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RunId {
    /// The tenant (a key id, or `default` without inbound keys).
    pub tenant: String,
    /// The run id within the tenant.
    pub run: String,
}

impl RunId {
    /// A run id.
    pub fn new(tenant: impl Into<String>, run: impl Into<String>) -> RunId {
        RunId {
            tenant: tenant.into(),
            run: run.into(),
        }
    }
}

/// A run's stored state and its version (`1` after the first write; a run never written, or
/// expired, has none).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Versioned {
    /// The bytes as written.
    pub bytes: Bytes,
    /// The version they were written as.
    pub version: u64,
}

/// What a compare-and-set put did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Put {
    /// Written as `version`.
    Stored {
        /// The new version.
        version: u64,
    },
    /// The stored version was not the expected one: nothing was written. `current` is the state
    /// as it is now (`None`: absent or expired), to retry on.
    Conflict {
        /// The fresh state.
        current: Option<Versioned>,
    },
}

/// One write of the shared tier: a record, or its removal (`None`).
pub type SharedWrite = (String, Option<SharedRecord>);

/// Where state is kept. Object safe: the gateway holds an `Arc<dyn StateStore>`.
pub trait StateStore: Send + Sync + std::fmt::Debug {
    /// `memory` or `redis`.
    fn backend(&self) -> &'static str;

    /// Whether the store answers, and how often it did not.
    fn health(&self) -> &Health;

    /// A run's state and version; `None` when never written or expired.
    fn get_run<'a>(&'a self, id: &'a RunId)
    -> BoxFuture<'a, Result<Option<Versioned>, StoreError>>;

    /// Writes a run's state if its stored version is `expected` (`0`: only if absent), and
    /// sets its time to live to `ttl` (the run's idle expiry).
    fn put_run<'a>(
        &'a self,
        id: &'a RunId,
        expected: u64,
        bytes: Bytes,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<Put, StoreError>>;

    /// Applies the shared tier's `writes` (last writer wins), drops records expired at
    /// `now_unix_ms`, and returns every live record — one round trip.
    fn sync_shared<'a>(
        &'a self,
        writes: Vec<SharedWrite>,
        now_unix_ms: u64,
    ) -> BoxFuture<'a, Result<Vec<(String, SharedRecord)>, StoreError>>;
}

/// Reads a run, applies `change` to its state (`None`: new or expired) and writes it back with
/// a compare-and-set; on a conflict `change` is applied again to the fresh state the conflict
/// returned, at most `attempts` times. Returns what was stored and its version.
///
/// `change` must be a pure function of the state it is given: it may run more than once.
pub async fn update_run<F>(
    store: &dyn StateStore,
    id: &RunId,
    ttl: Duration,
    attempts: u32,
    mut change: F,
) -> Result<Versioned, StoreError>
where
    F: FnMut(Option<&[u8]>) -> Bytes + Send,
{
    let mut current = store.get_run(id).await?;
    for _ in 0..attempts.max(1) {
        let expected = current.as_ref().map_or(0, |v| v.version);
        let next = change(current.as_ref().map(|v| &v.bytes[..]));
        match store.put_run(id, expected, next.clone(), ttl).await? {
            Put::Stored { version } => {
                return Ok(Versioned {
                    bytes: next,
                    version,
                });
            }
            Put::Conflict { current: fresh } => current = fresh,
        }
    }
    Err(StoreError::Contended(attempts.max(1)))
}

/// The Unix time in milliseconds (the shared records' clock: replicas' clocks are assumed to be
/// synchronised, as NTP keeps them, to well under a refresh interval).
pub fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}
