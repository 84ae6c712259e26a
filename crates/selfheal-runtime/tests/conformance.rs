//! The core's conformance table of the seeds' tool-health rules (`selfheal_core::conformance`)
//! run through the runtime's agent loop: the same rows every front-end runs through its own
//! adapter, here as a scripted model server and in-process tools.
//!
//! The model server answers each request with a call of the tool of the next line not yet
//! played (arguments [`conformance::args`]), and a final answer once the script is played; each
//! tool answers the next line (the line's outcome), so a retry the run asks for is answered by
//! the next line, as on the MCP proxy. What a line's result led to is read from the next
//! request the model got: the monitor's guidance (a system message) and the tools offered. A
//! line after which the model was not asked is a retry's (unseen), or the stop.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::sync::{Arc, Mutex};

use axum::Router;
use axum::extract::State;
use axum::routing::post;
use serde_json::{Value, json};

use selfheal_core::{
    RunStatus,
    conformance::{self, Line, Row, Seen},
};
use selfheal_runtime::{Agent, Effect, FnTool, Tool, ToolError, ToolSpec};

/// The row being played: the next line, and each model request with how many lines were
/// played when it came.
struct Play {
    script: Vec<Line>,
    next: usize,
    asked: Vec<(usize, Value)>,
    /// A tool called out of the script's order.
    mismatch: Option<String>,
}

type Shared = Arc<Mutex<Play>>;

async fn model(State(s): State<Shared>, body: axum::Json<Value>) -> axum::Json<Value> {
    let mut p = s.lock().unwrap();
    let at = p.next;
    p.asked.push((at, body.0));
    axum::Json(match p.script.get(at) {
        Some(line) => json!({"choices": [{"index": 0, "finish_reason": "tool_calls",
            "message": {"role": "assistant", "content": null, "tool_calls": [
                {"id": format!("call_{at}"), "type": "function",
                 "function": {"name": line.tool, "arguments": conformance::args(at).to_string()}}]}}],
            "usage": {"total_tokens": 20}}),
        None => common::answer("done"),
    })
}

/// A read-only tool (a resend is safe, as the core's own adapter offers) that answers the next
/// line of the script.
fn tool(name: &str, s: &Shared) -> Arc<dyn Tool> {
    let s = s.clone();
    let me = name.to_owned();
    FnTool::new(
        ToolSpec::new(
            name,
            "Answers as the conformance table says.",
            json!({"type": "object", "properties": {"q": {"type": "string"}}}),
        )
        .with_effect(Effect::ReadOnly),
        move |_args| {
            let outcome = {
                let mut p = s.lock().unwrap();
                let i = p.next;
                if i >= p.script.len() {
                    // After the script (a read before answering), a tool answers as it last
                    // did: no line is played.
                    return_last(&p.script, &me)
                } else {
                    p.next += 1;
                    match p.script.get(i) {
                        Some(line) if line.tool == me => Some(line.result),
                        other => {
                            let wanted = other.map(|l| l.tool.clone());
                            p.mismatch.get_or_insert(format!(
                                "line {i}: `{me}` called, wanted {wanted:?}"
                            ));
                            None
                        }
                    }
                }
            };
            async move {
                let Some(outcome) = outcome else {
                    return Err(ToolError::failed("called out of the script"));
                };
                match (outcome.value(), outcome.error()) {
                    (_, Some(e)) => Err(ToolError::failed(e)),
                    (Some(v), None) => Ok(v),
                    (None, None) => unreachable!("every outcome answers or raises"),
                }
            }
        },
    )
    .shared()
}

/// What `tool` last answered in the script.
fn return_last(script: &[Line], tool: &str) -> Option<conformance::Outcome> {
    script
        .iter()
        .rev()
        .find(|l| l.tool == tool)
        .map(|l| l.result)
}

/// What the model was shown in `request`: the tools offered and the text after its last turn
/// (the tool result, the guidance).
fn shown(request: &Value, row: &Row) -> Seen {
    let offered: Vec<&str> = request["tools"]
        .as_array()
        .map(|ts| {
            ts.iter()
                .filter_map(|t| t["function"]["name"].as_str())
                .collect()
        })
        .unwrap_or_default();
    let messages = request["messages"].as_array().unwrap();
    let last_turn = messages
        .iter()
        .rposition(|m| m["role"] == "assistant")
        .map_or(0, |i| i + 1);
    let told: String = messages[last_turn..]
        .iter()
        .filter_map(|m| m["content"].as_str())
        .collect::<Vec<_>>()
        .join("\n");
    let guidance: String = messages[last_turn..]
        .iter()
        .filter(|m| m["role"] == "system")
        .filter_map(|m| m["content"].as_str())
        .collect();
    Seen::Going {
        warned: conformance::warned_in(&guidance, &row.offered),
        hidden: row
            .offered
            .iter()
            .filter(|t| !offered.contains(&t.as_str()))
            .cloned()
            .collect(),
        told,
    }
}

async fn play(row: &Row) -> Result<(), String> {
    let s: Shared = Arc::new(Mutex::new(Play {
        script: row.script.clone(),
        next: 0,
        asked: Vec::new(),
        mismatch: None,
    }));
    let app = Router::new()
        .route("/v1/chat/completions", post(model))
        .with_state(s.clone());
    let url = common::serve(app).await;
    let tools = row.offered.iter().map(|t| tool(t, &s)).collect();
    let agent = common::fast(Agent::new(common::client(&url, 5_000), "m", tools));
    let r = agent
        .run(
            vec![json!({"role": "user", "content": "What does the page say?"})],
            7,
        )
        .await;
    let p = s.lock().unwrap();
    if let Some(m) = &p.mismatch {
        return Err(format!(
            "{}: {m} (log {:?}, asked at {:?})",
            row.name,
            r.recovery_log,
            p.asked.iter().map(|a| a.0).collect::<Vec<_>>()
        ));
    }
    let mut seen = Vec::new();
    for i in 0..p.next {
        match p.asked.iter().find(|(at, _)| *at == i + 1) {
            Some((_, request)) => seen.push(shown(request, row)),
            None if i + 1 == p.next && r.status != RunStatus::Complete && r.answer.is_none() => {
                seen.push(Seen::Stopped)
            }
            None => seen.push(Seen::Unseen),
        }
    }
    conformance::judge(row, &seen, r.status)
        .map_err(|e| format!("{e}\n(reason {:?}, log {:?})", r.reason, r.recovery_log))
}

#[tokio::test]
async fn the_seeds_monitor_rules_hold_through_the_runtimes_agent_loop() {
    let rows = conformance::table().unwrap();
    assert!(rows.len() >= 5);
    let mut failed = Vec::new();
    for row in &rows {
        if let Err(e) = play(row).await {
            failed.push(e);
        }
    }
    assert!(failed.is_empty(), "the runtime:\n{}", failed.join("\n"));
}
