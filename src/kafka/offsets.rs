//! Which offset of each partition may be committed.
//!
//! A record is *tracked* when the worker takes it and *finished* when it is
//! done, dead-lettered or acknowledged on the retry topic. Jobs finish out of
//! order (sellers wait for different times), but a Kafka commit means "every
//! record before this offset is finished", so only the contiguous finished
//! prefix may be committed. This module is pure bookkeeping: no rdkafka.
//!
//! Offsets of one partition need not be consecutive (compacted topics,
//! transaction markers): only tracked offsets matter, and a gap counts as
//! finished.

use std::collections::{BTreeMap, HashMap};

use super::done_ranges::{self, Ranges};

/// What [`PartitionOffsets::track`] refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum TrackError {
    /// Kafka delivers a partition's records in offset order; an offset at
    /// or below one already tracked means the consumer was rewound without
    /// the tracker being reset (call `remove_partition` on revoke/seek).
    #[error("offset {offset} is not above the last tracked offset {last}; reset the tracker after a seek or reassignment")]
    NotIncreasing { offset: i64, last: i64 },
    #[error("offset {0} is negative; only real record offsets can be tracked")]
    Negative(i64),
}

/// What [`PartitionOffsets::finish`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finish {
    /// The offset was tracked and is now finished.
    Finished,
    /// It was finished before; nothing changed (finishing twice is harmless).
    AlreadyFinished,
    /// It was never tracked here (e.g. its partition was revoked and reset).
    NotTracked,
}

/// The tracker for one partition.
#[derive(Debug, Clone, Default)]
pub struct PartitionOffsets {
    /// Tracked offsets above the finished prefix, with whether each is
    /// finished. The first entry, if any, is always unfinished.
    open: BTreeMap<i64, bool>,
    /// The highest offset of the contiguous finished prefix.
    done_through: Option<i64>,
    /// The highest offset ever tracked; later offsets must be above it.
    last_tracked: Option<i64>,
    /// The last offset handed to [`mark_committed`](Self::mark_committed).
    committed: Option<i64>,
    /// The metadata committed with it.
    committed_metadata: String,
    /// How many entries of `open` are finished (all behind its first).
    finished_ahead: usize,
    /// Offset ranges the partition's previous owner finished above the
    /// offset it committed (its commit's metadata), ascending and disjoint:
    /// their records are finished on receipt, not called again, and the
    /// part not received yet travels on in this owner's metadata, so that a
    /// third owner skips them too.
    inherited: Ranges,
    /// (offset, Kafka timestamp in ms) of tracked records in offset order,
    /// from about the first unfinished one on: the partition's lag in
    /// seconds is the age of that record. Trimmed as the prefix finishes.
    times: std::collections::VecDeque<(i64, i64)>,
}

impl PartitionOffsets {
    pub fn new() -> PartitionOffsets {
        PartitionOffsets::default()
    }

    /// Notes what the partition's previous owners finished beyond the
    /// offset it is read from (`done`: ascending, disjoint ranges, from the
    /// commit's metadata and the handoff ledger, see [`super::ledger`]),
    /// and the offset the broker has committed for it, if any; returns how
    /// many offsets `done` names.
    pub fn inherit(&mut self, done: Ranges, committed: Option<i64>) -> u64 {
        self.inherited = done;
        if committed > self.committed {
            self.committed = committed;
        }
        self.inherited
            .iter()
            .map(|(lo, hi)| (hi - lo + 1) as u64)
            .sum()
    }

    /// Whether the previous owner finished the record at `offset`.
    pub fn inherited_done(&self, offset: i64) -> bool {
        let i = self.inherited.partition_point(|(_, hi)| *hi < offset);
        self.inherited.get(i).is_some_and(|(lo, _)| *lo <= offset)
    }

    /// Records that the worker took the record at `offset`.
    pub fn track(&mut self, offset: i64) -> Result<(), TrackError> {
        if offset < 0 {
            return Err(TrackError::Negative(offset));
        }
        if let Some(last) = self.last_tracked.filter(|&last| offset <= last) {
            return Err(TrackError::NotIncreasing { offset, last });
        }
        self.last_tracked = Some(offset);
        self.open.insert(offset, false);
        Ok(())
    }

