//! Per-run state that the conversation cannot rebuild, in a bounded store with expiry.
//!
//! Every request carries the whole conversation, so the run's tool history is replayed from the
//! messages. What is *not* in the messages — the monitor's breakers and cooldowns, the budget
//! spent on retries and re-asks, what the gateway already did — lives here, keyed by run id.
//! The store holds at most `capacity` runs; idle runs expire after a TTL and, when full, the
//! least recently used run is dropped. Both are counted.
//!
//! A Responses client that keeps its conversation upstream (`previous_response_id`) sends only
//! what is new, so the store also remembers which run sent each answer ([`RunStore::responded`])
//! and each run's last answer's calls ([`Responded`]), both bounded.
//!
//! A run belongs to a tenant (see `auth`): its id is an HMAC-SHA256, under a per-deployment
//! secret, of the tenant and either the client's label (`x-selfheal-run`, a Responses
//! `conversation`) or the conversation's first tool call (its provider-unique id and tool name,
//! with the opening). Opening text alone never names a run, and a conversation with no tool call
//! yet gets a fresh one (see [`run_id_of`]). Two tenants — or two conversations of one tenant
//! that open alike — get different runs, so one's tool errors never become the other's guidance,
//! and nobody can name another tenant's run. The secret makes ids unguessable and, unlike
//! `DefaultHasher`, the construction is stable across Rust releases.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hmac::{Hmac, Mac};
use selfheal_core::{
    Action, ActionKind, Breakers, BudgetLedger, BudgetLimits, ControllerConfig, Env, Input,
    MonitorConfig, Policy, Rng, Run, TrustConfig,
};
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::request::Message;
use crate::wire;

/// Most tool results remembered per run (see [`SeenResults`]). Replay only needs the newest
/// result it has seen to still be remembered, so this bounds memory (8 bytes a result, a few KB
/// a run) rather than how long a run may be.
pub(crate) const SEEN_CAPACITY: usize = 256;

/// The tool results a run's monitor has been fed, by fingerprint (SHA-256 of `tool_call_id` and
/// content, 8 bytes), at most [`SEEN_CAPACITY`]: the oldest is forgotten first. Replay feeds
/// only results after the last one seen, so a result forgotten here but still in the history
/// (older than any remembered one) is not fed twice, and an agent that trims its history from
/// the front neither resets the run nor has its newest results skipped.
///
/// One ring, searched newest first: a request looks up its newest result and the one before,
/// which the run saw last, so a lookup is a few comparisons, and a run holds 8 bytes a result
/// (a hash set beside the ring doubled that, for tens of thousands of stored runs). A store
/// written with the set reads back (the set is ignored).
#[derive(Debug, Default, Clone, serde::Serialize, serde::Deserialize)]
pub struct SeenResults {
    order: VecDeque<u64>,
    forgotten: u64,
}

impl SeenResults {
    /// The fingerprint of a tool result. Every request of a conversation hashes its newest
    /// result and the last one its run has seen — the newest of the request before — so the
    /// fingerprints of results up to [`FINGERPRINT_LIMITS`]' `entry_bytes` are kept, by their
    /// exact input, and the second hash is a lookup.
    pub fn fingerprint(tool_call_id: &str, content: &str) -> u64 {
        let n = tool_call_id.len() + 1 + content.len();
        if n > FINGERPRINT_LIMITS.entry_bytes {
            return Self::hash(tool_call_id, content);
        }
        let mut input = Vec::with_capacity(n);
        input.extend_from_slice(tool_call_id.as_bytes());
        input.push(0);
        input.extend_from_slice(content.as_bytes());
        let memo = || FINGERPRINTS.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(&fp) = memo().get(&input) {
            return fp;
        }
        let fp = Self::hash(tool_call_id, content);
        memo().insert(input, fp);
        fp
    }

    /// SHA-256 of `tool_call_id`, a zero byte and `content`: its first 8 bytes.
    fn hash(tool_call_id: &str, content: &str) -> u64 {
        let mut h = Sha256::new();
        h.update(tool_call_id.as_bytes());
        h.update([0]);
        h.update(content.as_bytes());
        let d = h.finalize();
        let mut b = [0u8; 8];
        b.copy_from_slice(&d[..8]);
        u64::from_le_bytes(b)
    }

    /// Whether `fp` was seen (and not forgotten).
    pub fn contains(&self, fp: u64) -> bool {
        self.order.iter().rev().any(|&f| f == fp)
    }

    /// Remembers `fp`, forgetting the oldest past the capacity.
    pub fn insert(&mut self, fp: u64) {
        if self.contains(fp) {
            return;
        }
        self.order.push_back(fp);
        if self.order.len() > SEEN_CAPACITY && self.order.pop_front().is_some() {
            self.forgotten += 1;
        }
    }

    /// Results remembered now.
    pub fn len(&self) -> usize {
        self.order.len()
    }

    /// Whether nothing was seen.
    pub fn is_empty(&self) -> bool {
        self.order.is_empty()
    }

    /// Results forgotten for capacity.
    pub fn forgotten(&self) -> u64 {
        self.forgotten
    }
}

/// The fingerprints made lately ([`SeenResults::fingerprint`]), process-wide, by their exact
/// input (`tool_call_id`, a zero byte, the content): a pure function's results, so keeping
/// them changes nothing but the cost.
static FINGERPRINTS: std::sync::LazyLock<Mutex<BoundedMap<u64>>> =
    std::sync::LazyLock::new(|| Mutex::new(BoundedMap::new(FINGERPRINT_LIMITS)));

/// Most fingerprints remembered, most input bytes held, and the longest input kept (a longer
/// one is hashed each time).
const FINGERPRINT_LIMITS: Limits = Limits {
    entries: 16_384,
    bytes: 8 * 1024 * 1024,
    entry_bytes: 8 * 1024,
};

/// How much a [`BoundedMap`] holds: entries, key bytes in all, and the longest key kept.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    pub(crate) entries: usize,
    pub(crate) bytes: usize,
    pub(crate) entry_bytes: usize,
}

/// Values worked out from input bytes by a pure function (a hash, a MAC), kept by their exact
/// input so that a hit is the value the function would give. Bounded in entries and in key
/// bytes; starts over when full (cheaper than ordering entries, and a miss only costs the
/// function again). A key longer than [`Limits::entry_bytes`] is not kept.
pub(crate) struct BoundedMap<V> {
    map: HashMap<Vec<u8>, V>,
    bytes: usize,
    limits: Limits,
}

impl<V> BoundedMap<V> {
    /// An empty map within `limits`.
    pub(crate) fn new(limits: Limits) -> Self {
        BoundedMap {
            map: HashMap::new(),
            bytes: 0,
            limits,
        }
    }

    /// The value kept for `input`.
    pub(crate) fn get(&self, input: &[u8]) -> Option<&V> {
        self.map.get(input)
    }

    /// Keeps `value` for `input`, starting over first when the map is full.
    pub(crate) fn insert(&mut self, input: Vec<u8>, value: V) {
        if input.len() > self.limits.entry_bytes {
            return;
        }
        if self.map.len() >= self.limits.entries || self.bytes + input.len() > self.limits.bytes {
            self.map.clear();
            self.bytes = 0;
        }
        let n = input.len();
        if self.map.insert(input, value).is_none() {
            self.bytes += n;
        }
    }
}

/// Most action names remembered per run (the trace keeps them all).
const MAX_ACTIONS: usize = 32;

/// Events a run's controller keeps in its own trace ring. The gateway never reads that ring (its
/// trace is the SQLite sink, written as things happen), so it keeps the newest event only: up to
/// 10,000 runs live at once, and 64 events each were tens of MiB of memory nobody read.
pub(crate) const RUN_TRACE_EVENTS: usize = 1;

/// The layout of [`RunState::to_bytes`] (the core's run carries its own version inside).
pub(crate) const STORED_VERSION: u32 = 1;

/// [`RunState`] as stored.
#[derive(serde::Serialize, serde::Deserialize)]
struct Stored {
    version: u32,
    run: selfheal_core::RunSnapshot,
    wire: Wire,
    seen: SeenResults,
    failures: u64,
    successes: u64,
    actions: Vec<crate::action::Action>,
    requests: u64,
    last_response: Option<Responded>,
}

/// What the gateway remembers about one run.
#[derive(Debug)]
pub struct RunState {
    /// The core's run: its tool-health monitor, its open failures and ladders, the upstream
    /// calls in flight and the run's one budget ledger. Every decision about the run is its.
    pub run: Run,
    /// What the gateway is waiting on or has to carry out next for the controller (see
    /// [`crate::recover`]).
    pub wire: Wire,
    /// The tool results already fed to the monitor.
    pub seen: SeenResults,
    /// Tool failures seen so far.
    pub failures: u64,
    /// Tool calls that succeeded so far.
    pub successes: u64,
    /// The last recovery actions taken (bounded).
    pub(crate) actions: Vec<crate::action::Action>,
    /// Requests served for this run.
    pub requests: u64,
    /// The last Responses answer the run sent, with its calls: what a client continuing with
    /// `previous_response_id` no longer sends back.
    pub last_response: Option<Responded>,
    /// Where the run stands with the store replicas share (`[state]`); not stored itself.
    pub share: Share,
    /// The gateway's trust store this run reports its evidence to (issue 33), and how it is
    /// read; not part of the run's bytes. `None`: the run keeps what it learns to itself.
    pub(crate) trust: Option<RunTrust>,
}

