//! The world of one run: what a seed draws, or what a test writes by hand.

use std::collections::BTreeMap;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use throttle_worker::config::{
    self, LearnConfig, LimitsConfig, OnError, OrderingMode, RuleConfig, SellerConfig, Settings,
};

use super::ports::{
    Faults, HiddenCapacity, OutageKind, Poison, ReplicaFault, RetryAfterKind, Window,
};

/// Salts the generator of a seed's pauses.
const PAUSE_SALT: u64 = 0x9a05_e5ee_d5a1_7000;

/// Salts the generator of a seed's `max_in_flight` caps.
const IN_FLIGHT_SALT: u64 = 0x1f11_9470_ca95_0000;
/// Adaptive concurrency and the downstream's hidden capacity too.
const CAPACITY_SALT: u64 = 0xada9_71fe_ca9a_0000;
/// Limits learnt from 429s, and sellers the downstream allows less.
const LEARN_SALT: u64 = 0x1ea7_4290_0000_0000;
/// Jobs that name a priority, and how fast waiting raises it.
const PRIORITY_SALT: u64 = 0x9210_7170_0000_0000;
/// Redis' data losses draw from a generator of their own too.
const LOSS_SALT: u64 = 0x1055_0fda_7a00_0000;
/// Partial losses: a seller's state put back to an older copy.
const ROLLBACK_SALT: u64 = 0x2011_bac4_0000_0000;
/// Failovers: every key back to an older copy, under another server.
const FAILOVER_SALT: u64 = 0xfa11_0fe2_0000_0000;
/// What orders jobs (`worker.ordering`), and how their keys spread.
const ORDER_SALT: u64 = 0x0de2_5a17_0000_0000;
/// A first deploy: Redis and the consumer group both empty.
const INSTALL_SALT: u64 = 0x0f12_e5b1_0000_0000;
/// Sellers' rule sets: the algorithms the draw above never makes, several
/// rules per seller, global rules (issue 53).
const RULES_SALT: u64 = 0x5e11_e2a1_e500_0000;
/// What a failed limiter call means (`redis.on_error`).
const ON_ERROR_SALT: u64 = 0x0e22_0f00_0000_0000;
/// A planned maintenance (503 with `Retry-After`), and a downstream that
/// registers calls after the client gave up on them (issue 53).
const DOWNSTREAM_SALT: u64 = 0xd0e5_7a11_0000_0000;
/// The broker delivering records again within an assignment (a fetch
/// retried), issue 53 item 4.
const REDELIVERY_SALT: u64 = 0x4ede_11e2_0000_0000;
/// Produce outages of the retry tiers and the dead-letter topic, issue 53
/// item 4.
const PRODUCE_SALT: u64 = 0x9e0d_0ce0_0000_0000;
/// A slow but answering Redis: windows of long round trips, issue 53
/// item 4.
const SLOW_SALT: u64 = 0x5105_2ed1_5000_0000;
/// One replica of a fleet losing Redis while the others keep it, issue 53
/// item 4.
const REPLICA_SALT: u64 = 0x2e91_1ca0_0000_0000;
/// A replica of a fleet stalled past its session timeout, issue 53 item 2.
const STALL_SALT: u64 = 0x57a1_1ed0_0000_0000;
/// The broker losing the group's last commits, issue 53 item 4.
const LOST_COMMIT_SALT: u64 = 0x1057_c0aa_1700_0000;
/// Shadow rules (`shadow = true`), issue 53 item 4.
const SHADOW_SALT: u64 = 0x05ad_0e12_0000_0000;
/// Tiers (`limits.tiers`, a seller's `tier`), issue 53 item 4.
const TIER_SALT: u64 = 0x71e2_5000_0000_0000;
/// Live edits of `[limits]` racing calls, issue 53 item 4.
const EDIT_SALT: u64 = 0xed17_5000_0000_0000;

/// Whether fleets draw stalled replicas (on unless `SIM_STALLS=0`): a
/// replica frozen past its session timeout while it holds partitions
/// (issue 53, item 2). `SIM_STALLS=0` gives the fleets of the builds
/// before the stalls, seed for seed.
pub fn stalls_on() -> bool {
    !std::env::var("SIM_STALLS").is_ok_and(|v| v == "0")
}

/// Whether the random worlds draw partial losses (`SIM_PARTIAL_LOSSES=1`):
/// sellers' keys put back from an older copy on the same server (a
/// `RESTORE`), the epoch staying. Off by default: a replica that lost no
/// grant to it finds its mark where it left it, so its calls grant from
/// the older state until a replica that did lose one calls and finds it
/// (fleet seeds 197, 613, 661, 1354 and 1610 at 2,000 seeds, each over a
/// rule right after such a put-back; the guarantees page says so). A
/// failover, where every key goes back under another server, is caught
/// by any replica's first call (`Faults::failovers`, on).
pub fn partial_losses_on() -> bool {
    std::env::var("SIM_PARTIAL_LOSSES").is_ok_and(|v| v == "1")
}

#[derive(Debug, Clone)]
pub struct SellerSpec {
    pub name: String,
    /// `None`: unlimited.
    pub rule: Option<RuleConfig>,
    /// Its calls in flight across the fleet, capped.
    pub max_in_flight: Option<u32>,
}

