//! The config's unit tests that load whole settings through
//! [`load_from`]: kept here, beside the loader, so that no section's
//! module reads `load.rs` (which reads them all) and the modules of
//! `config/` import each other with no cycle (issue 51, item 8).

use std::time::Duration;

use super::testing::file;
use super::{load_from, COPY_OVERHEAD_BYTES};

// downstream

#[test]
fn zero_concurrency_is_refused_with_its_origin() {
    let f = file("[downstream]\nconcurrency = 0\n");
    let err = load_from(Some(f.path()), Vec::new())
        .err()
        .expect("must fail");
    assert_eq!(err.key, "downstream.concurrency");
    assert_eq!(err.file, f.path().display().to_string());
    assert_eq!(err.problem, "must be at least 1");
}

#[test]
fn the_adaptive_limits_floor_and_tolerance_are_checked() {
    let cases = [
        (
            "concurrency = 4\nmin_concurrency = 5\n",
            "downstream.min_concurrency",
            "must not be more than downstream.concurrency (the adaptive limit's ceiling)",
        ),
        (
            "min_concurrency = 0\n",
            "downstream.min_concurrency",
            "must be at least 1",
        ),
        (
            "latency_tolerance = 1.0\n",
            "downstream.latency_tolerance",
            "must be more than 1 (the unloaded latency) and at most 100",
        ),
    ];
    for (body, key, problem) in cases {
        let f = file(&format!("[downstream]\n{body}"));
        let err = load_from(Some(f.path()), Vec::new()).err().expect(body);
        assert_eq!(
            (err.key.as_str(), err.problem.as_str()),
            (key, problem),
            "{body}"
        );
    }
    let f = file("[downstream]\nadaptive_concurrency = true\nconcurrency = 16\nmin_concurrency = 16\nlatency_tolerance = 1.5\n");
    let d = load_from(Some(f.path()), Vec::new())
        .expect("loads")
        .settings
        .downstream;
    assert!(d.adaptive_concurrency);
    assert_eq!(
        (d.concurrency, d.min_concurrency, d.latency_tolerance),
        (16, 16, 1.5)
    );
}

// env

#[test]
fn dotted_librdkafka_keys_and_secret_files_come_from_the_environment() {
    let url = file("redis://worker:hunter2@redis:6379\n");
    let sasl = file("s3cret-from-file\n");
    let env = vec![
        (
            "THROTTLE__KAFKA__PROPERTIES__SASL_USERNAME".to_owned(),
            "svc".to_owned(),
        ),
        (
            "THROTTLE__KAFKA__PROPERTIES__SASL_PASSWORD_FILE".to_owned(),
            sasl.path().display().to_string(),
        ),
        (
            "THROTTLE__KAFKA__CONSUMER_PROPERTIES__SESSION.TIMEOUT.MS".to_owned(),
            "6000".to_owned(),
        ),
        (
            "THROTTLE__KAFKA__PRODUCER_PROPERTIES__LINGER_MS".to_owned(),
            "5".to_owned(),
        ),
        (
            "THROTTLE__REDIS__URL_FILE".to_owned(),
            url.path().display().to_string(),
        ),
    ];
    let loaded = load_from(None, env).unwrap();
    let k = &loaded.settings.kafka;
    assert_eq!(k.properties["sasl.username"], "svc");
    assert_eq!(k.properties["sasl.password"], "s3cret-from-file");
    assert_eq!(k.consumer_config()["session.timeout.ms"], "6000");
    assert_eq!(k.consumer_config()["sasl.password"], "s3cret-from-file");
    assert_eq!(k.producer_config()["linger.ms"], "5");
    assert!(!k.consumer_config().contains_key("linger.ms"));
    assert_eq!(
        loaded.settings.redis.url,
        "redis://worker:hunter2@redis:6379"
    );
    let shown = format!("{:?}", loaded.settings);
    assert!(
        !shown.contains("s3cret") && !shown.contains("hunter2"),
        "secrets in Debug: {shown}"
    );

    let env = vec![(
        "THROTTLE__REDIS__URL_FILE".to_owned(),
        "/nonexistent/secret".to_owned(),
    )];
    let e = load_from(None, env).err().unwrap();
    assert_eq!(e.key, "THROTTLE__REDIS__URL_FILE");
    assert!(e.problem.contains("/nonexistent/secret"), "{e}");
}

