//! The repairable corruptions of issue 14's differential property: each is a liberty models
//! take that loses nothing, so `repair(corrupt(v, c))` must give back `v` or refuse. Shared by
//! `tests/differential.rs` (proptest) and the `repair_differential` fuzz target.

use serde_json::Value;

/// The repairable corruptions, each one a liberty models take that loses nothing.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Corruption {
    pub unquoted_keys: bool,
    pub single_quotes: bool,
    pub python_literals: bool,
    pub trailing_commas: bool,
    pub comments: bool,
    pub missing_commas: bool,
    pub pretty: bool,
    pub fence: bool,
    pub prose: bool,
    /// Closing brackets left off at the end.
    pub drop_closers: u8,
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
        out.push_str(&Value::String(s.to_owned()).to_string());
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

pub(crate) fn corrupt(v: &Value, c: Corruption) -> String {
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
pub(crate) fn structural_prefix(got: &Value, v: &Value) -> bool {
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
