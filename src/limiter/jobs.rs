//! [`Limiter::acquire_jobs`]: a seller's waiting jobs, each with its own
//! cost, granted as the longest prefix that fits, in one script call.
//!
//! The worker asks once per seller for the heads of its partitions. Each job
//! is all or nothing across every rule of the seller (and the global rules
//! in single topology); a job that does not fit ends the prefix, so a light
//! job never overtakes a heavy one. Exactly the granted jobs' units are
//! charged.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::core::{JobsQuery, Limiter, LimiterError};
use super::decision::{
    BatchDecision, BatchGranted, CannotPass, Denied, DeniedBy, NextJob, Receipt,
};
use super::policy::Resolved;
use super::policy::SLOT_POLL;
use super::reply::JobsReply;
use super::rule::Rule;
use super::script::{BlockAt, JobsCall, JobsRequest, KeyedRule, LossGuard, RefundCall, SlotTerms};
use super::shape::Shape;
use super::store::Store;
use crate::config::Topology;
use crate::telemetry::events::JobsCallCancelled;

/// One list's answer from [`Limiter::check_jobs_many`]; an error is shared
/// by every list of the call that failed.
pub type ListAnswer<E> = Result<BatchDecision, Arc<LimiterError<E>>>;

impl<S: Store> Limiter<S> {
    /// Runs `call`. A failure after which the script may have run all the
    /// same (its reply lost) has what it charged given back in the
    /// background, so that a reply no one read costs no one quota.
    async fn run_jobs_call(
        &self,
        call: &JobsCall,
    ) -> Result<Vec<JobsReply>, LimiterError<S::Error>> {
        let answer = self.store.run_jobs(call).await;
        // Answered, the epoch exists in Redis now (read or written by this
        // call or one before it): from here a missing one is a loss. Not
        // answered, Redis may lose its data before the next try, after
        // another replica's grants: the install check said "new" for this
        // moment only (`confirm_install`).
        if !call.dry_run && call.guard.as_ref().is_some_and(|g| g.new_install) {
            self.new_install.store(false, Ordering::Relaxed);
        }
        match answer {
            Ok(replies) if replies.len() == call.requests.len() => {
                if !call.dry_run {
                    self.record_grants(call, &replies);
                }
                Ok(replies)
            }
            // Read as it stands, a short reply would leave lists with no
            // answer: the call fails whole, and what it charged (nobody
            // can tell which) is given back.
            Ok(replies) => {
                if !call.dry_run {
                    cancel_in_background(self.store.clone(), call.clone());
                }
                Err(LimiterError::ShortReply {
                    sent: call.requests.len(),
                    got: replies.len(),
                })
            }
            Err(e) => {
                if !call.dry_run && S::may_have_run(&e) {
                    cancel_in_background(self.store.clone(), call.clone());
                }
                Err(LimiterError::Store(e))
            }
        }
    }

    /// Grants `seller` the longest prefix of `costs` (its waiting jobs'
    /// costs, in order) that fits, on Redis' clock, charging exactly the
    /// granted jobs' units.
    pub async fn acquire_jobs(
        &self,
        seller: &str,
        costs: &[u64],
    ) -> Result<BatchDecision, LimiterError<S::Error>> {
        self.check_jobs(JobsQuery::new(seller, costs)).await
    }

    /// The general form of [`Limiter::acquire_jobs`].
    pub async fn check_jobs(
        &self,
        q: JobsQuery<'_>,
    ) -> Result<BatchDecision, LimiterError<S::Error>> {
        let decision = self.check_jobs_enforced(q).await?;
        if let (BatchDecision::Granted(g), false) = (&decision, q.dry_run) {
            self.shadow(q.seller, g.units, q.at_us).await;
        }
        Ok(decision)
    }

