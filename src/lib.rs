//! throttle-worker: a Kafka consumer-side throttling worker.
//!
//! Many replicas join one consumer group; before a job calls the downstream
//! API it asks a shared, atomic Redis Lua limiter for a permit keyed by seller.
//!
//! - [`backoff`]: retry delays, exponential with equal jitter. Leaf module.
//! - [`cli`]: the binary's command line as clap definitions (`main.rs`
//!   dispatches), so tests can check a command line.
//! - [`config`]: settings from `config/default.toml`, a file and the
//!   environment; errors name the file and key. Leaf module.
//! - [`dead_letter`]: the reason kinds of dead letters, the one list the
//!   worker assigns from, `dlq --reason` accepts and the docs describe.
//!   Leaf module.
//! - [`job`]: the job envelope and its parsing; a bad record gets a reason
//!   fit for the dead-letter header.
//! - [`limiter`]: rules, typed decisions, reference models and the Redis glue
//!   (the only module that talks to Redis). The reference model is in two
//!   halves: `limiter::local`, the algorithms the in-memory fallback
//!   (`redis.on_error = "local"`) runs, in the product; and
//!   `limiter::testkit`, what only tests run (the job-list driver, the
//!   block, a manual clock), built with `cfg(test)` or the `testkit`
//!   feature, never in the product. [`Limiter`](limiter::Limiter)
//!   lives in `limiter/core.rs`, the worker's job lists in `limiter/jobs.rs`;
//!   `limiter/mod.rs` says which file holds which part of it, and which
//!   request pipeline serves which caller.
//! - [`downstream`]: the HTTP client (the only module importing reqwest) and
//!   the classification of its answers: done, retry-after, retryable, fatal.
//! - [`kafka`]: consumer, offset tracker, retry/dead-letter producer, the
//!   topic reader `dlq` reads with, and, with `dev-tools`, the embedded mock
//!   broker (the only module importing rdkafka). Whether this replica still
//!   owns a record's partition assignment is
//!   [`Ownership`](kafka::consumer::Ownership) (`owns`); a partition is a
//!   [`TopicPartition`](kafka::consumer::TopicPartition).
//! - [`worker`]: one job's path, decode → permit → call → outcome, for many
//!   sellers at once without head-of-line blocking. The engine
//!   (`worker::engine`) carries out what its components decide (scheduler,
//!   admission, retry tiers, outage, ...), which own their state and do no
//!   I/O. The limiter as the worker sees it is the
//!   [`Permits`](worker::Permits) trait.
//! - [`telemetry`]: logging, typed events, the Prometheus metrics, the HTTP
//!   endpoints and traces (W3C trace context, job spans through OTLP).
//!   Leaf module.
//! - [`dlq`]: `throttle-worker dlq stats|show|replay`, the dead-letter topic
//!   read outside the group, counted or listed by reason, seller and age,
//!   and replayed to the jobs topic, each record exactly once.
//! - [`operator`]: the operator commands (`limits show|reset|override|pause|resume|list|peek`,
//!   `check-config`), as tables or JSON; the confirmation a fleet-wide
//!   action needs (`operator::confirm`) and the exit codes of every
//!   command ([`ExitCode`](operator::ExitCode)).
//!
//! The tools, to demo and test the product, not to run it: built with the
//! `dev-tools` cargo feature (on by default); `cargo build --release
//! --no-default-features` is the production binary, without them.
//!
//! - `dev`: the tools. No product module imports it: only [`cli`]
//!   names it, for the tools' subcommands, under the feature.
//!   - `dev::demo`: `throttle-worker demo`, the whole pipeline on one
//!     machine (mock broker, stub, replicas as child processes, load, live
//!     view, a summary that checks the limits held), and `limiter-demo`.
//!   - `dev::load`: the load generator behind `throttle-worker produce`.
//!   - `dev::stub`: `throttle-worker stub`, a downstream that counts per
//!     seller and can answer 429 (the demo's, and docker-compose's).
//! - `kafka::mock`: the mock broker (`DevBroker`, `throttle-worker
//!   dev-broker`), in [`kafka`] because it is rdkafka code.

pub mod backoff;
pub mod cli;
pub mod config;
pub mod dead_letter;
#[cfg(feature = "dev-tools")]
pub mod dev;
pub mod dlq;
pub mod downstream;
pub mod job;
pub mod kafka;
pub mod limiter;
pub mod operator;
pub mod telemetry;
pub mod worker;
