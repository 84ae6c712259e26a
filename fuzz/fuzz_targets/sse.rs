//! Fuzz target: the gateway's SSE relay (`stream::relay`) on any upstream stream, cut into
//! pieces, with or without a failing connection and re-ask hooks. The body is shared with the
//! stable replay test (`crates/selfheal-gateway/tests/fuzzing/mod.rs`).
#![no_main]

#[path = "../../crates/selfheal-gateway/tests/fuzzing/mod.rs"]
mod fuzzing;

libfuzzer_sys::fuzz_target!(|data: &[u8]| fuzzing::sse(data));
