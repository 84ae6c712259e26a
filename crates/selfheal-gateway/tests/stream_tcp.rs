//! Stream behaviour over TCP: the real server (`serve` on port 0) and a real client (reqwest),
//! in front of an upstream that answers canned bytes. In-process tests read the body stream
//! directly and cannot see what hyper does on a socket — a final frame dropped when the body
//! errors — so these read what a client reads.

// Test helpers outside `#[test]` functions may panic: a panic is a test failure here.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use tokio::io::AsyncWriteExt;

use selfheal_gateway::GatewayConfig;

mod common;

/// An upstream that answers each request with the next canned response, then closes.
async fn canned_upstream(responses: Vec<String>) -> (String, Arc<Mutex<Vec<String>>>) {
    paced_upstream(responses.into_iter().map(|r| vec![(0, r)]).collect()).await
}

/// An upstream that answers each request with the next response, written in parts, each after
/// its pause in milliseconds.
async fn paced_upstream(responses: Vec<Vec<(u64, String)>>) -> (String, Arc<Mutex<Vec<String>>>) {
    let queue = Arc::new(Mutex::new(VecDeque::from(responses)));
    let seen = Arc::new(Mutex::new(Vec::new()));
    let seen2 = seen.clone();
    let url = common::tcp_upstream(move |mut tcp, body| {
        let (queue, seen) = (queue.clone(), seen2.clone());
        async move {
            seen.lock()
                .unwrap()
                .push(String::from_utf8_lossy(&body).into_owned());
            let resp = queue.lock().unwrap().pop_front().unwrap_or_default();
            for (pause, part) in resp {
                tokio::time::sleep(std::time::Duration::from_millis(pause)).await;
                if tcp.write_all(part.as_bytes()).await.is_err() {
                    return;
                }
            }
            let _ = tcp.shutdown().await;
        }
    })
    .await;
    (url, seen)
}

fn sse(events: &[&str]) -> String {
    let body: String = events.iter().map(|e| format!("data: {e}\n\n")).collect();
    format!("HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n{body}")
}

