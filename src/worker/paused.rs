//! An operator's pause (`limits pause`), as the engine keeps it. A paused
//! seller asks the limiter nothing and calls the downstream for nothing:
//! a seller about to ask is held instead, a run's chain stops before its
//! next call, and a pacer's granted jobs go back to the queue (their units
//! are given up, as a 429's are). Its jobs wait in memory, as a refused
//! seller's do, for the first `worker.max_inline_delay` of the pause, and
//! after that while its end is no further off than that; otherwise they go
//! to the retry tiers, due again within [`PARK`], so that a resume brings
//! them back soon. Nothing is dead-lettered for a pause and nothing is lost.
//!
//! The pauses are what the limiter last read from Redis (every
//! `limiter::pauses::REFRESH`); a held seller looks again every
//! [`RECHECK`], so a pause and a resume both take effect within about half
//! a second on every replica.

use std::sync::Arc;
use std::time::Duration;

use crate::limiter::Pause;
use crate::telemetry::events::SellerPaused;

use super::engine::{Engine, Pending};
use super::ports::{Clock, Permits, Ports};
use super::timers::{after, until_unix_ms, Timer};

/// How often a held seller looks whether its pause is over.
pub(super) const RECHECK: Duration = Duration::from_millis(250);

/// The longest a paused seller's job stays in the retry tiers before it is
/// looked at again: after a resume, no parked job waits longer than this
/// (plus its tier's read). While the pause lasts, each parked job is
/// written once per period.
pub(super) const PARK: Duration = Duration::from_secs(60);

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
        let Some(seller) = self.sellers.get_mut(key) else {
            return;
        };
        let recheck = left.map_or(RECHECK, |l| l.clamp(Duration::from_millis(1), RECHECK));
        let at = after(now, recheck);
        seller.blocked_until = Some(seller.blocked_until.map_or(at, |t| t.max(at)));
        self.timers.at(at, Timer::Seller(key.clone()));
        // In memory while the pause is younger than the inline delay or
        // ends within it: a pause lifted within seconds costs no write and
        // no wait on a tier.
        let since = *seller.paused_since.get_or_insert(now);
        let young = now.saturating_duration_since(since) < max_inline;
        let parked = !young && left.is_none_or(|l| l > max_inline);
        let waiting: Vec<Pending> = if parked {
            seller.queue.drain(..).collect()
        } else {
            Vec::new()
        };
        let jobs = if parked {
            waiting.len()
        } else {
            seller.queue.len()
        };
        let park = left.map_or(PARK, |l| l.min(PARK));
        for p in waiting {
            self.defer(p, park);
        }
        SellerPaused {
            seller: key,
            jobs,
            parked,
            left,
        }
        .emit();
    }

    /// A pacer's granted jobs of a paused seller go back to the head of its
    /// queue, in order (their units are given up): they are called after
    /// the resume, asked for again.
    pub(super) fn unpace(&mut self, key: &Arc<str>) {
        let Some(seller) = self.sellers.get_mut(key) else {
            return;
        };
        let paced: Vec<Pending> = seller.paced.drain(..).map(|q| q.pending).collect();
        for mut p in paced.into_iter().rev() {
            p.lease = None;
            seller.queue.push_front(p);
        }
        seller.settle_phase();
    }
}
