//! [`Limiter`]: the answer to "may this seller's job go now?".
//!
//! Resolves the seller's rules from the current [`Policy`], builds one
//! [`ScriptCall`] and reads the reply as a [`Decision`]. Costs no rule can
//! ever hold are answered without a round trip; unlimited sellers cost one
//! that reads only their downstream block.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use crate::config::{OnStateLoss, Topology};

use super::decision::{CannotPass, Decision, Denied, DeniedBy, Granted, Mode};
use super::keys::{KeySpace, StateLayout};
use super::learn::{self, Blocked};
use super::pauses::Pauses;
use super::policy::{Policy, Resolved, RuleSet};
use super::reply::Reply;
use super::rule::Rule;
use super::script::{BlockAt, BlockCall, BlockRead, Op, ScriptCall, Store};

/// A question for the limiter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request<'a> {
    pub seller: &'a str,
    /// Units asked for (>= 1).
    pub cost: u64,
    pub mode: Mode,
    /// Decide without charging (operators' dry run).
    pub dry_run: bool,
    /// Explicit time in µs since the epoch, for deterministic tests; `None`
    /// uses Redis' clock, which every replica shares.
    pub at_us: Option<u64>,
}

impl<'a> Request<'a> {
    /// The production form: charge, on Redis' clock.
    pub fn new(seller: &'a str, cost: u64, mode: Mode) -> Request<'a> {
        Request {
            seller,
            cost,
            mode,
            dry_run: false,
            at_us: None,
        }
    }
}

/// Why the limiter could not answer.
#[derive(Debug, thiserror::Error)]
pub enum LimiterError<E: std::error::Error + 'static> {
    #[error("cost must be at least 1")]
    ZeroCost,
    #[error("a batch needs at least one job")]
    NoJobs,
    #[error(transparent)]
    Store(E),
    /// The script answered fewer (or more) replies than the call had
    /// requests: a defect of the scripts or of the store, not of a job.
    /// What the call charged is given back, as for a lost reply.
    #[error("the limiter's script answered {got} replies to a call of {sent} requests")]
    ShortReply { sent: usize, got: usize },
}

pub(super) use super::script::KeyedRule;

/// The shared per-seller limiter over a [`Store`].
pub struct Limiter<S> {
    pub(super) store: S,
    pub(super) keys: KeySpace,
    /// In force: `base` with `overrides`. Swapped whole when either
    /// changes; readers take a cheap clone.
    policy: RwLock<Arc<Policy>>,
    /// The config's limits, and the temporary overrides from Redis.
    base: RwLock<(Arc<Policy>, HashMap<String, RuleSet>)>,
    /// The operators' pauses from Redis, as last read (see
    /// [`super::pauses`]); judged against the reader's clock when asked.
    pauses: RwLock<Arc<Pauses>>,
    pub(super) topology: Topology,
    pub(super) ids: CallIds,
    /// `redis.on_state_loss`; `None` (tests of the algorithms) sends no
    /// loss guard.
    pub(super) on_state_loss: Option<OnStateLoss>,
}

impl<S: Store> Limiter<S> {
    pub fn new(store: S, keys: KeySpace, policy: Policy, topology: Topology) -> Limiter<S> {
        Limiter {
            store,
            keys,
            policy: RwLock::new(Arc::new(policy.clone())),
            base: RwLock::new((Arc::new(policy), HashMap::new())),
            pauses: RwLock::new(Arc::new(Pauses::default())),
            topology,
            ids: CallIds::new(),
            on_state_loss: None,
        }
    }

    /// Guards every jobs call against Redis having lost the limiter's
    /// state (`redis.on_state_loss`; see `lua/jobs.lua`, the epoch).
    pub fn with_state_loss(mut self, on_loss: OnStateLoss) -> Limiter<S> {
        self.on_state_loss = Some(on_loss);
        self
    }

