//! The demo's proof: did every seller stay within its rule at the
//! downstream, and did every job end somewhere?
//!
//! Limits are checked on the stub's clock, from the arrival of every call
//! (a 429'd call too: each call was granted by the limiter). A grant and
//! its call's arrival are a few ms apart, and not always the same few ms,
//! so the check allows [`SLACK`] between them: a window rule is checked over
//! windows of `period - SLACK`, a bucket rule over any span `t` against
//! `burst + rate × (t + SLACK)`.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use crate::config::RuleConfig;
use crate::dev::stub::JobStats;

/// Allowed between a grant (Redis' clock) and its call's arrival at the
/// stub (the stub's clock): scheduling on a busy two-core machine included.
pub const SLACK: Duration = Duration::from_millis(200);

/// The busiest stretch of one seller's calls, against what its rule allows
/// there.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Busiest {
    /// Calls in the stretch.
    pub calls: usize,
    /// Its length: the window checked (window rules), or from its first
    /// call to its last (bucket rules).
    pub span: Duration,
    /// What the rule allows in it.
    pub allowed: u64,
    /// `true` for a window rule (`calls` in any window of `span`).
    pub window: bool,
}

impl Busiest {
    pub fn held(&self) -> bool {
        self.calls as u64 <= self.allowed
    }

    /// `"36 in any 0.8 s"` or `"231 in 1.24 s"`.
    pub fn describe(&self) -> String {
        if self.window {
            format!("{} in any {:.1} s", self.calls, self.span.as_secs_f64())
        } else {
            format!("{} in {:.2} s", self.calls, self.span.as_secs_f64())
        }
    }
}

/// Why a seller's calls could not be checked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CheckError {
    #[error(
        "no check for algorithm {0:?} (the demo uses sliding_window_log, token_bucket and gcra)"
    )]
    Algorithm(String),
    #[error("period {0:?} is not longer than the {SLACK:?} allowed from grant to arrival")]
    PeriodTooShort(Duration),
}

/// The busiest stretch of `arrivals_us` (µs; the stub records them in
/// order, others are sorted here) under `rule`.
pub fn busiest(rule: &RuleConfig, arrivals_us: &[u64]) -> Result<Busiest, CheckError> {
    let sorted;
    let arrivals_us = if arrivals_us.is_sorted() {
        arrivals_us
    } else {
        sorted = {
            let mut v = arrivals_us.to_vec();
            v.sort_unstable();
            v
        };
        &sorted
    };
    match rule.algorithm.as_str() {
        "sliding_window_log" => {
            let window = rule
                .period
                .checked_sub(SLACK)
                .filter(|w| !w.is_zero())
                .ok_or(CheckError::PeriodTooShort(rule.period))?;
            Ok(Busiest {
                calls: most_in_window(arrivals_us, window.as_micros() as u64),
                span: window,
                allowed: rule.limit,
                window: true,
            })
        }
        "token_bucket" | "gcra" => Ok(bucket(rule, arrivals_us)),
        other => Err(CheckError::Algorithm(other.to_owned())),
    }
}

/// The most arrivals within any half-open window of `window_us`.
fn most_in_window(arrivals_us: &[u64], window_us: u64) -> usize {
    let mut best = 0;
    let mut lo = 0;
    for hi in 0..arrivals_us.len() {
        while arrivals_us[hi] - arrivals_us[lo] >= window_us {
            lo += 1;
        }
        best = best.max(hi - lo + 1);
    }
    best
}

