//! Partitions as the engine sees them: assignments and revokes, moving a
//! head that holds its partition's commit back (`unstick`), pausing every
//! partition when memory is full (backpressure), and the backlog gauges.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use crate::kafka::consumer::{PartitionEvent, TopicPartition};
use crate::telemetry::events::{
    Backlog, Backpressure, HeadMoved, PartitionsAssigned, RevokedJobsDropped,
};

use super::engine::{Engine, Pending};
use super::memory::Pressure;
use super::ports::{Clock, Ports, Source};

/// The jobs topic's partitions held here.
#[derive(Debug, Default)]
pub(super) struct Partitions {
    /// Partitions of the jobs topic assigned here: this replica's share of
    /// a limit under `redis.on_error = "local"` is their fraction.
    pub(super) jobs_assigned: BTreeSet<i32>,
}

impl<X: Ports> Engine<X> {
    pub(super) fn on_partitions(&mut self, ev: PartitionEvent) {
        match ev {
            PartitionEvent::Assigned(parts) => self.on_assigned(parts),
            PartitionEvent::Revoked(parts) => self.on_revoked(parts),
        }
    }

    fn on_assigned(&mut self, parts: Vec<TopicPartition>) {
        self.deps.health.set_joined();
        let jobs_topic = &self.settings.kafka.topic;
        self.partitions.jobs_assigned.extend(
            parts
                .iter()
                .filter(|tp| *tp.topic == **jobs_topic)
                .map(|tp| tp.partition),
        );
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
            let parts: Vec<TopicPartition> = parts
                .into_iter()
                .filter(|p| !self.retry.parked.contains_key(p))
                .collect();
            self.deps.source.resume(&parts);
        }
    }

    /// Drops what waits of revoked partitions, uncommitted: the new owner
    /// has those records. (Work already under way is checked when it ends.)
    fn on_revoked(&mut self, parts: Vec<TopicPartition>) {
        let jobs_topic = &self.settings.kafka.topic;
        for tp in &parts {
            if *tp.topic == **jobs_topic {
                self.partitions.jobs_assigned.remove(&tp.partition);
            }
        }
        let source = self.deps.source.clone();
        let mut dropped: Vec<usize> = Vec::new();
        for seller in self.sellers.map.values_mut() {
            seller.queue.retain(|p| {
                let keep = source.owns(&p.origin);
                if !keep {
                    dropped.push(p.bytes);
                }
                keep
            });
            seller.delayed.retain(|(_, p)| {
                let keep = source.owns(&p.origin);
                if !keep {
                    dropped.push(p.bytes);
                }
                keep
            });
            seller.paced.retain(|q| {
                let keep = source.owns(&q.pending.origin);
                if !keep {
                    dropped.push(q.pending.bytes);
                }
                keep
            });
            seller.settle_phase();
        }
        for part in &parts {
            if let Some(q) = self.retry.parked.remove(part) {
                dropped.extend(q.iter().map(|p| p.pending.bytes));
            }
        }
        for bytes in &dropped {
            self.memory.remove(*bytes);
        }
        self.sellers.map.retain(|_, s| !s.is_empty());
        RevokedJobsDropped {
            partitions: parts.len(),
            jobs: dropped.len(),
        }
        .emit();
    }

    /// Sets the backlog gauges: jobs waiting by cause (a seller refused
    /// until later is limit-bound, unless every slot of its max_in_flight
    /// is taken; one free to go waits for capacity), in
    /// flight, parked, bytes and partitions.
    pub(super) fn report_backlog(&self) {
        let now = self.deps.clock.now();
        let mut waiting: HashMap<(&'static str, Arc<str>), i64> = HashMap::new();
        for (key, seller) in &self.sellers.map {
            let n = (seller.queue.len() + seller.delayed.len()) as i64;
            if n == 0 {
                continue;
            }
            let held = seller.blocked_until.is_some_and(|t| t > now);
            let cause = if held && seller.paused_since.is_some() {
                "paused"
            } else if held && !seller.in_flight_bound {
                "limit"
            } else {
                "capacity"
            };
            *waiting.entry((cause, key.clone())).or_default() += n;
        }
        // Granted jobs of a pacer wait for their unit's instant: the limit's.
        for (key, seller) in &self.sellers.map {
            if !seller.paced.is_empty() {
                *waiting.entry(("limit", key.clone())).or_default() += seller.paced.len() as i64;
            }
        }
        let assigned = self.deps.source.assignment().len();
        let paused = if self.memory.is_paused() {
            assigned
        } else {
            self.retry.parked.len()
        };
        Backlog {
            waiting: &waiting,
            in_flight: self.settings.downstream.concurrency - self.sellers.slots_free,
            parked: self.retry.parked.values().map(VecDeque::len).sum(),
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
        let mut moved: Vec<(Pending, Duration)> = Vec::new();
        for seller in self.sellers.map.values_mut() {
            let blocked = seller
                .blocked_until
                .map_or(Duration::ZERO, |t| t.saturating_duration_since(now));
            let mut i = 0;
            while i < seller.queue.len() {
                if stuck(&seller.queue[i]) {
                    moved.extend(seller.queue.remove(i).map(|p| (p, blocked)));
                } else {
                    i += 1;
                }
            }
            let mut i = 0;
            while i < seller.delayed.len() {
                if stuck(&seller.delayed[i].1) {
                    let (at, p) = seller.delayed.swap_remove(i);
                    moved.push((p, at.saturating_duration_since(now)));
                } else {
                    i += 1;
                }
            }
        }
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
                .filter(|p| !self.retry.parked.contains_key(p))
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
