//! The async driver over in-memory pipes: a fake MCP server task, a scripted client, and the
//! real timers (a call the server never answers is cancelled and failed, a read-only one retried).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, DuplexStream, Lines, duplex};

use selfheal_mcp::{Decision, McpConfig, Proxy, RunOptions, Stats, run};

const NOT_JSON_FROM_CLIENT: &str = "hello server, this is not JSON {";
const NOT_JSON_FROM_SERVER: &str = "server log: starting up (not JSON either)";
const BATCH: &str = r#"[{"jsonrpc":"2.0","method":"notifications/initialized"}]"#;

/// A stdio MCP server: answers `initialize`, `tools/list` and calls of `echo`; never answers
/// `hang`; leaves the first call of `flaky` unanswered and answers the next. Returns every line
/// it read, once its input is closed.
async fn fake_server(input: DuplexStream, mut output: DuplexStream) -> Vec<String> {
    let mut lines = BufReader::new(input).lines();
    let mut seen = Vec::new();
    let mut flaky_calls = 0;
    while let Some(line) = lines.next_line().await.unwrap() {
        seen.push(line.clone());
        if line == NOT_JSON_FROM_CLIENT {
            output
                .write_all(format!("{NOT_JSON_FROM_SERVER}\n").as_bytes())
                .await
                .unwrap();
            continue;
        }
        let msg: Value = serde_json::from_str(&line).unwrap();
        let result = match msg["method"].as_str() {
            Some("initialize") => Some(json!({
                "protocolVersion": "2025-06-18",
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "fake", "version": "0"}
            })),
            Some("tools/list") => Some(json!({"tools": [
                {"name": "echo", "description": "Echo.",
                 "inputSchema": {"type": "object", "properties": {"text": {"type": "string"}},
                                 "required": ["text"]}},
                {"name": "hang", "description": "Never returns.",
                 "inputSchema": {"type": "object"}},
                {"name": "flaky", "description": "Slow the first time.",
                 "inputSchema": {"type": "object"},
                 "annotations": {"readOnlyHint": true}}
            ]})),
            Some("tools/call") => match msg["params"]["name"].as_str() {
                Some("echo") => Some(json!({
                    "content": [{"type": "text", "text": msg["params"]["arguments"]["text"]}],
                    "isError": false
                })),
                Some("flaky") => {
                    flaky_calls += 1;
                    (flaky_calls > 1).then(|| {
                        json!({"content": [{"type": "text", "text": "flaky ok"}], "isError": false})
                    })
                }
                _ => None,
            },
            _ => None,
        };
        if let Some(result) = result {
            let reply = json!({"jsonrpc": "2.0", "id": msg["id"], "result": result});
            output
                .write_all(format!("{reply}\n").as_bytes())
                .await
                .unwrap();
        }
    }
    seen
}

async fn send(w: &mut DuplexStream, msg: &Value) {
    w.write_all(format!("{msg}\n").as_bytes()).await.unwrap();
}

async fn recv(r: &mut Lines<BufReader<DuplexStream>>) -> Value {
    let line = r
        .next_line()
        .await
        .unwrap()
        .expect("the proxy closed early");
    serde_json::from_str(&line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"))
}

fn call(id: u64, name: &str, args: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
           "params": {"name": name, "arguments": args}})
}

fn config() -> McpConfig {
    let mut c = McpConfig {
        call_timeout_ms: 150,
        ..McpConfig::default()
    };
    c.policy.retry.base_ms = 20;
    c.policy.retry.jitter = 0.0;
    c
}