/// Where a run's trust comes from and where its evidence goes: the process's store, under the
/// run's tenant ([`TrustMemory::scoped`]).
#[derive(Debug, Clone)]
pub(crate) struct RunTrust {
    /// The process's store.
    pub(crate) memory: TrustMemory,
    /// How it is read.
    pub(crate) config: TrustConfig,
    /// The tenant whose evidence the run reads and adds to.
    pub(crate) scope: Arc<str>,
}

/// Re-applies one request's effect on a run's state to another copy of it: the request's tool
/// results replayed (the replay skips results the run has seen, so running it again is
/// harmless). What a compare-and-set that lost to another replica runs on the fresh state.
pub(crate) type Redo = Arc<dyn Fn(&mut RunState) + Send + Sync>;

/// A run's standing with the state store replicas share (`[state]`, see `crate::sharing`):
/// the version its local state was read or written as, what it had spent then, and what the
/// requests in flight on this replica did to it (to re-apply on a fresher state). Untouched
/// with the in-memory default.
#[derive(Default)]
pub struct Share {
    /// The stored version the local state was read as or written as (`0`: none).
    pub(crate) version: u64,
    /// The tenant and name it is stored under (`None`: a detached run not stored).
    pub(crate) key: Option<(Arc<str>, Arc<str>)>,
    /// Requests of this run in flight on this replica.
    pub(crate) users: u32,
    /// Spent and requests served as of `version`: what is local only is the difference.
    pub(crate) base: (selfheal_core::Amounts, u64),
    /// The effects of the requests in flight ([`Redo`]).
    pub(crate) redo: Vec<Redo>,
    /// One write of this run at a time from this replica (made at its first write).
    pub(crate) writing: Option<Arc<tokio::sync::Mutex<()>>>,
    /// The Responses answer whose link to this run is in the store (see
    /// `crate::sharing::run_of_response`).
    pub(crate) linked: Option<String>,
    /// The name of the first tool call a run that named itself by nothing was answered with
    /// (what the conversation's next request carries), when the run is stored under the id its
    /// first answer went out with: written to the store as a link to the run's name, so that
    /// the conversation's next request continues the run on any replica.
    pub(crate) alias: Option<Arc<str>>,
}

impl std::fmt::Debug for Share {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Share")
            .field("version", &self.version)
            .field("key", &self.key)
            .field("users", &self.users)
            .field("redo", &self.redo.len())
            .finish()
    }
}

/// Longest response id remembered (an upstream's are a few dozen bytes): the ids the store
/// keeps are bounded in bytes as well as in number.
pub(crate) const MAX_RESPONSE_ID_BYTES: usize = 256;

/// Most `function_call` items remembered of a response (see [`Responded`]).
pub(crate) const MAX_RESPONDED_CALLS: usize = 64;

/// Most bytes of arguments remembered of a response's calls (see [`Responded`]): one run's
/// share, so 10,000 live runs hold at most about 160 MiB of them, and an agent's calls are
/// rarely more than a few hundred bytes.
pub(crate) const MAX_RESPONDED_BYTES: usize = 16 * 1024;

/// A Responses answer the gateway sent: its id and its `function_call` items (`call_id`,
/// `name`, `arguments`). A client that continues with `previous_response_id` sends only the
/// calls' `function_call_output` items; the upstream keeps the rest of the conversation. The
/// gateway reads the results against these calls, as it reads a full `input` against the
/// calls it carries. Calls past [`MAX_RESPONDED_CALLS`] or [`MAX_RESPONDED_BYTES`] are not kept,
/// and a result whose call is not known is read as a call of no known tool, as before.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Responded {
    /// The response's `id`.
    pub id: String,
    /// Its `function_call` items, reduced to `type`, `call_id`, `name` and `arguments`.
    pub calls: Vec<serde_json::Value>,
}

impl Responded {
    /// The id and calls of a response object; `None` without a string `id` of at most
    /// [`MAX_RESPONSE_ID_BYTES`].
    pub fn of(response: &serde_json::Value) -> Option<Responded> {
        use serde_json::Value;
        let id = response
            .get("id")
            .and_then(Value::as_str)
            .filter(|id| id.len() <= MAX_RESPONSE_ID_BYTES)?
            .to_owned();
        let mut calls = Vec::new();
        let mut bytes = 0;
        let items = response.get("output").and_then(Value::as_array);
        for item in items.into_iter().flatten() {
            if wire::item_type(item) != Some("function_call") {
                continue;
            }
            let text = |k: &str| item.get(k).and_then(Value::as_str).unwrap_or("");
            bytes += text("arguments").len() + text("name").len() + text("call_id").len();
            if calls.len() == MAX_RESPONDED_CALLS || bytes > MAX_RESPONDED_BYTES {
                break;
            }
            calls.push(serde_json::json!({
                "type": "function_call",
                "call_id": text("call_id"),
                "name": text("name"),
                "arguments": text("arguments"),
            }));
        }
        Some(Responded { id, calls })
    }

    /// Whether `input` answers this response's calls and nothing else: it has results
    /// (`function_call_output` items), each of a call of this response, and no call of its own.
    pub fn answered_by(&self, input: &[serde_json::Value]) -> bool {
        use serde_json::Value;
        let mut results = 0;
        for item in input {
            match wire::item_type(item) {
                Some("function_call") => return false,
                Some("function_call_output") => {
                    let id = item.get("call_id").and_then(Value::as_str);
                    if !self
                        .calls
                        .iter()
                        .any(|c| c.get("call_id").and_then(Value::as_str) == id)
                    {
                        return false;
                    }
                    results += 1;
                }
                _ => {}
            }
        }
        results > 0
    }
}

impl RunState {
    /// A fresh run with the default policy.
    pub fn new(monitor: MonitorConfig, budget: BudgetLimits) -> RunState {
        RunState::with_policy(monitor, budget, Policy::default())
    }

    /// A fresh run deciding with `policy`. A configuration the controller refuses (the
    /// gateway's config is validated when it is read, so only a hand-built one) falls back to
    /// the default controller rather than leave the run without one.
    pub fn with_policy(monitor: MonitorConfig, budget: BudgetLimits, policy: Policy) -> RunState {
        RunState::with_trust(monitor, budget, policy, None)
    }

    /// [`RunState::with_policy`], the run starting from what the gateway's `trust` store has
    /// learned of its sources under `tenant` and reporting what it sees back there: what one
    /// tenant's runs saw never decides what another's claim.
    pub fn with_trust(
        monitor: MonitorConfig,
        budget: BudgetLimits,
        policy: Policy,
        trust: Option<(&TrustMemory, &str)>,
    ) -> RunState {
        let trust_config = policy.trust;
        let run = Run::new(ControllerConfig {
            monitor,
            policy,
            budget,
            trace_capacity: RUN_TRACE_EVENTS,
            trust: trust
                .map(|(t, tenant)| t.scoped(tenant))
                .unwrap_or_default(),
            ..ControllerConfig::default()
        })
        .unwrap_or_default();
        RunState {
            run,
            wire: Wire::default(),
            seen: SeenResults::default(),
            failures: 0,
            successes: 0,
            actions: Vec::new(),
            requests: 0,
            last_response: None,
            share: Share::default(),
            trust: trust.map(|(t, tenant)| RunTrust {
                memory: t.clone(),
                config: trust_config,
                scope: Arc::from(tenant),
            }),
        }
    }

    /// The run's one budget ledger.
    pub fn ledger(&self) -> &BudgetLedger {
        self.run.ledger()
    }

    /// Hands the run an input and returns what it decided (see [`Run::decide`]).
    pub fn decide(
        &mut self,
        input: Input<'_>,
        now_ms: u64,
        rng: &mut dyn Rng,
        breakers: &mut Breakers,
    ) -> Vec<Action> {
        let mut env = Env {
            now_ms,
            rng,
            breakers,
        };
        let actions = self.run.decide(input, &mut env);
        if let Some(t) = &self.trust {
            t.memory
                .report_scoped(&t.scope, &self.run.take_trust_evidence(), &t.config);
        }
        actions
    }

    /// Hands the run an input that needs neither time nor chance nor breakers (the tools on
    /// offer, a user turn) and decides nothing.
    pub fn tell(&mut self, input: Input<'_>) {
        let mut rng = selfheal_core::SplitMix64::new(0);
        let mut breakers = Breakers::none();
        let actions = self.decide(input, 0, &mut rng, &mut breakers);
        debug_assert!(actions.is_empty(), "{actions:?}");
    }

    /// The run's whole state as bytes, for a store shared by replicas: the core's run
    /// ([`Run::to_bytes`]) and what the gateway keeps beside it. No configuration and no
    /// secret: the policy and thresholds come back from the process reading it
    /// ([`RunState::from_bytes`]).
    pub fn to_bytes(&self) -> Result<Vec<u8>, serde_json::Error> {
        serde_json::to_vec(&Stored {
            version: STORED_VERSION,
            run: self.run.snapshot(),
            wire: self.wire.clone(),
            seen: self.seen.clone(),
            failures: self.failures,
            successes: self.successes,
            actions: self.actions.clone(),
            requests: self.requests,
            last_response: self.last_response.clone(),
        })
    }

