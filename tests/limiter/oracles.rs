//! Oracles written from each algorithm's definition, not from its code
//! (issue 12). `src/limiter/local/` mirrors the Lua function by function,
//! so `limiter::agreement` catches transcription slips but not a shared
//! misunderstanding. Here random arrival sequences (explicit times; acquires
//! all-or-nothing and up-to, job lists, refunds of the last units of a
//! grant, downstream blocks, costs above a rule's capacity) run on the real
//! script on Redis with one rule, and what was admitted (less what was
//! refunded) is checked against the definition:
//!
//! - sliding_window_log: at most `limit` units in every span of `period`,
//!   whatever its start;
//! - fixed_window: at most `limit` units per epoch-aligned window;
//! - sliding_window_counter (its documented approximation): at every grant
//!   instant, the previous aligned window's units weighted by the share of
//!   it the sliding window still covers, (period − elapsed)/period, plus the
//!   current window's units fit the limit; so at most `limit` per aligned
//!   window, and fewer than 2·limit in any span shorter than one period (a
//!   span across a boundary holds c + limit − c·(period − e)/period
//!   < 2·limit);
//! - token_bucket, gcra, leaky_bucket: at most burst + rate·t units in every
//!   span t; token_bucket and gcra admit the same for the same arrivals;
//! - leaky_bucket (a pacer): the go-at instants of admitted units are at
//!   least period/limit apart (k units apart: k·period/limit, less 2 µs of
//!   rounding: each go-at is rounded up to the µs);
//! - burst_fill: at most 2·limit − 1 units in any span shorter than one
//!   period (the tail of one period and the whole next around a refill).
//!
//! And for every algorithm: a refusal's retry_after is honest (the same call
//! at now + retry_after passes, one rule, one replica), a block refuses every
//! call until its end and no refusal names the block after it, and every
//! key the scripts write has a TTL no longer than its useful life + 1 s.
//! Each property asserts what its generator covered (refusals, partial
//! grants, block refusals, never-answers, refunds).
//!
//! `PROPTEST_CASES` sets the cases per property (default 40: a few seconds).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::common::{raw, store, unique_prefix, T0};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestError, TestRunner};
use redis::aio::MultiplexedConnection;
use throttle_worker::limiter::{
    Algorithm, BlockAt, BlockRead, JobsCall, JobsRequest, Mode, RedisStore, RefundCall, Reply,
    Rule, StateKey, Store,
};

#[derive(Debug, Clone)]
enum Step {
    Acquire {
        cost: u64,
        mode: Mode,
    },
    Jobs {
        costs: Vec<u64>,
    },
    /// Give back 1 + n % kept of the last still-held grant's last units.
    Refund {
        n: u64,
    },
    Block {
        dur_us: u64,
    },
}

#[derive(Debug, Clone)]
struct Case {
    rule: Rule,
    start: u64,
    steps: Vec<(u64, Step)>,
}

fn rule_of(algorithms: Vec<Algorithm>) -> impl Strategy<Value = Rule> {
    let period_us = prop_oneof![1 => Just(50u64), 6 => 51u64..5_000, 1 => Just(1_000_000u64)];
    (
        prop::sample::select(algorithms),
        1u64..=6,
        period_us,
        1u64..=8,
    )
        .prop_map(|(algorithm, limit, period_us, burst)| {
            let burst = algorithm.uses_burst().then_some(burst);
            Rule::new(algorithm, limit, Duration::from_micros(period_us), burst)
                .expect("generated rules are valid")
        })
}

/// Gaps between calls: often none, often short, sometimes long, and often
/// right at the rule's period (±1 µs), where window boundaries bite.
fn gap(period_us: u64) -> impl Strategy<Value = u64> {
    prop_oneof![
        3 => Just(0u64),
        4 => 0u64..300,
        3 => 0u64..5_000,
        2 => (period_us - 1)..=(period_us + 1),
        1 => 100_000u64..2_000_000,
    ]
}

fn cost() -> impl Strategy<Value = u64> {
    prop_oneof![6 => 1u64..=2, 2 => 1u64..=9]
}

