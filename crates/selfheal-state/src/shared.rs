//! The shared tier: small facts every replica should know, read from local memory.
//!
//! A request must never wait on Redis to learn that an upstream is down: [`Shared::get`] and
//! [`Shared::publish`] touch a local map only. A background task ([`Shared::with_store`])
//! pushes this replica's writes and pulls everyone's records in one round trip
//! ([`StateStore::sync_shared`]) every refresh interval, and at once after a local write. So:
//!
//! - a record published here reaches the store within one round trip;
//! - it reaches another replica within that replica's refresh interval after that: the bounded
//!   staleness is one refresh interval plus two round trips (1 s plus a millisecond or two on a
//!   LAN, by default);
//! - concurrent writes of one key: the last to reach the store wins (records are facts with an
//!   expiry — "open until T" — not counters);
//! - every record expires at its `until_ms` (Unix time, so replicas' clocks must agree to well
//!   under a refresh interval), so the store holds a bounded set: one per configured upstream,
//!   one per learned target.
//!
//! While the store is down, the local map keeps serving; this replica's writes are kept and sent
//! when it returns, and after an outage every live record this replica published is sent again
//! (a restarted Redis has forgotten them).

use std::collections::HashMap;
use std::sync::{Arc, RwLock, Weak};
use std::time::Duration;

use tokio::sync::Notify;

use crate::{StateStore, StoreError, unix_ms};

/// One shared fact: who published it, until when it holds, and what it says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SharedRecord {
    /// The replica that published it ([`Shared::origin`]).
    pub origin: u64,
    /// Unix time in ms after which it no longer holds.
    pub until_ms: u64,
    /// What it says (short text; never a secret).
    pub payload: String,
}

impl SharedRecord {
    /// `origin until_ms payload`, origin in hex: the form stored in Redis.
    pub fn encode(&self) -> String {
        format!("{:x} {} {}", self.origin, self.until_ms, self.payload)
    }

    /// The inverse of [`SharedRecord::encode`].
    pub fn decode(s: &str) -> Option<SharedRecord> {
        let mut parts = s.splitn(3, ' ');
        let origin = u64::from_str_radix(parts.next()?, 16).ok()?;
        let until_ms = parts.next()?.parse().ok()?;
        Some(SharedRecord {
            origin,
            until_ms,
            payload: parts.next()?.to_owned(),
        })
    }
}

/// A local slot: the record (`None`: removed here, removal not yet sent) and whether this
/// replica's latest write of it has reached the store.
#[derive(Debug, Clone)]
struct Slot {
    rec: Option<SharedRecord>,
    /// Bumped by every local write.
    generation: u64,
    /// The generation last sent successfully.
    sent: u64,
}

impl Slot {
    fn dirty(&self) -> bool {
        self.generation != self.sent
    }
}

#[derive(Debug)]
struct Inner {
    origin: u64,
    local: RwLock<HashMap<String, Slot>>,
    store: Option<Arc<dyn StateStore>>,
    notify: Notify,
}

/// The shared tier. Cheap to clone (one `Arc`).
#[derive(Debug, Clone)]
pub struct Shared {
    inner: Arc<Inner>,
}

impl Shared {
    /// A tier that shares with no one: one process, nothing to sync (the embedded default).
    pub fn local() -> Shared {
        Shared {
            inner: Arc::new(Inner {
                origin: random_origin(),
                local: RwLock::new(HashMap::new()),
                store: None,
                notify: Notify::new(),
            }),
        }
    }

    /// A tier synced through `store` every `refresh`, by a task spawned on the current tokio
    /// runtime (it stops when the last clone of the tier is dropped).
    pub fn with_store(store: Arc<dyn StateStore>, refresh: Duration) -> Result<Shared, StoreError> {
        let handle = tokio::runtime::Handle::try_current()
            .map_err(|_| StoreError::Setup("the shared tier needs a tokio runtime".into()))?;
        let shared = Shared {
            inner: Arc::new(Inner {
                origin: random_origin(),
                local: RwLock::new(HashMap::new()),
                store: Some(store),
                notify: Notify::new(),
            }),
        };
        let weak = Arc::downgrade(&shared.inner);
        handle.spawn(sync_loop(weak, refresh.max(Duration::from_millis(10))));
        Ok(shared)
    }

    /// This replica's id (random per start), the `origin` of what it publishes.
    pub fn origin(&self) -> u64 {
        self.inner.origin
    }

    /// The store behind the tier, if any.
    pub fn store(&self) -> Option<&Arc<dyn StateStore>> {
        self.inner.store.as_ref()
    }

    /// Whether the store answers (always, without one).
    pub fn store_up(&self) -> bool {
        self.inner.store.as_ref().is_none_or(|s| s.health().is_up())
    }

    /// Whether no record is held (expired ones included): one read lock, no allocation.
    pub fn is_empty(&self) -> bool {
        self.inner
            .local
            .read()
            .map(|l| l.is_empty())
            .unwrap_or(true)
    }

    /// The record under `key` if it holds at `now_unix_ms`. Local memory only.
    pub fn get(&self, key: &str, now_unix_ms: u64) -> Option<SharedRecord> {
        let local = self.inner.local.read().unwrap_or_else(|p| p.into_inner());
        local
            .get(key)
            .and_then(|s| s.rec.as_ref())
            .filter(|r| r.until_ms > now_unix_ms)
            .cloned()
    }

