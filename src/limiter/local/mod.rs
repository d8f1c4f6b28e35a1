//! Pure-Rust reference models of the limiter scripts, with an injected clock.
//!
//! They are the specification the Lua is tested against step by step: for
//! the same store, time and arguments, [`run`] returns the same ten integers
//! as `lua/limiter.lua` and leaves the same state, and [`block`] mirrors
//! `lua/block.lua`.
//!
//! - one file per algorithm, each implementing [`Algo`], the per-algorithm
//!   contract of `lua/common.lua` (cap, load, avail, wait, left, reset, go,
//!   take, refund);
//! - [`convert`]: what a rule edit does to the state it finds (state v2);
//! - this file: the store ([`ModelStore`]), the driver ([`run`], [`block`]),
//!   and [`ModelLimiter`], a limiter for one seller over an injected [`Clock`].
//!
//! All arithmetic is exact `i128`; the scripts use integer-valued doubles,
//! which agree as long as every product stays below 2^53.
//!
//! The model and the scripts are meant to agree on every call with a cost
//! of at least 1 over rules that [`Rule::new`] accepts (which keeps
//! `limit * period_us` and `burst * period_us` below 2^53);
//! `tests/limiter_agreement.rs` checks that step by step against a real
//! Redis, on random rule sets and arrival sequences.
//!
//! Key expiry is not modelled: every script leaves one second of slack on its
//! TTLs and reads stale state as if the key were gone, so the decisions are
//! the same. [`ModelStore::keys`] therefore also lists keys that Redis would
//! already have expired.

pub mod burst_fill;
pub mod calls;
mod share;
pub mod fixed_window;
pub mod gcra;
pub mod leaky_bucket;
pub mod sliding_window_counter;
pub mod sliding_window_log;
pub mod token_bucket;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::decision::{Decision, Mode};
use super::reply::{JobsReply, Reply};
use super::rule::{Algorithm, Rule};
use super::script::{BlockAt, JobsRequest, KeyedRule, SlotTerms, StateKey};

pub use burst_fill::BurstFill;
pub use share::{granted, scaled, LocalShare, WallClock};
pub use fixed_window::FixedWindow;
pub use gcra::Gcra;
pub use leaky_bucket::LeakyBucket;
pub use sliding_window_counter::SlidingWindowCounter;
pub use sliding_window_log::{Log, SlidingWindowLog};
pub use token_bucket::TokenBucket;

/// `floor(a / b)` for `b > 0`: the script's `fdiv`.
pub fn fdiv(a: i128, b: i128) -> i128 {
    a.div_euclid(b)
}

/// `ceil(a / b)` for `b > 0`: the script's `cdiv`.
pub fn cdiv(a: i128, b: i128) -> i128 {
    -fdiv(-a, b)
}

/// A rule as the scripts see it: `r = { limit, period, burst }`, period in µs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Params {
    pub limit: i128,
    pub period: i128,
    pub burst: i128,
}

impl From<&Rule> for Params {
    fn from(rule: &Rule) -> Params {
        Params {
            limit: i128::from(rule.limit().get()),
            period: i128::from(rule.period_us()),
            burst: i128::from(rule.burst().get()),
        }
    }
}

/// What one Redis key holds. Each algorithm reads only its own variant and
/// treats any other as a missing key (rule keys carry the rule's
/// fingerprint, so one key never serves two algorithms).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum State {
    FixedWindow(fixed_window::Stored),
    SlidingWindowLog(Log),
    SlidingWindowCounter(sliding_window_counter::Stored),
    TokenBucket(token_bucket::Stored),
    /// gcra: a theoretical arrival time `tat + f/limit`.
    Tat(Tat),
    /// leaky_bucket: the TAT at which the queue drains, and the call that
    /// queued last (hash `{ tat, f, id }`).
    Queue(Tat, String),
    BurstFill(burst_fill::Stored),
    /// The downstream block: the µs instant it ends.
    Block(i128),
}

/// A TAT stored exactly as whole µs and a remainder in 1/limit µs
/// (hash `{ tat, f }`); invariant `0 <= f < limit`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tat {
    pub tat: i128,
    pub f: i128,
}

/// `tat_debt` of common.lua: how far `tat + f/limit` lies beyond `now`, in
/// µs * limit; 0 once it has passed (or for a missing key).
pub fn tat_debt(stored: Option<Tat>, limit: i128, now: i128) -> i128 {
    let Tat { tat, f } = stored.unwrap_or(Tat { tat: 0, f: 0 });
    if tat < now {
        0
    } else {
        (tat - now) * limit + f
    }
}

