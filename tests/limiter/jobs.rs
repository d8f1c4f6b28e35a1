//! Per-job costs, batched (issue 7): `Limiter::acquire_jobs` grants the
//! longest prefix of a seller's job list that fits, each job all or nothing
//! across every rule, in one script call.
//!
//! - Against Redis: a refused job ends the prefix (a lighter job after it is
//!   not granted), exactly the granted units are charged, a job above a
//!   rule's capacity is `CannotPass` with the reason, an unlimited
//!   seller honours the downstream block, and in cluster topology the global
//!   rules may cut the prefix (the seller gets the cut jobs' units back).
//! - `the_next_jobs_retry_after_is_exact` (reference model, which
//!   `tests/limiter/agreement.rs` holds equal to the Lua): whenever a job
//!   stops the prefix with a wait, that job alone passes at exactly
//!   now + retry-after and not 1 µs earlier.

use std::time::Duration;

use crate::common::{
    keys_under, limiter, limiter_with, policy, policy_with_sellers, rule, unique_prefix, T0,
};
use proptest::prelude::*;
use throttle_worker::config::{SellerConfig, Topology};
use throttle_worker::limiter::local::ModelStore;
use throttle_worker::limiter::testkit;
use throttle_worker::limiter::{
    Algorithm, BatchDecision, BlockAt, BlockRead, DeniedBy, JobsQuery, JobsRequest, Mode, NextJob,
    Request, Rule, StateKey, Unused,
};

fn at<'a>(seller: &'a str, t: u64, costs: &'a [u64]) -> JobsQuery<'a> {
    JobsQuery {
        seller,
        costs,
        dry_run: false,
        at_us: Some(T0 + t),
    }
}

fn peek<'a>(seller: &'a str, t: u64, costs: &'a [u64]) -> JobsQuery<'a> {
    JobsQuery {
        dry_run: true,
        ..at(seller, t, costs)
    }
}

/// Issue 53 (quota): the units of granted jobs a revoke left uncalled come
/// back with `Limiter::give_back`, through each rule's refund: the seller
/// may be granted them again, and no more than its limit. Two rules, so
/// that both give back.
#[tokio::test]
async fn units_given_back_are_granted_again_and_never_past_the_limit() {
    let rules = policy(
        vec![
            rule("sliding_window_log", 3, "1h", None),
            rule("fixed_window", 10, "1h", None),
        ],
        vec![],
    );
    let lim = limiter(&unique_prefix("jobs-give-back"), rules).await;
    let BatchDecision::Granted(g) = lim.check_jobs(at("s", 0, &[1, 1, 1])).await.unwrap() else {
        panic!("a fresh seller is granted its three jobs");
    };
    let receipt = g.receipt.expect("a charged grant names its charge");
    let unused = Unused {
        units: 2,
        at_tail: 2,
    };
    assert_eq!(lim.give_back("s", &receipt, unused).await.unwrap(), 2);
    let again = lim.check_jobs(at("s", 1_000, &[1, 1, 1])).await.unwrap();
    assert_eq!(
        again.jobs(),
        2,
        "the two units given back, not a third: {again:?}"
    );
}

/// A pacer's grant is slots in time: units given back from before a slot
/// still used are holes no later grant may fill. Found by the simulation
/// (seeds 2223 and 4839): a revoke took the first jobs of a paced run, the
/// whole count came back, the queue's end moved in past the run's later
/// jobs, and the next grant went at the same instant as one of them.
/// On Redis' own clock (a refund runs at Redis' now), with slots 10 s
/// apart so none drains meanwhile.
#[tokio::test]
async fn a_pacer_takes_back_only_the_units_that_end_its_grant() {
    let rules = policy(vec![rule("leaky_bucket", 4, "40s", Some(4))], vec![]);
    let lim = limiter(&unique_prefix("jobs-give-back-pacer"), rules).await;
    let now = |seller| JobsQuery {
        seller,
        costs: &[1],
        dry_run: false,
        at_us: None,
    };
    let four = |seller| JobsQuery {
        costs: &[1, 1, 1, 1],
        ..now(seller)
    };
    // Jobs 1 and 2 go back (a revoke), jobs 3 and 4 keep their slots.
    let BatchDecision::Granted(g) = lim.check_jobs(four("a")).await.unwrap() else {
        panic!("a fresh seller is granted a full queue");
    };
    let receipt = g.receipt.expect("a charged grant names its charge");
    let head = Unused {
        units: 2,
        at_tail: 0,
    };
    lim.give_back("a", &receipt, head).await.unwrap();
    let after = lim.check_jobs(now("a")).await.unwrap();
    assert!(
        matches!(after, BatchDecision::Denied(_)),
        "slots 3 and 4 are still used, so the queue is still full: {after:?}"
    );
    // Jobs 3 and 4 go back: the queue's end moves in by their two slots.
    let BatchDecision::Granted(g) = lim.check_jobs(four("b")).await.unwrap() else {
        panic!("a fresh seller is granted a full queue");
    };
    let pace = g.pace.expect("a pacer's grant");
    let receipt = g.receipt.expect("a charged grant names its charge");
    let tail = Unused {
        units: 2,
        at_tail: 2,
    };
    lim.give_back("b", &receipt, tail).await.unwrap();
    let BatchDecision::Granted(again) = lim.check_jobs(now("b")).await.unwrap() else {
        panic!("the two slots given back are granted again");
    };
    let first = again.pace.expect("a pacer's grant").first_at_us;
    assert_eq!(
        first,
        pace.first_at_us + 2 * pace.interval_us,
        "the next unit goes in the first slot given back"
    );
}

