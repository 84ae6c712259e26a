//! A minimal OpenAI-compatible upstream for the load benchmark (`scripts/bench-gateway.sh`):
//! answers every chat completion at once with the same valid tool call, so what is measured is
//! the gateway, not a model.
//!
//! `cargo run --release -p selfheal-gateway --example stub_upstream -- 127.0.0.1:0`

use axum::Router;
use axum::http::header;
use axum::routing::{get, post};

const ANSWER: &str = r#"{"id":"chatcmpl-bench","object":"chat.completion","created":0,"model":"stub","choices":[{"index":0,"message":{"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function","function":{"name":"search","arguments":"{\"query\":\"rust\",\"limit\":3}"}}]},"finish_reason":"tool_calls"}],"usage":{"prompt_tokens":100,"completion_tokens":10,"total_tokens":110}}"#;

#[tokio::main(flavor = "current_thread")]
async fn main() -> std::io::Result<()> {
    let addr = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:0".into());
    let app = Router::new()
        .route(
            "/v1/chat/completions",
            post(|_body: axum::body::Bytes| async {
                ([(header::CONTENT_TYPE, "application/json")], ANSWER)
            }),
        )
        .route(
            "/v1/models",
            get(|| async { r#"{"object":"list","data":[]}"# }),
        );
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    println!("listening on http://{}", listener.local_addr()?);
    use axum::serve::ListenerExt;
    let listener = listener.tap_io(|t| {
        let _ = t.set_nodelay(true);
    });
    axum::serve(listener, app).await
}
