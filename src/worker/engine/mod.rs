//! The worker's event loop: one task owns every seller's queue, the timers,
//! the parked retry-tier records and the count of jobs in memory. Limiter
//! calls, downstream runs, Kafka writes and shared 429s run in tasks of
//! their own and report back through one channel, so no state is shared
//! but what the ports hold (the offset tracker, which the rebalance
//! callback needs), and the drain at shutdown awaits every task.
//!
//! The engine decides nothing itself: its components do, each owning its
//! state or none, with no I/O, no clock and no events
//! (`super::scheduler`, `super::admission`, `super::tiers`,
//! `super::outage`, `super::partitions`, [`super::memory`],
//! `super::timers`; `super::answers` for a downstream answer,
//! `super::arrival` for a record taken up, `super::paused` for a pause's
//! intervals, `super::oversize` for a copy too large to write). The
//! engine carries out what they say and reports what they say happened:
//! it alone touches the ports, reads the clock, spawns tasks, holds
//! channels and emits the events. Its files follow a job's path:
//! - this file: the loop, the dispatch of events, the slot turns;
//! - `records`: a record taken up, parked on its tier or queued;
//! - `ask`: limiter calls and their answers;
//! - `call`: downstream runs, paced calls, answers and 429s;
//! - `write`: retry-tier and dead-letter writes;
//! - `pause`: an operator's pause;
//! - `partitions`: rebalances, `unstick`, backpressure, gauges;
//! - `drain`: the shutdown.
//!
//! The engine reaches its world only through [`super::ports`]: no wall
//! clock read and no client type here, so the simulation
//! (`tests/sim/engine.rs`) runs this code as it is.

mod ask;
mod call;
mod drain;
mod partitions;
mod pause;
mod records;
mod write;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::SeedableRng;
use tokio::sync::mpsc;
use tokio::time::{sleep_until, Instant};

use crate::config::Settings;
use crate::downstream::Answer;
use crate::kafka::consumer::{PartitionEvent, Record, TopicPartition};
use crate::limiter::BatchDecision;
use crate::limiter::Learnt;
use crate::telemetry::events::{ConcurrencyConfigured, LimitLearnt};
use crate::telemetry::http::Health;

use super::admission::Admission;
use super::charges::FleetCharges;
use super::concurrency::{AdaptiveLimit, AdaptiveSettings};
use super::handoff::Handoff;
use super::memory::Memory;
use super::ordering::Ordering;
use super::outage::Outage;
use super::partitions::Partitions;
use super::pending::Pending;
use super::pool::Slots;
use super::ports::{Clock, PermitError, Ports, Source, WriteError};
use super::scheduler::Scheduler;
use super::slots::FleetSlots;
use super::tiers::RetryTiers;
use super::timers::{after, Timer, Timers};
use super::turns::Turn;

use call::{Throttle, Timing};
use write::PendingWrite;