fn step(refunds: bool) -> impl Strategy<Value = Step> {
    let mode = prop_oneof![Just(Mode::AllOrNothing), Just(Mode::UpTo)];
    let refund_weight = if refunds { 2 } else { 0 };
    prop_oneof![
        10 => (cost(), mode).prop_map(|(cost, mode)| Step::Acquire { cost, mode }),
        4 => prop::collection::vec(cost(), 1..=4).prop_map(|costs| Step::Jobs { costs }),
        refund_weight => (0u64..64).prop_map(|n| Step::Refund { n }),
        1 => prop_oneof![1u64..3_000, 1_000u64..1_500_000].prop_map(|dur_us| Step::Block { dur_us }),
    ]
}

fn any_case(algorithms: Vec<Algorithm>, refunds: bool) -> impl Strategy<Value = Case> {
    rule_of(algorithms).prop_flat_map(move |rule| {
        (
            Just(rule),
            0u64..2_000_000,
            prop::collection::vec((gap(rule.period_us()), step(refunds)), 1..=40),
        )
            .prop_map(|(rule, start, steps)| Case { rule, start, steps })
    })
}

/// Units a call still holds.
#[derive(Debug, Clone)]
struct Held {
    id: String,
    at: u64,
    units: u64,
    go_at: u64,
}

/// What the properties saw, asserted at the end.
#[derive(Debug, Default)]
struct Seen {
    grants: u64,
    partial: u64,
    refused_by_rule: u64,
    refused_by_block: u64,
    never: u64,
    refunds: u64,
    retries_checked: u64,
    ttls_checked: u64,
}

struct Keys {
    prefix: String,
    /// The seller's hash: its block and the rule's place `r0`.
    hash: String,
    rule: (StateKey, Rule),
}

impl Keys {
    fn new(rule: Rule) -> Keys {
        let prefix = unique_prefix("oracle");
        let hash = format!("{prefix}:{{s}}:v2");
        Keys {
            rule: (StateKey::new(hash.clone(), "r0"), rule),
            hash,
            prefix,
        }
    }

    fn block(&self) -> BlockAt {
        BlockAt::new(self.hash.clone(), BlockRead::Field)
    }

    /// One cost as the limiter asks it: one job of the whole cost, or up
    /// to it as jobs of one unit.
    fn single(&self, now_us: u64, dry_run: bool, cost: u64, mode: Mode, id: &str) -> JobsCall {
        let costs = match mode {
            Mode::AllOrNothing => vec![cost],
            Mode::UpTo => vec![1; cost as usize],
        };
        self.jobs(now_us, dry_run, &costs, id)
    }

    /// Gives back `units` of call `id` (taken at `taken_at_us`), skipping
    /// its first `skip`.
    fn refund(&self, now_us: u64, units: u64, skip: u64, taken_at_us: u64, id: &str) -> RefundCall {
        RefundCall {
            now_us: Some(now_us),
            units,
            skip,
            taken_at_us,
            call_id: id.to_owned(),
            block: self.block(),
            rules: vec![self.rule.clone()],
        }
    }

    fn jobs(&self, now_us: u64, dry_run: bool, costs: &[u64], id: &str) -> JobsCall {
        JobsCall {
            now_us: Some(now_us),
            dry_run,
            guard: None,
            learn: None,
            requests: vec![JobsRequest {
                call_id: id.to_owned(),
                block: self.block(),
                rules: vec![self.rule.clone()],
                costs: costs.to_vec(),
                slots: None,
            }],
        }
    }

    async fn forget(&self, conn: &mut MultiplexedConnection) {
        let _: i64 = redis::cmd("DEL")
            .arg(&self.hash)
            .query_async(conn)
            .await
            .unwrap_or_else(|e| panic!("DEL under {}: {e}", self.prefix));
    }
}

/// One answer, whichever call shape asked.
struct Answer {
    reply: Reply,
    /// Jobs granted (job lists) or 1 (single cost) when granted.
    asked: u64,
    partial: bool,
}

