//! `[redis]`: the Redis behind the limiter, how it is deployed, and what a
//! failed limiter call or a loss of its state means for the jobs.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use super::duration::{human_duration, period_or_duration};
use super::error::{self, Invalid};
use super::redact::redact_url;
use super::size::human_size;

/// Upper bound of `redis.coalesce_window`: a longer window holds every ask
/// for more than a Redis round trip, which costs more latency than it saves
/// Redis. The coalescer (`limiter::coalesce`) reads it too.
pub const MAX_COALESCE_WINDOW: Duration = Duration::from_millis(1);

/// `[redis]`. `Debug` hides the password of every URL.
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RedisSettings {
    /// `redis://[user:password@]host:port[/db]`; the password is never logged.
    pub url: String,
    /// Prefix of every key the limiter writes.
    pub key_prefix: String,
    /// `single`: global rules are checked in the same script call as the
    /// seller's (exact). `cluster`: the global keys live in another slot, so
    /// they are checked in a second call that refunds the seller's units when
    /// the global rule refuses.
    pub topology: Topology,
    /// Longest a limiter call may take before it counts as a Redis failure.
    #[serde(deserialize_with = "human_duration")]
    pub timeout: Duration,
    /// `/readyz` reports Redis down after this many failed limiter calls in
    /// a row (and ready again after the next success).
    pub unready_after_failures: u32,
    /// What a limiter call that fails (Redis down or timed out) means:
    /// `fail_closed` (jobs wait with backoff), `fail_open` (jobs pass
    /// unchecked, counted and logged) or `local` (each replica enforces its
    /// share of every limit in memory).
    pub on_error: OnError,
    /// What a replica does when Redis has lost the limiter's state (a
    /// restart without persistence, a failover to a replica that missed
    /// writes, an eviction): `wait` (no seller passes its limit across the
    /// loss: a seller whose state is gone waits up to one period per rule,
    /// or `state_loss_wait`) or `admit` (the lost state counts as fresh:
    /// each seller may get one extra window). Either way the loss is
    /// logged once and counted (`throttle_limiter_state_lost_total`). A
    /// new install (a consumer group that has never committed) is not a
    /// loss: nobody waits.
    #[serde(default)]
    pub on_state_loss: OnStateLoss,
    /// With `on_state_loss = "wait"`: the longest a loss holds a seller
    /// whose rule would count a whole use longer (an hourly window, a daily
    /// quota). During the hold each replica writes back its own grants
    /// (`restore_bytes`), so the seller goes on from what the fleet had
    /// granted; what a replica restarted since had granted is not
    /// restored. `"3s"` by default; `"period"` holds as long as a whole use
    /// of each rule would count (up to a day with a daily rule), and
    /// restores nothing.
    #[serde(default, deserialize_with = "period_or_duration")]
    pub state_loss_wait: Option<Duration>,
    /// With a bounded `state_loss_wait`: the bytes each replica keeps of
    /// its own recent grants, per seller and rule, to write them back when
    /// Redis loses its state (`lua/restore.lua`). The least recently
    /// granted sellers are forgotten first; a forgotten seller's part is
    /// not restored. An integer or a size with a unit, e.g. "16MiB".
    #[serde(deserialize_with = "human_size")]
    pub restore_bytes: usize,
    /// Most sellers' asks carried by one limiter call (coalescing); 1
    /// sends each ask on its own.
    pub max_coalesced: usize,
    /// How long a limiter call waits for more sellers' asks after the
    /// first; 0 takes only the asks already queued. At most 1ms.
    #[serde(deserialize_with = "human_duration")]
    pub coalesce_window: Duration,
    /// With `topology = "cluster"`: more seed nodes beside `url`
    /// (`redis://host:port`), in case that one is down at startup.
    pub cluster_nodes: Vec<String>,
    /// With a `rediss://` URL: the CA that signed the server's certificate
    /// (PEM), instead of the system's trust store.
    #[serde(default)]
    pub tls_ca_file: Option<PathBuf>,
    /// With a `rediss://` URL: a client certificate (PEM) for servers that
    /// require one (`tls-auth-clients yes`); give `tls_key_file` with it.
    #[serde(default)]
    pub tls_cert_file: Option<PathBuf>,
    /// The client certificate's private key (PEM).
    #[serde(default)]
    pub tls_key_file: Option<PathBuf>,
}

