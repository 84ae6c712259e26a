//! End-to-end tests of `selfheal repair`: the real binary, stdin in, stdout/stderr/exit out.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Write;
use std::process::{Command, Output, Stdio};

fn run(args: &[&str], stdin: &str) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_selfheal"))
        .arg("repair")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start selfheal");
    // The binary may exit before reading stdin (usage errors): ignore a broken pipe.
    let _ = child.stdin.take().unwrap().write_all(stdin.as_bytes());
    child.wait_with_output().unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn schema_file(name: &str, schema: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("selfheal-repair-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, schema).unwrap();
    path
}

#[test]
fn repairs_stdin_to_one_compact_line() {
    let out = run(&[], "Here you go:\n```json\n{'a': 1, b: [1, 2,],}\n```");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "{\"a\":1,\"b\":[1,2]}\n");
    assert!(out.stderr.is_empty());
}

#[test]
fn report_writes_the_repairs_as_json_to_stderr() {
    let out = run(&["--report"], "[1, 2,]");
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(text(&out.stdout), "[1,2]\n");
    let report: serde_json::Value = serde_json::from_str(text(&out.stderr).trim()).unwrap();
    assert_eq!(report["repairs"][0]["kind"], "trailing_comma");
    assert_eq!(report["repairs"][0]["offset"], 5);
}

#[test]
fn unrepairable_input_exits_1_with_the_reason() {
    let out = run(&[], "{\"unit\": }");
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stdout.is_empty());
    assert!(
        text(&out.stderr).contains("missing value for key \"unit\""),
        "{}",
        text(&out.stderr)
    );
    let out = run(&[], "Sorry, there is no JSON here.");
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("no JSON value found"));
}

/// Issue 14: one line of bare text is the string it spells, as npm `jsonrepair` reads it;
/// prose with structure in it, or two lines, is still refused.
#[test]
fn bare_text_is_the_string_it_spells() {
    let out = run(&["--report"], "hello   world\n");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout).trim(), r#""hello   world""#);
    assert!(text(&out.stderr).contains("unquoted_string"));
    for refused in ["first line\nsecond line", "a,b", "Note: none", "0789"] {
        let out = run(&[], refused);
        assert_eq!(out.status.code(), Some(1), "{refused:?}");
    }
}

#[test]
fn schema_coercions_make_the_value_valid() {
    let schema = schema_file(
        "ok.json",
        r#"{"type": "object", "properties": {"days": {"type": "integer"}, "unit": {"type": "string", "default": "c"}}, "required": ["days"]}"#,
    );
    let out = run(
        &["--schema", schema.to_str().unwrap(), "--report"],
        "{days: '3'}",
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    // No default is written unless asked.
    assert_eq!(text(&out.stdout), "{\"days\":3}\n");
    let report: serde_json::Value = serde_json::from_str(text(&out.stderr).trim()).unwrap();
    assert_eq!(report["coercions"][0]["kind"], "string_to_integer");
    assert_eq!(report["coercions"].as_array().unwrap().len(), 1);
    let out = run(
        &[
            "--schema",
            schema.to_str().unwrap(),
            "--report",
            "--fill-defaults",
        ],
        "{days: '3'}",
    );
    assert_eq!(text(&out.stdout), "{\"days\":3,\"unit\":\"c\"}\n");
    let report: serde_json::Value = serde_json::from_str(text(&out.stderr).trim()).unwrap();
    assert_eq!(report["coercions"][1]["kind"], "filled_default");
}

/// Issue 14: valid input with its schema comes back byte for byte as parsed, even where a
/// default or a coercion could apply.
#[test]
fn valid_input_comes_back_unchanged() {
    let schema = schema_file(
        "valid.json",
        r#"{"type": "dict", "properties": {"zip": {"type": "string"}, "n": {"type": "float", "default": "dontcare"}, "mode": {"type": "string", "enum": ["a"], "default": null}}, "required": ["zip"]}"#,
    );
    let out = run(
        &["--schema", schema.to_str().unwrap(), "--report"],
        r#"{"zip": "0789", "payload": "[1,2,3,]"}"#,
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(
        text(&out.stdout),
        "{\"zip\": \"0789\", \"payload\": \"[1,2,3,]\"}\n"
    );
    let report: serde_json::Value = serde_json::from_str(text(&out.stderr).trim()).unwrap();
    assert!(report["repairs"].as_array().unwrap().is_empty());
    assert!(report["coercions"].as_array().unwrap().is_empty());
}

/// Issue 29: valid input is printed byte for byte — member order, blanks, number spelling
/// and integers past 64 bits as written; `--canonical` re-formats on request and keeps the
/// digits.
#[test]
fn issue29_valid_input_comes_back_byte_for_byte() {
    let input = "{\"z\": 1.50,  \"a\": [1180591620717411303424, 1e5],\n \"m\": \"\\u00e9\"}";
    let out = run(&[], &format!("  {input}\n"));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), format!("{input}\n"));
    let out = run(&["--canonical"], input);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(
        text(&out.stdout),
        "{\"a\":[1180591620717411303424,100000.0],\"m\":\"é\",\"z\":1.5}\n"
    );
}