#[tokio::test]
async fn a_session_through_the_real_driver() {
    let (proxy_client_in, mut client_tx) = duplex(1 << 16);
    let (proxy_client_out, client_rx) = duplex(1 << 16);
    let (proxy_server_out, server_in) = duplex(1 << 16);
    let (proxy_server_in, server_out) = duplex(1 << 16);
    let server = tokio::spawn(fake_server(server_in, server_out));

    let client = async move {
        let mut rx = BufReader::new(client_rx).lines();

        send(
            &mut client_tx,
            &json!({"jsonrpc": "2.0", "id": 0, "method": "initialize",
                    "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                               "clientInfo": {"name": "test", "version": "0"}}}),
        )
        .await;
        let init = recv(&mut rx).await;
        assert_eq!(init["id"], json!(0));
        assert_eq!(
            init["result"]["capabilities"]["tools"],
            json!({"listChanged": true})
        );

        send(
            &mut client_tx,
            &json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}),
        )
        .await;
        let listed = recv(&mut rx).await;
        assert_eq!(listed["id"], json!(1));
        assert_eq!(listed["result"]["tools"].as_array().unwrap().len(), 3);

        // Lines that are not JSON objects pass through verbatim, both ways.
        client_tx
            .write_all(format!("{NOT_JSON_FROM_CLIENT}\n{BATCH}\n").as_bytes())
            .await
            .unwrap();
        let raw = rx.next_line().await.unwrap().unwrap();
        assert_eq!(raw, NOT_JSON_FROM_SERVER);

        // Coerced on the way (a number where the schema wants a string), answered under id 2.
        send(&mut client_tx, &call(2, "echo", json!({"text": 42}))).await;
        let echoed = recv(&mut rx).await;
        assert_eq!(
            echoed,
            json!({"jsonrpc": "2.0", "id": 2,
                   "result": {"content": [{"type": "text", "text": "42"}], "isError": false}})
        );

        // Never answered, no hints: after the call timeout the client gets an isError result.
        let asked = tokio::time::Instant::now();
        send(&mut client_tx, &call(3, "hang", json!({}))).await;
        let hung = recv(&mut rx).await;
        assert!(
            asked.elapsed() >= Duration::from_millis(150),
            "answered before the timeout"
        );
        assert_eq!(hung["id"], json!(3));
        assert_eq!(hung["result"]["isError"], json!(true));
        let text = hung["result"]["content"][0]["text"].as_str().unwrap();
        assert!(text.contains("did not answer within 150 ms"), "{text}");

        // Read-only and unanswered the first time: retried after the backoff, answered once.
        send(&mut client_tx, &call(4, "flaky", json!({}))).await;
        let flaky = recv(&mut rx).await;
        assert_eq!(flaky["id"], json!(4));
        assert_eq!(flaky["result"]["content"][0]["text"], "flaky ok");

        // The client leaves: dropping its side ends the session.
        drop(client_tx);
        // Nothing else was sent to the client, and its side is closed once the proxy returns.
        rx
    };

    let mut decisions: Vec<Decision> = Vec::new();
    let mut on_decision = |d: Decision| decisions.push(d);
    let session = run(
        Proxy::new(config()).unwrap(),
        proxy_client_in,
        proxy_client_out,
        proxy_server_in,
        proxy_server_out,
        RunOptions::new(7),
        &mut on_decision,
    );
    let (stats, mut rx) = tokio::time::timeout(Duration::from_secs(20), async {
        tokio::join!(session, client)
    })
    .await
    .expect("the session did not end");
    let stats = stats.unwrap();
    assert_eq!(
        rx.next_line().await.unwrap(),
        None,
        "nothing after the last answer"
    );

    assert_eq!(
        stats,
        Stats {
            calls: 3,
            failures: 2,
            answered: 0,
            repaired: 1,
            retries: 1,
            breaches: 0,
        }
    );
    // The core's trace events of each failure's decision go to the trace too.
    let core: Vec<(&str, &str)> = decisions
        .iter()
        .filter(|d| d.kind.as_str() == "action")
        .map(|d| {
            (
                d.tool.as_str(),
                d.detail["action"]["action"].as_str().unwrap_or(""),
            )
        })
        .collect();
    // The session's run decides: a timeout of a tool not safe to call twice is re-planned
    // (guidance to try another way) rather than given up on by a per-call plan of the proxy's.
    assert_eq!(core, [("hang", "replan"), ("flaky", "retry")]);
    let decisions: Vec<_> = decisions
        .into_iter()
        .filter(|d| !matches!(d.kind.as_str(), "signal" | "classified" | "action"))
        .collect();
    let kinds: Vec<(&str, &str)> = decisions
        .iter()
        .map(|d| (d.kind.as_str(), d.tool.as_str()))
        .collect();
    assert_eq!(
        kinds,
        [
            ("repair", "echo"),
            ("tool_result", "echo"),
            ("timeout", "hang"),
            ("tool_result", "hang"),
            ("guidance", "hang"),
            ("timeout", "flaky"),
            ("retry", "flaky"),
            ("tool_result", "flaky"),
        ]
    );
    assert_eq!(decisions[2].detail, json!({"after_ms": 150, "attempt": 1}));
    assert_eq!(decisions[3].detail, json!({"ok": false, "attempts": 1}));
    assert_eq!(decisions[7].detail, json!({"ok": true, "attempts": 2}));

    // The proxy closed the server's input when the session ended: the server saw everything.
    let seen = tokio::time::timeout(Duration::from_secs(5), server)
        .await
        .expect("the server's input was not closed")
        .unwrap();
    assert_eq!(seen[2], NOT_JSON_FROM_CLIENT, "verbatim");
    assert_eq!(seen[3], BATCH, "a batch passes verbatim");
    let msgs: Vec<Value> = seen
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != 2)
        .map(|(_, l)| serde_json::from_str(l).unwrap())
        .collect();
    let summary: Vec<(String, String)> = msgs
        .iter()
        .filter(|m| m.is_object())
        .map(|m| {
            let method = m["method"].as_str().unwrap_or("").to_owned();
            let id = if method == "notifications/cancelled" {
                m["params"]["requestId"].to_string()
            } else {
                m["id"].to_string()
            };
            (method, id)
        })
        .collect();
    let expected: Vec<(String, String)> = [
        ("initialize", "0"),
        ("tools/list", "1"),
        ("tools/call", "\"selfheal-1\""),
        ("tools/call", "\"selfheal-2\""),
        ("notifications/cancelled", "\"selfheal-2\""),
        ("tools/call", "\"selfheal-3\""),
        ("notifications/cancelled", "\"selfheal-3\""),
        ("tools/call", "\"selfheal-4\""),
    ]
    .into_iter()
    .map(|(m, i)| (m.to_owned(), i.to_owned()))
    .collect();
    assert_eq!(summary, expected);
    // The coerced argument is what the server got; the retry repeated the request exactly.
    assert_eq!(msgs[3]["params"]["arguments"], json!({"text": "42"}));
    assert_eq!(msgs[6]["params"], msgs[8]["params"]);
}

