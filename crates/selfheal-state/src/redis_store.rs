//! The shared store: one Redis server for every replica.
//!
//! One multiplexed connection (the `redis` crate's connection manager, which reconnects by
//! itself) carries every operation, each bounded by a timeout. Each operation is one round
//! trip:
//!
//! - a run is read with `HMGET key v d` (version and data);
//! - a run is written with one Lua script that compares the version, writes, sets the expiry
//!   and — on a conflict — returns the fresh version and data in the same answer. `WATCH`/
//!   `MULTI`/`EXEC` would need three round trips and a connection of its own per writer (a
//!   `WATCH` on a multiplexed connection watches for everyone);
//! - the shared tier's writes and its read of every live record are one Lua script over one
//!   hash, which also drops expired records.
//!
//! Keys: `{prefix}:run:{tenant length}:{tenant}:{run}` (a hash `v`, `d`, with the run's TTL) and
//! `{prefix}:shared` (a hash of `origin until_ms payload` strings). The URL's password, if any,
//! is never logged.

use std::future::Future;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::future::BoxFuture;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};

use crate::{Health, Put, RunId, SharedRecord, SharedWrite, StateStore, StoreError, Versioned};

/// Compare-and-set of a run: KEYS[1] the run; ARGV expected version, data, TTL in ms.
/// Returns `{1, new version, false}` or `{0, current version, current data or false}`.
const CAS: &str = r"
local cur = tonumber(redis.call('HGET', KEYS[1], 'v')) or 0
if cur ~= tonumber(ARGV[1]) then
  return {0, cur, redis.call('HGET', KEYS[1], 'd')}
end
cur = cur + 1
redis.call('HSET', KEYS[1], 'v', cur, 'd', ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return {1, cur, false}
";

/// The shared tier's sync: KEYS[1] the hash; ARGV[1] now (Unix ms), then field/value pairs (an
/// empty value deletes). Returns the live records as a flat field/value list.
const SYNC: &str = r"
local now = tonumber(ARGV[1])
for i = 2, #ARGV, 2 do
  if ARGV[i + 1] == '' then
    redis.call('HDEL', KEYS[1], ARGV[i])
  else
    redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1])
  end
end
local all = redis.call('HGETALL', KEYS[1])
local out = {}
for i = 1, #all, 2 do
  local until_ms = tonumber(string.match(all[i + 1], '^%x+ (%d+) '))
  if until_ms == nil or until_ms <= now then
    redis.call('HDEL', KEYS[1], all[i])
  else
    out[#out + 1] = all[i]
    out[#out + 1] = all[i + 1]
  end
end
return out
";

/// How a [`RedisStore`] connects.
#[derive(Debug, Clone)]
pub struct RedisOptions {
    /// Prefix of every key (several deployments can share one server).
    pub prefix: String,
    /// Longest wait for any one operation (and for a connection).
    pub timeout: Duration,
    /// While Redis is down, one operation per this interval goes through to probe it.
    pub probe_every: Duration,
}

impl Default for RedisOptions {
    fn default() -> Self {
        RedisOptions {
            prefix: "selfheal".into(),
            timeout: Duration::from_millis(250),
            probe_every: Duration::from_secs(1),
        }
    }
}

/// State in a Redis server shared by every replica.
pub struct RedisStore {
    conn: ConnectionManager,
    options: RedisOptions,
    health: Health,
    cas: redis::Script,
    sync: redis::Script,
    /// The URL without its password, for messages.
    shown: String,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("url", &self.shown)
            .field("options", &self.options)
            .field("health", &self.health)
            .finish_non_exhaustive()
    }
}

/// `url` with the password, if any, replaced by `***`.
pub fn redact_url(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(s), Some(at)) if at > s + 3 => {
            let creds = &url[s + 3..at];
            let user = creds.split(':').next().unwrap_or("");
            format!("{}{user}:***{}", &url[..s + 3], &url[at..])
        }
        _ => url.to_owned(),
    }
}

