//! Whether the store answers: one flag for `/readyz` and `/metrics`, one warning per outage.
//!
//! A store that is down must not be asked by every request (each would wait for its timeout)
//! nor logged by every request (thousands of identical lines hide the one that matters). An
//! outage is an *episode*: the first failure after a success logs one warning and lowers the
//! flag; while it is down, at most one operation per probe interval is let through to find out
//! whether it is back; the first success logs that sharing resumes.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The health of one store.
#[derive(Debug)]
pub struct Health {
    backend: &'static str,
    up: AtomicBool,
    errors_total: AtomicU64,
    episodes: AtomicU64,
    probe_every: Duration,
    last_probe: Mutex<Option<Instant>>,
}

impl Health {
    /// A healthy store of kind `backend`; while down, one operation per `probe_every` goes
    /// through.
    pub fn new(backend: &'static str, probe_every: Duration) -> Health {
        Health {
            backend,
            up: AtomicBool::new(true),
            errors_total: AtomicU64::new(0),
            episodes: AtomicU64::new(0),
            probe_every,
            last_probe: Mutex::new(None),
        }
    }

    /// Whether the last operation succeeded.
    pub fn is_up(&self) -> bool {
        self.up.load(Ordering::Relaxed)
    }

    /// Operations that failed or timed out.
    pub fn errors_total(&self) -> u64 {
        self.errors_total.load(Ordering::Relaxed)
    }

    /// Outages seen (each logged once).
    pub fn down_episodes(&self) -> u64 {
        self.episodes.load(Ordering::Relaxed)
    }

    /// Whether an operation may go to the store now: always when it is up; when down, one per
    /// probe interval.
    pub fn should_try(&self, now: Instant) -> bool {
        if self.is_up() {
            return true;
        }
        let mut last = self.last_probe.lock().unwrap_or_else(|p| p.into_inner());
        match *last {
            Some(t) if now.saturating_duration_since(t) < self.probe_every => false,
            _ => {
                *last = Some(now);
                true
            }
        }
    }

    /// An operation succeeded. Returns whether this ends an outage.
    pub fn succeeded(&self) -> bool {
        let was_up = self.up.swap(true, Ordering::Relaxed);
        if !was_up {
            tracing::warn!(
                target: "selfheal::state",
                backend = self.backend,
                "the state store answers again: sharing resumes"
            );
        }
        !was_up
    }

    /// An operation failed with `error`. Returns whether this starts an outage (and so was
    /// logged).
    pub fn failed(&self, error: &dyn std::fmt::Display) -> bool {
        self.errors_total.fetch_add(1, Ordering::Relaxed);
        let was_up = self.up.swap(false, Ordering::Relaxed);
        if was_up {
            self.episodes.fetch_add(1, Ordering::Relaxed);
            *self.last_probe.lock().unwrap_or_else(|p| p.into_inner()) = Some(Instant::now());
            tracing::warn!(
                target: "selfheal::state",
                backend = self.backend,
                %error,
                "the state store is unreachable: serving from local state until it returns \
                 (logged once per outage)"
            );
        }
        was_up
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_outage_is_one_episode_and_probes_are_rationed() {
        let h = Health::new("redis", Duration::from_millis(100));
        let t0 = Instant::now();
        assert!(h.should_try(t0));
        assert!(h.failed(&"refused"), "the first failure starts an outage");
        for _ in 0..50 {
            assert!(!h.failed(&"refused"), "later ones do not");
        }
        assert_eq!((h.down_episodes(), h.errors_total()), (1, 51));
        assert!(!h.is_up());
        assert!(!h.should_try(Instant::now()), "within the probe interval");
        let later = Instant::now() + Duration::from_millis(150);
        assert!(h.should_try(later), "one probe after the interval");
        assert!(!h.should_try(later), "and only one");
        assert!(h.succeeded(), "a success ends the outage");
        assert!(h.is_up() && h.should_try(later));
        assert!(!h.succeeded());
        h.failed(&"again");
        assert_eq!(h.down_episodes(), 2);
    }
}
