//! The Redis glue: the only module that imports `redis`. It loads the
//! scripts, runs them with EVALSHA (loading again on NOSCRIPT, e.g. after a
//! Redis restart or SCRIPT FLUSH) and hands back the raw [`Reply`]. It makes
//! no decision about what a Redis failure means: the error goes back to the
//! caller.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::io::tcp::{socket2::TcpKeepalive, TcpSettings};
use redis::{IntoConnectionInfo, Script};

use super::reply::{JobsReply, MalformedReply, Reply};
use super::script::{JobsCall, ScriptCall, Store, BLOCK_LUA, LIMITER_LUA};

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
///
/// redis-rs reconnects when a connection breaks, but a call that times out
/// leaves the connection as it is: a Redis that stops answering without
/// closing the socket (a hung host, a network that drops packets, a
/// failover that moved its address) would keep every call timing out until
/// the kernel gives the socket up, minutes later. So a timeout replaces the
/// connection in the background, and the sockets carry TCP keepalive and a
/// user timeout that bound how long the kernel waits for a silent peer.
#[derive(Clone)]
pub struct RedisStore {
    conn: Arc<Connection>,
    limiter: Script,
    block: Script,
}

impl RedisStore {
    /// Connects, checks the server with PING and loads both scripts, so that
    /// a misconfigured Redis stops startup instead of the first job.
    pub async fn connect(url: &str, timeout: Duration) -> Result<RedisStore, RedisError> {
        let shown = crate::config::redact_url(url);
        let url_error = |source| RedisError::Url {
            url: shown.clone(),
            source,
        };
        let info = url.into_connection_info().map_err(url_error)?;
        let info = info.set_tcp_settings(tcp_settings(timeout));
        let client = redis::Client::open(info).map_err(url_error)?;
        let mut conn =
            Connection::open(&client, timeout)
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
            conn: Arc::new(Connection {
                client,
                timeout,
                current: RwLock::new(conn),
                replacing: AtomicBool::new(false),
            }),
            limiter: Script::new(LIMITER_LUA),
            block: Script::new(BLOCK_LUA),
        };
        store.load().await?;
        Ok(store)
    }

    /// Loads both scripts into the server's script cache.
    pub async fn load(&self) -> Result<(), RedisError> {
        let mut conn = self.conn.get();
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

impl RedisStore {
    /// A failed call: a timeout gets the connection replaced.
    fn failed(&self, e: redis::RedisError) -> RedisError {
        if e.is_timeout() {
            self.conn.replace();
        }
        RedisError::Script(e)
    }
}

/// The connection in use and how to make a new one.
struct Connection {
    client: redis::Client,
    timeout: Duration,
    current: RwLock<ConnectionManager>,
    /// A replacement is being connected: calls keep using the current one.
    replacing: AtomicBool,
}

impl Connection {
    async fn open(
        client: &redis::Client,
        timeout: Duration,
    ) -> redis::RedisResult<ConnectionManager> {
        let cfg = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(timeout))
            .set_response_timeout(Some(timeout))
            .set_number_of_retries(2);
        ConnectionManager::new_with_config(client.clone(), cfg).await
    }

    /// A handle on the current connection (cheap: it is multiplexed).
    fn get(&self) -> ConnectionManager {
        // A poisoned lock only means a writer panicked while swapping in a
        // whole handle; the handle it holds is still usable.
        self.current
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Connects a new connection in the background and swaps it in; at most
    /// one at a time. If Redis does not answer, the attempt fails and the
    /// next timeout tries again.
    fn replace(self: &Arc<Self>) {
        if self.replacing.swap(true, Ordering::AcqRel) {
            return;
        }
        let this = self.clone();
        tokio::spawn(async move {
            match Connection::open(&this.client, this.timeout).await {
                Ok(fresh) => {
                    *this.current.write().unwrap_or_else(|p| p.into_inner()) = fresh;
                    tracing::info!("Redis calls timed out; switched to a new connection");
                }
                Err(e) => {
                    tracing::debug!(error = %e, "new Redis connection failed; the next timeout tries again")
                }
            }
            this.replacing.store(false, Ordering::Release);
        });
    }
}

/// Keepalive probes and a user timeout, so the kernel notices a silent
/// peer in seconds rather than the ~15 minutes of TCP retransmissions.
fn tcp_settings(timeout: Duration) -> TcpSettings {
    let probe = Duration::from_secs(5);
    let keepalive = TcpKeepalive::new()
        .with_time(probe)
        .with_interval(Duration::from_secs(1))
        .with_retries(3);
    TcpSettings::default()
        .set_nodelay(true)
        .set_keepalive(keepalive)
        .set_user_timeout((timeout * 4).max(Duration::from_secs(10)))
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
        let mut conn = self.conn.get();
        let raw: Vec<i64> = inv
            .invoke_async(&mut conn)
            .await
            .map_err(|e| self.failed(e))?;
        Ok(Reply::from_slice(&raw)?)
    }

    async fn run_jobs(&self, call: &JobsCall) -> Result<Vec<JobsReply>, RedisError> {
        let mut inv = self.limiter.prepare_invoke();
        for k in call.keys() {
            inv.key(k);
        }
        for a in call.args() {
            inv.arg(a);
        }
        let mut conn = self.conn.get();
        let raw: Vec<i64> = inv
            .invoke_async(&mut conn)
            .await
            .map_err(|e| self.failed(e))?;
        Ok(JobsReply::many_from_slice(&raw)?)
    }

    async fn block(&self, key: &str, now_us: Option<u64>, dur_us: u64) -> Result<u64, RedisError> {
        let mut conn = self.conn.get();
        let until: u64 = self
            .block
            .key(key)
            .arg(now_us.map(|n| n.to_string()).unwrap_or_default())
            .arg(dur_us.max(1))
            .invoke_async(&mut conn)
            .await
            .map_err(|e| self.failed(e))?;
        Ok(until)
    }
}

impl RedisStore {
    /// `MEMORY USAGE key`: bytes a key takes, for the README's per-seller
    /// figures and the demo. `None` when the key does not exist.
    pub async fn memory_usage(&self, key: &str) -> Result<Option<u64>, RedisError> {
        let mut conn = self.conn.get();
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
