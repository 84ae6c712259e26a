//! The trace store: every decision of the gateway and the MCP proxy, in SQLite.
//!
//! Requests must not wait on the disk, so handlers hand events to a bounded channel and one
//! writer thread commits them in batches (WAL mode, one transaction per batch). After the first
//! event of a batch the writer sleeps a few milliseconds before draining the queue: handlers then
//! queue without waking it, and a batch updates each run's row once, not once per event (under
//! load this took the writer from a fifth of the gateway's CPU to a few percent). Shutdown closes
//! the channel and joins the writer, so every event sent before a response went out is on disk
//! when the process exits. If the channel is ever full the event is dropped and counted rather
//! than blocking a request. On Linux the writer runs nicer than the process
//! ([`WRITER_NICE`]), so that a commit waits for the request in flight instead of preempting it.
//! Runs get an integer key in order of first sight, and a batch writes
//! each run's events as one row that refers to it (see `SCHEMA_VERSION`): one row and one index
//! entry per gateway request, in a few hot index pages shared by the runs in flight;
//! `cargo run --release -p selfheal-trace --example trace_load` measures the writer's CPU per
//! request on the gateway's realistic pattern.
//!
//! The trace is best-effort (see docs/guides/deploying.md for what a `kill -9` loses) and
//! expires: events and runs older than the retention (30 days by default) are deleted when the
//! writer starts and every hour after.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError, sync_channel};
use std::thread::JoinHandle;

use rusqlite::{Connection, params};
use serde::Serialize;
use serde_json::Value;
use thiserror::Error;

/// Events queued for the writer at most.
const QUEUE: usize = 65_536;
/// Events committed per transaction at most.
const BATCH: usize = 1_024;
/// How long the writer lets events gather after the first one of a batch.
const LINGER: std::time::Duration = std::time::Duration::from_millis(10);
/// How long events and runs are kept by default.
pub const DEFAULT_RETENTION: std::time::Duration =
    std::time::Duration::from_secs(30 * 24 * 60 * 60);
/// How often the writer deletes what is past the retention.
const PRUNE_EVERY: std::time::Duration = std::time::Duration::from_secs(60 * 60);

/// A trace store that cannot be opened or read.
#[derive(Debug, Error)]
pub enum StoreError {
    /// SQLite failed.
    #[error("trace store: {0}")]
    Sqlite(#[from] rusqlite::Error),
    /// The directory could not be created.
    #[error("trace store: {0}")]
    Io(#[from] std::io::Error),
    /// A trace to read does not exist (reading never creates one).
    #[error("no trace at {}", .0.display())]
    NotFound(PathBuf),
}

pub use selfheal_core::EventKind as Kind;

/// Whether an event of this kind (as read back: a trace may hold kinds this version does not
/// know) is a healing action (see [`Kind::is_action`]). `selfheal trace list` counts these, so
/// its count matches what `selfheal trace show` marks.
pub fn is_action(kind: &str) -> bool {
    kind.parse::<Kind>().is_ok_and(Kind::is_action)
}

/// A summary of the run, written with the event that ends a request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RunSummary {
    /// `complete`, `partial` or `failed`.
    pub status: String,
    /// Tool failures so far.
    pub failures: u64,
    /// Recovery actions so far.
    pub actions: u64,
}

/// One decision or observation.
#[derive(Debug, Clone, PartialEq)]
pub struct TraceEvent {
    /// The run (shared: a request's events all name the same run).
    pub run: std::sync::Arc<str>,
    /// Unix time in milliseconds.
    pub t_ms: u64,
    /// What kind of event.
    pub kind: Kind,
    /// Details.
    pub detail: Detail,
    /// Set on the event that ends a request.
    pub summary: Option<RunSummary>,
}

/// An event's details: a JSON value, or one already written as JSON text.
///
/// The text form exists for the events every request records (`request`, `tool_result`,
/// `response`): written straight from a typed struct ([`Detail::of`]), they build no map and
/// the writer copies their text as it is, where a [`Value`] is a tree of allocations made on
/// the request's thread, serialised and freed on the writer's.
#[derive(Debug, Clone)]
pub enum Detail {
    /// A JSON value.
    Value(Value),
    /// JSON text, written by [`Detail::of`] (the only way to make one, so it is valid JSON).
    Raw(RawJson),
}

/// JSON text a serializer wrote ([`Detail::of`]).
#[derive(Debug, Clone)]
pub struct RawJson(String);

impl RawJson {
    /// The text.
    pub fn get(&self) -> &str {
        &self.0
    }
}

impl Detail {
    /// The details of a serialisable struct, written as JSON text without a [`Value`] (`null`
    /// when it cannot be serialised, which a struct of strings, numbers and booleans never is).
    pub fn of<T: Serialize + ?Sized>(detail: &T) -> Detail {
        // One allocation for the small structs this is for.
        let mut out = Vec::with_capacity(128);
        match serde_json::to_writer(&mut out, detail) {
            // serde_json writes UTF-8.
            Ok(()) => String::from_utf8(out)
                .map_or(Detail::Value(Value::Null), |s| Detail::Raw(RawJson(s))),
            Err(_) => Detail::Value(Value::Null),
        }
    }