    /// Whether the record at `offset` was taken here and is still held or
    /// finished: a delivery of it again is not new work.
    pub fn received(&self, offset: i64) -> bool {
        self.open.contains_key(&offset) || self.done_through.is_some_and(|d| offset <= d)
    }

    /// Records that the record at `offset` is finished.
    pub fn finish(&mut self, offset: i64) -> Finish {
        match self.open.get_mut(&offset) {
            Some(true) => return Finish::AlreadyFinished,
            Some(done) => {
                *done = true;
                self.finished_ahead += 1;
            }
            None if self.done_through.is_some_and(|d| offset <= d) => {
                return Finish::AlreadyFinished
            }
            None => return Finish::NotTracked,
        }
        // Advance the prefix past every finished entry at the front.
        while let Some(entry) = self.open.first_entry() {
            if !*entry.get() {
                break;
            }
            self.done_through = Some(*entry.key());
            entry.remove();
            self.finished_ahead -= 1;
        }
        Finish::Finished
    }

    /// The next offset to commit: one past the contiguous finished prefix;
    /// while the first tracked record is unfinished but later ones are
    /// finished, that first record's offset (so that [`metadata`] can name
    /// them); `None` while nothing is finished.
    ///
    /// [`metadata`]: Self::metadata
    pub fn committable(&self) -> Option<i64> {
        match self.done_through {
            // Everything received is finished: the commit also passes what
            // the previous owner finished next, received or not (the
            // offset committed is the one a third owner reads first, and
            // the metadata cannot name it).
            Some(done) if self.open.is_empty() => Some(self.past_inherited(done + 1)),
            Some(done) => Some(done + 1),
            None => self
                .open
                .values()
                .any(|done| *done)
                .then(|| self.open.keys().next().copied())
                .flatten(),
        }
    }

    /// The first offset from `at` on that no inherited range holds.
    fn past_inherited(&self, mut at: i64) -> i64 {
        loop {
            let i = self.inherited.partition_point(|(_, hi)| *hi < at);
            match self.inherited.get(i) {
                Some((lo, hi)) if *lo <= at => at = hi + 1,
                _ => return at,
            }
        }
    }

    /// [`committable`](Self::committable), or, while nothing is finished,
    /// the first tracked record's offset: where the partition starts for
    /// this group, committed to say the group has begun (a new install's
    /// first call, `Session::commit_start`). Never past an unfinished
    /// record.
    pub fn start(&self) -> Option<i64> {
        self.committable().or_else(|| self.lowest_unfinished())
    }

    /// [`committable`](Self::committable), but only if it or the
    /// [`metadata`](Self::metadata) changed since the last
    /// [`mark_committed`](Self::mark_committed): saves empty commits.
    pub fn uncommitted(&self) -> Option<i64> {
        self.committable()
            .filter(|&c| Some(c) > self.committed || self.metadata() != self.committed_metadata)
    }

    /// Notes that `offset` was committed with `metadata`. An answer that
    /// comes after a later commit's (offsets only grow) changes nothing.
    pub fn mark_committed(&mut self, offset: i64, metadata: &str) {
        if Some(offset) >= self.committed {
            self.committed = Some(offset);
            self.committed_metadata = metadata.to_owned();
        }
    }

    /// The finished records above the committable offset, for the commit's
    /// metadata: a new owner of the partition skips them instead of calling
    /// the downstream again. They are the finished records taken here, and
    /// what the previous owner finished above what this one has received
    /// (an owner that commits before it has read that far must not forget
    /// them). Only what fits in [`done_ranges::MAX_METADATA`] is named;
    /// the rest is redone (at-least-once either way).
    pub fn metadata(&self) -> String {
        let Some(base) = self.committable() else {
            return String::new();
        };
        let mut done = Ranges::new();
        for (&o, _) in self.open.iter().filter(|(_, d)| **d) {
            done_ranges::push(&mut done, o, o);
        }
        let unread = self.last_tracked.map_or(base, |l| l.max(base)) + 1;
        for &(lo, hi) in &self.inherited {
            if hi >= unread {
                done_ranges::push(&mut done, lo.max(unread), hi);
            }
        }
        done_ranges::encode(base, &done)
    }

