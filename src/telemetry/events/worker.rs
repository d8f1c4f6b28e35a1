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

/// Sellers besides the named ones that get series of their own in the
/// wait metrics, by oldest wait: the cardinality stays bounded whatever
/// the number of sellers.
pub const TOP_SELLERS: usize = 10;

/// One seller's wait, as the metrics show it (see `worker::waits`).
#[derive(Debug, Clone)]
pub struct WaitRow<'a> {
    pub seller: &'a str,
    pub jobs: usize,
    pub units: u64,
    pub oldest: Duration,
    pub drain: Option<Duration>,
    pub held_by: String,
}

/// Each seller's wait, oldest first, taken every commit interval. Series
/// for the named sellers and the [`TOP_SELLERS`] oldest others; the rest
/// together as `other`, which is always there (0, held by `none`, when no
/// other seller waits), so a dashboard or an alert reads 0 rather than
/// nothing.
#[derive(Debug)]
pub struct SellerWaits<'a> {
    pub rows: &'a [WaitRow<'a>],
}

/// One seller's wait as the last report took it, owned (for the wait
/// board in Redis, `limiter::waits`).
#[derive(Debug, Clone, PartialEq)]
pub struct WaitSnapshot {
    pub seller: String,
    pub jobs: usize,
    pub units: u64,
    pub oldest: Duration,
    pub drain: Option<Duration>,
    pub held_by: String,
}

fn latest() -> &'static std::sync::Mutex<Vec<WaitSnapshot>> {
    static LATEST: std::sync::OnceLock<std::sync::Mutex<Vec<WaitSnapshot>>> =
        std::sync::OnceLock::new();
    LATEST.get_or_init(Default::default)
}

/// The sellers' waits of the last report of this process, oldest first,
/// bounded like the metrics (named sellers and the [`TOP_SELLERS`] oldest
/// others).
pub fn latest_waits() -> Vec<WaitSnapshot> {
    latest().lock().unwrap_or_else(|p| p.into_inner()).clone()
}

impl Event for SellerWaits<'_> {
    const NAME: &'static str = "SellerWaits";

    fn record(&self) {
        let mut snapshot = Vec::new();
        use crate::telemetry::metrics::{HeldLabels, SellerLabel};
        let m = metrics();
        m.seller_oldest_wait_seconds.clear();
        m.seller_drain_seconds.clear();
        m.seller_held.clear();
        let mut tops = 0usize;
        let (mut oldest, mut drain) = (0.0f64, 0.0f64);
        let mut held: std::collections::BTreeMap<String, i64> = Default::default();
        for w in self.rows {
            let named = seller_label(w.seller) != OTHER_SELLER;
            if !named && tops >= TOP_SELLERS {
                oldest = oldest.max(w.oldest.as_secs_f64());
                drain = drain.max(w.drain.map_or(0.0, |d| d.as_secs_f64()));
                *held.entry(w.held_by.clone()).or_default() += 1;
                continue;
            }
            tops += usize::from(!named);
            snapshot.push(WaitSnapshot {
                seller: w.seller.to_owned(),
                jobs: w.jobs,
                units: w.units,
                oldest: w.oldest,
                drain: w.drain,
                held_by: w.held_by.clone(),
            });
            let seller = SellerLabel {
                seller: w.seller.to_owned(),
            };
            m.seller_oldest_wait_seconds
                .get_or_create(&seller)
                .set(w.oldest.as_secs_f64());
            if let Some(d) = w.drain {
                m.seller_drain_seconds
                    .get_or_create(&seller)
                    .set(d.as_secs_f64());
            }
            m.seller_held
                .get_or_create(&HeldLabels {
                    seller: seller.seller,
                    held_by: w.held_by.clone(),
                })
                .set(1);
        }
        let other = SellerLabel {
            seller: OTHER_SELLER.to_owned(),
        };
        m.seller_oldest_wait_seconds
            .get_or_create(&other)
            .set(oldest);
        m.seller_drain_seconds.get_or_create(&other).set(drain);
        if held.is_empty() {
            held.insert("none".to_owned(), 0);
        }
        *latest().lock().unwrap_or_else(|p| p.into_inner()) = snapshot;
        for (held_by, n) in held {
            m.seller_held
                .get_or_create(&HeldLabels {
                    seller: OTHER_SELLER.to_owned(),
                    held_by,
                })
                .set(n);
        }
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
    SellerWaits<'_>,
    WorkerConfigured,
    SellerWaiting<'_>
);