    /// The details as a JSON value (a raw text is parsed).
    pub fn to_value(&self) -> Value {
        match self {
            Detail::Value(v) => v.clone(),
            Detail::Raw(r) => serde_json::from_str(r.get()).unwrap_or(Value::Null),
        }
    }
}

impl From<Value> for Detail {
    fn from(v: Value) -> Detail {
        Detail::Value(v)
    }
}

impl PartialEq for Detail {
    /// Equal when they mean the same JSON, whichever form each is in.
    fn eq(&self, other: &Detail) -> bool {
        match (self, other) {
            (Detail::Value(a), Detail::Value(b)) => a == b,
            (a, b) => a.to_value() == b.to_value(),
        }
    }
}

/// The default path: `$XDG_DATA_HOME/selfheal/trace.db`, else `~/.local/share/selfheal/trace.db`.
pub fn default_path() -> PathBuf {
    let base = std::env::var_os("XDG_DATA_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local/share")))
        .unwrap_or_else(|| PathBuf::from("."));
    base.join("selfheal").join("trace.db")
}

/// The schema's version, in SQLite's `user_version`.
///
/// - 0: a fresh file, or version 1 written before the version was recorded.
/// - 1: events and runs keyed by the run's text id (`events.run`, `runs.run PRIMARY KEY`).
/// - 2: runs have an integer key (`runs.id`, assigned in order of first sight) and events refer
///   to it (`events.run_id`). Run ids are keyed hashes, so they arrive in random order: indexed
///   by text, every event landed on a random page of the index and each batch wrote one index
///   page per run to the log, the bulk of the writer's cost. Keyed by arrival, the runs in
///   flight share a few hot pages.
/// - 3: a batch stores each run's events as one row of `event_rows` (`records`: a JSON array of
///   `[t_ms, kind, detail]`, oldest first), not one row per event. A gateway request is three
///   events or more (`request`, `tool_result`, `response`) that land in one batch, so the writer
///   inserts one row and one index entry per request instead of three of each. The view
///   `events (row_id, seq, run_id, t_ms, kind, detail)` shows one row per event, as version 2's
///   table did, for SQL written against it.
const SCHEMA_VERSION: i64 = 3;

fn open(path: &Path) -> Result<Connection, StoreError> {
    if let Some(dir) = path.parent()
        && !dir.as_os_str().is_empty()
    {
        std::fs::create_dir_all(dir)?;
    }
    let mut conn = Connection::open(path)?;
    conn.pragma_update(None, "journal_mode", "WAL")?;
    conn.pragma_update(None, "synchronous", "NORMAL")?;
    conn.busy_timeout(std::time::Duration::from_secs(5))?;
    migrate(&mut conn)?;
    Ok(conn)
}

/// The runs table, the same in versions 2 and 3.
const RUNS_TABLE: &str = "
    CREATE TABLE IF NOT EXISTS runs (
        id INTEGER PRIMARY KEY, run TEXT NOT NULL UNIQUE,
        first_ms INTEGER NOT NULL, last_ms INTEGER NOT NULL,
        events INTEGER NOT NULL DEFAULT 0, requests INTEGER NOT NULL DEFAULT 0,
        status TEXT, failures INTEGER NOT NULL DEFAULT 0, actions INTEGER NOT NULL DEFAULT 0);";

/// Version 2's events table (with [`RUNS_TABLE`]), the step between a version 1 trace and
/// [`EVENTS_TABLES`].
const EVENTS_V2: &str = "
    CREATE TABLE IF NOT EXISTS events (
        id INTEGER PRIMARY KEY, run_id INTEGER NOT NULL, t_ms INTEGER NOT NULL,
        kind TEXT NOT NULL, detail TEXT NOT NULL);";

/// The events at [`SCHEMA_VERSION`] (with [`RUNS_TABLE`]). `event_rows.t_ms` is the first of
/// the row's events (what the retention compares).
const EVENTS_TABLES: &str = "
    CREATE TABLE IF NOT EXISTS event_rows (
        id INTEGER PRIMARY KEY, run_id INTEGER NOT NULL, t_ms INTEGER NOT NULL,
        records TEXT NOT NULL);
    CREATE INDEX IF NOT EXISTS event_rows_run ON event_rows (run_id, id);
    CREATE VIEW IF NOT EXISTS events AS
        SELECT g.id AS row_id, j.key AS seq, g.run_id AS run_id,
               json_extract(j.value, '$[0]') AS t_ms, json_extract(j.value, '$[1]') AS kind,
               json_extract(j.value, '$[2]') AS detail
        FROM event_rows g, json_each(g.records) j;";

/// Creates the schema at [`SCHEMA_VERSION`] (what is missing of it).
fn create_schema(tx: &rusqlite::Transaction<'_>) -> Result<(), rusqlite::Error> {
    tx.execute_batch(RUNS_TABLE)?;
    tx.execute_batch(EVENTS_TABLES)
}

