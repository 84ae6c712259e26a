//! JSON extraction, repair and schema-guided coercion for model output and tool arguments.
//!
//! Models emit almost-JSON. Repairing it before re-asking is the cheapest recovery there is
//! (SPEC §2): no tokens, no latency. This crate does it in three steps, each reported so the
//! trace can say what was healed:
//!
//! ```text
//!  model text ──► extract ──► repair ──► Repaired { value, repairs }
//!                 (fences,    (lenient,        │
//!                  tags,       iterative,      ▼
//!                  prose)      linear)    SchemaGuide::apply ──► Outcome { value, coercions, violations }
//!                                                                      │ violations left?
//!                                                                      ▼
//!                                                               reask_message(...) ──► model
//! ```
//!
//! # Example
//!
//! ```
//! use selfheal_repair::{repair, RepairKind, SchemaGuide, reask_message};
//! use serde_json::json;
//!
//! let text = "Sure! ```json\n{'city': 'Paris', unit: \"celsius\", days: \"3\",}\n```";
//! let repaired = repair(text)?;
//! assert_eq!(repaired.value, json!({"city": "Paris", "unit": "celsius", "days": "3"}));
//! assert!(repaired.repairs.iter().any(|r| r.kind == RepairKind::TrailingComma));
//!
//! let schema = json!({
//!     "type": "object",
//!     "properties": {
//!         "city": {"type": "string"},
//!         "unit": {"enum": ["c", "f"]},
//!         "days": {"type": "integer", "default": 1}
//!     },
//!     "required": ["city", "unit"]
//! });
//! let guide = SchemaGuide::new(&schema)?;
//! let outcome = guide.apply(repaired.value);
//! assert_eq!(outcome.value["days"], json!(3)); // "3" coerced to 3
//! assert_eq!(
//!     outcome.violations[0].to_string(),
//!     r#"at /unit: expected one of ["c","f"], got "celsius""#
//! );
//! let reask = reask_message(&outcome.violations, "get_weather");
//! assert!(reask.contains("get_weather"));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # What is repaired
//!
//! Valid JSON takes a fast path through `serde_json` and comes back with no repairs. Anything
//! else goes through a single-pass lenient parser. Each row is a [`RepairKind`]:
//!
//! | Kind | Input | Output |
//! |---|---|---|
//! | `ExtractedFromProse` | `The answer is {"a": 1}. Done.` | `{"a":1}` |
//! | `LeadingGarbage` / `TrailingGarbage` | `>>> {"a": 1} <<<` | `{"a":1}` |
//! | `CodeFence` | ` ```json {"a": 1} ``` ` | `{"a":1}` |
//! | `TagWrapper` | `<tool_call>{"a": 1}</tool_call>` | `{"a":1}` |
//! | `Jsonp` | `callback({"a": 1});` | `{"a":1}` |
//! | `MongoWrapper` | `{"n": NumberLong(2), "d": ISODate("2024-01-01")}` | `{"n":2,"d":"2024-01-01"}` |
//! | `TrailingComma` | `[1, 2,]` | `[1,2]` |
//! | `ExtraComma` | `[1,,2]` | `[1,2]` |
//! | `MissingComma` | `{"a": 1 "b": 2}` | `{"a":1,"b":2}` |
//! | `MissingColon` | `{"a" 1}` | `{"a":1}` |
//! | `SingleQuotes` | `{'a': 'b'}` | `{"a":"b"}` |
//! | `TypographicQuotes` | `{“a”: “b”}` | `{"a":"b"}` |
//! | `BacktickQuotes` | ``{`a`: `say "b"`}`` | `{"a":"say \"b\""}` |
//! | `MismatchedQuote` | `{"a': 1}` | `{"a":1}` |
//! | `MissingQuote` | `{"a": "b, "c": 1}` | `{"a":"b","c":1}` |
//! | `UnescapedQuote` | `{"a": "say "hi" now"}` | `{"a":"say \"hi\" now"}` |
//! | `UnescapedQuote` (markup) | `{"a": "<b id="x">"}` | `{"a":"<b id=\"x\">"}` |
//! | `UnescapedQuote` (one, proven by the next key) | `{"a": "v"alue", "b": 1}` | `{"a":"v\"alue","b":1}` |
//! | `UnescapedQuote` (a quoted token) | `{"q": "Windows "10""}` | `{"q":"Windows \"10\""}` |
//! | `UnescapedQuote` (a quoted `$`-word) | `{"cmd": "echo "$HOME""}` | `{"cmd":"echo \"$HOME\""}` |
//! | `MissingQuote` (opening) | `{name": "Ann"}` | `{"name":"Ann"}` |
//! | `UnquotedKey` | `{a: 1}` | `{"a":1}` |
//! | `UnquotedString` | `{"unit": celsius}` | `{"unit":"celsius"}` |
//! | `Comment` | `{"a": 1 /* c */} // c` | `{"a":1}` |
//! | `SpecialWhitespace` | `{"a":`*no-break space*`1}` | `{"a":1}` |
//! | `PythonLiteral` | `[True, False, None]` | `[true,false,null]` |
//! | `JsLiteral` | `[undefined, NaN, -Infinity]` | `[null,null,null]` |
//! | `LiteralCase` | `[TRUE, Null]` | `[true,null]` |
//! | `ClosedTruncated` | `{"a": [1, {"b": "hello"` | `{"a":[1,{"b":"hello"}]}` |
//! | `EscapedControlChar` | `{"a": "line` newline `two"}` | `{"a":"line\ntwo"}` |
//! | `InvalidEscape` | `{"p": "C:\Users"}` | `{"p":"C:\\Users"}` |
//! | `StringConcatenation` | `{"a": "x" + "y"}` | `{"a":"xy"}` |
//! | `Ellipsis` | `[1, 2, ...]` | `[1,2]` |
//! | `RedundantClosing` | `{"a": 1}}` | `{"a":1}` |
//! | `MismatchedBracket` | `{"a": [1, 2}` | `{"a":[1,2]}` |
//! | `MismatchedBracket` (brace before the next element) | `[{"i": 1 {"i": 2}]` | `[{"i":1},{"i":2}]` |
//! | `NumberFormat` | `[1., .5, +3, 1_000]` | `[1.0,0.5,3,1000]` |
//! | `MissingOpeningBrace` | `"a": 1}` | `{"a":1}` |
//! | `DoubleEncoded` (escaped quotes) | `{\"a\": \"b\"}` | `{"a":"b"}` |
//! | `UnquotedString` (regex literal) | `{"re": /a+b/i}` | `{"re":"/a+b/i"}` |
//! | `UnquotedString` (number-like) | `{"v": 0.0.1, "d": 2024-01-01}` | `{"v":"0.0.1","d":"2024-01-01"}` |
//!
//! The table is checked by the `documented_examples_hold` test. Opt-in, through
//! [`RepairOptions`]: `NdjsonToArray` (`multiple`: `{"a":1}` newline `{"a":2}` →
//! `[{"a":1},{"a":2}]`), `DoubleEncoded` for a whole string (`decode_strings`:
//! `"{\"a\": 1}"` → `{"a":1}`), `LeadingZeroString` (`leading_zero_strings`: `0789` →
//! `"0789"`), and `DroppedIncomplete` (`salvage`).
//!
//! # What is refused
//!
//! The rule is: **never return a value the input does not hold** — no invented key or
//! value, no value cut short, no fragment, no digits dropped. Valid JSON comes back exactly
//! as written. The parser refuses, with a [`RepairError`] that says where and why, when
//!
//! - the input was cut off inside a string, key, literal, escape or number, or after a comma
//!   or an opening bracket ([`RepairError::Truncated`], at the byte where it stops). Closing
//!   brackets left off after a *complete* last value (`{"a": "x"`) are still repaired; a
//!   number where unclosed input ends (`{"year": 20`) counts as complete only with
//!   [`RepairOptions::input_complete`], which a caller sets when it knows the model finished
//!   its answer, or when a space or tab follows its digits (`{"year": 2018 `: whoever wrote
//!   the space had finished the number; a final line break alone proves nothing);
//! - a key has no value (`{"a": }`, `{"a": , "b": 1}`, `{"a":` at the end:
//!   [`RepairError::MissingValue`]);
//! - several top-level values follow each other ([`RepairError::MultipleValues`]) — an
//!   array is built only with [`RepairOptions::multiple`];
//! - a number has leading zeros ([`RepairError::LeadingZeros`]);
//! - a value that looks like JSON fails part-way: nothing later is taken in its place, and
//!   two values found in prose, fences or tags are refused unless
//!   [`RepairOptions::multiple`] asks for an array;
//! - the reading is a guess: an unpaired quote inside a string (`"v"alue"` before a closing
//!   brace, `["a" b", "c"]`; it is kept as text only where what follows proves the string
//!   ends at the next quote — the next member's key and colon, `{"a": "v"alue", "b": 1}`, or
//!   the end of the input after a root string), a raw line break
//!   right before a closing quote, a line comment that would swallow the rest of an open
//!   value (or holds a closing bracket), a block comment never closed that could hold data
//!   (a comment of plain words where the input ends takes nothing), an exponent without
//!   digits (`1e }`), brackets inside a bare value that do not pair up (`{"a": b(c]}`), a
//!   `\u` escape that names no character (`\uZ000`, a lone surrogate), an empty bracket
//!   closed by another kind (`[{]`; `{"a": [}` has one reading, `{"a":[]}`), a parenthesis
//!   closed by another bracket, a value string closed by a quote of
//!   another kind, a string open up to the closing brace;
//! - the input is prose with no JSON in it ([`RepairError::NoJson`]) or is empty (with
//!   [`RepairOptions::bare_text`], as `selfheal repair` reads, one line of bare text such as
//!   `hello world` is the string it spells);
//! - a token cannot be read as any value (`{"a": @}`), a number is out of range (`1e999`);
//! - a wrapper call has several arguments (`Date(2024, 1, 2)`);
//! - nesting exceeds [`RepairOptions::max_depth`] ([`RepairError::TooDeep`]);
//! - a backtick string is never closed (``{"a": `hel``): such a backtick is likelier the end
//!   of markdown inline code around the JSON than a truncated template literal.
//!
//! Bare words are read as strings only after a colon in an object, or in an array when the
//! input itself starts with the JSON — never in a bracketed phrase found in prose. Backtick
//! strings are read only as a key or a value inside an object, or inside an array when the
//! input itself starts with the JSON: elsewhere backticks are markdown inline code around the
//! JSON (`` `{"a": 1}` `` is `{"a":1}`, the backticks discarded as garbage).
//!
//! A quote inside a string value that is not followed by a delimiter closes the string only
//! where what follows can be the next member or element: in an object, a key and its colon
//! (`{"a": "x" "b": 1}` lacks a comma); elsewhere, after a blank, another string, object, array
//! or a number followed by a delimiter (`["a" "b"]`). Otherwise — a token written against the
//! quote, whatever its shape (`"10"`, `"$HOME"`, `"[1, 2]"`) — the quote is text. **No key is
//! ever made up from a string's text.** Where both readings give a value (`["a""b"]`, `","`
//! inside a string that already holds quotes), the input is refused.
//!
//! # Numbers and valid input
//!
//! Valid input needs no repair ([`Repaired::was_repaired`] is false): callers pass its text on
//! as written (the gateway, the runtime and `selfheal repair` do), so member order, spacing and
//! number spelling stay byte for byte. A repaired value is turned back into text by
//! [`Repaired::to_json`] / [`Arguments::to_json`], which write every number with more digits
//! than an `f64` carries (`1180591620717411303424`) as the input wrote it ([`Literals`]); a
//! number is never re-encoded through `f64`.
//!
//! # Offsets
//!
//! Every [`Repair`] carries the byte offset in the input where it applies. For a
//! double-encoded document (`"{\"a\": 1,}"`), the repairs made inside it are reported where
//! the character they concern is written in the input — the trailing comma above at byte 10,
//! through the escaped quotes before it; a character written as an escape is pointed at by
//! its backslash. Where the decoded text is not the text of one string literal (literals
//! joined with `+`, a document encoded twice), offsets past the point where the two can be
//! aligned fall back to the start of the string.
//!
//! With [`RepairOptions::salvage`] truncated output is closed instead of refused: an open
//! string is closed with the text it has, a member with no value yet (`{"a": 1, "b":`) or a
//! half-written literal (`tr`) is dropped and reported as [`RepairKind::DroppedIncomplete`].
//! That mode is lossy by definition; the gateway, the MCP proxy and the runtime never use
//! it for tool arguments ([`repair_arguments`] is their one path).
//!
//! # Limits
//!
//! The parser is iterative, so input depth never overflows its stack; it stops at
//! [`RepairOptions::max_depth`] (default [`DEFAULT_MAX_DEPTH`]) because the *result* — a
//! `serde_json::Value` — is dropped, serialised and validated recursively.
//!
//! Memory is linear in the input with a small constant: a parse lists its first 10,000 repairs
//! and counts the rest ([`Repaired::unlisted`]), so input that needs a repair at every byte (50
//! MB of `"` or `,`) cannot grow the list past the input. `selfheal repair` peaks at about 3.1
//! times its input on such inputs and refuses input over `--max-bytes` (256 MiB by default)
//! with exit code 2 before parsing it.

