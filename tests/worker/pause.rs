//! Pause and resume (issue 22, part 2), end to end: three replicas under
//! load, `throttle-worker limits pause` run as an operator runs it. From one
//! second after a seller's pause until its resume no call of it reaches the
//! downstream, while the other sellers go on at their rates; then every
//! seller is paused and resumed, and no job is lost or dead-lettered.
//! Prints the pause's reaction time (the last call after the command) and
//! the first call after the resume.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use crate::common::cli::{run, stdout_of};
use crate::common::rule;
use crate::common::worker::{always_ok, job, policy, wait_all_calling, Bench, Downstream, Running};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::ClientConfig;

const SELLERS: [&str; 3] = ["paused", "steady-a", "steady-b"];
/// Each seller's load: 10 jobs a second, under a rule of 50 a second, so
/// that every job is called as it comes (the reaction time shows).
const RATE: u64 = 10;

fn calls(down: &Downstream, seller: &str, from: SystemTime, to: SystemTime) -> Vec<SystemTime> {
    down.arrivals()
        .into_iter()
        .filter(|a| a.seller == seller && a.wall >= from && a.wall < to)
        .map(|a| a.wall)
        .collect()
}

fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_paused_seller_stops_within_a_second_on_every_replica_and_nothing_is_lost() {
    let bench = Bench::new("pause", 6);
    let down = Downstream::start(always_ok()).await;
    let rules = || policy(vec![rule("fixed_window", 5 * RATE, "1s", None)]);
    let workers: Vec<Running> = (0..3)
        .map(|_| Running::start(bench.settings(&down.url), rules()))
        .collect();
    wait_all_calling(&bench, &down, 3, Duration::from_secs(60)).await;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("operator.toml");
    std::fs::write(
        &config,
        format!(
            "[redis]\nurl = \"{}\"\nkey_prefix = \"{}\"\n",
            crate::common::redis_url(),
            bench.prefix
        ),
    )
    .unwrap();
    let limits = |args: &[&str]| {
        let mut all = vec!["limits"];
        all.extend_from_slice(args);
        stdout_of(&run(&all, &config))
    };

    // The load: every seller at its rate, produced in steps of 100 ms.
    let producing = Arc::new(AtomicBool::new(true));
    let load = {
        let (producing, bootstrap, topic) = (
            producing.clone(),
            bench.bootstrap(),
            bench.topics.jobs.clone(),
        );
        tokio::spawn(async move {
            // One producer for the whole run, paced by an interval: the
            // load keeps its rate whatever a produce takes.
            let producer: FutureProducer = ClientConfig::new()
                .set("bootstrap.servers", &bootstrap)
                .set("linger.ms", "5")
                .create()
                .unwrap();
            let mut tick = tokio::time::interval(Duration::from_millis(1000 / RATE));
            let mut ids = Vec::new();
            let mut step = 0u64;
            while producing.load(Ordering::Relaxed) {
                tick.tick().await;
                let mut sends = Vec::new();
                for s in SELLERS {
                    let id = format!("{s}-{step}");
                    let (key, value) = job(&id, s);
                    ids.push(id);
                    let producer = producer.clone();
                    let topic = topic.clone();
                    sends.push(tokio::spawn(async move {
                        let mut rec = FutureRecord::to(&topic).payload(value.as_slice());
                        if let Some(k) = &key {
                            rec = rec.key(k.as_str());
                        }
                        producer
                            .send(rec, Duration::from_secs(10))
                            .await
                            .expect("produce");
                    }));
                }
                step += 1;
                drop(sends);
            }
            ids
        })
    };
    tokio::time::sleep(Duration::from_secs(3)).await;

    // One seller paused with an end far off, then resumed by hand.
    let paused_at = SystemTime::now();
    let said = limits(&["pause", "paused", "--for", "25s", "--reason", "INC-7"]);
    let pause_took = paused_at.elapsed().unwrap();
    assert!(said.starts_with("paused seller paused: until "), "{said}");
    let shown = limits(&["show", "paused", "--json"]);
    let shown: serde_json::Value = serde_json::from_str(&shown).unwrap();
    assert_eq!(shown["paused"]["reason"], "INC-7", "{shown}");
    let listed: serde_json::Value = serde_json::from_str(&limits(&["list", "--json"])).unwrap();
    assert_eq!(listed[0]["kind"], "pause", "{listed}");
    assert_eq!(listed[0]["seller"], "paused", "{listed}");
    // What the metrics say meanwhile (the replicas share this process'
    // registry): one seller paused, its jobs waiting for the pause.
    let (mut paused_sellers, mut waiting_paused) = (0.0f64, 0.0f64);
    for _ in 0..12 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        paused_sellers = paused_sellers.max(crate::common::metric("throttle_paused_sellers", &[]));
        waiting_paused = waiting_paused.max(crate::common::metric(
            "throttle_jobs_waiting",
            &[("cause", "paused")],
        ));
    }
    assert_eq!(
        paused_sellers, 1.0,
        "throttle_paused_sellers during the pause"
    );
    assert!(
        waiting_paused > 0.0,
        "throttle_jobs_waiting{{cause=\"paused\"}} stayed 0 during the pause"
    );
    let resumed_at = SystemTime::now();
    assert_eq!(limits(&["resume", "paused"]), "resumed seller paused\n");

    let quiet_from = paused_at + Duration::from_secs(1);
    let during = calls(&down, "paused", quiet_from, resumed_at);
    assert!(
        during.is_empty(),
        "{} calls of the paused seller reached the downstream between 1 s after the pause and the resume",
        during.len()
    );
    let window = resumed_at.duration_since(quiet_from).unwrap();
    for s in &SELLERS[1..] {
        let n = calls(&down, s, quiet_from, resumed_at).len() as f64;
        let rate = n / secs(window);
        assert!(
            rate >= 0.7 * RATE as f64,
            "{s} made {n} calls in {:.1} s of the other seller's pause: {rate:.1}/s (its rate: {RATE}/s)",
            secs(window)
        );
    }
    // The paused seller's last call, from the moment the command was run
    // (negative: before it; the command itself takes some 10s of ms).
    let last_call = calls(
        &down,
        "paused",
        paused_at - Duration::from_secs(3),
        resumed_at,
    )
    .into_iter()
    .max()
    .map(|t| match t.duration_since(paused_at) {
        Ok(d) => d.as_secs_f64() * 1000.0,
        Err(e) => -e.duration().as_secs_f64() * 1000.0,
    });

    // Every seller paused, then resumed.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let first_after_resume = calls(&down, "paused", resumed_at, SystemTime::now())
        .into_iter()
        .min()
        .map(|t| t.duration_since(resumed_at).unwrap());
    let all_at = SystemTime::now();
    let said = limits(&[
        "pause",
        "--all",
        "--yes",
        "--for",
        "20s",
        "--reason",
        "downstream maintenance",
    ]);
    assert!(said.starts_with("paused every seller: "), "{said}");
    tokio::time::sleep(Duration::from_secs(4)).await;
    let all_resumed = SystemTime::now();
    assert_eq!(limits(&["resume", "--all"]), "resumed every seller\n");
    for s in SELLERS {
        let during = calls(&down, s, all_at + Duration::from_secs(1), all_resumed);
        assert!(
            during.is_empty(),
            "{s}: {} calls during the fleet-wide pause",
            during.len()
        );
    }

    tokio::time::sleep(Duration::from_secs(2)).await;
    producing.store(false, Ordering::Relaxed);
    let ids = load.await.unwrap();
    down.wait_for("every job produced", Duration::from_secs(60), |a| {
        let seen: HashSet<&str> = a.iter().map(|x| x.job_id.as_str()).collect();
        ids.iter().all(|id| seen.contains(id.as_str()))
    })
    .await;
    for w in workers {
        w.stop().await;
    }
    let dead = bench.dead_letters(0, Duration::from_millis(500));
    assert!(dead.is_empty(), "{} jobs dead-lettered", dead.len());
    assert_eq!(limits(&["list"]), "no overrides in force\n");
    println!(
        "pause: {} jobs of 3 sellers at {RATE}/s on 3 replicas; the paused seller's last call {:.0?} ms from the start of `limits pause` (the command took {:.0} ms), its first {:?} after `limits resume`; others went on meanwhile",
        ids.len(),
        last_call,
        pause_took.as_secs_f64() * 1000.0,
        first_after_resume,
    );
}
