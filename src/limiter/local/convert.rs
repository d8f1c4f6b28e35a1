//! Rule edits (issue 21, part 2): the state a rule leaves to the rule that
//! replaces it at the same place of a seller's rule set, so that what the
//! old rule admitted still counts.
//!
//! A rule's state lives at its place in the seller's hash, named by its
//! fingerprint (`fp`); the new rule's first call converts what it finds
//! there with [`convert`]. A fresh start instead would let `fixed_window`
//! 30 per 10 s with 20 used, raised to 40, admit 40 more in the same
//! window, 60 in all. This model is the specification the Lua follows
//! (`settle`, see `docs/src/internals/limiter-state.md`).
//!
//! What an edit does, per case:
//! - **The same window algorithm and period** (`fixed_window`,
//!   `sliding_window_log`, with a new limit): the state is kept as it is. A
//!   window's count and a log of admissions mean the same under any limit,
//!   so the new rule counts exactly what the old one admitted.
//! - **Anything else** (a new period, burst or rate of a bucket, another
//!   algorithm): the old rule's units in use now, `used = cap - avail`,
//!   are charged to a fresh state of the new rule at the edit's instant
//!   (at most its capacity). Charging them at the edit rather than when
//!   they were admitted is conservative: they drain from the new rule
//!   later than they would have. A bucket's burst is therefore counted
//!   once across an edit, never the old burst plus the new.
//!
//! The proptest below runs random pairs of rules over random arrivals,
//! edits at a random instant and checks the admissions of every interval
//! that spans the edit against the bound of "the larger of the two rules":
//! see `tests::windows_within_the_larger_rule`.

use super::{
    Algo, BurstFill, FixedWindow, Gcra, LeakyBucket, ModelStore, Params, SlidingWindowCounter,
    SlidingWindowLog, TokenBucket,
};
use crate::limiter::rule::{Algorithm, Rule};

/// The call id the charge of an edit is written under (`sliding_window_log`
/// names its members by call id).
pub const EDIT_CALL_ID: &str = "edit";

/// Rewrites the state under `key`, written by rule `old`, as the state of
/// rule `new` at `now_us` (µs since the epoch). Idempotent for `old ==
/// new`; calling it again after the new rule has run is not (v2 records
/// which rule wrote the state and converts once).
pub fn convert(store: &mut ModelStore, key: &str, old: &Rule, new: &Rule, now_us: u64) {
    if old == new || keeps_state(old, new) {
        return;
    }
    let now = i128::from(now_us);
    let used = units_in_use(store, key, old, now);
    store.remove(key);
    let r = Params::from(new);
    let charge = used.min(i128::from(new.capacity()));
    if charge > 0 {
        with_algo!(new.algorithm(), A => {
            let view = A::load(store, key, &r, now);
            A::take(store, key, &view, &r, now, charge, EDIT_CALL_ID);
        });
    }
}

/// Whether `new` reads `old`'s state unchanged: a count per aligned window
/// or a log of admission times, under the same period.
fn keeps_state(old: &Rule, new: &Rule) -> bool {
    old.algorithm() == new.algorithm()
        && old.period_us() == new.period_us()
        && matches!(
            old.algorithm(),
            Algorithm::FixedWindow | Algorithm::SlidingWindowLog
        )
}

/// Units rule `rule` holds in use at `now`: its capacity less what it would
/// admit now.
pub fn units_in_use(store: &ModelStore, key: &str, rule: &Rule, now: i128) -> i128 {
    let r = Params::from(rule);
    with_algo!(rule.algorithm(), A => {
        let view = A::load(store, key, &r, now);
        (A::cap(&r) - A::avail(&view, &r, now)).max(0)
    })
}
