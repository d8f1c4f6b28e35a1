//! `throttle-worker dlq replay` (issue 22, part 1): the dead letters of one
//! reason and seller written back to the jobs topic, each exactly once,
//! through a SIGKILL halfway and a second run, and again only with
//! `--again`. The binary runs against the mock broker and the test Redis.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::cli::{run, stdout_of};
use rdkafka::types::RDKafkaApiKey;
use throttle_worker::kafka::{
    DevBroker, OriginalRecord, Position, ReadRecord, RecordSink, TopicReader, Verdict,
};
use throttle_worker::limiter::{KeySpace, RedisStore};

const JOBS: &str = "jobs";
const DLQ: &str = "jobs.dlq";

fn job(job_id: &str, seller: &str) -> String {
    format!(r#"{{"job_id":"{job_id}","seller_id":"{seller}","payload":{{"sku":"{job_id}"}}}}"#)
}

/// 12 `attempts_exhausted` of s-1, 4 of s-2, 3 `not_json`: their job ids.
async fn dead_letters(broker: &DevBroker) {
    let sink = RecordSink::new(broker.bootstrap_servers(), &BTreeMap::new()).unwrap();
    let mut offset = 0i64;
    let mut all: Vec<(&str, Option<&str>, String)> = Vec::new();
    all.extend((0..12).map(|i| ("attempts_exhausted", Some("s-1"), format!("a-{i}"))));
    all.extend((0..4).map(|i| ("attempts_exhausted", Some("s-2"), format!("b-{i}"))));
    all.extend((0..3).map(|i| ("not_json", None, format!("n-{i}"))));
    for (kind, seller, id) in all {
        offset += 1;
        let value = match seller {
            Some(s) => job(&id, s),
            None => format!("not json {id}"),
        };
        let original = OriginalRecord {
            origin: Position {
                topic: JOBS.into(),
                partition: (offset % 3) as i32,
                offset,
            },
            key: Some(format!("product-{id}").into_bytes()),
            value: bytes::Bytes::from(value),
            trace: Default::default(),
        };
        let verdict = Verdict {
            kind,
            reason: "for the test",
            attempts: 5,
            seller,
            job_id: seller.map(|_| id.as_str()),
        };
        sink.dead_letter(DLQ, &original, &verdict).await.unwrap();
    }
}

fn config(dir: &Path, brokers: &str, prefix: &str) -> std::path::PathBuf {
    let path = dir.join("replay.toml");
    std::fs::write(
        &path,
        format!(
            "[kafka]\nbrokers = \"{brokers}\"\ntopic = \"{JOBS}\"\ndlq_topic = \"{DLQ}\"\n\n\
             [redis]\nurl = \"{}\"\nkey_prefix = \"{prefix}\"\n",
            crate::common::redis_url()
        ),
    )
    .unwrap();
    path
}

/// Every record of `topic` now, values kept.
fn read_all(brokers: &str, topic: &str) -> Vec<ReadRecord> {
    let mut reader = TopicReader::open(brokers, &BTreeMap::new(), topic)
        .unwrap()
        .keep_values();
    let ends = reader.end_offsets().unwrap();
    reader.read_to_end(&ends, Duration::from_secs(15)).unwrap()
}

/// The replayed records of the jobs topic, by the dead letter they name.
fn replayed(brokers: &str) -> HashMap<String, Vec<ReadRecord>> {
    let mut by: HashMap<String, Vec<ReadRecord>> = HashMap::new();
    for r in read_all(brokers, JOBS) {
        let from = r
            .header("x-replayed-from")
            .expect("only replays are written to this jobs topic")
            .to_owned();
        by.entry(from).or_default().push(r);
    }
    by
}

fn summary(out: &str) -> serde_json::Value {
    serde_json::from_str(out.lines().last().expect("a summary line")).expect("JSON summary")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_killed_halfway_and_run_again_writes_each_record_once() {
    let broker = DevBroker::start(&[(JOBS.into(), 3), (DLQ.into(), 2)]).unwrap();
    let brokers = broker.bootstrap_servers().to_owned();
    dead_letters(&broker).await;
    let dir = tempfile::tempdir().unwrap();
    let prefix = crate::common::unique_prefix("dlqreplay");
    let cfg = config(dir.path(), &brokers, &prefix);
    let select = ["--kind", "attempts_exhausted", "--seller", "s-1"];

    // A dry run writes nothing.
    let mut args = vec!["dlq", "replay", "--dry-run"];
    args.extend(select);
    let listed = stdout_of(&run(&args, &cfg));
    assert_eq!(
        listed.lines().filter(|l| l.contains("seller=s-1")).count(),
        12,
        "{listed}"
    );
    assert!(listed.contains("would replay 12 of 12"), "{listed}");
    assert!(
        read_all(&brokers, JOBS).is_empty(),
        "a dry run wrote nothing"
    );

    // Paced to 8 a second and killed once a few are written.
    let mut child = Command::new(env!("CARGO_BIN_EXE_throttle-worker"))
        .args(["dlq", "replay", "--yes", "--rate", "8"])
        .args(select)
        .arg("--config")
        .arg(&cfg)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let written: i64 = {
            let b = brokers.clone();
            tokio::task::spawn_blocking(move || {
                TopicReader::open(&b, &BTreeMap::new(), JOBS)
                    .unwrap()
                    .end_offsets()
                    .unwrap()
                    .values()
                    .sum()
            })
            .await
            .unwrap()
        };
        if written >= 4 {
            break;
        }
        assert!(Instant::now() < deadline, "the replay wrote nothing");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    child.kill().expect("SIGKILL");
    child.wait().unwrap();
    let before = replayed(&brokers);
    println!("killed after {} of 12 replayed", before.len());
    assert!(before.len() < 12, "the kill came too late to test a resume");

    // Run again: the rest, and nothing twice.
    let mut args = vec!["dlq", "replay", "--json", "--yes"];
    args.extend(select);
    let second = summary(&stdout_of(&run(&args, &cfg)));
    println!("second run: {second}");
    let after = replayed(&brokers);
    assert_eq!(after.len(), 12, "every selected dead letter replayed");
    for (from, copies) in &after {
        assert_eq!(copies.len(), 1, "{from} replayed {} times", copies.len());
        let r = &copies[0];
        let value = String::from_utf8(r.value.clone().unwrap()).unwrap();
        assert!(value.contains("\"seller_id\":\"s-1\""), "{from}: {value}");
        assert!(
            r.header("x-attempts").is_none() && r.header("x-error").is_none(),
            "{from}: a replayed job starts with fresh attempts: {:?}",
            r.headers
        );
        assert!(r.key.as_deref().unwrap().starts_with(b"product-a-"));
    }
    assert_eq!(
        second["replayed"].as_u64().unwrap()
            + second["already"].as_u64().unwrap()
            + second["recovered"].as_u64().unwrap(),
        12,
        "{second}"
    );

    // The same replay once more: nothing.
    let third = summary(&stdout_of(&run(&args, &cfg)));
    assert_eq!(third["replayed"], 0, "{third}");
    assert_eq!(third["already"], 12, "{third}");
    assert_eq!(replayed(&brokers).len(), 12);

    // With --again: each once more.
    let mut again = args.clone();
    again.push("--again");
    let fourth = summary(&stdout_of(&run(&again, &cfg)));
    assert_eq!(fourth["replayed"], 12, "{fourth}");
    assert!(replayed(&brokers).values().all(|c| c.len() == 2));
}

/// A run killed between its marker and the broker's acknowledgement leaves
/// a `pending` marker: the next run writes the record only if the jobs
/// topic does not hold it already.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pending_marker_is_settled_by_reading_the_jobs_topic() {
    let broker = DevBroker::start(&[(JOBS.into(), 3), (DLQ.into(), 2)]).unwrap();
    let brokers = broker.bootstrap_servers().to_owned();
    dead_letters(&broker).await;
    let dir = tempfile::tempdir().unwrap();
    let prefix = crate::common::unique_prefix("dlqpending");
    let cfg = config(dir.path(), &brokers, &prefix);

    // The four dead letters of s-2, as the replay will see them.
    let s2: Vec<ReadRecord> = read_all(&brokers, DLQ)
        .into_iter()
        .filter(|r| r.header("x-seller-id") == Some("s-2"))
        .collect();
    assert_eq!(s2.len(), 4);
    let from = |r: &ReadRecord| format!("{DLQ}:{}:{}", r.partition, r.offset);
    // Interrupted runs: the first got its copy written (into partition 0,
    // from offset 0), the second did not.
    let store = RedisStore::connect(&crate::common::redis_url(), Duration::from_secs(5))
        .await
        .unwrap();
    let markers = KeySpace::new(prefix.clone()).dlq_replay(DLQ);
    let ttl = Duration::from_secs(60);
    for r in &s2[..2] {
        let field = format!("{}:{}", r.partition, r.offset);
        store
            .set_hash_field(&markers, &field, "pending 0 0", ttl)
            .await
            .unwrap();
    }
    let sink = RecordSink::new(&brokers, &BTreeMap::new()).unwrap();
    let first = from(&s2[0]);
    sink.produce_to(
        JOBS,
        0,
        s2[0].key.as_deref(),
        s2[0].value.as_deref().unwrap(),
        &[("x-replayed-from", first.as_bytes())],
    )
    .await
    .unwrap();

    let done = summary(&stdout_of(&run(
        &["dlq", "replay", "--yes", "--json", "--seller", "s-2"],
        &cfg,
    )));
    assert_eq!(done["recovered"], 1, "{done}");
    assert_eq!(done["replayed"], 3, "{done}");
    let after = replayed(&brokers);
    assert_eq!(after.len(), 4);
    assert!(
        after.values().all(|c| c.len() == 1),
        "nothing twice: {after:?}"
    );
}

/// Regression (replay was one copy at a time): a replay killed with several
/// copies under way, each with its own `pending` marker naming its jobs
/// partition and offset, some of them written to the jobs topic and none
/// acknowledged. The next run finds the written ones (one read per jobs
/// partition), writes the others, and each dead letter is in the jobs topic
/// exactly once. One-at-a-time replay never had two markers pending, so
/// this test timed out waiting for them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_killed_with_several_copies_under_way_writes_each_once() {
    let broker = DevBroker::start(&[(JOBS.into(), 3), (DLQ.into(), 2)]).unwrap();
    let brokers = broker.bootstrap_servers().to_owned();
    dead_letters(&broker).await;
    let dir = tempfile::tempdir().unwrap();
    let prefix = crate::common::unique_prefix("dlqpipe");
    let cfg = config(dir.path(), &brokers, &prefix);
    let markers = KeySpace::new(prefix.clone()).dlq_replay(DLQ);
    let mut redis = crate::common::raw().await;

    // The replay's first Produce is written at once but answered a minute
    // later, and every later answer to that producer waits behind it: its
    // copies reach the jobs topic, and none is acknowledged.
    broker
        .delay_answers(RDKafkaApiKey::Produce, 1, Duration::from_secs(60))
        .unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_throttle-worker"))
        .args(["dlq", "replay", "--kind", "attempts_exhausted"])
        .arg("--config")
        .arg(&cfg)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let marks = loop {
        let b = brokers.clone();
        let written: i64 = tokio::task::spawn_blocking(move || {
            TopicReader::open(&b, &BTreeMap::new(), JOBS)
                .unwrap()
                .end_offsets()
                .unwrap()
                .values()
                .sum()
        })
        .await
        .unwrap();
        let marks: HashMap<String, String> = redis::cmd("HGETALL")
            .arg(&markers)
            .query_async(&mut redis)
            .await
            .unwrap();
        let pending = marks.values().filter(|m| m.starts_with("pending ")).count();
        if written >= 2 && pending >= 2 {
            break marks;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "no kill with two copies under way: {written} in the jobs topic, markers {marks:?}"
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    child.kill().expect("SIGKILL");
    child.wait().unwrap();
    assert!(
        marks.values().all(|m| m.starts_with("pending ")),
        "nothing was acknowledged, so nothing is done: {marks:?}"
    );
    // What the killed run got into the jobs topic (its last requests had
    // been sent before the kill; give them a moment to land).
    tokio::time::sleep(Duration::from_millis(200)).await;
    let b = brokers.clone();
    let at_kill = tokio::task::spawn_blocking(move || replayed(&b))
        .await
        .unwrap();
    println!(
        "killed with {} markers pending, {} copies written",
        marks.len(),
        at_kill.len()
    );
    assert!(at_kill.values().all(|c| c.len() == 1), "{at_kill:?}");

    let second = summary(&stdout_of(&run(
        &["dlq", "replay", "--json", "--kind", "attempts_exhausted"],
        &cfg,
    )));
    println!("second run: {second}");
    assert_eq!(
        second["recovered"].as_u64(),
        Some(at_kill.len() as u64),
        "each copy the killed run wrote is found, not written again: {second}"
    );
    assert_eq!(
        second["replayed"].as_u64().unwrap() + second["recovered"].as_u64().unwrap(),
        16,
        "{second}"
    );
    let b = brokers.clone();
    let after = tokio::task::spawn_blocking(move || replayed(&b))
        .await
        .unwrap();
    assert_eq!(after.len(), 16, "every attempts_exhausted dead letter");
    for (from, copies) in &after {
        assert_eq!(copies.len(), 1, "{from} replayed {} times", copies.len());
    }
    let third = summary(&stdout_of(&run(
        &["dlq", "replay", "--json", "--kind", "attempts_exhausted"],
        &cfg,
    )));
    assert_eq!(third["already"], 16, "{third}");
}

/// `--rate` bounds a pipelined replay: with 64 copies allowed under way,
/// the copies still leave at most R a second. Their producer timestamps
/// are taken as each is sent, a Redis write after its paced start, so a
/// gap may lose that write's jitter: no burst (every gap at least half of
/// 1/R), and 12 copies span at least 11/R less 50 ms.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rate_spaces_the_copies_of_a_pipelined_replay() {
    let broker = DevBroker::start(&[(JOBS.into(), 3), (DLQ.into(), 2)]).unwrap();
    let brokers = broker.bootstrap_servers().to_owned();
    dead_letters(&broker).await;
    let dir = tempfile::tempdir().unwrap();
    let prefix = crate::common::unique_prefix("dlqrate");
    let cfg = config(dir.path(), &brokers, &prefix);
    let done = summary(&stdout_of(&run(
        &[
            "dlq",
            "replay",
            "--yes",
            "--json",
            "--rate",
            "20",
            "--in-flight",
            "64",
            "--seller",
            "s-1",
        ],
        &cfg,
    )));
    assert_eq!(done["replayed"], 12, "{done}");
    let b = brokers.clone();
    let mut sent: Vec<i64> = tokio::task::spawn_blocking(move || read_all(&b, JOBS))
        .await
        .unwrap()
        .iter()
        .map(|r| r.timestamp_ms.expect("a producer timestamp"))
        .collect();
    sent.sort_unstable();
    let gaps: Vec<i64> = sent.windows(2).map(|w| w[1] - w[0]).collect();
    assert!(gaps.iter().all(|g| *g >= 25), "gaps in ms: {gaps:?}");
    assert!(sent[11] - sent[0] >= 11 * 50 - 50, "gaps in ms: {gaps:?}");
}

/// A replay that cannot keep its markers stops at the first record with
/// the reason, and writes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_that_cannot_keep_its_markers_stops_and_writes_nothing() {
    let broker = DevBroker::start(&[(JOBS.into(), 3), (DLQ.into(), 2)]).unwrap();
    let brokers = broker.bootstrap_servers().to_owned();
    dead_letters(&broker).await;
    let dir = tempfile::tempdir().unwrap();
    let prefix = crate::common::unique_prefix("dlqbroken");
    let cfg = config(dir.path(), &brokers, &prefix);
    // The markers' key holds a string: reading it as a hash fails.
    let markers = KeySpace::new(prefix.clone()).dlq_replay(DLQ);
    let mut redis = crate::common::raw().await;
    let _: () = redis::cmd("SET")
        .arg(&markers)
        .arg("not a hash")
        .query_async(&mut redis)
        .await
        .unwrap();

    let out = run(&["dlq", "replay", "--yes"], &cfg);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("replay markers in Redis"), "{stderr}");
    let b = brokers.clone();
    let written = tokio::task::spawn_blocking(move || read_all(&b, JOBS))
        .await
        .unwrap();
    assert!(written.is_empty(), "{written:?}");
    let _: () = redis::cmd("DEL")
        .arg(&markers)
        .query_async(&mut redis)
        .await
        .unwrap();
}

