//! The gateway arm end to end: the real gateway on 127.0.0.1:0 between the plain agent client
//! and the scripted model endpoint, on a few seeded episodes. Properties only — that every
//! episode completes over HTTP, on the same schedule as in-process — never the arm's numbers.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use selfheal_bench::Strategy;
use selfheal_bench::{BenchConfig, schedules};

fn small(seed: u64, tasks: usize, fault_rate: f64) -> BenchConfig {
    BenchConfig {
        seed,
        seeds: 1,
        tasks,
        fault_rate,
        strategies: vec![Strategy::SelfHealing],
        ..BenchConfig::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_episode_completes_over_http_on_the_in_process_schedule() {
    let config = small(3, 25, 0.3);
    let started = Instant::now();
    let mut calls = 0;
    let report = selfheal_bench_gateway::run(&config, &mut |_, _| calls += 1)
        .await
        .expect("every request came back");
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "no client-visible hang: {:?}",
        started.elapsed()
    );
    assert_eq!(calls, 25, "progress after every episode");
    assert_eq!(report.episodes.len(), 25);
    assert_eq!(report.results.len(), 2);
    assert!(report.results.iter().all(|r| r.episodes == 25));
    assert_eq!(report.gateway.errors, 0, "{:?}", report.gateway.statuses);
    assert!(
        report
            .episodes
            .iter()
            .all(|e| e.turns >= 1 && e.model_requests >= 1),
        "every episode went through the gateway to the model"
    );

    // The same drawn schedule, episode by episode, as the benchmark's own runner.
    let model = config.effective_model();
    let drawn = &schedules(&config)[0];
    for (e, faults) in report.episodes.iter().zip(drawn) {
        let mut names: Vec<String> = faults
            .iter()
            .map(|f| model.faults[f.spec].name.clone())
            .collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(e.faults, names, "task {}", e.task);
    }
    assert!(
        report.episodes.iter().any(|e| !e.faults.is_empty()),
        "the run meets faults at this rate"
    );

    // The in-process row is the benchmark's own self-healing row on these episodes.
    let bench = selfheal_bench::run(&config, &mut |_, _| {}, None);
    assert_eq!(bench.results[0], report.results[0]);
    let a = report.agreement;
    assert_eq!(a.both + a.only_in_process + a.only_gateway + a.neither, 25);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_faults_both_sides_solve_everything_and_the_gateway_does_nothing() {
    // Without faults, and with a model that makes no mistakes of its own (issue 32: the default
    // simulated model errs on its own).
    let mut config = small(1, 10, 0.0);
    config.fault_model.model = selfheal_bench::ModelRates::PERFECT;
    let report = selfheal_bench_gateway::run(&config, &mut |_, _| {})
        .await
        .expect("every request came back");
    assert_eq!(report.agreement.both, 10, "{:?}", report.episodes);
    assert!(report.results.iter().all(|r| r.sfr == 0.0));
    assert_eq!(report.gateway.statuses.get("complete"), Some(&10));
    // Without faults the only thing the gateway adds is the cross-checks' guidance: no
    // recovery action, nothing charged.
    assert!(
        report.gateway.actions.keys().all(|a| a == "guidance"),
        "no healing without faults: {:?}",
        report.gateway.actions
    );
    // One model request per step, one more per cross-checked step, plus the answer: the
    // benchmark's plans have 3 to 6 steps.
    assert!(
        report
            .episodes
            .iter()
            .all(|e| (4..=13).contains(&e.model_requests)),
        "{:?}",
        report
            .episodes
            .iter()
            .map(|e| e.model_requests)
            .collect::<Vec<_>>()
    );
    // The cross-checks are the verifier's calls, priced as in-process (V, not U): the two
    // rows cost the same without faults.
    assert_eq!(report.results[0].cost, report.results[1].cost);
}

/// Issue 32: a provider-wide outage reaches the gateway as its upstream's HTTP 503, and the
/// gateway's own healing decides what happens (here: its chain's fallback model, which another
/// provider serves). Both sides place each episode on the benchmark's clock, so the outage
/// window strikes the episodes that run inside it and no other, and the in-process row is the
/// benchmark's own self-healing row on the same episodes. Properties, not the arm's numbers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_outage_is_an_upstream_503_the_gateway_heals() {
    let mut config = small(1, 4, 0.0);
    // Episodes start a minute apart: the window covers the third and the fourth.
    config.fault_model = selfheal_bench::FaultModel::from_toml_str(
        "[[fault]]\nname = \"provider_outage\"\nfamily = \"runtime\"\nweight = 1\n\
         target = \"primary\"\nwindow = { start_ms = 120000, end_ms = 240000 }\n\
         provider_wide = true\n\
         effect = { kind = \"http\", status = 503, message = \"503 Service Unavailable: provider outage\" }",
    )
    .unwrap();
    config.fault_model.model = selfheal_bench::ModelRates::PERFECT;
    let report = selfheal_bench_gateway::run(&config, &mut |_, _| {})
        .await
        .expect("every request came back");
    let struck: Vec<usize> = report
        .episodes
        .iter()
        .filter(|e| !e.faults.is_empty())
        .map(|e| e.task)
        .collect();
    assert_eq!(struck, [2, 3]);
    let bench = selfheal_bench::run(&config, &mut |_, _| {}, None);
    assert_eq!(bench.results[0], report.results[0]);
    // The gateway moved its upstream call to the fallback model (its own decision on the 503),
    // which wrote for every episode inside the outage.
    assert!(
        report.gateway.actions.contains_key("fallback"),
        "{:?}",
        report.gateway.actions
    );
    for e in report.episodes.iter().filter(|e| !e.faults.is_empty()) {
        assert!(e.gateway_costs.escalated_calls > 0, "{e:?}");
    }
}

/// Issue 33, item 2: a rate limit that clears with time, not with attempts, is waited out
/// through the gateway as in-process. The core's retry waits at least the tool's
/// `Retry-After`; the gateway holds the model call that long (the agent calls the tool again
/// only after it), and the arm's world sees that wait on the episode's clock (the gateway's
/// `Wait` advances it), so the tool's next call finds the limit over. Before, the gateway's
/// retry was guidance with no wait, and the plain agent called again into the same limit.
/// Properties, not the arm's numbers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rate_limit_that_clears_with_time_is_waited_out_on_the_episodes_clock() {
    let mut config = small(1, 8, 1.0);
    config.fault_model = selfheal_bench::FaultModel::from_toml_str(
        "[[fault]]\nname = \"rate_limited_for_a_while\"\nfamily = \"runtime\"\nweight = 1\n\
         target = \"primary\"\ntransient_k = [1, 1]\nclears_after_ms = [4000, 4000]\n\
         effect = { kind = \"http\", status = 429, message = \"429 Too Many Requests\", \
         retry_after_ms = 5000 }",
    )
    .unwrap();
    config.fault_model.model = selfheal_bench::ModelRates::PERFECT;
    let report = selfheal_bench_gateway::run(&config, &mut |_, _| {})
        .await
        .expect("every request came back");
    let faulted: Vec<_> = report
        .episodes
        .iter()
        .filter(|e| !e.faults.is_empty())
        .collect();
    assert!(!faulted.is_empty(), "the run meets the rate limit");
    assert!(
        report.gateway.actions.contains_key("wait"),
        "{:?}",
        report.gateway.actions
    );
    // Every episode the in-process client recovered by waiting, the gateway arm recovers too.
    for e in &faulted {
        assert!(
            !e.in_process.success || e.gateway.success,
            "task {}: solved in-process, not via the gateway: {:?}",
            e.task,
            e.transcript
        );
    }
    assert!(
        faulted.iter().any(|e| e.gateway.success),
        "the wait recovers some episode"
    );
}