    /// [`Limiter::check_jobs`] without the shadow rules.
    pub(super) async fn check_jobs_enforced(
        &self,
        q: JobsQuery<'_>,
    ) -> Result<BatchDecision, LimiterError<S::Error>> {
        if q.costs.is_empty() {
            return Err(LimiterError::NoJobs);
        }
        if q.costs.contains(&0) {
            return Err(LimiterError::ZeroCost);
        }
        let policy = self.policy();
        let (own, global) = match policy.resolve(q.seller) {
            Resolved::Unlimited => return self.unlimited_jobs(q).await,
            Resolved::Limited { seller, global } => (seller, global),
        };
        // The first job above a rule's capacity: no need to ask.
        if let Some((i, r)) = own
            .iter()
            .chain(global)
            .enumerate()
            .find(|(_, r)| q.costs[0] > r.capacity())
        {
            return Ok(BatchDecision::Never(CannotPass {
                cost: q.costs[0],
                capacity: r.capacity(),
                rule: i,
                limit: Some(*r),
            }));
        }
        let (mut seller_rules, global_rules) = self.keyed(q.seller, own, global);
        if self.topology == Topology::Single || global_rules.is_empty() {
            seller_rules.extend(global_rules);
            let req = self.seller_request(q.seller, seller_rules, q.costs);
            return self.one(q, req).await;
        }
        self.jobs_split(q, seller_rules, global_rules).await
    }

    /// Several sellers' job lists in one round trip (coalescing): one
    /// answer per list, in order, each as [`Limiter::check_jobs`] would give
    /// it. Lists are decided in order inside one script, so a seller listed
    /// twice sees its first list's charge. With `redis.topology = cluster`
    /// the sellers' keys live in different slots, so each list is its own
    /// call, all sent at once. `dry_run` and `at_us` apply to every list.
    ///
    /// Each list's answer is its own: a bad list (no jobs, a cost of 0) is
    /// refused alone and left out of the call, and in cluster topology one
    /// seller's failed call fails that seller's answer only (the others
    /// were charged, so they must hear their grants). In single topology
    /// the lists share one script call, atomic in Redis, so its error is
    /// every list's and none of them was charged by it.
    ///
    /// The granted sellers' shadow rules are asked once every list is
    /// decided, all at once; the [`super::Coalescer`] hands its asks their
    /// answers before it asks them.
    pub async fn check_jobs_many(
        &self,
        lists: &[(&str, &[u64])],
        dry_run: bool,
        at_us: Option<u64>,
    ) -> Vec<ListAnswer<S::Error>> {
        let answers = self.decide_jobs_many(lists, dry_run, at_us).await;
        if !dry_run {
            self.shadow_granted(&granted_units(lists, &answers), at_us)
                .await;
        }
        answers
    }

    /// [`Limiter::check_jobs_many`] without the shadow rules.
    pub(super) async fn decide_jobs_many(
        &self,
        lists: &[(&str, &[u64])],
        dry_run: bool,
        at_us: Option<u64>,
    ) -> Vec<ListAnswer<S::Error>> {
        let mut answers: Vec<Option<ListAnswer<S::Error>>> = lists
            .iter()
            .map(|(_, costs)| {
                if costs.is_empty() {
                    Some(Err(Arc::new(LimiterError::NoJobs)))
                } else if costs.contains(&0) {
                    Some(Err(Arc::new(LimiterError::ZeroCost)))
                } else {
                    None
                }
            })
            .collect();
        let good: Vec<usize> = (0..lists.len()).filter(|&i| answers[i].is_none()).collect();
        let sent: Vec<(&str, &[u64])> = good.iter().map(|&i| lists[i]).collect();
        let decided = if sent.is_empty() {
            Vec::new()
        } else if self.topology == Topology::Cluster || sent.len() == 1 {
            // One slot per seller: concurrent calls, routed by the cluster
            // client to each slot's node; each answer stands alone.
            let calls = sent.iter().map(|&(seller, costs)| {
                self.check_jobs_enforced(JobsQuery {
                    seller,
                    costs,
                    dry_run,
                    at_us,
                })
            });
            futures::future::join_all(calls)
                .await
                .into_iter()
                .map(|r| r.map_err(Arc::new))
                .collect()
        } else {
            match self.check_jobs_one_call(&sent, dry_run, at_us).await {
                Ok(decisions) => decisions.into_iter().map(Ok).collect(),
                Err(e) => {
                    let e = Arc::new(e);
                    sent.iter().map(|_| Err(e.clone())).collect()
                }
            }
        };
        for (i, d) in good.into_iter().zip(decided) {
            answers[i] = Some(d);
        }
        answers
            .into_iter()
            .map(|a| a.expect("every list is answered: refused above or decided"))
            .collect()
    }

