//! The handoff ledger: beside every commit, what it says is finished, kept
//! where a rebalance cannot refuse it (pure, no rdkafka; the store behind
//! it is a port).
//!
//! A commit can be refused exactly when it matters most. Kafka refuses
//! commits between a rebalance's join and sync, and librdkafka's mock
//! broker for the whole rebalance; a fleet that scales keeps its group
//! rebalancing for seconds at a time. A partition handed over then reaches
//! its next owner with the last *accepted* commit, and every job finished
//! since is called again: measured, 57 to 157 of 480 jobs in two runs of
//! five (`worker::handoff::`).
//!
//! So each consumer also writes what it commits (the offset, the metadata
//! naming what is finished above it, and the last offset the broker
//! accepted) to a [`Ledger`], Redis in the worker, at every commit and
//! before the commit on revoke. The next owner reads both the broker's
//! commit and the ledger at assignment and skips what either names
//! ([`inherited`]). Finished is forever, so the union is safe; what the
//! ledger cannot reach (Redis down) leaves the broker's commit alone, as
//! before: at-least-once.
//!
//! One guard: a topic deleted and created again under the same name starts
//! its offsets at 0, and Kafka forgets the group's commits of it. A ledger
//! entry written after the broker had accepted a commit of the partition
//! is trusted only while the broker's commit is at least that one, so a
//! recreated topic's empty commit turns the stale entry away. An entry
//! whose writers never had a commit of the partition accepted cannot be
//! checked so: a topic deleted and created again within the ledger's life
//! (7 days after its last write), whose old partition never had a commit
//! accepted, would have records skipped. Delete the ledger key with the
//! topic (the book: docs/src/concepts/guarantees.md, "Failure modes").

use super::done_ranges::{self, Ranges};
use super::offsets::Commit;

/// What one partition's last owner wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// Every record below it is finished (the commit's offset).
    pub offset: i64,
    /// The last offset the broker accepted for the partition, as the
    /// writer knew it.
    pub acked: Option<i64>,
    /// The finished records above `offset` ([`done_ranges`]).
    pub metadata: String,
}

impl Entry {
    pub fn of(commit: &Commit) -> Entry {
        Entry {
            offset: commit.offset,
            acked: commit.acked,
            metadata: commit.metadata.clone(),
        }
    }

    /// `offset|acked|metadata`, `acked` empty when none.
    pub fn encode(&self) -> String {
        let acked = self.acked.map(|a| a.to_string()).unwrap_or_default();
        format!("{}|{acked}|{}", self.offset, self.metadata)
    }

    /// `None` for text this release did not write.
    pub fn decode(text: &str) -> Option<Entry> {
        let mut parts = text.splitn(3, '|');
        let offset = parts.next()?.parse().ok()?;
        let acked = match parts.next()? {
            "" => None,
            a => Some(a.parse().ok()?),
        };
        let metadata = parts.next()?.to_owned();
        Some(Entry {
            offset,
            acked,
            metadata,
        })
    }
}

/// A partition's ledger field: Kafka topic names have no `|`.
pub fn field(topic: &str, partition: i32) -> String {
    format!("{topic}|{partition}")
}

/// Why the ledger could not be read or written.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{0}")]
pub struct LedgerError(pub String);

/// Where a consumer's ledger lives. Called on the consumer's poll thread,
/// inside rebalance callbacks: an implementation bounds its own wait.
pub trait Ledger: Send + Sync {
    /// Records what `commits` say, replacing each partition's entry.
    fn write(&self, commits: &[Commit]) -> Result<(), LedgerError>;
    /// The entries of `partitions` (topic, partition), `None` where there
    /// is none.
    fn read(&self, partitions: &[(String, i32)]) -> Result<Vec<Option<Entry>>, LedgerError>;
}

/// What a partition's new owner may skip: the records that the broker's
/// commit (`committed`: its offset and metadata) or the ledger's `entry`
/// name as finished, beyond the committed offset (all of them, from offset
/// 0, when there is none: the consumer then reads from the start).
pub fn inherited(committed: Option<(i64, &str)>, entry: Option<&Entry>) -> Ranges {
    let from_commit = committed.map_or_else(Ranges::new, |(base, metadata)| {
        done_ranges::decode(base, metadata)
    });
    let kafka = committed.map(|(base, _)| base);
    let Some(entry) = entry.filter(|e| kafka >= e.acked) else {
        return from_commit;
    };
    // Below the entry's offset, everything is finished; what the broker's
    // commit already passes is never read again.
    let start = kafka.unwrap_or(0);
    let mut from_ledger = Ranges::new();
    if entry.offset > start {
        from_ledger.push((start, entry.offset - 1));
    }
    for (lo, hi) in done_ranges::decode(entry.offset, &entry.metadata) {
        if hi >= start {
            done_ranges::push(&mut from_ledger, lo.max(start), hi);
        }
    }
    done_ranges::union(&from_commit, &from_ledger)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(offset: i64, acked: Option<i64>, done: &[(i64, i64)]) -> Entry {
        Entry {
            offset,
            acked,
            metadata: done_ranges::encode(offset, done),
        }
    }

    #[test]
    fn entries_read_back_as_written() {
        for e in [entry(120, Some(100), &[(125, 130)]), entry(7, None, &[])] {
            assert_eq!(Entry::decode(&e.encode()), Some(e));
        }
        assert_eq!(Entry::decode("garbage"), None);
        assert_eq!(Entry::decode("1|x|"), None);
    }

    #[test]
    fn the_ledger_passes_a_refused_commit_on() {
        // The broker accepted 100; the owner then finished 100..=119 and
        // 125..=130, but its commit of 120 was refused.
        let e = entry(120, Some(100), &[(125, 130)]);
        let meta = done_ranges::encode(100, &[(110, 112)]);
        assert_eq!(
            inherited(Some((100, &meta)), Some(&e)),
            vec![(100, 119), (125, 130)]
        );
        // No commit ever accepted, none written: from the start.
        let e = entry(40, None, &[(45, 45)]);
        assert_eq!(inherited(None, Some(&e)), vec![(0, 39), (45, 45)]);
    }

    #[test]
    fn the_broker_s_commit_alone_when_the_ledger_has_nothing() {
        let meta = done_ranges::encode(100, &[(110, 112)]);
        assert_eq!(inherited(Some((100, &meta)), None), vec![(110, 112)]);
        assert_eq!(inherited(None, None), Vec::<(i64, i64)>::new());
    }

    #[test]
    fn an_entry_older_than_the_broker_s_commit_adds_only_what_is_finished() {
        // The ledger's writer knew 50 accepted and wrote 60; a later owner
        // got 200 accepted and its ledger write was lost (Redis down).
        let e = entry(60, Some(50), &[(70, 80), (250, 260)]);
        assert_eq!(inherited(Some((200, "")), Some(&e)), vec![(250, 260)]);
    }

    #[test]
    fn a_recreated_topic_turns_a_stale_entry_away() {
        // The entry was written after the broker had accepted 5,000; the
        // topic was deleted and created again, and Kafka forgot the commit.
        let e = entry(6_000, Some(5_000), &[]);
        assert!(inherited(None, Some(&e)).is_empty());
        // Or the new topic's partition has a commit of its own, lower.
        assert!(inherited(Some((30, "")), Some(&e)).is_empty());
    }
}
