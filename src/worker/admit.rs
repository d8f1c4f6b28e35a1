//! The limiter's answers, and the failure policy: what a grant, a refusal,
//! a "never" or a failed call means for a seller's waiting jobs.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::config::Settings;
use crate::kafka::consumer::Origin;
use crate::limiter::local::{self, LocalShare};
use crate::limiter::{BatchDecision, CannotPass, Denied, DeniedBy, NextJob, SLOT_POLL};
use crate::telemetry::events::{
    JobsAdmitted, LimiterNever, LimiterUnavailable, SellerThrottled, SellerWaiting,
};

use super::engine::{Engine, Pending};
use super::permit::OnLimiterError;
use super::ports::{Clock, PermitError, Permits, Ports, Source};
use super::retry::Target;
use super::sellers::{position, take_granted, Paced, Phase};
use super::timers::{after, Timer};

/// The engine's wall clock as the limiter models read it (µs).
pub(super) struct ModelClock<K>(Arc<K>);

impl<K> Clone for ModelClock<K> {
    fn clone(&self) -> Self {
        ModelClock(self.0.clone())
    }
}

impl<K: Clock> local::Clock for ModelClock<K> {
    fn now_us(&self) -> u64 {
        self.0.unix_us()
    }
}

/// What the engine knows of the limiter's health.
pub(super) struct Admission<K: Clock> {
    pub(super) on_error: OnLimiterError,
    /// Limiter calls failed in a row (0 after a success).
    pub(super) failures: u32,
    /// The in-memory limits of `redis.on_error = "local"`, used only while
    /// Redis does not answer.
    local: LocalShare<ModelClock<K>>,
}

impl<K: Clock> Admission<K> {
    pub(super) fn new(settings: &Settings, clock: Arc<K>) -> Admission<K> {
        Admission {
            on_error: OnLimiterError::from_setting(settings.redis.on_error),
            failures: 0,
            local: LocalShare::with_clock(ModelClock(clock)),
        }
    }
}

impl<X: Ports> Engine<X> {
    pub(super) fn on_permit(
        &mut self,
        key: Arc<str>,
        result: Result<BatchDecision, PermitError>,
        answered_at: Instant,
    ) {
        let unready_after = self.settings.redis.unready_after;
        let decision = match result {
            Ok(d) => {
                if self.admission.failures >= unready_after {
                    self.deps.health.set_redis_down(false);
                }
                if self.admission.failures > 0 {
                    self.admission.local.clear();
                }
                self.admission.failures = 0;
                d
            }
            Err(error) => {
                let failures = self.admission.failures.saturating_add(1);
                self.admission.failures = failures;
                if failures == unready_after {
                    self.deps.health.set_redis_down(true);
                }
                let decision = self.fallback(&key);
                let (hold, admitted) = match &decision {
                    BatchDecision::Denied(d) => (d.retry_after, 0),
                    BatchDecision::Granted(g) => (Duration::ZERO, g.jobs),
                    BatchDecision::Never(_) => (Duration::ZERO, 0),
                };
                LimiterUnavailable {
                    error: &error.to_string(),
                    policy: self.admission.on_error.name(),
                    hold,
                    in_a_row: failures,
                    admitted,
                }
                .emit();
                decision
            }
        };
        // The slots a grant took, held from here: whatever is not handed
        // to a job below goes back when dropped.
        let (decision, mut leases) = match decision {
            BatchDecision::Granted(mut g) => {
                let leases = self.slots.hold(&key, std::mem::take(&mut g.leases));
                let leases: Vec<Option<_>> = leases.into_iter().map(Some).collect();
                (BatchDecision::Granted(g), leases)
            }
            d => (d, Vec::new()),
        };
        let source = self.deps.source.clone();
        let Some(seller) = self.sellers.get_mut(&key) else {
            return;
        };
        seller.phase = Phase::Idle;
        seller.in_flight_bound = match &decision {
            BatchDecision::Denied(d) => d.by == DeniedBy::MaxInFlight,
            BatchDecision::Granted(g) => matches!(
                g.next,
                Some(NextJob::Wait {
                    by: DeniedBy::MaxInFlight,
                    ..
                })
            ),
            BatchDecision::Never(_) => false,
        };
        let reserved = std::mem::take(&mut seller.reserved);
        let asked = std::mem::take(&mut seller.asked);
        match decision {
            BatchDecision::Granted(g) => {
                // The job the prefix stopped at: the one asked for there,
                // whatever happened to the queue meanwhile.
                let next = asked.get(g.jobs).cloned();
                let batch: Vec<Pending> = take_granted(&mut seller.queue, &g, &asked)
                    .into_iter()
                    .map(|(k, mut p)| {
                        p.lease = leases.get_mut(k).and_then(|l| l.take());
                        p
                    })
                    .collect();
                // Jobs of partitions revoked since the revoke event was
                // handled belong to their new owner. (The queue itself is
                // purged by that event; checking the batch only keeps this
                // O(batch), not O(backlog), per limiter answer.)
                let (batch, gone): (Vec<Pending>, Vec<Pending>) =
                    batch.into_iter().partition(|p| source.owns(&p.origin));
                for p in &gone {
                    self.memory.remove(p.bytes);
                }
                let (jobs, units) = (batch.len(), batch.iter().map(|p| p.job.cost).sum());
                // Each job with its grant's instant (`X-Granted-At`): the
                // decision, or under a pacer its first unit's go-at. A paced
                // job whose go-at is still to come waits without a slot.
                let now = self.deps.clock.now();
                let mut go_now = Vec::new();
                let mut unit = 0u64;
                for p in batch {
                    let first_unit = unit;
                    unit += p.job.cost;
                    match g.pace {
                        Some(pace) => {
                            let go_at = after(answered_at, pace.unit_after(first_unit));
                            let granted_at_us = pace
                                .first_at_us
                                .saturating_add(first_unit.saturating_mul(pace.interval_us));
                            if go_at <= now {
                                go_now.push((Some(granted_at_us), p));
                            } else {
                                seller.paced.push_back(Paced {
                                    go_at,
                                    granted_at_us,
                                    pending: p,
                                });
                            }
                        }
                        None => go_now.push(((g.decided_at_us > 0).then_some(g.decided_at_us), p)),
                    }
                }
                let n = go_now.len();
                seller.reserved = n;
                seller.runs = usize::from(n > 0);
                seller.settle_phase();
                if let Some(first) = seller.paced.front() {
                    self.timers.at(first.go_at, Timer::Paced(key.clone()));
                }
                self.release(reserved - n);
                let info = self.deps.permits.describe(&key);
                JobsAdmitted {
                    seller: &key,
                    tier: &info.tier,
                    jobs,
                    units,
                    near_limit: info.near_limit(g.remaining, g.tightest),
                }
                .emit();
                // Why the prefix stopped short: the next job waits (so does
                // the seller, without asking again before then), or can
                // never pass (dead-lettered now, not retried forever).
                match g.next {
                    // A long wait sends the rest of the queue to the retry
                    // tiers, as any refusal does: a daily quota that runs
                    // out mid-batch must not keep its backlog in memory.
                    Some(NextJob::Wait {
                        retry_after,
                        by: DeniedBy::MaxInFlight,
                    }) => {
                        SellerWaiting::in_flight(&key, retry_after).emit();
                        self.hold(&key, after(answered_at, retry_after));
                    }
                    Some(NextJob::Wait { retry_after, .. }) => {
                        SellerWaiting::limit(&key, retry_after).emit();
                        self.hold(&key, after(answered_at, retry_after));
                    }
                    Some(NextJob::Never(c)) => {
                        if let Some(origin) = next {
                            self.never(&key, &origin, c);
                        }
                    }
                    None => {}
                }
                if go_now.is_empty() {
                    self.outage.probe_dropped(&key);
                    return self.ask_if_ready(&key);
                }
                self.spawn_run(key, go_now);
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
                self.outage.probe_dropped(&key);
                self.release(reserved);
                // Counted from when the answer arrived: never early, whatever
                // the clocks of Redis and this host say.
                self.hold(&key, after(answered_at, d.retry_after));
            }
            BatchDecision::Never(c) => {
                let first = asked.first().cloned();
                self.outage.probe_dropped(&key);
                self.release(reserved);
                if let Some(origin) = first {
                    self.never(&key, &origin, c);
                }
                self.ask_if_ready(&key);
            }
        }
    }