async fn run_jobs(redis: &RedisStore, call: &JobsCall) -> Result<(Reply, i64), String> {
    let r = redis
        .run_jobs(call)
        .await
        .map_err(|e| format!("{call:?}: {e}"))?;
    Ok((r[0].head, r[0].jobs))
}

/// How long a charged call's record stays in the seller's hash for its
/// cancel when the caller sends no life of its own (`lua/calls.lua`).
const CALL_LIFE_US: u64 = 5_000_000;

/// The longest a key's state can matter after a write, from the definition.
fn useful_life_us(rule: &Rule) -> u64 {
    let (l, p, b) = (rule.limit().get(), rule.period_us(), rule.burst().get());
    match rule.algorithm() {
        // A window's count, a log entry, a burst_fill period: one period.
        Algorithm::FixedWindow | Algorithm::SlidingWindowLog | Algorithm::BurstFill => p,
        // The current window's count weighs on the whole next window.
        Algorithm::SlidingWindowCounter => 2 * p,
        // A bucket refills from empty (a queue drains) in burst/rate.
        Algorithm::TokenBucket | Algorithm::Gcra | Algorithm::LeakyBucket => (b * p).div_ceil(l),
    }
}

async fn pttl(conn: &mut MultiplexedConnection, key: &str) -> i64 {
    redis::cmd("PTTL")
        .arg(key)
        .query_async(conn)
        .await
        .expect("PTTL")
}