/// The replay rate on the mock broker (BENCHMARKS.md, "DLQ replay rate"):
/// `DLQ_RATE_RECORDS` dead letters (2,000 by default) of one seller, then
/// `dlq stats` and `dlq replay --in-flight $DLQ_RATE_IN_FLIGHT` (64 by
/// default) timed as an operator runs them. Prints each step's time;
/// asserts only that each record was replayed once.
///
/// `cargo test --test worker dlq::replay::replay_rate -- --ignored --nocapture`
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement: run it with --ignored --nocapture"]
async fn replay_rate_of_2000_dead_letters() {
    let n: usize = std::env::var("DLQ_RATE_RECORDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2_000);
    let broker = DevBroker::start(&[(JOBS.into(), 3), (DLQ.into(), 2)]).unwrap();
    let brokers = broker.bootstrap_servers().to_owned();
    let dir = tempfile::tempdir().unwrap();
    let prefix = crate::common::unique_prefix("dlqrate");
    let cfg = config(dir.path(), &brokers, &prefix);

    let t = Instant::now();
    let sink = RecordSink::new(&brokers, &BTreeMap::new()).unwrap();
    for i in 0..n {
        let id = format!("r-{i}");
        let original = OriginalRecord {
            origin: Position {
                topic: JOBS.into(),
                partition: (i % 3) as i32,
                offset: i as i64,
            },
            key: Some(format!("product-{id}").into_bytes()),
            value: bytes::Bytes::from(job(&id, "s-1")),
            trace: Default::default(),
        };
        let verdict = Verdict {
            kind: "attempts_exhausted",
            reason: "for the measurement",
            attempts: 5,
            seller: Some("s-1"),
            job_id: Some(&id),
        };
        sink.dead_letter(DLQ, &original, &verdict).await.unwrap();
    }
    println!("write {n} dead letters: {:.2?}", t.elapsed());

    let t = Instant::now();
    let stats = stdout_of(&run(&["dlq", "stats", "--json"], &cfg));
    println!("dlq stats: {:.2?}", t.elapsed());
    assert!(stats.contains(&format!("\"total\": {n}")), "{stats}");

    let in_flight = std::env::var("DLQ_RATE_IN_FLIGHT").unwrap_or_else(|_| "64".into());
    let t = Instant::now();
    let done = summary(&stdout_of(&run(
        &[
            "dlq",
            "replay",
            "--yes",
            "--json",
            "--in-flight",
            &in_flight,
        ],
        &cfg,
    )));
    let took = t.elapsed();
    println!(
        "dlq replay --in-flight {in_flight}: {took:.2?}, {:.0} records/s ({done})",
        n as f64 / took.as_secs_f64()
    );
    assert_eq!(done["replayed"].as_u64(), Some(n as u64), "{done}");

    let t = Instant::now();
    let b = brokers.clone();
    let after = tokio::task::spawn_blocking(move || replayed(&b))
        .await
        .unwrap();
    println!("read the jobs topic back: {:.2?}", t.elapsed());
    assert_eq!(after.len(), n);
    assert!(after.values().all(|c| c.len() == 1));
    // Not 30 days of a measurement's markers in the test Redis.
    let _: () = redis::cmd("DEL")
        .arg(KeySpace::new(prefix).dlq_replay(DLQ))
        .query_async(&mut crate::common::raw().await)
        .await
        .unwrap();
}
