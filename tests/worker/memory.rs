//! Memory of one worker process under a backlog of 1 MB jobs that it can
//! work off only slowly (issue 6, defect 7 and "Memory"): its resident set
//! stays under `worker.max_buffered_bytes` plus a stated overhead, and is
//! flat over the run (once the bound is full, its peak does not rise from
//! the middle third of the run to the last).
//!
//! The stated overhead: librdkafka's own buffers (its pre-fetch queue,
//! `queued.max.messages.kbytes`, is 64 MiB by default, and one fetch
//! response up to `fetch.max.bytes`, 50 MiB) plus the process' base
//! (about 30 MiB: code, runtime, HTTP client). CI runs 320 jobs (320 MB,
//! five times the bound) for 20 s; the issue's 10-minute run, with a
//! backlog bounded by the mock broker (it keeps 5 MiB a partition, so a
//! backlog of 1 MB jobs needs a partition per 4 jobs), not 100,000 jobs:
//!
//! ```sh
//! MEMORY_JOBS=400 MEMORY_RUN_S=600 cargo test --release --test worker worker::memory:: -- --nocapture
//! ```

use std::process::Command;
use std::time::{Duration, Instant, SystemTime};

use crate::common::procs::{
    wait_settled, BrokerProc, Proc, Scratch, TaggedDownstream, WorkerConfig, BIN,
};
use crate::common::worker::{topic_specs, Topics};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::ClientConfig;

const MIB: u64 = 1024 * 1024;

/// Jobs per partition: 4 MB, under the mock broker's 5 MiB a partition.
const PER_PARTITION: usize = 4;

