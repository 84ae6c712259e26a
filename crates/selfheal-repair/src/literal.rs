//! Number literals kept as written when a repaired value is turned back into text.
//!
//! Why: a repaired document is parsed into a [`serde_json::Value`], whose numbers are `i64`,
//! `u64` or `f64`. A literal with more significant digits than an `f64` holds
//! (`1180591620717411303424`, `3.14159265358979323846`) would come back as another number
//! (`1.1805916207174113e21`): digits the model wrote, lost. The parser records such literals
//! with the place they stand (a JSON pointer) and [`Literals::render`] writes them back as
//! written. A literal that cannot be placed again makes the rendering fail, so the caller
//! refuses instead of passing on a number the model never wrote.

use serde_json::Value;

/// Significant digits an `f64` always carries exactly (`f64::DIGITS`): a literal with no more
/// than these comes back equal in value from its shortest rendering.
const EXACT_DIGITS: usize = f64::DIGITS as usize;

/// The number literals of a repaired input that its [`Value`] cannot hold exactly.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Literals {
    /// (JSON pointer, the value as parsed, the literal as written).
    entries: Vec<(String, f64, String)>,
}

/// A recorded literal could not be written back where it stood: the value no longer holds
/// that number there (it was coerced, dropped or moved).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("a number with more digits than a double holds could not be kept as written")]
pub struct LostDigits;

impl Literals {
    /// Whether no literal needs keeping (the value renders exactly as it is).
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Records `literal`, parsed as `value`, at `pointer`.
    pub(crate) fn push(&mut self, pointer: String, value: f64, literal: String) {
        self.entries.push((pointer, value, literal));
    }

    /// Moves every literal under `prefix` (the value was wrapped, e.g. into an array).
    pub(crate) fn prefixed(mut self, prefix: &str) -> Self {
        for (p, _, _) in &mut self.entries {
            p.insert_str(0, prefix);
        }
        self
    }

    /// The literals under `prefix` (a JSON pointer), pointed from there: for rendering a
    /// part of the value on its own.
    #[must_use]
    pub fn under(&self, prefix: &str) -> Self {
        let entries = self
            .entries
            .iter()
            .filter_map(|(p, v, l)| {
                let rest = p.strip_prefix(prefix)?;
                (rest.is_empty() || rest.starts_with('/')).then(|| (rest.to_owned(), *v, l.clone()))
            })
            .collect();
        Self { entries }
    }

    /// Appends `other`'s literals.
    pub(crate) fn extend(&mut self, other: Self) {
        self.entries.extend(other.entries);
    }

    /// `value` as compact JSON text, with every recorded literal written as it was in the
    /// input.
    ///
    /// # Errors
    ///
    /// [`LostDigits`] when a recorded literal's place no longer holds its number.
    pub fn render(&self, value: &Value) -> Result<String, LostDigits> {
        if self.entries.is_empty() {
            return Ok(value.to_string());
        }
        let mut out = String::new();
        let mut pointer = String::new();
        let mut used = 0;
        self.write(value, &mut pointer, &mut out, &mut used);
        if used == self.entries.len() {
            Ok(out)
        } else {
            Err(LostDigits)
        }
    }

    fn write(&self, value: &Value, pointer: &mut String, out: &mut String, used: &mut usize) {
        match value {
            Value::Object(map) => {
                out.push('{');
                for (i, (k, v)) in map.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    out.push_str(&Value::String(k.clone()).to_string());
                    out.push(':');
                    let len = pointer.len();
                    pointer.push('/');
                    pointer.push_str(&k.replace('~', "~0").replace('/', "~1"));
                    self.write(v, pointer, out, used);
                    pointer.truncate(len);
                }
                out.push('}');
            }
            Value::Array(items) => {
                out.push('[');
                for (i, v) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    let len = pointer.len();
                    pointer.push('/');
                    pointer.push_str(&i.to_string());
                    self.write(v, pointer, out, used);
                    pointer.truncate(len);
                }
                out.push(']');
            }
            Value::Number(n) => {
                let kept = self.entries.iter().find(|(p, parsed, _)| {
                    p == pointer && n.as_f64().is_some_and(|f| f.to_bits() == parsed.to_bits())
                });
                match kept {
                    Some((_, _, literal)) => {
                        *used += 1;
                        out.push_str(literal);
                    }
                    None => out.push_str(&n.to_string()),
                }
            }
            other => out.push_str(&other.to_string()),
        }
    }
}

