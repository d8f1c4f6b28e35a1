//! One request's trouble stays that request's (issue 21, parts 5 and 6):
//! a seller whose call fails does not fail the other sellers coalesced
//! with it, and a slow shadow rule does not hold back a grant. On the
//! shared Redis (`REDIS_URL`), through a store that fails or slows down
//! chosen calls.

use std::sync::Arc;
use std::time::Duration;

use crate::common::{rule, unique_prefix};
use throttle_worker::config::{LimitsConfig, RuleConfig, Topology};
use throttle_worker::limiter::{
    BatchDecision, BlockRead, CoalesceSettings, Coalescer, JobsCall, JobsReply, KeySpace, Limiter,
    LimiterError, Policy, RedisError, RedisStore, RefundCall, Store,
};

/// What [`Faulty`] fails with.
#[derive(Debug)]
enum FaultyError {
    /// The call carried a key of the seller chosen to fail.
    Down(String),
    Redis(RedisError),
}

impl std::fmt::Display for FaultyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FaultyError::Down(key) => write!(f, "injected failure: a call with key {key}"),
            FaultyError::Redis(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for FaultyError {}

/// Redis, except that a call with a key containing `fail` fails without
/// reaching Redis (its master is down), and calls over shadow rules alone
/// (a request whose block is not read and whose places are `s<i>`) first
/// sleep `slow_run`.
#[derive(Clone)]
struct Faulty {
    inner: RedisStore,
    fail: Option<String>,
    slow_run: Duration,
}

impl Faulty {
    fn check<'a>(&self, mut keys: impl Iterator<Item = &'a str>) -> Result<(), FaultyError> {
        match &self.fail {
            Some(f) => match keys.find(|k| k.contains(f.as_str())) {
                Some(k) => Err(FaultyError::Down(k.to_owned())),
                None => Ok(()),
            },
            None => Ok(()),
        }
    }
}

impl Store for Faulty {
    type Error = FaultyError;

    async fn refund(&self, call: &RefundCall) -> Result<u64, FaultyError> {
        self.check(call.keys())?;
        self.inner.refund(call).await.map_err(FaultyError::Redis)
    }

    async fn run_jobs(&self, call: &JobsCall) -> Result<Vec<JobsReply>, FaultyError> {
        self.check(call.keys())?;
        let shadow = call.requests.iter().all(|q| {
            q.block.read == BlockRead::Ignore
                && q.rules.iter().all(|(at, _)| at.place.starts_with('s'))
        });
        if shadow {
            tokio::time::sleep(self.slow_run).await;
        }
        self.inner.run_jobs(call).await.map_err(FaultyError::Redis)
    }

    async fn release(&self, key: &str, leases: &[String]) -> Result<u64, FaultyError> {
        self.check(std::iter::once(key))?;
        self.inner
            .release(key, leases)
            .await
            .map_err(FaultyError::Redis)
    }

    async fn block(
        &self,
        key: &throttle_worker::limiter::BlockAt,
        now_us: Option<u64>,
        dur_us: u64,
    ) -> Result<u64, FaultyError> {
        self.check(std::iter::once(key.key.as_str()))?;
        self.inner
            .block(key, now_us, dur_us)
            .await
            .map_err(FaultyError::Redis)
    }
}

fn shadowed(enforced: RuleConfig, shadow: RuleConfig) -> Policy {
    let cfg = LimitsConfig {
        default: vec![
            enforced,
            RuleConfig {
                shadow: true,
                ..shadow
            },
        ],
        ..Default::default()
    };
    Policy::from_config(&cfg).expect("test policy must be valid")
}

fn coalescer(store: Faulty, prefix: &str, policy: Policy, topology: Topology) -> Coalescer<Faulty> {
    let lim = Limiter::new(store, KeySpace::new(prefix), policy, topology);
    // A 1 ms window: every ask below is sent at once and lands in one batch.
    Coalescer::start(
        Arc::new(lim),
        CoalesceSettings {
            window: Duration::from_millis(1),
            in_flight: 1,
            ..CoalesceSettings::default()
        },
    )
}

