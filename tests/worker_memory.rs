//! Memory of one worker process under a backlog of 1 MB jobs that it can
//! work off only slowly (issue 6, defect 7 and "Memory"): its resident set
//! stays under `worker.max_buffered_bytes` plus a stated overhead, and is
//! flat over the run (no growth from the first half to the second).
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
//! MEMORY_JOBS=400 MEMORY_RUN_S=600 cargo test --release --test worker_memory -- --nocapture
//! ```

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::procs::{BrokerProc, Proc, Scratch, TaggedDownstream, WorkerConfig, BIN};
use common::worker::{topic_specs, Topics};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::ClientConfig;

const MIB: u64 = 1024 * 1024;

/// Jobs per partition: 4 MB, under the mock broker's 5 MiB a partition.
const PER_PARTITION: usize = 4;

/// Resident set of `pid` in bytes, from /proc.
fn rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("/proc status");
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .expect("VmRSS");
    kib * 1024
}

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
    let broker = BrokerProc::start(dir.path(), &topic_specs(&topics, partitions));
    let down = TaggedDownstream::start(Duration::ZERO).await;
    let config = WorkerConfig {
        bootstrap: &broker.bootstrap,
        group: &format!("group-mem-{id}"),
        jobs_topic: &topics.jobs,
        retry_topic: &topics.retry,
        dlq_topic: &topics.dlq,
        key_prefix: &format!("mem-{id}"),
        // 10 sellers at 1 job per 20 s: half a job a second, so the backlog
        // outlasts even the 10-minute run.
        rules: r#"[{ algorithm = "gcra", limit = 1, period = "20s", burst = 1 }]"#,
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
    let base = {
        tokio::time::sleep(Duration::from_secs(2)).await;
        rss(worker.pid())
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
    let mut samples: Vec<(Duration, u64)> = Vec::new();
    let mut next_report = Duration::from_secs(60);
    while started.elapsed() < run {
        tokio::time::sleep(Duration::from_millis(250)).await;
        samples.push((started.elapsed(), rss(worker.pid())));
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
    drop(worker);

    let peak = samples.iter().map(|s| s.1).max().unwrap();
    let half = samples.len() / 2;
    // The first quarter is warm-up: fetching fills the bound.
    let first = samples[samples.len() / 4..half]
        .iter()
        .map(|s| s.1)
        .max()
        .unwrap();
    let second = samples[half..].iter().map(|s| s.1).max().unwrap();
    eprintln!(
        "memory: {jobs} jobs of 1 MB, max_buffered_bytes {} MiB; RSS before the backlog {} MiB, peak {} MiB \
         (bound + overhead {} MiB); peak of the second quarter {} MiB, of the second half {} MiB; {done} jobs done in {run:?}",
        bound / MIB,
        base / MIB,
        peak / MIB,
        (bound + overhead) / MIB,
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
    // Flat: the second half grows no more than 16 MiB over the second
    // quarter (allocator noise; a leak of even one job per second of
    // 1 MB would show as 10 MB per ten seconds).
    assert!(
        second <= first + 16 * MIB,
        "RSS grew from {} MiB to {} MiB over the run",
        first / MIB,
        second / MIB
    );
}
