//! The worker's event loop: one task owns every seller's queue, the timers,
//! the parked retry-topic records and the count of jobs in memory. Limiter
//! calls, downstream runs and Kafka writes run in tasks of their own and
//! report back through one channel, so no state is shared but the offset
//! tracker (which the rebalance callback needs).
//!
//! A seller is in one phase at a time: idle, asking the limiter, or running
//! a granted batch. A run calls the downstream for its jobs one after the
//! other, so one seller's jobs reach the downstream in the order they came,
//! while every other seller runs beside it. A refused seller waits on a
//! timer and costs nothing until it is due; then one call asks for as many
//! units as jobs are waiting.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, HashSet, VecDeque};
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tokio::sync::mpsc;
use tokio::time::sleep_until;

use crate::config::{RetryTier, Settings};
use crate::downstream::{backoff, Answer, Downstream, RetryAfter};
use crate::job::Job;
use crate::kafka::consumer::{Consumer, Currency, Origin, Partition, PartitionEvent, Record};
use crate::kafka::{OriginalRecord, RecordSink};
use crate::limiter::local::{self, LocalShare};
use crate::limiter::{BatchDecision, BatchGranted, CannotPass, DeniedBy, NextJob, Pace};
use crate::telemetry::events::{
    Backlog, Backpressure, CallAvoided, DownstreamFailed, DownstreamThrottled, HeadMoved,
    JobDeadLettered, JobDeferred, JobDone, JobsAdmitted, LimiterCalled, LimiterNever,
    LimiterUnavailable, PartitionsAssigned, RecordReceived, RevokedJobsDropped, RevokedWorkDropped,
    SellerThrottled, SellerWaiting,
};
use crate::telemetry::http::Health;

use super::memory::{self, Memory, Pressure};
use super::permit::{OnLimiterError, Permits};

/// How long shutdown waits for the broker to acknowledge the final commit.
const FINAL_COMMIT_TIMEOUT: Duration = Duration::from_secs(10);

/// The most units one limiter call asks for.
const MAX_BATCH: usize = 64;

/// How deep into a seller's queue to look for the next job of each
/// partition; bounds the work per limiter call for a seller with a deep
/// backlog on few partitions.
const HEAD_SCAN: usize = 512;

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
}

/// What the spawned tasks report.
enum Event {
    Permit {
        seller: Arc<str>,
        result: Result<BatchDecision, String>,
        /// When the answer reached this process: waits count from here,
        /// so they are never early whatever the clocks say.
        answered_at: Instant,
    },
    Called {
        seller: Arc<str>,
        pending: Pending,
        outcome: Answer,
    },
    RunEnded {
        seller: Arc<str>,
        /// Jobs the run did not get to, in order (after a 429).
        unused: Vec<Pending>,
        throttled: Option<Duration>,
    },
    Written {
        pending: PendingWrite,
        result: Result<(), String>,
    },
}

/// A record to write to the retry topic or the dead-letter topic; the job
/// counts as finished only once the broker acknowledged it.
#[derive(Debug)]
struct PendingWrite {
    bytes: usize,
    origin: Origin,
    original: OriginalRecord,
    job_id: Option<String>,
    attempts: u32,
    target: Target,
}

#[derive(Debug, Clone)]
enum Target {
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

/// A retry-tier record held until its release time.
#[derive(Debug)]
struct Parked {
    release_at_unix_ms: u64,
    not_before_unix_ms: Option<u64>,
    pending: Pending,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Idle,
    Asking,
    Running,
}

/// One seller's jobs on this replica.
struct Seller {
    /// Waiting for a permit, in arrival order.
    queue: VecDeque<Pending>,
    /// Failed calls waiting out their backoff.
    delayed: Vec<(Instant, Pending)>,
    phase: Phase,
    /// Refused (by the limiter, a 429 or the failure policy) until then.
    blocked_until: Option<Instant>,
    /// Downstream slots held for the limiter call under way or the run.
    reserved: usize,
    /// In `capacity_waiters`: ready to ask, but every downstream slot is taken.
    wants_capacity: bool,
}

impl Seller {
    fn new() -> Seller {
        Seller {
            queue: VecDeque::new(),
            delayed: Vec::new(),
            phase: Phase::Idle,
            blocked_until: None,
            reserved: 0,
            wants_capacity: false,
        }
    }

