//! Normalising the non-standard schemas found in tool definitions in the wild.
//!
//! Tool schemas are often written by hand or generated from Python type hints: `"type":
//! "dict"`, `"float"`, `"tuple"`, `"any"`, `"String"`, or lists of those. A strict validator
//! rejects them, and then nothing is checked at all. This module rewrites them to standard
//! JSON Schema before compiling. A name it cannot map (a class name such as `Vehicle`) leaves
//! the value unchecked there: refusing the schema would refuse every valid call to the tool.

use serde_json::{Map, Value};

use super::SchemaError;

/// Sub-schema nesting accepted in a schema; far beyond any real tool schema.
pub(crate) const MAX_SCHEMA_DEPTH: usize = 64;

/// Keywords whose value is a single sub-schema.
pub(crate) const SINGLE: [&str; 11] = [
    "additionalProperties",
    "contains",
    "not",
    "if",
    "then",
    "else",
    "propertyNames",
    "unevaluatedProperties",
    "unevaluatedItems",
    "additionalItems",
    "items",
];

/// Keywords whose value is a map of sub-schemas.
pub(crate) const MAPS: [&str; 6] = [
    "properties",
    "patternProperties",
    "$defs",
    "definitions",
    "dependentSchemas",
    "dependencies",
];

/// Keywords whose value is a list of sub-schemas.
pub(crate) const LISTS: [&str; 5] = ["allOf", "anyOf", "oneOf", "prefixItems", "items"];

/// The standard type for a type name, `Some(None)` for "any", `None` when unknown.
fn canonical(name: &str) -> Option<Option<&'static str>> {
    let t = match name.trim().to_ascii_lowercase().as_str() {
        "object" | "dict" | "map" | "mapping" | "hash" | "record" | "struct" | "hashmap"
        | "treemap" | "linkedhashmap" | "jsonobject" => "object",
        "array" | "list" | "tuple" | "set" | "sequence" | "vec" | "arraylist" | "linkedlist"
        | "hashset" | "treeset" | "collection" | "jsonarray" => "array",
        "string" | "str" | "text" | "char" | "character" => "string",
        "integer" | "int" | "long" | "short" | "byte" | "i64" | "u64" | "biginteger" => "integer",
        "number" | "float" | "double" | "decimal" | "numeric" | "f64" | "bigdecimal" => "number",
        "boolean" | "bool" => "boolean",
        "null" | "none" | "nil" => "null",
        "any" | "mixed" => return Some(None),
        _ => return None,
    };
    Some(Some(t))
}

/// Returns the schema with its type names standardised.
pub(crate) fn normalise(schema: &Value) -> Result<Value, SchemaError> {
    let mut out = schema.clone();
    let mut pointer = String::new();
    // Drafts before 2019-09 spell tuples `items: [...]`; later ones `prefixItems`.
    let legacy = schema
        .get("$schema")
        .and_then(Value::as_str)
        .is_some_and(|s| {
            ["draft-04", "draft-06", "draft-07"]
                .iter()
                .any(|d| s.contains(d))
        });
    walk(&mut out, &mut pointer, 0, legacy)?;
    Ok(out)
}

/// `items: [...]` (a draft-7 tuple) in a 2020-12 schema becomes `prefixItems`.
fn modernise_tuple(obj: &mut Map<String, Value>) {
    if !matches!(obj.get("items"), Some(Value::Array(_))) || obj.contains_key("prefixItems") {
        return;
    }
    if let Some(tuple) = obj.remove("items") {
        obj.insert("prefixItems".to_owned(), tuple);
    }
    if let Some(rest) = obj.remove("additionalItems") {
        obj.insert("items".to_owned(), rest);
    }
}

/// OpenAPI-2 style `"required": true` on a property becomes an entry in the parent's
/// `required` list; a boolean `required` anywhere else is dropped.
fn lift_required(obj: &mut Map<String, Value>) {
    let mut names = Vec::new();
    if let Some(Value::Object(props)) = obj.get_mut("properties") {
        for (name, sub) in props.iter_mut() {
            if let Some(Value::Bool(flag)) = sub.get("required").cloned() {
                if let Value::Object(sub) = sub {
                    sub.remove("required");
                }
                if flag {
                    names.push(Value::String(name.clone()));
                }
            }
        }
    }
    if matches!(obj.get("required"), Some(Value::Bool(_))) {
        obj.remove("required");
    }
    if names.is_empty() {
        return;
    }
    match obj.get_mut("required") {
        Some(Value::Array(list)) => {
            for n in names {
                if !list.contains(&n) {
                    list.push(n);
                }
            }
        }
        _ => {
            obj.insert("required".to_owned(), Value::Array(names));
        }
    }
}

