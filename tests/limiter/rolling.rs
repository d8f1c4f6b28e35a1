//! A rolling deploy from state v1 to v2 (issue 21, part 3): replicas of the
//! previous release (today's library before v2, kept in
//! `tests/fixtures/lua-v1/`) and replicas in `redis.state = "v1+v2"` run
//! side by side against one Redis, on the same sellers. Their calls are
//! interleaved at random, with explicit times, and the grants of both are
//! checked together against each rule's own bound: no window or interval
//! admits more than the rule allows.
//!
//! The same interleaving with the new replicas in plain `v2` over-admits:
//! that is the check failing where it must (the two layouts do not see each
//! other's admissions).

use std::time::Duration;

use crate::common::{raw, store, unique_prefix};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use throttle_worker::config::Topology;
use throttle_worker::limiter::{
    Algorithm, BatchDecision, JobsQuery, KeySpace, Limiter, Policy, RedisStore, Rule, StateLayout,
};

const T0: u64 = 1_700_000_000_000_000;

/// The fixture library as a Functions library of its own, loaded beside
/// today's: its limiter function's name.
async fn load_v1_fixture() -> String {
    let body = concat!(
        include_str!("../fixtures/lua-v1/common.lua"),
        include_str!("../fixtures/lua-v1/fixed_window.lua"),
        include_str!("../fixtures/lua-v1/sliding_window_log.lua"),
        include_str!("../fixtures/lua-v1/sliding_window_counter.lua"),
        include_str!("../fixtures/lua-v1/token_bucket.lua"),
        include_str!("../fixtures/lua-v1/leaky_bucket.lua"),
        include_str!("../fixtures/lua-v1/burst_fill.lua"),
        include_str!("../fixtures/lua-v1/gcra.lua"),
        include_str!("../fixtures/lua-v1/jobs.lua"),
        include_str!("../fixtures/lua-v1/limiter.lua"),
        include_str!("../fixtures/lua-v1/block.lua"),
    );
    let code = format!(
        "#!lua name=throttle_fixture_v1\n{body}\n\
         redis.register_function('throttle_fixture_v1_limiter', limiter_call)\n"
    );
    let _: String = redis::cmd("FUNCTION")
        .arg("LOAD")
        .arg("REPLACE")
        .arg(code)
        .query_async(&mut raw().await)
        .await
        .expect("FUNCTION LOAD of the v1 fixture");
    "throttle_fixture_v1_limiter".to_owned()
}

/// One job of cost 1 through the previous release's library, with its wire
/// (no block token, no places): whether it was granted.
async fn old_replica(function: &str, keys: &KeySpace, seller: &str, rule: &Rule, at: u64) -> bool {
    let reply: Vec<i64> = redis::cmd("FCALL")
        .arg(function)
        .arg(2)
        .arg(keys.block(seller))
        .arg(keys.rule(seller, rule))
        .arg("jobs")
        .arg(at)
        .arg(1)
        .arg(format!("old-{at}"))
        .arg("1")
        .arg(1)
        .arg(rule.algorithm().name())
        .arg(rule.limit().get())
        .arg(rule.period_us())
        .arg(rule.burst().get())
        .query_async(&mut raw().await)
        .await
        .expect("the old library's jobs call");
    reply[0] == 1
}