/// A bucket of `burst` refilled at `rate` admits at most `burst + rate·t`
/// in any span `t`. The stretch that comes closest to (or beyond) that is
/// the one with the most calls above `rate·t`: with `f(k) = k - rate·t_k`,
/// calls `i..=j` exceed the rate by `f(j) - f(i) + 1`, the largest for the
/// smallest `f(i)` before `j`, so one pass finds it.
fn bucket(rule: &RuleConfig, arrivals_us: &[u64]) -> Busiest {
    let burst = rule.burst.unwrap_or(rule.limit) as f64;
    let rate_per_us = rule.limit as f64 / rule.period.as_micros() as f64;
    let f = |k: usize| k as f64 - rate_per_us * arrivals_us[k] as f64;
    let mut best: Option<(f64, usize, usize)> = None;
    let mut low = 0usize;
    for j in 0..arrivals_us.len() {
        // 1e-9: float error must not move the start of a stretch held
        // exactly at the rate.
        if f(j) < f(low) - 1e-9 {
            low = j;
        }
        let excess = f(j) - f(low) + 1.0;
        // Among (near) ties the longest stretch: "45 in 4 s" says more
        // than "5 in 0 s" about a seller held at its rate.
        if best.is_none_or(|(b, _, _)| excess > b - 1e-9) {
            best = Some((excess, low, j));
        }
    }
    let slack_units = rate_per_us * SLACK.as_micros() as f64;
    match best {
        None => Busiest {
            calls: 0,
            span: Duration::ZERO,
            allowed: (burst + slack_units).floor() as u64,
            window: false,
        },
        Some((_, i, j)) => {
            let span_us = arrivals_us[j] - arrivals_us[i];
            Busiest {
                calls: j - i + 1,
                span: Duration::from_micros(span_us),
                // The epsilon keeps an exact integer from flooring below
                // itself through float error.
                allowed: (burst + rate_per_us * span_us as f64 + slack_units + 1e-9).floor() as u64,
                window: false,
            }
        }
    }
}

/// Where every produced job ended.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Accounting {
    pub produced: u64,
    /// Accepted (200) by the stub at least once.
    pub done: usize,
    /// On the dead-letter topic (and never accepted).
    pub dead: usize,
    /// Accepted more than once (at-least-once: a call in flight at a
    /// rebalance is made again by the new owner).
    pub repeated: usize,
    /// Neither accepted nor dead-lettered: lost. The first few ids.
    pub missing: Vec<String>,
    pub missing_count: usize,
}

/// Accounts for job ids `ids` against the stub's jobs and the dead
/// letters' job ids.
pub fn account(
    ids: impl IntoIterator<Item = String>,
    stub_jobs: &HashMap<String, JobStats>,
    dead_letters: &HashMap<String, usize>,
) -> Accounting {
    let mut a = Accounting::default();
    for id in ids {
        a.produced += 1;
        match stub_jobs.get(&id) {
            Some(j) if j.accepted > 0 => {
                a.done += 1;
                if j.accepted > 1 {
                    a.repeated += 1;
                }
            }
            _ if dead_letters.contains_key(&id) => a.dead += 1,
            _ => {
                a.missing_count += 1;
                if a.missing.len() < 5 {
                    a.missing.push(id);
                }
            }
        }
    }
    a
}

/// One seller's line of the summary.
#[derive(Debug, Clone)]
pub struct SellerVerdict {
    pub seller: String,
    pub result: Result<Busiest, CheckError>,
}

