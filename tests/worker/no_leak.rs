//! Nothing leaks (issue 11): a worker process run with known secrets (a
//! Redis password given through a `_FILE` secret, a SASL password through
//! the environment) and jobs carrying a payload marker, through a failed
//! start (Redis unreachable), a run with a dead letter, debug logging and
//! a graceful stop. Every log line and a `/metrics` scrape are searched:
//! no secret and no payload appears.

use std::process::Command;
use std::time::{Duration, Instant};

use crate::common::procs::{BrokerProc, Names, Proc, Scratch, TaggedDownstream, BIN};
use crate::common::redis_server::RedisServer;
use crate::common::worker::produce;

const REDIS_PASSWORD: &str = "Redis-Pw-7fq2x";
const SASL_PASSWORD: &str = "Sasl-Pw-k39dz";
const MARKER: &str = "PAYLOAD-MARKER-q8v1";

fn worker(
    dir: &std::path::Path,
    name: &str,
    config: &std::path::Path,
    env: &[(&str, String)],
) -> Proc {
    let mut cmd = Command::new(BIN);
    cmd.arg("run")
        .arg("--config")
        .arg(config)
        .env("THROTTLE_LOG_FORMAT", "json")
        .env("RUST_LOG", "debug");
    for (k, v) in env {
        cmd.env(k, v);
    }
    Proc::spawn(name, cmd, dir, false)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_secret_and_no_payload_reaches_the_logs_or_the_metrics() {
    let dir = Scratch::new("noleak");
    let redis = RedisServer::start();
    let set = Command::new("redis-cli")
        .args([
            "-p",
            &redis.port.to_string(),
            "CONFIG",
            "SET",
            "requirepass",
            REDIS_PASSWORD,
        ])
        .output()
        .expect("redis-cli");
    assert_eq!(String::from_utf8_lossy(&set.stdout).trim(), "OK");
    let secret = dir.path().join("redis-url");
    std::fs::write(
        &secret,
        format!("redis://:{REDIS_PASSWORD}@127.0.0.1:{}\n", redis.port),
    )
    .unwrap();

    let n = Names::new("noleak");
    let broker = BrokerProc::start(dir.path(), &n.topics(2));
    let down = TaggedDownstream::start(Duration::ZERO).await;
    let config = n
        .config(
            &broker.bootstrap,
            r#"[{ algorithm = "gcra", limit = 100, period = "1s" }]"#,
            "5s",
        )
        .write(dir.path(), "worker");
    let sasl = [
        (
            "THROTTLE__KAFKA__PROPERTIES__SASL_USERNAME",
            "svc".to_owned(),
        ),
        (
            "THROTTLE__KAFKA__PROPERTIES__SASL_PASSWORD",
            SASL_PASSWORD.to_owned(),
        ),
        ("THROTTLE__DOWNSTREAM__URL", down.url("w")),
    ];

    // A failed start: Redis unreachable, the URL with its password.
    let closed = crate::common::free_port();
    let mut env = sasl.to_vec();
    env.push((
        "THROTTLE__REDIS__URL",
        format!("redis://:{REDIS_PASSWORD}@127.0.0.1:{closed}"),
    ));
    let mut failed = worker(dir.path(), "failed", &config, &env);
    let status = failed
        .wait_exit("the failed start", Duration::from_secs(30))
        .await;
    assert!(!status.success(), "a worker without Redis must not start");
    assert!(
        failed.log_text().contains(&format!("127.0.0.1:{closed}")),
        "the failure names the server:\n{}",
        failed.log_text()
    );

    // A run: the password from a secret file, jobs with the marker, one
    // malformed record with it (a dead letter), then a graceful stop.
    let mut env = sasl.to_vec();
    env.push(("THROTTLE__REDIS__URL_FILE", secret.display().to_string()));
    let mut run = worker(dir.path(), "worker", &config, &env);
    let mut records: Vec<(Option<String>, Vec<u8>)> = (0..5)
        .map(|i| {
            let v = serde_json::json!({
                "job_id": format!("j{i}"),
                "seller_id": "s",
                "payload": { "title": MARKER },
            });
            (None, v.to_string().into_bytes())
        })
        .collect();
    records.push((
        None,
        format!("{{\"job_id\": \"bad\", \"payload\": \"{MARKER}").into_bytes(),
    ));
    produce(&broker.bootstrap, &n.jobs, &records).await;
    down.wait_distinct("the 5 jobs", 5, Duration::from_secs(30))
        .await;

    let started = Instant::now();
    let http = loop {
        let found = run
            .log_events()
            .into_iter()
            .find(|e| e.message == "worker started")
            .and_then(|e| e.field("http").map(str::to_owned));
        if let Some(h) = found {
            break h;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{}",
            run.log_text()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let metrics_url = format!("http://{http}/metrics");
    let metrics = loop {
        let text = reqwest::get(&metrics_url)
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        if crate::common::metric_in(&text, "throttle_jobs_dead_lettered_total", &[]) >= 1.0 {
            break text;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "no dead letter:\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    run.sigterm();
    assert!(run
        .wait_exit("the graceful stop", Duration::from_secs(20))
        .await
        .success());

    let logs = format!("{}\n{}", failed.log_text(), run.log_text());
    // The paths the secrets and the marker travelled were logged: the
    // dead letter (with its parse error) and each job by id.
    assert!(logs.contains("job dead-lettered"), "{logs}");
    assert!(logs.contains("\"job_id\":\"j0\""), "{logs}");
    assert!(
        logs.lines().count() > 20,
        "debug logging produced too little to mean anything:\n{logs}"
    );
    for (what, text) in [("logs", &logs), ("/metrics", &metrics)] {
        for secret in [REDIS_PASSWORD, SASL_PASSWORD, MARKER] {
            let line = text.lines().find(|l| l.contains(secret));
            assert!(line.is_none(), "{secret} in the {what}: {line:?}");
        }
    }
    drop(redis);
}