    /// Tracked records not finished yet.
    pub fn unfinished(&self) -> usize {
        self.open.values().filter(|done| !**done).count()
    }

    /// Finished records above the first unfinished one: what a stuck head
    /// holds back from the commit.
    pub fn finished_ahead(&self) -> usize {
        self.finished_ahead
    }

    /// The lowest tracked offset that is not finished.
    pub fn lowest_unfinished(&self) -> Option<i64> {
        // By the invariant on `open`, that is its first key.
        self.open.keys().next().copied()
    }

    /// Notes the Kafka timestamp of the record at `offset` (just tracked).
    pub fn note_time(&mut self, offset: i64, timestamp_ms: i64) {
        self.trim_times();
        self.times.push_back((offset, timestamp_ms));
    }

    /// The Kafka timestamp of the first unfinished record, if any.
    pub fn oldest_unfinished_ms(&mut self) -> Option<i64> {
        self.trim_times();
        let low = self.lowest_unfinished()?;
        self.times
            .front()
            .filter(|(offset, _)| *offset == low)
            .map(|(_, ts)| *ts)
    }

    fn trim_times(&mut self) {
        let low = self.lowest_unfinished().unwrap_or(i64::MAX);
        while self.times.front().is_some_and(|(offset, _)| *offset < low) {
            self.times.pop_front();
        }
    }
}

/// One topic-partition and its next offset to commit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Commit {
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
    /// Finished offsets above `offset` (see [`PartitionOffsets::metadata`]).
    pub metadata: String,
    /// The last offset the broker accepted for the partition (this owner's
    /// commit, or the one it found at assignment), if any: the handoff
    /// ledger keeps it beside `offset` (see [`super::ledger`]).
    pub acked: Option<i64>,
}

/// Trackers for every assigned partition, keyed by topic then partition
/// (two levels so lookups borrow the topic instead of allocating a key).
#[derive(Debug, Clone, Default)]
pub struct Offsets {
    topics: HashMap<String, HashMap<i32, PartitionOffsets>>,
}

impl Offsets {
    pub fn new() -> Offsets {
        Offsets::default()
    }

    /// Tracks `offset`, creating the partition's tracker on first use.
    pub fn track(&mut self, topic: &str, partition: i32, offset: i64) -> Result<(), TrackError> {
        if !self.topics.contains_key(topic) {
            self.topics.insert(topic.to_owned(), HashMap::new());
        }
        // Cannot fail: the topic was inserted just above. (The entry API
        // would allocate a String key on every record.)
        let partitions = self.topics.get_mut(topic).expect("topic inserted above");
        partitions.entry(partition).or_default().track(offset)
    }

    /// See [`PartitionOffsets::inherit`].
    pub fn inherit(
        &mut self,
        topic: &str,
        partition: i32,
        done: Ranges,
        committed: Option<i64>,
    ) -> u64 {
        self.topics
            .entry(topic.to_owned())
            .or_default()
            .entry(partition)
            .or_default()
            .inherit(done, committed)
    }

    /// Whether the partition's previous owner finished `offset`.
    pub fn inherited_done(&self, topic: &str, partition: i32, offset: i64) -> bool {
        self.partition(topic, partition)
            .is_some_and(|p| p.inherited_done(offset))
    }

    /// See [`PartitionOffsets::received`].
    pub fn received(&self, topic: &str, partition: i32, offset: i64) -> bool {
        self.partition(topic, partition)
            .is_some_and(|p| p.received(offset))
    }

    pub fn finish(&mut self, topic: &str, partition: i32, offset: i64) -> Finish {
        self.partition_mut(topic, partition)
            .map_or(Finish::NotTracked, |p| p.finish(offset))
    }

    /// Each tracked partition's oldest unfinished record's timestamp (ms),
    /// `None` when everything taken is finished.
    pub fn oldest_unfinished_ms(&mut self) -> Vec<(&str, i32, Option<i64>)> {
        self.topics
            .iter_mut()
            .flat_map(|(topic, parts)| {
                parts
                    .iter_mut()
                    .map(move |(p, o)| (topic.as_str(), *p, o.oldest_unfinished_ms()))
            })
            .collect()
    }

    pub fn partition(&self, topic: &str, partition: i32) -> Option<&PartitionOffsets> {
        self.topics.get(topic)?.get(&partition)
    }