/// Creates the schema, or brings a trace written by an older version up to [`SCHEMA_VERSION`]
/// in one transaction (nothing recorded is lost).
fn migrate(conn: &mut Connection) -> Result<(), rusqlite::Error> {
    let version: i64 = conn.pragma_query_value(None, "user_version", |r| r.get(0))?;
    if version == SCHEMA_VERSION {
        return Ok(());
    }
    let tx = conn.transaction()?;
    let table = |name: &str| -> Result<bool, rusqlite::Error> {
        tx.query_row(
            "SELECT COUNT(*) > 0 FROM sqlite_master WHERE type = 'table' AND name = ?1",
            [name],
            |r| r.get(0),
        )
    };
    let has_events = table("events")?;
    let text_keyed: bool = has_events
        && tx.query_row(
            "SELECT COUNT(*) > 0 FROM pragma_table_info('events') WHERE name = 'run'",
            [],
            |r| r.get(0),
        )?;
    if text_keyed {
        // Version 1 → 2.
        tx.execute_batch(
            "ALTER TABLE runs RENAME TO runs_v1;
             ALTER TABLE events RENAME TO events_v1;
             DROP INDEX IF EXISTS events_run;",
        )?;
        tx.execute_batch(RUNS_TABLE)?;
        tx.execute_batch(EVENTS_V2)?;
        tx.execute_batch(
            "INSERT INTO runs (run, first_ms, last_ms, events, requests, status, failures, actions)
               SELECT run, first_ms, last_ms, events, requests, status, failures, actions
               FROM runs_v1 ORDER BY first_ms;
             INSERT OR IGNORE INTO runs (run, first_ms, last_ms)
               SELECT run, MIN(t_ms), MAX(t_ms) FROM events_v1 GROUP BY run;
             INSERT INTO events (id, run_id, t_ms, kind, detail)
               SELECT e.id, r.id, e.t_ms, e.kind, e.detail
               FROM events_v1 e JOIN runs r ON r.run = e.run ORDER BY e.id;
             DROP TABLE events_v1;
             DROP TABLE runs_v1;",
        )?;
    }
    if has_events {
        // Version 2 → 3: each event becomes a row of one record, in the same order.
        tx.execute_batch(
            "ALTER TABLE events RENAME TO events_v2;
             DROP INDEX IF EXISTS events_run;",
        )?;
        create_schema(&tx)?;
        tx.execute_batch(
            "INSERT INTO event_rows (id, run_id, t_ms, records)
               SELECT id, run_id, t_ms, json_array(json_array(t_ms, kind,
                 CASE WHEN json_valid(detail) THEN json(detail) ELSE detail END))
               FROM events_v2 ORDER BY id;
             DROP TABLE events_v2;",
        )?;
    } else {
        create_schema(&tx)?;
    }
    tx.pragma_update(None, "user_version", SCHEMA_VERSION)?;
    tx.commit()
}

/// The writing side, shared by all handlers.
#[derive(Debug)]
pub struct TraceWriter {
    tx: Mutex<Option<SyncSender<TraceEvent>>>,
    handle: Mutex<Option<JoinHandle<()>>>,
    dropped: AtomicU64,
}

impl TraceWriter {
    /// Opens (creating) the database at `path` and starts the writer thread, keeping events
    /// for [`DEFAULT_RETENTION`].
    pub fn open(path: &Path) -> Result<TraceWriter, StoreError> {
        TraceWriter::open_with_retention(path, Some(DEFAULT_RETENTION))
    }

    /// Opens (creating) the database at `path` and starts the writer thread, which deletes
    /// events and runs older than `retention` when it starts and every hour (`None`: keeps
    /// everything).
    pub fn open_with_retention(
        path: &Path,
        retention: Option<std::time::Duration>,
    ) -> Result<TraceWriter, StoreError> {
        let conn = open(path)?;
        let (tx, rx) = sync_channel(QUEUE);
        let handle = std::thread::Builder::new()
            .name("selfheal-trace".into())
            .spawn(move || write_loop(conn, rx, retention))?;
        Ok(TraceWriter {
            tx: Mutex::new(Some(tx)),
            handle: Mutex::new(Some(handle)),
            dropped: AtomicU64::new(0),
        })
    }

    /// A writer that records nothing (for tests and `--no-trace`).
    pub fn disabled() -> TraceWriter {
        TraceWriter {
            tx: Mutex::new(None),
            handle: Mutex::new(None),
            dropped: AtomicU64::new(0),
        }
    }

