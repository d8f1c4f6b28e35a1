//! The worker end to end on the embedded broker, real Redis and an in-test
//! downstream: bad input, downstream failures and the downstream's 429.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use crate::common::rule;
use crate::common::worker::{
    always_ok, job, policy, produce_with_headers, Bench, Downstream, Running,
};
use axum::http::StatusCode;
use throttle_worker::config::{OrderingKey, OrderingMode};

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
    bench.wait_dead_letters(poison.len(), Duration::from_secs(10));
    w.stop().await;
    let dlq = bench.dead_letters(poison.len(), Duration::ZERO);
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
        assert!(
            headers.get("x-error-kind").is_some_and(|k| !k.is_empty()),
            "row {row}: a dead letter names its reason kind: {headers:?}"
        );
        assert!(
            !headers.contains_key("x-seller-id"),
            "row {row}: a record that is not a job names no seller: {headers:?}"
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
    let down = Downstream::start(std::sync::Arc::new(
        |a: &crate::common::worker::Arrival, _| {
            if a.seller == "broken" {
                (StatusCode::INTERNAL_SERVER_ERROR, None)
            } else {
                (StatusCode::OK, None)
            }
        },
    ))
    .await;
    let mut settings = bench.settings(&down.url);
    settings.downstream.max_attempts = 3;
    settings.downstream.backoff_base = Duration::from_millis(100);
    settings.downstream.max_backoff = Duration::from_millis(400);
    let mut records = vec![job("b1", "broken"), job("b2", "broken")];
    records.extend((0..10).map(|i| job(&format!("ok-{i}"), "fine")));
    bench.produce(&records).await;
    let w = Running::start(settings, policy(vec![rule("gcra", 1000, "1s", None)]));
    // Both ends are waited for: the good seller's jobs go on beside the
    // failing one's (a partition's records are not ordered across sellers),
    // so neither is known to be done when the other is.
    down.wait_for("every good job", Duration::from_secs(20), |a| {
        (0..10).all(|i| a.iter().any(|x| x.job_id == format!("ok-{i}")))
    })
    .await;
    bench.wait_dead_letters(2, Duration::from_secs(20));
    w.stop().await;
    let dlq = bench.dead_letters(2, Duration::ZERO);
    assert_eq!(
        dead_lettered_ids(&dlq),
        ["b1", "b2"],
        "each failing job dead-lettered exactly once: {dlq:?}"
    );
    for (_, h) in &dlq {
        assert_eq!(h.get("x-attempts").map(String::as_str), Some("3"), "{h:?}");
        assert!(h["x-error"].contains("3 times"), "{h:?}");
        // What `dlq stats` counts by: the metric's reason kind, the seller
        // and the job id, without reading the payload.
        assert_eq!(
            h.get("x-error-kind").map(String::as_str),
            Some("attempts_exhausted"),
            "{h:?}"
        );
        assert_eq!(
            h.get("x-seller-id").map(String::as_str),
            Some("broken"),
            "{h:?}"
        );
        assert!(["b1", "b2"].contains(&h["x-job-id"].as_str()), "{h:?}");
    }
    // Two retries of each failing job counted (the process' metrics: other
    // tests of this binary only add to it).
    assert!(crate::common::metric("throttle_jobs_retried_total", &[]) >= 4.0);
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
    // Each call by the window its grant fell in, on Redis' clock (the
    // limiter's decision time, `X-Granted-At`): exact, whatever each call's
    // own delay from grant to arrival.
    let mut per_window: HashMap<u64, usize> = HashMap::new();
    for a in down.arrivals().iter().filter(|a| a.seller == "slow") {
        let granted = a
            .granted_at_us
            .unwrap_or_else(|| panic!("{}: no X-Granted-At", a.job_id));
        let arrived = a
            .wall
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_micros() as u64;
        assert!(
            arrived + 1_000 >= granted,
            "{} called {} µs before its grant",
            a.job_id,
            granted - arrived
        );
        *per_window.entry(granted / 2_000_000).or_default() += 1;
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

/// A pacer (leaky_bucket) grants units with a go-at instant each, one
/// interval (period / limit = 50 ms) apart; the worker calls every job at
/// or after its go-at (`X-Granted-At`), never at the decision. A worker
/// that ignored the go-at would call a whole grant at once, before the
/// go-ats of all but its first job.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn paced_jobs_are_called_no_earlier_than_their_go_at() {
    const INTERVAL_US: u64 = 50_000;
    let bench = Bench::new("pacer", 2);
    let down = Downstream::start(always_ok()).await;
    let w = Running::start(
        bench.settings(&down.url),
        policy(vec![rule("leaky_bucket", 20, "1s", Some(10))]),
    );
    let jobs: Vec<_> = (0..30).map(|i| job(&format!("lb-{i}"), "paced")).collect();
    bench.produce(&jobs).await;
    down.wait_for("30 paced jobs", Duration::from_secs(30), |a| {
        a.iter()
            .map(|x| x.job_id.as_str())
            .collect::<HashSet<_>>()
            .len()
            == 30
    })
    .await;
    w.stop().await;
    let mut go_ats = Vec::new();
    let mut late_ms = Vec::new();
    for a in down.arrivals() {
        let go_at = a
            .granted_at_us
            .unwrap_or_else(|| panic!("{}: no X-Granted-At", a.job_id));
        let arrived = a
            .wall
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_micros() as u64;
        // Redis' TIME and this process read the same host clock; 1 ms for
        // rounding (the worker waits whole durations from the reply).
        assert!(
            arrived + 1_000 >= go_at,
            "{} called {} µs before its go-at",
            a.job_id,
            go_at - arrived
        );
        late_ms.push(arrived.saturating_sub(go_at) as f64 / 1000.0);
        go_ats.push(go_at);
    }
    go_ats.sort_unstable();
    for pair in go_ats.windows(2) {
        // Each go-at is rounded up to the µs.
        assert!(
            pair[1] - pair[0] + 2 >= INTERVAL_US,
            "go-ats {} µs apart, interval {INTERVAL_US} µs: {go_ats:?}",
            pair[1] - pair[0]
        );
    }
    // The wait was real: 30 units one interval apart span 29 intervals.
    let span = go_ats[go_ats.len() - 1] - go_ats[0];
    assert!(span + 60 >= 29 * INTERVAL_US, "go-ats span {span} µs");
    println!(
        "pacer: 30 jobs over {:.2} s of go-ats; called after the go-at p50 {:.1} ms, max {:.1} ms",
        span as f64 / 1e6,
        crate::common::worker::percentile(&mut late_ms.clone(), 50.0),
        crate::common::worker::percentile(&mut late_ms, 100.0),
    );
}

/// The `job_id` of every dead letter (the record's value is the job as it
/// was consumed), sorted, repeats kept: a job dead-lettered twice shows up
/// twice.
fn dead_lettered_ids(dlq: &[(Vec<u8>, HashMap<String, String>)]) -> Vec<String> {
    let mut ids: Vec<String> = dlq
        .iter()
        .map(|(v, h)| {
            serde_json::from_slice::<serde_json::Value>(v)
                .ok()
                .and_then(|j| j["job_id"].as_str().map(str::to_owned))
                .unwrap_or_else(|| panic!("a dead letter that is not a job: {h:?}"))
        })
        .collect();
    ids.sort();
    ids
}

/// A 4xx other than 429 is the job's fault: dead-lettered at once, after
/// one call, with the status in `x-error`; the seller's other jobs and other
/// sellers go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn other_4xx_is_dead_lettered_at_once() {
    let bench = Bench::new("fourxx", 2);
    let down = Downstream::start(std::sync::Arc::new(
        |a: &crate::common::worker::Arrival, _| {
            if a.job_id.starts_with("bad-") {
                (StatusCode::UNPROCESSABLE_ENTITY, None)
            } else {
                (StatusCode::OK, None)
            }
        },
    ))
    .await;
    let mut settings = bench.settings(&down.url);
    settings.downstream.max_attempts = 5;
    let mut records = vec![job("bad-1", "s"), job("bad-2", "s")];
    records.extend((0..6).map(|i| job(&format!("ok-{i}"), "s")));
    bench.produce(&records).await;
    let w = Running::start(settings, policy(vec![rule("gcra", 1000, "1s", None)]));
    down.wait_for("the six good jobs", Duration::from_secs(20), |a| {
        a.iter().filter(|x| x.job_id.starts_with("ok-")).count() >= 6
    })
    .await;
    bench.wait_dead_letters(2, Duration::from_secs(20));
    w.stop().await;
    let dlq = bench.dead_letters(2, Duration::ZERO);
    assert_eq!(dead_lettered_ids(&dlq), ["bad-1", "bad-2"], "{dlq:?}");
    for (_, h) in &dlq {
        assert_eq!(h.get("x-attempts").map(String::as_str), Some("1"), "{h:?}");
        assert!(
            h["x-error"].contains("422"),
            "x-error names the status: {h:?}"
        );
    }
    for id in ["bad-1", "bad-2"] {
        let calls = down.arrivals().iter().filter(|a| a.job_id == id).count();
        assert_eq!(calls, 1, "{id}: a 4xx is not retried, {calls} calls");
    }
}

