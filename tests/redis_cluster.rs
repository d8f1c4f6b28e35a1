//! The limiter and the worker on a real 3-master Redis Cluster (issue 6,
//! defect 5): calls are routed by slot, MOVED is followed, every seller's
//! keys share one slot, and the admissions are those of a single Redis.

mod common;

use std::time::Duration;

use common::cluster::RedisCluster;
use common::{policy, rule, unique_prefix, T0};
use throttle_worker::config::Topology;
use throttle_worker::limiter::{Decision, KeySpace, Limiter, Mode, Policy, RedisStore, Request};

fn at(seller: &str, t_us: u64) -> Request<'_> {
    Request {
        seller,
        cost: 1,
        mode: Mode::AllOrNothing,
        dry_run: false,
        at_us: Some(T0 + t_us),
    }
}

/// The most calls of one seller arriving within any `window`.
fn busiest_per_seller(arrivals: &[common::worker::Arrival], window: Duration) -> usize {
    let mut by_seller: std::collections::HashMap<&str, Vec<std::time::Instant>> =
        Default::default();
    for a in arrivals {
        by_seller.entry(&a.seller).or_default().push(a.at);
    }
    let mut best = 0;
    for times in by_seller.values_mut() {
        times.sort();
        let mut lo = 0;
        for hi in 0..times.len() {
            while times[hi].duration_since(times[lo]) >= window {
                lo += 1;
            }
            best = best.max(hi - lo + 1);
        }
    }
    best
}

fn rules() -> Policy {
    policy(
        vec![
            rule("gcra", 5, "1s", Some(3)),
            rule("sliding_window_log", 4, "1s", None),
            rule("token_bucket", 6, "2s", Some(4)),
        ],
        vec![],
    )
}

async fn cluster_store(cluster: &RedisCluster) -> RedisStore {
    // Seeds: one node in `url`, another in `cluster_nodes`; the client
    // discovers the third.
    RedisStore::connect_cluster(&[cluster.url(0), cluster.url(1)], Duration::from_secs(2))
        .await
        .expect("connect to the cluster")
}

/// 12 sellers, 1,200 arrivals (each seller ~28/s against limits of 4-5/s) with explicit times: every decision on the
/// cluster equals the decision on one Redis, and the sellers' keys are
/// spread over all three masters (so calls really were routed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_admits_exactly_what_one_redis_admits() {
    let cluster = RedisCluster::start(3);
    let prefix = unique_prefix("cluster-same");
    let single = Limiter::new(
        common::store().await,
        KeySpace::new(&prefix),
        rules(),
        Topology::Single,
    );
    let clustered = Limiter::new(
        cluster_store(&cluster).await,
        KeySpace::new(&prefix),
        rules(),
        Topology::Cluster,
    );
    let sellers: Vec<String> = (0..12).map(|i| format!("seller-{i}")).collect();
    let mut granted = 0;
    let mut denied = 0;
    for i in 0..1200u64 {
        let seller = &sellers[(i * 5 % 12) as usize];
        let t = i * 3_000;
        let a = single.check(at(seller, t)).await.expect("single Redis");
        let b = clustered.check(at(seller, t)).await.expect("cluster");
        assert_eq!(a, b, "arrival {i} of {seller} at +{t} µs");
        match a {
            Decision::Granted(_) => granted += 1,
            _ => denied += 1,
        }
    }
    assert!(
        granted > 100 && denied > 100,
        "{granted} granted, {denied} denied: both paths exercised"
    );
    // What defect 5 was: a single-server connection to one node of the
    // cluster cannot reach the sellers whose slots live elsewhere.
    let plain = Limiter::new(
        RedisStore::connect(&cluster.url(0), Duration::from_secs(2))
            .await
            .expect("one node"),
        KeySpace::new(&prefix),
        rules(),
        Topology::Cluster,
    );
    let mut moved = 0;
    for s in &sellers {
        if let Err(e) = plain.check(at(s, 5_000_000)).await {
            assert!(format!("{e}").to_lowercase().contains("moved"), "{e}");
            moved += 1;
        }
    }
    assert!(moved > 0, "a plain connection reached every slot");
    let per_node = cluster.keys_per_node();
    println!("keys per master: {per_node:?}; {granted} granted, {denied} denied");
    assert!(
        per_node.iter().all(|&n| n > 0),
        "every master holds some sellers' keys: {per_node:?}"
    );
}

