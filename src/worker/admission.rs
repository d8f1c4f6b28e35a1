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
    /// Redis is to be reported down from now (`redis.unready_after_failures`).
    pub(super) now_unready: bool,
}

/// The limiter's health as the engine sees it.
pub(super) struct Admission<K: Clock> {
    on_error: OnLimiterError,
    unready_after_failures: u32,
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
            unready_after_failures: settings.redis.unready_after_failures,
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
        let was_down = self.failures >= self.unready_after_failures;
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
            now_unready: self.failures == self.unready_after_failures,
        }
    }

    fn decide(&mut self, key: &str, mut asked: Failed<'_>, rng: &mut StdRng) -> BatchDecision {
        let policy = self.on_error;
        // max_in_flight takes no slot in Redis now: this replica holds the
        // seller to its share of the cap (at least one call), less its
        // calls of the seller under way (a seller asks again while its
        // jobs run).
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

#[cfg(test)]
mod tests {
    use rand::SeedableRng;

    use super::*;
    use crate::config::OnError;
    use crate::limiter::{Algorithm, Rule};
    use crate::worker::ports::SystemClock;

    use super::super::fixtures::settings;

    fn admission(on_error: OnError, unready_after_failures: u32) -> Admission<SystemClock> {
        let mut s = settings();
        s.redis.on_error = on_error;
        s.redis.unready_after_failures = unready_after_failures;
        Admission::new(&s, Arc::new(SystemClock))
    }

    fn asked(costs: &[u64], cap: Option<u32>, share: f64, busy: usize) -> Failed<'static> {
        Failed {
            costs: costs.to_vec(),
            share,
            max_in_flight: cap,
            busy,
            rules: None,
        }
    }

    /// (jobs granted, or None for a refusal; refused for max_in_flight)
    fn read(d: &BatchDecision) -> (Option<usize>, bool) {
        match d {
            BatchDecision::Granted(g) => (Some(g.jobs), false),
            BatchDecision::Denied(d) => (None, d.by == DeniedBy::MaxInFlight),
            BatchDecision::Never(_) => panic!("no policy says never"),
        }
    }

    #[test]
    fn every_policy_decides_for_what_the_failed_call_asked() {
        // (policy, costs, max_in_flight, share, busy, jobs granted, refused for max_in_flight)
        type Case = (
            OnError,
            &'static [u64],
            Option<u32>,
            f64,
            usize,
            Option<usize>,
            bool,
        );
        let cases: &[Case] = &[
            (OnError::FailClosed, &[1, 1], None, 1.0, 0, None, false),
            (OnError::FailClosed, &[1], Some(4), 1.0, 0, None, false),
            (OnError::FailOpen, &[1, 2, 3], None, 1.0, 0, Some(3), false),
            // This replica's share of the cap: 10 × 0.25 = 2 calls.
            (
                OnError::FailOpen,
                &[1, 1, 1],
                Some(10),
                0.25,
                0,
                Some(2),
                false,
            ),
            // At least one call, less those under way.
            (OnError::FailOpen, &[1, 1], Some(2), 0.1, 0, Some(1), false),
            (OnError::FailOpen, &[1, 1], Some(2), 0.1, 1, None, true),
            (OnError::Local, &[1, 1], Some(4), 0.5, 2, None, true),
            // No rules: the local share lets them through.
            (OnError::Local, &[1, 1], None, 0.5, 0, Some(2), false),
        ];
        let mut rng = StdRng::seed_from_u64(7);
        for &(policy, costs, cap, share, busy, jobs, by_cap) in cases {
            let mut a = admission(policy, 3);
            let f = a.failed("s", asked(costs, cap, share, busy), &mut rng);
            assert_eq!(
                read(&f.decision),
                (jobs, by_cap),
                "{policy:?} {costs:?} cap {cap:?} share {share} busy {busy}"
            );
        }
    }

    #[test]
    fn the_local_policy_holds_a_seller_to_its_share_of_the_rule() {
        let rule =
            Rule::new(Algorithm::FixedWindow, 10, Duration::from_secs(60), None).expect("a rule");
        let own = [rule];
        let mut a = admission(OnError::Local, 3);
        let mut rng = StdRng::seed_from_u64(7);
        let mut admitted = 0;
        for _ in 0..10 {
            let mut f = asked(&[1], None, 0.5, 0);
            f.rules = Some((&own, &[]));
            admitted += read(&a.failed("s", f, &mut rng).decision).0.unwrap_or(0);
        }
        assert_eq!(admitted, 5, "half the partitions, half of 10");
    }

    #[test]
    fn readiness_follows_the_failures_in_a_row() {
        let mut a = admission(OnError::FailClosed, 3);
        let mut rng = StdRng::seed_from_u64(1);
        // (call fails, in a row after, reported down now, back up now)
        let steps: &[(bool, u32, bool, bool)] = &[
            (true, 1, false, false),
            (true, 2, false, false),
            (true, 3, true, false),
            (true, 4, false, false),
            (false, 0, false, true),
            (true, 1, false, false),
            (false, 0, false, false),
        ];
        for (i, &(fails, in_a_row, down, up)) in steps.iter().enumerate() {
            if fails {
                let f = a.failed("s", asked(&[1], None, 1.0, 0), &mut rng);
                assert_eq!((f.in_a_row, f.now_unready), (in_a_row, down), "step {i}");
            } else {
                assert_eq!(a.answered(), up, "step {i}");
            }
        }
        assert_eq!(a.policy(), "fail_closed");
    }
}
