//! The embedded store: one process's memory, the default when no Redis is configured.
//!
//! The same semantics as Redis — versions, compare-and-set, expiry — so a caller written against
//! [`StateStore`] behaves the same with one process and with many.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::future::BoxFuture;

use crate::{Health, Put, RunId, SharedRecord, SharedWrite, StateStore, StoreError, Versioned};

/// Expired runs are swept once every this many writes.
const SWEEP_EVERY: u64 = 256;

/// State in this process's memory.
#[derive(Debug)]
pub struct MemoryStore {
    runs: Mutex<Runs>,
    shared: Mutex<HashMap<String, SharedRecord>>,
    health: Health,
}

#[derive(Debug, Default)]
struct Runs {
    map: HashMap<RunId, (Versioned, Instant)>,
    writes: u64,
}

impl Default for MemoryStore {
    fn default() -> Self {
        MemoryStore {
            runs: Mutex::new(Runs::default()),
            shared: Mutex::new(HashMap::new()),
            health: Health::new("memory", Duration::from_secs(1)),
        }
    }
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> MemoryStore {
        MemoryStore::default()
    }

    /// Runs held (expired ones not yet swept included).
    pub fn runs(&self) -> usize {
        self.runs.lock().map_or(0, |r| r.map.len())
    }

    fn get_now(&self, id: &RunId, now: Instant) -> Option<Versioned> {
        let mut runs = self.runs.lock().unwrap_or_else(|p| p.into_inner());
        match runs.map.get(id) {
            Some((v, until)) if now < *until => Some(v.clone()),
            Some(_) => {
                runs.map.remove(id);
                None
            }
            None => None,
        }
    }

    fn put_now(&self, id: &RunId, expected: u64, bytes: Bytes, ttl: Duration, now: Instant) -> Put {
        let mut runs = self.runs.lock().unwrap_or_else(|p| p.into_inner());
        runs.writes += 1;
        if runs.writes.is_multiple_of(SWEEP_EVERY) {
            runs.map.retain(|_, (_, until)| now < *until);
        }
        let current = runs
            .map
            .get(id)
            .filter(|(_, until)| now < *until)
            .map(|(v, _)| v.clone());
        let version = current.as_ref().map_or(0, |v| v.version);
        if version != expected {
            return Put::Conflict { current };
        }
        let version = version + 1;
        runs.map
            .insert(id.clone(), (Versioned { bytes, version }, now + ttl));
        Put::Stored { version }
    }
}

impl StateStore for MemoryStore {
    fn backend(&self) -> &'static str {
        "memory"
    }

    fn health(&self) -> &Health {
        &self.health
    }

    fn get_run<'a>(
        &'a self,
        id: &'a RunId,
    ) -> BoxFuture<'a, Result<Option<Versioned>, StoreError>> {
        let v = self.get_now(id, Instant::now());
        Box::pin(async move { Ok(v) })
    }

    fn put_run<'a>(
        &'a self,
        id: &'a RunId,
        expected: u64,
        bytes: Bytes,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<Put, StoreError>> {
        let put = self.put_now(id, expected, bytes, ttl, Instant::now());
        Box::pin(async move { Ok(put) })
    }

    fn sync_shared<'a>(
        &'a self,
        writes: Vec<SharedWrite>,
        now_unix_ms: u64,
    ) -> BoxFuture<'a, Result<Vec<(String, SharedRecord)>, StoreError>> {
        let mut shared = self.shared.lock().unwrap_or_else(|p| p.into_inner());
        for (key, rec) in writes {
            match rec {
                Some(r) => shared.insert(key, r),
                None => shared.remove(&key),
            };
        }
        shared.retain(|_, r| r.until_ms > now_unix_ms);
        let all = shared.iter().map(|(k, r)| (k.clone(), r.clone())).collect();
        Box::pin(async move { Ok(all) })
    }
}