/// `tat_store` of common.lua: the TAT `now + debt/limit`.
pub fn tat_store(store: &mut ModelStore, key: &str, debt: i128, limit: i128, now: i128) {
    let whole = fdiv(debt, limit);
    store.put(
        key,
        State::Tat(Tat {
            tat: now + whole,
            f: debt - whole * limit,
        }),
    );
}

/// The Redis keyspace of the scripts, in memory.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ModelStore {
    /// State address ([`StateKey::address`]) → value; a state is absent
    /// exactly when Redis would not have it (modulo expiry, which is not
    /// modelled). A v2 place is `hash#place`, a v2 block `hash#block`.
    entries: HashMap<String, State>,
    /// State v2: the fingerprint of the rule that wrote each place (the
    /// place's `fp` field).
    marks: HashMap<String, String>,
    /// `max_in_flight`: per sorted set, each lease with the µs instant it
    /// lapses (`lua/slots.lua`).
    slots: HashMap<String, std::collections::BTreeMap<String, i128>>,
    /// State v2: per seller hash, its fields of `lua/calls.lua` (records
    /// written since the last trim, cancels' tombstones).
    pub(crate) calls: HashMap<String, calls::CallsFields>,
    /// State v2: per seller, the sorted set of its charged jobs calls'
    /// records (`prefix:{seller}:calls`).
    pub(crate) records: HashMap<String, calls::Records>,
}

impl ModelStore {
    pub fn new() -> ModelStore {
        ModelStore::default()
    }

    pub fn get(&self, key: &str) -> Option<&State> {
        self.entries.get(key)
    }

    pub fn get_mut(&mut self, key: &str) -> Option<&mut State> {
        self.entries.get_mut(key)
    }

    pub fn put(&mut self, key: &str, state: State) {
        self.entries.insert(key.to_owned(), state);
    }

    /// Forgets a state (v2: every field of its place, its `fp` too).
    pub fn remove(&mut self, key: &str) {
        self.entries.remove(key);
        self.marks.remove(key);
    }

    /// State v2: the fingerprint of the rule that wrote the place at `key`.
    pub fn mark(&self, key: &str) -> Option<&str> {
        self.marks.get(key).map(String::as_str)
    }

    pub fn set_mark(&mut self, key: &str, fingerprint: String) {
        self.marks.insert(key.to_owned(), fingerprint);
    }

    /// Every key present, sorted.
    pub fn keys(&self) -> Vec<String> {
        let mut keys: Vec<String> = self.entries.keys().cloned().collect();
        keys.sort();
        keys
    }

    /// Leases of the sorted set `key` that have not lapsed at `now`.
    pub fn slots_live(&self, key: &str, now: i128) -> usize {
        self.slots
            .get(key)
            .map_or(0, |set| set.values().filter(|&&until| until > now).count())
    }

    /// `slots_take`: a lease per granted job of call `id`, lapsed ones
    /// dropped.
    fn slots_take(&mut self, key: &str, now: i128, id: &str, jobs: usize, until: i128) {
        let set = self.slots.entry(key.to_owned()).or_default();
        set.retain(|_, &mut t| t > now);
        for j in 0..jobs {
            set.insert(SlotTerms::lease(id, j), until);
        }
    }

    /// `slots_release`: how many of `leases` were still held.
    pub fn release(&mut self, key: &str, leases: &[String]) -> u64 {
        let Some(set) = self.slots.get_mut(key) else {
            return 0;
        };
        let n = leases.iter().filter(|l| set.remove(*l).is_some()).count();
        if set.is_empty() {
            self.slots.remove(key);
        }
        n as u64
    }

    /// The block as the limiter reads it (`None`: not read, or none); in
    /// v1+v2 the later of the hash's and the v1 key's.
    fn block_until(&self, at: &BlockAt) -> Option<i128> {
        let read = |addr: &str| match self.get(addr) {
            Some(State::Block(until)) => Some(*until),
            _ => None,
        };
        let v2 = read(&at.address()?);
        match &at.also {
            Some(v1) => v2.max(read(v1)),
            None => v2,
        }
    }
}

