//! Downstream runs: a granted batch called in order per partition, a
//! pacer's granted jobs called at their go-at, each call's answer, and the
//! downstream's 429s (a hold for the seller, shared with every replica
//! through the limiter).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use crate::downstream::{Answer, RetryAfter};
use crate::kafka::consumer::Origin;
use crate::telemetry::events::{
    ConcurrencyLimit, DownstreamFailed, DownstreamOutage, DownstreamThrottled, JobDone,
    LeaseLapsed, RevokedWorkDropped,
};

use super::super::answers::{self, Action, Met429, Policy, Seen, Tries};
use super::super::concurrency::{Reason, Sample};
use super::super::handoff::{route, Route};
use super::super::ordering::Lane;
use super::super::outage::{Health, Turned};
use super::super::pending::Pending;
use super::super::pool::Slots;
use super::super::ports::{Caller, Clock, Permits, Ports, Source};
use super::super::tiers::Target;
use super::super::timers::Timer;
use super::super::waits::HeldBy;
use super::{Engine, Event};

/// When a call started, how long it took, and how many calls of this
/// replica were out as it started (its own too): what the adaptive limit
/// learns from.
#[derive(Debug, Clone, Copy)]
pub(super) struct Timing {
    started_at: Instant,
    latency: Duration,
    in_flight: usize,
}

/// A job of a run: its place in the run, its `X-Granted-At`, the job.
type Granted = (usize, Option<u64>, Pending);

/// A 429 met by a run: what it asked for, and the attempts of the job it
/// answered (the worker's own backoff grows with them).
#[derive(Debug, Clone, Copy)]
pub(super) struct Throttle {
    retry_after: RetryAfter,
    attempts: u32,
    /// When the call that met it started, and its grant (`X-Granted-At`,
    /// the limiter's clock; none without a store): a learnt limit drops
    /// once for the calls granted before a drop (`limits.learn`).
    started_at: Instant,
    granted_at: Option<u64>,
}

