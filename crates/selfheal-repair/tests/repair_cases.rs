//! One test per repair category, positive and refusals.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use selfheal_repair::{RepairError, RepairKind, RepairOptions, repair, repair_with};
use serde_json::{Value, json};

/// Repairs `input`, checks the value and that `kind` was reported.
#[track_caller]
fn ok(input: &str, expected: Value, kind: RepairKind) {
    ok_with(&RepairOptions::default(), input, expected, kind);
}

/// As [`ok`], under `opts`.
#[track_caller]
fn ok_with(opts: &RepairOptions, input: &str, expected: Value, kind: RepairKind) {
    let r = repair_with(input, opts).unwrap_or_else(|e| panic!("{input:?} was refused: {e}"));
    assert_eq!(
        r.value, expected,
        "value for {input:?}; repairs {:?}",
        r.repairs
    );
    assert!(
        r.repairs.iter().any(|x| x.kind == kind),
        "{kind:?} not reported for {input:?}: {:?}",
        r.repairs
    );
}

#[track_caller]
fn refused(input: &str) -> RepairError {
    match repair(input) {
        Ok(r) => panic!(
            "{input:?} should be refused, got {} {:?}",
            r.value, r.repairs
        ),
        Err(e) => e,
    }
}

#[test]
fn valid_json_takes_the_fast_path_with_no_repairs() {
    let r = repair(r#" {"a": [1, 2.5, "x", null, true]} "#).unwrap();
    assert_eq!(r.value, json!({"a": [1, 2.5, "x", null, true]}));
    assert!(r.repairs.is_empty());
    assert!(!r.was_repaired());
}

#[test]
fn extracts_from_prose() {
    ok(
        "Sure, here is the result: {\"a\": 1}. Let me know!",
        json!({"a": 1}),
        RepairKind::ExtractedFromProse,
    );
    ok(
        "The list is [1, 2, 3] as requested.",
        json!([1, 2, 3]),
        RepairKind::TrailingGarbage,
    );
    // A placeholder in braces before the real JSON is skipped.
    ok(
        "Use {name} here: {\"name\": \"x\"}",
        json!({"name": "x"}),
        RepairKind::ExtractedFromProse,
    );
    ok(
        "1. First: {\"a\": 1}",
        json!({"a": 1}),
        RepairKind::ExtractedFromProse,
    );
}

#[test]
fn extracts_from_code_fences() {
    ok(
        "```json\n{\"a\": 1}\n```",
        json!({"a": 1}),
        RepairKind::CodeFence,
    );
    ok(
        "Here:\n```\n[1, 2]\n```\nDone.",
        json!([1, 2]),
        RepairKind::CodeFence,
    );
    // An unclosed fence around complete JSON (the closing fence was cut off).
    ok(
        "```json\n{\"a\": 1}",
        json!({"a": 1}),
        RepairKind::CodeFence,
    );
    // An unclosed fence around JSON cut off inside a number: refused.
    assert!(refused("```json\n{\"a\": \"x").is_truncation());
    // The first fence holds no JSON; the second does.
    ok(
        "```bash\nls -la\n```\n```json\n{\"a\": 2}\n```",
        json!({"a": 2}),
        RepairKind::CodeFence,
    );
}

#[test]
fn fences_and_tags_inside_json_strings_are_text() {
    ok(
        "{\"code\": \"```json\\n{\\\"x\\\": 1}\\n```\", \"tag\": \"<b>{y}</b>\",}",
        json!({"code": "```json\n{\"x\": 1}\n```", "tag": "<b>{y}</b>"}),
        RepairKind::TrailingComma,
    );
}

#[test]
fn extracts_from_tag_wrappers() {
    ok(
        "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": 1}}\n</tool_call>",
        json!({"name": "f", "arguments": {"x": 1}}),
        RepairKind::TagWrapper,
    );
    ok(
        "I'll call it. <function_call name=\"f\">[1,2]</function_call> ok",
        json!([1, 2]),
        RepairKind::TagWrapper,
    );
    ok(
        "<json>{\"a\": 1,}</json>",
        json!({"a": 1}),
        RepairKind::TrailingComma,
    );
}

#[test]
fn repairs_quotes() {
    ok("{'a': 'b'}", json!({"a": "b"}), RepairKind::SingleQuotes);
    ok(
        "{'a': 'it's fine'}",
        json!({"a": "it's fine"}),
        RepairKind::SingleQuotes,
    );
    ok(
        "{“a”: “b”}",
        json!({"a": "b"}),
        RepairKind::TypographicQuotes,
    );
    ok(
        "{‘a’: ‘it’s’}",
        json!({"a": "it’s"}),
        RepairKind::TypographicQuotes,
    );
    ok("{\"a': 1}", json!({"a": 1}), RepairKind::MismatchedQuote);
    // A value closed by a quote of another kind could as well be cut off with a quote in
    // its text: refused.
    refused("{\"a\": 'b\"}");
    ok(
        "{\"a\": \"b, \"c\": 1}",
        json!({"a": "b", "c": 1}),
        RepairKind::MissingQuote,
    );
    ok(
        "{\"a: 1, \"b\": 2}",
        json!({"a": 1, "b": 2}),
        RepairKind::MissingQuote,
    );
    // A string open up to the closing brace may be a cut string holding `}`: refused.
    assert!(refused("{\"a\": \"hello}").is_truncation());
    ok(
        "{\"a\": \"say \"hi\" now\"}",
        json!({"a": "say \"hi\" now"}),
        RepairKind::UnescapedQuote,
    );
    // Apostrophes inside double-quoted strings are text.
    ok(
        "{\"a\": \"don't, 'quote' me\",}",
        json!({"a": "don't, 'quote' me"}),
        RepairKind::TrailingComma,
    );
}

#[test]
fn repairs_unquoted_keys_and_values() {
    ok(
        "{a: 1, b_2: true}",
        json!({"a": 1, "b_2": true}),
        RepairKind::UnquotedKey,
    );
    ok(
        "{first-name: \"x\"}",
        json!({"first-name": "x"}),
        RepairKind::UnquotedKey,
    );
    ok(
        "{first name: \"x\", n: 1}",
        json!({"first name": "x", "n": 1}),
        RepairKind::UnquotedKey,
    );
    // Words without a colon are prose, not a key.
    assert!(repair("{this is prose}").is_err());
    ok(
        "{\"unit\": celsius}",
        json!({"unit": "celsius"}),
        RepairKind::UnquotedString,
    );
    ok(
        "{\"url\": http://x.io/a?b=1, \"n\": 1}",
        json!({"url": "http://x.io/a?b=1", "n": 1}),
        RepairKind::UnquotedString,
    );
}

