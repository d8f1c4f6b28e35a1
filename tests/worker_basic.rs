//! The worker end to end on the embedded broker, real Redis and an in-test
//! downstream: bad input, downstream failures and the downstream's 429.

mod common;

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use axum::http::StatusCode;
use common::rule;
use common::worker::{always_ok, job, policy, Bench, Downstream, Running};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn poison_records_are_dead_lettered_with_their_reason_and_good_jobs_are_done() {
    let bench = Bench::new("poison", 3);
    let down = Downstream::start(always_ok()).await;
    let mut settings = bench.settings(&down.url);
    settings.worker.max_payload_bytes = 200;
    let big = serde_json::json!({"job_id": "big", "seller_id": "s1", "payload": "x".repeat(300)})
        .to_string();
    // (row, value, the words x-error must contain)
    let poison: Vec<(u32, Vec<u8>, &str)> = vec![
        (1, b"not json at all".to_vec(), "JSON"),
        (2, br#"{"job_id":"j","payload":{}}"#.to_vec(), "seller_id"),
        (
            3,
            br#"{"job_id":"","seller_id":"s1","payload":{}}"#.to_vec(),
            "job_id",
        ),
        (
            4,
            br#"{"job_id":"j4","seller_id":"s1"}"#.to_vec(),
            "payload",
        ),
        (5, big.into_bytes(), "over the limit of 200 bytes"),
        (6, vec![0xff, 0xfe, 0x00, 0x01], "UTF-8"),
    ];
    let mut records: Vec<(Option<String>, Vec<u8>)> =
        poison.iter().map(|(_, v, _)| (None, v.clone())).collect();
    let good: Vec<String> = (0..30).map(|i| format!("good-{i}")).collect();
    records.extend(
        good.iter()
            .map(|id| job(id, &format!("seller-{}", id.len() % 3))),
    );
    bench.produce(&records).await;

    let w = Running::start(settings, policy(vec![rule("gcra", 1000, "1s", None)]));
    down.wait_for("every good job", Duration::from_secs(20), |a| {
        let ids: HashSet<&str> = a.iter().map(|x| x.job_id.as_str()).collect();
        good.iter().all(|g| ids.contains(g.as_str()))
    })
    .await;
    let dlq = bench.dead_letters(poison.len(), Duration::from_secs(10));
    w.stop().await;
    assert_eq!(
        dlq.len(),
        poison.len(),
        "every poison record must be dead-lettered once: {dlq:?}"
    );
    for (row, value, words) in &poison {
        let (_, headers) = dlq
            .iter()
            .find(|(v, _)| v == value)
            .unwrap_or_else(|| panic!("row {row}: value not found byte for byte in the DLQ"));
        let err = headers.get("x-error").map(String::as_str).unwrap_or("");
        assert!(
            err.contains(words),
            "row {row}: x-error {err:?} must mention {words:?}"
        );
        for h in [
            "x-attempts",
            "x-original-topic",
            "x-original-partition",
            "x-original-offset",
        ] {
            assert!(
                headers.contains_key(h),
                "row {row}: header {h} missing: {headers:?}"
            );
        }
        assert_eq!(headers["x-original-topic"], bench.topics.jobs, "row {row}");
    }
    assert!(
        down.arrivals()
            .iter()
            .all(|a| a.job_id.starts_with("good-")),
        "a poison record reached the downstream"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn downstream_5xx_backs_off_and_dead_letters_after_max_attempts() {
    let bench = Bench::new("fivexx", 2);
    // Seller "broken" always fails; everyone else succeeds.
    let down = Downstream::start(std::sync::Arc::new(|a: &common::worker::Arrival, _| {
        if a.seller == "broken" {
            (StatusCode::INTERNAL_SERVER_ERROR, None)
        } else {
            (StatusCode::OK, None)
        }
    }))
    .await;
    let mut settings = bench.settings(&down.url);
    settings.downstream.max_attempts = 3;
    settings.downstream.backoff_base = Duration::from_millis(100);
    settings.downstream.backoff_max = Duration::from_millis(400);
    let mut records = vec![job("b1", "broken"), job("b2", "broken")];
    records.extend((0..10).map(|i| job(&format!("ok-{i}"), "fine")));
    bench.produce(&records).await;
    let w = Running::start(settings, policy(vec![rule("gcra", 1000, "1s", None)]));
    let dlq = bench.dead_letters(2, Duration::from_secs(20));
    w.stop().await;
    assert_eq!(
        dlq.len(),
        2,
        "both failing jobs must be dead-lettered: {dlq:?}"
    );
    for (_, h) in &dlq {
        assert_eq!(h.get("x-attempts").map(String::as_str), Some("3"), "{h:?}");
        assert!(h["x-error"].contains("3 times"), "{h:?}");
    }
    // Two retries of each failing job counted (the process' metrics: other
    // tests of this binary only add to it).
    assert!(common::metric("throttle_jobs_retried_total", &[]) >= 4.0);
    let arrivals = down.arrivals();
    let mut by_job: HashMap<&str, Vec<std::time::Instant>> = HashMap::new();
    for a in &arrivals {
        by_job.entry(a.job_id.as_str()).or_default().push(a.at);
    }
    for id in ["b1", "b2"] {
        let times = &by_job[id];
        assert_eq!(
            times.len(),
            3,
            "{id}: exactly max_attempts calls, no tight loop: {}",
            times.len()
        );
        for (k, pair) in times.windows(2).enumerate() {
            let gap = pair[1] - pair[0];
            // Equal jitter: the k-th backoff is at least half of base·2^k.
            let floor = Duration::from_millis(50) * 2u32.pow(k as u32);
            assert!(
                gap >= floor,
                "{id}: retry {k} after {gap:?}, backoff floor {floor:?}"
            );
        }
    }
    for i in 0..10 {
        assert!(
            by_job.contains_key(format!("ok-{i}").as_str()),
            "ok-{i} not done"
        );
    }
}

/// A wait longer than `worker.max_inline_delay` goes through the retry
/// topic: the jobs leave memory, come back with `x-not-before`, and are not
/// called before it; meanwhile other sellers flow.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn long_waits_go_through_the_retry_topic_and_are_not_called_early() {
    let bench = Bench::new("retrytopic", 2);
    let down = Downstream::start(always_ok()).await;
    let mut settings = bench.settings(&down.url);
    settings.worker.max_inline_delay = Duration::from_millis(300);
    let mut records: Vec<_> = (0..12).map(|i| job(&format!("slow-{i}"), "slow")).collect();
    records.extend((0..12).map(|i| job(&format!("free-{i}"), "free")));
    bench.produce(&records).await;
    let cfg = throttle_worker::config::LimitsConfig {
        default: vec![rule("gcra", 1000, "1s", None)],
        sellers: [(
            "slow".to_owned(),
            throttle_worker::config::SellerConfig {
                rules: Some(vec![rule("fixed_window", 4, "2s", None)]),
                ..Default::default()
            },
        )]
        .into(),
        ..Default::default()
    };
    let w = Running::start(
        settings,
        throttle_worker::limiter::Policy::from_config(&cfg).unwrap(),
    );
    down.wait_for("all 24 jobs", Duration::from_secs(30), |a| {
        a.iter()
            .map(|x| x.job_id.as_str())
            .collect::<HashSet<_>>()
            .len()
            == 24
    })
    .await;
    w.stop().await;
    let mut per_window: HashMap<u128, usize> = HashMap::new();
    for a in down.arrivals().iter().filter(|a| a.seller == "slow") {
        let us = a
            .wall
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_micros();
        *per_window.entry(us / 2_000_000).or_default() += 1;
    }
    assert!(
        per_window.len() >= 3,
        "12 jobs at 4 per 2 s window need 3 windows: {per_window:?}"
    );
    assert!(
        per_window.values().all(|n| *n <= 4),
        "a deferred job was called early: {per_window:?}"
    );
    let deferred = throttle_worker::telemetry::metrics::metrics()
        .jobs_to_retry_topic
        .get();
    // The first window may end within max_inline_delay (those jobs wait in
    // memory); the wait for the window after it is 2 s: at least the 4 jobs
    // beyond the second window went through the retry topic.
    assert!(
        deferred >= 4,
        "jobs waiting 2 s must go through the retry topic, counted {deferred}"
    );
    // A record taken back from the retry topic before its x-not-before would
    // be refused and deferred again, round and round: at most the 8 jobs
    // beyond the first window, and the 4 of them a full window turns back once more.
    assert!(
        deferred <= 12,
        "jobs went round the retry topic {deferred} times: x-not-before not honoured"
    );
}

/// With `kafka.group_instance_id` set, the replica joins as a static member
/// (the broker accepts `group.instance.id`) and names itself with that id
/// in `X-Worker-Id`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_static_member_works_and_names_itself() {
    let bench = Bench::new("static", 2);
    let down = Downstream::start(always_ok()).await;
    let mut settings = bench.settings(&down.url);
    settings.kafka.group_instance_id = "replica-a".to_owned();
    let w = Running::start(settings, policy(vec![rule("gcra", 1000, "1s", None)]));
    let jobs: Vec<_> = (0..10).map(|i| job(&format!("j{i}"), "s")).collect();
    bench.produce(&jobs).await;
    down.wait_for("10 jobs", Duration::from_secs(20), |a| a.len() >= 10)
        .await;
    w.stop().await;
    let workers: HashSet<String> = down.arrivals().into_iter().map(|a| a.worker).collect();
    assert_eq!(workers, HashSet::from(["replica-a".to_owned()]));
}
