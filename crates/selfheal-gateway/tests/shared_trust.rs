//! Learned trust shared by replicas through a real `redis-server` (issue 34): evidence one
//! replica's runs observe reaches the others' runs, merged as evidence — every observation
//! counted once however many rounds of sharing pass, and kept when the replica that saw it dies.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "../../selfheal-state/tests/common/mod.rs"]
mod redis;

use std::time::Duration;

use selfheal_core::{Evidence, Posterior, Source, Trust, TrustConfig, TrustReport};
use selfheal_gateway::{AppState, GatewayConfig, TraceWriter};

use redis::{RedisServer, eventually};

const REFRESH_MS: u64 = 50;

/// A replica sharing through the Redis at `url`.
fn replica(url: &str) -> AppState {
    let mut config = GatewayConfig::for_upstream("http://127.0.0.1:1/v1");
    config.state.url = Some(url.to_owned());
    config.state.refresh_ms = REFRESH_MS;
    AppState::new(config, TraceWriter::disabled()).unwrap()
}

/// `n` reports made now: the gateway's clock for its runs is the Unix time
/// (`AppState::now_ms`, one base for every replica).
fn reports(source: &Source, evidence: Evidence, n: usize) -> Vec<TrustReport> {
    let now = selfheal_state::unix_ms();
    (0..n)
        .map(|_| TrustReport {
            source: source.clone(),
            evidence,
            at_ms: now,
        })
        .collect()
}

/// Whether `got` holds the weights of `want` (decay over the test's few seconds, at a half-life
/// of an hour, is far below the tolerance; one evidence counted twice is far above it).
fn same(got: &Posterior, want: &Posterior) -> bool {
    [
        (got.right, want.right),
        (got.wrong, want.wrong),
        (got.up, want.up),
        (got.down, want.down),
    ]
    .iter()
    .all(|(g, w)| (g - w).abs() <= 1e-3 * w.max(1.0))
}

fn posterior(t: &Trust, s: &Source) -> Posterior {
    t.posterior(s, 0, &TrustConfig::default())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trust_learned_on_one_replica_reaches_the_others_counted_once() {
    let redis = RedisServer::start();
    let config = TrustConfig::default();
    let (sub, up) = (Source::tool("fx_backup"), Source::upstream("backup"));
    let a = replica(&redis.url());
    let b = replica(&redis.url());

    // What one process that saw everything would hold.
    let mut all = Trust::new();
    let on_a = [
        reports(&sub, Evidence::Agreed, 12),
        reports(&up, Evidence::Outage, 2),
    ]
    .concat();
    a.trust.report_scoped("t", &on_a, &config);
    all.apply(&on_a, &config);
    let within = Duration::from_secs(10);
    assert!(
        eventually(within, || same(
            &posterior(&b.trust.scoped("t"), &sub),
            &posterior(&all, &sub)
        ))
        .await,
        "b's runs start from what a learned: {:?}",
        posterior(&b.trust.scoped("t"), &sub)
    );
    assert_eq!(
        posterior(&b.trust.own().scope("t"), &sub),
        Posterior::default(),
        "b shares only its own evidence, and has none"
    );

    let on_b = [
        reports(&sub, Evidence::Disagreed, 4),
        reports(&sub, Evidence::Rejected, 1),
    ]
    .concat();
    b.trust.report_scoped("t", &on_b, &config);
    all.apply(&on_b, &config);
    for r in [&a, &b] {
        assert!(
            eventually(within, || same(
                &posterior(&r.trust.scoped("t"), &sub),
                &posterior(&all, &sub)
            ))
            .await,
            "both replicas hold both parts: {:?}, one process {:?}",
            posterior(&r.trust.scoped("t"), &sub),
            posterior(&all, &sub)
        );
    }
    // Many more rounds of sharing change nothing: no evidence is counted again.
    tokio::time::sleep(Duration::from_millis(REFRESH_MS * 10)).await;
    for r in [&a, &b] {
        let view = r.trust.scoped("t");
        assert!(same(&posterior(&view, &sub), &posterior(&all, &sub)));
        assert!(same(&posterior(&view, &up), &posterior(&all, &up)));
    }
    let p_b = b.trust.scoped("t").p_right(&sub, 0, &config);
    assert!(
        p_b < config.prior_mean(),
        "the disagreements count on a too"
    );

    // a dies: what it learned stays in Redis, and a replica started after it reads it once.
    drop(a);
    let c = replica(&redis.url());
    assert!(
        eventually(within, || same(
            &posterior(&c.trust.scoped("t"), &sub),
            &posterior(&all, &sub)
        ))
        .await,
        "a replica started later holds a's and b's evidence: {:?}",
        posterior(&c.trust.scoped("t"), &sub)
    );
}
