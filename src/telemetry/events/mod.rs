//! Typed events: one struct per occurrence. `emit()` writes one structured
//! log line and bumps its counters, so call sites are one line and every
//! counter has exactly one place that moves it. Labels are fixed strings or
//! sellers the config names (every other seller is `other`), never payloads,
//! so the series count stays bounded.

use std::time::Duration;

use super::metrics::{metrics, seller_label};
use super::Every;

mod limiter;
pub use limiter::{
    JobsCallCancelled, LimiterCallCoalesced, LimiterCalled, LimiterStateLost, LimiterUnavailable,
    RedisCalled, SlotsNotReturned,
};
mod decisions;
pub use decisions::{CallAvoided, JobsAdmitted, LimiterNever, SellerThrottled, ShadowDecided};
mod downstream;
pub use downstream::{
    DownstreamAnswered, DownstreamFailed, DownstreamOutage, DownstreamThrottled, RetryAfterClamped,
};
mod jobs;
pub use jobs::{
    JobDeadLettered, JobDeferred, JobDone, RecordReceived, RecordTooLarge, TraceContextInvalid,
};

fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}

/// Offsets committed.
pub struct OffsetsCommitted {
    pub partitions: usize,
    pub sync: bool,
}

impl OffsetsCommitted {
    pub fn emit(&self) {
        metrics().offset_commits.inc();
        tracing::debug!(
            partitions = self.partitions,
            sync = self.sync,
            "offsets committed"
        );
    }
}

/// An offset commit failed; the next commit carries the same offsets.
pub struct CommitFailed<'a> {
    pub error: &'a str,
}

impl CommitFailed<'_> {
    pub fn emit(&self) {
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
pub struct HandoffLedgerFailed<'a> {
    pub op: &'static str,
    pub error: &'a str,
}

impl HandoffLedgerFailed<'_> {
    pub fn emit(&self) {
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
pub struct KafkaPollFailed<'a> {
    pub error: &'a str,
}

impl KafkaPollFailed<'_> {
    pub fn emit(&self) {
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
pub struct RevokedJobsDropped {
    pub partitions: usize,
    pub jobs: usize,
}

impl RevokedJobsDropped {
    pub fn emit(&self) {
        metrics().jobs_dropped_on_revoke.inc_by(self.jobs as u64);
        tracing::info!(
            partitions = self.partitions,
            jobs = self.jobs,
            "partitions revoked; their waiting jobs are left to the new owner"
        );
    }
}

/// Fetching paused or resumed at `worker.max_buffered` or `worker.max_buffered_bytes`.
pub struct Backpressure {
    pub paused: bool,
    pub buffered: usize,
    pub bytes: usize,
}

impl Backpressure {
    pub fn emit(&self) {
        if self.paused {
            metrics().backpressure_pauses.inc();
        }
        tracing::info!(
            paused = self.paused,
            buffered = self.buffered,
            bytes = self.bytes,
            "backpressure"
        );
    }
}

/// A redelivered record the partition's previous owner had finished (named
/// in its commit metadata): finished again without a downstream call.
pub struct AlreadyDone {
    pub offset: i64,
}

impl AlreadyDone {
    pub fn emit(&self) {
        metrics().jobs_already_done.inc();
        tracing::trace!(
            offset = self.offset,
            "record already done by the previous owner; skipped"
        );
    }
}

/// The group gave this worker partitions (after a rebalance).
pub struct PartitionsAssigned {
    pub partitions: usize,
}

impl PartitionsAssigned {
    pub fn emit(&self) {
        metrics().rebalances.inc();
        tracing::debug!(
            partitions = self.partitions,
            "partitions assigned to the worker"
        );
    }
}

/// Work of a revoked partition dropped instead of finished: its new owner
/// processes the record again (`stage`: a downstream answer that came back,
/// a write to the retry or dead-letter topic, or calls not yet made).
pub struct RevokedWorkDropped {
    pub jobs: usize,
    pub stage: &'static str,
}

impl RevokedWorkDropped {
    pub fn emit(&self) {
        metrics().jobs_dropped_on_revoke.inc_by(self.jobs as u64);
        tracing::debug!(
            jobs = self.jobs,
            stage = self.stage,
            "work of a revoked partition dropped; the new owner redoes it"
        );
    }
}

/// A partition's first unfinished record held finished ones back from the
/// commit too long and was sent round the retry topic.
pub struct HeadMoved<'a> {
    pub job_id: &'a str,
    pub partition: i32,
    pub offset: i64,
    pub waited: Duration,
}

