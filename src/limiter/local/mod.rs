//! The production half of the reference model: the limiter scripts'
//! algorithms in pure Rust, and what `redis.on_error = "local"` runs with
//! them while Redis does not answer. An edit here changes the fallback.
//!
//! They are also the specification the Lua is tested against step by step:
//! for the same store, time and arguments, [`run`] returns the same ten
//! integers as `lua/limiter.lua` and leaves the same state
//! (`tests/limiter/agreement.rs`, on random rule sets and arrival sequences
//! against a real Redis). What only tests run, the job-list driver, the
//! block, the manual clock, key listing, is the other half,
//! [`testkit`](super::testkit), outside the product.
//!
//! - [`share`]: [`LocalShare`], the fallback: a replica's share of every
//!   limit, one [`ModelLimiter`] per seller, on the host's [`WallClock`].
//! - `limiter`: [`ModelLimiter`], the model as a limiter for one seller
//!   over an injected [`Clock`]: the same typed decisions as the Redis
//!   limiter, with no Redis.
//! - `decide`: `lua/limiter.lua` ([`run`]: one decision over all of a
//!   seller's rules) and the per-algorithm contract of `lua/common.lua`
//!   ([`Algo`]: cap, load, avail, wait, left, reset, go, take, refund).
//! - `store`: the keyspace in memory ([`ModelStore`], [`State`]).
//! - one file per algorithm, each implementing [`Algo`];
//! - [`convert`]: what a rule edit does to the state it finds at its place.
//!
//! All arithmetic is exact `i128`; the scripts use integer-valued doubles,
//! which agree as long as every product stays below 2^53. The model and the
//! scripts are meant to agree on every call with a cost of at least 1 over
//! rules that [`Rule::new`](crate::limiter::Rule::new) accepts (which keeps
//! `limit * period_us` and `burst * period_us` below 2^53).
//!
//! Key expiry is not modelled: every script leaves one second of slack on its
//! TTLs and reads stale state as if the key were gone, so the decisions are
//! the same.

// `with_algo!`, defined in `algo`, is used by the files below it.
#[macro_use]
mod algo;
pub mod convert;
pub(crate) mod decide;

pub mod burst_fill;
pub mod fixed_window;
pub mod gcra;
pub mod leaky_bucket;
mod limiter;
pub mod share;
pub mod sliding_window_counter;
pub mod sliding_window_log;
mod state;
mod store;
pub mod token_bucket;

pub use algo::{cdiv, drained_refund, fdiv, tat_debt, tat_store, Algo, Params};
pub use burst_fill::BurstFill;
pub use decide::{run, Op};
pub use fixed_window::FixedWindow;
pub use gcra::Gcra;
pub use leaky_bucket::LeakyBucket;
pub use limiter::{Clock, ModelLimiter};
pub use share::{granted, scaled, LocalShare, WallClock};
pub use sliding_window_counter::SlidingWindowCounter;
pub use sliding_window_log::{Log, SlidingWindowLog};
#[cfg(any(test, feature = "testkit"))]
pub use store::CallsFields;
pub use store::{ModelStore, State, Tat};
pub use token_bucket::TokenBucket;

#[cfg(test)]
pub(crate) mod tables;
