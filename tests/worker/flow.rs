//! The worker's throttling behaviour end to end: accuracy across replicas,
//! isolation of a hot seller, timer precision, and the downstream's 429
//! shared by every replica. Each test prints the figures it measures.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant, UNIX_EPOCH};

use crate::common::worker::{
    always_ok, job, percentile, policy, wait_all_calling, Arrival, Bench, Downstream, Running,
    PROBE_SELLER,
};
use crate::common::{busiest_window, rule, unix_us};
use axum::http::StatusCode;
use throttle_worker::config::{LimitsConfig, SellerConfig};
use throttle_worker::limiter::{KeySpace, Policy};
use throttle_worker::telemetry::metrics::metrics;

// These tests time the worker: each runs alone on the machine
// (`threads-required` in .config/nextest.toml), not beside another test.

/// Issue test 1: 4 replicas, 20 sellers at 20/s each (sliding log), 2,000
/// jobs; every job arrives once, and each seller is held to 20 per second.
///
/// Two views:
/// - the limiter's grants (`X-Granted-At`, Redis' clock): at most 20 in
///   any window shorter than 1 s, exactly;
/// - the downstream's arrivals: each is its grant shifted by that call's
///   own delay, never negative. With the longest delay measured in the run
///   (asserted under 500 ms), any second less that delay holds at most 20
///   arrivals. The figure (20 ms of delay: 20 in any 980 ms) is
///   printed, not asserted: on a loaded two-core machine running four
///   replicas, Redis and the downstream in one process a call is now and
///   then later than that, which is scheduling, not the limiter.
///
/// The jobs are produced once the group has settled (every replica has
/// called a probe job), so no partition moves during the run and
/// at-least-once delivery owes no repeat: every job is called exactly once
/// unless a replica was assigned partitions again (a missed session under
/// load), which the test then reports instead of failing on.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn four_replicas_hold_every_seller_to_its_limit() {
    let bench = Bench::new("accuracy", 8);
    let down = Downstream::start(always_ok()).await;
    let rules = || policy(vec![rule("sliding_window_log", 20, "1s", None)]);
    let workers: Vec<Running> = (0..4)
        .map(|_| Running::start(bench.settings(&down.url), rules()))
        .collect();
    wait_all_calling(&bench, &down, 4, Duration::from_secs(60)).await;
    let assignments_settled = metrics().rebalances.get();
    let mut ids = Vec::new();
    let mut records = Vec::new();
    for i in 0..100 {
        for s in 0..20 {
            let id = format!("acc-{s}-{i}");
            records.push(job(&id, &format!("seller-{s}")));
            ids.push(id);
        }
    }
    let started = Instant::now();
    bench.produce(&records).await;
    down.wait_for("all 2,000 jobs", Duration::from_secs(60), |a| {
        a.iter()
            .filter(|x| x.seller != PROBE_SELLER)
            .map(|x| x.job_id.as_str())
            .collect::<HashSet<_>>()
            .len()
            == ids.len()
    })
    .await;
    let elapsed = started.elapsed();
    let reassigned = metrics().rebalances.get() - assignments_settled;
    for w in workers {
        w.stop().await;
    }
    let arrivals: Vec<Arrival> = down
        .arrivals()
        .into_iter()
        .filter(|a| a.seller != PROBE_SELLER)
        .collect();
    let mut calls: BTreeMap<&str, usize> = BTreeMap::new();
    for a in &arrivals {
        *calls.entry(a.job_id.as_str()).or_default() += 1;
    }
    let repeated: Vec<(&str, usize)> = calls
        .iter()
        .filter(|(_, n)| **n > 1)
        .map(|(id, n)| (*id, *n))
        .collect();
    let mut per_seller: BTreeMap<&str, (Vec<u64>, Vec<u64>)> = BTreeMap::new();
    // The most time any call took from its grant to its arrival.
    let mut transit_us = 0;
    for a in &arrivals {
        let (grants, arrived) = per_seller.entry(a.seller.as_str()).or_default();
        let granted = a
            .granted_at_us
            .unwrap_or_else(|| panic!("{}: no X-Granted-At", a.job_id));
        let at = unix_us(a.wall);
        assert!(
            at + 1_000 >= granted,
            "{} arrived {} µs before its grant",
            a.job_id,
            granted - at
        );
        transit_us = transit_us.max(at.saturating_sub(granted));
        grants.push(granted);
        arrived.push(at);
    }
    assert!(
        transit_us < 500_000,
        "a call arrived {transit_us} µs after its grant"
    );
    let (mut worst_grants, mut worst_arrivals, mut worst_980) = (0, 0, 0);
    for (seller, (grants, arrived)) in per_seller.iter_mut() {
        let (g, at) = busiest_window(grants, 1_000_000);
        worst_grants = worst_grants.max(g);
        assert!(
            g <= 20,
            "{seller}: the limiter granted {g} within 1 s (limit 20): {:?}",
            &grants[at]
        );
        // What the downstream saw: arrivals are grants delayed by at most
        // `transit_us`, so any second less that delay holds at most 20 of
        // them. A call sent at some other time than its grant (a worker
        // batching grants up, or naming the wrong grant) breaks this.
        // (Less 1 ms more: arrivals may precede their grant by that much.)
        let (n, at) = busiest_window(arrived, 1_000_000 - transit_us - 1_000);
        worst_arrivals = worst_arrivals.max(n);
        worst_980 = worst_980.max(busiest_window(arrived, 980_000).0);
        assert!(
            n <= 20,
            "{seller}: {n} arrivals within 1 s less the longest transit ({transit_us} µs): {:?}",
            &arrived[at]
        );
    }
    println!(
        "accuracy: 2000 jobs, 20 sellers, 4 replicas in {elapsed:.2?}; busiest second of grants of any seller: {worst_grants}; \
         longest grant-to-arrival {:.1} ms; busiest window of arrivals: {worst_arrivals} in 1 s less that, {worst_980} in 980 ms (limit 20); \
         {} jobs called more than once, {reassigned} assignments after the group settled",
        transit_us as f64 / 1000.0,
        repeated.len()
    );
    let missing = ids
        .iter()
        .filter(|id| !calls.contains_key(id.as_str()))
        .count();
    assert_eq!(missing, 0, "jobs never called");
    if reassigned == 0 {
        assert!(
            repeated.is_empty(),
            "no partition moved, yet jobs were called more than once: {repeated:?}"
        );
    }
    // At least once: a job is called again only when its partition moved
    // before its offset was committed, at most once per move.
    let bound = 1 + reassigned as usize;
    assert!(
        repeated.iter().all(|(_, n)| *n <= bound),
        "a job called more than 1 + {reassigned} (assignments after the group settled) times: {repeated:?}"
    );
}

