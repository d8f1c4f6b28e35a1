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
//! - `admin`: plain commands beside the Lua: overrides and pauses hashes,
//!   `limits reset`, `TIME`, memory usage.

mod admin;
mod clock;
mod connection;
mod scripts;
mod store;

use std::sync::Arc;
use std::time::Duration;

use crate::config::{RedisSettings, Topology};

use super::reply::MalformedReply;
use super::script::FunctionLibrary;

use clock::RedisClock;
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
