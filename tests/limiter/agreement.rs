//! The Lua scripts against their reference models, step by step, on a real
//! Redis: for the same keys, time and arguments, `lua/jobs.lua` (through
//! [`RedisStore`]) and [`testkit::run_guarded`] must give the same replies,
//! a refund the same state after it (the next calls compare it), and
//! `lua/block.lua` and [`testkit::block`] the same end of block. The other
//! side is a [`Twin`]: the models here, the embedded Redis of the
//! simulation in `embedded.rs`, on the same random cases.
//!
//! - `lua_and_model_agree_on_random_sequences`: random rule sets of 1–3 mixed
//!   algorithms (50 µs periods, fractional intervals), random non-decreasing
//!   times, costs within and above capacity, single decisions as the
//!   limiter asks them (one job of the cost, or up to it as unit jobs),
//!   dry runs, job lists,
//!   refunds of earlier acquires (at their own time or later), and downstream
//!   blocks.
//!   256 cases by default (about a second); `PROPTEST_CASES=20000` runs more.
//! - One deterministic test per script finding that was fixed, asserting
//!   Lua == model and the answer that makes the fix right.
//!
//! Every case and test uses fresh keys (`unique_prefix`). The property test
//! deletes each case's keys when the case ends; the deterministic tests'
//! keys expire within seconds.

use std::cell::RefCell;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::{Duration, Instant};

use crate::common::{keys_under, raw, store, unique_prefix, T0};
use proptest::prelude::*;
use proptest::sample::Index;
use proptest::test_runner::{Config, TestCaseError, TestError, TestRunner};
use redis::aio::MultiplexedConnection;
use throttle_worker::config::OnStateLoss;
use throttle_worker::limiter::local::{self, ModelStore};
use throttle_worker::limiter::testkit;
use throttle_worker::limiter::{
    Algorithm, BlockAt, BlockRead, JobsCall, JobsReply, JobsRequest, KeyedRule, LossGuard, Mode,
    RedisStore, RefundCall, Reply, Rule, SlotTerms, StateKey, Store,
};

/// Cases the property test runs unless `PROPTEST_CASES` says otherwise:
/// under a second against a local Redis with a debug build (2 cores).
const DEFAULT_CASES: u32 = 256;

/// Steps per case at most.
const MAX_STEPS: usize = 40;

// ---------------------------------------------------------------------------
// Running one call on both sides

/// One seller's keys, all new: its hash (its block and every rule's
/// place), its slots and its loss guard's epoch.
struct Seller {
    prefix: String,
    block: BlockAt,
    rules: Vec<KeyedRule>,
    /// The seller's `max_in_flight`, when the case caps it.
    slots: Option<SlotTerms>,
    /// The loss guard its jobs calls carry (`redis.on_state_loss`).
    guard: Option<LossGuard>,
}

/// A single decision as [`Limiter::check`](throttle_worker::limiter::Limiter::check)
/// asks it: charged, or a dry run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CallOp {
    Acquire,
    Peek,
}

impl Seller {
    fn new(test: &str, rules: &[Rule]) -> Seller {
        let prefix = unique_prefix(test);
        let hash = format!("{prefix}:{{s}}:v2");
        let mut seller = Seller {
            prefix,
            block: BlockAt::new(hash, BlockRead::Field),
            rules: Vec::new(),
            slots: None,
            guard: None,
        };
        seller.rules = (0..rules.len()).map(|i| seller.at(i, &rules[i])).collect();
        seller
    }

    /// Where rule `i` of the seller keeps its state: its place in the hash.
    fn at(&self, i: usize, rule: &Rule) -> KeyedRule {
        (
            StateKey::new(self.block.key.clone(), format!("r{i}")),
            *rule,
        )
    }

    /// The operator edits rule `i`: the same place, converted by the next
    /// call.
    fn edit(&mut self, i: usize, rule: &Rule) {
        self.rules[i] = self.at(i, rule);
    }

    /// A single decision as the limiter asks it: one job of the whole cost,
    /// or up to it as jobs of one unit, no more of them than the smallest
    /// capacity (more is never granted). Without slots: the limiter's single
    /// decision is the operator's and the demo's, not the worker's.
    fn single(&self, op: CallOp, now_us: u64, cost: u64, mode: Mode, call_id: &str) -> JobsCall {
        let costs = match mode {
            Mode::AllOrNothing => vec![cost],
            Mode::UpTo => {
                let cap = self.rules.iter().map(|(_, r)| r.capacity()).min();
                vec![1; cap.map_or(cost, |c| cost.min(c)) as usize]
            }
        };
        let mut call = self.jobs(now_us, &costs, op == CallOp::Peek, call_id);
        call.requests[0].slots = None;
        call
    }

    /// Gives back `units` of call `call_id` (taken at `taken_at_us`),
    /// skipping its first `skip`, at `now_us`.
    fn refund(
        &self,
        now_us: u64,
        units: u64,
        skip: u64,
        taken_at_us: u64,
        call_id: &str,
    ) -> RefundCall {
        RefundCall {
            now_us: Some(now_us),
            units,
            skip,
            taken_at_us,
            call_id: call_id.to_owned(),
            block: self.block.clone(),
            rules: self.rules.clone(),
        }
    }

    /// Deletes every key of the seller: a large rule's state lives as long
    /// as its period (up to 366 days).
    async fn forget(&self, conn: &mut MultiplexedConnection) {
        let mut del = redis::cmd("DEL");
        del.arg(&self.block.key);
        del.arg(self.slots.as_ref().map(|s| s.key.as_str()));
        del.arg(self.guard.as_ref().map(|g| g.epoch.as_str()));
        for (at, _) in &self.rules {
            del.arg(&at.key);
        }
        let _: i64 = del
            .query_async(conn)
            .await
            .unwrap_or_else(|e| panic!("DEL the keys under {}: {e}", self.prefix));
    }

    fn jobs(&self, now_us: u64, costs: &[u64], dry_run: bool, call_id: &str) -> JobsCall {
        JobsCall {
            now_us: Some(now_us),
            dry_run,
            guard: self.guard.clone(),
            learn: None,
            requests: vec![JobsRequest {
                call_id: call_id.to_owned(),
                block: self.block.clone(),
                rules: self.rules.clone(),
                costs: costs.to_vec(),
                slots: self.slots.clone(),
            }],
        }
    }

