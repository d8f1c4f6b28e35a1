//! Tools to demo and test the product, not to run it: built with the
//! `dev-tools` cargo feature (on by default), absent from the production
//! binary (`cargo build --release --no-default-features`). No product
//! module imports this one; `cli` names it for the tools' subcommands.
//!
//! - [`demo`]: `throttle-worker demo`, the whole pipeline on one machine,
//!   and `limiter-demo`, the limiter alone.
//! - [`load`]: the load generator behind `throttle-worker produce`.
//! - [`stub`]: `throttle-worker stub`, the downstream stub (the demo's and
//!   docker-compose's).
//!
//! The mock broker they run on (`DevBroker`, `throttle-worker dev-broker`)
//! is `kafka::mock`, behind the same feature: it is rdkafka code, and
//! `kafka` is rdkafka's one owner.

pub mod demo;
pub mod load;
pub mod stub;
