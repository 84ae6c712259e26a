//! Issue 29: numbers are never re-encoded through `f64` when a repaired value is turned back
//! into text, and the repair list stays bounded whatever the input's shape.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use selfheal_repair::{Ending, RepairOptions, SchemaGuide, repair, repair_arguments, repair_with};
use serde_json::json;

const BIG: &str = "1180591620717411303424";
const PI: &str = "3.14159265358979323846";

#[test]
fn a_repaired_object_keeps_long_literals() {
    let r = repair(&format!("{{'big': {BIG}, 'pi': {PI}, 'xs': [1, {BIG},],}}")).unwrap();
    assert!(r.was_repaired());
    assert_eq!(
        r.to_json().unwrap(),
        format!(r#"{{"big":{BIG},"pi":{PI},"xs":[1,{BIG}]}}"#)
    );
}

#[test]
fn long_literals_survive_every_way_a_document_is_rebuilt() {
    // Several values collected into an array.
    let r = repair_with(
        &format!("{{\"a\": {BIG}}}\n{{\"a\": {PI}}}"),
        &RepairOptions::default().with_multiple(true),
    )
    .unwrap();
    assert_eq!(
        r.to_json().unwrap(),
        format!(r#"[{{"a":{BIG}}},{{"a":{PI}}}]"#)
    );
    // The opening brace left off.
    let r = repair(&format!("\"a\": {BIG}, \"b\": 1}}")).unwrap();
    assert_eq!(r.to_json().unwrap(), format!(r#"{{"a":{BIG},"b":1}}"#));
    // A double-encoded document.
    let r = repair_with(
        &format!("\"{{\\\"a\\\": {BIG}}}\""),
        &RepairOptions::default().with_decode_strings(true),
    )
    .unwrap();
    assert_eq!(r.to_json().unwrap(), format!(r#"{{"a":{BIG}}}"#));
    // A value inside a wrapper call.
    let r = repair(&format!("{{\"n\": NumberLong({BIG}), \"m\": 1,}}")).unwrap();
    assert_eq!(r.to_json().unwrap(), format!(r#"{{"m":1,"n":{BIG}}}"#));
    // Valid input read whole keeps its literals too, for a caller that re-formats it.
    let r = repair(&format!("{{\"a\": [{PI}]}}")).unwrap();
    assert!(!r.was_repaired());
    assert_eq!(r.to_json().unwrap(), format!(r#"{{"a":[{PI}]}}"#));
}

#[test]
fn arguments_changed_by_the_schema_keep_long_literals_or_are_refused() {
    let schema = json!({
        "type": "object",
        "properties": {"id": {"type": "number"}, "n": {"type": "integer"}, "s": {"type": "string"}}
    });
    let guide = SchemaGuide::new(&schema).unwrap();
    // Valid text, coerced elsewhere ("3" to 3): the long literal goes out as written.
    let raw = format!(r#"{{"id": {BIG}, "n": "3"}}"#);
    let a = repair_arguments(&raw, Some(&guide), Ending::Finished).unwrap();
    assert!(a.changed);
    assert_eq!(a.to_json().unwrap(), format!(r#"{{"id":{BIG},"n":3}}"#));
    // Repaired text, same.
    let raw = format!("{{'id': {BIG}, 'n': '3',}}");
    let a = repair_arguments(&raw, Some(&guide), Ending::Finished).unwrap();
    assert_eq!(a.to_json().unwrap(), format!(r#"{{"id":{BIG},"n":3}}"#));
    // A number where the schema wants a string is refused, never turned into the text of
    // a double.
    let raw = format!("{{'s': {BIG},}}");
    assert!(repair_arguments(&raw, Some(&guide), Ending::Finished).is_err());
}

#[test]
fn the_repair_list_is_bounded_and_counts_the_rest() {
    let input = format!("[1{}]", ",".repeat(30_000));
    let r = repair(&input).unwrap();
    assert_eq!(r.value, json!([1]));
    assert_eq!(r.repairs.len(), 10_000);
    assert!(r.unlisted >= 20_000 - 1, "{}", r.unlisted);
    // A string full of quotes is decided by their count, listed or not.
    let odd = format!("{{\"a\": \"{}x\"}}", "x\"".repeat(20_001));
    assert!(repair(&odd).is_err());
}
