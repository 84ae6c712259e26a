//! Prometheus counters: what the gateway healed, and how often (the healing rate of SPEC §2);
//! and two latency histograms, whole requests and upstream attempts, so that what the gateway
//! itself adds to a request can be read off a dashboard instead of guessed.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Upper bounds of the latency buckets, in seconds (Prometheus `le`).
const BUCKETS: [f64; 18] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 10.0, 30.0, 60.0,
];

/// A lock-free latency histogram with fixed buckets.
#[derive(Debug, Default)]
pub struct Histogram {
    /// Observations per bucket (not cumulative); the last slot is `+Inf`.
    buckets: [AtomicU64; BUCKETS.len() + 1],
    sum_us: AtomicU64,
    count: AtomicU64,
}

impl Histogram {
    /// Records one duration.
    pub fn observe(&self, d: Duration) {
        let secs = d.as_secs_f64();
        let i = BUCKETS
            .iter()
            .position(|&le| secs <= le)
            .unwrap_or(BUCKETS.len());
        self.buckets[i].fetch_add(1, Ordering::Relaxed);
        self.sum_us.fetch_add(
            u64::try_from(d.as_micros()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
        self.count.fetch_add(1, Ordering::Relaxed);
    }

    /// Observations so far.
    pub fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    /// Writes the Prometheus exposition of this histogram as `name`.
    pub fn render(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        let mut cumulative = 0;
        for (i, b) in self.buckets.iter().enumerate() {
            cumulative += b.load(Ordering::Relaxed);
            match BUCKETS.get(i) {
                Some(le) => {
                    let _ = writeln!(out, "{name}_bucket{{le=\"{le}\"}} {cumulative}");
                }
                None => {
                    let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {cumulative}");
                }
            }
        }
        let sum = self.sum_us.load(Ordering::Relaxed) as f64 / 1e6;
        let _ = writeln!(out, "{name}_sum {sum}\n{name}_count {}", self.count());
    }
}

macro_rules! counters {
    ($($name:ident => $help:literal),* $(,)?) => {
        /// The gateway's counters and latency histograms.
        #[derive(Debug, Default)]
        pub struct Metrics {
            $(#[doc = $help] pub $name: AtomicU64,)*
            /// Whole chat-completion requests: from the request to the response (its headers,
            /// when streaming).
            pub request_seconds: Histogram,
        }

        impl Metrics {
            /// Adds one to a counter.
            pub fn inc(counter: &AtomicU64) {
                counter.fetch_add(1, Ordering::Relaxed);
            }

            /// Every healing action taken (`selfheal_healed_total`): the sum of the counters of
            /// each kind of action, so that no kind can be left out of it.
            pub fn healed_total(&self) -> u64 {
                [
                    &self.guidance_total,
                    &self.tools_hidden_total,
                    &self.aborts_total,
                    &self.repairs_total,
                    &self.reasks_total,
                    &self.retries_total,
                    &self.fallbacks_total,
                ]
                .iter()
                .map(|c| c.load(Ordering::Relaxed))
                .sum()
            }

            /// The Prometheus text exposition, with the live-run gauges and the upstream
            /// attempts' histogram appended.
            pub fn render(
                &self,
                runs_live: usize,
                runs_evicted: u64,
                trace_dropped: u64,
                upstream_seconds: &Histogram,
            ) -> String {
                let mut out = String::new();
                $(
                    let _ = writeln!(out, "# HELP selfheal_{} {}", stringify!($name), $help);
                    let _ = writeln!(out, "# TYPE selfheal_{} counter", stringify!($name));
                    let _ = writeln!(out, "selfheal_{} {}", stringify!($name), self.$name.load(Ordering::Relaxed));
                )*
                let _ = writeln!(out, "# HELP selfheal_healed_total Healing actions taken: guidance, hidden tools, aborts, repairs, re-asks, retries and fallbacks.\n# TYPE selfheal_healed_total counter\nselfheal_healed_total {}", self.healed_total());
                let _ = writeln!(out, "# HELP selfheal_runs_live Runs held in memory.\n# TYPE selfheal_runs_live gauge\nselfheal_runs_live {runs_live}");
                let _ = writeln!(out, "# HELP selfheal_runs_evicted_total Runs dropped for capacity or expiry.\n# TYPE selfheal_runs_evicted_total counter\nselfheal_runs_evicted_total {runs_evicted}");
                let _ = writeln!(out, "# HELP selfheal_trace_dropped_total Trace events dropped on a full queue.\n# TYPE selfheal_trace_dropped_total counter\nselfheal_trace_dropped_total {trace_dropped}");
                self.request_seconds.render(
                    &mut out,
                    "selfheal_request_duration_seconds",
                    "API requests (chat completions and responses), received to answered (headers, when streaming).",
                );
                upstream_seconds.render(
                    &mut out,
                    "selfheal_upstream_duration_seconds",
                    "Upstream attempts (every retry and fallback on its own).",
                );
                out
            }
        }
    };
}

counters! {
    requests_total => "API requests received, on every /v1 route alike.",
    guidance_total => "Requests that got monitor guidance.",
    tools_hidden_total => "Requests with circuit-broken tools removed.",
    aborts_total => "Runs ended by the monitor.",
    repairs_total => "Tool calls whose arguments were repaired in place.",
    reasks_total => "Upstream re-asks for unusable tool calls.",
    retries_total => "Upstream retries.",
    fallbacks_total => "Moves to the next model of a fallback chain.",
    upstream_errors_total => "Requests answered with an upstream error.",
    client_errors_total => "Requests refused as malformed, oversize or for an unknown model.",
    streams_broken_total => "Streams that broke mid-answer.",
    upstream_cancelled_total => "Upstream requests dropped because the client went away first.",
    degenerate_cut_total => "Model answers cut because they degenerated (whitespace, one piece repeated).",
}

/// What `/readyz` says about the state store: `{"backend": "memory" | "redis", "up": bool}`.
pub(crate) fn store_status(shared: &selfheal_state::Shared) -> serde_json::Value {
    serde_json::json!({
        "backend": shared.store().map_or("memory", |s| s.backend()),
        "up": shared.store_up(),
    })
}

/// `/metrics` lines of the state store and the shared tier: whether the store answers, its
/// failures and outages, the shared records held, and the upstream attempts other replicas'
/// open circuits spared (`skips`).
pub(crate) fn render_state(shared: &selfheal_state::Shared, skips: u64) -> String {
    let (errors, outages) = shared.store().map_or((0, 0), |s| {
        (s.health().errors_total(), s.health().down_episodes())
    });
    let records = shared.scan("", selfheal_state::unix_ms()).len();
    format!(
        "# HELP selfheal_state_store_up Whether the state store answers (1; always with the in-memory store). 0: serving from local state.\n\
         # TYPE selfheal_state_store_up gauge\nselfheal_state_store_up {}\n\
         # HELP selfheal_state_store_errors_total State store operations that failed or timed out.\n\
         # TYPE selfheal_state_store_errors_total counter\nselfheal_state_store_errors_total {errors}\n\
         # HELP selfheal_state_store_outages_total Times the state store became unreachable (each logged once).\n\
         # TYPE selfheal_state_store_outages_total counter\nselfheal_state_store_outages_total {outages}\n\
         # HELP selfheal_state_shared_records Shared records held by this replica (open circuits, learned targets).\n\
         # TYPE selfheal_state_shared_records gauge\nselfheal_state_shared_records {records}\n\
         # HELP selfheal_upstream_shared_skips_total Upstream attempts not made because another replica had its circuit open.\n\
         # TYPE selfheal_upstream_shared_skips_total counter\nselfheal_upstream_shared_skips_total {skips}\n",
        u8::from(shared.store_up()),
    )
}
