//! The retry topics are tiered by delay, so a record due later never holds
//! up one due sooner (issue 6, defect 2): a record written to tier `d` is
//! released `d` after it was written, which keeps each tier's partitions in
//! release order; a job waiting longer hops down the tiers.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::common::rule;
use crate::common::worker::{
    always_ok, job, policy, produce_with_headers, read_to_end, Bench, Downstream, Running,
};
use axum::http::StatusCode;

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

fn job_value(id: &str, seller: &str) -> Vec<u8> {
    serde_json::json!({"job_id": id, "seller_id": seller, "payload": {"sku": id}})
        .to_string()
        .into_bytes()
}

/// Record A due in 1 h, then B due in 1 s, in one retry partition: B is
/// called within 2 s, and A moves to a longer tier instead of holding the
/// partition.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_record_due_in_an_hour_does_not_hold_up_one_due_in_a_second() {
    let bench = Bench::new("tiers-hol", 1);
    let down = Downstream::start(always_ok()).await;
    let settings = bench.settings(&down.url);
    let tier = bench.retry_tier("5s");
    let now = unix_ms();
    let (a_due, b_due) = (now + 3_600_000, now + 1_000);
    for (id, due) in [("A", a_due), ("B", b_due)] {
        produce_with_headers(
            &bench.bootstrap(),
            &tier,
            0,
            &job_value(id, &format!("seller-{id}")),
            &[
                ("x-not-before", due.to_string()),
                ("x-attempts", "1".into()),
            ],
        )
        .await;
    }
    let w = Running::start(settings, policy(vec![rule("gcra", 1000, "1s", None)]));
    let started = Instant::now();
    down.wait_for("B", Duration::from_secs(20), |a| {
        a.iter().any(|x| x.job_id == "B")
    })
    .await;
    let b = down
        .arrivals()
        .into_iter()
        .find(|x| x.job_id == "B")
        .expect("B arrived");
    let b_at = b.wall.duration_since(UNIX_EPOCH).unwrap().as_millis() as u64;
    println!(
        "B called {} ms after it was due ({} ms after the worker started)",
        b_at as i64 - b_due as i64,
        started.elapsed().as_millis()
    );
    assert!(b_at >= b_due, "B called {} ms early", b_due - b_at);
    assert!(
        b_at <= b_due + 2_000,
        "B was called {} ms after it was due: held up behind A",
        b_at - b_due
    );
    // The longest tier that does not pass its due time: a wait of just
    // under an hour goes to the 10m tier (and hops on from there).
    let tier = read_to_end(
        &bench.bootstrap(),
        &bench.retry_tier("10m"),
        1,
        Duration::from_secs(30),
    );
    let a: Vec<_> = tier
        .iter()
        .filter(|(v, _)| *v == job_value("A", "seller-A"))
        .collect();
    assert_eq!(a.len(), 1, "A hops to the 10m tier: {tier:?}");
    assert_eq!(
        a[0].1.get("x-not-before"),
        Some(&a_due.to_string()),
        "A keeps its due time"
    );
    assert!(
        down.arrivals().iter().all(|x| x.job_id != "A"),
        "A was called an hour early"
    );
    w.stop().await;
}