/// A call that times out, and one whose connection is refused, are
/// retryable: the worker backs off (the gaps between calls grow at least as
/// the backoff's floor). While the downstream answers nothing at all, a job
/// that used up `downstream.max_attempts` is not dead-lettered: alone, it
/// cannot be told from a dead downstream (issue 20: an outage is not the
/// job's fault). It waits, and is done once the downstream answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn timeouts_and_dropped_connections_back_off_and_wait_for_the_downstream() {
    // Timeouts: every answer takes 2 s, the worker waits 200 ms.
    let bench = Bench::new("timeout", 1);
    let down = Downstream::start(always_ok()).await;
    down.set_delay(Duration::from_secs(2));
    let mut settings = bench.settings(&down.url);
    settings.downstream.timeout = Duration::from_millis(200);
    settings.downstream.max_attempts = 3;
    settings.downstream.backoff_base = Duration::from_millis(100);
    settings.downstream.max_backoff = Duration::from_millis(400);
    bench.produce(&[job("slow-1", "s")]).await;
    let w = Running::start(settings, policy(vec![rule("gcra", 1000, "1s", None)]));
    down.wait_for("five calls", Duration::from_secs(30), |a| a.len() >= 5)
        .await;
    let times: Vec<_> = down.arrivals().iter().map(|a| a.at).collect();
    for (k, pair) in times.windows(2).take(2).enumerate() {
        // The call waited out its 200 ms timeout (less up to 50 ms for
        // the difference between two requests' transit), then at least
        // half of base·2^k (equal jitter).
        let floor = Duration::from_millis(150) + Duration::from_millis(50) * 2u32.pow(k as u32);
        assert!(
            pair[1] - pair[0] >= floor,
            "retry {k} after {:?}, timeout plus backoff floor {floor:?}",
            pair[1] - pair[0]
        );
    }
    // Past max_attempts, the downstream has answered nothing: no dead
    // letter. Once it answers, the job is done.
    down.set_delay(Duration::ZERO);
    bench
        .wait_committed(&[(0, 0)], Duration::from_secs(30))
        .await;
    w.stop().await;
    let dlq = bench.dead_letters(0, Duration::ZERO);
    assert!(
        dlq.is_empty(),
        "dead-lettered while the downstream was down: {dlq:?}"
    );

    // Dropped: every connection is accepted and closed at once, with no
    // answer (the accepts count this test's calls alone).
    let bench = Bench::new("dropped", 1);
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!(
        "http://127.0.0.1:{}/registrations",
        listener.local_addr().unwrap().port()
    );
    let accepted = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    {
        let accepted = accepted.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                if conn.is_ok() {
                    accepted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                }
            }
        });
    }
    let calls = || accepted.load(std::sync::atomic::Ordering::SeqCst);
    let mut settings = bench.settings(&url);
    settings.downstream.max_attempts = 3;
    settings.downstream.backoff_base = Duration::from_millis(200);
    settings.downstream.max_backoff = Duration::from_millis(800);
    bench.produce(&[job("nobody-1", "s")]).await;
    let started = std::time::Instant::now();
    let w = Running::start(settings, policy(vec![rule("gcra", 1000, "1s", None)]));
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while calls() < 5 {
        assert!(std::time::Instant::now() < deadline, "five calls in 30 s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let took = started.elapsed();
    w.stop().await;
    // Backoffs of at least 100, 200, 400 and 400 ms (equal jitter: half of
    // base·2^k, capped) between five calls: not a tight loop.
    assert!(
        took >= Duration::from_millis(1100),
        "five calls {took:?} after start: no backoff"
    );
    let dlq = bench.dead_letters(0, Duration::ZERO);
    assert!(
        dlq.is_empty(),
        "dead-lettered while nothing answered: {dlq:?}"
    );
}

/// A record whose worker headers (`x-attempts`, `x-not-before`, …) do not
/// parse is dead-lettered with the header named, never called, and does
/// not hold up the job behind it on its partition.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn unreadable_worker_headers_are_dead_lettered() {
    let bench = Bench::new("badheaders", 1);
    let down = Downstream::start(always_ok()).await;
    let (_, value) = job("garbled", "s");
    crate::common::worker::produce_with_headers(
        &bench.bootstrap(),
        &bench.topics.jobs,
        0,
        &value,
        &[("x-attempts", "many".to_owned())],
    )
    .await;
    bench.produce(&[job("after", "s")]).await;
    let w = Running::start(
        bench.settings(&down.url),
        policy(vec![rule("gcra", 1000, "1s", None)]),
    );
    down.wait_for("the job behind it", Duration::from_secs(20), |a| {
        a.iter().any(|x| x.job_id == "after")
    })
    .await;
    bench.wait_dead_letters(1, Duration::from_secs(20));
    w.stop().await;
    let dlq = bench.dead_letters(1, Duration::ZERO);
    assert_eq!(dead_lettered_ids(&dlq), ["garbled"], "{dlq:?}");
    let err = &dlq[0].1["x-error"];
    assert!(
        err.contains("unreadable worker header") && err.contains("x-attempts"),
        "{err}"
    );
    assert!(
        down.arrivals().iter().all(|a| a.job_id != "garbled"),
        "a record with unreadable headers reached the downstream"
    );
}