    fn is_empty(&self) -> bool {
        self.queue.is_empty()
            && self.delayed.is_empty()
            && self.phase == Phase::Idle
            && !self.wants_capacity
    }
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Timer {
    Seller(Arc<str>),
    Parked(Arc<str>, i32),
}

/// The worker's dependencies.
pub struct Deps<P> {
    pub permits: Arc<P>,
    pub downstream: Arc<Downstream>,
    pub sink: Arc<RecordSink>,
    pub consumer: Arc<Consumer>,
    /// Records from the consumer's poll thread ([`Consumer::start`]).
    pub records: mpsc::Receiver<Record>,
    pub partitions: mpsc::UnboundedReceiver<PartitionEvent>,
    /// Readiness: Redis is reported down after `redis.unready_after`
    /// failed limiter calls in a row.
    pub health: Health,
    /// Partitions of the jobs topic: this replica's share of a limit under
    /// `redis.on_error = "local"` is the fraction of them it holds.
    pub jobs_partitions: usize,
}

/// What a run of the worker did, for the caller and for tests.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Summary {
    /// In-flight work that did not finish within `worker.shutdown_timeout`.
    pub abandoned: usize,
    /// Partitions committed on shutdown.
    pub committed_partitions: usize,
}

pub struct Engine<P> {
    settings: Arc<Settings>,
    deps: Deps<P>,
    on_limiter_error: OnLimiterError,
    /// Limiter calls failed in a row (0 after a success).
    limiter_failures: u32,
    /// The in-memory limits of `redis.on_error = "local"`, used only while
    /// Redis does not answer.
    local: LocalShare,
    /// Partitions of the jobs topic assigned here.
    jobs_assigned: HashSet<i32>,
    sellers: HashMap<Arc<str>, Seller>,
    timers: BinaryHeap<Reverse<(Instant, Timer)>>,
    /// Retry-tier records not yet released, per partition, in offset order
    /// (which is release order within a tier); the partition is paused
    /// while it has any.
    parked: HashMap<Partition, VecDeque<Parked>>,
    /// The retry tiers, shortest first, and each tier topic's delay.
    tiers: Vec<RetryTier>,
    tier_delay: HashMap<String, Duration>,
    /// Jobs and bytes in memory: waiting, delayed, parked, running, being
    /// written; fetching pauses at `worker.max_buffered` or
    /// `worker.max_buffered_bytes`.
    memory: Memory,
    /// Spawned runs, limiter calls and writes not yet reported back.
    tasks: usize,
    /// Downstream slots (of `downstream.concurrency`) not reserved. A seller
    /// asks the limiter only for as many units as it can call at once, so a
    /// grant is used right away: a grant that waited for capacity would
    /// reach the downstream late and bunch up with the next window's.
    slots_free: usize,
    /// Sellers ready to ask but waiting for a slot, served in turn.
    capacity_waiters: VecDeque<Arc<str>>,
    tx: mpsc::UnboundedSender<Event>,
    rx: mpsc::UnboundedReceiver<Event>,
}

impl<P: Permits> Engine<P> {
    pub fn new(settings: Arc<Settings>, deps: Deps<P>) -> Engine<P> {
        let (tx, rx) = mpsc::unbounded_channel();
        Engine {
            settings: settings.clone(),
            deps,
            on_limiter_error: OnLimiterError::from_setting(settings.redis.on_error),
            limiter_failures: 0,
            local: LocalShare::new(),
            jobs_assigned: HashSet::new(),
            sellers: HashMap::new(),
            timers: BinaryHeap::new(),
            parked: HashMap::new(),
            tiers: settings.kafka.retry_tiers(),
            tier_delay: settings
                .kafka
                .retry_tiers()
                .into_iter()
                .map(|t| (t.topic, t.delay))
                .collect(),
            memory: Memory::new(
                settings.worker.max_buffered,
                settings.worker.max_buffered_bytes,
            ),
            tasks: 0,
            slots_free: settings.downstream.concurrency,
            capacity_waiters: VecDeque::new(),
            tx,
            rx,
        }
    }