#[tokio::test]
async fn a_refused_job_ends_the_prefix_and_only_granted_units_are_charged() {
    let prefix = unique_prefix("jobs-prefix");
    let lim = limiter(
        &prefix,
        policy(
            vec![
                rule("sliding_window_log", 4, "1s", None),
                rule("gcra", 5, "1s", Some(5)),
            ],
            vec![],
        ),
    )
    .await;
    // 2 + 1 fit; 3 does not (1 left); the last job (1) would fit but must
    // not pass the heavier job ahead of it.
    let d = lim.check_jobs(at("s", 0, &[2, 1, 3, 1])).await.unwrap();
    let BatchDecision::Granted(g) = d else {
        panic!("want a grant of two jobs: {d:?}")
    };
    assert_eq!((g.jobs, g.units, g.remaining), (2, 3, 1), "{g:?}");
    let Some(NextJob::Wait { retry_after, by }) = g.next else {
        panic!("the third job must wait: {g:?}")
    };
    // The log's oldest entries (written now) leave after the 1 s period.
    assert_eq!(
        (retry_after, by),
        (Duration::from_secs(1), DeniedBy::Rule(0))
    );
    // Exactly 3 units were charged: one unit is left, under both rules.
    let single = lim
        .check(Request {
            seller: "s",
            cost: 9,
            mode: Mode::UpTo,
            dry_run: true,
            at_us: Some(T0),
        })
        .await
        .unwrap();
    assert_eq!(single.granted(), 1, "{single:?}");
    // The third job passes at the retry-after, not a microsecond before.
    let early = lim.check_jobs(peek("s", 999_999, &[3])).await.unwrap();
    assert!(matches!(early, BatchDecision::Denied(_)), "{early:?}");
    let due = lim.check_jobs(peek("s", 1_000_000, &[3, 1])).await.unwrap();
    assert_eq!(due.jobs(), 2, "{due:?}");
}

#[tokio::test]
async fn a_job_above_a_rules_capacity_can_never_pass_and_says_why() {
    let prefix = unique_prefix("jobs-never");
    let lim = limiter(
        &prefix,
        policy(vec![rule("sliding_window_log", 100, "1m", None)], vec![]),
    )
    .await;
    let reason = "cost 500 exceeds rule sliding_window_log 100/1m (capacity 100); split the job or give the seller a burst";
    // First in the list: nothing to grant, no round trip needed.
    match lim.check_jobs(at("s", 0, &[500, 1])).await.unwrap() {
        BatchDecision::Never(c) => assert_eq!(c.to_string(), reason),
        d => panic!("{d:?}"),
    }
    assert!(keys_under(&prefix).await.is_empty(), "nothing charged");
    // Behind a job that fits: that job is granted, the list stops there.
    match lim.check_jobs(at("s", 0, &[7, 500, 1])).await.unwrap() {
        BatchDecision::Granted(g) => {
            assert_eq!((g.jobs, g.units), (1, 7), "{g:?}");
            match g.next {
                Some(NextJob::Never(c)) => assert_eq!(c.to_string(), reason),
                n => panic!("{n:?}"),
            }
        }
        d => panic!("{d:?}"),
    }
}

