//! The consumer side: one librdkafka consumer per worker, subscribed to the
//! jobs topic and the retry topic, with manual offset commits.
//!
//! Offsets are tracked here, next to the consumer, because the rebalance
//! callback runs inside the consumer's poll and must commit the finished
//! prefix of revoked partitions synchronously, without waiting for the
//! worker's task (which is the one polling). A record is tracked in the same
//! call that receives it, so no rebalance can fall between the two.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{
    BaseConsumer, CommitMode, Consumer as _, ConsumerContext, Rebalance, StreamConsumer,
};
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::{ClientContext, Offset, TopicPartitionList};
use tokio::sync::mpsc;

use crate::config::KafkaSettings;

use super::offsets::{decode_done, Commit, Finish, Offsets};
use super::producer::{header_pairs, HeaderError, OriginalRecord, RetryHeaders};

/// A topic-partition.
pub type Partition = (Arc<str>, i32);

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
}

/// Partition changes the worker must act on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PartitionEvent {
    Assigned(Vec<Partition>),
    /// Finished offsets were already committed; records of these partitions
    /// still waiting in memory are to be dropped, uncommitted, so that the
    /// new owner gets them.
    Revoked(Vec<Partition>),
}

/// Why the consumer failed.
#[derive(Debug, thiserror::Error)]
pub enum ConsumerError {
    #[error("could not create the Kafka consumer for brokers {brokers:?}: {source}")]
    Create { brokers: String, source: KafkaError },
    #[error("cannot read Kafka metadata from {brokers:?} (are the brokers reachable?): {source}")]
    Metadata { brokers: String, source: KafkaError },
    #[error("topic {topic:?} does not exist on {brokers:?} (or has no partitions): create it, or fix kafka.topic / kafka.retry_topic / kafka.dlq_topic")]
    MissingTopic { topic: String, brokers: String },
    #[error("could not subscribe to {topics:?}: {source}")]
    Subscribe {
        topics: Vec<String>,
        source: KafkaError,
    },
    #[error("Kafka consumer error: {0}")]
    Receive(KafkaError),
    #[error("offset commit failed: {0}")]
    Commit(KafkaError),
}

/// The offsets of every assigned partition, shared by the worker and the
/// rebalance callback.
#[derive(Debug, Default)]
pub struct Tracker {
    offsets: Offsets,
    /// Bumped at every assignment and revocation of a partition.
    generations: HashMap<(String, i32), u64>,
    /// Offset ranges (inclusive) a previous owner finished above its
    /// committed offset, read from the commit's metadata at assignment:
    /// their records are finished on receipt, not processed again.
    already_done: HashMap<(String, i32), DoneRanges>,
}

/// Inclusive offset ranges already finished.
type DoneRanges = Vec<(i64, i64)>;

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

    /// Whether `origin` belongs to the current assignment of its partition.
    pub fn is_current(&self, origin: &Origin) -> bool {
        self.generation(&origin.topic, origin.partition) == origin.generation
    }

    /// Marks a record finished (done, dead-lettered, or acknowledged on the
    /// retry topic). Records of a revoked assignment are ignored.
    pub fn finish(&mut self, origin: &Origin) -> Finish {
        if !self.is_current(origin) {
            return Finish::NotTracked;
        }
        self.offsets
            .finish(&origin.topic, origin.partition, origin.offset)
    }

    /// Records received and not yet finished.
    pub fn unfinished(&self) -> usize {
        self.offsets.unfinished()
    }

    fn was_done(&self, topic: &str, partition: i32, offset: i64) -> bool {
        self.already_done
            .get(&(topic.to_owned(), partition))
            .is_some_and(|r| r.iter().any(|(lo, hi)| (*lo..=*hi).contains(&offset)))
    }
}

