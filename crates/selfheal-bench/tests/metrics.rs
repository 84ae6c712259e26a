//! The metrics: TSR, RSR and SFR recounted from the per-episode trace. No test pins any
//! strategy's score: the benchmark must be able to show the winner losing.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use selfheal_bench::Strategy;
use selfheal_bench::{BenchConfig, Report, run};
use serde_json::Value;

fn run_traced(config: &BenchConfig) -> (Report, Vec<Value>) {
    let mut lines = Vec::new();
    let mut sink = |l: &str| lines.push(l.to_owned());
    let report = run(config, &mut |_, _| {}, Some(&mut sink));
    let episodes = lines
        .iter()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|v| v["event"] == "episode")
        .collect();
    (report, episodes)
}

fn round4(x: f64) -> f64 {
    (x * 10_000.0).round() / 10_000.0
}

fn check_recount(strategy: Strategy, fault_rate: f64) -> (u64, u64, u64) {
    let config = BenchConfig {
        seeds: 2,
        tasks: 60,
        fault_rate,
        strategies: vec![strategy],
        ..BenchConfig::default()
    };
    let (report, eps) = run_traced(&config);
    assert_eq!(report.results.len(), 1);
    let row = &report.results[0];
    let d = &report.details[0];
    let n = eps.len() as u64;
    assert_eq!(row.episodes, n);
    let flag = |v: &Value, k: &str| v[k].as_bool().unwrap();
    let count = |f: &dyn Fn(&Value) -> bool| eps.iter().filter(|v| f(v)).count() as u64;
    let successes = count(&|v| flag(v, "success"));
    let silent = count(&|v| flag(v, "claimed") && !flag(v, "success"));
    let unclaimed = count(&|v| !flag(v, "claimed"));
    let faulted = count(&|v| !v["faults"].as_array().unwrap().is_empty());
    let recovered = count(&|v| flag(v, "success") && !v["faults"].as_array().unwrap().is_empty());
    // A success is always a claimed answer.
    assert_eq!(count(&|v| flag(v, "success") && !flag(v, "claimed")), 0);
    assert_eq!(d.successes, successes, "{}", strategy.as_str());
    assert_eq!(d.silent_failures, silent, "{}", strategy.as_str());
    assert_eq!(d.faulted, faulted, "{}", strategy.as_str());
    assert_eq!(d.recovered, recovered, "{}", strategy.as_str());
    // Failures without an answer never count as silent.
    assert_eq!(successes + silent + unclaimed, n);
    assert_eq!(row.tsr, round4(successes as f64 / n as f64));
    assert_eq!(row.sfr, round4(silent as f64 / n as f64));
    assert_eq!(row.rsr, round4(recovered as f64 / faulted as f64));
    // The model errs on its own, so an episode without an injected fault can fail too; RSR
    // counts only the faulted ones.
    assert!(
        successes - recovered <= n - faulted,
        "{}",
        strategy.as_str()
    );
    (silent, unclaimed, faulted)
}

#[test]
fn sfr_counts_only_wrong_answers_returned_as_correct() {
    let (silent, unclaimed, faulted) = check_recount(Strategy::Static, 0.3);
    // The run must contain both kinds of failure for the distinction to be tested.
    assert!(silent > 0, "static should return some wrong answers");
    assert!(unclaimed > 0, "static should fail some episodes outright");
    assert!(faulted > 0);
}

#[test]
fn metrics_recount_for_every_strategy() {
    for s in Strategy::ALL {
        check_recount(s, 0.3);
    }
}

#[test]
fn rsr_uses_only_faulted_episodes() {
    // With no faults nothing is faulted: RSR is 0 of 0; with a model that never errs on its
    // own, TSR is perfect, so RSR is not TSR in disguise.
    let mut fault_model = selfheal_bench::FaultModel::default_model().unwrap();
    fault_model.model = selfheal_bench::ModelRates::PERFECT;
    let config = BenchConfig {
        seeds: 1,
        tasks: 20,
        fault_rate: 0.0,
        fault_model,
        strategies: vec![Strategy::Static],
        ..BenchConfig::default()
    };
    let report = run(&config, &mut |_, _| {}, None);
    let (row, d) = (&report.results[0], &report.details[0]);
    assert_eq!(d.faulted, 0);
    assert_eq!(row.tsr, 1.0);
    assert_eq!(row.rsr, 0.0);
    assert_eq!(row.sfr, 0.0);
}

