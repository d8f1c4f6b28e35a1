//! Each seller's wait in plain sight: a seller over its rule shows how
//! long its oldest job has waited, how long its backlog takes to drain at
//! its rate, and that a rule holds it; a seller with nothing waiting shows
//! nothing. Read from the worker's own metrics.

use std::collections::HashSet;
use std::time::Duration;

use crate::common::worker::{always_ok, job, Bench, Downstream, Running};
use crate::common::{metric, policy_with_sellers, rule};
use throttle_worker::config::SellerConfig;
use throttle_worker::limiter::waits;

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_seller_held_by_its_rule_shows_its_oldest_wait_drain_and_hold() {
    let bench = Bench::new("waits", 2);
    let down = Downstream::start(always_ok()).await;
    let mut settings = bench.settings(&down.url);
    settings.worker.max_inline_delay = Duration::from_secs(60);
    // 5 a minute for the busy seller; the quick one is free. A sliding
    // log, not a fixed window: a run that crossed a minute boundary got 5
    // more jobs of a fresh window, and its board said 15 waiting, not 20.
    let policy = policy_with_sellers(
        vec![rule("gcra", 10_000, "1s", None)],
        vec![(
            "busy",
            SellerConfig {
                rules: Some(vec![rule("sliding_window_log", 5, "1m", None)]),
                ..Default::default()
            },
        )],
    );
    let mut records: Vec<_> = (0..25).map(|i| job(&format!("w-{i}"), "busy")).collect();
    records.extend((0..5).map(|i| job(&format!("q-{i}"), "quick")));
    bench.produce(&records).await;
    let w = Running::start(settings, policy);
    down.wait_for("5 busy and 5 quick jobs", Duration::from_secs(20), |a| {
        a.iter()
            .map(|x| x.job_id.as_str())
            .collect::<HashSet<_>>()
            .len()
            >= 10
    })
    .await;
    // Two commit intervals: the report is taken on each.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let oldest = metric("throttle_seller_oldest_wait_seconds", &[("seller", "busy")]);
    let drain = metric("throttle_seller_drain_seconds", &[("seller", "busy")]);
    let held = metric(
        "throttle_seller_held",
        &[("seller", "busy"), ("held_by", "rule 0")],
    );
    let quick = metric(
        "throttle_seller_oldest_wait_seconds",
        &[("seller", "quick")],
    );
    // The wait board in Redis, which `limits show busy` reads: written
    // every 5 s.
    let store = crate::common::store().await;
    let board = format!("{}:{{waits}}", bench.prefix);
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    let on_board = loop {
        let fields = store.read_hash(&board).await.expect("read the board");
        let (fresh, _) = waits::fresh(&fields, now_ms());
        let busy = waits::of_seller(&fresh, "busy");
        if !busy.is_empty() || std::time::Instant::now() > deadline {
            break busy;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    w.stop().await;
    println!(
        "busy: oldest {oldest:.1} s, drain {drain:.0} s, held by rule 0: {held}; quick: {quick}"
    );
    assert!(oldest >= 1.5, "the oldest of 20 waiting jobs: {oldest} s");
    // 20 units at 5 a minute: 240 s.
    assert!((239.0..=241.0).contains(&drain), "drain {drain} s");
    assert_eq!(held, 1.0, "held by its rule");
    assert_eq!(quick, 0.0, "nothing waits for quick: no series");
    assert_eq!(
        on_board.len(),
        1,
        "one replica holds busy's jobs: {on_board:?}"
    );
    let (_, b) = &on_board[0];
    assert_eq!((b.jobs, b.held_by.as_str()), (20, "rule 0"), "{b:?}");
    assert!(b.oldest_ms >= 1_500 && b.drain_ms == Some(240_000), "{b:?}");
}
