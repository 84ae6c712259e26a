//! One budget ledger per run, charged by every layer.
//!
//! # Why one ledger and not a `max_retries` per layer?
//! When the HTTP client retries three times, the agent loop retries three times and the tool
//! wrapper retries three times, one failing call can cost 27 attempts and nobody sees it. A single
//! ledger that every layer charges (failed attempts included) makes that impossible: when the
//! retry dimension is spent, it is spent for everyone. Exhaustion is a first-class outcome that
//! leads to degrade or terminate, never to an unbounded loop.
//!
//! The ledger tracks the six dimensions of SPEC §3 (retries, replanning depth, substitutions,
//! model escalations, latency, cost) plus `recoveries`, the total number of recovery actions,
//! which is the single budget `R` that the benchmark gives every strategy alike. Counts are
//! unsigned and charges saturate, so a budget can never go negative.

use serde::{Deserialize, Serialize};
use thiserror::Error;

/// One dimension of the budget vector.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, strum::EnumCount)]
#[serde(rename_all = "snake_case")]
pub enum Dimension {
    /// Repeated attempts of the same call.
    Retries,
    /// Replanning depth (how many times the plan was rebuilt).
    Replans,
    /// Substitutions of an equivalent tool or source.
    Substitutions,
    /// Escalations to a stronger or fallback model, or to a human.
    Escalations,
    /// Total recovery actions of any kind (the benchmark's `R`).
    Recoveries,
    /// Elapsed time in milliseconds (wall clock or simulated).
    LatencyMs,
    /// Cost in the caller's unit (tokens, or micro-dollars).
    Cost,
}

// A dimension added to the enum and not to `ALL` fails to compile here.
const _: () = assert!(Dimension::ALL.len() == <Dimension as strum::EnumCount>::COUNT);

impl Dimension {
    /// Every dimension, in declaration order.
    pub const ALL: [Dimension; 7] = [
        Dimension::Retries,
        Dimension::Replans,
        Dimension::Substitutions,
        Dimension::Escalations,
        Dimension::Recoveries,
        Dimension::LatencyMs,
        Dimension::Cost,
    ];
}

impl std::fmt::Display for Dimension {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = match self {
            Dimension::Retries => "retries",
            Dimension::Replans => "replans",
            Dimension::Substitutions => "substitutions",
            Dimension::Escalations => "escalations",
            Dimension::Recoveries => "recoveries",
            Dimension::LatencyMs => "latency_ms",
            Dimension::Cost => "cost",
        };
        f.write_str(s)
    }
}

/// An amount in every dimension: used for limits, spending and charges alike.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Amounts {
    /// Retries.
    pub retries: u64,
    /// Replans.
    pub replans: u64,
    /// Substitutions.
    pub substitutions: u64,
    /// Escalations.
    pub escalations: u64,
    /// Recovery actions of any kind.
    pub recoveries: u64,
    /// Milliseconds.
    pub latency_ms: u64,
    /// Cost units.
    pub cost: u64,
}

impl Amounts {
    /// The amount in one dimension.
    pub fn get(&self, d: Dimension) -> u64 {
        match d {
            Dimension::Retries => self.retries,
            Dimension::Replans => self.replans,
            Dimension::Substitutions => self.substitutions,
            Dimension::Escalations => self.escalations,
            Dimension::Recoveries => self.recoveries,
            Dimension::LatencyMs => self.latency_ms,
            Dimension::Cost => self.cost,
        }
    }

    fn get_mut(&mut self, d: Dimension) -> &mut u64 {
        match d {
            Dimension::Retries => &mut self.retries,
            Dimension::Replans => &mut self.replans,
            Dimension::Substitutions => &mut self.substitutions,
            Dimension::Escalations => &mut self.escalations,
            Dimension::Recoveries => &mut self.recoveries,
            Dimension::LatencyMs => &mut self.latency_ms,
            Dimension::Cost => &mut self.cost,
        }
    }

    /// An amount of one unit in `d` and zero elsewhere.
    pub fn one(d: Dimension) -> Amounts {
        let mut a = Amounts::default();
        *a.get_mut(d) = 1;
        a
    }

    /// Subtracts `other` from this amount, stopping at zero.
    pub fn saturating_sub_of(&mut self, other: &Amounts) {
        for d in Dimension::ALL {
            let v = self.get_mut(d);
            *v = v.saturating_sub(other.get(d));
        }
    }

    /// Adds `other` to this amount, saturating at `u64::MAX`.
    pub fn saturating_add(&mut self, other: &Amounts) {
        for d in Dimension::ALL {
            let v = self.get_mut(d);
            *v = v.saturating_add(other.get(d));
        }
    }
}

/// The limits of a run's budget. `u64::MAX` means unlimited.
pub type BudgetLimits = Amounts;

impl BudgetLimits {
    /// No limit in any dimension.
    pub fn unlimited() -> BudgetLimits {
        Amounts {
            retries: u64::MAX,
            replans: u64::MAX,
            substitutions: u64::MAX,
            escalations: u64::MAX,
            recoveries: u64::MAX,
            latency_ms: u64::MAX,
            cost: u64::MAX,
        }
    }