async fn exercise(
    redis: &RedisStore,
    conn: &mut MultiplexedConnection,
    keys: &Keys,
    case: &Case,
    seen: &mut Seen,
    log: &mut Vec<String>,
) -> Result<Vec<Held>, String> {
    let rule = case.rule;
    let mut now = T0 + case.start;
    let mut held: Vec<Held> = Vec::new();
    let mut blocked_until = 0u64;
    let mut longest_block_us = 0u64;
    // Every write happened after this instant: what has elapsed since is
    // at least what any key's TTL has run down.
    let first_write = Instant::now();
    for (n, (gap, step)) in case.steps.iter().enumerate() {
        now += gap;
        let id = format!("c{n}");
        let answer = match step {
            Step::Block { dur_us } => {
                let until = redis
                    .block(&keys.block(), Some(now), *dur_us)
                    .await
                    .map_err(|e| format!("block: {e}"))?;
                log.push(format!("+{} block {dur_us}µs -> +{}", now - T0, until - T0));
                if until != (now + dur_us).max(blocked_until) {
                    return Err(format!(
                        "a block of {dur_us}µs at +{} ends at +{}, the longer block at +{}",
                        now - T0,
                        until - T0,
                        blocked_until.saturating_sub(T0)
                    ));
                }
                blocked_until = until;
                longest_block_us = longest_block_us.max(*dur_us);
                None
            }
            Step::Refund { n } => {
                let Some(h) = held.iter_mut().rev().find(|h| h.units > 0) else {
                    continue;
                };
                let units = 1 + n % h.units;
                let call = keys.refund(now, units, h.units - units, h.at, &h.id);
                redis
                    .refund(&call)
                    .await
                    .map_err(|e| format!("{call:?}: {e}"))?;
                log.push(format!(
                    "+{} refund {units} of {}'s {}",
                    now - T0,
                    h.id,
                    h.units
                ));
                h.units -= units;
                seen.refunds += 1;
                None
            }
            Step::Acquire { cost, mode } => {
                let (reply, _) =
                    run_jobs(redis, &keys.single(now, false, *cost, *mode, &id)).await?;
                Some(Answer {
                    reply,
                    asked: *cost,
                    partial: reply.status == 1 && (reply.granted as u64) < *cost,
                })
            }
            Step::Jobs { costs } => {
                let (reply, jobs) = run_jobs(redis, &keys.jobs(now, false, costs, &id)).await?;
                Some(Answer {
                    reply,
                    asked: costs[0],
                    partial: reply.status == 1 && (jobs as usize) < costs.len(),
                })
            }
        };
        let Some(a) = answer else { continue };
        let r = a.reply;
        log.push(format!(
            "+{} {id} {step:?}: status {} granted {} go_at +{} retry {}µs by {}",
            now - T0,
            r.status,
            r.granted,
            r.go_at_us - r.now_us,
            r.retry_after_us,
            r.by
        ));
        if r.now_us as u64 != now {
            return Err(format!("decided at {} for a call at {now}", r.now_us));
        }
        if now < blocked_until && r.status == 1 {
            return Err(format!(
                "{id} granted at +{} inside a block until +{}",
                now - T0,
                blocked_until - T0
            ));
        }
        match r.status {
            1 => {
                seen.grants += 1;
                seen.partial += u64::from(a.partial);
                held.push(Held {
                    id: id.clone(),
                    at: now,
                    units: r.granted as u64,
                    go_at: r.go_at_us as u64,
                });
            }
            -1 => seen.never += 1,
            _ => {
                if r.by == 0 {
                    if now >= blocked_until {
                        return Err(format!(
                            "{id} refused by a block at +{} after it ended at +{}",
                            now - T0,
                            blocked_until.saturating_sub(T0)
                        ));
                    }
                    seen.refused_by_block += 1;
                } else {
                    seen.refused_by_rule += 1;
                }
                // Honest retry_after: the same call at now + retry_after
                // passes (a dry run, so the sequence goes on unchanged).
                let retry = r.retry_after_us as u64;
                if retry == 0 {
                    return Err(format!("{id} refused with no wait"));
                }
                let later = now + retry;
                let ok = match step {
                    Step::Acquire { cost, mode } => {
                        let (p, _) =
                            run_jobs(redis, &keys.single(later, true, *cost, *mode, "retry"))
                                .await?;
                        p.status == 1 && (*mode == Mode::UpTo || p.granted as u64 == *cost)
                    }
                    Step::Jobs { costs } => {
                        let (p, jobs) =
                            run_jobs(redis, &keys.jobs(later, true, &costs[..1], "retry")).await?;
                        p.status == 1 && jobs == 1
                    }
                    _ => unreachable!("only calls are answered"),
                };
                if !ok {
                    return Err(format!(
                        "{id} (first cost {}) refused at +{} with retry_after {retry}µs, but refused again at +{}",
                        a.asked,
                        now - T0,
                        later - T0
                    ));
                }
                seen.retries_checked += 1;
            }
        }
        // The hash has a TTL, none longer than the longest use of what it
        // holds (the rule's state, the block, the records of charged calls)
        // + 1 s of slack + 1 s of the expiry's grain (`lua/common.lua`),
        // and none shorter than the 1 s of slack a write gives (less the
        // time run since the case's first write, rounded to Redis' ms).
        {
            let key = &keys.hash;
            let life_us = useful_life_us(&rule)
                .max(longest_block_us)
                .max(CALL_LIFE_US);
            let ttl = pttl(conn, key).await;
            // Read after the PTTL's answer: a bound on its run-down.
            let ran_ms = first_write.elapsed().as_millis() as i64 + 1;
            if ttl == -2 {
                continue; // never written
            }
            let bound = life_us.div_ceil(1000) as i64 + 2000;
            let floor = (1000 - ran_ms).max(0);
            if ttl < 0 || ttl > bound || ttl < floor {
                return Err(format!(
                    "{key}: PTTL {ttl} ms, want {floor} <= PTTL <= {bound} (useful life {life_us}µs + 1 s; {ran_ms} ms since the first write)"
                ));
            }
            seen.ttls_checked += 1;
        }
    }
    held.retain(|h| h.units > 0);
    Ok(held)
}

/// Sum of held units with `at` in [lo, hi].
fn units_in(held: &[Held], lo: u64, hi: u64) -> u64 {
    held.iter()
        .filter(|h| h.at >= lo && h.at <= hi)
        .map(|h| h.units)
        .sum()
}