/// Whether the number literal `text` (JSON syntax, sign and exponent allowed) has more
/// significant digits than an `f64` carries exactly.
pub(crate) fn exceeds_f64(text: &str) -> bool {
    if text.len() <= EXACT_DIGITS {
        return false;
    }
    let mantissa = text.split(['e', 'E']).next().unwrap_or(text);
    // Significant digits: from the first non-zero digit to the last non-zero one (trailing
    // zeros of the mantissa carry no precision: `1000000000000000000000`).
    let mut count = 0usize;
    let mut zeros = 0usize;
    for b in mantissa.bytes().filter(u8::is_ascii_digit) {
        if b == b'0' {
            if count > 0 {
                zeros += 1;
            }
        } else {
            count += zeros + 1;
            zeros = 0;
        }
    }
    count > EXACT_DIGITS
}

/// Whether `text` holds a run of more digits than an `f64` carries (dots inside the run do
/// not end it). Such a run spans at least 16 bytes, so it covers one of every 16th byte:
/// only those are looked at first, and a run is measured only around a digit found there.
pub(crate) fn has_long_digit_run(text: &str) -> bool {
    let b = text.as_bytes();
    let part = |c: u8| c.is_ascii_digit() || c == b'.';
    let step = EXACT_DIGITS + 1;
    let mut i = EXACT_DIGITS;
    while i < b.len() {
        if b.get(i).copied().is_some_and(part) {
            let mut start = i;
            while start > 0 && b.get(start - 1).copied().is_some_and(part) {
                start -= 1;
            }
            let mut end = i;
            while b.get(end).copied().is_some_and(part) {
                end += 1;
            }
            let digits = b
                .get(start..end)
                .unwrap_or_default()
                .iter()
                .filter(|c| c.is_ascii_digit())
                .count();
            if digits > EXACT_DIGITS {
                return true;
            }
            i = end.max(i) + step;
        } else {
            i += step;
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn finds_long_digit_runs_wherever_they_start() {
        for pad in 0..40 {
            let lead = "x".repeat(pad);
            assert!(
                has_long_digit_run(&format!("{lead}1234567890123456 ")),
                "{pad}"
            );
            assert!(
                has_long_digit_run(&format!("{lead}3.141592653589793238")),
                "{pad}"
            );
            assert!(
                !has_long_digit_run(&format!("{lead}123456789012345 ")),
                "{pad}"
            );
            assert!(
                !has_long_digit_run(&format!("{lead}12345678.12345 1.5")),
                "{pad}"
            );
        }
    }

    #[test]
    fn counts_significant_digits() {
        assert!(!exceeds_f64("123456789012345"));
        assert!(exceeds_f64("1234567890123456"));
        assert!(!exceeds_f64("1000000000000000000000"));
        assert!(exceeds_f64("1180591620717411303424"));
        assert!(!exceeds_f64("0.000000000000000000001"));
        assert!(!exceeds_f64("1.000000000000000000000"));
        assert!(exceeds_f64("1.0000000000000000000001"));
        assert!(exceeds_f64("3.14159265358979323846"));
        assert!(exceeds_f64("-3.14159265358979323846e10"));
    }

    #[test]
    fn a_literal_is_written_back_where_it_stood() {
        let mut l = Literals::default();
        let big: f64 = "1180591620717411303424".parse().unwrap();
        l.push("/a/0".into(), big, "1180591620717411303424".into());
        let v = json!({"a": [big, 1], "b": big});
        assert_eq!(
            l.render(&v).unwrap(),
            r#"{"a":[1180591620717411303424,1],"b":1.1805916207174113e+21}"#
        );
    }

    #[test]
    fn a_literal_whose_place_changed_fails_the_rendering() {
        let mut l = Literals::default();
        let big: f64 = "1180591620717411303424".parse().unwrap();
        l.push("/a".into(), big, "1180591620717411303424".into());
        assert_eq!(l.render(&json!({"a": "coerced"})), Err(LostDigits));
        assert_eq!(l.render(&json!({"b": big})), Err(LostDigits));
    }
}
