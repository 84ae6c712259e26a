//! The sans-IO proxy with hand-written MCP (2025-06-18) JSON-RPC messages: what passes through
//! untouched, how tool calls are relayed under internal ids, pausing and resuming tools, argument
//! repair, timeouts and retries, cancellation, guidance, and the counters.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use serde_json::{Value, json};

use selfheal_core::{ConstRng, SplitMix64};
use selfheal_mcp::{Decision, McpConfig, Out, Proxy, Stats};

mod common;
use common::{to_client, to_server};

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

/// The default configuration without retry jitter, so backoffs are exact: 500 ms, then 1000 ms.
fn config() -> McpConfig {
    let mut c = McpConfig::default();
    c.policy.retry.jitter = 0.0;
    c
}

fn proxy() -> Proxy {
    Proxy::new(config()).unwrap()
}

fn call_req(id: Value, name: &str, args: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
           "params": {"name": name, "arguments": args}})
}

fn text_result(text: &str, is_error: bool) -> Value {
    json!({"content": [{"type": "text", "text": text}], "isError": is_error})
}

fn response(id: impl Into<Value>, result: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id.into(), "result": result})
}

fn rpc_error(id: impl Into<Value>, code: i64, message: &str) -> Value {
    json!({"jsonrpc": "2.0", "id": id.into(), "error": {"code": code, "message": message}})
}

fn list_changed() -> Value {
    json!({"jsonrpc": "2.0", "method": "notifications/tools/list_changed"})
}

fn cancelled_for(internal: &str) -> impl Fn(&Value) -> bool + '_ {
    move |m: &Value| {
        m["method"] == "notifications/cancelled" && m["params"]["requestId"] == internal
    }
}

/// The server's tools: `search` is read-only, `put` idempotent, `send` has no hints.
fn tools() -> Value {
    json!([
        {
            "name": "search",
            "description": "Search the index.",
            "inputSchema": {
                "type": "object",
                "properties": {"query": {"type": "string"}, "limit": {"type": "integer"}},
                "required": ["query"]
            },
            "annotations": {"readOnlyHint": true}
        },
        {
            "name": "put",
            "description": "Store a value under a key.",
            "inputSchema": {
                "type": "object",
                "properties": {"key": {"type": "string"}, "value": {"type": "string"}},
                "required": ["key"]
            },
            "annotations": {"idempotentHint": true}
        },
        {
            "name": "send",
            "description": "Send a message.",
            "inputSchema": {
                "type": "object",
                "properties": {"to": {"type": "string"}},
                "required": ["to"]
            },
            "annotations": {"destructiveHint": true}
        }
    ])
}

/// A `tools/list` round trip; returns the tool names the client is shown.
fn list(p: &mut Proxy, id: u64, now: u64) -> Vec<String> {
    let req = json!({"jsonrpc": "2.0", "id": id, "method": "tools/list", "params": {}});
    assert_eq!(p.from_client(req.clone(), now), vec![Out::ToServer(req)]);
    let outs = p.from_server(
        response(id, json!({"tools": tools()})),
        now,
        &mut ConstRng(0),
    );
    assert_eq!(outs.len(), 1, "one answer to tools/list: {outs:?}");
    let answer = to_client(&outs).remove(0);
    assert_eq!(answer["id"], json!(id));
    answer["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap().to_owned())
        .collect()
}

/// Sends a `tools/call` that must be forwarded and nothing else; returns the internal id.
fn forward(p: &mut Proxy, client_id: Value, name: &str, args: Value, now: u64) -> String {
    let outs = p.from_client(call_req(client_id.clone(), name, args), now);
    assert_eq!(outs.len(), 1, "only the forwarded call: {outs:?}");
    let sent = to_server(&outs);
    assert_eq!(sent.len(), 1, "forwarded to the server: {outs:?}");
    let internal = sent[0]["id"]
        .as_str()
        .expect("a string internal id")
        .to_owned();
    assert_ne!(json!(internal), client_id, "the client's id is not reused");
    internal
}

/// One call that the server answers with `result`; returns what the client is sent.
fn round_trip(
    p: &mut Proxy,
    client_id: Value,
    name: &str,
    args: Value,
    result: Value,
    now: u64,
) -> Vec<Out> {
    let internal = forward(p, client_id, name, args, now);
    p.from_server(response(internal, result), now, &mut ConstRng(0))
}

/// The proxy's own decisions, without the core's trace events (`signal`, `classified`,
/// `action`) that accompany every failure.
fn own(decisions: Vec<Decision>) -> Vec<Decision> {
    decisions
        .into_iter()
        .filter(|d| !matches!(d.kind.as_str(), "signal" | "classified" | "action"))
        .collect()
}

fn kinds(decisions: &[Decision]) -> Vec<(&'static str, String)> {
    decisions
        .iter()
        .map(|d| (d.kind.as_str(), d.tool.clone()))
        .collect()
}

fn has_decision(decisions: &[Decision], kind: &str, tool: &str) -> bool {
    decisions
        .iter()
        .any(|d| d.kind.as_str() == kind && d.tool == tool)
}

fn texts(result: &Value) -> Vec<String> {
    result["content"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["text"].as_str().unwrap().to_owned())
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Pass-through
// ---------------------------------------------------------------------------------------------

#[test]
fn non_tool_traffic_passes_through_unchanged_in_both_directions() {
    let mut p = proxy();
    let mut rng = ConstRng(0);
    let from_client = [
        json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18",
            "capabilities": {"sampling": {}, "roots": {"listChanged": true}, "elicitation": {}},
            "clientInfo": {"name": "client", "title": "Client", "version": "1.0.0"}}}),
        json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
        json!({"jsonrpc": "2.0", "id": 2, "method": "resources/read",
               "params": {"uri": "file:///project/a.txt"}}),
        json!({"jsonrpc": "2.0", "id": "p-3", "method": "prompts/get",
               "params": {"name": "code_review", "arguments": {"code": "fn main() {}"}}}),
        json!({"jsonrpc": "2.0", "method": "notifications/progress",
               "params": {"progressToken": "tok", "progress": 1, "total": 2, "message": "half"}}),
        json!({"jsonrpc": "2.0", "id": 4, "method": "vendor/unknownThing",
               "params": {"deep": {"list": [1, 2.5, null, "x"]}}}),
        json!({"jsonrpc": "2.0", "id": 5, "method": "ping"}),
        // A cancel for a request that is not a tool call is not rewritten.
        json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
               "params": {"requestId": 2, "reason": "no longer needed"}}),
    ];
    for m in from_client {
        assert_eq!(p.from_client(m.clone(), 0), vec![Out::ToServer(m)]);
    }

    let sampling = json!({"jsonrpc": "2.0", "id": "s-1", "method": "sampling/createMessage",
        "params": {"messages": [{"role": "user", "content": {"type": "text", "text": "hi"}}],
                   "maxTokens": 100}});
    let from_server = [
        response(
            2,
            json!({"contents": [{"uri": "file:///project/a.txt",
                                          "mimeType": "text/plain", "text": "hello"}]}),
        ),
        response(
            "p-3",
            json!({"description": "Review", "messages": [
            {"role": "user", "content": {"type": "text", "text": "Review: fn main() {}"}}]}),
        ),
        sampling.clone(),
        json!({"jsonrpc": "2.0", "method": "notifications/progress",
               "params": {"progressToken": "tok", "progress": 2, "total": 2}}),
        json!({"jsonrpc": "2.0", "method": "notifications/message",
               "params": {"level": "info", "data": "indexing"}}),
        rpc_error(4, -32601, "Method not found"),
        response(5, json!({})),
        json!({"jsonrpc": "2.0", "id": 9, "method": "roots/list"}),
    ];
    for m in from_server {
        assert_eq!(
            p.from_server(m.clone(), 0, &mut rng),
            vec![Out::ToClient(m)]
        );
    }

    // The client's answers to the server's requests go back untouched.
    let sampled = response(
        "s-1",
        json!({"role": "assistant", "content": {"type": "text", "text": "hello"},
               "model": "m", "stopReason": "endTurn"}),
    );
    assert_eq!(
        p.from_client(sampled.clone(), 0),
        vec![Out::ToServer(sampled)]
    );
    let roots_err = rpc_error(9, -32603, "no roots");
    assert_eq!(
        p.from_client(roots_err.clone(), 0),
        vec![Out::ToServer(roots_err)]
    );

    assert_eq!(p.stats(), Stats::default());
    assert!(p.take_decisions().is_empty());
    assert_eq!(p.next_deadline(), None);
}

#[test]
fn initialize_response_gains_tools_list_changed_and_nothing_else() {
    let mut p = proxy();
    let mut rng = ConstRng(0);
    let init = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "c", "version": "1"}}});
    assert_eq!(p.from_client(init.clone(), 0), vec![Out::ToServer(init)]);
    let result = json!({
        "protocolVersion": "2025-06-18",
        "capabilities": {"tools": {}, "resources": {"subscribe": true, "listChanged": false},
                         "prompts": {"listChanged": false}, "logging": {}},
        "serverInfo": {"name": "srv", "version": "2.0"},
        "instructions": "Use search first."
    });
    let outs = p.from_server(response(0, result.clone()), 0, &mut rng);
    let mut expected = result.clone();
    expected["capabilities"]["tools"] = json!({"listChanged": true});
    assert_eq!(outs, vec![Out::ToClient(response(0, expected.clone()))]);

    // A server that said `listChanged: false` is overridden too; a string id works the same.
    let init = json!({"jsonrpc": "2.0", "id": "init", "method": "initialize", "params": {}});
    p.from_client(init, 0);
    let mut said_false = result.clone();
    said_false["capabilities"]["tools"] = json!({"listChanged": false});
    let outs = p.from_server(response("init", said_false), 0, &mut rng);
    assert_eq!(outs, vec![Out::ToClient(response("init", expected))]);

    // The same shape answering anything but an initialize is not touched.
    let other = response(77, result);
    assert_eq!(
        p.from_server(other.clone(), 0, &mut rng),
        vec![Out::ToClient(other)]
    );
}