mod arguments;
mod encoded;
mod error;
mod extract;
mod literal;
mod parser;
mod report;
pub mod schema;
mod text_calls;

pub use arguments::{Arguments, ArgumentsError, Ending, check_arguments, repair_arguments};
pub use error::{Cut, RepairError};
pub use literal::{Literals, LostDigits};
pub use report::{Repair, RepairKind};
pub use schema::{
    Coercion, CoercionKind, Outcome, SchemaError, SchemaGuide, Violation, reask_message,
    required_properties,
};
pub use text_calls::{TextCall, TextCalls, find_text_calls};

use serde_json::Value;

/// Default nesting limit. `serde_json::Value` drops, serialises and validates recursively;
/// this keeps all three well inside a 2 MiB thread stack.
pub const DEFAULT_MAX_DEPTH: usize = 1_000;

/// `serde_json`'s own recursion limit: deeper valid input falls through to our parser.
const SERDE_DEPTH: usize = 128;

/// How many layers of JSON-inside-a-string are decoded.
const MAX_DECODE_LAYERS: usize = 4;

/// Options for [`repair_with`]. The defaults never return a value the input does not hold:
/// every option that could is opt-in and off.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct RepairOptions {
    /// The deepest nesting accepted; deeper input is refused with [`RepairError::TooDeep`].
    pub max_depth: usize,
    /// Lossy mode: truncated input is closed, its unfinished last member dropped and a cut
    /// string kept as far as it goes, instead of refused with [`RepairError::Truncated`] or
    /// [`RepairError::MissingValue`]; leading zeros are stripped. The repairs say so
    /// ([`RepairKind::ClosedTruncated`], [`RepairKind::DroppedIncomplete`]). Never for tool
    /// arguments.
    pub salvage: bool,
    /// Collect several top-level values (newline-delimited JSON, `{..}{..}`, `1, 2, 3`) into
    /// an array instead of refusing with [`RepairError::MultipleValues`].
    pub multiple: bool,
    /// Read a number with leading zeros (`0789`) as the string it spells instead of refusing
    /// with [`RepairError::LeadingZeros`]. Schema-guided repair ([`repair_arguments`]) sets
    /// it: the schema then accepts the string only where it allows a string.
    pub leading_zero_strings: bool,
    /// Decode a top-level string that holds a JSON object or array (`"{\"a\": 1}"`).
    /// Schema-guided repair sets it when the schema wants an object or array there.
    pub decode_strings: bool,
    /// The caller knows the input is the model's whole answer (`finish_reason: "stop"`): a
    /// number that ends where the input ends, inside an unclosed value, is complete
    /// (`{"days": 3` lacks only its brace). Off, such a number is refused as
    /// [`RepairError::Truncated`] (`{"year": 20` may have been `2018`) unless a space or
    /// tab follows its digits.
    pub input_complete: bool,
    /// Read input that is one line of bare text and nothing else (`hello world`, `ES2020`,
    /// `0.0.1`) as the string it spells, as npm `jsonrepair` does, instead of refusing with
    /// [`RepairError::NoJson`]. Only text with a letter or digit and none of the characters
    /// that make JSON or prose structure (brackets, quotes, `:`, `,`, `;`, `<`, `>`, `#`,
    /// `/`, `\`, `=`, parentheses) qualifies, so nothing is dropped or added but the quotes.
    /// Off by default: where a tool result or an answer should be JSON (the gateway, the
    /// runtime, the benchmark), plain text is a fault. `selfheal repair` sets it.
    pub bare_text: bool,
}

