//! Gateway configuration: upstreams, model aliases with fallback chains, policy and budgets.
//!
//! `selfheal serve --upstream URL` needs no file at all: the one upstream becomes the default and
//! the client's model name is forwarded as is. A `selfheal.toml` adds named upstreams (keys come
//! from named environment variables, so no key is ever written in the file or logged), aliases
//! whose chain is walked on persistent or model errors, and the monitor's thresholds and the
//! per-run budget.

use std::collections::BTreeMap;

use serde::Deserialize;
use thiserror::Error;

use selfheal_core::budget::BudgetLimits;
use selfheal_core::monitor::MonitorConfig;
use selfheal_core::policy::RetryConfig;

/// One OpenAI-compatible upstream.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpstreamConfig {
    /// Base URL up to and including `/v1`.
    pub base_url: String,
    /// Name of the environment variable holding the API key.
    #[serde(default)]
    pub api_key_env: Option<String>,
    /// Request timeout in milliseconds (default 60 s).
    #[serde(default = "default_timeout_ms")]
    pub timeout_ms: u64,
}

fn default_timeout_ms() -> u64 {
    60_000
}

/// One step of a fallback chain: which upstream, under which model name.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Target {
    /// The upstream's name (a key of `upstreams`).
    pub upstream: String,
    /// The model name sent to it.
    pub model: String,
}

/// An alias the clients may name, resolved to a fallback chain.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelRoute {
    /// Tried in order; the next one on persistent or model errors.
    pub chain: Vec<Target>,
}

/// The whole gateway configuration.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GatewayConfig {
    /// Named upstreams.
    pub upstreams: BTreeMap<String, UpstreamConfig>,
    /// Model aliases.
    pub models: BTreeMap<String, ModelRoute>,
    /// The upstream that serves model names that are not aliases (none: such names are a 404).
    pub default_upstream: Option<String>,
    /// Forward only: no healing, no run state (the benchmark's floor).
    pub passthrough: bool,
    /// The tool-health monitor's thresholds.
    pub monitor: MonitorConfig,
    /// The budget of one run; keys left out keep their defaults (not zero).
    #[serde(deserialize_with = "budget_over_defaults")]
    pub budget: BudgetLimits,
    /// Backoff between retries of one upstream.
    pub retry: RetryConfig,
    /// Consecutive transient failures that open an upstream's breaker.
    pub breaker_failures: u32,
    /// How long an open upstream breaker stays open, in milliseconds.
    pub breaker_cooldown_ms: u64,
    /// Largest accepted request body, in bytes.
    pub max_body_bytes: usize,
    /// Most runs kept in memory.
    pub max_runs: usize,
    /// Seconds after which an idle run is forgotten.
    pub run_ttl_secs: u64,
}

impl Default for GatewayConfig {
    fn default() -> Self {
        GatewayConfig {
            upstreams: BTreeMap::new(),
            models: BTreeMap::new(),
            default_upstream: None,
            passthrough: false,
            monitor: MonitorConfig::default(),
            budget: BudgetLimits::defaults(),
            retry: RetryConfig::default(),
            breaker_failures: 5,
            breaker_cooldown_ms: 30_000,
            max_body_bytes: 8 * 1024 * 1024,
            max_runs: 10_000,
            run_ttl_secs: 3_600,
        }
    }
}

/// `[budget]` keys over [`BudgetLimits::defaults`]: a file that sets `retries` alone must not
/// set every other limit to zero.
fn budget_over_defaults<'de, D: serde::Deserializer<'de>>(d: D) -> Result<BudgetLimits, D::Error> {
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Partial {
        retries: Option<u64>,
        replans: Option<u64>,
        substitutions: Option<u64>,
        escalations: Option<u64>,
        recoveries: Option<u64>,
        latency_ms: Option<u64>,
        cost: Option<u64>,
    }
    let p = Partial::deserialize(d)?;
    let b = BudgetLimits::defaults();
    Ok(BudgetLimits {
        retries: p.retries.unwrap_or(b.retries),
        replans: p.replans.unwrap_or(b.replans),
        substitutions: p.substitutions.unwrap_or(b.substitutions),
        escalations: p.escalations.unwrap_or(b.escalations),
        recoveries: p.recoveries.unwrap_or(b.recoveries),
        latency_ms: p.latency_ms.unwrap_or(b.latency_ms),
        cost: p.cost.unwrap_or(b.cost),
    })
}