    fn describe_rules(&self) -> String {
        let rules: Vec<String> = self
            .rules
            .iter()
            .enumerate()
            .map(|(i, (_, r))| {
                format!(
                    "{}: {} {}/{}µs burst {}",
                    i + 1,
                    r.algorithm(),
                    r.limit(),
                    r.period_us(),
                    r.burst()
                )
            })
            .collect();
        rules.join("; ")
    }
}

const FIELDS: [&str; Reply::LEN] = [
    "status",
    "granted",
    "remaining",
    "retry_after_ms",
    "reset_after_ms",
    "go_at_us",
    "retry_after_us",
    "reset_after_us",
    "now_us",
    "by",
];

fn fields(r: &Reply) -> [i64; Reply::LEN] {
    [
        r.status,
        r.granted,
        r.remaining,
        r.retry_after_ms,
        r.reset_after_ms,
        r.go_at_us,
        r.retry_after_us,
        r.reset_after_us,
        r.now_us,
        r.by,
    ]
}

/// `name lua≠model` for every field that differs (`twin`: the other
/// side's name).
fn differing(lua: &Reply, model: &Reply, twin: &str) -> String {
    let diffs: Vec<String> = FIELDS
        .iter()
        .zip(fields(lua).iter().zip(fields(model).iter()))
        .filter(|(_, (l, m))| l != m)
        .map(|(name, (l, m))| format!("{name} lua {l} ≠ {twin} {m}"))
        .collect();
    diffs.join(", ")
}

/// What Redis' replies are held to: the reference models
/// ([`ModelStore`]), or the same Lua on the simulation's embedded Redis
/// (`embedded.rs`). Each runs a call as the product would on Redis.
pub(super) trait Twin {
    /// Its name in a disagreement.
    const NAME: &'static str;
    /// A twin with no data, for a new case (or after Redis lost its data).
    fn fresh() -> Self;
    /// Gives back units of an earlier request; the units asked back.
    fn refund(&mut self, call: &RefundCall) -> Result<u64, String>;
    /// The replies, and the loss guard's epoch after the call (`None`
    /// without a guard, or when the epoch is gone).
    fn run_jobs(&mut self, call: &JobsCall) -> Result<(Vec<JobsReply>, Option<i128>), String>;
    fn release(&mut self, key: &str, leases: &[String]) -> Result<u64, String>;
    fn cancel(&mut self, call: &JobsCall) -> Result<Vec<i64>, String>;
    fn block(&mut self, at: &BlockAt, now_us: u64, dur_us: u64) -> Result<u64, String>;
    /// The loss guard's epoch an earlier run left.
    fn set_epoch(&mut self, key: &str, at_us: u64);
}

impl Twin for ModelStore {
    const NAME: &'static str = "model";

    fn fresh() -> Self {
        ModelStore::new()
    }

    fn refund(&mut self, call: &RefundCall) -> Result<u64, String> {
        let now_us = call.now_us.expect("agreement calls carry an explicit time");
        local::run(
            self,
            local::Op::Refund {
                skip: call.skip,
                taken_at_us: call.taken_at_us,
            },
            now_us,
            call.units,
            Mode::AllOrNothing,
            &call.call_id,
            &call.block,
            &call.rules,
        );
        Ok(call.units)
    }

    fn run_jobs(&mut self, call: &JobsCall) -> Result<(Vec<JobsReply>, Option<i128>), String> {
        let now_us = call.now_us.expect("agreement calls carry an explicit time");
        let (replies, _) = testkit::run_guarded(
            self,
            now_us,
            call.dry_run,
            &call.requests,
            call.guard.as_ref(),
        );
        let epoch = call.guard.as_ref().and_then(|g| self.epoch(&g.epoch));
        Ok((replies, epoch))
    }

    fn release(&mut self, key: &str, leases: &[String]) -> Result<u64, String> {
        Ok(ModelStore::release(self, key, leases))
    }

    fn cancel(&mut self, call: &JobsCall) -> Result<Vec<i64>, String> {
        let now_us = call.now_us.expect("agreement calls carry an explicit time");
        Ok(testkit::cancel(self, now_us, &call.requests))
    }

    fn block(&mut self, at: &BlockAt, now_us: u64, dur_us: u64) -> Result<u64, String> {
        Ok(testkit::block(self, at, now_us, dur_us))
    }

    fn set_epoch(&mut self, key: &str, at_us: u64) {
        ModelStore::set_epoch(self, key, i128::from(at_us));
    }
}

/// A single decision on Redis and on the model: its reply's head when
/// both agree.
async fn both<T: Twin>(
    redis: &RedisStore,
    model: &mut T,
    seller: &Seller,
    step: &str,
    call: &JobsCall,
) -> Result<Reply, String> {
    Ok(both_jobs(redis, model, seller, step, call).await?.head)
}

/// Runs a refund on Redis and on the model; the units when both agree
/// (what it left behind, the calls after it compare).
async fn both_refund<T: Twin>(
    redis: &RedisStore,
    model: &mut T,
    seller: &Seller,
    step: &str,
    call: &RefundCall,
) -> Result<u64, String> {
    let now_us = call.now_us.expect("agreement calls carry an explicit time");
    let inputs = format!(
        "{step}: refund {} of {:?} (skip {}, taken at T0+{}µs) at T0+{}µs ({now_us}); rules [{}]",
        call.units,
        call.call_id,
        call.skip,
        call.taken_at_us - T0,
        now_us - T0,
        seller.describe_rules()
    );
    let lua = redis
        .refund(call)
        .await
        .map_err(|e| format!("{inputs}\n  lua failed: {e}"))?;
    let want = model
        .refund(call)
        .map_err(|e| format!("{inputs}\n  {} failed: {e}", T::NAME))?;
    if lua != want {
        return Err(format!("{inputs}\n  lua {lua} ≠ {} {want}", T::NAME));
    }
    Ok(lua)
}