    /// Queues an event; never blocks.
    pub fn send(&self, event: TraceEvent) {
        let guard = self.tx.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(tx) = guard.as_ref() {
            match tx.try_send(event) {
                Ok(()) => {}
                Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
                    self.dropped.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    }

    /// Events dropped because the queue was full.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// Closes the queue and waits until everything queued is committed.
    pub fn flush_and_close(&self) {
        self.tx.lock().unwrap_or_else(|p| p.into_inner()).take();
        let handle = self.handle.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(h) = handle {
            let _ = h.join();
        }
    }
}

/// A writer dropped without [`TraceWriter::flush_and_close`] (an early return, an error path)
/// still commits what was queued.
impl Drop for TraceWriter {
    fn drop(&mut self) {
        self.flush_and_close();
    }
}

/// Deletes events and runs last seen before `now - retention`.
fn prune(conn: &Connection, retention: std::time::Duration) -> Result<usize, rusqlite::Error> {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    let cutoff = i64::try_from(now.saturating_sub(retention.as_millis())).unwrap_or(i64::MAX);
    let events = conn.execute("DELETE FROM event_rows WHERE t_ms < ?1", params![cutoff])?;
    let runs = conn.execute("DELETE FROM runs WHERE last_ms < ?1", params![cutoff])?;
    Ok(events + runs)
}

fn write_loop(
    mut conn: Connection,
    rx: Receiver<TraceEvent>,
    retention: Option<std::time::Duration>,
) {
    use std::sync::mpsc::RecvTimeoutError;
    yield_to_requests();
    let mut batch = Vec::with_capacity(BATCH);
    let mut ids = RunIds::default();
    let mut pruned_at: Option<std::time::Instant> = None;
    loop {
        if let Some(r) = retention
            && pruned_at.is_none_or(|t| t.elapsed() >= PRUNE_EVERY)
        {
            if let Err(e) = prune(&conn, r) {
                eprintln!("selfheal: trace expiry failed: {e}");
            }
            // A pruned run's key is gone; a run seen again gets a new one.
            ids.map.clear();
            pruned_at = Some(std::time::Instant::now());
        }
        let first = match rx.recv_timeout(PRUNE_EVERY) {
            Ok(e) => e,
            Err(RecvTimeoutError::Timeout) => continue,
            Err(RecvTimeoutError::Disconnected) => break,
        };
        batch.push(first);
        std::thread::sleep(LINGER);
        while batch.len() < BATCH
            && let Ok(e) = rx.try_recv()
        {
            batch.push(e);
        }
        if let Err(e) = write_batch(&mut conn, &mut ids, &batch) {
            eprintln!("selfheal: trace write failed: {e}");
        }
        batch.clear();
    }
}

/// How much nicer than the process the writer thread runs (Linux): 10, a tenth of a normal
/// thread's share of a contended core.
pub(crate) const WRITER_NICE: i32 = 10;

/// Lowers the calling thread's priority by [`WRITER_NICE`] (capped at 19), on Linux, where
/// `setpriority` on a thread id affects that thread alone.
///
/// The writer shares the gateway's cores. At its normal priority, a writer waking from its
/// linger preempts the request in flight and commits a batch (hundreds of microseconds) before
/// it lets go, so a request in every batch waits out a commit (docs/benchmark/gateway-load.md
/// says what this moves). Nicer, it commits between requests, and still gets enough of a saturated
/// core to keep up (0 events dropped in 60 s at 12.5 k req/s on one core). Best effort: a
/// failure leaves the priority as it was.
fn yield_to_requests() {
    #[cfg(target_os = "linux")]
    {
        let me = Some(rustix::thread::gettid());
        if let Ok(now) = rustix::process::getpriority_process(me) {
            let _ = rustix::process::setpriority_process(me, (now + WRITER_NICE).min(19));
        }
    }
}

/// The writer's memory of run keys: the run's text id → its integer key in `runs`.
///
/// Bounded: at [`RunIds::MAX`] entries it starts over, and a key that turns out to be gone
/// (deleted by an expiry, here or in another process sharing the file) is looked up again.
#[derive(Debug, Default)]
struct RunIds {
    map: std::collections::HashMap<String, i64>,
}

impl RunIds {
    /// Keys kept at most (a few MiB).
    const MAX: usize = 65_536;

    /// The key of `run`, creating its row (first seen at `first_ms`) if it has none.
    fn resolve(
        &mut self,
        tx: &rusqlite::Transaction<'_>,
        run: &str,
        first_ms: i64,
    ) -> Result<i64, rusqlite::Error> {
        if let Some(&id) = self.map.get(run) {
            return Ok(id);
        }
        let mut find = tx.prepare_cached("SELECT id FROM runs WHERE run = ?1")?;
        let id = match find.query_row([run], |r| r.get(0)) {
            Ok(id) => id,
            Err(rusqlite::Error::QueryReturnedNoRows) => {
                tx.prepare_cached("INSERT INTO runs (run, first_ms, last_ms) VALUES (?1, ?2, ?2)")?
                    .execute(params![run, first_ms])?;
                tx.last_insert_rowid()
            }
            Err(e) => return Err(e),
        };
        if self.map.len() >= Self::MAX {
            self.map.clear();
        }
        self.map.insert(run.to_owned(), id);
        Ok(id)
    }
}

/// What one batch changes in a run's row.
#[derive(Debug)]
struct RunDelta<'a> {
    id: i64,
    first_ms: i64,
    last_ms: i64,
    events: i64,
    requests: i64,
    summary: Option<&'a RunSummary>,
}

fn write_batch(
    conn: &mut Connection,
    ids: &mut RunIds,
    batch: &[TraceEvent],
) -> Result<(), rusqlite::Error> {
    // Runs in the order they first appear, so the writes (and the keys) are deterministic.
    let mut runs: Vec<(&str, RunDelta<'_>)> = Vec::with_capacity(batch.len());
    let mut index: std::collections::HashMap<&str, usize> =
        std::collections::HashMap::with_capacity(batch.len());
    let mut of_event = Vec::with_capacity(batch.len());
    for e in batch {
        let t = i64::try_from(e.t_ms).unwrap_or(i64::MAX);
        let i = *index.entry(&*e.run).or_insert_with(|| {
            runs.push((
                &*e.run,
                RunDelta {
                    id: 0,
                    first_ms: t,
                    last_ms: t,
                    events: 0,
                    requests: 0,
                    summary: None,
                },
            ));
            runs.len() - 1
        });
        of_event.push(i);
        let d = &mut runs[i].1;
        d.first_ms = d.first_ms.min(t);
        d.last_ms = d.last_ms.max(t);
        d.events += 1;
        d.requests += i64::from(e.kind == Kind::Request);
        if let Some(s) = &e.summary {
            d.summary = Some(s);
        }
    }
    // Immediate: the batch reads run keys before it writes, and a read snapshot that another
    // process (an MCP proxy sharing the file) wrote past could not be upgraded to a write.
    let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
    {
        // One statement per run: its counters and, when the batch ends a request, its summary
        // (a NULL summary leaves the stored one as it is).
        let mut up = tx.prepare_cached(
            "UPDATE runs SET first_ms = MIN(first_ms, ?2), last_ms = MAX(last_ms, ?3),
               events = events + ?4, requests = requests + ?5,
               status = COALESCE(?6, status), failures = COALESCE(?7, failures),
               actions = COALESCE(?8, actions) WHERE id = ?1",
        )?;
        for (run, d) in &mut runs {
            let mut id = ids.resolve(&tx, run, d.first_ms)?;
            let (status, failures, actions) = match d.summary {
                Some(s) => (
                    Some(s.status.as_str()),
                    Some(i64::try_from(s.failures).unwrap_or(i64::MAX)),
                    Some(i64::try_from(s.actions).unwrap_or(i64::MAX)),
                ),
                None => (None, None, None),
            };
            let (first, last, events, requests) = (d.first_ms, d.last_ms, d.events, d.requests);
            let mut update = |id: i64| {
                up.execute(params![
                    id, first, last, events, requests, status, failures, actions
                ])
            };
            if update(id)? == 0 {
                // Expired since it was cached: look it up (or create it) again.
                ids.map.remove(*run);
                id = ids.resolve(&tx, run, d.first_ms)?;
                update(id)?;
            }
            d.id = id;
        }
        // One row per run: its events in this batch, oldest first (see `SCHEMA_VERSION`).
        let mut records: Vec<Vec<u8>> = vec![Vec::new(); runs.len()];
        for (e, &i) in batch.iter().zip(&of_event) {
            write_record(&mut records[i], e);
        }
        let mut ins = tx
            .prepare_cached("INSERT INTO event_rows (run_id, t_ms, records) VALUES (?1, ?2, ?3)")?;
        for ((_, d), mut rec) in runs.iter().zip(records) {
            rec.push(b']');
            // Only JSON was written into it, which is UTF-8.
            let text =
                String::from_utf8(rec).map_err(|e| rusqlite::Error::Utf8Error(e.utf8_error()))?;
            ins.execute(params![d.id, d.first_ms, text])?;
        }
    }
    tx.commit()
}

/// Appends one event to a run's `records` array: `[t_ms,"kind",detail]`, opening the array
/// before the first.
fn write_record(buf: &mut Vec<u8>, e: &TraceEvent) {
    buf.push(if buf.is_empty() { b'[' } else { b',' });
    buf.push(b'[');
    // Writing into a Vec cannot fail, nor can serialising a number, a `Value` or a `&str`.
    let _ = serde_json::to_writer(&mut *buf, &e.t_ms);
    buf.push(b',');
    let _ = serde_json::to_writer(&mut *buf, e.kind.as_str());
    buf.push(b',');
    match &e.detail {
        Detail::Value(v) => {
            let _ = serde_json::to_writer(&mut *buf, v);
        }
        Detail::Raw(r) => buf.extend_from_slice(r.get().as_bytes()),
    }
    buf.push(b']');
}

/// One run, as `selfheal trace list` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RunRow {
    /// The run id.
    pub run: String,
    /// First event, Unix ms.
    pub first_ms: i64,
    /// Last event, Unix ms.
    pub last_ms: i64,
    /// Requests seen.
    pub requests: i64,
    /// Events recorded.
    pub events: i64,
    /// Last reported status.
    pub status: Option<String>,
    /// Tool failures.
    pub failures: i64,
    /// Healing actions: the run's events whose kind [`Kind::is_action`].
    pub actions: i64,
}

/// One event, as `selfheal trace show` shows it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EventRow {
    /// Unix ms.
    pub t_ms: i64,
    /// The kind.
    pub kind: String,
    /// The details.
    pub detail: Value,
}