#[test]
fn initialize_response_of_a_server_without_tools_is_left_alone() {
    // A server that offers no tools must not be made to look like one that does: the client
    // would list tools the server cannot list.
    let mut p = proxy();
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}});
    p.from_client(init, 0);
    let answer = response(
        1,
        json!({"protocolVersion": "2025-06-18", "capabilities": {"resources": {}},
               "serverInfo": {"name": "files", "version": "1"}}),
    );
    assert_eq!(
        p.from_server(answer.clone(), 0, &mut ConstRng(0)),
        vec![Out::ToClient(answer)]
    );
}

#[test]
fn tools_list_answer_is_unchanged_while_nothing_is_paused() {
    let mut p = proxy();
    let req = json!({"jsonrpc": "2.0", "id": "l", "method": "tools/list",
                     "params": {"cursor": "c1"}});
    assert_eq!(p.from_client(req.clone(), 0), vec![Out::ToServer(req)]);
    let answer = response("l", json!({"tools": tools(), "nextCursor": "c2"}));
    assert_eq!(
        p.from_server(answer.clone(), 0, &mut ConstRng(0)),
        vec![Out::ToClient(answer)]
    );
}

// ---------------------------------------------------------------------------------------------
// Relaying calls under internal ids
// ---------------------------------------------------------------------------------------------

#[test]
fn call_is_forwarded_under_an_internal_id_and_answered_under_the_client_id() {
    for client_id in [json!(7), json!("req-abc")] {
        let mut p = proxy();
        list(&mut p, 1, 0);
        let req = json!({"jsonrpc": "2.0", "id": client_id, "method": "tools/call",
            "params": {"name": "search", "arguments": {"query": "rust", "limit": 2},
                       "_meta": {"progressToken": "pt"}}});
        let outs = p.from_client(req.clone(), 10);
        let mut expected = req.clone();
        expected["id"] = json!("selfheal-1");
        assert_eq!(outs, vec![Out::ToServer(expected)]);
        assert_eq!(p.next_deadline(), Some(10 + 60_000));

        let result = json!({"content": [{"type": "text", "text": "3 hits"}],
                            "structuredContent": {"hits": 3}, "isError": false});
        let outs = p.from_server(response("selfheal-1", result.clone()), 20, &mut ConstRng(0));
        assert_eq!(
            outs,
            vec![Out::ToClient(response(client_id.clone(), result))]
        );
        assert_eq!(p.next_deadline(), None);

        // A second answer with the same internal id finds nothing: the client got its answer.
        let again = p.from_server(
            response("selfheal-1", text_result("dup", false)),
            30,
            &mut ConstRng(0),
        );
        assert!(
            to_client(&again)
                .iter()
                .all(|m| m.get("id") != Some(&json!("selfheal-1"))),
            "an internal id reached the client: {again:?}"
        );
    }
}

#[test]
fn concurrent_calls_answered_out_of_order_reach_the_right_client_ids() {
    let mut p = proxy();
    list(&mut p, 1, 0);
    let a = forward(&mut p, json!(10), "search", json!({"query": "a"}), 0);
    let b = forward(&mut p, json!("ten"), "search", json!({"query": "b"}), 0);
    let c = forward(&mut p, json!(11), "put", json!({"key": "k"}), 0);
    assert_eq!(
        [a.as_str(), b.as_str(), c.as_str()],
        ["selfheal-1", "selfheal-2", "selfheal-3"]
    );
    let mut rng = ConstRng(0);
    let rc = text_result("stored", false);
    let ra = text_result("A", false);
    let rb = text_result("B", false);
    assert_eq!(
        p.from_server(response(c, rc.clone()), 1, &mut rng),
        vec![Out::ToClient(response(11, rc))]
    );
    assert_eq!(
        p.from_server(response(a, ra.clone()), 2, &mut rng),
        vec![Out::ToClient(response(10, ra))]
    );
    assert_eq!(
        p.from_server(response(b, rb.clone()), 3, &mut rng),
        vec![Out::ToClient(response("ten", rb))]
    );
    assert_eq!(p.stats().calls, 3);
    assert_eq!(p.stats().failures, 0);
}

#[test]
fn calls_to_tools_never_listed_are_relayed_as_they_are() {
    let mut p = proxy();
    let req = call_req(json!(1), "mystery", json!({"anything": ["goes", 1]}));
    let outs = p.from_client(req.clone(), 0);
    let mut expected = req;
    expected["id"] = json!("selfheal-1");
    assert_eq!(outs, vec![Out::ToServer(expected)]);
    let r = text_result("ok", false);
    assert_eq!(
        p.from_server(response("selfheal-1", r.clone()), 0, &mut ConstRng(0)),
        vec![Out::ToClient(response(1, r))]
    );
}

// ---------------------------------------------------------------------------------------------
// Pausing and resuming a failing tool
// ---------------------------------------------------------------------------------------------

/// Five `isError` answers of `send` (at times 1..=5): the tool is paused after the fifth.
fn fail_send_five_times(p: &mut Proxy) {
    let after = config().monitor.circuit_after;
    assert_eq!(after, 5, "the default circuit opens after five failures");
    for i in 1..=5u64 {
        let result = text_result("smtp: connection refused", true);
        let outs = round_trip(
            p,
            json!(i),
            "send",
            json!({"to": format!("user{i}@example.com")}),
            result.clone(),
            i,
        );
        let client = to_client(&outs);
        assert!(to_server(&outs).is_empty());
        if i == 1 {
            // The session's run decides on the first failure: `send` is not marked safe to
            // call twice, so its ladder for an unavailable tool gives a re-plan, carried out
            // as guidance to try a different approach. (The proxy used to keep its own rule —
            // nothing before the monitor's warning — which the run now decides.)
            let t = texts(&client[0]["result"]);
            assert_eq!(t.len(), 2, "answer {i}: {t:?}");
            assert_eq!(t[0], "smtp: connection refused");
            assert!(t[1].starts_with("[selfheal] "), "answer {i}: {t:?}");
            assert!(t[1].contains("different approach"), "answer {i}: {t:?}");
        } else if i == 2 {
            // Routed around by the run: the monitor's, which has nothing to say yet.
            assert_eq!(outs, vec![Out::ToClient(response(i, result))], "answer {i}");
        } else {
            // From the warning threshold on, the monitor's guidance is appended.
            let t = texts(&client[0]["result"]);
            assert_eq!(t.len(), 2, "answer {i}: {t:?}");
            assert_eq!(t[0], "smtp: connection refused");
            assert!(t[1].starts_with("[selfheal] "), "answer {i}: {t:?}");
            assert!(t[1].contains("`send`"), "answer {i}: {t:?}");
            assert_eq!(client[0]["id"], json!(i));
            assert_eq!(client[0]["result"]["isError"], json!(true));
        }
        if i < 5 {
            assert_eq!(client.len(), 1, "answer {i}: {outs:?}");
            assert!(p.paused().is_empty());
        } else {
            assert_eq!(client.len(), 2, "answer {i}: {outs:?}");
            assert_eq!(
                client[1],
                list_changed(),
                "the 5th answer, then list_changed"
            );
        }
    }
    assert_eq!(p.paused(), ["send".to_owned()]);
}

#[test]
fn five_failures_pause_a_tool_until_its_cooldown_then_it_is_offered_again() {
    let mut p = proxy();
    let mut rng = ConstRng(0);
    assert_eq!(list(&mut p, 100, 0), ["search", "put", "send"]);
    fail_send_five_times(&mut p);
    let d = p.take_decisions();
    assert!(has_decision(&d, "paused", "send"), "{:?}", kinds(&d));
    assert_eq!(d.iter().filter(|d| d.kind.as_str() == "paused").count(), 1);

    // The next list leaves it out.
    assert_eq!(list(&mut p, 101, 6), ["search", "put"]);

    // A 6th call is answered by the proxy and never reaches the server.
    let outs = p.from_client(
        call_req(json!(6), "send", json!({"to": "x@example.com"})),
        7,
    );
    assert_eq!(outs.len(), 1, "{outs:?}");
    let Out::ToClient(answer) = &outs[0] else {
        panic!("a paused tool's call reached the server: {outs:?}")
    };
    assert_eq!(answer["id"], json!(6));
    assert_eq!(answer["result"]["isError"], json!(true));
    let text = &texts(&answer["result"])[0];
    assert!(text.contains("`send`") && text.contains("paused"), "{text}");
    // Nothing waits for the server; the proxy only looks again in a second whether the paused
    // tool's cooldown is over, so an idle client hears when it is back.
    assert_eq!(p.next_deadline(), Some(7 + 1_000));
    assert!(has_decision(&p.take_decisions(), "blocked", "send"));

    // Other tools still work.
    let outs = round_trip(
        &mut p,
        json!(7),
        "search",
        json!({"query": "mail relay"}),
        text_result("2 hits", false),
        8,
    );
    let client = to_client(&outs);
    assert_eq!(client.len(), 1);
    assert_eq!(client[0]["id"], json!(7));
    assert_eq!(texts(&client[0]["result"])[0], "2 hits");
    assert_eq!(client[0]["result"]["isError"], json!(false));

    // Still paused just before the (time-based) cooldown ends: the circuit opened at t = 5.
    let cooldown = config().monitor.cooldown_ms;
    assert_eq!(cooldown, 60_000);
    let outs = round_trip(
        &mut p,
        json!(8),
        "search",
        json!({"query": "smtp"}),
        text_result("1 hit", false),
        5 + cooldown - 1,
    );
    assert_eq!(to_client(&outs).len(), 1, "{outs:?}");
    assert_eq!(p.paused(), ["send".to_owned()]);
    p.take_decisions();

    // At the end of the cooldown the next message tells the client first, then is forwarded.
    let outs = p.from_client(
        call_req(json!(9), "search", json!({"query": "q9"})),
        5 + cooldown,
    );
    assert_eq!(outs.len(), 2, "{outs:?}");
    assert_eq!(outs[0], Out::ToClient(list_changed()));
    assert!(matches!(&outs[1], Out::ToServer(m) if m["params"]["name"] == "search"));
    assert!(p.paused().is_empty());
    let d = p.take_decisions();
    assert!(has_decision(&d, "resumed", "send"), "{:?}", kinds(&d));
    let internal = to_server(&outs)[0]["id"].as_str().unwrap().to_owned();
    p.from_server(
        response(internal, text_result("ok", false)),
        5 + cooldown,
        &mut rng,
    );

    // It is listed again, and the half-open probe reaches the server; a success closes it.
    assert_eq!(list(&mut p, 102, 5 + cooldown), ["search", "put", "send"]);
    let outs = round_trip(
        &mut p,
        json!(10),
        "send",
        json!({"to": "ok@example.com"}),
        text_result("sent", false),
        5 + cooldown + 1,
    );
    let client = to_client(&outs);
    assert_eq!(client.len(), 1, "{outs:?}");
    assert_eq!(texts(&client[0]["result"]), ["sent"]);
    // Closed again: one more failure does not pause it.
    let outs = round_trip(
        &mut p,
        json!(11),
        "send",
        json!({"to": "again@example.com"}),
        text_result("smtp: connection refused", true),
        5 + cooldown + 2,
    );
    assert_eq!(to_client(&outs).len(), 1, "no list_changed: {outs:?}");
    assert!(p.paused().is_empty());
}

