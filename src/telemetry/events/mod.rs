//! Typed events: one struct per occurrence. Its [`Event::record`] writes
//! one structured log line and bumps its counters, so call sites are one
//! line (`JobDone { .. }.emit()`) and every counter has exactly one place
//! that moves it. Labels are fixed strings or sellers the config names
//! (every other seller is `other`), never payloads, so the series count
//! stays bounded.
//!
//! The events, by the part of the worker that tells them:
//!
//! - `limiter.rs`: the limiter's calls and their failures (Redis latency,
//!   cancels, the failure policy, a lost state, slots not given back).
//! - `decisions.rs`: what the limiter decided for a seller
//!   (`throttle_limiter_decisions`), and calls avoided.
//! - `downstream.rs`: the downstream's answers, 429s and their clamped
//!   `Retry-After`, retried failures, outages.
//! - `jobs.rs`: a record's way: received, done, deferred, dead-lettered,
//!   too large to copy, an invalid `traceparent`.
//! - `kafka.rs`: commits, the handoff ledger, polls, partitions assigned and
//!   revoked, a head moved on, lag, a consumer fenced and resumed, jobs
//!   whose slot lease lapsed.
//! - `limits.rs`: the config reloaded or rejected, overrides and pauses read
//!   from Redis, paused sellers.
//! - `worker.rs`: the backlog, backpressure, configured bounds, what a
//!   seller's jobs wait for.
//! - `capture.rs`, for tests only: `capture()`, the events a test saw
//!   emitted on its own thread.

use std::time::Duration;

/// One kind of occurrence: its name, and the log line and counters that
/// tell it.
pub trait Event: std::fmt::Debug {
    /// The type's name (`"JobDone"`), by which a capture names the event;
    /// `inherent_emit!` checks at compile time that the two agree.
    const NAME: &'static str;

    /// Writes the event's log line and bumps its counters: the one place
    /// that does, for this occurrence.
    fn record(&self);

    /// Tells the event: [`Event::record`], and, in a test, hands it first
    /// to the captures held on this thread (`capture()`).
    fn emit(&self) {
        #[cfg(any(test, feature = "testkit"))]
        capture::record(self);
        self.record();
    }
}

/// Gives each event named an inherent `emit()`, [`Event::emit`], so that
/// call sites stay `SomeEvent { .. }.emit()` without importing the trait;
/// and checks that the event's [`Event::NAME`] is its type's name, so
/// that a capture can tell events apart by name.
macro_rules! inherent_emit {
    ($($event:ident $(<$lt:lifetime>)?),+ $(,)?) => {$(
        impl $event $(<$lt>)? {
            /// Logs and counts this occurrence ([`Event::emit`](super::Event::emit)).
            pub fn emit(&self) {
                <Self as super::Event>::emit(self)
            }
        }

        const _: () = assert!(
            super::same(<$event as super::Event>::NAME, stringify!($event)),
            concat!(stringify!($event), ": Event::NAME is not the type's name"),
        );
    )+};
}

// After the macro: `macro_rules!` is in scope for the modules below it.
#[cfg(any(test, feature = "testkit"))]
mod capture;
mod decisions;
mod downstream;
mod jobs;
mod kafka;
mod limiter;
mod limits;
#[cfg(test)]
mod tests;
mod worker;

#[cfg(any(test, feature = "testkit"))]
pub use capture::{capture, Capture, Captured};
pub use decisions::{CallAvoided, JobsAdmitted, LimiterNever, SellerThrottled, ShadowDecided};
pub use downstream::{
    ConcurrencyConfigured, ConcurrencyLimit, DownstreamAnswered, DownstreamFailed,
    DownstreamOutage, DownstreamThrottled, RetryAfterClamped,
};
pub use jobs::{
    JobDeadLettered, JobDeferred, JobDone, OrderingKeyMissing, RecordReceived, RecordTooLarge,
    TraceContextInvalid,
};
pub use kafka::{
    AlreadyDone, CommitFailed, ConsumerLag, HandoffLedgerFailed, HeadMoved, KafkaPollFailed,
    LeaseLapsed, OffsetsCommitted, PartitionsAssigned, PartitionsRevoked, RecordDeliveredAgain,
    RevokedJobsDropped, RevokedWorkDropped, SessionFenced, SessionResumed, Waited,
};
pub use limiter::{
    GrantsKept, InstallChecked, JobsCallCancelled, LimiterCallCoalesced, LimiterCalled,
    LimiterStateLost, LimiterStateRestored, LimiterStateRolledBack, LimiterStateStarted,
    LimiterUnavailable, RedisCalled, ShapesPrepared, SlotsNotReturned, UnitsGivenBack,
};
pub use limits::{
    LimitLearnt, LimitsReloadRejected, LimitsReloaded, PausesRead, SellerPaused, SharedState,
    SharedStateUnreadable, WaitBoardUnwritable,
};
pub use worker::{
    latest_waits, Backlog, Backpressure, SellerWaiting, SellerWaits, WaitRow, WaitSnapshot,
    WorkerConfigured, TOP_SELLERS,
};

fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}

/// `a == b` where a constant needs it (`str`'s `==` is not `const`).
const fn same(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if a[i] != b[i] {
            return false;
        }
        i += 1;
    }
    true
}
