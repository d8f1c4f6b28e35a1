//! Broker faults as the worker sees them (issue 6): the broker goes down
//! and comes back, or answers slowly. The worker reconnects, loses nothing,
//! does not spin while the broker is away, and its event loop keeps
//! turning while Kafka calls are slow (defect 9: no blocking Kafka call on
//! the async threads).

mod common;

use std::collections::HashSet;
use std::time::{Duration, Instant};

use common::procs::{end_offsets, wait_committed_to_end};
use common::rule;
use common::worker::{always_ok, job, policy, Bench, Downstream, Running};

/// CPU seconds this process has used (user + system), from /proc.
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").expect("/proc/self/stat");
    // Fields after the command name (which is in parentheses).
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = f[11].parse::<f64>().unwrap() + f[12].parse::<f64>().unwrap();
    ticks / 100.0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_outage_loses_nothing_and_does_not_spin() {
    let bench = Bench::new("broker-down", 2);
    let down = Downstream::start(always_ok()).await;
    let worker = Running::start(
        bench.settings(&down.url),
        policy(vec![rule("gcra", 1000, "1s", None)]),
    );
    let first: Vec<_> = (0..50)
        .map(|i| job(&format!("a{i}"), &format!("s{}", i % 5)))
        .collect();
    let mut produced = bench.produce(&first).await;
    down.wait_for("the first 50", Duration::from_secs(30), |a| a.len() >= 50)
        .await;
    // Everything finished is committed before the fault, so the at-least-
    // once bound (in flight + finished since the last commit) is 0 here.
    let (bootstrap, group, topic) = (
        bench.bootstrap(),
        bench.group.clone(),
        bench.topics.jobs.clone(),
    );
    wait_committed_to_end(
        &bootstrap,
        &group,
        &topic,
        &end_offsets(&produced),
        Duration::from_secs(20),
    )
    .await;
    bench.broker.broker_down().expect("broker down");
    let cpu_before = cpu_seconds();
    let outage = Duration::from_secs(4);
    tokio::time::sleep(outage).await;
    let cpu = cpu_seconds() - cpu_before;
    bench.broker.broker_up().expect("broker up");
    let back = Instant::now();

    let second: Vec<_> = (0..50)
        .map(|i| job(&format!("b{i}"), &format!("s{}", i % 5)))
        .collect();
    produced.extend(bench.produce(&second).await);
    down.wait_for("all 100 after the outage", Duration::from_secs(60), |a| {
        let ids: HashSet<&str> = a.iter().map(|x| x.job_id.as_str()).collect();
        ids.len() >= 100
    })
    .await;
    let resumed = back.elapsed();
    wait_committed_to_end(
        &bootstrap,
        &group,
        &topic,
        &end_offsets(&produced),
        Duration::from_secs(30),
    )
    .await;
    worker.stop().await;
    let calls = down.count();
    println!(
        "outage {outage:?}: {cpu:.2} CPU s used by the process meanwhile; \
         100 jobs done {resumed:?} after the broker came back; {calls} calls ({} duplicates)",
        calls - 100
    );
    // A loop that spins on a dead broker burns a core (one CPU second per
    // second); reconnect backoff keeps the whole process far below that.
    assert!(
        cpu < outage.as_secs_f64() * 0.5,
        "{cpu:.2} CPU s in a {outage:?} outage: the worker spins"
    );
    assert_eq!(
        calls, 100,
        "nothing was in flight or uncommitted at the fault: no duplicate"
    );
}

/// With every broker response delayed by 1 s, a paced seller's calls keep
/// their pace: the engine's loop never waits on Kafka.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_broker_does_not_stall_the_event_loop() {
    let bench = Bench::new("broker-slow", 1);
    let down = Downstream::start(always_ok()).await;
    let worker = Running::start(
        bench.settings(&down.url),
        // 10 per second, no burst: one call every 100 ms.
        policy(vec![rule("gcra", 10, "1s", Some(1))]),
    );
    let jobs: Vec<_> = (0..40).map(|i| job(&format!("j{i}"), "paced")).collect();
    bench.produce(&jobs).await;
    down.wait_for("the first call", Duration::from_secs(30), |a| !a.is_empty())
        .await;
    // Everything is fetched in the first batch; from now on every commit,
    // poll and metadata call takes a second.
    bench
        .broker
        .set_round_trip_time(Duration::from_secs(1))
        .expect("rtt");
    let slow_from = down.count();
    down.wait_for("20 more calls", Duration::from_secs(30), |a| {
        a.len() >= slow_from + 20
    })
    .await;
    let mut at: Vec<Instant> = down.arrivals().iter().map(|a| a.at).collect();
    at.sort();
    let gaps: Vec<Duration> = at[slow_from..].windows(2).map(|w| w[1] - w[0]).collect();
    let worst = gaps.iter().max().copied().unwrap_or_default();
    println!(
        "broker RTT 1 s: {} calls, worst gap {worst:?} (pace 100 ms)",
        gaps.len() + 1
    );
    bench
        .broker
        .set_round_trip_time(Duration::ZERO)
        .expect("rtt off");
    worker.stop().await;
    // A loop blocked by one Kafka round trip would show a gap of ~1 s.
    assert!(
        worst < Duration::from_millis(500),
        "a call waited {worst:?} behind a slow broker"
    );
}

/// Offset commits and fetches that fail now and then (a flaky coordinator,
/// a leader moving): commits are retried at the next tick, fetching goes
/// on, every job is done once and the group commits to the end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_commits_and_fetches_are_retried_without_loss() {
    use rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr};
    let bench = Bench::new("broker-flaky", 2);
    let down = Downstream::start(always_ok()).await;
    let worker = Running::start(
        bench.settings(&down.url),
        policy(vec![rule("gcra", 1000, "1s", None)]),
    );
    let records: Vec<_> = (0..100)
        .map(|i| job(&format!("f{i}"), &format!("s{}", i % 5)))
        .collect();
    let produced = bench.produce(&records).await;
    bench
        .broker
        .fail_next_requests(
            RDKafkaApiKey::OffsetCommit,
            &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_REQUEST_TIMED_OUT; 10],
        )
        .expect("commit errors");
    bench
        .broker
        .fail_next_requests(
            RDKafkaApiKey::Fetch,
            &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_NOT_LEADER_FOR_PARTITION; 5],
        )
        .expect("fetch errors");
    down.wait_for("all 100", Duration::from_secs(60), |a| {
        a.iter()
            .map(|x| x.job_id.as_str())
            .collect::<HashSet<_>>()
            .len()
            >= 100
    })
    .await;
    bench
        .wait_committed(&produced, Duration::from_secs(30))
        .await;
    worker.stop().await;
    let metrics = throttle_worker::telemetry::metrics::metrics();
    println!(
        "flaky broker: {} commit errors counted (process-wide), {} calls for 100 jobs",
        metrics.offset_commit_errors.get(),
        down.count()
    );
    assert_eq!(
        down.count(),
        100,
        "a failed commit must not make a job run twice"
    );
}
