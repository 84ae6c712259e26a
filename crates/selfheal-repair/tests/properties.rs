//! Property tests: valid JSON comes back unchanged, broken JSON never panics.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use proptest::prelude::*;
use selfheal_repair::{RepairOptions, SchemaGuide, repair, repair_with};
use serde_json::{Map, Value, json};

fn leaf() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(Value::from),
        "\\PC*".prop_map(Value::String),
        "[\\x00-\\x1f\"\\\\'\u{201c}\u{201d}a/ ]{0,8}".prop_map(Value::String),
    ]
}

fn value() -> impl Strategy<Value = Value> {
    leaf().prop_recursive(6, 64, 8, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..8).prop_map(Value::Array),
            prop::collection::btree_map("\\PC{0,6}", inner, 0..8)
                .prop_map(|m| Value::Object(m.into_iter().collect::<Map<_, _>>())),
        ]
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn valid_json_round_trips_without_repairs(v in value()) {
        for text in [serde_json::to_string(&v).unwrap(), serde_json::to_string_pretty(&v).unwrap()] {
            let r = repair(&text).unwrap();
            prop_assert_eq!(&r.value, &v);
            prop_assert!(r.repairs.is_empty(), "{:?}", r.repairs);
        }
    }

    /// Deeper than serde_json's 128 levels: the lenient parser itself must agree with
    /// serde_json on valid input.
    #[test]
    fn lenient_parser_agrees_with_serde_on_valid_input(v in value()) {
        let mut deep = v.clone();
        for _ in 0..130 {
            deep = Value::Array(vec![deep]);
        }
        let text = serde_json::to_string(&deep).unwrap();
        let r = repair(&text).unwrap();
        prop_assert!(r.repairs.is_empty(), "{:?}", r.repairs);
        let mut got = &r.value;
        for _ in 0..130 {
            got = &got[0];
        }
        prop_assert_eq!(got, &v);
    }

    #[test]
    fn truncated_output_never_panics_and_yields_json(v in value(), cut in any::<prop::sample::Index>()) {
        let text = serde_json::to_string(&v).unwrap();
        let boundaries: Vec<usize> = (0..=text.len()).filter(|&i| text.is_char_boundary(i)).collect();
        let at = boundaries[cut.index(boundaries.len())];
        if let Ok(r) = repair(&text[..at]) {
            let out = serde_json::to_string(&r.value).unwrap();
            prop_assert!(serde_json::from_str::<Value>(&out).is_ok());
        }
    }

    #[test]
    fn arbitrary_text_never_panics(s in "\\PC{0,64}") {
        if let Ok(r) = repair(&s) {
            prop_assert!(serde_json::to_string(&r.value).is_ok());
        }
    }

    /// Bare text (`RepairOptions::bare_text`, as `selfheal repair` reads) never panics, and
    /// where the default refuses for want of JSON, what it returns is the trimmed input itself
    /// as a string: nothing added, nothing dropped.
    #[test]
    fn bare_text_is_the_input_or_a_refusal(s in "\\PC{0,48}") {
        let bare = RepairOptions::default().with_bare_text(true);
        if let (Ok(r), Err(selfheal_repair::RepairError::NoJson)) = (repair_with(&s, &bare), repair(&s)) {
            prop_assert_eq!(r.value, Value::String(s.trim().to_owned()));
        }
    }

    /// Backtick strings and double-encoded documents, including the offsets mapped back
    /// through the unescaping: every offset points into the input, at a character boundary.
    #[test]
    fn backtick_and_encoded_soup_keeps_offsets_in_the_input(s in "[{}\\[\\]\"'`$,:0-9a-z \\n\\\\\u{e9}]{0,48}") {
        let decode = RepairOptions::default().with_decode_strings(true);
        for input in [s.clone(), format!("{{{s}}}"), serde_json::to_string(&format!("{{{s}}}")).unwrap()] {
            if let Ok(r) = repair_with(&input, &decode) {
                prop_assert!(serde_json::to_string(&r.value).is_ok());
                for x in &r.repairs {
                    prop_assert!(
                        x.offset <= input.len() && input.is_char_boundary(x.offset),
                        "{:?} in {:?}", x, input
                    );
                }
            }
        }
    }

    #[test]
    fn json_alphabet_soup_never_panics(s in "[{}\\[\\]\"',:0-9a-zA-Z.+\\- \\n\\\\/*#()\u{201c}\u{201d}\u{2018}\u{2019}…]{0,64}") {
        if let Ok(r) = repair(&s) {
            let guide = SchemaGuide::new(&json!({"type": "object", "properties": {"a": {"type": "integer"}}})).unwrap();
            let _ = guide.apply(r.value.clone());
            if let Ok(g) = SchemaGuide::new(&r.value) {
                let _ = g.apply(r.value);
            }
        }
    }
}
