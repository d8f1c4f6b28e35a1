//! throttle-worker: a Kafka consumer-side throttling worker.
//!
//! Many replicas join one consumer group; before a job calls the downstream
//! API it asks a shared, atomic Redis Lua limiter for a permit keyed by seller.
//!
//! - [`limiter`]: rules, typed decisions, reference models and the Redis glue.
//! - [`job`]: the job envelope a Kafka record carries, and its checks.
//! - [`downstream`]: the HTTP client; classifies answers into typed outcomes.
//! - [`kafka`]: offset tracking, retry/DLQ producer, embedded dev broker.

pub mod downstream;
pub mod job;
pub mod kafka;
pub mod limiter;
