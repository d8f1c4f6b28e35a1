//! What the worker asks the limiter, and the one place where a limiter
//! failure (Redis down, timed out) becomes a decision.

use std::future::Future;
use std::sync::Arc;

use futures::stream::{FuturesUnordered, Stream, StreamExt};
use std::time::Duration;

use rand::Rng;

use crate::backoff::backoff_with;
use crate::config::OnError;
use crate::limiter::{
    BatchDecision, Coalescer, Decision, Denied, DeniedBy, Learnt, Limiter, Mode, Pause, Receipt,
    Resolved, Rule, Share, Store, Unused,
};

/// Why the limiter gave no answer. Every kind is a fault of the limiter's
/// path (Redis, the network, the coalescer), never of the job: the failure
/// policy ([`OnLimiterError`]) decides what it means.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PermitError {
    /// The store did not answer, answered with an error, or timed out.
    #[error("limiter unavailable: {0}")]
    Unavailable(String),
    /// This limiter cannot decide the question (a job cost it does not know).
    #[error("limiter cannot decide: {0}")]
    Unsupported(String),
}

impl PermitError {
    fn unavailable(e: impl std::fmt::Display) -> PermitError {
        PermitError::Unavailable(e.to_string())
    }
}

/// The limiter as the worker sees it.
pub trait Permits: Send + Sync + 'static {
    /// Up to `n` units for `seller` (grant up to N: one call releases as
    /// much of a waiting backlog as the rules allow).
    fn acquire(
        &self,
        seller: &str,
        n: u64,
    ) -> impl Future<Output = Result<Decision, PermitError>> + Send;

    /// Holds `seller` for every replica for `dur` (the downstream's 429)
    /// and, with `limits.learn`, lowers its learnt limit once per episode:
    /// `decided_us` is when the limiter granted the latest call that met
    /// the 429 (µs on the store's clock; a call granted before the last
    /// drop ran on the old limit). Answers what the 429 did to the learnt
    /// limit (`None`: nothing learns).
    fn block(
        &self,
        seller: &str,
        dur: Duration,
        decided_us: Option<u64>,
    ) -> impl Future<Output = Result<Option<Learnt>, PermitError>> + Send;

    /// The longest prefix of `seller`'s waiting jobs (their costs, in
    /// order) that fits, each job all or nothing, in one call. The default
    /// serves jobs of cost 1 through [`Permits::acquire`] and refuses other
    /// costs, for implementations that know no costs.
    fn acquire_jobs(
        &self,
        seller: &str,
        costs: &[u64],
    ) -> impl Future<Output = Result<BatchDecision, PermitError>> + Send {
        let ones = costs.iter().all(|&c| c == 1);
        let n = costs.len() as u64;
        async move {
            if !ones {
                return Err(PermitError::Unsupported(
                    "this limiter grants jobs of cost 1 only".to_owned(),
                ));
            }
            self.acquire(seller, n).await.map(BatchDecision::from_units)
        }
    }

    /// Many sellers' job lists asked together: each answer, with the
    /// ask's index, as soon as it is decided (one seller's slow call holds
    /// back no other seller's grant: a grant that waited would reach the
    /// downstream late). The engine sends the asks of one turn of its loop
    /// this way, so that they travel to Redis in one call whatever the
    /// timing of the tasks ([`Coalescer`] keeps a group together); by
    /// default each ask goes through [`Permits::acquire_jobs`] on its own,
    /// side by side.
    fn acquire_jobs_many<'a>(
        &'a self,
        asks: &'a [(Arc<str>, Vec<u64>)],
    ) -> impl Stream<Item = (usize, Result<BatchDecision, PermitError>)> + Send + 'a {
        asks.iter()
            .enumerate()
            .map(|(i, (seller, costs))| async move { (i, self.acquire_jobs(seller, costs).await) })
            .collect::<FuturesUnordered<_>>()
    }

    /// Gives back slots of `seller`'s `max_in_flight` that a grant took
    /// ([`BatchGranted::leases`](crate::limiter::BatchGranted)): the job's
    /// call was answered, or will not be made. Grants without a cap name
    /// no leases, so a limiter that knows no caps has nothing to give back.
    fn release(
        &self,
        _seller: &str,
        _leases: &[String],
    ) -> impl Future<Output = Result<(), PermitError>> + Send {
        async { Ok(()) }
    }

    /// Gives back the `unused` units of the grant `receipt` names
    /// ([`BatchGranted::receipt`](crate::limiter::BatchGranted)): granted
    /// jobs whose calls will not be made by this replica (a revoke or a
    /// shutdown stranded them). Each rule gives back only what is provably
    /// unused, so no refund lets the seller past a limit. A limiter that
    /// names no receipts has nothing to give back (the default).
    fn give_back(
        &self,
        _seller: &str,
        _receipt: &Receipt,
        _unused: Unused,
    ) -> impl Future<Output = Result<(), PermitError>> + Send {
        async { Ok(()) }
    }

    /// The operator's pause holding `seller` at `now_ms` (unix ms), if any
    /// (`limits pause`). Answered from what the limiter last read, never
    /// with a call; `None` by default.
    fn paused(&self, _seller: &str, _now_ms: u64) -> Option<Pause> {
        None
    }

    /// The fleet's wall clock at `now` (this host's monotonic instant), in
    /// Unix ms: the store's (Redis' `TIME`) as the limiter last learnt it.
    /// `None` until learnt, and by default.
    fn store_unix_ms(&self, _now: tokio::time::Instant) -> Option<u64> {
        None
    }

    /// The seller's `max_in_flight`, for the local fallback (which takes
    /// no slot in Redis); `None` by default.
    fn max_in_flight(&self, _seller: &str) -> Option<u32> {
        None
    }

    /// The seller's share of this replica's downstream slots (its weight
    /// and `min_share`), for the scheduler: read from the policy in
    /// memory, never from Redis. Weight 1, no guarantee by default.
    fn share(&self, _seller: &str) -> Share {
        Share::default()
    }

    /// The seller's own and the global rules, for the local fallback;
    /// `None` for an unlimited seller (and by default).
    fn rules_of(&self, _seller: &str) -> Option<(Vec<Rule>, Vec<Rule>)> {
        None
    }

    /// What the metrics say of `seller`: its tier label, and the smallest
    /// capacity among its rules (`None`: unlimited, or unknown).
    fn describe(&self, _seller: &str) -> SellerInfo {
        SellerInfo {
            tier: crate::limiter::policy::DEFAULT_TIER.to_owned(),
            smallest_capacity: None,
            capacities: Vec::new(),
        }
    }
}

