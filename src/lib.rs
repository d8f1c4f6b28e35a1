//! throttle-worker: a Kafka consumer-side throttling worker.
//!
//! Many replicas join one consumer group; before a job calls the downstream
//! API it asks a shared, atomic Redis Lua limiter for a permit keyed by seller.
//!
//! - [`config`]: settings from `config/default.toml`, a file and the
//!   environment; errors name the file and key. Leaf module.
//! - [`limiter`]: rules, typed decisions, reference models and the Redis glue
//!   (the only module that talks to Redis).
//! - [`telemetry`]: logging setup. Leaf module.
//! - [`demo`]: the live limiter demo behind `throttle-worker limiter demo`.

pub mod config;
pub mod demo;
pub mod limiter;
pub mod telemetry;
