//! `redis.state` (`limiter::layout`): the layout is the setting's, `v2`
//! when unset, never read from what Redis holds, so a fleet with one config
//! runs one layout whatever Redis forgets. The marker a worker writes only
//! stops an unset replica from starting beside `v1` replicas. Against the
//! real Redis, as a worker's start does it, and a fleet of worker processes
//! whose Redis loses its data three ways.

use crate::common::{raw, store, unique_prefix};
use throttle_worker::limiter::layout::{marker_key, resolve, LayoutError, MarkerConflict};
use throttle_worker::limiter::{KeySpace, StateLayout};

async fn marker(prefix: &str) -> Option<String> {
    redis::cmd("GET")
        .arg(marker_key(prefix))
        .query_async(&mut raw().await)
        .await
        .expect("GET the marker")
}

async fn del(key: &str) {
    let _: () = redis::cmd("DEL")
        .arg(key)
        .query_async(&mut raw().await)
        .await
        .unwrap();
}

#[tokio::test]
async fn an_unset_replica_runs_v2_whatever_redis_holds() {
    let store = store().await;
    let prefix = unique_prefix("layout-new");
    // The operator commands read, and write nothing.
    assert_eq!(
        resolve(&store, &prefix, None, false).await.unwrap(),
        StateLayout::V2
    );
    assert_eq!(marker(&prefix).await, None);
    // A worker's start writes what it runs.
    assert_eq!(
        resolve(&store, &prefix, None, true).await.unwrap(),
        StateLayout::V2
    );
    assert_eq!(marker(&prefix).await.as_deref(), Some("v2"));
    // Keys that look like another layout's, with the marker gone (what a
    // Redis that lost its data holds once the v2 replicas wrote again: a
    // seller's call records, its hash), or an older release's rule key,
    // change nothing: the layout is never guessed from keys.
    del(&marker_key(&prefix)).await;
    let keys = KeySpace::new(prefix.clone());
    let rule_key = format!("{prefix}:{{s}}:fixed_window:30:10000000:30");
    for key in [keys.calls("s"), keys.block("s"), rule_key] {
        let _: () = redis::cmd("SET")
            .arg(&key)
            .arg(1)
            .arg("EX")
            .arg(60)
            .query_async(&mut raw().await)
            .await
            .unwrap();
    }
    assert_eq!(
        resolve(&store, &prefix, None, true).await.unwrap(),
        StateLayout::V2
    );
    assert_eq!(marker(&prefix).await.as_deref(), Some("v2"));
    del(&marker_key(&prefix)).await;
}

#[tokio::test]
async fn an_unset_replica_refuses_to_start_beside_v1_replicas() {
    let store = store().await;
    let prefix = unique_prefix("layout-v1");
    // A replica set to v1 runs it, and says so in the marker.
    assert_eq!(
        resolve(&store, &prefix, Some(StateLayout::V1), true)
            .await
            .unwrap(),
        StateLayout::V1
    );
    assert_eq!(marker(&prefix).await.as_deref(), Some("v1"));
    // An unset one would be a second limiter beside it: it refuses, names
    // the marker and the setting, and writes nothing.
    for mark in [true, false] {
        let err = resolve(&store, &prefix, None, mark).await.unwrap_err();
        assert!(
            matches!(err, LayoutError::Conflict(MarkerConflict::V1 { .. })),
            "{err:?}"
        );
        let text = err.to_string();
        assert!(text.contains(&marker_key(&prefix)), "{text}");
        assert!(text.contains("redis.state"), "{text}");
    }
    assert_eq!(marker(&prefix).await.as_deref(), Some("v1"));
    // The rolling deploy sets v1+v2 explicitly: it wins, and is recorded;
    // an unset replica beside v1+v2 ones runs v2, the roll's last step.
    assert_eq!(
        resolve(&store, &prefix, Some(StateLayout::V1V2), true)
            .await
            .unwrap(),
        StateLayout::V1V2
    );
    assert_eq!(marker(&prefix).await.as_deref(), Some("v1+v2"));
    assert_eq!(
        resolve(&store, &prefix, None, true).await.unwrap(),
        StateLayout::V2
    );
    assert_eq!(marker(&prefix).await.as_deref(), Some("v2"));
    del(&marker_key(&prefix)).await;
}

