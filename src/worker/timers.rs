//! Time in the engine: the timer heap, and the arithmetic of instants and
//! wall-clock milliseconds, saturating everywhere (durations come from
//! outside: a Retry-After, a limiter's wait, a header, a clock that jumped).

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::permit::Permits;
use super::ports::Clock;

/// What a timer wakes.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Timer {
    /// A seller whose hold or backoff may be over: ask if it is ready.
    Seller(Arc<str>),
    /// A retry-tier partition whose head may be released.
    Parked(Arc<str>, i32),
    /// A seller whose next paced job may go.
    Paced(Arc<str>),
}

/// Pending timers, earliest first. A timer may fire for nothing (its seller
/// was served in between); whoever it wakes checks again.
#[derive(Debug, Default)]
pub(super) struct Timers {
    /// Each (instant, timer) at most once: setting a timer that is already
    /// set changes nothing. Callers re-arm freely (a seller's next backoff
    /// is armed at every look at it, and a seller with jobs running is
    /// looked at after every answer); as a heap of copies, every copy fired
    /// and re-armed itself, and a backlog of backed-off jobs against a
    /// shedding downstream grew it to 2 million entries in one simulated
    /// run of 3,000 jobs.
    set: BTreeSet<(Instant, Timer)>,
}

impl Timers {
    pub(super) fn at(&mut self, at: Instant, timer: Timer) {
        self.set.insert((at, timer));
    }

    pub(super) fn next(&self) -> Option<Instant> {
        self.set.first().map(|(at, _)| *at)
    }

    /// Removes and returns every timer due at `now`, in time order.
    pub(super) fn due(&mut self, now: Instant) -> Vec<Timer> {
        let mut out = Vec::new();
        while self.next().is_some_and(|at| at <= now) {
            if let Some((_, timer)) = self.set.pop_first() {
                out.push(timer);
            }
        }
        out
    }

    /// Timers set, for the tests.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.set.len()
    }
}

/// `at + d`, saturating: a century stands in for "never" on any platform's
/// clock, so no outside duration can overflow an `Instant` and panic.
pub(super) fn after(at: Instant, d: Duration) -> Instant {
    const CENTURY: Duration = Duration::from_secs(100 * 365 * 24 * 3600);
    at.checked_add(d.min(CENTURY))
        .or_else(|| at.checked_add(Duration::from_secs(24 * 3600)))
        .unwrap_or(at)
}

/// A duration in whole ms, rounded up (so a wait is never cut short).
pub(super) fn ceil_ms(d: Duration) -> u64 {
    u64::try_from(d.as_micros().div_ceil(1000)).unwrap_or(u64::MAX)
}

/// How long until the wall-clock instant `unix_ms_at`, read once: zero if
/// it has passed (a clock that stepped back makes it later, never negative).
pub(super) fn until_unix_ms(clock: &impl Clock, unix_ms_at: u64) -> Duration {
    Duration::from_millis(unix_ms_at.saturating_sub(clock.unix_ms()))
}

/// The fleet's wall clock in Unix ms: the store's (Redis' `TIME`) as the
/// limiter last learnt it, run forward on the monotonic clock; this host's
/// until the limiter has learnt it. The times that cross the process (the
/// retry headers' release and due times) are on it, so every replica reads
/// them alike, and a step of this host's clock moves none of them.
pub(super) fn fleet_ms(permits: &impl Permits, clock: &impl Clock) -> u64 {
    permits
        .store_unix_ms(clock.now())
        .unwrap_or_else(|| clock.unix_ms())
}

