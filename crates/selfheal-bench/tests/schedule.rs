//! The fault schedule: what the default workload contains, that it is shared by all strategies,
//! and that the silent setting injects only plausible-but-wrong faults.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::{BTreeMap, BTreeSet};

use selfheal_bench::catalogue::tasks;
use selfheal_bench::faults::{Family, Fault, FaultKind, Mix, Persistence, Signalling, schedule};
use selfheal_bench::strategies::Strategy;
use selfheal_bench::{BenchConfig, run};

/// Every fault of the configuration's schedule, keyed by (seed, task id).
fn all_faults(config: &BenchConfig) -> BTreeMap<(u64, usize), Vec<Fault>> {
    let ts = tasks();
    let mix = config.effective_mix();
    let mut out = BTreeMap::new();
    for seed in config.seed..config.seed + u64::from(config.seeds) {
        for t in &ts[..config.tasks] {
            out.insert((seed, t.id), schedule(t, seed, config.fault_rate, &mix));
        }
    }
    out
}

#[test]
fn the_default_schedule_covers_the_whole_fault_model() {
    let config = BenchConfig::default();
    assert_eq!((config.seed, config.seeds, config.tasks), (1, 10, 100));
    let faults: Vec<Fault> = all_faults(&config).into_values().flatten().collect();
    assert!(!faults.is_empty());

    let families: BTreeSet<Family> = faults.iter().map(|f| f.kind.family()).collect();
    for fam in Family::ALL {
        assert!(families.contains(&fam), "family {fam:?} never scheduled");
    }
    let kinds: BTreeSet<FaultKind> = faults.iter().map(|f| f.kind).collect();
    for k in FaultKind::ALL {
        assert!(kinds.contains(&k), "kind {k:?} never scheduled");
    }
    assert!(
        faults
            .iter()
            .any(|f| matches!(f.persistence, Persistence::Transient { .. }))
    );
    assert!(
        faults
            .iter()
            .any(|f| f.persistence == Persistence::Permanent)
    );
    assert!(faults.iter().any(|f| f.signalling == Signalling::Explicit));
    assert!(faults.iter().any(|f| f.signalling == Signalling::Implicit));
    assert!(faults.iter().any(|f| f.correlated), "no correlated fault");
    assert!(faults.iter().any(|f| f.repairable), "no repairable fault");
    // Only runtime faults are correlated, and always transient.
    for f in faults.iter().filter(|f| f.correlated) {
        assert_eq!(f.kind.family(), Family::Runtime, "{f:?}");
        assert!(
            matches!(f.persistence, Persistence::Transient { .. }),
            "{f:?}"
        );
    }
    // Rate limits are always transient.
    for f in faults.iter().filter(|f| f.kind == FaultKind::RateLimit) {
        assert!(
            matches!(f.persistence, Persistence::Transient { .. }),
            "{f:?}"
        );
    }
}

#[test]
fn the_schedule_is_the_same_for_every_strategy() {
    let config = BenchConfig {
        seeds: 2,
        tasks: 40,
        fault_rate: 0.3,
        ..BenchConfig::default()
    };
    let expected = all_faults(&config);
    let mut censuses = Vec::new();
    for strategy in Strategy::ALL {
        let one = BenchConfig {
            strategies: vec![strategy],
            ..config.clone()
        };
        let mut lines = Vec::new();
        let mut sink = |l: &str| lines.push(l.to_owned());
        let report = run(&one, &mut |_, _| {}, Some(&mut sink));
        censuses.push(report.census);
        let mut episodes = 0;
        for l in &lines {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            if v["event"] != "episode" {
                continue;
            }
            episodes += 1;
            let key = (
                v["seed"].as_u64().unwrap(),
                usize::try_from(v["task"].as_u64().unwrap()).unwrap(),
            );
            let met: Vec<Fault> = serde_json::from_value(v["faults"].clone()).unwrap();
            let scheduled = &expected[&key];
            for f in &met {
                assert!(
                    scheduled.contains(f),
                    "{} met {f:?} in {key:?}, which is not in the schedule {scheduled:?}",
                    strategy.as_str()
                );
            }
        }
        assert_eq!(episodes, expected.len());
    }
    // The census describes the schedule, and the schedule does not depend on the strategy.
    let faults: Vec<&Fault> = expected.values().flatten().collect();
    for c in &censuses {
        assert_eq!(c, &censuses[0]);
        assert_eq!(c.transient + c.permanent, faults.len() as u64);
        assert_eq!(c.explicit + c.implicit, faults.len() as u64);
        assert_eq!(
            c.faulted_episodes,
            expected.values().filter(|fs| !fs.is_empty()).count() as u64
        );
    }
    // Nor on the budget.
    let swept = run(
        &BenchConfig {
            sweep: true,
            strategies: vec![Strategy::Static],
            ..config.clone()
        },
        &mut |_, _| {},
        None,
    );
    assert_eq!(swept.census, censuses[0]);
}

#[test]
fn the_schedule_depends_only_on_task_seed_rate_and_mix() {
    let ts = tasks();
    let mix = Mix::default();
    for t in &ts {
        assert_eq!(schedule(t, 5, 0.2, &mix), schedule(t, 5, 0.2, &mix));
    }
    // A higher rate only adds faults at steps the lower rate did not hit: same draws.
    for t in &ts {
        let low = schedule(t, 5, 0.1, &mix);
        let high = schedule(t, 5, 0.3, &mix);
        for f in &low {
            assert!(
                high.contains(f),
                "task {}: {f:?} lost at a higher rate",
                t.id
            );
        }
    }
    assert!(ts.iter().all(|t| schedule(t, 5, 0.0, &mix).is_empty()));
}

#[test]
fn the_silent_setting_schedules_only_plausible_wrong() {
    let config = BenchConfig {
        silent: true,
        fault_rate: 0.3,
        ..BenchConfig::default()
    };
    assert_eq!(config.effective_mix(), Mix::silent());
    let faults: Vec<Fault> = all_faults(&config).into_values().flatten().collect();
    assert!(faults.len() > 100, "only {} faults", faults.len());
    for f in &faults {
        assert_eq!(f.kind, FaultKind::PlausibleWrong, "{f:?}");
        assert_eq!(f.signalling, Signalling::Implicit, "{f:?}");
    }
    // The silent flag overrides an explicit mix.
    let overridden = BenchConfig {
        mix: Mix::parse("runtime=1").unwrap(),
        seeds: 2,
        tasks: 30,
        ..config
    };
    let report = run(
        &BenchConfig {
            strategies: vec![Strategy::Static],
            ..overridden
        },
        &mut |_, _| {},
        None,
    );
    assert!(!report.census.by_family.is_empty());
    assert!(
        report
            .census
            .by_family
            .keys()
            .all(|f| *f == Family::Semantic),
        "{:?}",
        report.census.by_family
    );
}
