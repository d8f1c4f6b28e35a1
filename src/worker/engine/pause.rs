//! An operator's pause (`limits pause`), as the engine carries it out. A
//! paused seller asks the limiter nothing and calls the downstream for
//! nothing: a seller about to ask is held instead, a run's chain stops
//! before its next call, and a pacer's granted jobs go back to the queue
//! (their units are given up, as a 429's are). Its jobs wait in memory, as
//! a refused seller's do, for the first `worker.max_inline_delay` of the
//! pause, and after that while its end is no further off than that;
//! otherwise they go to the retry tiers, due again within [`PARK`], so
//! that a resume brings them back soon. Nothing is dead-lettered for a
//! pause and nothing is lost.
//!
//! The pauses are what the limiter last read from Redis (every
//! `limiter::pauses::REFRESH`); a held seller looks again every
//! [`RECHECK`], so a pause and a resume both take effect within about half
//! a second on every replica.

use std::sync::Arc;
use std::time::Duration;

use crate::limiter::Pause;
use crate::telemetry::events::SellerPaused;

use super::super::ports::{Clock, Permits, Ports};
use super::super::timers::{until_unix_ms, Timer};
use super::Engine;

/// How often a held seller looks whether its pause is over.
const RECHECK: Duration = Duration::from_millis(250);

/// The longest a paused seller's job stays in the retry tiers before it is
/// looked at again: after a resume, no parked job waits longer than this
/// (plus its tier's read). While the pause lasts, each parked job is
/// written once per period.
const PARK: Duration = Duration::from_secs(60);

impl<X: Ports> Engine<X> {
    /// The pause holding `key` now, if any.
    pub(super) fn pause_of(&self, key: &str) -> Option<Pause> {
        self.deps.permits.paused(key, self.deps.clock.unix_ms())
    }

    /// Holds an idle paused seller: no ask until [`RECHECK`] (or the
    /// pause's end, if sooner), and its waiting jobs to the retry tiers when
    /// the pause is long.
    pub(super) fn hold_paused(&mut self, key: &Arc<str>, pause: Pause) {
        let now = self.deps.clock.now();
        let left = pause.until_ms.map(|u| until_unix_ms(&*self.deps.clock, u));
        let max_inline = self.settings.worker.max_inline_delay;
        let recheck = left.map_or(RECHECK, |l| l.clamp(Duration::from_millis(1), RECHECK));
        let Some(hold) = self
            .scheduler
            .hold_paused(key, now, recheck, left, max_inline)
        else {
            return;
        };
        self.timers.at(hold.recheck_at, Timer::Seller(key.clone()));
        let park = left.map_or(PARK, |l| l.min(PARK));
        for p in hold.parked {
            self.defer(p, park);
        }
        SellerPaused {
            seller: key,
            jobs: hold.jobs,
            parked: hold.to_tiers,
            left,
        }
        .emit();
    }
}
