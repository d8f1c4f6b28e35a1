//! `throttle-worker dlq stats` and `dlq show` (issue 22, part 1) against a
//! dead-letter topic on the mock broker: dead letters of several kinds and
//! sellers, one from before the kind and id headers, counted and listed by
//! the binary as an operator runs it.


use std::collections::BTreeMap;
use std::path::Path;

use crate::common::cli::{run, stdout_of};
use throttle_worker::kafka::{DevBroker, OriginalRecord, Position, RecordSink, Verdict};

fn original(offset: i64, value: &str) -> OriginalRecord {
    OriginalRecord {
        origin: Position {
            topic: "jobs".into(),
            partition: (offset % 3) as i32,
            offset,
        },
        key: Some(format!("product-{offset}").into_bytes()),
        value: bytes::Bytes::from(value.to_owned()),
        trace: Default::default(),
    }
}

fn job(job_id: &str, seller: &str) -> String {
    format!(r#"{{"job_id":"{job_id}","seller_id":"{seller}","payload":{{"sku":"{job_id}"}}}}"#)
}

/// Writes the dead letters every test reads: 5 attempts_exhausted (3 of
/// s-1, 2 of s-2), 1 downstream_rejected of s-1, 1 not_json, and 1 written
/// as a version before the kind and id headers would have (seller s-3 only
/// in its value).
async fn dead_letters(broker: &DevBroker, topic: &str) {
    let sink = RecordSink::new(broker.bootstrap_servers(), &BTreeMap::new()).unwrap();
    let mut offset = 0;
    let mut put = |kind: &'static str, seller: Option<&'static str>, id: String| {
        offset += 1;
        let value = match seller {
            Some(s) => job(&id, s),
            None => "this is not json".to_owned(),
        };
        (original(offset, &value), kind, seller, id)
    };
    let mut all = Vec::new();
    for i in 0..3 {
        all.push(put("attempts_exhausted", Some("s-1"), format!("a1-{i}")));
    }
    for i in 0..2 {
        all.push(put("attempts_exhausted", Some("s-2"), format!("a2-{i}")));
    }
    all.push(put("downstream_rejected", Some("s-1"), "r1".into()));
    all.push(put("not_json", None, String::new()));
    for (rec, kind, seller, id) in &all {
        let reason = format!("{kind} for the test");
        let verdict = Verdict {
            kind,
            reason: &reason,
            attempts: 5,
            seller: *seller,
            job_id: seller.map(|_| id.as_str()),
        };
        sink.dead_letter(topic, rec, &verdict).await.unwrap();
    }
    // An older dead letter: no headers but the reason.
    sink.produce(topic, b"product-old", job("old-1", "s-3").as_bytes())
        .await
        .unwrap();
}

fn config(dir: &Path, brokers: &str, dlq: &str) -> std::path::PathBuf {
    let path = dir.join("dlq.toml");
    std::fs::write(
        &path,
        format!("[kafka]\nbrokers = \"{brokers}\"\ndlq_topic = \"{dlq}\"\n"),
    )
    .unwrap();
    path
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dlq_stats_counts_by_kind_seller_and_age() {
    let dlq = format!("dlq-{:08x}", rand::random::<u32>());
    let broker = DevBroker::start(&[(dlq.clone(), 2)]).unwrap();
    dead_letters(&broker, &dlq).await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), broker.bootstrap_servers(), &dlq);

    let json: serde_json::Value =
        serde_json::from_str(&stdout_of(&run(&["dlq", "stats", "--json"], &cfg))).unwrap();
    assert_eq!(json["topic"], dlq.as_str());
    assert_eq!(json["total"], 8, "{json:#}");
    let kinds = &json["by_kind"];
    assert_eq!(kinds["attempts_exhausted"], 5, "{json:#}");
    assert_eq!(kinds["downstream_rejected"], 1);
    assert_eq!(kinds["not_json"], 1);
    assert_eq!(kinds["unknown"], 1, "the older record has no kind");
    let sellers = &json["by_seller"];
    assert_eq!(sellers["s-1"], 4);
    assert_eq!(sellers["s-2"], 2);
    assert_eq!(sellers["s-3"], 1, "read from the older record's value");
    assert_eq!(sellers[""], 1, "not a job");
    assert_eq!(json["by_age"]["< 1h"], 8);
    assert!(json["oldest"]["timestamp_ms"].as_i64() <= json["newest"]["timestamp_ms"].as_i64());

    // Filtered: one kind of one seller.
    let json: serde_json::Value = serde_json::from_str(&stdout_of(&run(
        &[
            "dlq",
            "stats",
            "--json",
            "--kind",
            "attempts_exhausted",
            "--seller",
            "s-1",
        ],
        &cfg,
    )))
    .unwrap();
    assert_eq!(json["total"], 3, "{json:#}");

    let table = stdout_of(&run(&["dlq", "stats", "--top", "2"], &cfg));
    println!("{table}");
    assert!(table.contains("8 dead letters"), "{table}");
    assert!(table.contains("attempts_exhausted"), "{table}");
    assert!(table.contains("(2 more sellers)"), "{table}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dlq_show_lists_the_matching_records_without_payloads_unless_asked() {
    let dlq = format!("dlq-{:08x}", rand::random::<u32>());
    let broker = DevBroker::start(&[(dlq.clone(), 2)]).unwrap();
    dead_letters(&broker, &dlq).await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), broker.bootstrap_servers(), &dlq);

    let lines = |args: &[&str]| -> Vec<serde_json::Value> {
        stdout_of(&run(args, &cfg))
            .lines()
            .map(|l| serde_json::from_str(l).expect("one JSON object a line"))
            .collect()
    };
    let mine = lines(&[
        "dlq",
        "show",
        "--json",
        "--kind",
        "attempts_exhausted",
        "--seller",
        "s-1",
    ]);
    let mut ids: Vec<&str> = mine.iter().map(|d| d["job_id"].as_str().unwrap()).collect();
    ids.sort();
    assert_eq!(ids, ["a1-0", "a1-1", "a1-2"]);
    for d in &mine {
        assert_eq!(d["original"]["topic"], "jobs");
        assert!(d["original"]["offset"].as_i64().is_some());
        assert_eq!(d["attempts"], 5);
        assert_eq!(d["reason"], "attempts_exhausted for the test");
        assert!(d.get("payload").is_none(), "no payload unless asked: {d}");
    }
    let with = lines(&["dlq", "show", "--json", "--seller", "s-2", "--payload"]);
    assert_eq!(with.len(), 2);
    assert!(with[0]["payload"].as_str().unwrap().contains("\"sku\""));

    // Times: everything was written just now.
    assert_eq!(lines(&["dlq", "show", "--json", "--after", "1h"]).len(), 8);
    assert_eq!(lines(&["dlq", "show", "--json", "--before", "1h"]).len(), 0);

    // The names before issue 35 still work, and say what replaced them.
    for (old, new, matched) in [("--since", "--after", 8), ("--until", "--before", 0)] {
        let out = run(&["dlq", "show", "--json", old, "1h"], &cfg);
        assert_eq!(stdout_of(&out).lines().count(), matched, "{old}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains(&format!("dlq {old} is deprecated")) && err.contains(new),
            "{old}: {err}"
        );
    }
    let out = run(&["dlq", "show", "--json", "--reason", "not_json"], &cfg);
    assert_eq!(stdout_of(&out).lines().count(), 1);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("dlq --reason is deprecated") && err.contains("--kind"), "{err}");
    assert_eq!(lines(&["dlq", "show", "--json", "--limit", "3"]).len(), 3);

    let table = stdout_of(&run(&["dlq", "show", "--kind", "not_json"], &cfg));
    println!("{table}");
    assert_eq!(table.lines().count(), 1, "{table}");
    assert!(
        table.contains("not_json") && table.contains("seller=-"),
        "{table}"
    );

    // A time that is neither: refused, naming the flag.
    for flag in ["--after", "--since"] {
        let out = run(&["dlq", "show", flag, "yesterday"], &cfg);
        assert_eq!(out.status.code(), Some(1), "{flag}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(flag) && err.contains("yesterday"), "{err}");
    }
}

