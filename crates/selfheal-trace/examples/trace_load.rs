//! Writes the realistic gateway pattern's trace into a fresh database and reports the writer's
//! throughput: REQUESTS requests (default 20,000) at RATE per second (default 3,000), each three events (`request`, `tool_result`,
//! `response`) of one of 256 conversations in flight, 20 requests each, then a new one. Run it
//! under `valgrind --tool=callgrind` to count the writer's instructions per request whatever
//! else the machine is doing.
//!
//! ```text
//! cargo run --release -p selfheal-trace --example trace_load -- /tmp/t.db 20000 3000
//! ```

use std::time::Instant;

use selfheal_trace::{Kind, RunSummary, TraceEvent, TraceWriter};
use serde_json::json;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let path = std::path::PathBuf::from(
        args.next()
            .ok_or("usage: trace_load DB [REQUESTS [RATE]]")?,
    );
    let requests: u64 = args.next().map_or(Ok(20_000), |s| s.parse())?;
    let rate: f64 = args.next().map_or(Ok(3_000.0), |s| s.parse())?;
    let _ = std::fs::remove_file(&path);
    let writer = TraceWriter::open(&path)?;
    let started = Instant::now();
    let (conversations, turns) = (256u64, 20u64);
    let mut slots = vec![(0u64, turns); conversations as usize];
    let mut next_id = 0u64;
    let t0 = 1_780_000_000_000u64;
    for n in 0..requests {
        let slot = &mut slots[(n % conversations) as usize];
        if slot.1 >= turns {
            next_id += 1;
            *slot = (next_id, 0);
        }
        slot.1 += 1;
        // A run id shaped like the gateway's: a keyed hash, so ids arrive in random order.
        let run: std::sync::Arc<str> =
            format!("r-{:024x}", splitmix(slot.0) as u128 * 0x1_0000_0001).into();
        let t_ms = t0 + n / 3;
        writer.send(TraceEvent {
            run: run.clone(),
            t_ms,
            kind: Kind::Request,
            detail: json!({"messages": 2 + 2 * slot.1, "model": "stub", "stream": false, "tenant": "anonymous"}).into(),
            summary: None,
        });
        writer.send(TraceEvent {
            run: run.clone(),
            t_ms,
            kind: Kind::ToolResult,
            detail: json!({"outcome": "ok", "tool": "search"}).into(),
            summary: None,
        });
        writer.send(TraceEvent {
            run,
            t_ms,
            kind: Kind::Response,
            detail: json!({"status": "complete"}).into(),
            summary: Some(RunSummary {
                status: "complete".into(),
                failures: 0,
                actions: 0,
            }),
        });
        // The gateway's pace: requests arrive over time, not in one burst.
        let due = std::time::Duration::from_secs_f64((n + 1) as f64 / rate);
        if let Some(wait) = due.checked_sub(started.elapsed()) {
            std::thread::sleep(wait);
        }
    }
    // Let the writer drain, then read its thread's CPU time before it exits.
    std::thread::sleep(std::time::Duration::from_millis(200));
    let writer_cpu = writer_cpu_seconds();
    writer.flush_and_close();
    let secs = started.elapsed().as_secs_f64();
    println!(
        "requests={requests} events={} dropped={} seconds={secs:.2} writer_cpu_us_per_request={}",
        requests * 3,
        writer.dropped(),
        writer_cpu.map_or("?".into(), |c| format!("{:.1}", c * 1e6 / requests as f64)),
    );
    Ok(())
}

/// The CPU time of the thread named `selfheal-trace` (Linux `/proc`; `None` elsewhere). The
/// clock tick is assumed to be 100 Hz, Linux's `USER_HZ` on every common architecture.
fn writer_cpu_seconds() -> Option<f64> {
    for task in std::fs::read_dir("/proc/self/task").ok()?.flatten() {
        let comm = std::fs::read_to_string(task.path().join("comm")).ok()?;
        if comm.trim() == "selfheal-trace" {
            let stat = std::fs::read_to_string(task.path().join("stat")).ok()?;
            let after = stat.rsplit_once(')')?.1;
            let f: Vec<&str> = after.split_whitespace().collect();
            let ticks: u64 = f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?;
            return Some(ticks as f64 / 100.0);
        }
    }
    None
}

fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49eb_00d1_13eb);
    x ^ (x >> 31)
}
