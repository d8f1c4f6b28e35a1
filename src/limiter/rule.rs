//! A validated rate-limit rule: algorithm, sustained rate and bucket size.
//!
//! A [`Rule`] can only be built through [`Rule::new`], which rejects every
//! configuration that would make a script divide by zero, never admit, or run
//! below the clock resolution we promise (50 µs). After that a rule is always
//! sound, so nothing downstream re-validates.

use std::fmt;
use std::num::NonZeroU64;
use std::str::FromStr;
use std::time::Duration;

/// The shortest period any algorithm accepts. The scripts work in whole
/// microseconds; below 50 µs the Redis round trip alone is longer than the
/// period and the rule means nothing.
pub const MIN_PERIOD: Duration = Duration::from_micros(50);

/// Every algorithm the limiter implements; each has one script in `lua/`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Algorithm {
    FixedWindow,
    SlidingWindowLog,
    SlidingWindowCounter,
    TokenBucket,
    LeakyBucket,
    BurstFill,
    Gcra,
}

impl Algorithm {
    pub const ALL: [Algorithm; 7] = [
        Algorithm::FixedWindow,
        Algorithm::SlidingWindowLog,
        Algorithm::SlidingWindowCounter,
        Algorithm::TokenBucket,
        Algorithm::LeakyBucket,
        Algorithm::BurstFill,
        Algorithm::Gcra,
    ];

    /// The name used in config files and inside the Lua scripts.
    pub fn name(self) -> &'static str {
        match self {
            Algorithm::FixedWindow => "fixed_window",
            Algorithm::SlidingWindowLog => "sliding_window_log",
            Algorithm::SlidingWindowCounter => "sliding_window_counter",
            Algorithm::TokenBucket => "token_bucket",
            Algorithm::LeakyBucket => "leaky_bucket",
            Algorithm::BurstFill => "burst_fill",
            Algorithm::Gcra => "gcra",
        }
    }

    /// Whether `burst` changes this algorithm's behaviour. For the window
    /// algorithms and burst_fill the bucket size is `limit` by definition.
    pub fn uses_burst(self) -> bool {
        matches!(
            self,
            Algorithm::TokenBucket | Algorithm::LeakyBucket | Algorithm::Gcra
        )
    }
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The error for an algorithm name no script implements.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown algorithm {0:?}; expected one of fixed_window, sliding_window_log, sliding_window_counter, token_bucket, leaky_bucket, burst_fill, gcra")]
pub struct UnknownAlgorithm(pub String);

impl FromStr for Algorithm {
    type Err = UnknownAlgorithm;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Algorithm::ALL
            .into_iter()
            .find(|a| a.name() == s)
            .ok_or_else(|| UnknownAlgorithm(s.to_owned()))
    }
}

/// Why a rule could not be built. Config loading adds the file and key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RuleError {
    #[error("limit must be at least 1")]
    ZeroLimit,
    #[error("burst must be at least 1")]
    ZeroBurst,
    #[error("period {0:?} is below the minimum of 50µs")]
    PeriodTooShort(Duration),
    #[error("period {0:?} is longer than the maximum of 366 days")]
    PeriodTooLong(Duration),
    #[error("burst is only meaningful for token_bucket, leaky_bucket and gcra, not {0}")]
    BurstNotSupported(Algorithm),
    #[error("limit {limit} per {period_us}µs is more than one admission per microsecond, which the scripts cannot pace; use a longer period")]
    RateTooHigh { limit: u64, period_us: u64 },
    #[error("limit {0} is above the maximum of 1000000000")]
    LimitTooLarge(u64),
    #[error("sliding_window_log keeps one entry per admission, so a limit of {0} would keep that many entries per seller in Redis; the maximum is 10000 (use sliding_window_counter or gcra for larger limits)")]
    LogTooLong(u64),
    #[error("{units} × {period_us}µs exceeds 2^53, the range in which the scripts' arithmetic is exact; use a shorter period with a proportionally smaller limit")]
    TooPrecise { units: u64, period_us: u64 },
}

