//! One consumer's life in the group, apart from librdkafka: what a
//! rebalance, a received record, a commit and a commit's answer do to the
//! offsets it tracks. Pure logic over two small ports, [`Coordinator`] (the
//! broker's side of commits) and [`Ledger`]: librdkafka in the worker
//! ([`super::consumer`] adapts its callbacks and poll thread to these
//! calls), a deterministic broker in the simulation, so that the code that
//! decides what is committed, handed over and skipped is the code a
//! simulated fleet runs.
//!
//! The rules it keeps:
//! - **Revoke, in two steps.** [`Session::begin_revoke`]: the partitions
//!   going still belong here (their records can be finished) but start no
//!   new work ([`Session::may_start`]); the worker finishes what is under
//!   way, within a bound. [`Session::revoke`]: the finished prefix is
//!   written to the ledger, then committed and waited for, then the
//!   partitions are forgotten and their generation bumped, so that a
//!   record of the old assignment cannot move an offset of the next one.
//! - **Assign:** what the previous owner finished beyond its committed
//!   offset (the commit's metadata and the ledger, [`ledger::inherited`])
//!   is read before the first record, and such records are finished on
//!   receipt instead of being done again.
//! - **Periodic commit:** asynchronous, one in flight at a time; its
//!   offsets count as committed only for the partitions the broker's answer
//!   accepted.
//! - **Final commit:** synchronous, every committable partition.
//! - **Fence** (issue 53, item 2; the rules are [`super::fence`]'s): a
//!   consumer that may have lost its session (a stall of the process
//!   past the session timeout, an assignment librdkafka says is lost)
//!   starts no call ([`Session::fenced`]) until its ownership is confirmed
//!   again: a new assignment, a commit the coordinator accepted, or a
//!   session timeout of polls with the assignment kept.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::time::Instant;

use crate::telemetry::events::{
    AlreadyDone, CommitFailed, HandoffLedgerFailed, OffsetsCommitted, RecordDeliveredAgain,
    SessionFenced, SessionResumed,
};

use super::done_ranges::Ranges;
use super::fence::{By, Change, Fencing, Watch, Why};
use super::ledger::{self, Ledger};
use super::offsets::{Commit, Finish, Offsets};
use super::record::{HeldBack, Origin, TopicPartition};

/// The broker's side of commits, as a consumer sees it.
pub trait Coordinator {
    type Error: std::fmt::Display;
    /// Commits `commits` and waits for the broker's answer.
    fn commit_sync(&self, commits: &[Commit]) -> Result<(), Self::Error>;
    /// The committed offset and metadata of each of `parts`, in order
    /// (`None`: the group never committed the partition).
    #[allow(clippy::type_complexity)]
    fn committed(
        &self,
        parts: &[TopicPartition],
    ) -> Result<Vec<Option<(i64, String)>>, Self::Error>;
}

/// A coordinator that also takes commits without waiting; each answer is
/// handed back through [`Session::answered`].
pub trait AsyncCommits: Coordinator {
    fn send(&self, commits: &[Commit]) -> Result<(), Self::Error>;
}

/// The broker's answer to an asynchronous commit.
#[derive(Debug, Default)]
pub struct Answer {
    /// The commit failed as a whole.
    pub error: Option<String>,
    /// Partitions the broker refused, with why.
    pub refused: Vec<(String, i32, String)>,
}

impl Answer {
    /// Whether `topic`/`partition` was committed.
    pub fn committed(&self, topic: &str, partition: i32) -> bool {
        self.error.is_none()
            && !self
                .refused
                .iter()
                .any(|(t, p, _)| t == topic && *p == partition)
    }
}

/// What happened to a received record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Received {
    /// Tracked as unfinished, in this assignment of its partition.
    Take { generation: u64 },
    /// The partition's previous owner finished it after its committed
    /// offset: finished here at once, not done again.
    AlreadyDone,
    /// Delivered again in this assignment (a fetch retried): this consumer
    /// holds it or has finished it, so it is not work a second time.
    Again,
}

/// The offsets of every assigned partition, and each partition's
/// assignment count.
#[derive(Debug, Default)]
struct Tracker {
    offsets: Offsets,
    /// Bumped at every assignment and revocation of a partition.
    generations: HashMap<(String, i32), u64>,
    /// The periodic commit sent and not yet answered: one at a time.
    in_flight: Option<Vec<Commit>>,
    /// Partitions whose revoke has begun and not ended: still owned, and
    /// starting nothing new.
    revoking: HashSet<(String, i32)>,
    /// Whether the session may have been lost, and since when.
    fencing: Fencing,
}

impl Tracker {
    fn generation(&self, topic: &str, partition: i32) -> u64 {
        self.generations
            .get(&(topic.to_owned(), partition))
            .copied()
            .unwrap_or(0)
    }

