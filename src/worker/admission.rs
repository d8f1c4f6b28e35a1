//! What the engine knows of the limiter's health, and the one place where a
//! failed limiter call becomes a decision (`redis.on_error`): fail closed,
//! fail open within this replica's share of `max_in_flight`, or the
//! in-memory limits of `local`. No I/O: the engine hands in what the
//! decision needs, and gets the decision and any change of readiness.

use std::sync::Arc;
use std::time::Duration;

use rand::rngs::StdRng;

use crate::config::Settings;
use crate::limiter::local::{self, LocalShare};
use crate::limiter::{BatchDecision, Denied, DeniedBy, Rule, SLOT_POLL};

use super::permit::OnLimiterError;
use super::ports::Clock;

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

/// What a failure policy decides on, for the heads a failed call asked
/// about.
#[derive(Debug, Clone, Default)]
pub(super) struct Failed<'a> {
    /// The costs of the jobs asked about that still wait, in order.
    pub(super) costs: Vec<u64>,
    /// The fraction of the jobs topic's partitions held here.
    pub(super) share: f64,
    /// The seller's `max_in_flight`, if capped.
    pub(super) max_in_flight: Option<u32>,
    /// Its calls under way here.
    pub(super) busy: usize,
    /// Its rules, own and global (for `local`).
    pub(super) rules: Option<(&'a [Rule], &'a [Rule])>,
}

/// A failed call's decision, and what it means for readiness.
#[derive(Debug)]
pub(super) struct Fallback {
    pub(super) decision: BatchDecision,
    /// Failed calls in a row, this one included.
    pub(super) in_a_row: u32,
    /// Redis is to be reported down from now (`redis.unready_after`).
    pub(super) now_unready: bool,
}

/// The limiter's health as the engine sees it.
pub(super) struct Admission<K: Clock> {
    on_error: OnLimiterError,
    unready_after: u32,
    /// Limiter calls failed in a row (0 after a success).
    failures: u32,
    /// The in-memory limits of `redis.on_error = "local"`, used only while
    /// Redis does not answer.
    local: LocalShare<ModelClock<K>>,
}

impl<K: Clock> Admission<K> {
    pub(super) fn new(settings: &Settings, clock: Arc<K>) -> Admission<K> {
        Admission {
            on_error: OnLimiterError::from_setting(settings.redis.on_error),
            unready_after: settings.redis.unready_after,
            failures: 0,
            local: LocalShare::with_clock(ModelClock(clock)),
        }
    }

    pub(super) fn policy(&self) -> &'static str {
        self.on_error.name()
    }

    /// A call answered. Returns whether Redis is ready again (it was
    /// reported down).
    pub(super) fn answered(&mut self) -> bool {
        let was_down = self.failures >= self.unready_after;
        if self.failures > 0 {
            // Redis decides again: what the local limits counted meanwhile
            // is not carried over.
            self.local.clear();
        }
        self.failures = 0;
        was_down
    }

    /// A call failed: the policy's decision for what it asked about.
    pub(super) fn failed(&mut self, key: &str, asked: Failed<'_>, rng: &mut StdRng) -> Fallback {
        self.failures = self.failures.saturating_add(1);
        Fallback {
            decision: self.decide(key, asked, rng),
            in_a_row: self.failures,
            now_unready: self.failures == self.unready_after,
        }
    }

    fn decide(&mut self, key: &str, mut asked: Failed<'_>, rng: &mut StdRng) -> BatchDecision {
        let policy = self.on_error;
        // max_in_flight takes no slot in Redis now: this replica holds the
        // seller to its share of the cap (at least one call), less its
        // calls of the seller under way (a pacer's; a seller asks only
        // when no batch of its own runs).
        if let (OnLimiterError::FailOpen | OnLimiterError::Local, Some(cap)) =
            (policy, asked.max_in_flight)
        {
            let mine = ((f64::from(cap) * asked.share).floor() as usize).max(1);
            let room = mine.saturating_sub(asked.busy);
            if room == 0 && !asked.costs.is_empty() {
                return BatchDecision::Denied(Denied {
                    retry_after: SLOT_POLL,
                    remaining: 0,
                    reset_after: Duration::ZERO,
                    by: DeniedBy::MaxInFlight,
                    decided_at_us: 0,
                });
            }
            asked.costs.truncate(room);
        }
        let costs = asked.costs;
        match policy {
            OnLimiterError::FailClosed { .. } => {
                BatchDecision::from_units(policy.decide(self.failures, rng))
            }
            _ if costs.is_empty() => BatchDecision::from_units(policy.decide(self.failures, rng)),
            OnLimiterError::FailOpen => {
                BatchDecision::Granted(local::granted(costs.len(), costs.iter().sum()))
            }
            OnLimiterError::Local => self
                .local
                .acquire_jobs(key, asked.rules, &costs, asked.share),
        }
    }
}
