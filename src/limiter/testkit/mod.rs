//! The test half of the reference model: what only tests run, compiled
//! with `cfg(test)` or the `testkit` cargo feature, which the crate's own
//! dev-dependency turns on for the integration tests, benches and doc
//! tests. The product never has it (`cargo build --no-default-features`
//! and `cargo build --release` leave it out), so an edit here cannot change
//! the local fallback, and the fallback's half ([`local`](super::local))
//! cannot lean on anything here.
//!
//! - [`jobs`]: `lua/jobs.lua` and the cancel of `lua/calls.lua`
//!   ([`run_jobs`], [`cancel`]): the worker's job-list calls, the oracle of
//!   `limiter::jobs`, `limiter::cancel` and the agreement tests, and the
//!   simulation's Redis.
//! - [`calls`]: the records of `lua/calls.lua` (refund by call id).
//! - `slots`: the leases of `lua/slots.lua` (`max_in_flight`).
//! - this file: [`block`] (`lua/block.lua`), [`ManualClock`], and
//!   [`ModelStore::keys`].
//! - `model_tests`: the unit tests of the fallback's half (`local::run`,
//!   `ModelLimiter`), here because they use this half.

pub mod calls;
#[cfg(test)]
pub(crate) mod convert_tests;
pub mod jobs;
#[cfg(test)]
mod model_tests;
mod slots;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

pub use jobs::{cancel, run_guarded, run_jobs};

use crate::limiter::local::{Clock, ModelLimiter, ModelStore, State};
use crate::limiter::script::{BlockAt, BlockRead};

impl ModelStore {
    /// Every key present, sorted. Key expiry is not modelled, so this also
    /// lists keys that Redis would already have expired.
    pub fn keys(&self) -> Vec<String> {
        let mut keys: Vec<String> = self.entries.keys().cloned().collect();
        keys.sort();
        keys
    }
}

/// `lua/block.lua`: hold the seller until `now_us + dur_us`; a shorter block
/// never shortens a longer one. Returns the µs instant the block ends.
///
/// # Panics
///
/// If the block is not read from the seller's hash (`BlockRead::Field`):
/// the script refuses any other token with an error reply.
pub fn block(store: &mut ModelStore, at: &BlockAt, now_us: u64, dur_us: u64) -> u64 {
    assert_eq!(
        at.read,
        BlockRead::Field,
        "a block lives in the seller's hash"
    );
    let until = i128::from(now_us) + i128::from(dur_us);
    let addr = format!("{}#block", at.key);
    match store.get(&addr) {
        Some(State::Block(current)) if *current >= until => *current as u64,
        _ => {
            store.put(&addr, State::Block(until));
            until as u64
        }
    }
}

/// A clock that moves only when told; clones share the same time, so a test
/// keeps one handle and gives the other to the limiter.
#[derive(Debug, Clone, Default)]
pub struct ManualClock {
    now_us: Arc<AtomicU64>,
}

impl ManualClock {
    pub fn new(now_us: u64) -> ManualClock {
        ManualClock {
            now_us: Arc::new(AtomicU64::new(now_us)),
        }
    }

    pub fn advance(&self, by: Duration) {
        let by = u64::try_from(by.as_micros()).unwrap_or(u64::MAX);
        self.now_us.fetch_add(by, Ordering::SeqCst);
    }

    pub fn set(&self, now_us: u64) {
        self.now_us.store(now_us, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_us(&self) -> u64 {
        self.now_us.load(Ordering::SeqCst)
    }
}

impl<C: Clock> ModelLimiter<C> {
    /// Blocks the seller for `dur` (the downstream answered 429); returns
    /// the µs instant the block ends.
    pub fn block(&mut self, dur: Duration) -> u64 {
        let dur_us = u64::try_from(dur.as_micros()).unwrap_or(u64::MAX);
        let now_us = self.clock().now_us();
        block(
            &mut self.store,
            &BlockAt::new(Self::BLOCK_KEY, BlockRead::Field),
            now_us,
            dur_us,
        )
    }
}