    fn bump(&mut self, topic: &str, partition: i32) {
        *self
            .generations
            .entry((topic.to_owned(), partition))
            .or_default() += 1;
    }

    fn owns(&self, origin: &Origin) -> bool {
        self.generation(&origin.topic, origin.partition) == origin.generation
    }

    fn revoking(&self, topic: &str, partition: i32) -> bool {
        self.revoking.contains(&(topic.to_owned(), partition))
    }
}

/// One consumer's state, shared by the thread that polls (and runs the
/// rebalance callbacks) and the worker's tasks that finish records.
pub struct Session {
    tracker: Mutex<Tracker>,
    /// Where every commit is also written, read at assignment; none in
    /// tools and tests that run no Redis.
    ledger: Option<Arc<dyn Ledger>>,
    /// Set once the final commit is made: the revokes that closing the
    /// consumer runs afterwards commit nothing (a synchronous commit there
    /// would wait for a reply the closing consumer no longer serves).
    closing: AtomicBool,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("tracker", &self.tracker)
            .field("ledger", &self.ledger.is_some())
            .finish()
    }
}

impl Session {
    pub fn new(ledger: Option<Arc<dyn Ledger>>) -> Session {
        Session {
            tracker: Mutex::default(),
            ledger,
            closing: AtomicBool::new(false),
        }
    }

    /// The session, fenced by time as `watch` says as well as by lost
    /// assignments (the worker's consumers; tools and the simulation's
    /// brokers do not tick).
    pub fn watched(self, watch: Watch) -> Session {
        self.lock().fencing = Fencing::new(Some(watch));
        self
    }

    fn lock(&self) -> MutexGuard<'_, Tracker> {
        // Plain data: a panic while it was held cannot have left it worse
        // than "some offsets not finished", which only means a redelivery.
        self.tracker.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether `origin` belongs to the current assignment of its partition.
    pub fn owns(&self, origin: &Origin) -> bool {
        self.lock().owns(origin)
    }

    /// Whether work on `origin` may start: it is owned, and its partition
    /// is not being revoked (its calls under way finish; no new one goes).
    pub fn may_start(&self, origin: &Origin) -> bool {
        let t = self.lock();
        t.owns(origin) && !t.revoking(&origin.topic, origin.partition)
    }

    /// Whether calls must not start at `now`: the session may have been
    /// lost and its ownership is not confirmed again. Work already under
    /// way finishes, and nothing is dropped for it: the records stay owned
    /// (a lost assignment's revoke forgets them).
    pub fn fenced(&self, now: Instant) -> bool {
        let (fenced, change) = self.lock().fencing.check(now);
        self.tell(change);
        fenced
    }

    /// The poll thread is alive at `now` (a sign of life, as
    /// [`Session::alive`]); librdkafka says the assignment is `lost` or
    /// not. While fenced, every [`super::fence::CONFIRM_EVERY`]
    /// it also asks the coordinator, with a synchronous commit of the
    /// finished prefix (or of the offset already committed), whether this
    /// member's generation is still current: accepted, the fence ends.
    pub fn tick<C: Coordinator>(&self, broker: &C, now: Instant, lost: bool) {
        let (change, commits) = {
            let mut t = self.lock();
            let change = t.fencing.tick(now, lost);
            let due = t.fencing.confirm_due(now);
            let commits = match due {
                false => Vec::new(),
                true => {
                    let new = t.offsets.committable();
                    match (new.is_empty(), t.offsets.recommit()) {
                        (false, _) => new,
                        (true, Some(old)) => vec![old],
                        (true, None) => Vec::new(),
                    }
                }
            };
            (change, commits)
        };
        self.tell(change);
        // Nothing was ever committed or finished here: only a new
        // assignment or the heartbeats' bound confirms.
        if commits.is_empty() || self.closing.load(Ordering::Acquire) {
            return;
        }
        if commits.iter().any(|c| c.acked != Some(c.offset)) {
            self.record(&commits);
        }
        match broker.commit_sync(&commits) {
            Ok(()) => {
                let change = {
                    let mut t = self.lock();
                    t.offsets.mark_committed(&commits);
                    t.fencing.confirmed(now, By::Commit)
                };
                self.tell(change);
            }
            // Expected after a real loss (a stale generation): librdkafka
            // rejoins, and the new assignment ends the fence.
            Err(e) => {
                tracing::debug!(error = %e, "a fenced consumer's confirming commit was refused")
            }
        }
    }

    /// The process is alive at `now` (the consumer's watchdog thread): a
    /// gap since the last sign of life is a stall.
    pub fn alive(&self, now: Instant) {
        let change = self.lock().fencing.alive(now);
        self.tell(change);
    }