fn json_answer(body: &str) -> String {
    format!(
        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
}

async fn start_gateway(upstream: String) -> String {
    start_gateway_with(GatewayConfig::for_upstream(upstream)).await
}

async fn start_gateway_with(config: GatewayConfig) -> String {
    format!("{}/chat/completions", common::gateway(config).await)
}

/// POSTs a streaming request and reads the whole body as a client does: an `Err` here is a
/// connection the server broke.
async fn stream_body(url: &str) -> Result<String, reqwest::Error> {
    stream_request(
        url,
        serde_json::json!({"model": "m", "stream": true,
            "messages": [{"role": "user", "content": "hi"}]}),
    )
    .await
}

async fn stream_request(url: &str, body: serde_json::Value) -> Result<String, reqwest::Error> {
    let resp = reqwest::Client::new()
        .post(url)
        .header("authorization", "Bearer sk-test-client-key")
        .json(&body)
        .send()
        .await?;
    assert_eq!(resp.status(), 200);
    resp.text().await
}

fn data_events(body: &str) -> Vec<&str> {
    body.split("\n\n")
        .filter_map(|e| e.strip_prefix("data: "))
        .collect()
}

/// Issue 13: the error event went out and an `Err` right after it; hyper aborted the
/// connection without flushing the event, so SDKs saw a connection error.
#[tokio::test]
async fn issue_13_the_error_event_arrives_before_a_clean_close() {
    let (up, _) = canned_upstream(vec![sse(&[
        r#"{"id":"c","choices":[{"index":0,"delta":{"role":"assistant","content":"Half an "},"finish_reason":null}]}"#,
        r#"{"error":{"message":"overloaded","type":"server_error"}}"#,
    ])])
    .await;
    let url = start_gateway(up).await;
    let body = stream_body(&url)
        .await
        .expect("the body ends cleanly, not with a broken connection");
    let events = data_events(&body);
    assert!(events[0].contains("Half an "), "{body}");
    let last: serde_json::Value = serde_json::from_str(events.last().unwrap()).unwrap();
    assert_eq!(last["error"]["code"], "stream_broken");
    assert!(
        last["error"]["message"]
            .as_str()
            .unwrap()
            .contains("overloaded")
    );
}

/// Issue 13: `choices` sent as an object made the relay panic on `IndexMut`; then it went to
/// the client as it came, a stream the client cannot read reported `complete`. Now it is a
/// broken stream: nothing but it went out, so the request is re-issued and the client gets
/// the second answer whole; the odd chunk's text never reaches it.
#[tokio::test]
async fn issue_13_choices_as_an_object_is_a_broken_stream_reissued() {
    let (up, seen) = canned_upstream(vec![
        sse(&[
            r#"{"id":"c","choices":{"0":{"delta":{"content":"odd"},"finish_reason":"stop"}}}"#,
            "[DONE]",
        ]),
        json_answer(
            r#"{"id":"j","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"whole"},"finish_reason":"stop"}]}"#,
        ),
    ])
    .await;
    let url = start_gateway(up).await;
    let body = stream_body(&url).await.unwrap();
    let events = data_events(&body);
    assert_eq!(events.last(), Some(&"[DONE]"), "{body}");
    assert!(!body.contains("odd"), "{body}");
    assert!(body.contains("\"whole\""), "{body}");
    assert!(body.contains("\"reissue\""), "{body}");
    assert_eq!(seen.lock().unwrap().len(), 2);
}

/// An answer that ends with nothing but the role sent (no content, no call) is empty, as a
/// whole answer with no content is: re-issued, not relayed as a complete empty answer.
#[tokio::test]
async fn an_empty_streamed_answer_is_reissued() {
    let (up, seen) = canned_upstream(vec![
        sse(&[
            r#"{"id":"c","choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}"#,
            r#"{"id":"c","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}"#,
            "[DONE]",
        ]),
        json_answer(
            r#"{"id":"j","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"second"},"finish_reason":"stop"}]}"#,
        ),
    ])
    .await;
    let url = start_gateway(up).await;
    let body = stream_body(&url).await.unwrap();
    assert!(body.contains("\"second\""), "{body}");
    assert!(body.contains("\"reissue\""), "{body}");
    assert_eq!(seen.lock().unwrap().len(), 2);
}

#[tokio::test]
async fn a_json_answer_to_a_stream_request_is_sent_as_sse() {
    let (up, _) = canned_upstream(vec![json_answer(
        r#"{"id":"j","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"as json"},"finish_reason":"stop"}]}"#,
    )])
    .await;
    let url = start_gateway(up).await;
    let body = stream_body(&url).await.unwrap();
    let events = data_events(&body);
    assert!(events[0].contains("as json"), "{body}");
    assert!(
        events
            .iter()
            .any(|e| e.contains("\"finish_reason\":\"stop\""))
    );
    assert_eq!(events.last(), Some(&"[DONE]"));
}

/// An empty 200 stream (llama-cpp-python with automatic tool choice) is re-issued without
/// streaming and the answer re-emitted as SSE: never an empty 200.
#[tokio::test]
async fn an_empty_stream_is_reissued_and_re_emitted() {
    let (up, seen) = canned_upstream(vec![
        sse(&[]),
        json_answer(
            r#"{"id":"j","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"second try"},"finish_reason":"stop"}]}"#,
        ),
    ])
    .await;
    let url = start_gateway(up).await;
    let body = stream_body(&url).await.unwrap();
    let events = data_events(&body);
    assert!(events[0].contains("second try"), "{body}");
    let last: serde_json::Value = serde_json::from_str(events[events.len() - 2]).unwrap();
    assert_eq!(last["choices"][0]["finish_reason"], "stop");
    assert!(
        last["selfheal"]["actions"]
            .as_array()
            .unwrap()
            .contains(&serde_json::json!("reissue")),
        "the client can read that the stream was healed: {last}"
    );
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 2);
    assert!(seen[1].contains("\"stream\":false"), "{}", seen[1]);
}

fn chunk(text: &str) -> String {
    format!(
        "data: {}\n\n",
        serde_json::json!({"id": "c", "choices": [{"index": 0, "delta": {"content": text},
                           "finish_reason": null}]})
    )
}

