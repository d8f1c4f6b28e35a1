//! The limits in force: the config file reloaded or rejected, the
//! overrides and operators' pauses read from Redis, a paused seller's jobs
//! held back.

use std::time::Duration;

use super::Event;
use crate::telemetry::metrics::metrics;
use crate::telemetry::trace;
use crate::telemetry::Every;

/// The config file changed and was read again: its `[limits]` are in force
/// now (`changed`), and other sections that changed wait for a restart.
#[derive(Debug)]
pub struct LimitsReloaded<'a> {
    pub file: &'a str,
    pub changed: bool,
    pub named_sellers: usize,
    pub restart_needed: bool,
}

impl Event for LimitsReloaded<'_> {
    const NAME: &'static str = "LimitsReloaded";

    fn record(&self) {
        if self.changed {
            metrics().config_reloads.inc();
            tracing::info!(
                file = self.file,
                named_sellers = self.named_sellers,
                "limits reloaded; in force on this replica now"
            );
        }
        if self.restart_needed {
            tracing::warn!(
                file = self.file,
                "sections other than [limits] changed in the config file; they apply after a restart"
            );
        }
    }
}

/// An edit of the config file could not be applied; the limits in force
/// stay. `error` names the file, the key and the problem.
#[derive(Debug)]
pub struct LimitsReloadRejected<'a> {
    pub error: &'a str,
}

impl Event for LimitsReloadRejected<'_> {
    const NAME: &'static str = "LimitsReloadRejected";

    fn record(&self) {
        metrics().config_reload_errors.inc();
        tracing::error!(
            error = self.error,
            "config edit rejected; the limits in force stay"
        );
    }
}

/// What the replicas read from Redis beside the limiter's calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SharedState {
    /// The temporary overrides (`limits override`), read every second.
    Overrides,
    /// The operators' pauses (`limits pause`), read four times a second.
    Pauses,
}

/// This replica's sellers' waits could not be written to the wait board
/// (`limits show SELLER` then shows its last report until it goes stale).
#[derive(Debug)]
pub struct WaitBoardUnwritable<'a> {
    pub error: &'a str,
}

impl Event for WaitBoardUnwritable<'_> {
    const NAME: &'static str = "WaitBoardUnwritable";

    fn record(&self) {
        static LOG: Every = Every::new(Duration::from_secs(60));
        if let Some(more) = LOG.tick() {
            tracing::warn!(
                error = self.error,
                more_since_last_line = more,
                "could not write this replica's sellers' waits to Redis; limits show will not see them"
            );
        }
    }
}

/// Shared state could not be read from Redis; what was read last stays in
/// force (an override is not dropped, a pause not lifted, because Redis did
/// not answer).
#[derive(Debug)]
pub struct SharedStateUnreadable<'a> {
    pub what: SharedState,
    pub error: &'a str,
}

impl Event for SharedStateUnreadable<'_> {
    const NAME: &'static str = "SharedStateUnreadable";

    fn record(&self) {
        // Every read while Redis is out: one line per interval and kind.
        static OVERRIDES: Every = Every::new(Duration::from_secs(30));
        static PAUSES: Every = Every::new(Duration::from_secs(30));
        let (log, what) = match self.what {
            SharedState::Overrides => (&OVERRIDES, "limit overrides"),
            SharedState::Pauses => (&PAUSES, "operator pauses"),
        };
        if let Some(more) = log.tick() {
            tracing::warn!(
                error = self.error,
                more_since_last_line = more,
                "{what} unreadable; the ones read last stay in force"
            );
        }
    }
}

/// The pauses as a replica read them (every `limiter::pauses::REFRESH`):
/// the gauges, and a line when they change.
#[derive(Debug)]
pub struct PausesRead {
    pub sellers: usize,
    pub all: bool,
    /// They differ from the previous read.
    pub changed: bool,
}

impl Event for PausesRead {
    const NAME: &'static str = "PausesRead";

    fn record(&self) {
        metrics().paused_sellers.set(self.sellers as i64);
        metrics().paused_all.set(i64::from(self.all));
        if self.changed {
            tracing::warn!(
                paused_sellers = self.sellers,
                all_paused = self.all,
                "operator pauses changed: paused sellers call nothing until resumed"
            );
        }
    }
}

/// A paused seller's waiting jobs held back: in memory (counted by
/// `throttle_jobs_waiting{cause="paused"}`), or sent to the retry tiers
/// (`parked`, counted as every deferral is).
#[derive(Debug)]
pub struct SellerPaused<'a> {
    pub seller: &'a str,
    pub jobs: usize,
    pub parked: bool,
    /// What is left of the pause; `None`: until resumed.
    pub left: Option<Duration>,
}

impl Event for SellerPaused<'_> {
    const NAME: &'static str = "SellerPaused";

    fn record(&self) {
        if self.jobs == 0 {
            return;
        }
        tracing::debug!(
            seller = self.seller,
            jobs = self.jobs,
            parked = self.parked,
            left_ms = self.left.map(|d| d.as_millis() as u64),
            "seller paused: jobs held back"
        );
        trace::note_seller_wait(self.seller, "paused", self.left);
    }
}

/// A downstream 429 met a seller whose limit learns (`limits.learn`): its
/// learnt factor, fleet-wide, after the 429. A drop (once per episode) is
/// counted and logged; a 429 of the same episode only confirms it.
#[derive(Debug)]
pub struct LimitLearnt<'a> {
    pub seller: &'a str,
    /// The factor of the configured rules in force after the 429.
    pub factor: f64,
    /// Whether this 429 lowered it.
    pub dropped: bool,
}

impl Event for LimitLearnt<'_> {
    const NAME: &'static str = "LimitLearnt";

    fn record(&self) {
        if !self.dropped {
            return;
        }
        metrics().limit_learnt_drops.inc();
        tracing::info!(
            seller = self.seller,
            factor = self.factor,
            "the downstream answered 429: this seller's limits now run at this factor of its configured rules, fleet-wide, rising back while no 429 comes (limits.learn)"
        );
    }
}

inherent_emit!(
    LimitLearnt<'_>,
    LimitsReloaded<'_>,
    LimitsReloadRejected<'_>,
    SharedStateUnreadable<'_>,
    PausesRead,
    SellerPaused<'_>,
    WaitBoardUnwritable<'_>
);