    /// The assignment is lost (librdkafka's flag on a revoke): fenced until
    /// a new one.
    pub fn lost(&self, now: Instant) {
        let change = self.lock().fencing.lost(now);
        self.tell(change);
    }

    /// Tells a change of the fence, once, where it was found.
    fn tell(&self, change: Option<Change>) {
        let Some(change) = change else { return };
        let consumer = self
            .lock()
            .fencing
            .watch()
            .map_or("unwatched", |w| w.consumer);
        match change {
            Change::Fenced(why) => SessionFenced {
                consumer,
                reason: why.label(),
                gap: match why {
                    Why::Stalled { gap } => Some(gap),
                    Why::AssignmentLost => None,
                },
            }
            .emit(),
            Change::Resumed { by, fenced_for } => SessionResumed {
                consumer,
                by: by.label(),
                fenced_for,
            }
            .emit(),
        }
    }

    /// A revoke begins: `revoked` start no new work from now on, and stay
    /// owned (their records can be finished) until [`Session::revoke`].
    pub fn begin_revoke(&self, revoked: &[TopicPartition]) {
        let mut t = self.lock();
        for tp in revoked {
            t.revoking.insert((tp.topic.to_string(), tp.partition));
        }
    }

    /// Marks a record finished (done, dead-lettered, or acknowledged on the
    /// retry topic). Records of a revoked assignment are ignored.
    pub fn finish(&self, origin: &Origin) -> Finish {
        let mut t = self.lock();
        if !t.owns(origin) {
            return Finish::NotTracked;
        }
        t.offsets
            .finish(&origin.topic, origin.partition, origin.offset)
    }

    /// Records received and not yet finished.
    pub fn unfinished(&self) -> usize {
        self.lock().offsets.unfinished()
    }

    /// Partitions whose first unfinished record holds finished ones back.
    pub fn held_back(&self) -> Vec<HeldBack> {
        self.lock()
            .offsets
            .held_back()
            .into_iter()
            .map(|(topic, partition, offset, finished_behind)| HeldBack {
                partition: TopicPartition::new(topic.as_str(), partition),
                offset,
                finished_behind,
            })
            .collect()
    }

    /// Each tracked partition's age of its oldest unfinished record (s) at
    /// `now_ms`, 0 when everything taken is finished.
    pub fn unfinished_ages(&self, now_ms: i64) -> HashMap<(String, i32), f64> {
        self.lock()
            .offsets
            .oldest_unfinished_ms()
            .into_iter()
            .map(|(t, p, ts)| {
                let age = ts.map_or(0.0, |ts| (now_ms - ts).max(0) as f64 / 1000.0);
                ((t.to_owned(), p), age)
            })
            .collect()
    }

    /// The final commit is made: later revokes commit nothing.
    pub fn close(&self) {
        self.closing.store(true, Ordering::Release);
    }

    /// A record arrived: tracks it, or finishes it at once when the
    /// partition's previous owner already did it. `timestamp_ms` feeds the
    /// lag in seconds.
    pub fn receive(
        &self,
        topic: &str,
        partition: i32,
        offset: i64,
        timestamp_ms: Option<i64>,
    ) -> Received {
        let mut t = self.lock();
        match t.offsets.track(topic, partition, offset) {
            Ok(()) => {
                if let (Some(ts), Some(p)) =
                    (timestamp_ms, t.offsets.partition_mut(topic, partition))
                {
                    p.note_time(offset, ts);
                }
            }
            // Sent again in this assignment (a fetch retried): held here or
            // finished here, so not work a second time (issue 53, item 4).
            Err(_) if t.offsets.received(topic, partition, offset) => {
                RecordDeliveredAgain {
                    topic,
                    partition,
                    offset,
                }
                .emit();
                return Received::Again;
            }
            // Offsets only go backwards after a seek we never make; the
            // record is still processed, its offset simply not tracked.
            Err(e) => tracing::warn!(error = %e, topic, partition, offset, "offset not tracked"),
        }
        if t.offsets.inherited_done(topic, partition, offset) {
            t.offsets.finish(topic, partition, offset);
            AlreadyDone { offset }.emit();
            return Received::AlreadyDone;
        }
        Received::Take {
            generation: t.generation(topic, partition),
        }
    }