/// Under `worker.ordering = "seller"`, one seller's jobs of one partition
/// reach the downstream in offset order, though the partitions run side by
/// side and a grant covers many jobs (each answer takes 20 ms, so calls of
/// different partitions overlap). Judged by the order the downstream
/// recorded them in, not by a clock.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_sellers_jobs_of_one_partition_arrive_in_offset_order() {
    let bench = Bench::new("order", 3);
    let down = Downstream::start(always_ok()).await;
    down.set_delay(Duration::from_millis(20));
    let mut records = Vec::new();
    for i in 0..60 {
        records.push(job(&format!("a-{i}"), "a"));
        records.push(job(&format!("b-{i}"), "b"));
    }
    let produced = bench.produce(&records).await;
    let position: HashMap<String, (i32, i64)> = records
        .iter()
        .zip(&produced)
        .map(|((_, v), pos)| {
            let j: serde_json::Value = serde_json::from_slice(v).unwrap();
            (j["job_id"].as_str().unwrap().to_owned(), *pos)
        })
        .collect();
    let mut settings = bench.settings(&down.url);
    settings.worker.ordering = OrderingMode::Seller;
    let w = Running::start(settings, policy(vec![rule("gcra", 1000, "1s", Some(100))]));
    down.wait_for("all 120 jobs", Duration::from_secs(30), |a| {
        a.iter()
            .map(|x| x.job_id.as_str())
            .collect::<HashSet<_>>()
            .len()
            == 120
    })
    .await;
    w.stop().await;
    // Offsets of each (seller, partition) in the order they arrived (first
    // call of each job).
    let mut seen = HashSet::new();
    let mut order: HashMap<(String, i32), Vec<i64>> = HashMap::new();
    for a in down.arrivals() {
        if !seen.insert(a.job_id.clone()) {
            continue;
        }
        let (p, o) = position[&a.job_id];
        order.entry((a.seller.clone(), p)).or_default().push(o);
    }
    let mut partitions = HashSet::new();
    for ((seller, p), offsets) in &order {
        partitions.insert(*p);
        assert!(
            offsets.windows(2).all(|w| w[0] < w[1]),
            "{seller}, partition {p}: arrived in offset order {offsets:?}"
        );
    }
    assert_eq!(partitions.len(), 3, "the jobs spread over every partition");
}