#[test]
fn call_based_cooldown_resumes_a_tool_and_a_failed_probe_pauses_it_again() {
    let mut cfg = config();
    cfg.monitor.cooldown_ms = 0; // calls only
    let cooldown_calls = cfg.monitor.cooldown_calls;
    assert_eq!(cooldown_calls, 10);
    let mut p = Proxy::new(cfg).unwrap();
    list(&mut p, 100, 0);
    fail_send_five_times(&mut p);
    p.take_decisions();

    // A call the proxy answers itself is not a call the monitor saw: it does not count.
    let outs = p.from_client(call_req(json!("b"), "send", json!({"to": "z"})), 6);
    assert_eq!(to_server(&outs), Vec::<Value>::new());

    // The circuit goes half-open once more than `cooldown_calls` calls were recorded since it
    // opened (at the 5th): the 11th further call's answer is followed by list_changed.
    for i in 1..=u64::from(cooldown_calls) + 1 {
        let outs = round_trip(
            &mut p,
            json!(100 + i),
            "search",
            json!({"query": format!("q{i}")}),
            text_result(&format!("r{i}"), false),
            100 + i,
        );
        let client = to_client(&outs);
        assert_eq!(client[0]["id"], json!(100 + i));
        if i <= u64::from(cooldown_calls) {
            assert_eq!(client.len(), 1, "call {i}: {outs:?}");
            assert_eq!(p.paused(), ["send".to_owned()], "call {i}");
        } else {
            assert_eq!(client.len(), 2, "call {i}: {outs:?}");
            assert_eq!(client[1], list_changed());
            assert!(p.paused().is_empty());
        }
    }
    assert!(has_decision(&p.take_decisions(), "resumed", "send"));
    assert_eq!(list(&mut p, 101, 200), ["search", "put", "send"]);

    // The half-open probe fails: paused again at once, and the client is told.
    let outs = round_trip(
        &mut p,
        json!("probe"),
        "send",
        json!({"to": "probe@example.com"}),
        text_result("smtp: connection refused", true),
        201,
    );
    let client = to_client(&outs);
    assert_eq!(client.len(), 2, "{outs:?}");
    assert_eq!(client[0]["id"], json!("probe"));
    assert_eq!(client[1], list_changed());
    assert_eq!(p.paused(), ["send".to_owned()]);
    assert!(has_decision(&p.take_decisions(), "paused", "send"));
    assert_eq!(list(&mut p, 102, 202), ["search", "put"]);
}

// ---------------------------------------------------------------------------------------------
// Arguments
// ---------------------------------------------------------------------------------------------

#[test]
fn coercible_arguments_are_repaired_before_they_reach_the_server() {
    let mut p = proxy();
    list(&mut p, 1, 0);
    let req = json!({"jsonrpc": "2.0", "id": 5, "method": "tools/call",
        "params": {"name": "search", "arguments": {"query": "rust", "limit": "3"},
                   "_meta": {"progressToken": 9}}});
    let outs = p.from_client(req, 0);
    assert_eq!(
        outs,
        vec![Out::ToServer(json!({"jsonrpc": "2.0", "id": "selfheal-1",
            "method": "tools/call",
            "params": {"name": "search", "arguments": {"query": "rust", "limit": 3},
                       "_meta": {"progressToken": 9}}}))]
    );
    assert_eq!(p.stats().repaired, 1);
    let d = p.take_decisions();
    assert_eq!(kinds(&d), [("repair", "search".to_owned())]);
    assert_eq!(d[0].detail["coercions"], json!(1));

    // Arguments that already fit are not counted as repaired.
    forward(
        &mut p,
        json!(6),
        "search",
        json!({"query": "go", "limit": 1}),
        0,
    );
    assert_eq!(p.stats().repaired, 1);
}

#[test]
fn missing_required_argument_is_answered_by_the_proxy() {
    let mut p = proxy();
    list(&mut p, 1, 0);
    let outs = p.from_client(call_req(json!("c1"), "search", json!({"limit": 2})), 0);
    assert_eq!(outs.len(), 1, "{outs:?}");
    let Out::ToClient(answer) = &outs[0] else {
        panic!("unusable arguments reached the server: {outs:?}")
    };
    assert_eq!(answer["jsonrpc"], "2.0");
    assert_eq!(answer["id"], json!("c1"));
    assert_eq!(answer["result"]["isError"], json!(true));
    let text = &texts(&answer["result"])[0];
    assert!(text.contains("missing required property"), "{text}");
    assert!(text.contains("query"), "{text}");
    assert!(text.contains("`search`"), "{text}");
    assert_eq!(p.next_deadline(), None);
    let s = p.stats();
    assert_eq!((s.calls, s.answered, s.failures), (1, 1, 0));
    let d = p.take_decisions();
    assert_eq!(kinds(&d), [("invalid_arguments", "search".to_owned())]);
    assert!(d[0].detail["reask"].as_str().unwrap().contains("query"));
}

// ---------------------------------------------------------------------------------------------
// Timeouts and retries
// ---------------------------------------------------------------------------------------------

#[test]
fn timeout_of_a_read_only_tool_is_cancelled_and_retried_and_answered_once() {
    let mut cfg = config();
    cfg.call_timeout_ms = 1_000;
    let mut p = Proxy::new(cfg).unwrap();
    let mut rng = ConstRng(0);
    list(&mut p, 1, 0);
    let req = call_req(json!(7), "search", json!({"query": "slow"}));
    let outs = p.from_client(req.clone(), 0);
    let mut first = req.clone();
    first["id"] = json!("selfheal-1");
    assert_eq!(outs, vec![Out::ToServer(first)]);
    assert_eq!(p.next_deadline(), Some(1_000));
    assert!(p.tick(999, &mut rng).is_empty());

    // Deadline: the server is told to stop; the client hears nothing yet.
    let outs = p.tick(1_000, &mut rng);
    assert_eq!(outs.len(), 1, "{outs:?}");
    let sent = to_server(&outs);
    assert!(cancelled_for("selfheal-1")(&sent[0]), "{sent:?}");
    assert_eq!(sent[0]["jsonrpc"], "2.0");
    assert!(sent[0].get("id").is_none(), "a notification has no id");
    let all = p.take_decisions();
    // The core's decision is traced with what it was made from, for `selfheal trace replay`.
    let action = all
        .iter()
        .find(|d| d.kind.as_str() == "action")
        .expect("an action event");
    assert_eq!(action.detail["action"]["action"], "retry");
    assert_eq!(action.detail["input"]["signal"]["signal"], "timeout");
    let d = own(all);
    assert_eq!(
        kinds(&d),
        [
            ("timeout", "search".to_owned()),
            ("retry", "search".to_owned())
        ]
    );
    assert_eq!(d[0].detail["after_ms"], json!(1_000));
    assert_eq!(d[1].detail["attempt"], json!(1));
    assert_eq!(d[1].detail["wait_ms"], json!(500));

    // After the backoff: the same request under a new internal id.
    assert_eq!(p.next_deadline(), Some(1_500));
    assert!(p.tick(1_499, &mut rng).is_empty());
    let outs = p.tick(1_500, &mut rng);
    let mut second = req;
    second["id"] = json!("selfheal-2");
    assert_eq!(outs, vec![Out::ToServer(second)]);
    assert_eq!(p.next_deadline(), Some(2_500));

    // The retry's answer reaches the client once, under its id.
    let r = text_result("found it", false);
    let outs = p.from_server(response("selfheal-2", r.clone()), 1_600, &mut rng);
    assert_eq!(outs, vec![Out::ToClient(response(7, r))]);
    assert_eq!(p.next_deadline(), None);

    // The first attempt's late answer is not delivered to the client.
    let late = p.from_server(
        response("selfheal-1", text_result("late", false)),
        1_700,
        &mut rng,
    );
    assert!(
        to_client(&late).is_empty(),
        "late answer delivered: {late:?}"
    );

    let s = p.stats();
    assert_eq!((s.calls, s.failures, s.retries), (1, 1, 1));
    assert_eq!(
        kinds(&p.take_decisions()),
        [("tool_result", "search".to_owned())]
    );
}