fn env(k: &str, d: u64) -> u64 {
    std::env::var(k)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(d)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rss_stays_under_the_byte_bound_and_flat_with_a_backlog_of_1_mb_jobs() {
    let jobs = env("MEMORY_JOBS", 320) as usize;
    let run = Duration::from_secs(env("MEMORY_RUN_S", 20));
    let bound = 64 * MIB;
    // librdkafka's pre-fetch queue and one fetch response, plus the base.
    let overhead = 64 * MIB + 50 * MIB + 30 * MIB;

    let dir = Scratch::new("memory");
    let id = format!("{:08x}", rand::random::<u32>());
    let topics = Topics {
        jobs: format!("jobs-mem-{id}"),
        retry: format!("retry-mem-{id}"),
        dlq: format!("dlq-mem-{id}"),
    };
    // The mock broker keeps at most 5 MiB per partition (older records are
    // deleted), so the backlog is spread at 4 jobs per partition.
    let partitions = jobs.div_ceil(PER_PARTITION) as i32;
    // 10 sellers at one job per `period`, paced so that about a third of
    // the backlog is done by the end of the run: jobs flow all through it
    // (a leak per job has jobs to leak on; CI: about 6 a second) and the
    // backlog outlasts it. At most 20 s, under `worker.max_inline_delay`
    // (30 s): a longer wait parks a job on the retry topic, and a 1 MB job
    // plus its retry headers is over the broker's message size, so that
    // write fails and is retried for ever (a known defect, not what this
    // test measures; MEMORY_PERIOD_MS=45000 shows it).
    let period_ms = env(
        "MEMORY_PERIOD_MS",
        (30 * run.as_millis() as u64 / jobs as u64).clamp(1, 20_000),
    );
    let rules =
        format!(r#"[{{ algorithm = "gcra", limit = 1, period = "{period_ms}ms", burst = 1 }}]"#);
    let broker = BrokerProc::start(dir.path(), &topic_specs(&topics, partitions));
    let down = TaggedDownstream::start(Duration::ZERO).await;
    let config = WorkerConfig {
        bootstrap: &broker.bootstrap,
        group: &format!("group-mem-{id}"),
        jobs_topic: &topics.jobs,
        retry_topic: &topics.retry,
        dlq_topic: &topics.dlq,
        key_prefix: &format!("mem-{id}"),
        rules: &rules,
        shutdown_timeout: "5s",
    }
    .write(dir.path(), "worker");
    let mut cmd = Command::new(BIN);
    cmd.arg("run")
        .arg("--config")
        .arg(&config)
        .env("THROTTLE_LOG_FORMAT", "json")
        .env("RUST_LOG", "info")
        .env("THROTTLE__DOWNSTREAM__URL", down.url("w"))
        .env("THROTTLE__WORKER__MAX_BUFFERED_BYTES", bound.to_string())
        .env("THROTTLE__WORKER__MAX_PAYLOAD_BYTES", (2 * MIB).to_string());
    let worker = Proc::spawn("worker", cmd, dir.path(), false);
    // The baseline: the worker started, connected and holding every
    // partition of the (still empty) jobs topic.
    let base = {
        wait_settled(
            &[&worker],
            &topics.jobs,
            partitions,
            Duration::from_secs(60),
        )
        .await;
        worker.rss()
    };

    // Jobs of just under 1 MB, the largest record Kafka's defaults accept
    // (`message.max.bytes` 1,000,000), each partition's in turn.
    let filler = "x".repeat(1_000_000 - 200);
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", &broker.bootstrap)
        .create()
        .expect("producer");
    for i in 0..jobs {
        let value = serde_json::json!({
            "job_id": format!("m{i}"),
            "seller_id": format!("seller-{}", i % 10),
            "payload": { "sku": format!("m{i}"), "image": filler },
        })
        .to_string();
        let key = format!("product-{i}");
        producer
            .send(
                FutureRecord::to(&topics.jobs)
                    .partition((i / PER_PARTITION) as i32)
                    .key(&key)
                    .payload(&value),
                Duration::from_secs(10),
            )
            .await
            .expect("produce");
    }

    let started = Instant::now();
    let mut samples: Vec<(SystemTime, u64)> = Vec::new();
    let mut next_report = Duration::from_secs(60);
    while started.elapsed() < run {
        tokio::time::sleep(Duration::from_millis(250)).await;
        samples.push((SystemTime::now(), worker.rss()));
        if started.elapsed() >= next_report {
            eprintln!(
                "memory: {:?} in, RSS {} MiB, {} jobs done",
                started.elapsed(),
                samples.last().unwrap().1 / MIB,
                down.distinct()
            );
            next_report += Duration::from_secs(60);
        }
    }
    let done = down.distinct();
    // Warm-up lasts until fetching fills the byte bound: the worker's first
    // "backpressure" pause (how long that takes depends on the machine's
    // load, so it is read from the worker, not assumed).
    let full_at = worker
        .log_events()
        .into_iter()
        .filter(|e| {
            e.message == "backpressure"
                && e.fields.get("paused").and_then(|v| v.as_bool()) == Some(true)
        })
        .map(|e| e.at)
        .min();
    drop(worker);
    let full_at = full_at
        .expect("fetching never paused at max_buffered_bytes: the backlog did not fill the bound");

    let peak = samples.iter().map(|s| s.1).max().unwrap();
    let full: Vec<u64> = samples
        .iter()
        .filter(|s| s.0 >= full_at)
        .map(|s| s.1)
        .collect();
    assert!(
        full.len() >= 12,
        "only {} samples after the bound filled: the run is too short to judge",
        full.len()
    );
    // Compared: the peak of the last third of that time against the peak
    // of the middle third. RSS is the allocator's high-water mark: it steps
    // up when live memory reaches a new high and seldom comes down. With
    // jobs flowing all through the run it reaches its plateau within the
    // first seconds (seen: 94 then 105 MiB, flat to the end). When sellers
    // got one job each at the start and the next 20 s later, the second
    // wave set a new mark in the last third of a flat run: 90 to 109 MiB
    // under load, the flake this pacing removed. A leak keeps stepping up.
    let third = full.len() / 3;
    let peak_of = |xs: &[u64]| xs.iter().max().copied().unwrap();
    let (first, second) = (
        peak_of(&full[third..2 * third]),
        peak_of(&full[2 * third..]),
    );
    eprintln!(
        "memory: {jobs} jobs of 1 MB, max_buffered_bytes {} MiB; RSS before the backlog {} MiB, peak {} MiB \
         (bound + overhead {} MiB); bound filled after {:?}; peak of the middle third after that {} MiB, of the last third {} MiB; {done} jobs done in {run:?}",
        bound / MIB,
        base / MIB,
        peak / MIB,
        (bound + overhead) / MIB,
        full_at.duration_since(samples[0].0).unwrap_or_default(),
        first / MIB,
        second / MIB,
    );
    assert!(
        done > 0 && done < jobs,
        "the backlog must last the run: {done} of {jobs} done"
    );
    assert!(
        peak <= bound + overhead,
        "RSS peaked at {} MiB, over max_buffered_bytes + overhead = {} MiB",
        peak / MIB,
        (bound + overhead) / MIB
    );
    // Flat once the bound is full: the last third peaks no more than
    // 16 MiB over the middle one (allocator noise). A leak of 1 MB per job
    // done shows as about 40 MB between the thirds of the 20 s CI run (6
    // jobs a second), and the peak bound above catches anything that holds
    // fetched jobs past the bound.
    assert!(
        second <= first + 16 * MIB,
        "RSS grew from {} MiB to {} MiB over the run; samples after the bound filled (MiB, every 250 ms): {:?}",
        first / MIB,
        second / MIB,
        full.iter().map(|b| b / MIB).collect::<Vec<_>>()
    );
}
