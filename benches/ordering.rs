//! A seller's limit as its only bound (issue 50), end to end: two worker
//! replicas in this process, the mock Kafka broker (8 partitions), a
//! private `redis-server`, and the recording downstream slowed to 100 ms a
//! call with `downstream.concurrency` 32. One seller under GCRA 100/s
//! (burst 100) with a backlog of distinct products (`payload.sku`), its
//! records keyed either
//!
//! - by seller (one partition: what producers do to keep a tenant's
//!   records together), or
//! - by job (spread over the 8 partitions),
//!
//! each run under `worker.ordering = "seller"` (the baseline: one call at a
//! time per seller and partition, as every earlier build) and `"key"` (the
//! default: one at a time per product), on fresh topics, in the same
//! process. Calls per second are counted at the downstream from 2 s after
//! the first call (past the burst) for `--window` seconds (default 10).
//!
//!     cargo bench --bench ordering                 # 2 rounds
//!     cargo bench --bench ordering -- --quick      # 1 round

#[path = "../tests/common/mod.rs"]
mod common;

use std::time::{Duration, Instant};

use throttle_worker::config::{LimitsConfig, OrderingMode, RuleConfig};
use throttle_worker::limiter::Policy;

use common::redis_server::RedisServer;
use common::worker::{always_ok, Bench, Downstream, Running};

const PARTITIONS: i32 = 8;
const SLOTS: usize = 32;
const CALL: Duration = Duration::from_millis(100);
const LIMIT_PER_S: u64 = 100;
const SKIP: Duration = Duration::from_secs(2);

fn policy() -> Policy {
    Policy::from_config(&LimitsConfig {
        default: vec![RuleConfig {
            algorithm: "gcra".to_owned(),
            limit: LIMIT_PER_S,
            period: Duration::from_secs(1),
            burst: Some(LIMIT_PER_S),
            shadow: false,
        }],
        ..LimitsConfig::default()
    })
    .expect("bench policy")
}

/// A job of seller "s" for product `i`, keyed by the seller or by itself.
fn record(i: usize, by_seller: bool) -> (Option<String>, Vec<u8>) {
    let job_id = format!("j-{i}");
    let value = serde_json::json!({
        "job_id": job_id,
        "seller_id": "s",
        "payload": { "sku": format!("sku-{i}"), "title": "a product" }
    });
    let key = if by_seller { "s".to_owned() } else { job_id };
    (Some(key), value.to_string().into_bytes())
}

/// Calls per second at the downstream over the window judged.
async fn one_run(
    redis: &RedisServer,
    by_seller: bool,
    ordering: OrderingMode,
    window: Duration,
) -> f64 {
    let bench = Bench::new("ordering", PARTITIONS);
    let down = Downstream::start(always_ok()).await;
    down.set_delay(CALL);
    let mut settings = bench.settings(&down.url);
    settings.redis.url = redis.url();
    settings.downstream.concurrency = SLOTS;
    settings.worker.ordering = ordering;
    // More than the window can take at the limit, so the seller never runs dry.
    let n = (LIMIT_PER_S as usize) * (window + SKIP).as_secs() as usize * 2;
    let records: Vec<_> = (0..n).map(|i| record(i, by_seller)).collect();
    bench.produce(&records).await;
    let replicas = [
        Running::start(settings.clone(), policy()),
        Running::start(settings, policy()),
    ];
    let started = Instant::now();
    let first = loop {
        if let Some(a) = down.arrivals().first() {
            break a.at;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "no call within 60 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let (from, to) = (first + SKIP, first + SKIP + window);
    while Instant::now() < to + Duration::from_millis(200) {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let calls = down
        .arrivals()
        .iter()
        .filter(|a| a.at >= from && a.at < to)
        .count();
    for r in replicas {
        r.stop().await;
    }
    calls as f64 / window.as_secs_f64()
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let quick = args.iter().any(|a| a == "--quick");
    let window = args
        .iter()
        .position(|a| a == "--window")
        .and_then(|i| args.get(i + 1))
        .and_then(|s| s.parse().ok())
        .map_or(Duration::from_secs(10), Duration::from_secs);
    let rounds = if quick { 1 } else { 2 };
    let redis = RedisServer::start();
    println!(
        "# ordering: 2 replicas, {SLOTS} slots each, calls of {} ms, one seller at GCRA {LIMIT_PER_S}/s, mock broker ({PARTITIONS} partitions), private redis-server; calls/s over {} s\n",
        CALL.as_millis(),
        window.as_secs()
    );
    println!("| round | records keyed by | ordering = \"seller\" (baseline) | ordering = \"key\" | key / seller |");
    println!("|---:|---|---:|---:|---:|");
    for round in 1..=rounds {
        for (name, by_seller) in [
            ("seller (one partition)", true),
            ("job (8 partitions)", false),
        ] {
            let base = one_run(&redis, by_seller, OrderingMode::Seller, window).await;
            let keyed = one_run(&redis, by_seller, OrderingMode::Key, window).await;
            println!(
                "| {round} | {name} | {base:.1} | {keyed:.1} | {:.2} |",
                keyed / base.max(0.001)
            );
        }
    }
}
