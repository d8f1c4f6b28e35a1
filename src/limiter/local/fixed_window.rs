//! `lua/fixed_window.lua`: at most `limit` per window, windows aligned to
//! the epoch. The window start is stored, so a hit in a new window starts a
//! new count whatever the key's TTL.

use super::{fdiv, Algo, ModelStore, Params, State};

pub use super::state::FixedWindowStored as Stored;

#[derive(Debug, Clone, Copy)]
pub struct View {
    /// Start of the window `now` falls in.
    start: i128,
    /// No state for this window yet.
    fresh: bool,
    /// Count taken in this window.
    n: i128,
}

pub enum FixedWindow {}

fn stored(store: &ModelStore, key: &str) -> Option<Stored> {
    match store.get(key) {
        Some(State::FixedWindow(s)) => Some(*s),
        _ => None,
    }
}

impl Algo for FixedWindow {
    type View = View;

    fn cap(r: &Params) -> i128 {
        r.limit
    }

    fn load(store: &ModelStore, key: &str, r: &Params, now: i128) -> View {
        let start = fdiv(now, r.period) * r.period;
        let h = stored(store, key);
        let fresh = h.map_or(-1, |h| h.w) != start;
        View {
            start,
            fresh,
            n: match h {
                Some(h) if !fresh => h.n,
                _ => 0,
            },
        }
    }

    fn avail(st: &View, r: &Params, _now: i128) -> i128 {
        (r.limit - st.n).max(0)
    }

    fn wait(st: &View, r: &Params, now: i128, _need: i128, _taken: i128) -> i128 {
        // need <= limit, and the next window starts empty.
        st.start + r.period - now
    }

    fn left(st: &View, r: &Params, _now: i128, n: i128) -> i128 {
        (r.limit - st.n - n).max(0)
    }

    fn reset(st: &View, r: &Params, now: i128, n: i128) -> i128 {
        if st.n + n > 0 {
            st.start + r.period - now
        } else {
            0
        }
    }

    fn take(
        store: &mut ModelStore,
        key: &str,
        st: &View,
        _r: &Params,
        _now: i128,
        n: i128,
        _id: &str,
    ) {
        let n = if st.fresh { n } else { st.n + n };
        store.put(key, State::FixedWindow(Stored { w: st.start, n }));
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
        let start = fdiv(now, r.period) * r.period;
        if let Some(h) = stored(store, key).filter(|h| h.w == start) {
            let n = (h.n - n).max(0);
            store.put(key, State::FixedWindow(Stored { w: h.w, n }));
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use proptest::prelude::*;

    use super::super::tables::{all, check, drive, rule, upto, Step, T0};
    use crate::limiter::{Algorithm, Mode};

    const S: i64 = 1_000_000;

    #[test]
    fn table() {
        // 3 per second, windows aligned to whole seconds.
        let r = rule(Algorithm::FixedWindow, 3, Duration::from_secs(1), None);
        #[rustfmt::skip]
        let rows = [
            // row, at µs, step, cost, [status, granted, remaining, retry µs, reset µs, go delay µs]
            (1, 0, all(), 1, [1, 1, 2, 0, S, 0]),
            (2, 100, all(), 2, [1, 2, 0, 0, S - 100, 0]),
            (3, 250_000, all(), 1, [0, 0, 0, S - 250_000, S - 250_000, 0]),
            // The next window starts empty: exactly at its start the request passes.
            (4, S - 1, all(), 1, [0, 0, 0, 1, 1, 0]),
            (5, S, all(), 1, [1, 1, 2, 0, S, 0]),
            // Never: cost above the limit.
            (6, S + 1, all(), 4, [-1, 0, 0, 0, 0, 0]),
            // Up to: 2 of 5 left in this window.
            (7, S + 2, upto(), 5, [1, 2, 0, 0, S - 2, 0]),
            (8, S + 3, upto(), 5, [0, 0, 0, S - 3, S - 3, 0]),
            // Dry run reports, writes nothing.
            (9, 2 * S, Step::Peek(Mode::AllOrNothing), 3, [1, 3, 0, 0, S, 0]),
            (10, 2 * S, all(), 3, [1, 3, 0, 0, S, 0]),
            // A refund, at the time of its take, gives the units back.
            (11, 2 * S, Step::Refund { skip: 0, call: 10 }, 2, [1, 2, 0, 0, 0, 0]),
            (12, 2 * S + 5, all(), 2, [1, 2, 0, 0, S - 5, 0]),
            (13, 2 * S + 5, Step::Refund { skip: 0, call: 12 }, 2, [1, 2, 0, 0, 0, 0]),
            (14, 2 * S + 6, Step::Peek(Mode::AllOrNothing), 3, [0, 0, 2, S - 6, S - 6, 0]),
            // Units taken in a window that is over are not given to this one.
            (15, S + 2, Step::Refund { skip: 0, call: 7 }, 2, [1, 2, 0, 0, 0, 0]),
            (16, 2 * S + 7, Step::Peek(Mode::AllOrNothing), 3, [0, 0, 2, S - 7, S - 7, 0]),
            // Idle windows read as fresh.
            (17, 10 * S, Step::Peek(Mode::UpTo), 9, [1, 3, 0, 0, S, 0]),
        ];
        check(&r, &rows);
    }

    proptest! {
        /// Every aligned window admits at most `limit`, and every refusal's
        /// retry-after is exact.
        #[test]
        fn at_most_limit_per_aligned_window(
            limit in 1u64..6,
            period in 50u64..2_000,
            calls in prop::collection::vec((0u64..400, 1u64..7, any::<bool>()), 1..80),
        ) {
            let r = rule(Algorithm::FixedWindow, limit, Duration::from_micros(period), None);
            let mut per_window = std::collections::BTreeMap::new();
            for a in drive(&r, &calls) {
                *per_window.entry((T0 + a.at) / period).or_insert(0) += a.n;
            }
            for (w, n) in per_window {
                prop_assert!(n <= limit, "window {w}: {n} admitted > limit {limit}");
            }
        }
    }
}
