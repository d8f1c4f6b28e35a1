//! Limiter calls and their answers: a seller that is ready asks for its
//! partition heads; the answer (or the failure policy's, when the call
//! failed) grants, refuses, or says a job can never pass.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use tokio::time::Instant;

use crate::dead_letter::DeadLetterKind;
use crate::kafka::consumer::Origin;
use crate::limiter::{BatchDecision, CannotPass, DeniedBy, NextJob};
use crate::telemetry::events::{
    JobsAdmitted, LimiterCalled, LimiterNever, LimiterUnavailable, SellerThrottled, SellerWaiting,
};

use super::super::admission::Failed;
use super::super::ports::{Clock, PermitError, Permits, Ports, Source};
use super::super::scheduler::{Answered, Grant, Ready, SlotWait};
use super::super::tiers::Target;
use super::super::timers::{after, Timer};
use super::super::waits::HeldBy;
use super::{Engine, Event};

/// How often a seller held by a fenced session looks again: a fence ends
/// with a commit the coordinator accepts (tried every second) or a new
/// assignment, so a few looks a second resume soon after.
const FENCE_RECHECK: Duration = Duration::from_millis(200);

impl<X: Ports> Engine<X> {
    /// Asks the limiter for a seller that is not asking already, not held
    /// and has work on a partition with no job out, when a downstream slot
    /// is free and it is its turn; otherwise it waits for a slot (in the
    /// fair turns), its pause or the outage's probe.
    pub(super) fn ask_if_ready(&mut self, key: &Arc<str>) {
        self.ready_to_ask(key, false);
    }

    /// As [`Engine::ask_if_ready`], but a seller that is ready joins the
    /// turns even when a slot is free: for a seller whose own call just
    /// answered, which must not take the slot its answer freed ahead of
    /// sellers already waiting (the loop serves the turns next).
    pub(super) fn queue_if_ready(&mut self, key: &Arc<str>) {
        self.ready_to_ask(key, true);
    }

    fn ready_to_ask(&mut self, key: &Arc<str>, queue_only: bool) {
        let now = self.deps.clock.now();
        let (ready, next_backoff) = self.scheduler.ready(key, now);
        if let Some(at) = next_backoff {
            self.timers.at(at, Timer::Seller(key.clone()));
        }
        match ready {
            Ready::NotNow => return,
            // Its jobs are gone (revoked, finished): a probe it held goes
            // to the next seller.
            Ready::Empty => return self.outage.probe_dropped(key),
            Ready::Waiting => {}
        }
        // A replica that may have lost its session asks for nothing it
        // could not call; it looks again shortly (issue 53).
        if self.deps.source.fenced() {
            self.outage.probe_dropped(key);
            let at = after(now, FENCE_RECHECK);
            return self.timers.at(at, Timer::Seller(key.clone()));
        }
        // An operator's pause: no ask, no call, until it ends.
        if let Some(pause) = self.pause_of(key) {
            self.outage.probe_dropped(key);
            return self.hold_paused(key, pause);
        }
        self.scheduler.unpaused(key);
        if self.outage.waits_for_run(self.scheduler.runs(key)) {
            return;
        }
        let share = self.deps.permits.share(key);
        match self.scheduler.wait_for_slot(key, share, queue_only) {
            SlotWait::Go => {}
            SlotWait::Wait { began } => {
                if began {
                    SellerWaiting::capacity(key).emit();
                }
                return;
            }
        }
        // During a downstream outage only one probe call goes out at a
        // time. The probe is claimed here, where the limiter is asked at
        // once, and not before the wait for a slot: a seller that waits,
        // is paused or loses its jobs never sits on it.
        let probe = match self.outage.admit(key, now) {
            Ok(probe) => probe,
            Err(until) => return self.timers.at(until, Timer::Seller(key.clone())),
        };
        let costs = self.scheduler.ask(key, share, probe, now);
        if !costs.is_empty() {
            self.spawn_ask(key.clone(), costs);
        }
    }