#[test]
fn timeout_of_an_idempotent_tool_is_retried_too() {
    let mut cfg = config();
    cfg.call_timeout_ms = 100;
    let mut p = Proxy::new(cfg).unwrap();
    let mut rng = ConstRng(0);
    list(&mut p, 1, 0);
    forward(
        &mut p,
        json!("k"),
        "put",
        json!({"key": "a", "value": "1"}),
        0,
    );
    let outs = p.tick(100, &mut rng);
    assert!(to_client(&outs).is_empty());
    assert!(cancelled_for("selfheal-1")(&to_server(&outs)[0]));
    let outs = p.tick(600, &mut rng);
    let sent = to_server(&outs);
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0]["id"], "selfheal-2");
    assert_eq!(
        sent[0]["params"],
        json!({"name": "put", "arguments": {"key": "a", "value": "1"}})
    );
}

#[test]
fn timeout_of_a_tool_without_hints_is_not_retried() {
    let mut cfg = config();
    cfg.call_timeout_ms = 1_000;
    let mut p = Proxy::new(cfg).unwrap();
    let mut rng = ConstRng(0);
    list(&mut p, 1, 0);
    forward(&mut p, json!(3), "send", json!({"to": "a@example.com"}), 0);
    let outs = p.tick(1_000, &mut rng);
    assert_eq!(outs.len(), 2, "{outs:?}");
    let sent = to_server(&outs);
    assert_eq!(sent.len(), 1);
    assert!(cancelled_for("selfheal-1")(&sent[0]));
    let client = to_client(&outs);
    assert_eq!(client.len(), 1);
    assert_eq!(client[0]["id"], json!(3));
    assert_eq!(client[0]["result"]["isError"], json!(true));
    let t = texts(&client[0]["result"]);
    // Not retried: the run's ladder for a timeout of a tool not safe to call twice gives a
    // re-plan, carried out as guidance naming the other tools (the proxy used to answer the
    // timeout alone, its call plan giving up).
    assert_eq!(t.len(), 2, "{t:?}");
    assert!(t[0].contains("`send`") && t[0].contains("1000 ms"), "{t:?}");
    assert!(
        t[1].contains("different approach") && t[1].contains("`search`"),
        "{t:?}"
    );
    assert_eq!(p.next_deadline(), None, "no retry is scheduled");
    assert!(p.tick(100_000, &mut rng).is_empty());
    let s = p.stats();
    assert_eq!((s.failures, s.retries), (1, 0));
    assert!(
        !p.take_decisions()
            .iter()
            .any(|d| d.kind.as_str() == "retry")
    );
}

#[test]
fn retries_are_bounded_by_the_session_budget() {
    let mut cfg = config();
    cfg.call_timeout_ms = 1_000;
    cfg.budget.retries = 2;
    let mut p = Proxy::new(cfg).unwrap();
    let mut rng = ConstRng(0);
    list(&mut p, 1, 0);
    forward(&mut p, json!(1), "search", json!({"query": "never"}), 0);

    let mut sent_calls = vec!["selfheal-1".to_owned()];
    let mut cancels = Vec::new();
    let mut answers = Vec::new();
    let mut now = 0;
    // Drive the clock from deadline to deadline until nothing is left to do.
    while let Some(d) = p.next_deadline() {
        now = d;
        for o in p.tick(now, &mut rng) {
            match o {
                Out::ToServer(m) if m["method"] == "notifications/cancelled" => {
                    cancels.push(m["params"]["requestId"].as_str().unwrap().to_owned());
                }
                Out::ToServer(m) => sent_calls.push(m["id"].as_str().unwrap().to_owned()),
                Out::ToClient(m) => answers.push(m),
            }
        }
    }
    assert_eq!(sent_calls, ["selfheal-1", "selfheal-2", "selfheal-3"]);
    assert_eq!(cancels, sent_calls, "every attempt is cancelled");
    // 1000 timeout + 500 backoff + 1000 timeout + 1000 backoff + 1000 timeout.
    assert_eq!(now, 4_500);
    assert_eq!(answers.len(), 1, "{answers:?}");
    assert_eq!(answers[0]["id"], json!(1));
    assert_eq!(answers[0]["result"]["isError"], json!(true));
    assert!(texts(&answers[0]["result"])[0].contains("did not answer"));
    let s = p.stats();
    assert_eq!((s.calls, s.failures, s.retries), (1, 3, 2));
    let d = p.take_decisions();
    let retries: Vec<&Value> = d
        .iter()
        .filter(|d| d.kind.as_str() == "retry")
        .map(|d| &d.detail["attempt"])
        .collect();
    assert_eq!(retries, [&json!(1), &json!(2)]);
    let last = d
        .iter()
        .rfind(|d| d.kind.as_str() == "tool_result")
        .unwrap();
    assert_eq!(last.detail, json!({"ok": false, "attempts": 3}));
}

#[test]
fn no_retries_when_the_retry_budget_is_zero() {
    let mut cfg = config();
    cfg.call_timeout_ms = 10;
    cfg.budget.retries = 0;
    let mut p = Proxy::new(cfg).unwrap();
    list(&mut p, 1, 0);
    forward(&mut p, json!(1), "search", json!({"query": "x"}), 0);
    let outs = p.tick(10, &mut SplitMix64::new(3));
    assert_eq!(to_server(&outs).len(), 1, "only the cancel: {outs:?}");
    assert_eq!(to_client(&outs).len(), 1, "the timeout answer: {outs:?}");
    assert_eq!(p.next_deadline(), None);
    assert_eq!(p.stats().retries, 0);
}

#[test]
fn retry_backoff_uses_the_injected_rng_for_jitter() {
    // With jitter, the wait depends on the rng: deterministic for a given seed.
    let run = |seed: u64| {
        let cfg = McpConfig {
            call_timeout_ms: 1_000,
            ..McpConfig::default() // jitter 0.2
        };
        let mut p = Proxy::new(cfg).unwrap();
        list(&mut p, 1, 0);
        forward(&mut p, json!(1), "search", json!({"query": "x"}), 0);
        p.tick(1_000, &mut SplitMix64::new(seed));
        p.next_deadline().unwrap()
    };
    assert_eq!(run(42), run(42));
    for seed in [1, 2, 3, 42] {
        let due = run(seed);
        assert!((1_400..=1_600).contains(&due), "seed {seed}: {due}");
    }
}

// ---------------------------------------------------------------------------------------------
// JSON-RPC errors
// ---------------------------------------------------------------------------------------------

#[test]
fn internal_error_of_a_read_only_tool_is_retried() {
    let mut p = proxy();
    let mut rng = ConstRng(0);
    list(&mut p, 1, 0);
    forward(&mut p, json!(4), "search", json!({"query": "x"}), 0);
    let outs = p.from_server(
        rpc_error("selfheal-1", -32603, "db connection reset"),
        10,
        &mut rng,
    );
    assert!(outs.is_empty(), "nothing for the client yet: {outs:?}");
    let d = own(p.take_decisions());
    assert_eq!(kinds(&d), [("retry", "search".to_owned())]);
    assert_eq!(d[0].detail["after"], "db connection reset");
    assert_eq!(p.next_deadline(), Some(510));
    let outs = p.tick(510, &mut rng);
    assert_eq!(outs.len(), 1);
    let sent = to_server(&outs);
    assert_eq!(sent[0]["id"], "selfheal-2");
    assert_eq!(sent[0]["method"], "tools/call");
    assert_eq!(
        sent[0]["params"],
        json!({"name": "search", "arguments": {"query": "x"}})
    );
    let r = text_result("ok now", false);
    assert_eq!(
        p.from_server(response("selfheal-2", r.clone()), 520, &mut rng),
        vec![Out::ToClient(response(4, r))]
    );
    let s = p.stats();
    assert_eq!((s.failures, s.retries), (1, 1));
}

#[test]
fn invalid_params_error_is_not_retried_and_reaches_the_client_under_its_id() {
    let mut p = proxy();
    let mut rng = ConstRng(0);
    list(&mut p, 1, 0);
    for client_id in [json!(8), json!("eight")] {
        let internal = forward(
            &mut p,
            client_id.clone(),
            "search",
            json!({"query": "x"}),
            0,
        );
        let err = json!({"code": -32602, "message": "Unknown tool: search2",
                         "data": {"hint": "check the name"}});
        let outs = p.from_server(
            json!({"jsonrpc": "2.0", "id": internal, "error": err.clone()}),
            1,
            &mut rng,
        );
        assert_eq!(
            outs,
            vec![Out::ToClient(
                json!({"jsonrpc": "2.0", "id": client_id, "error": err})
            )]
        );
    }
    assert_eq!(p.next_deadline(), None);
    assert_eq!(p.stats().retries, 0);
    assert_eq!(p.stats().failures, 2);
}

#[test]
fn internal_error_of_a_tool_without_hints_is_not_retried() {
    let mut p = proxy();
    let mut rng = ConstRng(0);
    list(&mut p, 1, 0);
    let internal = forward(&mut p, json!(2), "send", json!({"to": "a"}), 0);
    let outs = p.from_server(rpc_error(internal, -32603, "boom"), 1, &mut rng);
    assert_eq!(outs, vec![Out::ToClient(rpc_error(2, -32603, "boom"))]);
    assert_eq!(p.next_deadline(), None);
}

// ---------------------------------------------------------------------------------------------
// Cancellation
// ---------------------------------------------------------------------------------------------

