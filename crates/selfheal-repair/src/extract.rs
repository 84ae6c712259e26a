//! Finding the JSON in a model's answer.
//!
//! Models wrap JSON in markdown code fences, in tags such as `<tool_call>…</tool_call>`, or in
//! prose ("Here is the result: {…} Let me know…"). This module picks the window that holds the
//! JSON, runs the [`Parser`] on it, and handles what follows the first value: more values
//! (newline-delimited JSON), stray closing brackets, a JSONP `;`, or trailing text.
//!
//! Every search moves forward: a failed attempt at a candidate start resumes the search after
//! the point where that attempt failed, so a document costs linear time however many
//! candidates it holds.

use serde_json::Value;

use crate::literal::Literals;
use crate::parser::Parser;
use crate::{Repair, RepairError, RepairKind, RepairOptions};

/// How many fences or tags are tried before giving up on them.
const MAX_WRAPPERS: usize = 8;

/// A value parsed from a window, with the repairs it needed.
pub(crate) struct Found {
    pub(crate) value: Value,
    pub(crate) repairs: Vec<Repair>,
    /// When the value is a string: where its literal starts in the input and where that
    /// literal ends (the first one, if strings were concatenated).
    pub(crate) root_string: Option<(usize, usize)>,
    /// Number literals the value cannot hold exactly.
    pub(crate) literals: Literals,
    /// Repairs made but not listed in `repairs` (past the parser's limit).
    pub(crate) unlisted: usize,
}

/// Parses the whole input: fences first, then tag wrappers, then plain text.
pub(crate) fn parse_document(src: &str, opts: &RepairOptions) -> Result<Found, RepairError> {
    parse_window(src, 0, src.len(), opts, true, true)
}

fn parse_window(
    src: &str,
    start: usize,
    end: usize,
    opts: &RepairOptions,
    allow_fence: bool,
    allow_tag: bool,
) -> Result<Found, RepairError> {
    let starts_with_json = src
        .get(start..end)
        .and_then(|w| w.trim_start().bytes().next())
        .is_some_and(|b| b == b'{' || b == b'[');
    let window = src.get(start..end).unwrap_or_default();
    if starts_with_json {
        // The input is the JSON: fences or tags inside its strings are text, not wrappers.
        let json_at = start + (window.len() - window.trim_start().len());
        let wrap = Wrap {
            allow_fence,
            allow_tag,
        };
        return plain_first(src, start, end, opts, wrap, json_at, None);
    }
    let first_wrapper = [find_fence(window), window.find('<')]
        .into_iter()
        .flatten()
        .min();
    let Some(w) = first_wrapper else {
        // No fence and no tag: the plain text is all there is.
        return parse_plain(src, start, end, opts);
    };
    // A bracket before the first fence or tag may open a value whose strings hold the
    // fence: read the plain text first then, so that a fence inside a value is never taken
    // for a wrapper.
    if let Some(b) = window.find(['{', '['])
        && b < w
    {
        let close = balanced_end(src, start + b, end);
        if close.is_none_or(|close| close > start + w) {
            let wrap = Wrap {
                allow_fence,
                allow_tag,
            };
            return plain_first(src, start, end, opts, wrap, start + b, Some(close));
        }
    }
    let mut wrapper_err = None;
    match try_wrappers(src, start, end, opts, allow_fence, allow_tag) {
        Some(Ok(found)) => return Ok(found),
        Some(Err(e)) if e.is_final() => return Err(e),
        Some(Err(e)) => wrapper_err = Some(e),
        None => {}
    }
    match parse_plain(src, start, end, opts) {
        Ok(found) => Ok(found),
        Err(e) if e.is_final() => Err(e),
        Err(e) => Err(wrapper_err.unwrap_or(e)),
    }
}

/// Which wrappers a window may be read from.
#[derive(Clone, Copy)]
struct Wrap {
    allow_fence: bool,
    allow_tag: bool,
}