#[derive(Debug, Clone)]
pub struct JobSpec {
    pub seller: usize,
    pub cost: u64,
    /// When it is produced (virtual ms).
    pub at_ms: u64,
    pub partition: i32,
    /// Not a job at all: dead-lettered as malformed (its own fault).
    pub malformed: bool,
    pub poison: Poison,
    /// Padding in the payload, bytes.
    pub pad: usize,
    /// The job's `priority` (0: none named, bulk).
    pub priority: u8,
    /// The product it names (`payload.sku`, the default ordering key);
    /// none: its record key (its seller's name) orders it.
    pub sku: Option<String>,
}

#[derive(Debug, Clone)]
pub struct Scenario {
    pub seed: u64,
    pub partitions: i32,
    pub tier_partitions: i32,
    pub sellers: Vec<SellerSpec>,
    pub jobs: Vec<JobSpec>,
    pub faults: Faults,
    /// (at, down for): the process is killed (kill -9) and restarted.
    pub crashes: Vec<(u64, u64)>,
    /// (at, partitions of the jobs topic, for how long): revoked, then
    /// assigned back; commits are refused meanwhile.
    pub rebalances: Vec<(u64, Vec<i32>, u64)>,
    /// (at, for how long): the worker's session is found lost (a stall
    /// past the session timeout; librdkafka's lost flag), then confirmed
    /// again by a rebalance that assigns it nothing new (issue 53).
    pub fences: Vec<(u64, u64)>,
    /// (at, past the session timeout by ms, which replica): in a fleet
    /// (`fleet::run_fleet`; one process alone does not use them), a
    /// replica (this index modulo the fleet's size) stalls, a GC-like
    /// pause, for the session timeout and this much more: the group gives
    /// its partitions to the others, then it resumes still holding them
    /// and its leases (issue 53, item 2).
    pub stalls: Vec<(u64, u64, usize)>,
    /// (at, by µs): the worker host's wall clock steps.
    pub clock_jumps: Vec<(u64, i64)>,
    pub concurrency: usize,
    /// Records the consumer hands over per virtual ms (a fetch).
    pub fetch: usize,
    /// `downstream.adaptive_concurrency`, from `downstream.min_concurrency`
    /// = 1.
    pub adaptive: bool,
    pub max_attempts: u32,
    pub on_error: OnError,
    /// Replicas the fleet pretends to have: this one holds 1/fleet of the
    /// jobs topic's partitions as far as the local fallback's share goes.
    pub fleet: usize,
    /// Faults stop by then; the run goes on until every job is finished
    /// or `limit_ms`.
    pub faults_end_ms: u64,
    pub limit_ms: u64,
    /// `limits.sellers.X.weight` by seller (index): unset, 1.
    pub weights: BTreeMap<usize, u32>,
    /// `limits.sellers.X.min_share` by seller (index): unset, 0.
    pub min_shares: BTreeMap<usize, f64>,
    /// `limits.learn` (defaults otherwise), when set.
    pub learn: Option<LearnConfig>,
    /// `worker.priority_aging`, when not its default.
    pub priority_aging: Option<Duration>,
    /// `worker.ordering` (the ordering key is the default `/payload/sku`).
    pub ordering: OrderingMode,
    /// A first deploy (issue 52): Redis holds no epoch, and the replica
    /// tells the limiter the install is new while the group has never
    /// committed. Otherwise the install ran before (an epoch a day old).
    pub fresh_install: bool,
    /// Rules of a limited seller (index) beside its `SellerSpec::rule`,
    /// all held together (`limits.sellers.X.rules`). Never a pacer: a
    /// pacer's grant is its go-at, not the instant the other rules took
    /// their units, so the limit checker could not judge those at it.
    pub more_rules: BTreeMap<usize, Vec<RuleConfig>>,
    /// `limits.global`: rules over every limited seller's calls together.
    /// Drawn only in worlds without a pacer, for the same reason (a shadow
    /// global rule may be drawn beside a pacer: it never binds).
    pub global: Vec<RuleConfig>,
    /// `limits.tiers`: named rule sets (never a pacer), some with a shadow
    /// rule.
    pub tiers: BTreeMap<String, Vec<RuleConfig>>,
    /// A limited seller (index) under a tier (`limits.sellers.X.tier`): its
    /// tier's rules hold it, not its `SellerSpec::rule` and `more_rules`
    /// (kept for an edit that moves it out of its tier).
    pub tier_of: BTreeMap<usize, String>,
    /// Live edits of `[limits]` (the config file rewritten while calls are
    /// under way), in order: each replica's limiter is handed the new
    /// policy as `worker::reload` hands it (`Limiter::set_policy`), and a
    /// process started later starts with it.
    pub edits: Vec<Edit>,
}

/// The parts of `[limits]` an edit may change: the sellers' own rules,
/// the tiers and who is in which. Global rules, caps and shares stay.
#[derive(Debug, Clone, PartialEq)]
pub struct LimitSet {
    /// Each seller's `SellerSpec::rule`.
    pub rules: Vec<Option<RuleConfig>>,
    pub more_rules: BTreeMap<usize, Vec<RuleConfig>>,
    pub tiers: BTreeMap<String, Vec<RuleConfig>>,
    pub tier_of: BTreeMap<usize, String>,
}

/// One live edit of `[limits]`.
#[derive(Debug, Clone)]
pub struct Edit {
    /// When the file changes (virtual ms). In a fleet each replica reloads
    /// up to `EDIT_SPREAD_MS` later (`fleet::run_fleet`), as replicas
    /// watching one ConfigMap each see it.
    pub at_ms: u64,
    /// What it changes, in words (for a failing seed's report).
    pub what: String,
    /// The limits after it, whole.
    pub limits: LimitSet,
}

/// In a fleet, how much later than the edit the last replica reloads.
pub const EDIT_SPREAD_MS: u64 = 300;

