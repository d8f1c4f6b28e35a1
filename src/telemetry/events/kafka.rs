//! The consumer's side of Kafka: offsets committed or not, the handoff
//! ledger, polls that fail, partitions assigned and revoked (and the work
//! dropped with them), a partition's head moved on, lag; a consumer that
//! fences itself for a session it may have lost, and resumes.

use std::time::Duration;

use super::Event;
use crate::telemetry::metrics::{metrics, ReasonLabel};
use crate::telemetry::Every;

/// Offsets committed.
#[derive(Debug)]
pub struct OffsetsCommitted {
    pub partitions: usize,
    pub sync: bool,
}

impl Event for OffsetsCommitted {
    const NAME: &'static str = "OffsetsCommitted";

    fn record(&self) {
        metrics().offset_commits.inc();
        tracing::debug!(
            partitions = self.partitions,
            sync = self.sync,
            "offsets committed"
        );
    }
}

/// An offset commit failed; the next commit carries the same offsets.
#[derive(Debug)]
pub struct CommitFailed<'a> {
    pub error: &'a str,
}

impl Event for CommitFailed<'_> {
    const NAME: &'static str = "CommitFailed";

    fn record(&self) {
        // While a broker is down every commit fails: one line per interval.
        static LOG: Every = Every::new(Duration::from_secs(10));
        metrics().offset_commit_errors.inc();
        if let Some(more) = LOG.tick() {
            tracing::warn!(
                error = self.error,
                more_since_last_line = more,
                "offset commit failed; the next commit carries the same offsets"
            );
        }
    }
}

/// The handoff ledger could not be read or written: a partition handed over
/// meanwhile relies on the broker's commit alone (at-least-once).
#[derive(Debug)]
pub struct HandoffLedgerFailed<'a> {
    pub op: &'static str,
    pub error: &'a str,
}

impl Event for HandoffLedgerFailed<'_> {
    const NAME: &'static str = "HandoffLedgerFailed";

    fn record(&self) {
        // While Redis is down every commit interval fails: one line per 10 s.
        static LOG: Every = Every::new(Duration::from_secs(10));
        metrics().handoff_ledger_errors.inc();
        if let Some(more) = LOG.tick() {
            tracing::warn!(
                op = self.op,
                error = self.error,
                more_since_last_line = more,
                "handoff ledger failed; a partition handed over meanwhile relies on the broker's commit alone"
            );
        }
    }
}

/// Polling Kafka failed (a broker down, a transport error); librdkafka keeps
/// reconnecting on its own.
#[derive(Debug)]
pub struct KafkaPollFailed<'a> {
    pub error: &'a str,
}

impl Event for KafkaPollFailed<'_> {
    const NAME: &'static str = "KafkaPollFailed";

    fn record(&self) {
        static LOG: Every = Every::new(Duration::from_secs(10));
        metrics().kafka_errors.inc();
        if let Some(more) = LOG.tick() {
            tracing::warn!(
                error = self.error,
                more_since_last_line = more,
                "Kafka consumer error; librdkafka retries by itself"
            );
        }
    }
}

/// Waiting jobs of revoked partitions dropped, uncommitted.
#[derive(Debug)]
pub struct RevokedJobsDropped {
    pub partitions: usize,
    pub jobs: usize,
}

impl Event for RevokedJobsDropped {
    const NAME: &'static str = "RevokedJobsDropped";

    fn record(&self) {
        metrics().jobs_dropped_on_revoke.inc_by(self.jobs as u64);
        tracing::info!(
            partitions = self.partitions,
            jobs = self.jobs,
            "partitions revoked; their waiting jobs are left to the new owner"
        );
    }
}

/// A redelivered record the partition's previous owner had finished (named
/// in its commit metadata): finished again without a downstream call.
#[derive(Debug)]
pub struct AlreadyDone {
    pub offset: i64,
}

impl Event for AlreadyDone {
    const NAME: &'static str = "AlreadyDone";

    fn record(&self) {
        metrics().jobs_already_done.inc();
        tracing::trace!(
            offset = self.offset,
            "record already done by the previous owner; skipped"
        );
    }
}

/// A record the broker delivered again within its assignment (a fetch
/// retried) while this consumer held it or had finished it: not taken as
/// work a second time.
#[derive(Debug)]
pub struct RecordDeliveredAgain<'a> {
    pub topic: &'a str,
    pub partition: i32,
    pub offset: i64,
}

