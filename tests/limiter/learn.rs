//! Limits learnt from the downstream's 429s (`limits.learn`, issue 36
//! part 2) against a real Redis, through the production `Limiter`: a 429
//! scales the seller's rules for every replica at once, once per episode,
//! rises back in time, never above the configured rules nor below the
//! floor, never makes a job the configured rules admit "never", and an
//! edit starts the learning afresh. Both script drivers: the generated
//! shape (a seller's own rules only) and the general one (with a global
//! rule, which learning leaves alone).

use std::time::Duration;

use crate::common::{rule, store, unique_prefix};
use throttle_worker::config::{LearnConfig, LimitsConfig, RuleConfig, Topology};
use throttle_worker::limiter::{
    BatchDecision, JobsQuery, KeySpace, Learnt, Limiter, Policy, RedisStore,
};

/// A multiple of 10 s: fixed windows are aligned to the epoch.
const T0: u64 = 1_700_000_000_000_000;
const MS: u64 = 1_000;
const S: u64 = 1_000_000;

fn learning(rules: Vec<RuleConfig>, global: Vec<RuleConfig>, decrease: f64) -> Policy {
    Policy::from_config(&LimitsConfig {
        default: rules,
        global,
        learn: LearnConfig {
            enabled: true,
            decrease,
            floor: 0.2,
            // 1 % of the rule per second.
            recovery: Duration::from_secs(100),
        },
        ..Default::default()
    })
    .expect("valid policy")
}

/// Two replicas of one install (state v2), as the fleet runs them.
async fn replicas(policy: Policy) -> (Limiter<RedisStore>, Limiter<RedisStore>) {
    let prefix = unique_prefix("learn");
    let one = || {
        let keys = KeySpace::new(prefix.clone());
        let policy = policy.clone();
        async move { Limiter::new(store().await, keys, policy, Topology::Single) }
    };
    (one().await, one().await)
}

/// The units `lim` grants of `n` jobs of cost 1 at `at_us`.
async fn grants(lim: &Limiter<RedisStore>, at_us: u64, n: usize) -> u64 {
    let costs = vec![1; n];
    let q = JobsQuery {
        at_us: Some(at_us),
        ..JobsQuery::new("s", &costs)
    };
    match lim.check_jobs(q).await.expect("limiter call") {
        BatchDecision::Granted(g) => g.units,
        _ => 0,
    }
}

async fn throttle(lim: &Limiter<RedisStore>, at_us: u64, started_us: Option<u64>) -> Learnt {
    lim.throttled_at("s", Some(at_us), Duration::from_millis(1), started_us)
        .await
        .expect("block")
        .learnt
        .expect("the seller learns")
}

#[tokio::test]
async fn a_429_scales_the_sellers_rules_for_every_replica_once_per_episode() {
    let fixed = || rule("fixed_window", 50, "1s", None);
    let (a, b) = replicas(learning(vec![fixed()], vec![], 0.5)).await;

    // Replica a meets a 429: the factor halves, fleet-wide.
    let first = throttle(&a, T0, Some(T0 - 5 * MS)).await;
    assert_eq!((first.factor_ppm, first.dropped), (500_000, true));
    // Replica b, in the same window: 25 of the configured 50.
    assert_eq!(grants(&b, T0 + 10 * MS, 60).await, 25);

    // 429s of calls under way at the drop, on either replica, and one
    // whose start is unknown within the second: the same episode.
    let same = throttle(&b, T0 + 20 * MS, Some(T0 - MS)).await;
    // (Risen 0.02 % in the 20 ms since the drop.)
    assert_eq!((same.factor_ppm, same.dropped), (500_200, false));
    assert!(!throttle(&a, T0 + 30 * MS, None).await.dropped);

    // 10 s later the factor has risen by 10 % of the rule: 30 of 50.
    assert_eq!(grants(&a, T0 + 10 * S, 60).await, 30);
    // A 429 of a call that started after the drop: a new episode.
    let again = throttle(&b, T0 + 10 * S + 100 * MS, Some(T0 + 10 * S)).await;
    // 0.6 risen 0.1 % more in the 100 ms since, halved.
    assert_eq!((again.factor_ppm, again.dropped), (300_500, true));
    // The floor (0.2) holds however many 429s come.
    let mut at = T0 + 11 * S;
    for _ in 0..5 {
        let l = throttle(&a, at, Some(at - MS)).await;
        assert!(l.factor_ppm >= 200_000, "{l:?}");
        at += 2 * S;
    }
    // Right after the last drop: the floor, 0.2 of 50.
    assert_eq!(grants(&b, at - 2 * S + 10 * MS, 60).await, 10);

    // Nothing above the configured rule, however long it rises.
    assert_eq!(grants(&a, T0 + 1_000 * S, 60).await, 50);
}