    /// The policy in force.
    pub fn policy(&self) -> Arc<Policy> {
        // A poisoned lock only means a writer panicked mid-swap of an Arc,
        // which cannot leave it half-written.
        self.policy
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Replaces the config's policy (overrides stay); calls already under
    /// way finish with the old one.
    pub fn set_policy(&self, policy: Policy) {
        let mut base = self.base.write().unwrap_or_else(|p| p.into_inner());
        base.0 = Arc::new(policy);
        self.apply(&base);
    }

    /// Replaces the temporary overrides (see [`super::overrides`]).
    pub fn set_overrides(&self, overrides: HashMap<String, RuleSet>) {
        let mut base = self.base.write().unwrap_or_else(|p| p.into_inner());
        if base.1 == overrides {
            return;
        }
        base.1 = overrides;
        self.apply(&base);
    }

    /// Replaces the pauses (see [`super::pauses`]).
    pub fn set_pauses(&self, pauses: Pauses) {
        *self.pauses.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(pauses);
    }

    /// The pauses as last read.
    pub fn pauses(&self) -> Arc<Pauses> {
        self.pauses
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn apply(&self, base: &(Arc<Policy>, HashMap<String, RuleSet>)) {
        let effective = if base.1.is_empty() {
            base.0.clone()
        } else {
            Arc::new(base.0.with_overrides(&base.1))
        };
        *self.policy.write().unwrap_or_else(|p| p.into_inner()) = effective;
    }

    pub fn store(&self) -> &S {
        &self.store
    }

    pub fn keys(&self) -> &KeySpace {
        &self.keys
    }

    /// Every key that holds `seller`'s own state: its 429 block and one per
    /// rule it is held to now, shadow rules included (global rules' keys are
    /// shared, not its own); in state v2, its one hash, which also holds
    /// what rules it was held to before, and the records of its charged
    /// calls (`lua/calls.lua`). All in the seller's hash slot.
    pub fn seller_keys(&self, seller: &str) -> Vec<String> {
        let layout = self.keys.layout();
        let mut keys = Vec::new();
        if layout != StateLayout::V1 {
            keys.push(self.keys.seller_state(seller));
            keys.push(self.keys.calls(seller));
        }
        if layout == StateLayout::V2 {
            return keys;
        }
        let policy = self.policy();
        keys.push(self.keys.block(seller));
        if let Resolved::Limited { seller: own, .. } = policy.resolve(seller) {
            keys.extend(own.iter().map(|r| self.keys.rule(seller, r)));
        }
        keys.extend(
            policy
                .shadow(seller)
                .0
                .iter()
                .map(|r| self.keys.rule(seller, r)),
        );
        keys
    }

    /// The seller's rules and the global rules, each with its key.
    pub(super) fn keyed(
        &self,
        seller: &str,
        own: &[Rule],
        global: &[Rule],
    ) -> (Vec<KeyedRule>, Vec<KeyedRule>) {
        (
            self.keys.own_rules(seller, own),
            self.keys.global_rules(global),
        )
    }

    /// Asks for `cost` units for `seller` on Redis' clock, charging them.
    pub async fn acquire(
        &self,
        seller: &str,
        cost: u64,
        mode: Mode,
    ) -> Result<Decision, LimiterError<S::Error>> {
        self.check(Request::new(seller, cost, mode)).await
    }

    /// The general form of [`Limiter::acquire`].
    pub async fn check(&self, req: Request<'_>) -> Result<Decision, LimiterError<S::Error>> {
        let decision = self.check_enforced(req).await?;
        if let (Decision::Granted(g), false) = (&decision, req.dry_run) {
            self.shadow(req.seller, g.granted, req.at_us).await;
        }
        Ok(decision)
    }

    /// [`Limiter::check`] without the shadow rules.
    async fn check_enforced(&self, req: Request<'_>) -> Result<Decision, LimiterError<S::Error>> {
        if req.cost == 0 {
            return Err(LimiterError::ZeroCost);
        }
        let policy = self.policy();
        let (own, global) = match policy.resolve(req.seller) {
            Resolved::Unlimited => return self.check_unlimited(req).await,
            Resolved::Limited { seller, global } => (seller, global),
        };
        if let Some(never) = never(own.iter().chain(global), req) {
            return Ok(never);
        }
        let op = if req.dry_run { Op::Peek } else { Op::Acquire };
        let (mut seller_rules, global_rules) = self.keyed(req.seller, own, global);
        if self.topology == Topology::Single || global_rules.is_empty() {
            seller_rules.extend(global_rules);
            let call = self.call(op, req, self.keys.block_at(req.seller), seller_rules);
            let reply = self.store.run(&call).await.map_err(LimiterError::Store)?;
            let rules: Vec<Rule> = call.rules.iter().map(|(_, r)| *r).collect();
            return Ok(reply.decision(&rules, req.cost));
        }
        self.check_split(op, req, seller_rules, global_rules).await
    }

    /// An unlimited seller has no rules, but a downstream 429 written by any
    /// replica still holds it: the script runs with no rules, which reads
    /// only the block key (and the clock) and writes nothing.
    async fn check_unlimited(&self, req: Request<'_>) -> Result<Decision, LimiterError<S::Error>> {
        let op = if req.dry_run { Op::Peek } else { Op::Acquire };
        let call = self.call(op, req, self.keys.block_at(req.seller), Vec::new());
        let reply = self.store.run(&call).await.map_err(LimiterError::Store)?;
        Ok(match reply.decision(&[], req.cost) {
            Decision::Granted(g) => unlimited(req.cost, g.decided_at_us),
            blocked => blocked,
        })
    }

    /// Redis Cluster: the global keys live in another slot than the seller's,
    /// so one script cannot hold both. The seller's rules are charged first
    /// (most refusals are per seller, and they then never touch the shared
    /// global key); the global rules are asked for what the seller got; what
    /// the global rules refuse is refunded to the seller. Between the two
    /// calls another replica may see the seller's units as taken (the seller
    /// can be refused early for that instant) or take after them; the refund
    /// then gives back only what no later call can have used, so the rules
    /// never admit more than if the refused units had not been asked for.
    async fn check_split(
        &self,
        op: Op,
        req: Request<'_>,
        seller_rules: Vec<KeyedRule>,
        global_rules: Vec<KeyedRule>,
    ) -> Result<Decision, LimiterError<S::Error>> {
        let n_own = seller_rules.len();
        let first = self.call(op, req, self.keys.block_at(req.seller), seller_rules);
        let own_reply = self.store.run(&first).await.map_err(LimiterError::Store)?;
        let own_rules: Vec<Rule> = first.rules.iter().map(|(_, r)| *r).collect();
        let granted = match own_reply.decision(&own_rules, req.cost) {
            Decision::Granted(g) => g,
            other => return Ok(other),
        };
        // The seller's grant already respects the mode; the global rules may
        // still cut an up-to grant down. The global keys' node reads its own
        // clock (or the test's explicit time).
        let second_req = Request {
            cost: granted.granted,
            ..req
        };
        let second = self.call(op, second_req, self.keys.global_block_at(), global_rules);
        let global_rules: Vec<Rule> = second.rules.iter().map(|(_, r)| *r).collect();
        let global = match self.store.run(&second).await {
            Ok(reply) => reply.decision(&global_rules, granted.granted),
            Err(e) => {
                self.refund(&first, &own_reply, granted.granted, 0).await;
                return Err(LimiterError::Store(e));
            }
        };
        match global {
            Decision::Granted(g) => {
                if g.granted < granted.granted {
                    self.refund(&first, &own_reply, granted.granted - g.granted, g.granted)
                        .await;
                }
                Ok(Decision::Granted(Granted {
                    granted: g.granted,
                    remaining: g.remaining.min(granted.remaining),
                    reset_after: g.reset_after.max(granted.reset_after),
                    pace: match (granted.pace, g.pace) {
                        (Some(a), Some(b)) if b.first_at_us > a.first_at_us => Some(b),
                        (a, b) => a.or(b),
                    },
                    decided_at_us: granted.decided_at_us,
                }))
            }
            Decision::Denied(d) => {
                self.refund(&first, &own_reply, granted.granted, 0).await;
                Ok(Decision::Denied(Denied {
                    by: match d.by {
                        DeniedBy::Rule(i) => DeniedBy::Rule(n_own + i),
                        other => other,
                    },
                    ..d
                }))
            }
            Decision::Never(c) => {
                self.refund(&first, &own_reply, granted.granted, 0).await;
                Ok(Decision::Never(CannotPass {
                    rule: n_own + c.rule,
                    ..c
                }))
            }
        }
    }

    /// Gives back units of an earlier call: the units, less what other calls
    /// may have made use of since (see `lua/common.lua`), so a refund never
    /// lets the seller's rules admit more than if the units had never been
    /// taken. A failed refund leaves the seller charged for units it did not
    /// use: the safe direction, so it is logged and not retried.
    async fn refund(&self, call: &ScriptCall, reply: &Reply, units: u64, skip: u64) {
        if call.op != Op::Acquire || units == 0 {
            return;
        }
        // The refund runs on the clock of the acquire's call: Redis' own in
        // production (after every call that moved the seller since), the
        // test's explicit time otherwise.
        let refund = ScriptCall {
            op: Op::Refund {
                skip,
                taken_at_us: reply.now_us as u64,
            },
            cost: units,
            ..call.clone()
        };
        self.run_refund(&refund, units).await;
    }

    /// Runs a refund; a failure is logged (see [`Limiter::refund`]).
    pub(super) async fn run_refund(&self, refund: &ScriptCall, units: u64) {
        if let Err(e) = self.store.run(refund).await {
            tracing::warn!(error = %e, units, "refund of seller units after a global refusal failed; the seller stays charged until its window passes");
        }
    }

    /// Holds `seller` for every replica for `dur` (a downstream 429).
    pub async fn block(&self, seller: &str, dur: Duration) -> Result<u64, S::Error> {
        let dur_us = u64::try_from(dur.as_micros()).unwrap_or(u64::MAX).max(1);
        self.store
            .block(&self.keys.block_at(seller), None, dur_us)
            .await
    }

    /// A downstream 429 for `seller`: holds it for every replica for `dur`
    /// and, with `limits.learn`, lowers its learnt limit, fleet-wide, once
    /// per episode: `decided_us` is when the call that met the 429 was
    /// granted, on Redis' clock (a call granted before the last drop ran
    /// on the old limit; `None`: a 429 within a second of it is the same).
    pub async fn throttled(
        &self,
        seller: &str,
        dur: Duration,
        decided_us: Option<u64>,
    ) -> Result<Blocked, S::Error> {
        self.throttled_at(seller, None, dur, decided_us).await
    }

    /// [`Limiter::throttled`] at an explicit time (`None`: Redis' clock):
    /// for tests.
    pub async fn throttled_at(
        &self,
        seller: &str,
        now_us: Option<u64>,
        dur: Duration,
        started_us: Option<u64>,
    ) -> Result<Blocked, S::Error> {
        let dur_us = u64::try_from(dur.as_micros()).unwrap_or(u64::MAX).max(1);
        let at = self.keys.block_at(seller);
        let learn = self.learn_drop(seller, &at, started_us);
        let call = BlockCall {
            now_us,
            dur_us,
            learn,
        };
        self.store.block_learning(&at, &call).await
    }

    /// The learn drop of a 429 (`lua/block.lua`), when the seller learns:
    /// learning on, state v2 (the factor lives in the seller's hash), a
    /// limited seller.
    fn learn_drop(&self, seller: &str, at: &BlockAt, started_us: Option<u64>) -> Option<String> {
        let policy = self.policy();
        let terms = policy.learn()?;
        if at.read != BlockRead::Field {
            return None;
        }
        let Resolved::Limited { seller: own, .. } = policy.resolve(seller) else {
            return None;
        };
        Some(terms.drop_wire(started_us, &learn::digest(own)))
    }

    /// [`Limiter::block`] at an explicit time, for tests.
    pub async fn block_at(
        &self,
        seller: &str,
        now_us: u64,
        dur: Duration,
    ) -> Result<u64, S::Error> {
        let dur_us = u64::try_from(dur.as_micros()).unwrap_or(u64::MAX).max(1);
        self.store
            .block(&self.keys.block_at(seller), Some(now_us), dur_us)
            .await
    }

    fn call(&self, op: Op, req: Request<'_>, block: BlockAt, rules: Vec<KeyedRule>) -> ScriptCall {
        ScriptCall {
            op,
            now_us: req.at_us,
            cost: req.cost,
            mode: req.mode,
            call_id: self.ids.next(),
            block,
            rules,
        }
    }
}

/// A grant that costs nothing: for sellers configured `unlimited` and not
/// blocked by the downstream.
fn unlimited(cost: u64, decided_at_us: u64) -> Decision {
    Decision::Granted(Granted {
        granted: cost,
        remaining: u64::MAX,
        reset_after: Duration::ZERO,
        pace: None,
        decided_at_us,
    })
}

/// A whole cost above some rule's capacity can never pass: no need to ask.
fn never<'r>(rules: impl Iterator<Item = &'r Rule>, req: Request<'_>) -> Option<Decision> {
    if req.mode != Mode::AllOrNothing {
        return None;
    }
    rules.enumerate().find_map(|(i, r)| {
        (req.cost > r.capacity()).then(|| {
            Decision::Never(CannotPass {
                cost: req.cost,
                capacity: r.capacity(),
                rule: i,
                limit: Some(*r),
            })
        })
    })
}

/// Call ids unique across replicas and restarts: a random instance part and
/// a counter.
pub(super) struct CallIds {
    instance: u64,
    next: AtomicU64,
}

impl CallIds {
    fn new() -> CallIds {
        CallIds {
            instance: rand::random(),
            next: AtomicU64::new(0),
        }
    }

    pub(super) fn next(&self) -> String {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        format!("{:x}.{:x}", self.instance, n)
    }
}
