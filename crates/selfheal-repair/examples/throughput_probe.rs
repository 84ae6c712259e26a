#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]
use std::time::Instant;
fn main() {
    let path = std::env::args().nth(1).unwrap();
    let n: usize = std::env::args().nth(2).map_or(30, |s| s.parse().unwrap());
    let text = std::fs::read_to_string(path).unwrap();
    let mut best = f64::MAX;
    let mut all = Vec::new();
    for _ in 0..n {
        let t = Instant::now();
        let r = selfheal_repair::repair(std::hint::black_box(&text));
        let dt = t.elapsed().as_secs_f64();
        drop(r);
        best = best.min(dt);
        all.push(dt);
    }
    all.sort_by(f64::total_cmp);
    let mib = text.len() as f64 / 1048576.0;
    println!(
        "best {:.1} MiB/s  median {:.1} MiB/s",
        mib / best,
        mib / all[all.len() / 2]
    );
}