#[test]
fn client_cancel_is_rewritten_to_the_internal_id_and_the_late_answer_is_dropped() {
    let mut p = proxy();
    let mut rng = ConstRng(0);
    list(&mut p, 1, 0);
    forward(&mut p, json!(9), "search", json!({"query": "long"}), 0);
    let cancel = json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
                        "params": {"requestId": 9, "reason": "user pressed stop"}});
    let outs = p.from_client(cancel, 5);
    assert_eq!(
        outs,
        vec![Out::ToServer(
            json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
                   "params": {"requestId": "selfheal-1", "reason": "user pressed stop"}})
        )]
    );
    assert_eq!(p.next_deadline(), None, "the call is no longer timed");

    // The server answers anyway: the proxy drops it. Nothing reaches the client, in particular
    // nothing under the internal id, which means nothing to it.
    let outs = p.from_server(
        response("selfheal-1", text_result("too late", false)),
        6,
        &mut rng,
    );
    assert_eq!(outs, Vec::<Out>::new());
    let outs = p.from_server(rpc_error("selfheal-1", -32800, "cancelled"), 7, &mut rng);
    assert_eq!(outs, Vec::<Out>::new());

    // A cancel for a string client id works the same way.
    forward(&mut p, json!("s"), "search", json!({"query": "other"}), 8);
    let outs = p.from_client(
        json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
               "params": {"requestId": "s"}}),
        9,
    );
    assert_eq!(to_server(&outs)[0]["params"]["requestId"], "selfheal-2");

    // Cancelled calls are neither failures nor results.
    assert_eq!(p.stats().failures, 0);
    assert!(
        !p.take_decisions()
            .iter()
            .any(|d| d.kind.as_str() == "tool_result")
    );
}

#[test]
fn late_answer_after_a_timeout_is_dropped() {
    let mut cfg = config();
    cfg.call_timeout_ms = 50;
    let mut p = Proxy::new(cfg).unwrap();
    let mut rng = ConstRng(0);
    list(&mut p, 1, 0);
    forward(&mut p, json!(1), "send", json!({"to": "a"}), 0);
    let outs = p.tick(50, &mut rng);
    assert_eq!(to_client(&outs).len(), 1, "the timeout answer");
    let late = p.from_server(
        response("selfheal-1", text_result("sent after all", false)),
        60,
        &mut rng,
    );
    assert_eq!(late, Vec::<Out>::new(), "the client already has its answer");
}

#[test]
fn an_answer_past_its_deadline_is_late_whether_or_not_the_timer_ran_first() {
    // Whether a call timed out must not depend on which event is handled first: an answer that
    // arrives when its call is already past its deadline, before the timer ran, is late too.
    let mut cfg = config();
    cfg.call_timeout_ms = 50;
    let mut p = Proxy::new(cfg).unwrap();
    let mut rng = ConstRng(0);
    list(&mut p, 1, 0);
    forward(&mut p, json!(1), "send", json!({"to": "a"}), 0);
    let outs = p.from_server(
        response("selfheal-1", text_result("sent after all", false)),
        50,
        &mut rng,
    );
    let answers = to_client(&outs);
    assert_eq!(answers.len(), 1, "{outs:?}");
    assert_eq!(
        answers[0]["result"]["isError"],
        json!(true),
        "the timeout answer, not the late one: {answers:?}"
    );
    // Within the deadline the answer is the client's.
    forward(&mut p, json!(2), "send", json!({"to": "b"}), 100);
    let outs = p.from_server(
        response("selfheal-2", text_result("in time", false)),
        149,
        &mut rng,
    );
    assert_eq!(
        to_client(&outs)[0]["result"]["content"][0]["text"],
        "in time"
    );
}

#[test]
fn client_cancel_during_a_retry_backoff_drops_the_retry() {
    let mut cfg = config();
    cfg.call_timeout_ms = 100;
    let mut p = Proxy::new(cfg).unwrap();
    let mut rng = ConstRng(0);
    list(&mut p, 1, 0);
    forward(&mut p, json!(3), "search", json!({"query": "x"}), 0);
    p.tick(100, &mut rng); // timed out: retry due at 600
    assert_eq!(p.next_deadline(), Some(600));
    let cancel = json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
                        "params": {"requestId": 3}});
    let outs = p.from_client(cancel.clone(), 200);
    // The first attempt was already cancelled by the proxy; the notice goes on as it is.
    assert_eq!(outs, vec![Out::ToServer(cancel)]);
    assert_eq!(p.next_deadline(), None);
    assert!(
        p.tick(10_000, &mut rng).is_empty(),
        "no retry after the cancel"
    );
}

// ---------------------------------------------------------------------------------------------
// Guidance
// ---------------------------------------------------------------------------------------------