// kafka

#[test]
fn consumer_and_producer_properties_go_to_their_own_client() {
    let f = file(
        "[kafka.properties]\n\"security.protocol\" = \"SASL_SSL\"\n\"client.id\" = \"tw\"\n\
         [kafka.consumer_properties]\n\"session.timeout.ms\" = \"10000\"\n\"client.id\" = \"tw-consumer\"\n\
         [kafka.producer_properties]\n\"linger.ms\" = \"5\"\n",
    );
    let k = load_from(Some(f.path()), Vec::new())
        .unwrap()
        .settings
        .kafka;
    let c = k.consumer_config();
    let p = k.producer_config();
    assert_eq!(c["security.protocol"], "SASL_SSL");
    assert_eq!(p["security.protocol"], "SASL_SSL");
    assert_eq!(c["client.id"], "tw-consumer", "specific over shared");
    assert_eq!(p["client.id"], "tw");
    assert_eq!(
        c.get("linger.ms"),
        None,
        "producer keys stay out of the consumer"
    );
    assert_eq!(
        p.get("session.timeout.ms"),
        None,
        "consumer keys stay out of the producer"
    );
}

// redis

#[test]
fn the_removed_state_key_names_the_file_the_key_and_the_one_layout() {
    for value in ["v1", "v2", "v1+v2"] {
        let f = file(&format!("[redis]\nstate = \"{value}\"\n"));
        let err = load_from(Some(f.path()), Vec::new())
            .err()
            .expect("a removed key must stop startup");
        let text = err.to_string();
        assert!(text.contains("redis.state was removed"), "{text}");
        assert!(text.contains("one state layout"), "{text}");
        assert!(
            text.contains(&f.path().display().to_string()),
            "names the file: {text}"
        );
    }
}

#[test]
fn cluster_nodes_need_the_cluster_topology_and_are_redacted() {
    let f = file("[redis]\ncluster_nodes = [\"redis://u:secret@10.0.0.2:6379\"]\n");
    let err = load_from(Some(f.path()), Vec::new())
        .err()
        .expect("must fail");
    assert_eq!(err.key, "redis.cluster_nodes");
    let f = file(
        "[redis]\ntopology = \"cluster\"\ncluster_nodes = [\"redis://u:secret@10.0.0.2:6379\"]\n",
    );
    let s = load_from(Some(f.path()), Vec::new()).unwrap().settings;
    assert_eq!(s.redis.cluster_nodes.len(), 1);
    let shown = format!("{:?}", s.redis);
    assert!(!shown.contains("secret"), "{shown}");
}

// settings

/// Defect 5 of issue 20: librdkafka's default `message.max.bytes`
/// (1,000,000) is below the default `worker.max_payload_bytes`
/// (1,048,576), so a job near the limit could never be copied.
#[test]
fn the_producer_is_sized_to_copy_the_largest_job() {
    let s = load_from(None, Vec::new()).unwrap().settings;
    let max: usize = s.producer_config()["message.max.bytes"].parse().unwrap();
    assert!(
        max >= s.worker.max_payload_bytes + COPY_OVERHEAD_BYTES,
        "message.max.bytes {max} for max_payload_bytes {}",
        s.worker.max_payload_bytes
    );
    // Set by hand: kept when large enough, refused naming the key when not.
    let f = file("[kafka.producer_properties]\n\"message.max.bytes\" = \"5000000\"\n");
    let s = load_from(Some(f.path()), Vec::new()).unwrap().settings;
    assert_eq!(s.producer_config()["message.max.bytes"], "5000000");
    let cases = [
        (
            "[kafka.producer_properties]\n\"message.max.bytes\" = \"1000000\"\n",
            "kafka.producer_properties",
            "below worker.max_payload_bytes",
        ),
        (
            "[kafka.properties]\n\"message.max.bytes\" = \"lots\"\n",
            "kafka.properties",
            "not a whole number",
        ),
        (
            "[worker]\nmax_payload_bytes = 2000000000\n",
            "worker.max_payload_bytes",
            "over librdkafka's limit",
        ),
    ];
    for (i, (toml, key, problem)) in cases.into_iter().enumerate() {
        let f = file(toml);
        let err = load_from(Some(f.path()), Vec::new())
            .err()
            .unwrap_or_else(|| panic!("row {i}: must fail"));
        assert_eq!(err.key, key, "row {i}: {err}");
        assert!(err.problem.contains(problem), "row {i}: {err}");
    }
}