/// Runs a jobs call on Redis and on the model; the reply when both agree
/// on all twelve fields.
async fn both_jobs<T: Twin>(
    redis: &RedisStore,
    model: &mut T,
    seller: &Seller,
    step: &str,
    call: &JobsCall,
) -> Result<JobsReply, String> {
    let now_us = call.now_us.expect("agreement calls carry an explicit time");
    let inputs = format!(
        "{step}: jobs{} at T0+{}µs ({now_us}), costs {:?}, id {:?}; rules [{}]",
        if call.dry_run { " (dry run)" } else { "" },
        now_us - T0,
        call.requests.iter().map(|q| &q.costs).collect::<Vec<_>>(),
        call.requests[0].call_id,
        seller.describe_rules()
    );
    let lua = redis
        .run_jobs(call)
        .await
        .map_err(|e| format!("{inputs}\n  lua failed: {e}"))?;
    let (want, model_epoch) = model
        .run_jobs(call)
        .map_err(|e| format!("{inputs}\n  {} failed: {e}", T::NAME))?;
    let twin = T::NAME;
    if let Some(g) = &call.guard {
        let mut conn = raw().await;
        let epoch: Option<i64> = redis::cmd("GET")
            .arg(&g.epoch)
            .query_async(&mut conn)
            .await
            .map_err(|e| format!("{inputs}\n  GET {}: {e}", g.epoch))?;
        if epoch.map(i128::from) != model_epoch {
            return Err(format!(
                "{inputs}\n  the epoch after the call: lua {epoch:?} ≠ {twin} {model_epoch:?}"
            ));
        }
    }
    if lua != want {
        let mut diffs = String::new();
        if lua.len() != want.len() {
            diffs = format!("replies: lua {} ≠ {twin} {}", lua.len(), want.len());
        }
        for (q, (l, m)) in lua.iter().zip(&want).enumerate() {
            let mut d = differing(&l.head, &m.head, twin);
            for (name, a, b) in [("jobs", l.jobs, m.jobs), ("next", l.next, m.next)] {
                if a != b {
                    d.push_str(&format!(", {name} lua {a} ≠ {twin} {b}"));
                }
            }
            if !d.is_empty() {
                diffs.push_str(&format!("request {q}: {d}; "));
            }
        }
        return Err(format!(
            "{inputs}\n  differ: {diffs}\n  lua:   {lua:?}\n  {twin}: {want:?}"
        ));
    }
    Ok(lua[0])
}

/// Gives slots back on Redis and in the model; how many were still held
/// when both agree.
async fn both_release<T: Twin>(
    redis: &RedisStore,
    model: &mut T,
    key: &str,
    step: &str,
    leases: &[String],
) -> Result<u64, String> {
    let lua = redis
        .release(key, leases)
        .await
        .map_err(|e| format!("{step}: release {leases:?}\n  lua failed: {e}"))?;
    let want = model
        .release(key, leases)
        .map_err(|e| format!("{step}: release {leases:?}\n  {} failed: {e}", T::NAME))?;
    if lua != want {
        return Err(format!(
            "{step}: release {leases:?}: still held lua {lua} ≠ {} {want}",
            T::NAME
        ));
    }
    Ok(lua)
}

/// Cancels a jobs call on Redis and in the model; the per-request answers
/// when both agree.
async fn both_cancel<T: Twin>(
    redis: &RedisStore,
    model: &mut T,
    seller: &Seller,
    step: &str,
    call: &JobsCall,
) -> Result<Vec<i64>, String> {
    let now_us = call.now_us.expect("agreement calls carry an explicit time");
    let inputs = format!(
        "{step}: cancel at T0+{}µs ({now_us}), id {:?}; rules [{}]",
        now_us - T0,
        call.requests[0].call_id,
        seller.describe_rules()
    );
    let lua = redis
        .cancel_jobs(call)
        .await
        .map_err(|e| format!("{inputs}\n  lua failed: {e}"))?;
    let want = model
        .cancel(call)
        .map_err(|e| format!("{inputs}\n  {} failed: {e}", T::NAME))?;
    if lua != want {
        return Err(format!(
            "{inputs}\n  differ: lua {lua:?} ≠ {} {want:?}",
            T::NAME
        ));
    }
    Ok(lua)
}

/// Blocks on Redis and in the model; the end of the block when both agree.
async fn both_block<T: Twin>(
    redis: &RedisStore,
    model: &mut T,
    seller: &Seller,
    step: &str,
    now_us: u64,
    dur_us: u64,
) -> Result<u64, String> {
    let inputs = format!(
        "{step}: block {dur_us}µs at T0+{}µs ({now_us}); rules [{}]",
        now_us - T0,
        seller.describe_rules()
    );
    let lua = redis
        .block(&seller.block, Some(now_us), dur_us)
        .await
        .map_err(|e| format!("{inputs}\n  lua failed: {e}"))?;
    let want = model
        .block(&seller.block, now_us, dur_us)
        .map_err(|e| format!("{inputs}\n  {} failed: {e}", T::NAME))?;
    if lua != want {
        return Err(format!(
            "{inputs}\n  block ends: lua {lua} ≠ {} {want}",
            T::NAME
        ));
    }
    Ok(lua)
}

// ---------------------------------------------------------------------------
// The property test

/// What one step does.
#[derive(Debug, Clone)]
enum Step {
    /// A single decision (charged, or a dry run) `gap` µs after the
    /// previous step.
    Call {
        gap: u64,
        op: CallOp,
        cost: u64,
        mode: Mode,
    },
    /// Give back part of an earlier granted acquire that was not refunded
    /// yet (picked by `pick`): skip `skip` of its units, then give back
    /// `1 + len` of the rest (both as indices into what is there). The
    /// refund's own time is now, or with `at_take` the acquire's time
    /// (earlier than later calls: the scripts must not move a clock back).
    /// No-op when there is none.
    Refund {
        pick: Index,
        skip: Index,
        len: Index,
        at_take: bool,
    },
    /// Downstream block for `dur_us`, `gap` µs after the previous step.
    Block { gap: u64, dur_us: u64 },
    /// A list of jobs with mixed costs (longest prefix that fits), `gap` µs
    /// after the previous step; charged unless `dry_run`. With `then`, the
    /// same call carries a second request (a coalesced call): the seller's
    /// first rule alone with those costs, decided after the first request.
    ///
    /// With `cancel_first`, the call's cancel is sent first (a caller that
    /// gave up before its call ran): in v2 and v1+v2 the first request
    /// must then charge nothing.
    Jobs {
        gap: u64,
        costs: Vec<u64>,
        dry_run: bool,
        then: Option<Vec<u64>>,
        cancel_first: bool,
    },
    /// The operator replaces the rule at `place` with `rule` (a limit
    /// edit, an override, a tier change): v2 converts the place's state.
    Edit { place: Index, rule: Rule },
    /// Answers arrive: `1 + count` slots of earlier grants, from `pick`
    /// on, go back (`max_in_flight`; a no-op without a cap or a grant).
    Release { pick: Index, count: Index },
    /// Redis loses its data (a restart without persistence, a failover),
    /// `gap` µs after the previous step: every key of the case is gone,
    /// the guard's epoch too.
    Lose { gap: u64 },
    /// The cancel of an earlier granted call not refunded yet (picked by
    /// `pick`; `lua/calls.lua`), `gap` µs after the previous step: a jobs
    /// call's units come back (v2, v1+v2), anything else leaves a
    /// tombstone. No-op when there is none.
    Cancel { gap: u64, pick: Index },
}

