//! Offsets inside a double-encoded document, mapped back to the input.
//!
//! When the model returns a JSON document encoded as a string (`"{\"a\": 1,}"`), the inner
//! document is repaired after unescaping, so its repairs carry offsets into the unescaped
//! text. This module walks the string literal in the input alongside the unescaped text and
//! moves each offset to the input position of the character it points at.
//!
//! The mapping is exact for every character the parser reads from one literal: plain text,
//! raw control characters and every escape (`\"`, `\\`, `\n`, `\u00e9`, surrogate pairs,
//! escapes kept literally because they are invalid). An offset lands on the first byte of
//! its character's spelling in the input — the backslash, for a character written as an
//! escape. It is approximate where the unescaped text is not the text of one literal: when
//! literals were joined (`"{\"a\":" + " 1}"`), past the end of the first one. From the first
//! character that cannot be aligned on, offsets fall back to the start of the literal, which
//! still points at the string that held the document.

use crate::Repair;

/// Translates the offsets of `repairs`, which point into `decoded` — the text read from the
/// string literal that spans `literal` (`start..end`, quotes included) in `src` — into
/// offsets in `src`. Sorts `repairs` by offset.
pub(crate) fn map_to_input(
    src: &str,
    literal: (usize, usize),
    decoded: &str,
    repairs: &mut [Repair],
) {
    let (start, end) = literal;
    let open = match src.as_bytes().get(start) {
        Some(b'"' | b'\'' | b'`') => Some(1),
        Some(b'\\') => Some(2),
        // The typographic quotes are three bytes long.
        Some(0xE2) => Some(3),
        _ => None,
    };
    repairs.sort_by_key(|r| r.offset);
    let mut lost = open.is_none();
    // `j` is where the character at offset `d` of `decoded` is spelled in `src`.
    let mut j = start + open.unwrap_or(0);
    let mut d = 0;
    for r in repairs.iter_mut() {
        while !lost && d < r.offset {
            let Some(c) = decoded.get(d..).and_then(|t| t.chars().next()) else {
                lost = true;
                break;
            };
            if d + c.len_utf8() > r.offset {
                // Inside a character: point at its start.
                break;
            }
            match spelling_len(src, j, end, c) {
                Some(n) => {
                    j += n;
                    d += c.len_utf8();
                }
                None => lost = true,
            }
        }
        // The character the offset points at must be spelled there too.
        if !lost
            && d == r.offset
            && let Some(c) = decoded.get(d..).and_then(|t| t.chars().next())
            && spelling_len(src, j, end, c).is_none()
        {
            lost = true;
        }
        r.offset = if lost { start } else { j };
    }
}

/// The length of the spelling of `c` at `j` in `src`, not reaching past `end`; `None` when
/// `c` is not spelled there.
fn spelling_len(src: &str, j: usize, end: usize, c: char) -> Option<usize> {
    let rest = src.get(j..end)?;
    if rest.starts_with('\\')
        && let Some(n) = escape_len(rest, c)
    {
        return Some(n);
    }
    // An invalid escape keeps its backslash as text, so a literal match comes second.
    rest.starts_with(c).then_some(c.len_utf8())
}

/// The length of the escape at the start of `rest` (a backslash) if it spells `c`.
fn escape_len(rest: &str, c: char) -> Option<usize> {
    let after = rest.get(1..)?;
    // `\"`, `\\`, `\/`, `\'`, `` \` ``, `\$`, a backslash before a typographic quote.
    if !c.is_ascii_alphanumeric() && after.starts_with(c) {
        return Some(1 + c.len_utf8());
    }
    let simple = match after.as_bytes().first()? {
        b'b' => '\u{8}',
        b'f' => '\u{c}',
        b'n' => '\n',
        b'r' => '\r',
        b't' => '\t',
        b'u' => return unicode_escape_len(after, c),
        _ => return None,
    };
    (simple == c).then_some(2)
}

/// `\uXXXX`, or a surrogate pair `\uXXXX\uXXXX`, spelling `c`; `after` starts at the `u`.
fn unicode_escape_len(after: &str, c: char) -> Option<usize> {
    let hi = hex4(after.get(1..5)?)?;
    if (0xD800..0xDC00).contains(&hi)
        && after.get(5..7) == Some("\\u")
        && let Some(lo) = after
            .get(7..11)
            .and_then(hex4)
            .filter(|lo| (0xDC00..0xE000).contains(lo))
    {
        let pair = 0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00);
        return (char::from_u32(pair) == Some(c)).then_some(12);
    }
    // A lone surrogate was read as U+FFFD.
    (char::from_u32(hi).unwrap_or('\u{FFFD}') == c).then_some(6)
}

fn hex4(h: &str) -> Option<u32> {
    if h.len() == 4 && h.bytes().all(|b| b.is_ascii_hexdigit()) {
        u32::from_str_radix(h, 16).ok()
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::RepairKind;

    fn mapped(src: &str, decoded: &str, offsets: &[usize]) -> Vec<usize> {
        let mut repairs: Vec<Repair> = offsets
            .iter()
            .map(|&offset| Repair {
                kind: RepairKind::TrailingComma,
                offset,
            })
            .collect();
        map_to_input(src, (0, src.len()), decoded, &mut repairs);
        repairs.iter().map(|r| r.offset).collect()
    }

    #[test]
    fn maps_through_each_kind_of_escape() {
        // decoded: {"é":"😀\n"} then a comma
        let src = r#""{\"\u00e9\":\"\ud83d\ude00\n\",}""#;
        let decoded = "{\"é\":\"😀\n\",}";
        let comma = decoded.find(',').unwrap_or_default();
        let close = decoded.find('}').unwrap_or_default();
        let got = mapped(src, decoded, &[0, comma, close, decoded.len()]);
        assert_eq!(&src[got[0]..=got[0]], "{");
        assert_eq!(&src[got[1]..=got[1]], ",");
        assert_eq!(&src[got[2]..=got[2]], "}");
        assert_eq!(got[3], src.len() - 1);
    }

    #[test]
    fn invalid_escapes_kept_as_text_still_align() {
        // The parser keeps `\q` and `\uZZ` as text.
        let src = r#"'a\q\uZZ,'"#;
        let decoded = r"a\q\uZZ,";
        assert_eq!(mapped(src, decoded, &[7]), vec![8]);
    }

    #[test]
    fn text_from_another_literal_falls_back_to_the_literal_start() {
        let src = r#""[1" + ",]""#;
        assert_eq!(mapped(src, "[1,]", &[1, 2]), vec![2, 0]);
    }
}