    /// Partitions are going (inside the rebalance), their work under way
    /// ended or given up on: their finished prefix is written to the ledger
    /// and committed, waiting for the answer, then they are forgotten.
    /// Returns how many partitions were committed.
    pub fn revoke<C: Coordinator>(&self, broker: &C, revoked: &[TopicPartition]) -> usize {
        let commits: Vec<Commit> = self
            .lock()
            .offsets
            .committable()
            .into_iter()
            .filter(|c| {
                revoked
                    .iter()
                    .any(|tp| *tp.topic == *c.topic && tp.partition == c.partition)
            })
            .collect();
        let mut committed = 0;
        // The tracker is not held during the commit: the worker's tasks keep
        // finishing records of other partitions meanwhile. Those of the
        // revoked ones ended before (the revoke waited for them); one that
        // finishes now, its wait's bound passed, is forgotten just below
        // and done again by the next owner.
        if !commits.is_empty() && !self.closing.load(Ordering::Acquire) {
            // The ledger first: the broker refuses commits while the group
            // rebalances, and this is one.
            self.record(&commits);
            match broker.commit_sync(&commits) {
                Ok(()) => {
                    self.lock().offsets.mark_committed(&commits);
                    committed = commits.len();
                    OffsetsCommitted {
                        partitions: commits.len(),
                        sync: true,
                    }
                    .emit();
                }
                Err(e) => CommitFailed {
                    error: &format!(
                        "{e} (on revoke: the new owner redoes the uncommitted records)"
                    ),
                }
                .emit(),
            }
        }
        let mut t = self.lock();
        for TopicPartition { topic, partition } in revoked {
            t.offsets.remove_partition(topic, *partition);
            t.bump(topic, *partition);
            t.revoking.remove(&(topic.to_string(), *partition));
        }
        committed
    }

    /// Partitions arrived (after the rebalance): they start afresh, with
    /// what their previous owner finished beyond its commit to be skipped.
    pub fn assign<C: Coordinator>(&self, broker: &C, assigned: &[TopicPartition]) {
        self.assign_at(broker, assigned, Instant::now());
    }

    /// [`Session::assign`] at `now`. A rebalance completed with this member
    /// in it: its ownership is confirmed, and a fence ends.
    pub fn assign_at<C: Coordinator>(&self, broker: &C, assigned: &[TopicPartition], now: Instant) {
        let done = self.inherited(broker, assigned);
        let change = {
            let mut t = self.lock();
            for TopicPartition { topic, partition } in assigned {
                t.offsets.remove_partition(topic, *partition);
                t.bump(topic, *partition);
                t.revoking.remove(&(topic.to_string(), *partition));
            }
            for (TopicPartition { topic, partition }, ranges, committed) in done {
                t.offsets.inherit(&topic, partition, ranges, committed);
            }
            t.fencing.confirmed(now, By::Assignment)
        };
        self.tell(change);
    }

    /// What the new owner of each of `parts` may skip: the records finished
    /// beyond the broker's committed offset, as its metadata and the
    /// handoff ledger name them, with that offset. A failed look-up only
    /// means those records are redone.
    fn inherited<C: Coordinator>(
        &self,
        broker: &C,
        parts: &[TopicPartition],
    ) -> Vec<(TopicPartition, Ranges, Option<i64>)> {
        let committed = broker.committed(parts).unwrap_or_else(|e| {
            tracing::warn!(error = %e, "cannot read committed metadata; records finished past the committed offsets will be redone");
            vec![None; parts.len()]
        });
        let keys: Vec<(String, i32)> = parts
            .iter()
            .map(|tp| (tp.topic.to_string(), tp.partition))
            .collect();
        let entries = match self.ledger.as_ref().map(|l| l.read(&keys)) {
            Some(Ok(entries)) => entries,
            Some(Err(e)) => {
                HandoffLedgerFailed {
                    op: "read",
                    error: &e.to_string(),
                }
                .emit();
                Vec::new()
            }
            None => Vec::new(),
        };
        parts
            .iter()
            .enumerate()
            .map(|(i, tp)| {
                let commit = committed.get(i).and_then(Option::as_ref);
                let entry = entries.get(i).and_then(Option::as_ref);
                let done = ledger::inherited(commit.map(|(o, m)| (*o, m.as_str())), entry);
                (tp.clone(), done, commit.map(|(o, _)| *o))
            })
            .collect()
    }

    /// Commits the finished prefix: the final commit (`all`), synchronous,
    /// of every partition with a committable offset; or the periodic one,
    /// sent without waiting, of every partition that moved since the last,
    /// unless one is still unanswered. Returns how many partitions were
    /// committed (sent, for the periodic one). Failures are counted and
    /// logged here; the next commit tries again.
    pub fn commit<C: AsyncCommits>(&self, broker: &C, all: bool) -> Result<usize, C::Error> {
        if all {
            let commits = self.lock().offsets.committable();
            return self.commit_sync(broker, commits);
        }
        let commits = {
            let t = self.lock();
            if t.in_flight.is_some() {
                return Ok(0);
            }
            t.offsets.uncommitted()
        };
        if commits.is_empty() {
            return Ok(0);
        }
        self.record(&commits);
        let n = commits.len();
        // In flight before it is sent: its answer may come back on
        // another thread before `send` returns.
        self.lock().in_flight = Some(commits.clone());
        match broker.send(&commits) {
            Ok(()) => Ok(n),
            Err(e) => {
                self.lock().in_flight = None;
                CommitFailed {
                    error: &e.to_string(),
                }
                .emit();
                Err(e)
            }
        }
    }

