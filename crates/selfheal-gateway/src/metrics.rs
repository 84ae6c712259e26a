//! Prometheus counters: what the gateway healed, and how often (the healing rate of SPEC §2).

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};

macro_rules! counters {
    ($($name:ident => $help:literal),* $(,)?) => {
        /// The gateway's counters.
        #[derive(Debug, Default)]
        pub struct Metrics {
            $(#[doc = $help] pub $name: AtomicU64,)*
        }

        impl Metrics {
            /// Adds one to a counter.
            pub fn inc(counter: &AtomicU64) {
                counter.fetch_add(1, Ordering::Relaxed);
            }

            /// The Prometheus text exposition, with the live-run gauges appended.
            pub fn render(&self, runs_live: usize, runs_evicted: u64, trace_dropped: u64) -> String {
                let mut out = String::new();
                $(
                    let _ = writeln!(out, "# HELP selfheal_{} {}", stringify!($name), $help);
                    let _ = writeln!(out, "# TYPE selfheal_{} counter", stringify!($name));
                    let _ = writeln!(out, "selfheal_{} {}", stringify!($name), self.$name.load(Ordering::Relaxed));
                )*
                let _ = writeln!(out, "# HELP selfheal_runs_live Runs held in memory.\n# TYPE selfheal_runs_live gauge\nselfheal_runs_live {runs_live}");
                let _ = writeln!(out, "# HELP selfheal_runs_evicted_total Runs dropped for capacity or expiry.\n# TYPE selfheal_runs_evicted_total counter\nselfheal_runs_evicted_total {runs_evicted}");
                let _ = writeln!(out, "# HELP selfheal_trace_dropped_total Trace events dropped on a full queue.\n# TYPE selfheal_trace_dropped_total counter\nselfheal_trace_dropped_total {trace_dropped}");
                out
            }
        }
    };
}

counters! {
    requests_total => "Chat-completion requests received.",
    healed_total => "Requests the gateway changed or answered to heal the run.",
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
}
