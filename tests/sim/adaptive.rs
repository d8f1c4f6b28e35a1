//! Adaptive downstream concurrency under the simulation: a backlog against
//! a downstream whose capacity is hidden (it sheds or queues the calls
//! beyond it), judged by what the downstream received. The random worlds
//! (`engine::random_seeds`) run it too, against every other fault; here
//! the shape of the answer is measured: goodput, the share of shed calls,
//! how many calls were out, how soon it settled.
//!
//! `cargo test --test sim sim::adaptive -- --nocapture` prints the figures.

use super::check;
use super::journal::Call;
use super::ports::{HiddenCapacity, Poison};
use super::run::{run, Outcome};
use super::scenario::{JobSpec, Scenario, SellerSpec};

/// What a run looked like at the downstream.
#[derive(Debug)]
struct Seen {
    /// 2xx calls per second over the busy span, as a share of what the
    /// capacity allows at the downstream's latency.
    goodput: f64,
    /// Calls shed (beyond the capacity), as a share of all calls.
    shed: f64,
    /// Calls out on average over the busy span.
    mean_out: f64,
    /// Virtual ms from the first call until a second of calls kept the
    /// shed share under 2 % and the goodput over 90 %.
    settled_ms: Option<u64>,
    dead: usize,
}

/// `sellers` unlimited sellers with `per_seller` jobs each, all produced
/// at once on 8 partitions, against `capacity`, with `concurrency` the
/// ceiling and every call taking `latency_ms`.
fn backlog(
    seed: u64,
    capacity: HiddenCapacity,
    concurrency: usize,
    adaptive: bool,
    latency_ms: u64,
    jobs: usize,
) -> Scenario {
    let mut sc = Scenario::quiet(seed);
    sc.partitions = 8;
    sc.concurrency = concurrency;
    sc.adaptive = adaptive;
    sc.faults.latency_ms = (latency_ms, latency_ms);
    sc.faults.capacity = Some(capacity);
    let sellers = 8;
    for i in 0..sellers {
        sc.sellers.push(SellerSpec {
            name: format!("seller-{i}"),
            rule: None,
            max_in_flight: None,
        });
    }
    for n in 0..jobs {
        sc.jobs.push(JobSpec {
            sku: None,
            priority: 0,
            seller: n % sellers,
            cost: 1,
            at_ms: 0,
            partition: (n / sellers % 8) as i32,
            malformed: false,
            poison: Poison::None,
            pad: 0,
        });
    }
    sc
}

fn seen(out: &Outcome, capacity: usize, latency_ms: u64) -> Seen {
    let calls: Vec<&Call> = out.log.calls.iter().collect();
    let first = calls.iter().map(|c| c.at_ms).min().unwrap_or(0);
    let last = calls.iter().map(|c| c.end_ms).max().unwrap_or(0);
    let span_ms = (last - first).max(1);
    let ok = |c: &&&Call| c.class == "2xx";
    let served = calls.iter().filter(ok).count();
    let shed = calls.iter().filter(|c| c.class == "shed").count();
    let possible_per_ms = capacity as f64 / latency_ms as f64;
    let busy_ms: u64 = calls.iter().map(|c| c.end_ms - c.at_ms).sum();
    // Seconds of calls: settled from the first whole second that kept
    // both targets, every second after it too.
    let seconds = span_ms.div_ceil(1000);
    let mut good_from = None;
    for s in 0..seconds {
        let (from, to) = (first + s * 1000, first + (s + 1) * 1000);
        let within: Vec<&&Call> = calls
            .iter()
            .filter(|c| (from..to).contains(&c.at_ms))
            .collect();
        let n = within.len().max(1) as f64;
        let shed_share = within.iter().filter(|c| c.class == "shed").count() as f64 / n;
        let done = within.iter().filter(|c| c.class == "2xx").count() as f64;
        let whole = to <= last - 1000;
        let good = !whole || (shed_share <= 0.02 && done >= 0.9 * possible_per_ms * 1000.0);
        match (good, good_from) {
            (true, None) => good_from = Some(s * 1000),
            (false, Some(_)) => good_from = None,
            _ => {}
        }
    }
    Seen {
        goodput: served as f64 / (possible_per_ms * span_ms as f64),
        shed: shed as f64 / calls.len().max(1) as f64,
        mean_out: busy_ms as f64 / span_ms as f64,
        settled_ms: good_from,
        dead: out.log.dead.len(),
    }
}

