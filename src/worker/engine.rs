//! The worker's event loop: one task owns every seller's queue, the timers,
//! the parked retry-tier records and the count of jobs in memory. Limiter
//! calls, downstream runs and Kafka writes run in tasks of their own and
//! report back through one channel, so no state is shared but what the
//! ports hold (the offset tracker, which the rebalance callback needs).
//!
//! This file owns the loop, the dispatch of events and the drain at
//! shutdown. The rest of the engine is split by concept, each file owning
//! its state:
//! - [`super::sellers`]: queues, the slot pool and capacity turns;
//! - [`super::admit`]: limiter answers and the failure policy;
//! - [`super::run`]: downstream runs, pacing and 429 holds;
//! - [`super::retry`]: parking, deferral, and retry/DLQ writes;
//! - [`super::partitions`]: rebalances, `unstick`, backpressure, gauges;
//! - [`super::outage`]: a downstream outage told from a job's failure;
//! - [`super::timers`]: the timer heap and saturating time arithmetic.
//!
//! The engine reaches its world only through [`super::ports`]: no wall
//! clock read and no client type here, so the simulation
//! (`tests/sim/engine.rs`) runs this code as it is.

use std::collections::VecDeque;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::SeedableRng;
use tokio::sync::mpsc;
use tokio::time::{sleep_until, Instant};

use crate::config::Settings;
use crate::downstream::Answer;
use crate::job::Job;
use crate::kafka::consumer::{Origin, PartitionEvent, Record, TopicPartition};
use crate::kafka::OriginalRecord;
use crate::limiter::BatchDecision;
use crate::telemetry::events::RecordReceived;
use crate::telemetry::http::Health;

use super::admit::Admission;
use super::memory::{self, Memory};
use super::outage::Outage;
use super::partitions::Partitions;
use super::ports::{Clock, CommitError, PermitError, Ports, Source, WriteError};
use super::retry::{Parked, PendingWrite, Retry, Target};
use super::run::Throttle;
use super::sellers::Sellers;
use super::slots::{FleetSlots, Lease};
use super::timers::{after, Timer, Timers};

/// How long shutdown waits for the broker to acknowledge the final commit.
const FINAL_COMMIT_TIMEOUT: Duration = Duration::from_secs(10);

/// The pause before a refused final commit is tried again.
const FINAL_COMMIT_RETRY: Duration = Duration::from_millis(200);

/// A job in memory, with everything needed to finish its record.
#[derive(Debug)]
pub struct Pending {
    pub job: Job,
    pub origin: Origin,
    pub original: OriginalRecord,
    /// Downstream calls made so far, across retry-topic round trips.
    pub attempts: u32,
    /// What it holds in memory ([`memory::weight`]).
    pub bytes: usize,
    /// When this worker took the record (how long a partition's head waits).
    pub received_at: Instant,
    /// When its latest failed call came back (none since an answer or an
    /// outage hold): a call that reaches nothing spends an attempt only if
    /// the downstream answered another call since.
    pub last_failed_at: Option<Instant>,
    /// Failed calls in a row (spent attempts or not): the backoff grows
    /// with them, so a job that spends no attempt still backs off.
    pub failures_in_a_row: u32,
    /// The broker refused its retry copy as too large: it waits in memory
    /// instead of on a retry tier.
    pub too_large_to_copy: bool,
    /// Its slot of the seller's `max_in_flight`, from its grant until its
    /// call is answered or will not be made (`None`: uncapped, or not
    /// granted).
    pub lease: Option<Lease>,
}

/// What the spawned tasks report.
pub(super) enum Event {
    Permit {
        seller: Arc<str>,
        result: Result<BatchDecision, PermitError>,
        /// When the answer reached this process: waits count from here,
        /// so they are never early whatever the clocks say.
        answered_at: Instant,
    },
    Called {
        seller: Arc<str>,
        pending: Pending,
        outcome: Answer,
    },
    /// A chain of a run will not call its last `slots` jobs.
    ChainStopped { seller: Arc<str>, slots: usize },
    RunEnded {
        seller: Arc<str>,
        /// Jobs the run did not get to, in order (after a 429).
        unused: Vec<Pending>,
        /// The 429s that stopped it.
        throttled: Vec<Throttle>,
    },
    Written {
        pending: PendingWrite,
        result: Result<(), WriteError>,
    },
}

/// The worker's dependencies: its ports and the channels the consumer
/// feeds.
pub struct Deps<X: Ports> {
    pub permits: Arc<X::Permits>,
    pub caller: Arc<X::Caller>,
    pub writer: Arc<X::Writer>,
    pub source: Arc<X::Source>,
    pub clock: Arc<X::Clock>,
    /// Records from the consumer.
    pub records: mpsc::Receiver<Record>,
    pub partitions: mpsc::UnboundedReceiver<PartitionEvent>,
    /// Readiness: Redis is reported down after `redis.unready_after`
    /// failed limiter calls in a row.
    pub health: Health,
    /// Partitions of the jobs topic: this replica's share of a limit under
    /// `redis.on_error = "local"` is the fraction of them it holds.
    pub jobs_partitions: usize,
    /// Seeds the jitter of every backoff (random in production, the run's
    /// seed in the simulation).
    pub seed: u64,
}

