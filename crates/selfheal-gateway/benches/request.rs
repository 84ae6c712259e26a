//! The gateway's per-request JSON work on the load benchmark's request (20 messages, 3 tools,
//! `content: null` beside every tool call): reading the request and writing it back for the
//! upstream with the usual edits (model, `content: ""`), with the borrowed [`ChatRequest`] view
//! against the `serde_json::Value` round trip it replaced.
//!
//! Run with `cargo bench -p selfheal-gateway --bench request`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use std::hint::black_box;

use bytes::Bytes;
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use serde_json::{Value, json};

use selfheal_gateway::{ChatRequest, Edits};
use selfheal_openai::normalize_request;

fn body() -> Bytes {
    let tools: Vec<Value> = ["search", "lookup", "fetch"]
        .iter()
        .map(|n| {
            json!({"type": "function", "function": {"name": n, "description": format!("{n} things"),
                "parameters": {"type": "object", "properties": {"query": {"type": "string"},
                "limit": {"type": "integer", "default": 5}}, "required": ["query"]}}})
        })
        .collect();
    let mut m = vec![
        json!({"role": "system", "content": "You are a research agent. Use the tools."}),
        json!({"role": "user", "content": "Find the population of the ten largest cities and sum it."}),
    ];
    for i in 0..9 {
        m.push(
            json!({"role": "assistant", "content": null, "tool_calls": [{"id": format!("call_{i}"),
            "type": "function", "function": {"name": "search",
            "arguments": json!({"query": format!("city {i} population")}).to_string()}}]}),
        );
        m.push(json!({"role": "tool", "tool_call_id": format!("call_{i}"),
            "content": json!({"results": [{"city": format!("c{i}"), "population": 1_000_000 + i}]}).to_string()}));
    }
    Bytes::from(
        serde_json::to_vec(&json!({"model": "stub", "messages": m, "tools": tools})).unwrap(),
    )
}

fn bench(c: &mut Criterion) {
    let b = body();
    let mut g = c.benchmark_group("request_read_and_write_back");
    g.throughput(Throughput::Bytes(b.len() as u64));
    g.bench_function("chat_request_view", |bench| {
        bench.iter(|| {
            let req = ChatRequest::parse(black_box(&b)).unwrap();
            let edits = Edits {
                model: Some("upstream-model"),
                normalize: true,
                ..Edits::default()
            };
            black_box(req.encode(&edits, &b))
        })
    });
    g.bench_function("value_round_trip", |bench| {
        bench.iter(|| {
            let mut v: Value = serde_json::from_slice(black_box(&b)).unwrap();
            normalize_request(&mut v);
            v["model"] = json!("upstream-model");
            black_box(Bytes::from(serde_json::to_vec(&v).unwrap()))
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
