//! Upstream calls: the HTTP clients, and the loop that carries out the core's call plan.
//!
//! What to do after a failed attempt — wait and send again, fall back to the next model of the
//! chain, skip an upstream whose breaker is open, give up, hand the caller's own bad request
//! back — is not decided here: [`Upstreams::call`] turns each failure into the core's
//! [`Signal`] (the OpenAI wire is parsed in one place, `ClientError`),
//! hands it to the core's `CallPlan` and does what the plan says. The plan charges every attempt to the
//! run's one ledger and keeps one [`Breaker`](selfheal_core::Breaker) per upstream, the
//! same breaker the monitor keeps per tool. A `--policy` file therefore changes what the gateway
//! does exactly as it changes the benchmark.
//!
//! Each upstream has its own HTTP client ([`UpstreamClient`]) that decides whose credentials go
//! to it (`auth`: the client's, the operator's key read once at startup, or none) and bounds
//! every answer: a connect timeout, a first-byte timeout until the answer's head, an idle
//! timeout between two pieces of its body ([`body_stream`]) — never a total deadline, which cut
//! healthy long streams — and a maximum body size ([`read_bounded`]).
//!
//! Replicas share their breakers' verdicts through the shared tier ([`Shared`], `[state]`):
//! when the core opens an upstream's circuit here, the open circuit and its remaining cooldown
//! are published; another replica hands it to its own core's breakers
//! ([`Breakers::open_elsewhere`]), whose call plans skip it as they skip their own open
//! circuits — never the chain's last target — until the cooldown ends or a success anywhere
//! removes the record ([`Breakers::closed_elsewhere`]). One brain: the gateway filters no
//! chain itself. Failure streaks are not summed across replicas: each opens the circuit on its
//! own evidence, as the core decides. Reading the shared record is a local map lookup: no
//! request waits on Redis.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use axum::http::StatusCode;
use bytes::{Bytes, BytesMut};
use futures_util::StreamExt;
use futures_util::future::BoxFuture;
use serde_json::Value;

use selfheal_core::{
    Action, BreakerConfig, Breakers, BudgetLimits, CallId, CallMode, CallOffer, CallStop,
    CircuitState, EventKind, Input, Signal, SplitMix64,
};
use selfheal_openai::{
    ClientError, Completion, map_reqwest, parse_completion, retry_after_ms, status_error,
};

use selfheal_state::Shared;

use crate::auth::Credentials;
use crate::config::{Auth, GatewayConfig, Target, UpstreamConfig};
use crate::error::ApiError;
use crate::metrics::Histogram;
use crate::runs::RunState;

/// Most bytes of an upstream error body read (the message is cut to 500 characters anyway).
const MAX_ERROR_BODY: usize = 64 * 1024;

/// Why an upstream could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    /// The base URL does not parse.
    #[error("upstream `{name}`: bad base_url: {detail}")]
    BadUrl {
        /// The upstream's name.
        name: String,
        /// The parser's complaint.
        detail: String,
    },
    /// The HTTP client could not be built.
    #[error("upstream `{name}`: cannot build the HTTP client: {detail}")]
    Client {
        /// The upstream's name.
        name: String,
        /// reqwest's complaint.
        detail: String,
    },
    /// The recovery policy is not valid.
    #[error("invalid policy: {detail}")]
    Policy {
        /// What is wrong.
        detail: String,
    },
    /// `auth = "env"` and the variable is unset, empty or not a header value.
    #[error("upstream `{name}`: the key variable `{var}` is unset, empty or unusable")]
    MissingKey {
        /// The upstream's name.
        name: String,
        /// The variable.
        var: String,
    },
}

/// One upstream's HTTP client: its credentials mode, its timeouts and its body bound.
///
/// Timeouts follow the shape of an answer, not a total deadline: a connect timeout, a
/// first-byte timeout (until the status line and headers arrive) and an idle timeout between
/// two pieces of the body. A stream that keeps arriving — a long generation — is never cut.
#[derive(Debug)]
pub struct UpstreamClient {
    http: reqwest::Client,
    base: String,
    chat_url: reqwest::Url,
    auth: Auth,
    operator_key: Option<axum::http::HeaderValue>,
    first_byte: Duration,
    idle: Duration,
    max_body: usize,
}

