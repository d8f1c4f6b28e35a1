//! Each seller's wait, as an operator asks about it: how old its oldest
//! waiting job is, how long its backlog takes to drain at its rate, and
//! what holds it now. Read from the scheduler's sellers every commit
//! interval; no I/O, no state of its own but the order it reports in.
//!
//! What holds a seller, first match wins:
//! - `pause`: an operator's pause (`limits pause`);
//! - `rule N`: its limiter refused it, by rule N of its own (the global
//!   rules follow its own, as in `limits show`);
//! - `downstream_429`: the downstream's 429, shared through the limiter;
//! - `max_in_flight`: every slot of its `max_in_flight` taken, fleet-wide;
//! - `limiter_unavailable`: Redis failed and the failure policy holds it;
//! - `outage`: the downstream is out of service (the breaker holds every
//!   seller);
//! - `adaptive_concurrency`: it waits for a downstream slot while the
//!   adaptive limit is below `downstream.concurrency`;
//! - `capacity`: it waits for a downstream slot, every one taken;
//! - `running`: nothing holds it: its jobs are being asked for or called.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::limiter::{DeniedBy, Rule};

/// One seller's wait on this replica.
#[derive(Debug, Clone, PartialEq)]
pub struct SellerWait {
    pub seller: Arc<str>,
    /// Jobs waiting here (queued, backing off, paced) and their units.
    pub jobs: usize,
    pub units: u64,
    /// How long the oldest of them has been in this replica's memory.
    pub oldest: Duration,
    /// The units at its tightest rule's sustained rate (limit per period);
    /// `None` when no rule limits it.
    pub drain: Option<Duration>,
    pub held_by: HeldBy,
}

/// What holds a seller now (see the module doc).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeldBy {
    Pause,
    Rule(usize),
    Downstream429,
    MaxInFlight,
    LimiterUnavailable,
    Outage,
    AdaptiveConcurrency,
    Capacity,
    Running,
}

impl HeldBy {
    /// The hold a limiter's refusal names.
    pub fn of(by: DeniedBy) -> HeldBy {
        match by {
            DeniedBy::Rule(i) => HeldBy::Rule(i),
            DeniedBy::DownstreamBlock => HeldBy::Downstream429,
            DeniedBy::MaxInFlight => HeldBy::MaxInFlight,
            DeniedBy::Unavailable => HeldBy::LimiterUnavailable,
        }
    }

    /// The `held_by` label, and what `limits show` prints.
    pub fn label(&self) -> String {
        match self {
            HeldBy::Pause => "pause".to_owned(),
            HeldBy::Rule(i) => format!("rule {i}"),
            HeldBy::Downstream429 => "downstream_429".to_owned(),
            HeldBy::MaxInFlight => "max_in_flight".to_owned(),
            HeldBy::LimiterUnavailable => "limiter_unavailable".to_owned(),
            HeldBy::Outage => "outage".to_owned(),
            HeldBy::AdaptiveConcurrency => "adaptive_concurrency".to_owned(),
            HeldBy::Capacity => "capacity".to_owned(),
            HeldBy::Running => "running".to_owned(),
        }
    }
}

/// What the scheduler knows of one seller, as [`waits`] reads it.
#[derive(Debug, Clone)]
pub struct Seen {
    pub seller: Arc<str>,
    pub jobs: usize,
    pub units: u64,
    pub oldest: Option<Instant>,
    /// Held (refused, paused) until later than now, and by what.
    pub held: Option<HeldBy>,
    /// Waiting for a downstream slot.
    pub wants_slot: bool,
}

/// The downstream as a whole, for sellers nothing of their own holds.
#[derive(Debug, Clone, Copy)]
pub struct Downstream {
    pub outage: bool,
    /// The adaptive limit is below `downstream.concurrency`.
    pub limited: bool,
}