#[tokio::test]
async fn an_edit_starts_afresh_and_learning_off_leaves_the_rules_alone() {
    let (a, b) = replicas(learning(
        vec![rule("fixed_window", 50, "1s", None)],
        vec![],
        0.5,
    ))
    .await;
    throttle(&a, T0, None).await;
    assert_eq!(grants(&b, T0 + 10 * MS, 60).await, 25);
    // The limit edited to 60: the factor learnt for 50 is not read.
    let edited = learning(vec![rule("fixed_window", 60, "1s", None)], vec![], 0.5);
    a.set_policy(edited.clone());
    b.set_policy(edited);
    assert_eq!(grants(&b, T0 + S + 10 * MS, 70).await, 60);

    // With learning off a 429 only blocks.
    let off = crate::common::policy(vec![rule("fixed_window", 50, "1s", None)], vec![]);
    let (c, _) = replicas(off).await;
    let blocked = c
        .throttled_at("s", Some(T0), Duration::from_millis(1), None)
        .await
        .unwrap();
    assert_eq!(blocked.learnt, None);
    assert_eq!(grants(&c, T0 + 10 * MS, 60).await, 50);
}

#[tokio::test]
async fn a_job_the_configured_rule_admits_is_never_refused_for_good() {
    // gcra 10/s, burst 10; after two drops of 0.5 (floor 0.2): 2 per s.
    let policy = learning(vec![rule("gcra", 10, "1s", Some(10))], vec![], 0.5);
    let (a, _) = replicas(policy).await;
    throttle(&a, T0, None).await;
    throttle(&a, T0 + 2 * S, Some(T0 + S)).await;
    let ask = |costs: Vec<u64>, at_us: u64| {
        let a = &a;
        async move {
            let q = JobsQuery {
                at_us: Some(at_us),
                ..JobsQuery::new("s", &costs)
            };
            a.check_jobs(q).await.expect("limiter call")
        }
    };
    // A job of cost 5 is above the learnt bucket (2) but within the
    // configured one (10): it passes, alone.
    match ask(vec![5, 1], T0 + 3 * S).await {
        BatchDecision::Granted(g) => assert_eq!((g.jobs, g.units), (1, 5)),
        other => panic!("a job the configured rule admits must pass: {other:?}"),
    }
    // Above the configured bucket: never, as without learning.
    assert!(matches!(
        ask(vec![11], T0 + 60 * S).await,
        BatchDecision::Never(_)
    ));
}

#[tokio::test]
async fn the_general_driver_scales_the_sellers_rules_and_not_the_global_ones() {
    // A global rule sends the call through the general driver (jobs.lua).
    let policy = learning(
        vec![rule("fixed_window", 50, "1s", None)],
        vec![rule("fixed_window", 1_000, "1s", None)],
        0.5,
    );
    let (a, b) = replicas(policy).await;
    throttle(&a, T0, None).await;
    assert_eq!(grants(&b, T0 + 10 * MS, 60).await, 25);
}

/// `limits show`'s reading: the factor in force now, the rules it makes
/// of the configured ones, and when they are whole again.
#[tokio::test]
async fn the_learnt_limit_reads_as_limits_show_prints_it() {
    let (a, _) = replicas(learning(vec![rule("gcra", 50, "1s", None)], vec![], 0.5)).await;
    assert_eq!(a.learning("s").await.unwrap(), None);
    // On Redis' clock, as the worker blocks.
    a.throttled("s", Duration::from_millis(1), None)
        .await
        .unwrap();
    let l = a.learning("s").await.unwrap().expect("a factor learnt");
    // Halved, risen by at most a few ms' worth (1 % of the rule per s).
    assert!((500_000..=500_500).contains(&l.factor_ppm), "{l:?}");
    assert_eq!(l.configured[0].limit().get(), 50);
    assert_eq!(l.effective[0].limit().get(), 25);
    assert_eq!(
        l.effective[0].burst().get(),
        1,
        "a learnt gcra paces evenly"
    );
    // Half the rule back at 1 % a second: about 50 s.
    assert!((49..=50).contains(&l.full_in.as_secs()), "{:?}", l.full_in);
}
