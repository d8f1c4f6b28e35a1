//! The Redis glue: the only module that imports `redis`. It loads the
//! scripts, runs them with EVALSHA (loading again on NOSCRIPT, e.g. after a
//! Redis restart or SCRIPT FLUSH) and hands back the raw [`Reply`]. It makes
//! no decision about what a Redis failure means: the error goes back to the
//! caller.

use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::Script;

use super::reply::{MalformedReply, Reply};
use super::script::{ScriptCall, Store, BLOCK_LUA, LIMITER_LUA};

/// Why a Redis call failed.
#[derive(Debug, thiserror::Error)]
pub enum RedisError {
    #[error("invalid Redis URL {url}: {source}")]
    Url {
        /// Redacted: no password.
        url: String,
        source: redis::RedisError,
    },
    #[error("cannot reach Redis at {url}: {source}")]
    Connect {
        url: String,
        source: redis::RedisError,
    },
    #[error("Redis refused to load the limiter scripts (is EVAL disabled or the server older than 6.2?): {0}")]
    Load(redis::RedisError),
    #[error("limiter script failed: {0}")]
    Script(redis::RedisError),
    #[error(transparent)]
    Malformed(#[from] MalformedReply),
}

impl RedisError {
    /// Whether the error is about reaching Redis rather than about the call.
    pub fn is_unavailable(&self) -> bool {
        match self {
            RedisError::Connect { .. } => true,
            RedisError::Script(e) => {
                e.is_io_error()
                    || e.is_timeout()
                    || e.is_connection_dropped()
                    || e.is_connection_refusal()
            }
            _ => false,
        }
    }
}

/// Scripts on one multiplexed, reconnecting connection; cheap to clone.
#[derive(Clone)]
pub struct RedisStore {
    conn: ConnectionManager,
    limiter: Script,
    block: Script,
}

impl RedisStore {
    /// Connects, checks the server with PING and loads both scripts, so that
    /// a misconfigured Redis stops startup instead of the first job.
    pub async fn connect(url: &str, timeout: Duration) -> Result<RedisStore, RedisError> {
        let shown = crate::config::redact_url(url);
        let client = redis::Client::open(url).map_err(|source| RedisError::Url {
            url: shown.clone(),
            source,
        })?;
        let cfg = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(timeout))
            .set_response_timeout(Some(timeout))
            .set_number_of_retries(2);
        let mut conn = ConnectionManager::new_with_config(client, cfg)
            .await
            .map_err(|source| RedisError::Connect {
                url: shown.clone(),
                source,
            })?;
        let _: String = redis::cmd("PING")
            .query_async(&mut conn)
            .await
            .map_err(|source| RedisError::Connect { url: shown, source })?;
        let store = RedisStore {
            conn,
            limiter: Script::new(LIMITER_LUA),
            block: Script::new(BLOCK_LUA),
        };
        store.load().await?;
        Ok(store)
    }

    /// Loads both scripts into the server's script cache.
    pub async fn load(&self) -> Result<(), RedisError> {
        let mut conn = self.conn.clone();
        self.limiter
            .load_async(&mut conn)
            .await
            .map_err(RedisError::Load)?;
        self.block
            .load_async(&mut conn)
            .await
            .map_err(RedisError::Load)?;
        Ok(())
    }

    /// SHA1 of the limiter script, e.g. for `redis-benchmark EVALSHA`.
    pub fn limiter_sha(&self) -> &str {
        self.limiter.get_hash()
    }
}

impl Store for RedisStore {
    type Error = RedisError;

    async fn run(&self, call: &ScriptCall) -> Result<Reply, RedisError> {
        let mut inv = self.limiter.prepare_invoke();
        for k in call.keys() {
            inv.key(k);
        }
        for a in call.args() {
            inv.arg(a);
        }
        let mut conn = self.conn.clone();
        let raw: Vec<i64> = inv
            .invoke_async(&mut conn)
            .await
            .map_err(RedisError::Script)?;
        Ok(Reply::from_slice(&raw)?)
    }

    async fn block(&self, key: &str, now_us: Option<u64>, dur_us: u64) -> Result<u64, RedisError> {
        let mut conn = self.conn.clone();
        let until: u64 = self
            .block
            .key(key)
            .arg(now_us.map(|n| n.to_string()).unwrap_or_default())
            .arg(dur_us.max(1))
            .invoke_async(&mut conn)
            .await
            .map_err(RedisError::Script)?;
        Ok(until)
    }
}

impl RedisStore {
    /// `MEMORY USAGE key`: bytes a key takes, for the README's per-seller
    /// figures and the demo. `None` when the key does not exist.
    pub async fn memory_usage(&self, key: &str) -> Result<Option<u64>, RedisError> {
        let mut conn = self.conn.clone();
        redis::cmd("MEMORY")
            .arg("USAGE")
            .arg(key)
            .arg("SAMPLES")
            .arg(0)
            .query_async(&mut conn)
            .await
            .map_err(RedisError::Script)
    }
}
