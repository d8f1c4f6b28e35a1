//! Retry delays: exponential backoff with equal jitter, shared by the
//! downstream's retries, the worker's 429 holds and the limiter's failure
//! policy.
//!
//! A leaf module: it depends on no other module of this crate.

use std::time::Duration;

use rand::Rng;

/// The delay before retry number `attempt` (1 = first retry), exponential
/// with "equal jitter": the ceiling is `min(max, base * 2^(attempt-1))` and
/// the delay is uniform in `[ceiling/2, ceiling]`.
///
/// Equal rather than full jitter: full jitter can pick a delay near zero,
/// which against a failing downstream looks like a tight loop; equal jitter
/// keeps at least half the ceiling while still spreading replicas apart.
/// `attempt` 0 is treated as 1.
///
/// ```
/// use std::time::Duration;
/// use throttle_worker::backoff::backoff;
///
/// let d = backoff(3, Duration::from_millis(100), Duration::from_secs(10));
/// assert!(d >= Duration::from_millis(200) && d <= Duration::from_millis(400));
/// ```
pub fn backoff(attempt: u32, base: Duration, max: Duration) -> Duration {
    backoff_with(attempt, base, max, &mut rand::rng())
}

/// [`backoff`] with the random source passed in, for deterministic tests.
pub fn backoff_with<R: Rng + ?Sized>(
    attempt: u32,
    base: Duration,
    max: Duration,
    rng: &mut R,
) -> Duration {
    let ceiling = backoff_ceiling(attempt, base, max);
    // Work in nanoseconds; saturate above u64 (584 years), far beyond any
    // sensible max.
    let ceiling_ns = u64::try_from(ceiling.as_nanos()).unwrap_or(u64::MAX);
    let half = ceiling_ns / 2;
    let jitter = rng.random_range(0..=ceiling_ns - half);
    Duration::from_nanos(half + jitter)
}

/// `min(max, base * 2^(attempt-1))` without overflow.
pub fn backoff_ceiling(attempt: u32, base: Duration, max: Duration) -> Duration {
    let exponent = attempt.max(1) - 1;
    let factor = 1u32.checked_shl(exponent).unwrap_or(u32::MAX);
    base.checked_mul(factor).unwrap_or(max).min(max)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::SeedableRng;

    #[test]
    fn backoff_ceiling_grows_then_caps() {
        let base = Duration::from_millis(100);
        let max = Duration::from_secs(5);
        let cases: Vec<(u32, u32, Duration)> = vec![
            (1, 0, Duration::from_millis(100)),
            (2, 1, Duration::from_millis(100)),
            (3, 2, Duration::from_millis(200)),
            (4, 3, Duration::from_millis(400)),
            (5, 6, Duration::from_millis(3200)),
            (6, 7, max),
            (7, 40, max),
            (8, u32::MAX, max),
        ];
        for (row, attempt, want) in cases {
            assert_eq!(
                backoff_ceiling(attempt, base, max),
                want,
                "row {row}: attempt {attempt}"
            );
        }
    }

    #[test]
    fn backoff_stays_in_equal_jitter_bounds_and_spreads() {
        let base = Duration::from_millis(100);
        let max = Duration::from_secs(5);
        let mut rng = StdRng::seed_from_u64(7);
        for attempt in 0..50 {
            let ceiling = backoff_ceiling(attempt, base, max);
            let mut distinct = std::collections::HashSet::new();
            for _ in 0..200 {
                let d = backoff_with(attempt, base, max, &mut rng);
                assert!(
                    d >= ceiling / 2 && d <= ceiling,
                    "attempt {attempt}: {d:?} outside [{:?}, {ceiling:?}]",
                    ceiling / 2
                );
                distinct.insert(d);
            }
            assert!(
                distinct.len() > 100,
                "attempt {attempt}: jitter spreads delays ({} distinct)",
                distinct.len()
            );
        }
        // The public function uses the thread RNG with the same bounds.
        let d = backoff(3, base, max);
        assert!(
            d >= Duration::from_millis(200) && d <= Duration::from_millis(400),
            "{d:?}"
        );
        assert_eq!(
            backoff(5, Duration::ZERO, max),
            Duration::ZERO,
            "zero base never panics"
        );
    }

    proptest::proptest! {
        /// Any attempt count, base and max: no panic, never above max (nor
        /// the ceiling), never below half the ceiling.
        #[test]
        fn backoff_never_overflows_and_stays_bounded(
            attempt in proptest::prelude::any::<u32>(),
            base_ns in proptest::prelude::any::<u64>(),
            max_s in proptest::prelude::any::<u64>(),
            max_ns in 0u32..1_000_000_000,
            seed in proptest::prelude::any::<u64>(),
        ) {
            let base = Duration::from_nanos(base_ns);
            let max = Duration::new(max_s, max_ns);
            let mut rng = StdRng::seed_from_u64(seed);
            let ceiling = backoff_ceiling(attempt, base, max);
            let d = backoff_with(attempt, base, max, &mut rng);
            proptest::prop_assert!(ceiling <= max);
            proptest::prop_assert!(d <= ceiling, "{:?} > ceiling {:?}", d, ceiling);
            let floor = ceiling.min(Duration::from_nanos(u64::MAX)) / 2;
            proptest::prop_assert!(d >= floor, "{:?} < floor {:?}", d, floor);
            let _ = backoff(attempt, base, max);
        }

        /// Jitter: replicas retrying the same attempt do not line up.
        #[test]
        fn backoff_has_jitter(
            attempt in 1u32..64,
            base_us in 1u64..1_000_000,
            seed in proptest::prelude::any::<u64>(),
        ) {
            let base = Duration::from_micros(base_us);
            let max = Duration::from_secs(30);
            let mut rng = StdRng::seed_from_u64(seed);
            let draws: std::collections::HashSet<Duration> =
                (0..16).map(|_| backoff_with(attempt, base, max, &mut rng)).collect();
            proptest::prop_assert!(draws.len() > 8, "{} distinct of 16", draws.len());
        }
    }
}