/// One algorithm, function for function as in the contract of
/// `lua/common.lua`. `View` is what `load` reads; only `take` and `refund`
/// write. Times are µs since the epoch, `r.period` is in µs.
pub trait Algo {
    type View;
    /// The largest cost one call can ever be granted.
    fn cap(r: &Params) -> i128;
    /// The state as of `now` (no writes).
    fn load(store: &ModelStore, key: &str, r: &Params, now: i128) -> Self::View;
    /// Units admissible now.
    fn avail(st: &Self::View, r: &Params, now: i128) -> i128;
    /// µs until `need` more units are admissible after `taken` are taken
    /// now; only called when `avail - taken < need <= cap`, and then
    /// always > 0.
    fn wait(st: &Self::View, r: &Params, now: i128, need: i128, taken: i128) -> i128;
    /// Units still admissible after taking `n`.
    fn left(st: &Self::View, r: &Params, now: i128, n: i128) -> i128;
    /// µs until the state is back to fresh after taking `n`.
    fn reset(st: &Self::View, r: &Params, now: i128, n: i128) -> i128;
    /// Pacers only: the µs instant the next unit may leave.
    fn go(_st: &Self::View, _r: &Params, _now: i128) -> Option<i128> {
        None
    }
    /// Write the state for `n` units taken by call `id`.
    fn take(
        store: &mut ModelStore,
        key: &str,
        st: &Self::View,
        r: &Params,
        now: i128,
        n: i128,
        id: &str,
    );
    /// Give back `n` units of call `id`, skipping its first `skip`; `taken`
    /// is the time of the acquire that took them, `at` (>= taken) the
    /// refund's own time, at or after every take since. Only what is
    /// provably unused comes back (`drained_refund`, the leaky bucket's
    /// end-of-queue rule).
    #[allow(clippy::too_many_arguments)]
    fn refund(
        store: &mut ModelStore,
        key: &str,
        r: &Params,
        at: i128,
        n: i128,
        id: &str,
        skip: i128,
        taken: i128,
    );
}

/// One rule's loaded state, with the algorithm erased so the driver can
/// hold a rule set of mixed algorithms.
trait LoadedRule {
    fn avail(&self, now: i128) -> i128;
    fn wait(&self, now: i128, need: i128, taken: i128) -> i128;
    fn left(&self, now: i128, n: i128) -> i128;
    fn reset(&self, now: i128, n: i128) -> i128;
    fn go(&self, now: i128) -> Option<i128>;
    fn take(&self, store: &mut ModelStore, key: &str, now: i128, n: i128, id: &str);
}

struct Bound<A: Algo> {
    view: A::View,
    r: Params,
}

impl<A: Algo> LoadedRule for Bound<A> {
    fn avail(&self, now: i128) -> i128 {
        A::avail(&self.view, &self.r, now)
    }
    fn wait(&self, now: i128, need: i128, taken: i128) -> i128 {
        A::wait(&self.view, &self.r, now, need, taken)
    }
    fn left(&self, now: i128, n: i128) -> i128 {
        A::left(&self.view, &self.r, now, n)
    }
    fn reset(&self, now: i128, n: i128) -> i128 {
        A::reset(&self.view, &self.r, now, n)
    }
    fn go(&self, now: i128) -> Option<i128> {
        A::go(&self.view, &self.r, now)
    }
    fn take(&self, store: &mut ModelStore, key: &str, now: i128, n: i128, id: &str) {
        A::take(store, key, &self.view, &self.r, now, n, id)
    }
}

/// Runs `$body` with `$A` bound to the model type of `$alg`.
macro_rules! with_algo {
    ($alg:expr, $A:ident => $body:expr) => {
        match $alg {
            Algorithm::FixedWindow => {
                type $A = FixedWindow;
                $body
            }
            Algorithm::SlidingWindowLog => {
                type $A = SlidingWindowLog;
                $body
            }
            Algorithm::SlidingWindowCounter => {
                type $A = SlidingWindowCounter;
                $body
            }
            Algorithm::TokenBucket => {
                type $A = TokenBucket;
                $body
            }
            Algorithm::LeakyBucket => {
                type $A = LeakyBucket;
                $body
            }
            Algorithm::BurstFill => {
                type $A = BurstFill;
                $body
            }
            Algorithm::Gcra => {
                type $A = Gcra;
                $body
            }
        }
    };
}

// After `with_algo!`, which it uses.
pub mod convert;

fn cap_of(rule: &Rule) -> i128 {
    with_algo!(rule.algorithm(), A => A::cap(&Params::from(rule)))
}

fn load_rule(store: &ModelStore, key: &str, rule: &Rule, now: i128) -> Box<dyn LoadedRule> {
    let r = Params::from(rule);
    with_algo!(rule.algorithm(), A => Box::new(Bound::<A> {
        view: A::load(store, key, &r, now),
        r,
    }))
}

#[allow(clippy::too_many_arguments)]
fn refund_rule(
    store: &mut ModelStore,
    key: &str,
    rule: &Rule,
    at: i128,
    n: i128,
    id: &str,
    skip: i128,
    taken: i128,
) {
    let r = Params::from(rule);
    with_algo!(rule.algorithm(), A => A::refund(store, key, &r, at, n, id, skip, taken))
}

/// `load_rule` and `take_rule` of common.lua: a rule's state at its
/// address, and in v1+v2 also at its v1 key; the more used one decides
/// (fewer units admissible now, v2's on a tie), every one is charged.
struct Both {
    all: Vec<(String, Box<dyn LoadedRule>)>,
    pick: usize,
}