    pub fn partition_mut(&mut self, topic: &str, partition: i32) -> Option<&mut PartitionOffsets> {
        self.topics.get_mut(topic)?.get_mut(&partition)
    }

    /// Forgets a partition (revoked, or seeked): later finishes for it are
    /// [`Finish::NotTracked`]. Returns its tracker for a last commit.
    pub fn remove_partition(&mut self, topic: &str, partition: i32) -> Option<PartitionOffsets> {
        let partitions = self.topics.get_mut(topic)?;
        let removed = partitions.remove(&partition);
        if partitions.is_empty() {
            self.topics.remove(topic);
        }
        removed
    }

    /// Every partition whose committable offset moved since it was last
    /// marked committed.
    pub fn uncommitted(&self) -> Vec<Commit> {
        self.commits(PartitionOffsets::uncommitted)
    }

    /// Every partition with a record received: its committable offset, or
    /// its first record's ([`PartitionOffsets::start`]).
    pub fn starts(&self) -> Vec<Commit> {
        self.commits(PartitionOffsets::start)
    }

    /// Every partition with a committable offset, moved or not (for the
    /// synchronous commit on revoke and shutdown).
    pub fn committable(&self) -> Vec<Commit> {
        self.commits(PartitionOffsets::committable)
    }

    /// Marks each commit as done.
    pub fn mark_committed(&mut self, commits: &[Commit]) {
        for c in commits {
            if let Some(p) = self.partition_mut(&c.topic, c.partition) {
                p.mark_committed(c.offset, &c.metadata);
            }
        }
    }

    /// Every partition whose first unfinished record holds finished ones
    /// back: `(topic, partition, that record's offset, finished behind it)`.
    pub fn held_back(&self) -> Vec<(String, i32, i64, usize)> {
        self.topics
            .iter()
            .flat_map(|(topic, partitions)| {
                partitions.iter().filter_map(|(&partition, p)| {
                    let head = p.lowest_unfinished()?;
                    (p.finished_ahead() > 0)
                        .then(|| (topic.clone(), partition, head, p.finished_ahead()))
                })
            })
            .collect()
    }

    /// Unfinished records over all partitions.
    pub fn unfinished(&self) -> usize {
        self.topics
            .values()
            .flat_map(HashMap::values)
            .map(PartitionOffsets::unfinished)
            .sum()
    }

    /// A commit that moves nothing: the offset and metadata last committed
    /// for a partition (the first such, in order). A fenced consumer with
    /// nothing new to commit sends it to learn whether the coordinator
    /// still takes commits of its generation (issue 53).
    pub fn recommit(&self) -> Option<Commit> {
        let mut all: Vec<Commit> = self
            .topics
            .iter()
            .flat_map(|(topic, partitions)| {
                partitions.iter().filter_map(|(&partition, p)| {
                    p.committed.map(|offset| Commit {
                        topic: topic.clone(),
                        partition,
                        offset,
                        metadata: p.committed_metadata.clone(),
                        acked: Some(offset),
                    })
                })
            })
            .collect();
        all.sort_by(|a, b| (&a.topic, a.partition).cmp(&(&b.topic, b.partition)));
        all.into_iter().next()
    }

