//! The fault schedule: every fault of the default model is drawn, the schedule is the same for
//! every strategy, and `--silent` draws only semantic faults.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;

use selfheal_bench::Family;
use selfheal_bench::Strategy;
use selfheal_bench::{BenchConfig, run, schedules};

#[test]
fn every_fault_of_the_default_model_is_drawn_in_the_default_run() {
    let config = BenchConfig::default();
    let model = config.effective_model();
    let drawn: Vec<usize> = schedules(&config)
        .into_iter()
        .flatten()
        .flatten()
        .map(|f| f.spec)
        .collect();
    for (i, f) in model.faults.iter().enumerate() {
        assert!(drawn.contains(&i), "fault `{}` is never drawn", f.name);
    }
    let sched = schedules(&config);
    let all: Vec<_> = sched.iter().flatten().flatten().collect();
    assert!(all.iter().any(|f| f.permanent) && all.iter().any(|f| !f.permanent));
    // Several faults on one step happen.
    let report = run(
        &BenchConfig {
            strategies: vec![Strategy::Static],
            ..config
        },
        &mut |_, _| {},
        None,
    );
    assert!(report.census.multi_fault_steps > 0);
    assert!(report.census.explicit > 0 && report.census.implicit > 0);
}

#[test]
fn the_schedule_is_the_same_for_every_strategy() {
    let config = BenchConfig {
        seeds: 2,
        tasks: 40,
        fault_rate: 0.3,
        ..BenchConfig::default()
    };
    let mut lines = Vec::new();
    let mut sink = |l: &str| lines.push(l.to_owned());
    run(&config, &mut |_, _| {}, Some(&mut sink));
    let mut by_episode: BTreeMap<(u64, u64), BTreeMap<String, serde_json::Value>> = BTreeMap::new();
    for l in &lines {
        let v: serde_json::Value = serde_json::from_str(l).unwrap();
        if v["event"] != "episode" {
            continue;
        }
        by_episode
            .entry((v["seed"].as_u64().unwrap(), v["task"].as_u64().unwrap()))
            .or_default()
            .insert(
                v["strategy"].as_str().unwrap().to_owned(),
                v["faults"].clone(),
            );
    }
    assert_eq!(by_episode.len(), 80);
    let mut faulted = 0;
    for per in by_episode.values() {
        assert_eq!(per.len(), Strategy::ALL.len());
        let first = per.values().next().unwrap();
        assert!(per.values().all(|f| f == first), "{per:?}");
        faulted += usize::from(!first.as_array().unwrap().is_empty());
    }
    assert!(faulted > 20);
}

#[test]
fn the_silent_setting_draws_only_semantic_faults() {
    let config = BenchConfig {
        silent: true,
        seeds: 2,
        fault_rate: 0.5,
        ..BenchConfig::default()
    };
    let model = config.effective_model();
    let drawn: Vec<_> = schedules(&config).into_iter().flatten().flatten().collect();
    assert!(!drawn.is_empty());
    for f in drawn {
        assert_eq!(model.faults[f.spec].family, Family::Semantic);
    }
}