impl Both {
    fn load(store: &ModelStore, at: &StateKey, rule: &Rule, now: i128) -> Both {
        let mut all = vec![(at.address(), load_rule(store, &at.address(), rule, now))];
        if let Some(v1) = &at.also {
            all.push((v1.clone(), load_rule(store, v1, rule, now)));
        }
        let pick = usize::from(all.len() == 2 && all[1].1.avail(now) < all[0].1.avail(now));
        Both { all, pick }
    }

    fn st(&self) -> &dyn LoadedRule {
        self.all[self.pick].1.as_ref()
    }

    fn avail(&self, now: i128) -> i128 {
        self.st().avail(now)
    }
    fn wait(&self, now: i128, need: i128, taken: i128) -> i128 {
        self.st().wait(now, need, taken)
    }
    fn left(&self, now: i128, n: i128) -> i128 {
        self.st().left(now, n)
    }
    fn reset(&self, now: i128, n: i128) -> i128 {
        self.st().reset(now, n)
    }
    fn go(&self, now: i128) -> Option<i128> {
        self.st().go(now)
    }
    fn take(&self, store: &mut ModelStore, now: i128, n: i128, id: &str) {
        for (addr, st) in &self.all {
            st.take(store, addr, now, n, id);
        }
    }
}

/// `settle` of common.lua (state v2): makes the state at a rule's place the
/// rule's own, converting what another rule left there ([`convert`]).
fn settle(store: &mut ModelStore, at: &StateKey, rule: &Rule, now: i128) {
    if at.place.is_none() {
        return;
    }
    let addr = at.address();
    let fp = rule.fingerprint();
    let Some(old) = store.mark(&addr).map(str::to_owned) else {
        return;
    };
    if old == fp {
        return;
    }
    match Rule::from_fingerprint(&old) {
        Some(old) => convert::convert(store, &addr, &old, rule, now as u64),
        None => store.remove(&addr),
    }
    if store.get(&addr).is_some() {
        store.set_mark(&addr, fp);
    }
}

/// `stamp` of common.lua: a take names its rule at the place.
fn stamp(store: &mut ModelStore, at: &StateKey, rule: &Rule) {
    if at.place.is_some() {
        store.set_mark(&at.address(), rule.fingerprint());
    }
}

/// `owns` of common.lua: a v2 refund touches a place only while the rule
/// that took the units is still there.
fn owns(store: &ModelStore, at: &StateKey, rule: &Rule) -> bool {
    at.place.is_none() || store.mark(&at.address()) == Some(rule.fingerprint().as_str())
}

/// A dry run works on a copy when a v2 place may be converted (the script
/// converts in its buffered hash and writes nothing).
fn scratch_for(store: &ModelStore, dry: bool, rules: &[KeyedRule]) -> Option<ModelStore> {
    (dry && rules.iter().any(|(at, _)| at.place.is_some())).then(|| store.clone())
}

/// `drained_refund` of common.lua: the debt (µs * limit) a refund of `n`
/// units taken at `taken` may give back at `at`, when other calls may have
/// taken since: `n * period` less what has drained in between.
pub fn drained_refund(r: &Params, n: i128, at: i128, taken: i128) -> i128 {
    (n * r.period - (at - taken) * r.limit).max(0)
}

/// What the limiter is asked to do (`ARGV[1]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// Decide and charge.
    Acquire,
    /// Dry run: decide, write nothing.
    Peek,
    /// Give back `cost` units of call `call_id`, skipping its first `skip`
    /// (only the sliding log names units). `taken_at_us` must be the `now_us`
    /// of the acquire whose units are given back (the window algorithms and
    /// burst_fill find the window or period it charged); the call's `now_us`
    /// is the refund's own time.
    Refund { skip: u64, taken_at_us: u64 },
}

/// The fields of a reply before the script's rounding to milliseconds.
struct Out {
    status: i128,
    granted: i128,
    remaining: i128,
    retry_us: i128,
    reset_us: i128,
    go_at: i128,
    by: i128,
}

/// A reply field; the script's integers stay far inside `i64`.
fn field(x: i128) -> i64 {
    i64::try_from(x).unwrap_or(if x < 0 { i64::MIN } else { i64::MAX })
}

impl Out {
    fn reply(self, now: i128) -> Reply {
        Reply {
            status: field(self.status),
            granted: field(self.granted),
            remaining: field(self.remaining),
            retry_after_ms: field(cdiv(self.retry_us, 1000)),
            reset_after_ms: field(cdiv(self.reset_us, 1000)),
            go_at_us: field(self.go_at),
            retry_after_us: field(self.retry_us),
            reset_after_us: field(self.reset_us),
            now_us: field(now),
            by: field(self.by),
        }
    }
}

