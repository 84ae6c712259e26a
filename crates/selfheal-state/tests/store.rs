//! The stores against a real `redis-server` (and the in-memory store with the same checks):
//! compare-and-set conflicts retried on fresh state, expiry, and Redis stopped, frozen and
//! restarted under the shared tier without an error reaching its callers.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use selfheal_state::{
    MemoryStore, Put, RedisOptions, RedisStore, RunId, Shared, StateStore, StoreError, unix_ms,
    update_run,
};

use common::{RedisServer, eventually};

fn redis(server: &RedisServer) -> Arc<dyn StateStore> {
    let options = RedisOptions {
        probe_every: Duration::from_millis(100),
        ..RedisOptions::default()
    };
    Arc::new(RedisStore::new(&server.url(), options).unwrap())
}

fn count(b: Option<&[u8]>) -> u64 {
    b.map_or(0, |b| std::str::from_utf8(b).unwrap().parse().unwrap())
}

async fn conflicts_are_retried_on_fresh_state(store: &dyn StateStore) {
    let id = RunId::new("tenant:a", "run-1");
    let ttl = Duration::from_secs(60);
    assert_eq!(store.get_run(&id).await.unwrap(), None);
    // Two requests of one run read version 0 ...
    let a = store.put_run(&id, 0, Bytes::from("a"), ttl).await.unwrap();
    assert_eq!(a, Put::Stored { version: 1 });
    // ... the second one's write conflicts and gets the first one's state back, in one answer.
    let b = store.put_run(&id, 0, Bytes::from("b"), ttl).await.unwrap();
    let Put::Conflict {
        current: Some(fresh),
    } = b
    else {
        panic!("expected a conflict with the fresh state, got {b:?}");
    };
    assert_eq!((fresh.bytes.as_ref(), fresh.version), (b"a".as_ref(), 1));
    // Retried on the fresh state: both writes are in.
    let b = store
        .put_run(&id, fresh.version, Bytes::from("a+b"), ttl)
        .await
        .unwrap();
    assert_eq!(b, Put::Stored { version: 2 });
    let got = store.get_run(&id).await.unwrap().unwrap();
    assert_eq!((got.bytes.as_ref(), got.version), (b"a+b".as_ref(), 2));

    // Many writers of one counter at once: no increment is lost.
    let counter = RunId::new("tenant:a", "counter");
    let store: &dyn StateStore = store;
    let writers = (0..4).map(|_| async {
        for _ in 0..25 {
            update_run(store, &counter, ttl, 1_000, |b| {
                Bytes::from((count(b) + 1).to_string())
            })
            .await
            .unwrap();
        }
    });
    futures_util::future::join_all(writers).await;
    let got = store.get_run(&counter).await.unwrap().unwrap();
    assert_eq!(count(Some(&got.bytes)), 100, "an increment was lost");
    assert_eq!(got.version, 100);
    // Tenants do not see each other's runs, even with a `:` in the tenant.
    let other = RunId::new("tenant", "a:run-1");
    assert_eq!(store.get_run(&other).await.unwrap(), None);
}

