//! Issue 14's differential property: for any valid JSON `v` and any corruption from the
//! repairable set, `repair(corrupt(v))` is `v` or a refusal — never a third value; and any
//! prefix of valid JSON is refused or keeps only what was written in full.
//!
//! `PROPTEST_CASES=1000000 cargo test --release -p selfheal-repair --test differential` runs
//! it long; CI runs the default 512 cases per property.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

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

/// The repairable corruptions, each one a liberty models take that loses nothing.
#[derive(Debug, Clone, Copy)]
struct Corruption {
    unquoted_keys: bool,
    single_quotes: bool,
    python_literals: bool,
    trailing_commas: bool,
    comments: bool,
    missing_commas: bool,
    pretty: bool,
    fence: bool,
    prose: bool,
    /// Closing brackets left off at the end.
    drop_closers: u8,
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

const WORDS: [&str; 14] = [
    "true",
    "false",
    "null",
    "True",
    "False",
    "None",
    "TRUE",
    "FALSE",
    "NULL",
    "Null",
    "undefined",
    "NaN",
    "Infinity",
    "nan",
];

fn is_identifier(k: &str) -> bool {
    let mut b = k.bytes();
    b.next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == b'_')
        && b.all(|c| c.is_ascii_alphanumeric() || c == b'_')
        && !WORDS.contains(&k)
}

fn simple(s: &str) -> bool {
    s.chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, ' ' | '_' | '.' | '-'))
}

fn write_str(out: &mut String, s: &str, c: Corruption) {
    if c.single_quotes && simple(s) {
        out.push('\'');
        out.push_str(s);
        out.push('\'');
    } else {
        out.push_str(&serde_json::to_string(s).unwrap());
    }
}

fn sep(out: &mut String, c: Corruption, depth: usize) {
    if c.pretty {
        out.push('\n');
        out.push_str(&"  ".repeat(depth));
    }
}

fn write(out: &mut String, v: &Value, c: Corruption, depth: usize) {
    match v {
        Value::Null => out.push_str(if c.python_literals { "None" } else { "null" }),
        Value::Bool(b) => out.push_str(match (b, c.python_literals) {
            (true, true) => "True",
            (false, true) => "False",
            (true, false) => "true",
            (false, false) => "false",
        }),
        Value::Number(n) => out.push_str(&n.to_string()),
        Value::String(s) => write_str(out, s, c),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    // Only between two non-strings: `"a" true` is as likely an unescaped
                    // quote inside a string as a missing comma.
                    let unambiguous = !item.is_string() && !items[i - 1].is_string();
                    out.push_str(if c.missing_commas && unambiguous {
                        " "
                    } else {
                        ","
                    });
                }
                if c.comments {
                    out.push_str(" /* c */ ");
                }
                sep(out, c, depth + 1);
                write(out, item, c, depth + 1);
            }
            if c.trailing_commas && !items.is_empty() {
                out.push(',');
            }
            sep(out, c, depth);
            out.push(']');
        }
        Value::Object(map) => {
            out.push('{');
            for (i, (k, item)) in map.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                if c.comments {
                    out.push_str(" // c\n");
                }
                sep(out, c, depth + 1);
                if c.unquoted_keys && is_identifier(k) {
                    out.push_str(k);
                } else {
                    write_str(out, k, c);
                }
                out.push_str(": ");
                write(out, item, c, depth + 1);
            }
            if c.trailing_commas && !map.is_empty() {
                out.push(',');
            }
            sep(out, c, depth);
            out.push('}');
        }
    }
}

fn corrupt(v: &Value, c: Corruption) -> String {
    let mut text = String::new();
    write(&mut text, v, c, 0);
    for _ in 0..c.drop_closers {
        let t = text.trim_end();
        if t.ends_with('}') || t.ends_with(']') {
            let cut = t.len() - 1;
            text.truncate(cut);
        }
    }
    if c.fence {
        text = format!("```json\n{text}\n```");
    }
    // Prose around a bare scalar is a sentence, not a wrapped value.
    if c.prose && (v.is_object() || v.is_array()) {
        text = format!("Here is the call:\n{text}\nLet me know if you need more.");
    }
    text
}

/// Whether `got` keeps only what `v` holds: containers may lack trailing members, every
/// scalar is exact.
fn structural_prefix(got: &Value, v: &Value) -> bool {
    match (got, v) {
        (Value::Array(g), Value::Array(o)) => {
            g.len() <= o.len()
                && g.iter().zip(o).enumerate().all(|(i, (a, b))| {
                    if i + 1 == g.len() {
                        structural_prefix(a, b)
                    } else {
                        a == b
                    }
                })
        }
        (Value::Object(g), Value::Object(o)) => g
            .iter()
            .all(|(k, a)| o.get(k).is_some_and(|b| structural_prefix(a, b))),
        _ => got == v,
    }
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