/// `lua/limiter.lua`: one decision for one seller over all of its rules,
/// all or nothing. `rules` pairs each rule's key (`KEYS[1+i]`) with the rule.
///
/// # Panics
///
/// If `cost` is 0, for every op. The script answers 0 with an error reply
/// (`cost must be at least 1`) and writes nothing, and the production
/// [`Limiter`](crate::limiter::Limiter) refuses it with
/// `LimiterError::ZeroCost` before calling the script, so a 0 reaching the
/// model is a bug in the test that sent it. A panic says so at the call,
/// where a `Result` would make every caller unwrap a case no valid call
/// reaches; like the script, the model has written nothing when it panics.
///
/// The arguments are the script's KEYS and ARGV one for one, which is why
/// there are more than clippy likes.
#[allow(clippy::too_many_arguments)]
pub fn run(
    store: &mut ModelStore,
    op: Op,
    now_us: u64,
    cost: u64,
    mode: Mode,
    call_id: &str,
    block: &BlockAt,
    rules: &[KeyedRule],
) -> Reply {
    assert!(
        cost >= 1,
        "cost must be at least 1 (limiter.lua refuses 0 with an error reply)"
    );
    let now = i128::from(now_us);
    let cost = i128::from(cost);
    let op = match op {
        Op::Refund { skip, taken_at_us } => {
            let taken = i128::from(taken_at_us);
            let at = now.max(taken);
            let skip = i128::from(skip);
            refund_request(store, rules, at, cost, call_id, skip, taken);
            return Out {
                status: 1,
                granted: cost,
                remaining: 0,
                retry_us: 0,
                reset_us: 0,
                go_at: now,
                by: 0,
            }
            .reply(now);
        }
        op => op,
    };
    let deny = |retry_us: i128, remaining: i128, reset_us: i128, by: i128| Out {
        status: 0,
        granted: 0,
        remaining,
        retry_us,
        reset_us,
        go_at: now,
        by,
    };

    let all = mode == Mode::AllOrNothing;
    if all {
        if let Some(i) = rules.iter().position(|(_, rule)| cost > cap_of(rule)) {
            return Out {
                status: -1,
                granted: 0,
                remaining: 0,
                retry_us: 0,
                reset_us: 0,
                go_at: now,
                by: i as i128 + 1,
            }
            .reply(now);
        }
    }

    let mut scratch = scratch_for(store, op == Op::Peek, rules);
    let store = scratch.as_mut().unwrap_or(store);
    for (key, rule) in rules {
        settle(store, key, rule, now);
    }
    let blocked_until = store.block_until(block).unwrap_or(0);
    let need = if all { cost } else { 1 };
    let mut n = cost;
    let (mut wait, mut by) = (0, 0);
    let states: Vec<Both> = rules
        .iter()
        .map(|(key, rule)| Both::load(store, key, rule, now))
        .collect();
    for (i, st) in states.iter().enumerate() {
        let av = st.avail(now);
        if av < need {
            let w = st.wait(now, need, 0);
            if w > wait {
                (wait, by) = (w, i as i128 + 1);
            }
        }
        n = n.min(av);
    }
    // (remaining, reset, tight) after taking `taken` under every rule.
    let summary = |taken: i128| {
        let (mut remaining, mut reset, mut tight) = (None, 0, 1);
        for (i, st) in states.iter().enumerate() {
            let left = st.left(now, taken);
            if remaining.is_none_or(|r| left < r) {
                (remaining, tight) = (Some(left), i as i128 + 1);
            }
            reset = reset.max(st.reset(now, taken));
        }
        (remaining.unwrap_or(0), reset, tight)
    };

    if blocked_until > now {
        // Not the block alone: a rule that needs longer would then refuse
        // the caller that retried at the block's end.
        let block = blocked_until - now;
        let (_, reset, _) = summary(0);
        let (retry, by) = if wait > block { (wait, by) } else { (block, 0) };
        return deny(retry, 0, block.max(reset), by).reply(now);
    }
    if wait > 0 {
        let (remaining, reset, _) = summary(0);
        return deny(wait, remaining, reset, by).reply(now);
    }

    let go_at = states
        .iter()
        .filter_map(|st| st.go(now))
        .fold(now, i128::max);
    let (remaining, reset, tight) = summary(n);
    if op == Op::Acquire {
        for ((key, rule), st) in rules.iter().zip(&states) {
            st.take(store, now, n, call_id);
            stamp(store, key, rule);
        }
    }
    Out {
        status: 1,
        granted: n,
        remaining,
        retry_us: 0,
        reset_us: reset,
        go_at,
        by: tight,
    }
    .reply(now)
}

