//! The bodies of the repair fuzz targets, shared by `fuzz/fuzz_targets/` (libFuzzer, nightly)
//! and `tests/fuzz_replay.rs` (the committed seeds and a seeded sweep, on stable), so the
//! property a fuzzer checks is the property CI checks. A panic is a finding.
//!
//! - [`repair_no_panic`]: any bytes; `repair` and `SchemaGuide` never panic, and what `repair`
//!   returns is valid JSON.
//! - [`repair_differential`]: the bytes choose a valid JSON value and a corruption from the
//!   repairable set (`corrupt.rs`); `repair` gives back the value or refuses. Or they choose a
//!   value and a cut: a prefix of valid JSON is refused or keeps only whole values.
//! - [`quote_in_string`]: the bytes choose strings holding quoted tokens left unescaped; `repair`
//!   gives back the value meant or refuses.

// Each user of this module (two fuzz targets, one test) takes what it needs.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

pub(crate) mod corrupt;

use std::sync::LazyLock;

use selfheal_repair::{SchemaGuide, repair};
use serde_json::{Map, Value, json};

use corrupt::{Corruption, corrupt, structural_prefix};

static GUIDE: LazyLock<Option<SchemaGuide>> = LazyLock::new(|| {
    SchemaGuide::new(&json!({
        "type": "object",
        "properties": {
            "name": {"type": "string"},
            "n": {"type": "integer", "default": 1},
            "tags": {"type": "array", "items": {"type": "str"}},
            "unit": {"enum": ["c", "f"]},
            "nested": {"$ref": "#"},
            "opt": {"anyOf": [{"type": "number"}, {"type": "null"}]}
        },
        "additionalProperties": false
    }))
    .ok()
});

/// What models put in quotes inside a string: digits, `$`-words, words, flags, paths,
/// punctuation, nested quotations and nothing at all — shared by [`quote_in_string`] and
/// `tests/quotes_in_strings.rs`. Not a lone blank, `,` or `:`: in an array `["" " now"]` and
/// `["echo ","echo"]` are also exactly the text of two strings (the first with its comma
/// missing, the reading the public repair suites expect), a reading no one can rule out.
pub(crate) const QUOTED_TOKENS: &[&str] = &[
    "10",
    "3.5",
    "2024-01-01",
    "-1",
    "007",
    "1e5",
    "$HOME",
    "${VAR}",
    "$1",
    "Italian",
    "two words",
    "--force",
    "-v",
    "#tag",
    "@user",
    "/usr/bin",
    "[1, 2]",
    "{x}",
    "(a)",
    "a, b",
    "key: value",
    "it's",
    "",
    "€5",
    "x\"y",
];

/// `repair` and `SchemaGuide` on arbitrary bytes: no panic, and the output is valid JSON.
pub(crate) fn repair_no_panic(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(repaired) = repair(text) else {
        return;
    };
    let out = serde_json::to_string(&repaired.value).expect("a repaired value serialises");
    // serde_json stops at 128 levels; deeper output is checked by our own parser instead.
    match serde_json::from_str::<Value>(&out) {
        Ok(_) => {}
        Err(e) if e.to_string().contains("recursion limit") => {
            let again = repair(&out).expect("deep output parses again");
            assert!(again.repairs.is_empty(), "deep output is valid JSON");
        }
        Err(e) => panic!("the output is not valid JSON: {e}: {out}"),
    }
    if let Some(guide) = GUIDE.as_ref() {
        let _ = guide.apply(repaired.value.clone());
    }
    // The value itself as a schema exercises normalisation and the coercion walk.
    if let Ok(guide) = SchemaGuide::new(&repaired.value) {
        let _ = guide.apply(repaired.value);
    }
}

/// Issue 14's differential property, driven by bytes instead of proptest's strategies.
pub(crate) fn repair_differential(data: &[u8]) {
    let mut src = Source { data, pos: 0 };
    let mode = src.byte();
    let v = value(&mut src, 0);
    if mode & 1 == 0 {
        let flags = src.byte();
        let bit = |i: u8| flags & (1 << i) != 0;
        let c = Corruption {
            unquoted_keys: bit(0),
            single_quotes: bit(1),
            python_literals: bit(2),
            trailing_commas: bit(3),
            comments: bit(4),
            missing_commas: bit(5),
            pretty: bit(6),
            fence: bit(7),
            prose: mode & 2 != 0,
            drop_closers: (mode >> 2) % 4,
        };
        let text = corrupt(&v, c);
        if let Ok(r) = repair(&text) {
            assert_eq!(r.value, v, "from {text:?} ({c:?}); repairs {:?}", r.repairs);
        }
    } else {
        let text = if mode & 2 != 0 {
            serde_json::to_string_pretty(&v)
        } else {
            serde_json::to_string(&v)
        }
        .expect("a value serialises");
        let boundaries: Vec<usize> = (1..text.len())
            .filter(|&i| text.is_char_boundary(i))
            .collect();
        // A prefix of a lone number is a valid number: it is returned as it is.
        if boundaries.is_empty() || v.is_number() {
            return;
        }
        let at = boundaries[src.u64() as usize % boundaries.len()];
        let prefix = &text[..at];
        if let Ok(r) = repair(prefix) {
            assert!(
                structural_prefix(&r.value, &v),
                "{prefix:?} → {} is not a prefix of {v}",
                r.value
            );
        }
    }
}

