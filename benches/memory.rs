//! Memory (issue 10, target 6), in one run against a private `redis-server`:
//!
//! 1. Bytes per seller in Redis for each algorithm: `MEMORY USAGE` of the
//!    seller's one hash (the rule's state, its fingerprint, the hash's
//!    expiry field) with the rule's state full (limit 100 per minute), and
//!    of the same hash once it holds a 429 block too.
//! 2. Worker RSS per 1,000 waiting jobs: one worker process (the release
//!    binary) on the mock broker, its resident set with nothing waiting
//!    (the baseline, measured in the same run), then after each step of
//!    jobs that the limiter refuses for longer than the run, so that they
//!    all wait in memory. "Waiting" is the worker's own
//!    `throttle_jobs_waiting` gauge, read from its `/metrics`.
//!
//! ```sh
//! cargo bench --bench memory             # up to 40,000 waiting jobs
//! cargo bench --bench memory -- --quick  # up to 10,000
//! cargo test --bench memory -- --redis-only  # part 1 only, no release build
//! cargo bench --bench memory -- --quick --bin target/baseline/REV/release/throttle-worker
//! ```
//!
//! `--bin PATH` runs part 2 with an earlier build's binary too (built by
//! `cargo bench --bench baseline -- REV`), before the head's, in the same
//! run: memory per waiting job before and after a change.

#[path = "../tests/common/mod.rs"]
mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use throttle_worker::config::{LimitsConfig, RuleConfig, Topology};
use throttle_worker::limiter::{Algorithm, KeySpace, Limiter, Mode, Policy, RedisStore};

use common::procs::{BrokerProc, Proc, Scratch, TaggedDownstream, WorkerConfig, BIN};
use common::redis_server::RedisServer;
use common::worker::{job, produce, topic_specs, Topics};
use common::{free_port, metric_in};

const SELLERS: usize = 1_000;
const PARTITIONS: i32 = 8;

async fn bytes_per_seller(redis: &RedisServer) {
    let store = RedisStore::connect(&redis.url(), Duration::from_secs(5))
        .await
        .expect("private Redis");
    println!("## Bytes per seller in Redis (MEMORY USAGE), state full, limit 100 per minute\n");
    println!("| algorithm | the seller's hash, bytes | with a 429 block, bytes |");
    println!("|---|---:|---:|");
    for algorithm in Algorithm::ALL {
        let lim = Limiter::new(
            store.clone(),
            KeySpace::new(format!("mem-{algorithm}")),
            Policy::from_config(&LimitsConfig {
                default: vec![RuleConfig {
                    algorithm: algorithm.name().to_owned(),
                    limit: 100,
                    period: Duration::from_secs(60),
                    burst: None,
                    shadow: false,
                }],
                ..Default::default()
            })
            .expect("rule"),
            Topology::Single,
        );
        while lim
            .acquire("m", 1, Mode::AllOrNothing)
            .await
            .expect("limiter call")
            .granted()
            > 0
        {}
        let usage = || {
            let store = store.clone();
            let key = lim.keys().seller_state("m");
            async move {
                store
                    .memory_usage(&key)
                    .await
                    .expect("MEMORY USAGE")
                    .unwrap_or(0)
            }
        };
        let hash = usage().await;
        lim.block("m", Duration::from_secs(60))
            .await
            .expect("block");
        let blocked = usage().await;
        println!("| {} | {hash} | {blocked} |", algorithm.name());
    }
    println!();
}

async fn waiting_gauge(http: &reqwest::Client, port: u16) -> Option<f64> {
    let text = http
        .get(format!("http://127.0.0.1:{port}/metrics"))
        .send()
        .await
        .ok()?
        .text()
        .await
        .ok()?;
    Some(metric_in(&text, "throttle_jobs_waiting", &[]))
}