#[tokio::test]
async fn the_session_ends_when_the_server_closes_its_side() {
    let (proxy_client_in, _client_tx) = duplex(1 << 12);
    let (proxy_client_out, client_rx) = duplex(1 << 12);
    let (proxy_server_out, server_in) = duplex(1 << 12);
    let (proxy_server_in, mut server_out) = duplex(1 << 12);

    let server = async move {
        server_out
            .write_all(b"{\"jsonrpc\":\"2.0\",\"method\":\"notifications/message\",\"params\":{\"level\":\"info\",\"data\":\"bye\"}}\n")
            .await
            .unwrap();
        // The server exits: its output closes.
        drop(server_out);
        server_in
    };
    let mut decisions = 0;
    let mut on_decision = |_d: Decision| decisions += 1;
    let session = run(
        Proxy::new(McpConfig::default()).unwrap(),
        proxy_client_in,
        proxy_client_out,
        proxy_server_in,
        proxy_server_out,
        RunOptions::new(1),
        &mut on_decision,
    );
    let (stats, _server_in) = tokio::time::timeout(Duration::from_secs(10), async {
        tokio::join!(session, server)
    })
    .await
    .expect("the session did not end with the server");
    assert_eq!(stats.unwrap(), Stats::default());
    assert_eq!(decisions, 0);

    // The notification reached the client before the end, and then its side closed.
    let mut rx = BufReader::new(client_rx).lines();
    let line = rx.next_line().await.unwrap().unwrap();
    let msg: Value = serde_json::from_str(&line).unwrap();
    assert_eq!(msg["method"], "notifications/message");
    assert_eq!(msg["params"]["data"], "bye");
    assert_eq!(rx.next_line().await.unwrap(), None);
}

/// Runs the proxy over pipes with a server that does `server(input, output)`; returns what the
/// client read once the session ended, and the decisions.
async fn session_with<F, Fut>(client_lines: &[&[u8]], server: F) -> (Vec<Vec<u8>>, Vec<Decision>)
where
    F: FnOnce(DuplexStream, DuplexStream) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    session_limited(client_lines, RunOptions::new(1), server).await
}

/// [`session_with`] with `options`.
async fn session_limited<F, Fut>(
    client_lines: &[&[u8]],
    options: RunOptions,
    server: F,
) -> (Vec<Vec<u8>>, Vec<Decision>)
where
    F: FnOnce(DuplexStream, DuplexStream) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let (mut client_w, proxy_client_in) = duplex(1 << 16);
    let (proxy_client_out, client_r) = duplex(1 << 16);
    let (proxy_server_out, server_in) = duplex(1 << 16);
    let (server_out, proxy_server_in) = duplex(1 << 16);
    tokio::spawn(server(server_in, server_out));
    for l in client_lines {
        client_w.write_all(l).await.unwrap();
        client_w.write_all(b"\n").await.unwrap();
    }
    let mut decisions = Vec::new();
    let mut on = |d: Decision| decisions.push(d);
    let stats = tokio::time::timeout(
        Duration::from_secs(5),
        run(
            Proxy::new(McpConfig::default()).unwrap(),
            proxy_client_in,
            proxy_client_out,
            proxy_server_in,
            proxy_server_out,
            options,
            &mut on,
        ),
    )
    .await
    .expect("the session must end when the server exits, even with the client's input open");
    stats.unwrap();
    drop(client_w);
    let mut read = Vec::new();
    let mut r = BufReader::new(client_r);
    loop {
        let mut line = Vec::new();
        if r.read_until(b'\n', &mut line).await.unwrap() == 0 {
            break;
        }
        read.push(line.strip_suffix(b"\n").unwrap_or(&line).to_vec());
    }
    (read, decisions)
}