#[derive(Debug, Clone)]
struct Case {
    rules: Vec<Rule>,
    /// `max_in_flight` and its lease in µs (as short as the gaps, so
    /// leases lapse within a case).
    slots: Option<(u32, u64)>,
    /// µs after T0 of the first step, so windows do not all start aligned.
    start: u64,
    /// The jobs calls' loss guard, the epoch an earlier run left (µs
    /// before the first step; `None`: none, a loss or a new install),
    /// whether the calls say the install is new, and the longest hold
    /// (µs; `redis.state_loss_wait`).
    guard: Option<(OnStateLoss, Option<u64>, bool, Option<u64>)>,
    steps: Vec<Step>,
}

fn any_rule() -> impl Strategy<Value = Rule> {
    prop_oneof![9 => small_rule(), 1 => large_rule()]
}

/// Small limits and short periods: every decision kind within a few steps.
fn small_rule() -> impl Strategy<Value = Rule> {
    let period_us = prop_oneof![
        // The shortest period a rule may have.
        2 => Just(50u64),
        // Mostly not a multiple of the limit: fractional intervals.
        6 => 51u64..3_000,
        // Long against the gaps: stays exhausted across many steps.
        1 => Just(1_000_000u64),
    ];
    (
        prop::sample::select(Algorithm::ALL.to_vec()),
        1u64..=6,
        period_us,
        1u64..=8,
    )
        .prop_map(|(algorithm, limit, period_us, burst)| {
            let burst = algorithm.uses_burst().then_some(burst);
            valid(algorithm, limit, period_us, burst)
        })
}

/// Limits and bursts up to what `Rule::new` accepts (`units * period_us`
/// just below 2^53): the scripts' doubles must stay exact there.
///
/// Not sliding_window_log: it counts members rather than multiplying, and
/// keeps one member per admitted unit, so a large grant costs Redis memory
/// and time (a million members per call) and tests no arithmetic.
fn large_rule() -> impl Strategy<Value = Rule> {
    const DAY_US: u64 = 86_400_000_000;
    let period_us = prop_oneof![1_000_000u64..=DAY_US, Just(366 * DAY_US)];
    let algorithm = prop::sample::select(
        Algorithm::ALL
            .into_iter()
            .filter(|&a| a != Algorithm::SlidingWindowLog)
            .collect::<Vec<_>>(),
    );
    (algorithm, period_us)
        .prop_flat_map(|(algorithm, period_us)| {
            // Rule::new: limit <= MAX_LIMIT, limit <= period_us, and
            // max(limit, burst) * period_us < 2^53.
            let max = ((1u64 << 53) - 1) / period_us;
            let max = max.min(1_000_000_000).min(period_us);
            let units = prop_oneof![1u64..=max, Just(max)];
            (Just(algorithm), units.clone(), Just(period_us), units)
        })
        .prop_map(|(algorithm, limit, period_us, burst)| {
            let burst = algorithm.uses_burst().then_some(burst);
            valid(algorithm, limit, period_us, burst)
        })
}

fn valid(algorithm: Algorithm, limit: u64, period_us: u64, burst: Option<u64>) -> Rule {
    Rule::new(algorithm, limit, Duration::from_micros(period_us), burst).unwrap_or_else(|e| {
        panic!("generated rule {algorithm} {limit}/{period_us}µs burst {burst:?}: {e}")
    })
}

fn gap() -> impl Strategy<Value = u64> {
    prop_oneof![
        1 => Just(0u64),
        4 => 0u64..200,
        4 => 0u64..3_000,
        1 => 100_000u64..3_000_000,
    ]
}

fn any_step() -> impl Strategy<Value = Step> {
    let mode = prop_oneof![Just(Mode::AllOrNothing), Just(Mode::UpTo)];
    let op = prop_oneof![3 => Just(CallOp::Acquire), 1 => Just(CallOp::Peek)];
    prop_oneof![
        // Mostly within a small rule's capacity (1..=8), sometimes above,
        // sometimes at the scale of a large rule.
        8 => (gap(), op, prop_oneof![12 => 1u64..=3, 4 => 1u64..=9, 1 => 10u64..=1_000_000_000], mode)
            .prop_map(|(gap, op, cost, mode)| Step::Call { gap, op, cost, mode }),
        2 => (any::<Index>(), any::<Index>(), any::<Index>(), any::<bool>())
            .prop_map(|(pick, skip, len, at_take)| Step::Refund { pick, skip, len, at_take }),
        // Mostly as short as the rules' waits (either may be longer);
        // sometimes long enough to cover the rest of the case.
        1 => (gap(), prop_oneof![6 => 1u64..3_000, 1 => 100_000u64..2_000_000])
            .prop_map(|(gap, dur_us)| Step::Block { gap, dur_us }),
        // Mixed costs, mostly within a small rule's capacity, sometimes a
        // job that can never pass (first, in the middle or last).
        4 => (
            gap(),
            job_costs(),
            prop::bool::weighted(0.2),
            prop::option::weighted(0.25, job_costs()),
            prop::bool::weighted(0.1),
        )
            .prop_map(|(gap, costs, dry_run, then, cancel_first)| Step::Jobs {
                gap,
                costs,
                dry_run,
                then,
                cancel_first,
            }),
        1 => (any::<Index>(), any_rule())
            .prop_map(|(place, rule)| Step::Edit { place, rule }),
        2 => (any::<Index>(), any::<Index>())
            .prop_map(|(pick, count)| Step::Release { pick, count }),
        1 => (gap(), any::<Index>()).prop_map(|(gap, pick)| Step::Cancel { gap, pick }),
        1 => gap().prop_map(|gap| Step::Lose { gap }),
    ]
}

fn job_costs() -> impl Strategy<Value = Vec<u64>> {
    prop::collection::vec(
        prop_oneof![10 => 1u64..=3, 4 => 1u64..=9, 1 => 10u64..=1_000_000_000],
        1..=6,
    )
}

