//! [`Limiter`]: the answer to "may this seller's job go now?".
//!
//! The struct, the policy, overrides and pauses in force, and the single
//! decision ([`Limiter::check`]), which is a jobs call of one job
//! (`jobs.rs`): every decision takes the same road to Redis.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use crate::config::{OnStateLoss, Topology};

use super::decision::{BatchDecision, Decision, Granted, Mode, Receipt, Unused};
use super::keys::KeySpace;
use super::learn::{self, Blocked};
use super::pauses::Pauses;
use super::policy::{Policy, Resolved, RuleSet};
use super::rule::{Algorithm, Rule};
use super::script::{BlockCall, RefundCall};
use super::store::Store;
use crate::telemetry::events::InstallChecked;

/// A new install's look outside Redis before its first charging call
/// ([`Limiter::set_install_check`]): `Ok` still new, and the sign of it
/// left where every replica looks; `Err` why not.
pub type InstallCheck =
    Arc<dyn Fn() -> futures::future::BoxFuture<'static, Result<(), String>> + Send + Sync>;

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

/// A list of jobs for the limiter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JobsQuery<'a> {
    pub seller: &'a str,
    /// The jobs' costs in queue order; at least one, each >= 1.
    pub costs: &'a [u64],
    /// Decide without charging.
    pub dry_run: bool,
    /// Explicit time in µs since the epoch, for deterministic tests; `None`
    /// uses Redis' clock.
    pub at_us: Option<u64>,
}

