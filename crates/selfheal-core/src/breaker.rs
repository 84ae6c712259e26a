//! One circuit breaker, used for tools and upstreams alike.
//!
//! A tool that keeps failing and a model provider that keeps failing are the same problem: stop
//! sending it work for a while, then let one probe through. The monitor keeps one [`Breaker`] per
//! tool inside a run; the gateway keeps one per upstream across runs (through
//! [`crate::call::Breakers`]). Both use this type, so a fix to the state machine reaches both.
//!
//! ```text
//!  Closed ──(after N failures in a row)──▶ Open ──(cooldown: calls or ms)──▶ HalfOpen
//!    ▲                                      ▲                                   │
//!    └──────────── success ─────────────────┼──────────── success ◀────────────┤
//!                                           └──────────── failure ◀────────────┘
//! ```

use serde::{Deserialize, Serialize};

/// The state of a circuit breaker.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum CircuitState {
    /// Calls flow.
    Closed,
    /// No calls until the cooldown passes.
    Open {
        /// The call index at which it opened (for cooldowns counted in calls).
        since_call: u64,
        /// The time at which it opened.
        since_ms: u64,
    },
    /// One probe call is allowed: success closes, failure re-opens.
    HalfOpen,
}

/// When a breaker opens and when it lets a probe through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BreakerConfig {
    /// Consecutive failures before the circuit opens (at least 1).
    pub after: u32,
    /// Calls (of anything the owner counts) after which an open circuit goes half-open; `0`
    /// disables.
    pub cooldown_calls: u32,
    /// Milliseconds after which an open circuit goes half-open; `0` disables.
    pub cooldown_ms: u64,
}

/// A failure streak and the circuit it drives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Breaker {
    streak: u32,
    circuit: CircuitState,
}

impl Default for Breaker {
    fn default() -> Self {
        Breaker {
            streak: 0,
            circuit: CircuitState::Closed,
        }
    }
}

impl Breaker {
    /// Consecutive failures so far.
    pub fn streak(&self) -> u32 {
        self.streak
    }

    /// The circuit's state (as of the last [`Breaker::cool`]).
    pub fn circuit(&self) -> CircuitState {
        self.circuit
    }

    /// Whether the circuit is open (no calls).
    pub fn is_open(&self) -> bool {
        matches!(self.circuit, CircuitState::Open { .. })
    }

    /// A failure: the streak grows; a half-open probe that failed, or a streak that reached
    /// `config.after`, opens the circuit at (`call`, `now_ms`).
    pub fn failure(&mut self, config: &BreakerConfig, call: u64, now_ms: u64) {
        self.streak = self.streak.saturating_add(1);
        self.circuit = match self.circuit {
            CircuitState::HalfOpen => CircuitState::Open {
                since_call: call,
                since_ms: now_ms,
            },
            CircuitState::Closed if self.streak >= config.after.max(1) => CircuitState::Open {
                since_call: call,
                since_ms: now_ms,
            },
            other => other,
        };
    }

    /// A success: the streak ends and the circuit closes.
    pub fn success(&mut self) {
        self.streak = 0;
        self.circuit = CircuitState::Closed;
    }

    /// Opens a closed circuit as if at (`call`, `since_ms`), on evidence from elsewhere (another
    /// replica's breaker of the same target); the streak is left as it is. An open or half-open
    /// circuit is left as it is: it has evidence of its own. Returns whether it opened.
    pub fn open_at(&mut self, call: u64, since_ms: u64) -> bool {
        if self.circuit != CircuitState::Closed {
            return false;
        }
        self.circuit = CircuitState::Open {
            since_call: call,
            since_ms,
        };
        true
    }

    /// Lets time pass: an open circuit whose cooldown is over goes half-open. Returns whether it
    /// changed.
    pub fn cool(&mut self, config: &BreakerConfig, call: u64, now_ms: u64) -> bool {
        if let CircuitState::Open {
            since_call,
            since_ms,
        } = self.circuit
        {
            let by_calls = config.cooldown_calls > 0
                && call.saturating_sub(since_call) > u64::from(config.cooldown_calls);
            let by_time =
                config.cooldown_ms > 0 && now_ms.saturating_sub(since_ms) >= config.cooldown_ms;
            if by_calls || by_time {
                self.circuit = CircuitState::HalfOpen;
                return true;
            }
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CFG: BreakerConfig = BreakerConfig {
        after: 3,
        cooldown_calls: 0,
        cooldown_ms: 1000,
    };

    #[test]
    fn opens_after_streak_probes_after_cooldown_and_reopens_on_failed_probe() {
        let mut b = Breaker::default();
        b.failure(&CFG, 1, 0);
        b.failure(&CFG, 2, 0);
        assert!(!b.is_open());
        b.failure(&CFG, 3, 10);
        assert_eq!(
            b.circuit(),
            CircuitState::Open {
                since_call: 3,
                since_ms: 10
            }
        );
        assert!(!b.cool(&CFG, 4, 500));
        assert!(b.cool(&CFG, 4, 1010));
        assert_eq!(b.circuit(), CircuitState::HalfOpen);
        b.failure(&CFG, 5, 1020);
        assert!(b.is_open(), "a failed probe re-opens");
        assert!(b.cool(&CFG, 6, 2020));
        b.success();
        assert_eq!((b.circuit(), b.streak()), (CircuitState::Closed, 0));
    }

    #[test]
    fn cooldown_in_calls() {
        let cfg = BreakerConfig {
            after: 1,
            cooldown_calls: 2,
            cooldown_ms: 0,
        };
        let mut b = Breaker::default();
        b.failure(&cfg, 10, 0);
        assert!(!b.cool(&cfg, 12, u64::MAX));
        assert!(b.cool(&cfg, 13, 0));
    }
}