/// The definition's bound on what `held` may be, or why it is broken.
fn violation(rule: &Rule, held: &[Held]) -> Option<String> {
    let (l, p, b) = (rule.limit().get(), rule.period_us(), rule.burst().get());
    let spans_shorter_than_period = |max: u64| {
        held.iter().find_map(|h| {
            let n = units_in(held, h.at, h.at + p - 1);
            (n > max).then(|| {
                format!(
                    "{n} units in [+{}, +{}] (under one period of {p}µs) > {max}",
                    h.at - T0,
                    h.at + p - 1 - T0
                )
            })
        })
    };
    let aligned = |max: u64| {
        let mut per: BTreeMap<u64, u64> = BTreeMap::new();
        for h in held {
            *per.entry(h.at / p).or_default() += h.units;
        }
        per.into_iter().find_map(|(w, n)| {
            (n > max).then(|| format!("{n} units in the aligned window from +{}", w * p - T0))
        })
    };
    let rate = || {
        held.iter().find_map(|a| {
            held.iter().filter(|z| z.at >= a.at).find_map(|z| {
                let n = units_in(held, a.at, z.at);
                let allowed = b + (z.at - a.at) * l / p;
                (n > allowed).then(|| {
                    format!(
                        "{n} units in [+{}, +{}] > burst {b} + {}µs·{l}/{p}µs = {allowed}",
                        a.at - T0,
                        z.at - T0,
                        z.at - a.at
                    )
                })
            })
        })
    };
    match rule.algorithm() {
        Algorithm::SlidingWindowLog => spans_shorter_than_period(l),
        Algorithm::FixedWindow => aligned(l),
        Algorithm::SlidingWindowCounter => aligned(l)
            .or_else(|| weighted(l, p, held))
            .or_else(|| spans_shorter_than_period(2 * l - 1)),
        Algorithm::BurstFill => spans_shorter_than_period(2 * l - 1),
        Algorithm::TokenBucket | Algorithm::Gcra => rate(),
        Algorithm::LeakyBucket => rate().or_else(|| pacing(l, p, held)),
    }
}

/// sliding_window_counter's own definition, checked at every instant t a
/// grant was made: the previous aligned window's units, weighted by the
/// share (period − e)/period of it that the sliding window still covers,
/// plus the current window's units up to t, fit the limit:
/// prev·(period − e) + cur·period ≤ limit·period, with e = t − window start.
/// Every unit held at t counts (the last grant at t saw them all); units
/// refunded later only make the sums smaller, so this never blames a
/// correct script.
fn weighted(l: u64, p: u64, held: &[Held]) -> Option<String> {
    held.iter().find_map(|h| {
        let t = h.at;
        let start = t / p * p;
        let e = t - start;
        let prev: u64 = held
            .iter()
            .filter(|x| x.at < start && x.at + p >= start)
            .map(|x| x.units)
            .sum();
        let cur: u64 = held
            .iter()
            .filter(|x| x.at >= start && x.at <= t)
            .map(|x| x.units)
            .sum();
        let weight = u128::from(prev) * u128::from(p - e) + u128::from(cur) * u128::from(p);
        (weight > u128::from(l) * u128::from(p)).then(|| {
            format!(
                "at +{}: previous window {prev} units × ({p} − {e})/{p} + current {cur} > limit {l}",
                t - T0
            )
        })
    })
}

/// Departures k units apart must be at least k·period/limit apart (each
/// go-at is its exact slot rounded up, so 2 µs of slack).
fn pacing(l: u64, p: u64, held: &[Held]) -> Option<String> {
    let mut departures: Vec<(u64, String)> = held
        .iter()
        .flat_map(|h| {
            (0..h.units).map(move |i| (h.go_at + i * p / l, format!("{} unit {i}", h.id)))
        })
        .collect();
    departures.sort();
    for j in 0..departures.len() {
        for k in j + 1..departures.len() {
            let gap = departures[k].0 - departures[j].0;
            if (u128::from(gap) + 2) * u128::from(l) <= (k - j) as u128 * u128::from(p) {
                return Some(format!(
                    "{} goes at +{} and {} at +{}: {} units {gap}µs apart, one every {p}/{l}µs",
                    departures[j].1,
                    departures[j].0 - T0,
                    departures[k].1,
                    departures[k].0 - T0,
                    k - j + 1
                ));
            }
        }
    }
    None
}

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(40)
}

