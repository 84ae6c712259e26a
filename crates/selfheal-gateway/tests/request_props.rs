//! Property tests of the request view: whatever a client sends, reading it never panics, writing
//! it back without edits returns the client's own buffer, and writing it back with edits gives
//! exactly what the same edits made to a `serde_json::Value` give (the reference: how the gateway
//! edited requests before it read them as views).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use bytes::Bytes;
use proptest::prelude::*;
use serde_json::{Map, Value, json};

use selfheal_gateway::{ChatRequest, Edits};

mod fuzzing;
use fuzzing::reference;

fn arb_text() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-z ]{0,12}",
        Just("caf\u{e9} \"q\" \\ \n\t".to_owned()),
        Just("\u{1F600} emoji".to_owned()),
    ]
}

fn arb_content() -> impl Strategy<Value = Option<Value>> {
    prop_oneof![
        Just(None),
        Just(Some(Value::Null)),
        arb_text().prop_map(|t| Some(Value::String(t))),
        arb_text().prop_map(|t| Some(json!([{"type": "text", "text": t}]))),
        Just(Some(json!(42))),
    ]
}

fn arb_calls() -> impl Strategy<Value = Option<Value>> {
    prop_oneof![
        Just(None),
        Just(Some(Value::Null)),
        (0u8..3, "[a-z]{1,6}").prop_map(|(n, name)| Some(Value::Array(
            (0..n)
                .map(|i| json!({"id": format!("c{i}"), "type": "function",
                    "function": {"name": name, "arguments": format!("{{\"i\": {i}}}")}}))
                .collect()
        ))),
        Just(Some(json!("not calls"))),
    ]
}

fn arb_message() -> impl Strategy<Value = Value> {
    (
        prop_oneof![
            Just(Some("system")),
            Just(Some("developer")),
            Just(Some("user")),
            Just(Some("assistant")),
            Just(Some("tool")),
            Just(None),
        ],
        arb_content(),
        arb_calls(),
        proptest::option::of("[a-z]{1,4}"),
        any::<bool>(),
    )
        .prop_map(|(role, content, calls, extra, opaque)| {
            if opaque && role.is_none() {
                return json!("an opaque message");
            }
            let mut m = Map::new();
            if let Some(r) = role {
                m.insert("role".into(), json!(r));
            }
            if let Some(c) = content {
                m.insert("content".into(), c);
            }
            if let Some(c) = calls {
                m.insert("tool_calls".into(), c);
            }
            if let Some(x) = extra {
                m.insert(format!("x_{x}"), json!({"keep": [1, 2.5, null]}));
            }
            Value::Object(m)
        })
}

fn arb_request() -> impl Strategy<Value = Value> {
    (
        proptest::collection::vec(arb_message(), 1..8),
        proptest::collection::vec("[a-d]", 0..4),
        prop_oneof![
            Just(None),
            Just(Some(json!("auto"))),
            "[a-d]".prop_map(|n| Some(json!({"type": "function", "function": {"name": n}}))),
            proptest::collection::vec("[a-d]", 1..3).prop_map(|ns| Some(json!({
                "type": "allowed_tools", "allowed_tools": {"mode": "required", "tools":
                    ns.iter().map(|n| json!({"type": "function", "function": {"name": n}}))
                        .collect::<Vec<_>>()}}))),
        ],
        proptest::option::of(any::<bool>()),
        any::<u32>(),
        any::<bool>(),
    )
        .prop_map(|(messages, tools, choice, stream, seed, usage)| {
            let mut r = json!({"model": "client-model", "messages": messages, "seed": seed});
            if !tools.is_empty() {
                r["tools"] = Value::Array(
                    tools
                        .iter()
                        .map(|n| {
                            json!({"type": "function", "function": {"name": n,
                            "parameters": {"type": "object"}}})
                        })
                        .collect(),
                );
                r["parallel_tool_calls"] = json!(true);
            }
            if let Some(c) = choice {
                r["tool_choice"] = c;
            }
            if let Some(s) = stream {
                r["stream"] = json!(s);
                if s && usage {
                    r["stream_options"] = json!({"include_usage": true});
                }
            }
            r
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn any_bytes_are_read_without_panicking(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
        let _ = ChatRequest::parse(&bytes);
    }

    #[test]
    fn no_edits_send_the_client_buffer(req in arb_request(), pretty in any::<bool>()) {
        let text = if pretty { serde_json::to_vec_pretty(&req) } else { serde_json::to_vec(&req) }.unwrap();
        let b = Bytes::from(text);
        let view = ChatRequest::parse(&b).unwrap();
        let out = view.encode(&Edits::default(), &b);
        prop_assert_eq!(out.as_ptr(), b.as_ptr());
    }

    #[test]
    fn edits_match_the_value_reference(
        req in arb_request(),
        pretty in any::<bool>(),
        model in proptest::option::of(prop_oneof![Just("client-model"), Just("upstream-model")]),
        normalize in any::<bool>(),
        system in proptest::option::of(arb_text()),
        hidden in proptest::collection::vec("[a-e]", 0..3),
        append in any::<bool>(),
        stream in proptest::option::of(any::<bool>()),
    ) {
        let text = if pretty { serde_json::to_vec_pretty(&req) } else { serde_json::to_vec(&req) }.unwrap();
        let b = Bytes::from(text);
        let view = ChatRequest::parse(&b).unwrap();
        let extra = json!({"role": "user", "content": "again"});
        let edits = Edits {
            model,
            normalize,
            system: system.as_deref(),
            hidden: &hidden,
            append: append.then_some(&extra),
            stream,
            replaced: &[],
        };
        let out = view.encode(&edits, &b);
        let got: Value = serde_json::from_slice(&out)
            .map_err(|e| TestCaseError::fail(format!("{e}: {}", String::from_utf8_lossy(&out))))?;
        prop_assert_eq!(got, reference(req, &edits));
    }
}