#[tokio::test]
async fn when_the_server_exits_every_waiting_call_gets_an_error_and_the_session_ends() {
    let call = br#"{"jsonrpc":"2.0","id":41,"method":"tools/call","params":{"name":"slow","arguments":{}}}"#;
    let (read, decisions) = session_with(&[call], |input, output| async move {
        // Read the call, then exit without answering (closing both pipes).
        let _output = output;
        let mut lines = BufReader::new(input).lines();
        lines.next_line().await.unwrap();
    })
    .await;
    assert_eq!(read.len(), 1, "{read:?}");
    let answer: Value = serde_json::from_slice(&read[0]).unwrap();
    assert_eq!(answer["id"], json!(41));
    assert!(
        answer["error"]["message"]
            .as_str()
            .unwrap()
            .contains("exited")
    );
    assert!(decisions.iter().any(|d| d.kind.as_str() == "server_closed"));
}

#[tokio::test]
async fn unchanged_messages_and_non_utf8_lines_pass_byte_for_byte() {
    // Key order, spacing and an integer past u64 would not survive a parse and re-encode.
    let from_client: &[u8] =
        br#"{"method":"resources/read", "jsonrpc":"2.0","id":7,"params":{"uri":"file:///a","n":123456789012345678901234}}"#;
    let from_server: &[u8] = br#"{"result":{"contents":[]},   "id":7,"jsonrpc":"2.0","n":1.50e3}"#;
    let latin1: &[u8] = b"log: caf\xe9";
    let server_saw = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let saw = server_saw.clone();
    let (read, _) = session_with(
        &[from_client, latin1],
        move |input, mut output| async move {
            let mut r = BufReader::new(input);
            for _ in 0..2 {
                let mut line = Vec::new();
                r.read_until(b'\n', &mut line).await.unwrap();
                saw.lock().unwrap().push(line);
            }
            output.write_all(from_server).await.unwrap();
            output.write_all(b"\n").await.unwrap();
            output.write_all(latin1).await.unwrap();
            output.write_all(b"\n").await.unwrap();
        },
    )
    .await;
    let saw = server_saw.lock().unwrap().clone();
    assert_eq!(saw[0], [from_client, b"\n"].concat());
    assert_eq!(saw[1], [latin1, b"\n"].concat());
    assert_eq!(read, [from_server.to_vec(), latin1.to_vec()]);
}

