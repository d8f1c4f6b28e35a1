//! The limiter against a real Redis: the race that motivated the project,
//! all-or-nothing across rules, script-cache recovery, key hygiene (TTL on
//! every key, one slot per seller), dry runs, the shared downstream block and
//! the split global check for Redis Cluster.

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::{
    keys_under, limiter, limiter_with, policy, policy_with_sellers, raw, rule, unique_prefix, T0,
};
use throttle_worker::config::{SellerConfig, Topology};
use throttle_worker::limiter::{Decision, DeniedBy, Mode, Request};

fn at(seller: &str, t: u64, cost: u64) -> Request<'_> {
    Request {
        seller,
        cost,
        mode: Mode::AllOrNothing,
        dry_run: false,
        at_us: Some(T0 + t),
    }
}

/// 16 replicas, each with its own connection, hammer one seller whose limit
/// is 100 per window, on Redis' clock, for several windows. A read, check,
/// then increment leaks here; one script per decision must not.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sixteen_connections_admit_exactly_the_limit_per_window() {
    const LIMIT: u64 = 100;
    const PERIOD_US: u64 = 400_000;
    const RUN: Duration = Duration::from_millis(1_500);
    for (algorithm, burst) in [
        ("fixed_window", None),
        ("sliding_window_log", None),
        ("burst_fill", None),
        ("token_bucket", Some(LIMIT)),
        ("gcra", Some(LIMIT)),
    ] {
        let prefix = unique_prefix("race");
        let mut tasks = Vec::new();
        let start = Instant::now();
        for _ in 0..16 {
            let lim = limiter(
                &prefix,
                policy(vec![rule(algorithm, LIMIT, "400ms", burst)], vec![]),
            )
            .await;
            tasks.push(tokio::spawn(async move {
                let mut admitted = Vec::new();
                let mut calls = 0u64;
                while start.elapsed() < RUN {
                    calls += 1;
                    if let Decision::Granted(g) =
                        lim.acquire("hot", 1, Mode::AllOrNothing).await.unwrap()
                    {
                        admitted.push(g.decided_at_us);
                    }
                }
                (admitted, calls)
            }));
        }
        let mut times = Vec::new();
        let mut calls = 0;
        for t in tasks {
            let (a, c) = t.await.unwrap();
            times.extend(a);
            calls += c;
        }
        times.sort_unstable();
        assert!(
            calls > 5 * times.len() as u64,
            "{algorithm}: not contended enough ({calls} calls for {} grants)",
            times.len()
        );
        let (first, last) = (times[0], *times.last().unwrap());
        match algorithm {
            "fixed_window" => {
                let mut per: BTreeMap<u64, u64> = BTreeMap::new();
                for t in &times {
                    *per.entry(t / PERIOD_US).or_default() += 1;
                }
                // Windows wholly inside the run were hammered throughout.
                let full: Vec<_> = per
                    .iter()
                    .filter(|(w, _)| **w * PERIOD_US >= first && (**w + 1) * PERIOD_US <= last)
                    .collect();
                assert!(
                    full.len() >= 2,
                    "{algorithm}: want several full windows, got {per:?}"
                );
                for (w, n) in &per {
                    assert!(
                        *n <= LIMIT,
                        "{algorithm}: window {w} admitted {n} > {LIMIT}"
                    );
                }
                for (w, n) in full {
                    assert_eq!(*n, LIMIT, "{algorithm}: full window {w} admitted {n}");
                }
            }
            "sliding_window_log" | "burst_fill" => {
                // No span shorter than one period holds more than the limit
                // (sliding log), or than 2·limit − 1 (burst fill refills at once);
                // and under pressure each period admits the full limit.
                let bound = if algorithm == "burst_fill" {
                    2 * LIMIT - 1
                } else {
                    LIMIT
                };
                let mut max_in_window = 0;
                let mut lo = 0;
                for hi in 0..times.len() {
                    while times[hi] - times[lo] >= PERIOD_US {
                        lo += 1;
                    }
                    max_in_window = max_in_window.max(hi - lo + 1);
                }
                assert!(
                    max_in_window as u64 <= bound,
                    "{algorithm}: {max_in_window} in one period > {bound}"
                );
                let periods = (last - first) / PERIOD_US;
                assert!(
                    times.len() as u64 >= periods * LIMIT,
                    "{algorithm}: {} admitted over {periods} full periods: the limit was not reached",
                    times.len()
                );
            }
            _ => {
                // Token bucket and GCRA: in any span d, at most burst + d·rate.
                for (i, &a) in times.iter().enumerate() {
                    for (j, &b) in times.iter().enumerate().skip(i).step_by(7) {
                        let allowed = LIMIT + ((b - a) * LIMIT).div_ceil(PERIOD_US);
                        assert!(
                            (j - i + 1) as u64 <= allowed,
                            "{algorithm}: {} admitted in {}µs > {allowed}",
                            j - i + 1,
                            b - a
                        );
                    }
                }
                let expected = LIMIT + (last - first) * LIMIT / PERIOD_US;
                assert!(
                    times.len() as u64 + 2 >= expected,
                    "{algorithm}: {} admitted, {expected} possible",
                    times.len()
                );
            }
        }
    }
}