#[test]
fn edge_limits_have_defaults_and_are_validated() {
    let s = load_from(None, Vec::new()).unwrap().settings;
    assert_eq!(s.downstream.max_retry_after, Duration::from_secs(3600));
    assert_eq!(s.worker.max_job_cost, 10_000);
    let cases = [
        (
            1,
            "[downstream]\nmax_retry_after = \"0s\"\n",
            "downstream.max_retry_after",
            "must be longer than 0",
        ),
        (
            2,
            "[worker]\nmax_job_cost = 0\n",
            "worker.max_job_cost",
            "must be at least 1",
        ),
        (
            3,
            "[downstream]\nmax_retry_after = \"1000000y\"\n",
            "downstream.max_retry_after",
            "must be at most 7d (longer waits belong to the retry topic)",
        ),
        // Issue 20, defect 8: a huge value overflowed the drain's
        // deadline (Instant + shutdown_timeout).
        (
            4,
            "[worker]\nshutdown_timeout = \"1000000y\"\n",
            "worker.shutdown_timeout",
            "must be at most 1h (an orchestrator kills the process long before)",
        ),
        (
            5,
            "[downstream]\nretry_statuses = [\"5xx\", \"429\"]\n",
            "downstream.retry_statuses",
            "429 always throttles the seller; leave it out",
        ),
        (
            6,
            "[downstream]\noutage_after = 0\n",
            "downstream.outage_after_failures",
            "must be at least 1",
        ),
    ];
    for (row, text, key, problem) in cases {
        let f = file(text);
        let err = load_from(Some(f.path()), Vec::new())
            .err()
            .expect("must fail");
        assert_eq!(
            (err.key.as_str(), err.problem.as_str()),
            (key, problem),
            "row {row}: {err}"
        );
    }
    let f = file("[worker]\nmax_job_cost = -1\n");
    let err = load_from(Some(f.path()), Vec::new())
        .err()
        .expect("negative cost cap");
    assert!(err.to_string().contains("max_job_cost"), "{err}");
}

// tracing

#[test]
fn tracing_settings_are_checked_and_the_endpoint_is_redacted() {
    let env = |k: &str, v: &str| vec![(format!("THROTTLE__TRACING__{k}"), v.to_owned())];
    // (row, variable, value, the key the error must name or None)
    let rows = [
        (1, "OTLP_ENDPOINT", "http://collector:4318", None),
        (
            2,
            "OTLP_ENDPOINT",
            "collector:4318",
            Some("tracing.otlp_endpoint"),
        ),
        (3, "OTLP_ENDPOINT", "http://", Some("tracing.otlp_endpoint")),
        (4, "SAMPLE_RATIO", "0.25", None),
        (5, "SAMPLE_RATIO", "1.5", Some("tracing.sample_ratio")),
        (6, "SAMPLE_RATIO", "-0.1", Some("tracing.sample_ratio")),
        (7, "SERVICE_NAME", " ", Some("tracing.service_name")),
    ];
    for (row, var, value, key) in rows {
        match (load_from(None, env(var, value)), key) {
            (Ok(_), None) => {}
            (Err(e), Some(key)) => assert_eq!(e.key, key, "row {row}: {e}"),
            (Ok(_), Some(key)) => panic!("row {row}: {value:?} accepted for {key}"),
            (Err(e), None) => panic!("row {row}: {value:?} refused: {e}"),
        }
    }
    let loaded = load_from(None, env("OTLP_ENDPOINT", "https://u:s3cret@c:4318")).unwrap();
    let shown = format!("{:?}", loaded.settings);
    assert!(!shown.contains("s3cret"), "{shown}");
    assert!(shown.contains("https://u:***@c:4318"), "{shown}");
}
