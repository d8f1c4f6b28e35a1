//! Writes to the retry tiers and the dead-letter topic, which finish a
//! record only once the broker acknowledged them; and a job deferred to the
//! tier that fits its wait ([`super::super::tiers`] chooses it).

use std::time::Duration;

use crate::job::Job;
use crate::kafka::consumer::Origin;
use crate::kafka::{OriginalRecord, Verdict};
use crate::telemetry::events::{JobDeadLettered, JobDeferred, RecordTooLarge, RevokedWorkDropped};

use super::super::ordering::Lane;
use super::super::oversize::{self, TooLarge};
use super::super::pending::Pending;
use super::super::ports::{Clock, Ports, Source, WriteError, Writer};
use super::super::tiers::Target;
use super::super::timers::after;
use super::{Engine, Event};

/// A record to write to a retry tier or the dead-letter topic; the job
/// counts as finished only once the broker acknowledged it.
#[derive(Debug)]
pub(super) struct PendingWrite {
    bytes: usize,
    origin: Origin,
    original: OriginalRecord,
    job_id: Option<String>,
    /// The job's seller, when the record parsed as a job.
    seller: Option<String>,
    /// The job's lane, when the record parsed as a job: a retry copy the
    /// broker refuses waits in memory in it.
    lane: Option<Lane>,
    attempts: u32,
    target: Target,
    /// A dead letter carries the record's value, unless the broker refused
    /// it as too large: then it goes without (the original still holds it).
    with_value: bool,
}

/// What is known of a record that parsed as a job: the ids a dead letter
/// names in its headers, and its lane.
#[derive(Debug)]
pub(super) struct Named {
    job_id: String,
    seller: String,
    lane: Lane,
}

impl PendingWrite {
    pub(super) fn origin(&self) -> &Origin {
        &self.origin
    }
}

impl<X: Ports> Engine<X> {
    /// Sends a job to the retry tier that fits `wait`; one whose copy the
    /// broker refused as too large waits in memory instead.
    pub(super) fn defer(&mut self, p: Pending, wait: Duration) {
        if p.too_large_to_copy {
            return self.keep_in_memory(p, wait);
        }
        JobDeferred {
            job_id: &p.job.job_id,
            wait,
        }
        .emit();
        let target = self.tiers.target(wait, self.fleet_ms());
        self.write_pending(p, target);
    }

    pub(super) fn write_pending(&mut self, p: Pending, target: Target) {
        let Pending {
            job,
            origin,
            original,
            attempts,
            bytes,
            lane,
            ..
        } = p;
        let (outcome, detail) = match &target {
            Target::DeadLetter { kind, .. } => ("dead_lettered", *kind),
            Target::Retry { topic, .. } => ("retry_topic", topic.as_str()),
        };
        job.trace.finish(outcome, detail);
        let named = Named {
            job_id: job.job_id,
            seller: job.seller_id.as_str().to_owned(),
            lane,
        };
        self.write(bytes, origin, original, Some(named), attempts, target);
    }

    pub(super) fn write(
        &mut self,
        bytes: usize,
        origin: Origin,
        original: OriginalRecord,
        named: Option<Named>,
        attempts: u32,
        target: Target,
    ) {
        if !self.deps.source.may_start(&origin) {
            // Written by the partition's new owner, if at all (a revoking
            // partition starts no write).
            self.memory.remove(bytes);
            return RevokedWorkDropped {
                jobs: 1,
                stage: "write",
            }
            .emit();
        }
        let (job_id, seller, lane) = named.map_or((None, None, None), |n| {
            (Some(n.job_id), Some(n.seller), Some(n.lane))
        });
        let pending = PendingWrite {
            bytes,
            origin,
            original,
            job_id,
            seller,
            lane,
            attempts,
            target,
            with_value: true,
        };
        self.spawn_write(pending, Duration::ZERO);
    }

    /// A job that cannot go round a retry tier: held with its seller's
    /// backoffs until `wait` is over (it counts against `worker.max_buffered`,
    /// and its partition commits up to it only once it is done).
    fn keep_in_memory(&mut self, p: Pending, wait: Duration) {
        let at = after(self.deps.clock.now(), wait);
        self.delay(p, at);
    }

