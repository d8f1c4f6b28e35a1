//! What is wrong with the settings. A section's `validate` knows the key
//! and the problem ([`Invalid`]); only the loader knows which layer the
//! value came from, and makes of it the [`ConfigError`] an operator reads.

use std::time::Duration;

/// Why the settings could not be loaded: where, which key, and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{file}: {key}: {problem}")]
pub struct ConfigError {
    /// The file the offending value came from, or "environment".
    pub file: String,
    /// Dotted path of the key, e.g. `limits.sellers.seller-7.rules[0].limit`.
    pub key: String,
    pub problem: String,
}

/// A value that a section's `validate` refused: the key and what is wrong
/// with it. The loader adds the file it came from (`Loaded::locate`).
#[derive(Debug, thiserror::Error)]
#[error("{key}: {problem}")]
pub(super) struct Invalid {
    /// Dotted path of the key, e.g. `downstream.concurrency`.
    pub key: &'static str,
    /// The section's own typed problem (`KafkaProblem`, ...) or a
    /// [`Problem`] any section may have. Boxed, so that this file names no
    /// section: the sections import it, not the other way round.
    pub problem: Box<dyn std::error::Error + Send + Sync>,
}

impl Invalid {
    pub fn new(
        key: &'static str,
        problem: impl std::error::Error + Send + Sync + 'static,
    ) -> Invalid {
        Invalid {
            key,
            problem: Box::new(problem),
        }
    }
}

/// What is wrong with a value, in any section; the text is what the
/// operator reads after the file and the key.
#[derive(Debug, thiserror::Error)]
pub(super) enum Problem {
    #[error("must not be empty")]
    Empty,
    #[error("must be at least 1")]
    Zero,
    #[error("must be longer than 0")]
    ZeroDuration,
}

/// Each value of `fields` (key, value) must hold more than blanks.
pub(super) fn nonempty(fields: &[(&'static str, &str)]) -> Result<(), Invalid> {
    match fields.iter().find(|(_, value)| value.trim().is_empty()) {
        Some(&(key, _)) => Err(Invalid::new(key, Problem::Empty)),
        None => Ok(()),
    }
}

/// Each count of `fields` (key, count) must be at least 1.
pub(super) fn at_least_one(fields: &[(&'static str, u64)]) -> Result<(), Invalid> {
    match fields.iter().find(|(_, count)| *count == 0) {
        Some(&(key, _)) => Err(Invalid::new(key, Problem::Zero)),
        None => Ok(()),
    }
}

/// Each duration of `fields` (key, duration) must be longer than zero.
pub(super) fn longer_than_zero(fields: &[(&'static str, Duration)]) -> Result<(), Invalid> {
    match fields.iter().find(|(_, d)| d.is_zero()) {
        Some(&(key, _)) => Err(Invalid::new(key, Problem::ZeroDuration)),
        None => Ok(()),
    }
}
