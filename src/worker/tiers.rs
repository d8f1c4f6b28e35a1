//! The retry tiers: which tier a deferred job goes to, and the records of a
//! tier held here until their release time. No I/O: the engine pauses and
//! resumes partitions, arms timers and writes, as these methods say.
//!
//! A tier's records are released in offset order (a tier's release times
//! ascend), so holding the partition while its head waits holds up no
//! other record; the partition is paused while it has any.

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use crate::config::{RetryTier, Settings};
use crate::kafka::consumer::TopicPartition;

use super::pending::Pending;
use super::timers::ceil_ms;

/// Where a record goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Target {
    DeadLetter {
        /// The metric's label: see `JobDeadLettered::kind`.
        kind: &'static str,
        reason: String,
    },
    /// A retry tier's topic: taken up at `release_at`, run from `not_before`.
    Retry {
        topic: String,
        not_before_unix_ms: u64,
        release_at_unix_ms: u64,
    },
}

/// A retry-tier record held until its release time.
#[derive(Debug)]
pub(super) struct Parked {
    pub(super) release_at_unix_ms: u64,
    pub(super) not_before_unix_ms: Option<u64>,
    pub(super) pending: Pending,
}

/// What [`RetryTiers::unpark`] released.
#[derive(Debug, Default)]
pub(super) struct Unparked {
    /// Due (or not to be trusted to hold the partition), in offset order.
    pub(super) released: Vec<Parked>,
    /// The next head's release (Unix ms); `None`: the partition holds no
    /// record any more and may resume.
    pub(super) next_release: Option<u64>,
}

/// The tiers, and the records parked on them.
#[derive(Debug)]
pub(super) struct RetryTiers {
    /// Records not yet released, per partition, in offset order. Ordered
    /// for a replayable walk.
    parked: BTreeMap<TopicPartition, VecDeque<Parked>>,
    /// The retry tiers, shortest first.
    tiers: Vec<RetryTier>,
}

impl RetryTiers {
    pub(super) fn new(settings: &Settings) -> RetryTiers {
        RetryTiers::with_tiers(settings.kafka.retry_tiers())
    }

    fn with_tiers(tiers: Vec<RetryTier>) -> RetryTiers {
        RetryTiers {
            parked: BTreeMap::new(),
            tiers,
        }
    }

    /// Whether holding a record of `topic` for `wait_ms` stays within its
    /// tier's delay (plus a second for clocks and transit).
    pub(super) fn holds_at_most(&self, topic: &str, wait_ms: u64) -> bool {
        self.hold_bound_ms(topic).is_some_and(|b| wait_ms <= b)
    }

    /// The longest a record of `topic` may be held: its tier's delay plus
    /// a second for clocks and transit; `None` for a topic of no tier.
    fn hold_bound_ms(&self, topic: &str) -> Option<u64> {
        self.tiers
            .iter()
            .find(|t| t.topic == topic)
            .map(|t| ceil_ms(t.delay).saturating_add(1000))
    }

    /// Where a job due in `wait` goes: the longest tier that does not pass
    /// the due time (the shortest if none fits), so the record is released
    /// no later than it is due, and hops down the tiers until then. A wait
    /// shorter than every tier is released when due: it may sit behind the
    /// tier's head for at most that tier's delay.
    pub(super) fn target(&self, wait: Duration, now_ms: u64) -> Target {
        let tiers = &self.tiers;
        let tier = tiers
            .iter()
            .rev()
            .find(|t| t.delay <= wait)
            .or(tiers.first());
        let Some(tier) = tier else {
            unreachable!("config validation keeps at least one retry tier")
        };
        let due = now_ms.saturating_add(ceil_ms(wait));
        Target::Retry {
            topic: tier.topic.clone(),
            not_before_unix_ms: due,
            release_at_unix_ms: due.min(now_ms.saturating_add(ceil_ms(tier.delay))),
        }
    }

    /// Holds a record until its release. Returns its partition and release
    /// when it is the partition's first: pause it, and look again then.
    pub(super) fn park(&mut self, parked: Parked) -> Option<(TopicPartition, u64)> {
        let origin = &parked.pending.origin;
        let part = TopicPartition::new(origin.topic.clone(), origin.partition);
        let release = parked.release_at_unix_ms;
        let queue = self.parked.entry(part.clone()).or_default();
        let first = queue.is_empty();
        queue.push_back(parked);
        first.then_some((part, release))
    }

    /// Releases `part`'s records due at `now_ms`. A release further off
    /// than the tier's delay (written on a clock that was off, or by hand)
    /// is not trusted to hold the partition, as on arrival: the record is
    /// released now and hops tiers by its due time.
    pub(super) fn unpark(&mut self, part: &TopicPartition, now_ms: u64) -> Unparked {
        let bound = self.hold_bound_ms(&part.topic);
        let mut out = Unparked::default();
        if let Some(queue) = self.parked.get_mut(part) {
            while let Some(head) = queue.front() {
                let release = head.release_at_unix_ms;
                if release > now_ms && bound.is_some_and(|b| release - now_ms <= b) {
                    out.next_release = Some(release);
                    break;
                }
                out.released.extend(queue.pop_front());
            }
        }
        if out.next_release.is_none() {
            self.parked.remove(part);
        }
        out
    }

