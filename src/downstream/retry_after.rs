//! The wait an answer asks for in its `Retry-After` (a 429's, or a 503's
//! during a deploy): delta-seconds or an HTTP date, read as hostile input
//! (never a panic; garbage counts as absent) and clamped to
//! `downstream.max_retry_after`, so that one absurd header cannot overflow
//! the worker's `Instant + wait` (issue 6, defect 3). No clock is read
//! here: the caller passes `now`.

use std::time::{Duration, SystemTime};

use super::RetryAfter;
use crate::telemetry::events::RetryAfterClamped;

/// The default of `downstream.max_retry_after`: an hour is longer than any
/// sane rate-limit window, yet short enough that a bogus header (a year, or
/// 10^19 seconds) cannot park a seller for good.
pub const DEFAULT_MAX_RETRY_AFTER: Duration = Duration::from_secs(3600);

/// The wait a 429 response asks for, from all its `Retry-After` values,
/// clamped to `max` (a clamp is logged as [`RetryAfterClamped`]).
///
/// The field is not a list (RFC 9110 §10.2.3), so several values mean a
/// confused server or proxy; the longest readable one wins, because waiting
/// too long only delays a seller while waiting too little earns another 429.
/// No readable value at all is [`RetryAfter::Unspecified`].
pub fn retry_after<'a>(
    values: impl IntoIterator<Item = &'a str>,
    now: SystemTime,
    max: Duration,
) -> RetryAfter {
    let Some(wait) = values
        .into_iter()
        .filter_map(|v| parse_retry_after(v, now))
        .max()
    else {
        return RetryAfter::Unspecified;
    };
    if wait > max {
        RetryAfterClamped {
            requested: wait,
            max,
        }
        .emit();
        return RetryAfter::Wait(max);
    }
    RetryAfter::Wait(wait)
}