    /// Runs until `shutdown` resolves, then drains in-flight work (within
    /// `worker.shutdown_timeout`) and commits synchronously.
    pub async fn run(mut self, shutdown: impl Future<Output = ()>) -> Summary {
        tokio::pin!(shutdown);
        let mut commit = tokio::time::interval(self.settings.kafka.commit_interval);
        commit.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let next = self.timers.peek().map(|Reverse((at, _))| *at);
            tokio::select! {
                biased;
                _ = &mut shutdown => break,
                Some(ev) = self.rx.recv() => self.on_event(ev),
                Some(pe) = self.deps.partitions.recv() => self.on_partitions(pe),
                _ = sleep_until(next.unwrap_or_else(far).into()), if next.is_some() => self.on_timers(),
                // Done on the consumer's poll thread, acknowledged there.
                _ = commit.tick() => {
                    self.unstick();
                    self.deps.consumer.request_commit();
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
        // No more records: the consumer's poll thread stops handing them
        // over (and keeps serving the final commit).
        self.deps.records.close();
        tracing::info!(
            in_flight = self.tasks,
            "shutting down: no new records; waiting for in-flight work"
        );
        // Waiting jobs stay uncommitted: whoever owns their partitions next
        // gets them. Only work already under way is awaited.
        for seller in self.sellers.values_mut() {
            seller.queue.clear();
            seller.delayed.clear();
        }
        self.parked.clear();
        let deadline = tokio::time::Instant::now() + self.settings.worker.shutdown_timeout;
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
        Summary {
            abandoned,
            committed_partitions,
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
            Event::Permit { .. } => self.tasks -= 1,
            other => self.on_event(other),
        }
    }

    // ---- records ----

    fn on_record(&mut self, rec: Record) {
        if !self.deps.consumer.is_current(&rec.origin) {
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
                return self.write(
                    bytes,
                    rec.origin,
                    rec.original,
                    None,
                    0,
                    Target::DeadLetter {
                        kind: "unreadable_headers",
                        reason,
                    },
                );
            }
        };
        let job = match Job::parse_shared(&rec.original.value, &self.settings.worker) {
            Ok(job) => job.traced(&rec.original.trace),
            Err(e) => {
                let reason = e.to_string();
                return self.write(
                    bytes,
                    rec.origin,
                    rec.original,
                    None,
                    headers.attempts,
                    Target::DeadLetter {
                        kind: e.kind(),
                        reason,
                    },
                );
            }
        };
        let pending = Pending {
            job,
            origin: rec.origin,
            original: rec.original,
            attempts: headers.attempts,
            bytes,
            received_at: Instant::now(),
        };
        let now = unix_ms();
        match headers.release_at_unix_ms {
            // Held for its tier's delay. A release further off than the
            // tier's delay (a clock jump, a hand-written header) is not
            // trusted to hold the partition: the record is taken up now
            // and hops tiers by its due time instead.
            Some(release) if release > now && self.holds_at_most(&pending, release - now) => self
                .park(Parked {
                    release_at_unix_ms: release,
                    not_before_unix_ms: headers.not_before_unix_ms,
                    pending,
                }),
            _ => self.take_up(pending, headers.not_before_unix_ms),
        }
    }

    /// Whether holding `pending`'s partition for `wait_ms` stays within its
    /// tier's delay (plus a second for clocks and transit).
    fn holds_at_most(&self, pending: &Pending, wait_ms: u64) -> bool {
        self.tier_delay
            .get(&*pending.origin.topic)
            .is_some_and(|d| wait_ms <= ceil_ms(*d) + 1000)
    }

    /// A record taken up from a retry tier (or a fresh one): run it when
    /// due. A short remaining wait is held in memory, without holding the
    /// partition; a longer one hops to the tier that fits it.
    fn take_up(&mut self, pending: Pending, not_before: Option<u64>) {
        let remaining = match not_before {
            Some(nb) if nb > unix_ms() => Duration::from_millis(nb - unix_ms()),
            _ => return self.enqueue(pending),
        };
        if remaining > self.settings.worker.max_inline_delay {
            return self.defer(pending, remaining);
        }
        let key: Arc<str> = Arc::from(pending.job.seller_id.as_str());
        let at = after(Instant::now(), remaining);
        self.sellers
            .entry(key.clone())
            .or_insert_with(Seller::new)
            .delayed
            .push((at, pending));
        self.timers.push(Reverse((at, Timer::Seller(key))));
    }

    /// A retry-tier record not yet released: hold it and pause its
    /// partition, so that waiting neither spins nor holds up other
    /// partitions. Records behind it in the partition are released later
    /// (a tier's release times ascend), so none waits behind the head.
    fn park(&mut self, parked: Parked) {
        let origin = &parked.pending.origin;
        let part: Partition = (origin.topic.clone(), origin.partition);
        let release = parked.release_at_unix_ms;
        let queue = self.parked.entry(part.clone()).or_default();
        let first = queue.is_empty();
        queue.push_back(parked);
        if first {
            self.deps.consumer.pause(std::slice::from_ref(&part));
            self.timers.push(Reverse((
                instant_of(release),
                Timer::Parked(part.0, part.1),
            )));
        }
    }

    fn unpark(&mut self, part: Partition) {
        let now = unix_ms();
        let mut released = Vec::new();
        let mut next = None;
        if let Some(queue) = self.parked.get_mut(&part) {
            while let Some(head) = queue.front() {
                if head.release_at_unix_ms > now {
                    next = Some(head.release_at_unix_ms);
                    break;
                }
                released.extend(queue.pop_front());
            }
        }
        match next {
            Some(release) => self.timers.push(Reverse((
                instant_of(release),
                Timer::Parked(part.0.clone(), part.1),
            ))),
            None => {
                self.parked.remove(&part);
                if !self.memory.is_paused() {
                    self.deps.consumer.resume(std::slice::from_ref(&part));
                }
            }
        }
        for p in released {
            self.take_up(p.pending, p.not_before_unix_ms);
        }
    }

    fn enqueue(&mut self, pending: Pending) {
        let now = Instant::now();
        let max_delay = self.settings.worker.max_inline_delay;
        let key: Arc<str> = Arc::from(pending.job.seller_id.as_str());
        let seller = self.sellers.entry(key.clone()).or_insert_with(Seller::new);
        if let Some(until) = seller.blocked_until {
            if until > now {
                // A job that asked for itself would go to Redis here, only
                // to be refused.
                CallAvoided { seller: &key }.emit();
            }
            if until > now + max_delay {
                let wait = until - now;
                return self.defer(pending, wait);
            }
        }
        seller.queue.push_back(pending);
        self.poke(&key);
    }

    /// Asks the limiter for a seller that is idle, not blocked and has work.
    fn poke(&mut self, key: &Arc<str>) {
        let now = Instant::now();
        let Some(seller) = self.sellers.get_mut(key) else {
            return;
        };
        if seller.phase != Phase::Idle {
            return;
        }
        if seller.blocked_until.is_some_and(|t| t > now) {
            return;
        }
        seller.blocked_until = None;
        // Jobs whose backoff is over go first: they are older than the queue.
        let mut due: Vec<Pending> = Vec::new();
        let mut i = 0;
        while i < seller.delayed.len() {
            if seller.delayed[i].0 <= now {
                due.push(seller.delayed.swap_remove(i).1);
            } else {
                i += 1;
            }
        }
        for p in due.into_iter().rev() {
            seller.queue.push_front(p);
        }
        if let Some(next) = seller.delayed.iter().map(|(t, _)| *t).min() {
            self.timers
                .push(Reverse((next, Timer::Seller(key.clone()))));
        }
        let seller = self.sellers.get_mut(key).expect("looked up above");
        if seller.queue.is_empty() {
            if seller.is_empty() {
                self.sellers.remove(key);
            }
            return;
        }
        if self.slots_free == 0 {
            // Capacity-bound: wait for a slot without asking Redis.
            if !seller.wants_capacity {
                SellerWaiting::capacity(key).emit();
                seller.wants_capacity = true;
                self.capacity_waiters.push_back(key.clone());
            }
            return;
        }
        // The heads in queue order, with their costs: the limiter grants the
        // longest prefix that fits, so a heavy job that does not fit yet
        // stops lighter later ones from taking the units it waits for.
        let costs: Vec<u64> = partition_heads(&seller.queue, MAX_BATCH.min(self.slots_free))
            .into_iter()
            .map(|i| seller.queue[i].job.cost)
            .collect();
        let n = costs.len();
        self.slots_free -= n;
        seller.reserved = n;
        seller.phase = Phase::Asking;
        let (permits, tx, seller_id) = (self.deps.permits.clone(), self.tx.clone(), key.clone());
        self.tasks += 1;
        LimiterCalled.emit();
        tokio::spawn(async move {
            let result = permits.acquire_jobs(&seller_id, &costs).await;
            let _ = tx.send(Event::Permit {
                seller: seller_id,
                result,
                answered_at: Instant::now(),
            });
        });
    }

    // ---- events ----

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

    fn on_permit(
        &mut self,
        key: Arc<str>,
        result: Result<BatchDecision, String>,
        answered_at: Instant,
    ) {
        let unready_after = self.settings.redis.unready_after;
        let decision = match result {
            Ok(d) => {
                if self.limiter_failures >= unready_after {
                    self.deps.health.set_redis_down(false);
                }
                if self.limiter_failures > 0 {
                    self.local.clear();
                }
                self.limiter_failures = 0;
                d
            }
            Err(error) => {
                self.limiter_failures = self.limiter_failures.saturating_add(1);
                if self.limiter_failures == unready_after {
                    self.deps.health.set_redis_down(true);
                }
                let decision = self.fallback(&key);
                let (hold, admitted) = match &decision {
                    BatchDecision::Denied(d) => (d.retry_after, 0),
                    BatchDecision::Granted(g) => (Duration::ZERO, g.jobs),
                    BatchDecision::Never(_) => (Duration::ZERO, 0),
                };
                LimiterUnavailable {
                    error: &error,
                    policy: self.on_limiter_error.name(),
                    hold,
                    in_a_row: self.limiter_failures,
                    admitted,
                }
                .emit();
                decision
            }
        };
        let consumer = self.deps.consumer.clone();
        let Some(seller) = self.sellers.get_mut(&key) else {
            return;
        };
        seller.phase = Phase::Idle;
        let reserved = std::mem::take(&mut seller.reserved);
        match decision {
            BatchDecision::Granted(g) => {
                // The job the prefix stopped at, found before the grant is
                // taken out of the queue.
                let next = partition_heads(&seller.queue, reserved)
                    .get(g.jobs)
                    .map(|&i| seller.queue[i].origin.clone());
                let batch = take_granted(&mut seller.queue, &g, reserved);
                // Jobs of partitions revoked since the revoke event was
                // handled belong to their new owner. (The queue itself is
                // purged by that event; checking the batch only keeps this
                // O(batch), not O(backlog), per limiter answer.)
                let (batch, gone): (Vec<Pending>, Vec<Pending>) = batch
                    .into_iter()
                    .partition(|p| consumer.is_current(&p.origin));
                for p in &gone {
                    self.memory.remove(p.bytes);
                }
                let n = batch.len();
                seller.reserved = n;
                self.release(reserved - n);
                let info = self.deps.permits.describe(&key);
                JobsAdmitted {
                    seller: &key,
                    tier: &info.tier,
                    jobs: n,
                    units: batch.iter().map(|p| p.job.cost).sum(),
                    near_limit: info.near_limit(g.remaining),
                }
                .emit();
                // Why the prefix stopped short: the next job waits (so does
                // the seller, without asking again before then), or can
                // never pass (dead-lettered now, not retried forever).
                match g.next {
                    Some(NextJob::Wait { retry_after, .. }) => {
                        SellerWaiting::limit(&key, retry_after).emit();
                        let until = after(answered_at, retry_after);
                        if let Some(seller) = self.sellers.get_mut(&key) {
                            seller.blocked_until =
                                Some(seller.blocked_until.map_or(until, |t| t.max(until)));
                        }
                        self.timers
                            .push(Reverse((until, Timer::Seller(key.clone()))));
                    }
                    Some(NextJob::Never(c)) => {
                        if let Some(origin) = next {
                            self.never(&key, &origin, c);
                        }
                    }
                    None => {}
                }
                if batch.is_empty() {
                    return self.poke(&key);
                }
                let seller = self.sellers.get_mut(&key).expect("looked up above");
                seller.phase = Phase::Running;
                self.spawn_run(key, batch, (g.pace, g.decided_at_us), answered_at);
            }
            BatchDecision::Denied(d) => {
                SellerThrottled {
                    seller: &key,
                    tier: &self.deps.permits.describe(&key).tier,
                    retry_after: d.retry_after,
                    waiting: seller.queue.len(),
                    by: &denied_by(d.by),
                }
                .emit();
                self.release(reserved);
                // Counted from when the answer arrived: never early, whatever
                // the clocks of Redis and this host say.
                self.hold(&key, after(answered_at, d.retry_after));
            }
            BatchDecision::Never(c) => {
                let first = seller.queue.front().map(|p| p.origin.clone());
                self.release(reserved);
                if let Some(origin) = first {
                    self.never(&key, &origin, c);
                }
                self.poke(&key);
            }
        }
    }

    /// The one place where a failed limiter call becomes a decision, for
    /// the heads the call asked about (`redis.on_error`).
    fn fallback(&mut self, key: &Arc<str>) -> BatchDecision {
        let policy = self.on_limiter_error;
        let costs: Vec<u64> = match self.sellers.get(key) {
            Some(seller) => partition_heads(&seller.queue, seller.reserved)
                .into_iter()
                .map(|i| seller.queue[i].job.cost)
                .collect(),
            None => Vec::new(),
        };
        match policy {
            OnLimiterError::FailClosed { .. } => {
                BatchDecision::from_units(policy.decide(self.limiter_failures))
            }
            _ if costs.is_empty() => {
                BatchDecision::from_units(policy.decide(self.limiter_failures))
            }
            OnLimiterError::FailOpen => {
                BatchDecision::Granted(local::granted(costs.len(), costs.iter().sum()))
            }
            OnLimiterError::Local => {
                let share = self.jobs_assigned.len().max(1) as f64
                    / self.deps.jobs_partitions.max(1) as f64;
                let rules = self.deps.permits.rules_of(key);
                let rules = rules.as_ref().map(|(own, global)| (&own[..], &global[..]));
                self.local.acquire_jobs(key, rules, &costs, share)
            }
        }
    }

    /// The seller's first waiting job (the head the limiter looked at
    /// first) costs more than a rule can ever hold: dead-letter it with the
    /// rule, its capacity and the cost, so it is not retried forever.
    fn never(&mut self, key: &Arc<str>, origin: &Origin, c: CannotPass) {
        let Some(seller) = self.sellers.get_mut(key) else {
            return;
        };
        let Some(i) = seller.queue.iter().position(|p| p.origin == *origin) else {
            return;
        };
        if let Some(p) = seller.queue.remove(i) {
            LimiterNever {
                seller: key,
                tier: &self.deps.permits.describe(key).tier,
                rule: c.rule,
            }
            .emit();
            let reason = c.to_string();
            self.write_pending(
                p,
                Target::DeadLetter {
                    kind: "cost_over_capacity",
                    reason,
                },
            );
        }
    }

    /// Runs a granted batch: the jobs of each partition one after the
    /// other (so one seller's jobs of a partition reach the downstream in
    /// offset order), the partitions side by side (so every job is called
    /// close to its grant, which is what keeps the downstream's view of the
    /// rate exact). A 429 stops the whole batch; what was not called comes
    /// back in order. `grant` is the limiter's pacing and decision instant
    /// (Unix µs on its clock, 0 when no store decided: fail-open, local):
    /// each call names its grant in `X-Granted-At`.
    fn spawn_run(
        &mut self,
        seller: Arc<str>,
        batch: Vec<Pending>,
        grant: (Option<Pace>, u64),
        answered_at: Instant,
    ) {
        let (pace, decided_at_us) = grant;
        let (downstream, tx) = (self.deps.downstream.clone(), self.tx.clone());
        let currency: Currency = self.deps.consumer.currency();
        let d = &self.settings.downstream;
        let (backoff_base, backoff_max) = (d.backoff_base, d.backoff_max);
        self.tasks += 1;
        // Each job with its first unit's index in the grant (the costs of
        // the jobs before it): a pacer's go-at instants are per unit.
        let mut chains: Vec<(Partition, Vec<(u64, Pending)>)> = Vec::new();
        let mut unit = 0u64;
        for p in batch {
            let first_unit = unit;
            unit += p.job.cost;
            let part = (p.origin.topic.clone(), p.origin.partition);
            match chains.iter_mut().find(|(k, _)| *k == part) {
                Some((_, chain)) => chain.push((first_unit, p)),
                None => chains.push((part, vec![(first_unit, p)])),
            }
        }
        tokio::spawn(async move {
            let throttled: std::sync::Mutex<Option<Duration>> = std::sync::Mutex::new(None);
            let stopped = || throttled.lock().map_or(true, |t| t.is_some());
            let runs = chains.into_iter().map(|(_, chain)| {
                let (downstream, tx, seller, throttled, currency) =
                    (&downstream, &tx, &seller, &throttled, &currency);
                async move {
                    let mut unused = Vec::new();
                    let mut jobs = chain.into_iter();
                    while let Some((i, p)) = jobs.next() {
                        if let Some(pace) = pace {
                            // A pacer grant: unit i may go this long after the
                            // decision, which came before `answered_at`.
                            sleep_until(after(answered_at, pace.unit_after(i)).into()).await;
                        }
                        // A revoked job is not called: its new owner does.
                        if stopped() || !currency.is_current(&p.origin) {
                            unused.push((i, p));
                            continue;
                        }
                        // The instant this job was granted on the
                        // limiter's clock: its first unit's go-at under a
                        // pacer, else the decision.
                        let granted_at = match pace {
                            Some(pace) => Some(pace.first_at_us + i * pace.interval_us),
                            None => (decided_at_us > 0).then_some(decided_at_us),
                        };
                        match downstream.send_granted(&p.job, granted_at).await {
                            Answer::Throttled(retry_after) => {
                                // No readable Retry-After: the worker's own
                                // backoff, so that replicas do not come back
                                // in lockstep.
                                let wait = match retry_after {
                                    RetryAfter::Wait(wait) => wait,
                                    RetryAfter::Unspecified => {
                                        backoff(p.attempts + 1, backoff_base, backoff_max)
                                    }
                                };
                                if let Ok(mut t) = throttled.lock() {
                                    *t = Some(t.map_or(wait, |w| w.max(wait)));
                                }
                                unused.push((i, p));
                                unused.extend(jobs.by_ref());
                            }
                            outcome => {
                                let _ = tx.send(Event::Called {
                                    seller: seller.clone(),
                                    pending: p,
                                    outcome,
                                });
                            }
                        }
                    }
                    unused
                }
            });
            let mut unused: Vec<(u64, Pending)> = futures::future::join_all(runs)
                .await
                .into_iter()
                .flatten()
                .collect();
            unused.sort_by_key(|(i, _)| *i);
            let throttled = throttled.lock().ok().and_then(|t| *t);
            let unused = unused.into_iter().map(|(_, p)| p).collect();
            let _ = tx.send(Event::RunEnded {
                seller,
                unused,
                throttled,
            });
        });
    }

    fn on_called(&mut self, key: Arc<str>, mut p: Pending, outcome: Answer) {
        p.attempts += 1;
        if let Some(seller) = self.sellers.get_mut(&key) {
            seller.reserved = seller.reserved.saturating_sub(1);
        }
        self.release(1);
        if !self.deps.consumer.is_current(&p.origin) {
            // The partition moved on while the call was out: its new owner
            // has the record and decides; no retry, no dead letter from here.
            self.memory.remove(p.bytes);
            return RevokedWorkDropped {
                jobs: 1,
                stage: "answer",
            }
            .emit();
        }
        match outcome {
            Answer::Done => {
                JobDone {
                    job_id: &p.job.job_id,
                    attempts: p.attempts,
                }
                .emit();
                self.deps.consumer.finish(&p.origin);
                self.memory.remove(p.bytes);
            }
            Answer::Fatal { status, reason } => {
                let reason = match status {
                    Some(s) => format!("downstream refused the job with HTTP {s}: {reason}"),
                    None => format!("downstream refused the job: {reason}"),
                };
                self.write_pending(
                    p,
                    Target::DeadLetter {
                        kind: "downstream_rejected",
                        reason,
                    },
                );
            }
            Answer::Retryable { reason } => {
                let max = self.settings.downstream.max_attempts;
                if p.attempts >= max {
                    let reason = format!("downstream failed {} times (downstream.max_attempts = {max}); last: {reason}", p.attempts);
                    return self.write_pending(
                        p,
                        Target::DeadLetter {
                            kind: "attempts_exhausted",
                            reason,
                        },
                    );
                }
                let d = &self.settings.downstream;
                let wait = backoff(p.attempts, d.backoff_base, d.backoff_max);
                DownstreamFailed {
                    job_id: &p.job.job_id,
                    attempts: p.attempts,
                    reason: &reason,
                    backoff: wait,
                }
                .emit();
                let at = after(Instant::now(), wait);
                let seller = self.sellers.entry(key.clone()).or_insert_with(Seller::new);
                seller.delayed.push((at, p));
                self.timers.push(Reverse((at, Timer::Seller(key))));
            }
            Answer::Throttled(_) => {
                unreachable!("a run ends at a 429 and returns the job as unused")
            }
        }
    }

    fn on_run_ended(&mut self, key: Arc<str>, unused: Vec<Pending>, throttled: Option<Duration>) {
        let before = unused.len();
        let consumer = self.deps.consumer.clone();
        let (kept, gone): (Vec<Pending>, Vec<Pending>) = unused
            .into_iter()
            .partition(|p| consumer.is_current(&p.origin));
        let unused = kept;
        for p in &gone {
            self.memory.remove(p.bytes);
        }
        if !gone.is_empty() {
            RevokedWorkDropped {
                jobs: before - unused.len(),
                stage: "run",
            }
            .emit();
        }
        let seller = self.sellers.entry(key.clone()).or_insert_with(Seller::new);
        seller.phase = Phase::Idle;
        let slots = std::mem::take(&mut seller.reserved);
        for p in unused.into_iter().rev() {
            seller.queue.push_front(p);
        }
        if let Some(wait) = throttled {
            DownstreamThrottled {
                seller: &key,
                retry_after: wait,
            }
            .emit();
            self.hold(&key, after(Instant::now(), wait));
            // Share the 429 with every replica through the limiter.
            let (permits, seller_id) = (self.deps.permits.clone(), key.clone());
            tokio::spawn(async move {
                if let Err(e) = permits.block(&seller_id, wait).await {
                    tracing::warn!(error = %e, "could not share the downstream's 429 through Redis; other replicas learn it from their own calls");
                }
            });
        }
        self.release(slots);
        self.poke(&key);
    }

    /// Gives `n` downstream slots back and lets waiting sellers ask, in turn.
    fn release(&mut self, n: usize) {
        self.slots_free += n;
        while self.slots_free > 0 {
            let Some(key) = self.capacity_waiters.pop_front() else {
                break;
            };
            if let Some(seller) = self.sellers.get_mut(&key) {
                seller.wants_capacity = false;
            }
            self.poke(&key);
        }
    }

    /// Refuses a seller until `until` (never shortening a longer hold). A
    /// wait longer than `worker.max_inline_delay` sends its waiting jobs to
    /// the retry topic instead of holding them in memory.
    fn hold(&mut self, key: &Arc<str>, until: Instant) {
        let Some(seller) = self.sellers.get_mut(key) else {
            return;
        };
        let until = seller.blocked_until.map_or(until, |t| t.max(until));
        seller.blocked_until = Some(until);
        let wait = until.saturating_duration_since(Instant::now());
        if wait > self.settings.worker.max_inline_delay {
            let waiting: Vec<Pending> = seller.queue.drain(..).collect();
            for p in waiting {
                self.defer(p, wait);
            }
        }
        self.timers
            .push(Reverse((until, Timer::Seller(key.clone()))));
    }

    // ---- writes to the retry and dead-letter topics ----

    fn defer(&mut self, p: Pending, wait: Duration) {
        JobDeferred {
            job_id: &p.job.job_id,
            wait,
        }
        .emit();
        // The longest tier that does not pass the due time (the shortest if
        // none fits): the record is released no later than it is due, and
        // hops down the tiers until then.
        let tier = self
            .tiers
            .iter()
            .rev()
            .find(|t| t.delay <= wait)
            .or(self.tiers.first());
        let Some(tier) = tier else {
            unreachable!("config validation keeps at least one retry tier")
        };
        let now = unix_ms();
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

    fn write_pending(&mut self, p: Pending, target: Target) {
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
        self.write(bytes, origin, original, Some(job.job_id), attempts, target);
    }

    fn write(
        &mut self,
        bytes: usize,
        origin: Origin,
        original: OriginalRecord,
        job_id: Option<String>,
        attempts: u32,
        target: Target,
    ) {
        if !self.deps.consumer.is_current(&origin) {
            // Written by the partition's new owner, if at all.
            self.memory.remove(bytes);
            return RevokedWorkDropped {
                jobs: 1,
                stage: "write",
            }
            .emit();
        }
        let pending = PendingWrite {
            bytes,
            origin,
            original,
            job_id,
            attempts,
            target,
        };
        self.spawn_write(pending, Duration::ZERO);
    }

    fn spawn_write(&mut self, pending: PendingWrite, after: Duration) {
        let (sink, tx) = (self.deps.sink.clone(), self.tx.clone());
        let kafka = &self.settings.kafka;
        let topic = match &pending.target {
            Target::DeadLetter { .. } => kafka.dlq_topic.clone(),
            Target::Retry { topic, .. } => topic.clone(),
        };
        self.tasks += 1;
        tokio::spawn(async move {
            if !after.is_zero() {
                tokio::time::sleep(after).await;
            }
            let result = match &pending.target {
                Target::DeadLetter { reason, .. } => {
                    sink.dead_letter(&topic, &pending.original, reason, pending.attempts)
                        .await
                }
                Target::Retry {
                    not_before_unix_ms,
                    release_at_unix_ms,
                    ..
                } => {
                    sink.to_retry_topic(
                        &topic,
                        &pending.original,
                        *not_before_unix_ms,
                        *release_at_unix_ms,
                        pending.attempts,
                    )
                    .await
                }
            };
            let _ = tx.send(Event::Written {
                pending,
                result: result.map_err(|e| e.to_string()),
            });
        });
    }

    fn on_written(&mut self, pending: PendingWrite, result: Result<(), String>) {
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
                self.deps.consumer.finish(&pending.origin);
                self.memory.remove(pending.bytes);
            }
            Err(error) => {
                // Losing it is not an option: the record stays unfinished
                // (so uncommitted) and the write is tried again.
                tracing::warn!(
                    error,
                    topic = &*pending.origin.topic,
                    offset = pending.origin.offset,
                    "write to the retry or dead-letter topic failed; trying again in 1s"
                );
                if self.deps.consumer.is_current(&pending.origin) {
                    self.spawn_write(pending, Duration::from_secs(1));
                } else {
                    self.memory.remove(pending.bytes);
                }
            }
        }
    }

