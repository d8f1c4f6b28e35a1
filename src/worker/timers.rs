//! Time in the engine: the timer heap, and the arithmetic of instants and
//! wall-clock milliseconds, saturating everywhere (durations come from
//! outside: a Retry-After, a limiter's wait, a header, a clock that jumped).

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

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
    heap: BinaryHeap<Reverse<(Instant, Timer)>>,
}

impl Timers {
    pub(super) fn at(&mut self, at: Instant, timer: Timer) {
        self.heap.push(Reverse((at, timer)));
    }

    pub(super) fn next(&self) -> Option<Instant> {
        self.heap.peek().map(|Reverse((at, _))| *at)
    }

    /// Removes and returns every timer due at `now`.
    pub(super) fn due(&mut self, now: Instant) -> Vec<Timer> {
        let mut out = Vec::new();
        while self.next().is_some_and(|at| at <= now) {
            if let Some(Reverse((_, timer))) = self.heap.pop() {
                out.push(timer);
            }
        }
        out
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

/// The monotonic instant of a wall-clock time in ms (now, if it has passed).
pub(super) fn instant_of(clock: &impl Clock, unix_ms_at: u64) -> Instant {
    after(clock.now(), until_unix_ms(clock, unix_ms_at))
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
}