/// Reads one `Retry-After` value relative to `now`, unclamped: delta-seconds
/// (`"120"`) or an HTTP date (`"Wed, 21 Oct 2015 07:28:00 GMT"`).
///
/// A date in the past and a negative number (not allowed by the RFC, but
/// its only sensible meaning) are zero. Seconds beyond `u64` saturate to
/// [`Duration::MAX`]. Anything else (empty, fractions, `+5`, words) is
/// `None`: the server said nothing usable.
///
/// ```
/// use std::time::{Duration, SystemTime};
/// use throttle_worker::downstream::parse_retry_after;
///
/// let now = SystemTime::now();
/// assert_eq!(parse_retry_after("120", now), Some(Duration::from_secs(120)));
/// assert_eq!(parse_retry_after("-3", now), Some(Duration::ZERO));
/// assert_eq!(parse_retry_after("soon", now), None);
/// ```
pub fn parse_retry_after(value: &str, now: SystemTime) -> Option<Duration> {
    let value = value.trim();
    let (negative, digits) = match value.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, value),
    };
    if !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) {
        if negative {
            return Some(Duration::ZERO);
        }
        // All digits, so the only possible parse error is overflow.
        return Some(
            digits
                .parse::<u64>()
                .map_or(Duration::MAX, Duration::from_secs),
        );
    }
    let at = httpdate::parse_http_date(value).ok()?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 6 defect 3: a 10^19 s Retry-After overflowed `Instant + wait`
    /// in the worker and panicked every replica.
    #[test]
    fn absurd_retry_after_is_clamped_and_addable_to_an_instant() {
        let now = SystemTime::now();
        let max = DEFAULT_MAX_RETRY_AFTER;
        for value in [
            "10000000000000000000",
            "18446744073709551615",
            "9".repeat(400).as_str(),
        ] {
            let RetryAfter::Wait(wait) = retry_after([value], now, max) else {
                panic!("{value:.30}: a number is a wait");
            };
            assert_eq!(
                wait, max,
                "{value:.30} is clamped to downstream.max_retry_after"
            );
            assert!(std::time::Instant::now().checked_add(wait).is_some());
        }
        // A date centuries ahead is clamped too.
        let far = "Fri, 31 Dec 9999 23:59:59 GMT";
        assert_eq!(retry_after([far], now, max), RetryAfter::Wait(max));
    }

    #[test]
    fn retry_after_parsing() {
        let now = httpdate::parse_http_date("Wed, 21 Oct 2015 07:28:00 GMT").unwrap();
        let s = Duration::from_secs;
        let cases: Vec<(u32, &str, Option<Duration>)> = vec![
            (1, "120", Some(s(120))),
            (2, " 0 ", Some(Duration::ZERO)),
            (3, "Wed, 21 Oct 2015 07:28:05 GMT", Some(s(5))),
            (4, "Wed, 21 Oct 2015 07:27:00 GMT", Some(Duration::ZERO)),
            (5, "", None),
            (6, "-5", Some(Duration::ZERO)),
            (7, "-99999999999999999999999", Some(Duration::ZERO)),
            (8, "1.5", None),
            (9, "99999999999999999999999", Some(Duration::MAX)),
            (10, "tomorrow", None),
            (11, "+5", None),
            (12, "-", None),
            (13, "--5", None),
            (14, "5 5", None),
            (15, "0x10", None),
            (16, "１２", None),
            (17, "18446744073709551615", Some(s(u64::MAX))),
            (18, "Wed, 21 Oct 2015 07:28:00 GMT trailing", None),
        ];
        for (row, header, want) in cases {
            assert_eq!(
                parse_retry_after(header, now),
                want,
                "row {row}: {header:?}"
            );
        }
    }

    #[test]
    fn retry_after_clamps_picks_the_longest_and_treats_garbage_as_absent() {
        let now = httpdate::parse_http_date("Wed, 21 Oct 2015 07:28:00 GMT").unwrap();
        let max = Duration::from_secs(60);
        let s = Duration::from_secs;
        let cases: Vec<(u32, Vec<&str>, RetryAfter)> = vec![
            (1, vec![], RetryAfter::Unspecified),
            (2, vec!["soon"], RetryAfter::Unspecified),
            (3, vec!["30"], RetryAfter::Wait(s(30))),
            (4, vec!["60"], RetryAfter::Wait(max)),
            (5, vec!["61"], RetryAfter::Wait(max)),
            (6, vec!["-1"], RetryAfter::Wait(Duration::ZERO)),
            (7, vec!["5", "garbage", "20"], RetryAfter::Wait(s(20))),
            (8, vec!["garbage", "-3"], RetryAfter::Wait(Duration::ZERO)),
            (9, vec!["2", "99999999999999999999"], RetryAfter::Wait(max)),
        ];
        for (row, values, want) in cases {
            assert_eq!(
                retry_after(values.clone(), now, max),
                want,
                "row {row}: {values:?}"
            );
        }
    }

    /// A clamp is told (`RetryAfterClamped`, a warning and
    /// `throttle_downstream_retry_after_clamped_total`) once per answer,
    /// with the wait asked for; a wait at the maximum, or no readable
    /// wait, is not a clamp.
    #[test]
    fn a_clamp_is_told_once_with_the_wait_asked_for() {
        use crate::telemetry::events::{capture, RetryAfterClamped};
        let now = SystemTime::now();
        let max = Duration::from_secs(60);
        let cases: Vec<(u32, Vec<&str>, Vec<&str>)> = vec![
            (1, vec!["60"], vec![]),
            (
                2,
                vec!["61"],
                vec!["RetryAfterClamped { requested: 61s, max: 60s }"],
            ),
            (
                3,
                vec!["2", "100000", "3600"],
                vec!["RetryAfterClamped { requested: 100000s, max: 60s }"],
            ),
            (4, vec![], vec![]),
            (5, vec!["soon", "-1"], vec![]),
        ];
        for (row, values, want) in cases {
            let seen = capture();
            retry_after(values.clone(), now, max);
            assert_eq!(
                seen.of::<RetryAfterClamped>(),
                want,
                "row {row}: {values:?}"
            );
            assert_eq!(
                seen.names().len(),
                want.len(),
                "row {row}: {:?}",
                seen.names()
            );
        }
    }
}
