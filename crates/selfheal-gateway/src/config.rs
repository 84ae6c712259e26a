//! Gateway configuration: upstreams, model aliases with fallback chains, policy and budgets.
//!
//! `selfheal serve --upstream URL` needs no file at all: the one upstream becomes the default and
//! the client's model name is forwarded as is. A `selfheal.toml` adds named upstreams with whose
//! credentials go to each (`auth`: the client's by default, or the operator's key from a named
//! environment variable, so no key is ever written in the file or logged), optional inbound
//! keys (only their SHA-256), aliases whose chain is walked as the recovery policy decides, the
//! policy itself (`[policy]`, the same format as `selfheal bench --policy`'s file), the
//! monitor's thresholds, the per-run budget, and the inbound bounds (`[server]`). Validation
//! checks names, URLs and numbers; [`GatewayConfig::missing_env`] the variables it names.

use std::collections::BTreeMap;

use serde::Deserialize;
use thiserror::Error;

use selfheal_core::{BudgetLimits, MonitorConfig, Policy, RetryConfig};

/// Whose credentials go to an upstream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Auth {
    /// The client's own `Authorization` or `api-key` header and its `OpenAI-Organization` and
    /// `OpenAI-Project` headers are forwarded (the default without `api_key_env`).
    Client,
    /// The operator's key, read at startup from `api_key_env`, is sent as a bearer token; the
    /// client's credentials are not forwarded (the default with `api_key_env`).
    Env,
    /// No credentials at all (a local model server).
    None,
}

/// One OpenAI-compatible upstream.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpstreamConfig {
    /// Base URL up to and including `/v1`.
    pub base_url: String,
    /// Name of the environment variable holding the operator's API key (`auth = "env"`).
    #[serde(default)]
    pub api_key_env: Option<String>,
    /// Whose credentials are sent; left out: `env` when `api_key_env` is set, else `client`.
    #[serde(default)]
    pub auth: Option<Auth>,
    /// How long to wait for the answer's head (status and headers), in milliseconds (default
    /// 60 s; `timeout_ms` is the old name). Never a total deadline: a stream or a long body that
    /// keeps arriving is not cut.
    #[serde(default = "default_timeout_ms", alias = "timeout_ms")]
    pub first_byte_timeout_ms: u64,
    /// How long to wait for a connection, in milliseconds (default 5 s).
    #[serde(default = "default_connect_timeout_ms")]
    pub connect_timeout_ms: u64,
    /// Longest silence between two pieces of the answer's body, in milliseconds (default 30 s).
    #[serde(default = "default_idle_timeout_ms")]
    pub idle_timeout_ms: u64,
}

impl UpstreamConfig {
    /// An upstream at `base_url` with the default timeouts and `auth`.
    pub fn new(base_url: impl Into<String>) -> UpstreamConfig {
        UpstreamConfig {
            base_url: base_url.into(),
            api_key_env: None,
            auth: None,
            first_byte_timeout_ms: default_timeout_ms(),
            connect_timeout_ms: default_connect_timeout_ms(),
            idle_timeout_ms: default_idle_timeout_ms(),
        }
    }

    /// The effective credential mode (see [`UpstreamConfig::auth`]).
    pub fn auth(&self) -> Auth {
        self.auth.unwrap_or(if self.api_key_env.is_some() {
            Auth::Env
        } else {
            Auth::Client
        })
    }
}

fn default_timeout_ms() -> u64 {
    60_000
}

fn default_connect_timeout_ms() -> u64 {
    5_000
}

fn default_idle_timeout_ms() -> u64 {
    30_000
}