/// A rule of any algorithm but the pacer's, of a limit in `limits`.
fn any_rule(g: &mut StdRng, limits: std::ops::RangeInclusive<u64>) -> RuleConfig {
    let periods = [250u64, 1000, 2000, 5000];
    let period = Duration::from_millis(periods[g.random_range(0..periods.len())]);
    let limit = g.random_range(limits);
    match g.random_range(0..6) {
        0 => rule("fixed_window", limit, period, None),
        1 => rule("sliding_window_log", limit, period, None),
        2 => rule("sliding_window_counter", limit, period, None),
        3 => rule("burst_fill", limit, period, None),
        4 => rule(
            "token_bucket",
            limit,
            period,
            Some(limit + g.random_range(0..=limit)),
        ),
        _ => rule("gcra", limit, period, Some(g.random_range(1..=limit))),
    }
}

/// A pacer (`leaky_bucket`): its grants are go-at instants, which the
/// limit checker judges only where nothing else holds the seller.
fn paced(r: &RuleConfig) -> bool {
    r.algorithm == "leaky_bucket"
}

/// One rule, shadow or not: a list may not hold it twice either way.
fn same(a: &RuleConfig, b: &RuleConfig) -> bool {
    (&a.algorithm, a.limit, a.period, a.burst) == (&b.algorithm, b.limit, b.period, b.burst)
}

/// `r` with a new limit drawn (lowered or raised, from 1 to twice it), its
/// algorithm and period kept, and a burst drawn again as the first draw
/// does.
fn relimit(g: &mut StdRng, r: &mut RuleConfig) {
    let mut limit = g.random_range(1..=2 * r.limit.max(1));
    if limit == r.limit {
        limit += 1;
    }
    r.limit = limit;
    r.burst = match r.algorithm.as_str() {
        "token_bucket" => Some(limit + g.random_range(0..=limit)),
        "gcra" => Some(g.random_range(1..=limit)),
        _ => None,
    };
}

pub fn rule(algorithm: &str, limit: u64, period: Duration, burst: Option<u64>) -> RuleConfig {
    RuleConfig {
        algorithm: algorithm.to_owned(),
        limit,
        period,
        burst,
        shadow: false,
    }
}

impl Scenario {
    /// An empty world: one partition, no sellers, no faults.
    pub fn quiet(seed: u64) -> Scenario {
        Scenario {
            seed,
            partitions: 1,
            tier_partitions: 2,
            sellers: Vec::new(),
            jobs: Vec::new(),
            faults: Faults {
                max_message_bytes: 1_000_000,
                latency_ms: (5, 20),
                redis_latency_us: (100, 2_000),
                timeout: Duration::from_secs(10),
                // Every hold ends well inside a run: a job still waiting
                // at the end is then lost, not merely held.
                max_retry_after: Duration::from_secs(60),
                ..Faults::default()
            },
            crashes: Vec::new(),
            rebalances: Vec::new(),
            fences: Vec::new(),
            stalls: Vec::new(),
            clock_jumps: Vec::new(),
            concurrency: 8,
            fetch: 8,
            adaptive: false,
            learn: None,
            priority_aging: None,
            ordering: OrderingMode::Key,
            fresh_install: false,
            max_attempts: 5,
            on_error: OnError::FailClosed,
            fleet: 1,
            faults_end_ms: 0,
            // Long enough for every hold to end: a parked record waits at most
            // its tier's delay (1 h) after a clock step, whatever the step.
            limit_ms: 4 * 3600 * 1000,
            weights: BTreeMap::new(),
            min_shares: BTreeMap::new(),
            more_rules: BTreeMap::new(),
            global: Vec::new(),
            tiers: BTreeMap::new(),
            tier_of: BTreeMap::new(),
            edits: Vec::new(),
        }
    }

