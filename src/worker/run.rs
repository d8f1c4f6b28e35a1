//! Downstream runs: a granted batch called in order per partition, a
//! pacer's granted jobs called at their go-at, each call's answer, and the
//! downstream's 429s (a hold for the seller, shared with every replica
//! through the limiter).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use crate::backoff::backoff_with;
use crate::downstream::{Answer, RetryAfter};
use crate::kafka::consumer::TopicPartition;
use crate::telemetry::events::{
    DownstreamFailed, DownstreamThrottled, JobDone, RevokedWorkDropped,
};

use super::engine::{Engine, Event, Pending};
use super::outage::Health;
use super::ports::{Caller, Clock, Permits, Ports, Source};
use super::retry::Target;
use super::sellers::Phase;
use super::timers::{after, Timer};

/// A job of a run: its place in the run, its `X-Granted-At`, the job.
type Granted = (usize, Option<u64>, Pending);

/// A 429 met by a run: what it asked for, and the attempts of the job it
/// answered (the worker's own backoff grows with them).
#[derive(Debug, Clone, Copy)]
pub(super) struct Throttle {
    pub(super) retry_after: RetryAfter,
    pub(super) attempts: u32,
}

impl<X: Ports> Engine<X> {
    /// Runs granted jobs: the jobs of each partition one after the other
    /// (so one seller's jobs of a partition reach the downstream in offset
    /// order), the partitions side by side (so every job is called close to
    /// its grant, which is what keeps the downstream's view of the rate
    /// exact). Each job comes with its grant's instant on the limiter's
    /// clock (`X-Granted-At`; none when no store decided: fail-open,
    /// local). A 429 stops the whole run; what was not called comes back in
    /// order. Every job holds a slot, taken by the caller, and gives it back
    /// with its answer, or when its chain stops short of it.
    pub(super) fn spawn_run(&mut self, seller: Arc<str>, batch: Vec<(Option<u64>, Pending)>) {
        let (caller, tx, source, permits, clock) = (
            self.deps.caller.clone(),
            self.tx.clone(),
            self.deps.source.clone(),
            self.deps.permits.clone(),
            self.deps.clock.clone(),
        );
        self.tasks += 1;
        // Each job with its place in the run, to put back what a 429 left.
        let mut chains: Vec<(TopicPartition, Vec<Granted>)> = Vec::new();
        for (i, (granted_at, p)) in batch.into_iter().enumerate() {
            let part = TopicPartition::new(p.origin.topic.clone(), p.origin.partition);
            match chains.iter_mut().find(|(k, _)| *k == part) {
                Some((_, chain)) => chain.push((i, granted_at, p)),
                None => chains.push((part, vec![(i, granted_at, p)])),
            }
        }
        tokio::spawn(async move {
            let throttles: Mutex<Vec<Throttle>> = Mutex::new(Vec::new());
            let stopped = || throttles.lock().map_or(true, |t| !t.is_empty());
            // An operator's pause stops every chain before its next call.
            let paused = || permits.paused(&seller, clock.unix_ms()).is_some();
            let runs = chains.into_iter().map(|(_, chain)| {
                let (caller, tx, seller, throttles, source, paused) =
                    (&caller, &tx, &seller, &throttles, &source, &paused);
                async move {
                    let mut unused = Vec::new();
                    let mut jobs = chain.into_iter();
                    while let Some((i, granted_at, p)) = jobs.next() {
                        // A revoked job is not called: its new owner does.
                        if stopped() || paused() || !source.owns(&p.origin) {
                            unused.push((i, p));
                            continue;
                        }
                        match caller.call(&p.job, granted_at).await {
                            Answer::Throttled(retry_after) => {
                                if let Ok(mut t) = throttles.lock() {
                                    t.push(Throttle {
                                        retry_after,
                                        attempts: p.attempts,
                                    });
                                }
                                unused.push((i, p));
                                unused.extend(jobs.by_ref().map(|(i, _, p)| (i, p)));
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
                    // The jobs this chain will not call give their slots
                    // back now, not when the run's slowest chain ends.
                    if !unused.is_empty() {
                        let _ = tx.send(Event::ChainStopped {
                            seller: seller.clone(),
                            slots: unused.len(),
                        });
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
            let throttled = throttles.into_inner().unwrap_or_default();
            let unused = unused.into_iter().map(|(_, p)| p).collect();
            let _ = tx.send(Event::RunEnded {
                seller,
                unused,
                throttled,
            });
        });
    }

    /// Calls a pacer's granted jobs whose go-at has come, each in a run of
    /// its own with a slot of its own. One that finds every slot taken waits
    /// for the next free slot, ahead of any seller's ask.
    pub(super) fn call_paced(&mut self, key: &Arc<str>) {
        if self.pause_of(key).is_some() {
            // Granted before the pause; asked for again after it.
            self.unpace(key);
            return self.ask_if_ready(key);
        }
        let now = self.deps.clock.now();
        let source = self.deps.source.clone();
        let mut due = Vec::new();
        let mut gone = Vec::new();
        let Some(seller) = self.sellers.map.get_mut(key) else {
            return;
        };
        while let Some(head) = seller.paced.front() {
            if head.go_at > now {
                self.timers.at(head.go_at, Timer::Paced(key.clone()));
                break;
            }
            if !source.owns(&head.pending.origin) {
                gone.extend(seller.paced.pop_front());
                continue;
            }
            if self.sellers.slots_free == 0 {
                if !seller.wants_paced_slot {
                    seller.wants_paced_slot = true;
                    self.sellers.paced_waiters.push_back(key.clone());
                }
                break;
            }
            self.sellers.slots_free -= 1;
            seller.reserved += 1;
            seller.runs += 1;
            due.extend(seller.paced.pop_front());
        }
        seller.settle_phase();
        let idle = seller.phase == Phase::Idle;
        for q in &gone {
            self.memory.remove(q.pending.bytes);
        }
        if !gone.is_empty() {
            RevokedWorkDropped {
                jobs: gone.len(),
                stage: "paced",
            }
            .emit();
        }
        for q in due {
            self.spawn_run(key.clone(), vec![(Some(q.granted_at_us), q.pending)]);
        }
        if idle {
            self.ask_if_ready(key);
        }
    }

    pub(super) fn on_called(&mut self, key: Arc<str>, mut p: Pending, outcome: Answer) {
        // Answered: its slot of the seller's max_in_flight goes back.
        p.lease = None;
        p.attempts += 1;
        if let Some(seller) = self.sellers.get_mut(&key) {
            seller.reserved = seller.reserved.saturating_sub(1);
        }
        self.release(1);
        let now = self.deps.clock.now();
        // What the answer says of the downstream as a whole, whoever owns
        // the job now.
        let health = match &outcome {
            Answer::Unreachable { .. } => Health::Failed {
                job_id: &p.job.job_id,
            },
            Answer::Unavailable { retry_after, .. } => Health::Down {
                retry_after: *retry_after,
            },
            Answer::Done
            | Answer::Retryable { .. }
            | Answer::Fatal { .. }
            | Answer::Throttled(_) => Health::Answered,
        };
        let reached_nothing = matches!(outcome, Answer::Unreachable { .. });
        let woken = self.outage.record(health, now);
        for seller in woken {
            self.ask_if_ready(&seller);
        }
        if !self.deps.source.owns(&p.origin) {
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
                if let Some(seller) = self.sellers.get_mut(&key) {
                    seller.throttles_in_a_row = 0;
                }
                JobDone {
                    job_id: &p.job.job_id,
                    attempts: p.attempts,
                }
                .emit();
                self.deps.source.finish(&p.origin);
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
            Answer::Unavailable { .. } => self.hold_for_outage(key, p),
            Answer::Unreachable { .. } if self.outage.is_open() => self.hold_for_outage(key, p),
            Answer::Retryable { reason } | Answer::Unreachable { reason } => {
                let max = self.settings.downstream.max_attempts;
                // A call that reached nothing, when the downstream answered
                // nothing else since this job's previous failure, cannot be
                // told from a dead downstream: it spends no attempt (the job
                // waits with its backoff). Judged against the previous
                // failure, not the first: answers between two outages (a
                // 429, say) do not make the attempts of the first one count.
                let previous = p.last_failed_at.replace(now);
                if reached_nothing && previous.is_some_and(|at| !self.outage.answered_since(at)) {
                    p.attempts = p.attempts.saturating_sub(1);
                }
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
                p.failures_in_a_row += 1;
                let d = &self.settings.downstream;
                let step = p.failures_in_a_row.max(p.attempts);
                let wait = backoff_with(step, d.backoff_base, d.backoff_max, &mut self.rng);
                DownstreamFailed {
                    job_id: &p.job.job_id,
                    attempts: p.attempts,
                    reason: &reason,
                    backoff: wait,
                }
                .emit();
                let at = after(self.deps.clock.now(), wait);
                self.sellers.entry(&key).delayed.push((at, p));
                self.timers.at(at, Timer::Seller(key));
            }
            Answer::Throttled(_) => {
                unreachable!("a run ends at a 429 and returns the job as unused")
            }
        }
    }

    /// A job whose call failed while the downstream is out of service: it
    /// keeps its attempt and waits for the outage to end (its seller waits
    /// on the breaker).
    fn hold_for_outage(&mut self, key: Arc<str>, mut p: Pending) {
        p.attempts = p.attempts.saturating_sub(1);
        p.last_failed_at = None;
        p.failures_in_a_row = 0;
        let now = self.deps.clock.now();
        self.sellers.entry(&key).delayed.push((now, p));
        self.ask_if_ready(&key);
    }

    pub(super) fn on_run_ended(
        &mut self,
        key: Arc<str>,
        unused: Vec<Pending>,
        throttled: Vec<Throttle>,
    ) {
        let before = unused.len();
        let source = self.deps.source.clone();
        let (unused, gone): (Vec<Pending>, Vec<Pending>) =
            unused.into_iter().partition(|p| source.owns(&p.origin));
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
        let seller = self.sellers.entry(&key);
        seller.runs = seller.runs.saturating_sub(1);
        // Every slot of the run is back already: a called job's with its
        // answer, the others' when their chain stopped.
        let mut back = unused;
        if !throttled.is_empty() {
            // The downstream refuses the seller now: its paced jobs wait
            // again with the rest (their units are lost, as a 429's are).
            for q in std::mem::take(&mut seller.paced) {
                if source.owns(&q.pending.origin) {
                    back.push(q.pending);
                } else {
                    self.memory.remove(q.pending.bytes);
                }
            }
        }
        let seller = self.sellers.entry(&key);
        for mut p in back.into_iter().rev() {
            // Not called: asked for again, its slot given back meanwhile.
            p.lease = None;
            seller.queue.push_front(p);
        }
        seller.settle_phase();
        // A 429 is an answer: the downstream is up. A probe that ended
        // without an answer lets the next seller probe.
        self.outage.probe_dropped(&key);
        if !throttled.is_empty() {
            let now = self.deps.clock.now();
            for seller in self.outage.record(Health::Answered, now) {
                if seller != key {
                    self.ask_if_ready(&seller);
                }
            }
        }
        if let Some(wait) = self.throttle_wait(&key, &throttled) {
            DownstreamThrottled {
                seller: &key,
                retry_after: wait,
            }
            .emit();
            let now = self.deps.clock.now();
            self.hold(&key, after(now, wait));
            // Share the 429 with every replica through the limiter.
            let (permits, seller_id) = (self.deps.permits.clone(), key.clone());
            tokio::spawn(async move {
                if let Err(e) = permits.block(&seller_id, wait).await {
                    tracing::warn!(error = %e, "could not share the downstream's 429 through Redis; other replicas learn it from their own calls");
                }
            });
        }
        self.ask_if_ready(&key);
    }

    /// A chain of a run stopped (a 429, a revoke) with `slots` jobs it will
    /// not call: their slots go to whoever waits, while the run's other
    /// chains finish.
    pub(super) fn on_chain_stopped(&mut self, key: &Arc<str>, slots: usize) {
        if let Some(seller) = self.sellers.get_mut(key) {
            seller.reserved = seller.reserved.saturating_sub(slots);
        }
        self.release(slots);
    }

    /// The hold a run's 429s ask for: the longest. A 429 that names no
    /// useful wait (none, garbage, zero, a date in the past) gets the
    /// worker's own backoff, growing with the seller's 429s in a row and
    /// jittered so that replicas do not come back in lockstep: without it
    /// "Retry-After: 0" is a tight loop (a 429 never spends an attempt).
    fn throttle_wait(&mut self, key: &Arc<str>, throttled: &[Throttle]) -> Option<Duration> {
        if throttled.is_empty() {
            return None;
        }
        let d = &self.settings.downstream;
        let (base, max) = (d.backoff_base, d.backoff_max);
        let seller = self.sellers.entry(key);
        seller.throttles_in_a_row = seller.throttles_in_a_row.saturating_add(1);
        let in_a_row = seller.throttles_in_a_row;
        let rng = &mut self.rng;
        throttled
            .iter()
            .map(|t| match t.retry_after {
                RetryAfter::Wait(wait) if !wait.is_zero() => wait,
                _ => backoff_with(in_a_row.max(t.attempts + 1), base, max, rng),
            })
            .max()
    }

    /// Refuses a seller until `until` (never shortening a longer hold). A
    /// wait longer than `worker.max_inline_delay` sends its waiting jobs to
    /// the retry topic instead of holding them in memory.
    pub(super) fn hold(&mut self, key: &Arc<str>, until: Instant) {
        let now = self.deps.clock.now();
        let max_inline = self.settings.worker.max_inline_delay;
        let Some(seller) = self.sellers.get_mut(key) else {
            return;
        };
        let until = seller.blocked_until.map_or(until, |t| t.max(until));
        seller.blocked_until = Some(until);
        let wait = until.saturating_duration_since(now);
        if wait > max_inline {
            let waiting: Vec<Pending> = seller.queue.drain(..).collect();
            for p in waiting {
                self.defer(p, wait);
            }
        }
        self.timers.at(until, Timer::Seller(key.clone()));
    }
}
