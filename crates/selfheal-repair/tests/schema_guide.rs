//! Schema-guided coercion, validation messages and re-ask text.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use selfheal_repair::{CoercionKind, SchemaError, SchemaGuide, Violation, reask_message};
use serde_json::{Value, json};

fn kinds(o: &selfheal_repair::Outcome) -> Vec<(String, CoercionKind)> {
    o.coercions
        .iter()
        .map(|c| (c.pointer.clone(), c.kind))
        .collect()
}

fn apply(schema: Value, value: Value) -> selfheal_repair::Outcome {
    SchemaGuide::new(&schema).unwrap().apply(value)
}

#[test]
fn coerces_numeric_and_boolean_strings() {
    let o = apply(
        json!({"type": "object", "properties": {
            "n": {"type": "integer"}, "x": {"type": "number"}, "b": {"type": "boolean"},
            "f": {"type": "integer"}
        }}),
        json!({"n": "5", "x": " 2.5 ", "b": "TRUE", "f": "7.0"}),
    );
    assert_eq!(o.value, json!({"n": 5, "x": 2.5, "b": true, "f": 7}));
    assert!(o.is_valid(), "{:?}", o.violations);
    assert!(kinds(&o).contains(&("/n".into(), CoercionKind::StringToInteger)));
    assert!(kinds(&o).contains(&("/x".into(), CoercionKind::StringToNumber)));
    assert!(kinds(&o).contains(&("/b".into(), CoercionKind::StringToBoolean)));
}