    fn commits(&self, pick: impl Fn(&PartitionOffsets) -> Option<i64>) -> Vec<Commit> {
        let mut out: Vec<Commit> = self
            .topics
            .iter()
            .flat_map(|(topic, partitions)| {
                partitions.iter().filter_map(|(&partition, p)| {
                    pick(p).map(|offset| Commit {
                        topic: topic.clone(),
                        partition,
                        offset,
                        metadata: p.metadata(),
                        acked: p.committed,
                    })
                })
            })
            .collect();
        // Stable order makes commits and logs reproducible.
        out.sort_by(|a, b| (&a.topic, a.partition).cmp(&(&b.topic, b.partition)));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::done_ranges::{decode, MAX_METADATA};
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn lag_in_time_is_the_age_of_the_first_unfinished_record() {
        let mut p = PartitionOffsets::new();
        for (off, ts) in [(10, 1_000), (11, 2_000), (12, 3_000)] {
            p.track(off).unwrap();
            p.note_time(off, ts);
        }
        assert_eq!(p.oldest_unfinished_ms(), Some(1_000));
        p.finish(11); // behind the head: the head is still the oldest
        assert_eq!(p.oldest_unfinished_ms(), Some(1_000));
        p.finish(10); // the prefix runs through 11; 12 is the head
        assert_eq!(p.oldest_unfinished_ms(), Some(3_000));
        p.finish(12);
        assert_eq!(p.oldest_unfinished_ms(), None, "nothing unfinished");
        assert!(
            p.times.is_empty(),
            "timestamps of finished records are dropped"
        );
        p.track(13).unwrap();
        p.note_time(13, 4_000);
        assert_eq!(p.oldest_unfinished_ms(), Some(4_000));
    }

    #[test]
    fn finished_ahead_counts_what_a_stuck_head_holds_back() {
        let mut o = Offsets::new();
        for off in 0..5 {
            o.track("t", 0, off).unwrap();
        }
        o.finish("t", 0, 2);
        o.finish("t", 0, 3);
        o.finish("t", 0, 3); // twice: counted once
        assert_eq!(o.held_back(), vec![("t".to_owned(), 0, 0, 2)]);
        o.finish("t", 0, 0); // 1 is now the head, 2 and 3 still behind it
        assert_eq!(o.held_back(), vec![("t".to_owned(), 0, 1, 2)]);
        o.finish("t", 0, 1); // the prefix runs through 3
        assert_eq!(o.held_back(), vec![]);
        assert_eq!(o.partition("t", 0).unwrap().finished_ahead(), 0);
        o.finish("t", 0, 4);
        assert_eq!(o.partition("t", 0).unwrap().committable(), Some(5));
    }

    #[test]
    fn scripted_steps() {
        // (row, action, offset, expected result, committable afterwards)
        #[derive(Debug)]
        enum Do {
            Track,
            Done(Finish),
        }
        use Do::*;
        let steps: Vec<(u32, Do, i64, Option<i64>)> = vec![
            (1, Track, 10, None),
            (2, Track, 11, None),
            (3, Track, 14, None), // gap: 12, 13 are markers or compacted away
            (4, Track, 15, None),
            (5, Done(Finish::Finished), 11, Some(10)), // out of order: 10 still open; 11 goes in the metadata
            (6, Done(Finish::Finished), 10, Some(12)),
            (7, Done(Finish::AlreadyFinished), 10, Some(12)),
            (8, Done(Finish::AlreadyFinished), 11, Some(12)),
            (9, Done(Finish::NotTracked), 12, Some(12)), // a gap offset
            (10, Done(Finish::Finished), 15, Some(12)),
            (11, Done(Finish::AlreadyFinished), 15, Some(12)),
            (12, Done(Finish::Finished), 14, Some(16)),
            (13, Done(Finish::NotTracked), 99, Some(16)),
        ];
        let mut p = PartitionOffsets::new();
        for (row, action, offset, want) in steps {
            match action {
                Track => assert_eq!(p.track(offset), Ok(()), "row {row}"),
                Done(want) => assert_eq!(p.finish(offset), want, "row {row}"),
            }
            assert_eq!(
                p.committable(),
                want,
                "row {row}: committable after {offset}"
            );
        }
        assert_eq!(p.unfinished(), 0);
    }

    #[test]
    fn track_rejects_rewinds_and_negatives() {
        let mut p = PartitionOffsets::new();
        p.track(5).unwrap();
        assert_eq!(
            p.track(5),
            Err(TrackError::NotIncreasing { offset: 5, last: 5 })
        );
        assert_eq!(
            p.track(3),
            Err(TrackError::NotIncreasing { offset: 3, last: 5 })
        );
        assert_eq!(p.track(-1), Err(TrackError::Negative(-1)));
        p.finish(5);
        assert_eq!(
            p.track(4),
            Err(TrackError::NotIncreasing { offset: 4, last: 5 }),
            "also after the prefix moved past it"
        );
    }

    #[test]
    fn uncommitted_only_reports_movement() {
        let mut p = PartitionOffsets::new();
        p.track(0).unwrap();
        p.track(1).unwrap();
        assert_eq!(p.uncommitted(), None);
        p.finish(0);
        assert_eq!(p.uncommitted(), Some(1));
        p.mark_committed(1, &p.metadata());
        assert_eq!(p.uncommitted(), None, "nothing moved since the commit");
        assert_eq!(
            p.committable(),
            Some(1),
            "but a forced commit still has an offset"
        );
        p.finish(1);
        assert_eq!(p.uncommitted(), Some(2));
    }

    #[test]
    fn finished_offsets_above_the_prefix_travel_in_the_metadata() {
        let mut p = PartitionOffsets::new();
        for o in 10..20 {
            p.track(o).unwrap();
        }
        assert_eq!(p.committable(), None, "nothing finished yet");
        for o in [12, 13, 14, 17] {
            p.finish(o);
        }
        // 10 is still waiting: commit at 10, and name 12-14 and 17.
        assert_eq!(p.committable(), Some(10));
        assert_eq!(decode(10, &p.metadata()), vec![(12, 14), (17, 17)]);
        p.finish(10);
        p.finish(11);
        assert_eq!(p.committable(), Some(15));
        assert_eq!(decode(15, &p.metadata()), vec![(17, 17)]);
        p.mark_committed(15, &p.metadata());
        assert_eq!(p.uncommitted(), None);
        p.finish(19);
        assert_eq!(p.uncommitted(), Some(15), "new metadata is worth a commit");
    }

    #[test]
    fn a_backlog_between_finished_records_fits_in_the_metadata() {
        // 20,000 records, every other one waiting (a backlogged seller's
        // jobs between light sellers' finished ones): the bitset names the
        // first 17,968 offsets' 8,984 finished records; text ranges (tw1)
        // named about 700.
        let mut p = PartitionOffsets::new();
        for o in 0..20_000 {
            p.track(o).unwrap();
        }
        for o in (1..20_000).step_by(2) {
            p.finish(o);
        }
        let m = p.metadata();
        assert!(m.len() <= MAX_METADATA, "{}", m.len());
        let ranges = decode(0, &m);
        assert!(ranges.len() >= 8_900, "{} ranges", ranges.len());
        assert!(ranges.iter().all(|(lo, hi)| lo % 2 == 1 && lo == hi));
    }

    /// Issue 33 (item 3): a partition's new owner that commits before it
    /// has read as far as what its previous owner finished must pass that
    /// on, or the owner after it calls those jobs again.
    #[test]
    fn what_the_previous_owner_finished_travels_on_until_it_is_read() {
        // The first owner took 100..=130, finished 101..=130 and committed
        // 100 with them in the metadata: 100 waits.
        let mut first = PartitionOffsets::new();
        for o in 100..=130 {
            first.track(o).unwrap();
        }
        for o in 101..=130 {
            first.finish(o);
        }
        assert_eq!(first.committable(), Some(100));
        let handed = first.metadata();

        // The second owner has received 100..=104 when it commits.
        let mut second = PartitionOffsets::new();
        assert_eq!(second.inherit(decode(100, &handed), Some(100)), 30);
        for o in 100..=104 {
            second.track(o).unwrap();
            if second.inherited_done(o) {
                second.finish(o);
            }
        }
        assert!(!second.inherited_done(100) && second.inherited_done(101));
        assert_eq!(second.committable(), Some(100));
        assert_eq!(
            decode(100, &second.metadata()),
            vec![(101, 130)],
            "101..=104 finished here, 105..=130 inherited and not read yet"
        );

        // 100 finishes: every record received is finished, and 105..=130
        // were finished by the first owner, so the commit passes them all.
        // (A commit at 105 would make the next owner call 105 again: the
        // metadata names only offsets above the commit.)
        second.finish(100);
        assert_eq!(second.committable(), Some(131));
        assert_eq!(second.metadata(), "");
        // Receiving them later moves nothing back.
        for o in 105..=130 {
            second.track(o).unwrap();
            assert!(second.inherited_done(o));
            second.finish(o);
            assert_eq!(second.committable(), Some(131));
        }
    }

    #[test]
    fn inherited_ranges_are_looked_up_exactly() {
        let mut p = PartitionOffsets::new();
        assert_eq!(p.inherit(vec![(12, 14), (20, 20)], Some(10)), 4);
        let done: Vec<i64> = (10..25).filter(|&o| p.inherited_done(o)).collect();
        assert_eq!(done, vec![12, 13, 14, 20]);
        assert_eq!(p.inherit(Vec::new(), Some(10)), 0);
        assert!(!p.inherited_done(12));
    }

    #[test]
    fn map_over_partitions() {
        let mut o = Offsets::new();
        o.track("jobs", 0, 0).unwrap();
        o.track("jobs", 0, 1).unwrap();
        o.track("jobs", 1, 7).unwrap();
        o.track("retry", 0, 3).unwrap();
        assert_eq!(o.unfinished(), 4);
        o.finish("jobs", 0, 0);
        o.finish("jobs", 1, 7);
        o.finish("retry", 0, 3);
        let c = |t: &str, p, off| Commit {
            topic: t.into(),
            partition: p,
            offset: off,
            metadata: String::new(),
            acked: None,
        };
        assert_eq!(
            o.uncommitted(),
            vec![c("jobs", 0, 1), c("jobs", 1, 8), c("retry", 0, 4)]
        );
        o.mark_committed(&o.uncommitted());
        assert_eq!(o.uncommitted(), vec![]);
        assert_eq!(o.committable().len(), 3);

        let removed = o
            .remove_partition("jobs", 0)
            .expect("partition 0 was tracked");
        assert_eq!(removed.unfinished(), 1, "offset 1 was still open");
        assert_eq!(
            o.finish("jobs", 0, 1),
            Finish::NotTracked,
            "a revoked partition ignores late finishes"
        );
        assert!(o.remove_partition("retry", 0).is_some());
        assert!(o.partition("retry", 0).is_none());
        assert!(o.remove_partition("nope", 0).is_none());
        assert_eq!(o.unfinished(), 0);
    }

    /// Offsets with random gaps, finished in a random order, some twice.
    fn scenario() -> impl Strategy<Value = (Vec<i64>, Vec<usize>)> {
        (0i64..1000, prop::collection::vec(1i64..4, 1..60)).prop_flat_map(|(start, gaps)| {
            let offsets: Vec<i64> = gaps
                .iter()
                .scan(start, |next, gap| {
                    let o = *next;
                    *next += gap;
                    Some(o)
                })
                .collect();
            let n = offsets.len();
            let order = (0..n).collect::<Vec<_>>();
            let dups = prop::collection::vec(0..n, 0..10);
            (Just(offsets), Just(order).prop_shuffle(), dups).prop_map(
                |(offsets, mut order, dups)| {
                    // Duplicates go after the original finish, like a retried ack.
                    for d in dups {
                        let at = order.iter().position(|&i| i == d).unwrap_or(0);
                        order.insert(at + 1, d);
                    }
                    (offsets, order)
                },
            )
        })
    }

    proptest! {
        #[test]
        fn committable_never_passes_an_unfinished_offset((offsets, order) in scenario()) {
            let mut p = PartitionOffsets::new();
            for &o in &offsets {
                p.track(o).unwrap();
            }
            let mut finished = vec![false; offsets.len()];
            let mut previous = None;
            for &i in &order {
                p.finish(offsets[i]);
                finished[i] = true;
                let c = p.committable();
                let lowest_open = offsets.iter().zip(&finished).find(|(_, f)| !**f).map(|(o, _)| *o);
                // The model: one past the last offset of the finished prefix.
                let prefix = finished.iter().take_while(|f| **f).count();
                let model = prefix.checked_sub(1).map(|last| offsets[last] + 1).or_else(|| {
                    // Nothing in the prefix yet, but something finished above
                    // it: commit at the first record, naming the rest in the metadata.
                    finished.iter().any(|f| *f).then(|| offsets[0])
                });
                prop_assert_eq!(c, model);
                if let (Some(c), Some(open)) = (c, lowest_open) {
                    prop_assert!(c <= open, "committable {} passes unfinished {}", c, open);
                }
                prop_assert!(c >= previous, "committable went back from {:?} to {:?}", previous, c);
                prop_assert_eq!(p.lowest_unfinished(), lowest_open);
                previous = c;
            }
            prop_assert_eq!(p.committable(), Some(offsets[offsets.len() - 1] + 1));
            prop_assert_eq!(p.unfinished(), 0);
        }
    }
}
