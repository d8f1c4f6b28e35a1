//! A copy the broker refused as too large (`message.max.bytes`, or the
//! topic's `max.message.bytes`): writing it again would fail forever and
//! hold its partition's commit. A dead letter goes again without its
//! payload, keeping its reason and original coordinates; a job bound for
//! a retry tier waits in memory until it is due; a dead letter too large
//! even without its payload (its key: the broker's limit is below any
//! record) is tried again, loudly.
//!
//! Pure: it takes the refused write's target and the fleet's clock in
//! Unix ms, and returns what to do; the engine (`engine/write.rs`) carries
//! it out and reports it (`RecordTooLarge`, with [`TooLarge::label`]).

use std::time::Duration;

use super::tiers::Target;
use super::timers::until_ms;

/// What to do with a copy refused as too large.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum TooLarge {
    /// Written again without its value, with `reason` (the dead letter's,
    /// saying why it has no payload).
    WithoutPayload { reason: String },
    /// Kept in memory for `wait` (until its retry copy would have been
    /// due), then run.
    KeepInMemory { wait: Duration },
    /// Too large even so: tried again, loudly.
    TryAgain,
}

impl TooLarge {
    /// The `fallback` label `RecordTooLarge` reports; none for a write
    /// tried again (it is logged as any failed write).
    pub(super) fn label(&self) -> Option<&'static str> {
        match self {
            TooLarge::WithoutPayload { .. } => Some("dead_letter_without_payload"),
            TooLarge::KeepInMemory { .. } => Some("kept_in_memory"),
            TooLarge::TryAgain => None,
        }
    }
}

/// What to do with a copy for `target`, `with_value` or not, that the
/// broker refused: the record holds `bytes`, the topic is `topic`, and the
/// fleet's clock reads `now_ms`.
pub(super) fn too_large(
    target: &Target,
    with_value: bool,
    bytes: usize,
    topic: &str,
    now_ms: u64,
) -> TooLarge {
    match target {
        Target::DeadLetter { reason, .. } if with_value => TooLarge::WithoutPayload {
            reason: format!(
                "{reason}; dead-lettered without its payload: the record ({bytes} bytes) is too large for {topic}, it stays at its original position"
            ),
        },
        Target::DeadLetter { .. } => TooLarge::TryAgain,
        Target::Retry {
            not_before_unix_ms, ..
        } => TooLarge::KeepInMemory {
            wait: until_ms(now_ms, *not_before_unix_ms),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW_MS: u64 = 1_000_000;

    fn dead_letter() -> Target {
        Target::DeadLetter {
            kind: "not_json",
            reason: "not JSON".to_owned(),
        }
    }

    fn retry(due_in_ms: i64) -> Target {
        Target::Retry {
            topic: "jobs-retry-1m".to_owned(),
            not_before_unix_ms: NOW_MS.checked_add_signed(due_in_ms).expect("in range"),
            release_at_unix_ms: NOW_MS,
        }
    }

    #[test]
    fn a_copy_too_large_goes_without_payload_waits_in_memory_or_is_tried_again() {
        let without = TooLarge::WithoutPayload {
            reason: "not JSON; dead-lettered without its payload: the record (9000 bytes) is too large for dlq, it stays at its original position".to_owned(),
        };
        let kept = |ms| TooLarge::KeepInMemory {
            wait: Duration::from_millis(ms),
        };
        // (row, target, with its value, what happens, label)
        let rows = [
            (
                1,
                dead_letter(),
                true,
                without,
                Some("dead_letter_without_payload"),
            ),
            (2, dead_letter(), false, TooLarge::TryAgain, None),
            (3, retry(30_000), true, kept(30_000), Some("kept_in_memory")),
            (
                4,
                retry(30_000),
                false,
                kept(30_000),
                Some("kept_in_memory"),
            ),
            // Due already: run at once.
            (5, retry(-5_000), true, kept(0), Some("kept_in_memory")),
        ];
        for (row, target, with_value, want, label) in rows {
            let got = too_large(&target, with_value, 9000, "dlq", NOW_MS);
            assert_eq!(got, want, "row {row}: {target:?}");
            assert_eq!(got.label(), label, "row {row}");
        }
    }
}