/// See [`Permits::describe`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SellerInfo {
    pub tier: String,
    pub smallest_capacity: Option<u64>,
    /// Each rule's capacity, the seller's own then the global ones (the
    /// order of `BatchGranted::tightest`).
    pub capacities: Vec<u64>,
}

impl SellerInfo {
    /// A grant leaving `remaining` units under rule `tightest` is near the
    /// limit when at most a fifth of that rule's capacity is left: 80 % of
    /// a window used, as envoy's ratelimit counts `near_limit`. When the
    /// rule is not known, the smallest capacity stands in (which
    /// undercounts a large rule nearly used up while a small one is fresh).
    pub fn near_limit(&self, remaining: u64, tightest: Option<usize>) -> bool {
        tightest
            .and_then(|i| self.capacities.get(i).copied())
            .or(self.smallest_capacity)
            .is_some_and(|cap| remaining.saturating_mul(5) <= cap)
    }
}

impl<S: Store + 'static> Permits for Limiter<S> {
    fn store_unix_ms(&self, now: tokio::time::Instant) -> Option<u64> {
        self.store().unix_us_at(now).map(|us| us / 1000)
    }

    async fn acquire(&self, seller: &str, n: u64) -> Result<Decision, PermitError> {
        Limiter::acquire(self, seller, n, Mode::UpTo)
            .await
            .map_err(PermitError::unavailable)
    }

    fn describe(&self, seller: &str) -> SellerInfo {
        let policy = self.policy();
        let capacities: Vec<u64> = match policy.resolve(seller) {
            Resolved::Unlimited => Vec::new(),
            Resolved::Limited { seller, global } => {
                seller.iter().chain(global).map(Rule::capacity).collect()
            }
        };
        SellerInfo {
            tier: policy.tier_of(seller).to_owned(),
            smallest_capacity: capacities.iter().copied().min(),
            capacities,
        }
    }

    fn paused(&self, seller: &str, now_ms: u64) -> Option<Pause> {
        self.pauses().of(seller, now_ms)
    }

    async fn release(&self, seller: &str, leases: &[String]) -> Result<(), PermitError> {
        Limiter::release(self, seller, leases)
            .await
            .map(|_| ())
            .map_err(PermitError::unavailable)
    }

    async fn give_back(
        &self,
        seller: &str,
        receipt: &Receipt,
        unused: Unused,
    ) -> Result<(), PermitError> {
        Limiter::give_back(self, seller, receipt, unused)
            .await
            .map(|_| ())
            .map_err(PermitError::unavailable)
    }

    fn max_in_flight(&self, seller: &str) -> Option<u32> {
        self.policy().max_in_flight(seller)
    }

    fn share(&self, seller: &str) -> Share {
        self.policy().share(seller)
    }

    fn rules_of(&self, seller: &str) -> Option<(Vec<Rule>, Vec<Rule>)> {
        match self.policy().resolve(seller) {
            Resolved::Unlimited => None,
            Resolved::Limited { seller, global } => Some((seller.to_vec(), global.to_vec())),
        }
    }

    async fn block(
        &self,
        seller: &str,
        dur: Duration,
        decided_us: Option<u64>,
    ) -> Result<Option<Learnt>, PermitError> {
        Limiter::throttled(self, seller, dur, decided_us)
            .await
            .map(|b| b.learnt)
            .map_err(PermitError::unavailable)
    }

    async fn acquire_jobs(
        &self,
        seller: &str,
        costs: &[u64],
    ) -> Result<BatchDecision, PermitError> {
        Limiter::acquire_jobs(self, seller, costs)
            .await
            .map_err(PermitError::unavailable)
    }
}

