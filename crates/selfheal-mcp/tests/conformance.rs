//! The core's conformance table of the seeds' tool-health rules
//! (`selfheal_core::conformance`, feature `conformance`), run through the MCP proxy: the same
//! rows every front-end runs through its own adapter, here as MCP messages.
//!
//! The adapter plays an MCP client and server around a [`Proxy`]: the row's tools are listed
//! (marked read-only, so a resend is safe, as the core's own adapter offers), and each line of
//! the script is one answer of the server — to a new `tools/call` of the client, or to the
//! retry the proxy sent when the session's run asked for one. After each line it reads what
//! an MCP client can see: the tools the proxy leaves out of `tools/list`, and, when a result
//! reached the client, the guidance appended to it (warnings at 3 failures in a row, the
//! circuit at 5, both naming the other tools) or the stop; at the end, the status the session's
//! run finishes with.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use serde_json::{Value, json};

use selfheal_core::{
    ConstRng, RunStatus,
    conformance::{self, Outcome, Seen},
};
use selfheal_mcp::{McpConfig, Proxy};

mod common;
use common::{to_client, to_server};

/// The server's answer for an outcome: a result (an error body is a result the tool did not
/// flag, `{"error": ...}` as its text), or an `isError` result for a tool that raised.
fn server_result(outcome: Outcome) -> Value {
    match (outcome.value(), outcome.error()) {
        (_, Some(error)) => json!({"content": [{"type": "text", "text": error}], "isError": true}),
        (Some(v), None) => {
            json!({"content": [{"type": "text", "text": v.to_string()}], "isError": false})
        }
        (None, None) => unreachable!("every outcome answers or raises"),
    }
}

/// The MCP client and server around one proxy session.
struct Session {
    proxy: Proxy,
    rng: ConstRng,
    now: u64,
    next_id: u64,
    offered: Vec<String>,
    /// A request the proxy sent the server that waits for its answer.
    waiting: Option<Value>,
    /// The tools are listed read-only (safe to send twice).
    read_only: bool,
}

impl Session {
    /// A session whose server lists `offered`, read-only.
    fn new(offered: &[String]) -> Session {
        Session::listing(offered, true)
    }

    /// A session whose server lists `offered`, marked read-only or without hints.
    fn listing(offered: &[String], read_only: bool) -> Session {
        let mut c = McpConfig::default();
        c.policy.retry.jitter = 0.0;
        let mut s = Session {
            proxy: Proxy::new(c).unwrap(),
            rng: ConstRng(0),
            now: 0,
            next_id: 0,
            offered: offered.to_vec(),
            waiting: None,
            read_only,
        };
        assert_eq!(s.list(), offered, "nothing hidden at first");
        s
    }

    fn id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    /// The tools the client is shown.
    fn list(&mut self) -> Vec<String> {
        let id = self.id();
        let req = json!({"jsonrpc": "2.0", "id": id, "method": "tools/list"});
        self.proxy.from_client(req, self.now);
        let tools: Vec<Value> = self
            .offered
            .iter()
            .map(|t| {
                json!({
                    "name": t,
                    "inputSchema": {"type": "object", "properties": {"q": {"type": "string"}}},
                    "annotations": {"readOnlyHint": self.read_only}
                })
            })
            .collect();
        let answer = json!({"jsonrpc": "2.0", "id": id, "result": {"tools": tools}});
        let outs = self.proxy.from_server(answer, self.now, &mut self.rng);
        let listed = to_client(&outs);
        listed[0]["result"]["tools"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["name"].as_str().unwrap().to_owned())
            .collect()
    }

    /// One answer of the server for `tool`: to the retry the proxy waits on, or to a new call
    /// of the client. Returns the result the client got, if one did.
    fn result(&mut self, tool: &str, outcome: Outcome, i: usize) -> Option<Value> {
        let request = match self.waiting.take() {
            Some(r) => r,
            None => {
                let id = self.id();
                let call = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
                                  "params": {"name": tool, "arguments": conformance::args(i)}});
                let outs = self.proxy.from_client(call, self.now);
                let sent = to_server(&outs);
                if sent.is_empty() {
                    // Answered by the proxy (a hidden tool, a stopped run).
                    return to_client(&outs).into_iter().find(|m| m.get("id").is_some());
                }
                sent[0].clone()
            }
        };
        assert_eq!(
            request["params"]["name"], tool,
            "line {i}: the call waiting is another tool's"
        );
        let answer =
            json!({"jsonrpc": "2.0", "id": request["id"], "result": server_result(outcome)});
        let mut outs = self.proxy.from_server(answer, self.now, &mut self.rng);
        // Until the client has its answer or the proxy sends the retry the run asked for
        // (once its wait is over); a few ticks at most.
        for _ in 0..10 {
            if let Some(r) = to_server(&outs)
                .into_iter()
                .find(|m| m["method"] == "tools/call")
            {
                self.waiting = Some(r);
                return None;
            }
            if let Some(m) = to_client(&outs).into_iter().find(|m| m.get("id").is_some()) {
                return Some(m["result"].clone());
            }
            let at = self.proxy.next_deadline().expect("a retry waits: {outs:?}");
            self.now = at.max(self.now);
            outs = self.proxy.tick(self.now, &mut self.rng);
        }
        panic!("line {i}: neither answered nor retried");
    }
}