    /// The documented defaults: 3 retries, 2 replans, 2 substitutions, 1 escalation, 5 recovery
    /// actions in all, 120 s of latency, unlimited cost.
    pub fn defaults() -> BudgetLimits {
        Amounts {
            retries: 3,
            replans: 2,
            substitutions: 2,
            escalations: 1,
            recoveries: 5,
            latency_ms: 120_000,
            cost: u64::MAX,
        }
    }

    /// The same limits with a total recovery budget of `r` actions.
    pub fn with_recoveries(mut self, r: u64) -> BudgetLimits {
        self.recoveries = r;
        self
    }
}

/// A charge was refused because it would overspend a dimension.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error, Serialize, Deserialize)]
#[error("budget exhausted: {dimension} (limit {limit}, spent {spent}, asked {asked})")]
pub struct Exhausted {
    /// The dimension that would be overspent.
    pub dimension: Dimension,
    /// Its limit.
    pub limit: u64,
    /// What was already spent.
    pub spent: u64,
    /// What the refused charge asked for.
    pub asked: u64,
}

/// The ledger of one run: limits and what has been spent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BudgetLedger {
    limits: BudgetLimits,
    spent: Amounts,
}

impl Default for BudgetLedger {
    fn default() -> Self {
        BudgetLedger::new(BudgetLimits::defaults())
    }
}

impl BudgetLedger {
    /// A fresh ledger with nothing spent.
    pub fn new(limits: BudgetLimits) -> Self {
        BudgetLedger {
            limits,
            spent: Amounts::default(),
        }
    }

    /// The limits.
    pub fn limits(&self) -> &BudgetLimits {
        &self.limits
    }

    /// What has been spent so far (including refused-but-recorded usage such as latency).
    pub fn spent(&self) -> &Amounts {
        &self.spent
    }

    /// What is left in each dimension (never negative).
    pub fn remaining(&self) -> Amounts {
        let mut r = Amounts::default();
        for d in Dimension::ALL {
            *r.get_mut(d) = self.limits.get(d).saturating_sub(self.spent.get(d));
        }
        r
    }

    /// Whether `charge` fits in every dimension.
    pub fn can_afford(&self, charge: &Amounts) -> bool {
        self.first_overspend(charge).is_none()
    }

    fn first_overspend(&self, charge: &Amounts) -> Option<Exhausted> {
        Dimension::ALL.into_iter().find_map(|d| {
            let asked = charge.get(d);
            let spent = self.spent.get(d);
            let limit = self.limits.get(d);
            (asked > 0 && spent.saturating_add(asked) > limit).then_some(Exhausted {
                dimension: d,
                limit,
                spent,
                asked,
            })
        })
    }

    /// Charges a planned action, all or nothing: if any dimension would be overspent, nothing is
    /// charged and the first such dimension is returned.
    pub fn charge(&mut self, charge: &Amounts) -> Result<(), Exhausted> {
        if let Some(e) = self.first_overspend(charge) {
            return Err(e);
        }
        self.spent.saturating_add(charge);
        Ok(())
    }

    /// Records usage that already happened (time passed, tokens consumed by a failed call). It
    /// is always recorded, even past the limit, because it was really spent; the return value
    /// says which dimension is now exhausted, if any.
    pub fn record_usage(&mut self, usage: &Amounts) -> Option<Dimension> {
        self.spent.saturating_add(usage);
        self.exhausted()
    }

    /// The first dimension whose limit is reached among latency and cost (the dimensions that
    /// end a run when spent). Count dimensions only block the actions that need them.
    pub fn exhausted(&self) -> Option<Dimension> {
        [Dimension::LatencyMs, Dimension::Cost]
            .into_iter()
            .find(|&d| self.limits.get(d) != u64::MAX && self.spent.get(d) >= self.limits.get(d))
    }

    /// Whether no recovery action of any kind can be afforded any more.
    pub fn recoveries_exhausted(&self) -> bool {
        self.spent.recoveries >= self.limits.recoveries || self.exhausted().is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn charge_is_all_or_nothing() {
        let mut l = BudgetLedger::new(BudgetLimits::defaults().with_recoveries(1));
        let mut c = Amounts::one(Dimension::Retries);
        c.recoveries = 1;
        assert!(l.charge(&c).is_ok());
        let err = l.charge(&c);
        assert!(matches!(
            err,
            Err(Exhausted {
                dimension: Dimension::Recoveries,
                ..
            })
        ));
        assert_eq!(
            l.spent().retries,
            1,
            "refused charge must not spend retries"
        );
        assert_eq!(l.remaining().recoveries, 0);
    }

    #[test]
    fn usage_past_the_limit_is_recorded_and_reported() {
        let mut l = BudgetLedger::new(Amounts {
            latency_ms: 100,
            ..BudgetLimits::unlimited()
        });
        assert_eq!(
            l.record_usage(&Amounts {
                latency_ms: 60,
                ..Amounts::default()
            }),
            None
        );
        assert_eq!(
            l.record_usage(&Amounts {
                latency_ms: 60,
                ..Amounts::default()
            }),
            Some(Dimension::LatencyMs)
        );
        assert_eq!(l.spent().latency_ms, 120);
        assert_eq!(l.remaining().latency_ms, 0);
        assert!(l.recoveries_exhausted());
    }
}
