//! Typed events: one struct per occurrence. `emit()` writes one structured
//! log line and bumps its counters, so call sites are one line and every
//! counter has exactly one place that moves it. Labels are fixed strings,
//! never seller ids or payloads, so the series count stays bounded.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

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
    pub commits: AtomicU64,
    pub commit_errors: AtomicU64,
    pub backpressure_pauses: AtomicU64,
    pub jobs_already_done: AtomicU64,
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
                "limiter_errors",
                &self.limiter_errors,
                "limiter calls that failed (Redis unavailable)",
            ),
            ("offset_commits", &self.commits, "offset commits"),
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
}

impl LimiterUnavailable<'_> {
    pub fn emit(&self) {
        inc(&counters().limiter_errors);
        tracing::warn!(
            error = self.error,
            policy = self.policy,
            hold_ms = self.hold.as_millis() as u64,
            "limiter unavailable"
        );
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
        inc(&counters().commit_errors);
        tracing::warn!(error = self.error, "offset commit failed");
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

/// Fetching paused or resumed at `worker.max_buffered`.
pub struct Backpressure {
    pub paused: bool,
    pub buffered: usize,
}

impl Backpressure {
    pub fn emit(&self) {
        if self.paused {
            inc(&counters().backpressure_pauses);
        }
        tracing::info!(
            paused = self.paused,
            buffered = self.buffered,
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
