//! Runs shared by replicas: a run's state read from the state store (`[state]`) when a request
//! of it begins and written back when it ends, so that a conversation whose requests land on
//! several replicas is one run — one monitor counting every replica's observations, one budget
//! — and a replica that dies loses nothing it had answered.
//!
//! Apart from the run registry ([`crate::runs`]) because it is the only part of it that waits
//! on the network, and apart from the pipeline because a request only enters it ([`load`]) and
//! leaves it ([`save`]).
//!
//! - **Read** ([`load`]): one `get_run` (`HMGET` on Redis). A stored version newer than the
//!   local one replaces the local state; what requests still in flight here did to it is
//!   re-applied to the fresh state (see below).
//! - **Write** ([`save`]): one compare-and-set (`EVALSHA`) on the version read. A conflict —
//!   another replica wrote the run meanwhile — answers with the fresh state, on which this
//!   replica's part is re-applied and written again (at most [`ATTEMPTS`] times): its requests'
//!   tool results are replayed (the replay skips results the run has seen, so nothing is
//!   counted twice) and what they spent is added to the fresh ledger. What the other replica
//!   decided for the run's next step stands. Nothing is lost and nothing is merged blindly.
//! - The store down or slow: the local state serves (the store's health logs one warning per
//!   outage); the next write after it returns carries everything.
//! - With the in-memory default there is no store: nothing here runs and one process behaves
//!   as before.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use bytes::Bytes;
use selfheal_state::{Put, RunId, Versioned};
use serde_json::Value;

use crate::heal;
use crate::recover;
use crate::request::ChatRequest;
use crate::runs::{Redo, RunState};
use crate::state::{AppState, lock};

/// Compare-and-set attempts of one write before it gives up (the local state stands and the
/// next request's write carries it).
pub(crate) const ATTEMPTS: u32 = 4;

/// The run a request continues, and the name it is stored under: `run` of `tenant` (or,
/// `named` false, a fresh detached run that is stored once adopted), read from the shared
/// store when there is one. `redo` builds the request's [`Redo`], only when there is a store.
///
/// A run first answered while it named itself by nothing is stored under the id that answer
/// went out with, and the name of its first tool call — what the conversation's next request
/// carries — is a link to it ([`crate::pipeline::adopt_first_call`]): here the run's second
/// key, in the shared store a link its first write put there. Either way `run` given as that
/// name continues the stored run, under its stored name (one more round trip, once per run
/// and replica, for a link this replica has not seen).
pub(crate) async fn load(
    s: &Arc<AppState>,
    run: &str,
    tenant: &str,
    named: bool,
    redo: impl FnOnce() -> Redo,
) -> (Arc<Mutex<RunState>>, String) {
    if !named {
        let state = s.runs.detached(tenant);
        if s.shared.store().is_some() {
            let mut st = lock(&state);
            st.share.users += 1;
            st.share.redo.push(redo());
        }
        return (state, run.to_owned());
    }
    let now = Instant::now();
    let mut state = s.runs.get_for(run, tenant, now);
    let mut name = stored_name(&state, tenant).unwrap_or_else(|| run.to_owned());
    let Some(store) = s.shared.store() else {
        return (state, name);
    };
    let mut got = store.get_run(&RunId::new(tenant, &*name)).await;
    if let Ok(Some(link)) = &got
        && let Some(to) = std::str::from_utf8(&link.bytes)
            .ok()
            .filter(|r| is_run_id(r))
        && to != name
    {
        // A link another replica wrote: the run is read under its stored name, and this
        // replica keeps the link as the run's second key.
        state = s.runs.get_for(to, tenant, now);
        s.runs.link(run, &state, tenant, now);
        name = to.to_owned();
        got = store.get_run(&RunId::new(tenant, &*name)).await;
    }
    {
        let mut st = lock(&state);
        st.share.key = Some((Arc::from(tenant), Arc::from(&*name)));
        match got {
            Ok(Some(fresh)) if fresh.version > st.share.version => {
                s.runs.shared.loaded.fetch_add(1, RELAXED);
                rebase(s, &mut st, &fresh);
            }
            // Expired or lost with the store: written afresh from the local state.
            Ok(None) => st.share.version = 0,
            Ok(Some(_)) | Err(_) => {}
        }
    }
    let mut st = lock(&state);
    st.share.users += 1;
    st.share.redo.push(redo());
    drop(st);
    (state, name)
}

