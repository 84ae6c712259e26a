//! Repair throughput on a file as the best and median of N runs, for a machine too loaded for
//! criterion's mean to mean much: the best run is the one least disturbed by other work, and
//! on Linux the CPU time the thread actually ran (`/proc/thread-self/schedstat`) is reported
//! beside the wall time, since it leaves out the time other processes held the core.
//!
//! `cargo run --release -p selfheal-repair --example throughput_probe -- FILE [RUNS]`
//! (pin it with `taskset -c 1`). Dropping the result is left out of the timing, as in the
//! criterion bench.
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

use std::time::Instant;

/// Nanoseconds this thread has run on a CPU, where the kernel says so.
fn cpu_ns() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    text.split_whitespace().next()?.parse().ok()
}

fn summary(label: &str, mib: f64, mut secs: Vec<f64>) {
    secs.sort_by(f64::total_cmp);
    println!(
        "{label}: best {:.1} MiB/s  median {:.1} MiB/s",
        mib / secs[0],
        mib / secs[secs.len() / 2]
    );
}

fn main() {
    let path = std::env::args()
        .nth(1)
        .expect("usage: throughput_probe FILE [RUNS]");
    let runs: usize = std::env::args()
        .nth(2)
        .map_or(30, |s| s.parse().expect("RUNS is a number"));
    let text = std::fs::read_to_string(path).expect("a readable UTF-8 file");
    let mut wall = Vec::with_capacity(runs);
    let mut cpu = Vec::with_capacity(runs);
    for _ in 0..runs.max(1) {
        let c0 = cpu_ns();
        let t = Instant::now();
        let result = selfheal_repair::repair(std::hint::black_box(&text));
        wall.push(t.elapsed().as_secs_f64());
        if let (Some(a), Some(b)) = (c0, cpu_ns()) {
            cpu.push((b - a) as f64 / 1e9);
        }
        drop(result);
    }
    let mib = text.len() as f64 / (1024.0 * 1024.0);
    println!("{} runs on {mib:.1} MiB", wall.len());
    summary("wall", mib, wall);
    if !cpu.is_empty() {
        summary("cpu ", mib, cpu);
    }
}
