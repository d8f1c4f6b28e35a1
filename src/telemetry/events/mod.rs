//! Typed events: one struct per occurrence. `emit()` writes one structured
//! log line and bumps its counters, so call sites are one line and every
//! counter has exactly one place that moves it. Labels are fixed strings or
//! sellers the config names (every other seller is `other`), never payloads,
//! so the series count stays bounded.

use std::time::Duration;

mod limiter;
pub use limiter::{
    JobsCallCancelled, LimiterCallCoalesced, LimiterCalled, LimiterStateLost, LimiterUnavailable,
    RedisCalled, SlotsNotReturned,
};
mod decisions;
pub use decisions::{CallAvoided, JobsAdmitted, LimiterNever, SellerThrottled, ShadowDecided};
mod downstream;
pub use downstream::{
    DownstreamAnswered, DownstreamFailed, DownstreamOutage, DownstreamThrottled, RetryAfterClamped,
};
mod jobs;
pub use jobs::{
    JobDeadLettered, JobDeferred, JobDone, RecordReceived, RecordTooLarge, TraceContextInvalid,
};
mod kafka;
pub use kafka::{
    AlreadyDone, CommitFailed, ConsumerLag, HandoffLedgerFailed, HeadMoved, KafkaPollFailed,
    OffsetsCommitted, PartitionsAssigned, RevokedJobsDropped, RevokedWorkDropped,
};
mod limits;
pub use limits::{
    LimitsReloadRejected, LimitsReloaded, PausesRead, SellerPaused, SharedState,
    SharedStateUnreadable,
};
mod worker;
pub use worker::{Backlog, Backpressure, SellerWaiting, WorkerConfigured};

fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}
