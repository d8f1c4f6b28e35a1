//! librdkafka's side of the session: [`WorkerContext`], whose callbacks
//! librdkafka runs inside the poll (the rebalances, which commit and
//! forget revoked partitions and tell the worker; the statistics, which
//! give the lag metrics), and `Broker`, librdkafka as the session's
//! [`Coordinator`] and [`AsyncCommits`].

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer as _, ConsumerContext, Rebalance};
use rdkafka::error::KafkaError;
use rdkafka::statistics::Statistics;
use rdkafka::{ClientContext, Offset};
use tokio::sync::mpsc;

use super::commits::CommitQueue;
use crate::kafka::offsets::Commit;
use crate::kafka::record::{PartitionEvent, Quiet, TopicPartition};
use crate::kafka::session::{AsyncCommits, Coordinator};

use super::lists::{commit_list, partition_list, partitions_of};
use super::{lock_opt, Role, SharedSession, WorkerConsumer};
use crate::telemetry::events::{PartitionsRevoked, Waited};

/// How long an assignment waits to read the committed metadata.
const COMMITTED_TIMEOUT: Duration = Duration::from_secs(5);

/// librdkafka as the session's [`Coordinator`], inside a rebalance
/// callback and on the poll thread; with the commit queue, also its
/// [`AsyncCommits`].
pub(super) struct Broker<'a> {
    consumer: &'a WorkerConsumer,
    answers: Option<&'a CommitQueue>,
}

impl<'a> Broker<'a> {
    /// Inside a rebalance callback: every commit waits for the broker.
    fn in_callback(consumer: &'a WorkerConsumer) -> Broker<'a> {
        Broker {
            consumer,
            answers: None,
        }
    }

    /// On the poll thread, whose periodic commits' answers arrive in
    /// `answers`.
    pub(super) fn on_poll_thread(
        consumer: &'a WorkerConsumer,
        answers: &'a CommitQueue,
    ) -> Broker<'a> {
        Broker {
            consumer,
            answers: Some(answers),
        }
    }
}

impl Coordinator for Broker<'_> {
    type Error = KafkaError;

    fn commit_sync(&self, commits: &[Commit]) -> Result<(), KafkaError> {
        self.consumer
            .commit(&commit_list(commits), CommitMode::Sync)
    }

    fn committed(
        &self,
        parts: &[TopicPartition],
    ) -> Result<Vec<Option<(i64, String)>>, KafkaError> {
        let tpl = self
            .consumer
            .committed_offsets(partition_list(parts), COMMITTED_TIMEOUT)?;
        let found: HashMap<(String, i32), (i64, String)> = tpl
            .elements()
            .iter()
            .filter_map(|e| match e.offset() {
                Offset::Offset(base) => Some((
                    (e.topic().to_owned(), e.partition()),
                    (base, e.metadata().to_owned()),
                )),
                _ => None,
            })
            .collect();
        Ok(parts
            .iter()
            .map(|tp| found.get(&(tp.topic.to_string(), tp.partition)).cloned())
            .collect())
    }
}

impl AsyncCommits for Broker<'_> {
    fn send(&self, commits: &[Commit]) -> Result<(), KafkaError> {
        match self.answers {
            Some(queue) => queue.send(&commit_list(commits)),
            // Only the poll thread sends periodic commits, and it has the
            // queue; a callback that asked would wait instead.
            None => self.commit_sync(commits),
        }
    }
}

/// Runs on the consumer's poll: commits and forgets revoked partitions,
/// and tells the worker.
pub struct WorkerContext {
    session: SharedSession,
    events: mpsc::UnboundedSender<PartitionEvent>,
    /// The longest a revoke waits for its partitions' work under way
    /// (`worker.revoke_wait`): below `max.poll.interval.ms`, which this
    /// wait, on the poll thread, holds the next poll back.
    revoke_wait: Duration,
    /// The consumer group, for the lag metrics' `group` label.
    group: String,
    role: Role,
    /// The partitions of the last lag report (so that the next drops the
    /// revoked ones' series, and only those).
    reported: Mutex<Vec<(String, i32)>>,
}

impl WorkerContext {
    pub(super) fn new(
        session: SharedSession,
        events: mpsc::UnboundedSender<PartitionEvent>,
        group: String,
        role: Role,
        revoke_wait: Duration,
    ) -> WorkerContext {
        WorkerContext {
            session,
            events,
            revoke_wait,
            group,
            role,
            reported: Mutex::default(),
        }
    }

    /// What this consumer reads.
    pub(super) fn role(&self) -> Role {
        self.role
    }
}