#[test]
fn reads_bare_words_in_arrays_only_when_the_input_is_the_json() {
    ok(
        "[a, b c, \"d\"]",
        json!(["a", "b c", "d"]),
        RepairKind::UnquotedString,
    );
    // In prose, a bracketed phrase is not JSON; the real JSON after it is found.
    ok(
        "See [the docs] or use {\"a\": 1}",
        json!({"a": 1}),
        RepairKind::ExtractedFromProse,
    );
    assert!(repair("Say [hello] to them.").is_err());
}

#[test]
fn repairs_commas_and_colons() {
    ok("[1, 2,]", json!([1, 2]), RepairKind::TrailingComma);
    ok("{\"a\": 1,}", json!({"a": 1}), RepairKind::TrailingComma);
    ok("[1,,2]", json!([1, 2]), RepairKind::ExtraComma);
    ok("[,1]", json!([1]), RepairKind::ExtraComma);
    ok("[1 2 3]", json!([1, 2, 3]), RepairKind::MissingComma);
    ok(
        "{\"a\": 1 \"b\": 2}",
        json!({"a": 1, "b": 2}),
        RepairKind::MissingComma,
    );
    ok(
        "[{\"a\":1}{\"a\":2}]",
        json!([{"a": 1}, {"a": 2}]),
        RepairKind::MissingComma,
    );
    ok(
        "{\"a\": \"x\"\n \"b\": \"y\"}",
        json!({"a": "x", "b": "y"}),
        RepairKind::MissingComma,
    );
    ok("{\"a\" 1}", json!({"a": 1}), RepairKind::MissingColon);
    ok("{\"a\" \"b\"}", json!({"a": "b"}), RepairKind::MissingColon);
}

#[test]
fn removes_comments() {
    ok(
        "{\n // the name\n \"a\": 1, /* block */ \"b\": 2 # hash\n}",
        json!({"a": 1, "b": 2}),
        RepairKind::Comment,
    );
    ok("[1, 2] // done", json!([1, 2]), RepairKind::Comment);
    // `//` inside a string is text.
    ok(
        "{'u': 'http://x'}",
        json!({"u": "http://x"}),
        RepairKind::SingleQuotes,
    );
}

#[test]
fn removes_non_ascii_spaces_between_tokens() {
    ok(
        "{\u{a0}\"a\":\u{2003}1,\u{3000}\"b\": \"x\u{a0}y\"}",
        json!({"a": 1, "b": "x\u{a0}y"}),
        RepairKind::SpecialWhitespace,
    );
}

#[test]
fn converts_python_and_js_literals() {
    ok(
        "[True, False, None]",
        json!([true, false, null]),
        RepairKind::PythonLiteral,
    );
    ok(
        "{\"a\": undefined}",
        json!({"a": null}),
        RepairKind::JsLiteral,
    );
    ok(
        "[NaN, Infinity, -Infinity]",
        json!([null, null, null]),
        RepairKind::JsLiteral,
    );
    ok("[TRUE, Null]", json!([true, null]), RepairKind::LiteralCase);
    ok("True", json!(true), RepairKind::PythonLiteral);
}

/// Issue 14: a cut that lost data is refused, with where the input stopped.
#[test]
fn refuses_truncation_that_lost_data() {
    use selfheal_repair::Cut;
    let cases: &[(&str, Cut)] = &[
        ("{\"a\": [1, {\"b\": \"hel", Cut::String),
        ("{\"to_currency\": \"C", Cut::String),
        ("\"abc", Cut::String),
        ("{\"a\": \"x\\", Cut::Escape),
        ("{\"a\": \"\\u00", Cut::Escape),
        ("{\"a\": 1.", Cut::Number),
        ("{\"year\": 20", Cut::Number),
        // A final line break proves nothing: `echo` adds one to a cut answer.
        ("{\"year\": 20\n", Cut::Number),
        ("[1, 2", Cut::Number),
        ("{\"a\": 1e", Cut::Number),
        ("{\"a\": -", Cut::Number),
        ("{\"a\": 1, \"b\": tr", Cut::Literal),
        ("[1, 2, fal", Cut::Literal),
        ("{\"unit\": celsi", Cut::Literal),
        ("{\"a\": 1, \"b", Cut::Key),
        ("{\"a\": 1,", Cut::Element),
        ("[1, 2,", Cut::Element),
        ("{\"a\": 1, \"b\": [", Cut::Element),
        ("{", Cut::Element),
        ("{\"a\": \"x\" + ", Cut::String),
    ];
    for (input, cut) in cases {
        match repair(input) {
            Err(RepairError::Truncated { offset, cut: got }) => {
                assert_eq!(got, *cut, "{input:?}");
                assert_eq!(offset, input.len(), "{input:?}: where the input stopped");
            }
            other => panic!("{input:?}: expected a truncation refusal, got {other:?}"),
        }
    }
    // A key without a value at the end.
    for (input, key) in [("{\"a\": 1, \"b\":", "b"), ("{\"a\": 1, \"b\"", "b")] {
        match repair(input) {
            Err(RepairError::MissingValue { key: Some(k), .. }) => assert_eq!(k, key),
            other => panic!("{input:?}: expected MissingValue, got {other:?}"),
        }
    }
}