#[tokio::test]
async fn a_refusing_rule_leaves_the_other_rules_uncharged() {
    let prefix = unique_prefix("atomic");
    let lim = limiter(
        &prefix,
        policy(
            vec![
                rule("sliding_window_log", 10, "1m", None),
                rule("fixed_window", 2, "1s", None),
            ],
            vec![],
        ),
    )
    .await;
    assert_eq!(lim.check(at("s", 0, 2)).await.unwrap().granted(), 2);
    let mut conn = raw().await;
    let log_key = keys_under(&prefix)
        .await
        .into_iter()
        .find(|k| k.contains("sliding_window_log"))
        .expect("log key");
    let before: u64 = redis::cmd("ZCARD")
        .arg(&log_key)
        .query_async(&mut conn)
        .await
        .unwrap();
    for t in [1, 2, 3] {
        let d = lim.check(at("s", t, 1)).await.unwrap();
        assert!(
            matches!(d, Decision::Denied(ref x) if x.by == DeniedBy::Rule(1)),
            "t={t}: {d:?}"
        );
    }
    let after: u64 = redis::cmd("ZCARD")
        .arg(&log_key)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(
        (before, after),
        (2, 2),
        "the log rule must not be charged while fixed_window refuses"
    );
    // Once the window passes, both rules are charged together.
    assert_eq!(lim.check(at("s", 1_000_000, 2)).await.unwrap().granted(), 2);
    let after: u64 = redis::cmd("ZCARD")
        .arg(&log_key)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(after, 4);
}

#[tokio::test]
async fn every_key_has_a_ttl_and_a_sellers_keys_share_one_slot() {
    let prefix = unique_prefix("ttl");
    let all = vec![
        rule("fixed_window", 5, "1s", None),
        rule("sliding_window_log", 5, "1s", None),
        rule("sliding_window_counter", 5, "1s", None),
        rule("token_bucket", 5, "1s", Some(3)),
        rule("leaky_bucket", 5, "1s", Some(3)),
        rule("burst_fill", 5, "1s", None),
        rule("gcra", 5, "1s", Some(3)),
    ];
    let lim = limiter(&prefix, policy(all, vec![])).await;
    for seller in ["seller-1", "odd{seller}", "x"] {
        assert_eq!(
            lim.acquire(seller, 1, Mode::AllOrNothing)
                .await
                .unwrap()
                .granted(),
            1
        );
        lim.block(seller, Duration::from_secs(2)).await.unwrap();
    }
    let keys = keys_under(&prefix).await;
    assert_eq!(
        keys.len(),
        3 * 8,
        "7 rule keys and a block key per seller: {keys:?}"
    );
    let mut conn = raw().await;
    let mut slots: BTreeMap<String, std::collections::BTreeSet<u16>> = BTreeMap::new();
    for k in &keys {
        let ttl: i64 = redis::cmd("PTTL")
            .arg(k)
            .query_async(&mut conn)
            .await
            .unwrap();
        assert!(ttl > 0, "{k} has no TTL ({ttl})");
        let tag = throttle_worker::limiter::keys::hash_tag(k).to_owned();
        let slot = crc16::State::<crc16::XMODEM>::calculate(tag.as_bytes()) % 16384;
        slots.entry(tag).or_default().insert(slot);
    }
    assert_eq!(slots.len(), 3, "one hash tag per seller: {slots:?}");
    assert!(slots.values().all(|s| s.len() == 1));
}

