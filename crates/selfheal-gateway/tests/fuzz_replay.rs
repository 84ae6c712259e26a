//! The gateway's fuzz targets on stable: every committed seed in `fuzz/seeds/{request,sse}`
//! (hand-written inputs and the inputs of past findings), then a seeded sweep of byte-level
//! mutants of them. The fuzzers themselves run on nightly: `scripts/fuzz.sh request`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod fuzzing;

#[path = "../../../fuzz/seeds/replay.rs"]
mod replay;

use replay::{mutants, seeds};

#[test]
fn request_seeds_and_their_mutants() {
    let seeds = seeds("request");
    for (name, data) in &seeds {
        eprintln!("{name}");
        fuzzing::request(data);
    }
    for m in mutants(&seeds, 200) {
        fuzzing::request(&m);
    }
}

#[test]
fn sse_seeds_and_their_mutants() {
    let seeds = seeds("sse");
    for (name, data) in &seeds {
        eprintln!("{name}");
        fuzzing::sse(data);
    }
    for m in mutants(&seeds, 50) {
        fuzzing::sse(&m);
    }
}
