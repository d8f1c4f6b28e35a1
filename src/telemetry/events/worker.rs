//! The worker's own state: the backlog snapshot, backpressure, the bounds
//! it was configured with, and what a seller's jobs wait for (for the job
//! spans).

use std::time::Duration;

use super::Event;
use crate::telemetry::metrics::{metrics, seller_label, WaitingLabels, OTHER_SELLER};
use crate::telemetry::trace;

/// Fetching paused or resumed at `worker.max_buffered` or `worker.max_buffered_bytes`.
#[derive(Debug)]
pub struct Backpressure {
    pub paused: bool,
    pub buffered: usize,
    pub bytes: usize,
}

impl Event for Backpressure {
    const NAME: &'static str = "Backpressure";

    fn record(&self) {
        if self.paused {
            metrics().backpressure_pauses.inc();
        }
        tracing::info!(
            paused = self.paused,
            buffered = self.buffered,
            bytes = self.bytes,
            "backpressure"
        );
    }
}

/// A snapshot of what this replica holds, taken every commit interval.
#[derive(Debug)]
pub struct Backlog<'a> {
    /// Jobs waiting in memory by (cause, seller): `limit` or `capacity`.
    pub waiting: &'a std::collections::HashMap<(&'static str, std::sync::Arc<str>), i64>,
    pub in_flight: usize,
    pub parked: usize,
    pub bytes: usize,
    pub assigned: usize,
    pub paused: usize,
}

impl Event for Backlog<'_> {
    const NAME: &'static str = "Backlog";

    fn record(&self) {
        let m = metrics();
        let mut by_label: std::collections::HashMap<(&'static str, String), i64> =
            std::collections::HashMap::new();
        for ((cause, seller), n) in self.waiting {
            *by_label.entry((cause, seller_label(seller))).or_default() += n;
        }
        // Every cause of every labelled seller, so a cause that emptied
        // reads 0 rather than vanishing; sellers gone entirely are dropped.
        const CAUSES: [&str; 3] = ["limit", "capacity", "paused"];
        m.jobs_waiting.clear();
        for cause in CAUSES {
            m.jobs_waiting
                .get_or_create(&WaitingLabels {
                    cause,
                    seller: OTHER_SELLER.to_owned(),
                })
                .set(0);
        }
        let sellers: std::collections::HashSet<&String> = by_label.keys().map(|(_, s)| s).collect();
        for seller in sellers {
            for cause in CAUSES {
                let n = by_label.get(&(cause, seller.clone())).copied().unwrap_or(0);
                m.jobs_waiting
                    .get_or_create(&WaitingLabels {
                        cause,
                        seller: seller.clone(),
                    })
                    .set(n);
            }
        }
        m.jobs_in_flight.set(self.in_flight as i64);
        m.jobs_parked.set(self.parked as i64);
        m.buffered_bytes.set(self.bytes as i64);
        m.assigned_partitions.set(self.assigned as i64);
        m.paused_partitions.set(self.paused as i64);
    }
}

/// The worker started with these settings: the bounds that alerts compare
/// the live figures with (`buffered_bytes` against `max_buffered_bytes`).
#[derive(Debug)]
pub struct WorkerConfigured {
    pub max_buffered_bytes: usize,
}

impl Event for WorkerConfigured {
    const NAME: &'static str = "WorkerConfigured";

    fn record(&self) {
        metrics()
            .max_buffered_bytes
            .set(i64::try_from(self.max_buffered_bytes).unwrap_or(i64::MAX));
    }
}

/// A seller's jobs wait: for a downstream slot (`capacity`, no end known)
/// or for the units a partial grant left short (`limit`, `wait` long).
/// Refusals and 429s are told by [`SellerThrottled`](super::SellerThrottled) and
/// [`DownstreamThrottled`](super::DownstreamThrottled). Only the job spans use it (their wait cause).
#[derive(Debug)]
pub struct SellerWaiting<'a> {
    pub seller: &'a str,
    pub cause: &'static str,
    pub wait: Option<Duration>,
}

impl SellerWaiting<'_> {
    pub fn capacity(seller: &str) -> SellerWaiting<'_> {
        SellerWaiting {
            seller,
            cause: "capacity",
            wait: None,
        }
    }

    /// Every slot of the seller's `max_in_flight` is taken, fleet-wide.
    pub fn in_flight(seller: &str, wait: Duration) -> SellerWaiting<'_> {
        SellerWaiting {
            seller,
            cause: "capacity",
            wait: Some(wait),
        }
    }

    pub fn limit(seller: &str, wait: Duration) -> SellerWaiting<'_> {
        SellerWaiting {
            seller,
            cause: "limit",
            wait: Some(wait),
        }
    }
}

impl Event for SellerWaiting<'_> {
    const NAME: &'static str = "SellerWaiting";

    fn record(&self) {
        trace::note_seller_wait(self.seller, self.cause, self.wait);
    }
}

inherent_emit!(
    Backpressure,
    Backlog<'_>,
    WorkerConfigured,
    SellerWaiting<'_>
);
