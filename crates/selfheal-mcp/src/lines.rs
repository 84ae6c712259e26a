//! Bounded lines: MCP's stdio transport is one JSON-RPC message per line, and a peer that never
//! sends a newline (a bug, a binary dump, a hostile server) must not make the proxy buffer
//! without end. A line longer than the limit is read to its end without being kept — only its
//! first [`LineReader::max`] bytes stay — and reported as [`Read::TooLong`]; the driver refuses
//! it with a JSON-RPC error ([`refusal`]) instead of forwarding part of it or dying.
//!
//! The default, [`DEFAULT_MAX_LINE_BYTES`] (16 MiB), is far above what a tool call or a tool
//! result normally is, and leaves room for resources sent inline (a few MiB of base64 image).
//! Each side of a session holds at most one line, so the proxy's memory for lines is bounded by
//! twice the limit.

use serde::de::{self, DeserializeSeed, IgnoredAny, MapAccess, Visitor};
use serde_json::{Value, json};
use tokio::io::{AsyncBufRead, AsyncBufReadExt};

/// Longest line accepted by default, in bytes, without its newline.
pub const DEFAULT_MAX_LINE_BYTES: usize = 16 * 1024 * 1024;

/// JSON-RPC's "invalid request": not retried by the proxy (it is not a server failure).
const INVALID_REQUEST: i64 = -32600;

/// What [`LineReader::next`] read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Read {
    /// A line, in [`LineReader::line`].
    Line,
    /// A line of `len` bytes, more than the limit; its first bytes are in [`LineReader::line`].
    TooLong {
        /// Its whole length, without the newline.
        len: usize,
    },
    /// The stream ended.
    Eof,
}

/// Reads newline-delimited lines of at most `max` bytes.
///
/// [`LineReader::next`] is cancel-safe: everything read is kept in the reader, so it can sit in
/// a `tokio::select!` branch that loses without dropping half a line.
#[derive(Debug)]
pub(crate) struct LineReader<R> {
    inner: R,
    max: usize,
    buf: Vec<u8>,
    /// Bytes of the current line seen so far, kept or not.
    len: usize,
    /// The last call returned a line: the next one starts a new line.
    returned: bool,
}

impl<R: AsyncBufRead + Unpin> LineReader<R> {
    /// A reader of lines of at most `max` bytes from `inner`.
    pub(crate) fn new(inner: R, max: usize) -> Self {
        LineReader {
            inner,
            max,
            buf: Vec::new(),
            len: 0,
            returned: false,
        }
    }

    /// The line the last [`LineReader::next`] returned, without its `\n` or `\r\n`; for
    /// [`Read::TooLong`], its first bytes.
    pub(crate) fn line(&self) -> &[u8] {
        if self.len > self.max {
            return &self.buf;
        }
        self.buf.strip_suffix(b"\r").unwrap_or(&self.buf)
    }

    /// Reads the next line. A last line without a newline is a line; after it, [`Read::Eof`].
    ///
    /// # Errors
    ///
    /// When reading fails.
    pub(crate) async fn next(&mut self) -> std::io::Result<Read> {
        if self.returned {
            self.buf.clear();
            self.len = 0;
            self.returned = false;
        }
        loop {
            let avail = self.inner.fill_buf().await?;
            if avail.is_empty() {
                if self.len == 0 {
                    return Ok(Read::Eof);
                }
                return Ok(self.finish());
            }
            let (piece, used, end) = match memchr::memchr(b'\n', avail) {
                Some(i) => (&avail[..i], i + 1, true),
                None => (avail, avail.len(), false),
            };
            let room = self.max.saturating_add(1).saturating_sub(self.buf.len());
            self.buf
                .extend_from_slice(piece.get(..room.min(piece.len())).unwrap_or(piece));
            self.len = self.len.saturating_add(piece.len());
            self.inner.consume(used);
            if end {
                return Ok(self.finish());
            }
        }
    }

    fn finish(&mut self) -> Read {
        self.returned = true;
        // A `\r\n` line of exactly `max` bytes plus its `\r` is not too long.
        let len = if self.buf.ends_with(b"\r") && self.len == self.buf.len() {
            self.len - 1
        } else {
            self.len
        };
        self.len = len;
        if len > self.max {
            self.buf.truncate(self.max);
            Read::TooLong { len }
        } else {
            Read::Line
        }
    }
}

/// What the first bytes of a refused line say about it: its `id`, and whether it is a
/// request (has `method`) or a response (has `result` or `error`), as far as they go.
#[derive(Debug, Default, Clone, PartialEq)]
pub(crate) struct Head {
    /// The message's `id`, when it was read in full.
    pub id: Option<Value>,
    /// A `method` key was seen.
    pub request: bool,
    /// A `result` or `error` key was seen.
    pub response: bool,
}