/// Reads the plain text of a window whose value opens at `at` (where it closes, when
/// already known: `close`). If that fails, only a fence or tag after the failed value may
/// stand in — one inside it would be a fragment of it.
fn plain_first(
    src: &str,
    start: usize,
    end: usize,
    opts: &RepairOptions,
    wrap: Wrap,
    at: usize,
    close: Option<Option<usize>>,
) -> Result<Found, RepairError> {
    match parse_plain(src, start, end, opts) {
        Ok(found) => Ok(found),
        Err(e) if e.is_final() => Err(e),
        Err(e) => {
            let Some(after) = close.unwrap_or_else(|| balanced_end(src, at, end)) else {
                return Err(e);
            };
            match try_wrappers(src, after, end, opts, wrap.allow_fence, wrap.allow_tag) {
                Some(Ok(found)) => Ok(found),
                _ => Err(e),
            }
        }
    }
}

/// Tries code fences, then tag wrappers.
fn try_wrappers(
    src: &str,
    start: usize,
    end: usize,
    opts: &RepairOptions,
    allow_fence: bool,
    allow_tag: bool,
) -> Option<Result<Found, RepairError>> {
    let mut wrapper_err = None;
    if allow_fence {
        match try_fences(src, start, end, opts) {
            Some(Ok(found)) => return Some(Ok(found)),
            Some(Err(e)) if e.is_final() => return Some(Err(e)),
            Some(Err(e)) => wrapper_err = Some(e),
            None => {}
        }
    }
    if allow_tag {
        match try_tags(src, start, end, opts) {
            Some(Ok(found)) => return Some(Ok(found)),
            Some(Err(e)) if e.is_final() => return Some(Err(e)),
            Some(Err(e)) => {
                wrapper_err.get_or_insert(e);
            }
            None => {}
        }
    }
    wrapper_err.map(Err)
}

/// Tries the content of each markdown code fence in turn.
fn try_fences(
    src: &str,
    start: usize,
    end: usize,
    opts: &RepairOptions,
) -> Option<Result<Found, RepairError>> {
    let window = src.get(start..end)?;
    let mut from = 0;
    let mut first_err = None;
    let mut values = Vec::new();
    for _ in 0..MAX_WRAPPERS {
        let Some(open) = window.get(from..).and_then(find_fence).map(|o| from + o) else {
            break;
        };
        let lang_start = open + 3;
        let lang_len = window
            .get(lang_start..)
            .unwrap_or_default()
            .bytes()
            .take_while(|c| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'+' | b'.' | b'-'))
            .count();
        let content_start = lang_start + lang_len;
        let close = window
            .get(content_start..)
            .and_then(find_fence)
            .map(|c| content_start + c);
        let content_end = close.unwrap_or(window.len());
        match parse_window(
            src,
            start + content_start,
            start + content_end,
            opts,
            false,
            true,
        ) {
            Ok(mut found) => {
                found.repairs.push(Repair {
                    kind: RepairKind::CodeFence,
                    offset: start + open,
                });
                values.push((found, start + open));
            }
            Err(e) if e.is_final() => return Some(Err(e)),
            Err(e) => {
                first_err.get_or_insert(e);
            }
        }
        match close {
            Some(c) => from = c + 3,
            None => break,
        }
    }
    gather(values, opts).or_else(|| first_err.map(Err))
}

/// Where the first markdown fence (three backticks) in `text` starts. Looks for single
/// backticks with `memchr` first: most text has none, and a three-byte substring search
/// costs several times more per byte.
fn find_fence(text: &str) -> Option<usize> {
    let mut from = 0;
    while let Some(at) = text.get(from..).and_then(|t| t.find('`')).map(|o| from + o) {
        if text.get(at..).is_some_and(|t| t.starts_with("```")) {
            return Some(at);
        }
        from = at + 1;
    }
    None
}