/// The name a run reached by another of its keys is stored under (see [`load`]), when it is
/// not that key: the name its state was stored with, for `tenant`.
fn stored_name(state: &Arc<Mutex<RunState>>, tenant: &str) -> Option<String> {
    let st = lock(state);
    let (of, name) = st.share.key.as_ref()?;
    (&**of == tenant).then(|| name.to_string())
}

/// Writes the run back when a request of it ends (see the module documentation) — when the
/// last of its requests in flight on this replica ends ([`hold`]); nothing without a store, or
/// for a detached run never adopted.
pub(crate) async fn save(s: &AppState, state: &Arc<Mutex<RunState>>) {
    let Some(store) = s.shared.store() else {
        return;
    };
    let writing = {
        let mut st = lock(state);
        st.share.users = st.share.users.saturating_sub(1);
        if st.share.users > 0 {
            // Another request of the run is in flight here: the last one out writes.
            return;
        }
        // Made at the first write: a run of the in-memory default never writes.
        st.share.writing.get_or_insert_with(Arc::default).clone()
    };
    let _one_at_a_time = writing.lock().await;
    let link = new_link(state);
    let alias = lock(state).share.alias.clone();
    for attempt in 0..ATTEMPTS {
        let (id, expected, bytes, base) = {
            let st = lock(state);
            let Some((tenant, run)) = st.share.key.clone() else {
                return;
            };
            let Ok(bytes) = st.to_bytes() else {
                return;
            };
            let base = (*st.ledger().spent(), st.requests);
            (RunId::new(&*tenant, &*run), st.share.version, bytes, base)
        };
        let put = store.put_run(&id, expected, Bytes::from(bytes), s.runs.ttl());
        let put = if attempt > 0 || (link.is_none() && alias.is_none()) {
            put.await
        } else {
            // The links to the run — of its newest answer, of its first call's name — go with
            // its first write, in parallel.
            let run = Bytes::from(id.run.clone().into_bytes());
            let at = |key: String| RunId::new(&*id.tenant, key);
            let keys: Vec<RunId> = (link.iter().map(|r| at(response_key(r))))
                .chain(alias.iter().map(|a| at(a.to_string())))
                .collect();
            let writes = keys
                .iter()
                .map(|k| store.put_run(k, 0, run.clone(), s.runs.ttl()));
            let (put, linked) = tokio::join!(put, futures_util::future::join_all(writes));
            let mut st = lock(state);
            let mut linked = linked.iter().map(Result::is_ok);
            if let Some(r) = &link
                && linked.next() == Some(true)
            {
                st.share.linked = Some(r.clone());
            }
            if alias.is_some() && linked.next() == Some(true) {
                st.share.alias = None;
            }
            drop(st);
            put
        };
        let mut st = lock(state);
        match put {
            Ok(Put::Stored { version }) => {
                s.runs.shared.stored.fetch_add(1, RELAXED);
                st.share.version = version;
                st.share.base = base;
                if st.share.users == 0 {
                    st.share.redo.clear();
                }
                return;
            }
            Ok(Put::Conflict {
                current: Some(fresh),
            }) => {
                s.runs.shared.conflicts.fetch_add(1, RELAXED);
                rebase(s, &mut st, &fresh);
            }
            Ok(Put::Conflict { current: None }) => st.share.version = 0,
            // The store is down: the local state serves, and the next write carries it.
            Err(_) => return,
        }
    }
    s.runs.shared.contended.fetch_add(1, RELAXED);
}

