//! One librdkafka group consumer with manual offset commits. A worker runs
//! two (see [`super::group`]): one for the jobs topic and one for the retry
//! tiers, so that each is balanced over the replicas on its own.
//!
//! Every call into librdkafka that can block (polling, the rebalance
//! callbacks with their synchronous commit and committed-offset look-up, the
//! final commit) runs on one dedicated thread, never on the async runtime's
//! threads: a slow broker then delays only that thread, not the worker's
//! event loop. Records reach the worker through a small bounded channel;
//! commits are asked of the thread and acknowledged by the broker before
//! they count. The periodic commit does not wait for its answer (see
//! [`super::commits`]): a broker that holds it would stop the intake.
//!
//! Offsets are tracked here, next to the consumer, because the rebalance
//! callback runs inside the poll and must commit the finished prefix of
//! revoked partitions before they go. A record is tracked in the same poll
//! that receives it, so no rebalance can fall between the two.
//!
//! - `context`: [`WorkerContext`], the rebalance and statistics callbacks,
//!   and librdkafka as the session's broker port.
//! - `commits`: the periodic asynchronous commits, one in flight, whose
//!   answers the poll thread reads without waiting for them.
//! - `lists`: our partitions and commits as librdkafka's lists.
//! - `poll`: the poll thread, and the consumer's handle on it.

mod commits;
mod context;
mod lists;
mod poll;

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use rdkafka::config::ClientConfig;
use rdkafka::consumer::Consumer as _;
use rdkafka::error::KafkaError;
use rdkafka::Offset;
use tokio::sync::mpsc;

use crate::config::KafkaSettings;

use super::fence::Watch;
use super::ledger::Ledger;
use super::offsets::Finish;
pub use super::record::{HeldBack, Origin, PartitionEvent, Record, TopicPartition};
use super::session::Session;

pub use context::WorkerContext;

/// The consumer type, named once (here, so the commit queue and the
/// callbacks both read it from their parent).
pub type WorkerConsumer = rdkafka::consumer::BaseConsumer<WorkerContext>;
use lists::{partition_list, partitions_of};
use poll::PollThread;

/// Why the consumer failed.
#[derive(Debug, thiserror::Error)]
pub enum ConsumerError {
    #[error("could not create the Kafka consumer for brokers {brokers:?}: {source}")]
    Create { brokers: String, source: KafkaError },
    #[error("cannot read Kafka metadata from {brokers:?} (are the brokers reachable?): {source}")]
    Metadata { brokers: String, source: KafkaError },
    #[error("topic {topic:?} does not exist on {brokers:?} (or has no partitions): create it, or fix kafka.topic / kafka.retry_topic_prefix / kafka.dlq_topic")]
    MissingTopic { topic: String, brokers: String },
    #[error("could not subscribe to {topics:?}: {source}")]
    Subscribe {
        topics: Vec<String>,
        source: KafkaError,
    },
    #[error("offset commit failed: {0}")]
    Commit(KafkaError),
    #[error("the Kafka poll thread is not running (it stopped or was never started)")]
    Stopped,
    #[error("could not start the Kafka poll thread: {0}")]
    Spawn(std::io::Error),
}

type SharedSession = Arc<Session>;

/// Whether a record still belongs to the current assignment of its
/// partition; see [`Consumer::ownership`].
#[derive(Clone)]
pub struct Ownership(SharedSession);

impl Ownership {
    pub fn owns(&self, origin: &Origin) -> bool {
        self.0.owns(origin)
    }
}

/// How often librdkafka reports statistics (the lag metrics), unless
/// `statistics.interval.ms` is configured.
const DEFAULT_STATISTICS_INTERVAL_MS: &str = "5000";

/// Records received and not yet taken by the worker. Small: a pause stops
/// librdkafka's fetching, not what already sits here.
pub const RECORD_CHANNEL: usize = 16;

/// What a consumer reads. A worker runs one of each, in one group: a
/// member subscribes to one role's topics only, so the group's assignor
/// balances the jobs topic over the jobs consumers and the retry tiers over
/// the retry consumers, each on its own (one consumer of both could be
/// given only retry partitions by a cooperative assignor, which balances
/// the partition count over every subscribed topic together).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Jobs,
    Retries,
}