impl Default for RepairOptions {
    fn default() -> Self {
        Self {
            max_depth: DEFAULT_MAX_DEPTH,
            salvage: false,
            multiple: false,
            leading_zero_strings: false,
            decode_strings: false,
            input_complete: false,
            bare_text: false,
        }
    }
}

impl RepairOptions {
    /// The lossy mode ([`RepairOptions::salvage`]) with the other defaults.
    #[must_use]
    pub fn salvage() -> Self {
        Self {
            salvage: true,
            ..Self::default()
        }
    }

    /// Sets [`RepairOptions::salvage`].
    #[must_use]
    pub fn with_salvage(mut self, on: bool) -> Self {
        self.salvage = on;
        self
    }

    /// Sets [`RepairOptions::multiple`].
    #[must_use]
    pub fn with_multiple(mut self, on: bool) -> Self {
        self.multiple = on;
        self
    }

    /// Sets [`RepairOptions::leading_zero_strings`].
    #[must_use]
    pub fn with_leading_zero_strings(mut self, on: bool) -> Self {
        self.leading_zero_strings = on;
        self
    }

    /// Sets [`RepairOptions::decode_strings`].
    #[must_use]
    pub fn with_decode_strings(mut self, on: bool) -> Self {
        self.decode_strings = on;
        self
    }