/// `--kind` (and its old name `--reason`) takes only the dead-letter kinds,
/// and a wrong one is a usage error that lists them. Clap refuses it
/// before any config or broker is read.
#[test]
fn dlq_refuses_an_unknown_kind_and_lists_the_kinds() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), "127.0.0.1:1", "dlq-unused");
    for flag in ["--kind", "--reason"] {
        let out = run(&["dlq", "show", flag, "nonsense"], &cfg);
        assert_eq!(out.status.code(), Some(2), "{flag}: a usage error");
        let err = String::from_utf8_lossy(&out.stderr);
        for kind in throttle_worker::dead_letter::DeadLetterKind::ALL {
            assert!(err.contains(kind.name()), "{flag}: {kind} not listed:\n{err}");
        }
    }
}

/// An unfiltered replay (every kind, poison records too) acts on the whole
/// topic: off a terminal it needs --yes, and without it exits 4 having
/// read nothing. Its --dry-run needs no --yes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dlq_replay_of_every_kind_needs_yes_off_a_terminal() {
    let dlq = format!("dlq-{:08x}", rand::random::<u32>());
    // The jobs topic of the defaults, which a replay writes to.
    let jobs = "product-registrations".to_owned();
    let broker = DevBroker::start(&[(dlq.clone(), 2), (jobs, 3)]).unwrap();
    dead_letters(&broker, &dlq).await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), broker.bootstrap_servers(), &dlq);

    let out = run(&["dlq", "replay"], &cfg);
    assert_eq!(out.status.code(), Some(4), "declined: {out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--yes"), "the refusal names the flag: {err}");
    assert!(out.stdout.is_empty(), "nothing replayed: {out:?}");

    let out = run(&["dlq", "replay", "--dry-run", "--json"], &cfg);
    assert!(out.status.success(), "a dry run needs no --yes: {out:?}");
}