impl UpstreamClient {
    /// Builds the client of upstream `name`; `env` reads the operator's key (once).
    pub fn new(
        name: &str,
        config: &UpstreamConfig,
        max_body: usize,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<UpstreamClient, UpstreamError> {
        let base = config.base_url.trim_end_matches('/').to_owned();
        let chat_url = reqwest::Url::parse(&format!("{base}/chat/completions")).map_err(|e| {
            UpstreamError::BadUrl {
                name: name.to_owned(),
                detail: e.to_string(),
            }
        })?;
        let auth = config.auth();
        let operator_key = match (auth, &config.api_key_env) {
            (Auth::Env, Some(var)) => {
                let missing = || UpstreamError::MissingKey {
                    name: name.to_owned(),
                    var: var.clone(),
                };
                let key = env(var).filter(|k| !k.is_empty()).ok_or_else(missing)?;
                let mut v = axum::http::HeaderValue::from_str(&format!("Bearer {key}"))
                    .map_err(|_| missing())?;
                v.set_sensitive(true);
                Some(v)
            }
            (Auth::Env, None) => {
                return Err(UpstreamError::MissingKey {
                    name: name.to_owned(),
                    var: "(api_key_env)".into(),
                });
            }
            _ => None,
        };
        // No reqwest `read_timeout`: its clock also runs while the answer's head is awaited, so
        // it would cap the first-byte timeout. The idle timeout is applied to the body instead
        // ([`body_stream`]).
        let http = reqwest::Client::builder()
            .tcp_nodelay(true)
            .connect_timeout(Duration::from_millis(config.connect_timeout_ms))
            .pool_idle_timeout(Duration::from_secs(90))
            .build()
            .map_err(|e| UpstreamError::Client {
                name: name.to_owned(),
                detail: e.to_string(),
            })?;
        Ok(UpstreamClient {
            http,
            base,
            chat_url,
            auth,
            operator_key,
            first_byte: Duration::from_millis(config.first_byte_timeout_ms),
            idle: Duration::from_millis(config.idle_timeout_ms),
            max_body,
        })
    }

    /// The largest answer read from this upstream, in bytes.
    pub fn max_body(&self) -> usize {
        self.max_body
    }

    /// The operator's key, when this upstream uses one (for redaction).
    pub fn operator_key(&self) -> Option<String> {
        self.operator_key
            .as_ref()
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(str::to_owned)
    }

    fn authorize(
        &self,
        mut req: reqwest::RequestBuilder,
        creds: &Credentials,
    ) -> reqwest::RequestBuilder {
        match self.auth {
            Auth::Client => {
                for (name, v) in [
                    ("authorization", &creds.authorization),
                    ("api-key", &creds.api_key),
                    ("openai-organization", &creds.organization),
                    ("openai-project", &creds.project),
                ] {
                    if let Some(v) = v {
                        req = req.header(name, v.clone());
                    }
                }
                req
            }
            Auth::Env => match &self.operator_key {
                Some(k) => req.header("authorization", k.clone()),
                None => req,
            },
            Auth::None => req,
        }
    }

    /// Sends `req` and waits for the answer's head within the first-byte timeout; a non-success
    /// status becomes [`ClientError::Status`].
    async fn head(&self, req: reqwest::RequestBuilder) -> Result<reqwest::Response, ClientError> {
        // The attempt's span (when spans are exported) is the upstream's parent.
        let req = crate::telemetry::inject(req);
        let mut resp = tokio::time::timeout(self.first_byte, req.send())
            .await
            .map_err(|_| ClientError::Timeout)?
            .map_err(map_reqwest)?;
        resp.extensions_mut().insert(IdleTimeout(self.idle));
        check_status(resp).await
    }

    /// POSTs an encoded JSON body to `path` (e.g. `chat/completions`) and returns the answer once
    /// its head arrived (for streaming).
    pub async fn send(
        &self,
        path: &str,
        body: Bytes,
        creds: &Credentials,
    ) -> Result<reqwest::Response, ClientError> {
        let url = if path == "chat/completions" {
            self.chat_url.clone()
        } else {
            reqwest::Url::parse(&format!("{}/{}", self.base, path.trim_start_matches('/')))
                .map_err(|e| ClientError::Invalid(format!("bad upstream URL: {e}")))?
        };
        let req = self
            .http
            .post(url)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(body);
        self.head(self.authorize(req, creds)).await
    }

    /// One non-streaming chat completion of an encoded body; an empty or unreadable 200 is an
    /// error, a body past the bound too.
    pub async fn chat(&self, body: Bytes, creds: &Credentials) -> Result<Completion, ClientError> {
        let resp = self.send("chat/completions", body, creds).await?;
        let bytes = read_bounded(resp, self.max_body).await?;
        let completion = parse_completion(&bytes)?;
        crate::telemetry::usage(&completion.body);
        Ok(completion)
    }

    /// `GET path` (e.g. `models`), decoded as JSON.
    pub async fn get_json(&self, path: &str, creds: &Credentials) -> Result<Value, ClientError> {
        let req = self
            .http
            .get(format!("{}/{}", self.base, path.trim_start_matches('/')));
        let resp = self.head(self.authorize(req, creds)).await?;
        let bytes = read_bounded(resp, self.max_body).await?;
        serde_json::from_slice(&bytes).map_err(|e| ClientError::Decode(e.to_string()))
    }

    /// Whether the upstream answers `GET models` at all within `within` (any HTTP status
    /// counts: it is reachable).
    pub async fn reachable(&self, within: Duration) -> bool {
        let req = self.http.get(format!("{}/models", self.base));
        matches!(
            tokio::time::timeout(within.min(self.first_byte), req.send()).await,
            Ok(Ok(_))
        )
    }
}

/// The longest silence allowed between two pieces of an upstream answer's body, carried in the
/// response's extensions from [`UpstreamClient`] to whoever reads the body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct IdleTimeout(pub Duration);

/// Why an upstream body stopped before its end.
#[derive(Debug, thiserror::Error)]
pub enum BodyError {
    /// Nothing arrived for the idle timeout.
    #[error("upstream stream stalled past the idle timeout ({} ms)", .0.as_millis())]
    Idle(Duration),
    /// The connection failed.
    #[error("upstream stream failed: {0}")]
    Read(reqwest::Error),
}

impl From<BodyError> for ClientError {
    fn from(e: BodyError) -> ClientError {
        match e {
            BodyError::Idle(_) => ClientError::Timeout,
            BodyError::Read(e) => map_reqwest(e),
        }
    }
}

/// The body of an upstream answer, piece by piece, each within the answer's [`IdleTimeout`]
/// (none when it has none). The stream ends after the first error.
pub(crate) fn body_stream(
    resp: reqwest::Response,
) -> futures_util::stream::BoxStream<'static, Result<Bytes, BodyError>> {
    let idle = resp.extensions().get::<IdleTimeout>().map(|i| i.0);
    let inner = Box::pin(resp.bytes_stream());
    futures_util::stream::unfold(Some(inner), move |state| async move {
        let mut body = state?;
        let next = match idle {
            Some(d) => match tokio::time::timeout(d, body.next()).await {
                Ok(n) => n,
                Err(_) => return Some((Err(BodyError::Idle(d)), None)),
            },
            None => body.next().await,
        };
        match next? {
            Ok(b) => Some((Ok(b), Some(body))),
            Err(e) => Some((Err(BodyError::Read(e)), None)),
        }
    })
    .boxed()
}