    /// Commits, synchronously, where each partition with a record received
    /// stands: its finished prefix, or, with nothing finished, its first
    /// record (`Offsets::starts`). A new install's first limiter call
    /// waits for it: once the group has committed, any replica that starts
    /// or looks again reads the install as begun, so a later loss of
    /// Redis' data is not taken for a first deploy. Returns how many
    /// partitions were committed (0: none had a record).
    pub fn commit_start<C: Coordinator>(&self, broker: &C) -> Result<usize, C::Error> {
        let commits = self.lock().offsets.starts();
        self.commit_sync(broker, commits)
    }

    fn commit_sync<C: Coordinator>(
        &self,
        broker: &C,
        commits: Vec<Commit>,
    ) -> Result<usize, C::Error> {
        if commits.is_empty() {
            return Ok(0);
        }
        self.record(&commits);
        let n = commits.len();
        match broker.commit_sync(&commits) {
            Ok(()) => {
                self.lock().offsets.mark_committed(&commits);
                OffsetsCommitted {
                    partitions: n,
                    sync: true,
                }
                .emit();
                Ok(n)
            }
            Err(e) => {
                CommitFailed {
                    error: &e.to_string(),
                }
                .emit();
                Err(e)
            }
        }
    }

    /// The answer of the periodic commit: its partitions the broker
    /// accepted count as committed.
    pub fn answered(&self, answer: &Answer) {
        let Some(sent) = self.lock().in_flight.take() else {
            return;
        };
        let done: Vec<Commit> = sent
            .into_iter()
            .filter(|c| answer.committed(&c.topic, c.partition))
            .collect();
        if !done.is_empty() {
            self.lock().offsets.mark_committed(&done);
            OffsetsCommitted {
                partitions: done.len(),
                sync: false,
            }
            .emit();
        }
        if let Some(e) = &answer.error {
            CommitFailed { error: e }.emit();
        }
        for (topic, partition, why) in &answer.refused {
            CommitFailed {
                error: &format!("{topic}[{partition}]: {why}"),
            }
            .emit();
        }
    }