impl Role {
    /// The name in logs, and the suffix of the retry consumer's static
    /// member id (`group.instance.id` must differ between the two).
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Jobs => "jobs",
            Role::Retries => "retries",
        }
    }
}

/// The membership protocol a consumer runs when the config names none:
/// incremental cooperative rebalancing, which stops only the partitions that
/// move (eager `range` stops every partition of the group at every join and
/// leave, and the records in flight are done again by their next owner).
pub const DEFAULT_ASSIGNMENT_STRATEGY: &str = "cooperative-sticky";

/// `partition.assignment.strategy`, unless the config sets it or runs the
/// KIP-848 protocol (`group.protocol = consumer`, where the broker assigns
/// and librdkafka refuses the property).
fn default_strategy(config: &std::collections::BTreeMap<String, String>) -> Option<&'static str> {
    let kip848 = config
        .get("group.protocol")
        .is_some_and(|p| p.trim().eq_ignore_ascii_case("consumer"));
    (!kip848 && !config.contains_key("partition.assignment.strategy"))
        .then_some(DEFAULT_ASSIGNMENT_STRATEGY)
}

/// The session timeout unless set: librdkafka's default, and the broker's
/// under KIP-848 (`group.consumer.session.timeout.ms`). The heartbeat
/// interval is taken as at least KIP-848's default, 5 s, which covers the
/// classic protocol's 3 s too.
const DEFAULT_SESSION_TIMEOUT_MS: u64 = 45_000;
const DEFAULT_HEARTBEAT_INTERVAL_MS: u64 = 5_000;

/// How `role`'s consumer watches its session (issue 53): a poll thread
/// silent for longer than the session timeout less one heartbeat interval
/// may have been expired by the broker. The broker's settings rule under
/// KIP-848, where librdkafka refuses these properties: the defaults then.
fn watch_of(config: &std::collections::BTreeMap<String, String>, role: Role) -> Watch {
    let ms = |key: &str, default: u64| {
        config
            .get(key)
            .and_then(|v| v.trim().parse::<u64>().ok())
            .unwrap_or(default)
    };
    let session = ms("session.timeout.ms", DEFAULT_SESSION_TIMEOUT_MS);
    let heartbeat = ms("heartbeat.interval.ms", DEFAULT_HEARTBEAT_INTERVAL_MS)
        .max(DEFAULT_HEARTBEAT_INTERVAL_MS)
        .min(session / 2);
    Watch {
        consumer: role.as_str(),
        stall_after: Duration::from_millis(session - heartbeat),
        confirm_after: Duration::from_millis(session),
    }
}

/// The worker's consumer: records from the poll thread; pause, resume and
/// commits.
pub struct Consumer {
    inner: Arc<WorkerConsumer>,
    session: SharedSession,
    brokers: String,
    poll: PollThread,
}

impl Consumer {
    /// Creates the consumer of `role` (not yet subscribed). Partition events
    /// go to `events`. `kafka.properties` and `kafka.consumer_properties` are
    /// applied first; the settings the worker's guarantees depend on are
    /// forced after them. Commits are also written to `ledger`, if any. A
    /// revoke waits up to `revoke_wait` for the worker's work under way on
    /// the partitions going ([`PartitionEvent::Revoking`]).
    pub fn new(
        settings: &KafkaSettings,
        role: Role,
        events: mpsc::UnboundedSender<PartitionEvent>,
        ledger: Option<Arc<dyn Ledger>>,
        revoke_wait: Duration,
    ) -> Result<Consumer, ConsumerError> {
        let mut config = ClientConfig::new();
        config
            .set("auto.offset.reset", "earliest")
            // Lag metrics come from librdkafka's statistics.
            .set("statistics.interval.ms", DEFAULT_STATISTICS_INTERVAL_MS);
        let properties = settings.consumer_config();
        if let Some(strategy) = default_strategy(&properties) {
            config.set("partition.assignment.strategy", strategy);
        }
        for (k, v) in &properties {
            config.set(k, v);
        }
        config
            .set("bootstrap.servers", &settings.brokers)
            .set("group.id", &settings.group_id)
            // Offsets are committed only for finished records, by us.
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false");
        let instance = settings.group_instance_id.trim();
        match role {
            _ if instance.is_empty() => {}
            Role::Jobs => {
                config.set("group.instance.id", instance);
            }
            Role::Retries => {
                config.set("group.instance.id", format!("{instance}-retries"));
            }
        }
        let session = Arc::new(Session::new(ledger).watched(watch_of(&properties, role)));
        let context = WorkerContext::new(
            session.clone(),
            events,
            settings.group_id.clone(),
            role,
            revoke_wait,
        );
        let inner: WorkerConsumer =
            config
                .create_with_context(context)
                .map_err(|source| ConsumerError::Create {
                    brokers: settings.brokers.clone(),
                    source,
                })?;
        Ok(Consumer {
            inner: Arc::new(inner),
            session,
            brokers: settings.brokers.clone(),
            poll: PollThread::new(),
        })
    }

