//! While a seller is known to be blocked, its waiting jobs cause no Redis
//! calls: a backlog of hundreds costs a handful of limiter calls per window,
//! not one per job. The calls are counted where they land, on a Redis of
//! the test's own.

use std::collections::HashSet;
use std::time::Duration;

use crate::common::redis_server::{limiter_calls, RedisServer};
use crate::common::rule;
use crate::common::worker::{always_ok, job, policy, Bench, Downstream, Running};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_blocked_backlog_costs_o1_limiter_calls_per_window() {
    let bench = Bench::new("cheap", 2);
    let down = Downstream::start(always_ok()).await;
    let mut settings = bench.settings(&down.url);
    // Keep the backlog in memory: this is about the in-memory wait.
    settings.worker.max_inline_delay = Duration::from_secs(60);
    // Every script call this worker makes, counted by Redis itself.
    let redis = RedisServer::start();
    settings.redis.url = redis.url();
    let records: Vec<_> = (0..300).map(|i| job(&format!("b-{i}"), "busy")).collect();
    bench.produce(&records).await;
    let w = Running::start(settings, policy(vec![rule("fixed_window", 5, "1s", None)]));
    // 15 jobs need three windows; the other 285 wait all along.
    down.wait_for("15 jobs", Duration::from_secs(20), |a| {
        a.iter()
            .map(|x| x.job_id.as_str())
            .collect::<HashSet<_>>()
            .len()
            >= 15
    })
    .await;
    let calls = limiter_calls(redis.port);
    let denied =
        crate::common::metric("throttle_limiter_decisions_total", &[("result", "denied")]) as u64;
    w.stop().await;
    println!("cheap while blocked: {calls} limiter calls ({denied} refusals) for 15+ grants with 300 jobs waiting");
    // Per 1 s window: up to 5 grants asked for one partition head at a time
    // (2 partitions: 3 calls), one refusal, and the first window may be
    // partial. A call per waiting job would be 300 per window.
    assert!(
        calls <= 40,
        "{calls} limiter calls for a blocked backlog of 300: not O(1) per window"
    );
}