/// The reading side, for the CLI.
#[derive(Debug)]
pub struct TraceReader {
    conn: Connection,
}

impl TraceReader {
    /// Opens the database at `path`; [`StoreError::NotFound`] if there is none (a mistyped path
    /// must not leave an empty database behind).
    pub fn open(path: &Path) -> Result<TraceReader, StoreError> {
        if !path.exists() {
            return Err(StoreError::NotFound(path.to_path_buf()));
        }
        Ok(TraceReader { conn: open(path)? })
    }

    /// Runs, most recent first.
    pub fn runs(&self, limit: usize) -> Result<Vec<RunRow>, StoreError> {
        use strum::IntoEnumIterator;
        let kinds = Kind::iter()
            .filter(|k| k.is_action())
            .map(|k| format!("'{k}'"))
            .collect::<Vec<_>>()
            .join(", ");
        let mut st = self.conn.prepare(&format!(
            "SELECT run, first_ms, last_ms, requests, events, status, failures,
               (SELECT COUNT(*) FROM events e WHERE e.run_id = runs.id AND e.kind IN ({kinds}))
             FROM runs ORDER BY last_ms DESC LIMIT ?1"
        ))?;
        let rows = st.query_map([i64::try_from(limit).unwrap_or(i64::MAX)], |r| {
            Ok(RunRow {
                run: r.get(0)?,
                first_ms: r.get(1)?,
                last_ms: r.get(2)?,
                requests: r.get(3)?,
                events: r.get(4)?,
                status: r.get(5)?,
                failures: r.get(6)?,
                actions: r.get(7)?,
            })
        })?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// The events of one run, oldest first.
    pub fn events(&self, run: &str) -> Result<Vec<EventRow>, StoreError> {
        let mut st = self.conn.prepare(
            "SELECT g.t_ms, g.records FROM event_rows g JOIN runs r ON r.id = g.run_id
                 WHERE r.run = ?1 ORDER BY g.id",
        )?;
        let mut rows = st.query([run])?;
        let mut out = Vec::new();
        while let Some(row) = rows.next()? {
            let t_ms: i64 = row.get(0)?;
            let text: String = row.get(1)?;
            match serde_json::from_str::<Vec<(i64, String, Value)>>(&text) {
                Ok(records) => {
                    out.extend(records.into_iter().map(|(t_ms, kind, detail)| EventRow {
                        t_ms,
                        kind,
                        detail,
                    }))
                }
                // Written by something else: shown as it is, not dropped.
                Err(_) => out.push(EventRow {
                    t_ms,
                    kind: "unreadable".into(),
                    detail: Value::String(text),
                }),
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn events_written_before_close_are_read_back() {
        let dir = std::env::temp_dir().join(format!("selfheal-store-{}", std::process::id()));
        let path = dir.join("t.db");
        let _ = std::fs::remove_file(&path);
        let w = TraceWriter::open(&path).unwrap();
        for kind in [Kind::Request, Kind::Retry, Kind::Response] {
            w.send(TraceEvent {
                run: "r1".into(),
                t_ms: 1,
                kind,
                detail: json!({"k": kind.as_str()}).into(),
                summary: (kind == Kind::Response).then(|| RunSummary {
                    status: "complete".into(),
                    failures: 0,
                    actions: 1,
                }),
            });
        }
        w.flush_and_close();
        let r = TraceReader::open(&path).unwrap();
        let runs = r.runs(10).unwrap();
        assert_eq!(runs.len(), 1);
        assert_eq!(runs[0].requests, 1);
        assert_eq!(runs[0].status.as_deref(), Some("complete"));
        assert_eq!(r.events("r1").unwrap().len(), 3);
        let _ = std::fs::remove_dir_all(dir);
    }

    /// The writer thread runs nicer than the thread that opened it, which keeps its own
    /// priority: read from /proc, by the thread's name (every writer of this test process,
    /// since tests run in parallel; one that exits while it is read is skipped).
    #[cfg(target_os = "linux")]
    #[test]
    fn the_writer_thread_runs_nicer_than_the_process() {
        let nice_of = |stat: &str| -> Option<i32> {
            // Field 19 of /proc/<pid>/task/<tid>/stat, counted after the parenthesised name.
            let after = stat.get(stat.rfind(')')? + 2..)?;
            after.split(' ').nth(16)?.parse().ok()
        };
        let own = nice_of(&std::fs::read_to_string("/proc/thread-self/stat").unwrap()).unwrap();
        let want = (own + WRITER_NICE).min(19);
        let writers = || -> Vec<i32> {
            let mut out = Vec::new();
            for t in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
                let t = t.path();
                let comm = std::fs::read_to_string(t.join("comm")).unwrap_or_default();
                if comm.trim() == "selfheal-trace"
                    && let Some(n) = std::fs::read_to_string(t.join("stat"))
                        .ok()
                        .and_then(|s| nice_of(&s))
                {
                    out.push(n);
                }
            }
            out
        };
        let dir = std::env::temp_dir().join(format!("selfheal-store-nice-{}", std::process::id()));
        let w = TraceWriter::open(&dir.join("t.db")).unwrap();
        // A writer lowers its priority as it starts: give them a moment.
        let mut seen = writers();
        for _ in 0..200 {
            if !seen.is_empty() && seen.iter().all(|&n| n == want) {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
            seen = writers();
        }
        assert!(!seen.is_empty(), "no writer thread found");
        assert!(
            seen.iter().all(|&n| n == want),
            "writers at {seen:?}, want {want}"
        );
        let after = nice_of(&std::fs::read_to_string("/proc/thread-self/stat").unwrap());
        assert_eq!(after, Some(own), "the caller's own priority is left alone");
        w.flush_and_close();
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn raw_details_are_stored_as_written_and_read_back_as_values() {
        #[derive(Serialize)]
        struct D<'a> {
            model: &'a str,
            n: u32,
        }
        let dir = std::env::temp_dir().join(format!("selfheal-store-raw-{}", std::process::id()));
        let path = dir.join("t.db");
        let _ = std::fs::remove_file(&path);
        let w = TraceWriter::open(&path).unwrap();
        let detail = Detail::of(&D {
            model: "m \"quoted\"",
            n: 3,
        });
        assert!(matches!(detail, Detail::Raw(_)));
        assert_eq!(
            detail,
            Detail::from(json!({"model": "m \"quoted\"", "n": 3}))
        );
        for (kind, detail) in [
            (Kind::Request, detail),
            (Kind::Response, json!({"status": "complete"}).into()),
        ] {
            w.send(TraceEvent {
                run: "r1".into(),
                t_ms: 1,
                kind,
                detail,
                summary: None,
            });
        }
        w.flush_and_close();
        let events = TraceReader::open(&path).unwrap().events("r1").unwrap();
        assert_eq!(events.len(), 2);
        assert_eq!(events[0].detail, json!({"model": "m \"quoted\"", "n": 3}));
        assert_eq!(events[1].detail, json!({"status": "complete"}));
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn events_past_the_retention_are_deleted_when_the_writer_starts() {
        let dir = std::env::temp_dir().join(format!("selfheal-retention-{}", std::process::id()));
        let path = dir.join("t.db");
        let _ = std::fs::remove_file(&path);
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64;
        let day = 24 * 60 * 60 * 1000;
        let w = TraceWriter::open_with_retention(&path, None).unwrap();
        for (run, t_ms) in [("old", now - 40 * day), ("new", now - day)] {
            w.send(TraceEvent {
                run: run.into(),
                t_ms,
                kind: Kind::Request,
                detail: json!({}).into(),
                summary: None,
            });
        }
        w.flush_and_close();
        let w = TraceWriter::open_with_retention(&path, Some(DEFAULT_RETENTION)).unwrap();
        w.flush_and_close();
        let r = TraceReader::open(&path).unwrap();
        let runs: Vec<String> = r.runs(10).unwrap().into_iter().map(|r| r.run).collect();
        assert_eq!(runs, vec!["new".to_string()]);
        assert!(r.events("old").unwrap().is_empty());
        assert_eq!(r.events("new").unwrap().len(), 1);
        let _ = std::fs::remove_dir_all(dir);
    }

    /// Issue 12: `trace list` said 0 actions for a run whose `show` listed a repair and a
    /// re-ask, because it printed the ledger's recovery count.
    #[test]
    fn issue12_runs_count_every_healing_event_as_an_action() {
        let dir = std::env::temp_dir().join(format!("selfheal-store-act-{}", std::process::id()));
        let path = dir.join("t.db");
        let _ = std::fs::remove_file(&path);
        let w = TraceWriter::open(&path).unwrap();
        for kind in [
            Kind::Request,
            Kind::Reask,
            Kind::Repair,
            Kind::Retry,
            Kind::ToolResult,
            Kind::Response,
        ] {
            w.send(TraceEvent {
                run: "r1".into(),
                t_ms: 1,
                kind,
                detail: json!({}).into(),
                summary: (kind == Kind::Response).then(|| RunSummary {
                    status: "complete".into(),
                    failures: 0,
                    actions: 0,
                }),
            });
        }
        w.flush_and_close();
        let r = TraceReader::open(&path).unwrap();
        let runs = r.runs(10).unwrap();
        let listed = r
            .events("r1")
            .unwrap()
            .iter()
            .filter(|e| is_action(&e.kind))
            .count();
        assert_eq!(listed, 3);
        assert_eq!(runs[0].actions, 3);
        let _ = std::fs::remove_dir_all(dir);
    }

    /// A trace written with the text-keyed schema (version 1) is migrated in place when it is
    /// opened: every run and event is kept, and new events join the old runs.
    #[test]
    fn a_version_1_trace_is_migrated_without_losing_anything() {
        let dir = std::env::temp_dir().join(format!("selfheal-store-v1-{}", std::process::id()));
        let path = dir.join("t.db");
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        {
            let c = Connection::open(&path).unwrap();
            c.execute_batch(
                "CREATE TABLE runs (
                    run TEXT PRIMARY KEY, first_ms INTEGER NOT NULL, last_ms INTEGER NOT NULL,
                    events INTEGER NOT NULL DEFAULT 0, requests INTEGER NOT NULL DEFAULT 0,
                    status TEXT, failures INTEGER NOT NULL DEFAULT 0,
                    actions INTEGER NOT NULL DEFAULT 0);
                 CREATE TABLE events (
                    id INTEGER PRIMARY KEY, run TEXT NOT NULL, t_ms INTEGER NOT NULL,
                    kind TEXT NOT NULL, detail TEXT NOT NULL);
                 CREATE INDEX events_run ON events (run, id);
                 INSERT INTO runs VALUES ('old', 10, 20, 2, 1, 'partial', 1, 1);
                 INSERT INTO events (run, t_ms, kind, detail) VALUES
                    ('old', 10, 'request', '{}'), ('old', 20, 'retry', '{\"n\":1}');",
            )
            .unwrap();
        }
        let w = TraceWriter::open_with_retention(&path, None).unwrap();
        w.send(TraceEvent {
            run: "old".into(),
            t_ms: 30,
            kind: Kind::Response,
            detail: json!({"status": "complete"}).into(),
            summary: Some(RunSummary {
                status: "complete".into(),
                failures: 1,
                actions: 1,
            }),
        });
        w.flush_and_close();
        let r = TraceReader::open(&path).unwrap();
        let runs = r.runs(10).unwrap();
        assert_eq!(runs.len(), 1);
        assert_eq!(
            (
                runs[0].first_ms,
                runs[0].last_ms,
                runs[0].events,
                runs[0].requests
            ),
            (10, 30, 3, 1)
        );
        assert_eq!(runs[0].status.as_deref(), Some("complete"));
        assert_eq!(runs[0].actions, 1);
        let kinds: Vec<String> = r
            .events("old")
            .unwrap()
            .into_iter()
            .map(|e| e.kind)
            .collect();
        assert_eq!(kinds, ["request", "retry", "response"]);
        let _ = std::fs::remove_dir_all(dir);
    }

    /// A version 2 trace (one row per event) is migrated in place: its events keep their order
    /// and details, new events follow them, and the `events` view still shows one row per event
    /// to SQL written against version 2 (the chaos and trace-loss scripts query it).
    #[test]
    fn a_version_2_trace_is_migrated_and_the_events_view_shows_one_row_per_event() {
        let dir = std::env::temp_dir().join(format!("selfheal-store-v2-{}", std::process::id()));
        let path = dir.join("t.db");
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        {
            let c = Connection::open(&path).unwrap();
            c.execute_batch(RUNS_TABLE).unwrap();
            c.execute_batch(EVENTS_V2).unwrap();
            c.execute_batch(
                "CREATE INDEX events_run ON events (run_id, id);
                 INSERT INTO runs (id, run, first_ms, last_ms, events, requests)
                    VALUES (1, 'old', 10, 20, 3, 1);
                 INSERT INTO events (run_id, t_ms, kind, detail) VALUES
                    (1, 10, 'request', '{\"model\":\"m\"}'), (1, 15, 'retry', '{\"n\":1}'),
                    (1, 20, 'response', 'not json');
                 PRAGMA user_version = 2;",
            )
            .unwrap();
        }
        let w = TraceWriter::open_with_retention(&path, None).unwrap();
        for kind in [Kind::Request, Kind::Response] {
            w.send(TraceEvent {
                run: "old".into(),
                t_ms: 30,
                kind,
                detail: json!({"k": kind.as_str()}).into(),
                summary: None,
            });
        }
        w.flush_and_close();
        let r = TraceReader::open(&path).unwrap();
        let events = r.events("old").unwrap();
        let seen: Vec<(i64, &str)> = events.iter().map(|e| (e.t_ms, e.kind.as_str())).collect();
        assert_eq!(
            seen,
            [
                (10, "request"),
                (15, "retry"),
                (20, "response"),
                (30, "request"),
                (30, "response")
            ]
        );
        assert_eq!(events[0].detail, json!({"model": "m"}));
        assert_eq!(events[2].detail, json!("not json"));
        assert_eq!(events[4].detail, json!({"k": "response"}));
        assert_eq!(r.runs(10).unwrap()[0].actions, 1);
        let c = Connection::open(&path).unwrap();
        let kinds: Vec<String> = c
            .prepare("SELECT kind FROM events WHERE run_id = 1 ORDER BY row_id, seq")
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(
            kinds,
            ["request", "retry", "response", "request", "response"]
        );
        let version: i64 = c
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .unwrap();
        assert_eq!(version, SCHEMA_VERSION);
        let _ = std::fs::remove_dir_all(dir);
    }

    /// A run whose row was deleted after the writer learned its key (an expiry in another
    /// process sharing the file) gets a new row; its events are not written under a dead key.
    #[test]
    fn a_run_deleted_behind_the_writers_back_is_recreated() {
        let dir = std::env::temp_dir().join(format!("selfheal-store-gone-{}", std::process::id()));
        let path = dir.join("t.db");
        let _ = std::fs::remove_dir_all(&dir);
        let mut conn = open(&path).unwrap();
        let mut ids = RunIds::default();
        let event = |kind| TraceEvent {
            run: "r".into(),
            t_ms: 5,
            kind,
            detail: json!({}).into(),
            summary: None,
        };
        write_batch(&mut conn, &mut ids, &[event(Kind::Request)]).unwrap();
        conn.execute_batch("DELETE FROM runs; DELETE FROM event_rows;")
            .unwrap();
        write_batch(&mut conn, &mut ids, &[event(Kind::ToolResult)]).unwrap();
        drop(conn);
        let r = TraceReader::open(&path).unwrap();
        assert_eq!(r.runs(10).unwrap().len(), 1);
        let kinds: Vec<String> = r.events("r").unwrap().into_iter().map(|e| e.kind).collect();
        assert_eq!(kinds, ["tool_result"]);
        let _ = std::fs::remove_dir_all(dir);
    }

    /// Two processes' writers on one file (the gateway and an MCP proxy on the default path)
    /// each learning run keys: no batch is lost to the other's commits.
    #[test]
    fn two_writers_on_one_file_lose_nothing() {
        let dir = std::env::temp_dir().join(format!("selfheal-store-two-{}", std::process::id()));
        let path = dir.join("t.db");
        let _ = std::fs::remove_dir_all(&dir);
        // No retention: the events are stamped near 1970, and a second writer's start-up
        // expiry would otherwise delete what the first had already committed (a flake under
        // load, when the first commits before the second starts).
        let writers = [
            TraceWriter::open_with_retention(&path, None).unwrap(),
            TraceWriter::open_with_retention(&path, None).unwrap(),
        ];
        for i in 0..300u64 {
            for (w, writer) in writers.iter().enumerate() {
                writer.send(TraceEvent {
                    run: format!("w{w}-r{}", i % 37).into(),
                    t_ms: i,
                    kind: Kind::ToolResult,
                    detail: json!({"i": i}).into(),
                    summary: None,
                });
            }
            if i % 50 == 0 {
                std::thread::sleep(std::time::Duration::from_millis(12));
            }
        }
        for w in &writers {
            w.flush_and_close();
        }
        let r = TraceReader::open(&path).unwrap();
        let runs = r.runs(1_000).unwrap();
        assert_eq!(runs.len(), 74);
        assert_eq!(runs.iter().map(|r| r.events).sum::<i64>(), 600);
        let stored: usize = runs.iter().map(|x| r.events(&x.run).unwrap().len()).sum();
        assert_eq!(stored, 600);
        let _ = std::fs::remove_dir_all(dir);
    }

    /// Issue 12: reading a mistyped path created an empty database there.
    #[test]
    fn issue12_reading_a_missing_trace_fails_and_creates_nothing() {
        let dir = std::env::temp_dir().join(format!("selfheal-store-none-{}", std::process::id()));
        let path = dir.join("typo.db");
        let _ = std::fs::remove_dir_all(&dir);
        assert!(matches!(
            TraceReader::open(&path),
            Err(StoreError::NotFound(p)) if p == path
        ));
        assert!(!path.exists());
        assert!(!dir.exists());
    }
}
