//! How an operator's pause (`limits pause`) times a held seller: how
//! often it looks whether the pause is over, and how long its jobs stay
//! on the retry tiers when the pause is long. Which jobs stay in memory
//! is the scheduler's (`Scheduler::hold_paused`); the engine
//! (`engine/pause.rs`) carries both out.
//!
//! Pure: it takes what is left of the pause, as the engine read it from
//! its wall clock.

use std::time::Duration;

/// How often a held seller looks whether its pause is over. With the
/// pauses read from Redis every `limiter::pauses::REFRESH`, a pause and
/// a resume both take effect within about half a second on every replica.
pub(super) const RECHECK: Duration = Duration::from_millis(250);

/// The longest a paused seller's job stays in the retry tiers before it is
/// looked at again: after a resume, no parked job waits longer than this
/// (plus its tier's read). While the pause lasts, each parked job is
/// written once per period.
pub(super) const PARK: Duration = Duration::from_secs(60);

/// A paused seller's intervals.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Intervals {
    /// When it looks again: [`RECHECK`], or the pause's end if sooner (at
    /// least a millisecond on: a timer at once would spin).
    pub(super) recheck: Duration,
    /// How long a job it parks stays on the tiers: [`PARK`], or the
    /// pause's end if sooner.
    pub(super) park: Duration,
}

/// The intervals of a pause with `left` to go (none: until resumed).
pub(super) fn intervals(left: Option<Duration>) -> Intervals {
    Intervals {
        recheck: left.map_or(RECHECK, |l| l.clamp(Duration::from_millis(1), RECHECK)),
        park: left.map_or(PARK, |l| l.min(PARK)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn a_pause_is_looked_at_again_by_its_end_or_the_recheck() {
        // (row, left, recheck, park)
        let rows: &[(u32, Option<Duration>, Duration, Duration)] = &[
            (1, None, RECHECK, PARK),
            (2, Some(Duration::from_secs(3600)), RECHECK, PARK),
            (
                3,
                Some(Duration::from_secs(30)),
                RECHECK,
                Duration::from_secs(30),
            ),
            (4, Some(100 * MS), 100 * MS, 100 * MS),
            // Over, or ending now: looked at again a millisecond on, not
            // at once.
            (5, Some(Duration::ZERO), MS, Duration::ZERO),
            (6, Some(RECHECK), RECHECK, RECHECK),
        ];
        for &(row, left, recheck, park) in rows {
            let want = Intervals { recheck, park };
            assert_eq!(intervals(left), want, "row {row}: {left:?} left");
        }
    }
}
