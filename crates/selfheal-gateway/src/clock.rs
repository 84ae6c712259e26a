//! The gateway's clock for the core: milliseconds on the wall clock's base, advancing
//! monotonically.
//!
//! A run's time-based state — a hidden tool's cooldown, a breaker's open-since, trust's decay —
//! is stamped with this clock and, when replicas share runs (`[state]`), read back by another
//! process. A clock counting from each process's start made those stamps jump between
//! replicas: a cooldown begun on a replica started an hour earlier lasted an hour more on one
//! started since. This clock starts at the Unix time the process started and advances with
//! the monotonic clock, so every replica stamps on one base (as far as their clocks agree: NTP
//! keeps them well under a second apart) and a process never sees its own time go back.
//!
//! [`Wait`] is how a request is held while a retry's delay passes: the real clock, or a
//! simulation's own.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::future::BoxFuture;

/// Milliseconds since the Unix epoch as of the process's start, plus the monotonic time since.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Clock {
    /// The Unix time (ms) at `started`.
    base_ms: u64,
    started: Instant,
}

impl Clock {
    /// The clock of a process starting now.
    pub(crate) fn start() -> Clock {
        Clock::at(selfheal_state::unix_ms(), Instant::now())
    }

    /// A clock that read `base_ms` (Unix ms) at `started`.
    pub(crate) fn at(base_ms: u64, started: Instant) -> Clock {
        Clock { base_ms, started }
    }

    /// Now, in Unix milliseconds (monotonic within the process).
    pub(crate) fn now_ms(&self) -> u64 {
        self.ms_at(Instant::now())
    }

    /// The clock's reading at `now`.
    pub(crate) fn ms_at(&self, now: Instant) -> u64 {
        let elapsed = now.saturating_duration_since(self.started).as_millis();
        self.base_ms
            .saturating_add(u64::try_from(elapsed).unwrap_or(u64::MAX))
    }
}

/// How the gateway holds a request while the delay of a retry the core decided passes
/// (`[limits] max_wait_ms`): on the real clock by default. A simulation whose world keeps its
/// own clock (the benchmark's gateway arm) gives its own, which advances that clock by the
/// wait instead of sleeping — so the world sees exactly the wait the gateway made.
#[derive(Clone, Default)]
pub struct Wait(Option<Arc<dyn Fn(Duration) -> BoxFuture<'static, ()> + Send + Sync>>);

impl Wait {
    /// Waits on the real clock (`tokio::time::sleep`).
    pub fn real() -> Wait {
        Wait(None)
    }

    /// Waits by calling `wait` with the delay and awaiting what it returns.
    pub fn simulated(
        wait: impl Fn(Duration) -> BoxFuture<'static, ()> + Send + Sync + 'static,
    ) -> Wait {
        Wait(Some(Arc::new(wait)))
    }

    /// Holds for `delay`.
    pub(crate) async fn hold(&self, delay: Duration) {
        match &self.0 {
            None => tokio::time::sleep(delay).await,
            Some(wait) => wait(delay).await,
        }
    }
}

impl fmt::Debug for Wait {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.0.is_some() {
            "Wait(simulated)"
        } else {
            "Wait(real)"
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// Two replicas whose processes started ten minutes apart read the same time at the same
    /// instant (with per-process counters one read 600,005 ms and the other 5 ms).
    #[test]
    fn replicas_started_apart_share_one_time_base() {
        let t0 = Instant::now();
        let early = Clock::at(1_000_000, t0);
        let late = Clock::at(1_600_000, t0 + Duration::from_secs(600));
        let now = t0 + Duration::from_secs(605);
        assert_eq!(early.ms_at(now), 1_605_000);
        assert_eq!(late.ms_at(now), 1_605_000);
        assert_eq!(late.ms_at(t0), 1_600_000, "never before its own start");
    }
}