/// The finished ranges the partitions' previous owners committed in their
/// metadata. A failed look-up only means those records are redone.
fn already_done(
    consumer: &BaseConsumer<WorkerContext>,
    tpl: &TopicPartitionList,
) -> Vec<((String, i32), DoneRanges)> {
    let committed = match consumer.committed_offsets(tpl.clone(), COMMITTED_TIMEOUT) {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!(error = %e, "cannot read committed metadata; records finished past the committed offsets will be redone");
            return Vec::new();
        }
    };
    committed
        .elements()
        .iter()
        .filter_map(|e| match e.offset() {
            Offset::Offset(base) => {
                let ranges = decode_done(base, e.metadata());
                (!ranges.is_empty()).then(|| ((e.topic().to_owned(), e.partition()), ranges))
            }
            _ => None,
        })
        .collect()
}

/// How long an assignment waits to read the committed metadata.
const COMMITTED_TIMEOUT: Duration = Duration::from_secs(5);

type SharedTracker = Arc<Mutex<Tracker>>;

fn lock(t: &SharedTracker) -> MutexGuard<'_, Tracker> {
    // The tracker holds plain data; a panic while it was held cannot have
    // left it in a state worse than "some offsets not finished", which only
    // means a later redelivery.
    t.lock().unwrap_or_else(|p| p.into_inner())
}

/// Runs on the consumer's poll: commits and forgets revoked partitions,
/// and tells the worker.
pub struct WorkerContext {
    tracker: SharedTracker,
    events: mpsc::UnboundedSender<PartitionEvent>,
    /// Set once the worker has made its final synchronous commit. Closing
    /// the consumer revokes every partition from inside librdkafka's close,
    /// where a synchronous commit would wait forever for a reply the closing
    /// consumer no longer serves.
    closing: std::sync::atomic::AtomicBool,
}

impl ClientContext for WorkerContext {}

impl ConsumerContext for WorkerContext {
    fn pre_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        let Rebalance::Revoke(tpl) = rebalance else {
            return;
        };
        let revoked = partitions_of(tpl);
        tracing::info!(partitions = %describe(&revoked), "partitions revoked");
        let closing = self.closing.load(std::sync::atomic::Ordering::Acquire);
        let mut tracker = lock(&self.tracker);
        let commits: Vec<Commit> = tracker
            .offsets
            .committable()
            .into_iter()
            .filter(|c| {
                revoked
                    .iter()
                    .any(|(t, p)| **t == *c.topic && *p == c.partition)
            })
            .collect();
        if !commits.is_empty() && !closing {
            match consumer.commit(&commit_list(&commits), CommitMode::Sync) {
                Ok(()) => tracing::info!(
                    partitions = commits.len(),
                    "committed finished offsets of revoked partitions"
                ),
                Err(e) => {
                    tracing::warn!(error = %e, "commit on revoke failed; the new owner will redo the uncommitted records")
                }
            }
        }
        for (topic, partition) in &revoked {
            tracker.offsets.remove_partition(topic, *partition);
            tracker.bump(topic, *partition);
        }
        drop(tracker);
        // The worker may already be gone at shutdown; nothing to tell then.
        let _ = self.events.send(PartitionEvent::Revoked(revoked));
    }

    fn post_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        match rebalance {
            Rebalance::Assign(tpl) => {
                let assigned = partitions_of(tpl);
                tracing::info!(partitions = %describe(&assigned), "partitions assigned");
                let done = already_done(consumer, tpl);
                let mut tracker = lock(&self.tracker);
                for (topic, partition) in &assigned {
                    tracker.offsets.remove_partition(topic, *partition);
                    tracker.bump(topic, *partition);
                    tracker
                        .already_done
                        .remove(&(topic.to_string(), *partition));
                }
                for (key, ranges) in done {
                    tracker.already_done.insert(key, ranges);
                }
                drop(tracker);
                let _ = self.events.send(PartitionEvent::Assigned(assigned));
            }
            Rebalance::Error(e) => tracing::warn!(error = %e, "rebalance error"),
            Rebalance::Revoke(_) => {}
        }
    }
}

/// The consumer type, named once.
pub type WorkerConsumer = StreamConsumer<WorkerContext>;

/// The worker's consumer: receive, pause, resume, commit.
pub struct Consumer {
    inner: WorkerConsumer,
    tracker: SharedTracker,
    brokers: String,
}