/// `refund_rule` of common.lua over every rule of a call: `n` units of
/// call `call_id`, taken at `taken`, skipping its first `skip`, at `at`.
fn refund_request(
    store: &mut ModelStore,
    rules: &[KeyedRule],
    at: i128,
    n: i128,
    call_id: &str,
    skip: i128,
    taken: i128,
) {
    for (key, rule) in rules {
        if owns(store, key, rule) {
            let addr = key.address();
            if key.place.is_some() && rule.algorithm() == Algorithm::SlidingWindowLog {
                sliding_window_log::refund_v2(store, &addr, n, taken);
            } else {
                refund_rule(store, &addr, rule, at, n, call_id, skip, taken);
            }
        }
        // v1+v2: the v1 key was charged too.
        if let Some(v1) = &key.also {
            refund_rule(store, v1, rule, at, n, call_id, skip, taken);
        }
    }
}

/// `lua/jobs.lua`: per request, the longest prefix of its jobs that fits,
/// each job all or nothing across the request's rules; requests in order,
/// each seeing what the ones before it wrote. One [`JobsReply`] per request.
///
/// # Panics
///
/// If a request has no jobs or a job costs 0 (the script answers with an
/// error reply; [`Limiter`](crate::limiter::Limiter) never sends either).
pub fn run_jobs(
    store: &mut ModelStore,
    now_us: u64,
    dry_run: bool,
    requests: &[JobsRequest],
) -> Vec<JobsReply> {
    assert!(
        requests
            .iter()
            .all(|q| !q.costs.is_empty() && q.costs.iter().all(|&c| c >= 1)),
        "every request needs at least one job, each of cost >= 1"
    );
    let now = i128::from(now_us);
    let all: Vec<KeyedRule> = requests.iter().flat_map(|q| q.rules.clone()).collect();
    let mut scratch = scratch_for(store, dry_run, &all);
    let store = scratch.as_mut().unwrap_or(store);
    let charge = !dry_run;
    requests
        .iter()
        .map(|q| {
            // calls.lua: a request cancelled before it ran charges nothing;
            // a charged one is recorded for a later cancel.
            if charge && calls::cancelled_before(store, q, now) {
                return JobsReply {
                    head: Out {
                        status: 0,
                        granted: 0,
                        remaining: 0,
                        retry_us: 0,
                        reset_us: 0,
                        go_at: now,
                        by: 0,
                    }
                    .reply(now),
                    jobs: 0,
                    next: 1,
                    tight: 0,
                };
            }
            let reply = jobs_request(store, now, charge, q);
            if charge && reply.head.status == 1 && reply.head.granted > 0 && !q.rules.is_empty() {
                calls::record(store, q, now, i128::from(reply.head.granted));
            }
            reply
        })
        .collect()
}

/// `cancel` of `lua/calls.lua`: per request, the units of its recorded
/// jobs call given back (each rule's refund, taken at the recorded time),
/// -1 when a tombstone was left (no record), 0 when nothing was done
/// (cancelled already, or v1: not recorded).
pub fn cancel(store: &mut ModelStore, now_us: u64, requests: &[JobsRequest]) -> Vec<i64> {
    let now = i128::from(now_us);
    for q in requests {
        // Its slots of max_in_flight too: the worker never held them.
        if let Some(s) = &q.slots {
            let leases: Vec<String> = (0..q.costs.len())
                .map(|j| SlotTerms::lease(&q.call_id, j))
                .collect();
            store.release(&s.key, &leases);
        }
    }
    requests
        .iter()
        .map(|q| match calls::cancel(store, q, now) {
            calls::Cancelled::Refund { at, units } => {
                refund_request(store, &q.rules, now.max(at), units, &q.call_id, 0, at);
                field(units)
            }
            calls::Cancelled::Tombstone => -1,
            calls::Cancelled::Nothing => 0,
        })
        .collect()
}

