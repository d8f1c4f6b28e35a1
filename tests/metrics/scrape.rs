//! `/metrics` scraped over HTTP during and after a worker run (issue 8):
//! each series says what the run did, by name and by value where the run
//! makes it known. The metrics are process-wide: nextest runs each test in a
//! process of its own.

use std::time::{Duration, Instant};

use crate::common::worker::{always_ok, job, Bench, Downstream, Running};
use crate::common::{metric_in, rule};
use throttle_worker::config::SellerConfig;

/// One scrape; `None` while the worker's HTTP listener is not up yet (it
/// binds after the startup checks).
async fn scrape(url: &str) -> Option<String> {
    let r = reqwest::get(url).await.ok()?;
    assert_eq!(r.status().as_u16(), 200);
    let ct = r
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    assert!(
        ct.starts_with("application/openmetrics-text"),
        "content type {ct}"
    );
    Some(r.text().await.expect("body"))
}

/// Scrapes until `pred` holds; panics with the last scrape after `timeout`.
async fn scrape_until(
    url: &str,
    what: &str,
    timeout: Duration,
    pred: impl Fn(&str) -> bool,
) -> String {
    let start = Instant::now();
    loop {
        let text = scrape(url).await.unwrap_or_default();
        if pred(&text) {
            return text;
        }
        assert!(
            start.elapsed() < timeout,
            "/metrics never showed {what} within {timeout:?}; last scrape:\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_tell_what_the_worker_does() {
    let bench = Bench::new("metrics", 2);
    let down = Downstream::start(always_ok()).await;
    let mut settings = bench.settings(&down.url);
    let port = crate::common::free_port();
    settings.http.listen = format!("127.0.0.1:{port}").parse().unwrap();
    settings
        .kafka
        .consumer_properties
        .insert("statistics.interval.ms".to_owned(), "300".to_owned());
    let jobs_topic = bench.topics.jobs.clone();
    let group = bench.group.clone();
    let url = format!("http://127.0.0.1:{port}/metrics");
    // "hot" is named in the config: it gets series of its own. The cold
    // sellers are not: they are counted as "other".
    let policy = crate::common::policy_with_sellers(
        vec![rule("fixed_window", 100, "1s", None)],
        vec![(
            "hot",
            SellerConfig {
                rules: Some(vec![rule("fixed_window", 5, "1s", None)]),
                ..Default::default()
            },
        )],
    );
    // Every partition of the jobs topic and the tiers, once both consumers
    // have joined. On a fresh group the mock forms the group with the first
    // member at once and rebalances again for the second, refusing commits
    // meanwhile: the jobs go in once the group is stable, so that the
    // commit-error count below means what it says.
    let partitions = 2.0 * (1 + settings.kafka.retry_tiers().len()) as f64;
    let worker = Running::start(settings, policy);
    scrape_until(
        &url,
        "every partition assigned",
        Duration::from_secs(20),
        |t| metric_in(t, "throttle_assigned_partitions", &[]) == partitions,
    )
    .await;
    let mut records: Vec<_> = (0..30).map(|i| job(&format!("h{i}"), "hot")).collect();
    records.extend((0..10).map(|i| job(&format!("c{i}"), &format!("cold-{i}"))));
    records.push((None, b"{not json".to_vec()));
    records.push((None, b"[1, 2]".to_vec()));
    bench.produce(&records).await;

    // While "hot" is throttled: its backlog is limit-bound, not
    // capacity-bound (a downstream slot would not help it).
    let during = scrape_until(
        &url,
        "hot's limit-bound backlog",
        Duration::from_secs(20),
        |t| {
            metric_in(
                t,
                "throttle_jobs_waiting",
                &[("cause", "limit"), ("seller", "hot")],
            ) > 0.0
        },
    )
    .await;
    assert_eq!(
        metric_in(
            &during,
            "throttle_jobs_waiting",
            &[("cause", "capacity"), ("seller", "hot")]
        ),
        0.0,
        "hot waits for its limit only"
    );
    assert!(metric_in(&during, "throttle_assigned_partitions", &[]) > 0.0);
    // Five more jobs of hot while it is held (its 30 take 6 s at 5 a
    // second, most of it waiting for the next window): each joins its
    // queue without a limiter call of its own. Hot is not held while it
    // asks and calls at the start of each window (a grant that takes the
    // whole ask, one job per partition, names no wait; on a loaded machine
    // that is a fifth of the time), so the jobs go one at a time, each
    // once a scrape has seen hot held, spread over more than a window: one
    // batch of five all landing in those moments failed CI once.
    for i in 30..35 {
        scrape_until(&url, "hot held", Duration::from_secs(10), |t| {
            metric_in(
                t,
                "throttle_jobs_waiting",
                &[("cause", "limit"), ("seller", "hot")],
            ) > 0.0
        })
        .await;
        bench.produce(&[job(&format!("h{i}"), "hot")]).await;
        tokio::time::sleep(Duration::from_millis(230)).await;
    }
    // Alive (the event loop turns) and ready (in the group, Redis answers).
    for (path, body) in [("healthz", "ok\n"), ("readyz", "ready\n")] {
        let r = reqwest::get(format!("http://127.0.0.1:{port}/{path}"))
            .await
            .expect("GET");
        assert_eq!(r.status().as_u16(), 200, "/{path}");
        assert_eq!(r.text().await.unwrap(), body, "/{path}");
    }
    // Read-only: no method but GET is taken anywhere.
    let client = reqwest::Client::new();
    for path in ["healthz", "readyz", "metrics", "limits", ""] {
        for method in [
            reqwest::Method::POST,
            reqwest::Method::PUT,
            reqwest::Method::DELETE,
        ] {
            let r = client
                .request(method.clone(), format!("http://127.0.0.1:{port}/{path}"))
                .body("x")
                .send()
                .await
                .expect("request");
            assert!(
                matches!(r.status().as_u16(), 404 | 405),
                "{method} /{path} answered {}",
                r.status()
            );
        }
    }
    // hot's jobs wait uncommitted: the jobs topic lags, in messages and in
    // time, per partition with the labels lag exporters use, and in sum.
    // A partition's series appears once librdkafka's statistics know its
    // lag (it reports -1 until then, which is left out), so the wait is for
    // both partitions' series, not only for the sum.
    let series = |p: u32| {
        format!("throttle_consumer_lag_messages{{group=\"{group}\",topic=\"{jobs_topic}\",partition=\"{p}\"}}")
    };
    let lagging = scrape_until(&url, "consumer lag", Duration::from_secs(10), |t| {
        metric_in(
            t,
            "throttle_consumer_topic_lag_messages",
            &[("topic", &jobs_topic)],
        ) > 0.0
            && metric_in(
                t,
                "throttle_consumer_lag_seconds",
                &[("topic", &jobs_topic)],
            ) > 0.0
            && t.contains(&series(0))
            && t.contains(&series(1))
    })
    .await;
    let per_partition = metric_in(
        &lagging,
        "throttle_consumer_lag_messages",
        &[("group", &group), ("topic", &jobs_topic)],
    );
    assert_eq!(
        per_partition,
        metric_in(
            &lagging,
            "throttle_consumer_topic_lag_messages",
            &[("group", &group), ("topic", &jobs_topic)]
        ),
        "the topic's lag is the sum of its partitions'"
    );

    down.wait_for("45 jobs", Duration::from_secs(30), |a| a.len() >= 45)
        .await;
    let after = scrape_until(
        &url,
        "every job counted done",
        Duration::from_secs(10),
        |t| {
            metric_in(t, "throttle_jobs_done_total", &[]) >= 45.0
                && metric_in(t, "throttle_jobs_dead_lettered_total", &[]) >= 2.0
        },
    )
    .await;
    worker.stop().await;

    let m = |name: &str, labels: &[(&str, &str)]| metric_in(&after, name, labels);
    assert_eq!(m("throttle_jobs_received_total", &[]), 47.0);
    assert_eq!(m("throttle_jobs_done_total", &[]), 45.0);
    assert_eq!(
        m(
            "throttle_jobs_dead_lettered_total",
            &[("reason", "not_json")]
        ),
        1.0
    );
    assert_eq!(
        m(
            "throttle_jobs_dead_lettered_total",
            &[("reason", "not_object")]
        ),
        1.0
    );
    assert_eq!(
        m("throttle_downstream_requests_total", &[("class", "2xx")]),
        45.0
    );
    assert_eq!(
        m("throttle_downstream_request_duration_seconds_count", &[]),
        45.0
    );
    assert_eq!(m("throttle_jobs_admitted_total", &[]), 45.0);
    assert_eq!(m("throttle_units_admitted_total", &[]), 45.0);
    // 30 jobs of hot at 5 a second take at least 6 grants (a grant that
    // stops short says when to ask again, so refusals may be few); each
    // refusal has its retry-after observed.
    let granted = m(
        "throttle_limiter_decisions_total",
        &[("result", "granted"), ("seller", "hot")],
    );
    assert!(granted >= 7.0, "hot granted {granted} times");
    assert_eq!(
        granted,
        m(
            "throttle_limiter_decisions_total",
            &[("result", "granted"), ("seller", "hot"), ("tier", "seller")]
        ),
        "hot has rules of its own: tier \"seller\""
    );
    // A grant of 5 under a limit of 5 leaves nothing: near the limit.
    let near = m(
        "throttle_limiter_near_limit_total",
        &[("tier", "seller"), ("seller", "hot")],
    );
    assert!(
        near >= 1.0 && near <= granted,
        "near_limit {near} of {granted} grants"
    );
    let avoided = m("throttle_limiter_calls_avoided_total", &[("seller", "hot")]);
    assert!(
        avoided >= 1.0,
        "jobs that arrived while hot was held asked nobody: {avoided}"
    );
    let denied = m(
        "throttle_limiter_decisions_total",
        &[("result", "denied"), ("seller", "hot")],
    );
    assert_eq!(
        denied,
        m(
            "throttle_limiter_decisions_total",
            &[("result", "denied"), ("seller", "hot"), ("by", "rule0")]
        ),
        "hot's one rule refused"
    );
    assert_eq!(m("throttle_limiter_retry_after_seconds_count", &[]), denied);
    assert!(
        m(
            "throttle_limiter_decisions_total",
            &[
                ("result", "granted"),
                ("seller", "other"),
                ("tier", "default")
            ]
        ) >= 1.0
    );
    assert_eq!(
        m("throttle_limiter_near_limit_total", &[("seller", "other")]),
        0.0,
        "one job a second under a limit of 100 is never near it"
    );
    assert!(
        !after.contains("cold-"),
        "an unnamed seller got a series of its own"
    );
    let calls = m("throttle_limiter_calls_total", &[]);
    assert!(calls >= granted + denied, "{calls} limiter calls");
    // Asks are coalesced: every ask rides in exactly one Redis call, and
    // on a single Redis with no global rules a coalesced call is one call.
    assert_eq!(
        m("throttle_limiter_asks_per_call_sum", &[]),
        calls,
        "every limiter ask is carried by a coalesced call"
    );
    assert_eq!(
        m(
            "throttle_redis_call_duration_seconds_count",
            &[("kind", "script")]
        ),
        m("throttle_limiter_asks_per_call_count", &[]),
        "one Redis call per coalesced call on a single Redis with no global rules"
    );
    assert_eq!(m("throttle_limiter_errors_total", &[]), 0.0);
    assert!(m("throttle_rebalances_total", &[]) >= 1.0);
    assert!(m("throttle_offset_commits_total", &[]) >= 1.0);
    assert_eq!(m("throttle_offset_commit_errors_total", &[]), 0.0);
    assert!(
        after.ends_with("# EOF\n"),
        "OpenMetrics text ends with # EOF"
    );
}