    /// The broker refused a copy as too large: what [`oversize::too_large`]
    /// says, carried out. A job bound for a retry tier is parsed again to
    /// wait in memory.
    fn on_too_large(&mut self, mut pending: PendingWrite, topic: &str, error: &str) {
        let bytes = pending.original.value.len();
        let now_ms = self.fleet_ms();
        let what = oversize::too_large(&pending.target, pending.with_value, bytes, topic, now_ms);
        let Some(fallback) = what.label() else {
            return self.retry_write(pending, error);
        };
        RecordTooLarge {
            topic,
            bytes,
            original_topic: &pending.original.origin.topic,
            partition: pending.original.origin.partition,
            offset: pending.original.origin.offset,
            fallback,
            error,
        }
        .emit();
        match what {
            TooLarge::WithoutPayload { reason } => {
                if let Target::DeadLetter { reason: r, .. } = &mut pending.target {
                    *r = reason;
                }
                pending.with_value = false;
                self.spawn_write(pending, Duration::ZERO);
            }
            TooLarge::KeepInMemory { wait } => self.keep_parsed_in_memory(pending, wait),
            TooLarge::TryAgain => self.retry_write(pending, error),
        }
    }

    /// A retry copy refused as too large, parsed again to wait `wait` in
    /// memory.
    fn keep_parsed_in_memory(&mut self, pending: PendingWrite, wait: Duration) {
        let PendingWrite {
            bytes,
            origin,
            original,
            attempts,
            lane,
            ..
        } = pending;
        match Job::parse_shared(&original.value, &self.settings.worker) {
            Ok(job) => {
                let now = self.deps.clock.now();
                let job = job.traced(&original.trace);
                let mut p = Pending::new(job, origin, original, attempts, bytes, now);
                if let Some(lane) = lane {
                    p = p.in_lane(lane);
                }
                p.too_large_to_copy = true;
                self.keep_in_memory(p, wait);
            }
            // It parsed when it was taken up, with the same limits.
            Err(e) => {
                let (kind, reason) = (e.kind(), e.to_string());
                let target = Target::DeadLetter { kind, reason };
                self.write(bytes, origin, original, None, attempts, target);
            }
        }
    }

    /// A write that failed for a reason that may pass: tried again in a
    /// second, as long as this worker owns the record.
    fn retry_write(&mut self, pending: PendingWrite, error: &str) {
        // Losing it is not an option: the record stays unfinished (so
        // uncommitted) and the write is tried again.
        tracing::warn!(
            error,
            topic = &*pending.origin.topic,
            offset = pending.origin.offset,
            "write to the retry or dead-letter topic failed; trying again in 1s"
        );
        if self.deps.source.may_start(&pending.origin) {
            self.spawn_write(pending, Duration::from_secs(1));
        } else {
            self.memory.remove(pending.bytes);
        }
    }

    fn spawn_write(&mut self, pending: PendingWrite, delay: Duration) {
        let (writer, tx) = (self.deps.writer.clone(), self.tx.clone());
        let dlq_topic = self.settings.kafka.dlq_topic.clone();
        self.tasks += 1;
        self.handoff.started(&pending.origin);
        tokio::spawn(async move {
            if !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
            let result = match &pending.target {
                Target::DeadLetter { kind, reason } => {
                    let verdict = Verdict {
                        kind,
                        reason,
                        attempts: pending.attempts,
                        seller: pending.seller.as_deref(),
                        job_id: pending.job_id.as_deref(),
                    };
                    writer
                        .dead_letter(&dlq_topic, &pending.original, &verdict, pending.with_value)
                        .await
                }
                Target::Retry {
                    topic,
                    not_before_unix_ms,
                    release_at_unix_ms,
                } => {
                    writer
                        .to_retry_topic(
                            topic,
                            &pending.original,
                            *not_before_unix_ms,
                            *release_at_unix_ms,
                            pending.attempts,
                        )
                        .await
                }
            };
            let _ = tx.send(Event::Written { pending, result });
        });
    }

    pub(super) fn on_written(&mut self, pending: PendingWrite, result: Result<(), WriteError>) {
        match result {
            Ok(()) => {
                if let Target::DeadLetter { kind, reason } = &pending.target {
                    JobDeadLettered {
                        job_id: pending.job_id.as_deref(),
                        kind,
                        reason,
                        topic: &pending.origin.topic,
                        partition: pending.origin.partition,
                        offset: pending.origin.offset,
                    }
                    .emit();
                }
                self.deps.source.finish(&pending.origin);
                self.memory.remove(pending.bytes);
            }
            Err(WriteError::TooLarge { topic, reason })
                if self.deps.source.may_start(&pending.origin) =>
            {
                self.on_too_large(pending, &topic, &reason)
            }
            Err(error) => self.retry_write(pending, &error.to_string()),
        }
    }
}
