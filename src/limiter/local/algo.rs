//! The algorithm contract of `lua/common.lua` in Rust: [`Algo`], one
//! implementation per algorithm file, the rule as the scripts see it
//! ([`Params`]), their exact division, and `with_algo!`, which binds an
//! [`Algorithm`] to its model type where the types are in scope. The
//! drivers (`decide.rs`, the test kit's job lists) and rule edits
//! (`convert.rs`) use it; it uses none of them.
//!
//! All arithmetic is exact `i128`; the scripts use integer-valued doubles,
//! which agree as long as every product stays below 2^53.

#[allow(unused_imports)] // `with_algo!` names it where it expands.
use crate::limiter::rule::Algorithm;
use crate::limiter::rule::Rule;

use super::state::{State, Tat};
use super::store::ModelStore;

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
pub(crate) trait LoadedRule {
    fn avail(&self, now: i128) -> i128;
    fn wait(&self, now: i128, need: i128, taken: i128) -> i128;
    fn left(&self, now: i128, n: i128) -> i128;
    fn reset(&self, now: i128, n: i128) -> i128;
    fn go(&self, now: i128) -> Option<i128>;
    fn take(&self, store: &mut ModelStore, key: &str, now: i128, n: i128, id: &str);
}

pub(crate) struct Bound<A: Algo> {
    pub(crate) view: A::View,
    pub(crate) r: Params,
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

/// `drained_refund` of common.lua: the debt (µs * limit) a refund of `n`
/// units taken at `taken` may give back at `at`, when other calls may have
/// taken since: `n * period` less what has drained in between.
pub fn drained_refund(r: &Params, n: i128, at: i128, taken: i128) -> i128 {
    (n * r.period - (at - taken) * r.limit).max(0)
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
