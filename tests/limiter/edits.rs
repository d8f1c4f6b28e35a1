//! Limit edits against a real Redis, through the production `Limiter`
//! (issue 21, part 2): in state v2 a rule's state is kept by its place in
//! the seller's rule list, and an edited rule converts what the old rule
//! admitted, so a window that spans an edit admits at most the larger of
//! the two limits. State v1 (a key per rule fingerprint) is run beside it
//! on the same steps: it admits old + new, the defect the layout removes.
//!
//! Every edit the operator can make goes through the same door, the rule at
//! a place changing: a config reload (`set_policy`), an override starting
//! and ending (`set_overrides`), a tier change, a change of algorithm. Both
//! request paths are covered: single calls (`lua/limiter.lua`) and job
//! lists (`lua/jobs.lua`, the worker's path).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use crate::common::{policy, policy_with_sellers, raw, rule, store, unique_prefix};
use throttle_worker::config::{RuleConfig, SellerConfig, Topology};
use throttle_worker::limiter::{
    BatchDecision, Decision, JobsQuery, KeySpace, Limiter, Mode, Policy, RedisStore, Request, Rule,
};

/// A multiple of 10 s (fixed windows are aligned to the epoch), so the
/// steps below all fall in one 10 s window.
const T0: u64 = 1_700_000_000_000_000;
const MS: u64 = 1_000;

/// Which script a step goes through.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Path {
    Single,
    Jobs,
}

async fn limiter(policy: Policy) -> (Limiter<RedisStore>, String) {
    let prefix = unique_prefix("edits");
    let keys = KeySpace::new(prefix.clone());
    let limiter = Limiter::new(store().await, keys, policy, Topology::Single);
    (limiter, prefix)
}

/// Asks for one unit `n` times, 1 ms apart from `at_us`; the units granted.
async fn ask(lim: &Limiter<RedisStore>, path: Path, at_us: u64, n: u64) -> u64 {
    let mut granted = 0;
    for i in 0..n {
        let at = at_us + i * MS;
        granted += match path {
            Path::Single => {
                let req = Request {
                    at_us: Some(at),
                    ..Request::new("s", 1, Mode::AllOrNothing)
                };
                match lim.check(req).await.expect("limiter call") {
                    Decision::Granted(g) => g.granted,
                    _ => 0,
                }
            }
            Path::Jobs => {
                let q = JobsQuery {
                    at_us: Some(at),
                    ..JobsQuery::new("s", &[1])
                };
                match lim.check_jobs(q).await.expect("limiter call") {
                    BatchDecision::Granted(g) => g.units,
                    _ => 0,
                }
            }
        };
    }
    granted
}

fn fixed(limit: u64) -> Policy {
    policy(vec![rule("fixed_window", limit, "10s", None)], vec![])
}

/// The example: `fixed_window` 30 per 10 s, 20 used early in a
/// window, then the limit raised to 40 by a config reload.
async fn raised_in_a_window(path: Path) -> u64 {
    let (lim, _) = limiter(fixed(30)).await;
    let before = ask(&lim, path, T0, 20).await;
    assert_eq!(before, 20);
    lim.set_policy(fixed(40));
    before + ask(&lim, path, T0 + 100 * MS, 60).await
}

#[tokio::test]
async fn a_raised_limit_counts_what_the_old_one_admitted() {
    for path in [Path::Single, Path::Jobs] {
        let got = raised_in_a_window(path).await;
        assert_eq!(
            got, 40,
            "{path:?}: the new limit in the window, no more (a fresh rule would admit old + new, 60)"
        );
    }
}

#[tokio::test]
async fn a_lowered_limit_admits_nothing_more_in_the_window() {
    for path in [Path::Single, Path::Jobs] {
        let (lim, _) = limiter(fixed(30)).await;
        assert_eq!(ask(&lim, path, T0, 20).await, 20);
        lim.set_policy(fixed(10));
        assert_eq!(ask(&lim, path, T0 + 100 * MS, 30).await, 0, "{path:?}");
        // The next window counts under the new limit alone.
        assert_eq!(ask(&lim, path, T0 + 10_000 * MS, 30).await, 10, "{path:?}");
    }
}

#[tokio::test]
async fn an_override_starting_and_ending_stays_within_the_larger_limit() {
    for path in [Path::Single, Path::Jobs] {
        let (lim, _) = limiter(fixed(30)).await;
        let mut total = ask(&lim, path, T0, 20).await;
        let raised = Rule::new(
            throttle_worker::limiter::Algorithm::FixedWindow,
            40,
            Duration::from_secs(10),
            None,
        )
        .unwrap();
        let overrides: HashMap<String, Arc<[Rule]>> =
            [("s".to_owned(), Arc::from(vec![raised]))].into();
        lim.set_overrides(overrides);
        total += ask(&lim, path, T0 + 100 * MS, 15).await;
        assert_eq!(total, 35, "{path:?}: the override admits up to its 40");
        lim.set_overrides(HashMap::new());
        total += ask(&lim, path, T0 + 200 * MS, 30).await;
        assert_eq!(total, 35, "{path:?}: back at 30, with 35 counted");
    }
}

