//! The Redis glue: the only module that imports `redis`. It loads the
//! limiter as a Redis Functions library and runs it with FCALL (loading it
//! again when a server has lost it: a restart without persistence, FUNCTION
//! FLUSH, a cluster master that joined later), or, on a server without
//! Functions, as scripts with EVALSHA (loading again on NOSCRIPT), and
//! hands back the raw [`Reply`](super::Reply). It makes
//! no decision about what a Redis failure means: the error goes back to the
//! caller.
//!
//! - `connection`: the client (one server, TLS, a cluster), its
//!   multiplexed connection, replaced after a timeout.
//! - `clock`: where Redis' clock stands against ours, from the replies.
//! - `scripts`: the Lua as a Functions library (FCALL) or as scripts
//!   (EVALSHA), loaded again when the server lost it.
//! - `store`: the limiter's calls, [`Store`](super::Store) on Redis.

mod clock;
mod connection;
mod scripts;
mod store;

use std::sync::Arc;
use std::time::Duration;

use crate::config::{RedisSettings, Topology};

use super::reply::MalformedReply;
use super::script::FunctionLibrary;

use clock::{local_us, RedisClock};
use connection::Connection;
use scripts::Runner;
pub use scripts::Scripts;

/// Why a Redis call failed.
#[derive(Debug, thiserror::Error)]
pub enum RedisError {
    #[error("Redis TLS file {file}: {problem}")]
    Tls { file: String, problem: String },
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
/// the kernel gives the socket up, minutes later. So a timeout replaces a
/// single server's connection in the background, and the sockets carry TCP
/// keepalive and a user timeout that bound how long the kernel waits for a
/// silent peer. A cluster connection is not replaced: one master's timeout
/// would fail the calls in flight to every healthy master (after they had
/// run, so they were charged and nobody was told), and the cluster client
/// reconnects node by node by itself.
#[derive(Clone)]
pub struct RedisStore {
    conn: Arc<Connection>,
    scripts: Arc<Runner>,
    clock: Arc<RedisClock>,
}

impl RedisStore {
    /// Connects as `settings.topology` says: one server at `url`, or a
    /// Redis Cluster discovered from `url` and `cluster_nodes`.
    pub async fn open(settings: &RedisSettings) -> Result<RedisStore, RedisError> {
        match settings.topology {
            Topology::Single
                if settings.tls_ca_file.is_some() || settings.tls_cert_file.is_some() =>
            {
                RedisStore::connect_tls(settings).await
            }
            Topology::Single => RedisStore::connect(&settings.url, settings.timeout).await,
            Topology::Cluster => {
                let mut seeds = vec![settings.url.clone()];
                seeds.extend(settings.cluster_nodes.iter().cloned());
                RedisStore::connect_cluster(&seeds, settings.timeout).await
            }
        }
    }

    /// Connects to one server, checks it with PING and loads both scripts,
    /// so that a misconfigured Redis stops startup instead of the first job.
    pub async fn connect(url: &str, timeout: Duration) -> Result<RedisStore, RedisError> {
        RedisStore::start(Connection::single(url, timeout).await?).await
    }

    /// [`RedisStore::connect`] over TLS with the CA and client certificate
    /// the settings name (`redis.tls_*_file`; the URL is `rediss://`).
    pub async fn connect_tls(settings: &RedisSettings) -> Result<RedisStore, RedisError> {
        RedisStore::start(Connection::tls(settings).await?).await
    }

    /// Connects to a Redis Cluster through any of `seeds` (MOVED and ASK are
    /// followed, the slot map refreshed), checks it and loads both scripts
    /// on every primary. Each limiter call's keys share one hash slot.
    pub async fn connect_cluster(
        seeds: &[String],
        timeout: Duration,
    ) -> Result<RedisStore, RedisError> {
        RedisStore::start(Connection::cluster(seeds, timeout).await?).await
    }

    async fn start(conn: Connection) -> Result<RedisStore, RedisError> {
        let store = RedisStore {
            conn: Arc::new(conn),
            scripts: Arc::new(Runner::new()),
            clock: Arc::new(RedisClock::new()),
        };
        store.load().await?;
        Ok(store)
    }

    /// Loads the Functions library (every primary of a cluster), or, where
    /// the server cannot run Functions, both scripts into its script cache.
    pub async fn load(&self) -> Result<(), RedisError> {
        self.scripts.load(&self.conn).await
    }

    /// Runs the limiter as EVALSHA scripts from now on (a server without
    /// Functions does this by itself; benchmarks compare the two).
    pub async fn use_eval_scripts(&self) -> Result<(), RedisError> {
        self.scripts.use_eval(&self.conn).await
    }

    /// How the limiter runs on this server.
    pub fn scripts(&self) -> Scripts {
        self.scripts.mode()
    }

    /// The library loaded with Functions (its name and FCALL names).
    pub fn library(&self) -> &FunctionLibrary {
        self.scripts.library()
    }

    /// SHA1 of the limiter script, e.g. for `redis-benchmark EVALSHA`.
    pub fn limiter_sha(&self) -> &str {
        self.scripts.limiter_sha()
    }
}

impl RedisStore {
    /// Members of a sorted set scored above `min` (`ZCOUNT key (min
    /// +inf`): the leases of `max_in_flight` not lapsed at `min` µs.
    pub async fn count_above(&self, key: &str, min: u64) -> Result<u64, RedisError> {
        let mut conn = self.conn.get();
        redis::cmd("ZCOUNT")
            .arg(key)
            .arg(format!("({min}"))
            .arg("+inf")
            .query_async(&mut conn)
            .await
            .map_err(RedisError::Script)
    }