/// Limits of the inbound side: how long a client may take and how many may connect.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServerConfig {
    /// Time a client has to send a request head, and the longest a kept-alive connection may
    /// sit idle, in milliseconds (default 10 s).
    pub header_read_timeout_ms: u64,
    /// Time a client has to send a request body, in milliseconds (default 30 s).
    pub body_read_timeout_ms: u64,
    /// Largest request head, in bytes (default 64 KiB): larger is a 431.
    pub max_header_bytes: usize,
    /// Most open client connections (default 1,024). At the cap a new connection takes the
    /// slot of one that has sent no whole request head, or else of the one kept alive longest
    /// without a request in flight (closed gracefully); when every connection has a request in
    /// flight, it is answered 503 and closed.
    pub max_connections: usize,
    /// On SIGTERM, how long in-flight requests may take to finish, in milliseconds (default 10 s).
    pub drain_timeout_ms: u64,
    /// What the client gets when the gateway writes the answer itself because the model's could
    /// not be given: its tool calls were left out (unusable even after a re-ask) or the run was
    /// stopped. `message` (the default): an assistant message that says so in words — which
    /// call, why, what the agent can do — so every client and framework shows it. `error`: an
    /// OpenAI-shaped error the SDKs raise (HTTP 422, or an `error` event on a stream whose
    /// head already went out).
    pub on_partial: OnPartial,
}

/// See [`ServerConfig::on_partial`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnPartial {
    /// An assistant message that says in words what was left out or why the run stopped.
    #[default]
    Message,
    /// An OpenAI-shaped error.
    Error,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            header_read_timeout_ms: 10_000,
            body_read_timeout_ms: 30_000,
            max_header_bytes: 64 * 1024,
            max_connections: 1_024,
            drain_timeout_ms: 10_000,
            on_partial: OnPartial::Message,
        }
    }
}

/// `[state]`: where replicas of the gateway share what they learn (see the deployment guide).
///
/// Without `url` the gateway keeps everything in its own memory, which is right for one
/// process. With `url = "redis://host:6379/0"` every replica pointed at that Redis shares its
/// upstream breakers (an open circuit is skipped by the others) and the targets it learned not
/// to stream tool calls, read from a local copy refreshed every `refresh_ms`.
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StateConfig {
    /// `redis://[user:password@]host:port[/db]`; unset: in memory, nothing shared.
    pub url: Option<String>,
    /// Prefix of every Redis key (default `selfheal`): deployments sharing one server keep
    /// theirs apart.
    pub prefix: String,
    /// How often the local copy of the shared records is refreshed, in milliseconds (default
    /// 1,000): the bound on how stale another replica's news can be, plus a round trip.
    pub refresh_ms: u64,
    /// Longest wait for one Redis operation, in milliseconds (default 250). Past it, the
    /// operation counts as failed and the gateway goes on with its local state.
    pub timeout_ms: u64,
}

impl Default for StateConfig {
    fn default() -> Self {
        StateConfig {
            url: None,
            prefix: "selfheal".into(),
            refresh_ms: 1_000,
            timeout_ms: 250,
        }
    }
}

impl std::fmt::Debug for StateConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The URL may hold Redis's password.
        f.debug_struct("StateConfig")
            .field("url", &self.url.as_deref().map(selfheal_state::redact_url))
            .field("prefix", &self.prefix)
            .field("refresh_ms", &self.refresh_ms)
            .field("timeout_ms", &self.timeout_ms)
            .finish()
    }
}