    /// A run's state from [`RunState::to_bytes`], under this process's monitor thresholds and
    /// policy. A state of another layout is refused, never read as something it is not.
    pub fn from_bytes(
        bytes: &[u8],
        monitor: MonitorConfig,
        policy: Policy,
    ) -> Result<RunState, selfheal_core::ResumeError> {
        RunState::resumed(bytes, monitor, policy, None)
    }

    /// [`RunState::from_bytes`], the run's trust read from this process's `trust` store under
    /// the run's tenant (the stored state carries the run's own evidence only, see
    /// [`Run::resume`]).
    pub(crate) fn resumed(
        bytes: &[u8],
        monitor: MonitorConfig,
        policy: Policy,
        trust: Option<(&TrustMemory, &str)>,
    ) -> Result<RunState, selfheal_core::ResumeError> {
        let stored: Stored = serde_json::from_slice(bytes)?;
        if stored.version != STORED_VERSION {
            return Err(selfheal_core::ResumeError::Version {
                found: stored.version,
                expected: STORED_VERSION,
            });
        }
        let run = Run::resume(
            stored.run,
            ControllerConfig {
                monitor,
                policy,
                trace_capacity: RUN_TRACE_EVENTS,
                trust: trust
                    .map(|(t, tenant)| t.scoped(tenant))
                    .unwrap_or_default(),
                ..ControllerConfig::default()
            },
        )?;
        Ok(RunState {
            run,
            wire: stored.wire,
            seen: stored.seen,
            failures: stored.failures,
            successes: stored.successes,
            actions: stored.actions,
            requests: stored.requests,
            last_response: stored.last_response,
            share: Share::default(),
            trust: None,
        })
    }

    /// Remembers an action (the oldest is dropped past the bound).
    pub(crate) fn act(&mut self, action: crate::action::Action) {
        if self.actions.len() == MAX_ACTIONS {
            self.actions.remove(0);
        }
        self.actions.push(action);
    }
}

struct Entry {
    state: Arc<Mutex<RunState>>,
    /// The tenant the run was created for.
    tenant: Arc<str>,
    last_seen: Instant,
    /// The stamp of this run's newest entry in the recency queue.
    stamp: u64,
}

/// The runs and their recency queue. Each use of a run pushes `(id, stamp)`; entries whose
/// stamp is no longer the run's are stale and skipped. The front's first live entry is the least
/// recently used run, so eviction pops from the front — amortised O(1), where a scan for the
/// oldest run cost O(capacity) under the lock on every new run once the store was full. The
/// queue is compacted when it grows past twice the capacity, which amortises to O(1) per use.
#[derive(Default)]
struct Inner {
    map: HashMap<Arc<str>, Entry>,
    queue: VecDeque<(Arc<str>, u64)>,
    next: u64,
    /// Response ids the gateway answered, with the run that answered each ([`RunStore::responded`]).
    responses: HashMap<Box<str>, Arc<str>>,
    /// The same ids, oldest first: at most the store's capacity are kept.
    response_order: VecDeque<Box<str>>,
}

impl Inner {
    fn is_live(&self, id: &str, stamp: u64) -> bool {
        self.map.get(id).is_some_and(|e| e.stamp == stamp)
    }

    fn touch(&mut self, id: Arc<str>) -> u64 {
        self.next += 1;
        self.queue.push_back((id, self.next));
        self.next
    }

    fn compact(&mut self, capacity: usize) {
        if self.queue.len() > 2 * capacity + 16 {
            let queue = std::mem::take(&mut self.queue);
            self.queue = queue
                .into_iter()
                .filter(|(id, stamp)| self.is_live(id, *stamp))
                .collect();
        }
    }
}

/// The bounded, expiring store of runs.
pub struct RunStore {
    inner: Mutex<Inner>,
    capacity: usize,
    ttl: Duration,
    monitor: MonitorConfig,
    budget: BudgetLimits,
    policy: Policy,
    evicted: std::sync::atomic::AtomicU64,
    /// How runs went through the shared store (`[state]`), for `/metrics`.
    pub shared: ShareStats,
    /// What the runs learn of their sources, kept for the process (issue 33).
    trust: TrustMemory,
}

/// Counts of runs read from and written to the store replicas share (see `crate::sharing`).
#[derive(Debug, Default)]
pub struct ShareStats {
    /// Requests that found a newer state of their run in the store than this replica had.
    pub loaded: std::sync::atomic::AtomicU64,
    /// Runs written back.
    pub stored: std::sync::atomic::AtomicU64,
    /// Writes that lost a compare-and-set to another replica and were re-applied.
    pub conflicts: std::sync::atomic::AtomicU64,
    /// Writes still conflicting after every attempt (the local state stands).
    pub contended: std::sync::atomic::AtomicU64,
}

impl ShareStats {
    /// `/metrics` lines.
    pub fn render(&self) -> String {
        use std::sync::atomic::Ordering::Relaxed;
        format!(
            "# HELP selfheal_state_runs_loaded_total Requests that continued a run from a newer state another replica wrote.\n\
             # TYPE selfheal_state_runs_loaded_total counter\nselfheal_state_runs_loaded_total {}\n\
             # HELP selfheal_state_runs_stored_total Run states written to the shared store.\n\
             # TYPE selfheal_state_runs_stored_total counter\nselfheal_state_runs_stored_total {}\n\
             # HELP selfheal_state_run_conflicts_total Run writes that lost to another replica's and were re-applied on its state.\n\
             # TYPE selfheal_state_run_conflicts_total counter\nselfheal_state_run_conflicts_total {}\n\
             # HELP selfheal_state_run_contended_total Run writes given up after every attempt conflicted (the local state stands).\n\
             # TYPE selfheal_state_run_contended_total counter\nselfheal_state_run_contended_total {}\n",
            self.loaded.load(Relaxed),
            self.stored.load(Relaxed),
            self.conflicts.load(Relaxed),
            self.contended.load(Relaxed),
        )
    }
}

impl std::fmt::Debug for RunStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunStore")
            .field("capacity", &self.capacity)
            .field("live", &self.len())
            .finish()
    }
}

impl RunStore {
    /// A store of at most `capacity` runs that forgets runs idle for `ttl`.
    pub fn new(
        capacity: usize,
        ttl: Duration,
        monitor: MonitorConfig,
        budget: BudgetLimits,
        policy: Policy,
    ) -> RunStore {
        RunStore {
            inner: Mutex::new(Inner::default()),
            capacity: capacity.max(1),
            ttl,
            monitor,
            budget,
            policy,
            evicted: std::sync::atomic::AtomicU64::new(0),
            shared: ShareStats::default(),
            trust: TrustMemory::default(),
        }
    }

    /// The trust store the runs of this process start from and report to.
    pub fn trust(&self) -> &TrustMemory {
        &self.trust
    }

    /// The run's state, created if new or expired (for no tenant; see [`RunStore::get_for`]).
    pub fn get(&self, id: &str, now: Instant) -> Arc<Mutex<RunState>> {
        self.get_for(id, "", now)
    }

    /// Whether `id` is a live run created for `tenant`: a client that sends back the
    /// `x-selfheal-run` it was answered continues that run, and no other tenant can.
    pub fn owned_by(&self, id: &str, tenant: &str, now: Instant) -> bool {
        let inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        inner
            .map
            .get(id)
            .is_some_and(|e| &*e.tenant == tenant && now.duration_since(e.last_seen) < self.ttl)
    }

    /// Remembers that the run `run` sent the Responses answer `id`, so that a request
    /// continuing it (`previous_response_id`) continues the run ([`RunStore::run_of_response`]).
    /// At most the store's capacity of ids are kept, the oldest forgotten first.
    pub fn responded(&self, id: &str, run: &str) {
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let inner = &mut *inner;
        let Some((run, _)) = inner.map.get_key_value(run) else {
            return;
        };
        let run = run.clone();
        if inner.responses.insert(id.into(), run).is_none() {
            inner.response_order.push_back(id.into());
        }
        while inner.response_order.len() > self.capacity {
            if let Some(old) = inner.response_order.pop_front() {
                inner.responses.remove(&old);
            }
        }
    }

    /// The live run of `tenant` that sent the Responses answer `id`: a client continuing that
    /// answer (`previous_response_id`) continues its run. `None` for an id the gateway did not
    /// answer (or has forgotten), a run gone, or another tenant's run.
    pub fn run_of_response(&self, id: &str, tenant: &str, now: Instant) -> Option<String> {
        let run = {
            let inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
            inner.responses.get(id)?.clone()
        };
        self.owned_by(&run, tenant, now).then(|| run.to_string())
    }

    /// The run's state, created for `tenant` if new or expired. Creating a run first drops
    /// expired runs at the front of the recency queue, then the least recently used while the
    /// store is full.
    pub fn get_for(&self, id: &str, tenant: &str, now: Instant) -> Arc<Mutex<RunState>> {
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let inner = &mut *inner;
        if let Some((key, e)) = inner.map.get_key_value(id)
            && now.duration_since(e.last_seen) < self.ttl
        {
            let (key, state) = (key.clone(), e.state.clone());
            let stamp = inner.touch(key.clone());
            if let Some(e) = inner.map.get_mut(&key) {
                e.stamp = stamp;
                e.last_seen = now;
            }
            inner.compact(self.capacity);
            return state;
        }
        let state = self.detached(tenant);
        self.insert(inner, id, tenant, state.clone(), now);
        state
    }

