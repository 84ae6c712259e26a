//! Schema-guided repair: normalise the schema, coerce safe mismatches, validate, re-ask.
//!
//! A value that parses is not yet a value the tool accepts. Before spending a round trip on
//! re-asking the model, [`SchemaGuide::apply`] fixes what can be fixed without guessing (see
//! [`CoercionKind`]) and turns what is left into precise [`Violation`]s, which
//! [`reask_message`] turns into the message for the model.
//!
//! A value that already validates is returned untouched: no coercion, no default, no
//! decoding. Filling declared defaults ([`SchemaGuide::with_fill_defaults`]) and dropping
//! properties the schema forbids ([`SchemaGuide::with_drop_unknown`]) are opt-in: the tool
//! applies its own defaults, real schemas declare defaults that violate them, and a dropped
//! property is data the model meant to send.
//!
//! Validation uses the `jsonschema` crate (draft detected from `$schema`, 2020-12 by
//! default; draft 7 supported). The coercion walk is our own, because a validator only says
//! *that* a value is wrong, not how to fix it safely.

mod coerce;
mod normalise;

use std::fmt;

use serde::Serialize;
use serde_json::Value;

/// The schema could not be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SchemaError {
    /// A `type` that is neither a name nor a list of names (`"type": 5`). Names that are not
    /// standard or a known alias (`dict`, `HashMap`, a class name) leave the value unchecked.
    #[error("unknown type {name:?} at {pointer}")]
    UnknownType {
        /// JSON pointer to the `type` keyword in the schema.
        pointer: String,
        /// The type name as written.
        name: String,
    },
    /// The schema nests sub-schemas deeper than the limit.
    #[error("schema nests deeper than {limit} levels")]
    TooDeep {
        /// The limit.
        limit: usize,
    },
    /// The schema is not valid JSON Schema.
    #[error("invalid JSON Schema: {message}")]
    Invalid {
        /// What the validator said.
        message: String,
    },
}

/// One safe change made to fit the schema.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Coercion {
    /// JSON pointer to the changed value (`""` for the root).
    pub pointer: String,
    /// What was changed.
    pub kind: CoercionKind,
}

/// The kinds of safe coercion. Serialised in `snake_case`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CoercionKind {
    /// `"5"` → `5` where an integer is required.
    StringToInteger,
    /// `"2.5"` → `2.5` where a number is required.
    StringToNumber,
    /// `"true"` → `true` where a boolean is required.
    StringToBoolean,
    /// `"null"` → `null` where only null is allowed.
    StringToNull,
    /// `5` → `"5"` where a string is required.
    NumberToString,
    /// `x` → `[x]` where an array is required.
    WrappedInArray,
    /// `"{\"a\":1}"` → `{"a":1}` where an object or array is required.
    ParsedJsonString,
    /// `"Celsius"` → `"celsius"`, `"2"` → `2`: the one enum member the value spells.
    EnumMatch,
    /// A missing property was given its declared `default` (only with
    /// [`SchemaGuide::with_fill_defaults`], and only a default that fits its own schema).
    FilledDefault,
    /// A property not allowed by `additionalProperties: false` was removed (only with
    /// [`SchemaGuide::with_drop_unknown`]).
    DroppedUnknownProperty,
}

/// What is still wrong after coercion: where, and what was expected.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Violation {
    /// JSON pointer into the value (`""` for the root).
    pub pointer: String,
    /// What is wrong, e.g. `expected one of ["c","f"], got "celsius"`.
    pub message: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let at = if self.pointer.is_empty() {
            "(root)"
        } else {
            &self.pointer
        };
        write!(f, "at {at}: {}", self.message)
    }
}

/// The result of [`SchemaGuide::apply`].
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    /// The value after coercion.
    pub value: Value,
    /// The coercions applied, in walk order.
    pub coercions: Vec<Coercion>,
    /// What still violates the schema; empty when the value is valid.
    pub violations: Vec<Violation>,
}

impl Outcome {
    /// Whether the value now satisfies the schema.
    #[must_use]
    pub fn is_valid(&self) -> bool {
        self.violations.is_empty()
    }
}

/// A compiled, normalised schema that coerces and validates values.
#[derive(Debug)]
pub struct SchemaGuide {
    schema: Value,
    validator: jsonschema::Validator,
    patterns: coerce::Patterns,
    fill_defaults: bool,
    drop_unknown: bool,
}

/// Longest rendering of an offending value in a message.
const MAX_SHOWN: usize = 80;

impl SchemaGuide {
    /// Normalises the non-standard type names in `schema` and compiles it.
    ///
    /// # Errors
    ///
    /// [`SchemaError`] when a type name is unknown, the schema is absurdly deep, or it is not
    /// valid JSON Schema.
    pub fn new(schema: &Value) -> Result<Self, SchemaError> {
        let schema = normalise::normalise(schema)?;
        let validator = jsonschema::validator_for(&schema).map_err(|e| SchemaError::Invalid {
            message: e.to_string(),
        })?;
        let patterns = coerce::Patterns::collect(&schema);
        Ok(Self {
            schema,
            validator,
            patterns,
            fill_defaults: false,
            drop_unknown: false,
        })
    }

    /// Fills a missing property with its declared `default` when the default fits the
    /// property's own schema (off by default: the tool applies its own defaults).
    #[must_use]
    pub fn with_fill_defaults(mut self, on: bool) -> Self {
        self.fill_defaults = on;
        self
    }