#[tokio::test]
async fn an_unlimited_seller_gets_every_job_unless_blocked() {
    let prefix = unique_prefix("jobs-unlimited");
    let lim = limiter(
        &prefix,
        policy_with_sellers(
            vec![rule("fixed_window", 1, "1h", None)],
            vec![(
                "internal",
                SellerConfig {
                    unlimited: true,
                    ..Default::default()
                },
            )],
        ),
    )
    .await;
    let d = lim.check_jobs(at("internal", 0, &[500, 3])).await.unwrap();
    assert!(
        matches!(d, BatchDecision::Granted(ref g) if g.jobs == 2 && g.units == 503 && g.next.is_none()),
        "{d:?}"
    );
    lim.block_at("internal", T0, Duration::from_secs(2))
        .await
        .unwrap();
    let d = lim.check_jobs(at("internal", 500_000, &[1])).await.unwrap();
    assert!(
        matches!(d, BatchDecision::Denied(ref x) if x.by == DeniedBy::DownstreamBlock
            && x.retry_after == Duration::from_millis(1500)),
        "{d:?}"
    );
}

/// Cluster: the seller grants [2, 2, 1]; the global rule (3 per hour) only
/// [2]. The seller keeps the 2 units of the job that runs and gets the
/// other 3 back.
#[tokio::test]
async fn cluster_global_rules_cut_the_prefix_and_the_seller_gets_the_cut_units_back() {
    let prefix = unique_prefix("jobs-split");
    let own = || vec![rule("gcra", 5, "1h", Some(5))];
    let lim = limiter_with(
        &prefix,
        policy(own(), vec![rule("fixed_window", 3, "1h", None)]),
        Topology::Cluster,
    )
    .await;
    let d = lim.check_jobs(at("a", 0, &[2, 2, 1])).await.unwrap();
    let BatchDecision::Granted(g) = d else {
        panic!("{d:?}")
    };
    assert_eq!((g.jobs, g.units), (1, 2), "{g:?}");
    assert!(
        matches!(
            g.next,
            Some(NextJob::Wait {
                by: DeniedBy::Rule(1),
                ..
            })
        ),
        "the global rule (index 1, after the seller's one) stops it: {g:?}"
    );
    let seller_only = limiter(&prefix, policy(own(), vec![])).await;
    let left = seller_only
        .check_jobs(peek("a", 1, &[1, 1, 1, 1, 1]))
        .await
        .unwrap();
    assert_eq!(left.jobs(), 3, "the seller keeps 3 of its 5: {left:?}");
}

/// Coalescing: several sellers' lists in one round trip answer exactly as
/// one call per list would, in order (a seller listed twice sees its first
/// list's charge; an unlimited seller still honours its block).
#[tokio::test]
async fn several_sellers_in_one_call_answer_as_separate_calls() {
    let p = || {
        policy_with_sellers(
            vec![
                rule("sliding_window_log", 4, "1s", None),
                rule("leaky_bucket", 10, "1s", Some(6)),
            ],
            vec![
                (
                    "internal",
                    SellerConfig {
                        unlimited: true,
                        ..Default::default()
                    },
                ),
                (
                    "small",
                    SellerConfig {
                        rules: Some(vec![rule("token_bucket", 2, "1s", Some(3))]),
                        ..Default::default()
                    },
                ),
            ],
        )
    };
    let (one, many) = (unique_prefix("jobs-one"), unique_prefix("jobs-many"));
    let (one, many) = (limiter(&one, p()).await, limiter(&many, p()).await);
    for lim in [&one, &many] {
        lim.block_at("blocked", T0, Duration::from_secs(1))
            .await
            .unwrap();
    }
    let lists: [(&str, &[u64]); 6] = [
        ("a", &[2, 1, 3]),
        ("small", &[1, 1, 1, 1]),
        ("a", &[1, 1]),
        ("internal", &[500]),
        ("blocked", &[1]),
        ("b", &[5, 1]),
    ];
    for t in [0, 100_000, 1_000_000] {
        let mut separate = Vec::new();
        for (seller, costs) in lists {
            separate.push(charged(
                one.check_jobs(at(seller, t, costs)).await.unwrap(),
                seller,
            ));
        }
        let together: Vec<BatchDecision> = many
            .check_jobs_many(&lists, false, Some(T0 + t))
            .await
            .into_iter()
            .zip(lists)
            .map(|(a, (seller, _))| charged(a.expect("a decision"), seller))
            .collect();
        assert_eq!(together, separate, "at +{t} µs");
    }
}

