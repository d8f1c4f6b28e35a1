//! The limiter's cost end to end (issue 10, target 4): one worker replica
//! in this process, the mock Kafka broker, a private `redis-server` and a
//! fast local downstream. The same jobs (JOBS over SELLERS sellers,
//! produced before the worker starts) run three times, each on fresh topics:
//!
//! - every seller unlimited (the baseline: no rule to ask);
//! - a rule that never refuses, with coalescing (the default settings);
//! - the same rule with `redis.coalesce_max = 1` (one call per ask).
//!
//! Jobs/s is taken between the first and the last downstream arrival, so
//! the group's start is not counted. Redis calls per job are the server's
//! own FCALL count.
//!
//!     cargo bench --bench end_to_end             # 20,000 jobs per run
//!     cargo bench --bench end_to_end -- --quick  # 10,000

#[path = "../tests/common/mod.rs"]
mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use throttle_worker::config::{LimitsConfig, RuleConfig, SellerConfig};
use throttle_worker::limiter::Policy;

use common::redis_server::{limiter_calls, RedisServer};
use common::worker::{always_ok, job, Bench, Downstream, Running};

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
                        tier: None,
                        rules: None,
                        unlimited: true,
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

struct Outcome {
    jobs_per_s: f64,
    calls_per_job: f64,
}

async fn one_run(
    redis: &RedisServer,
    jobs: usize,
    unlimited: bool,
    coalesce_max: usize,
) -> Outcome {
    let bench = Bench::new("e2e", PARTITIONS);
    let downstream = Downstream::start(always_ok()).await;
    let records: Vec<_> = (0..jobs)
        .map(|i| job(&format!("j{i}"), &format!("seller-{}", i % SELLERS)))
        .collect();
    bench.produce(&records).await;
    let mut settings = bench.settings(&downstream.url);
    settings.redis.url = redis.url();
    settings.redis.coalesce_max = coalesce_max;
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
    worker.stop().await;
    Outcome {
        jobs_per_s: jobs as f64 / (last - first).as_secs_f64().max(1e-6),
        calls_per_job: calls as f64 / jobs as f64,
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let jobs = if quick { 10_000 } else { 20_000 };
    let redis = RedisServer::start();
    println!("# end_to_end: one replica, mock broker ({PARTITIONS} partitions), private redis-server, local downstream; {jobs} jobs over {SELLERS} sellers\n");
    println!("| run | jobs/s | vs unlimited | Redis limiter calls/job |");
    println!("|---|---:|---:|---:|");
    let base = one_run(&redis, jobs, true, 128).await;
    println!(
        "| every seller unlimited (baseline) | {:.0} | 1.00 | {:.3} |",
        base.jobs_per_s, base.calls_per_job
    );
    for (name, max) in [
        ("never-refusing rule, coalesced (default)", 128),
        ("never-refusing rule, coalesce_max = 1", 1),
    ] {
        let r = one_run(&redis, jobs, false, max).await;
        println!(
            "| {name} | {:.0} | {:.2} | {:.3} |",
            r.jobs_per_s,
            r.jobs_per_s / base.jobs_per_s,
            r.calls_per_job
        );
    }
}