    /// Single topology: every list (each checked) in one script call.
    async fn check_jobs_one_call(
        &self,
        lists: &[(&str, &[u64])],
        dry_run: bool,
        at_us: Option<u64>,
    ) -> Result<Vec<BatchDecision>, LimiterError<S::Error>> {
        let policy = self.policy();
        let mut unlimited = Vec::with_capacity(lists.len());
        let mut requests = Vec::with_capacity(lists.len());
        for &(seller, costs) in lists {
            let resolved = policy.resolve(seller);
            unlimited.push(matches!(resolved, Resolved::Unlimited));
            let rules: Vec<KeyedRule> = match resolved {
                Resolved::Unlimited => Vec::new(),
                Resolved::Limited {
                    seller: own,
                    global,
                } => {
                    let mut rules = self.keys.own_rules(seller, own);
                    rules.extend(self.keys.global_rules(global));
                    rules
                }
            };
            requests.push(self.seller_request(seller, rules, costs));
        }
        let call = JobsCall {
            now_us: at_us,
            dry_run,
            guard: self.guard(&requests, dry_run).await,
            learn: policy.learn().map(|t| t.rise_ppm_per_s),
            requests,
        };
        let replies = self.run_jobs_call(&call).await?;
        let decisions: Vec<BatchDecision> = call
            .requests
            .iter()
            .zip(replies)
            .zip(unlimited)
            .map(|((req, reply), unlimited)| {
                let rules: Vec<Rule> = req.rules.iter().map(|(_, r)| *r).collect();
                match read(&reply, req, &rules, !dry_run) {
                    BatchDecision::Granted(g) if unlimited => {
                        BatchDecision::Granted(BatchGranted {
                            remaining: u64::MAX,
                            ..g
                        })
                    }
                    d => d,
                }
            })
            .collect();
        Ok(decisions)
    }

    /// Asks the shadow rules of every seller granted units (`(seller,
    /// units)`), all at once; a failure is counted and logged per seller.
    pub(super) async fn shadow_granted(&self, granted: &[(&str, u64)], at_us: Option<u64>) {
        let calls = granted
            .iter()
            .map(|&(seller, units)| self.shadow(seller, units, at_us));
        futures::future::join_all(calls).await;
    }

    fn jobs_request(&self, block: BlockAt, rules: Vec<KeyedRule>, costs: &[u64]) -> JobsRequest {
        JobsRequest {
            call_id: self.ids.next(),
            block,
            rules,
            costs: costs.to_vec(),
            slots: None,
        }
    }

    /// A seller's request: its keys, rules and costs, and its slots when
    /// its calls in flight are capped.
    fn seller_request(&self, seller: &str, rules: Vec<KeyedRule>, costs: &[u64]) -> JobsRequest {
        let policy = self.policy();
        let block = self.keys.block_at(seller);
        JobsRequest {
            slots: policy.max_in_flight(seller).map(|max| SlotTerms {
                key: self.keys.slots(seller),
                max,
                lease_us: u64::try_from(policy.slot_lease().as_micros()).unwrap_or(u64::MAX),
                poll_us: u64::try_from(SLOT_POLL.as_micros()).unwrap_or(u64::MAX),
            }),
            ..self.jobs_request(block, rules, costs)
        }
    }