/// Grants of `rule` for one seller: `steps` arrivals at random gaps, each
/// taken by an old replica or a new one (in `layout`) at random.
async fn interleave(rule: &Rule, layout: StateLayout, seed: u64, steps: usize) -> Vec<u64> {
    let function = load_v1_fixture().await;
    let prefix = unique_prefix("rolling");
    // Old and new replicas share the key prefix, as a deploy does.
    let old_keys = KeySpace::new(prefix.clone());
    let policy = Policy::from_config(&throttle_worker::config::LimitsConfig {
        default: vec![throttle_worker::config::RuleConfig {
            algorithm: rule.algorithm().name().to_owned(),
            limit: rule.limit().get(),
            period: rule.period(),
            burst: rule.algorithm().uses_burst().then(|| rule.burst().get()),
            shadow: false,
        }],
        ..Default::default()
    })
    .expect("valid policy");
    let new: Limiter<RedisStore> = Limiter::new(
        store().await,
        KeySpace::with_layout(prefix, layout),
        policy,
        Topology::Single,
    );
    let mut rng = StdRng::seed_from_u64(seed);
    let step_max = rule.period_us() / 8;
    let mut at = T0;
    let mut granted = Vec::new();
    for _ in 0..steps {
        at += rng.random_range(0..=step_max);
        let ok = if rng.random_bool(0.5) {
            old_replica(&function, &old_keys, "s", rule, at).await
        } else {
            let q = JobsQuery {
                at_us: Some(at),
                ..JobsQuery::new("s", &[1])
            };
            matches!(
                new.check_jobs(q).await.expect("new replica"),
                BatchDecision::Granted(_)
            )
        };
        if ok {
            granted.push(at);
        }
    }
    granted
}

/// The most grants any span of the rule's bound holds, and that bound: the
/// aligned window (fixed_window), any window of the period
/// (sliding_window_log), any interval `[a, b)` against `burst + ceil((b -
/// a) * rate)` (the buckets). `None` when every span is within.
fn over(rule: &Rule, granted: &[u64]) -> Option<String> {
    let (limit, period) = (rule.limit().get(), rule.period_us());
    match rule.algorithm() {
        Algorithm::FixedWindow => {
            let mut per: std::collections::BTreeMap<u64, u64> = Default::default();
            for &t in granted {
                *per.entry(t / period).or_default() += 1;
            }
            per.into_iter()
                .find(|&(_, n)| n > limit)
                .map(|(w, n)| format!("window {w} admitted {n} of {limit}"))
        }
        Algorithm::SlidingWindowLog => {
            let mut lo = 0;
            for hi in 0..granted.len() {
                while granted[hi] - granted[lo] >= period {
                    lo += 1;
                }
                if (hi - lo + 1) as u64 > limit {
                    return Some(format!(
                        "{} grants within {period} µs from {}",
                        hi - lo + 1,
                        granted[lo]
                    ));
                }
            }
            None
        }
        _ => {
            let burst = u128::from(rule.burst().get());
            for a in 0..granted.len() {
                for b in a..granted.len() {
                    let span = u128::from(granted[b] - granted[a]);
                    let allowed = burst + (span * u128::from(limit)).div_ceil(u128::from(period));
                    if (b - a + 1) as u128 > allowed {
                        return Some(format!(
                            "{} grants in {span} µs, at most {allowed}",
                            b - a + 1
                        ));
                    }
                }
            }
            None
        }
    }
}

fn rules() -> Vec<Rule> {
    let s = Duration::from_secs(1);
    vec![
        Rule::new(Algorithm::FixedWindow, 10, s, None).unwrap(),
        Rule::new(Algorithm::SlidingWindowLog, 10, s, None).unwrap(),
        Rule::new(Algorithm::Gcra, 10, s, Some(5)).unwrap(),
        Rule::new(Algorithm::TokenBucket, 10, s, Some(5)).unwrap(),
    ]
}

#[tokio::test]
async fn old_and_v1_v2_replicas_together_stay_within_every_rule() {
    for rule in rules() {
        for seed in 0..4 {
            let granted = interleave(&rule, StateLayout::V1V2, seed, 300).await;
            assert!(granted.len() > 20, "{rule}: {} grants", granted.len());
            if let Some(why) = over(&rule, &granted) {
                panic!("{rule}, seed {seed}: old + v1+v2 replicas over-admit: {why}");
            }
        }
    }
}

/// The check can fail: new replicas in plain v2 beside old ones each admit
/// up to the limit.
#[tokio::test]
async fn old_and_v2_replicas_together_over_admit() {
    for rule in rules() {
        let granted = interleave(&rule, StateLayout::V2, 0, 300).await;
        assert!(
            over(&rule, &granted).is_some(),
            "{rule}: old + v2 replicas stayed within the rule, so this test proves nothing"
        );
    }
}
