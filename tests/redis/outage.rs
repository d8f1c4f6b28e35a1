//! A real Redis process fails under a running worker (issue 6, faults):
//! it is stopped and started again on the same port (its keys lost, as a
//! Redis without persistence restarts), frozen with SIGSTOP and thawed, or
//! answers every limiter call with an error (out of memory, no eviction).
//! With the default `redis.on_error = "fail_closed"` no job passes
//! unchecked while Redis is away, none is lost, the worker does not crash,
//! the first grant comes within 2 s of Redis' return, and no seller goes
//! over its limit. CI freezes or stops Redis for 3 s; the issue's 10 s:
//!
//! ```sh
//! REDIS_OUTAGE_S=10 cargo test --release --test limiter redis::outage:: -- --nocapture --test-threads 1
//! ```


use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use crate::common::redis_server::RedisServer;
use crate::common::rule;
use crate::common::worker::{always_ok, job, policy, Bench, Downstream, Running};

// These tests time the worker: each runs alone on the machine
// (`threads-required` in .config/nextest.toml), not beside another test.

#[derive(Clone, Copy, Debug)]
enum Fault {
    /// The process exits; connections are refused until it restarts.
    Stopped,
    /// SIGSTOP: connections hang until SIGCONT.
    Frozen,
    /// `maxmemory` below what Redis uses, no eviction: Redis answers, but
    /// every limiter call is refused with an `-OOM` error reply (a call
    /// that may write), until the limit is lifted.
    OutOfMemory,
}

/// `CONFIG SET maxmemory` on the test's own server (0 = no limit).
async fn set_maxmemory(redis: &RedisServer, bytes: &str) {
    let mut conn = redis::Client::open(redis.url())
        .expect("redis url")
        .get_multiplexed_async_connection()
        .await
        .expect("the test's redis-server");
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory-policy")
        .arg("noeviction")
        .arg("maxmemory")
        .arg(bytes)
        .query_async(&mut conn)
        .await
        .expect("CONFIG SET maxmemory");
}

async fn outage(fault: Fault) {
    let outage = Duration::from_secs(
        std::env::var("REDIS_OUTAGE_S")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(3),
    );
    let mut redis = RedisServer::start();
    let bench = Bench::new("redis-outage", 2);
    let down = Downstream::start(always_ok()).await;
    let mut settings = bench.settings(&down.url);
    settings.redis.url = redis.url();
    settings.redis.timeout = Duration::from_millis(200);
    // 20 per second after a burst of 5, for each of 4 sellers: 80 calls/s,
    // so 1,200 jobs outlast the outage whatever its length.
    const LIMIT: usize = 20;
    const BURST: usize = 5;
    let worker = Running::start(
        settings,
        policy(vec![rule("gcra", LIMIT as u64, "1s", Some(BURST as u64))]),
    );
    let sellers = 4;
    let total = sellers * (LIMIT * (outage.as_secs() as usize + 8));
    let records: Vec<_> = (0..total)
        .map(|i| job(&format!("o{i}"), &format!("seller-{}", i % sellers)))
        .collect();
    bench.produce(&records).await;
    down.wait_for("100 calls before the fault", Duration::from_secs(30), |a| {
        a.len() >= 100
    })
    .await;

    let fault_at = Instant::now();
    match fault {
        Fault::Stopped => redis.stop(),
        Fault::Frozen => redis.freeze(),
        Fault::OutOfMemory => set_maxmemory(&redis, "1").await,
    }
    // From here Redis can grant nothing (a call it was running when frozen
    // read its time before).
    let fault_us = crate::common::unix_us(std::time::SystemTime::now());
    tokio::time::sleep(outage).await;
    let back_at = Instant::now();
    let back_us = crate::common::unix_us(std::time::SystemTime::now());
    match fault {
        Fault::Stopped => redis.restart(),
        Fault::Frozen => redis.thaw(),
        Fault::OutOfMemory => set_maxmemory(&redis, "0").await,
    }
    // Judged on Redis' clock (X-Granted-At): no call may carry a grant
    // made while Redis was away or refusing, whatever its transit.
    let granted_in_fault: Vec<String> = down
        .arrivals()
        .iter()
        .filter(|a| {
            a.granted_at_us
                .is_some_and(|g| g >= fault_us && g < back_us)
        })
        .map(|a| a.job_id.clone())
        .collect();
    // Grants made before the fault may still be on their way; a call more
    // than 300 ms into the outage passed without the limiter.
    let unchecked = down
        .arrivals()
        .iter()
        .filter(|a| a.at > fault_at + Duration::from_millis(300) && a.at < back_at)
        .count();
    assert_eq!(unchecked, 0, "{fault:?}: calls passed without the limiter");
    assert!(
        granted_in_fault.is_empty(),
        "{fault:?}: calls granted while Redis was away: {granted_in_fault:?}"
    );
    down.wait_for("a call after Redis is back", Duration::from_secs(10), |a| {
        a.iter().any(|x| x.at > back_at)
    })
    .await;
    let first_after = down
        .arrivals()
        .iter()
        .filter(|a| a.at > back_at)
        .map(|a| a.at)
        .min()
        .unwrap()
        - back_at;
    down.wait_for("every job", Duration::from_secs(60), |a| {
        a.iter()
            .map(|x| x.job_id.as_str())
            .collect::<HashSet<_>>()
            .len()
            >= total
    })
    .await;
    let summary = worker.stop().await;

    let arrivals = down.arrivals();
    let ids: HashSet<&str> = arrivals.iter().map(|a| a.job_id.as_str()).collect();
    assert_eq!(ids.len(), total, "{fault:?}: jobs lost");
    let mut by_seller: HashMap<&str, Vec<Instant>> = HashMap::new();
    for a in &arrivals {
        by_seller.entry(a.seller.as_str()).or_default().push(a.at);
    }
    // GCRA grants at most the burst plus the rate over any span: 5 + 20 in
    // a second. Arrivals in 900 ms were granted within 1 s if a call takes
    // under 100 ms from grant to arrival. A restarted Redis forgot every
    // seller, but the outage is longer than a second, so the fresh burst
    // does not meet the calls before it.
    let bound = BURST + LIMIT;
    let mut busiest = 0;
    for times in by_seller.values_mut() {
        times.sort();
        let mut lo = 0;
        for hi in 0..times.len() {
            while times[hi] - times[lo] >= Duration::from_millis(900) {
                lo += 1;
            }
            busiest = busiest.max(hi - lo + 1);
        }
    }
    eprintln!(
        "redis {fault:?} for {outage:?}: {unchecked} calls passed while it was away; first call {first_after:?} after it came back; \
         {total} jobs, 0 lost, {} calls; busiest 900 ms of a seller {busiest} (bound {bound}); summary {summary:?}",
        arrivals.len()
    );

    assert!(
        first_after <= Duration::from_secs(2),
        "{fault:?}: the first call came {first_after:?} after Redis was back"
    );
    assert!(
        busiest <= bound,
        "{fault:?}: a seller had {busiest} calls in 900 ms (bound {bound})"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_stopped_and_restarted_under_load() {
    outage(Fault::Stopped).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_frozen_with_sigstop_under_load() {
    outage(Fault::Frozen).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_out_of_memory_refuses_every_call_under_load() {
    outage(Fault::OutOfMemory).await;
}