impl ClientContext for WorkerContext {
    /// librdkafka's statistics (every `statistics.interval.ms`, on the poll
    /// thread): the consumer lag of each assigned partition in messages
    /// (high watermark minus committed offset, as kafka-lag-exporter and
    /// kminion count it), and in seconds from the tracker (the age of the
    /// first record taken but not finished).
    fn stats(&self, stats: Statistics) {
        let now_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as i64);
        let ages = self.session.unfinished_ages(now_ms);
        let mut partitions = Vec::new();
        for (topic, t) in &stats.topics {
            for (p, part) in &t.partitions {
                // -1 is librdkafka's internal "unassigned" partition; a
                // partition this consumer does not fetch has no lag here.
                if *p < 0 || !part.desired || part.consumer_lag < 0 {
                    continue;
                }
                let age = ages.get(&(topic.clone(), *p)).copied().unwrap_or(0.0);
                partitions.push((topic.as_str(), *p, part.consumer_lag, age));
            }
        }
        // This consumer's partitions reported last time and not now.
        let mut reported = lock_opt(&self.reported);
        let now: Vec<(String, i32)> = partitions
            .iter()
            .map(|(t, p, _, _)| ((*t).to_owned(), *p))
            .collect();
        let gone: Vec<(&str, i32)> = reported
            .iter()
            .filter(|tp| !now.contains(tp))
            .map(|(t, p)| (t.as_str(), *p))
            .collect();
        crate::telemetry::events::ConsumerLag {
            group: &self.group,
            partitions: &partitions,
            gone: &gone,
        }
        .emit();
        drop(gone);
        *reported = now;
    }
}

impl WorkerContext {
    /// The first step of a revoke (vector's `KafkaSourceContext::pre_rebalance`
    /// waits so too): the partitions start no new work, and the worker
    /// finishes what is under way and says so, within `revoke_wait`. Blocks
    /// the poll thread meanwhile, which is what holds the rebalance: the
    /// other members wait at most that long for this one. Returns how the
    /// wait ended.
    fn wait_for_work(&self, revoked: &[TopicPartition]) -> Waited {
        self.session.begin_revoke(revoked);
        let (quiet, rx) = Quiet::new();
        let event = PartitionEvent::Revoking {
            parts: revoked.to_vec(),
            quiet,
        };
        if self.events.send(event).is_err() {
            // The worker is gone (shutdown): nothing is under way.
            return Waited::Quiet;
        }
        match rx.recv_timeout(self.revoke_wait) {
            // Disconnected: the worker dropped the signal (it stopped).
            Ok(()) | Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => Waited::Quiet,
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => Waited::BoundPassed,
        }
    }
}

impl ConsumerContext for WorkerContext {
    fn pre_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        let Rebalance::Revoke(tpl) = rebalance else {
            return;
        };
        let revoked = partitions_of(tpl);
        let began = Instant::now();
        // The session expired (a stall, a partition from the coordinator):
        // the partitions are another member's already. Fenced until the
        // next assignment; the wait below still lets the calls out finish,
        // so that their successes reach the handoff ledger.
        if consumer.assignment_lost() {
            self.session.lost(tokio::time::Instant::now());
        }
        let waited = self.wait_for_work(&revoked);
        let broker = Broker::in_callback(consumer);
        let committed = self.session.revoke(&broker, &revoked);
        PartitionsRevoked {
            consumer: self.role.as_str(),
            partitions: &describe(&revoked),
            waited,
            took: began.elapsed(),
            committed,
        }
        .emit();
        // librdkafka clears only its own pause flag on unassign: a pause the
        // worker made (backpressure, a parked retry record) would survive
        // into the next assignment of the partition and stop it for good.
        if let Err(e) = consumer.resume(tpl) {
            tracing::warn!(error = %e, "could not resume revoked partitions");
        }
        // The worker may already be gone at shutdown; nothing to tell then.
        let _ = self.events.send(PartitionEvent::Revoked(revoked));
    }

    fn post_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        match rebalance {
            Rebalance::Assign(tpl) => {
                let assigned = partitions_of(tpl);
                tracing::info!(partitions = %describe(&assigned), consumer = self.role.as_str(), "partitions assigned");
                let broker = Broker::in_callback(consumer);
                self.session.assign(&broker, &assigned);
                let _ = self.events.send(PartitionEvent::Assigned(assigned));
            }
            Rebalance::Error(e) => tracing::warn!(error = %e, "rebalance error"),
            Rebalance::Revoke(_) => {}
        }
    }
}

/// `topic[0],topic[3]`: one log field an operator (or a test) can read back.
fn describe(parts: &[TopicPartition]) -> String {
    parts
        .iter()
        .map(|tp| format!("{}[{}]", tp.topic, tp.partition))
        .collect::<Vec<_>>()
        .join(",")
}
