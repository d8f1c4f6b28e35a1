//! The local fallback for `redis.on_error = "local"`: while Redis does not
//! answer, each replica enforces its share of every limit in memory, with
//! the same algorithms as the scripts (the reference model). The share is
//! the replica's fraction of the jobs topic's partitions: with keyed records
//! a seller's jobs come from its partitions, and a fleet whose shares add up
//! to 1 admits about the whole limit between them. It is an approximation:
//! a seller whose partitions all sit on one replica gets only that
//! replica's share, and a rebalance during the outage moves shares without
//! moving state. It trades exactness for progress; once Redis answers again
//! the shared limiter takes over and the local state is dropped.

use std::collections::HashMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::{Clock, ModelLimiter};
use crate::limiter::decision::{BatchDecision, BatchGranted, Decision, Denied, DeniedBy};
use crate::limiter::{Mode, Rule};

/// The host's wall clock: each replica's local state is its own, so no
/// shared clock is needed.
#[derive(Debug, Clone, Copy, Default)]
pub struct WallClock;

impl Clock for WallClock {
    fn now_us(&self) -> u64 {
        let since = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        u64::try_from(since.as_micros()).unwrap_or(u64::MAX)
    }
}

/// Per-seller (and one global) in-memory limiters over scaled rules, on
/// the clock `C` (the host's in production, a simulated one in tests).
#[derive(Debug, Default)]
pub struct LocalShare<C: Clock + Clone = WallClock> {
    clock: C,
    sellers: HashMap<String, ModelLimiter<C>>,
    global: Option<ModelLimiter<C>>,
}

/// `rule` with its limit and burst multiplied by `share` (0 < share ≤ 1),
/// never below 1, so that every seller can still make progress.
pub fn scaled(rule: &Rule, share: f64) -> Rule {
    let share = share.clamp(f64::MIN_POSITIVE, 1.0);
    let scale = |n: u64| ((n as f64 * share).floor() as u64).max(1);
    let burst = rule
        .algorithm()
        .uses_burst()
        .then(|| scale(rule.burst().get()));
    // The scaled rule is no larger than one that loaded, so it is valid.
    Rule::new(
        rule.algorithm(),
        scale(rule.limit().get()),
        rule.period(),
        burst,
    )
    .unwrap_or(*rule)
}

impl LocalShare {
    pub fn new() -> LocalShare {
        LocalShare::default()
    }
}

impl<C: Clock + Clone> LocalShare<C> {
    pub fn with_clock(clock: C) -> LocalShare<C> {
        LocalShare {
            clock,
            sellers: HashMap::new(),
            global: None,
        }
    }

    /// Forgets every seller: called when Redis answers again, which also
    /// bounds the memory to the sellers seen during one outage.
    pub fn clear(&mut self) {
        self.sellers.clear();
        self.global = None;
    }

    /// Sellers with local state.
    pub fn len(&self) -> usize {
        self.sellers.len()
    }

    pub fn is_empty(&self) -> bool {
        self.sellers.is_empty()
    }