    /// Checks that every topic exists, so a typo stops startup with a
    /// message instead of a worker that silently consumes nothing; returns
    /// each topic's partition count, in order. Blocks.
    pub fn check_topics(
        &self,
        topics: &[&str],
        timeout: Duration,
    ) -> Result<Vec<usize>, ConsumerError> {
        let mut counts = Vec::with_capacity(topics.len());
        for topic in topics {
            let md = self
                .inner
                .fetch_metadata(Some(topic), timeout)
                .map_err(|source| ConsumerError::Metadata {
                    brokers: self.brokers.clone(),
                    source,
                })?;
            let found = md
                .topics()
                .iter()
                .find(|t| t.name() == *topic && t.error().is_none() && !t.partitions().is_empty());
            if let Some(t) = found {
                counts.push(t.partitions().len());
            } else {
                return Err(ConsumerError::MissingTopic {
                    topic: (*topic).to_owned(),
                    brokers: self.brokers.clone(),
                });
            }
        }
        Ok(counts)
    }

    pub fn subscribe(&self, topics: &[&str]) -> Result<(), ConsumerError> {
        self.inner
            .subscribe(topics)
            .map_err(|source| ConsumerError::Subscribe {
                topics: topics.iter().map(|t| (*t).to_owned()).collect(),
                source,
            })
    }

    /// Starts the poll thread, which delivers the records it receives into
    /// `tx` (two consumers share one), each already tracked as unfinished.
    /// Rebalance callbacks run on that thread. Call once.
    pub fn start(
        &self,
        tx: mpsc::Sender<Record>,
        ordering_header: Option<Arc<str>>,
    ) -> Result<(), ConsumerError> {
        self.poll.start(
            self.inner.clone(),
            self.session.clone(),
            tx,
            ordering_header,
        )
    }

    /// Asks the poll thread for a commit of every partition that moved since
    /// the last one; returns at once. Done, failed (counted and logged) and
    /// acknowledged by the broker on that thread.
    pub fn request_commit(&self) {
        self.poll.request_commit();
    }

    /// Commits every partition with a committable offset and waits for the
    /// broker's answer (at shutdown). Returns how many partitions were
    /// committed.
    pub async fn commit_all(&self) -> Result<usize, ConsumerError> {
        self.poll.commit_all().await
    }
    /// Commits where every partition with a record stands, nothing
    /// finished included, and waits for the broker's answer
    /// (`Session::commit_start`). Returns how many partitions were
    /// committed.
    pub async fn commit_start(&self) -> Result<usize, ConsumerError> {
        self.poll.commit_start().await
    }

    /// Stops the poll thread and waits for it. Blocks: call it off the async
    /// threads. Afterwards the consumer does not commit again, not even
    /// from inside librdkafka's close (which revokes every partition).
    pub fn shutdown(&self) {
        self.session.close();
        self.poll.stop();
    }

    /// See [`Tracker::finish`].
    pub fn finish(&self, origin: &Origin) -> Finish {
        self.session.finish(origin)
    }