/// Through the worker: a seller held for an hour by a 429 goes to a long
/// tier; a seller held for 2 s, deferred at the same time, is called when
/// due, not behind it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn long_and_short_holds_are_deferred_to_their_own_tiers() {
    let bench = Bench::new("tiers-429", 2);
    let down = Downstream::start(Arc::new(
        |a: &crate::common::worker::Arrival, earlier| match (a.seller.as_str(), earlier) {
            ("day", _) => (StatusCode::TOO_MANY_REQUESTS, Some("3600".into())),
            ("brief", 0) => (StatusCode::TOO_MANY_REQUESTS, Some("2".into())),
            _ => (StatusCode::OK, None),
        },
    ))
    .await;
    let mut settings = bench.settings(&down.url);
    settings.worker.max_inline_delay = Duration::from_millis(500);
    bench
        .produce(&[job("day-1", "day"), job("brief-1", "brief")])
        .await;
    let w = Running::start(settings, policy(vec![rule("gcra", 1000, "1s", None)]));
    down.wait_for("brief-1 twice", Duration::from_secs(20), |a| {
        a.iter().filter(|x| x.job_id == "brief-1").count() >= 2
    })
    .await;
    let calls: Vec<_> = down
        .arrivals()
        .into_iter()
        .filter(|x| x.job_id == "brief-1")
        .collect();
    let gap = calls[1].at.duration_since(calls[0].at);
    println!("brief-1: 429 with Retry-After 2, called again {gap:?} later");
    assert!(
        gap >= Duration::from_secs(2),
        "called again after {gap:?}: early"
    );
    // Held up means behind the hour-long hold, or sent round the shortest
    // tier (5 s): anything under 5 s is neither. Measured on 2 cores, 14
    // runs before issue 35 and 12 after: 2.0-2.06 s in most, 2.55 s in a
    // few, 4.06 s in two of each (the extra 2.0 s is the mock's rebalance
    // hold, session.timeout.ms - 1 s, by its size; not traced further).
    // The bound was 3.5 s and failed CI once on those 4.06 s.
    assert!(
        gap <= Duration::from_millis(4500),
        "called again after {gap:?}: held up"
    );
    let tier = read_to_end(
        &bench.bootstrap(),
        &bench.retry_tier("10m"),
        1,
        Duration::from_secs(30),
    );
    assert_eq!(
        tier.iter()
            .filter(|(v, _)| String::from_utf8_lossy(v).contains("day-1"))
            .count(),
        1,
        "the hour-long hold goes to the 10m tier (the longest under its wait)"
    );
    w.stop().await;
}

/// A retry partition whose head is not released yet is paused, and only
/// that one: records released now on the tier's other partition, and new
/// jobs, are called at once, while the held partition's head and the
/// record behind it wait for their release (4 s away), never called before.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn only_the_retry_partition_whose_head_is_not_released_is_paused() {
    let bench = Bench::new("tiers-pause", 2);
    let down = Downstream::start(always_ok()).await;
    let w = Running::start(
        bench.settings(&down.url),
        policy(vec![rule("gcra", 1000, "1s", None)]),
    );
    // Consuming: it has called a probe job.
    crate::common::worker::wait_all_calling(&bench, &down, 1, Duration::from_secs(30)).await;
    let tier = bench.retry_tier("5s");
    let now = unix_ms();
    let later = now + 4_000;
    for (id, partition, release) in [("held", 0, later), ("behind", 0, later), ("free", 1, now)] {
        produce_with_headers(
            &bench.bootstrap(),
            &tier,
            partition,
            &job_value(id, &format!("seller-{id}")),
            &[
                ("x-not-before", release.to_string()),
                ("x-release-at", release.to_string()),
                ("x-attempts", "1".into()),
            ],
        )
        .await;
    }
    bench.produce(&[job("fresh", "seller-fresh")]).await;
    down.wait_for("every record", Duration::from_secs(30), |a| {
        ["held", "behind", "free", "fresh"]
            .iter()
            .all(|id| a.iter().any(|x| x.job_id == *id))
    })
    .await;
    w.stop().await;
    let called = |id: &str| {
        let a = down
            .arrivals()
            .into_iter()
            .find(|x| x.job_id == id)
            .expect("arrived");
        a.wall.duration_since(UNIX_EPOCH).unwrap().as_millis() as u64
    };
    for id in ["held", "behind"] {
        assert!(
            called(id) >= later,
            "{id} called {} ms before its release",
            later - called(id)
        );
    }
    for id in ["free", "fresh"] {
        assert!(
            called(id) < later,
            "{id} was held {} ms past the other partition's release: more than that partition was paused",
            called(id) - later
        );
    }
}
