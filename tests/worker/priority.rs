//! Priority within a seller (`"priority"` on a job) end to end: one
//! replica, one seller held by its rule at 10 a second, a bulk backlog of
//! 300 jobs (30 s of it) produced at once on 4 partitions, then an urgent
//! job (priority 5) every 500 ms for 10 s on the same partitions, each
//! produced together with a late bulk job (no priority): the late ones are
//! the baseline, in the same run, of what the urgent ones would wait in
//! offset order. Judged at the downstream, by when it received each job,
//! and at the dead-letter topic for jobs naming an invalid priority. The
//! decisions are tested under the simulation (`tests/sim/priority.rs`,
//! `src/worker/seller.rs`); this proves the wiring: the member is read off
//! the record, reaches the seller's queue, and orders its calls.
//!
//! `cargo test --test worker worker::priority -- --nocapture` prints the
//! figures.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::{Duration, Instant};

use serde_json::json;

use crate::common::rule;
use crate::common::worker::{
    always_ok, job, job_of_priority, policy, wait_all_calling, Bench, Downstream, Running,
};

const SELLER: &str = "seller-0";
const PARTITIONS: i32 = 4;
/// At 10 a second: a 30 s backlog.
const BULK: usize = 300;
/// One every `URGENT_EVERY`, from 1 s after the backlog: over 10 s.
const URGENT: usize = 20;
const URGENT_EVERY: Duration = Duration::from_millis(500);

/// The three kinds of valid job in the run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Class {
    /// The backlog, produced at once.
    Backlog,
    /// No priority, produced with each urgent job.
    Late,
    /// Priority 5.
    Urgent,
}

/// A produced job: its class, its partition, and when it was produced.
#[derive(Debug, Clone, Copy)]
struct Produced {
    class: Class,
    partition: i32,
    at: Instant,
}

/// Waits of one class, in seconds.
#[derive(Debug)]
struct Waits {
    n: usize,
    mean: f64,
    p50: f64,
    p95: f64,
    max: f64,
}

impl Waits {
    fn of(mut w: Vec<f64>) -> Waits {
        w.sort_by(|a, b| a.partial_cmp(b).expect("waits are finite"));
        let at = |q: f64| w[((w.len() - 1) as f64 * q).round() as usize];
        Waits {
            n: w.len(),
            mean: w.iter().sum::<f64>() / w.len() as f64,
            p50: at(0.5),
            p95: at(0.95),
            max: at(1.0),
        }
    }
}

