//! `lua/sliding_window_counter.lua`: the previous window's count weighted by
//! how much of it still overlaps the sliding window, plus the current
//! window's. Admits n when
//! `prev * (period - elapsed) + (cur + n) * period <= limit * period`.
//! Approximate by design: it assumes the previous window's hits were spread
//! evenly.

use super::{fdiv, Algo, ModelStore, Params, State};

pub use super::state::SlidingWindowCounterStored as Stored;

#[derive(Debug, Clone, Copy)]
pub struct View {
    /// Start of the window `now` falls in.
    start: i128,
    /// The stored window start, -1 for no state.
    w: i128,
    cur: i128,
    prev: i128,
    /// µs elapsed in the current window.
    e: i128,
}

pub enum SlidingWindowCounter {}

fn stored(store: &ModelStore, key: &str) -> Option<Stored> {
    match store.get(key) {
        Some(State::SlidingWindowCounter(s)) => Some(*s),
        _ => None,
    }
}

/// Units the weighted window has room for, before `cur`.
fn room(st: &View, r: &Params) -> i128 {
    fdiv(r.limit * r.period - st.prev * (r.period - st.e), r.period)
}

impl Algo for SlidingWindowCounter {
    type View = View;

    fn cap(r: &Params) -> i128 {
        r.limit
    }

    fn load(store: &ModelStore, key: &str, r: &Params, now: i128) -> View {
        let start = fdiv(now, r.period) * r.period;
        let h = stored(store, key);
        let w = h.map_or(-1, |h| h.w);
        let (cur, prev) = match h {
            Some(h) if w == start => (h.cur, h.prev),
            Some(h) if w == start - r.period => (0, h.cur),
            _ => (0, 0),
        };
        View {
            start,
            w,
            cur,
            prev,
            e: now - start,
        }
    }

    fn avail(st: &View, r: &Params, _now: i128) -> i128 {
        (room(st, r) - st.cur).max(0)
    }

    fn wait(st: &View, r: &Params, now: i128, need: i128, taken: i128) -> i128 {
        let cur = st.cur + taken;
        if cur + need <= r.limit {
            // Within this window, once enough of the previous window has
            // slid out (prev > 0 here, or avail would be enough).
            let e = r.period - fdiv((r.limit - cur - need) * r.period, st.prev);
            return e - st.e;
        }
        // In the next window, where this window's count is the weighted one
        // (cur > 0 here since need <= limit).
        let e = r.period - fdiv((r.limit - need) * r.period, cur);
        st.start + r.period + e - now
    }

    fn left(st: &View, r: &Params, _now: i128, n: i128) -> i128 {
        (room(st, r) - st.cur - n).max(0)
    }

    fn reset(st: &View, r: &Params, now: i128, n: i128) -> i128 {
        if st.cur + n > 0 {
            st.start + 2 * r.period - now
        } else if st.prev > 0 {
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
        let next = if st.w == st.start {
            Stored {
                w: st.w,
                cur: st.cur + n,
                prev: st.prev,
            }
        } else {
            Stored {
                w: st.start,
                cur: n,
                prev: st.prev,
            }
        };
        store.put(key, State::SlidingWindowCounter(next));
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
        // `now` is the take's time: its window is either the stored one
        // (`cur`) or the one before it (`prev`).
        let start = fdiv(now, r.period) * r.period;
        let Some(mut h) = stored(store, key) else {
            return;
        };
        if h.w == start {
            h.cur = (h.cur - n).max(0);
        } else if h.w == start + r.period {
            h.prev = (h.prev - n).max(0);
        } else {
            return;
        }
        store.put(key, State::SlidingWindowCounter(h));
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::super::tables::{all, check, rule, upto, Step};
    use crate::limiter::{Algorithm, Mode};

    const S: i64 = 1_000_000;

    #[test]
    fn table() {
        // 4 per second, weighted over the previous window.
        let r = rule(
            Algorithm::SlidingWindowCounter,
            4,
            Duration::from_secs(1),
            None,
        );
        let peek = Step::Peek(Mode::AllOrNothing);
        #[rustfmt::skip]
        let rows = [
            // row, at µs, step, cost, [status, granted, remaining, retry µs, reset µs, go delay µs]
            (1, 0, all(), 2, [1, 2, 2, 0, 2 * S, 0]),
            (2, 500_000, all(), 2, [1, 2, 0, 0, 1_500_000, 0]),
            // Full: in the next window 4 * (S - e) <= 3 * S from e = 0.25 s.
            (3, 600_000, all(), 1, [0, 0, 0, 650_000, 1_400_000, 0]),
            (4, 1_250_000, all(), 1, [1, 1, 0, 0, 1_750_000, 0]),
            // Within the window: 4 * (S - e) + 3 * S <= 4 * S from e = 0.75 s.
            (5, 1_500_000, all(), 2, [0, 0, 1, 250_000, 1_500_000, 0]),
            (6, 1_500_000, all(), 5, [-1, 0, 0, 0, 0, 0]),
            (7, 1_500_000, upto(), 3, [1, 1, 0, 0, 1_500_000, 0]),
            // Two windows on, the state reads as empty.
            (8, 3 * S + 10, Step::Peek(Mode::UpTo), 9, [1, 4, 0, 0, 2 * S - 10, 0]),
            // Refund at the take's time, in the take's window.
            (9, 1_500_000, Step::Refund { skip: 0, call: 7 }, 1, [1, 1, 0, 0, 0, 0]),
            // Window 1 s held 1 unit: prev = 1 weighs 0.9 at e = 0.1 s.
            (10, 2_100_000, peek, 1, [1, 1, 2, 0, 1_900_000, 0]),
            // Only prev is set: reset is the end of this window.
            (11, 2_100_000, peek, 4, [0, 0, 3, 900_000, 900_000, 0]),
            (12, 2_100_000, all(), 3, [1, 3, 0, 0, 1_900_000, 0]),
            // Refund of row 4's unit, taken in the window now counted as prev.
            (13, 1_250_000, Step::Refund { skip: 0, call: 4 }, 1, [1, 1, 0, 0, 0, 0]),
            (14, 2_100_001, peek, 1, [1, 1, 0, 0, 1_899_999, 0]),
            // Next window: 3 * (S - e) + 2 * S <= 4 * S from e = 333_334.
            (15, 2_100_001, peek, 2, [0, 0, 1, 1_233_333, 1_899_999, 0]),
        ];
        check(&r, &rows);
    }
}
