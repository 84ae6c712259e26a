//! Upstream calls: retries with backoff, the fallback chain, a cooldown breaker per upstream.
//!
//! All retries go through [`Upstreams::call`], and each one is charged to the run's budget
//! ledger first (through the `charge` callback), so no layer retries behind the ledger's back.
//! Transient errors (429 honouring `Retry-After`, 5xx, timeouts, broken connections, empty or
//! unreadable 200s) are retried on the same upstream; persistent or model errors move to the
//! next model of the chain; client errors (400, 401, ...) are the client's and go straight back.
//! An upstream that keeps failing opens its breaker and is skipped for a cooldown while another
//! model of the chain is available.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use axum::http::StatusCode;
use bytes::Bytes;
use futures_util::future::BoxFuture;

use selfheal_core::policy::{ActionKind, RetryConfig};
use selfheal_core::rng::SplitMix64;
use selfheal_runtime::client::{ClientConfig, ClientError, ModelClient};

use crate::config::{GatewayConfig, Target};
use crate::error::ApiError;
use crate::metrics::Histogram;

/// Retries of one upstream within one request, at most (the run's ledger may allow fewer).
const MAX_RETRIES_PER_TARGET: u32 = 3;

#[derive(Debug, Default)]
struct BreakerState {
    consecutive: u32,
    open_until: Option<Instant>,
}

/// One upstream and its breaker.
#[derive(Debug)]
pub struct Upstream {
    /// The client.
    pub client: ModelClient,
    breaker: Mutex<BreakerState>,
}

/// What one call through the chain did, besides its result.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct CallLog {
    /// `retry` / `fallback` / `cooldown_skip` entries, with the reason.
    pub events: Vec<(&'static str, String)>,
}

/// All upstreams by name.
#[derive(Debug)]
pub struct Upstreams {
    /// How long each attempt took (every retry and fallback on its own).
    pub attempt_seconds: Histogram,
    map: HashMap<String, Upstream>,
    retry: RetryConfig,
    breaker_failures: u32,
    cooldown: Duration,
}

/// A boxed operation on one upstream (`chat_raw` or `send_raw`) given the encoded body.
pub type Op<'o, T> = &'o (
        dyn for<'c> Fn(&'c ModelClient, Bytes) -> BoxFuture<'c, Result<T, ClientError>>
            + Send
            + Sync
    );

impl Upstreams {
    /// Builds the clients of every configured upstream.
    pub fn new(config: &GatewayConfig) -> Result<Upstreams, ClientError> {
        let mut map = HashMap::new();
        for (name, u) in &config.upstreams {
            let mut cc = ClientConfig::new(u.base_url.clone());
            cc.api_key_env = u.api_key_env.clone();
            cc.timeout = Duration::from_millis(u.timeout_ms);
            map.insert(
                name.clone(),
                Upstream {
                    client: ModelClient::new(cc)?,
                    breaker: Mutex::new(BreakerState::default()),
                },
            );
        }
        Ok(Upstreams {
            attempt_seconds: Histogram::default(),
            map,
            retry: config.retry,
            breaker_failures: config.breaker_failures.max(1),
            cooldown: Duration::from_millis(config.breaker_cooldown_ms),
        })
    }

    /// The upstream called `name`.
    pub fn get(&self, name: &str) -> Option<&Upstream> {
        self.map.get(name)
    }

    fn is_open(&self, u: &Upstream, now: Instant) -> bool {
        let b = u.breaker.lock().unwrap_or_else(|p| p.into_inner());
        b.open_until.is_some_and(|t| now < t)
    }

    fn record(&self, u: &Upstream, ok: bool) {
        let mut b = u.breaker.lock().unwrap_or_else(|p| p.into_inner());
        if ok {
            b.consecutive = 0;
            b.open_until = None;
        } else {
            b.consecutive += 1;
            if b.consecutive >= self.breaker_failures {
                b.open_until = Some(Instant::now() + self.cooldown);
            }
        }
    }

    /// Calls `op` along `chain` with retries and fallbacks. `charge` asks the run's ledger for a
    /// recovery action and says whether it was granted. `passthrough` makes one attempt only.
    /// `encode` writes the request for a target's model, once per target; every retry sends the
    /// same buffer.
    pub async fn call<T>(
        &self,
        chain: &[Target],
        encode: &(dyn Fn(&str) -> Bytes + Send + Sync),
        op: Op<'_, T>,
        charge: &(dyn Fn(ActionKind) -> bool + Send + Sync),
        passthrough: bool,
        log: &mut CallLog,
    ) -> Result<T, ApiError> {
        let mut reasons = Vec::new();
        let mut rng = SplitMix64::new(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64),
        );
        for (i, target) in chain.iter().enumerate() {
            let last = i + 1 == chain.len();
            let Some(up) = self.map.get(&target.upstream) else {
                reasons.push(format!("{}: not configured", target.upstream));
                continue;
            };
            if i > 0 {
                if !passthrough && !charge(ActionKind::Escalate) {
                    reasons.push("fallback refused: escalation budget spent".into());
                    break;
                }
                log.events.push(("fallback", target.model.clone()));
            }
            if !last && self.is_open(up, Instant::now()) {
                reasons.push(format!("{}: breaker open", target.upstream));
                log.events.push(("cooldown_skip", target.upstream.clone()));
                continue;
            }
            let encoded = encode(&target.model);
            let mut attempt = 0u32;
            loop {
                let started = Instant::now();
                let result = op(&up.client, encoded.clone()).await;
                self.attempt_seconds.observe(started.elapsed());
                let err = match result {
                    Ok(v) => {
                        self.record(up, true);
                        return Ok(v);
                    }
                    Err(e) => e,
                };
                let label = format!("{}/{}: {err}", target.upstream, target.model);
                if let ClientError::Status {
                    status, message, ..
                } = &err
                    && is_client_error(*status)
                    && !err.is_rejected_shape()
                {
                    if *status == 404 && !last {
                        reasons.push(label);
                        break;
                    }
                    let code = StatusCode::from_u16(*status).unwrap_or(StatusCode::BAD_REQUEST);
                    let mut e = ApiError::new(
                        code,
                        "invalid_request_error",
                        if *status == 404 {
                            "model_not_found"
                        } else {
                            "upstream_rejected"
                        },
                        message.clone(),
                    );
                    e.reasons = vec![label];
                    return Err(e);
                }
                let retryable = err.is_transient()
                    || matches!(err, ClientError::EmptyResponse | ClientError::Decode(_));
                if err.is_transient() {
                    self.record(up, false);
                }
                if passthrough
                    || !retryable
                    || attempt >= MAX_RETRIES_PER_TARGET
                    || !charge(ActionKind::Retry)
                {
                    reasons.push(label);
                    break;
                }
                attempt += 1;
                let retry_after = match &err {
                    ClientError::Status { retry_after_ms, .. } => *retry_after_ms,
                    _ => None,
                };
                let delay = self.retry.delay_ms(attempt, retry_after, &mut rng);
                log.events
                    .push(("retry", format!("{label} (waiting {delay} ms)")));
                tokio::time::sleep(Duration::from_millis(delay)).await;
            }
            if passthrough {
                break;
            }
        }
        Err(ApiError::exhausted(reasons))
    }
}

fn is_client_error(status: u16) -> bool {
    (400..500).contains(&status) && !matches!(status, 408 | 429)
}