    /// Sets [`RepairOptions::input_complete`].
    #[must_use]
    pub fn with_input_complete(mut self, on: bool) -> Self {
        self.input_complete = on;
        self
    }

    /// Sets [`RepairOptions::bare_text`].
    #[must_use]
    pub fn with_bare_text(mut self, on: bool) -> Self {
        self.bare_text = on;
        self
    }

    /// Sets [`RepairOptions::max_depth`].
    #[must_use]
    pub fn with_max_depth(mut self, max_depth: usize) -> Self {
        self.max_depth = max_depth;
        self
    }
}

/// A repaired value and the repairs that produced it (empty when the input was valid JSON).
#[derive(Debug, Clone, PartialEq)]
pub struct Repaired {
    /// The parsed value.
    pub value: Value,
    /// What was changed, in input order.
    pub repairs: Vec<Repair>,
    /// Number literals `value` cannot hold exactly (more digits than an `f64` carries),
    /// which [`Repaired::to_json`] writes back as written.
    pub literals: Literals,
    /// Repairs made but not listed in `repairs`: a parse lists its first 10,000, so input
    /// that needs a repair at every byte cannot make the list outgrow the input.
    pub unlisted: usize,
}

impl Repaired {
    /// Whether the input needed any repair.
    #[must_use]
    pub fn was_repaired(&self) -> bool {
        !self.repairs.is_empty()
    }