/// The longest period a rule may have. Keeps every microsecond product in
/// the scripts well inside the 2^53 range where Lua's doubles are exact.
pub const MAX_PERIOD: Duration = Duration::from_secs(366 * 24 * 3600);

/// The largest `limit` or `burst`; same reason as [`MAX_PERIOD`].
pub const MAX_LIMIT: u64 = 1_000_000_000;

/// The largest sliding_window_log limit: its state is one sorted-set entry
/// per admission in the window (about 37 bytes each).
pub const MAX_LOG_LIMIT: u64 = 10_000;

/// One validated rule: at most `limit` per `period` sustained, with a bucket
/// (or pacer queue) of `burst`.
///
/// ```
/// use std::num::NonZeroU64;
/// use std::time::Duration;
/// use throttle_worker::limiter::{Algorithm, Rule};
///
/// let rule = Rule::new(Algorithm::Gcra, 10, Duration::from_secs(1), Some(5)).unwrap();
/// assert_eq!(rule.burst(), NonZeroU64::new(5).unwrap());
/// assert!(Rule::new(Algorithm::Gcra, 0, Duration::from_secs(1), None).is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Rule {
    algorithm: Algorithm,
    /// Admissions per `period`; 1..=MAX_LIMIT.
    limit: NonZeroU64,
    /// In whole microseconds, MIN_PERIOD..=MAX_PERIOD.
    period_us: NonZeroU64,
    /// Bucket size; equals `limit` for algorithms that do not use burst.
    burst: NonZeroU64,
}

impl Rule {
    /// Builds a rule, or says what is wrong with it. `burst` defaults to `limit`.
    pub fn new(
        algorithm: Algorithm,
        limit: u64,
        period: Duration,
        burst: Option<u64>,
    ) -> Result<Rule, RuleError> {
        let limit_nz = NonZeroU64::new(limit).ok_or(RuleError::ZeroLimit)?;
        if limit > MAX_LIMIT {
            return Err(RuleError::LimitTooLarge(limit));
        }
        if algorithm == Algorithm::SlidingWindowLog && limit > MAX_LOG_LIMIT {
            return Err(RuleError::LogTooLong(limit));
        }
        if period < MIN_PERIOD {
            return Err(RuleError::PeriodTooShort(period));
        }
        if period > MAX_PERIOD {
            return Err(RuleError::PeriodTooLong(period));
        }
        // Sub-microsecond remainders are dropped: the scripts count in µs.
        let period_us = period.as_micros() as u64;
        if limit > period_us {
            return Err(RuleError::RateTooHigh { limit, period_us });
        }
        let burst = match burst {
            None => limit_nz,
            Some(_) if !algorithm.uses_burst() => {
                return Err(RuleError::BurstNotSupported(algorithm))
            }
            Some(b) if b > MAX_LIMIT => return Err(RuleError::LimitTooLarge(b)),
            Some(b) => NonZeroU64::new(b).ok_or(RuleError::ZeroBurst)?,
        };
        // Every script multiplies units by the period in µs; Lua's doubles
        // are exact only below 2^53.
        let units = limit.max(burst.get());
        if u128::from(units) * u128::from(period_us) >= 1u128 << 53 {
            return Err(RuleError::TooPrecise { units, period_us });
        }
        Ok(Rule {
            algorithm,
            limit: limit_nz,
            period_us: NonZeroU64::new(period_us).expect("period >= MIN_PERIOD > 0"),
            burst,
        })
    }

    pub fn algorithm(&self) -> Algorithm {
        self.algorithm
    }

    pub fn limit(&self) -> NonZeroU64 {
        self.limit
    }

    pub fn period(&self) -> Duration {
        Duration::from_micros(self.period_us.get())
    }

    pub fn period_us(&self) -> u64 {
        self.period_us.get()
    }

    /// A pacer's (`leaky_bucket`) interval between two units, in µs,
    /// rounded up so that no unit goes early; `None` for every other
    /// algorithm.
    pub fn pace_interval_us(&self) -> Option<u64> {
        (self.algorithm == Algorithm::LeakyBucket)
            .then(|| self.period_us().div_ceil(self.limit().get()))
    }