    /// Redis' clock in Unix ms (`TIME`): every replica and operator
    /// command reads the same one, whatever their own clocks say.
    pub async fn time_ms(&self) -> Result<u64, RedisError> {
        let mut conn = self.conn.get();
        let (s, us): (u64, u64) = redis::cmd("TIME")
            .query_async(&mut conn)
            .await
            .map_err(RedisError::Script)?;
        let redis_us = s * 1_000_000 + us;
        self.clock
            .observe(i64::try_from(redis_us).unwrap_or(i64::MAX), local_us());
        Ok(redis_us / 1000)
    }

    /// Every field of a hash (`HGETALL`): the overrides, the pauses.
    pub async fn read_hash(
        &self,
        key: &str,
    ) -> Result<std::collections::HashMap<String, String>, RedisError> {
        let mut conn = self.conn.get();
        redis::cmd("HGETALL")
            .arg(key)
            .query_async(&mut conn)
            .await
            .map_err(RedisError::Script)
    }

    /// Sets one field of a hash that is kept until deleted (`HSET`): an
    /// override, a pause.
    pub async fn set_field(&self, key: &str, field: &str, value: &str) -> Result<(), RedisError> {
        let mut conn = self.conn.get();
        redis::cmd("HSET")
            .arg(key)
            .arg(field)
            .arg(value)
            .query_async::<i64>(&mut conn)
            .await
            .map(|_| ())
            .map_err(RedisError::Script)
    }

    /// Removes fields of a hash (`HDEL`); returns how many there were.
    pub async fn delete_fields(&self, key: &str, fields: &[String]) -> Result<u64, RedisError> {
        if fields.is_empty() {
            return Ok(0);
        }
        let mut conn = self.conn.get();
        redis::cmd("HDEL")
            .arg(key)
            .arg(fields)
            .query_async(&mut conn)
            .await
            .map_err(RedisError::Script)
    }

    /// One field of a hash (`HGET`); `None` when absent.
    pub async fn hash_field(&self, key: &str, field: &str) -> Result<Option<String>, RedisError> {
        let mut conn = self.conn.get();
        redis::cmd("HGET")
            .arg(key)
            .arg(field)
            .query_async(&mut conn)
            .await
            .map_err(RedisError::Script)
    }

    /// Several fields of a hash in one call (`HMGET`), in the order asked;
    /// `None` for each absent one.
    pub async fn hash_fields(
        &self,
        key: &str,
        fields: &[String],
    ) -> Result<Vec<Option<String>>, RedisError> {
        if fields.is_empty() {
            return Ok(Vec::new());
        }
        let mut conn = self.conn.get();
        redis::cmd("HMGET")
            .arg(key)
            .arg(fields)
            .query_async(&mut conn)
            .await
            .map_err(RedisError::Script)
    }

    /// Sets one field of a hash and keeps the hash `ttl` from now (`HSET`
    /// then `PEXPIRE`, atomically).
    pub async fn set_hash_field(
        &self,
        key: &str,
        field: &str,
        value: &str,
        ttl: Duration,
    ) -> Result<(), RedisError> {
        let fields = [(field.to_owned(), value.to_owned())];
        self.hset_expire(key, &fields, ttl, true).await
    }

    /// Sets fields of a hash, then keeps the hash `ttl` from now (`HSET`
    /// and `PEXPIRE` in one round trip, not a transaction: the worker's
    /// ACL has no `MULTI`, and a hash left without its new expiry keeps
    /// the old one).
    pub async fn set_hash_fields(
        &self,
        key: &str,
        fields: &[(String, String)],
        ttl: Duration,
    ) -> Result<(), RedisError> {
        if fields.is_empty() {
            return Ok(());
        }
        self.hset_expire(key, fields, ttl, false).await
    }

    async fn hset_expire(
        &self,
        key: &str,
        fields: &[(String, String)],
        ttl: Duration,
        atomic: bool,
    ) -> Result<(), RedisError> {
        let mut conn = self.conn.get();
        let mut hset = redis::cmd("HSET");
        hset.arg(key);
        for (field, value) in fields {
            hset.arg(field).arg(value);
        }
        let mut pipe = redis::pipe();
        if atomic {
            pipe.atomic();
        }
        pipe.add_command(hset)
            .ignore()
            .cmd("PEXPIRE")
            .arg(key)
            .arg(ttl.as_millis() as u64)
            .ignore()
            .query_async::<()>(&mut conn)
            .await
            .map_err(RedisError::Script)
    }

    /// `DEL keys…` (one slot: a seller's keys share a hash tag); returns how
    /// many existed. For `limits reset`.
    pub async fn delete(&self, keys: &[String]) -> Result<u64, RedisError> {
        let mut conn = self.conn.get();
        redis::cmd("DEL")
            .arg(keys)
            .query_async(&mut conn)
            .await
            .map_err(RedisError::Script)
    }

    /// The install's layout marker under `prefix` (`None` when there is
    /// none), for [`super::layout::choose`].
    pub async fn layout_marker(&self, prefix: &str) -> Result<Option<String>, RedisError> {
        let mut conn = self.conn.get();
        redis::cmd("GET")
            .arg(super::layout::marker_key(prefix))
            .query_async(&mut conn)
            .await
            .map_err(RedisError::Script)
    }

    /// Records the layout this replica runs in the install's marker.
    pub async fn mark_layout(
        &self,
        prefix: &str,
        layout: crate::config::StateLayout,
    ) -> Result<(), RedisError> {
        let mut conn = self.conn.get();
        redis::cmd("SET")
            .arg(super::layout::marker_key(prefix))
            .arg(super::layout::marker_value(layout))
            .query_async::<()>(&mut conn)
            .await
            .map_err(RedisError::Script)
    }

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