    /// Loads the generated functions (`limiter::shape`) of the rule lists
    /// the policy in force names (the default, each tier, each named
    /// seller), so that no call waits for a `FUNCTION LOAD`: called at
    /// startup and after each reload. A call of a shape not named here
    /// (an override made later) loads its own. With global rules in
    /// single topology no request is plain.
    pub async fn prepare_shapes(&self) -> Result<(), S::Error> {
        let policy = self.policy();
        if self.topology == Topology::Single && !policy.global().is_empty() {
            return Ok(());
        }
        let mut shapes: Vec<Shape> = Vec::new();
        let lists = std::iter::once(policy.default_rules().0)
            .chain(policy.tiers().map(|(_, rules)| rules))
            .chain(
                policy
                    .named_sellers()
                    .filter_map(|s| match policy.resolve(s) {
                        Resolved::Limited { seller, .. } => Some(seller),
                        Resolved::Unlimited => None,
                    }),
            );
        for rules in lists {
            let shape = Shape::new(rules.iter().map(|r| r.algorithm()).collect());
            if let Some(shape) = shape.filter(|s| !shapes.contains(s)) {
                shapes.push(shape);
            }
        }
        self.store.prepare_shapes(&shapes).await
    }

    /// Gives back slots of `seller`'s `max_in_flight` ([`BatchGranted::leases`]):
    /// a job's call was answered, or will not be made. Returns how many
    /// were still held (a lapsed lease is not).
    pub async fn release(
        &self,
        seller: &str,
        leases: &[String],
    ) -> Result<u64, LimiterError<S::Error>> {
        if leases.is_empty() {
            return Ok(0);
        }
        self.store
            .release(&self.keys.slots(seller), leases)
            .await
            .map_err(LimiterError::Store)
    }

    /// A dry run of one request over `rules` (no loss guard, no learnt
    /// limits, no slots): what shadow rules and `limits show` ask, read as
    /// a decision. Writes nothing.
    pub(super) async fn dry_run(
        &self,
        at_us: Option<u64>,
        block: BlockAt,
        rules: Vec<KeyedRule>,
        costs: &[u64],
    ) -> Result<BatchDecision, LimiterError<S::Error>> {
        self.request_alone(at_us, true, block, rules, costs).await
    }

    /// One request over `rules` alone (no loss guard, no learnt limits,
    /// no slots), charging unless `dry_run`: shadow rules' trials.
    pub(super) async fn request_alone(
        &self,
        at_us: Option<u64>,
        dry_run: bool,
        block: BlockAt,
        rules: Vec<KeyedRule>,
        costs: &[u64],
    ) -> Result<BatchDecision, LimiterError<S::Error>> {
        let req = self.jobs_request(block, rules, costs);
        let call = JobsCall {
            now_us: at_us,
            dry_run,
            guard: None,
            learn: None,
            requests: vec![req],
        };
        let replies = self.run_jobs_call(&call).await?;
        let (Some(req), Some(reply)) = (call.requests.first(), replies.first()) else {
            return Err(LimiterError::ShortReply {
                sent: 1,
                got: replies.len(),
            });
        };
        let rules: Vec<Rule> = req.rules.iter().map(|(_, r)| *r).collect();
        Ok(read(reply, req, &rules, !dry_run))
    }

    /// Runs one request; its reply, read.
    async fn one(
        &self,
        q: JobsQuery<'_>,
        req: JobsRequest,
    ) -> Result<BatchDecision, LimiterError<S::Error>> {
        let (reply, req) = self.run_one(q, req).await?;
        let rules: Vec<Rule> = req.rules.iter().map(|(_, r)| *r).collect();
        Ok(read(&reply, &req, &rules, !q.dry_run))
    }

    async fn run_one(
        &self,
        q: JobsQuery<'_>,
        req: JobsRequest,
    ) -> Result<(JobsReply, JobsRequest), LimiterError<S::Error>> {
        let call = JobsCall {
            now_us: q.at_us,
            dry_run: q.dry_run,
            guard: self.guard(std::slice::from_ref(&req), q.dry_run).await,
            learn: self.policy().learn().map(|t| t.rise_ppm_per_s),
            requests: vec![req],
        };
        let replies = self.run_jobs_call(&call).await?;
        // One request went in, and `run_jobs_call` answers one reply per
        // request or fails.
        let req = call
            .requests
            .into_iter()
            .next()
            .expect("one request was sent");
        let reply = replies.into_iter().next().expect("a reply per request");
        Ok((reply, req))
    }

