//! `max_in_flight` against Redis (issue 22, part 3): a capped seller's
//! grant also takes a slot per job, in the same script call as the rate
//! decision, all or nothing per job; slots go back with `release` or lapse
//! with their lease. `tests/limiter/agreement.rs` holds the Lua equal to
//! the model step by step; these tests pin the answers a worker relies on.

use crate::common::{limiter_with, raw, rule, unique_prefix, T0};
use throttle_worker::config::{LimitsConfig, RuleConfig, SellerConfig, Topology};
use throttle_worker::limiter::{
    BatchDecision, BatchGranted, DeniedBy, JobsQuery, NextJob, Policy, SLOT_POLL,
};

fn at<'a>(seller: &'a str, ms: u64, costs: &'a [u64]) -> JobsQuery<'a> {
    JobsQuery {
        seller,
        costs,
        dry_run: false,
        at_us: Some(T0 + ms * 1000),
    }
}

/// `seller-c` capped at `cap` under `rules`, `free` uncapped; leases of
/// `lease`.
fn capped(rules: Vec<RuleConfig>, global: Vec<RuleConfig>, cap: u32, lease: &str) -> Policy {
    let cfg = LimitsConfig {
        default: rules.clone(),
        global,
        sellers: [(
            "seller-c".to_owned(),
            SellerConfig {
                rules: Some(rules),
                max_in_flight: Some(cap),
                ..SellerConfig::default()
            },
        )]
        .into(),
        slot_lease: humantime::parse_duration(lease).expect("test lease"),
        ..LimitsConfig::default()
    };
    Policy::from_config(&cfg).expect("test policy must be valid")
}

fn granted(d: BatchDecision) -> BatchGranted {
    match d {
        BatchDecision::Granted(g) => g,
        other => panic!("expected a grant, got {other:?}"),
    }
}

async fn live_slots(prefix: &str, seller: &str) -> u64 {
    let mut conn = raw().await;
    redis::cmd("ZCARD")
        .arg(format!("{prefix}:{{{seller}}}:slots"))
        .query_async(&mut conn)
        .await
        .expect("ZCARD")
}

#[tokio::test]
async fn a_capped_seller_gets_at_most_its_free_slots_and_a_release_frees_one() {
    let prefix = unique_prefix("in-flight");
    let policy = capped(
        vec![rule("fixed_window", 100, "1m", None)],
        vec![],
        3,
        "30s",
    );
    let lim = limiter_with(&prefix, policy, Topology::Single).await;

    // Five jobs fit the rate; three slots: three granted, the fourth waits
    // for a slot (capacity), polled.
    let g = granted(
        lim.check_jobs(at("seller-c", 0, &[1, 1, 1, 1, 1]))
            .await
            .unwrap(),
    );
    assert_eq!((g.jobs, g.units), (3, 3));
    assert_eq!(g.leases.len(), 3, "one lease per granted job: {g:?}");
    assert_eq!(
        g.next,
        Some(NextJob::Wait {
            retry_after: SLOT_POLL,
            by: DeniedBy::MaxInFlight
        })
    );
    assert_eq!(live_slots(&prefix, "seller-c").await, 3);

    // Every slot taken: refused as capacity, not as the limit; nothing
    // charged (the rate still has 97 units).
    match lim.check_jobs(at("seller-c", 10, &[1])).await.unwrap() {
        BatchDecision::Denied(d) => {
            assert_eq!(d.by, DeniedBy::MaxInFlight);
            assert_eq!(d.retry_after, SLOT_POLL);
            assert_eq!(d.remaining, 97);
        }
        other => panic!("expected a refusal for want of a slot, got {other:?}"),
    }
    // An uncapped seller is not held by another's slots.
    let other = granted(lim.check_jobs(at("free", 10, &[1, 1, 1, 1])).await.unwrap());
    assert_eq!((other.jobs, other.leases.len()), (4, 0));

    // One answer arrives: its slot comes back, and exactly one job passes.
    assert_eq!(lim.release("seller-c", &g.leases[..1]).await.unwrap(), 1);
    // Given back twice: nothing more comes back.
    assert_eq!(lim.release("seller-c", &g.leases[..1]).await.unwrap(), 0);
    let again = granted(lim.check_jobs(at("seller-c", 20, &[1, 1])).await.unwrap());
    assert_eq!(again.jobs, 1);
    assert_eq!(live_slots(&prefix, "seller-c").await, 3);

    // A dry run decides on the slots but takes none.
    lim.release("seller-c", &again.leases).await.unwrap();
    let peek = JobsQuery {
        dry_run: true,
        ..at("seller-c", 30, &[1, 1])
    };
    let p = granted(lim.check_jobs(peek).await.unwrap());
    assert_eq!((p.jobs, p.leases.len()), (1, 0));
    assert_eq!(live_slots(&prefix, "seller-c").await, 2);
}

#[tokio::test]
async fn slots_of_a_replica_that_never_gives_them_back_lapse_with_their_lease() {
    let prefix = unique_prefix("in-flight-lease");
    let policy = capped(vec![rule("fixed_window", 100, "1m", None)], vec![], 2, "2s");
    let lim = limiter_with(&prefix, policy, Topology::Single).await;
    let g = granted(lim.check_jobs(at("seller-c", 0, &[1, 1])).await.unwrap());
    assert_eq!(g.jobs, 2);
    // Held to the end of the lease (2 s after the grant) ...
    assert!(matches!(
        lim.check_jobs(at("seller-c", 1_999, &[1])).await.unwrap(),
        BatchDecision::Denied(d) if d.by == DeniedBy::MaxInFlight
    ));
    // ... and free from then, without a release.
    let later = granted(
        lim.check_jobs(at("seller-c", 2_001, &[1, 1, 1]))
            .await
            .unwrap(),
    );
    assert_eq!(later.jobs, 2);
}

#[tokio::test]
async fn a_rate_refusal_is_told_as_the_limit_even_when_the_slots_are_full() {
    let prefix = unique_prefix("in-flight-rate");
    let policy = capped(vec![rule("fixed_window", 2, "1m", None)], vec![], 2, "30s");
    let lim = limiter_with(&prefix, policy, Topology::Single).await;
    granted(lim.check_jobs(at("seller-c", 0, &[1, 1])).await.unwrap());
    match lim.check_jobs(at("seller-c", 5, &[1])).await.unwrap() {
        BatchDecision::Denied(d) => assert_eq!(d.by, DeniedBy::Rule(0)),
        other => panic!("expected a refusal by the rule, got {other:?}"),
    }
}

#[tokio::test]
async fn jobs_the_global_rules_cut_give_their_slots_back() {
    // Cluster topology: the seller's call takes slots for its whole prefix,
    // then the global rules cut it; the cut jobs' slots come back with
    // their units.
    let prefix = unique_prefix("in-flight-split");
    let policy = capped(
        vec![rule("fixed_window", 100, "1m", None)],
        vec![rule("fixed_window", 2, "1m", None)],
        5,
        "30s",
    );
    let lim = limiter_with(&prefix, policy, Topology::Cluster).await;
    let g = granted(
        lim.check_jobs(at("seller-c", 0, &[1, 1, 1, 1]))
            .await
            .unwrap(),
    );
    assert_eq!(g.jobs, 2, "{g:?}");
    assert_eq!(g.leases.len(), 2);
    assert_eq!(live_slots(&prefix, "seller-c").await, 2);
}
