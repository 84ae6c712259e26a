//! Per-run state that the conversation cannot rebuild, in a bounded store with expiry.
//!
//! Every request carries the whole conversation, so the run's tool history is replayed from the
//! messages. What is *not* in the messages — the monitor's breakers and cooldowns, the budget
//! spent on retries and re-asks, what the gateway already did — lives here, keyed by run id.
//! The store holds at most `capacity` runs; idle runs expire after a TTL and, when full, the
//! least recently used run is dropped. Both are counted.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use selfheal_core::budget::{BudgetLedger, BudgetLimits};
use selfheal_core::monitor::{Monitor, MonitorConfig};

use crate::request::Message;

/// Most action names remembered per run (the trace keeps them all).
const MAX_ACTIONS: usize = 32;

/// What the gateway remembers about one run.
#[derive(Debug)]
pub struct RunState {
    /// The run's tool-health monitor.
    pub monitor: Monitor,
    /// How many tool results of the conversation were already fed to the monitor.
    pub tool_results_seen: usize,
    /// The run's one budget ledger.
    pub ledger: BudgetLedger,
    /// Tool failures seen so far.
    pub failures: u64,
    /// Tool calls that succeeded so far.
    pub successes: u64,
    /// The last recovery actions taken (bounded).
    pub actions: Vec<String>,
    /// Requests served for this run.
    pub requests: u64,
}

impl RunState {
    /// A fresh run.
    pub fn new(monitor: MonitorConfig, budget: BudgetLimits) -> RunState {
        RunState {
            monitor: Monitor::new(monitor).unwrap_or_default(),
            tool_results_seen: 0,
            ledger: BudgetLedger::new(budget),
            failures: 0,
            successes: 0,
            actions: Vec::new(),
            requests: 0,
        }
    }

    /// Remembers an action (the oldest is dropped past the bound).
    pub fn act(&mut self, action: impl Into<String>) {
        if self.actions.len() == MAX_ACTIONS {
            self.actions.remove(0);
        }
        self.actions.push(action.into());
    }
}

struct Entry {
    state: Arc<Mutex<RunState>>,
    last_seen: Instant,
}

/// The bounded, expiring store of runs.
pub struct RunStore {
    inner: Mutex<HashMap<String, Entry>>,
    capacity: usize,
    ttl: Duration,
    monitor: MonitorConfig,
    budget: BudgetLimits,
    evicted: std::sync::atomic::AtomicU64,
}

impl std::fmt::Debug for RunStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunStore")
            .field("capacity", &self.capacity)
            .field("live", &self.len())
            .finish()
    }
}

impl RunStore {
    /// A store of at most `capacity` runs that forgets runs idle for `ttl`.
    pub fn new(
        capacity: usize,
        ttl: Duration,
        monitor: MonitorConfig,
        budget: BudgetLimits,
    ) -> RunStore {
        RunStore {
            inner: Mutex::new(HashMap::new()),
            capacity: capacity.max(1),
            ttl,
            monitor,
            budget,
            evicted: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// The run's state, created if new or expired.
    pub fn get(&self, id: &str, now: Instant) -> Arc<Mutex<RunState>> {
        let mut map = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(e) = map.get_mut(id)
            && now.duration_since(e.last_seen) < self.ttl
        {
            e.last_seen = now;
            return e.state.clone();
        }
        if map.len() >= self.capacity && !map.contains_key(id) {
            let before = map.len();
            let ttl = self.ttl;
            map.retain(|_, e| now.duration_since(e.last_seen) < ttl);
            if map.len() >= self.capacity
                && let Some(oldest) = map
                    .iter()
                    .min_by_key(|(_, e)| e.last_seen)
                    .map(|(k, _)| k.clone())
            {
                map.remove(&oldest);
            }
            self.evicted.fetch_add(
                (before - map.len()) as u64,
                std::sync::atomic::Ordering::Relaxed,
            );
        }
        let state = Arc::new(Mutex::new(RunState::new(self.monitor.clone(), self.budget)));
        map.insert(
            id.to_owned(),
            Entry {
                state: state.clone(),
                last_seen: now,
            },
        );
        state
    }

    /// Runs held now.
    pub fn len(&self) -> usize {
        self.inner.lock().map(|m| m.len()).unwrap_or(0)
    }

    /// Whether no run is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Runs dropped for capacity or expiry so far.
    pub fn evicted(&self) -> u64 {
        self.evicted.load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// The run id: the `x-selfheal-run` header, or a hash of the conversation's first system and
/// first user message (stable across the requests of one run, different between runs).
pub fn run_id(header: Option<&str>, messages: &[Message<'_>]) -> String {
    if let Some(h) = header.map(str::trim).filter(|h| !h.is_empty()) {
        return h.chars().take(128).collect();
    }
    let mut hasher = std::hash::DefaultHasher::new();
    for role in ["system", "user"] {
        if let Some(m) = messages.iter().find(|m| m.role() == role) {
            role.hash(&mut hasher);
            m.content.map(|c| c.get()).hash(&mut hasher);
        }
    }
    format!("r-{:016x}", hasher.finish())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn run_id_is_stable_over_a_growing_conversation() {
        let id = |messages: serde_json::Value| {
            let body = serde_json::to_vec(&json!({"model": "m", "messages": messages})).unwrap();
            let req = crate::request::ChatRequest::parse(&body).unwrap();
            (
                run_id(None, &req.messages),
                run_id(Some("mine"), &req.messages),
            )
        };
        let a = json!([{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]);
        let mut b = a.clone();
        b.as_array_mut()
            .unwrap()
            .push(json!({"role": "assistant", "content": "x"}));
        assert_eq!(id(a.clone()).0, id(b).0);
        assert_ne!(
            id(a.clone()).0,
            id(json!([{"role": "user", "content": "other"}])).0
        );
        assert_eq!(id(a).1, "mine");
    }

    #[test]
    fn store_is_bounded() {
        let s = RunStore::new(
            3,
            Duration::from_secs(60),
            MonitorConfig::default(),
            BudgetLimits::defaults(),
        );
        let now = Instant::now();
        for i in 0..10 {
            s.get(&format!("r{i}"), now + Duration::from_millis(i));
        }
        assert_eq!(s.len(), 3);
        assert_eq!(s.evicted(), 7);
    }
}
