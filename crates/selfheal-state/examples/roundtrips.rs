//! What the state store costs a request: round trips and latency of one run's read plus
//! compare-and-set write, on Redis and in memory, the shared tier's local read, and Redis memory
//! per run and per shared record.
//!
//! ```sh
//! cargo run --release -p selfheal-state --example roundtrips            # starts its own redis-server
//! cargo run --release -p selfheal-state --example roundtrips -- 5000 2048  # cycles, blob bytes
//! ```
//!
//! Round trips are counted by Redis itself (`INFO commandstats`: the client's `HMGET` and
//! `EVALSHA` calls; what a script runs inside is not a round trip).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use selfheal_state::{
    MemoryStore, RedisOptions, RedisStore, RunId, Shared, StateStore, unix_ms, update_run,
};

fn command(port: u16, args: &[&str]) -> String {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    let mut req = format!("*{}\r\n", args.len());
    for a in args {
        req += &format!("${}\r\n{a}\r\n", a.len());
    }
    s.write_all(req.as_bytes()).unwrap();
    s.set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    let mut out = Vec::new();
    let mut buf = [0; 65536];
    while let Ok(n) = s.read(&mut buf) {
        if n == 0 {
            break;
        }
        out.extend_from_slice(&buf[..n]);
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn calls(stats: &str, cmd: &str) -> u64 {
    stats
        .lines()
        .find_map(|l| l.strip_prefix(&format!("cmdstat_{cmd}:calls=")))
        .and_then(|r| r.split(',').next())
        .map_or(0, |n| n.parse().unwrap())
}

fn pct(sorted: &[Duration], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i].as_secs_f64() * 1e6
}

async fn cycles(store: &dyn StateStore, n: usize, blob: &Bytes) -> Vec<Duration> {
    let ttl = Duration::from_secs(3600);
    let mut lat = Vec::with_capacity(n);
    for i in 0..n {
        // One request of a run: read its state at the start, write it back at the end.
        let id = RunId::new("key:tenant", format!("run-{}", i % 100));
        let t = Instant::now();
        update_run(store, &id, ttl, 3, |_| blob.clone())
            .await
            .unwrap();
        lat.push(t.elapsed());
    }
    lat.sort();
    lat
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let n: usize = args.get(1).map_or(2000, |a| a.parse().unwrap());
    let size: usize = args.get(2).map_or(2048, |a| a.parse().unwrap());
    let blob = Bytes::from(vec![b'x'; size]);

    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut redis = Command::new("redis-server")
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--save", "", "--appendonly", "no"])
        .stdout(Stdio::null())
        .spawn()
        .expect("redis-server (apt-get install redis-server)");
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        std::thread::sleep(Duration::from_millis(20));
    }
    let url = format!("redis://127.0.0.1:{port}");
    let store = RedisStore::new(&url, RedisOptions::default()).unwrap();
    // Warm up: the connection, the script cache.
    cycles(&store, 50, &blob).await;
    command(port, &["CONFIG", "RESETSTAT"]);
    let redis_lat = cycles(&store, n, &blob).await;
    let stats = command(port, &["INFO", "commandstats"]);
    let (hmget, evalsha, eval) = (
        calls(&stats, "hmget"),
        calls(&stats, "evalsha"),
        calls(&stats, "eval"),
    );
    let memory = MemoryStore::new();
    cycles(&memory, 50, &blob).await;
    let mem_lat = cycles(&memory, n, &blob).await;

    println!("{n} request cycles (get_run + compare-and-set put_run of a {size}-byte run):");
    println!(
        "  redis : {:.2} round trips per request (HMGET {hmget}, EVALSHA {evalsha}, EVAL {eval}); \
         p50 {:.0} us, p99 {:.0} us",
        (hmget + evalsha + eval) as f64 / n as f64,
        pct(&redis_lat, 0.5),
        pct(&redis_lat, 0.99)
    );
    println!(
        "  memory: 0 round trips; p50 {:.1} us, p99 {:.1} us",
        pct(&mem_lat, 0.5),
        pct(&mem_lat, 0.99)
    );
    let usage = command(
        port,
        &["MEMORY", "USAGE", "selfheal:run:10:key:tenant:run-0"],
    );
    println!(
        "  redis memory per run of {size} bytes: {} bytes",
        usage.trim().trim_start_matches(':')
    );

    // The shared tier: a request's read is a local map lookup.
    let store: Arc<dyn StateStore> = Arc::new(store);
    let shared = Shared::with_store(store, Duration::from_secs(1)).unwrap();
    for i in 0..8 {
        shared.publish(&format!("circuit:upstream{i}"), "open", unix_ms() + 600_000);
    }
    shared.sync_now().await.unwrap();
    let now = unix_ms();
    let t = Instant::now();
    let reads = 1_000_000;
    let mut hits = 0;
    for i in 0..reads {
        hits += usize::from(
            shared
                .get(&format!("circuit:upstream{}", i % 16), now)
                .is_some(),
        );
    }
    let per = t.elapsed().as_secs_f64() * 1e9 / f64::from(reads);
    println!(
        "shared tier: {per:.0} ns per local read (key formatting included; {hits} hits), \
         0 round trips on the request path"
    );
    let usage = command(port, &["MEMORY", "USAGE", "selfheal:shared"]);
    println!(
        "  redis memory of the shared hash with 8 records: {} bytes",
        usage.trim().trim_start_matches(':')
    );
    let _ = redis.kill();
    let _ = redis.wait();
}