fn walk(
    schema: &mut Value,
    pointer: &mut String,
    depth: usize,
    legacy: bool,
) -> Result<(), SchemaError> {
    if depth > MAX_SCHEMA_DEPTH {
        return Err(SchemaError::TooDeep {
            limit: MAX_SCHEMA_DEPTH,
        });
    }
    let Value::Object(obj) = schema else {
        return Ok(());
    };
    normalise_type(obj, pointer)?;
    lift_required(obj);
    if !legacy {
        modernise_tuple(obj);
    }
    let len = pointer.len();
    for kw in SINGLE {
        if let Some(sub @ Value::Object(_)) = obj.get_mut(kw) {
            push(pointer, kw);
            walk(sub, pointer, depth + 1, legacy)?;
            pointer.truncate(len);
        }
    }
    for kw in MAPS {
        if let Some(Value::Object(map)) = obj.get_mut(kw) {
            for (name, sub) in map.iter_mut() {
                push(pointer, kw);
                push(pointer, name);
                walk(sub, pointer, depth + 1, legacy)?;
                pointer.truncate(len);
            }
        }
    }
    for kw in LISTS {
        if let Some(Value::Array(list)) = obj.get_mut(kw) {
            for (i, sub) in list.iter_mut().enumerate() {
                push(pointer, kw);
                push(pointer, &i.to_string());
                walk(sub, pointer, depth + 1, legacy)?;
                pointer.truncate(len);
            }
        }
    }
    Ok(())
}

fn push(pointer: &mut String, segment: &str) {
    pointer.push('/');
    pointer.push_str(&segment.replace('~', "~0").replace('/', "~1"));
}

fn normalise_type(obj: &mut Map<String, Value>, pointer: &str) -> Result<(), SchemaError> {
    let Some(ty) = obj.get("type") else {
        return Ok(());
    };
    let names: Vec<&str> = match ty {
        Value::String(s) => vec![s.as_str()],
        Value::Array(list) => list.iter().filter_map(Value::as_str).collect(),
        _ => {
            return Err(SchemaError::UnknownType {
                pointer: format!("{pointer}/type"),
                name: ty.to_string(),
            });
        }
    };
    let mut types: Vec<&'static str> = Vec::new();
    for name in names {
        match canonical(name) {
            Some(Some(t)) => {
                if !types.contains(&t) {
                    types.push(t);
                }
            }
            Some(None) => {
                obj.remove("type");
                return Ok(());
            }
            // A class name (`Vehicle`, `EventRequest`) or a type we do not know: the value
            // is not checked there. Refusing the schema would refuse valid calls.
            None => {
                obj.remove("type");
                return Ok(());
            }
        }
    }
    let new = match types.as_slice() {
        [] => {
            obj.remove("type");
            return Ok(());
        }
        [one] => Value::from(*one),
        many => Value::from(many.to_vec()),
    };
    obj.insert("type".to_owned(), new);
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn maps_python_style_names() {
        let s = normalise(&json!({
            "type": "dict",
            "properties": {
                "a": {"type": "float"},
                "b": {"type": "tuple", "items": {"type": "Int"}},
                "c": {"type": "any"},
                "d": {"type": ["STRING", "None", "str"]}
            }
        }))
        .unwrap();
        assert_eq!(s["type"], json!("object"));
        assert_eq!(s["properties"]["a"]["type"], json!("number"));
        assert_eq!(s["properties"]["b"]["type"], json!("array"));
        assert_eq!(s["properties"]["b"]["items"]["type"], json!("integer"));
        assert!(s["properties"]["c"].get("type").is_none());
        assert_eq!(s["properties"]["d"]["type"], json!(["string", "null"]));
    }

    #[test]
    fn modernises_tuples_and_lifts_boolean_required() {
        let s = normalise(&json!({
            "type": "object",
            "required": true,
            "properties": {
                "pair": {"type": "tuple", "items": [{"type": "str"}], "additionalItems": false},
                "a": {"type": "string", "required": true},
                "b": {"type": "string", "required": false}
            }
        }))
        .unwrap();
        assert_eq!(s["required"], json!(["a"]));
        assert!(s["properties"]["a"].get("required").is_none());
        assert!(s["properties"]["b"].get("required").is_none());
        let pair = &s["properties"]["pair"];
        assert_eq!(pair["prefixItems"], json!([{"type": "string"}]));
        assert_eq!(pair["items"], json!(false));
        // Draft 7 keeps its own tuple spelling.
        let s = normalise(&json!({
            "$schema": "http://json-schema.org/draft-07/schema#",
            "items": [{"type": "int"}]
        }))
        .unwrap();
        assert_eq!(s["items"], json!([{"type": "integer"}]));
    }

    /// Issue 14: a type name we do not know (a class name) leaves the value unchecked
    /// rather than refusing the schema, and so every call to the tool.
    #[test]
    fn unknown_type_names_leave_the_value_unchecked() {
        let s = normalise(&json!({"properties": {"a": {"type": "Vehicle"}, "b": {"type": "HashMap"}, "c": {"type": "ArrayList"}}})).unwrap();
        assert_eq!(s["properties"]["a"], json!({}));
        assert_eq!(s["properties"]["b"], json!({"type": "object"}));
        assert_eq!(s["properties"]["c"], json!({"type": "array"}));
        let err = normalise(&json!({"properties": {"a": {"type": 5}}})).unwrap_err();
        assert!(matches!(err, SchemaError::UnknownType { .. }));
    }

    #[test]
    fn refuses_absurdly_deep_schemas() {
        let mut s = json!({"type": "string"});
        for _ in 0..100 {
            s = json!({"type": "array", "items": s});
        }
        assert!(matches!(normalise(&s), Err(SchemaError::TooDeep { .. })));
    }
}