/// The values found in several wrappers: one is the value; several are an array only when
/// asked ([`RepairOptions::multiple`]), else refused — which one is meant would be a guess.
fn gather(
    mut values: Vec<(Found, usize)>,
    opts: &RepairOptions,
) -> Option<Result<Found, RepairError>> {
    match values.len() {
        0 => None,
        1 => values.pop().map(|(f, _)| Ok(f)),
        _ if !opts.multiple => {
            let offset = values.get(1).map_or(0, |(_, at)| *at);
            Some(Err(RepairError::MultipleValues { offset }))
        }
        _ => {
            let mut repairs = Vec::new();
            let mut items = Vec::new();
            let mut literals = Literals::default();
            let mut unlisted = 0;
            let second = values.get(1).map_or(0, |(_, at)| *at);
            for (f, _) in values {
                unlisted += f.unlisted;
                repairs.extend(f.repairs);
                literals.extend(f.literals.prefixed(&format!("/{}", items.len())));
                items.push(f.value);
            }
            repairs.push(Repair {
                kind: RepairKind::NdjsonToArray,
                offset: second,
            });
            Some(Ok(Found {
                value: Value::Array(items),
                repairs,
                root_string: None,
                literals,
                unlisted,
            }))
        }
    }
}

/// Tries the content of tag wrappers such as `<tool_call>` whose content starts with `{`
/// or `[`.
fn try_tags(
    src: &str,
    start: usize,
    end: usize,
    opts: &RepairOptions,
) -> Option<Result<Found, RepairError>> {
    let window = src.get(start..end)?;
    let bytes = window.as_bytes();
    let mut from = 0;
    let mut tried = 0;
    let mut first_err = None;
    let mut values = Vec::new();
    while tried < MAX_WRAPPERS {
        let Some(lt) = window
            .get(from..)
            .and_then(|w| w.find('<'))
            .map(|o| from + o)
        else {
            break;
        };
        from = lt + 1;
        let Some((name, content_start)) = tag_at(bytes, lt) else {
            continue;
        };
        let first = content_start
            + bytes
                .get(content_start..)
                .unwrap_or_default()
                .iter()
                .take_while(|c| c.is_ascii_whitespace())
                .count();
        if !matches!(bytes.get(first), Some(b'{' | b'[')) {
            continue;
        }
        tried += 1;
        let close_tag = format!("</{name}");
        let content_end = window
            .get(content_start..)
            .and_then(|w| w.find(&close_tag))
            .map_or(window.len(), |c| content_start + c);
        match parse_window(
            src,
            start + content_start,
            start + content_end,
            opts,
            false,
            false,
        ) {
            Ok(mut found) => {
                found.repairs.push(Repair {
                    kind: RepairKind::TagWrapper,
                    offset: start + lt,
                });
                values.push((found, start + lt));
            }
            Err(e) if e.is_final() => return Some(Err(e)),
            Err(e) => {
                first_err.get_or_insert(e);
            }
        }
        from = content_end.max(from);
    }
    gather(values, opts).or_else(|| first_err.map(Err))
}

/// An opening tag `<name attr…>` at `lt`: its name and the position after `>`.
fn tag_at(bytes: &[u8], lt: usize) -> Option<(&str, usize)> {
    let name_start = lt + 1;
    if !bytes.get(name_start)?.is_ascii_alphabetic() {
        return None;
    }
    let name_len = bytes
        .get(name_start..)?
        .iter()
        .take(64)
        .take_while(|c| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'-' | b':'))
        .count();
    let name_end = name_start + name_len;
    let mut i = name_end;
    let limit = name_end + 256;
    loop {
        match bytes.get(i)? {
            b'>' => break,
            b'<' => return None,
            _ if i >= limit => return None,
            _ => i += 1,
        }
    }
    let name = std::str::from_utf8(bytes.get(name_start..name_end)?).ok()?;
    Some((name, i + 1))
}