    /// A fresh run of `tenant` that is not in the store: for a request that does not name its
    /// run (no label, no tool call yet), which has no state worth sharing until it is answered
    /// with a tool call ([`RunStore::adopt`]). A plain chat request never takes a slot of the
    /// store, so it cannot push a real run out.
    pub fn detached(&self, tenant: &str) -> Arc<Mutex<RunState>> {
        Arc::new(Mutex::new(RunState::with_trust(
            self.monitor.clone(),
            self.budget,
            self.policy.clone(),
            Some((&self.trust, tenant)),
        )))
    }

    /// Stores the detached run `state` under `id` for `tenant` unless a live run has that name
    /// already; the first name it is stored under is its name (what it is shared under), a
    /// later one a second key to it. A run that named itself by nothing is stored under the id
    /// its first answer went out with and keyed by the name of the first tool call it was
    /// answered with; what it did in its first request (a re-ask is a recovery) carries on into
    /// the next. Whether it was stored under `id`.
    pub fn adopt(
        &self,
        state: &Arc<Mutex<RunState>>,
        id: &str,
        tenant: &str,
        now: Instant,
    ) -> bool {
        let mut guard = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let inner = &mut *guard;
        if inner
            .map
            .get(id)
            .is_some_and(|e| now.duration_since(e.last_seen) < self.ttl)
        {
            return false;
        }
        self.insert(inner, id, tenant, state.clone(), now);
        drop(guard);
        let mut st = state.lock().unwrap_or_else(|p| p.into_inner());
        if st.share.key.is_none() {
            st.share.key = Some((Arc::from(tenant), Arc::from(id)));
        }
        true
    }

    /// Makes `id` of `tenant` a second key to the run `state` (in place of any run by that
    /// name): a link to a run stored under another name, read from the shared store
    /// (`crate::sharing::load`).
    pub(crate) fn link(&self, id: &str, state: &Arc<Mutex<RunState>>, tenant: &str, now: Instant) {
        let mut guard = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        self.insert(&mut guard, id, tenant, state.clone(), now);
    }

    /// Inserts `state` under `id`, first dropping expired runs at the front of the recency
    /// queue, then the least recently used while the store is full.
    fn insert(
        &self,
        inner: &mut Inner,
        id: &str,
        tenant: &str,
        state: Arc<Mutex<RunState>>,
        now: Instant,
    ) {
        let mut dropped = 0u64;
        while let Some((front, stamp)) = inner.queue.front().cloned() {
            if !inner.is_live(&front, stamp) {
                inner.queue.pop_front();
                continue;
            }
            let expired = inner
                .map
                .get(&front)
                .is_some_and(|e| now.duration_since(e.last_seen) >= self.ttl);
            let full = inner.map.len() >= self.capacity && !inner.map.contains_key(id);
            if !(expired || full) {
                break;
            }
            inner.queue.pop_front();
            inner.map.remove(&front);
            if &*front != id {
                dropped += 1;
            }
        }
        if dropped > 0 {
            self.evicted
                .fetch_add(dropped, std::sync::atomic::Ordering::Relaxed);
        }
        let key: Arc<str> = Arc::from(id);
        let stamp = inner.touch(key.clone());
        inner.map.insert(
            key,
            Entry {
                state,
                tenant: Arc::from(tenant),
                last_seen: now,
                stamp,
            },
        );
        inner.compact(self.capacity);
    }

    /// How long an idle run is kept (its time to live in a shared store too).
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// A run of `tenant` read back from [`RunState::to_bytes`] under this store's monitor
    /// thresholds and policy.
    pub fn resume(
        &self,
        bytes: &[u8],
        tenant: &str,
    ) -> Result<RunState, selfheal_core::ResumeError> {
        RunState::resumed(
            bytes,
            self.monitor.clone(),
            self.policy.clone(),
            Some((&self.trust, tenant)),
        )
    }

    /// Runs held now.
    pub fn len(&self) -> usize {
        self.inner.lock().map(|m| m.map.len()).unwrap_or(0)
    }

    /// Whether no run is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Runs dropped for capacity or expiry so far.
    pub fn evicted(&self) -> u64 {
        self.evicted.load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// The per-deployment secret that keys run ids: kept as the MAC already keyed with it, so
/// that an id costs hashing the opening only, not the key's two blocks again; and the ids
/// made lately, by the exact bytes they were made of, so that a conversation's every next
/// request (which names its run the same) is a lookup, not a MAC.
#[derive(Clone)]
pub(crate) struct RunKey(Option<Hmac<Sha256>>, Arc<Mutex<IdCache>>);

/// Run ids by the bytes their MAC was computed over ([`run_id_of`]): the whole input, so a hit
/// is the id the MAC would give.
pub(crate) type IdCache = BoundedMap<Arc<str>>;

/// Most run ids remembered, most input bytes held, and the longest input kept (an opening of a
/// few KB is common; a huge one is hashed each time rather than held).
const ID_LIMITS: Limits = Limits {
    entries: 8_192,
    bytes: 8 * 1024 * 1024,
    entry_bytes: 16 * 1024,
};

impl std::fmt::Debug for RunKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RunKey(..)")
    }
}

impl RunKey {
    /// A key derived from a configured secret (stable across restarts).
    pub(crate) fn from_secret(secret: &str) -> RunKey {
        RunKey::keyed(&Sha256::digest(secret.as_bytes()))
    }

    fn keyed(key: &[u8]) -> RunKey {
        RunKey(
            <Hmac<Sha256> as Mac>::new_from_slice(key).ok(),
            Arc::new(Mutex::new(IdCache::new(ID_LIMITS))),
        )
    }

    /// A random key (run ids do not survive a restart).
    pub(crate) fn random() -> Result<RunKey, getrandom::Error> {
        let mut k = [0u8; 32];
        getrandom::fill(&mut k)?;
        Ok(RunKey::keyed(&k))
    }
}

