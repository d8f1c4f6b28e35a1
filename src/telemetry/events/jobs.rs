//! A record's way through the worker: received, its job done, deferred to
//! the retry topic or dead-lettered; a copy too large for the broker; a
//! `traceparent` that could not be read.

use std::time::Duration;

use super::Event;
use crate::telemetry::metrics::{metrics, ReasonLabel};
use crate::telemetry::Every;

/// A record taken from Kafka.
#[derive(Debug)]
pub struct RecordReceived;

impl Event for RecordReceived {
    const NAME: &'static str = "RecordReceived";

    fn record(&self) {
        metrics().jobs_received.inc();
    }
}

/// A job whose ordering key (`worker.ordering_key`) was not in its record:
/// it was ordered by `by` (`record_key` or `partition`) instead.
#[derive(Debug)]
pub struct OrderingKeyMissing {
    pub by: &'static str,
}

impl Event for OrderingKeyMissing {
    const NAME: &'static str = "OrderingKeyMissing";

    fn record(&self) {
        metrics()
            .ordering_key_missing
            .get_or_create(&ReasonLabel { reason: self.by })
            .inc();
    }
}

/// A job the downstream accepted.
#[derive(Debug)]
pub struct JobDone<'a> {
    pub job_id: &'a str,
    pub attempts: u32,
}

impl Event for JobDone<'_> {
    const NAME: &'static str = "JobDone";

    fn record(&self) {
        metrics().jobs_done.inc();
        tracing::debug!(job_id = self.job_id, attempts = self.attempts, "job done");
    }
}

/// A record written to the dead-letter topic.
#[derive(Debug)]
pub struct JobDeadLettered<'a> {
    pub job_id: Option<&'a str>,
    /// A fixed label for the metric: `malformed`, `unreadable_headers`,
    /// `cost_over_capacity`, `downstream_rejected`, `attempts_exhausted`, …
    pub kind: &'static str,
    pub reason: &'a str,
    pub topic: &'a str,
    pub partition: i32,
    pub offset: i64,
}

impl Event for JobDeadLettered<'_> {
    const NAME: &'static str = "JobDeadLettered";

    fn record(&self) {
        metrics()
            .jobs_dead_lettered
            .get_or_create(&ReasonLabel { reason: self.kind })
            .inc();
        tracing::warn!(
            job_id = self.job_id,
            kind = self.kind,
            reason = self.reason,
            topic = self.topic,
            partition = self.partition,
            offset = self.offset,
            "job dead-lettered"
        );
    }
}

/// A job deferred through the retry topic.
#[derive(Debug)]
pub struct JobDeferred<'a> {
    pub job_id: &'a str,
    pub wait: Duration,
}

impl Event for JobDeferred<'_> {
    const NAME: &'static str = "JobDeferred";

    fn record(&self) {
        metrics().jobs_to_retry_topic.inc();
        tracing::debug!(
            job_id = self.job_id,
            wait_ms = self.wait.as_millis() as u64,
            "job deferred to the retry topic"
        );
    }
}

/// A copy of a record (a retry or a dead letter) the broker refused as too
/// large, and what the worker does instead: a dead letter goes without its
/// payload (which stays at its original position), a job due later waits in
/// memory rather than on a retry tier.
#[derive(Debug)]
pub struct RecordTooLarge<'a> {
    pub topic: &'a str,
    pub bytes: usize,
    pub original_topic: &'a str,
    pub partition: i32,
    pub offset: i64,
    /// `dead_letter_without_payload` or `kept_in_memory`.
    pub fallback: &'static str,
    pub error: &'a str,
}

impl Event for RecordTooLarge<'_> {
    const NAME: &'static str = "RecordTooLarge";

    fn record(&self) {
        metrics()
            .records_too_large
            .get_or_create(&ReasonLabel {
                reason: self.fallback,
            })
            .inc();
        tracing::warn!(
            topic = self.topic,
            bytes = self.bytes,
            original_topic = self.original_topic,
            partition = self.partition,
            offset = self.offset,
            fallback = self.fallback,
            error = self.error,
            "record too large to copy; see kafka.producer_properties.message.max.bytes and the topic's max.message.bytes"
        );
    }
}

/// A job record's `traceparent` is not valid W3C trace context: the job
/// goes on, in a new trace. Counted per record by kind; logged at most
/// once a minute, without the header's text (input from the producer).
#[derive(Debug)]
pub struct TraceContextInvalid {
    /// `shape`, `not_hex`, `version`, `zero_trace_id`, `zero_parent_id`.
    pub kind: &'static str,
}

impl Event for TraceContextInvalid {
    const NAME: &'static str = "TraceContextInvalid";

    fn record(&self) {
        metrics()
            .trace_context_invalid
            .get_or_create(&ReasonLabel { reason: self.kind })
            .inc();
        static LOG: Every = Every::new(Duration::from_secs(60));
        if let Some(more) = LOG.tick() {
            tracing::warn!(
                kind = self.kind,
                more_since_last_line = more,
                "job record has an invalid traceparent; its job starts a new trace"
            );
        }
    }
}

inherent_emit!(
    RecordReceived,
    OrderingKeyMissing,
    JobDone<'_>,
    JobDeadLettered<'_>,
    JobDeferred<'_>,
    RecordTooLarge<'_>,
    TraceContextInvalid
);
