//! The fault models shipped in `faults/` are valid data: each parses, and each of its faults can
//! strike some built-in task, so a run of the file draws what the file says.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use selfheal_bench::FaultModel;
use selfheal_bench::builtin;

#[test]
fn every_shipped_fault_model_parses_and_every_fault_applies_somewhere() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("faults");
    let tasks = builtin(100);
    let mut files = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().and_then(|e| e.to_str()) != Some("toml") {
            continue;
        }
        files += 1;
        let text = std::fs::read_to_string(&path).unwrap();
        let model =
            FaultModel::from_toml_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        for f in &model.faults {
            let somewhere = tasks
                .iter()
                .any(|t| (0..t.plan.steps.len()).any(|s| f.applies(t, s)));
            assert!(
                somewhere,
                "{}: `{}` applies nowhere",
                path.display(),
                f.name
            );
        }
    }
    assert!(files >= 2, "the default and at least one other model ship");
}

#[test]
fn on_faults_nothing_can_fix_no_strategy_recovers_or_answers_wrongly() {
    // A property of `unrecoverable.toml`, not of any strategy: every fault there is permanent and
    // takes away the data on every source that has it, so a faulted episode has no right answer
    // to reach and no wrong value to return. The models' own errors are switched off: a model
    // that calls a sibling tool routes around the outage to a wrong value, which is the model's
    // doing, not the file's.
    use selfheal_bench::{BenchConfig, run};
    let text = include_str!("../faults/unrecoverable.toml");
    let mut fault_model = FaultModel::from_toml_str(text).unwrap();
    fault_model.model = selfheal_bench::ModelRates::PERFECT;
    let config = BenchConfig {
        seeds: 2,
        fault_rate: 0.3,
        fault_model_name: "unrecoverable.toml".into(),
        fault_model,
        ..BenchConfig::default()
    };
    let report = run(&config, &mut |_, _| {}, None);
    for d in &report.details {
        assert!(d.faulted > 0);
        assert_eq!(
            d.recovered, 0,
            "{} recovered a fault with no fix",
            d.strategy
        );
        assert_eq!(
            d.silent_faulted, 0,
            "{} returned a wrong answer",
            d.strategy
        );
    }
}
