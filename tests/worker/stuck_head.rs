//! A partition commits only up to its first unfinished record. A record
//! that waits long in memory while the ones behind it finish is sent round
//! the retry topic, so the partition commits past it (issue 6, defect 7:
//! the finished-offsets set and the commit metadata stay bounded, and a
//! crash does not redo the finished work behind it).

use std::time::{Duration, Instant};

use crate::common::procs::committed_offsets;
use crate::common::rule;
use crate::common::worker::{always_ok, job, Bench, Downstream, Running};
use throttle_worker::config::{LimitsConfig, SellerConfig};
use throttle_worker::limiter::Policy;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_head_waiting_longer_than_max_head_wait_does_not_hold_the_commit() {
    let bench = Bench::new("stuck-head", 1);
    let down = Downstream::start(always_ok()).await;
    let mut settings = bench.settings(&down.url);
    settings.worker.max_head_wait = Duration::from_millis(500);
    settings.worker.max_inline_delay = Duration::from_secs(30);
    // "slow" may make one call per 10 s: its second job waits in memory
    // at the head of the partition while 20 jobs of others finish behind it.
    let mut records = vec![job("slow-1", "slow"), job("slow-2", "slow")];
    records.extend((0..20).map(|i| job(&format!("fast-{i}"), &format!("fast-{i}"))));
    let offsets = bench.produce(&records).await;
    let end = offsets.iter().map(|(_, o)| o + 1).max().unwrap();
    let cfg = LimitsConfig {
        default: vec![rule("gcra", 1000, "1s", None)],
        sellers: [(
            "slow".to_owned(),
            SellerConfig {
                rules: Some(vec![rule("gcra", 1, "10s", None)]),
                ..Default::default()
            },
        )]
        .into(),
        ..Default::default()
    };
    let started = Instant::now();
    let w = Running::start(settings, Policy::from_config(&cfg).unwrap());
    down.wait_for("the 20 fast jobs", Duration::from_secs(20), |a| {
        a.iter().filter(|x| x.seller.starts_with("fast")).count() >= 20
    })
    .await;
    let deadline = Instant::now() + Duration::from_secs(6);
    let committed = loop {
        let c = committed_offsets(
            &bench.bootstrap(),
            &bench.group,
            &bench.topics.jobs,
            1,
            Duration::from_secs(5),
        )
        .await;
        let at = c.get(&0).copied().flatten();
        if at == Some(end) || Instant::now() > deadline {
            break at;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let slow2_called = down.arrivals().iter().any(|a| a.job_id == "slow-2");
    println!(
        "jobs partition committed to {committed:?} of {end} after {:?}; slow-2 called yet: {slow2_called}",
        started.elapsed()
    );
    assert_eq!(
        committed,
        Some(end),
        "the partition did not commit past the waiting head within 6 s"
    );
    assert!(
        !slow2_called,
        "slow-2 was called before the commit: the test did not hold a head"
    );
    // It was moved, not lost: it arrives once, when its seller's window allows.
    down.wait_for("slow-2", Duration::from_secs(30), |a| {
        a.iter().any(|x| x.job_id == "slow-2")
    })
    .await;
    w.stop().await;
    let calls = down
        .arrivals()
        .iter()
        .filter(|a| a.job_id == "slow-2")
        .count();
    assert_eq!(calls, 1, "slow-2 called {calls} times");
}