/// Reads a body of at most `limit` bytes; past it, [`ClientError::Decode`].
pub(crate) async fn read_bounded(
    resp: reqwest::Response,
    limit: usize,
) -> Result<Bytes, ClientError> {
    if resp.content_length().is_some_and(|n| n > limit as u64) {
        return Err(ClientError::Decode(format!(
            "the upstream answer exceeds {limit} bytes"
        )));
    }
    let mut out = BytesMut::new();
    let mut body = body_stream(resp);
    while let Some(chunk) = body.next().await {
        let chunk = chunk?;
        if out.len() + chunk.len() > limit {
            return Err(ClientError::Decode(format!(
                "the upstream answer exceeds {limit} bytes"
            )));
        }
        out.extend_from_slice(&chunk);
    }
    Ok(out.freeze())
}

/// A non-success answer as the runtime's client reads it, its body read within
/// [`MAX_ERROR_BODY`].
async fn check_status(resp: reqwest::Response) -> Result<reqwest::Response, ClientError> {
    let status = resp.status();
    if status.is_success() {
        return Ok(resp);
    }
    let retry_after = retry_after_ms(resp.headers());
    let text = match read_bounded(resp, MAX_ERROR_BODY).await {
        Ok(b) => String::from_utf8_lossy(&b).into_owned(),
        Err(_) => String::new(),
    };
    Err(status_error(status.as_u16(), retry_after, &text))
}

/// One upstream (its breaker lives in [`Upstreams`], with the others').
#[derive(Debug)]
pub struct Upstream {
    /// The client.
    pub client: UpstreamClient,
}

/// What one call through the chain did, besides its result.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct CallLog {
    /// `retry` / `fallback` / `cooldown_skip` entries, with the reason and when they happened.
    pub events: Vec<CallEvent>,
    /// The core's typed events of every decision (signal, classified, action with its input),
    /// with the Unix time in ms they were made at.
    pub decisions: Vec<(u64, selfheal_core::TraceEvent)>,
    /// The target that answered, when one did.
    pub served: Option<Target>,
}

/// One entry of a [`CallLog`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallEvent {
    /// [`Kind::Retry`], [`Kind::Fallback`] or [`Kind::CooldownSkip`].
    pub kind: EventKind,
    /// The reason.
    pub detail: String,
    /// Unix time in ms when it happened (not when the log was written to the trace, so that
    /// retries of one request keep their own times).
    pub t_ms: u64,
}

impl CallLog {
    /// Records an entry, stamped with the current time.
    pub fn push(&mut self, kind: EventKind, detail: String) {
        let t_ms = unix_ms();
        self.events.push(CallEvent { kind, detail, t_ms });
    }
}

fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// All upstreams by name and their breakers (the decisions about their failures are each run's).
#[derive(Debug)]
pub struct Upstreams {
    /// How long each attempt took (every retry and fallback on its own).
    pub attempt_seconds: Histogram,
    map: HashMap<String, Upstream>,
    breakers: Mutex<Breakers>,
    /// The clock the breakers and the runs' call plans decide by ([`crate::clock`]).
    clock: crate::clock::Clock,
    /// The next call's id within its run.
    calls: AtomicU64,
    /// What the replicas share (a local tier that shares with no one by default).
    shared: Shared,
    /// How long an open circuit stays open (what a published one is good for).
    cooldown_ms: u64,
    /// Attempts not made because another replica had the upstream's circuit open.
    shared_skips: AtomicU64,
    /// Upstreams whose circuit is open here on another replica's evidence only
    /// ([`Upstreams::apply_shared`]).
    opened_elsewhere: Mutex<std::collections::HashSet<String>>,
    /// Runs of passthrough calls whose call has ended, lent to the next ones
    /// ([`Upstreams::call`]): building a run for each forwarded request was a tenth of its cost.
    spares: Mutex<Vec<RunState>>,
}

