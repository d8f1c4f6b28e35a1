//! Jobs that weigh more than one (issue 7): the limiter charges a job's
//! cost, all or nothing; a job that can never pass is dead-lettered with
//! the rule that refuses it; a heavy job is not starved by light ones.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::{Duration, Instant};

use crate::common::rule;
use crate::common::worker::{always_ok, job_of_cost, policy, Arrival, Bench, Downstream, Running};
use throttle_worker::telemetry::metrics::metrics;

/// The largest sum of costs arriving within any `window` (by arrival time).
fn busiest(arrivals: &[Arrival], window: Duration) -> u64 {
    let mut a: Vec<&Arrival> = arrivals.iter().collect();
    a.sort_by_key(|x| x.at);
    let mut best = 0;
    let (mut lo, mut sum) = (0, 0);
    for hi in 0..a.len() {
        sum += a[hi].cost;
        while a[hi].at.duration_since(a[lo].at) >= window {
            sum -= a[lo].cost;
            lo += 1;
        }
        best = best.max(sum);
    }
    best
}

/// Limit 100 units per 1 s (sliding log), jobs of cost 1, 7, 30 and 100
/// across 4 replicas: the units at the downstream never exceed 100 in a
/// window, nothing is lost, every cost-101 job is dead-lettered with the
/// rule, its capacity and the cost.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mixed_costs_across_four_replicas_hold_the_unit_limit() {
    let bench = Bench::new("costs-mixed", 4);
    let down = Downstream::start(always_ok()).await;
    let settings = bench.settings(&down.url);
    let costs = [1u64, 7, 30, 100];
    let mut records = Vec::new();
    for i in 0..20 {
        records.push(job_of_cost(&format!("m-{i}"), "bulk", costs[i % 4]));
    }
    for i in 0..3 {
        records.push(job_of_cost(&format!("over-{i}"), "bulk", 101));
    }
    let units: u64 = (0..20).map(|i| costs[i % 4]).sum();
    let rules = || policy(vec![rule("sliding_window_log", 100, "1s", None)]);
    let rebalances_before = metrics().rebalances.get();
    let workers: Vec<Running> = (0..4)
        .map(|_| Running::start(settings.clone(), rules()))
        .collect();
    bench.produce(&records).await;
    down.wait_for("the 20 jobs that fit", Duration::from_secs(60), |a| {
        a.iter()
            .map(|x| x.job_id.as_str())
            .filter(|id| id.starts_with("m-"))
            .collect::<HashSet<_>>()
            .len()
            == 20
    })
    .await;
    // The cost-101 jobs queue behind the others of their seller: wait for
    // their dead letters before stopping, then read the topic to its end.
    bench.wait_dead_letters(3, Duration::from_secs(30));
    let arrivals = down.arrivals();
    for w in workers {
        w.stop().await;
    }
    // Assignments while the replicas joined: a partition that moved before
    // its offsets were committed is read again, and its jobs may be
    // dead-lettered again. (The count is the process'; under nextest the
    // process is this test's alone, and another test's rebalances could
    // only loosen the bound, never fail it.)
    let moved = metrics().rebalances.get() - rebalances_before;
    let got: u64 = arrivals
        .iter()
        .filter(|a| a.job_id.starts_with("m-"))
        .map(|a| a.cost)
        .sum();
    assert!(got >= units, "{got} units arrived, {units} produced");
    assert!(
        arrivals.iter().all(|a| !a.job_id.starts_with("over-")),
        "a cost-101 job reached the downstream"
    );
    // The limiter decides on Redis' clock; calls reach the downstream a few
    // ms after their grant, so two grants 1 s apart can arrive a little
    // closer: windows of 900 ms leave that transit room.
    let peak = busiest(&arrivals, Duration::from_millis(900));
    println!(
        "units: {got} arrived ({units} produced), busiest 900 ms: {peak}, busiest 1 s: {}",
        busiest(&arrivals, Duration::from_secs(1))
    );
    assert!(peak <= 100, "{peak} units within 900 ms, limit 100 per 1 s");
    let dlq = bench.dead_letters(3, Duration::ZERO);
    let mut times: BTreeMap<String, u64> = BTreeMap::new();
    for (value, headers) in &dlq {
        let id = serde_json::from_slice::<serde_json::Value>(value)
            .ok()
            .and_then(|j| j["job_id"].as_str().map(str::to_owned))
            .unwrap_or_else(|| panic!("a dead letter that is not a job: {headers:?}"));
        *times.entry(id).or_default() += 1;
    }
    assert_eq!(
        times.keys().collect::<Vec<_>>(),
        ["over-0", "over-1", "over-2"],
        "every cost-101 job is dead-lettered, and nothing else"
    );
    assert!(
        times.values().all(|&n| n == 1 || n <= 1 + moved),
        "dead-lettered more than once, with {moved} assignments to explain it: {times:?}"
    );
    for (_, headers) in &dlq {
        let reason = headers.get("x-error").map(String::as_str).unwrap_or("");
        assert!(
            reason.contains("cost 101 exceeds rule sliding_window_log 100/1s (capacity 100)"),
            "reason names the rule, capacity and cost: {reason:?}"
        );
    }
}

