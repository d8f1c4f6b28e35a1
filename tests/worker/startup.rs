//! The startup checks the book promises: Redis (PING and script load),
//! Kafka (metadata of the jobs topic, every retry tier and the dead-letter
//! topic), the downstream URL and the HTTP listener each stop a worker that
//! cannot work, with an error naming the setting and what to fix; and a
//! worker whose dependencies are all there starts.

use std::time::Duration;

use crate::common::rule;
use crate::common::worker::{always_ok, policy, Bench, Downstream, Running};
use throttle_worker::config::Settings;

/// Starts a worker with `settings` and returns its startup error, in full
/// (every context line), or panics if it started.
async fn startup_error(settings: Settings) -> String {
    let w = Running::start(settings, policy(vec![rule("gcra", 10, "1s", None)]));
    let result = tokio::time::timeout(Duration::from_secs(30), w.handle)
        .await
        .expect("a failed startup returns within 30 s")
        .expect("worker task");
    match result {
        Ok(summary) => {
            panic!("the worker started and stopped ({summary:?}); expected a startup error")
        }
        // In full, as `main` prints it: the error and each of its sources.
        Err(e) => format!("{:#}", anyhow::Error::from(e)),
    }
}

fn assert_names(error: &str, words: &[&str]) {
    for w in words {
        assert!(
            error.contains(w),
            "startup error must mention {w:?}: {error}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_missing_dependency_stops_startup_saying_what_to_fix() {
    let bench = Bench::new("startup", 1);
    let down = Downstream::start(always_ok()).await;

    // (1) Redis not answering: nothing listens on the port.
    let mut s = bench.settings(&down.url);
    s.redis.url = format!("redis://127.0.0.1:{}", crate::common::free_port());
    let e = startup_error(s).await;
    assert_names(&e, &["redis.url", "Redis must answer PING"]);

    // (2) A retry tier missing on the broker: the check covers every topic,
    // not only the jobs topic. A retry topic name with no tiers created.
    let mut s = bench.settings(&down.url);
    s.kafka.retry_topic_prefix = format!("{}-typo", bench.topics.retry);
    let e = startup_error(s).await;
    assert_names(
        &e,
        &[
            "kafka.brokers / topics",
            "-typo.",
            "does not exist",
            "create it",
        ],
    );

    // (3) The dead-letter topic missing.
    let mut s = bench.settings(&down.url);
    s.kafka.dlq_topic = format!("{}-typo", bench.topics.dlq);
    let e = startup_error(s).await;
    assert_names(&e, &["does not exist", "kafka.dlq_topic"]);

    // (4) No broker at all.
    let mut s = bench.settings(&down.url);
    s.kafka.brokers = format!("127.0.0.1:{}", crate::common::free_port());
    let e = startup_error(s).await;
    assert_names(
        &e,
        &["kafka.brokers / topics", "are the brokers reachable?"],
    );

    // (5) A downstream URL that is not one.
    let s = bench.settings("orders-api/v1/jobs");
    let e = startup_error(s).await;
    assert_names(&e, &["downstream.url", "not a valid URL", "http://"]);

    // (6) The HTTP listener's address taken.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let mut s = bench.settings(&down.url);
    s.http.listen = taken.local_addr().unwrap();
    let e = startup_error(s).await;
    assert_names(&e, &["http.listen"]);

    // And with everything in place it starts and stops cleanly.
    let w = Running::start(
        bench.settings(&down.url),
        policy(vec![rule("gcra", 10, "1s", None)]),
    );
    let summary = w.stop().await;
    assert_eq!(summary.abandoned, 0);
}
