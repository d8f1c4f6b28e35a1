//! Broker faults as the worker sees them (issue 6): the broker goes down
//! and comes back, or answers slowly. The worker reconnects, loses nothing,
//! does not spin while the broker is away, and its event loop keeps
//! turning while Kafka calls are slow (defect 9: no blocking Kafka call on
//! the async threads).

use std::collections::HashSet;
use std::time::{Duration, Instant};

use crate::common::procs::{end_offsets, wait_committed_to_end};
use crate::common::rule;
use crate::common::worker::{always_ok, job, policy, Bench, Downstream, Running};

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

/// A periodic offset commit the broker holds (here the mock cluster, which
/// answers a commit only once a rebalance is over: 2 s with a 3 s session;
/// a coordinator moving to another broker holds commits the same way) must
/// not stop the worker from taking new records: under the cooperative
/// protocol the worker keeps its partitions through the rebalance, and its
/// jobs should keep flowing. Before the fix the poll thread committed
/// synchronously, so one held commit stopped intake until the rebalance was
/// over (found as a 1.6 s gap in `worker::flow`'s precision test).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_commit_does_not_stop_intake() {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    use rdkafka::ClientConfig;

    let bench = Bench::new("held-commit", 2);
    let down = Downstream::start(always_ok()).await;
    let mut settings = bench.settings(&down.url);
    // A record produced just after a fetch went out waits for that fetch's
    // `fetch.wait.max.ms` (500 ms by default) on the mock: short here, so
    // that a job's way to the downstream is far shorter than the margin
    // below.
    settings
        .kafka
        .consumer_properties
        .insert("fetch.wait.max.ms".into(), "20".into());
    let worker = Running::start(
        settings,
        policy(vec![rule("fixed_window", 100_000, "1s", None)]),
    );
    bench.produce(&[job("warm-up", "s-0")]).await;
    down.wait_for("the warm-up job", Duration::from_secs(30), |a| {
        !a.is_empty()
    })
    .await;
    // The worker's own two consumers joined one after the other: let any
    // rebalance of theirs end (the mock holds each for 2 s).
    tokio::time::sleep(Duration::from_secs(3)).await;

    // Another member of the group, on a topic of its own, starts a
    // rebalance; its assignment arrives when the rebalance is over.
    let joiner: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bench.bootstrap())
        .set("group.id", &bench.group)
        .set("session.timeout.ms", "3000")
        .set("heartbeat.interval.ms", "300")
        .set("partition.assignment.strategy", "cooperative-sticky")
        .set("enable.auto.commit", "false")
        .create()
        .expect("joiner");
    joiner.subscribe(&[&bench.topics.dlq]).expect("subscribe");
    let joined = Instant::now();
    let (tx, rx) = std::sync::mpsc::channel();
    let poller = std::thread::spawn(move || {
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            let _ = joiner.poll(Duration::from_millis(20));
            if joiner.assignment().is_ok_and(|a| a.count() > 0) {
                let _ = tx.send(Instant::now());
                break;
            }
        }
    });

    // Jobs go in while the group rebalances, five every 100 ms.
    let mut produced: Vec<(String, Instant)> = Vec::new();
    let settled = loop {
        if let Ok(at) = rx.try_recv() {
            break at;
        }
        assert!(
            joined.elapsed() < Duration::from_secs(20),
            "the joiner got no assignment"
        );
        let ids: Vec<String> = (0..5)
            .map(|i| format!("during-{}-{i}", produced.len()))
            .collect();
        let batch: Vec<_> = ids
            .iter()
            .enumerate()
            .map(|(i, id)| job(id, &format!("s-{i}")))
            .collect();
        let at = Instant::now();
        bench.produce(&batch).await;
        produced.extend(ids.into_iter().map(|id| (id, at)));
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    poller.join().unwrap();
    down.wait_for(
        "every job produced during the rebalance",
        Duration::from_secs(30),
        |a| {
            let ids: HashSet<&str> = a.iter().map(|x| x.job_id.as_str()).collect();
            produced.iter().all(|(id, _)| ids.contains(id.as_str()))
        },
    )
    .await;
    worker.stop().await;

    // The jobs produced well inside the rebalance (from 0.8 s after the
    // join, when the hold has begun, to 0.5 s before its end) must have
    // reached the downstream before the rebalance ended.
    let arrived: std::collections::HashMap<String, Instant> = down
        .arrivals()
        .into_iter()
        .map(|a| (a.job_id, a.at))
        .collect();
    let inside: Vec<&(String, Instant)> = produced
        .iter()
        .filter(|(_, at)| {
            *at >= joined + Duration::from_millis(800)
                && *at + Duration::from_millis(500) <= settled
        })
        .collect();
    let late: Vec<String> = inside
        .iter()
        .filter(|(id, _)| arrived[id] > settled)
        .map(|(id, at)| format!("{id} (produced {:?} before the end)", settled - *at))
        .collect();
    println!(
        "rebalance held {:?}; {} jobs produced inside it, {} arrived only after it",
        settled - joined,
        inside.len(),
        late.len()
    );
    assert!(
        inside.len() >= 10,
        "the rebalance was too short to test ({:?})",
        settled - joined
    );
    assert!(
        late.is_empty(),
        "jobs produced during the rebalance waited for its end: {late:?}"
    );
}