#[test]
fn does_not_coerce_unsafe_mismatches() {
    let o = apply(
        json!({"type": "object", "properties": {
            "n": {"type": "integer"}, "b": {"type": "boolean"}, "x": {"type": "number"}
        }}),
        json!({"n": "5.5", "b": "yes", "x": "12abc"}),
    );
    assert_eq!(o.value, json!({"n": "5.5", "b": "yes", "x": "12abc"}));
    assert!(o.coercions.is_empty());
    assert_eq!(o.violations.len(), 3);
    assert!(
        o.violations
            .iter()
            .any(|v| v.to_string() == r#"at /n: expected integer, got string "5.5""#)
    );
}

#[test]
fn wraps_single_values_and_stringifies_numbers() {
    let o = apply(
        json!({"type": "object", "properties": {
            "tags": {"type": "array", "items": {"type": "string"}},
            "ids": {"type": "array", "items": {"type": "integer"}},
            "code": {"type": "string"}
        }}),
        json!({"tags": "a", "ids": "3", "code": 42}),
    );
    assert_eq!(o.value, json!({"tags": ["a"], "ids": [3], "code": "42"}));
    assert!(o.is_valid(), "{:?}", o.violations);
    assert!(kinds(&o).contains(&("/tags".into(), CoercionKind::WrappedInArray)));
    assert!(kinds(&o).contains(&("/ids/0".into(), CoercionKind::StringToInteger)));
    assert!(kinds(&o).contains(&("/code".into(), CoercionKind::NumberToString)));
}

#[test]
fn parses_json_encoded_in_a_string_where_an_object_is_required() {
    let o = apply(
        json!({"type": "object", "properties": {"args": {"type": "object", "properties": {"n": {"type": "integer"}}}}}),
        json!({"args": "{\"n\": \"2\"}"}),
    );
    assert_eq!(o.value, json!({"args": {"n": 2}}));
    assert_eq!(
        kinds(&o),
        vec![
            ("/args".into(), CoercionKind::ParsedJsonString),
            ("/args/n".into(), CoercionKind::StringToInteger)
        ]
    );
}

/// Applies `schema` with defaults filled and unknown properties dropped (both opt-in).
fn apply_lossy(schema: Value, v: Value) -> selfheal_repair::Outcome {
    SchemaGuide::new(&schema)
        .unwrap()
        .with_fill_defaults(true)
        .with_drop_unknown(true)
        .apply(v)
}

/// Issue 14: without opt-in, no default is written and nothing is dropped.
#[test]
fn writes_no_default_and_drops_nothing_unless_asked() {
    let closed = json!({"type": "object", "properties": {
        "a": {"type": "integer"}, "unit": {"type": "string", "default": "c"}
    }, "additionalProperties": false});
    // Valid and missing a defaulted property: untouched.
    let o = apply(closed.clone(), json!({"a": 1}));
    assert_eq!(o.value, json!({"a": 1}));
    assert!(o.coercions.is_empty() && o.is_valid());
    // An unknown property is a violation, not a silent drop.
    let o = apply(closed, json!({"a": 1, "extra": true}));
    assert_eq!(o.value, json!({"a": 1, "extra": true}));
    assert_eq!(o.violations.len(), 1, "{:?}", o.violations);
}

/// Issue 14: a default that violates its own schema is never written, even when asked.
#[test]
fn never_writes_a_default_that_breaks_its_own_schema() {
    let schema = json!({"type": "object", "properties": {
        "name": {"type": "string", "default": null},
        "mode": {"type": "string", "enum": ["a", "b"], "default": "dontcare"},
        "n": {"type": "integer", "default": "dontcare"},
        "k": {"type": "integer", "default": 3}
    }});
    let o = apply_lossy(schema, json!({}));
    assert_eq!(o.value, json!({"k": 3}));
    assert_eq!(kinds(&o), vec![("/k".into(), CoercionKind::FilledDefault)]);
}

/// Issue 14: a valid value comes back untouched, even where a coercion could apply.
#[test]
fn valid_values_are_never_changed() {
    let schema = json!({"type": "object", "properties": {
        "q": {"type": ["string", "integer"]},
        "payload": {"type": ["string", "object"]},
        "tags": {"anyOf": [{"type": "string"}, {"type": "array"}]}
    }});
    let v = json!({"q": "5", "payload": "{\"a\": 1}", "tags": "x"});
    let o = apply(schema, v.clone());
    assert_eq!(o.value, v);
    assert!(o.coercions.is_empty());
}

/// Review finding: a float is never turned into a string, whose digits it no longer has
/// (`1.10` parses as 1.1).
#[test]
fn floats_are_not_turned_into_strings() {
    let o = apply(
        json!({"type": "object", "properties": {"v": {"type": "string"}}}),
        json!({"v": 1.10}),
    );
    assert_eq!(o.value, json!({"v": 1.1}));
    assert_eq!(o.violations.len(), 1);
    let o = apply(
        json!({"type": "object", "properties": {"v": {"type": "string"}}}),
        json!({"v": 12}),
    );
    assert_eq!(o.value, json!({"v": "12"}));
}

/// Issue 14: text with leading zeros is never read as a number.
#[test]
fn leading_zero_strings_are_not_numbers() {
    let o = apply(
        json!({"type": "object", "properties": {"zip": {"type": "integer"}, "n": {"type": "number"}}}),
        json!({"zip": "0789", "n": "-01.5"}),
    );
    assert_eq!(o.value, json!({"zip": "0789", "n": "-01.5"}));
    assert_eq!(o.violations.len(), 2, "{:?}", o.violations);
}

#[test]
fn fills_defaults_and_drops_unknown_only_when_closed() {
    let closed = json!({"type": "object", "properties": {
        "a": {"type": "integer"}, "unit": {"type": "string", "default": "c"}
    }, "additionalProperties": false});
    let o = apply_lossy(closed, json!({"a": 1, "extra": true}));
    assert_eq!(o.value, json!({"a": 1, "unit": "c"}));
    assert!(kinds(&o).contains(&("/unit".into(), CoercionKind::FilledDefault)));
    assert!(kinds(&o).contains(&("/extra".into(), CoercionKind::DroppedUnknownProperty)));
    // Open schemas keep unknown properties.
    let o = apply_lossy(
        json!({"type": "object", "properties": {"a": {}}}),
        json!({"extra": 1}),
    );
    assert_eq!(o.value, json!({"extra": 1}));
    assert!(o.coercions.is_empty());
    // A present value is never replaced by the default.
    let o = apply(
        json!({"properties": {"unit": {"default": "c"}}}),
        json!({"unit": "f"}),
    );
    assert_eq!(o.value, json!({"unit": "f"}));
}

#[test]
fn enum_violations_read_as_reask_text() {
    let o = apply(
        json!({"type": "object", "properties": {"unit": {"enum": ["c", "f"]}}, "required": ["unit", "city"]}),
        json!({"unit": "celsius"}),
    );
    let texts: Vec<String> = o.violations.iter().map(ToString::to_string).collect();
    assert!(
        texts.contains(&r#"at /unit: expected one of ["c","f"], got "celsius""#.to_owned()),
        "{texts:?}"
    );
    assert!(
        texts.contains(&r#"at (root): missing required property "city""#.to_owned()),
        "{texts:?}"
    );
    let msg = reask_message(&o.violations, "get_weather");
    assert!(msg.starts_with("The arguments for `get_weather` do not match its schema:\n"));
    assert!(msg.contains(r#"- at /unit: expected one of ["c","f"], got "celsius""#));
    assert!(msg.contains("Call `get_weather` again"));
}

#[test]
fn enum_matches_case_and_spelled_members() {
    let o = apply(
        json!({"properties": {"unit": {"enum": ["celsius", "fahrenheit"]}, "level": {"enum": [1, 2, 3]}}}),
        json!({"unit": "Celsius", "level": "2"}),
    );
    assert_eq!(o.value, json!({"unit": "celsius", "level": 2}));
    assert!(o.is_valid());
    assert_eq!(o.coercions.len(), 2);
}

#[test]
fn normalises_non_standard_types_from_tool_schemas() {
    let o = apply(
        json!({"type": "dict", "properties": {
            "x": {"type": "float"}, "t": {"type": "tuple"}, "any": {"type": "any"},
            "s": {"type": ["String", "NULL"]}
        }}),
        json!({"x": "1.5", "t": [1, "a"], "any": {"k": 1}, "s": null}),
    );
    assert_eq!(
        o.value,
        json!({"x": 1.5, "t": [1, "a"], "any": {"k": 1}, "s": null})
    );
    assert!(o.is_valid(), "{:?}", o.violations);
}

#[test]
fn follows_refs_unions_and_draft7_tuples() {
    let schema = json!({
        "$schema": "http://json-schema.org/draft-07/schema#",
        "definitions": {"n": {"type": "integer"}},
        "type": "object",
        "properties": {
            "r": {"$ref": "#/definitions/n"},
            "opt": {"anyOf": [{"type": "integer"}, {"type": "null"}]},
            "pair": {"type": "array", "items": [{"type": "string"}, {"type": "integer"}]}
        }
    });
    let o = apply(schema, json!({"r": "1", "opt": "2", "pair": [3, "4"]}));
    assert_eq!(o.value, json!({"r": 1, "opt": 2, "pair": ["3", 4]}));
    assert!(o.is_valid(), "{:?}", o.violations);
}

#[test]
fn validates_draft_2020_12_prefix_items() {
    let schema = json!({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "type": "array", "prefixItems": [{"type": "integer"}], "items": false
    });
    let o = apply(schema, json!(["1", 2]));
    assert_eq!(o.value, json!([1, 2]));
    assert_eq!(o.violations.len(), 1, "{:?}", o.violations);
}

#[test]
fn reports_other_keywords_with_their_pointer() {
    let o = apply(
        json!({"properties": {"n": {"type": "integer", "minimum": 10}}}),
        json!({"n": "3"}),
    );
    assert_eq!(o.value, json!({"n": 3}));
    assert_eq!(o.violations.len(), 1);
    assert_eq!(o.violations[0].pointer, "/n");
    assert!(
        o.violations[0].message.contains("10"),
        "{}",
        o.violations[0].message
    );
}

#[test]
fn bad_schemas_are_refused() {
    assert!(matches!(
        SchemaGuide::new(&json!({"type": 5})),
        Err(SchemaError::UnknownType { .. })
    ));
    assert!(matches!(
        SchemaGuide::new(&json!({"type": "object", "minProperties": "x"})),
        Err(SchemaError::Invalid { .. })
    ));
}

#[test]
fn violation_display_names_the_root() {
    let v = Violation {
        pointer: String::new(),
        message: "expected object, got array []".into(),
    };
    assert_eq!(v.to_string(), "at (root): expected object, got array []");
}

#[test]
fn accepts_wild_tool_schemas_that_strict_validators_reject() {
    // A draft-7 tuple and OpenAPI-2 `required: true` without `$schema`.
    let guide = SchemaGuide::new(&json!({
        "type": "object",
        "properties": {
            "pair": {"type": "tuple", "items": [{"type": "string"}, {"type": "int"}]},
            "q": {"type": "string", "required": true}
        }
    }))
    .unwrap();
    let o = guide.apply(json!({"pair": ["a", "2"]}));
    assert_eq!(o.value, json!({"pair": ["a", 2]}));
    assert_eq!(o.violations.len(), 1);
    assert_eq!(
        o.violations[0].to_string(),
        r#"at (root): missing required property "q""#
    );
}

#[test]
fn pattern_properties_are_known_under_closed_schemas() {
    let o = apply_lossy(
        json!({"type": "object",
            "properties": {"name": {"type": "string"}},
            "patternProperties": {"^x-": {"type": "integer"}, "^tag_\\d+$": {"type": "string"}},
            "additionalProperties": false}),
        json!({"name": "a", "x-count": "3", "tag_1": 7, "tag_x": "no", "other": 1}),
    );
    assert_eq!(o.value, json!({"name": "a", "x-count": 3, "tag_1": "7"}));
    assert!(o.is_valid(), "{:?}", o.violations);
    let k = kinds(&o);
    assert!(
        k.contains(&("/x-count".into(), CoercionKind::StringToInteger)),
        "{k:?}"
    );
    assert!(
        k.contains(&("/tag_1".into(), CoercionKind::NumberToString)),
        "{k:?}"
    );
    assert!(
        k.contains(&("/tag_x".into(), CoercionKind::DroppedUnknownProperty)),
        "{k:?}"
    );
    assert!(
        k.contains(&("/other".into(), CoercionKind::DroppedUnknownProperty)),
        "{k:?}"
    );
    assert_eq!(k.len(), 4, "{k:?}");
}

#[test]
fn pattern_properties_coerce_alongside_properties_and_additional_schemas() {
    // A key named in `properties` and matched by a pattern is coerced against both; keys no
    // pattern matches go to the `additionalProperties` schema, the others do not.
    let o = apply(
        json!({"type": "object",
            "properties": {"n_ids": {"type": "array"}},
            "patternProperties": {"^n_": {"type": "array", "items": {"type": "integer"}}},
            "additionalProperties": {"type": "string"}}),
        json!({"n_ids": "4", "n_more": ["5"], "s": 2}),
    );
    assert_eq!(o.value, json!({"n_ids": [4], "n_more": [5], "s": "2"}));
    assert!(o.is_valid(), "{:?}", o.violations);
    assert_eq!(
        kinds(&o),
        vec![
            ("/n_ids".into(), CoercionKind::WrappedInArray),
            ("/n_ids/0".into(), CoercionKind::StringToInteger),
            ("/n_more/0".into(), CoercionKind::StringToInteger),
            ("/s".into(), CoercionKind::NumberToString),
        ]
    );
    // Nested objects, reached through `items`, use their own patterns.
    let o = apply_lossy(
        json!({"type": "array", "items": {"type": "object",
            "patternProperties": {"^[a-z]+$": {"type": "number"}},
            "additionalProperties": false}}),
        json!([{"ok": "1.5", "Bad": 1}]),
    );
    assert_eq!(o.value, json!([{"ok": 1.5}]));
    assert!(o.is_valid(), "{:?}", o.violations);
}

#[test]
fn unreadable_patterns_never_drop_properties() {
    // `\cA` is ECMA syntax the validator accepts but the coercion walk cannot compile: any
    // property might match it, so none is dropped or coerced as an additional property.
    let guide = SchemaGuide::new(&json!({"type": "object",
        "properties": {"a": {"type": "integer"}},
        "patternProperties": {"^\\cA": {"type": "integer"}, "^x-": {"type": "integer"}},
        "additionalProperties": false}))
    .unwrap();
    let o = guide.apply(json!({"a": "1", "x-b": "2", "c": "3"}));
    assert_eq!(o.value, json!({"a": 1, "x-b": 2, "c": "3"}));
    assert_eq!(
        kinds(&o),
        vec![
            ("/a".into(), CoercionKind::StringToInteger),
            ("/x-b".into(), CoercionKind::StringToInteger),
        ]
    );
    // The validator still reports what it does not accept.
    assert_eq!(o.violations.len(), 1, "{:?}", o.violations);
    let o = apply(
        json!({"patternProperties": {"^\\cA": {}}, "additionalProperties": {"type": "string"}}),
        json!({"c": 3}),
    );
    assert_eq!(o.value, json!({"c": 3}));
    assert!(o.coercions.is_empty());
}