#[test]
fn monitor_guidance_is_appended_to_the_result_the_client_sees() {
    let mut p = proxy();
    let mut rng = ConstRng(0);
    list(&mut p, 1, 0);
    let r = text_result("3 hits", false);
    let outs = round_trip(
        &mut p,
        json!(1),
        "search",
        json!({"query": "a", "limit": 5}),
        r.clone(),
        0,
    );
    assert_eq!(outs, vec![Out::ToClient(response(1, r.clone()))]);
    assert!(
        p.take_decisions()
            .iter()
            .all(|d| d.kind.as_str() != "guidance")
    );

    // The identical call again (keys in another order): a duplicate.
    let args: Value = serde_json::from_str(r#"{"limit": 5, "query": "a"}"#).unwrap();
    let internal = forward(&mut p, json!(2), "search", args, 1);
    let outs = p.from_server(response(internal, r), 1, &mut rng);
    assert_eq!(outs.len(), 1);
    let client = to_client(&outs);
    assert_eq!(client[0]["id"], json!(2));
    let content = client[0]["result"]["content"].as_array().unwrap();
    assert_eq!(content.len(), 2, "{content:?}");
    assert_eq!(content[0], json!({"type": "text", "text": "3 hits"}));
    assert_eq!(content[1]["type"], "text");
    let extra = content[1]["text"].as_str().unwrap();
    assert!(extra.starts_with("[selfheal] "), "{extra}");
    assert!(extra.contains("`search`"), "{extra}");
    assert_eq!(client[0]["result"]["isError"], json!(false));
    let d = p.take_decisions();
    let g = d
        .iter()
        .find(|d| d.kind.as_str() == "guidance")
        .expect("a guidance decision");
    assert_eq!(g.tool, "search");
    assert!(
        g.detail["text"][0]
            .as_str()
            .unwrap()
            .contains("already called")
    );

    // A different call: the duplicate guidance is gone with its cause.
    let r = text_result("0 hits", false);
    let outs = round_trip(
        &mut p,
        json!(3),
        "search",
        json!({"query": "b"}),
        r.clone(),
        2,
    );
    assert_eq!(outs, vec![Out::ToClient(response(3, r))]);
}

// ---------------------------------------------------------------------------------------------
// Counters and decisions
// ---------------------------------------------------------------------------------------------

#[test]
fn stats_and_decisions_report_what_happened() {
    let mut cfg = config();
    cfg.call_timeout_ms = 100;
    let mut p = Proxy::new(cfg).unwrap();
    let mut rng = ConstRng(0);
    list(&mut p, 1, 0);

    // 1: repaired and answered.
    round_trip(
        &mut p,
        json!(1),
        "search",
        json!({"query": "a", "limit": "2"}),
        text_result("ok", false),
        0,
    );
    // 2: unusable arguments, answered by the proxy.
    p.from_client(call_req(json!(2), "put", json!({"value": "v"})), 1);
    // 3: times out once, then succeeds.
    forward(&mut p, json!(3), "search", json!({"query": "b"}), 2);
    p.tick(102, &mut rng);
    let retry = to_server(&p.tick(602, &mut rng));
    p.from_server(
        response(retry[0]["id"].clone(), text_result("ok", false)),
        610,
        &mut rng,
    );
    // 4: a tool error.
    round_trip(
        &mut p,
        json!(4),
        "send",
        json!({"to": "a"}),
        text_result("nope", true),
        700,
    );

    assert_eq!(
        p.stats(),
        Stats {
            calls: 4,
            failures: 2,
            answered: 1,
            repaired: 1,
            retries: 1,
            breaches: 0,
        }
    );
    let d = own(p.take_decisions());
    assert_eq!(
        kinds(&d),
        [
            ("repair", "search".to_owned()),
            ("tool_result", "search".to_owned()),
            ("invalid_arguments", "put".to_owned()),
            ("timeout", "search".to_owned()),
            ("retry", "search".to_owned()),
            ("tool_result", "search".to_owned()),
            ("tool_result", "send".to_owned()),
            // The run's re-plan of the tool error, carried out as guidance.
            ("guidance", "send".to_owned()),
        ]
    );
    assert_eq!(d[1].detail, json!({"ok": true, "attempts": 1}));
    assert_eq!(d[5].detail, json!({"ok": true, "attempts": 2}));
    assert_eq!(d[6].detail, json!({"ok": false, "attempts": 1}));
    assert!(p.take_decisions().is_empty(), "taken once");
}

#[test]
fn invalid_monitor_config_is_refused() {
    let mut cfg = config();
    cfg.monitor.circuit_after = 0;
    assert!(Proxy::new(cfg).is_err());
}

#[test]
fn an_idle_client_hears_when_a_paused_tool_is_back() {
    let mut p = proxy();
    let mut rng = ConstRng(0);
    // Listed first: with other tools on offer the run routes around `send`; with none, the
    // run would stop at the end of its ladder instead (nothing else left to do).
    list(&mut p, 100, 0);
    fail_send_five_times(&mut p);
    p.take_decisions();
    let cooldown = config().monitor.cooldown_ms;
    // Nothing but time passes: the proxy looks once a second and says so when the cooldown ends.
    let mut now = 5;
    let mut heard = None;
    while now <= 5 + cooldown + 1_000 {
        let Some(next) = p.next_deadline() else {
            panic!("a paused tool must keep a timer running")
        };
        assert!(next > now, "the timer moves forward: {next} after {now}");
        now = next;
        let outs = p.tick(now, &mut rng);
        if !outs.is_empty() {
            heard = Some((now, outs));
            break;
        }
    }
    let (at, outs) = heard.expect("the client was never told the tool is back");
    assert!(
        at >= 5 + cooldown && at < 5 + cooldown + 1_000,
        "told at {at}"
    );
    assert_eq!(to_client(&outs), [list_changed()]);
    assert!(p.paused().is_empty());
    assert!(has_decision(&p.take_decisions(), "resumed", "send"));
    assert_eq!(p.next_deadline(), None, "nothing left to wait for");
}

#[test]
fn a_failing_run_is_told_to_stop_and_report() {
    let mut p = proxy();
    let mut last = Vec::new();
    // Six failures over three tools: no circuit opens (two each), but the run as a whole fails.
    for i in 0..6u64 {
        let tool = ["search", "put", "send"][usize::try_from(i % 3).unwrap()];
        last = round_trip(
            &mut p,
            json!(i),
            tool,
            json!({"n": i}),
            text_result("backend down", true),
            i,
        );
    }
    let answer = &to_client(&last)[0];
    let said = texts(&answer["result"]).join(" ");
    assert!(
        said.contains("[selfheal]") && said.contains("stop calling tools"),
        "{said}"
    );
    assert!(
        p.paused().is_empty(),
        "no tool failed often enough to pause"
    );
}

#[test]
fn progress_keeps_a_long_call_alive_within_a_limit() {
    let mut cfg = config();
    cfg.call_timeout_ms = 1_000;
    let mut p = Proxy::new(cfg).unwrap();
    let mut rng = ConstRng(0);
    let mut call = call_req(json!(1), "search", json!({"query": "x"}));
    call["params"]["_meta"] = json!({"progressToken": "tok"});
    p.from_client(call, 0);
    let progress = |t: u64| {
        json!({"jsonrpc": "2.0", "method": "notifications/progress",
               "params": {"progressToken": "tok", "progress": t}})
    };
    // Progress every 900 ms keeps it alive past its first deadline...
    for t in (900..=8_100).step_by(900) {
        assert!(
            to_server(&p.tick(t - 1, &mut rng)).is_empty(),
            "cancelled at {t}"
        );
        let outs = p.from_server(progress(t), t, &mut rng);
        assert_eq!(to_client(&outs), [progress(t)], "progress passes through");
    }
    // ...but not past ten call timeouts after it was sent.
    p.from_server(progress(9_500), 9_500, &mut rng);
    assert_eq!(p.next_deadline(), Some(10_000));
    let outs = p.tick(10_000, &mut rng);
    assert!(
        to_server(&outs).iter().any(cancelled_for("selfheal-1")),
        "{outs:?}"
    );
}

#[test]
fn when_the_server_exits_waiting_calls_and_retries_are_answered() {
    let mut cfg = config();
    cfg.call_timeout_ms = 100;
    let mut p = Proxy::new(cfg).unwrap();
    let mut rng = ConstRng(0);
    list(&mut p, 100, 0);
    // One call waits for the server; a read-only one timed out and waits for its retry.
    p.from_client(call_req(json!("a"), "put", json!({"key": "k"})), 150);
    p.from_client(call_req(json!("b"), "search", json!({"query": "q"})), 0);
    p.tick(100, &mut rng);
    let outs = p.server_closed();
    let answered: Vec<Value> = to_client(&outs).iter().map(|m| m["id"].clone()).collect();
    assert_eq!(answered.len(), 2, "{outs:?}");
    assert!(answered.contains(&json!("a")) && answered.contains(&json!("b")));
    assert!(
        to_client(&outs)
            .iter()
            .all(|m| m["error"]["code"] == json!(-32603))
    );
    assert_eq!(p.next_deadline(), None);
}

// ---------------------------------------------------------------------------------------------
// The core decides (issue 11): the policy's ladders, the shared reading of tool errors
// ---------------------------------------------------------------------------------------------

/// The first attempt of a `search` call (read-only) answered with `answer`; returns the
/// decisions taken.
fn first_answer(cfg: McpConfig, answer: impl FnOnce(&str) -> Value) -> Vec<Decision> {
    let mut p = Proxy::new(cfg).unwrap();
    list(&mut p, 1, 0);
    let internal = forward(&mut p, json!(1), "search", json!({"query": "x"}), 0);
    p.from_server(answer(&internal), 5, &mut ConstRng(0));
    p.take_decisions()
}

#[test]
fn a_tool_error_is_retried_only_when_its_text_says_it_is_transient() {
    let transient = first_answer(config(), |id| {
        response(id, text_result("upstream timed out, try again", true))
    });
    assert!(has_decision(&transient, "retry", "search"), "{transient:?}");
    let lasting = first_answer(config(), |id| {
        response(id, text_result("ENOENT: no such file or directory", true))
    });
    assert!(!has_decision(&lasting, "retry", "search"), "{lasting:?}");
}

#[test]
fn a_policy_without_retries_for_the_class_makes_the_proxy_stop_retrying() {
    let mut cfg = config();
    cfg.policy =
        selfheal_core::Policy::from_toml_str("[ladders]\ntool_timeout = [\"degrade\"]\n").unwrap();
    let d = first_answer(cfg, |id| rpc_error(id, -32603, "db connection reset"));
    assert!(!has_decision(&d, "retry", "search"), "{d:?}");
    assert!(has_decision(&d, "tool_result", "search"), "{d:?}");
    // The same failure under the default policy is retried.
    let d = first_answer(config(), |id| rpc_error(id, -32603, "db connection reset"));
    assert!(has_decision(&d, "retry", "search"), "{d:?}");
}

#[test]
fn json_rpc_errors_are_read_into_the_cores_signals() {
    use selfheal_core::Signal;
    use selfheal_mcp::rpc_signal;
    assert!(matches!(
        rpc_signal(&json!({"code": -32602, "message": "bad"})),
        Signal::InvalidArguments { .. }
    ));
    assert!(matches!(
        rpc_signal(&json!({"code": -32601, "message": "no such method"})),
        Signal::UnknownTool { .. }
    ));
    assert!(matches!(
        rpc_signal(&json!({"code": -32603, "message": "boom"})),
        Signal::Exception { .. }
    ));
}

// ---------------------------------------------------------------------------------------------
// Output contracts and freshness (`[tools.NAME]`)
// ---------------------------------------------------------------------------------------------

/// A proxy whose tools are described by `tools` (a `selfheal mcp --config` file), the server's
/// tools listed at 0 ms. `now_ms` is Unix time (no wall clock set).
fn contract_proxy(tools: &str) -> Proxy {
    contract_proxy_with(tools, |_| {})
}

/// [`contract_proxy`] under a policy `tune` changes.
fn contract_proxy_with(tools: &str, tune: impl FnOnce(&mut McpConfig)) -> Proxy {
    let mut cfg = config();
    cfg.tools = selfheal_mcp::tools_from_toml_str(tools).unwrap();
    tune(&mut cfg);
    let mut p = Proxy::new(cfg).unwrap();
    list(&mut p, 1, 0);
    p
}

/// The call the proxy sends again after the policy's backoff (a retry it decided at 10 ms),
/// answered with `value`: what the client gets.
fn retried(p: &mut Proxy, value: Value, rng: &mut ConstRng) -> Vec<Out> {
    let sent = to_server(&p.tick(510, rng));
    p.from_server(response(sent[0]["id"].clone(), structured(value)), 520, rng)
}

fn structured(value: Value) -> Value {
    json!({"content": [{"type": "text", "text": value.to_string()}], "structuredContent": value})
}

/// The one answer the client got.
fn answer(outs: &[Out]) -> Value {
    let c = to_client(outs);
    assert_eq!(c.len(), 1, "one answer: {outs:?}");
    c[0]["result"].clone()
}

#[test]
fn a_renamed_declared_field_is_mapped_back_as_the_core_decides() {
    let mut p = contract_proxy("[tools.search]\noutput = [\"city\"]\n");
    let drifted = structured(json!({"city_v2": "Paris", "n": 1}));
    let outs = round_trip(
        &mut p,
        json!(5),
        "search",
        json!({"query": "q"}),
        drifted,
        10,
    );
    let r = answer(&outs);
    assert_eq!(to_client(&outs)[0]["id"], json!(5));
    assert_eq!(r["structuredContent"], json!({"city": "Paris", "n": 1}));
    assert_ne!(r["isError"], json!(true), "a repaired answer is an answer");
    let t = texts(&r);
    assert_eq!(
        serde_json::from_str::<Value>(&t[0]).unwrap(),
        json!({"city": "Paris", "n": 1}),
        "the text the model reads is the mapped value too"
    );
    assert!(
        t.last().unwrap().contains("mapped it back"),
        "the model is told: {t:?}"
    );
    let all = p.take_decisions();
    let action = all.iter().find(|d| d.kind.as_str() == "action").unwrap();
    assert_eq!(action.detail["action"]["action"], "repair");
    assert_eq!(action.detail["class"], "malformed_output");
    assert!(has_decision(&all, "repair", "search"));
    let s = p.stats();
    assert_eq!((s.breaches, s.retries), (1, 0));
}

#[test]
fn a_drift_that_cannot_be_mapped_is_retried_then_flagged_as_an_error() {
    let mut p = contract_proxy("[tools.search]\noutput = [\"city\"]\n");
    let mut rng = ConstRng(0);
    // Two keys that could both be `city`: mapping one would be a guess.
    let ambiguous = json!({"city_a": "Paris", "city_b": "Lyon"});
    let outs = round_trip(
        &mut p,
        json!(5),
        "search",
        json!({"query": "q"}),
        structured(ambiguous.clone()),
        10,
    );
    assert!(outs.is_empty(), "not answered yet: {outs:?}");
    let d = p.take_decisions();
    let refused = d
        .iter()
        .find(|d| d.kind.as_str() == "repair")
        .expect("the repair was tried");
    assert!(refused.detail["refused"].as_str().unwrap().contains("city"));
    let actions: Vec<&Value> = d
        .iter()
        .filter(|d| d.kind.as_str() == "action")
        .map(|d| &d.detail["action"]["action"])
        .collect();
    // The proxy offers the run a repair only when it can carry it out: the mapping is
    // refused first (traced above), so the run's ladder goes straight to the retry. (The
    // proxy used to let its call plan choose the repair, refuse it, and ask again.)
    assert_eq!(actions, [&json!("retry")]);
    // The read-only tool is asked again after the policy's backoff.
    let sent = to_server(&p.tick(510, &mut rng));
    assert_eq!(sent.len(), 1, "{sent:?}");
    assert_eq!(sent[0]["params"]["arguments"], json!({"query": "q"}));
    // Still drifted: the ladder has nothing left, and the answer is flagged, not passed on.
    let outs = p.from_server(
        response(sent[0]["id"].clone(), structured(ambiguous)),
        520,
        &mut rng,
    );
    let r = answer(&outs);
    assert_eq!(r["isError"], json!(true));
    let t = texts(&r);
    assert!(
        t[0].contains("`city`") && t[0].contains("schema drift"),
        "{t:?}"
    );
    // Never mappable: the second answer is not mapped either.
    assert!(t[0].contains("after 2 attempts"), "{t:?}");
    assert_eq!(
        r["structuredContent"]["city_a"], "Paris",
        "the answer is kept"
    );
    let s = p.stats();
    assert_eq!((s.breaches, s.retries), (2, 1));
    let d = own(p.take_decisions());
    let result = d.iter().find(|d| d.kind.as_str() == "tool_result").unwrap();
    assert_eq!(result.detail["ok"], json!(false));
    assert_eq!(result.detail["breach"], "drifted");
}

#[test]
fn a_missing_field_of_a_tool_without_hints_is_flagged_at_once() {
    let mut p = contract_proxy("[tools.send]\noutput = [\"receipt\"]\n");
    let outs = round_trip(
        &mut p,
        json!(9),
        "send",
        json!({"to": "a"}),
        text_result("{\"status\": \"queued\"}", false),
        10,
    );
    let r = answer(&outs);
    assert_eq!(r["isError"], json!(true));
    let t = texts(&r);
    assert!(t[0].contains("`receipt`"), "{t:?}");
    assert!(t[0].contains("not called again"), "{t:?}");
    assert!(
        t[0].contains("cannot be mapped back"),
        "the repair was tried: {t:?}"
    );
    assert_eq!(t[1], "{\"status\": \"queued\"}", "the answer follows");
    assert_eq!(p.stats().retries, 0);
}

#[test]
fn plain_text_where_fields_are_declared_is_flagged() {
    let mut p = contract_proxy("[tools.send]\noutput = [\"receipt\"]\n");
    let outs = round_trip(
        &mut p,
        json!(9),
        "send",
        json!({"to": "a"}),
        text_result("sent!", false),
        10,
    );
    assert_eq!(answer(&outs)["isError"], json!(true));
}

#[test]
fn an_empty_output_is_retried_and_a_recovered_reread_tool_is_read_again() {
    let mut p = contract_proxy("[tools.search]\noutput = [\"hits\"]\nreread = true\n");
    let mut rng = ConstRng(0);
    let outs = round_trip(
        &mut p,
        json!(3),
        "search",
        json!({"query": "q"}),
        structured(json!({"hits": []})),
        10,
    );
    assert!(outs.is_empty(), "{outs:?}");
    let d = p.take_decisions();
    let action = d.iter().find(|d| d.kind.as_str() == "action").unwrap();
    assert_eq!(action.detail["class"], "empty_output");
    assert_eq!(action.detail["action"]["action"], "retry");
    let outs = retried(&mut p, json!({"hits": [1, 2]}), &mut rng);
    let r = answer(&outs);
    assert_ne!(r["isError"], json!(true));
    assert_eq!(r["structuredContent"], json!({"hits": [1, 2]}));
    let t = texts(&r);
    assert!(
        t.last()
            .unwrap()
            .contains("call it again with the same arguments"),
        "a recovered value of a reread tool is to be read again: {t:?}"
    );

    // A call that needed no recovery is not asked to be read again.
    let outs = round_trip(
        &mut p,
        json!(4),
        "search",
        json!({"query": "r"}),
        structured(json!({"hits": [3]})),
        600,
    );
    assert_eq!(texts(&answer(&outs)).len(), 1, "no guidance: {outs:?}");
}

#[test]
fn the_policy_decides_no_reread_when_it_asks_for_none() {
    let mut p = contract_proxy_with(
        "[tools.search]\noutput = [\"hits\"]\nreread = true\n",
        |cfg| cfg.policy.reread_after_recovery = Some(false),
    );
    let mut rng = ConstRng(0);
    round_trip(
        &mut p,
        json!(3),
        "search",
        json!({"query": "q"}),
        structured(json!({"hits": null})),
        10,
    );
    let outs = retried(&mut p, json!({"hits": [1]}), &mut rng);
    assert_eq!(texts(&answer(&outs)).len(), 1, "{outs:?}");
}

/// Issue 11: under `claim_after_recovery = false` the policy claims nothing after a recovery.
/// The proxy never sees the run's answer, so the recovered value says so: its result carries
/// guidance to report it as unconfirmed (and no read again, which the policy makes none of),
/// whether or not the tool is marked `reread`; a value that needed no recovery carries nothing.
#[test]
fn a_recovered_value_is_unconfirmed_when_the_policy_claims_nothing_after_a_recovery() {
    for tools in [
        "[tools.search]\noutput = [\"hits\"]\nreread = true\n",
        "[tools.search]\noutput = [\"hits\"]\n",
    ] {
        let mut p = contract_proxy_with(tools, |cfg| cfg.policy.claim_after_recovery = Some(false));
        let mut rng = ConstRng(0);
        round_trip(
            &mut p,
            json!(3),
            "search",
            json!({"query": "q"}),
            structured(json!({"hits": null})),
            10,
        );
        let outs = retried(&mut p, json!({"hits": [1]}), &mut rng);
        let r = answer(&outs);
        assert_ne!(r["isError"], json!(true), "{tools}");
        assert_eq!(
            r["structuredContent"],
            json!({"hits": [1]}),
            "the value is kept"
        );
        let t = texts(&r);
        assert_eq!(t.len(), 2, "{tools}: {t:?}");
        assert!(t[1].contains("claim_after_recovery = false"), "{t:?}");
        assert!(t[1].contains("as unconfirmed"), "{t:?}");
        assert!(!t[1].contains("call it again"), "no read again: {t:?}");
        let d = own(p.take_decisions());
        assert!(
            d.iter()
                .any(|d| d.kind.as_str() == "guidance" && d.detail.get("unconfirmed").is_some()),
            "{tools}"
        );

        // A value that needed no recovery is not flagged.
        let outs = round_trip(
            &mut p,
            json!(4),
            "search",
            json!({"query": "r"}),
            structured(json!({"hits": [3]})),
            600,
        );
        assert_eq!(texts(&answer(&outs)).len(), 1, "{tools}: {outs:?}");
    }
}

#[test]
fn an_empty_output_of_a_tool_without_hints_is_flagged() {
    let mut p = contract_proxy("[tools.send]\noutput = [\"receipt\"]\n");
    let outs = round_trip(
        &mut p,
        json!(9),
        "send",
        json!({"to": "a"}),
        structured(json!({"receipt": null})),
        10,
    );
    let r = answer(&outs);
    assert_eq!(r["isError"], json!(true));
    assert!(texts(&r)[0].contains("null or empty"), "{r}");
}

const STALE_FX: &str =
    "[tools.search]\nas_of = \"as_of\"\nmax_age_ms = 1000\nrefresh = \"no_cache\"\n";

#[test]
fn stale_data_of_a_tool_that_declares_refresh_is_fetched_again_with_it_set() {
    let mut p = contract_proxy(STALE_FX);
    let mut rng = ConstRng(0);
    // At 10 s, data stamped at 2 s is 8 s old: more than the second allowed.
    let outs = round_trip(
        &mut p,
        json!(4),
        "search",
        json!({"query": "eur"}),
        structured(json!({"rate": 1.1, "as_of": 2_000})),
        10_000,
    );
    assert!(outs.is_empty(), "{outs:?}");
    let d = p.take_decisions();
    let action = d.iter().find(|d| d.kind.as_str() == "action").unwrap();
    assert_eq!(action.detail["class"], "stale_context");
    assert_eq!(action.detail["action"]["action"], "refresh");
    let sent = to_server(&p.tick(10_000, &mut rng));
    assert_eq!(sent.len(), 1, "sent again at once: {sent:?}");
    assert_eq!(
        sent[0]["params"]["arguments"],
        json!({"query": "eur", "no_cache": true})
    );
    let fresh = structured(json!({"rate": 1.2, "as_of": 9_900}));
    let outs = p.from_server(
        response(sent[0]["id"].clone(), fresh.clone()),
        10_010,
        &mut rng,
    );
    assert_eq!(outs, vec![Out::ToClient(response(4, fresh))]);
    assert_eq!(p.stats().retries, 1);
}

#[test]
fn stale_data_that_stays_stale_after_a_refresh_is_flagged_with_guidance() {
    let mut p = contract_proxy(STALE_FX);
    let mut rng = ConstRng(0);
    let old = structured(json!({"rate": 1.1, "as_of": 2_000}));
    round_trip(
        &mut p,
        json!(4),
        "search",
        json!({"query": "eur"}),
        old.clone(),
        10_000,
    );
    let sent = to_server(&p.tick(10_000, &mut rng));
    let outs = p.from_server(response(sent[0]["id"].clone(), old), 10_010, &mut rng);
    let r = answer(&outs);
    assert_ne!(
        r["isError"],
        json!(true),
        "stale data is data, flagged by guidance"
    );
    assert_eq!(r["structuredContent"]["rate"], json!(1.1));
    let t = texts(&r);
    assert!(t.last().unwrap().contains("stale"), "{t:?}");
    assert!(t.last().unwrap().contains("8010 ms"), "its age: {t:?}");
}

#[test]
fn stale_data_without_a_refresh_argument_or_a_safe_tool_gets_guidance() {
    // No `refresh` declared: nothing to fetch fresh data with.
    let mut p = contract_proxy("[tools.search]\nas_of = \"as_of\"\nmax_age_ms = 1000\n");
    let outs = round_trip(
        &mut p,
        json!(4),
        "search",
        json!({"query": "eur"}),
        structured(json!({"rate": 1.1, "as_of": 2_000})),
        10_000,
    );
    let r = answer(&outs);
    assert_ne!(r["isError"], json!(true));
    let t = texts(&r);
    assert!(
        t.last().unwrap().contains("stale") && t.last().unwrap().contains("no `refresh`"),
        "{t:?}"
    );
    assert_eq!(p.stats().retries, 0);

    // `refresh` declared, but the server does not say calling `send` twice is harmless.
    let mut p = contract_proxy(
        "[tools.send]\nas_of = \"as_of\"\nmax_age_ms = 1000\nrefresh = \"no_cache\"\n",
    );
    let outs = round_trip(
        &mut p,
        json!(4),
        "send",
        json!({"to": "a"}),
        structured(json!({"ok": true, "as_of": 2_000})),
        10_000,
    );
    let t = texts(&answer(&outs));
    assert!(t.last().unwrap().contains("stale"), "{t:?}");
    assert_eq!(p.stats().retries, 0, "never sent twice");
}

#[test]
fn fresh_and_conforming_answers_pass_untouched() {
    let mut p = contract_proxy(
        "[tools.search]\noutput = [\"rate\"]\nas_of = \"as_of\"\nmax_age_ms = 1000\n",
    );
    let ok = structured(json!({"rate": 1.1, "as_of": 9_500}));
    let outs = round_trip(
        &mut p,
        json!(4),
        "search",
        json!({"query": "eur"}),
        ok.clone(),
        10_000,
    );
    assert_eq!(outs, vec![Out::ToClient(response(4, ok))]);
    assert_eq!(p.stats().breaches, 0);
}

#[test]
fn the_wall_clock_reads_stamps_against_the_session_start() {
    let mut p = contract_proxy("[tools.search]\nas_of = \"as_of\"\nmax_age_ms = 1000\n");
    p.set_wall_clock(1_700_000_000_000);
    // 100 ms into the session, data stamped 50 ms before it started is fresh...
    let ok = structured(json!({"rate": 1.1, "as_of": 1_699_999_999_950_u64}));
    let outs = round_trip(
        &mut p,
        json!(4),
        "search",
        json!({"query": "eur"}),
        ok.clone(),
        100,
    );
    assert_eq!(outs, vec![Out::ToClient(response(4, ok))]);
    // ...and data stamped 5 s before it is 5.1 s old (on the session's own clock, 100 ms is
    // long before the stamp: the wall clock is what makes it stale).
    let old = structured(json!({"rate": 1.1, "as_of": 1_699_999_995_000_u64}));
    let outs = round_trip(
        &mut p,
        json!(5),
        "search",
        json!({"query": "usd"}),
        old,
        100,
    );
    let t = texts(&answer(&outs));
    assert!(t.last().unwrap().contains("stamped 5100 ms ago"), "{t:?}");
}

#[test]
fn tool_tables_take_the_gateways_keys_and_refuse_what_the_proxy_cannot_do() {
    let t = selfheal_mcp::tools_from_toml_str(
        "[tools.fx]\noutput = [\"rate\"]\nas_of = \"t\"\nmax_age_ms = 5\nrefresh = \"fresh\"\nreread = true\n",
    )
    .unwrap();
    assert_eq!(t["fx"].output, ["rate"]);
    assert_eq!(t["fx"].refresh.as_deref(), Some("fresh"));
    for (toml, needle) in [
        ("[tools.fx]\nsubstitute = \"fx2\"\n", "substitute"),
        ("[tools.fx]\ncross_check = true\n", "cross_check"),
        ("[tools.fx]\ngrounded = true\n", "grounded"),
        ("[tools.fx]\noutput = [\" \"]\n", "not blank"),
        ("[tools.fx]\nouptut = [\"a\"]\n", "ouptut"),
        ("[policy]\nreread_reads = 1\n", "policy"),
    ] {
        let e = selfheal_mcp::tools_from_toml_str(toml).unwrap_err();
        assert!(e.contains(needle), "{toml:?}: {e}");
    }
    // Built by hand, the same check applies.
    let mut cfg = config();
    cfg.tools.insert(
        "fx".into(),
        selfheal_core::contract::ToolConfig {
            cross_check: true,
            ..Default::default()
        },
    );
    assert!(Proxy::new(cfg).is_err());
}

#[test]
fn a_mapping_the_tools_output_schema_would_refuse_is_no_repair() {
    let mut cfg = config();
    cfg.tools = selfheal_mcp::tools_from_toml_str("[tools.geo]\noutput = [\"city\"]\n").unwrap();
    let mut p = Proxy::new(cfg).unwrap();
    let mut rng = ConstRng(0);
    // The server's own outputSchema says `city_v2`: a client validating structured results
    // against it would refuse `city`, so mapping it back is not a repair the proxy can make.
    let geo = json!([{
        "name": "geo",
        "inputSchema": {"type": "object", "properties": {"q": {"type": "string"}}},
        "outputSchema": {
            "type": "object",
            "properties": {"city_v2": {"type": "string"}},
            "required": ["city_v2"]
        },
        "annotations": {"readOnlyHint": true}
    }]);
    let req = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}});
    p.from_client(req, 0);
    p.from_server(response(1, json!({"tools": geo})), 0, &mut rng);
    let drifted = structured(json!({"city_v2": "Paris"}));
    let outs = round_trip(&mut p, json!(2), "geo", json!({"q": "x"}), drifted, 10);
    assert!(outs.is_empty(), "retried, not mapped: {outs:?}");
    let d = p.take_decisions();
    let repair = d.iter().find(|d| d.kind.as_str() == "repair").unwrap();
    assert!(
        repair.detail["refused"]
            .as_str()
            .unwrap()
            .contains("outputSchema"),
        "{repair:?}"
    );
    assert!(has_decision(&d, "retry", "geo"));
}