impl Event for RecordDeliveredAgain<'_> {
    const NAME: &'static str = "RecordDeliveredAgain";

    fn record(&self) {
        tracing::debug!(
            topic = self.topic,
            partition = self.partition,
            offset = self.offset,
            "record delivered again in its assignment, held or finished here; skipped"
        );
    }
}

/// The group gave this worker partitions (after a rebalance).
#[derive(Debug)]
pub struct PartitionsAssigned {
    pub partitions: usize,
}

impl Event for PartitionsAssigned {
    const NAME: &'static str = "PartitionsAssigned";

    fn record(&self) {
        metrics().rebalances.inc();
        tracing::debug!(
            partitions = self.partitions,
            "partitions assigned to the worker"
        );
    }
}

/// How a revoke's wait for its partitions' work under way ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Waited {
    /// The worker said the work under way had ended (or none was).
    Quiet,
    /// `worker.revoke_wait` passed first: what answers later is dropped,
    /// and a success among it is done again by the next owner.
    BoundPassed,
}

/// Partitions revoked from this consumer: the wait for their work under
/// way and the commit, which the group's rebalance waits for.
#[derive(Debug)]
pub struct PartitionsRevoked<'a> {
    pub consumer: &'a str,
    /// `topic[p],..`.
    pub partitions: &'a str,
    pub waited: Waited,
    /// From the revoke's start to its end (wait and commit).
    pub took: Duration,
    /// Partitions the broker took the commit of.
    pub committed: usize,
}

impl Event for PartitionsRevoked<'_> {
    const NAME: &'static str = "PartitionsRevoked";

    fn record(&self) {
        let m = metrics();
        m.revoke_duration.observe(self.took.as_secs_f64());
        if self.waited == Waited::BoundPassed {
            m.revoke_waits_expired.inc();
            tracing::warn!(
                partitions = self.partitions,
                consumer = self.consumer,
                took_ms = self.took.as_millis() as u64,
                "partitions revoked with work still under way at worker.revoke_wait: its successes are done again by the next owner"
            );
        } else {
            tracing::info!(
                partitions = self.partitions,
                consumer = self.consumer,
                took_ms = self.took.as_millis() as u64,
                committed = self.committed,
                "partitions revoked"
            );
        }
    }
}

/// Work of a revoked partition dropped instead of finished: its new owner
/// processes the record again (`stage`: a downstream answer that came back,
/// a write to the retry or dead-letter topic, or calls not yet made).
#[derive(Debug)]
pub struct RevokedWorkDropped {
    pub jobs: usize,
    pub stage: &'static str,
}

impl Event for RevokedWorkDropped {
    const NAME: &'static str = "RevokedWorkDropped";

    fn record(&self) {
        metrics().jobs_dropped_on_revoke.inc_by(self.jobs as u64);
        tracing::debug!(
            jobs = self.jobs,
            stage = self.stage,
            "work of a revoked partition dropped; the new owner redoes it"
        );
    }
}

/// A consumer may have lost its session (issue 53): it starts no
/// downstream call until its ownership is confirmed again.
#[derive(Debug)]
pub struct SessionFenced<'a> {
    pub consumer: &'a str,
    /// `stalled` or `assignment_lost`.
    pub reason: &'static str,
    /// A stall's length: the poll thread's silence.
    pub gap: Option<Duration>,
}

impl Event for SessionFenced<'_> {
    const NAME: &'static str = "SessionFenced";

    fn record(&self) {
        let m = metrics();
        m.session_fences
            .get_or_create(&ReasonLabel {
                reason: self.reason,
            })
            .inc();
        m.sessions_fenced.inc();
        tracing::warn!(
            consumer = self.consumer,
            reason = self.reason,
            gap_ms = self.gap.map(|g| g.as_millis() as u64),
            "consumer fenced: its session may be lost, so it calls nothing until its ownership is confirmed"
        );
    }
}

/// A fenced consumer's ownership was confirmed again: calls go on.
#[derive(Debug)]
pub struct SessionResumed<'a> {
    pub consumer: &'a str,
    /// `assignment`, `commit` or `heartbeats`.
    pub by: &'static str,
    pub fenced_for: Duration,
}