impl RedisStore {
    /// A store on the Redis server at `url` (`redis://host:port/db`). Connects lazily: a server
    /// that is down at startup is an outage like any other, not a startup failure. Must be
    /// called within a tokio runtime.
    pub fn new(url: &str, options: RedisOptions) -> Result<RedisStore, StoreError> {
        let shown = redact_url(url);
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(StoreError::Setup(
                "the Redis store needs a tokio runtime".into(),
            ));
        }
        let client = redis::Client::open(url)
            .map_err(|e| StoreError::Setup(format!("{shown}: {:?}", e.kind())))?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(options.timeout))
            .set_response_timeout(Some(options.timeout))
            .set_number_of_retries(1)
            .set_max_delay(options.probe_every);
        let conn = ConnectionManager::new_lazy_with_config(client, config)
            .map_err(|e| StoreError::Setup(format!("{shown}: {:?}", e.kind())))?;
        Ok(RedisStore {
            conn,
            health: Health::new("redis", options.probe_every),
            options,
            cas: redis::Script::new(CAS),
            sync: redis::Script::new(SYNC),
            shown,
        })
    }

    /// The server's URL, password hidden.
    pub fn url(&self) -> &str {
        &self.shown
    }

    fn run_key(&self, id: &RunId) -> String {
        format!(
            "{}:run:{}:{}:{}",
            self.options.prefix,
            id.tenant.len(),
            id.tenant,
            id.run
        )
    }

    fn shared_key(&self) -> String {
        format!("{}:shared", self.options.prefix)
    }

    /// Runs `op` within the timeout, unless the store is down and this is not a probe; records
    /// the outcome in [`Health`].
    async fn guarded<T, F>(&self, op: F) -> Result<T, StoreError>
    where
        F: Future<Output = redis::RedisResult<T>>,
    {
        if !self.health.should_try(Instant::now()) {
            return Err(StoreError::Unavailable);
        }
        match tokio::time::timeout(self.options.timeout, op).await {
            Ok(Ok(v)) => {
                self.health.succeeded();
                Ok(v)
            }
            Ok(Err(e)) => {
                let e = StoreError::Redis(e.to_string());
                self.health.failed(&e);
                Err(e)
            }
            Err(_) => {
                let e = StoreError::Timeout(self.options.timeout);
                self.health.failed(&e);
                Err(e)
            }
        }
    }
}

impl StateStore for RedisStore {
    fn backend(&self) -> &'static str {
        "redis"
    }

    fn health(&self) -> &Health {
        &self.health
    }

    fn get_run<'a>(
        &'a self,
        id: &'a RunId,
    ) -> BoxFuture<'a, Result<Option<Versioned>, StoreError>> {
        Box::pin(async move {
            let key = self.run_key(id);
            let mut conn = self.conn.clone();
            let (v, d): (Option<u64>, Option<Vec<u8>>) = self
                .guarded(
                    redis::cmd("HMGET")
                        .arg(&key)
                        .arg("v")
                        .arg("d")
                        .query_async(&mut conn),
                )
                .await?;
            Ok(match (v, d) {
                (Some(version), Some(d)) => Some(Versioned {
                    bytes: Bytes::from(d),
                    version,
                }),
                _ => None,
            })
        })
    }

    fn put_run<'a>(
        &'a self,
        id: &'a RunId,
        expected: u64,
        bytes: Bytes,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<Put, StoreError>> {
        Box::pin(async move {
            let key = self.run_key(id);
            let mut conn = self.conn.clone();
            let ttl_ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX).max(1);
            let mut call = self.cas.key(&key);
            call.arg(expected).arg(bytes.as_ref()).arg(ttl_ms);
            let (stored, version, data): (i64, u64, Option<Vec<u8>>) =
                self.guarded(call.invoke_async(&mut conn)).await?;
            Ok(if stored == 1 {
                Put::Stored { version }
            } else {
                Put::Conflict {
                    current: data.filter(|_| version > 0).map(|d| Versioned {
                        bytes: Bytes::from(d),
                        version,
                    }),
                }
            })
        })
    }

    fn sync_shared<'a>(
        &'a self,
        writes: Vec<SharedWrite>,
        now_unix_ms: u64,
    ) -> BoxFuture<'a, Result<Vec<(String, SharedRecord)>, StoreError>> {
        Box::pin(async move {
            let key = self.shared_key();
            let mut conn = self.conn.clone();
            let mut call = self.sync.key(&key);
            call.arg(now_unix_ms);
            for (field, rec) in &writes {
                call.arg(field)
                    .arg(rec.as_ref().map_or_else(String::new, SharedRecord::encode));
            }
            let flat: Vec<String> = self.guarded(call.invoke_async(&mut conn)).await?;
            let mut out = Vec::with_capacity(flat.len() / 2);
            let mut it = flat.into_iter();
            while let (Some(field), Some(value)) = (it.next(), it.next()) {
                let rec = SharedRecord::decode(&value).ok_or_else(|| {
                    StoreError::Protocol(format!("shared record `{field}` is not ours"))
                })?;
                out.push((field, rec));
            }
            Ok(out)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_not_shown() {
        assert_eq!(
            redact_url("redis://user:hunter2@10.0.0.1:6379/0"),
            "redis://user:***@10.0.0.1:6379/0"
        );
        assert_eq!(
            redact_url("redis://:hunter2@h:1"),
            "redis://:***@h:1",
            "password only"
        );
        assert_eq!(redact_url("redis://h:6379"), "redis://h:6379");
    }
}