    /// The loss guard of a call of `requests` (`redis.on_state_loss`): the
    /// epoch in the slot of their keys. A charging call of a new install
    /// asks the install check first (`confirm_install`).
    async fn guard(&self, requests: &[JobsRequest], dry_run: bool) -> Option<LossGuard> {
        let on_loss = self.on_state_loss?;
        if !dry_run {
            self.confirm_install().await;
        }
        let key = &requests.first()?.block.key;
        Some(LossGuard {
            epoch: self.keys.epoch(self.topology, key),
            on_loss,
            new_install: self.new_install.load(Ordering::Relaxed),
            max_wait_us: self
                .state_loss_wait
                .map(|w| u64::try_from(w.as_micros()).unwrap_or(u64::MAX)),
            seen: self.seen(requests),
        })
    }

    /// An unlimited seller: every job, unless a downstream 429 holds it.
    async fn unlimited_jobs(
        &self,
        q: JobsQuery<'_>,
    ) -> Result<BatchDecision, LimiterError<S::Error>> {
        let req = self.seller_request(q.seller, Vec::new(), q.costs);
        Ok(match self.one(q, req).await? {
            BatchDecision::Granted(g) => BatchDecision::Granted(BatchGranted {
                remaining: u64::MAX,
                ..g
            }),
            blocked => blocked,
        })
    }

    /// Redis Cluster: as `check_split`, with job lists. The seller's rules
    /// grant a prefix; the global rules are asked for that prefix and may cut
    /// it shorter; the seller gets back the units of the jobs they cut (what
    /// a refund can soundly give back, see `lua/common.lua`).
    async fn jobs_split(
        &self,
        q: JobsQuery<'_>,
        seller_rules: Vec<KeyedRule>,
        global_rules: Vec<KeyedRule>,
    ) -> Result<BatchDecision, LimiterError<S::Error>> {
        let n_own = seller_rules.len();
        let first = self.seller_request(q.seller, seller_rules, q.costs);
        let (own_reply, first) = self.run_one(q, first).await?;
        let own_rules: Vec<Rule> = first.rules.iter().map(|(_, r)| *r).collect();
        let mine = match read(&own_reply, &first, &own_rules, !q.dry_run) {
            BatchDecision::Granted(g) => g,
            other => return Ok(other),
        };
        let second = self.jobs_request(
            self.keys.global_block_at(),
            global_rules,
            &q.costs[..mine.jobs],
        );
        let global_rule_list: Vec<Rule> = second.rules.iter().map(|(_, r)| *r).collect();
        // (units to give back, units to skip): the jobs the global rules cut.
        let (global, refund) = match self.run_one(q, second).await {
            Ok((reply, _)) => {
                let d = reply.decision(&global_rule_list, &q.costs[..mine.jobs]);
                let refund = match &d {
                    BatchDecision::Granted(g) => (mine.units - g.units, g.units),
                    _ => (mine.units, 0),
                };
                (Ok(d), refund)
            }
            Err(e) => (Err(e), (mine.units, 0)),
        };
        if !q.dry_run && refund.0 > 0 {
            let call = RefundCall {
                now_us: q.at_us,
                units: refund.0,
                skip: refund.1,
                taken_at_us: own_reply.head.now_us as u64,
                call_id: first.call_id.clone(),
                block: first.block.clone(),
                rules: first.rules.clone(),
            };
            self.run_refund(&call).await;
        }
        // The slots of the jobs the global rules cut go back with their units.
        let kept = match &global {
            Ok(BatchDecision::Granted(g)) => g.jobs,
            _ => 0,
        };
        if let Some(cut) = mine.leases.get(kept..).filter(|c| !c.is_empty()) {
            if let Err(e) = self.release(q.seller, cut).await {
                tracing::warn!(error = %e, seller = q.seller, "could not give back the slots of jobs the global rules cut; they lapse with their lease");
            }
        }
        let shift = |by: DeniedBy| match by {
            DeniedBy::Rule(i) => DeniedBy::Rule(n_own + i),
            other => other,
        };
        let shift_never = |c: CannotPass| CannotPass {
            rule: n_own + c.rule,
            ..c
        };
        Ok(match global? {
            BatchDecision::Granted(g) => {
                let next = if g.jobs < mine.jobs {
                    g.next.map(|n| match n {
                        NextJob::Wait { retry_after, by } => NextJob::Wait {
                            retry_after,
                            by: shift(by),
                        },
                        NextJob::Never(c) => NextJob::Never(shift_never(c)),
                    })
                } else {
                    mine.next
                };
                BatchDecision::Granted(BatchGranted {
                    jobs: g.jobs,
                    units: g.units,
                    remaining: g.remaining.min(mine.remaining),
                    tightest: if g.remaining < mine.remaining {
                        g.tightest.map(|i| n_own + i)
                    } else {
                        mine.tightest
                    },
                    reset_after: g.reset_after.max(mine.reset_after),
                    pace: match (mine.pace, g.pace) {
                        (Some(a), Some(b)) if b.first_at_us > a.first_at_us => Some(b),
                        (a, b) => a.or(b),
                    },
                    decided_at_us: mine.decided_at_us,
                    next,
                    leases: mine.leases[..g.jobs.min(mine.leases.len())].to_vec(),
                    // The seller's own charge: the global rules' call is
                    // not recorded (its block token is '-'), and what it
                    // charged stays charged.
                    receipt: mine.receipt,
                })
            }
            BatchDecision::Denied(d) => BatchDecision::Denied(Denied {
                by: shift(d.by),
                ..d
            }),
            BatchDecision::Never(c) => BatchDecision::Never(shift_never(c)),
        })
    }
}