fn jobs_request(store: &mut ModelStore, now: i128, charge: bool, q: &JobsRequest) -> JobsReply {
    let costs: Vec<i128> = q.costs.iter().map(|&c| i128::from(c)).collect();
    let reply = |out: Out, jobs: i64, next: i64| JobsReply {
        head: out.reply(now),
        jobs,
        next,
        tight: 0,
    };
    let out = |status, granted, remaining, retry_us, reset_us, go_at, by| Out {
        status,
        granted,
        remaining,
        retry_us,
        reset_us,
        go_at,
        by,
    };
    // 1-based index of the first rule whose capacity `cost` exceeds, else 0.
    let never = |cost: i128| {
        q.rules
            .iter()
            .position(|(_, rule)| cost > cap_of(rule))
            .map_or(0, |i| i as i128 + 1)
    };
    let first_never = never(costs[0]);
    if first_never > 0 {
        return reply(out(-1, 0, 0, 0, 0, now, first_never), 0, 2);
    }

    for (key, rule) in &q.rules {
        settle(store, key, rule, now);
    }
    let states: Vec<Both> = q
        .rules
        .iter()
        .map(|(key, rule)| Both::load(store, key, rule, now))
        .collect();
    let avail: Vec<i128> = states.iter().map(|st| st.avail(now)).collect();
    let n = avail.iter().copied().min();
    let wait_for = |cost: i128, taken: i128| {
        let (mut wait, mut by) = (0, 0);
        for (i, st) in states.iter().enumerate() {
            if avail[i] - taken < cost {
                let w = st.wait(now, cost, taken);
                if w > wait {
                    (wait, by) = (w, i as i128 + 1);
                }
            }
        }
        (wait, by)
    };
    let summary = |taken: i128| {
        let (mut remaining, mut reset, mut tight) = (None, 0, 0);
        for (i, st) in states.iter().enumerate() {
            let left = st.left(now, taken);
            if remaining.is_none_or(|r| left < r) {
                (remaining, tight) = (Some(left), i as i64 + 1);
            }
            reset = reset.max(st.reset(now, taken));
        }
        (remaining.unwrap_or(0), reset, tight)
    };

    let blocked_until = store.block_until(&q.block).unwrap_or(0);
    if blocked_until > now {
        let block = blocked_until - now;
        let (wait, by) = wait_for(costs[0], 0);
        let (_, reset, _) = summary(0);
        let (retry, by) = if block >= wait {
            (block, 0)
        } else {
            (wait, by)
        };
        return reply(out(0, 0, 0, retry, block.max(reset), now, by), 0, 1);
    }

    let free = q
        .slots
        .as_ref()
        .map(|s| i128::from(s.max) - store.slots_live(&s.key, now) as i128);
    let (mut jobs, mut units, mut stop, mut capped) = (0usize, 0i128, 0i128, false);
    for (j, &c) in costs.iter().enumerate() {
        stop = never(c);
        if stop > 0 || n.is_some_and(|n| units + c > n) {
            break;
        }
        if free.is_some_and(|free| j as i128 + 1 > free) {
            capped = true;
            break;
        }
        (jobs, units) = (jobs + 1, units + c);
    }
    let poll = q.slots.as_ref().map_or(0, |s| i128::from(s.poll_us));
    if jobs == 0 {
        let (remaining, reset, _) = summary(0);
        if capped {
            return reply(out(0, 0, remaining, poll, reset, now, 0), 0, 3);
        }
        let (wait, by) = wait_for(costs[0], 0);
        return reply(out(0, 0, remaining, wait, reset, now, by), 0, 1);
    }

    let go_at = states
        .iter()
        .filter_map(|st| st.go(now))
        .fold(now, i128::max);
    let (remaining, reset, tight) = summary(units);
    let (retry, by, next) = if jobs == costs.len() {
        (0, 0, 0)
    } else if stop > 0 {
        (0, stop, 2)
    } else if capped {
        (poll, 0, 3)
    } else {
        let (wait, by) = wait_for(costs[jobs], units);
        (wait, by, 1)
    };
    if charge {
        for ((key, rule), st) in q.rules.iter().zip(&states) {
            st.take(store, now, units, &q.call_id);
            stamp(store, key, rule);
        }
        if let Some(s) = &q.slots {
            // A pacer's later units go later: leases run from the grant's
            // last unit's go-at.
            let span = q
                .rules
                .iter()
                .filter(|(_, r)| r.algorithm() == Algorithm::LeakyBucket)
                .map(|(_, r)| {
                    let p = Params::from(r);
                    cdiv(p.period, p.limit) * units
                })
                .max()
                .unwrap_or(0);
            let until = go_at + span + i128::from(s.lease_us);
            store.slots_take(&s.key, now, &q.call_id, jobs, until);
        }
    }
    JobsReply {
        tight,
        ..reply(
            out(1, units, remaining, retry, reset, go_at, by),
            jobs as i64,
            next,
        )
    }
}

/// `lua/block.lua`: hold the seller until `now_us + dur_us`; a shorter block
/// never shortens a longer one. Returns the µs instant the block ends.
pub fn block(store: &mut ModelStore, at: &BlockAt, now_us: u64, dur_us: u64) -> u64 {
    use super::script::BlockRead;
    let until = i128::from(now_us) + i128::from(dur_us);
    // Each layout keeps the longer of its block and this one.
    let mut one = |addr: String| -> i128 {
        match store.get(&addr) {
            Some(State::Block(current)) if *current >= until => *current,
            _ => {
                store.put(&addr, State::Block(until));
                until
            }
        }
    };
    let v2 = match at.read {
        BlockRead::Field => one(format!("{}#block", at.key)),
        _ => one(at.key.clone()),
    };
    // v1+v2 writes the v1 key too: replicas still on v1 read only that.
    let v1 = match (&at.also, at.read) {
        (Some(v1), BlockRead::Field) => one(v1.clone()),
        _ => v2,
    };
    v2.max(v1) as u64
}

