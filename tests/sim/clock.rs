//! Simulated time: tokio's paused clock for monotonic time, and two wall
//! clocks on top of it: the store's (Redis `TIME`, which never jumps) and
//! the worker host's, which the world makes jump, backwards too.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

use throttle_worker::worker::Clock;
use tokio::time::Instant;

use super::ports::Stall;

/// 2026-11-01 00:00 UTC, in µs: the wall clocks' start.
pub const EPOCH_US: u64 = 1_793_491_200_000_000;

#[derive(Debug)]
pub struct SimClock {
    start: Instant,
    /// The worker host's clock minus the store's (or `host`'s), in µs.
    skew_us: AtomicI64,
    /// A process's own clock reads the world's host clock (with its jumps)
    /// plus its skew.
    host: Option<Arc<SimClock>>,
    /// A process that may stall reads the instant its stall ends while it
    /// lasts: its code runs then.
    stall: Option<Arc<Stall>>,
}

impl SimClock {
    /// Call inside the paused runtime.
    pub fn new() -> SimClock {
        SimClock {
            start: Instant::now(),
            skew_us: AtomicI64::new(0),
            host: None,
            stall: None,
        }
    }

    /// One process's host clock: `world`'s, off by `skew_us` (replicas'
    /// clocks disagree; only the store's is shared).
    pub fn skewed(world: &Arc<SimClock>, skew_us: i64) -> SimClock {
        SimClock {
            start: world.start,
            skew_us: AtomicI64::new(skew_us),
            host: Some(world.clone()),
            stall: None,
        }
    }

    /// As [`SimClock::skewed`], for a process that may stall: while
    /// `stall` lasts, both clocks read the instant it ends.
    pub fn stalling(world: &Arc<SimClock>, skew_us: i64, stall: Arc<Stall>) -> SimClock {
        SimClock {
            stall: Some(stall),
            ..SimClock::skewed(world, skew_us)
        }
    }

    /// How far ahead of the runtime's clock this process's code runs: to
    /// the end of its stall, while one lasts.
    fn ahead(&self) -> std::time::Duration {
        let now = Instant::now();
        self.stall
            .as_ref()
            .map_or(std::time::Duration::ZERO, |s| s.runs_at(now) - now)
    }

    pub fn elapsed_ms(&self) -> u64 {
        self.start.elapsed().as_millis() as u64
    }

    /// The store's clock.
    pub fn true_unix_us(&self) -> u64 {
        EPOCH_US + self.start.elapsed().as_micros() as u64
    }

    /// The store's clock at `at` (a paused-runtime instant).
    pub fn true_unix_us_at(&self, at: Instant) -> u64 {
        EPOCH_US + at.saturating_duration_since(self.start).as_micros() as u64
    }

    /// Steps the worker host's wall clock by `by_us` (negative: backwards).
    pub fn jump(&self, by_us: i64) {
        self.skew_us.fetch_add(by_us, Ordering::SeqCst);
    }
}

impl Clock for SimClock {
    fn now(&self) -> Instant {
        Instant::now() + self.ahead()
    }

    fn unix_us(&self) -> u64 {
        let skew = self.skew_us.load(Ordering::SeqCst);
        let base = self
            .host
            .as_ref()
            .map_or_else(|| self.true_unix_us(), |h| h.unix_us());
        base.saturating_add_signed(skew) + self.ahead().as_micros() as u64
    }
}