/// A fleet whose Redis forgets everything runs one layout all the same
/// (issue 33, item 1). Three worker processes (`redis.state` unset) take a
/// steady load on the test's own `redis-server`; Redis then loses its data
/// three ways while the fleet runs: a `FLUSHALL`, a restart without
/// persistence, and the eviction of the layout marker alone. After each, a
/// replica is replaced (a kill -9, a SIGTERM, a kill -9) once the running
/// replicas have written state again. Every replica, the first three and
/// each started after a loss, must run the same layout: two layouts side
/// by side are two limiters, each admitting up to the limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_runs_one_layout_whatever_redis_forgets() {
    use crate::common::procs::TaggedDownstream;
    use crate::common::procs::{start_worker_env, wait_settled, BrokerProc, Names, Proc, Scratch};
    use crate::common::redis_server::RedisServer;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    const PARTITIONS: i32 = 4;
    let mut redis = RedisServer::start();
    let redis_url = redis.url();
    let dir = Scratch::new("layout-fleet");
    let n = Names::new("layout");
    let broker = BrokerProc::start(dir.path(), &n.topics(PARTITIONS));
    let down = TaggedDownstream::start(Duration::ZERO).await;
    let config = n
        .config(
            &broker.bootstrap,
            r#"[{ algorithm = "gcra", limit = 20, period = "1s", burst = 5 }]"#,
            "5s",
        )
        .write(dir.path(), "worker");
    let start = |name: &str| {
        start_worker_env(
            dir.path(),
            name,
            &config,
            &down.url(name),
            &[("THROTTLE__REDIS__URL", redis_url.as_str())],
        )
    };
    let mut fleet: Vec<Proc> = ["w0", "w1", "w2"].iter().map(|w| start(w)).collect();
    wait_settled(
        &fleet.iter().collect::<Vec<_>>(),
        &n.jobs,
        PARTITIONS,
        Duration::from_secs(30),
    )
    .await;

    // A steady load for the whole run: 4 sellers, 10 jobs a second each,
    // well within their limits, so every replica keeps calling.
    let stop = Arc::new(AtomicBool::new(false));
    let load = tokio::spawn({
        let stop = stop.clone();
        let bootstrap = broker.bootstrap.clone();
        let topic = n.jobs.clone();
        async move {
            use rdkafka::producer::{FutureProducer, FutureRecord};
            let producer: FutureProducer = rdkafka::ClientConfig::new()
                .set("bootstrap.servers", &bootstrap)
                .set("linger.ms", "5")
                .create()
                .expect("producer");
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                for s in 0..4 {
                    let (key, value) =
                        crate::common::worker::job(&format!("lay-{s}-{i}"), &format!("seller-{s}"));
                    let record = FutureRecord::to(&topic)
                        .key(key.as_deref().unwrap_or(""))
                        .payload(&value);
                    producer
                        .send(record, Duration::from_secs(5))
                        .await
                        .expect("produce a job");
                }
                i += 1;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    });

    // Waits until the fleet has made `n` more calls: the running replicas
    // have written their state to Redis again since the loss.
    let calls_more = |n: usize| {
        let from = down.arrivals().len();
        let down = &down;
        async move {
            let deadline = Instant::now() + Duration::from_secs(30);
            while down.arrivals().len() < from + n {
                assert!(
                    Instant::now() < deadline,
                    "the fleet made no {n} calls in 30 s"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    // Waits for a new replica's startup line naming its layout.
    async fn layout_logged(w: &Proc) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while layouts(w).is_empty() {
            assert!(
                Instant::now() < deadline,
                "{} logged no layout within 20 s",
                w.name
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    fn layouts(w: &Proc) -> Vec<String> {
        w.log_events()
            .iter()
            .filter(|e| e.message == "limiter state layout")
            .filter_map(|e| e.field("layout").map(str::to_owned))
            .collect()
    }
    let port = redis.port.to_string();
    let cli = |args: &[&str]| {
        let out = std::process::Command::new("redis-cli")
            .args(["-p", &port])
            .args(args)
            .output()
            .expect("redis-cli");
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    };
    calls_more(20).await;

    // 1. FLUSHALL; a replica killed and started again.
    assert_eq!(cli(&["FLUSHALL"]), "OK");
    calls_more(20).await;
    fleet[0].kill9();
    fleet.push(start("w0-after-flushall"));
    layout_logged(fleet.last().unwrap()).await;

    // 2. Redis restarts empty; a replica leaves gracefully and comes back.
    redis.stop();
    tokio::time::sleep(Duration::from_millis(500)).await;
    redis.restart();
    calls_more(20).await;
    fleet[1].sigterm();
    fleet[1]
        .wait_exit("w1, on SIGTERM", Duration::from_secs(15))
        .await;
    fleet.push(start("w1-after-restart"));
    layout_logged(fleet.last().unwrap()).await;

    // 3. The marker alone evicted (maxmemory, or a failover to a replica
    // that missed it); a replica killed and started again.
    cli(&[
        "DEL",
        &throttle_worker::limiter::layout::marker_key(&n.prefix),
    ]);
    calls_more(20).await;
    fleet[2].kill9();
    fleet.push(start("w2-after-eviction"));
    layout_logged(fleet.last().unwrap()).await;

    stop.store(true, Ordering::Relaxed);
    load.await.expect("the load task");
    let ran: Vec<(String, Vec<String>)> =
        fleet.iter().map(|w| (w.name.clone(), layouts(w))).collect();
    println!("layouts: {ran:?}");
    for (name, l) in &ran {
        assert_eq!(l.len(), 1, "{name} logged its layout once: {ran:?}");
    }
    assert!(
        ran.iter().all(|(_, l)| l[0] == "v2"),
        "every replica runs one layout, v2 (redis.state unset): {ran:?}"
    );
}