/// Urgent jobs overtake their seller's bulk backlog, their own partitions'
/// included: they wait about a limiter window, not the backlog's length
/// that a job without a priority produced at the same moment waits; every
/// valid job is served once; a job naming an invalid priority is dead-lettered as `bad_priority`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn urgent_jobs_overtake_their_sellers_bulk_backlog_end_to_end() {
    let bench = Bench::new("priority", PARTITIONS);
    let down = Downstream::start(always_ok()).await;
    let w = Running::start(
        bench.settings(&down.url),
        policy(vec![rule("fixed_window", 10, "1s", None)]),
    );
    wait_all_calling(&bench, &down, 1, Duration::from_secs(60)).await;

    let mut produced: HashMap<String, Produced> = HashMap::new();
    let mut record = |ids: &[(String, Class)], at: Instant, landed: Vec<(i32, i64)>| {
        for ((id, class), (partition, _)) in ids.iter().zip(landed) {
            let p = Produced {
                class: *class,
                partition,
                at,
            };
            produced.insert(id.clone(), p);
        }
    };
    // The backlog, and two jobs naming an invalid priority among it.
    let bad = [
        job_of_priority("bad-word", SELLER, json!("high")),
        job_of_priority("bad-range", SELLER, json!(12)),
    ];
    let backlog: Vec<(String, Class)> = (0..BULK)
        .map(|i| (format!("bulk-{i}"), Class::Backlog))
        .collect();
    let mut records: Vec<_> = backlog.iter().map(|(id, _)| job(id, SELLER)).collect();
    records.extend(bad.iter().cloned());
    let start = Instant::now();
    let landed = bench.produce(&records).await;
    record(&backlog, start, landed);

    // An urgent job and a late bulk one every 500 ms, from 1 s on.
    for i in 0..URGENT {
        tokio::time::sleep_until((start + Duration::from_secs(1) + URGENT_EVERY * i as u32).into())
            .await;
        let ids = [
            (format!("urgent-{i}"), Class::Urgent),
            (format!("late-{i}"), Class::Late),
        ];
        let records = [
            job_of_priority(&ids[0].0, SELLER, json!(5)),
            job(&ids[1].0, SELLER),
        ];
        let at = Instant::now();
        let landed = bench.produce(&records).await;
        record(&ids, at, landed);
    }

    let valid = produced.len();
    down.wait_for("every valid job", Duration::from_secs(60), |a| {
        a.iter()
            .filter(|x| x.seller == SELLER)
            .map(|x| x.job_id.as_str())
            .collect::<HashSet<_>>()
            .len()
            >= valid
    })
    .await;
    let took = start.elapsed();
    bench.wait_dead_letters(bad.len(), Duration::from_secs(10));
    w.stop().await;

    let mut arrivals: Vec<_> = down
        .arrivals()
        .into_iter()
        .filter(|a| a.seller == SELLER)
        .collect();
    arrivals.sort_by_key(|a| a.at);
    let mut first: HashMap<&str, Instant> = HashMap::new();
    for a in &arrivals {
        first.entry(a.job_id.as_str()).or_insert(a.at);
    }
    assert!(
        !first.contains_key("bad-word") && !first.contains_key("bad-range"),
        "a job with an invalid priority reached the downstream"
    );
    assert_eq!(
        arrivals.len(),
        valid,
        "every valid job served once ({} calls of {} distinct jobs)",
        arrivals.len(),
        first.len()
    );

    // Every job is a product of its own (`payload.sku`), so under the
    // default ordering (by key) no two of them are ordered: priority ranks
    // them freely. The order within one key is `worker::basic`'s and the
    // simulation's (invariant 15).

    let waits = |class: Class| {
        Waits::of(
            produced
                .iter()
                .filter(|(_, p)| p.class == class)
                .map(|(id, p)| (first[id.as_str()] - p.at).as_secs_f64())
                .collect(),
        )
    };
    let (backlog, late, urgent) = (
        waits(Class::Backlog),
        waits(Class::Late),
        waits(Class::Urgent),
    );
    let mut on: BTreeMap<i32, usize> = BTreeMap::new();
    for p in produced.values().filter(|p| p.class == Class::Urgent) {
        *on.entry(p.partition).or_default() += 1;
    }
    println!("fixed_window 10/1s, {BULK} bulk jobs at once, {URGENT} urgent (priority 5) and {URGENT} late bulk jobs over 10 s; {PARTITIONS} partitions, urgent jobs by partition {on:?}; served in {:.1} s", took.as_secs_f64());
    println!("class           |   n | wait mean |     p50 |     p95 |     max");
    for (what, w) in [
        ("backlog (bulk)", &backlog),
        ("late bulk", &late),
        ("urgent (prio 5)", &urgent),
    ] {
        println!(
            "{what:<15} | {:>3} | {:>7.2} s | {:>5.2} s | {:>5.2} s | {:>5.2} s",
            w.n, w.mean, w.p50, w.p95, w.max
        );
    }

    // One urgent job every 500 ms at 10/s: the backlog takes each window's
    // 10 at its start, so an urgent job waits for the next window once the
    // worker has it (up to 1 s), and the worker may have it up to
    // fetch.wait.max.ms (500 ms) late: a fetch at a partition's end waits
    // that long on the mock broker (`src/kafka/reader.rs`). About 1.5 s at
    // most; generous for two shared cores.
    assert!(
        urgent.mean < 5.0 && urgent.max < 10.0,
        "urgent {urgent:?}, late {late:?}"
    );
    // The late bulk jobs wait for the backlog ahead of them (about 20 s
    // and more): the baseline the urgent ones are judged against.
    assert!(
        late.mean > 10.0 && urgent.mean * 5.0 < late.mean,
        "urgent {urgent:?}, late {late:?}"
    );
    // 340 jobs at 10/s: the last goes by about 34 s.
    assert!(backlog.max < 55.0, "backlog {backlog:?}");

    let dlq = bench.dead_letters(bad.len(), Duration::ZERO);
    assert_eq!(
        dlq.len(),
        bad.len(),
        "each invalid priority dead-lettered once: {dlq:?}"
    );
    for (_, value) in &bad {
        let (_, headers) = dlq.iter().find(|(v, _)| v == value).unwrap_or_else(|| {
            panic!(
                "{} not found byte for byte in the DLQ",
                String::from_utf8_lossy(value)
            )
        });
        assert_eq!(
            headers.get("x-error-kind").map(String::as_str),
            Some("bad_priority"),
            "{headers:?}"
        );
        let reason = headers.get("x-error").map(String::as_str).unwrap_or("");
        assert!(reason.contains("priority"), "x-error names it: {reason:?}");
    }
}