/// The production limiter: job lists coalesced across sellers
/// (`redis.coalesce_*`), everything else straight to the limiter.
impl<S: Store + 'static> Permits for Coalescer<S> {
    async fn acquire(&self, seller: &str, n: u64) -> Result<Decision, PermitError> {
        Permits::acquire(&**self.limiter(), seller, n).await
    }

    fn describe(&self, seller: &str) -> SellerInfo {
        Permits::describe(&**self.limiter(), seller)
    }

    fn rules_of(&self, seller: &str) -> Option<(Vec<Rule>, Vec<Rule>)> {
        Permits::rules_of(&**self.limiter(), seller)
    }

    fn max_in_flight(&self, seller: &str) -> Option<u32> {
        Permits::max_in_flight(&**self.limiter(), seller)
    }

    fn share(&self, seller: &str) -> Share {
        Permits::share(&**self.limiter(), seller)
    }

    fn paused(&self, seller: &str, now_ms: u64) -> Option<Pause> {
        Permits::paused(&**self.limiter(), seller, now_ms)
    }

    fn store_unix_ms(&self, now: tokio::time::Instant) -> Option<u64> {
        Permits::store_unix_ms(&**self.limiter(), now)
    }

    async fn release(&self, seller: &str, leases: &[String]) -> Result<(), PermitError> {
        Permits::release(&**self.limiter(), seller, leases).await
    }

    async fn give_back(
        &self,
        seller: &str,
        receipt: &Receipt,
        unused: Unused,
    ) -> Result<(), PermitError> {
        Permits::give_back(&**self.limiter(), seller, receipt, unused).await
    }

    async fn block(
        &self,
        seller: &str,
        dur: Duration,
        decided_us: Option<u64>,
    ) -> Result<Option<Learnt>, PermitError> {
        Permits::block(&**self.limiter(), seller, dur, decided_us).await
    }

    async fn acquire_jobs(
        &self,
        seller: &str,
        costs: &[u64],
    ) -> Result<BatchDecision, PermitError> {
        Coalescer::acquire_jobs(self, seller, costs)
            .await
            .map_err(PermitError::unavailable)
    }

    fn acquire_jobs_many<'a>(
        &'a self,
        asks: &'a [(Arc<str>, Vec<u64>)],
    ) -> impl Stream<Item = (usize, Result<BatchDecision, PermitError>)> + Send + 'a {
        Coalescer::acquire_jobs_many(self, asks)
            .map(|(i, answer)| (i, answer.map_err(PermitError::unavailable)))
    }
}