    /// What seed `seed` draws.
    pub fn random(seed: u64) -> Scenario {
        let mut r = StdRng::seed_from_u64(seed);
        let mut sc = Scenario::quiet(seed);
        sc.partitions = r.random_range(1..=6);
        sc.concurrency = r.random_range(1..=16);
        let horizon = r.random_range(5_000..=60_000u64);
        sc.faults_end_ms = horizon;
        let n_sellers = r.random_range(1..=6);
        for i in 0..n_sellers {
            let period = Duration::from_millis(
                *[250u64, 1000, 2000, 5000]
                    .get(r.random_range(0..4))
                    .unwrap_or(&1000),
            );
            let limit = r.random_range(1..=20);
            let rule = match r.random_range(0..11) {
                0 => None,
                1..=3 => Some(rule("fixed_window", limit, period, None)),
                4..=5 => Some(rule("sliding_window_log", limit, period, None)),
                6..=7 => Some(rule(
                    "token_bucket",
                    limit,
                    period,
                    Some(limit + r.random_range(0..=limit)),
                )),
                8..=9 => Some(rule("gcra", limit, period, Some(r.random_range(1..=limit)))),
                // A pacer: its grants name the instant each unit may go.
                _ => Some(rule(
                    "leaky_bucket",
                    limit,
                    period,
                    Some(r.random_range(1..=limit)),
                )),
            };
            sc.sellers.push(SellerSpec {
                name: format!("seller-{i}"),
                rule,
                max_in_flight: None,
            });
        }
        let n_jobs = r.random_range(1..=150);
        for _ in 0..n_jobs {
            let seller = r.random_range(0..n_sellers);
            let cost = match r.random_range(0..20) {
                0 => r.random_range(2..=4),
                1 => 25, // over most capacities
                _ => 1,
            };
            sc.jobs.push(JobSpec {
                sku: None,
                priority: 0,
                seller,
                cost,
                at_ms: r.random_range(0..=horizon),
                partition: r.random_range(0..sc.partitions),
                malformed: r.random_bool(0.03),
                poison: match r.random_range(0..40) {
                    0 => Poison::Rejected,
                    1 => Poison::AlwaysFails,
                    _ => Poison::None,
                },
                pad: 0,
            });
        }
        sc.jobs.sort_by_key(|j| j.at_ms);
        let window = |r: &mut StdRng, max_len: u64| {
            let from = r.random_range(0..horizon);
            Window {
                from_ms: from,
                to_ms: (from + r.random_range(100..=max_len)).min(horizon),
            }
        };
        for _ in 0..r.random_range(0..=2) {
            let kind = [
                OutageKind::Status503,
                OutageKind::Timeout,
                OutageKind::Refused,
            ][r.random_range(0..3)];
            sc.faults.outages.push((window(&mut r, 20_000), kind));
        }
        for _ in 0..r.random_range(0..=2) {
            let seller = r
                .random_bool(0.7)
                .then(|| format!("seller-{}", r.random_range(0..n_sellers)));
            let kind = match r.random_range(0..6) {
                0 => RetryAfterKind::Seconds(r.random_range(1..=5)),
                1 => RetryAfterKind::Zero,
                2 => RetryAfterKind::PastDate,
                3 => RetryAfterKind::Garbage,
                4 => RetryAfterKind::Huge,
                _ => RetryAfterKind::Absent,
            };
            sc.faults
                .throttles
                .push((window(&mut r, 10_000), seller, kind));
        }
        for _ in 0..r.random_range(0..=1) {
            sc.faults.redis_errors.push(window(&mut r, 10_000));
        }
        for _ in 0..r.random_range(0..=1) {
            sc.faults.redis_hangs.push(window(&mut r, 5_000));
        }
        if r.random_bool(0.3) {
            sc.faults.write_failure = 0.2;
        }
        for _ in 0..r.random_range(0..=2) {
            sc.crashes
                .push((r.random_range(0..horizon), r.random_range(100..=3_000)));
        }
        for _ in 0..r.random_range(0..=2) {
            let parts: Vec<i32> = (0..sc.partitions).filter(|_| r.random_bool(0.5)).collect();
            if !parts.is_empty() {
                sc.rebalances.push((
                    r.random_range(0..horizon),
                    parts,
                    r.random_range(50..=2_000),
                ));
            }
        }
        for _ in 0..r.random_range(0..=2) {
            let by: i64 = r.random_range(-7_200_000_000..=7_200_000_000);
            sc.clock_jumps.push((r.random_range(0..horizon), by));
        }
        sc.faults.latency_ms = (1, r.random_range(5..=200));
        // Operators' pauses, from a generator of their own: every draw
        // above is what it was before pauses existed.
        let mut p = StdRng::seed_from_u64(seed ^ PAUSE_SALT);
        if p.random_bool(0.3) {
            for _ in 0..p.random_range(1..=2) {
                let from = p.random_range(0..horizon);
                let window = Window {
                    from_ms: from,
                    to_ms: from + p.random_range(100..=40_000),
                };
                let who = p
                    .random_bool(0.7)
                    .then(|| format!("seller-{}", p.random_range(0..n_sellers)));
                sc.faults.pauses.push((window, who, p.random_bool(0.5)));
            }
        }
        // Calls in flight capped for some sellers, from a generator of
        // their own too.
        let mut f = StdRng::seed_from_u64(seed ^ IN_FLIGHT_SALT);
        if f.random_bool(0.3) {
            for s in &mut sc.sellers {
                if f.random_bool(0.5) {
                    s.max_in_flight = Some(f.random_range(1..=3));
                }
            }
        }
        // Adaptive concurrency on half the seeds; a downstream that takes
        // only so many calls at once (shedding or queueing the rest) on a
        // third of those, whatever the concurrency.
        let mut c = StdRng::seed_from_u64(seed ^ CAPACITY_SALT);
        sc.adaptive = c.random_bool(0.5);
        if sc.adaptive && c.random_bool(0.3) {
            sc.faults.capacity = Some(HiddenCapacity {
                calls: c.random_range(1..=sc.concurrency),
                shed: c.random_bool(0.5),
            });
        }
        // Limits learnt from 429s on a third of the seeds; on half of
        // those, a limited seller the downstream allows less than its rule.
        let mut g = StdRng::seed_from_u64(seed ^ LEARN_SALT);
        if g.random_bool(0.3) {
            sc.learn = Some(LearnConfig {
                enabled: true,
                decrease: g.random_range(0.5..0.95),
                floor: g.random_range(0.05..0.5),
                recovery: Duration::from_secs(g.random_range(5..=300)),
            });
            let limited: Vec<&SellerSpec> =
                sc.sellers.iter().filter(|s| s.rule.is_some()).collect();
            if !limited.is_empty() && g.random_bool(0.5) {
                let s = limited[g.random_range(0..limited.len())];
                let per_s = s.rule.as_ref().map_or(1, |r| {
                    (r.limit * 1000 / r.period.as_millis().max(1) as u64).max(1)
                });
                sc.faults
                    .seller_rates
                    .push((s.name.clone(), g.random_range(1..=per_s)));
            }
        }
        // Priorities on a third of the seeds: some jobs urgent, waiting
        // raising every job from 1 to 30 s per level.
        let mut q = StdRng::seed_from_u64(seed ^ PRIORITY_SALT);
        if q.random_bool(0.3) {
            sc.priority_aging = Some(Duration::from_secs(q.random_range(1..=30)));
            for j in &mut sc.jobs {
                if q.random_bool(0.3) {
                    j.priority = q.random_range(1..=9);
                }
            }
        }
        // Redis loses its data, on about 30 % of the seeds.
        let mut l = StdRng::seed_from_u64(seed ^ LOSS_SALT);
        if l.random_bool(0.3) {
            for _ in 0..l.random_range(1..=2) {
                sc.faults.state_losses.push(l.random_range(0..horizon));
            }
        }
        // What orders the jobs, and how their keys spread: one product per
        // job, a few hot products per seller, or none named (the record
        // key, the seller's name, orders them: one lane per seller and
        // partition). From a generator of its own.
        let mut o = StdRng::seed_from_u64(seed ^ ORDER_SALT);
        sc.ordering = match o.random_range(0..4) {
            0 => OrderingMode::Seller,
            1 => OrderingMode::None,
            _ => OrderingMode::Key,
        };
        let spread = o.random_range(0..3);
        for (i, j) in sc.jobs.iter_mut().enumerate() {
            j.sku = match spread {
                0 => Some(format!("p{i}")),
                1 => Some(format!("hot{}", o.random_range(0..3))),
                _ => None,
            };
        }
        // A first deploy on a third of the seeds, from a generator of its
        // own: Redis starts without the loss guard's epoch, as an empty
        // Redis does, and a loss may follow the first calls.
        let mut n = StdRng::seed_from_u64(seed ^ INSTALL_SALT);
        sc.fresh_install = n.random_bool(1.0 / 3.0);
        // Partial losses on about 20 % of the seeds, from a generator of
        // their own: every seller's state goes back 50 ms to 2 s on the
        // same server (a put-back from an older copy), the epoch staying.
        // Off unless `SIM_PARTIAL_LOSSES=1` (see [`partial_losses_on`]).
        let mut b = StdRng::seed_from_u64(seed ^ ROLLBACK_SALT);
        if partial_losses_on() && b.random_bool(0.2) {
            for _ in 0..b.random_range(1..=2) {
                let at = b.random_range(0..horizon);
                sc.faults.rollbacks.push((at, b.random_range(50..=2_000)));
            }
            sc.faults.rollbacks.sort_unstable();
            let keys = throttle_worker::limiter::KeySpace::new("sim");
            sc.faults.rollback_keys = sc
                .sellers
                .iter()
                .map(|s| keys.seller_state(&s.name))
                .collect();
        }
        // Failovers on about 15 % of the seeds, from a generator of their
        // own: another server takes over with every key 50 ms to 2 s
        // older (a replica promoted that missed the last writes, a
        // restart that loaded an older save).
        let mut f = StdRng::seed_from_u64(seed ^ FAILOVER_SALT);
        if f.random_bool(0.15) {
            for _ in 0..f.random_range(1..=2) {
                let at = f.random_range(0..horizon);
                sc.faults.failovers.push((at, f.random_range(50..=2_000)));
            }
            sc.faults.failovers.sort_unstable();
        }
        // The downstream's own ways to fail that the outages above do not
        // make, from a generator of their own: a planned maintenance (503
        // with `Retry-After`, which holds the whole downstream), and a
        // stretch where some calls are registered only after the client's
        // timeout (a success the client never sees, so it calls again).
        let mut d = StdRng::seed_from_u64(seed ^ DOWNSTREAM_SALT);
        if d.random_bool(0.3) {
            let kind = OutageKind::Maintenance {
                retry_after_s: d.random_range(1..=30),
            };
            let from = d.random_range(0..horizon);
            let to = (from + d.random_range(1_000..=20_000)).min(horizon.max(from + 1));
            sc.faults.outages.push((
                Window {
                    from_ms: from,
                    to_ms: to,
                },
                kind,
            ));
        }
        if d.random_bool(0.3) {
            let kind = OutageKind::GaveUp {
                percent: d.random_range(10..=60),
            };
            let from = d.random_range(0..horizon);
            let to = (from + d.random_range(500..=10_000)).min(horizon.max(from + 1));
            sc.faults.outages.push((
                Window {
                    from_ms: from,
                    to_ms: to,
                },
                kind,
            ));
        }
        sc.draw_rule_sets(seed);
        // A third of the worlds admit without Redis while it fails (issue
        // 53): unchecked (`fail_open`) or by each replica's share of every
        // rule in memory (`local`). From a generator of its own.
        let mut e = StdRng::seed_from_u64(seed ^ ON_ERROR_SALT);
        if e.random_bool(1.0 / 3.0) {
            sc.on_error = if e.random_bool(0.5) {
                OnError::FailOpen
            } else {
                OnError::Local
            };
        }
        // The broker sends records again on about 30 % of the seeds, from a
        // generator of its own: at each instant, every consumer's owned
        // partitions go back 1 to 20 records within their assignment.
        let mut a = StdRng::seed_from_u64(seed ^ REDELIVERY_SALT);
        if a.random_bool(0.3) {
            for _ in 0..a.random_range(1..=3) {
                let at = a.random_range(0..horizon);
                sc.faults.redeliveries.push((at, a.random_range(1..=20)));
            }
            sc.faults.redeliveries.sort_unstable();
        }
        // Producing to the retry tiers and the dead-letter topic fails for
        // 2 to 30 s at a time on about 30 % of the seeds, from a generator
        // of its own.
        let mut w = StdRng::seed_from_u64(seed ^ PRODUCE_SALT);
        if w.random_bool(0.3) {
            for _ in 0..w.random_range(1..=2) {
                let from = w.random_range(0..horizon);
                let to = (from + w.random_range(2_000..=30_000)).min(horizon.max(from + 1));
                sc.faults.produce_outages.push(Window {
                    from_ms: from,
                    to_ms: to,
                });
            }
        }
        // A slow but answering Redis on about 30 % of the seeds, from a
        // generator of its own: for 1 to 20 s at a time, each way of every
        // round trip takes from tens of ms to past the limiter's timeout
        // (`REDIS_TIMEOUT`), so some replies come back in time, late, and
        // some only after the caller gave up.
        let mut s = StdRng::seed_from_u64(seed ^ SLOW_SALT);
        if s.random_bool(0.3) {
            for _ in 0..s.random_range(1..=2) {
                let from = s.random_range(0..horizon);
                let to = (from + s.random_range(1_000..=20_000)).min(horizon.max(from + 1));
                let lo = s.random_range(10..=300);
                let hi = s.random_range(lo..=1_200);
                sc.faults.redis_slow.push((
                    Window {
                        from_ms: from,
                        to_ms: to,
                    },
                    (lo, hi),
                ));
            }
        }
        // A replica of a fleet stalls past its session timeout (0.2 to 9 s
        // past it) on about 30 % of the seeds, from a generator of its own
        // (not with `SIM_STALLS=0`: [`stalls_on`]).
        let mut s = StdRng::seed_from_u64(seed ^ STALL_SALT);
        if s.random_bool(0.3) && stalls_on() {
            for _ in 0..s.random_range(1..=2) {
                let at = s.random_range(0..horizon);
                sc.stalls
                    .push((at, s.random_range(200..=9_000), s.random_range(0..4)));
            }
            sc.stalls.sort_unstable();
        }
        // The broker loses the group's commits of the last 0.2 to 10 s on
        // about 30 % of the seeds, from a generator of its own.
        let mut k = StdRng::seed_from_u64(seed ^ LOST_COMMIT_SALT);
        if k.random_bool(0.3) {
            for _ in 0..k.random_range(1..=2) {
                let at = k.random_range(0..horizon);
                sc.faults
                    .lost_commits
                    .push((at, k.random_range(200..=10_000)));
            }
            sc.faults.lost_commits.sort_unstable();
        }
        sc.draw_shadows(seed);
        sc.draw_tiers(seed);
        sc.draw_edits(seed, horizon);
        sc
    }