    /// The repaired value as compact JSON text, its numbers as the input wrote them. Input
    /// that needed no repair ([`Repaired::was_repaired`] false) is best passed on as it was
    /// written: this text re-orders object members.
    ///
    /// # Errors
    ///
    /// [`LostDigits`] when a long number literal can no longer be placed (never for the
    /// value as returned by [`repair_with`]).
    pub fn to_json(&self) -> Result<String, LostDigits> {
        self.literals.render(&self.value)
    }
}

/// Extracts and repairs the JSON in `input` with the default options.
///
/// # Errors
///
/// Returns a [`RepairError`] when the input holds no JSON or cannot be repaired without
/// inventing data; see the crate docs for the rules.
pub fn repair(input: &str) -> Result<Repaired, RepairError> {
    repair_with(input, &RepairOptions::default())
}

/// Extracts and repairs the JSON in `input`.
///
/// # Errors
///
/// As [`repair`].
pub fn repair_with(input: &str, options: &RepairOptions) -> Result<Repaired, RepairError> {
    let first = input.len() - input.trim_start().len();
    if first == input.len() {
        return Err(RepairError::EmptyInput);
    }
    let (mut out, literal) = if options.max_depth >= SERDE_DEPTH
        && may_be_valid(input)
        && let Ok(value) = serde_json::from_str::<Value>(input)
    {
        // Valid JSON: a string is the whole input, from its first to its last quote.
        let literal = value.is_string().then(|| (first, input.trim_end().len()));
        let out = Repaired {
            value,
            repairs: Vec::new(),
            literals: literals_of_valid(input, options),
            unlisted: 0,
        };
        (out, literal)
    } else if let Some((value, literals)) = missing_opening_brace(input, options) {
        let out = Repaired {
            value,
            repairs: vec![Repair {
                kind: RepairKind::MissingOpeningBrace,
                offset: first,
            }],
            literals,
            unlisted: 0,
        };
        (out, None)
    } else {
        match extract::parse_document(input, options) {
            Ok(found) => {
                let out = Repaired {
                    value: found.value,
                    repairs: found.repairs,
                    literals: found.literals,
                    unlisted: found.unlisted,
                };
                (out, found.root_string)
            }
            Err(RepairError::MultipleValues { offset }) => {
                match object_closed_early(input, offset, options) {
                    Some(out) => (out, None),
                    None => return Err(RepairError::MultipleValues { offset }),
                }
            }
            Err(RepairError::NoJson) if options.bare_text => match bare_text(input) {
                Some(out) => (out, None),
                None => return Err(RepairError::NoJson),
            },
            Err(e) => return Err(e),
        }
    };
    if options.decode_strings {
        decode_layers(&mut out, input, first, literal, options);
    }
    out.repairs.sort_by_key(|r| r.offset);
    Ok(out)
}