/// Issue 13: `timeout_ms` was a total deadline that cut healthy streams longer than it. The
/// first byte comes at once and a piece every 100 ms for 1.2 s: longer than the first-byte
/// timeout (300 ms), each gap far inside the idle timeout (5 s). The stream arrives whole.
#[tokio::test]
async fn issue_13_a_healthy_stream_longer_than_the_first_byte_timeout_is_not_cut() {
    let head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n";
    let mut parts = vec![(0, head.to_string())];
    for i in 0..12 {
        parts.push((100, chunk(&format!("w{i} "))));
    }
    parts.push((
        0,
        "data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n"
            .to_string(),
    ));
    let (up, _) = paced_upstream(vec![parts]).await;
    let mut config = GatewayConfig::for_upstream(up);
    if let Some(u) = config.upstreams.get_mut("default") {
        u.first_byte_timeout_ms = 300;
        u.idle_timeout_ms = 5_000;
    }
    let url = start_gateway_with(config).await;
    let body = stream_body(&url).await.unwrap();
    assert!(body.contains("w11 "), "{body}");
    assert_eq!(data_events(&body).last(), Some(&"[DONE]"));
}

/// A stream that stalls after content went out ends in an error event that names the stall.
#[tokio::test]
async fn a_stream_stalled_past_the_idle_timeout_ends_in_an_error_event() {
    let head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n";
    let parts = vec![
        (0, head.to_string()),
        (0, chunk("started ")),
        (30_000, chunk("never")),
    ];
    let (up, _) = paced_upstream(vec![parts]).await;
    let mut config = GatewayConfig::for_upstream(up);
    if let Some(u) = config.upstreams.get_mut("default") {
        u.idle_timeout_ms = 200;
    }
    let url = start_gateway_with(config).await;
    let body = stream_body(&url).await.unwrap();
    let events = data_events(&body);
    assert!(events[0].contains("started "));
    assert!(!body.contains("never"));
    let last: serde_json::Value = serde_json::from_str(events.last().unwrap()).unwrap();
    assert!(
        last["error"]["message"]
            .as_str()
            .unwrap()
            .contains("idle timeout"),
        "{last}"
    );
}

