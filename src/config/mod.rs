//! Settings: `config/default.toml`, then an optional file from the command
//! line, then environment variables `THROTTLE__SECTION__KEY`.
//!
//! This module only reads and checks shapes; the limiter turns
//! [`LimitsConfig`] into validated rules. Every error names the file (or
//! "environment"), the key and the problem, because an operator reading a
//! crash loop has nothing else to go on.
//!
//! A leaf module: it depends on no other module of this crate.
//!
//! A section is a file: its types, as written and documented (the doc
//! comments are the config reference), and its `validate`, for what serde's
//! types cannot express. A value that needs parsing is parsed once, by its
//! type's `Deserialize`: durations in human form, [`RetryStatuses`].
//!
//! - `settings.rs`: [`Settings`], every section together; `[http]`; the
//!   check across sections (the producer carries the largest job's copy).
//! - `kafka.rs`: `[kafka]`, the retry tiers and librdkafka's property tables.
//! - `redis.rs`: `[redis]`, the limiter's Redis and what its faults mean.
//! - `downstream.rs`: `[downstream]` and [`RetryStatuses`].
//! - `worker.rs`: `[worker]`, what a replica holds in memory.
//! - `tracing.rs`: `[tracing]`, the export of job spans.
//! - `limits.rs`: `[limits]` as written; `limiter::Policy` checks the rules.
//!
//! The loader and what the sections share:
//!
//! - `load.rs`: the layers (defaults, file, `limits.file`, environment),
//!   [`Loaded`], and which layer set a key.
//! - `env.rs`: the environment's secret files (`…_FILE`) and librdkafka's
//!   dotted property names.
//! - `error.rs`: [`ConfigError`]. A section's `validate` names the key and
//!   a typed problem; the loader adds the file the value came from.
//! - `redact.rs`: secrets kept out of `Debug`.
//! - `duration.rs`: durations in human form (`"250ms"`, `"1m"`).
//! - `size.rs`: sizes in bytes, integers or with a unit (`"256MiB"`).
//! - `renames.rs`: [`RENAMED`], the keys renamed over time; an old name
//!   still loads, as a [`Deprecation`] on [`Loaded`].

mod downstream;
mod duration;
mod env;
mod error;
mod kafka;
mod limits;
mod load;
mod redact;
mod redis;
mod renames;
mod settings;
mod size;
mod tracing;
mod worker;

pub use downstream::{DownstreamSettings, RetryStatusError, RetryStatuses};
pub use env::PATH_KEYS;
pub use error::ConfigError;
pub use kafka::{tier_label, KafkaSettings, RetryTier, MAX_RETRY_TIER};
pub use limits::{LearnConfig, LimitsConfig, RuleConfig, SellerConfig};
pub use load::{load, load_from, Loaded, DEFAULT_NAME, DEFAULT_TOML};
pub use redact::{is_secret_property, redact_url};
pub use renames::{Deprecation, RENAMED};
pub use settings::{HttpSettings, Settings, COPY_OVERHEAD_BYTES};
pub use size::{parse_size, SizeError};
pub use worker::{OrderingKey, OrderingMode, WorkerSettings};
// `self::`: there is a `redis` crate too.
pub use self::redis::{OnError, OnStateLoss, RedisSettings, Topology, MAX_COALESCE_WINDOW};
pub use self::tracing::TracingSettings;

#[cfg(test)]
mod testing;
#[cfg(test)]
mod tests;