/// The texts of a result, joined.
fn said(result: &Value) -> String {
    result["content"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|i| i["text"].as_str())
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn the_seeds_monitor_rules_hold_through_the_mcp_proxy() {
    let rows = conformance::table().unwrap();
    assert!(rows.len() >= 5);
    for row in &rows {
        // Read-only, as the core's own adapter offers a resend: the table's ladders assume one.
        let mut s = Session::new(&row.offered);
        let mut seen = Vec::new();
        for (i, line) in row.script.iter().enumerate() {
            s.now += 1_000;
            let got = s.result(&line.tool, line.result, i);
            let at = format!("{} — result {}: {got:?}", row.name, i + 1);
            let Some(result) = got else {
                assert!(
                    s.proxy.stopped().is_none(),
                    "a stop answers the client: {at}"
                );
                seen.push(Seen::Unseen);
                continue;
            };
            let text = said(&result);
            if s.proxy.stopped().is_some() {
                assert!(text.contains("stop calling tools"), "{at}");
                seen.push(Seen::Stopped);
                break;
            }
            let hidden = s.proxy.paused().to_vec();
            let listed = s.list();
            for h in &hidden {
                assert!(!listed.contains(h), "{h} is left out of tools/list: {at}");
            }
            seen.push(Seen::Going {
                warned: conformance::warned_in(&text, &row.offered),
                hidden,
                told: text,
            });
        }
        let status = s.proxy.finish(99_000).status;
        if let Err(e) = conformance::judge(row, &seen, status) {
            panic!("the MCP proxy: {e}");
        }
    }
}

/// The issue's stuck agent, through the proxy: `web_search` answers `{"error": "search backend
/// down"}` every time, `fetch_url` is on offer, and the agent calls whatever `tools/list`
/// shows first, listing again when told the list changed. Directly it would call `web_search`
/// fifteen times; through the proxy it is warned at 3 failures in a row, the tool is hidden at
/// 5 with guidance naming `fetch_url`, and the agent goes on with `fetch_url`. Nothing stops.
/// The server gives no hints, so no call is sent twice: each call is one failure.
#[test]
fn issue_30_the_stuck_agent_finishes_via_the_alternative_tool() {
    let offered = ["web_search".to_owned(), "fetch_url".to_owned()];
    let mut s = Session::listing(&offered, false);
    let mut listed = s.list();
    let mut server_calls = Vec::new();
    let mut answers = Vec::new();
    for i in 0..15 {
        s.now += 1_000;
        let tool = listed[0].clone();
        let id = s.id();
        let call = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
                          "params": {"name": tool, "arguments": {"q": format!("query {i}")}}});
        let outs = s.proxy.from_client(call, s.now);
        let sent = to_server(&outs);
        assert_eq!(sent.len(), 1, "a listed tool is called: {outs:?}");
        server_calls.push(tool.clone());
        let result = if tool == "web_search" {
            json!({"content": [{"type": "text", "text": "{\"error\": \"search backend down\"}"}]})
        } else {
            json!({"content": [{"type": "text", "text": "{\"text\": \"the page\"}"}]})
        };
        let answer = json!({"jsonrpc": "2.0", "id": sent[0]["id"], "result": result});
        let outs = s.proxy.from_server(answer, s.now, &mut s.rng);
        let client = to_client(&outs);
        assert_eq!(client[0]["id"], json!(id), "answered under the client's id");
        let text = said(&client[0]["result"]);
        answers.push(text);
        if client.len() > 1 {
            assert_eq!(client[1]["method"], "notifications/tools/list_changed");
            listed = s.list();
        }
        if tool == "fetch_url" {
            break;
        }
    }
    assert_eq!(
        server_calls,
        [
            "web_search",
            "web_search",
            "web_search",
            "web_search",
            "web_search",
            "fetch_url"
        ],
        "five failures, then the alternative: {answers:#?}"
    );
    for (n, a) in answers.iter().enumerate().take(2) {
        assert!(
            !a.contains("has failed"),
            "no warning before the 3rd: {n} {a}"
        );
    }
    for (n, a) in answers.iter().enumerate().skip(2).take(2) {
        assert!(
            a.contains(&format!(
                "The tool `web_search` has failed {} times in a row",
                n + 1
            )) && a.contains("`fetch_url`"),
            "warned at {}, naming the alternative: {a}",
            n + 1
        );
    }
    let fifth = &answers[4];
    assert!(
        fifth.contains("disabled") && fifth.contains("`fetch_url`"),
        "hidden at 5, naming the alternative: {fifth}"
    );
    assert_eq!(
        listed,
        ["fetch_url"],
        "web_search is left out of tools/list"
    );
    assert_eq!(s.proxy.paused(), ["web_search"]);
    // A client that calls it anyway is answered by the proxy, told what to use instead.
    let outs = s.proxy.from_client(
        json!({"jsonrpc": "2.0", "id": 99, "method": "tools/call",
               "params": {"name": "web_search", "arguments": {"q": "again"}}}),
        s.now,
    );
    assert!(to_server(&outs).is_empty(), "{outs:?}");
    let refused = said(&to_client(&outs)[0]["result"]);
    assert!(
        refused.contains("paused") && refused.contains("`fetch_url`"),
        "{refused}"
    );
    // The alternative's answer went through, and the run never stopped.
    assert!(
        answers[5].starts_with("{\"text\": \"the page\"}"),
        "{}",
        answers[5]
    );
    assert!(s.proxy.stopped().is_none());
    assert_eq!(s.proxy.finish(s.now).status, RunStatus::Complete);
}
