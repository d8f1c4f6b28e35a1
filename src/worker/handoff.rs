//! A graceful handoff as the engine sees it (issue 53): the work under way
//! on each partition, and the revokes that wait for it.
//!
//! A revoke comes in two steps ([`PartitionEvent::Revoking`], then
//! `Revoked`). Between them its partitions start nothing new (the
//! consumer's [`Source::may_start`] says no), their waiting jobs go to the
//! next owner, and the calls and writes already under way finish here, so
//! that a success is committed by this owner instead of being done again
//! by the next. [`Handoff`] counts that work and says when a revoke may go
//! on; [`route`] says what an answer that lands during the wait does.
//!
//! [`PartitionEvent::Revoking`]: crate::kafka::consumer::PartitionEvent::Revoking
//! [`Source::may_start`]: super::ports::Source::may_start

use std::collections::HashMap;
use std::time::Duration;

use tokio::time::Instant;

use crate::kafka::consumer::{Origin, TopicPartition};
use crate::kafka::record::Quiet;

/// Work under way per partition, and the revokes waiting for theirs.
#[derive(Debug, Default)]
pub(super) struct Handoff {
    /// Calls out and writes not yet acknowledged, per partition: counted
    /// from the spawn of their task to its report, so that a task spawned
    /// just before a revoke began is waited for too. No zero entries.
    under_way: HashMap<TopicPartition, usize>,
    /// Revokes whose partitions still have work under way, oldest first.
    waiting: Vec<Waiting>,
}

#[derive(Debug)]
struct Waiting {
    parts: Vec<TopicPartition>,
    quiet: Quiet,
    since: Instant,
}

/// A revoke whose wait is over: its signal to send, and how long it
/// waited.
#[derive(Debug)]
pub(super) struct Settled {
    pub(super) quiet: Quiet,
    pub(super) parts: Vec<TopicPartition>,
    pub(super) waited: Duration,
}

/// What an answer that lands while its partition is revoking does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Route {
    /// As any answer: its partition is not being revoked.
    AsUsual,
    /// A success: the record is finished here, before the revoke commits.
    Finish,
    /// Anything else (a failure to retry, a hold, a dead letter): the next
    /// owner has the record and decides; no backoff, no retry copy, no
    /// dead letter from here.
    HandOver,
}

/// What an answer does, `revoking` its partition or not.
pub(super) fn route(revoking: bool, success: bool) -> Route {
    match (revoking, success) {
        (false, _) => Route::AsUsual,
        (true, true) => Route::Finish,
        (true, false) => Route::HandOver,
    }
}

fn part(origin: &Origin) -> TopicPartition {
    TopicPartition {
        topic: origin.topic.clone(),
        partition: origin.partition,
    }
}

impl Handoff {
    /// A call or a write of `origin`'s record was spawned.
    pub(super) fn started(&mut self, origin: &Origin) {
        *self.under_way.entry(part(origin)).or_default() += 1;
    }

    /// The task of one [`Handoff::started`] reported back.
    pub(super) fn ended(&mut self, origin: &Origin) {
        let tp = part(origin);
        let n = self
            .under_way
            .get_mut(&tp)
            .unwrap_or_else(|| panic!("work of {tp:?} ended that was never started"));
        *n -= 1;
        if *n == 0 {
            self.under_way.remove(&tp);
        }
    }

    /// A revoke of `parts` began at `now`: it waits for their work under
    /// way ([`Handoff::settled`] says when it is over).
    pub(super) fn begin(&mut self, parts: Vec<TopicPartition>, quiet: Quiet, now: Instant) {
        self.waiting.push(Waiting {
            parts,
            quiet,
            since: now,
        });
    }

    /// The revokes none of whose partitions has work under way any more.
    pub(super) fn settled(&mut self, now: Instant) -> Vec<Settled> {
        if self.waiting.is_empty() {
            return Vec::new();
        }
        let under_way = &self.under_way;
        let (done, left): (Vec<Waiting>, Vec<Waiting>) = std::mem::take(&mut self.waiting)
            .into_iter()
            .partition(|w| w.parts.iter().all(|tp| !under_way.contains_key(tp)));
        self.waiting = left;
        done.into_iter()
            .map(|w| Settled {
                quiet: w.quiet,
                parts: w.parts,
                waited: now.saturating_duration_since(w.since),
            })
            .collect()
    }