/// Issue 50, under the default ordering (`key`, read from `payload.sku`):
/// one seller's records keyed by the seller (so all in one partition) for
/// three products. Each product's jobs reach the downstream one at a time
/// (each answer takes 20 ms: the next of a product cannot arrive before
/// it) and in offset order, while the products run side by side.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_products_jobs_arrive_one_at_a_time_in_order_beside_other_products() {
    const CALL: Duration = Duration::from_millis(20);
    let bench = Bench::new("by-key", 3);
    let down = Downstream::start(always_ok()).await;
    down.set_delay(CALL);
    let products = ["red", "green", "blue"];
    let records: Vec<_> = (0..60)
        .map(|i| {
            let value = serde_json::json!({
                "job_id": format!("j-{i}"),
                "seller_id": "s",
                "payload": { "sku": products[i % 3], "n": i }
            });
            (Some("s".to_owned()), value.to_string().into_bytes())
        })
        .collect();
    let produced = bench.produce(&records).await;
    assert!(
        produced.iter().all(|p| p.0 == produced[0].0),
        "keyed by seller: one partition"
    );
    let w = Running::start(
        bench.settings(&down.url),
        policy(vec![rule("gcra", 1000, "1s", Some(100))]),
    );
    down.wait_for("all 60 jobs", Duration::from_secs(30), |a| a.len() >= 60)
        .await;
    w.stop().await;
    assert_products_in_order(down.arrivals(), &products, CALL);
}