/// `d` without its receipt, which names the call that charged it (each
/// call has an id of its own), once checked: a grant names its charge
/// when a rule took units (not for an unlimited seller), taken at the
/// decision's time.
fn charged(d: BatchDecision, seller: &str) -> BatchDecision {
    match d {
        BatchDecision::Granted(mut g) => {
            let receipt = g.receipt.take();
            assert_eq!(
                receipt.as_ref().map(|r| r.taken_at_us),
                (seller != "internal").then_some(g.decided_at_us),
                "{seller}: {receipt:?}"
            );
            BatchDecision::Granted(g)
        }
        other => other,
    }
}

/// A coalesced call carries many sellers' requests: one that the script
/// refuses (here a job of cost 0, which the Rust side never sends, so the
/// call is made by hand) must refuse the call before any seller ahead of
/// it is charged, so that a retried call charges nobody twice.
#[tokio::test]
async fn a_bad_request_refuses_the_whole_call_and_charges_nobody() {
    let prefix = unique_prefix("jobs-bad");
    // Loads the library (FUNCTION LOAD) on this server.
    let store = crate::common::store().await;
    let mut keys = Vec::new();
    let mut args: Vec<String> = vec!["jobs".into(), T0.to_string(), "2".into()];
    for (seller, costs) in [("first", "1,1"), ("second", "1,0")] {
        keys.push(format!("{prefix}:{{{seller}}}:v2"));
        keys.push(format!("{prefix}:{{{seller}}}:v2"));
        args.extend(
            // The block in the hash, one rule at place r0, slot terms ''
            // (no max_in_flight).
            [
                seller, costs, "f", "1", "gcra", "5", "1000000", "5", "r0", "",
            ]
            .iter()
            .map(|a| a.to_string()),
        );
    }
    let reply: redis::RedisResult<redis::Value> = redis::cmd("FCALL")
        .arg(&store.library().limiter)
        .arg(keys.len())
        .arg(&keys)
        .arg(&args)
        .query_async(&mut crate::common::raw().await)
        .await;
    let err = reply.expect_err("a job of cost 0 must refuse the call");
    // The script's reply `-cost must be at least 1` reads as code "cost".
    let msg = err.to_string();
    assert!(
        msg.contains("cost") && msg.contains("must be at least 1"),
        "the error names the cause: {msg}"
    );
    assert_eq!(
        keys_under(&prefix).await,
        Vec::<String>::new(),
        "nothing may be charged by a refused call"
    );
}

/// Issue 21, part 6: a grant names the rule its `remaining` is from, so
/// that `near_limit` reads it against that rule's capacity. Here a large
/// rule (1,000) is nearly used up while a small one (10) is fresh: the
/// large one is the tightest. In cluster topology the global rules are
/// numbered after the seller's own.
#[tokio::test]
async fn a_grant_names_its_tightest_rule() {
    for topology in [Topology::Single, Topology::Cluster] {
        let prefix = unique_prefix("jobs-tightest");
        let lim = limiter_with(
            &prefix,
            policy(
                vec![
                    rule("fixed_window", 10, "1s", None),
                    rule("fixed_window", 1000, "1h", None),
                ],
                vec![rule("fixed_window", 5000, "1h", None)],
            ),
            topology,
        )
        .await;
        let tightest = |d: &BatchDecision| match d {
            BatchDecision::Granted(g) => (g.remaining, g.tightest),
            other => panic!("{topology:?}: {other:?}"),
        };
        let d = lim.check_jobs(at("s", 0, &[1])).await.expect("a decision");
        assert_eq!(tightest(&d), (9, Some(0)), "{topology:?}: fresh");
        // 990 more, a second apart in ten-unit steps: the hourly rule holds
        // 9 then, the per-second one 10.
        for t in 1..=99 {
            lim.check_jobs(at("s", t * 1_000_000, &[10]))
                .await
                .expect("a decision");
        }
        let d = lim
            .check_jobs(at("s", 100_000_000, &[1]))
            .await
            .expect("a decision");
        assert_eq!(tightest(&d), (8, Some(1)), "{topology:?}: the hourly rule");
    }
}

