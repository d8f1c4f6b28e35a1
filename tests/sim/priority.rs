//! Priority within a seller (`"priority"` on a job, `worker.priority_aging`)
//! under the simulation: a seller held by its rule with a deep backlog of
//! bulk jobs, and urgent jobs arriving meanwhile on the same partitions,
//! judged by when the downstream received each job's first call. The same
//! world without priorities is the baseline, in the same run. The random
//! worlds (`engine::random_seeds`) name priorities on a third of the seeds,
//! against every other fault.
//!
//! `cargo test --test sim sim::priority -- --nocapture` prints the figures.

use std::collections::BTreeMap;
use std::time::Duration;

use super::check;
use super::ports::Poison;
use super::run::{run, Outcome};
use super::scenario::{rule, JobSpec, Scenario, SellerSpec};

/// Waits (ms from produced to first call) of the urgent and the bulk jobs.
#[derive(Debug)]
struct Waits {
    urgent_mean: f64,
    urgent_max: u64,
    bulk_mean: f64,
    bulk_max: u64,
    dead: usize,
}

/// A job of seller 0 on partition `n % partitions`, for a product of its
/// own (so priority may rank it past the jobs of other products).
fn job(n: usize, partitions: usize, at_ms: u64, priority: u8) -> JobSpec {
    JobSpec {
        sku: Some(format!("p{n}-{at_ms}")),
        priority,
        seller: 0,
        cost: 1,
        at_ms,
        partition: (n % partitions) as i32,
        malformed: false,
        poison: Poison::None,
        pad: 0,
    }
}

/// A world of one seller at 10/s (`fixed_window`) on `partitions`.
fn one_seller(seed: u64, partitions: i32) -> Scenario {
    let mut sc = Scenario::quiet(seed);
    sc.partitions = partitions;
    sc.sellers.push(SellerSpec {
        name: "seller-0".to_owned(),
        rule: Some(rule("fixed_window", 10, Duration::from_secs(1), None)),
        max_in_flight: None,
    });
    sc
}

/// When the downstream first received each job (virtual ms).
fn first_calls(out: &Outcome) -> BTreeMap<usize, u64> {
    let mut first: BTreeMap<usize, u64> = BTreeMap::new();
    for c in &out.log.calls {
        let at = first.entry(c.job).or_insert(c.at_ms);
        *at = (*at).min(c.at_ms);
    }
    first
}

/// One seller at 10/s, 400 bulk jobs produced at once on 4 partitions,
/// then one urgent job every 500 ms for 20 s (`urgent` its priority; 0:
/// none named), on the same partitions.
fn world(seed: u64, urgent: u8, bulk: usize) -> Scenario {
    let mut sc = one_seller(seed, 4);
    for n in 0..bulk {
        sc.jobs.push(job(n, 4, 0, 0));
    }
    for n in 0..40 {
        sc.jobs.push(job(n, 4, 1_000 + 500 * n as u64, urgent));
    }
    sc
}

fn waits(sc: &Scenario, out: &Outcome) -> Waits {
    let first = first_calls(out);
    let of = |urgent: bool| -> Vec<u64> {
        first
            .iter()
            .filter(|(&j, _)| (j >= sc.jobs.len() - 40) == urgent)
            .map(|(&j, &at)| at.saturating_sub(sc.jobs[j].at_ms))
            .collect()
    };
    let mean = |v: &[u64]| v.iter().sum::<u64>() as f64 / v.len().max(1) as f64;
    let (u, b) = (of(true), of(false));
    Waits {
        urgent_mean: mean(&u),
        urgent_max: u.iter().copied().max().unwrap_or(0),
        bulk_mean: mean(&b),
        bulk_max: b.iter().copied().max().unwrap_or(0),
        dead: out.log.dead.len(),
    }
}