    /// The revoke of `parts` went on without waiting any longer (its bound
    /// passed): forgets its wait. Returns how many such waits there were.
    pub(super) fn revoked(&mut self, parts: &[TopicPartition]) -> usize {
        let before = self.waiting.len();
        self.waiting
            .retain(|w| !w.parts.iter().any(|tp| parts.contains(tp)));
        before - self.waiting.len()
    }

    /// Every revoke waiting, given up (the engine stops): their signals
    /// are dropped, which the revoke reads as "go on".
    pub(super) fn clear(&mut self) {
        self.waiting.clear();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    fn origin(partition: i32) -> Origin {
        Origin {
            topic: Arc::from("jobs"),
            partition,
            offset: 0,
            generation: 1,
        }
    }

    fn tp(partition: i32) -> TopicPartition {
        TopicPartition::new("jobs", partition)
    }

    /// A revoke waits for the work under way on its own partitions only,
    /// and says how long it waited, on the paused clock.
    #[tokio::test(start_paused = true)]
    async fn a_revoke_waits_for_its_own_partitions_work_only() {
        let mut h = Handoff::default();
        h.started(&origin(0));
        h.started(&origin(0));
        h.started(&origin(1));
        let (quiet, rx) = Quiet::new();
        let began = Instant::now();
        h.begin(vec![tp(0)], quiet, began);
        assert!(h.settled(Instant::now()).is_empty(), "two calls out on 0");
        tokio::time::advance(Duration::from_millis(300)).await;
        h.ended(&origin(0));
        assert!(h.settled(Instant::now()).is_empty(), "one call out on 0");
        tokio::time::advance(Duration::from_millis(200)).await;
        h.ended(&origin(0));
        let settled = h.settled(Instant::now());
        assert_eq!(settled.len(), 1, "partition 1's call does not hold it");
        assert_eq!(settled[0].waited, Duration::from_millis(500));
        assert_eq!(settled[0].parts, vec![tp(0)]);
        for s in settled {
            s.quiet.signal();
        }
        assert!(rx.try_recv().is_ok(), "the revoke is told");
        assert!(h.settled(Instant::now()).is_empty(), "told once");
    }

    /// A revoke with nothing under way goes on at once; one whose bound
    /// passed is forgotten when it is over.
    #[tokio::test(start_paused = true)]
    async fn a_revoke_with_nothing_under_way_goes_on_at_once() {
        let mut h = Handoff::default();
        let (quiet, _rx) = Quiet::new();
        h.begin(vec![tp(3)], quiet, Instant::now());
        assert_eq!(h.settled(Instant::now()).len(), 1);

        h.started(&origin(2));
        let (quiet, _rx) = Quiet::new();
        h.begin(vec![tp(2), tp(4)], quiet, Instant::now());
        assert!(h.settled(Instant::now()).is_empty());
        assert_eq!(h.revoked(&[tp(2)]), 1, "the bound passed: given up");
        assert!(h.settled(Instant::now()).is_empty());
        // The late answer still ends its count.
        h.ended(&origin(2));
        assert!(h.under_way.is_empty());
    }

    /// What an answer does while its partition is revoking: a success is
    /// finished here (and committed by the revoke); anything else goes to
    /// the next owner.
    #[test]
    fn only_a_success_is_kept_during_a_revoke() {
        // (revoking, success, route)
        let rows = [
            (false, true, Route::AsUsual),
            (false, false, Route::AsUsual),
            (true, true, Route::Finish),
            (true, false, Route::HandOver),
        ];
        for (i, (revoking, success, want)) in rows.into_iter().enumerate() {
            assert_eq!(route(revoking, success), want, "row {i}");
        }
    }

    #[test]
    #[should_panic(expected = "never started")]
    fn work_that_ends_twice_is_a_bug() {
        let mut h = Handoff::default();
        h.started(&origin(0));
        h.ended(&origin(0));
        h.ended(&origin(0));
    }
}
