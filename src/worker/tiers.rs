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