/// What the spawned tasks report.
enum Event {
    Permit {
        seller: Arc<str>,
        result: Result<BatchDecision, PermitError>,
        /// When the answer reached this process: waits count from here,
        /// so they are never early whatever the clocks say.
        answered_at: Instant,
        /// When the ask left: the slots a grant took lapse one
        /// `limits.slot_lease` after an instant no earlier than this.
        asked_at: Instant,
    },
    Called {
        seller: Arc<str>,
        pending: Pending,
        outcome: Answer,
        timing: Timing,
    },
    /// A chain of a run will not call its last jobs: their slots, given
    /// back as this event is handled.
    ChainStopped { slots: Slots },
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
    /// A downstream 429 shared with the fleet through the limiter.
    Shared {
        seller: Arc<str>,
        result: Result<Option<Learnt>, PermitError>,
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
    /// Readiness: Redis is reported down after `redis.unready_after_failures`
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
    settings: Arc<Settings>,
    deps: Deps<X>,
    scheduler: Scheduler,
    admission: Admission<X::Clock>,
    tiers: RetryTiers,
    partitions: Partitions,
    outage: Outage,
    timers: Timers,
    /// Jobs and bytes in memory: waiting, delayed, parked, running, being
    /// written; fetching pauses at `worker.max_buffered` or
    /// `worker.max_buffered_bytes`.
    memory: Memory,
    /// Spawned tasks not yet reported back.
    tasks: usize,
    rng: StdRng,
    tx: mpsc::UnboundedSender<Event>,
    rx: mpsc::UnboundedReceiver<Event>,
    /// Slots of capped sellers' `max_in_flight` held by granted jobs.
    slots: FleetSlots,
    /// Units charged for granted jobs not yet called: a job dropped
    /// uncalled (a revoke, a shutdown) gives them back.
    charges: FleetCharges,
    /// The downstream's calls out at once, learnt from its answers
    /// (`downstream.adaptive_concurrency`); none: always
    /// `downstream.concurrency`.
    adaptive: Option<AdaptiveLimit>,
    /// Limiter asks of this turn of the loop, sent together at its end
    /// ([`Engine::flush_asks`]); counted in `tasks` already.
    asks: Vec<(Arc<str>, Vec<u64>)>,
    /// Which jobs go one at a time (`worker.ordering`): each job's lane.
    ordering: Ordering,
    /// Calls and writes under way per partition, and the revokes waiting
    /// for theirs.
    handoff: Handoff,
}

impl<X: Ports> Engine<X> {
    pub fn new(settings: Arc<Settings>, deps: Deps<X>) -> Engine<X> {
        let (tx, rx) = mpsc::unbounded_channel();
        let d = &settings.downstream;
        let adaptive = d.adaptive_concurrency.then(|| {
            AdaptiveLimit::new(AdaptiveSettings {
                floor: d.min_concurrency,
                ceiling: d.concurrency,
                latency_tolerance: d.latency_tolerance,
            })
        });
        let limit = adaptive
            .as_ref()
            .map_or(d.concurrency, AdaptiveLimit::slots);
        ConcurrencyConfigured {
            limit,
            ceiling: d.concurrency,
            adaptive: adaptive.is_some(),
        }
        .emit();
        let ordering = Ordering::from_settings(&settings.worker);
        Engine {
            adaptive,
            scheduler: Scheduler::new(d.concurrency, limit)
                .with_priority_aging(settings.worker.priority_aging),
            admission: Admission::new(&settings, deps.clock.clone()),
            tiers: RetryTiers::new(&settings),
            partitions: Partitions::new(&settings.kafka.topic, deps.jobs_partitions),
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
            charges: FleetCharges::new(),
            asks: Vec::new(),
            ordering,
            handoff: Handoff::default(),
        }
    }

    /// Runs until `shutdown` resolves, then drains in-flight work (within
    /// `worker.shutdown_timeout`) and commits synchronously.
    pub async fn run(mut self, shutdown: impl Future<Output = ()>) -> Summary {
        tokio::pin!(shutdown);
        self.slots.start(self.deps.permits.clone());
        self.charges.start(self.deps.permits.clone());
        let mut commit = tokio::time::interval(self.settings.kafka.commit_interval);
        commit.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let next = self.timers.next();
            let far = after(self.deps.clock.now(), Duration::from_secs(3600));
            tokio::select! {
                biased;
                _ = &mut shutdown => break,
                Some(ev) = self.rx.recv() => {
                    self.on_event(ev);
                    self.on_events_ready();
                }
                Some(pe) = self.deps.partitions.recv() => self.on_partitions(pe),
                _ = sleep_until(next.unwrap_or(far)), if next.is_some() => self.on_timers(),
                // Done on the consumer's poll thread, acknowledged there.
                _ = commit.tick() => {
                    self.unstick();
                    self.deps.source.request_commit();
                    self.report_backlog();
                    self.deps.health.beat();
                }
                Some(rec) = self.deps.records.recv() => {
                    self.on_record(rec);
                    self.on_records_ready();
                }
            }
            // Slots given back anywhere above go on in turn (the handlers
            // serve them at once; this is the loop's guarantee).
            self.serve_turns();
            self.backpressure();
            self.flush_asks();
            self.settle_revokes();
        }
        self.drain().await
    }