/// Sellers whose busiest stretch went over their rule, or could not be
/// checked, as lines naming the cause.
pub fn limit_failures(verdicts: &[SellerVerdict], rules: &BTreeMap<String, String>) -> Vec<String> {
    verdicts
        .iter()
        .filter_map(|v| match &v.result {
            Ok(b) if b.held() => None,
            Ok(b) => Some(format!(
                "{} went over its limit ({}): {} at the stub, its rule allows {} there",
                v.seller,
                rules.get(&v.seller).map_or("?", String::as_str),
                b.describe(),
                b.allowed
            )),
            Err(e) => Some(format!("{}: not checked: {e}", v.seller)),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(algorithm: &str, limit: u64, period_ms: u64, burst: Option<u64>) -> RuleConfig {
        RuleConfig {
            algorithm: algorithm.into(),
            limit,
            period: Duration::from_millis(period_ms),
            burst,
            shadow: false,
        }
    }

    /// `n` arrivals `gap_ms` apart from `start_ms`, in µs.
    fn even(start_ms: u64, n: u64, gap_ms: u64) -> Vec<u64> {
        (0..n).map(|i| (start_ms + i * gap_ms) * 1000).collect()
    }

    #[test]
    fn window_rules_count_the_busiest_window() {
        let r = rule("sliding_window_log", 10, 1000, None);
        // 10 per second, evenly: at most 8 in any 0.8 s.
        let b = busiest(&r, &even(0, 50, 100)).unwrap();
        assert_eq!((b.calls, b.allowed, b.window), (8, 10, true));
        assert!(b.held());
        assert_eq!(b.describe(), "8 in any 0.8 s");
        // 11 in 0.5 s somewhere: over.
        let mut a = even(0, 20, 100);
        a.extend(even(5000, 11, 50));
        let b = busiest(&r, &a).unwrap();
        assert_eq!(b.calls, 11);
        assert!(!b.held());
        assert_eq!(
            busiest(&rule("sliding_window_log", 1, 200, None), &a),
            Err(CheckError::PeriodTooShort(Duration::from_millis(200)))
        );
        assert_eq!(
            busiest(&rule("fixed_window", 1, 1000, None), &a),
            Err(CheckError::Algorithm("fixed_window".into()))
        );
    }

    #[test]
    fn bucket_rules_allow_burst_plus_rate() {
        // 10/s, burst 5: 5 at once, then one every 100 ms is exactly the
        // rule's pace.
        let r = rule("gcra", 10, 1000, Some(5));
        let mut a = vec![0; 5];
        a.extend(even(100, 40, 100));
        let b = busiest(&r, &a).unwrap();
        assert!(b.held(), "{b:?}");
        // The burst plus 40 at the rate over 4 s, and 2 units of slack.
        assert_eq!(b.calls, 45);
        assert_eq!(b.span, Duration::from_secs(4));
        assert_eq!(b.allowed, 5 + 40 + 2);
        // Twice the calls (a leak, or a stub that counts twice): over.
        let mut twice: Vec<u64> = a.iter().flat_map(|t| [*t, *t]).collect();
        twice.sort();
        let b = busiest(&r, &twice).unwrap();
        assert!(!b.held(), "{b:?}");
        assert_eq!(b.calls, 90);
        // Out of order (as from another source): sorted first.
        let b = busiest(&r, &[300_000, 0, 100_000, 200_000]).unwrap();
        assert_eq!((b.calls, b.span), (4, Duration::from_millis(300)));
        // A burst of 8 at once against a burst of 5 (+2 slack): over by one.
        let b = busiest(&r, &[0; 8]).unwrap();
        assert_eq!((b.calls, b.allowed), (8, 7));
        // token_bucket reads the same; no burst means burst = limit.
        let b = busiest(&rule("token_bucket", 10, 1000, None), &[0; 12]).unwrap();
        assert_eq!((b.calls, b.allowed), (12, 12));
        let b = busiest(&rule("token_bucket", 10, 1000, None), &[]).unwrap();
        assert_eq!((b.calls, b.allowed), (0, 12));
    }

    #[test]
    fn every_job_is_done_dead_or_missing() {
        let ids: Vec<String> = (0..6).map(|i| format!("r-{i}")).collect();
        let stub: HashMap<String, JobStats> = [
            ("r-0", 1, 1),
            ("r-1", 3, 2),
            // Only throttled, never accepted, not dead-lettered: lost.
            ("r-2", 1, 0),
        ]
        .into_iter()
        .map(|(k, calls, accepted)| (k.to_owned(), JobStats { calls, accepted }))
        .collect();
        let dead: HashMap<String, usize> = [("r-3".to_owned(), 1)].into();
        let a = account(ids, &stub, &dead);
        assert_eq!(
            a,
            Accounting {
                produced: 6,
                done: 2,
                dead: 1,
                repeated: 1,
                missing: vec!["r-2".into(), "r-4".into(), "r-5".into()],
                missing_count: 3,
            }
        );
    }

    #[test]
    fn failures_name_the_seller_and_the_numbers() {
        let over = SellerVerdict {
            seller: "seller-1".into(),
            result: Ok(Busiest {
                calls: 20,
                span: Duration::from_millis(800),
                allowed: 10,
                window: true,
            }),
        };
        let fine = SellerVerdict {
            seller: "seller-2".into(),
            result: busiest(&rule("gcra", 10, 1000, None), &[]),
        };
        let rules = [("seller-1".to_owned(), "sliding_window_log 10/1s".to_owned())].into();
        let f = limit_failures(&[over, fine], &rules);
        assert_eq!(
            f,
            vec!["seller-1 went over its limit (sliding_window_log 10/1s): 20 in any 0.8 s at the stub, its rule allows 10 there"]
        );
    }
}
