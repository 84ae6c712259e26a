//! Unescaped quotes inside string values (issue 29): `{"q": "Windows "10""}`.
//!
//! Models forget to escape the quotes of a token they quote inside a string: a version, a
//! shell variable, a word, a nested quotation. The rule is that such a string comes back as
//! the writer meant it — the quotes kept as text — or is refused; never another value with
//! success, and never a key made up from the string's text.
//!
//! The cases are generated: every token shape below, in every position of the string, in
//! every place a string value can stand in tool arguments, with and without a schema.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod fuzzing;

use fuzzing::QUOTED_TOKENS as TOKENS;
use selfheal_repair::{Ending, SchemaGuide, repair, repair_arguments};
use serde_json::{Value, json};

const PREFIXES: &[&str] = &["", "Windows ", "echo ", "find the ", "a: "];
const SUFFIXES: &[&str] = &["", " now", ".", " and \"more\" too", " 5"];

/// The value text with its inner quotes left unescaped, as a model writes it.
fn raw_string(inner: &str) -> String {
    // Backslashes are not part of these shapes; every quote is written bare.
    format!("\"{inner}\"")
}

/// The arguments object, written with the broken string in `place`, and the value meant.
fn documents(inner: &str) -> Vec<(String, Value)> {
    let s = raw_string(inner);
    let meant = Value::String(inner.to_owned());
    vec![
        (format!("{{\"q\": {s}}}"), json!({"q": meant})),
        (
            format!("{{\"q\": {s}, \"n\": 1}}"),
            json!({"q": meant, "n": 1}),
        ),
        (
            format!("{{\"n\": 1, \"q\": {s}}}"),
            json!({"n": 1, "q": meant}),
        ),
        (
            format!("{{\"q\": {s}, \"r\": \"plain\"}}"),
            json!({"q": meant, "r": "plain"}),
        ),
        (
            format!("{{\"outer\": {{\"q\": {s}}}}}"),
            json!({"outer": {"q": meant}}),
        ),
        (format!("{{\"list\": [{s}]}}"), json!({"list": [meant]})),
        (
            format!("{{\"list\": [{s}, \"b\"]}}"),
            json!({"list": [meant, "b"]}),
        ),
        (format!("[{s}]"), json!([meant])),
    ]
}

/// Every generated case: (input, the value meant).
fn cases() -> Vec<(String, Value)> {
    let mut out = Vec::new();
    for token in TOKENS {
        for prefix in PREFIXES {
            for suffix in SUFFIXES {
                let inner = format!("{prefix}\"{token}\"{suffix}");
                out.extend(documents(&inner));
            }
        }
    }
    out
}

#[test]
fn a_quoted_token_in_a_string_is_kept_or_refused_never_misread() {
    let cases = cases();
    let mut wrong = Vec::new();
    let mut restored = 0;
    for (input, meant) in &cases {
        if let Ok(r) = repair(input) {
            if &r.value == meant {
                restored += 1;
            } else {
                wrong.push(format!("{input}  =>  {}", r.value));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "{} of {} came back as another value:\n{}",
        wrong.len(),
        cases.len(),
        wrong
            .iter()
            .take(40)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n")
    );
    // Refusing everything would pass the loop above: most shapes must be restored.
    assert!(
        restored * 10 >= cases.len() * 8,
        "only {restored} of {} restored",
        cases.len()
    );
}

#[test]
fn with_a_schema_a_quoted_token_is_never_misread_either() {
    let schema = json!({
        "type": "object",
        "properties": {
            "q": {"type": "string"},
            "n": {"type": "integer"},
            "r": {"type": "string"},
            "outer": {"type": "object"},
            "list": {"type": "array", "items": {"type": "string"}}
        },
        "additionalProperties": false
    });
    let guide = SchemaGuide::new(&schema).unwrap();
    let mut wrong = Vec::new();
    let mut total = 0;
    for (input, meant) in cases().iter().filter(|(i, _)| i.starts_with('{')) {
        total += 1;
        for ending in [Ending::Unknown, Ending::Finished] {
            if let Ok(a) = repair_arguments(input, Some(&guide), ending)
                && &a.value != meant
            {
                wrong.push(format!("{input}  =>  {}", a.value));
            }
        }
    }
    assert!(total > 0);
    assert!(
        wrong.is_empty(),
        "{} came back as another value:\n{}",
        wrong.len(),
        wrong
            .iter()
            .take(40)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n")
    );
}

#[test]
fn the_issue_examples_come_back_as_written() {
    for (input, meant) in [
        (r#"{"q": "Windows "10""}"#, json!({"q": "Windows \"10\""})),
        (
            r#"{"cmd": "echo "$HOME""}"#,
            json!({"cmd": "echo \"$HOME\""}),
        ),
        (
            r#"{"q": "find "Italian" food"}"#,
            json!({"q": "find \"Italian\" food"}),
        ),
        (
            r#"{"q": "say ""hi"" now"}"#,
            json!({"q": "say \"\"hi\"\" now"}),
        ),
    ] {
        let r = repair(input).unwrap_or_else(|e| panic!("{input}: {e}"));
        assert_eq!(r.value, meant, "{input}");
    }
}

#[test]
fn no_key_is_made_up_from_string_text() {
    // Whatever the reading, the keys of the result are the keys the writer wrote.
    for (input, _) in cases() {
        let Ok(r) = repair(&input) else { continue };
        let mut stack = vec![&r.value];
        while let Some(v) = stack.pop() {
            match v {
                Value::Object(m) => {
                    for (k, child) in m {
                        assert!(
                            ["q", "n", "r", "outer", "list"].contains(&k.as_str()),
                            "{input}: made-up key {k:?} in {}",
                            r.value
                        );
                        stack.push(child);
                    }
                }
                Value::Array(items) => stack.extend(items),
                _ => {}
            }
        }
    }
}

#[test]
fn a_missing_comma_between_members_is_still_repaired() {
    // The reading that a quote closes the string stays where the next member proves it.
    for (input, meant) in [
        (r#"{"a": "x" "b": 1}"#, json!({"a": "x", "b": 1})),
        (r#"["x" 10, 2]"#, json!(["x", 10, 2])),
        (
            r#"["value" "value1" "value2"]"#,
            json!(["value", "value1", "value2"]),
        ),
        (r#"["" " now"]"#, json!(["", " now"])),
        (
            r#"{"a": "x", "b": "y" "c": "z"}"#,
            json!({"a": "x", "b": "y", "c": "z"}),
        ),
    ] {
        let r = repair(input).unwrap_or_else(|e| panic!("{input}: {e}"));
        assert_eq!(r.value, meant, "{input}");
    }
}