    /// Shadow rules (`shadow = true`: decided and counted, never holding
    /// a call), issue 53 item 4, from a generator of their own, on about
    /// a quarter of the worlds: on half the limited sellers (not a
    /// pacer's), one beside its own rules, its limit at most its drawn
    /// rule's (so that it would refuse, and a job may cost more than it
    /// holds); on a third of those worlds, a global one too.
    fn draw_shadows(&mut self, seed: u64) {
        let mut g = StdRng::seed_from_u64(seed ^ SHADOW_SALT);
        if !g.random_bool(0.25) {
            return;
        }
        for i in 0..self.sellers.len() {
            let Some(own) = self.sellers[i].rule.clone().filter(|r| !paced(r)) else {
                continue;
            };
            if !g.random_bool(0.5) {
                continue;
            }
            let mut r = any_rule(&mut g, 1..=own.limit.max(1));
            r.shadow = true;
            let more = self.more_rules.get(&i).map_or(&[][..], |m| &m[..]);
            if !same(&r, &own) && !more.iter().any(|m| same(m, &r)) {
                self.more_rules.entry(i).or_default().push(r);
            }
        }
        if g.random_bool(1.0 / 3.0) {
            let mut r = any_rule(&mut g, 1..=30);
            r.shadow = true;
            if !self.global.iter().any(|m| same(m, &r)) {
                self.global.push(r);
            }
        }
        debug_assert!(self.valid(), "shadow rules drawn invalid: {self:?}");
    }