    /// The one place where a failed limiter call becomes a decision, for
    /// the heads the call asked about (`redis.on_error`).
    fn fallback(&mut self, key: &Arc<str>) -> BatchDecision {
        let policy = self.admission.on_error;
        // The costs of the jobs asked about that still wait, in order.
        let mut costs: Vec<u64> = match self.sellers.map.get(key) {
            Some(seller) => seller
                .asked
                .iter()
                .filter_map(|o| position(&seller.queue, o).map(|i| seller.queue[i].job.cost))
                .collect(),
            None => Vec::new(),
        };
        let failures = self.admission.failures;
        let share = self.partitions.jobs_assigned.len().max(1) as f64
            / self.deps.jobs_partitions.max(1) as f64;
        // max_in_flight takes no slot in Redis now: this replica holds the
        // seller to its share of the cap (at least one call), less its
        // calls of the seller under way (a pacer's; a seller asks only
        // when no batch of its own runs).
        if let (OnLimiterError::FailOpen | OnLimiterError::Local, Some(cap)) =
            (policy, self.deps.permits.max_in_flight(key))
        {
            let mine = ((f64::from(cap) * share).floor() as usize).max(1);
            let busy = self.sellers.map.get(key).map_or(0, |s| s.runs);
            let room = mine.saturating_sub(busy);
            if room == 0 && !costs.is_empty() {
                return BatchDecision::Denied(Denied {
                    retry_after: SLOT_POLL,
                    remaining: 0,
                    reset_after: Duration::ZERO,
                    by: DeniedBy::MaxInFlight,
                    decided_at_us: 0,
                });
            }
            costs.truncate(room);
        }
        match policy {
            OnLimiterError::FailClosed { .. } => {
                BatchDecision::from_units(policy.decide(failures, &mut self.rng))
            }
            _ if costs.is_empty() => {
                BatchDecision::from_units(policy.decide(failures, &mut self.rng))
            }
            OnLimiterError::FailOpen => {
                BatchDecision::Granted(local::granted(costs.len(), costs.iter().sum()))
            }
            OnLimiterError::Local => {
                let rules = self.deps.permits.rules_of(key);
                let rules = rules.as_ref().map(|(own, global)| (&own[..], &global[..]));
                self.admission.local.acquire_jobs(key, rules, &costs, share)
            }
        }
    }

    /// The seller's job at `origin` (the head the limiter looked at) costs
    /// more than a rule can ever hold: dead-letter it with the rule, its
    /// capacity and the cost, so it is not retried forever.
    fn never(&mut self, key: &Arc<str>, origin: &Origin, c: CannotPass) {
        let Some(seller) = self.sellers.get_mut(key) else {
            return;
        };
        let Some(i) = position(&seller.queue, origin) else {
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
