//! The OTLP/HTTP protobuf encoding of the gateway's spans, written by hand.
//!
//! Why not the `opentelemetry-otlp` exporter: its path from the SDK's `SpanData` to bytes (a
//! `String` per attribute key, a tree of `prost` messages, nested lengths computed again at
//! every level) cost the export thread about 10,000 instructions a span, most of what export
//! cost a request. The few messages written here (`ExportTraceServiceRequest`,
//! `ResourceSpans`, `ScopeSpans`, `Span`, `Event`, `Status`, `KeyValue`, `AnyValue`) follow
//! `opentelemetry/proto/trace/v1/trace.proto` and `common/v1/common.proto`; the tests decode the
//! bytes with `opentelemetry-proto`'s own types.

use std::time::SystemTime;

/// A wire type of protobuf.
#[derive(Clone, Copy)]
enum Wire {
    Varint = 0,
    Fixed64 = 1,
    Len = 2,
    Fixed32 = 5,
}

fn varint(buf: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        buf.push((v as u8) | 0x80);
        v >>= 7;
    }
    buf.push(v as u8);
}

/// How many bytes [`varint`] writes for `v`.
fn varint_len(v: u64) -> usize {
    // 1 + one more byte per 7 bits past the first 7.
    let bits = 64 - (v | 1).leading_zeros() as usize;
    bits.div_ceil(7)
}

fn key(buf: &mut Vec<u8>, field: u32, wire: Wire) {
    varint(buf, (u64::from(field) << 3) | wire as u64);
}

/// A length-delimited field (bytes, string, or an encoded message).
pub(crate) fn bytes(buf: &mut Vec<u8>, field: u32, data: &[u8]) {
    key(buf, field, Wire::Len);
    varint(buf, data.len() as u64);
    buf.extend_from_slice(data);
}

/// How many bytes [`bytes`] writes for a payload of `len` bytes in a field below 16.
pub(crate) fn bytes_len(len: usize) -> usize {
    1 + varint_len(len as u64) + len
}

fn fixed64(buf: &mut Vec<u8>, field: u32, v: u64) {
    key(buf, field, Wire::Fixed64);
    buf.extend_from_slice(&v.to_le_bytes());
}

fn fixed32(buf: &mut Vec<u8>, field: u32, v: u32) {
    key(buf, field, Wire::Fixed32);
    buf.extend_from_slice(&v.to_le_bytes());
}

fn uint(buf: &mut Vec<u8>, field: u32, v: u64) {
    key(buf, field, Wire::Varint);
    varint(buf, v);
}

/// A message field whose length is known once it is written: one byte is kept for its length
/// and the message written after it; a message of 128 bytes or more (a span) is moved up by
/// the bytes its longer length needs.
pub(crate) fn message(buf: &mut Vec<u8>, field: u32, write: impl FnOnce(&mut Vec<u8>)) {
    key(buf, field, Wire::Len);
    let at = buf.len();
    buf.push(0);
    write(buf);
    let end = buf.len();
    let len = (end - at - 1) as u64;
    let n = varint_len(len);
    if n > 1 {
        buf.resize(end + n - 1, 0);
        buf.copy_within(at + 1..end, at + n);
    }
    let mut v = len;
    for slot in &mut buf[at..at + n] {
        *slot = (v as u8 & 0x7f) | if v >= 0x80 { 0x80 } else { 0 };
        v >>= 7;
    }
}

/// Nanoseconds since the Unix epoch (0 before it).
fn nanos(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

/// An attribute's value (`AnyValue`).
pub(crate) enum Any<'a> {
    Str(&'a str),
    Owned(String),
    Int(i64),
    Bool(bool),
    Double(f64),
}

/// A `KeyValue` (an attribute) as field `field` of its message; its lengths computed, not
/// measured.
pub(crate) fn attribute(buf: &mut Vec<u8>, field: u32, k: &str, v: Any<'_>) {
    let value = match &v {
        Any::Str(s) => bytes_len(s.len()),
        Any::Owned(s) => bytes_len(s.len()),
        Any::Bool(_) => 2,
        Any::Int(i) => 1 + varint_len(*i as u64),
        Any::Double(_) => 9,
    };
    key(buf, field, Wire::Len);
    varint(buf, (bytes_len(k.len()) + bytes_len(value)) as u64);
    bytes(buf, 1, k.as_bytes());
    key(buf, 2, Wire::Len);
    varint(buf, value as u64);
    match v {
        Any::Str(s) => bytes(buf, 1, s.as_bytes()),
        Any::Owned(s) => bytes(buf, 1, s.as_bytes()),
        Any::Bool(b) => uint(buf, 2, u64::from(b)),
        Any::Int(i) => uint(buf, 3, i as u64),
        Any::Double(d) => fixed64(buf, 4, d.to_bits()),
    }
}

/// `Span.kind`.
#[derive(Clone, Copy)]
pub(crate) enum Kind {
    Server = 2,
    Client = 3,
}

/// What a `Span` holds besides its attributes and events.
pub(crate) struct SpanHead<'a> {
    pub trace_id: [u8; 16],
    pub span_id: [u8; 8],
    /// The W3C `tracestate` (empty: none).
    pub trace_state: &'a str,
    pub parent: Option<[u8; 8]>,
    pub parent_is_remote: bool,
    pub name: &'a str,
    pub kind: Kind,
    pub start: SystemTime,
    pub end: SystemTime,
    /// `sampled` and the other W3C flags.
    pub trace_flags: u8,
    /// The status's error message: an error status when set.
    pub error: Option<&'a str>,
}