/// Most spare runs kept for passthrough calls (one per call in flight is enough; more are
/// dropped when their call ends).
const MAX_SPARE_RUNS: usize = 64;

/// The shared record of upstream `name`'s open circuit.
fn circuit_key(name: &str) -> String {
    format!("circuit:{name}")
}

/// A boxed operation on one upstream (`chat` or `send`) given the encoded body and the
/// client's credentials.
pub(crate) type Op<'o, T> = &'o (
        dyn for<'c> Fn(
    &'c UpstreamClient,
    Bytes,
    &'c Credentials,
) -> BoxFuture<'c, Result<T, ClientError>>
            + Send
            + Sync
    );

impl Upstreams {
    /// Builds the clients of every configured upstream; `env` reads the operators' keys.
    pub fn new(
        config: &GatewayConfig,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Upstreams, UpstreamError> {
        let mut map = HashMap::new();
        for (name, u) in &config.upstreams {
            map.insert(
                name.clone(),
                Upstream {
                    client: UpstreamClient::new(name, u, config.max_upstream_body_bytes, &env)?,
                },
            );
        }
        let breaker = BreakerConfig {
            after: config.breaker_failures.max(1),
            cooldown_calls: 0,
            cooldown_ms: config.breaker_cooldown_ms,
        };
        // The policy decides in each run (see `RunState`); a bad one is refused here, at start.
        config
            .policy
            .validate()
            .map_err(|e| UpstreamError::Policy {
                detail: e.to_string(),
            })?;
        Ok(Upstreams {
            attempt_seconds: Histogram::default(),
            breakers: Mutex::new(Breakers::new(breaker, map.keys().cloned())),
            map,
            clock: crate::clock::Clock::start(),
            calls: AtomicU64::new(0),
            shared: Shared::local(),
            cooldown_ms: config.breaker_cooldown_ms,
            shared_skips: AtomicU64::new(0),
            opened_elsewhere: Mutex::default(),
            spares: Mutex::default(),
        })
    }

    /// Shares the breakers' open circuits through `shared` (see the module's docs).
    pub fn share(&mut self, shared: Shared) {
        self.shared = shared;
    }

    /// Attempts not made because another replica had the upstream's circuit open.
    pub fn shared_skips(&self) -> u64 {
        self.shared_skips.load(Ordering::Relaxed)
    }

    /// Hands the core's breakers what the other replicas know about `chain`'s upstreams: an
    /// open circuit published by another replica opens the circuit here as if it had opened
    /// when the other's did (so it cools when that one does), and one no longer published
    /// (closed there by a success, or expired) closes a circuit that only that evidence had
    /// opened. The core's call plan then skips it as it skips its own open circuits — never
    /// the chain's last target. One brain: the gateway filters nothing itself.
    fn apply_shared(&self, chain: &[Target]) {
        if self.shared.is_empty() {
            if self.learned().is_empty() {
                return;
            }
            let mut br = self.breakers();
            for name in self.learned().drain() {
                br.closed_elsewhere(&name);
            }
            return;
        }
        let (now, own, local_now) = (unix_ms(), self.shared.origin(), self.now_ms());
        let mut br = self.breakers();
        let mut learned = self.learned();
        for t in chain {
            let remote = self
                .shared
                .get(&circuit_key(&t.upstream), now)
                .filter(|r| r.origin != own);
            match remote {
                Some(r) => {
                    let left = r.until_ms.saturating_sub(now).min(self.cooldown_ms);
                    let since = local_now.saturating_sub(self.cooldown_ms - left);
                    if br.open_elsewhere(&t.upstream, since) {
                        learned.insert(t.upstream.clone());
                    }
                }
                None if learned.remove(&t.upstream) => br.closed_elsewhere(&t.upstream),
                None => {}
            }
        }
    }

    /// Upstreams whose circuit is open here on another replica's evidence only.
    fn learned(&self) -> std::sync::MutexGuard<'_, std::collections::HashSet<String>> {
        self.opened_elsewhere
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// What a failed attempt on `target` offers the core: whether it went out with the
    /// client's own key (`auth = "client"`), so that its rate limits are the client's own and
    /// not the upstream's health for every tenant (the core then leaves the shared breaker
    /// alone).
    fn offer_of(&self, target: &Target, creds: &Credentials) -> CallOffer {
        let callers_credentials = self
            .map
            .get(&target.upstream)
            .is_some_and(|up| up.client.auth == Auth::Client)
            && (creds.authorization.is_some() || creds.api_key.is_some());
        CallOffer {
            callers_credentials,
            ..CallOffer::default()
        }
    }

    /// The state and streak of `name`'s breaker now.
    fn breaker_of(&self, name: &str) -> (CircuitState, u32) {
        let br = self.breakers();
        (br.state(name), br.streak(name))
    }

    /// After a failure of `name`, given its breaker's state and streak `before` the core
    /// decided: when the core has just opened its circuit, the others are told until when it
    /// stays open. A failure the core counted makes the circuit's state this replica's own
    /// evidence, not another's; one it did not count (a caller's own rate limit) changes
    /// nothing.
    fn share_failure(&self, name: &str, before: (CircuitState, u32)) {
        let (state, streak) = self.breaker_of(name);
        if (state, streak) == before {
            return;
        }
        self.learned().remove(name);
        let was_open = matches!(before.0, CircuitState::Open { .. });
        if let CircuitState::Open { since_ms, .. } = state
            && !was_open
        {
            let left = self
                .cooldown_ms
                .saturating_sub(self.now_ms().saturating_sub(since_ms));
            if left > 0 {
                self.shared
                    .publish(&circuit_key(name), "open", unix_ms().saturating_add(left));
            }
        }
    }

    /// The upstream called `name`.
    pub fn get(&self, name: &str) -> Option<&Upstream> {
        self.map.get(name)
    }

    /// Every upstream.
    pub fn iter(&self) -> impl Iterator<Item = (&String, &Upstream)> {
        self.map.iter()
    }

    fn now_ms(&self) -> u64 {
        self.clock.now_ms()
    }

    /// The clock the breakers decide by: the gateway's one clock.
    pub(crate) fn clock(&self) -> crate::clock::Clock {
        self.clock
    }

    fn breakers(&self) -> std::sync::MutexGuard<'_, Breakers> {
        self.breakers.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Calls `op` along `chain` as the core's run decides: retries, fall-backs and breaker
    /// skips, each charged to `run`'s ledger (the run's call plan, not one of the gateway's).
    /// Without a run (passthrough, forwarded endpoints) a run of the call's own makes one
    /// attempt. `encode` writes the request for a target's model, once per target; every retry
    /// sends the same buffer.
    ///
    /// A passthrough call's own run is one whose earlier call has ended: a run holds nothing of
    /// an ended call (its plan is forgotten, its events and records taken), and a passthrough
    /// plan decides by the breakers alone (one attempt; its failure is the answer), so the run
    /// it is lent decides as a new one would.
    pub async fn call<T>(
        &self,
        chain: &[Target],
        encode: &(dyn Fn(&str) -> Bytes + Send + Sync),
        op: Op<'_, T>,
        run: Option<&Mutex<RunState>>,
        creds: &Credentials,
        log: &mut CallLog,
    ) -> Result<T, ApiError> {
        if let Some(state) = run {
            return self
                .call_in(chain, encode, op, (state, run), creds, log)
                .await;
        }
        let spare = self.spares().pop();
        let own = Mutex::new(spare.unwrap_or_else(|| {
            RunState::new(
                selfheal_core::MonitorConfig::default(),
                BudgetLimits::unlimited(),
            )
        }));
        let out = self
            .call_in(chain, encode, op, (&own, None), creds, log)
            .await;
        let own = own.into_inner().unwrap_or_else(|p| p.into_inner());
        // Only a run whose call went through is lent again: whatever a failed attempt leaves in
        // a run (its monitor's and ledger's counts) must never reach another client's call.
        let mut spares = self.spares();
        if out.is_ok() && spares.len() < MAX_SPARE_RUNS {
            spares.push(own);
        }
        out
    }

    fn spares(&self) -> std::sync::MutexGuard<'_, Vec<RunState>> {
        self.spares.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// [`Upstreams::call`] deciding in `state`: the request's run (`run`, healing) or the
    /// passthrough call's own (`run` is `None`).
    async fn call_in<T>(
        &self,
        chain: &[Target],
        encode: &(dyn Fn(&str) -> Bytes + Send + Sync),
        op: Op<'_, T>,
        (state, run): (&Mutex<RunState>, Option<&Mutex<RunState>>),
        creds: &Credentials,
        log: &mut CallLog,
    ) -> Result<T, ApiError> {
        self.apply_shared(chain);
        let mut reasons = Vec::new();
        let mut rng = clock_seeded_rng();
        let id = self.calls.fetch_add(1, Ordering::Relaxed);
        let mode = if run.is_some() {
            CallMode::Heal
        } else {
            CallMode::Passthrough
        };
        // A request dropped mid-call (the client went away) ends its call in the run.
        let _forget = Forget { state, id };
        let mut decide =
            |input: Input<'_>, log: &mut CallLog| -> (Vec<Action>, Vec<selfheal_core::CallEvent>) {
                let mut st = state.lock().unwrap_or_else(|p| p.into_inner());
                let actions = st.decide(input, self.now_ms(), &mut rng, &mut self.breakers());
                let t_ms = unix_ms();
                log.decisions
                    .extend(st.run.take_records().into_iter().map(|(_, e)| (t_ms, e)));
                (actions, st.run.take_call_events(id))
            };
        let targets = chain.iter().map(|t| t.upstream.clone()).collect();
        let start = Input::CallStarted {
            call: id,
            targets,
            mode,
            retry_safe: true,
        };
        let (mut pending, mut events) = decide(start, log);
        let mut encoded: Option<(usize, Bytes)> = None;
        let mut last_err: Option<ClientError> = None;
        let mut attempts = 0usize;
        loop {
            self.log_events(
                std::mem::take(&mut events),
                chain,
                last_err.as_ref(),
                run,
                log,
            );
            let next = (!pending.is_empty()).then(|| pending.remove(0));
            let at = match next {
                Some(Action::Send { target, .. }) => target,
                Some(Action::GiveUp { stop, .. }) => {
                    return Err(give_up(stop, last_err, reasons));
                }
                // An upstream's answer is never offered a repair or a refresh, and a call's
                // inputs ask for nothing else: stopping is the safe reading should one come.
                Some(
                    Action::Repair { .. }
                    | Action::Proceed { .. }
                    | Action::Recover { .. }
                    | Action::Reask { .. }
                    | Action::Reissue
                    | Action::EndStream
                    | Action::ReadAgain { .. }
                    | Action::AskAgain { .. }
                    | Action::Answer { .. }
                    | Action::Stop { .. },
                ) => {
                    let stop = CallStop::Exhausted {
                        class: None,
                        action: selfheal_core::ActionKind::Degrade,
                    };
                    return Err(give_up(stop, last_err, reasons));
                }
                None => {
                    // A retry waits out its backoff; then the run sends it.
                    let due = state
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .run
                        .deadline_of(id);
                    let Some(due) = due else {
                        return Err(ApiError::exhausted(reasons));
                    };
                    let wait = due.saturating_sub(self.now_ms());
                    tokio::time::sleep(Duration::from_millis(wait)).await;
                    (pending, events) = decide(Input::Tick { call: Some(id) }, log);
                    continue;
                }
            };
            let Some(target) = chain.get(at) else {
                return Err(ApiError::exhausted(reasons));
            };
            let result = match self.map.get(&target.upstream) {
                Some(up) => {
                    let body = match &encoded {
                        Some((i, b)) if *i == at => b.clone(),
                        _ => {
                            let b = encode(&target.model);
                            encoded = Some((at, b.clone()));
                            b
                        }
                    };
                    let first = if attempts == 0 { chain.first() } else { None };
                    let span = crate::telemetry::attempt(target, first, attempts);
                    attempts += 1;
                    self.attempt(target, span, || op(&up.client, body, creds))
                        .await
                }
                None => Err(ClientError::Invalid(format!(
                    "upstream `{}` is not configured",
                    target.upstream
                ))),
            };
            let err = match result {
                Ok(v) => {
                    let (_, events) = decide(Input::AttemptSucceeded { call: id }, log);
                    self.log_events(events, chain, None, run, log);
                    // Closed here, on its own evidence: the others may use it again.
                    self.learned().remove(&target.upstream);
                    if !self.shared.is_empty() {
                        self.shared.remove(&circuit_key(&target.upstream));
                    }
                    log.served = Some(target.clone());
                    return Ok(v);
                }
                Err(e) => e,
            };
            reasons.push(format!("{}/{}: {err}", target.upstream, target.model));
            let signal = signal_of(&err);
            let failed = Input::AttemptFailed {
                call: id,
                signal: &signal,
                offer: self.offer_of(target, creds),
            };
            let before = self.breaker_of(&target.upstream);
            (pending, events) = decide(failed, log);
            self.share_failure(&target.upstream, before);
            last_err = Some(err);
        }
    }