    /// Removes properties that `additionalProperties: false` forbids instead of reporting
    /// them (off by default: a dropped property is data lost).
    #[must_use]
    pub fn with_drop_unknown(mut self, on: bool) -> Self {
        self.drop_unknown = on;
        self
    }

    /// Whether the schema's root admits an object or an array but not a string, so a string
    /// there is worth decoding as JSON.
    #[must_use]
    pub fn wants_container(&self) -> bool {
        let ts = match self.schema.get("type") {
            Some(Value::String(t)) => vec![t.as_str()],
            Some(Value::Array(list)) => list.iter().filter_map(Value::as_str).collect(),
            _ => return false,
        };
        ts.iter().any(|t| matches!(*t, "object" | "array")) && !ts.contains(&"string")
    }

    /// The schema after normalisation.
    #[must_use]
    pub fn schema(&self) -> &Value {
        &self.schema
    }

    /// Coerces `value` where that is safe, then validates it. A value that is already valid
    /// comes back untouched (unless [`SchemaGuide::with_fill_defaults`] asks for defaults).
    #[must_use]
    pub fn apply(&self, mut value: Value) -> Outcome {
        if !self.fill_defaults && self.validator.is_valid(&value) {
            return Outcome {
                value,
                coercions: Vec::new(),
                violations: Vec::new(),
            };
        }
        let mut walker = coerce::Walker {
            root: &self.schema,
            patterns: &self.patterns,
            coercions: Vec::new(),
            fill_defaults: self.fill_defaults,
            drop_unknown: self.drop_unknown,
        };
        let mut pointer = String::new();
        walker.walk(&mut value, &self.schema, &mut pointer, 0);
        let mut violations = self.validate(&value);
        if !violations.is_empty() {
            // A filled default that still breaks the schema is taken back out.
            let mut undone = false;
            walker.coercions.retain(|c| {
                let bad = c.kind == CoercionKind::FilledDefault
                    && violations.iter().any(|v| {
                        v.pointer == c.pointer || v.pointer.starts_with(&format!("{}/", c.pointer))
                    });
                if bad {
                    undone |= remove_at(&mut value, &c.pointer);
                }
                !bad
            });
            if undone {
                violations = self.validate(&value);
            }
        }
        Outcome {
            value,
            coercions: walker.coercions,
            violations,
        }
    }

    /// Validates `value` without changing it.
    #[must_use]
    pub fn validate(&self, value: &Value) -> Vec<Violation> {
        self.validator
            .iter_errors(value)
            .map(|e| Violation {
                pointer: e.instance_path().as_str().to_owned(),
                message: describe(&e),
            })
            .collect()
    }
}

/// Removes the member at a JSON pointer; whether it was there.
fn remove_at(value: &mut Value, pointer: &str) -> bool {
    let Some((parent, last)) = pointer.rsplit_once('/') else {
        return false;
    };
    let key = last.replace("~1", "/").replace("~0", "~");
    value
        .pointer_mut(parent)
        .and_then(Value::as_object_mut)
        .and_then(|m| m.remove(&key))
        .is_some()
}

fn shown(v: &Value) -> String {
    let mut s = v.to_string();
    if s.len() > MAX_SHOWN {
        let mut cut = MAX_SHOWN;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
        s.push('…');
    }
    s
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_f64() => "number",
        Value::Number(_) => "integer",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn describe(e: &jsonschema::ValidationError<'_>) -> String {
    use jsonschema::error::{TypeKind, ValidationErrorKind as K};
    let got = e.instance();
    match e.kind() {
        K::Enum { options } => format!("expected one of {options}, got {}", shown(got)),
        K::Constant { expected_value } => {
            format!("expected {expected_value}, got {}", shown(got))
        }
        K::Type { kind } => {
            let expected = match kind {
                TypeKind::Single(t) => t.to_string(),
                TypeKind::Multiple(set) => set
                    .iter()
                    .map(|t| t.to_string())
                    .collect::<Vec<_>>()
                    .join(" or "),
            };
            format!("expected {expected}, got {} {}", type_name(got), shown(got))
        }
        K::Required { property } => format!("missing required property {property}"),
        K::AdditionalProperties { unexpected } => {
            format!("unexpected properties {unexpected:?}")
        }
        _ => e.to_string(),
    }
}

/// The names a tool schema lists under `required` (strings only; none when the schema has no
/// such list). The gateway, the MCP proxy and the runtime feed them to the monitor, which
/// watches required arguments for placeholders.
pub fn required_properties(schema: &Value) -> Vec<String> {
    schema
        .get("required")
        .and_then(Value::as_array)
        .map(|r| {
            r.iter()
                .filter_map(Value::as_str)
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default()
}

/// Builds the message that asks the model to call `tool_name` again with the violations
/// fixed.
#[must_use]
pub fn reask_message(violations: &[Violation], tool_name: &str) -> String {
    let mut msg = format!("The arguments for `{tool_name}` do not match its schema:\n");
    for v in violations {
        msg.push_str("- ");
        msg.push_str(&v.to_string());
        msg.push('\n');
    }
    msg.push_str(&format!(
        "Call `{tool_name}` again with every field above corrected. \
         Reply with the JSON arguments only, no prose."
    ));
    msg
}