/// Issue 21, part 5 (jobs.rs, then batch.rs: `join_all(..).collect()`): in cluster
/// topology each seller of a coalesced batch is its own call; one failed
/// call made every ask of the batch fail, though the other sellers' calls
/// had charged them. Now each hears its own answer, and what a seller was
/// charged is exactly what it was told.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_sellers_failed_call_fails_that_seller_alone() {
    let prefix = unique_prefix("isolation");
    let store = Faulty {
        inner: crate::common::store().await,
        fail: Some("{down}".to_owned()),
        slow_run: Duration::ZERO,
    };
    let limit = 5;
    let p = crate::common::policy(vec![rule("fixed_window", limit, "1h", None)], vec![]);
    let co = coalescer(store, &prefix, p, Topology::Cluster);
    let sellers: Vec<String> = (0..8)
        .map(|i| format!("up-{i}"))
        .chain(["down".to_owned()])
        .collect();
    let asks: Vec<_> = sellers
        .iter()
        .map(|s| {
            let (co, s) = (co.clone(), s.clone());
            tokio::spawn(async move { co.acquire_jobs(&s, &[1, 1]).await })
        })
        .collect();
    let mut told = std::collections::HashMap::new();
    for (s, a) in sellers.iter().zip(asks) {
        let answer = a.await.expect("ask task");
        if s == "down" {
            assert!(answer.is_err(), "the failed seller's ask: {answer:?}");
            continue;
        }
        match answer {
            Ok(BatchDecision::Granted(g)) => {
                told.insert(s.clone(), g.units);
            }
            other => panic!("{s} sits on a working master, yet its answer is {other:?}"),
        }
    }
    // Charged exactly what it was told: the rest of its limit is still there.
    for (s, units) in told {
        let rest = co
            .acquire_jobs(&s, &vec![1; limit as usize])
            .await
            .expect("a second answer");
        let BatchDecision::Granted(g) = rest else {
            panic!("{s}: {rest:?}");
        };
        assert_eq!(
            units + g.units,
            limit,
            "{s} was told {units} units, then granted {} of a limit of {limit}",
            g.units
        );
    }
}

/// The same, called directly: each list's answer is its own. In cluster
/// topology the failed seller's answer is the error, the others' are
/// grants; in either topology a bad list (cost 0) is refused alone and
/// the others are decided.
#[tokio::test]
async fn check_jobs_many_answers_each_list_alone() {
    for topology in [Topology::Single, Topology::Cluster] {
        let prefix = unique_prefix("isolation-many");
        let fail = (topology == Topology::Cluster).then(|| "{down}".to_owned());
        let store = Faulty {
            inner: crate::common::store().await,
            fail,
            slow_run: Duration::ZERO,
        };
        let p = crate::common::policy(vec![rule("fixed_window", 5, "1h", None)], vec![]);
        let lim = Limiter::new(store, KeySpace::new(&prefix), p, topology);
        let lists: [(&str, &[u64]); 4] = [
            ("a", &[1, 1]),
            ("down", &[1]),
            ("bad", &[1, 0]),
            ("b", &[3]),
        ];
        let answers = lim.check_jobs_many(&lists, false, None).await;
        assert_eq!(answers.len(), 4, "{topology:?}");
        for (i, units) in [(0, 2), (3, 3)] {
            match &answers[i] {
                Ok(BatchDecision::Granted(g)) => {
                    assert_eq!(g.units, units, "{topology:?} list {i}")
                }
                other => panic!("{topology:?} list {i}: {other:?}"),
            }
        }
        assert!(
            matches!(&answers[2], Err(e) if matches!(**e, LimiterError::ZeroCost)),
            "{topology:?}: {:?}",
            answers[2]
        );
        match (topology, &answers[1]) {
            (Topology::Cluster, Err(e)) => assert!(matches!(**e, LimiterError::Store(_)), "{e:?}"),
            (Topology::Single, Ok(BatchDecision::Granted(_))) => {}
            (_, other) => panic!("{topology:?}: the seller `down`: {other:?}"),
        }
    }
}

/// Issue 21, part 6 (jobs.rs, then batch.rs: shadow rules awaited seller by seller
/// before a batch's answers go out): a shadow rule whose call takes 2 s
/// must not hold back the grant, in either topology. The shadow rule is
/// still asked, after the grant: its state shows up in Redis.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_shadow_rule_does_not_delay_the_grant() {
    let slow = Duration::from_secs(2);
    for topology in [Topology::Single, Topology::Cluster] {
        let prefix = unique_prefix("shadow-slow");
        let store = Faulty {
            inner: crate::common::store().await,
            fail: None,
            slow_run: slow,
        };
        let shadow = rule("fixed_window", 1, "1h", None);
        let p = shadowed(rule("fixed_window", 100, "1h", None), shadow);
        let co = coalescer(store, &prefix, p, topology);
        let started = std::time::Instant::now();
        let (a, b) = tokio::join!(co.acquire_jobs("s1", &[1]), co.acquire_jobs("s2", &[2]));
        let took = started.elapsed();
        for d in [a, b] {
            assert!(
                matches!(d, Ok(BatchDecision::Granted(_))),
                "{topology:?}: {d:?}"
            );
        }
        assert!(
            took < slow / 2,
            "{topology:?}: the grants took {took:?}, with a shadow call of {slow:?}"
        );
        // The shadow rule was asked all the same, once the grant was out:
        // its place `s0` in the seller's hash names it.
        let key = KeySpace::new(&prefix).seller_state("s2");
        let mut conn = crate::common::raw().await;
        let deadline = std::time::Instant::now() + slow * 3;
        loop {
            let exists: bool = redis::cmd("HEXISTS")
                .arg(&key)
                .arg("s0:fp")
                .query_async(&mut conn)
                .await
                .expect("HEXISTS");
            if exists {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{topology:?}: the shadow rule's state {key} never written"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}