/// Each product's jobs (job `j-i` is product `i % 3`) arrived one at a
/// time (none before the previous one's answer, `call` after it) and in
/// order, each once, while the products' calls overlapped.
fn assert_products_in_order(
    mut arrivals: Vec<crate::common::worker::Arrival>,
    products: &[&str],
    call: Duration,
) {
    arrivals.sort_by_key(|a| a.at);
    assert_eq!(arrivals.len(), 60, "each job called once");
    let index = |id: &str| id.trim_start_matches("j-").parse::<usize>().unwrap();
    let mut last: HashMap<usize, (usize, std::time::Instant)> = HashMap::new();
    let mut side_by_side = 0;
    for (k, a) in arrivals.iter().enumerate() {
        let i = index(&a.job_id);
        if let Some((prev, at)) = last.insert(i % 3, (i, a.at)) {
            assert!(
                prev < i,
                "{}: job {i} called after job {prev}",
                products[i % 3]
            );
            assert!(
                a.at >= at + call,
                "{}: job {i} arrived {:?} after job {prev}, before its answer",
                products[i % 3],
                a.at - at
            );
        }
        side_by_side += usize::from(k > 0 && a.at < arrivals[k - 1].at + call);
    }
    assert!(
        side_by_side > 10,
        "the products' calls ran side by side ({side_by_side} overlapping)"
    );
}

/// The same, the ordering key read from a header
/// (`worker.ordering_key = "header:product-id"`): the records name no
/// product in their value and have no key, all on one partition.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_ordering_key_can_come_from_a_header() {
    const CALL: Duration = Duration::from_millis(20);
    let bench = Bench::new("by-header", 1);
    let down = Downstream::start(always_ok()).await;
    down.set_delay(CALL);
    let products = ["red", "green", "blue"];
    for i in 0..60 {
        let value =
            serde_json::json!({"job_id": format!("j-{i}"), "seller_id": "s", "payload": {"n": i}});
        produce_with_headers(
            &bench.bootstrap(),
            &bench.topics.jobs,
            0,
            value.to_string().as_bytes(),
            &[("product-id", products[i % 3].to_owned())],
        )
        .await;
    }
    let mut settings = bench.settings(&down.url);
    settings.worker.ordering_key = OrderingKey::parse("header:product-id").unwrap();
    let w = Running::start(settings, policy(vec![rule("gcra", 1000, "1s", Some(100))]));
    down.wait_for("all 60 jobs", Duration::from_secs(30), |a| a.len() >= 60)
        .await;
    w.stop().await;
    assert_products_in_order(down.arrivals(), &products, CALL);
}