/// A request's reply read as a decision; a grant that was charged names
/// the slots it took when the request carried a cap, and its charge when
/// a rule took units.
fn read(reply: &JobsReply, req: &JobsRequest, rules: &[Rule], charged: bool) -> BatchDecision {
    match reply.decision(rules, &req.costs) {
        BatchDecision::Granted(mut g) if charged => {
            if req.slots.is_some() {
                g.leases = (0..g.jobs)
                    .map(|j| SlotTerms::lease(&req.call_id, j))
                    .collect();
            }
            if !rules.is_empty() {
                g.receipt = Some(Receipt {
                    call_id: req.call_id.clone(),
                    taken_at_us: g.decided_at_us,
                });
            }
            BatchDecision::Granted(g)
        }
        d => d,
    }
}

/// The sellers granted units by `answers` (one per list), with the units.
pub(super) fn granted_units<'a, E: std::error::Error + 'static>(
    lists: &[(&'a str, &[u64])],
    answers: &[ListAnswer<E>],
) -> Vec<(&'a str, u64)> {
    lists
        .iter()
        .zip(answers)
        .filter_map(|(&(seller, _), a)| match a {
            Ok(BatchDecision::Granted(g)) => Some((seller, g.units)),
            _ => None,
        })
        .collect()
}

/// Cancels `call` on `store` in a task of its own: the caller has already
/// moved on (its jobs wait for the next ask).
fn cancel_in_background<S: Store>(store: S, call: JobsCall) {
    tokio::spawn(async move {
        let outcome = store.cancel_jobs(&call).await;
        let error = outcome.as_ref().err().map(ToString::to_string);
        let done = outcome.unwrap_or_default();
        JobsCallCancelled {
            requests: call.requests.len(),
            refunded: done.iter().filter(|&&u| u > 0).map(|&u| u as u64).sum(),
            tombstones: done.iter().filter(|&&u| u < 0).count(),
            error: error.as_deref(),
        }
        .emit();
    });
}