    /// Whether `part` holds parked records (so stays paused).
    pub(super) fn holds(&self, part: &TopicPartition) -> bool {
        self.parked.contains_key(part)
    }

    /// Partitions paused for their parked records.
    pub(super) fn partitions(&self) -> usize {
        self.parked.len()
    }

    /// Records parked.
    pub(super) fn records(&self) -> usize {
        self.parked.values().map(VecDeque::len).sum()
    }

    /// Forgets the records of revoked partitions; returns their bytes.
    pub(super) fn revoke(&mut self, parts: &[TopicPartition]) -> Vec<usize> {
        let mut dropped = Vec::new();
        for part in parts {
            if let Some(q) = self.parked.remove(part) {
                dropped.extend(q.iter().map(|p| p.pending.bytes));
            }
        }
        dropped
    }

    /// Shutdown: forgets every parked record (left uncommitted); returns
    /// how many there were.
    pub(super) fn clear(&mut self) -> usize {
        let n = self.records();
        self.parked.clear();
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use super::super::fixtures::pending;

    const S: u64 = 1000;

    fn tiers() -> RetryTiers {
        let tier = |secs: u64, topic: &str| RetryTier {
            delay: Duration::from_secs(secs),
            topic: topic.to_owned(),
        };
        RetryTiers::with_tiers(vec![
            tier(10, "r-10s"),
            tier(60, "r-1m"),
            tier(600, "r-10m"),
        ])
    }

    #[test]
    fn a_deferred_job_takes_the_longest_tier_that_does_not_pass_its_due_time() {
        // (wait, tier, release after, due after), in seconds from now
        let cases: &[(u64, &str, u64, u64)] = &[
            (1, "r-10s", 1, 1),
            (10, "r-10s", 10, 10),
            (59, "r-10s", 10, 59),
            (60, "r-1m", 60, 60),
            (3600, "r-10m", 600, 3600),
        ];
        let now = 1_000_000;
        for &(wait, topic, release, due) in cases {
            let target = tiers().target(Duration::from_secs(wait), now);
            let expected = Target::Retry {
                topic: topic.to_owned(),
                not_before_unix_ms: now + due * S,
                release_at_unix_ms: now + release * S,
            };
            assert_eq!(target, expected, "wait {wait}s");
        }
    }

    #[test]
    fn a_hold_is_trusted_up_to_its_tiers_delay_and_a_second() {
        let t = tiers();
        let cases: &[(&str, u64, bool)] = &[
            ("r-10s", 11 * S, true),
            ("r-10s", 11 * S + 1, false),
            ("r-1m", 61 * S, true),
            ("jobs", 1, false),
        ];
        for &(topic, wait_ms, trusted) in cases {
            assert_eq!(
                t.holds_at_most(topic, wait_ms),
                trusted,
                "{topic} {wait_ms}"
            );
        }
    }

    fn parked(partition: i32, offset: i64, release: u64) -> Parked {
        let mut p = pending("s", partition, offset, 1);
        p.origin.topic = "r-10s".into();
        Parked {
            release_at_unix_ms: release,
            not_before_unix_ms: None,
            pending: p,
        }
    }

    #[test]
    fn a_partition_releases_its_due_head_and_holds_the_rest() {
        let mut t = tiers();
        let part = TopicPartition::new("r-10s", 0);
        assert_eq!(t.park(parked(0, 1, 5 * S)), Some((part.clone(), 5 * S)));
        assert_eq!(t.park(parked(0, 2, 7 * S)), None, "not the first");
        // Released beyond the tier's delay plus a second: not trusted.
        assert_eq!(t.park(parked(0, 3, 30 * S)), None);
        assert!(t.park(parked(1, 4, 9 * S)).is_some());
        assert_eq!((t.partitions(), t.records()), (2, 4));
        // (now, released offsets, next release)
        let steps: &[(u64, &[i64], Option<u64>)] = &[
            (S, &[], Some(5 * S)),
            (5 * S, &[1], Some(7 * S)),
            (8 * S, &[2, 3], None),
        ];
        for &(now, released, next) in steps {
            let u = t.unpark(&part, now);
            let offsets: Vec<i64> = u.released.iter().map(|p| p.pending.origin.offset).collect();
            assert_eq!(
                (offsets.as_slice(), u.next_release),
                (released, next),
                "at {now}"
            );
        }
        assert!(!t.holds(&part), "empty: may resume");
        assert_eq!(t.revoke(&[TopicPartition::new("r-10s", 1)]).len(), 1);
        assert_eq!(t.clear(), 0);
    }
}
