//! Adaptive downstream concurrency end to end: two replicas against a
//! downstream that takes 8 calls at once and answers 503 at once beyond
//! that, which the worker is not told. The decisions are tested under the
//! simulation (`tests/sim/adaptive.rs`, `src/worker/concurrency.rs`); this
//! proves the wiring: the answers reach the limit, the limit reaches the
//! slots, a shed call keeps its attempt. Judged at the downstream: calls
//! shed, calls served, and the dead-letter topic.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use crate::common::rule;
use crate::common::worker::{
    always_ok, job, policy, wait_all_calling, Bench, Downstream, Running, PROBE_SELLER,
};

/// What one run saw.
#[derive(Debug)]
struct Run {
    shed: u64,
    served: usize,
    /// Served calls per second, as a share of what the capacity allows
    /// (8 calls of 50 ms: 160/s), over the span from the first to the last.
    goodput: f64,
    dead_lettered: usize,
    took: Duration,
}

/// 2 replicas, `downstream.concurrency` = `concurrency` each, 8 sellers ×
/// 100 jobs, against 8 calls at once of 50 ms.
async fn run(name: &str, concurrency: usize, adaptive: bool) -> Run {
    let bench = Bench::new(name, 8);
    let down = Downstream::start(always_ok()).await;
    down.set_delay(Duration::from_millis(50));
    let settings = |url: &str| {
        let mut s = bench.settings(url);
        s.downstream.concurrency = concurrency;
        s.downstream.adaptive_concurrency = adaptive;
        s.downstream.min_concurrency = 1;
        s
    };
    let rules = || policy(vec![rule("gcra", 100_000, "1s", None)]);
    let workers: Vec<Running> = (0..2)
        .map(|_| Running::start(settings(&down.url), rules()))
        .collect();
    wait_all_calling(&bench, &down, 2, Duration::from_secs(60)).await;
    down.set_capacity(8);
    let shed_before = down.shed();
    let mut ids = HashSet::new();
    let mut records = Vec::new();
    for i in 0..100 {
        for s in 0..8 {
            let id = format!("{name}-{s}-{i}");
            records.push(job(&id, &format!("seller-{s}")));
            ids.insert(id);
        }
    }
    let started = Instant::now();
    bench.produce(&records).await;
    // Every job is served or dead-lettered: wait for the served ones,
    // then read the dead letters.
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let served: HashSet<String> = down
            .arrivals()
            .into_iter()
            .filter(|a| a.seller != PROBE_SELLER)
            .map(|a| a.job_id)
            .collect();
        if served.len() == ids.len() {
            break;
        }
        let dead = bench.dead_letters(0, Duration::from_millis(200));
        if served.len() + dead.len() >= ids.len() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{name}: {} served and {} dead-lettered of {} in 90 s",
            served.len(),
            dead.len(),
            ids.len()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let took = started.elapsed();
    for w in workers {
        w.stop().await;
    }
    let arrivals: Vec<_> = down
        .arrivals()
        .into_iter()
        .filter(|a| a.seller != PROBE_SELLER)
        .collect();
    let first = arrivals.iter().map(|a| a.at).min().expect("calls");
    let last = arrivals.iter().map(|a| a.at).max().expect("calls");
    let span = (last - first).as_secs_f64() + 0.05;
    Run {
        shed: down.shed() - shed_before,
        served: arrivals.len(),
        goodput: arrivals.len() as f64 / (span * 160.0),
        dead_lettered: bench.dead_letters(0, Duration::from_millis(500)).len(),
        took,
    }
}

/// The figure, on a fleet: with a fixed 32 per replica (8 × the
/// downstream's capacity between them) most calls are 503s and jobs are
/// dead-lettered for the downstream's load; the adaptive limit sheds a
/// small share and dead-letters none. Goodput is printed, not asserted,
/// against a fixed 4 per replica (the capacity, known) in the same run:
/// the mock broker and two replicas share two cores with the downstream.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_replicas_find_a_hidden_capacity_and_dead_letter_nothing() {
    let known = run("known", 4, false).await;
    let fixed = run("fixed", 32, false).await;
    let adaptive = run("adaptive", 32, true).await;
    let share = |r: &Run| r.shed as f64 / (r.shed as f64 + r.served as f64);
    for (what, r) in [
        ("fixed 4 × 2 (the capacity)", &known),
        ("fixed 32 × 2", &fixed),
        ("adaptive, ceiling 32 × 2", &adaptive),
    ] {
        println!(
            "{what}: {:.1} % of calls shed, goodput {:.2} of 160/s ({:.2} of the known capacity's run), {} dead-lettered, {:.1} s",
            share(r) * 100.0,
            r.goodput,
            r.goodput / known.goodput,
            r.dead_lettered,
            r.took.as_secs_f64(),
        );
    }
    assert_eq!(adaptive.dead_lettered, 0, "{adaptive:?}");
    assert!(
        share(&adaptive) <= 0.10 && share(&adaptive) < share(&fixed),
        "adaptive {adaptive:?} against fixed {fixed:?}"
    );
}
