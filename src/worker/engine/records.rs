//! A record from the consumer: parsed, then parked (a retry-tier record
//! not yet released), delayed until due, or queued behind its seller's
//! jobs, as `super::super::arrival` decides; an unreadable one is
//! dead-lettered with its reason.

use std::sync::Arc;

use crate::dead_letter::DeadLetterKind;
use crate::job::Job;
use crate::kafka::consumer::{Record, TopicPartition};
use crate::telemetry::events::{CallAvoided, OrderingKeyMissing, RecordReceived};

use super::super::arrival::{self, Arrival, TakeUp, Unparked};
use super::super::memory;
use super::super::ordering::{KeyFrom, Read};
use super::super::pending::Pending;
use super::super::ports::{Clock, Ports, Source};
use super::super::tiers::{Parked, Target};
use super::super::timers::Timer;
use super::Engine;

impl<X: Ports> Engine<X> {
    pub(super) fn on_record(&mut self, rec: Record) {
        if !self.deps.source.may_start(&rec.origin) {
            // Received before its partition was revoked (or as its revoke
            // began), taken after: the new owner has it.
            return;
        }
        RecordReceived.emit();
        let bytes = memory::weight(rec.original.key.as_deref(), &rec.original.value);
        self.memory.add(bytes);
        let headers = match rec.headers {
            Ok(h) => h,
            Err(e) => {
                let reason = format!("unreadable worker header: {e}");
                let kind = DeadLetterKind::UnreadableHeaders.name();
                let target = Target::DeadLetter { kind, reason };
                return self.write(bytes, rec.origin, rec.original, None, 0, target);
            }
        };
        let job = match Job::parse_shared(&rec.original.value, &self.settings.worker) {
            Ok(job) => job.traced(&rec.original.trace),
            Err(e) => {
                let (kind, reason) = (e.kind(), e.to_string());
                let target = Target::DeadLetter { kind, reason };
                let attempts = headers.attempts;
                return self.write(bytes, rec.origin, rec.original, None, attempts, target);
            }
        };
        let now = self.deps.clock.now();
        let (lane, from) = self.ordering.lane(Read {
            origin: &rec.original.origin,
            record_key: rec.original.key.as_deref(),
            header: rec.ordering_header.as_deref(),
            value: &rec.original.value,
        });
        if matches!(from, KeyFrom::RecordKey | KeyFrom::Partition) {
            OrderingKeyMissing { by: from.label() }.emit();
        }
        let pending =
            Pending::new(job, rec.origin, rec.original, headers.attempts, bytes, now).in_lane(lane);
        let now_ms = self.fleet_ms();
        let (release, topic) = (headers.release_at_unix_ms, &pending.origin.topic);
        match arrival::arrival(release, now_ms, |ms| self.tiers.holds_at_most(topic, ms)) {
            Arrival::Park { release_at } => self.park(Parked {
                release_at_unix_ms: release_at,
                not_before_unix_ms: headers.not_before_unix_ms,
                pending,
            }),
            Arrival::TakeUp => self.take_up(pending, headers.not_before_unix_ms),
        }
    }

    /// A retry-tier record taken up (or a fresh one): run when due
    /// ([`arrival::take_up`]).
    fn take_up(&mut self, pending: Pending, not_before: Option<u64>) {
        let (now_ms, now) = (self.fleet_ms(), self.deps.clock.now());
        let max_inline = self.settings.worker.max_inline_delay;
        match arrival::take_up(not_before, now_ms, now, max_inline) {
            TakeUp::Queue => self.enqueue(pending),
            TakeUp::Defer { wait } => self.defer(pending, wait),
            TakeUp::Delay { at } => self.delay(pending, at),
        }
    }

    /// A job waiting in memory until `at`, then queued first.
    pub(super) fn delay(&mut self, pending: Pending, at: tokio::time::Instant) {
        let key: Arc<str> = Arc::from(pending.job.seller_id.as_str());
        self.scheduler.delay(&key, at, pending);
        self.timers.at(at, Timer::Seller(key));
    }

    /// A job ready to run: queued behind its seller's others, or sent to
    /// the retry topic when its seller is held for longer than
    /// `worker.max_inline_delay`.
    fn enqueue(&mut self, pending: Pending) {
        let now = self.deps.clock.now();
        let max_inline = self.settings.worker.max_inline_delay;
        let key: Arc<str> = Arc::from(pending.job.seller_id.as_str());
        let queued = self.scheduler.enqueue(&key, pending, now, max_inline);
        if queued.held {
            CallAvoided { seller: &key }.emit();
        }
        match queued.defer {
            Some((pending, wait)) => self.defer(pending, wait),
            None => self.ask_if_ready(&key),
        }
    }

    /// A retry-tier record not yet released: hold it and pause its
    /// partition, so that waiting neither spins nor holds up other
    /// partitions.
    fn park(&mut self, parked: Parked) {
        if let Some((part, release)) = self.tiers.park(parked) {
            self.deps.source.pause(std::slice::from_ref(&part));
            let at = arrival::wake_at(release, self.fleet_ms(), self.deps.clock.now());
            self.timers
                .at(at, Timer::Parked(part.topic, part.partition));
        }
    }

    /// A parked partition's timer: its due records are taken up; it stays
    /// paused while it holds any.
    pub(super) fn unpark(&mut self, part: TopicPartition) {
        let now_ms = self.fleet_ms();
        let unparked = self.tiers.unpark(&part, now_ms);
        let (now, paused) = (self.deps.clock.now(), self.memory.is_paused());
        match arrival::unparked(unparked.next_release, now_ms, now, paused) {
            Unparked::WakeAt { at } => {
                self.timers
                    .at(at, Timer::Parked(part.topic.clone(), part.partition));
            }
            Unparked::Resume => self.deps.source.resume(std::slice::from_ref(&part)),
            Unparked::StayPaused => {}
        }
        for p in unparked.released {
            self.take_up(p.pending, p.not_before_unix_ms);
        }
    }
}
