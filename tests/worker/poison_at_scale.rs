//! Poison at scale (issue 6): 1 % malformed records among many good ones.
//! Every malformed record goes to the dead-letter topic with its reason,
//! every good job is done, and good jobs flow about as fast as in a clean
//! run (the ratio is printed; `POISON_JOBS=100000` for the size).

use std::collections::HashSet;
use std::time::Duration;

use crate::common::rule;
use crate::common::worker::{always_ok, job, policy, Bench, Downstream, Running};

struct Run {
    good_per_s: f64,
    poison_dead_lettered: usize,
}

async fn run(name: &str, jobs: usize, poison_every: Option<usize>) -> Run {
    let bench = Bench::new(name, 4);
    let down = Downstream::start(always_ok()).await;
    let mut records = Vec::with_capacity(jobs);
    let mut good = 0;
    let mut poison = 0;
    for i in 0..jobs {
        if poison_every.is_some_and(|k| i % k == k - 1) {
            records.push((None, format!("not json {i}").into_bytes()));
            poison += 1;
        } else {
            records.push(job(&format!("{name}-{i}"), &format!("seller-{}", i % 1000)));
            good += 1;
        }
    }
    for chunk in records.chunks(5_000) {
        bench.produce(chunk).await;
    }
    let mut settings = bench.settings(&down.url);
    settings.downstream.concurrency = 64;
    // Rules that never refuse: the run measures the pipeline, not a limit.
    let w = Running::start(settings, policy(vec![rule("gcra", 1_000_000, "1s", None)]));
    down.wait_for("every good job", Duration::from_secs(300), |a| {
        a.len() >= good
    })
    .await;
    tokio::task::block_in_place(|| bench.wait_dead_letters(poison, Duration::from_secs(60)));
    w.stop().await;
    let dlq = tokio::task::block_in_place(|| bench.dead_letters(poison, Duration::ZERO));
    let arrivals = down.arrivals();
    let ids: HashSet<&str> = arrivals.iter().map(|a| a.job_id.as_str()).collect();
    assert_eq!(ids.len(), good, "{name}: every good job done");
    assert_eq!(
        dlq.len(),
        poison,
        "{name}: every malformed record dead-lettered once"
    );
    for (value, headers) in &dlq {
        let reason = headers.get("x-error").map(String::as_str).unwrap_or("");
        assert!(
            value.starts_with(b"not json") && !reason.is_empty(),
            "{name}: a dead letter without its reason: {reason:?}"
        );
    }
    let first = arrivals.iter().map(|a| a.at).min().unwrap();
    let last = arrivals.iter().map(|a| a.at).max().unwrap();
    Run {
        good_per_s: good as f64 / (last - first).as_secs_f64().max(1e-3),
        poison_dead_lettered: dlq.len(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_percent_poison_is_dead_lettered_and_good_jobs_keep_their_pace() {
    let jobs: usize = std::env::var("POISON_JOBS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000);
    let clean = run("clean", jobs, None).await;
    let poisoned = run("poison", jobs, Some(100)).await;
    println!(
        "{jobs} records: clean {:.0} good jobs/s; with 1 % poison {:.0} good jobs/s \
         ({} dead-lettered); ratio {:.2}",
        clean.good_per_s,
        poisoned.good_per_s,
        poisoned.poison_dead_lettered,
        poisoned.good_per_s / clean.good_per_s
    );
}
