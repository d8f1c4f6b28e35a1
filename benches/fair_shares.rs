//! Weighted fair shares of the downstream slots (issue 36), end to end:
//! one worker replica in this process, the mock Kafka broker, a private
//! `redis-server` and the recording downstream slowed to 50 ms a call, so
//! that the replica's slots are the bottleneck. Three sellers "w1", "w2",
//! "w4" with rules they never reach and backlogs of 1 : 2 : 4 jobs, spread
//! over 24 partitions, produced before the worker starts. Each round runs
//! twice on fresh topics:
//!
//! - every weight 1 (the baseline: what the turns did before weights, one
//!   seller after another);
//! - `limits.sellers.X.weight` 1, 2 and 4;
//!
//! and then, still weighted, with "w4"'s backlog cut to a third so that it
//! runs dry early (w1 : w2 must then go on 1 : 2, the slots still busy).
//! Calls per seller are counted at the downstream on the stretch where the
//! sellers judged all have jobs (from 1 s in to 1 s before the first of
//! them runs dry); slots busy = calls × 50 ms / (stretch × slots).
//!
//!     cargo bench --bench fair_shares               # 4 slots, 3 rounds
//!     cargo bench --bench fair_shares -- --quick    # 1 round
//!     cargo bench --bench fair_shares -- --replicas 2   # a fleet of 2
//!
//! With `--replicas N`, N replicas share the group (each with its 4
//! slots, so slots busy is judged against N × 4): each seller's shares are
//! kept per replica, on the partitions it holds (issue 50's fleet case).

#[path = "../tests/common/mod.rs"]
mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use throttle_worker::config::{LimitsConfig, RuleConfig, SellerConfig};
use throttle_worker::limiter::Policy;

use common::redis_server::RedisServer;
use common::worker::{always_ok, job, Arrival, Bench, Downstream, Running};

const PARTITIONS: i32 = 24;
const SLOTS: usize = 4;
const CALL: Duration = Duration::from_millis(50);
const SELLERS: [(&str, u32); 3] = [("w1", 1), ("w2", 2), ("w4", 4)];

fn policy(weighted: bool) -> Policy {
    let sellers = SELLERS
        .iter()
        .map(|&(name, weight)| {
            (
                name.to_owned(),
                SellerConfig {
                    weight: Some(if weighted { weight } else { 1 }),
                    ..SellerConfig::default()
                },
            )
        })
        .collect();
    Policy::from_config(&LimitsConfig {
        default: vec![RuleConfig {
            algorithm: "gcra".to_owned(),
            limit: 1_000_000,
            period: Duration::from_secs(1),
            burst: Some(1_000),
            shadow: false,
        }],
        sellers,
        ..LimitsConfig::default()
    })
    .expect("bench policy")
}

struct Outcome {
    /// Calls per seller on the stretch judged.
    calls: BTreeMap<String, u64>,
    stretch: Duration,
    /// Slots of every replica.
    slots: usize,
}

impl Outcome {
    fn busy(&self) -> f64 {
        let calls: u64 = self.calls.values().sum();
        calls as f64 * CALL.as_secs_f64() / (self.stretch.as_secs_f64() * self.slots as f64)
    }

    /// Each seller's calls against w1's.
    fn ratios(&self, who: &[&str]) -> String {
        let base = self.calls.get("w1").copied().unwrap_or(0).max(1) as f64;
        who.iter()
            .map(|s| {
                format!(
                    "{:.2}",
                    self.calls.get(*s).copied().unwrap_or(0) as f64 / base
                )
            })
            .collect::<Vec<_>>()
            .join(" : ")
    }
}