/// What a limiter failure means (`redis.on_error`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnLimiterError {
    /// Let the jobs through unchecked, counted and logged: the downstream's
    /// own limits (and its 429s, still honoured) are the only guard.
    FailOpen,
    /// Enforce this replica's share of every limit in memory
    /// ([`crate::limiter::local`]).
    Local,
    /// Treat the seller as refused and ask again after a backoff that grows
    /// with the failures in a row (`base` doubling up to `max`, with equal
    /// jitter so that replicas and sellers do not retry in lockstep): no job
    /// passes unchecked, the backlog waits, and an outage costs Redis few
    /// calls when it comes back.
    FailClosed { base: Duration, max: Duration },
}

impl OnLimiterError {
    const CLOSED_BASE: Duration = Duration::from_millis(100);
    // Short enough that the first grant comes within 2 s of Redis answering
    // again; long enough that an outage costs Redis few calls per seller.
    const CLOSED_MAX: Duration = Duration::from_millis(1500);

    pub const DEFAULT: OnLimiterError = OnLimiterError::FailClosed {
        base: OnLimiterError::CLOSED_BASE,
        max: OnLimiterError::CLOSED_MAX,
    };

    /// The policy `redis.on_error` names.
    pub fn from_setting(on_error: OnError) -> OnLimiterError {
        match on_error {
            OnError::FailClosed => OnLimiterError::DEFAULT,
            OnError::FailOpen => OnLimiterError::FailOpen,
            OnError::Local => OnLimiterError::Local,
        }
    }

    /// The fail-closed refusal after `in_a_row` failed calls (at least 1):
    /// a hold that grows with the failures. (Fail-open and local decide in
    /// the engine, which knows the jobs and the assignment.) `rng` draws
    /// the jitter.
    pub fn decide<R: Rng + ?Sized>(self, in_a_row: u32, rng: &mut R) -> Decision {
        let (base, max) = match self {
            OnLimiterError::FailClosed { base, max } => (base, max),
            _ => (OnLimiterError::CLOSED_BASE, OnLimiterError::CLOSED_MAX),
        };
        let hold = backoff_with(in_a_row.max(1), base, max, rng);
        Decision::Denied(Denied {
            retry_after: hold,
            remaining: 0,
            reset_after: hold,
            by: DeniedBy::Unavailable,
            decided_at_us: 0,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            OnLimiterError::FailClosed { .. } => "fail_closed",
            OnLimiterError::FailOpen => "fail_open",
            OnLimiterError::Local => "local",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hold(d: Decision) -> Duration {
        match d {
            Decision::Denied(d) => d.retry_after,
            other => panic!("fail-closed must refuse, got {other:?}"),
        }
    }

    /// Issue 21, part 6: `near_limit` judged `remaining` against the
    /// smallest capacity, so a large rule nearly used up (150 of 1,000
    /// left) beside a small fresh one (capacity 10) never counted. With
    /// the grant's tightest rule it does; without it, the old reading.
    #[test]
    fn near_limit_reads_remaining_against_the_tightest_rule() {
        let info = SellerInfo {
            tier: "t".to_owned(),
            smallest_capacity: Some(10),
            capacities: vec![10, 1000],
        };
        assert!(info.near_limit(150, Some(1)));
        assert!(!info.near_limit(201, Some(1)));
        assert!(
            !info.near_limit(150, None),
            "the smallest capacity stands in"
        );
        assert!(info.near_limit(2, Some(0)));
        assert!(
            !info.near_limit(5, Some(7)),
            "an unknown index reads as None"
        );
    }

    #[test]
    fn fail_closed_backs_off_with_jitter_up_to_its_cap() {
        let policy = OnLimiterError::DEFAULT;
        let rng = &mut rand::rng();
        let first: Vec<Duration> = (0..50).map(|_| hold(policy.decide(1, rng))).collect();
        assert!(first
            .iter()
            .all(|h| *h >= Duration::from_millis(50) && *h <= Duration::from_millis(100)));
        assert!(first.iter().any(|h| *h != first[0]), "no jitter: {first:?}");
        let later = hold(policy.decide(4, rng));
        assert!(
            later >= Duration::from_millis(400),
            "grows with failures in a row: {later:?}"
        );
        for n in [10, 100, u32::MAX] {
            let h = hold(policy.decide(n, rng));
            assert!(
                h >= Duration::from_millis(750) && h <= Duration::from_millis(1500),
                "{n} in a row: {h:?}"
            );
        }
    }
}