    /// Tiers (`limits.tiers`, a seller's `tier`), issue 53 item 4, from a
    /// generator of their own, on about a quarter of the worlds: one or
    /// two tiers of one or two rules (never a pacer), a shadow rule in
    /// some, and each limited seller (not a pacer's) in one of them with
    /// a chance of 0.6.
    fn draw_tiers(&mut self, seed: u64) {
        let mut g = StdRng::seed_from_u64(seed ^ TIER_SALT);
        if !g.random_bool(0.25) {
            return;
        }
        let n = g.random_range(1..=2);
        for t in 0..n {
            let mut list: Vec<RuleConfig> = Vec::new();
            for k in 0..g.random_range(1..=3) {
                let mut r = any_rule(&mut g, 1..=20);
                r.shadow = k == 2;
                if !list.iter().any(|m| same(m, &r)) {
                    list.push(r);
                }
            }
            self.tiers.insert(format!("tier-{t}"), list);
        }
        for (i, s) in self.sellers.iter().enumerate() {
            if s.rule.as_ref().is_some_and(|r| !paced(r)) && g.random_bool(0.6) {
                self.tier_of
                    .insert(i, format!("tier-{}", g.random_range(0..n)));
            }
        }
        debug_assert!(self.valid(), "tiers drawn invalid: {self:?}");
    }