    fn on_event(&mut self, ev: Event) {
        match ev {
            Event::Permit {
                seller,
                result,
                answered_at,
                asked_at,
            } => {
                self.tasks -= 1;
                self.on_permit(seller, result, answered_at, asked_at);
            }
            Event::Called {
                seller,
                pending,
                outcome,
                timing,
            } => {
                self.handoff.ended(&pending.origin);
                self.on_called(seller, pending, outcome, timing)
            }
            // Handled: its slots are back; `serve_turns` hands them on.
            Event::ChainStopped { slots } => drop(slots),
            Event::RunEnded {
                seller,
                unused,
                throttled,
            } => {
                self.tasks -= 1;
                self.unused_ended(&unused);
                self.on_run_ended(seller, unused, throttled);
            }
            Event::Written { pending, result } => {
                self.tasks -= 1;
                self.handoff.ended(pending.origin());
                self.on_written(pending, result);
            }
            Event::Shared { seller, result } => {
                self.tasks -= 1;
                match result {
                    Ok(Some(learnt)) => LimitLearnt {
                        seller: &seller,
                        factor: learnt.factor(),
                        dropped: learnt.dropped,
                    }
                    .emit(),
                    Ok(None) => {}
                    Err(e) => {
                        tracing::warn!(error = %e, "could not share the downstream's 429 through Redis; other replicas learn it from their own calls");
                    }
                }
            }
        }
    }

    /// The tasks' reports already in, handled before the turns are
    /// served: answers that come together free their slots together, and
    /// the turns share them out at once rather than one by one, each to
    /// whoever waits at that instant. Bounded, so that the loop still
    /// looks at its other sources.
    fn on_events_ready(&mut self) {
        const MOST: usize = 256;
        for _ in 0..MOST {
            let Ok(ev) = self.rx.try_recv() else { break };
            self.on_event(ev);
        }
    }

    /// The records already handed over, taken in this turn too: the
    /// asks they make go to the limiter as one group at the turn's end
    /// (one record a turn made a limiter request per record). Bounded,
    /// so that the loop still looks at its other sources, and stopped at
    /// a memory bound (the loop then pauses fetching, as it did with one
    /// record a turn; the rest wait in the channel).
    fn on_records_ready(&mut self) {
        const MOST: usize = 64;
        for _ in 0..MOST {
            if self.memory.is_full() {
                break;
            }
            let Ok(rec) = self.deps.records.try_recv() else {
                break;
            };
            self.on_record(rec);
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

    /// Hands free downstream slots on, in turn: to paced jobs that are due
    /// first (granted already), then to sellers waiting to ask.
    fn serve_turns(&mut self) {
        while let Some(turn) = self.scheduler.next_turn() {
            match turn {
                Turn::Paced(key) => self.call_paced(&key),
                Turn::Ask(key) => self.ask_if_ready(&key),
            }
        }
    }

    /// The jobs a run did not call: no longer under way.
    fn unused_ended(&mut self, unused: &[Pending]) {
        for p in unused {
            self.handoff.ended(&p.origin);
        }
    }

    /// Gives `p`'s bytes back to memory: it is finished, or no longer ours.
    fn forget(&mut self, p: &Pending) {
        self.memory.remove(p.bytes);
    }

    /// The fleet's wall clock in Unix ms ([`super::timers::fleet_ms`]).
    fn fleet_ms(&self) -> u64 {
        super::timers::fleet_ms(&*self.deps.permits, &*self.deps.clock)
    }
}