/// One run: `jobs` per seller, judged on the sellers of `judged`.
async fn one_run(
    redis: &RedisServer,
    jobs: [usize; 3],
    weighted: bool,
    judged: &[&str],
    replicas: usize,
) -> Outcome {
    let bench = Bench::new("fair", PARTITIONS);
    let down = Downstream::start(always_ok()).await;
    down.set_delay(CALL);
    let mut settings = bench.settings(&down.url);
    settings.redis.url = redis.url();
    settings.downstream.concurrency = SLOTS;
    let most = jobs.iter().copied().max().unwrap_or(0);
    let mut records = Vec::new();
    for i in 0..most {
        for (k, (name, _)) in SELLERS.iter().enumerate() {
            if i < jobs[k] {
                records.push(job(&format!("{name}-{i}"), name));
            }
        }
    }
    let total = records.len();
    let workers: Vec<Running> = if replicas == 1 {
        bench.produce(&records).await;
        vec![Running::start(settings, policy(weighted))]
    } else {
        // A fleet first settles its group (the mock holds each rebalance
        // for session.timeout − 1 s, and every replica's two consumers
        // join): a stretch judged across a rebalance measures the
        // rebalance, not the shares.
        let workers = (0..replicas)
            .map(|_| Running::start(settings.clone(), policy(weighted)))
            .collect();
        tokio::time::sleep(Duration::from_secs(10)).await;
        bench.produce(&records).await;
        workers
    };
    let started = Instant::now();
    while down.count() < total {
        assert!(
            started.elapsed() < Duration::from_secs(300),
            "only {} of {total} jobs reached the downstream in 300 s",
            down.count()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for w in workers {
        w.stop().await;
    }
    let arrivals: Vec<Arrival> = down.arrivals();
    let first = arrivals.iter().map(|a| a.at).min().expect("arrivals");
    let last = |s: &str| {
        arrivals
            .iter()
            .filter(|a| a.seller == s)
            .map(|a| a.at)
            .max()
            .expect("calls of every seller")
    };
    let from = first + Duration::from_secs(1);
    let to = judged.iter().map(|s| last(s)).min().expect("sellers") - Duration::from_secs(1);
    let mut calls = BTreeMap::new();
    for a in arrivals.iter().filter(|a| a.at >= from && a.at < to) {
        *calls.entry(a.seller.clone()).or_default() += 1;
    }
    Outcome {
        calls,
        stretch: to - from,
        slots: SLOTS * replicas,
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let quick = args.iter().any(|a| a == "--quick");
    let replicas: usize = args
        .iter()
        .position(|a| a == "--replicas")
        .and_then(|i| args.get(i + 1))
        .and_then(|s| s.parse().ok())
        .unwrap_or(1);
    let rounds = if quick { 1 } else { 3 };
    let redis = RedisServer::start();
    println!("# fair_shares: {replicas} replica(s), {SLOTS} slots each, calls of {} ms, mock broker ({PARTITIONS} partitions), private redis-server\n", CALL.as_millis());
    println!("| round | run | w1 : w2 : w4 calls (target) | calls w1, w2, w4 | slots busy |");
    println!("|---:|---|---|---|---:|");
    let all = ["w1", "w2", "w4"];
    for round in 1..=rounds {
        for (name, weighted, target) in [
            ("weights 1, 1, 1 (baseline)", false, "1 : 1 : 1"),
            ("weights 1, 2, 4", true, "1 : 2 : 4"),
        ] {
            // Backlogs 1 : 2 : 4 whatever the weights: the stretch ends
            // when the first seller runs dry.
            let r = one_run(&redis, [150, 300, 600], weighted, &all, replicas).await;
            println!(
                "| {round} | {name} | {} ({target}) | {:?} | {:.3} |",
                r.ratios(&all),
                r.calls.values().collect::<Vec<_>>(),
                r.busy()
            );
        }
        // w4 runs dry a third of the way in; judged on w1 and w2 after.
        let r = one_run(&redis, [300, 600, 150], true, &["w1", "w2"], replicas).await;
        let after = r.ratios(&["w1", "w2"]);
        println!(
            "| {round} | weights 1, 2, 4, w4 dry early (whole stretch) | w1 : w2 {after} (1 : 2) | {:?} | {:.3} |",
            r.calls.values().collect::<Vec<_>>(),
            r.busy()
        );
    }
}
