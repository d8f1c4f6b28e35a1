//! One decision for one seller over all of its rules ([`run`]), each
//! algorithm behind [`Algo`](super::Algo) (`algo.rs`), with the helpers of
//! `lua/common.lua` the job-list driver of the test kit shares (`settle`,
//! `lost_fill`, `stamp`, `owns`, refunds). The local fallback decides with
//! it ([`ModelLimiter`](super::ModelLimiter)).
//!
//! All arithmetic is exact `i128`; the scripts use integer-valued doubles,
//! which agree as long as every product stays below 2^53.

use super::algo::{cdiv, Bound, LoadedRule, Params};
use super::convert;
use super::store::ModelStore;
use super::{
    Algo, BurstFill, FixedWindow, Gcra, LeakyBucket, SlidingWindowCounter, SlidingWindowLog,
    TokenBucket,
};
use crate::limiter::decision::Mode;
use crate::limiter::reply::Reply;
use crate::limiter::rule::{Algorithm, Rule};
use crate::limiter::script::{BlockAt, KeyedRule, StateKey};

pub(crate) fn cap_of(rule: &Rule) -> i128 {
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

/// `load_rule` and `take_rule` of common.lua: a rule's state at its place.
pub(crate) struct Placed {
    addr: String,
    st: Box<dyn LoadedRule>,
}

impl Placed {
    pub(crate) fn load(store: &ModelStore, at: &StateKey, rule: &Rule, now: i128) -> Placed {
        let addr = at.address();
        let st = load_rule(store, &addr, rule, now);
        Placed { addr, st }
    }

    pub(crate) fn avail(&self, now: i128) -> i128 {
        self.st.avail(now)
    }
    pub(crate) fn wait(&self, now: i128, need: i128, taken: i128) -> i128 {
        self.st.wait(now, need, taken)
    }
    pub(crate) fn left(&self, now: i128, n: i128) -> i128 {
        self.st.left(now, n)
    }
    pub(crate) fn reset(&self, now: i128, n: i128) -> i128 {
        self.st.reset(now, n)
    }
    pub(crate) fn go(&self, now: i128) -> Option<i128> {
        self.st.go(now)
    }
    pub(crate) fn take(&self, store: &mut ModelStore, now: i128, n: i128, id: &str) {
        self.st.take(store, &self.addr, now, n, id);
    }
}

/// `settle` of common.lua: makes the state at a rule's place the
/// rule's own, converting what another rule left there ([`convert`]).
pub(crate) fn settle(store: &mut ModelStore, at: &StateKey, rule: &Rule, now: i128) {
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
    // The script names the new rule wherever the place still has a field:
    // a state kept as it is (even an emptied log), or a converted charge.
    if store.get(&addr).is_some() || store.mark(&addr).is_some() {
        store.set_mark(&addr, fp);
    }
}

/// `lost_fill` of common.lua: after Redis lost the limiter's state (at
/// `lost`, the epoch), a place that no rule has written is charged a
/// whole use at `lost` (the most the lost state can have held), as long as
/// that use would still count at `now`. With a bound (`max`,
/// `redis.state_loss_wait`), a use that would count longer than it is not
/// charged: the place stays unwritten and is held until `lost + max`,
/// which is returned while it holds.
#[cfg(any(test, feature = "testkit"))]
pub(crate) fn lost_fill(
    store: &mut ModelStore,
    at: &StateKey,
    rule: &Rule,
    lost: i128,
    max: Option<i128>,
    now: i128,
) -> Option<i128> {
    let addr = at.address();
    if store.mark(&addr).is_some() {
        return None;
    }
    let lost = lost.min(now);
    let r = Params::from(rule);
    with_algo!(rule.algorithm(), A => {
        let view = A::load(store, &addr, &r, lost);
        let cap = A::cap(&r);
        let reach = A::reset(&view, &r, lost, cap);
        if now >= lost + reach {
            return None;
        }
        if let Some(max) = max.filter(|&max| reach > max) {
            return (now < lost + max).then_some(lost + max);
        }
        A::take(store, &addr, &view, &r, lost, cap, LOST_CALL_ID);
    });
    store.set_mark(&addr, rule.fingerprint());
    None
}

/// The call id a loss's charge is written under.
#[cfg(any(test, feature = "testkit"))]
const LOST_CALL_ID: &str = "lost";

/// `stamp` of common.lua: a take names its rule at the place.
pub(crate) fn stamp(store: &mut ModelStore, at: &StateKey, rule: &Rule) {
    store.set_mark(&at.address(), rule.fingerprint());
}

/// `owns` of common.lua: a refund touches a place only while the rule
/// that took the units is still there.
pub(crate) fn owns(store: &ModelStore, at: &StateKey, rule: &Rule) -> bool {
    store.mark(&at.address()) == Some(rule.fingerprint().as_str())
}

/// A dry run works on a copy when a place may be converted (the script
/// converts in its buffered hash and writes nothing).
pub(crate) fn scratch_for(
    store: &ModelStore,
    dry: bool,
    rules: &[KeyedRule],
) -> Option<ModelStore> {
    (dry && !rules.is_empty()).then(|| store.clone())
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
pub(crate) struct Out {
    pub(crate) status: i128,
    pub(crate) granted: i128,
    pub(crate) remaining: i128,
    pub(crate) retry_us: i128,
    pub(crate) reset_us: i128,
    pub(crate) go_at: i128,
    pub(crate) by: i128,
}

/// A reply field; the script's integers stay far inside `i64`.
pub(crate) fn field(x: i128) -> i64 {
    i64::try_from(x).unwrap_or(if x < 0 { i64::MIN } else { i64::MAX })
}

impl Out {
    pub(crate) fn reply(self, now: i128) -> Reply {
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
    let states: Vec<Placed> = rules
        .iter()
        .map(|(key, rule)| Placed::load(store, key, rule, now))
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
pub(crate) fn refund_request(
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
            refund_rule(store, &key.address(), rule, at, n, call_id, skip, taken);
        }
    }
}