#[tokio::test]
async fn a_tier_change_counts_what_the_old_tier_admitted() {
    let bulk = || {
        let mut cfg = throttle_worker::config::LimitsConfig {
            default: vec![rule("fixed_window", 30, "10s", None)],
            ..Default::default()
        };
        cfg.tiers.insert(
            "bulk".to_owned(),
            vec![rule("fixed_window", 40, "10s", None)],
        );
        cfg.sellers.insert(
            "s".to_owned(),
            SellerConfig {
                tier: Some("bulk".to_owned()),
                ..Default::default()
            },
        );
        Policy::from_config(&cfg).expect("valid policy")
    };
    for path in [Path::Single, Path::Jobs] {
        let (lim, _) = limiter(fixed(30)).await;
        let mut total = ask(&lim, path, T0, 25).await;
        lim.set_policy(bulk());
        total += ask(&lim, path, T0 + 100 * MS, 60).await;
        assert_eq!(total, 40, "{path:?}");
    }
}

/// Another algorithm converts conservatively: the units in use carry over
/// and drain at the new rule's pace from the edit on.
#[tokio::test]
async fn a_new_algorithm_takes_over_the_units_in_use() {
    let gcra = policy(vec![rule("gcra", 10, "1s", Some(10))], vec![]);
    let bucket = policy(vec![rule("token_bucket", 10, "1s", Some(10))], vec![]);
    for path in [Path::Single, Path::Jobs] {
        let (lim, _) = limiter(gcra.clone()).await;
        assert_eq!(ask(&lim, path, T0, 10).await, 10);
        lim.set_policy(bucket.clone());
        // 20 ms after the last take: not one token has come back (100 ms
        // each); a fresh bucket would grant all 10.
        assert_eq!(ask(&lim, path, T0 + 30 * MS, 10).await, 0, "{path:?}");
        // Then one every 100 ms, counted from the edit's first call.
        assert_eq!(ask(&lim, path, T0 + 135 * MS, 1).await, 1, "{path:?}");
    }
}

/// A seller's block, every rule's state, shadow rules included, and its
/// charged jobs calls' records (`lua/calls.lua`), in one key with an
/// expiry; `limits reset` deletes it (and the seller's slots of
/// `max_in_flight`, which it has none of here).
#[tokio::test]
async fn one_key_holds_a_seller() {
    let rules = vec![
        rule("fixed_window", 30, "10s", None),
        rule("sliding_window_log", 5, "1s", None),
        rule("gcra", 50, "1m", Some(5)),
        RuleConfig {
            shadow: true,
            ..rule("token_bucket", 2, "1s", None)
        },
    ];
    let p = policy_with_sellers(
        rules.clone(),
        vec![(
            "other",
            SellerConfig {
                unlimited: true,
                ..Default::default()
            },
        )],
    );
    let (lim, prefix) = limiter(p).await;
    assert_eq!(ask(&lim, Path::Single, T0, 3).await, 3);
    assert_eq!(ask(&lim, Path::Jobs, T0 + 10 * MS, 3).await, 2);
    lim.block_at("s", T0 + 20 * MS, Duration::from_secs(5))
        .await
        .expect("block");
    assert_eq!(
        ask(&lim, Path::Jobs, T0 + 1_500 * MS, 1).await,
        0,
        "the block in the seller's hash refuses it"
    );
    let mut conn = raw().await;
    let mut keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{prefix}:*"))
        .query_async(&mut conn)
        .await
        .unwrap();
    keys.sort();
    let hash = format!("{prefix}:{{s}}:v2");
    let slots = format!("{prefix}:{{s}}:slots");
    assert_eq!(keys, vec![hash.clone()], "one key for the seller");
    let fields: Vec<String> = redis::cmd("HKEYS")
        .arg(&hash)
        .query_async(&mut conn)
        .await
        .unwrap();
    for want in ["block", "r0:fp", "r1:log", "r2:tat", "s0:c", "rec"] {
        assert!(
            fields.iter().any(|f| f == want),
            "{want} in the hash: {fields:?}"
        );
    }
    let ttl: i64 = redis::cmd("PTTL")
        .arg(&hash)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(ttl > 0, "the hash expires (PTTL {ttl})");
    // `limits show` reads the same hash: 5 of the window's 30 used, the
    // block's end.
    let state = lim
        .inspect("s", Some(T0 + 1_600 * MS))
        .await
        .expect("inspect");
    assert_eq!(state.rules[0].remaining, 25, "{state:?}");
    assert_eq!(
        state.blocked_for,
        Some(Duration::from_millis(3_420)),
        "{state:?}"
    );
    assert_eq!(lim.seller_keys("s"), vec![hash, slots]);
}