/// The id of the run's newest Responses answer when its link to the run is not in the store
/// yet.
fn new_link(state: &Arc<Mutex<RunState>>) -> Option<String> {
    let st = lock(state);
    let id = &st.last_response.as_ref()?.id;
    (st.share.linked.as_ref() != Some(id)).then(|| id.clone())
}

/// The store's key (under the tenant) of the run that sent the Responses answer `id`: apart
/// from run ids, which start `r-`.
fn response_key(id: &str) -> String {
    format!("response:{id}")
}

/// The live run of `tenant` that `label` names, when it is the id of one — answered by this
/// replica or, when replicas share a store, by any: a client that sends back the
/// `x-selfheal-run` it was answered continues that run on whichever replica it lands. A link
/// in the store to a run's name ([`crate::runs::Share::alias`]) is answered with the name. The
/// store is asked only for a label shaped like a run id that this replica does not know (once
/// per run and replica: the request then loads the run here). Runs are stored under their
/// tenant, so no other tenant's run is found.
pub(crate) async fn owned_by(
    s: &AppState,
    label: &str,
    tenant: &str,
    now: Instant,
) -> Option<String> {
    if s.runs.owned_by(label, tenant, now) {
        return Some(label.to_owned());
    }
    let store = s.shared.store()?;
    if !is_run_id(label) {
        return None;
    }
    let got = store.get_run(&RunId::new(tenant, label)).await.ok()??;
    match std::str::from_utf8(&got.bytes) {
        Ok(run) if is_run_id(run) => Some(run.to_owned()),
        _ => Some(label.to_owned()),
    }
}

/// `r-` and 24 lowercase hex digits: the shape of every run id ([`crate::runs::run_id_of`]).
fn is_run_id(label: &str) -> bool {
    label.strip_prefix("r-").is_some_and(|h| {
        h.len() == 24
            && h.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    })
}

/// The run of `tenant` that sent the Responses answer `id` (`previous_response_id`): known
/// here, or — when replicas share a store — linked to its run by the replica that answered it
/// (written with the run, before the answer was returned). One more round trip, only when this
/// replica did not send that answer.
pub(crate) async fn run_of_response(
    s: &AppState,
    id: &str,
    tenant: &str,
    now: Instant,
) -> Option<String> {
    if let Some(run) = s.runs.run_of_response(id, tenant, now) {
        return Some(run);
    }
    let store = s.shared.store()?;
    let link = store
        .get_run(&RunId::new(tenant, response_key(id)))
        .await
        .ok()??;
    let run = std::str::from_utf8(&link.bytes).ok()?;
    is_run_id(run).then(|| run.to_owned())
}

/// One more holder of the run until its [`save`]: a streamed answer relayed after its handler
/// returned writes the run when the relay ends, not before.
pub(crate) fn hold(s: &AppState, state: &Arc<Mutex<RunState>>) {
    if s.shared.store().is_some() {
        lock(state).share.users += 1;
    }
}

const RELAXED: std::sync::atomic::Ordering = std::sync::atomic::Ordering::Relaxed;

/// Replaces the local state with `fresh`, re-applying what is local only: the spending and
/// requests since the version it was read as, and the tool results of the requests in flight
/// ([`Redo`]). A fresh state that cannot be read (another layout) leaves the local one.
fn rebase(s: &AppState, st: &mut RunState, fresh: &Versioned) {
    let (mut spent, requests) = (*st.ledger().spent(), st.requests);
    spent.saturating_sub_of(&st.share.base.0);
    let requests = requests.saturating_sub(st.share.base.1);
    // The run's own trust scope (its tenant), else the tenant it is stored under.
    let tenant = st
        .trust
        .as_ref()
        .map(|t| t.scope.clone())
        .or_else(|| st.share.key.as_ref().map(|k| k.0.clone()))
        .unwrap_or_else(|| Arc::from(""));
    let mut next = match s.runs.resume(&fresh.bytes, &tenant) {
        Ok(next) => next,
        Err(e) => {
            tracing::warn!(target: "selfheal::state", error = %e, "a stored run's state cannot be read: kept the local one");
            return;
        }
    };
    let fresh_spent = *next.ledger().spent();
    next.run.add_spent(&spent);
    // The evidence the run sees from now on goes to this replica's trust store, as before.
    next.trust = st.trust.take();
    next.share = std::mem::take(&mut st.share);
    next.share.version = fresh.version;
    next.share.base = (fresh_spent, next.requests);
    next.requests += requests;
    if next.last_response.is_none() {
        next.last_response = st.last_response.take();
    }
    let redo = next.share.redo.clone();
    for r in &redo {
        r(&mut next);
    }
    // The replays' decisions were traced when they were first made.
    let _ = next.run.take_records();
    *st = next;
}

