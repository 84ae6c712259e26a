//! Degenerate output: a model that pads its answer with whitespace, or writes one short piece
//! over and over, until its token limit (issue 31: a small local model under
//! `tool_choice: "required"` pads with newlines; one request without a limit ran past 6,000
//! tokens). Such text carries nothing the client can use, and every token of it costs time.
//!
//! [`judge`] reads the tail of a text and says whether it ended in such a run; it is pure, so
//! every front-end (the gateway's stream relay, its whole answers) judges the same way, and the
//! run decides what follows (a re-ask through [`signal`], read as malformed output, or a
//! `partial` answer). Only the end of the text is read: a front-end that judges a stream after
//! every piece sees any run as it grows past its limit.

use serde::{Deserialize, Serialize};

use crate::classifier::Signal;

/// When output counts as degenerate. A limit of 0 turns its check off.
///
/// The defaults sit well past what a useful answer holds: a few blank lines or a deep indent
/// are tens of characters of whitespace, a separator line is about 80 of one character; a
/// run of 256 whitespace characters, or one piece repeated back to back over 1 KiB, is not an
/// answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Limits {
    /// Most whitespace characters (spaces, tabs, newlines) in a row (default 256).
    pub whitespace_run: usize,
    /// Most bytes one piece of up to [`Limits::unit_bytes`] may cover repeated back to back
    /// (default 1,024).
    pub repeat_bytes: usize,
    /// Longest piece whose repeats are counted, in bytes (default 32).
    pub unit_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            whitespace_run: 256,
            repeat_bytes: 1_024,
            unit_bytes: 32,
        }
    }
}

impl Limits {
    /// How many bytes of a text's tail [`judge`] needs to see: a front-end judging a stream
    /// keeps at least this much of it.
    pub fn tail_bytes(&self) -> usize {
        // A whitespace character is at most 3 bytes in UTF-8 (U+3000); a repetition is seen
        // once it covers `repeat_bytes` plus one more piece.
        (self.whitespace_run * 3).max(self.repeat_bytes + self.unit_bytes) + 4
    }

    /// Checks that the limits make sense: a piece must be shorter than the bytes it covers.
    pub fn validate(&self) -> Result<(), String> {
        if self.repeat_bytes > 0 && (self.unit_bytes == 0 || self.unit_bytes >= self.repeat_bytes) {
            return Err(format!(
                "degenerate.unit_bytes must be at least 1 and below repeat_bytes ({})",
                self.repeat_bytes
            ));
        }
        Ok(())
    }
}

/// What kind of run a degenerate text ended in.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Kind {
    /// Whitespace, `chars` characters of it.
    Whitespace {
        /// Characters in the run.
        chars: usize,
    },
    /// One piece repeated back to back.
    Repeat {
        /// The piece.
        unit: String,
        /// How many times it came in a row.
        times: usize,
    },
}

/// A text that ended in a degenerate run: what the run is and where it starts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Degenerate {
    /// The run.
    pub kind: Kind,
    /// Byte offset in the judged text where the run starts (a char boundary): the text before
    /// it is what the model said before it degenerated.
    pub start: usize,
}

impl Degenerate {
    /// The reason a front-end gives (a `partial` answer's, a re-ask's).
    pub fn reason(&self) -> String {
        match &self.kind {
            Kind::Whitespace { chars } => format!(
                "the model's output degenerated into {chars} whitespace characters in a row and \
                 was cut"
            ),
            Kind::Repeat { unit, times } => format!(
                "the model's output degenerated into {unit:?} repeated {times} times in a row and \
                 was cut"
            ),
        }
    }
}

/// The signal of degenerate output, as the run reads it (malformed output: the answer cannot
/// be used as it is), for a re-ask through [`crate::run::Input::CallsUnusable`].
pub fn signal(d: &Degenerate) -> Signal {
    Signal::MalformedOutput { detail: d.reason() }
}

/// Whether `text` ends in a degenerate run under `limits`: a run of whitespace longer than
/// [`Limits::whitespace_run`], or one piece of at most [`Limits::unit_bytes`] repeated back to
/// back over more than [`Limits::repeat_bytes`]. Reads only the end of `text`; linear in the
/// run's length.
pub fn judge(text: &str, limits: &Limits) -> Option<Degenerate> {
    whitespace(text, limits.whitespace_run).or_else(|| repeat(text, limits))
}

fn whitespace(text: &str, limit: usize) -> Option<Degenerate> {
    if limit == 0 {
        return None;
    }
    let mut chars = 0;
    let mut start = text.len();
    for (i, c) in text.char_indices().rev() {
        if !c.is_whitespace() {
            break;
        }
        chars += 1;
        start = i;
    }
    (chars > limit).then_some(Degenerate {
        kind: Kind::Whitespace { chars },
        start,
    })
}

