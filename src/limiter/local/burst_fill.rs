//! `lua/burst_fill.lua`: `limit` tokens per period; the period starts at the
//! first request, and when it ends the bucket is refilled to exactly `limit`
//! at once (unused tokens never carry over). A refused request learns the
//! time to the next refill.
//!
//! Because the refill is all at once, up to `2 * limit - 1` units can pass in
//! a span shorter than one period around a refill instant: the tail of one
//! period's tokens and the whole of the next.

use super::{Algo, ModelStore, Params, State};

pub use super::state::BurstFillStored as Stored;

#[derive(Debug, Clone, Copy)]
pub struct View {
    /// No period running: a take starts one at now.
    fresh: bool,
    /// The running period's start (now when fresh).
    s: i128,
    /// Tokens left in it.
    n: i128,
}

pub enum BurstFill {}

fn stored(store: &ModelStore, key: &str) -> Option<Stored> {
    match store.get(key) {
        Some(State::BurstFill(s)) => Some(*s),
        _ => None,
    }
}

impl Algo for BurstFill {
    type View = View;

    fn cap(r: &Params) -> i128 {
        r.limit
    }

    fn load(store: &ModelStore, key: &str, r: &Params, now: i128) -> View {
        match stored(store, key) {
            Some(h) if now < h.s + r.period => View {
                fresh: false,
                s: h.s,
                n: h.n,
            },
            _ => View {
                fresh: true,
                s: now,
                n: r.limit,
            },
        }
    }

    fn avail(st: &View, _r: &Params, _now: i128) -> i128 {
        st.n.max(0)
    }

    fn wait(st: &View, r: &Params, now: i128, _need: i128, _taken: i128) -> i128 {
        // need <= limit, and the next period starts full.
        st.s + r.period - now
    }

    fn left(st: &View, _r: &Params, _now: i128, n: i128) -> i128 {
        (st.n - n).max(0)
    }

    fn reset(st: &View, r: &Params, now: i128, n: i128) -> i128 {
        if st.fresh && n == 0 {
            0
        } else {
            st.s + r.period - now
        }
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
        let next = if st.fresh {
            Stored {
                s: now,
                n: r.limit - n,
            }
        } else {
            Stored {
                s: st.s,
                n: st.n - n,
            }
        };
        store.put(key, State::BurstFill(next));
    }

    fn refund(
        store: &mut ModelStore,
        key: &str,
        r: &Params,
        _at: i128,
        n: i128,
        _id: &str,
        _skip: i128,
        now: i128,
    ) {
        // `now` is the take's time: only the period it fell in gets units back.
        if let Some(h) = stored(store, key).filter(|h| h.s <= now && now < h.s + r.period) {
            // Every token back: the period is as if never opened (see
            // lua/burst_fill.lua).
            let n = r.limit.min(h.n + n);
            if n >= r.limit {
                store.remove(key);
            } else {
                store.put(key, State::BurstFill(Stored { s: h.s, n }));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use proptest::prelude::*;

    use super::super::tables::{all, check, drive, rule, upto, Step};
    use crate::limiter::{Algorithm, Mode};

    const S: i64 = 1_000_000;

    #[test]
    fn table() {
        // 3 per period of 1 s, the period starting at the first request.
        let r = rule(Algorithm::BurstFill, 3, Duration::from_secs(1), None);
        #[rustfmt::skip]
        let rows = [
            // row, at µs, step, cost, [status, granted, remaining, retry µs, reset µs, go delay µs]
            (1, 0, all(), 1, [1, 1, 2, 0, S, 0]),
            (2, 200_000, all(), 2, [1, 2, 0, 0, 800_000, 0]),
            (3, 300_000, all(), 1, [0, 0, 0, 700_000, 700_000, 0]),
            (4, S - 1, upto(), 3, [0, 0, 0, 1, 1, 0]),
            // Refilled to exactly 3 at 1 s: 5 units in (0.2 s, 1 s].
            (5, S, all(), 3, [1, 3, 0, 0, S, 0]),
            (6, S, all(), 4, [-1, 0, 0, 0, 0, 0]),
            (7, 5 * S, Step::Peek(Mode::UpTo), 2, [1, 2, 1, 0, S, 0]),
            // Refund at the take's time, in the take's period.
            (8, S, Step::Refund { skip: 0, call: 5 }, 2, [1, 2, 0, 0, 0, 0]),
            (9, 1_500_000, all(), 2, [1, 2, 0, 0, 500_000, 0]),
            // Units of an earlier period are not given to this one.
            (10, 200_000, Step::Refund { skip: 0, call: 2 }, 2, [1, 2, 0, 0, 0, 0]),
            (11, 1_500_000, Step::Peek(Mode::AllOrNothing), 1, [0, 0, 0, 500_000, 500_000, 0]),
            // Unused tokens do not carry over: a new period starts at 3 s.
            (12, 3 * S, all(), 1, [1, 1, 2, 0, S, 0]),
        ];
        check(&r, &rows);
    }

    #[test]
    fn period_of_50_us() {
        let r = rule(Algorithm::BurstFill, 2, Duration::from_micros(50), None);
        #[rustfmt::skip]
        let rows = [
            (1, 0, all(), 2, [1, 2, 0, 0, 50, 0]),
            (2, 49, all(), 1, [0, 0, 0, 1, 1, 0]),
            (3, 50, all(), 2, [1, 2, 0, 0, 50, 0]),
            (4, 60, upto(), 1, [0, 0, 0, 40, 40, 0]),
            (5, 100, upto(), 5, [1, 2, 0, 0, 50, 0]),
            (6, 149, Step::Peek(Mode::AllOrNothing), 1, [0, 0, 0, 1, 1, 0]),
        ];
        check(&r, &rows);
    }

    /// The documented weakness: 2 * count - 1 units within 2 µs around a refill.
    #[test]
    fn two_count_minus_one_pass_around_a_refill() {
        let count = 3;
        let r = rule(
            Algorithm::BurstFill,
            count,
            Duration::from_micros(1_000),
            None,
        );
        #[rustfmt::skip]
        let rows = [
            (1, 0, all(), 1, [1, 1, 2, 0, 1_000, 0]),
            (2, 999, all(), 2, [1, 2, 0, 0, 1, 0]),
            (3, 1_000, all(), 3, [1, 3, 0, 0, 1_000, 0]),
            (4, 1_000, all(), 1, [0, 0, 0, 1_000, 1_000, 0]),
        ];
        check(&r, &rows);
        let in_span: i64 = rows
            .iter()
            .filter(|row| row.1 >= 999)
            .map(|row| row.4[1])
            .sum();
        assert_eq!(
            in_span,
            2 * count as i64 - 1,
            "granted within [999, 1000] µs"
        );
    }

    proptest! {
        /// Any window of `period` (half-open) admits at most 2 * limit - 1.
        #[test]
        fn at_most_two_limit_minus_one_per_period(
            limit in 1u64..6,
            period in 50u64..2_000,
            calls in prop::collection::vec((0u64..400, 1u64..7, any::<bool>()), 1..80),
        ) {
            let r = rule(Algorithm::BurstFill, limit, Duration::from_micros(period), None);
            let admitted = drive(&r, &calls);
            for (j, last) in admitted.iter().enumerate() {
                let in_window: u64 = admitted[..=j]
                    .iter()
                    .filter(|a| a.at + period > last.at)
                    .map(|a| a.n)
                    .sum();
                prop_assert!(in_window < 2 * limit, "{in_window} admitted in ({}, {}]", last.at as i128 - period as i128, last.at);
            }
        }
    }
}