/// Waits until the gauge reads `want` and the resident set has not moved
/// by more than 1 % for a second; returns that resident set.
async fn settle(worker: &Proc, http: &reqwest::Client, port: u16, want: usize) -> u64 {
    let started = Instant::now();
    let mut last = (0u64, Instant::now());
    loop {
        let waiting = waiting_gauge(http, port).await.unwrap_or(-1.0);
        let now = worker.rss();
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "{waiting} jobs waiting after 120 s, want {want}"
        );
        if waiting as usize == want {
            if now.abs_diff(last.0) * 100 > last.0 {
                last = (now, Instant::now());
            } else if last.1.elapsed() >= Duration::from_secs(1) {
                return now;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn rss_per_waiting_job(redis: &RedisServer, steps: &[usize], bin: &str) {
    let dir = Scratch::new("bench-memory");
    let id = format!("{:08x}", rand::random::<u32>());
    let topics = Topics {
        jobs: format!("jobs-bm-{id}"),
        retry: format!("retry-bm-{id}"),
        dlq: format!("dlq-bm-{id}"),
    };
    let broker = BrokerProc::start(dir.path(), &topic_specs(&topics, PARTITIONS));
    let down = TaggedDownstream::start(Duration::ZERO).await;
    let config = WorkerConfig {
        bootstrap: &broker.bootstrap,
        group: &format!("group-bm-{id}"),
        jobs_topic: &topics.jobs,
        retry_topic: &topics.retry,
        dlq_topic: &topics.dlq,
        key_prefix: &format!("bm-{id}"),
        // One job per seller per 10 minutes: each seller's first job is
        // called, every later one waits (in memory: max_inline_delay is
        // raised above the wait) for longer than the run.
        rules: r#"[{ algorithm = "gcra", limit = 1, period = "10m", burst = 1 }]"#,
        shutdown_timeout: "5s",
    }
    .write(dir.path(), "worker");
    let port = free_port();
    let top = *steps.last().expect("steps");
    let mut cmd = Command::new(bin);
    cmd.arg("run")
        .arg("--config")
        .arg(&config)
        .env("THROTTLE_LOG_FORMAT", "json")
        .env("RUST_LOG", "warn")
        .env("THROTTLE__REDIS__URL", redis.url())
        .env("THROTTLE__DOWNSTREAM__URL", down.url("w"))
        .env("THROTTLE__HTTP__LISTEN", format!("127.0.0.1:{port}"))
        .env("THROTTLE__WORKER__MAX_INLINE_DELAY", "15m")
        .env("THROTTLE__WORKER__MAX_HEAD_WAIT", "15m")
        .env("THROTTLE__WORKER__MAX_BUFFERED", (2 * top).to_string())
        .env(
            "THROTTLE__WORKER__MAX_FINISHED_AHEAD",
            (2 * top).to_string(),
        );
    let worker = Proc::spawn("worker", cmd, dir.path(), false);
    let http = reqwest::Client::new();

    // The baseline: the worker running, its group joined, nothing waiting
    // (one job per seller, all called).
    let first: Vec<_> = (0..SELLERS)
        .map(|s| job(&format!("first-{s}"), &format!("seller-{s}")))
        .collect();
    let size = first[0].1.len();
    produce(&broker.bootstrap, &topics.jobs, &first).await;
    down.wait_distinct(
        "every seller's first job",
        SELLERS,
        Duration::from_secs(120),
    )
    .await;
    let base = settle(&worker, &http, port, 0).await;
    println!("## Worker RSS per 1,000 waiting jobs ({bin})\n");
    println!(
        "One worker process (release), jobs of {size} bytes over {SELLERS} sellers, each refused for 10 minutes.\n"
    );
    println!("| waiting jobs | RSS MiB | over the baseline, MiB | KiB per 1,000 waiting |");
    println!("|---:|---:|---:|---:|");
    println!("| 0 (baseline) | {:.1} | 0 | - |", base as f64 / 1048576.0);
    let mut produced = 0;
    for &step in steps {
        let batch: Vec<_> = (produced..step)
            .map(|i| job(&format!("w{i}"), &format!("seller-{}", i % SELLERS)))
            .collect();
        produce(&broker.bootstrap, &topics.jobs, &batch).await;
        produced = step;
        let now = settle(&worker, &http, port, step).await;
        let over = now.saturating_sub(base);
        println!(
            "| {step} | {:.1} | {:.1} | {:.0} |",
            now as f64 / 1048576.0,
            over as f64 / 1048576.0,
            over as f64 / 1024.0 / (step as f64 / 1000.0)
        );
    }
    println!();
    worker.sigterm();
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let steps: &[usize] = if quick {
        &[2_500, 5_000, 10_000]
    } else {
        &[5_000, 10_000, 20_000, 40_000]
    };
    let redis = RedisServer::start();
    bytes_per_seller(&redis).await;
    if std::env::args().any(|a| a == "--redis-only") {
        return;
    }
    let args: Vec<String> = std::env::args().collect();
    if let Some(earlier) = args
        .iter()
        .position(|a| a == "--bin")
        .and_then(|i| args.get(i + 1))
    {
        rss_per_waiting_job(&redis, steps, earlier).await;
    }
    rss_per_waiting_job(&redis, steps, BIN).await;
}
