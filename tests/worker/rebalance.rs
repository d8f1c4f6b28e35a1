//! Rebalances must not leave partitions paused for good. librdkafka clears
//! only its own pause flag on assign and unassign; a pause the worker made
//! (backpressure at `worker.max_buffered`, or a parked retry record)
//! survives a revoke and a re-assignment unless the worker undoes it. It
//! reads the process-wide metrics: nextest runs each test in a process of
//! its own.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use crate::common::rule;
use crate::common::worker::{always_ok, job, policy, Bench, Downstream, Running};
use throttle_worker::telemetry::metrics::metrics;

/// Waits until `pred` holds, or panics naming `what`.
async fn wait_until(what: &str, timeout: Duration, pred: impl Fn() -> bool) {
    let deadline = Instant::now() + timeout;
    while !pred() {
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn assignments() -> u64 {
    metrics().rebalances.get()
}

/// Issue 6, defect 1: a worker paused by backpressure, a second worker that
/// joins and leaves, then a fast downstream: every record must finish.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn backpressure_pause_does_not_survive_a_rebalance() {
    let bench = Bench::new("rebalance-pause", 4);
    let down = Downstream::start(always_ok()).await;
    // Slow calls, all of them in flight at once: the worker pauses at
    // max_buffered with every job out, and the calls end while the group
    // rebalances (when the worker holds no partition to resume).
    down.set_delay(Duration::from_millis(1500));
    let mut settings = bench.settings(&down.url);
    settings.worker.max_buffered = 40;
    settings.downstream.concurrency = 64;
    let rules = || policy(vec![rule("fixed_window", 100_000, "1s", None)]);
    let records: Vec<_> = (0..400)
        .map(|i| job(&format!("r-{i}"), &format!("seller-{}", i % 100)))
        .collect();
    bench.produce(&records).await;

    let a = Running::start(settings.clone(), rules());
    wait_until(
        "the first worker to pause at max_buffered",
        Duration::from_secs(30),
        || metrics().backpressure_pauses.get() >= 1,
    )
    .await;

    let before = assignments();
    let b = Running::start(settings.clone(), rules());
    wait_until(
        "both workers to be assigned partitions",
        Duration::from_secs(30),
        || assignments() >= before + 2,
    )
    .await;
    let before = assignments();
    b.stop().await;
    wait_until(
        "the first worker to take every partition back",
        Duration::from_secs(30),
        || assignments() > before,
    )
    .await;

    down.set_delay(Duration::ZERO);
    let want: HashSet<String> = (0..400).map(|i| format!("r-{i}")).collect();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let got: HashSet<String> = down.arrivals().into_iter().map(|a| a.job_id).collect();
        let missing: Vec<&String> = want.difference(&got).collect();
        if missing.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{} of 400 records never reached the downstream after the rebalances (partitions left paused?); e.g. {:?}",
            missing.len(),
            missing.iter().take(5).collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    a.stop().await;
}
