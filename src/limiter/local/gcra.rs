//! `lua/gcra.lua`: the generic cell rate algorithm, as redis-cell's
//! CL.THROTTLE. Emission interval T = period/limit, tolerance = burst * T: a
//! fresh key admits `burst` at once, then one every T. (CL.THROTTLE's
//! max_burst is our burst - 1.) All times are kept in µs * limit ("debt"),
//! so T = period exactly.

use super::{
    cdiv, drained_refund, fdiv, tat_debt, tat_store, Algo, ModelStore, Params, State, Tat,
};

#[derive(Debug, Clone, Copy)]
pub struct View {
    /// `(tat - now) * limit`, 0 once the TAT has passed.
    pub(crate) debt: i128,
}

pub enum Gcra {}

pub(crate) fn stored_tat(store: &ModelStore, key: &str) -> Option<Tat> {
    match store.get(key) {
        Some(State::Tat(t)) | Some(State::Queue(t, _)) => Some(*t),
        _ => None,
    }
}

/// The TAT algorithms' shared `load`, `avail`, `wait`, `left`, `reset` and
/// `take` (leaky_bucket adds `go` and its own `refund`).
pub(crate) mod tat {
    use super::*;

    pub(crate) fn load(store: &ModelStore, key: &str, r: &Params, now: i128) -> View {
        View {
            debt: tat_debt(stored_tat(store, key), r.limit, now),
        }
    }

    pub(crate) fn avail(st: &View, r: &Params) -> i128 {
        fdiv(r.burst * r.period - st.debt, r.period).max(0)
    }

    /// now must reach tat + need*T - tolerance.
    pub(crate) fn wait(st: &View, r: &Params, need: i128) -> i128 {
        cdiv(st.debt + need * r.period - r.burst * r.period, r.limit)
    }

    pub(crate) fn left(st: &View, r: &Params, n: i128) -> i128 {
        fdiv(r.burst * r.period - st.debt - n * r.period, r.period).max(0)
    }

    pub(crate) fn reset(st: &View, r: &Params, n: i128) -> i128 {
        cdiv(st.debt + n * r.period, r.limit)
    }

    pub(crate) fn take(
        store: &mut ModelStore,
        key: &str,
        st: &View,
        r: &Params,
        now: i128,
        n: i128,
    ) {
        tat_store(store, key, st.debt + n * r.period, r.limit, now);
    }
}

impl Algo for Gcra {
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

    fn take(
        store: &mut ModelStore,
        key: &str,
        st: &View,
        r: &Params,
        now: i128,
        n: i128,
        _id: &str,
    ) {
        tat::take(store, key, st, r, now, n);
    }

    fn refund(
        store: &mut ModelStore,
        key: &str,
        r: &Params,
        at: i128,
        n: i128,
        _id: &str,
        _skip: i128,
        taken: i128,
    ) {
        // Other calls may have queued behind this one: only the part of its
        // charge that cannot have drained yet comes back.
        let back = drained_refund(r, n, at, taken);
        let debt = tat_debt(stored_tat(store, key), r.limit, at);
        if back > 0 && debt > 0 {
            tat_store(store, key, (debt - back).max(0), r.limit, at);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use proptest::prelude::*;

    use super::super::tables::{all, check, drive, rule, span_bound_violation, upto, Step};
    use crate::limiter::{Algorithm, Mode};

    #[test]
    fn table() {
        // 10 per second (T = 100 ms), burst 5 (CL.THROTTLE max_burst 4).
        let r = rule(Algorithm::Gcra, 10, Duration::from_secs(1), Some(5));
        #[rustfmt::skip]
        let rows = [
            // row, at µs, step, cost, [status, granted, remaining, retry µs, reset µs, go delay µs]
            (1, 0, all(), 5, [1, 5, 0, 0, 500_000, 0]),
            (2, 0, all(), 1, [0, 0, 0, 100_000, 500_000, 0]),
            (3, 99_999, all(), 1, [0, 0, 0, 1, 400_001, 0]),
            (4, 100_000, all(), 1, [1, 1, 0, 0, 500_000, 0]),
            (5, 100_000, all(), 6, [-1, 0, 0, 0, 0, 0]),
            (6, 350_000, upto(), 5, [1, 2, 0, 0, 450_000, 0]),
            (7, 2_000_000, Step::Peek(Mode::AllOrNothing), 5, [1, 5, 0, 0, 500_000, 0]),
            // Refund at the take's time moves the TAT back by 2 T.
            (8, 350_000, Step::Refund { skip: 0, call: 6 }, 2, [1, 2, 0, 0, 0, 0]),
            (9, 350_000, all(), 3, [0, 0, 2, 50_000, 250_000, 0]),
        ];
        check(&r, &rows);
    }

    #[test]
    fn fractional_emission_interval_rounds_waits_up() {
        // T = 333_333.3 µs.
        let r = rule(Algorithm::Gcra, 3, Duration::from_secs(1), Some(1));
        #[rustfmt::skip]
        let rows = [
            (1, 0, all(), 1, [1, 1, 0, 0, 333_334, 0]),
            // TAT = 333_333.3: the wait and the reset round up.
            (2, 0, all(), 1, [0, 0, 0, 333_334, 333_334, 0]),
            (3, 333_334, all(), 1, [1, 1, 0, 0, 333_334, 0]),
            // TAT = 666_667.3.
            (4, 333_334, all(), 1, [0, 0, 0, 333_334, 333_334, 0]),
            (5, 666_668, all(), 1, [1, 1, 0, 0, 333_334, 0]),
        ];
        check(&r, &rows);
    }

    proptest! {
        /// Any span of length d admits at most burst + ceil(d * limit / period).
        #[test]
        fn span_bound(
            limit in 1u64..6,
            burst in 1u64..6,
            period in 50u64..2_000,
            calls in prop::collection::vec((0u64..400, 1u64..7, any::<bool>()), 1..80),
        ) {
            let r = rule(Algorithm::Gcra, limit, Duration::from_micros(period), Some(burst));
            let admitted = drive(&r, &calls);
            if let Some(violation) = span_bound_violation(&r, &admitted) {
                prop_assert!(false, "{r}: {violation}");
            }
        }
    }
}
