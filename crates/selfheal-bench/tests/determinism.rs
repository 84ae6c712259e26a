//! A benchmark report is a pure function of its configuration: same config, same bytes.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use selfheal_bench::{BenchConfig, run};

fn json(config: &BenchConfig) -> String {
    serde_json::to_string(&run(config, &mut |_, _| {}, None)).unwrap()
}

fn small(seed: u64) -> BenchConfig {
    BenchConfig {
        seed,
        seeds: 2,
        tasks: 50,
        fault_rate: 0.3,
        ..BenchConfig::default()
    }
}

#[test]
fn same_config_gives_byte_identical_json() {
    let a = json(&small(1));
    let b = json(&small(1));
    assert!(!a.is_empty());
    assert_eq!(a, b);
}

#[test]
fn the_trace_does_not_change_the_report() {
    let config = small(4);
    let mut lines = 0usize;
    let mut sink = |_: &str| lines += 1;
    let traced = serde_json::to_string(&run(&config, &mut |_, _| {}, Some(&mut sink))).unwrap();
    assert!(lines > 0);
    assert_eq!(traced, json(&config));
}

#[test]
fn a_different_seed_gives_different_json() {
    let a = json(&small(1));
    let b = json(&small(3));
    assert_ne!(a, b);
    // Not only the echoed config differs: the measured results do.
    let ra: serde_json::Value = serde_json::from_str(&a).unwrap();
    let rb: serde_json::Value = serde_json::from_str(&b).unwrap();
    assert_ne!(
        (&ra["results"], &ra["details"], &ra["census"]),
        (&rb["results"], &rb["details"], &rb["census"])
    );
}
