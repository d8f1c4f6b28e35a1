//! Where a record taken up goes, by the times its retry headers name: a
//! retry-tier record not yet released is parked on its tier (its partition
//! paused); one that is due is queued; one due soon waits in memory; one
//! due later than `worker.max_inline_delay` goes to the tier that fits its
//! wait. And a parked partition, once its due records are taken: looked
//! at again at its next release, or resumed.
//!
//! Pure: it takes the headers' times, the fleet's clock in Unix ms and
//! `now` as read by the engine, and returns what to do; the engine
//! (`engine/records.rs`) carries it out.

use std::time::Duration;

use tokio::time::Instant;

use super::timers::{after, until_ms};

/// A record as it arrives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Arrival {
    /// Held on its tier until its release (the tier parks it).
    Park { release_at: u64 },
    /// Taken up now ([`take_up`] says how).
    TakeUp,
}

/// A record taken up: when it runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum TakeUp {
    /// Due: queued behind its seller's others.
    Queue,
    /// Due soon: waits in memory until `at`, without holding its
    /// partition.
    Delay { at: Instant },
    /// Due later than `worker.max_inline_delay`: to the tier that fits
    /// `wait`.
    Defer { wait: Duration },
}

/// A parked partition after its due records are taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Unparked {
    /// It holds more: looked at again at `at`, still paused.
    WakeAt { at: Instant },
    /// It holds none: consumed again.
    Resume,
    /// It holds none, but fetching is paused for memory: it stays paused
    /// until memory resumes every partition.
    StayPaused,
}

/// Whether a record is parked or taken up. `release_at` is its retry
/// header's release (none: a fresh record), `now_ms` the fleet's clock,
/// `tier_holds(ms)` whether its tier holds a record that long. A release
/// further off than the tier's delay (a clock jump, a hand-written header)
/// is not trusted to hold the partition: the record is taken up now and
/// hops tiers by its due time instead.
pub(super) fn arrival(
    release_at: Option<u64>,
    now_ms: u64,
    tier_holds: impl FnOnce(u64) -> bool,
) -> Arrival {
    match release_at {
        Some(release) if release > now_ms && tier_holds(release - now_ms) => Arrival::Park {
            release_at: release,
        },
        _ => Arrival::TakeUp,
    }
}

/// When a record taken up runs, by its due time (`not_before`, on the
/// fleet's clock; none: now). A short wait is held in memory, a longer one
/// hops to the tier that fits it.
pub(super) fn take_up(
    not_before: Option<u64>,
    now_ms: u64,
    now: Instant,
    max_inline: Duration,
) -> TakeUp {
    let remaining = not_before.map_or(Duration::ZERO, |nb| until_ms(now_ms, nb));
    if remaining.is_zero() {
        TakeUp::Queue
    } else if remaining > max_inline {
        TakeUp::Defer { wait: remaining }
    } else {
        TakeUp::Delay {
            at: after(now, remaining),
        }
    }
}

/// When a parked partition is looked at again: at its record's release
/// (`release_ms`, on the fleet's clock `now_ms`).
pub(super) fn wake_at(release_ms: u64, now_ms: u64, now: Instant) -> Instant {
    after(now, until_ms(now_ms, release_ms))
}

/// A parked partition after its due records are taken: `next_release` is
/// the release of the first it still holds, `fetching_paused` whether
/// memory paused every partition.
pub(super) fn unparked(
    next_release: Option<u64>,
    now_ms: u64,
    now: Instant,
    fetching_paused: bool,
) -> Unparked {
    match next_release {
        Some(release) => Unparked::WakeAt {
            at: wake_at(release, now_ms, now),
        },
        None if fetching_paused => Unparked::StayPaused,
        None => Unparked::Resume,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW_MS: u64 = 1_000_000;
    const INLINE: Duration = Duration::from_secs(5);
    const S: Duration = Duration::from_secs(1);

    #[test]
    fn a_record_is_parked_only_for_a_release_its_tier_holds() {
        // (row, release at (ms from now; none: a fresh record), the
        //  tier's bound in ms (none: not a tier topic), parked)
        let rows: &[(u32, Option<i64>, Option<u64>, bool)] = &[
            (1, None, Some(60_000), false),
            (2, Some(30_000), Some(61_000), true),
            (3, Some(61_000), Some(61_000), true),
            // Further off than the tier holds: a clock jump, a
            // hand-written header.
            (4, Some(61_001), Some(61_000), false),
            (5, Some(30_000), None, false),
            // Released already, or this instant.
            (6, Some(0), Some(61_000), false),
            (7, Some(-5_000), Some(61_000), false),
        ];
        for &(row, release, bound, park) in rows {
            let release = release.map(|d| NOW_MS.checked_add_signed(d).expect("in range"));
            let holds = |ms: u64| bound.is_some_and(|b| ms <= b);
            let want = match release {
                Some(release_at) if park => Arrival::Park { release_at },
                _ => Arrival::TakeUp,
            };
            assert_eq!(arrival(release, NOW_MS, holds), want, "row {row}");
        }
    }

    #[test]
    fn a_record_taken_up_is_queued_delayed_or_deferred_by_its_due_time() {
        let now = Instant::now();
        // (row, due at (ms from now; none: now), what happens)
        let rows: &[(u32, Option<i64>, TakeUp)] = &[
            (1, None, TakeUp::Queue),
            (2, Some(0), TakeUp::Queue),
            (3, Some(-3_000), TakeUp::Queue),
            (
                4,
                Some(1),
                TakeUp::Delay {
                    at: now + Duration::from_millis(1),
                },
            ),
            (5, Some(5_000), TakeUp::Delay { at: now + INLINE }),
            (
                6,
                Some(5_001),
                TakeUp::Defer {
                    wait: Duration::from_millis(5_001),
                },
            ),
            (7, Some(3_600_000), TakeUp::Defer { wait: 3600 * S }),
        ];
        for &(row, due, want) in rows {
            let due = due.map(|d| NOW_MS.checked_add_signed(d).expect("in range"));
            assert_eq!(take_up(due, NOW_MS, now, INLINE), want, "row {row}");
        }
    }

    #[test]
    fn a_parked_partition_wakes_at_its_next_release_or_resumes() {
        let now = Instant::now();
        // (row, next release (ms from now), fetching paused, what happens)
        let rows: &[(u32, Option<u64>, bool, Unparked)] = &[
            (1, Some(2_000), false, Unparked::WakeAt { at: now + 2 * S }),
            (2, Some(2_000), true, Unparked::WakeAt { at: now + 2 * S }),
            (3, None, false, Unparked::Resume),
            (4, None, true, Unparked::StayPaused),
        ];
        for &(row, next, paused, want) in rows {
            let next = next.map(|d| NOW_MS + d);
            assert_eq!(unparked(next, NOW_MS, now, paused), want, "row {row}");
        }
        assert_eq!(wake_at(NOW_MS - 1, NOW_MS, now), now, "passed: at once");
    }
}
