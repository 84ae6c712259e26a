//! Issue 14's differential property: for any valid JSON `v` and any corruption from the
//! repairable set, `repair(corrupt(v))` is `v` or a refusal — never a third value; and any
//! prefix of valid JSON is refused or keeps only what was written in full.
//!
//! `PROPTEST_CASES=1000000 cargo test --release -p selfheal-repair --test differential` runs
//! it long; CI runs the default 512 cases per property. The corruptions live in
//! `fuzzing/corrupt.rs`, shared with the `repair_differential` fuzz target (`scripts/fuzz.sh`).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "fuzzing/corrupt.rs"]
mod corrupt;

use corrupt::{Corruption, corrupt, structural_prefix};
use proptest::prelude::*;
use selfheal_repair::repair;
use serde_json::{Map, Value};

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(512)
}

fn leaf() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        (-1.0e6f64..1.0e6).prop_map(Value::from),
        "[a-zA-Z0-9 _.,:/#{}\\[\\]-]{0,12}".prop_map(Value::String),
        "\\PC{0,8}".prop_map(Value::String),
    ]
}

fn key() -> impl Strategy<Value = String> {
    prop_oneof!["[a-z_][a-z0-9_]{0,8}", "[a-zA-Z0-9 _.-]{0,8}", "\\PC{0,6}"]
}

fn value() -> impl Strategy<Value = Value> {
    leaf().prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::btree_map(key(), inner, 0..6)
                .prop_map(|m| Value::Object(m.into_iter().collect::<Map<_, _>>())),
        ]
    })
}

fn corruption() -> impl Strategy<Value = Corruption> {
    (
        (any::<bool>(), any::<bool>(), any::<bool>(), any::<bool>()),
        (any::<bool>(), any::<bool>(), any::<bool>()),
        (any::<bool>(), any::<bool>(), 0u8..4),
    )
        .prop_map(|((a, b, c, d), (e, f, g), (h, i, j))| Corruption {
            unquoted_keys: a,
            single_quotes: b,
            python_literals: c,
            trailing_commas: d,
            comments: e,
            missing_commas: f,
            pretty: g,
            fence: h,
            prose: i,
            drop_closers: j,
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases()))]

    #[test]
    fn repairable_corruptions_restore_the_value_or_refuse(v in value(), c in corruption()) {
        let text = corrupt(&v, c);
        if let Ok(r) = repair(&text) {
            prop_assert_eq!(&r.value, &v, "from {:?} ({:?}); repairs {:?}", text, c, r.repairs);
        }
    }

    #[test]
    fn prefixes_are_refused_or_keep_only_whole_values(
        v in value(),
        pretty in any::<bool>(),
        cut in any::<prop::sample::Index>(),
    ) {
        let text = if pretty {
            serde_json::to_string_pretty(&v).unwrap()
        } else {
            serde_json::to_string(&v).unwrap()
        };
        let boundaries: Vec<usize> = (1..text.len()).filter(|&i| text.is_char_boundary(i)).collect();
        // A prefix of a lone number is a valid number: it is returned as it is.
        if boundaries.is_empty() || v.is_number() {
            return Ok(());
        }
        let at = boundaries[cut.index(boundaries.len())];
        let prefix = &text[..at];
        if let Ok(r) = repair(prefix) {
            prop_assert!(
                structural_prefix(&r.value, &v),
                "{:?} → {} is not a prefix of {}", prefix, r.value, v
            );
        }
    }
}