fn any_case() -> impl Strategy<Value = Case> {
    (
        prop::collection::vec(any_rule(), 1..=3),
        prop::option::weighted(0.5, (1u32..=4, 200u64..6_000)),
        0u64..1_000_000,
        prop::collection::vec(any_step(), 1..=MAX_STEPS),
        prop::option::weighted(
            0.5,
            (
                prop_oneof![Just(OnStateLoss::Wait), Just(OnStateLoss::Admit)],
                prop::option::weighted(0.5, 0u64..2_000_000),
                prop::bool::weighted(0.25),
                prop::option::weighted(0.5, 1u64..3_000_000),
            ),
        ),
    )
        .prop_map(|(rules, slots, start, steps, guard)| Case {
            rules,
            slots,
            start,
            steps,
            guard,
        })
}

/// What the property test exercised, printed so that a run shows its
/// coverage (a generator that never reaches a branch is a silent gap).
#[derive(Debug, Default)]
struct Seen {
    granted: u64,
    partial: u64,
    denied_by_rule: u64,
    denied_by_block: u64,
    never: u64,
    refunds: u64,
    blocks: u64,
    jobs_all: u64,
    jobs_prefix_then_wait: u64,
    jobs_prefix_then_never: u64,
    jobs_denied: u64,
    jobs_never: u64,
    jobs_listed: u64,
    coalesced: u64,
    edits: u64,
    jobs_prefix_then_slot: u64,
    jobs_denied_for_a_slot: u64,
    slots_released: u64,
    cancels_refunded: u64,
    cancels_before: u64,
    losses: u64,
    guarded_losses: u64,
}

impl Seen {
    fn jobs(&mut self, listed: usize, r: &JobsReply) {
        match (r.head.status, r.next) {
            (1, 0) => self.jobs_all += 1,
            (1, 1) => self.jobs_prefix_then_wait += 1,
            (1, 3) => self.jobs_prefix_then_slot += 1,
            (1, _) => self.jobs_prefix_then_never += 1,
            (0, 3) => self.jobs_denied_for_a_slot += 1,
            (0, _) => self.jobs_denied += 1,
            _ => self.jobs_never += 1,
        }
        self.jobs_listed += listed as u64;
    }

    fn reply(&mut self, cost: u64, r: &Reply) {
        match r.status {
            1 if (r.granted as u64) < cost => self.partial += 1,
            1 => self.granted += 1,
            0 if r.by == 0 => self.denied_by_block += 1,
            0 => self.denied_by_rule += 1,
            _ => self.never += 1,
        }
    }
}

/// An acquire that was granted and not refunded yet.
struct Taken {
    call_id: String,
    now_us: u64,
    granted: u64,
}

/// Runs one case on fresh keys; the first disagreement as the error.
async fn agree<T: Twin>(
    redis: &RedisStore,
    conn: &MultiplexedConnection,
    case: &Case,
    seen: &RefCell<Seen>,
) -> Result<(), String> {
    let mut seller = Seller::new("agree", &case.rules);
    seller.slots = case.slots.map(|(max, lease_us)| SlotTerms {
        key: format!("{}:{{s}}:slots", seller.prefix),
        max,
        lease_us,
        poll_us: 777,
    });
    let agreed = steps::<T>(redis, conn, &mut seller, case, seen).await;
    seller.forget(&mut conn.clone()).await;
    agreed
}

async fn steps<T: Twin>(
    redis: &RedisStore,
    conn: &MultiplexedConnection,
    seller: &mut Seller,
    case: &Case,
    seen: &RefCell<Seen>,
) -> Result<(), String> {
    let mut model = T::fresh();
    let mut now = T0 + case.start;
    if let Some((on_loss, before, new_install, max_wait_us)) = case.guard {
        let epoch = format!("{}:{{epoch}}", seller.prefix);
        if let Some(before) = before {
            let at = now - before;
            let _: () = redis::cmd("SET")
                .arg(&epoch)
                .arg(at)
                .query_async(&mut conn.clone())
                .await
                .map_err(|e| format!("SET {epoch}: {e}"))?;
            model.set_epoch(&epoch, at);
        }
        seller.guard = Some(LossGuard {
            epoch,
            on_loss,
            new_install,
            max_wait_us,
            seen: None,
        });
    }
    let mut taken: Vec<Taken> = Vec::new();
    // Slots granted and not given back yet (they may have lapsed).
    let mut held: Vec<String> = Vec::new();
    for (i, step) in case.steps.iter().enumerate() {
        let label = format!("step {i} of {}", case.steps.len());
        match step {
            Step::Call {
                gap,
                op,
                cost,
                mode,
            } => {
                now += gap;
                let call_id = format!("c{i}");
                let call = seller.single(*op, now, *cost, *mode, &call_id);
                let reply = both_jobs(redis, &mut model, &*seller, &label, &call)
                    .await?
                    .head;
                seen.borrow_mut().reply(*cost, &reply);
                if *op == CallOp::Acquire && reply.status == 1 && reply.granted > 0 {
                    taken.push(Taken {
                        call_id,
                        now_us: now,
                        granted: reply.granted as u64,
                    });
                }
            }
            Step::Refund {
                pick,
                skip,
                len,
                at_take,
            } => {
                if taken.is_empty() {
                    continue;
                }
                let t = taken.remove(pick.index(taken.len()));
                let skip = skip.index(t.granted as usize) as u64;
                let cost = 1 + len.index((t.granted - skip) as usize) as u64;
                let at = if *at_take { t.now_us } else { now };
                let call = seller.refund(at, cost, skip, t.now_us, &t.call_id);
                both_refund(redis, &mut model, &*seller, &label, &call).await?;
                seen.borrow_mut().refunds += 1;
            }
            Step::Block { gap, dur_us } => {
                now += gap;
                both_block(redis, &mut model, &*seller, &label, now, *dur_us).await?;
                seen.borrow_mut().blocks += 1;
            }
            Step::Jobs {
                gap,
                costs,
                dry_run,
                then,
                cancel_first,
            } => {
                now += gap;
                let call_id = format!("c{i}");
                if *cancel_first {
                    let cancel = seller.jobs(now, costs, false, &call_id);
                    let done = both_cancel(redis, &mut model, &*seller, &label, &cancel).await?;
                    let want = -1;
                    if done != [want] {
                        return Err(format!(
                            "{label}: a cancel before its call answered {done:?}, not [{want}]"
                        ));
                    }
                }
                let mut call = seller.jobs(now, costs, *dry_run, &call_id);
                if let Some(then) = then {
                    let mut second = seller.jobs(now, then, *dry_run, &format!("c{i}b"));
                    second.requests[0].rules.truncate(1);
                    call.requests.extend(second.requests);
                    seen.borrow_mut().coalesced += 1;
                }
                let r = both_jobs(redis, &mut model, &*seller, &label, &call).await?;
                if *cancel_first && !*dry_run {
                    if r.head.status != 0 || r.head.granted != 0 {
                        return Err(format!(
                            "{label}: a call cancelled before it ran answered {r:?}"
                        ));
                    }
                    seen.borrow_mut().cancels_before += 1;
                }
                seen.borrow_mut().jobs(costs.len(), &r);
                if !*dry_run && seller.slots.is_some() && r.head.status == 1 {
                    held.extend((0..r.jobs as usize).map(|j| SlotTerms::lease(&call_id, j)));
                }
                if !*dry_run && r.head.status == 1 {
                    taken.push(Taken {
                        call_id,
                        now_us: now,
                        granted: r.head.granted as u64,
                    });
                }
            }
            Step::Edit { place, rule } => {
                seller.edit(place.index(seller.rules.len()), rule);
                seen.borrow_mut().edits += 1;
            }
            Step::Release { pick, count } => {
                let Some(key) = seller.slots.as_ref().map(|s| s.key.clone()) else {
                    continue;
                };
                if held.is_empty() {
                    continue;
                }
                let from = pick.index(held.len());
                let n = 1 + count.index(held.len() - from);
                let leases: Vec<String> = held.drain(from..from + n).collect();
                both_release(redis, &mut model, &key, &label, &leases).await?;
                seen.borrow_mut().slots_released += 1;
            }
            Step::Lose { gap } => {
                now += gap;
                let mut c = conn.clone();
                for key in keys_under(&seller.prefix).await {
                    let _: i64 = redis::cmd("DEL")
                        .arg(&key)
                        .query_async(&mut c)
                        .await
                        .map_err(|e| format!("{label}: DEL {key}: {e}"))?;
                }
                model = T::fresh();
                let mut seen = seen.borrow_mut();
                seen.losses += 1;
                seen.guarded_losses += u64::from(seller.guard.is_some());
            }
            Step::Cancel { gap, pick } => {
                now += gap;
                if taken.is_empty() {
                    continue;
                }
                let t = taken.remove(pick.index(taken.len()));
                let cancel = seller.jobs(now, &[1], false, &t.call_id);
                let done = both_cancel(redis, &mut model, &*seller, &label, &cancel).await?;
                if done[0] > 0 {
                    seen.borrow_mut().cancels_refunded += 1;
                }
            }
        }
    }
    Ok(())
}

