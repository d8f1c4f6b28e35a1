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
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tokio::sync::mpsc;
use tokio::time::sleep_until;

use crate::config::Settings;
use crate::downstream::{backoff, Downstream, Outcome};
use crate::job::Job;
use crate::kafka::consumer::{Consumer, Origin, Partition, PartitionEvent, Record};
use crate::kafka::{OriginalRecord, RecordSink};
use crate::limiter::{Decision, Pace};
use crate::telemetry::events::{
    self, Backpressure, CommitFailed, DownstreamFailed, DownstreamThrottled, JobDeadLettered,
    JobDeferred, JobDone, LimiterUnavailable, OffsetsCommitted, RevokedJobsDropped,
    SellerThrottled,
};

use super::permit::{OnLimiterError, Permits};

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
}

/// What the spawned tasks report.
enum Event {
    Permit {
        seller: Arc<str>,
        result: Result<Decision, String>,
        /// When the answer reached this process: waits count from here,
        /// so they are never early whatever the clocks say.
        answered_at: Instant,
    },
    Called {
        seller: Arc<str>,
        pending: Pending,
        outcome: Outcome,
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
    origin: Origin,
    original: OriginalRecord,
    job_id: Option<String>,
    attempts: u32,
    target: Target,
}

#[derive(Debug, Clone)]
enum Target {
    DeadLetter { reason: String },
    Retry { not_before_unix_ms: u64 },
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
    pub partitions: mpsc::UnboundedReceiver<PartitionEvent>,
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
    sellers: HashMap<Arc<str>, Seller>,
    timers: BinaryHeap<Reverse<(Instant, Timer)>>,
    /// Retry-topic records not yet due, per partition, in offset order; the
    /// partition is paused while it has any.
    parked: HashMap<Partition, VecDeque<(u64, Pending)>>,
    /// Jobs in memory: waiting, delayed, parked, running, being written.
    buffered: usize,
    /// Spawned runs, limiter calls and writes not yet reported back.
    tasks: usize,
    /// Downstream slots (of `downstream.concurrency`) not reserved. A seller
    /// asks the limiter only for as many units as it can call at once, so a
    /// grant is used right away: a grant that waited for capacity would
    /// reach the downstream late and bunch up with the next window's.
    slots_free: usize,
    /// Sellers ready to ask but waiting for a slot, served in turn.
    capacity_waiters: VecDeque<Arc<str>>,
    paused: bool,
    tx: mpsc::UnboundedSender<Event>,
    rx: mpsc::UnboundedReceiver<Event>,
}

impl<P: Permits> Engine<P> {
    pub fn new(settings: Arc<Settings>, deps: Deps<P>) -> Engine<P> {
        let (tx, rx) = mpsc::unbounded_channel();
        Engine {
            settings: settings.clone(),
            deps,
            on_limiter_error: OnLimiterError::DEFAULT,
            sellers: HashMap::new(),
            timers: BinaryHeap::new(),
            parked: HashMap::new(),
            buffered: 0,
            tasks: 0,
            slots_free: settings.downstream.concurrency,
            capacity_waiters: VecDeque::new(),
            paused: false,
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
        let consumer = self.deps.consumer.clone();
        loop {
            let next = self.timers.peek().map(|Reverse((at, _))| *at);
            tokio::select! {
                biased;
                _ = &mut shutdown => break,
                Some(ev) = self.rx.recv() => self.on_event(ev),
                Some(pe) = self.deps.partitions.recv() => self.on_partitions(pe),
                _ = sleep_until(next.unwrap_or_else(far).into()), if next.is_some() => self.on_timers(),
                _ = commit.tick() => {
                    self.commit(false);
                }
                rec = consumer.recv() => match rec {
                    Ok(r) => self.on_record(r),
                    Err(e) => {
                        tracing::warn!(error = %e, "Kafka receive failed");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                },
            }
            self.backpressure();
        }
        self.drain().await
    }

    async fn drain(mut self) -> Summary {
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
        let committed_partitions = self.commit(true);
        self.deps.consumer.mark_closing();
        Summary {
            abandoned,
            committed_partitions,
        }
    }

    fn on_event_draining(&mut self, ev: Event) {
        match ev {
            Event::RunEnded { unused, .. } => {
                self.tasks -= 1;
                self.buffered -= unused.len();
            }
            Event::Permit { .. } => self.tasks -= 1,
            other => self.on_event(other),
        }
    }

    // ---- records ----

    fn on_record(&mut self, rec: Record) {
        events::counters()
            .jobs_received
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.buffered += 1;
        let headers = match rec.headers {
            Ok(h) => h,
            Err(e) => {
                let reason = format!("unreadable worker header: {e}");
                return self.write(
                    rec.origin,
                    rec.original,
                    None,
                    0,
                    Target::DeadLetter { reason },
                );
            }
        };
        let job = match Job::parse(&rec.original.value, self.settings.worker.max_payload_bytes) {
            Ok(job) => job,
            Err(e) => {
                let reason = e.to_string();
                return self.write(
                    rec.origin,
                    rec.original,
                    None,
                    headers.attempts,
                    Target::DeadLetter { reason },
                );
            }
        };
        let pending = Pending {
            job,
            origin: rec.origin,
            original: rec.original,
            attempts: headers.attempts,
        };
        match headers.not_before_unix_ms {
            Some(nb) if nb > unix_ms() => self.park(nb, pending),
            _ => self.enqueue(pending),
        }
    }

    /// A retry-topic record that is not due: hold it and pause its
    /// partition, so that waiting neither spins nor holds up other partitions.
    fn park(&mut self, not_before: u64, pending: Pending) {
        let part: Partition = (pending.origin.topic.clone(), pending.origin.partition);
        let queue = self.parked.entry(part.clone()).or_default();
        let first = queue.is_empty();
        queue.push_back((not_before, pending));
        if first {
            self.deps.consumer.pause(std::slice::from_ref(&part));
            self.timers.push(Reverse((
                instant_of(not_before),
                Timer::Parked(part.0, part.1),
            )));
        }
    }

    fn unpark(&mut self, part: Partition) {
        let now = unix_ms();
        let mut due = Vec::new();
        let mut next = None;
        if let Some(queue) = self.parked.get_mut(&part) {
            while let Some((nb, _)) = queue.front() {
                if *nb > now {
                    next = Some(*nb);
                    break;
                }
                if let Some((_, p)) = queue.pop_front() {
                    due.push(p);
                }
            }
        }
        match next {
            Some(nb) => self.timers.push(Reverse((
                instant_of(nb),
                Timer::Parked(part.0.clone(), part.1),
            ))),
            None => {
                self.parked.remove(&part);
                if !self.paused {
                    self.deps.consumer.resume(std::slice::from_ref(&part));
                }
            }
        }
        for p in due {
            self.enqueue(p);
        }
    }

    fn enqueue(&mut self, pending: Pending) {
        let now = Instant::now();
        let max_delay = self.settings.worker.max_inline_delay;
        let key: Arc<str> = Arc::from(pending.job.seller_id.as_str());
        let seller = self.sellers.entry(key.clone()).or_insert_with(Seller::new);
        if let Some(until) = seller.blocked_until {
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
        if seller.phase != Phase::Idle || seller.blocked_until.is_some_and(|t| t > now) {
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
                seller.wants_capacity = true;
                self.capacity_waiters.push_back(key.clone());
            }
            return;
        }
        let n = partition_heads(&seller.queue, MAX_BATCH.min(self.slots_free)).len();
        self.slots_free -= n;
        seller.reserved = n;
        seller.phase = Phase::Asking;
        let n = n as u64;
        let (permits, tx, seller_id) = (self.deps.permits.clone(), self.tx.clone(), key.clone());
        self.tasks += 1;
        events::counters()
            .limiter_calls
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        tokio::spawn(async move {
            let result = permits.acquire(&seller_id, n).await;
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

    fn on_permit(&mut self, key: Arc<str>, result: Result<Decision, String>, answered_at: Instant) {
        let decision = match result {
            Ok(d) => d,
            Err(error) => {
                // The one place where a limiter failure becomes a decision.
                let policy = self.on_limiter_error;
                let decision = policy.decide();
                if let Decision::Denied(d) = &decision {
                    LimiterUnavailable {
                        error: &error,
                        policy: policy.name(),
                        hold: d.retry_after,
                    }
                    .emit();
                }
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
            Decision::Granted(g) => {
                let n = (g.granted as usize).min(reserved);
                let mut batch = take_partition_heads(&mut seller.queue, n);
                // Jobs of partitions revoked since the revoke event was
                // handled belong to their new owner. (The queue itself is
                // purged by that event; checking the batch only keeps this
                // O(batch), not O(backlog), per limiter answer.)
                let taken = batch.len();
                batch.retain(|p| consumer.is_current(&p.origin));
                self.buffered -= taken - batch.len();
                let n = batch.len();
                seller.reserved = n;
                self.release(reserved - n);
                if batch.is_empty() {
                    return self.poke(&key);
                }
                let seller = self.sellers.get_mut(&key).expect("looked up above");
                seller.phase = Phase::Running;
                self.spawn_run(key, batch, g.pace, answered_at);
            }
            Decision::Denied(d) => {
                SellerThrottled {
                    seller: &key,
                    retry_after: d.retry_after,
                    waiting: seller.queue.len(),
                }
                .emit();
                self.release(reserved);
                // Counted from when the answer arrived: never early, whatever
                // the clocks of Redis and this host say.
                self.hold(&key, answered_at + d.retry_after);
            }
            Decision::Never(c) => {
                // Cannot happen for grant-up-to calls; kept total so a
                // policy change cannot wedge a seller.
                let popped = seller.queue.pop_front();
                self.release(reserved);
                if let Some(p) = popped {
                    let reason = format!(
                        "cost {} can never pass: the seller's rule {} holds at most {}",
                        c.cost, c.rule, c.capacity
                    );
                    self.write_pending(p, Target::DeadLetter { reason });
                }
                self.poke(&key);
            }
        }
    }

    /// Runs a granted batch: the jobs of each partition one after the
    /// other (so one seller's jobs of a partition reach the downstream in
    /// offset order), the partitions side by side (so every job is called
    /// close to its grant, which is what keeps the downstream's view of the
    /// rate exact). A 429 stops the whole batch; what was not called comes
    /// back in order.
    fn spawn_run(
        &mut self,
        seller: Arc<str>,
        batch: Vec<Pending>,
        pace: Option<Pace>,
        answered_at: Instant,
    ) {
        let (downstream, tx) = (self.deps.downstream.clone(), self.tx.clone());
        self.tasks += 1;
        let mut chains: Vec<(Partition, Vec<(usize, Pending)>)> = Vec::new();
        for (i, p) in batch.into_iter().enumerate() {
            let part = (p.origin.topic.clone(), p.origin.partition);
            match chains.iter_mut().find(|(k, _)| *k == part) {
                Some((_, chain)) => chain.push((i, p)),
                None => chains.push((part, vec![(i, p)])),
            }
        }
        tokio::spawn(async move {
            let throttled: std::sync::Mutex<Option<Duration>> = std::sync::Mutex::new(None);
            let stopped = || throttled.lock().map_or(true, |t| t.is_some());
            let runs = chains.into_iter().map(|(_, chain)| {
                let (downstream, tx, seller, throttled) = (&downstream, &tx, &seller, &throttled);
                async move {
                    let mut unused = Vec::new();
                    let mut jobs = chain.into_iter();
                    while let Some((i, p)) = jobs.next() {
                        if let Some(pace) = pace {
                            // A pacer grant: unit i may go this long after the
                            // decision, which came before `answered_at`.
                            sleep_until((answered_at + pace.unit_after(i as u64)).into()).await;
                        }
                        if stopped() {
                            unused.push((i, p));
                            continue;
                        }
                        events::counters()
                            .downstream_calls
                            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        match downstream.call(&p.job).await {
                            Outcome::RetryAfter(wait) => {
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
            let mut unused: Vec<(usize, Pending)> = futures::future::join_all(runs)
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

    fn on_called(&mut self, key: Arc<str>, mut p: Pending, outcome: Outcome) {
        p.attempts += 1;
        if let Some(seller) = self.sellers.get_mut(&key) {
            seller.reserved = seller.reserved.saturating_sub(1);
        }
        self.release(1);
        match outcome {
            Outcome::Done => {
                JobDone {
                    job_id: &p.job.job_id,
                    attempts: p.attempts,
                }
                .emit();
                self.deps.consumer.finish(&p.origin);
                self.buffered -= 1;
            }
            Outcome::Fatal { status, reason } => {
                let reason = match status {
                    Some(s) => format!("downstream refused the job with HTTP {s}: {reason}"),
                    None => format!("downstream refused the job: {reason}"),
                };
                self.write_pending(p, Target::DeadLetter { reason });
            }
            Outcome::Retryable { reason } => {
                let max = self.settings.downstream.max_attempts;
                if p.attempts >= max {
                    let reason = format!("downstream failed {} times (downstream.max_attempts = {max}); last: {reason}", p.attempts);
                    return self.write_pending(p, Target::DeadLetter { reason });
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
                let at = Instant::now() + wait;
                let seller = self.sellers.entry(key.clone()).or_insert_with(Seller::new);
                seller.delayed.push((at, p));
                self.timers.push(Reverse((at, Timer::Seller(key))));
            }
            Outcome::RetryAfter(_) => {
                unreachable!("a run ends at a 429 and returns the job as unused")
            }
        }
    }

    fn on_run_ended(&mut self, key: Arc<str>, unused: Vec<Pending>, throttled: Option<Duration>) {
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
            self.hold(&key, Instant::now() + wait);
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
        let not_before_unix_ms = unix_ms() + (wait.as_micros() as u64).div_ceil(1000);
        self.write_pending(p, Target::Retry { not_before_unix_ms });
    }

    fn write_pending(&mut self, p: Pending, target: Target) {
        let Pending {
            job,
            origin,
            original,
            attempts,
        } = p;
        self.write(origin, original, Some(job.job_id), attempts, target);
    }

    fn write(
        &mut self,
        origin: Origin,
        original: OriginalRecord,
        job_id: Option<String>,
        attempts: u32,
        target: Target,
    ) {
        let pending = PendingWrite {
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
        let topic = match pending.target {
            Target::DeadLetter { .. } => kafka.dlq_topic.clone(),
            Target::Retry { .. } => kafka.retry_topic.clone(),
        };
        self.tasks += 1;
        tokio::spawn(async move {
            if !after.is_zero() {
                tokio::time::sleep(after).await;
            }
            let result = match &pending.target {
                Target::DeadLetter { reason } => {
                    sink.dead_letter(&topic, &pending.original, reason, pending.attempts)
                        .await
                }
                Target::Retry { not_before_unix_ms } => {
                    sink.to_retry_topic(
                        &topic,
                        &pending.original,
                        *not_before_unix_ms,
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
                if let Target::DeadLetter { reason } = &pending.target {
                    JobDeadLettered {
                        job_id: pending.job_id.as_deref(),
                        reason,
                        topic: &pending.origin.topic,
                        partition: pending.origin.partition,
                        offset: pending.origin.offset,
                    }
                    .emit();
                }
                self.deps.consumer.finish(&pending.origin);
                self.buffered -= 1;
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
                    self.buffered -= 1;
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
                if self.paused {
                    self.deps.consumer.pause(&parts);
                }
            }
            PartitionEvent::Revoked(parts) => {
                let consumer = self.deps.consumer.clone();
                let mut dropped = 0;
                for seller in self.sellers.values_mut() {
                    let before = seller.queue.len() + seller.delayed.len();
                    seller.queue.retain(|p| consumer.is_current(&p.origin));
                    seller
                        .delayed
                        .retain(|(_, p)| consumer.is_current(&p.origin));
                    dropped += before - seller.queue.len() - seller.delayed.len();
                }
                for part in &parts {
                    if let Some(q) = self.parked.remove(part) {
                        dropped += q.len();
                    }
                }
                self.buffered -= dropped;
                self.sellers.retain(|_, s| !s.is_empty());
                RevokedJobsDropped {
                    partitions: parts.len(),
                    jobs: dropped,
                }
                .emit();
            }
        }
    }

    /// Commits the finished prefix of each partition; returns how many
    /// partitions were committed.
    fn commit(&mut self, sync: bool) -> usize {
        match self.deps.consumer.commit(sync) {
            Ok(0) => 0,
            Ok(n) => {
                OffsetsCommitted {
                    partitions: n,
                    sync,
                }
                .emit();
                n
            }
            Err(e) => {
                CommitFailed {
                    error: &e.to_string(),
                }
                .emit();
                0
            }
        }
    }

    /// Pauses every partition at `worker.max_buffered` jobs in memory and
    /// resumes below 90 % of it.
    fn backpressure(&mut self) {
        let max = self.settings.worker.max_buffered;
        if !self.paused && self.buffered >= max {
            self.paused = true;
            self.deps.consumer.pause(&self.deps.consumer.assignment());
            Backpressure {
                paused: true,
                buffered: self.buffered,
            }
            .emit();
        } else if self.paused && self.buffered < max - max / 10 {
            self.paused = false;
            let parts: Vec<Partition> = self
                .deps
                .consumer
                .assignment()
                .into_iter()
                .filter(|p| !self.parked.contains_key(p))
                .collect();
            self.deps.consumer.resume(&parts);
            Backpressure {
                paused: false,
                buffered: self.buffered,
            }
            .emit();
        }
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

/// Removes and returns the first `n` partition heads, in queue order.
fn take_partition_heads(queue: &mut VecDeque<Pending>, n: usize) -> Vec<Pending> {
    let heads = partition_heads(queue, n);
    let mut out: Vec<Pending> = heads
        .iter()
        .rev()
        .filter_map(|&i| queue.remove(i))
        .collect();
    out.reverse();
    out
}

fn far() -> Instant {
    Instant::now() + Duration::from_secs(3600)
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The local instant of a Unix time in ms (now, if it has passed).
fn instant_of(unix_ms_at: u64) -> Instant {
    Instant::now() + Duration::from_millis(unix_ms_at.saturating_sub(unix_ms()))
}
