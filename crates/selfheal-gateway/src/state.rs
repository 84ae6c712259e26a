//! What every handler shares: [`AppState`] (configuration, upstream clients, runs, metrics,
//! trace, gatekeeper) and [`NoStream`], what the gateway has learned about targets that cannot
//! stream tool calls. Apart from the handlers so that everything else can depend on it without
//! depending on any one API.

use crate::auth::{Gatekeeper, Redactor};
use crate::config::GatewayConfig;
use crate::heal::{self};
use crate::metrics::Metrics;
pub(crate) use crate::runs::TrustMemory;
use crate::runs::{RunKey, RunState, RunStore};
use crate::store::{Detail, Kind, RunSummary, TraceEvent, TraceWriter};
use crate::upstream::{UpstreamError, Upstreams};
use axum::http::HeaderValue;
use axum::response::Response;
use serde_json::json;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Why the gateway's state could not be built.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    /// An upstream could not be set up (bad URL, unset key variable).
    #[error(transparent)]
    Upstream(#[from] UpstreamError),
    /// `run_secret_env` names an unset or empty variable.
    #[error("the run secret variable `{0}` is unset or empty")]
    RunSecret(String),
    /// No randomness for the run-id secret.
    #[error("cannot draw a random run-id secret: {0}")]
    Random(String),
    /// The state store (`[state]`) cannot be set up.
    #[error(transparent)]
    Store(#[from] selfheal_state::StoreError),
}

/// Everything the handlers share.
#[derive(Debug)]
pub struct AppState {
    /// The configuration.
    pub config: GatewayConfig,
    /// The upstream clients and breakers.
    pub upstreams: Upstreams,
    /// Per-run state.
    pub runs: RunStore,
    /// Counters.
    pub metrics: Metrics,
    /// The trace writer.
    pub trace: TraceWriter,
    /// Inbound keys and the operator's secrets.
    pub gate: Gatekeeper,
    pub(crate) run_key: RunKey,
    pub(crate) guides: Arc<heal::GuideCache>,
    pub(crate) tool_indexes: heal::ToolIndexCache,
    /// Targets learned not to stream tool calls (see [`NoStream`]).
    pub no_stream: NoStream,
    /// What replicas share (`[state]`): the local tier, synced through the store when there is
    /// one.
    pub shared: selfheal_state::Shared,
    /// What the runs have learned of their sources ([`TrustMemory`]).
    pub trust: TrustMemory,
    /// The clock runs decide by: Unix ms at the process's start plus the monotonic time since,
    /// one base for every replica ([`crate::clock`]). Shared with the upstreams' breakers.
    pub(crate) clock: crate::clock::Clock,
    /// How a request is held while a retry's delay passes ([`crate::clock::Wait`]).
    pub(crate) wait: crate::clock::Wait,
}

/// What the gateway learns about upstream targets (upstream and model) that cannot stream tool
/// calls — llama-cpp-python's server cannot with an automatic tool choice: a streaming request
/// offering tools that came back empty or broken, and that a non-streaming re-issue healed, is
/// *evidence*. One fault is not enough to change how every tenant is served: a target is asked
/// without streaming (its answer still sent as SSE) only after [`NoStream::EVIDENCE`] such
/// healed faults within [`NoStream::WINDOW`], and only for [`NoStream::TTL`], after which it is
/// streamed again. The requests it changes say so in the `x-selfheal-stream` header, and
/// `/metrics` shows the targets learned now, how often one was learned, and the evidence seen.
/// At most [`NoStream::CAPACITY`] targets are tracked. A target learned here is published to
/// the other replicas through the shared tier (`[state]`), which ask it without streaming too
/// until the same expiry; the evidence itself is counted per replica.
#[derive(Debug, Default)]
pub struct NoStream {
    pub(crate) targets: Mutex<HashMap<(String, String), Learning>>,
    pub(crate) learned_total: std::sync::atomic::AtomicU64,
    pub(crate) evidence_total: std::sync::atomic::AtomicU64,
    pub(crate) shared: Option<selfheal_state::Shared>,
}

/// The evidence against one target and, once learned, until when it holds.
#[derive(Debug, Default)]
pub(crate) struct Learning {
    /// When the newest faults were seen, at most [`NoStream::EVIDENCE`].
    pub(crate) seen: std::collections::VecDeque<Instant>,
    /// Asked without streaming until then.
    pub(crate) until: Option<Instant>,
}

impl NoStream {
    /// Most targets tracked.
    pub const CAPACITY: usize = 256;
    /// Healed faults within [`NoStream::WINDOW`] before a target is asked without streaming.
    pub const EVIDENCE: usize = 3;
    /// The window the evidence must fall within.
    pub const WINDOW: Duration = Duration::from_secs(10 * 60);
    /// How long a target is asked without streaming once learned.
    pub const TTL: Duration = Duration::from_secs(30 * 60);

    /// Learned targets are shared through `shared` with the other replicas.
    pub fn shared(shared: selfheal_state::Shared) -> NoStream {
        NoStream {
            shared: Some(shared),
            ..NoStream::default()
        }
    }

    /// The shared record of `target`, learned not to stream tool calls.
    pub(crate) fn shared_key(target: &crate::config::Target) -> String {
        format!(
            "no_stream:{}",
            json!([target.upstream.as_str(), target.model.as_str()])
        )
    }

    /// Whether `target` is asked without streaming at `now` (learned here or by another
    /// replica, not expired).
    pub fn contains(&self, target: &crate::config::Target, now: Instant) -> bool {
        let Ok(mut m) = self.targets.lock() else {
            return false;
        };
        let key = (target.upstream.clone(), target.model.clone());
        match m.get(&key).and_then(|l| l.until) {
            Some(until) if now < until => return true,
            Some(_) => {
                m.remove(&key);
            }
            None => {}
        }
        drop(m);
        self.shared.as_ref().is_some_and(|s| {
            s.get(&Self::shared_key(target), unix_ms())
                .is_some_and(|r| r.origin != s.origin())
        })
    }

    /// Records one healed fault of `target` at `now`; whether it makes the target learned.
    pub fn observe(&self, target: &crate::config::Target, now: Instant) -> bool {
        use std::sync::atomic::Ordering::Relaxed;
        self.evidence_total.fetch_add(1, Relaxed);
        let Ok(mut m) = self.targets.lock() else {
            return false;
        };
        let key = (target.upstream.clone(), target.model.clone());
        if !m.contains_key(&key) && m.len() >= Self::CAPACITY {
            m.retain(|_, l| l.until.is_some_and(|u| now < u));
            if m.len() >= Self::CAPACITY {
                m.clear();
            }
        }
        let l = m.entry(key).or_default();
        if l.until.is_some_and(|u| now < u) {
            return false;
        }
        l.until = None;
        l.seen
            .retain(|t| now.saturating_duration_since(*t) < Self::WINDOW);
        if l.seen.len() == Self::EVIDENCE {
            l.seen.pop_front();
        }
        l.seen.push_back(now);
        if l.seen.len() < Self::EVIDENCE {
            return false;
        }
        l.seen.clear();
        l.until = Some(now + Self::TTL);
        self.learned_total.fetch_add(1, Relaxed);
        if let Some(s) = &self.shared {
            let ttl = u64::try_from(Self::TTL.as_millis()).unwrap_or(u64::MAX);
            s.publish(
                &Self::shared_key(target),
                "learned",
                unix_ms().saturating_add(ttl),
            );
        }
        true
    }

    /// `/metrics` lines: targets asked without streaming now, times one was learned, evidence.
    pub(crate) fn render(&self, now: Instant) -> String {
        use std::sync::atomic::Ordering::Relaxed;
        let active = self.targets.lock().map_or(0, |m| {
            m.values()
                .filter(|l| l.until.is_some_and(|u| now < u))
                .count()
        });
        format!(
            "# HELP selfheal_no_stream_targets Upstream targets asked without streaming now (learned not to stream tool calls).\n\
             # TYPE selfheal_no_stream_targets gauge\nselfheal_no_stream_targets {active}\n\
             # HELP selfheal_no_stream_learned_total Times a target was learned not to stream tool calls.\n\
             # TYPE selfheal_no_stream_learned_total counter\nselfheal_no_stream_learned_total {}\n\
             # HELP selfheal_no_stream_evidence_total Streams offering tools that broke and a non-streaming re-issue healed.\n\
             # TYPE selfheal_no_stream_evidence_total counter\nselfheal_no_stream_evidence_total {}\n",
            self.learned_total.load(Relaxed),
            self.evidence_total.load(Relaxed),
        )
    }
}

/// The header on a request a learned target changed ([`NoStream`]).
pub(crate) const NO_STREAM_HEADER: &str = "x-selfheal-stream";

/// Marks `resp` as asked without streaming because its target was learned not to stream tool
/// calls.
pub(crate) fn mark_no_stream(resp: &mut Response, target: Option<&crate::config::Target>) {
    let text = target.map_or_else(
        || "off (learned)".to_owned(),
        |t| {
            format!(
                "off (learned: {}/{} cannot stream tool calls)",
                t.upstream, t.model
            )
        },
    );
    if let Ok(v) = HeaderValue::from_str(&text) {
        resp.headers_mut().insert(NO_STREAM_HEADER, v);
    }
}

impl AppState {
    /// Builds the state from a validated config, reading key variables from the environment.
    pub fn new(config: GatewayConfig, trace: TraceWriter) -> Result<AppState, StateError> {
        AppState::with_env(config, trace, |v| std::env::var(v).ok())
    }

    /// Builds the state, reading key variables through `env`.
    pub fn with_env(
        config: GatewayConfig,
        trace: TraceWriter,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<AppState, StateError> {
        let mut upstreams = Upstreams::new(&config, &env)?;
        let shared = crate::shared_tier(&config.state)?;
        upstreams.share(shared.clone());
        let run_key = match &config.run_secret_env {
            Some(var) => RunKey::from_secret(
                &env(var)
                    .filter(|v| !v.is_empty())
                    .ok_or_else(|| StateError::RunSecret(var.clone()))?,
            ),
            None => RunKey::random().map_err(|e| StateError::Random(e.to_string()))?,
        };
        let secrets: Vec<String> = upstreams
            .iter()
            .filter_map(|(_, u)| u.client.operator_key())
            .chain(config.run_secret_env.as_deref().and_then(&env))
            .collect();
        let gate = Gatekeeper::new(&config.inbound_keys, secrets);
        let runs = RunStore::new(
            config.max_runs,
            std::time::Duration::from_secs(config.run_ttl_secs),
            config.monitor.clone(),
            config.budget,
            config.policy.clone(),
        );
        let clock = upstreams.clock();
        crate::runs::share_trust(
            runs.trust(),
            shared.clone(),
            config.policy.trust,
            clock,
            Duration::from_millis(config.state.refresh_ms),
        );
        Ok(AppState {
            trust: runs.trust().clone(),
            config,
            upstreams,
            runs,
            metrics: Metrics::default(),
            trace,
            gate,
            run_key,
            guides: Arc::new(heal::GuideCache::default()),
            tool_indexes: heal::ToolIndexCache::default(),
            no_stream: NoStream::shared(shared.clone()),
            shared,
            clock,
            wait: crate::clock::Wait::real(),
        })
    }

    /// The same state, holding requests with `wait` ([`crate::clock::Wait`]).
    pub fn with_wait(mut self, wait: crate::clock::Wait) -> AppState {
        self.wait = wait;
        self
    }

    /// Now on the runs' clock ([`crate::clock::Clock`]).
    pub(crate) fn now_ms(&self) -> u64 {
        self.clock.now_ms()
    }

    pub(crate) fn event(
        &self,
        redact: &Redactor,
        run: &Arc<str>,
        kind: Kind,
        detail: impl Into<Detail>,
        summary: Option<RunSummary>,
    ) {
        self.event_at(redact, run, kind, detail, summary, unix_ms());
    }

    /// As [`AppState::event`], for something that happened at `t_ms`.
    pub(crate) fn event_at(
        &self,
        redact: &Redactor,
        run: &Arc<str>,
        kind: Kind,
        detail: impl Into<Detail>,
        summary: Option<RunSummary>,
        t_ms: u64,
    ) {
        self.trace.send(TraceEvent {
            run: Arc::clone(run),
            t_ms,
            kind,
            detail: redact.detail(detail.into()),
            summary,
        });
    }
}

pub(crate) fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

pub(crate) fn lock(m: &Mutex<RunState>) -> std::sync::MutexGuard<'_, RunState> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(model: &str) -> crate::config::Target {
        crate::config::Target {
            upstream: "local".into(),
            model: model.into(),
        }
    }

    /// Issue 30: one healed fault switched a target to non-streaming for every tenant for the
    /// life of the process. Learning now needs repeated evidence within a window and expires.
    #[test]
    fn issue_30_learning_not_to_stream_needs_repeated_evidence_and_expires() {
        let ns = NoStream::default();
        let (m, t0) = (target("m"), Instant::now());
        let at = |s: u64| t0 + Duration::from_secs(s);
        assert!(!ns.observe(&m, at(0)), "one fault teaches nothing");
        assert!(!ns.contains(&m, at(1)));
        assert!(!ns.observe(&m, at(10)));
        assert!(!ns.contains(&m, at(11)));
        // Evidence older than the window does not count: the first fault has aged out.
        let late = NoStream::WINDOW.as_secs() + 5;
        assert!(!ns.observe(&m, at(late)), "two faults in the window");
        assert!(
            ns.observe(&m, at(late + 1)),
            "the third within the window teaches it"
        );
        assert!(ns.contains(&m, at(late + 2)));
        assert!(
            !ns.contains(&target("other"), at(late + 2)),
            "only that target"
        );
        let text = ns.render(at(late + 2));
        assert!(text.contains("selfheal_no_stream_targets 1\n"), "{text}");
        assert!(
            text.contains("selfheal_no_stream_learned_total 1\n"),
            "{text}"
        );
        assert!(
            text.contains("selfheal_no_stream_evidence_total 4\n"),
            "{text}"
        );
        // It expires: streamed again, and learnt again only on new evidence.
        let expired = at(late + 1) + NoStream::TTL;
        assert!(!ns.contains(&m, expired));
        assert!(
            ns.render(expired)
                .contains("selfheal_no_stream_targets 0\n")
        );
        assert!(!ns.observe(&m, expired));
        assert!(!ns.contains(&m, expired));
    }

    #[test]
    fn no_stream_tracks_a_bounded_number_of_targets() {
        let ns = NoStream::default();
        let t0 = Instant::now();
        for i in 0..(NoStream::CAPACITY * 2) {
            ns.observe(&target(&format!("m{i}")), t0);
        }
        assert!(ns.targets.lock().unwrap().len() <= NoStream::CAPACITY);
    }
}