/// Parses plain text: the JSON at its start, or the first candidate `{`/`[` in the prose.
fn parse_plain(
    src: &str,
    start: usize,
    end: usize,
    opts: &RepairOptions,
) -> Result<Found, RepairError> {
    let mut lead = Parser::with_options(src, start, end, opts);
    lead.skip_ws();
    let first = lead.pos;
    if first >= lead.end() {
        return Err(RepairError::NoJson);
    }
    let lead_repairs = std::mem::take(&mut lead.repairs);
    let mut first_err: Option<RepairError> = None;
    let mut cand_from = first;
    if lead.is_clear_value_start(first) {
        match attempt(src, first, end, opts, true) {
            Ok((found, None)) => return Ok(with_lead(found, lead_repairs)),
            Ok((mut found, Some(garbage))) => {
                if found.value.is_object() || found.value.is_array() {
                    second_value_after(src, garbage, end, opts)?;
                    found.repairs.push(Repair {
                        kind: RepairKind::TrailingGarbage,
                        offset: garbage,
                    });
                    return Ok(with_lead(found, lead_repairs));
                }
                // A scalar followed by text is prose ("1. First, …"), not JSON.
                cand_from = garbage.max(first + 1);
            }
            Err(e) if e.is_final() || json_like(src, first, end) => return Err(e),
            Err(e) => {
                // Whatever follows inside a bracketed value that failed is a fragment of it.
                let resume = if matches!(src.as_bytes().get(first), Some(b'{' | b'[')) {
                    match balanced_end(src, first, end) {
                        Some(close) => close,
                        None => return Err(e),
                    }
                } else {
                    first + 1
                };
                cand_from = e.offset().unwrap_or(first).max(resume);
                first_err = Some(e);
            }
        }
    }
    let bytes = src.as_bytes();
    while cand_from < end {
        let Some(c) = bytes
            .get(cand_from..end)
            .and_then(|w| w.iter().position(|&b| b == b'{' || b == b'['))
            .map(|o| cand_from + o)
        else {
            break;
        };
        match attempt(src, c, end, opts, false) {
            Ok((mut found, garbage)) => {
                let prefix = src.get(first..c).unwrap_or_default();
                let kind = if prefix.chars().any(char::is_alphanumeric) {
                    RepairKind::ExtractedFromProse
                } else {
                    RepairKind::LeadingGarbage
                };
                found.repairs.push(Repair {
                    kind,
                    offset: first,
                });
                if let Some(g) = garbage {
                    second_value_after(src, g, end, opts)?;
                    found.repairs.push(Repair {
                        kind: RepairKind::TrailingGarbage,
                        offset: g,
                    });
                }
                return Ok(with_lead(found, lead_repairs));
            }
            // A failed value that looked like JSON is the answer, broken: nothing later is
            // taken in its place.
            Err(e) if e.is_final() || json_like(src, c, end) => return Err(first_err.unwrap_or(e)),
            Err(e) => {
                let Some(close) = balanced_end(src, c, end) else {
                    return Err(first_err.unwrap_or(e));
                };
                cand_from = e.offset().unwrap_or(c).max(close);
                first_err.get_or_insert(e);
            }
        }
    }
    Err(first_err.unwrap_or(RepairError::NoJson))
}

/// Whether the bracket at `at` opens what looks like JSON (`{"`, `['`, `[{`, `[1`) rather than
/// a bracketed phrase (`{name}`, `[see below]`).
fn json_like(src: &str, at: usize, end: usize) -> bool {
    let Some(rest) = src.get(at..end) else {
        return false;
    };
    let mut it = rest.bytes();
    let open = it.next();
    match (open, it.find(|c| !c.is_ascii_whitespace())) {
        (Some(b'{'), Some(c)) => matches!(c, b'"' | b'\''),
        (Some(b'['), Some(c)) => matches!(c, b'"' | b'\'' | b'{' | b'[') || c.is_ascii_digit(),
        _ => false,
    }
}

/// After a value found in prose, the text from `at` on: refused with
/// [`RepairError::MultipleValues`] when it holds another value that looks like JSON and
/// parses (`Example: {..}. Actually use {..}`), since which one is meant is a guess.
fn second_value_after(
    src: &str,
    at: usize,
    end: usize,
    opts: &RepairOptions,
) -> Result<(), RepairError> {
    let bytes = src.as_bytes();
    let mut from = at;
    while let Some(c) = bytes
        .get(from..end)
        .and_then(|w| w.iter().position(|&b| b == b'{' || b == b'['))
        .map(|o| from + o)
    {
        if json_like(src, c, end) {
            return match attempt(src, c, end, opts, false) {
                Ok(_) => Err(RepairError::MultipleValues { offset: c }),
                Err(_) => Ok(()),
            };
        }
        from = c + 1;
    }
    Ok(())
}