fn repeat(text: &str, limits: &Limits) -> Option<Degenerate> {
    if limits.repeat_bytes == 0 || text.len() <= limits.repeat_bytes {
        return None;
    }
    let b = text.as_bytes();
    let n = b.len();
    for u in 1..=limits.unit_bytes.min(n / 2) {
        let unit = &b[n - u..];
        let mut times = 1;
        while times * u + u <= n && &b[n - (times + 1) * u..n - times * u] == unit {
            times += 1;
        }
        if times < 2 || times * u <= limits.repeat_bytes {
            continue;
        }
        let start = n - times * u;
        // A run measured in bytes may start inside a character: its first whole piece does
        // not; both ends of `unit` are boundaries when the run's start is one.
        let start = (start..n).find(|&i| text.is_char_boundary(i)).unwrap_or(n);
        let Some(piece) = text.get(n - u..) else {
            continue;
        };
        return Some(Degenerate {
            kind: Kind::Repeat {
                unit: piece.to_owned(),
                times,
            },
            start,
        });
    }
    None
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn judged(text: &str) -> Option<Degenerate> {
        judge(text, &Limits::default())
    }

    /// The padding a real model wrote under `tool_choice: "required"`: a call, then newlines
    /// to its limit. Cut where the padding starts, once past the limit; not before.
    #[test]
    fn newline_padding_past_the_limit_is_degenerate_and_cut_where_it_starts() {
        let call =
            "```json\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n```";
        let short = format!("{call}{}", "\n".repeat(256));
        assert_eq!(judged(&short), None, "at the limit is not past it");
        let long = format!("{call}{}", "\n".repeat(257));
        let d = judged(&long).unwrap();
        assert_eq!(d.kind, Kind::Whitespace { chars: 257 });
        assert_eq!(&long[..d.start], call);
        // Mixed whitespace counts as one run.
        let mixed = format!("ok{}", " \n\t\n".repeat(100));
        assert!(matches!(
            judged(&mixed).unwrap().kind,
            Kind::Whitespace { chars: 400 }
        ));
    }

    /// One short piece over and over is degenerate past `repeat_bytes`; its start is where
    /// the repetition began (whole pieces), and a multi-byte piece is cut on a boundary.
    #[test]
    fn a_piece_repeated_past_the_limit_is_degenerate() {
        let text = format!("The answer is {}", "na ".repeat(400));
        let d = judged(&text).unwrap();
        assert!(
            matches!(&d.kind, Kind::Repeat { unit, times } if unit.len() <= 32 && unit.trim() == "na" && *times >= 342),
            "{d:?}"
        );
        assert!(text[..d.start].starts_with("The answer is"));
        assert!(d.reason().contains("repeated"));
        let wide = format!("x{}", "é".repeat(600));
        let d = judged(&wide).unwrap();
        assert_eq!(&wide[..d.start], "x");
        assert!(matches!(signal(&d), Signal::MalformedOutput { .. }));
    }

    /// What useful answers hold is not degenerate: prose, code with indentation and blank
    /// lines, a separator line, a table, a long number, a short repeat.
    #[test]
    fn useful_text_is_not_degenerate() {
        let code = "fn main() {\n\n\n        let x = 1;\n\n    }\n".repeat(40);
        let table = "| a | b |\n|---|---|\n| 1 | 2 |\n".repeat(30);
        for text in [
            "Paris is the capital of France.".to_owned(),
            code,
            table,
            format!("Result:\n{}\nDone.", "=".repeat(80)),
            "=".repeat(120),
            "3.14159265358979323846264338327950288419716939937510".to_owned(),
            "ha".repeat(100),
            String::new(),
        ] {
            assert_eq!(judged(&text), None, "{text:?}");
        }
    }

    /// A limit of 0 turns its check off; limits that cannot hold are refused.
    #[test]
    fn a_zero_limit_turns_its_check_off_and_bad_limits_are_refused() {
        let off = Limits {
            whitespace_run: 0,
            repeat_bytes: 0,
            unit_bytes: 32,
        };
        assert_eq!(judge(&"\n".repeat(10_000), &off), None);
        assert!(off.validate().is_ok());
        let bad = Limits {
            unit_bytes: 2_000,
            ..Limits::default()
        };
        assert!(bad.validate().is_err());
        assert!(Limits::default().tail_bytes() >= 1_024 + 32);
    }

    /// Judging a growing stream after every piece finds the run when it passes the limit,
    /// reading only a bounded tail.
    #[test]
    fn a_stream_judged_piece_by_piece_on_its_tail_is_caught_once() {
        let limits = Limits::default();
        let mut tail = String::from("Sure, here it is:");
        let mut caught = None;
        for i in 0..2_000 {
            tail.push('\n');
            if tail.len() > limits.tail_bytes() {
                let cut = tail.len() - limits.tail_bytes();
                let cut = (cut..tail.len())
                    .find(|&c| tail.is_char_boundary(c))
                    .unwrap();
                tail.drain(..cut);
            }
            if judge(&tail, &limits).is_some() {
                caught = Some(i);
                break;
            }
        }
        assert_eq!(caught, Some(256), "the 257th newline passes the limit");
    }
}
