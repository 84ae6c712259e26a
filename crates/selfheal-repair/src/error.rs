//! Why a repair was refused.
//!
//! Refusal is a normal outcome: when the only way to produce JSON would be to invent a key or
//! a value, the caller should re-ask the model instead. The error says where and why, so the
//! re-ask can be precise.

/// The input could not be turned into JSON without inventing data.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
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
    /// The JSON is broken in a way that cannot be repaired without inventing data.
    #[error("cannot repair JSON at byte {offset}: {reason}")]
    Unrepairable {
        /// Byte offset into the original input.
        offset: usize,
        /// What is wrong there.
        reason: String,
    },
}

impl RepairError {
    /// The byte offset the error points at, if any.
    #[must_use]
    pub fn offset(&self) -> Option<usize> {
        match self {
            Self::EmptyInput | Self::NoJson => None,
            Self::TooDeep { offset, .. } | Self::Unrepairable { offset, .. } => Some(*offset),
        }
    }
}