#[test]
fn closes_brackets_left_off_after_a_complete_value() {
    ok(
        "{\"a\": [1, {\"b\": \"hello\"",
        json!({"a": [1, {"b": "hello"}]}),
        RepairKind::ClosedTruncated,
    );
    ok("[1, true", json!([1, true]), RepairKind::ClosedTruncated);
    // A number that ends where the input ends is complete only when the caller knows the
    // model finished its answer (`finish_reason: "stop"`).
    ok_with(
        &RepairOptions::default().with_input_complete(true),
        "{\"days\": 12",
        json!({"days": 12}),
        RepairKind::ClosedTruncated,
    );
    // A space or tab after the digits says the number was finished where it was written.
    ok(
        "{\"days\": 12 ",
        json!({"days": 12}),
        RepairKind::ClosedTruncated,
    );
    ok(
        "{\n  \"year\": 2018\n  ",
        json!({"year": 2018}),
        RepairKind::ClosedTruncated,
    );
    ok("[1, 2_000\t", json!([1, 2000]), RepairKind::ClosedTruncated);
    ok(
        "{\"a\": {\"b\": null}",
        json!({"a": {"b": null}}),
        RepairKind::ClosedTruncated,
    );
    ok(
        "[\"x\", [2]",
        json!(["x", [2]]),
        RepairKind::ClosedTruncated,
    );
}

#[test]
fn truncation_reask_says_where_the_answer_stopped() {
    let input = "{\"from\": \"USD\", \"to_currency\": \"C";
    let e = refused(input);
    let msg = e.reask_message(input, "convert");
    assert!(msg.contains("`convert`"), "{msg}");
    assert!(msg.contains("cut off inside a string"), "{msg}");
    assert!(msg.contains(&format!("byte {}", input.len())), "{msg}");
    assert!(msg.contains("\"to_currency\": \"C`"), "{msg}");
}

#[test]
fn salvage_closes_and_drops_and_says_so() {
    let opts = RepairOptions::salvage();
    ok_with(
        &opts,
        "{\"a\": [1, {\"b\": \"hel",
        json!({"a": [1, {"b": "hel"}]}),
        RepairKind::ClosedTruncated,
    );
    ok_with(&opts, "[1, 2", json!([1, 2]), RepairKind::ClosedTruncated);
    ok_with(
        &opts,
        "{\"a\": 1, \"b\":",
        json!({"a": 1}),
        RepairKind::DroppedIncomplete,
    );
    ok_with(
        &opts,
        "{\"a\": 1, \"b\": tr",
        json!({"a": 1}),
        RepairKind::DroppedIncomplete,
    );
    ok_with(
        &opts,
        "[1, 2, fal",
        json!([1, 2]),
        RepairKind::DroppedIncomplete,
    );
    ok_with(&opts, "{\"a\": -", json!({}), RepairKind::DroppedIncomplete);
    ok_with(&opts, "[007]", json!([7]), RepairKind::NumberFormat);
}

#[test]
fn escapes_control_characters_and_fixes_escapes() {
    ok(
        "{\"a\": \"line\ntwo\"}",
        json!({"a": "line\ntwo"}),
        RepairKind::EscapedControlChar,
    );
    ok(
        "{\"a\": \"tab\there\"}",
        json!({"a": "tab\there"}),
        RepairKind::EscapedControlChar,
    );
    ok(
        r#"{"p": "C:\Users\x"}"#,
        json!({"p": "C:\\Users\\x"}),
        RepairKind::InvalidEscape,
    );
    ok(
        r#"{"a": "it\'s"}"#,
        json!({"a": "it's"}),
        RepairKind::InvalidEscape,
    );
    // A `\u` escape that names no character: which one was meant is unknown.
    for input in [r#"{"a": "\ud800x"}"#, r#"{"a": "\uZZZZ"}"#, r#""\u12""#] {
        assert!(
            matches!(refused(input), RepairError::Unrepairable { .. }),
            "{input:?}"
        );
    }
    // Valid escapes, including surrogate pairs, survive the lenient path.
    ok(
        r#"{"a": "\ud83d\ude00 \n \" \\ \/",}"#,
        json!({"a": "😀 \n \" \\ /"}),
        RepairKind::TrailingComma,
    );
}