/// Where the bracketed text opened at `at` closes: the position after the bracket that
/// balances it, counting brackets outside double-quoted strings; `None` when it never
/// closes. A later candidate before that point would be a fragment of a value that failed,
/// and one that never closes leaves no later candidate that is not a fragment.
fn balanced_end(src: &str, at: usize, end: usize) -> Option<usize> {
    let bytes = src.as_bytes().get(at..end)?;
    let mut depth = 0usize;
    let mut in_string = false;
    let mut escaped = false;
    for (i, &b) in bytes.iter().enumerate() {
        if in_string {
            match b {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'{' | b'[' => depth += 1,
            b'}' | b']' => {
                depth = depth.saturating_sub(1);
                if depth == 0 {
                    return Some(at + i + 1);
                }
            }
            _ => {}
        }
    }
    None
}

fn with_lead(mut found: Found, mut lead: Vec<Repair>) -> Found {
    if !lead.is_empty() {
        lead.append(&mut found.repairs);
        found.repairs = lead;
    }
    found
}

/// Parses the value at `at` and whatever follows it. Returns the offset of trailing text
/// that was not JSON, if any.
fn attempt(
    src: &str,
    at: usize,
    end: usize,
    opts: &RepairOptions,
    at_start: bool,
) -> Result<(Found, Option<usize>), RepairError> {
    let mut p = Parser::with_options(src, at, end, opts);
    p.bare_words_in_arrays = at_start;
    let first = p.parse_value()?;
    let root_string = p.root_string.take().filter(|_| first.is_string());
    let first_end = p.pos;
    let first_repairs = p.noted();
    let first_is_scalar = !(first.is_object() || first.is_array());
    let mut items = vec![first];
    // Each item's literals, pointed from its own root.
    let mut item_literals = vec![std::mem::take(&mut p.literals)];
    let mut ndjson_at = None;
    let mut garbage = None;
    loop {
        p.skip_ws();
        let Some(c) = p.peek() else { break };
        match c {
            b';' if p.jsonp => p.pos += 1,
            b'}' | b']' | b')' => {
                p.note(RepairKind::RedundantClosing, p.pos);
                p.pos += 1;
            }
            _ if c == b',' || (c != b'(' && p.is_clear_value_start(p.pos)) => {
                let (save_pos, save_len) = (p.pos, p.noted());
                loop {
                    p.skip_ws();
                    if p.peek() == Some(b',') {
                        p.pos += 1;
                    } else {
                        break;
                    }
                }
                if p.is_clear_value_start(p.pos) {
                    match p.parse_value() {
                        Ok(v) => {
                            ndjson_at.get_or_insert(save_pos);
                            items.push(v);
                            item_literals.push(std::mem::take(&mut p.literals));
                            continue;
                        }
                        Err(e) if e.is_final() => return Err(e),
                        Err(_) => {}
                    }
                }
                p.pos = save_pos;
                p.forget_since(save_len);
                p.literals = Literals::default();
                garbage = Some(save_pos);
                break;
            }
            _ => {
                garbage = Some(p.pos);
                break;
            }
        }
    }
    if first_is_scalar && items.len() > 1 && (garbage.is_some() || p.noted() > first_repairs) {
        // Scalars in a row are a list only when they are clean JSON ("1, 2, 3"), not prose
        // that happens to start with a number or a quote ("1, 2 and 3").
        items.truncate(1);
        item_literals.truncate(1);
        p.forget_since(first_repairs);
        garbage = Some(first_end);
    }
    let value = if items.len() > 1 {
        let off = ndjson_at.unwrap_or(first_end);
        if !opts.multiple {
            return Err(RepairError::MultipleValues { offset: off });
        }
        p.note(RepairKind::NdjsonToArray, off);
        for (i, l) in item_literals.iter_mut().enumerate() {
            *l = std::mem::take(l).prefixed(&format!("/{i}"));
        }
        Value::Array(items)
    } else {
        items.pop().unwrap_or(Value::Null)
    };
    let mut literals = Literals::default();
    for l in item_literals {
        literals.extend(l);
    }
    Ok((
        Found {
            root_string: root_string.filter(|_| value.is_string()),
            value,
            repairs: p.repairs,
            literals,
            unlisted: p.unlisted,
        },
        garbage,
    ))
}
