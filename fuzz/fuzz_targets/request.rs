//! Fuzz target: the gateway's request view (`request::ChatRequest`) on any client body, read and
//! written back with the edits the first byte picks. The body is shared with the stable replay
//! test (`crates/selfheal-gateway/tests/fuzzing/mod.rs`).
#![no_main]

#[path = "../../crates/selfheal-gateway/tests/fuzzing/mod.rs"]
mod fuzzing;

libfuzzer_sys::fuzz_target!(|data: &[u8]| fuzzing::request(data));