fn config() -> Config {
    Config {
        cases: cases(),
        failure_persistence: None,
        max_shrink_iters: 1_000,
        ..Config::default()
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

/// Runs the definition's property for `algorithm` and asserts the coverage.
fn definition_holds(algorithm: Algorithm) {
    let rt = runtime();
    let redis = rt.block_on(store());
    let seen = std::cell::RefCell::new(Seen::default());
    let started = Instant::now();
    let mut runner = TestRunner::new(config());
    let result = runner.run(&any_case(vec![algorithm], true), |case| {
        rt.block_on(async {
            let keys = Keys::new(case.rule);
            let mut conn = raw().await;
            let mut log = Vec::new();
            let mut s = seen.take();
            let out = exercise(&redis, &mut conn, &keys, &case, &mut s, &mut log).await;
            seen.replace(s);
            let out = out.and_then(|held| match violation(&case.rule, &held) {
                Some(why) => Err(why),
                None => Ok(()),
            });
            keys.forget(&mut conn).await;
            out.map_err(|why| {
                format!(
                    "{why}\nrule {}\n{}",
                    case.rule.fingerprint(),
                    log.join("\n")
                )
            })
        })
        .map_err(TestCaseError::fail)
    });
    match result {
        Ok(()) => {}
        Err(TestError::Fail(why, case)) => {
            panic!("{algorithm:?} breaks its definition:\n{why}\nminimal case: {case:#?}")
        }
        Err(TestError::Abort(why)) => panic!("aborted: {why}"),
    }
    let seen = seen.into_inner();
    eprintln!(
        "{algorithm:?}: {} cases in {:?}: {seen:?}",
        config().cases,
        started.elapsed()
    );
    // The generator must have reached every kind of answer, or the property
    // proved less than it says. (Skipped for runs too short to cover them.)
    if config().cases >= 20 {
        crate::common::assert_covered(
            &format!("{algorithm:?}"),
            &[
                ("grants", seen.grants),
                ("partial grants", seen.partial),
                ("refusals by the rule", seen.refused_by_rule),
                ("refusals by a block", seen.refused_by_block),
                ("never-answers", seen.never),
                ("refunds", seen.refunds),
                ("honest-retry checks", seen.retries_checked),
                ("TTL checks", seen.ttls_checked),
            ],
            &seen,
        );
    }
}

#[test]
fn sliding_window_log_admits_at_most_limit_in_every_period() {
    definition_holds(Algorithm::SlidingWindowLog);
}

#[test]
fn fixed_window_admits_at_most_limit_per_aligned_window() {
    definition_holds(Algorithm::FixedWindow);
}

#[test]
fn sliding_window_counter_keeps_its_documented_bound() {
    definition_holds(Algorithm::SlidingWindowCounter);
}

#[test]
fn token_bucket_admits_at_most_burst_plus_rate_times_span() {
    definition_holds(Algorithm::TokenBucket);
}

#[test]
fn gcra_admits_at_most_burst_plus_rate_times_span() {
    definition_holds(Algorithm::Gcra);
}

#[test]
fn leaky_bucket_spaces_departures_by_period_over_limit() {
    definition_holds(Algorithm::LeakyBucket);
}

#[test]
fn burst_fill_admits_fewer_than_twice_the_limit_around_a_refill() {
    definition_holds(Algorithm::BurstFill);
}

/// token_bucket and gcra are the same algorithm seen two ways (a bucket of
/// `burst` refilled at `limit/period`; a TAT with tolerance burst·T): for
/// the same rule and arrivals (no refunds: those differ by design only in
/// what is provably unused) every answer must be the same.
#[test]
fn token_bucket_and_gcra_answer_alike() {
    let rt = runtime();
    let redis = rt.block_on(store());
    let started = Instant::now();
    let compared = std::cell::Cell::new((0u64, 0u64));
    let mut runner = TestRunner::new(config());
    let result = runner.run(&any_case(vec![Algorithm::Gcra], false), |case| {
        rt.block_on(async {
            let r = case.rule;
            let tb = Rule::new(
                Algorithm::TokenBucket,
                r.limit().get(),
                r.period(),
                Some(r.burst().get()),
            )
            .expect("same shape");
            let (kg, kt) = (Keys::new(r), Keys::new(tb));
            let mut now = T0 + case.start;
            let mut out = Ok(());
            for (n, (gap, step)) in case.steps.iter().enumerate() {
                now += gap;
                let id = format!("c{n}");
                let (g, t) = match step {
                    Step::Acquire { cost, mode } => (
                        run_jobs(&redis, &kg.single(now, false, *cost, *mode, &id))
                            .await?
                            .0,
                        run_jobs(&redis, &kt.single(now, false, *cost, *mode, &id))
                            .await?
                            .0,
                    ),
                    Step::Jobs { costs } => (
                        run_jobs(&redis, &kg.jobs(now, false, costs, &id)).await?.0,
                        run_jobs(&redis, &kt.jobs(now, false, costs, &id)).await?.0,
                    ),
                    Step::Block { dur_us } => {
                        for k in [&kg, &kt] {
                            redis
                                .block(&k.block(), Some(now), *dur_us)
                                .await
                                .map_err(|e| e.to_string())?;
                        }
                        continue;
                    }
                    Step::Refund { .. } => continue,
                };
                let c = compared.get();
                compared.set((c.0 + 1, c.1 + u64::from(g.status == 0 && g.by == 1)));
                let key = |x: &Reply| (x.status, x.granted, x.retry_after_us, x.by);
                if key(&g) != key(&t) {
                    out = Err(format!(
                        "+{} {step:?}: gcra {g:?}\ntoken_bucket {t:?}",
                        now - T0
                    ));
                    break;
                }
            }
            let mut conn = raw().await;
            kg.forget(&mut conn).await;
            kt.forget(&mut conn).await;
            out
        })
        .map_err(TestCaseError::fail)
    });
    match result {
        Ok(()) => {}
        Err(TestError::Fail(why, case)) => {
            panic!("token_bucket and gcra disagree:\n{why}\nminimal case: {case:#?}")
        }
        Err(TestError::Abort(why)) => panic!("aborted: {why}"),
    }
    let (calls, refusals) = compared.get();
    eprintln!(
        "token_bucket ≡ gcra: {calls} calls, {refusals} refusals, {:?}",
        started.elapsed()
    );
    assert!(
        calls > 0 && refusals > 0,
        "nothing compared: {calls} calls, {refusals} refusals"
    );
}

/// Found by `burst_fill_admits_fewer_than_twice_the_limit_around_a_refill`:
/// burst_fill 1 per 274 µs. c0 opens the period at 0 and is refunded
/// whole; the refund put the token back but kept the period c0 opened, so
/// c2 took it at 24 and c3 the refill at 274: two units within 250 µs
/// against "at most 2·limit − 1 = 1 in under a period". A refund that gives
/// every token of a period back must leave no period at all.
#[tokio::test]
async fn burst_fill_whole_refund_of_the_opener_does_not_keep_its_period() {
    let rule = Rule::new(Algorithm::BurstFill, 1, Duration::from_micros(274), None).expect("rule");
    let one = Step::Acquire {
        cost: 1,
        mode: Mode::AllOrNothing,
    };
    let case = Case {
        rule,
        start: 0,
        steps: vec![
            (0, one.clone()),
            (24, Step::Refund { n: 0 }),
            (0, one.clone()),
            (250, one.clone()),
            (0, one),
        ],
    };
    let redis = store().await;
    let keys = Keys::new(rule);
    let mut conn = raw().await;
    let (mut seen, mut log) = (Seen::default(), Vec::new());
    let held = exercise(&redis, &mut conn, &keys, &case, &mut seen, &mut log).await;
    keys.forget(&mut conn).await;
    let held = held.unwrap_or_else(|why| panic!("{why}\n{}", log.join("\n")));
    assert_eq!(seen.refunds, 1, "{}", log.join("\n"));
    if let Some(why) = violation(&rule, &held) {
        panic!("{why}\n{}", log.join("\n"));
    }
}