/// The opening of a chat conversation, as [`run_id_of`] reads it: its first system and first
/// user message (`(role, raw content)`).
pub(crate) fn chat_opening(messages: &[Message<'_>]) -> Vec<(&'static str, Vec<u8>)> {
    ["system", "user"]
        .into_iter()
        .filter_map(|role| {
            let m = messages.iter().find(|m| m.role() == role)?;
            Some((
                role,
                m.content
                    .map_or_else(Vec::new, |c| c.get().as_bytes().to_vec()),
            ))
        })
        .collect()
}

/// The first tool call the model issued in a chat conversation, `(id, tool name)`.
pub(crate) fn chat_first_call(messages: &[Message<'_>]) -> Option<(String, String)> {
    messages
        .iter()
        .filter(|m| m.role() == "assistant")
        .find_map(Message::first_call)
}

/// Whether a request names its run (see [`run_id_of`]): by a label, or by a tool call already
/// in the conversation. A request that does not gets a fresh run, which takes the name of the
/// first call it answers with ([`RunStore::adopt`]).
pub(crate) fn names_its_run(label: Option<&str>, first_call: Option<(&str, &str)>) -> bool {
    label.map(str::trim).is_some_and(|l| !l.is_empty()) || first_call.is_some()
}

/// The run id within `tenant` of a chat conversation: keyed by the `x-selfheal-run` label
/// when the client sent one, else by the first tool call the model issued in it (see
/// [`run_id_of`]). A conversation with no tool call yet gets a fresh run. The dialects name
/// their runs through [`crate::pipeline::name_run`]; this is the chat case, for the tests.
#[cfg(test)]
pub(crate) fn run_id(
    key: &RunKey,
    tenant: &str,
    header: Option<&str>,
    messages: &[Message<'_>],
) -> String {
    let opening = chat_opening(messages);
    let opening: Vec<(&str, &[u8])> = opening.iter().map(|(t, b)| (*t, &b[..])).collect();
    let first = chat_first_call(messages);
    let call = first
        .as_ref()
        .map(|(id, name)| (id.as_str(), name.as_str()));
    run_id_of(key, tenant, header, &opening, call)
}

/// The run id within `tenant`, for any API.
///
/// Named by the caller's `label` when it gave one (`x-selfheal-run`, a Responses
/// `conversation`). Else by the conversation's first tool call (`first_call`: its id, which
/// providers make unique, and its tool's name), together with its `opening` (`(tag, bytes)`
/// pairs: the first system and user messages, or a Responses request's `instructions` and
/// first input) — so an upstream that numbers its calls `call_0`, `call_1`... in every
/// conversation does not join two either. Opening text alone never names a run: two
/// conversations that open alike under one key (many end users behind one application key,
/// agents with a fixed system prompt) would share one run, and one's tool failures would end
/// the other's conversation (issue 30). A conversation with no tool call yet has no state worth
/// sharing: it gets a fresh, random id. Always scoped by tenant, under the per-deployment key.
pub(crate) fn run_id_of(
    key: &RunKey,
    tenant: &str,
    label: Option<&str>,
    opening: &[(&str, &[u8])],
    first_call: Option<(&str, &str)>,
) -> String {
    let label = label.map(str::trim).filter(|h| !h.is_empty());
    let (Some(mac), true) = (&key.0, label.is_some() || first_call.is_some()) else {
        return fresh_run_id();
    };
    // What the MAC reads: each field tagged and length-prefixed.
    let mut input = Vec::with_capacity(
        64 + tenant.len()
            + opening
                .iter()
                .map(|(t, b)| t.len() + b.len() + 8)
                .sum::<usize>(),
    );
    let mut field = |tag: &[u8], bytes: &[u8]| {
        input.extend_from_slice(tag);
        input.extend_from_slice(&(bytes.len() as u64).to_le_bytes());
        input.extend_from_slice(bytes);
    };
    field(b"tenant", tenant.as_bytes());
    match (label, first_call) {
        (Some(h), _) => {
            let label: String = h.chars().take(128).collect();
            field(b"label", label.as_bytes());
        }
        (None, Some((id, name))) => {
            for (tag, bytes) in opening {
                field(tag.as_bytes(), bytes);
            }
            field(b"call_id", id.as_bytes());
            field(b"call_name", name.as_bytes());
        }
        (None, None) => {}
    }
    let cache = || key.1.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(id) = cache().get(&input) {
        return id.to_string();
    }
    let mut mac = mac.clone();
    mac.update(&input);
    let tag = mac.finalize().into_bytes();
    let id = format!("r-{}", crate::auth::hex(&tag[..12]));
    cache().insert(input, Arc::from(id.as_str()));
    id
}

/// A run id nobody else has: random (or, should the system's randomness fail, a process-wide
/// counter with the time, still never repeated within the process).
fn fresh_run_id() -> String {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let mut b = [0u8; 12];
    if getrandom::fill(&mut b).is_err() {
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        b[..8].copy_from_slice(&n.to_le_bytes());
        b[8..].copy_from_slice(&t.to_le_bytes()[..4]);
    }
    format!("r-{}", crate::auth::hex(&b))
}

/// The wire side of a run's recovery: step ids, the value waiting for its cross-check, the
/// steps already escalated, and what the next request has to carry out.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct Wire {
    pub(crate) steps: HashMap<String, u32>,
    pub(crate) pending: Option<Box<Pending>>,
    pub(crate) escalated: HashSet<u32>,
    /// Steps the controller moved to the substitute because the primary's data was stale: the
    /// substitute's answers are not checked back against the source known to be old (as
    /// in-process).
    pub(crate) trusted: HashSet<u32>,
    /// Tool results the gateway repaired, by `tool_call_id`, with the text the model reads
    /// instead (at most [`MAX_REPAIRED`], oldest first out).
    pub(crate) repaired: std::collections::VecDeque<(String, String)>,
    /// The last value of each call of a tool the operator marked [`ToolConfig::reread`](crate::config::ToolConfig::reread), that
    /// the run went on with (at most [`MAX_HELD`], oldest first out): what the read before
    /// answering reads again.
    pub(crate) values: std::collections::VecDeque<Held>,
    /// The values still to read again before the run answers.
    pub(crate) rereads: std::collections::VecDeque<Held>,
    /// The read again that is awaited.
    pub(crate) reread: Option<Box<Held>>,
    pub(crate) next: Next,
}

/// A value waiting for its cross-check.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub(crate) struct Pending {
    pub(crate) step: u32,
    pub(crate) tool: String,
    pub(crate) args: Value,
    pub(crate) value: Value,
    pub(crate) required: Vec<String>,
    /// The tool asked to confirm it.
    pub(crate) against: String,
    pub(crate) tolerance: selfheal_core::Tolerance,
    /// The value is the gateway's repair of an answer that did not parse (observed already as
    /// that failure): only the verdict is observed.
    pub(crate) repaired: bool,
}

/// A value the run went on with, as the read before answering reads it again.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub(crate) struct Held {
    pub(crate) step: u32,
    pub(crate) tool: String,
    pub(crate) args: Value,
    pub(crate) value: Value,
}

/// What the next request carries out for the controller.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Next {
    /// Guidance lines (the ladder's actions, a cross-check request).
    pub guidance: Vec<String>,
    /// Send this request to the fallback target.
    pub escalate: bool,
    /// The run ends here.
    pub stop: Option<Stop>,
    /// The recovery actions taken, by name (for the answer's `selfheal.actions`).
    pub actions: Vec<ActionKind>,
    /// Tool results to replace with their repair, by `tool_call_id`.
    pub replaced: Vec<(String, String)>,
    /// The tools this request asks the model to call again with the same arguments (a retry, a
    /// cross-check, a read before answering): such a call is not a repetition
    /// ([`crate::heal::Answered`]).
    pub again: Vec<String>,
    /// The calls, `(tool, canonical hash of the arguments)`, whose values the run took as it
    /// read this request's results ([`crate::heal::Answered`]).
    pub taken: Vec<(String, u64)>,
    /// How long to hold this request's model call first, in milliseconds: the longest delay
    /// of the controller's retries of tool failures (the client calls the tool again only
    /// after the model's answer). 0: no wait.
    #[serde(default)]
    pub wait_ms: u64,
    /// A tool asked to be called again only after a wait (its `Retry-After`) longer than the
    /// gateway holds a request: `(tool, the wait asked, in ms)`. The core routed around the
    /// retry; this is reported, never shortened.
    #[serde(default)]
    pub too_long: Option<(String, u64)>,
}

/// How the run ends now, when a directive ended it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Stop {
    /// Stop with a partial result: the controller degraded.
    Degrade(String),
    /// Stop: the controller aborted.
    Abort(String),
}

/// Most values a run keeps for its read before answering.
pub(crate) const MAX_HELD: usize = 64;

/// Most repaired tool results a run keeps replacing in the requests it forwards.
pub(crate) const MAX_REPAIRED: usize = 64;

/// What this gateway process has learned of its sources (issue 33, [`selfheal_core::Trust`]):
/// one store for every run, kept in process memory, each tenant's sources under the tenant's
/// scope ([`selfheal_core::Source::scoped`]): two tenants' tools named alike are different
/// tools, and what one tenant's runs saw never decides what another's claim. A run starts from
/// a copy of its tenant's part ([`TrustMemory::scoped`]) and reports the evidence it sees
/// (cross-checks, verdicts, contract breaches, outages) as it decides
/// ([`TrustMemory::report_scoped`]); the policy's `risk` reads it when a recovered value
/// nothing could check is to be claimed. Times are the gateway's own clock
/// (`AppState::now_ms`).
///
/// Two stores are kept: `own`, the evidence this replica's runs observed, and `view`, what runs
/// start from — `own` plus every other replica's own evidence when replicas share (`[state]`,
/// [`share_trust`]). A report goes into both at once, so a run never waits on
/// the store; the others' part of `view` is rebuilt in the background. Cloning shares it.
#[derive(Debug, Clone, Default)]
pub struct TrustMemory(pub(crate) Arc<TrustInner>);

/// The two stores of a [`TrustMemory`] (see there). Locks are taken `own` first, then `view`.
#[derive(Debug, Default)]
pub(crate) struct TrustInner {
    /// This replica's evidence only: what it shares with the others.
    pub(crate) own: Mutex<selfheal_core::Trust>,
    /// What runs start from: `own` plus what the other replicas shared.
    pub(crate) view: Mutex<selfheal_core::Trust>,
    /// Whether `own` changed since it was last shared.
    pub(crate) dirty: std::sync::atomic::AtomicBool,
}