/// How long from the fleet's `now_ms` until `unix_ms_at` (zero if passed).
pub(super) fn until_ms(now_ms: u64, unix_ms_at: u64) -> Duration {
    Duration::from_millis(unix_ms_at.saturating_sub(now_ms))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn after_saturates_instead_of_panicking() {
        let now = Instant::now();
        assert!(after(now, Duration::MAX) > now);
        assert_eq!(
            after(now, Duration::from_secs(1)),
            now + Duration::from_secs(1)
        );
    }

    /// A wall clock that moves by `step_ms` (either way) at every read.
    struct Stepping {
        ms: std::sync::atomic::AtomicI64,
        step_ms: i64,
    }

    impl Clock for Stepping {
        fn now(&self) -> Instant {
            Instant::now()
        }

        fn unix_us(&self) -> u64 {
            let ms = self
                .ms
                .fetch_add(self.step_ms, std::sync::atomic::Ordering::SeqCst);
            u64::try_from(ms).unwrap_or(0) * 1000
        }
    }

    /// Defect 6 of issue 20: the engine read the wall clock twice
    /// (`nb > unix_ms()`, then `nb - unix_ms()`); a clock that moved
    /// between the reads past `nb` made the difference wrap (584 million
    /// years in release, a panic in debug). One read, saturating: a
    /// deadline 1 ms ahead of a clock that moves 2 ms per read, or that
    /// steps back an hour per read, gives a sane wait.
    #[test]
    fn a_wait_until_a_wall_clock_time_reads_the_clock_once_and_never_wraps() {
        for (step_ms, want) in [(2, 1), (-3_600_000, 1), (0, 1)] {
            let clock = Stepping {
                ms: std::sync::atomic::AtomicI64::new(1_000_000),
                step_ms,
            };
            let wait = until_unix_ms(&clock, 1_000_001);
            assert_eq!(wait, Duration::from_millis(want), "step {step_ms} ms");
            // The deadline has passed by now on a clock moving forwards.
            let later = until_unix_ms(&clock, 1_000_001);
            assert!(
                later <= Duration::from_millis(3_600_001),
                "step {step_ms} ms: {later:?}"
            );
        }
        let past = Stepping {
            ms: std::sync::atomic::AtomicI64::new(5_000),
            step_ms: 2,
        };
        assert_eq!(until_unix_ms(&past, 4_999), Duration::ZERO);
    }

    #[test]
    fn ceil_ms_rounds_up() {
        assert_eq!(ceil_ms(Duration::from_micros(1001)), 2);
        assert_eq!(ceil_ms(Duration::from_millis(3)), 3);
        assert_eq!(ceil_ms(Duration::MAX), u64::MAX);
    }

    #[test]
    fn due_timers_come_out_in_time_order() {
        let mut t = Timers::default();
        let now = Instant::now();
        t.at(now + Duration::from_secs(2), Timer::Seller(Arc::from("b")));
        t.at(now, Timer::Seller(Arc::from("a")));
        assert_eq!(t.due(now), vec![Timer::Seller(Arc::from("a"))]);
        assert_eq!(t.next(), Some(now + Duration::from_secs(2)));
    }

    /// The shedding world of the simulation (`sim::adaptive`) took 15 s
    /// per run of 3,000 jobs instead of under one: each look at a seller
    /// with jobs backing off set its wake again, and each copy fired and
    /// set itself again, so the copies only grew (2 million). A timer set
    /// twice for one instant is one timer, and fires once; the same timer
    /// at another instant is another.
    #[test]
    fn a_timer_set_again_for_the_same_instant_is_one_timer() {
        let mut t = Timers::default();
        let now = Instant::now();
        let later = now + Duration::from_secs(1);
        for _ in 0..1000 {
            t.at(now, Timer::Seller(Arc::from("a")));
            t.at(later, Timer::Seller(Arc::from("a")));
        }
        t.at(now, Timer::Paced(Arc::from("a")));
        assert_eq!(t.len(), 3);
        assert_eq!(
            t.due(now),
            vec![Timer::Seller(Arc::from("a")), Timer::Paced(Arc::from("a"))]
        );
        assert_eq!(t.due(later), vec![Timer::Seller(Arc::from("a"))]);
        assert_eq!(t.next(), None);
    }
}