/// What a run of the worker did, for the caller and for tests.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Summary {
    /// In-flight work that did not finish within `worker.shutdown_timeout`.
    pub abandoned: usize,
    /// Partitions committed on shutdown.
    pub committed_partitions: usize,
    /// Jobs waiting (queued, delayed, paced) and records parked on a retry
    /// tier when the shutdown began: left uncommitted for the next owner.
    /// Work under way is not counted (the drain awaits it). Once a fleet
    /// has finished every job and read every record, both are 0.
    pub waiting_at_stop: usize,
    pub parked_at_stop: usize,
}

pub struct Engine<X: Ports> {
    pub(super) settings: Arc<Settings>,
    pub(super) deps: Deps<X>,
    pub(super) sellers: Sellers,
    pub(super) admission: Admission<X::Clock>,
    pub(super) retry: Retry,
    pub(super) partitions: Partitions,
    pub(super) outage: Outage,
    pub(super) timers: Timers,
    /// Jobs and bytes in memory: waiting, delayed, parked, running, being
    /// written; fetching pauses at `worker.max_buffered` or
    /// `worker.max_buffered_bytes`.
    pub(super) memory: Memory,
    /// Spawned runs, limiter calls and writes not yet reported back.
    pub(super) tasks: usize,
    pub(super) rng: StdRng,
    pub(super) tx: mpsc::UnboundedSender<Event>,
    rx: mpsc::UnboundedReceiver<Event>,
    /// Slots of capped sellers' `max_in_flight` held by granted jobs.
    pub(super) slots: FleetSlots,
}

impl<X: Ports> Engine<X> {
    pub fn new(settings: Arc<Settings>, deps: Deps<X>) -> Engine<X> {
        let (tx, rx) = mpsc::unbounded_channel();
        Engine {
            sellers: Sellers::new(settings.downstream.concurrency),
            admission: Admission::new(&settings, deps.clock.clone()),
            retry: Retry::new(&settings),
            partitions: Partitions::default(),
            outage: Outage::new(&settings.downstream),
            timers: Timers::default(),
            memory: Memory::new(
                settings.worker.max_buffered,
                settings.worker.max_buffered_bytes,
            ),
            tasks: 0,
            rng: StdRng::seed_from_u64(deps.seed),
            settings,
            deps,
            tx,
            rx,
            slots: FleetSlots::new(),
        }
    }