/// A target that answered streaming requests with tools by an empty stream (each healed by a
/// non-streaming re-issue) three times is asked without streaming from then on; the client
/// still gets SSE. Issue 30: one such fault was enough and switched every tenant for good; the
/// second and third requests here still stream.
#[tokio::test]
async fn a_target_that_cannot_stream_tool_calls_is_asked_without_streaming_next_time() {
    let answer = |text: &str| {
        json_answer(&format!(
            r#"{{"id":"j","object":"chat.completion","created":1,"model":"m","choices":[{{"index":0,"message":{{"role":"assistant","content":"{text}"}},"finish_reason":"stop"}}]}}"#
        ))
    };
    let (up, seen) = canned_upstream(vec![
        sse(&[]),
        answer("a1"),
        sse(&[]),
        answer("a2"),
        sse(&[]),
        answer("a3"),
        answer("learned"),
    ])
    .await;
    let url = start_gateway(up).await;
    let body = |n: u32| {
        serde_json::json!({"model": "m", "stream": true, "stream_options": {"include_usage": true},
            "messages": [{"role": "user", "content": format!("q{n}")}],
            "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]})
    };
    for n in 1..=3 {
        let out = stream_request(&url, body(n)).await.unwrap();
        assert!(out.contains(&format!("a{n}")), "{out}");
    }
    let last = stream_request(&url, body(4)).await.unwrap();
    assert!(last.contains("learned"), "{last}");
    assert_eq!(data_events(&last).last(), Some(&"[DONE]"));
    let seen = seen.lock().unwrap();
    let streamed: Vec<bool> = seen.iter().map(|b| b.contains("\"stream\":true")).collect();
    assert_eq!(
        streamed,
        vec![true, false, true, false, true, false, false],
        "{seen:?}"
    );
    assert!(!seen[6].contains("stream_options"));
}

/// The idle timeout is a gap *inside* a body: a slow non-streaming answer whose head comes
/// after longer than the idle timeout (but within the first-byte timeout) is not cut or
/// retried. (reqwest's own `read_timeout` also runs while the head is awaited.)
#[tokio::test]
async fn issue_13_a_slow_answer_head_is_bounded_by_the_first_byte_timeout_not_the_idle_one() {
    let body = r#"{"id":"j","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"slow but fine"},"finish_reason":"stop"}]}"#;
    let (up, seen) = paced_upstream(vec![vec![(600, json_answer(body))]]).await;
    let mut config = GatewayConfig::for_upstream(up);
    if let Some(u) = config.upstreams.get_mut("default") {
        u.first_byte_timeout_ms = 10_000;
        u.idle_timeout_ms = 100;
    }
    let url = start_gateway_with(config).await;
    let resp: serde_json::Value = reqwest::Client::new()
        .post(&url)
        .json(&serde_json::json!({"model": "m",
            "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        resp["choices"][0]["message"]["content"], "slow but fine",
        "{resp}"
    );
    assert_eq!(seen.lock().unwrap().len(), 1, "no retry");
}

/// A last event without its blank line (some servers end the body right after it) still
/// counts: the answer finishes cleanly.
#[tokio::test]
async fn a_last_event_without_its_blank_line_still_counts() {
    let head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n";
    let body = format!(
        "{head}{}data: {{\"id\":\"c\",\"choices\":[{{\"index\":0,\"delta\":{{}},\"finish_reason\":\"stop\"}}]}}\n",
        chunk("all here")
    );
    let (up, _) = canned_upstream(vec![body]).await;
    let url = start_gateway(up).await;
    let body = stream_body(&url).await.unwrap();
    assert!(body.contains("all here"), "{body}");
    assert_eq!(data_events(&body).last(), Some(&"[DONE]"), "{body}");
    assert!(!body.contains("stream_broken"));
}

/// Issue 11: a streaming answer whose tool calls cannot be used is re-asked along the policy's
/// ladder, and its escalation rung sends the re-ask to the chain's fallback model — as the
/// non-streaming re-ask does — instead of passing over it.
#[tokio::test]
async fn issue_11_a_streaming_reask_escalates_to_the_fallback_model() {
    use selfheal_gateway::{ModelRoute, Target};
    let unknown_chunk = r#"{"id":"s","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":null,"tool_calls":[{"index":0,"id":"c1","type":"function","function":{"name":"nope","arguments":"{}"}}]},"finish_reason":null}]}"#;
    let end_chunk = r#"{"id":"s","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}"#;
    let unknown = json_answer(
        r#"{"id":"j","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":null,"tool_calls":[{"id":"c2","type":"function","function":{"name":"nope","arguments":"{}"}}]},"finish_reason":"tool_calls"}]}"#,
    );
    let good = json_answer(
        r#"{"id":"j","object":"chat.completion","created":1,"model":"fb","choices":[{"index":0,"message":{"role":"assistant","content":"from the fallback"},"finish_reason":"stop"}]}"#,
    );
    let (up, seen) = canned_upstream(vec![
        sse(&[unknown_chunk, end_chunk, "[DONE]"]),
        unknown.clone(),
        unknown,
        good,
    ])
    .await;
    let mut config = GatewayConfig::for_upstream(up);
    let target = |model: &str| Target {
        upstream: "default".into(),
        model: model.into(),
    };
    config.models.insert(
        "m".into(),
        ModelRoute {
            chain: vec![target("m"), target("fb")],
        },
    );
    let url = start_gateway_with(config).await;
    let body = stream_request(
        &url,
        serde_json::json!({"model": "m", "stream": true,
            "messages": [{"role": "user", "content": "go"}],
            "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]}),
    )
    .await
    .unwrap();
    assert!(body.contains("from the fallback"), "{body}");
    let seen = seen.lock().unwrap();
    let models: Vec<bool> = seen
        .iter()
        .map(|b| b.contains("\"model\":\"fb\""))
        .collect();
    assert_eq!(models, vec![false, false, false, true], "{seen:?}");
}

/// A streamed call of a `grounded` tool whose argument appears nowhere in the conversation is
/// never sent to the client: it is held like any unusable call and re-asked, and only the
/// grounded call of the re-ask goes out (the first streamed answer is checked, not only the
/// re-asks).
#[tokio::test]
async fn a_streamed_ungrounded_call_of_a_grounded_tool_is_reasked_never_sent() {
    let call_chunk = r#"{"id":"s","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":null,"tool_calls":[{"index":0,"id":"c1","type":"function","function":{"name":"search","arguments":"{\"query\": \"invented\"}"}}]},"finish_reason":null}]}"#;
    let end_chunk = r#"{"id":"s","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}"#;
    let grounded = json_answer(
        r#"{"id":"j","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":null,"tool_calls":[{"id":"c2","type":"function","function":{"name":"search","arguments":"{\"query\": \"rust\"}"}}]},"finish_reason":"tool_calls"}]}"#,
    );
    let (up, seen) = canned_upstream(vec![sse(&[call_chunk, end_chunk, "[DONE]"]), grounded]).await;
    let mut config = GatewayConfig::for_upstream(up);
    config
        .tools
        .insert("search".into(), toml::from_str("grounded = true").unwrap());
    let url = start_gateway_with(config).await;
    let body = stream_request(
        &url,
        serde_json::json!({"model": "m", "stream": true,
            "messages": [{"role": "user", "content": "search for rust"}],
            "tools": [{"type": "function", "function": {"name": "search", "parameters": {
                "type": "object", "properties": {"query": {"type": "string"}}}}}]}),
    )
    .await
    .unwrap();
    assert!(
        !body.contains("invented"),
        "the ungrounded call went out: {body}"
    );
    assert!(body.contains(r#"\"query\": \"rust\""#), "{body}");
    assert_eq!(seen.lock().unwrap().len(), 2, "asked again once");
}

/// Issue 11: a streamed call that repeats the model's previous, answered call (same tool, same
/// arguments) is held, re-asked along the core's ladder and never sent, as on the non-streamed
/// path.
#[tokio::test]
async fn issue_11_a_streamed_repetition_is_reasked_never_sent() {
    let call_chunk = r#"{"id":"s","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":null,"tool_calls":[{"index":0,"id":"c2","type":"function","function":{"name":"search","arguments":"{\"query\": \"rust\"}"}}]},"finish_reason":null}]}"#;
    let end_chunk = r#"{"id":"s","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}"#;
    let next = search_answer("c3", "rust books");
    let (up, seen) = canned_upstream(vec![sse(&[call_chunk, end_chunk, "[DONE]"]), next]).await;
    let url = start_gateway(up).await;
    let body = stream_request(
        &url,
        serde_json::json!({"model": "m", "stream": true, "messages": searched(),
            "tools": search_tool()}),
    )
    .await
    .unwrap();
    assert_repetition_reasked(&body, &seen.lock().unwrap());
}

/// The repeated call (`c2`) never reached the client, the next answer (`rust books`) did, and
/// the upstream was asked again once, told why.
fn assert_repetition_reasked(body: &str, seen: &[String]) {
    assert!(
        !body.contains(r#"\"c2\""#),
        "the repeated call went out: {body}"
    );
    assert!(body.contains("rust books"), "{body}");
    assert_eq!(seen.len(), 2, "asked again once");
    assert!(
        seen[1].contains("You already called `search` with these exact arguments"),
        "{}",
        seen[1]
    );
}

/// A chat request's conversation: the user's task, a call of `search` for "rust" and its
/// result.
fn searched() -> serde_json::Value {
    serde_json::json!([
        {"role": "user", "content": "search for rust, then for rust books"},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "c1",
            "type": "function", "function": {"name": "search",
            "arguments": "{\"query\":\"rust\"}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "{\"hits\": 3}"}])
}

/// The chat tools of these tests: `search`.
fn search_tool() -> serde_json::Value {
    serde_json::json!([{"type": "function", "function": {"name": "search", "parameters": {
        "type": "object", "properties": {"query": {"type": "string"}}}}}])
}

/// A chat completion calling `search` with `query`, as the upstream's JSON answer.
fn search_answer(id: &str, query: &str) -> String {
    json_answer(&format!(
        r#"{{"id":"j","object":"chat.completion","created":1,"model":"m","choices":[{{"index":0,"message":{{"role":"assistant","content":null,"tool_calls":[{{"id":"{id}","type":"function","function":{{"name":"search","arguments":"{{\"query\": \"{query}\"}}"}}}}]}},"finish_reason":"tool_calls"}}]}}"#
    ))
}

/// Issue 11: a plain-JSON answer to a streaming chat request (the relay's convert path) is
/// checked as a streamed one is: a call repeating the model's previous, answered call is
/// re-asked with why, never sent.
#[tokio::test]
async fn issue_11_a_converted_repetition_is_reasked_never_sent() {
    let (up, seen) = canned_upstream(vec![
        search_answer("c2", "rust"),
        search_answer("c3", "rust books"),
    ])
    .await;
    let url = start_gateway(up).await;
    let body = stream_request(
        &url,
        serde_json::json!({"model": "m", "stream": true, "messages": searched(),
            "tools": search_tool()}),
    )
    .await
    .unwrap();
    assert_repetition_reasked(&body, &seen.lock().unwrap());
}

/// A plain-JSON answer to a streaming chat request calling a `grounded` tool with an argument
/// found nowhere in the conversation is re-asked with why, never sent (the convert path runs
/// the grounding check too).
#[tokio::test]
async fn a_converted_ungrounded_call_of_a_grounded_tool_is_reasked_never_sent() {
    let (up, seen) = canned_upstream(vec![
        search_answer("c1", "invented"),
        search_answer("c2", "rust"),
    ])
    .await;
    let mut config = GatewayConfig::for_upstream(up);
    config
        .tools
        .insert("search".into(), toml::from_str("grounded = true").unwrap());
    let url = start_gateway_with(config).await;
    let body = stream_request(
        &url,
        serde_json::json!({"model": "m", "stream": true,
            "messages": [{"role": "user", "content": "search for rust"}],
            "tools": search_tool()}),
    )
    .await
    .unwrap();
    assert!(
        !body.contains("invented"),
        "the ungrounded call went out: {body}"
    );
    assert!(body.contains(r#"\"query\": \"rust\""#), "{body}");
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 2, "asked again once");
    assert!(seen[1].contains("appear in neither"), "{}", seen[1]);
}

/// A Responses request's input: the user's task, a call of `search` for "rust" and its result;
/// with the Responses shape of [`search_tool`].
fn searched_responses() -> serde_json::Value {
    serde_json::json!({"model": "m", "stream": true,
        "input": [
            {"role": "user", "content": "search for rust, then for rust books"},
            {"type": "function_call", "id": "fc_1", "call_id": "c1", "name": "search",
             "arguments": "{\"query\":\"rust\"}"},
            {"type": "function_call_output", "call_id": "c1", "output": "{\"hits\": 3}"}],
        "tools": [{"type": "function", "name": "search", "parameters": {
            "type": "object", "properties": {"query": {"type": "string"}}}}]})
}

/// A Responses object calling `search` with `query` (call id `id`).
fn search_response(id: &str, query: &str) -> serde_json::Value {
    serde_json::json!({"id": "resp_1", "object": "response", "created_at": 1, "model": "m",
        "status": "completed", "output": [{"type": "function_call", "id": format!("fc_{id}"),
        "call_id": id, "name": "search", "arguments": format!("{{\"query\": \"{query}\"}}"),
        "status": "completed"}]})
}

/// Issue 11: on a streamed `/v1/responses` answer, a `function_call` item that repeats the
/// model's previous, answered call is held, re-asked along the core's ladder and never sent —
/// whether the upstream streams it or answers the streaming request with plain JSON.
#[tokio::test]
async fn issue_11_a_streamed_responses_repetition_is_reasked_never_sent() {
    let repeated = search_response("c2", "rust");
    let item = &repeated["output"][0];
    let mut added = item.clone();
    added["arguments"] = serde_json::json!("");
    added["status"] = serde_json::json!("in_progress");
    let events = [
        serde_json::json!({"type": "response.created",
            "response": {"id": "resp_1", "status": "in_progress", "output": []}}),
        serde_json::json!({"type": "response.output_item.added", "output_index": 0,
            "item": added}),
        serde_json::json!({"type": "response.function_call_arguments.delta", "output_index": 0,
            "delta": item["arguments"]}),
        serde_json::json!({"type": "response.output_item.done", "output_index": 0,
            "item": item}),
        serde_json::json!({"type": "response.completed", "response": repeated}),
    ]
    .map(|e| e.to_string());
    let events: Vec<&str> = events.iter().map(String::as_str).collect();
    let next = search_response("c3", "rust books").to_string();
    for (how, first) in [
        ("streamed", sse(&events)),
        ("as plain JSON", json_answer(&repeated.to_string())),
    ] {
        let (up, seen) = canned_upstream(vec![first, json_answer(&next)]).await;
        let url = start_gateway(up)
            .await
            .replace("chat/completions", "responses");
        let body = stream_request(&url, searched_responses()).await.unwrap();
        assert!(
            !body.contains(r#""call_id":"c2""#),
            "{how}: the repeated call went out: {body}"
        );
        assert!(body.contains("rust books"), "{how}: {body}");
        let seen = seen.lock().unwrap();
        assert_eq!(seen.len(), 2, "{how}: asked again once");
        assert!(
            seen[1].contains("You already called `search` with these exact arguments"),
            "{how}: {}",
            seen[1]
        );
    }
}
