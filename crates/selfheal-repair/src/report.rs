//! The typed record of what a repair changed.
//!
//! Every change the parser makes to the model's text is recorded as a [`Repair`] so the
//! trace can say *why* a call needed healing, and so the healing-rate metric can be broken
//! down by cause. The kinds are an exhaustive enum: adding one is a compile error wherever
//! repairs are matched on.

use serde::Serialize;

/// One change applied to the input, with the byte offset in the original input where it
/// was applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Repair {
    /// What was repaired.
    pub kind: RepairKind,
    /// Byte offset into the original input. Inside a double-encoded document, the offset of
    /// the character where it is written in the input (see the crate docs on offsets).
    pub offset: usize,
}

/// The category of a repair. Serialised in `snake_case` (e.g. `"trailing_comma"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RepairKind {
    /// The JSON was found inside surrounding prose, which was discarded.
    ExtractedFromProse,
    /// Non-prose characters (a byte-order mark, `>>>`, …) before the JSON were discarded.
    LeadingGarbage,
    /// Text after the JSON value was discarded.
    TrailingGarbage,
    /// The JSON was taken from a markdown code fence.
    CodeFence,
    /// The JSON was taken from a tag wrapper such as `<tool_call>…</tool_call>`.
    TagWrapper,
    /// A JSONP wrapper `callback(…)` was removed.
    Jsonp,
    /// A MongoDB-style wrapper such as `NumberLong(2)` or `ISODate("…")` was removed.
    MongoWrapper,
    /// Several top-level values (newline-delimited JSON) were collected into an array.
    NdjsonToArray,
    /// A comma before a closing bracket was removed.
    TrailingComma,
    /// A doubled or leading comma was removed.
    ExtraComma,
    /// A missing comma between two elements or members was inserted.
    MissingComma,
    /// A missing colon between a key and its value was inserted.
    MissingColon,
    /// A single-quoted string was converted to a double-quoted one.
    SingleQuotes,
    /// A string in typographic quotes (`“…”`, `‘…’`) was converted.
    TypographicQuotes,
    /// A string in backticks (a JavaScript template literal, `` `…` ``) was converted to a
    /// double-quoted one. Its text is kept as written: double quotes and raw newlines in it
    /// are escaped in the output, and `${…}` is not interpolated.
    BacktickQuotes,
    /// A string closed with a different quote than it opened with.
    MismatchedQuote,
    /// A missing closing quote was inserted before a delimiter.
    MissingQuote,
    /// A quote inside a string that was not escaped was kept as text.
    UnescapedQuote,
    /// An object key without quotes was quoted.
    UnquotedKey,
    /// A bare word in value position was taken as a string.
    UnquotedString,
    /// A comment (`//`, `/* */` or `#`) was removed.
    Comment,
    /// A non-ASCII space (no-break space, em space, …) between tokens was removed.
    SpecialWhitespace,
    /// A Python literal (`True`, `False`, `None`) was converted.
    PythonLiteral,
    /// A JavaScript literal (`undefined`, `NaN`, `Infinity`) was converted to `null`.
    JsLiteral,
    /// A literal in the wrong case (`TRUE`, `Null`) was converted.
    LiteralCase,
    /// Closing brackets the input left off were added. By default only after a complete
    /// last value (`{"a": "x"`), where no data was lost; with
    /// [`RepairOptions::salvage`](crate::RepairOptions::salvage) also after a cut string.
    ClosedTruncated,
    /// Salvage only: an incomplete trailing member or element of truncated output (a key
    /// without a value, a half-written literal) was dropped.
    DroppedIncomplete,
    /// A raw newline or control character inside a string was escaped.
    EscapedControlChar,
    /// An invalid escape sequence was kept literally or replaced.
    InvalidEscape,
    /// The value was JSON encoded inside a JSON string and was decoded.
    DoubleEncoded,
    /// String concatenation (`"a" + "b"`) was joined.
    StringConcatenation,
    /// An ellipsis (`...`) standing for omitted elements was removed.
    Ellipsis,
    /// A closing bracket with no matching opening bracket was removed.
    RedundantClosing,
    /// A closing bracket of the wrong kind was taken as the right one, or a missing closing
    /// bracket was inserted before an outer one or before the next object of an array.
    MismatchedBracket,
    /// A number with a leading `+`, or a leading or trailing dot, was normalised (`+3`,
    /// `.5`, `1.`); salvage also strips leading zeros.
    NumberFormat,
    /// A number with leading zeros (`0789`) was kept as the string it spells; only with
    /// [`RepairOptions::leading_zero_strings`](crate::RepairOptions::leading_zero_strings),
    /// which schema-guided repair sets so that the schema decides.
    LeadingZeroString,
    /// An object's opening `{` was missing (`"a": 1}`): added only when the rest is exactly
    /// one valid object's members and its closing brace.
    MissingOpeningBrace,
    /// A Python tuple `(1, 2)` was read as an array; `(x)` without a comma as `x`.
    PythonTuple,
}

impl RepairKind {
    /// A short human-readable description of the repair.
    #[must_use]
    pub fn describe(self) -> &'static str {
        match self {
            Self::ExtractedFromProse => "extracted JSON from surrounding prose",
            Self::LeadingGarbage => "removed leading garbage",
            Self::TrailingGarbage => "removed trailing garbage",
            Self::CodeFence => "extracted JSON from a markdown code fence",
            Self::TagWrapper => "extracted JSON from a tag wrapper",
            Self::Jsonp => "removed a JSONP wrapper",
            Self::MongoWrapper => "removed a MongoDB-style wrapper",
            Self::NdjsonToArray => "collected newline-delimited values into an array",
            Self::TrailingComma => "removed a trailing comma",
            Self::ExtraComma => "removed an extra comma",
            Self::MissingComma => "inserted a missing comma",
            Self::MissingColon => "inserted a missing colon",
            Self::SingleQuotes => "replaced single quotes",
            Self::TypographicQuotes => "replaced typographic quotes",
            Self::BacktickQuotes => "replaced backtick quotes",
            Self::MismatchedQuote => "fixed a mismatched closing quote",
            Self::MissingQuote => "inserted a missing closing quote",
            Self::UnescapedQuote => "kept an unescaped quote inside a string",
            Self::UnquotedKey => "quoted an unquoted key",
            Self::UnquotedString => "quoted a bare word value",
            Self::Comment => "removed a comment",
            Self::SpecialWhitespace => "removed a non-ASCII space between tokens",
            Self::PythonLiteral => "converted a Python literal",
            Self::JsLiteral => "converted a JavaScript literal to null",
            Self::LiteralCase => "fixed the case of a literal",
            Self::ClosedTruncated => "closed truncated output",
            Self::DroppedIncomplete => "dropped an incomplete trailing member",
            Self::EscapedControlChar => "escaped a raw control character in a string",
            Self::InvalidEscape => "fixed an invalid escape sequence",
            Self::DoubleEncoded => "decoded JSON that was encoded inside a string",
            Self::StringConcatenation => "joined concatenated strings",
            Self::Ellipsis => "removed an ellipsis",
            Self::RedundantClosing => "removed a redundant closing bracket",
            Self::MismatchedBracket => "fixed a mismatched or missing closing bracket",
            Self::NumberFormat => "normalised a number",
            Self::LeadingZeroString => "kept a number with leading zeros as a string",
            Self::MissingOpeningBrace => "added a missing opening brace",
            Self::PythonTuple => "read a Python tuple as an array",
        }
    }
}
