//! What a consumer hands the worker: records with their origin, partition
//! events, and the partitions whose commit a waiting record holds back.
//! Plain data, no rdkafka: the engine, the session's bookkeeping
//! ([`super::session`]) and the simulation share them.

use std::sync::Arc;

use super::producer::{HeaderError, OriginalRecord, RetryHeaders};

/// A topic-partition.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TopicPartition {
    pub topic: Arc<str>,
    pub partition: i32,
}

impl TopicPartition {
    pub fn new(topic: impl Into<Arc<str>>, partition: i32) -> TopicPartition {
        TopicPartition {
            topic: topic.into(),
            partition,
        }
    }
}

/// Where a record came from, and in which assignment of its partition: a
/// record from an earlier assignment (revoked since) must not move offsets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Origin {
    pub topic: Arc<str>,
    pub partition: i32,
    pub offset: i64,
    pub generation: u64,
}

/// One consumed record, owned.
#[derive(Debug)]
pub struct Record {
    pub origin: Origin,
    /// The value (byte for byte), key and source position, for dead letters
    /// and retry-topic copies.
    pub original: OriginalRecord,
    /// The worker's own headers (`x-not-before`, `x-attempts`, …), or why
    /// they are unreadable.
    pub headers: Result<RetryHeaders, HeaderError>,
    /// The value of the header the ordering key is read from
    /// (`worker.ordering_key = "header:<name>"`), when the record has it.
    pub ordering_header: Option<Vec<u8>>,
}

/// A partition's first unfinished record and how many finished records
/// behind it wait to be committed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldBack {
    pub partition: TopicPartition,
    pub offset: i64,
    pub finished_behind: usize,
}

/// The worker's word to a revoke that waits: the revoking partitions'
/// work under way has ended, so their finished prefix is final and may be
/// committed. Dropped unsent (the worker gone), it reads as given.
#[derive(Debug)]
pub struct Quiet(std::sync::mpsc::SyncSender<()>);

impl Quiet {
    /// A signal, and the receiver the revoke waits on.
    pub fn new() -> (Quiet, std::sync::mpsc::Receiver<()>) {
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        (Quiet(tx), rx)
    }

    /// Tells the revoke to go on.
    pub fn signal(self) {
        // The revoke may have stopped waiting (its bound passed): nothing
        // to tell then.
        let _ = self.0.try_send(());
    }
}

/// Partition changes the worker must act on.
#[derive(Debug)]
pub enum PartitionEvent {
    Assigned(Vec<TopicPartition>),
    /// These partitions are being revoked and still belong here: they start
    /// no new work (no call, no retry write, no paced call), what waits of
    /// them is dropped for the next owner, and the work under way finishes.
    /// The worker signals `quiet` once none is left; the revoke then
    /// commits (within its bound, `worker.revoke_wait`, whatever happens)
    /// and [`PartitionEvent::Revoked`] follows.
    Revoking {
        parts: Vec<TopicPartition>,
        quiet: Quiet,
    },
    /// Finished offsets were already committed; records of these partitions
    /// still waiting in memory are to be dropped, uncommitted, so that the
    /// new owner gets them.
    Revoked(Vec<TopicPartition>),
}