    /// The records that hold at `now_unix_ms` whose key starts with `prefix`.
    pub fn scan(&self, prefix: &str, now_unix_ms: u64) -> Vec<(String, SharedRecord)> {
        let local = self.inner.local.read().unwrap_or_else(|p| p.into_inner());
        local
            .iter()
            .filter(|(k, _)| k.starts_with(prefix))
            .filter_map(|(k, s)| s.rec.as_ref().map(|r| (k, r)))
            .filter(|(_, r)| r.until_ms > now_unix_ms)
            .map(|(k, r)| (k.clone(), r.clone()))
            .collect()
    }

    /// Publishes `payload` under `key` until `until_ms` (Unix ms): at once here, to the others
    /// within their refresh interval.
    pub fn publish(&self, key: &str, payload: impl Into<String>, until_ms: u64) {
        let rec = SharedRecord {
            origin: self.inner.origin,
            until_ms,
            payload: payload.into(),
        };
        self.write(key, Some(rec));
    }

    /// Removes `key`: at once here, from the others within their refresh interval.
    pub fn remove(&self, key: &str) {
        let exists = self
            .inner
            .local
            .read()
            .map(|l| l.get(key).is_some_and(|s| s.rec.is_some()))
            .unwrap_or(true);
        if exists {
            self.write(key, None);
        }
    }

    fn write(&self, key: &str, rec: Option<SharedRecord>) {
        {
            let mut local = self.inner.local.write().unwrap_or_else(|p| p.into_inner());
            let slot = local.entry(key.to_owned()).or_insert(Slot {
                rec: None,
                generation: 0,
                sent: 0,
            });
            slot.rec = rec;
            slot.generation += 1;
            if self.inner.store.is_none() {
                slot.sent = slot.generation;
                if slot.rec.is_none() {
                    local.remove(key);
                }
            }
        }
        if self.inner.store.is_some() {
            self.inner.notify.notify_one();
        }
    }

    /// One sync with the store now: sends local writes, takes everyone's records. What the
    /// background task does every refresh interval.
    pub async fn sync_now(&self) -> Result<(), StoreError> {
        self.inner.sync_once().await
    }
}

impl Inner {
    async fn sync_once(&self) -> Result<(), StoreError> {
        let Some(store) = &self.store else {
            return Ok(());
        };
        let now = unix_ms();
        let writes: Vec<(String, u64, Option<crate::SharedRecord>)> = {
            let local = self.local.read().unwrap_or_else(|p| p.into_inner());
            local
                .iter()
                .filter(|(_, s)| s.dirty())
                .map(|(k, s)| (k.clone(), s.generation, s.rec.clone()))
                .collect()
        };
        let batch = writes
            .iter()
            .map(|(k, _, r)| (k.clone(), r.clone()))
            .collect();
        let remote = store.sync_shared(batch, now).await?;
        let mut remote: HashMap<String, SharedRecord> = remote.into_iter().collect();
        let mut local = self.local.write().unwrap_or_else(|p| p.into_inner());
        for (k, generation, _) in &writes {
            if let Some(s) = local.get_mut(k) {
                s.sent = s.sent.max(*generation);
            }
        }
        // What this replica had written and is not dirty follows the store; dirty slots (written
        // since the batch left) keep their local value until their own sync.
        local.retain(|k, s| {
            if s.dirty() {
                remote.remove(k);
                return true;
            }
            match remote.remove(k) {
                Some(r) => {
                    s.rec = Some(r);
                    true
                }
                None => false,
            }
        });
        for (k, r) in remote {
            local.insert(
                k,
                Slot {
                    rec: Some(r),
                    generation: 0,
                    sent: 0,
                },
            );
        }
        Ok(())
    }

    /// After an outage, marks every live record this replica published as unsent.
    fn republish_own(&self, now: u64) {
        let mut local = self.local.write().unwrap_or_else(|p| p.into_inner());
        for s in local.values_mut() {
            if s.rec
                .as_ref()
                .is_some_and(|r| r.origin == self.origin && r.until_ms > now)
            {
                s.generation += 1;
            }
        }
    }
}

async fn sync_loop(weak: Weak<Inner>, refresh: Duration) {
    loop {
        let Some(inner) = weak.upgrade() else { return };
        if inner.store.as_ref().is_some_and(|s| !s.health().is_up()) {
            // During an outage: the store may come back empty (a restarted Redis), so what this
            // replica published and still holds is sent again with the first sync that works.
            inner.republish_own(unix_ms());
        }
        // A failure is recorded (and logged once per outage) by the store's health.
        let _ = inner.sync_once().await;
        tokio::select! {
            () = tokio::time::sleep(refresh) => {}
            () = inner.notify.notified() => {}
        }
    }
}

fn random_origin() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.write_u32(std::process::id());
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_through_their_stored_form() {
        let r = SharedRecord {
            origin: 0xdead_beef,
            until_ms: 1_700_000_000_123,
            payload: "open since 12 with spaces".into(),
        };
        assert_eq!(SharedRecord::decode(&r.encode()), Some(r));
        assert_eq!(SharedRecord::decode("zz 1 x"), None);
        assert_eq!(SharedRecord::decode("ab 1"), None, "no payload separator");
    }

    #[test]
    fn a_local_tier_serves_what_it_published_until_it_expires() {
        let s = Shared::local();
        s.publish("upstream:a", "open", 2_000);
        assert_eq!(
            s.get("upstream:a", 1_000).map(|r| r.payload),
            Some("open".into())
        );
        assert_eq!(s.get("upstream:a", 2_000), None, "expired");
        assert_eq!(s.scan("upstream:", 1_000).len(), 1);
        s.remove("upstream:a");
        assert_eq!(s.get("upstream:a", 1_000), None);
    }
}