/// The long number literals of `text`, valid JSON: none unless it holds a run of more
/// digits than an `f64` carries, and then those the lenient parser finds (it reads valid JSON
/// as `serde_json` does). A sparse scan of the bytes otherwise, so the valid fast path stays
/// fast.
pub(crate) fn literals_of_valid(text: &str, options: &RepairOptions) -> Literals {
    if !literal::has_long_digit_run(text) {
        return Literals::default();
    }
    extract::parse_document(text, options)
        .map(|found| found.literals)
        .unwrap_or_default()
}

/// `hello world`: input that is one line of bare text, read as the string it spells
/// ([`RepairOptions::bare_text`]). `None` when the text has a line break, no letter or digit,
/// or any character that could be JSON or prose structure: then it is prose, or broken JSON
/// that must be refused for its own reason.
fn bare_text(input: &str) -> Option<Repaired> {
    const STRUCTURE: &[char] = &[
        '{', '}', '[', ']', '(', ')', '"', '\'', '`', '\u{b4}', '\u{2018}', '\u{2019}', '\u{201c}',
        '\u{201d}', ':', ',', ';', '<', '>', '#', '/', '\\', '=', '\n', '\r',
        // Invisible marks (a byte-order mark, zero-width spaces) would end up in the string.
        '\u{feff}', '\u{200b}', '\u{200c}', '\u{200d}', '\u{2060}',
    ];
    let t = input.trim();
    if t.contains(STRUCTURE)
        || !t.chars().any(char::is_alphanumeric)
        || t.chars().any(char::is_control)
    {
        return None;
    }
    let first = input.len() - input.trim_start().len();
    Some(Repaired {
        value: Value::String(t.to_owned()),
        repairs: vec![Repair {
            kind: RepairKind::UnquotedString,
            offset: first,
        }],
        literals: Literals::default(),
        unlisted: 0,
    })
}

/// `"a": 1, "b": [2]}`: members of an object and its closing brace, with the opening brace
/// missing. Taken only when adding that one brace makes the input valid JSON.
fn missing_opening_brace(input: &str, options: &RepairOptions) -> Option<(Value, Literals)> {
    let t = input.trim_ascii();
    if !(t.starts_with('"') && t.ends_with('}')) {
        return None;
    }
    let mut text = String::with_capacity(t.len() + 1);
    text.push('{');
    text.push_str(t);
    if !serde_json::from_str::<serde::de::IgnoredAny>(&text).is_ok_and(|_| text.starts_with('{')) {
        return None;
    }
    // Valid JSON now: read by the lenient parser too, which keeps long number literals.
    let found = extract::parse_document(&text, options).ok()?;
    (found.value.is_object() && found.repairs.is_empty()).then_some((found.value, found.literals))
}

