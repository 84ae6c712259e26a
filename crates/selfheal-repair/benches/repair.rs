//! Throughput of `repair` on ~10 MB documents: one that needs a few repairs, one cut at the
//! end (refused, and salvaged), one valid.
//!
//! The document is generated (no files, no randomness): an array of tool-call-like objects
//! with one single-quoted key, one trailing comma, one comment, and its closing bracket left off,
//! so the whole input goes through the lenient parser rather than the serde_json fast path.
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

use std::hint::black_box;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use selfheal_repair::{RepairOptions, repair, repair_with};

const TARGET_BYTES: usize = 10 * 1024 * 1024;

fn element(i: usize) -> String {
    format!(
        r#"{{"id": {i}, "name": "tool_{i}", "score": {}.{}, "ok": {}, "tags": ["alpha", "beta", "gamma"], "args": {{"city": "Paris \u00e9", "days": {}, "note": "line with \"quotes\" and \\ backslash"}}}}"#,
        i % 1000,
        i % 97,
        i.is_multiple_of(2),
        i % 14
    )
}

/// A ~10 MB JSON array in prose needing a few repairs, its closing bracket left off.
fn broken_document() -> String {
    let mut s = String::with_capacity(TARGET_BYTES + 1024);
    s.push_str("Here are the results:\n[\n");
    let mut i = 0;
    while s.len() < TARGET_BYTES {
        if i > 0 {
            s.push_str(",\n");
        }
        match i {
            10 => s.push_str("{'id': 10, 'name': 'single quoted'}"),
            20 => s.push_str(r#"{"id": 20, "trailing": [1, 2, 3,],}"#),
            30 => s.push_str("// a comment\n{\"id\": 30}"),
            _ => s.push_str(&element(i)),
        }
        i += 1;
    }
    // The closing bracket left off after a complete element (a cut inside one is refused).
    s
}

/// The same shape, valid, for the serde_json fast path.
fn valid_document() -> String {
    let mut s = String::with_capacity(TARGET_BYTES + 1024);
    s.push('[');
    let mut i = 0;
    while s.len() < TARGET_BYTES {
        if i > 0 {
            s.push(',');
        }
        s.push_str(&element(i));
        i += 1;
    }
    s.push(']');
    s
}

fn bench(c: &mut Criterion) {
    let broken = broken_document();
    let check = repair(&broken).expect("the bench document is repairable");
    assert!(check.repairs.len() >= 5, "{:?}", check.repairs);
    let valid = valid_document();
    // Valid up to a cut in the last element: the worst case for a parse-then-repair design.
    let truncated = valid[..valid.len() - 40].to_owned();

    let mut group = c.benchmark_group("repair");
    group.sample_size(20);
    group.throughput(Throughput::Bytes(broken.len() as u64));
    group.bench_function("10MB_needs_repairs", |b| {
        // Dropping the result is the caller's cost, not the parser's: keep it out of the
        // measurement (glibc's free of a million small nodes otherwise dominates).
        b.iter_with_large_drop(|| repair(black_box(&broken)).expect("repairable"));
    });
    assert!(repair(&truncated).is_err(), "a cut document is refused");
    group.throughput(Throughput::Bytes(truncated.len() as u64));
    group.bench_function("10MB_truncated_at_end_refused", |b| {
        b.iter_with_large_drop(|| repair(black_box(&truncated)).expect_err("refused"));
    });
    let salvage = RepairOptions::salvage();
    group.bench_function("10MB_truncated_at_end_salvaged", |b| {
        b.iter_with_large_drop(|| repair_with(black_box(&truncated), &salvage).expect("salvaged"));
    });
    group.throughput(Throughput::Bytes(valid.len() as u64));
    group.bench_function("10MB_valid_fast_path", |b| {
        b.iter_with_large_drop(|| repair(black_box(&valid)).expect("valid"));
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