    /// The longest prefix of `costs` that fits `share` of the seller's
    /// rules and of the global rules, each job all or nothing. `None` rules
    /// mean an unlimited seller: everything passes.
    pub fn acquire_jobs(
        &mut self,
        seller: &str,
        rules: Option<(&[Rule], &[Rule])>,
        costs: &[u64],
        share: f64,
    ) -> BatchDecision {
        let Some((own_rules, global_rules)) = rules else {
            return BatchDecision::Granted(granted(costs.len(), costs.iter().sum()));
        };
        let own: Vec<Rule> = own_rules.iter().map(|r| scaled(r, share)).collect();
        let global: Vec<Rule> = global_rules.iter().map(|r| scaled(r, share)).collect();
        // Each scaled rule's state lives at the place of the rule it scales:
        // when the share moves in an outage (a partition revoked or
        // assigned), the new share converts what the old one admitted
        // instead of starting fresh beside it (sim seeds 3171, 4562, 4717:
        // a fresh start let one replica alone pass the rule itself).
        let own_at: Vec<String> = own_rules.iter().map(Rule::fingerprint).collect();
        let global_at: Vec<String> = global_rules.iter().map(Rule::fingerprint).collect();
        let clock = &self.clock;
        let mine = self
            .sellers
            .entry(seller.to_owned())
            .or_insert_with(|| ModelLimiter::new(clock.clone()));
        let all = self
            .global
            .get_or_insert_with(|| ModelLimiter::new(clock.clone()));
        let (mut jobs, mut units) = (0, 0);
        for &cost in costs {
            let cost = cost.max(1);
            // A job over this replica's share of a rule but within the rule
            // itself waits for Redis (a period at a time): it is not the
            // job's fault that the share is small. Over the rule itself it
            // can never pass, and the share's own check below says so.
            let fits_rules = own_rules
                .iter()
                .chain(global_rules)
                .all(|r| cost <= r.capacity());
            let over_share = own.iter().chain(&global).find(|r| cost > r.capacity());
            if let (true, Some(rule)) = (fits_rules, over_share) {
                if jobs == 0 {
                    return BatchDecision::from_units(Decision::Denied(Denied {
                        retry_after: rule.period(),
                        remaining: 0,
                        reset_after: rule.period(),
                        by: DeniedBy::Unavailable,
                        decided_at_us: 0,
                    }));
                }
                break;
            }
            // Peek both first: all or nothing over the seller's and the
            // global rules (one thread owns this state, so nothing moves
            // between the peek and the charge).
            let refusal = match mine.peek_at(&own_at, &own, cost, Mode::AllOrNothing) {
                Decision::Granted(_) if global.is_empty() => None,
                Decision::Granted(_) => {
                    match all.peek_at(&global_at, &global, cost, Mode::AllOrNothing) {
                        Decision::Granted(_) => None,
                        d => Some(d),
                    }
                }
                d => Some(d),
            };
            if let Some(refusal) = refusal {
                if jobs == 0 {
                    return BatchDecision::from_units(refusal);
                }
                break;
            }
            mine.acquire_at(&own_at, &own, cost, Mode::AllOrNothing);
            if !global.is_empty() {
                all.acquire_at(&global_at, &global, cost, Mode::AllOrNothing);
            }
            jobs += 1;
            units += cost;
        }
        BatchDecision::Granted(granted(jobs, units))
    }
}