#[test]
fn five_answers_without_a_declared_field_pause_the_tool_and_the_client_is_told() {
    let mut p = contract_proxy("[tools.send]\noutput = [\"receipt\"]\n");
    for i in 1..=5u64 {
        let outs = round_trip(
            &mut p,
            json!(i),
            "send",
            json!({"to": format!("user{i}")}),
            structured(json!({"status": "queued"})),
            i,
        );
        let client = to_client(&outs);
        assert_eq!(client[0]["result"]["isError"], json!(true), "answer {i}");
        if i < 5 {
            assert_eq!(client.len(), 1, "answer {i}: {outs:?}");
        } else {
            assert_eq!(client.len(), 2, "answer {i}: {outs:?}");
            assert_eq!(
                client[1],
                list_changed(),
                "the 5th answer, then list_changed"
            );
        }
    }
    assert_eq!(p.paused(), ["send".to_owned()]);
}

#[test]
fn a_breach_is_retried_only_within_the_session_budget() {
    let mut cfg = config();
    cfg.tools = selfheal_mcp::tools_from_toml_str("[tools.search]\noutput = [\"hits\"]\n").unwrap();
    cfg.budget.retries = 0;
    let mut p = Proxy::new(cfg).unwrap();
    list(&mut p, 1, 0);
    let outs = round_trip(
        &mut p,
        json!(3),
        "search",
        json!({"query": "q"}),
        structured(json!({"hits": []})),
        10,
    );
    // The read-only tool would be retried, but the budget has no retry left: flagged at once.
    assert_eq!(answer(&outs)["isError"], json!(true));
    assert_eq!(p.stats().retries, 0);
}

/// Issue 30: the monitor's warning at 3 failures in a row and its circuit at 5 name the other
/// tools the server lists, as through the gateway and the runtime (the same core rule): the
/// agent is told what else it can use.
#[test]
fn issue_30_guidance_about_a_failing_tool_names_the_other_listed_tools() {
    let mut p = proxy();
    assert_eq!(list(&mut p, 100, 0), ["search", "put", "send"]);
    let mut notes = Vec::new();
    for i in 1..=5u64 {
        let outs = round_trip(
            &mut p,
            json!(i),
            "send",
            json!({"to": format!("user{i}@example.com")}),
            text_result("smtp: connection refused", true),
            i,
        );
        notes.push(texts(&to_client(&outs)[0]["result"]).join(" "));
    }
    for (i, note) in notes.iter().enumerate().skip(2) {
        assert!(
            note.contains("`put`") && note.contains("`search`"),
            "answer {}: {note}",
            i + 1
        );
    }
    assert!(
        !notes[1].contains("`search`"),
        "no guidance before 3: {}",
        notes[1]
    );
}