impl HeadMoved<'_> {
    pub fn emit(&self) {
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

/// A snapshot of what this replica holds, taken every commit interval.
pub struct Backlog<'a> {
    /// Jobs waiting in memory by (cause, seller): `limit` or `capacity`.
    pub waiting: &'a std::collections::HashMap<(&'static str, std::sync::Arc<str>), i64>,
    pub in_flight: usize,
    pub parked: usize,
    pub bytes: usize,
    pub assigned: usize,
    pub paused: usize,
}

impl Backlog<'_> {
    pub fn emit(&self) {
        let m = metrics();
        let mut by_label: std::collections::HashMap<(&'static str, String), i64> =
            std::collections::HashMap::new();
        for ((cause, seller), n) in self.waiting {
            *by_label.entry((cause, seller_label(seller))).or_default() += n;
        }
        // Every cause of every labelled seller, so a cause that emptied
        // reads 0 rather than vanishing; sellers gone entirely are dropped.
        const CAUSES: [&str; 3] = ["limit", "capacity", "paused"];
        m.jobs_waiting.clear();
        for cause in CAUSES {
            m.jobs_waiting
                .get_or_create(&super::metrics::WaitingLabels {
                    cause,
                    seller: super::metrics::OTHER_SELLER.to_owned(),
                })
                .set(0);
        }
        let sellers: std::collections::HashSet<&String> = by_label.keys().map(|(_, s)| s).collect();
        for seller in sellers {
            for cause in CAUSES {
                let n = by_label.get(&(cause, seller.clone())).copied().unwrap_or(0);
                m.jobs_waiting
                    .get_or_create(&super::metrics::WaitingLabels {
                        cause,
                        seller: seller.clone(),
                    })
                    .set(n);
            }
        }
        m.jobs_in_flight.set(self.in_flight as i64);
        m.jobs_parked.set(self.parked as i64);
        m.buffered_bytes.set(self.bytes as i64);
        m.assigned_partitions.set(self.assigned as i64);
        m.paused_partitions.set(self.paused as i64);
    }
}

/// The worker started with these settings: the bounds that alerts compare
/// the live figures with (`buffered_bytes` against `max_buffered_bytes`).
pub struct WorkerConfigured {
    pub max_buffered_bytes: usize,
}

impl WorkerConfigured {
    pub fn emit(&self) {
        metrics()
            .max_buffered_bytes
            .set(i64::try_from(self.max_buffered_bytes).unwrap_or(i64::MAX));
    }
}

/// librdkafka's periodic statistics: each assigned partition's lag as
/// (topic, partition, messages behind, age in seconds of its first
/// unfinished record).
pub struct ConsumerLag<'a> {
    pub group: &'a str,
    pub partitions: &'a [(&'a str, i32, i64, f64)],
    /// Partitions this consumer reported last time and not now (revoked):
    /// their series drop out. A worker has two consumers (the jobs topic,
    /// the retry tiers), each reporting its own partitions: a report leaves
    /// the other consumer's series alone.
    pub gone: &'a [(&'a str, i32)],
}

impl ConsumerLag<'_> {
    pub fn emit(&self) {
        use super::metrics::{PartitionLabels, TopicLabels};
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

/// The config file changed and was read again: its `[limits]` are in force
/// now (`changed`), and other sections that changed wait for a restart.
pub struct LimitsReloaded<'a> {
    pub file: &'a str,
    pub changed: bool,
    pub named_sellers: usize,
    pub restart_needed: bool,
}

impl LimitsReloaded<'_> {
    pub fn emit(&self) {
        if self.changed {
            metrics().config_reloads.inc();
            tracing::info!(
                file = self.file,
                named_sellers = self.named_sellers,
                "limits reloaded; in force on this replica now"
            );
        }
        if self.restart_needed {
            tracing::warn!(
                file = self.file,
                "sections other than [limits] changed in the config file; they apply after a restart"
            );
        }
    }
}