/// Issue 29: a call is forwarded under the proxy's own id, but its arguments, valid for the
/// tool and so passed on unchanged, reach the server as the client wrote them: member order,
/// spacing, `1.50` and an integer past 64 bits.
#[tokio::test]
async fn issue29_a_forwarded_call_keeps_its_arguments_byte_for_byte() {
    let args = r#"{"z": 1.50,  "a": 123456789012345678901234, "s": "x"}"#;
    let call = format!(
        r#"{{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{{"name":"echo","arguments":{args}}}}}"#
    );
    let server_saw = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let saw = server_saw.clone();
    let (read, _) = session_with(&[call.as_bytes()], move |input, mut output| async move {
        let mut r = BufReader::new(input);
        let mut line = Vec::new();
        r.read_until(b'\n', &mut line).await.unwrap();
        let msg: Value = serde_json::from_slice(&line).unwrap();
        saw.lock().unwrap().push(line);
        let answer = json!({"jsonrpc": "2.0", "id": msg["id"], "result": {"content": [{"type": "text", "text": "ok"}]}});
        output.write_all(answer.to_string().as_bytes()).await.unwrap();
        output.write_all(b"\n").await.unwrap();
    })
    .await;
    let saw = server_saw.lock().unwrap().clone();
    let line = String::from_utf8(saw[0].clone()).unwrap();
    assert!(line.contains(&format!(r#""arguments":{args}"#)), "{line}");
    let sent: Value = serde_json::from_str(&line).unwrap();
    assert_ne!(sent["id"], json!(3), "the proxy's own id");
    assert_eq!(sent["params"]["name"], "echo");
    let answer: Value = serde_json::from_slice(&read[0]).unwrap();
    assert_eq!(answer["id"], json!(3));
}

/// Issue 13: lines are bounded. A message longer than `max_line_bytes` is never forwarded, in
/// part or whole: its sender gets a JSON-RPC error (with its id when the first bytes give it),
/// a response the other side waits for becomes an error response, and the session goes on.
#[tokio::test]
async fn issue13_an_over_long_line_is_refused_with_a_json_rpc_error_and_the_session_goes_on() {
    let limit = 1000;
    let big = "x".repeat(5000);
    let long_call = format!(
        r#"{{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{{"name":"echo","arguments":{{"text":"{big}"}}}}}}"#
    );
    let call = br#"{"jsonrpc":"2.0","id":6,"method":"tools/call","params":{"name":"echo","arguments":{}}}"#;
    let call2 = br#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"echo","arguments":{}}}"#;
    let server_saw = std::sync::Arc::new(std::sync::Mutex::new(Vec::<Value>::new()));
    let saw = server_saw.clone();
    let options = RunOptions {
        seed: 1,
        max_line_bytes: limit,
    };
    let (read, decisions) = session_limited(
        &[long_call.as_bytes(), call, call2],
        options,
        move |input, mut output| async move {
            let mut lines = BufReader::new(input).lines();
            // A notification too long to pass: the server is told, with `id: null`.
            let note = format!(r#"{{"jsonrpc":"2.0","method":"notifications/message","params":{{"data":"{big}"}}}}"#);
            output.write_all(note.as_bytes()).await.unwrap();
            output.write_all(b"\n").await.unwrap();
            // The calls that reach the server (6, then 7; the first answer is too long) and the
            // refusal of the notification, in whatever order they come.
            let mut answers = [big.as_str(), "short"].into_iter();
            for _ in 0..3 {
                let line = lines.next_line().await.unwrap().unwrap();
                let msg: Value = serde_json::from_str(&line).unwrap();
                saw.lock().unwrap().push(msg.clone());
                if msg.get("method").is_none() {
                    continue;
                }
                let text = answers.next().unwrap();
                let answer = json!({"jsonrpc": "2.0", "id": msg["id"],
                    "result": {"content": [{"type": "text", "text": text}]}});
                output.write_all(answer.to_string().as_bytes()).await.unwrap();
                output.write_all(b"\n").await.unwrap();
            }
        },
    )
    .await;
    let read: Vec<Value> = read
        .iter()
        .map(|l| serde_json::from_slice(l).unwrap())
        .collect();
    let by_id = |id: u64| {
        read.iter()
            .filter(|m| m["id"] == json!(id))
            .collect::<Vec<_>>()
    };
    // The long call never reached the server; its sender got the error.
    let refused = by_id(5);
    assert_eq!(refused.len(), 1, "{read:?}");
    assert_eq!(refused[0]["error"]["code"], json!(-32600));
    let message = refused[0]["error"]["message"].as_str().unwrap();
    assert!(message.contains("limit is 1000 bytes"), "{message}");
    // The long answer to 6 became an error answer to 6, exactly one.
    let six = by_id(6);
    assert_eq!(six.len(), 1, "{read:?}");
    assert_eq!(six[0]["error"]["code"], json!(-32600));
    // And the session went on: 7 was answered in full.
    let seven = by_id(7);
    assert_eq!(seven.len(), 1, "{read:?}");
    assert_eq!(seven[0]["result"]["content"][0]["text"], "short");
    // Nothing longer than the limit was written to the client.
    assert!(read.iter().all(|m| m.to_string().len() <= limit));

    let saw = server_saw.lock().unwrap().clone();
    assert_eq!(saw.len(), 3, "{saw:?}");
    assert!(saw.iter().all(|m| m.to_string().len() <= limit));
    let calls = saw.iter().filter(|m| m["method"] == "tools/call").count();
    assert_eq!(calls, 2, "the long call never reached the server: {saw:?}");
    let told: Vec<_> = saw.iter().filter(|m| m.get("error").is_some()).collect();
    assert_eq!(told.len(), 1, "{saw:?}");
    assert_eq!(told[0]["id"], Value::Null);
    assert_eq!(told[0]["error"]["code"], json!(-32600));
    let refusals = decisions
        .iter()
        .filter(|d| d.kind.as_str() == "line_too_long")
        .count();
    assert_eq!(refusals, 3, "{decisions:?}");
}
