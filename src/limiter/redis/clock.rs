//! Redis' clock as the store knows it: where it stands against ours,
//! learnt from the replies, so that a jobs call can carry a deadline on it
//! and the fleet can read one wall clock between calls.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// Where Redis' clock stands against ours, learnt from the jobs replies,
/// for the deadline each jobs call on Redis' clock carries.
///
/// A call that times out may still be waiting in the buffers of a server
/// that hangs (a stalled host, `CLIENT PAUSE`), and run when the server
/// wakes: its grant would be charged, and nobody told of it. So the call
/// carries a deadline on Redis' clock, before the moment the caller gives
/// up, and the script refuses to run after it (`lua/jobs.lua`).
///
/// The offset is measured as Redis' `now` less our clock when the reply
/// arrives, which is later than the script ran: it comes out at most the
/// true offset, so the deadline errs early, never late. The deadline is
/// sent + offset + 3/4 of the timeout: a script that runs in time leaves
/// its reply a quarter of the timeout to arrive. A reply slower than that
/// on its way back after the script ran is what the call's cancel is for
/// (`lua/calls.lua`, and the limiter's cancel of a call whose reply may be
/// lost, [`Store::may_have_run`](crate::limiter::Store::may_have_run)).
pub(super) struct RedisClock {
    /// Redis' µs less ours; `i64::MIN` until a first reply.
    offset_us: AtomicI64,
    /// Redis' µs at an instant of our monotonic clock, from the last
    /// reply or `TIME`: the fleet's wall clock
    /// ([`Store::unix_us_at`](crate::limiter::Store::unix_us_at)).
    anchor: Mutex<Option<(Instant, i64)>>,
}

impl RedisClock {
    const UNKNOWN: i64 = i64::MIN;

    pub(super) fn new() -> RedisClock {
        RedisClock {
            offset_us: AtomicI64::new(RedisClock::UNKNOWN),
            anchor: Mutex::new(None),
        }
    }

    /// The deadline on Redis' clock for a call sent at `sent_us` (ours).
    pub(super) fn deadline(&self, sent_us: i64, timeout: Duration) -> Option<i64> {
        let offset = self.offset_us.load(Ordering::Relaxed);
        if offset == RedisClock::UNKNOWN {
            return None;
        }
        let budget = i64::try_from(timeout.as_micros() * 3 / 4).unwrap_or(i64::MAX);
        Some(sent_us.saturating_add(offset).saturating_add(budget))
    }

    /// A reply decided at `redis_us` (Redis' clock) arrived at `ours_us`.
    pub(super) fn observe(&self, redis_us: i64, ours_us: i64) {
        self.offset_us
            .store(redis_us.saturating_sub(ours_us), Ordering::Relaxed);
        *self.anchor.lock().unwrap_or_else(|p| p.into_inner()) = Some((Instant::now(), redis_us));
    }

    /// Redis' µs at `now`, from the last observation.
    pub(super) fn at(&self, now: Instant) -> Option<u64> {
        let (then, redis_us) = (*self.anchor.lock().unwrap_or_else(|p| p.into_inner()))?;
        let since = i64::try_from(now.saturating_duration_since(then).as_micros()).ok()?;
        u64::try_from(redis_us.saturating_add(since)).ok()
    }
}

/// Our wall clock in µs since the epoch (0 before it, which no host is).
pub(super) fn local_us() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX))
}
