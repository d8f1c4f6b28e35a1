//! How the store reaches Redis: the client (one server, over TLS or not, or
//! a Redis Cluster), its multiplexed connection, and the replacement of a
//! single server's connection after a timeout (see [`super::RedisStore`]
//! for why a timeout needs it).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::{ClusterClient, ClusterClientBuilder};
use redis::cluster_async::ClusterConnection;
use redis::io::tcp::{socket2::TcpKeepalive, TcpSettings};
use redis::{Cmd, IntoConnectionInfo, Pipeline, RedisFuture, Value};

use crate::config::RedisSettings;

use super::RedisError;

/// How to make a connection: to one server or to a cluster.
enum Client {
    // Both boxed: built once, and of very different sizes (the TLS
    // settings make the single client large too).
    Single(Box<redis::Client>),
    Cluster(Box<ClusterClient>),
}

impl Client {
    async fn open(&self, timeout: Duration) -> redis::RedisResult<Handle> {
        match self {
            Client::Single(client) => {
                let cfg = ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(timeout))
                    .set_response_timeout(Some(timeout))
                    .set_number_of_retries(2);
                ConnectionManager::new_with_config((**client).clone(), cfg)
                    .await
                    .map(Handle::Single)
            }
            Client::Cluster(client) => client.get_async_connection().await.map(Handle::Cluster),
        }
    }
}

/// A multiplexed connection, cheap to clone: a reconnecting connection to
/// one server, or a cluster connection that routes each call by its keys'
/// slot and follows MOVED and ASK.
#[derive(Clone)]
pub(super) enum Handle {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

impl ConnectionLike for Handle {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Handle::Single(c) => c.req_packed_command(cmd),
            Handle::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Handle::Single(c) => c.req_packed_commands(pipeline, offset, count),
            Handle::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Handle::Single(c) => c.get_db(),
            Handle::Cluster(c) => c.get_db(),
        }
    }
}

/// The connection in use and how to make a new one.
pub(super) struct Connection {
    client: Client,
    /// Each call's timeout, and the connect timeout of a replacement.
    timeout: Duration,
    current: RwLock<Handle>,
    /// A replacement is being connected: calls keep using the current one.
    replacing: AtomicBool,
}

impl Connection {
    /// One server at `url`.
    pub(super) async fn single(url: &str, timeout: Duration) -> Result<Connection, RedisError> {
        let shown = crate::config::redact_url(url);
        let url_error = |source| RedisError::Url {
            url: shown.clone(),
            source,
        };
        let info = url.into_connection_info().map_err(url_error)?;
        let info = info.set_tcp_settings(tcp_settings(timeout));
        let client = redis::Client::open(info).map_err(url_error)?;
        Connection::connect(Client::Single(Box::new(client)), timeout, shown).await
    }

    /// One server over TLS, with the CA and client certificate the settings
    /// name (`redis.tls_*_file`; the URL is `rediss://`).
    pub(super) async fn tls(settings: &RedisSettings) -> Result<Connection, RedisError> {
        let shown = crate::config::redact_url(&settings.url);
        let url_error = |source| RedisError::Url {
            url: shown.clone(),
            source,
        };
        let read = |path: &std::path::Path| {
            std::fs::read(path).map_err(|e| RedisError::Tls {
                file: path.display().to_string(),
                problem: e.to_string(),
            })
        };
        let root_cert = settings.tls_ca_file.as_deref().map(read).transpose()?;
        let client_tls = match (&settings.tls_cert_file, &settings.tls_key_file) {
            (Some(cert), Some(key)) => Some(redis::ClientTlsConfig {
                client_cert: read(cert)?,
                client_key: read(key)?,
            }),
            _ => None,
        };
        let info = settings
            .url
            .as_str()
            .into_connection_info()
            .map_err(url_error)?
            .set_tcp_settings(tcp_settings(settings.timeout));
        let client = redis::Client::build_with_tls(
            info,
            redis::TlsCertificates {
                client_tls,
                root_cert,
            },
        )
        .map_err(url_error)?;
        Connection::connect(Client::Single(Box::new(client)), settings.timeout, shown).await
    }

    /// A Redis Cluster through any of `seeds` (MOVED and ASK are followed,
    /// the slot map refreshed).
    pub(super) async fn cluster(
        seeds: &[String],
        timeout: Duration,
    ) -> Result<Connection, RedisError> {
        let shown = seeds
            .iter()
            .map(|u| crate::config::redact_url(u))
            .collect::<Vec<_>>()
            .join(",");
        let mut infos = Vec::with_capacity(seeds.len());
        for url in seeds {
            let info = url
                .as_str()
                .into_connection_info()
                .map_err(|source| RedisError::Url {
                    url: crate::config::redact_url(url),
                    source,
                })?;
            infos.push(info);
        }
        let client = ClusterClientBuilder::new(infos)
            .connection_timeout(timeout)
            .response_timeout(timeout)
            .tcp_settings(tcp_settings(timeout))
            .retries(2)
            .build()
            .map_err(|source| RedisError::Url {
                url: shown.clone(),
                source,
            })?;
        Connection::connect(Client::Cluster(Box::new(client)), timeout, shown).await
    }

    /// Opens the first connection and checks it with PING; `shown` names
    /// the server(s) in the error, without a password.
    async fn connect(
        client: Client,
        timeout: Duration,
        shown: String,
    ) -> Result<Connection, RedisError> {
        let mut conn = client
            .open(timeout)
            .await
            .map_err(|source| RedisError::Connect {
                url: shown.clone(),
                source,
            })?;
        let _: Value = redis::cmd("PING")
            .query_async(&mut conn)
            .await
            .map_err(|source| RedisError::Connect { url: shown, source })?;
        Ok(Connection {
            client,
            timeout,
            current: RwLock::new(conn),
            replacing: AtomicBool::new(false),
        })
    }

    /// A handle on the current connection (cheap: it is multiplexed).
    pub(super) fn get(&self) -> Handle {
        // A poisoned lock only means a writer panicked while swapping in a
        // whole handle; the handle it holds is still usable.
        self.current
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Each call's timeout (`redis.timeout`).
    pub(super) fn timeout(&self) -> Duration {
        self.timeout
    }

    /// After a failed call: a timeout gets a single server's connection
    /// replaced (a cluster's is not: see [`super::RedisStore`]).
    pub(super) fn failed(self: &Arc<Self>, e: &redis::RedisError) {
        if e.is_timeout() && matches!(self.client, Client::Single(_)) {
            self.replace();
        }
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
            match this.client.open(this.timeout).await {
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