/// Issue test 2: one hot seller with 5,000 queued jobs at 50/s must not slow
/// 19 other sellers (40 jobs each at 20/s) on the same partitions. Measures
/// the time until the 19 sellers' jobs are all done, with and without the
/// hot seller's jobs queued ahead of theirs.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_hot_seller_does_not_hold_up_the_others() {
    async fn run(with_hot: bool) -> Duration {
        let bench = Bench::new("isolation", 4);
        let down = Downstream::start(always_ok()).await;
        let cfg = LimitsConfig {
            default: vec![rule("gcra", 20, "1s", Some(5))],
            sellers: [(
                "hot".to_owned(),
                SellerConfig {
                    rules: Some(vec![rule("sliding_window_log", 50, "1s", None)]),
                    ..Default::default()
                },
            )]
            .into(),
            ..Default::default()
        };
        let mut records = Vec::new();
        if with_hot {
            records.extend((0..5000).map(|i| job(&format!("hot-{i}"), "hot")));
        }
        let mut others = HashSet::new();
        for s in 0..19 {
            for i in 0..40 {
                let id = format!("cold-{s}-{i}");
                records.push(job(&id, &format!("cold-{s}")));
                others.insert(id);
            }
        }
        bench.produce(&records).await;
        let w = Running::start(
            bench.settings(&down.url),
            Policy::from_config(&cfg).unwrap(),
        );
        down.wait_for("the 19 other sellers' jobs", Duration::from_secs(60), |a| {
            a.iter()
                .filter(|x| others.contains(&x.job_id))
                .map(|x| &x.job_id)
                .collect::<HashSet<_>>()
                .len()
                == others.len()
        })
        .await;
        w.stop().await;
        // From the first call the worker made (joining the group and
        // connecting are not what is measured) to the last cold job's.
        let arrivals = down.arrivals();
        let first = arrivals.iter().map(|a| a.at).min().expect("arrivals");
        let last_cold = arrivals
            .iter()
            .filter(|a| others.contains(&a.job_id))
            .map(|a| a.at)
            .max()
            .expect("cold arrivals");
        last_cold - first
    }
    let without = run(false).await;
    let with = run(true).await;
    let ratio = with.as_secs_f64() / without.as_secs_f64();
    println!("isolation: 19 sellers done in {without:.2?} alone, {with:.2?} behind a hot seller with 5000 queued: ratio {ratio:.3}");
    assert!(ratio < 2.0, "a hot seller slowed the others {ratio:.2}×");
}

