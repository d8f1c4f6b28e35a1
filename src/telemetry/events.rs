//! Typed events: one struct per occurrence. `emit()` writes one structured
//! log line and bumps its counters, so call sites are one line and every
//! counter has exactly one place that moves it. Labels are fixed strings,
//! never seller ids or payloads, so the series count stays bounded.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use super::Every;

/// Process-wide counters, rendered by `/metrics`.
#[derive(Debug, Default)]
pub struct Counters {
    pub jobs_received: AtomicU64,
    pub jobs_done: AtomicU64,
    pub jobs_dead_lettered: AtomicU64,
    pub jobs_to_retry_topic: AtomicU64,
    pub jobs_dropped_on_revoke: AtomicU64,
    pub downstream_calls: AtomicU64,
    pub downstream_retryable: AtomicU64,
    pub downstream_429: AtomicU64,
    pub limiter_calls: AtomicU64,
    pub limiter_denied: AtomicU64,
    pub limiter_errors: AtomicU64,
    pub jobs_admitted_without_redis: AtomicU64,
    pub commits: AtomicU64,
    pub commit_errors: AtomicU64,
    pub backpressure_pauses: AtomicU64,
    pub jobs_already_done: AtomicU64,
    pub partitions_assigned: AtomicU64,
    pub kafka_errors: AtomicU64,
    pub heads_moved: AtomicU64,
    pub jobs_admitted: AtomicU64,
    pub units_admitted: AtomicU64,
}

/// The counters of this process.
pub fn counters() -> &'static Counters {
    static COUNTERS: std::sync::OnceLock<Counters> = std::sync::OnceLock::new();
    COUNTERS.get_or_init(Counters::default)
}

impl Counters {
    /// Prometheus text exposition of every counter.
    pub fn render(&self) -> String {
        let rows = [
            (
                "jobs_received",
                &self.jobs_received,
                "records taken from Kafka",
            ),
            ("jobs_done", &self.jobs_done, "jobs the downstream accepted"),
            (
                "jobs_dead_lettered",
                &self.jobs_dead_lettered,
                "jobs written to the dead-letter topic",
            ),
            (
                "jobs_to_retry_topic",
                &self.jobs_to_retry_topic,
                "jobs deferred through the retry topic",
            ),
            (
                "jobs_dropped_on_revoke",
                &self.jobs_dropped_on_revoke,
                "waiting jobs left to a partition's new owner",
            ),
            (
                "downstream_calls",
                &self.downstream_calls,
                "calls to the downstream API",
            ),
            (
                "downstream_retryable_failures",
                &self.downstream_retryable,
                "5xx, timeouts and connection errors",
            ),
            (
                "downstream_throttled",
                &self.downstream_429,
                "429 answers from the downstream",
            ),
            (
                "limiter_calls",
                &self.limiter_calls,
                "limiter decisions asked of Redis",
            ),
            ("limiter_denied", &self.limiter_denied, "limiter refusals"),
            (
                "jobs_admitted",
                &self.jobs_admitted,
                "jobs the limiter admitted",
            ),
            (
                "units_admitted",
                &self.units_admitted,
                "units (job costs) the limiter admitted",
            ),
            (
                "limiter_errors",
                &self.limiter_errors,
                "limiter calls that failed (Redis unavailable)",
            ),
            (
                "jobs_admitted_without_redis",
                &self.jobs_admitted_without_redis,
                "jobs admitted by redis.on_error = fail_open or local while the limiter failed",
            ),
            ("offset_commits", &self.commits, "offset commits"),
            (
                "kafka_errors",
                &self.kafka_errors,
                "Kafka consumer errors (broker down, transport)",
            ),
            (
                "offset_commit_errors",
                &self.commit_errors,
                "failed offset commits",
            ),
            (
                "backpressure_pauses",
                &self.backpressure_pauses,
                "times fetching paused at worker.max_buffered",
            ),
        ];
        let mut out = String::new();
        for (name, value, help) in rows {
            out.push_str(&format!(
                "# HELP throttle_{name}_total {help}\n# TYPE throttle_{name}_total counter\nthrottle_{name}_total {}\n",
                value.load(Ordering::Relaxed)
            ));
        }
        out
    }
}

fn inc(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

/// A job the downstream accepted.
pub struct JobDone<'a> {
    pub job_id: &'a str,
    pub attempts: u32,
}

impl JobDone<'_> {
    pub fn emit(&self) {
        inc(&counters().jobs_done);
        tracing::debug!(job_id = self.job_id, attempts = self.attempts, "job done");
    }
}

/// A record written to the dead-letter topic.
pub struct JobDeadLettered<'a> {
    pub job_id: Option<&'a str>,
    pub reason: &'a str,
    pub topic: &'a str,
    pub partition: i32,
    pub offset: i64,
}

impl JobDeadLettered<'_> {
    pub fn emit(&self) {
        inc(&counters().jobs_dead_lettered);
        tracing::warn!(
            job_id = self.job_id,
            reason = self.reason,
            topic = self.topic,
            partition = self.partition,
            offset = self.offset,
            "job dead-lettered"
        );
    }
}

