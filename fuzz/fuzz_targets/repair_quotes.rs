//! Fuzz target: strings holding quoted tokens with their quotes left unescaped come back as
//! meant or are refused (issue 29). The body is shared with the stable replay test
//! (`crates/selfheal-repair/tests/fuzzing/mod.rs`).
#![no_main]

#[path = "../../crates/selfheal-repair/tests/fuzzing/mod.rs"]
mod fuzzing;

libfuzzer_sys::fuzz_target!(|data: &[u8]| fuzzing::quote_in_string(data));