    /// Queues an ask for this turn of the loop; [`Engine::flush_asks`]
    /// sends the turn's asks together.
    fn spawn_ask(&mut self, seller: Arc<str>, costs: Vec<u64>) {
        self.tasks += 1;
        LimiterCalled.emit();
        self.asks.push((seller, costs));
    }

    /// Sends the asks of this turn of the loop as one group, in one
    /// limiter call (`Permits::acquire_jobs_many`): the sellers handed
    /// turns together travel together, whatever the timing of the tasks.
    /// Each answer comes back as its own event as soon as it is decided.
    pub(super) fn flush_asks(&mut self) {
        if self.asks.is_empty() {
            return;
        }
        let asks = std::mem::take(&mut self.asks);
        let (permits, tx, clock) = (
            self.deps.permits.clone(),
            self.tx.clone(),
            self.deps.clock.clone(),
        );
        let asked_at = clock.now();
        tokio::spawn(async move {
            let mut answers = std::pin::pin!(permits.acquire_jobs_many(&asks));
            while let Some((i, result)) = answers.next().await {
                let _ = tx.send(Event::Permit {
                    seller: asks[i].0.clone(),
                    result,
                    answered_at: clock.now(),
                    asked_at,
                });
            }
        });
    }

    /// A limiter answer: applied to its seller, then carried out.
    pub(super) fn on_permit(
        &mut self,
        key: Arc<str>,
        result: Result<BatchDecision, PermitError>,
        answered_at: Instant,
        asked_at: Instant,
    ) {
        let mut decision = match result {
            Ok(d) => {
                if self.admission.answered() {
                    self.deps.health.set_redis_down(false);
                }
                d
            }
            Err(error) => self.fallback(&key, &error),
        };
        // The slots a grant took, held from here: whatever is not handed
        // to a job goes back when dropped. Redis leases each from its
        // decision, after the ask left: counted from the ask, they lapse
        // here no later than there (a stall that held the answer back
        // counts against them).
        //
        // Its units too, held by its jobs until their calls start: those of
        // jobs that are gone already, or go uncalled (a revoke, a
        // shutdown), are given back.
        let (leases, charge) = match &mut decision {
            BatchDecision::Granted(g) => {
                let lapses_at = after(asked_at, self.settings.limits.slot_lease);
                let leases = self
                    .slots
                    .hold(&key, std::mem::take(&mut g.leases), lapses_at);
                let charge = self.charges.hold(&key, g);
                (leases.into_iter().map(Some).collect(), charge)
            }
            _ => (Vec::new(), None),
        };
        let now = self.deps.clock.now();
        let source = self.deps.source.clone();
        // A revoking partition's jobs are not called: the next owner has them.
        let owns = |o: &Origin| source.may_start(o);
        match self
            .scheduler
            .answered(&key, &decision, leases, charge, answered_at, now, &owns)
        {
            Answered::Gone => {}
            Answered::Granted(grant) => {
                let BatchDecision::Granted(g) = &decision else {
                    unreachable!("a grant answers a grant")
                };
                let near = (g.remaining, g.tightest);
                self.on_granted(key, grant, near, answered_at)
            }
            Answered::Denied { waiting } => {
                let BatchDecision::Denied(d) = decision else {
                    unreachable!("a refusal answers a refusal")
                };
                SellerThrottled {
                    seller: &key,
                    tier: &self.deps.permits.describe(&key).tier,
                    retry_after: d.retry_after,
                    waiting,
                    by: &denied_by(d.by),
                }
                .emit();
                self.outage.probe_dropped(&key);
                self.serve_turns();
                // Counted from when the answer arrived: never early,
                // whatever the clocks of Redis and this host say.
                self.hold(&key, after(answered_at, d.retry_after), HeldBy::of(d.by));
            }
            Answered::Never { first } => {
                let BatchDecision::Never(c) = decision else {
                    unreachable!("a never answers a never")
                };
                self.outage.probe_dropped(&key);
                self.serve_turns();
                if let Some(origin) = first {
                    self.never(&key, &origin, c);
                }
                self.ask_if_ready(&key);
            }
        }
    }

