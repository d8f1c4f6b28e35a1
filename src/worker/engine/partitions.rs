//! Partitions as the engine sees them: assignments and revokes (a revoke
//! waits for its partitions' work under way, `super::super::handoff`), moving a
//! head that holds its partition's commit back (`unstick`), pausing every
//! partition when memory is full (backpressure), and the backlog gauges.

use std::time::Duration;

use crate::kafka::consumer::{Origin, PartitionEvent, TopicPartition};
use crate::kafka::record::Quiet;
use crate::telemetry::events::{
    Backlog, Backpressure, HeadMoved, PartitionsAssigned, RevokedJobsDropped, SellerWaits, WaitRow,
};

use super::super::memory::Pressure;
use super::super::pending::Pending;
use super::super::ports::{Clock, Permits, Ports, Source};
use super::super::waits;
use super::Engine;

impl<X: Ports> Engine<X> {
    pub(super) fn on_partitions(&mut self, ev: PartitionEvent) {
        match ev {
            PartitionEvent::Assigned(parts) => self.on_assigned(parts),
            PartitionEvent::Revoking { parts, quiet } => self.on_revoking(parts, quiet),
            PartitionEvent::Revoked(parts) => self.on_revoked(parts),
        }
    }

    /// A revoke begins: what waits of its partitions goes to the next
    /// owner now, uncommitted; the calls and writes under way finish, and
    /// the revoke is told once none is left ([`Engine::settle_revokes`]).
    fn on_revoking(&mut self, parts: Vec<TopicPartition>, quiet: Quiet) {
        let source = self.deps.source.clone();
        self.drop_waiting(&parts, &|o: &Origin| source.may_start(o));
        let now = self.deps.clock.now();
        self.handoff.begin(parts, quiet, now);
        self.settle_revokes();
    }

    /// Tells each revoke whose partitions have no work under way left
    /// that it may commit.
    pub(super) fn settle_revokes(&mut self) {
        let now = self.deps.clock.now();
        for settled in self.handoff.settled(now) {
            tracing::debug!(
                partitions = settled.parts.len(),
                waited_ms = settled.waited.as_millis() as u64,
                "revoking partitions' work under way ended"
            );
            settled.quiet.signal();
        }
    }

    /// Drops what waits of `parts` (the jobs `keep` refuses, the records
    /// parked on their tiers), uncommitted: the new owner has those records.
    fn drop_waiting(&mut self, parts: &[TopicPartition], keep: &dyn Fn(&Origin) -> bool) {
        let mut dropped = self.scheduler.revoke(keep);
        dropped.extend(self.tiers.revoke(parts));
        for bytes in &dropped {
            self.memory.remove(*bytes);
        }
        RevokedJobsDropped {
            partitions: parts.len(),
            jobs: dropped.len(),
        }
        .emit();
    }

    fn on_assigned(&mut self, parts: Vec<TopicPartition>) {
        self.deps.health.set_joined();
        self.partitions.assign(&parts);
        PartitionsAssigned {
            partitions: parts.len(),
        }
        .emit();
        // An assignment starts unpaused as far as librdkafka knows, but a
        // pause of ours from before a revoke may linger: set each partition
        // to what the worker wants now.
        if self.memory.is_paused() {
            self.deps.source.pause(&parts);
        } else {
            let parts: Vec<TopicPartition> =
                parts.into_iter().filter(|p| !self.tiers.holds(p)).collect();
            self.deps.source.resume(&parts);
        }
    }

    /// The revoke is over: its partitions are gone. What still waits of
    /// them is dropped (nothing, after a wait); work under way past the
    /// wait's bound is checked when it ends, and dropped.
    fn on_revoked(&mut self, parts: Vec<TopicPartition>) {
        self.partitions.revoke(&parts);
        self.handoff.revoked(&parts);
        let source = self.deps.source.clone();
        self.drop_waiting(&parts, &|o: &Origin| source.owns(o));
    }

    /// Sets the backlog gauges: jobs waiting by cause, in flight, parked,
    /// bytes and partitions.
    pub(super) fn report_backlog(&self) {
        let now = self.deps.clock.now();
        let waiting = self.scheduler.waiting_by_cause(now);
        let assigned = self.deps.source.assignment().len();
        let paused = if self.memory.is_paused() {
            assigned
        } else {
            self.tiers.partitions()
        };
        let permits = self.deps.permits.clone();
        let rules = |seller: &str| {
            permits.rules_of(seller).map(|(mut own, global)| {
                own.extend(global);
                own
            })
        };
        let down = waits::Downstream {
            outage: self.outage.is_open(),
            limited: self.scheduler.concurrency() < self.settings.downstream.concurrency,
        };
        let waits = waits::waits(self.scheduler.seen(now), now, down, &rules);
        let rows: Vec<WaitRow<'_>> = waits
            .iter()
            .map(|w| WaitRow {
                seller: &w.seller,
                jobs: w.jobs,
                units: w.units,
                oldest: w.oldest,
                drain: w.drain,
                held_by: w.held_by.label(),
            })
            .collect();
        SellerWaits { rows: &rows }.emit();
        Backlog {
            waiting: &waiting,
            in_flight: self.scheduler.in_flight(),
            parked: self.tiers.records(),
            bytes: self.memory.bytes(),
            assigned,
            paused,
        }
        .emit();
    }

    /// A partition commits only up to its first unfinished record. When
    /// that record has waited in memory longer than `worker.max_head_wait`
    /// while later ones finished, or holds back more than
    /// `worker.max_finished_ahead` of them, it goes round the retry topic
    /// (keeping its due time), so the partition commits past it: the offset
    /// tracker and the commit metadata stay bounded, and a crash does not
    /// redo hours of finished work. Records in flight are left alone.
    pub(super) fn unstick(&mut self) {
        let held = self.deps.source.held_back();
        if held.is_empty() {
            return;
        }
        let w = &self.settings.worker;
        let (max_wait, max_ahead) = (w.max_head_wait, w.max_finished_ahead);
        let now = self.deps.clock.now();
        let stuck = |p: &Pending| {
            held.iter().any(|h| {
                h.offset == p.origin.offset
                    && h.partition.partition == p.origin.partition
                    && *h.partition.topic == *p.origin.topic
                    && (h.finished_behind >= max_ahead
                        || now.saturating_duration_since(p.received_at) >= max_wait)
            })
        };
        let moved: Vec<(Pending, Duration)> = self.scheduler.take_stuck(now, &stuck);
        for (p, wait) in moved {
            HeadMoved {
                job_id: &p.job.job_id,
                partition: p.origin.partition,
                offset: p.origin.offset,
                waited: now.saturating_duration_since(p.received_at),
            }
            .emit();
            self.defer(p, wait);
        }
    }

    /// Pauses every partition at `worker.max_buffered` jobs or
    /// `worker.max_buffered_bytes` in memory and resumes below 90 % of both.
    pub(super) fn backpressure(&mut self) {
        let Some(pressure) = self.memory.pressure() else {
            return;
        };
        let paused = pressure == Pressure::Pause;
        let assigned = self.deps.source.assignment();
        if paused {
            self.deps.source.pause(&assigned);
        } else {
            let parts: Vec<TopicPartition> = assigned
                .into_iter()
                .filter(|p| !self.tiers.holds(p))
                .collect();
            self.deps.source.resume(&parts);
        }
        Backpressure {
            paused,
            buffered: self.memory.jobs(),
            bytes: self.memory.bytes(),
        }
        .emit();
    }
}