    /// Live edits of `[limits]` while calls are under way, issue 53 item
    /// 4, from a generator of their own, on about 30 % of the worlds: one
    /// to three, at instants while jobs arrive, each of one limited seller
    /// (not a pacer's): its rule's limit lowered or raised (its tier's
    /// rule, when it is in one: every seller of the tier), the seller
    /// moved to another tier or out of its tier, or a rule of its made
    /// shadow or enforced (a shadow rule added when it has none).
    fn draw_edits(&mut self, seed: u64, horizon: u64) {
        let mut g = StdRng::seed_from_u64(seed ^ EDIT_SALT);
        if !g.random_bool(0.3) {
            return;
        }
        let editable: Vec<usize> = (0..self.sellers.len())
            .filter(|&i| self.sellers[i].rule.as_ref().is_some_and(|r| !paced(r)))
            .collect();
        if editable.is_empty() {
            return;
        }
        let mut times: Vec<u64> = (0..g.random_range(1..=3))
            .map(|_| g.random_range(0..horizon.max(1)))
            .collect();
        times.sort_unstable();
        let mut set = self.limit_set();
        for at_ms in times {
            let i = editable[g.random_range(0..editable.len())];
            let name = self.sellers[i].name.clone();
            let mut next = set.clone();
            let tier = next.tier_of.get(&i).cloned();
            let kind = match g.random_range(0..4) {
                2 if !next.tiers.is_empty() => 2,
                3 => 3,
                _ => 0,
            };
            let what = match (kind, tier) {
                (0, Some(t)) => {
                    let list = next.tiers.get_mut(&t).expect("its tier");
                    let k = list.iter().position(|r| !r.shadow).unwrap_or(0);
                    relimit(&mut g, &mut list[k]);
                    format!("{t}'s rule {k} (so {name}'s) to {:?}", list[k])
                }
                (0, None) => {
                    let r = next.rules[i].as_mut().expect("a limited seller");
                    relimit(&mut g, r);
                    format!("{name}'s rule to {r:?}")
                }
                (2, now) => {
                    let others: Vec<Option<String>> = next
                        .tiers
                        .keys()
                        .cloned()
                        .map(Some)
                        .chain(std::iter::once(None))
                        .filter(|t| *t != now)
                        .collect();
                    let to = others[g.random_range(0..others.len())].clone();
                    match &to {
                        Some(t) => next.tier_of.insert(i, t.clone()),
                        None => next.tier_of.remove(&i),
                    };
                    format!("{name} moved from {now:?} to tier {to:?}")
                }
                (_, Some(t)) => {
                    let list = next.tiers.get_mut(&t).expect("its tier");
                    let k = g.random_range(0..list.len());
                    list[k].shadow = !list[k].shadow;
                    if list.iter().all(|r| r.shadow) {
                        list[k].shadow = false;
                    }
                    format!("{t}'s rule {k} (so {name}'s) to {:?}", list[k])
                }
                (_, None) => {
                    let own = next.rules[i].clone().expect("a limited seller");
                    let more = next.more_rules.entry(i).or_default();
                    if more.is_empty() {
                        let mut r = any_rule(&mut g, 1..=own.limit.max(1));
                        r.shadow = true;
                        if !same(&r, &own) {
                            more.push(r);
                        }
                    } else {
                        let k = g.random_range(0..more.len());
                        more[k].shadow = !more[k].shadow;
                    }
                    let more = more.clone();
                    if more.is_empty() {
                        next.more_rules.remove(&i);
                    }
                    format!("{name}'s rules beside its own to {more:?}")
                }
            };
            if next != set && self.with_limits(&next).valid() {
                self.edits.push(Edit {
                    at_ms,
                    what,
                    limits: next.clone(),
                });
                set = next;
            }
        }
    }

    /// The parts of the limits an edit may change, as they are now.
    pub fn limit_set(&self) -> LimitSet {
        LimitSet {
            rules: self.sellers.iter().map(|s| s.rule.clone()).collect(),
            more_rules: self.more_rules.clone(),
            tiers: self.tiers.clone(),
            tier_of: self.tier_of.clone(),
        }
    }

    /// This world with `limits` in place of its own.
    pub fn with_limits(&self, limits: &LimitSet) -> Scenario {
        let mut sc = self.clone();
        for (s, r) in sc.sellers.iter_mut().zip(&limits.rules) {
            s.rule = r.clone();
        }
        sc.more_rules = limits.more_rules.clone();
        sc.tiers = limits.tiers.clone();
        sc.tier_of = limits.tier_of.clone();
        sc.edits = Vec::new();
        sc
    }

    /// The world's limits from the start (0) and after each edit (1..):
    /// the world as each edit leaves it.
    pub fn eras(&self) -> Vec<Scenario> {
        std::iter::once(self.clone())
            .chain(self.edits.iter().map(|e| self.with_limits(&e.limits)))
            .collect()
    }

    /// Whether the product takes these limits.
    pub fn valid(&self) -> bool {
        throttle_worker::limiter::Policy::from_config(&self.limits()).is_ok()
    }

    /// A fleet's replica that loses Redis while the others keep it (issue
    /// 53 item 4), from a generator of its own, on about 30 % of the
    /// fleets: for 0.5 to 10 s, every call of one replica (the member at
    /// a drawn place) fails, refused or hung, while the others' calls are
    /// answered. Drawn for fleets only: a single process losing Redis is
    /// what `redis_errors` and `redis_hangs` already make.
    pub fn draw_replica_faults(&mut self, seed: u64) {
        let mut g = StdRng::seed_from_u64(seed ^ REPLICA_SALT);
        if !g.random_bool(0.3) {
            return;
        }
        let horizon = self.faults_end_ms.max(1);
        for _ in 0..g.random_range(1..=2) {
            let from = g.random_range(0..horizon);
            let to = (from + g.random_range(500..=10_000)).min(horizon.max(from + 1));
            let kind = if g.random_bool(0.5) {
                ReplicaFault::Down
            } else {
                ReplicaFault::Hung
            };
            self.faults.replica_redis.push((
                Window {
                    from_ms: from,
                    to_ms: to,
                },
                g.random_range(0..4),
                kind,
            ));
        }
    }

