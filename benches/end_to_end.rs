//! The limiter's cost end to end (issue 10, target 4): one worker replica
//! in this process, the mock Kafka broker, a private `redis-server` and a
//! fast local downstream. The same jobs (JOBS over SELLERS sellers,
//! produced before the worker starts) run three times, each on fresh topics:
//!
//! - every seller unlimited (the baseline: no rule to ask);
//! - a rule that never refuses, with coalescing (the default settings);
//! - the same rule with `redis.max_coalesced = 1` (one call per ask).
//!
//! Jobs/s is taken between the first and the last downstream arrival, so
//! the group's start is not counted. Redis calls per job are the server's
//! own FCALL count.
//!
//! Then the pipeline's ceiling: a bare rdkafka consumer of the same jobs
//! that only reads and commits (jobs/s between its first and last record),
//! against the worker with every seller unlimited. And jobs/s against the
//! number of replicas (in this process, so they share its two tokio
//! threads and the machine's cores with the broker, Redis and the
//! downstream): each replica joins first, the group settles, then the jobs
//! are produced.
//!
//!     cargo bench --bench end_to_end             # 20,000 jobs per run
//!     cargo bench --bench end_to_end -- --quick  # 10,000
//!     cargo bench --bench end_to_end -- --shapes   # general function vs generated shapes

#[path = "../tests/common/mod.rs"]
mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::ClientConfig;

use throttle_worker::config::{LimitsConfig, RuleConfig, SellerConfig};
use throttle_worker::limiter::Policy;

use common::redis_server::{limiter_calls, limiter_usec, RedisServer};
use common::worker::{always_ok, job, wait_all_calling, Bench, Downstream, Running, PROBE_SELLER};

const SELLERS: usize = 1_000;
const PARTITIONS: i32 = 8;

fn never_refusing() -> RuleConfig {
    RuleConfig {
        algorithm: "gcra".to_owned(),
        limit: 1_000_000,
        period: Duration::from_secs(1),
        burst: None,
        shadow: false,
    }
}

fn policy(unlimited: bool) -> Policy {
    let sellers = if unlimited {
        (0..SELLERS)
            .map(|i| {
                (
                    format!("seller-{i}"),
                    SellerConfig {
                        unlimited: true,
                        ..SellerConfig::default()
                    },
                )
            })
            .collect()
    } else {
        Default::default()
    };
    Policy::from_config(&LimitsConfig {
        default: vec![never_refusing()],
        sellers,
        ..Default::default()
    })
    .expect("bench policy")
}

/// The runs' jobs: `jobs` jobs over [`SELLERS`] sellers in turn.
fn records(jobs: usize) -> Vec<(Option<String>, Vec<u8>)> {
    (0..jobs)
        .map(|i| job(&format!("j{i}"), &format!("seller-{}", i % SELLERS)))
        .collect()
}

struct Outcome {
    jobs_per_s: f64,
    calls_per_job: f64,
    /// Redis' own µs in the limiter's scripts per job.
    redis_us_per_job: f64,
}