fn cases() -> u32 {
    match std::env::var("PROPTEST_CASES") {
        Ok(v) => v
            .parse()
            .unwrap_or_else(|_| panic!("PROPTEST_CASES={v:?} is not a number")),
        Err(_) => DEFAULT_CASES,
    }
}

/// Property test of the issue: "random arrival sequences, Lua vs reference
/// model, identical decisions", with the edits that convert a place's
/// state (the Lua's `settle` against `local::convert`).
#[test]
fn lua_and_model_agree_on_random_sequences() {
    agree_on_random_sequences_with::<ModelStore>();
}

/// The property test with Redis' replies held to `T`.
pub(super) fn agree_on_random_sequences_with<T: Twin>() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let redis = rt.block_on(store());
    let conn = rt.block_on(raw());
    let config = Config {
        cases: cases(),
        // A failure prints its shrunk case in full; one worth keeping
        // becomes a named deterministic test below, so nothing is written
        // to a regressions file.
        failure_persistence: None,
        // Each shrink step replays a case against Redis; bound the time a
        // failure takes to report.
        max_shrink_iters: 2_000,
        ..Config::default()
    };
    let seen = RefCell::new(Seen::default());
    let started = Instant::now();
    let mut runner = TestRunner::new(config.clone());
    let result = runner.run(&any_case(), |case| {
        rt.block_on(agree::<T>(&redis, &conn, &case, &seen))
            .map_err(TestCaseError::fail)
    });
    match result {
        Ok(()) => {}
        Err(TestError::Fail(why, case)) => {
            panic!(
                "Lua on Redis and {} disagree:\n{why}\nminimal case: {case:#?}",
                T::NAME
            )
        }
        Err(TestError::Abort(why)) => panic!("property test aborted: {why}"),
    }
    let seen = seen.into_inner();
    eprintln!(
        "lua == {} on {} cases of up to {MAX_STEPS} steps in {:?}: {seen:?}",
        T::NAME,
        config.cases,
        started.elapsed(),
    );
    // Agreement on cases that never reach an answer proves nothing about
    // it: every kind must have been compared. (Skipped for runs too short
    // to cover them.)
    if config.cases >= 64 {
        crate::common::assert_covered(
            "lua == model",
            &[
                ("full grants", seen.granted),
                ("partial grants", seen.partial),
                ("refusals by a rule", seen.denied_by_rule),
                ("refusals by a block", seen.denied_by_block),
                ("never-answers", seen.never),
                ("refunds", seen.refunds),
                ("blocks", seen.blocks),
                ("job lists granted whole", seen.jobs_all),
                ("job prefixes stopped by a wait", seen.jobs_prefix_then_wait),
                (
                    "job prefixes stopped by a never",
                    seen.jobs_prefix_then_never,
                ),
                ("job lists refused", seen.jobs_denied),
                ("job lists that can never pass", seen.jobs_never),
                ("coalesced calls", seen.coalesced),
                ("rule edits", seen.edits),
                (
                    "job prefixes stopped by max_in_flight",
                    seen.jobs_prefix_then_slot,
                ),
                ("job lists refused for a slot", seen.jobs_denied_for_a_slot),
                ("slots given back", seen.slots_released),
                (
                    "losses of Redis' data under a loss guard",
                    seen.guarded_losses,
                ),
                ("cancels that gave units back", seen.cancels_refunded),
                ("calls cancelled before they ran", seen.cancels_before),
            ],
            &seen,
        );
    }
}

// ---------------------------------------------------------------------------
// One deterministic test per fixed script finding

fn rule(algorithm: Algorithm, limit: u64, period: Duration, burst: Option<u64>) -> Rule {
    Rule::new(algorithm, limit, period, burst).expect("test rules are valid")
}

/// The agreed value, or a panic with the disagreement.
fn ok<T>(agreed: Result<T, String>) -> T {
    agreed.unwrap_or_else(|e| panic!("{e}"))
}