/// Global rules take the split path on a cluster: the global key lives in
/// its own slot, and a seller's units are refunded when the global rule
/// refuses. 30 sellers at one instant against a global 10/s: exactly 10
/// pass, and a refused seller kept its own room (1/s) in the same window.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn global_rules_hold_across_slots() {
    let cluster = RedisCluster::start(3);
    let limiter = Limiter::new(
        cluster_store(&cluster).await,
        KeySpace::new(unique_prefix("cluster-global")),
        policy(
            vec![rule("fixed_window", 1, "1s", None)],
            vec![rule("fixed_window", 10, "1s", None)],
        ),
        Topology::Cluster,
    );
    let sellers: Vec<String> = (0..30).map(|i| format!("s{i}")).collect();
    let mut refused = Vec::new();
    let mut granted = 0;
    for s in &sellers {
        match limiter.check(at(s, 0)).await.expect("cluster call") {
            Decision::Granted(_) => granted += 1,
            _ => refused.push(s.clone()),
        }
    }
    assert_eq!(
        granted, 10,
        "the global rule admits 10 per second across slots"
    );
    let own_only = Limiter::new(
        cluster_store(&cluster).await,
        limiter.keys().clone(),
        policy(vec![rule("fixed_window", 1, "1s", None)], vec![]),
        Topology::Cluster,
    );
    assert!(
        matches!(
            own_only.check(at(&refused[0], 10)).await.unwrap(),
            Decision::Granted(_)
        ),
        "the seller's own unit was refunded when the global rule refused"
    );
}

/// The worker end to end on the cluster: `redis.topology = "cluster"`,
/// `redis.url` one node, `redis.cluster_nodes` another. Every job is done
/// once, and no seller's window is over its limit at the downstream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_worker_runs_on_a_cluster() {
    use common::worker::{always_ok, job, Bench, Downstream, Running};
    let cluster = RedisCluster::start(3);
    let bench = Bench::new("cluster-worker", 4);
    let downstream = Downstream::start(always_ok()).await;
    let mut settings = bench.settings(&downstream.url);
    settings.redis.topology = Topology::Cluster;
    settings.redis.url = cluster.url(0);
    settings.redis.cluster_nodes = vec![cluster.url(2)];
    let limit = 20;
    let worker = Running::start(
        settings,
        common::worker::policy(vec![rule("sliding_window_log", limit, "1s", None)]),
    );
    let records: Vec<_> = (0..300)
        .map(|i| job(&format!("j{i}"), &format!("seller-{}", i % 10)))
        .collect();
    bench.produce(&records).await;
    downstream
        .wait_for("300 jobs on the cluster", Duration::from_secs(60), |a| {
            a.len() >= 300
        })
        .await;
    worker.stop().await;
    let arrivals = downstream.arrivals();
    let mut ids: Vec<_> = arrivals.iter().map(|a| a.job_id.clone()).collect();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 300, "every job called");
    // 900 ms: arrivals lag their grants by up to the transit time, which
    // can bunch two windows' calls at the downstream.
    let busiest = busiest_per_seller(&arrivals, Duration::from_millis(900));
    println!(
        "busiest 900 ms window of a seller: {busiest} (limit {limit} per 1 s); keys per master {:?}",
        cluster.keys_per_node()
    );
    assert!(
        busiest <= limit as usize,
        "a seller's window went over its limit: {busiest}"
    );
    assert!(cluster.keys_per_node().iter().all(|&n| n > 0));
}
