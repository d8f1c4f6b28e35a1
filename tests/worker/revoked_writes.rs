//! Work of a revoked partition must not write to Kafka: once a job's
//! partition has moved on, the old owner's late answers are dropped, not
//! dead-lettered or sent round the retry topic, because the new owner
//! processes the record again.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::rule;
use crate::common::worker::{job, policy, Bench, Downstream, Running};
use axum::http::StatusCode;

/// Issue 6, defect 8: a worker whose calls are in flight when its
/// partitions are revoked must not dead-letter those jobs; the new owner
/// does, so each job is dead-lettered exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn revoked_work_is_not_dead_lettered_by_the_old_owner() {
    let bench = Bench::new("revoked-writes", 4);
    // Every call is refused for good (400), slowly: the answers of the
    // first owner come back after its partitions were revoked.
    let down = Downstream::start(Arc::new(|_, _| (StatusCode::BAD_REQUEST, None))).await;
    down.set_delay(Duration::from_millis(2000));
    let mut settings = bench.settings(&down.url);
    // Eager: the join revokes every partition at the first heartbeat,
    // before any answer is back, so every answer of the first owner comes
    // back late. (Under the default cooperative protocol a moved partition
    // is revoked only when the join's first round ends, about when the
    // answers come back: a race this test does not mean to time.)
    settings.kafka.consumer_properties.insert(
        "partition.assignment.strategy".to_owned(),
        "range".to_owned(),
    );
    let rules = || policy(vec![rule("fixed_window", 100_000, "1s", None)]);
    let n = 20;
    let records: Vec<_> = (0..n)
        .map(|i| job(&format!("v-{i}"), &format!("seller-{i}")))
        .collect();
    bench.produce(&records).await;

    let a = Running::start(settings.clone(), rules());
    down.wait_for("the first owner's calls", Duration::from_secs(30), |a| {
        a.len() >= n
    })
    .await;
    // Joining triggers a rebalance while every call of the first owner is
    // still in flight: every partition is revoked from the first while its
    // calls are out, and its jobs are called again by their new owner.
    let b = Running::start(settings.clone(), rules());
    down.wait_for(
        "a job of a moved partition called again by its new owner",
        Duration::from_secs(60),
        |a| {
            let mut calls: HashMap<&str, usize> = HashMap::new();
            for x in a {
                *calls.entry(x.job_id.as_str()).or_default() += 1;
            }
            calls.values().any(|c| *c >= 2)
        },
    )
    .await;
    // The old owner's late answers come back before the new owner's (the
    // calls take equally long): once every job is in the dead-letter topic,
    // any duplicate would be there too.
    let deadline = Instant::now() + Duration::from_secs(60);
    while dead_lettered(&bench, 0).len() < n {
        assert!(
            Instant::now() < deadline,
            "not every job was dead-lettered within 60 s: {:?}",
            dead_lettered(&bench, 0)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    a.stop().await;
    b.stop().await;
    let started = Instant::now();
    let per_job = dead_lettered(&bench, n);
    assert_eq!(per_job.len(), n, "every job is dead-lettered: {per_job:?}");
    let twice: Vec<_> = per_job.iter().filter(|(_, c)| **c > 1).collect();
    assert!(
        twice.is_empty(),
        "jobs dead-lettered more than once (the revoked owner wrote them too): {twice:?}; read the DLQ in {:?}",
        started.elapsed()
    );
}

/// How often each job id is on the dead-letter topic (read to its end,
/// once it holds at least `expect` records).
fn dead_lettered(bench: &Bench, expect: usize) -> HashMap<String, usize> {
    let mut per_job: HashMap<String, usize> = HashMap::new();
    let records = tokio::task::block_in_place(|| bench.dead_letters(expect, Duration::ZERO));
    for (value, _) in records {
        let v: serde_json::Value = serde_json::from_slice(&value).expect("dead letter is the job");
        *per_job
            .entry(v["job_id"].as_str().unwrap_or_default().to_owned())
            .or_default() += 1;
    }
    per_job
}
