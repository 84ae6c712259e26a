//! The fault families every report uses, and the family weights that rescale a fault model.
//!
//! The benchmark draws its faults from a data file ([`crate::faultmodel`]); every fault there
//! belongs to one [`Family`], and [`Mix`] (`--mix runtime=…,output=…`) rescales each family's
//! total weight.

use serde::{Deserialize, Serialize};

/// The four tool/data fault families of the issue, plus agent-side faults.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Family {
    /// Timeouts, exceptions, rate limits, unavailability.
    Runtime,
    /// Malformed, empty, truncated output; schema drift.
    Output,
    /// Stale or contradictory data.
    Context,
    /// Plausible but wrong, with no error signal.
    Semantic,
    /// The agent's own mistakes: malformed arguments, wrong tool, missing step, repetition.
    Agent,
}

impl Family {
    /// Every family.
    pub const ALL: [Family; 5] = [
        Family::Runtime,
        Family::Output,
        Family::Context,
        Family::Semantic,
        Family::Agent,
    ];

    /// The snake_case name.
    pub fn as_str(self) -> &'static str {
        match self {
            Family::Runtime => "runtime",
            Family::Output => "output",
            Family::Context => "context",
            Family::Semantic => "semantic",
            Family::Agent => "agent",
        }
    }
}

/// The weights of the fault families.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Mix {
    /// Runtime faults.
    pub runtime: f64,
    /// Tool-output faults.
    pub output: f64,
    /// Context faults.
    pub context: f64,
    /// Semantic faults.
    pub semantic: f64,
    /// Agent-side faults.
    pub agent: f64,
}

impl Default for Mix {
    fn default() -> Self {
        Mix {
            runtime: 0.35,
            output: 0.2,
            context: 0.15,
            semantic: 0.1,
            agent: 0.2,
        }
    }
}

impl Mix {
    /// Only semantic faults: the silent-failure setting.
    pub fn silent() -> Mix {
        Mix {
            runtime: 0.0,
            output: 0.0,
            context: 0.0,
            semantic: 1.0,
            agent: 0.0,
        }
    }

    /// Parses `runtime=0.4,output=0.2,...`; families left out get weight 0.
    pub fn parse(s: &str) -> Result<Mix, String> {
        let mut m = Mix {
            runtime: 0.0,
            output: 0.0,
            context: 0.0,
            semantic: 0.0,
            agent: 0.0,
        };
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (k, v) = part
                .split_once('=')
                .ok_or_else(|| format!("expected family=weight, got {part:?}"))?;
            let w: f64 = v
                .trim()
                .parse()
                .map_err(|_| format!("weight of {k:?} is not a number: {v:?}"))?;
            if !(w.is_finite() && w >= 0.0) {
                return Err(format!("weight of {k:?} must be ≥ 0, got {w}"));
            }
            match k.trim() {
                "runtime" => m.runtime = w,
                "output" => m.output = w,
                "context" => m.context = w,
                "semantic" => m.semantic = w,
                "agent" => m.agent = w,
                other => {
                    return Err(format!(
                        "unknown family {other:?} (runtime, output, context, semantic, agent)"
                    ));
                }
            }
        }
        if m.total() <= 0.0 {
            return Err("at least one family needs a weight above 0".into());
        }
        Ok(m)
    }

    /// The weight of family `f`.
    pub fn weight(&self, f: Family) -> f64 {
        match f {
            Family::Runtime => self.runtime,
            Family::Output => self.output,
            Family::Context => self.context,
            Family::Semantic => self.semantic,
            Family::Agent => self.agent,
        }
    }

    fn total(&self) -> f64 {
        Family::ALL.iter().map(|f| self.weight(*f)).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mix_parsing_rejects_bad_input() {
        assert!(Mix::parse("runtime=1,agent=0.5").is_ok());
        assert!(Mix::parse("runtime").is_err());
        assert!(Mix::parse("cosmic=1").is_err());
        assert!(Mix::parse("runtime=-1").is_err());
        assert!(Mix::parse("runtime=0").is_err());
        assert_eq!(Mix::silent().weight(Family::Semantic), 1.0);
    }
}