    /// The rule sets the first draw never made, from a generator of their
    /// own: on some limited sellers, a `sliding_window_counter` or a
    /// `burst_fill` in place of the drawn rule, and a second and third
    /// rule held together with it; on some worlds without a pacer,
    /// global rules over every limited seller.
    fn draw_rule_sets(&mut self, seed: u64) {
        let mut g = StdRng::seed_from_u64(seed ^ RULES_SALT);
        let draw = any_rule;
        for (i, s) in self.sellers.iter_mut().enumerate() {
            let Some(own) = s.rule.as_mut().filter(|r| !paced(r)) else {
                continue;
            };
            if g.random_bool(0.3) {
                own.algorithm = if g.random_bool(0.5) {
                    "sliding_window_counter"
                } else {
                    "burst_fill"
                }
                .to_owned();
                own.burst = None;
            }
            if g.random_bool(0.3) {
                let mut more: Vec<RuleConfig> = Vec::new();
                for _ in 0..g.random_range(1..=2) {
                    let r = draw(&mut g, 1..=30);
                    // A rule listed twice is refused by the config.
                    if r != *own && !more.contains(&r) {
                        more.push(r);
                    }
                }
                self.more_rules.insert(i, more);
            }
        }
        let any_pacer = self
            .sellers
            .iter()
            .any(|s| s.rule.as_ref().is_some_and(paced));
        if !any_pacer && g.random_bool(0.3) {
            for _ in 0..g.random_range(1..=2) {
                let r = draw(&mut g, 5..=60);
                if !self.global.contains(&r) {
                    self.global.push(r);
                }
            }
        }
    }

    /// A limited seller's own rules: its drawn one and those held with it.
    /// Under a tier, the tier's. Shadow rules included (see
    /// [`RuleConfig::shadow`]): the limit checker leaves them out.
    pub fn rules_of(&self, seller: usize) -> Vec<RuleConfig> {
        if let Some(t) = self.tier_of.get(&seller) {
            return self.tiers.get(t).cloned().unwrap_or_default();
        }
        let s = &self.sellers[seller];
        s.rule
            .iter()
            .chain(self.more_rules.get(&seller).into_iter().flatten())
            .cloned()
            .collect()
    }

    /// The unit of order `job` belongs to (the invariant's own reading of
    /// `worker.ordering`, not the engine's): seller, partition and key; none
    /// under `none`.
    pub fn order_key(&self, job: usize) -> Option<(usize, i32, String)> {
        let j = &self.jobs[job];
        if j.malformed {
            return None;
        }
        match self.ordering {
            OrderingMode::None => None,
            OrderingMode::Seller => Some((j.seller, j.partition, String::new())),
            OrderingMode::Key => Some((
                j.seller,
                j.partition,
                j.sku
                    .clone()
                    .unwrap_or_else(|| self.sellers[j.seller].name.clone()),
            )),
        }
    }

    pub fn limits(&self) -> LimitsConfig {
        let mut sellers = BTreeMap::new();
        for (i, s) in self.sellers.iter().enumerate() {
            let mut cfg = match &s.rule {
                Some(_) if self.tier_of.contains_key(&i) => SellerConfig {
                    tier: self.tier_of.get(&i).cloned(),
                    max_in_flight: s.max_in_flight,
                    ..SellerConfig::default()
                },
                Some(_) => SellerConfig {
                    rules: Some(self.rules_of(i)),
                    max_in_flight: s.max_in_flight,
                    ..SellerConfig::default()
                },
                None => SellerConfig {
                    unlimited: true,
                    max_in_flight: s.max_in_flight,
                    ..SellerConfig::default()
                },
            };
            cfg.weight = self.weights.get(&i).copied();
            cfg.min_share = self.min_shares.get(&i).copied();
            sellers.insert(s.name.clone(), cfg);
        }
        LimitsConfig {
            file: None,
            default: vec![rule("fixed_window", 10, Duration::from_secs(1), None)],
            global: self.global.clone(),
            tiers: self.tiers.clone(),
            sellers,
            learn: self.learn.clone().unwrap_or_default(),
            ..LimitsConfig::default()
        }
    }

    pub fn settings(&self) -> Settings {
        let mut s = config::load_from(None, Vec::new())
            .expect("the defaults load")
            .settings;
        s.kafka.topic = "jobs".to_owned();
        s.kafka.retry_topic_prefix = "jobs.retry".to_owned();
        s.kafka.dlq_topic = "jobs.dlq".to_owned();
        s.kafka.commit_interval = Duration::from_millis(200);
        s.downstream.concurrency = self.concurrency;
        s.downstream.adaptive_concurrency = self.adaptive;
        s.downstream.min_concurrency = 1;
        s.downstream.max_attempts = self.max_attempts;
        s.downstream.timeout = self.faults.timeout;
        s.downstream.max_retry_after = self.faults.max_retry_after;
        s.redis.on_error = self.on_error;
        s.worker.shutdown_timeout = Duration::from_secs(5);
        if let Some(aging) = self.priority_aging {
            s.worker.priority_aging = aging;
        }
        s.worker.ordering = self.ordering;
        s.limits = self.limits();
        s
    }
}