/// Issue 21, part 5: a jobs call carries a deadline on Redis' clock (the
/// argument after the requests); one that runs after it is refused with
/// `EXPIRED` and charges nothing (its caller has timed out), whether the
/// call's own time is Redis' or explicit. One before it runs as usual.
#[tokio::test]
async fn a_jobs_call_past_its_deadline_charges_nothing() {
    let prefix = unique_prefix("jobs-deadline");
    let store = crate::common::store().await;
    let redis_now_us = {
        let (s, us): (u64, u64) = redis::cmd("TIME")
            .query_async(&mut crate::common::raw().await)
            .await
            .expect("TIME");
        s * 1_000_000 + us
    };
    let keys = [format!("{prefix}:{{s}}:v2"), format!("{prefix}:{{s}}:v2")];
    let call = |now: String, deadline: u64| {
        let args: Vec<String> = [
            "jobs", &now, "1", "c1", "1,1", "f", "1", "gcra", "5", "1000000", "5", "r0", "",
        ]
        .iter()
        .map(|a| a.to_string())
        .chain([deadline.to_string()])
        .collect();
        let (keys, function) = (keys.clone(), store.library().limiter.clone());
        async move {
            redis::cmd("FCALL")
                .arg(function)
                .arg(keys.len())
                .arg(&keys)
                .arg(&args)
                .query_async::<Vec<i64>>(&mut crate::common::raw().await)
                .await
        }
    };
    for now in [String::new(), T0.to_string()] {
        let err = call(now.clone(), redis_now_us - 1)
            .await
            .expect_err("a call past its deadline must be refused");
        assert!(err.to_string().contains("EXPIRED"), "now {now:?}: {err}");
        assert_eq!(
            keys_under(&prefix).await,
            Vec::<String>::new(),
            "now {now:?}: nothing may be charged by an expired call"
        );
    }
    let reply = call(String::new(), redis_now_us + 60_000_000)
        .await
        .expect("a call within its deadline runs");
    assert_eq!(
        (reply[0], reply[10]),
        (1, 2),
        "both jobs granted: {reply:?}"
    );
}

// ---------------------------------------------------------------------------
// Exact retry-after of the job that stops the prefix (reference model).

fn small_rule() -> impl Strategy<Value = Rule> {
    let period_us = prop_oneof![Just(50u64), 51u64..3_000, Just(1_000_000u64)];
    (
        prop::sample::select(Algorithm::ALL.to_vec()),
        1u64..=6,
        period_us,
        1u64..=8,
    )
        .prop_map(|(a, limit, period_us, burst)| {
            Rule::new(
                a,
                limit,
                Duration::from_micros(period_us),
                a.uses_burst().then_some(burst),
            )
            .expect("valid rule")
        })
}

fn request(rules: &[Rule], costs: &[u64], id: &str) -> JobsRequest {
    JobsRequest {
        call_id: id.to_owned(),
        block: BlockAt::new("m:{s}", BlockRead::Field),
        rules: rules
            .iter()
            .enumerate()
            .map(|(i, r)| (StateKey::new("m:{s}", format!("r{i}")), *r))
            .collect(),
        costs: costs.to_vec(),
        slots: None,
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2_000, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn the_next_jobs_retry_after_is_exact(
        rules in prop::collection::vec(small_rule(), 1..=3),
        history in prop::collection::vec((0u64..2_000, prop::collection::vec(1u64..=4, 1..=4)), 0..8),
        costs in prop::collection::vec(1u64..=8, 1..=6),
    ) {
        let mut store = ModelStore::new();
        let mut now = T0;
        for (i, (gap, list)) in history.iter().enumerate() {
            now += gap;
            testkit::run_jobs(&mut store, now, false, &[request(&rules, list, &format!("h{i}"))]);
        }
        let r = testkit::run_jobs(&mut store, now, false, &[request(&rules, &costs, "x")])[0];
        let (stopper, retry) = match (r.head.status, r.next) {
            (1, 1) => (costs[r.jobs as usize], r.head.retry_after_us as u64),
            (0, _) => (costs[0], r.head.retry_after_us as u64),
            _ => return Ok(()),
        };
        prop_assert!(retry > 0, "{r:?}");
        let probe = |t: u64| {
            let mut s = store.clone();
            testkit::run_jobs(&mut s, t, true, &[request(&rules, &[stopper], "p")])[0]
        };
        let early = probe(now + retry - 1);
        prop_assert_eq!(early.head.status, 0, "1 µs early must be refused: {:?} then {:?}", r, early);
        let due = probe(now + retry);
        prop_assert_eq!(due.jobs, 1, "at the retry-after the job passes: {:?} then {:?}", r, due);
    }
}
