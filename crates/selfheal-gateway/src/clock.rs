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

use std::time::Instant;

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