/// One cost-80 job in a stream of cost-1 jobs produced faster than the
/// seller's limit (100/s): once every job older than it is done, it runs
/// within cost / rate (0.8 s) plus one period (1 s).
async fn heavy_job_is_not_starved(partitions: i32) {
    let bench = Bench::new("costs-starve", partitions);
    let down = Downstream::start(always_ok()).await;
    let settings = bench.settings(&down.url);
    let w = Running::start(settings, policy(vec![rule("gcra", 100, "1s", Some(100))]));
    // 150 light jobs a second for 4 s; the heavy one after the first second.
    let mut produced_before_heavy: HashSet<String> = HashSet::new();
    for tick in 0..40 {
        let batch: Vec<_> = (0..15)
            .map(|i| job_of_cost(&format!("light-{tick}-{i}"), "shop", 1))
            .collect();
        if tick < 10 {
            produced_before_heavy.extend((0..15).map(|i| format!("light-{tick}-{i}")));
        }
        bench.produce(&batch).await;
        if tick == 9 {
            bench.produce(&[job_of_cost("heavy", "shop", 80)]).await;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    down.wait_for("the heavy job", Duration::from_secs(30), |a| {
        a.iter().any(|x| x.job_id == "heavy")
    })
    .await;
    let arrivals = down.arrivals();
    let first: HashMap<&str, Instant> = arrivals.iter().fold(HashMap::new(), |mut m, a| {
        m.entry(a.job_id.as_str()).or_insert(a.at);
        m
    });
    let heavy = first["heavy"];
    let older_done = produced_before_heavy
        .iter()
        .filter_map(|id| first.get(id.as_str()))
        .max()
        .copied()
        .expect("older jobs arrived");
    let wait = heavy.saturating_duration_since(older_done);
    let light_after: usize = arrivals
        .iter()
        .filter(|a| {
            a.at < heavy && !produced_before_heavy.contains(&a.job_id) && a.job_id != "heavy"
        })
        .count();
    println!(
        "{partitions} partition(s): heavy ran {wait:?} after the last older job; {light_after} newer light jobs ran before it"
    );
    w.stop().await;
    assert!(
        wait <= Duration::from_millis(1800 + 200),
        "the cost-80 job waited {wait:?} after reaching the head (bound 0.8 s + 1 s)"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_heavy_job_is_not_starved_on_one_partition() {
    heavy_job_is_not_starved(1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_heavy_job_is_not_starved_across_partitions() {
    heavy_job_is_not_starved(4).await;
}

/// Bad costs go to the dead-letter topic with a reason naming the field;
/// the good jobs around them are done.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bad_costs_are_dead_lettered_with_their_reason() {
    let bench = Bench::new("costs-bad", 2);
    let down = Downstream::start(always_ok()).await;
    let settings = bench.settings(&down.url);
    let bad = ["0", "-3", "2.5", "\"ten\"", "1e9"];
    let mut records: Vec<(Option<String>, Vec<u8>)> = bad
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let value =
                format!(r#"{{"job_id":"bad-{i}","seller_id":"s","cost":{c},"payload":{{"x":1}}}}"#);
            (None, value.into_bytes())
        })
        .collect();
    records.extend((0..5).map(|i| job_of_cost(&format!("good-{i}"), "s", 2)));
    bench.produce(&records).await;
    let w = Running::start(settings, policy(vec![rule("gcra", 1000, "1s", None)]));
    down.wait_for("the good jobs", Duration::from_secs(30), |a| {
        a.iter().filter(|x| x.job_id.starts_with("good-")).count() >= 5
    })
    .await;
    bench.wait_dead_letters(bad.len(), Duration::from_secs(10));
    w.stop().await;
    let dlq = bench.dead_letters(bad.len(), Duration::ZERO);
    assert_eq!(dlq.len(), bad.len(), "each bad cost is dead-lettered once");
    for (value, headers) in &dlq {
        let reason = headers.get("x-error").cloned().unwrap_or_default();
        assert!(
            reason.contains("cost"),
            "reason names the field: {reason:?} for {}",
            String::from_utf8_lossy(value)
        );
    }
    assert!(
        down.arrivals()
            .iter()
            .all(|a| !a.job_id.starts_with("bad-")),
        "a job with a bad cost reached the downstream"
    );
    assert!(
        down.arrivals().iter().all(|a| a.cost == 2),
        "X-Job-Cost carries the cost"
    );
}
