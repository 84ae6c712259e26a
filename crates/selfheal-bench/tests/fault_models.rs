//! The fault models shipped in `faults/` are valid data: each parses, and each of its faults can
//! strike some built-in task, so a run of the file draws what the file says.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use selfheal_bench::faultmodel::FaultModel;
use selfheal_bench::task::builtin;

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