impl Head {
    /// Reads what it can of a JSON-RPC message from its first bytes.
    pub(crate) fn read(head: &[u8]) -> Head {
        let mut out = Head::default();
        let mut de = serde_json::Deserializer::from_slice(head);
        // The message is cut: the error at the cut is expected, what was seen before it stays.
        let _ = HeadSeed(&mut out).deserialize(&mut de);
        out.id = out.id.filter(|i| !i.is_null());
        out
    }

    /// A response to a request the other side is waiting for.
    pub(crate) fn answers(&self) -> bool {
        self.response && !self.request && self.id.is_some()
    }
}

struct HeadSeed<'h>(&'h mut Head);

impl<'de> DeserializeSeed<'de> for HeadSeed<'_> {
    type Value = ();

    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for HeadSeed<'_> {
    type Value = ();

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON-RPC message")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while let Some(key) = map.next_key::<String>()? {
            match key.as_str() {
                "id" => {
                    self.0.id = Some(map.next_value()?);
                    continue;
                }
                "method" => self.0.request = true,
                "result" | "error" => self.0.response = true,
                _ => {}
            }
            map.next_value::<IgnoredAny>()?;
        }
        Ok(())
    }
}

/// The JSON-RPC error that stands for a refused line of `len` bytes, answering `id`.
pub(crate) fn refusal(id: Option<&Value>, len: usize, max: usize) -> Value {
    json!({
        "jsonrpc": "2.0",
        "id": id.cloned().unwrap_or(Value::Null),
        "error": {
            "code": INVALID_REQUEST,
            "message": format!(
                "selfheal: a message of {len} bytes was refused: the limit is {max} bytes \
                 (selfheal mcp --max-line-bytes)"
            ),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn read_all(input: &[u8], max: usize) -> Vec<(Read, Vec<u8>)> {
        let mut r = LineReader::new(input, max);
        let mut out = Vec::new();
        loop {
            let got = r.next().await.unwrap();
            if got == Read::Eof {
                return out;
            }
            out.push((got, r.line().to_vec()));
        }
    }

    #[tokio::test]
    async fn lines_within_the_limit_are_read_whole() {
        let got = read_all(b"abc\r\nde\n\nlast", 4).await;
        assert_eq!(
            got,
            [
                (Read::Line, b"abc".to_vec()),
                (Read::Line, b"de".to_vec()),
                (Read::Line, Vec::new()),
                (Read::Line, b"last".to_vec()),
            ]
        );
    }

    #[tokio::test]
    async fn a_line_past_the_limit_is_reported_with_its_length_and_head_and_the_next_is_whole() {
        let got = read_all(b"abcd\r\nabcde\nxy\n0123456789", 4).await;
        assert_eq!(
            got,
            [
                (Read::Line, b"abcd".to_vec()),
                (Read::TooLong { len: 5 }, b"abcd".to_vec()),
                (Read::Line, b"xy".to_vec()),
                (Read::TooLong { len: 10 }, b"0123".to_vec()),
            ]
        );
    }

    #[tokio::test]
    async fn a_long_line_is_not_kept_whole() {
        // Fed in small pieces, so the reader sees it grow past the limit many times.
        let line = vec![b'x'; 100_000];
        let input = [line.as_slice(), b"\nok\n"].concat();
        let mut r = LineReader::new(tokio::io::BufReader::with_capacity(64, &input[..]), 1000);
        assert_eq!(r.next().await.unwrap(), Read::TooLong { len: 100_000 });
        assert_eq!(r.line().len(), 1000);
        assert!(r.buf.capacity() < 4 * 1000, "{}", r.buf.capacity());
        assert_eq!(r.next().await.unwrap(), Read::Line);
        assert_eq!(r.line(), b"ok");
        assert_eq!(r.next().await.unwrap(), Read::Eof);
    }

    #[test]
    fn the_head_gives_the_id_and_the_kind_when_they_come_first() {
        let h = Head::read(br#"{"jsonrpc":"2.0","id":7,"result":{"content":[{"text":"aaaa"#);
        assert_eq!(
            h,
            Head {
                id: Some(json!(7)),
                request: false,
                response: true
            }
        );
        assert!(h.answers());
        let h = Head::read(br#"{"id":"x","method":"tools/call","params":{"arguments":"#);
        assert_eq!(
            (h.id, h.request, h.response),
            (Some(json!("x")), true, false)
        );
        let h = Head::read(br#"{"method":"notifications/message","params":"#);
        assert_eq!((h.id, h.request), (None, true));
        // Cut inside the id, or no JSON at all: nothing is known.
        assert_eq!(Head::read(br#"{"id":"ab"#), Head::default());
        assert_eq!(Head::read(b"\xff\xfe binary"), Head::default());
        assert_eq!(Head::read(br#"{"id":null,"result":1"#).id, None);
    }
}