async fn runs_expire_after_their_ttl(store: &dyn StateStore) {
    let id = RunId::new("t", "short");
    let ttl = Duration::from_millis(300);
    let put = store.put_run(&id, 0, Bytes::from("x"), ttl).await.unwrap();
    assert_eq!(put, Put::Stored { version: 1 });
    assert!(store.get_run(&id).await.unwrap().is_some());
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert_eq!(store.get_run(&id).await.unwrap(), None, "expired");
    // An expired run starts over: version 1 again, and a writer still holding version 1 is told.
    let stale = store.put_run(&id, 1, Bytes::from("y"), ttl).await.unwrap();
    assert_eq!(stale, Put::Conflict { current: None });
    let fresh = store.put_run(&id, 0, Bytes::from("z"), ttl).await.unwrap();
    assert_eq!(fresh, Put::Stored { version: 1 });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_conflicts_are_retried_on_fresh_state() {
    conflicts_are_retried_on_fresh_state(&MemoryStore::new()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_runs_expire() {
    runs_expire_after_their_ttl(&MemoryStore::new()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_conflicts_are_retried_on_fresh_state() {
    let server = RedisServer::start();
    conflicts_are_retried_on_fresh_state(redis(&server).as_ref()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_runs_expire() {
    let server = RedisServer::start();
    let store = redis(&server);
    runs_expire_after_their_ttl(store.as_ref()).await;
    // The key carries the TTL itself: Redis, not a reader, forgets it.
    let id = RunId::new("t", "ttl");
    store
        .put_run(&id, 0, Bytes::from("x"), Duration::from_secs(90))
        .await
        .unwrap();
    let pttl = server.command(&["PTTL", "selfheal:run:1:t:ttl"]);
    let ms: u64 = pttl.trim_start_matches(':').trim().parse().unwrap();
    assert!((80_000..=90_000).contains(&ms), "PTTL {pttl:?}");
}

/// Two replicas share a record through Redis; Redis is frozen, then stopped and restarted
/// empty: reads and writes of the shared tier never fail, the outage is one episode per
/// replica, and sharing resumes — including what was published during the outage and what the
/// restarted Redis forgot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_outage_mid_run_is_survived_and_sharing_resumes() {
    let mut server = RedisServer::start();
    let refresh = Duration::from_millis(100);
    let (store_a, store_b) = (redis(&server), redis(&server));
    let a = Shared::with_store(store_a.clone(), refresh).unwrap();
    let b = Shared::with_store(store_b.clone(), refresh).unwrap();
    let until = unix_ms() + 600_000;
    let soon = Duration::from_secs(5);

    a.publish("upstream:x", "open", until);
    assert!(
        eventually(soon, || b.get("upstream:x", unix_ms()).is_some()).await,
        "a record published on one replica reaches the other"
    );
    assert_eq!(b.get("upstream:x", unix_ms()).unwrap().origin, a.origin());

    // Slow: the server accepts but does not answer. Callers are not held up and see no error.
    server.signal("-STOP");
    a.publish("upstream:slow", "open", until);
    assert!(a.get("upstream:slow", unix_ms()).is_some(), "local at once");
    assert!(
        eventually(soon, || !a.store_up() && !b.store_up()).await,
        "both replicas notice the frozen store"
    );
    let err = store_b.get_run(&RunId::new("t", "r")).await.unwrap_err();
    assert!(
        matches!(err, StoreError::Timeout(_) | StoreError::Unavailable),
        "{err}"
    );
    server.signal("-CONT");
    assert!(
        eventually(soon, || a.store_up() && b.store_up()).await,
        "thawed"
    );
    assert!(
        eventually(soon, || b.get("upstream:slow", unix_ms()).is_some()).await,
        "what was published while it was frozen is shared once it answers"
    );

    // Down: stopped mid-run.
    server.stop();
    a.publish("upstream:y", "open", until);
    for _ in 0..200 {
        // Requests keep reading local state; none of this can fail.
        assert!(a.get("upstream:y", unix_ms()).is_some());
        assert!(
            b.get("upstream:x", unix_ms()).is_some(),
            "b keeps what it knew"
        );
        let _ = store_b.get_run(&RunId::new("t", "r")).await;
    }
    assert!(
        eventually(soon, || !a.store_up() && !b.store_up()).await,
        "the outage shows in the health flag"
    );
    assert_eq!(
        store_b.health().down_episodes(),
        2,
        "one episode per outage (frozen, then stopped), not one per failed call"
    );
    assert!(store_b.health().errors_total() >= 2);

    // Back, empty: sharing resumes with everything still live.
    server.restart();
    assert!(
        eventually(soon, || a.store_up() && b.store_up()).await,
        "both replicas reconnect by themselves"
    );
    assert!(
        eventually(soon, || b.get("upstream:y", unix_ms()).is_some()).await,
        "published during the outage, shared after it"
    );
    let stored = server.command(&["HLEN", "selfheal:shared"]);
    assert_eq!(
        stored.trim(),
        ":3",
        "a's records were sent again to the restarted, empty Redis"
    );
    let c = Shared::with_store(redis(&server), refresh).unwrap();
    assert!(
        eventually(soon, || c.get("upstream:x", unix_ms()).is_some()).await,
        "a replica started after the restart learns what was published before it"
    );
    // And runs work again.
    let put = store_b
        .put_run(
            &RunId::new("t", "r"),
            0,
            Bytes::from("x"),
            Duration::from_secs(5),
        )
        .await
        .unwrap();
    assert_eq!(put, Put::Stored { version: 1 });
}

/// Removals and expiries are shared too, and expired records leave Redis.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_removals_and_expiries_are_shared() {
    let server = RedisServer::start();
    let refresh = Duration::from_millis(50);
    let a = Shared::with_store(redis(&server), refresh).unwrap();
    let b = Shared::with_store(redis(&server), refresh).unwrap();
    let soon = Duration::from_secs(5);
    a.publish("k:long", "1", unix_ms() + 600_000);
    a.publish("k:short", "2", unix_ms() + 300);
    assert!(eventually(soon, || b.scan("k:", unix_ms()).len() == 2).await);
    b.remove("k:long");
    assert!(
        eventually(soon, || a.get("k:long", unix_ms()).is_none()).await,
        "a removal on one replica reaches the other"
    );
    assert!(
        eventually(soon, || server.command(&["HLEN", "selfheal:shared"]).trim()
            == ":0")
        .await,
        "the expired record is dropped from Redis"
    );
}
