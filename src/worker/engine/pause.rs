//! An operator's pause (`limits pause`), as the engine carries it out. A
//! paused seller asks the limiter nothing and calls the downstream for
//! nothing: a seller about to ask is held instead, a run's chain stops
//! before its next call, and a pacer's granted jobs go back to the queue
//! (their units are given up, as a 429's are). Its jobs wait in memory, as
//! a refused seller's do, for the first `worker.max_inline_delay` of the
//! pause, and after that while its end is no further off than that;
//! otherwise they go to the retry tiers, due again within
//! [`paused::PARK`], so that a resume brings them back soon. Nothing is
//! dead-lettered for a pause and nothing is lost.
//!
//! The pauses are what the limiter last read from Redis (every
//! `limiter::pauses::REFRESH`); a held seller looks again every
//! [`paused::RECHECK`], so a pause and a resume both take effect within
//! about half a second on every replica. Those intervals are
//! [`paused`]'s; this file carries them out.

use std::sync::Arc;

use crate::limiter::Pause;
use crate::telemetry::events::SellerPaused;

use super::super::paused;
use super::super::ports::{Clock, Permits, Ports};
use super::super::timers::{until_unix_ms, Timer};
use super::Engine;

impl<X: Ports> Engine<X> {
    /// The pause holding `key` now, if any.
    pub(super) fn pause_of(&self, key: &str) -> Option<Pause> {
        self.deps.permits.paused(key, self.deps.clock.unix_ms())
    }

    /// Holds an idle paused seller: no ask until [`paused::RECHECK`] (or the
    /// pause's end, if sooner), and its waiting jobs to the retry tiers when
    /// the pause is long ([`paused::intervals`]).
    pub(super) fn hold_paused(&mut self, key: &Arc<str>, pause: Pause) {
        let now = self.deps.clock.now();
        let left = pause.until_ms.map(|u| until_unix_ms(&*self.deps.clock, u));
        let max_inline = self.settings.worker.max_inline_delay;
        let every = paused::intervals(left);
        let Some(hold) = self
            .scheduler
            .hold_paused(key, now, every.recheck, left, max_inline)
        else {
            return;
        };
        self.timers.at(hold.recheck_at, Timer::Seller(key.clone()));
        for p in hold.parked {
            self.defer(p, every.park);
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
