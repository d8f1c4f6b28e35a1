//! When a pause or an override ends: `--for D` or `--until T`, exactly
//! one, turned into Unix ms on the clock the replicas judge it by.

use std::time::{Duration, UNIX_EPOCH};

use super::OperatorError;

/// When a pause or an override ends, as the operator gave it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    /// `--for D`: D after it is set.
    After(Duration),
    /// `--until T`: at T (Unix ms).
    At(u64),
}

/// Reads `--for` (a duration) or `--until` (an RFC 3339 time), exactly one.
pub fn end(for_: Option<&str>, until: Option<&str>) -> Result<End, OperatorError> {
    match (for_, until) {
        (Some(d), None) => Ok(End::After(
            humantime::parse_duration(d).map_err(OperatorError::For)?,
        )),
        (None, Some(t)) => {
            let t = humantime::parse_rfc3339_weak(t).map_err(OperatorError::Until)?;
            let ms = t
                .duration_since(UNIX_EPOCH)
                .map_err(|_| OperatorError::EndsBeforeStart)?
                .as_millis() as u64;
            Ok(End::At(ms))
        }
        _ => Err(OperatorError::NoEnd),
    }
}

impl End {
    /// The end in Unix ms on a clock that reads `now_ms` now.
    pub fn at(self, now_ms: u64) -> Result<u64, OperatorError> {
        let end = match self {
            End::After(d) => now_ms + d.as_millis() as u64,
            End::At(ms) => ms,
        };
        if end <= now_ms {
            return Err(OperatorError::EndsBeforeStart);
        }
        Ok(end)
    }
}