impl Consumer {
    /// Creates the consumer (not yet subscribed). Partition events go to
    /// `events`. `kafka.properties` are applied first; the settings the
    /// worker's guarantees depend on are forced after them.
    pub fn new(
        settings: &KafkaSettings,
        events: mpsc::UnboundedSender<PartitionEvent>,
    ) -> Result<Consumer, ConsumerError> {
        let mut config = ClientConfig::new();
        config.set("auto.offset.reset", "earliest");
        for (k, v) in &settings.properties {
            config.set(k, v);
        }
        config
            .set("bootstrap.servers", &settings.brokers)
            .set("group.id", &settings.group_id)
            // Offsets are committed only for finished records, by us.
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false");
        let tracker: SharedTracker = Arc::default();
        let context = WorkerContext {
            tracker: tracker.clone(),
            events,
            closing: std::sync::atomic::AtomicBool::new(false),
        };
        let inner: WorkerConsumer =
            config
                .create_with_context(context)
                .map_err(|source| ConsumerError::Create {
                    brokers: settings.brokers.clone(),
                    source,
                })?;
        Ok(Consumer {
            inner,
            tracker,
            brokers: settings.brokers.clone(),
        })
    }

    /// Checks that every topic exists, so a typo stops startup with a
    /// message instead of a worker that silently consumes nothing.
    pub fn check_topics(&self, topics: &[&str], timeout: Duration) -> Result<(), ConsumerError> {
        for topic in topics {
            let md = self
                .inner
                .fetch_metadata(Some(topic), timeout)
                .map_err(|source| ConsumerError::Metadata {
                    brokers: self.brokers.clone(),
                    source,
                })?;
            let ok = md
                .topics()
                .iter()
                .any(|t| t.name() == *topic && t.error().is_none() && !t.partitions().is_empty());
            if !ok {
                return Err(ConsumerError::MissingTopic {
                    topic: (*topic).to_owned(),
                    brokers: self.brokers.clone(),
                });
            }
        }
        Ok(())
    }

    pub fn subscribe(&self, topics: &[&str]) -> Result<(), ConsumerError> {
        self.inner
            .subscribe(topics)
            .map_err(|source| ConsumerError::Subscribe {
                topics: topics.iter().map(|t| (*t).to_owned()).collect(),
                source,
            })
    }

    /// The next record, already tracked as unfinished. Rebalance callbacks
    /// run inside this call.
    pub async fn recv(&self) -> Result<Record, ConsumerError> {
        loop {
            let msg = self.inner.recv().await.map_err(ConsumerError::Receive)?;
            let topic: Arc<str> = Arc::from(msg.topic());
            let (partition, offset) = (msg.partition(), msg.offset());
            let generation = {
                let mut tracker = lock(&self.tracker);
                if let Err(e) = tracker.offsets.track(&topic, partition, offset) {
                    // Offsets only go backwards after a seek we never make; the
                    // record is still processed, its offset simply not tracked.
                    tracing::warn!(error = %e, topic = &*topic, partition, offset, "offset not tracked");
                }
                if tracker.was_done(&topic, partition, offset) {
                    // Finished by the partition's previous owner after its
                    // committed offset: done, not done again.
                    tracker.offsets.finish(&topic, partition, offset);
                    crate::telemetry::events::AlreadyDone { offset }.emit();
                    continue;
                }
                tracker.generation(&topic, partition)
            };
            return Ok(self.record(&msg, topic, generation));
        }
    }

    fn record(&self, msg: &impl Message, topic: Arc<str>, generation: u64) -> Record {
        let (partition, offset) = (msg.partition(), msg.offset());
        let headers = match msg.headers() {
            Some(h) => RetryHeaders::from_headers(header_pairs(h)),
            None => Ok(RetryHeaders::default()),
        };
        Record {
            origin: Origin {
                topic,
                partition,
                offset,
                generation,
            },
            original: OriginalRecord::from_message(msg),
            headers,
        }
    }

    /// See [`Tracker::finish`].
    pub fn finish(&self, origin: &Origin) -> Finish {
        lock(&self.tracker).finish(origin)
    }