/// Issue 32: the risk/coverage points are the faulted episodes' recovered and silent shares, and
/// a point is on the frontier exactly when no other dominates it.
#[test]
fn the_frontier_is_the_undominated_points() {
    let config = BenchConfig {
        seeds: 2,
        tasks: 40,
        fault_rate: 0.3,
        ..BenchConfig::default()
    };
    let report = run(&config, &mut |_, _| {}, None);
    assert_eq!(report.frontier.len(), Strategy::ALL.len());
    for p in &report.frontier {
        let d = report
            .details
            .iter()
            .find(|d| d.strategy == p.strategy)
            .unwrap();
        assert_eq!(p.recovered, round4(d.recovered as f64 / d.faulted as f64));
        assert_eq!(p.silent, round4(d.silent_faulted as f64 / d.faulted as f64));
        let dominated = report.frontier.iter().any(|q| {
            q.recovered >= p.recovered
                && q.silent <= p.silent
                && (q.recovered > p.recovered || q.silent < p.silent)
        });
        assert_eq!(p.on_frontier, !dominated, "{}", p.strategy);
    }
    assert!(report.frontier.iter().any(|p| p.on_frontier));
    let svg = selfheal_bench::svg_risk_coverage(&report);
    assert!(svg.starts_with("<svg") && svg.contains("self-healing"));
}

/// Issue 32, item 7: a sweep draws self-healing's curve over its policy's `risk` setting on the
/// same episodes. The point at the policy's own setting is the report's self-healing point; at
/// risk 0 nothing is claimed after a recovery, so no faulted episode is recovered by one (a
/// faulted episode can still succeed when its fault never struck); each point is marked
/// against the strategies' points; the plot draws the curve. A run without --sweep has none.
#[test]
fn a_sweep_draws_self_healing_over_its_risk_setting() {
    let config = BenchConfig {
        seeds: 1,
        tasks: 40,
        fault_rate: 0.3,
        strategies: vec![Strategy::Static, Strategy::SelfHealing],
        sweep: true,
        ..BenchConfig::default()
    };
    let report = run(&config, &mut |_, _| {}, None);
    let curve = &report.risk_curve;
    assert_eq!(curve.len(), selfheal_bench::RISK_SETTINGS.len());
    // The curve's episodes are counted apart from the strategies' (`--timings` adds them).
    assert_eq!(config.curve_episodes(), curve.len() as u64 * 40);
    let top = report.frontier.iter().map(|p| p.budget).max().unwrap();
    let sh = report
        .frontier
        .iter()
        .find(|p| p.strategy == "self-healing")
        .unwrap();
    let own: Vec<_> = curve.iter().filter(|p| p.configured).collect();
    assert_eq!(own.len(), 1);
    assert_eq!(own[0].risk, 0.01);
    assert_eq!(
        (own[0].recovered, own[0].silent, own[0].budget),
        (sh.recovered, sh.silent, top)
    );
    let zero = curve.iter().find(|p| p.risk == 0.0).unwrap();
    let loosest = curve.last().unwrap();
    assert!(zero.recovered <= own[0].recovered && own[0].recovered <= loosest.recovered);
    for p in curve {
        let dominated = report.frontier.iter().any(|q| {
            q.recovered >= p.recovered
                && q.silent <= p.silent
                && (q.recovered > p.recovered || q.silent < p.silent)
        });
        assert_eq!(p.on_frontier, !dominated, "risk {}", p.risk);
    }
    let svg = selfheal_bench::svg_risk_coverage(&report);
    assert!(svg.contains("class=\"risk-curve\""));
    // One square per distinct point (settings that give the same point share one).
    let mut distinct: Vec<(f64, f64)> = curve.iter().map(|p| (p.recovered, p.silent)).collect();
    distinct.dedup();
    assert_eq!(
        svg.matches("class=\"risk-setting\"").count(),
        distinct.len()
    );
    let md = selfheal_bench::report_markdown(&report, &[]);
    assert!(md.contains("| 0.01 (the policy's) |"), "{md}");

    let single = run(
        &BenchConfig {
            sweep: false,
            ..config
        },
        &mut |_, _| {},
        None,
    );
    assert!(single.risk_curve.is_empty());
    assert_eq!(single.config.curve_episodes(), 0);
    assert!(!selfheal_bench::svg_risk_coverage(&single).contains("risk-curve"));
}

/// Issue 32, item 8: the false alarms on episodes where nothing went wrong are counted per
/// detector. With no fault and a model that never errs every episode is such an episode, and
/// the cross-check's equivalent sources differ by their documented noise, so a verifying
/// strategy's cross-check fires on some of them; a strategy without a verifier has none of
/// its alarms.
#[test]
fn false_alarms_are_counted_per_detector_on_clean_episodes() {
    let mut fault_model = selfheal_bench::FaultModel::default_model().unwrap();
    fault_model.model = selfheal_bench::ModelRates::PERFECT;
    let config = BenchConfig {
        seeds: 3,
        tasks: 100,
        fault_rate: 0.0,
        fault_model,
        strategies: vec![Strategy::React, Strategy::FullReplanVerify],
        ..BenchConfig::default()
    };
    let report = run(&config, &mut |_, _| {}, None);
    for d in &report.details {
        assert_eq!(d.clean_episodes, 300, "{}", d.strategy);
        assert!(d.false_alarms_clean.values().all(|n| *n <= 300));
    }
    assert!(
        !report.details[0]
            .false_alarms_clean
            .contains_key("cross_check")
    );
    let verifying = &report.details[1].false_alarms_clean;
    assert!(
        verifying.get("cross_check").is_some_and(|n| *n > 0),
        "{verifying:?}"
    );
}
