//! Why a repair was refused.
//!
//! Refusal is a normal outcome: when the only way to produce JSON would be to invent a key or
//! a value, or to keep a value that was cut off, the caller should re-ask the model instead.
//! The error says where and why, so the re-ask can be precise ([`RepairError::reask_message`]).

use std::fmt;

/// Where truncated input was cut.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Cut {
    /// Inside a string value: its end is lost.
    String,
    /// Inside an object key.
    Key,
    /// Inside a number that cannot end there (`-`, `1.`, `1e`).
    Number,
    /// Inside a literal or a bare word (`tr`, `fals`, `celsi`).
    Literal,
    /// Inside an escape sequence (`\`, `\u00`).
    Escape,
    /// After a comma or an opening bracket: the next element or member is lost.
    Element,
}

impl fmt::Display for Cut {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::String => "inside a string",
            Self::Key => "inside a key",
            Self::Number => "inside a number",
            Self::Literal => "inside a word",
            Self::Escape => "inside an escape sequence",
            Self::Element => "where an element or member was due",
        })
    }
}

/// The input could not be turned into JSON without inventing or losing data.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RepairError {
    /// The input is empty or only whitespace.
    #[error("input is empty")]
    EmptyInput,
    /// The input holds no JSON value at all (plain prose).
    #[error("no JSON value found in the input")]
    NoJson,
    /// The input nests deeper than the configured limit.
    #[error("nesting deeper than {limit} levels at byte {offset}")]
    TooDeep {
        /// The configured depth limit ([`crate::RepairOptions::max_depth`]).
        limit: usize,
        /// Byte offset of the bracket that went over the limit.
        offset: usize,
    },
    /// The input stops in the middle of a value: closing it would keep a value the model
    /// never finished writing.
    #[error("the input was cut off {cut} at byte {offset}")]
    Truncated {
        /// Byte offset where the input ends (or where the cut-off value starts).
        offset: usize,
        /// What was being written when the input stopped.
        cut: Cut,
    },
    /// A key has no value (`{"a": }`, `{"a": , "b": 1}`, `{"a":` at the end).
    #[error("missing value for key {key:?} at byte {offset}", key = key.as_deref().unwrap_or(""))]
    MissingValue {
        /// Byte offset where the value should be.
        offset: usize,
        /// The key, when the value belongs to an object member.
        key: Option<String>,
    },
    /// A number with leading zeros (`0789`): reading it as a number would drop digits, and
    /// only a schema can say that it is a string. See [`crate::RepairOptions::leading_zero_strings`].
    #[error("number {text} at byte {offset} has leading zeros")]
    LeadingZeros {
        /// Byte offset of the number.
        offset: usize,
        /// The number as written.
        text: String,
    },
    /// Several top-level values follow each other; collecting them into an array is opt-in
    /// ([`crate::RepairOptions::multiple`]).
    #[error("several JSON values at the top level (the second at byte {offset})")]
    MultipleValues {
        /// Byte offset of the second value.
        offset: usize,
    },
    /// The JSON is broken in a way that cannot be repaired without inventing data.
    #[error("cannot repair JSON at byte {offset}: {reason}")]
    Unrepairable {
        /// Byte offset into the original input.
        offset: usize,
        /// What is wrong there.
        reason: String,
    },
}

/// Characters of context shown before the point where a refused input stops.
const CONTEXT_CHARS: usize = 40;

impl RepairError {
    /// The byte offset the error points at, if any.
    #[must_use]
    pub fn offset(&self) -> Option<usize> {
        match self {
            Self::EmptyInput | Self::NoJson => None,
            Self::TooDeep { offset, .. }
            | Self::Truncated { offset, .. }
            | Self::MissingValue { offset, .. }
            | Self::LeadingZeros { offset, .. }
            | Self::MultipleValues { offset }
            | Self::Unrepairable { offset, .. } => Some(*offset),
        }
    }

    /// Whether no other reading of the input may be tried after this error: the value that
    /// failed was found and is broken, so anything later would be a fragment of it.
    pub(crate) fn is_final(&self) -> bool {
        matches!(
            self,
            Self::TooDeep { .. }
                | Self::Truncated { .. }
                | Self::MultipleValues { .. }
                | Self::LeadingZeros { .. }
        )
    }

    /// Whether the refusal is because the input was cut off.
    #[must_use]
    pub fn is_truncation(&self) -> bool {
        matches!(self, Self::Truncated { .. })
    }

    /// The message that asks the model for `tool_name`'s arguments again, saying where and
    /// why `input` was refused (with the text just before that point).
    #[must_use]
    pub fn reask_message(&self, input: &str, tool_name: &str) -> String {
        let mut msg = match self {
            Self::Truncated { .. } => {
                format!("Your arguments for `{tool_name}` were cut off: {self}. Nothing was run.")
            }
            Self::EmptyInput => format!("Your arguments for `{tool_name}` were empty."),
            _ => format!("Your arguments for `{tool_name}` are not valid JSON: {self}."),
        };
        if let Some(offset) = self.offset() {
            let mut end = offset.min(input.len());
            while !input.is_char_boundary(end) {
                end -= 1;
            }
            let before = input.get(..end).unwrap_or_default();
            let start = before
                .char_indices()
                .rev()
                .nth(CONTEXT_CHARS - 1)
                .map_or(0, |(i, _)| i);
            let shown = before.get(start..).unwrap_or_default();
            if !shown.is_empty() {
                msg.push_str(&format!(" The text before that point: `{shown}`."));
            }
        }
        msg.push_str(&format!(
            " Call `{tool_name}` again with the complete arguments as one JSON object, no prose."
        ));
        msg
    }
}