impl<X: Ports> Engine<X> {
    /// Runs granted jobs: the jobs of each lane one after the other (so a
    /// lane's jobs reach the downstream in offset order; a grant holds one
    /// job per lane, so each chain is one call today), the lanes side by
    /// side (so every job is called close to
    /// its grant, which is what keeps the downstream's view of the rate
    /// exact). Each job comes with its slot and its grant's instant on the
    /// limiter's clock (`X-Granted-At`; none when no store decided:
    /// fail-open, local). A 429 stops the whole run; what was not called
    /// comes back in order, its slots given back as its chain stops.
    pub(super) fn spawn_run(&mut self, seller: Arc<str>, batch: Vec<(Option<u64>, Pending)>) {
        let (caller, tx, source, permits, clock) = (
            self.deps.caller.clone(),
            self.tx.clone(),
            self.deps.source.clone(),
            self.deps.permits.clone(),
            self.deps.clock.clone(),
        );
        let call_timeout = self.settings.downstream.timeout;
        self.tasks += 1;
        for (_, p) in &batch {
            self.handoff.started(&p.origin);
        }
        let chains = chains(batch);
        tokio::spawn(async move {
            let throttles: Mutex<Vec<Throttle>> = Mutex::new(Vec::new());
            let stopped = || throttles.lock().map_or(true, |t| !t.is_empty());
            // An operator's pause stops every chain before its next call.
            let paused = || permits.paused(&seller, clock.unix_ms()).is_some();
            // A revoked job is not called, nor one whose partition is being
            // revoked: its new owner does. Nor any while the session may be
            // lost (issue 53): they wait for it to be confirmed.
            let go =
                |o: &Origin| !stopped() && !paused() && !source.fenced() && source.may_start(o);
            // Nor one whose max_in_flight slot may lapse before the call
            // ends: another replica may take it meanwhile (issue 53). It
            // goes back, and is asked for again with a fresh slot.
            let leased = |p: &Pending| {
                p.lease
                    .as_ref()
                    .is_none_or(|l| l.covers(clock.now(), call_timeout))
            };
            let runs = chains.into_iter().map(|chain| {
                let (caller, tx, seller, throttles, go, leased, clock) =
                    (&caller, &tx, &seller, &throttles, &go, &leased, &clock);
                async move {
                    let mut unused = Vec::new();
                    let mut lapsed = 0;
                    let mut jobs = chain.into_iter();
                    while let Some((i, granted_at, mut p)) = jobs.next() {
                        if !go(&p.origin) {
                            unused.push((i, p));
                            continue;
                        }
                        if !leased(&p) {
                            // The rest of its lane stays behind it, in order.
                            let before = unused.len();
                            unused.push((i, p));
                            unused.extend(jobs.by_ref().map(|(i, _, p)| (i, p)));
                            lapsed += unused.len() - before;
                            continue;
                        }
                        // The call starts: its units are used, whatever
                        // happens to the job from here.
                        if let Some(charge) = p.charge.take() {
                            charge.spend();
                        }
                        let started_at = clock.now();
                        let in_flight = p.slot.as_ref().map_or(0, Slots::taken_in_pool);
                        let answer = caller.call(&p.job, granted_at).await;
                        let timing = Timing {
                            started_at,
                            latency: clock.now().saturating_duration_since(started_at),
                            in_flight,
                        };
                        match answer {
                            Answer::Throttled(retry_after) => {
                                if let Ok(mut t) = throttles.lock() {
                                    let attempts = p.attempts;
                                    t.push(Throttle {
                                        retry_after,
                                        attempts,
                                        started_at,
                                        granted_at,
                                    });
                                }
                                unused.push((i, p));
                                unused.extend(jobs.by_ref().map(|(i, _, p)| (i, p)));
                            }
                            outcome => {
                                let pending = p;
                                let seller = seller.clone();
                                let _ = tx.send(Event::Called {
                                    seller,
                                    pending,
                                    outcome,
                                    timing,
                                });
                            }
                        }
                    }
                    if lapsed > 0 {
                        LeaseLapsed { jobs: lapsed }.emit();
                    }
                    // The jobs this chain will not call give their slots
                    // back now, not when the run's slowest chain ends.
                    if let Some(slots) = slots_of(&mut unused) {
                        let _ = tx.send(Event::ChainStopped { slots });
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
            self.scheduler.unpace(key);
            return self.ask_if_ready(key);
        }
        let now = self.deps.clock.now();
        let source = self.deps.source.clone();
        let owns = |o: &Origin| source.may_start(o);
        let due = self.scheduler.due_paced(key, now, &owns);
        if let Some(at) = due.next_at {
            self.timers.at(at, Timer::Paced(key.clone()));
        }
        for p in &due.gone {
            self.forget(p);
        }
        if !due.gone.is_empty() {
            RevokedWorkDropped {
                jobs: due.gone.len(),
                stage: "paced",
            }
            .emit();
        }
        for (granted_at, p) in due.run {
            self.spawn_run(key.clone(), vec![(Some(granted_at), p)]);
        }
        if due.idle {
            self.ask_if_ready(key);
        }
    }

    /// A call's answer: done, dead-lettered, held for an outage, or backed
    /// off for another attempt.
    pub(super) fn on_called(
        &mut self,
        key: Arc<str>,
        mut p: Pending,
        outcome: Answer,
        timing: Timing,
    ) {
        // Answered: its slots (the downstream's, its seller's
        // max_in_flight) go back.
        p.lease = None;
        p.slot = None;
        p.attempts += 1;
        let shed = self.learn_concurrency(timing, &outcome);
        // The slot it freed is handed on by the loop, once every answer
        // that came with this one is in: the turns then choose among all
        // the slots freed together.
        let now = self.deps.clock.now();
        // What the answer says of the downstream as a whole, whoever owns
        // the job now.
        let health = answers::health(&outcome, &p.job.job_id, timing.started_at);
        for seller in self.record_health(health, now) {
            self.ask_if_ready(&seller);
        }
        // Its partition may be asked about again, while the rest of the
        // run is out: in its turn.
        self.scheduler.returned(&key, p.lane);
        self.queue_if_ready(&key);
        if !self.deps.source.owns(&p.origin) {
            // The partition moved on while the call was out: its new owner
            // has the record and decides; no retry, no dead letter from here.
            self.forget(&p);
            return RevokedWorkDropped {
                jobs: 1,
                stage: "answer",
            }
            .emit();
        }
        let revoking = !self.deps.source.may_start(&p.origin);
        if route(revoking, matches!(outcome, Answer::Done)) == Route::HandOver {
            // Its partition is being revoked: the revoke waits for this
            // answer, and a failure goes to the next owner as it is.
            self.forget(&p);
            return RevokedWorkDropped {
                jobs: 1,
                stage: "revoking",
            }
            .emit();
        }
        self.scheduler.called(&key, matches!(outcome, Answer::Done));
        self.carry_out(key, p, outcome, shed, now);
    }

    /// What [`answers::decide`] makes of a call's answer, carried out: the
    /// job done, dead-lettered, held for the outage, or backed off.
    fn carry_out(
        &mut self,
        key: Arc<str>,
        mut p: Pending,
        outcome: Answer,
        shed: bool,
        now: Instant,
    ) {
        let tries = Tries {
            attempts: p.attempts,
            failures_in_a_row: p.failures_in_a_row,
            last_failed_at: p.last_failed_at,
        };
        let seen = Seen {
            outage: self.outage.is_open(),
            last_answer: self.outage.last_answer(),
            shed,
        };
        let policy = Policy::of(&self.settings.downstream);
        let decision = answers::decide(outcome, tries, seen, &policy, now, &mut self.rng);
        let Tries {
            attempts,
            failures_in_a_row,
            last_failed_at,
        } = decision.tries;
        (p.attempts, p.failures_in_a_row, p.last_failed_at) =
            (attempts, failures_in_a_row, last_failed_at);
        match decision.action {
            Action::Done => {
                JobDone {
                    job_id: &p.job.job_id,
                    attempts: p.attempts,
                }
                .emit();
                self.deps.source.finish(&p.origin);
                self.forget(&p);
            }
            Action::DeadLetter { kind, reason } => {
                self.write_pending(p, Target::DeadLetter { kind, reason });
            }
            // Its seller waits on the breaker.
            Action::HoldForOutage => {
                self.scheduler.back_off(&key, now, p);
                self.ask_if_ready(&key);
            }
            Action::RetryAt {
                at, wait, reason, ..
            } => {
                DownstreamFailed {
                    job_id: &p.job.job_id,
                    attempts: p.attempts,
                    reason: &reason,
                    backoff: wait,
                }
                .emit();
                self.scheduler.back_off(&key, at, p);
                self.timers.at(at, Timer::Seller(key));
            }
        }
    }

    /// Records what an answer says of the downstream with the outage, and
    /// reports the breaker opening or closing. Returns the sellers to wake.
    fn record_health(&mut self, health: Health<'_>, now: Instant) -> Vec<Arc<str>> {
        let recorded = self.outage.record(health, now);
        match recorded.turned {
            Some(Turned::Opened) => DownstreamOutage {
                open: true,
                lasted: Duration::ZERO,
                probes: 0,
            }
            .emit(),
            Some(Turned::Closed { lasted, probes }) => DownstreamOutage {
                open: false,
                lasted,
                probes,
            }
            .emit(),
            None => {}
        }
        recorded.woken
    }

    /// What a call's answer says of how many calls the downstream can take
    /// (`downstream.adaptive_concurrency`): shed or unreached calls and
    /// slow ones lower the limit, calls that kept up with every slot taken
    /// raise it. Slots freed by a raise are served as the loop turns.
    ///
    /// Returns whether the call was shed for the downstream's load: it
    /// failed as an overload and started with more calls out than the
    /// limit now allows (one of the calls too many). Such a call spends no
    /// attempt: no job is dead-lettered for the downstream's capacity. A
    /// call that fails so with no more out than the limit is the job's
    /// failure, and spends one.
    fn learn_concurrency(&mut self, timing: Timing, outcome: &Answer) -> bool {
        let Some(adaptive) = self.adaptive.as_mut() else {
            return false;
        };
        let sample = Sample {
            started_at: timing.started_at,
            latency: timing.latency,
            in_flight: timing.in_flight,
            overload: answers::overload(outcome),
        };
        let change = adaptive.on_sample(self.deps.clock.now(), sample);
        let shed = answers::shed(sample.overload, timing.in_flight, adaptive.slots());
        let Some(change) = change else {
            return shed;
        };
        self.scheduler.set_concurrency(change.to);
        let (window_ms, baseline_ms) = match change.reason {
            Reason::Latency { window, baseline } => (
                Some(window.as_millis() as u64),
                Some(baseline.as_millis() as u64),
            ),
            _ => (None, None),
        };
        ConcurrencyLimit {
            from: change.from,
            to: change.to,
            reason: change.reason.label(),
            in_flight: timing.in_flight,
            window_ms,
            baseline_ms,
            loud: change.loud,
        }
        .emit();
        shed
    }

    /// A run ended: what it did not call waits again (every slot of the
    /// run is back already: a called job's with its answer, the others'
    /// when their chain stopped), and its 429s hold the seller.
    pub(super) fn on_run_ended(
        &mut self,
        key: Arc<str>,
        unused: Vec<Pending>,
        throttled: Vec<Throttle>,
    ) {
        for p in &unused {
            self.scheduler.returned(&key, p.lane);
        }
        let source = self.deps.source.clone();
        let owns = |o: &Origin| source.may_start(o);
        let (unused, gone): (Vec<Pending>, Vec<Pending>) =
            unused.into_iter().partition(|p| owns(&p.origin));
        for p in &gone {
            self.forget(p);
        }
        if !gone.is_empty() {
            RevokedWorkDropped {
                jobs: gone.len(),
                stage: "run",
            }
            .emit();
        }
        let paced_gone = self
            .scheduler
            .run_ended(&key, unused, !throttled.is_empty(), &owns);
        for p in &paced_gone {
            self.forget(p);
        }
        // A 429 is an answer: the downstream is up. A probe that ended
        // without an answer lets the next seller probe.
        self.outage.probe_dropped(&key);
        // The latest call to leave tells the most (an earlier one may have
        // left before a 503's Retry-After: `Outage::record`).
        if let Some(started_at) = throttled.iter().map(|t| t.started_at).max() {
            let now = self.deps.clock.now();
            for seller in self.record_health(Health::Answered { started_at }, now) {
                if seller != key {
                    self.ask_if_ready(&seller);
                }
            }
        }
        if let Some(hold) = self.hold_for_429s(&key, &throttled) {
            let wait = hold.wait;
            DownstreamThrottled {
                seller: &key,
                retry_after: wait,
            }
            .emit();
            self.hold(&key, hold.until, HeldBy::Downstream429);
            // When the latest of them was decided, on the limiter's clock:
            // its grant, else its start as the store's clock had it.
            let permits = &self.deps.permits;
            let decided = throttled
                .iter()
                .filter_map(|t| {
                    t.granted_at
                        .or_else(|| permits.store_unix_ms(t.started_at).map(|ms| ms * 1000))
                })
                .max();
            self.share_throttle(key.clone(), wait, decided);
        }
        self.ask_if_ready(&key);
    }

    /// Shares a 429 with every replica through the limiter, in a task the
    /// drain awaits.
    fn share_throttle(&mut self, seller: Arc<str>, wait: Duration, decided_us: Option<u64>) {
        let (permits, tx) = (self.deps.permits.clone(), self.tx.clone());
        self.tasks += 1;
        tokio::spawn(async move {
            let result = permits.block(&seller, wait, decided_us).await;
            let _ = tx.send(Event::Shared { seller, result });
        });
    }

    /// The hold a run's 429s ask for ([`answers::hold_for_429s`]), each
    /// one more 429 in a row for the seller.
    fn hold_for_429s(
        &mut self,
        key: &Arc<str>,
        throttled: &[Throttle],
    ) -> Option<answers::Hold429> {
        if throttled.is_empty() {
            return None;
        }
        let in_a_row = self.scheduler.throttled(key);
        let met: Vec<Met429> = throttled
            .iter()
            .map(|t| Met429 {
                retry_after: t.retry_after,
                attempts: t.attempts,
            })
            .collect();
        let policy = Policy::of(&self.settings.downstream);
        let now = self.deps.clock.now();
        answers::hold_for_429s(&met, in_a_row, &policy, now, &mut self.rng)
    }

    /// Refuses a seller until `until` (never shortening a longer hold). A
    /// wait longer than `worker.max_inline_delay` sends its waiting jobs to
    /// the retry topic instead of holding them in memory.
    pub(super) fn hold(&mut self, key: &Arc<str>, until: Instant, by: HeldBy) {
        let now = self.deps.clock.now();
        let max_inline = self.settings.worker.max_inline_delay;
        let Some((until, waiting)) = self.scheduler.hold(key, until, by, now, max_inline) else {
            return;
        };
        let wait = until.saturating_duration_since(now);
        for p in waiting {
            self.defer(p, wait);
        }
        self.timers.at(until, Timer::Seller(key.clone()));
    }
}

/// A run's jobs by lane, each with its place in the run (to put back
/// in order what a 429 left).
fn chains(batch: Vec<(Option<u64>, Pending)>) -> Vec<Vec<Granted>> {
    let mut chains: Vec<(Lane, Vec<Granted>)> = Vec::new();
    for (i, (granted_at, p)) in batch.into_iter().enumerate() {
        let lane = p.lane;
        match chains.iter_mut().find(|(k, _)| *k == lane) {
            Some((_, chain)) => chain.push((i, granted_at, p)),
            None => chains.push((lane, vec![(i, granted_at, p)])),
        }
    }
    chains.into_iter().map(|(_, chain)| chain).collect()
}

/// The downstream slots of jobs a chain will not call, together.
fn slots_of(unused: &mut [(usize, Pending)]) -> Option<Slots> {
    let mut all: Option<Slots> = None;
    for slot in unused.iter_mut().filter_map(|(_, p)| p.slot.take()) {
        match &mut all {
            Some(all) => all.join(slot),
            None => all = Some(slot),
        }
    }
    all
}
