//! Fuzz target: `repair` and `SchemaGuide` on arbitrary bytes never panic, and whatever `repair`
//! returns is valid JSON. The body is shared with the stable replay test
//! (`crates/selfheal-repair/tests/fuzzing/mod.rs`).
#![no_main]

#[path = "../../crates/selfheal-repair/tests/fuzzing/mod.rs"]
mod fuzzing;

libfuzzer_sys::fuzz_target!(|data: &[u8]| fuzzing::repair_no_panic(data));