/// status, granted, remaining, retry µs, reset µs, by.
fn brief(r: &Reply) -> [i64; 6] {
    [
        r.status,
        r.granted,
        r.remaining,
        r.retry_after_us,
        r.reset_after_us,
        r.by,
    ]
}

/// Regression, limiter.lua: a downstream block answered with the block's
/// time alone, so a caller that retried when a short block ended was
/// refused again by an exhausted rule. Now retry-after is the longer of the
/// two and `by` names the rule when its wait is longer.
#[tokio::test]
async fn a_block_does_not_hide_a_longer_rule_wait() {
    let redis = store().await;
    let seller = Seller::new(
        "agree-block-wait",
        &[rule(Algorithm::Gcra, 1, Duration::from_secs(1), None)],
    );
    let mut model = ModelStore::new();
    let all = Mode::AllOrNothing;
    let run = |op, at: u64, id: &str| seller.single(op, T0 + at, 1, all, id);

    let first = ok(both(
        &redis,
        &mut model,
        &seller,
        "acquire",
        &run(CallOp::Acquire, 0, "c1"),
    )
    .await);
    assert_eq!(first.status, 1, "{first:?}");
    // A block shorter than the rule's wait: the rule's wait wins.
    ok(both_block(&redis, &mut model, &seller, "short block", T0, 300_000).await);
    let got = ok(both(
        &redis,
        &mut model,
        &seller,
        "while blocked",
        &run(CallOp::Acquire, 100_000, "c2"),
    )
    .await);
    assert_eq!(
        brief(&got),
        [0, 0, 0, 900_000, 900_000, 1],
        "the block alone would answer retry 200000, by 0: {got:?}"
    );
    let retry = ok(both(
        &redis,
        &mut model,
        &seller,
        "retry",
        &run(CallOp::Peek, 1_000_000, "c3"),
    )
    .await);
    assert_eq!(
        retry.status, 1,
        "retry at now + retry_after passes: {retry:?}"
    );
    // A block longer than the rule's wait: the block wins, by 0.
    ok(both_block(
        &redis,
        &mut model,
        &seller,
        "long block",
        T0 + 1_000_000,
        2_000_000,
    )
    .await);
    let got = ok(both(
        &redis,
        &mut model,
        &seller,
        "while blocked",
        &run(CallOp::Acquire, 1_500_000, "c4"),
    )
    .await);
    assert_eq!(brief(&got), [0, 0, 0, 1_500_000, 1_500_000, 0], "{got:?}");
}

/// Regression, token_bucket.lua: a refund at the take's time wrote
/// `ts = now` even after a later call had moved `ts` on, refilling the span
/// in between a second time. Now it credits at max(now, ts), and only the
/// tokens that have not refilled since the take (issue 6 defect 6).
#[tokio::test]
async fn token_bucket_refund_after_a_later_call_does_not_refill_twice() {
    let redis = store().await;
    // 2 per second (a token every 0.5 s), bucket of 4.
    let r = rule(Algorithm::TokenBucket, 2, Duration::from_secs(1), Some(4));
    let seller = Seller::new("agree-tb-refund", &[r]);
    let mut model = ModelStore::new();
    let s = 1_000_000;

    let c1 = seller.single(CallOp::Acquire, T0, 4, Mode::AllOrNothing, "c1");
    let got = ok(both(&redis, &mut model, &seller, "empty the bucket", &c1).await);
    assert_eq!((got.status, got.granted), (1, 4), "{got:?}");
    // At 1 s two tokens have come back; take one, which moves ts to 1 s.
    let c2 = seller.single(CallOp::Acquire, T0 + s, 1, Mode::AllOrNothing, "c2");
    let got = ok(both(&redis, &mut model, &seller, "later call", &c2).await);
    assert_eq!((got.status, got.remaining), (1, 1), "{got:?}");
    // Give back one of c1's tokens, at c1's time.
    let refund = seller.refund(T0, 1, 0, T0, "c1");
    ok(both_refund(
        &redis,
        &mut model,
        &seller,
        "refund at the take's time",
        &refund,
    )
    .await);
    // 1 left, and nothing comes back: the 2 tokens that refilled in the
    // second since c1 may hold its refunded one, and c2 may have used it.
    // With ts moved back to 0 the span 0..1 s would refill again and 4
    // would pass; crediting the whole token, 2.
    let peek = seller.single(CallOp::Peek, T0 + s, 9, Mode::UpTo, "c3");
    let got = ok(both(&redis, &mut model, &seller, "peek", &peek).await);
    assert_eq!(got.granted, 1, "{got:?}");
}

/// Regression, limiter.lua: cost 0 used to be "granted" 0 units (and start
/// a burst_fill period). Now the script refuses a job of cost 0, charged or
/// dry, and a refund of 0 units with an error reply and writes nothing; the
/// model panics (see `testkit::run_jobs` and `local::run`).
#[tokio::test]
async fn cost_zero_is_refused_by_both() {
    let redis = store().await;
    let r = rule(Algorithm::BurstFill, 3, Duration::from_secs(1), None);
    let seller = Seller::new("agree-cost-zero", &[r]);
    for dry_run in [false, true] {
        let call = seller.jobs(T0, &[0], dry_run, "c1");
        let err = redis
            .run_jobs(&call)
            .await
            .expect_err("a job of cost 0: the script must refuse");
        assert!(err.to_string().contains("must be at least 1"), "{err}");
        let mut model = ModelStore::new();
        let refused = catch_unwind(AssertUnwindSafe(|| {
            testkit::run_jobs(&mut model, T0, dry_run, &call.requests)
        }));
        assert!(refused.is_err(), "the model must refuse, got {refused:?}");
        assert_eq!(model, ModelStore::new(), "cost 0: the model wrote");
    }
    let refund = seller.refund(T0, 0, 0, T0, "c1");
    let err = redis
        .refund(&refund)
        .await
        .expect_err("a refund of 0 units: the script must refuse");
    assert!(err.to_string().contains("must be at least 1"), "{err}");
    let mut model = ModelStore::new();
    let refused = catch_unwind(AssertUnwindSafe(|| {
        model.refund(&refund).expect("the model panics or refunds")
    }));
    assert!(refused.is_err(), "the model must refuse, got {refused:?}");
    assert_eq!(model, ModelStore::new(), "refund of 0: the model wrote");
    assert_eq!(
        keys_under(&seller.prefix).await,
        Vec::<String>::new(),
        "the script wrote"
    );
}

