//! `lua/leaky_bucket.lua`: a pacer. Admitted units leave one every
//! period/limit; at most `burst` units may be queued. A unit that fits is
//! told the instant it may go (the caller waits until then), so the
//! downstream sees a smooth rate; one that does not fit is refused with the
//! time until a queue slot frees. The state is a TAT, as for gcra: the
//! instant the queue drains, and the id of the call that queued last.

use super::gcra::{tat, View};
use super::{cdiv, fdiv, tat_debt, Algo, ModelStore, Params, State, Tat};

pub enum LeakyBucket {}

impl Algo for LeakyBucket {
    type View = View;

    fn cap(r: &Params) -> i128 {
        r.burst
    }

    fn load(store: &ModelStore, key: &str, r: &Params, now: i128) -> View {
        tat::load(store, key, r, now)
    }

    fn avail(st: &View, r: &Params, _now: i128) -> i128 {
        tat::avail(st, r)
    }

    fn wait(st: &View, r: &Params, _now: i128, need: i128, taken: i128) -> i128 {
        tat::wait(st, r, taken + need)
    }

    fn left(st: &View, r: &Params, _now: i128, n: i128) -> i128 {
        tat::left(st, r, n)
    }

    fn reset(st: &View, r: &Params, _now: i128, n: i128) -> i128 {
        tat::reset(st, r, n)
    }

    /// The first unit leaves when everything queued before it has left.
    fn go(st: &View, r: &Params, now: i128) -> Option<i128> {
        Some(now + cdiv(st.debt, r.limit))
    }

    fn take(
        store: &mut ModelStore,
        key: &str,
        st: &View,
        r: &Params,
        now: i128,
        n: i128,
        id: &str,
    ) {
        let debt = st.debt + n * r.period;
        queue_store(store, key, debt, r.limit, now, id.to_owned());
    }

    /// A caller uses a grant's first slots, so the units given back are its
    /// last ones: the end of the queue, and only while nothing has queued
    /// behind them. A slot in the middle cannot be handed out again (the
    /// queue is one TAT, not a list of slots), and pulling the end back
    /// would give the next caller a slot a later call already holds.
    fn refund(
        store: &mut ModelStore,
        key: &str,
        r: &Params,
        at: i128,
        n: i128,
        id: &str,
        _skip: i128,
        _taken: i128,
    ) {
        let Some(State::Queue(t, last)) = store.get(key).cloned() else {
            return;
        };
        if last != id {
            return;
        }
        let debt = tat_debt(Some(t), r.limit, at);
        if debt > 0 {
            queue_store(store, key, (debt - n * r.period).max(0), r.limit, at, last);
        }
    }
}

/// `tat_store` plus the id of the call that queued last.
fn queue_store(store: &mut ModelStore, key: &str, debt: i128, limit: i128, now: i128, id: String) {
    let whole = fdiv(debt, limit);
    let t = Tat {
        tat: now + whole,
        f: debt - whole * limit,
    };
    store.put(key, State::Queue(t, id));
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use proptest::prelude::*;

    use super::super::tables::{all, check, drive, rule, span_bound_violation, upto, Step};
    use crate::limiter::{Algorithm, Mode};

    const S: i64 = 1_000_000;

    #[test]
    fn table() {
        // 2 per second (one every 0.5 s), queue of 3.
        let r = rule(Algorithm::LeakyBucket, 2, Duration::from_secs(1), Some(3));
        #[rustfmt::skip]
        let rows = [
            // row, at µs, step, cost, [status, granted, remaining, retry µs, reset µs, go delay µs]
            (1, 0, all(), 1, [1, 1, 2, 0, 500_000, 0]),
            // Queued behind the first unit: goes 0.5 s later.
            (2, 0, all(), 2, [1, 2, 0, 0, 1_500_000, 500_000]),
            (3, 100_000, all(), 1, [0, 0, 0, 400_000, 1_400_000, 0]),
            (4, 500_000, all(), 1, [1, 1, 0, 0, 1_500_000, S]),
            (5, 500_000, all(), 4, [-1, 0, 0, 0, 0, 0]),
            (6, 500_000, upto(), 3, [0, 0, 0, 500_000, 1_500_000, 0]),
            (7, S, Step::Peek(Mode::UpTo), 3, [1, 1, 0, 0, 1_500_000, S]),
            // Refund at the take's time frees the slot.
            (8, 500_000, Step::Refund { skip: 0, call: 4 }, 1, [1, 1, 0, 0, 0, 0]),
            (9, S, Step::Peek(Mode::AllOrNothing), 2, [1, 2, 0, 0, 1_500_000, 500_000]),
        ];
        check(&r, &rows);
    }

    #[test]
    fn fractional_interval_never_goes_early() {
        // One every 333_333.3 µs, queue of 3.
        let r = rule(Algorithm::LeakyBucket, 3, Duration::from_secs(1), Some(3));
        #[rustfmt::skip]
        let rows = [
            (1, 0, all(), 1, [1, 1, 2, 0, 333_334, 0]),
            (2, 0, all(), 1, [1, 1, 1, 0, 666_667, 333_334]),
            (3, 0, all(), 1, [1, 1, 0, 0, S, 666_667]),
            (4, 0, all(), 1, [0, 0, 0, 333_334, S, 0]),
            // The queue drains at exactly 1 s: this unit goes then.
            (5, 333_334, all(), 1, [1, 1, 0, 0, S, 666_666]),
        ];
        check(&r, &rows);
    }

    proptest! {
        /// Admissions obey the gcra bound, and single units are scheduled
        /// at least one interval (rounded down) apart, never before now.
        #[test]
        fn paced(
            limit in 1u64..6,
            burst in 1u64..6,
            period in 50u64..2_000,
            calls in prop::collection::vec((0u64..400, 1u64..2, any::<bool>()), 1..80),
        ) {
            let r = rule(Algorithm::LeakyBucket, limit, Duration::from_micros(period), Some(burst));
            let admitted = drive(&r, &calls);
            if let Some(violation) = span_bound_violation(&r, &admitted) {
                prop_assert!(false, "{r}: {violation}");
            }
            for pair in admitted.windows(2) {
                let (a, b) = (pair[0].reply, pair[1].reply);
                prop_assert!(a.go_at_us >= a.now_us);
                prop_assert!(
                    b.go_at_us - a.go_at_us >= (period / limit) as i64,
                    "{a:?} then {b:?}"
                );
            }
        }
    }
}
