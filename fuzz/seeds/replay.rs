//! Shared by the stable replays of the fuzz targets (`crates/*/tests/fuzz_replay.rs`, which
//! include it with `#[path]`): the committed seeds of a target, and a fixed sweep of byte-level
//! mutants of them.

use std::path::PathBuf;

/// The seeds of one target, sorted by name.
pub(crate) fn seeds(target: &str) -> Vec<(String, Vec<u8>)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../fuzz/seeds")
        .join(target);
    let mut out: Vec<(String, Vec<u8>)> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| {
            let path = e.unwrap().path();
            (path.display().to_string(), std::fs::read(&path).unwrap())
        })
        .collect();
    out.sort();
    assert!(!out.is_empty(), "no seeds in {}", dir.display());
    out
}

/// `n` mutants of each seed (bytes overwritten, inserted, removed; the end cut), from a fixed
/// seed: the same inputs on every run.
pub(crate) fn mutants(seeds: &[(String, Vec<u8>)], n: usize) -> Vec<Vec<u8>> {
    let mut state = 0x5eed_u64;
    let mut next = move || {
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        (z ^ (z >> 31)) as usize
    };
    const BYTES: &[u8] = b"{}[]\":, \\n0-9eE.\n\rtrue";
    let mut out = Vec::new();
    for (_, seed) in seeds {
        for _ in 0..n {
            let mut m = seed.clone();
            for _ in 0..1 + next() % 4 {
                let at = next() % (m.len() + 1);
                let b = BYTES[next() % BYTES.len()];
                match next() % 4 {
                    0 if at < m.len() => m[at] = b,
                    1 => m.insert(at, b),
                    2 if at < m.len() => {
                        m.remove(at);
                    }
                    _ => m.truncate(at),
                }
            }
            out.push(m);
        }
    }
    out
}