    /// A failed limiter call: the failure policy's decision, and readiness.
    fn fallback(&mut self, key: &Arc<str>, error: &PermitError) -> BatchDecision {
        let rules = self.deps.permits.rules_of(key);
        let asked = Failed {
            costs: self.scheduler.asked_costs(key),
            share: self.partitions.share(),
            max_in_flight: self.deps.permits.max_in_flight(key),
            busy: self.scheduler.out(key),
            rules: rules.as_ref().map(|(own, global)| (&own[..], &global[..])),
        };
        let fallback = self.admission.failed(key, asked, &mut self.rng);
        if fallback.now_unready {
            self.deps.health.set_redis_down(true);
        }
        let (hold, admitted) = match &fallback.decision {
            BatchDecision::Denied(d) => (d.retry_after, 0),
            BatchDecision::Granted(g) => (Duration::ZERO, g.jobs),
            BatchDecision::Never(_) => (Duration::ZERO, 0),
        };
        LimiterUnavailable {
            error: &error.to_string(),
            policy: self.admission.policy(),
            hold,
            in_a_row: fallback.in_a_row,
            admitted,
        }
        .emit();
        fallback.decision
    }

    /// A grant: its jobs run (a pacer's when their go-at comes), and the
    /// seller waits for what stopped the prefix short.
    fn on_granted(
        &mut self,
        key: Arc<str>,
        grant: Grant,
        (remaining, tightest): (u64, Option<usize>),
        answered_at: Instant,
    ) {
        // Jobs of partitions revoked since the revoke event was handled
        // belong to their new owner.
        for p in &grant.gone {
            self.forget(p);
        }
        if let Some(at) = grant.paced_at {
            self.timers.at(at, Timer::Paced(key.clone()));
        }
        let info = self.deps.permits.describe(&key);
        JobsAdmitted {
            seller: &key,
            tier: &info.tier,
            jobs: grant.jobs,
            units: grant.units,
            near_limit: info.near_limit(remaining, tightest),
        }
        .emit();
        match grant.next {
            // A long wait sends the rest of the queue to the retry tiers,
            // as any refusal does: a daily quota that runs out mid-batch
            // must not keep its backlog in memory.
            Some((NextJob::Wait { retry_after, by }, _)) => {
                let waiting = if by == DeniedBy::MaxInFlight {
                    SellerWaiting::in_flight(&key, retry_after)
                } else {
                    SellerWaiting::limit(&key, retry_after)
                };
                waiting.emit();
                self.hold(&key, after(answered_at, retry_after), HeldBy::of(by));
            }
            // Dead-lettered now, not retried forever.
            Some((NextJob::Never(c), Some(origin))) => self.never(&key, &origin, c),
            Some((NextJob::Never(_), None)) | None => {}
        }
        if grant.run.is_empty() {
            self.outage.probe_dropped(&key);
            self.serve_turns();
            return self.ask_if_ready(&key);
        }
        self.spawn_run(key.clone(), grant.run);
        // Back in the turns at once, for its partitions with no job out,
        // before the call's slots not handed to a job are served: a seller
        // out of the turns while its jobs run would leave its share to the
        // others.
        self.queue_if_ready(&key);
        self.serve_turns();
    }

    /// The seller's job at `origin` (the head the limiter looked at) costs
    /// more than a rule can ever hold: dead-letter it with the rule, its
    /// capacity and the cost, so it is not retried forever.
    fn never(&mut self, key: &Arc<str>, origin: &Origin, c: CannotPass) {
        let Some(p) = self.scheduler.take(key, origin) else {
            return;
        };
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
                kind: DeadLetterKind::CostOverCapacity.name(),
                reason,
            },
        );
    }
}

/// The `by` label of a refusal.
fn denied_by(by: DeniedBy) -> String {
    match by {
        DeniedBy::Rule(i) => format!("rule{i}"),
        DeniedBy::DownstreamBlock => "downstream_429".to_owned(),
        DeniedBy::Unavailable => "unavailable".to_owned(),
        DeniedBy::MaxInFlight => "max_in_flight".to_owned(),
    }
}