impl TrustMemory {
    /// A copy of the store now, for a run to start from: this replica's evidence and, when
    /// replicas share, the others' as last refreshed.
    pub fn snapshot(&self) -> selfheal_core::Trust {
        self.0
            .view
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// What runs of `tenant` start from: the tenant's part of [`TrustMemory::snapshot`], its
    /// names unscoped.
    pub fn scoped(&self, tenant: &str) -> selfheal_core::Trust {
        self.0
            .view
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .scope(tenant)
    }

    /// This replica's own evidence (what it shares), without the others'.
    pub fn own(&self) -> selfheal_core::Trust {
        self.0.own.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Applies the evidence of a run of `tenant`, under the tenant's scope: to this replica's
    /// own store and to what runs start from.
    pub fn report_scoped(
        &self,
        tenant: &str,
        reports: &[selfheal_core::TrustReport],
        config: &selfheal_core::TrustConfig,
    ) {
        if reports.is_empty() {
            return;
        }
        let mut own = self.0.own.lock().unwrap_or_else(|p| p.into_inner());
        own.apply_scoped(tenant, reports, config);
        self.0
            .view
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .apply_scoped(tenant, reports, config);
        self.0
            .dirty
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

/// The shared tier's key of a replica's own trust evidence (its `origin` in hex).
const TRUST_PREFIX: &str = "trust:";

/// Least time a trust record lives without being published again.
const TRUST_MIN_TTL_MS: u64 = 60_000;

/// How long a trust record lives when evidence never decays (`half_life_ms = 0`).
const TRUST_NO_DECAY_TTL_MS: u64 = 7 * 24 * 3_600_000;

/// A replica's own trust evidence as it is shared: every source's weights decayed to `at`
/// (Unix ms), so that a replica with another process clock reads them right.
#[derive(serde::Serialize, serde::Deserialize)]
struct TrustWire {
    /// Layout version ([`selfheal_core::TRUST_VERSION`]).
    v: u32,
    /// Per source: its weights, `at_ms` on the Unix clock.
    s: Vec<(selfheal_core::Source, selfheal_core::Posterior)>,
}

/// Shares `trust` with the other replicas through `shared` (issue 34): learned trust is
/// eventually consistent, with a local tier, like the breakers' open circuits.
///
/// **What is shared, and why it neither loses nor double-counts evidence.** Trust is a Beta
/// posterior: weights of evidence (right, wrong; up, down), which merge by adding. Each replica
/// publishes only its *own* evidence — what its runs observed (`TrustMemory::own`) — under a key
/// of its own (`trust:{origin}`), so each record has one writer and last-writer-wins loses
/// nothing. What runs start from (`TrustMemory::snapshot`) is this replica's own evidence plus
/// every other live record, each counted once: never a record of this replica's, and never
/// a merged view (publishing a merged view would count the others' evidence again on every
/// round). Weights are decayed to the publishing time and stamped with Unix time, so replicas
/// with different process clocks decay them alike; the cap applies to the sum. A replica that
/// dies leaves its record until it expires (ten half-lives, when its evidence has decayed to
/// a thousandth): what it learned is not lost with it, and a restarted replica (a new origin)
/// does not count it twice, as its own store starts empty.
///
/// **How fresh.** A report reaches this replica's runs at once. The others see it after this
/// task publishes it (every `refresh`), the store's sync sends it (at once), the other
/// replica's sync reads it (its `refresh_ms`) and its task merges it (its `refresh`): at most
/// three refresh intervals plus two round trips (3 s by default). No request waits on Redis.
///
/// Nothing without a store: one process keeps its trust to itself, as before.
pub(crate) fn share_trust(
    trust: &TrustMemory,
    shared: selfheal_state::Shared,
    config: selfheal_core::TrustConfig,
    clock: crate::clock::Clock,
    refresh: std::time::Duration,
) {
    if shared.store().is_none() {
        return;
    }
    let Ok(handle) = tokio::runtime::Handle::try_current() else {
        return;
    };
    let weak = Arc::downgrade(&trust.0);
    handle.spawn(async move {
        let mut tier = TrustTier::new(shared, config);
        loop {
            tokio::time::sleep(refresh).await;
            let Some(inner) = weak.upgrade() else { return };
            let local = clock.now_ms();
            tier.refresh(&TrustMemory(inner), local, selfheal_state::unix_ms());
        }
    });
}

/// One replica's side of shared trust: what it last published and last merged.
pub(crate) struct TrustTier {
    shared: selfheal_state::Shared,
    config: selfheal_core::TrustConfig,
    /// When this replica's record was last published (Unix ms).
    published_ms: u64,
    /// The other replicas' records as last merged (key → payload).
    merged: std::collections::BTreeMap<String, String>,
}

impl TrustTier {
    pub(crate) fn new(
        shared: selfheal_state::Shared,
        config: selfheal_core::TrustConfig,
    ) -> TrustTier {
        TrustTier {
            shared,
            config,
            published_ms: 0,
            merged: std::collections::BTreeMap::new(),
        }
    }

    /// How long a record lives: ten half-lives (a week without decay), at least a minute.
    fn ttl_ms(&self) -> u64 {
        match self.config.half_life_ms {
            0 => TRUST_NO_DECAY_TTL_MS,
            h => h.saturating_mul(10).max(TRUST_MIN_TTL_MS),
        }
    }

    /// One round: publishes this replica's own evidence if it changed (or its record is half
    /// way to expiring), and rebuilds what runs start from if another replica's record changed.
    /// `local_ms` is the gateway's clock, `unix_ms` the wall clock.
    pub(crate) fn refresh(&mut self, trust: &TrustMemory, local_ms: u64, unix_ms: u64) {
        use std::sync::atomic::Ordering::Relaxed;
        let ttl = self.ttl_ms();
        let stale = unix_ms.saturating_sub(self.published_ms) >= ttl / 2;
        if trust.0.dirty.swap(false, Relaxed) || (stale && self.published_ms > 0) {
            let own = trust.own();
            let s = own
                .sources()
                .map(|(src, p)| {
                    let mut d = p.decayed(local_ms, &self.config);
                    d.at_ms = unix_ms;
                    (src.clone(), d)
                })
                .filter(|(_, d)| d.right + d.wrong + d.up + d.down > 1e-9)
                .collect();
            let wire = TrustWire {
                v: selfheal_core::TRUST_VERSION,
                s,
            };
            if let Ok(payload) = serde_json::to_string(&wire) {
                self.shared
                    .publish(&self.key(), payload, unix_ms.saturating_add(ttl));
                self.published_ms = unix_ms;
            }
        }
        let origin = self.shared.origin();
        let others: std::collections::BTreeMap<String, String> = self
            .shared
            .scan(TRUST_PREFIX, unix_ms)
            .into_iter()
            .filter(|(_, r)| r.origin != origin)
            .map(|(k, r)| (k, r.payload))
            .collect();
        if others != self.merged {
            self.merge(trust, &others, local_ms, unix_ms);
            self.merged = others;
        }
    }

    fn key(&self) -> String {
        format!("{TRUST_PREFIX}{:x}", self.shared.origin())
    }

    /// `view` = this replica's own evidence + each other record, its weights decayed to now and
    /// moved onto the gateway's clock. Holds `own`'s lock throughout, so a report made meanwhile
    /// is in both or waits.
    fn merge(
        &self,
        trust: &TrustMemory,
        others: &std::collections::BTreeMap<String, String>,
        local_ms: u64,
        unix_ms: u64,
    ) {
        let own = trust.0.own.lock().unwrap_or_else(|p| p.into_inner());
        let mut view = own.clone();
        for (key, payload) in others {
            let wire = match serde_json::from_str::<TrustWire>(payload) {
                Ok(w) if w.v == selfheal_core::TRUST_VERSION => w,
                // Another build's layout: left out, never read as something it is not.
                _ => {
                    tracing::debug!(target: "selfheal::state", key, "a trust record of another layout: left out");
                    continue;
                }
            };
            for (src, p) in &wire.s {
                let mut d = p.decayed(unix_ms, &self.config);
                d.at_ms = local_ms;
                view.merge(src, &d, &self.config);
            }
        }
        *trust.0.view.lock().unwrap_or_else(|p| p.into_inner()) = view;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    fn chat_id(key: &RunKey, tenant: &str, header: Option<&str>, messages: &Value) -> String {
        let body = serde_json::to_vec(&json!({"model": "m", "messages": messages})).unwrap();
        let req = crate::request::ChatRequest::parse(&body).unwrap();
        run_id(key, tenant, header, &req.messages)
    }

    fn called(id: &str) -> Value {
        json!({"role": "assistant", "content": null, "tool_calls": [{"id": id, "type": "function",
               "function": {"name": "search", "arguments": "{}"}}]})
    }

    /// A run moved between processes (written to bytes by one, read back by another) goes
    /// on as if it had stayed: the stuck tool warned at 3 in one process is hidden at 5 in
    /// the other, counting both processes' observations, and what the gateway keeps beside
    /// the core's run (results seen, counters, the last answer) comes back too.
    #[test]
    fn a_run_written_to_bytes_continues_in_another_process() {
        use selfheal_core::{Amounts, Input, Observation, ToolCall};
        let monitor = MonitorConfig::default();
        let mut st = RunState::new(monitor.clone(), BudgetLimits::unlimited());
        st.tell(Input::Offered(&["fetch_url", "web_search"]));
        let body = json!({"error": "search backend down"});
        let fail = |st: &mut RunState, i: u64| {
            let args = json!({"q": i});
            let mut rng = selfheal_core::SplitMix64::new(i);
            let mut breakers = Breakers::none();
            st.decide(
                Input::Observed(Observation::ToolFinished {
                    step: Some(0),
                    call: ToolCall::returned("web_search", &args, &body),
                    signal: None,
                    options: selfheal_core::Options {
                        can_replan: true,
                        retry_safe: true,
                        ..Default::default()
                    },
                    usage: Amounts::default(),
                }),
                i * 1_000,
                &mut rng,
                &mut breakers,
            );
            st.failures += 1;
            st.seen.insert(i);
        };
        for i in 0..3 {
            fail(&mut st, i);
        }
        st.last_response = Some(Responded {
            id: "resp_1".into(),
            calls: vec![json!({"type": "function_call", "call_id": "c1"})],
        });
        let warned = st.run.verdict(3_000);
        assert!(warned.hidden_tools.is_empty(), "{warned:?}");
        let bytes = st.to_bytes().unwrap();
        let mut moved = RunState::from_bytes(&bytes, monitor.clone(), Policy::default()).unwrap();
        assert_eq!(moved.failures, 3);
        assert!(moved.seen.contains(2));
        assert_eq!(moved.last_response, st.last_response);
        for i in 3..5 {
            fail(&mut moved, i);
        }
        let v = moved.run.verdict(5_000);
        assert_eq!(v.hidden_tools, vec!["web_search".to_string()], "{v:?}");
        assert!(
            v.guidance.iter().any(|g| g.text.contains("`fetch_url`")),
            "{v:?}"
        );
        // Another layout is refused, not misread.
        let mut other: Value = serde_json::from_slice(&bytes).unwrap();
        other["version"] = json!(STORED_VERSION + 1);
        let other = serde_json::to_vec(&other).unwrap();
        assert!(RunState::from_bytes(&other, monitor, Policy::default()).is_err());
    }

    /// A run's stored state carries its own trust evidence, not a copy of the trust store it
    /// started from: with the store full (1,024 sources) the run's bytes are what they are with
    /// it empty, and the run read back under the store judges every source as before. (The copy
    /// was about 100 bytes a source: 100 kB in every stored run.)
    #[test]
    fn a_stored_run_carries_its_own_trust_evidence_not_the_store() {
        use selfheal_core::{Evidence, Source, TrustConfig, TrustReport};
        let config = TrustConfig::default();
        let full = TrustMemory::default();
        let reports: Vec<TrustReport> = (0..selfheal_core::MAX_TRUST_SOURCES)
            .map(|i| TrustReport {
                source: Source::tool(&format!("tool_{i}")),
                evidence: Evidence::Disagreed,
                at_ms: 1_000,
            })
            .collect();
        full.report_scoped("t", &reports, &config);
        let run = |trust: &TrustMemory| {
            RunState::with_trust(
                MonitorConfig::default(),
                BudgetLimits::unlimited(),
                Policy::default(),
                Some((trust, "t")),
            )
        };
        let (empty, loaded) = (run(&TrustMemory::default()), run(&full));
        let bytes = loaded.to_bytes().unwrap();
        assert_eq!(bytes.len(), empty.to_bytes().unwrap().len());
        // For the deployment guide's sizing (`-- --nocapture`): what a copy of the store was.
        let copy = serde_json::to_vec(&full.snapshot()).unwrap().len();
        eprintln!(
            "a fresh run's state: {} bytes; the full store as JSON: {copy} bytes",
            bytes.len()
        );
        let back = RunState::resumed(
            &bytes,
            MonitorConfig::default(),
            Policy::default(),
            Some((&full, "t")),
        )
        .unwrap();
        let source = Source::tool("tool_7");
        assert_eq!(
            back.run.trust().posterior(&source, 1_000, &config),
            full.scoped("t").posterior(&source, 1_000, &config)
        );
        assert!(back.run.trust().p_right(&source, 1_000, &config) < config.prior_mean());
    }

    #[test]
    fn run_id_is_stable_over_a_growing_conversation_and_scoped_to_the_tenant() {
        let key = RunKey::from_secret("s");
        let id = |tenant: &str, header: Option<&str>, messages: Value| {
            chat_id(&key, tenant, header, &messages)
        };
        let a = json!([{"role": "system", "content": "s"}, {"role": "user", "content": "u"},
                       called("call_a")]);
        let mut b = a.clone();
        b.as_array_mut().unwrap().extend([
            json!({"role": "tool", "tool_call_id": "call_a", "content": "x"}),
            called("call_b"),
        ]);
        assert_eq!(id("t", None, a.clone()), id("t", None, b));
        assert_ne!(id("t", None, a.clone()), id("u", None, a.clone()));
        assert_eq!(
            id("t", Some("mine"), a.clone()),
            id("t", Some("mine"), json!([{"role": "user", "content": "z"}]))
        );
        assert_ne!(
            id("t", Some("mine"), a.clone()),
            id("u", Some("mine"), a.clone())
        );
        let other = RunKey::from_secret("other");
        assert_ne!(chat_id(&other, "t", None, &a), id("t", None, a.clone()));
        // Fixed key and input, fixed id: the construction is stable across releases.
        assert_eq!(id("t", Some("mine"), a.clone()).len(), 2 + 24);
    }

    /// Seen results stored by a gateway that kept a hash set beside the ring read back: the
    /// ring is what is remembered, the set is ignored.
    #[test]
    fn seen_results_stored_with_their_old_set_read_back() {
        let old = r#"{"set": [7, 9], "order": [7, 9], "forgotten": 3}"#;
        let seen: SeenResults = serde_json::from_str(old).unwrap();
        assert!(seen.contains(7) && seen.contains(9) && !seen.contains(8));
        assert_eq!((seen.len(), seen.forgotten()), (2, 3));
    }

    /// A bounded map keeps what fits, refuses a key longer than its limit, and starts over
    /// when one more entry or byte would pass its bounds.
    #[test]
    fn a_bounded_map_starts_over_when_full() {
        let mut m = BoundedMap::new(Limits {
            entries: 3,
            bytes: 10,
            entry_bytes: 6,
        });
        m.insert(b"abc".to_vec(), 1);
        m.insert(b"toolong".to_vec(), 2);
        assert_eq!((m.get(b"abc"), m.get(b"toolong")), (Some(&1), None));
        m.insert(b"defg".to_vec(), 3);
        m.insert(b"hi".to_vec(), 4);
        assert_eq!((m.get(b"abc"), m.get(b"hi")), (Some(&1), Some(&4)));
        // A fourth entry would pass the count: the map starts over with it alone.
        m.insert(b"jk".to_vec(), 5);
        assert_eq!((m.get(b"abc"), m.get(b"jk")), (None, Some(&5)));
        // 2 + 6 bytes fit; 3 more would pass the 10 bytes, with room in the count.
        m.insert(b"lmnopq".to_vec(), 6);
        assert_eq!(m.get(b"lmnopq"), Some(&6));
        m.insert(b"rst".to_vec(), 7);
        assert_eq!((m.get(b"jk"), m.get(b"rst")), (None, Some(&7)));
    }

    /// A remembered fingerprint is the hash's: the same the first time and the next, for a
    /// short result and for one too long to keep; and different inputs differ.
    #[test]
    fn a_remembered_fingerprint_is_the_hash() {
        let long = "x".repeat(FINGERPRINT_LIMITS.entry_bytes + 1);
        for (id, content) in [("call_fp_1", "{\"ok\":true}"), ("call_fp_2", long.as_str())] {
            let want = SeenResults::hash(id, content);
            assert_eq!(SeenResults::fingerprint(id, content), want);
            assert_eq!(SeenResults::fingerprint(id, content), want);
        }
        // The separator keeps the id and the content apart.
        assert_ne!(
            SeenResults::fingerprint("call_fp_3", "ab"),
            SeenResults::fingerprint("call_fp_3a", "b")
        );
        let mut b = [0u8; 8];
        b.copy_from_slice(&Sha256::digest(b"call_fp_1\0{\"ok\":true}")[..8]);
        assert_eq!(
            SeenResults::fingerprint("call_fp_1", "{\"ok\":true}"),
            u64::from_le_bytes(b)
        );
    }

    /// The cache of ids answers what the MAC would: the first id (a MAC) and the next (a
    /// lookup) are the MAC of the fields fed one by one, and a second key's ids are its own.
    #[test]
    fn a_cached_run_id_is_the_macs() {
        let key = RunKey::from_secret("s");
        let opening: [(&str, &[u8]); 2] = [("system", b"\"sys\""), ("user", b"\"go\"")];
        let call = Some(("call_1", "search"));
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(&Sha256::digest(b"s")).unwrap();
        let fields: [(&[u8], &[u8]); 5] = [
            (b"tenant", b"t"),
            (b"system", b"\"sys\""),
            (b"user", b"\"go\""),
            (b"call_id", b"call_1"),
            (b"call_name", b"search"),
        ];
        for (tag, bytes) in fields {
            mac.update(tag);
            mac.update(&(bytes.len() as u64).to_le_bytes());
            mac.update(bytes);
        }
        let want = format!("r-{}", crate::auth::hex(&mac.finalize().into_bytes()[..12]));
        assert_eq!(run_id_of(&key, "t", None, &opening, call), want);
        assert_eq!(key.1.lock().unwrap().map.len(), 1, "the first id is kept");
        assert_eq!(
            run_id_of(&key, "t", None, &opening, call),
            want,
            "the cached one"
        );
        let other = RunKey::from_secret("other");
        assert_ne!(run_id_of(&other, "t", None, &opening, call), want);
        assert_ne!(run_id_of(&key, "u", None, &opening, call), want);
        assert_ne!(run_id_of(&key, "t", Some("label"), &opening, call), want);
    }

    /// Issue 30: two conversations of one tenant with the same opening never share a run —
    /// not with different first calls, and not before any call (each request a fresh run).
    #[test]
    fn issue_30_opening_text_alone_never_joins_two_conversations() {
        let key = RunKey::from_secret("s");
        let opening = json!([{"role": "system", "content": "You are a helpful agent."},
                             {"role": "user", "content": "hi"}]);
        let with_call = |call: &str| {
            let mut m = opening.clone();
            m.as_array_mut().unwrap().push(called(call));
            m
        };
        let no_call_1 = chat_id(&key, "key:app", None, &opening);
        let no_call_2 = chat_id(&key, "key:app", None, &opening);
        assert_ne!(no_call_1, no_call_2, "no call yet: a fresh run each time");
        assert_ne!(
            chat_id(&key, "key:app", None, &with_call("call_1")),
            chat_id(&key, "key:app", None, &with_call("call_2"))
        );
        assert_eq!(
            chat_id(&key, "key:app", None, &with_call("call_1")),
            chat_id(&key, "key:app", None, &with_call("call_1"))
        );
        // An upstream that numbers its calls alike in every conversation: the opening still
        // tells them apart.
        let mut other = with_call("call_0");
        other[1]["content"] = json!("hello");
        assert_ne!(
            chat_id(&key, "key:app", None, &with_call("call_0")),
            chat_id(&key, "key:app", None, &other)
        );
    }

    /// A store of `capacity` runs with a minute's TTL and the default monitor, budget and policy.
    fn store(capacity: usize) -> RunStore {
        RunStore::new(
            capacity,
            Duration::from_secs(60),
            MonitorConfig::default(),
            BudgetLimits::defaults(),
            Policy::default(),
        )
    }

    #[test]
    fn a_run_is_owned_by_the_tenant_it_was_created_for() {
        let s = store(3);
        let now = Instant::now();
        s.get_for("r-1", "key:alice", now);
        assert!(s.owned_by("r-1", "key:alice", now));
        assert!(!s.owned_by("r-1", "key:bob", now));
        assert!(!s.owned_by("r-2", "key:alice", now));
        assert!(!s.owned_by("r-1", "key:alice", now + Duration::from_secs(61)));
    }

    #[test]
    fn an_answered_response_leads_back_to_its_run_for_its_tenant_only_and_ids_are_bounded() {
        let s = store(2);
        let now = Instant::now();
        s.get_for("r-1", "key:alice", now);
        s.responded("resp_1", "r-1");
        s.responded("resp_x", "r-gone"); // no such run: nothing to lead back to
        assert_eq!(
            s.run_of_response("resp_1", "key:alice", now).as_deref(),
            Some("r-1")
        );
        assert_eq!(s.run_of_response("resp_1", "key:bob", now), None);
        assert_eq!(s.run_of_response("resp_x", "key:alice", now), None);
        let later = now + Duration::from_secs(61);
        assert_eq!(
            s.run_of_response("resp_1", "key:alice", later),
            None,
            "expired"
        );
        // At most the store's capacity of ids: the oldest is forgotten first.
        s.responded("resp_2", "r-1");
        s.responded("resp_3", "r-1");
        assert_eq!(s.run_of_response("resp_1", "key:alice", now), None);
        assert_eq!(
            s.run_of_response("resp_3", "key:alice", now).as_deref(),
            Some("r-1")
        );
    }

    #[test]
    fn a_response_keeps_its_calls_reduced_and_bounded() {
        let call = |i: usize, args: &str| {
            json!({"type": "function_call", "id": format!("fc_{i}"), "call_id": format!("c{i}"),
                   "name": "search", "arguments": args, "status": "completed"})
        };
        let mut output = vec![json!({"type": "message", "content": []}), call(0, "{}")];
        let r = Responded::of(&json!({"id": "resp_1", "output": output.clone()})).unwrap();
        assert_eq!(r.id, "resp_1");
        assert_eq!(
            r.calls,
            vec![
                json!({"type": "function_call", "call_id": "c0", "name": "search",
                        "arguments": "{}"})
            ]
        );
        assert_eq!(Responded::of(&json!({"output": output.clone()})), None);
        let long = "r".repeat(MAX_RESPONSE_ID_BYTES + 1);
        assert_eq!(Responded::of(&json!({"id": long, "output": []})), None);
        output.extend((1..100).map(|i| call(i, "{}")));
        let r = Responded::of(&json!({"id": "resp_2", "output": output})).unwrap();
        assert_eq!(r.calls.len(), MAX_RESPONDED_CALLS);
        let big = "x".repeat(MAX_RESPONDED_BYTES);
        let r = Responded::of(&json!({"id": "resp_3", "output": [call(0, "{}"), call(1, &big)]}));
        assert_eq!(
            r.unwrap().calls.len(),
            1,
            "past the bytes bound, no more calls"
        );
    }

    #[test]
    fn an_input_answers_a_response_when_its_results_are_all_of_the_responses_calls() {
        let r = Responded {
            id: "resp_1".into(),
            calls: vec![json!({"type": "function_call", "call_id": "c1", "name": "a"})],
        };
        let out = |id: &str| json!({"type": "function_call_output", "call_id": id, "output": "1"});
        let msg = json!({"role": "user", "content": "and then?"});
        assert!(r.answered_by(&[out("c1")]));
        assert!(r.answered_by(&[msg.clone(), out("c1")]));
        assert!(
            !r.answered_by(&[out("c1"), out("c9")]),
            "a result of another call"
        );
        assert!(!r.answered_by(&[msg]), "no result");
        let own = json!({"type": "function_call", "call_id": "c1", "name": "a"});
        assert!(
            !r.answered_by(&[own, out("c1")]),
            "the input carries its calls"
        );
    }

    /// Issue 33: learned trust is kept per tenant. What one tenant's runs saw of a tool (a
    /// verifier accepting its value forty times) lifts it for that tenant's later runs only; a
    /// run of another tenant — whose tool of that name is another program — starts from the
    /// prior, so nothing it recovers from that tool is claimed on the first tenant's record.
    #[test]
    fn what_one_tenants_runs_saw_never_decides_another_tenants_claims() {
        use selfheal_core::{Amounts, Judgement, Observation, Options, Source, ToolCall};
        let s = store(8);
        let config = selfheal_core::TrustConfig::default();
        let (mut rng, mut breakers) = (selfheal_core::SplitMix64::new(1), Breakers::none());
        let (args, value) = (json!({"query": "q"}), json!({"hits": 3}));
        for i in 0..40u64 {
            let run = s.detached("key:alice");
            let mut st = run.lock().unwrap();
            let observed = [
                Observation::ToolFinished {
                    step: Some(0),
                    call: ToolCall::returned("search", &args, &value),
                    signal: None,
                    options: Options::default(),
                    usage: Amounts::default(),
                },
                Observation::Verified {
                    step: Some(0),
                    verifier: "schema",
                    judgement: Judgement::Accept,
                    options: Options::default(),
                },
            ];
            for o in observed {
                st.decide(Input::Observed(o), 1_000 + i, &mut rng, &mut breakers);
            }
        }
        let source = Source::tool("search");
        let p = |tenant: &str| {
            let run = s.detached(tenant);
            let st = run.lock().unwrap();
            st.run.trust().p_right(&source, 1_040, &config)
        };
        assert!(p("key:alice") >= 0.99, "alice's record: {}", p("key:alice"));
        for other in ["key:bob", "", "key:alic"] {
            assert_eq!(
                p(other),
                config.prior_mean(),
                "{other:?} starts from the prior"
            );
        }
    }

    /// Issue 30: a request that does not name its run takes no slot of the store until it is
    /// answered with a tool call; then its run is stored under that call's name, unless a live
    /// run has it.
    #[test]
    fn a_detached_run_takes_no_slot_until_adopted() {
        let s = store(2);
        let now = Instant::now();
        let kept = s.get_for("r-kept", "t", now);
        for _ in 0..10 {
            let _ = s.detached("t");
        }
        assert_eq!(s.len(), 1, "plain requests push no run out");
        let fresh = s.detached("t");
        s.adopt(&fresh, "r-call", "t", now);
        assert!(Arc::ptr_eq(&fresh, &s.get_for("r-call", "t", now)));
        assert!(s.owned_by("r-call", "t", now) && !s.owned_by("r-call", "u", now));
        s.adopt(&s.detached("t"), "r-call", "t", now);
        assert!(
            Arc::ptr_eq(&fresh, &s.get_for("r-call", "t", now)),
            "a live run keeps its name"
        );
        assert!(Arc::ptr_eq(&kept, &s.get_for("r-kept", "t", now)));
    }

    #[test]
    fn seen_results_are_bounded_and_count_what_they_forget() {
        let mut s = SeenResults::default();
        for i in 0..(SEEN_CAPACITY + 10) {
            s.insert(SeenResults::fingerprint(&format!("c{i}"), "ok"));
        }
        assert_eq!(s.len(), SEEN_CAPACITY);
        assert_eq!(s.forgotten(), 10);
        assert!(!s.contains(SeenResults::fingerprint("c0", "ok")));
        assert!(s.contains(SeenResults::fingerprint("c20", "ok")));
    }

    #[test]
    fn store_is_bounded() {
        let s = store(3);
        let now = Instant::now();
        for i in 0..10 {
            s.get(&format!("r{i}"), now + Duration::from_millis(i));
        }
        assert_eq!(s.len(), 3);
        assert_eq!(s.evicted(), 7);
    }

    #[test]
    fn the_least_recently_used_run_goes_first_and_the_queue_stays_bounded() {
        let ttl = Duration::from_secs(60);
        let s = RunStore::new(
            3,
            ttl,
            MonitorConfig::default(),
            BudgetLimits::defaults(),
            Policy::default(),
        );
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let a = s.get("a", at(0));
        s.get("b", at(1));
        s.get("c", at(2));
        // Using `a` again makes `b` the least recently used.
        for i in 0..1_000 {
            assert!(Arc::ptr_eq(&a, &s.get("a", at(3 + i))));
        }
        s.get("d", at(2_000));
        assert_eq!(s.evicted(), 1);
        assert!(Arc::ptr_eq(&a, &s.get("a", at(2_001))), "a was kept");
        let c = s.get("c", at(2_002));
        let b = s.get("b", at(2_003));
        assert_eq!(
            s.evicted(),
            2,
            "b was gone and came back new, pushing d out"
        );
        assert!(!Arc::ptr_eq(&c, &b));
        assert!(s.inner.lock().unwrap().queue.len() <= 2 * 3 + 16 + 1);
        // Runs idle past the TTL are dropped when a new run comes in.
        s.get("e", at(2_003) + ttl);
        assert_eq!(s.len(), 1);
        assert_eq!(s.evicted(), 5);
    }
}