impl Event for SessionResumed<'_> {
    const NAME: &'static str = "SessionResumed";

    fn record(&self) {
        metrics().sessions_fenced.dec();
        tracing::info!(
            consumer = self.consumer,
            by = self.by,
            fenced_ms = self.fenced_for.as_millis() as u64,
            "consumer resumed: its ownership is confirmed"
        );
    }
}

/// Jobs not called because their slot of `max_in_flight` had lapsed, or
/// would before the call's timeout, by this replica's clock (a stall, a
/// long wait after the grant): asked for again, so that the fleet's cap
/// holds.
#[derive(Debug)]
pub struct LeaseLapsed {
    pub jobs: usize,
}

impl Event for LeaseLapsed {
    const NAME: &'static str = "LeaseLapsed";

    fn record(&self) {
        metrics().jobs_lease_lapsed.inc_by(self.jobs as u64);
        tracing::info!(
            jobs = self.jobs,
            "jobs not called: their max_in_flight slot lapsed; asked for again"
        );
    }
}

/// A partition's first unfinished record held finished ones back from the
/// commit too long and was sent round the retry topic.
#[derive(Debug)]
pub struct HeadMoved<'a> {
    pub job_id: &'a str,
    pub partition: i32,
    pub offset: i64,
    pub waited: Duration,
}

impl Event for HeadMoved<'_> {
    const NAME: &'static str = "HeadMoved";

    fn record(&self) {
        metrics().heads_moved.inc();
        tracing::info!(
            job_id = self.job_id,
            partition = self.partition,
            offset = self.offset,
            waited_ms = self.waited.as_millis() as u64,
            "a partition's head held its commit back; sent round the retry topic"
        );
    }
}

/// librdkafka's periodic statistics: each assigned partition's lag as
/// (topic, partition, messages behind, age in seconds of its first
/// unfinished record).
#[derive(Debug)]
pub struct ConsumerLag<'a> {
    pub group: &'a str,
    pub partitions: &'a [(&'a str, i32, i64, f64)],
    /// Partitions this consumer reported last time and not now (revoked):
    /// their series drop out. A worker has two consumers (the jobs topic,
    /// the retry tiers), each reporting its own partitions: a report leaves
    /// the other consumer's series alone.
    pub gone: &'a [(&'a str, i32)],
}

impl Event for ConsumerLag<'_> {
    const NAME: &'static str = "ConsumerLag";

    fn record(&self) {
        use crate::telemetry::metrics::{PartitionLabels, TopicLabels};
        let m = metrics();
        let labels = |topic: &str, partition: i32| PartitionLabels {
            group: self.group.to_owned(),
            topic: topic.to_owned(),
            partition,
        };
        let topic_labels = |topic: &str| TopicLabels {
            group: self.group.to_owned(),
            topic: topic.to_owned(),
        };
        for (topic, partition) in self.gone {
            m.consumer_lag.remove(&labels(topic, *partition));
            m.consumer_lag_seconds.remove(&labels(topic, *partition));
        }
        let mut per_topic: std::collections::HashMap<&str, i64> = std::collections::HashMap::new();
        for (topic, partition, messages, seconds) in self.partitions {
            let l = labels(topic, *partition);
            m.consumer_lag.get_or_create(&l).set(*messages);
            m.consumer_lag_seconds.get_or_create(&l).set(*seconds);
            *per_topic.entry(topic).or_default() += messages;
        }
        // A topic none of whose partitions is held any more drops out too.
        for (topic, _) in self.gone {
            if !per_topic.contains_key(topic) {
                m.consumer_topic_lag.remove(&topic_labels(topic));
            }
        }
        for (topic, sum) in per_topic {
            m.consumer_topic_lag
                .get_or_create(&topic_labels(topic))
                .set(sum);
        }
    }
}

inherent_emit!(
    OffsetsCommitted,
    CommitFailed<'_>,
    HandoffLedgerFailed<'_>,
    KafkaPollFailed<'_>,
    RevokedJobsDropped,
    AlreadyDone,
    RecordDeliveredAgain<'_>,
    PartitionsAssigned,
    PartitionsRevoked<'_>,
    RevokedWorkDropped,
    SessionFenced<'_>,
    SessionResumed<'_>,
    LeaseLapsed,
    HeadMoved<'_>,
    ConsumerLag<'_>
);