/// The INCR-then-EXPIRE script refreshes the expiry on every hit, so a busy
/// key never resets. Ours sets it when the window is created, and later hits
/// leave it alone.
#[tokio::test]
async fn fixed_window_expiry_is_not_pushed_forward_by_hits() {
    let prefix = unique_prefix("fwttl");
    let lim = limiter(
        &prefix,
        policy(vec![rule("fixed_window", 100, "1h", None)], vec![]),
    )
    .await;
    assert_eq!(lim.check(at("s", 0, 1)).await.unwrap().granted(), 1);
    let key = keys_under(&prefix).await.pop().unwrap();
    let mut conn = raw().await;
    let first: i64 = redis::cmd("PTTL")
        .arg(&key)
        .query_async(&mut conn)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(30)).await;
    for t in 1..=5 {
        assert_eq!(
            lim.check(at("s", t * 60_000_000, 1))
                .await
                .unwrap()
                .granted(),
            1
        );
    }
    let later: i64 = redis::cmd("PTTL")
        .arg(&key)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(
        later < first - 20,
        "expiry moved: {first} ms then {later} ms"
    );
}

#[tokio::test]
async fn a_dry_run_reports_without_consuming() {
    let prefix = unique_prefix("dry");
    let lim = limiter(
        &prefix,
        policy(vec![rule("token_bucket", 2, "1s", None)], vec![]),
    )
    .await;
    for _ in 0..5 {
        let d = lim
            .check(Request {
                dry_run: true,
                ..at("s", 0, 2)
            })
            .await
            .unwrap();
        assert!(
            matches!(d, Decision::Granted(ref g) if g.granted == 2 && g.remaining == 0),
            "{d:?}"
        );
    }
    assert!(keys_under(&prefix).await.is_empty(), "a dry run wrote keys");
    assert_eq!(lim.check(at("s", 0, 2)).await.unwrap().granted(), 2);
    let d = lim
        .check(Request {
            dry_run: true,
            ..at("s", 0, 1)
        })
        .await
        .unwrap();
    assert!(matches!(d, Decision::Denied(_)), "{d:?}");
}

#[tokio::test]
async fn a_downstream_block_holds_the_seller_for_every_replica() {
    let prefix = unique_prefix("block");
    let p = || policy(vec![rule("gcra", 100, "1s", None)], vec![]);
    let (a, b) = (limiter(&prefix, p()).await, limiter(&prefix, p()).await);
    a.block_at("s", T0, Duration::from_millis(1500))
        .await
        .unwrap();
    // A shorter block does not shorten it.
    b.block_at("s", T0, Duration::from_millis(100))
        .await
        .unwrap();
    let d = b.check(at("s", 500_000, 1)).await.unwrap();
    match d {
        Decision::Denied(ref x) => {
            assert_eq!(x.by, DeniedBy::DownstreamBlock);
            assert_eq!(x.retry_after, Duration::from_millis(1000));
        }
        _ => panic!("blocked seller admitted: {d:?}"),
    }
    assert_eq!(b.check(at("other", 500_000, 1)).await.unwrap().granted(), 1);
    assert_eq!(a.check(at("s", 1_500_000, 1)).await.unwrap().granted(), 1);
}