/// A configuration that cannot be used.
#[derive(Debug, Error)]
pub enum ConfigError {
    /// The TOML did not parse.
    #[error("cannot read the gateway config: {0}")]
    Toml(#[from] toml::de::Error),
    /// The TOML parsed but does not make sense.
    #[error("invalid gateway config: {0}")]
    Invalid(String),
}

impl GatewayConfig {
    /// A config with one upstream, `default`, serving every model name.
    pub fn for_upstream(base_url: impl Into<String>) -> GatewayConfig {
        let mut c = GatewayConfig::default();
        c.upstreams.insert(
            "default".into(),
            UpstreamConfig {
                base_url: base_url.into(),
                api_key_env: None,
                timeout_ms: default_timeout_ms(),
            },
        );
        c.default_upstream = Some("default".into());
        c
    }

    /// Parses and validates a TOML config.
    pub fn from_toml_str(s: &str) -> Result<GatewayConfig, ConfigError> {
        let c: GatewayConfig = toml::from_str(s)?;
        c.validate()?;
        Ok(c)
    }

    /// Checks that every name resolves and every number makes sense.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if let Some(d) = &self.default_upstream
            && !self.upstreams.contains_key(d)
        {
            return Err(ConfigError::Invalid(format!(
                "default_upstream `{d}` is not declared in [upstreams]"
            )));
        }
        for (alias, route) in &self.models {
            if route.chain.is_empty() {
                return Err(ConfigError::Invalid(format!(
                    "model `{alias}` has an empty chain"
                )));
            }
            for t in &route.chain {
                if !self.upstreams.contains_key(&t.upstream) {
                    return Err(ConfigError::Invalid(format!(
                        "model `{alias}` names unknown upstream `{}`",
                        t.upstream
                    )));
                }
            }
        }
        if self.max_runs == 0 {
            return Err(ConfigError::Invalid("max_runs must be at least 1".into()));
        }
        self.monitor
            .validate()
            .map_err(|e| ConfigError::Invalid(e.0))?;
        Ok(())
    }

    /// The fallback chain for a client's model name, or `None` when the name is unknown.
    pub fn route(&self, model: &str) -> Option<Vec<Target>> {
        if let Some(r) = self.models.get(model) {
            return Some(r.chain.clone());
        }
        self.default_upstream.as_ref().map(|u| {
            vec![Target {
                upstream: u.clone(),
                model: model.to_owned(),
            }]
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn toml_with_alias_chain_parses_and_routes() {
        let c = GatewayConfig::from_toml_str(
            r#"
            [upstreams.a]
            base_url = "http://127.0.0.1:1/v1"
            api_key_env = "A_KEY"
            [upstreams.b]
            base_url = "http://127.0.0.1:2/v1"
            [models.smart]
            chain = [{upstream = "a", model = "big"}, {upstream = "b", model = "small"}]
            [budget]
            retries = 2
            "#,
        )
        .unwrap();
        assert_eq!(c.route("smart").unwrap().len(), 2);
        assert!(c.route("other").is_none());
        assert_eq!(c.budget.retries, 2);
        assert_eq!(c.budget.recoveries, BudgetLimits::defaults().recoveries);
    }

    #[test]
    fn readme_example_parses() {
        let readme = include_str!("../../../README.md");
        let start = readme.find("```toml\ndefault_upstream").unwrap() + "```toml\n".len();
        let end = start + readme[start..].find("```").unwrap();
        let c = GatewayConfig::from_toml_str(&readme[start..end]).unwrap();
        assert_eq!(c.route("smart").unwrap().len(), 2);
        assert_eq!(c.budget.recoveries, 5);
    }

    #[test]
    fn unknown_upstream_is_refused() {
        let e = GatewayConfig::from_toml_str(
            "[models.x]\nchain = [{upstream = \"nope\", model = \"m\"}]\n",
        )
        .unwrap_err();
        assert!(e.to_string().contains("nope"));
    }
}