/// A job deferred through the retry topic.
pub struct JobDeferred<'a> {
    pub job_id: &'a str,
    pub wait: Duration,
}

impl JobDeferred<'_> {
    pub fn emit(&self) {
        inc(&counters().jobs_to_retry_topic);
        tracing::debug!(
            job_id = self.job_id,
            wait_ms = self.wait.as_millis() as u64,
            "job deferred to the retry topic"
        );
    }
}

/// The limiter refused a seller for a while.
pub struct SellerThrottled<'a> {
    pub seller: &'a str,
    pub retry_after: Duration,
    pub waiting: usize,
}

impl SellerThrottled<'_> {
    pub fn emit(&self) {
        inc(&counters().limiter_denied);
        tracing::debug!(
            seller = self.seller,
            retry_after_ms = self.retry_after.as_millis() as u64,
            waiting = self.waiting,
            "seller throttled"
        );
    }
}

/// The downstream answered 429 for a seller.
pub struct DownstreamThrottled<'a> {
    pub seller: &'a str,
    pub retry_after: Duration,
}

impl DownstreamThrottled<'_> {
    pub fn emit(&self) {
        inc(&counters().downstream_429);
        tracing::info!(
            seller = self.seller,
            retry_after_ms = self.retry_after.as_millis() as u64,
            "downstream throttled seller; blocking it for every replica"
        );
    }
}

/// A downstream call failed in a way worth retrying.
pub struct DownstreamFailed<'a> {
    pub job_id: &'a str,
    pub attempts: u32,
    pub reason: &'a str,
    pub backoff: Duration,
}

impl DownstreamFailed<'_> {
    pub fn emit(&self) {
        inc(&counters().downstream_retryable);
        tracing::info!(
            job_id = self.job_id,
            attempts = self.attempts,
            reason = self.reason,
            backoff_ms = self.backoff.as_millis() as u64,
            "downstream call failed; retrying after backoff"
        );
    }
}

/// The limiter could not answer; the failure policy decided instead.
pub struct LimiterUnavailable<'a> {
    pub error: &'a str,
    pub policy: &'a str,
    pub hold: Duration,
    /// Failed calls in a row, this one included.
    pub in_a_row: u32,
    /// Jobs let through anyway (fail_open, local).
    pub admitted: usize,
}

impl LimiterUnavailable<'_> {
    pub fn emit(&self) {
        // Every seller's call fails while Redis is out: one line per interval.
        static LOG: Every = Every::new(Duration::from_secs(5));
        inc(&counters().limiter_errors);
        counters()
            .jobs_admitted_without_redis
            .fetch_add(self.admitted as u64, Ordering::Relaxed);
        if let Some(more) = LOG.tick() {
            tracing::warn!(
                error = self.error,
                policy = self.policy,
                admitted = self.admitted,
                hold_ms = self.hold.as_millis() as u64,
                in_a_row = self.in_a_row,
                more_since_last_line = more,
                "limiter unavailable"
            );
        }
    }
}

/// Offsets committed.
pub struct OffsetsCommitted {
    pub partitions: usize,
    pub sync: bool,
}

impl OffsetsCommitted {
    pub fn emit(&self) {
        inc(&counters().commits);
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
        inc(&counters().commit_errors);
        if let Some(more) = LOG.tick() {
            tracing::warn!(
                error = self.error,
                more_since_last_line = more,
                "offset commit failed; the next commit carries the same offsets"
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
        inc(&counters().kafka_errors);
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
        counters()
            .jobs_dropped_on_revoke
            .fetch_add(self.jobs as u64, Ordering::Relaxed);
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
            inc(&counters().backpressure_pauses);
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
        inc(&counters().jobs_already_done);
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
        inc(&counters().partitions_assigned);
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
        counters()
            .jobs_dropped_on_revoke
            .fetch_add(self.jobs as u64, Ordering::Relaxed);
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
        inc(&counters().heads_moved);
        tracing::info!(
            job_id = self.job_id,
            partition = self.partition,
            offset = self.offset,
            waited_ms = self.waited.as_millis() as u64,
            "a partition's head held its commit back; sent round the retry topic"
        );
    }
}

/// A downstream 429 asked for a longer wait than `downstream.max_retry_after`;
/// the seller waits the maximum instead. Often a misconfigured or hostile
/// server: a 10^19 s `Retry-After` once overflowed the worker's clock
/// arithmetic.
pub struct RetryAfterClamped {
    pub requested: Duration,
    pub max: Duration,
}

impl RetryAfterClamped {
    pub fn emit(&self) {
        tracing::warn!(
            requested_s = self.requested.as_secs(),
            max_s = self.max.as_secs(),
            "downstream Retry-After is over downstream.max_retry_after; clamped"
        );
    }
}

/// The limiter admitted jobs of a seller: `units` is the sum of their costs.
pub struct JobsAdmitted {
    pub jobs: usize,
    pub units: u64,
}

impl JobsAdmitted {
    pub fn emit(&self) {
        counters()
            .jobs_admitted
            .fetch_add(self.jobs as u64, Ordering::Relaxed);
        counters()
            .units_admitted
            .fetch_add(self.units, Ordering::Relaxed);
    }
}