    /// One attempt on `target` (`send` sends it through `client`), timed, in its telemetry
    /// `span`, and logged at debug.
    async fn attempt<'c, T>(
        &self,
        target: &Target,
        span: Option<crate::telemetry::AttemptSpan>,
        send: impl FnOnce() -> BoxFuture<'c, Result<T, ClientError>>,
    ) -> Result<T, ClientError> {
        let started = Instant::now();
        let result = send().await;
        self.attempt_seconds.observe(started.elapsed());
        crate::telemetry::attempt_done(span, attempt_outcome(&result));
        // Every attempt at debug: the outcome's kind, never the upstream's message (providers
        // quote keys in it; the redacted message goes to the trace).
        tracing::debug!(
            target: "selfheal::upstream",
            upstream = %target.upstream,
            model = %target.model,
            outcome = %attempt_outcome(&result),
            elapsed_us = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX),
            "upstream attempt"
        );
        result
    }

    /// Writes what the call did (retries, fall-backs, skips) to the call's log and the run.
    fn log_events(
        &self,
        events: Vec<selfheal_core::CallEvent>,
        chain: &[Target],
        last_err: Option<&ClientError>,
        run: Option<&Mutex<RunState>>,
        log: &mut CallLog,
    ) {
        let name = |i: usize| chain.get(i);
        for e in events {
            // What the run's report lists for it (a skip is not an action of the run's).
            let (kind, detail, act) = match e {
                selfheal_core::CallEvent::Retry {
                    target, delay_ms, ..
                } => {
                    let label = name(target)
                        .map_or_else(String::new, |t| format!("{}/{}", t.upstream, t.model));
                    let err = last_err.map_or_else(String::new, |e| format!(": {e}"));
                    (
                        EventKind::Retry,
                        format!("{label}{err} (waiting {delay_ms} ms)"),
                        Some(crate::action::Action::Retry),
                    )
                }
                selfheal_core::CallEvent::Fallback { to, forced, .. } => {
                    let model = name(to).map_or_else(String::new, |t| t.model.clone());
                    let why = if forced {
                        " (upstream health, not charged to the run)"
                    } else {
                        ""
                    };
                    (
                        EventKind::Fallback,
                        format!("{model}{why}"),
                        Some(crate::action::Action::Escalate),
                    )
                }
                selfheal_core::CallEvent::Skip { target } => {
                    let upstream = name(target).map_or("", |t| t.upstream.as_str());
                    let detail = if self.learned().contains(upstream) {
                        self.shared_skips.fetch_add(1, Ordering::Relaxed);
                        format!("{upstream} (circuit open on another replica)")
                    } else {
                        upstream.to_owned()
                    };
                    (EventKind::CooldownSkip, detail, None)
                }
            };
            crate::telemetry::decision(kind.as_str(), &detail);
            if let Some(run) = run
                && let Some(act) = act
            {
                let mut st = run.lock().unwrap_or_else(|p| p.into_inner());
                st.act(act);
            }
            log.push(kind, detail);
        }
    }
}

