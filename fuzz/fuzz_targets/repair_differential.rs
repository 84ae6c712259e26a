//! Fuzz target: issue 14's differential property. For a valid JSON value and a corruption from
//! the repairable set, both chosen by the input, `repair` gives back the value or refuses; a
//! prefix of valid JSON is refused or keeps only whole values. The body is shared with the
//! stable replay test (`crates/selfheal-repair/tests/fuzzing/mod.rs`).
#![no_main]

#[path = "../../crates/selfheal-repair/tests/fuzzing/mod.rs"]
mod fuzzing;

libfuzzer_sys::fuzz_target!(|data: &[u8]| fuzzing::repair_differential(data));