/// The [`Redo`] of a chat request: its messages' tool results replayed.
pub(crate) fn chat_redo(s: &Arc<AppState>, body: &Bytes, fallback: Option<&str>) -> Redo {
    let (s, body) = (s.clone(), body.clone());
    let fallback = fallback.map(str::to_owned);
    Arc::new(move |st: &mut RunState| {
        let Ok(req) = ChatRequest::parse(&body) else {
            return;
        };
        let tools = s.tool_indexes.get(&req);
        let now_ms = s.now_ms();
        let ctx = recover::Ctx {
            tools: &s.config.tools,
            offered: &tools,
            fallback: fallback.as_deref(),
            seed: now_ms,
            wall_ms: recover::wall_ms(),
            max_wait_ms: s.config.limits.max_wait_ms,
        };
        heal::replay(st, &req.messages, &ctx, now_ms);
    })
}

/// The [`Redo`] of a Responses request: its `input` items' tool results replayed, after the
/// calls of the answer it continues (`previous`, or in a `conversation` the run's last answer
/// when the input answers its calls), as the request itself read them.
pub(crate) fn responses_redo(
    s: &Arc<AppState>,
    input: Vec<Value>,
    tools: heal::ToolIndex,
    previous: Option<String>,
    conversation: bool,
    fallback: Option<&str>,
) -> Redo {
    let s = s.clone();
    let fallback = fallback.map(str::to_owned);
    Arc::new(move |st: &mut RunState| {
        let now_ms = s.now_ms();
        let ctx = recover::Ctx {
            tools: &s.config.tools,
            offered: &tools,
            fallback: fallback.as_deref(),
            seed: now_ms,
            wall_ms: recover::wall_ms(),
            max_wait_ms: s.config.limits.max_wait_ms,
        };
        let continues = |r: &&crate::runs::Responded| match previous.as_deref() {
            Some(prev) => prev == r.id,
            None => conversation && r.answered_by(&input),
        };
        let continued = st
            .last_response
            .as_ref()
            .filter(continues)
            .map(|r| r.calls.clone());
        let items: Vec<Value> = continued
            .into_iter()
            .flatten()
            .chain(input.iter().cloned())
            .collect();
        let only_new = previous.is_some() || conversation;
        heal::replay_items(st, &items, only_new, &ctx, now_ms);
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::GatewayConfig;
    use crate::store::TraceWriter;
    use selfheal_core::Amounts;
    use selfheal_state::{MemoryStore, Shared, StateStore};

    fn replica(store: &Arc<dyn StateStore>) -> Arc<AppState> {
        let config = GatewayConfig::for_upstream("http://127.0.0.1:1/v1");
        let mut s = AppState::new(config, TraceWriter::disabled()).unwrap();
        s.shared = Shared::with_store(store.clone(), std::time::Duration::from_secs(60)).unwrap();
        Arc::new(s)
    }

    /// A request's effect as the pipeline applies it: one tool result observed, once.
    fn observe(fp: u64) -> Redo {
        Arc::new(move |st: &mut RunState| {
            if !st.seen.contains(fp) {
                st.seen.insert(fp);
                st.failures += 1;
            }
        })
    }

    /// Two replicas serve requests of one run at once: the second write conflicts, and its
    /// request is re-applied on the state the first wrote — both results counted, both
    /// requests, none twice.
    #[tokio::test]
    async fn a_conflicting_write_is_reapplied_on_the_fresh_state() {
        let store: Arc<dyn StateStore> = Arc::new(MemoryStore::default());
        let (a, b) = (replica(&store), replica(&store));
        let on_a = load(&a, "r-1", "t", true, || observe(1)).await.0;
        let on_b = load(&b, "r-1", "t", true, || observe(2)).await.0;
        for (st, fp) in [(&on_a, 1), (&on_b, 2)] {
            let mut st = lock(st);
            st.requests += 1;
            observe(fp)(&mut st);
        }
        save(&a, &on_a).await;
        save(&b, &on_b).await;
        assert_eq!(b.runs.shared.conflicts.load(RELAXED), 1);
        let c = replica(&store);
        let on_c = load(&c, "r-1", "t", true, || observe(3)).await.0;
        let st = lock(&on_c);
        assert_eq!((st.failures, st.requests), (2, 2));
        assert!(st.seen.contains(1) && st.seen.contains(2));
        assert_eq!(st.share.version, 2);
    }

    /// A run continued from another replica's state reports its evidence to this replica's
    /// trust store (it used to keep it to itself after the rebase).
    #[tokio::test]
    async fn a_run_loaded_from_another_replica_reports_to_this_ones_trust() {
        let store: Arc<dyn StateStore> = Arc::new(MemoryStore::default());
        let (a, b) = (replica(&store), replica(&store));
        let on_a = load(&a, "r-1", "t", true, || observe(1)).await.0;
        lock(&on_a).requests += 1;
        save(&a, &on_a).await;
        let on_b = load(&b, "r-1", "t", true, || observe(2)).await.0;
        let st = lock(&on_b);
        assert_eq!((st.share.version, st.requests), (1, 1), "a's state, loaded");
        assert!(
            st.trust
                .as_ref()
                .is_some_and(|t| Arc::ptr_eq(&t.memory.0, &b.trust.0) && &*t.scope == "t")
        );
    }

    /// The run id one replica answered, sent back to another, names the same run there; the
    /// Responses answer one replica sent, continued on another, leads to its run. Neither leaks
    /// to another tenant.
    #[tokio::test]
    async fn run_ids_and_answers_are_found_on_every_replica() {
        let store: Arc<dyn StateStore> = Arc::new(MemoryStore::default());
        let (a, b) = (replica(&store), replica(&store));
        let run = "r-0123456789abcdef01234567";
        let on_a = load(&a, run, "t", true, || observe(1)).await.0;
        lock(&on_a).last_response = Some(crate::runs::Responded {
            id: "resp_1".into(),
            calls: Vec::new(),
        });
        save(&a, &on_a).await;
        let now = Instant::now();
        assert!(!b.runs.owned_by(run, "t", now), "b has not seen it");
        assert_eq!(owned_by(&b, run, "t", now).await.as_deref(), Some(run));
        assert_eq!(owned_by(&b, run, "u", now).await, None, "another tenant's");
        assert_eq!(owned_by(&b, "conversation-1", "t", now).await, None);
        assert_eq!(
            run_of_response(&b, "resp_1", "t", now).await.as_deref(),
            Some(run)
        );
        assert_eq!(run_of_response(&b, "resp_1", "u", now).await, None);
        assert_eq!(run_of_response(&b, "resp_2", "t", now).await, None);
    }

    /// A tool hidden on a replica whose process started an hour before another's cools on the
    /// other when its cooldown is over, not an hour later: runs are stamped on one wall-clock
    /// base ([`crate::clock`]). With each process counting from its own start, the stamp
    /// (3,600,000 ms) lay an hour in the other's future and the tool stayed hidden.
    #[tokio::test]
    async fn a_cooldown_begun_on_one_replica_ends_on_time_on_another() {
        use crate::clock::Clock;
        use std::time::Duration;
        let store: Arc<dyn StateStore> = Arc::new(MemoryStore::default());
        let (mut a, b) = (replica(&store), replica(&store));
        let now = Instant::now();
        let hour = Duration::from_secs(3600);
        let a_start = now
            .checked_sub(hour)
            .expect("the host has been up for an hour");
        let unix = selfheal_state::unix_ms();
        Arc::get_mut(&mut a).unwrap().clock = Clock::at(unix - 3_600_000, a_start);
        let mut messages = vec![serde_json::json!({"role": "user", "content": "Look it up."})];
        for i in 0..5 {
            messages.push(
                serde_json::json!({"role": "assistant", "content": null, "tool_calls": [
                {"id": format!("c{i}"), "type": "function",
                 "function": {"name": "search", "arguments": format!("{{\"q\": \"{i}\"}}")}}]}),
            );
            messages.push(
                serde_json::json!({"role": "tool", "tool_call_id": format!("c{i}"),
                "content": "{\"error\": \"search backend down\"}"}),
            );
        }
        let body = serde_json::json!({"model": "m", "messages": messages, "tools": [
            {"type": "function", "function": {"name": "search", "parameters": {"type": "object"}}},
            {"type": "function", "function": {"name": "fetch", "parameters": {"type": "object"}}}]});
        let body = Bytes::from(serde_json::to_vec(&body).unwrap());
        let redo = chat_redo(&a, &body, None);
        let on_a = load(&a, "r-1", "t", true, || redo.clone()).await.0;
        redo(&mut lock(&on_a));
        let hidden_at = a.now_ms();
        assert!(lock(&on_a).run.verdict(hidden_at).hidden_tools == ["search"]);
        save(&a, &on_a).await;
        let on_b = load(&b, "r-1", "t", true, || observe(1)).await.0;
        let mut st = lock(&on_b);
        assert_eq!(st.share.version, 1, "a's state, loaded");
        let cooldown = selfheal_core::MonitorConfig::default().cooldown_ms;
        let b_now = b.now_ms();
        assert!(b_now.abs_diff(hidden_at) < 60_000, "one time base");
        assert_eq!(st.run.verdict(b_now).hidden_tools, ["search"]);
        let over = hidden_at + cooldown + 1;
        assert!(
            st.run.verdict(over).hidden_tools.is_empty(),
            "cooled on time"
        );
    }

    /// What a request spent is added to a resumed state's ledger through the run.
    #[test]
    fn spending_is_added_to_a_stored_ledger() {
        use selfheal_core::BudgetLimits;
        let st = RunState::new(Default::default(), BudgetLimits::unlimited());
        let bytes = st.to_bytes().unwrap();
        let spent = Amounts {
            retries: 2,
            recoveries: 3,
            ..Amounts::default()
        };
        let mut back =
            RunState::from_bytes(&bytes, Default::default(), Default::default()).unwrap();
        assert_eq!(*back.ledger().spent(), Amounts::default());
        back.run.add_spent(&spent);
        back.run.add_spent(&spent);
        let twice = Amounts {
            retries: 4,
            recoveries: 6,
            ..Amounts::default()
        };
        assert_eq!(*back.ledger().spent(), twice);
    }

    /// Without a store nothing is read or written: the local run is the run.
    #[tokio::test]
    async fn without_a_store_the_local_run_is_the_run() {
        let config = GatewayConfig::for_upstream("http://127.0.0.1:1/v1");
        let s = Arc::new(AppState::new(config, TraceWriter::disabled()).unwrap());
        let first = load(&s, "r-1", "t", true, || observe(1)).await.0;
        lock(&first).requests += 1;
        save(&s, &first).await;
        let again = load(&s, "r-1", "t", true, || observe(1)).await.0;
        assert!(Arc::ptr_eq(&first, &again));
        assert_eq!(
            lock(&again).share.users,
            0,
            "no bookkeeping without a store"
        );
        assert!(lock(&again).share.redo.is_empty());
    }
}