    /// Runs until `shutdown` resolves, then drains in-flight work (within
    /// `worker.shutdown_timeout`) and commits synchronously.
    pub async fn run(mut self, shutdown: impl Future<Output = ()>) -> Summary {
        tokio::pin!(shutdown);
        self.slots.start(self.deps.permits.clone());
        let mut commit = tokio::time::interval(self.settings.kafka.commit_interval);
        commit.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let next = self.timers.next();
            let far = after(self.deps.clock.now(), Duration::from_secs(3600));
            tokio::select! {
                biased;
                _ = &mut shutdown => break,
                Some(ev) = self.rx.recv() => self.on_event(ev),
                Some(pe) = self.deps.partitions.recv() => self.on_partitions(pe),
                _ = sleep_until(next.unwrap_or(far)), if next.is_some() => self.on_timers(),
                // Done on the consumer's poll thread, acknowledged there.
                _ = commit.tick() => {
                    self.unstick();
                    self.deps.source.request_commit();
                    self.report_backlog();
                    self.deps.health.beat();
                }
                Some(rec) = self.deps.records.recv() => self.on_record(rec),
            }
            self.backpressure();
        }
        self.drain().await
    }

    async fn drain(mut self) -> Summary {
        // No more records: the consumer stops handing them over (and keeps
        // serving the final commit).
        self.deps.records.close();
        tracing::info!(
            in_flight = self.tasks,
            "shutting down: no new records; waiting for in-flight work"
        );
        let waiting_at_stop = self
            .sellers
            .map
            .values()
            .map(|s| s.queue.len() + s.delayed.len() + s.paced.len())
            .sum();
        let parked_at_stop = self.retry.parked.values().map(VecDeque::len).sum();
        // Waiting jobs stay uncommitted: whoever owns their partitions next
        // gets them. Only work already under way is awaited.
        for seller in self.sellers.map.values_mut() {
            seller.queue.clear();
            seller.delayed.clear();
            seller.paced.clear();
        }
        self.retry.parked.clear();
        let deadline = after(self.deps.clock.now(), self.settings.worker.shutdown_timeout);
        while self.tasks > 0 {
            match tokio::time::timeout_at(deadline, self.rx.recv()).await {
                Ok(Some(ev)) => self.on_event_draining(ev),
                Ok(None) | Err(_) => break,
            }
        }
        let abandoned = self.tasks;
        if abandoned > 0 {
            tracing::warn!(
                abandoned,
                "shutdown timeout: in-flight work abandoned, its records stay uncommitted"
            );
        }
        let committed_partitions = self.commit_all().await;
        // Work abandoned above still holds its leases: they lapse.
        self.sellers.map.clear();
        self.slots.finish().await;
        Summary {
            abandoned,
            committed_partitions,
            waiting_at_stop,
            parked_at_stop,
        }
    }

    fn on_event_draining(&mut self, ev: Event) {
        match ev {
            Event::RunEnded { unused, .. } => {
                self.tasks -= 1;
                for p in &unused {
                    self.memory.remove(p.bytes);
                }
            }
            Event::Permit { seller, result, .. } => {
                self.tasks -= 1;
                // Not used: the slots it took go back now.
                if let Ok(BatchDecision::Granted(g)) = result {
                    drop(self.slots.hold(&seller, g.leases));
                }
            }
            other => self.on_event(other),
        }
    }

    fn on_event(&mut self, ev: Event) {
        match ev {
            Event::Permit {
                seller,
                result,
                answered_at,
            } => {
                self.tasks -= 1;
                self.on_permit(seller, result, answered_at);
            }
            Event::Called {
                seller,
                pending,
                outcome,
            } => self.on_called(seller, pending, outcome),
            Event::ChainStopped { seller, slots } => self.on_chain_stopped(&seller, slots),
            Event::RunEnded {
                seller,
                unused,
                throttled,
            } => {
                self.tasks -= 1;
                self.on_run_ended(seller, unused, throttled);
            }
            Event::Written { pending, result } => {
                self.tasks -= 1;
                self.on_written(pending, result);
            }
        }
    }

    fn on_timers(&mut self) {
        for timer in self.timers.due(self.deps.clock.now()) {
            match timer {
                Timer::Seller(key) => self.ask_if_ready(&key),
                Timer::Parked(topic, partition) => self.unpark(TopicPartition { topic, partition }),
                Timer::Paced(key) => self.call_paced(&key),
            }
        }
    }

    /// A record from the consumer: parsed, then parked (a retry-tier record
    /// not yet released), delayed, or queued behind its seller's jobs. An
    /// unreadable one is dead-lettered with its reason.
    fn on_record(&mut self, rec: Record) {
        if !self.deps.source.owns(&rec.origin) {
            // Received before its partition was revoked, taken after: the
            // new owner has it.
            return;
        }
        RecordReceived.emit();
        let bytes = memory::weight(rec.original.key.as_deref(), &rec.original.value);
        self.memory.add(bytes);
        let headers = match rec.headers {
            Ok(h) => h,
            Err(e) => {
                let reason = format!("unreadable worker header: {e}");
                let kind = "unreadable_headers";
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
        let pending = Pending {
            job,
            origin: rec.origin,
            original: rec.original,
            attempts: headers.attempts,
            bytes,
            received_at: self.deps.clock.now(),
            last_failed_at: None,
            failures_in_a_row: 0,
            too_large_to_copy: false,
            lease: None,
        };
        let now = self.fleet_ms();
        match headers.release_at_unix_ms {
            // Held for its tier's delay. A release further off than the
            // tier's delay (a clock jump, a hand-written header) is not
            // trusted to hold the partition: the record is taken up now
            // and hops tiers by its due time instead.
            Some(release)
                if release > now
                    && self
                        .retry
                        .holds_at_most(&pending.origin.topic, release - now) =>
            {
                self.park(Parked {
                    release_at_unix_ms: release,
                    not_before_unix_ms: headers.not_before_unix_ms,
                    pending,
                })
            }
            _ => self.take_up(pending, headers.not_before_unix_ms),
        }
    }

    /// The fleet's wall clock in Unix ms ([`super::timers::fleet_ms`]).
    pub(super) fn fleet_ms(&self) -> u64 {
        super::timers::fleet_ms(&*self.deps.permits, &*self.deps.clock)
    }

    /// The final commit: every finished prefix, acknowledged by the broker
    /// (failures are counted and logged by the consumer). Returns how many
    /// partitions were committed. A commit the broker refuses is tried
    /// again until [`FINAL_COMMIT_TIMEOUT`]: one made while the group
    /// rebalances (a member joining or leaving as this one stops) is refused
    /// with `REBALANCE_IN_PROGRESS` or, once the generation moved on,
    /// `ILLEGAL_GENERATION`, and the same offsets go through once the
    /// rebalance is over (the consumer keeps polling meanwhile, which is
    /// what lets it end).
    async fn commit_all(&mut self) -> usize {
        let deadline = after(self.deps.clock.now(), FINAL_COMMIT_TIMEOUT);
        loop {
            let commit = self.deps.source.commit_all();
            match tokio::time::timeout_at(deadline, commit).await {
                Ok(Ok(n)) => return n,
                Ok(Err(CommitError::Refused(_)))
                    if after(self.deps.clock.now(), FINAL_COMMIT_RETRY) < deadline =>
                {
                    tokio::time::sleep(FINAL_COMMIT_RETRY).await;
                }
                Ok(Err(_)) => return 0,
                Err(_) => {
                    tracing::warn!(timeout = ?FINAL_COMMIT_TIMEOUT, "final commit got no answer in time; the next owner redoes the uncommitted records");
                    return 0;
                }
            }
        }
    }
}