    /// See [`Tracker::is_current`].
    pub fn is_current(&self, origin: &Origin) -> bool {
        lock(&self.tracker).is_current(origin)
    }

    /// Records received and not finished, over all assigned partitions.
    pub fn unfinished(&self) -> usize {
        lock(&self.tracker).unfinished()
    }

    /// Stops fetching these partitions; already fetched records of them are
    /// discarded by librdkafka and fetched again on resume.
    pub fn pause(&self, parts: &[Partition]) {
        if let Err(e) = self.inner.pause(&partition_list(parts)) {
            tracing::warn!(error = %e, "pause failed");
        }
    }

    pub fn resume(&self, parts: &[Partition]) {
        if let Err(e) = self.inner.resume(&partition_list(parts)) {
            tracing::warn!(error = %e, "resume failed");
        }
    }

    /// The partitions assigned now.
    pub fn assignment(&self) -> Vec<Partition> {
        self.inner
            .assignment()
            .map(|tpl| partitions_of(&tpl))
            .unwrap_or_default()
    }

    /// Commits the finished prefix of every partition that moved since the
    /// last commit (`sync`: every partition with a committable offset, and
    /// wait for the broker). Returns how many partitions were committed.
    pub fn commit(&self, sync: bool) -> Result<usize, ConsumerError> {
        let commits = {
            let tracker = lock(&self.tracker);
            if sync {
                tracker.offsets.committable()
            } else {
                tracker.offsets.uncommitted()
            }
        };
        if commits.is_empty() {
            return Ok(0);
        }
        let mode = if sync {
            CommitMode::Sync
        } else {
            CommitMode::Async
        };
        self.inner
            .commit(&commit_list(&commits), mode)
            .map_err(ConsumerError::Commit)?;
        lock(&self.tracker).offsets.mark_committed(&commits);
        Ok(commits.len())
    }

    /// The committed offsets of `parts` as the broker has them (for tests and
    /// operators; the commit callback does not fire for async commits).
    pub fn committed(
        &self,
        parts: &[Partition],
        timeout: Duration,
    ) -> Result<Vec<(Partition, Option<i64>)>, ConsumerError> {
        let tpl = self
            .inner
            .committed_offsets(partition_list(parts), timeout)
            .map_err(ConsumerError::Commit)?;
        Ok(tpl
            .elements()
            .iter()
            .map(|e| {
                let off = match e.offset() {
                    Offset::Offset(o) => Some(o),
                    _ => None,
                };
                ((Arc::from(e.topic()), e.partition()), off)
            })
            .collect())
    }

    /// After the final synchronous commit: closing (dropping) the consumer
    /// must not commit again from inside librdkafka's close.
    pub fn mark_closing(&self) {
        self.inner
            .context()
            .closing
            .store(true, std::sync::atomic::Ordering::Release);
    }
}

fn partitions_of(tpl: &TopicPartitionList) -> Vec<Partition> {
    tpl.elements()
        .iter()
        .map(|e| (Arc::from(e.topic()), e.partition()))
        .collect()
}

/// `topic[0],topic[3]`: one log field an operator (or a test) can read back.
fn describe(parts: &[Partition]) -> String {
    parts
        .iter()
        .map(|(t, p)| format!("{t}[{p}]"))
        .collect::<Vec<_>>()
        .join(",")
}

fn partition_list(parts: &[Partition]) -> TopicPartitionList {
    let mut tpl = TopicPartitionList::with_capacity(parts.len());
    for (topic, partition) in parts {
        tpl.add_partition(topic, *partition);
    }
    tpl
}

fn commit_list(commits: &[Commit]) -> TopicPartitionList {
    let mut tpl = TopicPartitionList::with_capacity(commits.len());
    for c in commits {
        // Cannot fail for a partition just added: set_partition_offset only
        // errs when the partition is missing from the list.
        let mut elem = tpl.add_partition(&c.topic, c.partition);
        let _ = elem.set_offset(Offset::Offset(c.offset));
        elem.set_metadata(c.metadata.as_str());
    }
    tpl
}