/// Against a downstream that sheds every call beyond 8 under way (503 at
/// once, 50 ms a call), a fixed concurrency of 32 (4 × the capacity)
/// against the adaptive limit under the same ceiling: the adaptive one
/// keeps the goodput and sheds next to nothing, and no job is
/// dead-lettered for the downstream's capacity.
#[test]
fn a_shedding_downstream_is_found_and_kept_under() {
    let cap = HiddenCapacity {
        calls: 8,
        shed: true,
    };
    for seed in 0..4 {
        let fixed_sc = backlog(seed, cap, 32, false, 50, 3000);
        let fixed = seen(&run(&fixed_sc), 8, 50);
        let sc = backlog(seed, cap, 32, true, 50, 3000);
        let out = run(&sc);
        let broken = check::all(&sc, &out);
        assert!(broken.is_empty(), "seed {seed}:\n{}", broken.join("\n"));
        let adaptive = seen(&out, 8, 50);
        println!(
            "seed {seed}: fixed 32: goodput {:.3}, shed {:.1} %, {} dead-lettered | adaptive: goodput {:.3}, shed {:.2} %, {:.1} calls out, settled after {:?} ms, {} dead-lettered",
            fixed.goodput,
            fixed.shed * 100.0,
            fixed.dead,
            adaptive.goodput,
            adaptive.shed * 100.0,
            adaptive.mean_out,
            adaptive.settled_ms,
            adaptive.dead,
        );
        assert_eq!(adaptive.dead, 0, "seed {seed}: {adaptive:?}");
        assert!(
            adaptive.goodput >= 0.85 && adaptive.shed <= 0.05,
            "seed {seed}: {adaptive:?}"
        );
        assert!(adaptive.shed < fixed.shed, "seed {seed}");
    }
}

/// Against a downstream that queues beyond 4 under way (each call as slow
/// as the load over 4), the adaptive limit stops adding calls that only
/// wait: the goodput holds, and the calls out stay within the latency
/// tolerance's multiple of the capacity (2 × 4), where a fixed 32 keeps
/// them all out.
#[test]
fn a_queueing_downstream_gets_no_more_than_its_latency_allows() {
    let cap = HiddenCapacity {
        calls: 4,
        shed: false,
    };
    for seed in 0..3 {
        let fixed = seen(&run(&backlog(seed, cap, 32, false, 20, 3000)), 4, 20);
        let sc = backlog(seed, cap, 32, true, 20, 3000);
        let out = run(&sc);
        let broken = check::all(&sc, &out);
        assert!(broken.is_empty(), "seed {seed}:\n{}", broken.join("\n"));
        let adaptive = seen(&out, 4, 20);
        println!(
            "seed {seed}: fixed 32: goodput {:.3}, {:.1} calls out | adaptive: goodput {:.3}, {:.1} calls out",
            fixed.goodput, fixed.mean_out, adaptive.goodput, adaptive.mean_out
        );
        assert!(adaptive.goodput >= 0.85, "seed {seed}: {adaptive:?}");
        assert!(
            adaptive.mean_out <= 2.5 * 4.0,
            "seed {seed}: {adaptive:?} against fixed {fixed:?}"
        );
    }
}

/// The limit is per replica and never past `downstream.concurrency`: a
/// downstream with room for everything gets the whole ceiling once the
/// backlog fills it (the limit grows while every slot is in use).
#[test]
fn with_room_to_spare_the_limit_grows_to_the_ceiling() {
    let cap = HiddenCapacity {
        calls: 1000,
        shed: true,
    };
    let sc = backlog(7, cap, 16, true, 50, 3000);
    let out = run(&sc);
    let broken = check::all(&sc, &out);
    assert!(broken.is_empty(), "{}", broken.join("\n"));
    let mut steps: Vec<(u64, i64)> = Vec::new();
    for c in &out.log.calls {
        steps.push((c.at_ms, 1));
        steps.push((c.end_ms, -1));
    }
    steps.sort_unstable();
    let (mut now, mut most) = (0, 0);
    for (_, d) in steps {
        now += d;
        most = most.max(now);
    }
    assert_eq!(most, 16, "the ceiling, reached and never passed");
}