/// Issue 29: a repaired document keeps every number as written, however many digits.
#[test]
fn issue29_repaired_numbers_keep_their_digits() {
    let out = run(
        &[],
        "{'id': 1180591620717411303424, 'pi': 3.14159265358979323846, 'n': 2,}",
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(
        text(&out.stdout),
        "{\"id\":1180591620717411303424,\"n\":2,\"pi\":3.14159265358979323846}\n"
    );
}

/// Issue 29: a quoted token inside a string is kept as text, never made a key.
#[test]
fn issue29_quotes_inside_strings_are_text() {
    let out = run(&[], r#"{"q": "Windows "10"", "cmd": "echo "$HOME""}"#);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(
        text(&out.stdout),
        r#"{"cmd":"echo \"$HOME\"","q":"Windows \"10\""}"#.to_owned() + "\n"
    );
}

/// Issue 29: input over `--max-bytes` is a usage error (exit 2) before any parse.
#[test]
fn issue29_input_over_the_size_limit_exits_2() {
    let out = run(&["--max-bytes", "10"], "{\"a\": \"0123456789\"}");
    assert_eq!(out.status.code(), Some(2));
    assert!(out.stdout.is_empty());
    assert!(
        text(&out.stderr).contains("--max-bytes 10"),
        "{}",
        text(&out.stderr)
    );
    let out = run(&["--max-bytes", "17"], "{\"a\": \"0123\"}");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
}

/// Issue 14: a cut that lost data exits 1 with where the answer stopped; salvage is opt-in
/// and says so.
#[test]
fn truncation_exits_1_and_salvage_is_reported() {
    let input = r#"{"from": "USD", "to_currency": "C"#;
    let out = run(&["--report", "--tool", "convert"], input);
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stdout.is_empty());
    let err = text(&out.stderr);
    assert!(err.contains("cut off inside a string"), "{err}");
    assert!(err.contains(&format!("byte {}", input.len())), "{err}");
    assert!(err.contains("`convert`"), "{err}");
    let report: serde_json::Value = serde_json::from_str(err.lines().next().unwrap()).unwrap();
    assert_eq!(report["truncated"], true);
    assert_eq!(report["offset"], input.len());
    let out = run(&["--report", "--salvage"], input);
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(
        text(&out.stdout),
        "{\"from\":\"USD\",\"to_currency\":\"C\"}\n"
    );
    let report: serde_json::Value = serde_json::from_str(text(&out.stderr).trim()).unwrap();
    assert_eq!(report["salvaged"], true);
}

/// Issue 14: leading zeros refuse without a schema and follow it with one.
#[test]
fn leading_zeros_follow_the_schema() {
    let out = run(&[], "{zip: 0789}");
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("leading zeros"));
    let as_string = schema_file(
        "zip_string.json",
        r#"{"type": "object", "properties": {"zip": {"type": "string"}}}"#,
    );
    let out = run(&["--schema", as_string.to_str().unwrap()], "{zip: 0789}");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "{\"zip\":\"0789\"}\n");
    let as_int = schema_file(
        "zip_int.json",
        r#"{"type": "object", "properties": {"zip": {"type": "integer"}}}"#,
    );
    let out = run(&["--schema", as_int.to_str().unwrap()], "{zip: 0789}");
    assert_eq!(out.status.code(), Some(1));
}

/// A number where unclosed input ends may have been cut: refused unless `--complete` says
/// the model finished its answer.
#[test]
fn a_number_at_the_end_needs_complete() {
    let out = run(&[], "{\"days\": 3");
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("cut off inside a number"));
    let out = run(&["--complete"], "{\"days\": 3");
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(text(&out.stdout), "{\"days\":3}\n");
}

/// Issue 14: separate values are an array only with --multiple.
#[test]
fn multiple_values_need_the_flag() {
    let out = run(&[], "{\"a\":2}{}");
    assert_eq!(out.status.code(), Some(1));
    let out = run(&["--multiple"], "{\"a\":2}\n{}");
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(text(&out.stdout), "[{\"a\":2},{}]\n");
}

#[test]
fn schema_violations_exit_1_with_precise_reask_text() {
    let schema = schema_file(
        "enum.json",
        r#"{"type": "object", "properties": {"unit": {"enum": ["c", "f"]}}}"#,
    );
    let out = run(
        &[
            "--schema",
            schema.to_str().unwrap(),
            "--tool",
            "get_weather",
        ],
        "{\"unit\": \"celsius\"}",
    );
    assert_eq!(out.status.code(), Some(1));
    // The value checked, as it was written (it was valid JSON).
    assert_eq!(text(&out.stdout), "{\"unit\": \"celsius\"}\n");
    let err = text(&out.stderr);
    assert!(
        err.contains(r#"at /unit: expected one of ["c","f"], got "celsius""#),
        "{err}"
    );
    assert!(err.contains("get_weather"), "{err}");
}

#[test]
fn usage_errors_exit_2() {
    let out = run(&["--no-such-flag"], "{}");
    assert_eq!(out.status.code(), Some(2));
    let out = run(&["--schema", "/nonexistent/schema.json"], "{}");
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("cannot read schema"));
    let bad = schema_file("bad.json", r#"{"type": 5}"#);
    let out = run(&["--schema", bad.to_str().unwrap()], "{}");
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("unknown type \"5\""),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn non_utf8_input_is_refused() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_selfheal"))
        .arg("repair")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(&[b'[', 0xff, b']'])
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("UTF-8"));
}
