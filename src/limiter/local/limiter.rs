//! [`ModelLimiter`]: the reference model as a limiter for one seller, over
//! an injected [`Clock`]. The local fallback keeps one per seller
//! ([`LocalShare`](super::LocalShare)).

use super::decide::{run, Op};
use super::store::ModelStore;
use crate::limiter::decision::{Decision, Mode};
use crate::limiter::reply::cannot_pass;
use crate::limiter::rule::Rule;
use crate::limiter::script::{BlockAt, BlockRead, KeyedRule, StateKey};

/// Where the model limiter reads the time.
pub trait Clock {
    /// µs since the Unix epoch.
    fn now_us(&self) -> u64;
}

/// The model as a limiter for one seller: the same typed decisions the
/// Redis limiter gives, with no Redis.
///
/// ```
/// use std::time::Duration;
/// use throttle_worker::limiter::local::ModelLimiter;
/// use throttle_worker::limiter::testkit::ManualClock;
/// use throttle_worker::limiter::{Algorithm, Decision, Mode, Rule};
///
/// let rules = [Rule::new(Algorithm::Gcra, 2, Duration::from_secs(1), None).unwrap()];
/// let clock = ManualClock::new(1_700_000_000_000_000);
/// let mut limiter = ModelLimiter::new(clock.clone());
/// assert_eq!(limiter.acquire(&rules, 2, Mode::AllOrNothing).granted(), 2);
/// let Decision::Denied(denied) = limiter.acquire(&rules, 1, Mode::AllOrNothing) else {
///     panic!("the bucket is empty");
/// };
/// assert_eq!(denied.retry_after, Duration::from_millis(500));
/// clock.advance(denied.retry_after);
/// assert_eq!(limiter.acquire(&rules, 1, Mode::AllOrNothing).granted(), 1);
/// ```
#[derive(Debug, Clone)]
pub struct ModelLimiter<C: Clock> {
    clock: C,
    pub(crate) store: ModelStore,
    /// Calls made so far; names each call's id uniquely.
    calls: u64,
}

impl<C: Clock> ModelLimiter<C> {
    /// The hash that holds the seller's downstream block.
    pub const BLOCK_KEY: &'static str = "model:{seller}";

    pub fn new(clock: C) -> ModelLimiter<C> {
        ModelLimiter {
            clock,
            store: ModelStore::new(),
            calls: 0,
        }
    }

    /// The key a rule's state lives under: one per rule, named by its
    /// fingerprint, so that a rule's state is its own whatever the list
    /// around it (an edited rule starts fresh; nothing converts).
    pub fn rule_key(rule: &Rule) -> String {
        Self::place_key(&rule.fingerprint())
    }

    /// The key of the place named `place` ([`ModelLimiter::acquire_at`]).
    fn place_key(place: &str) -> String {
        format!("model:{{seller}}:{place}")
    }

    /// Decides and charges. Panics if `cost` is 0, as [`run`] does.
    pub fn acquire(&mut self, seller_rules: &[Rule], cost: u64, mode: Mode) -> Decision {
        self.decide(Op::Acquire, seller_rules, cost, mode)
    }

    /// Dry run: the decision `acquire` would give, charging nothing.
    pub fn peek(&mut self, seller_rules: &[Rule], cost: u64, mode: Mode) -> Decision {
        self.decide(Op::Peek, seller_rules, cost, mode)
    }

    pub fn store(&self) -> &ModelStore {
        &self.store
    }

    pub fn clock(&self) -> &C {
        &self.clock
    }

    /// [`ModelLimiter::acquire`] with rule `i`'s state at the place
    /// `places[i]` names, whatever the rule there now: a rule that replaces
    /// another at its place converts what the old one left there, as a
    /// limit edit does in Redis ([`convert`](super::convert)), so what the
    /// old rule admitted still counts. The local fallback names each place
    /// by the configured rule, whose share of it may change in an outage.
    pub fn acquire_at(
        &mut self,
        places: &[String],
        rules: &[Rule],
        cost: u64,
        mode: Mode,
    ) -> Decision {
        self.decide_at(Op::Acquire, places, rules, cost, mode)
    }

    /// Dry run of [`ModelLimiter::acquire_at`], charging nothing.
    pub fn peek_at(
        &mut self,
        places: &[String],
        rules: &[Rule],
        cost: u64,
        mode: Mode,
    ) -> Decision {
        self.decide_at(Op::Peek, places, rules, cost, mode)
    }

    fn decide(&mut self, op: Op, rules: &[Rule], cost: u64, mode: Mode) -> Decision {
        let places: Vec<String> = rules.iter().map(Rule::fingerprint).collect();
        self.decide_at(op, &places, rules, cost, mode)
    }

    fn decide_at(
        &mut self,
        op: Op,
        places: &[String],
        rules: &[Rule],
        cost: u64,
        mode: Mode,
    ) -> Decision {
        assert_eq!(places.len(), rules.len(), "one place per rule");
        self.calls += 1;
        let keyed: Vec<KeyedRule> = places
            .iter()
            .zip(rules)
            .map(|(place, r)| (StateKey::new(Self::place_key(place), "r0"), *r))
            .collect();
        let reply = run(
            &mut self.store,
            op,
            self.clock.now_us(),
            cost,
            mode,
            &format!("call{}", self.calls),
            &BlockAt::new(Self::BLOCK_KEY, BlockRead::Field),
            &keyed,
        );
        match reply.status {
            1 => Decision::Granted(reply.grant(rules)),
            0 => Decision::Denied(reply.refusal()),
            _ => Decision::Never(cannot_pass(rules, reply.rule_index(), cost)),
        }
    }
}