    /// See [`Tracker::owns`].
    pub fn owns(&self, origin: &Origin) -> bool {
        self.session.owns(origin)
    }

    /// See [`Session::may_start`].
    pub fn may_start(&self, origin: &Origin) -> bool {
        self.session.may_start(origin)
    }

    /// See [`Session::fenced`].
    pub fn fenced(&self) -> bool {
        self.session.fenced(tokio::time::Instant::now())
    }

    /// A handle that answers [`Consumer::owns`] without holding the
    /// consumer, for tasks that may outlive it.
    pub fn ownership(&self) -> Ownership {
        Ownership(self.session.clone())
    }

    /// Partitions whose first unfinished record holds finished ones back
    /// from the commit: see [`Offsets::held_back`].
    pub fn held_back(&self) -> Vec<HeldBack> {
        self.session.held_back()
    }

    /// Records received and not finished, over all assigned partitions.
    pub fn unfinished(&self) -> usize {
        self.session.unfinished()
    }

    /// Stops fetching these partitions; already fetched records of them are
    /// discarded by librdkafka and fetched again on resume.
    pub fn pause(&self, parts: &[TopicPartition]) {
        if let Err(e) = self.inner.pause(&partition_list(parts)) {
            tracing::warn!(error = %e, "pause failed");
        }
    }

    pub fn resume(&self, parts: &[TopicPartition]) {
        if let Err(e) = self.inner.resume(&partition_list(parts)) {
            tracing::warn!(error = %e, "resume failed");
        }
    }

    /// The partitions assigned now.
    pub fn assignment(&self) -> Vec<TopicPartition> {
        self.inner
            .assignment()
            .map(|tpl| partitions_of(&tpl))
            .unwrap_or_default()
    }

    /// The committed offsets of `parts` as the broker has them (for tests and
    /// operators; the commit callback does not fire for async commits).
    pub fn committed(
        &self,
        parts: &[TopicPartition],
        timeout: Duration,
    ) -> Result<Vec<(TopicPartition, Option<i64>)>, ConsumerError> {
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
                (TopicPartition::new(e.topic(), e.partition()), off)
            })
            .collect())
    }
}

fn lock_opt<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Plain data (a handle or a receiver taken once): a panic elsewhere
    // cannot have left it half-written.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn props(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    /// Cooperative unless the config chooses: a strategy set by hand is
    /// kept, and under KIP-848 none is set (librdkafka refuses it there).
    #[test]
    fn the_assignment_strategy_defaults_to_cooperative_unless_the_config_chooses() {
        type Row<'a> = (&'a [(&'a str, &'a str)], Option<&'a str>);
        let rows: [Row; 4] = [
            (&[], Some("cooperative-sticky")),
            (&[("partition.assignment.strategy", "range")], None),
            (&[("group.protocol", "consumer")], None),
            (&[("group.protocol", "classic")], Some("cooperative-sticky")),
        ];
        for (i, (given, want)) in rows.into_iter().enumerate() {
            assert_eq!(default_strategy(&props(given)), want, "row {i}: {given:?}");
        }
    }

    /// The stall bound is the session timeout less a heartbeat interval
    /// (at least librdkafka's 5 s of KIP-848, at most half the session).
    #[test]
    fn a_stall_is_a_session_timeout_less_a_heartbeat() {
        type Row<'a> = (&'a [(&'a str, &'a str)], u64, u64);
        let rows: [Row; 4] = [
            (&[], 40_000, 45_000),
            (&[("session.timeout.ms", "6000")], 3_000, 6_000),
            (
                &[
                    ("session.timeout.ms", "30000"),
                    ("heartbeat.interval.ms", "10000"),
                ],
                20_000,
                30_000,
            ),
            (&[("session.timeout.ms", "oops")], 40_000, 45_000),
        ];
        for (i, (given, stall, confirm)) in rows.into_iter().enumerate() {
            let w = watch_of(&props(given), Role::Jobs);
            assert_eq!(
                (
                    w.stall_after.as_millis() as u64,
                    w.confirm_after.as_millis() as u64
                ),
                (stall, confirm),
                "row {i}: {given:?}"
            );
        }
    }
}
