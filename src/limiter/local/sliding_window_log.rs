//! `lua/sliding_window_log.lua`: at most `limit` admissions in any window of
//! `period` ending now, i.e. with score in `(now - period, now]`. One sorted
//! set member per admitted unit, named `<call id>:<unit>` (1-based), so two
//! admissions in the same µs never collapse. Refused calls are not logged.

use super::{Algo, ModelStore, Params, State};

pub use super::state::Log;

#[derive(Debug, Clone)]
pub struct View {
    /// Scores in `(now - period, +inf)`, ascending: the live entries. The
    /// script reads the k-th of them in `wait`; no write comes between.
    live: Vec<i128>,
}

pub enum SlidingWindowLog {}

fn log_mut<'a>(store: &'a mut ModelStore, key: &str) -> Option<&'a mut Log> {
    match store.get_mut(key) {
        Some(State::SlidingWindowLog(log)) => Some(log),
        _ => None,
    }
}

impl Algo for SlidingWindowLog {
    type View = View;

    fn cap(r: &Params) -> i128 {
        r.limit
    }

    fn load(store: &ModelStore, key: &str, r: &Params, now: i128) -> View {
        let live = match store.get(key) {
            Some(State::SlidingWindowLog(log)) => log.scores_above(now - r.period).collect(),
            _ => Vec::new(),
        };
        View { live }
    }

    fn avail(st: &View, r: &Params, _now: i128) -> i128 {
        (r.limit - st.live.len() as i128).max(0)
    }

    fn wait(st: &View, r: &Params, now: i128, need: i128, taken: i128) -> i128 {
        // The k-th oldest live entry must leave the window: it does at score + period.
        let k = st.live.len() as i128 + taken + need - r.limit;
        match st.live.get((k - 1) as usize) {
            Some(score) => score + r.period - now,
            // One of the `taken` entries, written now.
            None => r.period,
        }
    }

    fn left(st: &View, r: &Params, _now: i128, n: i128) -> i128 {
        (r.limit - st.live.len() as i128 - n).max(0)
    }

    fn reset(st: &View, r: &Params, now: i128, n: i128) -> i128 {
        if n > 0 {
            return r.period;
        }
        match st.live.last() {
            Some(newest) => newest + r.period - now,
            None => 0,
        }
    }

    fn take(
        store: &mut ModelStore,
        key: &str,
        _st: &View,
        r: &Params,
        now: i128,
        n: i128,
        id: &str,
    ) {
        let mut log = match store.get(key) {
            Some(State::SlidingWindowLog(log)) => log.clone(),
            _ => Log::default(),
        };
        log.remove_up_to(now - r.period);
        for u in 1..=n {
            log.add(now, format!("{id}:{u}"));
        }
        // Redis deletes a sorted set that becomes empty (only when n = 0).
        if log.is_empty() {
            store.remove(key);
        } else {
            store.put(key, State::SlidingWindowLog(log));
        }
    }

    /// Up to `n` entries written at `taken`, whichever call wrote them
    /// (the script's log names no calls).
    fn refund(
        store: &mut ModelStore,
        key: &str,
        _r: &Params,
        _at: i128,
        n: i128,
        _id: &str,
        _skip: i128,
        taken: i128,
    ) {
        let Some(log) = log_mut(store, key) else {
            return;
        };
        log.remove_at(taken, n);
        if log.is_empty() {
            // The script writes the log back empty: its `fp` stays.
            store.empty(key);
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
        // 3 per any second.
        let r = rule(Algorithm::SlidingWindowLog, 3, Duration::from_secs(1), None);
        #[rustfmt::skip]
        let rows = [
            // row, at µs, step, cost, [status, granted, remaining, retry µs, reset µs, go delay µs]
            (1, 0, all(), 1, [1, 1, 2, 0, S, 0]),
            // Two hits in the same µs are two entries.
            (2, 400_000, all(), 1, [1, 1, 1, 0, S, 0]),
            (3, 400_000, all(), 1, [1, 1, 0, 0, S, 0]),
            // Full: the oldest entry (t=0) leaves at t=1s.
            (4, 500_000, all(), 1, [0, 0, 0, 500_000, 900_000, 0]),
            (5, S - 1, all(), 1, [0, 0, 0, 1, 400_001, 0]),
            (6, S, all(), 1, [1, 1, 0, 0, S, 0]),
            // Two at once must wait for both t=0.4s entries.
            (7, S + 1, all(), 2, [0, 0, 0, 399_999, S - 1, 0]),
            (8, S + 1, all(), 4, [-1, 0, 0, 0, 0, 0]),
            // Up to: waits for one slot, then takes what there is.
            (9, S + 1, upto(), 2, [0, 0, 0, 399_999, S - 1, 0]),
            (10, 1_400_000, upto(), 5, [1, 2, 0, 0, S, 0]),
            // Dry run.
            (11, 3 * S, Step::Peek(Mode::AllOrNothing), 3, [1, 3, 0, 0, S, 0]),
            (12, 3 * S, Step::Peek(Mode::AllOrNothing), 3, [1, 3, 0, 0, S, 0]),
            // Refund one of row 10's two units.
            (13, 1_400_000, Step::Refund { skip: 1, call: 10 }, 1, [1, 1, 0, 0, 0, 0]),
            (14, 1_500_000, all(), 1, [1, 1, 0, 0, S, 0]),
            (15, 1_500_001, all(), 1, [0, 0, 0, 499_999, S - 1, 0]),
            // The log names no calls: entries of the take's instant are
            // interchangeable, so a second refund of row 10 takes its other
            // entry at 1.4 s (the limiter refunds a call once).
            (16, 1_400_000, Step::Refund { skip: 1, call: 10 }, 1, [1, 1, 0, 0, 0, 0]),
            (17, 1_500_002, Step::Peek(Mode::UpTo), 1, [1, 1, 0, 0, S, 0]),
        ];
        check(&r, &rows);
    }

    proptest! {
        /// Any window of `period` holds at most `limit` admitted units, and
        /// every refusal's retry-after is exact.
        #[test]
        fn at_most_limit_in_any_sliding_window(
            limit in 1u64..6,
            period in 50u64..2_000,
            calls in prop::collection::vec((0u64..400, 1u64..7, any::<bool>()), 1..80),
        ) {
            let r = rule(Algorithm::SlidingWindowLog, limit, Duration::from_micros(period), None);
            let admitted = drive(&r, &calls);
            for (j, last) in admitted.iter().enumerate() {
                let in_window: u64 = admitted[..=j]
                    .iter()
                    .filter(|a| a.at + period > last.at)
                    .map(|a| a.n)
                    .sum();
                prop_assert!(in_window <= limit, "{in_window} admitted in ({}, {}]", last.at as i128 - period as i128, last.at);
            }
        }
    }
}
