//! The retry tiers and the dead-letter topic: records parked until their
//! tier releases them, jobs deferred to a tier, and the writes, which
//! finish a record only once the broker acknowledged them.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use crate::config::{RetryTier, Settings};
use crate::job::Job;
use crate::kafka::consumer::{Origin, TopicPartition};
use crate::kafka::{OriginalRecord, Verdict};
use crate::telemetry::events::{JobDeadLettered, JobDeferred, RecordTooLarge, RevokedWorkDropped};

use super::engine::{Engine, Event, Pending};
use super::ports::{Clock, Ports, Source, WriteError, Writer};
use super::timers::{after, ceil_ms, until_ms, Timer};

/// Where a record goes.
#[derive(Debug, Clone)]
pub(super) enum Target {
    DeadLetter {
        /// The metric's label: see [`JobDeadLettered::kind`].
        kind: &'static str,
        reason: String,
    },
    /// A retry tier's topic: taken up at `release_at`, run from `not_before`.
    Retry {
        topic: String,
        not_before_unix_ms: u64,
        release_at_unix_ms: u64,
    },
}

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
    attempts: u32,
    target: Target,
    /// A dead letter carries the record's value, unless the broker refused
    /// it as too large: then it goes without (the original still holds it).
    with_value: bool,
}

/// The ids a dead letter names in its headers, when the record parsed.
#[derive(Debug)]
pub(super) struct Named {
    pub(super) job_id: String,
    pub(super) seller: String,
}

/// A retry-tier record held until its release time.
#[derive(Debug)]
pub(super) struct Parked {
    pub(super) release_at_unix_ms: u64,
    pub(super) not_before_unix_ms: Option<u64>,
    pub(super) pending: Pending,
}

/// The tiers, and the records parked on them.
#[derive(Debug)]
pub(super) struct Retry {
    /// Retry-tier records not yet released, per partition, in offset order
    /// (which is release order within a tier); the partition is paused
    /// while it has any. Ordered for a replayable walk.
    pub(super) parked: BTreeMap<TopicPartition, VecDeque<Parked>>,
    /// The retry tiers, shortest first.
    tiers: Vec<RetryTier>,
}

impl Retry {
    pub(super) fn new(settings: &Settings) -> Retry {
        Retry {
            parked: BTreeMap::new(),
            tiers: settings.kafka.retry_tiers(),
        }
    }

    /// Whether holding a record of `topic` for `wait_ms` stays within its
    /// tier's delay (plus a second for clocks and transit).
    pub(super) fn holds_at_most(&self, topic: &str, wait_ms: u64) -> bool {
        self.hold_bound_ms(topic).is_some_and(|b| wait_ms <= b)
    }

    /// The longest a record of `topic` may be held: its tier's delay plus
    /// a second for clocks and transit; `None` for a topic of no tier.
    fn hold_bound_ms(&self, topic: &str) -> Option<u64> {
        self.tiers
            .iter()
            .find(|t| t.topic == topic)
            .map(|t| ceil_ms(t.delay).saturating_add(1000))
    }
}

impl<X: Ports> Engine<X> {
    /// A retry-tier record taken up (or a fresh one): run it when due. A
    /// short remaining wait is held in memory, without holding the
    /// partition; a longer one hops to the tier that fits it.
    pub(super) fn take_up(&mut self, pending: Pending, not_before: Option<u64>) {
        let remaining = match not_before {
            Some(nb) => until_ms(self.fleet_ms(), nb),
            None => Duration::ZERO,
        };
        if remaining.is_zero() {
            return self.enqueue(pending);
        }
        if remaining > self.settings.worker.max_inline_delay {
            return self.defer(pending, remaining);
        }
        let key: Arc<str> = Arc::from(pending.job.seller_id.as_str());
        let at = after(self.deps.clock.now(), remaining);
        self.sellers.entry(&key).delayed.push((at, pending));
        self.timers.at(at, Timer::Seller(key));
    }

    /// A retry-tier record not yet released: hold it and pause its
    /// partition, so that waiting neither spins nor holds up other
    /// partitions. Records behind it in the partition are released later
    /// (a tier's release times ascend), so none waits behind the head.
    pub(super) fn park(&mut self, parked: Parked) {
        let origin = &parked.pending.origin;
        let part = TopicPartition::new(origin.topic.clone(), origin.partition);
        let release = parked.release_at_unix_ms;
        let queue = self.retry.parked.entry(part.clone()).or_default();
        let first = queue.is_empty();
        queue.push_back(parked);
        if first {
            self.deps.source.pause(std::slice::from_ref(&part));
            let at = after(self.deps.clock.now(), until_ms(self.fleet_ms(), release));
            self.timers
                .at(at, Timer::Parked(part.topic, part.partition));
        }
    }