    // ---- timers, partitions, commits, backpressure ----

    fn on_timers(&mut self) {
        let now = Instant::now();
        while let Some(Reverse((at, _))) = self.timers.peek() {
            if *at > now {
                break;
            }
            let Some(Reverse((_, timer))) = self.timers.pop() else {
                break;
            };
            match timer {
                Timer::Seller(key) => self.poke(&key),
                Timer::Parked(topic, partition) => self.unpark((topic, partition)),
            }
        }
    }

    fn on_partitions(&mut self, ev: PartitionEvent) {
        match ev {
            PartitionEvent::Assigned(parts) => {
                self.deps.health.set_joined();
                let jobs_topic = &self.settings.kafka.topic;
                self.jobs_assigned.extend(
                    parts
                        .iter()
                        .filter(|(t, _)| **t == **jobs_topic)
                        .map(|(_, p)| *p),
                );
                PartitionsAssigned {
                    partitions: parts.len(),
                }
                .emit();
                // An assignment starts unpaused as far as librdkafka knows,
                // but a pause of ours from before a revoke may linger: set
                // each partition to what the worker wants now.
                if self.memory.is_paused() {
                    self.deps.consumer.pause(&parts);
                } else {
                    let parts: Vec<Partition> = parts
                        .into_iter()
                        .filter(|p| !self.parked.contains_key(p))
                        .collect();
                    self.deps.consumer.resume(&parts);
                }
            }
            PartitionEvent::Revoked(parts) => {
                let jobs_topic = &self.settings.kafka.topic;
                for (t, p) in &parts {
                    if **t == **jobs_topic {
                        self.jobs_assigned.remove(p);
                    }
                }
                let consumer = self.deps.consumer.clone();
                let mut dropped: Vec<usize> = Vec::new();
                for seller in self.sellers.values_mut() {
                    seller.queue.retain(|p| {
                        let keep = consumer.is_current(&p.origin);
                        if !keep {
                            dropped.push(p.bytes);
                        }
                        keep
                    });
                    seller.delayed.retain(|(_, p)| {
                        let keep = consumer.is_current(&p.origin);
                        if !keep {
                            dropped.push(p.bytes);
                        }
                        keep
                    });
                }
                for part in &parts {
                    if let Some(q) = self.parked.remove(part) {
                        dropped.extend(q.iter().map(|p| p.pending.bytes));
                    }
                }
                for bytes in &dropped {
                    self.memory.remove(*bytes);
                }
                let dropped = dropped.len();
                self.sellers.retain(|_, s| !s.is_empty());
                RevokedJobsDropped {
                    partitions: parts.len(),
                    jobs: dropped,
                }
                .emit();
            }
        }
    }

