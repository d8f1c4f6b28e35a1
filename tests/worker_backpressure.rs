//! At `worker.max_buffered` jobs in memory the worker stops fetching: a
//! throttled backlog stays in Kafka, not in the worker's memory. A test
//! binary of its own, because it reads the process-wide metrics.

mod common;

use std::time::Duration;

use common::rule;
use common::worker::{always_ok, job, policy, Bench, Downstream, Running};
use throttle_worker::telemetry::metrics::metrics;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fetching_pauses_at_max_buffered() {
    let bench = Bench::new("backpressure", 2);
    let down = Downstream::start(always_ok()).await;
    let mut settings = bench.settings(&down.url);
    settings.worker.max_buffered = 40;
    settings.worker.max_inline_delay = Duration::from_secs(60);
    let records: Vec<_> = (0..400).map(|i| job(&format!("q-{i}"), "queued")).collect();
    bench.produce(&records).await;
    let w = Running::start(settings, policy(vec![rule("fixed_window", 5, "1s", None)]));
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let received = metrics().jobs_received.get();
    let pauses = metrics().backpressure_pauses.get();
    let done = down.count() as u64;
    w.stop().await;
    println!("backpressure: {received} records taken, {done} done, {pauses} pauses, max_buffered 40, 400 available");
    assert!(pauses >= 1, "fetching never paused");
    // In memory at most max_buffered (40) beyond what was done; the margin
    // is what one fetch delivers before the pause lands.
    assert!(
        received <= 40 + done + 40,
        "took {received} of 400 records with only {done} done and max_buffered 40"
    );
}