/// Issue test 3: a job waiting in memory goes when it is due: never before,
/// and soon after. Fixed windows of 200 ms make the due instants known: the
/// window boundaries, on Redis' clock. Every call names its grant
/// (`X-Granted-At`, the limiter's decision time on Redis' clock), so the
/// test checks each part against the limiter's own times, not against when
/// arrivals happen to land:
///
/// - the limiter: at most 10 grants per seller in each window, exactly;
/// - the worker never calls before its grant (1 ms for the clocks: Redis'
///   `TIME` and this process read the same host clock, the rest is
///   rounding);
/// - a backlogged seller is granted soon after each boundary: the worker
///   sleeps until the retry-after the limiter gave (rounded up to the ms)
///   and asks again, so the first grant of a window trails its boundary by
///   a timer tick and a Redis round trip (p50 3.6 ms, p99 8.4 ms on an
///   idle machine). The median must be under 100 ms, half a window: a
///   waiter that missed its boundary and waited for the next one would be
///   at least 200 ms late. The tail is printed, not asserted: under two
///   busy loops on two cores it is the scheduler's (p50 24 ms, p99 142 ms
///   seen), not the worker's;
/// - no boundary slept through: from a seller's first grant to its last it
///   has jobs waiting, so at most 5 % of those windows may have no grant;
/// - grant to arrival (the call's own delay): median under 100 ms, for
///   the same reasons.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn waiting_jobs_go_when_due_never_early() {
    if std::env::var("TEST_LOG").is_ok() {
        throttle_worker::telemetry::init();
    }
    const WINDOW_US: u64 = 200_000;
    let bench = Bench::new("precision", 4);
    let down = Downstream::start(always_ok()).await;
    let mut records = Vec::new();
    for s in 0..20 {
        for i in 0..50 {
            records.push(job(&format!("p-{s}-{i}"), &format!("seller-{s}")));
        }
    }
    bench.produce(&records).await;
    let mut settings = bench.settings(&down.url);
    // The sellers are backlogged only once their records are in memory.
    // The first fetch may bring one partition's, and the next one waits
    // `fetch.wait.max.ms` (500 ms by default) before it brings the rest:
    // windows with no grant then, but no job waiting either.
    settings
        .kafka
        .consumer_properties
        .insert("fetch.wait.max.ms".into(), "20".into());
    let w = Running::start(
        settings,
        policy(vec![rule("fixed_window", 10, "200ms", None)]),
    );
    down.wait_for("all 1,000 jobs", Duration::from_secs(60), |a| {
        a.iter()
            .map(|x| x.job_id.as_str())
            .collect::<HashSet<_>>()
            .len()
            == 1000
    })
    .await;
    w.stop().await;
    // (grant µs, arrival µs, job id) of the calls granted in one window
    type Calls = Vec<(u64, u64, String)>;
    // (seller, window of the grant) → its calls
    let mut per_window: BTreeMap<(String, u64), Calls> = BTreeMap::new();
    let mut transit_ms = Vec::new();
    for a in down.arrivals() {
        let arrived = a.wall.duration_since(UNIX_EPOCH).unwrap().as_micros() as u64;
        let granted = a
            .granted_at_us
            .unwrap_or_else(|| panic!("{}: no X-Granted-At on a call granted by Redis", a.job_id));
        assert!(
            arrived + 1_000 >= granted,
            "{} arrived {} µs before its grant",
            a.job_id,
            granted - arrived
        );
        transit_ms.push(arrived.saturating_sub(granted) as f64 / 1000.0);
        per_window
            .entry((a.seller.clone(), granted / WINDOW_US))
            .or_default()
            .push((granted, arrived, a.job_id.clone()));
    }
    let mut lateness_ms = Vec::new();
    for ((seller, window), grants) in &per_window {
        assert!(
            grants.len() <= 10,
            "{seller}: {} grants in window {window} (limit 10): {grants:?}",
            grants.len()
        );
        // Backlog at the boundary: the previous window was full, and this
        // one was asked for at once.
        let prev_full = per_window
            .get(&(seller.clone(), window - 1))
            .is_some_and(|p| p.len() == 10);
        if prev_full {
            let first = grants.iter().map(|g| g.0).min().expect("a grant");
            lateness_ms.push((first - window * WINDOW_US) as f64 / 1000.0);
        }
    }
    // A waiter that misses its boundary leaves a whole window without a
    // grant while its seller still has jobs waiting (the boundaries above
    // measure only windows that have grants). From a seller's first grant
    // to its last it always has a backlog: at most 5 % of those windows may
    // be empty (a stall of the whole process longer than a window, on a
    // loaded machine); a worker that slept through every other boundary
    // would leave half of them empty.
    let mut spanned = 0usize;
    let mut empty = Vec::new();
    let mut windows_of: BTreeMap<&str, Vec<u64>> = BTreeMap::new();
    for (seller, window) in per_window.keys() {
        windows_of.entry(seller).or_default().push(*window);
    }
    for (seller, windows) in &windows_of {
        let (first, last) = (windows[0], windows[windows.len() - 1]);
        for w in first..=last {
            spanned += 1;
            if !per_window.contains_key(&(seller.to_string(), w)) {
                empty.push(format!("{seller} window {w}"));
            }
        }
    }
    assert!(
        empty.len() * 20 <= spanned,
        "{} of {spanned} windows with jobs waiting had no grant (boundaries missed): {empty:?}",
        empty.len()
    );
    // 50 jobs at 10 per window: 4 backlogged boundaries per seller when
    // the windows fill from the first. On a loaded machine the calls that
    // fill a window (one head per partition each) may slip past its end, so
    // fewer windows are full: ask for one measured boundary per seller.
    assert!(
        lateness_ms.len() >= 20,
        "too few backlogged windows to measure: {}",
        lateness_ms.len()
    );
    let (p50, p99, max) = (
        percentile(&mut lateness_ms, 50.0),
        percentile(&mut lateness_ms, 99.0),
        percentile(&mut lateness_ms, 100.0),
    );
    let (t50, t99) = (
        percentile(&mut transit_ms, 50.0),
        percentile(&mut transit_ms, 99.0),
    );
    println!(
        "precision: {} due instants, grant after the boundary p50 {p50:.1} ms, p99 {p99:.1} ms, max {max:.1} ms; grant to arrival p50 {t50:.1} ms, p99 {t99:.1} ms; {} of {spanned} backlogged windows without a grant",
        lateness_ms.len(),
        empty.len()
    );
    assert!(
        p50 < 100.0,
        "due jobs granted late: p50 {p50:.1} ms after the boundary"
    );
    assert!(
        t50 < 100.0,
        "calls left long after their grant: p50 {t50:.1} ms"
    );
}

