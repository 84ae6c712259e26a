//! Tool-call arguments: the one non-corrupting path every front-end uses.
//!
//! The gateway, the MCP proxy and the runtime all receive arguments a model wrote for a tool
//! with a JSON Schema. They must never pass on a value the model did not write. This module
//! is the whole decision, so that all three behave alike:
//!
//! 1. Arguments that parse and validate are returned **untouched** (`changed == false`).
//! 2. Otherwise the text is repaired with the default, non-lossy options (a cut-off call is
//!    refused, never closed), with numbers with leading zeros read as strings and a
//!    double-encoded object decoded, so the schema decides whether those fit.
//! 3. The value is coerced where that is safe and validated; what is still wrong is a
//!    refusal with the re-ask text for the model.
//!
//! Salvage mode is never used here.

use serde_json::Value;

use crate::{
    Coercion, Literals, LostDigits, Repair, RepairError, RepairOptions, SchemaGuide, Violation,
    reask_message, repair_with,
};

/// How the model's answer ended, when the caller knows (an OpenAI-style `finish_reason`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ending {
    /// Not known (a CLI, a log): a number where the text stops inside an unclosed value is
    /// refused, since more digits may have followed.
    Unknown,
    /// The model finished on its own (`stop`, `tool_calls`): text that stops inside an
    /// unclosed value only lacks its closing brackets.
    Finished,
    /// The answer was cut by the output limit (`length`): only arguments that are JSON as
    /// written are taken; anything else is refused, never repaired into a call.
    CutOff,
}

impl Ending {
    /// The ending an OpenAI-style `finish_reason` says.
    #[must_use]
    pub fn from_finish_reason(reason: Option<&str>) -> Self {
        match reason {
            Some("length") => Self::CutOff,
            Some("stop" | "tool_calls" | "function_call") => Self::Finished,
            _ => Self::Unknown,
        }
    }
}

/// Arguments that can be passed to the tool.
#[derive(Debug, Clone, PartialEq)]
pub struct Arguments {
    /// The arguments to send.
    pub value: Value,
    /// Repairs of the text (empty when it parsed).
    pub repairs: Vec<Repair>,
    /// Schema coercions (empty when it validated as written).
    pub coercions: Vec<Coercion>,
    /// Whether `value` differs from what the text says (false: forward the text as is).
    pub changed: bool,
    /// Number literals of the text that `value` cannot hold exactly, kept by
    /// [`Arguments::to_json`].
    pub literals: Literals,
}

impl Arguments {
    /// The arguments as JSON text to send when [`Arguments::changed`] (otherwise send the
    /// text as the model wrote it): compact, with every number as the model wrote it.
    ///
    /// # Errors
    ///
    /// [`LostDigits`] when a number with more digits than a double holds was changed by the
    /// schema's coercion: passing it on would send digits the model never wrote.
    pub fn to_json(&self) -> Result<String, LostDigits> {
        self.literals.render(&self.value)
    }
}

/// Why arguments cannot be passed on.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ArgumentsError {
    /// The text is not JSON and cannot be repaired without inventing or losing data.
    #[error(transparent)]
    Unreadable(#[from] RepairError),
    /// The value does not fit the tool's schema.
    #[error("{} schema violation(s)", .0.len())]
    Invalid(Vec<Violation>),
    /// The answer was cut by the output limit and the arguments are not JSON as written.
    #[error("the arguments were cut off by the output length limit")]
    CutOff,
}

impl ArgumentsError {
    /// The message that asks the model to call `tool_name` again; `raw` is the text it sent.
    #[must_use]
    pub fn reask_message(&self, raw: &str, tool_name: &str) -> String {
        match self {
            Self::Unreadable(e) => e.reask_message(raw, tool_name),
            Self::Invalid(violations) => reask_message(violations, tool_name),
            Self::CutOff => format!(
                "Your call to `{tool_name}` was cut off by the output length limit, so it was not run. \
                 Call `{tool_name}` again with the complete arguments as one JSON object, and keep it short."
            ),
        }
    }
}

/// Checks and, where safe, repairs the arguments text `raw` a model wrote for a tool whose
/// schema is `guide` (none: any JSON value is accepted). Empty text stands for `{}`.
/// `ending` is how the model's answer ended, when known.
///
/// # Errors
///
/// [`ArgumentsError`] when the arguments cannot be used as they are or safely repaired.
pub fn repair_arguments(
    raw: &str,
    guide: Option<&SchemaGuide>,
    ending: Ending,
) -> Result<Arguments, ArgumentsError> {
    let options = RepairOptions::default()
        .with_leading_zero_strings(guide.is_some())
        .with_input_complete(ending == Ending::Finished)
        .with_decode_strings(guide.is_some_and(SchemaGuide::wants_container));
    let (value, repairs, parsed) = if let Ok(v) = serde_json::from_str::<Value>(raw) {
        (v, Vec::new(), true)
    } else if ending == Ending::CutOff {
        return Err(ArgumentsError::CutOff);
    } else if raw.trim().is_empty() {
        (Value::Object(serde_json::Map::new()), Vec::new(), false)
    } else {
        let r = repair_with(raw, &options)?;
        let mut a = check_value(r.value, r.repairs, true, guide)?;
        a.literals = r.literals;
        return Ok(a);
    };
    let mut a = check_value(value, repairs, !parsed, guide)?;
    if a.changed {
        // Valid text changed by the schema: its long literals are kept when it is sent.
        a.literals = crate::literals_of_valid(raw, &options);
    }
    Ok(a)
}

/// As [`repair_arguments`] for arguments that arrived as a JSON value (MCP's
/// `tools/call`): coerced where safe and validated, untouched when valid.
///
/// # Errors
///
/// [`ArgumentsError::Invalid`] when the value does not fit the schema.
pub fn check_arguments(
    value: Value,
    guide: Option<&SchemaGuide>,
) -> Result<Arguments, ArgumentsError> {
    check_value(value, Vec::new(), false, guide)
}

fn check_value(
    value: Value,
    repairs: Vec<Repair>,
    changed: bool,
    guide: Option<&SchemaGuide>,
) -> Result<Arguments, ArgumentsError> {
    let Some(guide) = guide else {
        return Ok(Arguments {
            value,
            repairs,
            coercions: Vec::new(),
            changed,
            literals: Literals::default(),
        });
    };
    let outcome = guide.apply(value);
    if !outcome.violations.is_empty() {
        return Err(ArgumentsError::Invalid(outcome.violations));
    }
    Ok(Arguments {
        changed: changed || !outcome.coercions.is_empty(),
        value: outcome.value,
        repairs,
        coercions: outcome.coercions,
        literals: Literals::default(),
    })
}