/// An unlimited seller's call runs the script with no rules: it reads only
/// the block, writes nothing, and agrees with the model.
#[tokio::test]
async fn no_rules_reads_only_the_block() {
    let redis = store().await;
    let seller = Seller::new("agree-no-rules", &[]);
    let mut model = ModelStore::new();
    for mode in [Mode::AllOrNothing, Mode::UpTo] {
        let call = seller.single(CallOp::Acquire, T0, 5, mode, "c1");
        let got = ok(both(&redis, &mut model, &seller, "unblocked", &call).await);
        assert_eq!((got.status, got.granted), (1, 5), "{got:?}");
    }
    ok(both_block(&redis, &mut model, &seller, "block", T0, 2_000).await);
    let call = seller.single(CallOp::Acquire, T0 + 500, 5, Mode::UpTo, "c2");
    let got = ok(both(&redis, &mut model, &seller, "blocked", &call).await);
    assert_eq!(brief(&got), [0, 0, 0, 1_500, 1_500, 0], "{got:?}");
    assert_eq!(
        keys_under(&seller.prefix).await,
        vec![seller.block.key.clone()],
        "only the seller's hash, for the block"
    );
}

/// Regression, gcra/leaky_bucket/token_bucket `wait` (found by a 40,000-case
/// run): units × period may come within a hair of 2^53, and the wait summed
/// the debt and the asked units' time *before* taking the bucket off, so a
/// full bucket's sum passed 2^53 and lost its last bit: a retry-after 1 µs
/// off the exact one. Here 284 × 366 days is just under 2^53; the bucket is
/// full, and two more units are free two intervals (period/3 each) after
/// the fill: 2·period/3 − dt µs from dt µs after it.
#[tokio::test]
async fn a_wait_near_2_pow_53_is_exact() {
    let redis = store().await;
    let period = Duration::from_secs(366 * 24 * 3600);
    let period_us = period.as_micros() as i64;
    assert!(284 * period_us < 1 << 53 && 286 * period_us > 1 << 53);
    for algorithm in [
        Algorithm::Gcra,
        Algorithm::LeakyBucket,
        Algorithm::TokenBucket,
    ] {
        let seller = Seller::new(
            &format!("agree-2p53-{algorithm:?}"),
            &[rule(algorithm, 3, period, Some(284))],
        );
        let mut model = ModelStore::new();
        let fill = seller.single(CallOp::Acquire, T0, 284, Mode::AllOrNothing, "fill");
        let got = ok(both(&redis, &mut model, &seller, "fill", &fill).await);
        assert_eq!(
            (got.status, got.granted),
            (1, 284),
            "{algorithm:?}: {got:?}"
        );
        // Several instants, as rounding to even hides some of them.
        for dt in 1..=8 {
            let ask = seller.single(CallOp::Peek, T0 + dt, 2, Mode::AllOrNothing, "ask");
            let got = ok(both(&redis, &mut model, &seller, "ask", &ask).await);
            assert_eq!(
                (got.status, got.retry_after_us),
                (0, 2 * period_us / 3 - dt as i64),
                "{algorithm:?} at T0+{dt}µs: {got:?}"
            );
        }
    }
}

/// State v2 keeps a sliding log as a packed field; an entry exactly one
/// period old has left the window (score > now − period is live), entries
/// of one instant are interchangeable, and a refund takes back entries of
/// its take's instant only. Each step Lua == model, with the answers that
/// make the boundary right (a random run needed ~5,000 cases to catch an
/// off-by-one here).
#[tokio::test]
async fn a_log_entry_one_period_old_has_left_the_window() {
    let redis = store().await;
    let log = rule(
        Algorithm::SlidingWindowLog,
        3,
        Duration::from_millis(1),
        None,
    );
    let mut seller = Seller::new("agree-log", &[log]);
    let mut model = ModelStore::new();
    let all = Mode::AllOrNothing;
    let step =
        |seller: &Seller, op, at: u64, cost, id: &str| seller.single(op, T0 + at, cost, all, id);
    // Two at T0, one at T0 + 400 µs: full.
    for (at, cost, id) in [(0, 2, "a"), (400, 1, "b")] {
        let call = step(&seller, CallOp::Acquire, at, cost, id);
        let got = ok(both(&redis, &mut model, &seller, id, &call).await);
        assert_eq!(got.granted, cost as i64, "{id}: {got:?}");
    }
    // 1 µs before T0's entries leave: refused until then.
    let call = step(&seller, CallOp::Acquire, 999, 1, "c");
    let got = ok(both(&redis, &mut model, &seller, "c", &call).await);
    assert_eq!((got.status, got.retry_after_us), (0, 1), "{got:?}");
    // At exactly T0 + period they have left: two free.
    let call = step(&seller, CallOp::Peek, 1_000, 2, "d");
    let got = ok(both(&redis, &mut model, &seller, "d", &call).await);
    assert_eq!((got.status, got.granted), (1, 2), "{got:?}");
    // A refund of b's unit at its instant frees it; one of another instant
    // frees nothing.
    let back =
        |seller: &Seller, taken: u64, id: &str| seller.refund(T0 + 1_001, 1, 0, T0 + taken, id);
    ok(both_refund(
        &redis,
        &mut model,
        &seller,
        "refund elsewhere",
        &back(&seller, 401, "b"),
    )
    .await);
    let call = step(&seller, CallOp::Peek, 1_002, 3, "e");
    let got = ok(both(&redis, &mut model, &seller, "e", &call).await);
    assert_eq!(got.status, 0, "b's entry still counts: {got:?}");
    ok(both_refund(
        &redis,
        &mut model,
        &seller,
        "refund b",
        &back(&seller, 400, "b"),
    )
    .await);
    let got = ok(both(&redis, &mut model, &seller, "e2", &call).await);
    assert_eq!((got.status, got.granted), (1, 3), "{got:?}");
    // An edit to a longer window keeps nothing it cannot read: log → gcra
    // charges the units in use (none now) and the place is the new rule's.
    seller.edit(0, &rule(Algorithm::Gcra, 3, Duration::from_millis(1), None));
    let call = step(&seller, CallOp::Acquire, 1_003, 3, "f");
    let got = ok(both(&redis, &mut model, &seller, "f", &call).await);
    assert_eq!((got.status, got.granted), (1, 3), "{got:?}");
    seller.forget(&mut raw().await).await;
}