impl StateConfig {
    fn validate(&self) -> Result<(), ConfigError> {
        if let Some(url) = &self.url
            && !url.starts_with("redis://")
        {
            return Err(ConfigError::Invalid(format!(
                "state.url `{}` must be a redis:// URL",
                selfheal_state::redact_url(url)
            )));
        }
        if self.refresh_ms < 10 || self.timeout_ms == 0 {
            return Err(ConfigError::Invalid(
                "state.refresh_ms must be at least 10 and state.timeout_ms at least 1".into(),
            ));
        }
        if self.prefix.is_empty() || self.prefix.contains(char::is_whitespace) {
            return Err(ConfigError::Invalid(
                "state.prefix must be a non-empty word".into(),
            ));
        }
        Ok(())
    }
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

/// What the operator knows about one of the agents' tools (`[tools.NAME]`): the core's
/// [`selfheal_core::contract::ToolConfig`], one type for every front-end that reads the table
/// (the MCP proxy's `--config` takes the same keys). The gateway never calls a tool; it uses
/// this to name the substitute in its guidance and to ask the agent for a cross-check through
/// the agent's own tool loop (see `recover`).
pub use selfheal_core::contract::ToolConfig;

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
    /// The recovery policy: which action each failure class gets, in which order, and the
    /// backoff of retries. `[policy]` takes the policy file's format (`[policy.ladders]`,
    /// `[policy.last_chance]`, `[policy.retry]`, `max_actions_per_failure`); classes left out
    /// keep the default ladders.
    #[serde(deserialize_with = "policy_table")]
    pub policy: Policy,
    /// Shorthand for `[policy.retry]`, kept for configs written before the gateway took a
    /// policy; folded into `policy` when the file is read.
    pub retry: Option<RetryConfig>,
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
    /// Largest upstream answer read, in bytes (default 32 MiB).
    pub max_upstream_body_bytes: usize,
    /// Keys a client must present (`Authorization: Bearer KEY`, `api-key: KEY` or
    /// `x-selfheal-key: KEY`), by key id: the lowercase hex SHA-256 of each key, never the key.
    /// Empty: the gateway asks for no key.
    pub inbound_keys: BTreeMap<String, String>,
    /// Name of the environment variable holding the secret that keys run ids (unset: a random
    /// secret per start, so run ids do not survive a restart).
    pub run_secret_env: Option<String>,
    /// Inbound limits.
    pub server: ServerConfig,
    /// The agents' tools the operator describes, by name (see [`ToolConfig`]).
    pub tools: BTreeMap<String, ToolConfig>,
    /// Where replicas share state (`[state]`; in memory when unset).
    pub state: StateConfig,
    /// Where spans are exported (`[telemetry]`; nowhere when unset).
    pub telemetry: TelemetryConfig,
    /// How much a model may generate (`[limits]`).
    pub limits: LimitsConfig,
}

/// The default of `[limits] max_wait_ms`: 30 s, well inside the timeouts clients commonly
/// give a request (the `openai` SDKs wait 10 minutes; proxies in front often 60 s).
pub(crate) const DEFAULT_MAX_WAIT_MS: u64 = 30_000;

/// `[limits]`: bounds on what a model generates (issue 31, item 4) and on how long a request is
/// held.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LimitsConfig {
    /// The output limit the gateway sets upstream when the client set none (chat's
    /// `max_tokens` or `max_completion_tokens`, the Responses API's `max_output_tokens`; the
    /// Messages API always has one). Unset (the default): the request goes as the client wrote
    /// it. A client's own limit is never changed. A request it was set on reports the `cap`
    /// action.
    pub default_max_tokens: Option<u32>,
    /// When the model's output counts as degenerate (`[limits.degenerate]`: a run of
    /// whitespace or one piece repeated back to back): such output is cut, and re-asked while
    /// nothing of it reached the client, else flagged `partial`.
    pub degenerate: selfheal_core::degenerate::Limits,
    /// The longest the gateway holds a request to wait out the delay of a retry the core
    /// decided for a tool's failure (its backoff, or the tool's `Retry-After`), in
    /// milliseconds: the agent calls the tool again only after the model's next answer, so
    /// that answer is held. A retry whose delay is longer is not taken (the core's ladder
    /// moves on) and the wait asked for is reported, never shortened. 0: never hold.
    pub max_wait_ms: u64,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        LimitsConfig {
            default_max_tokens: None,
            degenerate: selfheal_core::degenerate::Limits::default(),
            max_wait_ms: DEFAULT_MAX_WAIT_MS,
        }
    }
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
            policy: Policy::default(),
            retry: None,
            breaker_failures: 5,
            breaker_cooldown_ms: 30_000,
            max_body_bytes: 8 * 1024 * 1024,
            max_runs: 10_000,
            run_ttl_secs: 3_600,
            max_upstream_body_bytes: 32 * 1024 * 1024,
            inbound_keys: BTreeMap::new(),
            run_secret_env: None,
            server: ServerConfig::default(),
            tools: BTreeMap::new(),
            state: StateConfig::default(),
            telemetry: TelemetryConfig::default(),
            limits: LimitsConfig::default(),
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

