//! Setup shared by the benchmark's integration tests.
#![allow(clippy::unwrap_used, dead_code)]

use selfheal_bench::{FaultModel, Injected};

/// The default fault model and a fault of its kind `name` on `step` that never clears.
pub(crate) fn permanent(name: &str, step: usize) -> (FaultModel, Injected) {
    let model = FaultModel::default_model().unwrap();
    let spec = model.faults.iter().position(|f| f.name == name).unwrap();
    let fault = Injected {
        step,
        spec,
        permanent: true,
        k: 1,
        skew: 0.0,
    };
    (model, fault)
}