#[test]
fn decodes_double_encoded_json_only_when_asked() {
    let decode = RepairOptions::default().with_decode_strings(true);
    ok_with(
        &decode,
        r#""{\"a\": 1}""#,
        json!({"a": 1}),
        RepairKind::DoubleEncoded,
    );
    ok_with(
        &decode,
        r#""[1, 2,]""#,
        json!([1, 2]),
        RepairKind::DoubleEncoded,
    );
    // By default a valid JSON string is a string, whatever it holds.
    let r = repair(r#""[1,2,3,]""#).unwrap();
    assert_eq!(r.value, json!("[1,2,3,]"));
    assert!(r.repairs.is_empty());
    // A plain string stays a string.
    let r = repair(r#""hello {world}""#).unwrap();
    assert_eq!(r.value, json!("hello {world}"));
    assert!(r.repairs.is_empty());
}

/// The offset reported for `kind`, which must be reported once (decoding strings).
#[track_caller]
fn offset_of(input: &str, kind: RepairKind) -> usize {
    let opts = RepairOptions::default().with_decode_strings(true);
    let r = repair_with(input, &opts).unwrap_or_else(|e| panic!("{input:?} was refused: {e}"));
    let found: Vec<usize> = r
        .repairs
        .iter()
        .filter(|x| x.kind == kind)
        .map(|x| x.offset)
        .collect();
    assert_eq!(found.len(), 1, "{kind:?} in {input:?}: {:?}", r.repairs);
    found[0]
}

#[test]
fn double_encoded_repairs_point_into_the_input() {
    // No escape before the repair: the offset is the inner one plus the opening quote.
    let input = r#""[1, 2,]""#;
    assert_eq!(offset_of(input, RepairKind::TrailingComma), 6);
    assert_eq!(offset_of(input, RepairKind::DoubleEncoded), 0);
    // Escaped quotes before the repair shift it by one byte each.
    let input = r#""{\"a\": 1,}""#;
    assert_eq!(offset_of(input, RepairKind::TrailingComma), 10);
    assert_eq!(&input[10..11], ",");
    // Leading whitespace outside and inside the string, an escaped quote inside an inner
    // string, a `\u` escape and an escaped newline: every one is stepped over.
    let input = r#"  " {\"a\": \"x\\\"y\u00e9\",\n\"b\": 2,}""#;
    let r = repair_with(input, &RepairOptions::default().with_decode_strings(true)).unwrap();
    assert_eq!(r.value, json!({"a": "x\"yé", "b": 2}));
    let comma = offset_of(input, RepairKind::TrailingComma);
    assert_eq!(&input[comma..], ",}\"");
    assert_eq!(offset_of(input, RepairKind::DoubleEncoded), 2);
    // The lenient path: a single-quoted outer string inside a code fence.
    let input = "```json\n'{\"a\": 1 \"b\": [1,]}'\n```";
    let r = repair_with(input, &RepairOptions::default().with_decode_strings(true)).unwrap();
    assert_eq!(r.value, json!({"a": 1, "b": [1]}));
    let missing_comma = offset_of(input, RepairKind::MissingComma);
    assert_eq!(&input[missing_comma..][..4], "\"b\":");
    assert_eq!(
        &input[offset_of(input, RepairKind::TrailingComma)..][..2],
        ",]"
    );
    assert_eq!(offset_of(input, RepairKind::DoubleEncoded), 8);
    // An inner string left open before the closing brace is refused (it may have been cut
    // off inside a string holding `}`), so the document stays a string.
    let input = r#""{\"a\": \"b}""#;
    let r = repair_with(input, &RepairOptions::default().with_decode_strings(true)).unwrap();
    assert_eq!(r.value, json!("{\"a\": \"b}"));
    // Joined literals: past the first one, the repair falls back to the string's start.
    let input = r#""{\"a\": 1," + "\"b\": 2,}""#;
    assert_eq!(offset_of(input, RepairKind::TrailingComma), 0);
}

#[test]
fn repairs_backtick_quoted_strings() {
    ok(r"{`key`: 1}", json!({"key": 1}), RepairKind::BacktickQuotes);
    assert_eq!(
        offset_of(r#"{"a": `hello`}"#, RepairKind::BacktickQuotes),
        6
    );
    assert_eq!(offset_of(r"{`key`: 1}", RepairKind::BacktickQuotes), 1);
    // Double quotes inside are text, escaped in the output.
    let r = repair(r#"{"cmd": `echo "hi" > out.txt`}"#).unwrap();
    assert_eq!(
        serde_json::to_string(&r.value).unwrap(),
        r#"{"cmd":"echo \"hi\" > out.txt"}"#
    );
    // Template-literal escapes; a raw newline is text; `${}` is not interpolated.
    ok(
        "{\"a\": `x \\` \\$ \\n ${y}\nz`}",
        json!({"a": "x ` $ \n ${y}\nz"}),
        RepairKind::BacktickQuotes,
    );
    // In arrays, and joined with other strings.
    ok(
        r#"{"k": [`a`, `b`], "c": "x" + `y`}"#,
        json!({"k": ["a", "b"], "c": "xy"}),
        RepairKind::BacktickQuotes,
    );
    ok("[`a`, `b`]", json!(["a", "b"]), RepairKind::BacktickQuotes);
    assert_eq!(
        serde_json::to_string(&repair("{`a`: 1}").unwrap().repairs).unwrap(),
        r#"[{"kind":"backtick_quotes","offset":1}]"#
    );
}

#[test]
fn backticks_inside_strings_and_around_json_are_left_alone() {
    // Inside double-quoted strings, on the fast path and on the lenient one.
    let r = repair(r#"{"a": "run `ls` now"}"#).unwrap();
    assert_eq!(r.value, json!({"a": "run `ls` now"}));
    assert!(r.repairs.is_empty());
    let r = repair(r#"{"a": "run `ls` now", "b": "`",}"#).unwrap();
    assert_eq!(r.value, json!({"a": "run `ls` now", "b": "`"}));
    assert_eq!(
        r.repairs.iter().map(|x| x.kind).collect::<Vec<_>>(),
        vec![RepairKind::TrailingComma]
    );
    // Markdown inline code around the JSON.
    let r = repair(r#"Call it with `{"a": 1}` please."#).unwrap();
    assert_eq!(r.value, json!({"a": 1}));
    assert!(
        !r.repairs
            .iter()
            .any(|x| x.kind == RepairKind::BacktickQuotes)
    );
    ok(
        r#"`{"a": 1}`"#,
        json!({"a": 1}),
        RepairKind::TrailingGarbage,
    );
    // An inline-code phrase in prose is not an array.
    assert_eq!(refused("see [`a`] here").offset(), Some(5));
    // A backtick that never closes is not a truncated string: it would read prose as a value.
    refused(r#"Use `{"a": [1, 2` ok"#);
    refused(r#"{"a": 1, "b": `"#);
    refused(r#"{"a": `hel"#);
}

#[test]
fn joins_string_concatenation() {
    ok(
        "{\"a\": \"x\" + \"y\" + 'z'}",
        json!({"a": "xyz"}),
        RepairKind::StringConcatenation,
    );
    ok(
        "[\"a\" +\n \"b\"]",
        json!(["ab"]),
        RepairKind::StringConcatenation,
    );
}

#[test]
fn removes_ellipses() {
    ok("[1, 2, ...]", json!([1, 2]), RepairKind::Ellipsis);
    ok("[1, ..., 5]", json!([1, 5]), RepairKind::Ellipsis);
    ok("{\"a\": 1, ...}", json!({"a": 1}), RepairKind::Ellipsis);
    ok("[1, …]", json!([1]), RepairKind::Ellipsis);
}

#[test]
fn handles_redundant_and_mismatched_brackets() {
    ok("{\"a\": 1}}", json!({"a": 1}), RepairKind::RedundantClosing);
    ok("[1, 2]]]", json!([1, 2]), RepairKind::RedundantClosing);
    ok(
        "{\"a\": [1, 2]], \"b\": 3}",
        json!({"a": [1, 2], "b": 3}),
        RepairKind::RedundantClosing,
    );
    ok(
        "{\"a\": [1, 2}",
        json!({"a": [1, 2]}),
        RepairKind::MismatchedBracket,
    );
    ok("[1, 2}", json!([1, 2]), RepairKind::MismatchedBracket);
}

#[test]
fn strips_leading_and_trailing_garbage() {
    ok(
        ">>> {\"a\": 1}",
        json!({"a": 1}),
        RepairKind::LeadingGarbage,
    );
    ok(
        "{\"a\": 1} <<< end",
        json!({"a": 1}),
        RepairKind::TrailingGarbage,
    );
    ok(
        "\u{FEFF}{\"a\": 1}",
        json!({"a": 1}),
        RepairKind::LeadingGarbage,
    );
}

#[test]
fn unwraps_jsonp_and_mongo_wrappers() {
    ok("callback({\"a\": 1});", json!({"a": 1}), RepairKind::Jsonp);
    ok("window.cb([1, 2])", json!([1, 2]), RepairKind::Jsonp);
    ok(
        "{\"_id\": ObjectId(\"5f1\"), \"n\": NumberLong(2), \"l\": NumberLong(\"3\"), \"d\": ISODate(\"2024-01-01T00:00:00Z\")}",
        json!({"_id": "5f1", "n": 2, "l": "3", "d": "2024-01-01T00:00:00Z"}),
        RepairKind::MongoWrapper,
    );
}

#[test]
fn collects_newline_delimited_values_only_when_asked() {
    let multiple = RepairOptions::default().with_multiple(true);
    ok_with(
        &multiple,
        "{\"a\": 1}\n{\"a\": 2}\n{\"a\": 3}\n",
        json!([{"a": 1}, {"a": 2}, {"a": 3}]),
        RepairKind::NdjsonToArray,
    );
    ok_with(
        &multiple,
        "{\"a\": 1}, {\"a\": 2}",
        json!([{"a": 1}, {"a": 2}]),
        RepairKind::NdjsonToArray,
    );
    ok_with(
        &multiple,
        "[1]\n[2]",
        json!([[1], [2]]),
        RepairKind::NdjsonToArray,
    );
    // Issue 14: by default separate values are never wrapped into an array.
    for (input, at) in [
        ("{\"a\":2}{}", 7),
        ("{\"key\": \"value\"}, {}", 16),
        ("[1]\n[2]", 4),
    ] {
        assert_eq!(
            refused(input),
            RepairError::MultipleValues { offset: at },
            "{input:?}"
        );
    }
}

/// Issue 14: where two readings give different values, refuse.
#[test]
fn refuses_where_the_reading_is_a_guess() {
    for input in [
        // A raw line break right before the closing quote.
        "{\"a\": \"x\n\", \"b\": \"y\"}",
        "{\"key_1\n\": \"value\"}",
        // A line comment that would take the rest of the value with it.
        "{ \"key\": { \"key2\": \"value2\" # comment }, \"key3\": \"value3\" }",
        // An exponent with no digits.
        "{\"key\": 1e }",
        // Brackets inside a bare value that do not pair up.
        "{\"a\": b(c]}",
        "{\"a\": x) y}",
        "{text: words{in brackets]}",
        // The opening brace is missing and the rest is not a clean object.
        "\"a\": 1,}",
    ] {
        refused(input);
    }
}

/// An object closed one brace early whose members go on to the real closing brace is one
/// object; a key written twice, or a tail that is not members, is refused.
#[test]
fn reads_an_object_closed_one_brace_early() {
    ok(
        "{\"key\": \"value\"}, \"key2\": \"value2\"}",
        json!({"key": "value", "key2": "value2"}),
        RepairKind::RedundantClosing,
    );
    ok(
        "{\"k1\": [\"v1\", \"v2\"}, \"k2\": [\"v3\"]}",
        json!({"k1": ["v1", "v2"], "k2": ["v3"]}),
        RepairKind::RedundantClosing,
    );
    for input in [
        "{\"a\": 1}, \"a\": 2}",
        "{\"key\": \"value\"}, \"key2\": }",
        "{\"key\": \"value\"}, \"key2\": \"v",
    ] {
        refused(input);
    }
}

/// Review findings: inputs that once came back with a value they do not hold.
#[test]
fn review_findings_are_refused_or_read_right() {
    // A bracket in the prose does not beat the fenced or tagged JSON.
    ok(
        "Step [1]: here is the call\n```json\n{\"a\": 1}\n```",
        json!({"a": 1}),
        RepairKind::CodeFence,
    );
    ok(
        "Use x[0] then <tool_call>{\"a\": 1}</tool_call>",
        json!({"a": 1}),
        RepairKind::TagWrapper,
    );
    for input in [
        // Nothing from inside a failed value is returned.
        "{\"a\": }, \"c\": {\"d\": 1}}",
        "{'a': '}', 'b': @, 'c': {\"d\": 1}}",
        "{\"a\": \"x\" /* } */, \"b\": @, \"c\": {\"d\": 1}}",
        "[{\"a\": \"b\" \"c\" ]}, {\"d\": 1}]",
        "I tried {\"a\": } and then {\"a\": 2}",
        // Two values in prose, or in two tags, or three fences.
        "Example: {\"city\": \"Paris\"}. Actually use {\"city\": \"Rome\"}",
        "<tool_call>{\"a\":1}</tool_call><tool_call>{\"a\":2}</tool_call>",
        "```json\n{\"a\":1}\n```\n```json\n{\"a\":2}\n```\n```json\n{\"a\":3}\n```",
        // Comments that swallow members.
        "{\"a\": 1 /* note, \"b\": 2}",
        "{\"a\": 1 # note }, \"b\": 2}\n",
        "{\"a\": 1, \"b\": 2 // c, \"d\": 4}\n",
        // Cuts hidden behind a separator or a trailing newline.
        "{\"n\": 1_000",
        "{\"a\": nul\n",
        "{\"a\": \"x\", \"b\": tr\n",
        "{\"year\": 20\n",
        // Short upper-case words are data, not markers.
        "{USD \"amount\": 5}",
        "{\"a\": 1, AB }",
        // A parenthesis closed by another bracket.
        "{\"a\": (1]}",
        "{\"a\": [1)}",
    ] {
        refused(input);
    }
    // Three fences with --multiple are all kept.
    let r = repair_with(
        "```json\n{\"a\":1}\n```\n```json\n{\"a\":2}\n```\n```json\n{\"a\":3}\n```",
        &RepairOptions::default().with_multiple(true),
    )
    .unwrap();
    assert_eq!(r.value, json!([{"a": 1}, {"a": 2}, {"a": 3}]));
    // A note in parentheses after the JSON is prose.
    ok(
        "{\"a\": 1} (see above).",
        json!({"a": 1}),
        RepairKind::TrailingGarbage,
    );
}

/// Review finding: 20,000 fences once overflowed the stack.
#[test]
fn many_fences_do_not_overflow() {
    let input = "```json\n{}\n```\n".repeat(20_000);
    assert!(matches!(
        repair(&input),
        Err(RepairError::MultipleValues { .. })
    ));
}

/// Issue 14: the extractor never returns a later fragment of a value that failed.
#[test]
fn never_returns_a_fragment_of_a_failed_value() {
    for input in [
        "{ \"key\": [[1,2,3],\"a\",\"b\"], [[4,5,6],[7,8,9]] }",
        "{\"a\": [1, @], \"b\": {\"c\": 1}}",
        "Result: {\"a\": @, \"b\": [1, 2]}",
    ] {
        let e = refused(input);
        assert!(!matches!(e, RepairError::NoJson), "{input:?}: {e:?}");
    }
    // A failed bracketed phrase that closes before the JSON is prose, and is skipped.
    ok(
        "Use {name} here: {\"name\": \"x\"}",
        json!({"name": "x"}),
        RepairKind::ExtractedFromProse,
    );
}

#[test]
fn normalises_numbers_without_losing_digits() {
    ok(
        "[1., .5, +3, -0.50,]",
        json!([1.0, 0.5, 3, -0.5]),
        RepairKind::NumberFormat,
    );
    // Issue 14: leading zeros are refused (a zip code or an id is not a number)...
    for (input, text) in [
        ("{\"n\": 05}", "05"),
        ("[0789]", "0789"),
        ("{\"a\": 00}", "00"),
    ] {
        match repair(input) {
            Err(RepairError::LeadingZeros { text: t, .. }) => assert_eq!(t, text),
            other => panic!("{input:?}: {other:?}"),
        }
    }
    // ... or kept as the string they spell when the caller lets a schema decide.
    ok_with(
        &RepairOptions::default().with_leading_zero_strings(true),
        "{\"zip\": 0789,}",
        json!({"zip": "0789"}),
        RepairKind::LeadingZeroString,
    );
    ok(
        "[1e5, 2E-2, 3,]",
        json!([100000.0, 0.02, 3]),
        RepairKind::TrailingComma,
    );
}

#[test]
fn refuses_what_would_need_invented_data() {
    for input in [
        "{\"a\": }",
        "{\"a\": , \"b\": 1}",
        "{\"a\": ...}",
        "{\"a\" }",
        "{\"a\": @}",
        "[1, @]",
        "{\"a\": \"x\" + 1}",
        "Date(2024, 1, 2)",
        "f()",
        "[1e999]",
    ] {
        let e = refused(input);
        assert!(
            matches!(
                e,
                RepairError::Unrepairable { .. } | RepairError::MissingValue { .. }
            ),
            "{input:?}: {e:?}"
        );
        assert!(e.offset().is_some(), "{input:?} has no offset");
    }
}

#[test]
fn refuses_prose_without_json() {
    for input in ["Hello world", "I cannot help with that.", "1. First step"] {
        assert_eq!(refused(input), RepairError::NoJson, "{input:?}");
    }
    // A quoted phrase followed by prose is refused too (it reads as a cut-off string).
    refused("\"Hi,\" he said.");
    assert_eq!(refused("   \n "), RepairError::EmptyInput);
    assert_eq!(refused(""), RepairError::EmptyInput);
}

#[test]
fn refusal_names_the_key_and_offset() {
    let e = refused("{\"unit\": }");
    assert_eq!(
        e,
        RepairError::MissingValue {
            offset: 9,
            key: Some("unit".into())
        }
    );
    assert_eq!(e.to_string(), "missing value for key \"unit\" at byte 9");
}

#[test]
fn repairs_report_offsets_in_input_order() {
    let r = repair("{'a': 1, b: 2,}").unwrap();
    let kinds: Vec<_> = r.repairs.iter().map(|r| (r.kind, r.offset)).collect();
    assert_eq!(
        kinds,
        vec![
            (RepairKind::SingleQuotes, 1),
            (RepairKind::UnquotedKey, 9),
            (RepairKind::TrailingComma, 13)
        ]
    );
}

#[test]
fn repairs_serialise_in_snake_case() {
    let r = repair("[1,]").unwrap();
    assert_eq!(
        serde_json::to_string(&r.repairs).unwrap(),
        r#"[{"kind":"trailing_comma","offset":2}]"#
    );
}

fn nested(depth: usize) -> String {
    let mut s = "[".repeat(depth);
    s.push_str(&"]".repeat(depth));
    s
}

#[test]
fn deep_nesting_is_refused_without_overflow() {
    // Run on a small stack to prove nothing recurses on input depth.
    let handle = std::thread::Builder::new()
        .stack_size(256 * 1024)
        .spawn(|| {
            let e = repair(&nested(100_000)).unwrap_err();
            assert_eq!(
                e,
                RepairError::TooDeep {
                    limit: 1_000,
                    offset: 1_000
                }
            );
            let e = repair(&"{\"a\":".repeat(100_000)).unwrap_err();
            assert!(matches!(e, RepairError::TooDeep { .. }));
            let e = repair(&"[".repeat(100_000)).unwrap_err();
            assert!(matches!(e, RepairError::TooDeep { .. }));
        })
        .unwrap();
    handle.join().unwrap();
}

#[test]
fn values_at_the_depth_limit_drop_serialise_and_validate_on_a_small_stack() {
    let handle = std::thread::Builder::new()
        .stack_size(2 * 1024 * 1024)
        .spawn(|| {
            let input = nested(1_000);
            let r = repair(&input).unwrap();
            assert!(r.repairs.is_empty());
            assert_eq!(serde_json::to_string(&r.value).unwrap(), input);
            let guide = selfheal_repair::SchemaGuide::new(&json!({"type": "array"})).unwrap();
            assert!(guide.apply(r.value.clone()).is_valid());
            drop(r);
        })
        .unwrap();
    handle.join().unwrap();
}

#[test]
fn depth_limit_is_configurable() {
    let opts = RepairOptions::default().with_max_depth(3);
    assert!(repair_with("[[[1]]]", &opts).is_ok());
    assert_eq!(
        repair_with("[[[[1]]]]", &opts).unwrap_err(),
        RepairError::TooDeep {
            limit: 3,
            offset: 3
        }
    );
    let opts = RepairOptions::default().with_max_depth(5_000);
    assert!(repair_with(&nested(4_000), &opts).is_ok());
}

#[test]
fn reads_escaped_json_whose_outer_quotes_were_lost() {
    ok(
        r#"{\"stringified\": \"content\"}"#,
        json!({"stringified": "content"}),
        RepairKind::DoubleEncoded,
    );
    ok(
        r#"[\"a\", \"b\"]"#,
        json!(["a", "b"]),
        RepairKind::DoubleEncoded,
    );
}

#[test]
fn keeps_number_like_text_as_strings() {
    ok(
        "{\"v\": 0.0.1, \"d\": 2024-01-01, \"h\": 0x1F}",
        json!({"v": "0.0.1", "d": "2024-01-01", "h": "0x1F"}),
        RepairKind::UnquotedString,
    );
    // At the top level such text is prose.
    assert_eq!(refused("1.5x faster"), RepairError::NoJson);
}

#[test]
fn keeps_unescaped_quotes_before_a_closing_quote() {
    ok(
        "{\"k\": \"apple \"bitter\" \", \"b\": 1}",
        json!({"k": "apple \"bitter\" ", "b": 1}),
        RepairKind::UnescapedQuote,
    );
    // One unpaired quote in a root string that ends the input: no reading but text fits.
    ok(
        "\"The TV has a 24\" screen\"",
        json!("The TV has a 24\" screen"),
        RepairKind::UnescapedQuote,
    );
    // One unpaired quote before a closing brace could be text, a missing closing quote or a
    // missing opening one; in an array, `"a" b"` may be two strings.
    for input in [
        "{\"key\": \"v\"alue\"}",
        "[\"value1\" value2\", \"value3\"]",
        "{\"key\": \"\"value\"}",
    ] {
        refused(input);
    }
}

#[test]
fn collects_comma_separated_top_level_values_only_when_asked() {
    let multiple = RepairOptions::default().with_multiple(true);
    ok_with(
        &multiple,
        "1, 2, 3",
        json!([1, 2, 3]),
        RepairKind::NdjsonToArray,
    );
    ok_with(
        &multiple,
        "\"a\"\n\"b\"",
        json!(["a", "b"]),
        RepairKind::NdjsonToArray,
    );
    assert!(matches!(
        refused("1, 2, 3"),
        RepairError::MultipleValues { .. }
    ));
    // Prose after a scalar is still refused.
    assert_eq!(refused("1, 2 and 3"), RepairError::NoJson);
}

/// Every row of the table in the crate docs, input → compact output.
#[test]
fn documented_examples_hold() {
    let rows: &[(&str, &str)] = &[
        (r#"The answer is {"a": 1}. Done."#, r#"{"a":1}"#),
        (r#">>> {"a": 1} <<<"#, r#"{"a":1}"#),
        ("```json {\"a\": 1} ```", r#"{"a":1}"#),
        (r#"<tool_call>{"a": 1}</tool_call>"#, r#"{"a":1}"#),
        (r#"callback({"a": 1});"#, r#"{"a":1}"#),
        (
            r#"{"n": NumberLong(2), "d": ISODate("2024-01-01")}"#,
            r#"{"d":"2024-01-01","n":2}"#,
        ),
        ("[1, 2,]", "[1,2]"),
        ("[1,,2]", "[1,2]"),
        (r#"{"a": 1 "b": 2}"#, r#"{"a":1,"b":2}"#),
        (r#"{"a" 1}"#, r#"{"a":1}"#),
        ("{'a': 'b'}", r#"{"a":"b"}"#),
        ("{“a”: “b”}", r#"{"a":"b"}"#),
        (r#"{`a`: `say "b"`}"#, r#"{"a":"say \"b\""}"#),
        (r#"{"a': 1}"#, r#"{"a":1}"#),
        (r#"{"a": "b, "c": 1}"#, r#"{"a":"b","c":1}"#),
        (r#"{"a": "say "hi" now"}"#, r#"{"a":"say \"hi\" now"}"#),
        (r#"{"a": "<b id="x">"}"#, r#"{"a":"<b id=\"x\">"}"#),
        (r#"{"a": "v"alue", "b": 1}"#, r#"{"a":"v\"alue","b":1}"#),
        (r#"{name": "Ann"}"#, r#"{"name":"Ann"}"#),
        ("{a: 1}", r#"{"a":1}"#),
        (r#"{"unit": celsius}"#, r#"{"unit":"celsius"}"#),
        (r#"{"a": 1 /* c */} // c"#, r#"{"a":1}"#),
        ("{\"a\":\u{a0}1}", r#"{"a":1}"#),
        ("[True, False, None]", "[true,false,null]"),
        ("[undefined, NaN, -Infinity]", "[null,null,null]"),
        ("[TRUE, Null]", "[true,null]"),
        (r#"{"a": [1, {"b": "hello""#, r#"{"a":[1,{"b":"hello"}]}"#),
        ("{\"a\": \"line\ntwo\"}", r#"{"a":"line\ntwo"}"#),
        (r#"{"p": "C:\Users"}"#, r#"{"p":"C:\\Users"}"#),
        (r#"{"a": "x" + "y"}"#, r#"{"a":"xy"}"#),
        ("[1, 2, ...]", "[1,2]"),
        (r#"{"a": 1}}"#, r#"{"a":1}"#),
        (r#"{"a": [1, 2}"#, r#"{"a":[1,2]}"#),
        (r#"[{"i": 1 {"i": 2}]"#, r#"[{"i":1},{"i":2}]"#),
        ("[1., .5, +3, 1_000]", "[1.0,0.5,3,1000]"),
        (r#""a": 1}"#, r#"{"a":1}"#),
        (r#"{"re": /a+b/i}"#, r#"{"re":"/a+b/i"}"#),
        (r#"{\"a\": \"b\"}"#, r#"{"a":"b"}"#),
        (
            r#"{"v": 0.0.1, "d": 2024-01-01}"#,
            r#"{"d":"2024-01-01","v":"0.0.1"}"#,
        ),
    ];
    for (input, expected) in rows {
        let r = repair(input).unwrap_or_else(|e| panic!("{input:?}: {e}"));
        assert!(r.was_repaired(), "{input:?} reported no repair");
        assert_eq!(
            &serde_json::to_string(&r.value).unwrap(),
            expected,
            "{input:?}"
        );
    }
}

/// A quote inside a string is text when what follows it on its line is more text, and a
/// string that holds such quotes closes only where the JSON can go on.
#[test]
fn reads_unescaped_quotes_by_what_follows_them() {
    ok(
        r#"{"html": "<a href="x">link</a>", "n": 1}"#,
        json!({"html": "<a href=\"x\">link</a>", "n": 1}),
        RepairKind::UnescapedQuote,
    );
    ok(
        r#"{"q": "she said "yes". Then left"}"#,
        json!({"q": "she said \"yes\". Then left"}),
        RepairKind::UnescapedQuote,
    );
    ok(
        r#"{"m": "[doc]("http://e.com")"}"#,
        json!({"m": "[doc](\"http://e.com\")"}),
        RepairKind::UnescapedQuote,
    );
    // Inside an object a colon after a quote cannot end the value: it is text.
    ok(
        r#"{"note": "keys like "id": 1 are fine"}"#,
        json!({"note": "keys like \"id\": 1 are fine"}),
        RepairKind::UnescapedQuote,
    );
    // `, three.` is no member, so the quote before it is text; `, "b":` is one.
    ok(
        r#"{"a": "one "two", three.", "b": 1}"#,
        json!({"a": "one \"two\", three.", "b": 1}),
        RepairKind::UnescapedQuote,
    );
    ok(
        r#"{"a": "x, {"k": 2}, "b": 1}"#,
        json!({"a": "x, {\"k\": 2}", "b": 1}),
        RepairKind::MissingQuote,
    );
    // One stray quote is text when the next member's key and colon prove where the string
    // ends (both reference libraries read it so); anywhere else it is still a guess.
    ok(
        r#"{"a": "x "y", "b": 1}"#,
        json!({"a": "x \"y", "b": 1}),
        RepairKind::UnescapedQuote,
    );
    for input in [
        r#"{"a": "5" tall"}"#,
        // The stray quote starts a line: it may open a string whose line lost its start.
        "{\"a\": \"x\n\"y\", \"b\": 1}",
        r#"["a "b", "c"]"#,
    ] {
        refused(input);
    }
}

/// A bare word followed by a quote lost its opening quote; a bare value followed by a
/// quoted key lost the comma after it.
#[test]
fn reads_a_closing_quote_after_a_bare_word() {
    ok(
        r#"{name": "Ann"}"#,
        json!({"name": "Ann"}),
        RepairKind::MissingQuote,
    );
    ok(
        r#"{"city": Paris", "n": 1}"#,
        json!({"city": "Paris", "n": 1}),
        RepairKind::MissingQuote,
    );
    ok(
        r#"[red", "blue"]"#,
        json!(["red", "blue"]),
        RepairKind::MissingQuote,
    );
    ok(
        r#"{"unit": celsius "days": 3}"#,
        json!({"unit": "celsius", "days": 3}),
        RepairKind::MissingComma,
    );
    // An escaped quote after a bare word, a quote at the very end, or one followed by text
    // are no closing quotes.
    for input in [r#"[a\", "b"]"#, r#"{"a": foo""#, r#"{"a": foo"bar}"#] {
        refused(input);
    }
}

#[test]
fn keeps_paired_brackets_inside_bare_text() {
    ok(
        r#"{"note": see [1] below}"#,
        json!({"note": "see [1] below"}),
        RepairKind::UnquotedString,
    );
    ok(
        r#"["a", this is f(x)]"#,
        json!(["a", "this is f(x)"]),
        RepairKind::UnquotedString,
    );
    ok(
        "{tag: a{b, c}d}",
        json!({"tag": "a{b, c}d"}),
        RepairKind::UnquotedString,
    );
}

#[test]
fn comments_around_joins_and_at_the_end() {
    ok(
        r#""a" /* x */ + /* y */ "b""#,
        json!("ab"),
        RepairKind::StringConcatenation,
    );
    // A comment of plain words where the input ends takes no data with it.
    ok("{\"a\": 1 // done", json!({"a": 1}), RepairKind::Comment);
    ok(
        "{\"a\": \"x\" /* the end",
        json!({"a": "x"}),
        RepairKind::Comment,
    );
    // One that could hold members is refused.
    for input in ["{\"a\": 1 /* , \"b\": 2", "{\"a\": 1 // \"b\": 2"] {
        refused(input);
    }
}

#[test]
fn an_empty_key_before_a_string_is_not_a_member() {
    refused(r#"{"" "x"}"#);
    refused(r#"[{"a": 1}, """" "b": 2]"#);
}

#[test]
fn keys_with_quotes_inside_and_single_quoted_pairs_without_colon() {
    ok(
        r#"{"k"e"y": 1}"#,
        json!({"k\"e\"y": 1}),
        RepairKind::UnescapedQuote,
    );
    ok("{'a' 'b'}", json!({"a": "b"}), RepairKind::MissingColon);
    // One stray quote in a key is a guess.
    refused(r#"{"a"b": 1}"#);
}

/// Issue 14: an object inside an array that lost its closing brace before the next object.
#[test]
fn issue_14_supplies_the_brace_an_array_element_lost() {
    ok(
        r#"[{"i": 1 {"i": 2}]"#,
        json!([{"i": 1}, {"i": 2}]),
        RepairKind::MismatchedBracket,
    );
    ok(
        r#"[{"i": 1, {"i": 2}]"#,
        json!([{"i": 1}, {"i": 2}]),
        RepairKind::MismatchedBracket,
    );
    // Not inside an array, or with a closer left over, the `{` may have lost its key.
    for input in [r#"{"a": 1 {"b": 2}}"#, r#"[{"a": 1, {"b": 2}}]"#] {
        refused(input);
    }
}

/// Issue 14: escaped JSON whose strings hold a quote escaped once more.
#[test]
fn issue_14_reads_quotes_escaped_twice_in_escaped_json() {
    for input in [
        r#"{\"s\": \"hello \\"world\\"\"}"#,
        r#"{\"s\": \"hello \\\"world\\\"\"}"#,
    ] {
        ok(
            input,
            json!({"s": "hello \"world\""}),
            RepairKind::DoubleEncoded,
        );
    }
}

/// Issue 14: an empty array closed by its object's brace has one reading; an empty object
/// closed by its array's bracket is read two ways by the reference libraries.
#[test]
fn issue_14_empty_array_closed_by_a_brace() {
    ok(
        r#"{"a": [}"#,
        json!({"a": []}),
        RepairKind::MismatchedBracket,
    );
    refused("[{]");
}