/// Urgent jobs overtake the bulk backlog of their seller (their own
/// partitions' too): they wait about one limiter window instead of the
/// backlog's length, and the bulk work still all goes, none of it later
/// than the backlog's length plus the urgent jobs' share.
#[test]
fn urgent_jobs_overtake_their_sellers_bulk_backlog() {
    // 400 bulk jobs, and 1,000: deeper than the 512 jobs a seller's queue
    // is read in without priorities.
    for (seed, bulk) in [(0, 400), (1, 400), (2, 400), (3, 1_000)] {
        let plain_sc = world(seed, 0, bulk);
        let plain = waits(&plain_sc, &run(&plain_sc));
        let sc = world(seed, 5, bulk);
        let out = run(&sc);
        let broken = check::all(&sc, &out);
        assert!(broken.is_empty(), "seed {seed}:\n{}", broken.join("\n"));
        let ranked = waits(&sc, &out);
        println!(
            "seed {seed}, {bulk} bulk: no priorities: urgent wait mean {:.1} s, max {:.1} s; bulk max {:.1} s | priority 5: urgent mean {:.2} s, max {:.2} s; bulk mean {:.1} s, max {:.1} s",
            plain.urgent_mean / 1000.0,
            plain.urgent_max as f64 / 1000.0,
            plain.bulk_max as f64 / 1000.0,
            ranked.urgent_mean / 1000.0,
            ranked.urgent_max as f64 / 1000.0,
            ranked.bulk_mean / 1000.0,
            ranked.bulk_max as f64 / 1000.0,
        );
        assert_eq!((plain.dead, ranked.dead), (0, 0), "seed {seed}");
        // One job every 500 ms at 10/s: each is asked for at the next
        // window with room, a second at most (and some slack).
        assert!(ranked.urgent_max <= 2_500, "seed {seed}: {ranked:?}");
        assert!(
            ranked.urgent_mean * 5.0 < plain.urgent_mean,
            "seed {seed}: {plain:?} vs {ranked:?}"
        );
        // 440 jobs at 10/s: the last goes by about 44 s either way.
        assert!(
            ranked.bulk_max <= (bulk as u64 + 40) * 100 + 6_000,
            "seed {seed}: {ranked:?}"
        );
    }
}

/// Aging: a bulk job gains a level per `worker.priority_aging` waited, so
/// a steady stream of urgent jobs that alone fills the seller's rule does
/// not starve it: with aging every 2 s, a bulk job waits at most about
/// 2 s × (5 − 0) + a window behind a stream of priority 5.
#[test]
fn waiting_raises_bulk_work_so_it_never_starves() {
    let mut sc = one_seller(11, 2);
    sc.priority_aging = Some(Duration::from_secs(2));
    // 20 bulk jobs, then 12 urgent ones a second for 30 s: more than the
    // rule's 10 a second, so without aging the bulk would wait for the
    // stream to end.
    for n in 0..20 {
        sc.jobs.push(job(n, 2, 0, 0));
    }
    for n in 0..360 {
        sc.jobs.push(job(n, 2, 500 + n as u64 * 1000 / 12, 5));
    }
    let out = run(&sc);
    let broken = check::all(&sc, &out);
    assert!(broken.is_empty(), "{}", broken.join("\n"));
    let first = first_calls(&out);
    let bulk_last = (0..20).filter_map(|j| first.get(&j)).max().copied();
    let urgent_last = (20..380).filter_map(|j| first.get(&j)).max().copied();
    println!(
        "aging 2 s: last bulk job called at {bulk_last:?} ms, last urgent at {urgent_last:?} ms"
    );
    // Level 5 after 10 s: the bulk work goes well before the stream ends
    // (about 31 s in, and longer behind the backlog it builds).
    let bulk_last = bulk_last.expect("every bulk job called");
    assert!(bulk_last <= 16_000, "bulk starved: last at {bulk_last} ms");
    assert!(urgent_last.is_some_and(|u| u > bulk_last));
}
