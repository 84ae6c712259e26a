//! The lenient JSON parser.
//!
//! Why a parser of our own: repairing by rewriting text and re-parsing costs several passes
//! and quadratic backtracking on broken input. This parser reads the bytes once, builds the
//! [`serde_json::Value`] directly and records every liberty it takes as a [`Repair`].
//!
//! It is iterative: nesting lives on an explicit stack of [`Frame`]s, so deep input ends in
//! [`RepairError::TooDeep`] instead of a stack overflow. Every lookahead is bounded or is
//! followed by consuming what it looked at, so the work is linear in the input.

use serde_json::{Map, Value};

use crate::literal::{Literals, exceeds_f64};
use crate::{Cut, Repair, RepairError, RepairKind};

/// Bytes that stop the fast scan of a string body.
const SPECIAL: [bool; 256] = {
    let mut t = [false; 256];
    let mut i = 0;
    while i < 0x20 {
        t[i] = true;
        i += 1;
    }
    t[b'"' as usize] = true;
    t[b'\'' as usize] = true;
    t[b'\\' as usize] = true;
    // Lead byte of the typographic quotes U+2018, U+2019, U+201C, U+201D.
    t[0xE2] = true;
    t
};

/// First bytes of what [`Parser::skip_ws`] skips besides plain blanks: comments, a byte
/// order mark and non-ASCII spaces.
const MAY_START_SKIP: [bool; 256] = {
    let mut t = [false; 256];
    t[b'/' as usize] = true;
    t[b'#' as usize] = true;
    t[0xEF] = true;
    t[0xC2] = true;
    t[0xE2] = true;
    t[0xE3] = true;
    t
};

/// How many repairs a parse lists; more are counted ([`crate::Repaired::unlisted`]).
pub(crate) const MAX_LISTED_REPAIRS: usize = 10_000;

/// How far a key is looked for after a quote that may end a string early (bytes).
const KEY_LOOKAHEAD: usize = 256;

/// Words that may be the start of a literal cut off by truncation.
const LITERALS: [&str; 11] = [
    "true",
    "false",
    "null",
    "True",
    "False",
    "None",
    "undefined",
    "NaN",
    "Infinity",
    "TRUE",
    "FALSE",
];

/// A quote character.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Quote {
    Double,
    Single,
    TypoDoubleOpen,
    TypoDoubleClose,
    TypoSingleOpen,
    TypoSingleClose,
    /// `` ` ``: never returned by `quote_at`; backtick strings are read on their own.
    Backtick,
}

/// Whether a string is an object key or a value; the delimiter expected after it differs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ctx {
    Key,
    Value,
}

/// An open container on the explicit stack.
#[derive(Debug)]
enum Frame {
    Arr(Vec<Value>),
    Obj {
        map: Map<String, Value>,
        /// The key whose value is being parsed.
        key: Option<String>,
    },
    /// A function-call wrapper: JSONP at the top level, a MongoDB wrapper inside.
    Call(Option<Value>),
    /// A Python tuple `(a, b)`: an array; `(a)` without a comma is `a` itself.
    Tuple {
        items: Vec<Value>,
        /// Whether a comma was seen (`(a,)` is a one-element tuple).
        comma: bool,
    },
}

/// What the parser expects next.
#[derive(Debug, Clone, Copy)]
enum State {
    /// A value.
    Value,
    /// After an element or member: a comma or a closing bracket.
    After,
    /// After `[` or a comma (at the given offset) in an array.
    ArrElem { after_comma: Option<usize> },
    /// After `{` or a comma (at the given offset) in an object.
    ObjKey { after_comma: Option<usize> },
    /// The root value is complete.
    Done,
}

/// Where an array's value or an object's key is due ([`Parser::element_start`]).
enum Element {
    /// The container closed there, or the text ended: the state that follows.
    Done(State),
    /// The element starts at this offset with this byte.
    At(usize, u8),
}

fn is_digit(b: u8) -> bool {
    b.is_ascii_digit()
}

fn is_ident_start(b: u8) -> bool {
    b.is_ascii_alphabetic() || b == b'_' || b == b'$'
}

fn is_ident_char(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_' || b == b'$'
}

fn is_plain_ws(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\r')
}

/// The lenient parser over one window `[pos, end)` of the input.
pub(crate) struct Parser<'a> {
    src: &'a str,
    /// The bytes of the window, `src[..end]`: one bounds check per byte read.
    b: &'a [u8],
    pub(crate) pos: usize,
    end: usize,
    max_depth: usize,
    pub(crate) repairs: Vec<Repair>,
    stack: Vec<Frame>,
    open_arr: usize,
    open_obj: usize,
    open_call: usize,
    truncated_noted: bool,
    escaped_noted: bool,
    /// The finished root value.
    done: Option<Value>,
    /// Whether bare words in arrays are strings (`[a, b]`).
    pub(crate) bare_words_in_arrays: bool,
    /// Set when a top-level `callback(` was seen.
    pub(crate) jsonp: bool,
    /// Where the last string read outside any array or object (the root value, or the
    /// argument of a top-level wrapper call) starts and where its first literal ends. Used to
    /// map offsets inside a double-encoded document back to the input.
    pub(crate) root_string: Option<(usize, usize)>,
    /// Lossy mode: close what truncation left open and drop the unfinished part instead of
    /// refusing ([`crate::RepairOptions::salvage`]).
    pub(crate) salvage: bool,
    /// Read a number with leading zeros as the string it spells instead of refusing it.
    pub(crate) leading_zero_strings: bool,
    /// The input is the model's whole answer: a number that ends where the input ends is
    /// complete ([`crate::RepairOptions::input_complete`]).
    pub(crate) input_complete: bool,
    /// The first loss found where the caller could not return an error at once; the parse
    /// is refused with it when it ends.
    loss: Option<RepairError>,
    /// A missing `}` was supplied before the next element of an array
    /// (`[{"i": 1 {"i": 2}]`); a closer left over later then refuses the parse.
    brace_supplied: bool,
    /// Number literals with more digits than an `f64` holds, where they stand, so a
    /// rendering of the result can write them back as written.
    pub(crate) literals: Literals,
    /// Repairs made past [`MAX_LISTED_REPAIRS`], counted but not listed.
    pub(crate) unlisted: usize,
    /// Unescaped quotes taken as text so far, and that count when the string being read
    /// began: whether the current string already holds a quote of its own.
    quotes_taken: usize,
    string_quotes_from: usize,
}

impl<'a> Parser<'a> {
    /// A parser over `src[pos..end]`.
    pub(crate) fn new(src: &'a str, pos: usize, end: usize, max_depth: usize) -> Self {
        let end = end.min(src.len());
        Self {
            src,
            b: src.as_bytes().get(..end).unwrap_or_default(),
            pos,
            end,
            max_depth,
            repairs: Vec::new(),
            stack: Vec::new(),
            open_arr: 0,
            open_obj: 0,
            open_call: 0,
            truncated_noted: false,
            escaped_noted: false,
            done: None,
            bare_words_in_arrays: false,
            jsonp: false,
            root_string: None,
            salvage: false,
            leading_zero_strings: false,
            input_complete: false,
            loss: None,
            brace_supplied: false,
            literals: Literals::default(),
            unlisted: 0,
            quotes_taken: 0,
            string_quotes_from: 0,
        }
    }

    /// Truncation cut `cut` at the end of the input. Refused unless salvaging; when
    /// salvaging, the caller drops or closes what is unfinished.
    fn cut_off(&self, cut: Cut) -> Result<(), RepairError> {
        if self.salvage {
            Ok(())
        } else {
            Err(RepairError::Truncated {
                offset: self.end,
                cut,
            })
        }
    }

    /// As [`Self::cut_off`], for callers that cannot return an error: the loss is kept and
    /// the parse refused when it ends.
    fn remember_cut(&mut self, cut: Cut) {
        if let Err(e) = self.cut_off(cut) {
            self.loss.get_or_insert(e);
        }
    }

    /// A parser over `src[pos..end]` configured by `opts`.
    pub(crate) fn with_options(
        src: &'a str,
        pos: usize,
        end: usize,
        opts: &crate::RepairOptions,
    ) -> Self {
        let mut p = Self::new(src, pos, end, opts.max_depth);
        p.salvage = opts.salvage;
        p.leading_zero_strings = opts.leading_zero_strings;
        p.input_complete = opts.input_complete;
        p
    }

    /// The end of the window.
    pub(crate) fn end(&self) -> usize {
        self.end
    }

