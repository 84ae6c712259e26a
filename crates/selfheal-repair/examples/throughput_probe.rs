//! Repair throughput on a file as the best and median of N runs, for a machine too loaded for
//! criterion's mean to mean much: the best run is the one least disturbed by other work.
//!
//! `cargo run --release -p selfheal-repair --example throughput_probe -- FILE [RUNS]`
//! (pin it with `taskset -c 1`). Dropping the result is left out of the timing, as in the
//! criterion bench.
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

use std::time::Instant;

fn main() {
    let path = std::env::args()
        .nth(1)
        .expect("usage: throughput_probe FILE [RUNS]");
    let runs: usize = std::env::args()
        .nth(2)
        .map_or(30, |s| s.parse().expect("RUNS is a number"));
    let text = std::fs::read_to_string(path).expect("a readable UTF-8 file");
    let mut times = Vec::with_capacity(runs);
    for _ in 0..runs.max(1) {
        let t = Instant::now();
        let result = selfheal_repair::repair(std::hint::black_box(&text));
        times.push(t.elapsed().as_secs_f64());
        drop(result);
    }
    times.sort_by(f64::total_cmp);
    let mib = text.len() as f64 / (1024.0 * 1024.0);
    println!(
        "best {:.1} MiB/s  median {:.1} MiB/s  ({} runs, {:.1} MiB)",
        mib / times[0],
        mib / times[times.len() / 2],
        times.len(),
        mib
    );
}
