//! Limits changed without a restart (issue 8): a worker process watches the
//! config file it was started with. An invalid edit is rejected with the
//! file, key and problem, and the old limits hold; a valid edit (written
//! the way editors and ConfigMaps do, by rename) is in force within 5 s,
//! as the downstream's rate shows.

mod common;

use std::time::{Duration, Instant};

use common::procs::{start_worker, BrokerProc, Scratch, TaggedDownstream, WorkerConfig};
use common::worker::{job, produce, topic_specs, Topics};

const SLOW: &str = r#"[{ algorithm = "fixed_window", limit = 2, period = "1s" }]"#;
const FAST: &str = r#"[{ algorithm = "fixed_window", limit = 40, period = "1s" }]"#;
const INVALID: &str = r#"[{ algorithm = "fixed_window", limit = 0, period = "1s" }]"#;

/// Calls that arrived in `[from, from + span)`.
fn calls_in(down: &TaggedDownstream, from: Instant, span: Duration) -> usize {
    down.arrivals()
        .iter()
        .filter(|(_, a)| a.at >= from && a.at < from + span)
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limits_edit_is_in_force_within_5_s_and_an_invalid_one_is_rejected() {
    let dir = Scratch::new("reload");
    let id = format!("{:08x}", rand::random::<u32>());
    let topics = Topics {
        jobs: format!("jobs-reload-{id}"),
        retry: format!("retry-reload-{id}"),
        dlq: format!("dlq-reload-{id}"),
    };
    let broker = BrokerProc::start(dir.path(), &topic_specs(&topics, 2));
    let down = TaggedDownstream::start(Duration::ZERO).await;
    let group = format!("group-reload-{id}");
    let prefix = format!("reload-{id}");
    let config = |rules| WorkerConfig {
        bootstrap: &broker.bootstrap,
        group: &group,
        jobs_topic: &topics.jobs,
        retry_topic: &topics.retry,
        dlq_topic: &topics.dlq,
        key_prefix: &prefix,
        rules,
        shutdown_timeout: "5s",
    };
    let path = config(SLOW).write(dir.path(), "worker");
    let worker = start_worker(dir.path(), "worker", &path, &down.url("w"));
    let records: Vec<_> = (0..600).map(|i| job(&format!("r{i}"), "seller")).collect();
    produce(&broker.bootstrap, &topics.jobs, &records).await;
    down.wait_distinct("the first calls", 4, Duration::from_secs(30))
        .await;

    // An invalid edit, written in place: rejected, and 2 a second holds.
    std::fs::write(
        &path,
        std::fs::read_to_string(config(INVALID).write(dir.path(), "invalid")).unwrap(),
    )
    .unwrap();
    let rejected_by = Instant::now() + Duration::from_secs(5);
    let rejection = loop {
        let line = worker
            .log_events()
            .into_iter()
            .find(|e| e.message == "config edit rejected; the limits in force stay");
        if let Some(e) = line {
            break e;
        }
        assert!(
            Instant::now() < rejected_by,
            "no rejection logged within 5 s:\n{}",
            worker.log_text()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let error = rejection.field("error").unwrap_or("").to_owned();
    assert!(
        error.contains("worker.toml") && error.contains("limits.default"),
        "the rejection names the file and the key: {error}"
    );
    let held_from = Instant::now();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let while_invalid = calls_in(&down, held_from, Duration::from_secs(3));
    assert!(
        while_invalid <= 8,
        "{while_invalid} calls in 3 s with a limit of 2 a second: the invalid edit changed the limits"
    );

    // A valid edit, by rename: 40 a second within 5 s.
    let fresh = config(FAST).write(dir.path(), "worker.new");
    std::fs::rename(&fresh, &path).unwrap();
    let edited = Instant::now();
    let deadline = edited + Duration::from_secs(8);
    let in_force_after = loop {
        // The first 500 ms window after the edit with more calls than the
        // old limit could allow in it.
        let now = Instant::now();
        let mut t = edited;
        let mut found = None;
        while t + Duration::from_millis(500) <= now {
            if calls_in(&down, t, Duration::from_millis(500)) > 4 {
                found = Some(t - edited);
                break;
            }
            t += Duration::from_millis(100);
        }
        if let Some(f) = found {
            break f;
        }
        assert!(
            now < deadline,
            "the new limit was not in force 8 s after the edit:\n{}",
            worker.log_text()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let reloaded = worker
        .log_events()
        .into_iter()
        .any(|e| e.message == "limits reloaded; in force on this replica now");
    eprintln!(
        "reload: invalid edit rejected ({while_invalid} calls in the 3 s after it, limit 2/s); \
         the new limit (40/s) was in force {in_force_after:?} after the edit"
    );
    assert!(reloaded, "no 'limits reloaded' line");
    assert!(
        in_force_after <= Duration::from_secs(5),
        "the edit took {in_force_after:?}"
    );
}