impl fmt::Debug for RedisSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisSettings")
            .field("url", &redact_url(&self.url))
            .field("key_prefix", &self.key_prefix)
            .field("topology", &self.topology)
            .field("timeout", &self.timeout)
            .field("unready_after_failures", &self.unready_after_failures)
            .field("on_error", &self.on_error)
            .field("on_state_loss", &self.on_state_loss)
            .field("state_loss_wait", &self.state_loss_wait)
            .field("restore_bytes", &self.restore_bytes)
            .field("max_coalesced", &self.max_coalesced)
            .field("coalesce_window", &self.coalesce_window)
            .field(
                "cluster_nodes",
                &self
                    .cluster_nodes
                    .iter()
                    .map(|u| redact_url(u))
                    .collect::<Vec<_>>(),
            )
            .field("tls_ca_file", &self.tls_ca_file)
            .field("tls_cert_file", &self.tls_cert_file)
            .field("tls_key_file", &self.tls_key_file)
            .finish()
    }
}

/// `redis.on_error`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnError {
    FailClosed,
    FailOpen,
    Local,
}

/// `redis.on_state_loss`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnStateLoss {
    /// Charge each seller's lost state as a whole use at the loss.
    #[default]
    Wait,
    /// Read the lost state as fresh.
    Admit,
}

impl OnStateLoss {
    /// The guard's token in a jobs call (`lua/jobs.lua`).
    pub fn wire(self) -> &'static str {
        match self {
            OnStateLoss::Wait => "wait",
            OnStateLoss::Admit => "admit",
        }
    }
}

/// How the Redis behind the limiter is deployed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Topology {
    Single,
    Cluster,
}

impl RedisSettings {
    /// Checks that serde's types cannot express.
    pub(super) fn validate(&self) -> Result<(), Invalid> {
        error::nonempty(&[
            ("redis.url", &self.url),
            ("redis.key_prefix", &self.key_prefix),
        ])?;
        if self.key_prefix.contains(['{', '}']) {
            return Err(Invalid::new(
                "redis.key_prefix",
                RedisProblem::BracesInKeyPrefix,
            ));
        }
        self.validate_tls()?;
        if !self.cluster_nodes.is_empty() && self.topology != Topology::Cluster {
            return Err(Invalid::new(
                "redis.cluster_nodes",
                RedisProblem::ClusterNodesWithoutCluster,
            ));
        }
        error::at_least_one(&[
            (
                "redis.unready_after_failures",
                u64::from(self.unready_after_failures),
            ),
            ("redis.max_coalesced", self.max_coalesced as u64),
        ])?;
        error::longer_than_zero(&[("redis.timeout", self.timeout)])?;
        if self.coalesce_window > MAX_COALESCE_WINDOW {
            return Err(Invalid::new(
                "redis.coalesce_window",
                RedisProblem::CoalesceWindowTooLong,
            ));
        }
        Ok(())
    }

    /// The TLS files: only with a `rediss://` URL, present, not with a
    /// cluster, and a client certificate with its key.
    fn validate_tls(&self) -> Result<(), Invalid> {
        let tls_files = [
            ("redis.tls_ca_file", &self.tls_ca_file),
            ("redis.tls_cert_file", &self.tls_cert_file),
            ("redis.tls_key_file", &self.tls_key_file),
        ];
        for (key, file) in tls_files {
            let Some(path) = file else { continue };
            if !self.url.starts_with("rediss://") {
                return Err(Invalid::new(key, RedisProblem::TlsWithoutTlsUrl));
            }
            if !path.is_file() {
                return Err(Invalid::new(key, RedisProblem::NoSuchFile(path.clone())));
            }
            if self.topology == Topology::Cluster {
                return Err(Invalid::new(key, RedisProblem::TlsWithCluster));
            }
        }
        if self.tls_cert_file.is_some() != self.tls_key_file.is_some() {
            let key = if self.tls_cert_file.is_some() {
                "redis.tls_key_file"
            } else {
                "redis.tls_cert_file"
            };
            return Err(Invalid::new(key, RedisProblem::HalfAClientCertificate));
        }
        Ok(())
    }
}

/// What is wrong with a value of `[redis]`.
#[derive(Debug, thiserror::Error)]
pub(super) enum RedisProblem {
    #[error("must not contain '{{' or '}}': the limiter puts each seller in its own hash tag")]
    BracesInKeyPrefix,
    #[error("is only used with a TLS URL (rediss://host:port)")]
    TlsWithoutTlsUrl,
    #[error("{}: no such file", .0.display())]
    NoSuchFile(PathBuf),
    #[error("is not supported with topology = \"cluster\": the cluster client trusts the system's store (install the CA there)")]
    TlsWithCluster,
    #[error("a client certificate needs both tls_cert_file and tls_key_file")]
    HalfAClientCertificate,
    #[error("is only used with redis.topology = \"cluster\"")]
    ClusterNodesWithoutCluster,
    #[error("must be at most 1ms (longer holds every job for more than a Redis round trip)")]
    CoalesceWindowTooLong,
}