/// `[policy]` in the policy file's format, over the default policy.
fn policy_table<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Policy, D::Error> {
    let table = toml::Table::deserialize(d)?;
    let text = toml::to_string(&table).map_err(serde::de::Error::custom)?;
    Policy::from_toml_str(&text).map_err(serde::de::Error::custom)
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
        c.upstreams
            .insert("default".into(), UpstreamConfig::new(base_url));
        c.default_upstream = Some("default".into());
        c
    }

    /// Parses and validates a TOML config.
    pub fn from_toml_str(s: &str) -> Result<GatewayConfig, ConfigError> {
        let mut c: GatewayConfig = toml::from_str(s)?;
        if let Some(retry) = c.retry.take() {
            c.policy.retry = retry;
        }
        c.validate()?;
        Ok(c)
    }

    /// Checks that every name resolves and every number makes sense.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.policy
            .validate()
            .map_err(|e| ConfigError::Invalid(e.to_string()))?;
        for (name, tool) in &self.tools {
            tool.validate(name).map_err(ConfigError::Invalid)?;
        }
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
        for (name, u) in &self.upstreams {
            validate_base_url(name, &u.base_url)?;
            if u.auth() == Auth::Env && u.api_key_env.is_none() {
                return Err(ConfigError::Invalid(format!(
                    "upstream `{name}` has auth = \"env\" but no api_key_env"
                )));
            }
            if u.first_byte_timeout_ms == 0 || u.idle_timeout_ms == 0 || u.connect_timeout_ms == 0 {
                return Err(ConfigError::Invalid(format!(
                    "upstream `{name}`: timeouts must be at least 1 ms"
                )));
            }
        }
        for (id, hash) in &self.inbound_keys {
            if hash.len() != 64 || !hash.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
                return Err(ConfigError::Invalid(format!(
                    "inbound key `{id}` must be the lowercase hex SHA-256 of the key \
                     (`printf %s KEY | sha256sum`), not the key"
                )));
            }
        }
        if self.server.max_connections == 0 {
            return Err(ConfigError::Invalid(
                "server.max_connections must be at least 1".into(),
            ));
        }
        if self.max_runs == 0 {
            return Err(ConfigError::Invalid("max_runs must be at least 1".into()));
        }
        self.state.validate()?;
        if self.limits.default_max_tokens == Some(0) {
            return Err(ConfigError::Invalid(
                "limits.default_max_tokens must be at least 1".into(),
            ));
        }
        self.limits
            .degenerate
            .validate()
            .map_err(|e| ConfigError::Invalid(format!("limits.{e}")))?;
        self.monitor
            .validate()
            .map_err(|e| ConfigError::Invalid(e.0))?;
        Ok(())
    }

    /// The environment variables the config names that are unset or empty: every upstream with
    /// `auth = "env"` needs its key, and `run_secret_env` its secret. Checked at startup, so a
    /// missing key is reported once instead of as a 401 per request.
    pub fn missing_env(&self, get: impl Fn(&str) -> Option<String>) -> Vec<String> {
        let mut out = Vec::new();
        let wanted = self
            .upstreams
            .values()
            .filter(|u| u.auth() == Auth::Env)
            .filter_map(|u| u.api_key_env.as_deref())
            .chain(self.run_secret_env.as_deref());
        for var in wanted {
            if get(var).is_none_or(|v| v.is_empty()) && !out.iter().any(|o| o == var) {
                out.push(var.to_owned());
            }
        }
        out
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

/// An upstream base URL must be absolute `http` or `https` with a host.
fn validate_base_url(name: &str, url: &str) -> Result<(), ConfigError> {
    match reqwest::Url::parse(url) {
        Ok(u) if matches!(u.scheme(), "http" | "https") && u.host().is_some() => Ok(()),
        Ok(u) => Err(ConfigError::Invalid(format!(
            "upstream `{name}`: base_url `{url}` must be http or https with a host, not `{}:`",
            u.scheme()
        ))),
        Err(e) => Err(ConfigError::Invalid(format!(
            "upstream `{name}`: base_url `{url}` is not a URL ({e})"
        ))),
    }
}

/// `[telemetry]`: where spans go.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TelemetryConfig {
    /// OTLP/HTTP base URL, e.g. `http://127.0.0.1:4318` (`/v1/traces` is appended). Unset: the
    /// standard `OTEL_EXPORTER_OTLP_*ENDPOINT` variables, else no export.
    pub otlp_endpoint: Option<String>,
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
    fn the_gateway_guides_example_parses() {
        // The commented example of the book's gateway guide (it was the README's).
        let readme = include_str!("../../../docs/guides/gateway.md");
        let start = readme.find("```toml\ndefault_upstream").unwrap() + "```toml\n".len();
        let end = start + readme[start..].find("```").unwrap();
        let c = GatewayConfig::from_toml_str(&readme[start..end]).unwrap();
        assert_eq!(c.route("smart").unwrap().len(), 2);
        assert_eq!(c.budget.recoveries, 5);
        let weather = &c.tools["weather.current"];
        assert_eq!(weather.substitute.as_deref(), Some("weather.backup"));
        assert!(weather.cross_check);
    }

    #[test]
    fn a_tool_cannot_substitute_itself_and_alone_is_checked_by_a_second_read() {
        let own = GatewayConfig::from_toml_str("[tools.a]\nsubstitute = \"a\"\n");
        assert!(matches!(own, Err(ConfigError::Invalid(m)) if m.contains("its own substitute")));
        let lone = GatewayConfig::from_toml_str("[tools.a]\ncross_check = true\n").unwrap();
        assert!(lone.tools["a"].cross_check && lone.tools["a"].substitute.is_none());
        let typo = GatewayConfig::from_toml_str("[tools.a]\nsubstitue = \"b\"\n");
        assert!(typo.is_err(), "unknown keys are refused");
    }

    #[test]
    fn a_tools_contract_and_freshness_are_read_and_checked() {
        let c = GatewayConfig::from_toml_str(
            "[tools.fx]\noutput = [\"rate\"]\nas_of = \"as_of\"\nrefresh = \"no_cache\"\n",
        )
        .unwrap();
        let fx = &c.tools["fx"];
        assert_eq!(fx.output, vec!["rate".to_owned()]);
        assert_eq!(fx.as_of.as_deref(), Some("as_of"));
        assert_eq!(fx.refresh.as_deref(), Some("no_cache"));
        assert_eq!(fx.max_age_ms, 3_600_000, "one hour unless set");
        let blank = GatewayConfig::from_toml_str("[tools.fx]\nrefresh = \" \"\n");
        assert!(matches!(blank, Err(ConfigError::Invalid(m)) if m.contains("not blank")));
        let never = GatewayConfig::from_toml_str("[tools.fx]\nas_of = \"t\"\nmax_age_ms = 0\n");
        assert!(matches!(never, Err(ConfigError::Invalid(m)) if m.contains("positive")));
    }

    #[test]
    fn auth_defaults_follow_api_key_env_and_old_timeout_name_is_read() {
        let c = GatewayConfig::from_toml_str(
            r#"
            [upstreams.a]
            base_url = "http://127.0.0.1:1/v1"
            api_key_env = "A_KEY"
            timeout_ms = 1500
            [upstreams.b]
            base_url = "http://127.0.0.1:2/v1"
            [upstreams.c]
            base_url = "http://127.0.0.1:3/v1"
            auth = "none"
            "#,
        )
        .unwrap();
        assert_eq!(c.upstreams["a"].auth(), Auth::Env);
        assert_eq!(c.upstreams["a"].first_byte_timeout_ms, 1500);
        assert_eq!(c.upstreams["b"].auth(), Auth::Client);
        assert_eq!(c.upstreams["c"].auth(), Auth::None);
        assert_eq!(c.missing_env(|_| None), vec!["A_KEY".to_string()]);
        assert!(c.missing_env(|_| Some("k".into())).is_empty());
    }

    #[test]
    fn bad_urls_env_without_key_and_plain_inbound_keys_are_refused() {
        for (toml, needle) in [
            ("[upstreams.a]\nbase_url = \"not-a-url\"\n", "not a URL"),
            (
                "[upstreams.a]\nbase_url = \"ftp://h/v1\"\n",
                "http or https",
            ),
            (
                "[upstreams.a]\nbase_url = \"http://h/v1\"\nauth = \"env\"\n",
                "no api_key_env",
            ),
            ("[inbound_keys]\nalice = \"sk-plain-key\"\n", "SHA-256"),
        ] {
            let e = GatewayConfig::from_toml_str(toml).unwrap_err().to_string();
            assert!(e.contains(needle), "{toml:?}: {e}");
        }
    }

    #[test]
    fn the_state_table_is_read_checked_and_its_password_never_shown() {
        let c = GatewayConfig::from_toml_str(
            "[state]\nurl = \"redis://:hunter2@10.0.0.5:6379/0\"\nrefresh_ms = 500\n",
        )
        .unwrap();
        assert_eq!(c.state.refresh_ms, 500);
        assert_eq!(c.state.timeout_ms, 250, "default");
        assert!(!format!("{c:?}").contains("hunter2"), "{c:?}");
        assert!(
            GatewayConfig::default().state.url.is_none(),
            "memory by default"
        );
        for (toml, needle) in [
            ("[state]\nurl = \"http://h:6379\"\n", "redis://"),
            ("[state]\nrefresh_ms = 0\n", "refresh_ms"),
            ("[state]\nprefix = \"\"\n", "prefix"),
        ] {
            let e = GatewayConfig::from_toml_str(toml).unwrap_err().to_string();
            assert!(e.contains(needle), "{toml:?}: {e}");
        }
        let e = GatewayConfig::from_toml_str("[state]\nurl = \"rediss://u:hunter2@h\"\n")
            .unwrap_err()
            .to_string();
        assert!(!e.contains("hunter2"), "{e}");
    }

    #[test]
    fn the_limits_table_is_read_and_checked() {
        let c = GatewayConfig::default();
        assert_eq!(c.limits.default_max_tokens, None, "off by default");
        assert_eq!(c.limits.degenerate.whitespace_run, 256);
        let c = GatewayConfig::from_toml_str(
            "[limits]\ndefault_max_tokens = 2048\n[limits.degenerate]\nwhitespace_run = 64\n",
        )
        .unwrap();
        assert_eq!(c.limits.default_max_tokens, Some(2048));
        assert_eq!(c.limits.degenerate.whitespace_run, 64);
        assert_eq!(c.limits.degenerate.repeat_bytes, 1_024, "default kept");
        for (toml, needle) in [
            ("[limits]\ndefault_max_tokens = 0\n", "at least 1"),
            ("[limits.degenerate]\nunit_bytes = 5000\n", "unit_bytes"),
            ("[limits]\nmax_tokens = 5\n", "unknown field"),
        ] {
            let e = GatewayConfig::from_toml_str(toml).unwrap_err().to_string();
            assert!(e.contains(needle), "{toml:?}: {e}");
        }
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