    /// Writes `commits` to the ledger, before they go to the broker.
    fn record(&self, commits: &[Commit]) {
        let Some(ledger) = &self.ledger else {
            return;
        };
        if let Err(e) = ledger.write(commits) {
            HandoffLedgerFailed {
                op: "write",
                error: &e.to_string(),
            }
            .emit();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;
    use std::collections::BTreeMap;

    use std::time::Duration;

    use super::*;
    use crate::kafka::ledger::{Entry, LedgerError};

    /// A broker that keeps commits with their metadata; `refuse` makes it
    /// refuse every commit (a rebalance under way).
    #[derive(Default)]
    struct FakeBroker {
        committed: RefCell<BTreeMap<(String, i32), (i64, String)>>,
        refuse: bool,
        sent: RefCell<Vec<Vec<Commit>>>,
    }

    impl Coordinator for FakeBroker {
        type Error = String;

        fn commit_sync(&self, commits: &[Commit]) -> Result<(), String> {
            if self.refuse {
                return Err("rebalance in progress".to_owned());
            }
            for c in commits {
                self.committed.borrow_mut().insert(
                    (c.topic.clone(), c.partition),
                    (c.offset, c.metadata.clone()),
                );
            }
            Ok(())
        }

        fn committed(
            &self,
            parts: &[TopicPartition],
        ) -> Result<Vec<Option<(i64, String)>>, String> {
            Ok(parts
                .iter()
                .map(|tp| {
                    self.committed
                        .borrow()
                        .get(&(tp.topic.to_string(), tp.partition))
                        .cloned()
                })
                .collect())
        }
    }

    impl AsyncCommits for FakeBroker {
        fn send(&self, commits: &[Commit]) -> Result<(), String> {
            self.sent.borrow_mut().push(commits.to_vec());
            self.commit_sync(commits)
        }
    }

    #[derive(Default)]
    struct FakeLedger(Mutex<BTreeMap<(String, i32), Entry>>);

    impl Ledger for FakeLedger {
        fn write(&self, commits: &[Commit]) -> Result<(), LedgerError> {
            let mut m = self.0.lock().unwrap();
            for c in commits {
                m.insert((c.topic.clone(), c.partition), Entry::of(c));
            }
            Ok(())
        }

        fn read(&self, parts: &[(String, i32)]) -> Result<Vec<Option<Entry>>, LedgerError> {
            let m = self.0.lock().unwrap();
            Ok(parts.iter().map(|k| m.get(k).cloned()).collect())
        }
    }

    fn tp(p: i32) -> TopicPartition {
        TopicPartition::new("jobs", p)
    }

    /// Takes offsets `0..n` of partition 0 and returns their origins.
    fn take(s: &Session, n: i64) -> Vec<Origin> {
        (0..n)
            .map(|offset| match s.receive("jobs", 0, offset, None) {
                Received::Take { generation } => Origin {
                    topic: "jobs".into(),
                    partition: 0,
                    offset,
                    generation,
                },
                other => panic!("offset {offset} skipped: {other:?}"),
            })
            .collect()
    }

    /// What a graceful handoff carries, and what it costs when the broker
    /// refuses the revoke's commit: the next owner skips exactly the
    /// records its last owner finished, through the commit's metadata, or
    /// through the ledger alone.
    #[test]
    fn the_next_owner_skips_what_the_last_one_finished_through_a_refused_commit_too() {
        for (refuse, ledger) in [(false, false), (true, true), (false, true)] {
            let broker = FakeBroker {
                refuse,
                ..FakeBroker::default()
            };
            let book: Arc<FakeLedger> = Arc::default();
            let led = || ledger.then(|| book.clone() as Arc<dyn Ledger>);
            let first = Session::new(led());
            first.assign(&broker, &[tp(0)]);
            let origins = take(&first, 6);
            // 0, 1, 3 and 5 finished; 2 and 4 still waiting at the revoke.
            for o in [0, 1, 3, 5] {
                first.finish(&origins[o]);
            }
            first.revoke(&broker, &[tp(0)]);
            assert!(
                !first.owns(&origins[2]),
                "a revoked record is no longer owned"
            );
            let next = Session::new(led());
            next.assign(&broker, &[tp(0)]);
            let from = broker
                .committed
                .borrow()
                .get(&("jobs".to_owned(), 0))
                .map_or(0, |(o, _)| *o);
            let redone: Vec<i64> = (from..6)
                .filter(|&o| next.receive("jobs", 0, o, None) != Received::AlreadyDone)
                .collect();
            assert_eq!(
                redone,
                vec![2, 4],
                "refused {refuse}, ledger {ledger}: only the unfinished are redone"
            );
        }
    }

    /// Issue 52, item 1: a new install's first limiter call commits where
    /// each partition stands before it goes, so that a replica that reads
    /// the group's commits after it sees the install as begun (a later
    /// loss of Redis' data is then not taken for a first deploy). With
    /// nothing finished that is the first record's offset (the periodic
    /// and final commits have nothing to send then); never past an
    /// unfinished record; refused, it says so.
    #[test]
    fn a_start_commit_names_the_first_record_with_nothing_finished() {
        let broker = FakeBroker::default();
        let s = Session::new(None);
        s.assign(&broker, &[tp(0), tp(1)]);
        assert_eq!(s.commit_start(&broker), Ok(0), "no record yet");
        let origins = take(&s, 3);
        assert_eq!(s.commit(&broker, true), Ok(0), "nothing finished");
        assert_eq!(s.commit_start(&broker), Ok(1), "partition 0 only");
        let at = |p: i32| {
            broker
                .committed
                .borrow()
                .get(&("jobs".to_owned(), p))
                .cloned()
        };
        assert_eq!(at(0).map(|(o, _)| o), Some(0), "its first record");
        assert_eq!(at(1), None, "no record of partition 1");
        s.finish(&origins[0]);
        s.finish(&origins[2]);
        assert_eq!(s.commit_start(&broker), Ok(1));
        assert_eq!(
            at(0).map(|(o, _)| o),
            Some(1),
            "the finished prefix, not past record 1"
        );
        let refusing = FakeBroker {
            refuse: true,
            ..FakeBroker::default()
        };
        assert!(s.commit_start(&refusing).is_err(), "a refusal is an error");
    }

    /// Issue 53, item 4: the broker sends records of an assignment again (a
    /// fetch retried): one this consumer still holds, and one it has
    /// finished. Neither is work: taken again, the held one was called
    /// twice at once and the finished one called again, though the
    /// consumer knew both (before the fix both came back `Take`, untracked).
    #[test]
    fn a_record_delivered_again_in_its_assignment_is_not_taken_twice() {
        let broker = FakeBroker::default();
        let s = Session::new(None);
        s.assign(&broker, &[tp(0)]);
        let origins = take(&s, 4);
        s.finish(&origins[0]);
        s.finish(&origins[2]);
        // (row, offset delivered again, what the consumer knows of it)
        for (row, offset) in [(1, 0), (2, 1), (3, 2), (4, 3)] {
            assert_eq!(
                s.receive("jobs", 0, offset, None),
                Received::Again,
                "row {row}: offset {offset}, finished or held here"
            );
        }
        assert_eq!(s.unfinished(), 2, "1 and 3 are still held, once each");
        s.finish(&origins[1]);
        assert_eq!(
            s.commit(&broker, true),
            Ok(1),
            "the prefix runs through 2, 3 still held"
        );
        assert_eq!(
            broker
                .committed
                .borrow()
                .get(&("jobs".to_owned(), 0))
                .map(|c| c.0),
            Some(3)
        );
        // The next record is work as before.
        assert!(matches!(
            s.receive("jobs", 0, 4, None),
            Received::Take { .. }
        ));
    }

    /// One periodic commit in flight at a time; its answer counts only for
    /// the partitions the broker accepted, and the next commit sends the
    /// refused ones again.
    #[test]
    fn a_periodic_commit_counts_only_what_its_answer_accepted() {
        let broker = FakeBroker::default();
        let s = Session::new(None);
        s.assign(&broker, &[tp(0), tp(1)]);
        for p in [0, 1] {
            if let Received::Take { generation } = s.receive("jobs", p, 0, None) {
                s.finish(&Origin {
                    topic: "jobs".into(),
                    partition: p,
                    offset: 0,
                    generation,
                });
            }
        }
        assert_eq!(s.commit(&broker, false), Ok(2));
        assert_eq!(s.commit(&broker, false), Ok(0), "one in flight at a time");
        s.answered(&Answer {
            error: None,
            refused: vec![("jobs".to_owned(), 1, "rebalance in progress".to_owned())],
        });
        assert_eq!(s.commit(&broker, false), Ok(1), "partition 1 again");
        let last = broker.sent.borrow().last().cloned().unwrap();
        assert_eq!((last[0].partition, last[0].offset), (1, 1));
    }

    /// Issue 53: a revoke in two steps. Between them the partition starts
    /// nothing new, and what finishes meanwhile is in the revoke's commit
    /// (a late answer used to fail `owns` and be done again).
    #[test]
    fn a_record_finished_while_its_revoke_waits_is_committed() {
        let broker = FakeBroker::default();
        let s = Session::new(None);
        s.assign(&broker, &[tp(0), tp(1)]);
        let origins = take(&s, 3);
        assert!(s.may_start(&origins[0]));
        s.begin_revoke(&[tp(0)]);
        assert!(s.owns(&origins[0]), "still owned while the revoke waits");
        assert!(!s.may_start(&origins[0]), "but starts nothing new");
        let other = match s.receive("jobs", 1, 0, None) {
            Received::Take { generation } => Origin {
                topic: "jobs".into(),
                partition: 1,
                offset: 0,
                generation,
            },
            other => panic!("skipped: {other:?}"),
        };
        assert!(s.may_start(&other), "other partitions go on");
        // The call under way answers during the wait.
        s.finish(&origins[0]);
        s.finish(&origins[1]);
        s.revoke(&broker, &[tp(0)]);
        assert_eq!(
            broker
                .committed
                .borrow()
                .get(&("jobs".to_owned(), 0))
                .map(|c| c.0),
            Some(2),
            "the answers of the wait are committed"
        );
        assert!(!s.owns(&origins[2]) && !s.may_start(&origins[2]));
        // A later assignment of the partition starts afresh.
        s.assign(&broker, &[tp(0)]);
        let again = take(&s, 1);
        assert!(s.may_start(&again[0]), "a new assignment is not revoking");
    }

    fn watched(ledger: Option<Arc<dyn Ledger>>) -> Session {
        Session::new(ledger).watched(Watch {
            consumer: "jobs",
            stall_after: Duration::from_secs(40),
            confirm_after: Duration::from_secs(45),
        })
    }

    const SEC: Duration = Duration::from_secs(1);

    /// Issue 53: a process stalled past the session timeout resumes
    /// believing it owns its partitions. It calls nothing (whichever thread
    /// looks first) until the coordinator accepts a commit of its
    /// generation: here the finished prefix, written to the ledger first.
    #[test]
    fn a_stalled_session_calls_nothing_until_a_commit_confirms_it() {
        let cap = crate::telemetry::events::capture();
        let broker = FakeBroker::default();
        let book: Arc<FakeLedger> = Arc::default();
        let s = watched(Some(book.clone()));
        s.assign(&broker, &[tp(0)]);
        let origins = take(&s, 2);
        s.finish(&origins[0]);
        let t0 = Instant::now();
        s.tick(&broker, t0, false);
        assert!(!s.fenced(t0 + 40 * SEC), "within the bound");
        // The engine's call runs first after the stall: fenced there.
        assert!(s.fenced(t0 + 50 * SEC), "a 50 s silence fences");
        assert!(
            s.may_start(&origins[1]),
            "the records stay owned: nothing is dropped"
        );
        // The poll thread wakes: its commit is accepted, the fence ends.
        s.tick(&broker, t0 + 50 * SEC, false);
        assert!(!s.fenced(t0 + 50 * SEC), "confirmed by the commit");
        assert_eq!(
            broker
                .committed
                .borrow()
                .get(&("jobs".to_owned(), 0))
                .map(|c| c.0),
            Some(1),
            "the finished prefix was the confirming commit"
        );
        assert!(
            book.0.lock().unwrap().contains_key(&("jobs".to_owned(), 0)),
            "and reached the ledger first"
        );
        assert_eq!(cap.count::<SessionFenced>(), 1, "{:?}", cap.events());
        let resumed = cap.of::<SessionResumed>();
        assert_eq!(resumed.len(), 1, "{:?}", cap.events());
        assert!(resumed[0].contains("\"commit\""), "{resumed:?}");
    }

    /// A coordinator that refuses the commit (the generation is stale)
    /// keeps the fence: only the assignment after the rejoin ends it. With
    /// nothing new finished, the offset already committed is sent again.
    #[test]
    fn a_refused_confirmation_keeps_the_fence_until_the_next_assignment() {
        let mut broker = FakeBroker::default();
        let s = watched(None);
        s.assign(&broker, &[tp(0)]);
        let origins = take(&s, 1);
        s.finish(&origins[0]);
        assert_eq!(s.commit(&broker, true), Ok(1));
        let t0 = Instant::now();
        s.tick(&broker, t0, false);
        broker.refuse = true;
        // Every second for ten: each refused, none ends the fence.
        for k in 1..=10 {
            s.tick(&broker, t0 + 60 * SEC + k * SEC, false);
            assert!(s.fenced(t0 + 60 * SEC + k * SEC), "second {k}");
        }
        broker.refuse = false;
        s.revoke(&broker, &[tp(0)]);
        s.assign_at(&broker, &[tp(0)], t0 + 71 * SEC);
        assert!(!s.fenced(t0 + 71 * SEC), "a new assignment confirms");

        // Nothing new finished: the committed offset is sent again, with
        // its metadata, and confirms.
        let s = watched(None);
        s.assign(&broker, &[tp(0)]);
        s.tick(&broker, t0, false);
        s.tick(&broker, t0 + 60 * SEC, false);
        assert!(!s.fenced(t0 + 60 * SEC), "the re-commit was accepted");
        assert_eq!(
            broker.sent.borrow().len(),
            0,
            "synchronous, not a periodic commit"
        );
    }

    /// librdkafka says the assignment is lost: no commit can confirm it,
    /// only the next assignment; the revoke still forgets the partitions.
    #[test]
    fn a_lost_assignment_is_fenced_until_the_next() {
        let broker = FakeBroker::default();
        let s = watched(None);
        s.assign(&broker, &[tp(0)]);
        let origins = take(&s, 2);
        s.finish(&origins[0]);
        let t0 = Instant::now();
        s.tick(&broker, t0, false);
        s.lost(t0 + SEC);
        for k in 2..100 {
            s.tick(&broker, t0 + k * SEC, true);
        }
        assert!(
            s.fenced(t0 + 100 * SEC),
            "lost: neither commits nor time end it"
        );
        assert!(
            broker.committed.borrow().is_empty(),
            "no confirming commit tried"
        );
        s.revoke(&broker, &[tp(0)]);
        assert!(!s.owns(&origins[1]));
        s.assign_at(&broker, &[tp(0)], t0 + 101 * SEC);
        assert!(!s.fenced(t0 + 101 * SEC));
        // The flag may read set a while after: not a new loss.
        s.tick(&broker, t0 + 102 * SEC, true);
        assert!(!s.fenced(t0 + 102 * SEC));
    }

    /// After the final commit, closing revokes commit nothing: the
    /// consumer no longer serves the answer a commit would wait for.
    #[test]
    fn a_closed_session_commits_nothing_on_revoke() {
        let broker = FakeBroker::default();
        let s = Session::new(None);
        s.assign(&broker, &[tp(0)]);
        let origins = take(&s, 1);
        s.finish(&origins[0]);
        s.close();
        assert_eq!(s.revoke(&broker, &[tp(0)]), 0);
        assert!(broker.committed.borrow().is_empty());
    }
}
