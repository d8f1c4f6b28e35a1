//! Work of a revoked partition must not write to Kafka: once a job's
//! partition has moved on, the old owner's late answers are dropped, not
//! dead-lettered or sent round the retry topic, because the new owner
//! processes the record again.

mod common;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::http::StatusCode;
use common::rule;
use common::worker::{job, policy, Bench, Downstream, Running};

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
    let settings = bench.settings(&down.url);
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
    // still in flight.
    let b = Running::start(settings.clone(), rules());
    down.wait_for(
        "every job called again by its new owner",
        Duration::from_secs(60),
        |a| {
            let mut calls: HashMap<&str, usize> = HashMap::new();
            for x in a {
                *calls.entry(x.job_id.as_str()).or_default() += 1;
            }
            calls.len() >= n && calls.values().all(|c| *c >= 2)
        },
    )
    .await;
    // The old owners' late answers come back before the new owners' (the
    // calls take equally long): once every job is in the dead-letter topic,
    // any duplicate would be there too.
    tokio::task::block_in_place(|| bench.wait_dead_letters(n, Duration::from_secs(60)));
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
    for (value, _) in bench.dead_letters(expect, Duration::ZERO) {
        let v: serde_json::Value = serde_json::from_slice(&value).expect("dead letter is the job");
        *per_job
            .entry(v["job_id"].as_str().unwrap_or_default().to_owned())
            .or_default() += 1;
    }
    per_job
}