/// A `Span` as field 2 of `ScopeSpans`; `body` writes its attributes (field 9) and events
/// (field 11), with [`attribute`] and [`event`].
pub(crate) fn span(buf: &mut Vec<u8>, head: &SpanHead<'_>, body: impl FnOnce(&mut Vec<u8>)) {
    message(buf, 2, |buf| {
        bytes(buf, 1, &head.trace_id);
        bytes(buf, 2, &head.span_id);
        if !head.trace_state.is_empty() {
            bytes(buf, 3, head.trace_state.as_bytes());
        }
        if let Some(p) = &head.parent {
            bytes(buf, 4, p);
        }
        bytes(buf, 5, head.name.as_bytes());
        uint(buf, 6, head.kind as u64);
        fixed64(buf, 7, nanos(head.start));
        fixed64(buf, 8, nanos(head.end));
        body(buf);
        if let Some(message_text) = head.error {
            message(buf, 15, |buf| {
                if !message_text.is_empty() {
                    bytes(buf, 2, message_text.as_bytes());
                }
                uint(buf, 3, 2); // STATUS_CODE_ERROR
            });
        }
        // The W3C flags, and whether the parent is remote (SpanFlags), as the SDK's exporter
        // writes them.
        let remote = if head.parent_is_remote { 0x200 } else { 0 };
        fixed32(buf, 16, u32::from(head.trace_flags) | 0x100 | remote);
    });
}

/// An `Event` (field 11 of `Span`) with one string attribute.
pub(crate) fn event(buf: &mut Vec<u8>, at: SystemTime, name: &str, k: &str, v: &str) {
    message(buf, 11, |buf| {
        fixed64(buf, 1, nanos(at));
        bytes(buf, 2, name.as_bytes());
        attribute(buf, 3, k, Any::Str(v));
    });
}

/// The body of an `ExportTraceServiceRequest`: one `ResourceSpans` of `resource` (an encoded
/// `Resource`) holding one `ScopeSpans` of `scope` (an encoded `InstrumentationScope`) whose
/// spans are `spans` (each written by [`span`]).
pub(crate) fn request(resource: &[u8], scope: &[u8], spans: &[u8]) -> Vec<u8> {
    let scope_spans = bytes_len(scope.len()) + spans.len();
    let resource_spans = bytes_len(resource.len()) + bytes_len(scope_spans);
    let mut out = Vec::with_capacity(bytes_len(resource_spans));
    key(&mut out, 1, Wire::Len);
    varint(&mut out, resource_spans as u64);
    bytes(&mut out, 1, resource);
    key(&mut out, 2, Wire::Len);
    varint(&mut out, scope_spans as u64);
    bytes(&mut out, 1, scope);
    out.extend_from_slice(spans);
    out
}

/// An encoded `Resource` of `attributes`.
pub(crate) fn resource<'a>(attributes: impl IntoIterator<Item = (&'a str, Any<'a>)>) -> Vec<u8> {
    let mut out = Vec::new();
    for (k, v) in attributes {
        attribute(&mut out, 1, k, v);
    }
    out
}

/// An encoded `InstrumentationScope` named `name`.
pub(crate) fn scope(name: &str) -> Vec<u8> {
    let mut out = Vec::new();
    bytes(&mut out, 1, name.as_bytes());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varints_are_as_long_as_they_say() {
        for v in [
            0,
            1,
            127,
            128,
            16_383,
            16_384,
            u64::from(u32::MAX),
            u64::MAX,
        ] {
            let mut buf = Vec::new();
            varint(&mut buf, v);
            assert_eq!(buf.len(), varint_len(v), "{v}");
        }
        let mut buf = Vec::new();
        varint(&mut buf, 300);
        assert_eq!(buf, [0xac, 0x02]);
    }

    #[test]
    fn a_message_of_any_length_is_prefixed_with_its_length() {
        for len in [0, 1, 127, 128, 300, 20_000] {
            let mut buf = vec![9];
            message(&mut buf, 2, |b| b.extend(std::iter::repeat_n(7u8, len)));
            let mut want = vec![9, 0x12];
            varint(&mut want, len as u64);
            want.extend(std::iter::repeat_n(7u8, len));
            assert_eq!(buf, want, "{len}");
        }
    }

    #[test]
    fn attributes_carry_the_lengths_they_have() {
        use opentelemetry_proto::tonic::common::v1::{KeyValue, any_value::Value};
        use prost::Message as _;
        let long = "x".repeat(200);
        let cases = [
            (Any::Str("chat"), Value::StringValue("chat".into())),
            (Any::Owned(long.clone()), Value::StringValue(long)),
            (Any::Int(-1), Value::IntValue(-1)),
            (Any::Int(200), Value::IntValue(200)),
            (Any::Bool(true), Value::BoolValue(true)),
            (Any::Double(0.5), Value::DoubleValue(0.5)),
        ];
        for (v, want) in cases {
            let mut buf = Vec::new();
            attribute(&mut buf, 1, "gen_ai.request.model", v);
            // Field 1 of a message: decoded as a message with one KeyValue would be.
            let (_, rest) = buf.split_at(1);
            let mut len_and_body = rest;
            let len = prost::encoding::decode_varint(&mut len_and_body).unwrap();
            assert_eq!(
                len as usize,
                len_and_body.len(),
                "the length written is the length"
            );
            let kv = KeyValue::decode(len_and_body).unwrap();
            assert_eq!(kv.key, "gen_ai.request.model");
            assert_eq!(kv.value.unwrap().value, Some(want));
        }
    }
}
