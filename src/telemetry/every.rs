//! [`Every`]: lets one of many repeated occurrences through per interval and
//! counts the rest, so a broker or Redis outage logs one line every few
//! seconds ("… 312 more since") instead of one per failed call.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// A log-rate limiter for one kind of occurrence; shareable across threads.
#[derive(Debug)]
pub struct Every {
    interval: Duration,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    last: Option<Instant>,
    suppressed: u64,
}

impl Every {
    pub const fn new(interval: Duration) -> Every {
        Every {
            interval,
            state: Mutex::new(State {
                last: None,
                suppressed: 0,
            }),
        }
    }

    /// `Some(n)` when this occurrence is to be logged, `n` being how many
    /// were let go since the last logged one; `None` to stay quiet.
    pub fn tick(&self) -> Option<u64> {
        self.tick_at(Instant::now())
    }

    fn tick_at(&self, now: Instant) -> Option<u64> {
        // A poisoned lock only holds a timestamp and a count.
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        match s.last {
            Some(last) if now.saturating_duration_since(last) < self.interval => {
                s.suppressed += 1;
                None
            }
            _ => {
                s.last = Some(now);
                Some(std::mem::take(&mut s.suppressed))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lets_one_through_per_interval_and_counts_the_rest() {
        let every = Every::new(Duration::from_secs(10));
        let t0 = Instant::now();
        assert_eq!(every.tick_at(t0), Some(0));
        for i in 1..=5 {
            assert_eq!(every.tick_at(t0 + Duration::from_secs(i)), None);
        }
        assert_eq!(every.tick_at(t0 + Duration::from_secs(10)), Some(5));
        assert_eq!(every.tick_at(t0 + Duration::from_secs(11)), None);
        assert_eq!(every.tick_at(t0 + Duration::from_secs(25)), Some(1));
    }
}