    fn s(&self, a: usize, b: usize) -> &'a str {
        self.src.get(a..b).unwrap_or_default()
    }

    #[inline]
    fn at(&self, i: usize) -> Option<u8> {
        self.b.get(i).copied()
    }

    pub(crate) fn peek(&self) -> Option<u8> {
        self.at(self.pos)
    }

    /// Records a repair: listed while fewer than [`MAX_LISTED_REPAIRS`] are, counted after,
    /// so input that needs a repair at every byte cannot grow the list without bound.
    pub(crate) fn note(&mut self, kind: RepairKind, offset: usize) {
        if self.repairs.len() < MAX_LISTED_REPAIRS {
            self.repairs.push(Repair { kind, offset });
        } else {
            self.unlisted += 1;
        }
    }

    /// How many repairs were recorded, listed or not: a mark for [`Self::forget_since`].
    pub(crate) fn noted(&self) -> usize {
        self.repairs.len() + self.unlisted
    }

    /// Forgets the repairs recorded since `mark` (a reading that was abandoned).
    pub(crate) fn forget_since(&mut self, mark: usize) {
        if mark >= self.repairs.len() {
            self.unlisted = mark - self.repairs.len();
        } else {
            self.repairs.truncate(mark);
            self.unlisted = 0;
        }
    }

    fn note_truncated(&mut self) {
        if !self.truncated_noted {
            self.truncated_noted = true;
            self.note(RepairKind::ClosedTruncated, self.end);
        }
    }

    pub(crate) fn err(&self, offset: usize, reason: impl Into<String>) -> RepairError {
        RepairError::Unrepairable {
            offset,
            reason: reason.into(),
        }
    }

    fn quote_at(&self, i: usize) -> Option<(Quote, usize)> {
        match self.at(i)? {
            b'"' => Some((Quote::Double, 1)),
            b'\'' => Some((Quote::Single, 1)),
            0xE2 if i + 3 <= self.end && self.at(i + 1) == Some(0x80) => {
                let q = match self.at(i + 2)? {
                    0x9C => Quote::TypoDoubleOpen,
                    0x9D => Quote::TypoDoubleClose,
                    0x98 => Quote::TypoSingleOpen,
                    0x99 => Quote::TypoSingleClose,
                    _ => return None,
                };
                Some((q, 3))
            }
            _ => None,
        }
    }

    /// `...` or `…` at `i`: returns its length.
    #[inline]
    fn ellipsis_at(&self, i: usize) -> Option<usize> {
        if self.at(i) == Some(b'.') && self.at(i + 1) == Some(b'.') && self.at(i + 2) == Some(b'.')
        {
            let mut j = i + 3;
            while self.at(j) == Some(b'.') {
                j += 1;
            }
            Some(j - i)
        } else if self.at(i) == Some(0xE2)
            && self.at(i + 1) == Some(0x80)
            && self.at(i + 2) == Some(0xA6)
        {
            Some(3)
        } else {
            None
        }
    }

    /// Whether only whitespace follows `i` to the end of the window (cheap when it does not:
    /// most values are followed by a delimiter).
    fn ends_input(&self, i: usize) -> bool {
        match self.at(i) {
            None => true,
            Some(c) if is_plain_ws(c) => self.skip_plain_ws_from(i) >= self.end,
            Some(_) => false,
        }
    }

    /// Whether a number ending at `i` may have been cut: nothing but blanks follows it to the
    /// end of the input, and none of them is a space or tab. Digits followed by a space were
    /// finished by whoever wrote them (`{"year": 2018 ` lacks only its brace); a final line
    /// break proves nothing, since `echo` or a file adds one to a cut answer.
    fn number_may_be_cut(&self, i: usize) -> bool {
        self.ends_input(i)
            && !self
                .b
                .get(i..)
                .unwrap_or_default()
                .iter()
                .any(|&c| c == b' ' || c == b'\t')
    }

    /// Skips whitespace only; returns the position after it.
    fn skip_plain_ws_from(&self, i: usize) -> usize {
        let window = self.b.get(i..).unwrap_or_default();
        i + window.iter().take_while(|&&c| is_plain_ws(c)).count()
    }

    /// Skips whitespace and comments, recording each comment.
    #[inline]
    pub(crate) fn skip_ws(&mut self) {
        // Most tokens follow a delimiter directly or after one blank: decide that with a
        // table look-up or two, inline, before the out-of-line loop over comments and
        // special spaces.
        let mut i = self.pos;
        loop {
            match self.b.get(i) {
                Some(&c) if is_plain_ws(c) => i += 1,
                Some(&c) if MAY_START_SKIP[usize::from(c)] => break,
                _ => {
                    self.pos = i;
                    return;
                }
            }
        }
        self.pos = i;
        self.skip_ws_and_comments();
    }

    /// The general case of [`Self::skip_ws`].
    #[inline(never)]
    fn skip_ws_and_comments(&mut self) {
        loop {
            self.pos = self.skip_plain_ws_from(self.pos);
            match (self.peek(), self.at(self.pos + 1)) {
                (Some(b'/'), Some(b'/')) | (Some(b'#'), _) => {
                    self.note(RepairKind::Comment, self.pos);
                    let rest = self.s(self.pos, self.end);
                    self.pos = match rest.find('\n') {
                        Some(n) => {
                            let text = rest.get(..n).unwrap_or_default();
                            if !self.stack.is_empty() && !self.salvage && text.contains(['}', ']'])
                            {
                                // `{"a": 1 # note }, "b": 2}`: the comment holds a closing
                                // bracket, and what it swallowed may be data.
                                self.loss.get_or_insert(RepairError::Unrepairable {
                                    offset: self.pos,
                                    reason: "a line comment holds a closing bracket, inside an open value".into(),
                                });
                            }
                            self.pos + n + 1
                        }
                        None => {
                            if !self.stack.is_empty() && !self.salvage && holds_data(rest) {
                                // `{"a": 1 # note }, "b": 2}` on one line: the comment would
                                // take the rest of the value with it. A comment of plain
                                // words at the end (`{"a": 1 // done`) takes nothing.
                                self.loss.get_or_insert(RepairError::Unrepairable {
                                    offset: self.pos,
                                    reason: "a line comment runs to the end of the input, inside an open value".into(),
                                });
                            }
                            self.end
                        }
                    };
                }
                (Some(b'/'), Some(b'*')) => {
                    self.note(RepairKind::Comment, self.pos);
                    let rest = self.s(self.pos + 2, self.end);
                    self.pos = match rest.find("*/") {
                        Some(n) => self.pos + 2 + n + 2,
                        None => {
                            if !self.salvage && holds_data(rest) {
                                // `{"a": 1 /* note, "b": 2}`: never closed, it takes the rest
                                // (a comment of plain words at the end takes nothing).
                                self.loss.get_or_insert(RepairError::Unrepairable {
                                    offset: self.pos,
                                    reason: "a block comment that is never closed".into(),
                                });
                            }
                            self.end
                        }
                    };
                }
                (Some(0xEF), Some(0xBB)) if self.at(self.pos + 2) == Some(0xBF) => {
                    self.note(RepairKind::LeadingGarbage, self.pos);
                    self.pos += 3;
                }
                (Some(0xC2 | 0xE2 | 0xE3), _) if self.special_ws_len(self.pos) > 0 => {
                    self.note(RepairKind::SpecialWhitespace, self.pos);
                    self.pos += self.special_ws_len(self.pos);
                }
                _ => return,
            }
        }
    }

    /// After an identifier ending at `end`: the `(` of a call `name.name (`, if any.
    fn call_paren(&self, end: usize) -> Option<usize> {
        let mut call_end = end;
        while self.at(call_end) == Some(b'.') && self.at(call_end + 1).is_some_and(is_ident_start) {
            call_end = self.ident_end(call_end + 1);
        }
        let paren = self.skip_plain_ws_from(call_end);
        (self.at(paren) == Some(b'(')).then_some(paren)
    }

    /// Length of a non-ASCII space at `i` (no-break, en/em and other Unicode spaces), or 0.
    fn special_ws_len(&self, i: usize) -> usize {
        match (self.at(i), self.at(i + 1), self.at(i + 2)) {
            (Some(0xC2), Some(0xA0), _) => 2,
            // U+2000..U+200A, U+202F
            (Some(0xE2), Some(0x80), Some(0x80..=0x8A | 0xAF)) => 3,
            // U+205F
            (Some(0xE2), Some(0x81), Some(0x9F)) => 3,
            // U+3000
            (Some(0xE3), Some(0x80), Some(0x80)) => 3,
            _ => 0,
        }
    }

    fn ident_end(&self, mut i: usize) -> usize {
        while let Some(c) = self.at(i) {
            if is_ident_char(c) {
                i += 1;
            } else {
                break;
            }
        }
        i
    }

    /// Whether a value could start at `i` (used to detect missing commas and colons).
    pub(crate) fn is_value_start(&self, i: usize) -> bool {
        match self.at(i) {
            Some(b'{' | b'[' | b'(' | b'-' | b'+') => true,
            Some(b'\\') => self.escaped_quote_at(i),
            Some(c) if is_digit(c) => true,
            Some(b'.') => self.at(i + 1).is_some_and(is_digit),
            Some(c) if is_ident_start(c) => true,
            Some(_) => self.quote_at(i).is_some(),
            None => false,
        }
    }

    /// Whether a value that is clearly JSON (not a bare word) starts at `i`.
    pub(crate) fn is_clear_value_start(&self, i: usize) -> bool {
        match self.at(i) {
            Some(c) if is_ident_start(c) => {
                let e = self.ident_end(i);
                let word = self.s(i, e);
                LITERALS.contains(&word)
                    || matches!(word, "NULL" | "Null")
                    || self.call_paren(e).is_some()
            }
            _ => self.is_value_start(i),
        }
    }

    /// `\"` at `i`: a string whose quotes were escaped (JSON copied out of a string).
    fn escaped_quote_at(&self, i: usize) -> bool {
        self.at(i) == Some(b'\\') && self.at(i + 1) == Some(b'"')
    }

    /// A backtick string (JavaScript template literal) at `i`. Read only where a key or a
    /// value is expected, inside an object, or inside an array when the input itself starts
    /// with the JSON: at the top level and in bracketed prose, backticks are markdown inline
    /// code around the JSON, not a string. For the same reason a backtick is never taken as
    /// the start of an element after a missing comma.
    fn backtick_at(&self, i: usize) -> bool {
        self.at(i) == Some(b'`')
            && !self.stack.is_empty()
            && (self.open_obj > 0 || self.bare_words_in_arrays)
    }

    fn is_key_start(&self, i: usize) -> bool {
        if self.escaped_quote_at(i) {
            return true;
        }
        match self.at(i) {
            Some(c) if c.is_ascii_alphanumeric() || c == b'_' || c == b'$' => true,
            Some(c) if c >= 0x80 => true,
            Some(_) => self.quote_at(i).is_some(),
            None => false,
        }
    }

    fn push(&mut self, frame: Frame) -> Result<(), RepairError> {
        if self.stack.len() >= self.max_depth {
            return Err(RepairError::TooDeep {
                limit: self.max_depth,
                offset: self.pos,
            });
        }
        match frame {
            Frame::Arr(_) => self.open_arr += 1,
            Frame::Obj { .. } => self.open_obj += 1,
            Frame::Call(_) | Frame::Tuple { .. } => self.open_call += 1,
        }
        self.stack.push(frame);
        Ok(())
    }

    /// Pops the innermost frame; `None` when it produced no value (an empty call).
    fn pop(&mut self) -> Option<Option<Value>> {
        let frame = self.stack.pop()?;
        Some(match frame {
            Frame::Arr(items) => {
                self.open_arr -= 1;
                Some(Value::Array(items))
            }
            Frame::Obj { map, .. } => {
                self.open_obj -= 1;
                Some(Value::Object(map))
            }
            Frame::Call(v) => {
                self.open_call -= 1;
                v
            }
            Frame::Tuple { mut items, comma } => {
                self.open_call -= 1;
                if items.len() == 1 && !comma {
                    items.pop()
                } else {
                    Some(Value::Array(items))
                }
            }
        })
    }

    /// Attaches a finished value to the innermost frame (used when closing implicitly).
    fn attach(&mut self, v: Option<Value>) {
        match (self.stack.last_mut(), v) {
            (Some(Frame::Arr(items) | Frame::Tuple { items, .. }), Some(v)) => items.push(v),
            (Some(Frame::Obj { map, key }), Some(v)) => {
                if let Some(k) = key.take() {
                    map.insert(k, v);
                }
            }
            (Some(Frame::Obj { key, .. }), None) => {
                *key = None;
            }
            (Some(Frame::Call(slot)), v) => *slot = v,
            (Some(Frame::Arr(_) | Frame::Tuple { .. }), None) | (None, _) => {}
        }
    }

    /// Closes every open frame at the end of truncated input and returns the root.
    fn finish_truncated(&mut self) -> Result<Value, RepairError> {
        self.note_truncated();
        let mut last = None;
        while let Some(v) = self.pop() {
            if self.stack.is_empty() {
                last = v;
                break;
            }
            self.attach(v);
        }
        last.ok_or_else(|| self.err(self.end, "input ends before any value"))
    }

    /// Drops the pending member or element of truncated input.
    fn drop_incomplete(&mut self, offset: usize) {
        self.note(RepairKind::DroppedIncomplete, offset);
        if let Some(Frame::Obj { key, .. }) = self.stack.last_mut() {
            *key = None;
        }
    }

    /// Parses one value starting at `pos` (after whitespace).
    pub(crate) fn parse_value(&mut self) -> Result<Value, RepairError> {
        self.stack.clear();
        self.open_arr = 0;
        self.open_obj = 0;
        self.open_call = 0;
        self.done = None;
        self.root_string = None;
        self.loss = None;
        self.brace_supplied = false;
        let mut state = State::Value;
        loop {
            let next = match state {
                State::Value => self.value_state(),
                State::After => self.after_state(),
                State::ArrElem { after_comma } => self.arr_elem_state(after_comma),
                State::ObjKey { after_comma } => self.obj_key_state(after_comma),
                State::Done => {
                    if let Some(loss) = self.loss.take() {
                        return Err(loss);
                    }
                    return self
                        .done
                        .take()
                        .ok_or_else(|| self.err(self.pos, "no value"));
                }
            };
            state = next.map_err(|e| *e)?;
        }
    }

    /// Hands a finished value to its parent, or finishes the parse at the top level.
    fn deliver(&mut self, v: Value) -> State {
        match self.stack.last_mut() {
            None => self.done_with(v),
            Some(Frame::Arr(items) | Frame::Tuple { items, .. }) => {
                items.push(v);
                State::After
            }
            Some(Frame::Obj { map, key }) => {
                if let Some(k) = key.take() {
                    map.insert(k, v);
                }
                State::After
            }
            Some(Frame::Call(slot)) => {
                *slot = Some(v);
                State::After
            }
        }
    }

    fn done_with(&mut self, v: Value) -> State {
        self.done = Some(v);
        State::Done
    }

    /// Whether a bare word may be read as a string here: in an object value, or in an
    /// array when the input itself starts with the JSON (not in a prose candidate).
    fn bare_words_allowed(&self) -> bool {
        match self.stack.last() {
            Some(Frame::Obj { .. }) => true,
            Some(Frame::Arr(_) | Frame::Tuple { .. }) => self.bare_words_in_arrays,
            _ => false,
        }
    }

    fn in_object(&self) -> bool {
        matches!(self.stack.last(), Some(Frame::Obj { .. }))
    }

    fn missing_value(&self, offset: usize) -> RepairError {
        match self.stack.last() {
            Some(Frame::Obj { key, .. }) => RepairError::MissingValue {
                offset,
                key: key.clone(),
            },
            _ => self.err(offset, "missing value"),
        }
    }

    fn value_state(&mut self) -> Result<State, Box<RepairError>> {
        self.skip_ws();
        let start = self.pos;
        let Some(c) = self.peek() else {
            if self.stack.is_empty() {
                return Err(self.err(start, "input ends before any value").into());
            }
            if matches!(self.stack.last(), Some(Frame::Obj { key: Some(_), .. })) {
                if !self.salvage {
                    return Err(self.missing_value(start).into());
                }
            } else {
                self.cut_off(Cut::Element)?;
            }
            self.drop_incomplete(start);
            let v = self.finish_truncated()?;
            return Ok(self.done_with(v));
        };
        match c {
            b'{' => {
                self.push(Frame::Obj {
                    map: Map::new(),
                    key: None,
                })?;
                self.pos += 1;
                Ok(State::ObjKey { after_comma: None })
            }
            b'[' => {
                self.push(Frame::Arr(Vec::new()))?;
                self.pos += 1;
                Ok(State::ArrElem { after_comma: None })
            }
            b'(' => {
                self.note(RepairKind::PythonTuple, start);
                self.push(Frame::Tuple {
                    items: Vec::new(),
                    comma: false,
                })?;
                self.pos += 1;
                Ok(State::ArrElem { after_comma: None })
            }
            b'.' if self.ellipsis_at(start).is_some() => Err(self.missing_value(start).into()),
            b'/' if !self.stack.is_empty() => {
                let v = self.regex_literal(start)?;
                Ok(self.deliver(v))
            }
            b'-' | b'+' | b'.' | b'0'..=b'9' => match self.parse_number()? {
                Some(_)
                    if !self.stack.is_empty()
                        && self.peek().is_some_and(|c| {
                            c.is_ascii_alphanumeric()
                                || matches!(c, b'.' | b'-' | b'_' | b':')
                                || (c == b'/'
                                    && !matches!(self.at(self.pos + 1), Some(b'/' | b'*')))
                        }) =>
                {
                    if let Some((v, end)) = self.separated_number(start) {
                        if self.number_may_be_cut(end) && !self.input_complete {
                            self.cut_off(Cut::Number)?;
                        }
                        // `82_461_110`: digit groups, as Python and JavaScript write them.
                        self.note(RepairKind::NumberFormat, start);
                        self.pos = end;
                        return Ok(self.deliver(v));
                    }
                    // `2024-01-01`, `0.0.1`, `0x1F`: not a number; keep the text.
                    self.pos = start;
                    {
                        let v = self.unquoted_string()?;
                        Ok(self.deliver(v))
                    }
                }
                Some(v) => Ok(self.deliver(v)),
                None => {
                    if self.stack.is_empty() {
                        return Err(self.err(start, "truncated number").into());
                    }
                    self.cut_off(Cut::Number)?;
                    self.drop_incomplete(start);
                    {
                        let v = self.finish_truncated()?;
                        Ok(self.done_with(v))
                    }
                }
            },
            c if is_ident_start(c) => self.word_value(),
            b',' | b'}' | b']' | b')' | b':' => Err(self.missing_value(start).into()),
            _ => {
                if self.quote_at(start).is_some()
                    || self.escaped_quote_at(start)
                    || self.backtick_at(start)
                {
                    let (s, literal_end) = self.string_value()?;
                    if self.open_arr == 0 && self.open_obj == 0 {
                        self.root_string = Some((start, literal_end));
                    }
                    return Ok(self.deliver(Value::String(s)));
                }
                if self.ellipsis_at(start).is_some() {
                    return Err(self.missing_value(start).into());
                }
                if self.bare_words_allowed() && c >= 0x80 {
                    let v = self.unquoted_string()?;
                    return Ok(self.deliver(v));
                }
                Err(self
                    .err(
                        start,
                        format!("unexpected character {:?}", self.char_at(start)),
                    )
                    .into())
            }
        }
    }

    /// A JavaScript regex literal `/…/flags` in value position, kept as the string it is
    /// written as. Refused when it does not close on its line.
    fn regex_literal(&mut self, start: usize) -> Result<Value, RepairError> {
        let mut i = start + 1;
        loop {
            match self.at(i) {
                Some(b'\\') => i += 2,
                Some(b'/') if i > start + 1 => break,
                Some(b'\n' | b'\r') | None => {
                    return Err(self.err(start, "unexpected character '/'"));
                }
                Some(_) => i += 1,
            }
        }
        i += 1;
        while self.at(i).is_some_and(|c| c.is_ascii_alphabetic()) {
            i += 1;
        }
        self.note(RepairKind::UnquotedString, start);
        self.pos = i;
        Ok(Value::String(self.s(start, i).to_owned()))
    }

    /// A number written with `_` between digit groups (`82_461_110`, `1_234.5_6`), as in
    /// Python and JavaScript: the number without the separators, and where it ends.
    fn separated_number(&self, start: usize) -> Option<(Value, usize)> {
        let mut i = start;
        if self.at(i) == Some(b'-') {
            i += 1;
        }
        // Most numbers have no separator: find that out before building anything.
        let mut j = i;
        while self.at(j).is_some_and(|c| c.is_ascii_digit()) {
            j += 1;
        }
        if self.at(j) != Some(b'_') {
            return None;
        }
        let mut digits = String::new();
        let mut seen_sep = false;
        let mut is_float = false;
        loop {
            match self.at(i) {
                Some(c) if c.is_ascii_digit() => digits.push(char::from(c)),
                Some(b'_')
                    if self
                        .at(i.wrapping_sub(1))
                        .is_some_and(|c| c.is_ascii_digit())
                        && self.at(i + 1).is_some_and(|c| c.is_ascii_digit()) =>
                {
                    seen_sep = true;
                }
                Some(b'.')
                    if !is_float
                        && self
                            .at(i.wrapping_sub(1))
                            .is_some_and(|c| c.is_ascii_digit())
                        && self.at(i + 1).is_some_and(|c| c.is_ascii_digit()) =>
                {
                    is_float = true;
                    digits.push('.');
                }
                _ => break,
            }
            i += 1;
        }
        let leading_zero = digits.len() > 1 && digits.starts_with('0') && !digits.starts_with("0.");
        let ends_clean = !self
            .at(i)
            .is_some_and(|c| c.is_ascii_alphanumeric() || c == b'_');
        if !seen_sep || leading_zero || !ends_clean {
            return None;
        }
        let text = if self.at(start) == Some(b'-') {
            format!("-{digits}")
        } else {
            digits
        };
        number_value(&text, is_float).map(|v| (v, i))
    }

    fn char_at(&self, i: usize) -> char {
        self.src
            .get(i..)
            .and_then(|s| s.chars().next())
            .unwrap_or('\u{FFFD}')
    }

    /// A string value, joined with any `+` concatenations that follow it. Also returns where
    /// the first string literal ends.
    fn string_value(&mut self) -> Result<(String, usize), RepairError> {
        let (mut s, closed) = self.parse_string(Ctx::Value)?;
        let literal_end = self.pos;
        if !closed {
            return Ok((s, literal_end));
        }
        loop {
            let mut p = self.skip_plain_ws_from(self.pos);
            if self.at(p) == Some(b'/') && self.at(p + 1) == Some(b'*') {
                // `"a" /* c */ + "b"`: a comment before the `+`.
                let (save, noted) = (self.pos, self.noted());
                self.skip_ws();
                if self.peek() != Some(b'+') {
                    self.pos = save;
                    self.forget_since(noted);
                    return Ok((s, literal_end));
                }
                p = self.pos;
            }
            if self.at(p) != Some(b'+') {
                return Ok((s, literal_end));
            }
            // `"a" + /* c */ "b"`: comments after the `+` go too.
            self.pos = p + 1;
            self.skip_ws();
            let q = self.pos;
            if q >= self.end {
                self.cut_off(Cut::String)?;
                self.pos = q;
                self.note_truncated();
                return Ok((s, literal_end));
            }
            if self.quote_at(q).is_none() && !self.backtick_at(q) {
                return Err(self.err(q, "expected a string after '+'"));
            }
            self.note(RepairKind::StringConcatenation, p);
            self.pos = q;
            let (next, closed) = self.parse_string(Ctx::Value)?;
            s.push_str(&next);
            if !closed {
                return Ok((s, literal_end));
            }
        }
    }

    /// A bare word in value position: a literal, a wrapper call or an unquoted string.
    fn word_value(&mut self) -> Result<State, Box<RepairError>> {
        let start = self.pos;
        let end = self.ident_end(start);
        let word = self.s(start, end);
        let lit = match word {
            "true" => Some((Value::Bool(true), None)),
            "false" => Some((Value::Bool(false), None)),
            "null" => Some((Value::Null, None)),
            "True" => Some((Value::Bool(true), Some(RepairKind::PythonLiteral))),
            "False" => Some((Value::Bool(false), Some(RepairKind::PythonLiteral))),
            "None" => Some((Value::Null, Some(RepairKind::PythonLiteral))),
            "undefined" | "NaN" | "Infinity" => Some((Value::Null, Some(RepairKind::JsLiteral))),
            "TRUE" => Some((Value::Bool(true), Some(RepairKind::LiteralCase))),
            "FALSE" => Some((Value::Bool(false), Some(RepairKind::LiteralCase))),
            "NULL" | "Null" => Some((Value::Null, Some(RepairKind::LiteralCase))),
            _ => None,
        };
        if let Some((v, kind)) = lit {
            if let Some(kind) = kind {
                self.note(kind, start);
            }
            self.pos = end;
            return Ok(self.deliver(v));
        }
        // A wrapper call: `callback(...)`, `NumberLong(2)`, `ISODate("...")`.
        if let Some(paren) = self.call_paren(end) {
            if self.stack.is_empty() {
                self.note(RepairKind::Jsonp, start);
                self.jsonp = true;
            } else {
                self.note(RepairKind::MongoWrapper, start);
            }
            self.push(Frame::Call(None))?;
            self.pos = paren + 1;
            let inner = self.skip_plain_ws_from(self.pos);
            if self.at(inner) == Some(b')') {
                return Err(self.err(inner, format!("{word}() has no value")).into());
            }
            return Ok(State::Value);
        }
        if self.ends_input(end)
            && LITERALS
                .iter()
                .any(|l| l.len() > word.len() && l.starts_with(word))
        {
            // A literal cut off by truncation: drop it rather than guess.
            if self.stack.is_empty() {
                return Err(self
                    .err(start, format!("truncated literal {word:?}"))
                    .into());
            }
            self.cut_off(Cut::Literal)?;
            self.drop_incomplete(start);
            let v = self.finish_truncated()?;
            return Ok(self.done_with(v));
        }
        if self.bare_words_allowed() {
            let v = self.unquoted_string()?;
            return Ok(self.deliver(v));
        }
        Err(self.err(start, format!("unexpected word {word:?}")).into())
    }

    /// A bare string value after a colon, up to the next delimiter on the same line.
    /// Brackets inside it are text when they pair up before that delimiter
    /// (`{text: words{in brackets}}`, `[This is F(3)]`); a quote right after it closes it
    /// when the JSON goes on after that quote (`{"a": foo", "b": 1}`), and a quoted key
    /// after it starts the next member (`{"a": foo "b": 1}`).
    fn unquoted_string(&mut self) -> Result<Value, RepairError> {
        let start = self.pos;
        let (i, balanced) = self.bare_text_end(start);
        // `i` stops on an ASCII byte or at the end, so it is a char boundary.
        let text = self.s(start, i).trim_end();
        if text.is_empty() {
            return Err(self.missing_value(start));
        }
        if self.ends_input(i) {
            // The word runs to the end of the input: it may have been cut.
            self.cut_off(Cut::Literal)?;
        }
        let text_end = start + text.len();
        let mut next = text_end;
        if self.at(i) == Some(b'"') {
            // `world\"`: an escaped quote (JSON copied out of a string) is no closing one.
            let plain = balanced && !text.ends_with('\\');
            if plain
                && i == text_end
                && matches!(
                    self.at(self.skip_plain_ws_from(i + 1)),
                    Some(b',' | b'}' | b']')
                )
            {
                // `{"a": foo", "b": 1}`: the value lost its opening quote.
                self.note(RepairKind::MissingQuote, start);
                next = i + 1;
            } else if plain && self.in_object() && self.key_at(i) {
                // `{"a": foo "b": 1}`: a bare value, then the next member without its comma.
                self.note(RepairKind::MissingComma, i);
            } else if !self.salvage {
                return Err(self.err(start, "a quote after an unquoted value"));
            }
        } else if !balanced && !self.salvage {
            // `{text: words{in brackets}`: where the bare text ends is a guess.
            return Err(self.err(start, "brackets inside an unquoted value"));
        }
        self.note(RepairKind::UnquotedString, start);
        self.pos = next;
        Ok(Value::String(text.to_owned()))
    }

    /// Where bare text starting at `start` ends: at a comma, closing bracket, quote or line
    /// break outside any bracket it opened itself. `false` when its brackets do not pair up
    /// (then the end is the first bracket that breaks the pairing, or a quote or line break
    /// inside an open bracket).
    fn bare_text_end(&self, start: usize) -> (usize, bool) {
        let mut open = [0u8; 8];
        let mut depth = 0usize;
        let mut i = start;
        while let Some(c) = self.at(i) {
            match c {
                b'{' | b'[' | b'(' => {
                    let Some(slot) = open.get_mut(depth) else {
                        return (i, false);
                    };
                    *slot = match c {
                        b'{' => b'}',
                        b'[' => b']',
                        _ => b')',
                    };
                    depth += 1;
                }
                b'}' | b']' | b')' if depth > 0 => {
                    depth -= 1;
                    if open.get(depth) != Some(&c) {
                        return (i, false);
                    }
                }
                b',' | b'}' | b']' if depth == 0 => return (i, true),
                b')' => return (i, self.open_call > 0),
                b'\n' | b'\r' | b'"' => return (i, depth == 0),
                _ => {}
            }
            i += 1;
        }
        (i, depth == 0)
    }

    fn after_state(&mut self) -> Result<State, Box<RepairError>> {
        self.skip_ws();
        let at = self.pos;
        if self.at(at) == Some(b'`')
            && self.s(at, self.end).starts_with("```")
            && !self.stack.is_empty()
        {
            // `{"a": "x"```: the closing fence of a code block ends the JSON, whose closing
            // brackets were left off after a complete value.
            self.note(RepairKind::TrailingGarbage, at);
            self.end = at;
            self.b = self.b.get(..at).unwrap_or_default();
        }
        let Some(c) = self.peek() else {
            let v = self.finish_truncated()?;
            return Ok(self.done_with(v));
        };
        let top_is_call = matches!(self.stack.last(), Some(Frame::Call(_)));
        match c {
            b',' => {
                if top_is_call {
                    return Err(self
                        .err(at, "a wrapper call with more than one argument")
                        .into());
                }
                self.pos += 1;
                if let Some(Frame::Tuple { comma, .. }) = self.stack.last_mut() {
                    *comma = true;
                }
                Ok(if self.in_object() {
                    State::ObjKey {
                        after_comma: Some(at),
                    }
                } else {
                    State::ArrElem {
                        after_comma: Some(at),
                    }
                })
            }
            b']' | b'}' | b')' => self.close(c),
            _ if top_is_call => Err(self.err(at, "expected ')' after the wrapped value").into()),
            _ if self.in_object() => {
                if let Some(state) = self.object_ends_before_next(at, None) {
                    return Ok(state);
                }
                if self.is_key_start(at) {
                    self.note(RepairKind::MissingComma, at);
                    Ok(State::ObjKey { after_comma: None })
                } else {
                    Err(self
                        .err(
                            at,
                            format!("unexpected {:?} after a member", self.char_at(at)),
                        )
                        .into())
                }
            }
            _ => {
                if self.is_value_start(at) || self.ellipsis_at(at).is_some() {
                    self.note(RepairKind::MissingComma, at);
                    Ok(State::ArrElem { after_comma: None })
                } else {
                    Err(self
                        .err(
                            at,
                            format!("unexpected {:?} after an element", self.char_at(at)),
                        )
                        .into())
                }
            }
        }
    }

    /// Handles a closing bracket `c` at `pos`.
    fn close(&mut self, c: u8) -> Result<State, Box<RepairError>> {
        let at = self.pos;
        let want = match self.stack.last() {
            Some(Frame::Arr(_)) => b']',
            Some(Frame::Obj { .. }) => b'}',
            Some(Frame::Call(_) | Frame::Tuple { .. }) => b')',
            None => return Err(self.err(at, "closing bracket outside any value").into()),
        };
        self.pos += 1;
        if c == want {
            return Ok(self.closed_one());
        }
        if self.brace_supplied {
            return Err(self
                .err(
                    at,
                    "a closing bracket that does not fit after a brace supplied before the next element",
                )
                .into());
        }
        if !self.salvage && (c == b')' || want == b')') {
            // `(1]`, `[1)`: a tuple or a wrapper call mixed with another bracket.
            return Err(self
                .err(at, "a parenthesis closed by another kind of bracket")
                .into());
        }
        let open_of_kind = match c {
            b']' => self.open_arr,
            b'}' => self.open_obj,
            _ => self.open_call,
        };
        if open_of_kind > 0 {
            // Close the inner frames that were left open, then the one `c` belongs to.
            self.note(RepairKind::MismatchedBracket, at);
            loop {
                let kind = match self.stack.last() {
                    Some(Frame::Arr(_)) => b']',
                    Some(Frame::Obj { .. }) => b'}',
                    Some(Frame::Call(_) | Frame::Tuple { .. }) => b')',
                    None => return Err(self.err(at, "closing bracket outside any value").into()),
                };
                if kind == c {
                    return Ok(self.closed_one());
                }
                // `{"a": [}` is `{"a": []}` whether the `}` stands for the `]` or the `[`
                // was never closed, and both reference libraries read it so.
                let empty = match self.stack.last() {
                    Some(Frame::Arr(items)) => items.is_empty() && c != b'}',
                    Some(Frame::Tuple { items, .. }) => items.is_empty(),
                    Some(Frame::Obj { map, key }) => map.is_empty() && key.is_none(),
                    _ => false,
                };
                if empty && !self.salvage {
                    // `[{]`: an opening bracket with nothing in it, closed by another kind
                    // (read as `[{}]` or as `[]` by the two reference libraries).
                    return Err(self
                        .err(
                            at,
                            "a bracket closes a value that was opened but never written",
                        )
                        .into());
                }
                let v = self.pop().flatten();
                self.attach(v);
            }
        }
        // No open container of this kind: a stray closer if the container goes on,
        // otherwise a closer of the wrong kind for the innermost one.
        let next = self.skip_plain_ws_from(self.pos);
        if matches!(self.at(next), Some(b',')) || self.at(next) == Some(want) {
            self.note(RepairKind::RedundantClosing, at);
            return Ok(State::After);
        }
        self.note(RepairKind::MismatchedBracket, at);
        Ok(self.closed_one())
    }

    /// `[{"i": 1 {"i": 2}]`, `[{"i": 1, {"i": 2}]`: a `{` at `at` where the next member of
    /// an object inside an array is due. The object lost its closing brace and the `{` opens
    /// the array's next element; the other reading, a member whose key is missing, would
    /// invent the key. Taken only for an object with members and no pending key, and only if
    /// the brackets that follow fit: a closer left over later (`[{"a": 1, {"b": 2}}]`, where
    /// the `{` more likely lost its key) refuses the parse.
    fn object_ends_before_next(&mut self, at: usize, after_comma: Option<usize>) -> Option<State> {
        let n = self.stack.len();
        let closable = self.at(at) == Some(b'{')
            && n >= 2
            && matches!(self.stack.get(n - 2), Some(Frame::Arr(_)))
            && matches!(self.stack.last(), Some(Frame::Obj { map, key: None }) if !map.is_empty());
        if !closable || self.salvage {
            return None;
        }
        self.note(RepairKind::MismatchedBracket, at);
        self.brace_supplied = true;
        let v = self.pop().flatten();
        self.attach(v);
        if after_comma.is_none() {
            self.note(RepairKind::MissingComma, at);
        }
        Some(State::ArrElem { after_comma })
    }

    fn closed_one(&mut self) -> State {
        match self.pop().flatten() {
            Some(v) => self.deliver(v),
            None => State::After,
        }
    }

    /// Reads up to where an array's value or an object's key is due: past whitespace, extra
    /// commas and `...` placeholders. `Done` when the container closes there (a trailing comma
    /// noted) or the text ends; else the offset and byte where the element starts.
    fn element_start(&mut self, after_comma: Option<usize>) -> Result<Element, Box<RepairError>> {
        loop {
            self.skip_ws();
            let at = self.pos;
            match self.peek() {
                None => {
                    self.cut_off(Cut::Element)?;
                    let v = self.finish_truncated()?;
                    return Ok(Element::Done(self.done_with(v)));
                }
                Some(b',') => {
                    self.note(RepairKind::ExtraComma, at);
                    self.pos += 1;
                }
                Some(c @ (b']' | b'}' | b')')) => {
                    if let Some(comma) = after_comma {
                        self.note(RepairKind::TrailingComma, comma);
                    }
                    return self.close(c).map(Element::Done);
                }
                Some(c) => {
                    if let Some(n) = self.ellipsis_at(at) {
                        self.note(RepairKind::Ellipsis, at);
                        self.pos += n;
                        self.skip_ws();
                        if self.peek() == Some(b',') {
                            self.pos += 1;
                        }
                        continue;
                    }
                    return Ok(Element::At(at, c));
                }
            }
        }
    }

    fn arr_elem_state(&mut self, after_comma: Option<usize>) -> Result<State, Box<RepairError>> {
        match self.element_start(after_comma)? {
            Element::Done(state) => Ok(state),
            Element::At(..) => Ok(State::Value),
        }
    }

    fn obj_key_state(&mut self, after_comma: Option<usize>) -> Result<State, Box<RepairError>> {
        let (key, key_at) = loop {
            let (at, c) = match self.element_start(after_comma)? {
                Element::Done(state) => return Ok(state),
                Element::At(at, c) => (at, c),
            };
            if self.quote_at(at).is_some() || self.escaped_quote_at(at) || self.backtick_at(at) {
                let (k, closed) = self.parse_string(Ctx::Key)?;
                if !closed {
                    self.loss = None;
                    self.cut_off(Cut::Key)?;
                    self.drop_incomplete(at);
                    return {
                        let v = self.finish_truncated()?;
                        Ok(self.done_with(v))
                    };
                }
                break (k, at);
            }
            if let Some(state) = self.object_ends_before_next(at, after_comma) {
                return Ok(state);
            }
            if let Some(end) = self.marker_word_at(at) {
                // `{"a": 1, COMMENT "b": 2}`: an upper-case marker word, not data.
                self.note(RepairKind::Comment, at);
                self.pos = end;
                continue;
            }
            if c.is_ascii_alphanumeric() || c == b'_' || c == b'$' || c >= 0x80 {
                break (self.unquoted_key(), at);
            }
            return Err(self
                .err(at, format!("expected a key, found {:?}", self.char_at(at)))
                .into());
        };
        self.skip_ws();
        let at = self.pos;
        match self.peek() {
            None => {
                if !self.salvage {
                    return Err(RepairError::MissingValue {
                        offset: self.pos,
                        key: Some(key),
                    }
                    .into());
                }
                self.drop_incomplete(key_at);
                {
                    let v = self.finish_truncated()?;
                    Ok(self.done_with(v))
                }
            }
            Some(b':') => {
                self.pos += 1;
                self.set_key(key);
                Ok(State::Value)
            }
            // `{"" "x"}` is no key and value: an empty key before a string is stray quotes.
            Some(_) if !key.is_empty() && self.is_clear_value_start(at) => {
                self.note(RepairKind::MissingColon, at);
                self.set_key(key);
                Ok(State::Value)
            }
            Some(_) => Err(self
                .err(at, format!("missing value for key {key:?}"))
                .into()),
        }
    }

    /// An upper-case marker word of four letters or more, such as `COMMENT` or `TODO`, at
    /// `i` where a key is due and followed on the same line by a quoted key: where it ends.
    /// (`USD "amount"` or `AB }` are not markers: they are refused.)
    fn marker_word_at(&self, i: usize) -> Option<usize> {
        let mut e = i;
        while self
            .at(e)
            .is_some_and(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == b'_')
        {
            e += 1;
        }
        let word = self.s(i, e);
        let upper = word.bytes().filter(u8::is_ascii_uppercase).count();
        if upper < 4 || LITERALS.contains(&word) || matches!(word, "NULL") {
            return None;
        }
        let mut n = e;
        while matches!(self.at(n), Some(b' ' | b'\t')) {
            n += 1;
        }
        (n > e && self.at(n) == Some(b'"')).then_some(n)
    }

    fn set_key(&mut self, k: String) {
        if let Some(Frame::Obj { key, .. }) = self.stack.last_mut() {
            *key = Some(k);
        }
    }

    fn unquoted_key(&mut self) -> String {
        let start = self.pos;
        self.note(RepairKind::UnquotedKey, start);
        let mut i = start;
        while let Some(c) = self.at(i) {
            let ok = c.is_ascii_alphanumeric()
                || matches!(c, b'_' | b'$' | b'-' | b'.')
                || (c >= 0x80 && self.quote_at(i).is_none());
            if !ok {
                break;
            }
            i += 1;
        }
        // `{first name: "x"}`: words separated by spaces, then a colon on the same line.
        let mut j = i;
        while let Some(c) = self.at(j) {
            let ok = c.is_ascii_alphanumeric()
                || matches!(c, b'_' | b'$' | b'-' | b'.' | b' ' | b'\t')
                || (c >= 0x80 && self.quote_at(j).is_none());
            if !ok {
                break;
            }
            j += 1;
        }
        if j > i && self.at(j) == Some(b':') {
            i = start + self.s(start, j).trim_end().len();
        }
        let key = self.s(start, i).to_owned();
        self.pos = i;
        if self.at(i) == Some(b'"') && self.at(self.skip_plain_ws_from(i + 1)) == Some(b':') {
            // `{a": 1}`: the key lost its opening quote; this one closes it.
            self.note(RepairKind::MissingQuote, start);
            self.pos = i + 1;
        }
        key
    }

    /// Parses a number; `None` when truncation left only a sign.
    fn parse_number(&mut self) -> Result<Option<Value>, RepairError> {
        let start = self.pos;
        let mut i = start;
        let mut fixed = false;
        let mut at_eof_fix = false;
        let mut neg = false;
        match self.at(i) {
            Some(b'+') => {
                fixed = true;
                i += 1;
            }
            Some(b'-') => {
                neg = true;
                i += 1;
            }
            _ => {}
        }
        if self.s(i, self.end).starts_with("Infinity") {
            self.note(RepairKind::JsLiteral, start);
            self.pos = i + "Infinity".len();
            return Ok(Some(Value::Null));
        }
        let int_start = i;
        while self.at(i).is_some_and(is_digit) {
            i += 1;
        }
        let mut int = self.s(int_start, i);
        if int.len() > 1 && int.starts_with('0') && !self.salvage {
            // `0789`: a zip code or an id, not the number 789.
            return self.leading_zeros(start);
        }
        if int.len() > 1 && int.starts_with('0') {
            fixed = true;
            int = int.trim_start_matches('0');
            if int.is_empty() {
                int = "0";
            }
        }
        let mut frac = "";
        let mut is_float = false;
        let mut frac_digits = false;
        if self.at(i) == Some(b'.') {
            let f0 = i + 1;
            let mut j = f0;
            while self.at(j).is_some_and(is_digit) {
                j += 1;
            }
            is_float = true;
            if j > f0 {
                frac = self.s(f0, j);
                frac_digits = true;
            } else {
                // `1.`: a trailing dot.
                fixed = true;
                at_eof_fix |= j >= self.end;
                frac = "0";
            }
            i = j;
        }
        if int.is_empty() {
            if frac_digits {
                // `.5`: a leading dot.
                fixed = true;
                int = "0";
            } else if i >= self.end {
                return Ok(None);
            } else {
                return Err(self.err(start, "invalid number"));
            }
        }
        let mut exp = String::new();
        if matches!(self.at(i), Some(b'e' | b'E')) {
            let mut j = i + 1;
            let mut e = String::new();
            if let Some(c @ (b'+' | b'-')) = self.at(j) {
                e.push(c as char);
                j += 1;
            }
            let d0 = j;
            while self.at(j).is_some_and(is_digit) {
                j += 1;
            }
            if j > d0 {
                e.push_str(self.s(d0, j));
                exp = e;
                is_float = true;
                i = j;
            } else if j >= self.end {
                // `1e` cut off: the exponent was never written.
                fixed = true;
                at_eof_fix = true;
                i = j;
            } else if !self.salvage
                && !self
                    .at(j)
                    .is_some_and(|c| c.is_ascii_alphanumeric() || c == b'_')
            {
                // `1e }`: an exponent with no digits is no number, and `1` would be a guess.
                return Err(self.err(start, "a number whose exponent has no digits"));
            }
        }
        self.pos = i;
        if at_eof_fix
            || (!self.input_complete && !self.stack.is_empty() && self.number_may_be_cut(i))
        {
            // `1.`, `1e`: the input stops where digits had to follow. `{"year": 20`: the
            // input stops inside a value that was never closed, and more digits may have
            // followed — unless a space after it or the caller says the number was finished.
            self.cut_off(Cut::Number)?;
        }
        let text: std::borrow::Cow<'_, str> = if fixed {
            if at_eof_fix {
                self.note_truncated();
            } else {
                self.note(RepairKind::NumberFormat, start);
            }
            let mut t = String::with_capacity(i - start + 2);
            if neg {
                t.push('-');
            }
            t.push_str(int);
            if is_float && !frac.is_empty() {
                t.push('.');
                t.push_str(frac);
            }
            if !exp.is_empty() {
                t.push('e');
                t.push_str(&exp);
            }
            t.into()
        } else {
            self.s(start, i).into()
        };
        let value = number_value(&text, is_float)
            .ok_or_else(|| self.err(start, format!("number {text} is out of range")))?;
        if let Value::Number(n) = &value
            && n.is_f64()
            && exceeds_f64(&text)
        {
            let parsed = n.as_f64().unwrap_or_default();
            let pointer = self.pointer();
            self.literals.push(pointer, parsed, text.into_owned());
        }
        Ok(Some(value))
    }

    /// The JSON pointer of the value being parsed now, in the value this parse returns.
    fn pointer(&self) -> String {
        let mut out = String::new();
        for frame in &self.stack {
            match frame {
                Frame::Arr(items) | Frame::Tuple { items, .. } => {
                    out.push('/');
                    out.push_str(&items.len().to_string());
                }
                Frame::Obj { key, .. } => {
                    out.push('/');
                    let k = key.as_deref().unwrap_or_default();
                    out.push_str(&k.replace('~', "~0").replace('/', "~1"));
                }
                // A wrapper call's value stands in its place.
                Frame::Call(_) => {}
            }
        }
        out
    }

    /// A number with leading zeros at `start`: the string it spells when the caller allows
    /// that (a schema decides later whether a string fits), otherwise a refusal.
    fn leading_zeros(&mut self, start: usize) -> Result<Option<Value>, RepairError> {
        let mut i = start;
        if matches!(self.at(i), Some(b'-' | b'+')) {
            i += 1;
        }
        while self
            .at(i)
            .is_some_and(|c| c.is_ascii_digit() || matches!(c, b'.' | b'e' | b'E'))
        {
            i += 1;
        }
        let text = self.s(start, i);
        if !self.leading_zero_strings {
            return Err(RepairError::LeadingZeros {
                offset: start,
                text: text.to_owned(),
            });
        }
        if !self.input_complete && !self.stack.is_empty() && self.number_may_be_cut(i) {
            self.cut_off(Cut::Number)?;
        }
        self.note(RepairKind::LeadingZeroString, start);
        self.pos = i;
        Ok(Some(Value::String(text.to_owned())))
    }

    /// Parses a quoted string at `pos`. Returns the text and whether it was closed (false
    /// when the input ended inside it).
    ///
    /// A string with an odd number of unescaped quotes inside is refused too: `"say "hi"
    /// now"` is clear, `"v"alue"` is not.
    ///
    /// A raw line break right before the closing quote is refused: the quote on the next
    /// line may close this string or belong to something else (`"a\n",` where `"a` lost
    /// its quote), and the two readings give different values.
    fn parse_string(&mut self, ctx: Ctx) -> Result<(String, bool), RepairError> {
        let start = self.pos;
        let quotes0 = self.quotes_taken;
        let (text, closed) = self.parse_string_body(ctx)?;
        let inner_quotes = self.quotes_taken - quotes0;
        if !self.salvage
            && inner_quotes % 2 == 1
            && !(closed
                && ctx == Ctx::Value
                && !self.s(start, self.pos).contains('\n')
                && self.close_confirmed())
        {
            // `"v"alue"`, `"a" b", "c"`: one stray quote. Whether it is text, a missing
            // closing quote or a missing opening quote gives three different values.
            return Err(self.err(start, "an unpaired quote inside a string"));
        }
        if closed
            && !self.salvage
            && matches!(self.at(self.pos.wrapping_sub(1)), Some(b'"' | b'\''))
        {
            let quote = self.pos - 1;
            let mut k = quote;
            while k > start + 1 && matches!(self.b.get(k - 1), Some(b' ' | b'\t')) {
                k -= 1;
            }
            if quote > start + 1 && matches!(self.b.get(k.wrapping_sub(1)), Some(b'\n' | b'\r')) {
                return Err(self.err(
                    quote,
                    "a line break right before the closing quote: which string it closes is unclear",
                ));
            }
        }
        Ok((text, closed))
    }

    fn parse_string_body(&mut self, ctx: Ctx) -> Result<(String, bool), RepairError> {
        let start = self.pos;
        if self.escaped_quote_at(start) {
            return Ok(self.escaped_string(start));
        }
        if self.at(start) == Some(b'`') {
            return self.backtick_string(start);
        }
        let Some((open, olen)) = self.quote_at(start) else {
            return Err(self.err(start, "expected a string"));
        };
        match open {
            Quote::Double => {}
            Quote::Single => self.note(RepairKind::SingleQuotes, start),
            _ => self.note(RepairKind::TypographicQuotes, start),
        }
        let content_start = start + olen;
        self.string_quotes_from = self.quotes_taken;
        let mut i = content_start;
        let mut seg = i;
        let mut out = String::new();
        let mut ctrl_noted = false;
        // A quote of the wrong kind that could close the string: used only if the right
        // kind never closes it (`{"a': 1}`), so valid strings such as `"':"` stay intact.
        let mut fallback: Option<Fallback> = None;
        loop {
            i = self.scan_plain(i);
            let Some(c) = self.at(i) else {
                out.push_str(self.s(seg, self.end));
                // A quote of the wrong kind right at the end may just as well be text of a
                // string that was cut off there.
                if let Some(fb) = fallback
                    && (self.salvage || self.skip_plain_ws_from(fb.after) < self.end)
                {
                    return Ok(self.use_fallback(fb, out));
                }
                return Ok(self.unterminated(out, content_start, ctx));
            };
            if c == b'\\' {
                if out.capacity() == 0 {
                    // A string with escapes is built piece by piece: one allocation that
                    // will usually hold it, instead of doubling from the first piece.
                    out.reserve(2 * (i - content_start) + 32);
                }
                out.push_str(self.s(seg, i));
                i = self.escape(i, open, &mut out);
                seg = i;
                continue;
            }
            if c < 0x20 {
                if !ctrl_noted {
                    ctrl_noted = true;
                    self.note(RepairKind::EscapedControlChar, i);
                }
                i += 1;
                continue;
            }
            let Some((q, qlen)) = self.quote_at(i) else {
                i += 1;
                continue;
            };
            let after = i + qlen;
            let exact = matches!(
                (open, q),
                (Quote::Double, Quote::Double)
                    | (Quote::Single, Quote::Single)
                    | (
                        Quote::TypoDoubleOpen | Quote::TypoDoubleClose,
                        Quote::TypoDoubleClose
                    )
                    | (
                        Quote::TypoSingleOpen | Quote::TypoSingleClose,
                        Quote::TypoSingleClose
                    )
            );
            if exact && open == Quote::Double {
                if let Some(fb) = fallback
                    && !self.exact_close_fits(after, ctx)
                {
                    out.push_str(self.s(seg, i));
                    return Ok(self.use_fallback(fb, out));
                }
                match self.double_close(content_start, i, after, ctx, &mut out, seg) {
                    Some(r) => return Ok(r),
                    None => {
                        self.note(RepairKind::UnescapedQuote, i);
                        self.quotes_taken += 1;
                        i = after;
                        continue;
                    }
                }
            }
            let closes = if exact {
                matches!(open, Quote::TypoDoubleOpen | Quote::TypoDoubleClose)
                    || self.delim_follows(after)
                    // `{'a' 'b'}`: a key, a blank, then the value without its colon.
                    || (ctx == Ctx::Key
                        && open == Quote::Single
                        && self.skip_plain_ws_from(after) > after
                        && self.quote_at(self.skip_plain_ws_from(after)).is_some())
            } else if matches!(q, Quote::TypoDoubleOpen | Quote::TypoSingleOpen)
                && open != Quote::TypoDoubleOpen
            {
                false
            } else if fallback.is_none()
                && (ctx == Ctx::Key || self.salvage)
                && self.strict_delim_follows(after, ctx)
            {
                fallback = Some(Fallback {
                    quote: i,
                    after,
                    out_len: out.len() + (i - seg),
                });
                false
            } else {
                false
            };
            if closes {
                out.push_str(self.s(seg, i));
                self.pos = after;
                return Ok((out, true));
            }
            i = after;
        }
    }

    /// The first byte at or after `i` that may end the plain run of a string body (a
    /// quote, a backslash, a control character or the lead byte of a typographic quote),
    /// or the end of the window. Eight bytes are tested at a time.
    fn scan_plain(&self, mut i: usize) -> usize {
        const ONES: u64 = 0x0101_0101_0101_0101;
        const HIGHS: u64 = 0x8080_8080_8080_8080;
        // Bytes of `w` equal to zero get their high bit set (no false negatives; a false
        // positive only sends the byte-wise loop below to look).
        let zero = |w: u64| w.wrapping_sub(ONES) & !w & HIGHS;
        while let Some(chunk) = self.b.get(i..i + 8) {
            let mut bytes = [0u8; 8];
            bytes.copy_from_slice(chunk);
            let w = u64::from_le_bytes(bytes);
            let hit = zero(w ^ (ONES * u64::from(b'"')))
                | zero(w ^ (ONES * u64::from(b'\'')))
                | zero(w ^ (ONES * u64::from(b'\\')))
                | zero(w ^ (ONES * 0xE2))
                // bytes below 0x20
                | (w.wrapping_sub(ONES * 0x20) & !w & HIGHS);
            if hit != 0 {
                break;
            }
            i += 8;
        }
        while let Some(&c) = self.b.get(i) {
            if SPECIAL[usize::from(c)] {
                break;
            }
            i += 1;
        }
        i
    }

    /// A string in backticks (a JavaScript template literal), read up to the next unescaped
    /// backtick. `` \` `` and `\$` are the characters themselves, other escapes are read as
    /// in JSON; everything else, double quotes and raw newlines included, is text.
    ///
    /// A backtick that is never closed is refused rather than read as a truncated string: it
    /// is far more likely the closing backtick of markdown inline code around truncated JSON,
    /// and reading the prose after it as a string would invent a value.
    fn backtick_string(&mut self, start: usize) -> Result<(String, bool), RepairError> {
        self.note(RepairKind::BacktickQuotes, start);
        let content_start = start + 1;
        let mut i = content_start;
        let mut seg = i;
        let mut out = String::new();
        loop {
            while i < self.end && !matches!(self.b[i], b'`' | b'\\') {
                i += 1;
            }
            match self.at(i) {
                None => return Err(self.err(start, "unexpected character '`'")),
                Some(b'`') => {
                    out.push_str(self.s(seg, i));
                    self.pos = i + 1;
                    return Ok((out, true));
                }
                Some(_) => {
                    out.push_str(self.s(seg, i));
                    i = match self.at(i + 1) {
                        Some(c @ (b'`' | b'$')) => {
                            out.push(char::from(c));
                            i + 2
                        }
                        _ => self.escape(i, Quote::Backtick, &mut out),
                    };
                    seg = i;
                }
            }
        }
    }

    /// A string delimited by `\"…\"` (escaped JSON whose outer quotes were lost).
    fn escaped_string(&mut self, start: usize) -> (String, bool) {
        if !self.escaped_noted {
            self.escaped_noted = true;
            self.note(RepairKind::DoubleEncoded, start);
        }
        let content_start = start + 2;
        let mut out = String::new();
        let mut seg = content_start;
        let mut i = content_start;
        // `\\\"` and `\\"` are a quote escaped inside the escaped text (`\"say \\\"hi\\\"\"`,
        // or written sloppily `\"say \\"hi\\"\"`); the first `\"` not preceded by another
        // backslash closes the string. Other escapes are kept as written.
        while let Some(c) = self.at(i) {
            if c != b'\\' {
                i += 1;
                continue;
            }
            match (self.at(i + 1), self.at(i + 2), self.at(i + 3)) {
                (Some(b'"'), _, _) => {
                    out.push_str(self.s(seg, i));
                    self.pos = i + 2;
                    return (out, true);
                }
                (Some(b'\\'), Some(b'"'), _) => {
                    out.push_str(self.s(seg, i));
                    out.push('"');
                    i += 3;
                    seg = i;
                }
                (Some(b'\\'), Some(b'\\'), Some(b'"')) => {
                    out.push_str(self.s(seg, i));
                    out.push('"');
                    i += 4;
                    seg = i;
                }
                _ => i += 2,
            }
        }
        out.push_str(self.s(seg, self.end.min(i)));
        self.remember_cut(Cut::String);
        self.note_truncated();
        self.pos = self.end;
        (out, false)
    }

    /// Whether a `"` closing a `"`-string is followed by what its context expects.
    fn exact_close_fits(&self, after: usize, ctx: Ctx) -> bool {
        match ctx {
            Ctx::Key => self.at(self.skip_plain_ws_from(after)) == Some(b':'),
            Ctx::Value => self.delim_follows(after),
        }
    }

    /// Closes the string at a remembered quote of the wrong kind.
    fn use_fallback(&mut self, fb: Fallback, mut out: String) -> (String, bool) {
        self.note(RepairKind::MismatchedQuote, fb.quote);
        out.truncate(fb.out_len);
        self.pos = fb.after;
        (out, true)
    }

    /// Decides what a `"` closing a `"`-string means. `None`: it is an unescaped quote
    /// inside the text, keep scanning.
    fn double_close(
        &mut self,
        content_start: usize,
        q: usize,
        after: usize,
        ctx: Ctx,
        out: &mut String,
        seg: usize,
    ) -> Option<(String, bool)> {
        let nx_pos = self.skip_plain_ws_from(after);
        let nx = self.at(nx_pos);
        let raw = self.s(content_start, q);
        match ctx {
            Ctx::Key => {
                if nx.is_some_and(|c| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'$'))
                    && !raw.contains('\\')
                    && let Some(colon) = raw.find(':')
                {
                    // `{"a: 1, "b": 2}`: the key's closing quote is missing; this quote opens
                    // the next key. (Before a closer, `"a: "}`, it is a closing quote, and
                    // splitting the key at its colon would make up a member.)
                    self.note(RepairKind::MissingQuote, content_start + colon);
                    self.pos = content_start + colon;
                    return Some((raw[..colon].trim_end().to_owned(), true));
                }
                // `{"k"e"y": 1}`: a quote with a letter or digit right after it, and a later
                // quote on the line followed by the colon: this one is text of the key.
                if nx_pos == after
                    && nx.is_some_and(|c| c.is_ascii_alphanumeric())
                    && self.colon_quote_ahead(after)
                {
                    return None;
                }
            }
            Ctx::Value => {
                if !self.value_delim_at(nx_pos) {
                    let t = raw.trim_end();
                    if t.ends_with(',') && self.next_item_string_at(q) {
                        // `"a, "b"`: the quote closing `a` is missing; this one opens `b`.
                        out.push_str(self.s(seg, q));
                        let cut = raw.len() - (t.len() - 1);
                        out.truncate(out.len().saturating_sub(cut));
                        let comma = content_start + t.len() - 1;
                        self.note(RepairKind::MissingQuote, comma);
                        self.pos = comma;
                        return Some((std::mem::take(out), true));
                    }
                    let same_line = !self.s(after, nx_pos).contains('\n');
                    // `"say "hi" now"`, `"<b id="x">"`, `"a "b": c"` in an object: what
                    // follows the quote on its line is more text, not the next token.
                    if same_line && nx.is_some_and(|c| self.text_follows_quote(c)) {
                        return None;
                    }
                    // `"a "b" ",`: this quote is text; the next one closes the string.
                    if same_line && nx == Some(b'"') && self.delim_follows(nx_pos + 1) {
                        return None;
                    }
                    // `"Windows "10""`, `"echo "$HOME""`: closing here would need what
                    // follows to be the next member or element, and it is not — so it is
                    // text of the string, whatever its shape. In an object that means a
                    // key and its colon: a key is never made up from string text.
                    if same_line && !self.next_item_fits(after, nx_pos) {
                        return None;
                    }
                } else if self.inner_quote_since_start() && !self.continuation_fits(nx_pos) {
                    // `"a "b", c."` in an object: a string that already holds a quote of
                    // its own closes only where the JSON can go on, so `, c."` is text.
                    return None;
                } else if self.inner_quote_since_start()
                    && !self.in_object()
                    && nx_pos == after
                    && nx == Some(b',')
                    && self.quote_at(nx_pos + 1).is_some()
                {
                    // `["echo "a","b""]`: in a string that already holds quotes of its own,
                    // `","` may be a quoted comma or the end of one string and the start of
                    // the next. Both readings give a value: refused.
                    self.loss.get_or_insert(self.err(
                        q,
                        "quotes around a comma inside a string: one string or two is unclear",
                    ));
                }
            }
        }
        if out.is_empty() {
            // The common case, a string with no escapes: one exact allocation.
            *out = self.s(seg, q).to_owned();
        } else {
            out.push_str(self.s(seg, q));
        }
        self.pos = after;
        Some((std::mem::take(out), true))
    }

    /// Whether the byte at `p` (after a `"` that may close a value string and the blanks
    /// after it) is what can follow a value here: a comma, a closer of an open value, the
    /// end, a `+` joining strings, a comment. `)` counts only inside a call or tuple and
    /// `:` only outside an object (`["key": 1]`), where each can be read.
    fn value_delim_at(&self, p: usize) -> bool {
        match self.at(p) {
            None | Some(b',' | b'}' | b']' | b'+' | b'#') => true,
            Some(b')') => self.open_call > 0,
            Some(b':') => !self.in_object(),
            Some(b'/') => matches!(self.at(p + 1), Some(b'/' | b'*')),
            Some(_) => false,
        }
    }

    /// After a `"` at `after - 1` that would close a value string with no delimiter after
    /// it, at `p` (the next non-blank byte on the line): whether what starts there can be the
    /// next member or element after a missing comma.
    ///
    /// In an object only a key followed by its colon can: a key is never made up from string
    /// text. Elsewhere, after a blank, another string, object or array can (`["a" "b"]`, the
    /// reading the public repair suites expect) and so can a number followed by a delimiter
    /// (`"a" 10, 2`, not `"a" 10" b`); nothing else can start a value there. A token
    /// written right against the quote (`"Windows "10""`, `"see "[1]" ok"`) is quoted text
    /// — unless it is another string followed by a delimiter (`["a""b"]`), and then the two
    /// readings (two strings, or one holding `""`) are both possible and the parse is
    /// refused.
    fn next_item_fits(&mut self, after: usize, p: usize) -> bool {
        if self.at(p) == Some(b'`') && self.s(p, self.end).starts_with("```") {
            // `{"a": "x"```: the closing fence of a code block, read after the value.
            return true;
        }
        if self.in_object() {
            return self.key_at(p);
        }
        if p > after {
            return if self.quote_at(p).is_some() || matches!(self.at(p), Some(b'{' | b'[')) {
                true
            } else if self
                .at(p)
                .is_some_and(|c| c.is_ascii_digit() || matches!(c, b'-' | b'+' | b'.'))
            {
                self.number_then_delim(p)
            } else {
                false
            };
        }
        let Some((_, qlen)) = self.quote_at(p) else {
            return false;
        };
        let as_next = self.string_then_delim(p, qlen);
        if as_next && self.quote_then_delim_ahead(p + qlen) {
            self.loss.get_or_insert(self.err(
                p,
                "quotes side by side inside a string: two strings or one is unclear",
            ));
        }
        as_next
    }

    /// Whether a number starting at `p` is followed by a value delimiter (bounded look-ahead):
    /// `"a" 10, 2` and not `"a" 10" b`.
    fn number_then_delim(&self, p: usize) -> bool {
        let limit = (p + KEY_LOOKAHEAD).min(self.end);
        let mut i = p + 1;
        while i < limit
            && self.at(i).is_some_and(|c| {
                c.is_ascii_digit() || matches!(c, b'.' | b'e' | b'E' | b'-' | b'+' | b'_')
            })
        {
            i += 1;
        }
        i >= self.end || (i < limit && self.value_delim_at(self.skip_plain_ws_from(i)))
    }

    /// Whether a string opened by the quote at `p` (of `qlen` bytes) closes on the same line
    /// and a value delimiter follows it (bounded look-ahead).
    fn string_then_delim(&self, p: usize, qlen: usize) -> bool {
        self.on_line_quotes(p + qlen, |q, _, l| {
            Some(self.value_delim_at(self.skip_plain_ws_from(q + l)))
        })
    }

    /// Whether a quote followed by a value delimiter comes later on the line from `i`: a
    /// place where a string open before `i` could end (bounded look-ahead).
    fn quote_then_delim_ahead(&self, i: usize) -> bool {
        self.on_line_quotes(i, |q, _, l| {
            self.value_delim_at(self.skip_plain_ws_from(q + l))
                .then_some(true)
        })
    }

    /// Walks the quotes on the line from `i`, escapes skipped, within [`KEY_LOOKAHEAD`] bytes:
    /// `at_quote` gets each quote's position, kind and length and answers `Some` to stop there
    /// with that answer. The end of the line or of the look-ahead answers `false`.
    fn on_line_quotes(
        &self,
        mut i: usize,
        mut at_quote: impl FnMut(usize, Quote, usize) -> Option<bool>,
    ) -> bool {
        let limit = (i + KEY_LOOKAHEAD).min(self.end);
        while i < limit {
            match self.at(i) {
                Some(b'\\') => i += 2,
                Some(b'\n') | None => return false,
                Some(_) => match self.quote_at(i) {
                    Some((q, l)) => {
                        if let Some(answer) = at_quote(i, q, l) {
                            return answer;
                        }
                        i += l;
                    }
                    None => i += 1,
                },
            }
        }
        false
    }

    /// Whether `c`, right after a `"` on the same line, is more text of the string (a
    /// letter, sentence or markup punctuation, `)` outside any call, `:` inside an
    /// object) rather than the start of the next token.
    fn text_follows_quote(&self, c: u8) -> bool {
        c.is_ascii_alphabetic()
            || matches!(
                c,
                b'.' | b'?'
                    | b'!'
                    | b';'
                    | b'<'
                    | b'>'
                    | b'='
                    | b'&'
                    | b'%'
                    | b'*'
                    | b'@'
                    | b'~'
                    | b'|'
                    | b'^'
                    | b'_'
            )
            || (c == b')' && self.open_call == 0)
            || (c == b':' && self.in_object())
            || (c >= 0x80 && c != 0xE2)
    }

    /// After the closing quote of a value string that holds one stray quote (`"v"alue"`):
    /// whether what follows proves that this quote ends the string, so the stray one is
    /// text — a comma and the next member's key and colon inside an object, or the end of
    /// the input after a root string (`"a 24" screen"`). The caller asks only for a string on
    /// one line: across a line break the stray quote may open another string (`"a +\n "b"`).
    /// Before a closing brace (`{"a":
    /// "v"alue"}`) the last quote may as well be text of a string whose own closing quote is
    /// missing, and in an array `"a" b"` may be two strings: both are refused.
    fn close_confirmed(&self) -> bool {
        let p = self.skip_plain_ws_from(self.pos);
        if self.stack.is_empty() {
            return p >= self.end;
        }
        self.in_object() && self.at(p) == Some(b',') && self.key_at(self.skip_plain_ws_from(p + 1))
    }

    /// Whether an unescaped quote was already taken as text in the string being read.
    fn inner_quote_since_start(&self) -> bool {
        self.quotes_taken > self.string_quotes_from
    }

    /// After a quote that would close a string holding quotes of its own, at `p` (the next
    /// non-blank byte): whether the JSON can go on from there — the end, another member
    /// or element after a comma, or a closer followed by what may follow it.
    fn continuation_fits(&self, p: usize) -> bool {
        let depth = self.stack.len();
        match self.at(p) {
            Some(b',') => self.item_follows(p + 1, depth),
            Some(b'}' | b']') => {
                let q = self.skip_plain_ws_from(p + 1);
                match self.at(q) {
                    None | Some(b'}' | b']') => true,
                    Some(b',') => depth >= 2 && self.item_follows(q + 1, depth - 1),
                    // Text after the root value is trailing garbage; inside, nothing fits.
                    Some(_) => depth <= 1,
                }
            }
            _ => true,
        }
    }

    /// After a comma at `p` inside the frame at `depth` (1 is the outermost): whether a
    /// member (a key and its colon) or an element starts there, or the frame closes.
    fn item_follows(&self, p: usize, depth: usize) -> bool {
        let p = self.skip_plain_ws_from(p);
        let in_object = depth
            .checked_sub(1)
            .and_then(|d| self.stack.get(d))
            .is_some_and(|f| matches!(f, Frame::Obj { .. }));
        if in_object {
            matches!(self.at(p), None | Some(b'}')) || self.key_at(p)
        } else {
            matches!(self.at(p), None | Some(b']' | b')')) || self.is_clear_value_start(p)
        }
    }

    /// Whether a key and its colon start at `p`: a quoted key closed on the same line, or
    /// a bare word, then `:`. The look-ahead is bounded, so it adds constant work.
    fn key_at(&self, p: usize) -> bool {
        let mut i = p;
        match self.quote_at(p) {
            Some((q, len)) => {
                i += len;
                let limit = (p + KEY_LOOKAHEAD).min(self.end);
                loop {
                    if i >= limit {
                        return false;
                    }
                    match self.at(i) {
                        Some(b'\\') => i += 2,
                        Some(b'\n') | None => return false,
                        Some(_) => match self.quote_at(i) {
                            Some((c, clen))
                                if c == q || (q != Quote::Double && q != Quote::Single) =>
                            {
                                i += clen;
                                break;
                            }
                            _ => i += 1,
                        },
                    }
                }
            }
            None => {
                if !self.at(p).is_some_and(is_ident_start) {
                    return false;
                }
                i = self.ident_end(p);
            }
        }
        self.at(self.skip_plain_ws_from(i)) == Some(b':')
    }

    /// Whether a `"` followed by a colon comes later on the line from `i` (bounded look-ahead).
    fn colon_quote_ahead(&self, i: usize) -> bool {
        self.on_line_quotes(i, |q, kind, _| {
            (kind == Quote::Double && self.at(self.skip_plain_ws_from(q + 1)) == Some(b':'))
                .then_some(true)
        })
    }

    /// At a `"` at `q` after `"a, ` in a value string: whether it opens the next item — a
    /// key followed by its colon in an object, a string followed by a delimiter in an
    /// array — so that the string before lost its closing quote (`{"a": "b, "c": 1}`).
    fn next_item_string_at(&self, q: usize) -> bool {
        if self.in_object() {
            return self.key_at(q);
        }
        let limit = (q + KEY_LOOKAHEAD).min(self.end);
        let mut i = q + 1;
        while i < limit {
            match self.at(i) {
                Some(b'\\') => i += 2,
                Some(b'\n') | None => return false,
                Some(b'"') => return self.value_delim_at(self.skip_plain_ws_from(i + 1)),
                Some(_) => i += 1,
            }
        }
        false
    }

    /// After a possible closing quote: is the next thing a delimiter?
    fn delim_follows(&self, after: usize) -> bool {
        let p = self.skip_plain_ws_from(after);
        matches!(
            self.at(p),
            None | Some(b',' | b'}' | b']' | b')' | b':' | b'+' | b'/' | b'#')
        )
    }

    /// Stricter test for a quote of the wrong kind closing a string.
    fn strict_delim_follows(&self, after: usize, ctx: Ctx) -> bool {
        let p = self.skip_plain_ws_from(after);
        match ctx {
            Ctx::Key => self.at(p) == Some(b':'),
            Ctx::Value => match self.at(p) {
                None | Some(b'}' | b']') => true,
                Some(b',') => {
                    let n = self.skip_plain_ws_from(p + 1);
                    matches!(self.at(n), None | Some(b'}' | b']')) || self.quote_at(n).is_some()
                }
                _ => false,
            },
        }
    }

    /// The input ended inside a string.
    fn unterminated(&mut self, mut out: String, content_start: usize, ctx: Ctx) -> (String, bool) {
        self.pos = self.end;
        if self.salvage && ctx == Ctx::Value && !self.stack.is_empty() {
            // `{"a": "hello}`: the closing quote may be missing before the closing brackets,
            // or the input may have been cut inside a string that holds `}`: only salvage
            // takes the guess.
            let raw = self.s(content_start, self.end);
            let bytes = raw.as_bytes();
            let mut j = bytes.len();
            let mut closers = Vec::new();
            while j > 0 {
                let c = bytes[j - 1];
                if matches!(c, b'}' | b']') && closers.len() < self.stack.len() {
                    closers.push(c);
                } else if !is_plain_ws(c) {
                    break;
                }
                j -= 1;
            }
            let expected = self
                .stack
                .iter()
                .rev()
                .take(closers.len())
                .map(|f| match f {
                    Frame::Arr(_) => b']',
                    Frame::Obj { .. } => b'}',
                    Frame::Call(_) | Frame::Tuple { .. } => b')',
                });
            if !closers.is_empty() && closers.iter().rev().copied().eq(expected) {
                let cut = raw.len() - j;
                out.truncate(out.len().saturating_sub(cut));
                self.pos = content_start + j;
                self.note(RepairKind::MissingQuote, self.pos);
                return (out, true);
            }
        }
        self.remember_cut(match ctx {
            Ctx::Key => Cut::Key,
            Ctx::Value => Cut::String,
        });
        self.note_truncated();
        (out, false)
    }

    /// Decodes the escape at `i` (a backslash) into `out`; returns the next position.
    fn escape(&mut self, i: usize, open: Quote, out: &mut String) -> usize {
        let Some(e) = self.at(i + 1) else {
            self.remember_cut(Cut::Escape);
            self.note_truncated();
            return self.end;
        };
        match e {
            b'"' | b'\\' | b'/' => out.push(char::from(e)),
            b'b' => out.push('\u{8}'),
            b'f' => out.push('\u{c}'),
            b'n' => out.push('\n'),
            b'r' => out.push('\r'),
            b't' => out.push('\t'),
            b'u' => return self.unicode_escape(i, out),
            b'\'' => {
                if !matches!(open, Quote::Single | Quote::Backtick) {
                    self.note(RepairKind::InvalidEscape, i);
                }
                out.push('\'');
            }
            _ => {
                self.note(RepairKind::InvalidEscape, i);
                if let Some((_, qlen)) = self.quote_at(i + 1) {
                    out.push_str(self.s(i + 1, i + 1 + qlen));
                    return i + 1 + qlen;
                }
                // Keep the backslash; the next character stays as text.
                out.push('\\');
                return i + 1;
            }
        }
        i + 2
    }

    fn hex4(&self, i: usize) -> Option<u32> {
        let h = self.s(i, i + 4);
        if h.len() == 4 && h.bytes().all(|c| c.is_ascii_hexdigit()) {
            u32::from_str_radix(h, 16).ok()
        } else {
            None
        }
    }

    fn unicode_escape(&mut self, i: usize, out: &mut String) -> usize {
        let Some(cu) = self.hex4(i + 2) else {
            if i + 6 > self.end
                && self
                    .s(i + 2, self.end)
                    .bytes()
                    .all(|c| c.is_ascii_hexdigit())
            {
                // `\u12` cut off by truncation: drop the partial escape.
                self.remember_cut(Cut::Escape);
                self.note_truncated();
                return self.end;
            }
            // `\uZ000`, `\u26"`: the character meant is unknown.
            self.invalid_unicode(i);
            out.push_str("\\u");
            return i + 2;
        };
        if (0xD800..0xDC00).contains(&cu)
            && self.at(i + 6) == Some(b'\\')
            && self.at(i + 7) == Some(b'u')
            && let Some(lo) = self.hex4(i + 8).filter(|lo| (0xDC00..0xE000).contains(lo))
        {
            let c = 0x10000 + ((cu - 0xD800) << 10) + (lo - 0xDC00);
            out.push(char::from_u32(c).unwrap_or('\u{FFFD}'));
            return i + 12;
        }
        match char::from_u32(cu) {
            Some(c) => out.push(c),
            None => {
                // A lone surrogate (`\ud800`): no character; U+FFFD would replace data.
                self.invalid_unicode(i);
                out.push('\u{FFFD}');
            }
        }
        i + 6
    }

    /// A `\u` escape at `i` that names no character: refused, or kept as text when
    /// salvaging.
    fn invalid_unicode(&mut self, i: usize) {
        self.note(RepairKind::InvalidEscape, i);
        if !self.salvage {
            self.loss.get_or_insert(RepairError::Unrepairable {
                offset: i,
                reason: "a \\u escape that names no character".into(),
            });
        }
    }
}

/// A quote of the wrong kind that may close a string.
#[derive(Debug, Clone, Copy)]
struct Fallback {
    /// Where the quote is.
    quote: usize,
    /// The position after it.
    after: usize,
    /// The length of the decoded text up to it.
    out_len: usize,
}

/// Whether comment text could hold data a comment running to the end would swallow.
fn holds_data(text: &str) -> bool {
    text.bytes()
        .any(|b| matches!(b, b'"' | b'\'' | b':' | b',' | b'{' | b'}' | b'[' | b']'))
}

/// Converts normalised number text to a JSON number; `None` when out of range.
fn number_value(text: &str, is_float: bool) -> Option<Value> {
    if !is_float {
        if let Ok(n) = text.parse::<i64>() {
            return Some(Value::from(n));
        }
        if let Ok(n) = text.parse::<u64>() {
            return Some(Value::from(n));
        }
    }
    let f: f64 = text.parse().ok()?;
    if !f.is_finite() {
        return None;
    }
    serde_json::Number::from_f64(f).map(Value::Number)
}