/// Each seller with jobs waiting, oldest wait first. `rules` gives a
/// seller's own and the global rules (`None`: unlimited).
pub fn waits(
    seen: Vec<Seen>,
    now: Instant,
    down: Downstream,
    rules: &dyn Fn(&str) -> Option<Vec<Rule>>,
) -> Vec<SellerWait> {
    let mut out: Vec<SellerWait> = seen
        .into_iter()
        .filter(|s| s.jobs > 0)
        .map(|s| {
            let held_by = match s.held {
                Some(h) => h,
                None if down.outage => HeldBy::Outage,
                None if s.wants_slot && down.limited => HeldBy::AdaptiveConcurrency,
                None if s.wants_slot => HeldBy::Capacity,
                None => HeldBy::Running,
            };
            let drain = rules(&s.seller).and_then(|rs| drain_time(&rs, s.units));
            SellerWait {
                oldest: s
                    .oldest
                    .map_or(Duration::ZERO, |t| now.saturating_duration_since(t)),
                seller: s.seller,
                jobs: s.jobs,
                units: s.units,
                drain,
                held_by,
            }
        })
        .collect();
    out.sort_by(|a, b| b.oldest.cmp(&a.oldest).then(a.seller.cmp(&b.seller)));
    out
}

/// `units` at the slowest sustained rate among `rules` (limit per
/// period); `None` without a rule.
pub fn drain_time(rules: &[Rule], units: u64) -> Option<Duration> {
    rules
        .iter()
        .map(|r| {
            let per_unit_us = r.period_us() as f64 / r.limit().get() as f64;
            Duration::from_secs_f64(per_unit_us * units as f64 / 1e6)
        })
        .max()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::Algorithm;

    const S: Duration = Duration::from_secs(1);

    fn seen(seller: &str, jobs: usize, age: Duration, now: Instant) -> Seen {
        Seen {
            seller: Arc::from(seller),
            jobs,
            units: jobs as u64,
            oldest: Some(now - age),
            held: None,
            wants_slot: false,
        }
    }

    fn per_minute(n: u64) -> Rule {
        Rule::new(
            Algorithm::SlidingWindowLog,
            n,
            Duration::from_secs(60),
            None,
        )
        .unwrap()
    }

    #[test]
    fn what_holds_a_seller_first_its_own_hold_then_the_downstream() {
        let now = Instant::now() + 100 * S;
        let quiet = Downstream {
            outage: false,
            limited: false,
        };
        // (held, wants a slot, outage, adaptive below its ceiling, label)
        let cases = [
            (Some(HeldBy::Pause), false, true, false, "pause"),
            (Some(HeldBy::Rule(1)), true, false, true, "rule 1"),
            (
                Some(HeldBy::of(DeniedBy::DownstreamBlock)),
                false,
                false,
                false,
                "downstream_429",
            ),
            (None, true, true, false, "outage"),
            (None, true, false, true, "adaptive_concurrency"),
            (None, true, false, false, "capacity"),
            (None, false, false, true, "running"),
        ];
        for (held, wants_slot, outage, limited, label) in cases {
            let mut s = seen("s", 3, S, now);
            s.held = held;
            s.wants_slot = wants_slot;
            let down = Downstream { outage, limited };
            let w = waits(vec![s], now, down, &|_| None);
            assert_eq!(w[0].held_by.label(), label);
        }
        assert!(waits(vec![seen("s", 0, S, now)], now, quiet, &|_| None).is_empty());
    }

    #[test]
    fn oldest_first_with_the_drain_at_the_tightest_rule() {
        let now = Instant::now() + 1000 * S;
        let sellers = vec![
            seen("young", 30, 5 * S, now),
            seen("old", 120, 600 * S, now),
            seen("free", 7, 60 * S, now),
        ];
        let rules = |s: &str| match s {
            // 100 a minute and 1,000 a day: the day's rule is the slowest.
            "old" => Some(vec![
                per_minute(100),
                Rule::new(
                    Algorithm::FixedWindow,
                    1000,
                    Duration::from_secs(86_400),
                    None,
                )
                .unwrap(),
            ]),
            "young" => Some(vec![per_minute(60)]),
            _ => None,
        };
        let down = Downstream {
            outage: false,
            limited: false,
        };
        let w = waits(sellers, now, down, &rules);
        let order: Vec<&str> = w.iter().map(|w| &*w.seller).collect();
        assert_eq!(order, ["old", "free", "young"]);
        assert_eq!(w[0].oldest, 600 * S);
        // 120 units at 1,000 a day: 10,368 s.
        assert_eq!(w[0].drain.map(|d| d.as_secs()), Some(10_368));
        assert_eq!(w[1].drain, None, "unlimited");
        assert_eq!(w[2].drain, Some(30 * S), "30 at 60 a minute");
    }
}