    /// Sets the backlog gauges: jobs waiting by cause (a seller refused
    /// until later is limit-bound; one free to go waits for capacity), in
    /// flight, parked, bytes and partitions.
    fn report_backlog(&self) {
        let now = Instant::now();
        let mut waiting: HashMap<(&'static str, Arc<str>), i64> = HashMap::new();
        for (key, seller) in &self.sellers {
            let n = (seller.queue.len() + seller.delayed.len()) as i64;
            if n == 0 {
                continue;
            }
            let cause = if seller.blocked_until.is_some_and(|t| t > now) {
                "limit"
            } else {
                "capacity"
            };
            *waiting.entry((cause, key.clone())).or_default() += n;
        }
        let assigned = self.deps.consumer.assignment().len();
        let paused = if self.memory.is_paused() {
            assigned
        } else {
            self.parked.len()
        };
        Backlog {
            waiting: &waiting,
            in_flight: self.settings.downstream.concurrency - self.slots_free,
            parked: self.parked.values().map(VecDeque::len).sum(),
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
    fn unstick(&mut self) {
        let held = self.deps.consumer.held_back();
        if held.is_empty() {
            return;
        }
        let w = &self.settings.worker;
        let (max_wait, max_ahead) = (w.max_head_wait, w.max_finished_ahead);
        let now = Instant::now();
        let stuck = |p: &Pending| {
            held.iter().any(|h| {
                h.offset == p.origin.offset
                    && h.partition.1 == p.origin.partition
                    && *h.partition.0 == *p.origin.topic
                    && (h.finished_behind >= max_ahead
                        || now.saturating_duration_since(p.received_at) >= max_wait)
            })
        };
        let mut moved: Vec<(Pending, Duration)> = Vec::new();
        for seller in self.sellers.values_mut() {
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

    /// The final commit: every finished prefix, acknowledged by the broker
    /// (failures are counted and logged by the consumer). Returns how many
    /// partitions were committed.
    async fn commit_all(&mut self) -> usize {
        let commit = self.deps.consumer.commit_all();
        match tokio::time::timeout(FINAL_COMMIT_TIMEOUT, commit).await {
            Ok(Ok(n)) => n,
            Ok(Err(_)) => 0,
            Err(_) => {
                tracing::warn!(timeout = ?FINAL_COMMIT_TIMEOUT, "final commit got no answer in time; the next owner redoes the uncommitted records");
                0
            }
        }
    }

    /// Pauses every partition at `worker.max_buffered` jobs or
    /// `worker.max_buffered_bytes` in memory and resumes below 90 % of both.
    fn backpressure(&mut self) {
        let Some(pressure) = self.memory.pressure() else {
            return;
        };
        let paused = pressure == Pressure::Pause;
        if paused {
            self.deps.consumer.pause(&self.deps.consumer.assignment());
        } else {
            let parts: Vec<Partition> = self
                .deps
                .consumer
                .assignment()
                .into_iter()
                .filter(|p| !self.parked.contains_key(p))
                .collect();
            self.deps.consumer.resume(&parts);
        }
        Backpressure {
            paused,
            buffered: self.memory.jobs(),
            bytes: self.memory.bytes(),
        }
        .emit();
    }
}

/// Indexes (ascending) of the first waiting job of each partition, at most
/// `max` of them. A seller asks the limiter for exactly these: each can be
/// called the moment it is granted (the jobs behind it in its partition
/// must wait for it, to keep their order), so a grant reaches the downstream
/// within one call of being made, and the downstream's view of the rate is
/// the limiter's.
fn partition_heads(queue: &VecDeque<Pending>, max: usize) -> Vec<usize> {
    let mut seen: Vec<(&str, i32)> = Vec::new();
    let mut heads = Vec::new();
    for (i, p) in queue.iter().take(HEAD_SCAN).enumerate() {
        if heads.len() == max {
            break;
        }
        let part = (&*p.origin.topic, p.origin.partition);
        if !seen.contains(&part) {
            seen.push(part);
            heads.push(i);
        }
    }
    heads
}

/// Removes and returns the granted heads, in queue order: the first
/// `g.jobs` partition heads (at most `reserved`, the slots held for them),
/// never more units than were charged. (A revoke between the question and
/// the answer can only remove heads; the ones that take their place are
/// then cut by the units.)
fn take_granted(queue: &mut VecDeque<Pending>, g: &BatchGranted, reserved: usize) -> Vec<Pending> {
    let mut units = 0u64;
    let mut take = Vec::new();
    for i in partition_heads(queue, g.jobs.min(reserved)) {
        let cost = queue[i].job.cost;
        if units + cost > g.units {
            break;
        }
        units += cost;
        take.push(i);
    }
    let mut out: Vec<Pending> = take.iter().rev().filter_map(|&i| queue.remove(i)).collect();
    out.reverse();
    out
}

/// The `by` label of a refusal.
fn denied_by(by: DeniedBy) -> String {
    match by {
        DeniedBy::Rule(i) => format!("rule{i}"),
        DeniedBy::DownstreamBlock => "downstream_429".to_owned(),
        DeniedBy::Unavailable => "unavailable".to_owned(),
    }
}

fn far() -> Instant {
    after(Instant::now(), Duration::from_secs(3600))
}

/// `at + d`, saturating: durations that come from outside (a Retry-After,
/// a limiter's wait, a header) must not overflow `Instant` and panic the
/// worker. A century stands in for "never" on any platform's clock.
fn after(at: Instant, d: Duration) -> Instant {
    const CENTURY: Duration = Duration::from_secs(100 * 365 * 24 * 3600);
    at.checked_add(d.min(CENTURY))
        .or_else(|| at.checked_add(Duration::from_secs(24 * 3600)))
        .unwrap_or(at)
}

/// A duration in whole ms, rounded up (so a wait is never cut short).
fn ceil_ms(d: Duration) -> u64 {
    u64::try_from(d.as_micros().div_ceil(1000)).unwrap_or(u64::MAX)
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The local instant of a Unix time in ms (now, if it has passed).
fn instant_of(unix_ms_at: u64) -> Instant {
    after(
        Instant::now(),
        Duration::from_millis(unix_ms_at.saturating_sub(unix_ms())),
    )
}
