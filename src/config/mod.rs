//! Settings: `config/default.toml`, then an optional file from the command
//! line, then environment variables `THROTTLE__SECTION__KEY`.
//!
//! This module only reads and checks shapes; the limiter turns
//! [`LimitsConfig`] into validated rules. Every error names the file (or
//! "environment"), the key and the problem, because an operator reading a
//! crash loop has nothing else to go on.
//!
//! A leaf module: it depends on no other module of this crate.

mod downstream;
mod duration;
mod env;
mod error;
mod kafka;
mod limits;
mod load;
mod redact;
mod redis;
mod settings;
mod tracing;
mod worker;

pub use downstream::{DownstreamSettings, RetryStatusError, RetryStatuses};
pub use env::PATH_KEYS;
pub use error::ConfigError;
pub use kafka::{tier_label, KafkaSettings, RetryTier, MAX_RETRY_TIER};
pub use limits::{LimitsConfig, RuleConfig, SellerConfig};
pub use load::{load, load_from, Loaded, DEFAULT_NAME, DEFAULT_TOML};
pub use redact::{is_secret_property, redact_url};
pub use settings::{HttpSettings, Settings, COPY_OVERHEAD_BYTES};
pub use worker::WorkerSettings;
// `self::`: there is a `redis` crate too.
pub use self::redis::{
    OnError, OnStateLoss, RedisSettings, StateLayout, Topology, MAX_COALESCE_WINDOW,
};
pub use self::tracing::TracingSettings;

#[cfg(test)]
mod testing;