/// Ends a call in its run when the request that made it is dropped before the call is over.
struct Forget<'a> {
    state: &'a Mutex<RunState>,
    id: CallId,
}

impl Drop for Forget<'_> {
    fn drop(&mut self) {
        self.state
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .run
            .forget_call(self.id);
    }
}

/// The client's answer when the plan stopped: the upstream's own refusal of the caller's
/// request as it came (status and message), a missing model as 404, anything else a 502 with
/// every attempt's reason.
fn give_up(stop: CallStop, last: Option<ClientError>, reasons: Vec<String>) -> ApiError {
    let refusal = |status: u16, message: String, code: &'static str| {
        let http = StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_REQUEST);
        let mut e = ApiError::new(http, "invalid_request_error", code, message);
        e.reasons = reasons.clone();
        e
    };
    match (stop, last) {
        (CallStop::Rejected { status }, Some(ClientError::Status { message, .. })) => {
            refusal(status, message, "upstream_rejected")
        }
        (
            CallStop::Exhausted { .. },
            Some(ClientError::Status {
                status: 404,
                message,
                ..
            }),
        ) => refusal(404, message, "model_not_found"),
        (CallStop::Rejected { .. } | CallStop::Exhausted { .. }, _) => ApiError::exhausted(reasons),
    }
}