impl<'a> JobsQuery<'a> {
    /// The production form: charge, on Redis' clock.
    pub fn new(seller: &'a str, costs: &'a [u64]) -> JobsQuery<'a> {
        JobsQuery {
            seller,
            costs,
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
    /// `redis.state_loss_wait`: the longest a loss holds a seller.
    pub(super) state_loss_wait: Option<Duration>,
    /// This install is new (its consumer group never committed an offset):
    /// the first guarded call that finds no epoch writes it as "never
    /// lost". Cleared by this replica's first charging guarded call, after
    /// which the epoch exists in Redis and a missing one is a loss.
    pub(super) new_install: AtomicBool,
    /// What a new install's first charging call asks first
    /// ([`Limiter::set_install_check`]), and whether it said "new".
    pub(super) install_check: std::sync::OnceLock<InstallCheck>,
    pub(super) install_confirmed: tokio::sync::Mutex<bool>,
    /// This replica's recent grants, written back after a loss
    /// (`restore.rs`); `None` when nothing is restored.
    pub(super) restorer: Option<super::parts::Restorer>,
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
            state_loss_wait: None,
            new_install: AtomicBool::new(false),
            install_check: std::sync::OnceLock::new(),
            install_confirmed: tokio::sync::Mutex::new(false),
            restorer: None,
        }
    }

    /// Guards every jobs call against Redis having lost the limiter's
    /// state (`redis.on_state_loss`; see `lua/jobs.lua`, the epoch).
    pub fn with_state_loss(mut self, on_loss: OnStateLoss) -> Limiter<S> {
        self.on_state_loss = Some(on_loss);
        self
    }

    /// Bounds how long a loss of Redis' data holds a seller
    /// (`redis.state_loss_wait`; `None`: up to a whole use of each rule).
    pub fn with_state_loss_wait(mut self, wait: Option<Duration>) -> Limiter<S> {
        self.state_loss_wait = wait;
        self
    }

    /// Tells the limiter whether this install is new: the worker's
    /// consumer group has never committed an offset, so Redis had no
    /// state to lose and an epoch found gone is not a loss. Holds until
    /// this replica's first charging call has written or read the epoch.
    pub fn set_new_install(&self, new: bool) {
        self.new_install.store(new, Ordering::Relaxed);
    }

    /// Whether this replica still reads a missing state as a new install.
    pub fn new_install(&self) -> bool {
        self.new_install.load(Ordering::Relaxed)
    }

    /// What a new install's first charging call asks before it goes
    /// (once; later calls wait for its answer). Read at the replica's
    /// start, "the group has never committed" may be stale by the first
    /// call: another replica may have called since, and Redis lost that.
    /// The worker's check reads the group's commits again and commits
    /// this replica's start positions before answering "new", so every
    /// replica that looks after it reads the install as begun; the
    /// window left is that read's round trip to the call. Without a
    /// check (tests), the flag alone decides.
    pub fn set_install_check(&self, check: InstallCheck) {
        let _ = self.install_check.set(check);
    }

    /// Writes the epoch as a new install's ("never lost") when it is
    /// missing, before the install check commits the group's start
    /// positions: once the group has committed, the epoch was there, so a
    /// replica that reads the install as begun and finds the epoch missing
    /// knows Redis lost it since (not that a first call has yet to come).
    /// The server key goes with it when restores are on. In a cluster
    /// each hash slot has an epoch of its own, and every one is written.
    pub async fn begin_install(&self) -> Result<bool, LimiterError<S::Error>> {
        if self.topology == Topology::Cluster {
            return self.begin_install_slots().await;
        }
        let epoch = self.keys.epoch(Topology::Single, "");
        let server = self.restorer.is_some().then(|| self.keys.server());
        self.store
            .begin_install(&epoch, server.as_deref())
            .await
            .map_err(LimiterError::Store)
    }

    /// Redis Cluster: every slot's epoch as a new install's, so that once
    /// the group has begun a slot found without one reads as a loss there,
    /// as on one Redis. 16,384 small writes, routed by slot, 64 at a time,
    /// once at a first deploy; the server key is not written (no move is
    /// looked for in a cluster). Whether any was written.
    async fn begin_install_slots(&self) -> Result<bool, LimiterError<S::Error>> {
        use futures::stream::{self, StreamExt, TryStreamExt};
        let written: Vec<bool> = stream::iter(self.keys.slot_epochs())
            .map(|epoch| async move { self.store.begin_install(&epoch, None).await })
            .buffer_unordered(64)
            .try_collect()
            .await
            .map_err(LimiterError::Store)?;
        Ok(written.contains(&true))
    }

    /// Asks the install check once, before the first charging call that
    /// would carry the new install's flag; "not new" clears the flag.
    pub(super) async fn confirm_install(&self) {
        if !self.new_install() {
            return;
        }
        let Some(check) = self.install_check.get() else {
            return;
        };
        let mut confirmed = self.install_confirmed.lock().await;
        if *confirmed || !self.new_install() {
            return;
        }
        match check().await {
            Ok(()) => {
                *confirmed = true;
                InstallChecked {
                    new: true,
                    why: None,
                }
                .emit();
            }
            Err(why) => {
                self.set_new_install(false);
                InstallChecked {
                    new: false,
                    why: Some(&why),
                }
                .emit();
            }
        }
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

    /// Every key that holds `seller`'s own state: its one hash (its 429
    /// block, every rule it is held to now or was held to before, shadow
    /// rules included, the records of its charged calls) and its slots of
    /// `max_in_flight`. All in the seller's hash slot; the global rules'
    /// hash is shared, not its own.
    pub fn seller_keys(&self, seller: &str) -> Vec<String> {
        vec![self.keys.seller_state(seller), self.keys.slots(seller)]
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

    /// The general form of [`Limiter::acquire`]: a jobs call
    /// ([`Limiter::check_jobs`]) of one job of the whole cost, or, up to
    /// the cost, of jobs of one unit each (as many as the seller's smallest
    /// capacity, more than which nothing is ever granted), read as one
    /// [`Decision`].
    pub async fn check(&self, req: Request<'_>) -> Result<Decision, LimiterError<S::Error>> {
        if req.cost == 0 {
            return Err(LimiterError::ZeroCost);
        }
        let costs = match req.mode {
            Mode::AllOrNothing => vec![req.cost],
            Mode::UpTo => {
                let smallest = match self.policy().resolve(req.seller) {
                    Resolved::Unlimited => None,
                    Resolved::Limited { seller, global } => {
                        seller.iter().chain(global).map(Rule::capacity).min()
                    }
                };
                match smallest {
                    // No rule cuts a cost: one job of all of it.
                    None => vec![req.cost],
                    Some(cap) => unit_jobs(req.cost, cap),
                }
            }
        };
        let decision = self
            .check_jobs(JobsQuery {
                seller: req.seller,
                costs: &costs,
                dry_run: req.dry_run,
                at_us: req.at_us,
            })
            .await?;
        Ok(match decision {
            BatchDecision::Granted(g) => Decision::Granted(Granted {
                granted: g.units,
                remaining: g.remaining,
                reset_after: g.reset_after,
                pace: g.pace,
                decided_at_us: g.decided_at_us,
            }),
            BatchDecision::Denied(d) => Decision::Denied(d),
            BatchDecision::Never(c) => Decision::Never(c),
        })
    }

    /// Runs a refund; a failure is logged: it leaves the seller charged for
    /// units it did not use, the safe direction, so it is not retried.
    pub(super) async fn run_refund(&self, refund: &RefundCall) {
        if let Err(e) = self.store.refund(refund).await {
            tracing::warn!(error = %e, units = refund.units, "refund of seller units after a global refusal failed; the seller stays charged until its window passes");
        }
    }

    /// Gives back the units of the grant `receipt` names that no call will
    /// use to `seller`'s rules: granted jobs whose calls will not be made
    /// (their partition was revoked, or the replica stopped, before they
    /// were called). The same refund as the global rules' cut
    /// ([`RefundCall`]): each rule gives back only what is provably unused
    /// (`lua/common.lua`, `refund`), and only while the rule that took the
    /// units is still at its place, so a refund never lets the seller past
    /// a limit. A pacer (`leaky_bucket`) takes back only the units that end
    /// the grant ([`Unused::at_tail`]): its units are slots in time, and
    /// its refund pulls in the end of its queue. Answers the units sent
    /// back (0 when no rule applies any more).
    ///
    /// The rules are the seller's as the policy now has them: a rule edited
    /// since the grant no longer owns its place and gives nothing back. In
    /// Redis Cluster only the seller's own rules are refunded: the global
    /// rules' call is not recorded by id, and what it took stays taken.
    pub async fn give_back(
        &self,
        seller: &str,
        receipt: &Receipt,
        unused: Unused,
    ) -> Result<u64, LimiterError<S::Error>> {
        let policy = self.policy();
        let (own, global) = match policy.resolve(seller) {
            Resolved::Unlimited => return Ok(0),
            Resolved::Limited { seller, global } => (seller, global),
        };
        let (mut rules, global) = self.keyed(seller, own, global);
        if self.topology == Topology::Single {
            rules.extend(global);
        }
        let (pacers, counters): (Vec<KeyedRule>, Vec<KeyedRule>) = rules
            .into_iter()
            .partition(|(_, rule)| rule.algorithm() == Algorithm::LeakyBucket);
        let mut sent = 0;
        for (rules, units) in [(counters, unused.units), (pacers, unused.at_tail)] {
            if rules.is_empty() || units == 0 {
                continue;
            }
            let call = RefundCall {
                now_us: None,
                units,
                // Which of the grant's units come back is not named: every
                // counting algorithm gives back units interchangeable with
                // the call's own, and a pacer gets only those that end the
                // grant, its queue's end (`lua/leaky_bucket.lua`).
                skip: 0,
                taken_at_us: receipt.taken_at_us,
                call_id: receipt.call_id.clone(),
                block: self.keys.block_at(seller),
                rules,
            };
            sent = sent.max(
                self.store
                    .refund(&call)
                    .await
                    .map_err(LimiterError::Store)?,
            );
        }
        Ok(sent)
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
        let learn = self.learn_drop(seller, started_us);
        let call = BlockCall {
            now_us,
            dur_us,
            learn,
        };
        self.store.block_learning(&at, &call).await
    }

    /// The learn drop of a 429 (`lua/block.lua`), when the seller learns:
    /// learning on, a limited seller (the factor lives in the seller's
    /// hash, beside the block).
    fn learn_drop(&self, seller: &str, started_us: Option<u64>) -> Option<String> {
        let policy = self.policy();
        let terms = policy.learn()?;
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
}

/// Up to `units` as jobs of one unit each, no more of them than `cap` (the
/// smallest capacity of the rules asked, more than which is never granted):
/// an up-to ask as a job list, for a single decision and for shadow rules.
pub(super) fn unit_jobs(units: u64, cap: u64) -> Vec<u64> {
    vec![1; usize::try_from(units.min(cap)).unwrap_or(usize::MAX)]
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