    pub fn burst(&self) -> NonZeroU64 {
        self.burst
    }

    /// The largest cost one call can ever be granted under this rule.
    pub fn capacity(&self) -> u64 {
        self.burst.get()
    }

    /// The rule a [`Rule::fingerprint`] names; `None` when it does not
    /// parse or names no valid rule.
    pub fn from_fingerprint(fp: &str) -> Option<Rule> {
        let mut parts = fp.split(':');
        let algorithm: Algorithm = parts.next()?.parse().ok()?;
        let limit: u64 = parts.next()?.parse().ok()?;
        let period_us: u64 = parts.next()?.parse().ok()?;
        let burst: u64 = parts.next()?.parse().ok()?;
        if parts.next().is_some() {
            return None;
        }
        let burst = algorithm.uses_burst().then_some(burst);
        Rule::new(algorithm, limit, Duration::from_micros(period_us), burst)
            .ok()
            .filter(|r| r.fingerprint() == fp)
    }

    /// A stable, human-readable identity: the `fp` of a rule's place in the
    /// seller's hash, so that a changed rule converts the state it finds
    /// there instead of misreading it.
    pub fn fingerprint(&self) -> String {
        format!(
            "{}:{}:{}:{}",
            self.algorithm.name(),
            self.limit,
            self.period_us,
            self.burst
        )
    }
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {} per {}",
            self.algorithm,
            self.limit,
            humantime::format_duration(self.period())
        )?;
        if self.algorithm.uses_burst() && self.burst != self.limit {
            write!(f, " (burst {})", self.burst)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_invalid_rule_has_its_own_error() {
        let s = Duration::from_secs(1);
        let cases: [(u32, Result<Rule, RuleError>, RuleError); 8] = [
            (
                1,
                Rule::new(Algorithm::Gcra, 0, s, None),
                RuleError::ZeroLimit,
            ),
            (
                2,
                Rule::new(Algorithm::Gcra, 5, s, Some(0)),
                RuleError::ZeroBurst,
            ),
            (
                3,
                Rule::new(Algorithm::Gcra, 5, Duration::from_micros(49), None),
                RuleError::PeriodTooShort(Duration::from_micros(49)),
            ),
            (
                4,
                Rule::new(Algorithm::FixedWindow, 5, s, Some(3)),
                RuleError::BurstNotSupported(Algorithm::FixedWindow),
            ),
            (
                5,
                Rule::new(Algorithm::Gcra, 100, Duration::from_micros(50), None),
                RuleError::RateTooHigh {
                    limit: 100,
                    period_us: 50,
                },
            ),
            (
                6,
                Rule::new(
                    Algorithm::Gcra,
                    MAX_LIMIT + 1,
                    Duration::from_secs(3600),
                    None,
                ),
                RuleError::LimitTooLarge(MAX_LIMIT + 1),
            ),
            (
                7,
                Rule::new(
                    Algorithm::Gcra,
                    MAX_LIMIT,
                    Duration::from_secs(366 * 86400),
                    None,
                ),
                RuleError::TooPrecise {
                    units: MAX_LIMIT,
                    period_us: 366 * 86_400_000_000,
                },
            ),
            (
                8,
                Rule::new(
                    Algorithm::SlidingWindowLog,
                    20_000,
                    Duration::from_secs(60),
                    None,
                ),
                RuleError::LogTooLong(20_000),
            ),
        ];
        for (row, got, want) in cases {
            assert_eq!(got, Err(want), "row {row}");
        }
    }

    #[test]
    fn burst_defaults_to_limit_and_50us_is_accepted() {
        let r = Rule::new(Algorithm::BurstFill, 3, Duration::from_micros(50), None).unwrap();
        assert_eq!(r.burst().get(), 3);
        assert_eq!(r.period_us(), 50);
    }

    #[test]
    fn algorithm_names_round_trip() {
        for a in Algorithm::ALL {
            assert_eq!(a.name().parse::<Algorithm>(), Ok(a));
        }
        assert!("leaky".parse::<Algorithm>().is_err());
    }
}
