//! What the MCP proxy adds to one tool call, without I/O: a `tools/call` from the client through
//! [`Proxy::from_client`] (schema check and coercion, internal id) and the server's answer
//! through [`Proxy::from_server`] (monitor record and check, id mapped back), for a tool with an
//! input schema, alternating successes and occasional failures over four tools. The second
//! benchmark declares an output contract and freshness for every tool (`[tools.NAME] output`,
//! `as_of`) and answers with structured content that keeps it: the cost of reading each answer
//! against its contract.
//!
//! Run with `cargo bench -p selfheal-mcp --bench proxy`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use serde_json::json;

use selfheal_core::ConstRng;
use selfheal_mcp::{McpConfig, Out, Proxy};

fn bench(c: &mut Criterion) {
    round_trip(c, "tools_call_round_trip", McpConfig::default(), false);
    let tables: String = ["search", "fetch", "read", "write"]
        .iter()
        .map(|n| format!("[tools.{n}]\noutput = [\"hits\"]\nas_of = \"as_of\"\n"))
        .collect();
    let declared = McpConfig {
        tools: selfheal_mcp::tools_from_toml_str(&tables).unwrap(),
        ..McpConfig::default()
    };
    round_trip(c, "tools_call_round_trip_with_contract", declared, true);
}

fn round_trip(c: &mut Criterion, name: &str, config: McpConfig, structured: bool) {
    let tools: Vec<_> = ["search", "fetch", "read", "write"]
        .iter()
        .map(|n| {
            json!({"name": n, "description": "a tool", "annotations": {"readOnlyHint": true},
                   "inputSchema": {"type": "object", "properties": {
                       "query": {"type": "string"}, "limit": {"type": "integer"}},
                       "required": ["query"]}})
        })
        .collect();
    let mut p = Proxy::new(config).unwrap();
    let mut rng = ConstRng(0);
    p.from_client(
        json!({"jsonrpc": "2.0", "id": 0, "method": "tools/list"}),
        0,
    );
    p.from_server(
        json!({"jsonrpc": "2.0", "id": 0, "result": {"tools": tools}}),
        0,
        &mut rng,
    );
    let mut i: u64 = 0;
    c.bench_function(name, |b| {
        b.iter(|| {
            i += 1;
            let tool = ["search", "fetch", "read", "write"][(i % 4) as usize];
            let outs = p.from_client(
                json!({"jsonrpc": "2.0", "id": i, "method": "tools/call",
                       "params": {"name": tool, "arguments": {"query": format!("q{i}"), "limit": "5"}}}),
                i,
            );
            let Some(Out::ToServer(sent)) = outs.into_iter().last() else {
                panic!("not forwarded")
            };
            let failed = i.is_multiple_of(7);
            let mut answer = json!({"jsonrpc": "2.0", "id": sent["id"], "result": {
                "content": [{"type": "text", "text": if failed { "error: busy".to_owned() } else { format!("result {i}") }}],
                "isError": failed}});
            if structured && !failed {
                // Fresh (stamped now) and with its declared field.
                answer["result"]["structuredContent"] = json!({"hits": [i], "as_of": i});
            }
            black_box(p.from_server(answer, i, &mut rng));
            black_box(p.take_decisions());
        })
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