/// What an attempt came to, without the upstream's words: `ok`, `http_503`, `timeout`, ...
fn attempt_outcome<T>(r: &Result<T, ClientError>) -> std::borrow::Cow<'static, str> {
    match r {
        Ok(_) => "ok".into(),
        Err(ClientError::Status { status, .. }) => format!("http_{status}").into(),
        Err(ClientError::Timeout) => "timeout".into(),
        Err(ClientError::Connect(_)) => "connect".into(),
        Err(ClientError::Decode(_)) => "unreadable".into(),
        Err(ClientError::EmptyResponse) => "empty".into(),
        Err(ClientError::Invalid(_)) => "invalid".into(),
    }
}

/// The core's signal for a failed attempt.
fn signal_of(err: &ClientError) -> Signal {
    match err {
        // Not the upstream's failure but ours: nothing on this target can work.
        ClientError::Invalid(_) => Signal::Unavailable {
            consecutive: u32::MAX,
        },
        e => e.signal(),
    }
}

/// Randomness for a call's backoff jitter, seeded from the wall clock.
fn clock_seeded_rng() -> SplitMix64 {
    SplitMix64::new(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::AtomicUsize;

    /// Attempts on the failing upstream, over every test of this module.
    static DOWN_CALLS: AtomicUsize = AtomicUsize::new(0);

    /// The upstream on port 1 answers 503, every other one answers `ok`, without any network.
    fn fake<'c>(
        c: &'c UpstreamClient,
        _: Bytes,
        _: &'c Credentials,
    ) -> BoxFuture<'c, Result<String, ClientError>> {
        Box::pin(async move {
            if c.base.contains(":1/") {
                DOWN_CALLS.fetch_add(1, Ordering::SeqCst);
                Err(status_error(503, None, "down"))
            } else {
                Ok("ok".to_owned())
            }
        })
    }

    fn two_upstreams(shared: Shared) -> Upstreams {
        let mut c = GatewayConfig::default();
        c.upstreams.insert(
            "main".into(),
            crate::config::UpstreamConfig::new("http://127.0.0.1:1/v1"),
        );
        c.upstreams.insert(
            "backup".into(),
            crate::config::UpstreamConfig::new("http://127.0.0.1:2/v1"),
        );
        c.breaker_failures = 1;
        let mut u = Upstreams::new(&c, |_| None).unwrap();
        u.share(shared);
        u
    }

    /// An upstream whose circuit one replica's core opened is left out of the other replica's
    /// chains (logged, counted), until a success closes it.
    #[tokio::test]
    async fn an_open_circuit_on_one_replica_is_skipped_by_another() {
        let store: Arc<dyn selfheal_state::StateStore> =
            Arc::new(selfheal_state::MemoryStore::new());
        let refresh = Duration::from_secs(3600);
        let a_tier = Shared::with_store(store.clone(), refresh).unwrap();
        let b_tier = Shared::with_store(store, refresh).unwrap();
        let (a, b) = (two_upstreams(a_tier.clone()), two_upstreams(b_tier.clone()));
        let chain = vec![
            Target {
                upstream: "main".into(),
                model: "m".into(),
            },
            Target {
                upstream: "backup".into(),
                model: "m".into(),
            },
        ];
        let encode = |_: &str| Bytes::new();
        let creds = Credentials::default();
        let run = Mutex::new(RunState::new(
            selfheal_core::MonitorConfig::default(),
            BudgetLimits::defaults(),
        ));
        let mut log = CallLog::default();
        let got = a
            .call(&chain, &encode, &fake, Some(&run), &creds, &mut log)
            .await;
        assert_eq!(got.unwrap(), "ok", "a fell back to the backup");
        let down_after_a = DOWN_CALLS.load(Ordering::SeqCst);
        assert!(down_after_a >= 1);
        a_tier.sync_now().await.unwrap();
        b_tier.sync_now().await.unwrap();

        let mut log = CallLog::default();
        let got = b
            .call(&chain, &encode, &fake, Some(&run), &creds, &mut log)
            .await;
        assert_eq!(got.unwrap(), "ok");
        assert_eq!(
            DOWN_CALLS.load(Ordering::SeqCst),
            down_after_a,
            "b never tried the upstream a learned was down"
        );
        assert_eq!(b.shared_skips(), 1);
        assert!(
            log.events.iter().any(|e| e.kind == EventKind::CooldownSkip
                && e.detail == "main (circuit open on another replica)"),
            "{:?}",
            log.events
        );
        assert_eq!(
            log.served.as_ref().map(|t| t.upstream.as_str()),
            Some("backup")
        );
        // One brain: the skip was the core's, through b's own breaker of the upstream.
        assert!(matches!(
            b.breakers().state("main"),
            CircuitState::Open { .. }
        ));
        // A chain of the down upstream alone still tries it: the last target always is.
        let only = &chain[..1];
        let mut log = CallLog::default();
        assert!(
            b.call(only, &encode, &fake, Some(&run), &creds, &mut log)
                .await
                .is_err()
        );
        let down_after_b = DOWN_CALLS.load(Ordering::SeqCst);
        assert!(down_after_b > down_after_a);
        // Closed elsewhere (a success removed the record): a circuit opened on that evidence
        // alone closes, and the upstream is tried again.
        let c_tier = Shared::with_store(store_of(&a_tier), refresh).unwrap();
        let c = two_upstreams(c_tier.clone());
        c_tier.sync_now().await.unwrap();
        let mut log = CallLog::default();
        let _ = c
            .call(&chain, &encode, &fake, Some(&run), &creds, &mut log)
            .await;
        assert_eq!(
            DOWN_CALLS.load(Ordering::SeqCst),
            down_after_b,
            "c skipped it"
        );
        a_tier.remove(&circuit_key("main"));
        a_tier.sync_now().await.unwrap();
        c_tier.sync_now().await.unwrap();
        let mut log = CallLog::default();
        let _ = c
            .call(&chain, &encode, &fake, Some(&run), &creds, &mut log)
            .await;
        assert!(
            DOWN_CALLS.load(Ordering::SeqCst) > down_after_b,
            "closed elsewhere: c tries it again"
        );
        // Its own open circuit is the core's business on a: a keeps no shared skip of its own.
        assert_eq!(a.shared_skips(), 0);
    }

    fn store_of(tier: &Shared) -> Arc<dyn selfheal_state::StateStore> {
        tier.store().unwrap().clone()
    }

    /// Issue 12: three retries of one request were stamped with the same millisecond, because
    /// the log was stamped when written to the trace. Each entry now keeps its own time.
    #[test]
    fn issue12_call_log_entries_keep_their_own_times() {
        let mut log = super::CallLog::default();
        log.push(super::EventKind::Retry, "first".into());
        std::thread::sleep(std::time::Duration::from_millis(3));
        log.push(super::EventKind::Retry, "second".into());
        assert!(log.events[1].t_ms > log.events[0].t_ms, "{:?}", log.events);
    }
}