async fn one_run(
    redis: &RedisServer,
    jobs: usize,
    unlimited: bool,
    max_coalesced: usize,
    downstream_concurrency: Option<usize>,
) -> Outcome {
    let bench = Bench::new("e2e", PARTITIONS);
    let downstream = Downstream::start(always_ok()).await;
    let records = records(jobs);
    bench.produce(&records).await;
    let mut settings = bench.settings(&downstream.url);
    settings.redis.url = redis.url();
    settings.redis.max_coalesced = max_coalesced;
    if let Some(n) = downstream_concurrency {
        settings.downstream.concurrency = n;
    }
    Command::new("redis-cli")
        .args(["-p", &redis.port.to_string(), "CONFIG", "RESETSTAT"])
        .output()
        .expect("redis-cli");
    let worker = Running::start(settings, policy(unlimited));
    let started = Instant::now();
    let mut shown = 0;
    while downstream.count() < jobs {
        assert!(
            started.elapsed() < Duration::from_secs(300),
            "only {} of {jobs} jobs reached the downstream in 300 s",
            downstream.count()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
        let n = downstream.count();
        if n >= shown + jobs / 4 {
            eprintln!("  {n}/{jobs} jobs at the downstream");
            shown = n;
        }
    }
    let arrivals = downstream.arrivals();
    let first = arrivals.iter().map(|a| a.at).min().expect("arrivals");
    let last = arrivals.iter().map(|a| a.at).max().expect("arrivals");
    let calls = limiter_calls(redis.port);
    let usec = limiter_usec(redis.port);
    worker.stop().await;
    Outcome {
        jobs_per_s: jobs as f64 / (last - first).as_secs_f64().max(1e-6),
        calls_per_job: calls as f64 / jobs as f64,
        redis_us_per_job: usec as f64 / jobs as f64,
    }
}

/// `--shapes`: limiter on against off, the limiter's calls through the
/// general function (`THROTTLE_LIMITER_SHAPES=off`) and through the
/// generated shapes by turns (issue 37), with Redis' own µs per job.
async fn shapes(redis: &RedisServer, jobs: usize) {
    println!("| round | unlimited jobs/s | general jobs/s | ratio | Redis µs/job | shapes jobs/s | ratio | Redis µs/job |");
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|");
    for round in 1..=3 {
        std::env::remove_var("THROTTLE_LIMITER_SHAPES");
        let base = one_run(redis, jobs, true, 128, None).await;
        std::env::set_var("THROTTLE_LIMITER_SHAPES", "off");
        let general = one_run(redis, jobs, false, 128, None).await;
        std::env::remove_var("THROTTLE_LIMITER_SHAPES");
        let shaped = one_run(redis, jobs, false, 128, None).await;
        println!(
            "| {round} | {:.0} | {:.0} | {:.2} | {:.2} | {:.0} | {:.2} | {:.2} |",
            base.jobs_per_s,
            general.jobs_per_s,
            general.jobs_per_s / base.jobs_per_s,
            general.redis_us_per_job,
            shaped.jobs_per_s,
            shaped.jobs_per_s / base.jobs_per_s,
            shaped.redis_us_per_job,
        );
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let jobs = if quick { 10_000 } else { 20_000 };
    let redis = RedisServer::start();
    if std::env::args().any(|a| a == "--shapes") {
        println!("# end_to_end --shapes: one replica, mock broker ({PARTITIONS} partitions), private redis-server, local downstream; {jobs} jobs over {SELLERS} sellers\n");
        shapes(&redis, jobs).await;
        return;
    }
    println!("# end_to_end: one replica, mock broker ({PARTITIONS} partitions), private redis-server, local downstream; {jobs} jobs over {SELLERS} sellers\n");
    println!("| run | jobs/s | vs unlimited | Redis limiter calls/job |");
    println!("|---|---:|---:|---:|");
    let base = one_run(&redis, jobs, true, 128, None).await;
    println!(
        "| every seller unlimited (baseline) | {:.0} | 1.00 | {:.3} |",
        base.jobs_per_s, base.calls_per_job
    );
    for (name, max) in [
        ("never-refusing rule, coalesced (default)", 128),
        ("never-refusing rule, max_coalesced = 1", 1),
    ] {
        let r = one_run(&redis, jobs, false, max, None).await;
        println!(
            "| {name} | {:.0} | {:.2} | {:.3} |",
            r.jobs_per_s,
            r.jobs_per_s / base.jobs_per_s,
            r.calls_per_job
        );
    }

    println!("\n## The pipeline's ceiling\n");
    println!("| run | jobs/s | vs bare consumer |");
    println!("|---|---:|---:|");
    let bare = bare_consumer(jobs).await;
    println!("| bare rdkafka consumer, reads and commits only (baseline) | {bare:.0} | 1.00 |");
    for (name, concurrency) in [
        ("worker, every seller unlimited", None),
        (
            "the same, downstream.concurrency = 512 (default 64)",
            Some(512),
        ),
    ] {
        let r = one_run(&redis, jobs, true, 128, concurrency).await;
        println!(
            "| {name} | {:.0} | {:.3} |",
            r.jobs_per_s,
            r.jobs_per_s / bare
        );
    }

    println!("\n## Jobs/s against replicas (never-refusing rule, coalesced)\n");
    println!("| replicas | jobs/s | vs one replica | Redis limiter calls/job |");
    println!("|---:|---:|---:|---:|");
    let counts: &[usize] = if quick { &[1, 2] } else { &[1, 2, 4] };
    let mut one = None;
    for &n in counts {
        let r = replicas_run(&redis, jobs, n).await;
        let first = *one.get_or_insert(r.jobs_per_s);
        println!(
            "| {n} | {:.0} | {:.2} | {:.3} |",
            r.jobs_per_s,
            r.jobs_per_s / first,
            r.calls_per_job
        );
    }
}

/// Jobs/s of a consumer that does nothing but read every job and commit
/// (auto-commit every 200 ms, the worker's commit interval): what the
/// broker and librdkafka give before the worker does anything.
async fn bare_consumer(jobs: usize) -> f64 {
    let bench = Bench::new("e2e-bare", PARTITIONS);
    let records = records(jobs);
    bench.produce(&records).await;
    let bootstrap = bench.bootstrap();
    let topic = bench.topics.jobs.clone();
    let group = bench.group.clone();
    tokio::task::spawn_blocking(move || {
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", &bootstrap)
            .set("group.id", &group)
            .set("auto.offset.reset", "earliest")
            .set("enable.auto.commit", "true")
            .set("auto.commit.interval.ms", "200")
            .set("session.timeout.ms", "3000")
            .set("heartbeat.interval.ms", "300")
            .create()
            .expect("bare consumer");
        consumer.subscribe(&[&topic]).expect("subscribe");
        let started = Instant::now();
        let (mut n, mut first, mut last) = (0usize, None, Instant::now());
        while n < jobs {
            assert!(
                started.elapsed() < Duration::from_secs(300),
                "the bare consumer read {n} of {jobs} jobs in 300 s"
            );
            if let Some(m) = consumer.poll(Duration::from_millis(100)) {
                m.expect("consume");
                n += 1;
                last = Instant::now();
                first.get_or_insert(last);
            }
        }
        consumer
            .commit_consumer_state(rdkafka::consumer::CommitMode::Sync)
            .expect("final commit");
        jobs as f64 / (last - first.expect("a record")).as_secs_f64().max(1e-6)
    })
    .await
    .expect("bare consumer thread")
}

/// `n` replicas in this process; the group settles before the jobs are
/// produced, so jobs/s is the group's, not its start-up's.
async fn replicas_run(redis: &RedisServer, jobs: usize, n: usize) -> Outcome {
    let bench = Bench::new("e2e-replicas", PARTITIONS);
    let downstream = Downstream::start(always_ok()).await;
    let workers: Vec<Running> = (0..n)
        .map(|_| {
            let mut settings = bench.settings(&downstream.url);
            settings.redis.url = redis.url();
            Running::start(settings, policy(false))
        })
        .collect();
    let probes = wait_all_calling(&bench, &downstream, n, Duration::from_secs(120)).await;
    downstream
        .wait_for("every probe called", Duration::from_secs(60), |a| {
            a.iter().filter(|a| a.seller == PROBE_SELLER).count() >= probes
        })
        .await;
    Command::new("redis-cli")
        .args(["-p", &redis.port.to_string(), "CONFIG", "RESETSTAT"])
        .output()
        .expect("redis-cli");
    let records = records(jobs);
    bench.produce(&records).await;
    let started = Instant::now();
    let real = |d: &Downstream| {
        d.arrivals()
            .into_iter()
            .filter(|a| a.seller != PROBE_SELLER)
            .collect::<Vec<_>>()
    };
    while real(&downstream).len() < jobs {
        assert!(
            started.elapsed() < Duration::from_secs(300),
            "{n} replicas: only {} of {jobs} jobs reached the downstream in 300 s",
            real(&downstream).len()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let arrivals = real(&downstream);
    let first = arrivals.iter().map(|a| a.at).min().expect("arrivals");
    let last = arrivals.iter().map(|a| a.at).max().expect("arrivals");
    let calls = limiter_calls(redis.port);
    let usec = limiter_usec(redis.port);
    for w in workers {
        w.stop().await;
    }
    Outcome {
        jobs_per_s: jobs as f64 / (last - first).as_secs_f64().max(1e-6),
        calls_per_job: calls as f64 / jobs as f64,
        redis_us_per_job: usec as f64 / jobs as f64,
    }
}