/// Issue test 5: the downstream answers 429 with Retry-After: 2 for a
/// seller (and keeps answering 429 until those 2 s have passed, as a real
/// rate-limited API would); once a replica got the 429, no replica calls
/// for that seller until the block is over.
///
/// Judged on Redis' clock, exactly: the test watches the seller's block
/// (the `block` field of its hash: the instant the block ends), so it
/// knows when the first block was written (that end less the 2 s) and when
/// the last one ends.
/// No call may have been granted (`X-Granted-At`) in between. Calls
/// granted before the block was written were in flight and cannot be
/// recalled; they are counted, not failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_429_holds_the_seller_on_every_replica() {
    let bench = Bench::new("four29", 2);
    let first_429: Arc<std::sync::Mutex<Option<Instant>>> = Arc::default();
    let mark = first_429.clone();
    let hold = Duration::from_secs(2);
    let down = Downstream::start(Arc::new(move |a: &Arrival, _| {
        if a.seller != "touchy" {
            return (StatusCode::OK, None);
        }
        let mut m = mark.lock().unwrap();
        let since = *m.get_or_insert(a.at);
        match hold.checked_sub(a.at - since) {
            Some(left) if !left.is_zero() => {
                let secs = left.as_secs_f64().ceil() as u64;
                (StatusCode::TOO_MANY_REQUESTS, Some(secs.to_string()))
            }
            _ => (StatusCode::OK, None),
        }
    }))
    .await;
    let rules = || policy(vec![rule("gcra", 20, "1s", Some(5))]);
    let workers: Vec<Running> = (0..2)
        .map(|_| Running::start(bench.settings(&down.url), rules()))
        .collect();
    wait_all_calling(&bench, &down, 2, Duration::from_secs(30)).await;
    // Every value the seller's block takes (the `block` field of its
    // hash: the block's end, µs on Redis' clock), read every 2 ms: the
    // first block lasts the first 429's 2 s, later 429s may only lengthen
    // it.
    let state_key = KeySpace::new(bench.prefix.clone()).seller_state("touchy");
    let block_ends: Arc<std::sync::Mutex<BTreeSet<u64>>> = Arc::default();
    let watcher = {
        let ends = block_ends.clone();
        let mut conn = crate::common::raw().await;
        tokio::spawn(async move {
            loop {
                let end: Option<u64> = redis::cmd("HGET")
                    .arg(&state_key)
                    .arg("block")
                    .query_async(&mut conn)
                    .await
                    .expect("HGET the seller's block");
                if let Some(end) = end {
                    ends.lock().unwrap().insert(end);
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        })
    };
    let mut records = Vec::new();
    for i in 0..40 {
        records.push(job(&format!("t-{i}"), "touchy"));
    }
    for i in 0..20 {
        records.push(job(&format!("o-{i}"), "other"));
    }
    bench.produce(&records).await;
    down.wait_for(
        "every job of the throttled seller",
        Duration::from_secs(40),
        |a| {
            let done: HashSet<&str> = a
                .iter()
                .filter(|x| x.seller == "touchy")
                .map(|x| x.job_id.as_str())
                .collect();
            done.len() == 40
        },
    )
    .await;
    watcher.abort();
    for w in workers {
        w.stop().await;
    }
    let t429 = first_429
        .lock()
        .unwrap()
        .expect("the downstream answered 429");
    let ends = block_ends.lock().unwrap().clone();
    let (first_end, last_end) = (
        *ends.first().expect("a 429 wrote no block into Redis"),
        *ends.last().unwrap(),
    );
    let block_start = first_end - hold.as_micros() as u64;
    let arrivals = down.arrivals();
    let touchy: Vec<&Arrival> = arrivals.iter().filter(|a| a.seller == "touchy").collect();
    let granted_in_block: Vec<(&str, u64)> = touchy
        .iter()
        .map(|a| {
            let g = a
                .granted_at_us
                .unwrap_or_else(|| panic!("{}: no X-Granted-At", a.job_id));
            (a.job_id.as_str(), g)
        })
        .filter(|(_, g)| (block_start..last_end).contains(g))
        .map(|(id, g)| (id, g - block_start))
        .collect();
    let in_flight = touchy
        .iter()
        .filter(|a| unix_us(a.wall) >= block_start && a.granted_at_us < Some(block_start))
        .count();
    // The seller's jobs are keyed at random, so both replicas hold some of
    // them: each must have waited out the hold and called after it.
    let callers_after: HashSet<&str> = touchy
        .iter()
        .filter(|a| a.granted_at_us >= Some(last_end))
        .map(|a| a.worker.as_str())
        .collect();
    let next_ok = touchy
        .iter()
        .filter(|a| a.at >= t429 + hold)
        .map(|a| a.at - t429)
        .min();
    println!(
        "429: block on Redis' clock {:.3} s long ({} block writes seen); {in_flight} calls granted before it and arriving after; \
         first call after the hold at {next_ok:.2?} from the first 429; replicas calling after it: {callers_after:?}",
        (last_end - block_start) as f64 / 1e6,
        ends.len()
    );
    assert!(
        arrivals.iter().all(|a| !a.worker.is_empty()),
        "every call names its replica"
    );
    assert!(
        granted_in_block.is_empty(),
        "calls granted while the seller was blocked (job, µs after the block began): {granted_in_block:?}"
    );
    assert_eq!(
        callers_after.len(),
        2,
        "both replicas held the seller's jobs through the hold and called after it: {callers_after:?}"
    );
    assert_eq!(
        arrivals
            .iter()
            .filter(|a| a.seller == "other")
            .map(|a| &a.job_id)
            .collect::<HashSet<_>>()
            .len(),
        20,
        "other sellers must flow"
    );
}