/// `{"a": 1}, "b": 2}`: an object closed one brace too early, its members going on after
/// a comma up to the real closing brace. Read as one object when the text before `second`
/// (where the second "value" starts) is an object, the text after it is exactly the members
/// and closing brace of another, and no key is written twice.
fn object_closed_early(input: &str, second: usize, options: &RepairOptions) -> Option<Repaired> {
    let head = input.get(..second)?.trim_end();
    let tail = input.get(second..)?.trim_start();
    let tail = tail.strip_prefix(',').unwrap_or(tail).trim_start();
    let t = tail.trim_end();
    if !head.trim_start().starts_with('{')
        || !head.ends_with('}')
        || !(t.starts_with('"') || t.starts_with('\''))
        || !t.ends_with('}')
    {
        return None;
    }
    let first = extract::parse_document(head, options).ok()?;
    let mut rest_text = String::with_capacity(t.len() + 1);
    rest_text.push('{');
    rest_text.push_str(t);
    let rest = extract::parse_document(&rest_text, options).ok()?;
    let garbage = |r: &Repair| {
        matches!(
            r.kind,
            RepairKind::ExtractedFromProse
                | RepairKind::TrailingGarbage
                | RepairKind::LeadingGarbage
                | RepairKind::ClosedTruncated
        )
    };
    if first.repairs.iter().any(garbage) || rest.repairs.iter().any(garbage) {
        return None;
    }
    let (Value::Object(mut map), Value::Object(more)) = (first.value, rest.value) else {
        return None;
    };
    for (k, v) in more {
        if map.contains_key(&k) {
            return None;
        }
        map.insert(k, v);
    }
    let mut repairs = first.repairs;
    let mut literals = first.literals;
    literals.extend(rest.literals);
    repairs.push(Repair {
        kind: RepairKind::RedundantClosing,
        offset: head.len() - 1,
    });
    // `rest_text` is `{` followed by `tail`, which ends the input.
    let tail_at = input.len() - tail.len();
    repairs.extend(rest.repairs.into_iter().map(|r| Repair {
        offset: (tail_at + r.offset).saturating_sub(1).min(input.len()),
        ..r
    }));
    Some(Repaired {
        value: Value::Object(map),
        repairs,
        literals,
        unlisted: first.unlisted + rest.unlisted,
    })
}

/// A constant-time check that rules out input `serde_json` would reject only at its end
/// (truncated output, trailing prose), so such input is not parsed twice.
fn may_be_valid(input: &str) -> bool {
    let t = input.trim_ascii();
    let (Some(&first), Some(&last)) = (t.as_bytes().first(), t.as_bytes().last()) else {
        return false;
    };
    match first {
        b'{' => last == b'}',
        b'[' => last == b']',
        b'"' => last == b'"',
        b'-' | b'0'..=b'9' => last.is_ascii_digit(),
        b't' | b'f' => last == b'e',
        b'n' => last == b'l',
        _ => false,
    }
}

/// Decodes a top-level string that holds a JSON object or array (`"{\"a\": 1}"`).
///
/// `literal` is where the string is written in `input` (from its opening quote to the end of
/// its literal), when known. The repairs the decoded document needed are then reported at
/// the input offsets of the characters they concern (the `encoded` module says where that is
/// approximate); otherwise, and for any further layer, at the start of the string.
fn decode_layers(
    out: &mut Repaired,
    input: &str,
    first: usize,
    mut literal: Option<(usize, usize)>,
    options: &RepairOptions,
) {
    let offset = literal.map_or(first, |(start, _)| start);
    for _ in 0..MAX_DECODE_LAYERS {
        let Value::String(s) = &out.value else {
            return;
        };
        let t = s.trim();
        let lead = s.len() - s.trim_start().len();
        let looks_like_json =
            (t.starts_with('{') && t.ends_with('}')) || (t.starts_with('[') && t.ends_with(']'));
        if !looks_like_json {
            return;
        }
        // The lenient parser reads valid JSON as `serde_json` does, and keeps long number
        // literals besides.
        let (value, mut inner, literals) = match extract::parse_document(t, options) {
            Ok(found)
                if !found.repairs.iter().any(|r| {
                    matches!(
                        r.kind,
                        RepairKind::ExtractedFromProse
                            | RepairKind::TrailingGarbage
                            | RepairKind::LeadingGarbage
                    )
                }) =>
            {
                (found.value, found.repairs, found.literals)
            }
            _ => return,
        };
        match literal.take() {
            Some(lit) => {
                for r in &mut inner {
                    r.offset += lead;
                }
                encoded::map_to_input(input, lit, s, &mut inner);
            }
            // The text of a further layer is not written anywhere in the input.
            None => {
                for r in &mut inner {
                    r.offset = offset;
                }
            }
        }
        out.value = value;
        out.literals = literals;
        out.repairs.push(Repair {
            kind: RepairKind::DoubleEncoded,
            offset,
        });
        out.repairs.extend(inner);
    }
}
