//! The repair fuzz targets on stable: every committed seed in `fuzz/seeds/{repair,repair_differential}`
//! (hand-written inputs and the inputs of past findings), then a seeded sweep of byte-level
//! mutants of them. The fuzzers themselves run on nightly: `scripts/fuzz.sh repair_differential`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod fuzzing;

#[path = "../../../fuzz/seeds/replay.rs"]
mod replay;

use replay::{mutants, seeds};

#[test]
fn repair_seeds_and_their_mutants() {
    let seeds = seeds("repair");
    for (name, data) in &seeds {
        eprintln!("{name}");
        fuzzing::repair_no_panic(data);
    }
    for m in mutants(&seeds, 200) {
        fuzzing::repair_no_panic(&m);
    }
}

#[test]
fn differential_seeds_and_their_mutants() {
    let seeds = seeds("repair_differential");
    for (name, data) in &seeds {
        eprintln!("{name}");
        fuzzing::repair_differential(data);
    }
    for m in mutants(&seeds, 200) {
        fuzzing::repair_differential(&m);
    }
}

#[test]
fn quote_seeds_and_their_mutants() {
    let seeds = seeds("repair_quotes");
    for (name, data) in &seeds {
        eprintln!("{name}");
        fuzzing::quote_in_string(data);
    }
    for m in mutants(&seeds, 2_000) {
        fuzzing::quote_in_string(&m);
    }
}
