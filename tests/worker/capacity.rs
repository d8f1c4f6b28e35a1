//! Capacity-bound waiting costs no Redis call: with every downstream slot
//! taken, a seller waits its turn without asking the limiter, and asks
//! only for as many jobs as there are free slots. The calls are counted
//! where they land, on a Redis of the test's own.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use crate::common::redis_server::{limiter_calls, RedisServer};
use crate::common::rule;
use crate::common::worker::{always_ok, job, policy, Bench, Downstream, Running};

/// 3 sellers × 6 jobs, limits they never reach, 2 downstream slots and
/// 300 ms per call: the sellers are capacity-bound throughout (the
/// `throttle_jobs_waiting{cause="capacity"}` gauge shows it). Every limiter
/// call is made for a free slot and granted, so the calls are at most one
/// per job (plus one per seller for a call that raced a slot being taken);
/// a seller asking Redis while it waits would make many more (the run lasts
/// about 2.7 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn capacity_bound_sellers_wait_without_limiter_calls() {
    let bench = Bench::new("capacity", 2);
    let down = Downstream::start(always_ok()).await;
    down.set_delay(Duration::from_millis(300));
    let mut settings = bench.settings(&down.url);
    settings.downstream.concurrency = 2;
    // Every script call this worker makes (FCALL, or EVALSHA where
    // Functions are missing), counted by Redis itself.
    let redis = RedisServer::start();
    settings.redis.url = redis.url();
    let mut records = Vec::new();
    for i in 0..6 {
        for s in ["s1", "s2", "s3"] {
            records.push(job(&format!("{s}-{i}"), s));
        }
    }
    bench.produce(&records).await;
    let calls_before = limiter_calls(redis.port);
    let w = Running::start(settings, policy(vec![rule("gcra", 1000, "1s", Some(100))]));
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut most_waiting = 0.0f64;
    loop {
        most_waiting = most_waiting.max(crate::common::metric(
            "throttle_jobs_waiting",
            &[("cause", "capacity")],
        ));
        let done = down
            .arrivals()
            .iter()
            .map(|a| a.job_id.clone())
            .collect::<HashSet<_>>()
            .len();
        if done == 18 {
            break;
        }
        assert!(Instant::now() < deadline, "only {done} of 18 jobs in 30 s");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let calls = limiter_calls(redis.port) - calls_before;
    w.stop().await;
    println!(
        "capacity: 18 jobs through 2 slots in {} limiter calls; at most {most_waiting} jobs waiting for capacity",
        calls
    );
    assert!(
        most_waiting >= 1.0,
        "no job ever waited for capacity: the test did not exercise it"
    );
    assert!(
        calls <= 18 + 3,
        "{calls} limiter calls for 18 jobs through 2 slots: capacity-bound sellers asked Redis while waiting"
    );
}