/// Reads choices from the fuzzer's bytes; zeros once they run out, so every input ends.
struct Source<'a> {
    data: &'a [u8],
    pos: usize,
}

impl Source<'_> {
    fn byte(&mut self) -> u8 {
        let b = self.data.get(self.pos).copied().unwrap_or(0);
        self.pos += 1;
        b
    }

    fn u64(&mut self) -> u64 {
        (0..8).fold(0, |acc, _| (acc << 8) | u64::from(self.byte()))
    }

    fn text(&mut self, max: u8) -> String {
        const PLAIN: &[u8] = b"abcxyzABZ019 _.,:/#{}[]-'\"\\";
        let len = self.byte() % (max + 1);
        let wide = self.byte() & 1 != 0;
        (0..len)
            .map(|_| {
                if wide {
                    // Any scalar value, controls included: serde_json escapes what it must.
                    let n = (u32::from(self.byte()) << 8 | u32::from(self.byte())).wrapping_mul(17)
                        % 0x11_0000;
                    char::from_u32(n).unwrap_or('\u{fffd}')
                } else {
                    char::from(PLAIN[usize::from(self.byte()) % PLAIN.len()])
                }
            })
            .collect()
    }

    fn number(&mut self) -> Value {
        match self.byte() % 3 {
            0 => Value::from(self.u64() as i64),
            1 => Value::from(self.u64()),
            // Any finite double: serde_json writes the shortest text that reads back exactly.
            _ => {
                let f = f64::from_bits(self.u64());
                if f.is_finite() {
                    Value::from(f)
                } else {
                    Value::from(0.5)
                }
            }
        }
    }
}

/// A valid JSON value, at most four levels deep and six wide.
fn value(src: &mut Source<'_>, depth: usize) -> Value {
    let kinds = if depth >= 4 { 5 } else { 7 };
    match src.byte() % kinds {
        0 => Value::Null,
        1 => Value::Bool(src.byte() & 1 != 0),
        2 => src.number(),
        3 | 4 => Value::String(src.text(12)),
        5 => {
            let n = src.byte() % 6;
            Value::Array((0..n).map(|_| value(src, depth + 1)).collect())
        }
        _ => {
            let n = src.byte() % 6;
            let mut m = Map::new();
            for _ in 0..n {
                let k = src.text(8);
                m.insert(k, value(src, depth + 1));
            }
            Value::Object(m)
        }
    }
}

/// Issue 29's property: the bytes choose an object of tool arguments whose string values hold
/// quoted tokens written with their quotes unescaped (`{"q": "Windows "10""}`) — digits,
/// `$`-words, words, flags, punctuation, nested quotes — and where the strings stand (a member,
/// among others, nested, in an array). `repair` gives back the value meant or refuses; it never
/// returns another value, and never a key the writer did not write.
pub(crate) fn quote_in_string(data: &[u8]) {
    const PLAIN: &[&str] = &[
        "", "Windows ", "echo ", "a: ", " now", ".", " 5", "a, b", "x y",
    ];
    let mut src = Source { data, pos: 0 };
    let mut pick = |list: &[&'static str]| list[usize::from(src.byte()) % list.len()];
    // QUOTED_TOKENS, the shapes `tests/quotes_in_strings.rs` enumerates.
    // The string: plain text and quoted tokens, one to three of each.
    let mut meant = String::new();
    let parts = 1 + data.len() % 3;
    for _ in 0..parts {
        meant.push_str(pick(PLAIN));
        meant.push('"');
        meant.push_str(pick(QUOTED_TOKENS));
        meant.push('"');
    }
    meant.push_str(pick(PLAIN));
    let raw = format!("\"{meant}\"");
    let place = pick(&["member", "first", "last", "nested", "array", "array-first"]);
    let (text, want) = match place {
        "member" => (format!("{{\"q\": {raw}}}"), json!({"q": meant})),
        "first" => (
            format!("{{\"q\": {raw}, \"n\": 1}}"),
            json!({"q": meant, "n": 1}),
        ),
        "last" => (
            format!("{{\"n\": 1, \"q\": {raw}}}"),
            json!({"n": 1, "q": meant}),
        ),
        "nested" => (
            format!("{{\"o\": {{\"q\": {raw}}}, \"n\": 1}}"),
            json!({"o": {"q": meant}, "n": 1}),
        ),
        "array" => (format!("{{\"l\": [{raw}]}}"), json!({"l": [meant]})),
        _ => (
            format!("{{\"l\": [{raw}, \"b\"]}}"),
            json!({"l": [meant, "b"]}),
        ),
    };
    let Ok(r) = repair(&text) else {
        return;
    };
    assert_eq!(r.value, want, "from {text:?}; repairs {:?}", r.repairs);
}