#[tokio::test]
async fn unlimited_sellers_never_touch_redis_and_tiers_apply() {
    let prefix = unique_prefix("unlimited");
    let lim = limiter(
        &prefix,
        policy_with_sellers(
            vec![rule("fixed_window", 1, "1h", None)],
            vec![
                (
                    "internal",
                    SellerConfig {
                        unlimited: true,
                        ..Default::default()
                    },
                ),
                (
                    "own",
                    SellerConfig {
                        rules: Some(vec![rule("fixed_window", 3, "1h", None)]),
                        ..Default::default()
                    },
                ),
            ],
        ),
    )
    .await;
    for t in 0..50 {
        assert_eq!(
            lim.check(at("internal", t, 10)).await.unwrap().granted(),
            10
        );
    }
    assert!(keys_under(&prefix).await.is_empty());
    assert_eq!(lim.check(at("own", 0, 3)).await.unwrap().granted(), 3);
    assert_eq!(
        lim.check(at("default-seller", 0, 2))
            .await
            .unwrap()
            .granted(),
        0
    );
}

/// On a Cluster the global rule is a second call; what it refuses is given
/// back to the seller, so the seller's own budget is not spent by refusals.
#[tokio::test]
async fn split_global_check_refunds_the_seller_when_the_global_rule_refuses() {
    for algorithm in [
        "fixed_window",
        "sliding_window_log",
        "sliding_window_counter",
        "token_bucket",
        "leaky_bucket",
        "burst_fill",
        "gcra",
    ] {
        let prefix = unique_prefix("split");
        let burst = matches!(algorithm, "token_bucket" | "leaky_bucket" | "gcra").then_some(5);
        let lim = limiter_with(
            &prefix,
            policy(
                vec![rule(algorithm, 5, "1h", burst)],
                vec![rule("fixed_window", 3, "1h", None)],
            ),
            Topology::Cluster,
        )
        .await;
        assert_eq!(
            lim.check(at("a", 0, 2)).await.unwrap().granted(),
            2,
            "{algorithm}"
        );
        assert_eq!(
            lim.check(at("b", 1, 1)).await.unwrap().granted(),
            1,
            "{algorithm}"
        );
        // Global budget spent: seller a is refused by the global rule…
        let d = lim.check(at("a", 2, 1)).await.unwrap();
        assert!(
            matches!(d, Decision::Denied(ref x) if x.by == DeniedBy::Rule(1)),
            "{algorithm}: {d:?}"
        );
        // …and keeps its own 3 remaining units (up-to asks for all 5),
        // as the seller's rule alone sees them.
        let own = limiter(
            &prefix,
            policy(vec![rule(algorithm, 5, "1h", burst)], vec![]),
        )
        .await;
        let d = own
            .check(Request {
                dry_run: true,
                mode: Mode::UpTo,
                ..at("a", 3, 5)
            })
            .await
            .unwrap();
        assert_eq!(
            d.granted(),
            3,
            "{algorithm}: refused units were not refunded: {d:?}"
        );
        // An up-to grant cut down by the global rule refunds the rest.
        let prefix2 = unique_prefix("split2");
        let lim2 = limiter_with(
            &prefix2,
            policy(
                vec![rule(algorithm, 5, "1h", burst)],
                vec![rule("fixed_window", 2, "1h", None)],
            ),
            Topology::Cluster,
        )
        .await;
        let d = lim2
            .check(Request {
                mode: Mode::UpTo,
                ..at("a", 0, 5)
            })
            .await
            .unwrap();
        assert_eq!(d.granted(), 2, "{algorithm}: {d:?}");
        let d = lim2
            .check(Request {
                dry_run: true,
                mode: Mode::UpTo,
                ..at("a", 1, 5)
            })
            .await
            .unwrap();
        assert!(
            matches!(d, Decision::Denied(_)),
            "{algorithm}: global spent: {d:?}"
        );
        let own = limiter(
            &prefix2,
            policy(vec![rule(algorithm, 5, "1h", burst)], vec![]),
        )
        .await;
        let d = own
            .check(Request {
                dry_run: true,
                mode: Mode::UpTo,
                ..at("a", 1, 5)
            })
            .await
            .unwrap();
        assert_eq!(
            d.granted(),
            3,
            "{algorithm}: the seller must keep the 3 units the global rule cut: {d:?}"
        );
    }
}