    pub(super) fn unpark(&mut self, part: TopicPartition) {
        let now = self.fleet_ms();
        // A release further off than the tier's delay (written on a clock
        // that was off, or by hand) is not trusted to hold the partition,
        // as on arrival: the record is taken up now and hops tiers by its
        // due time.
        let bound = self.retry.hold_bound_ms(&part.topic);
        let mut released = Vec::new();
        let mut next = None;
        if let Some(queue) = self.retry.parked.get_mut(&part) {
            while let Some(head) = queue.front() {
                let release = head.release_at_unix_ms;
                if release > now && bound.is_some_and(|b| release - now <= b) {
                    next = Some(release);
                    break;
                }
                released.extend(queue.pop_front());
            }
        }
        match next {
            Some(release) => {
                let at = after(self.deps.clock.now(), until_ms(now, release));
                self.timers
                    .at(at, Timer::Parked(part.topic.clone(), part.partition));
            }
            None => {
                self.retry.parked.remove(&part);
                if !self.memory.is_paused() {
                    self.deps.source.resume(std::slice::from_ref(&part));
                }
            }
        }
        for p in released {
            self.take_up(p.pending, p.not_before_unix_ms);
        }
    }

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
        // The longest tier that does not pass the due time (the shortest if
        // none fits): the record is released no later than it is due, and
        // hops down the tiers until then.
        let tiers = &self.retry.tiers;
        let tier = tiers
            .iter()
            .rev()
            .find(|t| t.delay <= wait)
            .or(tiers.first());
        let Some(tier) = tier else {
            unreachable!("config validation keeps at least one retry tier")
        };
        let now = self.fleet_ms();
        let due = now.saturating_add(ceil_ms(wait));
        // A wait shorter than every tier is released when due: it may sit
        // behind the tier's head for at most that tier's delay.
        let target = Target::Retry {
            topic: tier.topic.clone(),
            not_before_unix_ms: due,
            release_at_unix_ms: due.min(now.saturating_add(ceil_ms(tier.delay))),
        };
        self.write_pending(p, target);
    }

    pub(super) fn write_pending(&mut self, p: Pending, target: Target) {
        let Pending {
            job,
            origin,
            original,
            attempts,
            bytes,
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
        if !self.deps.source.owns(&origin) {
            // Written by the partition's new owner, if at all.
            self.memory.remove(bytes);
            return RevokedWorkDropped {
                jobs: 1,
                stage: "write",
            }
            .emit();
        }
        let (job_id, seller) = named.map_or((None, None), |n| (Some(n.job_id), Some(n.seller)));
        let pending = PendingWrite {
            bytes,
            origin,
            original,
            job_id,
            seller,
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
        let key: Arc<str> = Arc::from(p.job.seller_id.as_str());
        let at = after(self.deps.clock.now(), wait);
        self.sellers.entry(&key).delayed.push((at, p));
        self.timers.at(at, Timer::Seller(key));
    }

    /// The broker refused a copy as too large (`message.max.bytes`, or the
    /// topic's `max.message.bytes`): writing it again would fail forever and
    /// hold its partition's commit. A dead letter goes without its payload,
    /// keeping its reason and original coordinates; a job bound for a retry
    /// tier is parsed again and waits in memory until it is due.
    fn on_too_large(&mut self, mut pending: PendingWrite, topic: &str, error: &str) {
        let bytes = pending.original.value.len();
        let fallback = match &pending.target {
            Target::DeadLetter { .. } if pending.with_value => "dead_letter_without_payload",
            Target::Retry { .. } => "kept_in_memory",
            // Even without its value the copy is too large (its key): the
            // broker's limit is below any record; keep trying, loudly.
            Target::DeadLetter { .. } => return self.retry_write(pending, error),
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
        match &mut pending.target {
            Target::DeadLetter { reason, .. } => {
                reason.push_str(&format!(
                    "; dead-lettered without its payload: the record ({bytes} bytes) is too large for {topic}, it stays at its original position"
                ));
                pending.with_value = false;
                self.spawn_write(pending, Duration::ZERO);
            }
            Target::Retry {
                not_before_unix_ms, ..
            } => {
                let wait = until_ms(self.fleet_ms(), *not_before_unix_ms);
                let PendingWrite {
                    bytes,
                    origin,
                    original,
                    attempts,
                    ..
                } = pending;
                match Job::parse_shared(&original.value, &self.settings.worker) {
                    Ok(job) => {
                        let p = Pending {
                            job: job.traced(&original.trace),
                            origin,
                            original,
                            attempts,
                            bytes,
                            received_at: self.deps.clock.now(),
                            last_failed_at: None,
                            failures_in_a_row: 0,
                            too_large_to_copy: true,
                            lease: None,
                        };
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
        if self.deps.source.owns(&pending.origin) {
            self.spawn_write(pending, Duration::from_secs(1));
        } else {
            self.memory.remove(pending.bytes);
        }
    }

    fn spawn_write(&mut self, pending: PendingWrite, delay: Duration) {
        let (writer, tx) = (self.deps.writer.clone(), self.tx.clone());
        let dlq_topic = self.settings.kafka.dlq_topic.clone();
        self.tasks += 1;
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
                if self.deps.source.owns(&pending.origin) =>
            {
                self.on_too_large(pending, &topic, &reason)
            }
            Err(error) => self.retry_write(pending, &error.to_string()),
        }
    }
}