/// An edit of the config file could not be applied; the limits in force
/// stay. `error` names the file, the key and the problem.
pub struct LimitsReloadRejected<'a> {
    pub error: &'a str,
}

impl LimitsReloadRejected<'_> {
    pub fn emit(&self) {
        metrics().config_reload_errors.inc();
        tracing::error!(
            error = self.error,
            "config edit rejected; the limits in force stay"
        );
    }
}

/// What the replicas read from Redis beside the limiter's calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SharedState {
    /// The temporary overrides (`limits override`), read every second.
    Overrides,
    /// The operators' pauses (`limits pause`), read four times a second.
    Pauses,
}

/// Shared state could not be read from Redis; what was read last stays in
/// force (an override is not dropped, a pause not lifted, because Redis did
/// not answer).
pub struct SharedStateUnreadable<'a> {
    pub what: SharedState,
    pub error: &'a str,
}

impl SharedStateUnreadable<'_> {
    pub fn emit(&self) {
        // Every read while Redis is out: one line per interval and kind.
        static OVERRIDES: Every = Every::new(Duration::from_secs(30));
        static PAUSES: Every = Every::new(Duration::from_secs(30));
        let (log, what) = match self.what {
            SharedState::Overrides => (&OVERRIDES, "limit overrides"),
            SharedState::Pauses => (&PAUSES, "operator pauses"),
        };
        if let Some(more) = log.tick() {
            tracing::warn!(
                error = self.error,
                more_since_last_line = more,
                "{what} unreadable; the ones read last stay in force"
            );
        }
    }
}

/// The pauses as a replica read them (every `limiter::pauses::REFRESH`):
/// the gauges, and a line when they change.
pub struct PausesRead {
    pub sellers: usize,
    pub all: bool,
    /// They differ from the previous read.
    pub changed: bool,
}

impl PausesRead {
    pub fn emit(&self) {
        metrics().paused_sellers.set(self.sellers as i64);
        metrics().paused_all.set(i64::from(self.all));
        if self.changed {
            tracing::warn!(
                paused_sellers = self.sellers,
                all_paused = self.all,
                "operator pauses changed: paused sellers call nothing until resumed"
            );
        }
    }
}

/// A paused seller's waiting jobs held back: in memory (counted by
/// `throttle_jobs_waiting{cause="paused"}`), or sent to the retry tiers
/// (`parked`, counted as every deferral is).
pub struct SellerPaused<'a> {
    pub seller: &'a str,
    pub jobs: usize,
    pub parked: bool,
    /// What is left of the pause; `None`: until resumed.
    pub left: Option<Duration>,
}

impl SellerPaused<'_> {
    pub fn emit(&self) {
        if self.jobs == 0 {
            return;
        }
        tracing::debug!(
            seller = self.seller,
            jobs = self.jobs,
            parked = self.parked,
            left_ms = self.left.map(|d| d.as_millis() as u64),
            "seller paused: jobs held back"
        );
        super::trace::note_seller_wait(self.seller, "paused", self.left);
    }
}

/// A seller's jobs wait: for a downstream slot (`capacity`, no end known)
/// or for the units a partial grant left short (`limit`, `wait` long).
/// Refusals and 429s are told by [`SellerThrottled`] and
/// [`DownstreamThrottled`]. Only the job spans use it (their wait cause).
pub struct SellerWaiting<'a> {
    pub seller: &'a str,
    pub cause: &'static str,
    pub wait: Option<Duration>,
}

impl SellerWaiting<'_> {
    pub fn capacity(seller: &str) -> SellerWaiting<'_> {
        SellerWaiting {
            seller,
            cause: "capacity",
            wait: None,
        }
    }

    /// Every slot of the seller's `max_in_flight` is taken, fleet-wide.
    pub fn in_flight(seller: &str, wait: Duration) -> SellerWaiting<'_> {
        SellerWaiting {
            seller,
            cause: "capacity",
            wait: Some(wait),
        }
    }

    pub fn limit(seller: &str, wait: Duration) -> SellerWaiting<'_> {
        SellerWaiting {
            seller,
            cause: "limit",
            wait: Some(wait),
        }
    }

    pub fn emit(&self) {
        super::trace::note_seller_wait(self.seller, self.cause, self.wait);
    }
}