/// Where the model limiter reads the time.
pub trait Clock {
    /// µs since the Unix epoch.
    fn now_us(&self) -> u64;
}

/// A clock that moves only when told; clones share the same time, so a test
/// keeps one handle and gives the other to the limiter.
#[derive(Debug, Clone, Default)]
pub struct ManualClock {
    now_us: Arc<AtomicU64>,
}

impl ManualClock {
    pub fn new(now_us: u64) -> ManualClock {
        ManualClock {
            now_us: Arc::new(AtomicU64::new(now_us)),
        }
    }

    pub fn advance(&self, by: Duration) {
        let by = u64::try_from(by.as_micros()).unwrap_or(u64::MAX);
        self.now_us.fetch_add(by, Ordering::SeqCst);
    }

    pub fn set(&self, now_us: u64) {
        self.now_us.store(now_us, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_us(&self) -> u64 {
        self.now_us.load(Ordering::SeqCst)
    }
}

/// The model as a limiter for one seller: the same typed decisions the
/// Redis limiter gives, with no Redis.
///
/// ```
/// use std::time::Duration;
/// use throttle_worker::limiter::local::{ManualClock, ModelLimiter};
/// use throttle_worker::limiter::{Algorithm, Decision, Mode, Rule};
///
/// let rules = [Rule::new(Algorithm::Gcra, 2, Duration::from_secs(1), None).unwrap()];
/// let clock = ManualClock::new(1_700_000_000_000_000);
/// let mut limiter = ModelLimiter::new(clock.clone());
/// assert_eq!(limiter.acquire(&rules, 2, Mode::AllOrNothing).granted(), 2);
/// let Decision::Denied(denied) = limiter.acquire(&rules, 1, Mode::AllOrNothing) else {
///     panic!("the bucket is empty");
/// };
/// assert_eq!(denied.retry_after, Duration::from_millis(500));
/// clock.advance(denied.retry_after);
/// assert_eq!(limiter.acquire(&rules, 1, Mode::AllOrNothing).granted(), 1);
/// ```
#[derive(Debug, Clone)]
pub struct ModelLimiter<C: Clock> {
    clock: C,
    store: ModelStore,
    /// Calls made so far; names each call's id uniquely.
    calls: u64,
}

impl<C: Clock> ModelLimiter<C> {
    /// The key of the seller's downstream block.
    pub const BLOCK_KEY: &'static str = "model:{seller}:block";

    pub fn new(clock: C) -> ModelLimiter<C> {
        ModelLimiter {
            clock,
            store: ModelStore::new(),
            calls: 0,
        }
    }

    /// The key a rule's state lives under.
    pub fn rule_key(rule: &Rule) -> String {
        format!("model:{{seller}}:{}", rule.fingerprint())
    }

    /// Decides and charges. Panics if `cost` is 0, as [`run`] does.
    pub fn acquire(&mut self, seller_rules: &[Rule], cost: u64, mode: Mode) -> Decision {
        self.decide(Op::Acquire, seller_rules, cost, mode)
    }

    /// Dry run: the decision `acquire` would give, charging nothing.
    pub fn peek(&mut self, seller_rules: &[Rule], cost: u64, mode: Mode) -> Decision {
        self.decide(Op::Peek, seller_rules, cost, mode)
    }

    /// Blocks the seller for `dur` (the downstream answered 429); returns
    /// the µs instant the block ends.
    pub fn block(&mut self, dur: Duration) -> u64 {
        let dur_us = u64::try_from(dur.as_micros()).unwrap_or(u64::MAX);
        block(
            &mut self.store,
            &BlockAt::key(Self::BLOCK_KEY),
            self.clock.now_us(),
            dur_us,
        )
    }

    pub fn store(&self) -> &ModelStore {
        &self.store
    }

    pub fn clock(&self) -> &C {
        &self.clock
    }

    fn decide(&mut self, op: Op, rules: &[Rule], cost: u64, mode: Mode) -> Decision {
        self.calls += 1;
        let keyed: Vec<KeyedRule> = rules
            .iter()
            .map(|r| (StateKey::own(Self::rule_key(r)), *r))
            .collect();
        let reply = run(
            &mut self.store,
            op,
            self.clock.now_us(),
            cost,
            mode,
            &format!("call{}", self.calls),
            &BlockAt::key(Self::BLOCK_KEY),
            &keyed,
        );
        reply.decision(rules, cost)
    }
}

#[cfg(test)]
pub(crate) mod tables;

#[cfg(test)]
mod tests;