/// A grant made without the shared limiter.
pub fn granted(jobs: usize, units: u64) -> BatchGranted {
    BatchGranted {
        jobs,
        units,
        remaining: 0,
        tightest: None,
        reset_after: Duration::ZERO,
        pace: None,
        decided_at_us: 0,
        next: None,
        leases: Vec::new(),
        receipt: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::Algorithm;

    fn rule(limit: u64, burst: Option<u64>) -> Rule {
        let alg = if burst.is_some() {
            Algorithm::TokenBucket
        } else {
            Algorithm::SlidingWindowLog
        };
        Rule::new(alg, limit, Duration::from_secs(60), burst).unwrap()
    }

    #[test]
    fn a_share_scales_limit_and_burst_never_below_one() {
        let r = scaled(&rule(100, Some(500)), 0.25);
        assert_eq!((r.limit().get(), r.burst().get()), (25, 125));
        let r = scaled(&rule(3, None), 0.1);
        assert_eq!(r.limit().get(), 1);
        assert_eq!(scaled(&rule(7, None), 1.0), rule(7, None));
    }

    /// Sim seeds 3171, 4562 and 4717: a replica's share of the jobs topic
    /// changed in the middle of one Redis outage (a partition revoked or
    /// assigned), and the seller's local state started fresh under the
    /// new share, so what the old share had admitted was counted nowhere:
    /// one replica alone went over the rule itself. Each row admits under
    /// one share, changes it, and asks again: what was admitted before
    /// still counts, converted as a limit edit converts it in Redis.
    #[test]
    fn a_share_that_changes_in_an_outage_keeps_what_was_admitted() {
        // A clock of its own: `local` never names the test kit (which
        // names `local`), so no import cycle forms through tests.
        #[derive(Clone)]
        struct ManualClock(std::sync::Arc<std::sync::atomic::AtomicU64>);
        impl ManualClock {
            fn new(now_us: u64) -> ManualClock {
                ManualClock(std::sync::Arc::new(now_us.into()))
            }
            fn advance(&self, by: Duration) {
                let by = u64::try_from(by.as_micros()).expect("a short step");
                self.0.fetch_add(by, std::sync::atomic::Ordering::SeqCst);
            }
        }
        impl Clock for ManualClock {
            fn now_us(&self) -> u64 {
                self.0.load(std::sync::atomic::Ordering::SeqCst)
            }
        }
        // (row, algorithm, limit, period ms, burst, steps: (after ms, share, cost, units granted))
        type Row = (
            u32,
            Algorithm,
            u64,
            u64,
            Option<u64>,
            &'static [(u64, f64, u64, u64)],
        );
        #[rustfmt::skip]
        let rows: &[Row] = &[
            // Seed 3171: a pacer of 1 per 62.5 ms (burst 1), 1 per 125 ms
            // at half the partitions: 22 ms after a unit, none more. A
            // refusal converts nothing (a dry run), so the unit counts as
            // the old share held it: until 125 ms (conservative).
            (1, Algorithm::LeakyBucket, 4, 250, Some(1), &[(0, 0.5, 1, 1), (22, 1.0, 1, 0), (80, 1.0, 1, 0), (23, 1.0, 1, 1)]),
            // Seed 4562: 2 per 5 s, 1 at half; the unit admitted counts.
            (2, Algorithm::SlidingWindowCounter, 2, 5_000, None, &[(0, 0.5, 1, 1), (2, 1.0, 2, 0), (0, 1.0, 1, 1)]),
            // Seed 4717: 3 per s, 1 at a fifth: 2 more in the window.
            (3, Algorithm::SlidingWindowCounter, 3, 1_000, None, &[(0, 0.2, 1, 1), (217, 1.0, 3, 0), (0, 1.0, 2, 2), (0, 1.0, 1, 0)]),
            // A window's count reads the same under any limit.
            (4, Algorithm::FixedWindow, 10, 1_000, None, &[(0, 0.5, 5, 5), (10, 1.0, 10, 0), (0, 1.0, 5, 5), (0, 1.0, 1, 0)]),
            // A shrinking share: the larger share's use is charged to the
            // smaller one, at most its capacity.
            (5, Algorithm::TokenBucket, 10, 1_000, Some(10), &[(0, 1.0, 8, 8), (1, 0.5, 1, 0)]),
        ];
        for &(row, algorithm, limit, period_ms, burst, steps) in rows {
            let rule = Rule::new(algorithm, limit, Duration::from_millis(period_ms), burst)
                .expect("a valid rule");
            let own = [rule];
            // The start of a 5 s window, so that no row crosses one.
            let clock = ManualClock::new(1_800_000_000_000_000);
            let mut local = LocalShare::with_clock(clock.clone());
            for (i, &(after_ms, share, cost, want)) in steps.iter().enumerate() {
                clock.advance(Duration::from_millis(after_ms));
                let got = match local.acquire_jobs("s", Some((&own, &[])), &[cost], share) {
                    BatchDecision::Granted(g) => g.units,
                    _ => 0,
                };
                assert_eq!(
                    got, want,
                    "row {row} step {i}: {algorithm:?} {limit}/{period_ms} ms, share {share}, cost {cost}"
                );
            }
        }
    }

    #[test]
    fn the_longest_prefix_of_whole_jobs_within_the_share_passes() {
        let mut local = LocalShare::new();
        let own = [rule(10, None)];
        // Half of 10: 5 units. Costs 2, 2, 2: two jobs (4 units) pass.
        let d = local.acquire_jobs("s", Some((&own, &[])), &[2, 2, 2], 0.5);
        let BatchDecision::Granted(g) = d else {
            panic!("{d:?}")
        };
        assert_eq!((g.jobs, g.units), (2, 4));
        // One unit left: a job of 2 is refused whole.
        assert!(matches!(
            local.acquire_jobs("s", Some((&own, &[])), &[2], 0.5),
            BatchDecision::Denied(_)
        ));
        // A global rule caps all sellers together.
        let global = [rule(4, None)];
        let a = local.acquire_jobs("a", Some((&own, &global)), &[1, 1, 1], 0.5);
        let b = local.acquire_jobs("b", Some((&own, &global)), &[1], 0.5);
        assert!(
            matches!(a, BatchDecision::Granted(ref g) if g.jobs == 2),
            "{a:?}"
        );
        assert!(matches!(b, BatchDecision::Denied(_)), "{b:?}");
        // Unlimited sellers pass whole; clear() forgets everyone.
        assert!(matches!(
            local.acquire_jobs("u", None, &[9, 9], 0.5),
            BatchDecision::Granted(ref g) if g.units == 18
        ));
        local.clear();
        assert!(local.is_empty());
    }
}
